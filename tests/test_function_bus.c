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
#include "dsec/sha256.h"
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

/* Send msg to the sandbox's op subject; returns the answer (the caller frees it). */
static dsec_msg *ask(const dsec_sandbox_info *info, const char *op, int type, const void *msg)
{
    char subj[256];
    snprintf(subj, sizeof subj, "dsec.v1.fnbus.sbx.%s.%s.%s", info->node, info->id, op);
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_err err;
    assert_int_equal(dsec_encode(&b, type, msg, &err), 0);
    dsec_hdr h = {.type = dsec_msg_type_name(type), .schema = DSEC_SCHEMA_VERSION};
    dsec_msg *reply = NULL;
    if (dsec_bus_request_sync(dsec_cell_bus(cell), subj, &h, b.data, b.len, 20000, &reply, &err) <
        0)
        fail_msg("%s: %s", subj, err.msg);
    dsec_buf_release(&b);
    return reply;
}

/* The answer must be an error of code naming field, its message holding want. */
static void expect_error(dsec_msg *reply, const char *code, const char *field, const char *want)
{
    dsec_err err;
    if (strcmp(dsec_msg_type(reply), "error") != 0)
        fail_msg("expected an error, got %s", dsec_msg_type(reply));
    dsec_decoder *d = dsec_decoder_new(NULL);
    dsec_msg_error e;
    assert_int_equal(
        dsec_decode(d, DSEC_MSG_ERROR, dsec_msg_data(reply), dsec_msg_len(reply), &e, &err), 0);
    if (strcmp(e.code, code) != 0 || (field && (!e.field || strcmp(e.field, field) != 0)) ||
        (want && strstr(e.message, want) == NULL))
        fail_msg("got %s field \"%s\" (%s), expected %s field \"%s\" with \"%s\"", e.code,
                 e.field ? e.field : "", e.message, code, field ? field : "", want ? want : "");
    dsec_decoder_free(d);
    dsec_msg_free(reply);
}

/* A file_data answer; its size. */
static uint64_t expect_data(dsec_msg *reply, char *sha256)
{
    dsec_err err;
    if (strcmp(dsec_msg_type(reply), "file_data") != 0)
        fail_msg("expected file_data, got %s: %.*s", dsec_msg_type(reply), (int)dsec_msg_len(reply),
                 (const char *)dsec_msg_data(reply));
    dsec_decoder *d = dsec_decoder_new(NULL);
    dsec_msg_file_data r;
    assert_int_equal(
        dsec_decode(d, DSEC_MSG_FILE_DATA, dsec_msg_data(reply), dsec_msg_len(reply), &r, &err), 0);
    uint64_t size = r.size;
    if (sha256 != NULL)
        snprintf(sha256, 65, "%s", r.sha256 ? r.sha256 : "");
    dsec_decoder_free(d);
    dsec_msg_free(reply);
    return size;
}

static void hex_of(const uint8_t *p, size_t n, char out[65])
{
    dsec_sha256 h;
    uint8_t d[DSEC_SHA256_LEN];
    dsec_sha256_init(&h);
    dsec_sha256_update(&h, p, n);
    dsec_sha256_final(&h, d);
    for (int i = 0; i < DSEC_SHA256_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

struct src {
    const uint8_t *p;
    size_t len, off;
};

static ssize_t src_read(void *ud, void *buf, size_t n)
{
    struct src *s = ud;
    size_t k = s->len - s->off < n ? s->len - s->off : n;
    memcpy(buf, s->p + s->off, k);
    s->off += k;
    return (ssize_t)k;
}

struct sink {
    uint8_t *p;
    size_t len;
};

static int sink_page(void *ud, const uint8_t *data, size_t len, uint64_t size)
{
    struct sink *k = ud;
    if (k->p == NULL)
        k->p = dsec_malloc(size + 1);
    memcpy(k->p + k->len, data, len);
    k->len += len;
    return 0;
}

/* Uploads land whole or not at all: out of order chunks and wrong digests are refused (the
 * temporary file of a wrong one removed), the target keeps its old content until the commit,
 * an upload resumes from what the sandbox holds (its hash state gone too), downloads carry
 * the digest; mkdir, stat, rename and remove on the file subject. */
static void uploads_downloads_and_file_ops(void **state)
{
    dsec_err err;
    dsec_sandbox_info info;
    static const char *const labels[] = {"runtime=python3", NULL};
    dsec_create_spec spec = {
        .type = "function", .labels = labels, .memory_mb = 256, .cell = "fnbus"};
    if (dsec_create(cl, &spec, &info, &err) < 0)
        fail_msg("create: %s (%s)", err.msg, dsec_code_name(err.code));
    size_t n = 12u << 20;
    uint8_t *src = dsec_malloc(n);
    for (size_t i = 0; i < n; i++)
        src[i] = (uint8_t)(i * 7 + (i >> 13));
    assert_int_equal(dsec_file_write(cl, info.id, "/work/t.bin", "old", 3, 0600, &err), 0);

    /* by hand: a chunk, then one at the wrong offset */
    dsec_msg_file_write w = {
        .id = info.id, .path = "/work/t.bin", .upload = "u1", .data = {src, 1u << 20}};
    assert_int_equal(expect_data(ask(&info, "upload", DSEC_MSG_FILE_WRITE, &w), NULL), 1u << 20);
    w.offset = 5;
    w.data.len = 10;
    expect_error(ask(&info, "upload", DSEC_MSG_FILE_WRITE, &w), "invalid", "offset",
                 "chunk at offset 5 but the upload holds 1048576 bytes; resume from 1048576");
    dsec_dirent st;
    assert_int_equal(dsec_file_stat(cl, info.id, "/work/.dsec-upload-u1", &st, &err), 0);
    assert_int_equal(st.size, 1u << 20);
    assert_int_equal(st.mode & 0777, 0600); /* the mode of the file it replaces */
    dsec_free(st.name);
    uint8_t *back;
    size_t blen;
    assert_int_equal(dsec_file_read(cl, info.id, "/work/t.bin", &back, &blen, &err), 0);
    assert_int_equal(blen, 3); /* untouched until the commit */
    dsec_free(back);
    /* a commit with the wrong digest: refused, its temporary file gone */
    w = (dsec_msg_file_write){
        .id = info.id,
        .path = "/work/t.bin",
        .upload = "u1",
        .offset = 1u << 20,
        .commit = true,
        .size = 1u << 20,
        .sha256 = "0000000000000000000000000000000000000000000000000000000000000000"};
    expect_error(ask(&info, "upload", DSEC_MSG_FILE_WRITE, &w), "invalid", "sha256",
                 "expected 0000");
    assert_int_equal(dsec_file_stat(cl, info.id, "/work/.dsec-upload-u1", &st, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    /* a wrong size: refused by name too */
    w = (dsec_msg_file_write){
        .id = info.id,
        .path = "/work/t.bin",
        .upload = "u1",
        .data = {src, 100},
        .commit = true,
        .size = 99,
        .sha256 = "0000000000000000000000000000000000000000000000000000000000000000"};
    expect_error(ask(&info, "upload", DSEC_MSG_FILE_WRITE, &w), "invalid", "size",
                 "expected 99 bytes, the upload holds 100");
    w = (dsec_msg_file_write){.id = info.id, .path = "/work/t.bin", .upload = "no/slash"};
    expect_error(ask(&info, "upload", DSEC_MSG_FILE_WRITE, &w), "invalid", "upload", NULL);

    /* through libdsec: the whole file, then back with its digest */
    struct src s = {src, n, 0};
    dsec_upload_opts uo = {.chunk = 1u << 20, .window = 4};
    dsec_transfer_result res;
    if (dsec_file_upload(cl, info.id, "/work/t.bin", &uo, src_read, &s, &res, &err) < 0)
        fail_msg("upload: %s", err.msg);
    char want[65];
    hex_of(src, n, want);
    assert_string_equal(res.sha256, want);
    struct sink k = {0};
    dsec_transfer_result dres;
    dsec_download_opts dopt = {.page = 1u << 20, .window = 3};
    if (dsec_file_download(cl, info.id, "/work/t.bin", &dopt, sink_page, &k, &dres, &err) < 0)
        fail_msg("download: %s", err.msg);
    assert_int_equal(k.len, n);
    assert_memory_equal(k.p, src, n);
    assert_string_equal(dres.sha256, want);
    dsec_free(k.p);
    assert_int_equal(dsec_file_stat(cl, info.id, "/work/t.bin", &st, &err), 0);
    assert_int_equal(st.mode & 0777, 0600);
    dsec_free(st.name);

    /* a read that starts in the middle with no running hash: the digest of the whole file */
    dsec_msg_file_read rd = {
        .id = info.id, .path = "/work/t.bin", .offset = n - 10, .sha256 = true};
    char got[65];
    assert_int_equal(expect_data(ask(&info, "read", DSEC_MSG_FILE_READ, &rd), got), n);
    assert_string_equal(got, want);

    /* resume: 2 MiB arrive, then libdsec goes on from there */
    w = (dsec_msg_file_write){
        .id = info.id, .path = "/work/r.bin", .upload = "u2", .data = {src, 2u << 20}};
    assert_int_equal(expect_data(ask(&info, "upload", DSEC_MSG_FILE_WRITE, &w), NULL), 2u << 20);
    s = (struct src){src, n, 0};
    uo = (dsec_upload_opts){.upload_id = "u2", .resume = true};
    if (dsec_file_upload(cl, info.id, "/work/r.bin", &uo, src_read, &s, &res, &err) < 0)
        fail_msg("resumed upload: %s", err.msg);
    assert_int_equal(res.resumed_from, 2u << 20);
    assert_string_equal(res.sha256, want);
    /* a temporary file with no state behind it (a restarted node): its size is what it
     * holds, and the commit hashes it again */
    assert_int_equal(
        dsec_file_write(cl, info.id, "/work/.dsec-upload-u3", src, 3u << 20, 0644, &err), 0);
    uint64_t held = 0;
    assert_int_equal(dsec_file_upload_held(cl, info.id, "/work/q.bin", "u3", &held, &err), 0);
    assert_int_equal(held, 3u << 20);
    s = (struct src){src, n, 0};
    uo = (dsec_upload_opts){.upload_id = "u3", .resume = true};
    if (dsec_file_upload(cl, info.id, "/work/q.bin", &uo, src_read, &s, &res, &err) < 0)
        fail_msg("upload with lost state: %s", err.msg);
    assert_int_equal(res.resumed_from, 3u << 20);
    assert_int_equal(dsec_file_read(cl, info.id, "/work/q.bin", &back, &blen, &err), 0);
    assert_int_equal(blen, n);
    assert_memory_equal(back, src, n);
    dsec_free(back);

    /* mkdir, stat, rename, remove */
    assert_int_equal(dsec_file_mkdir(cl, info.id, "/work/a/b/c", 0700, true, &err), 0);
    assert_int_equal(dsec_file_mkdir(cl, info.id, "/work/a/b/c", 0700, true, &err), 0);
    assert_int_equal(dsec_file_mkdir(cl, info.id, "/work/a/b/c", 0, false, &err), -1);
    assert_int_equal(err.code, DSEC_E_EXISTS);
    assert_int_equal(dsec_file_mkdir(cl, info.id, "/work/x/y", 0, false, &err), -1);
    assert_int_equal(dsec_file_stat(cl, info.id, "/work/a/b/c", &st, &err), 0);
    assert_string_equal(st.kind, "dir");
    assert_int_equal(st.mode & 0777, 0700);
    dsec_free(st.name);
    assert_int_equal(dsec_file_rename(cl, info.id, "/work/q.bin", "/work/a/b/c/q", &err), 0);
    assert_int_equal(dsec_file_stat(cl, info.id, "/work/a/b/c/q", &st, &err), 0);
    assert_string_equal(st.kind, "file");
    assert_int_equal(st.size, n);
    assert_string_equal(st.name, "q");
    dsec_free(st.name);
    assert_int_equal(dsec_file_stat(cl, info.id, "/work/q.bin", &st, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(dsec_file_remove(cl, info.id, "/work/a", false, &err), -1);
    assert_non_null(strstr(err.msg, "recursive"));
    assert_int_equal(dsec_file_remove(cl, info.id, "/work/a", true, &err), 0);
    assert_int_equal(dsec_file_stat(cl, info.id, "/work/a", &st, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    dsec_msg_file_op op = {.id = info.id, .op = "chmod", .path = "/work/t.bin"};
    expect_error(ask(&info, "file", DSEC_MSG_FILE_OP, &op), "invalid", "op", "chmod");
    op = (dsec_msg_file_op){.id = info.id, .op = "rename", .path = "/work/t.bin"};
    expect_error(ask(&info, "file", DSEC_MSG_FILE_OP, &op), "invalid", "to", "missing");
    op = (dsec_msg_file_op){.id = info.id, .op = "stat", .path = "/work/t.bin", .recursive = true};
    expect_error(ask(&info, "file", DSEC_MSG_FILE_OP, &op), "invalid", "recursive", NULL);

    dsec_free(src);
    assert_int_equal(dsec_destroy(cl, info.id, &err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(create_and_exec_python_over_the_bus, need_root),
        cmocka_unit_test_setup(one_shot_call, need_root),
        cmocka_unit_test_setup(refusals_name_their_field, need_root),
        cmocka_unit_test_setup(uploads_downloads_and_file_ops, need_root),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
