/* node-proc.c - a sandbox's background processes (the proc message): start, list, signal, stdin, output. */
#include "actors/node-int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "actors/wire.h"
#include "dsec/alloc.h"

#define PROC_ENV_MAX 256u

static dsec_msg_proc_info wire_info(const dsec_proc_info *p)
{
    return (dsec_msg_proc_info){.handle = p->handle, .pid = p->pid, .running = p->running,
                                .stdin_open = p->stdin_open, .timed_out = p->timed_out,
                                .exit_code = p->running ? 0 : p->exit_code,
                                .sig = p->running ? 0 : p->signal, .started_ns = p->started_ns,
                                .ended_ns = p->ended_ns, .out_total = p->out_total,
                                .err_total = p->err_total, .cmdline = p->cmdline};
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
    if (rq->argv.n == 0) {
        dsec__node_reply_bad(n, m, "argv", "proc start: argv is empty; name the command to run");
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
    dsec_proc_start_req req = {
        .exec = {.argv = rq->argv.v, .argc = rq->argv.n, .env = env, .nenv = rq->env.n,
                 .cwd = rq->cwd, .user = rq->user, .stdin_data = rq->data.ptr,
                 .stdin_len = rq->data.len, .timeout_ms = rq->timeout_ms},
        .ring_max = rq->ring_max,
        .keep_stdin = rq->keep_stdin};
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

static void do_output(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_msg_proc *rq)
{
    dsec_proc_output o;
    dsec_err err;
    /* the answer is one message: each stream's bytes are capped below the bus's limit */
    uint64_t max = rq->max == 0 || rq->max > DSEC_PROC_OUTPUT_MAX ? DSEC_PROC_OUTPUT_MAX : rq->max;
    if (dsec_backend_proc_output(s->be, s->h, rq->handle, rq->out_off, rq->err_off, max, &o,
                                 &err) < 0) {
        backend_failed(n, m, s, &err, "reading a background process's output", "handle");
        return;
    }
    dsec_msg_proc_info w = wire_info(&o.info);
    dsec_msg_proc_reply out = {.id = s->id, .procs = {&w, 1}, .out = {o.out, o.out_len},
                               .err = {o.err, o.err_len}, .out_from = o.out_from,
                               .err_from = o.err_from};
    reply(n, m, &out);
    dsec_proc_output_release(&o);
}

void dsec__node_do_proc(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_msg_proc rq;
    if (!dsec__node_decode_for_running(n, m, s, DSEC_MSG_PROC, &rq))
        return;
    dsec__node_touch(s);
    dsec_err err;
    if (strcmp(rq.op, "start") == 0) {
        do_start(n, m, s, &rq);
    } else if (strcmp(rq.op, "list") == 0) {
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
        if (dsec_backend_proc_stdin(s->be, s->h, rq.handle, rq.data.ptr, rq.data.len, rq.close,
                                    &err) < 0) {
            backend_failed(n, m, s, &err, "writing a background process's stdin", "handle");
            return;
        }
        dsec_msg_proc_reply out = {.id = s->id};
        reply(n, m, &out);
    } else {
        dsec__node_reply_bad(n, m, "op",
                             "proc: op \"%s\" is unknown (known: start, list, signal, stdin, "
                             "output)",
                             rq.op);
    }
}
