/* traj.h - the trajectory log: every logged exec and file write of a rollout, in a JetStream
 * stream. */
#ifndef DSEC_ACTORS_TRAJ_H
#define DSEC_ACTORS_TRAJ_H

#include <stdint.h>

#include "bus/bus.h"
#include "codecs/msg.h"
#include "codecs/record.h"
#include "dsec/err.h"
#include "dsec/sha256.h"

/* One stream holds every rollout; step N of rollout R is the subject
 * dsec.v1.traj.<R>.<N>, so finding a step is one direct read. */
#define DSEC_TRAJ_STREAM "DSEC_TRAJ"
#define DSEC_TRAJ_HASH_ALG "sha256"

typedef struct dsec_traj_conf {
    const char *stream; /* default DSEC_TRAJ_STREAM */
    int64_t max_age_s;  /* retention by age; 0: 7 days */
    int64_t max_bytes;  /* retention by size; 0: unlimited */
    int replicas;       /* 0: 1 */
} dsec_traj_conf;

typedef struct dsec_traj dsec_traj;

/* Bind (creating or updating to conf) the log's stream on bus (borrowed,
 * must outlive the log). conf NULL opens a reader: it binds to the existing
 * stream and changes none of its limits (DSEC_E_NOT_FOUND when there is none).
 * *out is freed with dsec_traj_close. Thread-safe. */
int dsec_traj_open(dsec_traj **out, dsec_bus *bus, const dsec_traj_conf *conf, dsec_err *err);
void dsec_traj_close(dsec_traj *t);

/* Whether rollout_id can name a log (1..256 of A-Z a-z 0-9 _ - : it is a subject token). */
int dsec_traj_check_id(const char *rollout_id, dsec_err *err);

/* Step `step` of rollout: 1 with *out set (free with dsec_traj_record_free), 0 when the step is
 * not logged, -1 on error. */
int dsec_traj_find(dsec_traj *t, const char *rollout, uint64_t step, dsec_traj_record **out,
                   dsec_err *err);

/* Append r (rollout_id and step set); returns once the stream has stored it. */
int dsec_traj_append(dsec_traj *t, const dsec_traj_record *r, dsec_err *err);

/* Called per record of a rollout in step order; r is borrowed. Non-zero stops. */
typedef int (*dsec_traj_each_fn)(const dsec_traj_record *r, void *ud);
/* Read a rollout's whole log; *count (may be NULL) gets the number of records. */
int dsec_traj_read(dsec_traj *t, const char *rollout, dsec_traj_each_fn fn, void *ud, size_t *count,
                   dsec_err *err);

/* The request digests a logged step is matched by (argv, env, cwd, stdin,
 * user for exec; path, data, mode, append for a file write). */
void dsec_traj_hash_exec(const dsec_msg_exec *x, uint8_t out[DSEC_SHA256_LEN]);
void dsec_traj_hash_write(const dsec_msg_file_write *w, uint8_t out[DSEC_SHA256_LEN]);

/* The argv a logged file write is recorded with: {"@file_write", path, "append"|"replace"}. */
#define DSEC_TRAJ_WRITE_ARGV0 "@file_write"

#endif
