/* test_codecs_msg.c - wire messages: schemas, round trips, every way decoding fails. */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "codecs/msg.h"
#include "codecs/testkit.h"
#include "dsec/alloc.h"
#include "dsec/err.h"

/* ---- a hand-written msgpack builder: tests must not trust the encoder ---------- */

static void raw(dsec_buf *b, const void *p, size_t n)
{
    assert_int_equal(dsec_buf_append(b, p, n, NULL), 0);
}

static void byte(dsec_buf *b, uint8_t c)
{
    raw(b, &c, 1);
}

static void be(dsec_buf *b, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--)
        byte(b, (uint8_t)(v >> (8 * i)));
}

static void mp_map(dsec_buf *b, uint32_t n)
{
    if (n < 16) {
        byte(b, (uint8_t)(0x80 | n));
    } else if (n < 65536) {
        byte(b, 0xde);
        be(b, n, 2);
    } else {
        byte(b, 0xdf);
        be(b, n, 4);
    }
}

static void mp_arr(dsec_buf *b, uint32_t n)
{
    if (n < 16) {
        byte(b, (uint8_t)(0x90 | n));
    } else if (n < 65536) {
        byte(b, 0xdc);
        be(b, n, 2);
    } else {
        byte(b, 0xdd);
        be(b, n, 4);
    }
}

static void mp_strn(dsec_buf *b, const char *s, size_t n)
{
    if (n < 32) {
        byte(b, (uint8_t)(0xa0 | n));
    } else if (n < 256) {
        byte(b, 0xd9);
        be(b, n, 1);
    } else if (n < 65536) {
        byte(b, 0xda);
        be(b, n, 2);
    } else {
        byte(b, 0xdb);
        be(b, n, 4);
    }
    raw(b, s, n);
}

static void mp_str(dsec_buf *b, const char *s)
{
    mp_strn(b, s, strlen(s));
}

static void mp_uint(dsec_buf *b, uint64_t v)
{
    if (v < 128) {
        byte(b, (uint8_t)v);
    } else {
        byte(b, 0xcf);
        be(b, v, 8);
    }
}

static void mp_int(dsec_buf *b, int64_t v)
{
    if (v >= 0) {
        mp_uint(b, (uint64_t)v);
    } else if (v >= -32) {
        byte(b, (uint8_t)(int8_t)v);
    } else {
        byte(b, 0xd3);
        be(b, (uint64_t)v, 8);
    }
}

static void mp_bin(dsec_buf *b, const void *p, size_t n)
{
    byte(b, 0xc6);
    be(b, n, 4);
    raw(b, p, n);
}

/* "key": value helpers for maps */
static void kv_str(dsec_buf *b, const char *k, const char *v)
{
    mp_str(b, k);
    mp_str(b, v);
}

static void kv_uint(dsec_buf *b, const char *k, uint64_t v)
{
    mp_str(b, k);
    mp_uint(b, v);
}

/* ---- fixtures ------------------------------------------------------------------ */

static dsec_decoder *D;
static dsec_buf B;   /* the payload under test */
static dsec_buf ENC; /* encoder output */

static int setup(void **state)
{
    D = dsec_decoder_new(NULL);
    dsec_buf_init(&B);
    dsec_buf_init(&ENC);
    return D == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    dsec_decoder_free(D);
    dsec_buf_release(&B);
    dsec_buf_release(&ENC);
    return 0;
}

static int reset(void **state)
{
    B.len = 0;
    ENC.len = 0;
    return 0;
}

typedef union anymsg {
    dsec_msg_create create;
    dsec_msg_place place;
    dsec_msg_exec exec;
    dsec_msg_exec_result exec_result;
    dsec_msg_capacity capacity;
    dsec_msg_file_list_reply file_list_reply;
    unsigned char bytes[512];
} anymsg;

static void expect_ok(int type, const dsec_buf *in, anymsg *out)
{
    dsec_err err;
    dsec_err_clear(&err);
    int rc = dsec_decode(D, type, in->data, in->len, out, &err);
    if (rc != 0)
        fail_msg("decode %s: %s", dsec_msg_type_name(type), err.msg);
    assert_string_equal(dsec_decoder_bad_field(D), "");
}

/* Decoding in fails with exactly this code, message and field, and leaves
 * no half-filled struct behind. */
static void expect_fail(int type, const dsec_buf *in, int code, const char *msg, const char *field)
{
    anymsg out;
    memset(&out, 0xaa, sizeof out);
    dsec_err err;
    dsec_err_clear(&err);
    assert_int_equal(dsec_decode(D, type, in->data, in->len, &out, &err), -1);
    assert_string_equal(err.msg, msg);
    assert_int_equal(err.code, code);
    assert_string_equal(dsec_decoder_bad_field(D), field);
    const dsec_schema *s = dsec_schema_of(type);
    for (size_t i = 0; s != NULL && i < s->size; i++)
        assert_int_equal(out.bytes[i], 0);
}

static void encode_ok(int type, const void *msg, dsec_buf *out)
{
    dsec_err err;
    dsec_err_clear(&err);
    if (dsec_encode(out, type, msg, &err) != 0)
        fail_msg("encode %s: %s", dsec_msg_type_name(type), err.msg);
}

static void encode_fails(int type, const void *msg, const char *want)
{
    dsec_err err;
    dsec_err_clear(&err);
    assert_int_equal(dsec_encode(&ENC, type, msg, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_string_equal(err.msg, want);
    assert_int_equal(ENC.len, 0);
}

/* A create map with req_id "r" and room for `extra` more entries. */
static void create_head(dsec_buf *b, uint32_t extra)
{
    mp_map(b, 1 + extra);
    kv_str(b, "req_id", "r");
}

/* ---- schemas --------------------------------------------------------------------- */

static void schemas_are_consistent(void **state)
{
    for (int t = DSEC_MSG_NONE + 1; t < DSEC_MSG_TYPE_MAX_; t++) {
        const dsec_schema *s = dsec_schema_of(t);
        assert_non_null(s);
        assert_int_equal(s->type, t);
        assert_int_equal(dsec_msg_type_from_name(s->name), t);
        assert_string_equal(dsec_msg_type_name(t), s->name);
        assert_true(s->nfields > 0 && s->nfields <= 64);
        assert_true(s->size <= sizeof(anymsg));
        for (size_t i = 0; i < s->nfields; i++) {
            const dsec_field *f = &s->fields[i];
            assert_true(f->offset < s->size);
            assert_non_null(f->doc);
            assert_true(f->min <= f->max);
            if (f->kind == DSEC_F_U64)
                assert_true(f->min >= 0);
            if (f->kind == DSEC_F_LIST)
                assert_non_null(dsec_schema_of(f->sub_type));
            for (size_t j = 0; j < i; j++)
                assert_string_not_equal(f->name, s->fields[j].name);
        }
    }
    assert_null(dsec_schema_of(DSEC_MSG_NONE));
    assert_null(dsec_schema_of(DSEC_MSG_TYPE_MAX_));
    assert_null(dsec_schema_of(-1));
    assert_int_equal(dsec_msg_type_from_name("nope"), DSEC_MSG_NONE);
    assert_int_equal(dsec_msg_type_from_name(NULL), DSEC_MSG_NONE);
    assert_string_equal(dsec_msg_type_name(999), "none");
}

static const dsec_field *field_of(int type, const char *name)
{
    const dsec_schema *s = dsec_schema_of(type);
    for (size_t i = 0; i < s->nfields; i++)
        if (strcmp(s->fields[i].name, name) == 0)
            return &s->fields[i];
    return NULL;
}

static void schemas_use_wire_names_and_limits(void **state)
{
    /* The renamed members, the flattened place, the required set, some limits. */
    assert_int_equal(field_of(DSEC_MSG_CREATE, "class")->offset, offsetof(dsec_msg_create, cls));
    assert_null(field_of(DSEC_MSG_CREATE, "cls"));
    assert_int_equal(field_of(DSEC_MSG_EXEC, "stdin")->offset, offsetof(dsec_msg_exec, stdin_data));
    assert_int_equal(field_of(DSEC_MSG_EXEC_RESULT, "stdout")->offset,
                     offsetof(dsec_msg_exec_result, stdout_data));
    assert_int_equal(field_of(DSEC_MSG_EXEC_RESULT, "stderr")->offset,
                     offsetof(dsec_msg_exec_result, stderr_data));
    assert_int_equal(field_of(DSEC_MSG_PLACE, "memory_mb")->offset,
                     offsetof(dsec_msg_place, c.memory_mb));
    assert_int_equal(dsec_schema_of(DSEC_MSG_PLACE)->nfields,
                     dsec_schema_of(DSEC_MSG_CREATE)->nfields + 14);
    /* disk travels like memory: free in every capacity report, total in full ones, and
     * the node's free disk in a refusal for room */
    assert_int_equal(field_of(DSEC_MSG_CAPACITY, "disk_free_mb")->offset,
                     offsetof(dsec_msg_capacity, disk_free_mb));
    assert_int_equal(field_of(DSEC_MSG_CAPACITY, "disk_mb")->offset,
                     offsetof(dsec_msg_capacity, disk_mb));
    assert_int_equal(field_of(DSEC_MSG_PLACE, "free_disk_mb")->offset,
                     offsetof(dsec_msg_place, free_disk_mb));
    assert_true(field_of(DSEC_MSG_PLACE, "req_id")->required);
    assert_true(field_of(DSEC_MSG_PLACE, "reply_to")->required);
    assert_true(field_of(DSEC_MSG_CAPACITY, "seq")->required);
    assert_false(field_of(DSEC_MSG_EXEC, "argv")->required); /* empty: the default command */
    assert_false(field_of(DSEC_MSG_CREATE, "tenant")->required);
    assert_int_equal(field_of(DSEC_MSG_CREATE, "req_id")->max_len, 64);
    assert_int_equal(field_of(DSEC_MSG_EXEC, "argv")->max_len, 4096);
    assert_int_equal(field_of(DSEC_MSG_FILE_READ, "path")->max_len, 4096);
    assert_int_equal(field_of(DSEC_MSG_ERROR, "message")->max_len, 4096);
    assert_int_equal(field_of(DSEC_MSG_CREATE, "memory_mb")->max, 16777216);
    assert_int_equal(field_of(DSEC_MSG_OP, "n")->min, 1);
    assert_int_equal(field_of(DSEC_MSG_EXEC_RESULT, "exit_code")->min, -1);
    assert_int_equal(field_of(DSEC_MSG_PLACE, "hops")->max, 16);

    dsec_codec_limits lim;
    dsec_codec_limits_default(&lim);
    assert_int_equal(lim.max_payload, 8 << 20);
    assert_int_equal(lim.max_str, 4096);
    assert_int_equal(lim.max_bin, 8 << 20);
    assert_int_equal(lim.max_items, 65536);
}

/* ---- round trips ------------------------------------------------------------------ */

static void every_type_round_trips(void **state)
{
    dsec_buf again;
    dsec_buf_init(&again);
    for (int t = DSEC_MSG_NONE + 1; t < DSEC_MSG_TYPE_MAX_; t++) {
        anymsg sample, out;
        assert_true(dsec_testkit_sample(t, &sample));
        encode_ok(t, &sample, &ENC);
        expect_ok(t, &ENC, &out);
        if (!dsec_msg_equal(t, &sample, &out))
            fail_msg("%s changed in a round trip", dsec_msg_type_name(t));
        encode_ok(t, &out, &again);
        assert_int_equal(again.len, ENC.len);
        assert_memory_equal(again.data, ENC.data, ENC.len);
    }
    dsec_buf_release(&again);
}

static void round_trip_keeps_bins_lists_and_maps(void **state)
{
    anymsg s, out;
    dsec_testkit_sample(DSEC_MSG_EXEC, &s);
    encode_ok(DSEC_MSG_EXEC, &s, &ENC);
    expect_ok(DSEC_MSG_EXEC, &ENC, &out);
    static const uint8_t stdin_b[] = {0, 'a', 0, 'b', 0xff, 0};
    assert_int_equal(out.exec.stdin_data.len, sizeof stdin_b);
    assert_memory_equal(out.exec.stdin_data.ptr, stdin_b, sizeof stdin_b);
    /* Binary is decoded in place: it points into the input. */
    assert_true(out.exec.stdin_data.ptr > (const uint8_t *)ENC.data &&
                out.exec.stdin_data.ptr < (const uint8_t *)ENC.data + ENC.len);
    assert_int_equal(out.exec.argv.n, 4);
    assert_string_equal(out.exec.argv.v[2], "echo \"héllo\"\tworld\n");
    assert_string_equal(out.exec.argv.v[3], "");
    assert_int_equal(out.exec.env.n, 2);
    assert_string_equal(out.exec.env.k[1], "LANG");
    assert_string_equal(out.exec.env.v[1], "C.UTF-8");
    assert_int_equal(out.exec.step, 17);

    dsec_testkit_sample(DSEC_MSG_FILE_LIST_REPLY, &s);
    encode_ok(DSEC_MSG_FILE_LIST_REPLY, &s, &ENC);
    expect_ok(DSEC_MSG_FILE_LIST_REPLY, &ENC, &out);
    assert_int_equal(out.file_list_reply.entries.n, 3);
    const dsec_msg_file_entry *e = out.file_list_reply.entries.items;
    assert_string_equal(e[1].name, "dir");
    assert_int_equal(e[1].mtime, -1);
    assert_string_equal(e[2].name, "ünïcode link");
    assert_int_equal(e[2].mode, 0777);

    dsec_testkit_sample(DSEC_MSG_EXEC_RESULT, &s);
    encode_ok(DSEC_MSG_EXEC_RESULT, &s, &ENC);
    expect_ok(DSEC_MSG_EXEC_RESULT, &ENC, &out);
    assert_int_equal(out.exec_result.exit_code, -1);
    assert_int_equal(out.exec_result.signal, 64);
    assert_int_equal(out.exec_result.stderr_data.len, 3);
    assert_true(out.exec_result.timed_out);
}

static void wire_names_and_flattened_place(void **state)
{
    anymsg s, out;
    dsec_buf json;
    dsec_buf_init(&json);
    dsec_testkit_sample(DSEC_MSG_PLACE, &s);
    encode_ok(DSEC_MSG_PLACE, &s, &ENC);
    assert_int_equal(dsec_msgpack_to_json(&json, ENC.data, ENC.len, NULL), 0);
    dsec_buf_append(&json, "", 1, NULL);
    assert_non_null(strstr(json.data, "{\"req_id\":\"req-0123456789abcdef\","));
    assert_non_null(strstr(json.data, "\"class\":\"rollout\""));
    assert_non_null(strstr(json.data, "\"reply_to\":\"_INBOX.abc.def\""));
    assert_null(strstr(json.data, "\"cls\""));
    assert_null(strstr(json.data, "\"c\""));
    /* A create decoder reads the flattened create fields of a place. */
    expect_ok(DSEC_MSG_CREATE, &ENC, &out);
    assert_true(dsec_msg_equal(DSEC_MSG_CREATE, &out.create, &s.place.c));

    dsec_testkit_sample(DSEC_MSG_EXEC_RESULT, &s);
    encode_ok(DSEC_MSG_EXEC_RESULT, &s, &ENC);
    assert_int_equal(dsec_msgpack_to_json(&json, ENC.data, ENC.len, NULL), 0);
    dsec_buf_append(&json, "", 1, NULL);
    assert_non_null(strstr(json.data, "\"stdout\":{\"$bin\":"));
    assert_non_null(strstr(json.data, "\"stderr\":{\"$bin\":\"AAAA\"}"));
    dsec_buf_release(&json);
}

static void optional_zero_fields_are_omitted(void **state)
{
    dsec_msg_create c = {.req_id = "r", .tenant = "", .labels = {.n = 0}};
    encode_ok(DSEC_MSG_CREATE, &c, &ENC);
    static const uint8_t want[] = {0x81, 0xa6, 'r', 'e', 'q', '_', 'i', 'd', 0xa1, 'r'};
    assert_int_equal(ENC.len, sizeof want);
    assert_memory_equal(ENC.data, want, sizeof want);

    /* A required integer is written even when zero. */
    dsec_msg_pong p = {.seq = 0};
    encode_ok(DSEC_MSG_PONG, &p, &ENC);
    static const uint8_t pong[] = {0x81, 0xa3, 's', 'e', 'q', 0x00};
    assert_int_equal(ENC.len, sizeof pong);
    assert_memory_equal(ENC.data, pong, sizeof pong);
}

static void msg_equal_sees_differences(void **state)
{
    anymsg a, b;
    dsec_testkit_sample(DSEC_MSG_CAPACITY, &a);
    dsec_testkit_sample(DSEC_MSG_CAPACITY, &b);
    assert_true(dsec_msg_equal(DSEC_MSG_CAPACITY, &a, &b));
    b.capacity.live++;
    assert_false(dsec_msg_equal(DSEC_MSG_CAPACITY, &a, &b));
    dsec_testkit_sample(DSEC_MSG_CAPACITY, &b);
    b.capacity.layers.n--;
    assert_false(dsec_msg_equal(DSEC_MSG_CAPACITY, &a, &b));
    dsec_testkit_sample(DSEC_MSG_CAPACITY, &b);
    b.capacity.cell = NULL;
    assert_false(dsec_msg_equal(DSEC_MSG_CAPACITY, &a, &b));
    a.capacity.cell = "";
    assert_true(dsec_msg_equal(DSEC_MSG_CAPACITY, &a, &b)); /* both omitted on the wire */
    assert_false(dsec_msg_equal(DSEC_MSG_NONE, &a, &b));
}

static void decoder_reuses_its_storage(void **state)
{
    anymsg s, out;
    dsec_testkit_sample(DSEC_MSG_CREATE, &s);
    encode_ok(DSEC_MSG_CREATE, &s, &ENC);
    expect_ok(DSEC_MSG_CREATE, &ENC, &out);
    const char *first = out.create.req_id;
    const char **labels = out.create.labels.k;
    expect_ok(DSEC_MSG_CREATE, &ENC, &out);
    /* Same arena, reset: the second message lands where the first was. */
    assert_ptr_equal(out.create.req_id, first);
    assert_ptr_equal(out.create.labels.k, labels);

    /* A message bigger than the arena's chunk, then small ones again. */
    mp_map(&B, 2);
    kv_str(&B, "id", "sbx");
    mp_str(&B, "argv");
    mp_arr(&B, 4096);
    char arg[200];
    memset(arg, 'x', sizeof arg);
    for (int i = 0; i < 4096; i++)
        mp_strn(&B, arg, sizeof arg);
    expect_ok(DSEC_MSG_EXEC, &B, &out);
    assert_int_equal(out.exec.argv.n, 4096);
    assert_int_equal(strlen(out.exec.argv.v[4095]), sizeof arg);
    for (int i = 0; i < 3; i++) {
        expect_ok(DSEC_MSG_EXEC, &B, &out);
        assert_int_equal(out.exec.argv.v[100][199], 'x');
        expect_ok(DSEC_MSG_CREATE, &ENC, &out);
        assert_string_equal(out.create.req_id, "req-0123456789abcdef");
    }
}

/* ---- integer encodings ------------------------------------------------------------ */

static void integers_accept_any_encoding_in_range(void **state)
{
    anymsg out;
    /* int8 5 in a U64 field, uint16 in I64, int64 -1 in I64. */
    create_head(&B, 2);
    mp_str(&B, "cpu_milli");
    raw(&B, "\xd0\x05", 2);
    mp_str(&B, "priority");
    raw(&B, "\xcd\x01\x00", 3);
    expect_ok(DSEC_MSG_CREATE, &B, &out);
    assert_int_equal(out.create.cpu_milli, 5);
    assert_int_equal(out.create.priority, 256);

    B.len = 0;
    mp_map(&B, 3);
    kv_str(&B, "id", "x");
    mp_str(&B, "exit_code");
    raw(&B, "\xd3\xff\xff\xff\xff\xff\xff\xff\xff", 9);
    mp_str(&B, "signal");
    raw(&B, "\xd3\x00\x00\x00\x00\x00\x00\x00\x09", 9);
    expect_ok(DSEC_MSG_EXEC_RESULT, &B, &out);
    assert_int_equal(out.exec_result.exit_code, -1);
    assert_int_equal(out.exec_result.signal, 9);

    B.len = 0;
    mp_map(&B, 1);
    kv_uint(&B, "seq", UINT64_MAX);
    expect_ok(DSEC_MSG_PING, &B, &out);
    assert_true(((dsec_msg_ping *)&out)->seq == UINT64_MAX);
}

/* ---- malformed input ----------------------------------------------------------------- */

static void unknown_type_is_refused(void **state)
{
    anymsg out;
    dsec_err err;
    create_head(&B, 0);
    assert_int_equal(dsec_decode(D, 999, B.data, B.len, &out, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_string_equal(err.msg, "decode: unknown message type 999");
    assert_int_equal(dsec_decode(D, DSEC_MSG_NONE, B.data, B.len, &out, &err), -1);
    assert_string_equal(err.msg, "decode: unknown message type 0");
    assert_int_equal(dsec_encode(&ENC, DSEC_MSG_TYPE_MAX_, &out, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    char want[64];
    snprintf(want, sizeof want, "encode: unknown message type %d", DSEC_MSG_TYPE_MAX_);
    assert_string_equal(err.msg, want);
}

static void missing_required_field(void **state)
{
    mp_map(&B, 1);
    kv_str(&B, "tenant", "t");
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE, "field \"req_id\": missing (required)",
                "req_id");
    B.len = 0;
    mp_map(&B, 1);
    kv_str(&B, "cwd", "/");
    expect_fail(DSEC_MSG_EXEC, &B, DSEC_E_DECODE, "field \"id\": missing (required)", "id");
    B.len = 0;
    mp_map(&B, 0);
    expect_fail(DSEC_MSG_PING, &B, DSEC_E_DECODE, "field \"seq\": missing (required)", "seq");
    /* place requires the create's req_id too */
    B.len = 0;
    mp_map(&B, 1);
    kv_str(&B, "reply_to", "_INBOX.x");
    expect_fail(DSEC_MSG_PLACE, &B, DSEC_E_DECODE, "field \"req_id\": missing (required)",
                "req_id");
}

static void required_field_may_not_be_empty(void **state)
{
    mp_map(&B, 1);
    kv_str(&B, "req_id", "");
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE, "field \"req_id\": empty (required)", "req_id");
    B.len = 0;
    mp_map(&B, 2);
    kv_str(&B, "id", "");
    mp_str(&B, "argv");
    mp_arr(&B, 0);
    expect_fail(DSEC_MSG_EXEC, &B, DSEC_E_DECODE, "field \"id\": empty (required)", "id");
    /* an exec's argv may be empty or absent: the environment's default command runs */
    B.len = 0;
    mp_map(&B, 2);
    kv_str(&B, "id", "x");
    mp_str(&B, "argv");
    mp_arr(&B, 0);
    dsec_msg_exec x;
    dsec_err err;
    assert_int_equal(dsec_decode(D, DSEC_MSG_EXEC, B.data, B.len, &x, &err), 0);
    assert_int_equal(x.argv.n, 0);
}

static void wrong_types(void **state)
{
    create_head(&B, 1);
    kv_str(&B, "memory_mb", "lots");
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "field \"memory_mb\": expected unsigned integer, got string", "memory_mb");
    B.len = 0;
    create_head(&B, 1);
    mp_str(&B, "cpu_milli");
    mp_int(&B, -5);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "field \"cpu_milli\": expected unsigned integer, got negative integer",
                "cpu_milli");
    B.len = 0;
    create_head(&B, 1);
    mp_str(&B, "tenant");
    mp_uint(&B, 7);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "field \"tenant\": expected string, got unsigned integer", "tenant");
    B.len = 0;
    create_head(&B, 1);
    mp_str(&B, "cell");
    byte(&B, 0xc0);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE, "field \"cell\": expected string, got nil",
                "cell");
    B.len = 0;
    create_head(&B, 1);
    mp_str(&B, "priority");
    raw(&B, "\xcb\x3f\xf0\0\0\0\0\0\0", 9);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "field \"priority\": expected integer, got float", "priority");
    B.len = 0;
    create_head(&B, 1);
    kv_str(&B, "labels", "a=b");
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "field \"labels\": expected map of strings, got string", "labels");
    B.len = 0;
    create_head(&B, 1);
    mp_str(&B, "requires");
    mp_arr(&B, 2);
    mp_str(&B, "gui");
    mp_uint(&B, 1);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "field \"requires\": item 1: expected string, got unsigned integer", "requires");
    B.len = 0;
    create_head(&B, 1);
    mp_str(&B, "labels");
    mp_map(&B, 1);
    mp_str(&B, "k");
    byte(&B, 0xc3);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "field \"labels\": value 0: expected string, got boolean", "labels");
}

static void bools_and_bins_are_strict(void **state)
{
    mp_map(&B, 4);
    kv_str(&B, "id", "n1-0000000000000001");
    kv_str(&B, "node", "n1");
    kv_str(&B, "type", "sim");
    kv_uint(&B, "existing", 1);
    expect_fail(DSEC_MSG_CREATED, &B, DSEC_E_DECODE,
                "field \"existing\": expected boolean, got unsigned integer", "existing");
    B.len = 0;
    mp_map(&B, 3);
    kv_str(&B, "id", "x");
    kv_str(&B, "path", "/a");
    kv_str(&B, "data", "text");
    expect_fail(DSEC_MSG_FILE_WRITE, &B, DSEC_E_DECODE,
                "field \"data\": expected binary, got string", "data");
}

static void out_of_range_numbers(void **state)
{
    create_head(&B, 1);
    kv_uint(&B, "cpu_milli", 2000000);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "field \"cpu_milli\": 2000000 out of range 0..1000000", "cpu_milli");
    B.len = 0;
    create_head(&B, 1);
    kv_uint(&B, "memory_mb", 16777217);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "field \"memory_mb\": 16777217 out of range 0..16777216", "memory_mb");
    B.len = 0;
    create_head(&B, 1);
    kv_uint(&B, "hops", 17);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE, "field \"hops\": 17 out of range 0..16",
                "hops");
    B.len = 0;
    mp_map(&B, 3);
    kv_str(&B, "id", "x");
    kv_str(&B, "op", "fork");
    kv_uint(&B, "n", 0); /* present: must be 1..1024 */
    expect_fail(DSEC_MSG_OP, &B, DSEC_E_DECODE, "field \"n\": 0 out of range 1..1024", "n");
    B.len = 0;
    mp_map(&B, 2);
    kv_str(&B, "id", "x");
    mp_str(&B, "exit_code");
    mp_int(&B, -2);
    expect_fail(DSEC_MSG_EXEC_RESULT, &B, DSEC_E_DECODE,
                "field \"exit_code\": -2 out of range -1..255", "exit_code");
    B.len = 0;
    mp_map(&B, 2);
    kv_str(&B, "id", "x");
    kv_uint(&B, "signal", 65);
    expect_fail(DSEC_MSG_EXEC_RESULT, &B, DSEC_E_DECODE, "field \"signal\": 65 out of range 0..64",
                "signal");
    B.len = 0;
    create_head(&B, 1);
    kv_uint(&B, "priority", (uint64_t)INT64_MAX + 1);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "field \"priority\": 9223372036854775808 out of range for a signed integer",
                "priority");
}

static void oversize_fields(void **state)
{
    char big[5000];
    memset(big, 'a', sizeof big);
    mp_map(&B, 1);
    mp_str(&B, "req_id");
    mp_strn(&B, big, 65);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_TOO_LARGE,
                "field \"req_id\": 65 bytes exceeds limit 64", "req_id");
    B.len = 0;
    mp_map(&B, 2);
    kv_str(&B, "id", "x");
    mp_str(&B, "path");
    mp_strn(&B, big, 4097);
    expect_fail(DSEC_MSG_FILE_LIST, &B, DSEC_E_TOO_LARGE,
                "field \"path\": 4097 bytes exceeds limit 4096", "path");
    B.len = 0;
    mp_map(&B, 2);
    kv_str(&B, "id", "x");
    mp_str(&B, "argv");
    mp_arr(&B, 5000);
    for (int i = 0; i < 5000; i++)
        mp_str(&B, "a");
    expect_fail(DSEC_MSG_EXEC, &B, DSEC_E_TOO_LARGE,
                "field \"argv\": 5000 items exceeds limit 4096", "argv");
    B.len = 0;
    create_head(&B, 1);
    mp_str(&B, "requires");
    mp_arr(&B, 1);
    mp_strn(&B, big, 65);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_TOO_LARGE,
                "field \"requires\": item 0: 65 bytes exceeds limit 64", "requires");

    /* Bins and default limits come from the decoder's limits. */
    dsec_codec_limits lim = {.max_bin = 16, .max_str = 8};
    dsec_decoder *small = dsec_decoder_new(&lim);
    assert_non_null(small);
    B.len = 0;
    mp_map(&B, 3);
    kv_str(&B, "id", "x");
    kv_str(&B, "path", "/p");
    mp_str(&B, "data");
    mp_bin(&B, big, 17);
    anymsg out;
    dsec_err err;
    assert_int_equal(dsec_decode(small, DSEC_MSG_FILE_WRITE, B.data, B.len, &out, &err), -1);
    assert_int_equal(err.code, DSEC_E_TOO_LARGE);
    assert_string_equal(err.msg, "field \"data\": 17 bytes exceeds limit 16");
    assert_string_equal(dsec_decoder_bad_field(small), "data");
    B.len -= 17 + 5;
    mp_bin(&B, big, 16);
    assert_int_equal(dsec_decode(small, DSEC_MSG_FILE_WRITE, B.data, B.len, &out, &err), 0);
    dsec_decoder_free(small);
}

static void oversize_payload(void **state)
{
    dsec_codec_limits lim = {.max_payload = 32};
    dsec_decoder *small = dsec_decoder_new(&lim);
    assert_non_null(small);
    mp_map(&B, 2);
    kv_str(&B, "req_id", "r");
    kv_str(&B, "tenant", "a-rather-long-tenant-name");
    anymsg out;
    dsec_err err;
    assert_int_equal(dsec_decode(small, DSEC_MSG_CREATE, B.data, B.len, &out, &err), -1);
    assert_int_equal(err.code, DSEC_E_TOO_LARGE);
    char want[96];
    snprintf(want, sizeof want, "payload: %zu bytes exceeds limit 32", B.len);
    assert_string_equal(err.msg, want);
    dsec_decoder_free(small);
}

static void duplicate_keys(void **state)
{
    mp_map(&B, 2);
    kv_str(&B, "req_id", "r");
    kv_str(&B, "req_id", "s");
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE, "field \"req_id\": duplicate key", "req_id");
    /* Unknown keys too, and in a big map (the sorted path). */
    B.len = 0;
    mp_map(&B, 40);
    kv_str(&B, "req_id", "r");
    char k[16];
    for (int i = 0; i < 38; i++) {
        snprintf(k, sizeof k, "x%02d", i);
        kv_str(&B, k, "v");
    }
    kv_str(&B, "x17", "again");
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE, "field \"x17\": duplicate key", "x17");
    B.len = 0;
    create_head(&B, 1);
    mp_str(&B, "labels");
    mp_map(&B, 3);
    kv_str(&B, "a", "1");
    kv_str(&B, "b", "2");
    kv_str(&B, "a", "3");
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE, "field \"labels\": duplicate key \"a\"",
                "labels");
}

static void trailing_bytes(void **state)
{
    create_head(&B, 0);
    raw(&B, "\x01\x02\x03", 3);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE, "payload: 3 trailing bytes after the message",
                "");
    /* Two messages back to back are trailing bytes too. */
    B.len = 0;
    create_head(&B, 0);
    create_head(&B, 0);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE, "payload: 10 trailing bytes after the message",
                "");
}

static void truncated_at_every_length(void **state)
{
    for (int t = DSEC_MSG_NONE + 1; t < DSEC_MSG_TYPE_MAX_; t++) {
        anymsg s;
        dsec_testkit_sample(t, &s);
        encode_ok(t, &s, &ENC);
        for (size_t len = 0; len < ENC.len; len++) {
            anymsg out;
            dsec_err err;
            dsec_err_clear(&err);
            /* An exact-size copy, so ASan catches a read past the cut. */
            char *cut DSEC_AUTOFREE = dsec_malloc(len);
            memcpy(cut, ENC.data, len);
            assert_int_equal(dsec_decode(D, t, cut, len, &out, &err), -1);
            assert_int_equal(err.code, DSEC_E_DECODE);
            const char *want = len == 0 ? "payload: empty" : "payload: truncated";
            if (strncmp(err.msg, want, strlen(want)) != 0)
                fail_msg("%s cut at %zu: %s", dsec_msg_type_name(t), len, err.msg);
        }
    }
}

static void not_a_map(void **state)
{
    mp_arr(&B, 1);
    mp_str(&B, "req_id");
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE, "payload: not a msgpack map (got array)", "");
    B.len = 0;
    byte(&B, 0x07);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "payload: not a msgpack map (got unsigned integer)", "");
    B.len = 0;
    mp_map(&B, 2);
    kv_str(&B, "req_id", "r");
    mp_uint(&B, 3);
    mp_str(&B, "v");
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "payload: map key 1 is not a string (got unsigned integer)", "");
}

static void bad_strings(void **state)
{
    mp_map(&B, 1);
    mp_str(&B, "req_id");
    mp_strn(&B, "a\0b", 3);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE, "field \"req_id\": string contains a NUL byte",
                "req_id");
    B.len = 0;
    mp_map(&B, 2);
    kv_str(&B, "id", "x");
    mp_str(&B, "argv");
    mp_arr(&B, 2);
    mp_str(&B, "ls");
    mp_strn(&B, "-l\0", 3);
    expect_fail(DSEC_MSG_EXEC, &B, DSEC_E_DECODE,
                "field \"argv\": item 1: string contains a NUL byte", "argv");
    B.len = 0;
    mp_map(&B, 1);
    mp_str(&B, "req_id");
    mp_strn(&B, "\xc0\xaf", 2); /* overlong '/' */
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE, "field \"req_id\": string is not valid UTF-8",
                "req_id");
    B.len = 0;
    create_head(&B, 1);
    mp_str(&B, "labels");
    mp_map(&B, 1);
    mp_strn(&B, "\xed\xa0\x80", 3); /* a surrogate */
    mp_str(&B, "v");
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "field \"labels\": key 0: string is not valid UTF-8", "labels");
}

static void malformed_msgpack(void **state)
{
    byte(&B, 0xc1);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "payload: invalid msgpack type byte 0xc1 at byte 0", "");
    /* An array claiming 4 billion items in a few bytes must not allocate. */
    B.len = 0;
    create_head(&B, 1);
    mp_str(&B, "net");
    raw(&B, "\xdd\xff\xff\xff\xff\xa1x", 7);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "payload: truncated: array at byte 14 has 4294967295 items, 2 bytes remain", "");
    B.len = 0;
    create_head(&B, 1);
    mp_str(&B, "x");
    raw(&B, "\xdb\x7f\xff\xff\xff", 5);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "payload: truncated: string at byte 12 needs 2147483647 bytes, 0 remain", "");
    B.len = 0;
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE, "payload: empty", "");
}

static void nesting_is_bounded(void **state)
{
    /* An unknown field may nest, but not beyond DSEC_DECODE_MAX_DEPTH levels. */
    create_head(&B, 1);
    mp_str(&B, "future");
    for (int i = 0; i < DSEC_DECODE_MAX_DEPTH - 1; i++)
        mp_arr(&B, 1);
    mp_uint(&B, 1);
    anymsg out;
    expect_ok(DSEC_MSG_CREATE, &B, &out);
    B.len = 0;
    create_head(&B, 1);
    mp_str(&B, "future");
    for (int i = 0; i < DSEC_DECODE_MAX_DEPTH; i++)
        mp_arr(&B, 1);
    mp_uint(&B, 1);
    expect_fail(DSEC_MSG_CREATE, &B, DSEC_E_DECODE,
                "payload: array at byte 24 nests deeper than 8 levels", "");
}

static void unknown_fields_are_skipped(void **state)
{
    create_head(&B, 3);
    mp_str(&B, "future_map");
    mp_map(&B, 1);
    mp_uint(&B, 1); /* non-string keys are fine inside an unknown field */
    mp_arr(&B, 2);
    byte(&B, 0xc0);
    raw(&B, "\xd4\x01\x02", 3); /* fixext1 */
    kv_uint(&B, "future_int", 5);
    kv_uint(&B, "ttl_s", 60);
    anymsg out;
    expect_ok(DSEC_MSG_CREATE, &B, &out);
    assert_string_equal(out.create.req_id, "r");
    assert_int_equal(out.create.ttl_s, 60);

    /* ... but unknown fields are held to the container limit. */
    dsec_codec_limits lim = {.max_items = 4};
    dsec_decoder *small = dsec_decoder_new(&lim);
    assert_non_null(small);
    B.len = 0;
    create_head(&B, 1);
    mp_str(&B, "future");
    mp_arr(&B, 5);
    for (int i = 0; i < 5; i++)
        mp_uint(&B, (uint64_t)i);
    dsec_err err;
    assert_int_equal(dsec_decode(small, DSEC_MSG_CREATE, B.data, B.len, &out, &err), -1);
    assert_int_equal(err.code, DSEC_E_TOO_LARGE);
    assert_string_equal(err.msg, "field \"future\": unknown field holds a container over 4 items");
    dsec_decoder_free(small);
}

static void list_items_name_their_index(void **state)
{
    mp_map(&B, 2);
    kv_str(&B, "id", "x");
    mp_str(&B, "entries");
    mp_arr(&B, 2);
    mp_map(&B, 1);
    kv_str(&B, "name", "ok");
    mp_map(&B, 1);
    kv_str(&B, "kind", "file");
    expect_fail(DSEC_MSG_FILE_LIST_REPLY, &B, DSEC_E_DECODE,
                "field \"entries[1].name\": missing (required)", "entries[1].name");
    B.len = 0;
    mp_map(&B, 2);
    kv_str(&B, "id", "x");
    mp_str(&B, "entries");
    mp_arr(&B, 1);
    mp_map(&B, 2);
    kv_str(&B, "name", "a");
    kv_str(&B, "size", "big");
    expect_fail(DSEC_MSG_FILE_LIST_REPLY, &B, DSEC_E_DECODE,
                "field \"entries[0].size\": expected unsigned integer, got string",
                "entries[0].size");
    B.len = 0;
    mp_map(&B, 2);
    kv_str(&B, "id", "x");
    mp_str(&B, "entries");
    mp_arr(&B, 1);
    mp_str(&B, "a");
    expect_fail(DSEC_MSG_FILE_LIST_REPLY, &B, DSEC_E_DECODE,
                "field \"entries\": item 0: expected map, got string", "entries");
    B.len = 0;
    mp_map(&B, 2);
    kv_str(&B, "id", "x");
    mp_str(&B, "entries");
    mp_arr(&B, 1);
    mp_map(&B, 1);
    mp_uint(&B, 1);
    mp_uint(&B, 2);
    expect_fail(DSEC_MSG_FILE_LIST_REPLY, &B, DSEC_E_DECODE,
                "field \"entries[0]\": map key 0 is not a string (got unsigned integer)",
                "entries[0]");
}

static void bad_field_clears_on_success(void **state)
{
    mp_map(&B, 0);
    expect_fail(DSEC_MSG_HEARTBEAT, &B, DSEC_E_DECODE, "field \"node\": missing (required)",
                "node");
    B.len = 0;
    mp_map(&B, 1);
    kv_str(&B, "node", "n1");
    anymsg out;
    expect_ok(DSEC_MSG_HEARTBEAT, &B, &out);
    assert_string_equal(dsec_decoder_bad_field(NULL), "");
}

/* ---- encoder validation ------------------------------------------------------------ */

static void encoder_refuses_what_decoder_would(void **state)
{
    dsec_msg_create c = {.tenant = "t"};
    encode_fails(DSEC_MSG_CREATE, &c, "field \"req_id\": missing (required)");
    c.req_id = "";
    encode_fails(DSEC_MSG_CREATE, &c, "field \"req_id\": empty (required)");
    c.req_id = "r";
    c.cpu_milli = 1000001;
    encode_fails(DSEC_MSG_CREATE, &c, "field \"cpu_milli\": 1000001 out of range 0..1000000");
    c.cpu_milli = 0;
    c.req_id = "0123456789012345678901234567890123456789012345678901234567890123x";
    encode_fails(DSEC_MSG_CREATE, &c, "field \"req_id\": 65 bytes exceeds limit 64");
    c.req_id = "r";
    c.tenant = "\xff";
    encode_fails(DSEC_MSG_CREATE, &c, "field \"tenant\": string is not valid UTF-8");
    c.tenant = NULL;
    const char *k[] = {"a", "b", "a"}, *v[] = {"1", "2", "3"};
    c.labels = (dsec_kv){.k = k, .v = v, .n = 3};
    encode_fails(DSEC_MSG_CREATE, &c, "field \"labels\": duplicate key \"a\"");
    c.labels.n = 2;
    encode_ok(DSEC_MSG_CREATE, &c, &ENC);

    dsec_msg_exec e = {.id = NULL};
    encode_fails(DSEC_MSG_EXEC, &e, "field \"id\": missing (required)");
    e.id = "x";
    const char *argv[] = {"ls", NULL};
    e.argv = (dsec_strv){.v = argv, .n = 2};
    encode_fails(DSEC_MSG_EXEC, &e, "field \"argv\": item 1: NULL string");
    e.argv.n = 1;
    e.stdin_data = (dsec_bytes){.ptr = NULL, .len = 3};
    encode_fails(DSEC_MSG_EXEC, &e, "field \"stdin\": 3 bytes but a NULL pointer");

    dsec_msg_file_entry ents[2] = {{.name = "a"}, {.kind = "file"}};
    dsec_msg_file_list_reply r = {.id = "x", .entries = {.items = ents, .n = 2}};
    encode_fails(DSEC_MSG_FILE_LIST_REPLY, &r, "field \"entries[1].name\": missing (required)");

    dsec_msg_exec_result er = {.id = "x", .exit_code = 256};
    encode_fails(DSEC_MSG_EXEC_RESULT, &er, "field \"exit_code\": 256 out of range -1..255");

    dsec_err err;
    assert_int_equal(dsec_encode(&ENC, DSEC_MSG_CREATE, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
}

static void kv_duplicates_found_in_big_maps(void **state)
{
    static const char *keys[40], *vals[40];
    static char names[40][8];
    for (int i = 0; i < 40; i++) {
        snprintf(names[i], sizeof names[i], "k%02d", i);
        keys[i] = names[i];
        vals[i] = "v";
    }
    dsec_msg_create c = {.req_id = "r", .labels = {.k = keys, .v = vals, .n = 40}};
    encode_ok(DSEC_MSG_CREATE, &c, &ENC);
    keys[39] = "k07";
    encode_fails(DSEC_MSG_CREATE, &c, "field \"labels\": duplicate key \"k07\"");
    /* The decoder sees it too. */
    keys[39] = names[39];
    encode_ok(DSEC_MSG_CREATE, &c, &ENC);
    anymsg out;
    expect_ok(DSEC_MSG_CREATE, &ENC, &out);
    assert_int_equal(out.create.labels.n, 40);
    char *last = memmem(ENC.data, ENC.len, "k39", 3);
    assert_non_null(last);
    memcpy(last, "k07", 3);
    expect_fail(DSEC_MSG_CREATE, &ENC, DSEC_E_DECODE, "field \"labels\": duplicate key \"k07\"",
                "labels");
}

/* Many distinct keys pass; one repeat anywhere among them is caught. */
static void duplicates_found_anywhere_in_big_maps(void **state)
{
    enum { N = 300 };
    char keys[N][8];
    for (int i = 0; i < N; i++)
        snprintf(keys[i], sizeof keys[i], "k%03d", (i * 37) % N);
    anymsg out;
    for (int dup = -1; dup < N; dup++) {
        B.len = 0;
        mp_map(&B, 3);
        kv_str(&B, "id", "x");
        mp_str(&B, "argv");
        mp_arr(&B, 1);
        mp_str(&B, "true");
        mp_str(&B, "env");
        mp_map(&B, N);
        for (int i = 0; i < N; i++) {
            mp_str(&B, i == dup ? keys[(dup * 7 + 3) % N] : keys[i]);
            mp_str(&B, "v");
        }
        if (dup < 0 || (dup * 7 + 3) % N == dup) {
            expect_ok(DSEC_MSG_EXEC, &B, &out);
            assert_int_equal(out.exec.env.n, N);
            continue;
        }
        char want[64];
        snprintf(want, sizeof want, "field \"env\": duplicate key \"%s\"", keys[(dup * 7 + 3) % N]);
        expect_fail(DSEC_MSG_EXEC, &B, DSEC_E_DECODE, want, "env");
    }
}

/* A payload that does not decode still shows its req_id: found past values
 * of every kind (nested containers skipped whole), refused when the value
 * is no clean string or the bytes run out. */
static void peek_str_reads_req_id_of_undecodable_payloads(void **state)
{
    char out[65];
    /* {"a": [1, {"b": "c"}], "n": nil, "req_id": "r-1", "req_id": "second"} */
    static const uint8_t ok[] = {0x84, 0xa1, 'a',  0x92, 0x01, 0x81, 0xa1, 'b', 0xa1, 'c',
                                 0xa1, 'n',  0xc0, 0xa6, 'r',  'e',  'q',  '_', 'i',  'd',
                                 0xa3, 'r',  '-',  '1',  0xa6, 'r',  'e',  'q', '_',  'i',
                                 'd',  0xa6, 's',  'e',  'c',  'o',  'n',  'd'};
    assert_true(dsec_msgpack_peek_str(ok, sizeof ok, "req_id", out, sizeof out));
    assert_string_equal(out, "r-1");
    assert_false(dsec_msgpack_peek_str(ok, sizeof ok, "missing", out, sizeof out));
    assert_string_equal(out, "");
    /* too long for out */
    assert_false(dsec_msgpack_peek_str(ok, sizeof ok, "req_id", out, 3));
    /* cut anywhere before the value ends: never read past the buffer */
    for (size_t n = 0; n < 24; n++)
        assert_false(dsec_msgpack_peek_str(ok, n, "req_id", out, sizeof out));
    assert_true(dsec_msgpack_peek_str(ok, 24, "req_id", out, sizeof out));
    /* not a map; a value that is an integer, a binary, has a NUL or bad UTF-8 */
    static const uint8_t arr[] = {0x91, 0xa6, 'r', 'e', 'q', '_', 'i', 'd'};
    assert_false(dsec_msgpack_peek_str(arr, sizeof arr, "req_id", out, sizeof out));
    static const uint8_t num[] = {0x81, 0xa6, 'r', 'e', 'q', '_', 'i', 'd', 0x07};
    assert_false(dsec_msgpack_peek_str(num, sizeof num, "req_id", out, sizeof out));
    static const uint8_t bin[] = {0x81, 0xa6, 'r', 'e', 'q', '_', 'i', 'd', 0xc4, 0x01, 'x'};
    assert_false(dsec_msgpack_peek_str(bin, sizeof bin, "req_id", out, sizeof out));
    static const uint8_t nul[] = {0x81, 0xa6, 'r', 'e', 'q', '_', 'i', 'd', 0xa2, 'x', 0};
    assert_false(dsec_msgpack_peek_str(nul, sizeof nul, "req_id", out, sizeof out));
    static const uint8_t bad[] = {0x81, 0xa6, 'r', 'e', 'q', '_', 'i', 'd', 0xa2, 0xc3, 0x28};
    assert_false(dsec_msgpack_peek_str(bad, sizeof bad, "req_id", out, sizeof out));
    /* a container claiming more items than bytes remain */
    static const uint8_t lie[] = {0x82, 0xa1, 'a', 0xdd, 0xff, 0xff, 0xff, 0xff, 0xa6,
                                  'r',  'e',  'q', '_',  'i',  'd',  0xa1, 'x'};
    assert_false(dsec_msgpack_peek_str(lie, sizeof lie, "req_id", out, sizeof out));
}

#define T(f) cmocka_unit_test_setup(f, reset)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(schemas_are_consistent),
        T(schemas_use_wire_names_and_limits),
        T(every_type_round_trips),
        T(round_trip_keeps_bins_lists_and_maps),
        T(wire_names_and_flattened_place),
        T(optional_zero_fields_are_omitted),
        T(msg_equal_sees_differences),
        T(decoder_reuses_its_storage),
        T(integers_accept_any_encoding_in_range),
        T(unknown_type_is_refused),
        T(missing_required_field),
        T(required_field_may_not_be_empty),
        T(wrong_types),
        T(bools_and_bins_are_strict),
        T(out_of_range_numbers),
        T(oversize_fields),
        T(oversize_payload),
        T(duplicate_keys),
        T(trailing_bytes),
        T(truncated_at_every_length),
        T(not_a_map),
        T(bad_strings),
        T(malformed_msgpack),
        T(nesting_is_bounded),
        T(unknown_fields_are_skipped),
        T(list_items_name_their_index),
        T(bad_field_clears_on_success),
        T(encoder_refuses_what_decoder_would),
        T(kv_duplicates_found_in_big_maps),
        T(duplicates_found_anywhere_in_big_maps),
        T(peek_str_reads_req_id_of_undecodable_payloads),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
