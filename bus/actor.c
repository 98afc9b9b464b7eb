/* actor.c - actors: subscriptions feeding bounded mailboxes, and the worker
 * pool that runs handlers in order per key and in parallel across keys. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "bus/internal.h"
#include "dsec/alloc.h"

/* How the mailbox is laid out.
 *
 * A mailbox is split into lanes: one per ordering key that has messages
 * queued or a handler running. A lane is the unit the pool schedules, so
 * one key runs one message at a time and in order, while other keys and
 * other actors run on other workers. A lane is "scheduled" from the moment a
 * message makes it non-empty until a worker finds it empty; while scheduled,
 * producers only append to its ring under the actor lock: no run-queue
 * traffic and no wake-up per message. A worker takes up to BATCH_MAX entries
 * per lock round trip. Entries are {natsMsg, subscription} pairs stored by
 * value in a ring that grows by doubling, so the steady state allocates
 * nothing per message beyond the natsMsg nats.c already made. */

#define BATCH_MAX 256
#define RING_MIN 64
#define RING_KEEP 1024    /* a pooled lane keeps a ring up to this size */
#define FREE_LANES_MAX 64 /* idle lanes kept for reuse per keyed actor */
#define BUCKETS_MIN 64

#define container_of(p, T, m) ((T *)((char *)(p)-offsetof(T, m)))

struct actor_sub {
    dsec_actor *actor;
    natsSubscription *sub;
    dsec_handler h;
    dsec_shed_handler shed; /* NULL: its messages are never shed */
    void *ud;
    char *subject;
    bool done; /* nats.c will not call on_msg again; under bus->mu */
    struct actor_sub *next;
};

struct entry {
    natsMsg *nm;
    struct actor_sub *sub;
    int64_t at_ns; /* when it entered the mailbox (dsec__now_ns) */
};

struct lane {
    dsec__task task;
    dsec_actor *actor;
    uint64_t key;
    struct lane *hnext; /* hash chain while keyed and active; free list when pooled */
    struct entry *ring;
    uint32_t cap, head, count;
    bool scheduled; /* queued, held by a worker, or held by a deferred message; under actor->mu */
    bool held;      /* a handler deferred one of its messages: nothing more runs until done */
    bool in_run;    /* a worker is in lane_run with it */
};

/* What the running handler of this thread was handed, so dsec_actor_defer can take its
 * message over. */
struct run_ctx {
    struct lane *lane;
    struct entry *entry;
    int64_t start_ns;        /* the handler's trace scope's start */
    dsec_deferred *deferred; /* only compared after the handler: it may be done and freed */
};
static _Thread_local struct run_ctx *run_ctx;

struct dsec_deferred {
    dsec_msg *msg; /* heap copy owning the natsMsg */
    struct lane *lane;
    int64_t start_ns; /* when its handler started: its trace hop spans the whole wait */
};

struct dsec_actor {
    dsec_bus *bus;
    char *name;

    /* mu protects everything down to the counters: lanes, rings, depth,
     * subscription list, closing. */
    pthread_mutex_t mu;
    pthread_cond_t cond; /* broadcast when nbusy drops to 0 and someone waits */
    int waiters;
    dsec_key_fn key_fn;
    void *key_ud;
    struct lane lane0; /* the only lane of an actor without a key function */
    struct lane **buckets;
    uint32_t nbuckets, nkeyed;
    struct lane *free_lanes;
    uint32_t nfree;
    uint32_t depth;
    uint32_t nbusy; /* scheduled lanes */
    uint32_t mailbox_max;
    _Atomic int64_t shed_after_ns; /* 0: no shedding (dsec_actor_set_shed) */
    _Atomic int64_t empty_ns;      /* when the mailbox was last empty (a worker found nothing
                                      queued, or a message came to an empty one) */
    bool closing;
    bool overflowing;            /* last message was dropped: report the next episode only */
    atomic_bool schema_reported; /* a too-new Dsec-Schema was reported once */
    struct actor_sub *subs;

    int refs;    /* under bus->mu */
    bool linked; /* in bus->actors; under bus->mu */
    dsec_actor *next, *prev;

    atomic_uint_fast64_t msgs_in, msgs_out, errors, dropped, depth_now, peak, handler_ns, shed;
};

/* ---- the pool ---------------------------------------------------------- */

static void *worker_main(void *arg)
{
    dsec__pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        dsec__task *t = p->head;
        if (t == NULL) {
            if (p->stop)
                break;
            p->nidle++;
            pthread_cond_wait(&p->cond, &p->mu);
            p->nidle--;
            if (p->nwaking > 0)
                p->nwaking--;
            continue;
        }
        p->head = t->rq_next;
        if (p->head != NULL)
            p->head->rq_prev = NULL;
        else
            p->tail = NULL;
        t->rq_next = t->rq_prev = NULL;
        t->in_rq = false;
        atomic_fetch_sub_explicit(&p->qlen, 1, memory_order_relaxed);
        pthread_mutex_unlock(&p->mu);
        t->run(t);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int dsec__pool_start(dsec__pool *p, int nthreads, dsec_err *err)
{
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cond, NULL);
    p->threads = dsec_calloc((size_t)nthreads, sizeof *p->threads);
    if (p->threads == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "bus worker pool");
    for (int i = 0; i < nthreads; i++) {
        int e = pthread_create(&p->threads[i], NULL, worker_main, p);
        if (e != 0) {
            dsec__pool_stop(p);
            return dsec_err_set(err, DSEC_E_IO, e, "starting bus worker %d of %d", i + 1, nthreads);
        }
        p->nthreads++;
    }
    return 0;
}

void dsec__pool_push(dsec__pool *p, dsec__task *t)
{
    pthread_mutex_lock(&p->mu);
    t->rq_next = NULL;
    t->rq_prev = p->tail;
    if (p->tail != NULL)
        p->tail->rq_next = t;
    else
        p->head = t;
    p->tail = t;
    t->in_rq = true;
    atomic_fetch_add_explicit(&p->qlen, 1, memory_order_relaxed);
    /* Wake a sleeper only if none is already on its way: busy workers pick
     * the task up when they finish, but a busy worker may be stuck in a slow
     * handler, so an idle one must not sleep through queued work. */
    bool wake = p->nidle > p->nwaking;
    if (wake)
        p->nwaking++;
    pthread_mutex_unlock(&p->mu);
    if (wake)
        pthread_cond_signal(&p->cond);
}

bool dsec__pool_unlink(dsec__pool *p, dsec__task *t)
{
    pthread_mutex_lock(&p->mu);
    bool was = t->in_rq;
    if (was) {
        if (t->rq_prev != NULL)
            t->rq_prev->rq_next = t->rq_next;
        else
            p->head = t->rq_next;
        if (t->rq_next != NULL)
            t->rq_next->rq_prev = t->rq_prev;
        else
            p->tail = t->rq_prev;
        t->rq_next = t->rq_prev = NULL;
        t->in_rq = false;
        atomic_fetch_sub_explicit(&p->qlen, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&p->mu);
    return was;
}

void dsec__pool_stop(dsec__pool *p)
{
    if (p->threads == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nthreads; i++)
        pthread_join(p->threads[i], NULL);
    dsec_free(p->threads);
    p->threads = NULL;
    p->nthreads = 0;
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->mu);
}

/* ---- lanes ------------------------------------------------------------- */

static void lane_run(dsec__task *t);

static void lane_init(struct lane *l, dsec_actor *a, uint64_t key)
{
    l->task = (dsec__task){.run = lane_run};
    l->actor = a;
    l->key = key;
    l->hnext = NULL;
    l->head = l->count = 0;
    l->scheduled = l->held = l->in_run = false;
}

static int ring_push(struct lane *l, natsMsg *nm, struct actor_sub *s, int64_t at_ns)
{
    if (l->count == l->cap) {
        uint32_t ncap = l->cap ? l->cap * 2 : RING_MIN;
        struct entry *r = dsec_malloc(sizeof *r * ncap);
        if (r == NULL)
            return -1;
        /* Unwrap into the new ring so head restarts at 0. */
        for (uint32_t i = 0; i < l->count; i++)
            r[i] = l->ring[(l->head + i) & (l->cap - 1)];
        dsec_free(l->ring);
        l->ring = r;
        l->cap = ncap;
        l->head = 0;
    }
    l->ring[(l->head + l->count) & (l->cap - 1)] = (struct entry){nm, s, at_ns};
    l->count++;
    return 0;
}

static uint32_t ring_take(struct lane *l, struct entry *out, uint32_t max)
{
    uint32_t n = l->count < max ? l->count : max;
    uint32_t first = l->cap - l->head < n ? l->cap - l->head : n;
    memcpy(out, l->ring + l->head, first * sizeof *out);
    memcpy(out + first, l->ring, (n - first) * sizeof *out);
    l->head = (l->head + n) & (l->cap - 1);
    l->count -= n;
    return n;
}

static inline uint32_t key_bucket(const dsec_actor *a, uint64_t key)
{
    /* Fibonacci hashing: keys are often small sequential ids. */
    return (uint32_t)((key * 0x9e3779b97f4a7c15ull) >> 32) & (a->nbuckets - 1);
}

static int buckets_grow(dsec_actor *a)
{
    uint32_t n = a->nbuckets ? a->nbuckets * 2 : BUCKETS_MIN;
    struct lane **b = dsec_calloc(n, sizeof *b);
    if (b == NULL)
        return -1;
    struct lane **old = a->buckets;
    uint32_t oldn = a->nbuckets;
    a->buckets = b;
    a->nbuckets = n;
    for (uint32_t i = 0; i < oldn; i++) {
        for (struct lane *l = old[i], *next; l != NULL; l = next) {
            next = l->hnext;
            uint32_t h = key_bucket(a, l->key);
            l->hnext = b[h];
            b[h] = l;
        }
    }
    dsec_free(old);
    return 0;
}

/* The lane for key, created (from the pool of idle lanes when possible) if
 * the key has nothing queued. Under a->mu. */
static struct lane *lane_for_key(dsec_actor *a, uint64_t key)
{
    if (a->key_fn == NULL)
        return &a->lane0;
    if (a->nbuckets > 0) {
        for (struct lane *l = a->buckets[key_bucket(a, key)]; l != NULL; l = l->hnext)
            if (l->key == key)
                return l;
    }
    if (a->nkeyed >= a->nbuckets && buckets_grow(a) < 0)
        return NULL;
    struct lane *l = a->free_lanes;
    if (l != NULL) {
        a->free_lanes = l->hnext;
        a->nfree--;
    } else {
        l = dsec_calloc(1, sizeof *l);
        if (l == NULL)
            return NULL;
    }
    lane_init(l, a, key);
    uint32_t h = key_bucket(a, key);
    l->hnext = a->buckets[h];
    a->buckets[h] = l;
    a->nkeyed++;
    return l;
}

/* An empty keyed lane leaves the table once idle, so the table holds only
 * keys with work. Under a->mu. */
static void lane_release(dsec_actor *a, struct lane *l)
{
    if (l == &a->lane0)
        return;
    struct lane **pp = &a->buckets[key_bucket(a, l->key)];
    while (*pp != l)
        pp = &(*pp)->hnext;
    *pp = l->hnext;
    a->nkeyed--;
    if (a->nfree < FREE_LANES_MAX) {
        if (l->cap > RING_KEEP) {
            dsec_free(l->ring);
            l->ring = NULL;
            l->cap = 0;
        }
        l->hnext = a->free_lanes;
        a->free_lanes = l;
        a->nfree++;
    } else {
        dsec_free(l->ring);
        dsec_free(l);
    }
}

static void depth_sub(dsec_actor *a, uint32_t n)
{
    a->depth -= n;
    atomic_store_explicit(&a->depth_now, a->depth, memory_order_relaxed);
}

/* Drop queued entries: requests among them get a "closed" error reply so
 * their requesters do not wait for the deadline. */
static void discard_entries(dsec_actor *a, struct entry *e, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        dsec__reply_error(a->bus, e[i].nm, dsec_code_name(DSEC_E_CLOSED));
        dsec__msg_destroy(&e[i].nm);
    }
}

/* Whether a handler may read m: its Dsec-Schema is at most what this process
 * reads (docs/protocol.md, Versioning). No header reads as the current
 * version, so hand-written requests (`nats req`) still work. Otherwise a
 * request is answered `unsupported` rather than misread. */
static bool schema_ok(dsec_actor *a, dsec_msg *m, const char *subject)
{
    unsigned max = a->bus->schema_max;
    const char *v = NULL;
    if (max == 0 || (v = dsec__msg_header(m, DSEC_HDR_SCHEMA)) == NULL)
        return true;
    uint64_t n = 0;
    const char *p = v;
    for (; *p >= '0' && *p <= '9' && p - v < 10; p++)
        n = n * 10 + (uint64_t)(*p - '0');
    if (p != v && *p == '\0' && n <= max)
        return true;
    atomic_fetch_add_explicit(&a->errors, 1, memory_order_relaxed);
    if (!atomic_exchange(&a->schema_reported, true))
        dsec__bus_event(a->bus, DSEC_BUS_ERROR,
                        "actor %s: refused a message on %s: Dsec-Schema \"%.24s\" is not a version "
                        "this build reads (at most %u); further ones are only counted",
                        a->name, subject != NULL ? subject : "?", v, max);
    dsec__reply_error(a->bus, m->nm, dsec_code_name(DSEC_E_UNSUPPORTED));
    return false;
}

/* Entries a handler left untouched because it deferred: back to the front of the ring, in
 * order, for when the lane is released. Under a->mu. Returns how many could not be put back
 * (out of memory), which the caller discards. */
static uint32_t ring_unshift(dsec_actor *a, struct lane *l, const struct entry *e, uint32_t n)
{
    uint32_t back = 0;
    for (uint32_t i = n; i-- > 0;) {
        if (l->count == l->cap) {
            /* grown as ring_push grows it: doubled, unwrapped to head 0 */
            uint32_t ncap = l->cap ? l->cap * 2 : RING_MIN;
            struct entry *r = dsec_malloc(sizeof *r * ncap);
            if (r == NULL)
                return i + 1;
            for (uint32_t k = 0; k < l->count; k++)
                r[k] = l->ring[(l->head + k) & (l->cap - 1)];
            dsec_free(l->ring);
            l->ring = r;
            l->cap = ncap;
            l->head = 0;
        }
        l->head = (l->head + l->cap - 1) & (l->cap - 1);
        l->ring[l->head] = e[i];
        l->count++;
        back++;
    }
    a->depth += back;
    atomic_store_explicit(&a->depth_now, a->depth, memory_order_relaxed);
    return 0;
}

/* Shedding waits for a standing queue: the mailbox not empty once in this
 * long (4 bounds, at least 100 ms, as CoDel's interval). A burst the
 * workers get through, or a handler slow for a moment, sheds nothing. */
static bool queue_standing(dsec_actor *a, int64_t now, int64_t after)
{
    int64_t interval = 4 * after > 100000000 ? 4 * after : 100000000;
    return now - atomic_load_explicit(&a->empty_ns, memory_order_relaxed) > interval;
}

/* A lane with nothing more to run leaves the pool's accounting. Under a->mu. */
static void lane_idle(dsec_actor *a, struct lane *l)
{
    l->scheduled = false;
    a->nbusy--;
    lane_release(a, l);
    if (a->nbusy == 0 && a->waiters > 0)
        pthread_cond_broadcast(&a->cond);
}

static void lane_run(dsec__task *t)
{
    struct lane *l = container_of(t, struct lane, task);
    dsec_actor *a = l->actor;
    dsec_bus *bus = a->bus;
    struct entry batch[BATCH_MAX];

    pthread_mutex_lock(&a->mu);
    l->in_run = true;
    for (;;) {
        uint32_t n = ring_take(l, batch, BATCH_MAX);
        if (n == 0)
            break;
        depth_sub(a, n);
        bool closing = a->closing;
        pthread_mutex_unlock(&a->mu);
        uint32_t ran = n;

        if (closing) {
            discard_entries(a, batch, n);
        } else {
            /* Counted as handed over before the handlers run, so a handler
             * that signals "done" never sees a stale msgs_in. */
            atomic_fetch_add_explicit(&a->msgs_in, n, memory_order_relaxed);
            int64_t t0 = dsec__now_ns();
            for (uint32_t i = 0; i < n; i++) {
                /* The handler sees the headers schema_ok already read. */
                dsec_msg m;
                dsec__msg_init(&m, batch[i].nm, bus);
                const char *subject = natsMsg_GetSubject(batch[i].nm);
                if (!schema_ok(a, &m, subject))
                    continue;
                /* The handler works for its message's trace: what it sends
                 * carries that id, and its hop may be recorded. */
                dsec_trace_scope sc;
                dsec_trace_enter(&sc, a, dsec__msg_header(&m, DSEC_HDR_TRACE_ID), subject,
                                 dsec__msg_header(&m, DSEC_HDR_TYPE));
                struct run_ctx rc = {.lane = l, .entry = &batch[i], .start_ns = sc.start_ns};
                struct actor_sub *s = batch[i].sub;
                int64_t now = s->shed != NULL ? dsec__now_ns() : 0;
                int64_t waited = now - batch[i].at_ns;
                int64_t after = s->shed != NULL
                                    ? atomic_load_explicit(&a->shed_after_ns, memory_order_relaxed)
                                    : 0;
                if (after > 0 && waited > after && queue_standing(a, now, after)) {
                    /* Too late to be worth its work: answered now, so its sender
                     * hears at once, and the messages behind it wait less. */
                    atomic_fetch_add_explicit(&a->shed, 1, memory_order_relaxed);
                    s->shed(a, &m, (uint64_t)waited, s->ud);
                    dsec_trace_leave(&sc);
                    continue;
                }
                run_ctx = &rc;
                s->h(a, &m, s->ud);
                run_ctx = NULL;
                if (rc.deferred != NULL)
                    sc.actor = NULL; /* its hop is recorded when the work ends */
                dsec_trace_leave(&sc);
                if (rc.deferred != NULL) {
                    /* The handler kept its message: the key waits for dsec_deferred_done,
                     * and this worker goes on with other lanes. */
                    ran = i + 1;
                    break;
                }
            }
            atomic_fetch_add_explicit(&a->handler_ns, (uint64_t)(dsec__now_ns() - t0),
                                      memory_order_relaxed);
            /* Destroyed together after the batch: nats.c hands each one to its
             * collector thread and wakes it when its list was empty, so a
             * burst costs one wake-up instead of one per message. */
            for (uint32_t i = 0; i < ran; i++)
                dsec__msg_destroy(&batch[i].nm);
        }

        pthread_mutex_lock(&a->mu);
        if (ran < n) {
            uint32_t lost = ring_unshift(a, l, batch + ran, n - ran);
            if (lost > 0) {
                pthread_mutex_unlock(&a->mu);
                discard_entries(a, batch + ran, lost);
                pthread_mutex_lock(&a->mu);
            }
        }
        if (l->held) {
            /* still scheduled: dsec_deferred_done goes on with the lane (done before
             * this point, it left the lane to this loop) */
            l->in_run = false;
            pthread_mutex_unlock(&a->mu);
            return;
        }
        /* More to do, but others wait: go to the back of the queue so one
         * busy key cannot starve the rest of the pool. */
        if (l->count > 0 && dsec__pool_contended(&bus->pool)) {
            l->in_run = false;
            dsec__pool_push(&bus->pool, t);
            pthread_mutex_unlock(&a->mu);
            return;
        }
    }
    l->in_run = false;
    if (a->depth == 0)
        atomic_store_explicit(&a->empty_ns, dsec__now_ns(), memory_order_relaxed);
    lane_idle(a, l);
    pthread_mutex_unlock(&a->mu);
}

uint64_t dsec_actor_msg_waited_ns(void)
{
    struct run_ctx *rc = run_ctx;
    if (rc == NULL)
        return 0;
    int64_t w = dsec__now_ns() - rc->entry->at_ns;
    return w > 0 ? (uint64_t)w : 0;
}

dsec_deferred *dsec_actor_defer(dsec_actor *actor, dsec_msg *m)
{
    struct run_ctx *rc = run_ctx;
    if (rc == NULL || rc->deferred != NULL || rc->lane->actor != actor || m == NULL ||
        m->nm != rc->entry->nm || m->heap)
        return NULL;
    dsec_deferred *d = dsec_malloc(sizeof *d);
    dsec_msg *copy = dsec_malloc(sizeof *copy);
    if (d == NULL || copy == NULL) {
        dsec_free(d);
        dsec_free(copy);
        return NULL;
    }
    *copy = *m;
    copy->heap = true;
    d->msg = copy;
    d->lane = rc->lane;
    d->start_ns = rc->start_ns;
    rc->entry->nm = NULL; /* the copy owns it now */
    rc->deferred = d;
    pthread_mutex_lock(&actor->mu);
    rc->lane->held = true;
    pthread_mutex_unlock(&actor->mu);
    return d;
}

dsec_msg *dsec_deferred_msg(dsec_deferred *d)
{
    return d != NULL ? d->msg : NULL;
}

void dsec_deferred_trace(dsec_deferred *d, dsec_trace_scope *sc)
{
    dsec_msg *m = d->msg;
    dsec_trace_enter(sc, d->lane->actor, dsec__msg_header(m, DSEC_HDR_TRACE_ID),
                     natsMsg_GetSubject(m->nm), dsec__msg_header(m, DSEC_HDR_TYPE));
    if (d->start_ns != 0)
        sc->start_ns = d->start_ns;
}

void dsec_deferred_done(dsec_deferred *d)
{
    if (d == NULL)
        return;
    struct lane *l = d->lane;
    dsec_actor *a = l->actor;
    dsec_msg_free(d->msg);
    dsec_free(d);
    pthread_mutex_lock(&a->mu);
    l->held = false;
    if (l->in_run)
        ; /* done before its handler returned: lane_run goes on with the lane */
    else if (l->count > 0)
        dsec__pool_push(&a->bus->pool, &l->task); /* a closing actor discards them there */
    else
        lane_idle(a, l);
    pthread_mutex_unlock(&a->mu);
}

/* ---- subscriptions ----------------------------------------------------- */

static void drop_msg(dsec_actor *a, struct actor_sub *s, natsMsg **nm, bool report,
                     const char *code_name)
{
    atomic_fetch_add_explicit(&a->dropped, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&a->bus->mailbox_drops, 1, memory_order_relaxed);
    if (report)
        dsec__bus_event(a->bus, DSEC_BUS_MAILBOX_FULL,
                        "actor %s: mailbox full (%u queued); dropping messages on %s", a->name,
                        a->mailbox_max, s->subject);
    dsec__reply_error(a->bus, *nm, code_name);
    dsec__msg_destroy(nm);
}

/* nats.c's delivery thread for this subscription: only queue the message,
 * never run user code here beyond the key function. */
static void on_msg(natsConnection *nc, natsSubscription *ns, natsMsg *nm, void *closure)
{
    struct actor_sub *s = closure;
    dsec_actor *a = s->actor;
    uint64_t key = 0;
    if (a->key_fn != NULL) {
        dsec_msg view;
        dsec__msg_init(&view, nm, a->bus);
        key = a->key_fn(&view, a->key_ud);
    }

    pthread_mutex_lock(&a->mu);
    if (a->closing) {
        pthread_mutex_unlock(&a->mu);
        dsec__reply_error(a->bus, nm, dsec_code_name(DSEC_E_CLOSED));
        dsec__msg_destroy(&nm);
        return;
    }
    /* Running out of memory for the mailbox counts as full: same drop,
     * same fast error reply. */
    struct lane *l = NULL;
    if (a->depth >= a->mailbox_max || (l = lane_for_key(a, key)) == NULL ||
        ring_push(l, nm, s, dsec__now_ns()) < 0) {
        bool report = !a->overflowing;
        a->overflowing = true;
        /* A lane created for this message but left empty must not linger. */
        if (l != NULL && l->count == 0 && !l->scheduled)
            lane_release(a, l);
        pthread_mutex_unlock(&a->mu);
        drop_msg(a, s, &nm, report, dsec_code_name(DSEC_E_OVERFLOW));
        return;
    }
    a->overflowing = false;
    if (a->depth == 0) /* empty until now: a queue starts, none stood before it */
        atomic_store_explicit(&a->empty_ns, dsec__now_ns(), memory_order_relaxed);
    a->depth++;
    atomic_store_explicit(&a->depth_now, a->depth, memory_order_relaxed);
    if (a->depth > atomic_load_explicit(&a->peak, memory_order_relaxed))
        atomic_store_explicit(&a->peak, a->depth, memory_order_relaxed);
    if (!l->scheduled) {
        l->scheduled = true;
        a->nbusy++;
        dsec__pool_push(&a->bus->pool, &l->task);
    }
    pthread_mutex_unlock(&a->mu);
}

static void on_sub_complete(void *closure)
{
    struct actor_sub *s = closure;
    dsec_bus *bus = s->actor->bus;
    pthread_mutex_lock(&bus->mu);
    s->done = true;
    pthread_cond_broadcast(&bus->cond);
    pthread_mutex_unlock(&bus->mu);
}

/* ---- public API -------------------------------------------------------- */

int dsec_actor_new(dsec_actor **out, dsec_bus *bus, const char *name, dsec_err *err)
{
    *out = NULL;
    if (name == NULL || name[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "actor: empty name");
    dsec_actor *a = dsec_calloc(1, sizeof *a);
    if (a == NULL || (a->name = dsec_strdup(name)) == NULL) {
        dsec_free(a);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "actor %s", name);
    }
    a->bus = bus;
    a->mailbox_max = (uint32_t)bus->mailbox_max;
    pthread_mutex_init(&a->mu, NULL);
    dsec__cond_init(&a->cond); /* timed waits use CLOCK_MONOTONIC deadlines */
    lane_init(&a->lane0, a, 0);
    a->refs = 1;
    atomic_store(&a->empty_ns, dsec__now_ns());

    pthread_mutex_lock(&bus->mu);
    if (bus->state != DSEC__BUS_OPEN) {
        pthread_mutex_unlock(&bus->mu);
        dsec__actor_free_closed(a);
        return dsec_err_set(err, DSEC_E_CLOSED, 0, "actor %s: the bus is draining or closed", name);
    }
    a->next = bus->actors;
    if (bus->actors != NULL)
        bus->actors->prev = a;
    bus->actors = a;
    a->linked = true;
    pthread_mutex_unlock(&bus->mu);
    *out = a;
    return 0;
}

void dsec_actor_set_key(dsec_actor *a, dsec_key_fn fn, void *ud)
{
    pthread_mutex_lock(&a->mu);
    /* Changing keys under live traffic would split one key's order across
     * two lanes; the contract says before the first dsec_actor_on. */
    if (a->subs == NULL) {
        a->key_fn = fn;
        a->key_ud = ud;
    }
    pthread_mutex_unlock(&a->mu);
}

int dsec_actor_on(dsec_actor *a, const char *subject, const char *queue, dsec_handler h, void *ud,
                  dsec_err *err)
{
    return dsec_actor_on_shed(a, subject, queue, h, NULL, ud, err);
}

int dsec_actor_on_shed(dsec_actor *a, const char *subject, const char *queue, dsec_handler h,
                       dsec_shed_handler shed, void *ud, dsec_err *err)
{
    if (subject == NULL || subject[0] == '\0' || h == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "actor %s: subscribe needs a subject and a handler", a->name);
    dsec_bus *bus = a->bus;
    struct actor_sub *s = dsec_calloc(1, sizeof *s);
    if (s == NULL || (s->subject = dsec_strdup(subject)) == NULL) {
        dsec_free(s);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "actor %s: subscribe to %s", a->name,
                            subject);
    }
    s->actor = a;
    s->h = h;
    s->shed = shed;
    s->ud = ud;

    natsStatus st;
    if (queue != NULL && queue[0] != '\0')
        st = natsConnection_QueueSubscribe(&s->sub, bus->nc, subject, queue, on_msg, s);
    else
        st = natsConnection_Subscribe(&s->sub, bus->nc, subject, on_msg, s);
    if (st == NATS_OK) {
        st = natsSubscription_SetOnCompleteCB(s->sub, on_sub_complete, s);
        if (st != NATS_OK) {
            /* Closed under us (the connection closed): nats.c is done with
             * it, so no callback can still be running on s. */
            natsSubscription_Destroy(s->sub);
        }
    }
    if (st != NATS_OK) {
        dsec_free(s->subject);
        dsec_free(s);
        return dsec__nats_err(err, st, "actor %s: subscribe to %s", a->name, subject);
    }
    /* The mailbox is the bound that matters; nats.c's own per-subscription
     * queue only buffers between its reader and on_msg, which never blocks. */
    natsSubscription_SetPendingLimits(s->sub, a->mailbox_max > 65536 ? (int)a->mailbox_max : 65536,
                                      256 * 1024 * 1024);

    pthread_mutex_lock(&a->mu);
    s->next = a->subs;
    a->subs = s;
    pthread_mutex_unlock(&a->mu);
    return 0;
}

void dsec_actor_set_shed(dsec_actor *a, uint32_t ms)
{
    atomic_store_explicit(&a->shed_after_ns, (int64_t)ms * 1000000, memory_order_relaxed);
}

const char *dsec_actor_name(const dsec_actor *a)
{
    return a->name;
}

dsec_bus *dsec_actor_bus(dsec_actor *a)
{
    return a->bus;
}

void dsec_actor_stats_get(const dsec_actor *a, dsec_actor_stats *out)
{
    out->msgs_in = atomic_load_explicit(&a->msgs_in, memory_order_relaxed);
    out->msgs_out = atomic_load_explicit(&a->msgs_out, memory_order_relaxed);
    out->errors = atomic_load_explicit(&a->errors, memory_order_relaxed);
    out->dropped = atomic_load_explicit(&a->dropped, memory_order_relaxed);
    out->mailbox_depth = atomic_load_explicit(&a->depth_now, memory_order_relaxed);
    out->mailbox_peak = atomic_load_explicit(&a->peak, memory_order_relaxed);
    out->handler_ns = atomic_load_explicit(&a->handler_ns, memory_order_relaxed);
    out->shed = atomic_load_explicit(&a->shed, memory_order_relaxed);
}

void dsec_actor_count_error(dsec_actor *a)
{
    atomic_fetch_add_explicit(&a->errors, 1, memory_order_relaxed);
    dsec__trace_note_error(a);
}

void dsec__actor_count_out(dsec_actor *a)
{
    atomic_fetch_add_explicit(&a->msgs_out, 1, memory_order_relaxed);
}

int dsec_actor_publish(dsec_actor *a, const char *subject, const char *reply, const dsec_hdr *hdr,
                       const void *data, size_t len, dsec_err *err)
{
    if (dsec__publish(a->bus, subject, reply, hdr, data, len, NULL, err) < 0)
        return -1;
    dsec__actor_count_out(a);
    return 0;
}

uint64_t dsec__actor_depth(const dsec_actor *a)
{
    return atomic_load_explicit(&a->depth_now, memory_order_relaxed);
}

/* ---- shutdown ---------------------------------------------------------- */

void dsec__actor_stop_subs(dsec_actor *a, bool drain, int64_t deadline_ns)
{
    pthread_mutex_lock(&a->mu);
    struct actor_sub *subs = a->subs;
    pthread_mutex_unlock(&a->mu);
    /* The list only grows at its head, so walking from a snapshot is safe. */
    for (struct actor_sub *s = subs; s != NULL; s = s->next) {
        natsStatus st = NATS_ERR;
        if (drain) {
            int64_t left_ms = (deadline_ns - dsec__now_ns()) / 1000000;
            st = natsSubscription_DrainTimeout(s->sub, left_ms > 0 ? left_ms : 1);
        }
        /* Not draining, or draining is impossible (disconnected, already
         * closed): unsubscribe; either way on_sub_complete follows. */
        if (st != NATS_OK)
            natsSubscription_Unsubscribe(s->sub);
    }
}

bool dsec__actor_wait_subs(dsec_actor *a, int64_t deadline_ns)
{
    dsec_bus *bus = a->bus;
    pthread_mutex_lock(&a->mu);
    struct actor_sub *subs = a->subs;
    pthread_mutex_unlock(&a->mu);
    bool ok = true;
    struct timespec ts;
    dsec__abstime(&ts, deadline_ns);
    pthread_mutex_lock(&bus->mu);
    for (struct actor_sub *s = subs; s != NULL && ok; s = s->next) {
        while (!s->done) {
            int e = deadline_ns > 0 ? pthread_cond_timedwait(&bus->cond, &bus->mu, &ts)
                                    : pthread_cond_wait(&bus->cond, &bus->mu);
            if (e == ETIMEDOUT && !s->done) {
                ok = false;
                break;
            }
        }
    }
    pthread_mutex_unlock(&bus->mu);
    return ok;
}

bool dsec__actor_wait_idle(dsec_actor *a, int64_t deadline_ns)
{
    struct timespec ts;
    dsec__abstime(&ts, deadline_ns);
    bool ok = true;
    pthread_mutex_lock(&a->mu);
    a->waiters++;
    while (a->nbusy > 0) {
        if (pthread_cond_timedwait(&a->cond, &a->mu, &ts) == ETIMEDOUT && a->nbusy > 0) {
            ok = false;
            break;
        }
    }
    a->waiters--;
    pthread_mutex_unlock(&a->mu);
    return ok;
}

/* If l sits in the run queue, take it out and empty it. Under a->mu. */
static void lane_unqueue(dsec_actor *a, struct lane *l)
{
    struct entry batch[BATCH_MAX];
    if (!l->scheduled || !dsec__pool_unlink(&a->bus->pool, &l->task))
        return; /* idle, or a worker holds it and will see closing */
    uint32_t n;
    while ((n = ring_take(l, batch, BATCH_MAX)) > 0) {
        depth_sub(a, n);
        discard_entries(a, batch, n);
    }
    l->scheduled = false;
    a->nbusy--;
    lane_release(a, l);
}

void dsec__actor_close(dsec_actor *a, bool wait)
{
    pthread_mutex_lock(&a->mu);
    a->closing = true;
    lane_unqueue(a, &a->lane0);
    for (uint32_t b = 0; b < a->nbuckets; b++)
        for (struct lane *l = a->buckets[b], *next; l != NULL; l = next) {
            next = l->hnext; /* lane_unqueue may unlink l */
            lane_unqueue(a, l);
        }
    a->waiters++;
    while (wait && a->nbusy > 0)
        pthread_cond_wait(&a->cond, &a->mu);
    a->waiters--;
    pthread_mutex_unlock(&a->mu);
}

void dsec__actor_free_closed(dsec_actor *a)
{
    for (struct actor_sub *s = a->subs, *next; s != NULL; s = next) {
        next = s->next;
        natsSubscription_Destroy(s->sub);
        dsec_free(s->subject);
        dsec_free(s);
    }
    for (uint32_t b = 0; b < a->nbuckets; b++) {
        for (struct lane *l = a->buckets[b], *next; l != NULL; l = next) {
            next = l->hnext;
            dsec_free(l->ring);
            dsec_free(l);
        }
    }
    for (struct lane *l = a->free_lanes, *next; l != NULL; l = next) {
        next = l->hnext;
        dsec_free(l->ring);
        dsec_free(l);
    }
    dsec_free(a->buckets);
    dsec_free(a->lane0.ring);
    pthread_cond_destroy(&a->cond);
    pthread_mutex_destroy(&a->mu);
    dsec_free(a->name);
    dsec_free(a);
}

void dsec__actor_get(dsec_actor *a)
{
    pthread_mutex_lock(&a->bus->mu);
    a->refs++;
    pthread_mutex_unlock(&a->bus->mu);
}

void dsec__actor_put(dsec_actor *a)
{
    dsec_bus *bus = a->bus;
    pthread_mutex_lock(&bus->mu);
    bool last = --a->refs == 0;
    pthread_mutex_unlock(&bus->mu);
    if (last)
        dsec__actor_free_closed(a);
}

dsec_actor **dsec__actors_snapshot(dsec_bus *bus, size_t *n)
{
    pthread_mutex_lock(&bus->mu);
    size_t count = 0;
    for (dsec_actor *a = bus->actors; a != NULL; a = a->next)
        count++;
    dsec_actor **v = dsec_calloc(count ? count : 1, sizeof *v);
    *n = 0;
    if (v != NULL) {
        for (dsec_actor *a = bus->actors; a != NULL; a = a->next) {
            a->refs++;
            v[(*n)++] = a;
        }
    }
    pthread_mutex_unlock(&bus->mu);
    return v;
}

dsec_actor *dsec__actors_pop(dsec_bus *bus)
{
    pthread_mutex_lock(&bus->mu);
    dsec_actor *a = bus->actors;
    if (a != NULL) {
        bus->actors = a->next;
        if (a->next != NULL)
            a->next->prev = NULL;
        a->next = a->prev = NULL;
        a->linked = false;
    }
    pthread_mutex_unlock(&bus->mu);
    return a;
}

int dsec_actor_drain(dsec_actor *a, int timeout_ms, dsec_err *err)
{
    int64_t deadline = dsec__now_ns() + (int64_t)(timeout_ms > 0 ? timeout_ms : 5000) * 1000000;
    dsec__actor_stop_subs(a, true, deadline);
    const char *stuck = !dsec__actor_wait_subs(a, deadline)   ? "its subscriptions to drain"
                        : !dsec__actor_wait_idle(a, deadline) ? "its handlers to finish"
                                                              : NULL;
    if (stuck == NULL)
        return 0;
    return dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                        "actor %s: drain ran out of time waiting for %s (%llu messages queued)",
                        a->name, stuck, (unsigned long long)dsec__actor_depth(a));
}

void dsec_actor_free(dsec_actor *a)
{
    if (a == NULL)
        return;
    dsec_bus *bus = a->bus;
    pthread_mutex_lock(&bus->mu);
    bool was_linked = a->linked;
    if (a->linked) {
        if (a->prev != NULL)
            a->prev->next = a->next;
        else
            bus->actors = a->next;
        if (a->next != NULL)
            a->next->prev = a->prev;
        a->linked = false;
    }
    pthread_mutex_unlock(&bus->mu);
    if (!was_linked)
        return; /* freed twice, or dsec_bus_free got there first */
    /* From here no handler starts: what is queued, or still arrives while
     * the subscriptions wind down, is dropped (requests answered "closed"),
     * as the contract says, instead of being handled until the close. */
    pthread_mutex_lock(&a->mu);
    a->closing = true;
    pthread_mutex_unlock(&a->mu);
    dsec__actor_stop_subs(a, false, 0);
    dsec__actor_wait_subs(a, 0);
    dsec__actor_close(a, true);
    dsec__actor_put(a);
}
