/* node.c - the node manager: start and stop, backends and network, stats, error answers. */
#define _GNU_SOURCE /* nftw */
#include "actors/node-int.h"

#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "actors/wire.h"
#include "backends/sim.h"
#include "codecs/subjects.h"
#include "dsec/alloc.h"
#include "dsec/log.h"
#include "dsec/names.h"

/* ---- sending -------------------------------------------------------------------- */

void dsec__node_reply_err(dsec_node *n, dsec_msg *m, int code, const char *fmt, ...)
{
    dsec_err e = {.code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    dsec_wire_error(n->actor, m, &e);
}

/* An invalid request field: the error names it (docs/protocol.md, Errors). */
void dsec__node_reply_bad(dsec_node *n, dsec_msg *m, const char *field, const char *fmt, ...)
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
void dsec__node_reply_backend(dsec_node *n, dsec_msg *m, const dsec_err *e, const char *bad_field)
{
    dsec_wire_error_field(n->actor, m, e, e->code == DSEC_E_INVALID ? bad_field : NULL);
}

/* ---- start and stop ---------------------------------------------------------- */

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
    if (k->results_budget == 0)
        k->results_budget = RESULTS_BUDGET;
    if (k->results_ttl_ms == 0)
        k->results_ttl_ms = RESULTS_TTL_MS;
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
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "node %s: backend \"%s\" is unknown (known: sim, native)", n->name,
                            c->backend);
    size_t nt = 0;
    while (n->type_names[nt])
        nt++;
    if (dsec_registry_mask(n->reg, (const char *const *)n->type_names, nt, false, &n->offered,
                           err) < 0)
        return dsec_err_wrap(err, "node %s: types", n->name);
    char dir[4096], cache_dir[4096];
    /* One layer cache per node, whichever backends use layers. */
    snprintf(cache_dir, sizeof cache_dir, "%s/layers", c->state_dir);
    dsec_backend *shared = NULL;
    for (size_t i = 0; i < nt; i++) {
        int idx = dsec_registry_find(n->reg, n->type_names[i]);
        const dsec_backend_ops *ops = sim ? &dsec_sim_ops : dsec_registry_ops(n->reg, idx);
        if (ops == NULL)
            return dsec_err_set(
                err, DSEC_E_CONFIG, 0,
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
    dsec_msg_net_alert m = {.sandbox = a->sandbox,
                            .tenant = a->tenant,
                            .node = n->name,
                            .cell = n->cell,
                            .kind = a->kind,
                            .dest = a->dest,
                            .detail = a->detail,
                            .count = a->count,
                            .first_ns = a->first_ns,
                            .last_ns = a->last_ns};
    dsec_err err;
    pthread_mutex_lock(&n->alert_mu);
    if (n->alert_on && dsec_wire_send(n->actor, n->bus, n->subj_alert, NULL, DSEC_MSG_NET_ALERT, &m,
                                      NULL, &err) < 0)
        dsec_log_warn("dsec-node %s: publishing a network alert: %s", n->name, err.msg);
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

/* The answers kept for sbx stay while it is here, adopted or kept for a later start. */
static bool results_keep(const char *sbx, void *ud)
{
    dsec_node *n = ud;
    pthread_mutex_lock(&n->mu);
    bool here = dsec__node_find_id(n, sbx) != NULL;
    pthread_mutex_unlock(&n->mu);
    for (const struct kept *k = n->kept; k != NULL && !here; k = k->next)
        here = strcmp(k->id, sbx) == 0;
    return here;
}

/* The node's directories under state_dir: its disk accounting, and an empty snapshots
 * directory. */
static int open_dirs(dsec_node *n, const dsec_node_conf *c, dsec_err *err)
{
    if (mkdir(c->state_dir, 0700) < 0 && errno != EEXIST) {
        dsec_err_set(err, DSEC_E_IO, errno, "node %s: creating state dir %s", n->name,
                     c->state_dir);
        return -1;
    }
    if (disk_open(n, err) < 0)
        return -1;
    snprintf(n->snap_dir, sizeof n->snap_dir, "%s/snapshots", c->state_dir);
    /* it holds only snapshots being made: what is there now, a crash left (or a node
     * manager that kept them all) */
    if (nftw(n->snap_dir, dsec__node_rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0 &&
        errno != ENOENT) {
        dsec_err_set(err, DSEC_E_IO, errno, "node %s: clearing %s", n->name, n->snap_dir);
        return -1;
    }
    if (mkdir(n->snap_dir, 0700) < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "node %s: creating %s", n->name, n->snap_dir);
        return -1;
    }
    return 0;
}

/* The sandboxes a previous node manager left, re-adopted from the journal, and what goes
 * with them. */
static int adopt_all(dsec_node *n, const dsec_node_conf *c, dsec_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/sandboxes.journal", c->state_dir);
    if (dsec_journal_open(&n->journal, path, dsec__node_adopt_one, n, err) < 0) {
        dsec_err_wrap(err, "node %s", n->name);
        return -1;
    }
    while (n->dropped != NULL) {
        struct sbx *d = n->dropped;
        n->dropped = d->next_id;
        dsec_err derr;
        if (dsec__node_gone_put(n, d->id, &derr) < 0)
            dsec_log_warn("dsec-node %s: %s", n->name, derr.msg);
        dsec__node_sbx_free(d);
    }
    /* After adoption: the answers a previous node manager kept for the sandboxes still here,
     * and the commands it left running, whose outcome is lost. */
    if (dsec_results_load(n->results, results_keep, n, err) < 0) {
        dsec_err_wrap(err, "node %s", n->name);
        return -1;
    }
    if (n->net != NULL) { /* after adoption: whatever no sandbox holds is a crash's leftover */
        dsec_err serr;
        int swept = dsec_net_sweep(n->net, &serr);
        if (swept < 0)
            dsec_log_warn("dsec-node %s: sweeping network leftovers: %s", n->name, serr.msg);
        else if (swept > 0)
            dsec_log_info("dsec-node %s: removed %d leftover sandbox network(s)", n->name, swept);
    }
    return 0;
}

/* The subjects this node answers on. */
static int subscribe_all(dsec_node *n, dsec_err *err)
{
    dsec_actor_set_key(n->actor, dsec__node_key_of, n);
    char subj[256];
    snprintf(subj, sizeof subj, DSEC_SUBJ_PLACE, n->name);
    dsec_actor_set_shed(n->actor, n->conf.shed_after_ms);
    if (dsec_actor_on_shed(n->actor, subj, NULL, dsec__node_on_place, dsec__node_on_place_shed, n,
                           err) < 0)
        return -1;
    snprintf(subj, sizeof subj, DSEC_SUBJ_SBX_OF_NODE, "*", n->name);
    if (dsec_actor_on(n->actor, subj, NULL, dsec__node_on_sbx, n, err) < 0)
        return -1;
    char lists[32];
    snprintf(lists, sizeof lists, DSEC_SUBJ_LIST, "*");
    if (dsec_actor_on(n->actor, lists, NULL, dsec__node_on_list, n, err) < 0)
        return -1;
    snprintf(subj, sizeof subj, DSEC_SUBJ_SYNC_CELL, n->cell);
    if (dsec_actor_on(n->actor, subj, NULL, dsec__node_on_sync, n, err) < 0 ||
        dsec_actor_on(n->actor, DSEC_SUBJ_SYNC, NULL, dsec__node_on_sync, n, err) < 0)
        return -1;
    snprintf(subj, sizeof subj, DSEC_SUBJ_LOOKUP, n->cell);
    if (dsec_actor_on(n->actor, subj, NULL, dsec__node_on_lookup, n, err) < 0)
        return -1;
    snprintf(subj, sizeof subj, DSEC_SUBJ_HOLD, n->name);
    if (dsec_actor_on(n->actor, subj, NULL, dsec__node_on_hold, n, err) < 0)
        return -1;
    snprintf(subj, sizeof subj, DSEC_SUBJ_RECONCILE, n->name);
    if (dsec_actor_on(n->actor, subj, NULL, dsec__node_on_reconcile, n, err) < 0)
        return -1;
    snprintf(subj, sizeof subj, DSEC_SUBJ_SUPERSEDED, n->cell);
    if (dsec_actor_on(n->actor, subj, NULL, dsec__node_on_superseded, n, err) < 0)
        return -1;
    snprintf(subj, sizeof subj, DSEC_SUBJ_SUPERSEDED_NODE, n->cell, n->name);
    if (dsec_actor_on(n->actor, subj, NULL, dsec__node_on_superseded, n, err) < 0)
        return -1;
    return 0;
}

int dsec_node_start(dsec_node **out, dsec_bus *bus, dsec_ticker *ticker, const dsec_registry *reg,
                    const dsec_node_conf *c, dsec_err *err)
{
    *out = NULL;
    if (dsec_name_ok(c->name, DSEC_NAME_LEN_MAX) < 0 ||
        dsec_name_ok(c->cell, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(
            err, DSEC_E_CONFIG, 0,
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
    snprintf(n->subj_evt_node, sizeof n->subj_evt_node, DSEC_SUBJ_EVT_OF, n->cell, "node", n->name);
    snprintf(n->subj_evt_sbx, sizeof n->subj_evt_sbx, DSEC_SUBJ_EVT_OF, n->cell, "sbx", n->name);
    snprintf(n->subj_alert, sizeof n->subj_alert, DSEC_SUBJ_EVT_OF, n->cell, "alert", n->name);
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
    n->gone = dsec_calloc(GONE_BUCKETS, sizeof *n->gone);
    if (n->by_id == NULL || n->by_req == NULL || n->tombs == NULL || n->gone == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        goto out_fail;
    }
    if (open_dirs(n, c, err) < 0)
        goto out_fail;
    int threads = c->work_threads > 0 ? c->work_threads : 16;
    char lname[16], results_dir[4096];
    snprintf(results_dir, sizeof results_dir, "%s/results", c->state_dir);
    snprintf(lname, sizeof lname, "loop-%.10s", n->name);
    n->loop = c->loop;
    n->work = c->work;
    n->own_loop = n->loop == NULL;
    n->own_work = n->work == NULL;
    if ((n->own_loop && dsec_loop_new(&n->loop, lname, err) < 0) ||
        (n->own_work && dsec_workq_new(&n->work, "node-work", threads, err) < 0) ||
        dsec_results_new(&n->results, n->conf.results_budget, n->conf.results_ttl_ms,
                         c->results_volatile ? NULL : results_dir, err) < 0) {
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
    if (adopt_all(n, c, err) < 0)
        goto out_fail;
    if (subscribe_all(n, err) < 0)
        goto out_fail;
    n->hb_ticker = c->hb_ticker ? c->hb_ticker : ticker;
    if ((n->ticks[0] =
             dsec_ticker_add(ticker, n->conf.capacity_ms, dsec__node_tick_capacity, n, err)) < 0 ||
        (n->ticks[1] = dsec_ticker_add(n->hb_ticker, n->conf.heartbeat_ms,
                                       dsec__node_tick_heartbeat, n, err)) < 0 ||
        (n->ticks[2] = dsec_ticker_add(ticker, n->conf.reap_ms, dsec__node_tick_reap, n, err)) < 0)
        goto out_fail;
    n->sync_ticker = c->sync_ticker ? c->sync_ticker : ticker;
    if (c->sync_ms >= 0 &&
        (n->ticks[3] = dsec_ticker_add(n->sync_ticker, c->sync_ms ? (uint32_t)c->sync_ms : 1000,
                                       dsec__node_tick_sync, n, err)) < 0)
        goto out_fail;
    dsec__node_announce(n);
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
    dsec_ticker_remove(n->ticker, n->ticks[0]);
    dsec_ticker_remove(n->hb_ticker, n->ticks[1]);
    dsec_ticker_remove(n->ticker, n->ticks[2]);
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
            dsec__node_sbx_free(s);
            s = next;
        }
    }
    while (n->dropped != NULL) {
        struct sbx *d = n->dropped;
        n->dropped = d->next_id;
        dsec__node_sbx_free(d);
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
    dsec__node_gone_free_all(n);
    dsec_free(n->events);
    pthread_mutex_destroy(&n->alert_mu);
    pthread_mutex_destroy(&n->mu);
    pthread_mutex_destroy(&n->report_mu);
    dsec_free(n);
}

void dsec_node_stats_get(dsec_node *n, dsec_node_stats *o)
{
    pthread_mutex_lock(&n->mu);
    *o = (dsec_node_stats){.live = n->live,
                           .created = n->created,
                           .destroyed = n->destroyed,
                           .refused = n->refused,
                           .adopted = n->adopted,
                           .adopt_failed = n->adopt_failed,
                           .reaped_ttl = n->reaped_ttl,
                           .reaped_idle = n->reaped_idle,
                           .cpu_free_milli = n->cpu_free,
                           .mem_free_mb = n->mem_free,
                           .slots_free = n->slots_free,
                           .disk_free_mb = n->disk_free,
                           .net_alerts = n->net_alerts,
                           .reaped_superseded = n->reaped_superseded,
                           .stale_places = n->stale_places,
                           .shed_places = n->shed_places,
                           .execs_inflight = n->execs_inflight,
                           .execs_peak = n->execs_peak};
    dsec_net *net = n->net;
    pthread_mutex_unlock(&n->mu);
    dsec_results_stats rs;
    dsec_results_stats_get(n->results, &rs);
    o->results_kept = rs.entries;
    o->results_bytes = rs.bytes;
    o->results_lost = rs.lost;
    o->results_hits = rs.hits;
    o->results_persist_errors = rs.persist_errors;
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
        names[k] = dsec__node_type_name(n, i);
        live[k++] = n->live_by_type[i];
    }
    pthread_mutex_unlock(&n->mu);
    return k;
}

void dsec_node_create_latency(dsec_node *n, dsec_metrics_hist_snap *out)
{
    dsec_metrics_hist_read(&n->create_lat, out);
}

const dsec_actor *dsec_node_actor(const dsec_node *n)
{
    return n->actor;
}

const char *dsec_node_name(const dsec_node *n)
{
    return n->name;
}
