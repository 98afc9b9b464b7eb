/* node-table.c - tables of sandboxes and tombs, journal records, job holdings, re-adoption. */
#include "actors/node-int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/wire.h"
#include "dsec/alloc.h"
#include "dsec/log.h"
#include "dsec/names.h"

static char *field(char **p);

const char *const dsec__node_state_names[] = {"requested", "starting", "running", "paused",
                                              "stopping",  "gone",     "failed"};

/* ---- tables (node lock held) -------------------------------------------------- */

struct sbx *dsec__node_find_id(dsec_node *n, const char *id)
{
    for (struct sbx *s = n->by_id[dsec__node_hash_str(id, NULL) % n->nbuckets]; s; s = s->next_id)
        if (strcmp(s->id, id) == 0)
            return s;
    return NULL;
}

/* The sandbox that answers (tenant, req_id): a superseded one answers no more. */
struct sbx *dsec__node_find_req(dsec_node *n, const char *tenant, const char *req_id)
{
    for (struct sbx *s = n->by_req[dsec__node_hash_str(tenant, req_id) % n->nbuckets]; s;
         s = s->next_req)
        if (!s->superseded && strcmp(s->req_id, req_id) == 0 && strcmp(s->tenant, tenant) == 0)
            return s;
    return NULL;
}

struct tomb *dsec__node_find_tomb(dsec_node *n, const char *tenant, const char *req_id)
{
    for (struct tomb *t = n->tombs[dsec__node_hash_str(tenant, req_id) % TOMB_BUCKETS]; t;
         t = t->next)
        if (strcmp(t->req_id, req_id) == 0 && strcmp(t->tenant, tenant) == 0)
            return t;
    return NULL;
}

/* Remember that attempt retry of (tenant, req_id) was placed elsewhere; the
 * oldest are forgotten past TOMB_TTL_NS or TOMBS_MAX. */
void dsec__node_add_tomb(dsec_node *n, const char *tenant, const char *req_id, uint32_t retry,
                         uint64_t now)
{
    while (n->tomb_old != NULL && (n->ntombs >= TOMBS_MAX || n->tomb_old->expires_ns <= now)) {
        struct tomb *o = n->tomb_old;
        for (struct tomb **pp = &n->tombs[dsec__node_hash_str(o->tenant, o->req_id) % TOMB_BUCKETS];
             *pp; pp = &(*pp)->next)
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
    struct tomb *t = dsec__node_find_tomb(n, tenant, req_id);
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
    size_t b = dsec__node_hash_str(tenant, req_id) % TOMB_BUCKETS;
    t->next = n->tombs[b];
    n->tombs[b] = t;
    if (n->tomb_new != NULL)
        n->tomb_new->next_old = t;
    else
        n->tomb_old = t;
    n->tomb_new = t;
    n->ntombs++;
}

/* ---- sandboxes gone on the node's own account (node lock held unless said) ------- */

const struct gone *dsec__node_find_gone(dsec_node *n, const char *id)
{
    for (struct gone *g = n->gone[dsec__node_hash_str(id, NULL) % GONE_BUCKETS]; g; g = g->next)
        if (strcmp(g->id, id) == 0)
            return g;
    return NULL;
}

/* Forget the oldest notes past GONE_TTL_NS or GONE_MAX (node lock held). Their journal
 * records go at the next compaction, and a restart skips them. */
static void gone_expire_locked(dsec_node *n, uint64_t now, size_t room)
{
    while (n->gone_old != NULL &&
           (n->ngone + room > GONE_MAX || n->gone_old->at_ns + GONE_TTL_NS <= now)) {
        struct gone *o = n->gone_old;
        for (struct gone **pp = &n->gone[dsec__node_hash_str(o->id, NULL) % GONE_BUCKETS]; *pp;
             pp = &(*pp)->next)
            if (*pp == o) {
                *pp = o->next;
                break;
            }
        n->gone_old = o->next_old;
        if (n->gone_old == NULL)
            n->gone_new = NULL;
        n->ngone--;
        dsec_free(o);
    }
}

/* Remember (node lock held) that id is gone for reason since at_ns. */
static void gone_add_locked(dsec_node *n, const char *id, const char *tenant, const char *reason,
                            uint64_t at_ns)
{
    gone_expire_locked(n, dsec_wall_ns(), 1);
    if (dsec__node_find_gone(n, id) != NULL)
        return;
    struct gone *g = dsec_calloc(1, sizeof *g);
    if (g == NULL)
        return; /* an operation on it hears "no sandbox" without the reason */
    g->at_ns = at_ns;
    snprintf(g->id, sizeof g->id, "%s", id);
    snprintf(g->tenant, sizeof g->tenant, "%s", tenant);
    snprintf(g->reason, sizeof g->reason, "%s", reason);
    size_t b = dsec__node_hash_str(id, NULL) % GONE_BUCKETS;
    g->next = n->gone[b];
    n->gone[b] = g;
    if (n->gone_new != NULL)
        n->gone_new->next_old = g;
    else
        n->gone_old = g;
    n->gone_new = g;
    n->ngone++;
}

/* "gone", when, tenant, reason: the record of a sandbox gone on the node's own account. */
static int gone_record(const struct gone *g, char *buf, size_t len)
{
    return snprintf(buf, len, "gone\x1f%" PRIu64 "\x1f%s\x1f%s", g->at_ns, g->tenant, g->reason);
}

/* The journal record of id becomes its note, or goes if it has none (node lock not held). */
int dsec__node_gone_put(dsec_node *n, const char *id, dsec_err *err)
{
    char buf[512];
    int len = -1;
    pthread_mutex_lock(&n->mu);
    const struct gone *g = dsec__node_find_gone(n, id);
    if (g != NULL)
        len = gone_record(g, buf, sizeof buf);
    pthread_mutex_unlock(&n->mu);
    if (len < 0)
        return dsec_journal_del(n->journal, id, err);
    return dsec_journal_put(n->journal, id, buf, (size_t)len, err);
}

/* s is gone for reason, not at its owner's request (the node lock not held): its journal
 * record becomes the note that says so, in one write, and operations on it hear why. */
int dsec__node_gone(dsec_node *n, const struct sbx *s, const char *reason, dsec_err *err)
{
    pthread_mutex_lock(&n->mu);
    gone_add_locked(n, s->id, s->tenant, reason, dsec_wall_ns());
    pthread_mutex_unlock(&n->mu);
    return dsec__node_gone_put(n, s->id, err);
}

void dsec__node_gone_free_all(dsec_node *n)
{
    for (struct gone *g = n->gone_old, *ng; g; g = ng) {
        ng = g->next_old;
        dsec_free(g);
    }
    dsec_free(n->gone);
    n->gone = NULL;
    n->gone_old = n->gone_new = NULL;
    n->ngone = 0;
}

/* A note replayed from the journal: kept unless it has expired. */
static int adopt_gone(dsec_node *n, const char *id, const char *data, size_t len)
{
    char *copy = dsec_strndup(data, len);
    if (copy == NULL)
        return 0; /* the record stays; an operation hears "no sandbox" without the reason */
    char *p = copy;
    field(&p); /* "gone" */
    char *at = field(&p), *tenant = field(&p);
    uint64_t at_ns = at ? strtoull(at, NULL, 10) : 0;
    if (tenant != NULL && p != NULL && at_ns + GONE_TTL_NS > dsec_wall_ns()) {
        pthread_mutex_lock(&n->mu);
        gone_add_locked(n, id, tenant, p, at_ns);
        pthread_mutex_unlock(&n->mu);
    }
    dsec_free(copy);
    return 0;
}

void dsec__node_insert(dsec_node *n, struct sbx *s)
{
    size_t b = dsec__node_hash_str(s->id, NULL) % n->nbuckets;
    s->next_id = n->by_id[b];
    n->by_id[b] = s;
    if (s->req_id[0]) {
        size_t r = dsec__node_hash_str(s->tenant, s->req_id) % n->nbuckets;
        s->next_req = n->by_req[r];
        n->by_req[r] = s;
    }
    n->live++;
    n->live_by_type[s->type_idx]++;
}

void dsec__node_unlink_sbx(dsec_node *n, struct sbx *s)
{
    struct sbx **pp = &n->by_id[dsec__node_hash_str(s->id, NULL) % n->nbuckets];
    for (; *pp; pp = &(*pp)->next_id)
        if (*pp == s) {
            *pp = s->next_id;
            break;
        }
    if (s->req_id[0]) {
        pp = &n->by_req[dsec__node_hash_str(s->tenant, s->req_id) % n->nbuckets];
        for (; *pp; pp = &(*pp)->next_req)
            if (*pp == s) {
                *pp = s->next_req;
                break;
            }
    }
    n->live--;
    n->live_by_type[s->type_idx]--;
}

void dsec__node_release_resources(dsec_node *n, uint64_t cpu, uint64_t mem, uint64_t slots,
                                  uint64_t disk)
{
    n->cpu_free += cpu;
    n->mem_free += mem;
    n->slots_free += slots;
    n->disk_free += disk;
    n->dirty = true;
}

/* Queue a lifecycle event; they leave in batches with the next report. */
void dsec__node_event_locked(dsec_node *n, const struct sbx *s, int prev, int state,
                             const char *reason)
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

void dsec__node_set_state(dsec_node *n, struct sbx *s, int state, const char *reason)
{
    pthread_mutex_lock(&n->mu);
    int prev = s->state;
    s->state = (uint8_t)state;
    dsec__node_event_locked(n, s, prev, state, reason);
    pthread_mutex_unlock(&n->mu);
}

/* ---- records in the journal -------------------------------------------------- */

const char *dsec__node_type_name(const dsec_node *n, int idx)
{
    const dsec_backend_caps *c = dsec_registry_caps(n->reg, idx);
    return c ? c->type : "?";
}

/* Fields separated by 0x1f; backend_state last (it may hold anything but NUL).
 * Version 2 adds the project after the state, 3 the retry after it, 4 the
 * disk quota after that, 5 the latest attempt whose lookup it answered after
 * that, 6 its labels after that (node-list.c); records of versions 1 to 5 are
 * still read (their sandboxes hold no disk in the node's accounting before 4,
 * no labels before 6). -1 when out of memory. */
static int record_format(const dsec_node *n, const struct sbx *s, char *buf, size_t len)
{
    char *lr = dsec__node_labels_record(s);
    if (lr == NULL)
        return -1;
    int rc = snprintf(
        buf, len,
        "6\x1f%s\x1f%s\x1f%s\x1f%d\x1f%" PRIu32 "\x1f%" PRIu32 "\x1f%" PRIu64 "\x1f%" PRIu64
        "\x1f%" PRIu64 "\x1f%s\x1f%" PRIu32 "\x1f%" PRIu64 "\x1f%" PRIu32 "\x1f%s\x1f%s",
        s->tenant, s->req_id, dsec__node_type_name(n, s->type_idx), (int)s->state, s->cpu_milli,
        s->memory_mb, s->created_ns, s->ttl_ns, s->idle_ns, s->project, (uint32_t)s->retry,
        s->disk_mb, s->lookup_retry, lr, s->bstate ? s->bstate : "");
    dsec_free(lr);
    return rc;
}

int dsec__node_journal_put(dsec_node *n, const struct sbx *s, dsec_err *err)
{
    char stackbuf[1024];
    int len = record_format(n, s, stackbuf, sizeof stackbuf);
    if (len < 0)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "formatting the record of %s: out of memory",
                            s->id);
    if ((size_t)len < sizeof stackbuf)
        return dsec_journal_put(n->journal, s->id, stackbuf, (size_t)len, err);
    char *big = dsec_malloc((size_t)len + 1);
    if (big == NULL || record_format(n, s, big, (size_t)len + 1) != len) {
        dsec_free(big);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    int rc = dsec_journal_put(n->journal, s->id, big, (size_t)len, err);
    dsec_free(big);
    return rc;
}

/* s answers attempt retry of its create too (node lock held): its journal
 * record keeps the latest, so that after a restart a notice of an earlier
 * attempt placed elsewhere still leaves it alone. A sandbox still starting
 * is recorded when it is running. */
void dsec__node_answers_locked(dsec_node *n, struct sbx *s, uint32_t retry)
{
    if (retry <= s->retry)
        return;
    s->retry = retry;
    dsec_err err;
    if ((s->state == ST_RUNNING || s->state == ST_PAUSED) && dsec__node_journal_put(n, s, &err) < 0)
        dsec_actor_count_error(n->actor);
}

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

/* ---- backends ------------------------------------------------------------------- */

void dsec__node_sbx_free(struct sbx *s)
{
    if (s != NULL) {
        dsec_free(s->bstate);
        dsec_free(s->labels);
    }
    dsec_free(s);
}

void dsec__node_spec_for(const dsec_node *n, const struct sbx *s, const char *env,
                         dsec_sandbox_spec *sp)
{
    memset(sp, 0, sizeof *sp);
    sp->id = s->id;
    sp->type = dsec__node_type_name(n, s->type_idx);
    sp->env = env;
    sp->cpu_milli = s->cpu_milli;
    sp->memory_mb = s->memory_mb;
    sp->disk_mb = s->disk_mb;
    sp->tenant = s->tenant;
}

/* ---- job holdings ---------------------------------------------------------------- */

static struct hold **find_hold(dsec_node *n, const char *key)
{
    struct hold **pp = &n->holds;
    while (*pp && strcmp((*pp)->key, key) != 0)
        pp = &(*pp)->next;
    return pp;
}

static int hold_record(const struct hold *h, char *buf, size_t len)
{
    return snprintf(buf, len, "H\x1f%s\x1f%" PRIu64 "\x1f%" PRIu64, h->job, h->cpu_milli,
                    h->memory_mb);
}

/* dsec.v1.ctl.hold.<node>: a job takes (or gives back) capacity here. Taking
 * is idempotent per (job, unit); so is giving back. The holding is journaled
 * before the answer, like a sandbox. */
void dsec__node_on_hold(dsec_actor *a, dsec_msg *m, void *ud)
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
        dsec__node_reply_bad(n, m, dsec_name_ok(h.job, DSEC_NAME_LEN_MAX) < 0 ? "job" : "unit",
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
            dsec__node_reply_err(n, m, DSEC_E_CAPACITY,
                                 "node %s cannot hold %" PRIu64 " milli-CPU and %" PRIu64
                                 " MB for job %s "
                                 "(free: %" PRIu64 ", %" PRIu64 ")",
                                 n->name, h.cpu_milli, h.memory_mb, h.job, cf, mf);
            return;
        }
        struct hold *nh = dsec_malloc(sizeof *nh);
        if (nh == NULL) {
            pthread_mutex_unlock(&n->mu);
            dsec__node_reply_err(n, m, DSEC_E_NOMEM, "out of memory");
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
            dsec__node_release_resources(n, nh->cpu_milli, nh->memory_mb, 0, 0);
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
            dsec__node_release_resources(n, old->cpu_milli, old->memory_mb, 0, 0);
            if (dsec_journal_del(n->journal, old->key, &err) < 0)
                dsec_actor_count_error(
                    a); /* the next start restores a holding nobody owns: logged */
            if (h.forced)
                dsec_log_info("dsec-node %s: holding %s released by force", n->name, old->key);
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
        dsec_log_warn("dsec-node %s: dropping unreadable holding %s", n->name, id);
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

int dsec__node_emit_live(dsec_journal *j, dsec_journal_emit_fn emit, void *ud, dsec_err *err)
{
    dsec_node *n = ud;
    char buf[1024];
    for (size_t b = 0; b < n->nbuckets; b++)
        for (struct sbx *s = n->by_id[b]; s; s = s->next_id) {
            if (s->state != ST_RUNNING && s->state != ST_PAUSED)
                continue;
            int len = record_format(n, s, buf, sizeof buf);
            if (len < 0)
                return dsec_err_set(err, DSEC_E_NOMEM, 0, "record of %s: out of memory", s->id);
            if ((size_t)len >= sizeof buf) { /* labels: through the heap */
                char *big = dsec_malloc((size_t)len + 1);
                if (big == NULL || record_format(n, s, big, (size_t)len + 1) != len) {
                    dsec_free(big);
                    return dsec_err_set(err, DSEC_E_NOMEM, 0, "record of %s: out of memory", s->id);
                }
                int rc = emit(j, s->id, big, (size_t)len, err);
                dsec_free(big);
                if (rc < 0)
                    return -1;
                continue;
            }
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
    gone_expire_locked(n, dsec_wall_ns(), 0);
    for (struct gone *g = n->gone_old; g; g = g->next_old) {
        int len = gone_record(g, buf, sizeof buf);
        if (emit(j, g->id, buf, (size_t)len, err) < 0)
            return -1;
    }
    return 0;
}

/* ---- adoption: the journal's records replayed at start -------------------------- */

static void kept_add(dsec_node *n, const char *id, const void *data, size_t len)
{
    struct kept *k = dsec_calloc(1, sizeof *k);
    char *kid = dsec_strdup(id), *kdata = dsec_malloc(len ? len : 1);
    if (k == NULL || kid == NULL || kdata == NULL) {
        /* the record is still in the journal; only a compaction now would lose it */
        dsec_log_error("dsec-node %s: out of memory keeping the record of %s", n->name, id);
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

/* A record not re-adopted, for why: kept for a later start (keep: the sandbox exists but this
 * node cannot run it as configured), or turned into a note that it is gone. s is freed or
 * handed to n->dropped. */
static void adopt_not(dsec_node *n, struct sbx *s, const char *id, const void *data, size_t len,
                      const char *why, bool keep)
{
    if (keep) {
        /* It exists, but this node cannot run it as configured: not served, not counted,
         * reported failed, and its record kept for a later start. */
        dsec_log_info(
            "dsec-node %s: not re-adopting %s (its record is kept for the next start): %s", n->name,
            id, why);
        atomic_fetch_add(&n->adopt_failed, 1);
        kept_add(n, id, data, len);
        pthread_mutex_lock(&n->mu);
        dsec__node_event_locked(n, s, ST_RUNNING, ST_FAILED, why);
        pthread_mutex_unlock(&n->mu);
        dsec__node_sbx_free(s);
        return;
    }
    /* Gone while we were away (or unusable): its record becomes a note, and it is said. */
    dsec_log_warn("dsec-node %s: not re-adopting %s: %s", n->name, id, why);
    atomic_fetch_add(&n->adopt_failed, 1);
    char reason[96];
    snprintf(reason, sizeof reason, "not re-adopted when its node manager restarted: %.40s", why);
    pthread_mutex_lock(&n->mu);
    dsec__node_event_locked(n, s, ST_RUNNING, ST_FAILED, why);
    gone_add_locked(n, id, s->tenant, reason, dsec_wall_ns());
    pthread_mutex_unlock(&n->mu);
    /* the journal is still being opened: its note replaces the record right after */
    s->next_id = n->dropped;
    n->dropped = s;
}

int dsec__node_adopt_one(const char *id, const void *data, size_t len, void *ud, dsec_err *err)
{
    dsec_node *n = ud;
    if (strncmp(id, "hold.", 5) == 0)
        return adopt_hold(n, id, data, len, err);
    if (len >= 5 && memcmp(data, "gone\x1f", 5) == 0)
        return adopt_gone(n, id, data, len);
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
    uint32_t lookup_retry = 0;
    const char *labels = "";
    int version = f[0] != NULL ? atoi(f[0]) : 0;
    if (version >= 2 && version <= 6) {
        char *pj = field(&p);
        project = pj ? pj : "";
        if (version >= 3) {
            char *rt = field(&p);
            retry = rt ? (uint32_t)strtoul(rt, NULL, 10) : 0;
        }
        if (version >= 4) {
            char *dk = field(&p);
            disk = dk ? strtoull(dk, NULL, 10) : 0;
        }
        if (version >= 5) {
            char *lr = field(&p);
            lookup_retry = lr ? (uint32_t)strtoul(lr, NULL, 10) : 0;
        }
        if (version >= 6) {
            char *lb = field(&p);
            labels = lb ? lb : "";
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
        s->lookup_retry = lookup_retry;
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
        if (dsec__node_labels_parse(s, labels) < 0)
            dsec_log_warn("dsec-node %s: the labels of %s are unreadable: adopted without", n->name,
                          id);
        if (s->state != ST_PAUSED)
            s->state = ST_RUNNING;
        dsec_sandbox_spec spec;
        dsec__node_spec_for(n, s, NULL, &spec);
        if (s->bstate == NULL || dsec_backend_adopt(s->be, &spec, s->bstate, &s->h, &aerr) < 0) {
            why = s->bstate ? aerr.msg : "out of memory";
            keep = s->bstate != NULL && aerr.code == DSEC_E_CONFIG;
        }
    }
    if (why != NULL) {
        adopt_not(n, s, id, data, len, why, keep);
        dsec_free(copy);
        return 0;
    }
    pthread_mutex_lock(&n->mu);
    dsec__node_insert(n, s);
    n->cpu_free = n->cpu_free >= s->cpu_milli ? n->cpu_free - s->cpu_milli : 0;
    n->mem_free = n->mem_free >= s->memory_mb ? n->mem_free - s->memory_mb : 0;
    n->slots_free = n->slots_free >= 1 ? n->slots_free - 1 : 0;
    n->disk_free = n->disk_free >= s->disk_mb ? n->disk_free - s->disk_mb : 0;
    pthread_mutex_unlock(&n->mu);
    atomic_fetch_add(&n->adopted, 1);
    dsec_free(copy);
    return 0;
}
