/* test_common.c - the error contract and allocator wrapper. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "dsec/alloc.h"
#include "dsec/err.h"
#include "dsec/io.h"
#include "dsec/log.h"
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
    assert_true(strcmp(dsec_alloc_name(), "jemalloc") == 0 ||
                strcmp(dsec_alloc_name(), "libc") == 0);
}

/* dsec_read_file: whole files, the size limit, a missing file, a file the kernel sizes 0 */
static void io_read_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/dsec-test-io-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/f", dir);
    size_t big = 3 * 4096 + 17;
    char *want = malloc(big);
    for (size_t i = 0; i < big; i++)
        want[i] = (char)('a' + i % 26);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(dsec_write_all(fd, want, big), 0);
    close(fd);
    char *data;
    size_t len;
    dsec_err err;
    assert_int_equal(dsec_read_file(path, big, &data, &len, &err), 0);
    assert_int_equal(len, big);
    assert_memory_equal(data, want, big);
    assert_int_equal(data[len], '\0');
    dsec_free(data);
    assert_int_equal(dsec_read_file(path, big - 1, &data, &len, &err), -1);
    assert_int_equal(err.code, DSEC_E_TOO_LARGE);
    assert_non_null(strstr(err.msg, "is larger than"));
    assert_null(data);
    snprintf(path, sizeof path, "%s/missing", dir);
    assert_int_equal(dsec_read_file(path, 10, &data, &len, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, path));
    /* /proc files say size 0 and have content */
    assert_int_equal(dsec_read_file("/proc/self/status", 1 << 20, &data, &len, &err), 0);
    assert_true(len > 0 && strstr(data, "Pid:") != NULL);
    dsec_free(data);
    snprintf(path, sizeof path, "%s/f", dir);
    unlink(path);
    rmdir(dir);
    free(want);
}

/* dsec_pwrite_all and dsec_read_full through a pipe and a file */
static void io_whole_writes(void **state)
{
    (void)state;
    char path[] = "/tmp/dsec-test-io-pw-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(dsec_pwrite_all(fd, "world", 5, 6), 0);
    assert_int_equal(dsec_pwrite_all(fd, "hello ", 6, 0), 0);
    char buf[32];
    assert_int_equal(dsec_pread_eintr(fd, buf, sizeof buf, 0), 11);
    assert_memory_equal(buf, "hello world", 11);
    /* read_full stops at end of file */
    assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
    assert_int_equal(dsec_read_full(fd, buf, sizeof buf), 11);
    close(fd);
    unlink(path);
    int p[2];
    assert_int_equal(pipe(p), 0);
    assert_int_equal(dsec_write_all(p[1], "abc", 3), 0);
    close(p[1]);
    char out[2];
    /* out keeps outlen - 1 bytes, the rest is drained */
    assert_int_equal(dsec_drain_into(p[0], out, sizeof out), 1);
    assert_string_equal(out, "a");
    assert_int_equal(dsec_read_eintr(p[0], buf, 1), 0);
    close(p[0]);
}

static void io_run_capture(void **state)
{
    (void)state;
    dsec_err err;
    char out[64];
    const char *sh[] = {"sh", "-c", "cat; echo err >&2; exit 3", NULL};
    assert_int_equal(dsec_run_capture(sh, "in\n", out, sizeof out, &err), 3);
    assert_string_equal(out, "in\nerr\n");
    const char *killed[] = {"sh", "-c", "kill -9 $$", NULL};
    assert_int_equal(dsec_run_capture(killed, NULL, NULL, 0, &err), 128 + 9);
    const char *missing[] = {"/nonexistent/dsec-no-such-program", NULL};
    assert_int_equal(dsec_run_capture(missing, NULL, out, sizeof out, &err), -1);
    assert_int_equal(err.code, DSEC_E_CONFIG);
    assert_non_null(strstr(err.msg, "cannot run /nonexistent/dsec-no-such-program"));
}

struct captured {
    int n;
    dsec_log_level level[4];
    char msg[4][64];
};

static void capture_hook(dsec_log_level level, const char *msg, void *ud)
{
    struct captured *c = ud;
    if (c->n < 4) {
        c->level[c->n] = level;
        snprintf(c->msg[c->n], sizeof c->msg[0], "%s", msg);
    }
    c->n++;
}

/* the level filters before the hook; the hook gets the line without its newline; stderr gets
 * the line back when the hook is removed */
static void log_levels_and_hook(void **state)
{
    (void)state;
    struct captured c = {0};
    dsec_log_set_hook(capture_hook, &c);
    assert_int_equal(dsec_log_get_level(), DSEC_LOG_INFO);
    dsec_log_warn("dsec-node %s: %d\n", "n1", 7);
    dsec_log_debug("not shown");
    dsec_log_set_level(DSEC_LOG_DEBUG);
    dsec_log_debug("shown");
    dsec_log_set_level(DSEC_LOG_ERROR);
    dsec_log_info("not shown either");
    dsec_log_error("e");
    assert_int_equal(c.n, 3);
    assert_int_equal(c.level[0], DSEC_LOG_WARN);
    assert_string_equal(c.msg[0], "dsec-node n1: 7");
    assert_string_equal(c.msg[1], "shown");
    assert_int_equal(c.level[2], DSEC_LOG_ERROR);
    dsec_log_level l;
    assert_int_equal(dsec_log_level_parse("warn", &l), 0);
    assert_int_equal(l, DSEC_LOG_WARN);
    assert_int_equal(dsec_log_level_parse("loud", &l), -1);
    assert_string_equal(dsec_log_level_name(DSEC_LOG_DEBUG), "debug");
    /* back to stderr: the line arrives whole with one newline */
    dsec_log_set_hook(NULL, NULL);
    dsec_log_set_level(DSEC_LOG_INFO);
    int p[2];
    assert_int_equal(pipe(p), 0);
    int saved = dup(2);
    dup2(p[1], 2);
    dsec_log_info("to stderr %d", 1);
    dup2(saved, 2);
    close(saved);
    close(p[1]);
    char buf[64];
    assert_int_equal(dsec_read_full(p[0], buf, sizeof buf), 12);
    assert_memory_equal(buf, "to stderr 1\n", 12);
    close(p[0]);
    assert_int_equal(c.n, 3);
}

/* dsec_rm_tree: a tree goes, a symlink in it is removed, not followed; a missing path is fine */
static void io_rm_tree(void **state)
{
    (void)state;
    char dir[] = "/tmp/dsec-test-rm-XXXXXX", keep[] = "/tmp/dsec-test-keep-XXXXXX";
    assert_non_null(mkdtemp(dir));
    int kfd = mkstemp(keep);
    assert_true(kfd >= 0);
    close(kfd);
    char p[128];
    snprintf(p, sizeof p, "%s/a", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(p, sizeof p, "%s/a/b", dir);
    assert_int_equal(mkdir(p, 0700), 0);
    snprintf(p, sizeof p, "%s/a/b/f", dir);
    int fd = open(p, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    close(fd);
    snprintf(p, sizeof p, "%s/a/link", dir);
    assert_int_equal(symlink(keep, p), 0);
    assert_int_equal(dsec_rm_tree(dir), 0);
    assert_int_equal(access(dir, F_OK), -1);
    assert_int_equal(access(keep, F_OK), 0);
    assert_int_equal(dsec_rm_tree(dir), 0);
    /* a plain file */
    assert_int_equal(dsec_rm_tree(keep), 0);
    assert_int_equal(access(keep, F_OK), -1);
}

static void sha256_hex_digits(void **state)
{
    (void)state;
    uint8_t d[DSEC_SHA256_LEN];
    for (int i = 0; i < DSEC_SHA256_LEN; i++)
        d[i] = (uint8_t)(i * 9);
    char hex[2 * DSEC_SHA256_LEN + 1];
    dsec_sha256_hex(d, hex);
    assert_int_equal(strlen(hex), 64);
    assert_memory_equal(hex, "0009121b242d363f4851", 20);
    assert_string_equal(hex + 62, "17");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(err_set_names_errno),   cmocka_unit_test(sha256_known_vectors),
        cmocka_unit_test(err_wrap_prefixes),     cmocka_unit_test(err_null_is_safe),
        cmocka_unit_test(code_names_round_trip), cmocka_unit_test(retry_safety),
        cmocka_unit_test(alloc_wrapper),         cmocka_unit_test(io_read_file),
        cmocka_unit_test(io_whole_writes),       cmocka_unit_test(io_run_capture),
        cmocka_unit_test(log_levels_and_hook),   cmocka_unit_test(io_rm_tree),
        cmocka_unit_test(sha256_hex_digits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
