/* js.h - a small JetStream API: key-value buckets with compare-and-set, streams,
 * publish with ack, and reading a subject's messages in order. Like bus.h it
 * exposes no NATS type; natsStatus and jsErrCode become dsec_err codes here. */
#ifndef DSEC_BUS_JS_H
#define DSEC_BUS_JS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bus/bus.h"
#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsec_js dsec_js;        /* a JetStream context on one bus */
typedef struct dsec_kv dsec_kv_bucket; /* a bound key-value bucket */

/* A JetStream context over bus (borrowed; must outlive it). timeout_ms bounds
 * every API call (0: 5000). *out is freed with dsec_js_free. DSEC_E_UNSUPPORTED
 * when the server has no JetStream is reported by the first call, not here. */
int dsec_js_new(dsec_js **out, dsec_bus *bus, int timeout_ms, dsec_err *err);
void dsec_js_free(dsec_js *js);

/* ---- key-value ----------------------------------------------------------- */

typedef struct dsec_kv_conf {
    const char *bucket; /* required: [A-Za-z0-9_-]+ */
    int64_t ttl_ms;     /* entries older than this vanish; 0: never */
    int replicas;       /* 0: 1 */
    int history;        /* revisions kept per key; 0: 1 */
} dsec_kv_conf;

/* Bind the bucket, creating it when absent. *out is freed with dsec_kv_close. */
int dsec_kv_open(dsec_kv_bucket **out, dsec_js *js, const dsec_kv_conf *conf, dsec_err *err);
void dsec_kv_close(dsec_kv_bucket *kv);

/* The current value of key: *val is a NUL-terminated copy the caller frees
 * with dsec_free (*len excludes the NUL), *rev its revision. DSEC_E_NOT_FOUND
 * when the key is absent, deleted or expired. */
int dsec_kv_get(dsec_kv_bucket *kv, const char *key, char **val, size_t *len, uint64_t *rev,
                dsec_err *err);
/* Unconditional put; *rev (may be NULL) gets the new revision. */
int dsec_kv_put(dsec_kv_bucket *kv, const char *key, const void *val, size_t len, uint64_t *rev,
                dsec_err *err);
/* Put only if the key is absent: DSEC_E_EXISTS when it is present. */
int dsec_kv_create(dsec_kv_bucket *kv, const char *key, const void *val, size_t len, uint64_t *rev,
                   dsec_err *err);
/* Compare-and-set: put only if the key's revision is still last.
 * DSEC_E_EXISTS ("changed since revision N") when someone else wrote it. */
int dsec_kv_update(dsec_kv_bucket *kv, const char *key, const void *val, size_t len, uint64_t last,
                   uint64_t *rev, dsec_err *err);
int dsec_kv_delete(dsec_kv_bucket *kv, const char *key, dsec_err *err);
/* Every live key: *keys is an array of *n strings; free with dsec_kv_keys_free. */
int dsec_kv_keys(dsec_kv_bucket *kv, char ***keys, size_t *n, dsec_err *err);
void dsec_kv_keys_free(char **keys, size_t n);

/* ---- streams ------------------------------------------------------------- */

typedef struct dsec_stream_conf {
    const char *name;            /* required */
    const char *const *subjects; /* required, nsubjects >= 1 */
    size_t nsubjects;
    int replicas;                 /* 0: 1 for a new stream; an existing one keeps its own */
    int64_t max_age_ms;           /* retention by age; 0: forever */
    int64_t max_bytes;            /* retention by size; 0: unlimited */
    int64_t max_msgs_per_subject; /* 0: unlimited */
    bool memory;                  /* memory storage instead of file */
} dsec_stream_conf;

/* Create the stream, or update an existing one to conf. */
int dsec_js_stream_ensure(dsec_js *js, const dsec_stream_conf *conf, dsec_err *err);
/* The limits of the existing stream name, read without changing anything:
 * out->replicas, max_age_ms, max_bytes (0: unlimited), max_msgs_per_subject,
 * memory; out->name and subjects are left NULL. DSEC_E_NOT_FOUND when there
 * is no such stream. */
int dsec_js_stream_get(dsec_js *js, const char *name, dsec_stream_conf *out, dsec_err *err);
int dsec_js_stream_delete(dsec_js *js, const char *name, dsec_err *err);
/* Drop every message of stream on subject (wildcards allowed). */
int dsec_js_purge(dsec_js *js, const char *stream, const char *subject, dsec_err *err);

/* Publish and wait for the stream's ack: on return 0 the message is stored.
 * *seq (may be NULL) gets its stream sequence. DSEC_E_NO_RESPONDERS when no
 * stream holds the subject. */
int dsec_js_publish(dsec_js *js, const char *subject, const void *data, size_t len, uint64_t *seq,
                    dsec_err *err);

/* The last message stored on exactly subject in stream: *data is a copy the
 * caller frees with dsec_free. DSEC_E_NOT_FOUND when there is none. */
int dsec_js_last(dsec_js *js, const char *stream, const char *subject, void **data, size_t *len,
                 dsec_err *err);

/* Called once per message in stream order; data is borrowed for the call.
 * Return non-zero to stop early. */
typedef int (*dsec_js_each_fn)(const char *subject, const void *data, size_t len, uint64_t seq,
                               void *ud);

/* Read every message of stream on subject (wildcards allowed), oldest first,
 * then return. Streams made by dsec_js_stream_ensure are read with direct
 * gets, which any replica answers (a read works while the stream elects a
 * leader; a replica may lag by the last few writes, and messages written on
 * subject during the read are read too); other streams through an ordered
 * consumer, up to the messages stored when the read started. *count (may be
 * NULL) gets how many were delivered. */
int dsec_js_read(dsec_js *js, const char *stream, const char *subject, dsec_js_each_fn fn, void *ud,
                 size_t *count, dsec_err *err);

#ifdef __cplusplus
}
#endif
#endif
