/* test_admission.c - the scheduler's admission bound and its "overloaded" answers, end to end. */
#include <inttypes.h>
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

#include "actors/cell.h"
#include "actors/node.h"
#include "actors/scheduler.h"
#include "actors/wire.h"
#include "codecs/msg.h"
#include "codecs/subjects.h"
#include "dsec/client.h"
#include "tests/fixture.h"

static dsec_natsd *natsd;
static char root[64];
static int serial;

/* What a test started; the teardown stops it even after a failed assertion. */
static struct {
    dsec_cell *cell;
    dsec_cell_conf conf;
    dsec_client *client;
} live;

static void msleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int test_teardown(void **state)
{
    (void)state;
    dsec_client_free(live.client); /* first: its creates are answered while the cell still runs */
    if (live.cell != NULL)
        dsec_cell_stop(live.cell, true);
    dsec_cell_conf_release(&live.conf);
    memset(&live, 0, sizeof live);
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    return dsec_test_server_start("dsec-admit", true, &natsd, root, sizeof root);
}

static int group_teardown(void **state)
{
    (void)state;
    return dsec_test_server_stop(natsd, root);
}

/* scheduler.admit_delay_ms of the next start_cell (then back to 0) */
static uint32_t next_admit_delay_ms;

/* A one-node sim cell (cpu milli-CPU, room for many slots) whose one
 * scheduler replica holds at most admit_max creates and parks at most
 * park_max rollouts, and sheds creates (and its node placements) that
 * waited shed_after_ms in a mailbox (0: never); a client with timeout_ms and
 * retries (-1: none). */
static void start_cell(uint64_t cpu, uint32_t admit_max, uint32_t park_max, uint32_t shed_after_ms,
                       int timeout_ms, int retries)
{
    dsec_cell_conf *c = &live.conf;
    dsec_cell_conf_defaults(c);
    snprintf(c->cell, sizeof c->cell, "a%d-%ld", ++serial, (long)getpid());
    snprintf(c->url, sizeof c->url, "%s", dsec_natsd_url(natsd));
    snprintf(c->state_dir, sizeof c->state_dir, "%s/%s", root, c->cell);
    c->capacity_ms = 50;
    c->full_ms = 500;
    c->heartbeat_ms = 100;
    c->summary_ms = 100;
    c->sched_replicas = 1;
    c->admit_max = admit_max;
    c->park_max = park_max;
    c->shed_after_ms = shed_after_ms;
    c->admit_delay_ms = next_admit_delay_ms;
    next_admit_delay_ms = 0;
    /* each test here isolates one way of pushing back (admit_max, parking, shedding by wait,
     * admission by delay); the window, on by default, has its own test below */
    c->window_ms = 0;
    c->threads = 1; /* one bus worker: a burst queues for sure */
    static const char *const types[] = {"sim", NULL};
    char node[80];
    snprintf(node, sizeof node, "%s-n", c->cell);
    dsec_err err;
    assert_int_equal(
        dsec_cell_conf_add_sim_nodes(c, node, 1, cpu, 1u << 20, 20000, types, "0", &err), 0);
    snprintf(c->nodes[0].name, sizeof c->nodes[0].name, "%.64s", node);
    if (dsec_cell_start(&live.cell, c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        fail_msg("cell %s: %s", c->cell, err.msg);
    dsec_client_opts o = {
        .url = dsec_natsd_url(natsd), .tenant = "t", .timeout_ms = timeout_ms, .retries = retries};
    if (dsec_client_connect(&live.client, &o, &err) < 0)
        fail_msg("client: %s", err.msg);
    /* the scheduler knows the node before the first create */
    dsec_create_spec s = {
        .type = "sim", .cpu_milli = 1, .memory_mb = 1, .cls = "job", .cell = c->cell};
    dsec_sandbox_info info;
    int rc = -1;
    for (int i = 0; i < 100 && rc < 0; i++) {
        rc = dsec_create(live.client, &s, &info, &err);
        if (rc < 0)
            msleep(50);
    }
    if (rc < 0)
        fail_msg("cell %s never placed a create: %s", c->cell, err.msg);
    assert_int_equal(dsec_destroy(live.client, info.id, &err), 0);
    msleep(200); /* its room back in the scheduler's view (a report) */
}

static dsec_sched *sched0(void)
{
    return dsec_cell_sched_at(live.cell, 0);
}

static uint64_t node_live(void)
{
    dsec_node_stats ns;
    dsec_node_stats_get(dsec_cell_node_at(live.cell, 0), &ns);
    return ns.live;
}

/* ---- overload: every create is answered, none made twice --------------------------- */

#define OFFER_MAX 512

struct offer {
    _Atomic int done, ok, overloaded, other, bad_retry_after, late;
    uint64_t sent_ms[OFFER_MAX];
    char ids[OFFER_MAX][DSEC_ID_MAX];
    int other_code;
};

struct offer_one {
    struct offer *o;
    int i;
};

static void on_offered(int status, const dsec_sandbox_info *info, const dsec_err *err, void *ud)
{
    struct offer_one *one = ud;
    struct offer *o = one->o;
    /* the client's own timeout is its deadline (5 s): an answer after it is a timeout */
    if (mono_ms() - o->sent_ms[one->i] >= 5000)
        atomic_fetch_add(&o->late, 1);
    if (status == 0) {
        snprintf(o->ids[one->i], sizeof o->ids[0], "%s", info->id);
        atomic_fetch_add(&o->ok, 1);
    } else if (err->code == DSEC_E_OVERLOADED) {
        if (err->retry_after_ms == 0 || !dsec_code_retry_safe(err->code))
            atomic_fetch_add(&o->bad_retry_after, 1);
        atomic_fetch_add(&o->overloaded, 1);
    } else {
        o->other_code = err->code;
        atomic_fetch_add(&o->other, 1);
    }
    atomic_fetch_add(&o->done, 1);
}

/* Bursts of 6 creates every 100 ms for 2 s at a replica that holds at most 2:
 * about 3 times what it takes. Without client retries every answer is seen
 * as the scheduler gave it. */
static void overload_is_answered_not_queued(void **state)
{
    (void)state;
    start_cell(1000000, 2, 2, 0, 5000, -1);
    dsec_sched_stats s0;
    dsec_sched_stats_get(sched0(), &s0);
    uint64_t live0 = node_live();
    /* static: a callback after a failed assertion must not write into a dead frame */
    static struct offer o;
    static struct offer_one ones[OFFER_MAX];
    memset(&o, 0, sizeof o);
    dsec_create_spec s = {.type = "sim",
                          .cpu_milli = 10,
                          .memory_mb = 16,
                          .cls = "job",
                          .ttl_s = 120,
                          .cell = live.conf.cell};
    dsec_err err;
    int sent = 0;
    for (int burst = 0; burst < 20; burst++) {
        for (int k = 0; k < 6 && sent < OFFER_MAX; k++, sent++) {
            ones[sent] = (struct offer_one){.o = &o, .i = sent};
            o.sent_ms[sent] = mono_ms();
            assert_int_equal(dsec_create_async(live.client, &s, on_offered, &ones[sent], &err), 0);
        }
        msleep(100);
    }
    for (int i = 0; i < 700 && atomic_load(&o.done) < sent; i++)
        msleep(10);
    assert_int_equal(atomic_load(&o.done), sent);
    if (atomic_load(&o.other) > 0)
        fail_msg("%d creates failed otherwise (%s)", atomic_load(&o.other),
                 dsec_code_name(o.other_code));
    assert_int_equal(atomic_load(&o.late), 0);
    assert_int_equal(atomic_load(&o.bad_retry_after), 0);
    assert_int_equal(atomic_load(&o.ok) + atomic_load(&o.overloaded), sent);
    assert_true(atomic_load(&o.overloaded) > 0); /* the bound was reached... */
    assert_true(atomic_load(&o.ok) > 0);         /* ...and creates went on being placed */
    /* the replica counted each create once: let in (and placed) or shed */
    dsec_sched_stats s1;
    dsec_sched_stats_get(sched0(), &s1);
    assert_int_equal(s1.shed - s0.shed, (uint64_t)atomic_load(&o.overloaded));
    assert_int_equal(s1.admitted - s0.admitted, (uint64_t)atomic_load(&o.ok));
    /* no sandbox twice: the node holds exactly one per ok answer, all distinct */
    for (int i = 0; i < 100 && node_live() != live0 + (uint64_t)atomic_load(&o.ok); i++)
        msleep(20);
    assert_int_equal(node_live(), live0 + (uint64_t)atomic_load(&o.ok));
    for (int i = 0; i < sent; i++)
        for (int j = i + 1; j < sent && o.ids[i][0]; j++)
            if (strcmp(o.ids[i], o.ids[j]) == 0)
                fail_msg("creates %d and %d both answered with sandbox %s", i, j, o.ids[i]);
}

/* ---- shedding by time in the mailbox ------------------------------------------------------ */

#define BURST 8000

struct burst {
    _Atomic int done, ok, overloaded, other, bad_retry_after, late;
    uint64_t sent_ms[BURST], ok_ms[BURST], shed_ms_max;
    char ids[BURST][DSEC_ID_MAX];
    int other_code;
    char other_msg[DSEC_ERR_MSG_MAX];
    pthread_mutex_t mu;
};

struct burst_one {
    struct burst *b;
    int i;
};

static void on_burst(int status, const dsec_sandbox_info *info, const dsec_err *err, void *ud)
{
    struct burst_one *one = ud;
    struct burst *b = one->b;
    uint64_t took = mono_ms() - b->sent_ms[one->i];
    if (took >= 5000) /* the client's deadline */
        atomic_fetch_add(&b->late, 1);
    if (status == 0) {
        snprintf(b->ids[one->i], sizeof b->ids[0], "%s", info->id);
        b->ok_ms[one->i] = took;
        atomic_fetch_add(&b->ok, 1);
    } else if (err->code == DSEC_E_OVERLOADED) {
        if (err->retry_after_ms == 0 || strstr(err->msg, "shed_after_ms") == NULL)
            atomic_fetch_add(&b->bad_retry_after, 1);
        pthread_mutex_lock(&b->mu);
        if (took > b->shed_ms_max)
            b->shed_ms_max = took;
        pthread_mutex_unlock(&b->mu);
        atomic_fetch_add(&b->overloaded, 1);
    } else {
        pthread_mutex_lock(&b->mu);
        b->other_code = err->code;
        snprintf(b->other_msg, sizeof b->other_msg, "%s", err->msg);
        pthread_mutex_unlock(&b->mu);
        atomic_fetch_add(&b->other, 1);
    }
    atomic_fetch_add(&b->done, 1);
}

/* Creates the cell answered "overloaded" for their wait: the scheduler's
 * (its creates actor) and the node's (placements). */
static uint64_t shed_by_wait(void)
{
    const dsec_actor *acts[8];
    size_t n = dsec_sched_actors(sched0(), acts, 8);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        dsec_actor_stats st;
        dsec_actor_stats_get(acts[i], &st);
        total += st.shed;
    }
    dsec_node_stats ns;
    dsec_node_stats_get(dsec_cell_node_at(live.cell, 0), &ns);
    return total + ns.shed_places;
}

#define SENDERS 4

struct sender {
    struct burst *b;
    struct burst_one *ones;
    int from, to, failed;
};

static void *sender_main(void *p)
{
    struct sender *sd = p;
    dsec_create_spec s = {.type = "sim",
                          .cpu_milli = 1,
                          .memory_mb = 1,
                          .cls = "job",
                          .ttl_s = 120,
                          .cell = live.conf.cell};
    dsec_err err;
    for (int i = sd->from; i < sd->to; i++) {
        sd->ones[i] = (struct burst_one){.b = sd->b, .i = i};
        sd->b->sent_ms[i] = mono_ms();
        if (dsec_create_async(live.client, &s, on_burst, &sd->ones[i], &err) == 0)
            continue;
        if (err.code == DSEC_E_OVERLOADED && strstr(err.msg, "pace") != NULL &&
            err.retry_after_ms > 0) {
            /* answered at once by the client's pace (its turn would come after its deadline):
             * an "overloaded" answer like the cell's */
            atomic_fetch_add(&sd->b->overloaded, 1);
            atomic_fetch_add(&sd->b->done, 1);
        } else {
            sd->failed++;
        }
    }
    return NULL;
}

/* Send BURST creates at once from SENDERS threads, faster than the cell's one
 * worker takes them, and wait for every answer. */
static void send_burst(struct burst *b, struct burst_one *ones)
{
    pthread_t th[SENDERS];
    struct sender sd[SENDERS];
    for (int k = 0; k < SENDERS; k++) {
        sd[k] = (struct sender){
            .b = b, .ones = ones, .from = k * BURST / SENDERS, .to = (k + 1) * BURST / SENDERS};
        assert_int_equal(pthread_create(&th[k], NULL, sender_main, &sd[k]), 0);
    }
    for (int k = 0; k < SENDERS; k++) {
        pthread_join(th[k], NULL);
        assert_int_equal(sd[k].failed, 0);
    }
    for (int i = 0; i < 1500 && atomic_load(&b->done) < BURST; i++)
        msleep(10);
    assert_int_equal(atomic_load(&b->done), BURST);
    if (atomic_load(&b->other) > 0)
        fail_msg("%d creates failed otherwise: %s (%s)", atomic_load(&b->other), b->other_msg,
                 dsec_code_name(b->other_code));
    assert_int_equal(atomic_load(&b->late), 0);
}

/* No sandbox twice: the node holds exactly one per ok answer, all distinct. */
static void one_sandbox_per_ok(struct burst *b, uint64_t live0)
{
    uint64_t want = live0 + (uint64_t)atomic_load(&b->ok);
    for (int i = 0; i < 150 && node_live() != want; i++)
        msleep(20);
    assert_int_equal(node_live(), want);
    for (int i = 0; i < BURST; i++)
        for (int j = i + 1; j < BURST && b->ids[i][0]; j++)
            if (strcmp(b->ids[i], b->ids[j]) == 0)
                fail_msg("creates %d and %d both answered with sandbox %s", i, j, b->ids[i]);
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* A burst of 8,000 creates at a replica with one bus worker, far more than
 * it places in 20 ms (the bound here; admit_max is out of reach): once the
 * queue stands (not empty for 100 ms), what waited longer is answered
 * "overloaded" (retry-safe, retry_after_ms, naming the
 * bound) when its turn comes instead of being placed late, so the admitted
 * creates saw short queues. Every create is answered before its deadline,
 * each shed counted once, and no sandbox is made twice; once no queue
 * stands, creates one at a time are all placed. */
static void burst_is_shed_by_wait(void **state)
{
    (void)state;
    start_cell(1000000, 65536, 65536, 20, 5000, -1);
    uint64_t live0 = node_live(), shed0 = shed_by_wait();
    static struct burst b;
    static struct burst_one ones[BURST];
    memset(&b, 0, sizeof b);
    pthread_mutex_init(&b.mu, NULL);
    uint64_t t0 = mono_ms();
    send_burst(&b, ones);
    uint64_t took = mono_ms() - t0;
    int ok = atomic_load(&b.ok), over = atomic_load(&b.overloaded);
    assert_int_equal(ok + over, BURST);
    assert_int_equal(atomic_load(&b.bad_retry_after), 0);
    if (over == 0)
        fail_msg("a burst of %d: %d placed, none shed in %" PRIu64 " ms", BURST, ok, took);
    /* each shed answer is one the cell counted as shed for its wait */
    assert_int_equal(shed_by_wait() - shed0, (uint64_t)over);
    one_sandbox_per_ok(&b, live0);
    /* The admitted creates did not queue behind the whole burst: their median
     * answer came well before the last answer of the burst. */
    uint64_t okv[BURST];
    int n = 0;
    for (int i = 0; i < BURST; i++)
        if (b.ids[i][0])
            okv[n++] = b.ok_ms[i];
    qsort(okv, (size_t)n, sizeof okv[0], cmp_u64);
    print_message("burst of %d in %" PRIu64 " ms: %d placed (p50 %" PRIu64 " ms, max %" PRIu64
                  " ms), %d shed (slowest shed answer %" PRIu64 " ms)\n",
                  BURST, took, ok, n > 0 ? okv[n / 2] : 0, n > 0 ? okv[n - 1] : 0, over,
                  b.shed_ms_max);
    /* With no queue standing, nothing is shed: creates one at a time are placed. */
    uint64_t shed1 = shed_by_wait();
    dsec_create_spec one = {.type = "sim",
                            .cpu_milli = 1,
                            .memory_mb = 1,
                            .cls = "job",
                            .ttl_s = 120,
                            .cell = live.conf.cell};
    for (int i = 0; i < 20; i++) {
        dsec_sandbox_info info;
        dsec_err err;
        if (dsec_create(live.client, &one, &info, &err) < 0)
            fail_msg("create %d after the burst: %s (%s)", i, err.msg, dsec_code_name(err.code));
    }
    assert_int_equal(shed_by_wait(), shed1);
}

/* The same burst with libdsec's retries: every shed create comes back after
 * its retry_after_ms with the same req_id and is placed, exactly once. */
static void shed_burst_retried_once_each(void **state)
{
    (void)state;
#if defined(__SANITIZE_THREAD__)
    /* ThreadSanitizer slows every thread several times: a burst of 8,000 with retries then
     * neither places half nor answers all within 5 s (seen in CI), which says nothing of the
     * races it is there to find; burst_is_shed_by_wait runs the shedding under it */
    fprintf(stderr, "shed_burst_retried_once_each: skipped under ThreadSanitizer\n");
    skip();
#endif
    start_cell(1000000, 65536, 65536, 20, 5000, 2);
    uint64_t live0 = node_live(), shed0 = shed_by_wait();
    static struct burst b;
    static struct burst_one ones[BURST];
    memset(&b, 0, sizeof b);
    pthread_mutex_init(&b.mu, NULL);
    send_burst(&b, ones);
    assert_true(shed_by_wait() > shed0); /* some were shed... */
    /* ...yet with retries within the deadline all were placed, or given up as overloaded
     * when no retry fitted before it (never anything else) */
    assert_int_equal(atomic_load(&b.ok) + atomic_load(&b.overloaded), BURST);
    assert_true(atomic_load(&b.ok) > BURST / 2);
    one_sandbox_per_ok(&b, live0);
}

/* ---- parked rollouts -------------------------------------------------------------------- */

struct one_answer {
    _Atomic int done;
    int status, code;
};

static void on_one(int status, const dsec_sandbox_info *info, const dsec_err *err, void *ud)
{
    struct one_answer *a = ud;
    (void)info;
    a->status = status;
    a->code = status == 0 ? 0 : err->code;
    atomic_store(&a->done, 1);
}

/* A rollout parked for room is answered "overloaded" before its deadline
 * (not left to time out), and one past park_max at once; a parked one is
 * still placed when room comes. */
static void parked_rollout_is_answered(void **state)
{
    (void)state;
    start_cell(1000, 8, 1, 0, 20000, -1);
    dsec_err err;
    dsec_sandbox_info full;
    dsec_create_spec job = {
        .type = "sim", .cpu_milli = 1000, .memory_mb = 16, .cls = "job", .cell = live.conf.cell};
    if (dsec_create(live.client, &job, &full, &err) < 0)
        fail_msg("a create that fills the node: %s (%s)", err.msg, dsec_code_name(err.code));
    dsec_create_spec ro = {.type = "sim",
                           .cpu_milli = 1000,
                           .memory_mb = 16,
                           .cls = "rollout",
                           .cell = live.conf.cell};
    /* 1: parked (the node is full), waiting for room */
    static struct one_answer first;
    memset(&first, 0, sizeof first);
    assert_int_equal(dsec_create_async(live.client, &ro, on_one, &first, &err), 0);
    dsec_sched_stats ss;
    for (int i = 0; i < 200; i++) {
        dsec_sched_stats_get(sched0(), &ss);
        if (ss.waiting == 1)
            break;
        msleep(10);
    }
    assert_int_equal(ss.waiting, 1);
    /* 2: past park_max (1): overloaded at once */
    dsec_sandbox_info info;
    uint64_t t0 = mono_ms();
    assert_int_equal(dsec_create(live.client, &ro, &info, &err), -1);
    assert_int_equal(err.code, DSEC_E_OVERLOADED);
    assert_true(err.retry_after_ms > 0);
    assert_non_null(strstr(err.msg, "park_max"));
    assert_true(mono_ms() - t0 < 5000); /* answered, not left to the client's 20 s */
    /* 3: a client whose deadline comes long before wait_ms (30 s): answered
     * "overloaded" before that deadline, not a timeout */
    dsec_client *quick;
    dsec_client_opts o = {
        .url = dsec_natsd_url(natsd), .tenant = "t", .timeout_ms = 1500, .retries = -1};
    assert_int_equal(dsec_client_connect(&quick, &o, &err), 0);
    dsec_sched_stats_get(sched0(), &ss);
    uint64_t shed0 = ss.shed;
    /* room for the park: the first rollout must not be what blocks it */
    int rc = dsec_create(quick, &ro, &info, &err);
    dsec_client_free(quick);
    assert_int_equal(rc, -1);
    if (err.code != DSEC_E_OVERLOADED)
        fail_msg("a rollout that cannot be placed before its deadline: %s (%s)", err.msg,
                 dsec_code_name(err.code));
    assert_true(err.retry_after_ms > 0);
    dsec_sched_stats_get(sched0(), &ss);
    assert_int_equal(ss.shed, shed0 + 1);
    assert_int_equal(ss.waiting, 1); /* the first still waits */
    /* room: the parked one is placed */
    assert_int_equal(dsec_destroy(live.client, full.id, &err), 0);
    for (int i = 0; i < 1000 && !atomic_load(&first.done); i++)
        msleep(10);
    assert_true(atomic_load(&first.done));
    assert_int_equal(first.status, 0);
}

/* ---- libdsec retries "overloaded" -------------------------------------------------------- */

/* A replica that holds 1: a parked rollout fills it, so a create that would
 * fit is shed; libdsec retries it (same req_id) after retry_after_ms, and
 * once room lets the rollout go the retry is placed, once. */
static void client_retries_overloaded(void **state)
{
    (void)state;
    start_cell(3000, 1, 1, 0, 15000, 2);
    dsec_err err;
    dsec_sandbox_info a;
    dsec_create_spec job = {
        .type = "sim", .cpu_milli = 1000, .memory_mb = 16, .cls = "job", .cell = live.conf.cell};
    assert_int_equal(dsec_create(live.client, &job, &a, &err), 0);
    msleep(200); /* its placement confirmed by a report: the replica holds nothing */
    dsec_create_spec ro = {.type = "sim",
                           .cpu_milli = 2500,
                           .memory_mb = 16,
                           .cls = "rollout",
                           .cell = live.conf.cell};
    static struct one_answer r;
    memset(&r, 0, sizeof r);
    assert_int_equal(dsec_create_async(live.client, &ro, on_one, &r, &err), 0);
    dsec_sched_stats ss;
    for (int i = 0; i < 200; i++) {
        dsec_sched_stats_get(sched0(), &ss);
        if (ss.waiting == 1)
            break;
        msleep(10);
    }
    assert_int_equal(ss.waiting, 1);
    uint64_t shed0 = ss.shed;
    static struct one_answer b;
    memset(&b, 0, sizeof b);
    dsec_create_spec bs = {.type = "sim",
                           .cpu_milli = 500,
                           .memory_mb = 16,
                           .cls = "job",
                           .cell = live.conf.cell,
                           .req_id = "admit-retry-b"};
    assert_int_equal(dsec_create_async(live.client, &bs, on_one, &b, &err), 0);
    for (int i = 0; i < 200; i++) {
        dsec_sched_stats_get(sched0(), &ss);
        if (ss.shed > shed0)
            break;
        msleep(10);
    }
    assert_true(ss.shed > shed0);       /* b was answered "overloaded"... */
    assert_false(atomic_load(&b.done)); /* ...and libdsec did not give up */
    uint64_t live0 = node_live();
    assert_int_equal(dsec_destroy(live.client, a.id, &err), 0);
    for (int i = 0; i < 1200 && !(atomic_load(&b.done) && atomic_load(&r.done)); i++)
        msleep(10);
    assert_true(atomic_load(&r.done));
    assert_int_equal(r.status, 0);
    assert_true(atomic_load(&b.done));
    if (b.status != 0)
        fail_msg("the retried create failed: %s", dsec_code_name(b.code));
    /* a went, r and b came: one sandbox for b's req_id */
    for (int i = 0; i < 100 && node_live() != live0 + 1; i++)
        msleep(20);
    assert_int_equal(node_live(), live0 + 1);
    /* the same req_id again finds it: it was made exactly once */
    dsec_sandbox_info again;
    assert_int_equal(dsec_create(live.client, &bs, &again, &err), 0);
    assert_true(again.existing);
    assert_int_equal(node_live(), live0 + 1);
}

/* ---- configuration ------------------------------------------------------------------------- */

static int load(const char *yaml, dsec_cell_conf *c, dsec_err *err)
{
    char path[128];
    snprintf(path, sizeof path, "%s/admit.yaml", root);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(yaml, f);
    fclose(f);
    dsec_cell_conf_defaults(c);
    return dsec_cell_conf_load(c, path, err);
}

static void config_bounds(void **state)
{
    (void)state;
    dsec_cell_conf c;
    dsec_err err;
    assert_int_equal(load("scheduler:\n  admit_max: 64\n  park_max: 8\n", &c, &err), 0);
    assert_int_equal(c.admit_max, 64);
    assert_int_equal(c.park_max, 8);
    dsec_cell_conf_release(&c);
    /* park_max left out follows a smaller admit_max */
    assert_int_equal(load("scheduler:\n  admit_max: 16\n", &c, &err), 0);
    assert_int_equal(c.admit_max, 16);
    assert_int_equal(c.park_max, 16);
    dsec_cell_conf_release(&c);
    assert_int_equal(load("scheduler:\n  admit_max: 0\n", &c, &err), -1);
    assert_int_equal(err.code, DSEC_E_CONFIG);
    assert_non_null(strstr(err.msg, "admit_max"));
    dsec_cell_conf_release(&c);
    assert_int_equal(load("scheduler:\n  admit_max: lots\n", &c, &err), -1);
    assert_non_null(strstr(err.msg, "admit_max"));
    dsec_cell_conf_release(&c);
    assert_int_equal(load("scheduler:\n  park_max: 2000000\n", &c, &err), -1);
    assert_non_null(strstr(err.msg, "park_max"));
    dsec_cell_conf_release(&c);
    assert_int_equal(load("scheduler:\n  admit_max: 10\n  park_max: 20\n", &c, &err), -1);
    assert_int_equal(err.code, DSEC_E_CONFIG);
    assert_non_null(strstr(err.msg, "park_max (20) must not exceed scheduler.admit_max (10)"));
    dsec_cell_conf_release(&c);
    assert_int_equal(load("scheduler:\n  shed_after_ms: 40\n", &c, &err), 0);
    assert_int_equal(c.shed_after_ms, 40);
    dsec_cell_conf_release(&c);
    assert_int_equal(load("scheduler:\n  shed_after_ms: 0\n", &c, &err), 0); /* never */
    assert_int_equal(c.shed_after_ms, 0);
    dsec_cell_conf_release(&c);
    assert_int_equal(load("scheduler:\n  shed_after_ms: 600001\n", &c, &err), -1);
    assert_non_null(strstr(err.msg, "shed_after_ms"));
    dsec_cell_conf_release(&c);
    dsec_cell_conf_defaults(&c);
    assert_int_equal(c.shed_after_ms, 0); /* off unless configured */
    assert_int_equal(c.admit_delay_ms, 0);
    assert_int_equal(c.window_ms, 100); /* on by default */
    dsec_cell_conf_release(&c);
    assert_int_equal(load("scheduler:\n  window_ms: 0\n", &c, &err), 0); /* off */
    assert_int_equal(c.window_ms, 0);
    dsec_cell_conf_release(&c);
    assert_int_equal(load("scheduler:\n  admit_delay_ms: 50\n", &c, &err), 0);
    assert_int_equal(c.admit_delay_ms, 50);
    dsec_cell_conf_release(&c);
    assert_int_equal(load("scheduler:\n  admit_delay_ms: 600001\n", &c, &err), -1);
    assert_int_equal(err.code, DSEC_E_CONFIG);
    assert_non_null(strstr(err.msg, "admit_delay_ms"));
    dsec_cell_conf_release(&c);
    assert_int_equal(load("scheduler:\n  admit_delay_ms: soon\n", &c, &err), -1);
    assert_non_null(strstr(err.msg, "admit_delay_ms"));
    dsec_cell_conf_release(&c);
    assert_int_equal(load("scheduler:\n  window_ms: 150\n", &c, &err), 0);
    assert_int_equal(c.window_ms, 150);
    dsec_cell_conf_release(&c);
    assert_int_equal(load("scheduler:\n  window_ms: 600001\n", &c, &err), -1);
    assert_int_equal(err.code, DSEC_E_CONFIG);
    assert_non_null(strstr(err.msg, "window_ms"));
    dsec_cell_conf_release(&c);
}

/* Admission by delay on a cell that keeps up: every placement is stamped and its node hands
 * the stamp back in its capacity reports, which the replica counts; on time, nothing is
 * shed and no limit is set. */
static void placements_echoed_on_time(void **state)
{
    (void)state;
    next_admit_delay_ms = 1000; /* far above what this host's placements take */
    start_cell(100000, 0, 0, 0, 5000, -1);
    dsec_sched_stats before;
    dsec_sched_stats_get(sched0(), &before);
    dsec_create_spec s = {
        .type = "sim", .cpu_milli = 1, .memory_mb = 1, .cls = "job", .cell = live.conf.cell};
    dsec_err err;
    for (int i = 0; i < 60; i++) {
        dsec_sandbox_info info;
        if (dsec_create(live.client, &s, &info, &err) < 0)
            fail_msg("create %d: %s", i, err.msg);
    }
    dsec_sched_stats st;
    for (int i = 0; i < 100; i++) { /* the node reports every capacity_ms (50 ms) */
        dsec_sched_stats_get(sched0(), &st);
        if (st.place_echoes > before.place_echoes)
            break;
        msleep(20);
    }
    print_message("echoes %llu, late %llu, worst delay of the last window %llu us\n",
                  (unsigned long long)st.place_echoes, (unsigned long long)st.late_placements,
                  (unsigned long long)st.place_delay_us);
    assert_true(st.place_echoes > before.place_echoes);
    assert_int_equal(st.shed_late, 0);
    assert_int_equal(st.admit_limit, 0);
    assert_int_equal(st.late_placements, 0);
}

/* ---- the window: placements on their way ------------------------------------------------- */

/* A node the test plays: room for everything, it takes placements without answering them
 * and hands back, when the test says so, the newest stamp it took. */
struct fake_node {
    dsec_bus *bus;
    dsec_actor *a;
    char name[96];
    pthread_mutex_t mu;
    uint64_t newest, taken, seq;
    uint64_t echo_taken; /* what its echo says it took since the last one */
    char sched[96];
};

static void fake_on_place(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a;
    struct fake_node *f = ud;
    dsec_msg_place p;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_PLACE, dsec_msg_data(m), dsec_msg_len(m), &p,
                    &err) < 0)
        return;
    pthread_mutex_lock(&f->mu);
    f->taken++;
    if (p.sent_us > f->newest)
        f->newest = p.sent_us;
    if (p.scheduler != NULL)
        snprintf(f->sched, sizeof f->sched, "%s", p.scheduler);
    pthread_mutex_unlock(&f->mu);
}

static uint64_t fake_taken(struct fake_node *f)
{
    pthread_mutex_lock(&f->mu);
    uint64_t n = f->taken;
    pthread_mutex_unlock(&f->mu);
    return n;
}

/* A report with room for everything; echo: hand back the newest stamp taken. */
static void fake_report(struct fake_node *f, bool echo)
{
    static const char *types[] = {"sim"};
    pthread_mutex_lock(&f->mu);
    dsec_msg_place_echo e = {.scheduler = f->sched, .sent_us = f->newest, .taken = f->echo_taken};
    dsec_msg_capacity c = {.node = f->name,
                           .cell = live.conf.cell,
                           .seq = ++f->seq,
                           .full = true,
                           .cpu_free_milli = 100000000,
                           .mem_free_mb = 100000000,
                           .slots_free = 1000000,
                           .cpu_milli = 100000000,
                           .memory_mb = 100000000,
                           .slots = 1000000,
                           .types = {types, 1},
                           .echo = {&e, echo && f->newest != 0 ? 1u : 0u}};
    char subj[256];
    snprintf(subj, sizeof subj, DSEC_SUBJ_EVT_OF ".capacity", live.conf.cell, "node", f->name);
    dsec_err err;
    int rc = dsec_wire_send(NULL, f->bus, subj, NULL, DSEC_MSG_CAPACITY, &c, NULL, &err);
    pthread_mutex_unlock(&f->mu);
    if (rc < 0)
        fail_msg("fake node report: %s", err.msg);
}

struct answers {
    _Atomic int ok, window, deadline, other;
    char other_msg[1100];
};

static void on_create_answer(int status, dsec_msg *reply, const dsec_err *berr, void *ud)
{
    struct answers *a = ud;
    const char *type = status == 0 ? dsec_msg_type(reply) : NULL;
    if (type != NULL && strcmp(type, "error") != 0) {
        atomic_fetch_add(&a->ok, 1);
        return;
    }
    dsec_msg_error e;
    dsec_err derr;
    if (type != NULL &&
        dsec_decode(dsec_wire_decoder(), DSEC_MSG_ERROR, dsec_msg_data(reply), dsec_msg_len(reply),
                    &e, &derr) == 0 &&
        strcmp(e.code, "overloaded") == 0 && strstr(e.message, "scheduler.window_ms") != NULL &&
        e.retry_after_ms >= 10) {
        atomic_fetch_add(&a->window, 1);
        return;
    }
    if (type != NULL &&
        dsec_decode(dsec_wire_decoder(), DSEC_MSG_ERROR, dsec_msg_data(reply), dsec_msg_len(reply),
                    &e, &derr) == 0 &&
        strcmp(e.code, "overloaded") == 0 && strstr(e.message, "past the create's deadline") &&
        strstr(e.message, "ms late") != NULL) {
        atomic_fetch_add(&a->deadline, 1);
        return;
    }
    if (atomic_fetch_add(&a->other, 1) == 0)
        snprintf(a->other_msg, sizeof a->other_msg, "%s",
                 status < 0     ? berr->msg
                 : type != NULL ? type
                                : "?");
}

static void send_creates_by(dsec_bus *bus, int n, int first, uint64_t deadline_ns,
                            struct answers *ans)
{
    for (int i = first; i < first + n; i++) {
        char rid[64], subj[128];
        snprintf(rid, sizeof rid, "win-%d-%d", (int)getpid(), i);
        dsec_msg_create m = {.req_id = rid,
                             .type = "sim",
                             .cpu_milli = 1,
                             .memory_mb = 1,
                             .cls = "job",
                             .deadline_ns = deadline_ns};
        dsec_buf *b = dsec_wire_buf();
        dsec_err err;
        assert_int_equal(dsec_encode(b, DSEC_MSG_CREATE, &m, &err), 0);
        snprintf(subj, sizeof subj, "dsec.v1.t.create.%s", live.conf.cell);
        dsec_hdr h = {.type = "create", .schema = DSEC_SCHEMA_VERSION, .req_id = rid};
        if (dsec_bus_request(bus, subj, &h, b->data, b->len, 3000, on_create_answer, ans, &err) < 0)
            fail_msg("create %d: %s", i, err.msg);
    }
}

static void send_creates(dsec_bus *bus, int n, int first, struct answers *ans)
{
    send_creates_by(bus, n, first, 0, ans);
}

/* Wait until n creates are placed or answered past the window. */
static bool wait_accounted(struct fake_node *f, struct answers *ans, uint64_t n)
{
    for (int i = 0; i < 250; i++) {
        if (fake_taken(f) + (uint64_t)atomic_load(&ans->window) >= n)
            return true;
        msleep(20);
    }
    return false;
}

/* A replica has at most its window of placements on their way to nodes that have not taken
 * them (WINDOW_MIN, 512, while its nodes have taken none): the creates past it are answered
 * "overloaded" at once, naming scheduler.window_ms, and nothing is placed for them. Once the
 * node's report counts what it took, the window opens again. */
static void window_bounds_placements_on_their_way(void **state)
{
    (void)state;
    dsec_cell_conf *c = &live.conf;
    dsec_cell_conf_defaults(c);
    snprintf(c->cell, sizeof c->cell, "a%d-%ld", ++serial, (long)getpid());
    snprintf(c->url, sizeof c->url, "%s", dsec_natsd_url(natsd));
    snprintf(c->state_dir, sizeof c->state_dir, "%s/%s", root, c->cell);
    c->sched_replicas = 1;
    assert_int_equal(c->window_ms, 100); /* on by default */
    c->window_ms = 150;
    dsec_err err;
    if (dsec_cell_start(&live.cell, c, DSEC_ROLE_SCHEDULER, &err) < 0)
        fail_msg("cell %s: %s", c->cell, err.msg);

    struct fake_node f = {0};
    pthread_mutex_init(&f.mu, NULL);
    snprintf(f.name, sizeof f.name, "%s-fake", c->cell);
    dsec_bus_opts bo = {.url = dsec_natsd_url(natsd), .name = "fake-node", .threads = 1};
    assert_int_equal(dsec_bus_connect(&f.bus, &bo, &err), 0);
    assert_int_equal(dsec_actor_new(&f.a, f.bus, "fake-node", &err), 0);
    char subj[160];
    snprintf(subj, sizeof subj, DSEC_SUBJ_PLACE, f.name);
    assert_int_equal(dsec_actor_on(f.a, subj, NULL, fake_on_place, &f, &err), 0);
    assert_int_equal(dsec_bus_flush(f.bus, 2000, &err), 0);
    /* the replica knows the node */
    for (int i = 0; i < 100; i++) {
        fake_report(&f, false);
        dsec_sched_stats st;
        dsec_sched_stats_get(sched0(), &st);
        msleep(20);
        if (st.nodes > 0)
            break;
    }

    struct answers ans = {0};
    uint64_t t_burst = mono_ms();
    send_creates(f.bus, 600, 0, &ans);
    if (!wait_accounted(&f, &ans, 600))
        fail_msg("placements taken %" PRIu64 ", answered past the window %d, other %d (%s)",
                 fake_taken(&f), atomic_load(&ans.window), atomic_load(&ans.other), ans.other_msg);
    msleep(200); /* nothing more comes */
    /* the bound is checked, not locked: creates handled at the same moment by the replica's
     * bus workers may each find one place left */
    uint64_t first = fake_taken(&f);
    if (first < 512 || first > 512 + (uint64_t)live.conf.threads)
        fail_msg("%" PRIu64 " placements made for a window of 512 and %u bus workers", first,
                 (unsigned)live.conf.threads);
    assert_int_equal(atomic_load(&ans.window), 600 - (int)first);
    assert_int_equal(atomic_load(&ans.other), 0);
    dsec_sched_stats st;
    dsec_sched_stats_get(sched0(), &st);
    assert_int_equal(st.shed_window, 600 - first);

    /* a report that echoes none of it keeps the window shut (until the reservations'
     * 2 s are up: a host too slow to get here well before then cannot tell) */
    fake_report(&f, false);
    msleep(100);
    send_creates(f.bus, 5, 600, &ans);
    assert_true(wait_accounted(&f, &ans, 605));
    if (mono_ms() - t_burst < 1500)
        assert_int_equal(atomic_load(&ans.window), 605 - (int)first);
    else
        print_message("the burst took %" PRIu64
                      " ms: the window's hold past a report not checked\n",
                      mono_ms() - t_burst);

    /* the node says it took them all: room for a window more */
    fake_report(&f, true);
    msleep(100);
    int shut = atomic_load(&ans.window);
    send_creates(f.bus, 20, 605, &ans);
    if (!wait_accounted(&f, &ans, 625))
        fail_msg("after the echo: placements taken %" PRIu64 ", answered past the window %d",
                 fake_taken(&f), atomic_load(&ans.window));
    assert_int_equal(atomic_load(&ans.window), shut); /* all 20 placed */

    /* A create whose deadline comes before its placement would reach its node, as late as
     * the replica's placements reach theirs now, is answered at once. 200 placements go out,
     * and the node hands back the newest one's stamp every 25 ms for 400 ms, as a node taking
     * them later and later would: the replica reads its placements as up to about 400 ms
     * late. Then a create due in 5 ms is answered "overloaded", one due in 30 s is placed. */
    uint64_t placed = fake_taken(&f);
    int shut2 = atomic_load(&ans.window);
    send_creates(f.bus, 200, 625, &ans);
    if (!wait_accounted(&f, &ans, placed + (uint64_t)shut2 + 200))
        fail_msg("200 creates: placements taken %" PRIu64, fake_taken(&f));
    shut2 = atomic_load(&ans.window);
    for (int i = 0; i < 16; i++) {
        f.echo_taken = 12;
        fake_report(&f, true);
        msleep(25);
    }
    dsec_sched_stats_get(sched0(), &st);
    print_message("the replica's placements reach their nodes up to %" PRIu64 " ms late\n",
                  st.place_delay_us / 1000);
    assert_true(st.place_delay_us >= 100000);
    send_creates_by(f.bus, 1, 825, dsec_wall_ns() + 5000000ull, &ans);
    for (int i = 0; i < 250 && atomic_load(&ans.deadline) == 0; i++)
        msleep(20);
    assert_int_equal(atomic_load(&ans.deadline), 1);
    uint64_t before = fake_taken(&f);
    send_creates_by(f.bus, 1, 826, dsec_wall_ns() + 30000000000ull, &ans);
    if (!wait_accounted(&f, &ans, before + (uint64_t)shut2 + 1))
        fail_msg("a create due in 30 s was neither placed nor shed");
    assert_int_equal(fake_taken(&f), before + 1);
    assert_int_equal(atomic_load(&ans.other), 0);
    dsec_actor_free(f.a);
    dsec_bus_free(f.bus);
    pthread_mutex_destroy(&f.mu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(config_bounds),
        cmocka_unit_test_teardown(placements_echoed_on_time, test_teardown),
        cmocka_unit_test_teardown(window_bounds_placements_on_their_way, test_teardown),
        cmocka_unit_test_teardown(overload_is_answered_not_queued, test_teardown),
        cmocka_unit_test_teardown(parked_rollout_is_answered, test_teardown),
        cmocka_unit_test_teardown(client_retries_overloaded, test_teardown),
        cmocka_unit_test_teardown(burst_is_shed_by_wait, test_teardown),
        cmocka_unit_test_teardown(shed_burst_retried_once_each, test_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
