/* test_common.c - the error contract and allocator wrapper. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "dsec/alloc.h"
#include "dsec/err.h"
#include "dsec/sha256.h"

static void err_set_names_errno(void **state)
{
    dsec_err e;
    dsec_err_clear(&e);
    assert_int_equal(dsec_err_set(&e, DSEC_E_IO, ENOENT, "opening %s", "/x"), -1);
    assert_int_equal(e.code, DSEC_E_IO);
    assert_int_equal(e.errnum, ENOENT);
    assert_string_equal(e.msg, "opening /x: No such file or directory");
}

static void sha256_hex(const char *in, size_t reps, char out[65])
{
    dsec_sha256 c;
    dsec_sha256_init(&c);
    for (size_t i = 0; i < reps; i++)
        dsec_sha256_update(&c, in, strlen(in));
    uint8_t d[DSEC_SHA256_LEN];
    dsec_sha256_final(&c, d);
    for (int i = 0; i < DSEC_SHA256_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* FIPS 180-4 test vectors, including a message that spans blocks. */
static void sha256_known_vectors(void **state)
{
    char h[65];
    sha256_hex("", 1, h);
    assert_string_equal(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    sha256_hex("abc", 1, h);
    assert_string_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 1, h);
    assert_string_equal(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    sha256_hex("a", 1000000, h);
    assert_string_equal(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void err_wrap_prefixes(void **state)
{
    dsec_err e;
    dsec_err_set(&e, DSEC_E_TIMEOUT, 0, "no answer in 10 ms");
    dsec_err_wrap(&e, "create on %s", "n1");
    assert_string_equal(e.msg, "create on n1: no answer in 10 ms");
    assert_int_equal(e.code, DSEC_E_TIMEOUT);
}

static void err_null_is_safe(void **state)
{
    assert_int_equal(dsec_err_set(NULL, DSEC_E_IO, 0, "x"), -1);
    assert_int_equal(dsec_err_wrap(NULL, "x"), -1);
    dsec_err_clear(NULL);
}

static void code_names_round_trip(void **state)
{
    for (int c = 0; c < DSEC_CODE_MAX_; c++) {
        const char *n = dsec_code_name(c);
        assert_string_not_equal(n, "unknown");
        assert_int_equal(dsec_code_from_name(n), c);
    }
    assert_string_equal(dsec_code_name(-3), "unknown");
    assert_string_equal(dsec_code_name(DSEC_CODE_MAX_), "unknown");
    assert_int_equal(dsec_code_from_name("nonsense"), DSEC_E_INTERNAL);
}

static void retry_safety(void **state)
{
    assert_true(dsec_code_retry_safe(DSEC_E_TIMEOUT));
    assert_true(dsec_code_retry_safe(DSEC_E_NO_RESPONDERS));
    assert_true(dsec_code_retry_safe(DSEC_E_CAPACITY));
    assert_true(dsec_code_retry_safe(DSEC_E_OVERLOADED));
    assert_int_equal(dsec_code_from_name(dsec_code_name(DSEC_E_OVERLOADED)), DSEC_E_OVERLOADED);
    assert_false(dsec_code_retry_safe(DSEC_E_INVALID));
    assert_false(dsec_code_retry_safe(DSEC_E_DECODE));
    assert_false(dsec_code_retry_safe(DSEC_E_PERMISSION));
}

static void alloc_wrapper(void **state)
{
    char *s = dsec_strdup("abc");
    assert_string_equal(s, "abc");
    dsec_free(s);
    char *t = dsec_strndup("abcdef", 2);
    assert_string_equal(t, "ab");
    dsec_free(t);
    assert_null(dsec_strdup(NULL));
    dsec_free(NULL);
    {
        char *p DSEC_AUTOFREE = dsec_malloc(16);
        assert_non_null(p);
    }
    assert_true(strcmp(dsec_alloc_name(), "jemalloc") == 0 || strcmp(dsec_alloc_name(), "libc") == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(err_set_names_errno), cmocka_unit_test(sha256_known_vectors), cmocka_unit_test(err_wrap_prefixes),
        cmocka_unit_test(err_null_is_safe),    cmocka_unit_test(code_names_round_trip),
        cmocka_unit_test(retry_safety),        cmocka_unit_test(alloc_wrapper),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
