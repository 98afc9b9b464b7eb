/* node.c - the node manager: admission, one sandbox actor per sandbox (a mailbox key), reports, journal, re-adoption. */
#define _GNU_SOURCE /* nftw */
#include "actors/node.h"

#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "actors/journal.h"
#include "actors/node-results.h"
#include "actors/wire.h"
#include "backends/loop.h"
#include "backends/sim.h"
#include "backends/workq.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/layers.h"
#include "dsec/names.h"

enum sbx_state { ST_REQUESTED, ST_STARTING, ST_RUNNING, ST_PAUSED, ST_STOPPING, ST_GONE, ST_FAILED };
static const char *const state_names[] = {"requested", "starting", "running", "paused",
                                          "stopping",  "gone",     "failed"};

enum reap_reason { REAP_NONE, REAP_TTL, REAP_IDLE, REAP_LOST, REAP_SUPERSEDED };

/* One sandbox as its actor sees it. Found through the id table; the fields
 * after `h` change only on the sandbox's own mailbox key, so handlers read
 * them without the node lock. */
struct sbx {
    struct sbx *next_id;  /* id hash chain (node lock) */
    struct sbx *next_req; /* (tenant, req_id) hash chain (node lock) */
    dsec_sandbox *h;      /* backend handle */
    dsec_backend *be;
    char *bstate;         /* backend_state for adopt and compaction */
    uint64_t created_ns;  /* wall clock */
    _Atomic uint64_t last_ns; /* wall clock of the last operation */
    uint64_t ttl_ns, idle_ns;
    uint32_t cpu_milli, memory_mb;
    uint64_t disk_mb; /* the quota of its writable layer, held from the node's disk */
    uint8_t type_idx;
    _Atomic uint8_t state;
    _Atomic uint8_t reap;  /* enum reap_reason, set by the reaper */
    bool pausable;         /* a rollout that may be frozen while idle under memory pressure */
    bool superseded;       /* a later attempt of its create is kept elsewhere: the reaper destroys
                              it, and its request id finds it no more (node lock) */
    _Atomic uint32_t retry; /* the latest attempt of its create placed here, or kept here by a
                               superseded notice (set under the node lock; journaled) */
    uint32_t lookup_retry;  /* the latest attempt whose lookup it answered (node lock) */
    _Atomic bool frozen;   /* paused by the node; its memory went back to the pool */
    _Atomic bool freezing; /* a freeze is queued on its mailbox */
    uint32_t mem_owed;     /* MB it could not take back when thawed (memory was short) */
    char id[DSEC_SBX_ID_LEN_MAX + 1];
    char tenant[DSEC_NAME_LEN_MAX + 1];
    char project[DSEC_NAME_LEN_MAX + 1]; /* "" when the create named none */
    char req_id[65];
};

/* A request id whose retry was placed on another node (superseded): a
 * placement of an earlier attempt that arrives later is not created. */
struct tomb {
    struct tomb *next;      /* hash chain (node lock) */
    struct tomb *next_old;  /* oldest first, for expiry (node lock) */
    uint64_t expires_ns;    /* wall clock */
    uint32_t retry;         /* the attempt placed elsewhere */
    char tenant[DSEC_NAME_LEN_MAX + 1];
    char req_id[65];
};

#define TOMB_BUCKETS 4096
#define TOMBS_MAX 65536
#define TOMB_TTL_NS (300ull * 1000000000ull) /* beyond any client's wait for one attempt */

/* A sandbox the backend could not adopt because of this node's configuration (DSEC_E_CONFIG:
 * the runtime that started it is not installed, ...) but that still exists: its record stays
 * in the journal, so a node manager started with that put right adopts it. */
struct kept {
    char *id;
    char *data;
    size_t len;
    struct kept *next;
};

/* Capacity a preemptible job holds on this node (job_hold): it is taken
 * from what placement can use until the job, or the arbiter, releases it. */
struct hold {
    struct hold *next;
    char key[136]; /* "hold.<job>.<unit>": also its journal id */
    char job[DSEC_NAME_LEN_MAX + 1];
    uint64_t cpu_milli, memory_mb;
};

struct event {
    char id[DSEC_SBX_ID_LEN_MAX + 1];
    char tenant[DSEC_NAME_LEN_MAX + 1];
    char project[DSEC_NAME_LEN_MAX + 1];
    char req_id[65];
    uint32_t cpu_milli, memory_mb;
    uint8_t state, prev, type_idx;
    uint64_t ts_ns;
    char reason[96];
    char trace_id[DSEC_TRACE_ID_MAX + 1]; /* the request that caused it; "" if none */
};

struct dsec_node {
    dsec_bus *bus;
    dsec_ticker *ticker;
    dsec_ticker *sync_ticker;
    const dsec_registry *reg;
    dsec_actor *actor;
    dsec_journal *journal;
    char name[DSEC_NAME_LEN_MAX + 1];
    char cell[DSEC_NAME_LEN_MAX + 1];
    char subj_evt_node[192]; /* dsec.v1.ctl.evt.<cell>.node.<node> */
    char subj_evt_sbx[192];  /* dsec.v1.ctl.evt.<cell>.sbx.<node> */
    dsec_node_conf conf;     /* copy; strings point into the caller's conf, which outlives start only */
    char snap_dir[4096];     /* <state_dir>/snapshots: the files backends write on snapshot */
    dsec_type_mask offered;
    char **type_names;       /* offered names (copied), NULL-terminated */
    dsec_backend_kv *labels; /* copied */
    size_t nlabels;
    dsec_backend *backends[DSEC_REGISTRY_MAX]; /* per registry index; shared when backend is "sim" */
    /* Sandbox operations never hold a bus worker: commands wait on the loop, everything
     * else that needs a thread runs on the work queue, fair across tenants and sandboxes. */
    dsec_loop *loop;
    dsec_workq *work;
    dsec_results *results; /* finished commands' answers by request id (retries, reattach) */
    bool own_loop, own_work; /* opened here, not borrowed from the cell */
    _Atomic uint64_t execs_inflight, execs_peak;
    int ticks[4];

    pthread_mutex_t mu; /* tables, free resources, events */
    struct sbx **by_id;
    struct sbx **by_req;
    size_t nbuckets;
    pthread_mutex_t report_mu; /* one capacity report at a time, events before it */
    uint64_t live;
    uint64_t live_by_type[DSEC_REGISTRY_MAX];
    uint64_t cpu_free, mem_free, slots_free;
    uint64_t disk_free; /* MB: conf.disk_mb less the reserve and the sandboxes' quotas */
    bool dirty;
    uint64_t seq;
    uint64_t last_full_ns;
    struct event *events;
    size_t nevents, cap_events;
    struct sbx *dropped; /* records replayed but not re-adopted (start only) */
    struct kept *kept;   /* records replayed, not adopted, but kept (journal compaction too) */
    uint64_t nkept;
    struct hold *holds;  /* job holdings (node lock) */
    struct tomb **tombs; /* TOMB_BUCKETS chains (node lock) */
    struct tomb *tomb_old, *tomb_new;
    size_t ntombs;

    _Atomic uint64_t created, destroyed, refused, adopted, adopt_failed, reaped_ttl, reaped_idle;
    _Atomic uint64_t lost_before_ns; /* reclaim what was made before: this node was declared
                                        lost then, and the owners were told */
    _Atomic uint64_t reaped_lost;
    _Atomic uint64_t reaped_superseded; /* made for an attempt whose retry was kept elsewhere */
    _Atomic uint64_t stale_places;      /* placements of an attempt already superseded */
    _Atomic uint64_t late_places; /* placements dropped: past their client's deadline */
    _Atomic uint64_t net_alerts; /* network alerts published */
    dsec_metrics_hist create_lat; /* place received -> created answered, creates that made a sandbox */
    uint64_t hb_seq;
    uint64_t conn_base;      /* wall clock at start: with the bus's reconnects, the report's conn */

    dsec_net *net;           /* network containment, or NULL */
    pthread_mutex_t alert_mu; /* alerts are published only while alert_on */
    bool alert_on;
    char subj_alert[192];    /* dsec.v1.ctl.evt.<cell>.alert.<node> */
};

static uint64_t hash_str(const char *a, const char *b)
{
    uint64_t h = 1469598103934665603ull;
    for (; *a; a++)
        h = (h ^ (uint8_t)*a) * 1099511628211ull;
    for (; b && *b; b++)
        h = (h ^ (uint8_t)*b) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* ---- tables (node lock held) -------------------------------------------------- */

static struct sbx *find_id(dsec_node *n, const char *id)
{
    for (struct sbx *s = n->by_id[hash_str(id, NULL) % n->nbuckets]; s; s = s->next_id)
        if (strcmp(s->id, id) == 0)
            return s;
    return NULL;
}

/* The sandbox that answers (tenant, req_id): a superseded one answers no more. */
static struct sbx *find_req(dsec_node *n, const char *tenant, const char *req_id)
{
    for (struct sbx *s = n->by_req[hash_str(tenant, req_id) % n->nbuckets]; s; s = s->next_req)
        if (!s->superseded && strcmp(s->req_id, req_id) == 0 && strcmp(s->tenant, tenant) == 0)
            return s;
    return NULL;
}

static struct tomb *find_tomb(dsec_node *n, const char *tenant, const char *req_id)
{
    for (struct tomb *t = n->tombs[hash_str(tenant, req_id) % TOMB_BUCKETS]; t; t = t->next)
        if (strcmp(t->req_id, req_id) == 0 && strcmp(t->tenant, tenant) == 0)
            return t;
    return NULL;
}

/* Remember that attempt retry of (tenant, req_id) was placed elsewhere; the
 * oldest are forgotten past TOMB_TTL_NS or TOMBS_MAX. */
static void add_tomb(dsec_node *n, const char *tenant, const char *req_id, uint32_t retry, uint64_t now)
{
    while (n->tomb_old != NULL && (n->ntombs >= TOMBS_MAX || n->tomb_old->expires_ns <= now)) {
        struct tomb *o = n->tomb_old;
        for (struct tomb **pp = &n->tombs[hash_str(o->tenant, o->req_id) % TOMB_BUCKETS]; *pp;
             pp = &(*pp)->next)
            if (*pp == o) {
                *pp = o->next;
                break;
            }
        n->tomb_old = o->next_old;
        if (n->tomb_old == NULL)
            n->tomb_new = NULL;
        n->ntombs--;
        dsec_free(o);
    }
    struct tomb *t = find_tomb(n, tenant, req_id);
    if (t != NULL) {
        if (retry > t->retry)
            t->retry = retry;
        return;
    }
    if ((t = dsec_calloc(1, sizeof *t)) == NULL)
        return; /* only a late placement of an old attempt could slip through */
    t->expires_ns = now + TOMB_TTL_NS;
    t->retry = retry;
    snprintf(t->tenant, sizeof t->tenant, "%s", tenant);
    snprintf(t->req_id, sizeof t->req_id, "%s", req_id);
    size_t b = hash_str(tenant, req_id) % TOMB_BUCKETS;
    t->next = n->tombs[b];
    n->tombs[b] = t;
    if (n->tomb_new != NULL)
        n->tomb_new->next_old = t;
    else
        n->tomb_old = t;
    n->tomb_new = t;
    n->ntombs++;
}

static void insert(dsec_node *n, struct sbx *s)
{
    size_t b = hash_str(s->id, NULL) % n->nbuckets;
    s->next_id = n->by_id[b];
    n->by_id[b] = s;
    if (s->req_id[0]) {
        size_t r = hash_str(s->tenant, s->req_id) % n->nbuckets;
        s->next_req = n->by_req[r];
        n->by_req[r] = s;
    }
    n->live++;
    n->live_by_type[s->type_idx]++;
}

static void unlink_sbx(dsec_node *n, struct sbx *s)
{
    struct sbx **pp = &n->by_id[hash_str(s->id, NULL) % n->nbuckets];
    for (; *pp; pp = &(*pp)->next_id)
        if (*pp == s) {
            *pp = s->next_id;
            break;
        }
    if (s->req_id[0]) {
        pp = &n->by_req[hash_str(s->tenant, s->req_id) % n->nbuckets];
        for (; *pp; pp = &(*pp)->next_req)
            if (*pp == s) {
                *pp = s->next_req;
                break;
            }
    }
    n->live--;
    n->live_by_type[s->type_idx]--;
}

static void release_resources(dsec_node *n, uint64_t cpu, uint64_t mem, uint64_t slots,
                              uint64_t disk)
{
    n->cpu_free += cpu;
    n->mem_free += mem;
    n->slots_free += slots;
    n->disk_free += disk;
    n->dirty = true;
}

/* Queue a lifecycle event; they leave in batches with the next report. */
static void event_locked(dsec_node *n, const struct sbx *s, int prev, int state, const char *reason)
{
    if (n->nevents == n->cap_events) {
        size_t ncap = n->cap_events ? n->cap_events * 2 : 256;
        struct event *ne = dsec_realloc(n->events, ncap * sizeof *ne);
        if (ne == NULL)
            return; /* events are advisory: the sandbox's own state is the truth */
        n->events = ne;
        n->cap_events = ncap;
    }
    struct event *e = &n->events[n->nevents++];
    memcpy(e->id, s->id, sizeof e->id);
    memcpy(e->tenant, s->tenant, sizeof e->tenant);
    memcpy(e->project, s->project, sizeof e->project);
    memcpy(e->req_id, s->req_id, sizeof e->req_id);
    e->cpu_milli = s->cpu_milli;
    e->memory_mb = s->memory_mb;
    e->prev = (uint8_t)prev;
    e->state = (uint8_t)state;
    e->type_idx = s->type_idx;
    e->ts_ns = dsec_wall_ns();
    snprintf(e->reason, sizeof e->reason, "%s", reason ? reason : "");
    /* events leave later in a batch: each keeps the trace of its cause */
    const char *tid = dsec_trace_current();
    snprintf(e->trace_id, sizeof e->trace_id, "%s", tid != NULL ? tid : "");
}

static void set_state(dsec_node *n, struct sbx *s, int state, const char *reason)
{
    pthread_mutex_lock(&n->mu);
    int prev = s->state;
    s->state = (uint8_t)state;
    event_locked(n, s, prev, state, reason);
    pthread_mutex_unlock(&n->mu);
}

/* ---- records in the journal -------------------------------------------------- */

static const char *type_name(const dsec_node *n, int idx)
{
    const dsec_backend_caps *c = dsec_registry_caps(n->reg, idx);
    return c ? c->type : "?";
}

/* Fields separated by 0x1f; backend_state last (it may hold anything but NUL).
 * Version 2 adds the project after the state, 3 the retry after it, 4 the
 * disk quota after that; records of versions 1 to 3 are still read (their
 * sandboxes hold no disk in the node's accounting). */
static int record_format(const dsec_node *n, const struct sbx *s, char *buf, size_t len)
{
    return snprintf(buf, len,
                    "4\x1f%s\x1f%s\x1f%s\x1f%d\x1f%" PRIu32 "\x1f%" PRIu32 "\x1f%" PRIu64
                    "\x1f%" PRIu64 "\x1f%" PRIu64 "\x1f%s\x1f%" PRIu32 "\x1f%" PRIu64 "\x1f%s",
                    s->tenant, s->req_id, type_name(n, s->type_idx), (int)s->state, s->cpu_milli,
                    s->memory_mb, s->created_ns, s->ttl_ns, s->idle_ns, s->project,
                    (uint32_t)s->retry, s->disk_mb, s->bstate ? s->bstate : "");
}

static int journal_put(dsec_node *n, const struct sbx *s, dsec_err *err)
{
    char stackbuf[1024];
    int len = record_format(n, s, stackbuf, sizeof stackbuf);
    if (len < 0)
        return dsec_err_set(err, DSEC_E_INTERNAL, 0, "formatting the record of %s", s->id);
    if ((size_t)len < sizeof stackbuf)
        return dsec_journal_put(n->journal, s->id, stackbuf, (size_t)len, err);
    char *big = dsec_malloc((size_t)len + 1);
    if (big == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    record_format(n, s, big, (size_t)len + 1);
    int rc = dsec_journal_put(n->journal, s->id, big, (size_t)len, err);
    dsec_free(big);
    return rc;
}

/* s answers attempt retry of its create too (node lock held): its journal
 * record keeps the latest, so that after a restart a notice of an earlier
 * attempt placed elsewhere still leaves it alone. A sandbox still starting
 * is recorded when it is running. */
static void answers_locked(dsec_node *n, struct sbx *s, uint32_t retry)
{
    if (retry <= s->retry)
        return;
    s->retry = retry;
    dsec_err err;
    if ((s->state == ST_RUNNING || s->state == ST_PAUSED) && journal_put(n, s, &err) < 0)
        dsec_actor_count_error(n->actor);
}

/* ---- backends ------------------------------------------------------------------- */

static void sbx_free(struct sbx *s)
{
    if (s != NULL)
        dsec_free(s->bstate);
    dsec_free(s);
}

static void spec_for(const dsec_node *n, const struct sbx *s, const char *env, dsec_sandbox_spec *sp)
{
    memset(sp, 0, sizeof *sp);
    sp->id = s->id;
    sp->type = type_name(n, s->type_idx);
    sp->env = env;
    sp->cpu_milli = s->cpu_milli;
    sp->memory_mb = s->memory_mb;
    sp->disk_mb = s->disk_mb;
    sp->tenant = s->tenant;
}

/* ---- sending -------------------------------------------------------------------- */

static void reply_err(dsec_node *n, dsec_msg *m, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void reply_err(dsec_node *n, dsec_msg *m, int code, const char *fmt, ...)
{
    dsec_err e = {.code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    dsec_wire_error(n->actor, m, &e);
}

/* An invalid request field: the error names it (docs/protocol.md, Errors). */
static void reply_bad(dsec_node *n, dsec_msg *m, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void reply_bad(dsec_node *n, dsec_msg *m, const char *field, const char *fmt, ...)
{
    dsec_err e = {.code = DSEC_E_INVALID};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    dsec_wire_error_field(n->actor, m, &e, field);
}

/* A backend's failure of a request, answered: an invalid one names the
 * field the backend judged (bad_field; NULL when it cannot be told). */
static void reply_backend(dsec_node *n, dsec_msg *m, const dsec_err *e, const char *bad_field)
{
    dsec_wire_error_field(n->actor, m, e, e->code == DSEC_E_INVALID ? bad_field : NULL);
}

/* The exec field a backend's invalid error is about. Backends judge the
 * command line, cwd, user and environment, and say which in their message
 * (backends/function-call.c, agent-client.c); the command is what is left. */
static const char *exec_bad_field(const dsec_err *e)
{
    if (strstr(e->msg, "cwd") != NULL)
        return "cwd";
    if (strstr(e->msg, "user \"") != NULL)
        return "user";
    if (strstr(e->msg, "environment variable") != NULL || strstr(e->msg, "DSEC_LIMIT_") != NULL)
        return "env";
    return "argv";
}

/* The create field a backend's invalid error is about: the backends judge
 * the labels (runtime=, limits), the environment and its layers, the disk
 * and the network policy, and say which in their message. */
static const char *create_bad_field(const dsec_err *e)
{
    if (strstr(e->msg, "label") != NULL || strstr(e->msg, "runtime") != NULL)
        return "labels";
    if (strstr(e->msg, "disk_mb") != NULL)
        return "disk_mb";
    if (strstr(e->msg, "network policy") != NULL)
        return "net";
    if (strstr(e->msg, "requires") != NULL || strstr(e->msg, "isolation") != NULL)
        return "requires";
    return "env";
}

static void send_created(dsec_node *n, const char *reply_to, const struct sbx *s, bool existing,
                         const char *req_id)
{
    dsec_msg_created c = {.id = s->id, .node = n->name, .type = type_name(n, s->type_idx),
                          .state = state_names[s->state], .cell = n->cell, .req_id = req_id,
                          .existing = existing};
    dsec_err err;
    if (dsec_wire_send(n->actor, n->bus, reply_to, NULL, DSEC_MSG_CREATED, &c, req_id, &err) < 0)
        dsec_actor_count_error(n->actor);
}

/* ---- place: admission and create ------------------------------------------------ */

/* Send a refused placement back to the scheduler that made it, which retries
 * elsewhere; without a scheduler, answer the client. short_of names what the
 * node lacked when it refused for room (NULL otherwise): a rollout refused
 * for room everywhere it was tried waits for room instead of failing. */
static void refuse(dsec_node *n, dsec_msg *m, dsec_msg_place *p, const char *why,
                   const char *short_of)
{
    atomic_fetch_add(&n->refused, 1);
    const char *back = dsec_msg_reply(m);
    dsec_err err = {.code = DSEC_E_REFUSED};
    snprintf(err.msg, sizeof err.msg, "node %s refused: %s", n->name, why);
    if (back == NULL) {
        dsec_wire_error_to(n->actor, n->bus, p->reply_to, &err, NULL, p->c.req_id);
        return;
    }
    const char **tried = dsec_calloc(p->tried.n + 1, sizeof *tried);
    if (tried == NULL) {
        dsec_wire_error_to(n->actor, n->bus, p->reply_to, &err, NULL, p->c.req_id);
        return;
    }
    for (uint32_t i = 0; i < p->tried.n; i++)
        tried[i] = p->tried.v[i];
    tried[p->tried.n] = n->name;
    p->tried = (dsec_strv){tried, p->tried.n + 1};
    p->reason = err.msg;
    p->short_of = short_of;
    /* what this node really has free, so the scheduler's view need not wait for the
     * next capacity report to stop counting room here */
    p->free_seq = p->free_cpu_milli = p->free_mem_mb = p->free_slots = p->free_disk_mb = 0;
    if (short_of != NULL) {
        pthread_mutex_lock(&n->mu);
        p->free_seq = n->seq;
        p->free_cpu_milli = n->cpu_free;
        p->free_mem_mb = n->mem_free;
        p->free_slots = n->slots_free;
        p->free_disk_mb = n->disk_free;
        pthread_mutex_unlock(&n->mu);
    }
    if (dsec_wire_send(n->actor, n->bus, back, NULL, DSEC_MSG_PLACE, p, p->c.req_id, &err) < 0)
        dsec_wire_error_to(n->actor, n->bus, p->reply_to, &err, NULL, p->c.req_id);
    dsec_free(tried);
}

static void new_id(const dsec_node *n, char *out, size_t len)
{
    char hex[33];
    dsec_bus_new_id(hex);
    snprintf(out, len, "%s-%.16s", n->name, hex);
}

static bool printable_token(const char *s, size_t max)
{
    size_t len = strlen(s);
    if (len == 0 || len > max)
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return true;
}

struct create_job {
    dsec_node *n;
    dsec_deferred *d;
    struct sbx *s;
    uint64_t t0;
};

static void create_finish(dsec_node *n, struct sbx *s, const dsec_msg_place *p, uint64_t t0);

/* Admitted, but not started: the resources go back and the requester hears why. */
static void create_fail(dsec_node *n, struct sbx *s, dsec_err *err, const char *reply_to,
                        const char *req_id)
{
    pthread_mutex_lock(&n->mu);
    unlink_sbx(n, s);
    release_resources(n, s->cpu_milli, s->memory_mb, 1, s->disk_mb);
    event_locked(n, s, ST_STARTING, ST_FAILED, err->msg);
    pthread_mutex_unlock(&n->mu);
    dsec_wire_error_to(n->actor, n->bus, reply_to, err, NULL, req_id);
    sbx_free(s);
}

static void create_job_run(void *ud)
{
    struct create_job j = *(struct create_job *)ud;
    dsec_free(ud);
    dsec_msg *m = dsec_deferred_msg(j.d);
    dsec_trace_scope sc;
    dsec_deferred_trace(j.d, &sc);
    /* decoded again: the first decode belongs to the bus worker's thread */
    dsec_msg_place p;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_PLACE, dsec_msg_data(m), dsec_msg_len(m), &p,
                    &err) < 0)
        create_fail(j.n, j.s, &err, NULL, NULL); /* cannot happen: it decoded once */
    else
        create_finish(j.n, j.s, &p, j.t0);
    dsec_trace_leave(&sc);
    dsec_deferred_done(j.d);
}

static void on_place(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_node *n = ud;
    uint64_t t0 = dsec_now_ns();
    dsec_err err;
    dsec_msg_place p;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_PLACE))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_PLACE, dsec_msg_data(m), dsec_msg_len(m), &p,
                    &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    const char *tenant = p.c.tenant ? p.c.tenant : "default";
    bool tenant_ok = dsec_name_ok(tenant, DSEC_NAME_LEN_MAX) == 0;
    if (!tenant_ok || !printable_token(p.c.req_id, 64)) {
        dsec_err_set(&err, DSEC_E_INVALID, 0, "place: bad %s",
                     tenant_ok ? "req_id (control characters)" : "tenant (not a name)");
        dsec_wire_error_to(a, n->bus, p.reply_to, &err, tenant_ok ? "req_id" : "tenant",
                           p.c.req_id);
        return;
    }
    if (p.c.project != NULL && p.c.project[0] && dsec_project_ok(p.c.project, DSEC_NAME_LEN_MAX) < 0) {
        dsec_err_set(&err, DSEC_E_INVALID, 0,
                     "project \"%.64s\": names of [A-Za-z0-9_-] joined by '/', at most 64 characters",
                     p.c.project);
        dsec_wire_error_to(a, n->bus, p.reply_to, &err, "project", p.c.req_id);
        return;
    }
    uint64_t wall = dsec_wall_ns();
    if (p.c.deadline_ns != 0 && wall > p.c.deadline_ns) {
        /* the client stopped waiting (and may have retried elsewhere): creating it now
         * would make a second sandbox for one request, or one nobody knows of */
        atomic_fetch_add(&n->late_places, 1);
        dsec_err_set(&err, DSEC_E_TIMEOUT, 0,
                     "create: the placement reached node %s %" PRIu64 " ms after the client's deadline; "
                     "not created (retry is safe with the same req_id)",
                     n->name, (uint64_t)((wall - p.c.deadline_ns) / 1000000u));
        dsec_wire_error_to(a, n->bus, p.reply_to, &err, NULL, p.c.req_id);
        return;
    }
    const char *tname = p.c.type ? p.c.type : "";
    int tidx = dsec_registry_find(n->reg, tname);
    if (tidx < 0 || !(n->offered & (1u << tidx)) || n->backends[tidx] == NULL) {
        char why[160];
        snprintf(why, sizeof why, "it does not offer sandbox type \"%s\"", tname);
        refuse(n, m, &p, why, NULL);
        return;
    }
    uint64_t cpu = p.c.cpu_milli ? p.c.cpu_milli : n->conf.default_cpu_milli;
    uint64_t mem = p.c.memory_mb ? p.c.memory_mb : n->conf.default_memory_mb;
    uint64_t disk = p.c.disk_mb                      ? p.c.disk_mb
                    : strcmp(tname, "function") == 0 ? n->conf.default_function_disk_mb
                                                     : n->conf.default_disk_mb;
    uint64_t ttl = p.c.ttl_s ? p.c.ttl_s : n->conf.default_ttl_s;
    uint64_t idle = p.c.idle_s ? p.c.idle_s : n->conf.default_idle_s;
    if (ttl > n->conf.max_ttl_s) {
        dsec_err_set(&err, DSEC_E_INVALID, 0, "ttl_s %" PRIu64 " exceeds this cell's maximum %" PRIu64,
                     ttl, n->conf.max_ttl_s);
        dsec_wire_error_to(a, n->bus, p.reply_to, &err, "ttl_s", p.c.req_id);
        return;
    }
    for (uint32_t i = 0; i < p.c.affinity.n; i++) {
        bool ok = false;
        for (size_t j = 0; j < n->nlabels && !ok; j++)
            ok = strcmp(n->labels[j].key, p.c.affinity.k[i]) == 0 &&
                 strcmp(n->labels[j].value, p.c.affinity.v[i]) == 0;
        if (!ok) {
            char why[160];
            snprintf(why, sizeof why, "label %s=%s does not match", p.c.affinity.k[i],
                     p.c.affinity.v[i]);
            refuse(n, m, &p, why, NULL);
            return;
        }
    }

    struct sbx *s = dsec_calloc(1, sizeof *s);
    if (s == NULL) {
        refuse(n, m, &p, "out of memory", NULL);
        return;
    }
    uint32_t retry = p.c.retry > UINT32_MAX ? UINT32_MAX : (uint32_t)p.c.retry;
    pthread_mutex_lock(&n->mu);
    struct sbx *dup = find_req(n, tenant, p.c.req_id);
    if (dup != NULL) {
        /* Idempotent create: the same request id answers with the sandbox it
         * made, which now answers this attempt (a notice of an earlier one
         * placed elsewhere must not drop it). */
        answers_locked(n, dup, retry);
        pthread_mutex_unlock(&n->mu);
        dsec_free(s);
        send_created(n, p.reply_to, dup, true, p.c.req_id);
        return;
    }
    struct tomb *tomb = find_tomb(n, tenant, p.c.req_id);
    if (tomb != NULL && tomb->retry > retry) {
        uint32_t later = tomb->retry;
        pthread_mutex_unlock(&n->mu);
        dsec_free(s);
        atomic_fetch_add(&n->stale_places, 1);
        dsec_err_set(&err, DSEC_E_TIMEOUT, 0,
                     "create: attempt %" PRIu64 " reached node %s after attempt %" PRIu32
                     " was placed on another node; not created (retry is safe with the same req_id)",
                     p.c.retry, n->name, later);
        dsec_wire_error_to(a, n->bus, p.reply_to, &err, NULL, p.c.req_id);
        return;
    }
    const char *short_of = NULL;
    char why[160];
    if (n->slots_free < 1)
        short_of = "slots";
    else if (n->cpu_free < cpu)
        short_of = "cpu";
    else if (n->mem_free < mem)
        short_of = "memory";
    else if (n->disk_free < disk)
        short_of = "disk";
    if (short_of != NULL) {
        snprintf(why, sizeof why,
                 "not enough %s (free: %" PRIu64 " milli-CPU, %" PRIu64 " MB, %" PRIu64
                 " slots, %" PRIu64 " MB of disk)",
                 short_of, n->cpu_free, n->mem_free, n->slots_free, n->disk_free);
        pthread_mutex_unlock(&n->mu);
        dsec_free(s);
        refuse(n, m, &p, why, short_of);
        return;
    }
    n->cpu_free -= cpu;
    n->mem_free -= mem;
    n->slots_free -= 1;
    n->disk_free -= disk;
    n->dirty = true;
    new_id(n, s->id, sizeof s->id);
    snprintf(s->tenant, sizeof s->tenant, "%s", tenant);
    snprintf(s->project, sizeof s->project, "%s", p.c.project ? p.c.project : "");
    snprintf(s->req_id, sizeof s->req_id, "%s", p.c.req_id);
    s->retry = retry;
    s->type_idx = (uint8_t)tidx;
    s->cpu_milli = (uint32_t)cpu;
    s->memory_mb = (uint32_t)mem;
    s->disk_mb = disk;
    s->created_ns = dsec_wall_ns();
    s->last_ns = s->created_ns;
    s->ttl_ns = ttl * 1000000000ull;
    s->idle_ns = idle * 1000000000ull;
    s->be = n->backends[tidx];
    s->state = ST_STARTING;
    s->pausable = p.c.pausable && (p.c.cls == NULL || strcmp(p.c.cls, "rollout") == 0);
    insert(n, s); /* visible to a retry of the same request at once */
    event_locked(n, s, ST_REQUESTED, ST_STARTING, NULL);
    pthread_mutex_unlock(&n->mu);

    /* Starting it needs a thread (crun, mkfs, a VM's boot): it runs on the work queue, in
     * the tenant's fair turn, and this worker goes on placing. */
    struct create_job *j = dsec_malloc(sizeof *j);
    dsec_deferred *d = j != NULL ? dsec_actor_defer(a, m) : NULL;
    if (d != NULL) {
        *j = (struct create_job){.n = n, .d = d, .s = s, .t0 = t0};
        if (dsec_workq_submit(n->work, s->tenant, hash_str(s->id, NULL), create_job_run, j,
                              &err) == 0)
            return;
        dsec_free(j);
        create_fail(n, s, &err, p.reply_to, p.c.req_id);
        dsec_deferred_done(d);
        return;
    }
    dsec_free(j);
    create_finish(n, s, &p, t0);
}

/* Start the sandbox s that on_place admitted for p: the backend's create, then its journal
 * record, then the answer. On a work thread. */
static void create_finish(dsec_node *n, struct sbx *s, const dsec_msg_place *pp, uint64_t t0)
{
    dsec_err err;
    const dsec_msg_place p = *pp;
    dsec_actor *a = n->actor;
    uint64_t cpu = s->cpu_milli, mem = s->memory_mb, disk = s->disk_mb;
    dsec_sandbox_spec spec;
    spec_for(n, s, p.c.env, &spec);
    spec.cls = p.c.cls;
    spec.net = p.c.net.v;
    spec.nnet = p.c.net.n;
    dsec_backend_kv labels[64];
    spec.nlabels = p.c.labels.n < 64 ? p.c.labels.n : 64;
    for (size_t i = 0; i < spec.nlabels; i++)
        labels[i] = (dsec_backend_kv){p.c.labels.k[i], p.c.labels.v[i]};
    spec.labels = labels;
    if (dsec_backend_create(s->be, &spec, &s->h, &s->bstate, &err) < 0) {
        dsec_err_wrap(&err, "creating %s on %s", s->id, n->name);
        pthread_mutex_lock(&n->mu);
        unlink_sbx(n, s);
        release_resources(n, cpu, mem, 1, disk);
        event_locked(n, s, ST_STARTING, ST_FAILED, err.msg);
        pthread_mutex_unlock(&n->mu);
        if (err.code == DSEC_E_INTERNAL || err.code == DSEC_OK)
            err.code = DSEC_E_BACKEND;
        dsec_wire_error_to(a, n->bus, p.reply_to, &err,
                           err.code == DSEC_E_INVALID ? create_bad_field(&err) : NULL, p.c.req_id);
        sbx_free(s);
        return;
    }
    s->state = ST_RUNNING;
    if (journal_put(n, s, &err) < 0) {
        /* Without a record we could not re-adopt it: refuse rather than risk an orphan. */
        dsec_err tmp;
        dsec_backend_destroy(s->be, s->h, &tmp);
        pthread_mutex_lock(&n->mu);
        unlink_sbx(n, s);
        release_resources(n, cpu, mem, 1, disk);
        event_locked(n, s, ST_STARTING, ST_FAILED, err.msg);
        pthread_mutex_unlock(&n->mu);
        dsec_wire_error_to(a, n->bus, p.reply_to, &err, NULL, p.c.req_id);
        sbx_free(s);
        return;
    }
    pthread_mutex_lock(&n->mu);
    event_locked(n, s, ST_STARTING, ST_RUNNING, NULL);
    pthread_mutex_unlock(&n->mu);
    atomic_fetch_add(&n->created, 1);
    dsec_metrics_hist_observe(&n->create_lat, dsec_now_ns() - t0);
    send_created(n, p.reply_to, s, false, p.c.req_id);
}

/* ---- operations on one sandbox ------------------------------------------------ */

/* dsec.v1.<tenant>.sbx.<node>.<id>.<op> */
struct target {
    char buf[256];
    const char *tok[8];
    const char *tenant, *id, *op;
};

static int parse_target(dsec_msg *m, struct target *t)
{
    int k = dsec_wire_tokens(dsec_msg_subject(m), t->buf, sizeof t->buf, t->tok, 8);
    if (k != 7)
        return -1;
    t->tenant = t->tok[2];
    t->id = t->tok[5];
    t->op = t->tok[6];
    return 0;
}

/* Look up the sandbox and check that the caller's tenant owns it. */
static struct sbx *target_sbx(dsec_node *n, dsec_msg *m, const struct target *t)
{
    pthread_mutex_lock(&n->mu);
    struct sbx *s = find_id(n, t->id);
    pthread_mutex_unlock(&n->mu);
    if (s == NULL || s->state == ST_GONE || s->state == ST_STOPPING) {
        reply_err(n, m, DSEC_E_NOT_FOUND, "no sandbox %s on node %s", t->id, n->name);
        return NULL;
    }
    if (strcmp(s->tenant, t->tenant) != 0) {
        reply_err(n, m, DSEC_E_PERMISSION, "sandbox %s does not belong to tenant %s", t->id,
                  t->tenant);
        return NULL;
    }
    return s;
}

/* Memory a sandbox holds in the node's accounting now. */
static uint64_t mem_held(const struct sbx *s)
{
    return s->frozen ? 0 : (uint64_t)s->memory_mb - s->mem_owed;
}

/* Resume a sandbox the node froze: the next operation on it does this, so
 * the caller never sees the freeze. It takes its memory back (what is
 * free of it, if memory is still short). */
static int thaw(dsec_node *n, struct sbx *s, dsec_err *err)
{
    if (dsec_backend_resume(s->be, s->h, err) < 0)
        return dsec_err_wrap(err, "resuming frozen %s", s->id);
    pthread_mutex_lock(&n->mu);
    uint64_t take = n->mem_free < s->memory_mb ? n->mem_free : s->memory_mb;
    n->mem_free -= take;
    s->mem_owed = (uint32_t)(s->memory_mb - take);
    s->frozen = false;
    n->dirty = true;
    int prev = s->state;
    s->state = ST_RUNNING;
    event_locked(n, s, prev, ST_RUNNING, "resumed by an operation");
    pthread_mutex_unlock(&n->mu);
    return 0;
}

static bool check_running(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    if (s->state == ST_RUNNING)
        return true;
    if (s->state == ST_PAUSED && s->frozen) {
        dsec_err err;
        if (thaw(n, s, &err) == 0)
            return true;
        dsec_wire_error(n->actor, m, &err);
        return false;
    }
    reply_err(n, m, DSEC_E_STATE, "sandbox %s is %s; %s", s->id, state_names[s->state],
              s->state == ST_PAUSED ? "resume it first" : "it cannot run commands");
    return false;
}

static void touch(struct sbx *s) { s->last_ns = dsec_wall_ns(); }

/* Decode an operation on a running sandbox; answers the error itself and
 * returns false when the operation cannot go on. */
static bool decode_for_running(dsec_node *n, dsec_msg *m, struct sbx *s, int type, void *out)
{
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), type, dsec_msg_data(m), dsec_msg_len(m), out, &err) < 0) {
        dsec_wire_error(n->actor, m, &err);
        return false;
    }
    /* exec and the file messages start with the sandbox id; it must be the
     * subject's, which the tenant's permissions were checked against */
    const char *id = *(const char *const *)out;
    if (strcmp(id, s->id) != 0) {
        reply_bad(n, m, "id", "%s: id %s does not match the subject's %s", dsec_msg_type_name(type),
                  id, s->id);
        return false;
    }
    if (!check_running(n, m, s))
        return false;
    touch(s);
    return true;
}

/* ---- trajectory log ------------------------------------------------------------ */

/* A logged step is answered from the log when the request is the same
 * (fast-forward: it never runs twice) and refused as a divergence when it is
 * not. Returns 1 when m was answered (*rec is then the logged record, or
 * NULL when an error was answered), 0 to run the step live. */
static int traj_check(dsec_node *n, dsec_msg *m, const char *rollout, uint64_t step,
                      const uint8_t hash[DSEC_SHA256_LEN], Dsec__V1__TrajectoryRecord **rec)
{
    dsec_err err;
    *rec = NULL;
    if (n->conf.traj == NULL) {
        reply_err(n, m, DSEC_E_UNSUPPORTED,
                  "rollout %s step %" PRIu64 ": node %s keeps no trajectory log (JetStream is off)",
                  rollout, step, n->name);
        return 1;
    }
    if (dsec_traj_check_id(rollout, &err) < 0) {
        dsec_wire_error(n->actor, m, &err);
        return 1;
    }
    int found = dsec_traj_find(n->conf.traj, rollout, step, rec, &err);
    if (found < 0) {
        dsec_wire_error(n->actor, m, &err);
        return 1;
    }
    if (found == 0)
        return 0;
    Dsec__V1__TrajectoryRecord *r = *rec;
    if (r->request_hash.len != DSEC_SHA256_LEN || memcmp(r->request_hash.data, hash, DSEC_SHA256_LEN) != 0) {
        reply_err(n, m, DSEC_E_DIVERGED,
                  "divergence: rollout %s step %" PRIu64 " is logged as \"%s%s\" and this request "
                  "differs; re-issue the logged request or continue after step %" PRIu64,
                  rollout, step, r->n_argv ? r->argv[0] : "", r->n_argv > 1 ? " ..." : "", step);
        dsec_record_msg_free(&r->base);
        *rec = NULL;
        return 1;
    }
    return 1;
}

/* Log a step that ran; the caller answers only after this returns 0. */
static int traj_log(dsec_node *n, Dsec__V1__TrajectoryRecord *r, dsec_err *err)
{
    r->hash_alg = (char *)DSEC_TRAJ_HASH_ALG;
    r->ts_ns = dsec_wall_ns();
    if (dsec_traj_append(n->conf.traj, r, err) < 0)
        return dsec_err_wrap(err, "the step ran but is not logged, so a retry would run it again");
    return 0;
}

/* Output of a command streamed to the exec's stream_to subject as it comes. */
struct exec_stream {
    dsec_node *n;
    const char *subject; /* NULL: not streaming */
    const char *id;
    const char *trace; /* the exec's trace id (NULL: none): the backend may call from its own thread */
    uint64_t seq;
    bool failed; /* a publish failed: the rest is not sent (the result says how many were) */
};

#define EXEC_CHUNK_MAX (64u * 1024)

static void stream_output(void *arg, int stream, const uint8_t *data, size_t len)
{
    struct exec_stream *es = arg;
    dsec_trace_scope sc;
    dsec_trace_enter(&sc, NULL, es->trace, NULL, NULL);
    while (len > 0 && !es->failed) {
        size_t k = len < EXEC_CHUNK_MAX ? len : EXEC_CHUNK_MAX;
        dsec_msg_exec_chunk c = {.id = es->id, .seq = es->seq, .stream = (uint64_t)stream,
                                 .data = {data, k}};
        dsec_err err;
        if (dsec_wire_send(es->n->actor, es->n->bus, es->subject, NULL, DSEC_MSG_EXEC_CHUNK, &c, NULL,
                           &err) < 0) {
            es->failed = true;
            dsec_actor_count_error(es->n->actor);
            break;
        }
        es->seq++;
        data += k;
        len -= k;
    }
    dsec_trace_leave(&sc);
}

/* Answers of finished commands kept for retries: 10 minutes, 64 MiB per node. */
#define RESULTS_BUDGET (64ull << 20)
#define RESULTS_TTL_MS (10u * 60u * 1000u)

/* What finishing an exec needs once the command ended: all copied, since the request's
 * decoded form belongs to the thread that decoded it. */
struct exec_end {
    dsec_node *n;
    struct sbx *s;
    dsec_deferred *d; /* the request, when it was deferred (the command runs without a thread) */
    dsec_msg *m;      /* the request */
    struct exec_stream es;
    char trace[DSEC_TRACE_ID_MAX + 1];
    char *stream_to;
    /* a logged step (rollout_id set): what its trajectory record holds */
    char *rollout_id, *req_id;
    uint64_t step;
    char **argv;
    size_t argc;
    uint8_t hash[DSEC_SHA256_LEN];
};

static void exec_end_free(struct exec_end *e)
{
    dsec_free(e->stream_to);
    dsec_free(e->rollout_id);
    dsec_free(e->req_id);
    for (size_t i = 0; e->argv != NULL && i < e->argc; i++)
        dsec_free(e->argv[i]);
    dsec_free(e->argv);
    dsec_free(e);
}

/* The command ended (rc 0, r its result) or failed: log the step, answer, let the sandbox's
 * next operation run. */
static void exec_finish(struct exec_end *e, int rc, dsec_exec_result *r, dsec_err *err)
{
    dsec_node *n = e->n;
    struct sbx *s = e->s;
    dsec_msg *m = e->m;
    dsec_trace_scope sc;
    if (e->d != NULL)
        dsec_deferred_trace(e->d, &sc);
    else
        dsec_trace_enter(&sc, NULL, e->trace[0] ? e->trace : NULL, NULL, NULL);
    dsec_err lerr;
    if (rc < 0) {
        dsec_err_wrap(err, "exec in %s", s->id);
        reply_backend(n, m, err, exec_bad_field(err));
        goto out;
    }
    touch(s);
    if (e->stream_to != NULL && e->es.seq == 0 && !e->es.failed) {
        /* a backend that cannot stream: the whole output, as chunks, now */
        stream_output(&e->es, 1, r->stdout_data, r->stdout_len);
        stream_output(&e->es, 2, r->stderr_data, r->stderr_len);
    }
    if (e->rollout_id != NULL) {
        Dsec__V1__TrajectoryRecord rec = DSEC__V1__TRAJECTORY_RECORD__INIT;
        rec.rollout_id = e->rollout_id;
        rec.step = e->step;
        rec.req_id = e->req_id ? e->req_id : (char *)"";
        rec.sandbox_id = s->id;
        rec.argv = e->argv;
        rec.n_argv = e->argc;
        rec.exit_code = r->exit_code;
        rec.signal = r->signal;
        rec.stdout_data = (ProtobufCBinaryData){r->stdout_len, r->stdout_data};
        rec.stderr_data = (ProtobufCBinaryData){r->stderr_len, r->stderr_data};
        rec.stdout_truncated = r->stdout_truncated;
        rec.stderr_truncated = r->stderr_truncated;
        rec.timed_out = r->timed_out;
        rec.duration_us = r->duration_us;
        rec.request_hash = (ProtobufCBinaryData){DSEC_SHA256_LEN, e->hash};
        if (traj_log(n, &rec, &lerr) < 0) {
            dsec_wire_error(n->actor, m, &lerr);
            goto out;
        }
    }
    dsec_msg_exec_result out = {.id = s->id, .exit_code = r->exit_code, .signal = r->signal,
                                .stdout_data = {r->stdout_data, r->stdout_len},
                                .stderr_data = {r->stderr_data, r->stderr_len},
                                .stdout_truncated = r->stdout_truncated,
                                .stderr_truncated = r->stderr_truncated,
                                .duration_us = r->duration_us, .timed_out = r->timed_out,
                                .cpu_us = r->cpu_us, .peak_rss_kb = r->peak_rss_kb,
                                .chunks = e->es.seq};
    if (e->rollout_id == NULL && e->req_id != NULL && e->req_id[0] != '\0')
        dsec_results_put(n->results, s->id, e->req_id, e->hash, &out);
    if (dsec_wire_reply(n->actor, m, DSEC_MSG_EXEC_RESULT, &out, &lerr) < 0)
        dsec_wire_error(n->actor, m, &lerr);
out:
    if (rc == 0)
        dsec_exec_result_release(r);
    dsec_trace_leave(&sc);
}

/* exec_start's done: on the node's loop thread. */
static void exec_done(void *ud, int rc, dsec_exec_result *r, dsec_err *err)
{
    struct exec_end *e = ud;
    dsec_node *n = e->n;
    exec_finish(e, rc, r, err);
    atomic_fetch_sub(&n->execs_inflight, 1);
    dsec_deferred *d = e->d;
    exec_end_free(e);
    dsec_deferred_done(d);
}

static char *dup_or_null(const char *v) { return v != NULL ? dsec_strdup(v) : NULL; }

static void do_exec(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_err err;
    dsec_msg_exec x;
    if (!decode_for_running(n, m, s, DSEC_MSG_EXEC, &x))
        return;
    dsec_backend_kv env[256];
    if (x.env.n > 256) {
        reply_err(n, m, DSEC_E_TOO_LARGE, "exec: %u environment variables, at most 256", x.env.n);
        return;
    }
    for (uint32_t i = 0; i < x.env.n; i++)
        env[i] = (dsec_backend_kv){x.env.k[i], x.env.v[i]};
    uint8_t hash[DSEC_SHA256_LEN] = {0};
    if (x.rollout_id != NULL) {
        Dsec__V1__TrajectoryRecord *rec;
        dsec_traj_hash_exec(&x, hash);
        if (traj_check(n, m, x.rollout_id, x.step, hash, &rec)) {
            if (rec != NULL) {
                dsec_msg_exec_result out = {
                    .id = s->id, .exit_code = rec->exit_code, .signal = rec->signal,
                    .stdout_data = {rec->stdout_data.data, rec->stdout_data.len},
                    .stderr_data = {rec->stderr_data.data, rec->stderr_data.len},
                    .stdout_truncated = rec->stdout_truncated, .stderr_truncated = rec->stderr_truncated,
                    .duration_us = rec->duration_us, .timed_out = rec->timed_out};
                if (dsec_wire_reply(n->actor, m, DSEC_MSG_EXEC_RESULT, &out, &err) < 0)
                    dsec_wire_error(n->actor, m, &err);
                dsec_record_msg_free(&rec->base);
            }
            return;
        }
    }
    /* stream_to: only inbox subjects, so a client cannot make the node
     * publish onto the control plane's subjects */
    if (x.stream_to != NULL && (strncmp(x.stream_to, "_INBOX.", 7) != 0 || strpbrk(x.stream_to, "*> \t") != NULL)) {
        reply_bad(n, m, "stream_to",
                  "exec: stream_to \"%s\" must be an _INBOX. subject without wildcards",
                  x.stream_to);
        return;
    }
    /* A retry of a command that already ran (its client lost the answer, or gave up
     * waiting while it ran) gets the kept answer: the command never runs twice. */
    dsec_msg_exec_result kept;
    void *hold = NULL;
    uint8_t kept_hash[DSEC_SHA256_LEN];
    bool named = x.rollout_id == NULL && x.req_id != NULL && x.req_id[0] != '\0';
    if (named)
        dsec_traj_hash_exec(&x, hash);
    if (named && dsec_results_get(n->results, s->id, x.req_id, &kept, kept_hash, &hold)) {
        if (memcmp(kept_hash, hash, sizeof hash) != 0)
            reply_bad(n, m, "req_id",
                      "exec: req_id %s named another command in %s (its answer is kept for "
                      "10 minutes); give each command its own req_id",
                      x.req_id, s->id);
        else {
            kept.chunks = 0; /* its output comes whole, in the answer */
            if (dsec_wire_reply(n->actor, m, DSEC_MSG_EXEC_RESULT, &kept, &err) < 0)
                dsec_wire_error(n->actor, m, &err);
        }
        dsec_results_release(hold);
        return;
    }
    struct exec_end *e = dsec_calloc(1, sizeof *e);
    bool ok = e != NULL;
    if (ok) {
        e->n = n;
        e->s = s;
        e->m = m;
        e->step = x.step;
        const char *tr = dsec_trace_current();
        snprintf(e->trace, sizeof e->trace, "%s", tr ? tr : "");
        ok = (x.stream_to == NULL || (e->stream_to = dsec_strdup(x.stream_to)) != NULL) &&
             (x.req_id == NULL || (e->req_id = dsec_strdup(x.req_id)) != NULL);
        memcpy(e->hash, hash, sizeof hash); /* a logged step's, or a named command's */
        if (ok && x.rollout_id != NULL) {
            e->argc = x.argv.n;
            ok = (e->rollout_id = dsec_strdup(x.rollout_id)) != NULL &&
                 (e->argv = dsec_calloc(x.argv.n + 1, sizeof *e->argv)) != NULL;
            for (size_t i = 0; ok && i < x.argv.n; i++)
                ok = (e->argv[i] = dup_or_null(x.argv.v[i])) != NULL;
        }
        e->es = (struct exec_stream){.n = n, .subject = e->stream_to, .id = s->id,
                                     .trace = e->trace[0] ? e->trace : NULL};
    }
    if (!ok) {
        if (e != NULL)
            exec_end_free(e);
        reply_err(n, m, DSEC_E_NOMEM, "exec in %s: out of memory", s->id);
        return;
    }
    dsec_exec_req req = {.argv = x.argv.v,
                         .argc = x.argv.n,
                         .env = env,
                         .nenv = x.env.n,
                         .cwd = x.cwd,
                         .user = x.user,
                         .stdin_data = x.stdin_data.ptr,
                         .stdin_len = x.stdin_data.len,
                         .timeout_ms = x.timeout_ms,
                         .output_max = (size_t)x.output_max,
                         .on_output = x.stream_to ? stream_output : NULL,
                         .on_output_arg = &e->es};
    /* Without a thread when the backend can: the command's answer comes from the loop, and
     * this worker goes on with other sandboxes. */
    if (dsec_backend_exec_async(s->be) && (e->d = dsec_actor_defer(n->actor, m)) != NULL) {
        e->m = dsec_deferred_msg(e->d);
        uint64_t now = atomic_fetch_add(&n->execs_inflight, 1) + 1;
        for (uint64_t peak = atomic_load(&n->execs_peak);
             now > peak && !atomic_compare_exchange_weak(&n->execs_peak, &peak, now);)
            ;
        if (dsec_backend_exec_start(s->be, s->h, &req, exec_done, e, &err) < 0)
            exec_done(e, -1, NULL, &err); /* answered; releases the key after this handler */
        return;
    }
    dsec_exec_result r = {0};
    int rc = dsec_backend_exec(s->be, s->h, &req, &r, &err);
    exec_finish(e, rc, &r, &err);
    exec_end_free(e);
}

static void do_write(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_err err;
    dsec_msg_file_write w;
    if (!decode_for_running(n, m, s, DSEC_MSG_FILE_WRITE, &w))
        return;
    uint8_t hash[DSEC_SHA256_LEN];
    if (w.rollout_id != NULL) {
        Dsec__V1__TrajectoryRecord *rec;
        dsec_traj_hash_write(&w, hash);
        if (traj_check(n, m, w.rollout_id, w.step, hash, &rec)) {
            if (rec != NULL) {
                dsec_msg_file_data out = {.id = s->id, .path = w.path, .size = w.data.len, .eof = true};
                if (dsec_wire_reply(n->actor, m, DSEC_MSG_FILE_DATA, &out, &err) < 0)
                    dsec_wire_error(n->actor, m, &err);
                dsec_record_msg_free(&rec->base);
            }
            return;
        }
    }
    if (dsec_backend_file_write(s->be, s->h, w.path, w.data.ptr, w.data.len,
                                (uint32_t)(w.mode ? w.mode : 0644), w.append, &err) < 0) {
        dsec_err_wrap(&err, "writing %s in %s", w.path, s->id);
        reply_backend(n, m, &err, "path");
        return;
    }
    if (w.rollout_id != NULL) {
        const char *argv[] = {DSEC_TRAJ_WRITE_ARGV0, w.path, w.append ? "append" : "replace"};
        Dsec__V1__TrajectoryRecord rec = DSEC__V1__TRAJECTORY_RECORD__INIT;
        rec.rollout_id = (char *)w.rollout_id;
        rec.step = w.step;
        rec.req_id = (char *)"";
        rec.sandbox_id = s->id;
        rec.argv = (char **)argv;
        rec.n_argv = 3;
        rec.request_hash = (ProtobufCBinaryData){DSEC_SHA256_LEN, hash};
        if (traj_log(n, &rec, &err) < 0) {
            dsec_wire_error(n->actor, m, &err);
            return;
        }
    }
    dsec_msg_file_data out = {.id = s->id, .path = w.path, .size = w.data.len, .eof = true};
    if (dsec_wire_reply(n->actor, m, DSEC_MSG_FILE_DATA, &out, &err) < 0)
        dsec_wire_error(n->actor, m, &err);
}

static void do_read(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_err err;
    dsec_msg_file_read rq;
    if (!decode_for_running(n, m, s, DSEC_MSG_FILE_READ, &rq))
        return;
    /* keep the answer under the payload limit; callers page with offset */
    uint64_t max = rq.max == 0 || rq.max > (4u << 20) ? (4u << 20) : rq.max;
    dsec_file_data d = {0};
    if (dsec_backend_file_read(s->be, s->h, rq.path, rq.offset, max, &d, &err) < 0) {
        dsec_err_wrap(&err, "reading %s in %s", rq.path, s->id);
        reply_backend(n, m, &err, "path");
        return;
    }
    dsec_msg_file_data out = {.id = s->id, .path = rq.path, .data = {d.data, d.len},
                              .size = d.size, .eof = d.eof};
    if (dsec_wire_reply(n->actor, m, DSEC_MSG_FILE_DATA, &out, &err) < 0)
        dsec_wire_error(n->actor, m, &err);
    dsec_free(d.data);
}

static void do_list(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_err err;
    dsec_msg_file_list rq;
    if (!decode_for_running(n, m, s, DSEC_MSG_FILE_LIST, &rq))
        return;
    dsec_file_entry *e = NULL;
    size_t ne = 0;
    if (dsec_backend_file_list(s->be, s->h, rq.path, &e, &ne, &err) < 0) {
        dsec_err_wrap(&err, "listing %s in %s", rq.path, s->id);
        reply_backend(n, m, &err, "path");
        return;
    }
    dsec_msg_file_entry *items = dsec_calloc(ne ? ne : 1, sizeof *items);
    if (items == NULL) {
        dsec_file_entries_free(e, ne);
        reply_err(n, m, DSEC_E_NOMEM, "out of memory listing %s", rq.path);
        return;
    }
    for (size_t i = 0; i < ne; i++)
        items[i] = (dsec_msg_file_entry){.name = e[i].name, .kind = dsec_file_kind_name(e[i].kind),
                                         .size = e[i].size, .mode = e[i].mode, .mtime = e[i].mtime};
    dsec_msg_file_list_reply out = {.id = s->id, .path = rq.path, .entries = {items, (uint32_t)ne}};
    if (dsec_wire_reply(n->actor, m, DSEC_MSG_FILE_LIST_REPLY, &out, &err) < 0)
        dsec_wire_error(n->actor, m, &err);
    dsec_free(items);
    dsec_file_entries_free(e, ne);
}

static void reply_op(dsec_node *n, dsec_msg *m, struct sbx *s, const char *state, dsec_strv ids,
                     dsec_kv info)
{
    dsec_msg_op_reply out = {.id = s->id, .state = state, .node = n->name,
                             .type = type_name(n, s->type_idx), .ids = ids, .info = info};
    dsec_err err;
    if (dsec_wire_reply(n->actor, m, DSEC_MSG_OP_REPLY, &out, &err) < 0)
        dsec_wire_error(n->actor, m, &err);
}

static void destroy_sbx(dsec_node *n, dsec_msg *m, struct sbx *s, const char *reason)
{
    dsec_err err;
    set_state(n, s, ST_STOPPING, reason);
    if (dsec_backend_destroy(s->be, s->h, &err) < 0) {
        /* the handle stays valid: keep the sandbox so a retry can finish the job */
        set_state(n, s, ST_RUNNING, err.msg);
        dsec_err_wrap(&err, "destroying %s", s->id);
        if (m != NULL)
            dsec_wire_error(n->actor, m, &err);
        return;
    }
    if (dsec_journal_del(n->journal, s->id, &err) < 0)
        dsec_actor_count_error(n->actor); /* re-adopt will find no sandbox and drop the record */
    pthread_mutex_lock(&n->mu);
    unlink_sbx(n, s);
    release_resources(n, s->cpu_milli, mem_held(s), 1, s->disk_mb);
    event_locked(n, s, ST_STOPPING, ST_GONE, reason);
    pthread_mutex_unlock(&n->mu);
    atomic_fetch_add(&n->destroyed, 1);
    dsec_results_drop(n->results, s->id);
    s->state = ST_GONE;
    if (m != NULL)
        reply_op(n, m, s, "gone", (dsec_strv){0}, (dsec_kv){0});
    sbx_free(s);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) < 0 && errno != ENOENT ? -1 : 0;
}

/* Package the sandbox's state as environment name (a layer pushed to the
 * cell's registry), so a new sandbox anywhere in the cell starts from it.
 * What the backend saved on the way (a microVM's copies of its RAM and disk)
 * goes once the environment is stored: nothing on the wire restores from it,
 * and a node that kept every one would fill its disk. */
static void do_snapshot(dsec_node *n, dsec_msg *m, struct sbx *s, const char *name)
{
    dsec_err err;
    if (name == NULL || !dsec_layer_name_valid(name)) {
        reply_bad(n, m, "name",
                  "snapshot: \"name\" must be an environment name:version, got \"%s\"",
                  name ? name : "");
        return;
    }
    if (!check_running(n, m, s))
        return;
    touch(s);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s-%" PRIu64 ".snap", n->snap_dir, s->id, dsec_wall_ns());
    if (dsec_backend_snapshot(s->be, s->h, path, name, &err) < 0) {
        dsec_err_wrap(&err, "snapshot of %s as %s", s->id, name);
        reply_backend(n, m, &err, "name");
        return;
    }
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0 && errno != ENOENT)
        dsec_actor_count_error(n->actor); /* left behind: the node's error counter shows it */
    const char *k[] = {"env"};
    const char *v[] = {name};
    reply_op(n, m, s, state_names[s->state], (dsec_strv){0}, (dsec_kv){k, v, 1});
}

/* A fork makes sandboxes no scheduler admitted: ask the quota actor for the
 * children here. They carry the admission's id as their req_id, so the
 * quota actor counts each one off the admission as its event arrives. 0, or
 * -1 with the client answered. */
static int fork_admit(dsec_node *n, dsec_msg *m, const struct sbx *s, uint64_t count, char *admit_id,
                      size_t idn)
{
    char rnd[33];
    dsec_bus_new_id(rnd);
    snprintf(admit_id, idn, "fork-%.40s", rnd);
    if (!n->conf.quota)
        return 0;
    dsec_msg_admit ad = {.tenant = s->tenant, .project = s->project[0] ? s->project : NULL,
                         .req_id = admit_id, .n = count, .cpu_milli = s->cpu_milli,
                         .memory_mb = s->memory_mb};
    char subj[160];
    snprintf(subj, sizeof subj, "dsec.v1.ctl.quota.%s.admit", n->cell);
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_err err;
    dsec_msg *reply = NULL;
    dsec_hdr hdr = {.type = "admit", .schema = DSEC_SCHEMA_VERSION, .req_id = admit_id};
    int rc = dsec_encode(&b, DSEC_MSG_ADMIT, &ad, &err);
    if (rc == 0)
        rc = dsec_bus_request_sync(n->bus, subj, &hdr, b.data, b.len, 2000, &reply, &err);
    dsec_buf_release(&b);
    if (rc < 0) {
        reply_err(n, m, err.code, "fork: the quota actor of cell %s did not answer: %s", n->cell, err.msg);
        return -1;
    }
    const char *type = dsec_msg_type(reply);
    if (dsec_wire_bus_error(reply, &err, "fork: the quota actor of cell %s", n->cell)) {
        reply_err(n, m, err.code, "%s", err.msg);
        rc = -1;
    } else if (type == NULL || strcmp(type, DSEC_TYPE_ERROR) == 0) {
        /* its refusal names the full level: pass on its code and words, with
         * the client's req_id (the body's is the admission's own) */
        dsec_msg_error qe;
        dsec_err e = {.code = DSEC_E_INTERNAL};
        if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_ERROR, dsec_msg_data(reply),
                        dsec_msg_len(reply), &qe, &err) < 0) {
            snprintf(e.msg, sizeof e.msg,
                     "fork: the quota actor of cell %s answered an "
                     "undecodable error: %.600s",
                     n->cell, err.msg);
            qe.field = NULL;
        } else {
            e.code = dsec_code_from_name(qe.code);
            snprintf(e.msg, sizeof e.msg, "%s", qe.message);
        }
        dsec_wire_error_to(n->actor, n->bus, dsec_msg_reply(m), &e, qe.field,
                           dsec_msg_header(m, DSEC_HDR_REQ_ID));
        rc = -1;
    }
    dsec_msg_free(reply);
    return rc;
}

/* The fork failed after its admission: give it back now. */
static void fork_unadmit(dsec_node *n, const struct sbx *s, const char *admit_id)
{
    if (!n->conf.quota)
        return;
    dsec_msg_admit ad = {.tenant = s->tenant, .req_id = admit_id, .release = true};
    char subj[160];
    snprintf(subj, sizeof subj, "dsec.v1.ctl.quota.%s.admit", n->cell);
    dsec_err err;
    if (dsec_wire_send(n->actor, n->bus, subj, NULL, DSEC_MSG_ADMIT, &ad, admit_id, &err) < 0)
        dsec_actor_count_error(n->actor);
}

static void do_fork(dsec_node *n, dsec_msg *m, struct sbx *s, uint64_t count)
{
    dsec_err err;
    if (count < 1 || count > 1024) {
        reply_bad(n, m, "n", "fork: n must be 1..1024, got %" PRIu64, count);
        return;
    }
    if (!check_running(n, m, s))
        return;
    touch(s);
    char admit_id[48];
    if (fork_admit(n, m, s, count, admit_id, sizeof admit_id) < 0)
        return;
    bool admitted = true; /* given back unless the children are made */
    struct sbx **kids = dsec_calloc(count, sizeof *kids);
    dsec_sandbox **handles = dsec_calloc(count, sizeof *handles);
    char **states = dsec_calloc(count, sizeof *states);
    const char **ids = dsec_calloc(count, sizeof *ids);
    bool reserved = false;
    if (kids == NULL || handles == NULL || states == NULL || ids == NULL) {
        reply_err(n, m, DSEC_E_NOMEM, "fork: out of memory");
        goto out_free;
    }
    for (uint64_t i = 0; i < count; i++) {
        if ((kids[i] = dsec_calloc(1, sizeof **kids)) == NULL) {
            reply_err(n, m, DSEC_E_NOMEM, "fork: out of memory");
            goto out_free;
        }
        *kids[i] = (struct sbx){.be = s->be, .type_idx = s->type_idx, .cpu_milli = s->cpu_milli,
                                .memory_mb = s->memory_mb, .disk_mb = s->disk_mb,
                                .ttl_ns = s->ttl_ns,
                                .idle_ns = s->idle_ns, .state = ST_STARTING};
        new_id(n, kids[i]->id, sizeof kids[i]->id);
        memcpy(kids[i]->tenant, s->tenant, sizeof s->tenant);
        memcpy(kids[i]->project, s->project, sizeof s->project);
        snprintf(kids[i]->req_id, sizeof kids[i]->req_id, "%s", admit_id);
        ids[i] = kids[i]->id;
    }
    pthread_mutex_lock(&n->mu);
    if (n->slots_free < count || n->cpu_free < count * s->cpu_milli ||
        n->mem_free < count * s->memory_mb || n->disk_free < count * s->disk_mb) {
        uint64_t cf = n->cpu_free, mf = n->mem_free, sf = n->slots_free, df = n->disk_free;
        pthread_mutex_unlock(&n->mu);
        reply_err(n, m, DSEC_E_CAPACITY,
                  "fork of %s into %" PRIu64 " children needs %" PRIu64 " milli-CPU, %" PRIu64
                  " MB, %" PRIu64 " slots and %" PRIu64 " MB of disk; node %s has %" PRIu64
                  ", %" PRIu64 ", %" PRIu64 ", %" PRIu64,
                  s->id, count, count * s->cpu_milli, count * s->memory_mb, count,
                  count * s->disk_mb, n->name, cf, mf, sf, df);
        goto out_free;
    }
    n->cpu_free -= count * s->cpu_milli;
    n->mem_free -= count * s->memory_mb;
    n->slots_free -= count;
    n->disk_free -= count * s->disk_mb;
    n->dirty = true;
    reserved = true;
    pthread_mutex_unlock(&n->mu);
    if (dsec_backend_fork(s->be, s->h, ids, count, handles, states, &err) < 0) {
        dsec_err_wrap(&err, "forking %s", s->id);
        dsec_wire_error(n->actor, m, &err);
        goto out_free;
    }
    uint64_t now = dsec_wall_ns();
    pthread_mutex_lock(&n->mu);
    for (uint64_t i = 0; i < count; i++) {
        kids[i]->h = handles[i];
        kids[i]->bstate = states[i];
        states[i] = NULL;
        kids[i]->created_ns = now;
        kids[i]->last_ns = now;
        kids[i]->state = ST_RUNNING;
        insert(n, kids[i]);
        event_locked(n, kids[i], ST_REQUESTED, ST_RUNNING, "fork");
    }
    pthread_mutex_unlock(&n->mu);
    reserved = false;
    admitted = false; /* the children's events count it off */
    for (uint64_t i = 0; i < count; i++) {
        if (journal_put(n, kids[i], &err) < 0)
            dsec_actor_count_error(n->actor);
        kids[i] = NULL; /* owned by the table now */
    }
    atomic_fetch_add(&n->created, count);
    reply_op(n, m, s, state_names[s->state], (dsec_strv){ids, (uint32_t)count}, (dsec_kv){0});
out_free:
    if (admitted)
        fork_unadmit(n, s, admit_id);
    if (reserved) {
        pthread_mutex_lock(&n->mu);
        release_resources(n, count * s->cpu_milli, count * s->memory_mb, count,
                          count * s->disk_mb);
        pthread_mutex_unlock(&n->mu);
    }
    for (uint64_t i = 0; kids && i < count; i++)
        sbx_free(kids[i]);
    for (uint64_t i = 0; states && i < count; i++)
        dsec_free(states[i]);
    dsec_free(kids);
    dsec_free(handles);
    dsec_free(states);
    dsec_free(ids);
}

static void do_status(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    char cpu[24], mem[24], disk[24], created[24], last[24], used_cpu[24], used_mem[24];
    snprintf(cpu, sizeof cpu, "%" PRIu32, s->cpu_milli);
    snprintf(mem, sizeof mem, "%" PRIu32, s->memory_mb);
    snprintf(disk, sizeof disk, "%" PRIu64, s->disk_mb);
    snprintf(created, sizeof created, "%" PRIu64, s->created_ns);
    snprintf(last, sizeof last, "%" PRIu64, (uint64_t)s->last_ns);
    const char *k[8] = {"cpu_milli", "memory_mb", "disk_mb", "created_ns", "last_active_ns", "tenant"};
    const char *v[8] = {cpu, mem, disk, created, last, s->tenant};
    uint32_t nkv = 6;
    dsec_sandbox_stats st;
    dsec_err err;
    if (dsec_backend_stats(s->be, s->h, &st, &err) == 0) {
        snprintf(used_cpu, sizeof used_cpu, "%" PRIu64, st.cpu_milli);
        snprintf(used_mem, sizeof used_mem, "%" PRIu64, st.memory_bytes);
        k[nkv] = "cpu_used_milli";
        v[nkv++] = used_cpu;
        k[nkv] = "memory_bytes";
        v[nkv++] = used_mem;
    }
    reply_op(n, m, s, state_names[s->state], (dsec_strv){0}, (dsec_kv){k, v, nkv});
}

static void do_pause_resume(dsec_node *n, dsec_msg *m, struct sbx *s, bool pause)
{
    dsec_err err;
    int want = pause ? ST_PAUSED : ST_RUNNING;
    if (!pause && s->state == ST_PAUSED && s->frozen) {
        if (thaw(n, s, &err) < 0) {
            dsec_wire_error(n->actor, m, &err);
            return;
        }
        touch(s);
        reply_op(n, m, s, state_names[s->state], (dsec_strv){0}, (dsec_kv){0});
        return;
    }
    if (s->state == want) {
        reply_op(n, m, s, state_names[s->state], (dsec_strv){0}, (dsec_kv){0});
        return;
    }
    if (s->state != (pause ? ST_RUNNING : ST_PAUSED)) {
        reply_err(n, m, DSEC_E_STATE, "cannot %s sandbox %s: it is %s", pause ? "pause" : "resume",
                  s->id, state_names[s->state]);
        return;
    }
    int rc = pause ? dsec_backend_pause(s->be, s->h, &err) : dsec_backend_resume(s->be, s->h, &err);
    if (rc < 0) {
        dsec_err_wrap(&err, "%s %s", pause ? "pausing" : "resuming", s->id);
        dsec_wire_error(n->actor, m, &err);
        return;
    }
    touch(s);
    set_state(n, s, want, NULL);
    if (journal_put(n, s, &err) < 0)
        dsec_actor_count_error(n->actor);
    reply_op(n, m, s, state_names[s->state], (dsec_strv){0}, (dsec_kv){0});
}

/* How long ago then was. The clock was read before the lock was taken, and
 * operations touch last_ns without it: a time a little after now is "just
 * now", never a wrapped-around eternity that reaps a fresh sandbox. */
static uint64_t age_ns(uint64_t now, uint64_t then)
{
    return now > then ? now - then : 0;
}

/* Freeze an idle pausable rollout under memory pressure: pause it and give
 * its memory back to the node's pool until an operation thaws it. */
static void do_freeze(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_err err;
    s->freezing = false;
    uint64_t idle_ns = (uint64_t)n->conf.pause_idle_ms * 1000000ull;
    if (!s->pausable || s->state != ST_RUNNING || age_ns(dsec_wall_ns(), s->last_ns) < idle_ns) {
        reply_err(n, m, DSEC_E_STATE, "sandbox %s is not an idle pausable rollout; not frozen", s->id);
        return;
    }
    if (dsec_backend_pause(s->be, s->h, &err) < 0) {
        dsec_err_wrap(&err, "freezing %s", s->id);
        dsec_wire_error(n->actor, m, &err);
        return;
    }
    pthread_mutex_lock(&n->mu);
    release_resources(n, 0, mem_held(s), 0, 0);
    s->mem_owed = 0;
    s->frozen = true;
    int prev = s->state;
    s->state = ST_PAUSED;
    event_locked(n, s, prev, ST_PAUSED, "frozen while idle under memory pressure");
    pthread_mutex_unlock(&n->mu);
    reply_op(n, m, s, state_names[s->state], (dsec_strv){0}, (dsec_kv){0});
}

/* Replace a running sandbox's network policy (a task moving to its next stage). */
static void do_net(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_strv *net)
{
    if (s->state != ST_RUNNING && s->state != ST_PAUSED) {
        reply_err(n, m, DSEC_E_STATE, "sandbox %s is %s; its network policy cannot change", s->id,
                  state_names[s->state]);
        return;
    }
    dsec_err err;
    if (dsec_backend_net_set(s->be, s->h, net->v, net->n, &err) < 0) {
        dsec_err_wrap(&err, "sandbox %s", s->id);
        reply_backend(n, m, &err, "net");
        return;
    }
    touch(s);
    reply_op(n, m, s, state_names[s->state], (dsec_strv){0}, (dsec_kv){0});
}

static void do_op(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_err err;
    dsec_msg_op op;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_OP, dsec_msg_data(m), dsec_msg_len(m), &op, &err) < 0) {
        dsec_wire_error(n->actor, m, &err);
        return;
    }
    if (strcmp(op.id, s->id) != 0) {
        reply_bad(n, m, "id", "op: id %s does not match the subject's %s", op.id, s->id);
        return;
    }
    if (strcmp(op.op, "status") == 0) {
        do_status(n, m, s);
    } else if (strcmp(op.op, "destroy") == 0) {
        uint8_t why = s->reap;
        destroy_sbx(n, m, s, why == REAP_TTL ? "max lifetime reached"
                             : why == REAP_IDLE ? "idle timeout"
                             : why == REAP_LOST ? "its node was declared lost and its owner told so"
                             : why == REAP_SUPERSEDED
                                 ? "a retry of its create was kept on another node (its answer was lost)"
                                 : "destroyed by request");
        if (why == REAP_TTL)
            atomic_fetch_add(&n->reaped_ttl, 1);
        else if (why == REAP_IDLE)
            atomic_fetch_add(&n->reaped_idle, 1);
        else if (why == REAP_LOST)
            atomic_fetch_add(&n->reaped_lost, 1);
        else if (why == REAP_SUPERSEDED)
            atomic_fetch_add(&n->reaped_superseded, 1);
    } else if (strcmp(op.op, "pause") == 0 || strcmp(op.op, "resume") == 0) {
        do_pause_resume(n, m, s, op.op[0] == 'p');
    } else if (strcmp(op.op, "fork") == 0) {
        do_fork(n, m, s, op.n);
    } else if (strcmp(op.op, "freeze") == 0) {
        do_freeze(n, m, s);
    } else if (strcmp(op.op, "snapshot") == 0) {
        do_snapshot(n, m, s, op.name);
    } else if (strcmp(op.op, "net") == 0) {
        do_net(n, m, s, &op.net);
    } else {
        reply_err(n, m, DSEC_E_UNSUPPORTED,
                  "op \"%s\" is unknown (known: pause, resume, destroy, status, fork, freeze, "
                  "snapshot, net)",
                  op.op);
    }
}

static uint64_t key_of(const dsec_msg *cm, void *ud);

/* The operation m names on its sandbox, run to its answer on this thread. */
static void sbx_dispatch(dsec_actor *a, dsec_msg *m, dsec_node *n)
{
    struct target t;
    if (parse_target(m, &t) < 0) {
        reply_bad(n, m, "subject", "subject %s: expected dsec.v1.TENANT.sbx.NODE.ID.OP",
                  dsec_msg_subject(m));
        return;
    }
    static const struct {
        const char *op;
        int type;
    } ops[] = {{"exec", DSEC_MSG_EXEC},
               {"write", DSEC_MSG_FILE_WRITE},
               {"read", DSEC_MSG_FILE_READ},
               {"ls", DSEC_MSG_FILE_LIST},
               {"op", DSEC_MSG_OP}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strcmp(t.op, ops[i].op) == 0 && !dsec_wire_type_ok(a, m, ops[i].type))
            return;
    struct sbx *s = target_sbx(n, m, &t);
    if (s == NULL)
        return;
    if (strcmp(t.op, "exec") == 0)
        do_exec(n, m, s);
    else if (strcmp(t.op, "write") == 0)
        do_write(n, m, s);
    else if (strcmp(t.op, "read") == 0)
        do_read(n, m, s);
    else if (strcmp(t.op, "ls") == 0)
        do_list(n, m, s);
    else if (strcmp(t.op, "op") == 0)
        do_op(n, m, s);
    else
        reply_err(n, m, DSEC_E_UNSUPPORTED,
                  "operation \"%s\" is unknown (known: exec, write, read, ls, op)", t.op);
}

/* ---- operations off the bus's workers ------------------------------------------------- */

/* A sandbox operation waiting for, or running on, a work thread. Its key (the sandbox) is
 * held meanwhile, so the sandbox's operations still run one at a time and in order. */
struct sbx_job {
    dsec_node *n;
    dsec_deferred *d;
    void (*run)(dsec_node *n, dsec_msg *m);
};

static void sbx_dispatch_job(dsec_node *n, dsec_msg *m) { sbx_dispatch(n->actor, m, n); }

static void job_run(void *ud)
{
    struct sbx_job *j = ud;
    dsec_msg *m = dsec_deferred_msg(j->d);
    /* the work is still its request's: what it sends carries the trace id */
    dsec_trace_scope sc;
    dsec_deferred_trace(j->d, &sc);
    j->run(j->n, m);
    dsec_trace_leave(&sc);
    dsec_deferred_done(j->d);
    dsec_free(j);
}

/* Run fn for m on a work thread, in tenant's fair turn. When m cannot be deferred (out of
 * memory) it runs here, as before; when the queue is stopping, m is answered "closed". */
static void to_work(dsec_actor *a, dsec_msg *m, dsec_node *n, const char *tenant, uint64_t key,
                    void (*fn)(dsec_node *, dsec_msg *))
{
    struct sbx_job *j = dsec_malloc(sizeof *j);
    dsec_deferred *d = j != NULL ? dsec_actor_defer(a, m) : NULL;
    if (d == NULL) {
        dsec_free(j);
        fn(n, m);
        return;
    }
    *j = (struct sbx_job){.n = n, .d = d, .run = fn};
    dsec_err err;
    if (dsec_workq_submit(n->work, tenant, key, job_run, j, &err) < 0) {
        dsec_err_wrap(&err, "node %s", n->name);
        dsec_wire_error(n->actor, dsec_deferred_msg(d), &err);
        dsec_deferred_done(d);
        dsec_free(j);
    }
}

static void on_sbx(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_node *n = ud;
    struct target t;
    if (parse_target(m, &t) < 0) {
        reply_bad(n, m, "subject", "subject %s: expected dsec.v1.TENANT.sbx.NODE.ID.OP",
                  dsec_msg_subject(m));
        return;
    }
    if (strcmp(t.op, "exec") == 0) {
        /* a command on a backend that can start it without a thread: started here, and
         * its answer comes from the node's loop */
        pthread_mutex_lock(&n->mu);
        struct sbx *s = find_id(n, t.id);
        bool async = s != NULL && dsec_backend_exec_async(s->be);
        pthread_mutex_unlock(&n->mu);
        if (async) {
            sbx_dispatch(a, m, n);
            return;
        }
    }
    to_work(a, m, n, t.tenant, key_of(m, n), sbx_dispatch_job);
}

/* Operations on one sandbox run in order; different sandboxes in parallel.
 * Placements are keyed by request id so a retry of one create is serial. */
/* ---- job holdings ---------------------------------------------------------------- */

static char *field(char **p);

static struct hold **find_hold(dsec_node *n, const char *key)
{
    struct hold **pp = &n->holds;
    while (*pp && strcmp((*pp)->key, key) != 0)
        pp = &(*pp)->next;
    return pp;
}

static int hold_record(const struct hold *h, char *buf, size_t len)
{
    return snprintf(buf, len, "H\x1f%s\x1f%" PRIu64 "\x1f%" PRIu64, h->job, h->cpu_milli, h->memory_mb);
}

/* dsec.v1.ctl.hold.<node>: a job takes (or gives back) capacity here. Taking
 * is idempotent per (job, unit); so is giving back. The holding is journaled
 * before the answer, like a sandbox. */
static void on_hold(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_node *n = ud;
    dsec_err err;
    dsec_msg_job_hold h;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_JOB_HOLD))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_JOB_HOLD, dsec_msg_data(m), dsec_msg_len(m), &h,
                    &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    const char *unit = h.unit ? h.unit : "0";
    if (dsec_name_ok(h.job, DSEC_NAME_LEN_MAX) < 0 || dsec_name_ok(unit, DSEC_NAME_LEN_MAX) < 0 ||
        strlen(h.job) + strlen(unit) > 120) {
        reply_bad(n, m, dsec_name_ok(h.job, DSEC_NAME_LEN_MAX) < 0 ? "job" : "unit",
                  "job_hold: job and unit must be names of A-Z a-z 0-9 _ -, "
                  "120 characters together");
        return;
    }
    struct hold key = {0};
    snprintf(key.key, sizeof key.key, "hold.%s.%s", h.job, unit);
    const char *state = "held";
    pthread_mutex_lock(&n->mu);
    struct hold **pp = find_hold(n, key.key);
    if (!h.release && *pp == NULL) {
        if (n->cpu_free < h.cpu_milli || n->mem_free < h.memory_mb) {
            uint64_t cf = n->cpu_free, mf = n->mem_free;
            pthread_mutex_unlock(&n->mu);
            reply_err(n, m, DSEC_E_CAPACITY,
                      "node %s cannot hold %" PRIu64 " milli-CPU and %" PRIu64 " MB for job %s "
                      "(free: %" PRIu64 ", %" PRIu64 ")", n->name, h.cpu_milli, h.memory_mb, h.job, cf, mf);
            return;
        }
        struct hold *nh = dsec_malloc(sizeof *nh);
        if (nh == NULL) {
            pthread_mutex_unlock(&n->mu);
            reply_err(n, m, DSEC_E_NOMEM, "out of memory");
            return;
        }
        *nh = key;
        snprintf(nh->job, sizeof nh->job, "%s", h.job);
        nh->cpu_milli = h.cpu_milli;
        nh->memory_mb = h.memory_mb;
        nh->next = n->holds;
        n->holds = nh;
        n->cpu_free -= h.cpu_milli;
        n->mem_free -= h.memory_mb;
        n->dirty = true;
        char rec[200];
        int len = hold_record(nh, rec, sizeof rec);
        if (dsec_journal_put(n->journal, nh->key, rec, (size_t)len, &err) < 0) {
            n->holds = nh->next;
            release_resources(n, nh->cpu_milli, nh->memory_mb, 0, 0);
            pthread_mutex_unlock(&n->mu);
            dsec_free(nh);
            dsec_wire_error(a, m, &err);
            return;
        }
    } else if (h.release) {
        state = "released";
        struct hold *old = *pp;
        if (old != NULL) {
            *pp = old->next;
            release_resources(n, old->cpu_milli, old->memory_mb, 0, 0);
            if (dsec_journal_del(n->journal, old->key, &err) < 0)
                dsec_actor_count_error(a); /* the next start restores a holding nobody owns: logged */
            if (h.forced)
                fprintf(stderr, "dsec-node %s: holding %s released by force\n", n->name, old->key);
            dsec_free(old);
        }
    }
    pthread_mutex_unlock(&n->mu);
    dsec_msg_op_reply out = {.id = h.job, .state = state, .node = n->name};
    if (dsec_wire_reply(a, m, DSEC_MSG_OP_REPLY, &out, &err) < 0)
        dsec_actor_count_error(a);
}

/* A holding replayed from the journal at start. */
static int adopt_hold(dsec_node *n, const char *id, const char *data, size_t len, dsec_err *err)
{
    char buf[200];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf ? len : sizeof buf - 1), data);
    char *p = buf;
    char *tag = field(&p), *job = field(&p), *cpu = field(&p), *mem = p;
    struct hold *h = dsec_calloc(1, sizeof *h);
    if (h == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory re-adopting %s", id);
    if (tag == NULL || strcmp(tag, "H") != 0 || job == NULL || cpu == NULL || mem == NULL) {
        dsec_free(h);
        fprintf(stderr, "dsec-node %s: dropping unreadable holding %s\n", n->name, id);
        return 0;
    }
    snprintf(h->key, sizeof h->key, "%s", id);
    snprintf(h->job, sizeof h->job, "%s", job);
    h->cpu_milli = strtoull(cpu, NULL, 10);
    h->memory_mb = strtoull(mem, NULL, 10);
    pthread_mutex_lock(&n->mu);
    h->next = n->holds;
    n->holds = h;
    n->cpu_free = n->cpu_free >= h->cpu_milli ? n->cpu_free - h->cpu_milli : 0;
    n->mem_free = n->mem_free >= h->memory_mb ? n->mem_free - h->memory_mb : 0;
    pthread_mutex_unlock(&n->mu);
    return 0;
}

static uint64_t key_of(const dsec_msg *cm, void *ud)
{
    dsec_msg *m = (dsec_msg *)cm;
    const char *subj = dsec_msg_subject(m);
    const char *p = subj;
    int dots = 0;
    while (*p && dots < 5)
        if (*p++ == '.')
            dots++;
    if (dots == 5 && strncmp(subj, "dsec.v1.ctl.", 12) != 0) {
        const char *end = strchr(p, '.');
        uint64_t h = 1469598103934665603ull;
        for (; *p && p != end; p++)
            h = (h ^ (uint8_t)*p) * 1099511628211ull;
        return h;
    }
    const char *rid = dsec_msg_header(m, DSEC_HDR_REQ_ID);
    return rid ? hash_str(rid, NULL) : 0;
}

/* ---- reports ---------------------------------------------------------------- */

/* What each (tenant, project) holds here, for the quota actors: collected
 * under the node lock together with taking the queued events, so the events
 * that leave before a full report are exactly those the report includes. */
struct usage_set {
    dsec_msg_usage *v; /* open-addressed by (tenant, project) while collecting, then packed */
    char (*names)[2][DSEC_NAME_LEN_MAX + 1]; /* what v's strings point to once packed: the
                                                sandboxes may be gone when the report is sent */
    size_t cap, n;
};

static void usage_collect_locked(dsec_node *n, struct usage_set *u)
{
    size_t cap = 16;
    while (cap < n->live * 2 + 1)
        cap *= 2;
    u->v = dsec_calloc(cap, sizeof *u->v);
    u->names = dsec_malloc(cap * sizeof *u->names);
    if (u->v == NULL || u->names == NULL) {
        dsec_free(u->v);
        dsec_free(u->names);
        *u = (struct usage_set){0}; /* the report goes without usage; the next one has it */
        return;
    }
    u->cap = cap;
    u->n = 0;
    for (size_t b = 0; b < n->nbuckets; b++)
        for (struct sbx *s = n->by_id[b]; s; s = s->next_id) {
            size_t i = hash_str(s->tenant, s->project) & (cap - 1);
            while (u->v[i].tenant &&
                   (strcmp(u->v[i].tenant, s->tenant) != 0 || strcmp(u->v[i].project, s->project) != 0))
                i = (i + 1) & (cap - 1);
            if (u->v[i].tenant == NULL) {
                u->v[i].tenant = s->tenant;
                u->v[i].project = s->project;
                u->n++;
            }
            u->v[i].sandboxes++;
            u->v[i].cpu_milli += s->cpu_milli;
            u->v[i].memory_mb += s->memory_mb;
        }
    /* pack: the report lists them in a row; "" projects travel as absent */
    size_t k = 0;
    for (size_t i = 0; i < u->cap; i++)
        if (u->v[i].tenant) {
            u->v[k] = u->v[i];
            snprintf(u->names[k][0], sizeof u->names[k][0], "%s", u->v[i].tenant);
            snprintf(u->names[k][1], sizeof u->names[k][1], "%s", u->v[i].project);
            u->v[k].tenant = u->names[k][0];
            u->v[k].project = u->names[k][1][0] ? u->names[k][1] : NULL;
            k++;
        }
    u->n = k;
}

static void publish_capacity(dsec_node *n, bool full, uint64_t now, const struct usage_set *u)
{
    pthread_mutex_lock(&n->mu);
    dsec_msg_capacity c = {.node = n->name, .cell = n->cell, .seq = ++n->seq, .full = full,
                           .cpu_free_milli = n->cpu_free, .mem_free_mb = n->mem_free,
                           .slots_free = n->slots_free, .live = n->live,
                           .disk_free_mb = n->disk_free, .ts_ns = dsec_wall_ns()};
    n->dirty = false;
    c.conn = n->conn_base + dsec_bus_reconnects(n->bus);
    uint64_t by_type[DSEC_REGISTRY_MAX];
    memcpy(by_type, n->live_by_type, sizeof by_type);
    pthread_mutex_unlock(&n->mu);
    /* per offered type, so `dsec top` can show sandboxes by type */
    const char *tk[DSEC_REGISTRY_MAX], *tv[DSEC_REGISTRY_MAX];
    char counts[DSEC_REGISTRY_MAX][24];
    uint32_t ntk = 0;
    for (int i = 0; i < DSEC_REGISTRY_MAX; i++)
        if (n->offered & (1u << i)) {
            snprintf(counts[ntk], sizeof counts[ntk], "%" PRIu64, by_type[i]);
            tk[ntk] = type_name(n, i);
            tv[ntk] = counts[ntk];
            ntk++;
        }
    c.live_types = (dsec_kv){tk, tv, ntk};
    const char *lk[64], *lv[64];
    if (full) {
        c.cpu_milli = n->conf.cpu_milli;
        c.memory_mb = n->conf.memory_mb;
        c.slots = n->conf.slots;
        /* disk_open made sure the disk is more than the reserve */
        c.disk_mb = n->conf.disk_mb - n->conf.disk_reserve_mb;
        uint32_t nt = 0;
        while (n->type_names[nt])
            nt++;
        c.types = (dsec_strv){(const char **)n->type_names, nt};
        size_t nl = n->nlabels < 64 ? n->nlabels : 64;
        for (size_t i = 0; i < nl; i++) {
            lk[i] = n->labels[i].key;
            lv[i] = n->labels[i].value;
        }
        c.labels = (dsec_kv){lk, lv, (uint32_t)nl};
        c.usage = (dsec_list){u->v, (uint32_t)u->n};
        n->last_full_ns = now;
    }
    char subj[256];
    snprintf(subj, sizeof subj, "%s.capacity", n->subj_evt_node);
    dsec_err err;
    if (dsec_wire_send(n->actor, n->bus, subj, NULL, DSEC_MSG_CAPACITY, &c, NULL, &err) < 0)
        dsec_actor_count_error(n->actor);
}

/* Send the events taken from the queue (and free them). */
static void send_events(dsec_node *n, struct event *ev, size_t ne)
{
    if (ne == 0) {
        dsec_free(ev);
        return;
    }
    /* One message per batch, not per transition: events must not multiply
     * the bus messages per create. */
    dsec_msg_sandbox_event *items = dsec_calloc(ne, sizeof *items);
    if (items != NULL) {
        for (size_t i = 0; i < ne; i++)
            items[i] = (dsec_msg_sandbox_event){
                .id = ev[i].id, .state = state_names[ev[i].state], .prev = state_names[ev[i].prev],
                .node = n->name, .type = type_name(n, ev[i].type_idx), .tenant = ev[i].tenant,
                .ts_ns = ev[i].ts_ns, .reason = ev[i].reason[0] ? ev[i].reason : NULL,
                .project = ev[i].project[0] ? ev[i].project : NULL,
                .req_id = ev[i].req_id[0] ? ev[i].req_id : NULL, .cpu_milli = ev[i].cpu_milli,
                .memory_mb = ev[i].memory_mb,
                .trace_id = ev[i].trace_id[0] ? ev[i].trace_id : NULL};
        for (size_t off = 0; off < ne; off += 4096) {
            size_t cnt = ne - off < 4096 ? ne - off : 4096;
            dsec_msg_sandbox_events batch = {.node = n->name, .cell = n->cell,
                                             .events = {items + off, (uint32_t)cnt}};
            dsec_err err;
            if (dsec_wire_send(n->actor, n->bus, n->subj_evt_sbx, NULL, DSEC_MSG_SANDBOX_EVENTS,
                               &batch, NULL, &err) < 0)
                dsec_actor_count_error(n->actor);
        }
    }
    dsec_free(items);
    dsec_free(ev);
}

/* Queued events, then a capacity report (full when due or forced). One
 * report at a time (report_mu), so reports leave in the order they were
 * taken and each full report's usage covers the events sent before it. */
static void report(dsec_node *n, bool force_full, uint64_t now)
{
    pthread_mutex_lock(&n->report_mu);
    bool full = force_full || now - n->last_full_ns >= (uint64_t)n->conf.full_ms * 1000000ull;
    struct usage_set u = {0};
    pthread_mutex_lock(&n->mu);
    struct event *ev = n->events;
    size_t ne = n->nevents;
    n->events = NULL;
    n->nevents = n->cap_events = 0;
    if (full)
        usage_collect_locked(n, &u);
    if (full && u.v == NULL)
        full = false; /* out of memory: a full report without usage would zero this node's
                         share at the quota actor; the next tick tries again */
    bool dirty = n->dirty;
    pthread_mutex_unlock(&n->mu);
    /* events first: a quota actor applies them, then the full report's usage replaces its
     * count for this node, and that usage already includes every one of them */
    send_events(n, ev, ne);
    if (dirty || full)
        publish_capacity(n, full, now, &u);
    pthread_mutex_unlock(&n->report_mu);
    dsec_free(u.v);
    dsec_free(u.names);
}

static void tick_capacity(void *ud, uint64_t now)
{
    report(ud, false, now);
}

static void tick_sync(void *ud, uint64_t now)
{
    dsec_node *n = ud;
    dsec_err err;
    if (dsec_journal_sync(n->journal, &err) < 0)
        dsec_actor_count_error(n->actor);
}

static void tick_heartbeat(void *ud, uint64_t now)
{
    dsec_node *n = ud;
    dsec_msg_heartbeat hb = {.node = n->name, .cell = n->cell, .seq = ++n->hb_seq,
                             .ts_ns = dsec_wall_ns()};
    char subj[256];
    snprintf(subj, sizeof subj, "%s.heartbeat", n->subj_evt_node);
    dsec_err err;
    if (dsec_wire_send(n->actor, n->bus, subj, NULL, DSEC_MSG_HEARTBEAT, &hb, NULL, &err) < 0)
        dsec_actor_count_error(n->actor);
}

static int emit_live(dsec_journal *j, dsec_journal_emit_fn emit, void *ud, dsec_err *err)
{
    dsec_node *n = ud;
    char buf[1024];
    for (size_t b = 0; b < n->nbuckets; b++)
        for (struct sbx *s = n->by_id[b]; s; s = s->next_id) {
            if (s->state != ST_RUNNING && s->state != ST_PAUSED)
                continue;
            int len = record_format(n, s, buf, sizeof buf);
            if (len < 0 || (size_t)len >= sizeof buf)
                return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "record of %s too large", s->id);
            if (emit(j, s->id, buf, (size_t)len, err) < 0)
                return -1;
        }
    for (struct kept *k = n->kept; k; k = k->next)
        if (emit(j, k->id, k->data, k->len, err) < 0)
            return -1;
    for (struct hold *h = n->holds; h; h = h->next) {
        int len = hold_record(h, buf, sizeof buf);
        if (emit(j, h->key, buf, (size_t)len, err) < 0)
            return -1;
    }
    return 0;
}

/* Reap sandboxes past their lifetime or idle too long. The destroy goes
 * through the sandbox's own mailbox, so it runs in order with its other
 * operations. */
static void tick_reap(void *ud, uint64_t mono_now)
{
    dsec_node *n = ud;
    uint64_t now = dsec_wall_ns();
    enum { BATCH = 512 };
    char ids[BATCH][DSEC_SBX_ID_LEN_MAX + 1];
    char tenants[BATCH][DSEC_NAME_LEN_MAX + 1];
    size_t k = 0;
    uint64_t lost_before = atomic_load(&n->lost_before_ns);
    pthread_mutex_lock(&n->mu);
    for (size_t b = 0; b < n->nbuckets && k < BATCH; b++)
        for (struct sbx *s = n->by_id[b]; s && k < BATCH; s = s->next_id) {
            if (s->reap != REAP_NONE || (s->state != ST_RUNNING && s->state != ST_PAUSED))
                continue;
            uint8_t why = REAP_NONE;
            if (s->created_ns < lost_before)
                why = REAP_LOST;
            else if (s->superseded)
                why = REAP_SUPERSEDED;
            else if (s->ttl_ns && age_ns(now, s->created_ns) >= s->ttl_ns)
                why = REAP_TTL;
            else if (s->idle_ns && age_ns(now, s->last_ns) >= s->idle_ns)
                why = REAP_IDLE;
            if (why == REAP_NONE)
                continue;
            s->reap = why;
            memcpy(ids[k], s->id, sizeof ids[k]);
            memcpy(tenants[k], s->tenant, sizeof tenants[k]);
            k++;
        }
    bool compact = dsec_journal_wants_compaction(n->journal, n->live + n->nkept);
    /* Memory pressure: freeze idle pausable rollouts (their next operation
     * resumes them), a few per pass, until free memory is back over the mark. */
    size_t kfreeze = k;
    uint64_t want_mb = n->conf.memory_mb * n->conf.pressure_free_pct / 100;
    uint64_t idle_ns = (uint64_t)n->conf.pause_idle_ms * 1000000ull, gain = 0;
    for (size_t b = 0; n->conf.pause_idle_ms != UINT64_MAX && b < n->nbuckets && k < BATCH &&
                       n->mem_free + gain < want_mb; b++)
        for (struct sbx *s = n->by_id[b]; s && k < BATCH && n->mem_free + gain < want_mb; s = s->next_id) {
            if (!s->pausable || s->state != ST_RUNNING || s->freezing || s->reap != REAP_NONE ||
                age_ns(now, s->last_ns) < idle_ns)
                continue;
            s->freezing = true;
            gain += mem_held(s);
            memcpy(ids[k], s->id, sizeof ids[k]);
            memcpy(tenants[k], s->tenant, sizeof tenants[k]);
            k++;
        }
    pthread_mutex_unlock(&n->mu);
    for (size_t i = 0; i < k; i++) {
        char subj[256];
        snprintf(subj, sizeof subj, "dsec.v1.%.64s.sbx.%.64s.%.81s.op", tenants[i], n->name, ids[i]);
        dsec_msg_op op = {.id = ids[i], .op = i < kfreeze ? "destroy" : "freeze", .tenant = tenants[i]};
        dsec_err err;
        if (dsec_wire_send(n->actor, n->bus, subj, NULL, DSEC_MSG_OP, &op, NULL, &err) < 0)
            dsec_actor_count_error(n->actor);
    }
    if (compact) {
        dsec_err err;
        pthread_mutex_lock(&n->mu);
        int rc = dsec_journal_compact(n->journal, emit_live, n, &err);
        pthread_mutex_unlock(&n->mu);
        if (rc < 0)
            dsec_actor_count_error(n->actor);
    }
    (void)mono_now;
}

/* A retried create: answer if this node already holds the request id. Keyed
 * like placements (by request id), so a placement of the same request queued
 * before this lookup is handled first. Nodes without it stay silent. */
static void on_lookup(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_node *n = ud;
    dsec_err err;
    dsec_msg_op op;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_OP))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_OP, dsec_msg_data(m), dsec_msg_len(m), &op, &err) < 0) {
        dsec_wire_error(a, m, &err); /* malformed: an error, not the silence of "not here" */
        return;
    }
    if (op.req_id == NULL || op.tenant == NULL) {
        reply_bad(n, m, op.req_id == NULL ? "req_id" : "tenant",
                  "lookup: req_id and tenant are required");
        return;
    }
    pthread_mutex_lock(&n->mu);
    struct sbx *s = find_req(n, op.tenant, op.req_id);
    if (s != NULL && dsec_msg_reply(m) != NULL && op.retry > s->lookup_retry)
        /* other holders may answer too: the scheduler's notice names the one kept */
        s->lookup_retry = op.retry > UINT32_MAX ? UINT32_MAX : (uint32_t)op.retry;
    pthread_mutex_unlock(&n->mu);
    if (s != NULL && dsec_msg_reply(m) != NULL)
        send_created(n, dsec_msg_reply(m), s, true, op.req_id);
}

/* dsec.v1.ctl.superseded.<cell>[.<node>]: attempt r of a retried create
 * was placed on, or found by its lookup on, node W. Here:
 * - W is this node: the sandbox it holds for the request is the one kept
 *   for attempt r (a late notice of an earlier attempt leaves it alone);
 * - otherwise a sandbox made here for an earlier attempt has no owner (its
 *   answer was lost, or another holder's answer was passed on): it answers
 *   its request id no more and the reaper destroys it, in order with its
 *   other operations. It is kept if attempt r or a later one was placed
 *   here (W refused r and it came here), or a later attempt's lookup found
 *   it (that attempt's notice decides).
 * A placement of an attempt before r that arrives later is not created.
 * Repeats are harmless. */
static void on_superseded(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_node *n = ud;
    dsec_err err;
    dsec_msg_superseded_list l;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_SUPERSEDED_LIST))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_SUPERSEDED_LIST, dsec_msg_data(m), dsec_msg_len(m),
                    &l, &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    const dsec_msg_superseded *it = l.items.items;
    uint64_t now = dsec_wall_ns(), dropping = 0;
    pthread_mutex_lock(&n->mu);
    for (size_t i = 0; i < l.items.n; i++) {
        uint32_t retry = it[i].retry > UINT32_MAX ? UINT32_MAX : (uint32_t)it[i].retry;
        struct sbx *s = find_req(n, it[i].tenant, it[i].req_id);
        if (strcmp(it[i].node, n->name) == 0) {
            if (s != NULL)
                answers_locked(n, s, retry);
            continue;
        }
        add_tomb(n, it[i].tenant, it[i].req_id, retry, now);
        if (s != NULL && s->retry < retry && s->lookup_retry <= retry) {
            s->superseded = true;
            dropping++;
        }
    }
    pthread_mutex_unlock(&n->mu);
    if (dropping > 0)
        fprintf(stderr,
                "dsec-node %s: %" PRIu64 " sandbox(es) made for create attempts that were retried and "
                "kept on other nodes (their answers were lost): destroying them\n",
                n->name, dropping);
    if (dsec_msg_reply(m) == NULL)
        return;
    char c[24];
    snprintf(c, sizeof c, "%" PRIu64, dropping);
    const char *k[] = {"dropping"}, *v[] = {c};
    dsec_msg_op_reply r = {.id = n->name, .state = "superseded", .node = n->name, .info = {k, v, 1}};
    if (dsec_wire_reply(a, m, DSEC_MSG_OP_REPLY, &r, &err) < 0)
        dsec_actor_count_error(a);
}

/* dsec.v1.ctl.reconcile.<node>: a scheduler declared this node lost while it
 * was silent and told the owners of its sandboxes. Everything made before
 * then is theirs no longer: the reaper destroys it (in order with each
 * sandbox's other operations), so nothing is left orphaned. Repeats are
 * harmless; the answer says how many it will reclaim. */
static void on_reconcile(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_node *n = ud;
    dsec_err err;
    dsec_msg_node_lost nl;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_NODE_LOST))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_NODE_LOST, dsec_msg_data(m), dsec_msg_len(m), &nl,
                    &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    if (strcmp(nl.node, n->name) != 0) {
        reply_bad(n, m, "node", "reconcile: for node %s, sent to node %s", nl.node, n->name);
        return;
    }
    uint64_t prev = atomic_load(&n->lost_before_ns);
    while (nl.lost_ns > prev && !atomic_compare_exchange_weak(&n->lost_before_ns, &prev, nl.lost_ns))
        ;
    uint64_t count = 0;
    pthread_mutex_lock(&n->mu);
    for (size_t b = 0; b < n->nbuckets; b++)
        for (struct sbx *s = n->by_id[b]; s; s = s->next_id)
            count += s->created_ns < nl.lost_ns;
    pthread_mutex_unlock(&n->mu);
    if (count > 0)
        fprintf(stderr,
                "dsec-node %s: declared lost by %s after %" PRIu64 " ms of silence: reclaiming %" PRIu64
                " sandbox(es) its owners count as gone\n",
                n->name, nl.by ? nl.by : "a scheduler", nl.silent_ms, count);
    char c[24];
    snprintf(c, sizeof c, "%" PRIu64, count);
    const char *k[] = {"reclaiming"}, *v[] = {c};
    dsec_msg_op_reply r = {.id = n->name, .state = "reconciled", .node = n->name,
                           .info = {k, v, 1}};
    if (dsec_wire_reply(a, m, DSEC_MSG_OP_REPLY, &r, &err) < 0)
        dsec_actor_count_error(a);
}

/* A scheduler that just started asks for full reports rather than waiting
 * for the next periodic one. */
static void on_sync(dsec_actor *a, dsec_msg *m, void *ud)
{
    const char *type = dsec_msg_type(m);
    if (type == NULL || strcmp(type, "sync") != 0) { /* not a sync: dropped, counted */
        dsec_actor_count_error(a);
        return;
    }
    report(ud, true, dsec_now_ns());
}

/* ---- start, adopt, stop --------------------------------------------------------- */

static char *field(char **p)
{
    char *s = *p;
    if (s == NULL)
        return NULL;
    char *sep = strchr(s, '\x1f');
    if (sep) {
        *sep = '\0';
        *p = sep + 1;
    } else {
        *p = NULL;
    }
    return s;
}

static void kept_add(dsec_node *n, const char *id, const void *data, size_t len)
{
    struct kept *k = dsec_calloc(1, sizeof *k);
    char *kid = dsec_strdup(id), *kdata = dsec_malloc(len ? len : 1);
    if (k == NULL || kid == NULL || kdata == NULL) {
        /* the record is still in the journal; only a compaction now would lose it */
        fprintf(stderr, "dsec-node %s: out of memory keeping the record of %s\n", n->name, id);
        dsec_free(k);
        dsec_free(kid);
        dsec_free(kdata);
        return;
    }
    memcpy(kdata, data, len);
    k->id = kid;
    k->data = kdata;
    k->len = len;
    k->next = n->kept;
    n->kept = k;
    n->nkept++;
}

static int adopt_one(const char *id, const void *data, size_t len, void *ud, dsec_err *err)
{
    dsec_node *n = ud;
    if (strncmp(id, "hold.", 5) == 0)
        return adopt_hold(n, id, data, len, err);
    char *copy = dsec_strndup(data, len);
    struct sbx *s = dsec_calloc(1, sizeof *s);
    if (copy == NULL || s == NULL) {
        dsec_free(copy);
        dsec_free(s);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory re-adopting %s", id);
    }
    char *p = copy;
    char *f[11];
    for (int i = 0; i < 10; i++)
        f[i] = field(&p);
    const char *project = "";
    uint32_t retry = 0;
    uint64_t disk = 0;
    if (f[0] != NULL && (strcmp(f[0], "2") == 0 || strcmp(f[0], "3") == 0 || strcmp(f[0], "4") == 0)) {
        char *pj = field(&p);
        project = pj ? pj : "";
        if (strcmp(f[0], "2") != 0) {
            char *rt = field(&p);
            retry = rt ? (uint32_t)strtoul(rt, NULL, 10) : 0;
        }
        if (strcmp(f[0], "4") == 0) {
            char *dk = field(&p);
            disk = dk ? strtoull(dk, NULL, 10) : 0;
        }
        f[0] = (char *)"1"; /* the rest reads as version 1 */
    }
    f[10] = p ? p : (char *)"";
    int tidx = f[3] ? dsec_registry_find(n->reg, f[3]) : -1;
    snprintf(s->id, sizeof s->id, "%s", id);
    dsec_err aerr;
    const char *why = NULL;
    bool keep = false;
    if (f[9] == NULL || strcmp(f[0], "1") != 0)
        why = "unreadable record";
    else if (tidx < 0 || n->backends[tidx] == NULL)
        why = "its type is no longer offered here";
    if (why == NULL) {
        snprintf(s->tenant, sizeof s->tenant, "%s", f[1]);
        snprintf(s->project, sizeof s->project, "%s", project);
        snprintf(s->req_id, sizeof s->req_id, "%s", f[2]);
        s->retry = retry;
        s->type_idx = (uint8_t)tidx;
        s->state = (uint8_t)atoi(f[4]);
        s->cpu_milli = (uint32_t)strtoul(f[5], NULL, 10);
        s->memory_mb = (uint32_t)strtoul(f[6], NULL, 10);
        s->disk_mb = disk;
        s->created_ns = strtoull(f[7], NULL, 10);
        s->ttl_ns = strtoull(f[8], NULL, 10);
        s->idle_ns = strtoull(f[9], NULL, 10);
        s->last_ns = dsec_wall_ns();
        s->be = n->backends[tidx];
        s->bstate = dsec_strdup(f[10]);
        if (s->state != ST_PAUSED)
            s->state = ST_RUNNING;
        dsec_sandbox_spec spec;
        spec_for(n, s, NULL, &spec);
        if (s->bstate == NULL || dsec_backend_adopt(s->be, &spec, s->bstate, &s->h, &aerr) < 0) {
            why = s->bstate ? aerr.msg : "out of memory";
            keep = s->bstate != NULL && aerr.code == DSEC_E_CONFIG;
        }
    }
    if (keep) {
        /* It exists, but this node cannot run it as configured: not served, not counted,
         * reported failed, and its record kept for a later start. */
        fprintf(stderr,
                "dsec-node %s: not re-adopting %s (its record is kept for the next start): %s\n",
                n->name, id, why);
        atomic_fetch_add(&n->adopt_failed, 1);
        kept_add(n, id, data, len);
        pthread_mutex_lock(&n->mu);
        event_locked(n, s, ST_RUNNING, ST_FAILED, why);
        pthread_mutex_unlock(&n->mu);
        sbx_free(s);
        dsec_free(copy);
        return 0;
    }
    if (why != NULL) {
        /* Gone while we were away (or unusable): drop the record and say so. */
        fprintf(stderr, "dsec-node %s: not re-adopting %s: %s\n", n->name, id, why);
        atomic_fetch_add(&n->adopt_failed, 1);
        pthread_mutex_lock(&n->mu);
        event_locked(n, s, ST_RUNNING, ST_FAILED, why);
        pthread_mutex_unlock(&n->mu);
        /* the journal is still being opened: drop the record right after */
        s->next_id = n->dropped;
        n->dropped = s;
        dsec_free(copy);
        return 0;
    }
    pthread_mutex_lock(&n->mu);
    insert(n, s);
    n->cpu_free = n->cpu_free >= s->cpu_milli ? n->cpu_free - s->cpu_milli : 0;
    n->mem_free = n->mem_free >= s->memory_mb ? n->mem_free - s->memory_mb : 0;
    n->slots_free = n->slots_free >= 1 ? n->slots_free - 1 : 0;
    n->disk_free = n->disk_free >= s->disk_mb ? n->disk_free - s->disk_mb : 0;
    pthread_mutex_unlock(&n->mu);
    atomic_fetch_add(&n->adopted, 1);
    dsec_free(copy);
    return 0;
}

/* The disk sandboxes may hold: what the conf says, or the free space of the state
 * dir's filesystem now (backends keep sandboxes' writable layers under it), less the
 * reserve no sandbox takes (the journal, layers and logs need room too). */
static int disk_open(dsec_node *n, dsec_err *err)
{
    uint64_t total = n->conf.disk_mb;
    if (total == 0 && strcmp(n->conf.backend ? n->conf.backend : "sim", "sim") == 0)
        total = 1ull << 30; /* 1 PiB: simulated disk binds only when a test sets it */
    if (total == 0) {
        struct statvfs v;
        if (statvfs(n->conf.state_dir, &v) < 0)
            return dsec_err_set(err, DSEC_E_IO, errno, "node %s: measuring the free disk of %s",
                                n->name, n->conf.state_dir);
        total = (uint64_t)v.f_bavail * v.f_frsize >> 20;
    }
    if (total <= n->conf.disk_reserve_mb && n->conf.disk_mb != 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "node %s: disk_mb %" PRIu64 " is not more than disk_reserve_mb %" PRIu64
                            ": no sandbox could have a writable layer (raise disk_mb or lower "
                            "disk_reserve_mb)",
                            n->name, total, n->conf.disk_reserve_mb);
    if (total <= n->conf.disk_reserve_mb)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "node %s: %" PRIu64 " MB free on the filesystem of %s is not more than "
                            "disk_reserve_mb %" PRIu64 ": no sandbox could have a writable layer "
                            "(free space there, or lower disk_reserve_mb)",
                            n->name, total, n->conf.state_dir, n->conf.disk_reserve_mb);
    n->conf.disk_mb = total;
    n->disk_free = total - n->conf.disk_reserve_mb;
    return 0;
}

static int copy_conf(dsec_node *n, const dsec_node_conf *c, dsec_err *err)
{
    n->conf = *c;
    dsec_node_conf *k = &n->conf;
    if (k->cpu_milli == 0)
        k->cpu_milli = 8000;
    if (k->memory_mb == 0)
        k->memory_mb = 16384;
    if (k->slots == 0)
        k->slots = 4096;
    if (k->capacity_ms == 0)
        k->capacity_ms = 100;
    if (k->full_ms == 0)
        k->full_ms = 5000;
    if (k->heartbeat_ms == 0)
        k->heartbeat_ms = 1000;
    if (k->reap_ms == 0)
        k->reap_ms = 1000;
    if (k->default_cpu_milli == 0)
        k->default_cpu_milli = 1000;
    if (k->default_memory_mb == 0)
        k->default_memory_mb = 512;
    if (k->default_disk_mb == 0)
        k->default_disk_mb = 1024;
    if (k->default_function_disk_mb == 0)
        k->default_function_disk_mb = 64;
    if (k->disk_reserve_mb == 0)
        k->disk_reserve_mb = 2048;
    if (k->default_ttl_s == 0)
        k->default_ttl_s = 3600;
    if (k->default_idle_s == 0)
        k->default_idle_s = 900;
    if (k->max_ttl_s == 0)
        k->max_ttl_s = 86400;
    if (k->pause_idle_ms == 0)
        k->pause_idle_ms = 30000;
    if (k->pressure_free_pct == 0)
        k->pressure_free_pct = 10;
    static const char *const default_types[] = {"sim", NULL};
    const char *const *types = c->types ? c->types : default_types;
    size_t nt = 0;
    while (types[nt])
        nt++;
    n->type_names = dsec_calloc(nt + 1, sizeof *n->type_names);
    n->labels = dsec_calloc(c->nlabels ? c->nlabels : 1, sizeof *n->labels);
    if (n->type_names == NULL || n->labels == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    for (size_t i = 0; i < nt; i++)
        if ((n->type_names[i] = dsec_strdup(types[i])) == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    for (size_t i = 0; i < c->nlabels; i++) {
        n->labels[i].key = dsec_strdup(c->labels[i].key);
        n->labels[i].value = dsec_strdup(c->labels[i].value);
        n->nlabels = i + 1;
        if (n->labels[i].key == NULL || n->labels[i].value == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    k->types = NULL;
    k->labels = NULL;
    k->backend_opts = NULL;
    k->name = k->cell = k->state_dir = k->backend = NULL;
    return 0;
}

static int open_backends(dsec_node *n, const dsec_node_conf *c, dsec_err *err)
{
    bool sim = c->backend == NULL || strcmp(c->backend, "sim") == 0;
    if (!sim && strcmp(c->backend, "native") != 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "node %s: backend \"%s\" is unknown (known: sim, native)",
                            n->name, c->backend);
    size_t nt = 0;
    while (n->type_names[nt])
        nt++;
    if (dsec_registry_mask(n->reg, (const char *const *)n->type_names, nt, false, &n->offered, err) < 0)
        return dsec_err_wrap(err, "node %s: types", n->name);
    char dir[4096], cache_dir[4096];
    /* One layer cache per node, whichever backends use layers. */
    snprintf(cache_dir, sizeof cache_dir, "%s/layers", c->state_dir);
    dsec_backend *shared = NULL;
    for (size_t i = 0; i < nt; i++) {
        int idx = dsec_registry_find(n->reg, n->type_names[i]);
        const dsec_backend_ops *ops = sim ? &dsec_sim_ops : dsec_registry_ops(n->reg, idx);
        if (ops == NULL)
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "node %s: sandbox type \"%s\" has no backend in this build (use backend: sim)",
                                n->name, n->type_names[i]);
        if (sim && shared != NULL) {
            n->backends[idx] = shared;
            continue;
        }
        snprintf(dir, sizeof dir, "%s/%s", c->state_dir, sim ? "sim" : n->type_names[i]);
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
            return dsec_err_set(err, DSEC_E_IO, errno, "node %s: creating %s", n->name, dir);
        dsec_backend_config bc = {.state_dir = dir,
                                  .node = n->name,
                                  .opts = c->backend_opts,
                                  .nopts = c->nbackend_opts,
                                  .layers = c->layers,
                                  .layer_cache_dir = cache_dir,
                                  .net = sim ? NULL : n->net,
                                  .loop = n->loop};
        if (dsec_backend_new(&n->backends[idx], ops, &bc, err) < 0)
            return dsec_err_wrap(err, "node %s: opening the %s backend", n->name, ops->type);
        if (sim)
            shared = n->backends[idx];
    }
    return 0;
}

/* An alert from the network containment (its own thread): published as is;
 * the net module has aggregated and rate-limited them already. */
static void on_net_alert(void *arg, const dsec_net_alert *a)
{
    dsec_node *n = arg;
    dsec_msg_net_alert m = {.sandbox = a->sandbox, .tenant = a->tenant, .node = n->name,
                            .cell = n->cell, .kind = a->kind, .dest = a->dest,
                            .detail = a->detail, .count = a->count, .first_ns = a->first_ns,
                            .last_ns = a->last_ns};
    dsec_err err;
    pthread_mutex_lock(&n->alert_mu);
    if (n->alert_on &&
        dsec_wire_send(n->actor, n->bus, n->subj_alert, NULL, DSEC_MSG_NET_ALERT, &m, NULL, &err) < 0)
        fprintf(stderr, "dsec-node %s: publishing a network alert: %s\n", n->name, err.msg);
    else if (n->alert_on)
        atomic_fetch_add(&n->net_alerts, 1);
    pthread_mutex_unlock(&n->alert_mu);
}

static int open_net(dsec_node *n, const dsec_node_conf *c, dsec_err *err)
{
    if (c->net == NULL)
        return 0;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/net", c->state_dir);
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return dsec_err_set(err, DSEC_E_IO, errno, "node %s: creating %s", n->name, dir);
    dsec_net_conf nc = *c->net;
    nc.state_dir = dir;
    nc.tag = c->net_tag;
    nc.on_alert = on_net_alert;
    nc.alert_arg = n;
    if (dsec_net_new(&n->net, &nc, err) < 0)
        return dsec_err_wrap(err, "node %s", n->name);
    return 0;
}

static void announce(dsec_node *n)
{
    uint32_t nt = 0;
    while (n->type_names[nt])
        nt++;
    const char *lk[64], *lv[64];
    size_t nl = n->nlabels < 64 ? n->nlabels : 64;
    for (size_t i = 0; i < nl; i++) {
        lk[i] = n->labels[i].key;
        lv[i] = n->labels[i].value;
    }
    dsec_msg_node_announce an = {.node = n->name, .cell = n->cell,
                                 .types = {(const char **)n->type_names, nt},
                                 .labels = {lk, lv, (uint32_t)nl}, .cpu_milli = n->conf.cpu_milli,
                                 .memory_mb = n->conf.memory_mb, .slots = n->conf.slots,
                                 .started_ns = dsec_wall_ns()};
    char subj[256];
    snprintf(subj, sizeof subj, "%s.announce", n->subj_evt_node);
    dsec_err err;
    if (dsec_wire_send(n->actor, n->bus, subj, NULL, DSEC_MSG_NODE_ANNOUNCE, &an, NULL, &err) < 0)
        dsec_actor_count_error(n->actor);
    report(n, true, dsec_now_ns());
}

int dsec_node_start(dsec_node **out, dsec_bus *bus, dsec_ticker *ticker, const dsec_registry *reg,
                    const dsec_node_conf *c, dsec_err *err)
{
    *out = NULL;
    if (dsec_name_ok(c->name, DSEC_NAME_LEN_MAX) < 0 || dsec_name_ok(c->cell, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "node name \"%s\" and cell \"%s\" must be 1-64 characters of A-Z a-z 0-9 _ -",
                            c->name ? c->name : "", c->cell ? c->cell : "");
    if (c->state_dir == NULL)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "node %s: state_dir is required", c->name);
    dsec_node *n = dsec_calloc(1, sizeof *n);
    if (n == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    pthread_mutex_init(&n->mu, NULL);
    pthread_mutex_init(&n->report_mu, NULL);
    pthread_mutex_init(&n->alert_mu, NULL);
    for (int i = 0; i < 4; i++)
        n->ticks[i] = -1;
    n->bus = bus;
    n->ticker = ticker;
    n->reg = reg;
    snprintf(n->name, sizeof n->name, "%s", c->name);
    snprintf(n->cell, sizeof n->cell, "%s", c->cell);
    snprintf(n->subj_evt_node, sizeof n->subj_evt_node, "dsec.v1.ctl.evt.%s.node.%s", n->cell, n->name);
    snprintf(n->subj_evt_sbx, sizeof n->subj_evt_sbx, "dsec.v1.ctl.evt.%s.sbx.%s", n->cell, n->name);
    snprintf(n->subj_alert, sizeof n->subj_alert, "dsec.v1.ctl.evt.%s.alert.%s", n->cell, n->name);
    if (copy_conf(n, c, err) < 0)
        goto out_fail;
    /* seq continues across restarts (wall-clock based), so a restarted node's
     * reports are never mistaken for stale ones */
    n->seq = dsec_wall_ns() / 1000;
    n->conn_base = dsec_wall_ns();
    n->cpu_free = n->conf.cpu_milli;
    n->mem_free = n->conf.memory_mb;
    n->slots_free = n->conf.slots;
    n->nbuckets = 1;
    while (n->nbuckets < n->conf.slots * 2)
        n->nbuckets <<= 1;
    n->by_id = dsec_calloc(n->nbuckets, sizeof *n->by_id);
    n->by_req = dsec_calloc(n->nbuckets, sizeof *n->by_req);
    n->tombs = dsec_calloc(TOMB_BUCKETS, sizeof *n->tombs);
    if (n->by_id == NULL || n->by_req == NULL || n->tombs == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        goto out_fail;
    }
    if (mkdir(c->state_dir, 0700) < 0 && errno != EEXIST) {
        dsec_err_set(err, DSEC_E_IO, errno, "node %s: creating state dir %s", n->name, c->state_dir);
        goto out_fail;
    }
    if (disk_open(n, err) < 0)
        goto out_fail;
    snprintf(n->snap_dir, sizeof n->snap_dir, "%s/snapshots", c->state_dir);
    /* it holds only snapshots being made: what is there now, a crash left (or a node
     * manager that kept them all) */
    if (nftw(n->snap_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0 && errno != ENOENT) {
        dsec_err_set(err, DSEC_E_IO, errno, "node %s: clearing %s", n->name, n->snap_dir);
        goto out_fail;
    }
    if (mkdir(n->snap_dir, 0700) < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "node %s: creating %s", n->name, n->snap_dir);
        goto out_fail;
    }
    int threads = c->work_threads > 0 ? c->work_threads : 16;
    char lname[16];
    snprintf(lname, sizeof lname, "loop-%.10s", n->name);
    n->loop = c->loop;
    n->work = c->work;
    n->own_loop = n->loop == NULL;
    n->own_work = n->work == NULL;
    if ((n->own_loop && dsec_loop_new(&n->loop, lname, err) < 0) ||
        (n->own_work && dsec_workq_new(&n->work, "node-work", threads, err) < 0) ||
        dsec_results_new(&n->results, RESULTS_BUDGET, RESULTS_TTL_MS, err) < 0) {
        dsec_err_wrap(err, "node %s", n->name);
        goto out_fail;
    }
    if (open_net(n, c, err) < 0 || open_backends(n, c, err) < 0)
        goto out_fail;
    if (dsec_actor_new(&n->actor, bus, n->name, err) < 0)
        goto out_fail;
    pthread_mutex_lock(&n->alert_mu);
    n->alert_on = true;
    pthread_mutex_unlock(&n->alert_mu);
    char path[4096];
    snprintf(path, sizeof path, "%s/sandboxes.journal", c->state_dir);
    if (dsec_journal_open(&n->journal, path, adopt_one, n, err) < 0) {
        dsec_err_wrap(err, "node %s", n->name);
        goto out_fail;
    }
    while (n->dropped != NULL) {
        struct sbx *d = n->dropped;
        n->dropped = d->next_id;
        dsec_err derr;
        if (dsec_journal_del(n->journal, d->id, &derr) < 0)
            fprintf(stderr, "dsec-node %s: %s\n", n->name, derr.msg);
        sbx_free(d);
    }
    if (n->net != NULL) { /* after adoption: whatever no sandbox holds is a crash's leftover */
        dsec_err serr;
        int swept = dsec_net_sweep(n->net, &serr);
        if (swept < 0)
            fprintf(stderr, "dsec-node %s: sweeping network leftovers: %s\n", n->name, serr.msg);
        else if (swept > 0)
            fprintf(stderr, "dsec-node %s: removed %d leftover sandbox network(s)\n", n->name,
                    swept);
    }
    dsec_actor_set_key(n->actor, key_of, n);
    char subj[256];
    snprintf(subj, sizeof subj, "dsec.v1.ctl.place.%s", n->name);
    if (dsec_actor_on(n->actor, subj, NULL, on_place, n, err) < 0)
        goto out_fail;
    snprintf(subj, sizeof subj, "dsec.v1.*.sbx.%s.>", n->name);
    if (dsec_actor_on(n->actor, subj, NULL, on_sbx, n, err) < 0)
        goto out_fail;
    snprintf(subj, sizeof subj, "dsec.v1.ctl.sync.%s", n->cell);
    if (dsec_actor_on(n->actor, subj, NULL, on_sync, n, err) < 0 ||
        dsec_actor_on(n->actor, "dsec.v1.ctl.sync", NULL, on_sync, n, err) < 0)
        goto out_fail;
    snprintf(subj, sizeof subj, "dsec.v1.ctl.lookup.%s", n->cell);
    if (dsec_actor_on(n->actor, subj, NULL, on_lookup, n, err) < 0)
        goto out_fail;
    snprintf(subj, sizeof subj, "dsec.v1.ctl.hold.%s", n->name);
    if (dsec_actor_on(n->actor, subj, NULL, on_hold, n, err) < 0)
        goto out_fail;
    snprintf(subj, sizeof subj, "dsec.v1.ctl.reconcile.%s", n->name);
    if (dsec_actor_on(n->actor, subj, NULL, on_reconcile, n, err) < 0)
        goto out_fail;
    snprintf(subj, sizeof subj, "dsec.v1.ctl.superseded.%s", n->cell);
    if (dsec_actor_on(n->actor, subj, NULL, on_superseded, n, err) < 0)
        goto out_fail;
    snprintf(subj, sizeof subj, "dsec.v1.ctl.superseded.%s.%s", n->cell, n->name);
    if (dsec_actor_on(n->actor, subj, NULL, on_superseded, n, err) < 0)
        goto out_fail;
    if ((n->ticks[0] = dsec_ticker_add(ticker, n->conf.capacity_ms, tick_capacity, n, err)) < 0 ||
        (n->ticks[1] = dsec_ticker_add(ticker, n->conf.heartbeat_ms, tick_heartbeat, n, err)) < 0 ||
        (n->ticks[2] = dsec_ticker_add(ticker, n->conf.reap_ms, tick_reap, n, err)) < 0)
        goto out_fail;
    n->sync_ticker = c->sync_ticker ? c->sync_ticker : ticker;
    if (c->sync_ms >= 0 &&
        (n->ticks[3] = dsec_ticker_add(n->sync_ticker, c->sync_ms ? (uint32_t)c->sync_ms : 1000,
                                       tick_sync, n, err)) < 0)
        goto out_fail;
    announce(n);
    *out = n;
    return 0;
out_fail:
    dsec_node_stop(n, 0);
    return -1;
}

void dsec_node_stop(dsec_node *n, int destroy_all)
{
    if (n == NULL)
        return;
    for (int i = 0; i < 3; i++)
        dsec_ticker_remove(n->ticker, n->ticks[i]);
    dsec_ticker_remove(n->sync_ticker, n->ticks[3]);
    pthread_mutex_lock(&n->alert_mu);
    n->alert_on = false;
    pthread_mutex_unlock(&n->alert_mu);
    /* Commands in flight end first (their requesters hear the node stopped; the commands
     * go on in their sandboxes), then the queued work runs out, then the actor, which
     * waits for every deferred message, can go. */
    if (n->loop != NULL && n->own_loop)
        dsec_loop_stop(n->loop);
    if (n->work != NULL && n->own_work)
        dsec_workq_stop(n->work);
    dsec_actor_free(n->actor);
    n->actor = NULL;
    for (size_t b = 0; n->by_id && b < n->nbuckets; b++) {
        struct sbx *s = n->by_id[b];
        while (s) {
            struct sbx *next = s->next_id;
            dsec_err err;
            if (destroy_all) {
                if (dsec_backend_destroy(s->be, s->h, &err) == 0 && n->journal)
                    dsec_journal_del(n->journal, s->id, &err);
            } else {
                dsec_backend_detach(s->be, s->h);
            }
            sbx_free(s);
            s = next;
        }
    }
    while (n->dropped != NULL) {
        struct sbx *d = n->dropped;
        n->dropped = d->next_id;
        sbx_free(d);
    }
    while (n->holds != NULL) {
        struct hold *h = n->holds;
        n->holds = h->next;
        dsec_free(h);
    }
    while (n->kept != NULL) {
        struct kept *k = n->kept;
        n->kept = k->next;
        dsec_free(k->id);
        dsec_free(k->data);
        dsec_free(k);
    }
    dsec_journal_close(n->journal);
    dsec_backend *freed[DSEC_REGISTRY_MAX] = {0};
    size_t nf = 0;
    for (int i = 0; i < DSEC_REGISTRY_MAX; i++) {
        bool dup = false;
        for (size_t j = 0; j < nf && !dup; j++)
            dup = freed[j] == n->backends[i];
        if (n->backends[i] && !dup) {
            freed[nf++] = n->backends[i];
            dsec_backend_free(n->backends[i]);
        }
    }
    dsec_net_free(n->net, !destroy_all); /* after the backends: they borrow it */
    if (n->own_work)
        dsec_workq_free(n->work);
    if (n->own_loop)
        dsec_loop_free(n->loop);
    dsec_results_free(n->results);
    for (size_t i = 0; n->type_names && n->type_names[i]; i++)
        dsec_free(n->type_names[i]);
    dsec_free(n->type_names);
    for (size_t i = 0; i < n->nlabels; i++) {
        dsec_free((char *)n->labels[i].key);
        dsec_free((char *)n->labels[i].value);
    }
    dsec_free(n->labels);
    dsec_free(n->by_id);
    dsec_free(n->by_req);
    for (struct tomb *t = n->tomb_old, *nt; t; t = nt) {
        nt = t->next_old;
        dsec_free(t);
    }
    dsec_free(n->tombs);
    dsec_free(n->events);
    pthread_mutex_destroy(&n->alert_mu);
    pthread_mutex_destroy(&n->mu);
    pthread_mutex_destroy(&n->report_mu);
    dsec_free(n);
}

void dsec_node_stats_get(dsec_node *n, dsec_node_stats *o)
{
    pthread_mutex_lock(&n->mu);
    *o = (dsec_node_stats){.live = n->live, .created = n->created, .destroyed = n->destroyed,
                           .refused = n->refused, .adopted = n->adopted,
                           .adopt_failed = n->adopt_failed, .reaped_ttl = n->reaped_ttl,
                           .reaped_idle = n->reaped_idle, .cpu_free_milli = n->cpu_free,
                           .mem_free_mb = n->mem_free, .slots_free = n->slots_free,
                           .disk_free_mb = n->disk_free, .net_alerts = n->net_alerts, .reaped_superseded = n->reaped_superseded,
                           .stale_places = n->stale_places,
                           .execs_inflight = n->execs_inflight, .execs_peak = n->execs_peak};
    dsec_net *net = n->net;
    pthread_mutex_unlock(&n->mu);
    if (n->work != NULL) {
        dsec_workq_stats ws;
        dsec_workq_stats_get(n->work, &ws);
        o->work_queued = ws.queued;
        o->work_peak = ws.peak_queued;
    }
    if (net != NULL) {
        dsec_net_stats ns;
        dsec_net_stats_get(net, &ns);
        o->net_blocked = ns.blocked;
        o->dns_queries = ns.dns_queries;
        o->dns_refused = ns.dns_refused;
        o->dns_cache_hits = ns.dns_cache_hits;
        o->dns_cache_misses = ns.dns_cache_misses;
        o->dns_cache_evictions = ns.dns_cache_evictions;
        o->dns_upstream_tcp = ns.dns_upstream_tcp;
    }
}

const char *const dsec_node_state_names[DSEC_NODE_NSTATES] = {
    "requested", "starting", "running", "paused", "stopping", "gone", "failed"};

void dsec_node_states_get(dsec_node *n, uint64_t out[DSEC_NODE_NSTATES])
{
    memset(out, 0, DSEC_NODE_NSTATES * sizeof *out);
    pthread_mutex_lock(&n->mu);
    for (size_t b = 0; b < n->nbuckets; b++)
        for (const struct sbx *s = n->by_id[b]; s; s = s->next_id) {
            uint8_t st = s->state;
            if (st < DSEC_NODE_NSTATES)
                out[st]++;
        }
    pthread_mutex_unlock(&n->mu);
}

size_t dsec_node_types_get(dsec_node *n, const char **names, uint64_t *live, size_t max)
{
    size_t k = 0;
    pthread_mutex_lock(&n->mu);
    for (int i = 0; i < DSEC_REGISTRY_MAX && k < max; i++) {
        if (!(n->offered & (1u << i)))
            continue;
        names[k] = type_name(n, i);
        live[k++] = n->live_by_type[i];
    }
    pthread_mutex_unlock(&n->mu);
    return k;
}

void dsec_node_create_latency(dsec_node *n, dsec_metrics_hist_snap *out)
{
    dsec_metrics_hist_read(&n->create_lat, out);
}

const dsec_actor *dsec_node_actor(const dsec_node *n) { return n->actor; }

const char *dsec_node_name(const dsec_node *n) { return n->name; }
