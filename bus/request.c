/* request.c - requests over a few wildcard inboxes per bus: the table of
 * pending requests, their deadlines, no-responders and disconnects, and
 * answers delivered to futures and to callbacks.
 *
 * Where a reply callback runs. Each inbox subscription has its own nats.c
 * delivery thread. Inbox 0 carries futures and direct requests, whose
 * completions never block. Inboxes 1..threads (at most CB_INBOXES_MAX) carry
 * ordinary requests, and their delivery threads run the callbacks
 * themselves: no hand-off to a bus worker, so a reply costs what a direct
 * one does. New requests use the first callback inbox not held. An ordinary
 * callback may still block: while one has run for STALL_NS, new requests go
 * to the next inbox, so only the replies that were already on their way to
 * that inbox wait for it (as they waited behind it in a worker's queue
 * before). When every callback inbox is held, requests go to inbox 0 and
 * their callbacks to the worker pool, as do callbacks of requests that time
 * out or fail. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "bus/internal.h"
#include "dsec/alloc.h"

#define SUBJ_KEEP 96     /* subject kept for error messages (truncated beyond) */
#define SLAB_RECORDS 256 /* pending records allocated at a time */
#define REPLYQ_BATCH 128 /* callbacks a worker runs per lock round trip */
#define REPLYQ_RUN 64    /* consecutive request ids whose callbacks share a queue */
#define STALL_NS 1000000 /* a callback running this long holds its inbox: route around it */
#define CB_INBOXES_MAX 8 /* callback inboxes: one per worker thread, at most this many */
#define BUCKETS_MIN 1024
#define TCLASSES 8 /* distinct timeouts kept in FIFO lists; others go to the heap */
#define IN_HEAP 0xff

#define container_of(p, T, m) ((T *)((char *)(p)-offsetof(T, m)))

/* One request waiting for its answer. Records come from slabs and return to
 * a free list, so a request costs no malloc in the steady state. */
struct pending {
    uint64_t id;                   /* the reply token: <prefix>.<nuid>.<inbox>.<id in hex> */
    struct pending *hnext;         /* table chain, or free list */
    struct pending *clink;         /* completion lists */
    struct pending *dprev, *dnext; /* its timeout class's list */
    int64_t deadline;              /* CLOCK_MONOTONIC ns */
    uint32_t heap_idx;
    uint8_t cls; /* index into dsec__req.tc, or IN_HEAP */
    int timeout_ms;
    int code; /* 0 with a reply, or a DSEC_E_* code */
    natsMsg *reply;
    dsec_reply_cb cb;
    void *ud;
    bool direct;      /* cb runs where the answer is known, not on a worker */
    dsec_future *fut; /* either cb or fut */
    char subject[SUBJ_KEEP];
    char trace[DSEC_TRACE_ID_MAX + 1]; /* sent with; its callback runs in this trace */
    dsec_actor *actor; /* a callback's: the traced handler that sent it (a reference), or NULL */
};

/* Callbacks waiting for a worker. Several queues (one per worker) so a slow
 * callback holds up only the ones behind it in its own queue. */
struct replyq {
    dsec__task task;
    dsec_bus *bus;
    pthread_mutex_t mu;
    struct pending *head, *tail;
    bool scheduled;
};

/* One wildcard inbox subscription: "<prefix><index>.*". */
struct inbox {
    dsec__req *r;
    natsSubscription *sub;
    int index;
    char pfx[160]; /* "<prefix><index>." */
    size_t pfx_len;
    /* CLOCK_MONOTONIC ns at which the callback now running on this inbox's
     * delivery thread started, 0 when none runs. */
    atomic_int_fast64_t busy_since;
    bool live; /* subscribed, completion not yet seen; under r->mu */
};

/* Requests with the same timeout, in issue order. Their deadlines are "now"
 * read under the table lock plus one constant, so issue order is deadline
 * order and the list is a priority queue with O(1) insert and removal. A
 * class keeps its timeout while empty and is taken over by a new timeout
 * only when no class is free. */
struct tclass {
    int timeout_ms; /* 0: never used */
    struct pending *head, *tail;
    uint32_t n;
};

struct dsec__req {
    dsec_bus *bus;
    /* mu protects everything below except the reply queues. */
    pthread_mutex_t mu;
    pthread_cond_t timer_cond; /* new earliest deadline, or stop */
    pthread_cond_t idle_cond;  /* cb_outstanding reached 0 */
    pthread_t timer;
    bool timer_started;
    bool stop;
    bool closed;
    int inboxes_live; /* subscriptions whose callbacks may still run */
    struct inbox *ib; /* ib[0]: futures and direct; ib[1..nib-1]: callbacks */
    int nib;
    uint64_t next_id;
    struct pending **buckets;
    uint32_t nbuckets, count;
    struct tclass tc[TCLASSES];
    struct pending **heap; /* min-heap on deadline: timeouts without a class */
    uint32_t heap_len, heap_cap;
    /* The deadline the timer sleeps until (INT64_MAX: none), or INT64_MIN
     * while it runs and will look again before sleeping. */
    int64_t armed;
    struct pending *free_list;
    void **slabs;
    size_t nslabs, slabs_cap;
    uint64_t cb_outstanding; /* out of the table, callback not yet returned */
    int idle_waiters;
    struct replyq *qs;
    int nq;
};

struct dsec_future {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int refs; /* the caller's and the pending request's */
    bool done;
    int code;
    int timeout_ms;
    uint64_t id;
    dsec_bus *bus;
    dsec_msg reply;
    char subject[SUBJ_KEEP];
};

static void keep_subject(char dst[SUBJ_KEEP], const char *subject)
{
    size_t n = strlen(subject);
    if (n < SUBJ_KEEP) {
        memcpy(dst, subject, n + 1);
    } else {
        memcpy(dst, subject, SUBJ_KEEP - 4);
        memcpy(dst + SUBJ_KEEP - 4, "...", 4);
    }
}

static int fill_err(dsec_err *err, int code, const char *subject, int timeout_ms)
{
    switch (code) {
    case DSEC_E_TIMEOUT:
        return dsec_err_set(err, code, 0,
                            "no reply on %s within %d ms (retry is safe with the same request id)",
                            subject, timeout_ms);
    case DSEC_E_NO_RESPONDERS:
        return dsec_err_set(err, code, 0, "no responders on %s: nothing subscribes to it", subject);
    case DSEC_E_CONN:
        return dsec_err_set(err, code, 0,
                            "connection lost while the request on %s was in flight; it may or "
                            "may not have been handled (retry with the same request id)",
                            subject);
    case DSEC_E_CLOSED:
        return dsec_err_set(err, code, 0, "bus closed before the reply to %s arrived", subject);
    case DSEC_E_PERMISSION:
        return dsec_err_set(err, code, 0,
                            "the NATS server refused this connection's publish to %s: its "
                            "credentials do not permit that subject (not delivered)",
                            subject);
    default:
        return dsec_err_set(err, code, 0, "request on %s failed: %s", subject,
                            dsec_code_name(code));
    }
}

/* ---- the table and the deadline heap (under r->mu) ------------------------ */

static struct pending *pending_alloc(dsec__req *r)
{
    if (r->free_list == NULL) {
        if (r->nslabs == r->slabs_cap) {
            size_t ncap = r->slabs_cap ? r->slabs_cap * 2 : 16;
            void **s = dsec_realloc(r->slabs, ncap * sizeof *s);
            if (s == NULL)
                return NULL;
            r->slabs = s;
            r->slabs_cap = ncap;
        }
        struct pending *slab = dsec_calloc(SLAB_RECORDS, sizeof *slab);
        if (slab == NULL)
            return NULL;
        r->slabs[r->nslabs++] = slab;
        for (int i = SLAB_RECORDS - 1; i >= 0; i--) {
            slab[i].hnext = r->free_list;
            r->free_list = &slab[i];
        }
    }
    struct pending *p = r->free_list;
    r->free_list = p->hnext;
    return p;
}

static void pending_free(dsec__req *r, struct pending *p)
{
    if (p->reply != NULL)
        dsec__msg_destroy(&p->reply);
    p->cb = NULL;
    p->ud = NULL;
    p->fut = NULL;
    p->hnext = r->free_list;
    r->free_list = p;
}

static int table_grow(dsec__req *r)
{
    uint32_t n = r->nbuckets ? r->nbuckets * 2 : BUCKETS_MIN;
    struct pending **b = dsec_calloc(n, sizeof *b);
    if (b == NULL)
        return -1;
    for (uint32_t i = 0; i < r->nbuckets; i++) {
        for (struct pending *p = r->buckets[i], *next; p != NULL; p = next) {
            next = p->hnext;
            p->hnext = b[p->id & (n - 1)];
            b[p->id & (n - 1)] = p;
        }
    }
    dsec_free(r->buckets);
    r->buckets = b;
    r->nbuckets = n;
    return 0;
}

/* Ids are sequential, so the low bits spread them evenly. */
static struct pending *table_lookup(dsec__req *r, uint64_t id)
{
    if (r->nbuckets == 0)
        return NULL;
    for (struct pending *p = r->buckets[id & (r->nbuckets - 1)]; p != NULL; p = p->hnext)
        if (p->id == id)
            return p;
    return NULL;
}

static void table_unlink(dsec__req *r, struct pending *p)
{
    struct pending **pp = &r->buckets[p->id & (r->nbuckets - 1)];
    while (*pp != p)
        pp = &(*pp)->hnext;
    *pp = p->hnext;
    p->hnext = NULL;
    r->count--;
}

static void heap_swap(dsec__req *r, uint32_t i, uint32_t j)
{
    struct pending *t = r->heap[i];
    r->heap[i] = r->heap[j];
    r->heap[j] = t;
    r->heap[i]->heap_idx = i;
    r->heap[j]->heap_idx = j;
}

static void heap_up(dsec__req *r, uint32_t i)
{
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;
        if (r->heap[parent]->deadline <= r->heap[i]->deadline)
            break;
        heap_swap(r, i, parent);
        i = parent;
    }
}

static void heap_down(dsec__req *r, uint32_t i)
{
    for (;;) {
        uint32_t l = 2 * i + 1, m = i;
        if (l < r->heap_len && r->heap[l]->deadline < r->heap[m]->deadline)
            m = l;
        if (l + 1 < r->heap_len && r->heap[l + 1]->deadline < r->heap[m]->deadline)
            m = l + 1;
        if (m == i)
            return;
        heap_swap(r, i, m);
        i = m;
    }
}

static int heap_push(dsec__req *r, struct pending *p)
{
    if (r->heap_len == r->heap_cap) {
        uint32_t ncap = r->heap_cap ? r->heap_cap * 2 : 1024;
        struct pending **h = dsec_realloc(r->heap, ncap * sizeof *h);
        if (h == NULL)
            return -1;
        r->heap = h;
        r->heap_cap = ncap;
    }
    p->heap_idx = r->heap_len;
    r->heap[r->heap_len++] = p;
    heap_up(r, p->heap_idx);
    return 0;
}

static void heap_remove(dsec__req *r, struct pending *p)
{
    uint32_t i = p->heap_idx;
    uint32_t last = --r->heap_len;
    if (i != last) {
        heap_swap(r, i, last);
        heap_down(r, i);
        heap_up(r, i);
    }
}

/* ---- deadlines: the timeout classes, then the heap (under r->mu) ---------- */

static struct tclass *tclass_for(dsec__req *r, int timeout_ms)
{
    struct tclass *spare = NULL;
    for (int i = 0; i < TCLASSES; i++) {
        struct tclass *c = &r->tc[i];
        if (c->timeout_ms == timeout_ms)
            return c;
        if (c->n == 0 && (spare == NULL || spare->timeout_ms != 0))
            spare = c; /* prefer a never used class over one that was */
    }
    if (spare != NULL)
        spare->timeout_ms = timeout_ms;
    return spare;
}

static int deadline_add(dsec__req *r, struct pending *p)
{
    struct tclass *c = tclass_for(r, p->timeout_ms);
    if (c == NULL) {
        p->cls = IN_HEAP;
        return heap_push(r, p);
    }
    p->cls = (uint8_t)(c - r->tc);
    p->dnext = NULL;
    p->dprev = c->tail;
    if (c->tail != NULL)
        c->tail->dnext = p;
    else
        c->head = p;
    c->tail = p;
    c->n++;
    return 0;
}

static void deadline_remove(dsec__req *r, struct pending *p)
{
    if (p->cls == IN_HEAP) {
        heap_remove(r, p);
        return;
    }
    struct tclass *c = &r->tc[p->cls];
    if (p->dprev != NULL)
        p->dprev->dnext = p->dnext;
    else
        c->head = p->dnext;
    if (p->dnext != NULL)
        p->dnext->dprev = p->dprev;
    else
        c->tail = p->dprev;
    p->dprev = p->dnext = NULL;
    c->n--;
}

/* The pending request with the earliest deadline, or NULL. */
static struct pending *deadline_first(dsec__req *r)
{
    struct pending *first = r->heap_len > 0 ? r->heap[0] : NULL;
    for (int i = 0; i < TCLASSES; i++) {
        struct pending *h = r->tc[i].head;
        if (h != NULL && (first == NULL || h->deadline < first->deadline))
            first = h;
    }
    return first;
}

/* Take p out of the table and the deadlines: from here exactly one
 * completion owns it. Counts callbacks still to run. */
static void take(dsec__req *r, struct pending *p)
{
    table_unlink(r, p);
    deadline_remove(r, p);
    if (p->cb != NULL)
        r->cb_outstanding++;
}

/* Everything pending, failed with code; the caller completes the list. */
static struct pending *take_all(dsec__req *r, int code)
{
    struct pending *list = NULL;
    while (r->heap_len > 0) {
        struct pending *p = r->heap[r->heap_len - 1];
        take(r, p);
        p->code = code;
        p->clink = list;
        list = p;
    }
    for (int i = 0; i < TCLASSES; i++) {
        while (r->tc[i].tail != NULL) {
            struct pending *p = r->tc[i].tail;
            take(r, p);
            p->code = code;
            p->clink = list;
            list = p;
        }
    }
    return list;
}

/* ---- completion --------------------------------------------------------- */

static void future_destroy(dsec_future *f)
{
    dsec__msg_destroy(&f->reply.nm);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->mu);
    dsec_free(f);
}

static void future_unref(dsec_future *f)
{
    pthread_mutex_lock(&f->mu);
    bool last = --f->refs == 0;
    pthread_mutex_unlock(&f->mu);
    if (last)
        future_destroy(f);
}

/* Run p's callback with its answer and let go of the reply message. */
static void run_cb(dsec_bus *bus, struct pending *p)
{
    /* The callback carries on the request's work: what it sends follows the
     * request's trace, wherever and whenever it runs. */
    dsec_trace_scope sc;
    const char *type = NULL;
    dsec_msg m;
    if (p->code == 0) {
        dsec__msg_init(&m, p->reply, bus);
        type = dsec__msg_header(&m, DSEC_HDR_TYPE);
    } else {
        type = dsec_code_name(p->code);
    }
    /* A callback of a traced handler's request is a hop of that actor too:
     * the handler's work goes on here (the place a scheduler sends once the
     * quota actor admitted its create). */
    dsec_trace_enter(&sc, p->actor, p->trace[0] ? p->trace : NULL, p->subject, type);
    if (p->code == 0) {
        dsec_err ok;
        dsec_err_clear(&ok);
        p->cb(0, &m, &ok, p->ud);
    } else {
        dsec_err e;
        fill_err(&e, p->code, p->subject, p->timeout_ms);
        p->cb(-1, NULL, &e, p->ud);
    }
    dsec_trace_leave(&sc);
    /* After the hop is recorded (its type points into the reply's headers);
     * here rather than under r->mu in pending_free. */
    dsec__msg_destroy(&p->reply);
    if (p->actor != NULL) {
        dsec__actor_put(p->actor);
        p->actor = NULL;
    }
}

/* n callbacks have returned. Under r->mu. */
static void cb_done_locked(dsec__req *r, uint64_t n)
{
    r->cb_outstanding -= n;
    if (r->cb_outstanding == 0 && r->idle_waiters > 0)
        pthread_cond_broadcast(&r->idle_cond);
}

static void replyq_push(struct replyq *q, struct pending *p)
{
    p->clink = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->tail != NULL)
        q->tail->clink = p;
    else
        q->head = p;
    q->tail = p;
    if (!q->scheduled) {
        q->scheduled = true;
        dsec__pool_push(&q->bus->pool, &q->task);
    }
    pthread_mutex_unlock(&q->mu);
}

/* Deliver the answer of a request already taken out of the table. */
static void complete(dsec_bus *bus, struct pending *p)
{
    dsec__req *r = bus->req;
    if (p->direct) {
        /* dsec_bus_request_direct: the caller promised a callback that
         * never blocks, so it runs here, a thread hand-off sooner. */
        run_cb(bus, p);
        pthread_mutex_lock(&r->mu);
        pending_free(r, p);
        cb_done_locked(r, 1);
        pthread_mutex_unlock(&r->mu);
        return;
    }
    if (p->fut == NULL) {
        /* Runs of REPLYQ_RUN consecutive ids share a queue: a burst of
         * replies then wakes one worker instead of every one of them, and
         * the queues still split the requests in flight. */
        replyq_push(&r->qs[(p->id / REPLYQ_RUN) % (uint64_t)r->nq], p);
        return;
    }
    /* Futures are finished right here: a waiter may be a worker thread, and
     * it must not need another worker to wake it. */
    dsec_future *f = p->fut;
    pthread_mutex_lock(&f->mu);
    f->done = true;
    f->code = p->code;
    f->reply.nm = p->reply;
    p->reply = NULL;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->mu);
    future_unref(f);
    pthread_mutex_lock(&r->mu);
    pending_free(r, p);
    pthread_mutex_unlock(&r->mu);
}

static void complete_list(dsec_bus *bus, struct pending *list)
{
    while (list != NULL) {
        struct pending *next = list->clink;
        complete(bus, list);
        list = next;
    }
}

static void replyq_run(dsec__task *t)
{
    struct replyq *q = container_of(t, struct replyq, task);
    dsec_bus *bus = q->bus;
    dsec__req *r = bus->req;

    pthread_mutex_lock(&q->mu);
    while (q->head != NULL) {
        struct pending *batch = q->head, *last = batch;
        int n = 1;
        while (n < REPLYQ_BATCH && last->clink != NULL) {
            last = last->clink;
            n++;
        }
        q->head = last->clink;
        if (q->head == NULL)
            q->tail = NULL;
        last->clink = NULL;
        pthread_mutex_unlock(&q->mu);

        for (struct pending *p = batch; p != NULL; p = p->clink)
            run_cb(bus, p);

        pthread_mutex_lock(&r->mu);
        for (struct pending *p = batch, *next; p != NULL; p = next) {
            next = p->clink;
            pending_free(r, p);
        }
        cb_done_locked(r, (uint64_t)n);
        pthread_mutex_unlock(&r->mu);

        pthread_mutex_lock(&q->mu);
        if (q->head != NULL && dsec__pool_contended(&bus->pool)) {
            dsec__pool_push(&bus->pool, t);
            pthread_mutex_unlock(&q->mu);
            return;
        }
    }
    q->scheduled = false;
    pthread_mutex_unlock(&q->mu);
}

/* ---- threads and callbacks ---------------------------------------------- */

static void *timer_main(void *arg)
{
    dsec_bus *bus = arg;
    dsec__req *r = bus->req;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        int64_t now = dsec__now_ns();
        /* Completed in deadline order. */
        struct pending *expired = NULL, **tail = &expired, *p;
        while ((p = deadline_first(r)) != NULL && p->deadline <= now) {
            take(r, p);
            p->code = DSEC_E_TIMEOUT;
            p->clink = NULL;
            *tail = p;
            tail = &p->clink;
        }
        if (expired != NULL) {
            r->armed = INT64_MIN; /* running: a new deadline need not wake it */
            pthread_mutex_unlock(&r->mu);
            complete_list(bus, expired);
            pthread_mutex_lock(&r->mu);
            continue;
        }
        if (p == NULL) {
            r->armed = INT64_MAX;
            pthread_cond_wait(&r->timer_cond, &r->mu);
        } else {
            r->armed = p->deadline;
            struct timespec ts;
            dsec__abstime(&ts, p->deadline);
            pthread_cond_timedwait(&r->timer_cond, &r->mu, &ts);
        }
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static bool parse_token(const struct inbox *ib, const char *subject, uint64_t *id)
{
    if (subject == NULL || strncmp(subject, ib->pfx, ib->pfx_len) != 0)
        return false;
    const char *p = subject + ib->pfx_len;
    uint64_t v = 0;
    int n = 0;
    for (; *p; p++, n++) {
        int d;
        if (*p >= '0' && *p <= '9')
            d = *p - '0';
        else if (*p >= 'a' && *p <= 'f')
            d = *p - 'a' + 10;
        else
            return false;
        if (n == 16)
            return false;
        v = v << 4 | (uint64_t)d;
    }
    *id = v;
    return n > 0;
}

/* An ordinary callback on its inbox's delivery thread, marked busy so that
 * requests sent meanwhile can tell whether it holds the inbox. */
static void run_inline(dsec_bus *bus, struct inbox *ib, struct pending *p)
{
    dsec__req *r = bus->req;
    atomic_store_explicit(&ib->busy_since, dsec__now_ns(), memory_order_relaxed);
    run_cb(bus, p);
    atomic_store_explicit(&ib->busy_since, 0, memory_order_relaxed);
    pthread_mutex_lock(&r->mu);
    pending_free(r, p);
    cb_done_locked(r, 1);
    pthread_mutex_unlock(&r->mu);
}

/* An inbox subscription's delivery thread. */
static void on_reply(natsConnection *nc, natsSubscription *sub, natsMsg *nm, void *closure)
{
    struct inbox *ib = closure;
    dsec__req *r = ib->r;
    dsec_bus *bus = r->bus;
    uint64_t id;
    if (!parse_token(ib, natsMsg_GetSubject(nm), &id)) {
        dsec__msg_destroy(&nm);
        return;
    }
    pthread_mutex_lock(&r->mu);
    struct pending *p = table_lookup(r, id);
    if (p != NULL)
        take(r, p);
    pthread_mutex_unlock(&r->mu);
    if (p == NULL) {
        /* Answered already (timed out, failed on disconnect, cancelled). */
        dsec__msg_destroy(&nm);
        return;
    }
    /* nats-server 2.2+ answers a request nobody listens to with a 503
     * status message without payload. */
    if (natsMsg_IsNoResponders(nm)) {
        p->code = DSEC_E_NO_RESPONDERS;
        dsec__msg_destroy(&nm);
    } else {
        p->code = 0;
        p->reply = nm;
    }
    if (ib->index > 0 && p->cb != NULL && !p->direct)
        run_inline(bus, ib, p);
    else
        complete(bus, p);
}

static void on_inbox_complete(void *closure)
{
    struct inbox *ib = closure;
    dsec__req *r = ib->r;
    pthread_mutex_lock(&r->mu);
    if (ib->live) {
        ib->live = false;
        r->inboxes_live--;
    }
    pthread_cond_broadcast(&r->idle_cond);
    pthread_mutex_unlock(&r->mu);
}

/* The inbox for a new request. Under r->mu. */
static struct inbox *pick_inbox(dsec__req *r, bool inline_cb, int64_t now)
{
    int k = r->nib - 1;
    if (!inline_cb || k <= 0)
        return &r->ib[0];
    /* The first that is not held: one delivery thread that keeps up runs
     * every callback, and on two cores that beats spreading them over
     * threads that each wake for their share (5-8% of the bus benchmark's
     * request/reply rate). */
    for (int j = 1; j <= k; j++) {
        struct inbox *ib = &r->ib[j];
        int64_t since = atomic_load_explicit(&ib->busy_since, memory_order_relaxed);
        if (since == 0 || now - since < STALL_NS)
            return ib;
    }
    return &r->ib[0]; /* every callback inbox is held: a worker runs it */
}

/* ---- module entry points ------------------------------------------------- */

int dsec__req_init(dsec_bus *bus, dsec_err *err)
{
    dsec__req *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "bus request table");
    r->bus = bus;
    r->armed = INT64_MIN; /* the timer has not looked yet */
    pthread_mutex_init(&r->mu, NULL);
    dsec__cond_init(&r->timer_cond);
    dsec__cond_init(&r->idle_cond);
    r->nq = bus->threads > 0 ? bus->threads : 1;
    r->qs = dsec_calloc((size_t)r->nq, sizeof *r->qs);
    r->nib = 1 + (r->nq < CB_INBOXES_MAX ? r->nq : CB_INBOXES_MAX);
    r->ib = dsec_calloc((size_t)r->nib, sizeof *r->ib);
    if (r->qs == NULL || r->ib == NULL || table_grow(r) < 0) {
        dsec_free(r->qs);
        dsec_free(r->ib);
        dsec_free(r->buckets);
        dsec_free(r);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "bus request table");
    }
    for (int i = 0; i < r->nq; i++) {
        r->qs[i].task = (dsec__task){.run = replyq_run};
        r->qs[i].bus = bus;
        pthread_mutex_init(&r->qs[i].mu, NULL);
    }
    bus->req = r;
    int e = pthread_create(&r->timer, NULL, timer_main, bus);
    if (e != 0)
        return dsec_err_set(err, DSEC_E_IO, e, "starting the bus request timer");
    r->timer_started = true;
    return 0;
}

/* Subscribe ib to "<prefix><index>.*"; prefix is "<inbox prefix>.<nuid>.". */
static int inbox_subscribe(dsec_bus *bus, struct inbox *ib, int index, const char *prefix,
                           dsec_err *err)
{
    dsec__req *r = bus->req;
    ib->r = r;
    ib->index = index;
    atomic_init(&ib->busy_since, 0);
    int n = snprintf(ib->pfx, sizeof ib->pfx, "%s%d.", prefix, index);
    if (n < 0 || (size_t)n >= sizeof ib->pfx - 1)
        return dsec_err_set(err, DSEC_E_INTERNAL, 0, "bus inbox prefix too long");
    ib->pfx_len = (size_t)n;
    char wildcard[sizeof ib->pfx + 1];
    snprintf(wildcard, sizeof wildcard, "%s*", ib->pfx);
    natsStatus s = natsConnection_Subscribe(&ib->sub, bus->nc, wildcard, on_reply, ib);
    if (s != NATS_OK)
        return dsec__nats_err(err, s, "subscribing to the bus inbox %s", wildcard);
    pthread_mutex_lock(&r->mu);
    ib->live = true;
    r->inboxes_live++;
    pthread_mutex_unlock(&r->mu);
    s = natsSubscription_SetOnCompleteCB(ib->sub, on_inbox_complete, ib);
    if (s != NATS_OK) {
        /* Closed under us: nats.c will not call on_inbox_complete. */
        pthread_mutex_lock(&r->mu);
        if (ib->live) {
            ib->live = false;
            r->inboxes_live--;
        }
        pthread_mutex_unlock(&r->mu);
    }
    if (s == NATS_OK)
        /* Replies are bounded by the requests in flight; dropping one
         * would leave a request to its deadline. */
        s = natsSubscription_SetPendingLimits(ib->sub, -1, -1);
    if (s != NATS_OK) {
        natsSubscription_Unsubscribe(ib->sub);
        return dsec__nats_err(err, s, "setting up the bus inbox %s", wildcard);
    }
    return 0;
}

int dsec__req_start(dsec_bus *bus, dsec_err *err)
{
    dsec__req *r = bus->req;
    natsInbox *inbox = NULL;
    natsStatus s = natsInbox_Create(&inbox);
    if (s != NATS_OK)
        return dsec__nats_err(err, s, "creating the bus inbox");
    /* natsInbox_Create gives "_INBOX.<nuid>": keep the nuid under our prefix */
    const char *nuid = strchr((const char *)inbox, '.');
    char prefix[128];
    int n = snprintf(prefix, sizeof prefix, "%s.%s.", bus->inbox_prefix,
                     nuid ? nuid + 1 : (const char *)inbox);
    natsInbox_Destroy(inbox);
    if (n < 0 || (size_t)n >= sizeof prefix - 1)
        return dsec_err_set(err, DSEC_E_INTERNAL, 0, "bus inbox prefix too long");
    for (int i = 0; i < r->nib; i++)
        if (inbox_subscribe(bus, &r->ib[i], i, prefix, err) < 0)
            return -1;
    return 0;
}

static int send_request(dsec_bus *bus, const char *subject, const dsec_hdr *hdr, const void *data,
                        size_t len, int timeout_ms, dsec_reply_cb cb, void *ud, bool direct,
                        dsec_future *fut, dsec_err *err)
{
    dsec__req *r = bus->req;
    if (subject == NULL || subject[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "request: empty subject");
    if (timeout_ms <= 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "request on %s: timeout must be > 0 ms",
                            subject);

    /* The trace it is sent with, kept for its callback: the one given, else
     * the one this thread works for, else a fresh one. */
    char trace[DSEC_TRACE_ID_MAX + 1];
    const char *tid = hdr != NULL && hdr->trace_id != NULL ? hdr->trace_id : dsec_trace_current();
    if (dsec_trace_id_ok(tid))
        snprintf(trace, sizeof trace, "%s", tid);
    else if (tid == NULL)
        dsec_bus_new_id(trace);
    else
        trace[0] = '\0'; /* the caller's own id, too long to follow: sent as it is */
    dsec_hdr h = hdr != NULL ? *hdr : (dsec_hdr){0};
    if (trace[0] != '\0')
        h.trace_id = trace;
    hdr = &h;
    dsec_actor *actor = cb != NULL ? dsec__trace_actor() : NULL;
    if (actor != NULL)
        dsec__actor_get(actor); /* put after its callback ran, or below when it never will */

    pthread_mutex_lock(&r->mu);
    if (r->closed) {
        pthread_mutex_unlock(&r->mu);
        if (actor != NULL)
            dsec__actor_put(actor);
        return dsec_err_set(err, DSEC_E_CLOSED, 0, "request on %s: the bus is closed", subject);
    }
    struct pending *p = NULL;
    if ((r->count >= r->nbuckets && table_grow(r) < 0) || (p = pending_alloc(r)) == NULL) {
        pthread_mutex_unlock(&r->mu);
        if (actor != NULL)
            dsec__actor_put(actor);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "request on %s", subject);
    }
    p->actor = actor;
    uint64_t id = ++r->next_id;
    p->id = id;
    int64_t now = dsec__now_ns();
    p->deadline = now + (int64_t)timeout_ms * 1000000;
    /* on a shared delivery pool a callback must not hold a pool thread: it goes to a worker */
    const struct inbox *ib = pick_inbox(r, cb != NULL && !direct && !bus->shared_delivery, now);
    p->timeout_ms = timeout_ms;
    p->code = 0;
    p->reply = NULL;
    p->cb = cb;
    p->ud = ud;
    p->direct = direct;
    p->fut = fut;
    p->clink = NULL;
    keep_subject(p->subject, subject);
    memcpy(p->trace, trace, sizeof trace);
    if (deadline_add(r, p) < 0) {
        p->actor = NULL;
        pending_free(r, p);
        pthread_mutex_unlock(&r->mu);
        if (actor != NULL)
            dsec__actor_put(actor);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "request on %s", subject);
    }
    p->hnext = r->buckets[id & (r->nbuckets - 1)];
    r->buckets[id & (r->nbuckets - 1)] = p;
    r->count++;
    if (fut != NULL)
        fut->id = id;
    /* Only a deadline before the one the timer sleeps until re-arms it. */
    bool wake = p->deadline < r->armed;
    pthread_mutex_unlock(&r->mu);
    if (wake)
        pthread_cond_signal(&r->timer_cond);

    char reply[sizeof ib->pfx + 17];
    memcpy(reply, ib->pfx, ib->pfx_len);
    static const char hex[] = "0123456789abcdef";
    char tmp[16];
    int n = 0;
    for (uint64_t v = id; v != 0; v >>= 4)
        tmp[n++] = hex[v & 0xf];
    for (int i = 0; i < n; i++)
        reply[ib->pfx_len + (size_t)i] = tmp[n - 1 - i];
    reply[ib->pfx_len + (size_t)n] = '\0';

    if (dsec__publish(bus, subject, reply, hdr, data, len, NULL, err) < 0) {
        pthread_mutex_lock(&r->mu);
        bool ours = table_lookup(r, id) == p;
        if (ours) {
            table_unlink(r, p);
            deadline_remove(r, p);
            p->actor = NULL;
            pending_free(r, p);
        }
        pthread_mutex_unlock(&r->mu);
        if (ours && actor != NULL)
            dsec__actor_put(actor);
        /* Not ours any more: a disconnect or the deadline already answered
         * it, so the callback runs and the call counts as made. */
        return ours ? -1 : 0;
    }
    return 0;
}

int dsec_bus_request(dsec_bus *bus, const char *subject, const dsec_hdr *hdr, const void *data,
                     size_t len, int timeout_ms, dsec_reply_cb cb, void *ud, dsec_err *err)
{
    if (cb == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "request on %s: no callback",
                            subject != NULL ? subject : "?");
    return send_request(bus, subject, hdr, data, len, timeout_ms, cb, ud, false, NULL, err);
}

int dsec_bus_request_direct(dsec_bus *bus, const char *subject, const dsec_hdr *hdr,
                            const void *data, size_t len, int timeout_ms, dsec_reply_cb cb,
                            void *ud, dsec_err *err)
{
    if (cb == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "request on %s: no callback",
                            subject != NULL ? subject : "?");
    return send_request(bus, subject, hdr, data, len, timeout_ms, cb, ud, true, NULL, err);
}

int dsec_bus_request_future(dsec_bus *bus, const char *subject, const dsec_hdr *hdr,
                            const void *data, size_t len, int timeout_ms, dsec_future **out,
                            dsec_err *err)
{
    *out = NULL;
    dsec_future *f = dsec_calloc(1, sizeof *f);
    if (f == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "request future");
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cond, NULL);
    f->refs = 2;
    f->bus = bus;
    f->timeout_ms = timeout_ms;
    f->reply.bus = bus;
    keep_subject(f->subject, subject != NULL ? subject : "");
    if (send_request(bus, subject, hdr, data, len, timeout_ms, NULL, NULL, false, f, err) < 0) {
        future_destroy(f); /* never reached the table: both references are ours */
        return -1;
    }
    *out = f;
    return 0;
}

int dsec_future_wait(dsec_future *f, dsec_msg **reply, dsec_err *err)
{
    if (reply != NULL)
        *reply = NULL;
    /* No timeout here: the request's deadline always ends the wait. */
    pthread_mutex_lock(&f->mu);
    while (!f->done)
        pthread_cond_wait(&f->cond, &f->mu);
    int code = f->code;
    pthread_mutex_unlock(&f->mu);
    if (code != 0)
        return fill_err(err, code, f->subject, f->timeout_ms);
    if (reply != NULL)
        *reply = &f->reply;
    return 0;
}

void dsec_future_free(dsec_future *f)
{
    if (f == NULL)
        return;
    pthread_mutex_lock(&f->mu);
    bool done = f->done;
    pthread_mutex_unlock(&f->mu);
    if (!done) {
        /* Still pending, so the bus is alive: take the request back unless
         * a completion is already on its way. */
        dsec__req *r = f->bus->req;
        pthread_mutex_lock(&r->mu);
        struct pending *p = table_lookup(r, f->id);
        bool ours = p != NULL && p->fut == f;
        if (ours) {
            table_unlink(r, p);
            deadline_remove(r, p);
            pending_free(r, p);
        }
        pthread_mutex_unlock(&r->mu);
        if (ours)
            future_unref(f); /* the pending request's reference */
    }
    future_unref(f);
}

int dsec_bus_request_sync(dsec_bus *bus, const char *subject, const dsec_hdr *hdr, const void *data,
                          size_t len, int timeout_ms, dsec_msg **reply, dsec_err *err)
{
    *reply = NULL;
    dsec_future *f = NULL;
    if (dsec_bus_request_future(bus, subject, hdr, data, len, timeout_ms, &f, err) < 0)
        return -1;
    int rc = -1;
    dsec_msg *got = NULL;
    if (dsec_future_wait(f, &got, err) < 0)
        goto out_free;
    dsec_msg *m = dsec_malloc(sizeof *m);
    if (m == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "reply from %s", subject);
        goto out_free;
    }
    /* Move the natsMsg out of the future: it is now the caller's. */
    *m = (dsec_msg){.nm = got->nm, .bus = bus, .heap = true};
    got->nm = NULL;
    *reply = m;
    rc = 0;
out_free:
    dsec_future_free(f);
    return rc;
}

void dsec__req_disconnected(dsec_bus *bus)
{
    dsec__req *r = bus->req;
    /* Whatever was sent before this point may have died with the
     * connection; failing it now beats waiting for each deadline. Requests
     * made while reconnecting are buffered by nats.c and stay pending. */
    pthread_mutex_lock(&r->mu);
    struct pending *list = take_all(r, DSEC_E_CONN);
    pthread_mutex_unlock(&r->mu);
    complete_list(bus, list);
}

/* Whether p was sent to subject, as far as its kept (maybe shortened) copy
 * tells: a long subject is matched on the part kept. */
static bool sent_to(const struct pending *p, const char *subject)
{
    size_t n = strlen(subject);
    if (n < SUBJ_KEEP)
        return strcmp(p->subject, subject) == 0;
    return strncmp(p->subject, subject, SUBJ_KEEP - 4) == 0 &&
           strcmp(p->subject + SUBJ_KEEP - 4, "...") == 0;
}

size_t dsec__req_fail_subject(dsec_bus *bus, const char *subject, int code)
{
    dsec__req *r = bus->req;
    struct pending *list = NULL;
    size_t n = 0;
    pthread_mutex_lock(&r->mu);
    /* take() reorders the heap: collect first, then take */
    for (uint32_t i = 0; i < r->heap_len; i++) {
        struct pending *p = r->heap[i];
        if (sent_to(p, subject)) {
            p->clink = list;
            list = p;
            n++;
        }
    }
    for (int i = 0; i < TCLASSES; i++) {
        for (struct pending *p = r->tc[i].head; p != NULL; p = p->dnext) {
            if (sent_to(p, subject)) {
                p->clink = list;
                list = p;
                n++;
            }
        }
    }
    for (struct pending *p = list; p != NULL; p = p->clink) {
        take(r, p);
        p->code = code;
    }
    pthread_mutex_unlock(&r->mu);
    complete_list(bus, list);
    return n;
}

void dsec__req_close(dsec_bus *bus)
{
    dsec__req *r = bus->req;
    pthread_mutex_lock(&r->mu);
    r->closed = true;
    struct pending *list = take_all(r, DSEC_E_CLOSED);
    pthread_mutex_unlock(&r->mu);
    complete_list(bus, list);
}

bool dsec__req_wait_idle(dsec_bus *bus, int64_t deadline_ns)
{
    dsec__req *r = bus->req;
    struct timespec ts;
    dsec__abstime(&ts, deadline_ns);
    bool ok = true;
    pthread_mutex_lock(&r->mu);
    r->idle_waiters++;
    while (r->cb_outstanding > 0) {
        if (pthread_cond_timedwait(&r->idle_cond, &r->mu, &ts) == ETIMEDOUT &&
            r->cb_outstanding > 0) {
            ok = false;
            break;
        }
    }
    r->idle_waiters--;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

uint64_t dsec__req_pending(dsec_bus *bus)
{
    dsec__req *r = bus->req;
    pthread_mutex_lock(&r->mu);
    uint64_t n = r->count;
    pthread_mutex_unlock(&r->mu);
    return n;
}

void dsec__req_free(dsec_bus *bus)
{
    dsec__req *r = bus->req;
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_signal(&r->timer_cond);
    /* The connection is closed, so the inbox subscriptions are too; wait
     * until their delivery threads have left on_reply. */
    while (r->inboxes_live > 0)
        pthread_cond_wait(&r->idle_cond, &r->mu);
    pthread_mutex_unlock(&r->mu);
    if (r->timer_started)
        pthread_join(r->timer, NULL);
    for (int i = 0; i < r->nib; i++)
        natsSubscription_Destroy(r->ib[i].sub); /* NULL if never subscribed */
    /* Nothing is pending after dsec__req_close; records still out would be
     * a bug, but their replies are freed with the slabs' owners below. */
    for (size_t i = 0; i < r->nslabs; i++) {
        struct pending *slab = r->slabs[i];
        for (int j = 0; j < SLAB_RECORDS; j++)
            if (slab[j].reply != NULL)
                dsec__msg_destroy(&slab[j].reply);
        dsec_free(slab);
    }
    for (int i = 0; i < r->nq; i++)
        pthread_mutex_destroy(&r->qs[i].mu);
    dsec_free(r->slabs);
    dsec_free(r->qs);
    dsec_free(r->ib);
    dsec_free(r->heap);
    dsec_free(r->buckets);
    pthread_cond_destroy(&r->timer_cond);
    pthread_cond_destroy(&r->idle_cond);
    pthread_mutex_destroy(&r->mu);
    dsec_free(r);
    bus->req = NULL;
}
