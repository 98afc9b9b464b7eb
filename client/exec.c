/* exec.c - libdsec's commands in a sandbox: exec (its output whole or streamed) and background
 * processes. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "client/internal.h"
#include "dsec/alloc.h"
#include "dsec/client.h"

/* How much longer than its command's own timeout an exec waits for the answer: the node's
 * way back, a busy host. */
#define EXEC_ANSWER_SLACK_MS 30000u

/* How long a streamed exec waits for chunks still missing when its result,
 * which holds the whole output, has come: chunks are published before the
 * result, but across a NATS gateway they travel another way and can come
 * later, or not at all (interest not yet known on the node's side). */
#define STREAM_GRACE_MS 2000

/* The chunks of one streamed exec, handed to the caller's callback in order.
 * Under mu: the callback runs with it held, so it never runs twice at once. */
struct exec_stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t got;    /* chunks delivered to the callback */
    uint64_t next;   /* the seq the next chunk should have */
    size_t bytes[3]; /* delivered per stream (1 stdout, 2 stderr) */
    bool gap;        /* a chunk came after one that never did */
    bool closed;     /* the exec is answered: later chunks are dropped */
    dsec_exec_output_fn fn;
    void *ud;
    const char *id;
};

static uint64_t one_key(const dsec_msg *m, void *ud)
{
    return 0; /* one ordering key: chunks reach the callback in the order they were sent */
}

static void on_chunk(dsec_actor *a, dsec_msg *m, void *ud)
{
    struct exec_stream *st = ud;
    dsec_decoder *dec = dsec_decoder_new(NULL);
    dsec_msg_exec_chunk ch;
    dsec_err err;
    bool ok =
        dec != NULL &&
        dsec_decode(dec, DSEC_MSG_EXEC_CHUNK, dsec_msg_data(m), dsec_msg_len(m), &ch, &err) == 0 &&
        strcmp(ch.id, st->id) == 0;
    pthread_mutex_lock(&st->mu);
    if (ok && !st->closed) {
        if (ch.seq != st->next)
            st->gap = true;
        st->next = ch.seq + 1;
        st->fn(st->ud, (int)ch.stream, ch.data.ptr, ch.data.len);
        if (ch.stream == 1 || ch.stream == 2)
            st->bytes[ch.stream] += ch.data.len;
    }
    st->got++;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    dsec_decoder_free(dec);
}

/* Wait until the callback has seen the result's r->chunks chunks; the result
 * is sent after the last chunk, but the two travel on different
 * subscriptions. When chunks are still missing and the result holds the
 * whole output (nothing truncated, every chunk that came was in order), the
 * callback gets what the missing ones carried from the result instead. */
static int stream_wait(struct exec_stream *st, const dsec_msg_exec_result *r, int timeout_ms,
                       dsec_err *err)
{
    uint64_t n = r->chunks;
    bool whole = !r->stdout_truncated && !r->stderr_truncated;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    int wait_ms = whole && timeout_ms > STREAM_GRACE_MS ? STREAM_GRACE_MS : timeout_ms;
    until.tv_sec += wait_ms / 1000;
    until.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    int rc = 0;
    pthread_mutex_lock(&st->mu);
    while (st->got < n)
        if (pthread_cond_timedwait(&st->cv, &st->mu, &until) != 0)
            break;
    if (st->got < n) {
        if (whole && !st->gap && st->bytes[1] <= r->stdout_data.len &&
            st->bytes[2] <= r->stderr_data.len) {
            if (r->stdout_data.len > st->bytes[1])
                st->fn(st->ud, 1, r->stdout_data.ptr + st->bytes[1],
                       r->stdout_data.len - st->bytes[1]);
            if (r->stderr_data.len > st->bytes[2])
                st->fn(st->ud, 2, r->stderr_data.ptr + st->bytes[2],
                       r->stderr_data.len - st->bytes[2]);
        } else {
            rc = dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                              "exec in %s: %" PRIu64 " of %" PRIu64
                              " output chunks arrived, and the result "
                              "cannot stand in for the rest (%s)",
                              st->id, st->got, n,
                              !whole    ? "its output was truncated"
                              : st->gap ? "a chunk came after a lost one"
                                        : "the chunks carried more than it holds");
        }
    }
    st->closed = true;
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static int exec_impl(dsec_client *c, const char *id, const dsec_exec_opts *o,
                     dsec_exec_output_fn fn, void *ud, dsec_exec_reply *res, dsec_err *err);

int dsec_exec(dsec_client *c, const char *id, const dsec_exec_opts *o, dsec_exec_reply *res,
              dsec_err *err)
{
    return exec_impl(c, id, o, NULL, NULL, res, err);
}

int dsec_exec_stream(dsec_client *c, const char *id, const dsec_exec_opts *o,
                     dsec_exec_output_fn fn, void *ud, dsec_exec_reply *res, dsec_err *err)
{
    if (fn == NULL) {
        memset(res, 0, sizeof *res);
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec_stream: no output callback");
    }
    return exec_impl(c, id, o, fn, ud, res, err);
}

/* The streamed exec's subscription, subj (of n bytes) its subject: made before the request goes
 * out on the same connection, so the server has it before the node can publish. *sa is the
 * caller's to free with dsec_actor_free. */
static int exec_subscribe(dsec_client *c, struct exec_stream *st, char *subj, size_t n,
                          dsec_actor **sa, dsec_err *err)
{
    char sid[33];
    dsec_bus_new_id(sid);
    /* under this connection's inbox prefix: the one subtree a tenant may subscribe to */
    snprintf(subj, n, "%s.exec.%s", dsec_bus_inbox_prefix(c->bus), sid);
    if (dsec_actor_new(sa, c->bus, "exec-stream", err) < 0)
        return -1;
    dsec_actor_set_key(*sa, one_key, NULL);
    return dsec_actor_on(*sa, subj, NULL, on_chunk, st, err);
}

/* The result into the caller's reply, its output copied (freed by dsec_exec_reply_release). */
static int exec_answer(const dsec_msg_exec_result *r, dsec_exec_reply *res, dsec_err *err)
{
    res->exit_code = (int)r->exit_code;
    res->signal = (int)r->signal;
    res->timed_out = r->timed_out;
    res->interrupted = r->interrupted;
    res->session_ended = r->session_ended;
    res->out_truncated = r->stdout_truncated;
    res->err_truncated = r->stderr_truncated;
    res->duration_us = r->duration_us;
    res->cpu_us = r->cpu_us;
    res->peak_rss_kb = r->peak_rss_kb;
    res->out = dsec_malloc(r->stdout_data.len + 1);
    res->err_out = dsec_malloc(r->stderr_data.len + 1);
    if (res->out == NULL || res->err_out == NULL) {
        dsec_exec_reply_release(res);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    if (r->stdout_data.len)
        memcpy(res->out, r->stdout_data.ptr, r->stdout_data.len);
    if (r->stderr_data.len)
        memcpy(res->err_out, r->stderr_data.ptr, r->stderr_data.len);
    res->out[r->stdout_data.len] = 0;
    res->err_out[r->stderr_data.len] = 0;
    res->out_len = r->stdout_data.len;
    res->err_len = r->stderr_data.len;
    return 0;
}

static int exec_impl(dsec_client *c, const char *id, const dsec_exec_opts *o,
                     dsec_exec_output_fn fn, void *ud, dsec_exec_reply *res, dsec_err *err)
{
    memset(res, 0, sizeof *res);
    dsec_msg_exec m = {.id = id,
                       .argv = {(const char **)o->argv, dsec__client_count_nt(o->argv)},
                       .cwd = o->cwd,
                       .stdin_data = {o->stdin_data, o->stdin_len},
                       .timeout_ms = o->timeout_ms,
                       .user = o->user,
                       .rollout_id = o->rollout_id,
                       .step = o->step,
                       .output_max = o->output_max,
                       .session = o->session};
    /* no argv: the sandbox's default command (an imported image's Entrypoint and Cmd) */
    if (o->session != 0 && m.argv.n != 1)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "exec: a session command is one shell command line, not %u "
                            "arguments",
                            m.argv.n);
    /* The request id names this command on its node: asked again with it (after a lost
     * answer, a restart), the node answers with the result kept from the first run. */
    char rid[65];
    if (o->req_id != NULL && (o->req_id[0] == '\0' || strlen(o->req_id) >= sizeof rid))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: req_id must be 1..64 characters");
    if (o->req_id != NULL)
        dsec__client_copy_str(rid, sizeof rid, o->req_id);
    else
        dsec_bus_new_id(rid);
    m.req_id = rid;
    /* wait as long as the command may run, never less than the client's own timeout */
    uint64_t wait = o->timeout_ms ? o->timeout_ms + EXEC_ANSWER_SLACK_MS : 0;
    if (wait < (uint64_t)c->timeout_ms)
        wait = (uint64_t)c->timeout_ms;
    if (wait > INT32_MAX)
        wait = INT32_MAX;
    if (dsec__client_kv_from_pairs(o->env, &m.env, "env", err) < 0)
        return -1;
    dsec_decoder *dec = dsec_decoder_new(NULL);
    dsec_msg *keep = NULL;
    dsec_msg_exec_result r;
    int rc = dec ? 0 : dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    struct exec_stream st = {.mu = PTHREAD_MUTEX_INITIALIZER,
                             .cv = PTHREAD_COND_INITIALIZER,
                             .fn = fn,
                             .ud = ud,
                             .id = id};
    dsec_actor *sa = NULL;
    char subj[160];
    if (rc == 0 && fn != NULL) {
        m.stream_to = subj;
        rc = exec_subscribe(c, &st, subj, sizeof subj, &sa, err);
    }
    if (rc == 0) {
        rc = dsec__client_sbx_call_for(c, id, "exec", DSEC_MSG_EXEC, &m, rid, DSEC_MSG_EXEC_RESULT,
                                       dec, &keep, &r, (int)wait, err);
        if (rc < 0 && err->code == DSEC_E_TIMEOUT && o->rollout_id == NULL)
            dsec_err_wrap(err,
                          "the command may still be running; exec again with req_id %s to get "
                          "its answer (it will not run twice)",
                          rid);
    }
    if (rc == 0 && fn != NULL) {
        if (r.chunks == 0) {
            /* nothing streamed (a result from the trajectory log): the output, once */
            if (r.stdout_data.len)
                fn(ud, 1, r.stdout_data.ptr, r.stdout_data.len);
            if (r.stderr_data.len)
                fn(ud, 2, r.stderr_data.ptr, r.stderr_data.len);
        } else {
            rc = stream_wait(&st, &r, c->timeout_ms, err);
        }
    }
    dsec_actor_free(sa);
    if (rc == 0)
        rc = exec_answer(&r, res, err);
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    dsec__client_kv_release(&m.env);
    return rc;
}

void dsec_exec_reply_release(dsec_exec_reply *res)
{
    dsec_free(res->out);
    dsec_free(res->err_out);
    res->out = res->err_out = NULL;
    res->out_len = res->err_len = 0;
}

/* ---- background processes ---------------------------------------------------------- */

static void proc_from_wire(dsec_proc *p, const dsec_msg_proc_info *w)
{
    *p = (dsec_proc){.handle = w->handle,
                     .pid = (int32_t)w->pid,
                     .running = w->running,
                     .stdin_open = w->stdin_open,
                     .timed_out = w->timed_out,
                     .exit_code = (int32_t)w->exit_code,
                     .signal = (int32_t)w->sig,
                     .started_ns = w->started_ns,
                     .ended_ns = w->ended_ns,
                     .out_total = w->out_total,
                     .err_total = w->err_total,
                     .pty = w->pty,
                     .session = w->session,
                     .busy = w->busy};
    dsec__client_copy_str(p->cmdline, sizeof p->cmdline, w->cmdline);
}

/* One proc request and its answer; the answer's bytes live in *keep (dsec_msg_free). */
static int proc_call_on(dsec_client *c, const char *id, const char *verb, dsec_msg_proc *m,
                        dsec_decoder *dec, dsec_msg **keep, dsec_msg_proc_reply *r, int timeout_ms,
                        dsec_err *err)
{
    char req_id[33];
    dsec_bus_new_id(req_id);
    m->id = id;
    m->req_id = req_id;
    m->tenant = c->tenant;
    return dsec__client_sbx_call_for(c, id, verb, DSEC_MSG_PROC, m, NULL, DSEC_MSG_PROC_REPLY, dec,
                                     keep, r, timeout_ms, err);
}

static int proc_call(dsec_client *c, const char *id, dsec_msg_proc *m, dsec_decoder *dec,
                     dsec_msg **keep, dsec_msg_proc_reply *r, dsec_err *err)
{
    return proc_call_on(c, id, "proc", m, dec, keep, r, c->timeout_ms, err);
}

/* A process call but start on the sig subject, which passes the sandbox's running command
 * (a foreground exec, a transfer); a sandbox type without a side connection to its agent says
 * it is unsupported there, having done nothing, and takes it on the proc subject. */
static int proc_side_call(dsec_client *c, const char *id, dsec_msg_proc *m, dsec_decoder *dec,
                          dsec_msg **keep, dsec_msg_proc_reply *r, int timeout_ms, dsec_err *err)
{
    int rc = proc_call_on(c, id, "sig", m, dec, keep, r, timeout_ms, err);
    if (rc < 0 && err->code == DSEC_E_UNSUPPORTED) {
        dsec_msg_free(*keep);
        *keep = NULL;
        rc = proc_call_on(c, id, "proc", m, dec, keep, r, timeout_ms, err);
    }
    return rc;
}

/* The one process a start or an output answer names. */
static int proc_one(const dsec_msg_proc_reply *r, dsec_proc *out, dsec_err *err)
{
    if (r->procs.n != 1)
        return dsec_err_set(err, DSEC_E_DECODE, 0,
                            "proc: the answer names %u processes, expected one", r->procs.n);
    proc_from_wire(out, (const dsec_msg_proc_info *)r->procs.items);
    return 0;
}

static int proc_start_msg(dsec_client *c, const char *id, dsec_msg_proc *mp, const char *const *env,
                          dsec_proc *out, dsec_err *err);

int dsec_proc_start(dsec_client *c, const char *id, const dsec_proc_opts *o, dsec_proc *out,
                    dsec_err *err)
{
    memset(out, 0, sizeof *out);
    dsec_msg_proc m = {.op = "start",
                       .argv = {(const char **)o->argv, dsec__client_count_nt(o->argv)},
                       .cwd = o->cwd,
                       .user = o->user,
                       .timeout_ms = o->timeout_ms,
                       .ring_max = o->ring_max,
                       .keep_stdin = o->keep_stdin || o->pty,
                       .data = {o->stdin_data, o->stdin_len},
                       .pty = o->pty,
                       .rows = o->pty ? o->rows : 0,
                       .cols = o->pty ? o->cols : 0};
    return proc_start_msg(c, id, &m, o->env, out, err);
}

int dsec_session_start(dsec_client *c, const char *id, const char *shell, dsec_proc *out,
                       dsec_err *err)
{
    memset(out, 0, sizeof *out);
    const char *argv[] = {shell};
    dsec_msg_proc m = {.op = "start", .argv = {argv, shell != NULL ? 1u : 0u}, .session = true};
    if (shell != NULL && shell[0] != '/')
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "session start: shell \"%s\" is not an absolute path", shell);
    return proc_start_msg(c, id, &m, NULL, out, err);
}

int dsec_session_interrupt(dsec_client *c, const char *id, uint64_t session, dsec_err *err)
{
    dsec_msg_proc m = {.op = "signal", .handle = session, .sig = 2 /* SIGINT */};
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg *keep = NULL;
    dsec_msg_proc_reply r;
    int rc = proc_side_call(c, id, &m, dec, &keep, &r, c->timeout_ms, err);
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

static int proc_start_msg(dsec_client *c, const char *id, dsec_msg_proc *mp, const char *const *env,
                          dsec_proc *out, dsec_err *err)
{
    dsec_msg_proc m = *mp;
    if (m.ring_max > (16u << 20))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "proc start: ring_max %" PRIu64 " is over 16 MiB", m.ring_max);
    if (dsec__client_kv_from_pairs(env, &m.env, "env", err) < 0)
        return -1;
    dsec_decoder *dec = dsec_decoder_new(NULL);
    dsec_msg *keep = NULL;
    dsec_msg_proc_reply r;
    int rc = dec ? proc_call(c, id, &m, dec, &keep, &r, err)
                 : dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    if (rc == 0)
        rc = proc_one(&r, out, err);
    dsec__client_kv_release(&m.env);
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

int dsec_proc_list(dsec_client *c, const char *id, dsec_proc **procs, size_t *n, dsec_err *err)
{
    *procs = NULL;
    *n = 0;
    dsec_msg_proc m = {.op = "list"};
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg *keep = NULL;
    dsec_msg_proc_reply r;
    int rc = proc_side_call(c, id, &m, dec, &keep, &r, c->timeout_ms, err);
    if (rc == 0) {
        dsec_proc *v = dsec_calloc(r.procs.n ? r.procs.n : 1, sizeof *v);
        if (v == NULL) {
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        } else {
            for (uint32_t i = 0; i < r.procs.n; i++)
                proc_from_wire(&v[i], (const dsec_msg_proc_info *)r.procs.items + i);
            *procs = v;
            *n = r.procs.n;
        }
    }
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

/* signal, stdin and resize: an answer with nothing in it */
static int proc_simple(dsec_client *c, const char *id, dsec_msg_proc *m, dsec_err *err)
{
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg *keep = NULL;
    dsec_msg_proc_reply r;
    int rc = proc_side_call(c, id, m, dec, &keep, &r, c->timeout_ms, err);
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

int dsec_proc_signal(dsec_client *c, const char *id, uint64_t handle, int sig, dsec_err *err)
{
    if (sig <= 0 || sig > 64)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "proc signal: %d is not a signal (1..64)", sig);
    dsec_msg_proc m = {.op = "signal", .handle = handle, .sig = (uint64_t)sig};
    return proc_simple(c, id, &m, err);
}

int dsec_proc_write(dsec_client *c, const char *id, uint64_t handle, const void *data, size_t len,
                    bool close, dsec_err *err)
{
    if (data == NULL && len > 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "proc write: %zu bytes but no data", len);
    if (len > (8u << 20))
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "proc write: %zu bytes in one call, at most 8 MiB", len);
    dsec_msg_proc m = {.op = "stdin", .handle = handle, .data = {data, len}, .close = close};
    return proc_simple(c, id, &m, err);
}

int dsec_proc_read(dsec_client *c, const char *id, uint64_t handle, uint64_t out_off,
                   uint64_t err_off, uint64_t max, dsec_proc_out *out, dsec_err *err)
{
    return dsec_proc_read_wait(c, id, handle, out_off, err_off, max, 0, out, err);
}

int dsec_proc_resize(dsec_client *c, const char *id, uint64_t handle, uint16_t rows, uint16_t cols,
                     dsec_err *err)
{
    if (rows == 0 || cols == 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "proc resize: %u rows, %u columns; both must be at least 1", rows,
                            cols);
    dsec_msg_proc m = {.op = "resize", .handle = handle, .rows = rows, .cols = cols};
    return proc_simple(c, id, &m, err);
}

int dsec_proc_read_wait(dsec_client *c, const char *id, uint64_t handle, uint64_t out_off,
                        uint64_t err_off, uint64_t max, uint32_t wait_ms, dsec_proc_out *out,
                        dsec_err *err)
{
    memset(out, 0, sizeof *out);
    if (wait_ms > 60000)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "proc read: wait_ms %u is over the limit of 60000", wait_ms);
    dsec_msg_proc m = {.op = "output",
                       .handle = handle,
                       .out_off = out_off,
                       .err_off = err_off,
                       .max = max,
                       .wait_ms = wait_ms};
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg *keep = NULL;
    dsec_msg_proc_reply r;
    int rc = proc_side_call(c, id, &m, dec, &keep, &r, c->timeout_ms + (int)wait_ms, err);
    if (rc == 0)
        rc = proc_one(&r, &out->info, err);
    if (rc == 0) {
        out->out = dsec_malloc(r.out.len + 1);
        out->err = dsec_malloc(r.err.len + 1);
        if (out->out == NULL || out->err == NULL) {
            dsec_proc_out_free(out);
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        } else {
            if (r.out.len > 0)
                memcpy(out->out, r.out.ptr, r.out.len);
            if (r.err.len > 0)
                memcpy(out->err, r.err.ptr, r.err.len);
            out->out[r.out.len] = out->err[r.err.len] = 0;
            out->out_len = r.out.len;
            out->err_len = r.err.len;
            out->out_from = r.out_from;
            out->err_from = r.err_from;
        }
    }
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

void dsec_proc_out_free(dsec_proc_out *o)
{
    if (o == NULL)
        return;
    dsec_free(o->out);
    dsec_free(o->err);
    o->out = o->err = NULL;
    o->out_len = o->err_len = 0;
}
