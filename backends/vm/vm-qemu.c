/* vm-qemu.c - QEMU for the VM backend: its command line, a detached start, stop, and a small QMP
 * client (JSON lines over the unix socket: capabilities, commands with matched replies). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/vm/vm-int.h"
#include "dsec/io.h"
#include "dsec/alloc.h"

/* ---- the command line ------------------------------------------------------------------- */

/* -runas "uid:gid" with room for the largest figures: the last argument. */
#define RUNAS_PLACEHOLDER "4294967295:4294967295"

/* A growing argv of dsec_malloc'd strings. */
struct av {
    char **v;
    size_t n, cap;
    bool oom;
};

static void av_add(struct av *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void av_add(struct av *a, const char *fmt, ...)
{
    if (a->oom)
        return;
    if (a->n + 2 > a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        char **v = dsec_realloc(a->v, cap * sizeof *v);
        if (v == NULL) {
            a->oom = true;
            return;
        }
        a->v = v;
        a->cap = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (len >= 0 && (s = dsec_malloc((size_t)len + 1)) != NULL) {
        va_start(ap, fmt);
        vsnprintf(s, (size_t)len + 1, fmt, ap);
        va_end(ap);
    }
    if (s == NULL) {
        a->oom = true;
        return;
    }
    a->v[a->n++] = s;
    a->v[a->n] = NULL;
}

static void av_free(struct av *a)
{
    for (size_t i = 0; i < a->n; i++)
        dsec_free(a->v[i]);
    dsec_free(a->v);
    memset(a, 0, sizeof *a);
}

/* QEMU option values escape a comma by doubling it. out must hold 2*strlen(s)+1. */
static const char *qesc(const char *s, char *out, size_t len)
{
    size_t o = 0;
    for (; *s && o + 2 < len; s++) {
        if (*s == ',')
            out[o++] = ',';
        out[o++] = *s;
    }
    out[o] = '\0';
    return out;
}

static int build_argv(const struct vm_backend *be, const dsec_sandbox *sb,
                      const struct vm_launch *l, struct av *a)
{
    char e1[2 * PATH_MAX + 64];
    const char *blk = be->q35 ? "virtio-blk-pci" : "virtio-blk-device";
    av_add(a, "%s", be->qemu);
    av_add(a, "-name");
    av_add(a, "dsec-%s,debug-threads=on", sb->id);
    av_add(a, "-M");
    if (be->q35)
        av_add(a, "q35,memory-backend=mem");
    else
        av_add(a, "microvm,x-option-roms=off,isa-serial=on,rtc=off,memory-backend=mem");
    av_add(a, "-cpu");
    av_add(a, "max");
    av_add(a, "-accel");
    if (be->kvm)
        av_add(a, "kvm");
    else
        av_add(a, "tcg,tb-size=%" PRIu64, be->tb_mb);
    av_add(a, "-smp");
    av_add(a, "%u", sb->smp);
    av_add(a, "-m");
    av_add(a, "%" PRIu64 "M", sb->mem_mb);
    /* QEMU's own seccomp filter: a guest that breaks into the emulator still cannot use
     * obsolete system calls, start a process or change scheduling and limits. Privileges
     * go with -runas below (elevateprivileges=deny would refuse that very setuid). */
    av_add(a, "-sandbox");
    av_add(a, "on,obsolete=deny,spawn=deny,resourcecontrol=deny");
    av_add(a, "-nodefaults");
    av_add(a, "-no-user-config");
    av_add(a, "-nographic");
    av_add(a, "-no-reboot");
    char mem[PATH_MAX + 16];
    dsec__vm_fmt(mem, sizeof mem, "%s/%s", sb->dir, sb->mem_private ? "base.mem" : "mem");
    av_add(a, "-object");
    av_add(a, "memory-backend-file,id=mem,size=%" PRIu64 "M,mem-path=%s,share=%s", sb->mem_mb,
           qesc(mem, e1, sizeof e1), sb->mem_private ? "off" : "on");
    av_add(a, "-kernel");
    av_add(a, "%s", be->kernel);
    av_add(a, "-initrd");
    av_add(a, "%s", be->initrd);
    av_add(a, "-append");
    if (be->tsc_khz > 0)
        av_add(a, "console=ttyS0 panic=-1 reboot=t quiet tsc_early_khz=%" PRIu64, be->tsc_khz);
    else
        av_add(a, "console=ttyS0 panic=-1 reboot=t quiet");
    /* sockets by relative paths: QEMU runs in sb->dir, and the absolute
     * path may not fit sun_path */
    av_add(a, "-chardev");
    av_add(a, "file,id=con,path=console.log,append=on");
    av_add(a, "-serial");
    av_add(a, "chardev:con");
    av_add(a, "-chardev");
    av_add(a, "socket,id=qmp,path=qmp.sock,server=on,wait=off");
    av_add(a, "-mon");
    av_add(a, "chardev=qmp,mode=control");
    av_add(a, "-device");
    av_add(a, "%s", be->q35 ? "virtio-serial-pci" : "virtio-serial-device");
    av_add(a, "-chardev");
    av_add(a, "socket,id=agent,path=agent.sock,server=on,wait=off");
    av_add(a, "-device");
    av_add(a, "virtserialport,chardev=agent,name=dsec.agent");
    av_add(a, "-chardev");
    av_add(a, "socket,id=ctl,path=ctl.sock,server=on,wait=off");
    av_add(a, "-device");
    av_add(a, "virtserialport,chardev=ctl,name=dsec.ctl");
    /* the device order is part of the machine: restore must repeat it */
    /* relative: QEMU reopens the disk by name when a migration ends or begins, as its own
     * uid, which cannot pass through the node's directories above sb->dir */
    av_add(a, "-drive");
    av_add(a, "file=disk.img,if=none,id=disk,format=raw,discard=unmap");
    av_add(a, "-device");
    av_add(a, "%s,drive=disk,serial=dsec-disk", blk);
    for (size_t i = 0; i < sb->env.nlayers; i++) {
        char img[PATH_MAX + 128];
        dsec__vm_fmt(img, sizeof img, "%s/%s.erofs", be->images, sb->env.layers[i].digest);
        av_add(a, "-drive");
        av_add(a, "file=%s,if=none,id=l%zu,format=raw,readonly=on", qesc(img, e1, sizeof e1), i);
        av_add(a, "-device");
        av_add(a, "%s,drive=l%zu,serial=dsec-l%zu", blk, i, i);
    }
    if (sb->nic) {
        av_add(a, "-netdev");
        av_add(a, "tap,id=net0,fd=3");
        av_add(a, "-device");
        if (be->q35)
            av_add(a, "virtio-net-pci,netdev=net0,mac=%s,romfile=", sb->guest.mac);
        else
            av_add(a, "virtio-net-device,netdev=net0,mac=%s", sb->guest.mac);
    }
    if (l->incoming) {
        av_add(a, "-S");
        av_add(a, "-incoming");
        av_add(a, "defer");
    }
    /* Once its devices and files are open, QEMU drops to a uid of its own: uid_base + its
     * pid, unique among live processes, so no two VMs share one and nothing need be
     * allocated or remembered. The child that execs QEMU writes the figures into the last
     * argument. */
    av_add(a, "-runas");
    av_add(a, "%s", RUNAS_PLACEHOLDER);
    return a->oom ? -1 : 0;
}

/* ---- QEMU's root ----------------------------------------------------------------------- */

/*
 * QEMU runs in a mount namespace of its own, rooted on a small tmpfs (read-only once built)
 * that holds, at their host paths so the command line stays valid, only what it needs: /usr
 * (binary, libraries, modules, firmware) and the /bin, /sbin, /lib... links or directories
 * beside it, read-only; the kernel, initrd and the sandbox's layer images, read-only; the
 * sandbox directory (disk, RAM file, sockets, console), read-write; /dev's null, zero, random
 * and urandom (and kvm). Nothing else: no /etc (-runas gives numbers), no /tmp, no /proc
 * (QEMU finds its modules and firmware from argv[0] when /proc/self/exe is missing; the node
 * hands it migration files as descriptors). The namespace is the process's own, so its mounts
 * go when it exits and none is ever seen by the host. Everything here runs in the child after
 * fork: no allocation, no stdio.
 */

/* What the jail binds besides the fixed set; prepared before the fork. */
struct jail {
    const char *root;      /* S/jail: the new root's mount point */
    const char *qemu;      /* bound on its own when not under /usr */
    const char *const *ro; /* files bound read-only: kernel, initrd, layer images */
    size_t nro;
    const char *dir; /* the sandbox directory, read-write */
    bool kvm;
};

/* out = root + path (path absolute); -1 with errno. */
static int jail_path(char *out, size_t len, const char *root, const char *path)
{
    size_t r = strlen(root), p = strlen(path);
    if (path[0] != '/') {
        errno = EINVAL;
        return -1;
    }
    if (r + p + 1 > len) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(out, root, r);
    memcpy(out + r, path, p + 1);
    return 0;
}

/* mkdir -p of t's components after the first `from` bytes (the root), the last too if `last`. */
static int jail_mkdirs(char *t, size_t from, bool last)
{
    for (size_t i = from + 1;; i++) {
        char c = t[i];
        if (c != '/' && c != '\0')
            continue;
        if (c == '\0' && !last)
            return 0;
        t[i] = '\0';
        int rc = mkdir(t, 0755);
        t[i] = c;
        if (rc < 0 && errno != EEXIST)
            return -1;
        if (c == '\0')
            return 0;
    }
}

/* Bind src at the same path under root (a directory or a file), then remount the bind with
 * flags (MS_RDONLY, MS_NOSUID...); -1 with errno. t is scratch of PATH_MAX. */
static int jail_bind(const char *root, const char *src, unsigned long flags, char *t)
{
    struct stat st;
    if (stat(src, &st) < 0 || jail_path(t, PATH_MAX, root, src) < 0)
        return -1;
    size_t from = strlen(root);
    if (S_ISDIR(st.st_mode)) {
        if (jail_mkdirs(t, from, true) < 0)
            return -1;
    } else if (stat(t, &st) < 0) {
        int fd = -1;
        if (jail_mkdirs(t, from, false) < 0 ||
            (fd = open(t, O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) < 0)
            return -1;
        close(fd);
    }
    if (mount(src, t, NULL, MS_BIND | MS_REC, NULL) < 0)
        return -1;
    return mount(NULL, t, NULL, MS_REMOUNT | MS_BIND | flags, NULL);
}

/* The links (Debian's /lib -> usr/lib) or directories beside /usr, as the host has them. */
static int jail_libs(const char *root, char *t)
{
    static const char *const names[] = {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"};
    char target[PATH_MAX];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        struct stat st;
        if (lstat(names[i], &st) < 0) {
            if (errno == ENOENT)
                continue;
            return -1;
        }
        if (S_ISLNK(st.st_mode)) {
            ssize_t n = readlink(names[i], target, sizeof target - 1);
            if (n < 0 || jail_path(t, PATH_MAX, root, names[i]) < 0)
                return -1;
            target[n] = '\0';
            if (symlink(target, t) < 0)
                return -1;
        } else if (S_ISDIR(st.st_mode) &&
                   jail_bind(root, names[i], MS_RDONLY | MS_NOSUID | MS_NODEV, t) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The jail's steps, in start_steps from JAIL_STEP0 on. */
enum { JAIL_STEP0 = 4 };

/* Build the jail and pivot into it; cwd is then "/". -1 with errno, *step and *what (the path
 * that failed, or NULL) set. */
static int jail_enter(const struct jail *j, int *step, const char **what)
{
    char t[PATH_MAX];
    const char *root = j->root;
    *what = NULL;
    *step = JAIL_STEP0;
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return -1;
    *step = JAIL_STEP0 + 1;
    *what = root;
    if (mount("dsec-qemu", root, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "mode=0755,size=64k,nr_inodes=1024") < 0)
        return -1;
    *step = JAIL_STEP0 + 2;
    *what = "/usr";
    if (jail_bind(root, "/usr", MS_RDONLY | MS_NOSUID | MS_NODEV, t) < 0)
        return -1;
    *what = "/lib";
    if (jail_libs(root, t) < 0)
        return -1;
    *what = j->qemu;
    if (strncmp(j->qemu, "/usr/", 5) != 0 &&
        jail_bind(root, j->qemu, MS_RDONLY | MS_NOSUID | MS_NODEV, t) < 0)
        return -1;
    *step = JAIL_STEP0 + 3;
    for (size_t i = 0; i < j->nro; i++) {
        *what = j->ro[i];
        if (jail_bind(root, j->ro[i], MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, t) < 0)
            return -1;
    }
    *step = JAIL_STEP0 + 4;
    *what = j->dir;
    if (jail_bind(root, j->dir, MS_NOSUID | MS_NODEV | MS_NOEXEC, t) < 0)
        return -1;
    *step = JAIL_STEP0 + 5;
    static const char *const devs[] = {"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom",
                                       "/dev/kvm"};
    for (size_t i = 0; i < sizeof devs / sizeof *devs - (j->kvm ? 0 : 1); i++) {
        *what = devs[i];
        if (jail_bind(root, devs[i], MS_NOSUID | MS_NOEXEC, t) < 0)
            return -1;
    }
    /* pivot_root(".", ".") stacks the old root on the new one; detaching it leaves the new */
    *step = JAIL_STEP0 + 6;
    *what = root;
    if (chdir(root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 ||
        chdir("/") < 0)
        return -1;
    *step = JAIL_STEP0 + 7;
    *what = NULL;
    return mount(NULL, "/", NULL,
                 MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
}

/* ---- start and stop --------------------------------------------------------------------- */

/* What the start pipe carries: the grandchild's pid, or why it did not become QEMU. */
struct start_msg {
    int kind; /* 1 pid, 2 errno of exec, 3 errno of fork, 4 errno of set-up step `step` */
    int val;
    int step;
    char what[256]; /* the path a set-up step failed on, or "" */
};

static const char *const start_steps[] = {
    "entering the sandbox directory",
    "giving QEMU's uid its directory and disk",
    "setting up stdin, stdout and stderr",
    "handing over the tap",
    /* JAIL_STEP0 on: QEMU's root (jail_enter) */
    "making QEMU's mount namespace",
    "mounting QEMU's root (a tmpfs)",
    "binding /usr and the library directories into QEMU's root",
    "binding the kernel, initrd and layer images into QEMU's root",
    "binding the sandbox directory into QEMU's root",
    "binding /dev's null, zero, random, urandom and kvm into QEMU's root",
    "entering QEMU's root (pivot_root)",
    "making QEMU's root read-only",
};

/* "N:N" into out (room for RUNAS_PLACEHOLDER); safe after fork. */
static void put_uid_gid(char *out, uint32_t id)
{
    char d[10];
    int n = 0;
    do {
        d[n++] = (char)('0' + id % 10);
        id /= 10;
    } while (id != 0);
    char *o = out;
    for (int k = 0; k < 2; k++) {
        for (int i = n - 1; i >= 0; i--)
            *o++ = d[i];
        *o++ = k == 0 ? ':' : '\0';
    }
}

/* The first child of a QEMU start (in a session of its own): forks QEMU's process, reports its
 * pid on wfd, and exits; QEMU's process sets itself up (its uid, its jail, its stdio, the tap)
 * and becomes QEMU, or reports the step that failed. After fork: no allocation, no stdio. */
__attribute__((noreturn)) static void qemu_child(const struct vm_backend *be,
                                                 const dsec_sandbox *sb, const struct vm_launch *l,
                                                 struct av *a, const struct jail *jail, int logfd,
                                                 int nullfd, int wfd)
{
    setsid();
    pid_t g = fork();
    if (g != 0) {
        struct start_msg m = {g > 0 ? 1 : 3, g > 0 ? g : errno, 0};
        (void)dsec_write_all(wfd, &m, sizeof m);
        _exit(0);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    /* below the node manager (raising one's own nice cannot fail) */
    (void)setpriority(PRIO_PROCESS, 0, DSEC_SANDBOX_NICE);
    /* after fork: no allocation, no stdio; the argument has room for both figures */
    uint32_t uid = be->uid_base + (uint32_t)getpid();
    put_uid_gid(a->v[a->n - 1], uid);
    int step = 0;
    const char *what = NULL;
    bool ok = chdir(sb->dir) == 0;
    /* QEMU's uid may look up names in its own directory (nothing above it) and write its
     * disk; everything else there stays root's */
    if (ok) {
        step = 1;
        ok = chmod(".", 0711) == 0 && chown("disk.img", uid, uid) == 0;
    }
    ok = ok && jail_enter(jail, &step, &what) == 0;
    if (ok) {
        step = 0;
        ok = chdir(sb->dir) == 0;
    }
    if (ok) {
        step = 2;
        ok = dup2(nullfd, 0) >= 0 && dup2(logfd, 1) >= 0 && dup2(logfd, 2) >= 0;
    }
    if (ok && l->tap_fd >= 0) {
        step = 3;
        ok = (l->tap_fd == 3 ? fcntl(3, F_SETFD, 0) : dup2(l->tap_fd, 3)) >= 0;
    }
    if (ok) {
        /* nothing else of the node manager leaks into QEMU (the pipe is already
         * close-on-exec) */
        close_range(l->tap_fd >= 0 ? 4 : 3, ~0u, CLOSE_RANGE_CLOEXEC);
        execv(a->v[0], a->v);
    }
    struct start_msg m = {ok ? 2 : 4, errno, step, ""};
    for (size_t i = 0; !ok && what != NULL && what[i] != '\0' && i + 1 < sizeof m.what; i++)
        m.what[i] = what[i];
    (void)dsec_write_all(wfd, &m, sizeof m);
    _exit(127);
}

/* What the start pipe rfd said: sb->pid set, or err from the step that failed. */
static int start_result(const struct vm_backend *be, dsec_sandbox *sb, int rfd, dsec_err *err)
{
    pid_t pid = 0;
    int exec_errno = 0, ferr = 0, setup_errno = 0, setup_step = 0;
    struct start_msg m;
    char setup_what[sizeof m.what + 3] = "";
    for (;;) {
        ssize_t n = dsec_read_eintr(rfd, &m, sizeof m);
        if (n != (ssize_t)sizeof m)
            break;
        if (m.kind == 1)
            pid = m.val;
        else if (m.kind == 2)
            exec_errno = m.val;
        else if (m.kind == 4 && m.step >= 0 &&
                 m.step < (int)(sizeof start_steps / sizeof *start_steps)) {
            setup_errno = m.val, setup_step = m.step;
            m.what[sizeof m.what - 1] = '\0';
            if (m.what[0] != '\0')
                dsec__vm_fmt(setup_what, sizeof setup_what, " (%s)", m.what);
        } else
            ferr = m.val;
    }
    close(rfd);
    if (setup_errno != 0)
        return dsec_err_set(err, DSEC_E_IO, setup_errno, "%s: starting QEMU in %s: %s%s: %s",
                            be->type, sb->dir, start_steps[setup_step], setup_what,
                            strerror(setup_errno));
    if (ferr != 0 || pid <= 0)
        return dsec_err_set(err, DSEC_E_IO, ferr, "%s: starting QEMU", be->type);
    if (exec_errno != 0)
        return dsec_err_set(err, DSEC_E_CONFIG, exec_errno, "%s: cannot run %s: %s", be->type,
                            be->qemu, strerror(exec_errno));
    sb->pid = pid;
    return 0;
}

int dsec__vm_qemu_start(const struct vm_backend *be, dsec_sandbox *sb, const struct vm_launch *l,
                        dsec_err *err)
{
    struct av a = {0};
    if (build_argv(be, sb, l, &a) < 0) {
        av_free(&a);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: QEMU command line", be->type);
    }
    char logp[PATH_MAX + 16];
    dsec__vm_fmt(logp, sizeof logp, "%s/qemu.log", sb->dir);
    int logfd = open(logp, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    int nullfd = open("/dev/null", O_RDWR | O_CLOEXEC);
    int pfd[2] = {-1, -1};
    if (logfd < 0 || nullfd < 0 || pipe2(pfd, O_CLOEXEC) < 0) {
        int e = errno;
        if (logfd >= 0)
            close(logfd);
        if (nullfd >= 0)
            close(nullfd);
        av_free(&a);
        return dsec_err_set(err, DSEC_E_IO, e, "%s: preparing to start QEMU in %s", be->type,
                            sb->dir);
    }
    /* what the jail binds read-only besides /usr and /dev: the kernel, initrd, layer images */
    struct av ro = {0};
    av_add(&ro, "%s", be->kernel);
    av_add(&ro, "%s", be->initrd);
    for (size_t i = 0; i < sb->env.nlayers; i++)
        av_add(&ro, "%s/%s.erofs", be->images, sb->env.layers[i].digest);
    if (ro.oom) {
        close(logfd);
        close(nullfd);
        close(pfd[0]);
        close(pfd[1]);
        av_free(&ro);
        av_free(&a);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: QEMU's root", be->type);
    }
    struct jail jail = {be->jail, be->qemu, (const char *const *)ro.v, ro.n, sb->dir, be->kvm};
    /* Two forks and a session of its own: QEMU is nobody's child here, so it
     * outlives a node manager that exits or restarts (adopt finds it again). */
    pid_t c = fork();
    if (c == 0)
        qemu_child(be, sb, l, &a, &jail, logfd, nullfd, pfd[1]);
    int fork_errno = errno;
    close(pfd[1]);
    close(logfd);
    close(nullfd);
    av_free(&a);
    av_free(&ro);
    if (c < 0) {
        close(pfd[0]);
        return dsec_err_set(err, DSEC_E_IO, fork_errno, "%s: fork to start QEMU", be->type);
    }
    int st;
    while (waitpid(c, &st, 0) < 0 && errno == EINTR)
        ;
    return start_result(be, sb, pfd[0], err);
}

/* pid names a process that has not exited (a zombie has). */
static bool proc_alive(pid_t pid)
{
    if (pid <= 0)
        return false;
    char p[64];
    dsec__vm_fmt(p, sizeof p, "/proc/%d/stat", (int)pid);
    char *stat = dsec_sbx_read_file(p, 1024);
    if (stat == NULL)
        return false;
    const char *rp = strrchr(stat, ')');
    bool alive = rp != NULL && rp[1] != '\0' && rp[2] != 'Z' && rp[2] != 'X';
    dsec_free(stat);
    return alive;
}

/* The command line of a process that has not exited, open; -1 otherwise. */
static int open_cmdline(pid_t pid)
{
    if (!proc_alive(pid))
        return -1;
    char p[64];
    dsec__vm_fmt(p, sizeof p, "/proc/%d/cmdline", (int)pid);
    return open(p, O_RDONLY | O_CLOEXEC);
}

/* pid's command line (the first 64 KiB: NUL-separated arguments, one more NUL after them) in
 * a buffer to dsec_free, its length in *got; NULL when pid is gone or, with errno ENOMEM, when
 * there is no memory. */
static char *read_cmdline(pid_t pid, size_t *got)
{
    int fd = open_cmdline(pid);
    if (fd < 0)
        return NULL;
    size_t cap = 1u << 16;
    char *buf = dsec_malloc(cap + 1);
    ssize_t n = 0;
    *got = 0;
    while (buf != NULL && *got < cap && (n = read(fd, buf + *got, cap - *got)) > 0)
        *got += (size_t)n;
    close(fd);
    if (buf == NULL)
        errno = ENOMEM;
    else
        buf[*got] = '\0';
    return buf;
}

/* pid's command line as read_cmdline has it, its arguments space-separated: one string. */
static char *cmdline_text(pid_t pid)
{
    size_t got;
    char *buf = read_cmdline(pid, &got);
    for (size_t i = 0; buf != NULL && i < got; i++)
        if (buf[i] == '\0')
            buf[i] = ' ';
    return buf;
}

bool dsec__vm_qemu_is_ours(pid_t pid, const char *dir)
{
    char *buf = cmdline_text(pid);
    if (buf == NULL)
        return false;
    char needle[PATH_MAX + 2];
    dsec__vm_fmt(needle, sizeof needle, "%s/", dir);
    bool ours = strstr(buf, needle) != NULL;
    dsec_free(buf);
    return ours;
}

bool dsec__vm_qemu_uses(const char *path)
{
    size_t plen = 2 * strlen(path) + 1;
    char *needle = dsec_malloc(plen);
    DIR *d = opendir("/proc");
    bool used = false;
    if (needle != NULL)
        qesc(path, needle, plen);
    struct dirent *e;
    while (needle != NULL && d != NULL && !used && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        pid_t pid = (pid_t)strtol(e->d_name, NULL, 10);
        size_t got;
        errno = 0;
        char *buf = read_cmdline(pid, &got);
        if (buf == NULL && errno == ENOMEM) {
            used = true;
            break;
        }
        if (buf == NULL)
            continue;
        /* the arguments are NUL-separated: look in each */
        for (size_t i = 0; i < got && !used; i += strlen(buf + i) + 1)
            used = strstr(buf + i, needle) != NULL;
        dsec_free(buf);
    }
    if (d != NULL)
        closedir(d);
    /* when it cannot look, it says used: an image is kept rather than pulled from a VM */
    if (needle == NULL || d == NULL)
        used = true;
    dsec_free(needle);
    return used;
}

/* The process is alive and its command line still empty: it is inside its
 * execve, which closes the start pipe (so dsec__vm_qemu_start has returned)
 * before the new image's arguments are in place. */
static bool execing(pid_t pid)
{
    int fd = open_cmdline(pid);
    if (fd < 0)
        return false;
    char c;
    ssize_t n = read(fd, &c, 1);
    close(fd);
    return n == 0;
}

static void msleep(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int dsec__vm_qemu_wait_ready(const dsec_sandbox *sb, uint64_t timeout_ms, dsec_err *err)
{
    uint64_t deadline = dsec_now_ns() + timeout_ms * 1000000u;
    for (int odd = 0;;) {
        struct vm_qmp q;
        dsec_err e2;
        if (dsec__vm_qmp_open(&q, sb->dir, 1000, &e2) == 0) {
            dsec__vm_qmp_close(&q);
            return 0;
        }
        if (!dsec__vm_qemu_is_ours(sb->pid, sb->dir) && !execing(sb->pid)) {
            /* Alive, and its command line not QEMU's (yet): looked at again for a second before
             * it is called a failure, and then said what it was. Only a process that is gone
             * has exited. */
            bool alive = proc_alive(sb->pid);
            if (alive && ++odd < 50 && dsec_now_ns() <= deadline) {
                msleep(20);
                continue;
            }
            char p[PATH_MAX + 16], tail[512];
            if (alive) {
                char *cl = cmdline_text(sb->pid);
                dsec_err_set(err, DSEC_E_BACKEND, 0,
                             "QEMU's process %d did not become QEMU: its command line is "
                             "\"%.160s\" after %d looks",
                             (int)sb->pid, cl ? cl : "", odd);
                dsec_free(cl);
                return -1;
            }
            dsec__vm_fmt(p, sizeof p, "%s/qemu.log", sb->dir);
            dsec__vm_log_tail(p, tail, sizeof tail);
            return dsec_err_set(err, DSEC_E_BACKEND, 0, "QEMU exited at start: %s",
                                tail[0] ? tail : "no message in qemu.log");
        }
        if (dsec_now_ns() > deadline)
            return dsec_err_set(err, DSEC_E_TIMEOUT, e2.errnum,
                                "QEMU's monitor did not answer in %" PRIu64 " ms: %s", timeout_ms,
                                e2.msg);
        msleep(20);
    }
}

int dsec__vm_qemu_stop(dsec_sandbox *sb, uint64_t grace_ms, dsec_err *err)
{
    if (sb->pid <= 0)
        return 0;
    if (dsec__vm_qemu_is_ours(sb->pid, sb->dir)) {
        struct vm_qmp q;
        dsec_err e2;
        if (dsec__vm_qmp_open(&q, sb->dir, 500, &e2) == 0) {
            dsec__vm_qmp_cmd(&q, "quit", NULL, NULL, 500, &e2);
            dsec__vm_qmp_close(&q);
        }
        uint64_t t0 = dsec_now_ns();
        bool killed = false;
        while (dsec__vm_qemu_is_ours(sb->pid, sb->dir)) {
            uint64_t ms = (dsec_now_ns() - t0) / 1000000u;
            if (!killed && ms >= grace_ms) {
                kill(sb->pid, SIGKILL);
                killed = true;
            }
            if (ms > grace_ms + 30000)
                return dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                                    "QEMU (pid %d) did not exit after SIGKILL", (int)sb->pid);
            msleep(5);
        }
    }
    sb->pid = 0;
    return 0;
}

/* ---- QMP ---------------------------------------------------------------------------------- */

/* Read one line (without its newline) into a dsec_malloc'd string, by deadline. */
static int qmp_line(struct vm_qmp *q, uint64_t deadline, char **line, dsec_err *err)
{
    for (;;) {
        char *nl = memchr(q->buf, '\n', q->len);
        if (nl != NULL) {
            size_t n = (size_t)(nl - q->buf);
            char *s = dsec_strndup(q->buf, n);
            if (s == NULL)
                return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "QMP reply");
            if (n > 0 && s[n - 1] == '\r')
                s[n - 1] = '\0';
            q->len -= n + 1;
            memmove(q->buf, nl + 1, q->len);
            *line = s;
            return 0;
        }
        if (q->len == sizeof q->buf)
            return dsec_err_set(err, DSEC_E_DECODE, 0, "QMP: a reply line is longer than %zu",
                                sizeof q->buf);
        uint64_t now = dsec_now_ns();
        if (now >= deadline)
            return dsec_err_set(err, DSEC_E_TIMEOUT, 0, "QMP: no answer in time");
        struct pollfd p = {.fd = q->fd, .events = POLLIN};
        int ms = (int)((deadline - now) / 1000000u) + 1;
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return dsec_err_set(err, DSEC_E_IO, errno, "QMP: poll");
        if (r == 0)
            continue;
        ssize_t got = read(q->fd, q->buf + q->len, sizeof q->buf - q->len);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (got <= 0)
            return dsec_err_set(err, DSEC_E_CLOSED, got < 0 ? errno : 0,
                                "QMP: QEMU closed its monitor (it exited)");
        q->len += (size_t)got;
    }
}

int dsec__vm_qmp_open(struct vm_qmp *q, const char *dir, uint64_t timeout_ms, dsec_err *err)
{
    memset(q, 0, sizeof *q);
    q->fd = -1;
    dsec__vm_fmt(q->dir, sizeof q->dir, "%s", dir);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "QMP: opening %s", dir);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    dsec__vm_fmt(a.sun_path, sizeof a.sun_path, "/proc/self/fd/%d/qmp.sock", dfd);
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
        int e = errno;
        if (s >= 0)
            close(s);
        close(dfd);
        return dsec_err_set(err, DSEC_E_CONN, e, "QMP: connecting to %s/qmp.sock: %s", dir,
                            strerror(e));
    }
    close(dfd);
    q->fd = s;
    uint64_t deadline = dsec_now_ns() + timeout_ms * 1000000u;
    char *line = NULL;
    if (qmp_line(q, deadline, &line, err) < 0)
        goto fail;
    bool greeting = strstr(line, "\"QMP\"") != NULL;
    dsec_free(line);
    if (!greeting) {
        dsec_err_set(err, DSEC_E_DECODE, 0, "QMP: %s/qmp.sock sent no greeting", dir);
        goto fail;
    }
    if (dsec__vm_qmp_cmd(q, "qmp_capabilities", NULL, NULL, timeout_ms, err) < 0)
        goto fail;
    return 0;
fail:
    dsec__vm_qmp_close(q);
    return -1;
}

void dsec__vm_qmp_close(struct vm_qmp *q)
{
    if (q->fd >= 0)
        close(q->fd);
    q->fd = -1;
}

int dsec__vm_json_str(const char *json, const char *key, char *out, size_t len)
{
    char k[96];
    dsec__vm_fmt(k, sizeof k, "\"%s\"", key);
    const char *p = strstr(json, k);
    if (p == NULL)
        return -1;
    p += strlen(k);
    while (*p == ' ' || *p == ':')
        p++;
    if (*p != '"')
        return -1;
    p++;
    size_t o = 0;
    for (; *p && *p != '"'; p++) {
        if (*p == '\\' && p[1] != '\0')
            p++;
        if (o + 1 < len)
            out[o++] = *p;
    }
    if (len > 0)
        out[o] = '\0';
    return 0;
}

/* The number after "id": in a reply, or -1. */
static long reply_id(const char *line)
{
    const char *p = strstr(line, "\"id\"");
    if (p == NULL)
        return -1;
    p += 4;
    while (*p == ' ' || *p == ':')
        p++;
    if (*p < '0' || *p > '9')
        return -1;
    return strtol(p, NULL, 10);
}

/* One command; fd >= 0 travels with its first byte (SCM_RIGHTS), for getfd. */
static int qmp_cmd_fd(struct vm_qmp *q, const char *cmd, const char *args, int fd, char **reply,
                      uint64_t timeout_ms, dsec_err *err)
{
    if (reply != NULL)
        *reply = NULL;
    unsigned id = ++q->id;
    size_t cap = strlen(cmd) + (args ? strlen(args) : 0) + 96;
    char *msg = dsec_malloc(cap);
    if (msg == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "QMP command");
    int n = args != NULL ? snprintf(msg, cap, "{\"execute\":\"%s\",\"arguments\":%s,\"id\":%u}\n",
                                    cmd, args, id)
                         : snprintf(msg, cap, "{\"execute\":\"%s\",\"id\":%u}\n", cmd, id);
    size_t off = 0;
    while (off < (size_t)n) {
        ssize_t w;
        if (fd >= 0 && off == 0) {
            union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
            } u;
            memset(&u, 0, sizeof u);
            struct iovec iov = {.iov_base = msg, .iov_len = (size_t)n};
            struct msghdr mh = {.msg_iov = &iov,
                                .msg_iovlen = 1,
                                .msg_control = u.buf,
                                .msg_controllen = sizeof u.buf};
            struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(c), &fd, sizeof fd);
            w = sendmsg(q->fd, &mh, MSG_NOSIGNAL);
        } else {
            w = send(q->fd, msg + off, (size_t)n - off, MSG_NOSIGNAL);
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            int e = errno;
            dsec_free(msg);
            return dsec_err_set(err, DSEC_E_CLOSED, e, "QMP %s: QEMU's monitor is gone", cmd);
        }
        off += (size_t)w;
    }
    dsec_free(msg);
    uint64_t deadline = dsec_now_ns() + timeout_ms * 1000000u;
    for (;;) {
        char *line = NULL;
        if (qmp_line(q, deadline, &line, err) < 0)
            return dsec_err_wrap(err, "QMP %s", cmd);
        /* events come first-class on the same stream: skip them */
        if (strncmp(line, "{\"timestamp\"", 12) == 0 || reply_id(line) != (long)id) {
            dsec_free(line);
            continue;
        }
        if (strstr(line, "\"error\"") != NULL) {
            char desc[512] = "";
            dsec__vm_json_str(line, "desc", desc, sizeof desc);
            dsec_free(line);
            return dsec_err_set(err, DSEC_E_BACKEND, 0, "QMP %s: %s", cmd,
                                desc[0] ? desc : "failed");
        }
        if (reply != NULL)
            *reply = line;
        else
            dsec_free(line);
        return 0;
    }
}

int dsec__vm_qmp_cmd(struct vm_qmp *q, const char *cmd, const char *args, char **reply,
                     uint64_t timeout_ms, dsec_err *err)
{
    return qmp_cmd_fd(q, cmd, args, -1, reply, timeout_ms, err);
}

/* Poll query-migrate until the migration is over. */
static int migrate_wait(struct vm_qmp *q, const char *what, dsec_err *err)
{
    uint64_t deadline = dsec_now_ns() + 600000ull * 1000000u;
    unsigned nap = 1;
    for (;;) {
        char *r = NULL;
        if (dsec__vm_qmp_cmd(q, "query-migrate", NULL, &r, 10000, err) < 0)
            return dsec_err_wrap(err, "%s", what);
        char st[64] = "";
        dsec__vm_json_str(r, "status", st, sizeof st);
        if (strcmp(st, "completed") == 0) {
            dsec_free(r);
            return 0;
        }
        if (strcmp(st, "failed") == 0 || strcmp(st, "cancelled") == 0) {
            char desc[400] = "", p[PATH_MAX + 16];
            dsec__vm_json_str(r, "error-desc", desc, sizeof desc);
            dsec_free(r);
            if (desc[0] == '\0' && q->dir[0] != '\0') { /* QEMU may have said why in its log */
                dsec__vm_fmt(p, sizeof p, "%s/qemu.log", q->dir);
                dsec__vm_log_tail(p, desc, sizeof desc);
            }
            return dsec_err_set(err, DSEC_E_BACKEND, 0, "%s: migration %s: %s", what, st,
                                desc[0] ? desc : "no reason given");
        }
        dsec_free(r);
        if (dsec_now_ns() > deadline)
            return dsec_err_set(err, DSEC_E_TIMEOUT, 0, "%s: migration did not end", what);
        msleep(nap);
        if (nap < 20)
            nap *= 2;
    }
}

static const char ignore_shared[] =
    "{\"capabilities\":[{\"capability\":\"x-ignore-shared\",\"state\":true}]}";

/* Migration goes through a file the node opens and hands to QEMU (getfd): QEMU, which runs
 * as an unprivileged uid that may not reach the file's directory and may not spawn a
 * process, needs no path. */
static int migrate_fd(struct vm_qmp *q, const char *state, bool out, dsec_err *err)
{
    const char *what = out ? "saving the VM's state" : "loading the VM's state";
    int fd = out ? open(state, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)
                 : open(state, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "%s: opening %s", what, state);
    static const char getfd[] = "{\"fdname\":\"dsec-migration\"}";
    static const char uri[] = "{\"uri\":\"fd:dsec-migration\"}";
    int rc = dsec__vm_qmp_cmd(q, "migrate-set-capabilities", ignore_shared, NULL, 5000, err);
    if (rc == 0)
        rc = qmp_cmd_fd(q, "getfd", getfd, fd, NULL, 5000, err);
    close(fd); /* QEMU holds its own copy now */
    if (rc == 0)
        rc = dsec__vm_qmp_cmd(q, out ? "migrate" : "migrate-incoming", uri, NULL, 10000, err);
    if (rc < 0)
        return dsec_err_wrap(err, "%s", what);
    return migrate_wait(q, what, err);
}

int dsec__vm_migrate_out(struct vm_qmp *q, const char *state, dsec_err *err)
{
    return migrate_fd(q, state, true, err);
}

int dsec__vm_migrate_in(struct vm_qmp *q, const char *state, dsec_err *err)
{
    if (migrate_fd(q, state, false, err) < 0)
        return -1;
    if (dsec__vm_qmp_cmd(q, "cont", NULL, NULL, 10000, err) < 0)
        return dsec_err_wrap(err, "resuming the loaded VM");
    return 0;
}
