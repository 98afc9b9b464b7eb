/* record-pb.h - the records' generated protobuf types and their readers, for codecs/ and its tests.
 */
#ifndef DSEC_CODECS_RECORD_PB_H
#define DSEC_CODECS_RECORD_PB_H

#include "codecs/record.h"
#include "codecs/trace.pb-c.h"
#include "codecs/trajectory.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Pack m and write it as one record. */
int dsec_record_write(dsec_record_writer *w, const ProtobufCMessage *m, dsec_err *err);

/* Start a trace: the magic, then h as a record. */
int dsec_trace_write_header(dsec_record_writer *w, const Dsec__V1__TraceHeader *h, dsec_err *err);

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

#ifdef __cplusplus
}
#endif
#endif
