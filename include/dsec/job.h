/* job.h - libdsec's job API: a preemptible training job holds capacity in a cell and gives it
 * back when the cell's arbiter asks (acknowledge, checkpoint, release). */
#ifndef DSEC_JOB_H
#define DSEC_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsec/client.h"
#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsec_job dsec_job;

/* One unit of capacity the job holds: reserved on node's manager, so the
 * cell's placement cannot use it until the job releases it. */
typedef struct dsec_job_unit {
    const char *node; /* required */
    uint64_t cpu_milli;
    uint64_t memory_mb;
} dsec_job_unit;

typedef struct dsec_job_spec {
    const char *name;       /* required: [A-Za-z0-9_-]{1,64}, unique in the cell */
    const char *cell;       /* required */
    const char *cls;        /* "job" (checkpoints; default) or "batch" (restarts) */
    int64_t priority;       /* lower is reclaimed first */
    uint64_t checkpoint_ms; /* how long a checkpoint takes: cheaper victims go first */
    uint64_t grace_ms;      /* the time a reclaim may give it; 0: the arbiter's default */
    const dsec_job_unit *units;
    size_t nunits;
} dsec_job_spec;

/* A reclaim, as the job's callback sees it. */
typedef struct dsec_job_reclaim {
    const char *req_id;
    uint64_t cpu_milli; /* at least this much back */
    uint64_t memory_mb;
    uint64_t deadline_ns; /* wall clock; after it the arbiter releases by force */
} dsec_job_reclaim;

/* Called on the job's own thread after the reclaim was acknowledged:
 * checkpoint, then return 0 and the job releases enough units to cover the
 * request (last taken first) and reports it; non-zero keeps the units (the
 * arbiter forces them at the deadline). r is borrowed for the call. */
typedef int (*dsec_job_checkpoint_fn)(dsec_job *job, const dsec_job_reclaim *r, void *ud);

/* Take every unit (all or none: a unit a node cannot hold fails the call
 * with that node's DSEC_E_CAPACITY and the others are released), subscribe to
 * the job's reclaim subject, and register with the arbiter (again every
 * second, so a new arbiter learns it). c is borrowed and must outlive the
 * job. *out is freed by dsec_job_free. cb may be NULL: release at once. */
int dsec_job_start(dsec_client *c, const dsec_job_spec *spec, dsec_job_checkpoint_fn cb, void *ud,
                   dsec_job **out, dsec_err *err);

/* Stop answering; with release, give every unit still held back first.
 * NULL is a no-op. */
void dsec_job_free(dsec_job *job, bool release);

typedef struct dsec_job_stats {
    size_t units_held;
    uint64_t cpu_held_milli, mem_held_mb;
    uint64_t reclaims;        /* reclaim requests received */
    uint64_t released;        /* of which honoured by releasing */
    uint64_t forced;          /* units the arbiter released by force */
    uint64_t last_reclaim_ns; /* when the last request arrived (wall clock) */
} dsec_job_stats;

void dsec_job_stats_get(dsec_job *job, dsec_job_stats *out);
const char *dsec_job_name(const dsec_job *job);

#ifdef __cplusplus
}
#endif
#endif
