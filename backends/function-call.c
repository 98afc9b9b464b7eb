/* function-call.c - one function call: the exec request mapped onto a task, a warm worker taken,
 * its output and limits watched until it ends. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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

#include "backends/function-int.h"
#include "backends/function-proto.h"
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
    union {
        char buf[CMSG_SPACE(sizeof(int) * 2)];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = inline_len ? 2 : 1};
    if (nfds > 0) {
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
    return n == (ssize_t)(sizeof *t + inline_len) ? 0 : -1;
}

struct out {
    uint8_t *p;
    size_t len, cap, max;
    bool truncated;
};

/* Drain fd into o (up to its cap, the rest is dropped). Returns 0 at EOF, 1 when more may come. */
static int drain(int fd, struct out *o)
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
    }
}

enum { KILL_NONE, KILL_TIMEOUT, KILL_CPU };

static int pidfd_kill(int pidfd)
{
    return (int)syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
}

int dsec__fn_call(struct fn_pools *pools, const struct fn_call_conf *cc, const struct fn_target *tg,
                  const struct fn_limits *lim, struct fn_files *files, const dsec_exec_req *req,
                  dsec_exec_result *res, dsec_err *err)
{
    struct plan *pl = dsec_calloc(1, sizeof *pl);
    char *strings = NULL;
    size_t slen = 0;
    int payload_fd = -1, rc = -1;
    struct fn_worker *w = NULL;
    struct out o = {0}, e = {0};
    bool sigpipe_blocked = false;
    sigset_t pipe_set, old_mask;
    if (pl == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "exec: out of memory");
    if (make_plan(tg, lim, req, pl, err) < 0 || build_strings(pl, &strings, &slen, err) < 0)
        goto out;
    int bundle_fd = -1;
    uint64_t bundle_len = 0;
    if (dsec__fn_files_bundle(files, &bundle_fd, &bundle_len, err) < 0)
        goto out;
    if (slen > FNP_INLINE_MAX && (payload_fd = sealed_memfd(strings, slen, err)) < 0)
        goto out;

    struct fnp_task t;
    memset(&t, 0, sizeof t);
    t.h.magic = FNP_MAGIC;
    t.h.type = FNP_TASK;
    t.mode = pl->mode;
    t.flags = pl->flags;
    t.argc = (uint32_t)pl->argc;
    t.envc = (uint32_t)pl->nenv;
    t.strings_len = slen;
    t.nproc = (uint32_t)pl->nproc;
    t.nofile = lim->nofile;
    t.fsize_bytes = pl->fsize_mb << 20;
    int fds[2], nfds = 0;
    if (payload_fd >= 0) {
        t.flags |= FNP_TASK_PAYLOAD_FD;
        fds[nfds++] = payload_fd;
    }
    if (bundle_fd >= 0) {
        t.flags |= FNP_TASK_BUNDLE_FD;
        t.bundle_len = bundle_len;
        fds[nfds++] = bundle_fd;
    }
    t.h.len = (uint32_t)(sizeof t + (payload_fd >= 0 ? 0 : slen));

    /* A sandbox with a network gets a worker made for this call in its
     * namespace; the warm ones were made without knowing the sandbox. */
    if ((tg->netns_fd >= 0 ? dsec__fn_worker_take_net(pools, tg->pool, tg->netns_fd, tg->resolver,
                                                      cc->acquire_ms, &w, err)
                           : dsec__fn_worker_take(pools, tg->pool, cc->acquire_ms, &w, err)) < 0)
        goto out;
    int cgmode;
    struct fn_cg_slot *cg = dsec__fn_worker_cg(pools, w, &cgmode);
    uint64_t mem_bytes = pl->mem_mb << 20;
    if (cg != NULL && dsec__fn_cg_slot_limits(cg, cgmode, mem_bytes, pl->nproc + 2, err) < 0)
        goto out;
    uint64_t cpu0 = 0;
    bool cg_cpu = cg != NULL && dsec__fn_cg_slot_cpu(cg, cgmode, &cpu0) == 0;
    /* RLIMIT_CPU is whole seconds and per process: a backstop when the
     * cgroup counts precisely, the limit itself when it cannot. */
    if (pl->cpu_ms)
        t.cpu_s = (pl->cpu_ms + 999) / 1000 + (cg_cpu ? 1 : 0);
    if (cg == NULL || cc->use_rlimit_as)
        t.as_bytes = mem_bytes;

    if (req->stdin_len > 0) {
        sigemptyset(&pipe_set);
        sigaddset(&pipe_set, SIGPIPE);
        pthread_sigmask(SIG_BLOCK, &pipe_set, &old_mask);
        sigpipe_blocked = true;
    }
    uint64_t t0 = dsec__fn_now_ns();
    if (send_task(w->task_fd, &t, payload_fd >= 0 ? NULL : strings, payload_fd >= 0 ? 0 : slen, fds,
                  nfds) < 0) {
        dsec_err_set(err, DSEC_E_BACKEND, errno, "exec: handing the task to a worker");
        goto out;
    }
    if (payload_fd >= 0) {
        close(payload_fd);
        payload_fd = -1;
    }
    const uint8_t *in = req->stdin_data;
    size_t in_left = req->stdin_data ? req->stdin_len : 0;
    if (in_left == 0) {
        close(w->stdin_fd);
        w->stdin_fd = -1;
    }

    o.max = pl->output_max;
    e.max = pl->output_max;
    uint64_t timeout_ms = req->timeout_ms ? req->timeout_ms : lim->timeout_ms;
    if (timeout_ms == 0 || timeout_ms > cc->max_timeout_ms)
        timeout_ms = cc->max_timeout_ms;
    uint64_t deadline = t0 + timeout_ms * 1000000ull, grace = 0;
    int killed = KILL_NONE;
    bool got_result = false, w2_dead = false, out_eof = false, err_eof = false, task_eof = false;
    struct fnp_result result;
    struct fnp_failure failure;
    bool failed = false;
    memset(&failure, 0, sizeof failure);
    memset(&result, 0, sizeof result);
    uint64_t cpu_used_ns = 0;

    while (!((got_result || w2_dead) && out_eof && err_eof)) {
        uint64_t now = dsec__fn_now_ns();
        if (killed == KILL_NONE && now >= deadline) {
            pidfd_kill(w->pidfd);
            killed = KILL_TIMEOUT;
            grace = now + KILL_GRACE_NS;
        }
        if (grace && now >= grace)
            break; /* something holds the pipes open past the namespace's death: give up on them */
        uint64_t next = grace ? grace : deadline;
        if (pl->cpu_ms && cg_cpu && killed == KILL_NONE && next > now + CPU_POLL_MS * 1000000ull)
            next = now + CPU_POLL_MS * 1000000ull;
        struct pollfd p[5];
        int np = 0, i_out = -1, i_err = -1, i_in = -1, i_task = -1, i_pid = -1;
        if (!out_eof) {
            i_out = np;
            p[np++] = (struct pollfd){.fd = w->stdout_fd, .events = POLLIN};
        }
        if (!err_eof) {
            i_err = np;
            p[np++] = (struct pollfd){.fd = w->stderr_fd, .events = POLLIN};
        }
        if (w->stdin_fd >= 0) {
            i_in = np;
            p[np++] = (struct pollfd){.fd = w->stdin_fd, .events = POLLOUT};
        }
        if (!task_eof) {
            i_task = np;
            p[np++] = (struct pollfd){.fd = w->task_fd, .events = POLLIN};
        }
        if (!w2_dead) {
            i_pid = np;
            p[np++] = (struct pollfd){.fd = w->pidfd, .events = POLLIN};
        }
        int ms = next <= now ? 0 : (int)((next - now + 999999ull) / 1000000ull);
        int n = poll(p, (nfds_t)np, ms);
        if (n < 0 && errno != EINTR) {
            dsec_err_set(err, DSEC_E_IO, errno, "exec: poll");
            pidfd_kill(w->pidfd);
            goto out;
        }
        if (n > 0) {
            if (i_out >= 0 && p[i_out].revents)
                out_eof = drain(w->stdout_fd, &o) == 0;
            if (i_err >= 0 && p[i_err].revents)
                err_eof = drain(w->stderr_fd, &e) == 0;
            if (i_in >= 0 && p[i_in].revents) {
                ssize_t wr = (p[i_in].revents & POLLOUT) ? write(w->stdin_fd, in, in_left) : -1;
                if (wr > 0) {
                    in += wr;
                    in_left -= (size_t)wr;
                }
                if (in_left == 0 || (wr < 0 && errno != EAGAIN && errno != EINTR)) {
                    close(w->stdin_fd); /* all written, or the call stopped reading */
                    w->stdin_fd = -1;
                }
            }
            /* Only the supervisor holds the worker's end now (W3 closed
             * it before the call's code ran): what comes here is its
             * RESULT, or a set-up failure of W2, or of W3 before the call. */
            if (i_task >= 0 && p[i_task].revents) {
                union {
                    struct fnp_hdr h;
                    struct fnp_result r;
                    struct fnp_failure f;
                } m;
                ssize_t r = recv(w->task_fd, &m, sizeof m, MSG_DONTWAIT);
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                    task_eof = true;
                } else if (r > 0 && (size_t)r >= sizeof m.h && m.h.magic == FNP_MAGIC &&
                           m.h.len == (uint32_t)r) {
                    if (m.h.type == FNP_RESULT && (size_t)r == sizeof m.r) {
                        result = m.r;
                        got_result = true;
                    } else if (m.h.type == FNP_WORKER_FAILED && (size_t)r == sizeof m.f) {
                        failure = m.f;
                        failure.stage[sizeof failure.stage - 1] = '\0';
                        failure.msg[sizeof failure.msg - 1] = '\0';
                        failed = true;
                    }
                }
            }
            if (i_pid >= 0 && p[i_pid].revents)
                w2_dead = true;
        }
        if (pl->cpu_ms && cg_cpu && killed == KILL_NONE) {
            uint64_t c;
            if (dsec__fn_cg_slot_cpu(cg, cgmode, &c) == 0 && c - cpu0 > pl->cpu_ms * 1000000ull) {
                pidfd_kill(w->pidfd);
                killed = KILL_CPU;
                grace = dsec__fn_now_ns() + KILL_GRACE_NS;
            }
        }
    }
    uint64_t t1 = dsec__fn_now_ns();
    if (cg_cpu && dsec__fn_cg_slot_cpu(cg, cgmode, &cpu_used_ns) == 0 && cpu_used_ns >= cpu0)
        cpu_used_ns -= cpu0;
    else
        cpu_used_ns = (result.utime_us + result.stime_us) * 1000ull;
    if (failed && killed == KILL_NONE) {
        int code = strcmp(failure.stage, "cwd") == 0                ? DSEC_E_INVALID
                   : strcmp(failure.stage, "dependency files") == 0 ? DSEC_E_IO
                                                                    : DSEC_E_BACKEND;
        dsec_err_set(err, code, failure.err, "exec: %s", failure.msg);
        goto out;
    }
    memset(res, 0, sizeof *res);
    if (killed == KILL_TIMEOUT) {
        res->timed_out = true;
        res->exit_code = -1;
        res->signal = SIGKILL;
    } else if (killed == KILL_CPU) {
        res->exit_code = -1;
        res->signal = SIGXCPU;
    } else if (got_result) {
        int st = result.status;
        if (WIFEXITED(st)) {
            res->exit_code = WEXITSTATUS(st);
        } else {
            res->exit_code = -1;
            res->signal = WIFSIGNALED(st) ? WTERMSIG(st) : SIGKILL;
        }
    } else {
        dsec_err_set(err, DSEC_E_BACKEND, 0,
                     "exec: the worker running the call died before reporting (was its "
                     "supervisor killed from outside?)");
        goto out;
    }
    res->stdout_data = o.len ? o.p : NULL;
    res->stdout_len = o.len;
    res->stdout_truncated = o.truncated;
    res->stderr_data = e.len ? e.p : NULL;
    res->stderr_len = e.len;
    res->stderr_truncated = e.truncated;
    if (o.len == 0)
        dsec_free(o.p);
    if (e.len == 0)
        dsec_free(e.p);
    o.p = e.p = NULL;
    res->duration_us = (t1 - t0) / 1000ull;
    res->cpu_us = cpu_used_ns / 1000ull;
    res->peak_rss_kb = result.maxrss_kb;
    rc = 0;

out:
    if (sigpipe_blocked) {
        /* A write to a closed stdin raised SIGPIPE at this thread: consume it. */
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &zero) > 0) {
        }
        pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    }
    if (w != NULL)
        dsec__fn_worker_done(pools, w);
    if (payload_fd >= 0)
        close(payload_fd);
    dsec_free(o.p);
    dsec_free(e.p);
    dsec_free(strings);
    if (pl != NULL)
        dsec_free(pl->argv);
    dsec_free(pl);
    return rc;
}
