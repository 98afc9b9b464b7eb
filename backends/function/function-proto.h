/* function-proto.h - the messages between the function backend, its zygotes and their workers. */
#ifndef DSEC_BACKENDS_FUNCTION_PROTO_H
#define DSEC_BACKENDS_FUNCTION_PROTO_H

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

/*
 * Who talks to whom (every channel is an AF_UNIX SOCK_SEQPACKET pair, so a
 * message is one send and one receive, never split or merged):
 *
 *   backend <-> zygote   the zygote's control socket (fd 3 of the zygote):
 *                        HELLO or FATAL once, then SPAWN -> SPAWN_FAILED on
 *                        failure (success is reported by the worker itself).
 *   backend <-> worker   one task socket per worker, created by the backend
 *                        and handed to the zygote with SPAWN:
 *                        W3 -> READY (with the supervisor's pidfd),
 *                        (backend -> PREP, W3 -> READY)*,
 *                        backend -> TASK, W2 -> RESULT;
 *                        WORKER_FAILED from any of them if set-up failed.
 *                        W3 closes its end before the call's code runs:
 *                        from then on only W2 (root, out of the call's
 *                        reach) can write to the backend.
 *
 * W1, W2, W3 are the three processes of one worker: W1 makes the namespaces
 * and exits, W2 is the supervisor (pid 1 of the call's pid namespace), W3 runs
 * the call (pid 2). function-zygote.c explains why.
 *
 * Messages are fixed C structs (both ends are built from this header, in one
 * build, on one machine), each starting with fnp_hdr. TASK is followed by a
 * string area; when that is larger than FNP_INLINE_MAX it travels in a sealed
 * memfd instead.
 */

#define FNP_MAGIC 0x31666e64u /* "dnf1" */

/* The zygote's control socket is this fd in the zygote (set by the spawner). */
#define FNP_ZYGOTE_CTL_FD 3

enum fnp_type {
    FNP_HELLO = 1,     /* zygote: started, ready to spawn */
    FNP_FATAL,         /* zygote: could not start (msg), then exits */
    FNP_SPAWN,         /* backend -> zygote: make one worker; fds attached */
    FNP_SPAWN_FAILED,  /* zygote: the SPAWN with this seq failed */
    FNP_READY,         /* W3: sandboxed, waiting for its task (the first: W2's pidfd attached) */
    FNP_WORKER_FAILED, /* W1/W2/W3: set-up failed (stage, errno, msg) */
    FNP_TASK,          /* backend -> W3: run this */
    FNP_RESULT,        /* W2: how the call ended */
    /* 9 was DONE, W3's own "finished with this exit code": retired, as the
     * call's code ran in W3 and could send it (or anything else) too. */
    FNP_PREP = 10, /* backend -> W3: warm the runtime to this level, say READY again */
};

struct fnp_hdr {
    uint32_t magic;
    uint32_t type;
    uint32_t len; /* bytes of the whole message, header included */
    uint32_t seq; /* SPAWN: the slot; otherwise 0 */
};

#define FNP_VERSION_MAX 64
#define FNP_MSG_MAX 512

struct fnp_hello {
    struct fnp_hdr h;
    int32_t pid;
    char version[FNP_VERSION_MAX]; /* "python 3.11.2" or "exec" */
    char preloaded[512];           /* modules imported in the zygote, comma-separated */
};

/* FATAL, SPAWN_FAILED and WORKER_FAILED. */
struct fnp_failure {
    struct fnp_hdr h;
    int32_t err;    /* errno, or 0 */
    char stage[32]; /* "mount /proc", "seccomp", ... */
    char msg[FNP_MSG_MAX];
};
/* The python3 boot script packs a FATAL itself ('=4Ii32s<FNP_MSG_MAX>s'). */
_Static_assert(sizeof(struct fnp_failure) == 4 * 4 + 4 + 32 + FNP_MSG_MAX,
               "struct fnp_failure is what the python3 boot script packs");
#define FNP_STR_(x) #x
#define FNP_STR(x) FNP_STR_(x)

/* Which optional fds follow the four fixed ones in a SPAWN. */
enum {
    FNP_SPAWN_CG0 = 1u << 0, /* cgroup.procs of the first controller (v2: the cgroup) */
    FNP_SPAWN_CG1 = 1u << 1, /* v1: second controller */
    FNP_SPAWN_CG2 = 1u << 2, /* v1: third controller */
    /* A worker for one call of a sandbox with a network: the sandbox's
     * network namespace (an fd of its bind-mounted file), which W1 joins
     * instead of making an empty one; W2 binds a resolv.conf naming
     * `resolver` over /etc/resolv.conf. */
    FNP_SPAWN_NET = 1u << 3,
};
#define FNP_SPAWN_FDS_MAX 8
#define FNP_RESOLVER_MAX 48

/* fds, in order: task socket (W end), stdin (read end), stdout (write end),
 * stderr (write end), the cgroup.procs fds named in cg_mask, then the
 * network namespace with FNP_SPAWN_NET. */
struct fnp_spawn {
    struct fnp_hdr h; /* seq = slot */
    uint32_t uid;     /* the call runs as uid = gid = this */
    uint32_t tmp_mb;  /* size of /tmp and of /work */
    uint32_t cg_mask; /* FNP_SPAWN_CG*, FNP_SPAWN_NET */
    uint32_t reserved;
    char resolver[FNP_RESOLVER_MAX]; /* FNP_SPAWN_NET: the nameserver address, NUL-ended */
};

struct fnp_ready {
    struct fnp_hdr h;
    uint32_t level; /* how warm the runtime is (0: as forked) */
    uint32_t reserved;
};

/* Warm the runtime ahead of the call (function-zygote.h, fnz_runtime.prepare):
 * 1 the interpreter's after-fork work, 2 also its per-call paths. Costs the
 * worker private memory (~0.15 and ~0.9 MB for python3 here), saves the call
 * that time (~0.15 and ~0.45 ms). */
struct fnp_prep {
    struct fnp_hdr h;
    uint32_t level;
    uint32_t reserved;
};

/* How W3 runs the task. */
enum fnp_mode {
    FNP_MODE_EXEC = 1,  /* execvpe(argv[0], argv, env) */
    FNP_MODE_PY_CODE,   /* python3 -c CODE: target = CODE */
    FNP_MODE_PY_FILE,   /* python3 SCRIPT: target = path */
    FNP_MODE_PY_MODULE, /* python3 -m MOD: target = module name */
    FNP_MODE_PY_STDIN,  /* python3 - (or no argument): the code is stdin */
};

enum {
    FNP_TASK_PAYLOAD_FD = 1u << 0, /* the string area is in an attached memfd */
    FNP_TASK_BUNDLE_FD =
        1u << 1, /* the dependency files are in an attached memfd (after the payload fd) */
    FNP_TASK_PY_UNBUFFERED = 1u << 2,  /* -u */
    FNP_TASK_PY_NO_BYTECODE = 1u << 3, /* -B */
    FNP_TASK_PY_CALL = 1u << 4,        /* --call FUNC: call_func is set, args are JSON */
};

/* Strings area, NUL-separated, in this order: target, call_func, cwd,
 * argv[0..argc), env[0..envc) as "K=V". For python modes argv is sys.argv. */
struct fnp_task {
    struct fnp_hdr h;
    uint32_t mode;  /* fnp_mode */
    uint32_t flags; /* FNP_TASK_* */
    uint32_t argc, envc;
    uint64_t strings_len;
    uint64_t bundle_len; /* bytes of the bundle memfd, 0 without one */
    /* limits applied by W3 before running; 0 = none */
    uint64_t cpu_s;       /* RLIMIT_CPU (whole seconds; the backend enforces ms) */
    uint64_t as_bytes;    /* RLIMIT_AS */
    uint64_t fsize_bytes; /* RLIMIT_FSIZE */
    uint32_t nofile;      /* RLIMIT_NOFILE */
    uint32_t nproc;       /* RLIMIT_NPROC (the uid is private to the worker) */
};

/* Inline string areas up to this size; larger ones go in a memfd. */
#define FNP_INLINE_MAX (48u * 1024u)

struct fnp_result {
    struct fnp_hdr h;
    int32_t status; /* wait status of W3 */
    uint32_t reserved;
    uint64_t utime_us; /* W3 and the children it waited for */
    uint64_t stime_us;
    uint64_t maxrss_kb;
};

/* The bundle: the sandbox's /work files, copied into each call's /work.
 * "DFB1", then records: u8 kind (1 dir, 2 file), u8 0, u16 path length,
 * u32 mode, u64 size (files), path (relative to /work, no NUL), data. Parents
 * come before their children. */
#define FNP_BUNDLE_MAGIC "DFB1"
enum { FNP_BUNDLE_DIR = 1, FNP_BUNDLE_FILE = 2 };
struct fnp_bundle_rec {
    uint8_t kind;
    uint8_t zero;
    uint16_t path_len;
    uint32_t mode;
    uint64_t size;
};

/* One message of iovcnt parts with nfds (0 to FNP_SPAWN_FDS_MAX) descriptors
 * attached, retried on EINTR. Returns what sendmsg returns. Shared by the
 * backend and the zygote, which links nothing of dsec. */
static inline ssize_t fnp_send_fds(int sock, struct iovec *iov, int iovcnt, const int *fds,
                                   int nfds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * FNP_SPAWN_FDS_MAX)];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
    if (nfds > 0) {
        if (nfds > FNP_SPAWN_FDS_MAX) {
            errno = EINVAL;
            return -1;
        }
        mh.msg_control = u.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    ssize_t n;
    do
        n = sendmsg(sock, &mh, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
}

/* Receive one message into buf (len bytes) and the descriptors it carries
 * (close-on-exec): the first maxfds (at most FNP_SPAWN_FDS_MAX) go to fds, unused slots are
 * -1, any more are closed; *nfds gets how many came. EINTR is retried. A
 * message longer than len fails with EMSGSIZE, its descriptors closed.
 * Returns what recvmsg returns. */
static inline ssize_t fnp_recv_fds(int sock, void *buf, size_t len, int flags, int *fds, int maxfds,
                                   int *nfds)
{
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    union {
        char c[CMSG_SPACE(sizeof(int) * FNP_SPAWN_FDS_MAX)];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.c, .msg_controllen = sizeof u.c};
    for (int i = 0; i < maxfds; i++)
        fds[i] = -1;
    *nfds = 0;
    ssize_t n;
    do
        n = recvmsg(sock, &mh, flags | MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return n;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < k; i++, (*nfds)++) {
            int x;
            memcpy(&x, CMSG_DATA(c) + sizeof(int) * (size_t)i, sizeof x);
            if (*nfds < maxfds && !(mh.msg_flags & MSG_TRUNC))
                fds[*nfds] = x;
            else
                close(x);
        }
    }
    if (mh.msg_flags & MSG_TRUNC) {
        errno = EMSGSIZE;
        return -1;
    }
    return n;
}

#endif
