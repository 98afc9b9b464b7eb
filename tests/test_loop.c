/* test_loop.c - the node's event loop (deadlines, fds, cancel on stop) and its fair work queue. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/backend.h"
#include "backends/loop.h"
#include "backends/sim.h"
#include "backends/workq.h"
#include "dsec/alloc.h"
#include "tests/test_util.h"

#define WAIT_MS 10000

/* ---- loop -------------------------------------------------------------------------------- */

struct timers {
    pthread_mutex_t mu;
    int fired, cancelled;
    uint64_t last_deadline;
    int out_of_order, early, off_thread;
    dsec_loop *l;
};

struct timer {
    struct timers *t;
    uint64_t deadline;
};

static void on_timer(dsec_loop_watch *w, unsigned ev, void *ud)
{
    (void)w;
    struct timer *tm = ud;
    struct timers *t = tm->t;
    pthread_mutex_lock(&t->mu);
    if (!dsec_loop_is_current(t->l))
        t->off_thread++;
    if (ev & DSEC_LOOP_CANCEL) {
        t->cancelled++;
    } else {
        t->fired++;
        if (dsec_loop_now_ns() < tm->deadline)
            t->early++;
        if (tm->deadline < t->last_deadline)
            t->out_of_order++;
        t->last_deadline = tm->deadline;
    }
    pthread_mutex_unlock(&t->mu);
}

/* Deadlines added from another thread, in random order, fire in deadline order, never early,
 * on the loop's thread; those far away hear DSEC_LOOP_CANCEL when the loop stops. */
static void loop_timers_fire_in_order_and_cancel(void **state)
{
    (void)state;
    enum { N = 2000, FAR = 50 };
    static struct timers t;
    static struct timer tm[N + FAR];
    memset(&t, 0, sizeof t);
    pthread_mutex_init(&t.mu, NULL);
    dsec_err err;
    assert_int_equal(dsec_loop_new(&t.l, "test-loop", &err), 0);
    uint64_t now = dsec_loop_now_ns();
    srandom(7);
    for (int i = 0; i < N + FAR; i++) {
        /* all added before the first is due: order holds among timers present together */
        uint64_t off =
            i < N ? (1000 + (uint64_t)(random() % 300)) * 1000000ull : 3600ull * 1000000000ull;
        tm[i] = (struct timer){.t = &t, .deadline = now + off};
        assert_int_equal(dsec_loop_add(t.l, -1, 0, tm[i].deadline, on_timer, &tm[i], NULL, &err),
                         0);
    }
    for (int w = 0; w < WAIT_MS; w += 10) {
        pthread_mutex_lock(&t.mu);
        int f = t.fired;
        pthread_mutex_unlock(&t.mu);
        if (f == N)
            break;
        msleep(10);
    }
    size_t live = 0, peak = 0;
    dsec_loop_counts(t.l, &live, &peak);
    assert_int_equal(live, FAR);
    assert_true(peak >= FAR);
    dsec_loop_stop(t.l);
    assert_int_equal(dsec_loop_add(t.l, -1, 0, now, on_timer, &tm[0], NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_CLOSED);
    dsec_loop_free(t.l);
    assert_int_equal(t.fired, N);
    assert_int_equal(t.cancelled, FAR);
    assert_int_equal(t.out_of_order, 0);
    assert_int_equal(t.early, 0);
    assert_int_equal(t.off_thread, 0);
    pthread_mutex_destroy(&t.mu);
}

struct piper {
    int fds[2];
    int reads;
    char got[64];
    size_t len;
    atomic_int closed;
};

static void on_pipe(dsec_loop_watch *w, unsigned ev, void *ud)
{
    struct piper *p = ud;
    if (ev & DSEC_LOOP_CANCEL)
        return;
    ssize_t n = read(p->fds[0], p->got + p->len, sizeof p->got - p->len);
    p->reads++;
    if (n > 0)
        p->len += (size_t)n;
    if (n == 0) { /* the writer closed: done with it */
        dsec_loop_del(w);
        atomic_store(&p->closed, 1);
    }
}

/* A readable fd wakes its watch until the callback deletes it; nothing fires after. */
static void loop_fd_readiness(void **state)
{
    (void)state;
    dsec_loop *l;
    dsec_err err;
    assert_int_equal(dsec_loop_new(&l, "test-fd", &err), 0);
    struct piper p = {0};
    assert_int_equal(pipe2(p.fds, O_NONBLOCK | O_CLOEXEC), 0);
    assert_int_equal(dsec_loop_add(l, p.fds[0], DSEC_LOOP_IN, 0, on_pipe, &p, NULL, &err), 0);
    assert_int_equal(write(p.fds[1], "hello ", 6), 6);
    msleep(20);
    assert_int_equal(write(p.fds[1], "world", 5), 5);
    close(p.fds[1]);
    for (int w = 0; w < WAIT_MS && !atomic_load(&p.closed); w += 5)
        msleep(5);
    assert_true(atomic_load(&p.closed));
    size_t live = 0;
    dsec_loop_counts(l, &live, NULL);
    assert_int_equal(live, 0);
    dsec_loop_free(l);
    assert_int_equal(p.len, 11);
    assert_memory_equal(p.got, "hello world", 11);
    close(p.fds[0]);
}

/* ---- commands on the sim backend without threads ----------------------------------------- */

struct runs {
    pthread_mutex_t mu;
    int done, failed, inflight, peak;
};

static void on_done(void *ud, int rc, dsec_exec_result *res, dsec_err *err)
{
    (void)err;
    struct runs *r = ud;
    pthread_mutex_lock(&r->mu);
    r->done++;
    r->inflight--;
    if (rc != 0 || res->exit_code != 0)
        r->failed++;
    pthread_mutex_unlock(&r->mu);
    if (rc == 0)
        dsec_exec_result_release(res);
}

/* 500 sandboxes each start `sleep 1` (sim models the second) from one thread: every start
 * returns at once, all 500 are in flight together, and all finish. */
static void sim_commands_start_without_waiting(void **state)
{
    (void)state;
    enum { N = 500 };
    dsec_backend *be;
    dsec_err err;
    static const dsec_backend_kv opts[] = {{"time_scale", "1"}};
    dsec_backend_config cfg = {.node = "t", .opts = opts, .nopts = 1};
    assert_int_equal(dsec_backend_new(&be, &dsec_sim_ops, &cfg, &err), 0);
    assert_true(dsec_backend_exec_async(be));
    static dsec_sandbox *sb[N];
    static char *bs[N];
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof id, "s%d", i);
        dsec_sandbox_spec sp = {.id = id, .type = "sim", .cpu_milli = 100, .memory_mb = 64};
        assert_int_equal(dsec_backend_create(be, &sp, &sb[i], &bs[i], &err), 0);
    }
    struct runs r = {0};
    pthread_mutex_init(&r.mu, NULL);
    static const char *const argv[] = {"sleep", "1"};
    dsec_exec_req req = {.argv = argv, .argc = 2};
    for (int i = 0; i < N; i++) {
        pthread_mutex_lock(&r.mu);
        if (++r.inflight > r.peak)
            r.peak = r.inflight;
        pthread_mutex_unlock(&r.mu);
        assert_int_equal(dsec_backend_exec_start(be, sb[i], &req, on_done, &r, &err), 0);
    }
    for (int w = 0; w < WAIT_MS; w += 10) {
        pthread_mutex_lock(&r.mu);
        int d = r.done;
        pthread_mutex_unlock(&r.mu);
        if (d == N)
            break;
        msleep(10);
    }
    assert_int_equal(r.done, N);
    assert_int_equal(r.failed, 0);
    assert_int_equal(r.peak, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(dsec_backend_destroy(be, sb[i], &err), 0);
        dsec_free(bs[i]);
    }
    dsec_backend_free(be);
    pthread_mutex_destroy(&r.mu);
}

/* ---- fair work queue ---------------------------------------------------------------------- */

struct order {
    pthread_mutex_t mu;
    char log[4096][8];
    int n;
    pthread_mutex_t gate; /* held by the test: the one thread waits on the first job */
};

struct wjob {
    struct order *o;
    char name[8];
    bool block;
};

static void wjob_run(void *ud)
{
    struct wjob *j = ud;
    if (j->block) {
        pthread_mutex_lock(&j->o->gate);
        pthread_mutex_unlock(&j->o->gate);
    }
    pthread_mutex_lock(&j->o->mu);
    snprintf(j->o->log[j->o->n++], 8, "%s", j->name);
    pthread_mutex_unlock(&j->o->mu);
}

static int pos(struct order *o, const char *name)
{
    for (int i = 0; i < o->n; i++)
        if (strcmp(o->log[i], name) == 0)
            return i;
    return -1;
}

/* One thread, held busy while the queue fills: tenant A queues 200 jobs over 200 sandboxes,
 * then sandbox a0 queues 50 more of its own, then tenant B queues one. B's job runs second
 * (right after A's first), a0's second job waits for every other A sandbox's first, and each
 * sandbox's jobs run in the order they came. Stopping runs everything queued. */
static void workq_round_robin_tenants_then_sandboxes(void **state)
{
    (void)state;
    static struct order o;
    memset(&o, 0, sizeof o);
    pthread_mutex_init(&o.mu, NULL);
    pthread_mutex_init(&o.gate, NULL);
    dsec_workq *q;
    dsec_err err;
    assert_int_equal(dsec_workq_new(&q, "test", 1, &err), 0);
    static struct wjob jobs[300];
    int nj = 0;
    pthread_mutex_lock(&o.gate);
    jobs[nj] = (struct wjob){.o = &o, .block = true};
    snprintf(jobs[nj].name, 8, "gate");
    assert_int_equal(dsec_workq_submit(q, "z", 999, wjob_run, &jobs[nj], &err), 0);
    nj++;
    msleep(50); /* the thread is in the gate job now */
    for (int i = 0; i < 200; i++, nj++) {
        jobs[nj] = (struct wjob){.o = &o};
        snprintf(jobs[nj].name, 8, "A%d", i);
        assert_int_equal(dsec_workq_submit(q, "A", (uint64_t)i, wjob_run, &jobs[nj], &err), 0);
    }
    for (int i = 0; i < 50; i++, nj++) {
        jobs[nj] = (struct wjob){.o = &o};
        snprintf(jobs[nj].name, 8, "a0.%d", i);
        assert_int_equal(dsec_workq_submit(q, "A", 0, wjob_run, &jobs[nj], &err), 0);
    }
    jobs[nj] = (struct wjob){.o = &o};
    snprintf(jobs[nj].name, 8, "B");
    assert_int_equal(dsec_workq_submit(q, "B", 0, wjob_run, &jobs[nj], &err), 0);
    nj++;
    dsec_workq_stats st;
    dsec_workq_stats_get(q, &st);
    assert_int_equal(st.queued, nj - 1);
    pthread_mutex_unlock(&o.gate);
    dsec_workq_stop(q);
    assert_int_equal(dsec_workq_submit(q, "A", 1, wjob_run, &jobs[0], &err), -1);
    assert_int_equal(err.code, DSEC_E_CLOSED);
    dsec_workq_free(q);
    assert_int_equal(o.n, nj);
    assert_int_equal(pos(&o, "gate"), 0);
    assert_int_equal(pos(&o, "A0"), 1);
    assert_int_equal(pos(&o, "B"), 2); /* one turn per tenant, however many sandboxes A has */
    assert_true(pos(&o, "a0.0") > pos(&o, "A199")); /* a0 waits for A's other sandboxes */
    for (int i = 1; i < 200; i++)
        assert_true(pos(&o, jobs[1 + i].name) > pos(&o, jobs[i].name));
    for (int i = 1; i < 50; i++) {
        char a[8], b[8];
        snprintf(a, 8, "a0.%d", i - 1);
        snprintf(b, 8, "a0.%d", i);
        assert_true(pos(&o, b) > pos(&o, a));
    }
    pthread_mutex_destroy(&o.gate);
    pthread_mutex_destroy(&o.mu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(loop_timers_fire_in_order_and_cancel),
        cmocka_unit_test(loop_fd_readiness),
        cmocka_unit_test(sim_commands_start_without_waiting),
        cmocka_unit_test(workq_round_robin_tenants_then_sandboxes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
