/* test_codecs_record.c - protobuf records: round trips, truncation, oversize, framing. */
#define _GNU_SOURCE /* fmemopen */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "codecs/record-pb.h"
#include "dsec/err.h"

/* ---- fixtures: a trace with a header and three records ------------------------- */

static Dsec__V1__TraceHeader__MetadataEntry meta[2];
static Dsec__V1__TraceHeader__MetadataEntry *meta_p[2] = {&meta[0], &meta[1]};
static Dsec__V1__TraceHeader header;
static Dsec__V1__TraceCreate create;
static Dsec__V1__TraceRecord records[3];
static char *layers[] = {"sha256:aa", "sha256:bb", "sha256:cc"};
static const uint8_t payload[] = {0x81, 0xa6, 'r', 'e', 'q', '_', 'i', 'd', 0xa1, 0x00};

static void build_trace(void)
{
    dsec__v1__trace_header__init(&header);
    for (int i = 0; i < 2; i++)
        dsec__v1__trace_header__metadata_entry__init(&meta[i]);
    meta[0].key = "cell";
    meta[0].value = "c1";
    meta[1].key = "workload";
    meta[1].value = "swe-rollouts";
    header.format_version = DSEC_TRACE_FORMAT_VERSION;
    header.created_ns = 1700000000123456789ull;
    header.source = "test";
    header.n_metadata = 2;
    header.metadata = meta_p;

    dsec__v1__trace_create__init(&create);
    create.type = "container";
    create.cpu_milli = 2000;
    create.memory_mb = 4096;
    create.lifetime_s = 1020;
    create.cpu_use_fraction = 0.045;
    create.n_layers = 3;
    create.layers = layers;
    create.job_id = "job-9";
    create.class_ = "rollout";

    for (int i = 0; i < 3; i++) {
        dsec__v1__trace_record__init(&records[i]);
        records[i].ts_ns = 1000 + (uint64_t)i;
        records[i].subject =
            i == 0 ? "dsec.v1.acme.create" : "dsec.v1.acme.sbx.n1-00000000000000a1.exec";
        records[i].msg_type = i == 0 ? "create" : "exec";
        records[i].req_id = "req-1";
        records[i].payload =
            (ProtobufCBinaryData){.len = sizeof payload, .data = (uint8_t *)payload};
    }
    records[0].create = &create;
}

static void write_trace(dsec_record_writer *w)
{
    dsec_err err;
    assert_int_equal(dsec_trace_write_header(w, &header, &err), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(dsec_record_write(w, &records[i].base, &err), 0);
    assert_int_equal(dsec_record_writer_flush(w, &err), 0);
}

/* Read a trace back and check every field survived. */
static void read_and_check_trace(dsec_record_reader *r)
{
    dsec_err err;
    Dsec__V1__TraceHeader *h;
    assert_int_equal(dsec_trace_read_header(r, &h, &err), 0);
    assert_int_equal(h->format_version, DSEC_TRACE_FORMAT_VERSION);
    assert_true(h->created_ns == header.created_ns);
    assert_string_equal(h->source, "test");
    assert_int_equal(h->n_metadata, 2);
    assert_string_equal(h->metadata[1]->key, "workload");
    assert_string_equal(h->metadata[1]->value, "swe-rollouts");
    dsec_record_msg_free(&h->base);
    for (int i = 0; i < 3; i++) {
        Dsec__V1__TraceRecord *rec;
        assert_int_equal(dsec_trace_read(r, &rec, &err), 1);
        assert_int_equal(rec->ts_ns, 1000 + i);
        assert_string_equal(rec->subject, records[i].subject);
        assert_string_equal(rec->msg_type, records[i].msg_type);
        assert_int_equal(rec->payload.len, sizeof payload);
        assert_memory_equal(rec->payload.data, payload, sizeof payload);
        if (i == 0) {
            assert_non_null(rec->create);
            assert_string_equal(rec->create->type, "container");
            assert_int_equal(rec->create->memory_mb, 4096);
            assert_int_equal(rec->create->lifetime_s, 1020);
            assert_true(rec->create->cpu_use_fraction == 0.045);
            assert_int_equal(rec->create->n_layers, 3);
            assert_string_equal(rec->create->layers[2], "sha256:cc");
            assert_string_equal(rec->create->job_id, "job-9");
            assert_string_equal(rec->create->class_, "rollout");
        } else {
            assert_null(rec->create);
        }
        dsec_record_msg_free(&rec->base);
    }
    Dsec__V1__TraceRecord *rec = (void *)1;
    assert_int_equal(dsec_trace_read(r, &rec, &err), 0);
    assert_null(rec);
    assert_int_equal(dsec_record_reader_count(r), 4);
}

static void trace_round_trip_in_memory(void **state)
{
    build_trace();
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_record_writer *w = dsec_record_writer_new_buf(&b, 0);
    assert_non_null(w);
    write_trace(w);
    dsec_record_writer_free(w);
    assert_memory_equal(b.data, "DSECTRC1", 8);

    dsec_record_reader *r = dsec_record_reader_new_mem(b.data, b.len, 0);
    assert_non_null(r);
    read_and_check_trace(r);
    assert_int_equal(dsec_record_reader_offset(r), b.len);
    dsec_record_reader_free(r);
    dsec_buf_release(&b);
}

static void trace_round_trip_in_a_file(void **state)
{
    build_trace();
    FILE *f = tmpfile();
    assert_non_null(f);
    dsec_record_writer *w = dsec_record_writer_new_file(f, 0);
    write_trace(w);
    dsec_record_writer_free(w);
    rewind(f);
    dsec_record_reader *r = dsec_record_reader_new_file(f, 0);
    read_and_check_trace(r);
    dsec_record_reader_free(r);
    fclose(f);
}

static void trajectory_round_trip(void **state)
{
    static char *argv[] = {"python3", "-c", "print('hi')"};
    static const uint8_t out[] = {'h', 'i', 0, '\n'}, hash[32] = {1, 2, 3};
    Dsec__V1__TrajectoryRecord t;
    dsec__v1__trajectory_record__init(&t);
    t.rollout_id = "ro-7";
    t.step = 12;
    t.req_id = "req-12";
    t.sandbox_id = "n3-00000000000000ff";
    t.n_argv = 3;
    t.argv = argv;
    t.exit_code = -1;
    t.signal = 9;
    t.stdout_data = (ProtobufCBinaryData){.len = sizeof out, .data = (uint8_t *)out};
    t.ts_ns = 77;
    t.duration_us = 1500;
    t.request_hash = (ProtobufCBinaryData){.len = sizeof hash, .data = (uint8_t *)hash};
    t.hash_alg = "sha256";
    t.timed_out = true;
    t.stdout_truncated = true;

    dsec_buf b;
    dsec_buf_init(&b);
    dsec_record_writer *w = dsec_record_writer_new_buf(&b, 0);
    dsec_err err;
    for (int i = 0; i < 2; i++)
        assert_int_equal(dsec_record_write(w, &t.base, &err), 0);
    dsec_record_writer_free(w);

    dsec_record_reader *r = dsec_record_reader_new_mem(b.data, b.len, 0);
    for (int i = 0; i < 2; i++) {
        Dsec__V1__TrajectoryRecord *got;
        assert_int_equal(dsec_trajectory_read(r, &got, &err), 1);
        assert_string_equal(got->rollout_id, "ro-7");
        assert_int_equal(got->step, 12);
        assert_string_equal(got->sandbox_id, "n3-00000000000000ff");
        assert_int_equal(got->n_argv, 3);
        assert_string_equal(got->argv[2], "print('hi')");
        assert_int_equal(got->exit_code, -1);
        assert_int_equal(got->signal, 9);
        assert_int_equal(got->stdout_data.len, sizeof out);
        assert_memory_equal(got->stdout_data.data, out, sizeof out);
        assert_int_equal(got->stderr_data.len, 0);
        assert_int_equal(got->request_hash.len, 32);
        assert_memory_equal(got->request_hash.data, hash, 32);
        assert_string_equal(got->hash_alg, "sha256");
        assert_true(got->timed_out && got->stdout_truncated && !got->stderr_truncated);
        dsec_record_msg_free(&got->base);
    }
    Dsec__V1__TrajectoryRecord *got;
    assert_int_equal(dsec_trajectory_read(r, &got, &err), 0);
    dsec_record_reader_free(r);
    dsec_buf_release(&b);
}

static void framing_is_protobuf_delimited(void **state)
{
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_record_writer *w = dsec_record_writer_new_buf(&b, 0);
    dsec_err err;
    static uint8_t big[300];
    assert_int_equal(dsec_record_write_raw(w, "", 0, &err), 0);
    assert_int_equal(dsec_record_write_raw(w, "ab", 2, &err), 0);
    assert_int_equal(dsec_record_write_raw(w, big, sizeof big, &err), 0);
    dsec_record_writer_free(w);
    /* varints: 0, 2, 300 = 0xac 0x02 */
    assert_int_equal(b.len, 1 + 1 + 2 + 2 + 300);
    assert_memory_equal(b.data,
                        "\x00\x02"
                        "ab\xac\x02",
                        6);

    dsec_record_reader *r = dsec_record_reader_new_mem(b.data, b.len, 0);
    const uint8_t *p;
    size_t n;
    assert_int_equal(dsec_record_read_raw(r, &p, &n, &err), 1);
    assert_int_equal(n, 0);
    assert_int_equal(dsec_record_read_raw(r, &p, &n, &err), 1);
    assert_int_equal(n, 2);
    assert_memory_equal(p, "ab", 2);
    assert_int_equal(dsec_record_read_raw(r, &p, &n, &err), 1);
    assert_int_equal(n, 300);
    assert_int_equal(dsec_record_read_raw(r, &p, &n, &err), 0);
    dsec_record_reader_free(r);
    dsec_buf_release(&b);
}

/* Read a whole trace; return records read before the end or error, and the
 * final status (0 clean end, -1 error with err filled). */
static int read_all(dsec_record_reader *r, int *nrec, dsec_err *err)
{
    *nrec = 0;
    Dsec__V1__TraceHeader *h;
    if (dsec_trace_read_header(r, &h, err) < 0)
        return -1;
    dsec_record_msg_free(&h->base);
    for (;;) {
        Dsec__V1__TraceRecord *rec;
        int rc = dsec_trace_read(r, &rec, err);
        if (rc <= 0)
            return rc;
        (*nrec)++;
        dsec_record_msg_free(&rec->base);
    }
}

static void truncated_at_every_length(void **state)
{
    build_trace();
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_record_writer *w = dsec_record_writer_new_buf(&b, 0);
    write_trace(w);
    dsec_record_writer_free(w);
    /* Where each record ends: a cut exactly there is a clean, shorter trace. */
    size_t ends[4];
    {
        dsec_record_reader *r = dsec_record_reader_new_mem(b.data, b.len, 0);
        dsec_err err;
        Dsec__V1__TraceHeader *h;
        assert_int_equal(dsec_trace_read_header(r, &h, &err), 0);
        dsec_record_msg_free(&h->base);
        ends[0] = dsec_record_reader_offset(r);
        for (int i = 1; i < 4; i++) {
            const uint8_t *p;
            size_t len;
            assert_int_equal(dsec_record_read_raw(r, &p, &len, &err), 1);
            ends[i] = dsec_record_reader_offset(r);
        }
        dsec_record_reader_free(r);
    }
    for (size_t cut = 0; cut < b.len; cut++) {
        for (int file = 0; file < 2; file++) {
            FILE *f = NULL;
            dsec_record_reader *r;
            if (file) {
                f = fmemopen(b.data, cut, "r");
                assert_non_null(f);
                r = dsec_record_reader_new_file(f, 0);
            } else {
                r = dsec_record_reader_new_mem(b.data, cut, 0);
            }
            int nrec;
            dsec_err err;
            dsec_err_clear(&err);
            int rc = read_all(r, &nrec, &err);
            int complete = 0;
            while (complete < 3 && ends[complete + 1] <= cut)
                complete++;
            if (cut == ends[0] || cut == ends[1] || cut == ends[2]) {
                assert_int_equal(rc, 0);
                assert_int_equal(nrec, complete);
            } else {
                assert_int_equal(rc, -1);
                assert_int_equal(err.code, DSEC_E_DECODE);
                if (cut >= ends[0])
                    assert_int_equal(nrec, complete);
                if (cut > 8 && strstr(err.msg, "truncated") == NULL)
                    fail_msg("cut %zu: %s", cut, err.msg);
            }
            dsec_record_reader_free(r);
            if (f != NULL)
                fclose(f);
        }
    }
    dsec_buf_release(&b);
}

static void truncation_messages(void **state)
{
    dsec_err err;
    const uint8_t *p;
    size_t n;
    dsec_record_reader *r = dsec_record_reader_new_mem("\x05"
                                                       "abc",
                                                       4, 0);
    assert_int_equal(dsec_record_read_raw(r, &p, &n, &err), -1);
    assert_int_equal(err.code, DSEC_E_DECODE);
    assert_string_equal(err.msg, "record 0 at byte 0: truncated: 3 of 5 bytes");
    dsec_record_reader_free(r);
    r = dsec_record_reader_new_mem("\x01z\x80", 3, 0);
    assert_int_equal(dsec_record_read_raw(r, &p, &n, &err), 1);
    assert_int_equal(dsec_record_read_raw(r, &p, &n, &err), -1);
    assert_string_equal(err.msg, "record 1 at byte 2: truncated length prefix");
    dsec_record_reader_free(r);
    r = dsec_record_reader_new_mem("DSECTRC", 7, 0);
    Dsec__V1__TraceHeader *h;
    assert_int_equal(dsec_trace_read_header(r, &h, &err), -1);
    assert_string_equal(err.msg, "trace: truncated DSECTRC1 magic");
    dsec_record_reader_free(r);
    r = dsec_record_reader_new_mem("", 0, 0);
    assert_int_equal(dsec_trace_read_header(r, &h, &err), -1);
    assert_string_equal(err.msg, "trace: empty input, no DSECTRC1 magic");
    dsec_record_reader_free(r);
}

static void oversize_records(void **state)
{
    dsec_err err;
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_record_writer *w = dsec_record_writer_new_buf(&b, 10);
    assert_int_equal(dsec_record_write_raw(w, "0123456789", 10, &err), 0);
    assert_int_equal(dsec_record_write_raw(w, "0123456789x", 11, &err), -1);
    assert_int_equal(err.code, DSEC_E_TOO_LARGE);
    assert_string_equal(err.msg, "record: 11 bytes exceeds limit 10");
    build_trace();
    assert_int_equal(dsec_record_write(w, &records[0].base, &err), -1);
    assert_int_equal(err.code, DSEC_E_TOO_LARGE);
    assert_non_null(strstr(err.msg, "dsec.v1.TraceRecord of"));
    dsec_record_writer_free(w);
    assert_int_equal(b.len, 11); /* nothing of the refused records was written */

    /* A reader with a smaller limit refuses the record before reading it. */
    dsec_record_writer *big = dsec_record_writer_new_buf(&b, 0);
    assert_int_equal(dsec_record_write_raw(big, "0123456789x", 11, &err), 0);
    dsec_record_writer_free(big);
    dsec_record_reader *r = dsec_record_reader_new_mem(b.data, b.len, 10);
    const uint8_t *p;
    size_t n;
    assert_int_equal(dsec_record_read_raw(r, &p, &n, &err), 1);
    assert_int_equal(dsec_record_read_raw(r, &p, &n, &err), -1);
    assert_int_equal(err.code, DSEC_E_TOO_LARGE);
    assert_string_equal(err.msg, "record 1 at byte 11: 11 bytes exceeds limit 10");
    dsec_record_reader_free(r);

    /* A file whose prefix claims ~256 MiB: refused by the default limit. */
    FILE *f = fmemopen("\xff\xff\xff\x7f"
                       "abc",
                       7, "r");
    r = dsec_record_reader_new_file(f, 0);
    assert_int_equal(dsec_record_read_raw(r, &p, &n, &err), -1);
    assert_int_equal(err.code, DSEC_E_TOO_LARGE);
    assert_string_equal(err.msg, "record 0 at byte 0: 268435455 bytes exceeds limit 16777216");
    dsec_record_reader_free(r);
    fclose(f);
    dsec_buf_release(&b);
}

static void bad_framing_and_bodies(void **state)
{
    dsec_err err;
    const uint8_t *p;
    size_t n;
    dsec_record_reader *r =
        dsec_record_reader_new_mem("\xff\xff\xff\xff\xff\xff\xff\xff\xff\x02", 10, 0);
    assert_int_equal(dsec_record_read_raw(r, &p, &n, &err), -1);
    assert_int_equal(err.code, DSEC_E_DECODE);
    assert_string_equal(err.msg, "record 0 at byte 0: malformed length prefix");
    dsec_record_reader_free(r);

    /* A body that is not the message: field 1 with wire type 7 (invalid). */
    r = dsec_record_reader_new_mem("\x02\x0f\x00", 3, 0);
    Dsec__V1__TraceRecord *rec = NULL;
    assert_int_equal(dsec_trace_read(r, &rec, &err), -1);
    assert_int_equal(err.code, DSEC_E_DECODE);
    assert_string_equal(err.msg, "record 0: not a valid dsec.v1.TraceRecord");
    assert_null(rec);
    dsec_record_reader_free(r);

    /* Field number 0 spelled in three bytes, at top level and nested
     * (found by fuzz_record: protobuf-c keeps it, then cannot re-read it). */
    r = dsec_record_reader_new_mem("\x04\x80\x80\x00\x01"
                                   "\x06\x32\x04\x80\x80\x00\x01",
                                   12, 0);
    assert_int_equal(dsec_trace_read(r, &rec, &err), -1);
    assert_string_equal(err.msg, "record 0: not a valid dsec.v1.TraceRecord (field number 0)");
    assert_int_equal(dsec_trace_read(r, &rec, &err), -1);
    assert_string_equal(err.msg, "record 1: not a valid dsec.v1.TraceRecord (field number 0)");
    assert_null(rec);
    dsec_record_reader_free(r);

    Dsec__V1__TraceHeader *h;
    r = dsec_record_reader_new_mem("DSECTRC9\x00", 9, 0);
    assert_int_equal(dsec_trace_read_header(r, &h, &err), -1);
    assert_string_equal(err.msg, "trace: bad magic: not a dsec trace file");
    dsec_record_reader_free(r);
    r = dsec_record_reader_new_mem("DSECTRC1", 8, 0);
    assert_int_equal(dsec_trace_read_header(r, &h, &err), -1);
    assert_string_equal(err.msg, "trace: no header after the magic");
    dsec_record_reader_free(r);
    r = dsec_record_reader_new_mem("DSECTRC1\x02\x08\x02", 11, 0);
    assert_int_equal(dsec_trace_read_header(r, &h, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    assert_string_equal(err.msg, "trace: format_version 2 is newer than this reader (1)");
    dsec_record_reader_free(r);
}

static void write_errors_are_io(void **state)
{
    /* /dev/full: a buffered write fails at the flush, a big one at once. */
    FILE *f = fopen("/dev/full", "w");
    assert_non_null(f);
    dsec_record_writer *w = dsec_record_writer_new_file(f, 0);
    dsec_err err;
    assert_int_equal(dsec_record_write_raw(w, "abc", 3, &err), 0);
    assert_int_equal(dsec_record_writer_flush(w, &err), -1);
    assert_int_equal(err.code, DSEC_E_IO);
    assert_int_equal(err.errnum, ENOSPC);
    assert_string_equal(err.msg, "record: flushing: No space left on device");
    static uint8_t big[1 << 16];
    assert_int_equal(dsec_record_write_raw(w, big, sizeof big, &err), -1);
    assert_int_equal(err.code, DSEC_E_IO);
    assert_int_equal(err.errnum, ENOSPC);
    dsec_record_writer_free(w);
    fclose(f);

    /* A repeated string with a NULL item is refused before anything is written. */
    dsec_buf b;
    dsec_buf_init(&b);
    w = dsec_record_writer_new_buf(&b, 0);
    char *no_layers[] = {NULL};
    Dsec__V1__TraceCreate c;
    dsec__v1__trace_create__init(&c);
    c.n_layers = 1;
    c.layers = no_layers;
    assert_int_equal(dsec_record_write(w, &c.base, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_string_equal(err.msg, "record: dsec.v1.TraceCreate has a NULL or missing field");
    assert_int_equal(b.len, 0);
    dsec_record_writer_free(w);
    dsec_buf_release(&b);
}

/* The plain structs other modules use: what one writes, the other reads back field for field,
 * and the protobuf side reads the same bytes (they are the same messages). */
static void plain_structs_round_trip(void **state)
{
    (void)state;
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_record_writer *w = dsec_record_writer_new_buf(&b, 0);
    dsec_err err;
    dsec_record_kv pmeta[] = {{"cell", "c1"}, {"seed", "7"}};
    dsec_trace_header h = {.format_version = DSEC_TRACE_FORMAT_VERSION,
                           .created_ns = 42,
                           .source = "test",
                           .n_metadata = 2,
                           .metadata = pmeta};
    assert_int_equal(dsec_trace_header_write(w, &h, &err), 0);
    char *players[] = {"sha256:aa", "sha256:bb"};
    dsec_trace_create c = {.type = "container",
                           .cpu_milli = 500,
                           .memory_mb = 64,
                           .lifetime_s = 9,
                           .cpu_use_fraction = 0.25,
                           .n_layers = 2,
                           .layers = players,
                           .job_id = "j1",
                           .class_ = "rollout"};
    uint8_t ppayload[] = {0x81, 0xa1, 'a', 0x01};
    dsec_trace_record tr = {.ts_ns = 99,
                            .subject = "dsec.v1.t.create",
                            .msg_type = "create",
                            .payload = {sizeof ppayload, ppayload},
                            .create = &c,
                            .expects_reply = true}; /* req_id NULL: written as "" */
    assert_int_equal(dsec_trace_record_write(w, &tr, &err), 0);
    dsec_trace_record plain = {.ts_ns = 100, .subject = "dsec.v1.t.sbx.n.i.op", .msg_type = "op"};
    assert_int_equal(dsec_trace_record_write(w, &plain, &err), 0);
    char *argv[] = {"sh", "-c", "echo hi"};
    uint8_t hash[32] = {1, 2, 3};
    dsec_traj_record jr = {.rollout_id = "r1",
                           .step = 3,
                           .req_id = "q",
                           .sandbox_id = "s",
                           .n_argv = 3,
                           .argv = argv,
                           .exit_code = -1,
                           .stdout_data = {3, (uint8_t *)"hi\n"},
                           .ts_ns = 5,
                           .duration_us = 6,
                           .request_hash = {32, hash},
                           .hash_alg = "sha256",
                           .signal = 9,
                           .timed_out = true,
                           .stderr_truncated = true};
    assert_int_equal(dsec_traj_record_write(w, &jr, &err), 0);
    dsec_record_writer_free(w);

    dsec_record_reader *r = dsec_record_reader_new_mem(b.data, b.len, 0);
    dsec_trace_header *gh;
    assert_int_equal(dsec_trace_header_read(r, &gh, &err), 0);
    assert_int_equal(gh->created_ns, 42);
    assert_string_equal(gh->source, "test");
    assert_int_equal(gh->n_metadata, 2);
    assert_string_equal(gh->metadata[1].key, "seed");
    assert_string_equal(gh->metadata[1].value, "7");
    dsec_trace_header_free(gh);
    dsec_trace_record *g;
    assert_int_equal(dsec_trace_record_read(r, &g, &err), 1);
    assert_int_equal(g->ts_ns, 99);
    assert_string_equal(g->subject, "dsec.v1.t.create");
    assert_string_equal(g->req_id, "");
    assert_true(g->expects_reply);
    assert_int_equal(g->payload.len, sizeof ppayload);
    assert_memory_equal(g->payload.data, ppayload, sizeof ppayload);
    assert_non_null(g->create);
    assert_string_equal(g->create->type, "container");
    assert_int_equal(g->create->memory_mb, 64);
    assert_true(g->create->cpu_use_fraction == 0.25);
    assert_int_equal(g->create->n_layers, 2);
    assert_string_equal(g->create->layers[1], "sha256:bb");
    assert_string_equal(g->create->class_, "rollout");
    dsec_trace_record_free(g);
    assert_int_equal(dsec_trace_record_read(r, &g, &err), 1);
    assert_null(g->create);
    assert_string_equal(g->msg_type, "op");
    dsec_trace_record_free(g);
    /* the trajectory record as the protobuf reader sees it */
    Dsec__V1__TrajectoryRecord *pb;
    uint64_t at = dsec_record_reader_offset(r);
    assert_int_equal(dsec_trajectory_read(r, &pb, &err), 1);
    assert_string_equal(pb->rollout_id, "r1");
    assert_int_equal(pb->n_argv, 3);
    assert_int_equal(pb->exit_code, -1);
    dsec_record_msg_free(&pb->base);
    assert_int_equal(dsec_trace_record_read(r, &g, &err), 0);
    dsec_record_reader_free(r);
    /* and through the plain decoder, from its bytes */
    dsec_traj_record *gj;
    assert_int_equal(dsec_traj_record_decode(b.data + at, b.len - at, &gj, &err), 0);
    assert_string_equal(gj->rollout_id, "r1");
    assert_int_equal(gj->step, 3);
    assert_string_equal(gj->argv[2], "echo hi");
    assert_int_equal(gj->stdout_data.len, 3);
    assert_memory_equal(gj->stdout_data.data, "hi\n", 3);
    assert_memory_equal(gj->request_hash.data, hash, 32);
    assert_int_equal(gj->signal, 9);
    assert_true(gj->timed_out && gj->stderr_truncated && !gj->stdout_truncated);
    dsec_traj_record_free(gj);
    /* garbage is a decode error, not a record */
    assert_int_equal(dsec_traj_record_decode("\x05\xff\xff", 3, &gj, &err), -1);
    assert_int_equal(err.code, DSEC_E_DECODE);
    assert_null(gj);
    dsec_buf_release(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(trace_round_trip_in_memory),
        cmocka_unit_test(trace_round_trip_in_a_file),
        cmocka_unit_test(trajectory_round_trip),
        cmocka_unit_test(plain_structs_round_trip),
        cmocka_unit_test(framing_is_protobuf_delimited),
        cmocka_unit_test(truncated_at_every_length),
        cmocka_unit_test(truncation_messages),
        cmocka_unit_test(oversize_records),
        cmocka_unit_test(bad_framing_and_bodies),
        cmocka_unit_test(write_errors_are_io),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
