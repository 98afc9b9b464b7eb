/* lost.h - a scheduler replica's watch over its nodes: declaring a silent node lost to the owners
 * of its sandboxes, and having it reclaim them when it returns. */
#ifndef DSEC_ACTORS_LOST_H
#define DSEC_ACTORS_LOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/err.h"

/* A node silent for lost_after_ms is declared lost once:
 * - every tenant that had sandboxes there (from its last full report's
 *   usage) gets node_lost on dsec.v1.<tenant>.evt.lost;
 * - operators see it on dsec.v1.ctl.evt.<cell>.lost.<node>.
 * A node that speaks again after that is asked, on
 * dsec.v1.ctl.reconcile.<node> and until it answers, to reclaim every sandbox
 * it made before it was declared lost: their owners already count them as
 * gone, so they would otherwise be orphans. Each replica watches for
 * itself, so owners may hear of one loss once per replica. */
typedef struct dsec_lost dsec_lost;

/* bus is borrowed. who names the replica in events and logs. A node silent
 * for gap_ms (the scheduler's dead_after_ms) may have missed notices. */
int dsec_lost_new(dsec_lost **out, dsec_bus *bus, const char *cell, const char *who,
                  uint32_t lost_after_ms, uint32_t gap_ms, dsec_err *err);
/* Waits for a reconcile request still in flight. NULL is a no-op. */
void dsec_lost_free(dsec_lost *w);

/* A node spoke (a report or a heartbeat). With full set, usage is its
 * complete list of what each tenant holds there. conn is its report's
 * connection generation (0: a heartbeat, or not told): a change means it
 * restarted or reconnected and may have missed notices, as after a silence. */
void dsec_lost_seen(dsec_lost *w, const char *node, bool full, const dsec_msg_usage *usage,
                    size_t nusage, uint64_t conn, uint64_t now_ms);
/* Attempt retry (>= 1) of a create was placed on node, or its lookup found
 * node holding it. Any other node that made it for an earlier attempt, its
 * answer lost, must drop that copy: the cell's nodes are told at once on
 * dsec.v1.ctl.superseded.<cell>, and a node that was silent for gap_ms meanwhile is sent, when it
 * speaks again, every notice from its silence on dsec.v1.ctl.superseded.<cell>.<node>, until it
 * answers. Notices are kept for 2 * lost_after_ms (a node silent longer is reconciled whole) and at
 * most DSEC_LOST_NOTICES_MAX of them. */
#define DSEC_LOST_NOTICES_MAX 16384
void dsec_lost_superseded(dsec_lost *w, const char *tenant, const char *req_id, const char *node,
                          uint64_t retry, uint64_t now_ms);
/* Declare the nodes silent for too long. Call it periodically. */
void dsec_lost_tick(dsec_lost *w, uint64_t now_ms);

typedef struct dsec_lost_stats {
    uint64_t declared;    /* nodes declared lost */
    uint64_t reconciled;  /* returned nodes that acknowledged the reclaim */
    uint64_t superseded;  /* retried creates placed, told to the cell's nodes */
    uint64_t resent;      /* notices sent again to nodes back from a silence */
    uint64_t overwritten; /* notices dropped, still young, for DSEC_LOST_NOTICES_MAX */
} dsec_lost_stats;

void dsec_lost_stats_get(dsec_lost *w, dsec_lost_stats *out);

#endif
