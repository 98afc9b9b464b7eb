/* test_function_bus.c - function calls end to end: a cell on a real nats-server whose node runs the
 * function backend natively; libdsec creates, execs, calls. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/cell.h"
#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tests/fixture.h"

static dsec_natsd *natsd;
static char root[64];
static dsec_cell_conf conf;
static dsec_cell *cell;
static dsec_client *cl;

static void opt(dsec_cell_node *n, const char *k, const char *v)
{
    n->opts[n->nopts].key = dsec_strdup(k);
    n->opts[n->nopts].value = dsec_strdup(v);
    n->nopts++;
}

static int group_setup(void **state)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_function_bus: needs root (function sandboxes); skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    if (dsec_test_server_start("dsec-fnbus", false, &natsd, root, sizeof root) < 0)
        return -1;
    dsec_err err;
    dsec_cell_conf_defaults(&conf);
    snprintf(conf.cell, sizeof conf.cell, "fnbus");
    snprintf(conf.url, sizeof conf.url, "%s", dsec_natsd_url(natsd));
    snprintf(conf.state_dir, sizeof conf.state_dir, "%s/cell", root);
    conf.capacity_ms = 20;
    conf.full_ms = 500;
    conf.heartbeat_ms = 100;
    static const char *const types[] = {"function", NULL};
    if (dsec_cell_conf_add_sim_nodes(&conf, "fnbus", 1, 8000, 16384, 64, types, NULL, &err) < 0) {
        fprintf(stderr, "conf: %s\n", err.msg);
        return -1;
    }
    dsec_cell_node *n = &conf.nodes[0];
    snprintf(n->backend, sizeof n->backend, "native");
    opt(n, "function.pool_python3", "2");
    opt(n, "function.pool_sh", "1");
    opt(n, "function.pool_native", "0");
    opt(n, "function.max_workers", "16");
    opt(n, "function.uid_base", "1600000000");
    if (dsec_cell_start(&cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0) {
        fprintf(stderr, "cell: %s\n", err.msg);
        return -1;
    }
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = "fnbus", .timeout_ms = 20000};
    if (dsec_client_connect(&cl, &o, &err) < 0) {
        fprintf(stderr, "client: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    dsec_client_free(cl);
    dsec_cell_stop(cell, true);
    dsec_cell_conf_release(&conf);
    if (natsd != NULL)
        return dsec_test_server_stop(natsd, root);
    return 0;
}

static int need_root(void **state)
{
    if (cell == NULL)
        skip();
    return 0;
}

static void create_and_exec_python_over_the_bus(void **state)
{
    dsec_err err;
    dsec_sandbox_info info;
    static const char *const labels[] = {"runtime=python3", NULL};
    dsec_create_spec spec = {
        .type = "function", .labels = labels, .memory_mb = 256, .cell = "fnbus"};
    if (dsec_create(cl, &spec, &info, &err) < 0)
        fail_msg("create: %s (%s)", err.msg, dsec_code_name(err.code));
    assert_string_equal(info.type, "function");
    assert_string_equal(info.node, "fnbus-0000");

    static const char *const argv[] = {
        "python3", "-c", "import sys; print(sum(range(10)), sys.argv[1:])", "x", NULL};
    dsec_exec_opts o = {.argv = argv};
    dsec_exec_reply r;
    if (dsec_exec(cl, info.id, &o, &r, &err) < 0)
        fail_msg("exec: %s (%s)", err.msg, dsec_code_name(err.code));
    assert_int_equal(r.exit_code, 0);
    assert_string_equal((char *)r.out, "45 ['x']\n");
    assert_int_equal(r.err_len, 0);
    /* the result carries what the call used, across the bus */
    assert_true(r.peak_rss_kb > 1000); /* a python3 interpreter holds a few MiB */
    assert_true(r.duration_us > 0);
    dsec_exec_reply_release(&r);

    /* a dependency file, then a script using it, with stdin and env */
    const char *mod = "def shout(s):\n    return s.upper() + '!'\n";
    assert_int_equal(dsec_file_write(cl, info.id, "/work/lib.py", mod, strlen(mod), 0644, &err), 0);
    static const char *const argv2[] = {
        "python3", "-c",
        "import lib, os, sys; print(lib.shout(sys.stdin.read()), os.environ['WHO'])", NULL};
    static const char *const env[] = {"WHO=bus", NULL};
    dsec_exec_opts o2 = {
        .argv = argv2, .env = env, .stdin_data = "hi", .stdin_len = 2, .timeout_ms = 5000};
    if (dsec_exec(cl, info.id, &o2, &r, &err) < 0)
        fail_msg("exec: %s", err.msg);
    assert_string_equal((char *)r.out, "HI! bus\n");
    dsec_exec_reply_release(&r);

    /* the output cap travels with the request: 10 bytes of each stream kept */
    static const char *const loud[] = {
        "python3", "-c", "import sys; print('x' * 5000); print('y' * 70000, file=sys.stderr)",
        NULL};
    dsec_exec_opts o4 = {.argv = loud, .output_max = 10};
    if (dsec_exec(cl, info.id, &o4, &r, &err) < 0)
        fail_msg("exec: %s", err.msg);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.out_len, 10);
    assert_int_equal(r.err_len, 10);
    assert_memory_equal(r.out, "xxxxxxxxxx", 10);
    assert_true(r.out_truncated);
    assert_true(r.err_truncated);
    dsec_exec_reply_release(&r);
    /* and one past what a reply may carry is refused by name */
    dsec_exec_opts o5 = {.argv = loud, .output_max = 9u << 20};
    assert_int_equal(dsec_exec(cl, info.id, &o5, &r, &err), -1);
    assert_non_null(strstr(err.msg, "output_max"));

    /* a malformed task is the backend's clear error, carried over the bus */
    static const char *const bad[] = {"python3", "-c", NULL};
    dsec_exec_opts o3 = {.argv = bad};
    assert_int_equal(dsec_exec(cl, info.id, &o3, &r, &err), -1);
    assert_non_null(strstr(err.msg, "-c needs an argument"));

    assert_int_equal(dsec_destroy(cl, info.id, &err), 0);
}

static void one_shot_call(void **state)
{
    dsec_err err;
    dsec_exec_reply r;
    static const char *const argv[] = {"sh", "-c",  "cat /work/data.txt; echo \"$1\" >&2; exit 5",
                                       "sh", "arg", NULL};
    dsec_call_file files[] = {{.path = "/work/data.txt", .data = "from a file\n", .len = 12}};
    dsec_call_spec spec = {.runtime = "sh",
                           .argv = argv,
                           .files = files,
                           .nfiles = 1,
                           .timeout_ms = 5000,
                           .cell = "fnbus"};
    if (dsec_call(cl, &spec, &r, &err) < 0)
        fail_msg("call: %s", err.msg);
    assert_int_equal(r.exit_code, 5);
    assert_string_equal((char *)r.out, "from a file\n");
    assert_string_equal((char *)r.err_out, "arg\n");
    dsec_exec_reply_release(&r);

    /* a one-shot call's output cap */
    static const char *const many[] = {"sh", "-c", "seq 1 10000", NULL};
    dsec_call_spec capped = {
        .runtime = "sh", .argv = many, .timeout_ms = 5000, .cell = "fnbus", .output_max = 4};
    if (dsec_call(cl, &capped, &r, &err) < 0)
        fail_msg("call: %s", err.msg);
    assert_int_equal(r.out_len, 4);
    assert_memory_equal(r.out, "1\n2\n", 4);
    assert_true(r.out_truncated);
    dsec_exec_reply_release(&r);

    /* a call past its wall time */
    static const char *const nap[] = {"python3", "-c", "import time; time.sleep(30)", NULL};
    dsec_call_spec slow = {.argv = nap, .timeout_ms = 300, .cell = "fnbus"};
    if (dsec_call(cl, &slow, &r, &err) < 0)
        fail_msg("call: %s", err.msg);
    assert_true(r.timed_out);
    assert_int_equal(r.signal, 9);
    dsec_exec_reply_release(&r);
}

/* Send msg of type to subject on the cell's own connection; the answer must
 * be an invalid error naming field (docs/protocol.md, Errors). */
static void expect_invalid(const char *subject, int type, const void *msg, const char *field)
{
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_err err;
    assert_int_equal(dsec_encode(&b, type, msg, &err), 0);
    dsec_hdr h = {.type = dsec_msg_type_name(type), .schema = DSEC_SCHEMA_VERSION};
    dsec_msg *reply = NULL;
    if (dsec_bus_request_sync(dsec_cell_bus(cell), subject, &h, b.data, b.len, 20000, &reply,
                              &err) < 0)
        fail_msg("%s: %s", subject, err.msg);
    dsec_buf_release(&b);
    assert_string_equal(dsec_msg_type(reply), "error");
    dsec_decoder *d = dsec_decoder_new(NULL);
    dsec_msg_error e;
    assert_int_equal(
        dsec_decode(d, DSEC_MSG_ERROR, dsec_msg_data(reply), dsec_msg_len(reply), &e, &err), 0);
    if (strcmp(e.code, "invalid") != 0 || e.field == NULL || strcmp(e.field, field) != 0)
        fail_msg("%s %s: %s field \"%s\" (%s), expected invalid field \"%s\"",
                 dsec_msg_type_name(type), subject, e.code, e.field ? e.field : "", e.message,
                 field);
    dsec_decoder_free(d);
    dsec_msg_free(reply);
}

/* A function sandbox's refusals name the request field they are about: a
 * path outside /work, each part of a malformed call, an unknown runtime. */
static void refusals_name_their_field(void **state)
{
    dsec_err err;
    dsec_sandbox_info info;
    static const char *const labels[] = {"runtime=python3", NULL};
    dsec_create_spec spec = {
        .type = "function", .labels = labels, .memory_mb = 256, .cell = "fnbus"};
    if (dsec_create(cl, &spec, &info, &err) < 0)
        fail_msg("create: %s (%s)", err.msg, dsec_code_name(err.code));
    char subj[256];
    snprintf(subj, sizeof subj, "dsec.v1.fnbus.sbx.%s.%s.write", info.node, info.id);
    dsec_msg_file_write w = {
        .id = info.id, .path = "/etc/dsec-outside", .data = {(const uint8_t *)"x", 1}};
    expect_invalid(subj, DSEC_MSG_FILE_WRITE, &w, "path");
    snprintf(subj, sizeof subj, "dsec.v1.fnbus.sbx.%s.%s.read", info.node, info.id);
    dsec_msg_file_read rd = {.id = info.id, .path = "/tmp/x"};
    expect_invalid(subj, DSEC_MSG_FILE_READ, &rd, "path");

    snprintf(subj, sizeof subj, "dsec.v1.fnbus.sbx.%s.%s.exec", info.node, info.id);
    static const char *py[] = {"python3", "-c", "print(1)"};
    static const char *opt_x[] = {"python3", "-X", "dev", "-c", "print(1)"};
    dsec_msg_exec x = {.id = info.id, .argv = {py, 3}, .cwd = "work"};
    expect_invalid(subj, DSEC_MSG_EXEC, &x, "cwd");
    x = (dsec_msg_exec){.id = info.id, .argv = {py, 3}, .user = "root"};
    expect_invalid(subj, DSEC_MSG_EXEC, &x, "user");
    x = (dsec_msg_exec){.id = info.id, .argv = {opt_x, 5}};
    expect_invalid(subj, DSEC_MSG_EXEC, &x, "argv");
    static const char *k[] = {"DSEC_LIMIT_BOGUS"}, *v[] = {"1"};
    x = (dsec_msg_exec){.id = info.id, .argv = {py, 3}, .env = {k, v, 1}};
    expect_invalid(subj, DSEC_MSG_EXEC, &x, "env");
    assert_int_equal(dsec_destroy(cl, info.id, &err), 0);

    static const char *lk[] = {"runtime"}, *lv[] = {"cobol"};
    dsec_msg_create c = {
        .req_id = "fnbus-cobol", .type = "function", .cell = "fnbus", .labels = {lk, lv, 1}};
    expect_invalid("dsec.v1.fnbus.create", DSEC_MSG_CREATE, &c, "labels");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(create_and_exec_python_over_the_bus, need_root),
        cmocka_unit_test_setup(one_shot_call, need_root),
        cmocka_unit_test_setup(refusals_name_their_field, need_root),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
