/* bus.h - the actor runtime over NATS: connections, actors with mailboxes,
 * publish, requests with deadlines, and the embedded nats-server launcher.
 * Only bus/ includes NATS headers; nothing here exposes a NATS type. */
#ifndef DSEC_BUS_H
#define DSEC_BUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsec_bus dsec_bus;       /* one NATS connection + a worker pool */
typedef struct dsec_actor dsec_actor;   /* a named set of handlers + a mailbox */
typedef struct dsec_msg dsec_msg;       /* a received message (borrowed by handlers) */
typedef struct dsec_future dsec_future; /* the pending answer to a request */

/* Header names carried by every dsec message. */
#define DSEC_HDR_TYPE "Dsec-Type"            /* message type name, e.g. "create" */
#define DSEC_HDR_SCHEMA "Dsec-Schema"        /* schema version, decimal */
#define DSEC_HDR_CONTENT_TYPE "Content-Type" /* always application/msgpack */
#define DSEC_HDR_REQ_ID "Dsec-Req-Id"        /* idempotency key of a request */
#define DSEC_HDR_TRACE_ID "Dsec-Trace-Id"    /* end-to-end trace id */
#define DSEC_CONTENT_TYPE "application/msgpack"

/* Error replies the bus itself sends: Dsec-Type is DSEC_TYPE_ERROR, the body
 * is empty, and Dsec-Error-Code holds a dsec_code_name() ("overflow" when the
 * responder's mailbox was full, "closed" when its actor was freed with the
 * request still queued). Such a reply reaches the requester as a normal reply
 * (status 0): decode it with dsec_msg_type / dsec_msg_header. */
#define DSEC_HDR_ERROR_CODE "Dsec-Error-Code"
#define DSEC_TYPE_ERROR "error"

/* The Dsec-Schema every message carries unless its sender sets another:
 * the schema version of the wire messages (codecs/msg.h's
 * DSEC_SCHEMA_VERSION; actors/wire.c checks they agree). bus/ does not
 * know the codecs, but no dsec message may go out without its version. */
#define DSEC_BUS_SCHEMA 1

/* What goes into the headers of an outgoing message. Any field may be NULL/0;
 * when trace_id is NULL the bus uses this thread's current trace id
 * (dsec_trace_current), else a fresh one. Every publish carries
 * Dsec-Schema (decimal; DSEC_BUS_SCHEMA when schema is 0), Content-Type and
 * Dsec-Trace-Id, plus Dsec-Type and Dsec-Req-Id when given. The strings are
 * copied. */
typedef struct dsec_hdr {
    const char *type;
    unsigned schema;
    const char *req_id;
    const char *trace_id;
} dsec_hdr;

/* Connection events delivered to the bus's event callback. */
typedef enum dsec_bus_event {
    DSEC_BUS_DISCONNECTED = 1,
    DSEC_BUS_RECONNECTED = 2,
    DSEC_BUS_CLOSED = 3,
    DSEC_BUS_ERROR = 4,        /* async error, e.g. slow consumer; detail in msg */
    DSEC_BUS_MAILBOX_FULL = 5, /* an actor started dropping messages; detail names it */
} dsec_bus_event;

/* Called from a nats.c or bus thread (never with a bus lock held); detail is
 * valid for the call only. DSEC_BUS_MAILBOX_FULL is reported once per overflow
 * episode (the first drop after the mailbox last accepted a message); every
 * drop is counted in dsec_actor_stats.dropped. Must not block for long: the
 * same thread delivers the actor's messages or nats.c's connection events. */
typedef void (*dsec_bus_event_cb)(dsec_bus *bus, dsec_bus_event ev, const char *detail, void *ud);

typedef struct dsec_bus_opts {
    const char *url;  /* comma-separated server URLs; default $DSEC_URL or nats://127.0.0.1:4222 */
    const char *name; /* connection name shown by the server */
    int threads;      /* worker threads for actor handlers; default 2 */
    int mailbox_max;  /* per-actor queued messages before overflow; default 65536.
                       * A message arriving at a full mailbox is dropped; if it
                       * was a request, the bus answers it at once with an error
                       * reply (Dsec-Error-Code: overflow) so the requester fails
                       * fast instead of waiting for its deadline. */
    int connect_timeout_ms;       /* default 2000 */
    int reconnect_buf_bytes;      /* publishes buffered while reconnecting; default 8 MiB */
    int max_reconnect;            /* attempts before giving up; 0 or -1: forever (default) */
    bool retry_on_failed_connect; /* keep trying in the background if the first connect fails */
    bool low_latency;             /* write each publish at once instead of letting nats.c's
                                     flusher batch for ~1 ms: a request/reply round trip drops
                                     from ~2 ms to ~0.25 ms; a tight publish loop gets slower */
    bool shared_delivery;         /* the connection's subscriptions are delivered by nats.c's
                                     process-wide pool of delivery threads (one per CPU, at most
                                     4) instead of a thread each. A process with many actors
                                     (a dsecd running many node managers has hundreds of
                                     subscriptions) then wakes a pool thread that is often
                                     running already, instead of the sleeping thread of each
                                     message's subscription. Request callbacks never run on a
                                     delivery thread then (they go to the workers), so nothing
                                     blocks the pool. Default false (libdsec's clients run
                                     their reply callbacks on the delivery thread) */
    dsec_bus_event_cb on_event;   /* may be NULL; called from a bus thread */
    void *event_ud;
    const char *inbox_prefix; /* replies to this connection's requests arrive under
                                 <inbox_prefix>.<random>.; default "_INBOX". A tenant's
                                 connection uses "_INBOX.<tenant>": the server that
                                 `dsec auth` configures lets it subscribe there only */
    const char *tls_ca;       /* CA file trusted for the server's certificate (TLS is then
                                 required); default $DSEC_TLS_CA; NULL/"": the URL decides */
    unsigned schema_max;      /* the newest Dsec-Schema this process reads; 0: no check. A
                                 message to an actor whose Dsec-Schema is newer (or not a
                                 decimal number) never reaches a handler: a request gets a
                                 bus-level error reply (Dsec-Error-Code: unsupported), an
                                 event is dropped; both count as the actor's errors and the
                                 first per actor is reported (DSEC_BUS_ERROR). A message
                                 without the header is read as the current version */
} dsec_bus_opts;

/* Connect. On success *out owns a new bus; free with dsec_bus_free. While
 * the server is away publishes are buffered (reconnect_buf_bytes) and the bus
 * reconnects in the background. */
int dsec_bus_connect(dsec_bus **out, const dsec_bus_opts *opts, dsec_err *err);

/* Stop taking messages (subscriptions are drained, so what the server already
 * sent still reaches the mailboxes), let mailboxes and in-flight handlers
 * finish, fail the requests still pending with DSEC_E_CLOSED, run their
 * callbacks, flush publishes, then close. timeout_ms <= 0 means 5000. On
 * timeout the rest is dropped (queued requests are answered with a "closed"
 * error reply), the connection is closed anyway and -1/DSEC_E_TIMEOUT is
 * returned. Calling it again is a no-op. Not from a handler or callback. */
int dsec_bus_drain(dsec_bus *bus, int timeout_ms, dsec_err *err);

/* Drain (bounded) if not yet drained, then free everything: actors, the
 * workers (waiting for handlers still running), the connection. Futures are
 * the caller's: free them too (before or after). NULL is a no-op. Not from a
 * handler or callback. */
void dsec_bus_free(dsec_bus *bus);

/* This connection's inbox prefix ("_INBOX" or what the options gave). Other
 * reply subjects it subscribes to (streams) belong under "<prefix>.". */
const char *dsec_bus_inbox_prefix(const dsec_bus *bus);

/* The URL(s) it was given, with passwords shown as "***": for logs. */
const char *dsec_bus_url_shown(const dsec_bus *bus);

/* Whether the connection is currently up. */
bool dsec_bus_connected(const dsec_bus *bus);

/* The URL currently connected to (copied into buf). -1 when not connected
 * or buf is too small. */
int dsec_bus_connected_url(dsec_bus *bus, char *buf, size_t n);

/* Counters of the bus as a whole (actors have their own, below). */
typedef struct dsec_bus_stats {
    uint64_t async_errors;   /* errors nats.c reported asynchronously (DSEC_BUS_ERROR) */
    uint64_t slow_consumers; /* of which: a subscription's client-side queue overflowed */
    uint64_t disconnects;
    uint64_t reconnects;
    uint64_t mailbox_drops;    /* messages dropped by full mailboxes, all actors */
    uint64_t requests_pending; /* requests waiting for their answer now */
} dsec_bus_stats;

void dsec_bus_stats_get(dsec_bus *bus, dsec_bus_stats *out);
/* Its reconnects alone (one atomic load, no lock): for reports that say
 * whether the connection broke since the last one. */
uint64_t dsec_bus_reconnects(dsec_bus *bus);

/* Publish. data is copied before return. reply may be NULL. */
int dsec_bus_publish(dsec_bus *bus, const char *subject, const char *reply, const dsec_hdr *hdr,
                     const void *data, size_t len, dsec_err *err);

/* Flush buffered publishes to the server and wait for its ack. */
int dsec_bus_flush(dsec_bus *bus, int timeout_ms, dsec_err *err);

/* ---- requests ---------------------------------------------------------- */

/* Called exactly once per request: with status 0 and the reply, or with a
 * negative status and err filled (DSEC_E_TIMEOUT, DSEC_E_NO_RESPONDERS,
 * DSEC_E_CONN, DSEC_E_CLOSED). The reply is borrowed for the call only; an
 * error reply from the responder (Dsec-Type: error) is still status 0. On
 * DSEC_E_CONN the request may or may not have reached the responder: the
 * connection dropped while it was in flight; retrying with the same req_id
 * is safe.
 *
 * Where it runs: a reply runs it on the delivery thread of one of the bus's
 * callback inboxes (one per worker thread, at most 8), with no hand-off to a
 * bus worker; a timeout or failure runs it on a bus worker. It may block,
 * and may wait for another answer through a future or
 * dsec_bus_request_sync: once a callback has run for 1 ms, requests sent
 * after that go to another inbox (to the bus's workers when every inbox is
 * held), so only replies already on their way to its inbox wait for it. It
 * must not wait for another ordinary request's callback, which may be
 * queued behind it.
 *
 * It runs in the request's trace (see tracing, below): what it sends
 * carries the trace id the request was sent with. */
typedef void (*dsec_reply_cb)(int status, dsec_msg *reply, const dsec_err *err, void *ud);

/* Send a request; returns at once. Many may be in flight. timeout_ms must be
 * > 0. On success cb will be called exactly once; on failure (-1, err
 * filled) it will never be called. Replies arrive through a few wildcard
 * inbox subscriptions per bus, under its inbox prefix. */
int dsec_bus_request(dsec_bus *bus, const char *subject, const dsec_hdr *hdr, const void *data,
                     size_t len, int timeout_ms, dsec_reply_cb cb, void *ud, dsec_err *err);

/* dsec_bus_request for callbacks that never block: cb runs on the thread that
 * learns the answer (nats.c's delivery thread for the inbox futures share,
 * the bus's timer thread for a timeout, the thread closing the bus or
 * handling a lost connection for those failures), a thread hand-off sooner
 * than an ordinary callback's timeout or failure. cb must not wait for another request's answer
 * (dsec_future_wait, dsec_bus_request_sync), sleep, or take a lock held across such a wait: while
 * it runs, no other reply of this bus is delivered. It may send requests and publish. Everything
 * else is as dsec_bus_request. */
int dsec_bus_request_direct(dsec_bus *bus, const char *subject, const dsec_hdr *hdr,
                            const void *data, size_t len, int timeout_ms, dsec_reply_cb cb,
                            void *ud, dsec_err *err);

/* Future-style request: *out owns a future; free it with dsec_future_free
 * (also valid before the answer arrives: the answer is then discarded). */
int dsec_bus_request_future(dsec_bus *bus, const char *subject, const dsec_hdr *hdr,
                            const void *data, size_t len, int timeout_ms, dsec_future **out,
                            dsec_err *err);

/* Wait for the answer. On success *reply is a message owned by the future
 * (valid until dsec_future_free). On failure returns -1 with err filled. */
int dsec_future_wait(dsec_future *f, dsec_msg **reply, dsec_err *err);
void dsec_future_free(dsec_future *f);

/* Blocking convenience: request + wait. *reply is owned by the caller: free
 * with dsec_msg_free. Not for hot paths. */
int dsec_bus_request_sync(dsec_bus *bus, const char *subject, const dsec_hdr *hdr, const void *data,
                          size_t len, int timeout_ms, dsec_msg **reply, dsec_err *err);

/* ---- actors ------------------------------------------------------------ */

/* A handler runs on a worker thread. msg is borrowed: valid until return. */
typedef void (*dsec_handler)(dsec_actor *actor, dsec_msg *msg, void *ud);

/* Messages with the same key run in order, one at a time; different keys may
 * run in parallel. Default: every message of an actor has key 0 (the actor is
 * serial). The key function runs on the subscription's delivery thread before
 * the message is queued: keep it cheap and non-blocking (read a header or a
 * few payload bytes). */
typedef uint64_t (*dsec_key_fn)(const dsec_msg *msg, void *ud);

/* Create an actor named name (used in counters and logs). Owned by the bus,
 * freed by dsec_bus_free or dsec_actor_free. Its handlers run on the bus's
 * worker pool: one message at a time per ordering key, and a slow handler
 * only holds up its own key. */
int dsec_actor_new(dsec_actor **out, dsec_bus *bus, const char *name, dsec_err *err);

/* Stop the actor's subscriptions and wait for its running handlers; freed.
 * Messages still queued are dropped; queued requests get a "closed" error
 * reply. Not from one of the actor's own handlers. */
void dsec_actor_free(dsec_actor *actor);

/* Stop taking messages without losing what the server already sent: the
 * actor's subscriptions are drained (nats.c's queues reach the mailbox), then
 * the mailbox and running handlers finish. The bus stays open. timeout_ms <= 0
 * means 5000; out of time: -1/DSEC_E_TIMEOUT, what is still queued is dropped
 * by dsec_actor_free. Then free the actor. Not from one of its own handlers. */
int dsec_actor_drain(dsec_actor *actor, int timeout_ms, dsec_err *err);

/* Route ordering keys. Must be called before the first dsec_actor_on. */
void dsec_actor_set_key(dsec_actor *actor, dsec_key_fn fn, void *ud);

/* Subscribe the actor to subject (wildcards allowed). queue may be NULL, or
 * a queue group name so replicas share the subject. nats.c delivers each
 * subscription on its own thread, which only pushes into the mailbox. */
int dsec_actor_on(dsec_actor *actor, const char *subject, const char *queue, dsec_handler h,
                  void *ud, dsec_err *err);

/* Shedding by time in the mailbox (sojourn, as CoDel measures it, not queue
 * length). A message of a subscription opened with dsec_actor_on_shed that
 * waited in the mailbox longer than the actor's bound (dsec_actor_set_shed)
 * when a worker reaches it, while a queue stands (the mailbox not empty for
 * 4 bounds, at least 100 ms), goes to shed instead of h: shed answers it at
 * once (a scheduler answers a create `overloaded`), which is far cheaper than
 * its work, so a backlog drains and the messages behind it wait less. The
 * time counts from nats.c's delivery into the mailbox; waited_ns is that
 * time. msg is borrowed as for a handler; shed must not defer it. Both run in
 * the same per-key order. */
typedef void (*dsec_shed_handler)(dsec_actor *actor, dsec_msg *msg, uint64_t waited_ns, void *ud);
int dsec_actor_on_shed(dsec_actor *actor, const char *subject, const char *queue, dsec_handler h,
                       dsec_shed_handler shed, void *ud, dsec_err *err);

/* The actor's bound on a message's wait in the mailbox before it is shed
 * (subscriptions with a shed handler only); 0 (the default) never sheds.
 * Any thread, any time. */
void dsec_actor_set_shed(dsec_actor *actor, uint32_t ms);

/* Inside a handler: how long since the message it was handed entered its actor's mailbox
 * (nats.c's delivery), ns: its wait there, and the handler's time so far. 0 elsewhere. */
uint64_t dsec_actor_msg_waited_ns(void);

/* Deferred handling: a handler whose work completes later (a command that runs for
 * minutes, an operation queued for a thread of its own) keeps its message and returns, so
 * the worker goes on with other keys. Until dsec_deferred_done, no other message of the
 * same key runs: per-key order holds across the wait.
 *
 * dsec_actor_defer is called from inside a handler, on the msg it was handed, at most once
 * per call. It returns NULL when called elsewhere or out of memory: the handler then
 * finishes the work itself. The deferred message (dsec_deferred_msg) may be answered with
 * dsec_msg_respond from any thread. dsec_deferred_done frees it and releases the key; it
 * is called exactly once, from any thread but the handler's own call. dsec_actor_free
 * waits for every deferred message of the actor to be done. */
typedef struct dsec_deferred dsec_deferred;
dsec_deferred *dsec_actor_defer(dsec_actor *actor, dsec_msg *msg);
dsec_msg *dsec_deferred_msg(dsec_deferred *d);
void dsec_deferred_done(dsec_deferred *d);
struct dsec_trace_scope;
/* Enter the deferred message's trace scope on the thread that finishes its work (leave it
 * with dsec_trace_leave before dsec_deferred_done): what it sends carries the request's
 * trace id, and its hop, from the handler's start to the leave, is recorded then. */
void dsec_deferred_trace(dsec_deferred *d, struct dsec_trace_scope *sc);

const char *dsec_actor_name(const dsec_actor *actor);
dsec_bus *dsec_actor_bus(dsec_actor *actor);

typedef struct dsec_actor_stats {
    uint64_t msgs_in;       /* messages handed to handlers */
    uint64_t msgs_out;      /* publishes and replies through dsec_msg_respond by this actor */
    uint64_t errors;        /* handler-reported errors (dsec_actor_count_error) */
    uint64_t dropped;       /* messages dropped because the mailbox was full */
    uint64_t mailbox_depth; /* messages waiting now */
    uint64_t mailbox_peak;
    uint64_t handler_ns; /* total time spent in handlers (added per batch of messages) */
    uint64_t shed;       /* messages given to a shed handler for their wait (dsec_actor_on_shed) */
} dsec_actor_stats;

void dsec_actor_stats_get(const dsec_actor *actor, dsec_actor_stats *out);
void dsec_actor_count_error(dsec_actor *actor);

/* Publish on behalf of an actor (counted in its msgs_out). */
int dsec_actor_publish(dsec_actor *actor, const char *subject, const char *reply,
                       const dsec_hdr *hdr, const void *data, size_t len, dsec_err *err);

/* ---- messages ---------------------------------------------------------- */

const char *dsec_msg_subject(const dsec_msg *m);
const char *dsec_msg_reply(const dsec_msg *m); /* NULL if none */
const void *dsec_msg_data(const dsec_msg *m);
size_t dsec_msg_len(const dsec_msg *m);
/* Header value or NULL. The string is owned by the message. */
const char *dsec_msg_header(dsec_msg *m, const char *key);
/* Convenience: the Dsec-Type header, or NULL. */
const char *dsec_msg_type(dsec_msg *m);

/* Reply to m's reply subject (no-op success when there is none). When actor
 * is non-NULL the reply counts in its msgs_out. Unless hdr sets them, the
 * reply carries the request's Dsec-Trace-Id and Dsec-Req-Id. */
int dsec_msg_respond(dsec_actor *actor, dsec_msg *m, const dsec_hdr *hdr, const void *data,
                     size_t len, dsec_err *err);

/* Free a message the caller owns (from dsec_bus_request_sync). NULL ok. */
void dsec_msg_free(dsec_msg *m);

/* ---- embedded nats-server ---------------------------------------------- */

typedef struct dsec_natsd dsec_natsd;

/* The max_payload of the nats-server dsec starts: NATS counts a message's
 * headers and payload together against it, so it is dsec's own payload
 * limit (8 MiB, codecs/msg.h) plus DSEC_HEADERS_MAX for the headers. A
 * payload over 8 MiB with headers inside the budget therefore reaches its
 * receiver, which answers too_large itself (docs/protocol.md, Transport). */
#define DSEC_HEADERS_MAX (64u << 10)
#define DSEC_NATSD_MAX_PAYLOAD ((8u << 20) + DSEC_HEADERS_MAX)

typedef struct dsec_natsd_opts {
    const char
        *binary; /* default: $DSEC_NATS_SERVER, else nats-server on PATH, /usr/sbin, /usr/bin */
    const char *state_dir;  /* required: config, log and JetStream store live here */
    int port;               /* 0 = pick a free loopback port */
    bool jetstream;         /* enable JetStream with its store in state_dir/js */
    const char *extra_conf; /* appended verbatim to the generated config; may be NULL */
    int start_timeout_ms;   /* default 5000 */
} dsec_natsd_opts;

/* Start a nats-server child on 127.0.0.1 and wait until it accepts
 * connections. *out owns it; dsec_natsd_stop stops and frees it. Writes
 * state_dir/nats.conf (max_payload DSEC_NATSD_MAX_PAYLOAD, JetStream in state_dir/js when asked)
 * and logs to state_dir/nats.log; a failure to start quotes the log's tail.
 * The child runs in its own process group and is killed if the thread that
 * started it exits (PR_SET_PDEATHSIG): start it from a long-lived thread. */
int dsec_natsd_start(dsec_natsd **out, const dsec_natsd_opts *opts, dsec_err *err);

/* "nats://127.0.0.1:PORT"; owned by the server object. */
const char *dsec_natsd_url(const dsec_natsd *s);
int dsec_natsd_port(const dsec_natsd *s);
int dsec_natsd_pid(const dsec_natsd *s);

/* Kill -9 the child (for failure tests); it can be started again with
 * dsec_natsd_restart on the same port and store. */
int dsec_natsd_kill(dsec_natsd *s, dsec_err *err);
int dsec_natsd_restart(dsec_natsd *s, dsec_err *err);

/* SIGTERM, wait (then SIGKILL after a bound), free. NULL is a no-op. */
void dsec_natsd_stop(dsec_natsd *s);

/* A fresh random id (hex, 32 chars + NUL) for request and trace ids. */
void dsec_bus_new_id(char out[33]);

/* ---- tracing ------------------------------------------------------------ */

/* A Dsec-Trace-Id follows one request across actors. Each thread has a
 * current trace id: while a handler runs, the Dsec-Trace-Id of its message;
 * while a request's callback runs, the trace id that request was sent with;
 * inside dsec_trace_enter/leave, the one given there. A publish, request or
 * reply whose dsec_hdr leaves trace_id NULL carries the current one (a fresh
 * id when there is none), so what a handler sends on behalf of a request
 * carries that request's id without plumbing. Work that continues on another
 * thread (a worker, a ticker, a batch sent later) keeps the id itself and
 * enters a scope there, or sets dsec_hdr.trace_id. */

/* Longest trace id followed; a longer one (or one with CR/LF) is not
 * inherited: what it causes gets fresh ids. */
#define DSEC_TRACE_ID_MAX 64

/* Whether id is a trace id the bus follows: 1..DSEC_TRACE_ID_MAX printable
 * ASCII characters without spaces. */
bool dsec_trace_id_ok(const char *id);

/* One step of a request: what an actor handled for it, when, and how it
 * went. Times are wall clock (ns since the epoch) so that hops recorded by
 * different processes can be put in order. */
typedef struct dsec_trace_hop {
    char trace_id[DSEC_TRACE_ID_MAX + 1];
    char actor[64];    /* the actor's name */
    char subject[128]; /* the subject it handled (or a label of async work) */
    char type[32];     /* Dsec-Type of what it handled; "" if none */
    char sent[32];     /* Dsec-Type of the first message it sent meanwhile; "" if none */
    bool error;        /* it answered or sent an error, or counted one */
    char kept[8];      /* why the record kept it: "error", "slow" or "sample" */
    int64_t start_ns;  /* handler started (wall clock) */
    int64_t end_ns;    /* handler returned */
} dsec_trace_hop;

/* The innermost scope of this thread, with the strings it was given. Lives
 * on the caller's stack; fields are the bus's. */
typedef struct dsec_trace_scope {
    struct dsec_trace_scope *up;
    dsec_actor *actor; /* NULL: no hop is recorded */
    const char *id;    /* NULL: none (publishes get fresh ids) */
    const char *what;
    const char *type;
    int64_t start_ns;
    bool error;
    char sent[32];
} dsec_trace_scope;

/* Make trace_id this thread's current trace id until dsec_trace_leave
 * (scopes nest; leave them in reverse order). trace_id NULL, or not
 * dsec_trace_id_ok: none. With actor non-NULL, leaving records a hop for
 * it (actor's name, what, type) in its bus's trace record, if that was
 * configured. trace_id, what and type are borrowed: they must stay valid
 * until leave. */
void dsec_trace_enter(dsec_trace_scope *sc, dsec_actor *actor, const char *trace_id,
                      const char *what, const char *type);
void dsec_trace_leave(dsec_trace_scope *sc);
/* A scope that outlives the strings it was given (a deferred message whose work ends on another
 * thread, which frees the message, while this scope is still open): they are copied into own
 * (as long as a hop keeps them), which must live until leave. */
typedef struct dsec_trace_own {
    char id[DSEC_TRACE_ID_MAX + 1];
    char what[128];
    char type[32];
} dsec_trace_own;
void dsec_trace_scope_own(dsec_trace_scope *sc, dsec_trace_own *own);

/* This thread's current trace id, or NULL. Valid until its scope ends:
 * copy it to carry it elsewhere. */
const char *dsec_trace_current(void);

/* The trace id of this thread outside any scope (an application thread
 * that calls libdsec), copied; NULL clears it. -1 when trace_id is not
 * dsec_trace_id_ok. Scopes (handlers, callbacks) take precedence. */
int dsec_trace_set_thread(const char *trace_id);

/* Each bus keeps the hops its actors handled in a bounded ring (oldest
 * overwritten). A hop is kept when it was an error, when it took slow_ms
 * or more, or when its trace id is sampled: a hash of the id below
 * sample_rate, the same choice in every process, so a sampled request is
 * kept by every actor it reached. Off until configured. */
typedef struct dsec_trace_conf {
    double sample_rate; /* 0..1: the share of trace ids kept whatever they did */
    uint32_t slow_ms;   /* hops this long or longer are kept; 0: every hop is slow */
    uint32_t ring;      /* hops kept per bus; 0: recording off */
} dsec_trace_conf;

/* Set (or change: the ring starts empty) the bus's trace record. */
int dsec_bus_trace_conf(dsec_bus *bus, const dsec_trace_conf *conf, dsec_err *err);

/* The kept hops of trace_id, oldest first. *out (NULL when n is 0) is the
 * caller's: free it with dsec_free. An unconfigured bus has none. */
int dsec_bus_trace_hops(dsec_bus *bus, const char *trace_id, dsec_trace_hop **out, size_t *n,
                        dsec_err *err);

#ifdef __cplusplus
}
#endif
#endif
