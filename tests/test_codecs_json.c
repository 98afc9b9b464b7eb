/* test_codecs_json.c - msgpack -> JSON: exact output for every type, always valid. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "codecs/msg.h"
#include "codecs/testkit.h"
#include "dsec/err.h"

static dsec_buf OUT;

static int teardown(void **state)
{
    dsec_buf_release(&OUT);
    return 0;
}

/* Render lit (msgpack bytes) and compare with want exactly; check validity too. */
#define JSON_IS(lit, want) json_is((lit), sizeof(lit) - 1, (want), 0)
#define PRETTY_IS(lit, want) json_is((lit), sizeof(lit) - 1, (want), DSEC_JSON_PRETTY)

static void json_is(const char *mp, size_t n, const char *want, unsigned flags)
{
    dsec_err err;
    dsec_err_clear(&err);
    if (dsec_msgpack_to_json_ex(&OUT, mp, n, flags, &err) != 0)
        fail_msg("to_json: %s", err.msg);
    size_t where;
    if (!dsec_testkit_json_valid(OUT.data, OUT.len, &where))
        fail_msg("invalid JSON at %zu: %.*s", where, (int)OUT.len, OUT.data);
    if (OUT.len != strlen(want) || memcmp(OUT.data, want, OUT.len) != 0)
        fail_msg("got %.*s\nwant %s", (int)OUT.len, OUT.data, want);
}

#define JSON_FAILS(lit, msg) json_fails((lit), sizeof(lit) - 1, (msg))

static void json_fails(const char *mp, size_t n, const char *msg)
{
    dsec_err err;
    dsec_err_clear(&err);
    assert_int_equal(dsec_msgpack_to_json(&OUT, mp, n, &err), -1);
    assert_int_equal(err.code, DSEC_E_DECODE);
    assert_string_equal(err.msg, msg);
    assert_int_equal(OUT.len, 0);
}

static void scalars(void **state)
{
    JSON_IS("\xc0", "null");
    JSON_IS("\xc3", "true");
    JSON_IS("\xc2", "false");
    JSON_IS("\x00", "0");
    JSON_IS("\x7f", "127");
    JSON_IS("\xcf\xff\xff\xff\xff\xff\xff\xff\xff", "18446744073709551615");
    JSON_IS("\xe0", "-32");
    JSON_IS("\xd3\x80\x00\x00\x00\x00\x00\x00\x00", "-9223372036854775808");
    JSON_IS("\xd0\x05", "5"); /* non-negative in a signed encoding */
}

static void floats(void **state)
{
    JSON_IS("\xcb\x3f\xb9\x99\x99\x99\x99\x99\x9a", "0.1");
    JSON_IS("\xca\x3d\xcc\xcc\xcd", "0.1"); /* float32: shortest for its precision */
    JSON_IS("\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00", "1");
    JSON_IS("\xcb\x80\x00\x00\x00\x00\x00\x00\x00", "-0");
    JSON_IS("\xcb\x44\x4b\x1a\xe4\xd6\xe2\xef\x50", "1e+21");
    JSON_IS("\xcb\x40\xfe\x24\x0c\x9f\xbe\x76\xc9", "123456.789");
    JSON_IS("\xcb\x3f\xd3\x33\x33\x33\x33\x33\x34", "0.30000000000000004");
    JSON_IS("\xcb\x7f\xef\xff\xff\xff\xff\xff\xff", "1.7976931348623157e+308");
    JSON_IS("\xcb\x00\x00\x00\x00\x00\x00\x00\x01", "4.94065645841247e-324");
    JSON_IS("\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00", "null"); /* NaN */
    JSON_IS("\xcb\xff\xf0\x00\x00\x00\x00\x00\x00", "null"); /* -Inf */
    JSON_IS("\xca\x7f\x80\x00\x00", "null");                 /* float32 Inf */
}

static void strings_are_escaped(void **state)
{
    JSON_IS("\xa0", "\"\"");
    JSON_IS("\xa6h\xc3\xa9llo", "\"h\xc3\xa9llo\"");
    JSON_IS("\xa4\xf0\x9f\x98\x80", "\"\xf0\x9f\x98\x80\"");
    JSON_IS("\xa8\"\\\n\r\t\x01\x1f/", "\"\\\"\\\\\\n\\r\\t\\u0001\\u001f/\"");
    JSON_IS("\xa3"
            "a\0b",
            "\"a\\u0000b\"");
    JSON_IS("\xa1\x7f", "\"\x7f\"");
}

static void binary_and_bad_utf8_become_base64(void **state)
{
    JSON_IS("\xc4\x00", "{\"$bin\":\"\"}");
    JSON_IS("\xc4\x01\x00", "{\"$bin\":\"AA==\"}");
    JSON_IS("\xc4\x02\x00\xff", "{\"$bin\":\"AP8=\"}");
    JSON_IS("\xc4\x03\x00\x01\x02", "{\"$bin\":\"AAEC\"}");
    JSON_IS("\xc5\x00\x04\xfb\xff\xbf\x00", "{\"$bin\":\"+/+/AA==\"}");
    JSON_IS("\xa2\xff\xfe", "{\"$bin\":\"//4=\"}");
    JSON_IS("\xa2\xc0\xaf", "{\"$bin\":\"wK8=\"}");             /* overlong */
    JSON_IS("\xa3\xed\xa0\x80", "{\"$bin\":\"7aCA\"}");         /* surrogate */
    JSON_IS("\xa4\xf4\x90\x80\x80", "{\"$bin\":\"9JCAgA==\"}"); /* > U+10FFFF */
    JSON_IS("\xa1\xc3", "{\"$bin\":\"ww==\"}");                 /* cut sequence (1 of 2 bytes) */
}

static void ext_values(void **state)
{
    JSON_IS("\xd4\x05\x41", "{\"$ext\":5,\"data\":\"QQ==\"}");
    JSON_IS("\xd6\xff\x00\x00\x00\x01", "{\"$ext\":-1,\"data\":\"AAAAAQ==\"}");
    JSON_IS("\xc7\x00\x07", "{\"$ext\":7,\"data\":\"\"}");
    JSON_IS("\xc8\x00\x02\x80\x41\x42", "{\"$ext\":-128,\"data\":\"QUI=\"}");
}

static void containers_and_keys(void **state)
{
    JSON_IS("\x90", "[]");
    JSON_IS("\x80", "{}");
    JSON_IS("\x93\x01\xa1"
            "a\x90",
            "[1,\"a\",[]]");
    JSON_IS("\x82\xa1k\x01\xa1q\x81\xa1r\xc0", "{\"k\":1,\"q\":{\"r\":null}}");
    /* Keys that are not strings become their JSON text, as a string. */
    JSON_IS("\x81\x07\xa1v", "{\"7\":\"v\"}");
    JSON_IS("\x81\xc0\x01", "{\"null\":1}");
    JSON_IS("\x81\x92\x01\xa1x\x01", "{\"[1,\\\"x\\\"]\":1}");
    JSON_IS("\x81\xa1\xff\x01", "{\"{\\\"$bin\\\":\\\"/w==\\\"}\":1}");
    JSON_IS("\x81\xa2\n\"\x01", "{\"\\n\\\"\":1}");
}

static void pretty_layout(void **state)
{
    PRETTY_IS("\x82\xa1"
              "a\x92\x01\x90\xa1"
              "b\x80",
              "{\n  \"a\": [\n    1,\n    []\n  ],\n  \"b\": {}\n}");
    PRETTY_IS("\x01", "1");
}

static void malformed_input_fails(void **state)
{
    JSON_FAILS("", "payload: empty");
    JSON_FAILS("\xc1", "payload: invalid msgpack type byte 0xc1 at byte 0");
    JSON_FAILS("\xa5"
               "abc",
               "payload: truncated: string at byte 0 needs 5 bytes, 3 remain");
    JSON_FAILS("\x92\x01", "payload: truncated: array at byte 0 has 2 items, 1 bytes remain");
    JSON_FAILS("\xcd\x01", "payload: truncated: integer at byte 0 needs 2 bytes, 1 remain");
    JSON_FAILS("\xd9", "payload: truncated: header at byte 0 runs past the end");
    JSON_FAILS("\x91\xc6\x00\x00", "payload: truncated: header at byte 1 runs past the end");
    JSON_FAILS("\xc0\xc0", "payload: 1 trailing bytes after the message");
    JSON_FAILS("\xdf\xff\xff\xff\xff\x01",
               "payload: truncated: map at byte 0 has 4294967295 entries, 1 bytes remain");
    JSON_FAILS("\x81\x01", "payload: truncated: map at byte 0 has 1 entries, 1 bytes remain");
}

static void nesting_limit(void **state)
{
    char deep[DSEC_JSON_MAX_DEPTH + 2];
    memset(deep, 0x91, DSEC_JSON_MAX_DEPTH);
    deep[DSEC_JSON_MAX_DEPTH] = (char)0xc0;
    dsec_err err;
    assert_int_equal(dsec_msgpack_to_json(&OUT, deep, DSEC_JSON_MAX_DEPTH + 1, &err), 0);
    assert_true(dsec_testkit_json_valid(OUT.data, OUT.len, NULL));
    assert_int_equal(OUT.len, 2 * DSEC_JSON_MAX_DEPTH + 4);
    memset(deep, 0x91, DSEC_JSON_MAX_DEPTH + 1);
    deep[DSEC_JSON_MAX_DEPTH + 1] = (char)0xc0;
    assert_int_equal(dsec_msgpack_to_json(&OUT, deep, sizeof deep, &err), -1);
    assert_int_equal(err.code, DSEC_E_DECODE);
    assert_string_equal(err.msg, "payload: array at byte 32 nests deeper than 32 levels");
    /* An empty container one level too deep counts (found by fuzz_json). */
    memset(deep, 0x91, DSEC_JSON_MAX_DEPTH);
    deep[DSEC_JSON_MAX_DEPTH] = (char)0x80;
    assert_int_equal(dsec_msgpack_to_json(&OUT, deep, DSEC_JSON_MAX_DEPTH + 1, &err), -1);
    assert_string_equal(err.msg, "payload: map at byte 32 nests deeper than 32 levels");
    deep[DSEC_JSON_MAX_DEPTH - 1] = (char)0x90;
    assert_int_equal(dsec_msgpack_to_json(&OUT, deep, DSEC_JSON_MAX_DEPTH, &err), 0);
    assert_true(dsec_testkit_json_valid(OUT.data, OUT.len, NULL));
}

static void every_message_renders(void **state)
{
    dsec_buf enc;
    dsec_buf_init(&enc);
    for (int t = DSEC_MSG_NONE + 1; t < DSEC_MSG_TYPE_MAX_; t++) {
        union {
            dsec_msg_create c;
            dsec_msg_place p;
            dsec_msg_capacity cap;
            unsigned char b[512];
        } m;
        assert_true(dsec_testkit_sample(t, &m));
        dsec_err err;
        assert_int_equal(dsec_encode(&enc, t, &m, &err), 0);
        for (unsigned flags = 0; flags <= DSEC_JSON_PRETTY; flags++) {
            assert_int_equal(dsec_msgpack_to_json_ex(&OUT, enc.data, enc.len, flags, &err), 0);
            if (!dsec_testkit_json_valid(OUT.data, OUT.len, NULL))
                fail_msg("%s: %.*s", dsec_msg_type_name(t), (int)OUT.len, OUT.data);
        }
    }
    /* Spot-check one: fields by wire name, bins as base64. */
    dsec_msg_exec e;
    dsec_testkit_sample(DSEC_MSG_EXEC, &e);
    dsec_err err;
    assert_int_equal(dsec_encode(&enc, DSEC_MSG_EXEC, &e, &err), 0);
    assert_int_equal(dsec_msgpack_to_json(&OUT, enc.data, enc.len, &err), 0);
    dsec_buf_append(&OUT, "", 1, NULL);
    assert_non_null(
        strstr(OUT.data, "\"argv\":[\"sh\",\"-c\",\"echo \\\"h\xc3\xa9llo\\\"\\tworld\\n\",\"\"]"));
    assert_non_null(strstr(OUT.data, "\"stdin\":{\"$bin\":\"AGEAYv8A\"}"));
    dsec_buf_release(&enc);
}

/* xorshift: reproducible pseudo-random bytes */
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)rng;
}

/* A random msgpack value of every kind, hand-encoded, up to depth 5. */
static void random_value(dsec_buf *b, int depth)
{
    static const uint8_t singles[] = {0xc0, 0xc2, 0xc3, 0x00, 0x7f, 0xe0, 0xff};
    uint8_t buf[24];
    unsigned kind = next() % (depth < 5 ? 10 : 7);
    switch (kind) {
    case 0:
        buf[0] = singles[next() % sizeof singles];
        dsec_buf_append(b, buf, 1, NULL);
        return;
    case 1: /* any fixed-width number */
        buf[0] = (uint8_t)(0xca + next() % 10);
        for (int i = 1; i < 9; i++)
            buf[i] = (uint8_t)next();
        dsec_buf_append(b, buf,
                        1 + (buf[0] == 0xca || buf[0] == 0xce || buf[0] == 0xd2 ? 4
                             : buf[0] == 0xcc || buf[0] == 0xd0                 ? 1
                             : buf[0] == 0xcd || buf[0] == 0xd1                 ? 2
                                                                                : 8),
                        NULL);
        return;
    case 2:
    case 3:
    case 4: { /* strings and bins of random (often non-UTF-8) bytes */
        unsigned n = next() % 20;
        buf[0] = kind == 4 ? 0xc4 : 0xd9;
        buf[1] = (uint8_t)n;
        dsec_buf_append(b, buf, 2, NULL);
        for (unsigned i = 0; i < n; i++) {
            uint8_t c = kind == 2 ? (uint8_t)(0x20 + next() % 0x5f) : (uint8_t)next();
            dsec_buf_append(b, &c, 1, NULL);
        }
        return;
    }
    case 5: /* ext */
        buf[0] = 0xd5;
        buf[1] = (uint8_t)next();
        buf[2] = (uint8_t)next();
        buf[3] = (uint8_t)next();
        dsec_buf_append(b, buf, 4, NULL);
        return;
    case 6: {
        uint8_t c = (uint8_t)(next() % 128);
        dsec_buf_append(b, &c, 1, NULL);
        return;
    }
    default: { /* containers */
        unsigned n = next() % 5;
        bool map = kind == 9;
        buf[0] = (uint8_t)((map ? 0x80 : 0x90) | n);
        dsec_buf_append(b, buf, 1, NULL);
        for (unsigned i = 0; i < (map ? 2 * n : n); i++)
            random_value(b, depth + 1);
    }
    }
}

static void random_msgpack_gives_valid_json(void **state)
{
    dsec_buf in;
    dsec_buf_init(&in);
    for (int i = 0; i < 3000; i++) {
        in.len = 0;
        random_value(&in, 0);
        dsec_err err;
        dsec_err_clear(&err);
        if (dsec_msgpack_to_json_ex(&OUT, in.data, in.len, (unsigned)i & 1, &err) != 0)
            fail_msg("case %d: %s", i, err.msg);
        size_t where;
        if (!dsec_testkit_json_valid(OUT.data, OUT.len, &where))
            fail_msg("case %d: invalid at %zu: %.*s", i, where, (int)OUT.len, OUT.data);
    }
    dsec_buf_release(&in);
}

#define VALID(s) assert_true(dsec_testkit_json_valid((s), sizeof(s) - 1, NULL))
#define INVALID(s) assert_false(dsec_testkit_json_valid((s), sizeof(s) - 1, NULL))

/* The checker the other tests trust must itself reject bad JSON. */
static void json_checker_is_strict(void **state)
{
    VALID("{\"a\":[1,-0.5e+3,true,false,null,\"\\u00e9\\ud83d\\ude00\"]}");
    VALID(" [ ] ");
    VALID("\"\xc3\xa9\"");
    INVALID("");
    INVALID("{");
    INVALID("[1,]");
    INVALID("{\"a\" 1}");
    INVALID("{1:2}");
    INVALID("01");
    INVALID("1.");
    INVALID("-");
    INVALID("NaN");
    INVALID("\"\\x41\"");
    INVALID("\"\x01\"");
    INVALID("\"\\udc00\"");
    INVALID("\"\\ud83d\"");
    INVALID("\"\xff\"");
    INVALID("\"\xc0\xaf\"");
    INVALID("\"abc");
    INVALID("[1] [2]");
    INVALID("tru");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_checker_is_strict),
        cmocka_unit_test(scalars),
        cmocka_unit_test(floats),
        cmocka_unit_test(strings_are_escaped),
        cmocka_unit_test(binary_and_bad_utf8_become_base64),
        cmocka_unit_test(ext_values),
        cmocka_unit_test(containers_and_keys),
        cmocka_unit_test(pretty_layout),
        cmocka_unit_test(malformed_input_fails),
        cmocka_unit_test(nesting_limit),
        cmocka_unit_test(every_message_renders),
        cmocka_unit_test(random_msgpack_gives_valid_json),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
