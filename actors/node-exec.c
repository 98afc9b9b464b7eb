/* node-exec.c - commands in a sandbox: exec on the loop or a work thread, output, trajectory log.
 */
#include "actors/node-int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "actors/wire.h"
#include "dsec/alloc.h"

/* The exec field a backend's invalid error is about. Backends judge the
 * command line, cwd, user and environment, and say which in their message
 * (backends/function-call.c, agent-client.c); the command is what is left. */
static const char *exec_bad_field(const dsec_err *e)
{
    if (strstr(e->msg, "cwd") != NULL)
        return "cwd";
    if (strstr(e->msg, "user \"") != NULL)
        return "user";
    if (strstr(e->msg, "environment variable") != NULL || strstr(e->msg, "DSEC_LIMIT_") != NULL)
        return "env";
    return "argv";
}

/* ---- trajectory log ------------------------------------------------------------ */

/* A logged step is answered from the log when the request is the same
 * (fast-forward: it never runs twice) and refused as a divergence when it is
 * not. Returns 1 when m was answered (*rec is then the logged record, or
 * NULL when an error was answered), 0 to run the step live. */
int dsec__node_traj_check(dsec_node *n, dsec_msg *m, const char *rollout, uint64_t step,
                          const uint8_t hash[DSEC_SHA256_LEN], dsec_traj_record **rec)
{
    dsec_err err;
    *rec = NULL;
    if (n->conf.traj == NULL) {
        dsec__node_reply_err(n, m, DSEC_E_UNSUPPORTED,
                             "rollout %s step %" PRIu64
                             ": node %s keeps no trajectory log (JetStream is off)",
                             rollout, step, n->name);
        return 1;
    }
    if (dsec_traj_check_id(rollout, &err) < 0) {
        dsec_wire_error(n->actor, m, &err);
        return 1;
    }
    int found = dsec_traj_find(n->conf.traj, rollout, step, rec, &err);
    if (found < 0) {
        dsec_wire_error(n->actor, m, &err);
        return 1;
    }
    if (found == 0)
        return 0;
    dsec_traj_record *r = *rec;
    if (r->request_hash.len != DSEC_SHA256_LEN ||
        memcmp(r->request_hash.data, hash, DSEC_SHA256_LEN) != 0) {
        dsec__node_reply_err(
            n, m, DSEC_E_DIVERGED,
            "divergence: rollout %s step %" PRIu64 " is logged as \"%s%s\" and this request "
            "differs; re-issue the logged request or continue after step %" PRIu64,
            rollout, step, r->n_argv ? r->argv[0] : "", r->n_argv > 1 ? " ..." : "", step);
        dsec_traj_record_free(r);
        *rec = NULL;
        return 1;
    }
    return 1;
}

/* Log a step that ran; the caller answers only after this returns 0. */
int dsec__node_traj_log(dsec_node *n, dsec_traj_record *r, dsec_err *err)
{
    r->hash_alg = (char *)DSEC_TRAJ_HASH_ALG;
    r->ts_ns = dsec_wall_ns();
    if (dsec_traj_append(n->conf.traj, r, err) < 0)
        return dsec_err_wrap(err, "the step ran but is not logged, so a retry would run it again");
    return 0;
}

/* Output of a command streamed to the exec's stream_to subject as it comes. */
struct exec_stream {
    dsec_node *n;
    const char *subject; /* NULL: not streaming */
    const char *id;
    const char
        *trace; /* the exec's trace id (NULL: none): the backend may call from its own thread */
    uint64_t seq;
    bool failed; /* a publish failed: the rest is not sent (the result says how many were) */
};

#define EXEC_CHUNK_MAX (64u * 1024)

static void stream_output(void *arg, int stream, const uint8_t *data, size_t len)
{
    struct exec_stream *es = arg;
    dsec_trace_scope sc;
    dsec_trace_enter(&sc, NULL, es->trace, NULL, NULL);
    while (len > 0 && !es->failed) {
        size_t k = len < EXEC_CHUNK_MAX ? len : EXEC_CHUNK_MAX;
        dsec_msg_exec_chunk c = {
            .id = es->id, .seq = es->seq, .stream = (uint64_t)stream, .data = {data, k}};
        dsec_err err;
        if (dsec_wire_send(es->n->actor, es->n->bus, es->subject, NULL, DSEC_MSG_EXEC_CHUNK, &c,
                           NULL, &err) < 0) {
            es->failed = true;
            dsec_actor_count_error(es->n->actor);
            break;
        }
        es->seq++;
        data += k;
        len -= k;
    }
    dsec_trace_leave(&sc);
}

/* What finishing an exec needs once the command ended: all copied, since the request's
 * decoded form belongs to the thread that decoded it. */
struct exec_end {
    dsec_node *n;
    struct sbx *s;
    dsec_deferred *d; /* the request, when it was deferred (the command runs without a thread) */
    dsec_msg *m;      /* the request */
    struct exec_stream es;
    char trace[DSEC_TRACE_ID_MAX + 1];
    char *stream_to;
    /* a logged step (rollout_id set): what its trajectory record holds */
    char *rollout_id, *req_id;
    uint64_t step;
    char **argv;
    size_t argc;
    uint8_t hash[DSEC_SHA256_LEN];
};

static void exec_end_free(struct exec_end *e)
{
    dsec_free(e->stream_to);
    dsec_free(e->rollout_id);
    dsec_free(e->req_id);
    for (size_t i = 0; e->argv != NULL && i < e->argc; i++)
        dsec_free(e->argv[i]);
    dsec_free(e->argv);
    dsec_free(e);
}

/* The command ended (rc 0, r its result) or failed: log the step, answer, let the sandbox's
 * next operation run. */
static void exec_finish(struct exec_end *e, int rc, dsec_exec_result *r, dsec_err *err)
{
    dsec_node *n = e->n;
    struct sbx *s = e->s;
    dsec_msg *m = e->m;
    /* A deferred command ends on the loop's thread: its request's scope, and its hop, are
     * entered here. One run where it arrived is still inside its handler's scope, which
     * records what it sends. */
    dsec_trace_scope sc;
    if (e->d != NULL)
        dsec_deferred_trace(e->d, &sc);
    dsec_err lerr;
    bool named = e->rollout_id == NULL && e->req_id != NULL && e->req_id[0] != '\0';
    if (rc < 0) {
        /* Refused or broken: a retry runs it. Unless the node manager stopped waiting for it
         * (DSEC_E_CLOSED: it is stopping, and the command may run on in the sandbox): its
         * marker stays, and the next start answers a retry that its outcome was lost. */
        if (named && err->code != DSEC_E_CLOSED)
            dsec_results_abandon(n->results, s->id, e->req_id);
        dsec_err_wrap(err, "exec in %s", s->id);
        dsec__node_reply_backend(n, m, err, exec_bad_field(err));
        goto out;
    }
    dsec__node_touch(s);
    if (e->stream_to != NULL && e->es.seq == 0 && !e->es.failed) {
        /* a backend that cannot stream: the whole output, as chunks, now */
        stream_output(&e->es, 1, r->stdout_data, r->stdout_len);
        stream_output(&e->es, 2, r->stderr_data, r->stderr_len);
    }
    if (e->rollout_id != NULL) {
        dsec_traj_record rec = {0};
        rec.rollout_id = e->rollout_id;
        rec.step = e->step;
        rec.req_id = e->req_id ? e->req_id : (char *)"";
        rec.sandbox_id = s->id;
        rec.argv = e->argv;
        rec.n_argv = e->argc;
        rec.exit_code = r->exit_code;
        rec.signal = r->signal;
        rec.stdout_data = (dsec_record_bytes){r->stdout_len, r->stdout_data};
        rec.stderr_data = (dsec_record_bytes){r->stderr_len, r->stderr_data};
        rec.stdout_truncated = r->stdout_truncated;
        rec.stderr_truncated = r->stderr_truncated;
        rec.timed_out = r->timed_out;
        rec.duration_us = r->duration_us;
        rec.request_hash = (dsec_record_bytes){DSEC_SHA256_LEN, e->hash};
        if (dsec__node_traj_log(n, &rec, &lerr) < 0) {
            dsec_wire_error(n->actor, m, &lerr);
            goto out;
        }
    }
    dsec_msg_exec_result out = {.id = s->id,
                                .exit_code = r->exit_code,
                                .signal = r->signal,
                                .stdout_data = {r->stdout_data, r->stdout_len},
                                .stderr_data = {r->stderr_data, r->stderr_len},
                                .stdout_truncated = r->stdout_truncated,
                                .stderr_truncated = r->stderr_truncated,
                                .duration_us = r->duration_us,
                                .timed_out = r->timed_out,
                                .cpu_us = r->cpu_us,
                                .peak_rss_kb = r->peak_rss_kb,
                                .chunks = e->es.seq,
                                .interrupted = r->interrupted,
                                .session_ended = r->session_ended};
    if (named)
        dsec_results_put(n->results, s->id, e->req_id, e->hash, &out);
    if (dsec_wire_reply(n->actor, m, DSEC_MSG_EXEC_RESULT, &out, &lerr) < 0)
        dsec_wire_error(n->actor, m, &lerr);
out:
    if (rc == 0)
        dsec_exec_result_release(r);
    if (e->d != NULL)
        dsec_trace_leave(&sc);
}

/* exec_start's done: on the node's loop thread. */
static void exec_done(void *ud, int rc, dsec_exec_result *r, dsec_err *err)
{
    struct exec_end *e = ud;
    dsec_node *n = e->n;
    /* no longer in flight before its answer goes: a client that has its answer sees it so
     * (running drops after the answer: the sandbox was touched by then, so the reaper cannot
     * take a sandbox whose long command just ended for an idle one) */
    atomic_fetch_sub(&n->execs_inflight, 1);
    exec_finish(e, rc, r, err);
    atomic_fetch_sub(&e->s->running, 1);
    dsec_deferred *d = e->d;
    exec_end_free(e);
    dsec_deferred_done(d);
}

static char *dup_or_null(const char *v)
{
    return v != NULL ? dsec_strdup(v) : NULL;
}

/* A trajectory step that is in the log already is answered from it, or refused when the log
 * holds another command at that step: true when it was answered. hash gets the step's hash. */
static bool exec_logged(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_msg_exec *x,
                        uint8_t hash[DSEC_SHA256_LEN])
{
    dsec_err err;
    dsec_traj_record *rec;
    dsec_traj_hash_exec(x, hash);
    if (dsec__node_traj_check(n, m, x->rollout_id, x->step, hash, &rec)) {
        if (rec != NULL) {
            dsec_msg_exec_result out = {
                .id = s->id,
                .exit_code = rec->exit_code,
                .signal = rec->signal,
                .stdout_data = {rec->stdout_data.data, rec->stdout_data.len},
                .stderr_data = {rec->stderr_data.data, rec->stderr_data.len},
                .stdout_truncated = rec->stdout_truncated,
                .stderr_truncated = rec->stderr_truncated,
                .duration_us = rec->duration_us,
                .timed_out = rec->timed_out};
            if (dsec_wire_reply(n->actor, m, DSEC_MSG_EXEC_RESULT, &out, &err) < 0)
                dsec_wire_error(n->actor, m, &err);
            dsec_traj_record_free(rec);
        }
        return true;
    }
    return false;
}

/* A retry of a command that already ran (its client lost the answer, or gave up
 * waiting while it ran) gets the kept answer: the command never runs twice. True when it was
 * answered. */
static bool exec_kept(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_msg_exec *x,
                      const uint8_t hash[DSEC_SHA256_LEN])
{
    dsec_err err;
    dsec_msg_exec_result kept;
    void *hold = NULL;
    uint8_t kept_hash[DSEC_SHA256_LEN];
    int found = dsec_results_get(n->results, s->id, x->req_id, &kept, kept_hash, &hold);
    if (found == DSEC_RESULTS_NONE)
        return false;
    uint64_t ttl_s = dsec_results_ttl_ms(n->results) / 1000;
    if (memcmp(kept_hash, hash, DSEC_SHA256_LEN) != 0)
        dsec__node_reply_bad(n, m, "req_id",
                             "exec: req_id %s named another command in %s (what became of "
                             "it is kept for %" PRIu64 " s); give each command its own req_id",
                             x->req_id, s->id, ttl_s);
    else if (found == DSEC_RESULTS_LOST)
        /* Never a second run of what may have run: say what is known, and what to do. */
        dsec__node_reply_err(n, m, DSEC_E_STATE,
                             "exec: the outcome of req_id %s in %s is lost: node %s's node "
                             "manager stopped while the command ran, so it may have run in "
                             "whole or in part (or still be running); it is not run again. "
                             "Check the sandbox, then exec with a new req_id",
                             x->req_id, s->id, n->name);
    else {
        kept.chunks = 0; /* its output comes whole, in the answer */
        if (dsec_wire_reply(n->actor, m, DSEC_MSG_EXEC_RESULT, &kept, &err) < 0)
            dsec_wire_error(n->actor, m, &err);
    }
    dsec_results_release(hold);
    return true;
}

/* The command's state until its answer (exec_end_free), with what it keeps of the request
 * copied; NULL when out of memory, answered so. */
static struct exec_end *exec_end_new(dsec_node *n, dsec_msg *m, struct sbx *s,
                                     const dsec_msg_exec *x, const uint8_t hash[DSEC_SHA256_LEN])
{
    struct exec_end *e = dsec_calloc(1, sizeof *e);
    bool ok = e != NULL;
    if (ok) {
        e->n = n;
        e->s = s;
        e->m = m;
        e->step = x->step;
        const char *tr = dsec_trace_current();
        snprintf(e->trace, sizeof e->trace, "%s", tr ? tr : "");
        ok = (x->stream_to == NULL || (e->stream_to = dsec_strdup(x->stream_to)) != NULL) &&
             (x->req_id == NULL || (e->req_id = dsec_strdup(x->req_id)) != NULL);
        memcpy(e->hash, hash, DSEC_SHA256_LEN); /* a logged step's, or a named command's */
        if (ok && x->rollout_id != NULL) {
            e->argc = x->argv.n;
            ok = (e->rollout_id = dsec_strdup(x->rollout_id)) != NULL &&
                 (e->argv = dsec_calloc(x->argv.n + 1, sizeof *e->argv)) != NULL;
            for (size_t i = 0; ok && i < x->argv.n; i++)
                ok = (e->argv[i] = dup_or_null(x->argv.v[i])) != NULL;
        }
        e->es = (struct exec_stream){
            .n = n, .subject = e->stream_to, .id = s->id, .trace = e->trace[0] ? e->trace : NULL};
    }
    if (!ok) {
        if (e != NULL)
            exec_end_free(e);
        dsec__node_reply_err(n, m, DSEC_E_NOMEM, "exec in %s: out of memory", s->id);
        return NULL;
    }
    return e;
}

void dsec__node_do_exec(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_err err;
    dsec_msg_exec x;
    if (!dsec__node_decode_for_running(n, m, s, DSEC_MSG_EXEC, &x))
        return;
    dsec_backend_kv env[256];
    if (x.env.n > 256) {
        dsec__node_reply_err(n, m, DSEC_E_TOO_LARGE, "exec: %u environment variables, at most 256",
                             x.env.n);
        return;
    }
    for (uint32_t i = 0; i < x.env.n; i++)
        env[i] = (dsec_backend_kv){x.env.k[i], x.env.v[i]};
    if (x.session != 0 && x.rollout_id != NULL) {
        dsec__node_reply_bad(n, m, "session",
                             "exec: a session command is not a trajectory step (what it does "
                             "depends on the session's state, which a replay lacks); log steps "
                             "with plain exec");
        return;
    }
    uint8_t hash[DSEC_SHA256_LEN] = {0};
    if (x.rollout_id != NULL && exec_logged(n, m, s, &x, hash))
        return;
    /* stream_to: only inbox subjects, so a client cannot make the node
     * publish onto the control plane's subjects */
    if (x.stream_to != NULL &&
        (strncmp(x.stream_to, "_INBOX.", 7) != 0 || strpbrk(x.stream_to, "*> \t") != NULL)) {
        dsec__node_reply_bad(n, m, "stream_to",
                             "exec: stream_to \"%s\" must be an _INBOX. subject without wildcards",
                             x.stream_to);
        return;
    }
    bool named = x.rollout_id == NULL && x.req_id != NULL && x.req_id[0] != '\0';
    if (named) {
        dsec_traj_hash_exec(&x, hash);
        if (exec_kept(n, m, s, &x, hash))
            return;
    }
    struct exec_end *e = exec_end_new(n, m, s, &x, hash);
    if (e == NULL)
        return;
    dsec_exec_req req = {.argv = x.argv.v,
                         .argc = x.argv.n,
                         .env = env,
                         .nenv = x.env.n,
                         .cwd = x.cwd,
                         .user = x.user,
                         .stdin_data = x.stdin_data.ptr,
                         .stdin_len = x.stdin_data.len,
                         .timeout_ms = x.timeout_ms,
                         .output_max = (size_t)x.output_max,
                         .session = x.session,
                         .on_output = x.stream_to ? stream_output : NULL,
                         .on_output_arg = &e->es};
    /* From here the command may run: a node manager that goes away before its answer is
     * kept leaves this marker, and the next one answers a retry that the outcome is lost. */
    if (named)
        dsec_results_begin(n->results, s->id, x.req_id, hash);
    /* Without a thread when the backend can: the command's answer comes from the loop, and
     * this worker goes on with other sandboxes. */
    if (dsec_backend_exec_async(s->be) && !dsec_backend_instant(s->be) &&
        (e->d = dsec_actor_defer(n->actor, m)) != NULL) {
        e->m = dsec_deferred_msg(e->d);
        atomic_fetch_add(&s->running, 1);
        uint64_t now = atomic_fetch_add(&n->execs_inflight, 1) + 1;
        for (uint64_t peak = atomic_load(&n->execs_peak);
             now > peak && !atomic_compare_exchange_weak(&n->execs_peak, &peak, now);)
            ;
        if (dsec_backend_exec_start(s->be, s->h, &req, exec_done, e, &err) < 0)
            exec_done(e, -1, NULL, &err); /* answered; releases the key after this handler */
        return;
    }
    dsec_exec_result r = {0};
    atomic_fetch_add(&s->running, 1);
    int rc = dsec_backend_exec(s->be, s->h, &req, &r, &err);
    atomic_fetch_sub(&s->running, 1);
    exec_finish(e, rc, &r, &err);
    exec_end_free(e);
}
