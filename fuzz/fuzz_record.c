/* fuzz_record.c - fuzz the record reader, from memory and from a FILE*, which must agree. */
#define _GNU_SOURCE /* fmemopen */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/record-pb.h"
#include "dsec/err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_RECORD = 1 << 20 };

/* What reading an input came to; memory and file readers must agree. */
typedef struct outcome {
    uint64_t records;
    uint64_t offset;
    int rc;
    dsec_err err;
} outcome;

static _Noreturn void die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_record: %s: %s\n", what, detail);
    abort();
}

/* A message read back must pack, frame and read again to the same size. */
static void repack(const ProtobufCMessage *m)
{
    static dsec_buf framed;
    framed.len = 0;
    dsec_err err;
    dsec_record_writer *w = dsec_record_writer_new_buf(&framed, 0);
    if (w == NULL || dsec_record_write(w, m, &err) < 0)
        die("re-writing a record failed", w == NULL ? "no memory" : err.msg);
    dsec_record_writer_free(w);
    dsec_record_reader *r = dsec_record_reader_new_mem(framed.data, framed.len, 0);
    ProtobufCMessage *again = NULL;
    if (r == NULL || dsec_record_read(r, m->descriptor, &again, &err) != 1)
        die("reading a re-written record failed", r == NULL ? "no memory" : err.msg);
    if (protobuf_c_message_get_packed_size(again) != protobuf_c_message_get_packed_size(m))
        die("re-read record changed size", m->descriptor->name);
    dsec_record_msg_free(again);
    dsec_record_reader_free(r);
}

static int read_one(dsec_record_reader *r, int mode, dsec_err *err)
{
    if (mode == 2) {
        const uint8_t *p;
        size_t n;
        return dsec_record_read_raw(r, &p, &n, err);
    }
    ProtobufCMessage *m = NULL;
    const ProtobufCMessageDescriptor *d =
        mode == 0 ? &dsec__v1__trace_record__descriptor : &dsec__v1__trajectory_record__descriptor;
    int rc = dsec_record_read(r, d, &m, err);
    if (rc == 1) {
        repack(m);
        dsec_record_msg_free(m);
    }
    return rc;
}

static void run(dsec_record_reader *r, int mode, outcome *o)
{
    memset(o, 0, sizeof *o);
    if (mode == 0) {
        Dsec__V1__TraceHeader *h = NULL;
        o->rc = dsec_trace_read_header(r, &h, &o->err);
        if (h != NULL) {
            repack(&h->base);
            dsec_record_msg_free(&h->base);
        }
        if (o->rc < 0)
            goto out;
    }
    do
        o->rc = read_one(r, mode, &o->err);
    while (o->rc == 1);
out:
    o->records = dsec_record_reader_count(r);
    o->offset = dsec_record_reader_offset(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int mode = data[0] % 3; /* 0: trace file, 1: trajectory log, 2: raw frames */
    const uint8_t *in = data + 1;
    size_t n = size - 1;

    outcome mem, file;
    dsec_record_reader *r = dsec_record_reader_new_mem(in, n, MAX_RECORD);
    if (r == NULL)
        die("reader", "no memory");
    run(r, mode, &mem);
    dsec_record_reader_free(r);
    if (mem.rc < 0 && mem.err.code != DSEC_E_DECODE && mem.err.code != DSEC_E_TOO_LARGE &&
        mem.err.code != DSEC_E_UNSUPPORTED)
        die("unexpected error", mem.err.msg);

    FILE *f = fmemopen((void *)in, n, "r");
    if (f == NULL)
        die("fmemopen", "failed");
    r = dsec_record_reader_new_file(f, MAX_RECORD);
    if (r == NULL)
        die("reader", "no memory");
    run(r, mode, &file);
    dsec_record_reader_free(r);
    fclose(f);

    if (mem.rc != file.rc || mem.records != file.records || mem.offset != file.offset ||
        strcmp(mem.err.msg, file.err.msg) != 0)
        die("memory and file readers disagree", file.err.msg);
    return 0;
}
