/* function-zygote.c - the zygote of the function backend: a read-only sandbox root, a warm runtime,
 * and sandboxed workers forked from it ahead of each call. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/function/function-zygote.h"

/*
 * One zygote per runtime, started by the backend's pool thread with its
 * control socket as fd 3: for python3, /usr/bin/python3 itself with this
 * code loaded as the module _dsec_fnz (function-python.c; the system
 * interpreter is built with PGO and runs code ~1.8x faster here than
 * libpython3.11.so would in a program of ours); for sh and native
 * programs, the small program dsec-fn-zygote (main() below).
 *
 * Start-up (once): a private mount namespace whose root is a small read-only
 * tmpfs holding read-only binds of /usr and /etc (plus the bin/lib symlinks
 * of a merged-/usr host, or binds of them otherwise, and any extra read-only
 * paths), a /dev with null/zero/full/random/urandom, and empty /proc, /tmp,
 * /work mount points. pivot_root into it; the host's other files are never
 * visible to a worker. The zygote of an environment (--lower) instead
 * mounts a read-only overlay of the environment's layers, topped by a small
 * layer holding those mount points, and pivots into that: none of the
 * host's files are there. A python3 zygote then imports the common modules;
 * the zygote builds the seccomp filters, installs the base one on itself
 * (every worker inherits it), says HELLO, and waits for SPAWN.
 *
 * Per worker, ahead of any call (the pool keeps some ready):
 *
 *   W1 = clone(CLONE_VM) of the zygote. Sharing the zygote's memory makes it
 *        cost no page-table copy (~40 us). It joins the slot's cgroups,
 *        unshares mount, ipc, uts, net, pid and cgroup namespaces (~0.5 ms,
 *        mostly the network namespace, now off the zygote's thread), clones
 *        W2 and exits. A worker made for one call of a sandbox with a
 *        network (FNP_SPAWN_NET) joins that sandbox's network namespace
 *        instead (setns) and unshares the rest.
 *   W2 = clone(CLONE_VM | CLONE_PARENT) of W1: pid 1 of the new pid
 *        namespace, a child of the zygote, still sharing its memory. It
 *        mounts /proc, a /tmp and a /work tmpfs (and, in a sandbox's network,
 *        a resolv.conf naming its resolver over /etc/resolv.conf), brings lo
 *        up, forks W3 -
 *        the one real copy-on-write fork per call - and supervises: when W3
 *        has exited it sends RESULT and exits, and as pid 1 its exit kills
 *        whatever the call left behind. It also exits (killing the call) if
 *        the backend's end of the task socket closes.
 *   W3 = fork() of W2: pid 2, a copy-on-write image of the zygote. It moves
 *        its stdio onto the call's pipes, drops to the slot's private uid,
 *        adds its own small seccomp filter, says READY (handing the backend
 *        a pidfd of W2) and blocks, warming its runtime further if the pool
 *        asks (PREP). When its task comes it copies the dependency files into
 *        /work, applies the call's rlimits, changes directory, closes the
 *        task socket (the call's code must hold no channel to the backend)
 *        and runs: exec for programs, or the already-initialised
 *        interpreter for python3. W2 alone reports how the call ended.
 *
 * What makes the shared memory safe: once it says HELLO, the zygote's loop
 * and W1/W2 never use the heap allocator, stdio or Python. W3 copies the
 * zygote's memory at whatever moment W2 forks, so only their stacks and the
 * worker table change meanwhile; the interpreter and libc state W3 relies on
 * are frozen. (Python's own fork hooks run in W3; the zygote never calls
 * PyOS_BeforeFork, which would take the import lock in the shared image.)
 */

/* One mapping per worker: [guard][W1 stack][W2 stack], stacks growing down.
 * W3 runs the call, python included, on its copy of the W2 stack; a deep
 * overflow runs through the (by then unused) W1 stack into the guard. The
 * mapping is MADV_DONTFORK, so the fork of a W3 does not copy the stacks of
 * every other live worker (hundreds of VMAs with a big pool); each W2 lifts
 * that for its own mapping just around its fork. */
#define W1_STACK (64u * 1024u)
#define W2_STACK (8u * 1024u * 1024u)
#define GUARD 4096u
#define MAP_LEN (GUARD + W1_STACK + W2_STACK)

struct wrec {
    bool used;
    bool w1_done, w2_done;
    pid_t w1;
    pid_t w2;  /* written by W1 (shared memory) before it exits */
    char *map; /* [guard][W1 stack][W2 stack] */
    int fd_task, fd_in, fd_out, fd_err;
    int fd_cg[3];
    int ncg;
    int fd_net; /* the sandbox's network namespace (FNP_SPAWN_NET), or -1 */
    uint32_t uid, tmp_mb, slot;
    char resolver[FNP_RESOLVER_MAX]; /* with fd_net: the nameserver calls are given */
};

static const struct fnz_runtime *runtime; /* NULL: exec */
static int prep_level;                    /* how warm this W3's runtime is (PREP) */
static const char *root_dir;
static struct sock_fprog seccomp_base, seccomp_tail;
static struct wrec *recs;
static unsigned nrecs;
/* Supervisors reaped before their W1 published their pid (a tiny window). */
static pid_t early_w2[64];
static unsigned nearly;

static ssize_t send_fds(int fd, const void *msg, size_t len, const int *fds, int nfds)
{
    struct iovec iov = {.iov_base = (void *)msg, .iov_len = len};
    return fnp_send_fds(fd, &iov, 1, fds, nfds);
}

static void hdr_init(struct fnp_hdr *h, uint32_t type, size_t len, uint32_t seq)
{
    h->magic = FNP_MAGIC;
    h->type = type;
    h->len = (uint32_t)len;
    h->seq = seq;
}

/* Report a failure on fd. Safe in W1/W2: vsnprintf into a stack buffer. */
static void send_failure(int fd, uint32_t type, uint32_t seq, const char *stage, int err,
                         const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static void send_failure(int fd, uint32_t type, uint32_t seq, const char *stage, int err,
                         const char *fmt, ...)
{
    struct fnp_failure f;
    memset(&f, 0, sizeof f);
    hdr_init(&f.h, type, sizeof f, seq);
    f.err = err;
    snprintf(f.stage, sizeof f.stage, "%s", stage);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f.msg, sizeof f.msg, fmt, ap);
    va_end(ap);
    send_fds(fd, &f, sizeof f, NULL, 0);
}

/* Start-up failure: tell the backend why, then exit. */
static void fatal(const char *stage, int err, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

static void fatal(const char *stage, int err, const char *fmt, ...)
{
    char msg[FNP_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    send_failure(FNP_ZYGOTE_CTL_FD, FNP_FATAL, 0, stage, err, "%s", msg);
    _exit(1);
}

/* Close every fd >= 3 that is not in keep (n <= 8). */
static void close_others(const int *keep, int n)
{
    int k[8];
    int m = 0;
    for (int i = 0; i < n && m < 8; i++)
        if (keep[i] >= 3)
            k[m++] = keep[i];
    for (int i = 1; i < m; i++) /* insertion sort */
        for (int j = i; j > 0 && k[j - 1] > k[j]; j--) {
            int t = k[j];
            k[j] = k[j - 1];
            k[j - 1] = t;
        }
    unsigned lo = 3;
    for (int i = 0; i < m; i++) {
        if ((unsigned)k[i] > lo)
            close_range(lo, (unsigned)k[i] - 1, 0);
        lo = (unsigned)k[i] + 1;
    }
    close_range(lo, ~0u, 0);
}

/* ---- the sandbox root (start-up, in the zygote) ----------------------------------- */

static void path_in_root(char *out, size_t len, const char *p)
{
    int n = snprintf(out, len, "%s%s", root_dir, p);
    if (n < 0 || (size_t)n >= len)
        fatal("sandbox root", ENAMETOOLONG, "%s%s: path too long", root_dir, p);
}

/* mkdir -p of an absolute path below the new root. */
static void mkdirs_in_root(const char *abs)
{
    char p[PATH_MAX];
    path_in_root(p, sizeof p, abs);
    for (char *s = p + strlen(root_dir) + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            mkdir(p, 0755);
            *s = '/';
        }
    mkdir(p, 0755);
}

/* Bind src read-only (nosuid, nodev) at the same path below the new root. */
static void bind_ro(const char *src)
{
    char dst[PATH_MAX];
    struct stat st;
    if (stat(src, &st) < 0)
        fatal("read-only bind", errno, "stat %s: %s", src, strerror(errno));
    path_in_root(dst, sizeof dst, src);
    if (S_ISDIR(st.st_mode)) {
        mkdirs_in_root(src);
    } else {
        char parent[PATH_MAX];
        snprintf(parent, sizeof parent, "%s", src);
        char *slash = strrchr(parent, '/');
        if (slash != NULL && slash != parent) {
            *slash = '\0';
            mkdirs_in_root(parent);
        }
        int fd = open(dst, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
        if (fd >= 0)
            close(fd);
    }
    if (mount(src, dst, NULL, MS_BIND | MS_REC, NULL) < 0)
        fatal("read-only bind", errno, "bind %s: %s", src, strerror(errno));
    if (mount(NULL, dst, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
        fatal("read-only bind", errno, "remount %s read-only: %s", src, strerror(errno));
}

/* The root of an environment: its layers (lower, top first, colon-joined)
 * under one more, topmost layer holding the mount points a worker needs, as
 * a read-only overlay at <root>/r. root_dir becomes <root>/r. */
static void env_root(const char *lower)
{
    static char merged[PATH_MAX];
    char skel[PATH_MAX], d[PATH_MAX], opts[4096];
    snprintf(skel, sizeof skel, "%s/s", root_dir);
    snprintf(merged, sizeof merged, "%s/r", root_dir);
    static const char *const dirs[] = {"", "/dev", "/proc", "/tmp", "/work"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        snprintf(d, sizeof d, "%s%s", skel, dirs[i]);
        if (mkdir(d, 0755) < 0)
            fatal("sandbox root", errno, "mkdir %s: %s", d, strerror(errno));
    }
    if (mkdir(merged, 0755) < 0)
        fatal("sandbox root", errno, "mkdir %s: %s", merged, strerror(errno));
    int n = snprintf(opts, sizeof opts, "lowerdir=%s:%s", skel, lower);
    if (n < 0 || (size_t)n >= sizeof opts)
        fatal("environment root", E2BIG,
              "the environment's layer paths take %d bytes; an overlay takes at most %zu", n,
              sizeof opts - 1);
    if (mount("overlay", merged, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, opts) < 0)
        fatal("environment root", errno, "overlay of the environment's layers: %s",
              strerror(errno));
    /* A call of a sandbox with a network binds its resolver over
     * /etc/resolv.conf, which must exist in this read-only root: an
     * environment without one (or with a dangling link) gets an empty file
     * from the top layer. Not when its /etc is itself a link, which a
     * directory here would hide. */
    char rc[PATH_MAX + 32], etc[PATH_MAX + 32], sk[PATH_MAX + 32];
    struct stat st;
    snprintf(rc, sizeof rc, "%s/etc/resolv.conf", merged);
    snprintf(etc, sizeof etc, "%s/etc", merged);
    if (stat(rc, &st) < 0 && errno == ENOENT &&
        (lstat(etc, &st) < 0 ? errno == ENOENT : S_ISDIR(st.st_mode))) {
        if (umount2(merged, 0) < 0)
            fatal("environment root", errno, "unmounting the overlay: %s", strerror(errno));
        snprintf(sk, sizeof sk, "%s/etc", skel);
        if (mkdir(sk, 0755) < 0)
            fatal("sandbox root", errno, "mkdir %s: %s", sk, strerror(errno));
        snprintf(sk, sizeof sk, "%s/etc/resolv.conf", skel);
        int fd = open(sk, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0)
            fatal("sandbox root", errno, "creating %s: %s", sk, strerror(errno));
        close(fd);
        if (mount("overlay", merged, "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, opts) < 0)
            fatal("environment root", errno, "overlay of the environment's layers: %s",
                  strerror(errno));
    }
    root_dir = merged;
}

static void setup_root(char *const *ro, int nro, const char *lower)
{
    char p[PATH_MAX];
    if (unshare(CLONE_NEWNS) < 0)
        fatal("mount namespace", errno, "unshare(CLONE_NEWNS): %s (function sandboxes need root)",
              strerror(errno));
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        fatal("mount namespace", errno, "making / private: %s", strerror(errno));
    if (mount("tmpfs", root_dir, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755") < 0)
        fatal("sandbox root", errno, "tmpfs on %s: %s", root_dir, strerror(errno));
    if (lower != NULL) {
        env_root(lower);
        goto dev;
    }
    static const char *const dirs[] = {"/usr", "/etc", "/dev", "/proc", "/tmp", "/work"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
        mkdirs_in_root(dirs[i]);
    /* Merged-/usr hosts have symlinks here; older ones have directories. */
    static const char *const tops[] = {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"};
    for (size_t i = 0; i < sizeof tops / sizeof tops[0]; i++) {
        struct stat st;
        if (lstat(tops[i], &st) < 0)
            continue;
        if (S_ISLNK(st.st_mode)) {
            char target[PATH_MAX];
            ssize_t n = readlink(tops[i], target, sizeof target - 1);
            if (n <= 0)
                continue;
            target[n] = '\0';
            path_in_root(p, sizeof p, tops[i]);
            if (symlink(target, p) < 0)
                fatal("sandbox root", errno, "symlink %s: %s", tops[i], strerror(errno));
        } else if (S_ISDIR(st.st_mode)) {
            bind_ro(tops[i]);
        }
    }
    bind_ro("/usr");
    bind_ro("/etc");
    for (int i = 0; i < nro; i++)
        bind_ro(ro[i]);

dev:
    path_in_root(p, sizeof p, "/dev");
    if (mount("tmpfs", p, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755") < 0)
        fatal("sandbox /dev", errno, "tmpfs on /dev: %s", strerror(errno));
    static const struct {
        const char *name;
        unsigned major, minor;
    } nodes[] = {
        {"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}};
    mode_t old = umask(0);
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
        char d[PATH_MAX];
        snprintf(d, sizeof d, "%s/dev/%s", root_dir, nodes[i].name);
        if (mknod(d, S_IFCHR | 0666, makedev(nodes[i].major, nodes[i].minor)) < 0)
            fatal("sandbox /dev", errno, "mknod %s: %s", d, strerror(errno));
    }
    umask(old);
    static const struct {
        const char *name, *target;
    } links[] = {{"fd", "/proc/self/fd"},
                 {"stdin", "/proc/self/fd/0"},
                 {"stdout", "/proc/self/fd/1"},
                 {"stderr", "/proc/self/fd/2"},
                 {"shm", "/tmp"}};
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        char d[PATH_MAX];
        snprintf(d, sizeof d, "%s/dev/%s", root_dir, links[i].name);
        if (symlink(links[i].target, d) < 0)
            fatal("sandbox /dev", errno, "symlink %s: %s", d, strerror(errno));
    }
    if (mount(NULL, p, NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755") <
        0)
        fatal("sandbox /dev", errno, "remounting /dev read-only: %s", strerror(errno));

    if (chdir(root_dir) < 0 || syscall(SYS_pivot_root, ".", ".") < 0)
        fatal("pivot_root", errno, "pivot_root into %s: %s", root_dir, strerror(errno));
    if (umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
        fatal("pivot_root", errno, "detaching the host root: %s", strerror(errno));
    if (mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
        fatal("sandbox root", errno, "remounting / read-only: %s", strerror(errno));
}

/* ---- W3: the call --------------------------------------------------------------------- */

static void w3_fail(const char *stage, int err, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

static void w3_fail(const char *stage, int err, const char *fmt, ...)
{
    char msg[FNP_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    send_failure(3, FNP_WORKER_FAILED, 0, stage, err, "%s", msg);
    _exit(1);
}

static bool rel_path_ok(const char *p, size_t n)
{
    if (n == 0 || p[0] == '/')
        return false;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && p[i] == '\0')
            return false;
        if (i == n || p[i] == '/') {
            size_t len = i - start;
            if (len == 0 || (len == 1 && p[start] == '.') ||
                (len == 2 && p[start] == '.' && p[start + 1] == '.'))
                return false;
            start = i + 1;
        }
    }
    return true;
}

static bool write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Copy the sandbox's files into this call's /work. */
static void unpack_bundle(int bfd, uint64_t len)
{
    if (len < 4 || len > (1ull << 40))
        w3_fail("dependency files", 0, "bundle of %llu bytes is malformed",
                (unsigned long long)len);
    const uint8_t *b = mmap(NULL, (size_t)len, PROT_READ, MAP_PRIVATE, bfd, 0);
    if (b == MAP_FAILED)
        w3_fail("dependency files", errno, "mapping the bundle: %s", strerror(errno));
    if (memcmp(b, FNP_BUNDLE_MAGIC, 4) != 0)
        w3_fail("dependency files", 0, "bundle has a bad magic");
    int wfd = open("/work", O_DIRECTORY | O_RDONLY | O_CLOEXEC);
    if (wfd < 0)
        w3_fail("dependency files", errno, "opening /work: %s", strerror(errno));
    uint64_t off = 4;
    char path[PATH_MAX];
    while (off < len) {
        struct fnp_bundle_rec r;
        if (len - off < sizeof r)
            w3_fail("dependency files", 0, "bundle truncated at %llu", (unsigned long long)off);
        memcpy(&r, b + off, sizeof r);
        off += sizeof r;
        if (r.path_len == 0 || r.path_len >= sizeof path || len - off < r.path_len)
            w3_fail("dependency files", 0, "bundle path at %llu is malformed",
                    (unsigned long long)off);
        memcpy(path, b + off, r.path_len);
        path[r.path_len] = '\0';
        off += r.path_len;
        if (!rel_path_ok(path, r.path_len))
            w3_fail("dependency files", 0, "bundle path \"%s\" is not a normal relative path",
                    path);
        if (r.kind == FNP_BUNDLE_DIR) {
            if (mkdirat(wfd, path, (r.mode & 0777) | 0700) < 0 && errno != EEXIST)
                w3_fail("dependency files", errno, "mkdir /work/%s: %s", path, strerror(errno));
        } else if (r.kind == FNP_BUNDLE_FILE) {
            if (len - off < r.size)
                w3_fail("dependency files", 0, "bundle data of %s truncated", path);
            int fd = openat(wfd, path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                            r.mode & 0777);
            if (fd < 0)
                w3_fail("dependency files", errno, "creating /work/%s: %s", path, strerror(errno));
            if (!write_all(fd, b + off, (size_t)r.size))
                w3_fail("dependency files", errno,
                        "writing /work/%s: %s (is the sandbox's tmpfs_mb large enough?)", path,
                        strerror(errno));
            close(fd);
            off += r.size;
        } else {
            w3_fail("dependency files", 0, "bundle record of kind %u", r.kind);
        }
    }
    close(wfd);
    munmap((void *)b, (size_t)len);
}

static void set_limit(int res, const char *name, uint64_t soft, uint64_t hard)
{
    struct rlimit rl = {.rlim_cur = soft, .rlim_max = hard};
    if (setrlimit(res, &rl) < 0)
        w3_fail("limits", errno, "setrlimit(%s, %llu): %s", name, (unsigned long long)soft,
                strerror(errno));
}

/* The common task is small: it is received here (untouched until then, so
 * an idle worker does not pay for it); larger tasks get a buffer of their own. */
static uint8_t task_buf[8192] __attribute__((aligned(64)));

/* Receive and decode the task. Returns with t filled, or exits. */
static void recv_task(struct fnz_task *t, int *bundle_fd)
{
    uint8_t *buf = task_buf;
    size_t cap = sizeof task_buf;
    ssize_t want;
    do
        want = recv(3, task_buf, 1, MSG_PEEK | MSG_TRUNC);
    while (want < 0 && errno == EINTR);
    if (want == 0)
        _exit(0); /* the backend let this worker go (pool shrinking or shutting down) */
    if (want > (ssize_t)cap) {
        cap = (size_t)want;
        if ((buf = malloc(cap)) == NULL)
            w3_fail("task", ENOMEM, "out of memory");
    }
    int fds[2], nfds;
    ssize_t n = fnp_recv_fds(3, buf, cap, 0, fds, 2, &nfds);
    if (n == 0)
        _exit(0); /* the backend let this worker go (pool shrinking or shutting down) */
    if (n < 0)
        w3_fail("task", errno, "receiving the task: %s", strerror(errno));
    if (nfds > 2)
        w3_fail("task", 0, "task carries %d fds", nfds);
    struct fnp_task *h = (struct fnp_task *)buf;
    if ((size_t)n < sizeof *h || h->h.magic != FNP_MAGIC || h->h.type != FNP_TASK ||
        h->h.len != (uint32_t)n)
        w3_fail("task", 0, "malformed task message");
    const char *s;
    int nwant =
        ((h->flags & FNP_TASK_PAYLOAD_FD) ? 1 : 0) + ((h->flags & FNP_TASK_BUNDLE_FD) ? 1 : 0);
    if (nfds != nwant)
        w3_fail("task", 0, "task carries %d fds, expected %d", nfds, nwant);
    if (h->flags & FNP_TASK_PAYLOAD_FD) {
        if (h->strings_len == 0 || h->strings_len > (1ull << 32))
            w3_fail("task", 0, "task payload of %llu bytes", (unsigned long long)h->strings_len);
        s = mmap(NULL, (size_t)h->strings_len, PROT_READ, MAP_PRIVATE, fds[0], 0);
        if (s == MAP_FAILED)
            w3_fail("task", errno, "mapping the task payload: %s", strerror(errno));
        close(fds[0]);
    } else {
        if (h->strings_len != (uint64_t)n - sizeof *h)
            w3_fail("task", 0, "task strings length mismatch");
        s = (const char *)(buf + sizeof *h);
    }
    *bundle_fd = (h->flags & FNP_TASK_BUNDLE_FD) ? fds[nwant - 1] : -1;
    /* target, call_func, cwd, argv..., env...: exactly this many NUL-ended strings */
    uint64_t need = 3ull + h->argc + h->envc;
    if (h->argc == 0 || h->argc > 65536 || h->envc > 65536)
        w3_fail("task", 0, "task with %u arguments and %u environment entries", h->argc, h->envc);
    const char **v = malloc(sizeof(char *) * (size_t)(need + 2));
    if (v == NULL)
        w3_fail("task", ENOMEM, "out of memory");
    uint64_t k = 0, start = 0;
    for (uint64_t i = 0; i < h->strings_len && k < need; i++)
        if (s[i] == '\0') {
            v[k++] = s + start;
            start = i + 1;
        }
    if (k != need || start != h->strings_len)
        w3_fail("task", 0, "task strings are malformed");
    t->hdr = h;
    t->target = v[0];
    t->call_func = v[1];
    t->cwd = v[2];
    /* argv and env become NULL-terminated arrays of their own */
    char **argv = malloc(sizeof(char *) * (h->argc + 1u));
    char **env = malloc(sizeof(char *) * (h->envc + 1u));
    if (argv == NULL || env == NULL)
        w3_fail("task", ENOMEM, "out of memory");
    for (uint32_t i = 0; i < h->argc; i++)
        argv[i] = (char *)v[3 + i];
    argv[h->argc] = NULL;
    for (uint32_t i = 0; i < h->envc; i++)
        env[i] = (char *)v[3 + h->argc + i];
    env[h->envc] = NULL;
    t->argv = argv;
    t->env = env;
    free(v);
}

static void w3_main(struct wrec *r) __attribute__((noreturn));

static void w3_main(struct wrec *r)
{
    /* W2 is our parent and pid 1: if it goes, so do we. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != 1)
        _exit(1);
    if (dup2(r->fd_in, 0) < 0 || dup2(r->fd_out, 1) < 0 || dup2(r->fd_err, 2) < 0 ||
        dup2(r->fd_task, 3) < 0)
        _exit(1);
    close_range(4, ~0u, 0);
    fcntl(3, F_SETFD, FD_CLOEXEC);
    /* The call is what the OOM killer should take, never its supervisor. */
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "1000", 4) != 4)
        w3_fail("oom_score_adj", errno, "setting oom_score_adj: %s", strerror(errno));
    close(fd);
    umask(022);
    set_limit(RLIMIT_CORE, "RLIMIT_CORE", 0, 0);
    gid_t g = r->uid;
    if (setgroups(1, &g) < 0 || setresgid(r->uid, r->uid, r->uid) < 0 ||
        setresuid(r->uid, r->uid, r->uid) < 0)
        w3_fail("privileges", errno, "dropping to uid %u: %s", r->uid, strerror(errno));
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        w3_fail("privileges", errno, "no_new_privs: %s", strerror(errno));
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &seccomp_tail) < 0)
        w3_fail("seccomp", errno, "installing the seccomp filter: %s", strerror(errno));
    /* READY, then warm up as often as the pool asks (PREP), until the task.
     * The first READY carries a pidfd of W2 (pid 1 here): the backend kills
     * the call and learns of its end through it. */
    int w2fd = (int)syscall(SYS_pidfd_open, 1, 0);
    if (w2fd < 0)
        w3_fail("pidfd", errno, "pidfd_open of the supervisor: %s", strerror(errno));
    for (;;) {
        struct fnp_ready rd;
        memset(&rd, 0, sizeof rd);
        hdr_init(&rd.h, FNP_READY, sizeof rd, 0);
        rd.level = (uint32_t)prep_level;
        if (send_fds(3, &rd, sizeof rd, &w2fd, w2fd >= 0 ? 1 : 0) < 0)
            _exit(0);
        if (w2fd >= 0)
            close(w2fd);
        w2fd = -1;
        struct fnp_prep pr;
        ssize_t n;
        do
            n = recv(3, &pr, sizeof pr, MSG_PEEK);
        while (n < 0 && errno == EINTR);
        if (n <= 0)
            _exit(0); /* the backend let this worker go */
        if ((size_t)n < sizeof pr.h || pr.h.type != FNP_PREP)
            break; /* the task */
        if (recv(3, &pr, sizeof pr, 0) != (ssize_t)sizeof pr || pr.h.magic != FNP_MAGIC ||
            pr.h.len != sizeof pr || pr.level > 2)
            w3_fail("prepare", 0, "malformed PREP");
        if (runtime != NULL && (int)pr.level > prep_level) {
            runtime->prepare(prep_level, (int)pr.level);
            prep_level = (int)pr.level;
        }
    }

    /* ---- everything above happened ahead of the call; the call starts here ---- */
    struct fnz_task t;
    int bfd = -1;
    recv_task(&t, &bfd);
    if (bfd >= 0) {
        unpack_bundle(bfd, t.hdr->bundle_len);
        close(bfd);
    }
    const struct fnp_task *h = t.hdr;
    if (h->nofile)
        set_limit(RLIMIT_NOFILE, "RLIMIT_NOFILE", h->nofile, h->nofile);
    if (h->fsize_bytes)
        set_limit(RLIMIT_FSIZE, "RLIMIT_FSIZE", h->fsize_bytes, h->fsize_bytes);
    if (h->as_bytes)
        set_limit(RLIMIT_AS, "RLIMIT_AS", h->as_bytes, h->as_bytes);
    if (h->nproc)
        set_limit(RLIMIT_NPROC, "RLIMIT_NPROC", h->nproc, h->nproc);
    if (h->cpu_s) /* SIGXCPU at the soft limit, SIGKILL a second later */
        set_limit(RLIMIT_CPU, "RLIMIT_CPU", h->cpu_s, h->cpu_s + 1);
    if (chdir(t.cwd) < 0)
        w3_fail("cwd", errno, "cannot change directory to %s: %s", t.cwd, strerror(errno));
    sigset_t none;
    sigemptyset(&none);

    if (h->mode == FNP_MODE_EXEC) {
        /* exec keeps ignored signals ignored: give the program defaults. */
        struct sigaction sa = {.sa_handler = SIG_DFL};
        for (int sig = 1; sig < NSIG; sig++)
            if (sig != SIGKILL && sig != SIGSTOP)
                sigaction(sig, &sa, NULL);
        close(3);
        sigprocmask(SIG_SETMASK, &none, NULL);
        extern char **environ;
        environ = t.env; /* execvpe searches the PATH of the caller's environment */
        execvpe(t.argv[0], t.argv, t.env);
        int e = errno;
        dprintf(2, "dsec: %s: %s\n", t.argv[0], strerror(e));
        _exit(e == ENOENT ? 127 : 126);
    }
    if (runtime == NULL)
        w3_fail("task", 0, "python task sent to an exec zygote");
    extern char **environ;
    environ = t.env; /* os.environ is rebuilt from the same strings */
    /* The call's code runs in this process from here on, and could write
     * anything to any fd it holds: it gets none but its stdio. Its answer
     * comes from the supervisor (wait4), never from this process. */
    close(3);
    sigprocmask(SIG_SETMASK, &none, NULL);
    _exit(runtime->run(&t, prep_level));
}

/* ---- W2: the supervisor (pid 1 of the call) ----------------------------------------- */

static int w2_fail(struct wrec *r, const char *stage, int err, const char *what)
{
    send_failure(r->fd_task, FNP_WORKER_FAILED, 0, stage, err, "%s: %s", what, strerror(err));
    return 1;
}

static int lo_up(void)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, "lo", 3);
    int rc = ioctl(s, SIOCGIFFLAGS, &ifr);
    if (rc == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        rc = ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    int e = errno;
    close(s);
    errno = e;
    return rc;
}

/* A call in a sandbox's network namespace gets that sandbox's resolver: a
 * resolv.conf naming it, bound read-only over /etc/resolv.conf in this call's
 * mount namespace only. The file is made in the call's fresh /tmp and
 * unlinked once bound (the bind holds it), so the call sees no trace of it
 * there. The root is read-only, so /etc/resolv.conf must exist in it (the
 * host's has one; env_root gives an environment without one an empty file). */
static int resolv_conf(struct wrec *r) /* 0, or W2's exit code after reporting */
{
    static const char tmp[] = "/tmp/.dsec-resolv.conf";
    char line[FNP_RESOLVER_MAX + 32];
    int n = snprintf(line, sizeof line, "nameserver %s\n", r->resolver);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return w2_fail(r, "resolv.conf", errno, "creating the call's resolv.conf");
    bool ok = n > 0 && write(fd, line, (size_t)n) == n;
    int e = errno;
    close(fd);
    if (!ok)
        return w2_fail(r, "resolv.conf", e, "writing the call's resolv.conf");
    if (mount(tmp, "/etc/resolv.conf", NULL, MS_BIND, NULL) < 0) {
        e = errno;
        unlink(tmp);
        if (e == ENOENT) {
            send_failure(r->fd_task, FNP_WORKER_FAILED, 0, "resolv.conf", e,
                         "the sandbox's root has no /etc/resolv.conf to bind the sandbox's "
                         "resolver over (its /etc is a link the zygote could not add one to); a "
                         "networked function sandbox needs an environment with an /etc");
            return 1;
        }
        return w2_fail(r, "resolv.conf", e, "binding the resolver over /etc/resolv.conf");
    }
    if (mount(NULL, "/etc/resolv.conf", NULL,
              MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        return w2_fail(r, "resolv.conf", errno, "making /etc/resolv.conf read-only");
    unlink(tmp);
    return 0;
}

static int w2_main(void *arg)
{
    struct wrec *r = arg;
    char opts[128];
    if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2") < 0)
        return w2_fail(r, "mount /proc", errno, "mounting /proc");
    snprintf(opts, sizeof opts, "size=%um,mode=1777", r->tmp_mb);
    if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0)
        return w2_fail(r, "mount /tmp", errno, "mounting /tmp");
    snprintf(opts, sizeof opts, "size=%um,mode=0755,uid=%u,gid=%u", r->tmp_mb, r->uid, r->uid);
    if (mount("tmpfs", "/work", "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0)
        return w2_fail(r, "mount /work", errno, "mounting /work");
    if (r->resolver[0] != '\0' && resolv_conf(r) != 0)
        return 1;
    if (sethostname("sandbox", 7) < 0)
        return w2_fail(r, "hostname", errno, "setting the hostname");
    if (lo_up() < 0)
        return w2_fail(r, "loopback", errno, "bringing lo up");
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        return w2_fail(r, "signalfd", errno, "signalfd");

    madvise(r->map + GUARD, MAP_LEN - GUARD, MADV_DOFORK); /* W3 needs this stack */
    pid_t pid = fork();
    if (pid < 0)
        return w2_fail(r, "fork", errno, "forking the call process");
    if (pid == 0)
        w3_main(r);
    madvise(r->map + GUARD, MAP_LEN - GUARD, MADV_DONTFORK);
    close(r->fd_in);
    close(r->fd_out);
    close(r->fd_err);

    struct pollfd p[2] = {{.fd = sfd, .events = POLLIN}, {.fd = r->fd_task, .events = POLLRDHUP}};
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    for (bool done = false; !done;) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            _exit(1);
        }
        if (p[1].revents & (POLLHUP | POLLRDHUP | POLLERR))
            _exit(0); /* the backend is gone: our exit takes the call with it */
        if (p[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0) {
            }
            for (;;) {
                int st;
                struct rusage u;
                pid_t w = wait4(-1, &st, WNOHANG | __WALL, &u);
                if (w <= 0)
                    break;
                if (w == pid) {
                    status = st;
                    ru = u;
                    done = true;
                }
            }
        }
    }
    struct fnp_result res;
    memset(&res, 0, sizeof res);
    hdr_init(&res.h, FNP_RESULT, sizeof res, 0);
    res.status = status;
    res.utime_us = (uint64_t)ru.ru_utime.tv_sec * 1000000u + (uint64_t)ru.ru_utime.tv_usec;
    res.stime_us = (uint64_t)ru.ru_stime.tv_sec * 1000000u + (uint64_t)ru.ru_stime.tv_usec;
    res.maxrss_kb = (uint64_t)ru.ru_maxrss;
    send_fds(r->fd_task, &res, sizeof res, NULL, 0);
    _exit(0);
}

/* ---- W1: the namespaces -------------------------------------------------------------- */

static int w1_main(void *arg)
{
    struct wrec *r = arg;
    int keep[8] = {r->fd_task, r->fd_in, r->fd_out, r->fd_err};
    int nkeep = 4;
    for (int i = 0; i < r->ncg; i++)
        keep[nkeep++] = r->fd_cg[i];
    if (r->fd_net >= 0)
        keep[nkeep++] = r->fd_net;
    close_others(keep, nkeep);
    for (int i = 0; i < r->ncg; i++) {
        if (write(r->fd_cg[i], "0", 1) != 1) {
            send_failure(r->fd_task, FNP_WORKER_FAILED, 0, "cgroup", errno,
                         "joining the slot's cgroup: %s", strerror(errno));
            return 1;
        }
        close(r->fd_cg[i]);
    }
    /* A sandbox with a network: its namespace, shared by all its calls (the
     * base seccomp filter lets W1 setns; the call's own filter does not).
     * Otherwise a fresh, empty one. */
    int newnet = CLONE_NEWNET;
    if (r->fd_net >= 0) {
        if (setns(r->fd_net, CLONE_NEWNET) < 0) {
            send_failure(r->fd_task, FNP_WORKER_FAILED, 0, "network", errno,
                         "joining the sandbox's network namespace: %s", strerror(errno));
            return 1;
        }
        close(r->fd_net);
        newnet = 0;
    }
    if (unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | newnet | CLONE_NEWPID |
                CLONE_NEWCGROUP) < 0) {
        send_failure(r->fd_task, FNP_WORKER_FAILED, 0, "namespaces", errno,
                     "unshare(mount, ipc, uts, %spid, cgroup): %s", newnet ? "net, " : "",
                     strerror(errno));
        return 1;
    }
    pid_t pid = clone(w2_main, r->map + MAP_LEN, CLONE_VM | CLONE_PARENT, r);
    if (pid < 0) {
        send_failure(r->fd_task, FNP_WORKER_FAILED, 0, "clone", errno,
                     "starting the supervisor: %s", strerror(errno));
        return 1;
    }
    __atomic_store_n(&r->w2, pid, __ATOMIC_RELEASE);
    return 0; /* W3 tells the backend (READY, with W2's pidfd) */
}

/* ---- the zygote's loop ---------------------------------------------------------------- */

static void rec_maybe_free(struct wrec *r)
{
    if (!r->w1_done || !r->w2_done)
        return;
    munmap(r->map, MAP_LEN);
    memset(r, 0, sizeof *r);
}

static void reap(void)
{
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG | __WALL);
        if (pid <= 0)
            return;
        struct wrec *hit = NULL;
        for (unsigned i = 0; i < nrecs && hit == NULL; i++)
            if (recs[i].used && recs[i].w1 == pid)
                hit = &recs[i];
        if (hit != NULL) {
            hit->w1_done = true;
            pid_t w2 = __atomic_load_n(&hit->w2, __ATOMIC_ACQUIRE);
            if (w2 == 0)
                hit->w2_done = true; /* W1 failed before making a supervisor */
            for (unsigned j = 0; j < nearly; j++)
                if (early_w2[j] == w2) {
                    hit->w2_done = true;
                    early_w2[j] = early_w2[--nearly];
                    break;
                }
            rec_maybe_free(hit);
            continue;
        }
        for (unsigned i = 0; i < nrecs && hit == NULL; i++)
            if (recs[i].used && recs[i].w2 == pid)
                hit = &recs[i];
        if (hit != NULL) {
            hit->w2_done = true;
            rec_maybe_free(hit);
        } else if (nearly < sizeof early_w2 / sizeof early_w2[0]) {
            early_w2[nearly++] = pid;
        }
    }
}

static void handle_spawn(void)
{
    struct fnp_spawn sp;
    int fds[FNP_SPAWN_FDS_MAX], nfds;
    ssize_t n = fnp_recv_fds(FNP_ZYGOTE_CTL_FD, &sp, sizeof sp, 0, fds, FNP_SPAWN_FDS_MAX, &nfds);
    if (n == 0)
        _exit(0);                     /* the backend closed us */
    if (n < 0 && errno == EMSGSIZE) { /* its header came: say which SPAWN failed */
        send_failure(FNP_ZYGOTE_CTL_FD, FNP_SPAWN_FAILED, sp.h.seq, "spawn", 0,
                     "malformed SPAWN (longer than %zu bytes)", sizeof sp);
        return;
    }
    if (n < 0) {
        if (errno == EAGAIN)
            return;
        _exit(1);
    }
    int ncg = __builtin_popcount(sp.cg_mask & 7u);
    int nnet = (sp.cg_mask & FNP_SPAWN_NET) ? 1 : 0;
    if ((size_t)n != sizeof sp || sp.h.magic != FNP_MAGIC || sp.h.type != FNP_SPAWN ||
        nfds != 4 + ncg + nnet || sp.tmp_mb == 0 ||
        (nnet && memchr(sp.resolver, '\0', sizeof sp.resolver) == NULL)) {
        for (int i = 0; i < nfds && i < FNP_SPAWN_FDS_MAX; i++)
            close(fds[i]);
        send_failure(FNP_ZYGOTE_CTL_FD, FNP_SPAWN_FAILED, sp.h.seq, "spawn", 0,
                     "malformed SPAWN (%zd bytes, %d fds)", n, nfds);
        return;
    }
    struct wrec *r = NULL;
    for (unsigned i = 0; i < nrecs && r == NULL; i++)
        if (!recs[i].used)
            r = &recs[i];
    int err = 0;
    const char *what = NULL;
    char *map = MAP_FAILED;
    if (r == NULL) {
        what = "every worker record is in use";
    } else {
        map = mmap(NULL, MAP_LEN, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (map == MAP_FAILED || mprotect(map, GUARD, PROT_NONE) < 0 ||
            madvise(map + GUARD, MAP_LEN - GUARD, MADV_DONTFORK) < 0) {
            err = errno;
            what = "mapping worker stacks";
        }
    }
    if (what == NULL) {
        memset(r, 0, sizeof *r);
        r->used = true;
        r->map = map;
        r->fd_task = fds[0];
        r->fd_in = fds[1];
        r->fd_out = fds[2];
        r->fd_err = fds[3];
        r->fd_cg[0] = r->fd_cg[1] = r->fd_cg[2] = -1;
        for (int i = 0; i < ncg; i++)
            r->fd_cg[i] = fds[4 + i];
        r->ncg = ncg;
        r->fd_net = nnet ? fds[4 + ncg] : -1;
        if (nnet)
            memcpy(r->resolver, sp.resolver, sizeof r->resolver);
        r->uid = sp.uid;
        r->tmp_mb = sp.tmp_mb;
        r->slot = sp.h.seq;
        pid_t w1 = clone(w1_main, map + GUARD + W1_STACK, CLONE_VM | SIGCHLD, r);
        if (w1 < 0) {
            err = errno;
            what = "clone";
            munmap(map, MAP_LEN);
            memset(r, 0, sizeof *r);
        } else {
            r->w1 = w1;
            /* W1 has its own copies; the fd numbers in r stay as they are,
             * W1, W2 and W3 read them. */
            for (int i = 0; i < nfds; i++)
                close(fds[i]);
            return;
        }
    } else if (map != MAP_FAILED) {
        munmap(map, MAP_LEN);
    }
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    send_failure(FNP_ZYGOTE_CTL_FD, FNP_SPAWN_FAILED, sp.h.seq, "spawn", err, "%s%s%s", what,
                 err ? ": " : "", err ? strerror(err) : "");
}

static void loop(void)
{
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        fatal("signalfd", errno, "signalfd: %s", strerror(errno));
    struct pollfd p[2] = {{.fd = FNP_ZYGOTE_CTL_FD, .events = POLLIN},
                          {.fd = sfd, .events = POLLIN}};
    for (;;) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            _exit(1);
        }
        if (p[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) > 0) {
            }
            reap();
        }
        if (p[0].revents & POLLIN)
            handle_spawn();
        else if (p[0].revents & (POLLHUP | POLLERR))
            _exit(0);
    }
}

/* ---- start-up ----------------------------------------------------------------------------- */

static int usage(void)
{
    fprintf(stderr, "usage: dsec-fn-zygote --root DIR --slots N --ppid PID [--ro PATH]... "
                    "[--lower DIR:DIR...] [--preload MOD,...]\n"
                    "The zygote of the dsec function backend, started by it with its control "
                    "socket as fd 3 (python3: as a module of /usr/bin/python3); not meant to be "
                    "run by hand.\n");
    return 2;
}

int fnz_main(int argc, char **argv, const struct fnz_runtime *rt)
{
    const char *preload = "", *lower = NULL;
    char *ro[32];
    int nro = 0;
    long ppid = -1;
    runtime = rt;
    for (int i = 0; i < argc; i += 2) { /* --key value pairs */
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            return usage();
        if (strcmp(a, "--root") == 0) {
            root_dir = v;
        } else if (strcmp(a, "--slots") == 0) {
            nrecs = (unsigned)strtoul(v, NULL, 10);
        } else if (strcmp(a, "--ppid") == 0) {
            ppid = strtol(v, NULL, 10);
        } else if (strcmp(a, "--ro") == 0) {
            if (nro == (int)(sizeof ro / sizeof ro[0]) || v[0] != '/')
                return usage();
            ro[nro++] = (char *)v;
        } else if (strcmp(a, "--preload") == 0) {
            preload = v;
        } else if (strcmp(a, "--lower") == 0) {
            lower = v;
        } else {
            return usage();
        }
    }
    struct stat st;
    if (root_dir == NULL || root_dir[0] != '/' || nrecs == 0 || nrecs > 65536 || ppid <= 0 ||
        fstat(FNP_ZYGOTE_CTL_FD, &st) < 0 || !S_ISSOCK(st.st_mode))
        return usage();

    /* Die with the backend's pool thread; it may already be gone. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != (pid_t)ppid)
        _exit(1);
    close_range(FNP_ZYGOTE_CTL_FD + 1, ~0u, 0);
    setsid(); /* out of the terminal's process group: a ^C there is not for us */
    /* Every signal stays blocked in the zygote, W1 and W2: a handler running
     * in the shared image would change memory under a W3 being forked. W3
     * unblocks them before it runs the call. */
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    /* W2s share this process's memory, and the OOM killer kills every process
     * sharing its victim's memory: it must never pick one of us. -1000 says
     * so where we hold CAP_SYS_RESOURCE; everywhere, each W3 marks itself
     * and its children as the first choice (1000). */
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t w = write(fd, "-1000", 5);
        (void)w; /* EPERM without CAP_SYS_RESOURCE: the W3s' 1000 still wins */
        close(fd);
    }

    recs = calloc(nrecs, sizeof *recs);
    if (recs == NULL)
        fatal("start", ENOMEM, "out of memory");
    if (lower != NULL && (nro > 0 || lower[0] != '/'))
        return usage();
    setup_root(ro, nro, lower);

    char msg[FNP_MSG_MAX];
    if (fnz_seccomp_build(&seccomp_base, &seccomp_tail, msg, sizeof msg) < 0)
        fatal("seccomp", 0, "%s", msg);

    struct fnp_hello hello;
    memset(&hello, 0, sizeof hello);
    hdr_init(&hello.h, FNP_HELLO, sizeof hello, 0);
    hello.pid = getpid();
    if (runtime != NULL) {
        if (runtime->warm(preload, hello.version, sizeof hello.version, hello.preloaded,
                          sizeof hello.preloaded, msg, sizeof msg) < 0)
            fatal("runtime", 0, "%s", msg);
    } else {
        snprintf(hello.version, sizeof hello.version, "exec");
    }
    /* From here on the zygote and every worker run under the base filter. */
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &seccomp_base) < 0)
        fatal("seccomp", errno, "installing the base seccomp filter: %s", strerror(errno));
    if (send_fds(FNP_ZYGOTE_CTL_FD, &hello, sizeof hello, NULL, 0) < 0)
        _exit(1);
    loop();
    return 0;
}

#ifndef DSEC_FNZ_MODULE
/* dsec-fn-zygote: the zygote of the exec runtime (sh, native). */
int main(int argc, char **argv)
{
    return fnz_main(argc - 1, argv + 1, NULL);
}
#endif
