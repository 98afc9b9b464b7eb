/* test_escape.c - escape attempts made from inside a real container sandbox, each asserted blocked
 * (with DSEC_ESCAPE_PROBE defined: the static probe program that makes them from inside). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef DSEC_ESCAPE_PROBE
/* ==== the probe (runs inside the sandbox) =================================================== */

#include <dirent.h>
#include <ftw.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/klog.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/swap.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/un.h>

#include "backends/agent/agent-proto.h"

/*
 * Usage: escape-probe sys HOSTPATH | ioctl LAYERFILE | agent HOSTSOCK | forge | euid
 * Each attempt prints one line, "escape: <attempt>: blocked (<how>)" or
 * "escape: <attempt>: NOT BLOCKED (<what happened>)"; the exit status is the
 * number of attempts that were not blocked. "Blocked" means refused by the
 * guard that is meant to refuse it (the errno that guard gives), not merely
 * failing for some other reason: an unexpected errno is reported as not
 * blocked, so a guard that went missing cannot hide behind bad arguments.
 * Where an attempt could do harm if it got through, its arguments are chosen
 * so that it would fail harmlessly further on (a bad reboot magic, a missing
 * swap file) with an errno that tells the two apart.
 */

static int failures;

static void blocked(const char *what, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void blocked(const char *what, const char *fmt, ...)
{
    char how[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(how, sizeof how, fmt, ap);
    va_end(ap);
    printf("escape: %s: blocked (%s)\n", what, how);
}

static void not_blocked(const char *what, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void not_blocked(const char *what, const char *fmt, ...)
{
    char how[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(how, sizeof how, fmt, ap);
    va_end(ap);
    printf("escape: %s: NOT BLOCKED (%s)\n", what, how);
    failures++;
}

static const char *ename(int e)
{
    const char *n = strerrorname_np(e);
    return n != NULL ? n : "?";
}

/* rc/e of a call that must fail with want (or want2, when nonzero). */
static void expect(const char *what, long rc, int e, int want, int want2)
{
    if (rc >= 0)
        not_blocked(what, "the call succeeded");
    else if (e == want || (want2 != 0 && e == want2))
        blocked(what, "%s", ename(e));
    else
        not_blocked(what, "failed with %s, but the guard gives %s", ename(e), ename(want));
}

/* The call is made before errno is read (function arguments have no order). */
#define EXPECT(what, call, want, want2)                                                            \
    do {                                                                                           \
        errno = 0;                                                                                 \
        long rc_ = (long)(call);                                                                   \
        expect(what, rc_, errno, want, want2);                                                     \
    } while (0)

/* Run fn in a child (for calls that may change the caller for good, or kill it). Returns the
 * child's wait status. */
static int in_child(int (*fn)(void *), void *arg)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0)
        _exit(fn(arg));
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0)
        return -1;
    return st;
}

/* ---- sys: mounts, namespaces, kernel interfaces, devices, raw sockets, chroot ---- */

static int raw_clone(void *arg)
{
    long r = syscall(SYS_clone, *(unsigned long *)arg, 0, 0, 0, 0);
    if (r == 0)
        _exit(0); /* the new child, had the call got through */
    if (r > 0) {
        waitpid((pid_t)r, NULL, 0);
        return 200;
    }
    return errno;
}

static void try_clone(const char *what, unsigned long flags)
{
    int st = in_child(raw_clone, &flags);
    if (st < 0 || !WIFEXITED(st))
        not_blocked(what, "the probe's child died (status %d)", st);
    else if (WEXITSTATUS(st) == 200)
        not_blocked(what, "a child was created in a new namespace");
    else
        expect(what, -1, WEXITSTATUS(st), EPERM, 0);
}

struct clone_args_ { /* struct clone_args of linux/sched.h, version 0 */
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};

/* unshare(CLONE_NEWUSER) through the 32-bit (int 0x80) entry, which a filter written for the
 * native ABI alone would not see. */
static int compat_unshare(void *arg)
{
    (void)arg;
    long r;
    __asm__ volatile("int $0x80"
                     : "=a"(r)
                     : "a"(310L /* i386 unshare */), "b"((long)CLONE_NEWUSER)
                     : "memory");
    return r == 0 ? 200 : (int)(-r & 0xff);
}

static int x32_unshare(void *arg)
{
    (void)arg;
    long r = syscall(0x40000000L | SYS_unshare, (long)CLONE_NEWUSER);
    return r == 0 ? 200 : errno;
}

static void try_other_abi(const char *what, int (*fn)(void *))
{
    int st = in_child(fn, NULL);
    if (st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS)
        blocked(what, "killed by SIGSYS: the filter admits the native ABI only");
    else if (st >= 0 && WIFSIGNALED(st))
        blocked(what, "killed by signal %d: no such entry in this kernel", WTERMSIG(st));
    else if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 200)
        not_blocked(what, "unshare(CLONE_NEWUSER) succeeded");
    else if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == ENOSYS)
        blocked(what, "ENOSYS: this kernel has no such entry");
    else if (st >= 0 && WIFEXITED(st))
        expect(what, -1, WEXITSTATUS(st), EPERM, 0);
    else
        not_blocked(what, "the probe's child could not be run");
}

struct chroot_arg {
    const char *hostpath;
    char how[256];
};

/* The classic chroot break-out: keep a descriptor of the old root, chroot into a subdirectory,
 * fchdir back out, climb, chroot("."). With a pivot_root'ed container it may only reach the
 * container's own root; returns 0 when it stayed inside. */
static int chroot_escape(void *arg)
{
    struct chroot_arg *a = arg;
    int root = open("/", O_RDONLY | O_DIRECTORY);
    mkdir("/tmp/jail", 0700);
    if (root < 0 || chroot("/tmp/jail") < 0)
        return 100 + (errno & 0x3f);
    if (fchdir(root) < 0)
        return 99;
    for (int i = 0; i < 64; i++)
        if (chdir("..") < 0)
            return 98;
    if (chroot(".") < 0)
        return 97;
    bool host = access(a->hostpath, F_OK) == 0;
    bool inside = access("/.dsec/agent", F_OK) == 0;
    return host ? 10 : inside ? 0 : 11;
}

static void probe_sys(const char *hostpath)
{
    EXPECT("mount a tmpfs", mount("x", "/mnt", "tmpfs", 0, NULL), EPERM, 0);
    EXPECT("umount2 /tmp", umount2("/tmp", 0), EPERM, 0);
    EXPECT("pivot_root", syscall(SYS_pivot_root, "/tmp", "/tmp"), EPERM, 0);
    EXPECT("new mount API: fsopen(tmpfs)", syscall(SYS_fsopen, "tmpfs", 0), EPERM, 0);
    EXPECT("new mount API: open_tree(/, clone)", syscall(SYS_open_tree, AT_FDCWD, "/", 1), EPERM,
           0);
    EXPECT("unshare(CLONE_NEWUSER)", unshare(CLONE_NEWUSER), EPERM, 0);
    EXPECT("unshare(CLONE_NEWNS)", unshare(CLONE_NEWNS), EPERM, 0);
    try_clone("clone(CLONE_NEWUSER)", CLONE_NEWUSER | SIGCHLD);
    /* the kernel reads only the low 32 bits of clone's flags */
    try_clone("clone(CLONE_NEWNET with high bits set)", (1ul << 40) | CLONE_NEWNET | SIGCHLD);
    struct clone_args_ ca = {.flags = CLONE_NEWUSER, .exit_signal = SIGCHLD};
    long r = syscall(SYS_clone3, &ca, sizeof ca);
    int e = errno;
    if (r == 0)
        _exit(0);
    if (r > 0)
        waitpid((pid_t)r, NULL, 0);
    expect("clone3(CLONE_NEWUSER)", r, e, ENOSYS, 0);
    int nsfd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    EXPECT("setns", setns(nsfd, 0), EPERM, 0);
    close(nsfd);
    try_other_abi("unshare through the 32-bit entry (int 0x80)", compat_unshare);
    try_other_abi("unshare through the x32 entry", x32_unshare);

    /* kernel modules, kexec, reboot, swap, time, ports, kernel log */
    static const char junk[64] = "not a kernel module";
    EXPECT("init_module", syscall(SYS_init_module, junk, sizeof junk, ""), EPERM, 0);
    int mfd = open("/tmp/x.ko", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (mfd >= 0 && write(mfd, junk, sizeof junk) != (ssize_t)sizeof junk)
        mfd = -1;
    EXPECT("finit_module", syscall(SYS_finit_module, mfd, "", 0), EPERM, 0);
    close(mfd);
    EXPECT("delete_module", syscall(SYS_delete_module, "nosuchmodule", O_NONBLOCK), EPERM, 0);
    EXPECT("kexec_load", syscall(SYS_kexec_load, 0ul, 0ul, NULL, 0xdead0000ul), EPERM, 0);
    EXPECT("kexec_file_load", syscall(SYS_kexec_file_load, -1, -1, 0ul, "", 0xdead0000ul), EPERM,
           0);
    EXPECT("reboot", syscall(SYS_reboot, 0xfee1dead, 0x12345678, 0x01234567, NULL), EPERM, 0);
    EXPECT("swapon", swapon("/nonexistent-swap", 0), EPERM, 0);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    EXPECT("clock_settime", clock_settime(CLOCK_REALTIME, &now), EPERM, 0);
    EXPECT("iopl(3)", syscall(SYS_iopl, 3), EPERM, 0);
    char kbuf[256];
    EXPECT("read the host kernel log (syslog)", klogctl(3, kbuf, sizeof kbuf), EPERM, 0);

    /* tracing and kernel programs */
    EXPECT("ptrace(PTRACE_ATTACH) of the agent", ptrace(PTRACE_ATTACH, 1, 0, 0), EPERM, 0);
    char rbuf[16];
    struct iovec lio = {rbuf, sizeof rbuf}, rio = {(void *)0x400000, sizeof rbuf};
    EXPECT("process_vm_readv of the agent", process_vm_readv(1, &lio, 1, &rio, 1, 0), EPERM, 0);
    static uint8_t attr[128];
    EXPECT("bpf(BPF_PROG_LOAD)", syscall(SYS_bpf, 5, attr, sizeof attr), EPERM, 0);
    EXPECT("perf_event_open", syscall(SYS_perf_event_open, attr, 0, -1, -1, 0), EPERM, 0);
    EXPECT("userfaultfd", syscall(SYS_userfaultfd, O_CLOEXEC | 1 /* UFFD_USER_MODE_ONLY */), EPERM,
           0);
    EXPECT("keyctl", syscall(SYS_keyctl, 0 /* GET_KEYRING_ID */, -3 /* session */, 0), EPERM, 0);
    struct {
        unsigned int bytes;
        int type;
        unsigned char h[8];
    } fh = {8, 1, {2, 0, 0, 0, 0, 0, 0, 0}};
    int rootfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    EXPECT("open_by_handle_at (shocker)", syscall(SYS_open_by_handle_at, rootfd, &fh, O_RDONLY),
           EPERM, 0);
    close(rootfd);

    /* devices, raw network, host name */
    EXPECT("mknod a block device (8:0)", mknod("/tmp/sda", S_IFBLK | 0600, makedev(8, 0)), EPERM,
           0);
    EXPECT("mknod /dev/kmsg (1:11)", mknod("/tmp/kmsg", S_IFCHR | 0600, makedev(1, 11)), EPERM, 0);
    EXPECT("raw IP socket", socket(AF_INET, SOCK_RAW, IPPROTO_RAW), EPERM, 0);
    EXPECT("packet socket", socket(AF_PACKET, SOCK_RAW, htons(0x0003)), EPERM, 0);
    EXPECT("sethostname", sethostname("evil", 4), EPERM, 0);

    struct chroot_arg ca2 = {.hostpath = hostpath};
    int st = in_child(chroot_escape, &ca2);
    const char *what = "chroot escape (fchdir out of a chroot, chdir .. x64, chroot .)";
    if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0)
        blocked(what,
                "it reaches only the container's own root: /.dsec/agent there, the host's "
                "%s not",
                hostpath);
    else if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) >= 100)
        blocked(what, "chroot refused: %s", ename(WEXITSTATUS(st) - 100));
    else if (st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 10)
        not_blocked(what, "the host's %s is visible", hostpath);
    else
        not_blocked(what, "unexpected outcome (status %d)", st);
}

/* ---- ioctl: extents of the shared layers ---- */

struct move_extent_ { /* struct move_extent of ext4 */
    uint32_t reserved, donor_fd;
    uint64_t orig_start, donor_start, len, moved_len;
};
#define EXT4_IOC_MOVE_EXT_ _IOWR('f', 15, struct move_extent_)

static void probe_ioctl(const char *layer_file)
{
    int src = open(layer_file, O_RDONLY | O_CLOEXEC);
    int src2 = open(layer_file, O_RDONLY | O_CLOEXEC);
    int dst = open("/tmp/clone-dst", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (src < 0 || src2 < 0 || dst < 0) {
        not_blocked("extent ioctls", "cannot open %s or /tmp/clone-dst: %s", layer_file,
                    strerror(errno));
        return;
    }
    EXPECT("FICLONE from a layer file", ioctl(dst, FICLONE, src), EPERM, 0);
    /* ioctl's request is an unsigned int to the kernel, 64 bits to seccomp */
    EXPECT("FICLONE with high bits set in the request",
           syscall(SYS_ioctl, dst, 0xffffffff00000000ul | FICLONE, src), EPERM, 0);
    struct file_clone_range fcr = {.src_fd = src, .src_length = 4096};
    EXPECT("FICLONERANGE from a layer file", ioctl(dst, FICLONERANGE, &fcr), EPERM, 0);
    static union {
        struct file_dedupe_range r;
        char space[sizeof(struct file_dedupe_range) + sizeof(struct file_dedupe_range_info)];
    } dd;
    dd.r.src_offset = 0;
    dd.r.src_length = 4096;
    dd.r.dest_count = 1;
    dd.r.info[0].dest_fd = src2;
    dd.r.info[0].dest_offset = 4096;
    EXPECT("FIDEDUPERANGE onto a layer file", ioctl(src, FIDEDUPERANGE, &dd), EPERM, 0);
    struct move_extent_ me = {.donor_fd = (uint32_t)dst, .len = 1};
    EXPECT("EXT4_IOC_MOVE_EXT on a layer file", ioctl(src, EXT4_IOC_MOVE_EXT_, &me), EPERM, 0);
    static union {
        struct fiemap f;
        char space[sizeof(struct fiemap) + 4 * sizeof(struct fiemap_extent)];
    } fm;
    fm.f.fm_length = ~0ull;
    fm.f.fm_extent_count = 4;
    EXPECT("FS_IOC_FIEMAP of a layer file", ioctl(src, FS_IOC_FIEMAP, &fm), EPERM, 0);
    close(src);
    close(src2);
    close(dst);
}

/* ---- agent: the channel the node drives the sandbox through ---- */

static int try_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    if (rc == 0) {
        /* a SYNC, as a new client would start: the agent would answer HELLO */
        uint8_t f[DSEC__AGENT_HDR], *p = dsec__agent_put_hdr(f, DSEC__AGENT_T_SYNC, 7, 0);
        (void)!write(fd, f, (size_t)(p - f));
    }
    close(fd);
    errno = e;
    return rc;
}

static int nsock_files, nsock_reached;
static int walk_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)ftw;
    if (flag == FTW_D && (strcmp(path, "/proc") == 0 || strcmp(path, "/sys") == 0))
        return FTW_SKIP_SUBTREE;
    if (S_ISSOCK(st->st_mode)) {
        nsock_files++;
        if (try_connect(path) == 0) {
            nsock_reached++;
            printf("escape: socket file %s accepts connections\n", path);
        }
    }
    return FTW_CONTINUE;
}

static void probe_agent(const char *host_sock)
{
    /* no socket among the command's own descriptors */
    DIR *d = opendir("/proc/self/fd");
    int nfd = 0, nsock = 0;
    struct dirent *de;
    while (d != NULL && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char p[300], l[256];
        snprintf(p, sizeof p, "/proc/self/fd/%s", de->d_name);
        ssize_t n = readlink(p, l, sizeof l - 1);
        l[n > 0 ? n : 0] = '\0';
        nfd++;
        nsock += strncmp(l, "socket:", 7) == 0;
    }
    if (d != NULL)
        closedir(d);
    if (nsock == 0)
        blocked("inherit the agent's socket", "none among the command's %d descriptors", nfd);
    else
        not_blocked("inherit the agent's socket", "%d sockets among the command's descriptors",
                    nsock);

    /* the agent's own descriptors (its listening socket is fd 3 at start) */
    EXPECT("open the agent's fd 3 through /proc/1/fd", open("/proc/1/fd/3", O_RDWR), EACCES, EPERM);
    char l[256];
    EXPECT("name the agent's fds (readlink /proc/1/fd/3)", readlink("/proc/1/fd/3", l, sizeof l),
           EACCES, EPERM);
    EXPECT("write the agent's log through /proc/1/fd/2", open("/proc/1/fd/2", O_WRONLY), EACCES,
           EPERM);
    EXPECT("open the agent's memory (/proc/1/mem)", open("/proc/1/mem", O_RDWR), EACCES, EPERM);
    int pfd = (int)syscall(SYS_pidfd_open, 1, 0);
    if (pfd < 0)
        blocked("take the agent's socket with pidfd_getfd", "pidfd_open(1): %s", ename(errno));
    else
        EXPECT("take the agent's socket with pidfd_getfd", syscall(SYS_pidfd_getfd, pfd, 3, 0),
               EPERM, 0);

    /* the socket's host path */
    EXPECT("connect to the agent socket's host path", try_connect(host_sock), ENOENT, 0);
    /* every unix socket this network namespace knows by path */
    FILE *f = fopen("/proc/net/unix", "re");
    char line[512];
    int nlisted = 0, nreached = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        char *path = strchr(line, '/');
        if (path == NULL)
            continue;
        path[strcspn(path, "\n")] = '\0';
        nlisted++;
        if (try_connect(path) == 0) {
            nreached++;
            printf("escape: listed socket %s accepts connections\n", path);
        }
    }
    if (f != NULL)
        fclose(f);
    if (nreached == 0)
        blocked("reach a unix socket listed in /proc/net/unix",
                "%d listed with a path, none "
                "reachable",
                nlisted);
    else
        not_blocked("reach a unix socket listed in /proc/net/unix", "%d reachable", nreached);
    /* and every socket file anywhere in the sandbox's tree */
    nftw("/", walk_one, 32, FTW_PHYS | FTW_MOUNT | FTW_ACTIONRETVAL);
    if (nsock_reached == 0)
        blocked("reach a socket file in the sandbox's tree", "%d socket files, none listening",
                nsock_files);
    else
        not_blocked("reach a socket file in the sandbox's tree", "%d listening", nsock_reached);
}

/* Frames that would end the exec early (EXIT with code 0) and greet a client (HELLO), written to
 * stdout and stderr: they must reach the node as the command's output, nothing more. */
static int probe_forge(void)
{
    uint8_t buf[1024], *p = buf;
    for (uint32_t id = 0; id < 16; id++) {
        p = dsec__agent_put_hdr(p, DSEC__AGENT_T_EXIT, id, 4 + 4 + 1 + 8 + 8 + 8);
        p = dsec__agent_put_u32(p, 0);
        p = dsec__agent_put_u32(p, 0);
        p = dsec__agent_put_u8(p, 0);
        p = dsec__agent_put_u64(p, 1);
        p = dsec__agent_put_u64(p, 1);
        p = dsec__agent_put_u64(p, 1);
    }
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_HELLO, 0, 8);
    p = dsec__agent_put_u32(p, DSEC__AGENT_VERSION);
    p = dsec__agent_put_u32(p, 1024);
    size_t n = (size_t)(p - buf);
    if (write(1, buf, n) != (ssize_t)n || write(2, buf, n) != (ssize_t)n)
        return 1;
    return 42;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 3 && strcmp(argv[1], "sys") == 0)
        probe_sys(argv[2]);
    else if (argc == 3 && strcmp(argv[1], "ioctl") == 0)
        probe_ioctl(argv[2]);
    else if (argc == 3 && strcmp(argv[1], "agent") == 0)
        probe_agent(argv[2]);
    else if (argc == 2 && strcmp(argv[1], "forge") == 0)
        return probe_forge();
    else if (argc == 2 && strcmp(argv[1], "euid") == 0) {
        int up = setuid(0);
        printf("uid %d euid %d setuid(0) %s\n", (int)getuid(), (int)geteuid(),
               up == 0 ? "worked" : "refused");
        return 0;
    } else {
        fprintf(stderr, "usage: escape-probe sys HOSTPATH | ioctl FILE | agent HOSTSOCK | forge | "
                        "euid\n");
        return 100;
    }
    return failures;
}

#else
/* ==== the test (runs on the host) ============================================================ */

#include <pthread.h>
#include <setjmp.h>

#include <cmocka.h>

#include "backends/backend.h"
#include "backends/container/container.h"
#include "dsec/alloc.h"
#include "dsec/err.h"
#include "dsec/layers.h"

/*
 * One backend instance, as one serves a node ("esctest": its cgroups live
 * under dsec-ct-esctest), on a busybox layer built here into a local
 * registry. The probe (this file built with DSEC_ESCAPE_PROBE) is written
 * into a sandbox through the agent and run there; its lines and the test's
 * own are printed as "escape: <attempt>: blocked (<how>)". Every attempt is
 * asserted by name, so one that goes missing fails as surely as one that
 * gets through.
 */

#define NODE "esctest"
#define PROBE "/usr/local/bin/escape-probe"

/* The OCI runtime the attempts are made under: built once per runtime (tests/escape.cmake). */
#ifndef ESCAPE_RUNTIME
#define ESCAPE_RUNTIME "crun"
#endif

static void *ct;
static dsec_layer_registry *reg;
static char top[32];       /* the test's temp dir; exists only on the host */
static char state_dir[64]; /* the backend's */
static int seq;

struct sbx {
    dsec_sandbox *h;
    char *bstate;
    char id[64];
    struct sbx *next;
};

static struct sbx *main_sb; /* holds the probe; most attempts run here */
static struct sbx *live;    /* every sandbox not yet dropped: a failed test leaves its own */

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Run a host shell line; its output (first 4 KiB) in out (may be NULL). Returns the exit status. */
static int host(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int host(char *out, size_t len, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return -1;
    char buf[4096];
    size_t got = fread(buf, 1, sizeof buf - 1, p);
    buf[got] = '\0';
    if (out != NULL)
        snprintf(out, len, "%s", buf);
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The busybox base layer and environment "busybox:1". */
static int build_base(void)
{
    if (host(NULL, 0,
             "set -e; t=%s/tree; mkdir -p $t/bin $t/etc $t/proc $t/sys $t/dev $t/tmp $t/root "
             "$t/mnt $t/usr/local/bin; cp /bin/busybox $t/bin/busybox; "
             "for a in $(/bin/busybox --list); do "
             "[ \"$a\" = busybox ] || ln -s busybox $t/bin/$a; done; "
             "printf 'root:x:0:0:root:/root:/bin/sh\\nnobody:x:65534:65534:nobody:/:/bin/false\\n'"
             " > $t/etc/passwd; printf 'root:x:0:\\nnogroup:x:65534:\\n' > $t/etc/group; "
             "chmod 1777 $t/tmp",
             top) != 0)
        return -1;
    char tree[128], blob[128], regdir[128];
    snprintf(tree, sizeof tree, "%s/tree", top);
    snprintf(blob, sizeof blob, "%s/base.blob", top);
    snprintf(regdir, sizeof regdir, "%s/registry", top);
    dsec_digest d;
    dsec_err err;
    if (dsec_layer_registry_local(&reg, regdir, &err) < 0 ||
        dsec_layer_build(tree, DSEC_LAYER_DIR, NULL, 0, blob, d, &err) < 0 ||
        dsec_layer_registry_put(reg, d, DSEC_LAYER_DIR, blob, &err) < 0) {
        fprintf(stderr, "test_escape: base layer: %s\n", err.msg);
        return -1;
    }
    char *layers[] = {d};
    dsec_layer_format fmts[] = {DSEC_LAYER_DIR};
    dsec_env env = {.name = "busybox:1",
                    .layers = layers,
                    .formats = fmts,
                    .nlayers = 1,
                    .workdir = "/root",
                    .user = "root"};
    if (dsec_layer_registry_env_put(reg, &env, &err) < 0) {
        fprintf(stderr, "test_escape: environment: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static struct sbx *mk(uint64_t memory_mb)
{
    struct sbx *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    snprintf(s->id, sizeof s->id, "esctest-%d-%d", (int)getpid(), ++seq);
    dsec_sandbox_spec spec = {
        .id = s->id, .type = "container", .env = "busybox:1", .memory_mb = memory_mb};
    dsec_err err;
    if (dsec_container_ops.create(ct, &spec, &s->h, &s->bstate, &err) < 0) {
        fprintf(stderr, "test_escape: create %s: %s\n", s->id, err.msg);
        free(s);
        return NULL;
    }
    s->next = live;
    live = s;
    return s;
}

static int drop(struct sbx *s)
{
    if (s == NULL)
        return 0;
    for (struct sbx **pp = &live; *pp != NULL; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    dsec_err err;
    int rc = dsec_container_ops.destroy(ct, s->h, &err);
    if (rc < 0)
        fprintf(stderr, "test_escape: destroy %s: %s\n", s->id, err.msg);
    dsec_free(s->bstate);
    free(s);
    return rc;
}

/* Copy the probe into sandbox s. */
static int install_probe(struct sbx *s)
{
    FILE *f = fopen(ESCAPE_PROBE_PATH, "rb");
    if (f == NULL) {
        fprintf(stderr, "test_escape: %s: %s\n", ESCAPE_PROBE_PATH, strerror(errno));
        return -1;
    }
    static char bin[8u << 20];
    size_t n = fread(bin, 1, sizeof bin, f);
    fclose(f);
    dsec_err err;
    if (n == 0 || n == sizeof bin ||
        dsec_container_ops.file_write(ct, s->h, PROBE, bin, n, 0755, false, &err) < 0) {
        fprintf(stderr, "test_escape: installing the probe (%zu bytes): %s\n", n,
                n == 0 || n == sizeof bin ? "bad size" : err.msg);
        return -1;
    }
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    snprintf(top, sizeof top, "/tmp/dsec-esctest-XXXXXX");
    if (mkdtemp(top) == NULL)
        return -1;
    snprintf(state_dir, sizeof state_dir, "%s/state", top);
    if (build_base() < 0)
        return -1;
    dsec_backend_kv opts[] = {{"pids_max", "256"}, {"upper_gb", "8"}, {"runtime", ESCAPE_RUNTIME}};
    dsec_backend_config cfg = {
        .state_dir = state_dir, .node = NODE, .opts = opts, .nopts = 3, .layers = reg};
    dsec_err err;
    if (dsec_container_ops.init(&ct, &cfg, &err) < 0) {
        fprintf(stderr, "test_escape: container backend: %s\n", err.msg);
        return -1;
    }
    main_sb = mk(256);
    return main_sb != NULL && install_probe(main_sb) == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    int rc = 0;
    if (ct != NULL) {
        while (live != NULL)
            if (drop(live) < 0)
                rc = -1;
        dsec_container_ops.fini(ct);
        ct = NULL;
    }
    dsec_layer_registry_free(reg);
    if (top[0] != '\0' && host(NULL, 0, "rm -rf '%s'", top) != 0)
        rc = -1;
    return rc;
}

/* ---- running things inside ----------------------------------------------------------------- */

struct run {
    int rc; /* exit code, or 128 + signal */
    char out[65536];
    char err[8192];
    dsec_exec_result res; /* lengths and flags (output buffers already released) */
};

static void run_as(struct sbx *s, const char *user, const char *line, struct run *r)
{
    const char *argv[] = {"/bin/sh", "-c", line};
    dsec_exec_req req = {.argv = argv, .argc = 3, .timeout_ms = 60000, .user = user};
    dsec_err err;
    memset(&r->res, 0, sizeof r->res);
    if (dsec_container_ops.exec(ct, s->h, &req, &r->res, &err) < 0)
        fail_msg("exec \"%s\" in %s: %s", line, s->id, err.msg);
    snprintf(r->out, sizeof r->out, "%.*s", (int)r->res.stdout_len,
             r->res.stdout_data ? (char *)r->res.stdout_data : "");
    snprintf(r->err, sizeof r->err, "%.*s", (int)r->res.stderr_len,
             r->res.stderr_data ? (char *)r->res.stderr_data : "");
    r->rc = r->res.signal ? 128 + r->res.signal : r->res.exit_code;
    dsec_exec_result_release(&r->res);
}

static struct run *run(struct sbx *s, const char *line)
{
    static struct run r;
    run_as(s, NULL, line, &r);
    return &r;
}

/* A shell attempt that must fail, for one of the reasons in needles ("a|b": one of them is in
 * its stdout or stderr). */
static void attempt_sh(struct sbx *s, const char *what, const char *line, const char *needles)
{
    struct run *r = run(s, line);
    char alts[256], *save = NULL;
    snprintf(alts, sizeof alts, "%s", needles);
    const char *hit = NULL;
    for (char *n = strtok_r(alts, "|", &save); n != NULL && hit == NULL;
         n = strtok_r(NULL, "|", &save))
        if (strstr(r->err, n) != NULL || strstr(r->out, n) != NULL)
            hit = n;
    if (r->rc == 0 || hit == NULL)
        fail_msg("escape: %s: NOT BLOCKED (`%s` exited %d: %s%s)", what, line, r->rc, r->out,
                 r->err);
    printf("escape: %s: blocked (%s)\n", what, hit);
}

#define EPERM_MSG "Operation not permitted|permission denied"

/* Run the probe with args in s; print its lines; assert each attempt named in whats was blocked
 * and none was not. */
static void probe(struct sbx *s, const char *args, const char *const *whats, size_t n)
{
    char line[1024];
    int len = snprintf(line, sizeof line, PROBE " %s", args);
    assert_true(len > 0 && (size_t)len < sizeof line);
    struct run *r = run(s, line);
    fputs(r->out, stdout);
    if (r->err[0] != '\0')
        printf("probe stderr: %s\n", r->err);
    assert_null(strstr(r->out, "NOT BLOCKED"));
    for (size_t i = 0; i < n; i++) {
        char want[256];
        snprintf(want, sizeof want, "escape: %s: blocked (", whats[i]);
        if (strstr(r->out, want) == NULL)
            fail_msg("attempt \"%s\" was not reported blocked by the probe", whats[i]);
    }
    assert_int_equal(r->rc, 0);
}

#define NWHATS(a) (sizeof(a) / sizeof(a)[0])

/* The host pid of sandbox s's agent: the container's init, pid 1 in its namespace, found in
 * the cgroup of its runtime id (its record's rid, a warm container's, or its id). */
static int agent_pid(struct sbx *s)
{
    char out[256];
    if (host(
            out, sizeof out,
            "r=$(sed -n 's/^rid //p' %s/meta); r=${r:-%s}; "
            "for p in $(cat /sys/fs/cgroup/pids/dsec-ct-" NODE "/$r/cgroup.procs "
            "/sys/fs/cgroup/dsec-ct-" NODE "/$r/cgroup.procs 2>/dev/null); do "
            "grep -q 'NSpid:.*[[:space:]]1$' /proc/$p/status 2>/dev/null && echo $p && break; done",
            s->bstate, s->id) != 0)
        return -1;
    return atoi(out);
}

/* A "Key: N kB" line of /proc/pid/status, in kB; -1 when absent. */
static long status_kb(int pid, const char *key)
{
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/status", pid);
    FILE *f = fopen(p, "r");
    long v = -1;
    size_t kl = strlen(key);
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, key, kl) == 0 && line[kl] == ':')
            v = strtol(line + kl + 1, NULL, 10);
    if (f != NULL)
        fclose(f);
    return v;
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* ---- 1. immutable shared layers ------------------------------------------------------------ */

/* A digest of every layer the node holds: names, kinds, modes, sizes and contents. */
#define LAYER_SUM                                                                                  \
    "cd %s/layers && (find . -printf '%%p %%y %%m %%s\\n' | sort; "                                \
    "find . -type f -print0 | sort -z | xargs -0 md5sum) | md5sum"

static void test_layer_overwrite(void **state)
{
    (void)state;
    char before[256], after[256], orig[256];
    assert_int_equal(host(before, sizeof before, LAYER_SUM, state_dir), 0);
    assert_int_equal(host(orig, sizeof orig, "md5sum < /bin/busybox"), 0);
    struct sbx *a = mk(128), *b = mk(128);
    assert_non_null(a);
    assert_non_null(b);
    /* a copy of busybox to act with once the sandbox's own is gone */
    struct run *r = run(a, "cat /bin/busybox > /tmp/busybox && chmod 755 /tmp/busybox && "
                           "/tmp/busybox sh -c 'echo hacked > /bin/busybox && "
                           "/tmp/busybox rm /bin/sh && echo hacked > /bin/sh && "
                           "/tmp/busybox cat /bin/busybox /bin/sh'");
    assert_int_equal(r->rc, 0);
    assert_string_equal(r->out, "hacked\nhacked\n");
    /* the other sandbox on the same layer, and a new one, see the original */
    char want[300];
    snprintf(want, sizeof want, "%.32s  -\nbusybox\n", orig);
    r = run(b, "md5sum < /bin/busybox; readlink /bin/sh");
    assert_int_equal(r->rc, 0);
    assert_string_equal(r->out, want);
    struct sbx *c = mk(128);
    assert_non_null(c);
    r = run(c, "md5sum < /bin/busybox; readlink /bin/sh");
    assert_string_equal(r->out, want);
    /* and the layer on the node is byte for byte what it was */
    assert_int_equal(host(after, sizeof after, LAYER_SUM, state_dir), 0);
    assert_string_equal(before, after);
    printf("escape: overwrite /bin/busybox and /bin/sh of the shared layer: blocked (the writes "
           "landed in the sandbox's own upper layer; another sandbox, a new one and the node's "
           "copy of the layer keep the original)\n");
    /* remounting the root or the layer read-write */
    attempt_sh(b, "remount the root filesystem read-write", "mount -o remount,rw / 2>&1",
               EPERM_MSG);
    assert_int_equal(drop(a), 0);
    assert_int_equal(drop(b), 0);
    assert_int_equal(drop(c), 0);
}

/* ---- 2. masked and read-only kernel files -------------------------------------------------- */

static void test_proc_sys(void **state)
{
    (void)state;
    static const char *const masked[] = {
        "/proc/kpagecgroup", "/proc/kpageflags",  "/proc/kpagecount", "/proc/kcore",
        "/proc/timer_list",  "/proc/sched_debug", "/proc/keys"};
    for (size_t i = 0; i < NWHATS(masked); i++) {
        char line[256];
        snprintf(line, sizeof line, "[ -e %s ] || echo absent; head -c 4096 %s 2>/dev/null | wc -c",
                 masked[i], masked[i]);
        struct run *r = run(main_sb, line);
        assert_int_equal(r->rc, 0);
        if (strcmp(r->out, "absent\n0\n") != 0 && atoi(r->out) != 0)
            fail_msg("escape: read %s: NOT BLOCKED (%s bytes)", masked[i], r->out);
        printf("escape: read %s: blocked (%s)\n", masked[i],
               strncmp(r->out, "absent", 6) == 0 ? "not in this kernel" : "masked: reads 0 bytes");
    }
    /* writes: the file's own value is written back, so an unblocked write changes nothing */
    if (strcmp(run(main_sb, "[ -e /proc/sysrq-trigger ] || echo absent")->out, "absent\n") == 0)
        printf("escape: write /proc/sysrq-trigger: blocked (not in this kernel)\n");
    else
        attempt_sh(main_sb, "write /proc/sysrq-trigger", "echo h > /proc/sysrq-trigger 2>&1",
                   "Read-only file system");
    static const char *const sysctls[] = {
        "/proc/sys/kernel/core_pattern", "/proc/sys/kernel/pid_max",
        "/proc/sys/vm/overcommit_memory", "/proc/sys/kernel/hostname"};
    for (size_t i = 0; i < NWHATS(sysctls); i++) {
        char what[128], line[512];
        snprintf(what, sizeof what, "write %s", sysctls[i]);
        snprintf(line, sizeof line, "v=$(cat %s) && echo \"$v\" > %s 2>&1", sysctls[i], sysctls[i]);
        attempt_sh(main_sb, what, line, "Read-only file system");
    }
    attempt_sh(main_sb, "create a file in /sys", "touch /sys/kernel/x 2>&1",
               "Read-only file system");
    attempt_sh(main_sb, "write /sys/kernel/mm/ksm/run",
               "f=/sys/kernel/mm/ksm/run; [ -e $f ] || f=/sys/kernel/uevent_seqnum; "
               "v=$(cat $f) && echo \"$v\" > $f 2>&1",
               "Read-only file system");
    /* the release_agent break-out needs a cgroup v1 hierarchy: none is mounted, none can be */
    struct run *r = run(main_sb, "awk '$3 ~ /^cgroup/' /proc/self/mounts | wc -l");
    assert_string_equal(r->out, "0\n");
    attempt_sh(main_sb, "mount a cgroup hierarchy to set its release_agent",
               "mkdir -p /tmp/cg && mount -t cgroup -o memory cg /tmp/cg 2>&1", EPERM_MSG);
}

/* ---- 3. capabilities and seccomp ----------------------------------------------------------- */

static void test_caps_seccomp(void **state)
{
    (void)state;
    /* busybox first, as a user would try it */
    attempt_sh(main_sb, "mount -t tmpfs", "mount -t tmpfs x /mnt 2>&1", EPERM_MSG);
    attempt_sh(main_sb, "unshare -U", "unshare -U true 2>&1", EPERM_MSG);
    attempt_sh(main_sb, "unshare -m", "unshare -m true 2>&1", EPERM_MSG);
    attempt_sh(main_sb, "mknod a block device", "mknod /tmp/sda b 8 0 2>&1", EPERM_MSG);
    attempt_sh(main_sb, "hostname evil", "hostname evil 2>&1", EPERM_MSG);
    attempt_sh(main_sb, "insmod", "echo junk > /tmp/m.ko; insmod /tmp/m.ko 2>&1", EPERM_MSG);
    /* the agent is not dumpable: its /proc/1/ns links cannot be opened */
    attempt_sh(main_sb, "nsenter the agent's namespaces", "nsenter -t 1 -m -u -i -n -p true 2>&1",
               "Permission denied");
    struct run *r = run(main_sb, "hostname");
    char want[80];
    snprintf(want, sizeof want, "%s\n", main_sb->id);
    assert_string_equal(r->out, want);
    /* then the system calls themselves */
    char args[128];
    snprintf(args, sizeof args, "sys %s", top);
    static const char *const whats[] = {
        "mount a tmpfs",
        "umount2 /tmp",
        "pivot_root",
        "new mount API: fsopen(tmpfs)",
        "new mount API: open_tree(/, clone)",
        "unshare(CLONE_NEWUSER)",
        "unshare(CLONE_NEWNS)",
        "clone(CLONE_NEWUSER)",
        "clone(CLONE_NEWNET with high bits set)",
        "clone3(CLONE_NEWUSER)",
        "setns",
        "unshare through the 32-bit entry (int 0x80)",
        "unshare through the x32 entry",
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
        "reboot",
        "swapon",
        "clock_settime",
        "iopl(3)",
        "read the host kernel log (syslog)",
        "ptrace(PTRACE_ATTACH) of the agent",
        "process_vm_readv of the agent",
        "bpf(BPF_PROG_LOAD)",
        "perf_event_open",
        "userfaultfd",
        "keyctl",
        "open_by_handle_at (shocker)",
        "mknod a block device (8:0)",
        "mknod /dev/kmsg (1:11)",
        "raw IP socket",
        "packet socket",
        "sethostname",
        "chroot escape (fchdir out of a chroot, chdir .. x64, chroot .)",
    };
    probe(main_sb, args, whats, NWHATS(whats));
}

/* ---- 4. extent ioctls against a layer file ------------------------------------------------- */

static void test_extent_ioctls(void **state)
{
    (void)state;
    char before[256], after[256];
    assert_int_equal(host(before, sizeof before, LAYER_SUM, state_dir), 0);
    static const char *const whats[] = {
        "FICLONE from a layer file",         "FICLONE with high bits set in the request",
        "FICLONERANGE from a layer file",    "FIDEDUPERANGE onto a layer file",
        "EXT4_IOC_MOVE_EXT on a layer file", "FS_IOC_FIEMAP of a layer file",
    };
    probe(main_sb, "ioctl /bin/busybox", whats, NWHATS(whats));
    assert_int_equal(host(after, sizeof after, LAYER_SUM, state_dir), 0);
    assert_string_equal(before, after);
}

/* ---- 5. no new privileges ------------------------------------------------------------------ */

static void test_no_new_privs(void **state)
{
    (void)state;
    struct run *r = run(main_sb, "cp " PROBE " /tmp/suid && chmod 4755 /tmp/suid && "
                                 "ls -l /tmp/suid | cut -c1-10; grep NoNewPrivs /proc/self/status");
    assert_int_equal(r->rc, 0);
    assert_string_equal(r->out, "-rwsr-xr-x\nNoNewPrivs:\t1\n");
    struct run as;
    run_as(main_sb, "nobody", "grep NoNewPrivs /proc/self/status; /tmp/suid euid", &as);
    assert_int_equal(as.rc, 0);
    /* without no_new_privs the set-uid-root probe would run with euid 0 */
    assert_string_equal(as.out, "NoNewPrivs:\t1\nuid 65534 euid 65534 setuid(0) refused\n");
    printf("escape: gain root through a set-uid-root binary as nobody: blocked (NoNewPrivs: 1; "
           "it ran with euid 65534 and setuid(0) was refused)\n");
    run_as(main_sb, "nobody", "su root -c id 2>&1", &as);
    if (as.rc == 0 && strstr(as.out, "uid=0") != NULL)
        fail_msg("escape: su root as nobody: NOT BLOCKED (%s)", as.out);
    printf("escape: su root as nobody: blocked (exit %d)\n", as.rc);
}

/* ---- 6. the agent channel ------------------------------------------------------------------ */

static void test_agent_channel(void **state)
{
    (void)state;
    char args[PATH_MAX + 16];
    snprintf(args, sizeof args, "agent %s/sb/%s/agent.sock", state_dir, main_sb->id);
    char host_sock[PATH_MAX];
    snprintf(host_sock, sizeof host_sock, "%s/sb/%s/agent.sock", state_dir, main_sb->id);
    struct stat st;
    assert_int_equal(stat(host_sock, &st), 0); /* it is there, on the host */
    assert_true(S_ISSOCK(st.st_mode));
    static const char *const whats[] = {
        "inherit the agent's socket",
        "open the agent's fd 3 through /proc/1/fd",
        "name the agent's fds (readlink /proc/1/fd/3)",
        "write the agent's log through /proc/1/fd/2",
        "open the agent's memory (/proc/1/mem)",
        "take the agent's socket with pidfd_getfd",
        "connect to the agent socket's host path",
        "reach a unix socket listed in /proc/net/unix",
        "reach a socket file in the sandbox's tree",
    };
    probe(main_sb, args, whats, NWHATS(whats));

    /* forged frames on the command's stdout and stderr arrive as its output, nothing more */
    const char *argv[] = {PROBE, "forge"};
    dsec_exec_req req = {.argv = argv, .argc = 2, .timeout_ms = 30000};
    dsec_exec_result res;
    dsec_err err;
    assert_int_equal(dsec_container_ops.exec(ct, main_sb->h, &req, &res, &err), 0);
    assert_int_equal(res.exit_code, 42);
    assert_int_equal(res.stdout_len, 16 * (9 + 33) + 9 + 8);
    assert_int_equal(res.stderr_len, res.stdout_len);
    assert_memory_equal(res.stdout_data, res.stderr_data, res.stdout_len);
    assert_int_equal(res.stdout_data[4], 5); /* the forged EXIT, delivered as bytes */
    dsec_exec_result_release(&res);
    struct run *r = run(main_sb, "echo still served");
    assert_string_equal(r->out, "still served\n");
    printf("escape: forge agent frames on stdout/stderr: blocked (delivered as %zu bytes of "
           "output; the real exit code 42 came through)\n",
           (size_t)(16 * (9 + 33) + 9 + 8));
    /* SIGKILL to the sandbox's init is ignored by the kernel; the agent goes on */
    r = run(main_sb, "kill -KILL 1; kill -STOP 1; sleep 0.2; echo alive");
    assert_string_equal(r->out, "alive\n");
    r = run(main_sb, "echo alive");
    assert_string_equal(r->out, "alive\n");
    printf("escape: SIGKILL/SIGSTOP the agent: blocked (the kernel shields the namespace's init)"
           "\n");
}

/* ---- 7. output caps ------------------------------------------------------------------------ */

struct streamed {
    size_t bytes[3];
    size_t calls;
};

static void on_out(void *arg, int stream, const uint8_t *data, size_t len)
{
    (void)data;
    struct streamed *s = arg;
    s->bytes[stream == 2 ? 2 : 1] += len;
    s->calls++;
}

static void test_output_caps(void **state)
{
    (void)state;
    int apid = agent_pid(main_sb);
    assert_true(apid > 0);
    char log[PATH_MAX];
    snprintf(log, sizeof log, "%s/sb/%s/agent.log", state_dir, main_sb->id);
    long log0 = file_size(log);
    assert_true(log0 >= 0);
    dsec_sandbox_stats st0, st1;
    dsec_err err;
    assert_int_equal(dsec_container_ops.stats(ct, main_sb->h, &st0, &err), 0);

    /* yes for three seconds, at the default cap (1 MiB a stream) */
    const char *argv[] = {"/bin/sh", "-c", "timeout 3 yes; head -c 100000000 /dev/zero >&2"};
    struct streamed sm = {{0}, 0};
    dsec_exec_req req = {
        .argv = argv, .argc = 3, .timeout_ms = 60000, .on_output = on_out, .on_output_arg = &sm};
    dsec_exec_result res;
    uint64_t t0 = now_us();
    assert_int_equal(dsec_container_ops.exec(ct, main_sb->h, &req, &res, &err), 0);
    double secs = (now_us() - t0) / 1e6;
    assert_int_equal(res.exit_code, 0);
    assert_int_equal(res.stdout_len, DSEC_EXEC_OUTPUT_DEFAULT);
    assert_true(res.stdout_truncated);
    assert_int_equal(res.stderr_len, DSEC_EXEC_OUTPUT_DEFAULT);
    assert_true(res.stderr_truncated);
    assert_memory_equal(res.stdout_data, "y\ny\n", 4);
    assert_true(sm.bytes[1] <= DSEC_EXEC_OUTPUT_DEFAULT);
    assert_true(sm.bytes[2] <= DSEC_EXEC_OUTPUT_DEFAULT);
    dsec_exec_result_release(&res);
    long hwm = status_kb(apid, "VmHWM"), rss = status_kb(apid, "VmRSS");
    assert_true(hwm > 0 && hwm < 16 * 1024);
    long log1 = file_size(log);
    assert_int_equal(log1, log0);
    assert_int_equal(dsec_container_ops.stats(ct, main_sb->h, &st1, &err), 0);
    assert_true(st1.disk_bytes < st0.disk_bytes + (1u << 20));
    printf("escape: flood the node with output (yes for 3 s + 100 MB on stderr): blocked (each "
           "stream cut at %u bytes, truncated flags set, %zu bytes streamed in %zu calls, "
           "%.1f s; agent RSS %ld kB, peak %ld kB; agent.log %ld bytes, unchanged; upper layer "
           "%" PRIu64 " -> %" PRIu64 " bytes)\n",
           DSEC_EXEC_OUTPUT_DEFAULT, sm.bytes[1] + sm.bytes[2], sm.calls, secs, rss, hwm, log1,
           st0.disk_bytes, st1.disk_bytes);

    /* a small cap asked for is honoured too */
    const char *argv2[] = {"/bin/sh", "-c", "head -c 5000000 /dev/urandom"};
    dsec_exec_req req2 = {.argv = argv2, .argc = 3, .timeout_ms = 60000, .output_max = 65536};
    assert_int_equal(dsec_container_ops.exec(ct, main_sb->h, &req2, &res, &err), 0);
    assert_int_equal(res.stdout_len, 65536);
    assert_true(res.stdout_truncated);
    assert_false(res.stderr_truncated);
    dsec_exec_result_release(&res);
    struct run *r = run(main_sb, "echo alive");
    assert_string_equal(r->out, "alive\n");
}

/* ---- 8. logs outside the sandbox's write scope --------------------------------------------- */

static void test_logs(void **state)
{
    (void)state;
    char log[256], line[1024];
    snprintf(log, sizeof log, "%s/sb/%s/agent.log", state_dir, main_sb->id);
    long log0 = file_size(log);
    assert_true(log0 >= 0);
    /* the bundle (agent.log, agent.sock, config.json), the runtime's state and the state dir
     * are not in the sandbox's tree at all */
    snprintf(line, sizeof line,
             "find / -xdev \\( -name agent.log -o -name runtime.log -o -name agent.sock -o -name "
             "config.json -o -name 'esctest-*' \\) 2>/dev/null; [ -e %s ] && echo %s; "
             "[ -e %s ] && echo %s; true",
             state_dir, state_dir, log, log);
    struct run *r = run(main_sb, line);
    assert_int_equal(r->rc, 0);
    assert_string_equal(r->out, "");
    printf("escape: find the agent's and the runtime's logs: blocked (no agent.log, runtime.log, "
           "bundle or state dir in the sandbox's tree; they live in %s/sb/<id> on the node)\n",
           state_dir);
    /* the one path to agent.log is the agent's fd 1/2: not openable (probe: test_agent_channel);
     * and through the shell */
    attempt_sh(main_sb, "append to the agent's log through /proc/1/fd/1",
               "echo forged >> /proc/1/fd/1 2>&1", "Permission denied");
    /* the kernel log: no /dev/kmsg, no /dev/log, no syslog(2) read */
    r = run(main_sb, "ls /dev; [ -e /dev/kmsg ] && echo kmsg; [ -e /dev/log ] && echo log; true");
    assert_null(strstr(r->out, "kmsg"));
    assert_null(strstr(r->out, "log\n"));
    attempt_sh(main_sb, "read the host kernel log (dmesg)", "dmesg 2>&1 | head -3; exit 1",
               EPERM_MSG);
    printf("escape: write the host kernel log: blocked (no /dev/kmsg or /dev/log in /dev; mknod "
           "refused)\n");
    assert_int_equal(file_size(log), log0);
}

/* ---- 9. grepping /proc --------------------------------------------------------------------- */

/* Whether the host's kernel logged, since mark, an oops, a BUG, a WARNING, a lockup or a hung
 * task in a process named comm (an OOM kill inside the sandbox's cgroup is the limit working,
 * not a complaint). */
static int kernel_complaints(const char *mark, const char *comm)
{
    char out[4096];
    host(out, sizeof out,
         "dmesg | sed -n '/%s/,$p' | grep -A3 -E 'BUG:|Oops|WARNING:|general protection|"
         "soft lockup|hard LOCKUP|blocked for more than|Kernel panic' | grep 'Comm: %s ' | head -3",
         mark, comm);
    if (out[0] != '\0')
        printf("kernel complaints since the mark:\n%s", out);
    return out[0] != '\0';
}

static int field(const char *out, const char *key)
{
    const char *p = strstr(out, key);
    return p != NULL ? atoi(p + strlen(key)) : -1;
}

static void test_grep_proc(void **state)
{
    (void)state;
    char mark[64];
    snprintf(mark, sizeof mark, "dsec-esctest-grep-%d", (int)getpid());
    host(NULL, 0, "echo %s > /dev/kmsg", mark);
    /* the literal attempt; then every regular file of /proc read (1 MiB each at most, which
     * reaches pagemap, kpage* and the rest); then pagemap whole, a line with no end */
    uint64_t t0 = now_us();
    struct run *r = run(main_sb, "timeout 15 grep -r x /proc >/dev/null 2>&1; echo grep=$?; "
                                 "find /proc -type f 2>/dev/null | wc -l; "
                                 "timeout 30 sh -c 'find /proc -type f 2>/dev/null | "
                                 "xargs -n 64 head -q -c 1048576 2>/dev/null | wc -c'; "
                                 "echo every=$?; "
                                 "timeout 20 grep -c x /proc/self/pagemap >/dev/null 2>&1; "
                                 "echo pagemap=$?");
    double secs = (now_us() - t0) / 1e6;
    assert_int_equal(r->rc, 0);
    int grep = field(r->out, "grep="), every = field(r->out, "every="),
        pagemap = field(r->out, "pagemap=");
    long nfiles = strtol(strchr(r->out, '\n') + 1, NULL, 10);
    long bytes = strtol(strchr(strchr(r->out, '\n') + 1, '\n') + 1, NULL, 10);
    printf("inside the sandbox: grep -r x /proc: status %d; read %ld files of /proc, %ld bytes: "
           "status %d; grep x /proc/self/pagemap: status %d; %.1f s in all\n",
           grep, nfiles, bytes, every, pagemap, secs);
    /* each finished within its bound (timeout's SIGTERM is 143; the sandbox's memory limit
     * ends a grep that buffers pagemap as one endless line) */
    assert_true(grep >= 0 && every == 0 && pagemap >= 0);
    assert_true(nfiles > 100 && bytes > 0);
    assert_true(secs < 70);
    assert_int_equal(kernel_complaints(mark, "grep"), 0);
    assert_int_equal(kernel_complaints(mark, "head"), 0);
    r = run(main_sb, "echo alive");
    assert_string_equal(r->out, "alive\n");
    printf("escape: grep -r /proc (the crashed-kernel item): blocked (bounded: grep -r %s; every "
           "regular file of /proc read in full or to 1 MiB; grep of pagemap %s; no kernel warning, "
           "the sandbox and the node go on)\n",
           grep == 143 ? "stopped by its 15 s timeout (busybox grep follows /proc/N/fd links into "
                         "pipes and waits)"
                       : "finished",
           pagemap == 137 || pagemap == 9 ? "killed by the sandbox's memory limit" : "finished");
}

int main(void)
{
    if (geteuid() != 0 || access("/bin/busybox", X_OK) != 0 || access("/usr/bin/crun", X_OK) != 0) {
        fprintf(stderr, "test_escape: needs root, busybox-static and crun; skipping\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_overwrite), cmocka_unit_test(test_proc_sys),
        cmocka_unit_test(test_caps_seccomp),    cmocka_unit_test(test_extent_ioctls),
        cmocka_unit_test(test_no_new_privs),    cmocka_unit_test(test_agent_channel),
        cmocka_unit_test(test_output_caps),     cmocka_unit_test(test_logs),
        cmocka_unit_test(test_grep_proc),
    };
    if (getenv("ESCAPE_ONLY") != NULL) /* one test by name, while working on it */
        cmocka_set_test_filter(getenv("ESCAPE_ONLY"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
#endif
