/* create.c - libdsec's creates: asynchronous with safe retries, synchronous, and into completion
 * queues. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "client/internal.h"
#include "codecs/subjects.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/names.h"

/* When this client stops waiting for an attempt sent now (wall clock, ns). A
 * node that gets the placement only after that does not create it: the
 * client has given up on it or retried, and a late sandbox would be a second
 * one for the same request. */
static uint64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t deadline_ns(const dsec_client *c)
{
    return wall_ns() + (uint64_t)c->timeout_ms * 1000000ull;
}

/* ---- create --------------------------------------------------------------- */

/* Holds a create message and everything it borrows, built from a spec. m
 * borrows the caller's strings: it is valid only during the call that built
 * it; later (retries) only buf, req_id and subject are used. */
struct create_req {
    dsec_msg_create m;
    char req_id[33];
    char subject[256];
    dsec_buf buf;
};

static void create_req_release(struct create_req *r)
{
    dsec__client_kv_release(&r->m.labels);
    dsec__client_kv_release(&r->m.affinity);
    dsec_buf_release(&r->buf);
}

static int create_req_build(dsec_client *c, const dsec_create_spec *s, struct create_req *r,
                            dsec_err *err)
{
    memset(r, 0, sizeof *r);
    dsec_buf_init(&r->buf);
    if (s->req_id != NULL)
        dsec__client_copy_str(r->req_id, sizeof r->req_id, s->req_id);
    else
        dsec_bus_new_id(r->req_id);
    if (s->req_id != NULL && strlen(s->req_id) >= sizeof r->req_id)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "req_id: longer than %zu characters",
                            sizeof r->req_id - 1);
    dsec_msg_create *m = &r->m;
    m->req_id = r->req_id;
    m->tenant = c->tenant;
    m->type = s->type && s->type[0] ? s->type : NULL;
    m->requires = (dsec_strv){(const char **)s->requires, dsec__client_count_nt(s->requires)};
    m->env = s->env;
    m->cpu_milli = s->cpu_milli;
    m->memory_mb = s->memory_mb;
    m->disk_mb = s->disk_mb;
    m->ttl_s = s->ttl_s;
    m->idle_s = s->idle_s;
    m->cell = s->cell && s->cell[0] ? s->cell : NULL;
    m->cls = s->cls;
    m->priority = s->priority;
    m->rollout_id = s->rollout_id;
    m->pausable = s->pausable;
    m->deadline_ns = deadline_ns(c);
    m->project = s->project && s->project[0] ? s->project : NULL;
    if (m->project != NULL && dsec_project_ok(m->project, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(
            err, DSEC_E_INVALID, 0,
            "project \"%.64s\": names of [A-Za-z0-9_-] joined by '/', at most 64 characters",
            m->project);
    m->net = (dsec_strv){(const char **)s->net, dsec__client_count_nt(s->net)};
    if (dsec__client_kv_from_pairs(s->labels, &m->labels, "labels", err) < 0 ||
        dsec__client_kv_from_pairs(s->affinity, &m->affinity, "affinity", err) < 0)
        return -1;
    if (m->cell != NULL && dsec_name_ok(m->cell, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "cell \"%s\": not a valid cell name", m->cell);
    if (m->cell)
        snprintf(r->subject, sizeof r->subject, DSEC_SUBJ_CREATE_CELL, c->tenant, m->cell);
    else
        snprintf(r->subject, sizeof r->subject, DSEC_SUBJ_CREATE, c->tenant);
    return dsec_encode(&r->buf, DSEC_MSG_CREATE, m, err);
}

static void info_from_created(const dsec_msg_created *cr, dsec_sandbox_info *out)
{
    memset(out, 0, sizeof *out);
    dsec__client_copy_str(out->id, sizeof out->id, cr->id);
    dsec__client_copy_str(out->node, sizeof out->node, cr->node);
    dsec__client_copy_str(out->type, sizeof out->type, cr->type);
    dsec__client_copy_str(out->state, sizeof out->state, cr->state);
    dsec__client_copy_str(out->cell, sizeof out->cell, cr->cell);
    out->existing = cr->existing;
}

/* An in-flight asynchronous create. */
struct async_create {
    dsec_client *c;
    struct create_req r;
    dsec_create_cb cb;
    void *ud;
    bool direct; /* cb never blocks: it runs where the reply arrives (dsec_bus_request_direct) */
    int retry;
    uint64_t deadline_ns;       /* the current attempt's (as sent) */
    uint64_t resend_ns;         /* in the retrier's queue: when it goes out (wall clock) */
    bool resend_as_is;          /* it was answered "overloaded": the same attempt goes again */
    dsec_pace_item pi;          /* held back by the client's pace (c->pace, dsec/pace.h) */
    struct async_create *rnext; /* waiting for its retry (client rmu), by resend_ns */
    char trace[DSEC_TRACE_ID_MAX + 1]; /* every attempt carries the first one's trace id */
    /* Held while an attempt is being sent. The bus may answer an attempt
     * (a disconnect, a deadline) before dsec_bus_request has returned, and
     * the answer re-encodes r.buf or frees it all: it waits for the send to
     * let go of r first. */
    pthread_mutex_t send_mu;
};

static int async_send(struct async_create *a, dsec_err *err);
static void async_finish(struct async_create *a, int status, const dsec_sandbox_info *info,
                         const dsec_err *err);
static int reencode_retry(struct async_create *a, dsec_err *err);
static int pace_send(struct async_create *a, bool front, dsec_err *err);

/* A create the pace held back: its turn came (it goes), or its deadline came too near while it
 * waited, or the client closes (it goes now, so that it is answered before the bus drains). */
static void pace_release(struct async_create *a, bool give_up)
{
    dsec_err err;
    if (give_up) {
        dsec_err_set(&err, DSEC_E_OVERLOADED, 0,
                     "the cell has been answering creates \"overloaded\", and this create waited "
                     "its turn on the client (its pace) until its deadline was too near to send "
                     "it; try again later or with a longer timeout");
        err.retry_after_ms = 100;
        async_finish(a, -1, NULL, &err);
    } else if (async_send(a, &err) < 0) {
        async_finish(a, -1, NULL, &err);
    }
}

#define PACE_ITEM_CREATE(it)                                                                       \
    ((struct async_create *)((char *)(it)-offsetof(struct async_create, pi)))

/* The held creates whose turn has come, in order (rmu not held); *next_ns: when the next one's
 * may (UINT64_MAX: none is held). */
static void pace_due(dsec_client *c, uint64_t *next_ns)
{
    bool give_up;
    uint64_t next_us;
    dsec_pace_item *it;
    while ((it = dsec_pace_due(c->pace, wall_ns() / 1000, &give_up, &next_us)) != NULL)
        pace_release(PACE_ITEM_CREATE(it), give_up);
    *next_ns = next_us == UINT64_MAX ? UINT64_MAX : next_us * 1000;
}

/* Resend the creates that waited out their attempt's deadline or their retry_after_ms, and send
 * those the pace held back when their turn comes. */
static void *retrier_main(void *arg)
{
    dsec_client *c = arg;
    pthread_mutex_lock(&c->rmu);
    for (;;) {
        uint64_t pace_ns;
        bool stop = c->retrier_stop;
        pthread_mutex_unlock(&c->rmu);
        if (stop) {
            for (dsec_pace_item *it = dsec_pace_take_all(c->pace), *nx; it != NULL; it = nx) {
                nx = it->next;
                pace_release(PACE_ITEM_CREATE(it), false);
            }
            pace_ns = UINT64_MAX;
        } else {
            pace_due(c, &pace_ns);
        }
        pthread_mutex_lock(&c->rmu);
        struct async_create *a = c->rhead;
        uint64_t now = wall_ns();
        if (a == NULL || (!c->retrier_stop && now < a->resend_ns)) {
            if (a == NULL && pace_ns == UINT64_MAX && c->retrier_stop &&
                dsec_pace_queued(c->pace) == 0)
                break;
            if (pace_ns == UINT64_MAX && dsec_pace_queued(c->pace) > 0)
                continue; /* held while the pace was looked at: it is looked at again */
            uint64_t at = a != NULL && a->resend_ns < pace_ns ? a->resend_ns : pace_ns;
            if (at == UINT64_MAX && !c->retrier_stop) {
                pthread_cond_wait(&c->rcv, &c->rmu);
            } else if (!c->retrier_stop) { /* CLOCK_REALTIME, like the deadline */
                struct timespec ts = {(time_t)(at / 1000000000ull), (long)(at % 1000000000ull)};
                pthread_cond_timedwait(&c->rcv, &c->rmu, &ts);
            }
            continue;
        }
        c->rhead = a->rnext;
        if (c->rhead == NULL)
            c->rtail = NULL;
        pthread_mutex_unlock(&c->rmu);
        dsec_err err;
        if (a->resend_as_is) { /* overloaded: the same attempt, its deadline kept, paced */
            a->resend_as_is = false;
            if (pace_send(a, true, &err) < 0)
                async_finish(a, -1, NULL, &err);
        } else if (reencode_retry(a, &err) < 0 || async_send(a, &err) < 0) {
            async_finish(a, -1, NULL, &err);
        }
        pthread_mutex_lock(&c->rmu);
    }
    pthread_mutex_unlock(&c->rmu);
    return NULL;
}

/* Into the retrier's queue, in resend_ns order (rmu held). Most arrive in
 * order, so the tail is checked first; the rest walk from the head. */
static void retrier_enqueue(dsec_client *c, struct async_create *a)
{
    a->rnext = NULL;
    if (c->rtail == NULL) {
        c->rhead = c->rtail = a;
    } else if (c->rtail->resend_ns <= a->resend_ns) {
        c->rtail->rnext = a;
        c->rtail = a;
    } else if (a->resend_ns < c->rhead->resend_ns) {
        a->rnext = c->rhead;
        c->rhead = a;
    } else {
        struct async_create *p = c->rhead;
        while (p->rnext != NULL && p->rnext->resend_ns <= a->resend_ns)
            p = p->rnext;
        a->rnext = p->rnext;
        p->rnext = a;
    }
    pthread_cond_signal(&c->rcv);
}

/* A retrier thread, started on first need; false if none can run (rmu held). */
static bool retrier_running(dsec_client *c)
{
    if (!c->retrier_started && !c->retrier_stop)
        c->retrier_started = pthread_create(&c->retrier, NULL, retrier_main, c) == 0;
    return c->retrier_started && !c->retrier_stop;
}

/* An attempt goes now; or it waits for its turn in the client's pace, which the retrier
 * sends it at (0 too); or, when that wait would pass its deadline, it is answered "overloaded"
 * here (-1). front: a create shed before, back from its retry_after_ms (it came first). Only a
 * client that retries "overloaded" (retries > 0) paces: one that does not wants each create
 * sent once and the cell's own answer. */
static int pace_send(struct async_create *a, bool front, dsec_err *err)
{
    dsec_client *c = a->c;
    int rc = 0;
    if (c->retries == 0) /* a client that does not retry "overloaded" takes the cell's answer */
        return async_send(a, err);
    pthread_mutex_lock(&c->rmu);
    if (!c->retrier_stop && retrier_running(c)) {
        a->pi.deadline_us = a->deadline_ns != 0 ? a->deadline_ns / 1000 : UINT64_MAX;
        rc = dsec_pace_admit(c->pace, &a->pi, wall_ns() / 1000, front);
        if (rc > 0)
            pthread_cond_signal(&c->rcv);
    }
    pthread_mutex_unlock(&c->rmu);
    if (rc > 0)
        return 0;
    if (rc < 0) {
        dsec_err_set(err, DSEC_E_OVERLOADED, 0,
                     "the cell has been answering creates \"overloaded\", and even at twice the "
                     "rate it takes them now this create's turn on the client (its pace) would "
                     "come after its deadline; try again later or with a longer timeout");
        err->retry_after_ms = 100;
        return -1;
    }
    return async_send(a, err);
}

/* The time an answer needs to come back: an "overloaded" retry that would
 * leave with less than this before its deadline is not sent. */
#define OVERLOADED_MIN_LEFT_NS (20ull * 1000000ull)

/* The scheduler answered "overloaded": nothing was placed for this attempt,
 * so the very same attempt (same req_id, same retry count, so the scheduler's
 * handling of an earlier attempt is unchanged) goes again after the answer's
 * retry_after_ms plus up to half as much again of jitter (the shed creates of
 * one burst do not all come back at once), within the attempt's deadline.
 * False (give up with the overloaded error) when that would pass the
 * deadline or no retrier thread could start. */
static bool defer_overloaded(struct async_create *a, const dsec_err *err)
{
    dsec_client *c = a->c;
    uint64_t wait_ms = err->retry_after_ms ? err->retry_after_ms : 100; /* an old scheduler's */
    static _Thread_local uint64_t seed;
    if (seed == 0)
        seed = wall_ns() ^ (uint64_t)(uintptr_t)&seed;
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17; /* xorshift64 */
    wait_ms += seed % (wait_ms / 2 + 1);
    uint64_t at = wall_ns() + wait_ms * 1000000ull;
    if (at + OVERLOADED_MIN_LEFT_NS >= a->deadline_ns)
        return false;
    pthread_mutex_lock(&c->rmu);
    bool ok = retrier_running(c);
    if (ok) {
        a->resend_ns = at;
        a->resend_as_is = true;
        retrier_enqueue(c, a);
    }
    pthread_mutex_unlock(&c->rmu);
    return ok;
}

/* The connection dropped with this create in flight: it may have reached a
 * scheduler, and a node may be creating it right now. Retried at once, the
 * retry's lookup could miss that node while it reconnects and place a second
 * sandbox. After the attempt's deadline no node creates the first attempt any
 * more (it carries the deadline) and one that did has it in its table, where
 * the retry's lookup finds it. So the retry waits until then. False (retry
 * now) when the deadline has passed or no retrier thread could start. */
static bool defer_retry(struct async_create *a)
{
    dsec_client *c = a->c;
    if (wall_ns() >= a->deadline_ns)
        return false;
    pthread_mutex_lock(&c->rmu);
    bool ok = retrier_running(c);
    if (ok) {
        a->resend_ns = a->deadline_ns;
        a->resend_as_is = false;
        retrier_enqueue(c, a);
    }
    pthread_mutex_unlock(&c->rmu);
    return ok;
}

static void async_finish(struct async_create *a, int status, const dsec_sandbox_info *info,
                         const dsec_err *err)
{
    a->cb(status, info, err, a->ud);
    create_req_release(&a->r);
    pthread_mutex_destroy(&a->send_mu);
    dsec_free(a);
}

/* The retry of an asynchronous create: the spec's strings were only borrowed
 * for dsec_create_async, so the message is rebuilt from its own encoding,
 * with the retry count raised (same req_id: the scheduler finds the first). */
static int reencode_retry(struct async_create *a, dsec_err *err)
{
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg_create prev;
    dsec_buf nb;
    dsec_buf_init(&nb);
    int rc = dsec_decode(dec, DSEC_MSG_CREATE, a->r.buf.data, a->r.buf.len, &prev, err);
    if (rc == 0) {
        prev.retry = (uint64_t)a->retry;
        prev.deadline_ns = deadline_ns(a->c); /* a new attempt, a new wait */
        a->deadline_ns = prev.deadline_ns;
        rc = dsec_encode(&nb, DSEC_MSG_CREATE, &prev, err);
    }
    dsec_decoder_free(dec);
    if (rc < 0) {
        dsec_buf_release(&nb);
        return -1;
    }
    dsec_buf_release(&a->r.buf);
    a->r.buf = nb;
    return 0;
}

static void on_create_reply(int status, dsec_msg *reply, const dsec_err *berr, void *ud)
{
    struct async_create *a = ud;
    /* the send of this attempt has returned: r is ours again */
    pthread_mutex_lock(&a->send_mu);
    pthread_mutex_unlock(&a->send_mu);
    dsec_err err;
    dsec_err_clear(&err);
    if (status < 0) {
        err = *berr;
    } else {
        dsec_decoder *dec = dsec_decoder_new(NULL);
        dsec_msg_created cr;
        if (dec == NULL) {
            status = dsec_err_set(&err, DSEC_E_NOMEM, 0, "out of memory");
        } else if ((status = dsec__client_decode_reply(dec, reply, DSEC_MSG_CREATED, &cr, &err)) ==
                   0) {
            dsec_sandbox_info info;
            info_from_created(&cr, &info);
            dsec_decoder_free(dec);
            dsec_pace_answer(a->c->pace, wall_ns() / 1000, false); /* accepted: the pace's */
            async_finish(a, 0, &info, NULL);
            return;
        }
        dsec_decoder_free(dec);
    }
    if (err.code == DSEC_E_OVERLOADED) /* shed: the client's pace hears of it */
        dsec_pace_answer(a->c->pace, wall_ns() / 1000, true);
    /* Overloaded retries do not count against retries (each is a shed, not
     * a failure); the attempt's deadline bounds them. */
    if (err.code == DSEC_E_OVERLOADED && a->c->retries > 0 && defer_overloaded(a, &err))
        return;
    if (err.code != DSEC_E_OVERLOADED && dsec_code_retry_safe(err.code) &&
        a->retry < a->c->retries) {
        a->retry++;
        if (err.code == DSEC_E_CONN && defer_retry(a))
            return;
        dsec_err serr;
        if (reencode_retry(a, &serr) == 0 && async_send(a, &serr) == 0)
            return;
        err = serr;
    }
    async_finish(a, -1, NULL, &err);
}

static int async_send(struct async_create *a, dsec_err *err)
{
    dsec_hdr hdr = {.type = "create",
                    .schema = DSEC_SCHEMA_VERSION,
                    .req_id = a->r.req_id,
                    .trace_id = a->trace};
    int rc;
    /* wait no longer than the attempt's deadline (an overloaded resend has less left) */
    int tmo = a->c->timeout_ms;
    uint64_t now = wall_ns();
    if (a->deadline_ns != 0 && a->deadline_ns <= now)
        tmo = 1;
    else if (a->deadline_ns > now && (a->deadline_ns - now) / 1000000ull < (uint64_t)tmo)
        tmo = (int)((a->deadline_ns - now) / 1000000ull) + 1;
    pthread_mutex_lock(&a->send_mu);
    if (a->direct)
        rc = dsec_bus_request_direct(a->c->bus, a->r.subject, &hdr, a->r.buf.data, a->r.buf.len,
                                     tmo, on_create_reply, a, err);
    else
        rc = dsec_bus_request(a->c->bus, a->r.subject, &hdr, a->r.buf.data, a->r.buf.len, tmo,
                              on_create_reply, a, err);
    pthread_mutex_unlock(&a->send_mu);
    return rc;
}

/* direct: the callback runs where the reply arrives, a thread hand-off
 * sooner. libdsec's own callbacks only queue or signal (completion queues,
 * dsec_create); a caller's (dsec_create_async) may block, so it runs on a
 * bus worker unless the client was told it never does. */
static int create_async(dsec_client *c, const dsec_create_spec *spec, dsec_create_cb cb, void *ud,
                        bool direct, dsec_err *err)
{
    struct async_create *a = dsec_calloc(1, sizeof *a);
    if (a == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    a->c = c;
    a->cb = cb;
    a->ud = ud;
    a->direct = direct;
    pthread_mutex_init(&a->send_mu, NULL);
    /* A retry may leave from the retrier thread or a callback: it keeps the
     * trace the caller's thread gave the first attempt. */
    const char *tid = dsec_trace_current();
    if (tid != NULL)
        snprintf(a->trace, sizeof a->trace, "%s", tid);
    else
        dsec_bus_new_id(a->trace);
    int rc = create_req_build(c, spec, &a->r, err);
    if (rc == 0) {
        a->deadline_ns = a->r.m.deadline_ns;
        rc = pace_send(a, false, err);
    }
    if (rc < 0) {
        create_req_release(&a->r);
        pthread_mutex_destroy(&a->send_mu);
        dsec_free(a);
        return -1;
    }
    return 0;
}

int dsec_create_async(dsec_client *c, const dsec_create_spec *spec, dsec_create_cb cb, void *ud,
                      dsec_err *err)
{
    return create_async(c, spec, cb, ud, c->direct_callbacks, err);
}

/* Synchronous create: an async create and a condition to wait on. */
struct sync_create {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int status;
    dsec_sandbox_info info;
    dsec_err err;
};

static void on_sync_create(int status, const dsec_sandbox_info *info, const dsec_err *err, void *ud)
{
    struct sync_create *s = ud;
    pthread_mutex_lock(&s->mu);
    s->status = status;
    if (info)
        s->info = *info;
    if (err)
        s->err = *err;
    s->done = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

int dsec_create(dsec_client *c, const dsec_create_spec *spec, dsec_sandbox_info *out, dsec_err *err)
{
    struct sync_create s = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    if (create_async(c, spec, on_sync_create, &s, true, err) < 0)
        return -1;
    pthread_mutex_lock(&s.mu);
    while (!s.done)
        pthread_cond_wait(&s.cv, &s.mu);
    pthread_mutex_unlock(&s.mu);
    if (s.status < 0) {
        if (err)
            *err = s.err;
        return -1;
    }
    *out = s.info;
    return 0;
}

/* ---- completion queues (for the SDKs; see client.h) ----------------------- */

struct dsec_cq {
    pthread_mutex_t mu;
    int fd;            /* eventfd: non-zero while events are queued */
    dsec_cq_event *ev; /* ring of cap events */
    size_t cap, head, n;
};

int dsec_cq_new(dsec_cq **out, dsec_err *err)
{
    *out = NULL;
    dsec_cq *q = dsec_calloc(1, sizeof *q);
    if (q == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    q->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->fd < 0) {
        int e = errno;
        dsec_free(q);
        return dsec_err_set(err, DSEC_E_IO, e, "completion queue: eventfd: %s", strerror(e));
    }
    pthread_mutex_init(&q->mu, NULL);
    *out = q;
    return 0;
}

void dsec_cq_free(dsec_cq *q)
{
    if (q == NULL)
        return;
    close(q->fd);
    pthread_mutex_destroy(&q->mu);
    dsec_free(q->ev);
    dsec_free(q);
}

int dsec_cq_fd(const dsec_cq *q)
{
    return q->fd;
}

size_t dsec_cq_poll(dsec_cq *q, dsec_cq_event *out, size_t max)
{
    pthread_mutex_lock(&q->mu);
    size_t k = 0;
    while (k < max && q->n > 0) {
        out[k++] = q->ev[q->head];
        q->head = (q->head + 1) % q->cap;
        q->n--;
    }
    if (q->n == 0) { /* empty: the fd stops being readable (pushes signal under mu) */
        uint64_t v;
        ssize_t r = read(q->fd, &v, sizeof v);
        (void)r;
    }
    pthread_mutex_unlock(&q->mu);
    return k;
}

struct cq_create {
    dsec_cq *q;
    uint64_t token;
};

/* Queue one answer on q (any thread); the eventfd turns readable with the
 * first queued event. An answer that cannot be queued (no memory to grow the
 * ring) is dropped rather than crash. */
static void cq_push(dsec_cq *q, uint64_t token, int status, const dsec_sandbox_info *info,
                    const dsec_err *err)
{
    pthread_mutex_lock(&q->mu);
    if (q->n == q->cap) { /* grow the ring, unwrapping it */
        size_t cap = q->cap ? q->cap * 2 : 256;
        dsec_cq_event *ev = dsec_malloc(cap * sizeof *ev);
        if (ev == NULL) {
            pthread_mutex_unlock(&q->mu);
            return;
        }
        for (size_t i = 0; i < q->n; i++)
            ev[i] = q->ev[(q->head + i) % q->cap];
        dsec_free(q->ev);
        q->ev = ev;
        q->cap = cap;
        q->head = 0;
    }
    dsec_cq_event *e = &q->ev[(q->head + q->n) % q->cap];
    memset(e, 0, sizeof *e);
    e->token = token;
    e->status = status;
    if (status == 0 && info)
        e->info = *info;
    else if (err)
        e->err = *err;
    else
        dsec_err_set(&e->err, DSEC_E_INTERNAL, 0, "create failed without an error");
    if (q->n++ == 0) {
        uint64_t one = 1;
        ssize_t r = write(q->fd, &one, sizeof one);
        (void)r;
    }
    pthread_mutex_unlock(&q->mu);
}

static void on_cq_create(int status, const dsec_sandbox_info *info, const dsec_err *err, void *ud)
{
    struct cq_create *cc = ud;
    cq_push(cc->q, cc->token, status, info, err);
    dsec_free(cc);
}

int dsec_create_cq(dsec_client *c, const dsec_create_spec *spec, dsec_cq *q, uint64_t token,
                   dsec_err *err)
{
    struct cq_create *cc = dsec_malloc(sizeof *cc);
    if (cc == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    cc->q = q;
    cc->token = token;
    if (create_async(c, spec, on_cq_create, cc, true, err) < 0) {
        dsec_free(cc);
        return -1;
    }
    return 0;
}

int dsec_cq_create_batch(dsec_cq *q, dsec_client *c, const dsec_create_spec *const *specs,
                         const uint64_t *tokens, size_t n, dsec_err *err)
{
    if (q == NULL || c == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "create batch: %s is NULL",
                            q == NULL ? "the completion queue" : "the client");
    if (n > 0 && (specs == NULL || tokens == NULL))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "create batch: %zu creates but no %s", n,
                            specs == NULL ? "specs" : "tokens");
    for (size_t i = 0; i < n; i++) {
        dsec_err e;
        dsec_err_clear(&e);
        if (specs[i] == NULL)
            dsec_err_set(&e, DSEC_E_INVALID, 0, "create batch: spec %zu is NULL", i);
        else if (dsec_create_cq(c, specs[i], q, tokens[i], &e) == 0)
            continue;
        /* this one never left: its failure is its answer, in the queue like the rest */
        cq_push(q, tokens[i], -1, NULL, &e);
    }
    return 0;
}
