/* test_function_async.c - function calls started with dsec_backend_exec_start: many in flight on
 * one instance without a thread each, timeouts, output streaming and caps, and stopping. */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/backend.h"
#include "backends/function/function.h"
#include "dsec/alloc.h"
#include "dsec/err.h"

/* Its own uid range (test_function has 1700000000): both may be left from an aborted run. */
#define UID_BASE 1702000000u
#define MAX_WORKERS 72
#define NCALLS 64

static char state_dir[64];
static int sb_seq;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* An instance with its own loop: max_workers slots, warm sh workers kept, acquire_ms. */
static dsec_backend *open_backend_with(unsigned max_workers, unsigned warm, unsigned acquire_ms)
{
    char uid[16], maxw[16], pool[16], acq[16];
    snprintf(uid, sizeof uid, "%u", UID_BASE);
    snprintf(maxw, sizeof maxw, "%u", max_workers);
    snprintf(pool, sizeof pool, "%u", warm);
    snprintf(acq, sizeof acq, "%u", acquire_ms);
    dsec_backend_kv opts[] = {
        {"max_workers", maxw}, {"pool_sh", pool},   {"pool_python3", "0"},
        {"pool_native", "0"},  {"tmpfs_mb", "16"},  {"uid_base", uid},
        {"prestart", "sh"},    {"acquire_ms", acq}, {"max_timeout_ms", "60000"},
    };
    dsec_backend_config cfg = {.state_dir = state_dir,
                               .node = "fnasync",
                               .opts = opts,
                               .nopts = sizeof opts / sizeof opts[0]};
    dsec_backend *be = NULL;
    dsec_err err;
    if (dsec_backend_new(&be, &dsec_function_ops, &cfg, &err) < 0)
        fail_msg("function backend: %s", err.msg);
    assert_true(dsec_backend_exec_async(be));
    return be;
}

static dsec_backend *open_backend(void)
{
    return open_backend_with(MAX_WORKERS, 64, 10000);
}

static int group_setup(void **state)
{
    if (geteuid() != 0) {
        fprintf(stderr,
                "test_function_async: needs root (namespaces, mounts, cgroups); skipping\n");
        exit(77);
    }
    snprintf(state_dir, sizeof state_dir, "/tmp/dsec-fnasync-XXXXXX");
    return mkdtemp(state_dir) == NULL ? -1 : 0;
}

static int group_teardown(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", state_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static dsec_sandbox *mk(dsec_backend *be)
{
    char id[32];
    snprintf(id, sizeof id, "fnasync-%04d", __atomic_fetch_add(&sb_seq, 1, __ATOMIC_RELAXED));
    dsec_backend_kv labels[] = {{"runtime", "sh"}};
    dsec_sandbox_spec spec = {
        .id = id, .type = "function", .memory_mb = 64, .labels = labels, .nlabels = 1};
    dsec_sandbox *h = NULL;
    char *bstate = NULL;
    dsec_err err;
    if (dsec_backend_create(be, &spec, &h, &bstate, &err) < 0)
        fail_msg("create %s: %s", id, err.msg);
    dsec_free(bstate);
    return h;
}

static void rm(dsec_backend *be, dsec_sandbox *h)
{
    dsec_err err;
    if (dsec_backend_destroy(be, h, &err) < 0)
        fail_msg("destroy: %s", err.msg);
}

/* Processes on the host whose command line holds needle (the calls' own, by a marker). */
static int host_procs(const char *needle)
{
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *de;
    while (d != NULL && (de = readdir(d)) != NULL) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/cmdline", de->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t i = 0; i < len; i++)
            if (buf[i] == '\0')
                buf[i] = ' ';
        buf[len] = '\0';
        if (strstr(buf, needle) != NULL)
            n++;
    }
    if (d != NULL)
        closedir(d);
    return n;
}

static int threads_now(void)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    struct dirent *de;
    while (d != NULL && (de = readdir(d)) != NULL)
        if (de->d_name[0] != '.')
            n++;
    if (d != NULL)
        closedir(d);
    return n;
}

/* ---- what the done callbacks record ---------------------------------------------------------- */

struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int started, finished, running, peak_running;
    /* one call each */
    int ndone[NCALLS];
    int rc[NCALLS];
    dsec_exec_result res[NCALLS];
    dsec_err err[NCALLS];
    uint64_t done_ns[NCALLS];
    /* streaming */
    uint8_t streamed[3][4096];
    size_t nstreamed[3];
    uint64_t first_output_ns;
    dsec_backend *detach_be; /* stopping: detach each sandbox once its call is over */
    dsec_sandbox *sb[NCALLS];
};

struct slot {
    struct rec *r;
    int i;
};

static void rec_init(struct rec *r)
{
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cond, NULL);
}

static void rec_fini(struct rec *r)
{
    for (int i = 0; i < NCALLS; i++)
        dsec_exec_result_release(&r->res[i]);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->mu);
}

static void on_done(void *ud, int rc, dsec_exec_result *res, dsec_err *err)
{
    struct slot *s = ud;
    struct rec *r = s->r;
    pthread_mutex_lock(&r->mu);
    r->ndone[s->i]++;
    r->rc[s->i] = rc;
    r->done_ns[s->i] = now_ns();
    if (rc == 0)
        r->res[s->i] = *res; /* the buffers are ours now */
    else
        r->err[s->i] = *err;
    r->running--;
    r->finished++;
    if (r->detach_be != NULL) /* the call is over: the sandbox is the caller's again */
        dsec_backend_detach(r->detach_be, r->sb[s->i]);
    pthread_cond_broadcast(&r->cond);
    pthread_mutex_unlock(&r->mu);
}

static void on_output(void *arg, int stream, const uint8_t *data, size_t len)
{
    struct rec *r = arg;
    pthread_mutex_lock(&r->mu);
    if (r->first_output_ns == 0)
        r->first_output_ns = now_ns();
    if (stream == 1 || stream == 2) {
        size_t room = sizeof r->streamed[stream] - r->nstreamed[stream];
        size_t n = len < room ? len : room;
        memcpy(r->streamed[stream] + r->nstreamed[stream], data, n);
        r->nstreamed[stream] += len; /* counts all, keeps what fits */
    }
    pthread_mutex_unlock(&r->mu);
}

static void start(dsec_backend *be, dsec_sandbox *h, struct rec *r, struct slot *s,
                  const dsec_exec_req *req)
{
    dsec_err err;
    pthread_mutex_lock(&r->mu);
    r->started++;
    if (++r->running > r->peak_running)
        r->peak_running = r->running;
    pthread_mutex_unlock(&r->mu);
    if (dsec_backend_exec_start(be, h, req, on_done, s, &err) < 0)
        fail_msg("exec_start: %s", err.msg);
}

static void wait_finished(struct rec *r, int n)
{
    pthread_mutex_lock(&r->mu);
    while (r->finished < n)
        pthread_cond_wait(&r->cond, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

/* ---- tests ------------------------------------------------------------------------------------
 */

/* 64 calls of 2 s in 64 sandboxes, all started without waiting: they run at once (their run
 * intervals, from each done's time and duration, all overlap) and no thread waits for any. */
static void many_calls_in_flight_at_once(void **state)
{
    dsec_backend *be = open_backend();
    dsec_sandbox *h[NCALLS];
    for (int i = 0; i < NCALLS; i++)
        h[i] = mk(be);
    int threads0 = threads_now();
    static struct rec r;
    rec_init(&r);
    struct slot s[NCALLS];
    const char *argv[] = {"sh", "-c", "sleep 2; echo done $0", "fnasync-many"};
    dsec_exec_req req = {.argv = argv, .argc = 4, .timeout_ms = 30000};
    for (int i = 0; i < NCALLS; i++) {
        s[i] = (struct slot){&r, i};
        start(be, h[i], &r, &s[i], &req);
    }
    /* every call out, none back yet: counted by the done callbacks */
    pthread_mutex_lock(&r.mu);
    int running = r.running;
    pthread_mutex_unlock(&r.mu);
    int threads = threads_now();
    wait_finished(&r, NCALLS);
    assert_int_equal(running, NCALLS);
    assert_int_equal(r.peak_running, NCALLS);
    /* no thread per call: the instance's loop and its pool thread at most */
    print_message("threads: %d before the calls, %d with %d in flight\n", threads0, threads,
                  running);
    assert_true(threads <= threads0 + 2);
    uint64_t st[NCALLS];
    for (int i = 0; i < NCALLS; i++) {
        assert_int_equal(r.ndone[i], 1);
        if (r.rc[i] != 0)
            fail_msg("call %d: %s", i, r.err[i].msg);
        assert_int_equal(r.res[i].exit_code, 0);
        assert_false(r.res[i].timed_out);
        assert_int_equal(r.res[i].stdout_len, strlen("done fnasync-many\n"));
        assert_memory_equal(r.res[i].stdout_data, "done fnasync-many\n", r.res[i].stdout_len);
        assert_true(r.res[i].duration_us >= 2000000);
        st[i] = r.done_ns[i] - r.res[i].duration_us * 1000ull;
    }
    /* How many ran at once (from each done's time and duration): all 64 unless making the
     * workers took longer than a call here (a loaded host), so printed, not asserted. */
    int most = 0;
    for (int i = 0; i < NCALLS; i++) {
        int n = 0;
        for (int j = 0; j < NCALLS; j++)
            n += st[j] <= st[i] && r.done_ns[j] > st[i];
        if (n > most)
            most = n;
    }
    print_message("%d calls in flight at once, at most %d of them running together\n",
                  r.peak_running, most);
    rec_fini(&r);
    for (int i = 0; i < NCALLS; i++)
        rm(be, h[i]);
    dsec_backend_free(be);
}

/* A call past its timeout is killed with everything it started; the others are not. */
static void a_timeout_kills_the_call(void **state)
{
    dsec_backend *be = open_backend();
    dsec_sandbox *h[2] = {mk(be), mk(be)};
    static struct rec r;
    rec_init(&r);
    struct slot s[2] = {{&r, 0}, {&r, 1}};
    const char *slow[] = {"sh", "-c", "sleep 31.25 & sleep 31.25; echo never"};
    const char *fast[] = {"sh", "-c", "sleep 1; echo in time"};
    dsec_exec_req rs = {.argv = slow, .argc = 3, .timeout_ms = 400};
    dsec_exec_req rf = {.argv = fast, .argc = 3, .timeout_ms = 10000};
    start(be, h[0], &r, &s[0], &rs);
    start(be, h[1], &r, &s[1], &rf);
    wait_finished(&r, 2);
    assert_int_equal(r.ndone[0], 1);
    assert_int_equal(r.rc[0], 0);
    assert_true(r.res[0].timed_out);
    assert_int_equal(r.res[0].exit_code, -1);
    assert_int_equal(r.res[0].signal, SIGKILL);
    assert_int_equal(r.res[0].stdout_len, 0);
    assert_true(r.res[0].duration_us >= 400000 && r.res[0].duration_us < 15000000);
    assert_int_equal(host_procs("sleep 31.25"), 0); /* the background one too */
    assert_int_equal(r.ndone[1], 1);
    assert_int_equal(r.rc[1], 0);
    assert_false(r.res[1].timed_out);
    assert_int_equal(r.res[1].exit_code, 0);
    assert_memory_equal(r.res[1].stdout_data, "in time\n", 8);
    rec_fini(&r);
    rm(be, h[0]);
    rm(be, h[1]);
    dsec_backend_free(be);
}

/* Output reaches on_output while the call runs, both streams, within the cap; the result is
 * capped and says so; stdin bigger than a pipe is fed in full. */
static void output_streams_and_caps(void **state)
{
    dsec_backend *be = open_backend();
    dsec_sandbox *h = mk(be);
    static struct rec r;
    rec_init(&r);
    struct slot s0 = {&r, 0};
    const char *argv[] = {"sh", "-c",
                          "echo first; echo oops >&2; sleep 1; head -c 100000 /dev/zero"};
    dsec_exec_req req = {.argv = argv,
                         .argc = 3,
                         .timeout_ms = 10000,
                         .output_max = 1000,
                         .on_output = on_output,
                         .on_output_arg = &r};
    start(be, h, &r, &s0, &req);
    wait_finished(&r, 1);
    if (r.rc[0] != 0)
        fail_msg("call: %s", r.err[0].msg);
    assert_int_equal(r.res[0].exit_code, 0);
    assert_int_equal(r.res[0].stdout_len, 1000);
    assert_true(r.res[0].stdout_truncated);
    assert_memory_equal(r.res[0].stdout_data, "first\n", 6);
    assert_int_equal(r.res[0].stderr_len, 5);
    assert_false(r.res[0].stderr_truncated);
    assert_memory_equal(r.res[0].stderr_data, "oops\n", 5);
    /* streamed: what the result keeps, no more, and the first line a second before the end */
    assert_int_equal(r.nstreamed[1], 1000);
    assert_memory_equal(r.streamed[1], "first\n", 6);
    assert_int_equal(r.nstreamed[2], 5);
    assert_memory_equal(r.streamed[2], "oops\n", 5);
    assert_true(r.first_output_ns != 0 && r.done_ns[0] - r.first_output_ns >= 500000000ull);
    rec_fini(&r);

    /* 1 MiB of stdin, many pipefuls, fed by the loop as the call reads it */
    rec_init(&r);
    size_t n = 1u << 20;
    uint8_t *in = malloc(n);
    assert_non_null(in);
    memset(in, 'x', n);
    const char *wc[] = {"sh", "-c", "wc -c"};
    dsec_exec_req rw = {
        .argv = wc, .argc = 3, .timeout_ms = 10000, .stdin_data = in, .stdin_len = n};
    start(be, h, &r, &s0, &rw);
    free(in); /* borrowed for exec_start only */
    wait_finished(&r, 1);
    if (r.rc[0] != 0)
        fail_msg("call: %s", r.err[0].msg);
    assert_int_equal(r.res[0].exit_code, 0);
    assert_non_null(r.res[0].stdout_data);
    assert_int_equal(atoi((const char *)r.res[0].stdout_data), (int)n);
    rec_fini(&r);

    /* a call that stops reading its stdin ends normally (no SIGPIPE on the loop) */
    rec_init(&r);
    in = calloc(1, n);
    assert_non_null(in);
    const char *hd[] = {"sh", "-c", "head -c 10 >/dev/null; echo read"};
    dsec_exec_req rh = {
        .argv = hd, .argc = 3, .timeout_ms = 10000, .stdin_data = in, .stdin_len = n};
    start(be, h, &r, &s0, &rh);
    free(in);
    wait_finished(&r, 1);
    if (r.rc[0] != 0)
        fail_msg("call: %s", r.err[0].msg);
    assert_int_equal(r.res[0].exit_code, 0);
    assert_memory_equal(r.res[0].stdout_data, "read\n", 5);
    rec_fini(&r);
    rm(be, h);
    dsec_backend_free(be);
}

/* Freeing the instance while calls run and others wait for a worker: each done is called
 * once, with DSEC_E_CLOSED, and no call's process outlives it. */
static void stopping_ends_each_call_once(void **state)
{
    enum { N = 8, SLOTS = 4 };
    dsec_backend *be = open_backend_with(SLOTS, 2, 30000);
    static struct rec r;
    rec_init(&r);
    struct slot s[N];
    const char *argv[] = {"sh", "-c", "echo up; exec sleep 32.75"};
    dsec_exec_req req = {
        .argv = argv, .argc = 3, .timeout_ms = 60000, .on_output = on_output, .on_output_arg = &r};
    for (int i = 0; i < N; i++) {
        r.sb[i] = mk(be);
        s[i] = (struct slot){&r, i};
        start(be, r.sb[i], &r, &s[i], &req);
    }
    /* the first SLOTS running (each said "up"), the others waiting for a slot */
    for (int tries = 0; tries < 1000; tries++) {
        pthread_mutex_lock(&r.mu);
        size_t got = r.nstreamed[1];
        pthread_mutex_unlock(&r.mu);
        if (got >= SLOTS * 3)
            break;
        usleep(10000);
    }
    usleep(200000);
    assert_int_equal(r.nstreamed[1], SLOTS * 3);
    assert_int_equal(r.finished, 0);
    assert_int_equal(host_procs("sleep 32.75"), SLOTS);
    r.detach_be = be;
    dsec_backend_free(be);
    int killed = 0, not_started = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(r.ndone[i], 1);
        assert_int_equal(r.rc[i], -1);
        assert_int_equal(r.err[i].code, DSEC_E_CLOSED);
        killed += strstr(r.err[i].msg, "stopping: the call was killed") != NULL;
        not_started += strstr(r.err[i].msg, "stopping: the call did not start") != NULL;
    }
    assert_int_equal(killed, SLOTS);
    assert_int_equal(not_started, N - SLOTS);
    assert_int_equal(r.finished, N);
    assert_int_equal(host_procs("sleep 32.75"), 0);
    rec_fini(&r);
}

/* With every slot busy a call waits for a worker on the loop: it runs once one is free, or
 * fails with DSEC_E_CAPACITY after acquire_ms. */
static void calls_wait_for_a_free_slot(void **state)
{
    enum { SLOTS = 2, N = 3 };
    dsec_backend *be = open_backend_with(SLOTS, SLOTS, 1500);
    dsec_sandbox *h[N];
    for (int i = 0; i < N; i++)
        h[i] = mk(be);
    static struct rec r;
    rec_init(&r);
    struct slot s[N];
    const char *shortc[] = {"sh", "-c", "sleep 0.5; echo ok"};
    dsec_exec_req rq = {.argv = shortc, .argc = 3, .timeout_ms = 10000};
    for (int i = 0; i < N; i++) {
        s[i] = (struct slot){&r, i};
        start(be, h[i], &r, &s[i], &rq);
    }
    wait_finished(&r, N);
    uint64_t first = UINT64_MAX, last = 0;
    for (int i = 0; i < N; i++) {
        if (r.rc[i] != 0)
            fail_msg("call %d: %s", i, r.err[i].msg);
        assert_int_equal(r.res[i].exit_code, 0);
        assert_memory_equal(r.res[i].stdout_data, "ok\n", 3);
        if (r.done_ns[i] < first)
            first = r.done_ns[i];
        if (r.done_ns[i] > last)
            last = r.done_ns[i];
    }
    /* the third ran after one of the first two ended: it waited for their slot */
    assert_true(last - first >= 400000000ull);
    rec_fini(&r);

    rec_init(&r);
    const char *longc[] = {"sh", "-c", "sleep 3"};
    dsec_exec_req rl = {.argv = longc, .argc = 3, .timeout_ms = 10000};
    for (int i = 0; i < N; i++) {
        s[i] = (struct slot){&r, i};
        start(be, h[i], &r, &s[i], &rl);
    }
    wait_finished(&r, N);
    int ok = 0, capacity = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(r.ndone[i], 1);
        if (r.rc[i] == 0) {
            ok++;
        } else {
            assert_int_equal(r.err[i].code, DSEC_E_CAPACITY);
            assert_non_null(strstr(r.err[i].msg, "no sh worker became free within 1500 ms"));
            capacity++;
        }
    }
    assert_int_equal(ok, SLOTS);
    assert_int_equal(capacity, N - SLOTS);
    rec_fini(&r);
    for (int i = 0; i < N; i++)
        rm(be, h[i]);
    dsec_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(many_calls_in_flight_at_once),
        cmocka_unit_test(a_timeout_kills_the_call),
        cmocka_unit_test(output_streams_and_caps),
        cmocka_unit_test(calls_wait_for_a_free_slot),
        cmocka_unit_test(stopping_ends_each_call_once),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
