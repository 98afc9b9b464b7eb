/* cell.c - a process hosting any set of a cell's actors (its configuration: cell-conf.c). */
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
#include "dsec/log.h"
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
        dsec_js_layers_conf lc = {.bucket = conf->layers_bucket,
                                  .replicas = (int)conf->layers_replicas};
        rc = dsec_layer_registry_jetstream(&c->layers, c->bus, &lc, err);
    } else {
        char dir[1100];
        if (conf->layers_path[0] != '\0')
            snprintf(dir, sizeof dir, "%s", conf->layers_path);
        else
            snprintf(dir, sizeof dir, "%s/layers", conf->state_dir);
        rc = strcmp(conf->layers_kind, "shared") == 0
                 ? dsec_layer_registry_shared(&c->layers, dir, err)
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
            dsec_metrics_sample(t, f[i].name, l, kind ? 2 : 1,
                                (double)U64_AT(st, f[i].off) * f[i].scale);
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
    {"dsec_bus_mailbox_drops_total", "counter",
     "Messages dropped by full actor mailboxes, all actors.",
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
    {"dsec_actor_dropped_total", "counter",
     "Messages dropped because the actor's mailbox was full.", offsetof(dsec_actor_stats, dropped),
     1},
    {"dsec_actor_mailbox_depth", "gauge", "Messages waiting in the actor's mailbox now.",
     offsetof(dsec_actor_stats, mailbox_depth), 1},
    {"dsec_actor_mailbox_peak", "gauge", "The deepest the actor's mailbox has been.",
     offsetof(dsec_actor_stats, mailbox_peak), 1},
    {"dsec_actor_handler_seconds_total", "counter", "Time spent in the actor's handlers.",
     offsetof(dsec_actor_stats, handler_ns), 1e-9},
    {"dsec_actor_shed_total", "counter",
     "Messages answered at once for their wait in the mailbox (a scheduler's "
     "scheduler.shed_after_ms).",
     offsetof(dsec_actor_stats, shed), 1},
};

static const struct field sched_fields[] = {
    {"dsec_scheduler_creates_total", "counter", "Create requests the replica handled.",
     offsetof(dsec_sched_stats, creates), 1},
    {"dsec_scheduler_placed_total", "counter",
     "Place messages sent to nodes (first tries and retries).", offsetof(dsec_sched_stats, placed),
     1},
    {"dsec_scheduler_retried_total", "counter",
     "Placements retried on another node after a refusal.", offsetof(dsec_sched_stats, retried), 1},
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
     "Retried creates placed (or found by their lookup) and told to the cell's nodes, which drop "
     "copies of earlier attempts.",
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
    {"dsec_scheduler_shed_late_total", "counter",
     "Creates answered \"overloaded\" by the limit of admission by delay "
     "(scheduler.admit_delay_ms); also in dsec_scheduler_shed_total.",
     offsetof(dsec_sched_stats, shed_late), 1},
    {"dsec_scheduler_shed_window_total", "counter",
     "Creates answered \"overloaded\" because the replica had its window of placements on their "
     "way (scheduler.window_ms); also in dsec_scheduler_shed_total.",
     offsetof(dsec_sched_stats, shed_window), 1},
    {"dsec_scheduler_admit_limit", "gauge",
     "Creates per second the replica lets in now, from its placements' delay; 0: no limit.",
     offsetof(dsec_sched_stats, admit_limit), 1},
    {"dsec_scheduler_place_delay_seconds", "gauge",
     "The worst delay of the replica's placements to their nodes in its last window (node echoes).",
     offsetof(dsec_sched_stats, place_delay_us), 1e-6},
    {"dsec_scheduler_late_placements_total", "counter",
     "Placements that reached their node later than scheduler.admit_delay_ms.",
     offsetof(dsec_sched_stats, late_placements), 1},
    {"dsec_scheduler_placements_taken_per_second", "gauge",
     "Placements of the replica its nodes take per second, as their echoes count.",
     offsetof(dsec_sched_stats, taken_per_s), 1},
    {"dsec_scheduler_admit_cuts_total", "counter",
     "Times the replica set or lowered its admission limit.",
     offsetof(dsec_sched_stats, admit_cuts), 1},
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
    {"dsec_node_execs_in_flight", "gauge", "Commands running now, waited for on the node's loop.",
     offsetof(dsec_node_stats, execs_inflight), 1},
    {"dsec_node_work_queued", "gauge",
     "Operations waiting for one of the node's work threads now (bus.work_threads).",
     offsetof(dsec_node_stats, work_queued), 1},
    {"dsec_node_disk_free_bytes", "gauge",
     "Disk for writable layers the node can still admit (its reserve left out).",
     offsetof(dsec_node_stats, disk_free_mb), 1048576.0},
    {"dsec_node_results_kept", "gauge",
     "Answers of finished commands kept for retries by req_id, and commands whose outcome a "
     "restart lost.",
     offsetof(dsec_node_stats, results_kept), 1},
    {"dsec_node_results_bytes", "gauge",
     "Bytes the kept answers hold (results_budget_mb bounds it).",
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
     "Placements answered \"overloaded\" for their wait in the node's mailbox "
     "(scheduler.shed_after_ms): not created.",
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
    {"dsec_arbiter_reclaims_requested_total", "counter",
     "Reclaim requests sent to preemptible jobs.", offsetof(dsec_arbiter_stats, requests), 1},
    {"dsec_arbiter_reclaims_acked_total", "counter", "Reclaim requests the job accepted.",
     offsetof(dsec_arbiter_stats, acked), 1},
    {"dsec_arbiter_reclaims_honoured_total", "counter",
     "Reclaims released by the job before the deadline.", offsetof(dsec_arbiter_stats, honoured),
     1},
    {"dsec_arbiter_reclaims_forced_total", "counter",
     "Reclaims released by force after the deadline.", offsetof(dsec_arbiter_stats, forced), 1},
    {"dsec_arbiter_reclaims_adopted_total", "counter",
     "Pending reclaims taken over from a previous arbiter.", offsetof(dsec_arbiter_stats, adopted),
     1},
    {"dsec_arbiter_reclaims_capped_total", "counter",
     "Victims not asked because of the eviction-rate cap.", offsetof(dsec_arbiter_stats, capped),
     1},
    {"dsec_arbiter_reclaims_pending", "gauge", "Reclaims outstanding now.",
     offsetof(dsec_arbiter_stats, pending), 1},
};

static const struct field quota_fields[] = {
    {"dsec_quota_admitted_total", "counter",
     "Creates admitted against their tenant's and projects' quotas.",
     offsetof(dsec_quota_stats, admitted), 1},
    {"dsec_quota_refused_total", "counter", "Creates refused for want of quota.",
     offsetof(dsec_quota_stats, refused), 1},
    {"dsec_quota_released_total", "counter", "Admissions given back because the create failed.",
     offsetof(dsec_quota_stats, released), 1},
    {"dsec_quota_expired_total", "counter",
     "Admissions given back because no sandbox appeared in time.",
     offsetof(dsec_quota_stats, expired), 1},
    {"dsec_quota_pending", "gauge", "Admissions in flight now (not yet seen as sandboxes).",
     offsetof(dsec_quota_stats, pending), 1},
    {"dsec_quota_definitions", "gauge", "Tenants and projects with a quota defined.",
     offsetof(dsec_quota_stats, definitions), 1},
    {"dsec_quota_nodes", "gauge", "Nodes whose usage the quota actor counts.",
     offsetof(dsec_quota_stats, nodes), 1},
    {"dsec_quota_active", "gauge",
     "1 while this quota actor holds the cell's lease and admits; 0 on a standby.",
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
    dsec_metrics_family(t, "dsec_node_sandboxes", "gauge",
                        "Sandboxes present on the node, by lifecycle state.");
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < DSEC_NODE_NSTATES; k++) {
            const char *l[] = {"cell", cell, "node", names[i], "state", dsec_node_state_names[k]};
            dsec_metrics_sample(t, "dsec_node_sandboxes", l, 3, (double)ns[i].states[k]);
        }
    dsec_metrics_family(t, "dsec_node_sandboxes_by_type", "gauge",
                        "Sandboxes present on the node, by type.");
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < ns[i].ntypes; k++) {
            const char *l[] = {"cell", cell, "node", names[i], "type", ns[i].types[k]};
            dsec_metrics_sample(t, "dsec_node_sandboxes_by_type", l, 3, (double)ns[i].type_live[k]);
        }
    dsec_metrics_family(
        t, "dsec_node_reaped_total", "counter",
        "Sandboxes destroyed by the node for their lifetime (ttl) or idleness (idle).");
    for (size_t i = 0; i < n; i++) {
        const char *lt[] = {"cell", cell, "node", names[i], "reason", "ttl"};
        const char *li[] = {"cell", cell, "node", names[i], "reason", "idle"};
        dsec_metrics_sample(t, "dsec_node_reaped_total", lt, 3, (double)st[i].reaped_ttl);
        dsec_metrics_sample(t, "dsec_node_reaped_total", li, 3, (double)st[i].reaped_idle);
    }
    dsec_metrics_family(
        t, "dsec_node_create_seconds", "histogram",
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
    emit_fields(t, actor_fields, NFIELDS(actor_fields), c->conf.cell, "actor", names, st,
                sizeof *st, k);
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
        dsec_metrics_family(t, "dsec_arbiter_active", "gauge",
                            "1 while this arbiter holds the cell's lease.");
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
    dsec_log_info("dsecd %s: %s not ready (%s); retrying", cell, what, e->msg);
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    return true;
}

/* The bus the cell's actors share (on the cell's own NATS server when it runs one), its
 * tickers, the type registry and the tracer. */
static int start_bus(dsec_cell *c, const dsec_cell_conf *conf, int roles, dsec_err *err)
{
    char dir[1100];
    if (conf->embedded_nats) {
        snprintf(dir, sizeof dir, "%s/nats", conf->state_dir);
        if (mkdir_p(dir, err) < 0)
            return -1;
        dsec_natsd_opts no = {
            .state_dir = dir, .port = conf->nats_port, .jetstream = conf->jetstream};
        if (dsec_natsd_start(&c->natsd, &no, err) < 0)
            return -1;
        snprintf(c->conf.url, sizeof c->conf.url, "%s", dsec_natsd_url(c->natsd));
    }
    /* The connection's name, as `nats server report connections` and /connz show it: the
     * cell and the roles this process hosts (dsecd-<cell>-scheduler+node). */
    static const char *const role_names[] = {"scheduler", "node", "arbiter", "quota"};
    char cname[128];
    int cl = snprintf(cname, sizeof cname, "dsecd-%s", conf->cell);
    for (int i = 0, first = 1; i < 4 && cl > 0 && (size_t)cl < sizeof cname; i++)
        if (roles & (1 << i)) {
            cl += snprintf(cname + cl, sizeof cname - (size_t)cl, "%s%s", first ? "-" : "+",
                           role_names[i]);
            first = 0;
        }
    /* Sandbox operations never run on the bus's workers (the node hands them to its loop
     * or its work queue), so a cell with real backends needs no more workers than a sim
     * one. */
    int threads = conf->threads;
    dsec_bus_opts bo = {.url = c->conf.url,
                        .name = cname,
                        .threads = threads,
                        .retry_on_failed_connect = !conf->embedded_nats,
                        .low_latency = conf->low_latency,
                        .shared_delivery = conf->shared_delivery,
                        /* a newer sender's message is refused, not misread */
                        .schema_max = DSEC_SCHEMA_VERSION};
    if (dsec_bus_connect(&c->bus, &bo, err) < 0 || dsec_ticker_new(&c->ticker, err) < 0 ||
        dsec_ticker_new(&c->sync_ticker, err) < 0 || dsec_ticker_new(&c->hb_ticker, err) < 0 ||
        dsec_registry_new_builtin(&c->reg, err) < 0)
        return -1;
    if (conf->trace_ring > 0) {
        /* before any actor: the first request's hops are kept too */
        dsec_trace_conf tc = {.sample_rate = conf->trace_sample_rate,
                              .slow_ms = conf->trace_slow_ms,
                              .ring = conf->trace_ring};
        if (dsec_tracer_start(&c->tracer, c->bus, cname, &tc, err) < 0)
            return -1;
    }
    return 0;
}

/* The trajectory log the nodes record steps in; without it (no JetStream) operations naming a
 * rollout_id are refused. */
static void open_traj(dsec_cell *c, const dsec_cell_conf *conf)
{
    dsec_traj_conf tc = {.max_age_s = conf->traj_retention_s,
                         .max_bytes = conf->traj_max_bytes,
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
        dsec_log_warn("dsecd %s: no trajectory log (operations naming a rollout_id will be "
                      "refused): %s",
                      conf->cell, terr.msg);
}

/* Node i of the cell's configuration, started under its own state directory; netc: the
 * sandbox networks' settings, for a node of real sandboxes when the cell has networks on. */
static int start_node(dsec_cell *c, const dsec_cell_conf *conf, size_t i, const dsec_net_conf *netc,
                      dsec_err *err)
{
    char dir[1100];
    const dsec_cell_net *cnet = &conf->net;
    const dsec_cell_node *cn = &conf->nodes[i];
    if (cnet->enabled && strcmp(cn->backend, "native") == 0 && cnet->tag_base + i > 255) {
        dsec_err_set(err, DSEC_E_CONFIG, 0,
                     "net: node %zu would get tag %zu; tags stop at 255 (lower net.tag_base)", i,
                     cnet->tag_base + i);
        return -1;
    }
    snprintf(dir, sizeof dir, "%s/node-%s", conf->state_dir, cn->name);
    dsec_node_conf nc = {.name = cn->name,
                         .cell = conf->cell,
                         .state_dir = dir,
                         .cpu_milli = cn->cpu_milli,
                         .memory_mb = cn->memory_mb,
                         .slots = cn->slots,
                         .disk_mb = cn->disk_mb,
                         .disk_reserve_mb = cn->disk_reserve_mb,
                         .types = (const char *const *)cn->types,
                         .labels = cn->labels,
                         .nlabels = cn->nlabels,
                         .backend = cn->backend,
                         .backend_opts = cn->opts,
                         .nbackend_opts = cn->nopts,
                         .capacity_ms = conf->capacity_ms,
                         .shed_after_ms = conf->shed_after_ms,
                         .full_ms = conf->full_ms,
                         .heartbeat_ms = conf->heartbeat_ms,
                         .quota = conf->quota,
                         .reap_ms = conf->reap_ms,
                         .sync_ms = conf->journal_sync_ms,
                         .sync_ticker = c->sync_ticker,
                         .hb_ticker = c->hb_ticker,
                         .default_cpu_milli = conf->default_cpu_milli,
                         .default_memory_mb = conf->default_memory_mb,
                         .default_disk_mb = conf->default_disk_mb,
                         .default_function_disk_mb = conf->default_function_disk_mb,
                         .default_ttl_s = conf->default_ttl_s,
                         .default_idle_s = conf->default_idle_s,
                         .max_ttl_s = conf->max_ttl_s,
                         .traj = c->traj,
                         .pause_idle_ms = conf->pause_idle_ms,
                         .pressure_free_pct = conf->pressure_free_pct,
                         .layers = c->layers,
                         .net = cnet->enabled && strcmp(cn->backend, "native") == 0 ? netc : NULL,
                         .net_tag = cnet->tag_base + (unsigned)i,
                         .loop = c->loop,
                         .work = c->work,
                         .results_budget = cn->results_budget_mb << 20,
                         .results_ttl_ms = cn->results_ttl_s * 1000,
                         .results_volatile = cn->results_volatile};
    if (dsec_node_start(&c->nodes[c->nnodes], c->bus, c->ticker, c->reg, &nc, err) < 0)
        return -1;
    c->nnodes++;
    return 0;
}

/* The nodes this process hosts, with the loop and work queue they share. */
static int start_nodes(dsec_cell *c, const dsec_cell_conf *conf, dsec_err *err)
{
    c->nodes = dsec_calloc(conf->nnodes ? conf->nnodes : 1, sizeof *c->nodes);
    if (c->nodes == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        return -1;
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
    if (conf->work_threads > 0)
        work_threads = conf->work_threads;
    if (conf->nnodes > 0 && (dsec_loop_new(&c->loop, "dsec-loop", err) < 0 ||
                             dsec_workq_new(&c->work, "dsec-work", work_threads, err) < 0))
        return -1;
    for (size_t i = 0; i < conf->nnodes; i++)
        if (start_node(c, conf, i, &netc, err) < 0)
            return -1;
    return 0;
}

/* The quota actor (its first replica here when the cell replicates it). */
static int start_quota(dsec_cell *c, const dsec_cell_conf *conf, dsec_err *err)
{
    uint32_t pend = conf->quota_pending_ms;
    if (pend == 0)
        pend = conf->wait_ms + 30000u > 60000u ? conf->wait_ms + 30000u : 60000u;
    dsec_quota_conf qc = {.cell = conf->cell,
                          .replicas = (int)conf->quota_replicas,
                          .full_ms = conf->full_ms,
                          .pending_ms = pend,
                          .reload_ms = conf->quota_reload_ms,
                          .lease_ms = conf->quota_lease_ms};
    int rc;
    for (int attempt = 0; (rc = dsec_quota_start(&c->quota, c->bus, &qc, err)) < 0 &&
                          js_retry(conf->cell, "the quota actor", err, attempt);
         attempt++)
        ;
    return rc < 0 ? -1 : 0;
}

/* The scheduler replicas this process hosts. */
static int start_scheds(dsec_cell *c, const dsec_cell_conf *conf, dsec_err *err)
{
    c->scheds = dsec_calloc(conf->sched_replicas, sizeof *c->scheds);
    if (c->scheds == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        return -1;
    }
    for (unsigned i = 0; i < conf->sched_replicas; i++) {
        dsec_sched_conf sc = {.cell = conf->cell,
                              .k = conf->k,
                              .max_attempts = conf->max_attempts,
                              .max_hops = conf->max_hops,
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
                              .wait_ms = conf->wait_ms,
                              .quota = conf->quota,
                              .admit_max = conf->admit_max,
                              .park_max = conf->park_max,
                              .shed_after_ms = conf->shed_after_ms,
                              .admit_delay_ms = conf->admit_delay_ms,
                              .window_ms = conf->window_ms};
        if (dsec_sched_start(&c->scheds[c->nscheds], c->bus, c->ticker, c->reg, &sc, err) < 0)
            return -1;
        c->nscheds++;
    }
    return 0;
}

/* The cell's arbiter (one replica of it). */
static int start_arbiter(dsec_cell *c, const dsec_cell_conf *conf, dsec_err *err)
{
    dsec_arbiter_conf ac = {.cell = conf->cell,
                            .lease_ms = conf->arbiter_lease_ms,
                            .grace_ms = conf->arbiter_grace_ms,
                            .max_per_min = conf->arbiter_max_per_min,
                            .replicas = (int)conf->arbiter_replicas};
    int rc;
    for (int attempt = 0; (rc = dsec_arbiter_start(&c->arbiter, c->bus, &ac, err)) < 0 &&
                          js_retry(conf->cell, "the arbiter", err, attempt);
         attempt++)
        ;
    return rc < 0 ? -1 : 0;
}

/* Hosting both roles: be ready to place before returning, so the first
 * create does not race the nodes' first reports. */
static int wait_ready(dsec_cell *c, const dsec_cell_conf *conf, dsec_err *err)
{
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
            dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                         "cell %s: schedulers did not see the nodes' reports in 10 s", conf->cell);
            return -1;
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 0;
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
    if (mkdir_p(conf->state_dir, err) < 0)
        goto out_fail;
    if (start_bus(c, conf, roles, err) < 0)
        goto out_fail;
    if ((roles & DSEC_ROLE_NODE) && conf->jetstream)
        open_traj(c, conf);
    if ((roles & DSEC_ROLE_NODE) && open_layers(c, err) < 0)
        goto out_fail;
    if ((roles & DSEC_ROLE_NODE) && start_nodes(c, conf, err) < 0)
        goto out_fail;
    /* the quota actor before the schedulers: their first creates ask it */
    if ((roles & DSEC_ROLE_QUOTA) && conf->quota && start_quota(c, conf, err) < 0)
        goto out_fail;
    if ((roles & DSEC_ROLE_SCHEDULER) && conf->sched_replicas > 0 && start_scheds(c, conf, err) < 0)
        goto out_fail;
    if ((roles & DSEC_ROLE_ARBITER) && start_arbiter(c, conf, err) < 0)
        goto out_fail;
    if (dsec_bus_flush(c->bus, 5000, err) < 0)
        goto out_fail;
    if (wait_ready(c, conf, err) < 0)
        goto out_fail;
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

const char *dsec_cell_url(const dsec_cell *c)
{
    return c->conf.url;
}
uint16_t dsec_cell_metrics_port(const dsec_cell *c)
{
    return dsec_metrics_port(c->metrics);
}
dsec_bus *dsec_cell_bus(dsec_cell *c)
{
    return c->bus;
}
dsec_arbiter *dsec_cell_arbiter(dsec_cell *c)
{
    return c->arbiter;
}
dsec_quota *dsec_cell_quota(dsec_cell *c)
{
    return c->quota;
}
size_t dsec_cell_node_count(const dsec_cell *c)
{
    return c->nnodes;
}
dsec_node *dsec_cell_node_at(dsec_cell *c, size_t i)
{
    return i < c->nnodes ? c->nodes[i] : NULL;
}
size_t dsec_cell_sched_count(const dsec_cell *c)
{
    return c->nscheds;
}
dsec_sched *dsec_cell_sched_at(dsec_cell *c, size_t i)
{
    return i < c->nscheds ? c->scheds[i] : NULL;
}
