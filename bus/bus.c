/* bus.c - the bus's NATS connection: options, connection events, flush,
 * drain and teardown, and the translation of natsStatus into dsec codes. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bus/internal.h"
#include "dsec/alloc.h"

#define DEFAULT_URL "nats://127.0.0.1:4222"
#define DEFAULT_THREADS 2
#define DEFAULT_MAILBOX_MAX 65536
#define DEFAULT_CONNECT_TIMEOUT_MS 2000
#define DEFAULT_RECONNECT_BUF (8 * 1024 * 1024)
#define DEFAULT_DRAIN_TIMEOUT_MS 5000
#define MAX_URLS 16
/* A restarted server is usually back within a second; nats.c's default of
 * 2 s between attempts would leave requests waiting for nothing. */
#define RECONNECT_WAIT_MS 250
#define RECONNECT_JITTER_MS 100
#define PING_INTERVAL_MS 20000

/* ---- small shared helpers ---------------------------------------------- */

int64_t dsec__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void dsec__abstime(struct timespec *ts, int64_t deadline_ns)
{
    ts->tv_sec = deadline_ns / 1000000000;
    ts->tv_nsec = deadline_ns % 1000000000;
}

int dsec__cond_init(pthread_cond_t *c)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int e = pthread_cond_init(c, &ca);
    pthread_condattr_destroy(&ca);
    return e;
}

static int code_of(natsStatus s)
{
    switch (s) {
    case NATS_TIMEOUT:
        return DSEC_E_TIMEOUT;
    case NATS_NO_RESPONDERS:
        return DSEC_E_NO_RESPONDERS;
    case NATS_CONNECTION_CLOSED:
    case NATS_DRAINING:
        return DSEC_E_CLOSED;
    case NATS_INSUFFICIENT_BUFFER:
    case NATS_SLOW_CONSUMER:
        return DSEC_E_OVERFLOW;
    case NATS_MAX_PAYLOAD:
        return DSEC_E_TOO_LARGE;
    case NATS_NO_MEMORY:
        return DSEC_E_NOMEM;
    case NATS_INVALID_ARG:
    case NATS_INVALID_SUBJECT:
    case NATS_INVALID_QUEUE_NAME:
    case NATS_INVALID_TIMEOUT:
    case NATS_INVALID_SUBSCRIPTION:
    case NATS_ADDRESS_MISSING:
        return DSEC_E_INVALID;
    case NATS_NOT_PERMITTED:
    case NATS_CONNECTION_AUTH_FAILED:
        return DSEC_E_PERMISSION;
    case NATS_SYS_ERROR:
        return DSEC_E_IO;
    case NATS_SECURE_CONNECTION_WANTED:
    case NATS_SECURE_CONNECTION_REQUIRED:
        return DSEC_E_CONFIG;
    default:
        /* Everything else is the connection failing one way or another. */
        return DSEC_E_CONN;
    }
}

int dsec__nats_err(dsec_err *err, natsStatus s, const char *fmt, ...)
{
    if (err == NULL)
        return -1;
    char ctx[DSEC_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    /* nats.c's thread-local last error often says more than the status
     * text (which server, which limit). */
    natsStatus last = NATS_OK;
    const char *detail = nats_GetLastError(&last);
    if (detail != NULL && last == s && detail[0] != '\0')
        return dsec_err_set(err, code_of(s), 0, "%s: %s", ctx, detail);
    return dsec_err_set(err, code_of(s), 0, "%s: %s", ctx, natsStatus_GetText(s));
}

void dsec__bus_event(dsec_bus *bus, dsec_bus_event ev, const char *fmt, ...)
{
    if (bus->on_event == NULL)
        return;
    char detail[DSEC_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    bus->on_event(bus, ev, detail, bus->event_ud);
}

/* ---- nats.c callbacks (its own threads) ---------------------------------- */

/* nats.c runs a connection's handlers on one thread of its own, from a
 * queue, and a few of its paths queue one after the closed callback: a
 * drain whose flush fails because the connection closed under it posts
 * "Drain error" then. The closed callback is therefore not the last word,
 * and nats.c is not given the bus's address, which dsec_bus_free gives
 * back. It gets a number unique for the life of the process, and each
 * handler looks its bus up here; a bus being freed is taken off the list
 * once no handler runs on it, and later handlers find nothing and return.
 * Handlers run for connection events and errors only, so a list does. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t live_cond = PTHREAD_COND_INITIALIZER;
static dsec_bus *live_buses;
static uintptr_t live_last_id;

static void live_add(dsec_bus *bus)
{
    pthread_mutex_lock(&live_mu);
    bus->live_id = ++live_last_id;
    bus->live_next = live_buses;
    live_buses = bus;
    pthread_mutex_unlock(&live_mu);
}

/* The bus a handler's closure names, held until live_leave; NULL once it is
 * being freed. */
static dsec_bus *live_enter(void *closure)
{
    uintptr_t id = (uintptr_t)closure;
    pthread_mutex_lock(&live_mu);
    dsec_bus *bus = live_buses;
    while (bus != NULL && bus->live_id != id)
        bus = bus->live_next;
    if (bus != NULL)
        bus->live_calls++;
    pthread_mutex_unlock(&live_mu);
    return bus;
}

static void live_leave(dsec_bus *bus)
{
    pthread_mutex_lock(&live_mu);
    if (--bus->live_calls == 0)
        pthread_cond_broadcast(&live_cond);
    pthread_mutex_unlock(&live_mu);
}

/* Off the list, after the handlers running on it return. Idempotent. */
static void live_remove(dsec_bus *bus)
{
    pthread_mutex_lock(&live_mu);
    for (dsec_bus **pp = &live_buses; *pp != NULL; pp = &(*pp)->live_next)
        if (*pp == bus) {
            *pp = bus->live_next;
            break;
        }
    while (bus->live_calls > 0)
        pthread_cond_wait(&live_cond, &live_mu);
    pthread_mutex_unlock(&live_mu);
}

static void *live_closure(const dsec_bus *bus)
{
    return (void *)bus->live_id;
}

static const char *conn_last_error(natsConnection *nc)
{
    const char *txt = NULL;
    natsStatus s = natsConnection_GetLastError(nc, &txt);
    if (txt != NULL && txt[0] != '\0')
        return txt;
    return s != NATS_OK ? natsStatus_GetText(s) : "connection lost";
}

static void on_disconnected(natsConnection *nc, void *closure)
{
    dsec_bus *bus = live_enter(closure);
    if (bus == NULL)
        return;
    atomic_fetch_add_explicit(&bus->disconnects, 1, memory_order_relaxed);
    /* Fail what was in flight first, so the event handler sees a bus whose
     * pending requests already got their answer. */
    dsec__req_disconnected(bus);
    dsec__bus_event(bus, DSEC_BUS_DISCONNECTED, "%s disconnected: %s",
                    bus->name != NULL ? bus->name : "bus", conn_last_error(nc));
    live_leave(bus);
}

static void mask_url(const char *url, char *out, size_t n);

static void on_reconnected(natsConnection *nc, void *closure)
{
    dsec_bus *bus = live_enter(closure);
    if (bus == NULL)
        return;
    atomic_fetch_add_explicit(&bus->reconnects, 1, memory_order_relaxed);
    char url[256] = "", shown[256];
    natsConnection_GetConnectedUrl(nc, url, sizeof url);
    mask_url(url, shown, sizeof shown);
    dsec__bus_event(bus, DSEC_BUS_RECONNECTED, "%s reconnected to %s",
                    bus->name != NULL ? bus->name : "bus", shown);
    live_leave(bus);
}

static void on_connected(natsConnection *nc, void *closure)
{
    /* Only with retry_on_failed_connect: the first connect succeeded late.
     * For the user it is the connection coming back. */
    on_reconnected(nc, closure);
}

static void on_closed(natsConnection *nc, void *closure)
{
    dsec_bus *bus = live_enter(closure);
    if (bus == NULL)
        return;
    /* Closed for good (drained, or out of reconnect attempts): nothing
     * pending can be answered any more. */
    dsec__req_close(bus);
    dsec__bus_event(bus, DSEC_BUS_CLOSED, "%s closed", bus->name != NULL ? bus->name : "bus");
    /* Once closed_seen is set, teardown goes on; it frees the bus after
     * live_leave. */
    pthread_mutex_lock(&bus->mu);
    bus->closed_seen = true;
    pthread_cond_broadcast(&bus->cond);
    pthread_mutex_unlock(&bus->mu);
    live_leave(bus);
}

/* The server's permissions violation: 'Permissions Violation for Publish to
 * "SUBJ"' (or "Subscription to"). A refused publish is never delivered, so
 * the requests waiting on SUBJ fail now with DSEC_E_PERMISSION instead of at
 * their deadlines. */
static void refused(dsec_bus *bus, natsConnection *nc)
{
    natsStatus last = NATS_OK;
    const char *text = nats_GetLastError(&last);
    if (last != NATS_NOT_PERMITTED || text == NULL || text[0] == '\0')
        natsConnection_GetLastError(nc, &text);
    if (text == NULL)
        text = "";
    static const char pub[] = "Publish to ";
    const char *at = strstr(text, pub);
    size_t failed = 0;
    if (at != NULL) {
        char subj[512];
        const char *p = at + sizeof pub - 1;
        if (*p == '"')
            p++;
        size_t n = strcspn(p, "\"'");
        if (n > 0 && n < sizeof subj) {
            memcpy(subj, p, n);
            subj[n] = '\0';
            failed = dsec__req_fail_subject(bus, subj, DSEC_E_PERMISSION);
        }
    }
    dsec__bus_event(bus, DSEC_BUS_ERROR, "the server refused: %.160s%s",
                    text[0] ? text : "permissions violation",
                    failed ? " (its pending requests failed with permission)" : "");
}

static void async_error(dsec_bus *bus, natsConnection *nc, natsSubscription *sub, natsStatus s);

static void on_async_error(natsConnection *nc, natsSubscription *sub, natsStatus s, void *closure)
{
    dsec_bus *bus = live_enter(closure);
    if (bus == NULL)
        return;
    async_error(bus, nc, sub, s);
    live_leave(bus);
}

static void async_error(dsec_bus *bus, natsConnection *nc, natsSubscription *sub, natsStatus s)
{
    atomic_fetch_add_explicit(&bus->async_errors, 1, memory_order_relaxed);
    const char *subj = NULL;
    if (sub != NULL)
        subj = natsSubscription_GetSubject(sub);
    if (s == NATS_SLOW_CONSUMER) {
        atomic_fetch_add_explicit(&bus->slow_consumers, 1, memory_order_relaxed);
        dsec__bus_event(bus, DSEC_BUS_ERROR,
                        "slow consumer on %s: the client dropped messages because its queue for "
                        "the subscription was full",
                        subj != NULL ? subj : "?");
        return;
    }
    if (s == NATS_NOT_PERMITTED) {
        refused(bus, nc);
        return;
    }
    dsec__bus_event(bus, DSEC_BUS_ERROR, "asynchronous error%s%s: %s", subj ? " on " : "",
                    subj ? subj : "", natsStatus_GetText(s));
}

/* ---- connect ----------------------------------------------------------- */

/* nats.c wants a list; users give "url1,url2". */
static int set_servers(natsOptions *o, const char *urls, const char *shown, dsec_err *err)
{
    char *copy DSEC_AUTOFREE = dsec_strdup(urls);
    if (copy == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "bus URL list");
    const char *list[MAX_URLS];
    int n = 0;
    char *save = NULL;
    for (char *u = strtok_r(copy, ", ", &save); u != NULL; u = strtok_r(NULL, ", ", &save)) {
        if (n == MAX_URLS)
            return dsec_err_set(err, DSEC_E_CONFIG, 0, "bus URL list: more than %d URLs in %s",
                                MAX_URLS, shown);
        list[n++] = u;
    }
    if (n == 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "bus URL list is empty");
    natsStatus s = natsOptions_SetServers(o, list, n);
    if (s != NATS_OK)
        return dsec__nats_err(err, s, "bus URL list %s", shown);
    return 0;
}

static int build_options(natsOptions **out, dsec_bus *bus, const dsec_bus_opts *o, const char *url,
                         dsec_err *err)
{
    natsOptions *no = NULL;
    natsStatus s = natsOptions_Create(&no);
    if (s != NATS_OK)
        return dsec__nats_err(err, s, "bus options");
    if (set_servers(no, url, bus->url_shown, err) < 0)
        goto out_fail;
    int connect_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : DEFAULT_CONNECT_TIMEOUT_MS;
    int max_reconnect = o->max_reconnect;
    if (max_reconnect == 0)
        max_reconnect = -1; /* an all-zero opts struct means the defaults */
    s = natsOptions_SetNoRandomize(no, true);
    if (s == NATS_OK && bus->name != NULL)
        s = natsOptions_SetName(no, bus->name);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(no, connect_ms);
    if (s == NATS_OK)
        s = natsOptions_SetAllowReconnect(no, true);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(no, max_reconnect < 0 ? -1 : max_reconnect);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(no, RECONNECT_WAIT_MS);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectJitter(no, RECONNECT_JITTER_MS, RECONNECT_JITTER_MS);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectBufSize(no, o->reconnect_buf_bytes > 0 ? o->reconnect_buf_bytes
                                                                           : DEFAULT_RECONNECT_BUF);
    if (s == NATS_OK)
        s = natsOptions_SetPingInterval(no, PING_INTERVAL_MS);
    if (s == NATS_OK && o->low_latency)
        s = natsOptions_SetSendAsap(no, true);
    if (s == NATS_OK && o->shared_delivery) {
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        s = nats_SetMessageDeliveryPoolSize(ncpu < 1 ? 1 : ncpu > 4 ? 4 : (int)ncpu);
        if (s == NATS_OK)
            s = natsOptions_UseGlobalMessageDelivery(no, true);
    }
    /* Always set: without it nats.c reports slow consumers to nobody. */
    if (s == NATS_OK)
        s = natsOptions_SetErrorHandler(no, on_async_error, live_closure(bus));
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(no, on_disconnected, live_closure(bus));
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(no, on_reconnected, live_closure(bus));
    if (s == NATS_OK)
        s = natsOptions_SetClosedCB(no, on_closed, live_closure(bus));
    if (s == NATS_OK && o->retry_on_failed_connect)
        s = natsOptions_SetRetryOnFailedConnect(no, true, on_connected, live_closure(bus));
    if (s != NATS_OK) {
        dsec__nats_err(err, s, "bus options");
        goto out_fail;
    }
    const char *ca = o->tls_ca != NULL ? o->tls_ca : getenv("DSEC_TLS_CA");
    if (ca != NULL && ca[0] != '\0') {
        s = natsOptions_SetSecure(no, true);
        if (s == NATS_OK)
            s = natsOptions_LoadCATrustedCertificates(no, ca);
        if (s != NATS_OK) {
            dsec__nats_err(err, s, "bus TLS: loading the CA file %s", ca);
            goto out_fail;
        }
    }
    *out = no;
    return 0;
out_fail:
    natsOptions_Destroy(no);
    return -1;
}

/* url with every "user:password@" shown as "user:***@": errors and logs
 * must not carry credentials. */
static void mask_url(const char *url, char *out, size_t n)
{
    size_t k = 0;
    for (const char *p = url; *p && k + 1 < n;) {
        const char *at = strchr(p, '@'), *comma = strchr(p, ',');
        const char *scheme = strstr(p, "://");
        const char *colon = scheme ? strchr(scheme + 3, ':') : NULL;
        if (at && (!comma || at < comma) && scheme && colon && colon < at) {
            int w = snprintf(out + k, n - k, "%.*s:***", (int)(colon - p), p);
            k += w > 0 ? (size_t)w : 0;
            p = at;
        }
        const char *end = comma ? comma + 1 : p + strlen(p);
        int w = snprintf(out + k, n - k, "%.*s", (int)(end - p), p);
        k += w > 0 ? (size_t)w : 0;
        p = end;
    }
    if (k >= n)
        k = n - 1;
    out[k] = '\0';
}

/* "_INBOX" or a few NATS subject tokens of [A-Za-z0-9_-]. */
static bool inbox_prefix_ok(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || n > 64 || p[0] == '.' || p[n - 1] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-' || (c == '.' && p[i + 1] != '.');
        if (!ok)
            return false;
    }
    return true;
}

const char *dsec_bus_inbox_prefix(const dsec_bus *bus)
{
    return bus->inbox_prefix;
}

const char *dsec_bus_url_shown(const dsec_bus *bus)
{
    return bus->url_shown;
}

static void bus_release(dsec_bus *bus)
{
    live_remove(bus);
    dsec__pool_stop(&bus->pool);
    dsec__req_free(bus);
    dsec__trace_free(bus);
    pthread_cond_destroy(&bus->cond);
    pthread_mutex_destroy(&bus->mu);
    dsec_free(bus->name);
    dsec_free(bus);
}

int dsec_bus_connect(dsec_bus **out, const dsec_bus_opts *opts, dsec_err *err)
{
    *out = NULL;
    dsec_bus_opts o = opts != NULL ? *opts : (dsec_bus_opts){0};
    const char *url = o.url;
    if (url == NULL || url[0] == '\0')
        url = getenv("DSEC_URL");
    if (url == NULL || url[0] == '\0')
        url = DEFAULT_URL;
    if (o.threads < 0 || o.threads > 1024 || o.mailbox_max < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "bus: bad threads (%d) or mailbox_max (%d)",
                            o.threads, o.mailbox_max);
    if (o.inbox_prefix != NULL && !inbox_prefix_ok(o.inbox_prefix))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "bus: inbox prefix \"%.64s\": 1-64 characters, subject tokens of "
                            "[A-Za-z0-9_-] joined by '.'",
                            o.inbox_prefix);

    dsec_bus *bus = dsec_calloc(1, sizeof *bus);
    if (bus == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "bus");
    pthread_mutex_init(&bus->mu, NULL);
    dsec__cond_init(&bus->cond);
    bus->on_event = o.on_event;
    bus->event_ud = o.event_ud;
    bus->threads = o.threads > 0 ? o.threads : DEFAULT_THREADS;
    bus->shared_delivery = o.shared_delivery;
    bus->mailbox_max = o.mailbox_max > 0 ? o.mailbox_max : DEFAULT_MAILBOX_MAX;
    bus->schema_max = o.schema_max;
    bus->state = DSEC__BUS_OPEN;
    snprintf(bus->inbox_prefix, sizeof bus->inbox_prefix, "%s",
             o.inbox_prefix ? o.inbox_prefix : "_INBOX");
    mask_url(url, bus->url_shown, sizeof bus->url_shown);
    if (o.name != NULL && (bus->name = dsec_strdup(o.name)) == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "bus");
        goto out_release;
    }
    if (dsec__pool_start(&bus->pool, bus->threads, err) < 0)
        goto out_release;
    live_add(bus); /* before the options give nats.c its closure */
    /* Before the connection exists: its callbacks reach the request table. */
    if (dsec__req_init(bus, err) < 0)
        goto out_release;

    natsOptions *no = NULL;
    if (build_options(&no, bus, &o, url, err) < 0)
        goto out_release;
    natsStatus s = natsConnection_Connect(&bus->nc, no);
    natsOptions_Destroy(no);
    if (s == NATS_NOT_YET_CONNECTED && o.retry_on_failed_connect)
        s = NATS_OK; /* connecting in the background; publishes are buffered */
    if (s != NATS_OK) {
        dsec__nats_err(err, s, "connecting to %s", bus->url_shown);
        goto out_release;
    }
    if (dsec__req_start(bus, err) < 0)
        goto out_close;
    *out = bus;
    return 0;

out_close:
    natsConnection_Close(bus->nc);
    pthread_mutex_lock(&bus->mu);
    while (!bus->closed_seen)
        pthread_cond_wait(&bus->cond, &bus->mu);
    pthread_mutex_unlock(&bus->mu);
    natsConnection_Destroy(bus->nc);
out_release:
    bus_release(bus);
    return -1;
}

bool dsec_bus_connected(const dsec_bus *bus)
{
    return natsConnection_Status(bus->nc) == NATS_CONN_STATUS_CONNECTED;
}

int dsec_bus_connected_url(dsec_bus *bus, char *buf, size_t n)
{
    if (buf == NULL || n == 0)
        return -1;
    buf[0] = '\0';
    if (!dsec_bus_connected(bus))
        return -1;
    if (natsConnection_GetConnectedUrl(bus->nc, buf, n) != NATS_OK || buf[0] == '\0')
        return -1;
    return 0;
}

int dsec_bus_flush(dsec_bus *bus, int timeout_ms, dsec_err *err)
{
    natsStatus s = natsConnection_FlushTimeout(bus->nc, timeout_ms > 0 ? timeout_ms : 1000);
    if (s != NATS_OK)
        return dsec__nats_err(err, s, "flushing the bus");
    return 0;
}

void dsec_bus_stats_get(dsec_bus *bus, dsec_bus_stats *out)
{
    out->async_errors = atomic_load_explicit(&bus->async_errors, memory_order_relaxed);
    out->slow_consumers = atomic_load_explicit(&bus->slow_consumers, memory_order_relaxed);
    out->disconnects = atomic_load_explicit(&bus->disconnects, memory_order_relaxed);
    out->reconnects = atomic_load_explicit(&bus->reconnects, memory_order_relaxed);
    out->mailbox_drops = atomic_load_explicit(&bus->mailbox_drops, memory_order_relaxed);
    out->requests_pending = dsec__req_pending(bus);
}

uint64_t dsec_bus_reconnects(dsec_bus *bus)
{
    return atomic_load_explicit(&bus->reconnects, memory_order_relaxed);
}

/* ---- drain and free ---------------------------------------------------- */

/* Wait for nats.c's closed callback; after it no callback of ours runs. */
static bool wait_closed(dsec_bus *bus, int64_t deadline_ns)
{
    struct timespec ts;
    dsec__abstime(&ts, deadline_ns);
    pthread_mutex_lock(&bus->mu);
    while (!bus->closed_seen) {
        if (deadline_ns == 0)
            pthread_cond_wait(&bus->cond, &bus->mu);
        else if (pthread_cond_timedwait(&bus->cond, &bus->mu, &ts) == ETIMEDOUT)
            break;
    }
    bool ok = bus->closed_seen;
    pthread_mutex_unlock(&bus->mu);
    return ok;
}

int dsec_bus_drain(dsec_bus *bus, int timeout_ms, dsec_err *err)
{
    pthread_mutex_lock(&bus->mu);
    if (bus->state != DSEC__BUS_OPEN) {
        pthread_mutex_unlock(&bus->mu);
        return 0;
    }
    bus->state = DSEC__BUS_DRAINING; /* no new actors from here on */
    pthread_mutex_unlock(&bus->mu);

    if (timeout_ms <= 0)
        timeout_ms = DEFAULT_DRAIN_TIMEOUT_MS;
    int64_t deadline = dsec__now_ns() + (int64_t)timeout_ms * 1000000;
    const char *stuck = NULL;
    int code = DSEC_E_TIMEOUT;
    uint64_t left_behind = 0;

    size_t n = 0;
    dsec_actor **actors = dsec__actors_snapshot(bus, &n);
    if (actors == NULL) {
        /* Still close the connection; dsec_bus_free cleans up the actors. */
        stuck = "memory for the actor list";
        code = DSEC_E_NOMEM;
        n = 0;
    }
    /* 1. The server stops sending; what nats.c holds still reaches the
     *    mailboxes. 2. Mailboxes and running handlers finish. */
    for (size_t i = 0; i < n; i++)
        dsec__actor_stop_subs(actors[i], true, deadline);
    for (size_t i = 0; i < n; i++)
        if (!dsec__actor_wait_subs(actors[i], deadline) && stuck == NULL)
            stuck = "subscriptions to drain";
    for (size_t i = 0; i < n; i++)
        if (!dsec__actor_wait_idle(actors[i], deadline) && stuck == NULL)
            stuck = "handlers to finish";
    if (stuck != NULL) {
        /* Out of time: drop what is queued (requests among it get a
         * "closed" reply while the connection is still up). Handlers that
         * still run are waited for by dsec_bus_free. */
        for (size_t i = 0; i < n; i++) {
            left_behind += dsec__actor_depth(actors[i]);
            dsec__actor_close(actors[i], false);
        }
    }
    for (size_t i = 0; i < n; i++)
        dsec__actor_put(actors[i]);
    dsec_free(actors);

    /* 3. Requests still waiting will not be answered on this bus. */
    dsec__req_close(bus);
    if (!dsec__req_wait_idle(bus, deadline) && stuck == NULL)
        stuck = "reply callbacks to finish";

    /* 4. Flush what handlers published and close. nats.c drains what is
     *    left (the inbox) and flushes before closing. */
    int64_t left_ms = (deadline - dsec__now_ns()) / 1000000;
    if (left_ms < 100)
        left_ms = 100; /* even a late drain gets a moment to flush */
    natsStatus s = natsConnection_DrainTimeout(bus->nc, left_ms);
    /* nats.c closes by itself at its own timeout; allow it a second more. */
    if (s != NATS_OK || !wait_closed(bus, dsec__now_ns() + (left_ms + 1000) * 1000000)) {
        /* Disconnected or already closing: close outright. */
        natsConnection_Close(bus->nc);
        wait_closed(bus, 0);
    }

    pthread_mutex_lock(&bus->mu);
    bus->state = DSEC__BUS_DRAINED;
    pthread_mutex_unlock(&bus->mu);
    if (stuck != NULL)
        return dsec_err_set(err, code, 0,
                            "drain did not finish within %d ms: waited for %s; %llu queued "
                            "messages were dropped",
                            timeout_ms, stuck, (unsigned long long)left_behind);
    return 0;
}

void dsec_bus_free(dsec_bus *bus)
{
    if (bus == NULL)
        return;
    dsec_bus_drain(bus, DEFAULT_DRAIN_TIMEOUT_MS, NULL);
    /* The connection is closed and its closed callback has run. Handlers
     * nats.c still has queued find no bus from here on (see live_enter);
     * the subscriptions' completions are waited for below. */
    live_remove(bus);
    dsec_actor *a;
    while ((a = dsec__actors_pop(bus)) != NULL) {
        dsec__actor_stop_subs(a, false, 0);
        dsec__actor_wait_subs(a, 0);
        dsec__actor_close(a, true);
        dsec__actor_put(a);
    }
    /* Workers finish queued reply callbacks before they exit. */
    dsec__pool_stop(&bus->pool);
    natsConnection_Destroy(bus->nc);
    bus->nc = NULL;
    bus_release(bus);
}
