/* test_preempt.c - preemption and the trajectory log end to end on a real nats-server with
 * JetStream. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/arbiter.h"
#include "actors/cell.h"
#include "runtime/ticker.h"
#include "runtime/traj.h"
#include "actors/wire.h"
#include "bus/bus.h"
#include "bus/js.h"
#include "tests/fixture.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/job.h"
#include "tests/test_util.h"

static dsec_natsd *natsd;
static char root[64];
static int serial;
static uint32_t wait_override; /* the next cell's scheduler wait_ms, when set */
static bool pause_override;    /* the next cell freezes idle pausable rollouts after 300 ms */

/* What a test started; the teardown stops it even after a failed assertion. */
static struct {
    dsec_cell *cell;
    dsec_cell_conf conf;
    dsec_client *client;
    dsec_job *jobs[8];
    dsec_arbiter *arbs[2];
} live;

static void stop_stale(void);

static int test_teardown(void **state)
{
    stop_stale();
    for (int i = 0; i < 8; i++)
        dsec_job_free(live.jobs[i], true);
    for (int i = 0; i < 2; i++)
        dsec_arbiter_stop(live.arbs[i], true);
    dsec_client_free(live.client);
    dsec_cell_stop(live.cell, true);
    dsec_cell_conf_release(&live.conf);
    memset(&live, 0, sizeof live);
    return 0;
}

static int group_setup(void **state)
{
    return dsec_test_server_start("dsec-preempt", true, &natsd, root, sizeof root);
}

static int group_teardown(void **state)
{
    return dsec_test_server_stop(natsd, root);
}

/* A one-node cell (4000 milli-CPU, 8192 MB) with fast reports; each test
 * gets its own cell name, so buckets and subjects never mix. */
static dsec_cell *start_cell(int roles, uint32_t grace_ms, uint32_t max_per_min)
{
    dsec_cell_conf *c = &live.conf;
    dsec_cell_conf_defaults(c);
    snprintf(c->cell, sizeof c->cell, "p%d-%ld", ++serial, (long)getpid());
    snprintf(c->url, sizeof c->url, "%s", dsec_natsd_url(natsd));
    snprintf(c->state_dir, sizeof c->state_dir, "%s/%s", root, c->cell);
    c->capacity_ms = 20;
    c->full_ms = 500;
    c->heartbeat_ms = 100;
    c->summary_ms = 100;
    c->arbiter_lease_ms = 600;
    c->arbiter_grace_ms = grace_ms;
    c->arbiter_max_per_min = max_per_min;
    if (wait_override)
        c->wait_ms = wait_override;
    wait_override = 0;
    if (pause_override) {
        c->pause_idle_ms = 300;
        c->reap_ms = 50;
    }
    pause_override = false;
    static const char *const types[] = {"sim", NULL};
    char node[80];
    snprintf(node, sizeof node, "%s-n", c->cell);
    dsec_err err;
    assert_int_equal(dsec_cell_conf_add_sim_nodes(c, node, 1, 4000, 8192, 100, types, "0", &err),
                     0);
    snprintf(c->nodes[0].name, sizeof c->nodes[0].name, "%.64s", node);
    if (dsec_cell_start(&live.cell, c, roles, &err) < 0)
        fail_msg("cell %s: %s", c->cell, err.msg);
    dsec_client_opts o = {
        .url = dsec_natsd_url(natsd), .tenant = "t", .timeout_ms = 20000, .retries = -1};
    if (dsec_client_connect(&live.client, &o, &err) < 0)
        fail_msg("client: %s", err.msg);
    return live.cell;
}

static const char *node0(void)
{
    return live.conf.nodes[0].name;
}

static dsec_job *start_job(const char *name, int64_t prio, uint64_t ckpt_ms, uint64_t grace_ms,
                           size_t units, uint64_t cpu_each, dsec_job_checkpoint_fn cb, void *ud)
{
    dsec_job_unit u[8];
    for (size_t i = 0; i < units; i++)
        u[i] = (dsec_job_unit){.node = node0(), .cpu_milli = cpu_each, .memory_mb = 256};
    dsec_job_spec spec = {.name = name,
                          .cell = live.conf.cell,
                          .cls = "job",
                          .priority = prio,
                          .checkpoint_ms = ckpt_ms,
                          .grace_ms = grace_ms,
                          .units = u,
                          .nunits = units};
    dsec_job *j = NULL;
    dsec_err err;
    if (dsec_job_start(live.client, &spec, cb, ud, &j, &err) < 0)
        fail_msg("job %s: %s", name, err.msg);
    for (int i = 0; i < 8; i++)
        if (live.jobs[i] == NULL) {
            live.jobs[i] = j;
            break;
        }
    return j;
}

static uint64_t mono_ms(void)
{
    return dsec_now_ns() / 1000000ull;
}

static int create_rollout(uint64_t cpu, dsec_sandbox_info *info, dsec_err *err)
{
    dsec_create_spec s = {.type = "sim",
                          .cpu_milli = cpu,
                          .memory_mb = 256,
                          .cls = "rollout",
                          .cell = live.conf.cell};
    return dsec_create(live.client, &s, info, err);
}

/* Wait until the node's free CPU is want (capacity reports are 20 ms apart). */
static void wait_node_cpu(uint64_t want)
{
    dsec_node_stats st;
    for (int i = 0; i < 200; i++) {
        dsec_node_stats_get(dsec_cell_node_at(live.cell, 0), &st);
        if (st.cpu_free_milli == want)
            return;
        msleep(10);
    }
    fail_msg("node cpu_free is %" PRIu64 ", expected %" PRIu64, st.cpu_free_milli, want);
}

/* ---- jobs hold capacity --------------------------------------------------------- */

static void job_holdings_reduce_capacity(void **state)
{
    start_cell(DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, 0, 0);
    dsec_job *j = start_job("hold1", 0, 0, 0, 3, 1000, NULL, NULL);
    wait_node_cpu(1000);
    dsec_sandbox_info info;
    dsec_err err;
    dsec_create_spec s = {
        .type = "sim", .cpu_milli = 2000, .memory_mb = 256, .cell = live.conf.cell};
    assert_int_equal(dsec_create(live.client, &s, &info, &err), -1); /* class unset: no wait */
    assert_true(err.code == DSEC_E_CAPACITY || err.code == DSEC_E_REFUSED);
    /* a job cannot hold more than the node has free */
    dsec_job_unit big = {.node = node0(), .cpu_milli = 2000};
    dsec_job_spec spec = {.name = "hold2", .cell = live.conf.cell, .units = &big, .nunits = 1};
    dsec_job *j2 = NULL;
    assert_int_equal(dsec_job_start(live.client, &spec, NULL, NULL, &j2, &err), -1);
    assert_int_equal(err.code, DSEC_E_CAPACITY);
    /* a rollout class cannot register as preemptible work */
    spec = (dsec_job_spec){.name = "hold3", .cell = live.conf.cell, .cls = "rollout"};
    assert_int_equal(dsec_job_start(live.client, &spec, NULL, NULL, &j2, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    dsec_job_free(j, true);
    live.jobs[0] = NULL;
    wait_node_cpu(4000);
    /* the node has it back at once; the schedulers' view follows with the
     * next capacity report */
    int rc = -1;
    for (int i = 0; i < 60 && rc < 0; i++) {
        rc = dsec_create(live.client, &s, &info, &err);
        if (rc < 0 && err.code != DSEC_E_CAPACITY && err.code != DSEC_E_REFUSED)
            break;
        if (rc < 0)
            usleep(50 * 1000);
    }
    if (rc < 0)
        fail_msg("create after the job let go: %s", err.msg);
}

/* ---- cooperative reclaim; a rollout is never a victim ---------------------------- */

struct ckpt {
    int ms;
    int result;
    _Atomic int calls;
};

static int checkpoint(dsec_job *job, const dsec_job_reclaim *r, void *ud)
{
    struct ckpt *c = ud;
    atomic_fetch_add(&c->calls, 1);
    msleep(c->ms);
    return c->result;
}

static atomic_int fake_reclaims;

static void on_fake_reclaim(dsec_actor *a, dsec_msg *m, void *ud)
{
    atomic_fetch_add(&fake_reclaims, 1);
}

static void cooperative_reclaim_never_a_rollout(void **state)
{
    start_cell(DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE | DSEC_ROLE_ARBITER, 3000, 100);
    dsec_bus *bus = dsec_cell_bus(live.cell);
    dsec_sandbox_info first, second;
    dsec_err err;
    assert_int_equal(create_rollout(1000, &first, &err), 0);
    struct ckpt ck = {.ms = 300, .result = 0};
    dsec_job *j = start_job("train1", 0, 300, 3000, 3, 1000, checkpoint, &ck);
    wait_node_cpu(0);
    /* "Preemptible work" claiming class rollout, at the lowest priority and
     * holding capacity: the arbiter must never ask it. */
    dsec_actor *fake;
    char subj[192];
    assert_int_equal(dsec_actor_new(&fake, bus, "fake-rollout", &err), 0);
    snprintf(subj, sizeof subj, "dsec.v1.ctl.job.%s.fake.reclaim", live.conf.cell);
    assert_int_equal(dsec_actor_on(fake, subj, NULL, on_fake_reclaim, NULL, &err), 0);
    dsec_msg_job_hold fh = {.job = "fake", .node = node0(), .unit = "u0", .cpu_milli = 4000};
    dsec_msg_job_register fr = {.job = "fake",
                                .cell = live.conf.cell,
                                .cls = "rollout",
                                .priority = -1000,
                                .holds = {&fh, 1}};
    dsec_buf b;
    dsec_buf_init(&b);
    assert_int_equal(dsec_encode(&b, DSEC_MSG_JOB_REGISTER, &fr, &err), 0);
    snprintf(subj, sizeof subj, "dsec.v1.ctl.job.%s.register", live.conf.cell);
    assert_int_equal(
        dsec_bus_publish(bus, subj, NULL, &(dsec_hdr){.type = "job_register"}, b.data, b.len, &err),
        0);
    dsec_buf_release(&b);
    msleep(300);

    uint64_t t0 = mono_ms();
    if (create_rollout(1000, &second, &err) < 0)
        fail_msg("waiting rollout: %s", err.msg);
    uint64_t took = mono_ms() - t0;
    assert_true(took < 3000 + 2000); /* within the grace period (+ report latency) */
    assert_true(took >= 300);        /* it did wait for the checkpoint */
    assert_int_equal(atomic_load(&ck.calls), 1);
    dsec_job_stats js;
    dsec_job_stats_get(j, &js);
    assert_int_equal(js.reclaims, 1);
    assert_int_equal(js.released, 1);
    assert_int_equal(js.units_held, 2);
    dsec_arbiter_stats as;
    dsec_arbiter_stats_get(dsec_cell_arbiter(live.cell), &as);
    assert_true(as.active);
    assert_int_equal(as.requests, 1);
    assert_int_equal(as.honoured, 1);
    assert_int_equal(as.forced, 0);
    assert_int_equal(atomic_load(&fake_reclaims), 0);
    /* the rollout that was running is untouched */
    dsec_sandbox_info st;
    assert_int_equal(dsec_status(live.client, first.id, &st, &err), 0);
    assert_string_equal(st.state, "running");
    dsec_actor_free(fake);
}

/* ---- the forced path ---------------------------------------------------------------- */

static void missed_deadline_is_forced(void **state)
{
    start_cell(DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE | DSEC_ROLE_ARBITER, 800, 100);
    struct ckpt ck = {.ms = 0, .result = -1}; /* acknowledges, then never releases */
    dsec_job *j = start_job("stubborn", 0, 100, 800, 4, 1000, checkpoint, &ck);
    wait_node_cpu(0);
    dsec_sandbox_info info;
    dsec_err err;
    uint64_t t0 = mono_ms();
    if (create_rollout(1000, &info, &err) < 0)
        fail_msg("waiting rollout: %s", err.msg);
    uint64_t took = mono_ms() - t0;
    assert_true(took >= 800);       /* not before the deadline */
    assert_true(took < 800 + 2000); /* and soon after it */
    dsec_arbiter_stats as;
    dsec_arbiter_stats_get(dsec_cell_arbiter(live.cell), &as);
    assert_int_equal(as.requests, 1);
    assert_int_equal(as.forced, 1);
    assert_int_equal(as.honoured, 0);
    assert_int_equal(as.acked, 1);
    msleep(200); /* the forced notice reaches the job */
    dsec_job_stats js;
    dsec_job_stats_get(j, &js);
    assert_int_equal(js.forced, 1);
    assert_int_equal(js.units_held, 3);
}

/* ---- the eviction-rate cap ------------------------------------------------------------ */

struct tally {
    _Atomic int done, ok;
};

static void on_created(int status, const dsec_sandbox_info *info, const dsec_err *err, void *ud)
{
    struct tally *t = ud;
    if (status == 0)
        atomic_fetch_add(&t->ok, 1);
    atomic_fetch_add(&t->done, 1);
}

static void eviction_rate_is_capped(void **state)
{
    wait_override = 3000; /* the two that get no room fail after 3 s */
    start_cell(DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE | DSEC_ROLE_ARBITER, 3000, 2);
    dsec_job *jobs[4];
    char name[16];
    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof name, "cap%d", i);
        jobs[i] = start_job(name, i, 0, 3000, 1, 1000, NULL, NULL);
    }
    wait_node_cpu(0);
    msleep(200); /* registrations reach the arbiter */
    /* four rollouts want room; only two jobs may be asked this minute */
    dsec_sched_stats ss;
    dsec_create_spec s = {.type = "sim",
                          .cpu_milli = 1000,
                          .memory_mb = 256,
                          .cls = "rollout",
                          .cell = live.conf.cell};
    /* static: a callback that comes after a failed assertion must not write into a dead frame */
    static struct tally t;
    atomic_store(&t.done, 0);
    atomic_store(&t.ok, 0);
    dsec_err err;
    for (int i = 0; i < 4; i++)
        assert_int_equal(dsec_create_async(live.client, &s, on_created, &t, &err), 0);
    for (int i = 0; i < 300 && atomic_load(&t.ok) < 2; i++)
        msleep(10);
    msleep(1500); /* time for a third request, were the cap broken */
    dsec_arbiter_stats as;
    dsec_arbiter_stats_get(dsec_cell_arbiter(live.cell), &as);
    assert_int_equal(as.requests, 2);
    assert_true(as.capped > 0);
    assert_int_equal(atomic_load(&t.ok), 2);
    dsec_sched_stats_get(dsec_cell_sched_at(live.cell, 0), &ss);
    assert_int_equal(ss.waiting, 2);
    /* lowest priority first */
    dsec_job_stats js;
    for (int i = 0; i < 4; i++) {
        dsec_job_stats_get(jobs[i], &js);
        assert_int_equal(js.reclaims, i < 2 ? 1 : 0);
    }
    for (int i = 0; i < 1000 && atomic_load(&t.done) < 4; i++)
        msleep(10);
    assert_int_equal(atomic_load(&t.done), 4); /* the others were told: capacity */
}

/* ---- refusals for room -------------------------------------------------------------------- */

/* Three node managers that the scheduler believes have room and that refuse
 * for room the first refuse_first placements each gets (all when negative),
 * then create: a view whose reports count room that placements in flight have
 * already taken. */
#define NSTALE 3
static struct {
    dsec_actor *a;
    int refuse_first;
    int full_node; /* this node refuses everything for room, with its figures; -1: none */
    _Atomic int places[NSTALE], refusals;
} stale;

static void stale_name(int i, char *out, size_t n)
{
    snprintf(out, n, "%s-f%d", live.conf.cell, i);
}

static void on_stale_place(dsec_actor *a, dsec_msg *m, void *ud)
{
    int i = (int)(intptr_t)ud;
    char name[96];
    stale_name(i, name, sizeof name);
    dsec_msg_place p;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_PLACE, dsec_msg_data(m), dsec_msg_len(m), &p,
                    &err) < 0) {
        fprintf(stderr, "stale node %s: %s\n", name, err.msg);
        return;
    }
    int n = atomic_fetch_add(&stale.places[i], 1);
    bool full = i == stale.full_node;
    if (full || stale.refuse_first < 0 || n < stale.refuse_first) {
        atomic_fetch_add(&stale.refusals, 1);
        const char *tried[16];
        uint32_t nt = p.tried.n < 15 ? p.tried.n : 15;
        for (uint32_t k = 0; k < nt; k++)
            tried[k] = p.tried.v[k];
        tried[nt] = name;
        p.tried = (dsec_strv){tried, nt + 1};
        p.reason = "not enough cpu (free: 0 milli-CPU)";
        p.short_of = "cpu";
        if (full) /* what a node manager sends: its figures after its last report (seq 1) */
            p.free_seq = 1, p.free_cpu_milli = 0, p.free_mem_mb = 8192, p.free_slots = 100;
        if (dsec_wire_send(a, dsec_actor_bus(a), dsec_msg_reply(m), NULL, DSEC_MSG_PLACE, &p,
                           p.c.req_id, &err) < 0)
            fprintf(stderr, "stale node %s: refusal: %s\n", name, err.msg);
        return;
    }
    char id[128];
    snprintf(id, sizeof id, "%s-%016x", name, n);
    dsec_msg_created c = {.id = id,
                          .node = name,
                          .type = "sim",
                          .state = "running",
                          .cell = live.conf.cell,
                          .req_id = p.c.req_id};
    if (dsec_wire_send(a, dsec_actor_bus(a), p.reply_to, NULL, DSEC_MSG_CREATED, &c, p.c.req_id,
                       &err) < 0)
        fprintf(stderr, "stale node %s: created: %s\n", name, err.msg);
}

/* A scheduler-only cell whose view holds the three stale nodes, each with room. */
static void start_stale_cell(int refuse_first)
{
    start_cell(DSEC_ROLE_SCHEDULER, 0, 0);
    memset(&stale, 0, sizeof stale);
    stale.refuse_first = refuse_first;
    stale.full_node = -1;
    dsec_bus *bus = dsec_cell_bus(live.cell);
    dsec_err err;
    assert_int_equal(dsec_actor_new(&stale.a, bus, "stale-nodes", &err), 0);
    const char *types[] = {"sim"};
    for (int i = 0; i < NSTALE; i++) {
        char name[96], subj[256];
        stale_name(i, name, sizeof name);
        snprintf(subj, sizeof subj, "dsec.v1.ctl.place.%s", name);
        assert_int_equal(
            dsec_actor_on(stale.a, subj, NULL, on_stale_place, (void *)(intptr_t)i, &err), 0);
    }
    dsec_sched_stats ss = {0};
    for (int t = 0; t < 100 && ss.nodes < NSTALE; t++) {
        for (int i = 0; i < NSTALE; i++) {
            char name[96], subj[256];
            stale_name(i, name, sizeof name);
            dsec_msg_capacity c = {.node = name,
                                   .cell = live.conf.cell,
                                   .seq = 1,
                                   .full = true,
                                   .cpu_free_milli = 4000,
                                   .mem_free_mb = 8192,
                                   .slots_free = 100,
                                   .cpu_milli = 4000,
                                   .memory_mb = 8192,
                                   .slots = 100,
                                   .types = {types, 1},
                                   .ts_ns = dsec_wall_ns()};
            snprintf(subj, sizeof subj, "dsec.v1.ctl.evt.%s.node.%s.capacity", live.conf.cell,
                     name);
            assert_int_equal(
                dsec_wire_send(stale.a, bus, subj, NULL, DSEC_MSG_CAPACITY, &c, NULL, &err), 0);
        }
        msleep(20);
        dsec_sched_stats_get(dsec_cell_sched_at(live.cell, 0), &ss);
    }
    assert_int_equal(ss.nodes, NSTALE);
}

static void stop_stale(void)
{
    if (stale.a != NULL)
        dsec_actor_free(stale.a);
    stale.a = NULL;
}

/* Every node tried refused the rollout for room once: it waits, and is
 * placed when a node admits it, rather than failing as refused. */
static void rollout_refused_for_room_waits(void **state)
{
    start_stale_cell(1);
    dsec_sandbox_info info;
    dsec_err err;
    if (create_rollout(1000, &info, &err) < 0)
        fail_msg("rollout refused for room by every node: %s", err.msg);
    assert_int_equal(atomic_load(&stale.refusals), NSTALE);
    dsec_sched_stats ss;
    dsec_sched_stats_get(dsec_cell_sched_at(live.cell, 0), &ss);
    assert_int_equal(ss.waited, 1);
    assert_int_equal(ss.waiting, 0);
    stop_stale();
}

/* Nodes that refuse for room forever: the rollout's wait is bounded by
 * wait_ms from its first wait, however often it is placed and refused; a
 * create of another class is refused after max_attempts at once. */
static void refusals_for_room_end_the_wait(void **state)
{
    wait_override = 1000;
    start_stale_cell(-1);
    dsec_sandbox_info info;
    dsec_err err;
    dsec_create_spec s = {
        .type = "sim", .cpu_milli = 1000, .memory_mb = 256, .cls = "job", .cell = live.conf.cell};
    assert_int_equal(dsec_create(live.client, &s, &info, &err), -1);
    assert_int_equal(err.code, DSEC_E_REFUSED);
    assert_non_null(strstr(err.msg, "not enough cpu"));
    assert_int_equal(atomic_load(&stale.refusals), 3);
    uint64_t t0 = mono_ms();
    assert_int_equal(create_rollout(1000, &info, &err), -1);
    uint64_t took = mono_ms() - t0;
    if (err.code != DSEC_E_REFUSED && err.code != DSEC_E_CAPACITY)
        fail_msg("rollout: %s (%s)", err.msg, dsec_code_name(err.code));
    assert_true(took >= 1000);
    assert_true(took < 8000);
    assert_true(atomic_load(&stale.refusals) > 3 + NSTALE); /* placed again after its first wait */
    stop_stale();
}

/* Nodes that never heartbeat but keep answering placements (refusing them) are late, not
 * gone: the scheduler keeps them, suspect, past dead_after_ms (3 s) for as long as they
 * answer, and drains them once they stop. The old scheduler drained them at 3 s. */
static void answering_nodes_stay_past_dead_after(void **state)
{
    start_stale_cell(-1);
    dsec_sched *r = dsec_cell_sched_at(live.cell, 0);
    dsec_create_spec s = {
        .type = "sim", .cpu_milli = 1000, .memory_mb = 256, .cls = "job", .cell = live.conf.cell};
    dsec_sandbox_info info;
    dsec_err err;
    dsec_sched_stats ss;
    uint64_t t0 = mono_ms();
    while (mono_ms() - t0 < 7000) { /* over twice dead_after_ms */
        assert_int_equal(dsec_create(live.client, &s, &info, &err), -1);
        assert_int_equal(err.code, DSEC_E_REFUSED);
        msleep(100);
    }
    dsec_sched_stats_get(r, &ss);
    assert_int_equal(ss.nodes, NSTALE);
    assert_int_equal(ss.expired, 0);
    assert_int_equal(ss.suspect, NSTALE); /* no heartbeat since their one report */
    /* silent and no longer answering: drained (one at a time) */
    for (int waited = 0; waited < 30000 && ss.nodes > 0; waited += 50) {
        msleep(50);
        dsec_sched_stats_get(r, &ss);
    }
    assert_int_equal(ss.nodes, 0);
    assert_int_equal(ss.expired, NSTALE);
    stop_stale();
}

/* One node's report says it has room, but it refuses for room, saying what it has:
 * the scheduler believes the refusal, so no create is sent there a second time
 * (with the report alone it would be, until the node's next report). */
static void a_refusal_for_room_corrects_the_view(void **state)
{
    start_stale_cell(0);
    stale.full_node = 0;
    for (int i = 0; i < 6; i++) {
        dsec_sandbox_info info;
        dsec_err err;
        dsec_create_spec s = {.type = "sim",
                              .cpu_milli = 1000,
                              .memory_mb = 256,
                              .cls = "job",
                              .cell = live.conf.cell};
        if (dsec_create(live.client, &s, &info, &err) < 0)
            fail_msg("create %d: %s", i, err.msg);
        char f0[96];
        stale_name(0, f0, sizeof f0);
        assert_string_not_equal(info.node, f0);
    }
    /* six creates of 1000 milli-CPU on three nodes of 4000: the full one is tried,
     * once (its report made it as good a choice as the others) */
    assert_int_equal(atomic_load(&stale.places[0]), 1);
    assert_int_equal(atomic_load(&stale.places[1]) + atomic_load(&stale.places[2]), 6);
    stop_stale();
}

/* ---- failover --------------------------------------------------------------------------- */

static dsec_arbiter *arbiter(const char *name)
{
    dsec_arbiter_conf ac = {
        .cell = live.conf.cell, .name = name, .lease_ms = 600, .grace_ms = 5000};
    dsec_arbiter *a = NULL;
    dsec_err err;
    if (dsec_arbiter_start(&a, dsec_cell_bus(live.cell), &ac, &err) < 0)
        fail_msg("arbiter %s: %s", name, err.msg);
    live.arbs[live.arbs[0] ? 1 : 0] = a;
    return a;
}

static bool wait_active(dsec_arbiter *a, int ms)
{
    dsec_arbiter_stats st;
    for (int i = 0; i < ms / 10; i++) {
        dsec_arbiter_stats_get(a, &st);
        if (st.active)
            return true;
        msleep(10);
    }
    return false;
}

static void failover_reclaims_nothing_twice(void **state)
{
    start_cell(DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, 0, 0);
    dsec_arbiter *a = arbiter("arb-a");
    assert_true(wait_active(a, 3000));
    dsec_arbiter *b = arbiter("arb-b");
    msleep(500);
    dsec_arbiter_stats st;
    dsec_arbiter_stats_get(b, &st);
    assert_false(st.active); /* never two at once */
    struct ckpt ck = {.ms = 2000, .result = 0};
    dsec_job *j = start_job("slow", 0, 2000, 5000, 4, 1000, checkpoint, &ck);
    wait_node_cpu(0);
    msleep(200);
    struct tally t = {0};
    dsec_create_spec s = {.type = "sim",
                          .cpu_milli = 1000,
                          .memory_mb = 256,
                          .cls = "rollout",
                          .cell = live.conf.cell};
    dsec_err err;
    assert_int_equal(dsec_create_async(live.client, &s, on_created, &t, &err), 0);
    for (int i = 0; i < 300; i++) {
        dsec_arbiter_stats_get(a, &st);
        if (st.requests == 1)
            break;
        msleep(10);
    }
    assert_int_equal(st.requests, 1);
    /* the active arbiter dies mid-reclaim, lease still held */
    dsec_arbiter_stop(a, false);
    live.arbs[0] = NULL;
    assert_true(wait_active(b, 3000));
    for (int i = 0; i < 800 && atomic_load(&t.done) < 1; i++)
        msleep(10);
    assert_int_equal(atomic_load(&t.ok), 1);
    msleep(300);
    dsec_arbiter_stats_get(b, &st);
    assert_int_equal(st.adopted, 1);
    assert_int_equal(st.requests, 0); /* it asked nothing again */
    assert_int_equal(st.honoured, 1);
    assert_int_equal(st.forced, 0);
    dsec_job_stats js;
    dsec_job_stats_get(j, &js);
    assert_int_equal(js.reclaims, 1);
    assert_int_equal(atomic_load(&ck.calls), 1);
}

/* ---- trajectory log ------------------------------------------------------------------- */

static void read_file(const char *id, const char *path, char *out, size_t n)
{
    uint8_t *data = NULL;
    size_t len = 0;
    dsec_err err;
    if (dsec_file_read(live.client, id, path, &data, &len, &err) < 0)
        fail_msg("read %s: %s", path, err.msg);
    snprintf(out, n, "%.*s", (int)len, (const char *)data);
    dsec_free(data);
}

struct seen {
    uint64_t steps[8];
    size_t n;
};

static int collect(const dsec_traj_record *r, void *ud)
{
    struct seen *s = ud;
    if (s->n < 8)
        s->steps[s->n++] = r->step;
    return 0;
}

static void fast_forward_runs_once(void **state)
{
    start_cell(DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, 0, 0);
    dsec_sandbox_info info;
    dsec_err err;
    assert_int_equal(create_rollout(500, &info, &err), 0);
    char rid[64];
    snprintf(rid, sizeof rid, "ro-%.40s", live.conf.cell);
    dsec_write_opts w = {.append = true, .rollout_id = rid, .step = 1};
    assert_int_equal(dsec_file_write_ex(live.client, info.id, "/work/log", "one\n", 4, &w, &err),
                     0);
    static const char *const argv[] = {"echo", "two", NULL};
    dsec_exec_opts x = {.argv = argv, .rollout_id = rid, .step = 2};
    dsec_exec_reply r;
    assert_int_equal(dsec_exec(live.client, info.id, &x, &r, &err), 0);
    assert_int_equal(r.out_len, 4);
    dsec_exec_reply_release(&r);
    /* the trainer is preempted and resumes: it re-issues steps 1 and 2 */
    assert_int_equal(dsec_file_write_ex(live.client, info.id, "/work/log", "one\n", 4, &w, &err),
                     0);
    assert_int_equal(dsec_exec(live.client, info.id, &x, &r, &err), 0);
    assert_int_equal(r.out_len, 4);
    assert_memory_equal(r.out, "two\n", 4);
    dsec_exec_reply_release(&r);
    char buf[64];
    read_file(info.id, "/work/log", buf, sizeof buf);
    assert_string_equal(buf, "one\n"); /* the append ran once */
    /* after the last logged step, the rollout continues live */
    w.step = 3;
    assert_int_equal(dsec_file_write_ex(live.client, info.id, "/work/log", "three\n", 6, &w, &err),
                     0);
    read_file(info.id, "/work/log", buf, sizeof buf);
    assert_string_equal(buf, "one\nthree\n");
    /* a reader leaves the log's limits as the operator set them */
    dsec_js *js = NULL;
    assert_int_equal(dsec_js_new(&js, dsec_cell_bus(live.cell), 5000, &err), 0);
    dsec_stream_conf node_conf, now;
    assert_int_equal(dsec_js_stream_get(js, DSEC_TRAJ_STREAM, &node_conf, &err), 0);
    const char *subjects[] = {"dsec.v1.traj.>"};
    dsec_stream_conf op = {.name = DSEC_TRAJ_STREAM,
                           .subjects = subjects,
                           .nsubjects = 1,
                           .max_age_ms = 3600 * 1000,
                           .max_bytes = 64 << 20};
    assert_int_equal(dsec_js_stream_ensure(js, &op, &err), 0);
    /* the log holds the three steps in order */
    dsec_traj *t = NULL;
    assert_int_equal(dsec_traj_open(&t, dsec_cell_bus(live.cell), NULL, &err), 0);
    assert_int_equal(dsec_js_stream_get(js, DSEC_TRAJ_STREAM, &now, &err), 0);
    assert_int_equal(now.max_age_ms, 3600 * 1000);
    assert_int_equal(now.max_bytes, 64 << 20);
    op.max_age_ms = node_conf.max_age_ms, op.max_bytes = node_conf.max_bytes;
    assert_int_equal(dsec_js_stream_ensure(js, &op, &err), 0);
    dsec_js_free(js);
    struct seen s = {0};
    size_t count = 0;
    assert_int_equal(dsec_traj_read(t, rid, collect, &s, &count, &err), 0);
    assert_int_equal(count, 3);
    assert_int_equal(s.steps[0], 1);
    assert_int_equal(s.steps[1], 2);
    assert_int_equal(s.steps[2], 3);
    dsec_traj_record *rec = NULL;
    assert_int_equal(dsec_traj_find(t, rid, 2, &rec, &err), 1);
    assert_string_equal(rec->argv[0], "echo");
    assert_int_equal(rec->stdout_data.len, 4);
    dsec_traj_record_free(rec);
    assert_int_equal(dsec_traj_find(t, rid, 9, &rec, &err), 0);
    dsec_traj_close(t);
}

static void divergence_is_detected(void **state)
{
    start_cell(DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, 0, 0);
    dsec_sandbox_info info;
    dsec_err err;
    assert_int_equal(create_rollout(500, &info, &err), 0);
    char rid[64];
    snprintf(rid, sizeof rid, "ro-%.40s", live.conf.cell);
    static const char *const a1[] = {"echo", "a", NULL};
    static const char *const a2[] = {"echo", "b", NULL};
    dsec_exec_opts x = {.argv = a1, .rollout_id = rid, .step = 1};
    dsec_exec_reply r;
    assert_int_equal(dsec_exec(live.client, info.id, &x, &r, &err), 0);
    dsec_exec_reply_release(&r);
    x.argv = a2;
    assert_int_equal(dsec_exec(live.client, info.id, &x, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_DIVERGED);
    assert_non_null(strstr(err.msg, "divergence"));
    dsec_write_opts w = {.append = true, .rollout_id = rid, .step = 1};
    assert_int_equal(dsec_file_write_ex(live.client, info.id, "/x", "z", 1, &w, &err), -1);
    assert_int_equal(err.code, DSEC_E_DIVERGED);
    /* a rollout id that cannot name a subject is refused before anything runs */
    x.rollout_id = "bad.id";
    x.step = 5;
    assert_int_equal(dsec_exec(live.client, info.id, &x, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
}

/* ---- pausable rollouts ----------------------------------------------------------------- */

static uint64_t node_mem_free(void)
{
    dsec_node_stats st;
    dsec_node_stats_get(dsec_cell_node_at(live.cell, 0), &st);
    return st.mem_free_mb;
}

static void idle_pausable_rollouts_freeze_and_thaw(void **state)
{
    pause_override = true;
    start_cell(DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, 0, 0);
    dsec_sandbox_info a, b, c;
    dsec_err err;
    dsec_create_spec sp = {.type = "sim",
                           .cpu_milli = 100,
                           .memory_mb = 1024,
                           .cls = "rollout",
                           .cell = live.conf.cell,
                           .pausable = true};
    assert_int_equal(dsec_create(live.client, &sp, &a, &err), 0);
    sp.pausable = false;
    assert_int_equal(dsec_create(live.client, &sp, &b, &err), 0);
    msleep(700); /* both idle; no pressure yet (6144 MB free) */
    dsec_sandbox_info st;
    assert_int_equal(dsec_status(live.client, a.id, &st, &err), 0);
    assert_string_equal(st.state, "running");
    /* pressure: free memory drops under 10 % of 8192 */
    sp.memory_mb = 5500;
    assert_int_equal(dsec_create(live.client, &sp, &c, &err), 0);
    assert_int_equal(node_mem_free(), 644);
    for (int i = 0; i < 200 && node_mem_free() != 644 + 1024; i++)
        msleep(10);
    assert_int_equal(node_mem_free(), 644 + 1024); /* a's memory went back to the pool */
    assert_int_equal(dsec_status(live.client, a.id, &st, &err), 0);
    assert_string_equal(st.state, "paused");
    assert_int_equal(dsec_status(live.client, b.id, &st, &err), 0);
    assert_string_equal(st.state, "running"); /* not pausable: never frozen */
    /* the next operation resumes it transparently */
    static const char *const argv[] = {"echo", "back", NULL};
    dsec_exec_opts x = {.argv = argv};
    dsec_exec_reply r;
    assert_int_equal(dsec_exec(live.client, a.id, &x, &r, &err), 0);
    assert_int_equal(r.exit_code, 0);
    assert_memory_equal(r.out, "back\n", 5);
    dsec_exec_reply_release(&r);
    assert_int_equal(dsec_status(live.client, a.id, &st, &err), 0);
    assert_string_equal(st.state, "running");
    assert_int_equal(node_mem_free(), 644);
    /* destroying everything gives back exactly what was taken */
    assert_int_equal(dsec_destroy(live.client, c.id, &err), 0);
    assert_int_equal(dsec_destroy(live.client, a.id, &err), 0);
    assert_int_equal(dsec_destroy(live.client, b.id, &err), 0);
    assert_int_equal(node_mem_free(), 8192);
}

/* ---- configuration ---------------------------------------------------------------------- */

/* The layers section, and the shipped example configs load. */
static void config_layers(void **state)
{
    dsec_cell_conf c;
    dsec_err err;
    dsec_cell_conf_defaults(&c);
    assert_string_equal(c.layers_kind, "local");
    if (dsec_cell_conf_load(&c, DSEC_SOURCE_DIR "/configs/containers.yaml", &err) < 0)
        fail_msg("containers.yaml: %s", err.msg);
    assert_string_equal(c.layers_kind, "local");
    assert_int_equal(c.nnodes, 1);
    assert_string_equal(c.nodes[0].backend, "native");
    assert_string_equal(c.nodes[0].types[1], "container");
    dsec_cell_conf_release(&c);
    dsec_cell_conf_defaults(&c);
    if (dsec_cell_conf_load(&c, DSEC_SOURCE_DIR "/configs/cell-example.yaml", &err) < 0)
        fail_msg("cell-example.yaml: %s", err.msg);
    dsec_cell_conf_release(&c);
    char path[128];
    snprintf(path, sizeof path, "%s/l.yaml", root);
    static const char *const bad[][2] = {
        {"layers:\n  registry: jetstream\n  bucket: LAYERS_A\n  replicas: 3\n", NULL},
        {"layers:\n  registry: s3\n", "\"registry\": \"s3\" is unknown"},
        {"layers:\n  registry: shared\n", "needs \"path\""},
        {"layers:\n  replicas: 9\n", "replicas"},
        {"layers:\n  colour: red\n", "colour"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(bad[i][0], f);
        fclose(f);
        dsec_cell_conf_defaults(&c);
        int rc = dsec_cell_conf_load(&c, path, &err);
        if (bad[i][1] == NULL) {
            assert_int_equal(rc, 0);
            assert_string_equal(c.layers_kind, "jetstream");
            assert_string_equal(c.layers_bucket, "LAYERS_A");
            assert_int_equal(c.layers_replicas, 3);
        } else {
            assert_int_equal(rc, -1);
            if (strstr(err.msg, bad[i][1]) == NULL || strstr(err.msg, "l.yaml:") == NULL)
                fail_msg("%s: error \"%s\" should name %s and the line", bad[i][0], err.msg,
                         bad[i][1]);
        }
        dsec_cell_conf_release(&c);
    }
}

/* The net section: the shipped example loads; bad mirrors and keys are refused with the line. */
static void config_net(void **state)
{
    dsec_cell_conf c;
    dsec_err err;
    dsec_cell_conf_defaults(&c);
    assert_false(c.net.enabled);
    assert_true(c.net.masquerade);
    if (dsec_cell_conf_load(&c, DSEC_SOURCE_DIR "/configs/network.yaml", &err) < 0)
        fail_msg("network.yaml: %s", err.msg);
    assert_true(c.net.enabled);
    assert_int_equal(c.net.nmirrors, 2);
    assert_string_equal(c.net.mirrors[0].name, "pypi");
    assert_int_equal(c.net.mirrors[0].ntargets, 2);
    assert_string_equal(c.net.mirrors[0].targets[1], "files.pythonhosted.org:443/tcp");
    assert_int_equal(c.net.dns_qps, 100);
    assert_int_equal(c.net.dns_cache, 10000);
    assert_int_equal(c.net.warm, 8);
    dsec_cell_conf_release(&c);
    char path[128];
    snprintf(path, sizeof path, "%s/n.yaml", root);
    static const char *const bad[][2] = {
        {"net:\n  enabled: true\n  upstream: [\"10.0.0.2:53\"]\n  tag_base: 7\n  warm: 0\n", NULL},
        {"net:\n  mirrors:\n    pypi: [\"pypi.org:99999\"]\n", "pypi.org:99999"},
        {"net:\n  mirrors:\n    pypi: \"pypi.org\"\n", "net.mirrors.pypi"},
        {"net:\n  tag_base: 300\n", "tag_base"},
        {"net:\n  dns_cache: -1\n", "dns_cache"},
        {"net:\n  colour: red\n", "colour"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(bad[i][0], f);
        fclose(f);
        dsec_cell_conf_defaults(&c);
        int rc = dsec_cell_conf_load(&c, path, &err);
        if (bad[i][1] == NULL) {
            assert_int_equal(rc, 0);
            assert_true(c.net.enabled);
            assert_int_equal(c.net.tag_base, 7);
            assert_int_equal(c.net.warm, UINT32_MAX); /* warm: 0 is none, not the default */
            assert_int_equal(c.net.nupstream, 1);
            assert_string_equal(c.net.upstream[0], "10.0.0.2:53");
        } else {
            assert_int_equal(rc, -1);
            if (strstr(err.msg, bad[i][1]) == NULL || strstr(err.msg, "n.yaml:") == NULL)
                fail_msg("%s: error \"%s\" should name %s and the line", bad[i][0], err.msg,
                         bad[i][1]);
        }
        dsec_cell_conf_release(&c);
    }
}

static void config_keys_for_preemption(void **state)
{
    dsec_cell_conf c;
    dsec_cell_conf_defaults(&c);
    dsec_err err;
    /* the shipped defaults file documents every key and loads */
    if (dsec_cell_conf_load(&c, DSEC_SOURCE_DIR "/configs/local.yaml", &err) < 0)
        fail_msg("local.yaml: %s", err.msg);
    assert_int_equal(c.wait_ms, 30000);
    assert_int_equal(c.arbiter_lease_ms, 3000);
    assert_int_equal(c.traj_retention_s, 604800);
    dsec_cell_conf_release(&c);
    char path[128];
    snprintf(path, sizeof path, "%s/p.yaml", root);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("scheduler:\n  wait_ms: 500\narbiter:\n  lease_ms: 900\n  grace_ms: 1200\n"
          "  max_evictions_per_min: 7\ntrajectory:\n  retention_s: 60\n  max_bytes: 1000000\n",
          f);
    fclose(f);
    dsec_cell_conf_defaults(&c);
    assert_int_equal(dsec_cell_conf_load(&c, path, &err), 0);
    assert_int_equal(c.wait_ms, 500);
    assert_int_equal(c.arbiter_lease_ms, 900);
    assert_int_equal(c.arbiter_grace_ms, 1200);
    assert_int_equal(c.arbiter_max_per_min, 7);
    assert_int_equal(c.traj_retention_s, 60);
    assert_int_equal(c.traj_max_bytes, 1000000);
    dsec_cell_conf_release(&c);
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("arbiter:\n  lease_ms: 10\n", f);
    fclose(f);
    dsec_cell_conf_defaults(&c);
    assert_int_equal(dsec_cell_conf_load(&c, path, &err), -1);
    assert_non_null(strstr(err.msg, "lease_ms"));
    dsec_cell_conf_release(&c);
    int roles = 0;
    assert_int_equal(dsec_cell_roles_parse("scheduler,arbiter", &roles, &err), 0);
    assert_int_equal(roles, DSEC_ROLE_SCHEDULER | DSEC_ROLE_ARBITER);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(config_keys_for_preemption),
        cmocka_unit_test(config_layers),
        cmocka_unit_test(config_net),
        cmocka_unit_test_teardown(job_holdings_reduce_capacity, test_teardown),
        cmocka_unit_test_teardown(cooperative_reclaim_never_a_rollout, test_teardown),
        cmocka_unit_test_teardown(missed_deadline_is_forced, test_teardown),
        cmocka_unit_test_teardown(eviction_rate_is_capped, test_teardown),
        cmocka_unit_test_teardown(rollout_refused_for_room_waits, test_teardown),
        cmocka_unit_test_teardown(refusals_for_room_end_the_wait, test_teardown),
        cmocka_unit_test_teardown(answering_nodes_stay_past_dead_after, test_teardown),
        cmocka_unit_test_teardown(a_refusal_for_room_corrects_the_view, test_teardown),
        cmocka_unit_test_teardown(failover_reclaims_nothing_twice, test_teardown),
        cmocka_unit_test_teardown(fast_forward_runs_once, test_teardown),
        cmocka_unit_test_teardown(divergence_is_detected, test_teardown),
        cmocka_unit_test_teardown(idle_pausable_rollouts_freeze_and_thaw, test_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
