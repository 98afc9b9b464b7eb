/* cell.c - the cell configuration and a process hosting any set of a cell's actors. */
#include "actors/cell.h"

#include <errno.h>
#include <unistd.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "runtime/config.h"
#include "runtime/metrics.h"
#include "actors/tracer.h"
#include "backends/loop.h"
#include "backends/workq.h"
#include "bus/layers-js.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/layers.h"
#include "dsec/names.h"

struct dsec_cell {
    dsec_cell_conf conf;
    dsec_natsd *natsd;
    dsec_bus *bus;
    dsec_ticker *ticker;
    dsec_ticker *sync_ticker; /* journal syncs: a slow disk never delays reports */
    dsec_ticker *hb_ticker;   /* nodes' heartbeats: never behind reports or the reaper */
    dsec_registry *reg;
    dsec_node **nodes;
    size_t nnodes;
    dsec_sched **scheds;
    size_t nscheds;
    dsec_traj *traj;
    dsec_arbiter *arbiter;
    dsec_quota *quota;
    dsec_layer_registry *layers; /* handed to the node managers' backends */
    dsec_metrics *metrics;       /* the Prometheus endpoint, or NULL */
    dsec_tracer *tracer;         /* answers dsec trace; NULL when trace.ring is 0 */
    /* shared by this process's node managers: commands wait on the loop, other sandbox
     * operations take turns on the work queue's threads */
    dsec_loop *loop;
    dsec_workq *work;
};

void dsec_cell_conf_defaults(dsec_cell_conf *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->cell, sizeof c->cell, "local");
    const char *url = getenv("DSEC_URL");
    snprintf(c->url, sizeof c->url, "%s", url && url[0] ? url : "nats://127.0.0.1:4222");
    c->threads = 2;
    c->low_latency = true;
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
    c->shed_after_ms = 0; /* off: measured, it cost more than it gave (control-plane.md, "Shedding by wait") */
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

static int load_node(const dsec_cfg *cfg, const dsec_cfg_node *item, dsec_cell_conf *c, dsec_err *err)
{
    static const char *const keys[] = {"name",    "cpu_milli", "memory_mb",       "slots",
                                       "types",   "labels",    "backend",         "sim",
                                       "options", "disk_mb",   "disk_reserve_mb",
                                       "results_budget_mb",    "results_ttl_s",   NULL};
    if (dsec_cfg_expect(cfg, item, DSEC_CFG_MAP, err) < 0 || dsec_cfg_check_keys(cfg, item, keys, err) < 0)
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
        dsec_cfg_u64(cfg, item, "disk_reserve_mb", 2048, 1, 1ull << 40, &n->disk_reserve_mb, err) < 0)
        return -1;
    /* At least 16 MiB, so that any answer the bus can carry (8 MiB) can be kept; a day at
     * most, as a client's retry comes within its own deadline. */
    if (dsec_cfg_u64(cfg, item, "results_budget_mb", 64, 16, 1ull << 20, &n->results_budget_mb,
                     err) < 0 ||
        dsec_cfg_u64(cfg, item, "results_ttl_s", 600, 1, 86400, &n->results_ttl_s, err) < 0)
        return -1;
    if (name == NULL || dsec_name_ok(name, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "%s:%d: key \"name\": a node needs a name of 1-64 characters A-Z a-z 0-9 _ -",
                            dsec_cfg_name(cfg), item->line);
    if (strcmp(backend, "sim") != 0 && strcmp(backend, "native") != 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s:%d: key \"backend\": \"%s\" is unknown (known: sim, native)",
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
static int load_strs(const dsec_cfg *cfg, const dsec_cfg_node *seq, char ***out, size_t *n, size_t max,
                     dsec_err *err)
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
        if (dsec_net_policy_check(NULL, net->mirrors[i].targets, net->mirrors[i].ntargets, err) < 0) {
            char why[DSEC_ERR_MSG_MAX];
            snprintf(why, sizeof why, "%s", err->msg);
            return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s:%d: net.mirrors.%s: %s", dsec_cfg_name(cfg),
                                mir->kids[i]->line, net->mirrors[i].name, why);
        }
    }
    return 0;
}

static int load_tree(const dsec_cfg *cfg, dsec_cell_conf *c, dsec_err *err)
{
    const dsec_cfg_node *root = dsec_cfg_root(cfg);
    static const char *const top[] = {"cell", "bus", "embedded_nats", "state_dir", "defaults",
                                      "scheduler", "arbiter", "quota", "trajectory", "reports", "layers", "net",
                                      "metrics", "trace", "nodes", NULL};
    if (dsec_cfg_check_keys(cfg, root, top, err) < 0)
        return -1;
    const char *s;
    if (dsec_cfg_str(cfg, root, "cell", c->cell, &s, err) < 0)
        return -1;
    if (dsec_name_ok(s, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s:%d: key \"cell\": \"%s\" is not a valid name",
                            dsec_cfg_name(cfg), dsec_cfg_get(root, "cell")->line, s);
    snprintf(c->cell, sizeof c->cell, "%s", s);
    if (dsec_cfg_str(cfg, root, "state_dir", c->state_dir, &s, err) < 0 ||
        dsec_cell_conf_set_state_dir(c, s, err) < 0)
        return -1;

    const dsec_cfg_node *bus = dsec_cfg_get(root, "bus");
    static const char *const bus_keys[] = {"url", "threads", "low_latency", NULL};
    uint64_t threads;
    if (dsec_cfg_expect(cfg, bus, DSEC_CFG_MAP, err) < 0 || dsec_cfg_check_keys(cfg, bus, bus_keys, err) < 0 ||
        dsec_cfg_str(cfg, bus, "url", c->url, &s, err) < 0 ||
        dsec_cfg_u64(cfg, bus, "threads", (uint64_t)c->threads, 1, 64, &threads, err) < 0 ||
        dsec_cfg_bool(cfg, bus, "low_latency", c->low_latency, &c->low_latency, err) < 0)
        return -1;
    snprintf(c->url, sizeof c->url, "%s", s);
    c->threads = (int)threads;

    const dsec_cfg_node *en = dsec_cfg_get(root, "embedded_nats");
    static const char *const en_keys[] = {"enabled", "port", "jetstream", NULL};
    uint64_t port;
    if (dsec_cfg_expect(cfg, en, DSEC_CFG_MAP, err) < 0 || dsec_cfg_check_keys(cfg, en, en_keys, err) < 0 ||
        dsec_cfg_bool(cfg, en, "enabled", c->embedded_nats, &c->embedded_nats, err) < 0 ||
        dsec_cfg_bool(cfg, en, "jetstream", c->jetstream, &c->jetstream, err) < 0 ||
        dsec_cfg_u64(cfg, en, "port", (uint64_t)c->nats_port, 0, 65535, &port, err) < 0)
        return -1;
    c->nats_port = (int)port;

    const dsec_cfg_node *d = dsec_cfg_get(root, "defaults");
    static const char *const d_keys[] = {"cpu_milli", "memory_mb", "disk_mb",   "function_disk_mb",
                                         "ttl_s",     "idle_s",    "max_ttl_s", NULL};
    if (dsec_cfg_expect(cfg, d, DSEC_CFG_MAP, err) < 0 || dsec_cfg_check_keys(cfg, d, d_keys, err) < 0 ||
        dsec_cfg_u64(cfg, d, "cpu_milli", c->default_cpu_milli, 1, 1000000, &c->default_cpu_milli, err) < 0 ||
        dsec_cfg_u64(cfg, d, "memory_mb", c->default_memory_mb, 1, 1ull << 24, &c->default_memory_mb, err) < 0 ||
        dsec_cfg_u64(cfg, d, "disk_mb", c->default_disk_mb, 1, 1ull << 40, &c->default_disk_mb, err) < 0 ||
        dsec_cfg_u64(cfg, d, "function_disk_mb", c->default_function_disk_mb, 1, 1ull << 40,
                     &c->default_function_disk_mb, err) < 0 ||
        dsec_cfg_u64(cfg, d, "ttl_s", c->default_ttl_s, 1, 1ull << 32, &c->default_ttl_s, err) < 0 ||
        dsec_cfg_u64(cfg, d, "idle_s", c->default_idle_s, 1, 1ull << 32, &c->default_idle_s, err) < 0 ||
        dsec_cfg_u64(cfg, d, "max_ttl_s", c->max_ttl_s, 1, 1ull << 32, &c->max_ttl_s, err) < 0)
        return -1;

    const dsec_cfg_node *sc = dsec_cfg_get(root, "scheduler");
    static const char *const s_keys[] = {"replicas", "k", "max_attempts", "max_hops",
                                         "dead_after_ms", "lost_after_ms", "summary_ms", "wait_ms",
                                         "suspect_after_ms", "drain_gap_ms", "probation_ms",
                                         "admit_max", "park_max", "shed_after_ms", NULL};
    if (dsec_cfg_expect(cfg, sc, DSEC_CFG_MAP, err) < 0 || dsec_cfg_check_keys(cfg, sc, s_keys, err) < 0 ||
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
        load_u32(cfg, sc, "shed_after_ms", &c->shed_after_ms, 0, 600000, err) < 0)
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

    const dsec_cfg_node *ar = dsec_cfg_get(root, "arbiter");
    static const char *const a_keys[] = {"lease_ms", "grace_ms", "max_evictions_per_min", "replicas", NULL};
    if (dsec_cfg_expect(cfg, ar, DSEC_CFG_MAP, err) < 0 || dsec_cfg_check_keys(cfg, ar, a_keys, err) < 0 ||
        load_u32(cfg, ar, "lease_ms", &c->arbiter_lease_ms, 300, 600000, err) < 0 ||
        load_u32(cfg, ar, "grace_ms", &c->arbiter_grace_ms, 1, 3600000, err) < 0 ||
        load_u32(cfg, ar, "max_evictions_per_min", &c->arbiter_max_per_min, 1, 1000000, err) < 0 ||
        load_unsigned(cfg, ar, "replicas", &c->arbiter_replicas, 0, 5, err) < 0)
        return -1;

    const dsec_cfg_node *qu = dsec_cfg_get(root, "quota");
    static const char *const q_keys[] = {"enabled", "pending_ms", "reload_ms", "replicas", "lease_ms", NULL};
    if (dsec_cfg_expect(cfg, qu, DSEC_CFG_MAP, err) < 0 || dsec_cfg_check_keys(cfg, qu, q_keys, err) < 0 ||
        dsec_cfg_bool(cfg, qu, "enabled", c->quota, &c->quota, err) < 0 ||
        load_u32(cfg, qu, "pending_ms", &c->quota_pending_ms, 0, 3600000, err) < 0 ||
        load_u32(cfg, qu, "reload_ms", &c->quota_reload_ms, 100, 3600000, err) < 0 ||
        load_u32(cfg, qu, "lease_ms", &c->quota_lease_ms, 300, 600000, err) < 0 ||
        load_unsigned(cfg, qu, "replicas", &c->quota_replicas, 0, 5, err) < 0)
        return -1;

    const dsec_cfg_node *tj = dsec_cfg_get(root, "trajectory");
    static const char *const t_keys[] = {"retention_s", "max_bytes", "replicas", NULL};
    uint64_t ret_s = 0, max_b = 0;
    if (dsec_cfg_expect(cfg, tj, DSEC_CFG_MAP, err) < 0 || dsec_cfg_check_keys(cfg, tj, t_keys, err) < 0 ||
        dsec_cfg_u64(cfg, tj, "retention_s", 7 * 86400, 1, 1ull << 32, &ret_s, err) < 0 ||
        dsec_cfg_u64(cfg, tj, "max_bytes", 0, 0, 1ull << 50, &max_b, err) < 0 ||
        load_unsigned(cfg, tj, "replicas", &c->traj_replicas, 0, 5, err) < 0)
        return -1;
    c->traj_retention_s = (int64_t)ret_s;
    c->traj_max_bytes = (int64_t)max_b;

    const dsec_cfg_node *r = dsec_cfg_get(root, "reports");
    static const char *const r_keys[] = {"capacity_ms", "full_ms", "heartbeat_ms", "reap_ms",
                                         "journal_sync_ms", NULL};
    bool never_sync = false;
    uint64_t sync_ms = 1000;
    if (dsec_cfg_expect(cfg, r, DSEC_CFG_MAP, err) < 0 || dsec_cfg_check_keys(cfg, r, r_keys, err) < 0 ||
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

    const dsec_cfg_node *ly = dsec_cfg_get(root, "layers");
    static const char *const l_keys[] = {"registry", "path", "bucket", "replicas", NULL};
    const char *kind, *lpath, *bucket;
    if (dsec_cfg_expect(cfg, ly, DSEC_CFG_MAP, err) < 0 || dsec_cfg_check_keys(cfg, ly, l_keys, err) < 0 ||
        dsec_cfg_str(cfg, ly, "registry", c->layers_kind, &kind, err) < 0 ||
        dsec_cfg_str(cfg, ly, "path", c->layers_path, &lpath, err) < 0 ||
        dsec_cfg_str(cfg, ly, "bucket", c->layers_bucket, &bucket, err) < 0 ||
        load_unsigned(cfg, ly, "replicas", &c->layers_replicas, 0, 5, err) < 0)
        return -1;
    if (strcmp(kind, "local") != 0 && strcmp(kind, "shared") != 0 && strcmp(kind, "jetstream") != 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "%s:%d: key \"registry\": \"%s\" is unknown (known: local, shared, jetstream)",
                            dsec_cfg_name(cfg), dsec_cfg_get(ly, "registry")->line, kind);
    if (strcmp(kind, "shared") == 0 && lpath[0] == '\0')
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "%s:%d: a shared layer registry needs \"path\" (the shared filesystem's directory)",
                            dsec_cfg_name(cfg), ly->line);
    snprintf(c->layers_kind, sizeof c->layers_kind, "%s", kind);
    snprintf(c->layers_path, sizeof c->layers_path, "%s", lpath);
    snprintf(c->layers_bucket, sizeof c->layers_bucket, "%s", bucket);

    if (load_net(cfg, dsec_cfg_get(root, "net"), &c->net, err) < 0)
        return -1;

    const dsec_cfg_node *me = dsec_cfg_get(root, "metrics");
    static const char *const me_keys[] = {"listen", NULL};
    const char *mlisten;
    if (dsec_cfg_expect(cfg, me, DSEC_CFG_MAP, err) < 0 || dsec_cfg_check_keys(cfg, me, me_keys, err) < 0 ||
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
    if (dsec_cfg_expect(cfg, tr, DSEC_CFG_MAP, err) < 0 || dsec_cfg_check_keys(cfg, tr, tr_keys, err) < 0 ||
        dsec_cfg_double(cfg, tr, "sample_rate", c->trace_sample_rate, 0.0, 1.0,
                        &c->trace_sample_rate, err) < 0 ||
        dsec_cfg_u64(cfg, tr, "slow_ms", c->trace_slow_ms, 0, 3600000, &slow_ms, err) < 0 ||
        dsec_cfg_u64(cfg, tr, "ring", c->trace_ring, 0, 1000000, &ring, err) < 0)
        return -1;
    c->trace_slow_ms = (uint32_t)slow_ms;
    c->trace_ring = (uint32_t)ring;

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
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "role \"%s\" is unknown (known: scheduler, node, arbiter, quota, all)", t);
    }
    if (*roles == 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "no roles given (use --roles scheduler,node)");
    return 0;
}

static int mkdir_p(const char *path, dsec_err *err)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0700) < 0 && errno != EEXIST)
            return dsec_err_set(err, DSEC_E_IO, errno, "creating %s", tmp);
        *p = '/';
    }
    if (mkdir(tmp, 0700) < 0 && errno != EEXIST)
        return dsec_err_set(err, DSEC_E_IO, errno, "creating %s", tmp);
    return 0;
}

/* The layer registry the node managers' backends build root filesystems from. */
static int open_layers(dsec_cell *c, dsec_err *err)
{
    const dsec_cell_conf *conf = &c->conf;
    int rc;
    if (strcmp(conf->layers_kind, "jetstream") == 0) {
        dsec_js_layers_conf lc = {.bucket = conf->layers_bucket, .replicas = (int)conf->layers_replicas};
        rc = dsec_layer_registry_jetstream(&c->layers, c->bus, &lc, err);
    } else {
        char dir[1100];
        if (conf->layers_path[0] != '\0')
            snprintf(dir, sizeof dir, "%s", conf->layers_path);
        else
            snprintf(dir, sizeof dir, "%s/layers", conf->state_dir);
        rc = strcmp(conf->layers_kind, "shared") == 0 ? dsec_layer_registry_shared(&c->layers, dir, err)
                                                      : dsec_layer_registry_local(&c->layers, dir, err);
    }
    if (rc < 0)
        return dsec_err_wrap(err, "cell %s: layer registry", conf->cell);
    return 0;
}

/* ---- Prometheus metrics (docs/metrics.md) ---------------------------------------------------
 * Rendered on the metrics server's thread at each scrape: every actor's
 * counters are copied first (one short lock or a few atomic loads each), so
 * a scrape never holds an actor up for longer than a stats call. */

struct field {
    const char *name, *type, *help;
    size_t off;   /* of a uint64_t in the stats struct */
    double scale; /* to the family's unit */
};

#define U64_AT(base, off) (*(const uint64_t *)((const char *)(base) + (off)))

/* One family per field, one sample per instance (labels: cell and kind=name). */
static void emit_fields(dsec_metrics_text *t, const struct field *f, size_t nf, const char *cell,
                        const char *kind, const char *const *names, const void *stats,
                        size_t stride, size_t n)
{
    for (size_t i = 0; i < nf; i++) {
        dsec_metrics_family(t, f[i].name, f[i].type, f[i].help);
        for (size_t j = 0; j < n; j++) {
            const char *l[] = {"cell", cell, kind, names[j]};
            const void *st = (const char *)stats + j * stride;
            dsec_metrics_sample(t, f[i].name, l, kind ? 2 : 1, (double)U64_AT(st, f[i].off) * f[i].scale);
        }
    }
}

static const struct field bus_fields[] = {
    {"dsec_bus_async_errors_total", "counter", "Errors the NATS client reported asynchronously.",
     offsetof(dsec_bus_stats, async_errors), 1},
    {"dsec_bus_slow_consumers_total", "counter",
     "Async errors that were a subscription's client-side queue overflowing (messages lost).",
     offsetof(dsec_bus_stats, slow_consumers), 1},
    {"dsec_bus_disconnects_total", "counter", "Times the bus connection was lost.",
     offsetof(dsec_bus_stats, disconnects), 1},
    {"dsec_bus_reconnects_total", "counter", "Times the bus connection was re-established.",
     offsetof(dsec_bus_stats, reconnects), 1},
    {"dsec_bus_mailbox_drops_total", "counter", "Messages dropped by full actor mailboxes, all actors.",
     offsetof(dsec_bus_stats, mailbox_drops), 1},
    {"dsec_bus_requests_pending", "gauge", "Requests waiting for their answer now.",
     offsetof(dsec_bus_stats, requests_pending), 1},
};

static const struct field actor_fields[] = {
    {"dsec_actor_messages_in_total", "counter", "Messages handed to the actor's handlers.",
     offsetof(dsec_actor_stats, msgs_in), 1},
    {"dsec_actor_messages_out_total", "counter", "Messages the actor published or replied.",
     offsetof(dsec_actor_stats, msgs_out), 1},
    {"dsec_actor_errors_total", "counter", "Errors the actor's handlers reported.",
     offsetof(dsec_actor_stats, errors), 1},
    {"dsec_actor_dropped_total", "counter", "Messages dropped because the actor's mailbox was full.",
     offsetof(dsec_actor_stats, dropped), 1},
    {"dsec_actor_mailbox_depth", "gauge", "Messages waiting in the actor's mailbox now.",
     offsetof(dsec_actor_stats, mailbox_depth), 1},
    {"dsec_actor_mailbox_peak", "gauge", "The deepest the actor's mailbox has been.",
     offsetof(dsec_actor_stats, mailbox_peak), 1},
    {"dsec_actor_handler_seconds_total", "counter", "Time spent in the actor's handlers.",
     offsetof(dsec_actor_stats, handler_ns), 1e-9},
    {"dsec_actor_shed_total", "counter",
     "Messages answered at once for their wait in the mailbox (a scheduler's scheduler.shed_after_ms).",
     offsetof(dsec_actor_stats, shed), 1},
};

static const struct field sched_fields[] = {
    {"dsec_scheduler_creates_total", "counter", "Create requests the replica handled.",
     offsetof(dsec_sched_stats, creates), 1},
    {"dsec_scheduler_placed_total", "counter", "Place messages sent to nodes (first tries and retries).",
     offsetof(dsec_sched_stats, placed), 1},
    {"dsec_scheduler_retried_total", "counter", "Placements retried on another node after a refusal.",
     offsetof(dsec_sched_stats, retried), 1},
    {"dsec_scheduler_forwarded_total", "counter", "Creates forwarded to another cell.",
     offsetof(dsec_sched_stats, forwarded), 1},
    {"dsec_scheduler_failed_total", "counter", "Creates the replica answered with an error.",
     offsetof(dsec_sched_stats, failed), 1},
    {"dsec_scheduler_over_quota_total", "counter", "Creates the quota actor refused.",
     offsetof(dsec_sched_stats, over_quota), 1},
    {"dsec_scheduler_waited_total", "counter", "Rollout creates that waited for room.",
     offsetof(dsec_sched_stats, waited), 1},
    {"dsec_scheduler_nodes_expired_total", "counter",
     "Nodes drained: taken out of placement for silence.", offsetof(dsec_sched_stats, expired), 1},
    {"dsec_scheduler_drains_deferred_total", "counter",
     "Drains put off by scheduler.drain_gap_ms (once per node per pass).",
     offsetof(dsec_sched_stats, drains_deferred), 1},
    {"dsec_scheduler_nodes_readmitted_total", "counter", "Drained nodes back in placement.",
     offsetof(dsec_sched_stats, readmitted), 1},
    {"dsec_scheduler_nodes_suspect", "gauge",
     "Nodes late to report: in placement, used only when no other node has room.",
     offsetof(dsec_sched_stats, suspect), 1},
    {"dsec_scheduler_superseded_total", "counter",
     "Retried creates placed (or found by their lookup) and told to the cell's nodes, which drop copies of earlier attempts.",
     offsetof(dsec_sched_stats, superseded), 1},
    {"dsec_scheduler_superseded_resent_total", "counter",
     "Such notices sent again to nodes back from a silence.",
     offsetof(dsec_sched_stats, superseded_resent), 1},
    {"dsec_scheduler_waiting", "gauge", "Rollout creates waiting for room now.",
     offsetof(dsec_sched_stats, waiting), 1},
    {"dsec_scheduler_admitted_total", "counter",
     "Creates let in by the replica's admission bound (scheduler.admit_max).",
     offsetof(dsec_sched_stats, admitted), 1},
    {"dsec_scheduler_shed_total", "counter",
     "Creates answered \"overloaded\" (bound reached, park_max parked, deadline near).",
     offsetof(dsec_sched_stats, shed), 1},
    {"dsec_scheduler_parked", "gauge",
     "Rollout creates parked for room now (as dsec_scheduler_waiting).",
     offsetof(dsec_sched_stats, waiting), 1},
    {"dsec_scheduler_held", "gauge",
     "Work the replica holds now: creates being admitted, unconfirmed placements, parked rollouts.",
     offsetof(dsec_sched_stats, held), 1},
    {"dsec_scheduler_nodes", "gauge", "Nodes in the replica's capacity view.",
     offsetof(dsec_sched_stats, nodes), 1},
};

static const struct field node_fields[] = {
    {"dsec_node_sandboxes_created_total", "counter",
     "Sandboxes the node manager created (forks included).", offsetof(dsec_node_stats, created), 1},
    {"dsec_node_sandboxes_destroyed_total", "counter", "Sandboxes the node manager destroyed.",
     offsetof(dsec_node_stats, destroyed), 1},
    {"dsec_node_placements_refused_total", "counter", "Placements refused by the node's admission.",
     offsetof(dsec_node_stats, refused), 1},
    {"dsec_node_adopted_total", "counter", "Sandboxes re-adopted from the journal at start.",
     offsetof(dsec_node_stats, adopted), 1},
    {"dsec_node_adopt_failed_total", "counter",
     "Journal sandboxes that could not be re-adopted at start.",
     offsetof(dsec_node_stats, adopt_failed), 1},
    {"dsec_node_cpu_free_cores", "gauge", "CPU the node can still admit, in cores.",
     offsetof(dsec_node_stats, cpu_free_milli), 1e-3},
    {"dsec_node_memory_free_bytes", "gauge", "Memory the node can still admit.",
     offsetof(dsec_node_stats, mem_free_mb), 1048576.0},
    {"dsec_node_slots_free", "gauge", "Sandbox slots the node can still admit.",
     offsetof(dsec_node_stats, slots_free), 1},
    {"dsec_node_disk_free_bytes", "gauge",
     "Disk for writable layers the node can still admit (its reserve left out).",
     offsetof(dsec_node_stats, disk_free_mb), 1048576.0},
    {"dsec_node_results_kept", "gauge",
     "Answers of finished commands kept for retries by req_id, and commands whose outcome a "
     "restart lost.",
     offsetof(dsec_node_stats, results_kept), 1},
    {"dsec_node_results_bytes", "gauge", "Bytes the kept answers hold (results_budget_mb bounds it).",
     offsetof(dsec_node_stats, results_bytes), 1},
    {"dsec_node_results_lost", "gauge",
     "Kept entries that are commands running when the node manager went away (outcome lost).",
     offsetof(dsec_node_stats, results_lost), 1},
    {"dsec_node_results_hits_total", "counter", "Retries by req_id answered from the kept answers.",
     offsetof(dsec_node_stats, results_hits), 1},
    {"dsec_node_results_persist_errors_total", "counter",
     "Command starts or answers that could not be written to the node's answer log.",
     offsetof(dsec_node_stats, results_persist_errors), 1},
    {"dsec_node_superseded_destroyed_total", "counter",
     "Sandboxes destroyed because a retry of their create was kept on another node (their answer "
     "was lost).",
     offsetof(dsec_node_stats, reaped_superseded), 1},
    {"dsec_node_stale_placements_total", "counter",
     "Placements not created: a later attempt of the same create was already placed elsewhere.",
     offsetof(dsec_node_stats, stale_places), 1},
    {"dsec_node_shed_places_total", "counter",
     "Placements answered \"overloaded\" for their wait in the node's mailbox (scheduler.shed_after_ms): not created.",
     offsetof(dsec_node_stats, shed_places), 1},
    {"dsec_node_network_alerts_total", "counter",
     "Network alerts published (blocked connections, refused DNS names).",
     offsetof(dsec_node_stats, net_alerts), 1},
    {"dsec_node_network_blocked_total", "counter",
     "Packets of sandboxes the policy blocked (as logged, after the kernel's rate limits).",
     offsetof(dsec_node_stats, net_blocked), 1},
    {"dsec_node_dns_queries_total", "counter", "DNS queries sandboxes sent the node's resolver.",
     offsetof(dsec_node_stats, dns_queries), 1},
    {"dsec_node_dns_refused_total", "counter",
     "DNS queries the resolver refused (names the policy does not allow, other types).",
     offsetof(dsec_node_stats, dns_refused), 1},
    {"dsec_node_dns_cache_hits_total", "counter",
     "Allowed DNS queries answered from the resolver's cache.",
     offsetof(dsec_node_stats, dns_cache_hits), 1},
    {"dsec_node_dns_cache_misses_total", "counter",
     "Allowed DNS queries the cache could not answer.", offsetof(dsec_node_stats, dns_cache_misses),
     1},
    {"dsec_node_dns_cache_evictions_total", "counter",
     "Cached DNS answers pushed out by newer ones.", offsetof(dsec_node_stats, dns_cache_evictions),
     1},
    {"dsec_node_dns_upstream_tcp_total", "counter",
     "Truncated upstream DNS answers asked again over TCP.",
     offsetof(dsec_node_stats, dns_upstream_tcp), 1},
};

static const struct field arbiter_fields[] = {
    {"dsec_arbiter_takeovers_total", "counter", "Times this arbiter acquired the cell's lease.",
     offsetof(dsec_arbiter_stats, takeovers), 1},
    {"dsec_arbiter_reclaims_requested_total", "counter", "Reclaim requests sent to preemptible jobs.",
     offsetof(dsec_arbiter_stats, requests), 1},
    {"dsec_arbiter_reclaims_acked_total", "counter", "Reclaim requests the job accepted.",
     offsetof(dsec_arbiter_stats, acked), 1},
    {"dsec_arbiter_reclaims_honoured_total", "counter", "Reclaims released by the job before the deadline.",
     offsetof(dsec_arbiter_stats, honoured), 1},
    {"dsec_arbiter_reclaims_forced_total", "counter", "Reclaims released by force after the deadline.",
     offsetof(dsec_arbiter_stats, forced), 1},
    {"dsec_arbiter_reclaims_adopted_total", "counter", "Pending reclaims taken over from a previous arbiter.",
     offsetof(dsec_arbiter_stats, adopted), 1},
    {"dsec_arbiter_reclaims_capped_total", "counter", "Victims not asked because of the eviction-rate cap.",
     offsetof(dsec_arbiter_stats, capped), 1},
    {"dsec_arbiter_reclaims_pending", "gauge", "Reclaims outstanding now.",
     offsetof(dsec_arbiter_stats, pending), 1},
};

static const struct field quota_fields[] = {
    {"dsec_quota_admitted_total", "counter", "Creates admitted against their tenant's and projects' quotas.",
     offsetof(dsec_quota_stats, admitted), 1},
    {"dsec_quota_refused_total", "counter", "Creates refused for want of quota.",
     offsetof(dsec_quota_stats, refused), 1},
    {"dsec_quota_released_total", "counter", "Admissions given back because the create failed.",
     offsetof(dsec_quota_stats, released), 1},
    {"dsec_quota_expired_total", "counter", "Admissions given back because no sandbox appeared in time.",
     offsetof(dsec_quota_stats, expired), 1},
    {"dsec_quota_pending", "gauge", "Admissions in flight now (not yet seen as sandboxes).",
     offsetof(dsec_quota_stats, pending), 1},
    {"dsec_quota_definitions", "gauge", "Tenants and projects with a quota defined.",
     offsetof(dsec_quota_stats, definitions), 1},
    {"dsec_quota_nodes", "gauge", "Nodes whose usage the quota actor counts.",
     offsetof(dsec_quota_stats, nodes), 1},
    {"dsec_quota_active", "gauge", "1 while this quota actor holds the cell's lease and admits; 0 on a standby.",
     offsetof(dsec_quota_stats, active), 1},
    {"dsec_quota_takeovers_total", "counter", "Times this quota actor took the lease.",
     offsetof(dsec_quota_stats, takeovers), 1},
};

#define NFIELDS(a) (sizeof(a) / sizeof((a)[0]))
#define MAX_TYPES 32

/* What one scrape copies from the nodes. */
struct node_snap {
    dsec_node_stats st;
    uint64_t states[DSEC_NODE_NSTATES];
    const char *types[MAX_TYPES];
    uint64_t type_live[MAX_TYPES];
    size_t ntypes;
    dsec_metrics_hist_snap lat;
};

static void render_nodes(dsec_metrics_text *t, dsec_cell *c)
{
    const char *cell = c->conf.cell;
    size_t n = c->nnodes;
    struct node_snap *ns = dsec_calloc(n ? n : 1, sizeof *ns);
    const char **names = dsec_calloc(n ? n : 1, sizeof *names);
    dsec_node_stats *st = dsec_calloc(n ? n : 1, sizeof *st);
    if (ns == NULL || names == NULL || st == NULL) {
        t->failed = 1;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        names[i] = dsec_node_name(c->nodes[i]);
        dsec_node_stats_get(c->nodes[i], &st[i]);
        dsec_node_states_get(c->nodes[i], ns[i].states);
        ns[i].ntypes = dsec_node_types_get(c->nodes[i], ns[i].types, ns[i].type_live, MAX_TYPES);
        dsec_node_create_latency(c->nodes[i], &ns[i].lat);
    }
    emit_fields(t, node_fields, NFIELDS(node_fields), cell, "node", names, st, sizeof *st, n);
    dsec_metrics_family(t, "dsec_node_sandboxes", "gauge", "Sandboxes present on the node, by lifecycle state.");
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < DSEC_NODE_NSTATES; k++) {
            const char *l[] = {"cell", cell, "node", names[i], "state", dsec_node_state_names[k]};
            dsec_metrics_sample(t, "dsec_node_sandboxes", l, 3, (double)ns[i].states[k]);
        }
    dsec_metrics_family(t, "dsec_node_sandboxes_by_type", "gauge", "Sandboxes present on the node, by type.");
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < ns[i].ntypes; k++) {
            const char *l[] = {"cell", cell, "node", names[i], "type", ns[i].types[k]};
            dsec_metrics_sample(t, "dsec_node_sandboxes_by_type", l, 3, (double)ns[i].type_live[k]);
        }
    dsec_metrics_family(t, "dsec_node_reaped_total", "counter",
                        "Sandboxes destroyed by the node for their lifetime (ttl) or idleness (idle).");
    for (size_t i = 0; i < n; i++) {
        const char *lt[] = {"cell", cell, "node", names[i], "reason", "ttl"};
        const char *li[] = {"cell", cell, "node", names[i], "reason", "idle"};
        dsec_metrics_sample(t, "dsec_node_reaped_total", lt, 3, (double)st[i].reaped_ttl);
        dsec_metrics_sample(t, "dsec_node_reaped_total", li, 3, (double)st[i].reaped_idle);
    }
    dsec_metrics_family(t, "dsec_node_create_seconds", "histogram",
                        "Time from a place message's arrival to the created answer, creates that made a sandbox.");
    for (size_t i = 0; i < n; i++) {
        const char *l[] = {"cell", cell, "node", names[i]};
        dsec_metrics_hist_samples(t, "dsec_node_create_seconds", l, 2, &ns[i].lat);
    }
out:
    dsec_free(ns);
    dsec_free(names);
    dsec_free(st);
}

static void render_scheds(dsec_metrics_text *t, dsec_cell *c)
{
    const char *cell = c->conf.cell;
    size_t n = c->nscheds;
    dsec_sched_stats *st = dsec_calloc(n ? n : 1, sizeof *st);
    dsec_metrics_hist_snap *lat = dsec_calloc(n ? n : 1, sizeof *lat);
    const char **names = dsec_calloc(n ? n : 1, sizeof *names);
    if (st == NULL || lat == NULL || names == NULL) {
        t->failed = 1;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        names[i] = dsec_sched_name(c->scheds[i]);
        dsec_sched_stats_get(c->scheds[i], &st[i]);
        dsec_sched_place_latency(c->scheds[i], &lat[i]);
    }
    emit_fields(t, sched_fields, NFIELDS(sched_fields), cell, "replica", names, st, sizeof *st, n);
    dsec_metrics_family(t, "dsec_scheduler_placement_seconds", "histogram",
                        "Time from a create's arrival at the replica to its place message sent "
                        "(quota admission included), creates placed at their first try.");
    for (size_t i = 0; i < n; i++) {
        const char *l[] = {"cell", cell, "replica", names[i]};
        dsec_metrics_hist_samples(t, "dsec_scheduler_placement_seconds", l, 2, &lat[i]);
    }
out:
    dsec_free(st);
    dsec_free(lat);
    dsec_free(names);
}

static void render_actors(dsec_metrics_text *t, dsec_cell *c)
{
    size_t max = c->nnodes + 2 * c->nscheds + 2, n = 0;
    const dsec_actor **act = dsec_calloc(max, sizeof *act);
    const char **names = dsec_calloc(max, sizeof *names);
    dsec_actor_stats *st = dsec_calloc(max, sizeof *st);
    if (act == NULL || names == NULL || st == NULL) {
        t->failed = 1;
        goto out;
    }
    for (size_t i = 0; i < c->nnodes; i++)
        act[n++] = dsec_node_actor(c->nodes[i]);
    for (size_t i = 0; i < c->nscheds; i++)
        n += dsec_sched_actors(c->scheds[i], act + n, 2);
    if (c->arbiter != NULL)
        act[n++] = dsec_arbiter_actor(c->arbiter);
    if (c->quota != NULL)
        act[n++] = dsec_quota_actor(c->quota);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (act[i] == NULL)
            continue;
        names[k] = dsec_actor_name(act[i]);
        dsec_actor_stats_get(act[i], &st[k++]);
    }
    emit_fields(t, actor_fields, NFIELDS(actor_fields), c->conf.cell, "actor", names, st, sizeof *st, k);
out:
    dsec_free(act);
    dsec_free(names);
    dsec_free(st);
}

static int render_metrics(dsec_metrics_text *t, void *ud)
{
    dsec_cell *c = ud;
    const char *cell = c->conf.cell;
    dsec_bus_stats bs;
    dsec_bus_stats_get(c->bus, &bs);
    const char *none[] = {NULL};
    emit_fields(t, bus_fields, NFIELDS(bus_fields), cell, NULL, none, &bs, 0, 1);
    render_actors(t, c);
    if (c->nscheds > 0)
        render_scheds(t, c);
    if (c->nnodes > 0)
        render_nodes(t, c);
    if (c->arbiter != NULL) {
        dsec_arbiter_stats as;
        dsec_arbiter_stats_get(c->arbiter, &as);
        const char *name = dsec_arbiter_name(c->arbiter);
        const char *l[] = {"cell", cell, "arbiter", name};
        dsec_metrics_family(t, "dsec_arbiter_active", "gauge", "1 while this arbiter holds the cell's lease.");
        dsec_metrics_sample(t, "dsec_arbiter_active", l, 2, as.active ? 1 : 0);
        emit_fields(t, arbiter_fields, NFIELDS(arbiter_fields), cell, "arbiter", &name, &as, 0, 1);
    }
    if (c->quota != NULL) {
        dsec_quota_stats qs;
        dsec_quota_stats_get(c->quota, &qs);
        emit_fields(t, quota_fields, NFIELDS(quota_fields), cell, NULL, none, &qs, 0, 1);
    }
    return 0;
}

/* Whether a JetStream-backed start that failed with e is worth another try
 * (then after a second's pause): a NATS cluster still forming, or busy with
 * another host's stream, times out for a while. No responders means
 * JetStream is off: no point waiting. */
static bool js_retry(const char *cell, const char *what, const dsec_err *e, int attempt)
{
    if (attempt >= 5 || (e->code != DSEC_E_TIMEOUT && e->code != DSEC_E_CONN))
        return false;
    fprintf(stderr, "dsecd %s: %s not ready (%s); retrying\n", cell, what, e->msg);
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    return true;
}

int dsec_cell_start(dsec_cell **out, const dsec_cell_conf *conf, int roles, dsec_err *err)
{
    *out = NULL;
    dsec_cell *c = dsec_calloc(1, sizeof *c);
    if (c == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    c->conf = *conf;
    c->conf.nodes = NULL;
    c->conf.nnodes = 0;
    char dir[1100];
    if (mkdir_p(conf->state_dir, err) < 0)
        goto out_fail;
    if (conf->embedded_nats) {
        snprintf(dir, sizeof dir, "%s/nats", conf->state_dir);
        if (mkdir_p(dir, err) < 0)
            goto out_fail;
        dsec_natsd_opts no = {.state_dir = dir, .port = conf->nats_port, .jetstream = conf->jetstream};
        if (dsec_natsd_start(&c->natsd, &no, err) < 0)
            goto out_fail;
        snprintf(c->conf.url, sizeof c->conf.url, "%s", dsec_natsd_url(c->natsd));
    }
    char cname[128];
    snprintf(cname, sizeof cname, "dsecd-%s", conf->cell);
    /* Sandbox operations never run on the bus's workers (the node hands them to its loop
     * or its work queue), so a cell with real backends needs no more workers than a sim
     * one. */
    int threads = conf->threads;
    dsec_bus_opts bo = {.url = c->conf.url, .name = cname, .threads = threads,
                        .retry_on_failed_connect = !conf->embedded_nats,
                        .low_latency = conf->low_latency,
                        /* a newer sender's message is refused, not misread */
                        .schema_max = DSEC_SCHEMA_VERSION};
    if (dsec_bus_connect(&c->bus, &bo, err) < 0 || dsec_ticker_new(&c->ticker, err) < 0 ||
        dsec_ticker_new(&c->sync_ticker, err) < 0 || dsec_ticker_new(&c->hb_ticker, err) < 0 ||
        dsec_registry_new_builtin(&c->reg, err) < 0)
        goto out_fail;
    if (conf->trace_ring > 0) {
        /* before any actor: the first request's hops are kept too */
        dsec_trace_conf tc = {.sample_rate = conf->trace_sample_rate,
                              .slow_ms = conf->trace_slow_ms, .ring = conf->trace_ring};
        if (dsec_tracer_start(&c->tracer, c->bus, cname, &tc, err) < 0)
            goto out_fail;
    }
    if ((roles & DSEC_ROLE_NODE) && conf->jetstream) {
        dsec_traj_conf tc = {.max_age_s = conf->traj_retention_s, .max_bytes = conf->traj_max_bytes,
                             .replicas = (int)conf->traj_replicas};
        dsec_err terr;
        /* A NATS cluster still forming (or busy creating the stream for another node)
         * times out: try again a few times rather than run without the log. No
         * responders means JetStream is off: no point waiting. */
        int rc;
        for (int attempt = 0; (rc = dsec_traj_open(&c->traj, c->bus, &tc, &terr)) < 0 &&
                              js_retry(conf->cell, "the trajectory log", &terr, attempt);
             attempt++)
            ;
        if (rc < 0)
            fprintf(stderr, "dsecd %s: no trajectory log (operations naming a rollout_id will be "
                    "refused): %s\n", conf->cell, terr.msg);
    }
    if ((roles & DSEC_ROLE_NODE) && open_layers(c, err) < 0)
        goto out_fail;
    if (roles & DSEC_ROLE_NODE) {
        c->nodes = dsec_calloc(conf->nnodes ? conf->nnodes : 1, sizeof *c->nodes);
        if (c->nodes == NULL) {
            dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
            goto out_fail;
        }
        const dsec_cell_net *cnet = &conf->net;
        dsec_net_conf netc = {.pool6 = cnet->ipv6 ? NULL : "",
                              .upstream = (const char *const *)cnet->upstream,
                              .nupstream = cnet->nupstream,
                              .mirrors = cnet->mirrors,
                              .nmirrors = cnet->nmirrors,
                              .deny = (const char *const *)cnet->deny,
                              .ndeny = cnet->ndeny,
                              .masquerade = cnet->masquerade,
                              .dns_port = (uint16_t)cnet->dns_port,
                              .dns_qps = cnet->dns_qps,
                              .dns_cache = cnet->dns_cache,
                              .conn_rate = cnet->conn_rate,
                              .alert_window_ms = cnet->alert_window_ms,
                              .warm = cnet->warm};
        /* Real backends' operations (crun, mkfs, copies) need threads; sim ones are
         * instant. Commands need none. */
        int work_threads = 4;
        for (size_t i = 0; i < conf->nnodes; i++)
            if (strcmp(conf->nodes[i].backend, "native") == 0)
                work_threads = DSEC_CELL_WORK_THREADS;
        if (conf->nnodes > 0 && (dsec_loop_new(&c->loop, "dsec-loop", err) < 0 ||
                                 dsec_workq_new(&c->work, "dsec-work", work_threads, err) < 0))
            goto out_fail;
        for (size_t i = 0; i < conf->nnodes; i++) {
            const dsec_cell_node *cn = &conf->nodes[i];
            if (cnet->enabled && strcmp(cn->backend, "native") == 0 && cnet->tag_base + i > 255) {
                dsec_err_set(err, DSEC_E_CONFIG, 0,
                             "net: node %zu would get tag %zu; tags stop at 255 (lower net.tag_base)",
                             i, cnet->tag_base + i);
                goto out_fail;
            }
            snprintf(dir, sizeof dir, "%s/node-%s", conf->state_dir, cn->name);
            dsec_node_conf nc = {.name = cn->name, .cell = conf->cell, .state_dir = dir,
                                 .cpu_milli = cn->cpu_milli, .memory_mb = cn->memory_mb,
                                 .slots = cn->slots, .disk_mb = cn->disk_mb,
                                 .disk_reserve_mb = cn->disk_reserve_mb,
                                 .types = (const char *const *)cn->types,
                                 .labels = cn->labels, .nlabels = cn->nlabels,
                                 .backend = cn->backend, .backend_opts = cn->opts,
                                 .nbackend_opts = cn->nopts, .capacity_ms = conf->capacity_ms,
                                 .shed_after_ms = conf->shed_after_ms,
                                 .full_ms = conf->full_ms, .heartbeat_ms = conf->heartbeat_ms,
                                 .quota = conf->quota,
                                 .reap_ms = conf->reap_ms, .sync_ms = conf->journal_sync_ms,
                                 .sync_ticker = c->sync_ticker, .hb_ticker = c->hb_ticker,
                                 .default_cpu_milli = conf->default_cpu_milli,
                                 .default_memory_mb = conf->default_memory_mb,
                                 .default_disk_mb = conf->default_disk_mb,
                                 .default_function_disk_mb = conf->default_function_disk_mb,
                                 .default_ttl_s = conf->default_ttl_s,
                                 .default_idle_s = conf->default_idle_s, .max_ttl_s = conf->max_ttl_s,
                                 .traj = c->traj, .pause_idle_ms = conf->pause_idle_ms,
                                 .pressure_free_pct = conf->pressure_free_pct,
                                 .layers = c->layers,
                                 .net = cnet->enabled && strcmp(cn->backend, "native") == 0 ? &netc : NULL,
                                 .net_tag = cnet->tag_base + (unsigned)i,
                                 .loop = c->loop, .work = c->work,
                                 .results_budget = cn->results_budget_mb << 20,
                                 .results_ttl_ms = cn->results_ttl_s * 1000,
                                 .results_volatile = cn->results_volatile};
            if (dsec_node_start(&c->nodes[c->nnodes], c->bus, c->ticker, c->reg, &nc, err) < 0)
                goto out_fail;
            c->nnodes++;
        }
    }
    /* the quota actor before the schedulers: their first creates ask it */
    if ((roles & DSEC_ROLE_QUOTA) && conf->quota) {
        uint32_t pend = conf->quota_pending_ms;
        if (pend == 0)
            pend = conf->wait_ms + 30000u > 60000u ? conf->wait_ms + 30000u : 60000u;
        dsec_quota_conf qc = {.cell = conf->cell, .replicas = (int)conf->quota_replicas,
                              .full_ms = conf->full_ms, .pending_ms = pend,
                              .reload_ms = conf->quota_reload_ms, .lease_ms = conf->quota_lease_ms};
        int rc;
        for (int attempt = 0; (rc = dsec_quota_start(&c->quota, c->bus, &qc, err)) < 0 &&
                              js_retry(conf->cell, "the quota actor", err, attempt);
             attempt++)
            ;
        if (rc < 0)
            goto out_fail;
    }
    if ((roles & DSEC_ROLE_SCHEDULER) && conf->sched_replicas > 0) {
        c->scheds = dsec_calloc(conf->sched_replicas, sizeof *c->scheds);
        if (c->scheds == NULL) {
            dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
            goto out_fail;
        }
        for (unsigned i = 0; i < conf->sched_replicas; i++) {
            dsec_sched_conf sc = {.cell = conf->cell, .k = conf->k,
                                  .max_attempts = conf->max_attempts, .max_hops = conf->max_hops,
                                  .dead_after_ms = conf->dead_after_ms,
                                  .heartbeat_ms = conf->heartbeat_ms,
                                  .suspect_after_ms = conf->suspect_after_ms,
                                  .drain_gap_ms = conf->drain_gap_ms,
                                  .probation_ms = conf->probation_ms,
                                  .lost_after_ms = conf->lost_after_ms,
                                  .summary_ms = conf->summary_ms,
                                  .default_cpu_milli = conf->default_cpu_milli,
                                  .default_memory_mb = conf->default_memory_mb,
                                  .default_disk_mb = conf->default_disk_mb,
                                  .default_function_disk_mb = conf->default_function_disk_mb,
                                  .wait_ms = conf->wait_ms, .quota = conf->quota,
                                  .admit_max = conf->admit_max, .park_max = conf->park_max,
                                  .shed_after_ms = conf->shed_after_ms};
            if (dsec_sched_start(&c->scheds[c->nscheds], c->bus, c->ticker, c->reg, &sc, err) < 0)
                goto out_fail;
            c->nscheds++;
        }
    }
    if (roles & DSEC_ROLE_ARBITER) {
        dsec_arbiter_conf ac = {.cell = conf->cell, .lease_ms = conf->arbiter_lease_ms,
                                .grace_ms = conf->arbiter_grace_ms,
                                .max_per_min = conf->arbiter_max_per_min,
                                .replicas = (int)conf->arbiter_replicas};
        int rc;
        for (int attempt = 0; (rc = dsec_arbiter_start(&c->arbiter, c->bus, &ac, err)) < 0 &&
                              js_retry(conf->cell, "the arbiter", err, attempt);
             attempt++)
            ;
        if (rc < 0)
            goto out_fail;
    }
    if (dsec_bus_flush(c->bus, 5000, err) < 0)
        goto out_fail;
    /* Hosting both roles: be ready to place before returning, so the first
     * create does not race the nodes' first reports. */
    for (int waited = 0; c->nscheds > 0 && c->nnodes > 0; waited += 5) {
        bool ready = true;
        for (size_t i = 0; i < c->nscheds && ready; i++) {
            dsec_sched_stats st;
            dsec_sched_stats_get(c->scheds[i], &st);
            ready = st.nodes >= c->nnodes;
        }
        if (ready)
            break;
        if (waited >= 10000) {
            dsec_err_set(err, DSEC_E_TIMEOUT, 0, "cell %s: schedulers did not see the nodes' reports in 10 s",
                         conf->cell);
            goto out_fail;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (conf->metrics_listen[0] != '\0') {
        dsec_metrics_opts mo = {.listen = conf->metrics_listen, .render = render_metrics, .ud = c};
        if (dsec_metrics_start(&c->metrics, &mo, err) < 0) {
            dsec_err_wrap(err, "cell %s", conf->cell);
            goto out_fail;
        }
    }
    *out = c;
    return 0;
out_fail:
    dsec_cell_stop(c, false);
    return -1;
}

void dsec_cell_stop(dsec_cell *c, bool destroy)
{
    if (c == NULL)
        return;
    dsec_metrics_stop(c->metrics); /* first: it reads the actors below */
    dsec_arbiter_stop(c->arbiter, true);
    for (size_t i = 0; i < c->nscheds; i++)
        dsec_sched_stop(c->scheds[i]);
    dsec_quota_stop(c->quota);
    /* commands in flight end (their requesters hear so) and queued operations run out
     * before the node managers go: each waits for its deferred requests */
    if (c->loop != NULL)
        dsec_loop_stop(c->loop);
    if (c->work != NULL)
        dsec_workq_stop(c->work);
    for (size_t i = 0; i < c->nnodes; i++)
        dsec_node_stop(c->nodes[i], destroy);
    if (c->bus != NULL) {
        dsec_err err;
        dsec_bus_flush(c->bus, 1000, &err);
    }
    dsec_tracer_stop(c->tracer);
    dsec_ticker_free(c->ticker);
    dsec_ticker_free(c->sync_ticker);
    dsec_ticker_free(c->hb_ticker);
    dsec_workq_free(c->work);
    dsec_loop_free(c->loop);
    dsec_traj_close(c->traj);
    dsec_layer_registry_free(c->layers); /* after the nodes: their backends borrow it */
    dsec_bus_free(c->bus);
    dsec_registry_free(c->reg);
    dsec_natsd_stop(c->natsd);
    dsec_free(c->scheds);
    dsec_free(c->nodes);
    dsec_free(c);
}

const char *dsec_cell_url(const dsec_cell *c) { return c->conf.url; }
uint16_t dsec_cell_metrics_port(const dsec_cell *c) { return dsec_metrics_port(c->metrics); }
dsec_bus *dsec_cell_bus(dsec_cell *c) { return c->bus; }
dsec_arbiter *dsec_cell_arbiter(dsec_cell *c) { return c->arbiter; }
dsec_quota *dsec_cell_quota(dsec_cell *c) { return c->quota; }
size_t dsec_cell_node_count(const dsec_cell *c) { return c->nnodes; }
dsec_node *dsec_cell_node_at(dsec_cell *c, size_t i) { return i < c->nnodes ? c->nodes[i] : NULL; }
size_t dsec_cell_sched_count(const dsec_cell *c) { return c->nscheds; }
dsec_sched *dsec_cell_sched_at(dsec_cell *c, size_t i) { return i < c->nscheds ? c->scheds[i] : NULL; }
