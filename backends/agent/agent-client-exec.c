/* agent-client-exec.c - exec (waited for, or on the node's loop), kill and setup calls */
#define _GNU_SOURCE
#include "backends/agent/agent-client-int.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "backends/agent/agent-proto.h"
#include "dsec/alloc.h"

#define KILL_TIMEOUT_MS 5000u

struct outbuf {
    uint8_t *data;
    size_t len, cap;
};

static int outbuf_add(struct outbuf *o, const uint8_t *p, size_t n, size_t max)
{
    if (o->len + n > max)
        n = max - o->len; /* the agent caps already; this only guards the buffer */
    if (n == 0)
        return 0;
    if (o->cap - o->len < n) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap - o->len < n)
            cap *= 2;
        if (cap > max)
            cap = max;
        uint8_t *nb = dsec_realloc(o->data, cap);
        if (nb == NULL)
            return -1;
        o->data = nb;
        o->cap = cap;
    }
    memcpy(o->data + o->len, p, n);
    o->len += n;
    return 0;
}

/* empty_ok: a shell session's start, whose argv may be empty (the default shell). */
int dsec__agent_check_exec_req(const dsec_exec_req *req, bool empty_ok, size_t *plen, dsec_err *err)
{
    if (req == NULL || ((req->argv == NULL || req->argc == 0) && !(empty_ok && req->argc == 0)))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec needs at least one argument");
    if (req->argc > DSEC__AGENT_ARGV_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "exec: %zu arguments, at most %u", req->argc,
                            DSEC__AGENT_ARGV_MAX);
    if (req->nenv > DSEC__AGENT_ENV_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "exec: %zu environment variables, at most %u",
                            req->nenv, DSEC__AGENT_ENV_MAX);
    if (req->nenv > 0 && req->env == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: env is NULL but nenv is %zu", req->nenv);
    if (req->stdin_len > DSEC__AGENT_STDIN_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "exec: stdin of %zu bytes, at most %u",
                            req->stdin_len, DSEC__AGENT_STDIN_MAX);
    if (req->stdin_len > 0 && req->stdin_data == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: stdin_data is NULL but stdin_len is %zu",
                            req->stdin_len);
    size_t n = 8 + 8 + 4 + 4 + 4 + 4 + 4 + req->stdin_len;
    size_t cl = req->cwd ? strlen(req->cwd) : 0, ul = req->user ? strlen(req->user) : 0;
    if (cl > DSEC__AGENT_PATH_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "exec: cwd longer than %u bytes",
                            DSEC__AGENT_PATH_MAX);
    if (ul > DSEC__AGENT_USER_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "exec: user longer than %u bytes",
                            DSEC__AGENT_USER_MAX);
    n += cl + ul;
    for (size_t i = 0; i < req->argc; i++) {
        if (req->argv[i] == NULL)
            return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: argument %zu is NULL", i);
        size_t l = strlen(req->argv[i]);
        if (l > DSEC__AGENT_ARG_LEN_MAX)
            return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                                "exec: argument %zu is %zu bytes long, at most %u", i, l,
                                DSEC__AGENT_ARG_LEN_MAX);
        n += 4 + l;
    }
    for (size_t i = 0; i < req->nenv; i++) {
        const char *k = req->env[i].key, *v = req->env[i].value;
        if (k == NULL || k[0] == 0 || strchr(k, '=') != NULL)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "exec: environment variable %zu has no name or one with '='", i);
        size_t kl = strlen(k), vl = v ? strlen(v) : 0;
        if (kl > DSEC__AGENT_ARG_LEN_MAX || vl > DSEC__AGENT_ARG_LEN_MAX)
            return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                                "exec: environment variable %s is longer than %u bytes", k,
                                DSEC__AGENT_ARG_LEN_MAX);
        n += 8 + kl + vl;
    }
    *plen = n;
    return 0;
}

/* The EXEC request for req; *id is its request id. */
static uint8_t *exec_frame(dsec_agent *a, const dsec_exec_req *req, size_t out_max, size_t *flen,
                           uint32_t *id, dsec_err *err)
{
    size_t plen = 0;
    if (dsec__agent_check_exec_req(req, false, &plen, err) < 0)
        return NULL;
    if (req->session)
        plen += 8;
    uint8_t *p;
    uint8_t *frame = dsec__agent_new_frame(a, DSEC__AGENT_T_EXEC, plen, &p, err);
    if (frame == NULL)
        return NULL;
    p = dsec__agent_put_u64(p, req->timeout_ms);
    p = dsec__agent_put_u64(p, out_max);
    p = dsec__agent_put_exec_body(p, req);
    if (req->session) /* only then: an agent of before sessions takes the frame as ever */
        p = dsec__agent_put_u64(p, req->session);
    *id = dsec__agent_get_u32le(frame + 5);
    *flen = (size_t)(p - frame);
    return frame;
}

/* The fields EXEC and PSTART share after timeout_ms (and EXEC's output_max): cwd to stdin. */
uint8_t *dsec__agent_put_exec_body(uint8_t *p, const dsec_exec_req *req)
{
    p = dsec__agent_put_bytes(p, req->cwd, req->cwd ? strlen(req->cwd) : 0);
    p = dsec__agent_put_bytes(p, req->user, req->user ? strlen(req->user) : 0);
    p = dsec__agent_put_u32(p, (uint32_t)req->argc);
    for (size_t i = 0; i < req->argc; i++)
        p = dsec__agent_put_bytes(p, req->argv[i], strlen(req->argv[i]));
    p = dsec__agent_put_u32(p, (uint32_t)req->nenv);
    for (size_t i = 0; i < req->nenv; i++) {
        const char *v = req->env[i].value ? req->env[i].value : "";
        p = dsec__agent_put_bytes(p, req->env[i].key, strlen(req->env[i].key));
        p = dsec__agent_put_bytes(p, v, strlen(v));
    }
    return dsec__agent_put_bytes(p, req->stdin_data, req->stdin_len);
}

/* What one exec has received so far. */
struct exec_state {
    uint32_t id;
    size_t out_max;
    struct outbuf out[3];
    dsec_agent_output_fn on_output;
    void *arg;
};

/* One frame of an exec's answer: EXEC_MORE (output, keep reading), EXEC_EXITED (*res is
 * filled and owns the output), EXEC_REFUSED (an ERROR answer: the connection is still in
 * step) or EXEC_BROKEN (the stream is out of step), err set for the last two. */
static int exec_frame_in(struct exec_state *x, uint8_t type, uint32_t rid, const uint8_t *pl,
                         size_t pn, dsec_exec_result *res, dsec_err *err)
{
    if (rid != x->id) {
        dsec_err_set(err, DSEC_E_DECODE, 0,
                     "agent answered request %" PRIu32 " while exec %" PRIu32 " ran", rid, x->id);
        return EXEC_BROKEN;
    }
    dsec__agent_rd r = {.p = pl, .end = pl + pn};
    if (type == DSEC__AGENT_T_OUTPUT) {
        uint8_t stream = dsec__agent_get_u8(&r);
        size_t dl;
        const uint8_t *d = dsec__agent_get_bytes(&r, DSEC__AGENT_FRAME_MAX, &dl);
        if (!dsec__agent_done(&r) || (stream != 1 && stream != 2)) {
            dsec_err_set(err, DSEC_E_DECODE, 0, "agent sent a malformed output frame");
            return EXEC_BROKEN;
        }
        if (x->on_output && dl > 0)
            x->on_output(x->arg, stream, d, dl);
        if (outbuf_add(&x->out[stream], d, dl, x->out_max) < 0) {
            dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "exec: buffering %zu bytes of output",
                         x->out[stream].len + dl);
            return EXEC_BROKEN;
        }
        return EXEC_MORE;
    }
    if (type == DSEC__AGENT_T_EXIT) {
        memset(res, 0, sizeof *res);
        res->exit_code = (int32_t)dsec__agent_get_u32(&r);
        res->signal = (int32_t)dsec__agent_get_u32(&r);
        uint8_t flags = dsec__agent_get_u8(&r);
        res->duration_us = dsec__agent_get_u64(&r);
        res->cpu_us = dsec__agent_get_u64(&r);
        res->peak_rss_kb = dsec__agent_get_u64(&r);
        if (!dsec__agent_done(&r)) {
            memset(res, 0, sizeof *res);
            dsec_err_set(err, DSEC_E_DECODE, 0, "agent sent a malformed exit frame");
            return EXEC_BROKEN;
        }
        res->timed_out = flags & DSEC__AGENT_X_TIMED_OUT;
        res->stdout_truncated = flags & DSEC__AGENT_X_STDOUT_TRUNC;
        res->stderr_truncated = flags & DSEC__AGENT_X_STDERR_TRUNC;
        res->interrupted = flags & DSEC__AGENT_X_INTERRUPTED;
        res->session_ended = flags & DSEC__AGENT_X_SESSION_ENDED;
        res->stdout_data = x->out[1].data;
        res->stdout_len = x->out[1].len;
        res->stderr_data = x->out[2].data;
        res->stderr_len = x->out[2].len;
        x->out[1] = x->out[2] = (struct outbuf){0};
        return EXEC_EXITED;
    }
    if (type == DSEC__AGENT_T_ERROR) {
        /* Refused before it started: nothing else comes for this request. */
        dsec__agent_error_frame(pl, pn, err);
        return EXEC_REFUSED;
    }
    dsec_err_set(err, DSEC_E_DECODE, 0, "agent sent frame type %u during exec", type);
    return EXEC_BROKEN;
}

static void exec_state_release(struct exec_state *x)
{
    dsec_free(x->out[1].data);
    dsec_free(x->out[2].data);
    x->out[1] = x->out[2] = (struct outbuf){0};
}

int dsec_agent_exec(dsec_agent *a, const dsec_exec_req *req, dsec_agent_output_fn on_output,
                    void *arg, dsec_exec_result *res, dsec_err *err)
{
    if (res == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: result is NULL");
    memset(res, 0, sizeof *res);
    if (dsec__agent_check_open(a, err) < 0)
        return -1;
    struct exec_state x = {.out_max =
                               req && req->output_max ? req->output_max : DSEC_EXEC_OUTPUT_DEFAULT,
                           .on_output = on_output,
                           .arg = arg};
    size_t flen;
    uint8_t *frame = exec_frame(a, req, x.out_max, &flen, &x.id, err);
    if (frame == NULL)
        return -1;
    /* The agent enforces the command's timeout; this deadline only catches a wedged agent. */
    uint64_t deadline =
        req->timeout_ms ? dsec__agent_deadline_after(req->timeout_ms + EXEC_GRACE_MS) : 0;
    int rc = dsec__agent_send_all(a, frame, flen, deadline, err);
    dsec_free(frame);
    int st = rc < 0 ? EXEC_BROKEN : EXEC_MORE;
    while (st == EXEC_MORE) {
        uint8_t type = 0;
        uint32_t rid = 0;
        const uint8_t *pl = NULL;
        size_t pn = 0;
        if (dsec__agent_recv_frame(a, deadline, &type, &rid, &pl, &pn, err) < 0)
            st = EXEC_BROKEN;
        else
            st = exec_frame_in(&x, type, rid, pl, pn, res, err);
    }
    exec_state_release(&x);
    if (st == EXEC_EXITED)
        return 0;
    if (st == EXEC_BROKEN)
        dsec__agent_mark_broken(a);
    return -1;
}

struct exec_run {
    struct loop_run run; /* first: the run is the exec */
    struct exec_state x;
    dsec_exec_result res;
    dsec_agent_exec_done_fn done;
    void *ud;
};

static int exec_run_frame(struct loop_run *lr, uint8_t type, uint32_t rid, const uint8_t *pl,
                          size_t pn, dsec_err *err)
{
    struct exec_run *r = (struct exec_run *)lr;
    return exec_frame_in(&r->x, type, rid, pl, pn, &r->res, err);
}

static void exec_run_end(struct loop_run *lr, int st, dsec_err *err)
{
    struct exec_run *r = (struct exec_run *)lr;
    exec_state_release(&r->x);
    dsec_agent_exec_done_fn done = r->done;
    void *ud = r->ud;
    dsec_exec_result res = r->res;
    dsec_free(r);
    done(ud, st == EXEC_EXITED ? 0 : -1, st == EXEC_EXITED ? &res : NULL, err);
}

int dsec_agent_exec_start(dsec_agent *a, struct dsec_loop *loop, const dsec_exec_req *req,
                          dsec_agent_output_fn on_output, void *arg, dsec_agent_exec_done_fn done,
                          void *ud, dsec_err *err)
{
    if (dsec__agent_check_open(a, err) < 0)
        return -1;
    struct exec_run *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "exec: a command in flight");
    r->x = (struct exec_state){.out_max = req && req->output_max ? req->output_max
                                                                 : DSEC_EXEC_OUTPUT_DEFAULT,
                               .on_output = on_output,
                               .arg = arg};
    r->run.frame = exec_frame(a, req, r->x.out_max, &r->run.flen, &r->x.id, err);
    if (r->run.frame == NULL) {
        dsec_free(r);
        return -1;
    }
    r->run.deadline_ns =
        req->timeout_ms ? dsec_loop_now_ns() + (req->timeout_ms + EXEC_GRACE_MS) * 1000000ull : 0;
    r->run.what = "the command";
    r->run.frame_in = exec_run_frame;
    r->run.end = exec_run_end;
    r->done = done;
    r->ud = ud;
    return dsec__agent_loop_run_own(&r->run, a, loop, err);
}

int dsec_agent_kill(const char *path, int sig, dsec_err *err)
{
    if (sig <= 0 || sig > 64)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "kill: no signal %d", sig);
    dsec_agent *a;
    if (dsec_agent_connect(&a, path, KILL_TIMEOUT_MS, err) < 0)
        return dsec_err_wrap(err, "kill");
    uint8_t *p;
    uint8_t *frame = dsec__agent_new_frame(a, DSEC__AGENT_T_KILL, 4, &p, err);
    int rc = -1;
    if (frame) {
        p = dsec__agent_put_u32(p, (uint32_t)sig);
        rc = dsec__agent_request_ok(a, frame, (size_t)(p - frame), err);
    }
    dsec_agent_free(a);
    return rc;
}

int dsec_agent_setup(dsec_agent *a, const char *const *vars, size_t n, const char *workdir,
                     const char *user, dsec_err *err)
{
    if (dsec__agent_check_open(a, err) < 0)
        return -1;
    if (n > DSEC__AGENT_ENV_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "agent setup: %zu variables (most %u)", n,
                            DSEC__AGENT_ENV_MAX);
    size_t wl = strlen(workdir), ul = strlen(user), len = 4 + 4 + wl + 4 + ul;
    for (size_t i = 0; i < n; i++)
        len += 4 + strlen(vars[i]);
    uint8_t *p;
    uint8_t *frame = dsec__agent_new_frame(a, DSEC__AGENT_T_SETUP, len, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u32(p, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        p = dsec__agent_put_bytes(p, vars[i], strlen(vars[i]));
    p = dsec__agent_put_bytes(p, workdir, wl);
    p = dsec__agent_put_bytes(p, user, ul);
    return dsec__agent_request_ok(a, frame, (size_t)(p - frame), err);
}
