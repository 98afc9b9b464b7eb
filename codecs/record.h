/* record.h - length-delimited protobuf records: replay traces and trajectory logs.
 *
 * A record is a base-128 varint byte count followed by that many bytes of one
 * protobuf message (protobuf's writeDelimitedTo / parseDelimitedFrom), so any
 * language's protobuf library reads these files. A trace file starts with the
 * 8 bytes DSEC_TRACE_MAGIC and one TraceHeader record; a trajectory log is
 * records only. codecs/ owns the protobuf layouts: other modules use the
 * generated types declared here and the functions below, which translate
 * every failure to a dsec_err. */
#ifndef DSEC_CODECS_RECORD_H
#define DSEC_CODECS_RECORD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "codecs/msg.h"
#include "codecs/trace.pb-c.h"
#include "codecs/trajectory.pb-c.h"
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
/* Pack m and write it as one record. */
int dsec_record_write(dsec_record_writer *w, const ProtobufCMessage *m, dsec_err *err);
/* Push buffered bytes to the file (no-op for a buffer writer). */
int dsec_record_writer_flush(dsec_record_writer *w, dsec_err *err);

/* Start a trace: the magic, then h as a record. */
int dsec_trace_write_header(dsec_record_writer *w, const Dsec__V1__TraceHeader *h, dsec_err *err);

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

/* Read and unpack the next record as a desc message. Returns 1 with *out
 * set (free it with dsec_record_msg_free), 0 at the end, -1 on error. */
int dsec_record_read(dsec_record_reader *r, const ProtobufCMessageDescriptor *desc,
                     ProtobufCMessage **out, dsec_err *err);
void dsec_record_msg_free(ProtobufCMessage *m);

/* Check the magic and read the header of a trace (-1 on a bad magic, a
 * missing header, or a format_version newer than this reader). *out is
 * freed with dsec_record_msg_free(&(*out)->base). */
int dsec_trace_read_header(dsec_record_reader *r, Dsec__V1__TraceHeader **out, dsec_err *err);
/* Typed dsec_record_read for trace records and trajectory records. */
int dsec_trace_read(dsec_record_reader *r, Dsec__V1__TraceRecord **out, dsec_err *err);
int dsec_trajectory_read(dsec_record_reader *r, Dsec__V1__TrajectoryRecord **out, dsec_err *err);

/* Records read so far and bytes consumed, for messages about where a file broke. */
uint64_t dsec_record_reader_count(const dsec_record_reader *r);
uint64_t dsec_record_reader_offset(const dsec_record_reader *r);

#ifdef __cplusplus
}
#endif
#endif
