/* internal.h - what the files of bus/ share: the bus, actor, worker-pool and
 * request structures. Never included outside bus/; it is the only header that
 * pulls in <nats/nats.h>. */
#ifndef DSEC_BUS_INTERNAL_H
#define DSEC_BUS_INTERNAL_H

#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "bus/bus.h"

/* Header values read from the raw header block are copied here, so the
 * strings handed out live as long as the dsec_msg; a value that does not fit
 * is read through nats.c instead. Enough for the dsec headers of a message. */
#define DSEC__MSG_HCACHE 192

/* A received message. Handlers get one on the worker's stack; futures embed
 * one; dsec_bus_request_sync hands out a heap one (heap == true). Create one
 * with hused 0 (a zero initializer) and never copy it once headers were read:
 * the strings dsec__msg_header returns point into it. */
struct dsec_msg {
    natsMsg *nm;
    dsec_bus *bus; /* where dsec_msg_respond publishes when no actor is given */
    bool heap;
    uint8_t hstate;     /* raw header block: 0 not looked at, 1 usable (hblock), 2 not */
    uint16_t hused;     /* bytes of hcache holding NUL-terminated values */
    uint32_t hlen;      /* hblock's length */
    const char *hblock; /* nm's raw header block, once checked */
    char hcache[DSEC__MSG_HCACHE];
};

/* A dsec_msg for nm without clearing its cache, for the per-message paths. */
static inline void dsec__msg_init(dsec_msg *m, natsMsg *nm, dsec_bus *bus)
{
    m->nm = nm;
    m->bus = bus;
    m->heap = false;
    m->hstate = 0;
    m->hused = 0;
}

/* The one place that destroys a natsMsg; sets *nm to NULL. Frees at once
 * where natsMsg_Destroy would hand the message to nats.c's collector thread
 * (bus/msg.c says when). */
void dsec__msg_destroy(natsMsg **nm);

/* Whether dsec__msg_destroy frees messages itself: nats.c's message layout
 * passed the once-per-process check. For tests. */
bool dsec__msg_free_inline(void);

/* The value of header key (exact, case-sensitive match, first of repeated
 * keys: what nats.c's natsMsgHeader_Get answers) or NULL. The string belongs
 * to m (its cache) or to m->nm, and lives as long as both. */
const char *dsec__msg_header(dsec_msg *m, const char *key);

/* The fast path alone, for tests: 1 with the value's bytes (not
 * NUL-terminated, inside nm) when nm's raw header block holds key, 0 when it
 * does not, -1 when this message must be read through nats.c (no raw block,
 * a layout the self-check did not confirm, or a block it does not parse
 * exactly like nats.c). */
int dsec__msg_header_raw(natsMsg *nm, const char *key, const char **value, size_t *len);

/* Translate a natsStatus into err (code, plus nats.c's own text); returns -1. */
int dsec__nats_err(dsec_err *err, natsStatus s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* CLOCK_MONOTONIC in nanoseconds. */
int64_t dsec__now_ns(void);

/* Absolute CLOCK_MONOTONIC deadline for pthread_cond_timedwait on a condvar
 * created by dsec__cond_init. */
void dsec__abstime(struct timespec *ts, int64_t deadline_ns);
int dsec__cond_init(pthread_cond_t *c);

/* Build a message with the dsec headers and publish it. err_code, when not
 * NULL, adds Dsec-Error-Code (error replies). Never takes a bus lock, so it
 * is safe from nats.c callback threads. */
int dsec__publish(dsec_bus *bus, const char *subject, const char *reply, const dsec_hdr *hdr,
                  const void *data, size_t len, const char *err_code, dsec_err *err);

/* Answer a request that will never reach a handler with an error reply
 * (Dsec-Type: error, Dsec-Error-Code: code_name, empty body). nm is borrowed. */
void dsec__reply_error(dsec_bus *bus, natsMsg *nm, const char *code_name);

/* Report a connection or actor event to the user's callback, if any. */
void dsec__bus_event(dsec_bus *bus, dsec_bus_event ev, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- worker pool (actor.c) --------------------------------------------- */

/* A unit of work the pool can schedule: an actor lane or a reply queue.
 * rq_* and in_rq belong to the pool and are protected by its mutex. */
typedef struct dsec__task dsec__task;
struct dsec__task {
    dsec__task *rq_prev, *rq_next;
    bool in_rq;
    /* Runs on a worker without the pool lock. Drains what it can, then either
     * marks itself idle or pushes itself back with dsec__pool_push. */
    void (*run)(dsec__task *t);
};

typedef struct dsec__pool {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    dsec__task *head, *tail;
    atomic_uint qlen; /* tasks queued; read without the lock for fairness */
    int nthreads;
    int nidle;   /* workers blocked in cond_wait */
    int nwaking; /* signalled but not yet running */
    bool stop;
    pthread_t *threads;
} dsec__pool;

int dsec__pool_start(dsec__pool *p, int nthreads, dsec_err *err);
/* Queue t (not queued now). Callers may hold the lock of t's owner: the lock
 * order is owner lock -> pool lock, never the reverse. */
void dsec__pool_push(dsec__pool *p, dsec__task *t);
/* Remove t from the run queue if it is queued; returns whether it was. */
bool dsec__pool_unlink(dsec__pool *p, dsec__task *t);
/* Whether other tasks wait: a task with more work yields to them. */
static inline bool dsec__pool_contended(dsec__pool *p)
{
    return atomic_load_explicit(&p->qlen, memory_order_relaxed) > 0;
}
/* Let the workers finish the queue, then join them. */
void dsec__pool_stop(dsec__pool *p);

/* ---- the bus ----------------------------------------------------------- */

enum { DSEC__BUS_OPEN, DSEC__BUS_DRAINING, DSEC__BUS_DRAINED };

typedef struct dsec__req dsec__req;

struct dsec_bus {
    natsConnection *nc;
    dsec_bus_event_cb on_event;
    void *event_ud;
    int mailbox_max;
    unsigned schema_max; /* see dsec_bus_opts.schema_max */
    int threads;
    bool shared_delivery; /* see dsec_bus_opts.shared_delivery */
    char *name;

    dsec__pool pool;
    dsec__req *req;        /* request.c */
    char inbox_prefix[72]; /* "_INBOX" or dsec_bus_opts.inbox_prefix */
    char url_shown[256];   /* the URL for messages, passwords masked */

    /* mu protects the actor list, state and the flags below; cond is
     * broadcast when any of them changes (subscription completion, the
     * closed callback, actor idleness). */
    pthread_mutex_t mu;
    pthread_cond_t cond;
    dsec_actor *actors;
    int state;
    bool closed_seen; /* nats.c's closed callback has run */

    /* The closure nats.c's handlers get (bus.c, live_enter); under bus.c's
     * live_mu. */
    uintptr_t live_id;
    dsec_bus *live_next;
    int live_calls;

    atomic_uint_fast64_t async_errors;
    atomic_uint_fast64_t slow_consumers;
    atomic_uint_fast64_t disconnects;
    atomic_uint_fast64_t reconnects;
    atomic_uint_fast64_t mailbox_drops;

    _Atomic(struct dsec__trace *) trace; /* trace.c: the hop record, once configured */
};

/* ---- actors (actor.c), used by bus.c for drain and free ------------------ */

/* Stop the actor's subscriptions: drain them (the server stops sending, what
 * the client already holds still reaches the mailbox) or just unsubscribe. */
void dsec__actor_stop_subs(dsec_actor *a, bool drain, int64_t deadline_ns);
/* Wait until every subscription's callback has returned for good. */
bool dsec__actor_wait_subs(dsec_actor *a, int64_t deadline_ns);
/* Wait until the mailbox is empty and no handler runs. */
bool dsec__actor_wait_idle(dsec_actor *a, int64_t deadline_ns);
/* Refuse further messages, drop what is queued (answering requests with a
 * "closed" error) and, if wait, wait for running handlers. */
void dsec__actor_close(dsec_actor *a, bool wait);
/* Free an actor whose subscriptions completed and which is closed. */
void dsec__actor_free_closed(dsec_actor *a);
/* Messages queued in the actor's mailbox now. */
uint64_t dsec__actor_depth(const dsec_actor *a);
/* Reference counting: the bus list holds one reference, drain holds one
 * while it walks the actors. The last put frees the actor. */
void dsec__actor_get(dsec_actor *a);
void dsec__actor_put(dsec_actor *a);
/* The bus's actors now, each with a reference taken (drop with put); NULL
 * when out of memory. */
dsec_actor **dsec__actors_snapshot(dsec_bus *bus, size_t *n);
/* Unlink the first actor from the bus, keeping the list's reference for the
 * caller; NULL when none is left. */
dsec_actor *dsec__actors_pop(dsec_bus *bus);
/* Count one publish or reply in the actor's msgs_out. */
void dsec__actor_count_out(dsec_actor *a);

/* ---- tracing (trace.c) -------------------------------------------------- */

/* A message is going out: the innermost trace scope learns what it sent and
 * whether that was an error (hdr->type "error", or an err_code). */
void dsec__trace_note_send(const dsec_hdr *hdr, const char *err_code);
/* The actor counted an error while a scope of it runs on this thread. */
void dsec__trace_note_error(dsec_actor *a);
/* The actor whose traced hop this thread is in (recording on, a trace id
 * set), or NULL: a request's callback continues that hop's work. */
dsec_actor *dsec__trace_actor(void);
/* Free the bus's hop record (bus_release). */
void dsec__trace_free(dsec_bus *bus);

/* ---- requests (request.c) ---------------------------------------------- */

/* Before connecting: the table, the timer thread and the reply queues. */
int dsec__req_init(dsec_bus *bus, dsec_err *err);
/* After connecting: the bus's wildcard inbox subscription. */
int dsec__req_start(dsec_bus *bus, dsec_err *err);
/* The connection dropped: fail requests sent before it with DSEC_E_CONN. */
void dsec__req_disconnected(dsec_bus *bus);
/* Fail every pending request sent to subject with code now (the server
 * refused to deliver it, e.g. for permissions); returns how many. */
size_t dsec__req_fail_subject(dsec_bus *bus, const char *subject, int code);
/* Refuse new requests and fail pending ones with DSEC_E_CLOSED. */
void dsec__req_close(dsec_bus *bus);
/* Wait until every reply callback queued so far has run. */
bool dsec__req_wait_idle(dsec_bus *bus, int64_t deadline_ns);
/* Stop the timer and free the table. The pool must be stopped already. */
void dsec__req_free(dsec_bus *bus);
uint64_t dsec__req_pending(dsec_bus *bus);

#endif
