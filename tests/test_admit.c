/* test_admit.c - admission by delay (actors/admit.c): node echoes of placement stamps set the rate
 * a scheduler replica lets creates in; driven on a synthetic clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "actors/admit.h"

/* The cell as a queue: nodes that take cap_per_s placements (FIFO), a trip of trip_us to
 * them. run() offers creates at offer_per_s for dur_us in 1 ms steps, each taken or shed by
 * the controller; every 10 ms each of 16 nodes echoes the placement it took last (its wait
 * is the backlog ahead of it) and how many it took. */
struct sim {
    dsec_admit *a;
    uint64_t now_us, trip_us;
    double cap_per_s, backlog, taken;
    uint64_t wait_us; /* the last echoed placement's wait in the backlog */
};

static uint64_t run(struct sim *s, uint64_t dur_us, double offer_per_s)
{
    uint64_t end = s->now_us + dur_us, in = 0;
    double owed = 0;
    while (s->now_us < end) {
        s->now_us += 1000;
        owed += offer_per_s / 1000.0;
        for (; owed >= 1; owed -= 1)
            if (dsec_admit_take(s->a, s->now_us)) {
                in++;
                s->backlog += 1;
            }
        double done = s->backlog < s->cap_per_s / 1000 ? s->backlog : s->cap_per_s / 1000;
        s->backlog -= done;
        s->taken += done;
        if (s->now_us % 10000 == 0) {
            s->wait_us = (uint64_t)(s->backlog / s->cap_per_s * 1e6);
            uint64_t per = (uint64_t)s->taken / 16;
            for (int n = 0; n < 16; n++)
                dsec_admit_echo(s->a, s->now_us - s->trip_us - s->wait_us, 0, per, s->now_us);
            s->taken -= (double)(per * 16);
        }
    }
    return in;
}

/* target 0: the controller never sheds, and the backlog grows as it may. */
static void off_never_sheds(void **state)
{
    (void)state;
    struct sim s = {.a = dsec_admit_new(0), .now_us = 1000000, .trip_us = 2000, .cap_per_s = 4000};
    assert_non_null(s.a);
    assert_int_equal(run(&s, 3000000, 8000), 24000);
    assert_true(s.wait_us > 2000000); /* 3 s of twice the rate: 3 s of work waits */
    dsec_admit_stats st;
    dsec_admit_stats_get(s.a, &st);
    assert_int_equal(st.limit_per_s, 0);
    assert_int_equal(st.cuts, 0);
    assert_int_equal(st.late, 0);
    assert_true(st.echoes > 0);         /* still measured */
    assert_true(st.delay_us > 1000000); /* the backlog's wait, seen */
    dsec_admit_free(s.a);
}

/* Below what the nodes take, every create is let in and no limit is ever set. */
static void on_time_lets_all_in(void **state)
{
    (void)state;
    struct sim s = {.a = dsec_admit_new(50), .now_us = 1000000, .trip_us = 2000, .cap_per_s = 4000};
    assert_int_equal(run(&s, 3000000, 3000), 9000);
    dsec_admit_stats st;
    dsec_admit_stats_get(s.a, &st);
    assert_int_equal(st.limit_per_s, 0);
    assert_int_equal(st.late, 0);
    assert_true(st.echoes > 4000);
    dsec_admit_free(s.a);
}

/* Offered twice what the nodes take: a limit near their rate is set, the rest is shed, and
 * placements stay near the target instead of waiting seconds; when the load falls below the
 * nodes' rate, the limit goes. */
static void overload_limited_near_what_nodes_take(void **state)
{
    (void)state;
    struct sim s = {.a = dsec_admit_new(50), .now_us = 1000000, .trip_us = 2000, .cap_per_s = 4000};
    run(&s, 1000000, 2000); /* on time: the base delay is learnt */
    uint64_t in = run(&s, 5000000, 8000);
    dsec_admit_stats st;
    dsec_admit_stats_get(s.a, &st);
    print_message("overload: let in %llu of 40000 (the nodes take 20000), limit %llu/s, wait "
                  "%llu ms, %llu cuts, retry after %u ms\n",
                  (unsigned long long)in, (unsigned long long)st.limit_per_s,
                  (unsigned long long)s.wait_us / 1000, (unsigned long long)st.cuts,
                  st.retry_after_ms);
    assert_true(st.cuts >= 1);
    assert_true(st.limit_per_s > 0 && st.limit_per_s < 8000);
    assert_true(in >= 14000); /* at least 70% of what the nodes could take */
    assert_true(in <= 24000);
    assert_true(s.wait_us < 300000);
    assert_true(st.retry_after_ms >= 20 && st.retry_after_ms <= 5000);
    /* the load falls below the nodes' rate: within seconds nothing is shed, no limit */
    run(&s, 4000000, 2000);
    dsec_admit_stats_get(s.a, &st);
    assert_int_equal(st.limit_per_s, 0);
    assert_int_equal(run(&s, 1000000, 2000), 2000);
    dsec_admit_free(s.a);
}

/* Placements that always take 300 ms to arrive (a slow or distant host) are not late: only
 * delay past the least one seen counts. */
static void constant_delay_is_not_late(void **state)
{
    (void)state;
    struct sim s = {
        .a = dsec_admit_new(50), .now_us = 1000000, .trip_us = 300000, .cap_per_s = 4000};
    assert_int_equal(run(&s, 4000000, 3000), 12000);
    dsec_admit_stats st;
    dsec_admit_stats_get(s.a, &st);
    assert_int_equal(st.cuts, 0);
    assert_int_equal(st.limit_per_s, 0);
    dsec_admit_free(s.a);
}

/* Echoes that are not this clock's (0, or from the future) are ignored. */
static void foreign_stamps_ignored(void **state)
{
    (void)state;
    dsec_admit *a = dsec_admit_new(50);
    for (int i = 0; i < 100; i++) {
        dsec_admit_echo(a, 0, 0, 10, 5000000);
        dsec_admit_echo(a, 9000000, 0, 10, 5000000);
    }
    dsec_admit_stats st;
    dsec_admit_stats_get(a, &st);
    assert_int_equal(st.echoes, 0);
    dsec_admit_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(off_never_sheds),
        cmocka_unit_test(on_time_lets_all_in),
        cmocka_unit_test(overload_limited_near_what_nodes_take),
        cmocka_unit_test(constant_delay_is_not_late),
        cmocka_unit_test(foreign_stamps_ignored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
