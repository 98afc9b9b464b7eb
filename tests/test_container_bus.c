/* test_container_bus.c - containers end to end: a cell on a real nats-server whose node runs real
 * crun containers on busybox:1; libdsec creates, execs, moves files, forks, snapshots, pauses, and
 * a restarted node manager re-adopts what runs, with the runtime that started it. */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/cell.h"
#include "actors/node.h"
#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/sha256.h"
#include "tests/fixture-client.h"
#include "tests/fixture.h"

static dsec_natsd *natsd;
static char root[64];
static dsec_cell_conf conf;
static dsec_cell *cell;
static dsec_client *cl;

static int start_cell(void)
{
    dsec_err err;
    if (dsec_cell_start(&cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0) {
        fprintf(stderr, "cell: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int group_setup(void **state)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_container_bus: needs root (containers); skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    if (dsec_test_server_start("dsec-ctbus", false, &natsd, root, sizeof root) < 0)
        return -1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s/scripts/build-envs.sh --dsec %s --registry %s/layers --state-dir %s --only "
             "busybox >/dev/null",
             DSEC_SRC, DSEC_CLI, root, root);
    if (system(cmd) != 0) {
        fprintf(stderr, "building busybox:1 failed: %s\n", cmd);
        return -1;
    }
    dsec_err err;
    dsec_cell_conf_defaults(&conf);
    snprintf(conf.cell, sizeof conf.cell, "ctbus");
    snprintf(conf.url, sizeof conf.url, "%s", dsec_natsd_url(natsd));
    snprintf(conf.state_dir, sizeof conf.state_dir, "%s/cell", root);
    snprintf(conf.layers_path, sizeof conf.layers_path, "%s/layers", root);
    conf.capacity_ms = 20;
    conf.full_ms = 500;
    /* a quarter of the default: gaps of twice it are still a sharp test of the node's own
     * lane, without counting a 2-core host's scheduling hiccups from parallel tests */
    conf.heartbeat_ms = 250;
    conf.default_disk_mb = 32; /* every create here names no disk_mb: each gets this quota */
    static const char *const types[] = {"container", NULL};
    if (dsec_cell_conf_add_sim_nodes(&conf, "ctbus", 1, 8000, 16384, 64, types, NULL, &err) < 0) {
        fprintf(stderr, "conf: %s\n", err.msg);
        return -1;
    }
    snprintf(conf.nodes[0].backend, sizeof conf.nodes[0].backend, "native");
    if (start_cell() < 0)
        return -1;
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = "ctbus", .timeout_ms = 30000};
    if (dsec_client_connect(&cl, &o, &err) < 0) {
        fprintf(stderr, "client: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* Mounts under the cell's sandbox directories (the layer cache and the
 * upper store stay mounted while the node runs). */
static int sandbox_mounts(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "grep -c ' %s/cell/node-ctbus-0000/container/sb/' /proc/self/mountinfo", root);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p == NULL || fscanf(p, "%d", &n) != 1)
        n = -1;
    if (p)
        pclose(p);
    return n;
}

static int group_teardown(void **state)
{
    dsec_client_free(cl);
    dsec_cell_stop(cell, true);
    dsec_cell_conf_release(&conf);
    if (natsd == NULL)
        return 0;
    /* the node's own mounts (upper store, layer cache) go with its directory */
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "for m in $(awk -v w='%s/' 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | "
             "sort -r); do "
             "umount -l $m; done",
             root);
    if (system(cmd) != 0)
        fprintf(stderr, "teardown: unmounting under %s failed\n", root);
    return dsec_test_server_stop(natsd, root);
}

static void make(const char *env, dsec_sandbox_info *info)
{
    dsec_create_spec cs = {.type = "container", .env = env, .cpu_milli = 500, .memory_mb = 64};
    dsec_test_create(cl, &cs, env, info);
    assert_string_equal(info->type, "container");
}

/* Run sh -c line in id; stdout (without the trailing newline) into out. */
static int sh(const char *id, const char *line, char *out, size_t n)
{
    return dsec_test_exec_sh(cl, id, line, 20000, false, out, n);
}

static void destroy(const char *id)
{
    dsec_test_destroy(cl, id);
}

static void test_exec_files_fork_snapshot(void **state)
{
    if (natsd == NULL)
        skip();
    dsec_sandbox_info a;
    make("busybox:1", &a);
    char out[4096];
    assert_int_equal(sh(a.id, "echo hello from $(hostname)", out, sizeof out), 0);
    assert_non_null(strstr(out, "hello from"));

    /* files through the agent */
    dsec_err err;
    const char *text = "branch point\n";
    assert_int_equal(dsec_file_write(cl, a.id, "/work/state.txt", text, strlen(text), 0644, &err),
                     0);
    uint8_t *data = NULL;
    size_t len = 0;
    assert_int_equal(dsec_file_read(cl, a.id, "/work/state.txt", &data, &len, &err), 0);
    assert_int_equal(len, strlen(text));
    assert_memory_equal(data, text, len);
    dsec_free(data);
    dsec_dirent *ents = NULL;
    size_t nents = 0;
    assert_int_equal(dsec_file_list(cl, a.id, "/work", &ents, &nents, &err), 0);
    assert_int_equal(nents, 1);
    assert_string_equal(ents[0].name, "state.txt");
    dsec_dirents_free(ents, nents);
    assert_int_equal(dsec_file_read(cl, a.id, "/work/missing", &data, &len, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);

    /* fork: children see the branch point, not the parent's later writes, nor each other's */
    char **kids = NULL;
    size_t nk = 0;
    assert_int_equal(dsec_fork(cl, a.id, 2, &kids, &nk, &err), 0);
    assert_int_equal(nk, 2);
    assert_int_equal(sh(a.id, "echo later > /work/state.txt", out, sizeof out), 0);
    assert_int_equal(sh(kids[0], "cat /work/state.txt", out, sizeof out), 0);
    assert_string_equal(out, "branch point");
    assert_int_equal(sh(kids[0], "echo mine > /work/kid0.txt", out, sizeof out), 0);
    assert_int_not_equal(sh(kids[1], "cat /work/kid0.txt", out, sizeof out), 0);
    assert_int_equal(sh(a.id, "cat /work/state.txt", out, sizeof out), 0);
    assert_string_equal(out, "later");

    /* snapshot: a new sandbox created from the published environment sees the state */
    assert_int_equal(dsec_snapshot(cl, a.id, "ctbus/snap:1", &err), 0);
    dsec_sandbox_info b;
    make("ctbus/snap:1", &b);
    assert_int_equal(sh(b.id, "cat /work/state.txt", out, sizeof out), 0);
    assert_string_equal(out, "later");
    assert_int_equal(dsec_snapshot(cl, a.id, "no version", &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);

    /* pause freezes, resume continues */
    assert_int_equal(dsec_pause(cl, b.id, &err), 0);
    dsec_sandbox_info st;
    assert_int_equal(dsec_status(cl, b.id, &st, &err), 0);
    assert_string_equal(st.state, "paused");
    assert_int_equal(dsec_resume(cl, b.id, &err), 0);
    assert_int_equal(sh(b.id, "echo awake", out, sizeof out), 0);
    assert_string_equal(out, "awake");

    destroy(b.id);
    for (size_t i = 0; i < nk; i++) {
        destroy(kids[i]);
        dsec_free(kids[i]);
    }
    dsec_free(kids);
    destroy(a.id);
    assert_int_equal(dsec_status(cl, a.id, &st, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(sandbox_mounts(), 0);
}

struct streamed {
    char out[256];
    size_t len;
    double first_at; /* when the first chunk came */
    int chunks;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_output(void *ud, int stream, const uint8_t *data, size_t len)
{
    struct streamed *st = ud;
    if (st->chunks++ == 0)
        st->first_at = now_s();
    if (stream == 1 && st->len + len < sizeof st->out) {
        memcpy(st->out + st->len, data, len);
        st->len += len;
    }
}

/* Output reaches the client while the command runs, all of it, in order. */
static void test_exec_streams(void **state)
{
    if (natsd == NULL)
        skip();
    dsec_sandbox_info a;
    make("busybox:1", &a);
    const char *argv[] = {"/bin/sh", "-c", "echo first; sleep 1; echo second; echo third", NULL};
    dsec_exec_opts eo = {.argv = argv, .timeout_ms = 20000};
    struct streamed st = {0};
    dsec_exec_reply r;
    dsec_err err;
    double t0 = now_s();
    if (dsec_exec_stream(cl, a.id, &eo, on_output, &st, &r, &err) < 0)
        fail_msg("exec_stream: %s", err.msg);
    double t1 = now_s();
    assert_int_equal(r.exit_code, 0);
    st.out[st.len] = '\0';
    assert_string_equal(st.out, "first\nsecond\nthird\n");
    assert_int_equal(r.out_len, st.len);
    assert_memory_equal(r.out, st.out, st.len);
    /* the first line came a second before the command ended */
    assert_true(st.chunks >= 2);
    assert_true(t1 - st.first_at > 0.7);
    assert_true(st.first_at - t0 < t1 - t0 - 0.7);
    dsec_exec_reply_release(&r);
    /* a plain exec still works the same */
    char out[64];
    assert_int_equal(sh(a.id, "echo plain", out, sizeof out), 0);
    assert_string_equal(out, "plain");
    destroy(a.id);
}

/* `sleep 1000` in the background of sandbox id (a foreground exec's leftovers end with it). */
static dsec_proc sleep_bg(const char *id)
{
    const char *argv[] = {"sleep", "1000", NULL};
    dsec_proc p;
    dsec_err err;
    if (dsec_proc_start(cl, id, &(dsec_proc_opts){.argv = argv}, &p, &err) < 0)
        fail_msg("proc start in %s: %s", id, err.msg);
    return p;
}

static void test_node_restart_readopts(void **state)
{
    if (natsd == NULL)
        skip();
    dsec_sandbox_info a;
    make("busybox:1", &a);
    char out[256];
    assert_int_equal(sh(a.id, "mkdir -p /work && echo 42 > /work/n", out, sizeof out), 0);
    /* a background process (a foreground exec's leftovers end with it) */
    dsec_proc p = sleep_bg(a.id);
    /* the node manager goes away; its containers keep running */
    dsec_cell_stop(cell, false);
    cell = NULL;
    assert_int_equal(start_cell(), 0);
    dsec_err err;
    assert_int_equal(dsec_wait_state(cl, a.id, "running", 10000, &err), 0);
    assert_int_equal(sh(a.id, "cat /work/n; pidof sleep >/dev/null && echo alive", out, sizeof out),
                     0);
    assert_string_equal(out, "42\nalive");
    /* and the restarted node manager still knows it by its handle */
    dsec_proc *v;
    size_t nv;
    assert_int_equal(dsec_proc_list(cl, a.id, &v, &nv, &err), 0);
    assert_int_equal(nv, 1);
    assert_int_equal(v[0].handle, p.handle);
    assert_true(v[0].running);
    dsec_free(v);
    destroy(a.id);
    assert_int_equal(sandbox_mounts(), 0);
}

/* Run the dsec CLI against the test's cell (tenant ctbus); its stdout into out, its exit
 * status returned. */
static int cli(char *out, size_t n, const char *fmt, ...)
{
    char args[1024], cmd[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "DSEC_URL=%s DSEC_TENANT=ctbus %s %s", dsec_natsd_url(natsd),
             DSEC_CLI, args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t k = fread(out, 1, n - 1, f);
    out[k] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The process's info once it has ended (a few seconds at most). */
static dsec_proc ended(const char *id, uint64_t handle)
{
    dsec_proc_out o;
    dsec_err err;
    for (int i = 0; i < 500; i++) {
        if (dsec_proc_read(cl, id, handle, 0, 0, 1, &o, &err) < 0)
            fail_msg("proc read %" PRIu64 ": %s", handle, err.msg);
        dsec_proc p = o.info;
        dsec_proc_out_free(&o);
        if (!p.running)
            return p;
        usleep(10000);
    }
    fail_msg("process %" PRIu64 " in %s still running after 5 s", handle, id);
    return (dsec_proc){0};
}

/* Background processes through the bus, libdsec and the CLI: they outlive the call and the
 * client, keep their output for a late reader, take stdin at the reader's pace, and end by
 * signal; a foreground exec's own leftovers end with it. */
/* A session command line; its result (the caller releases it). */
static int sess(const char *id, uint64_t h, const char *line, uint64_t timeout_ms,
                dsec_exec_reply *r, dsec_err *err)
{
    const char *argv[] = {line, NULL};
    dsec_exec_opts eo = {.argv = argv, .session = h, .timeout_ms = timeout_ms};
    return dsec_exec(cl, id, &eo, r, err);
}

/* A session command that must succeed; its stdout, trailing newlines cut. */
static void sess_ok(const char *id, uint64_t h, const char *line, char *out, size_t n)
{
    dsec_exec_reply r;
    dsec_err err;
    if (sess(id, h, line, 20000, &r, &err) < 0)
        fail_msg("session command '%s': %s", line, err.msg);
    if (r.exit_code != 0)
        fail_msg("session command '%s' exited %d: %.*s", line, r.exit_code, (int)r.err_len,
                 (char *)r.err_out);
    size_t k = r.out_len < n - 1 ? r.out_len : n - 1;
    memcpy(out, r.out, k);
    while (k > 0 && out[k - 1] == '\n')
        k--;
    out[k] = '\0';
    dsec_exec_reply_release(&r);
}

static void test_shell_sessions(void **state)
{
    dsec_sandbox_info a;
    make("busybox:1", &a);
    dsec_err err;
    dsec_proc s;
    assert_int_equal(dsec_session_start(cl, a.id, NULL, &s, &err), 0);
    assert_true(s.session && s.running && !s.pty);
    char got[512];
    /* directory, shell variables, exported variables and functions carry over */
    sess_ok(a.id, s.handle, "cd /tmp && X=5 && export Y=7 && f() { echo \"f:$1\"; }", got,
            sizeof got);
    sess_ok(a.id, s.handle, "pwd; echo $X; sh -c 'echo $Y'; f z", got, sizeof got);
    assert_string_equal(got, "/tmp\n5\n7\nf:z");
    /* each command its own exit code and streams; output without a newline comes whole */
    dsec_exec_reply r;
    assert_int_equal(sess(a.id, s.handle, "echo oops >&2; printf partial; false", 20000, &r, &err),
                     0);
    assert_int_equal(r.exit_code, 1);
    assert_int_equal(r.out_len, 7);
    assert_memory_equal(r.out, "partial", 7);
    assert_int_equal(r.err_len, 5);
    assert_memory_equal(r.err_out, "oops\n", 5);
    assert_false(r.interrupted || r.session_ended || r.timed_out);
    dsec_exec_reply_release(&r);
    /* a command's stdin is empty: cat returns at once */
    sess_ok(a.id, s.handle, "cat; echo after-cat", got, sizeof got);
    assert_string_equal(got, "after-cat");
    /* a syntax error fails that command, not the session */
    assert_int_equal(sess(a.id, s.handle, "if then fi", 20000, &r, &err), 0);
    assert_true(r.exit_code != 0);
    assert_true(r.err_len > 0);
    dsec_exec_reply_release(&r);
    /* a timeout ends that command only */
    assert_int_equal(sess(a.id, s.handle, "sleep 100", 1000, &r, &err), 0);
    assert_true(r.timed_out);
    dsec_exec_reply_release(&r);
    sess_ok(a.id, s.handle, "echo $X $(pwd)", got, sizeof got);
    assert_string_equal(got, "5 /tmp");
    /* an interrupt (on the sig subject, past the running command) ends that command only */
    dsec_test_bg_sess b = {.cl = cl,
                           .id = a.id,
                           .h = s.handle,
                           .line = "sleep 100; echo not-interrupted",
                           .timeout_ms = 60000};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, dsec_test_sess_bg, &b), 0);
    /* (a proc list would wait behind the running command: a sandbox's operations run in
     * order; only signals on the sig subject pass it) */
    for (int i = 0; i < 40 && !atomic_load(&b.done); i++) { /* (harmless when idle) */
        usleep(500 * 1000);
        assert_int_equal(dsec_session_interrupt(cl, a.id, s.handle, &err), 0);
    }
    pthread_join(th, NULL);
    assert_int_equal(b.rc, 0);
    assert_true(b.r.interrupted);
    assert_int_equal(b.r.exit_code, 130);
    assert_null(strstr(b.r.out_len ? (char *)b.r.out : "", "not-interrupted"));
    dsec_exec_reply_release(&b.r);
    sess_ok(a.id, s.handle, "echo $X", got, sizeof got);
    assert_string_equal(got, "5");
    /* bad input: two arguments, a cwd, a handle that is no session, an unknown handle */
    const char *two[] = {"echo", "x", NULL};
    assert_int_equal(
        dsec_exec(cl, a.id, &(dsec_exec_opts){.argv = two, .session = s.handle}, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    const char *one[] = {"pwd", NULL};
    assert_int_equal(dsec_exec(cl, a.id,
                               &(dsec_exec_opts){.argv = one, .session = s.handle, .cwd = "/"}, &r,
                               &err),
                     -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    printf("session exec with a cwd: %s\n", err.msg);
    assert_int_equal(sess(a.id, 999999, "true", 20000, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    dsec_proc plain;
    const char *sl[] = {"sleep", "300", NULL};
    assert_int_equal(dsec_proc_start(cl, a.id, &(dsec_proc_opts){.argv = sl}, &plain, &err), 0);
    assert_int_equal(sess(a.id, plain.handle, "true", 20000, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    printf("a plain process as a session: %s\n", err.msg);
    /* exit ends the session: its code, then state for what comes after */
    assert_int_equal(sess(a.id, s.handle, "exit 3", 20000, &r, &err), 0);
    assert_int_equal(r.exit_code, 3);
    assert_true(r.session_ended);
    dsec_exec_reply_release(&r);
    assert_int_equal(sess(a.id, s.handle, "true", 20000, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    /* the CLI: dsec session, exec --session */
    char out[4096];
    assert_int_equal(cli(out, sizeof out, "session %s", a.id), 0);
    uint64_t h = strtoull(out, NULL, 10);
    assert_true(h > s.handle);
    assert_int_equal(
        cli(out, sizeof out, "exec --session %" PRIu64 " %s -- 'cd /etc; Z=9'", h, a.id), 0);
    assert_int_equal(
        cli(out, sizeof out, "exec --session %" PRIu64 " %s -- 'echo $(pwd) $Z'", h, a.id), 0);
    assert_string_equal(out, "/etc 9\n");
    assert_int_equal(cli(out, sizeof out, "exec --session %" PRIu64 " %s -- 'exit 4'", h, a.id), 4);
    destroy(a.id);
}

/* Read a pty process's output from *off until it holds want (or fail). */
static void pty_expect(const char *id, uint64_t h, uint64_t *off, const char *want, char *acc,
                       size_t n)
{
    dsec_err err;
    size_t len = strlen(acc);
    for (int i = 0; i < 100; i++) {
        dsec_proc_out o;
        if (dsec_proc_read_wait(cl, id, h, *off, 0, 0, 500, &o, &err) < 0)
            fail_msg("pty read: %s", err.msg);
        size_t k = o.out_len < n - 1 - len ? o.out_len : n - 1 - len;
        memcpy(acc + len, o.out, k);
        len += k;
        acc[len] = '\0';
        *off = o.out_from + o.out_len;
        bool running = o.info.running;
        dsec_proc_out_free(&o);
        if (strstr(acc, want) != NULL)
            return;
        if (!running)
            break;
    }
    fail_msg("the terminal never showed \"%s\"; it showed:\n%s", want, acc);
}

static void test_terminals(void **state)
{
    dsec_sandbox_info a;
    make("busybox:1", &a);
    dsec_err err;
    dsec_proc t;
    const char *argv[] = {"sh", NULL};
    assert_int_equal(
        dsec_proc_start(cl, a.id,
                        &(dsec_proc_opts){.argv = argv, .pty = true, .rows = 30, .cols = 100}, &t,
                        &err),
        0);
    assert_true(t.pty && t.stdin_open);
    uint64_t off = 0;
    char acc[8192] = "";
    /* the window, then a resize */
    const char *k1 = "stty size; echo $TERM\n";
    assert_int_equal(dsec_proc_write(cl, a.id, t.handle, k1, strlen(k1), false, &err), 0);
    pty_expect(a.id, t.handle, &off, "30 100", acc, sizeof acc);
    pty_expect(a.id, t.handle, &off, "xterm-256color", acc, sizeof acc);
    assert_int_equal(dsec_proc_resize(cl, a.id, t.handle, 40, 120, &err), 0);
    acc[0] = '\0';
    const char *k2 = "stty size\n";
    assert_int_equal(dsec_proc_write(cl, a.id, t.handle, k2, strlen(k2), false, &err), 0);
    pty_expect(a.id, t.handle, &off, "40 120", acc, sizeof acc);
    /* Ctrl-C interrupts the foreground job; the shell goes on */
    acc[0] = '\0';
    const char *k3 = "sleep 100; echo slept\n";
    assert_int_equal(dsec_proc_write(cl, a.id, t.handle, k3, strlen(k3), false, &err), 0);
    usleep(300000);
    assert_int_equal(dsec_proc_write(cl, a.id, t.handle, "\x03", 1, false, &err), 0);
    const char *k4 = "echo back-$((6*7))\n";
    assert_int_equal(dsec_proc_write(cl, a.id, t.handle, k4, strlen(k4), false, &err), 0);
    pty_expect(a.id, t.handle, &off, "back-42", acc, sizeof acc);
    /* a waiting read with nothing to say answers empty when its wait is over (the prompt
     * may still come after back-42: read on until the shell is quiet) */
    dsec_proc_out o;
    size_t got = 1;
    for (int i = 0; i < 20 && got > 0; i++) {
        assert_int_equal(dsec_proc_read_wait(cl, a.id, t.handle, off, 0, 0, 300, &o, &err), 0);
        got = o.out_len;
        off = o.out_from + o.out_len;
        assert_true(o.info.running);
        dsec_proc_out_free(&o);
    }
    assert_int_equal(got, 0);
    const char *k5 = "exit 7\n";
    assert_int_equal(dsec_proc_write(cl, a.id, t.handle, k5, strlen(k5), false, &err), 0);
    dsec_proc p = ended(a.id, t.handle);
    assert_int_equal(p.exit_code, 7);
    /* bad input: a window on a process without a terminal, a zero window */
    dsec_proc plain;
    const char *sl[] = {"sleep", "300", NULL};
    assert_int_equal(dsec_proc_start(cl, a.id, &(dsec_proc_opts){.argv = sl}, &plain, &err), 0);
    assert_int_equal(dsec_proc_resize(cl, a.id, plain.handle, 10, 10, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    printf("resize without a terminal: %s\n", err.msg);
    assert_int_equal(dsec_proc_resize(cl, a.id, plain.handle, 0, 10, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    /* a waiting read wakes for output, not at its deadline */
    dsec_proc late;
    const char *lt[] = {"sh", "-c", "sleep 1; echo late", NULL};
    assert_int_equal(dsec_proc_start(cl, a.id, &(dsec_proc_opts){.argv = lt}, &late, &err), 0);
    assert_int_equal(dsec_proc_read_wait(cl, a.id, late.handle, 0, 0, 0, 30000, &o, &err), 0);
    assert_int_equal(o.out_len, 5);
    assert_memory_equal(o.out, "late\n", 5);
    dsec_proc_out_free(&o);
    /* dsec exec -it: keys from a file (no terminal here), output and exit status back */
    char in[128], out[4096];
    snprintf(in, sizeof in, "%s/tty-in.txt", root);
    FILE *fin = fopen(in, "w");
    assert_non_null(fin);
    fputs("abc\n", fin);
    fclose(fin);
    assert_int_equal(
        cli(out, sizeof out, "exec -it %s -- sh -c 'read x; echo got-$x; exit 5' < %s", a.id, in),
        5);
    assert_non_null(strstr(out, "got-abc"));
    destroy(a.id);
}

struct fg_cmd {
    const char *id;
    uint64_t session;
    dsec_exec_reply r;
    int rc;
    dsec_err err;
    atomic_bool done;
};

static void *fg_run(void *arg)
{
    struct fg_cmd *f = arg;
    f->rc = sess(f->id, f->session,
                 "touch /tmp/fg-started; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo fg-done",
                 60000, &f->r, &f->err);
    atomic_store(&f->done, true);
    return NULL;
}

/* Process calls but start pass a running foreground command (the sig subject, the side
 * lane). The session command below ends only once a background process got a line on its
 * stdin; if the write, the list or the reads waited behind it, it would time out. */
static void test_proc_calls_beside_a_command(void **state)
{
    dsec_sandbox_info a;
    make("busybox:1", &a);
    dsec_err err;
    dsec_proc bg, watch, s;
    const char *bga[] = {"sh", "-c", "echo ready; read x; echo got-$x; touch /tmp/go", NULL};
    assert_int_equal(
        dsec_proc_start(cl, a.id, &(dsec_proc_opts){.argv = bga, .keep_stdin = true}, &bg, &err),
        0);
    const char *wa[] = {"sh", "-c",
                        "while [ ! -e /tmp/fg-started ]; do sleep 0.05; done; echo fg-seen", NULL};
    assert_int_equal(dsec_proc_start(cl, a.id, &(dsec_proc_opts){.argv = wa}, &watch, &err), 0);
    assert_int_equal(dsec_session_start(cl, a.id, NULL, &s, &err), 0);
    static struct fg_cmd f;
    memset(&f, 0, sizeof f);
    f.id = a.id;
    f.session = s.handle;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fg_run, &f), 0);
    char acc[4096] = "";
    uint64_t off = 0;
    pty_expect(a.id, watch.handle, &off, "fg-seen", acc, sizeof acc); /* the command runs */
    /* the list answers meanwhile, and shows the session busy */
    dsec_proc *v = NULL;
    size_t nv = 0;
    assert_int_equal(dsec_proc_list(cl, a.id, &v, &nv, &err), 0);
    bool busy = false;
    for (size_t i = 0; i < nv; i++)
        if (v[i].handle == s.handle)
            busy = v[i].busy;
    dsec_free(v);
    assert_true(busy);
    assert_false(atomic_load(&f.done));
    /* so does a read of the background process, and the write its stdin waits for */
    off = 0;
    acc[0] = '\0';
    pty_expect(a.id, bg.handle, &off, "ready", acc, sizeof acc);
    assert_false(atomic_load(&f.done));
    assert_int_equal(dsec_proc_write(cl, a.id, bg.handle, "go\n", 3, true, &err), 0);
    pty_expect(a.id, bg.handle, &off, "got-go", acc, sizeof acc);
    pthread_join(th, NULL);
    if (f.rc < 0)
        fail_msg("the session command: %s", f.err.msg);
    assert_false(f.r.timed_out);
    assert_int_equal(f.r.exit_code, 0);
    assert_int_equal(f.r.out_len, 8);
    assert_memory_equal(f.r.out, "fg-done\n", 8);
    dsec_exec_reply_release(&f.r);
    /* a paused sandbox's calls go on proc (its agent is frozen meanwhile), which says so */
    if (dsec_pause(cl, a.id, &err) < 0)
        fail_msg("pausing: %s", err.msg);
    assert_int_equal(dsec_proc_list(cl, a.id, &v, &nv, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    assert_non_null(strstr(err.msg, "resume it first"));
    assert_int_equal(dsec_resume(cl, a.id, &err), 0);
    assert_int_equal(dsec_proc_list(cl, a.id, &v, &nv, &err), 0);
    dsec_free(v);
    assert_true(nv >= 3);
    destroy(a.id);
}

struct evs {
    char seen[8192];
};

static void on_ev(void *ud, const dsec_dir_event *ev)
{
    struct evs *e = ud;
    size_t n = strlen(e->seen);
    snprintf(e->seen + n, sizeof e->seen - n, "%s %s%s\n", ev->event, ev->path, ev->dir ? "/" : "");
}

/* A write to the stdin of a process that does not read waits for it on the node's loop, not on
 * a thread: meanwhile the sandbox's other process calls (they share its side lane) answer, a
 * second write to the same process is refused as such, and the write ends, with the reason,
 * when the process does. */
static void test_unread_stdin_waits_on_the_loop(void **state)
{
    (void)state;
    dsec_sandbox_info a;
    make("busybox:1", &a);
    dsec_err err;
    dsec_proc idle, cat;
    const char *idle_argv[] = {"sleep", "300", NULL}, *cat_argv[] = {"cat", NULL};
    assert_int_equal(dsec_proc_start(cl, a.id,
                                     &(dsec_proc_opts){.argv = idle_argv, .keep_stdin = true},
                                     &idle, &err),
                     0);
    assert_int_equal(dsec_proc_start(cl, a.id,
                                     &(dsec_proc_opts){.argv = cat_argv, .keep_stdin = true}, &cat,
                                     &err),
                     0);
    /* static: a failed assertion leaves the thread writing into it, not into a dead frame */
    static dsec_test_stdin_writer w;
    w = (dsec_test_stdin_writer){.cl = cl, .id = a.id, .handle = idle.handle};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, dsec_test_write_big, &w), 0);
    /* a client that gives up after 5 s: each call below must not wait for the write */
    dsec_client *quick = NULL;
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = "ctbus", .timeout_ms = 5000};
    assert_int_equal(dsec_client_connect(&quick, &o, &err), 0);
    bool refused = false;
    for (int i = 0; i < 500 && !refused; i++) { /* until the write waits in the sandbox */
        usleep(20000);
        refused = dsec_proc_write(quick, a.id, idle.handle, "y", 1, false, &err) < 0;
    }
    assert_true(refused);
    printf("a second write while the first waits: %s\n", err.msg);
    assert_non_null(strstr(err.msg, "has not taken the bytes of an earlier write"));
    dsec_proc *v;
    size_t nv;
    if (dsec_proc_list(quick, a.id, &v, &nv, &err) < 0)
        fail_msg("listing while a write waits: %s", err.msg);
    assert_int_equal(nv, 2);
    dsec_free(v);
    if (dsec_proc_write(quick, a.id, cat.handle, "hi\n", 3, false, &err) < 0)
        fail_msg("writing to another process while a write waits: %s", err.msg);
    dsec_proc_out out = {0};
    for (int i = 0; i < 250 && out.out_len < 3; i++) {
        dsec_proc_out_free(&out);
        if (dsec_proc_read_wait(quick, a.id, cat.handle, 0, 0, 0, 200, &out, &err) < 0)
            fail_msg("reading cat's output while a write waits: %s", err.msg);
    }
    assert_int_equal(out.out_len, 3);
    assert_memory_equal(out.out, "hi\n", 3);
    dsec_proc_out_free(&out);
    /* the process that never read ends: the waiting write ends with it, and says so */
    assert_int_equal(dsec_proc_signal(quick, a.id, idle.handle, SIGKILL, &err), 0);
    pthread_join(t, NULL);
    assert_int_equal(w.rc, -1);
    printf("the waiting write, once its process was killed: %s\n", w.err.msg);
    /* killed, its end of the pipe closes (or it is reaped first): either says bytes were left */
    assert_true(strstr(w.err.msg, "ended before it took all of its stdin") != NULL ||
                strstr(w.err.msg, "closed its stdin with") != NULL);
    /* the sandbox destroyed while a write waits: the destroy does not wait for the write (it
     * did: the write waited for a process only the destroy would end), the write ends */
    assert_int_equal(dsec_proc_start(cl, a.id,
                                     &(dsec_proc_opts){.argv = idle_argv, .keep_stdin = true},
                                     &idle, &err),
                     0);
    w = (dsec_test_stdin_writer){.cl = cl, .id = a.id, .handle = idle.handle};
    assert_int_equal(pthread_create(&t, NULL, dsec_test_write_big, &w), 0);
    refused = false;
    for (int i = 0; i < 500 && !refused; i++) {
        usleep(20000);
        refused = dsec_proc_write(quick, a.id, idle.handle, "y", 1, false, &err) < 0 &&
                  strstr(err.msg, "has not taken the bytes of an earlier write") != NULL;
    }
    assert_true(refused);
    if (dsec_destroy(quick, a.id, &err) < 0)
        fail_msg("destroying a sandbox while a stdin write waits: %s", err.msg);
    pthread_join(t, NULL);
    assert_int_equal(w.rc, -1);
    printf("the waiting write, once its sandbox was destroyed: %s\n", w.err.msg);
    dsec_client_free(quick);
}

static void test_watch(void **state)
{
    dsec_sandbox_info a;
    make("busybox:1", &a);
    dsec_err err;
    char got[256];
    assert_int_equal(sh(a.id, "mkdir -p /w/old", got, sizeof got), 0);
    dsec_proc w;
    assert_int_equal(dsec_dir_watch(cl, a.id, "/w", true, &w, &err), 0);
    assert_true(w.running);
    /* a change made by a command, seen by the client as it happens */
    assert_int_equal(sh(a.id,
                        "echo x > /w/f && mv /w/f /w/g && mkdir /w/new && echo y > /w/new/h "
                        "&& rm /w/g",
                        got, sizeof got),
                     0);
    struct evs e = {""};
    uint64_t off = 0;
    for (int i = 0; i < 20 && strstr(e.seen, "delete /w/g\n") == NULL; i++)
        assert_true(dsec_dir_events(cl, a.id, w.handle, &off, 1000, on_ev, &e, NULL, &err) >= 0);
    assert_non_null(strstr(e.seen, "create /w/f\nmodify /w/f\nmoved_from /w/f\nmoved_to /w/g\n"
                                   "create /w/new/\n"));
    /* made in a directory that came after the watch: seen by inotify or by the scan of it */
    assert_non_null(strstr(e.seen, "create /w/new/h\n"));
    assert_non_null(strstr(e.seen, "delete /w/g\n"));
    /* the watcher is a background process: listed, and ended by a signal */
    assert_int_equal(dsec_proc_signal(cl, a.id, w.handle, 9, &err), 0);
    /* bad input: a relative path, a file, a missing directory */
    assert_int_equal(dsec_dir_watch(cl, a.id, "w", false, &w, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_int_equal(dsec_dir_watch(cl, a.id, "/etc/passwd", false, &w, &err), -1);
    assert_non_null(strstr(err.msg, "not a directory"));
    assert_int_equal(dsec_dir_watch(cl, a.id, "/nope", false, &w, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    printf("watching a missing directory: %s\n", err.msg);
    /* the CLI: dsec watch --count, fed by a change made after it started */
    char out[4096], cmd[512];
    snprintf(cmd, sizeof cmd, "(sleep 1; touch /w/old/t)");
    const char *bg[] = {"/bin/sh", "-c", cmd, NULL};
    dsec_proc p;
    assert_int_equal(dsec_proc_start(cl, a.id, &(dsec_proc_opts){.argv = bg}, &p, &err), 0);
    assert_int_equal(cli(out, sizeof out, "watch %s /w -r --json --count 1", a.id), 0);
    assert_non_null(strstr(out, "{\"event\":\"create\",\"path\":\"/w/old/t\",\"dir\":false}"));
    destroy(a.id);
}

static void test_background_processes(void **state)
{
    dsec_sandbox_info a;
    make("busybox:1", &a);
    dsec_err err;
    dsec_proc srv, cat;
    const char *srv_argv[] = {"sh", "-c", "echo out; echo err >&2; exec sleep 300", NULL};
    assert_int_equal(dsec_proc_start(cl, a.id, &(dsec_proc_opts){.argv = srv_argv}, &srv, &err), 0);
    assert_true(srv.handle > 0 && srv.pid > 0 && srv.running);
    const char *cat_argv[] = {"cat", NULL};
    assert_int_equal(dsec_proc_start(cl, a.id,
                                     &(dsec_proc_opts){.argv = cat_argv,
                                                       .keep_stdin = true,
                                                       .stdin_data = "hel",
                                                       .stdin_len = 3},
                                     &cat, &err),
                     0);
    assert_true(cat.handle != srv.handle);
    /* stdin at the reader's pace; closing it ends cat */
    assert_int_equal(dsec_proc_write(cl, a.id, cat.handle, "lo\n", 3, true, &err), 0);
    dsec_proc p = ended(a.id, cat.handle);
    assert_int_equal(p.exit_code, 0);
    assert_int_equal(p.signal, 0);
    assert_int_equal(p.out_total, 6);
    assert_int_equal(dsec_proc_write(cl, a.id, cat.handle, "x", 1, false, &err), -1);
    printf("write to an ended process: %s\n", err.msg);

    /* another client (the first may be gone) finds the server by its handle */
    dsec_client *other = NULL;
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = "ctbus", .timeout_ms = 30000};
    assert_int_equal(dsec_client_connect(&other, &o, &err), 0);
    dsec_proc *v;
    size_t nv;
    assert_int_equal(dsec_proc_list(other, a.id, &v, &nv, &err), 0);
    assert_int_equal(nv, 2);
    bool seen = false;
    for (size_t i = 0; i < nv; i++)
        if (v[i].handle == srv.handle) {
            seen = true;
            assert_true(v[i].running);
            assert_non_null(strstr(v[i].cmdline, "echo out"));
        }
    assert_true(seen);
    dsec_free(v);
    dsec_proc_out w;
    for (int i = 0; i < 500; i++) { /* its first lines, as it wrote them */
        assert_int_equal(dsec_proc_read(other, a.id, srv.handle, 0, 0, 0, &w, &err), 0);
        if (w.out_len == 4 && w.err_len == 4)
            break;
        dsec_proc_out_free(&w);
        usleep(10000);
    }
    assert_string_equal((char *)w.out, "out\n");
    assert_string_equal((char *)w.err, "err\n");
    assert_int_equal(w.out_from, 0);
    dsec_proc_out_free(&w);
    dsec_client_free(other);

    /* the CLI: ps, kill -s TERM, exec -d, attach */
    char out[4096];
    assert_int_equal(cli(out, sizeof out, "ps %s", a.id), 0);
    assert_non_null(strstr(out, "running"));
    assert_non_null(strstr(out, "exited 0"));
    assert_int_equal(cli(out, sizeof out, "kill %s %" PRIu64 " -s TERM", a.id, srv.handle), 0);
    p = ended(a.id, srv.handle);
    assert_int_equal(p.signal, 15);
    assert_int_equal(p.exit_code, -1);
    assert_int_equal(dsec_proc_signal(cl, a.id, srv.handle, 9, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    assert_int_equal(dsec_proc_signal(cl, a.id, 999999, 9, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(
        cli(out, sizeof out, "exec -d %s -- sh -c 'sleep 0.5; echo late; exit 3'", a.id), 0);
    uint64_t h = strtoull(out, NULL, 10);
    assert_true(h > cat.handle);
    assert_int_equal(cli(out, sizeof out, "attach %s %" PRIu64, a.id, h), 3);
    assert_string_equal(out, "late\n");
    /* attach -i: this command's stdin goes to the process, its end closes the process's */
    assert_int_equal(cli(out, sizeof out, "exec -d --keep-stdin %s -- cat", a.id), 0);
    uint64_t hc = strtoull(out, NULL, 10);
    char in[128];
    snprintf(in, sizeof in, "%s/attach-in.txt", root);
    FILE *fin = fopen(in, "w");
    assert_non_null(fin);
    fputs("typed\n", fin);
    fclose(fin);
    assert_int_equal(cli(out, sizeof out, "attach -i %s %" PRIu64 " < %s", a.id, hc, in), 0);
    assert_string_equal(out, "typed\n");
    assert_int_equal(cli(out, sizeof out, "ps %s", a.id), 0);
    assert_non_null(strstr(out, "exited 3"));
    assert_non_null(strstr(out, "killed (TERM)"));

    /* a foreground exec's leftovers end with it: nothing of it runs once it answered */
    char got[256];
    assert_int_equal(sh(a.id, "sleep 301 & (setsid sleep 302 &); echo started", got, sizeof got),
                     0);
    assert_string_equal(got, "started");
    assert_int_equal(sh(a.id,
                        "n=0; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null "
                        "| grep -q '^sleep 30[12] ' && n=$((n+1)); done; echo $n",
                        got, sizeof got),
                     0);
    assert_string_equal(got, "0");
    destroy(a.id);
}

/* Node 0's backend option k=v, added (restart the cell for it to count). */
static void add_opt(const char *k, const char *v)
{
    dsec_cell_node *n = &conf.nodes[0];
    assert_true(n->nopts < sizeof n->opts / sizeof n->opts[0]);
    n->opts[n->nopts].key = dsec_strdup(k);
    n->opts[n->nopts].value = dsec_strdup(v);
    assert_true(n->opts[n->nopts].key != NULL && n->opts[n->nopts].value != NULL);
    n->nopts++;
}

/* Remove the last n options add_opt added. */
static void drop_opts(size_t n)
{
    dsec_cell_node *nd = &conf.nodes[0];
    for (; n > 0 && nd->nopts > 0; n--) {
        nd->nopts--;
        dsec_free((char *)nd->opts[nd->nopts].key);
        dsec_free((char *)nd->opts[nd->nopts].value);
    }
}

static void restart_cell(void)
{
    dsec_cell_stop(cell, false);
    cell = NULL;
    assert_int_equal(start_cell(), 0);
}

/* The node manager comes back configured with runc. First without crun, which started the
 * sandbox (crun_path points nowhere): the sandbox is not served, but its journal record is
 * kept and the container left running. Then with crun there again: adopted by crun, whatever
 * the node's runtime, with its file and its process. */
static void test_node_restart_runtime(void **state)
{
    if (natsd == NULL)
        skip();
    if (system("PATH=/usr/sbin:/usr/bin:/sbin:/bin command -v runc >/dev/null") != 0) {
        fprintf(stderr, "test_container_bus: runc is not installed; runtime switch not tested\n");
        skip();
    }
    dsec_sandbox_info a;
    make("busybox:1", &a);
    char out[256];
    assert_int_equal(sh(a.id, "mkdir -p /work && echo 7 > /work/n", out, sizeof out), 0);
    sleep_bg(a.id);
    add_opt("runtime", "runc");
    add_opt("crun_path", "/nonexistent/crun");
    restart_cell();
    dsec_err err;
    assert_int_equal(dsec_wait_state(cl, a.id, "running", 1500, &err), -1);
    drop_opts(1); /* crun is found again; runc stays the node's runtime */
    restart_cell();
    if (dsec_wait_state(cl, a.id, "running", 10000, &err) < 0)
        fail_msg("not re-adopted once crun is back: %s", err.msg);
    assert_int_equal(sh(a.id, "cat /work/n; pidof sleep >/dev/null && echo alive", out, sizeof out),
                     0);
    assert_string_equal(out, "7\nalive");
    destroy(a.id);
    assert_int_equal(sandbox_mounts(), 0);
    drop_opts(1);
    restart_cell();
}

/* A container created without disk_mb gets the cell default as a btrfs quota: it cannot
 * fill the node's upper store, and its neighbour writes on. */
static void test_default_disk_quota(void **state)
{
    if (natsd == NULL)
        skip();
    dsec_sandbox_info a, b;
    make("busybox:1", &a);
    make("busybox:1", &b);
    char out[4096];
    /* 64 MB into the cell default of 32: the write fails inside the sandbox */
    int rc = sh(a.id, "dd if=/dev/zero of=/root/fill bs=1M count=64 2>&1; e=$?; sync; exit $e", out,
                sizeof out);
    printf("container_bus: dd of 64 MB without disk_mb (cell default 32): exit %d, \"%s\"\n", rc,
           out);
    assert_int_not_equal(rc, 0);
    assert_true(strstr(out, "Disk quota exceeded") != NULL || strstr(out, "No space left") != NULL);
    assert_int_equal(sh(a.id, "ls -l /root/fill | awk '{print $5}'", out, sizeof out), 0);
    assert_true(strtoull(out, NULL, 10) <= 33u << 20);
    /* the neighbour still writes, up to its own quota */
    assert_int_equal(sh(b.id,
                        "dd if=/dev/zero of=/root/mine bs=1M count=16 2>/dev/null && sync && "
                        "ls -l /root/mine | awk '{print $5}'",
                        out, sizeof out),
                     0);
    assert_string_equal(out, "16777216");
    dsec_err err;
    const char *text = "still writable\n";
    assert_int_equal(dsec_file_write(cl, b.id, "/work/note", text, strlen(text), 0644, &err), 0);
    /* the filled one goes on once it frees its own space */
    assert_int_equal(
        sh(a.id, "rm /root/fill; sync; echo ok > /root/after && cat /root/after", out, sizeof out),
        0);
    assert_string_equal(out, "ok");
    destroy(a.id);
    destroy(b.id);
}

struct sleeper {
    const char *id;
    int rc, code;
    char err[256];
};

static void *run_sleep(void *p)
{
    struct sleeper *s = p;
    const char *argv[] = {"/bin/sleep", "3", NULL};
    dsec_exec_opts eo = {.argv = argv, .timeout_ms = 60000};
    dsec_exec_reply r;
    dsec_err err;
    s->rc = dsec_exec(cl, s->id, &eo, &r, &err);
    if (s->rc == 0) {
        s->code = r.exit_code;
        dsec_exec_reply_release(&r);
    } else {
        snprintf(s->err, sizeof s->err, "%.200s", err.msg);
    }
    return NULL;
}

/* 40 containers each run a 3 s command at the same moment: all 40 run at once on the node
 * (it used to run 16, one per bus worker, and the rest waited). */
static void test_many_commands_at_once(void **state)
{
    enum { N = 40 };
    static dsec_sandbox_info info[N];
    static struct sleeper sl[N];
    pthread_t th[N];
    dsec_err err;
    for (int i = 0; i < N; i++) {
        dsec_create_spec cs = {
            .type = "container", .env = "busybox:1", .cpu_milli = 100, .memory_mb = 32};
        if (dsec_create(cl, &cs, &info[i], &err) < 0)
            fail_msg("create %d: %s", i, err.msg);
    }
    for (int i = 0; i < N; i++) {
        sl[i] = (struct sleeper){.id = info[i].id, .rc = -1};
        assert_int_equal(pthread_create(&th[i], NULL, run_sleep, &sl[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        if (sl[i].rc != 0)
            fail_msg("exec %d: %s", i, sl[i].err);
        assert_int_equal(sl[i].code, 0);
    }
    dsec_node_stats ns;
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &ns);
    fprintf(stderr, "container: %d commands of 3 s: %" PRIu64 " in flight at once\n", N,
            ns.execs_peak);
    assert_true(ns.execs_peak >= N);
    assert_int_equal(ns.execs_inflight, 0);
    for (int i = 0; i < N; i++)
        destroy(info[i].id);
}

/* A client that gives up on a long command (here: its 1 s wait passes) and goes away; a new
 * client asks again with the same req_id and gets the first run's answer, once the command
 * ends: it ran once. Then across a restart of the node manager: the answer is still kept, and
 * a command that ran while it went away is not run again. */
static void test_answer_collected_by_req_id(void **state)
{
    dsec_sandbox_info info;
    make("busybox:1", &info);
    dsec_client *quick = NULL;
    dsec_err err;
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = "ctbus", .timeout_ms = 1000};
    assert_int_equal(dsec_client_connect(&quick, &o, &err), 0);
    const char *argv[] = {"/bin/sh", "-c", "echo run >> /tmp/runs; sleep 4; wc -l < /tmp/runs",
                          NULL};
    dsec_exec_opts eo = {.argv = argv, .req_id = "collect-me-1"};
    dsec_exec_reply r;
    assert_int_equal(dsec_exec(quick, info.id, &eo, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_TIMEOUT);
    assert_non_null(strstr(err.msg, "collect-me-1"));
    dsec_client_free(quick); /* the client is gone; the command goes on */

    dsec_client *again = NULL;
    o.timeout_ms = 30000;
    assert_int_equal(dsec_client_connect(&again, &o, &err), 0);
    if (dsec_exec(again, info.id, &eo, &r, &err) < 0)
        fail_msg("collecting: %s", err.msg);
    assert_int_equal(r.exit_code, 0);
    assert_string_equal((char *)r.out, "1\n");
    dsec_exec_reply_release(&r);
    /* and again: the same answer, still without a second run */
    assert_int_equal(dsec_exec(again, info.id, &eo, &r, &err), 0);
    assert_string_equal((char *)r.out, "1\n");
    dsec_exec_reply_release(&r);
    char out[64];
    assert_int_equal(sh(info.id, "wc -l < /tmp/runs", out, sizeof out), 0);
    assert_string_equal(out, "1");

    /* The node manager stops while a second command runs: the container, and the command,
     * go on. After the restart the finished one's answer is still kept, and the running
     * one's retry hears that its outcome was lost: it is not run a second time. */
    const char *argv2[] = {"/bin/sh", "-c",
                           "echo run2 >> /tmp/runs; sleep 2; echo end2 >> /tmp/runs", NULL};
    dsec_exec_opts eo2 = {.argv = argv2, .req_id = "lost-with-node-1"};
    o.timeout_ms = 1000;
    assert_int_equal(dsec_client_connect(&quick, &o, &err), 0);
    assert_int_equal(dsec_exec(quick, info.id, &eo2, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_TIMEOUT);
    dsec_client_free(quick);
    restart_cell();
    assert_int_equal(dsec_wait_state(again, info.id, "running", 10000, &err), 0);
    if (dsec_exec(again, info.id, &eo, &r, &err) < 0)
        fail_msg("collecting after the restart: %s", err.msg);
    assert_string_equal((char *)r.out, "1\n");
    dsec_exec_reply_release(&r);
    assert_int_equal(dsec_exec(again, info.id, &eo2, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    if (strstr(err.msg, "outcome of req_id lost-with-node-1") == NULL ||
        strstr(err.msg, "not run again") == NULL)
        fail_msg("a retry of a command lost with its node manager: %s", err.msg);
    dsec_node_stats ns;
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &ns);
    assert_true(ns.results_lost >= 1);
    assert_true(ns.results_hits >= 2); /* the answer and the lost outcome */
    assert_int_equal(ns.results_persist_errors, 0);
    dsec_client_free(again);
    /* it ran once, to its end, in the container that outlived its node manager */
    struct timespec ts = {2, 500000000L};
    nanosleep(&ts, NULL);
    assert_int_equal(sh(info.id, "cat /tmp/runs | tr '\\n' ' '", out, sizeof out), 0);
    assert_string_equal(out, "run run2 end2 ");
    destroy(info.id);
}

/* Heartbeats as they arrive: the longest gap between two. */
struct beats {
    pthread_mutex_t mu;
    int64_t last_ms, max_gap_ms;
    int n;
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void on_beat(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a, (void)m;
    struct beats *b = ud;
    int64_t now = mono_ms();
    pthread_mutex_lock(&b->mu);
    if (b->n > 0 && now - b->last_ms > b->max_gap_ms)
        b->max_gap_ms = now - b->last_ms;
    b->last_ms = now;
    b->n++;
    pthread_mutex_unlock(&b->mu);
}

struct burner {
    const char *id;
    int rc;
};

static void *burn(void *p)
{
    struct burner *b = p;
    const char *argv[] = {"/bin/sh", "-c",
                          "end=$(($(date +%s)+6)); while [ $(date +%s) -lt $end ]; do :; done",
                          NULL};
    dsec_exec_opts eo = {.argv = argv, .timeout_ms = 60000};
    dsec_exec_reply r;
    dsec_err err;
    b->rc = dsec_exec(cl, b->id, &eo, &r, &err);
    if (b->rc == 0)
        dsec_exec_reply_release(&r);
    return NULL;
}

/* Every CPU busy inside sandboxes (6 containers spinning on 2 CPUs' worth of quota each) for
 * 6 s: the node's heartbeats keep coming, at least half of them, and no gap reaches the
 * drain deadline, so the cell does not take a busy node for a lost one. */
static void test_heartbeats_while_cpus_busy(void **state)
{
    enum { N = 6 };
    static dsec_sandbox_info info[N];
    static struct burner bn[N];
    pthread_t th[N];
    dsec_err err;
    for (int i = 0; i < N; i++) {
        dsec_create_spec cs = {
            .type = "container", .env = "busybox:1", .cpu_milli = 1300, .memory_mb = 32};
        if (dsec_create(cl, &cs, &info[i], &err) < 0)
            fail_msg("create %d: %s", i, err.msg);
    }
    dsec_bus *bus = NULL;
    dsec_bus_opts bo = {.url = dsec_natsd_url(natsd), .name = "beats"};
    assert_int_equal(dsec_bus_connect(&bus, &bo, &err), 0);
    dsec_actor *a = NULL;
    assert_int_equal(dsec_actor_new(&a, bus, "beats", &err), 0);
    static struct beats b = {.mu = PTHREAD_MUTEX_INITIALIZER};
    char subj[256];
    snprintf(subj, sizeof subj, "dsec.v1.ctl.evt.ctbus.node.%s.heartbeat", info[0].node);
    assert_int_equal(dsec_actor_on(a, subj, NULL, on_beat, &b, &err), 0);
    for (int i = 0; i < N; i++) {
        bn[i] = (struct burner){.id = info[i].id, .rc = -1};
        assert_int_equal(pthread_create(&th[i], NULL, burn, &bn[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(bn[i].rc, 0);
    }
    dsec_bus_free(bus);
    fprintf(stderr,
            "container_bus: %d heartbeats while %d containers spun, longest gap %" PRId64
            " ms (interval %u ms)\n",
            b.n, N, b.max_gap_ms, conf.heartbeat_ms);
    /* destroyed first: a failure here must not leave the next tests without CPU */
    for (int i = 0; i < N; i++)
        destroy(info[i].id);
    assert_true(b.n >= 6000 / (int)conf.heartbeat_ms / 2);
    /* What the cell relies on: no gap reaches the deadline after which the schedulers drain
     * the node. Twice the interval (a gap that makes the node suspect, still placed) is
     * printed above, not asserted: under a sanitizer, with other tests on the same 2 CPUs,
     * single gaps of 1.6 s were seen while every deadline held. */
    assert_true(b.max_gap_ms < (int64_t)conf.dead_after_ms);
}

/* ---- streamed transfers ---------------------------------------------------------------- */

struct gen {
    uint64_t len, off;
    dsec_sha256 h;
};

/* The pattern: byte o of a source is pat[o % PAT] (PAT not a power of two, so a chunk put at
 * the wrong offset differs); copied, not computed, so the source keeps up with the transfer. */
#define PAT ((1u << 20) + 7)
static uint8_t pat[2 * PAT];

static void pat_init(void)
{
    for (size_t i = 0; i < 2 * PAT; i++)
        pat[i] = (uint8_t)((i % PAT) * 131 + ((i % PAT) >> 11));
}

static ssize_t gen_read(void *ud, void *buf, size_t n)
{
    struct gen *g = ud;
    if (n > g->len - g->off)
        n = (size_t)(g->len - g->off);
    uint8_t *p = buf;
    for (size_t done = 0; done < n;) {
        size_t at = (size_t)((g->off + done) % PAT), k = n - done < PAT ? n - done : PAT;
        memcpy(p + done, pat + at, k);
        done += k;
    }
    dsec_sha256_update(&g->h, p, n);
    g->off += n;
    return (ssize_t)n;
}

struct sinkh {
    uint64_t len;
    bool differs;
    dsec_sha256 h;
};

static int sinkh_page(void *ud, const uint8_t *data, size_t len, uint64_t size)
{
    struct sinkh *k = ud;
    for (size_t i = 0; i < len && !k->differs; i += 4093)
        k->differs = data[i] != pat[(k->len + i) % PAT];
    dsec_sha256_update(&k->h, data, len);
    k->len += len;
    return 0;
}

static void hex_final(dsec_sha256 *h, char out[65])
{
    uint8_t d[DSEC_SHA256_LEN];
    dsec_sha256_final(h, d);
    for (int i = 0; i < DSEC_SHA256_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* Up and down through one container's agent; MB/s printed. */
static void transfer(const char *id, const char *path, uint64_t len, size_t chunk, unsigned window,
                     bool check)
{
    dsec_err err;
    struct gen g = {.len = len};
    dsec_sha256_init(&g.h);
    dsec_upload_opts uo = {.chunk = chunk, .window = window};
    dsec_transfer_result res;
    double t0 = now_s();
    if (dsec_file_upload(cl, id, path, &uo, gen_read, &g, &res, &err) < 0)
        fail_msg("upload of %" PRIu64 " bytes: %s", len, err.msg);
    double t1 = now_s();
    char want[65];
    hex_final(&g.h, want);
    assert_string_equal(res.sha256, want);
    assert_int_equal(res.size, len);
    struct sinkh k = {0};
    dsec_sha256_init(&k.h);
    dsec_download_opts dopt = {.page = chunk, .window = window};
    dsec_transfer_result dres;
    double t2 = now_s();
    if (dsec_file_download(cl, id, path, &dopt, sinkh_page, &k, &dres, &err) < 0)
        fail_msg("download of %" PRIu64 " bytes: %s", len, err.msg);
    double t3 = now_s();
    char got[65];
    hex_final(&k.h, got);
    assert_int_equal(k.len, len);
    assert_false(k.differs);
    assert_string_equal(got, want);
    assert_string_equal(dres.sha256, want);
    printf("container_bus: %" PRIu64 " MiB, chunk %zu KiB, window %u: upload %.1f MB/s, download "
           "%.1f MB/s\n",
           len >> 20, chunk >> 10, window, (double)len / (t1 - t0) / 1e6,
           (double)len / (t3 - t2) / 1e6);
    (void)check;
}

static void test_uploads_downloads_file_ops(void **state)
{
    if (natsd == NULL)
        skip();
    dsec_create_spec cs = {.type = "container",
                           .env = "busybox:1",
                           .cpu_milli = 500,
                           .memory_mb = 64,
                           .disk_mb = 3072};
    dsec_sandbox_info a;
    dsec_err err;
    if (dsec_create(cl, &cs, &a, &err) < 0)
        fail_msg("create: %s", err.msg);
    pat_init();
    char out[4096];
    /* the target keeps its old content while chunks arrive; the hash inside the sandbox
     * matches */
    assert_int_equal(dsec_file_write(cl, a.id, "/root/big", "old", 3, 0640, &err), 0);
    transfer(a.id, "/root/big", 64u << 20, 0, 0, true);
    assert_int_equal(sh(a.id,
                        "sha256sum /root/big | cut -c1-64; stat -c %a /root/big; "
                        "ls -a /root | grep -c dsec-upload",
                        out, sizeof out),
                     1); /* grep -c found none: exit 1 */
    struct gen g = {.len = 64u << 20};
    dsec_sha256_init(&g.h);
    char tmp[1 << 16];
    while (g.off < g.len)
        gen_read(&g, tmp, sizeof tmp);
    char want[65];
    hex_final(&g.h, want);
    char expect[200];
    snprintf(expect, sizeof expect, "%s\n640\n0", want);
    assert_string_equal(out, expect);

    /* resume: 8 MiB of an upload arrive (a client that went away), then libdsec goes on */
    dsec_upload_opts uo = {.upload_id = "ct-resume", .chunk = 2u << 20, .window = 1};
    assert_int_equal(dsec_file_write(cl, a.id, "/root/r", "old", 3, 0644, &err), 0);
    uint8_t *buf = dsec_malloc(2u << 20);
    struct gen gp = {.len = 8u << 20};
    dsec_sha256_init(&gp.h);
    char subj[256];
    snprintf(subj, sizeof subj, "dsec.v1.ctbus.sbx.%s.%s.upload", a.node, a.id);
    for (int i = 0; i < 4; i++) {
        gen_read(&gp, buf, 2u << 20);
        dsec_msg_file_write w = {.id = a.id,
                                 .path = "/root/r",
                                 .upload = "ct-resume",
                                 .offset = (uint64_t)i << 21,
                                 .data = {buf, 2u << 20}};
        dsec_buf b;
        dsec_buf_init(&b);
        assert_int_equal(dsec_encode(&b, DSEC_MSG_FILE_WRITE, &w, &err), 0);
        dsec_hdr h = {.type = "file_write", .schema = DSEC_SCHEMA_VERSION};
        dsec_msg *reply = NULL;
        if (dsec_bus_request_sync(dsec_cell_bus(cell), subj, &h, b.data, b.len, 20000, &reply,
                                  &err) < 0)
            fail_msg("chunk %d: %s", i, err.msg);
        assert_string_equal(dsec_msg_type(reply), "file_data");
        dsec_msg_free(reply);
        dsec_buf_release(&b);
    }
    dsec_free(buf);
    assert_int_equal(
        sh(a.id, "cat /root/r; echo; stat -c %s /root/.dsec-upload-ct-resume", out, sizeof out), 0);
    assert_string_equal(out, "old\n8388608");
    uint64_t held = 0;
    assert_int_equal(dsec_file_upload_held(cl, a.id, "/root/r", "ct-resume", &held, &err), 0);
    assert_int_equal(held, 8u << 20);
    struct gen g1 = {.len = 40u << 20};
    dsec_sha256_init(&g1.h);
    dsec_transfer_result res;
    uo.resume = true;
    if (dsec_file_upload(cl, a.id, "/root/r", &uo, gen_read, &g1, &res, &err) < 0)
        fail_msg("resumed upload: %s", err.msg);
    assert_int_equal(res.resumed_from, 8u << 20);
    hex_final(&g1.h, want);
    snprintf(expect, sizeof expect, "%s", want);
    assert_int_equal(sh(a.id, "sha256sum /root/r | cut -c1-64", out, sizeof out), 0);
    assert_string_equal(out, expect);

    /* mkdir, stat, rename, remove through the agent */
    assert_int_equal(dsec_file_mkdir(cl, a.id, "/root/d/e/f", 0750, true, &err), 0);
    dsec_dirent st;
    assert_int_equal(dsec_file_stat(cl, a.id, "/root/d/e/f", &st, &err), 0);
    assert_string_equal(st.kind, "dir");
    assert_int_equal(st.mode & 07777, 0750);
    dsec_free(st.name);
    assert_int_equal(dsec_file_rename(cl, a.id, "/root/r", "/root/d/e/f/r", &err), 0);
    assert_int_equal(dsec_file_stat(cl, a.id, "/root/d/e/f/r", &st, &err), 0);
    assert_int_equal(st.size, 40u << 20);
    dsec_free(st.name);
    assert_int_equal(dsec_file_remove(cl, a.id, "/root/d", false, &err), -1);
    assert_int_equal(dsec_file_remove(cl, a.id, "/root/d", true, &err), 0);
    assert_int_equal(dsec_file_stat(cl, a.id, "/root/d", &st, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);

    /* DSEC_TEST_XFER_MB=N: measure N MiB up and down at a few chunk sizes */
    const char *mb = getenv("DSEC_TEST_XFER_MB");
    if (mb != NULL) {
        uint64_t n = strtoull(mb, NULL, 10) << 20;
        static const size_t chunks[] = {1u << 20, 2u << 20, 4u << 20};
        for (size_t i = 0; i < 3; i++)
            transfer(a.id, "/root/bench", n, chunks[i], 4, false);
        transfer(a.id, "/root/bench", n, 4u << 20, 1, false);
        transfer(a.id, "/root/bench", n, 4u << 20, 8, false);
        /* the plain path as it was: 4 MiB appends and reads one at a time, no digest */
        uint8_t *page = dsec_malloc(4u << 20);
        struct gen gr = {.len = n};
        dsec_sha256_init(&gr.h);
        double t0 = now_s();
        for (uint64_t off = 0; off < n; off += 4u << 20) {
            gen_read(&gr, page, 4u << 20);
            dsec_write_opts wo = {.append = off > 0};
            if (dsec_file_write_ex(cl, a.id, "/root/plain", page, 4u << 20, &wo, &err) < 0)
                fail_msg("plain write: %s", err.msg);
        }
        double t1 = now_s();
        char rs[256];
        snprintf(rs, sizeof rs, "dsec.v1.ctbus.sbx.%s.%s.read", a.node, a.id);
        dsec_decoder *dec = dsec_decoder_new(NULL);
        for (uint64_t off = 0; off < n; off += 4u << 20) {
            dsec_msg_file_read rq = {
                .id = a.id, .path = "/root/plain", .offset = off, .max = 4u << 20};
            dsec_buf b;
            dsec_buf_init(&b);
            assert_int_equal(dsec_encode(&b, DSEC_MSG_FILE_READ, &rq, &err), 0);
            dsec_hdr h = {.type = "file_read", .schema = DSEC_SCHEMA_VERSION};
            dsec_msg *reply = NULL;
            if (dsec_bus_request_sync(dsec_cell_bus(cell), rs, &h, b.data, b.len, 20000, &reply,
                                      &err) < 0)
                fail_msg("plain read: %s", err.msg);
            dsec_msg_free(reply);
            dsec_buf_release(&b);
        }
        double t2 = now_s();
        dsec_decoder_free(dec);
        dsec_free(page);
        printf("container_bus: %" PRIu64 " MiB the plain way (4 MiB appends, reads one at a "
               "time, no digest): write %.1f MB/s, read %.1f MB/s\n",
               n >> 20, (double)n / (t1 - t0) / 1e6, (double)n / (t2 - t1) / 1e6);
        t0 = now_s();
        assert_int_equal(sh(a.id,
                            "dd if=/dev/zero of=/root/dd bs=4M count=256 conv=fsync "
                            "2>/dev/null; rm -f /root/dd /root/plain",
                            out, sizeof out),
                         0);
        printf("container_bus: dd of 1 GiB inside the sandbox (conv=fsync): %.1f MB/s\n",
               (double)(1u << 30) / (now_s() - t0) / 1e6);
    }
    destroy(a.id);
}

static void test_bad_requests(void **state)
{
    if (natsd == NULL)
        skip();
    dsec_create_spec cs = {.type = "container", .env = "nope:1", .cpu_milli = 100, .memory_mb = 32};
    dsec_sandbox_info info;
    dsec_err err;
    assert_int_equal(dsec_create(cl, &cs, &info, &err), -1);
    assert_non_null(strstr(err.msg, "nope:1"));
    assert_int_equal(sandbox_mounts(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exec_files_fork_snapshot),
        cmocka_unit_test(test_exec_streams),
        cmocka_unit_test(test_node_restart_readopts),
        cmocka_unit_test(test_node_restart_runtime),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_many_commands_at_once),
        cmocka_unit_test(test_answer_collected_by_req_id),
        cmocka_unit_test(test_heartbeats_while_cpus_busy),
        cmocka_unit_test(test_default_disk_quota),
        cmocka_unit_test(test_background_processes),
        cmocka_unit_test(test_shell_sessions),
        cmocka_unit_test(test_terminals),
        cmocka_unit_test(test_proc_calls_beside_a_command),
        cmocka_unit_test(test_unread_stdin_waits_on_the_loop),
        cmocka_unit_test(test_watch),
        cmocka_unit_test(test_uploads_downloads_file_ops),
    };
    if (getenv("DSEC_TEST_FILTER") != NULL) /* one test by name, while working on it */
        cmocka_set_test_filter(getenv("DSEC_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
