/* cell-conf.c - a cell's configuration: its defaults, the YAML file's sections and checks, and
 * the settings the tools change. */
#include "actors/cell.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/config.h"
#include "runtime/metrics.h"
#include "dsec/alloc.h"
#include "dsec/names.h"

void dsec_cell_conf_defaults(dsec_cell_conf *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->cell, sizeof c->cell, "local");
    const char *url = getenv("DSEC_URL");
    snprintf(c->url, sizeof c->url, "%s", url && url[0] ? url : "nats://127.0.0.1:4222");
    c->threads = 2;
    c->low_latency = true;
    c->shared_delivery = true;
    c->embedded_nats = false;
    c->nats_port = 4222;
    c->jetstream = true;
    snprintf(c->state_dir, sizeof c->state_dir, "./state");
    snprintf(c->layers_kind, sizeof c->layers_kind, "local");
    snprintf(c->layers_bucket, sizeof c->layers_bucket, "DSEC_LAYERS");
    c->default_cpu_milli = 1000;
    c->default_memory_mb = 512;
    c->default_disk_mb = 1024;
    c->default_function_disk_mb = 64;
    c->default_ttl_s = 3600;
    c->default_idle_s = 900;
    c->max_ttl_s = 86400;
    c->sched_replicas = 1;
    c->k = 3;
    c->max_attempts = 3;
    c->max_hops = 2;
    c->dead_after_ms = 3000;
    c->lost_after_ms = 30000;
    c->capacity_ms = 100;
    c->full_ms = 5000;
    c->heartbeat_ms = 1000;
    c->reap_ms = 1000;
    c->summary_ms = 1000;
    c->wait_ms = 30000;
    c->admit_max = 65536;
    c->park_max = 65536;
    c->shed_after_ms =
        0; /* off: measured, it cost more than it gave (control-plane.md, "Shedding by wait") */
    c->admit_delay_ms = 0; /* off: measured, it gave latency for goodput (control-plane.md) */
    /* measured with clients that pace and bus.shared_delivery: it met every target of the
     * overload and busy-host phases, at a cost to a burst's latency (control-plane.md) */
    c->window_ms = 100;
    c->arbiter_lease_ms = 3000;
    c->arbiter_grace_ms = 30000;
    c->arbiter_max_per_min = 120;
    c->traj_retention_s = 7 * 86400;
    c->trace_sample_rate = 0.01;
    c->trace_slow_ms = 100;
    c->trace_ring = 4096;
    c->net.ipv6 = false;
    c->net.masquerade = true;
}

static void node_release(dsec_cell_node *n)
{
    for (size_t i = 0; i < 16 && n->types[i]; i++)
        dsec_free(n->types[i]);
    for (size_t i = 0; i < n->nlabels; i++) {
        dsec_free((char *)n->labels[i].key);
        dsec_free((char *)n->labels[i].value);
    }
    for (size_t i = 0; i < n->nopts; i++) {
        dsec_free((char *)n->opts[i].key);
        dsec_free((char *)n->opts[i].value);
    }
}

static void strv_release(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dsec_free(v[i]);
    dsec_free(v);
}

static void net_release(dsec_cell_net *n)
{
    strv_release(n->upstream, n->nupstream);
    strv_release(n->deny, n->ndeny);
    for (size_t i = 0; i < n->nmirrors; i++) {
        dsec_free((char *)n->mirrors[i].name);
        strv_release((char **)n->mirrors[i].targets, n->mirrors[i].ntargets);
    }
    dsec_free(n->mirrors);
    memset(n, 0, sizeof *n);
}

void dsec_cell_conf_release(dsec_cell_conf *c)
{
    net_release(&c->net);
    for (size_t i = 0; i < c->nnodes; i++)
        node_release(&c->nodes[i]);
    dsec_free(c->nodes);
    c->nodes = NULL;
    c->nnodes = 0;
}

static dsec_cell_node *add_node(dsec_cell_conf *c, dsec_err *err)
{
    if (c->nnodes >= DSEC_CELL_MAX_NODES) {
        dsec_err_set(err, DSEC_E_CONFIG, 0, "at most %d nodes per process", DSEC_CELL_MAX_NODES);
        return NULL;
    }
    dsec_cell_node *nn = dsec_realloc(c->nodes, (c->nnodes + 1) * sizeof *nn);
    if (nn == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        return NULL;
    }
    c->nodes = nn;
    dsec_cell_node *n = &c->nodes[c->nnodes++];
    memset(n, 0, sizeof *n);
    n->cpu_milli = 8000;
    n->memory_mb = 16384;
    n->slots = 1024;
    n->disk_reserve_mb = 2048;
    n->results_budget_mb = 64;
    n->results_ttl_s = 600;
    snprintf(n->backend, sizeof n->backend, "sim");
    return n;
}

static int kv_add(dsec_backend_kv *kv, size_t *n, size_t max, const char *k, const char *v,
                  const char *what, dsec_err *err)
{
    if (*n >= max)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s: at most %zu entries", what, max);
    kv[*n].key = dsec_strdup(k);
    kv[*n].value = dsec_strdup(v);
    (*n)++;
    if (kv[*n - 1].key == NULL || kv[*n - 1].value == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    return 0;
}

static int scalar_map(const dsec_cfg *cfg, const dsec_cfg_node *map, dsec_backend_kv *kv, size_t *n,
                      size_t max, dsec_err *err)
{
    if (map == NULL)
        return 0;
    if (dsec_cfg_expect(cfg, map, DSEC_CFG_MAP, err) < 0)
        return -1;
    for (size_t i = 0; i < map->n; i++) {
        const dsec_cfg_node *v = map->kids[i];
        if (dsec_cfg_expect(cfg, v, DSEC_CFG_SCALAR, err) < 0)
            return -1;
        if (kv_add(kv, n, max, v->key, v->value, map->key, err) < 0)
            return dsec_err_wrap(err, "%s:%d", dsec_cfg_name(cfg), v->line);
    }
    return 0;
}

static int load_node(const dsec_cfg *cfg, const dsec_cfg_node *item, dsec_cell_conf *c,
                     dsec_err *err)
{
    static const char *const keys[] = {
        "name",          "cpu_milli", "memory_mb",       "slots",
        "types",         "labels",    "backend",         "sim",
        "options",       "disk_mb",   "disk_reserve_mb", "results_budget_mb",
        "results_ttl_s", NULL};
    if (dsec_cfg_expect(cfg, item, DSEC_CFG_MAP, err) < 0 ||
        dsec_cfg_check_keys(cfg, item, keys, err) < 0)
        return -1;
    dsec_cell_node *n = add_node(c, err);
    if (n == NULL)
        return -1;
    const char *name, *backend;
    if (dsec_cfg_str(cfg, item, "name", NULL, &name, err) < 0 ||
        dsec_cfg_str(cfg, item, "backend", "sim", &backend, err) < 0 ||
        dsec_cfg_u64(cfg, item, "cpu_milli", 8000, 1, 100000000, &n->cpu_milli, err) < 0 ||
        dsec_cfg_u64(cfg, item, "memory_mb", 16384, 1, 1ull << 32, &n->memory_mb, err) < 0 ||
        dsec_cfg_u64(cfg, item, "slots", 1024, 1, 1000000, &n->slots, err) < 0 ||
        dsec_cfg_u64(cfg, item, "disk_mb", 0, 0, 1ull << 40, &n->disk_mb, err) < 0 ||
        dsec_cfg_u64(cfg, item, "disk_reserve_mb", 2048, 1, 1ull << 40, &n->disk_reserve_mb, err) <
            0)
        return -1;
    /* At least 16 MiB, so that any answer the bus can carry (8 MiB) can be kept; a day at
     * most, as a client's retry comes within its own deadline. */
    if (dsec_cfg_u64(cfg, item, "results_budget_mb", 64, 16, 1ull << 20, &n->results_budget_mb,
                     err) < 0 ||
        dsec_cfg_u64(cfg, item, "results_ttl_s", 600, 1, 86400, &n->results_ttl_s, err) < 0)
        return -1;
    if (name == NULL || dsec_name_ok(name, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(
            err, DSEC_E_CONFIG, 0,
            "%s:%d: key \"name\": a node needs a name of 1-64 characters A-Z a-z 0-9 _ -",
            dsec_cfg_name(cfg), item->line);
    if (strcmp(backend, "sim") != 0 && strcmp(backend, "native") != 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "%s:%d: key \"backend\": \"%s\" is unknown (known: sim, native)",
                            dsec_cfg_name(cfg), dsec_cfg_get(item, "backend")->line, backend);
    snprintf(n->name, sizeof n->name, "%s", name);
    snprintf(n->backend, sizeof n->backend, "%s", backend);
    const dsec_cfg_node *types = dsec_cfg_get(item, "types");
    if (dsec_cfg_expect(cfg, types, DSEC_CFG_SEQ, err) < 0)
        return -1;
    size_t nt = 0;
    for (size_t i = 0; types && i < types->n; i++) {
        if (dsec_cfg_expect(cfg, types->kids[i], DSEC_CFG_SCALAR, err) < 0)
            return -1;
        if (nt >= 15)
            return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s:%d: too many types", dsec_cfg_name(cfg),
                                types->line);
        if ((n->types[nt++] = dsec_strdup(types->kids[i]->value)) == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    if (nt == 0 && (n->types[0] = dsec_strdup("sim")) == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    if (scalar_map(cfg, dsec_cfg_get(item, "labels"), n->labels, &n->nlabels, 16, err) < 0 ||
        scalar_map(cfg, dsec_cfg_get(item, "sim"), n->opts, &n->nopts, 32, err) < 0 ||
        scalar_map(cfg, dsec_cfg_get(item, "options"), n->opts, &n->nopts, 32, err) < 0)
        return -1;
    for (size_t i = 0; i + 1 < c->nnodes; i++)
        if (strcmp(c->nodes[i].name, n->name) == 0)
            return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s:%d: node \"%s\" is defined twice",
                                dsec_cfg_name(cfg), item->line, n->name);
    return 0;
}

static int load_u32(const dsec_cfg *cfg, const dsec_cfg_node *m, const char *key, uint32_t *v,
                    uint64_t min, uint64_t max, dsec_err *err)
{
    uint64_t x;
    if (dsec_cfg_u64(cfg, m, key, *v, min, max, &x, err) < 0)
        return -1;
    *v = (uint32_t)x;
    return 0;
}

static int load_unsigned(const dsec_cfg *cfg, const dsec_cfg_node *m, const char *key, unsigned *v,
                         uint64_t min, uint64_t max, dsec_err *err)
{
    uint64_t x;
    if (dsec_cfg_u64(cfg, m, key, *v, min, max, &x, err) < 0)
        return -1;
    *v = (unsigned)x;
    return 0;
}

/* A sequence of scalars into an owned string array. */
static int load_strs(const dsec_cfg *cfg, const dsec_cfg_node *seq, char ***out, size_t *n,
                     size_t max, dsec_err *err)
{
    if (seq == NULL)
        return 0;
    if (dsec_cfg_expect(cfg, seq, DSEC_CFG_SEQ, err) < 0)
        return -1;
    if (seq->n > max)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s:%d: at most %zu items", dsec_cfg_name(cfg),
                            seq->line, max);
    char **v = dsec_calloc(seq->n ? seq->n : 1, sizeof *v);
    if (v == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    for (size_t i = 0; i < seq->n; i++) {
        if (dsec_cfg_expect(cfg, seq->kids[i], DSEC_CFG_SCALAR, err) < 0 ||
            (v[i] = dsec_strdup(seq->kids[i]->value)) == NULL) {
            if (err->code == DSEC_OK)
                dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
            strv_release(v, i);
            return -1;
        }
    }
    strv_release(*out, *n);
    *out = v;
    *n = seq->n;
    return 0;
}

static int load_net(const dsec_cfg *cfg, const dsec_cfg_node *m, dsec_cell_net *net, dsec_err *err)
{
    static const char *const keys[] = {
        "enabled",  "tag_base", "ipv6",      "masquerade", "upstream",        "deny", "mirrors",
        "dns_port", "dns_qps",  "dns_cache", "conn_rate",  "alert_window_ms", "warm", NULL};
    if (m == NULL)
        return 0;
    uint64_t tag = net->tag_base, port = net->dns_port, qps = net->dns_qps, cache = net->dns_cache,
             rate = net->conn_rate, win = net->alert_window_ms,
             warm = net->warm == UINT32_MAX ? 0 : net->warm;
    if (dsec_cfg_expect(cfg, m, DSEC_CFG_MAP, err) < 0 ||
        dsec_cfg_check_keys(cfg, m, keys, err) < 0 ||
        dsec_cfg_bool(cfg, m, "enabled", net->enabled, &net->enabled, err) < 0 ||
        dsec_cfg_bool(cfg, m, "ipv6", net->ipv6, &net->ipv6, err) < 0 ||
        dsec_cfg_bool(cfg, m, "masquerade", net->masquerade, &net->masquerade, err) < 0 ||
        dsec_cfg_u64(cfg, m, "tag_base", tag, 0, 255, &tag, err) < 0 ||
        dsec_cfg_u64(cfg, m, "dns_port", port, 0, 65535, &port, err) < 0 ||
        dsec_cfg_u64(cfg, m, "dns_qps", qps, 0, 1000000, &qps, err) < 0 ||
        dsec_cfg_u64(cfg, m, "dns_cache", cache, 0, 10000000, &cache, err) < 0 ||
        dsec_cfg_u64(cfg, m, "conn_rate", rate, 0, 1000000, &rate, err) < 0 ||
        dsec_cfg_u64(cfg, m, "alert_window_ms", win, 0, 3600000, &win, err) < 0 ||
        dsec_cfg_u64(cfg, m, "warm", warm, 0, 4096, &warm, err) < 0 ||
        load_strs(cfg, dsec_cfg_get(m, "upstream"), &net->upstream, &net->nupstream, 4, err) < 0 ||
        load_strs(cfg, dsec_cfg_get(m, "deny"), &net->deny, &net->ndeny, 256, err) < 0)
        return dsec_err_wrap(err, "net");
    net->tag_base = (unsigned)tag;
    net->dns_port = (uint32_t)port;
    net->dns_qps = (uint32_t)qps;
    net->dns_cache = (uint32_t)cache;
    net->conn_rate = (uint32_t)rate;
    net->alert_window_ms = (uint32_t)win;
    /* warm: 0 turns the ready networks off (net.h's 0 means its default) */
    net->warm = dsec_cfg_get(m, "warm") != NULL && warm == 0 ? UINT32_MAX : (uint32_t)warm;
    const dsec_cfg_node *mir = dsec_cfg_get(m, "mirrors");
    if (mir == NULL)
        return 0;
    if (dsec_cfg_expect(cfg, mir, DSEC_CFG_MAP, err) < 0)
        return dsec_err_wrap(err, "net.mirrors (a map of name: [targets])");
    for (size_t i = 0; i < net->nmirrors; i++) {
        dsec_free((char *)net->mirrors[i].name);
        strv_release((char **)net->mirrors[i].targets, net->mirrors[i].ntargets);
    }
    dsec_free(net->mirrors);
    net->nmirrors = 0;
    if ((net->mirrors = dsec_calloc(mir->n ? mir->n : 1, sizeof *net->mirrors)) == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    for (size_t i = 0; i < mir->n; i++) {
        const dsec_cfg_node *k = mir->kids[i];
        char **t = NULL;
        size_t nt = 0;
        if (load_strs(cfg, k, &t, &nt, 64, err) < 0)
            return dsec_err_wrap(err, "net.mirrors.%s (a list of host:port targets)", k->key);
        dsec_net_mirror *mm = &net->mirrors[net->nmirrors++];
        mm->targets = (const char *const *)t;
        mm->ntargets = nt;
        if ((mm->name = dsec_strdup(k->key)) == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    /* the same check the nodes make, so a bad mirror fails at load, with its line */
    for (size_t i = 0; i < net->nmirrors; i++) {
        if (dsec_net_policy_check(NULL, net->mirrors[i].targets, net->mirrors[i].ntargets, err) <
            0) {
            char why[DSEC_ERR_MSG_MAX];
            snprintf(why, sizeof why, "%s", err->msg);
            return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s:%d: net.mirrors.%s: %s",
                                dsec_cfg_name(cfg), mir->kids[i]->line, net->mirrors[i].name, why);
        }
    }
    return 0;
}

/* The bus to join, and the NATS server a cell may run itself. */
static int load_bus(const dsec_cfg *cfg, const dsec_cfg_node *root, dsec_cell_conf *c,
                    dsec_err *err)
{
    const char *s;
    const dsec_cfg_node *bus = dsec_cfg_get(root, "bus");
    static const char *const bus_keys[] = {"url",         "threads",         "work_threads",
                                           "low_latency", "shared_delivery", NULL};
    uint64_t threads, work;
    if (dsec_cfg_expect(cfg, bus, DSEC_CFG_MAP, err) < 0 ||
        dsec_cfg_check_keys(cfg, bus, bus_keys, err) < 0 ||
        dsec_cfg_str(cfg, bus, "url", c->url, &s, err) < 0 ||
        dsec_cfg_u64(cfg, bus, "threads", (uint64_t)c->threads, 1, 64, &threads, err) < 0 ||
        dsec_cfg_u64(cfg, bus, "work_threads", (uint64_t)c->work_threads, 0, 256, &work, err) < 0 ||
        dsec_cfg_bool(cfg, bus, "low_latency", c->low_latency, &c->low_latency, err) < 0 ||
        dsec_cfg_bool(cfg, bus, "shared_delivery", c->shared_delivery, &c->shared_delivery, err) <
            0)
        return -1;
    snprintf(c->url, sizeof c->url, "%s", s);
    c->threads = (int)threads;
    c->work_threads = (int)work;

    const dsec_cfg_node *en = dsec_cfg_get(root, "embedded_nats");
    static const char *const en_keys[] = {"enabled", "port", "jetstream", NULL};
    uint64_t port;
    if (dsec_cfg_expect(cfg, en, DSEC_CFG_MAP, err) < 0 ||
        dsec_cfg_check_keys(cfg, en, en_keys, err) < 0 ||
        dsec_cfg_bool(cfg, en, "enabled", c->embedded_nats, &c->embedded_nats, err) < 0 ||
        dsec_cfg_bool(cfg, en, "jetstream", c->jetstream, &c->jetstream, err) < 0 ||
        dsec_cfg_u64(cfg, en, "port", (uint64_t)c->nats_port, 0, 65535, &port, err) < 0)
        return -1;
    c->nats_port = (int)port;
    return 0;
}

/* What a create that names no resources or lifetimes gets. */
static int load_defaults(const dsec_cfg *cfg, const dsec_cfg_node *root, dsec_cell_conf *c,
                         dsec_err *err)
{
    const dsec_cfg_node *d = dsec_cfg_get(root, "defaults");
    static const char *const d_keys[] = {"cpu_milli", "memory_mb", "disk_mb",   "function_disk_mb",
                                         "ttl_s",     "idle_s",    "max_ttl_s", NULL};
    if (dsec_cfg_expect(cfg, d, DSEC_CFG_MAP, err) < 0 ||
        dsec_cfg_check_keys(cfg, d, d_keys, err) < 0 ||
        dsec_cfg_u64(cfg, d, "cpu_milli", c->default_cpu_milli, 1, 1000000, &c->default_cpu_milli,
                     err) < 0 ||
        dsec_cfg_u64(cfg, d, "memory_mb", c->default_memory_mb, 1, 1ull << 24,
                     &c->default_memory_mb, err) < 0 ||
        dsec_cfg_u64(cfg, d, "disk_mb", c->default_disk_mb, 1, 1ull << 40, &c->default_disk_mb,
                     err) < 0 ||
        dsec_cfg_u64(cfg, d, "function_disk_mb", c->default_function_disk_mb, 1, 1ull << 40,
                     &c->default_function_disk_mb, err) < 0 ||
        dsec_cfg_u64(cfg, d, "ttl_s", c->default_ttl_s, 1, 1ull << 32, &c->default_ttl_s, err) <
            0 ||
        dsec_cfg_u64(cfg, d, "idle_s", c->default_idle_s, 1, 1ull << 32, &c->default_idle_s, err) <
            0 ||
        dsec_cfg_u64(cfg, d, "max_ttl_s", c->max_ttl_s, 1, 1ull << 32, &c->max_ttl_s, err) < 0)
        return -1;
    return 0;
}

/* The schedulers: how many, how they place, when they give up on a node. */
static int load_scheduler(const dsec_cfg *cfg, const dsec_cfg_node *root, dsec_cell_conf *c,
                          dsec_err *err)
{
    const dsec_cfg_node *sc = dsec_cfg_get(root, "scheduler");
    static const char *const s_keys[] = {
        "replicas",      "k",          "max_attempts", "max_hops",         "dead_after_ms",
        "lost_after_ms", "summary_ms", "wait_ms",      "suspect_after_ms", "drain_gap_ms",
        "probation_ms",  "admit_max",  "park_max",     "shed_after_ms",    "admit_delay_ms",
        "window_ms",     NULL};
    if (dsec_cfg_expect(cfg, sc, DSEC_CFG_MAP, err) < 0 ||
        dsec_cfg_check_keys(cfg, sc, s_keys, err) < 0 ||
        load_unsigned(cfg, sc, "replicas", &c->sched_replicas, 0, 64, err) < 0 ||
        load_unsigned(cfg, sc, "k", &c->k, 1, 16, err) < 0 ||
        load_unsigned(cfg, sc, "max_attempts", &c->max_attempts, 1, 64, err) < 0 ||
        load_unsigned(cfg, sc, "max_hops", &c->max_hops, 0, 16, err) < 0 ||
        load_u32(cfg, sc, "dead_after_ms", &c->dead_after_ms, 100, 3600000, err) < 0 ||
        load_u32(cfg, sc, "lost_after_ms", &c->lost_after_ms, 100, 86400000, err) < 0 ||
        load_u32(cfg, sc, "summary_ms", &c->summary_ms, 10, 3600000, err) < 0 ||
        load_u32(cfg, sc, "wait_ms", &c->wait_ms, 1, 3600000, err) < 0 ||
        load_u32(cfg, sc, "suspect_after_ms", &c->suspect_after_ms, 0, 3600000, err) < 0 ||
        load_u32(cfg, sc, "drain_gap_ms", &c->drain_gap_ms, 1, 3600000, err) < 0 ||
        load_u32(cfg, sc, "probation_ms", &c->probation_ms, 0, 3600000, err) < 0 ||
        load_u32(cfg, sc, "admit_max", &c->admit_max, 1, 1000000, err) < 0 ||
        load_u32(cfg, sc, "park_max", &c->park_max, 1, 1000000, err) < 0 ||
        load_u32(cfg, sc, "shed_after_ms", &c->shed_after_ms, 0, 600000, err) < 0 ||
        load_u32(cfg, sc, "admit_delay_ms", &c->admit_delay_ms, 0, 600000, err) < 0 ||
        load_u32(cfg, sc, "window_ms", &c->window_ms, 0, 600000, err) < 0)
        return -1;
    if (c->park_max > c->admit_max && (sc == NULL || dsec_cfg_get(sc, "park_max") == NULL))
        c->park_max = c->admit_max; /* the default follows a smaller admit_max */
    else if (c->park_max > c->admit_max)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "scheduler.park_max (%u) must not exceed scheduler.admit_max (%u): "
                            "parked rollouts are part of the work a replica holds",
                            c->park_max, c->admit_max);
    if (c->suspect_after_ms != 0 && c->suspect_after_ms >= c->dead_after_ms)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "scheduler.suspect_after_ms (%u) must be below scheduler.dead_after_ms "
                            "(%u): a late node is suspect before it is drained",
                            c->suspect_after_ms, c->dead_after_ms);
    return 0;
}

/* The arbiter, the quota service and the trajectory log. */
static int load_services(const dsec_cfg *cfg, const dsec_cfg_node *root, dsec_cell_conf *c,
                         dsec_err *err)
{
    const dsec_cfg_node *ar = dsec_cfg_get(root, "arbiter");
    static const char *const a_keys[] = {"lease_ms", "grace_ms", "max_evictions_per_min",
                                         "replicas", NULL};
    if (dsec_cfg_expect(cfg, ar, DSEC_CFG_MAP, err) < 0 ||
        dsec_cfg_check_keys(cfg, ar, a_keys, err) < 0 ||
        load_u32(cfg, ar, "lease_ms", &c->arbiter_lease_ms, 300, 600000, err) < 0 ||
        load_u32(cfg, ar, "grace_ms", &c->arbiter_grace_ms, 1, 3600000, err) < 0 ||
        load_u32(cfg, ar, "max_evictions_per_min", &c->arbiter_max_per_min, 1, 1000000, err) < 0 ||
        load_unsigned(cfg, ar, "replicas", &c->arbiter_replicas, 0, 5, err) < 0)
        return -1;

    const dsec_cfg_node *qu = dsec_cfg_get(root, "quota");
    static const char *const q_keys[] = {"enabled",  "pending_ms", "reload_ms",
                                         "replicas", "lease_ms",   NULL};
    if (dsec_cfg_expect(cfg, qu, DSEC_CFG_MAP, err) < 0 ||
        dsec_cfg_check_keys(cfg, qu, q_keys, err) < 0 ||
        dsec_cfg_bool(cfg, qu, "enabled", c->quota, &c->quota, err) < 0 ||
        load_u32(cfg, qu, "pending_ms", &c->quota_pending_ms, 0, 3600000, err) < 0 ||
        load_u32(cfg, qu, "reload_ms", &c->quota_reload_ms, 100, 3600000, err) < 0 ||
        load_u32(cfg, qu, "lease_ms", &c->quota_lease_ms, 300, 600000, err) < 0 ||
        load_unsigned(cfg, qu, "replicas", &c->quota_replicas, 0, 5, err) < 0)
        return -1;

    const dsec_cfg_node *tj = dsec_cfg_get(root, "trajectory");
    static const char *const t_keys[] = {"retention_s", "max_bytes", "replicas", NULL};
    uint64_t ret_s = 0, max_b = 0;
    if (dsec_cfg_expect(cfg, tj, DSEC_CFG_MAP, err) < 0 ||
        dsec_cfg_check_keys(cfg, tj, t_keys, err) < 0 ||
        dsec_cfg_u64(cfg, tj, "retention_s", 7 * 86400, 1, 1ull << 32, &ret_s, err) < 0 ||
        dsec_cfg_u64(cfg, tj, "max_bytes", 0, 0, 1ull << 50, &max_b, err) < 0 ||
        load_unsigned(cfg, tj, "replicas", &c->traj_replicas, 0, 5, err) < 0)
        return -1;
    c->traj_retention_s = (int64_t)ret_s;
    c->traj_max_bytes = (int64_t)max_b;
    return 0;
}

/* How often nodes report, reap and sync their journal. */
static int load_reports(const dsec_cfg *cfg, const dsec_cfg_node *root, dsec_cell_conf *c,
                        dsec_err *err)
{
    const dsec_cfg_node *r = dsec_cfg_get(root, "reports");
    static const char *const r_keys[] = {"capacity_ms", "full_ms",         "heartbeat_ms",
                                         "reap_ms",     "journal_sync_ms", NULL};
    bool never_sync = false;
    uint64_t sync_ms = 1000;
    if (dsec_cfg_expect(cfg, r, DSEC_CFG_MAP, err) < 0 ||
        dsec_cfg_check_keys(cfg, r, r_keys, err) < 0 ||
        load_u32(cfg, r, "capacity_ms", &c->capacity_ms, 1, 60000, err) < 0 ||
        load_u32(cfg, r, "full_ms", &c->full_ms, 10, 3600000, err) < 0 ||
        load_u32(cfg, r, "heartbeat_ms", &c->heartbeat_ms, 10, 3600000, err) < 0 ||
        load_u32(cfg, r, "reap_ms", &c->reap_ms, 10, 3600000, err) < 0)
        return -1;
    const dsec_cfg_node *js = dsec_cfg_get(r, "journal_sync_ms");
    if (js != NULL && js->kind == DSEC_CFG_SCALAR && strcmp(js->value, "never") == 0)
        never_sync = true;
    else if (dsec_cfg_u64(cfg, r, "journal_sync_ms", 1000, 1, 3600000, &sync_ms, err) < 0)
        return dsec_err_wrap(err, "(a period in ms, or \"never\")");
    c->journal_sync_ms = never_sync ? -1 : (int64_t)sync_ms;
    return 0;
}

/* The layer registry. */
static int load_layers(const dsec_cfg *cfg, const dsec_cfg_node *root, dsec_cell_conf *c,
                       dsec_err *err)
{
    const dsec_cfg_node *ly = dsec_cfg_get(root, "layers");
    static const char *const l_keys[] = {"registry", "path", "bucket", "replicas", NULL};
    const char *kind, *lpath, *bucket;
    if (dsec_cfg_expect(cfg, ly, DSEC_CFG_MAP, err) < 0 ||
        dsec_cfg_check_keys(cfg, ly, l_keys, err) < 0 ||
        dsec_cfg_str(cfg, ly, "registry", c->layers_kind, &kind, err) < 0 ||
        dsec_cfg_str(cfg, ly, "path", c->layers_path, &lpath, err) < 0 ||
        dsec_cfg_str(cfg, ly, "bucket", c->layers_bucket, &bucket, err) < 0 ||
        load_unsigned(cfg, ly, "replicas", &c->layers_replicas, 0, 5, err) < 0)
        return -1;
    if (strcmp(kind, "local") != 0 && strcmp(kind, "shared") != 0 && strcmp(kind, "jetstream") != 0)
        return dsec_err_set(
            err, DSEC_E_CONFIG, 0,
            "%s:%d: key \"registry\": \"%s\" is unknown (known: local, shared, jetstream)",
            dsec_cfg_name(cfg), dsec_cfg_get(ly, "registry")->line, kind);
    if (strcmp(kind, "shared") == 0 && lpath[0] == '\0')
        return dsec_err_set(
            err, DSEC_E_CONFIG, 0,
            "%s:%d: a shared layer registry needs \"path\" (the shared filesystem's directory)",
            dsec_cfg_name(cfg), ly->line);
    snprintf(c->layers_kind, sizeof c->layers_kind, "%s", kind);
    snprintf(c->layers_path, sizeof c->layers_path, "%s", lpath);
    snprintf(c->layers_bucket, sizeof c->layers_bucket, "%s", bucket);
    return 0;
}

/* The metrics endpoint and tracing. */
static int load_observing(const dsec_cfg *cfg, const dsec_cfg_node *root, dsec_cell_conf *c,
                          dsec_err *err)
{
    const dsec_cfg_node *me = dsec_cfg_get(root, "metrics");
    static const char *const me_keys[] = {"listen", NULL};
    const char *mlisten;
    if (dsec_cfg_expect(cfg, me, DSEC_CFG_MAP, err) < 0 ||
        dsec_cfg_check_keys(cfg, me, me_keys, err) < 0 ||
        dsec_cfg_str(cfg, me, "listen", c->metrics_listen, &mlisten, err) < 0)
        return -1;
    if (strlen(mlisten) >= sizeof c->metrics_listen)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s:%d: key \"listen\": at most %zu characters",
                            dsec_cfg_name(cfg), dsec_cfg_get(me, "listen")->line,
                            sizeof c->metrics_listen - 1);
    if (mlisten[0] != '\0' && dsec_metrics_listen_check(mlisten, err) < 0)
        return dsec_err_wrap(err, "%s:%d: key \"listen\"", dsec_cfg_name(cfg),
                             dsec_cfg_get(me, "listen")->line);
    snprintf(c->metrics_listen, sizeof c->metrics_listen, "%s", mlisten);

    const dsec_cfg_node *tr = dsec_cfg_get(root, "trace");
    static const char *const tr_keys[] = {"sample_rate", "slow_ms", "ring", NULL};
    uint64_t slow_ms, ring;
    if (dsec_cfg_expect(cfg, tr, DSEC_CFG_MAP, err) < 0 ||
        dsec_cfg_check_keys(cfg, tr, tr_keys, err) < 0 ||
        dsec_cfg_double(cfg, tr, "sample_rate", c->trace_sample_rate, 0.0, 1.0,
                        &c->trace_sample_rate, err) < 0 ||
        dsec_cfg_u64(cfg, tr, "slow_ms", c->trace_slow_ms, 0, 3600000, &slow_ms, err) < 0 ||
        dsec_cfg_u64(cfg, tr, "ring", c->trace_ring, 0, 1000000, &ring, err) < 0)
        return -1;
    c->trace_slow_ms = (uint32_t)slow_ms;
    c->trace_ring = (uint32_t)ring;
    return 0;
}

static int load_tree(const dsec_cfg *cfg, dsec_cell_conf *c, dsec_err *err)
{
    const dsec_cfg_node *root = dsec_cfg_root(cfg);
    static const char *const top[] = {"cell",       "bus",       "embedded_nats", "state_dir",
                                      "defaults",   "scheduler", "arbiter",       "quota",
                                      "trajectory", "reports",   "layers",        "net",
                                      "metrics",    "trace",     "nodes",         NULL};
    if (dsec_cfg_check_keys(cfg, root, top, err) < 0)
        return -1;
    const char *s;
    if (dsec_cfg_str(cfg, root, "cell", c->cell, &s, err) < 0)
        return -1;
    if (dsec_name_ok(s, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "%s:%d: key \"cell\": \"%s\" is not a valid name", dsec_cfg_name(cfg),
                            dsec_cfg_get(root, "cell")->line, s);
    snprintf(c->cell, sizeof c->cell, "%s", s);
    if (dsec_cfg_str(cfg, root, "state_dir", c->state_dir, &s, err) < 0 ||
        dsec_cell_conf_set_state_dir(c, s, err) < 0)
        return -1;
    if (load_bus(cfg, root, c, err) < 0 || load_defaults(cfg, root, c, err) < 0 ||
        load_scheduler(cfg, root, c, err) < 0 || load_services(cfg, root, c, err) < 0 ||
        load_reports(cfg, root, c, err) < 0 || load_layers(cfg, root, c, err) < 0 ||
        load_net(cfg, dsec_cfg_get(root, "net"), &c->net, err) < 0 ||
        load_observing(cfg, root, c, err) < 0)
        return -1;
    const dsec_cfg_node *nodes = dsec_cfg_get(root, "nodes");
    if (dsec_cfg_expect(cfg, nodes, DSEC_CFG_SEQ, err) < 0)
        return -1;
    for (size_t i = 0; nodes && i < nodes->n; i++)
        if (load_node(cfg, nodes->kids[i], c, err) < 0)
            return -1;
    return 0;
}

int dsec_cell_conf_load(dsec_cell_conf *c, const char *path, dsec_err *err)
{
    dsec_cfg *cfg;
    if (dsec_cfg_load(&cfg, path, err) < 0)
        return -1;
    int rc = load_tree(cfg, c, err);
    dsec_cfg_free(cfg);
    return rc;
}

int dsec_cell_conf_parse(dsec_cell_conf *c, const char *name, const char *text, size_t len,
                         dsec_err *err)
{
    dsec_cfg *cfg;
    if (dsec_cfg_parse(&cfg, name, text, len, err) < 0)
        return -1;
    int rc = load_tree(cfg, c, err);
    dsec_cfg_free(cfg);
    return rc;
}

int dsec_cell_conf_set_state_dir(dsec_cell_conf *c, const char *dir, dsec_err *err)
{
    if (dir == NULL || dir[0] == '\0')
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "state_dir is empty");
    char cwd[1024] = "";
    if (dir[0] != '/' && getcwd(cwd, sizeof cwd) == NULL)
        return dsec_err_set(err, DSEC_E_CONFIG, errno,
                            "state_dir \"%s\" is relative and the current directory is unknown",
                            dir);
    while (dir[0] == '.' && dir[1] == '/')
        dir += 2;
    int n = dir[0] == '/'           ? snprintf(c->state_dir, sizeof c->state_dir, "%s", dir)
            : strcmp(dir, ".") == 0 ? snprintf(c->state_dir, sizeof c->state_dir, "%s", cwd)
                                    : snprintf(c->state_dir, sizeof c->state_dir, "%s/%s",
                                               strcmp(cwd, "/") ? cwd : "", dir);
    if (n < 0 || (size_t)n >= sizeof c->state_dir)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "state_dir \"%s\" is longer than %zu bytes", dir,
                            sizeof c->state_dir - 1);
    return 0;
}

int dsec_cell_conf_set_metrics(dsec_cell_conf *c, const char *listen, dsec_err *err)
{
    if (strlen(listen) >= sizeof c->metrics_listen)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "--metrics: at most %zu characters",
                            sizeof c->metrics_listen - 1);
    if (listen[0] != '\0' && dsec_metrics_listen_check(listen, err) < 0)
        return dsec_err_wrap(err, "--metrics");
    snprintf(c->metrics_listen, sizeof c->metrics_listen, "%s", listen);
    return 0;
}

int dsec_cell_conf_add_sim_nodes(dsec_cell_conf *c, const char *prefix, size_t count, uint64_t cpu,
                                 uint64_t mem, uint64_t slots, const char *const *types,
                                 const char *time_scale, dsec_err *err)
{
    for (size_t i = 0; i < count; i++) {
        dsec_cell_node *n = add_node(c, err);
        if (n == NULL)
            return -1;
        snprintf(n->name, sizeof n->name, "%s-%04zu", prefix, i);
        n->cpu_milli = cpu;
        n->memory_mb = mem;
        n->slots = slots;
        for (size_t t = 0; types[t] && t < 15; t++)
            if ((n->types[t] = dsec_strdup(types[t])) == NULL)
                return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        if (time_scale && kv_add(n->opts, &n->nopts, 32, "time_scale", time_scale, "sim", err) < 0)
            return -1;
    }
    return 0;
}

int dsec_cell_roles_parse(const char *s, int *roles, dsec_err *err)
{
    *roles = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s ? s : "");
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "scheduler") == 0)
            *roles |= DSEC_ROLE_SCHEDULER;
        else if (strcmp(t, "node") == 0)
            *roles |= DSEC_ROLE_NODE;
        else if (strcmp(t, "arbiter") == 0)
            *roles |= DSEC_ROLE_ARBITER;
        else if (strcmp(t, "quota") == 0)
            *roles |= DSEC_ROLE_QUOTA;
        else if (strcmp(t, "all") == 0)
            *roles |= DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE | DSEC_ROLE_ARBITER | DSEC_ROLE_QUOTA;
        else
            return dsec_err_set(
                err, DSEC_E_CONFIG, 0,
                "role \"%s\" is unknown (known: scheduler, node, arbiter, quota, all)", t);
    }
    if (*roles == 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "no roles given (use --roles scheduler,node)");
    return 0;
}
