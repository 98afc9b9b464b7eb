/* node-proc.c - a sandbox's background processes (the proc message): start, list, signal, stdin,
 * output. */
#include "actors/node-int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "actors/wire.h"
#include "dsec/alloc.h"

#define PROC_ENV_MAX 256u

static dsec_msg_proc_info wire_info(const dsec_proc_info *p)
{
    return (dsec_msg_proc_info){.handle = p->handle,
                                .pid = p->pid,
                                .running = p->running,
                                .stdin_open = p->stdin_open,
                                .timed_out = p->timed_out,
                                .exit_code = p->running ? 0 : p->exit_code,
                                .sig = p->running ? 0 : p->signal,
                                .started_ns = p->started_ns,
                                .ended_ns = p->ended_ns,
                                .out_total = p->out_total,
                                .err_total = p->err_total,
                                .cmdline = p->cmdline,
                                .pty = p->pty,
                                .session = p->session,
                                .busy = p->busy};
}

static void reply(dsec_node *n, dsec_msg *m, dsec_msg_proc_reply *out)
{
    dsec_err err;
    if (dsec_wire_reply(n->actor, m, DSEC_MSG_PROC_REPLY, out, &err) < 0)
        dsec_wire_error(n->actor, m, &err);
}

static void reply_one(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_proc_info *p)
{
    dsec_msg_proc_info w = wire_info(p);
    dsec_msg_proc_reply out = {.id = s->id, .procs = {&w, 1}};
    reply(n, m, &out);
}

static void backend_failed(dsec_node *n, dsec_msg *m, struct sbx *s, dsec_err *err,
                           const char *what, const char *field)
{
    dsec_err_wrap(err, "%s in %s", what, s->id);
    dsec__node_reply_backend(n, m, err, field);
}

static void do_start(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_msg_proc *rq)
{
    if (rq->pty && rq->session) {
        dsec__node_reply_bad(n, m, "pty",
                             "proc start: a shell session runs without a terminal; ask for "
                             "pty or session, not both");
        return;
    }
    if (!rq->pty && (rq->rows != 0 || rq->cols != 0)) {
        dsec__node_reply_bad(n, m, rq->rows != 0 ? "rows" : "cols",
                             "proc start: rows and cols size a terminal; add pty");
        return;
    }
    if (rq->env.n > PROC_ENV_MAX) {
        dsec__node_reply_err(n, m, DSEC_E_TOO_LARGE,
                             "proc start: %u environment variables, at most %u", rq->env.n,
                             PROC_ENV_MAX);
        return;
    }
    dsec_backend_kv env[PROC_ENV_MAX];
    for (uint32_t i = 0; i < rq->env.n; i++)
        env[i] = (dsec_backend_kv){rq->env.k[i], rq->env.v[i]};
    dsec_proc_start_req req = {.exec = {.argv = rq->argv.v,
                                        .argc = rq->argv.n,
                                        .env = env,
                                        .nenv = rq->env.n,
                                        .cwd = rq->cwd,
                                        .user = rq->user,
                                        .stdin_data = rq->data.ptr,
                                        .stdin_len = rq->data.len,
                                        .timeout_ms = rq->timeout_ms},
                               .ring_max = rq->ring_max,
                               .keep_stdin = rq->keep_stdin || rq->pty,
                               .pty = rq->pty,
                               .rows = (uint16_t)rq->rows,
                               .cols = (uint16_t)rq->cols,
                               .session = rq->session};
    dsec_proc_info p;
    dsec_err err;
    if (dsec_backend_proc_start(s->be, s->h, &req, &p, &err) < 0) {
        backend_failed(n, m, s, &err, "starting a background process", "argv");
        return;
    }
    reply_one(n, m, s, &p);
}

static void do_list(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_proc_info *v = NULL;
    size_t nv = 0;
    dsec_err err;
    if (dsec_backend_proc_list(s->be, s->h, &v, &nv, &err) < 0) {
        backend_failed(n, m, s, &err, "listing background processes", NULL);
        return;
    }
    dsec_msg_proc_info *w = dsec_calloc(nv ? nv : 1, sizeof *w);
    if (w == NULL) {
        dsec_free(v);
        dsec__node_reply_err(n, m, DSEC_E_NOMEM, "out of memory listing %zu processes", nv);
        return;
    }
    for (size_t i = 0; i < nv; i++)
        w[i] = wire_info(&v[i]);
    dsec_msg_proc_reply out = {.id = s->id, .procs = {w, (uint32_t)nv}};
    reply(n, m, &out);
    dsec_free(w);
    dsec_free(v);
}

static dsec_msg_proc_reply output_reply(const char *id, const dsec_proc_output *o,
                                        dsec_msg_proc_info *w)
{
    *w = wire_info(&o->info);
    return (dsec_msg_proc_reply){.id = id,
                                 .procs = {w, 1},
                                 .out = {o->out, o->out_len},
                                 .err = {o->err, o->err_len},
                                 .out_from = o->out_from,
                                 .err_from = o->err_from};
}

/* An output read or a stdin write that waits on the node's loop: the request's key is let go
 * at once (the sandbox's next operation need not wait for output that may take a minute, nor
 * for a process that does not read), so what the answer needs is copied here, and the sandbox
 * is never touched again. */
struct follow {
    dsec_node *n;
    char id[DSEC_SBX_ID_LEN_MAX + 1];
    char trace[DSEC_TRACE_ID_MAX + 1];
    char *reply;
    char *req_id;
};

/* The record of a request answered from the loop; NULL (m not answered) when short of
 * memory or m has no reply subject. */
static struct follow *follow_new(dsec_node *n, dsec_msg *m, struct sbx *s, const char *req_id)
{
    const char *to = dsec_msg_reply(m);
    struct follow *f = to != NULL ? dsec_calloc(1, sizeof *f) : NULL;
    if (f == NULL || (f->reply = dsec_strdup(to)) == NULL ||
        (req_id != NULL && (f->req_id = dsec_strdup(req_id)) == NULL)) {
        if (f != NULL)
            dsec_free(f->reply);
        dsec_free(f);
        return NULL;
    }
    f->n = n;
    snprintf(f->id, sizeof f->id, "%s", s->id);
    const char *tr = dsec_trace_current();
    snprintf(f->trace, sizeof f->trace, "%s", tr ? tr : "");
    return f;
}

static void follow_free(struct follow *f)
{
    dsec_free(f->reply);
    dsec_free(f->req_id);
    dsec_free(f);
}

/* Answer f's request from the loop: out on success (rc 0), else err wrapped with what; then
 * f is freed. */
static void follow_answer(struct follow *f, int rc, const dsec_msg_proc_reply *out,
                          const char *what, dsec_err *err)
{
    dsec_trace_scope sc;
    dsec_trace_enter(&sc, NULL, f->trace[0] ? f->trace : NULL, NULL, NULL);
    dsec_err lerr;
    if (rc < 0) {
        dsec_err_wrap(err, "%s in %s", what, f->id);
        dsec_wire_error_to(f->n->actor, f->n->bus, f->reply, err, "handle", f->req_id);
    } else if (dsec_wire_send(f->n->actor, f->n->bus, f->reply, NULL, DSEC_MSG_PROC_REPLY, out,
                              f->req_id, &lerr) < 0) {
        dsec_wire_error_to(f->n->actor, f->n->bus, f->reply, &lerr, NULL, f->req_id);
    }
    dsec_trace_leave(&sc);
    follow_free(f);
}

static void follow_done(void *ud, int rc, dsec_proc_output *o, dsec_err *err)
{
    struct follow *f = ud;
    dsec_msg_proc_info w;
    dsec_msg_proc_reply out = {0};
    if (rc == 0)
        out = output_reply(f->id, o, &w);
    follow_answer(f, rc, &out, "reading a background process's output", err);
    if (rc == 0)
        dsec_proc_output_release(o);
}

static void stdin_done(void *ud, int rc, dsec_err *err)
{
    struct follow *f = ud;
    dsec_msg_proc_reply out = {.id = f->id};
    follow_answer(f, rc, &out, "writing a background process's stdin", err);
}

/* 1 when the write was handed to the loop (answered or to be answered), 0 to write here. */
static int stdin_async(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_msg_proc *rq)
{
    if (!dsec_backend_proc_stdin_async(s->be) || dsec_backend_instant(s->be))
        return 0;
    struct follow *f = follow_new(n, m, s, rq->req_id);
    if (f == NULL)
        return 0; /* short of memory: write here */
    dsec_err err;
    if (dsec_backend_proc_stdin_start(s->be, s->h, rq->handle, rq->data.ptr, rq->data.len,
                                      rq->close, n->loop, stdin_done, f, &err) < 0) {
        follow_free(f);
        backend_failed(n, m, s, &err, "writing a background process's stdin", "handle");
    }
    return 1;
}

/* 1 when the read was handed to the loop (answered or to be answered), 0 to read at once. */
static int output_follow(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_msg_proc *rq,
                         uint64_t max)
{
    if (rq->wait_ms == 0 || !dsec_backend_proc_follows(s->be) || dsec_backend_instant(s->be))
        return 0;
    struct follow *f = follow_new(n, m, s, rq->req_id);
    if (f == NULL)
        return 0; /* short of memory, or nowhere to answer later: read without waiting */
    dsec_err err;
    if (dsec_backend_proc_follow_start(s->be, s->h, rq->handle, rq->out_off, rq->err_off, max,
                                       (uint32_t)rq->wait_ms, n->loop, follow_done, f, &err) < 0) {
        follow_free(f);
        backend_failed(n, m, s, &err, "reading a background process's output", "handle");
    }
    return 1;
}

static void do_output(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_msg_proc *rq)
{
    dsec_proc_output o;
    dsec_err err;
    /* the answer is one message: each stream's bytes are capped below the bus's limit */
    uint64_t max = rq->max == 0 || rq->max > DSEC_PROC_OUTPUT_MAX ? DSEC_PROC_OUTPUT_MAX : rq->max;
    if (output_follow(n, m, s, rq, max))
        return;
    if (dsec_backend_proc_output(s->be, s->h, rq->handle, rq->out_off, rq->err_off, max, &o, &err) <
        0) {
        backend_failed(n, m, s, &err, "reading a background process's output", "handle");
        return;
    }
    dsec_msg_proc_info w;
    dsec_msg_proc_reply out = output_reply(s->id, &o, &w);
    reply(n, m, &out);
    dsec_proc_output_release(&o);
}

/* rq's op on s, answered on m; rq->op is not start */
static void proc_op(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_msg_proc *r)
{
    dsec_msg_proc rq = *r;
    dsec_err err;
    if (strcmp(rq.op, "list") == 0) {
        do_list(n, m, s);
    } else if (strcmp(rq.op, "output") == 0) {
        do_output(n, m, s, &rq);
    } else if (strcmp(rq.op, "signal") == 0) {
        if (rq.sig == 0) {
            dsec__node_reply_bad(n, m, "signal", "proc signal: name the signal (1..64)");
            return;
        }
        if (dsec_backend_proc_signal(s->be, s->h, rq.handle, (int)rq.sig, &err) < 0) {
            backend_failed(n, m, s, &err, "signalling a background process", "handle");
            return;
        }
        dsec_msg_proc_reply out = {.id = s->id};
        reply(n, m, &out);
    } else if (strcmp(rq.op, "stdin") == 0) {
        if (stdin_async(n, m, s, &rq))
            return;
        if (dsec_backend_proc_stdin(s->be, s->h, rq.handle, rq.data.ptr, rq.data.len, rq.close,
                                    &err) < 0) {
            backend_failed(n, m, s, &err, "writing a background process's stdin", "handle");
            return;
        }
        dsec_msg_proc_reply out = {.id = s->id};
        reply(n, m, &out);
    } else if (strcmp(rq.op, "resize") == 0) {
        if (rq.rows == 0 || rq.cols == 0) {
            dsec__node_reply_bad(n, m, rq.rows == 0 ? "rows" : "cols",
                                 "proc resize: give the window's rows and cols (1..65535)");
            return;
        }
        if (dsec_backend_proc_resize(s->be, s->h, rq.handle, (uint16_t)rq.rows, (uint16_t)rq.cols,
                                     &err) < 0) {
            backend_failed(n, m, s, &err, "resizing a process's terminal", "handle");
            return;
        }
        dsec_msg_proc_reply out = {.id = s->id};
        reply(n, m, &out);
    } else {
        dsec__node_reply_bad(n, m, "op",
                             "proc: op \"%s\" is unknown (known: start, list, signal, stdin, "
                             "output, resize)",
                             rq.op);
    }
}

void dsec__node_do_proc(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_msg_proc rq;
    if (!dsec__node_decode_for_running(n, m, s, DSEC_MSG_PROC, &rq))
        return;
    dsec__node_touch(s);
    if (strcmp(rq.op, "start") == 0)
        do_start(n, m, s, &rq);
    else
        proc_op(n, m, s, &rq);
}

/* ---- process calls beside a running command (the sig subject) --------------------------- */

void dsec__node_side_close(dsec_node *n, struct sbx *s)
{
    pthread_mutex_lock(&n->mu);
    s->side_closed = true;
    pthread_mutex_unlock(&n->mu);
    /* a side call is one call to the agent on a connection of its own; a write to a stdin
     * that is not read ends when the sandbox's processes do */
    while (atomic_load(&s->side) > 0)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
}

/* m's proc request for sandbox id, decoded and checked; false when m was answered. */
static bool side_decode(dsec_node *n, dsec_msg *m, const char *id, dsec_msg_proc *rq)
{
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_PROC, dsec_msg_data(m), dsec_msg_len(m), rq,
                    &err) < 0) {
        dsec_wire_error(n->actor, m, &err);
        return false;
    }
    if (strcmp(rq->id, id) != 0) {
        dsec__node_reply_bad(n, m, "id", "proc: id %s does not match the subject's %s", rq->id, id);
        return false;
    }
    if (strcmp(rq->op, "start") == 0) {
        dsec__node_reply_bad(n, m, "op",
                             "the sig subject takes list, output, signal, stdin and resize; "
                             "start a process on the proc subject");
        return false;
    }
    return true;
}

/* Pin id's sandbox for a side call (a destroy waits for it): NULL when m was answered. */
static struct sbx *side_pin(dsec_node *n, dsec_msg *m, const char *tenant, const char *id)
{
    pthread_mutex_lock(&n->mu);
    struct sbx *s = dsec__node_find_id(n, id);
    int why = s == NULL || s->side_closed         ? 1
              : strcmp(s->tenant, tenant) != 0    ? 2
              : !dsec_backend_proc_follows(s->be) ? 3
              : s->state != ST_RUNNING            ? 4
                                                  : 0;
    const char *state = why == 4 ? dsec__node_state_names[s->state] : "";
    if (why == 0)
        atomic_fetch_add(&s->side, 1);
    pthread_mutex_unlock(&n->mu);
    if (why == 1)
        dsec__node_reply_err(n, m, DSEC_E_NOT_FOUND, "no running sandbox %s on node %s", id,
                             n->name);
    else if (why == 2)
        dsec__node_reply_err(n, m, DSEC_E_PERMISSION, "sandbox %s does not belong to tenant %s", id,
                             tenant);
    else if (why == 3)
        dsec__node_reply_err(n, m, DSEC_E_UNSUPPORTED,
                             "sandbox %s takes process calls on its proc subject only (one "
                             "channel to its agent)",
                             id);
    else if (why == 4) /* on proc, one frozen for idleness is thawed; a paused one says so */
        dsec__node_reply_err(n, m, DSEC_E_UNSUPPORTED,
                             "sandbox %s is %s: process calls pass a command only while it runs; "
                             "send this one on its proc subject",
                             id, state);
    return why == 0 ? s : NULL;
}

void dsec__node_side_proc(dsec_node *n, dsec_msg *m, const char *tenant, const char *id)
{
    dsec_msg_proc rq;
    if (!side_decode(n, m, id, &rq))
        return;
    struct sbx *s = side_pin(n, m, tenant, id);
    if (s == NULL)
        return;
    proc_op(n, m, s, &rq);
    atomic_fetch_sub(&s->side, 1);
}

bool dsec__node_side_is_signal(const dsec_msg *m)
{
    dsec_msg_proc rq;
    dsec_err err;
    return dsec_decode(dsec_wire_decoder(), DSEC_MSG_PROC, dsec_msg_data(m), dsec_msg_len(m), &rq,
                       &err) == 0 &&
           strcmp(rq.op, "signal") == 0;
}
