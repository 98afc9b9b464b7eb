/* node-results.h - answers of finished commands kept by request id, so a client that lost its
 * answer (disconnected, restarted, timed out waiting) collects it without running it again. */
#ifndef DSEC_ACTORS_NODE_RESULTS_H
#define DSEC_ACTORS_NODE_RESULTS_H

#include <stdbool.h>
#include <stdint.h>

#include "codecs/msg.h"
#include "dsec/err.h"

/*
 * Keyed by (sandbox id, req_id). Bounded twice: entries older than ttl_ms (wall clock, from
 * when the command finished) are dropped, and when the bytes held pass budget the oldest go
 * first. A retry that arrives while its command still runs waits behind it on the sandbox's
 * key (the node runs one operation per sandbox at a time) and then finds the answer here.
 * Thread-safe; calls for one sandbox come one at a time (its mailbox key).
 *
 * Persistence (dir given): every kept answer is also appended to one log, <dir>/answers.log,
 * so that a node manager that stops, or is killed, and starts again still answers retries. A
 * named command is logged when it starts (dsec_results_begin) and again with its answer. A
 * start without its answer, found when the log is read back, is a command whose node manager
 * went away while it ran: its outcome is lost (the sandbox's agent ran it on, or not, with
 * nobody to tell), and a retry hears that instead of running it a second time. Appends cost
 * a few microseconds where a file per answer cost hundreds (bench/results.c); the log is
 * rewritten with only what is kept at every start, and when it grows past three times the
 * budget, then on a thread of its own while appends go on. Not the sandboxes' journal:
 * answers run to megabytes (its records stop at 64 KiB), come and go far more often than
 * sandboxes, and would lengthen every replay of it. It is not fsynced: it is safe from a
 * crash of the process, not of the host, whose sandboxes' commands end with it anyway.
 */
typedef struct dsec_results dsec_results;

/* dir: where answers persist (created if missing; dsec_results_load opens it, before any other
 * call); NULL: in memory only. */
int dsec_results_new(dsec_results **out, uint64_t budget_bytes, uint64_t ttl_ms, const char *dir,
                     dsec_err *err);
void dsec_results_free(dsec_results *r);

/* Whether the answers kept for sandbox sbx are still wanted (it is still here). */
typedef bool (*dsec_results_keep_fn)(const char *sbx, void *ud);
/* Read what a previous node manager left in dir: answers still within the TTL and the budget
 * (oldest dropped first) are kept, with the wall-clock age they had; markers become lost
 * entries (from now, for the TTL); the rest, and every sandbox keep refuses, is removed.
 * Returns how many entries were kept (answers and lost), or -1 when dir cannot be read. */
int dsec_results_load(dsec_results *r, dsec_results_keep_fn keep, void *ud, dsec_err *err);

/* A command named (sbx, req_id) with request hash is about to run: its marker. A marker that
 * cannot be written is counted (stats) and the command runs all the same. */
void dsec_results_begin(dsec_results *r, const char *sbx, const char *req_id,
                        const uint8_t hash[32]);
/* It failed without an answer to keep (the backend refused it): its marker goes, and a retry
 * runs it. Not after the node manager stopped waiting for it (it may still run): then the
 * marker stays and the next start finds it lost. */
void dsec_results_abandon(dsec_results *r, const char *sbx, const char *req_id);

/* Keep a copy of res for (sbx, req_id), with the hash of the request that ran
 * (dsec_traj_hash_exec), replacing an older one; persisted first (in dir) when there is one.
 * Out of memory or a result larger than the budget: not kept (a retry then runs the command
 * again, as before). */
void dsec_results_put(dsec_results *r, const char *sbx, const char *req_id, const uint8_t hash[32],
                      const dsec_msg_exec_result *res);

enum { DSEC_RESULTS_NONE = 0, DSEC_RESULTS_ANSWER = 1, DSEC_RESULTS_LOST = 2 };
/* What is kept for (sbx, req_id): DSEC_RESULTS_NONE; DSEC_RESULTS_ANSWER: *out points into
 * *hold, which the caller frees with dsec_results_release; DSEC_RESULTS_LOST: the command was
 * running when an earlier node manager went away (*hold NULL). hash receives the request's
 * hash in both. */
int dsec_results_get(dsec_results *r, const char *sbx, const char *req_id,
                     dsec_msg_exec_result *out, uint8_t hash[32], void **hold);
void dsec_results_release(void *hold);
/* Forget a destroyed sandbox's answers, in memory and in dir. */
void dsec_results_drop(dsec_results *r, const char *sbx);

uint64_t dsec_results_ttl_ms(const dsec_results *r);

typedef struct dsec_results_stats {
    uint64_t entries, bytes, hits, evicted;
    uint64_t lost;           /* entries that are lost commands */
    uint64_t loaded;         /* entries read back at start */
    uint64_t persist_errors; /* markers or answers that could not be written */
} dsec_results_stats;
void dsec_results_stats_get(dsec_results *r, dsec_results_stats *out);

#endif
