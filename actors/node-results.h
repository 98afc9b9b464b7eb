/* node-results.h - answers of finished commands kept by request id, so a client that lost its
 * answer (disconnected, restarted, timed out waiting) collects it without running it again. */
#ifndef DSEC_ACTORS_NODE_RESULTS_H
#define DSEC_ACTORS_NODE_RESULTS_H

#include <stdbool.h>
#include <stdint.h>

#include "codecs/msg.h"
#include "dsec/err.h"

/*
 * Keyed by (sandbox id, req_id). Bounded twice: entries older than ttl_ms are dropped, and
 * when the bytes held pass budget the oldest go first. A retry that arrives while its
 * command still runs waits behind it on the sandbox's key (the node runs one operation per
 * sandbox at a time) and then finds the answer here. Thread-safe.
 */
typedef struct dsec_results dsec_results;

int dsec_results_new(dsec_results **out, uint64_t budget_bytes, uint64_t ttl_ms, dsec_err *err);
void dsec_results_free(dsec_results *r);

/* Keep a copy of res for (sbx, req_id), with the hash of the request that ran
 * (dsec_traj_hash_exec), replacing an older one. Out of memory or a result larger than the
 * budget: not kept (a retry then runs the command again, as before). */
void dsec_results_put(dsec_results *r, const char *sbx, const char *req_id,
                      const uint8_t hash[32], const dsec_msg_exec_result *res);
/* The kept answer for (sbx, req_id): true, *out points into *hold, which the caller frees
 * with dsec_results_release, and hash receives its request's hash. */
bool dsec_results_get(dsec_results *r, const char *sbx, const char *req_id,
                      dsec_msg_exec_result *out, uint8_t hash[32], void **hold);
void dsec_results_release(void *hold);
/* Forget a destroyed sandbox's answers. */
void dsec_results_drop(dsec_results *r, const char *sbx);

typedef struct dsec_results_stats {
    uint64_t entries, bytes, hits, evicted;
} dsec_results_stats;
void dsec_results_stats_get(dsec_results *r, dsec_results_stats *out);

#endif
