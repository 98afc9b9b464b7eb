/* placement.c - the scheduler's capacity view, in-flight overlay and power-of-k placement. */
#include "actors/placement.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsec/alloc.h"

/*
 * Layout. Nodes live in a dense array (uniform random probes are one index
 * draw) and a linear-probing hash table maps names to array slots (reports
 * and heartbeats are one lookup). Removal swaps the last node into the hole.
 *
 * Overlay. Each node keeps its unconfirmed reservations in a small array and
 * their sums. Entries leave when they expire (checked lazily, when place
 * looks at the node and the earliest expiry has passed), when released, or
 * when a newer report arrives that counts them: the node's own figures then
 * count what it admitted, and keeping the entries would count it twice. A
 * report that echoes the newest placement stamp the node took (echo) counts
 * only the placements stamped up to it; the later ones are still on their
 * way (in nats-server's queue towards a busy node) and stay, so the overlay
 * holds what is in flight, however long the way.
 */

#define DEFAULT_DEAD_AFTER_MS 10000
#define DEFAULT_OVERLAY_TTL_MS 2000
#define DEFAULT_LOCALITY 0.5
#define LAYERS_ON_STACK 64
#define DRAINED_MAX 1024 /* drained names remembered, to count and try re-admissions */

struct label {
    char *k, *v;
};

struct rsv {
    uint64_t id, expires_ms;
    uint64_t stamp;          /* dsec_place_req.stamp; 0: none */
    uint64_t cpu, mem, disk; /* and one slot */
};

struct node {
    char *name;
    uint64_t hash;
    size_t idx; /* position in v->nodes */
    char *cell; /* "" when the node gave none */
    uint64_t epoch, seq;
    dsec_type_mask types;
    struct label *labels;
    size_t nlabels;
    uint64_t *layers; /* sorted hashes of the cached layer digests */
    size_t nlayers;
    uint64_t cpu_total, mem_total, slots_total;
    uint64_t disk_total; /* 0: the node does not count disk; no disk filter then */
    uint64_t cpu_free, mem_free, slots_free, disk_free, live; /* as last reported */
    uint64_t last_seen_ms;
    uint64_t last_answer_ms; /* it answered a placement; 0: never */
    uint64_t probation_ms;   /* not preferred before this time */
    bool heard;              /* last_seen_ms is set */
    bool healthy;
    /* overlay */
    struct rsv *rsv;
    size_t nrsv, caprsv;
    uint64_t rsv_cpu, rsv_mem, rsv_disk;
    uint64_t rsv_next_expiry; /* UINT64_MAX when none */
    /* scratch for place(), valid for one call's stamp */
    uint64_t excl_stamp, cand_stamp;
};

struct dsec_placement {
    pthread_mutex_t lock;
    const dsec_registry *reg;
    char *cell;
    uint64_t dead_after_ms, ttl_ms;
    uint64_t suspect_after_ms, drain_gap_ms, probation_ms;
    uint64_t last_drain_ms; /* 0: none yet */
    uint64_t n_drained, n_deferred, n_readmitted;
    char **drained; /* names drained, oldest first, at most DRAINED_MAX */
    size_t ndrained;
    double locality;
    unsigned max_probes;
    struct node **nodes;
    size_t n, cap;
    uint32_t *table; /* node index + 1; 0 is empty */
    size_t tcap;     /* power of two, kept >= 2n */
    uint64_t stamp, rsv_gen;
};

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t sat_sub(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

uint64_t dsec_placement_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- nodes ------------------------------------------------------------------------- */

static void node_free(struct node *n)
{
    if (n == NULL)
        return;
    for (size_t i = 0; i < n->nlabels; i++) {
        dsec_free(n->labels[i].k);
        dsec_free(n->labels[i].v);
    }
    dsec_free(n->labels);
    dsec_free(n->layers);
    dsec_free(n->cell);
    dsec_free(n->rsv);
    dsec_free(n->name);
    dsec_free(n);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static bool has_layer(const struct node *n, uint64_t h)
{
    size_t lo = 0, hi = n->nlayers;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (n->layers[mid] < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n->nlayers && n->layers[lo] == h;
}

static int check_name(const char *name, dsec_err *err)
{
    size_t len = name ? strnlen(name, DSEC_PLACE_NODE_MAX + 1) : 0;
    if (len == 0 || len > DSEC_PLACE_NODE_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "node name must be 1..%d bytes",
                            DSEC_PLACE_NODE_MAX);
    return 0;
}

/* Build a complete node from a full report, outside the lock. */
static struct node *node_from_report(const dsec_placement *v, const dsec_node_report *r)
{
    struct node *n = dsec_calloc(1, sizeof *n);
    if (n == NULL)
        return NULL;
    n->name = dsec_strdup(r->node);
    n->cell = dsec_strdup(r->cell ? r->cell : "");
    if (n->name == NULL || n->cell == NULL)
        goto out_free;
    n->hash = fnv1a(r->node);
    n->healthy = true;
    n->rsv_next_expiry = UINT64_MAX;
    if (dsec_registry_mask(v->reg, r->types, r->ntypes, true, &n->types, NULL) < 0)
        goto out_free;
    if (r->nlabels > 0) {
        n->labels = dsec_calloc(r->nlabels, sizeof *n->labels);
        if (n->labels == NULL)
            goto out_free;
        for (size_t i = 0; i < r->nlabels; i++) {
            n->labels[i].k = dsec_strdup(r->label_keys[i] ? r->label_keys[i] : "");
            n->labels[i].v = dsec_strdup(r->label_vals[i] ? r->label_vals[i] : "");
            n->nlabels++;
            if (n->labels[i].k == NULL || n->labels[i].v == NULL)
                goto out_free;
        }
    }
    if (r->nlayers > 0) {
        n->layers = dsec_malloc(r->nlayers * sizeof *n->layers);
        if (n->layers == NULL)
            goto out_free;
        for (size_t i = 0; i < r->nlayers; i++)
            n->layers[i] = fnv1a(r->layers[i] ? r->layers[i] : "");
        qsort(n->layers, r->nlayers, sizeof *n->layers, cmp_u64);
        size_t m = 0; /* dedupe */
        for (size_t i = 0; i < r->nlayers; i++)
            if (m == 0 || n->layers[m - 1] != n->layers[i])
                n->layers[m++] = n->layers[i];
        n->nlayers = m;
    }
    n->cpu_total = r->cpu_milli;
    n->mem_total = r->memory_mb;
    n->slots_total = r->slots;
    n->disk_total = r->disk_mb;
    return n;

out_free:
    node_free(n);
    return NULL;
}

/* ---- the name table ---------------------------------------------------------------- */

static size_t slot_of(const dsec_placement *v, const char *name, uint64_t h)
{
    size_t mask = v->tcap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        uint32_t e = v->table[i];
        if (e == 0 || strcmp(v->nodes[e - 1]->name, name) == 0)
            return i;
    }
}

static struct node *lookup(const dsec_placement *v, const char *name)
{
    if (v->tcap == 0 || name == NULL)
        return NULL;
    uint32_t e = v->table[slot_of(v, name, fnv1a(name))];
    return e ? v->nodes[e - 1] : NULL;
}

static int table_resize(dsec_placement *v, size_t tcap)
{
    uint32_t *t = dsec_calloc(tcap, sizeof *t);
    if (t == NULL)
        return -1;
    dsec_free(v->table);
    v->table = t;
    v->tcap = tcap;
    for (size_t i = 0; i < v->n; i++) {
        size_t s = v->nodes[i]->hash & (tcap - 1);
        while (t[s] != 0)
            s = (s + 1) & (tcap - 1);
        t[s] = (uint32_t)i + 1;
    }
    return 0;
}

static int insert(dsec_placement *v, struct node *n)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        struct node **a = dsec_realloc(v->nodes, cap * sizeof *a);
        if (a == NULL)
            return -1;
        v->nodes = a;
        v->cap = cap;
    }
    if ((v->n + 1) * 2 > v->tcap && table_resize(v, v->tcap ? v->tcap * 2 : 128) < 0)
        return -1;
    n->idx = v->n;
    v->nodes[v->n++] = n;
    v->table[slot_of(v, n->name, n->hash)] = (uint32_t)n->idx + 1;
    return 0;
}

/* Take n out of the array and table; the caller frees it. */
static void unlink_node(dsec_placement *v, struct node *n)
{
    size_t mask = v->tcap - 1;
    size_t i = slot_of(v, n->name, n->hash);
    /* Backward-shift deletion keeps every probe chain unbroken without
     * tombstones. */
    v->table[i] = 0;
    for (size_t j = (i + 1) & mask; v->table[j] != 0; j = (j + 1) & mask) {
        size_t home = v->nodes[v->table[j] - 1]->hash & mask;
        bool movable = (j > i) ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            v->table[i] = v->table[j];
            v->table[j] = 0;
            i = j;
        }
    }
    struct node *last = v->nodes[--v->n];
    if (last != n) {
        last->idx = n->idx;
        v->nodes[n->idx] = last;
        v->table[slot_of(v, last->name, last->hash)] = (uint32_t)last->idx + 1;
    }
}

/* ---- overlay ----------------------------------------------------------------------- */

static void overlay_clear(struct node *n)
{
    n->nrsv = 0;
    n->rsv_cpu = n->rsv_mem = n->rsv_disk = 0;
    n->rsv_next_expiry = UINT64_MAX;
}

/* Drop the reservations expired by now and, with taken, those a report counts: stamped up to
 * upto, or unstamped (the ones stamped later are still on their way and stay). */
static void overlay_drop(struct node *n, uint64_t now, bool taken, uint64_t upto)
{
    size_t j = 0;
    uint64_t next = UINT64_MAX;
    for (size_t i = 0; i < n->nrsv; i++) {
        struct rsv *r = &n->rsv[i];
        if (r->expires_ms <= now || (taken && (r->stamp == 0 || r->stamp <= upto))) {
            n->rsv_cpu -= r->cpu;
            n->rsv_mem -= r->mem;
            n->rsv_disk -= r->disk;
            continue;
        }
        if (r->expires_ms < next)
            next = r->expires_ms;
        n->rsv[j++] = *r;
    }
    n->nrsv = j;
    n->rsv_next_expiry = next;
}

static void overlay_purge(struct node *n, uint64_t now)
{
    if (now >= n->rsv_next_expiry)
        overlay_drop(n, now, false, 0);
}

static uint64_t avail_cpu(const struct node *n)
{
    return sat_sub(n->cpu_free, n->rsv_cpu);
}

static uint64_t avail_mem(const struct node *n)
{
    return sat_sub(n->mem_free, n->rsv_mem);
}

static uint64_t avail_slots(const struct node *n)
{
    return sat_sub(n->slots_free, n->nrsv);
}

static uint64_t avail_disk(const struct node *n)
{
    return sat_sub(n->disk_free, n->rsv_disk);
}

/* A node that does not count disk (its reports carry no disk_mb: an older node
 * manager) admits any disk, as it did before disk was counted. */
static bool disk_fits(const struct node *n, uint64_t want)
{
    return n->disk_total == 0 || avail_disk(n) >= want;
}

/* ---- lifecycle ---------------------------------------------------------------------- */

int dsec_placement_new(dsec_placement **out, const dsec_registry *reg,
                       const dsec_placement_config *cfg, dsec_err *err)
{
    static const dsec_placement_config defaults = {.locality_weight = -1};
    if (reg == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "placement needs a backend registry");
    if (cfg == NULL)
        cfg = &defaults;
    dsec_placement *v = dsec_calloc(1, sizeof *v);
    if (v == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "allocating the capacity view");
    v->reg = reg;
    if (cfg->cell != NULL && (v->cell = dsec_strdup(cfg->cell)) == NULL) {
        dsec_free(v);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "allocating the capacity view");
    }
    v->dead_after_ms = cfg->dead_after_ms ? cfg->dead_after_ms : DEFAULT_DEAD_AFTER_MS;
    v->suspect_after_ms = cfg->suspect_after_ms ? cfg->suspect_after_ms
                          : cfg->heartbeat_ms   ? 2 * cfg->heartbeat_ms
                                                : v->dead_after_ms / 2;
    if (cfg->suspect_after_ms != 0 && cfg->suspect_after_ms >= v->dead_after_ms) {
        dsec_err_set(err, DSEC_E_INVALID, 0,
                     "placement: suspect_after_ms (%" PRIu64 ") must be below dead_after_ms "
                     "(%" PRIu64 ")",
                     cfg->suspect_after_ms, v->dead_after_ms);
        dsec_free(v->cell);
        dsec_free(v);
        return -1;
    }
    /* slack: suspect for a heartbeat interval at least before a drain */
    if (v->dead_after_ms < v->suspect_after_ms + cfg->heartbeat_ms)
        v->dead_after_ms = v->suspect_after_ms + (cfg->heartbeat_ms ? cfg->heartbeat_ms : 1);
    v->drain_gap_ms = cfg->drain_gap_ms;
    v->probation_ms = cfg->probation_ms;
    v->ttl_ms = cfg->overlay_ttl_ms ? cfg->overlay_ttl_ms : DEFAULT_OVERLAY_TTL_MS;
    v->locality = cfg->locality_weight < 0 ? DEFAULT_LOCALITY : cfg->locality_weight;
    v->max_probes = cfg->max_probes;
    pthread_mutex_init(&v->lock, NULL);
    *out = v;
    return 0;
}

void dsec_placement_free(dsec_placement *v)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i < v->n; i++)
        node_free(v->nodes[i]);
    dsec_free(v->nodes);
    dsec_free(v->table);
    for (size_t i = 0; i < v->ndrained; i++)
        dsec_free(v->drained[i]);
    dsec_free(v->drained);
    dsec_free(v->cell);
    pthread_mutex_destroy(&v->lock);
    dsec_free(v);
}

/* ---- silence ----------------------------------------------------------------------- */

/* A report or heartbeat. A node heard from again after being suspect is put
 * on probation afresh, on probation already or not. Under v->lock. */
static void seen(dsec_placement *v, struct node *n, uint64_t now)
{
    if (n->heard && now <= n->last_seen_ms)
        return;
    if (n->heard && now - n->last_seen_ms > v->suspect_after_ms && v->probation_ms > 0)
        n->probation_ms = now + v->probation_ms;
    n->last_seen_ms = now;
    n->heard = true;
}

/* Remember a drained node's name (oldest forgotten first). Under v->lock;
 * an allocation failure only loses the count of its re-admission. */
static void remember_drained(dsec_placement *v, const char *name)
{
    if (v->drained == NULL && (v->drained = dsec_calloc(DRAINED_MAX, sizeof *v->drained)) == NULL)
        return;
    char *copy = dsec_strdup(name);
    if (copy == NULL)
        return;
    if (v->ndrained == DRAINED_MAX) {
        dsec_free(v->drained[0]);
        memmove(v->drained, v->drained + 1, (DRAINED_MAX - 1) * sizeof *v->drained);
        v->ndrained--;
    }
    v->drained[v->ndrained++] = copy;
}

/* Was name drained? Forgets it. Under v->lock. */
static bool forget_drained(dsec_placement *v, const char *name)
{
    for (size_t i = 0; i < v->ndrained; i++) {
        if (strcmp(v->drained[i], name) != 0)
            continue;
        dsec_free(v->drained[i]);
        memmove(v->drained + i, v->drained + i + 1, (v->ndrained - i - 1) * sizeof *v->drained);
        v->ndrained--;
        return true;
    }
    return false;
}

/* ---- reports ----------------------------------------------------------------------- */

static bool is_stale(const struct node *n, const dsec_node_report *r)
{
    if (r->epoch != n->epoch)
        return r->epoch < n->epoch;
    return r->seq <= n->seq;
}

/* Swap the full-report tables of a and b (so the old ones get freed with b). */
static void swap_tables(struct node *a, struct node *b)
{
#define SWAP(f)                                                                                    \
    do {                                                                                           \
        __typeof__(a->f) t_ = a->f;                                                                \
        a->f = b->f;                                                                               \
        b->f = t_;                                                                                 \
    } while (0)
    SWAP(cell);
    SWAP(labels);
    SWAP(nlabels);
    SWAP(layers);
    SWAP(nlayers);
#undef SWAP
    a->types = b->types;
    a->cpu_total = b->cpu_total;
    a->mem_total = b->mem_total;
    a->slots_total = b->slots_total;
    a->disk_total = b->disk_total;
}

int dsec_placement_update(dsec_placement *v, const dsec_node_report *r, uint64_t now_ms,
                          dsec_err *err)
{
    if (r == NULL || check_name(r->node, err) < 0)
        return r ? -1 : dsec_err_set(err, DSEC_E_INVALID, 0, "no report");
    if ((r->nlabels > 0 && (r->label_keys == NULL || r->label_vals == NULL)) ||
        (r->ntypes > 0 && r->types == NULL) || (r->nlayers > 0 && r->layers == NULL))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "report from %s: array without items", r->node);
    /* A full report's tables are built before taking the lock. */
    struct node *fresh = NULL;
    if (r->full && (fresh = node_from_report(v, r)) == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "report from %s", r->node);

    int rc = DSEC_REPORT_APPLIED;
    bool restarted = false; /* its placements in flight went with the old node manager */
    pthread_mutex_lock(&v->lock);
    struct node *n = lookup(v, r->node);
    if (n == NULL) {
        if (fresh == NULL) {
            rc = DSEC_REPORT_UNKNOWN;
            goto out_unlock;
        }
        if (insert(v, fresh) < 0) {
            rc = dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "adding node %s", r->node);
            goto out_unlock;
        }
        n = fresh;
        fresh = NULL;
        if (forget_drained(v, r->node)) {
            /* back from a drain: it must stay on time a while before it is preferred */
            v->n_readmitted++;
            n->probation_ms = now_ms + v->probation_ms;
        }
    } else if (is_stale(n, r)) {
        rc = DSEC_REPORT_STALE;
        goto out_unlock;
    } else if (fresh != NULL) {
        swap_tables(n, fresh);
    }
    restarted = n->epoch != r->epoch;
    n->epoch = r->epoch;
    n->seq = r->seq;
    n->cpu_free = r->cpu_free_milli;
    n->mem_free = r->mem_free_mb;
    n->slots_free = r->slots_free;
    n->disk_free = r->disk_free_mb;
    n->live = r->live;
    seen(v, n, now_ms);
    if (r->echo && !restarted)
        overlay_drop(n, 0, true, r->taken_upto);
    else
        overlay_clear(n);

out_unlock:
    pthread_mutex_unlock(&v->lock);
    node_free(fresh);
    return rc;
}

int dsec_placement_heartbeat(dsec_placement *v, const char *node, uint64_t now_ms)
{
    int rc = DSEC_REPORT_UNKNOWN;
    pthread_mutex_lock(&v->lock);
    struct node *n = lookup(v, node);
    if (n != NULL) {
        seen(v, n, now_ms);
        rc = 0;
    }
    pthread_mutex_unlock(&v->lock);
    return rc;
}

int dsec_placement_answered(dsec_placement *v, const char *node, uint64_t now_ms)
{
    int rc = DSEC_REPORT_UNKNOWN;
    pthread_mutex_lock(&v->lock);
    struct node *n = lookup(v, node);
    if (n != NULL) {
        if (now_ms > n->last_answer_ms)
            n->last_answer_ms = now_ms;
        rc = 0;
    }
    pthread_mutex_unlock(&v->lock);
    return rc;
}

static uint64_t since(uint64_t now, uint64_t then)
{
    return now > then ? now - then : 0;
}

/* Seen or answering within dead_after_ms: expire() keeps it. */
static bool alive(const dsec_placement *v, const struct node *n, uint64_t now)
{
    return since(now, n->last_seen_ms) <= v->dead_after_ms ||
           (n->last_answer_ms != 0 && since(now, n->last_answer_ms) <= v->dead_after_ms);
}

static bool suspect(const dsec_placement *v, const struct node *n, uint64_t now)
{
    return since(now, n->last_seen_ms) > v->suspect_after_ms;
}

/* Neither suspect nor on probation: placed before the others. */
static bool preferred(const dsec_placement *v, const struct node *n, uint64_t now)
{
    return !suspect(v, n, now) && now >= n->probation_ms;
}

void dsec_placement_names_free(char **names, size_t n)
{
    if (names == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        dsec_free(names[i]);
    dsec_free(names);
}

int dsec_placement_names(dsec_placement *v, const char *cell, char ***names, size_t *n,
                         dsec_err *err)
{
    *names = NULL;
    *n = 0;
    pthread_mutex_lock(&v->lock);
    char **out = v->n ? dsec_calloc(v->n, sizeof *out) : NULL;
    size_t k = 0;
    for (size_t i = 0; out != NULL && i < v->n; i++) {
        struct node *nd = v->nodes[i];
        if (cell != NULL && strcmp(nd->cell, cell) != 0)
            continue;
        if ((out[k] = dsec_strdup(nd->name)) == NULL) {
            dsec_placement_names_free(out, k);
            out = NULL;
            break;
        }
        k++;
    }
    bool fail = v->n != 0 && out == NULL;
    pthread_mutex_unlock(&v->lock);
    if (fail)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "placement: out of memory listing nodes");
    if (k == 0) {
        dsec_free(out);
        out = NULL;
    }
    *names = out;
    *n = k;
    return 0;
}

int dsec_placement_expire(dsec_placement *v, uint64_t now_ms, char ***names, size_t *n,
                          dsec_err *err)
{
    *names = NULL;
    *n = 0;
    pthread_mutex_lock(&v->lock);
    size_t dead = 0;
    for (size_t i = 0; i < v->n; i++)
        dead += !alive(v, v->nodes[i], now_ms);
    if (dead == 0) {
        pthread_mutex_unlock(&v->lock);
        return 0;
    }
    /* One drain, then one per drain_gap_ms: when many nodes go quiet together
     * (a slow host, a saturated bus) the rest keep taking creates meanwhile. */
    size_t allowed = dead;
    if (v->drain_gap_ms > 0) {
        bool gap_passed =
            v->last_drain_ms == 0 || since(now_ms, v->last_drain_ms) >= v->drain_gap_ms;
        allowed = gap_passed ? 1 : 0;
        v->n_deferred += dead - allowed;
    }
    if (allowed == 0) {
        pthread_mutex_unlock(&v->lock);
        return 0;
    }
    char **out = dsec_calloc(allowed, sizeof *out);
    struct node **gone = dsec_calloc(allowed, sizeof *gone);
    if (out == NULL || gone == NULL) {
        pthread_mutex_unlock(&v->lock);
        dsec_free(out);
        dsec_free(gone);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "expiring nodes");
    }
    size_t m = 0;
    if (allowed < dead) {
        /* the one heard from longest ago */
        struct node *worst = NULL;
        uint64_t worst_heard = UINT64_MAX;
        for (size_t i = 0; i < v->n; i++) {
            struct node *nd = v->nodes[i];
            uint64_t heard =
                nd->last_seen_ms > nd->last_answer_ms ? nd->last_seen_ms : nd->last_answer_ms;
            if (!alive(v, nd, now_ms) && heard < worst_heard) {
                worst = nd;
                worst_heard = heard;
            }
        }
        unlink_node(v, worst);
        gone[m++] = worst;
    } else {
        /* Backwards, so the node swapped into a hole has been looked at already. */
        for (size_t i = v->n; i-- > 0;) {
            struct node *nd = v->nodes[i];
            if (alive(v, nd, now_ms))
                continue;
            unlink_node(v, nd);
            gone[m++] = nd;
        }
    }
    v->n_drained += m;
    v->last_drain_ms = now_ms ? now_ms : 1;
    for (size_t i = 0; i < m; i++) {
        out[i] = gone[i]->name;
        remember_drained(v, out[i]);
        gone[i]->name = NULL;
    }
    pthread_mutex_unlock(&v->lock);
    for (size_t i = 0; i < m; i++)
        node_free(gone[i]);
    dsec_free(gone);
    *names = out;
    *n = m;
    return 0;
}

int dsec_placement_remove(dsec_placement *v, const char *node, dsec_err *err)
{
    pthread_mutex_lock(&v->lock);
    struct node *n = lookup(v, node);
    if (n != NULL)
        unlink_node(v, n);
    pthread_mutex_unlock(&v->lock);
    if (n == NULL)
        return dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "no node %s in the capacity view",
                            node ? node : "(null)");
    node_free(n);
    return 0;
}

int dsec_placement_set_healthy(dsec_placement *v, const char *node, bool healthy, dsec_err *err)
{
    pthread_mutex_lock(&v->lock);
    struct node *n = lookup(v, node);
    if (n != NULL)
        n->healthy = healthy;
    pthread_mutex_unlock(&v->lock);
    if (n == NULL)
        return dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "no node %s in the capacity view",
                            node ? node : "(null)");
    return 0;
}

/* ---- place ------------------------------------------------------------------------- */

/* How far a node got through the filters; each stage passes all before it. */
enum stage {
    ST_CELL,     /* wrong cell */
    ST_TYPE,     /* in the cell, does not offer the type */
    ST_ALIVE,    /* offers it, dead or unhealthy */
    ST_AFFINITY, /* alive, lacks an affinity label */
    ST_EXCLUDED, /* matches, refused this request before */
    ST_ROOM,     /* not excluded, too little room */
    ST_OK,
};

static const char *label_of(const struct node *n, const char *key)
{
    for (size_t i = 0; i < n->nlabels; i++)
        if (strcmp(n->labels[i].k, key) == 0)
            return n->labels[i].v;
    return NULL;
}

static bool has_label(const struct node *n, const char *key, const char *val)
{
    const char *v = label_of(n, key);
    return v != NULL && strcmp(v, val) == 0;
}

static enum stage judge(const dsec_placement *v, struct node *n, const dsec_place_req *req,
                        uint64_t now, uint64_t stamp)
{
    if (req->cell != NULL && strcmp(n->cell, req->cell) != 0)
        return ST_CELL;
    if (!(n->types & ((dsec_type_mask)1 << req->type)))
        return ST_TYPE;
    if (!n->healthy)
        return ST_ALIVE;
    for (size_t i = 0; i < req->naff; i++)
        if (!has_label(n, req->aff_keys[i], req->aff_vals[i]))
            return ST_AFFINITY;
    if (n->excl_stamp == stamp)
        return ST_EXCLUDED;
    overlay_purge(n, now);
    if (avail_cpu(n) < req->cpu_milli || avail_mem(n) < req->memory_mb || avail_slots(n) == 0 ||
        !disk_fits(n, req->disk_mb))
        return ST_ROOM;
    return ST_OK;
}

static double frac(uint64_t avail, uint64_t total)
{
    if (total == 0)
        return 0.0;
    return avail >= total ? 1.0 : (double)avail / (double)total;
}

static double score(const dsec_placement *v, const struct node *n, const uint64_t *lh, size_t nl)
{
    double s = frac(avail_cpu(n), n->cpu_total) + frac(avail_mem(n), n->mem_total) +
               frac(avail_slots(n), n->slots_total);
    if (n->disk_total > 0)
        s = (s + frac(avail_disk(n), n->disk_total)) / 4.0;
    else
        s /= 3.0;
    if (nl > 0 && n->nlayers > 0) {
        size_t hit = 0;
        for (size_t i = 0; i < nl; i++)
            hit += has_layer(n, lh[i]);
        s += v->locality * (double)hit / (double)nl;
    }
    return s;
}

/* What a failed scan saw, for the error message. */
struct diag {
    size_t at[ST_OK + 1];                    /* nodes that stopped at each stage */
    dsec_type_mask offered;                  /* union over the cell */
    uint64_t best_cpu, best_mem, best_slots; /* over nodes that reached ST_ROOM */
    uint64_t best_disk;                      /* over those of them that count disk */
    bool disk_unbounded;                     /* one of them does not count disk */
};

static void where_of(const dsec_placement *v, const dsec_place_req *req, char *buf, size_t len)
{
    const char *cell = req->cell ? req->cell : v->cell;
    if (cell != NULL)
        snprintf(buf, len, "in cell %s", cell);
    else
        snprintf(buf, len, "in this cell");
}

static int explain(const dsec_placement *v, const dsec_place_req *req, const struct diag *d,
                   uint64_t now, dsec_err *err)
{
    char where[DSEC_PLACE_NODE_MAX + 16];
    where_of(v, req, where, sizeof where);
    const char *tname = dsec_registry_caps(v->reg, req->type)->type;
    size_t past_cell = v->n - d->at[ST_CELL];
    size_t past_type = past_cell - d->at[ST_TYPE];
    size_t past_alive = past_type - d->at[ST_ALIVE];
    size_t past_aff = past_alive - d->at[ST_AFFINITY];
    size_t past_excl = past_aff - d->at[ST_EXCLUDED];

    if (past_cell == 0)
        return dsec_err_set(err, DSEC_E_CAPACITY, 0, "no node %s has reported capacity yet", where);
    if (past_type == 0) {
        char offered[256];
        dsec_registry_mask_format(v->reg, d->offered, offered, sizeof offered);
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "no node %s offers sandbox type \"%s\" (offered: %s)", where, tname,
                            offered);
    }
    if (past_alive == 0)
        return dsec_err_set(err, DSEC_E_CAPACITY, 0,
                            "no healthy node %s offers sandbox type \"%s\" (%zu offer it but are "
                            "taken out of placement)",
                            where, tname, past_type);
    if (past_aff == 0) {
        /* Name the first label that no candidate carries at all. */
        for (size_t a = 0; a < req->naff; a++) {
            bool any = false;
            for (size_t i = 0; i < v->n && !any; i++) {
                const struct node *n = v->nodes[i];
                any = (req->cell == NULL || strcmp(n->cell, req->cell) == 0) &&
                      (n->types & ((dsec_type_mask)1 << req->type)) && n->healthy &&
                      has_label(n, req->aff_keys[a], req->aff_vals[a]);
            }
            if (!any)
                return dsec_err_set(err, DSEC_E_CAPACITY, 0,
                                    "no healthy node %s offering \"%s\" has label %s=%s", where,
                                    tname, req->aff_keys[a], req->aff_vals[a]);
        }
        char labels[200] = "";
        for (size_t a = 0; a < req->naff; a++) {
            size_t u = strlen(labels);
            snprintf(labels + u, sizeof labels - u, "%s%s=%s", a ? ", " : "", req->aff_keys[a],
                     req->aff_vals[a]);
        }
        return dsec_err_set(err, DSEC_E_CAPACITY, 0,
                            "no healthy node %s offering \"%s\" has all the labels %s", where,
                            tname, labels);
    }
    if (past_excl == 0)
        return dsec_err_set(err, DSEC_E_CAPACITY, 0,
                            "every node %s that could take this sandbox has refused it already "
                            "(%zu tried)",
                            where, req->nexclude);
    if (d->best_cpu < req->cpu_milli)
        return dsec_err_set(err, DSEC_E_CAPACITY, 0,
                            "no node %s has %" PRIu64 " milli-CPU free (best: %" PRIu64 ")", where,
                            req->cpu_milli, d->best_cpu);
    if (d->best_mem < req->memory_mb)
        return dsec_err_set(err, DSEC_E_CAPACITY, 0,
                            "no node %s has %" PRIu64 " MB of memory free (best: %" PRIu64 ")",
                            where, req->memory_mb, d->best_mem);
    if (!d->disk_unbounded && d->best_disk < req->disk_mb)
        return dsec_err_set(err, DSEC_E_CAPACITY, 0,
                            "no node %s has %" PRIu64 " MB of disk free (best: %" PRIu64 ")", where,
                            req->disk_mb, d->best_disk);
    if (d->best_slots == 0)
        return dsec_err_set(err, DSEC_E_CAPACITY, 0,
                            "no node %s has a free sandbox slot (all %zu are full)", where,
                            past_excl);
    if (!d->disk_unbounded)
        return dsec_err_set(err, DSEC_E_CAPACITY, 0,
                            "no node %s has %" PRIu64 " milli-CPU, %" PRIu64
                            " MB of memory and %" PRIu64
                            " MB of disk free together (most CPU free: %" PRIu64
                            ", most memory free: %" PRIu64 " MB, most disk free: %" PRIu64 " MB)",
                            where, req->cpu_milli, req->memory_mb, req->disk_mb, d->best_cpu,
                            d->best_mem, d->best_disk);
    return dsec_err_set(err, DSEC_E_CAPACITY, 0,
                        "no node %s has %" PRIu64 " milli-CPU and %" PRIu64
                        " MB of memory free together (most CPU free: %" PRIu64
                        ", most memory free: %" PRIu64 " MB)",
                        where, req->cpu_milli, req->memory_mb, d->best_cpu, d->best_mem);
}

static int check_req(const dsec_placement *v, const dsec_place_req *req, unsigned k, uint64_t *rng,
                     dsec_place_result *out, dsec_err *err)
{
    if (req == NULL || rng == NULL || out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "place: missing request, rng or result");
    if (k > DSEC_PLACE_K_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "place: k = %u; must be 1..%d", k,
                            DSEC_PLACE_K_MAX);
    if (dsec_registry_caps(v->reg, req->type) == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "place: type index %d is not registered",
                            req->type);
    if ((req->naff > 0 && (req->aff_keys == NULL || req->aff_vals == NULL)) ||
        (req->nlayers > 0 && req->layers == NULL) || (req->nexclude > 0 && req->exclude == NULL))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "place: array without items");
    for (size_t i = 0; i < req->naff; i++)
        if (req->aff_keys[i] == NULL || req->aff_vals[i] == NULL)
            return dsec_err_set(err, DSEC_E_INVALID, 0, "place: affinity %zu has no key or value",
                                i);
    return 0;
}

/* Sparse (or tiny) feasible set: every node judged, keeping a uniform sample of k in cand
 * (reservoir), and in d what stopped the others. The number kept: 0 when none fits. */
static unsigned scan_all(dsec_placement *v, const dsec_place_req *req, unsigned k, uint64_t *rng,
                         uint64_t now_ms, uint64_t stamp, struct node **cand, struct diag *d)
{
    size_t seen = 0, seen_late = 0;
    struct node *late[DSEC_PLACE_K_MAX]; /* suspect or on probation: if nothing else fits */
    unsigned nl = 0;
    unsigned nc = 0;
    for (size_t i = 0; i < v->n; i++) {
        struct node *n = v->nodes[i];
        enum stage st = judge(v, n, req, now_ms, stamp);
        d->at[st]++;
        if (st != ST_CELL)
            d->offered |= n->types;
        if (st == ST_ROOM) {
            if (avail_cpu(n) > d->best_cpu)
                d->best_cpu = avail_cpu(n);
            if (avail_mem(n) > d->best_mem)
                d->best_mem = avail_mem(n);
            if (avail_slots(n) > d->best_slots)
                d->best_slots = avail_slots(n);
            if (n->disk_total == 0)
                d->disk_unbounded = true;
            else if (avail_disk(n) > d->best_disk)
                d->best_disk = avail_disk(n);
        }
        if (st != ST_OK)
            continue;
        bool pref = preferred(v, n, now_ms);
        struct node **res = pref ? cand : late;
        unsigned *nr = pref ? &nc : &nl;
        size_t sn = pref ? ++seen : ++seen_late;
        if (*nr < k) {
            res[(*nr)++] = n;
        } else {
            uint64_t j = dsec_placement_rand(rng) % sn;
            if (j < k)
                res[j] = n;
        }
    }
    if (nc == 0 && nl > 0) {
        memcpy(cand, late, nl * sizeof *late);
        nc = nl;
    }
    return nc;
}

/* A reservation of req's resources on best, until now_ms plus the reservation ttl (under
 * v->lock); NULL when out of memory. */
static struct rsv *reserve_locked(dsec_placement *v, struct node *best, const dsec_place_req *req,
                                  uint64_t now_ms, dsec_err *err)
{
    if (best->nrsv == best->caprsv) {
        size_t cap = best->caprsv ? best->caprsv * 2 : 8;
        struct rsv *r = dsec_realloc(best->rsv, cap * sizeof *r);
        if (r == NULL) {
            dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "place: reserving on %s", best->name);
            return NULL;
        }
        best->rsv = r;
        best->caprsv = cap;
    }
    struct rsv *r = &best->rsv[best->nrsv++];
    *r = (struct rsv){.id = ++v->rsv_gen,
                      .expires_ms = now_ms + v->ttl_ms,
                      .stamp = req->stamp,
                      .cpu = req->cpu_milli,
                      .mem = req->memory_mb,
                      .disk = req->disk_mb};
    best->rsv_cpu += r->cpu;
    best->rsv_mem += r->mem;
    best->rsv_disk += r->disk;
    if (r->expires_ms < best->rsv_next_expiry)
        best->rsv_next_expiry = r->expires_ms;
    return r;
}

int dsec_placement_place(dsec_placement *v, const dsec_place_req *req, unsigned k, uint64_t *rng,
                         uint64_t now_ms, dsec_place_result *out, dsec_err *err)
{
    if (check_req(v, req, k, rng, out, err) < 0)
        return -1;
    if (k == 0)
        k = 2;

    /* Layer hashes outside the lock. */
    uint64_t lh_stack[LAYERS_ON_STACK], *lh = lh_stack;
    if (req->nlayers > LAYERS_ON_STACK && (lh = dsec_malloc(req->nlayers * sizeof *lh)) == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "place: layer table");
    for (size_t i = 0; i < req->nlayers; i++)
        lh[i] = fnv1a(req->layers[i] ? req->layers[i] : "");

    struct node *cand[DSEC_PLACE_K_MAX];
    unsigned nc = 0;
    bool scanned = false;
    int rc = 0;

    pthread_mutex_lock(&v->lock);
    uint64_t stamp = ++v->stamp;
    for (size_t i = 0; i < req->nexclude; i++) {
        struct node *x = lookup(v, req->exclude[i]);
        if (x != NULL)
            x->excl_stamp = stamp;
    }

    /* Random probes: with most nodes feasible, about k draws. */
    unsigned probes = v->max_probes ? v->max_probes : 16 * k + 32;
    for (unsigned t = 0; v->n > 0 && t < probes && nc < k; t++) {
        struct node *n = v->nodes[dsec_placement_rand(rng) % v->n];
        if (n->cand_stamp == stamp)
            continue;
        if (judge(v, n, req, now_ms, stamp) == ST_OK && preferred(v, n, now_ms)) {
            n->cand_stamp = stamp;
            cand[nc++] = n;
        }
    }

    if (nc < k) {
        struct diag d = {0};
        scanned = true;
        nc = scan_all(v, req, k, rng, now_ms, stamp, cand, &d);
        if (nc == 0) {
            rc = explain(v, req, &d, now_ms, err);
            goto out_unlock;
        }
    }

    struct node *best = NULL;
    double best_score = -1.0;
    for (unsigned i = 0; i < nc; i++) {
        double s = score(v, cand[i], lh, req->nlayers);
        if (s > best_score) {
            best_score = s;
            best = cand[i];
        }
    }

    struct rsv *r = reserve_locked(v, best, req, now_ms, err);
    if (r == NULL) {
        rc = -1;
        goto out_unlock;
    }
    snprintf(out->node, sizeof out->node, "%s", best->name);
    out->reservation = r->id;
    out->score = best_score;
    out->candidates = nc;
    out->scanned = scanned;

out_unlock:
    pthread_mutex_unlock(&v->lock);
    if (lh != lh_stack)
        dsec_free(lh);
    return rc;
}

/* Drop reservation id of n; 0, or DSEC_REPORT_UNKNOWN when it is not there. Under v->lock. */
static int release_locked(struct node *n, uint64_t id)
{
    for (size_t i = 0; i < n->nrsv; i++) {
        if (n->rsv[i].id != id)
            continue;
        n->rsv_cpu -= n->rsv[i].cpu;
        n->rsv_mem -= n->rsv[i].mem;
        n->rsv_disk -= n->rsv[i].disk;
        n->rsv[i] = n->rsv[--n->nrsv];
        if (n->nrsv == 0)
            n->rsv_next_expiry = UINT64_MAX;
        return 0;
    }
    return DSEC_REPORT_UNKNOWN;
}

int dsec_placement_release(dsec_placement *v, const char *node, uint64_t reservation)
{
    pthread_mutex_lock(&v->lock);
    struct node *n = lookup(v, node);
    int rc = n != NULL ? release_locked(n, reservation) : DSEC_REPORT_UNKNOWN;
    pthread_mutex_unlock(&v->lock);
    return rc;
}

int dsec_placement_refused(dsec_placement *v, const char *node, uint64_t reservation,
                           const dsec_node_room *room)
{
    pthread_mutex_lock(&v->lock);
    struct node *n = lookup(v, node);
    if (n == NULL) {
        pthread_mutex_unlock(&v->lock);
        return DSEC_REPORT_UNKNOWN;
    }
    if (reservation != 0)
        release_locked(n, reservation);
    /* The figures are the node's state after report room->seq: newer than the view's
     * unless a later report has arrived meanwhile. The view keeps its seq, so the next
     * report replaces them. */
    if (room != NULL && room->seq != 0 && room->seq >= n->seq) {
        n->cpu_free = room->cpu_free_milli;
        n->mem_free = room->mem_free_mb;
        n->slots_free = room->slots_free;
        n->disk_free = room->disk_free_mb;
    }
    pthread_mutex_unlock(&v->lock);
    return 0;
}

/* ---- read-outs ---------------------------------------------------------------------- */

int dsec_placement_node(dsec_placement *v, const char *node, uint64_t now_ms, dsec_node_info *out,
                        dsec_err *err)
{
    pthread_mutex_lock(&v->lock);
    struct node *n = lookup(v, node);
    if (n == NULL) {
        pthread_mutex_unlock(&v->lock);
        return dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "no node %s in the capacity view",
                            node ? node : "(null)");
    }
    overlay_purge(n, now_ms);
    memset(out, 0, sizeof *out);
    snprintf(out->cell, sizeof out->cell, "%s", n->cell);
    out->seq = n->seq;
    out->epoch = n->epoch;
    out->types = n->types;
    out->healthy = n->healthy;
    out->alive = alive(v, n, now_ms);
    out->suspect = suspect(v, n, now_ms);
    out->preferred = preferred(v, n, now_ms);
    out->last_answer_ms = n->last_answer_ms;
    out->cpu_total = n->cpu_total;
    out->mem_total = n->mem_total;
    out->slots_total = n->slots_total;
    out->disk_total = n->disk_total;
    out->cpu_free = n->cpu_free;
    out->mem_free = n->mem_free;
    out->slots_free = n->slots_free;
    out->disk_free = n->disk_free;
    out->cpu_avail = avail_cpu(n);
    out->mem_avail = avail_mem(n);
    out->slots_avail = avail_slots(n);
    out->disk_avail = avail_disk(n);
    out->live = n->live;
    out->reservations = n->nrsv;
    out->nlayers = n->nlayers;
    out->last_seen_ms = n->last_seen_ms;
    pthread_mutex_unlock(&v->lock);
    return 0;
}

size_t dsec_placement_count(dsec_placement *v)
{
    pthread_mutex_lock(&v->lock);
    size_t n = v->n;
    pthread_mutex_unlock(&v->lock);
    return n;
}

void dsec_placement_health_get(dsec_placement *v, uint64_t now_ms, dsec_placement_health *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&v->lock);
    for (size_t i = 0; i < v->n; i++) {
        if (suspect(v, v->nodes[i], now_ms))
            out->suspect++;
        else if (!preferred(v, v->nodes[i], now_ms))
            out->probation++;
    }
    out->drained = v->n_drained;
    out->deferred = v->n_deferred;
    out->readmitted = v->n_readmitted;
    pthread_mutex_unlock(&v->lock);
}

uint64_t dsec_placement_drain_after_ms(const dsec_placement *v)
{
    return v->dead_after_ms; /* set once, by dsec_placement_new */
}

void dsec_placement_summary(dsec_placement *v, const char *cell, uint64_t now_ms,
                            dsec_cell_summary *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&v->lock);
    for (size_t i = 0; i < v->n; i++) {
        struct node *n = v->nodes[i];
        if ((cell != NULL && strcmp(n->cell, cell) != 0) || !n->healthy || !alive(v, n, now_ms))
            continue;
        overlay_purge(n, now_ms);
        out->nodes++;
        out->cpu_free_milli += avail_cpu(n);
        out->mem_free_mb += avail_mem(n);
        out->slots_free += avail_slots(n);
        out->live += n->live + n->nrsv;
        out->reserved += n->nrsv;
        out->types |= n->types;
    }
    pthread_mutex_unlock(&v->lock);
}
