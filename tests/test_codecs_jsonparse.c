/* test_codecs_jsonparse.c - the strict JSON parser: values, escapes, and every refusal with its
 * offset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "dsec/json.h"
#include "dsec/alloc.h"
#include "dsec/err.h"

static dsec_json *ok(const char *text)
{
    dsec_err err;
    dsec_err_clear(&err);
    dsec_json *j = NULL;
    if (dsec_json_parse(text, strlen(text), &j, &err) != 0)
        fail_msg("parse %s: %s", text, err.msg);
    return j;
}

/* text must be refused with a message holding want (offset and reason). */
static void bad(const char *text, const char *want)
{
    dsec_err err;
    dsec_err_clear(&err);
    dsec_json *j = NULL;
    if (dsec_json_parse(text, strlen(text), &j, &err) == 0)
        fail_msg("accepted %s", text);
    assert_null(j);
    assert_int_equal(err.code, DSEC_E_DECODE);
    if (strstr(err.msg, want) == NULL)
        fail_msg("%s: got \"%s\", want \"%s\"", text, err.msg, want);
}

static void test_values(void **state)
{
    (void)state;
    dsec_json *j =
        ok(" {\"a\": [1, -2.5e1, true, false, null], \"s\": \"x\\u00e9\\ud83d\\ude00\\n\","
           " \"o\": {}} ");
    assert_int_equal(j->type, DSEC_JSON_OBJECT);
    const dsec_json *a = dsec_json_get_array(j, "a");
    assert_non_null(a);
    assert_int_equal(a->len, 5);
    assert_true(a->items[0]->num == 1.0);
    assert_true(a->items[1]->num == -25.0);
    assert_true(a->items[2]->type == DSEC_JSON_BOOL && a->items[2]->b);
    assert_true(a->items[3]->type == DSEC_JSON_BOOL && !a->items[3]->b);
    assert_int_equal(a->items[4]->type, DSEC_JSON_NULL);
    assert_string_equal(dsec_json_get_str(j, "s"), "x\xc3\xa9\xf0\x9f\x98\x80\n");
    assert_non_null(dsec_json_get_object(j, "o"));
    assert_null(dsec_json_get_str(j, "a"));
    assert_null(dsec_json_get(j, "missing"));
    assert_int_equal(dsec_json_get_uint(a->items[0], "x"), -1);
    dsec_json_free(j);

    j = ok("{\"size\": 1234567, \"neg\": -1, \"frac\": 1.5}");
    assert_int_equal(dsec_json_get_uint(j, "size"), 1234567);
    assert_int_equal(dsec_json_get_uint(j, "neg"), -1);
    assert_int_equal(dsec_json_get_uint(j, "frac"), -1);
    dsec_json_free(j);

    j = ok("\"\"");
    assert_int_equal(j->type, DSEC_JSON_STRING);
    assert_int_equal(j->len, 0);
    dsec_json_free(j);
    dsec_json_free(NULL);
}

static void test_refusals(void **state)
{
    (void)state;
    bad("", "byte 0: expected a value");
    bad("{\"a\":1,}", "byte 7: expected a string key");
    bad("[1,]", "byte 3: unexpected character");
    bad("[1 2]", "byte 3: expected ',' or ']'");
    bad("{\"a\" 1}", "byte 5: expected ':'");
    bad("{\"a\":1,\"a\":2}", "byte 7: duplicate key");
    bad("\"abc", "byte 0: unterminated string");
    bad("\"a\x01\"", "byte 2: control character");
    bad("\"\\x\"", "byte 2: unknown escape");
    bad("\"\\u12g4\"", "bad hex digit");
    bad("\"\\ud800\"", "high surrogate");
    bad("\"\\udc00\"", "lone low surrogate");
    bad("\"\\u0000\"", "\\u0000");
    bad("01", "byte 1: trailing data");
    bad("1.", "no digit after '.'");
    bad("1e", "no digit in the exponent");
    bad("-", "bad number");
    bad("1e999", "out of range");
    bad("tru", "unexpected character");
    bad("{} x", "byte 3: trailing data");
    bad("// c\n{}", "byte 0: unexpected character");
    bad("[1", "byte 2: unterminated array");
    bad("\"\xf5\"", "byte 1: invalid UTF-8");
    bad("\"\xc0\xaf\"", "invalid UTF-8");     /* overlong '/' */
    bad("\"\xed\xa0\x80\"", "invalid UTF-8"); /* a surrogate */
    bad("\"\xe2\x82\"", "invalid UTF-8");     /* truncated sequence */
    dsec_json_free(ok("\"\xe2\x82\xac \xf0\x9f\x98\x80\""));
}

static void test_limits(void **state)
{
    (void)state;
    char deep[2 * (DSEC_JSON_MAX_DEPTH + 2) + 1];
    size_t n = 0;
    for (int i = 0; i < DSEC_JSON_MAX_DEPTH + 2; i++)
        deep[n++] = '[';
    for (int i = 0; i < DSEC_JSON_MAX_DEPTH + 2; i++)
        deep[n++] = ']';
    deep[n] = '\0';
    bad(deep, "nested too deep");
    /* exactly the limit parses */
    n = 0;
    for (int i = 0; i <= DSEC_JSON_MAX_DEPTH; i++)
        deep[n++] = '[';
    for (int i = 0; i <= DSEC_JSON_MAX_DEPTH; i++)
        deep[n++] = ']';
    deep[n] = '\0';
    dsec_json_free(ok(deep));
    /* a truncated prefix of a valid document is refused at every length */
    const char *doc = "{\"k\":[\"v\",{\"x\":-1.5e3}],\"t\":true}";
    for (size_t i = 0; i < strlen(doc); i++) {
        dsec_json *j = NULL;
        dsec_err err;
        assert_int_equal(dsec_json_parse(doc, i, &j, &err), -1);
        assert_null(j);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
