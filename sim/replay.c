/* replay.c - the open-loop replayer: sends a trace's operations at their recorded times, many in
 * flight, and keeps the figures for the report. */
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "actors/wire.h"
#include "codecs/subjects.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/log.h"
#include "dsec/names.h"
#include "sim/replay_int.h"

double sim_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

uint64_t sim_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

size_t sim_bucket_of(const sim_replay *r, double t)
{
    double b = (t - r->t_start) / r->bucket_s;
    if (b < 0)
        b = 0;
    size_t i = (size_t)b;
    return i < SIM_MAX_BUCKETS ? i : SIM_MAX_BUCKETS - 1;
}

void sim_replay_error(sim_replay *r, const char *kind, double t)
{
    sim_replay_error_msg(r, kind, NULL, t);
}

void sim_replay_error_msg(sim_replay *r, const char *kind, const char *msg, double t)
{
    pthread_mutex_lock(&r->mu);
    size_t i = 0;
    while (i < r->nerr_kinds && strcmp(r->err_kind[i], kind) != 0)
        i++;
    if (i == r->nerr_kinds && i < SIM_MAX_ERR_KINDS) {
        snprintf(r->err_kind[i], sizeof r->err_kind[i], "%s", kind);
        r->err_first[i][0] = '\0';
        r->nerr_kinds++;
    }
    if (i < SIM_MAX_ERR_KINDS && !r->err_first[i][0] && msg != NULL) {
        /* the start of it is enough, on one line of the report */
        snprintf(r->err_first[i], sizeof r->err_first[i], "%.*s", (int)sizeof r->err_first[i] - 1,
                 msg);
        for (char *c = r->err_first[i]; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = ' ';
    }
    if (i < SIM_MAX_ERR_KINDS)
        r->err_n[i]++;
    r->b[sim_bucket_of(r, t)].errors++;
    pthread_mutex_unlock(&r->mu);
    atomic_fetch_add(&r->errors, 1);
}

int sim_replay_new(sim_replay **out, const sim_trace *t, const sim_sink *sink,
                   const sim_replay_opts *o, dsec_err *err)
{
    sim_replay *r = dsec_calloc(1, sizeof *r);
    if (!r)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "replay: out of memory");
    r->t = t;
    r->sink = *sink;
    r->o = *o;
    if (r->o.timeout_ms <= 0)
        r->o.timeout_ms = 30000;
    if (r->o.max_in_flight <= 0)
        r->o.max_in_flight = 1000000;
    if (r->o.drain_s <= 0)
        r->o.drain_s = 10;
    if (r->o.speed < 0)
        r->o.speed = 0;
    if ((r->pace = dsec_pace_new()) == NULL) {
        dsec_free(r);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "replay: out of memory");
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->jobs.mu, NULL);
    pthread_cond_init(&r->jobs.cond, NULL);
    r->sbx = dsec_calloc(t->n + 1, sizeof *r->sbx);
    r->reqs = dsec_calloc(t->n + 1, sizeof *r->reqs);
    r->lat = dsec_calloc(t->n + 1, sizeof *r->lat);
    r->b = dsec_calloc(SIM_MAX_BUCKETS, sizeof *r->b);
    dsec_bus_new_id(r->run_id);
    r->run_id[8] = '\0';
    /* one bucket per second of replay time, stretched so a long replay fits */
    double span = t->n ? (double)t->ops[t->n - 1].t_ns / 1e9 : 0;
    if (r->o.speed > 0)
        span /= r->o.speed;
    r->bucket_s = span / (SIM_MAX_BUCKETS / 2) > 1 ? ceil(span / (SIM_MAX_BUCKETS / 2)) : 1;
    if (r->o.speed == 0)
        r->bucket_s = 0.1;
    *out = r;
    return 0;
}

/* ---- timers: pending destroys and overloaded resends, min-heaps by due time ---------- */
static void timers_push(sim_replay *r, struct sim_timer **heap, size_t *n, size_t *cap, double due,
                        long ix)
{
    pthread_mutex_lock(&r->mu);
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 1024;
        *heap = dsec_realloc(*heap, *cap * sizeof **heap);
    }
    struct sim_timer *h = *heap;
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2].due > due) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = (struct sim_timer){due, ix};
    pthread_mutex_unlock(&r->mu);
}

/* Pop the earliest timer due by now; -1 when none. */
static long timers_pop_due(sim_replay *r, bool resends, double now, double *next)
{
    pthread_mutex_lock(&r->mu);
    struct sim_timer *h = resends ? r->rheap : r->heap; /* read under mu: a push may move it */
    size_t *n = resends ? &r->nrheap : &r->nheap;
    long ix = -1;
    if (*n && h[0].due <= now) {
        ix = h[0].ix;
        struct sim_timer last = h[--*n];
        size_t i = 0;
        for (;;) {
            size_t c = 2 * i + 1;
            if (c >= *n)
                break;
            if (c + 1 < *n && h[c + 1].due < h[c].due)
                c++;
            if (h[c].due >= last.due)
                break;
            h[i] = h[c];
            i = c;
        }
        if (*n)
            h[i] = last;
    }
    *next = *n ? h[0].due : INFINITY;
    pthread_mutex_unlock(&r->mu);
    return ix;
}

static void heap_push(sim_replay *r, double due, long ix)
{
    timers_push(r, &r->heap, &r->nheap, &r->cap_heap, due, ix);
}

static long heap_pop_due(sim_replay *r, double now, double *next)
{
    return timers_pop_due(r, false, now, next);
}

static long resend_pop_due(sim_replay *r, double now, double *next)
{
    return timers_pop_due(r, true, now, next);
}

static uint64_t pace_us(double t)
{
    return (uint64_t)(t * 1e6);
}

/* A create answered "overloaded" goes again as libdsec sends it: the same
 * attempt (same req_id), after the answer's retry_after_ms plus up to half
 * as much again of jitter, while that leaves 20 ms before its deadline.
 * true: it will (it stays in flight); false: the answer stands. */
static bool resend_overloaded(sim_replay *r, struct sim_req *q, const void *data, size_t len,
                              double now)
{
    dsec_msg_error e;
    dsec_err derr;
    if (len == 0 || dsec_decode(dsec_wire_decoder(), DSEC_MSG_ERROR, data, len, &e, &derr) < 0 ||
        e.code == NULL || strcmp(e.code, "overloaded") != 0)
        return false;
    dsec_pace_answer(r->pace, pace_us(now), true);
    double after = (e.retry_after_ms ? (double)e.retry_after_ms : 100) / 1000.0;
    static _Thread_local uint64_t seed; /* answers come on several threads */
    if (seed == 0)
        seed = (uint64_t)(now * 1e9) ^ (uint64_t)(uintptr_t)&seed;
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17; /* xorshift64 */
    double at = now + after * (1.0 + 0.5 * (double)(seed % 1024) / 1024.0);
    if (at + 0.020 >= q->deadline)
        return false;
    atomic_fetch_add(&r->in_flight, 1); /* still owed an answer */
    timers_push(r, &r->rheap, &r->nrheap, &r->cap_rheap, at, q->ix);
    return true;
}

/* ---- answers ------------------------------------------------------------------------- */
void sim_replay_answer(void *req, int status, const char *type, const char *err_code,
                       const void *data, size_t len, const dsec_err *err)
{
    struct sim_req *q = req;
    sim_replay *r = q->r;
    double now = sim_now();
    atomic_fetch_sub(&r->in_flight, 1);
    char kind[80];
    if (q->what == SIM_REQ_CREATE && status == 0 && type && strcmp(type, "error") == 0 &&
        resend_overloaded(r, q, data, len, now))
        return;
    if (q->what == SIM_REQ_CREATE && (status < 0 || (type && strcmp(type, "error") == 0)))
        atomic_store(&r->sbx[q->ix].state, SIM_SBX_FAILED);
    if (status < 0) {
        snprintf(kind, sizeof kind, "%s", dsec_code_name(err ? err->code : DSEC_E_INTERNAL));
        sim_replay_error_msg(r, kind, err ? err->msg : NULL, now);
        return;
    }
    if (type && strcmp(type, "error") == 0) {
        const char *code = err_code, *msg = NULL;
        dsec_msg_error e;
        dsec_err derr;
        if (len && dsec_decode(dsec_wire_decoder(), DSEC_MSG_ERROR, data, len, &e, &derr) == 0) {
            code = code ? code : e.code;
            msg = e.message;
        }
        snprintf(kind, sizeof kind, "%s", code ? code : "error");
        sim_replay_error_msg(r, kind, msg, now);
        /* a sandbox this replay made and has not destroyed is gone: something
         * else (a preemption, a crash) took it; counted once per sandbox */
        long cix = q->what == SIM_REQ_DESTROY ? q->ix
                   : q->what == SIM_REQ_OP    ? r->t->ops[q->ix].create_ix
                                              : -1;
        if (code && strcmp(code, "not_found") == 0 && cix >= 0 &&
            !atomic_exchange(&r->sbx[cix].lost, true))
            atomic_fetch_add(&r->lost, 1);
        return;
    }
    if (q->what != SIM_REQ_CREATE) {
        if (q->what == SIM_REQ_DESTROY)
            atomic_fetch_add(&r->destroyed, 1);
        return;
    }
    dsec_msg_created c;
    dsec_err derr;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CREATED, data, len, &c, &derr) < 0) {
        atomic_store(&r->sbx[q->ix].state, SIM_SBX_FAILED);
        sim_replay_error(r, "bad created reply", now);
        return;
    }
    struct sim_sbx *s = &r->sbx[q->ix];
    size_t nl = strlen(c.id), nn = strlen(c.node);
    if (nl >= sizeof s->id || nn >= sizeof s->node) {
        atomic_store(&s->state, SIM_SBX_FAILED);
        sim_replay_error(r, "bad created reply", now);
        return;
    }
    memcpy(s->node, c.node, nn + 1);
    memcpy(s->id, c.id, nl + 1);
    dsec_pace_answer(r->pace, pace_us(now), false);
    atomic_store_explicit(&s->state, SIM_SBX_LIVE, memory_order_release);
    long li = atomic_fetch_add(&r->nlat, 1);
    r->lat[li].ms = (now - q->due) * 1000;
    r->lat[li].bucket = (uint32_t)sim_bucket_of(r, q->due);
    atomic_fetch_add(&r->creates_ok, 1);
    pthread_mutex_lock(&r->mu);
    r->b[sim_bucket_of(r, now)].created++;
    pthread_mutex_unlock(&r->mu);
    const sim_op *o = &r->t->ops[q->ix];
    if (o->lifetime_s && !r->o.no_lifetimes && !r->explicit_destroy[q->ix]) {
        double life = (double)o->lifetime_s;
        heap_push(r, q->due + (r->o.speed > 0 ? life / r->o.speed : 0), q->ix);
    }
}

void sim_replay_node_report(sim_replay *r, const char *node, bool full, uint64_t live,
                            uint64_t cpu_free_milli, uint64_t mem_free_mb)
{
    pthread_mutex_lock(&r->mu);
    size_t i = 0;
    while (i < r->nnodes && strcmp(r->nodes[i].name, node) != 0)
        i++;
    if (i == r->nnodes && i < SIM_MAX_NODES) {
        snprintf(r->nodes[i].name, sizeof r->nodes[i].name, "%s", node);
        r->nnodes++;
    }
    if (i < SIM_MAX_NODES) {
        r->nodes[i].live = live;
        r->nodes[i].cpu_free = cpu_free_milli;
        r->nodes[i].mem_free = mem_free_mb;
        if (live > r->nodes[i].peak)
            r->nodes[i].peak = live;
        if (full)
            r->nodes[i].synced = r->sync;
    }
    pthread_mutex_unlock(&r->mu);
}

uint64_t sim_replay_sync_begin(sim_replay *r)
{
    pthread_mutex_lock(&r->mu);
    uint64_t n = ++r->sync;
    pthread_mutex_unlock(&r->mu);
    return n;
}

size_t sim_replay_sync_wait(sim_replay *r, uint64_t sync, int quiet_ms, int max_ms)
{
    size_t known = 0, answered = 0;
    int still_ms = 0;
    for (int t = 0; t <= max_ms; t += 10) {
        pthread_mutex_lock(&r->mu);
        size_t n = r->nnodes, a = 0;
        for (size_t i = 0; i < n; i++)
            a += r->nodes[i].synced >= sync;
        pthread_mutex_unlock(&r->mu);
        still_ms = n == known ? still_ms + 10 : 0;
        known = n;
        answered = a;
        /* everyone heard has answered, and no one new for quiet_ms */
        if (n > 0 && a == n && still_ms > quiet_ms)
            break;
        if (atomic_load(&r->stop))
            break;
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    return answered;
}

void sim_replay_reclaim(sim_replay *r, const char *outcome)
{
    pthread_mutex_lock(&r->mu);
    struct sim_bucket *b = &r->b[sim_bucket_of(r, sim_now())];
    if (strcmp(outcome, "requested") == 0) {
        b->reclaim_requested++;
        r->reclaim_requested++;
    } else if (strcmp(outcome, "honoured") == 0) {
        b->reclaim_honoured++;
        r->reclaim_honoured++;
    } else if (strcmp(outcome, "forced") == 0) {
        b->reclaim_forced++;
        r->reclaim_forced++;
    } else if (strcmp(outcome, "failed") == 0) {
        b->reclaim_failed++;
        r->reclaim_failed++;
    }
    r->reclaims++;
    pthread_mutex_unlock(&r->mu);
}

/* ---- sending ---------------------------------------------------------------------------- */

static bool rewrite_tenant(const sim_replay *r, const char *subject, char *out, size_t n)
{
    if (!r->o.tenant || strncmp(subject, DSEC_SUBJ_ROOT, strlen(DSEC_SUBJ_ROOT)) != 0 ||
        strncmp(subject, DSEC_SUBJ_CTL, strlen(DSEC_SUBJ_CTL)) == 0)
        return false;
    const char *rest = strchr(subject + 8, '.');
    if (!rest)
        return false;
    return snprintf(out, n, DSEC_SUBJ_ROOT "%s%s", r->o.tenant, rest) < (int)n;
}

/* A create's request waits as long as its deadline (set by send_create) leaves: the first
 * ask's, kept through the pace's wait and any resend; other requests wait the timeout. */
static int send(sim_replay *r, int what, long ix, const char *subject, const dsec_hdr *h,
                const void *data, size_t len, bool request, double due)
{
    dsec_err err;
    int rc;
    atomic_fetch_add(&r->ops_sent, 1);
    if (!request) {
        rc = r->sink.publish(r->sink.ctx, subject, h, data, len, &err);
        if (rc < 0)
            sim_replay_error(r, dsec_code_name(err.code), due);
        return rc;
    }
    if (atomic_load(&r->in_flight) >= r->o.max_in_flight) {
        sim_replay_error(r, "replayer in-flight cap", due);
        return -1;
    }
    struct sim_req *q = &r->reqs[ix];
    if (what == SIM_REQ_DESTROY)
        q = &r->sbx[ix].destroy_req;
    q->r = r;
    q->what = what;
    q->ix = ix;
    q->due = due;
    int timeout_ms = r->o.timeout_ms;
    if (what == SIM_REQ_CREATE) {
        double left = q->deadline - sim_now();
        timeout_ms = left > 0.001 ? (int)(left * 1000.0) : 1;
    }
    atomic_fetch_add(&r->in_flight, 1);
    rc = r->sink.request(r->sink.ctx, subject, h, data, len, timeout_ms, q, &err);
    if (rc < 0) {
        atomic_fetch_sub(&r->in_flight, 1);
        if (what == SIM_REQ_CREATE)
            atomic_store(&r->sbx[ix].state, SIM_SBX_FAILED);
        sim_replay_error(r, dsec_code_name(err.code), due);
    }
    return rc;
}

/* A create the pace gave up: its wait for its turn would pass (or came too near) its deadline,
 * so it is answered "overloaded" on the client, as libdsec answers it. */
static void pace_give_up(sim_replay *r, long ix, double now)
{
    atomic_store(&r->sbx[ix].state, SIM_SBX_FAILED);
    sim_replay_error_msg(r, "overloaded",
                         "held back by the replay's pace (as libdsec's) until too near its "
                         "deadline",
                         now);
}

/* resend: the same attempt again after "overloaded" (counted once, its deadline kept).
 * paced: the pace let it go (its turn came); else the pace is asked first, as libdsec does:
 * while the cell sheds creates, they wait their turn in the pace's queue (a resend at the
 * front: it came first). */
static void send_create(sim_replay *r, long ix, double due, bool resend, bool paced)
{
    const sim_op *o = &r->t->ops[ix];
    dsec_buf *b = dsec_wire_buf();
    dsec_msg_create m;
    dsec_err err;
    char rid[96], subj[256];
    /* a fresh idempotency key per run: replaying twice must create twice */
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CREATE, o->payload, o->len, &m, &err) < 0) {
        sim_replay_error(r, "undecodable create", due);
        return;
    }
    snprintf(rid, sizeof rid, "%.55s-%s", m.req_id, r->run_id);
    m.req_id = rid;
    if (r->o.force_type)
        m.type = r->o.force_type;
    if (r->o.tenant && m.tenant)
        m.tenant = r->o.tenant;
    if (dsec_encode(b, DSEC_MSG_CREATE, &m, &err) < 0) {
        sim_replay_error(r, "unencodable create", due);
        return;
    }
    const char *subject = rewrite_tenant(r, o->subject, subj, sizeof subj) ? subj : o->subject;
    dsec_hdr h = {.type = "create", .schema = DSEC_SCHEMA_VERSION, .req_id = rid};
    struct sim_req *q = &r->reqs[ix];
    if (resend) {
        if (!paced)
            atomic_fetch_add(&r->resent, 1);
    } else if (!paced) {
        atomic_fetch_add(&r->creates_sent, 1);
        pthread_mutex_lock(&r->mu);
        r->b[sim_bucket_of(r, due)].sent++;
        pthread_mutex_unlock(&r->mu);
        q->deadline = sim_now() + r->o.timeout_ms / 1000.0;
    }
    if (!paced) {
        double now = sim_now();
        q->r = r; /* what the pace hands back to pace_due */
        q->what = SIM_REQ_CREATE;
        q->ix = ix;
        q->due = due;
        q->pi.deadline_us = pace_us(q->deadline);
        int rc = dsec_pace_admit(r->pace, &q->pi, pace_us(now), resend);
        if (rc > 0) {
            atomic_fetch_add(&r->in_flight, 1); /* held: still owed an answer */
            return;
        }
        if (rc < 0) {
            pace_give_up(r, ix, now);
            return;
        }
    }
    send(r, SIM_REQ_CREATE, ix, subject, &h, b->data, b->len, true, due);
}

/* The creates the pace held back whose turn has come go; those too near their deadline are
 * given up. Returns when the next one's turn may come (INFINITY: none is held). */
static double pace_due(sim_replay *r, double now)
{
    bool give_up;
    uint64_t next;
    dsec_pace_item *it;
    while ((it = dsec_pace_due(r->pace, pace_us(now), &give_up, &next)) != NULL) {
        struct sim_req *q = (struct sim_req *)((char *)it - offsetof(struct sim_req, pi));
        atomic_fetch_sub(&r->in_flight, 1); /* sent, it counts itself in again */
        if (give_up)
            pace_give_up(r, q->ix, now);
        else
            send_create(r, q->ix, q->due, false, true);
    }
    return next == UINT64_MAX ? INFINITY : (double)next / 1e6;
}

static void send_destroy(sim_replay *r, long ix, double due)
{
    struct sim_sbx *s = &r->sbx[ix];
    if (atomic_exchange(&s->state, SIM_SBX_GONE) != SIM_SBX_LIVE)
        return;
    const sim_op *o = &r->t->ops[ix];
    char subj[320], tenant[64] = "sim";
    const char *p = o->subject + 8, *dot = strchr(p, '.');
    if (r->o.tenant)
        snprintf(tenant, sizeof tenant, "%s", r->o.tenant);
    else if (dot && dot - p < (long)sizeof tenant)
        snprintf(tenant, sizeof tenant, "%.*s", (int)(dot - p), p);
    snprintf(subj, sizeof subj, DSEC_SUBJ_SBX, tenant, s->node, s->id, "op");
    dsec_msg_op m = {.id = s->id, .op = "destroy"};
    dsec_buf *b = dsec_wire_buf();
    dsec_err err;
    if (dsec_encode(b, DSEC_MSG_OP, &m, &err) < 0) {
        sim_replay_error(r, "unencodable destroy", due);
        return;
    }
    dsec_hdr h = {.type = "op", .schema = DSEC_SCHEMA_VERSION};
    atomic_fetch_add(&r->destroys_sent, 1);
    send(r, SIM_REQ_DESTROY, ix, subj, &h, b->data, b->len, true, due);
}

/* An operation on a sandbox the trace created: point it at the replayed one.
 * While that sandbox's create is unanswered the operation waits (it cannot be
 * addressed yet), and so do the sandbox's later operations, to keep their
 * order; its latency still counts from its due time. Returns 1 when it had to
 * wait (the caller queues it), else 0. */
static int send_sbx(sim_replay *r, long ix, double due, bool queued)
{
    const sim_op *o = &r->t->ops[ix];
    struct sim_sbx *s = o->create_ix >= 0 ? &r->sbx[o->create_ix] : NULL;
    int st = s ? atomic_load_explicit(&s->state, memory_order_acquire) : SIM_SBX_FAILED;
    if (s && (st == SIM_SBX_NONE || (!queued && s->ndeferred > 0)) && r->reqs[o->create_ix].r) {
        if (!queued) {
            s->ndeferred++;
            atomic_fetch_add(&r->waited, 1);
        }
        return 1;
    }
    if (s && queued)
        s->ndeferred--;
    if (st != SIM_SBX_LIVE) {
        atomic_fetch_add(&r->unmapped, 1);
        sim_replay_error(r, "sandbox not created in this replay", due);
        return 0;
    }
    int type = dsec_msg_type_from_name(o->msg_type);
    union {
        dsec_msg_exec e;
        dsec_msg_op op;
        dsec_msg_file_write w;
        dsec_msg_file_read rd;
        dsec_msg_file_list l;
    } u;
    dsec_err err;
    if (type == DSEC_MSG_NONE ||
        dsec_decode(dsec_wire_decoder(), type, o->payload, o->len, &u, &err) < 0) {
        sim_replay_error(r, "undecodable sandbox op", due);
        return 0;
    }
    switch (type) {
    case DSEC_MSG_EXEC:
        u.e.id = s->id;
        break;
    case DSEC_MSG_OP:
        u.op.id = s->id;
        break;
    case DSEC_MSG_FILE_WRITE:
        u.w.id = s->id;
        break;
    case DSEC_MSG_FILE_READ:
        u.rd.id = s->id;
        break;
    case DSEC_MSG_FILE_LIST:
        u.l.id = s->id;
        break;
    default:
        sim_replay_error(r, "unknown sandbox op", due);
        return 0;
    }
    dsec_buf *b = dsec_wire_buf();
    if (dsec_encode(b, type, &u, &err) < 0) {
        sim_replay_error(r, "unencodable sandbox op", due);
        return 0;
    }
    /* dsec.v1.<tenant>.sbx.<node>.<id>.<verb> */
    const char *verb = strrchr(o->subject, '.');
    char tenant[64], subj[320];
    const char *p = o->subject + strlen(DSEC_SUBJ_ROOT), *dot = strchr(p, '.');
    snprintf(tenant, sizeof tenant, "%.*s", (int)(dot - p), p);
    snprintf(subj, sizeof subj, DSEC_SUBJ_SBX, r->o.tenant ? r->o.tenant : tenant, s->node, s->id,
             verb + 1);
    if (o->destroys)
        atomic_store(&s->state, SIM_SBX_GONE);
    dsec_hdr h = {.type = o->msg_type, .schema = DSEC_SCHEMA_VERSION, .req_id = o->req_id};
    atomic_fetch_add(&r->sbx_sent, 1);
    send(r, o->destroys ? SIM_REQ_DESTROY : SIM_REQ_OP, ix, subj, &h, b->data, b->len, o->request,
         due);
    return 0;
}

/* Send the waiting operations whose sandboxes are answered for (in order);
 * with give_up, fail the rest. */
static void run_deferred(sim_replay *r, bool give_up)
{
    size_t k = 0;
    for (size_t j = 0; j < r->ndeferred; j++) {
        long ix = r->deferred[j];
        const sim_op *o = &r->t->ops[ix];
        struct sim_sbx *s = &r->sbx[o->create_ix];
        double due = r->t_start + (r->o.speed > 0 ? (double)o->t_ns / 1e9 / r->o.speed : 0);
        if (give_up && atomic_load(&s->state) == SIM_SBX_NONE) {
            atomic_store(&s->state, SIM_SBX_FAILED);
            sim_replay_error(r, "create never answered", due);
        }
        if (send_sbx(r, ix, due, true))
            r->deferred[k++] = ix;
    }
    r->ndeferred = k;
}

static void send_other(sim_replay *r, long ix, double due)
{
    const sim_op *o = &r->t->ops[ix];
    dsec_hdr h = {.type = o->msg_type[0] ? o->msg_type : NULL,
                  .schema = DSEC_SCHEMA_VERSION,
                  .req_id = o->req_id};
    atomic_fetch_add(&r->sends, 1);
    send(r, SIM_REQ_OP, ix, o->subject, &h, o->payload, o->len, o->request, due);
}

static void progress(sim_replay *r, size_t done, bool last)
{
    size_t n = r->t->n;
    double frac = n ? (double)done / (double)n : 1;
    int w = 30, fill = (int)(frac * w);
    char bar[40];
    for (int i = 0; i < w; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[w] = '\0';
    pthread_mutex_lock(&r->mu);
    uint64_t reclaims = r->reclaims;
    pthread_mutex_unlock(&r->mu);
    dsec_log_info("\r[%s] %3.0f%% %zu/%zu records, %ld in flight, %" PRIu64 " created, %" PRIu64
                  " reclaim events, %" PRIu64 " errors%s",
                  bar, frac * 100, done, n, (long)atomic_load(&r->in_flight),
                  (uint64_t)atomic_load(&r->creates_ok), reclaims,
                  (uint64_t)atomic_load(&r->errors), last ? "" : "   ");
    fflush(stderr);
}

static void sample(sim_replay *r, double now)
{
    pthread_mutex_lock(&r->mu);
    struct sim_bucket *b = &r->b[sim_bucket_of(r, now)];
    b->live = atomic_load(&r->creates_ok) - atomic_load(&r->destroyed);
    uint64_t nl = 0;
    for (size_t i = 0; i < r->nnodes; i++)
        nl += r->nodes[i].live;
    b->node_live = nl;
    b->in_flight = (uint64_t)atomic_load(&r->in_flight);
    size_t bi = sim_bucket_of(r, now);
    if (bi + 1 > r->nbuckets)
        r->nbuckets = bi + 1;
    pthread_mutex_unlock(&r->mu);
}

/* Send the trace's ops due by now, in order from *i, at most 4,096 of them; the count sent. */
static size_t send_due(sim_replay *r, size_t *i, double now)
{
    const sim_trace *t = r->t;
    double speed = r->o.speed;
    size_t batch = 0;
    while (*i < t->n && batch < 4096) {
        const sim_op *o = &t->ops[*i];
        double due = r->t_start + (speed > 0 ? (double)o->t_ns / 1e9 / speed : 0);
        if (due > now)
            break;
        switch (o->kind) {
        case SIM_OP_CREATE:
            send_create(r, (long)*i, due, false, false);
            break;
        case SIM_OP_SBX:
            if (send_sbx(r, (long)*i, due, false))
                r->deferred[r->ndeferred++] = (long)*i;
            break;
        case SIM_OP_SEND:
            send_other(r, (long)*i, due);
            break;
        case SIM_OP_JOB:
            sim_jobs_due(r, (long)*i);
            break;
        default:
            atomic_fetch_add(&r->seen, 1);
            break;
        }
        (*i)++;
        batch++;
    }
    return batch;
}

/* After the trace: the unanswered creates get their answer (or timeout), the rest is destroyed,
 * and a checkpoint under way finishes. */
static void drain(sim_replay *r)
{
    const sim_trace *t = r->t;
    /* the creates still unanswered get their answer (or timeout) first, then the rest is destroyed
     */
    double until = r->t_sent + r->o.drain_s;
    while (atomic_load(&r->in_flight) > 0 && sim_now() < until && !atomic_load(&r->stop)) {
        double nr;
        long rx;
        while ((rx = resend_pop_due(r, sim_now(), &nr)) >= 0) {
            atomic_fetch_sub(&r->in_flight, 1);
            send_create(r, rx, r->reqs[rx].due, true, false);
        }
        pace_due(r, sim_now());
        usleep(1000);
    }
    if (r->o.destroy_at_end) {
        double nt;
        long ix;
        while ((ix = heap_pop_due(r, INFINITY, &nt)) >= 0)
            send_destroy(r, ix, sim_now());
        for (size_t k = 0; k < t->n; k++)
            if (t->ops[k].kind == SIM_OP_CREATE)
                send_destroy(r, (long)k, sim_now());
        while (atomic_load(&r->in_flight) > 0 && sim_now() < until + r->o.drain_s &&
               !atomic_load(&r->stop))
            usleep(1000);
    }
    /* a checkpoint under way finishes and its units go back (the arbiter
     * then reports the reclaim honoured); then the jobs end, giving back
     * what they still hold */
    double ck_until = sim_now() + r->o.drain_s;
    while (atomic_load(&r->checkpointing) > 0 && sim_now() < ck_until && !atomic_load(&r->stop))
        usleep(1000);
}

int sim_replay_run(sim_replay *r, dsec_err *err)
{
    (void)err;
    const sim_trace *t = r->t;
    r->explicit_destroy = dsec_calloc(t->n + 1, sizeof *r->explicit_destroy);
    for (size_t i = 0; i < t->n; i++)
        if (t->ops[i].kind == SIM_OP_SBX && t->ops[i].destroys && t->ops[i].create_ix >= 0)
            r->explicit_destroy[t->ops[i].create_ix] = true;
    r->deferred = dsec_calloc(t->n + 1, sizeof *r->deferred);
    r->t_start = sim_now();
    double next_ui = r->t_start, next_sample = r->t_start;
    double speed = r->o.speed;
    size_t i = 0;
    for (;;) {
        double now = sim_now();
        if (atomic_load(&r->stop))
            break;
        /* the trace, in order, everything due by now */
        size_t batch = send_due(r, &i, now);
        if (r->ndeferred)
            run_deferred(r, false);
        double next_timer;
        long ix;
        while ((ix = heap_pop_due(r, now, &next_timer)) >= 0)
            send_destroy(r, ix, now);
        double next_resend;
        while ((ix = resend_pop_due(r, now, &next_resend)) >= 0) {
            atomic_fetch_sub(&r->in_flight, 1); /* send counts it in again */
            send_create(r, ix, r->reqs[ix].due, true, false);
        }
        double next_paced = pace_due(r, now);
        if (next_resend < next_timer)
            next_timer = next_resend;
        if (next_paced < next_timer)
            next_timer = next_paced;
        if (now >= next_sample) {
            sample(r, now);
            next_sample = now + r->bucket_s / 2;
        }
        if (r->o.progress && now >= next_ui) {
            progress(r, i, false);
            next_ui = now + 0.2;
        }
        if (i >= t->n && r->ndeferred) {
            if (r->t_trace_end == 0)
                r->t_trace_end = now;
            if (now - r->t_trace_end > r->o.drain_s)
                run_deferred(r, true);
        }
        if (i >= t->n && r->ndeferred == 0) {
            bool timers = next_timer < INFINITY;
            if (!timers || r->o.destroy_at_end)
                break;
        }
        if (batch == 4096)
            continue;
        double next =
            i < t->n ? r->t_start + (double)t->ops[i].t_ns / 1e9 / (speed > 0 ? speed : INFINITY)
                     : INFINITY;
        if (next_timer < next)
            next = next_timer;
        if (next_sample < next)
            next = next_sample;
        double d = next - sim_now();
        if (d > 0.002 || r->ndeferred)
            d = r->ndeferred ? 0.0002 : 0.002;
        if (d > 0)
            nanosleep(&(struct timespec){0, (long)(d * 1e9)}, NULL);
    }
    r->t_sent = sim_now();
    drain(r);
    sim_jobs_stop(r);
    r->t_end = sim_now();
    sample(r, r->t_end);
    if (r->o.progress)
        progress(r, i, true);
    return 0;
}

void sim_replay_stop(sim_replay *r)
{
    atomic_store(&r->stop, 1);
}

static int cmp_lat(const void *a, const void *b)
{
    double x = ((const struct sim_lat *)a)->ms, y = ((const struct sim_lat *)b)->ms;
    return x < y ? -1 : x > y;
}

void sim_replay_result_get(sim_replay *r, sim_replay_result *out)
{
    memset(out, 0, sizeof *out);
    out->ops_sent = atomic_load(&r->ops_sent);
    out->creates_sent = atomic_load(&r->creates_sent);
    out->creates_ok = atomic_load(&r->creates_ok);
    out->sbx_sent = atomic_load(&r->sbx_sent);
    out->sends = atomic_load(&r->sends);
    out->destroys_sent = atomic_load(&r->destroys_sent);
    out->errors = atomic_load(&r->errors);
    out->unmapped = atomic_load(&r->unmapped);
    out->in_flight = atomic_load(&r->in_flight);
    out->waited = atomic_load(&r->waited);
    out->elapsed_s = r->t_sent - r->t_start;
    out->ops_per_s = out->elapsed_s > 0 ? (double)out->ops_sent / out->elapsed_s : 0;
    long n = atomic_load(&r->nlat);
    if (!r->lat_sorted) {
        qsort(r->lat, (size_t)n, sizeof *r->lat, cmp_lat);
        r->lat_sorted = true;
    }
    out->lat_p50_ms = sim_lat_pct(r->lat, (size_t)n, 0.50);
    out->lat_p99_ms = sim_lat_pct(r->lat, (size_t)n, 0.99);
    pthread_mutex_lock(&r->mu);
    out->reclaim_requested = r->reclaim_requested;
    out->reclaim_honoured = r->reclaim_honoured;
    out->reclaim_forced = r->reclaim_forced;
    out->reclaim_failed = r->reclaim_failed;
    pthread_mutex_unlock(&r->mu);
    out->jobs_started = atomic_load(&r->jobs_started);
    out->jobs_failed = atomic_load(&r->jobs_failed);
    out->jobs_skipped = atomic_load(&r->jobs_skipped);
    out->job_reclaims = atomic_load(&r->job_reclaims);
    out->job_checkpoints = atomic_load(&r->job_checkpoints);
    out->job_units_released = atomic_load(&r->job_units_released);
    out->job_units_forced = atomic_load(&r->job_units_forced);
    out->lost = atomic_load(&r->lost);
}

double sim_lat_pct(const struct sim_lat *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t i = (size_t)ceil(p * (double)n);
    return v[i ? i - 1 : 0].ms;
}

void sim_replay_free(sim_replay *r)
{
    if (!r)
        return;
    sim_jobs_stop(r); /* a replay freed without running to its end */
    pthread_mutex_destroy(&r->jobs.mu);
    pthread_cond_destroy(&r->jobs.cond);
    dsec_free(r->jobs.queue);
    pthread_mutex_destroy(&r->mu);
    dsec_free(r->sbx);
    dsec_free(r->reqs);
    dsec_free(r->lat);
    dsec_free(r->b);
    dsec_free(r->heap);
    dsec_free(r->rheap);
    dsec_free(r->explicit_destroy);
    dsec_free(r->deferred);
    dsec_pace_free(r->pace);
    dsec_free(r);
}
