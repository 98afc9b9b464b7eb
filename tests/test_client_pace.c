/* test_client_pace.c - libdsec paces its creates while the cell sheds them, end to end. */
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

#include <cmocka.h>

#include "actors/wire.h"
#include "codecs/msg.h"
#include "codecs/subjects.h"
#include "dsec/client.h"
#include "tests/fixture.h"

static dsec_natsd *natsd;
static char root[64];

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

/* ---- a scheduler the test plays ---------------------------------------------------------- */

/* It places ACCEPT_PER_S creates a second (answers "created" with a made-up sandbox) and sheds
 * the rest with "overloaded", retry_after_ms RETRY_MS, as a replica with a full window does.
 * It counts every attempt it is sent, and the attempts of each req_id. */
#define ACCEPT_PER_S 300
#define RETRY_MS 50
#define OFFERED 3000
#define OFFER_PER_S 1500
#define TIMEOUT_MS 3000

struct fake_sched {
    dsec_bus *bus;
    dsec_actor *a;
    pthread_mutex_t mu;
    uint64_t t0_ms, accepted, attempts, shed, placed_twice;
    char placed[OFFERED + 64][40]; /* req_ids answered "created", in order */
};

static bool placed_before(struct fake_sched *f, const char *rid)
{
    for (uint64_t i = 0; i < f->accepted; i++)
        if (strcmp(f->placed[i], rid) == 0)
            return true;
    return false;
}

static void fake_on_create(dsec_actor *a, dsec_msg *m, void *ud)
{
    struct fake_sched *f = ud;
    dsec_msg_create c;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CREATE, dsec_msg_data(m), dsec_msg_len(m), &c,
                    &err) < 0)
        return;
    pthread_mutex_lock(&f->mu);
    f->attempts++;
    uint64_t now = mono_ms();
    if (f->t0_ms == 0)
        f->t0_ms = now;
    /* a token bucket: ACCEPT_PER_S since the first create, 10 at once at most */
    uint64_t allowed = (now - f->t0_ms) * ACCEPT_PER_S / 1000 + 10;
    bool accept = f->accepted < allowed && f->accepted < OFFERED + 64;
    if (accept) {
        if (c.req_id != NULL && placed_before(f, c.req_id))
            f->placed_twice++;
        snprintf(f->placed[f->accepted], sizeof f->placed[0], "%s",
                 c.req_id != NULL ? c.req_id : "");
        f->accepted++;
    } else {
        f->shed++;
    }
    uint64_t n = f->accepted;
    pthread_mutex_unlock(&f->mu);
    if (accept) {
        char id[64];
        snprintf(id, sizeof id, "pace-n-%016" PRIx64, n);
        dsec_msg_created cr = {
            .id = id, .node = "pace-n", .type = "sim", .state = "running", .req_id = c.req_id};
        dsec_wire_reply(a, m, DSEC_MSG_CREATED, &cr, &err);
    } else {
        dsec_msg_error e = {.code = "overloaded",
                            .message = "the test's scheduler sheds past its rate",
                            .retry_safe = true,
                            .req_id = c.req_id,
                            .retry_after_ms = RETRY_MS};
        dsec_wire_reply(a, m, DSEC_MSG_ERROR, &e, &err);
    }
}

static int fake_start(struct fake_sched *f)
{
    dsec_err err;
    dsec_bus_opts bo = {.url = dsec_natsd_url(natsd), .name = "pace-sched", .threads = 2};
    char subj[128];
    snprintf(subj, sizeof subj, DSEC_SUBJ_CREATE, "t");
    pthread_mutex_init(&f->mu, NULL);
    if (dsec_bus_connect(&f->bus, &bo, &err) < 0 ||
        dsec_actor_new(&f->a, f->bus, "sched", &err) < 0 ||
        dsec_actor_on(f->a, subj, NULL, fake_on_create, f, &err) < 0 ||
        dsec_bus_flush(f->bus, 2000, &err) < 0) {
        fprintf(stderr, "the test's scheduler: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static void fake_stop(struct fake_sched *f)
{
    dsec_actor_free(f->a);
    dsec_bus_free(f->bus);
    pthread_mutex_destroy(&f->mu);
}

/* ---- the client's side -------------------------------------------------------------------- */

struct offered {
    _Atomic int done, ok, overloaded, paced_out, other, late, twice;
    uint64_t sent_ms[OFFERED];
    _Atomic bool answered[OFFERED];
    char other_msg[DSEC_ERR_MSG_MAX];
};

struct one {
    struct offered *o;
    int i;
};

static void on_answer(int status, const dsec_sandbox_info *info, const dsec_err *err, void *ud)
{
    (void)info;
    struct one *one = ud;
    struct offered *o = one->o;
    if (atomic_exchange(&o->answered[one->i], true))
        atomic_fetch_add(&o->twice, 1);
    if (mono_ms() - o->sent_ms[one->i] > TIMEOUT_MS + 50) /* past its deadline (+ a tick) */
        atomic_fetch_add(&o->late, 1);
    if (status == 0) {
        atomic_fetch_add(&o->ok, 1);
    } else if (err->code == DSEC_E_OVERLOADED) {
        atomic_fetch_add(&o->overloaded, 1);
        if (strstr(err->msg, "pace") != NULL && err->retry_after_ms > 0)
            atomic_fetch_add(&o->paced_out, 1);
    } else {
        snprintf(o->other_msg, sizeof o->other_msg, "%s: %.900s", dsec_code_name(err->code),
                 err->msg);
        atomic_fetch_add(&o->other, 1);
    }
    atomic_fetch_add(&o->done, 1);
}

/* A client of the test's cell, that retries (and so paces) as libdsec's default does. */
static dsec_client *client_new(void)
{
    dsec_client *c = NULL;
    dsec_err err;
    dsec_client_opts co = {
        .url = dsec_natsd_url(natsd), .tenant = "t", .timeout_ms = TIMEOUT_MS, .retries = 2};
    if (dsec_client_connect(&c, &co, &err) < 0)
        fail_msg("client: %s", err.msg);
    return c;
}

/* Offered 5x what the cell places for 2 s, with 3 s deadlines: without a pace libdsec would
 * send each shed create again every 50-75 ms until its deadline, some 40 attempts per create
 * and 100,000 in all, each one costing the cell a decode and an answer. With it, once the
 * sheds have been seen for 200 ms the client sends about 1.2x what the cell accepts and holds
 * the rest back, so the attempts stay within twice the creates. And still: every create is
 * answered once, before its deadline, "created" or "overloaded" (the pace's own answers say
 * so and carry a retry_after_ms); none is placed twice; and the cell places about all it
 * can. */
static void shed_creates_are_paced(void **state)
{
    (void)state;
    static struct fake_sched f;
    memset(&f, 0, sizeof f);
    assert_int_equal(fake_start(&f), 0);
    dsec_client *c = client_new();
    dsec_err err;
    static struct offered o;
    static struct one ones[OFFERED];
    memset(&o, 0, sizeof o);
    dsec_create_spec s = {.type = "sim", .cpu_milli = 1, .memory_mb = 1, .cls = "job"};
    uint64_t t0 = mono_ms();
    int refused = 0;
    for (int i = 0; i < OFFERED; i++) {
        uint64_t due = t0 + (uint64_t)i * 1000 / OFFER_PER_S;
        while (mono_ms() < due)
            msleep(1);
        ones[i] = (struct one){&o, i};
        o.sent_ms[i] = mono_ms();
        if (dsec_create_async(c, &s, on_answer, &ones[i], &err) < 0) {
            /* the pace's answer at once: this create's turn would come after its deadline */
            assert_int_equal(err.code, DSEC_E_OVERLOADED);
            assert_non_null(strstr(err.msg, "pace"));
            assert_true(err.retry_after_ms > 0);
            atomic_store(&o.answered[i], true);
            refused++;
        }
    }
    for (int i = 0; i < 600 && atomic_load(&o.done) + refused < OFFERED; i++)
        msleep(10);
    pthread_mutex_lock(&f.mu);
    uint64_t attempts = f.attempts, accepted = f.accepted, shed = f.shed, twice = f.placed_twice;
    pthread_mutex_unlock(&f.mu);
    print_message("offered %d over %" PRIu64 " ms: %d created, %d overloaded (%d by the pace), "
                  "%d refused at once by the pace; the cell saw %" PRIu64 " attempts (%" PRIu64
                  " accepted, %" PRIu64 " shed)\n",
                  OFFERED, mono_ms() - t0, atomic_load(&o.ok), atomic_load(&o.overloaded),
                  atomic_load(&o.paced_out), refused, attempts, accepted, shed);
    if (atomic_load(&o.other) > 0)
        fail_msg("%d creates failed otherwise: %s", atomic_load(&o.other), o.other_msg);
    assert_int_equal(atomic_load(&o.done) + refused, OFFERED);
    assert_int_equal(atomic_load(&o.twice), 0);
    assert_int_equal(atomic_load(&o.late), 0);
    assert_int_equal(atomic_load(&o.ok) + atomic_load(&o.overloaded) + refused, OFFERED);
    assert_int_equal((uint64_t)atomic_load(&o.ok), accepted);
    assert_int_equal(twice, 0);
    /* the retries did not amplify */
    assert_true(attempts <= 2 * OFFERED);
    /* and the cell was kept busy: it placed most of what its rate allowed over the run */
    assert_true(accepted >= (uint64_t)ACCEPT_PER_S * 3);
    assert_true(atomic_load(&o.paced_out) + refused > 0);
    dsec_client_free(c);
    fake_stop(&f);
}

/* Never shed, never paced: a burst faster than any pace would allow is sent at once. */
static void unshed_burst_goes_at_once(void **state)
{
    (void)state;
    static struct fake_sched f;
    memset(&f, 0, sizeof f);
    f.t0_ms = mono_ms() - 3600 * 1000; /* an hour of room: accepts every create */
    assert_int_equal(fake_start(&f), 0);
    dsec_client *c = client_new();
    dsec_err err;
    static struct offered o;
    static struct one ones[OFFERED];
    memset(&o, 0, sizeof o);
    dsec_create_spec s = {.type = "sim", .cpu_milli = 1, .memory_mb = 1, .cls = "job"};
    for (int i = 0; i < 1000; i++) {
        ones[i] = (struct one){&o, i};
        o.sent_ms[i] = mono_ms();
        assert_int_equal(dsec_create_async(c, &s, on_answer, &ones[i], &err), 0);
    }
    for (int i = 0; i < 500 && atomic_load(&o.done) < 1000; i++)
        msleep(10);
    assert_int_equal(atomic_load(&o.ok), 1000);
    pthread_mutex_lock(&f.mu);
    assert_int_equal(f.attempts, 1000);
    assert_int_equal(f.shed, 0);
    pthread_mutex_unlock(&f.mu);
    dsec_client_free(c);
    fake_stop(&f);
}

static int group_setup(void **state)
{
    (void)state;
    return dsec_test_server_start("dsec-pace", false, &natsd, root, sizeof root);
}

static int group_teardown(void **state)
{
    (void)state;
    return dsec_test_server_stop(natsd, root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(unshed_burst_goes_at_once),
        cmocka_unit_test(shed_creates_are_paced),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
