/* record.h - length-delimited protobuf records: replay traces and trajectory logs.
 *
 * A record is a base-128 varint byte count followed by that many bytes of one
 * protobuf message (protobuf's writeDelimitedTo / parseDelimitedFrom), so any
 * language's protobuf library reads these files. A trace file starts with the
 * 8 bytes DSEC_TRACE_MAGIC and one TraceHeader record; a trajectory log is
 * records only. codecs/ owns the protobuf layouts: other modules use the plain
 * structs declared here and the functions below, which translate every failure
 * to a dsec_err (codecs/record-pb.h has the generated types, for codecs/ and
 * its tests). */
#ifndef DSEC_CODECS_RECORD_H
#define DSEC_CODECS_RECORD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <stdbool.h>

#include "codecs/msg.h"
#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSEC_RECORD_MAX_DEFAULT (16u << 20) /* bytes in one record */
#define DSEC_TRACE_MAGIC "DSECTRC1"
#define DSEC_TRACE_MAGIC_LEN 8
#define DSEC_TRACE_FORMAT_VERSION 1

/* ---- writing ------------------------------------------------------------- */
typedef struct dsec_record_writer dsec_record_writer;

/* A writer appending records to f, or to b. The caller keeps f (and closes
 * it after dsec_record_writer_free) or b. max_record 0 means the default.
 * NULL on allocation failure. */
dsec_record_writer *dsec_record_writer_new_file(FILE *f, size_t max_record);
dsec_record_writer *dsec_record_writer_new_buf(dsec_buf *b, size_t max_record);
void dsec_record_writer_free(dsec_record_writer *w);

/* Write len bytes as one record. DSEC_E_TOO_LARGE over max_record,
 * DSEC_E_IO when the file write fails. */
int dsec_record_write_raw(dsec_record_writer *w, const void *data, size_t len, dsec_err *err);
/* Push buffered bytes to the file (no-op for a buffer writer). */
int dsec_record_writer_flush(dsec_record_writer *w, dsec_err *err);

/* ---- reading --------------------------------------------------------------- */
typedef struct dsec_record_reader dsec_record_reader;

/* A reader of records from f, or from buf[0..len) (which must outlive the
 * reader). The caller keeps f. max_record 0 means the default. NULL on
 * allocation failure. */
dsec_record_reader *dsec_record_reader_new_file(FILE *f, size_t max_record);
dsec_record_reader *dsec_record_reader_new_mem(const void *buf, size_t len, size_t max_record);
void dsec_record_reader_free(dsec_record_reader *r);

/* Read the next record's bytes. Returns 1 with *data and *len set (valid until
 * the next read or free), 0 at a clean end of input, -1 on error:
 * DSEC_E_DECODE for truncation or a malformed length, DSEC_E_TOO_LARGE over
 * max_record, DSEC_E_IO for a failed file read. */
int dsec_record_read_raw(dsec_record_reader *r, const uint8_t **data, size_t *len, dsec_err *err);

/* ---- the records as plain structs ------------------------------------------
 * Field for field the messages of trace.proto and trajectory.proto. Strings
 * are never NULL in what the readers return ("" when absent). What a reader
 * returns points into one allocation freed by the matching _free; what a
 * writer takes is borrowed for the call. */
typedef struct dsec_record_bytes {
    size_t len;
    uint8_t *data;
} dsec_record_bytes;

typedef struct dsec_record_kv {
    char *key;
    char *value;
} dsec_record_kv;

/* One command of a rollout and its result (trajectory.proto). */
typedef struct dsec_traj_record {
    char *rollout_id;
    uint64_t step;
    char *req_id;
    char *sandbox_id;
    size_t n_argv;
    char **argv;
    int64_t exit_code; /* -1: ended by a signal */
    dsec_record_bytes stdout_data;
    dsec_record_bytes stderr_data;
    uint64_t ts_ns;
    uint64_t duration_us;
    dsec_record_bytes request_hash;
    char *hash_alg;
    int64_t signal;
    bool timed_out;
    bool stdout_truncated;
    bool stderr_truncated;
    void *owner_; /* the reader's: the decoded message the fields point into */
} dsec_traj_record;

typedef struct dsec_trace_header {
    uint32_t format_version;
    uint64_t created_ns;
    char *source;
    size_t n_metadata;
    dsec_record_kv *metadata;
    void *owner_;
} dsec_trace_header;

typedef struct dsec_trace_create {
    char *type;
    uint64_t cpu_milli;
    uint64_t memory_mb;
    uint64_t lifetime_s;
    double cpu_use_fraction;
    size_t n_layers;
    char **layers;
    char *job_id;
    char *class_;
} dsec_trace_create;

typedef struct dsec_trace_record {
    uint64_t ts_ns;
    char *subject;
    char *msg_type;
    char *req_id;
    dsec_record_bytes payload;
    dsec_trace_create *create; /* msg_type "create" only, else NULL */
    bool expects_reply;
    dsec_trace_create create_; /* the reader's: where create points */
    void *owner_;
} dsec_trace_record;

/* Write r as one record. */
int dsec_traj_record_write(dsec_record_writer *w, const dsec_traj_record *r, dsec_err *err);
int dsec_trace_record_write(dsec_record_writer *w, const dsec_trace_record *r, dsec_err *err);
/* Start a trace: the magic, then h as a record. */
int dsec_trace_header_write(dsec_record_writer *w, const dsec_trace_header *h, dsec_err *err);

/* Read the next record. 1 with *out set (the caller frees it with the _free below), 0 at the
 * end, -1 on error (DSEC_E_DECODE: not a valid record of that kind). */
int dsec_traj_record_read(dsec_record_reader *r, dsec_traj_record **out, dsec_err *err);
int dsec_trace_record_read(dsec_record_reader *r, dsec_trace_record **out, dsec_err *err);
/* Check the magic and read a trace's header: 0 with *out set; -1 on a bad magic, a missing
 * header, or a format_version newer than this reader. */
int dsec_trace_header_read(dsec_record_reader *r, dsec_trace_header **out, dsec_err *err);
/* One trajectory record from its packed bytes (a message of the log's stream). */
int dsec_traj_record_decode(const void *data, size_t len, dsec_traj_record **out, dsec_err *err);

/* NULL is a no-op. */
void dsec_traj_record_free(dsec_traj_record *r);
void dsec_trace_record_free(dsec_trace_record *r);
void dsec_trace_header_free(dsec_trace_header *h);

/* Records read so far and bytes consumed, for messages about where a file broke. */
uint64_t dsec_record_reader_count(const dsec_record_reader *r);
uint64_t dsec_record_reader_offset(const dsec_record_reader *r);

#ifdef __cplusplus
}
#endif
#endif
