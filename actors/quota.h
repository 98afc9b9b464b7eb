/* quota.h - the quota actor of a cell: tenants, their nested projects, and admission of creates
 * against their limits. */
#ifndef DSEC_ACTORS_QUOTA_H
#define DSEC_ACTORS_QUOTA_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/ticker.h"
#include "bus/bus.h"
#include "dsec/err.h"

/* One quota actor is active per cell. Its schedulers ask it before placing
 * any create (dsec.v1.ctl.quota.<cell>.admit), so admission is decided in
 * one mailbox, in order: however many replicas place concurrently, a tenant
 * never holds more than its quota. More instances may run as standbys: a KV
 * lease (bucket dsec-quota-<cell>, actors/lease.h) picks the active one,
 * which alone serves admit/set/get/list. Every instance counts usage from
 * the nodes all along, so a standby that takes the lease admits at once. What it counts comes from
 * the nodes: their lifecycle events as they happen, and the usage every full capacity report
 * carries, which replaces the node's share (a lost event heals at the next full report). Admissions
 * not yet seen as sandboxes count too, until their sandbox's creation event arrives or pending_ms
 * passes (only for tenants with a quota somewhere: others have nothing to hold back).
 *
 * Definitions (dsec_msg_quota) live in the JetStream KV bucket `bucket`,
 * shared by every cell; each cell enforces them on what runs in that cell.
 * A project "a/b" of tenant t is bounded by "a" and by t: each limit is at
 * most its parent's, and a create must fit every level from t down. */
typedef struct dsec_quota_conf {
    const char *cell;    /* required */
    const char *bucket;  /* KV bucket of the definitions; default DSEC_QUOTAS */
    int replicas;        /* of that bucket; 0: 1 */
    uint32_t full_ms;    /* the nodes' full-report period: after a start, usage is
                            complete once it passed (plus 1 s); default 5000 */
    uint32_t pending_ms; /* an admission whose sandbox was never seen is given back
                            after this; default 60000 */
    uint32_t reload_ms;  /* definitions re-read from KV (other cells' changes); default 10000 */
    uint32_t lease_ms;   /* a standby takes over this long after the active one stopped
                            renewing its lease; default 3000 */
} dsec_quota_conf;

typedef struct dsec_quota dsec_quota;

/* Start on bus (borrowed; outlives the actor): bind the buckets, load the
 * definitions, ask the cell's nodes for full reports, and take the lease if
 * nobody holds it (else stand by). Needs JetStream. */
int dsec_quota_start(dsec_quota **out, dsec_bus *bus, const dsec_quota_conf *conf, dsec_err *err);
/* Stop and free, giving the lease up so a standby takes over at once. NULL is
 * a no-op. */
void dsec_quota_stop(dsec_quota *q);

typedef struct dsec_quota_stats {
    uint64_t admitted;    /* admissions granted (repeats of one req_id count once) */
    uint64_t refused;     /* refused for want of quota */
    uint64_t released;    /* given back by a scheduler (the create failed) */
    uint64_t expired;     /* given back because no sandbox appeared within pending_ms */
    uint64_t pending;     /* admissions in flight now */
    uint64_t definitions; /* tenants and projects defined */
    uint64_t nodes;       /* nodes whose usage is counted */
    uint64_t active;      /* 1 while this instance holds the lease and admits */
    uint64_t takeovers;   /* times it took the lease */
} dsec_quota_stats;

void dsec_quota_stats_get(dsec_quota *q, dsec_quota_stats *out);
/* The quota actor's event actor (usage; its message counters); owned by it.
 * Admission runs on a second actor that exists while the lease is held. */
const dsec_actor *dsec_quota_actor(const dsec_quota *q);

#endif
