/* workq.h - the node's threads for work that does need one (crun, mkfs, file copies), shared
 * fairly: round robin across tenants, then across the sandboxes of a tenant. */
#ifndef DSEC_BACKENDS_WORKQ_H
#define DSEC_BACKENDS_WORKQ_H

#include <stddef.h>
#include <stdint.h>

#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Jobs carry a tenant and a key (the sandbox). A free thread takes the next tenant in turn
 * that has work, and from it the next key in turn; a key's own jobs run in the order they
 * came. So a tenant with a thousand sandboxes gets one turn per round like a tenant with
 * one, and a sandbox submitting in a loop gets one turn per round of its tenant.
 */
typedef struct dsec_workq dsec_workq;
typedef void (*dsec_work_fn)(void *ud);

/* Start threads workers (1..256) named name-N. */
int dsec_workq_new(dsec_workq **out, const char *name, int threads, dsec_err *err);
/* Run every job already submitted, then stop the threads; submits from then on fail with
 * DSEC_E_CLOSED. The queue's memory stays until dsec_workq_free. Not from a job.
 * Idempotent. */
void dsec_workq_stop(dsec_workq *q);
/* dsec_workq_stop, then free. NULL is a no-op. */
void dsec_workq_free(dsec_workq *q);

/* Queue fn(ud) for tenant (NULL: "") and key. Never runs fn on the caller's thread. Fails with
 * DSEC_E_CLOSED once dsec_workq_free started, or DSEC_E_NOMEM. */
int dsec_workq_submit(dsec_workq *q, const char *tenant, uint64_t key, dsec_work_fn fn, void *ud,
                      dsec_err *err);

typedef struct dsec_workq_stats {
    uint64_t queued;  /* waiting for a thread now */
    uint64_t running; /* on a thread now */
    uint64_t peak_queued;
    uint64_t done; /* jobs finished since start */
    int threads;
} dsec_workq_stats;
void dsec_workq_stats_get(dsec_workq *q, dsec_workq_stats *out);

#ifdef __cplusplus
}
#endif
#endif
