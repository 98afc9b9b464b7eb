/* placement.h - the scheduler's capacity view, in-flight overlay and power-of-k placement. */
#ifndef DSEC_ACTORS_PLACEMENT_H
#define DSEC_ACTORS_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/registry.h"
#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A scheduler replica keeps no state a restart loses: this view is rebuilt
 * from the capacity reports nodes publish (periodic full reports plus
 * coalesced deltas), and the overlay holds only the replica's own placements
 * that no report reflects yet.
 *
 * Threading: every function may be called from any thread. One mutex guards
 * the view; place() holds it for the probe, score and reservation only (a
 * few microseconds), and update() builds a full report's tables before
 * taking it. Nothing blocks while holding it.
 *
 * Time: callers pass now_ms from a monotonic clock (tests pass made-up
 * times). Node names are 1..DSEC_PLACE_NODE_MAX bytes (dsec/names.h rules).
 */

#define DSEC_PLACE_NODE_MAX 64
#define DSEC_PLACE_K_MAX 16

typedef struct dsec_placement dsec_placement;

/*
 * Silence. A node not seen (report or heartbeat) for suspect_after_ms is
 * suspect: it stays in placement, but a create goes to it only when no other
 * node has room (likewise a node on probation: one that came back from a
 * drain, or was seen again after being suspect, until probation_ms has passed
 * with it on time). expire() drains a node neither seen nor answering a
 * placement (dsec_placement_answered) for drain_after = max(dead_after_ms,
 * suspect_after_ms + heartbeat_ms): a node is suspect for one heartbeat
 * interval at least before it is drained. After a drain, the next waits
 * drain_gap_ms; the nodes due meanwhile stay suspect.
 */
typedef struct dsec_placement_config {
    const char *cell;          /* this view's cell, for messages; NULL: "this cell". Copied. */
    uint64_t dead_after_ms;    /* neither seen nor answering for longer: drained; 0: 10000 */
    uint64_t heartbeat_ms;     /* the nodes' heartbeat interval; 0: not known (no slack) */
    uint64_t suspect_after_ms; /* not seen for longer: suspect; 0: 2 * heartbeat_ms, or
                                  dead_after_ms / 2 without it; if set, below dead_after_ms */
    uint64_t drain_gap_ms;     /* least time between two drains; 0: no limit */
    uint64_t probation_ms;     /* a node back from silence is not preferred this long; 0: none */
    uint64_t overlay_ttl_ms;   /* how long an unconfirmed placement is held; 0: 2000 */
    double locality_weight;    /* score bonus when a node caches every layer; <0: 0.5 default */
    unsigned max_probes;       /* random probes before falling back to a scan; 0: 16k + 32 */
} dsec_placement_config;

/* A new, empty view. reg (borrowed; must outlive the view) maps type names
 * to mask bits. cfg may be NULL for the defaults. *out is the caller's,
 * freed with dsec_placement_free. */
int dsec_placement_new(dsec_placement **out, const dsec_registry *reg,
                       const dsec_placement_config *cfg, dsec_err *err);
void dsec_placement_free(dsec_placement *v);

/* ---- capacity reports ----------------------------------------------------------
 * Mirrors what a node publishes (codecs' capacity message). Everything is
 * borrowed for the call; the view copies what it keeps. Label arrays are
 * parallel (label_keys[i] = label_vals[i]), like the wire's kv maps. */
typedef struct dsec_node_report {
    const char *node; /* required */
    const char *cell;
    uint64_t epoch;          /* the node manager's start time (node_announce started_ns);
                                a greater epoch is a restarted node whose seq began
                                again, so its report is accepted whatever the seq */
    uint64_t seq;            /* increases per report; older or equal ones are ignored */
    bool full;               /* a full report replaces everything below */
    uint64_t cpu_free_milli; /* free now, as the node counts it */
    uint64_t mem_free_mb;
    uint64_t slots_free;
    uint64_t disk_free_mb; /* disk sandboxes may still be given */
    uint64_t live;         /* sandboxes running */
    /* full reports only: */
    uint64_t cpu_milli; /* totals */
    uint64_t memory_mb;
    uint64_t slots;
    uint64_t disk_mb;         /* disk sandboxes may hold, the node's reserve left out; 0: the node
                                 does not count disk, and placement does not filter on it */
    const char *const *types; /* offered types; names this registry lacks are skipped */
    size_t ntypes;
    const char *const *label_keys;
    const char *const *label_vals;
    size_t nlabels;
    const char *const *layers; /* digests of the layers in the node's cache */
    size_t nlayers;
    /* Which of this view's placements the report counts. false: all of them (the overlay
     * clears). true: those stamped (dsec_place_req.stamp) up to taken_upto, the newest stamp
     * the node says it took from this view's scheduler (0: it took none since its last
     * report); later ones are still on their way, and stay reserved. */
    bool echo;
    uint64_t taken_upto;
} dsec_node_report;

/* What update() did with a report (all are success). */
enum {
    DSEC_REPORT_APPLIED = 0,
    DSEC_REPORT_STALE = 1,   /* older seq (same epoch) than one already applied: ignored */
    DSEC_REPORT_UNKNOWN = 2, /* a delta from a node with no full report yet: ignored; the
                                node's next periodic full report adds it */
};

/* Apply a report. A newer report from a node also clears the overlay of
 * that node, as far as its figures count what it admitted (echo above). Returns DSEC_REPORT_*,
 * or -1 with DSEC_E_INVALID (bad name) / DSEC_E_NOMEM. */
int dsec_placement_update(dsec_placement *v, const dsec_node_report *r, uint64_t now_ms,
                          dsec_err *err);

/* A heartbeat: the node is alive. Returns 0, or DSEC_REPORT_UNKNOWN when the
 * view does not hold the node (a heartbeat carries no capacity, so it does
 * not add one). */
int dsec_placement_heartbeat(dsec_placement *v, const char *node, uint64_t now_ms);

/* The node answered a placement (it sent one back refused): it is working,
 * whatever its heartbeats say, so expire() keeps it for dead_after_ms more.
 * It stays suspect while its heartbeats are late. Returns 0, or
 * DSEC_REPORT_UNKNOWN for a node the view does not hold. */
int dsec_placement_answered(dsec_placement *v, const char *node, uint64_t now_ms);

/* Drain (remove) nodes neither seen nor answering for dead_after_ms: the one
 * silent longest at once, then at most one per drain_gap_ms (the others are
 * deferred, counted, and stay in placement as suspects). The names of the
 * removed nodes go to *names (caller frees with dsec_placement_names_free;
 * NULL when none) and their count to *n. -1 only on allocation failure
 * (nothing removed then). */
int dsec_placement_expire(dsec_placement *v, uint64_t now_ms, char ***names, size_t *n,
                          dsec_err *err);
void dsec_placement_names_free(char **names, size_t n);

/* The names of every node of cell the view holds (suspect ones included: they may still
 * hold sandboxes; drained ones not), to *names (free with dsec_placement_names_free;
 * NULL when none) and their count to *n. -1 only on allocation failure. */
int dsec_placement_names(dsec_placement *v, const char *cell, char ***names, size_t *n,
                         dsec_err *err);

/* Forget a node (it said goodbye). DSEC_E_NOT_FOUND when unknown. */
int dsec_placement_remove(dsec_placement *v, const char *node, dsec_err *err);

/* Take a node out of placement (draining, repeated failures) or put it back.
 * Kept across reports. DSEC_E_NOT_FOUND when unknown. */
int dsec_placement_set_healthy(dsec_placement *v, const char *node, bool healthy, dsec_err *err);

/* ---- placement -------------------------------------------------------------------- */

/* One sandbox to place. Borrowed for the call. */
typedef struct dsec_place_req {
    const char *cell; /* only nodes of this cell; NULL: any node in the view */
    int type;         /* registry index (dsec_registry_pick) */
    uint64_t cpu_milli;
    uint64_t memory_mb;          /* every placement also takes one slot */
    uint64_t disk_mb;            /* its writable layer's quota (the cell default applied) */
    const char *const *aff_keys; /* affinity: node label aff_keys[i] must equal aff_vals[i] */
    const char *const *aff_vals;
    size_t naff;
    const char *const *layers; /* the environment's layer digests, for locality */
    size_t nlayers;
    const char *const *exclude; /* nodes that already refused this request */
    size_t nexclude;
    uint64_t stamp; /* the placement's send stamp (place.sent_us), which the node echoes; 0: none */
} dsec_place_req;

typedef struct dsec_place_result {
    char node[DSEC_PLACE_NODE_MAX + 1];
    uint64_t reservation; /* for dsec_placement_release */
    double score;
    unsigned candidates; /* how many feasible nodes were compared */
    bool scanned;        /* the feasible set was sparse: a full scan found them */
} dsec_place_result;

/*
 * Choose a node for req and reserve its resources in the overlay.
 *
 * Feasible: in the view (not drained) and healthy, of req->cell,
 * offering req->type, carrying every affinity label, not excluded, and with
 * cpu, memory, disk (on nodes that count it) and a slot free after
 * subtracting the overlay. Among feasible
 * nodes k candidates (1..DSEC_PLACE_K_MAX; 0 means 2) are drawn uniformly
 * by random probes, or, when probing fails to find k (a sparse feasible
 * set), by a full scan, so a feasible node is found whenever one exists.
 * Each candidate is scored by its normalised free cpu, memory, slots and,
 * on nodes that count it, disk (mean, 0..1) plus locality_weight * (share of req->layers it
 * caches); the best wins. Preferred nodes (neither suspect nor on
 * probation) are drawn first; the others only when no preferred node fits.
 *
 * rng is the caller's generator state (one per thread; any seed; see
 * dsec_placement_rand). Errors, each message naming what was short:
 *  DSEC_E_UNSUPPORTED  no node of the cell offers the type at all;
 *  DSEC_E_CAPACITY     no node known; the nodes offering it are dead or
 *                      unhealthy; no node carries an affinity label ("...
 *                      has label gpu=a100"); every fitting node is excluded;
 *                      or a resource is short ("no node in cell c1 has
 *                      2000 milli-CPU free (best: 500)", likewise memory,
 *                      disk, slots, or several together);
 *  DSEC_E_INVALID      bad k or type index.
 */
int dsec_placement_place(dsec_placement *v, const dsec_place_req *req, unsigned k, uint64_t *rng,
                         uint64_t now_ms, dsec_place_result *out, dsec_err *err);

/* Give back a reservation (the node refused, or the create failed before
 * reaching it). Returns 0, or DSEC_REPORT_UNKNOWN when it is gone already
 * (expired, cleared by a report, node removed). */
int dsec_placement_release(dsec_placement *v, const char *node, uint64_t reservation);

/* What a node had free when it refused a placement for room, and the sequence
 * number of the last capacity report it had sent then. */
typedef struct dsec_node_room {
    uint64_t seq;
    uint64_t cpu_free_milli, mem_free_mb, slots_free, disk_free_mb;
} dsec_node_room;

/* A node refused a placement: its reservation goes (the node did not admit
 * it). With room (a refusal for room), the node's free figures become the
 * ones it refused with, unless the view already holds a report newer than
 * room->seq: the report the view had counted room that the node no longer
 * had. Other reservations stay (placements still on their way). Returns 0,
 * or DSEC_REPORT_UNKNOWN for an unknown node. */
int dsec_placement_refused(dsec_placement *v, const char *node, uint64_t reservation,
                           const dsec_node_room *room);

/* splitmix64: the next random number from *state. */
uint64_t dsec_placement_rand(uint64_t *state);

/* ---- read-outs ------------------------------------------------------------------- */

/* One node as placement sees it now. */
typedef struct dsec_node_info {
    char cell[DSEC_PLACE_NODE_MAX + 1]; /* truncated if longer */
    uint64_t seq, epoch;
    dsec_type_mask types;
    bool healthy;   /* not taken out by set_healthy */
    bool alive;     /* seen or answering within dead_after_ms */
    bool suspect;   /* not seen for suspect_after_ms */
    bool preferred; /* neither suspect nor on probation: placed before the others */
    uint64_t cpu_total, mem_total, slots_total, disk_total; /* disk_total 0: not counted */
    uint64_t cpu_free, mem_free, slots_free, disk_free;     /* as reported */
    uint64_t cpu_avail, mem_avail, slots_avail, disk_avail; /* reported minus the overlay */
    uint64_t live;
    size_t reservations; /* overlay entries still held */
    size_t nlayers;
    uint64_t last_seen_ms;
    uint64_t last_answer_ms; /* 0: never answered a placement */
} dsec_node_info;

/* DSEC_E_NOT_FOUND when unknown. */
int dsec_placement_node(dsec_placement *v, const char *node, uint64_t now_ms, dsec_node_info *out,
                        dsec_err *err);

/* Nodes held (alive or not). */
size_t dsec_placement_count(dsec_placement *v);

/* How the view has dealt with silent nodes. */
typedef struct dsec_placement_health {
    uint64_t suspect;    /* nodes not seen for suspect_after_ms now */
    uint64_t probation;  /* nodes on probation now (not suspect) */
    uint64_t drained;    /* nodes expire() removed, ever */
    uint64_t deferred;   /* drains expire() put off for drain_gap_ms (a node per pass) */
    uint64_t readmitted; /* drained nodes a full report brought back */
} dsec_placement_health;

void dsec_placement_health_get(dsec_placement *v, uint64_t now_ms, dsec_placement_health *out);

/* Silent (and not answering) this long, a node is drained: see the config. */
uint64_t dsec_placement_drain_after_ms(const dsec_placement *v);

/* The cell's figures for cross-cell forwarding: alive, healthy nodes of
 * cell (NULL: all), their free resources after the overlay, live sandboxes
 * (reported plus reserved) and the union of offered types. */
typedef struct dsec_cell_summary {
    uint64_t nodes;
    uint64_t cpu_free_milli;
    uint64_t mem_free_mb;
    uint64_t slots_free;
    uint64_t live;
    uint64_t reserved; /* placements in the overlay: sent, no report since */
    dsec_type_mask types;
} dsec_cell_summary;

void dsec_placement_summary(dsec_placement *v, const char *cell, uint64_t now_ms,
                            dsec_cell_summary *out);

#ifdef __cplusplus
}
#endif
#endif
