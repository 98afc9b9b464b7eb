/* quota.c - the quota actor: tenant and project limits from KV, usage from the nodes' reports,
 * admission in one mailbox. */
#include "actors/quota.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/subjects.h"
#include "runtime/lease.h"
#include "runtime/ticker.h"
#include "actors/wire.h"
#include "bus/js.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/log.h"
#include "dsec/names.h"

/* Sandboxes, milli-CPU, MiB. Signed so a count never wraps when a report
 * and an event disagree for a moment; shown clamped at 0. */
struct res {
    int64_t n, cpu, mem;
};

/* One entry of a string-keyed map. The maps hold different things; each
 * uses the fields its comment names. */
struct ent {
    struct ent *next; /* hash chain */
    char *key;        /* owned */
    struct res r;     /* use: what the prefix holds; held: a node's share; pending: the admission */
    uint64_t lim_n, lim_cpu, lim_mem; /* defs: the limits (0: none of its own) */
    struct map *held;                 /* nodes: what each (tenant/project) holds there */
    uint64_t last_full_ms;            /* nodes: its last full report */
    char *usekey;                     /* pending: "tenant[/project]" it counts against */
    uint64_t deadline_ms;             /* pending: given back then */
    struct ent *older, *newer;        /* pending: in admission order */
};

struct map {
    struct ent **b;
    size_t nb, n;
};

struct dsec_quota {
    dsec_bus *bus;
    dsec_quota_conf conf;
    char cell[DSEC_NAME_LEN_MAX + 1];
    char bucket[64];
    dsec_js *js;
    dsec_kv_bucket *kv, *lease_kv;
    dsec_actor *actor; /* events and definition changes: every instance */
    dsec_actor *ops;   /* admit, set, get, list: only while the lease is ours */
    dsec_lease lease;  /* stepped by the ticker thread only */
    char name[DSEC_NAME_LEN_MAX + 1];
    dsec_ticker *ticker;
    pthread_mutex_t mu;      /* everything below */
    pthread_mutex_t defs_mu; /* one writer of definitions at a time: a set, a reload */
    struct map defs, use, nodes, pending;
    struct ent *oldest, *newest; /* pending, by admission */
    uint64_t ready_ms;           /* usage is complete from then on */
    uint64_t next_reload_ms;
    dsec_quota_stats st;
};

static uint64_t now_ms(void)
{
    return dsec_now_ns() / 1000000ull;
}

/* ---- the maps ------------------------------------------------------------------- */

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h ^ (h >> 29);
}

static struct ent *map_get(const struct map *m, const char *key)
{
    if (m->nb == 0)
        return NULL;
    for (struct ent *e = m->b[hash(key) % m->nb]; e; e = e->next)
        if (strcmp(e->key, key) == 0)
            return e;
    return NULL;
}

static void ent_free(struct ent *e);

static void map_clear(struct map *m)
{
    for (size_t i = 0; i < m->nb; i++)
        for (struct ent *e = m->b[i], *nx; e; e = nx) {
            nx = e->next;
            ent_free(e);
        }
    dsec_free(m->b);
    *m = (struct map){0};
}

static void ent_free(struct ent *e)
{
    if (e->held) {
        map_clear(e->held);
        dsec_free(e->held);
    }
    dsec_free(e->usekey);
    dsec_free(e->key);
    dsec_free(e);
}

/* The entry for key, made (zeroed) when absent; NULL only when memory ran out. */
static struct ent *map_put(struct map *m, const char *key)
{
    struct ent *e = map_get(m, key);
    if (e != NULL)
        return e;
    if (m->n >= m->nb * 2) {
        size_t nb = m->nb ? m->nb * 4 : 64;
        struct ent **b = dsec_calloc(nb, sizeof *b);
        if (b == NULL)
            return NULL;
        for (size_t i = 0; i < m->nb; i++)
            for (struct ent *x = m->b[i], *nx; x; x = nx) {
                nx = x->next;
                x->next = b[hash(x->key) % nb];
                b[hash(x->key) % nb] = x;
            }
        dsec_free(m->b);
        m->b = b;
        m->nb = nb;
    }
    e = dsec_calloc(1, sizeof *e);
    if (e == NULL || (e->key = dsec_strdup(key)) == NULL) {
        dsec_free(e);
        return NULL;
    }
    size_t i = hash(key) % m->nb;
    e->next = m->b[i];
    m->b[i] = e;
    m->n++;
    return e;
}

/* Unlink key's entry and return it (the caller frees it), or NULL. */
static struct ent *map_take(struct map *m, const char *key)
{
    if (m->nb == 0)
        return NULL;
    for (struct ent **pp = &m->b[hash(key) % m->nb]; *pp; pp = &(*pp)->next)
        if (strcmp((*pp)->key, key) == 0) {
            struct ent *e = *pp;
            *pp = e->next;
            m->n--;
            return e;
        }
    return NULL;
}

/* ---- counting -------------------------------------------------------------------- */

/* "tenant" or "tenant/project" into buf. */
static const char *use_key(char *buf, size_t n, const char *tenant, const char *project)
{
    if (project != NULL && project[0])
        snprintf(buf, n, "%s/%s", tenant, project);
    else
        snprintf(buf, n, "%s", tenant);
    return buf;
}

/* Add r (times sign) to key and to every prefix of it: what a project holds
 * counts against each of its parents and its tenant. */
/* Each level of key in turn, the tenant first ("t", "t/p", "t/p/q"), into buf: *at starts at
 * 0; false once there is none left. */
static bool next_level(const char *key, size_t *at, char *buf, size_t n)
{
    size_t len = strlen(key);
    if (*at > len)
        return false;
    const char *slash = strchr(key + *at, '/');
    size_t end = slash != NULL ? (size_t)(slash - key) : len;
    snprintf(buf, n, "%.*s", (int)end, key);
    *at = end + 1;
    return true;
}

static void use_add(dsec_quota *q, const char *key, struct res r, int sign)
{
    char buf[2 * DSEC_NAME_LEN_MAX + 2];
    for (size_t at = 0; next_level(key, &at, buf, sizeof buf);) {
        struct ent *e = map_put(&q->use, buf);
        if (e != NULL) {
            e->r.n += sign * r.n;
            e->r.cpu += sign * r.cpu;
            e->r.mem += sign * r.mem;
        }
    }
}

static struct ent *node_of(dsec_quota *q, const char *node)
{
    struct ent *nd = map_put(&q->nodes, node);
    if (nd != NULL && nd->held == NULL)
        nd->held = dsec_calloc(1, sizeof *nd->held);
    return nd && nd->held ? nd : NULL;
}

/* A node's share changes by r (sign +1/-1); what it gives back never goes
 * below what it held, so a stray event cannot make room that is not there. */
static void node_apply(dsec_quota *q, const char *node, const char *key, struct res r, int sign)
{
    struct ent *nd = node_of(q, node);
    struct ent *h = nd ? map_put(nd->held, key) : NULL;
    if (h == NULL)
        return;
    if (sign < 0) {
        r.n = r.n < h->r.n ? r.n : h->r.n;
        r.cpu = r.cpu < h->r.cpu ? r.cpu : h->r.cpu;
        r.mem = r.mem < h->r.mem ? r.mem : h->r.mem;
    }
    h->r.n += sign * r.n;
    h->r.cpu += sign * r.cpu;
    h->r.mem += sign * r.mem;
    use_add(q, key, r, sign);
}

/* Forget what node holds (its report replaces it, or it went silent). */
static void node_forget(dsec_quota *q, struct ent *nd)
{
    for (size_t i = 0; i < nd->held->nb; i++)
        for (struct ent *h = nd->held->b[i]; h; h = h->next)
            use_add(q, h->key, h->r, -1);
    map_clear(nd->held);
}

static void pending_unlink(dsec_quota *q, struct ent *p)
{
    if (p->older)
        p->older->newer = p->newer;
    else
        q->oldest = p->newer;
    if (p->newer)
        p->newer->older = p->older;
    else
        q->newest = p->older;
}

static void pending_drop(dsec_quota *q, const char *tenant, const char *req_id)
{
    char key[DSEC_NAME_LEN_MAX + 70];
    snprintf(key, sizeof key, "%s\x1f%s", tenant, req_id);
    struct ent *p = map_take(&q->pending, key);
    if (p == NULL)
        return;
    pending_unlink(q, p);
    use_add(q, p->usekey, p->r, -1);
    ent_free(p);
}

/* One sandbox of an admission appeared: it now counts on its node, so the
 * admission holds that much less (a fork's admission covers its children,
 * each counted off by its own event). */
static void pending_consume(dsec_quota *q, const char *tenant, const char *req_id, struct res r)
{
    char key[DSEC_NAME_LEN_MAX + 70];
    snprintf(key, sizeof key, "%s\x1f%s", tenant, req_id);
    struct ent *p = map_get(&q->pending, key);
    if (p == NULL)
        return;
    if (p->r.n <= r.n) {
        pending_drop(q, tenant, req_id);
        return;
    }
    r.cpu = r.cpu < p->r.cpu ? r.cpu : p->r.cpu;
    r.mem = r.mem < p->r.mem ? r.mem : p->r.mem;
    p->r.n -= r.n;
    p->r.cpu -= r.cpu;
    p->r.mem -= r.mem;
    use_add(q, p->usekey, r, -1);
}

/* ---- definitions ------------------------------------------------------------------- */

static void def_set(struct map *defs, const dsec_msg_quota *d)
{
    char key[2 * DSEC_NAME_LEN_MAX + 2];
    struct ent *e = map_put(defs, use_key(key, sizeof key, d->tenant, d->project));
    if (e != NULL) {
        e->lim_n = d->sandboxes;
        e->lim_cpu = d->cpu_milli;
        e->lim_mem = d->memory_mb;
    }
}

/* Read one definition from KV into defs (removing it when absent). */
static int def_load(dsec_quota *q, struct map *defs, const char *key, dsec_err *err)
{
    char *val = NULL;
    size_t len = 0;
    uint64_t rev;
    if (dsec_kv_get(q->kv, key, &val, &len, &rev, err) < 0) {
        if (err->code != DSEC_E_NOT_FOUND)
            return -1;
        struct ent *gone = map_take(defs, key);
        if (gone)
            ent_free(gone);
        return 0;
    }
    dsec_msg_quota d;
    int rc = dsec_decode(dsec_wire_decoder(), DSEC_MSG_QUOTA, val, len, &d, err);
    if (rc == 0)
        def_set(defs, &d);
    else
        dsec_err_wrap(err, "quota definition %s in bucket %s", key, q->bucket);
    dsec_free(val);
    return rc;
}

/* Every definition, afresh: what other cells changed while a notice was lost. */
static int defs_reload(dsec_quota *q, dsec_err *err)
{
    char **keys = NULL;
    size_t nk = 0;
    pthread_mutex_lock(&q->defs_mu);
    if (dsec_kv_keys(q->kv, &keys, &nk, err) < 0) {
        pthread_mutex_unlock(&q->defs_mu);
        return -1;
    }
    struct map fresh = {0};
    int rc = 0;
    for (size_t i = 0; i < nk && rc == 0; i++)
        rc = def_load(q, &fresh, keys[i], err);
    dsec_kv_keys_free(keys, nk);
    if (rc == 0) {
        pthread_mutex_lock(&q->mu);
        struct map old = q->defs;
        q->defs = fresh;
        q->st.definitions = fresh.n;
        pthread_mutex_unlock(&q->mu);
        map_clear(&old);
    } else {
        map_clear(&fresh);
    }
    pthread_mutex_unlock(&q->defs_mu);
    return rc;
}

static const char *label(char *buf, size_t n, const char *key)
{
    const char *slash = strchr(key, '/');
    if (slash == NULL)
        snprintf(buf, n, "tenant %s", key);
    else
        snprintf(buf, n, "project %s", key);
    return buf;
}

/* ---- admission ----------------------------------------------------------------------- */

/* 0 when need fits under every defined level of key, else -1 with err
 * naming the level and the limit (q->mu held). */
static int fits_locked(dsec_quota *q, const char *key, struct res need, dsec_err *err)
{
    char buf[2 * DSEC_NAME_LEN_MAX + 2];
    for (size_t at = 0; next_level(key, &at, buf, sizeof buf);) {
        const struct ent *d = map_get(&q->defs, buf);
        const struct ent *u = map_get(&q->use, buf);
        struct res used = u ? u->r : (struct res){0};
        char who[2 * DSEC_NAME_LEN_MAX + 16];
        if (d != NULL) {
            const char *what = NULL;
            int64_t have = 0, lim = 0, want = 0;
            if (d->lim_n && used.n + need.n > (int64_t)d->lim_n)
                what = "sandboxes", have = used.n, lim = (int64_t)d->lim_n, want = need.n;
            else if (d->lim_cpu && used.cpu + need.cpu > (int64_t)d->lim_cpu)
                what = "milli-CPU", have = used.cpu, lim = (int64_t)d->lim_cpu, want = need.cpu;
            else if (d->lim_mem && used.mem + need.mem > (int64_t)d->lim_mem)
                what = "MiB of memory", have = used.mem, lim = (int64_t)d->lim_mem, want = need.mem;
            if (what != NULL)
                return dsec_err_set(
                    err, DSEC_E_QUOTA, 0,
                    "%s uses %" PRId64 " of its %" PRId64 " %s in cell %s; this create "
                    "needs %" PRId64 " more",
                    label(who, sizeof who, buf), have > 0 ? have : 0, lim, what, q->cell, want);
        }
    }
    return 0;
}

static bool defined_locked(dsec_quota *q, const char *key)
{
    char buf[2 * DSEC_NAME_LEN_MAX + 2];
    snprintf(buf, sizeof buf, "%s", key);
    for (char *p = buf + strlen(buf);; p--) {
        if (*p == '/' || *p == '\0') {
            *p = '\0';
            if (map_get(&q->defs, buf))
                return true;
        }
        if (p == buf)
            return false;
    }
}

/* dsec.v1.ctl.quota.<cell>.admit */
static void on_admit(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_quota *q = ud;
    dsec_err err;
    dsec_msg_admit ad;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_ADMIT))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_ADMIT, dsec_msg_data(m), dsec_msg_len(m), &ad,
                    &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    if (dsec_name_ok(ad.tenant, DSEC_NAME_LEN_MAX) < 0 ||
        (ad.project && ad.project[0] && dsec_project_ok(ad.project, DSEC_NAME_LEN_MAX) < 0)) {
        dsec_err_set(
            &err, DSEC_E_INVALID, 0,
            "admit: tenant and project must be names of [A-Za-z0-9_-] (projects joined by '/')");
        dsec_wire_error_field(
            a, m, &err, dsec_name_ok(ad.tenant, DSEC_NAME_LEN_MAX) < 0 ? "tenant" : "project");
        return;
    }
    char key[2 * DSEC_NAME_LEN_MAX + 2];
    use_key(key, sizeof key, ad.tenant, ad.project);
    char pkey[DSEC_NAME_LEN_MAX + 70];
    snprintf(pkey, sizeof pkey, "%s\x1f%s", ad.tenant, ad.req_id);
    pthread_mutex_lock(&q->mu);
    if (ad.release) {
        if (map_get(&q->pending, pkey)) {
            pending_drop(q, ad.tenant, ad.req_id);
            q->st.released++;
        }
        q->st.pending = q->pending.n;
        pthread_mutex_unlock(&q->mu);
        dsec_wire_reply(a, m, DSEC_MSG_ADMIT, &ad, &err);
        return;
    }
    uint64_t now = now_ms();
    int rc = 0;
    if (map_get(&q->pending, pkey) != NULL) {
        rc = 0; /* a repeat of an admission in flight: admitted once */
    } else if (!defined_locked(q, key)) {
        /* no limit anywhere above it: nothing to hold in flight (its sandboxes are
         * still counted from the nodes, should a quota be set later) */
        q->st.admitted++;
    } else {
        uint64_t n = ad.n ? ad.n : 1;
        struct res need = {(int64_t)n, (int64_t)(n * ad.cpu_milli), (int64_t)(n * ad.memory_mb)};
        if (now < q->ready_ms && defined_locked(q, key))
            rc = dsec_err_set(&err, DSEC_E_QUOTA, 0,
                              "the quota actor of cell %s is still counting what tenant %s uses "
                              "(ready in %" PRIu64 " ms); retry",
                              q->cell, ad.tenant, q->ready_ms - now);
        else
            rc = fits_locked(q, key, need, &err);
        struct ent *p = rc == 0 ? map_put(&q->pending, pkey) : NULL;
        if (rc == 0 && (p == NULL || (p->usekey = dsec_strdup(key)) == NULL)) {
            if (p)
                ent_free(map_take(&q->pending, pkey));
            rc = dsec_err_set(&err, DSEC_E_NOMEM, 0, "admit: out of memory");
        }
        if (rc == 0) {
            p->r = need;
            p->deadline_ms = now + q->conf.pending_ms;
            p->older = q->newest;
            if (q->newest)
                q->newest->newer = p;
            else
                q->oldest = p;
            q->newest = p;
            use_add(q, key, need, +1);
            q->st.admitted++;
        } else if (err.code == DSEC_E_QUOTA) {
            q->st.refused++;
        }
    }
    q->st.pending = q->pending.n;
    pthread_mutex_unlock(&q->mu);
    if (rc == 0)
        dsec_wire_reply(a, m, DSEC_MSG_ADMIT, &ad, &err);
    else
        dsec_wire_error(a, m, &err);
}

/* ---- what the nodes say ------------------------------------------------------------- */

static void on_events(dsec_quota *q, dsec_msg *m)
{
    dsec_msg_sandbox_events b;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_SANDBOX_EVENTS, dsec_msg_data(m), dsec_msg_len(m),
                    &b, &err) < 0) {
        dsec_actor_count_error(q->actor);
        return;
    }
    const dsec_msg_sandbox_event *ev = b.events.items;
    pthread_mutex_lock(&q->mu);
    for (uint32_t i = 0; i < b.events.n; i++) {
        const dsec_msg_sandbox_event *e = &ev[i];
        if (e->tenant == NULL || e->prev == NULL)
            continue;
        char key[2 * DSEC_NAME_LEN_MAX + 2];
        use_key(key, sizeof key, e->tenant, e->project);
        struct res r = {1, (int64_t)e->cpu_milli, (int64_t)e->memory_mb};
        /* the node counts a sandbox from its first transition to its end */
        if (strcmp(e->prev, "requested") == 0) {
            node_apply(q, b.node, key, r, +1);
            if (e->req_id != NULL)
                pending_consume(q, e->tenant, e->req_id, r);
        }
        if (strcmp(e->state, "gone") == 0 || strcmp(e->state, "failed") == 0)
            node_apply(q, b.node, key, r, -1);
    }
    q->st.pending = q->pending.n;
    pthread_mutex_unlock(&q->mu);
}

static void on_capacity(dsec_quota *q, dsec_msg *m)
{
    dsec_msg_capacity c;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CAPACITY, dsec_msg_data(m), dsec_msg_len(m), &c,
                    &err) < 0) {
        dsec_actor_count_error(q->actor);
        return;
    }
    if (!c.full)
        return;
    pthread_mutex_lock(&q->mu);
    struct ent *nd = node_of(q, c.node);
    if (nd != NULL) {
        node_forget(q, nd);
        const dsec_msg_usage *u = c.usage.items;
        for (uint32_t i = 0; i < c.usage.n; i++) {
            char key[2 * DSEC_NAME_LEN_MAX + 2];
            use_key(key, sizeof key, u[i].tenant, u[i].project);
            struct res r = {(int64_t)u[i].sandboxes, (int64_t)u[i].cpu_milli,
                            (int64_t)u[i].memory_mb};
            node_apply(q, c.node, key, r, +1);
        }
        nd->last_full_ms = now_ms();
    }
    q->st.nodes = q->nodes.n;
    pthread_mutex_unlock(&q->mu);
}

/* dsec.v1.ctl.evt.<cell>.>: one subscription, so a node's events and its
 * reports are handled in the order it sent them. */
static void on_evt(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_quota *q = ud;
    const char *s = dsec_msg_subject(m) + strlen(DSEC_SUBJ_EVT_PREFIX) + strlen(q->cell) + 1;
    size_t n = strlen(s);
    /* an event of another Dsec-Type is dropped (counted by dsec_wire_type_ok) */
    if (strncmp(s, "sbx.", 4) == 0) {
        if (dsec_wire_type_ok(a, m, DSEC_MSG_SANDBOX_EVENTS))
            on_events(q, m);
    } else if (strncmp(s, "node.", 5) == 0 && n > 9 && strcmp(s + n - 9, ".capacity") == 0) {
        if (dsec_wire_type_ok(a, m, DSEC_MSG_CAPACITY))
            on_capacity(q, m);
    }
}

/* ---- definitions over the bus ---------------------------------------------------------- */

static void fill_usage_locked(dsec_quota *q, const char *key, dsec_msg_quota *d)
{
    const struct ent *u = map_get(&q->use, key);
    if (u != NULL) {
        d->used_sandboxes = u->r.n > 0 ? (uint64_t)u->r.n : 0;
        d->used_cpu_milli = u->r.cpu > 0 ? (uint64_t)u->r.cpu : 0;
        d->used_memory_mb = u->r.mem > 0 ? (uint64_t)u->r.mem : 0;
    }
}

static void to_msg(const struct ent *e, char *tenant, char *project, dsec_msg_quota *d)
{
    const char *slash = strchr(e->key, '/');
    size_t tl = slash ? (size_t)(slash - e->key) : strlen(e->key);
    snprintf(tenant, DSEC_NAME_LEN_MAX + 1, "%.*s", (int)tl, e->key);
    snprintf(project, DSEC_NAME_LEN_MAX + 1, "%s", slash ? slash + 1 : "");
    *d = (dsec_msg_quota){.tenant = tenant,
                          .project = slash ? project : NULL,
                          .sandboxes = e->lim_n,
                          .cpu_milli = e->lim_cpu,
                          .memory_mb = e->lim_mem};
}

/* The quota field a delegation error is about. */
static const char *limit_field(const char *what)
{
    return what[0] == 's'                     ? "sandboxes"
           : what[0] == 'm' && what[1] == 'i' ? "cpu_milli"
                                              : "memory_mb";
}

/* Whether d (key) stays within its parents and above its children (q->mu held).
 * An invalid d names its offending field in *field. */
static int check_delegation_locked(dsec_quota *q, const char *key, const dsec_msg_quota *d,
                                   const char **field, dsec_err *err)
{
    char buf[2 * DSEC_NAME_LEN_MAX + 2], who[2 * DSEC_NAME_LEN_MAX + 16],
        me[2 * DSEC_NAME_LEN_MAX + 16];
    label(me, sizeof me, key);
    snprintf(buf, sizeof buf, "%s", key);
    char *slash = strrchr(buf, '/');
    if (slash != NULL) {
        *slash = '\0';
        const struct ent *parent = map_get(&q->defs, buf);
        if (parent == NULL)
            return dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "%s: define its parent %s first", me,
                                label(who, sizeof who, buf));
        /* every defined ancestor bounds it, not only the nearest */
        for (;;) {
            const struct ent *an = map_get(&q->defs, buf);
            const char *what = NULL;
            uint64_t mine = 0, theirs = 0;
            if (an && an->lim_n && (d->sandboxes == 0 || d->sandboxes > an->lim_n))
                what = "sandboxes", mine = d->sandboxes, theirs = an->lim_n;
            else if (an && an->lim_cpu && (d->cpu_milli == 0 || d->cpu_milli > an->lim_cpu))
                what = "milli-CPU", mine = d->cpu_milli, theirs = an->lim_cpu;
            else if (an && an->lim_mem && (d->memory_mb == 0 || d->memory_mb > an->lim_mem))
                what = "MiB of memory", mine = d->memory_mb, theirs = an->lim_mem;
            if (what != NULL) {
                *field = limit_field(what);
                if (mine == 0)
                    return dsec_err_set(err, DSEC_E_INVALID, 0,
                                        "%s: its %s must be limited: %s allows only %" PRIu64, me,
                                        what, label(who, sizeof who, buf), theirs);
                return dsec_err_set(err, DSEC_E_INVALID, 0,
                                    "%s: %" PRIu64 " %s exceeds the %" PRIu64
                                    " of %s it is delegated from",
                                    me, mine, what, theirs, label(who, sizeof who, buf));
            }
            char *s2 = strrchr(buf, '/');
            if (s2 == NULL)
                break;
            *s2 = '\0';
        }
    }
    /* its sub-projects must still fit under it */
    size_t kl = strlen(key);
    for (size_t i = 0; i < q->defs.nb; i++)
        for (const struct ent *e = q->defs.b[i]; e; e = e->next) {
            if (strncmp(e->key, key, kl) != 0 || e->key[kl] != '/')
                continue;
            const char *what = NULL;
            uint64_t theirs = 0, mine = 0;
            if (d->sandboxes && (e->lim_n == 0 || e->lim_n > d->sandboxes))
                what = "sandboxes", theirs = e->lim_n, mine = d->sandboxes;
            else if (d->cpu_milli && (e->lim_cpu == 0 || e->lim_cpu > d->cpu_milli))
                what = "milli-CPU", theirs = e->lim_cpu, mine = d->cpu_milli;
            else if (d->memory_mb && (e->lim_mem == 0 || e->lim_mem > d->memory_mb))
                what = "MiB of memory", theirs = e->lim_mem, mine = d->memory_mb;
            if (what != NULL) {
                *field = limit_field(what);
                return dsec_err_set(err, DSEC_E_INVALID, 0,
                                    "%s: %" PRIu64 " %s is below what its sub-project %s has (%s); "
                                    "lower that first",
                                    me, mine, what, e->key + 0,
                                    theirs ? "a larger limit" : "no limit of its own");
            }
        }
    return 0;
}

static bool has_children_locked(dsec_quota *q, const char *key)
{
    size_t kl = strlen(key);
    for (size_t i = 0; i < q->defs.nb; i++)
        for (const struct ent *e = q->defs.b[i]; e; e = e->next)
            if (strncmp(e->key, key, kl) == 0 && e->key[kl] == '/')
                return true;
    return false;
}

static int quota_names_ok(const dsec_msg_quota *d, dsec_err *err)
{
    if (dsec_name_ok(d->tenant, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "tenant \"%.64s\": 1-64 characters of [A-Za-z0-9_-]", d->tenant);
    if (d->project && d->project[0] && dsec_project_ok(d->project, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "project \"%.64s\": names of [A-Za-z0-9_-] joined by '/', at most 64 "
                            "characters and %d deep",
                            d->project, DSEC_PROJECT_DEPTH_MAX);
    return 0;
}

/* A quota message with valid names, decoded from m; otherwise the error is
 * answered and -1 returned. */
static int quota_decode(dsec_actor *a, dsec_msg *m, dsec_msg_quota *d)
{
    dsec_err err;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_QUOTA))
        return -1;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_QUOTA, dsec_msg_data(m), dsec_msg_len(m), d,
                    &err) < 0) {
        dsec_wire_error(a, m, &err);
        return -1;
    }
    if (quota_names_ok(d, &err) < 0) {
        dsec_wire_error_field(
            a, m, &err, dsec_name_ok(d->tenant, DSEC_NAME_LEN_MAX) < 0 ? "tenant" : "project");
        return -1;
    }
    return 0;
}

/* dsec.v1.ctl.quota.<cell>.set: define, change or (remove) delete one level. */
static void on_set(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_quota *q = ud;
    dsec_err err;
    dsec_msg_quota d;
    if (quota_decode(a, m, &d) < 0)
        return;
    char key[2 * DSEC_NAME_LEN_MAX + 2], who[2 * DSEC_NAME_LEN_MAX + 16];
    use_key(key, sizeof key, d.tenant, d.project);
    pthread_mutex_lock(&q->defs_mu);
    pthread_mutex_lock(&q->mu);
    int rc = 0;
    const char *field = NULL;
    if (d.remove) {
        if (map_get(&q->defs, key) == NULL)
            rc = dsec_err_set(&err, DSEC_E_NOT_FOUND, 0, "%s is not defined",
                              label(who, sizeof who, key));
        else if (has_children_locked(q, key))
            rc = dsec_err_set(&err, DSEC_E_STATE, 0, "%s has sub-projects: remove them first",
                              label(who, sizeof who, key));
    } else {
        rc = check_delegation_locked(q, key, &d, &field, &err);
    }
    pthread_mutex_unlock(&q->mu);
    if (rc == 0) {
        dsec_msg_quota stored = {.tenant = d.tenant,
                                 .project = d.project && d.project[0] ? d.project : NULL,
                                 .sandboxes = d.sandboxes,
                                 .cpu_milli = d.cpu_milli,
                                 .memory_mb = d.memory_mb};
        dsec_buf b;
        dsec_buf_init(&b);
        if (d.remove)
            rc = dsec_kv_delete(q->kv, key, &err);
        else if ((rc = dsec_encode(&b, DSEC_MSG_QUOTA, &stored, &err)) == 0)
            rc = dsec_kv_put(q->kv, key, b.data, b.len, NULL, &err);
        dsec_buf_release(&b);
        if (rc == 0) {
            pthread_mutex_lock(&q->mu);
            if (d.remove) {
                struct ent *gone = map_take(&q->defs, key);
                if (gone)
                    ent_free(gone);
            } else {
                def_set(&q->defs, &stored);
            }
            q->st.definitions = q->defs.n;
            fill_usage_locked(q, key, &stored);
            pthread_mutex_unlock(&q->mu);
            /* the other cells' quota actors read it now, not at their next reload */
            dsec_wire_send(a, q->bus, DSEC_SUBJ_QUOTA_CHANGED, NULL, DSEC_MSG_QUOTA, &stored, NULL,
                           &err);
            dsec_wire_reply(a, m, DSEC_MSG_QUOTA, &stored, &err);
        } else {
            dsec_err_wrap(&err, "storing %s in bucket %s", label(who, sizeof who, key), q->bucket);
        }
    }
    pthread_mutex_unlock(&q->defs_mu);
    if (rc < 0)
        dsec_wire_error_field(a, m, &err, err.code == DSEC_E_INVALID ? field : NULL);
}

/* dsec.v1.ctl.quota.changed: a quota actor (of any cell) stored a definition. */
static void on_changed(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_quota *q = ud;
    dsec_err err;
    dsec_msg_quota d;
    if (quota_decode(a, m, &d) < 0) /* counted; an event has nobody to answer */
        return;
    char key[2 * DSEC_NAME_LEN_MAX + 2];
    use_key(key, sizeof key, d.tenant, d.project);
    pthread_mutex_lock(&q->defs_mu);
    struct map one = {0};
    /* read it from KV, the truth, rather than trusting the notice */
    if (def_load(q, &one, key, &err) < 0) {
        dsec_actor_count_error(a);
    } else {
        pthread_mutex_lock(&q->mu);
        struct ent *e = map_get(&one, key);
        if (e != NULL) {
            struct ent *mine = map_put(&q->defs, key);
            if (mine) {
                mine->lim_n = e->lim_n;
                mine->lim_cpu = e->lim_cpu;
                mine->lim_mem = e->lim_mem;
            }
        } else {
            struct ent *gone = map_take(&q->defs, key);
            if (gone)
                ent_free(gone);
        }
        q->st.definitions = q->defs.n;
        pthread_mutex_unlock(&q->mu);
    }
    map_clear(&one);
    pthread_mutex_unlock(&q->defs_mu);
}

/* dsec.v1.ctl.quota.<cell>.get: one definition and what it uses in this cell. */
static void on_get(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_quota *q = ud;
    dsec_err err;
    dsec_msg_quota d;
    if (quota_decode(a, m, &d) < 0)
        return;
    char key[2 * DSEC_NAME_LEN_MAX + 2], who[2 * DSEC_NAME_LEN_MAX + 16];
    char tenant[DSEC_NAME_LEN_MAX + 1], project[DSEC_NAME_LEN_MAX + 1];
    use_key(key, sizeof key, d.tenant, d.project);
    pthread_mutex_lock(&q->mu);
    const struct ent *e = map_get(&q->defs, key);
    dsec_msg_quota out;
    if (e != NULL) {
        to_msg(e, tenant, project, &out);
        fill_usage_locked(q, key, &out);
    }
    pthread_mutex_unlock(&q->mu);
    if (e == NULL) {
        dsec_err_set(&err, DSEC_E_NOT_FOUND, 0, "%s is not defined", label(who, sizeof who, key));
        dsec_wire_error(a, m, &err);
        return;
    }
    dsec_wire_reply(a, m, DSEC_MSG_QUOTA, &out, &err);
}

static int by_key(const void *x, const void *y)
{
    const dsec_msg_quota *a = x, *b = y;
    int c = strcmp(a->tenant, b->tenant);
    if (c != 0)
        return c;
    return strcmp(a->project ? a->project : "", b->project ? b->project : "");
}

/* dsec.v1.ctl.quota.<cell>.list: every definition (of one tenant), sorted. */
static void on_list(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_quota *q = ud;
    dsec_err err;
    dsec_msg_quota_list req;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_QUOTA_LIST))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_QUOTA_LIST, dsec_msg_data(m), dsec_msg_len(m),
                    &req, &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    /* copy out under the lock: names live in arrays next to the items */
    pthread_mutex_lock(&q->mu);
    size_t cap = q->defs.n ? q->defs.n : 1;
    dsec_msg_quota *items = dsec_calloc(cap, sizeof *items);
    char(*names)[2][DSEC_NAME_LEN_MAX + 1] = dsec_calloc(cap, sizeof *names);
    size_t k = 0;
    for (size_t i = 0; items && names && i < q->defs.nb; i++)
        for (const struct ent *e = q->defs.b[i]; e; e = e->next) {
            to_msg(e, names[k][0], names[k][1], &items[k]);
            if (req.tenant && strcmp(req.tenant, items[k].tenant) != 0)
                continue;
            fill_usage_locked(q, e->key, &items[k]);
            k++;
        }
    pthread_mutex_unlock(&q->mu);
    if (items == NULL || names == NULL) {
        dsec_err_set(&err, DSEC_E_NOMEM, 0, "quota list: out of memory");
        dsec_wire_error(a, m, &err);
    } else {
        qsort(items, k, sizeof *items, by_key);
        dsec_msg_quota_list out = {.tenant = req.tenant, .items = {items, (uint32_t)k}};
        if (dsec_wire_reply(a, m, DSEC_MSG_QUOTA_LIST, &out, &err) < 0)
            dsec_wire_error(a, m, &err);
    }
    dsec_free(items);
    dsec_free(names);
}

/* ---- time ---------------------------------------------------------------------------- */

static void on_tick(void *ud, uint64_t now_ns)
{
    dsec_quota *q = ud;
    uint64_t now = now_ns / 1000000ull;
    pthread_mutex_lock(&q->mu);
    /* admissions whose sandbox never appeared: refused, lost, or placed elsewhere */
    while (q->oldest && q->oldest->deadline_ms <= now) {
        struct ent *p = q->oldest;
        pending_unlink(q, p);
        map_take(&q->pending, p->key);
        use_add(q, p->usekey, p->r, -1);
        ent_free(p);
        q->st.expired++;
    }
    q->st.pending = q->pending.n;
    /* a node silent for three report periods holds nothing we can count on:
     * its next full report brings its share back */
    for (size_t i = 0; i < q->nodes.nb; i++)
        for (struct ent *nd = q->nodes.b[i]; nd; nd = nd->next)
            if (nd->held && nd->held->n && nd->last_full_ms &&
                now - nd->last_full_ms > 3ull * q->conf.full_ms)
                node_forget(q, nd);
    bool reload = now >= q->next_reload_ms;
    if (reload)
        q->next_reload_ms = now + q->conf.reload_ms;
    pthread_mutex_unlock(&q->mu);
    dsec_err err;
    if (reload && defs_reload(q, &err) < 0)
        dsec_actor_count_error(q->actor);
}

/* ---- the lease: which instance admits ---------------------------------------------------- */

static const struct {
    const char *op;
    dsec_handler fn;
} OPS[] = {{"admit", on_admit}, {"set", on_set}, {"get", on_get}, {"list", on_list}};

/* The lease is ours: serve admission and definitions on a fresh actor. */
static int ops_start(dsec_quota *q, dsec_err *err)
{
    char name[DSEC_NAME_LEN_MAX + 16], subj[192];
    snprintf(name, sizeof name, "quota-%s-ops", q->cell);
    if (dsec_actor_new(&q->ops, q->bus, name, err) < 0)
        return -1;
    for (size_t i = 0; i < sizeof OPS / sizeof OPS[0]; i++) {
        snprintf(subj, sizeof subj, DSEC_SUBJ_QUOTA, q->cell, OPS[i].op);
        if (dsec_actor_on(q->ops, subj, NULL, OPS[i].fn, q, err) < 0) {
            dsec_actor_free(q->ops);
            q->ops = NULL;
            return -1;
        }
    }
    /* the subscriptions are at the server once this flush returns; with the
     * server away they are made on reconnect instead */
    dsec_err ferr;
    dsec_bus_flush(q->bus, 2000, &ferr);
    return 0;
}

/* Lost (or given up): stop answering. Requests already queued get a
 * retry-safe "closed" answer; the schedulers ask again and reach the new
 * holder. */
static void ops_stop(dsec_quota *q)
{
    dsec_actor_free(q->ops);
    q->ops = NULL;
}

static void lease_tick(void *ud, uint64_t now_ns)
{
    (void)now_ns;
    dsec_quota *q = ud;
    dsec_err err;
    switch (dsec_lease_step(&q->lease, &err)) {
    case DSEC_LEASE_ACQUIRED:
        if (ops_start(q, &err) < 0) {
            dsec_log_warn("dsec-quota %s: cannot serve cell %s: %s; giving the lease up", q->name,
                          q->cell, err.msg);
            dsec_lease_release(&q->lease);
            return;
        }
        pthread_mutex_lock(&q->mu);
        q->st.active = 1;
        q->st.takeovers++;
        pthread_mutex_unlock(&q->mu);
        dsec_log_info("dsec-quota %s: active for cell %s (lease revision %" PRIu64 ")", q->name,
                      q->cell, q->lease.rev);
        break;
    case DSEC_LEASE_LOST:
        dsec_log_warn("dsec-quota %s: lost the lease of cell %s: %s", q->name, q->cell, err.msg);
        ops_stop(q);
        pthread_mutex_lock(&q->mu);
        q->st.active = 0;
        pthread_mutex_unlock(&q->mu);
        break;
    default:
        break;
    }
}

/* ---- start, stop --------------------------------------------------------------------- */

int dsec_quota_start(dsec_quota **out, dsec_bus *bus, const dsec_quota_conf *conf, dsec_err *err)
{
    *out = NULL;
    if (conf == NULL || dsec_name_ok(conf->cell, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "quota: a cell name of [A-Za-z0-9_-] is required");
    dsec_quota *q = dsec_calloc(1, sizeof *q);
    if (q == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    pthread_mutex_init(&q->mu, NULL);
    pthread_mutex_init(&q->defs_mu, NULL);
    q->bus = bus;
    q->conf = *conf;
    snprintf(q->cell, sizeof q->cell, "%s", conf->cell);
    snprintf(q->bucket, sizeof q->bucket, "%s", conf->bucket ? conf->bucket : "DSEC_QUOTAS");
    q->conf.cell = q->cell;
    q->conf.bucket = q->bucket;
    q->conf.full_ms = conf->full_ms ? conf->full_ms : 5000;
    q->conf.pending_ms = conf->pending_ms ? conf->pending_ms : 60000;
    q->conf.reload_ms = conf->reload_ms ? conf->reload_ms : 10000;
    q->conf.lease_ms = conf->lease_ms ? conf->lease_ms : 3000;
    char id[33];
    dsec_bus_new_id(id);
    snprintf(q->name, sizeof q->name, "quota-%.12s", id);
    uint64_t now = now_ms();
    q->ready_ms = now + q->conf.full_ms + 1000;
    q->next_reload_ms = now + q->conf.reload_ms;
    char subj[192], name[96];
    dsec_kv_conf kc = {.bucket = q->bucket, .replicas = conf->replicas};
    char lbucket[DSEC_NAME_LEN_MAX + 16];
    snprintf(lbucket, sizeof lbucket, "dsec-quota-%s", q->cell);
    dsec_kv_conf lc = {
        .bucket = lbucket, .ttl_ms = 10ll * q->conf.lease_ms, .replicas = conf->replicas};
    if (dsec_js_new(&q->js, bus, 5000, err) < 0 || dsec_kv_open(&q->kv, q->js, &kc, err) < 0 ||
        dsec_kv_open(&q->lease_kv, q->js, &lc, err) < 0) {
        dsec_err_wrap(err, "quota actor of cell %s needs JetStream", q->cell);
        goto fail;
    }
    dsec_lease_init(&q->lease, q->lease_kv, "lease", q->name, q->conf.lease_ms);
    if (defs_reload(q, err) < 0)
        goto fail;
    snprintf(name, sizeof name, "quota-%s", q->cell);
    if (dsec_actor_new(&q->actor, bus, name, err) < 0)
        goto fail;
    snprintf(subj, sizeof subj, DSEC_SUBJ_EVT_ALL, q->cell);
    if (dsec_actor_on(q->actor, subj, NULL, on_evt, q, err) < 0)
        goto fail;
    if (dsec_actor_on(q->actor, DSEC_SUBJ_QUOTA_CHANGED, NULL, on_changed, q, err) < 0)
        goto fail;
    /* the first step here: a lone instance admits as soon as it returns */
    lease_tick(q, 0);
    uint32_t every = q->conf.lease_ms / 3 > 100 ? q->conf.lease_ms / 3 : 100;
    if (dsec_ticker_new(&q->ticker, err) < 0 ||
        dsec_ticker_add(q->ticker, 1000, on_tick, q, err) < 0 ||
        dsec_ticker_add(q->ticker, every, lease_tick, q, err) < 0)
        goto fail;
    /* every node answers with a full report: usage is whole well before full_ms */
    snprintf(subj, sizeof subj, DSEC_SUBJ_SYNC_CELL, q->cell);
    if (dsec_bus_flush(bus, 2000, err) < 0 ||
        dsec_bus_publish(bus, subj, NULL,
                         &(dsec_hdr){.type = "sync", .schema = DSEC_SCHEMA_VERSION}, "", 0,
                         err) < 0)
        goto fail;
    *out = q;
    return 0;
fail:
    dsec_quota_stop(q);
    return -1;
}

void dsec_quota_stop(dsec_quota *q)
{
    if (q == NULL)
        return;
    dsec_ticker_free(q->ticker); /* no lease step runs after this */
    ops_stop(q);
    if (q->lease_kv != NULL)
        dsec_lease_release(&q->lease);
    dsec_actor_free(q->actor);
    dsec_kv_close(q->lease_kv);
    dsec_kv_close(q->kv);
    dsec_js_free(q->js);
    map_clear(&q->defs);
    map_clear(&q->use);
    map_clear(&q->nodes);
    map_clear(&q->pending);
    pthread_mutex_destroy(&q->mu);
    pthread_mutex_destroy(&q->defs_mu);
    dsec_free(q);
}

void dsec_quota_stats_get(dsec_quota *q, dsec_quota_stats *out)
{
    pthread_mutex_lock(&q->mu);
    *out = q->st;
    pthread_mutex_unlock(&q->mu);
}

const dsec_actor *dsec_quota_actor(const dsec_quota *q)
{
    return q->actor;
}
