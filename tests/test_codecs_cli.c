/* test_codecs_cli.c - `dsec decode` as users run it, and the protocol doc's tables. */
#include <errno.h>
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "codecs/msg.h"
#include "codecs/testkit.h"
#include "dsec/err.h"

extern char **environ;

static const char *dsec_bin;    /* argv[1]: the dsec executable */
static const char *protocol_md; /* argv[2]: docs/protocol.md */

typedef struct result {
    int status; /* exit code, or -1 when killed */
    dsec_buf out, err;
} result;

static void result_free(result *r)
{
    dsec_buf_release(&r->out);
    dsec_buf_release(&r->err);
}

static void slurp(FILE *f, dsec_buf *b)
{
    rewind(f);
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        assert_int_equal(dsec_buf_append(b, chunk, n, NULL), 0);
    dsec_buf_append(b, "", 1, NULL); /* NUL-terminate for strstr; len excludes it */
    b->len--;
}

/* Run prog with args (NULL-terminated, args[0] is the program name), in on
 * stdin; collect stdout, stderr and the exit code. */
static void run(const char *prog, const char *const *args, const void *in, size_t inlen, result *r)
{
    memset(r, 0, sizeof *r);
    FILE *fin = tmpfile(), *fout = tmpfile(), *ferr = tmpfile();
    assert_true(fin != NULL && fout != NULL && ferr != NULL);
    if (inlen != 0)
        assert_int_equal(fwrite(in, 1, inlen, fin), inlen);
    fflush(fin);
    rewind(fin);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fileno(fin), 0);
    posix_spawn_file_actions_adddup2(&fa, fileno(fout), 1);
    posix_spawn_file_actions_adddup2(&fa, fileno(ferr), 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, prog, &fa, NULL, (char *const *)args, environ);
    posix_spawn_file_actions_destroy(&fa);
    assert_int_equal(rc, 0);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    r->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    slurp(fout, &r->out);
    slurp(ferr, &r->err);
    fclose(fin);
    fclose(fout);
    fclose(ferr);
}

#define DECODE(r, in, inlen, ...)                                                                  \
    do {                                                                                           \
        const char *args_[] = {"dsec", "decode", __VA_ARGS__, NULL};                               \
        run(dsec_bin, args_, (in), (inlen), (r));                                                  \
    } while (0)

static dsec_buf sample(int type)
{
    union {
        dsec_msg_create c;
        dsec_msg_place p;
        dsec_msg_capacity cap;
        unsigned char b[512];
    } m;
    assert_true(dsec_testkit_sample(type, &m));
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_err err;
    assert_int_equal(dsec_encode(&b, type, &m, &err), 0);
    return b;
}

/* One line of valid JSON, nothing on stderr. */
static void assert_json_line(const result *r)
{
    if (r->status != 0)
        fail_msg("exit %d: %s", r->status, r->err.data);
    assert_int_equal(r->err.len, 0);
    assert_true(r->out.len > 1 && r->out.data[r->out.len - 1] == '\n');
    size_t where;
    if (!dsec_testkit_json_valid(r->out.data, r->out.len - 1, &where))
        fail_msg("invalid JSON at %zu: %s", where, r->out.data);
}

static void prints_json(void **state)
{
    dsec_buf in = sample(DSEC_MSG_CREATE);
    result r;
    DECODE(&r, in.data, in.len, NULL);
    assert_json_line(&r);
    assert_non_null(strstr(r.out.data, "{\"req_id\":\"req-0123456789abcdef\","));
    assert_non_null(
        strstr(r.out.data, "\"labels\":{\"team\":\"rl\",\"stage\":\"train\",\"empty\":\"\"}"));
    assert_ptr_equal(strchr(r.out.data, '\n'), r.out.data + r.out.len - 1); /* one line */
    result_free(&r);
    dsec_buf_release(&in);
}

static void checks_every_type(void **state)
{
    for (int t = DSEC_MSG_NONE + 1; t < DSEC_MSG_TYPE_MAX_; t++) {
        dsec_buf in = sample(t);
        result r;
        DECODE(&r, in.data, in.len, "--type", dsec_msg_type_name(t));
        assert_json_line(&r);
        result_free(&r);
        dsec_buf_release(&in);
    }
}

static void type_check_failure_names_the_field(void **state)
{
    dsec_buf hb = sample(DSEC_MSG_HEARTBEAT);
    result r;
    DECODE(&r, hb.data, hb.len, "--type", "create");
    assert_int_equal(r.status, 1);
    assert_int_equal(r.out.len, 0);
    assert_string_equal(r.err.data, "dsec decode: not a valid create: field \"req_id\": missing "
                                    "(required) (decode)\n");
    result_free(&r);
    dsec_buf_release(&hb);
    dsec_buf in = sample(DSEC_MSG_EXEC);
    DECODE(&r, in.data, in.len, "--type=exec");
    assert_json_line(&r);
    result_free(&r);
    DECODE(&r, in.data, in.len, "-t", "ping");
    assert_int_equal(r.status, 1);
    assert_non_null(strstr(r.err.data, "not a valid ping: field \"seq\": missing (required)"));
    result_free(&r);
    /* A wrong type inside: the message names the field and the types. */
    static const char bad[] = "\x82\xa6req_id\xa1r\xa9memory_mb\xa4lots";
    DECODE(&r, bad, sizeof bad - 1, "--type", "create");
    assert_int_equal(r.status, 1);
    assert_non_null(
        strstr(r.err.data, "field \"memory_mb\": expected unsigned integer, got string"));
    result_free(&r);
    /* Without --type the same bytes are fine: any msgpack prints. */
    DECODE(&r, bad, sizeof bad - 1, NULL);
    assert_json_line(&r);
    assert_string_equal(r.out.data, "{\"req_id\":\"r\",\"memory_mb\":\"lots\"}\n");
    result_free(&r);
    dsec_buf_release(&in);
}

static void pretty(void **state)
{
    dsec_buf in = sample(DSEC_MSG_FILE_LIST_REPLY);
    result r;
    DECODE(&r, in.data, in.len, "--pretty");
    assert_json_line(&r);
    static const char head[] = "{\n  \"id\": \"n7-00000000000000a0\",\n  \"path\": \"/work\",\n"
                               "  \"entries\": [\n    {\n      \"name\": \"a.txt\",\n";
    if (strncmp(r.out.data, head, sizeof head - 1) != 0)
        fail_msg("got:\n%s", r.out.data);
    result_free(&r);
    dsec_buf_release(&in);
}

static void input_errors_exit_2(void **state)
{
    result r;
    DECODE(&r, "", 0, NULL);
    assert_int_equal(r.status, 2);
    assert_int_equal(r.out.len, 0);
    assert_string_equal(r.err.data,
                        "dsec decode: empty input: expected one msgpack payload on stdin\n");
    result_free(&r);

    dsec_codec_limits lim;
    dsec_codec_limits_default(&lim);
    size_t n = lim.max_payload + 1;
    char *big = calloc(1, n);
    assert_non_null(big);
    DECODE(&r, big, n, NULL);
    assert_int_equal(r.status, 2);
    assert_int_equal(r.out.len, 0);
    assert_non_null(strstr(r.err.data, "exceeds the payload limit of 8388608 bytes"));
    result_free(&r);

    /* Exactly at the limit is fine: one bin of max_payload - 5 bytes. */
    big[0] = (char)0xc6;
    uint32_t len = (uint32_t)(lim.max_payload - 5);
    for (int i = 0; i < 4; i++)
        big[1 + i] = (char)(len >> (24 - 8 * i));
    DECODE(&r, big, lim.max_payload, NULL);
    assert_json_line(&r);
    assert_true(strncmp(r.out.data, "{\"$bin\":\"AAAA", 13) == 0);
    result_free(&r);
    free(big);

    DECODE(&r, "\x80", 1, "--type", "nonsense");
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err.data, "unknown message type \"nonsense\"; known: error, ping,"));
    result_free(&r);
    DECODE(&r, "\x80", 1, "--bogus");
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err.data, "unknown argument \"--bogus\""));
    result_free(&r);
    DECODE(&r, "\x80", 1, "--type");
    assert_int_equal(r.status, 2);
    result_free(&r);
}

static void malformed_payload_exits_1(void **state)
{
    result r;
    DECODE(&r,
           "\x82\xa1"
           "a",
           3, NULL);
    assert_int_equal(r.status, 1);
    assert_int_equal(r.out.len, 0);
    assert_string_equal(
        r.err.data,
        "dsec decode: payload: truncated: map at byte 0 has 2 entries, 2 bytes remain\n");
    result_free(&r);
    /* Two payloads at once are not one message. */
    DECODE(&r, "\x80\x80", 2, NULL);
    assert_int_equal(r.status, 1);
    assert_string_equal(r.err.data, "dsec decode: payload: 1 trailing bytes after the message\n");
    result_free(&r);
}

static void help_and_usage(void **state)
{
    result r;
    DECODE(&r, "", 0, "--help");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out.data, "usage: dsec decode [--type NAME] [--pretty]"));
    result_free(&r);
    const char *args[] = {"dsec", NULL};
    run(dsec_bin, args, "", 0, &r);
    assert_int_equal(r.status, 2);
    assert_non_null(strstr(r.err.data, "decode"));
    result_free(&r);
}

/* An independent JSON parser agrees the output is JSON. */
static void python_parses_the_output(void **state)
{
    const char *probe[] = {"python3", "-c", "pass", NULL};
    result r;
    run("python3", probe, "", 0, &r);
    int have = r.status == 0;
    result_free(&r);
    if (!have)
        skip();
    static const char odd[] = "\x84\x01\xa1"
                              "a\xa2\xff\xfe\xc4\x02\x00\x01\xa3\"\\\n\xcb\x7f\xf8\0\0\0\0\0\0"
                              "\x92\xd6\xff\0\0\0\1\xc0\xc0";
    for (int pretty = 0; pretty < 2; pretty++) {
        for (int t = DSEC_MSG_NONE; t < DSEC_MSG_TYPE_MAX_; t++) {
            dsec_buf in;
            dsec_buf_init(&in);
            if (t == DSEC_MSG_NONE)
                dsec_buf_append(&in, odd, sizeof odd - 1, NULL);
            else
                in = sample(t);
            DECODE(&r, in.data, in.len, pretty ? "--pretty" : NULL);
            assert_json_line(&r);
            const char *py[] = {"python3", "-c", "import json,sys; json.load(sys.stdin)", NULL};
            result p;
            run("python3", py, r.out.data, r.out.len, &p);
            if (p.status != 0)
                fail_msg("python rejects %s: %s", r.out.data, p.err.data);
            result_free(&p);
            result_free(&r);
            dsec_buf_release(&in);
        }
    }
}

/* docs/protocol.md carries the generated field tables verbatim. */
static void protocol_doc_matches_schemas(void **state)
{
    FILE *f = fopen(protocol_md, "r");
    if (f == NULL)
        fail_msg("%s: %s", protocol_md, strerror(errno));
    dsec_buf doc;
    dsec_buf_init(&doc);
    slurp(f, &doc);
    fclose(f);
    result r;
    DECODE(&r, "", 0, "--schema-md");
    assert_int_equal(r.status, 0);
    int tables = 0;
    char *p = r.out.data;
    while ((p = strstr(p, "#### ")) != NULL) {
        char *end = strstr(p + 1, "#### ");
        size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
        char save = p[n];
        p[n] = '\0';
        if (strstr(doc.data, p) == NULL)
            fail_msg("docs/protocol.md lacks or differs in this table "
                     "(regenerate with dsec decode --schema-md):\n%s",
                     p);
        p[n] = save;
        p += n;
        tables++;
    }
    assert_int_equal(tables, DSEC_MSG_TYPE_MAX_ - 1);
    result_free(&r);
    dsec_buf_release(&doc);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s DSEC_BINARY PROTOCOL_MD\n", argv[0]);
        return 2;
    }
    dsec_bin = argv[1];
    protocol_md = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(prints_json),
        cmocka_unit_test(checks_every_type),
        cmocka_unit_test(type_check_failure_names_the_field),
        cmocka_unit_test(pretty),
        cmocka_unit_test(input_errors_exit_2),
        cmocka_unit_test(malformed_payload_exits_1),
        cmocka_unit_test(help_and_usage),
        cmocka_unit_test(python_parses_the_output),
        cmocka_unit_test(protocol_doc_matches_schemas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
