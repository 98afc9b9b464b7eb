/* node.h - the node manager: one per node; admission, sandbox actors, backends, reports,
 * re-adoption. */
#ifndef DSEC_ACTORS_NODE_H
#define DSEC_ACTORS_NODE_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "runtime/metrics.h"
#include "runtime/ticker.h"
#include "runtime/traj.h"
#include "backends/net/net.h"
#include "backends/registry.h"
#include "bus/bus.h"
#include "dsec/err.h"

typedef struct dsec_node_conf {
    const char *name;         /* required: [A-Za-z0-9_-]{1,64} */
    const char *cell;         /* required */
    const char *state_dir;    /* required: the journal and backend state live here */
    uint64_t cpu_milli;       /* what the node offers; defaults 8000 */
    uint64_t memory_mb;       /* default 16384 */
    uint64_t slots;           /* sandboxes at once; default 4096 */
    uint64_t disk_mb;         /* disk for sandboxes' writable layers (admission counts each
                                 sandbox's disk_mb against it); 0: measured at start, the free
                                 space of state_dir's filesystem (backend "sim": 1 PiB) */
    uint64_t disk_reserve_mb; /* of disk_mb, kept from every sandbox; 0: 2048 */
    const char *const *types; /* offered type names; NULL-terminated; default {"sim"} */
    const dsec_backend_kv *labels;
    size_t nlabels;
    const char *backend; /* "sim": every offered type is impersonated by the sim
                            backend; "native": each type by its own backend */
    const dsec_backend_kv *backend_opts;
    size_t nbackend_opts;
    uint32_t capacity_ms;   /* coalescing window of capacity deltas; default 100 */
    uint32_t shed_after_ms; /* a placement that waited longer in the node's mailbox, a queue
                               standing there, is answered "overloaded" to its client, not
                               created; 0: never */
    uint32_t full_ms;       /* full report period; default 5000 */
    uint32_t heartbeat_ms;  /* default 1000 */
    int work_threads;       /* threads for sandbox operations that need one (crun, copies);
                               0: 16. Commands need none: they wait on the node's loop */
    /* Borrowed, shared by the nodes of one process (actors/cell.c): the event loop that
     * commands wait on and the work queue; NULL: the node opens its own. The owner stops
     * them before stopping the nodes that borrow them. */
    struct dsec_loop *loop;
    struct dsec_workq *work;
    uint32_t reap_ms;                   /* lifetime/idle check period; default 1000 */
    int64_t sync_ms;                    /* fdatasync of the journal; 0: every 1000 ms; -1: never (a
                                           crashed process loses nothing either way; a crashed host
                                           loses what was not yet synced) */
    dsec_ticker *sync_ticker;           /* where syncs run, so a slow disk never delays reports;
                                           NULL: the main ticker */
    dsec_ticker *hb_ticker;             /* where heartbeats go out, so that reports and the reaper's
                                           scan of a full node never delay them; NULL: the main ticker */
    uint64_t default_cpu_milli;         /* for requests that name none; default 1000 */
    uint64_t default_memory_mb;         /* default 512 */
    uint64_t default_disk_mb;           /* disk quota of a create that names none; default 1024 */
    uint64_t default_function_disk_mb;  /* the same for type "function"; default 64 */
    uint64_t default_ttl_s;             /* default 3600 */
    uint64_t default_idle_s;            /* default 900 */
    uint64_t max_ttl_s;                 /* default 86400 */
    dsec_traj *traj;                    /* borrowed: the trajectory log; NULL: operations naming a
                                           rollout_id are refused (no log to keep them in) */
    uint64_t pause_idle_ms;             /* pausable rollouts idle this long may be frozen under
                                           memory pressure; 0: 30000 */
    uint32_t pressure_free_pct;         /* memory pressure: free memory below this % of the node's;
                                           0: 10; pausing is off when pause_idle_ms is UINT64_MAX */
    struct dsec_layer_registry *layers; /* borrowed: the cell's layer registry, handed to the
                                           backends (containers, VMs); NULL: none */
    const dsec_net_conf *net;           /* network containment (docs/network.md): the node opens its
                                           own with this as a template (state_dir, tag and on_alert
                                           are the node's); NULL: sandboxes get an empty network
                                           namespace and network policies are refused */
    unsigned net_tag;                   /* 0..255: distinct per node on one host (names its table,
                                           veths and address pool) */
    bool quota;                         /* forks ask the cell's quota actor for their children first
                                           (creates are admitted by the schedulers) */
    uint64_t results_budget;            /* bytes of finished commands' answers kept for retries by
                                           req_id (in memory and under state_dir/results); 0: 64 MiB */
    uint64_t results_ttl_ms;            /* how long each is kept after its command finished (wall
                                           clock, across restarts); 0: 10 minutes */
    bool results_volatile;              /* keep them in memory only, lost with the process (and a
                                           command running then reruns on retry): benchmarks measure
                                           what persisting costs with it */
} dsec_node_conf;

typedef struct dsec_node dsec_node;

/* Start a node manager on bus: replay the journal in state_dir and re-adopt
 * the sandboxes it names, subscribe, announce. bus, ticker and reg are
 * borrowed and must outlive the node. *out is freed by dsec_node_stop. */
int dsec_node_start(dsec_node **out, dsec_bus *bus, dsec_ticker *ticker, const dsec_registry *reg,
                    const dsec_node_conf *conf, dsec_err *err);

/* Stop taking messages and release the node. Sandboxes keep running (they
 * are detached, and the next start re-adopts them) unless destroy_all. */
void dsec_node_stop(dsec_node *n, int destroy_all);

typedef struct dsec_node_stats {
    uint64_t live;    /* sandboxes present */
    uint64_t created; /* since start */
    uint64_t destroyed;
    uint64_t refused; /* placements refused by admission */
    uint64_t adopted; /* re-adopted at start */
    uint64_t adopt_failed;
    uint64_t reaped_ttl;
    uint64_t reaped_idle;
    uint64_t cpu_free_milli;
    uint64_t mem_free_mb;
    uint64_t slots_free;
    uint64_t disk_free_mb;      /* disk_mb less the reserve and what sandboxes hold */
    uint64_t net_alerts;        /* network alerts published (blocked connections, refused names) */
    uint64_t reaped_superseded; /* made for a create attempt whose retry was kept on another node */
    uint64_t stale_places;      /* placements of an attempt already superseded: not created */
    uint64_t shed_places;    /* placements answered "overloaded" for their wait (shed_after_ms) */
    uint64_t execs_inflight; /* commands running now without a thread (on the node's loop) */
    uint64_t execs_peak;     /* the most there were at once */
    uint64_t work_queued;    /* operations waiting for a work thread now */
    uint64_t work_peak;      /* the most that ever waited */
    /* answers of finished commands kept for retries by req_id (node-results.h) */
    uint64_t results_kept;           /* answers and lost commands held now */
    uint64_t results_bytes;          /* what they hold (results_budget bounds it) */
    uint64_t results_lost;           /* of them, commands whose outcome a restart lost */
    uint64_t results_hits;           /* retries answered from them */
    uint64_t results_persist_errors; /* starts or answers not written to the log */
    /* network containment (0 without it): backends/net dsec_net_stats */
    uint64_t net_blocked, dns_queries, dns_refused, dns_cache_hits, dns_cache_misses,
        dns_cache_evictions, dns_upstream_tcp;
} dsec_node_stats;

void dsec_node_stats_get(dsec_node *n, dsec_node_stats *out);

/* Sandboxes present by lifecycle state, indexed as dsec_node_state_names.
 * Walks the node's table under its lock: for scrapes, not hot paths. */
#define DSEC_NODE_NSTATES 7
extern const char *const dsec_node_state_names[DSEC_NODE_NSTATES];
void dsec_node_states_get(dsec_node *n, uint64_t out[DSEC_NODE_NSTATES]);
/* Live sandboxes per offered type: up to max (name, count) pairs; returns
 * how many. The names belong to the node's registry (valid while it runs). */
size_t dsec_node_types_get(dsec_node *n, const char **names, uint64_t *live, size_t max);
/* Create latency: from the place message's arrival to the created answer,
 * for every create that made a sandbox. */
void dsec_node_create_latency(dsec_node *n, dsec_metrics_hist_snap *out);
/* The node manager's actor (its message counters); owned by the node. */
const dsec_actor *dsec_node_actor(const dsec_node *n);
const char *dsec_node_name(const dsec_node *n);

#endif
