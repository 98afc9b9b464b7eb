/* function-call.c - one function call: the exec request mapped onto a task, a warm worker taken,
 * its output and limits watched until it ends. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/function/function-int.h"
#include "backends/function/function-proto.h"
#include "backends/loop.h"
#include "dsec/alloc.h"

/*
 * The exec request is the task (docs/function-calls.md, "Mapping"):
 *   argv     python3 ... in a python3 sandbox runs in the warm interpreter
 *            (parsed here, so a malformed command line fails before any
 *            worker is used); anything else is executed.
 *   env      added to a clean default environment (and the sandbox
 *            environment's variables); DSEC_LIMIT_* keys set this call's
 *            limits and are not passed on.
 *   stdin    streamed into the call's stdin pipe, then closed.
 *   timeout  wall time; the backend kills the call's pid namespace.
 * Everything that can be checked is checked before a worker is taken.
 */

#define STRINGS_MAX (64ull << 20)
#define OUTPUT_HARD_MAX (64u << 20)
#define ENV_MAX 512
#define CPU_POLL_MS 10
#define KILL_GRACE_NS (5000ull * 1000000ull)

struct kv {
    const char *k;
    size_t klen;
    const char *v;
};

struct plan {
    uint32_t mode, flags;
    const char *target, *call_func, *cwd;
    const char **argv; /* what the task carries as argv (sys.argv for python) */
    size_t argc;
    struct kv env[ENV_MAX];
    size_t nenv;
    uint64_t mem_mb, cpu_ms, nproc, fsize_mb, output_max, timeout_ms;
};

static bool is_python(const char *a0)
{
    const char *b = strrchr(a0, '/');
    b = b ? b + 1 : a0;
    if (strcmp(b, "python") == 0 || strcmp(b, "python3") == 0)
        return true;
    if (strncmp(b, "python3.", 8) != 0 || b[8] == '\0')
        return false;
    for (const char *c = b + 8; *c; c++)
        if (!isdigit((unsigned char)*c))
            return false;
    return true;
}

static bool identifier(const char *s)
{
    if (!(isalpha((unsigned char)s[0]) || s[0] == '_'))
        return false;
    for (const char *c = s; *c; c++)
        if (!(isalnum((unsigned char)*c) || *c == '_'))
            return false;
    return strlen(s) <= 128;
}

static const char py_supported[] =
    "-c CODE, -m MODULE, SCRIPT, -, -u, -B, -E, -s, -I, -q, --call FUNC";

/* python3's command line, the way python3 reads it. */
static int parse_python(const dsec_exec_req *req, struct plan *pl, dsec_err *err)
{
    const char *const *av = req->argv;
    size_t ac = req->argc, i = 1;
    pl->argv = dsec_calloc(ac + 1, sizeof *pl->argv);
    if (pl->argv == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "exec: out of memory");
    while (i < ac) {
        const char *a = av[i];
        if (strcmp(a, "--call") == 0) {
            if (i + 1 >= ac || !identifier(av[i + 1]))
                return dsec_err_set(err, DSEC_E_INVALID, 0,
                                    "exec: python3 --call needs a function name (an identifier)");
            pl->call_func = av[i + 1];
            pl->flags |= FNP_TASK_PY_CALL;
            i += 2;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0')
            break;
        if (a[1] == '-')
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "exec: python3 option %s is not supported in function sandboxes "
                                "(supported: %s)",
                                a, py_supported);
        for (const char *c = a + 1; *c; c++) {
            switch (*c) {
            case 'u':
                pl->flags |= FNP_TASK_PY_UNBUFFERED;
                break;
            case 'B':
                pl->flags |= FNP_TASK_PY_NO_BYTECODE;
                break;
            case 'E':
            case 's':
            case 'I':
            case 'q':
                break; /* the environment is already clean and no user site exists */
            case 'c':
            case 'm': {
                const char *val = c[1] ? c + 1 : i + 1 < ac ? av[++i] : NULL;
                if (val == NULL)
                    return dsec_err_set(err, DSEC_E_INVALID, 0,
                                        *c == 'c' ? "exec: python3 -c needs an argument (the code)"
                                                  : "exec: python3 -m needs a module name");
                if (*c == 'm' && val[0] == '\0')
                    return dsec_err_set(err, DSEC_E_INVALID, 0,
                                        "exec: python3 -m needs a module name");
                pl->mode = *c == 'c' ? FNP_MODE_PY_CODE : FNP_MODE_PY_MODULE;
                pl->target = val;
                pl->argv[0] = *c == 'c' ? "-c" : "-m";
                pl->argc = 1;
                for (size_t j = i + 1; j < ac; j++)
                    pl->argv[pl->argc++] = av[j];
                goto out;
            }
            default:
                return dsec_err_set(err, DSEC_E_INVALID, 0,
                                    "exec: python3 option -%c is not supported in function "
                                    "sandboxes (supported: %s)",
                                    *c, py_supported);
            }
        }
        i++;
    }
    if (i < ac) {
        pl->mode = strcmp(av[i], "-") == 0 ? FNP_MODE_PY_STDIN : FNP_MODE_PY_FILE;
        pl->target = pl->mode == FNP_MODE_PY_FILE ? av[i] : "";
        for (size_t j = i; j < ac; j++)
            pl->argv[pl->argc++] = av[j];
    } else {
        pl->mode = FNP_MODE_PY_STDIN;
        pl->target = "";
        pl->argv[pl->argc++] = "";
    }
out:
    if ((pl->flags & FNP_TASK_PY_CALL) && pl->mode == FNP_MODE_PY_MODULE)
        return dsec_err_set(
            err, DSEC_E_INVALID, 0,
            "exec: python3 --call works with -c CODE, a script or - (stdin), not -m");
    return 0;
}

static int parse_u64(const char *key, const char *v, uint64_t min, uint64_t max, uint64_t *out,
                     dsec_err *err)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (v[0] < '0' || v[0] > '9' || *end != '\0' || errno != 0 || x < min || x > max)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "exec: %s=\"%s\": expected a whole number %" PRIu64 "..%" PRIu64, key,
                            v, min, max);
    *out = x;
    return 0;
}

/* Lower a sandbox limit for this call (a call may not raise it). */
static int lower(const char *key, const char *v, uint64_t *limit, uint64_t hard_max, dsec_err *err)
{
    uint64_t x = 0;
    uint64_t max = *limit ? *limit : hard_max;
    if (parse_u64(key, v, 1, max, &x, err) < 0)
        return dsec_err_wrap(err, "%s",
                             *limit ? "(a call can only lower its sandbox's limit)" : "");
    *limit = x;
    return 0;
}

static int env_set(struct plan *pl, const char *k, size_t klen, const char *v, dsec_err *err)
{
    for (size_t i = 0; i < pl->nenv; i++)
        if (pl->env[i].klen == klen && memcmp(pl->env[i].k, k, klen) == 0) {
            pl->env[i].v = v;
            return 0;
        }
    if (pl->nenv == ENV_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "exec: more than %d environment variables",
                            ENV_MAX);
    pl->env[pl->nenv++] = (struct kv){k, klen, v};
    return 0;
}

static int make_plan(const struct fn_target *tg, const struct fn_limits *lim,
                     const dsec_exec_req *req, struct plan *pl, dsec_err *err)
{
    if (req->argc == 0 || req->argv == NULL || req->argv[0] == NULL || req->argv[0][0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "exec: argv is empty (give the program to run)");
    for (size_t i = 0; i < req->argc; i++)
        if (req->argv[i] == NULL)
            return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: argv[%zu] is missing", i);
    if (req->user != NULL && req->user[0] != '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "exec: function sandboxes run each call as its own unprivileged uid; "
                            "user \"%s\" cannot be chosen (leave it unset)",
                            req->user);
    pl->cwd = req->cwd && req->cwd[0] ? req->cwd : "/work";
    if (pl->cwd[0] != '/' || strlen(pl->cwd) >= PATH_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: cwd \"%s\" is not an absolute path",
                            pl->cwd);
    pl->target = pl->call_func = "";
    if (tg->rt == FN_RT_PYTHON3 && is_python(req->argv[0])) {
        if (parse_python(req, pl, err) < 0)
            return -1;
    } else {
        pl->mode = FNP_MODE_EXEC;
        pl->argv = dsec_calloc(req->argc + 1, sizeof *pl->argv);
        if (pl->argv == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "exec: out of memory");
        for (size_t i = 0; i < req->argc; i++)
            pl->argv[i] = req->argv[i];
        pl->argc = req->argc;
    }

    pl->mem_mb = lim->memory_mb;
    pl->cpu_ms = lim->cpu_ms;
    pl->nproc = lim->nproc;
    pl->fsize_mb = lim->fsize_mb;
    pl->output_max = req->output_max ? req->output_max : DSEC_EXEC_OUTPUT_DEFAULT;
    static const char *const defaults[][2] = {{"PATH", "/usr/local/bin:/usr/bin:/bin"},
                                              {"HOME", "/work"},
                                              {"TMPDIR", "/tmp"},
                                              {"LANG", "C.UTF-8"}};
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        env_set(pl, defaults[i][0], strlen(defaults[i][0]), defaults[i][1], err);
    for (size_t i = 0; i < tg->nvars; i++) { /* the environment's, checked at create */
        const char *eq = strchr(tg->vars[i], '=');
        if (eq != NULL && env_set(pl, tg->vars[i], (size_t)(eq - tg->vars[i]), eq + 1, err) < 0)
            return -1;
    }
    for (size_t i = 0; i < req->nenv; i++) {
        const char *k = req->env[i].key, *v = req->env[i].value;
        if (k == NULL || v == NULL || k[0] == '\0' || strchr(k, '=') != NULL)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "exec: environment variable %zu has an empty name or one with '='",
                                i);
        if (strncmp(k, "DSEC_LIMIT_", 11) == 0) {
            int rc;
            if (strcmp(k, "DSEC_LIMIT_CPU_MS") == 0)
                rc = lower(k, v, &pl->cpu_ms, 24ull * 3600 * 1000, err);
            else if (strcmp(k, "DSEC_LIMIT_MEMORY_MB") == 0)
                rc = lower(k, v, &pl->mem_mb, 1ull << 20, err);
            else if (strcmp(k, "DSEC_LIMIT_NPROC") == 0)
                rc = lower(k, v, &pl->nproc, 65536, err);
            else if (strcmp(k, "DSEC_LIMIT_FSIZE_MB") == 0)
                rc = lower(k, v, &pl->fsize_mb, 1ull << 20, err);
            else if (strcmp(k, "DSEC_LIMIT_OUTPUT_BYTES") == 0)
                rc = parse_u64(k, v, 1, OUTPUT_HARD_MAX, &pl->output_max, err);
            else
                rc = dsec_err_set(err, DSEC_E_INVALID, 0,
                                  "exec: unknown limit %s (known: DSEC_LIMIT_CPU_MS, "
                                  "DSEC_LIMIT_MEMORY_MB, DSEC_LIMIT_NPROC, DSEC_LIMIT_FSIZE_MB, "
                                  "DSEC_LIMIT_OUTPUT_BYTES)",
                                  k);
            if (rc < 0)
                return -1;
            continue;
        }
        if (env_set(pl, k, strlen(k), v, err) < 0)
            return -1;
    }
    if (pl->output_max > OUTPUT_HARD_MAX)
        pl->output_max = OUTPUT_HARD_MAX;
    return 0;
}

/* target, call_func, cwd, argv..., env "K=V"... as NUL-ended strings. */
static int build_strings(const struct plan *pl, char **out, size_t *len, dsec_err *err)
{
    size_t n = strlen(pl->target) + 1 + strlen(pl->call_func) + 1 + strlen(pl->cwd) + 1;
    for (size_t i = 0; i < pl->argc; i++)
        n += strlen(pl->argv[i]) + 1;
    for (size_t i = 0; i < pl->nenv; i++)
        n += pl->env[i].klen + 1 + strlen(pl->env[i].v) + 1;
    if (n > STRINGS_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "exec: the command line and environment hold %zu bytes (at most %llu)",
                            n, (unsigned long long)STRINGS_MAX);
    char *s = dsec_malloc(n), *p = s;
    if (s == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "exec: out of memory");
#define PUT(str, l)                                                                                \
    do {                                                                                           \
        memcpy(p, (str), (l));                                                                     \
        p += (l);                                                                                  \
    } while (0)
    PUT(pl->target, strlen(pl->target) + 1);
    PUT(pl->call_func, strlen(pl->call_func) + 1);
    PUT(pl->cwd, strlen(pl->cwd) + 1);
    for (size_t i = 0; i < pl->argc; i++)
        PUT(pl->argv[i], strlen(pl->argv[i]) + 1);
    for (size_t i = 0; i < pl->nenv; i++) {
        PUT(pl->env[i].k, pl->env[i].klen);
        *p++ = '=';
        PUT(pl->env[i].v, strlen(pl->env[i].v) + 1);
    }
#undef PUT
    *out = s;
    *len = n;
    return 0;
}

static int sealed_memfd(const void *data, size_t len, dsec_err *err)
{
    int fd = memfd_create("dsec-fn-task", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "exec: memfd for the task");
    const uint8_t *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w <= 0) {
            int e = errno;
            close(fd);
            return dsec_err_set(err, DSEC_E_IO, e, "exec: writing the task");
        }
        p += w;
        left -= (size_t)w;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0) {
        int e = errno;
        close(fd);
        return dsec_err_set(err, DSEC_E_IO, e, "exec: sealing the task");
    }
    return fd;
}

static int send_task(int sock, const struct fnp_task *t, const char *inline_str, size_t inline_len,
                     const int *fds, int nfds)
{
    struct iovec iov[2] = {{(void *)t, sizeof *t}, {(void *)inline_str, inline_len}};
    ssize_t n = fnp_send_fds(sock, iov, inline_len ? 2 : 1, fds, nfds);
    return n == (ssize_t)(sizeof *t + inline_len) ? 0 : -1;
}

struct out {
    uint8_t *p;
    size_t len, cap, max;
    bool truncated;
};

typedef void (*output_fn)(void *arg, int stream, const uint8_t *data, size_t len);

/* Drain fd into o (up to its cap, the rest is dropped; what is kept also goes to fn when set).
 * Returns 0 at EOF, 1 when more may come. */
static int drain(int fd, struct out *o, int stream, output_fn fn, void *arg)
{
    for (;;) {
        uint8_t scratch[16384];
        uint8_t *dst = scratch;
        size_t room = sizeof scratch;
        if (o->len < o->max) {
            if (o->cap - o->len < 4096 && o->cap < o->max) {
                size_t c = o->cap ? o->cap * 2 : 8192;
                if (c > o->max)
                    c = o->max;
                uint8_t *p = dsec_realloc(o->p, c);
                if (p != NULL) {
                    o->p = p;
                    o->cap = c;
                }
            }
            if (o->cap > o->len) {
                dst = o->p + o->len;
                room = o->cap - o->len;
            }
        }
        ssize_t n = read(fd, dst, room);
        if (n == 0)
            return 0;
        if (n < 0)
            return errno == EAGAIN || errno == EINTR ? 1 : 0;
        size_t at = o->len;
        if (dst == scratch) {
            size_t keep = o->len < o->max ? o->max - o->len : 0;
            if (keep > (size_t)n)
                keep = (size_t)n;
            if (keep > 0 && o->cap >= o->len + keep)
                memcpy(o->p + o->len, scratch, keep);
            else
                keep = 0;
            o->len += keep;
            if ((size_t)n > keep)
                o->truncated = true;
        } else {
            o->len += (size_t)n;
        }
        if (fn != NULL && o->len > at)
            fn(arg, stream, o->p + at, o->len - at);
    }
}

enum { KILL_NONE, KILL_TIMEOUT, KILL_CPU };

static int pidfd_kill(int pidfd)
{
    return (int)syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
}

/*
 * One call in flight, driven by callbacks on the loop's thread: a timer watch (the wait for a
 * worker, then the call's deadline, its CPU polling and the grace after a kill), the waiter's
 * eventfd while it waits for a worker, a networked worker's task socket until its READY, and
 * one watch per channel of the worker (stdout, stderr, stdin while there is some to write,
 * the task socket, the supervisor's pidfd).
 *
 * What blocks, and where: exec_start makes the task on the caller's thread (parsing, the
 * strings and their sealed memfd, up to STRINGS_MAX; the copy of stdin; the sandbox's files
 * bundle, rebuilt only after a file changed, a copy bounded by its disk quota): microseconds
 * for a usual call, milliseconds for a large one. Nothing waits for a worker, the call or its
 * output there. On the loop thread only system calls that wait for nothing but the kernel:
 * the slot cgroup's limit writes and the TASK send (a fresh worker's socket has room), and for
 * a networked call its slot's cgroup directory, socket, pipes and SPAWN to the zygote.
 */
/* A call waiting for a worker hears of one through its waiter's eventfd; the timer looks
 * again this often as well, in case it was told of a worker another call took. */
#define TAKE_POLL_MS 100

enum {
    PH_TAKE,      /* taking a warm worker */
    PH_NET,       /* networked: waiting for a slot (and the pool) */
    PH_NET_READY, /* networked: its worker is being made */
    PH_NET_RETRY, /* networked: its zygote died under it; waiting for the new one */
    PH_RUN,       /* the task is out */
};

struct fn_call {
    struct fn_pools *pools;
    dsec_loop *loop;
    dsec_exec_done_fn done;
    void *ud;
    output_fn on_output;
    void *on_output_arg;
    uint64_t *cpu_used_us, *calls; /* the sandbox's counters, added to at the end */

    /* the task, ready to send */
    int pool;
    int phase;
    int netns_fd;         /* a networked sandbox's namespace (borrowed: the sandbox outlives
                           * the call), or -1 */
    const char *resolver; /* with netns_fd (borrowed likewise) */
    int tries, zctl_used; /* a networked worker: attempts, the zygote socket of the last */
    uint64_t retry_until;
    dsec_loop_watch *wready;  /* a networked worker's task socket, until its READY */
    struct fn_take_waiter tk; /* while it waits for a worker */
    dsec_loop_watch *wwait;   /* on tk.efd */
    uint64_t take_deadline, acquire_ms;
    struct fnp_task t;
    char *strings;
    size_t slen;
    int payload_fd, bundle_fd; /* owned (the bundle's a dup: the sandbox may rebuild its own) */
    uint8_t *in;
    size_t in_len, in_off;
    uint64_t mem_bytes, nproc, cpu_ms, timeout_ms;
    bool use_rlimit_as;

    /* the call running */
    struct fn_worker *w;
    struct fn_cg_slot *cg;
    int cgmode;
    bool cg_cpu;
    uint64_t cpu0, t0, deadline, grace;
    int killed;
    bool got_result, w2_dead, out_eof, err_eof, task_eof, failed;
    struct fnp_result result;
    struct fnp_failure failure;
    struct out o, e;
    dsec_loop_watch *tw, *wout, *werr, *win, *wtask, *wpid;
};

/* The wait for a worker is over: the pool forgets the waiter, then its eventfd goes. */
static void wait_end(struct fn_call *c)
{
    dsec__fn_worker_unwait(c->pools, &c->tk);
    dsec_loop_del(c->wwait); /* before the close: the fd number may come back at once */
    c->wwait = NULL;
    if (c->tk.efd >= 0)
        close(c->tk.efd);
    c->tk.efd = -1;
}

static void call_free(struct fn_call *c)
{
    wait_end(c);
    if (c->w != NULL)
        dsec__fn_worker_done(c->pools, c->w);
    if (c->payload_fd >= 0)
        close(c->payload_fd);
    if (c->bundle_fd >= 0)
        close(c->bundle_fd);
    dsec_free(c->strings);
    dsec_free(c->in);
    dsec_free(c->o.p);
    dsec_free(c->e.p);
    dsec_free(c);
}

static void unwatch(dsec_loop_watch **w)
{
    dsec_loop_del(*w);
    *w = NULL;
}

/* The end of a call: every watch goes, the worker goes back to its pool, done hears rc. */
static void call_end(struct fn_call *c, int rc, dsec_exec_result *res, dsec_err *err)
{
    unwatch(&c->tw);
    unwatch(&c->wwait);
    unwatch(&c->wready);
    unwatch(&c->wout);
    unwatch(&c->werr);
    unwatch(&c->win);
    unwatch(&c->wtask);
    unwatch(&c->wpid);
    if (rc < 0 && c->w != NULL && !c->w2_dead)
        pidfd_kill(c->w->pidfd); /* a call that ends in an error leaves nothing running */
    if (rc == 0) {
        *c->cpu_used_us += res->cpu_us;
        (*c->calls)++;
    }
    dsec_exec_done_fn done = c->done;
    void *ud = c->ud;
    call_free(c); /* the worker is handed back before done: its slot is free when done runs */
    done(ud, rc, res, err);
}

static void call_fail(struct fn_call *c, dsec_err *err)
{
    call_end(c, -1, NULL, err);
}

/* What the task socket holds: only the supervisor has the worker's end now (W3 closed it
 * before the call's code ran), so it is its RESULT, or a set-up failure of W2, or of W3
 * before the call. */
static void read_task(struct fn_call *c)
{
    union {
        struct fnp_hdr h;
        struct fnp_result r;
        struct fnp_failure f;
    } m;
    ssize_t r = recv(c->w->task_fd, &m, sizeof m, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        c->task_eof = true;
        unwatch(&c->wtask);
    } else if (r > 0 && (size_t)r >= sizeof m.h && m.h.magic == FNP_MAGIC &&
               m.h.len == (uint32_t)r) {
        if (m.h.type == FNP_RESULT && (size_t)r == sizeof m.r) {
            c->result = m.r;
            c->got_result = true;
        } else if (m.h.type == FNP_WORKER_FAILED && (size_t)r == sizeof m.f) {
            c->failure = m.f;
            c->failure.stage[sizeof c->failure.stage - 1] = '\0';
            c->failure.msg[sizeof c->failure.msg - 1] = '\0';
            c->failed = true;
        }
    }
}

/* Feed stdin as the pipe takes it. SIGPIPE is held off around the write (the call may have
 * stopped reading) and consumed, so the loop thread never dies of it. */
static void write_stdin(struct fn_call *c)
{
    sigset_t pipe_set, old_mask;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask);
    ssize_t wr = write(c->w->stdin_fd, c->in + c->in_off, c->in_len - c->in_off);
    int e = errno;
    struct timespec zero = {0, 0};
    if (wr < 0 && e == EPIPE)
        while (sigtimedwait(&pipe_set, NULL, &zero) > 0) {
        }
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    if (wr > 0)
        c->in_off += (size_t)wr;
    if (c->in_off == c->in_len || (wr < 0 && e != EAGAIN && e != EINTR)) {
        unwatch(&c->win); /* all written, or the call stopped reading */
        close(c->w->stdin_fd);
        c->w->stdin_fd = -1;
    }
}

/* The next time the timer must wake: the deadline, the grace after a kill, or the next CPU
 * reading. */
static uint64_t next_wake(const struct fn_call *c, uint64_t now)
{
    uint64_t next = c->grace ? c->grace : c->deadline;
    if (c->cpu_ms && c->cg_cpu && c->killed == KILL_NONE && next > now + CPU_POLL_MS * 1000000ull)
        next = now + CPU_POLL_MS * 1000000ull;
    return next;
}

static void finish(struct fn_call *c)
{
    dsec_err err;
    uint64_t t1 = dsec_now_ns(), cpu_used_ns = 0;
    if (c->cg_cpu && dsec__fn_cg_slot_cpu(c->cg, c->cgmode, &cpu_used_ns) == 0 &&
        cpu_used_ns >= c->cpu0)
        cpu_used_ns -= c->cpu0;
    else
        cpu_used_ns = (c->result.utime_us + c->result.stime_us) * 1000ull;
    if (c->failed && c->killed == KILL_NONE) {
        int code = strcmp(c->failure.stage, "cwd") == 0                ? DSEC_E_INVALID
                   : strcmp(c->failure.stage, "dependency files") == 0 ? DSEC_E_IO
                                                                       : DSEC_E_BACKEND;
        dsec_err_set(&err, code, c->failure.err, "exec: %s", c->failure.msg);
        call_fail(c, &err);
        return;
    }
    dsec_exec_result res;
    memset(&res, 0, sizeof res);
    if (c->killed == KILL_TIMEOUT) {
        res.timed_out = true;
        res.exit_code = -1;
        res.signal = SIGKILL;
    } else if (c->killed == KILL_CPU) {
        res.exit_code = -1;
        res.signal = SIGXCPU;
    } else if (c->got_result) {
        int st = c->result.status;
        if (WIFEXITED(st)) {
            res.exit_code = WEXITSTATUS(st);
        } else {
            res.exit_code = -1;
            res.signal = WIFSIGNALED(st) ? WTERMSIG(st) : SIGKILL;
        }
    } else {
        dsec_err_set(&err, DSEC_E_BACKEND, 0,
                     "exec: the worker running the call died before reporting (was its "
                     "supervisor killed from outside?)");
        call_fail(c, &err);
        return;
    }
    res.stdout_data = c->o.len ? c->o.p : NULL;
    res.stdout_len = c->o.len;
    res.stdout_truncated = c->o.truncated;
    res.stderr_data = c->e.len ? c->e.p : NULL;
    res.stderr_len = c->e.len;
    res.stderr_truncated = c->e.truncated;
    if (c->o.len == 0)
        dsec_free(c->o.p);
    if (c->e.len == 0)
        dsec_free(c->e.p);
    c->o.p = c->e.p = NULL;
    res.duration_us = (t1 - c->t0) / 1000ull;
    res.cpu_us = cpu_used_ns / 1000ull;
    res.peak_rss_kb = c->result.maxrss_kb;
    call_end(c, 0, &res, NULL);
}

static void kill_call(struct fn_call *c, int why, uint64_t now)
{
    pidfd_kill(c->w->pidfd);
    c->killed = why;
    c->grace = now + KILL_GRACE_NS;
}

/* Returns true when the call ended (c is gone). */
static bool on_timer(struct fn_call *c)
{
    uint64_t now = dsec_now_ns();
    if (c->grace && now >= c->grace) {
        finish(c); /* something holds the pipes open past the namespace's death: give up */
        return true;
    }
    if (c->killed == KILL_NONE && now >= c->deadline)
        kill_call(c, KILL_TIMEOUT, now);
    if (c->cpu_ms && c->cg_cpu && c->killed == KILL_NONE) {
        uint64_t cpu;
        if (dsec__fn_cg_slot_cpu(c->cg, c->cgmode, &cpu) == 0 &&
            cpu - c->cpu0 > c->cpu_ms * 1000000ull)
            kill_call(c, KILL_CPU, dsec_now_ns());
    }
    dsec_loop_set(c->tw, 0, next_wake(c, now));
    return false;
}

static void call_event(dsec_loop_watch *lw, unsigned events, void *ud);

static int watch(struct fn_call *c, int fd, unsigned events, dsec_loop_watch **out, dsec_err *err)
{
    if (dsec_loop_add(c->loop, fd, events, 0, call_event, c, out, err) < 0)
        return dsec_err_wrap(err, "exec: watching the call");
    return 0;
}

/* A worker is ours: set its slot's limits, send the task, watch its channels. */
static void launch(struct fn_call *c)
{
    dsec_err err;
    struct fn_worker *w = c->w;
    c->cg = dsec__fn_worker_cg(c->pools, w, &c->cgmode);
    if (c->cg != NULL &&
        dsec__fn_cg_slot_limits(c->cg, c->cgmode, c->mem_bytes, c->nproc + 2, &err) < 0) {
        call_fail(c, &err);
        return;
    }
    c->cg_cpu = c->cg != NULL && dsec__fn_cg_slot_cpu(c->cg, c->cgmode, &c->cpu0) == 0;
    /* RLIMIT_CPU is whole seconds and per process: a backstop when the
     * cgroup counts precisely, the limit itself when it cannot. */
    if (c->cpu_ms)
        c->t.cpu_s = (c->cpu_ms + 999) / 1000 + (c->cg_cpu ? 1 : 0);
    if (c->cg == NULL || c->use_rlimit_as)
        c->t.as_bytes = c->mem_bytes;
    int fds[2], nfds = 0;
    if (c->payload_fd >= 0)
        fds[nfds++] = c->payload_fd;
    if (c->bundle_fd >= 0)
        fds[nfds++] = c->bundle_fd;
    bool inl = c->payload_fd < 0;
    c->t0 = dsec_now_ns();
    c->phase = PH_RUN;
    /* A fresh worker's socket has room for the task: this does not wait. */
    if (send_task(w->task_fd, &c->t, inl ? c->strings : NULL, inl ? c->slen : 0, fds, nfds) < 0) {
        dsec_err_set(&err, DSEC_E_BACKEND, errno, "exec: handing the task to a worker");
        call_fail(c, &err);
        return;
    }
    if (c->in_len == 0) {
        close(w->stdin_fd);
        w->stdin_fd = -1;
    }
    c->deadline = c->t0 + c->timeout_ms * 1000000ull;
    if (watch(c, w->stdout_fd, DSEC_LOOP_IN, &c->wout, &err) < 0 ||
        watch(c, w->stderr_fd, DSEC_LOOP_IN, &c->werr, &err) < 0 ||
        (w->stdin_fd >= 0 && watch(c, w->stdin_fd, DSEC_LOOP_OUT, &c->win, &err) < 0) ||
        watch(c, w->task_fd, DSEC_LOOP_IN, &c->wtask, &err) < 0 ||
        watch(c, w->pidfd, DSEC_LOOP_IN, &c->wpid, &err) < 0) {
        call_fail(c, &err);
        return;
    }
    dsec_loop_set(c->tw, 0, next_wake(c, c->t0));
}

static void arm_wait(struct fn_call *c, uint64_t now)
{
    dsec_err err;
    if (c->wwait == NULL && c->tk.efd >= 0 &&
        dsec_loop_add(c->loop, c->tk.efd, DSEC_LOOP_IN, 0, call_event, c, &c->wwait, &err) < 0)
        c->wwait = NULL; /* the timer looks again */
    uint64_t at = now + TAKE_POLL_MS * 1000000ull;
    dsec_loop_set(c->tw, 0, at < c->take_deadline ? at : c->take_deadline);
}

/* A networked worker failed before its call: again when its zygote died under it (up to three
 * times, once the pool has seen that, within acquire_ms), else the call fails. */
static void net_failed(struct fn_call *c, bool lost, dsec_err *err)
{
    uint64_t now = dsec_now_ns();
    c->w = NULL; /* gone with the failure */
    if (lost && ++c->tries < 3 && now < c->take_deadline) {
        c->phase = PH_NET_RETRY;
        c->retry_until = now + 1000000000ull;
        dsec_loop_set(c->tw, 0, now + 20000000ull);
        return;
    }
    call_fail(c, err);
}

/* A networked sandbox's call: a slot, and a worker made in its namespace there. */
static void net_acquire(struct fn_call *c)
{
    dsec_err err;
    bool lost = false;
    uint64_t now = dsec_now_ns();
    c->phase = PH_NET;
    int rc = dsec__fn_worker_net_start(c->pools, c->pool, c->netns_fd, c->resolver, &c->tk,
                                       now >= c->take_deadline, c->acquire_ms, &c->w, &c->zctl_used,
                                       &lost, &err);
    if (rc == 1) {
        arm_wait(c, now);
        return;
    }
    wait_end(c);
    if (rc < 0) {
        net_failed(c, lost, &err);
        return;
    }
    c->phase = PH_NET_READY;
    if (watch(c, c->w->task_fd, DSEC_LOOP_IN, &c->wready, &err) < 0) {
        call_fail(c, &err);
        return;
    }
    dsec_loop_set(c->tw, 0, c->take_deadline);
}

/* The networked worker's READY, or the end of the wait for it (timed_out). */
static void net_ready(struct fn_call *c, bool timed_out)
{
    dsec_err err;
    bool lost = false;
    /* The watch goes first: a failed worker's socket is closed by net_ready, and a watch
     * removed after its fd closed stays in epoll while anything else holds the socket. */
    unwatch(&c->wready);
    int rc = dsec__fn_worker_net_ready(c->pools, c->w, timed_out, &lost, &err);
    if (rc == 1) { /* woken for nothing: watch again, the deadline stays */
        if (watch(c, c->w->task_fd, DSEC_LOOP_IN, &c->wready, &err) < 0)
            call_fail(c, &err);
        return;
    }
    if (rc < 0)
        net_failed(c, lost, &err);
    else
        launch(c);
}

/* Before the call runs: take a warm worker, or wait for one on the timer. */
static void acquire(struct fn_call *c)
{
    dsec_err err;
    uint64_t now = dsec_now_ns();
    int rc = dsec__fn_worker_try_take(c->pools, c->pool, &c->tk, now >= c->take_deadline,
                                      c->acquire_ms, &c->w, &err);
    if (rc == 1) {
        arm_wait(c, now);
        return;
    }
    wait_end(c);
    if (rc < 0)
        call_fail(c, &err);
    else
        launch(c);
}

static void call_event(dsec_loop_watch *lw, unsigned events, void *ud)
{
    struct fn_call *c = ud;
    if (events & DSEC_LOOP_CANCEL) {
        dsec_err err;
        dsec_err_set(&err, DSEC_E_CLOSED, 0,
                     c->t0 ? "exec: the function backend is stopping: the call was killed"
                           : "exec: the function backend is stopping: the call did not start");
        call_fail(c, &err);
        return;
    }
    if (lw == c->wwait) {
        uint64_t v;
        if (read(c->tk.efd, &v, sizeof v) < 0 && errno != EAGAIN && errno != EINTR)
            unwatch(&c->wwait); /* the timer looks again */
        if (c->phase == PH_NET)
            net_acquire(c);
        else
            acquire(c);
        return;
    }
    if (lw == c->wready) {
        net_ready(c, false);
        return;
    }
    if (lw == c->tw) {
        switch (c->phase) { /* before the task is sent */
        case PH_TAKE:
            acquire(c);
            return;
        case PH_NET:
            net_acquire(c);
            return;
        case PH_NET_READY:
            net_ready(c, true);
            return;
        case PH_NET_RETRY:
            if (dsec__fn_pool_zygote_changed(c->pools, c->pool, c->zctl_used) ||
                dsec_now_ns() >= c->retry_until)
                net_acquire(c);
            else
                dsec_loop_set(c->tw, 0, dsec_now_ns() + 20000000ull);
            return;
        }
        if (on_timer(c))
            return;
    } else if (lw == c->wout) {
        if (drain(c->w->stdout_fd, &c->o, 1, c->on_output, c->on_output_arg) == 0) {
            c->out_eof = true;
            unwatch(&c->wout);
        }
    } else if (lw == c->werr) {
        if (drain(c->w->stderr_fd, &c->e, 2, c->on_output, c->on_output_arg) == 0) {
            c->err_eof = true;
            unwatch(&c->werr);
        }
    } else if (lw == c->win) {
        write_stdin(c);
    } else if (lw == c->wtask) {
        read_task(c);
    } else if (lw == c->wpid) {
        c->w2_dead = true;
        unwatch(&c->wpid);
    }
    /* The supervisor sends its RESULT before it exits: read it before judging the call. */
    if (c->w2_dead && !c->got_result && !c->task_eof && !c->failed)
        read_task(c);
    if ((c->got_result || c->w2_dead) && c->out_eof && c->err_eof)
        finish(c);
}

int dsec__fn_call_start(struct fn_pools *pools, const struct fn_call_conf *cc,
                        const struct fn_target *tg, const struct fn_limits *lim,
                        struct fn_files *files, const dsec_exec_req *req, dsec_loop *loop,
                        uint64_t *cpu_used_us, uint64_t *calls, dsec_exec_done_fn done, void *ud,
                        dsec_err *err)
{
    struct plan *pl = dsec_calloc(1, sizeof *pl);
    struct fn_call *c = dsec_calloc(1, sizeof *c);
    int rc = -1;
    if (pl == NULL || c == NULL) {
        dsec_free(pl);
        dsec_free(c);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "exec: out of memory");
    }
    *c = (struct fn_call){.pools = pools,
                          .loop = loop,
                          .done = done,
                          .ud = ud,
                          .on_output = req->on_output,
                          .on_output_arg = req->on_output_arg,
                          .cpu_used_us = cpu_used_us,
                          .calls = calls,
                          .pool = tg->pool,
                          .acquire_ms = cc->acquire_ms,
                          .tk = {.efd = -1},
                          .payload_fd = -1,
                          .bundle_fd = -1,
                          .use_rlimit_as = cc->use_rlimit_as};
    if (make_plan(tg, lim, req, pl, err) < 0 || build_strings(pl, &c->strings, &c->slen, err) < 0)
        goto out;
    int bundle_fd = -1;
    uint64_t bundle_len = 0;
    if (dsec__fn_files_bundle(files, &bundle_fd, &bundle_len, err) < 0)
        goto out;
    if (bundle_fd >= 0 && (c->bundle_fd = fcntl(bundle_fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "exec: the files' bundle");
        goto out;
    }
    if (c->slen > FNP_INLINE_MAX && (c->payload_fd = sealed_memfd(c->strings, c->slen, err)) < 0)
        goto out;
    if (req->stdin_data != NULL && req->stdin_len > 0) {
        if ((c->in = dsec_malloc(req->stdin_len)) == NULL) {
            dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "exec: out of memory for %zu bytes of stdin",
                         req->stdin_len);
            goto out;
        }
        memcpy(c->in, req->stdin_data, req->stdin_len);
        c->in_len = req->stdin_len;
    }

    struct fnp_task *t = &c->t;
    t->h.magic = FNP_MAGIC;
    t->h.type = FNP_TASK;
    t->mode = pl->mode;
    t->flags = pl->flags;
    t->argc = (uint32_t)pl->argc;
    t->envc = (uint32_t)pl->nenv;
    t->strings_len = c->slen;
    t->nproc = (uint32_t)pl->nproc;
    t->nofile = lim->nofile;
    t->fsize_bytes = pl->fsize_mb << 20;
    if (c->payload_fd >= 0)
        t->flags |= FNP_TASK_PAYLOAD_FD;
    if (c->bundle_fd >= 0) {
        t->flags |= FNP_TASK_BUNDLE_FD;
        t->bundle_len = bundle_len;
    }
    t->h.len = (uint32_t)(sizeof *t + (c->payload_fd >= 0 ? 0 : c->slen));
    c->mem_bytes = pl->mem_mb << 20;
    c->nproc = pl->nproc;
    c->cpu_ms = pl->cpu_ms;
    c->o.max = c->e.max = pl->output_max;
    c->timeout_ms = req->timeout_ms ? req->timeout_ms : lim->timeout_ms;
    if (c->timeout_ms == 0 || c->timeout_ms > cc->max_timeout_ms)
        c->timeout_ms = cc->max_timeout_ms;

    /* A sandbox with a network gets a worker made for this call in its namespace (the warm
     * ones were made without knowing the sandbox), on the loop like the rest. */
    c->netns_fd = tg->netns_fd;
    c->resolver = tg->resolver;
    c->phase = tg->netns_fd >= 0 ? PH_NET : PH_TAKE;
    c->take_deadline = dsec_now_ns() + cc->acquire_ms * 1000000ull;
    /* Everything after this runs on the loop: the timer fires at once and takes a worker. */
    if (dsec_loop_add(loop, -1, 0, dsec_loop_now_ns(), call_event, c, &c->tw, err) < 0) {
        dsec_err_wrap(err, "exec");
        goto out;
    }
    c = NULL;
    rc = 0;
out:
    if (c != NULL)
        call_free(c);
    dsec_free(pl->argv);
    dsec_free(pl);
    return rc;
}
