/* scheduler.h - a stateless scheduler replica of a cell: type choice, placement, retries,
 * cross-cell fan-out. */
#ifndef DSEC_ACTORS_SCHEDULER_H
#define DSEC_ACTORS_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/metrics.h"
#include "runtime/ticker.h"
#include "backends/registry.h"
#include "bus/bus.h"
#include "dsec/err.h"

typedef struct dsec_sched_conf {
    const char *cell;      /* required */
    const char *name;      /* replica name, unique in the cell; default: random */
    unsigned k;            /* candidates per placement (power of k choices); default 3 */
    unsigned max_attempts; /* nodes tried before answering "refused"; default 3 */
    unsigned max_hops;     /* cross-cell forwards of one request; default 2 */
    /* Silence (docs/control-plane.md, "Capacity, heartbeats, draining"): a node not
     * heard from for suspect_after_ms is suspect (placed only when no other node has
     * room); one neither heard from nor answering placements for
     * max(dead_after_ms, suspect_after_ms + heartbeat_ms) is drained, one at once
     * and then one per drain_gap_ms; one back from silence is not preferred until
     * it has been on time for probation_ms. */
    uint32_t dead_after_ms;            /* default 3000 */
    uint32_t heartbeat_ms;             /* the nodes' heartbeat interval; default 1000 */
    uint32_t suspect_after_ms;         /* default 2 * heartbeat_ms; if set, below dead_after_ms */
    uint32_t drain_gap_ms;             /* default 1000 */
    uint32_t probation_ms;             /* default 3 * heartbeat_ms */
    uint32_t lost_after_ms;            /* a node silent this long is declared lost to its sandboxes'
                                          owners and reconciled when it returns (actors/lost.h);
                                          default 30000 */
    uint32_t summary_ms;               /* cell summary period; default 1000 */
    uint64_t default_cpu_milli;        /* must match the nodes' defaults; default 1000 */
    uint64_t default_memory_mb;        /* default 512 */
    uint64_t default_disk_mb;          /* the nodes' defaults.disk_mb; default 1024 */
    uint64_t default_function_disk_mb; /* defaults.function_disk_mb, for type "function";
                                          default 64 */
    uint32_t wait_ms;                  /* a rollout create that finds no room waits this long for
                                          capacity (the arbiter reclaims it) before "capacity";
                                          0: 30000; UINT32_MAX: never wait */
    uint32_t demand_ms;                /* demand report period while creates wait; 0: 250 */
    /* Admission (docs/control-plane.md, "Admission"): the work a replica may
     * hold, i.e. creates it is admitting (quota round trips, lookups),
     * placements sent that no node report has confirmed yet, and parked
     * rollouts. A create that arrives when it holds admit_max is answered
     * "overloaded" with a retry_after_ms at once instead of queuing. */
    uint32_t admit_max;     /* 0: 65536 */
    uint32_t park_max;      /* rollouts parked at once; past it "overloaded"; 0: 65536 */
    uint32_t shed_after_ms; /* a create that waited longer in the replica's mailbox, a
                               queue standing there (bus.h, dsec_actor_on_shed), is
                               answered "overloaded" when its turn comes; 0: never */
    /* Admission by delay (actors/admit.h): when more than a tenth of this replica's
     * placements reach their nodes later than this, it lets creates in at a rate it lowers
     * until they do not, and answers the rest "overloaded"; 0: never. */
    uint32_t admit_delay_ms;
    /* The window (docs/control-plane.md, "The window"): placements this replica may have on
     * their way, sent and not yet counted by their node's report, is what its nodes take in
     * window_ms (at least WINDOW_MIN); a create past it is answered "overloaded". 0: no
     * window. */
    uint32_t window_ms;
    bool quota; /* admit every create with the cell's quota actor
                   (actors/quota.h) before placing it */
} dsec_sched_conf;

typedef struct dsec_sched dsec_sched;

/* Start a replica: subscribe to creates (queue group) and capacity events,
 * ask the cell's nodes for full reports. bus, ticker and reg are borrowed. */
int dsec_sched_start(dsec_sched **out, dsec_bus *bus, dsec_ticker *ticker, const dsec_registry *reg,
                     const dsec_sched_conf *conf, dsec_err *err);
void dsec_sched_stop(dsec_sched *s);

typedef struct dsec_sched_stats {
    uint64_t creates;         /* create requests handled */
    uint64_t placed;          /* place messages sent (first attempts and retries) */
    uint64_t retried;         /* placements retried after a refusal */
    uint64_t forwarded;       /* creates sent to another cell */
    uint64_t failed;          /* creates answered with an error */
    uint64_t nodes;           /* nodes in the view */
    uint64_t expired;         /* nodes taken out for silence (drained) */
    uint64_t suspect;         /* nodes suspect now (late, kept in placement, not preferred) */
    uint64_t drains_deferred; /* drains put off by drain_gap_ms (once per node per pass) */
    uint64_t readmitted;      /* drained nodes back in placement */
    uint64_t waiting;         /* rollout creates waiting for room now */
    uint64_t waited;          /* rollout creates that have waited (placed later or not) */
    uint64_t over_quota;      /* creates the quota actor refused */
    uint64_t admitted;        /* creates let in by the replica's admission bound */
    uint64_t shed;        /* creates answered "overloaded" (at arrival, park full, deadline near) */
    uint64_t held;        /* work held now: admitting + unconfirmed placements + parked */
    uint64_t shed_late;   /* of shed: by the limit of admission by delay */
    uint64_t admit_limit; /* creates/s the replica lets in now; 0: no limit */
    uint64_t place_delay_us;    /* its placements' worst delay to their nodes, the last window */
    uint64_t late_placements;   /* placements that reached their node later than admit_delay_ms */
    uint64_t shed_window;       /* creates answered "overloaded" past the window (window_ms) */
    uint64_t admit_cuts;        /* times the limit was set or lowered */
    uint64_t taken_per_s;       /* placements its nodes take per second (their echoes) */
    uint64_t place_echoes;      /* node echoes of its placements' stamps, since start */
    uint64_t superseded;        /* retried creates placed or found, told to the cell's nodes */
    uint64_t superseded_resent; /* such notices sent again to nodes back from a silence */
} dsec_sched_stats;

void dsec_sched_stats_get(dsec_sched *s, dsec_sched_stats *out);
/* Admission and placement latency: from a create's arrival at the replica to
 * its place message sent, for creates placed at their first try (a quota
 * round trip and a retried create's lookup included; waiting rollouts and
 * re-placements after a refusal are not measured). */
void dsec_sched_place_latency(dsec_sched *s, dsec_metrics_hist_snap *out);
/* The replica's name (owned by it). */
const char *dsec_sched_name(const dsec_sched *s);
/* Its actors (creates, capacity events): up to max into out; returns how
 * many. Owned by the replica. */
size_t dsec_sched_actors(const dsec_sched *s, const dsec_actor **out, size_t max);

#endif
