/* client.c - libdsec: sandbox requests over the bus, with safe retries. */
#include "dsec/client.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "bus/bus.h"
#include "dsec/layers.h"
#include "dsec/names.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "client/internal.h"

struct dsec_client {
    dsec_bus *bus;
    char *tenant;
    int timeout_ms;
    int retries;
    bool direct_callbacks; /* dsec_client_opts.direct_callbacks */
    dsec_actor *lost;     /* dsec_watch_lost's subscription */
    /* creates whose connection dropped mid-request wait here until that attempt's
     * deadline before their retry (see defer_retry) */
    pthread_mutex_t rmu;
    pthread_cond_t rcv;
    struct async_create *rhead, *rtail;
    pthread_t retrier;
    bool retrier_started, retrier_stop;
    dsec_node_lost_cb lost_cb;
    void *lost_ud;
};

dsec_bus *dsec__client_bus(dsec_client *c) { return c->bus; }
int dsec__client_timeout_ms(const dsec_client *c) { return c->timeout_ms; }

#define MAX_LIST 256

/* ---- helpers ------------------------------------------------------------ */

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

static uint32_t count_nt(const char *const *v)
{
    uint32_t n = 0;
    while (v != NULL && v[n] != NULL)
        n++;
    return n;
}

/* Split "k=v" strings into a dsec_kv whose arrays and strings are owned by
 * the caller (dsec_free of k[0..n) strings is by kv_release). */
static int kv_from_pairs(const char *const *pairs, dsec_kv *kv, const char *what, dsec_err *err)
{
    uint32_t n = count_nt(pairs);
    memset(kv, 0, sizeof *kv);
    if (n == 0)
        return 0;
    if (n > MAX_LIST)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: %u entries, at most %d", what, n, MAX_LIST);
    kv->k = dsec_calloc(n, sizeof *kv->k);
    kv->v = dsec_calloc(n, sizeof *kv->v);
    if (kv->k == NULL || kv->v == NULL)
        goto out_nomem;
    for (uint32_t i = 0; i < n; i++) {
        const char *eq = strchr(pairs[i], '=');
        if (eq == NULL || eq == pairs[i]) {
            dsec_err_set(err, DSEC_E_INVALID, 0, "%s: \"%s\" is not KEY=VALUE", what, pairs[i]);
            goto out_fail;
        }
        kv->k[i] = dsec_strndup(pairs[i], (size_t)(eq - pairs[i]));
        kv->v[i] = eq + 1;
        kv->n = i + 1;
        if (kv->k[i] == NULL)
            goto out_nomem;
    }
    return 0;
out_nomem:
    dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
out_fail:
    for (uint32_t i = 0; i < kv->n; i++)
        dsec_free((char *)kv->k[i]);
    dsec_free(kv->k);
    dsec_free(kv->v);
    memset(kv, 0, sizeof *kv);
    return -1;
}

static void kv_release(dsec_kv *kv)
{
    for (uint32_t i = 0; i < kv->n; i++)
        dsec_free((char *)kv->k[i]);
    dsec_free(kv->k);
    dsec_free(kv->v);
    memset(kv, 0, sizeof *kv);
}

static void copy_str(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src ? src : "");
}

/* Turn a reply into either the expected message (decoded into out) or the
 * error it carries. */
int dsec__client_decode_reply(dsec_decoder *dec, dsec_msg *reply, int type, void *out,
                              dsec_err *err)
{
    const char *t = dsec_msg_type(reply);
    if (t != NULL && strcmp(t, "error") == 0) {
        const char *code = dsec_msg_header(reply, "Dsec-Error-Code");
        if (dsec_msg_len(reply) == 0) { /* a bus-level error reply: no actor read the request */
            int k = code ? dsec_code_from_name(code) : DSEC_E_INTERNAL;
            const char *why = k == DSEC_E_OVERFLOW      ? "the responder is overloaded"
                              : k == DSEC_E_CLOSED      ? "the responder is shutting down"
                              : k == DSEC_E_UNSUPPORTED ? "the responder reads an older schema "
                                                          "version than this client sends"
                                                        : "the responder's bus refused it";
            return dsec_err_set(err, k, 0, "%s: %s (%s)", dsec_msg_subject(reply), why,
                                code ? code : "error");
        }
        dsec_msg_error e;
        if (dsec_decode(dec, DSEC_MSG_ERROR, dsec_msg_data(reply), dsec_msg_len(reply), &e, err) < 0)
            return dsec_err_wrap(err, "decoding error reply");
        dsec_err_set(err, dsec_code_from_name(e.code), 0, "%s", e.message);
        if (err != NULL) /* bounded: a hostile or confused responder cannot park the caller */
            err->retry_after_ms = e.retry_after_ms > 3600000 ? 3600000 : (unsigned)e.retry_after_ms;
        return -1;
    }
    const char *want = dsec_msg_type_name(type);
    if (t == NULL || strcmp(t, want) != 0)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "expected a \"%s\" reply, got \"%s\"", want,
                            t ? t : "(no type header)");
    if (dsec_decode(dec, type, dsec_msg_data(reply), dsec_msg_len(reply), out, err) < 0)
        return dsec_err_wrap(err, "decoding %s reply", want);
    return 0;
}

/* One request/reply round trip with retries on retry-safe transport errors.
 * On success the reply is decoded into out with dec (valid until dec's next
 * decode). */
static int call_for(dsec_client *c, const char *subject, const char *type_name,
                    const dsec_buf *req, const char *req_id, int reply_type, dsec_decoder *dec,
                    dsec_msg **keep, void *out, int timeout_ms, dsec_err *err)
{
    dsec_hdr hdr = {.type = type_name, .schema = DSEC_SCHEMA_VERSION, .req_id = req_id};
    int rc = -1;
    for (int attempt = 0;; attempt++) {
        dsec_msg *reply = NULL;
        rc = dsec_bus_request_sync(c->bus, subject, &hdr, req->data, req->len, timeout_ms, &reply,
                                   err);
        if (rc == 0) {
            rc = dsec__client_decode_reply(dec, reply, reply_type, out, err);
            *keep = reply;
            return rc;
        }
        /* Ops other than create are retried only when the request surely
         * never ran: nobody was listening. */
        if (err->code != DSEC_E_NO_RESPONDERS || attempt >= c->retries)
            return rc;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* ---- connect -------------------------------------------------------------- */

int dsec_client_connect(dsec_client **out, const dsec_client_opts *opts, dsec_err *err)
{
    dsec_client_opts o = opts ? *opts : (dsec_client_opts){0};
    *out = NULL;
    const char *tenant = o.tenant ? o.tenant : getenv("DSEC_TENANT");
    if (tenant == NULL || tenant[0] == '\0')
        tenant = "default";
    if (dsec_name_ok(tenant, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "tenant \"%s\": use 1-64 characters from A-Z a-z 0-9 _ -", tenant);
    dsec_client *c = dsec_calloc(1, sizeof *c);
    if (c != NULL) {
        pthread_mutex_init(&c->rmu, NULL);
        pthread_cond_init(&c->rcv, NULL);
    }
    if (c == NULL || (c->tenant = dsec_strdup(tenant)) == NULL) {
        dsec_client_free(c);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    c->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : 10000;
    c->retries = o.retries > 0 ? o.retries : (o.retries < 0 ? 0 : 2);
    c->direct_callbacks = o.direct_callbacks;
    /* a client waits on every answer: publish at once rather than batch */
    /* replies under _INBOX.<tenant>: a bus configured by `dsec auth` lets this
     * tenant subscribe there and nowhere else, so no tenant reads another's answers */
    char inbox[DSEC_NAME_LEN_MAX + 8];
    snprintf(inbox, sizeof inbox, "_INBOX.%s", tenant);
    dsec_bus_opts bo = {.url = o.url, .name = o.name ? o.name : "dsec-client",
                        .threads = o.threads > 0 ? o.threads : 2, .low_latency = true,
                        .inbox_prefix = inbox, .schema_max = DSEC_SCHEMA_VERSION};
    if (dsec_bus_connect(&c->bus, &bo, err) < 0) {
        dsec_client_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

void dsec_client_free(dsec_client *c)
{
    if (c == NULL)
        return;
    /* creates waiting for their retry go out now, so that every one is answered
     * before the bus drains below */
    pthread_mutex_lock(&c->rmu);
    c->retrier_stop = true;
    bool started = c->retrier_started;
    pthread_cond_broadcast(&c->rcv);
    pthread_mutex_unlock(&c->rmu);
    if (started)
        pthread_join(c->retrier, NULL);
    pthread_mutex_destroy(&c->rmu);
    pthread_cond_destroy(&c->rcv);
    dsec_actor_free(c->lost);
    dsec_bus_free(c->bus);
    dsec_free(c->tenant);
    dsec_free(c);
}

const char *dsec_client_tenant(const dsec_client *c) { return c->tenant; }

int dsec_id_node(const char *id, char *node, size_t n, dsec_err *err)
{
    const char *dash = id ? strrchr(id, '-') : NULL;
    size_t len = dash ? (size_t)(dash - id) : 0;
    if (dash == NULL || len == 0 || len >= n || strlen(dash + 1) != 16 ||
        dsec_name_ok(id, DSEC_SBX_ID_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "\"%s\" is not a sandbox id (NODE-XXXXXXXXXXXXXXXX)", id ? id : "");
    memcpy(node, id, len);
    node[len] = '\0';
    return 0;
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
    kv_release(&r->m.labels);
    kv_release(&r->m.affinity);
    dsec_buf_release(&r->buf);
}

static int create_req_build(dsec_client *c, const dsec_create_spec *s, struct create_req *r,
                            dsec_err *err)
{
    memset(r, 0, sizeof *r);
    dsec_buf_init(&r->buf);
    if (s->req_id != NULL)
        copy_str(r->req_id, sizeof r->req_id, s->req_id);
    else
        dsec_bus_new_id(r->req_id);
    if (s->req_id != NULL && strlen(s->req_id) >= sizeof r->req_id)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "req_id: longer than %zu characters",
                            sizeof r->req_id - 1);
    dsec_msg_create *m = &r->m;
    m->req_id = r->req_id;
    m->tenant = c->tenant;
    m->type = s->type && s->type[0] ? s->type : NULL;
    m->requires = (dsec_strv){(const char **)s->requires, count_nt(s->requires)};
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
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "project \"%.64s\": names of [A-Za-z0-9_-] joined by '/', at most 64 characters",
                            m->project);
    m->net = (dsec_strv){(const char **)s->net, count_nt(s->net)};
    if (kv_from_pairs(s->labels, &m->labels, "labels", err) < 0 ||
        kv_from_pairs(s->affinity, &m->affinity, "affinity", err) < 0)
        return -1;
    if (m->cell != NULL && dsec_name_ok(m->cell, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "cell \"%s\": not a valid cell name", m->cell);
    if (m->cell)
        snprintf(r->subject, sizeof r->subject, "dsec.v1.%s.create.%s", c->tenant, m->cell);
    else
        snprintf(r->subject, sizeof r->subject, "dsec.v1.%s.create", c->tenant);
    return dsec_encode(&r->buf, DSEC_MSG_CREATE, m, err);
}

static void info_from_created(const dsec_msg_created *cr, dsec_sandbox_info *out)
{
    memset(out, 0, sizeof *out);
    copy_str(out->id, sizeof out->id, cr->id);
    copy_str(out->node, sizeof out->node, cr->node);
    copy_str(out->type, sizeof out->type, cr->type);
    copy_str(out->state, sizeof out->state, cr->state);
    copy_str(out->cell, sizeof out->cell, cr->cell);
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

/* Resend the creates that waited out their attempt's deadline. */
static void *retrier_main(void *arg)
{
    dsec_client *c = arg;
    pthread_mutex_lock(&c->rmu);
    for (;;) {
        struct async_create *a = c->rhead;
        if (a == NULL) {
            if (c->retrier_stop)
                break;
            pthread_cond_wait(&c->rcv, &c->rmu);
            continue;
        }
        uint64_t now = wall_ns();
        if (!c->retrier_stop && now < a->resend_ns) {
            struct timespec ts = {(time_t)(a->resend_ns / 1000000000ull),
                                  (long)(a->resend_ns % 1000000000ull)};
            pthread_cond_timedwait(&c->rcv, &c->rmu, &ts); /* CLOCK_REALTIME, like the deadline */
            continue;
        }
        c->rhead = a->rnext;
        if (c->rhead == NULL)
            c->rtail = NULL;
        pthread_mutex_unlock(&c->rmu);
        dsec_err err;
        if (a->resend_as_is) { /* overloaded: the same attempt, its deadline kept */
            a->resend_as_is = false;
            if (async_send(a, &err) < 0)
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
        } else if ((status = dsec__client_decode_reply(dec, reply, DSEC_MSG_CREATED, &cr, &err)) == 0) {
            dsec_sandbox_info info;
            info_from_created(&cr, &info);
            dsec_decoder_free(dec);
            async_finish(a, 0, &info, NULL);
            return;
        }
        dsec_decoder_free(dec);
    }
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
    dsec_hdr hdr = {.type = "create", .schema = DSEC_SCHEMA_VERSION, .req_id = a->r.req_id,
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
        rc = dsec_bus_request(a->c->bus, a->r.subject, &hdr, a->r.buf.data, a->r.buf.len,
                              tmo, on_create_reply, a, err);
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
        rc = async_send(a, err);
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

/* ---- operations on a sandbox ---------------------------------------------- */

int dsec__client_sbx_subject(dsec_client *c, const char *id, const char *op, char *subj, size_t n,
                             dsec_err *err)
{
    char node[DSEC_NAME_MAX];
    if (dsec_id_node(id, node, sizeof node, err) < 0)
        return -1;
    snprintf(subj, n, "dsec.v1.%s.sbx.%s.%s.%s", c->tenant, node, id, op);
    return 0;
}

/* Encode msg, send it to the sandbox's op subject, decode the reply into out.
 * The reply message is kept in *keep until the caller frees it. */
int dsec__client_sbx_call(dsec_client *c, const char *id, const char *op, int type,
                          const void *msg, int reply_type, dsec_decoder *dec, dsec_msg **keep,
                          void *out, dsec_err *err);

static int sbx_call_for(dsec_client *c, const char *id, const char *op, int type,
                        const void *msg, const char *req_id, int reply_type, dsec_decoder *dec,
                        dsec_msg **keep, void *out, int timeout_ms, dsec_err *err)
{
    char subj[256];
    dsec_buf buf;
    dsec_buf_init(&buf);
    *keep = NULL;
    int rc = dsec__client_sbx_subject(c, id, op, subj, sizeof subj, err);
    if (rc == 0)
        rc = dsec_encode(&buf, type, msg, err);
    if (rc == 0)
        rc = call_for(c, subj, dsec_msg_type_name(type), &buf, req_id, reply_type, dec, keep, out,
                      timeout_ms, err);
    dsec_buf_release(&buf);
    return rc;
}

static int sbx_call(dsec_client *c, const char *id, const char *op, int type, const void *msg,
                    int reply_type, dsec_decoder *dec, dsec_msg **keep, void *out, dsec_err *err)
{
    return sbx_call_for(c, id, op, type, msg, NULL, reply_type, dec, keep, out, c->timeout_ms,
                        err);
}

int dsec__client_sbx_call(dsec_client *c, const char *id, const char *op, int type,
                          const void *msg, int reply_type, dsec_decoder *dec, dsec_msg **keep,
                          void *out, dsec_err *err)
{
    return sbx_call(c, id, op, type, msg, reply_type, dec, keep, out, err);
}

/* How much longer than its command's own timeout an exec waits for the answer: the node's
 * way back, a busy host. */
#define EXEC_ANSWER_SLACK_MS 30000u

/* How long a streamed exec waits for chunks still missing when its result,
 * which holds the whole output, has come: chunks are published before the
 * result, but across a NATS gateway they travel another way and can come
 * later, or not at all (interest not yet known on the node's side). */
#define STREAM_GRACE_MS 2000

/* The chunks of one streamed exec, handed to the caller's callback in order.
 * Under mu: the callback runs with it held, so it never runs twice at once. */
struct exec_stream {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t got;    /* chunks delivered to the callback */
    uint64_t next;   /* the seq the next chunk should have */
    size_t bytes[3]; /* delivered per stream (1 stdout, 2 stderr) */
    bool gap;        /* a chunk came after one that never did */
    bool closed;     /* the exec is answered: later chunks are dropped */
    dsec_exec_output_fn fn;
    void *ud;
    const char *id;
};

static uint64_t one_key(const dsec_msg *m, void *ud)
{
    return 0; /* one ordering key: chunks reach the callback in the order they were sent */
}

static void on_chunk(dsec_actor *a, dsec_msg *m, void *ud)
{
    struct exec_stream *st = ud;
    dsec_decoder *dec = dsec_decoder_new(NULL);
    dsec_msg_exec_chunk ch;
    dsec_err err;
    bool ok =
        dec != NULL &&
        dsec_decode(dec, DSEC_MSG_EXEC_CHUNK, dsec_msg_data(m), dsec_msg_len(m), &ch, &err) == 0 &&
        strcmp(ch.id, st->id) == 0;
    pthread_mutex_lock(&st->mu);
    if (ok && !st->closed) {
        if (ch.seq != st->next)
            st->gap = true;
        st->next = ch.seq + 1;
        st->fn(st->ud, (int)ch.stream, ch.data.ptr, ch.data.len);
        if (ch.stream == 1 || ch.stream == 2)
            st->bytes[ch.stream] += ch.data.len;
    }
    st->got++;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
    dsec_decoder_free(dec);
}

/* Wait until the callback has seen the result's r->chunks chunks; the result
 * is sent after the last chunk, but the two travel on different
 * subscriptions. When chunks are still missing and the result holds the
 * whole output (nothing truncated, every chunk that came was in order), the
 * callback gets what the missing ones carried from the result instead. */
static int stream_wait(struct exec_stream *st, const dsec_msg_exec_result *r, int timeout_ms,
                       dsec_err *err)
{
    uint64_t n = r->chunks;
    bool whole = !r->stdout_truncated && !r->stderr_truncated;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    int wait_ms = whole && timeout_ms > STREAM_GRACE_MS ? STREAM_GRACE_MS : timeout_ms;
    until.tv_sec += wait_ms / 1000;
    until.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    int rc = 0;
    pthread_mutex_lock(&st->mu);
    while (st->got < n)
        if (pthread_cond_timedwait(&st->cv, &st->mu, &until) != 0)
            break;
    if (st->got < n) {
        if (whole && !st->gap && st->bytes[1] <= r->stdout_data.len &&
            st->bytes[2] <= r->stderr_data.len) {
            if (r->stdout_data.len > st->bytes[1])
                st->fn(st->ud, 1, r->stdout_data.ptr + st->bytes[1],
                       r->stdout_data.len - st->bytes[1]);
            if (r->stderr_data.len > st->bytes[2])
                st->fn(st->ud, 2, r->stderr_data.ptr + st->bytes[2],
                       r->stderr_data.len - st->bytes[2]);
        } else {
            rc = dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                              "exec in %s: %" PRIu64 " of %" PRIu64
                              " output chunks arrived, and the result "
                              "cannot stand in for the rest (%s)",
                              st->id, st->got, n,
                              !whole    ? "its output was truncated"
                              : st->gap ? "a chunk came after a lost one"
                                        : "the chunks carried more than it holds");
        }
    }
    st->closed = true;
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static int exec_impl(dsec_client *c, const char *id, const dsec_exec_opts *o, dsec_exec_output_fn fn,
                     void *ud, dsec_exec_reply *res, dsec_err *err);

int dsec_exec(dsec_client *c, const char *id, const dsec_exec_opts *o, dsec_exec_reply *res,
              dsec_err *err)
{
    return exec_impl(c, id, o, NULL, NULL, res, err);
}

int dsec_exec_stream(dsec_client *c, const char *id, const dsec_exec_opts *o, dsec_exec_output_fn fn,
                     void *ud, dsec_exec_reply *res, dsec_err *err)
{
    if (fn == NULL) {
        memset(res, 0, sizeof *res);
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec_stream: no output callback");
    }
    return exec_impl(c, id, o, fn, ud, res, err);
}

static int exec_impl(dsec_client *c, const char *id, const dsec_exec_opts *o, dsec_exec_output_fn fn,
                     void *ud, dsec_exec_reply *res, dsec_err *err)
{
    memset(res, 0, sizeof *res);
    dsec_msg_exec m = {.id = id,
                       .argv = {(const char **)o->argv, count_nt(o->argv)},
                       .cwd = o->cwd,
                       .stdin_data = {o->stdin_data, o->stdin_len},
                       .timeout_ms = o->timeout_ms,
                       .user = o->user,
                       .rollout_id = o->rollout_id,
                       .step = o->step,
                       .output_max = o->output_max,
                       .session = o->session};
    /* no argv: the sandbox's default command (an imported image's Entrypoint and Cmd) */
    if (o->session != 0 && m.argv.n != 1)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "exec: a session command is one shell command line, not %u "
                            "arguments",
                            m.argv.n);
    /* The request id names this command on its node: asked again with it (after a lost
     * answer, a restart), the node answers with the result kept from the first run. */
    char rid[65];
    if (o->req_id != NULL && (o->req_id[0] == '\0' || strlen(o->req_id) >= sizeof rid))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: req_id must be 1..64 characters");
    if (o->req_id != NULL)
        copy_str(rid, sizeof rid, o->req_id);
    else
        dsec_bus_new_id(rid);
    m.req_id = rid;
    /* wait as long as the command may run, never less than the client's own timeout */
    uint64_t wait = o->timeout_ms ? o->timeout_ms + EXEC_ANSWER_SLACK_MS : 0;
    if (wait < (uint64_t)c->timeout_ms)
        wait = (uint64_t)c->timeout_ms;
    if (wait > INT32_MAX)
        wait = INT32_MAX;
    if (kv_from_pairs(o->env, &m.env, "env", err) < 0)
        return -1;
    dsec_decoder *dec = dsec_decoder_new(NULL);
    dsec_msg *keep = NULL;
    dsec_msg_exec_result r;
    int rc = dec ? 0 : dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    struct exec_stream st = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
                             .fn = fn, .ud = ud, .id = id};
    dsec_actor *sa = NULL;
    char subj[160], sid[33];
    if (rc == 0 && fn != NULL) {
        /* subscribed before the request goes out on the same connection, so
         * the server has the subscription before the node can publish */
        dsec_bus_new_id(sid);
        /* under this connection's inbox prefix: the one subtree a tenant may subscribe to */
        snprintf(subj, sizeof subj, "%s.exec.%s", dsec_bus_inbox_prefix(c->bus), sid);
        m.stream_to = subj;
        if (dsec_actor_new(&sa, c->bus, "exec-stream", err) < 0)
            rc = -1;
        if (rc == 0) {
            dsec_actor_set_key(sa, one_key, NULL);
            rc = dsec_actor_on(sa, subj, NULL, on_chunk, &st, err);
        }
    }
    if (rc == 0) {
        rc = sbx_call_for(c, id, "exec", DSEC_MSG_EXEC, &m, rid, DSEC_MSG_EXEC_RESULT, dec, &keep,
                          &r, (int)wait, err);
        if (rc < 0 && err->code == DSEC_E_TIMEOUT && o->rollout_id == NULL)
            dsec_err_wrap(err,
                          "the command may still be running; exec again with req_id %s to get "
                          "its answer (it will not run twice)",
                          rid);
    }
    if (rc == 0 && fn != NULL) {
        if (r.chunks == 0) {
            /* nothing streamed (a result from the trajectory log): the output, once */
            if (r.stdout_data.len)
                fn(ud, 1, r.stdout_data.ptr, r.stdout_data.len);
            if (r.stderr_data.len)
                fn(ud, 2, r.stderr_data.ptr, r.stderr_data.len);
        } else {
            rc = stream_wait(&st, &r, c->timeout_ms, err);
        }
    }
    dsec_actor_free(sa);
    if (rc == 0) {
        res->exit_code = (int)r.exit_code;
        res->signal = (int)r.signal;
        res->timed_out = r.timed_out;
        res->interrupted = r.interrupted;
        res->session_ended = r.session_ended;
        res->out_truncated = r.stdout_truncated;
        res->err_truncated = r.stderr_truncated;
        res->duration_us = r.duration_us;
        res->cpu_us = r.cpu_us;
        res->peak_rss_kb = r.peak_rss_kb;
        res->out = dsec_malloc(r.stdout_data.len + 1);
        res->err_out = dsec_malloc(r.stderr_data.len + 1);
        if (res->out == NULL || res->err_out == NULL) {
            dsec_exec_reply_release(res);
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        } else {
            if (r.stdout_data.len)
                memcpy(res->out, r.stdout_data.ptr, r.stdout_data.len);
            if (r.stderr_data.len)
                memcpy(res->err_out, r.stderr_data.ptr, r.stderr_data.len);
            res->out[r.stdout_data.len] = 0;
            res->err_out[r.stderr_data.len] = 0;
            res->out_len = r.stdout_data.len;
            res->err_len = r.stderr_data.len;
        }
    }
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    kv_release(&m.env);
    return rc;
}

void dsec_exec_reply_release(dsec_exec_reply *res)
{
    dsec_free(res->out);
    dsec_free(res->err_out);
    res->out = res->err_out = NULL;
    res->out_len = res->err_len = 0;
}

int dsec_file_write(dsec_client *c, const char *id, const char *path, const void *data, size_t len,
                    unsigned mode, dsec_err *err)
{
    dsec_write_opts o = {.mode = mode};
    return dsec_file_write_ex(c, id, path, data, len, &o, err);
}

/* Files move in pages that stay well under the bus's payload limit: the node
 * answers a read with at most this much, and a write bigger than this goes
 * as a first message and appends. */
#define FILE_PAGE (4u << 20)

static int write_one(dsec_client *c, const char *id, const dsec_msg_file_write *m,
                     dsec_decoder *dec, dsec_err *err)
{
    dsec_msg *keep = NULL;
    dsec_msg_file_data r;
    int rc =
        sbx_call(c, id, "write", DSEC_MSG_FILE_WRITE, m, DSEC_MSG_FILE_DATA, dec, &keep, &r, err);
    dsec_msg_free(keep);
    return rc;
}

int dsec_file_write_ex(dsec_client *c, const char *id, const char *path, const void *data,
                       size_t len, const dsec_write_opts *opts, dsec_err *err)
{
    dsec_write_opts none = {0};
    if (opts == NULL)
        opts = &none;
    /* A write recorded in the trajectory log is one step: one message, so a
     * re-issued step is either wholly skipped or wholly run. */
    if (opts->rollout_id != NULL && len > FILE_PAGE)
        return dsec_err_set(
            err, DSEC_E_TOO_LARGE, 0,
            "writing %s in %s: a write recorded in the trajectory log (step %" PRIu64
            ") holds at most %u bytes, and this one has %zu; write it without a "
            "step, or in several steps",
            path, id, opts->step, FILE_PAGE, len);
    /* a whole file of more than a page: an upload, published at once when it all arrived */
    if (len > FILE_PAGE && !opts->append && opts->rollout_id == NULL)
        return dsec__file_upload_mem(c, id, path, data, len, opts->mode, err);
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    const uint8_t *p = data;
    size_t off = 0;
    int rc = 0;
    do {
        size_t n = len - off < FILE_PAGE ? len - off : FILE_PAGE;
        dsec_msg_file_write m = {.id = id,
                                 .path = path,
                                 .data = {p + off, n},
                                 .mode = opts->mode,
                                 .append = opts->append || off > 0,
                                 .rollout_id = opts->rollout_id,
                                 .step = opts->step};
        rc = write_one(c, id, &m, dec, err);
        if (rc < 0 && off > 0)
            dsec_err_wrap(err, "only the first %zu of the %zu bytes written reached %s in %s", off,
                          len, path, id);
        off += n;
    } while (rc == 0 && off < len);
    dsec_decoder_free(dec);
    return rc;
}

int dsec_file_read_pages(dsec_client *c, const char *id, const char *path, dsec_file_page_fn fn,
                         void *ud, dsec_err *err)
{
    return dsec_file_download(c, id, path, NULL, fn, ud, NULL, err);
}

struct read_all {
    uint8_t *buf;
    size_t cap, len;
};

/* Gathers the pages; the first one says the file's size, so the buffer is
 * allocated once when that size is sane. */
static int read_all_page(void *ud, const uint8_t *data, size_t len, uint64_t size)
{
    struct read_all *ra = ud;
    if (ra->buf == NULL && size < SIZE_MAX / 2 && (ra->buf = dsec_malloc((size_t)size + 1)) != NULL)
        ra->cap = (size_t)size + 1;
    if (ra->len + len + 1 > ra->cap) {
        size_t ncap = ra->cap ? ra->cap : 1;
        while (ncap < ra->len + len + 1)
            ncap *= 2;
        uint8_t *nb = dsec_realloc(ra->buf, ncap);
        if (nb == NULL) {
            errno = ENOMEM;
            return -1;
        }
        ra->buf = nb;
        ra->cap = ncap;
    }
    if (len)
        memcpy(ra->buf + ra->len, data, len);
    ra->len += len;
    ra->buf[ra->len] = 0;
    return 0;
}

int dsec_file_read(dsec_client *c, const char *id, const char *path, uint8_t **data, size_t *len,
                   dsec_err *err)
{
    *data = NULL;
    *len = 0;
    struct read_all ra = {0};
    if (dsec_file_read_pages(c, id, path, read_all_page, &ra, err) < 0) {
        dsec_free(ra.buf);
        return -1;
    }
    *data = ra.buf;
    *len = ra.len;
    return 0;
}

int dsec_file_list(dsec_client *c, const char *id, const char *path, dsec_dirent **entries,
                   size_t *n, dsec_err *err)
{
    dsec_msg_file_list m = {.id = id, .path = path};
    *entries = NULL;
    *n = 0;
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg *keep = NULL;
    dsec_msg_file_list_reply r;
    int rc = sbx_call(c, id, "ls", DSEC_MSG_FILE_LIST, &m, DSEC_MSG_FILE_LIST_REPLY, dec, &keep, &r,
                      err);
    if (rc == 0 && r.entries.n > 0) {
        dsec_dirent *e = dsec_calloc(r.entries.n, sizeof *e);
        const dsec_msg_file_entry *src = r.entries.items;
        for (uint32_t i = 0; e != NULL && i < r.entries.n; i++) {
            e[i].name = dsec_strdup(src[i].name);
            copy_str(e[i].kind, sizeof e[i].kind, src[i].kind);
            e[i].size = src[i].size;
            e[i].mode = src[i].mode;
            e[i].mtime = src[i].mtime;
            if (e[i].name == NULL) {
                dsec_dirents_free(e, i);
                e = NULL;
            }
        }
        if (e == NULL)
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        else {
            *entries = e;
            *n = r.entries.n;
        }
    }
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

void dsec_dirents_free(dsec_dirent *entries, size_t n)
{
    for (size_t i = 0; entries != NULL && i < n; i++)
        dsec_free(entries[i].name);
    dsec_free(entries);
}

void dsec_strv_free(char **v, size_t n)
{
    for (size_t i = 0; v != NULL && i < n; i++)
        dsec_free(v[i]);
    dsec_free(v);
}

/* pause, resume, destroy, status, fork: the "op" message. */
static int op_call_net(dsec_client *c, const char *id, const char *op, uint64_t n, const char *name,
                       dsec_strv net, dsec_sandbox_info *info, char ***ids, size_t *nids,
                       dsec_err *err)
{
    char req_id[33];
    dsec_bus_new_id(req_id);
    dsec_msg_op m = {.id = id, .op = op, .n = n, .name = name, .net = net, .req_id = req_id,
                     .tenant = c->tenant};
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg *keep = NULL;
    dsec_msg_op_reply r;
    int rc = sbx_call(c, id, "op", DSEC_MSG_OP, &m, DSEC_MSG_OP_REPLY, dec, &keep, &r, err);
    if (rc == 0 && info != NULL) {
        memset(info, 0, sizeof *info);
        copy_str(info->id, sizeof info->id, r.id);
        copy_str(info->node, sizeof info->node, r.node);
        copy_str(info->type, sizeof info->type, r.type);
        copy_str(info->state, sizeof info->state, r.state);
    }
    if (rc == 0 && ids != NULL) {
        char **v = dsec_calloc(r.ids.n ? r.ids.n : 1, sizeof *v);
        for (uint32_t i = 0; v != NULL && i < r.ids.n; i++)
            if ((v[i] = dsec_strdup(r.ids.v[i])) == NULL) {
                dsec_strv_free(v, i);
                v = NULL;
            }
        if (v == NULL)
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        else {
            *ids = v;
            *nids = r.ids.n;
        }
    }
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

static int op_call(dsec_client *c, const char *id, const char *op, uint64_t n, const char *name,
                   dsec_sandbox_info *info, char ***ids, size_t *nids, dsec_err *err)
{
    return op_call_net(c, id, op, n, name, (dsec_strv){0}, info, ids, nids, err);
}

int dsec_set_network(dsec_client *c, const char *id, const char *const *entries, size_t n,
                     dsec_err *err)
{
    if (n > 64)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "network policy has %zu entries; at most 64 are allowed", n);
    for (size_t i = 0; i < n; i++)
        if (entries[i] == NULL || entries[i][0] == '\0')
            return dsec_err_set(err, DSEC_E_INVALID, 0, "network policy entry %zu is empty", i);
    dsec_strv v = {.v = (const char **)entries, .n = (uint32_t)n};
    return op_call_net(c, id, "net", 0, NULL, v, NULL, NULL, NULL, err);
}

int dsec_set_ttl(dsec_client *c, const char *id, uint64_t ttl_s, uint64_t *expires_ns,
                 dsec_err *err)
{
    if (ttl_s == 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "ttl: ttl_s must be at least 1 (seconds from now); dsec_destroy ends "
                            "a sandbox at once");
    char req_id[33];
    dsec_bus_new_id(req_id);
    dsec_msg_op m = {.id = id, .op = "ttl", .ttl_s = ttl_s, .req_id = req_id, .tenant = c->tenant};
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg *keep = NULL;
    dsec_msg_op_reply r;
    int rc = sbx_call(c, id, "op", DSEC_MSG_OP, &m, DSEC_MSG_OP_REPLY, dec, &keep, &r, err);
    if (rc == 0 && expires_ns != NULL) {
        *expires_ns = 0;
        for (uint32_t i = 0; i < r.info.n; i++)
            if (strcmp(r.info.k[i], "expires_ns") == 0)
                *expires_ns = strtoull(r.info.v[i], NULL, 10);
    }
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

/* ---- background processes ---------------------------------------------------------- */

static void proc_from_wire(dsec_proc *p, const dsec_msg_proc_info *w)
{
    *p = (dsec_proc){.handle = w->handle, .pid = (int32_t)w->pid, .running = w->running,
                     .stdin_open = w->stdin_open, .timed_out = w->timed_out,
                     .exit_code = (int32_t)w->exit_code, .signal = (int32_t)w->sig,
                     .started_ns = w->started_ns, .ended_ns = w->ended_ns,
                     .out_total = w->out_total, .err_total = w->err_total, .pty = w->pty,
                     .session = w->session, .busy = w->busy};
    copy_str(p->cmdline, sizeof p->cmdline, w->cmdline);
}

/* One proc request and its answer; the answer's bytes live in *keep (dsec_msg_free). */
static int proc_call_on(dsec_client *c, const char *id, const char *verb, dsec_msg_proc *m,
                        dsec_decoder *dec, dsec_msg **keep, dsec_msg_proc_reply *r,
                        int timeout_ms, dsec_err *err)
{
    char req_id[33];
    dsec_bus_new_id(req_id);
    m->id = id;
    m->req_id = req_id;
    m->tenant = c->tenant;
    return sbx_call_for(c, id, verb, DSEC_MSG_PROC, m, NULL, DSEC_MSG_PROC_REPLY, dec, keep, r,
                        timeout_ms, err);
}

static int proc_call(dsec_client *c, const char *id, dsec_msg_proc *m, dsec_decoder *dec,
                     dsec_msg **keep, dsec_msg_proc_reply *r, dsec_err *err)
{
    return proc_call_on(c, id, "proc", m, dec, keep, r, c->timeout_ms, err);
}

/* A process call but start on the sig subject, which passes the sandbox's running command
 * (a foreground exec, a transfer); a sandbox whose agent has one channel (a VM) says it is
 * unsupported there, having done nothing, and takes it on the proc subject. */
static int proc_side_call(dsec_client *c, const char *id, dsec_msg_proc *m, dsec_decoder *dec,
                          dsec_msg **keep, dsec_msg_proc_reply *r, int timeout_ms,
                          dsec_err *err)
{
    int rc = proc_call_on(c, id, "sig", m, dec, keep, r, timeout_ms, err);
    if (rc < 0 && err->code == DSEC_E_UNSUPPORTED) {
        dsec_msg_free(*keep);
        *keep = NULL;
        rc = proc_call_on(c, id, "proc", m, dec, keep, r, timeout_ms, err);
    }
    return rc;
}

/* The one process a start or an output answer names. */
static int proc_one(const dsec_msg_proc_reply *r, dsec_proc *out, dsec_err *err)
{
    if (r->procs.n != 1)
        return dsec_err_set(err, DSEC_E_DECODE, 0,
                            "proc: the answer names %u processes, expected one", r->procs.n);
    proc_from_wire(out, (const dsec_msg_proc_info *)r->procs.items);
    return 0;
}

static int proc_start_msg(dsec_client *c, const char *id, dsec_msg_proc *mp,
                          const char *const *env, dsec_proc *out, dsec_err *err);

int dsec_proc_start(dsec_client *c, const char *id, const dsec_proc_opts *o, dsec_proc *out,
                    dsec_err *err)
{
    memset(out, 0, sizeof *out);
    dsec_msg_proc m = {.op = "start",
                       .argv = {(const char **)o->argv, count_nt(o->argv)},
                       .cwd = o->cwd,
                       .user = o->user,
                       .timeout_ms = o->timeout_ms,
                       .ring_max = o->ring_max,
                       .keep_stdin = o->keep_stdin || o->pty,
                       .data = {o->stdin_data, o->stdin_len},
                       .pty = o->pty,
                       .rows = o->pty ? o->rows : 0,
                       .cols = o->pty ? o->cols : 0};
    return proc_start_msg(c, id, &m, o->env, out, err);
}

int dsec_session_start(dsec_client *c, const char *id, const char *shell, dsec_proc *out,
                       dsec_err *err)
{
    memset(out, 0, sizeof *out);
    const char *argv[] = {shell};
    dsec_msg_proc m = {.op = "start", .argv = {argv, shell != NULL ? 1u : 0u}, .session = true};
    if (shell != NULL && shell[0] != '/')
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "session start: shell \"%s\" is not an absolute path", shell);
    return proc_start_msg(c, id, &m, NULL, out, err);
}

int dsec_session_interrupt(dsec_client *c, const char *id, uint64_t session, dsec_err *err)
{
    dsec_msg_proc m = {.op = "signal", .handle = session, .sig = 2 /* SIGINT */};
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg *keep = NULL;
    dsec_msg_proc_reply r;
    int rc = proc_side_call(c, id, &m, dec, &keep, &r, c->timeout_ms, err);
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

static int proc_start_msg(dsec_client *c, const char *id, dsec_msg_proc *mp,
                          const char *const *env, dsec_proc *out, dsec_err *err)
{
    dsec_msg_proc m = *mp;
    if (m.ring_max > (16u << 20))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "proc start: ring_max %" PRIu64 " is over 16 MiB", m.ring_max);
    if (kv_from_pairs(env, &m.env, "env", err) < 0)
        return -1;
    dsec_decoder *dec = dsec_decoder_new(NULL);
    dsec_msg *keep = NULL;
    dsec_msg_proc_reply r;
    int rc = dec ? proc_call(c, id, &m, dec, &keep, &r, err)
                 : dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    if (rc == 0)
        rc = proc_one(&r, out, err);
    kv_release(&m.env);
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

int dsec_proc_list(dsec_client *c, const char *id, dsec_proc **procs, size_t *n, dsec_err *err)
{
    *procs = NULL;
    *n = 0;
    dsec_msg_proc m = {.op = "list"};
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg *keep = NULL;
    dsec_msg_proc_reply r;
    int rc = proc_side_call(c, id, &m, dec, &keep, &r, c->timeout_ms, err);
    if (rc == 0) {
        dsec_proc *v = dsec_calloc(r.procs.n ? r.procs.n : 1, sizeof *v);
        if (v == NULL) {
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        } else {
            for (uint32_t i = 0; i < r.procs.n; i++)
                proc_from_wire(&v[i], (const dsec_msg_proc_info *)r.procs.items + i);
            *procs = v;
            *n = r.procs.n;
        }
    }
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

/* signal, stdin and resize: an answer with nothing in it */
static int proc_simple(dsec_client *c, const char *id, dsec_msg_proc *m, dsec_err *err)
{
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg *keep = NULL;
    dsec_msg_proc_reply r;
    int rc = proc_side_call(c, id, m, dec, &keep, &r, c->timeout_ms, err);
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

int dsec_proc_signal(dsec_client *c, const char *id, uint64_t handle, int sig, dsec_err *err)
{
    if (sig <= 0 || sig > 64)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "proc signal: %d is not a signal (1..64)",
                            sig);
    dsec_msg_proc m = {.op = "signal", .handle = handle, .sig = (uint64_t)sig};
    return proc_simple(c, id, &m, err);
}

int dsec_proc_write(dsec_client *c, const char *id, uint64_t handle, const void *data,
                    size_t len, bool close, dsec_err *err)
{
    if (data == NULL && len > 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "proc write: %zu bytes but no data", len);
    if (len > (8u << 20))
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "proc write: %zu bytes in one call, at most 8 MiB", len);
    dsec_msg_proc m = {.op = "stdin", .handle = handle, .data = {data, len}, .close = close};
    return proc_simple(c, id, &m, err);
}

int dsec_proc_read(dsec_client *c, const char *id, uint64_t handle, uint64_t out_off,
                   uint64_t err_off, uint64_t max, dsec_proc_out *out, dsec_err *err)
{
    return dsec_proc_read_wait(c, id, handle, out_off, err_off, max, 0, out, err);
}

int dsec_proc_resize(dsec_client *c, const char *id, uint64_t handle, uint16_t rows,
                     uint16_t cols, dsec_err *err)
{
    if (rows == 0 || cols == 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "proc resize: %u rows, %u columns; both must be at least 1", rows,
                            cols);
    dsec_msg_proc m = {.op = "resize", .handle = handle, .rows = rows, .cols = cols};
    return proc_simple(c, id, &m, err);
}

int dsec_proc_read_wait(dsec_client *c, const char *id, uint64_t handle, uint64_t out_off,
                        uint64_t err_off, uint64_t max, uint32_t wait_ms, dsec_proc_out *out,
                        dsec_err *err)
{
    memset(out, 0, sizeof *out);
    if (wait_ms > 60000)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "proc read: wait_ms %u is over the limit of 60000", wait_ms);
    dsec_msg_proc m = {.op = "output", .handle = handle, .out_off = out_off, .err_off = err_off,
                       .max = max, .wait_ms = wait_ms};
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg *keep = NULL;
    dsec_msg_proc_reply r;
    int rc = proc_side_call(c, id, &m, dec, &keep, &r, c->timeout_ms + (int)wait_ms, err);
    if (rc == 0)
        rc = proc_one(&r, &out->info, err);
    if (rc == 0) {
        out->out = dsec_malloc(r.out.len + 1);
        out->err = dsec_malloc(r.err.len + 1);
        if (out->out == NULL || out->err == NULL) {
            dsec_proc_out_free(out);
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        } else {
            if (r.out.len > 0)
                memcpy(out->out, r.out.ptr, r.out.len);
            if (r.err.len > 0)
                memcpy(out->err, r.err.ptr, r.err.len);
            out->out[r.out.len] = out->err[r.err.len] = 0;
            out->out_len = r.out.len;
            out->err_len = r.err.len;
            out->out_from = r.out_from;
            out->err_from = r.err_from;
        }
    }
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

void dsec_proc_out_free(dsec_proc_out *o)
{
    if (o == NULL)
        return;
    dsec_free(o->out);
    dsec_free(o->err);
    o->out = o->err = NULL;
    o->out_len = o->err_len = 0;
}

int dsec_fork(dsec_client *c, const char *id, unsigned n, char ***ids, size_t *nids, dsec_err *err)
{
    *ids = NULL;
    *nids = 0;
    if (n == 0 || n > 1024)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "fork: n must be 1..1024, got %u", n);
    return op_call(c, id, "fork", n, NULL, NULL, ids, nids, err);
}

int dsec_snapshot(dsec_client *c, const char *id, const char *name, dsec_err *err)
{
    if (name == NULL || !dsec_layer_name_valid(name))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "snapshot: name must be an environment name:version, got \"%s\"",
                            name ? name : "");
    return op_call(c, id, "snapshot", 0, name, NULL, NULL, NULL, err);
}

int dsec_pause(dsec_client *c, const char *id, dsec_err *err)
{
    return op_call(c, id, "pause", 0, NULL, NULL, NULL, NULL, err);
}

int dsec_resume(dsec_client *c, const char *id, dsec_err *err)
{
    return op_call(c, id, "resume", 0, NULL, NULL, NULL, NULL, err);
}

int dsec_destroy(dsec_client *c, const char *id, dsec_err *err)
{
    return op_call(c, id, "destroy", 0, NULL, NULL, NULL, NULL, err);
}

int dsec_status(dsec_client *c, const char *id, dsec_sandbox_info *out, dsec_err *err)
{
    return op_call(c, id, "status", 0, NULL, out, NULL, NULL, err);
}

int dsec_wait_state(dsec_client *c, const char *id, const char *state, int timeout_ms, dsec_err *err)
{
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    long sleep_ms = 5;
    for (;;) {
        dsec_sandbox_info info;
        if (dsec_status(c, id, &info, err) < 0) {
            if (err->code == DSEC_E_NOT_FOUND && strcmp(state, "gone") == 0)
                return 0;
            return -1;
        }
        if (strcmp(info.state, state) == 0)
            return 0;
        if (strcmp(info.state, "gone") == 0 || strcmp(info.state, "failed") == 0)
            return dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "sandbox %s is %s, not %s", id,
                                info.state, state);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long waited = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (waited >= timeout_ms)
            return dsec_err_set(err, DSEC_E_TIMEOUT, 0, "sandbox %s still %s after %d ms (want %s)",
                                id, info.state, timeout_ms, state);
        struct timespec ts = {0, sleep_ms * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (sleep_ms < 100)
            sleep_ms *= 2;
    }
}

/* ---- completion queues (for the SDKs; see client.h) ----------------------- */

struct dsec_cq {
    pthread_mutex_t mu;
    int fd;               /* eventfd: non-zero while events are queued */
    dsec_cq_event *ev;    /* ring of cap events */
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

int dsec_cq_fd(const dsec_cq *q) { return q->fd; }

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

/* ---- one-shot function calls ------------------------------------------------------ */

int dsec_call(dsec_client *c, const dsec_call_spec *spec, dsec_exec_reply *res, dsec_err *err)
{
    memset(res, 0, sizeof *res);
    if (spec == NULL || spec->argv == NULL || spec->argv[0] == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "call: empty argv");
    char rt[64], cpu[48];
    snprintf(rt, sizeof rt, "runtime=%s", spec->runtime ? spec->runtime : "python3");
    snprintf(cpu, sizeof cpu, "cpu_ms=%llu", (unsigned long long)spec->cpu_ms);
    const char *labels[] = {rt, spec->cpu_ms ? cpu : NULL, NULL};
    /* A ttl past the call's end: if this client dies mid-call, the node
     * reaps the sandbox on its own. */
    uint64_t ttl = (spec->timeout_ms ? spec->timeout_ms / 1000 : 600) + 60;
    dsec_create_spec cs = {.type = "function",
                           .labels = labels,
                           .memory_mb = spec->memory_mb,
                           .ttl_s = ttl,
                           .cell = spec->cell,
                           .env = spec->environment,
                           .net = spec->net};
    dsec_sandbox_info info;
    if (dsec_create(c, &cs, &info, err) < 0)
        return dsec_err_wrap(err, "call: creating the function sandbox");
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < spec->nfiles; i++) {
        const dsec_call_file *f = &spec->files[i];
        rc = dsec_file_write(c, info.id, f->path, f->data, f->len, f->mode ? f->mode : 0644, err);
        if (rc < 0)
            dsec_err_wrap(err, "call: writing %s", f->path ? f->path : "(null)");
    }
    if (rc == 0) {
        dsec_exec_opts o = {.argv = spec->argv,
                            .env = spec->env,
                            .stdin_data = spec->stdin_data,
                            .stdin_len = spec->stdin_len,
                            .timeout_ms = spec->timeout_ms,
                            .output_max = spec->output_max};
        rc = dsec_exec(c, info.id, &o, res, err);
    }
    dsec_err derr;
    dsec_destroy(c, info.id, &derr); /* best effort: the ttl covers a lost destroy */
    return rc;
}

/* ---- nodes declared lost ------------------------------------------------------------ */

static void on_lost(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_client *c = ud;
    dsec_msg_node_lost nl;
    dsec_err err;
    dsec_decoder *dec = dsec_decoder_new(NULL); /* rare: one per event */
    if (dec == NULL ||
        dsec_decode(dec, DSEC_MSG_NODE_LOST, dsec_msg_data(m), dsec_msg_len(m), &nl, &err) < 0) {
        dsec_decoder_free(dec);
        dsec_actor_count_error(a);
        return;
    }
    c->lost_cb(nl.node, nl.cell ? nl.cell : "", nl.lost_ns, c->lost_ud);
    dsec_decoder_free(dec);
}

int dsec_watch_lost(dsec_client *c, dsec_node_lost_cb cb, void *ud, dsec_err *err)
{
    if (cb == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "watch_lost: a callback is required");
    if (c->lost != NULL)
        return dsec_err_set(err, DSEC_E_STATE, 0, "watch_lost: this client already watches");
    c->lost_cb = cb;
    c->lost_ud = ud;
    char subj[128];
    snprintf(subj, sizeof subj, "dsec.v1.%s.evt.lost", c->tenant);
    if (dsec_actor_new(&c->lost, c->bus, "lost-watch", err) < 0)
        return -1;
    if (dsec_actor_on(c->lost, subj, NULL, on_lost, c, err) < 0 || dsec_bus_flush(c->bus, 2000, err) < 0) {
        dsec_actor_free(c->lost);
        c->lost = NULL;
        return -1;
    }
    return 0;
}
