/* lost.c - declaring silent nodes lost to their sandboxes' owners, reconciling them when they
 * return, and telling nodes of retried creates placed elsewhere. */
#include "actors/lost.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "codecs/subjects.h"
#include "runtime/ticker.h"
#include "actors/wire.h"
#include "dsec/alloc.h"
#include "dsec/log.h"
#include "dsec/names.h"

#define RECONCILE_TIMEOUT_MS 2000
#define RESEND_BATCH 1024 /* notices per superseded_list sent to a returned node */

/* A retried create placed on node (dsec_lost_superseded). */
struct notice {
    uint64_t seq; /* 1, 2, ... in the order recorded */
    uint64_t ms;  /* recorded then (monotonic) */
    uint64_t ts_ns;
    uint64_t retry;
    char tenant[DSEC_NAME_LEN_MAX + 1];
    char req_id[DSEC_NAME_LEN_MAX + 1];
    char node[DSEC_NAME_LEN_MAX + 1];
};

struct watched {
    struct watched *next; /* hash chain; entries live until dsec_lost_free */
    dsec_lost *w;
    char name[DSEC_NAME_LEN_MAX + 1];
    uint64_t last_ms; /* it last spoke (monotonic) */
    char **tenants;   /* from its last full report; owned */
    size_t ntenants;
    uint64_t lost_ns; /* declared lost then (wall clock); 0: not lost */
    uint64_t silent_ms;
    bool reconciling;              /* a reconcile request is in flight */
    uint64_t resend_seq;           /* the first notice it may have missed; 0: none */
    uint64_t sent_from, sent_upto; /* the notices [from, upto) in flight to it */
    bool resending;                /* a superseded_list request is in flight */
    uint64_t conn;                 /* its reports' connection generation */
    uint64_t conn_ms;              /* the last report of that generation came then */
};

struct dsec_lost {
    dsec_bus *bus;
    char cell[DSEC_NAME_LEN_MAX + 1];
    char who[DSEC_NAME_LEN_MAX + 1];
    uint32_t lost_after_ms, gap_ms;
    pthread_mutex_t mu;
    pthread_cond_t idle; /* inflight reached 0 */
    struct watched **b;
    size_t nb, n;
    int inflight;
    dsec_lost_stats st;
    struct notice *ring; /* DSEC_LOST_NOTICES_MAX, allocated with the first notice */
    uint64_t next_seq;   /* the seq of the next notice */
    size_t nring;        /* notices held: seqs [next_seq - nring, next_seq) */
};

static size_t slot(const dsec_lost *w, const char *name)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return (size_t)(h % w->nb);
}

static struct watched *find_locked(dsec_lost *w, const char *name, bool make)
{
    for (struct watched *x = w->b[slot(w, name)]; x; x = x->next)
        if (strcmp(x->name, name) == 0)
            return x;
    if (!make || dsec_name_ok(name, DSEC_NAME_LEN_MAX) < 0)
        return NULL;
    if (w->n >= w->nb * 2) { /* grow: a cell may have thousands of nodes */
        size_t nb = w->nb * 4;
        struct watched **b = dsec_calloc(nb, sizeof *b);
        if (b == NULL)
            return NULL;
        size_t old = w->nb;
        struct watched **ob = w->b;
        w->b = b;
        w->nb = nb;
        for (size_t i = 0; i < old; i++)
            for (struct watched *x = ob[i], *nx; x; x = nx) {
                nx = x->next;
                size_t k = slot(w, x->name);
                x->next = b[k];
                b[k] = x;
            }
        dsec_free(ob);
    }
    struct watched *x = dsec_calloc(1, sizeof *x);
    if (x == NULL)
        return NULL;
    x->w = w;
    snprintf(x->name, sizeof x->name, "%s", name);
    size_t k = slot(w, name);
    x->next = w->b[k];
    w->b[k] = x;
    w->n++;
    return x;
}

static void tenants_free(struct watched *x)
{
    for (size_t i = 0; i < x->ntenants; i++)
        dsec_free(x->tenants[i]);
    dsec_free(x->tenants);
    x->tenants = NULL;
    x->ntenants = 0;
}

int dsec_lost_new(dsec_lost **out, dsec_bus *bus, const char *cell, const char *who,
                  uint32_t lost_after_ms, uint32_t gap_ms, dsec_err *err)
{
    *out = NULL;
    dsec_lost *w = dsec_calloc(1, sizeof *w);
    if (w == NULL || (w->b = dsec_calloc(64, sizeof *w->b)) == NULL) {
        dsec_free(w);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    w->nb = 64;
    w->bus = bus;
    snprintf(w->cell, sizeof w->cell, "%s", cell);
    snprintf(w->who, sizeof w->who, "%s", who);
    w->lost_after_ms = lost_after_ms ? lost_after_ms : 30000;
    w->gap_ms = gap_ms ? gap_ms : 3000;
    w->next_seq = 1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->idle, NULL);
    *out = w;
    return 0;
}

void dsec_lost_free(dsec_lost *w)
{
    if (w == NULL)
        return;
    pthread_mutex_lock(&w->mu);
    while (w->inflight > 0)
        pthread_cond_wait(&w->idle, &w->mu);
    pthread_mutex_unlock(&w->mu);
    for (size_t i = 0; i < w->nb; i++)
        for (struct watched *x = w->b[i], *nx; x; x = nx) {
            nx = x->next;
            tenants_free(x);
            dsec_free(x);
        }
    dsec_free(w->b);
    dsec_free(w->ring);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->idle);
    dsec_free(w);
}

/* A node took the request: it answered, and not with an error message. */
static bool taken(int status, dsec_msg *reply)
{
    const char *type = status == 0 ? dsec_msg_type(reply) : NULL;
    return type != NULL && strcmp(type, DSEC_TYPE_ERROR) != 0;
}

/* One request fewer in flight (w->mu held). */
static void inflight_done_locked(dsec_lost *w)
{
    if (--w->inflight == 0)
        pthread_cond_broadcast(&w->idle);
}

/* Request msg (wire type) on subj, answered to cb(x) on a bus thread, and
 * count it in flight (w->mu held). -1: not sent, and cb will not run. */
static int ask_locked(dsec_lost *w, const char *subj, int type, const void *msg, dsec_reply_cb cb,
                      struct watched *x)
{
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_err err;
    dsec_hdr hdr = {.type = dsec_msg_type_name(type), .schema = DSEC_SCHEMA_VERSION};
    w->inflight++;
    int rc = dsec_encode(&b, type, msg, &err);
    if (rc == 0)
        rc = dsec_bus_request(w->bus, subj, &hdr, b.data, b.len, RECONCILE_TIMEOUT_MS, cb, x, &err);
    dsec_buf_release(&b);
    if (rc < 0)
        inflight_done_locked(w);
    return rc;
}

static void on_reconciled(int status, dsec_msg *reply, const dsec_err *err, void *ud)
{
    struct watched *x = ud;
    dsec_lost *w = x->w;
    bool ok = taken(status, reply);
    pthread_mutex_lock(&w->mu);
    x->reconciling = false;
    if (ok) {
        x->lost_ns = 0; /* it reclaims them; nothing more to ask */
        w->st.reconciled++;
    }
    inflight_done_locked(w);
    pthread_mutex_unlock(&w->mu);
    if (ok)
        dsec_log_info(
            "dsec-scheduler %s: node %s is back and reclaims what its owners were told is lost",
            w->who, x->name);
    else if (status < 0)
        dsec_log_warn(
            "dsec-scheduler %s: node %s is back but did not take the reconcile: %s (asking again)",
            w->who, x->name, err->msg);
}

/* Ask a returned node to reclaim what it made before it was declared lost
 * (w->mu held; the request's answer comes on a bus thread). */
static void reconcile_locked(dsec_lost *w, struct watched *x)
{
    dsec_msg_node_lost nl = {.node = x->name,
                             .cell = w->cell,
                             .lost_ns = x->lost_ns,
                             .silent_ms = x->silent_ms,
                             .by = w->who};
    char subj[160];
    snprintf(subj, sizeof subj, DSEC_SUBJ_RECONCILE, x->name);
    /* not sent: the next report asks again */
    x->reconciling = ask_locked(w, subj, DSEC_MSG_NODE_LOST, &nl, on_reconciled, x) == 0;
}

/* ---- superseded placements ------------------------------------------------------- */

static struct notice *notice_at(dsec_lost *w, uint64_t seq)
{
    return &w->ring[(seq - 1) % DSEC_LOST_NOTICES_MAX];
}

/* Forget notices older than twice lost_after_ms (w->mu held): a node
 * silent that long was declared lost, and its reconcile reclaims more. */
static void expire_locked(dsec_lost *w, uint64_t now_ms)
{
    uint64_t keep = 2ull * w->lost_after_ms;
    while (w->nring > 0) {
        const struct notice *o = notice_at(w, w->next_seq - w->nring);
        if (now_ms <= o->ms || now_ms - o->ms < keep)
            break;
        w->nring--;
    }
}

void dsec_lost_superseded(dsec_lost *w, const char *tenant, const char *req_id, const char *node,
                          uint64_t retry, uint64_t now_ms)
{
    dsec_msg_superseded one = {
        .tenant = tenant, .req_id = req_id, .node = node, .retry = retry, .ts_ns = dsec_wall_ns()};
    pthread_mutex_lock(&w->mu);
    if (w->ring == NULL)
        w->ring = dsec_calloc(DSEC_LOST_NOTICES_MAX, sizeof *w->ring);
    if (w->ring != NULL) {
        expire_locked(w, now_ms);
        if (w->nring == DSEC_LOST_NOTICES_MAX) {
            w->nring--; /* the oldest goes; still young (expire_locked kept it) */
            w->st.overwritten++;
        }
        struct notice *e = notice_at(w, w->next_seq);
        *e = (struct notice){.seq = w->next_seq, .ms = now_ms, .ts_ns = one.ts_ns, .retry = retry};
        snprintf(e->tenant, sizeof e->tenant, "%s", tenant);
        snprintf(e->req_id, sizeof e->req_id, "%s", req_id);
        snprintf(e->node, sizeof e->node, "%s", node);
        w->next_seq++;
        w->nring++;
    }
    w->st.superseded++;
    pthread_mutex_unlock(&w->mu);
    /* the live nodes hear it at once; a silent one again when it returns */
    dsec_msg_superseded_list l = {.by = w->who, .items = {.items = &one, .n = 1}};
    char subj[160];
    snprintf(subj, sizeof subj, DSEC_SUBJ_SUPERSEDED, w->cell);
    dsec_err err;
    dsec_wire_send(NULL, w->bus, subj, NULL, DSEC_MSG_SUPERSEDED_LIST, &l, req_id, &err);
}

static void resend_locked(dsec_lost *w, struct watched *x);

static void on_resent(int status, dsec_msg *reply, const dsec_err *err, void *ud)
{
    struct watched *x = ud;
    dsec_lost *w = x->w;
    bool ok = taken(status, reply);
    pthread_mutex_lock(&w->mu);
    x->resending = false;
    if (ok) {
        w->st.resent += x->sent_upto - x->sent_from;
        if (x->resend_seq == x->sent_from) /* not moved back by a newer silence meanwhile */
            x->resend_seq = x->sent_upto;
        if (x->resend_seq >= w->next_seq)
            x->resend_seq = 0;
        else
            resend_locked(w, x); /* more than one batch */
    }
    inflight_done_locked(w);
    pthread_mutex_unlock(&w->mu);
    if (!ok && status < 0)
        dsec_log_warn(
            "dsec-scheduler %s: node %s did not take the retried creates placed elsewhere: %s "
            "(sending again on its next report)",
            w->who, x->name, err->msg);
}

/* Send a returned node the notices from x->resend_seq on, one batch per
 * request (w->mu held; the answer comes on a bus thread). */
static void resend_locked(dsec_lost *w, struct watched *x)
{
    if (w->ring == NULL || x->resending)
        return;
    uint64_t oldest = w->next_seq - w->nring;
    if (x->resend_seq < oldest)
        x->resend_seq = oldest; /* the older ones are gone: expired, or overwritten and counted */
    if (x->resend_seq >= w->next_seq) {
        x->resend_seq = 0;
        return;
    }
    uint64_t upto = w->next_seq;
    if (upto - x->resend_seq > RESEND_BATCH)
        upto = x->resend_seq + RESEND_BATCH;
    dsec_msg_superseded *items = dsec_calloc((size_t)(upto - x->resend_seq), sizeof *items);
    if (items == NULL)
        return; /* the next report tries again */
    size_t k = 0;
    for (uint64_t q = x->resend_seq; q < upto; q++) {
        const struct notice *e = notice_at(w, q);
        items[k++] = (dsec_msg_superseded){.tenant = e->tenant,
                                           .req_id = e->req_id,
                                           .node = e->node,
                                           .retry = e->retry,
                                           .ts_ns = e->ts_ns};
    }
    dsec_msg_superseded_list l = {.by = w->who, .items = {.items = items, .n = k}};
    char subj[192];
    snprintf(subj, sizeof subj, DSEC_SUBJ_SUPERSEDED_NODE, w->cell, x->name);
    x->sent_from = x->resend_seq;
    x->sent_upto = upto;
    /* not sent: the next report sends again */
    x->resending = ask_locked(w, subj, DSEC_MSG_SUPERSEDED_LIST, &l, on_resent, x) == 0;
    dsec_free(items);
}

/* x spoke after gap_ms or more of silence (w->mu held): it may have missed
 * the notices recorded since it last spoke (and a little before, for the
 * reports in flight then). */
static void after_silence_locked(dsec_lost *w, struct watched *x, uint64_t last_ms, uint64_t now_ms)
{
    if (w->ring == NULL)
        return;
    expire_locked(w, now_ms);
    uint64_t since = last_ms > w->gap_ms ? last_ms - w->gap_ms : 0;
    for (uint64_t q = w->next_seq - w->nring; q < w->next_seq; q++)
        if (notice_at(w, q)->ms >= since) {
            if (x->resend_seq == 0 || q < x->resend_seq)
                x->resend_seq = q;
            break;
        }
}

/* ---- node reports ------------------------------------------------------------------ */

void dsec_lost_seen(dsec_lost *w, const char *node, bool full, const dsec_msg_usage *usage,
                    size_t nusage, uint64_t conn, uint64_t now_ms)
{
    pthread_mutex_lock(&w->mu);
    struct watched *x = find_locked(w, node, true);
    if (x == NULL) {
        pthread_mutex_unlock(&w->mu);
        return;
    }
    if (x->last_ms != 0 && now_ms > x->last_ms && now_ms - x->last_ms >= w->gap_ms)
        after_silence_locked(w, x, x->last_ms, now_ms);
    if (conn != 0) {
        /* restarted or reconnected: heartbeats may have come since, so the
         * notices it may have missed start before its last report of before */
        if (x->conn != 0 && conn != x->conn)
            after_silence_locked(w, x, x->conn_ms, now_ms);
        x->conn = conn;
        x->conn_ms = now_ms;
    }
    x->last_ms = now_ms;
    if (full) {
        tenants_free(x);
        x->tenants = nusage ? dsec_calloc(nusage, sizeof *x->tenants) : NULL;
        for (size_t i = 0; x->tenants && i < nusage; i++) {
            bool dup = false; /* one entry per tenant, however many projects */
            for (size_t j = 0; j < x->ntenants && !dup; j++)
                dup = strcmp(x->tenants[j], usage[i].tenant) == 0;
            if (!dup && (x->tenants[x->ntenants] = dsec_strdup(usage[i].tenant)) != NULL)
                x->ntenants++;
        }
    }
    if (x->lost_ns != 0 && !x->reconciling)
        reconcile_locked(w, x);
    if (x->resend_seq != 0 && !x->resending)
        resend_locked(w, x);
    pthread_mutex_unlock(&w->mu);
}

void dsec_lost_tick(dsec_lost *w, uint64_t now_ms)
{
    enum { MAX_AT_ONCE = 64 };
    struct {
        char name[DSEC_NAME_LEN_MAX + 1];
        char **tenants;
        size_t ntenants;
        uint64_t silent_ms, lost_ns;
    } lost[MAX_AT_ONCE];
    size_t k = 0;
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < w->nb && k < MAX_AT_ONCE; i++)
        for (struct watched *x = w->b[i]; x && k < MAX_AT_ONCE; x = x->next) {
            /* last_ms may be later than now_ms: a report handled since the caller
             * read the clock */
            if (x->lost_ns != 0 || now_ms <= x->last_ms || now_ms - x->last_ms < w->lost_after_ms)
                continue;
            x->lost_ns = dsec_wall_ns();
            x->silent_ms = now_ms - x->last_ms;
            w->st.declared++;
            snprintf(lost[k].name, sizeof lost[k].name, "%s", x->name);
            /* the tenants go with the event; the node starts afresh if it returns */
            lost[k].tenants = x->tenants;
            lost[k].ntenants = x->ntenants;
            lost[k].silent_ms = x->silent_ms;
            lost[k].lost_ns = x->lost_ns;
            x->tenants = NULL;
            x->ntenants = 0;
            k++;
        }
    pthread_mutex_unlock(&w->mu);
    for (size_t i = 0; i < k; i++) {
        dsec_msg_node_lost nl = {.node = lost[i].name,
                                 .cell = w->cell,
                                 .lost_ns = lost[i].lost_ns,
                                 .silent_ms = lost[i].silent_ms,
                                 .by = w->who};
        char subj[192];
        dsec_err err;
        dsec_log_warn("dsec-scheduler %s: node %s silent for %" PRIu64
                      " ms: declared lost; telling %zu tenant(s)",
                      w->who, lost[i].name, lost[i].silent_ms, lost[i].ntenants);
        /* names are checked where they enter, so every subject fits */
        if (snprintf(subj, sizeof subj, DSEC_SUBJ_EVT_OF, w->cell, "lost", lost[i].name) <
            (int)sizeof subj)
            dsec_wire_send(NULL, w->bus, subj, NULL, DSEC_MSG_NODE_LOST, &nl, NULL, &err);
        for (size_t t = 0; t < lost[i].ntenants; t++) {
            if (snprintf(subj, sizeof subj, DSEC_SUBJ_EVT_LOST, lost[i].tenants[t]) <
                (int)sizeof subj)
                dsec_wire_send(NULL, w->bus, subj, NULL, DSEC_MSG_NODE_LOST, &nl, NULL, &err);
            dsec_free(lost[i].tenants[t]);
        }
        dsec_free(lost[i].tenants);
    }
}

void dsec_lost_stats_get(dsec_lost *w, dsec_lost_stats *out)
{
    pthread_mutex_lock(&w->mu);
    *out = w->st;
    pthread_mutex_unlock(&w->mu);
}
