/* arbiter.h - the preemption arbiter of a cell: one active (a lease in JetStream KV), the others
 * standby. */
#ifndef DSEC_ACTORS_ARBITER_H
#define DSEC_ACTORS_ARBITER_H

#include <stdbool.h>
#include <stdint.h>

#include "bus/bus.h"
#include "dsec/err.h"

typedef struct dsec_arbiter_conf {
    const char *cell;        /* required */
    const char *name;        /* unique among the cell's arbiters; default: random */
    uint32_t lease_ms;       /* the lease lapses this long after its last renewal; default 3000 */
    uint32_t tick_ms;        /* decision period; default 100 */
    uint32_t grace_ms;       /* a job's time to release when it names none; default 30000 */
    uint32_t batch_grace_ms; /* batch work (no checkpoint); default 2000 */
    uint32_t max_per_min;    /* reclaim requests (evictions) per rolling minute; default 120 */
    uint32_t settle_ms;      /* released capacity offsets demand this long, until the
                                schedulers' next reports show it used; default 1500 */
    uint32_t job_stale_ms;   /* a job silent this long is no longer a candidate; default 5000 */
    int replicas;            /* JetStream replicas of the arbiter's buckets; 0: 1 */
} dsec_arbiter_conf;

typedef struct dsec_arbiter dsec_arbiter;

/* Start an arbiter on bus (borrowed; must outlive it): bind the buckets
 * dsec-arbiter-<cell> (the lease) and dsec-reclaim-<cell> (reclaims), listen to
 * job registrations, demand and releases, and contend for the lease. Needs
 * JetStream. *out is stopped with dsec_arbiter_stop. */
int dsec_arbiter_start(dsec_arbiter **out, dsec_bus *bus, const dsec_arbiter_conf *conf,
                       dsec_err *err);

/* Stop. With release_lease the lease is given up at once (a clean hand-over);
 * without, a standby waits for it to lapse, as after a crash. NULL is a no-op. */
void dsec_arbiter_stop(dsec_arbiter *a, bool release_lease);

typedef struct dsec_arbiter_stats {
    bool active;           /* holds the lease now */
    uint64_t takeovers;    /* times this arbiter acquired the lease */
    uint64_t requests;     /* reclaim requests sent */
    uint64_t acked;        /* of which the job accepted */
    uint64_t honoured;     /* released by the job before the deadline */
    uint64_t forced;       /* released by force after the deadline */
    uint64_t adopted;      /* pending reclaims taken over from a previous arbiter */
    uint64_t capped;       /* victims not asked because of the eviction-rate cap */
    uint64_t pending;      /* reclaims outstanding now */
    uint64_t max_grace_ms; /* the longest grace given to a victim */
} dsec_arbiter_stats;

void dsec_arbiter_stats_get(dsec_arbiter *a, dsec_arbiter_stats *out);
const char *dsec_arbiter_name(const dsec_arbiter *a);
/* The arbiter's actor (its message counters); owned by the arbiter. */
const dsec_actor *dsec_arbiter_actor(const dsec_arbiter *a);

#endif
