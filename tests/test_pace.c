/* test_pace.c - a client's pace of its creates while shed (dsec/pace.h), on a synthetic clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "dsec/alloc.h"
#include "dsec/pace.h"

#define T0 1000000000ull /* the synthetic clock's start, us */
#define MS 1000ull
#define S 1000000ull
#define FAR (3600ull * S) /* a deadline that never comes near in these tests */
#define MIN_LEFT_US (DSEC_PACE_MIN_LEFT_MS * MS)

/* |got - want| <= want * pct / 100 */
static void assert_near(uint64_t got, uint64_t want, unsigned pct)
{
    uint64_t d = got > want ? got - want : want - got;
    if (d * 100 > want * pct)
        fail_msg("%llu is not within %u%% of %llu", (unsigned long long)got, pct,
                 (unsigned long long)want);
}

/* The answers of the millisecond up to t, spread evenly, the shed ones among the accepted ones;
 * the last is at t (a shed one when any is). */
static void answers_ms(dsec_pace *p, uint64_t t, unsigned accepted, unsigned shed)
{
    unsigned n = accepted + shed;
    for (unsigned i = 0; i < n; i++)
        dsec_pace_answer(p, t - MS + (uint64_t)(i + 1) * MS / n,
                         i * shed / n != (i + 1) * shed / n);
}

/* One second of answers up to T0 + 1 s, `accepted` and `shed` a millisecond; returns T0 + 1 s. */
static uint64_t warm(dsec_pace *p, unsigned accepted, unsigned shed)
{
    for (uint64_t m = 1; m <= 1000; m++)
        answers_ms(p, T0 + m * MS, accepted, shed);
    return T0 + S;
}

/* What dsec_pace_due hands back. */
struct tally {
    uint64_t went, given_up;
};

/* Every held create dsec_pace_due hands back at now; none that goes is too near its deadline. */
static void drain(dsec_pace *p, uint64_t now, struct tally *t)
{
    bool give_up;
    uint64_t next;
    dsec_pace_item *it;
    while ((it = dsec_pace_due(p, now, &give_up, &next)) != NULL) {
        if (give_up) {
            assert_true(now + MIN_LEFT_US >= it->deadline_us);
            t->given_up++;
        } else {
            assert_true(now + MIN_LEFT_US < it->deadline_us);
            t->went++;
        }
    }
    assert_true(next > now); /* when to ask again is never now once it said "none" */
}

/* Admits it until the pace holds it (the bucket's tokens go first); the creates that went
 * before it, which must be few: a burst of BURST_US at most. */
static unsigned hold_first(dsec_pace *p, dsec_pace_item *it, uint64_t now)
{
    unsigned went = 0;
    int rc;
    while ((rc = dsec_pace_admit(p, it, now, false)) == 0)
        assert_true(++went < 1000);
    assert_int_equal(rc, 1);
    return went;
}

static dsec_pace_item *items_new(size_t n, uint64_t deadline_us)
{
    dsec_pace_item *v = dsec_calloc(n, sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++)
        v[i].deadline_us = deadline_us;
    return v;
}

/* A client whose creates are all accepted is never slowed, however many it sends at once. */
static void nothing_paced_without_sheds(void **state)
{
    (void)state;
    dsec_pace *p = dsec_pace_new();
    assert_non_null(p);
    uint64_t now = warm(p, 20, 0);
    dsec_pace_stats st;
    dsec_pace_stats_get(p, now, &st);
    assert_false(st.shed_lately);
    assert_near(st.accepted_per_s, 20000, 5);
    assert_int_equal(st.queued, 0);
    dsec_pace_item *v = items_new(50000, now + FAR);
    for (size_t i = 0; i < 50000; i++)
        assert_int_equal(dsec_pace_admit(p, &v[i], now, false), 0);
    bool give_up;
    uint64_t next;
    assert_null(dsec_pace_due(p, now, &give_up, &next));
    assert_true(next == UINT64_MAX);
    dsec_pace_stats_get(p, now, &st);
    assert_int_equal(st.queued, 0);
    assert_int_equal(st.held, 0);
    assert_int_equal(st.given_up, 0);
    dsec_free(v);
    dsec_pace_free(p);
    dsec_pace_free(NULL);
}

/* While shed, creates go at K/10 times the accepted rate; the rest wait, none is lost. */
static void paced_at_k_times_accepted(void **state)
{
    (void)state;
    dsec_pace *p = dsec_pace_new();
    assert_non_null(p);
    uint64_t now = warm(p, 10, 5);
    enum { PER_MS = 30, MSECS = 1000, OFFERED = PER_MS * MSECS };
    dsec_pace_item *v = items_new(OFFERED, now + FAR);
    struct tally t = {0, 0};
    uint64_t held = 0, refused = 0;
    size_t k = 0;
    for (uint64_t m = 0; m < MSECS; m++) {
        now += MS;
        answers_ms(p, now, 10, 5);
        uint64_t at = now;
        for (int i = 0; i < PER_MS; i++) {
            int rc = dsec_pace_admit(p, &v[k++], at, false);
            if (rc == 0)
                t.went++;
            else if (rc > 0)
                held++;
            else
                refused++;
        }
        drain(p, at, &t);
    }
    assert_near(t.went, 10000ull * DSEC_PACE_K_TENTHS / 10, 10);
    dsec_pace_stats st;
    dsec_pace_stats_get(p, now, &st);
    assert_true(st.shed_lately);
    assert_near(st.accepted_per_s, 10000, 10);
    assert_near(st.send_per_s, 10000ull * DSEC_PACE_K_TENTHS / 10, 10);
    assert_int_equal(refused, 0); /* the deadlines are far */
    assert_int_equal(t.given_up, 0);
    assert_int_equal(st.given_up, 0);
    assert_int_equal(st.held, held);
    assert_int_equal(t.went + st.queued + st.given_up, OFFERED);
    assert_int_equal(dsec_pace_queued(p), st.queued);
    dsec_free(v);
    dsec_pace_free(p);
}

/* Held creates go first come first served, a front one (back from its retry) ahead of them. */
static void fifo_order_and_front(void **state)
{
    (void)state;
    dsec_pace *p = dsec_pace_new();
    assert_non_null(p);
    uint64_t now = warm(p, 1, 1);
    dsec_pace_item *v = items_new(4, now + FAR); /* A, B, C, D */
    hold_first(p, &v[0], now);
    assert_int_equal(dsec_pace_admit(p, &v[1], now, false), 1);
    assert_int_equal(dsec_pace_admit(p, &v[2], now, false), 1);
    assert_int_equal(dsec_pace_admit(p, &v[3], now, true), 1);
    dsec_pace_stats st;
    dsec_pace_stats_get(p, now, &st);
    assert_int_equal(st.queued, 4);
    assert_int_equal(dsec_pace_queued(p), 4);
    assert_int_equal(st.held, 4);
    const dsec_pace_item *want[] = {&v[3], &v[0], &v[1], &v[2]};
    size_t got = 0;
    bool give_up;
    uint64_t next = now;
    for (int m = 0; m < 100 && got < 4; m++, now += MS) {
        dsec_pace_item *it;
        while ((it = dsec_pace_due(p, now, &give_up, &next)) != NULL) {
            assert_false(give_up);
            assert_ptr_equal(it, want[got]);
            assert_null(it->next);
            got++;
        }
    }
    assert_int_equal(got, 4);
    assert_true(next == UINT64_MAX);
    assert_null(dsec_pace_due(p, now, &give_up, &next));
    dsec_pace_stats_get(p, now, &st);
    assert_int_equal(st.queued, 0);
    dsec_free(v);
    dsec_pace_free(p);
}

/* A create whose wait would pass its deadline even at twice the rate now is refused at once;
 * one whose deadline comes too near while it waits is handed back to give up, and is never sent
 * that near its deadline. */
static void gives_up_before_deadline(void **state)
{
    (void)state;
    dsec_pace *p = dsec_pace_new();
    assert_non_null(p);
    uint64_t now = warm(p, 1, 1); /* accepted 1,000/s: held creates go at 1,200/s */
    dsec_pace_stats st;
    dsec_pace_stats_get(p, now, &st);
    assert_true(st.shed_lately);
    assert_near(st.accepted_per_s, 1000, 10);
    assert_near(st.send_per_s, 1000ull * DSEC_PACE_K_TENTHS / 10, 10);
    enum { AHEAD = 120, FRONT = 60 };
    dsec_pace_item *v = items_new(AHEAD + FRONT, now + FAR);
    hold_first(p, &v[0], now);
    for (int i = 1; i < AHEAD; i++)
        assert_int_equal(dsec_pace_admit(p, &v[i], now, false), 1);
    dsec_pace_stats_get(p, now, &st);
    assert_int_equal(st.queued, AHEAD);
    uint64_t wait = (AHEAD + 1) * S / st.send_per_s; /* ~100 ms for the queue ahead to go */

    /* a quarter of the wait it needs, half of what it needs at twice the rate: refused now */
    dsec_pace_item near = {NULL, now + wait / 4 + MIN_LEFT_US};
    assert_int_equal(dsec_pace_admit(p, &near, now, false), -1);
    dsec_pace_stats_get(p, now, &st);
    assert_int_equal(st.given_up, 1);
    assert_int_equal(st.queued, AHEAD);

    /* room for its wait at the rate now: held; then creates back from their retries go ahead
     * of it, so its turn would come after its deadline */
    dsec_pace_item x = {NULL, now + wait + MIN_LEFT_US + 30 * MS};
    assert_int_equal(dsec_pace_admit(p, &x, now, false), 1);
    for (int i = AHEAD; i < AHEAD + FRONT; i++)
        assert_int_equal(dsec_pace_admit(p, &v[i], now, true), 1);

    struct tally t = {0, 0};
    bool seen = false;
    for (int m = 0; m < 1000 && !seen; m++) {
        now += MS;
        answers_ms(p, now, 1, 1);
        bool give_up;
        uint64_t next;
        dsec_pace_item *it;
        while ((it = dsec_pace_due(p, now, &give_up, &next)) != NULL) {
            if (it == &x) {
                assert_true(give_up);
                assert_true(now + MIN_LEFT_US >= x.deadline_us);
                seen = true;
            } else {
                assert_false(give_up); /* theirs are far */
                t.went++;
            }
        }
    }
    assert_true(seen);
    dsec_pace_stats_get(p, now, &st);
    assert_int_equal(st.given_up, 2);
    assert_int_equal(st.held, AHEAD + 1 + FRONT);
    assert_int_equal(t.went + st.queued, AHEAD + FRONT);
    dsec_free(v);
    dsec_pace_free(p);
}

/* Once creates are no longer shed and the held ones have gone, a burst goes at once again; while
 * a shed is recent (DSEC_PACE_HOLD_MS), it is still paced. */
static void stops_pacing(void **state)
{
    (void)state;
    dsec_pace *p = dsec_pace_new();
    assert_non_null(p);
    uint64_t now = warm(p, 10, 5);
    uint64_t last_shed = now; /* the last answer of warm's */
    enum { BURST = 5000 };
    dsec_pace_item *v = items_new(BURST, now + FAR);
    struct tally t = {0, 0};
    uint64_t went_at_once = 0, held = 0;
    /* a burst right after the sheds, and one just before the hold ends, are both paced */
    for (int burst = 0; burst < 2; burst++) {
        if (burst == 1) {
            while (now < last_shed + (DSEC_PACE_HOLD_MS - 50) * MS) {
                now += MS;
                answers_ms(p, now, 10, 0);
                drain(p, now, &t);
            }
        }
        for (size_t i = 0; i < 500; i++) {
            int rc = dsec_pace_admit(p, &v[i], now, false);
            assert_int_not_equal(rc, -1);
            went_at_once += rc == 0;
            held += rc == 1;
        }
        assert_true(held > 0);
        held = 0;
        for (int m = 0; m < 100; m++) {
            now += MS;
            answers_ms(p, now, 10, 0);
            drain(p, now, &t);
        }
    }
    dsec_pace_stats st;
    dsec_pace_stats_get(p, now, &st);
    assert_int_equal(st.queued, 0);
    assert_int_equal(st.given_up, 0);
    assert_int_equal(went_at_once + t.went, 1000);

    while (now < last_shed + (DSEC_PACE_HOLD_MS + 1) * MS) {
        now += MS;
        answers_ms(p, now, 10, 0);
    }
    dsec_pace_stats_get(p, now, &st);
    assert_false(st.shed_lately);
    assert_near(st.accepted_per_s, 10000, 10);
    for (size_t i = 0; i < BURST; i++)
        assert_int_equal(dsec_pace_admit(p, &v[i], now, false), 0);
    dsec_pace_stats_get(p, now, &st);
    assert_int_equal(st.queued, 0);
    dsec_free(v);
    dsec_pace_free(p);
}

/* Held creates left when the sheds stop go at twice the accepted rate, as a TCP window grows. */
static void queue_grows_twice_accepted_without_sheds(void **state)
{
    (void)state;
    dsec_pace *p = dsec_pace_new();
    assert_non_null(p);
    uint64_t now = warm(p, 10, 5);
    uint64_t last_shed = now;
    enum { OFFERED = 20000 };
    dsec_pace_item *v = items_new(OFFERED, now + FAR);
    uint64_t went_at_once = 0;
    for (size_t i = 0; i < OFFERED; i++) {
        int rc = dsec_pace_admit(p, &v[i], now, false);
        assert_int_not_equal(rc, -1);
        went_at_once += rc == 0;
    }
    assert_true(went_at_once < 1000);

    /* the hold: still K/10 times the accepted rate */
    struct tally hold = {0, 0};
    while (now < last_shed + (DSEC_PACE_HOLD_MS + 1) * MS) {
        now += MS;
        answers_ms(p, now, 10, 0);
        drain(p, now, &hold);
    }
    assert_near(hold.went, 10000ull * DSEC_PACE_K_TENTHS / 10 / 2, 15);

    dsec_pace_stats st;
    dsec_pace_stats_get(p, now, &st);
    assert_false(st.shed_lately);
    assert_near(st.accepted_per_s, 10000, 10);
    assert_near(st.send_per_s, 20000, 10);
    uint64_t queued = st.queued;
    assert_true(queued > 12000); /* enough that it does not run dry in the 500 ms measured */

    struct tally after = {0, 0};
    for (int m = 0; m < 500; m++) {
        now += MS;
        answers_ms(p, now, 10, 0);
        drain(p, now, &after);
    }
    assert_near(after.went, 10000, 15);
    assert_int_equal(after.given_up, 0);
    dsec_pace_stats_get(p, now, &st);
    assert_int_equal(st.queued, queued - after.went);
    assert_int_equal(went_at_once + hold.went + after.went + st.queued, OFFERED);
    dsec_free(v);
    dsec_pace_free(p);
}

/* A client that closes gets every held create back exactly once, and the pace is empty after. */
static void take_all_returns_each_once(void **state)
{
    (void)state;
    dsec_pace *p = dsec_pace_new();
    assert_non_null(p);
    uint64_t now = warm(p, 1, 1);
    enum { N = 100 };
    dsec_pace_item *v = items_new(N + 2, now + FAR);
    hold_first(p, &v[0], now);
    for (int i = 1; i < N - 1; i++)
        assert_int_equal(dsec_pace_admit(p, &v[i], now, false), 1);
    assert_int_equal(dsec_pace_admit(p, &v[N - 1], now, true), 1);
    dsec_pace_stats st;
    dsec_pace_stats_get(p, now, &st);
    assert_int_equal(st.queued, N);
    assert_int_equal(dsec_pace_queued(p), N);

    unsigned seen[N] = {0};
    size_t n = 0;
    for (dsec_pace_item *it = dsec_pace_take_all(p); it != NULL; it = it->next) {
        assert_true(it >= v && it < v + N);
        seen[it - v]++;
        assert_true(++n <= N); /* no cycle */
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], 1);
    dsec_pace_stats_get(p, now, &st);
    assert_int_equal(st.queued, 0);
    assert_int_equal(dsec_pace_queued(p), 0);
    assert_int_equal(st.given_up, 0);
    assert_null(dsec_pace_take_all(p));
    bool give_up;
    uint64_t next;
    assert_null(dsec_pace_due(p, now, &give_up, &next));
    assert_true(next == UINT64_MAX);

    /* the queue works after: two held now come back in order, nothing of the old ones */
    hold_first(p, &v[N], now);
    assert_int_equal(dsec_pace_admit(p, &v[N + 1], now, false), 1);
    dsec_pace_item *got[2];
    size_t k = 0;
    for (int m = 0; m < 100 && k < 2; m++, now += MS) {
        dsec_pace_item *it;
        while ((it = dsec_pace_due(p, now, &give_up, &next)) != NULL) {
            assert_true(k < 2);
            got[k++] = it;
        }
    }
    assert_int_equal(k, 2);
    assert_ptr_equal(got[0], &v[N]);
    assert_ptr_equal(got[1], &v[N + 1]);
    dsec_free(v);
    dsec_pace_free(p);
}

/* A cell that accepts nothing and sheds every create: creates are held back, and go at the
 * pace's floor (a cell that accepted nothing is still asked, slowly). */
static void fully_shed_cell_is_paced(void **state)
{
    (void)state;
    dsec_pace *p = dsec_pace_new();
    uint64_t now = warm(p, 0, 5); /* 5,000 sheds/s for 1 s, none accepted */
    dsec_pace_item *v = items_new(1000, now + FAR);
    unsigned held = 0;
    for (int i = 0; i < 1000; i++)
        held += dsec_pace_admit(p, &v[i], now, false) == 1;
    print_message("fully shed: %u of 1000 held\n", held);
    assert_true(held > 900); /* at 50/s only ~1 would go at once */
    dsec_free(v);
    dsec_pace_free(p);
}

/* A queue built while the cell took 1,000/s is not let go all at once when the cell goes on to
 * take nothing at all while it sheds every create. */
static void queue_not_flushed_when_cell_takes_nothing(void **state)
{
    (void)state;
    dsec_pace *p = dsec_pace_new();
    uint64_t now = warm(p, 1, 1);
    dsec_pace_item *v = items_new(3000, now + FAR);
    for (int i = 0; i < 3000; i++)
        dsec_pace_admit(p, &v[i], now, false);
    struct tally t = {0, 0};
    uint64_t worst = 0;
    for (int m = 0; m < 1500; m++) {
        now += MS;
        answers_ms(p, now, 0, 1); /* the cell now sheds everything */
        uint64_t before = t.went;
        drain(p, now, &t);
        if (t.went - before > worst)
            worst = t.went - before;
    }
    print_message("cell took nothing for 1.5 s: %llu went, up to %llu in one ms\n",
                  (unsigned long long)t.went, (unsigned long long)worst);
    assert_true(worst < 100);
    dsec_free(v);
    dsec_pace_free(p);
}

/* A time read a little before the last shed was told (another thread read the clock first and
 * took the lock second; or CLOCK_REALTIME stepped back) still paces a burst. */
static void clock_read_before_a_racing_shed(void **state)
{
    (void)state;
    dsec_pace *p = dsec_pace_new();
    uint64_t now = warm(p, 10, 5); /* the last shed at now */
    dsec_pace_item *v = items_new(5000, now + FAR);
    unsigned went = 0;
    for (int i = 0; i < 5000; i++)
        went += dsec_pace_admit(p, &v[i], now - 1, false) == 0; /* read 1 us before */
    print_message("now_us 1 us before the last shed: %u of 5000 went at once\n", went);
    assert_true(went < 200);
    dsec_free(v);
    dsec_pace_free(p);
}

/* A create back from its retry goes to the front: its wait is one turn, not the queue's, so it
 * is held rather than refused when the queue's wait would pass its deadline. */
static void front_create_not_refused_for_the_queue_behind_it(void **state)
{
    (void)state;
    dsec_pace *p = dsec_pace_new();
    uint64_t now = warm(p, 1, 1); /* held ones go at 1,200/s */
    dsec_pace_item *v = items_new(1200, now + FAR);
    hold_first(p, &v[0], now);
    for (int i = 1; i < 1200; i++)
        dsec_pace_admit(p, &v[i], now, false);    /* ~1 s of queue */
    dsec_pace_item back = {NULL, now + 200 * MS}; /* 200 ms left: its turn is ~1 ms away */
    int rc = dsec_pace_admit(p, &back, now, true);
    print_message("front create with 200 ms left, 1,200 queued behind: admit %d\n", rc);
    assert_int_equal(rc, 1);
    dsec_pace_take_all(p);
    dsec_free(v);
    dsec_pace_free(p);
}

/* stats.send_per_s reads 0 when nothing is paced. */
static void stats_send_per_s_zero_when_not_paced(void **state)
{
    (void)state;
    dsec_pace *p = dsec_pace_new();
    uint64_t now = warm(p, 20, 0);
    dsec_pace_item it = {NULL, now + FAR};
    assert_int_equal(dsec_pace_admit(p, &it, now, false), 0);
    dsec_pace_stats st;
    dsec_pace_stats_get(p, now, &st);
    print_message("never shed, nothing queued: send_per_s %llu\n",
                  (unsigned long long)st.send_per_s);
    assert_int_equal(st.send_per_s, 0);
    dsec_pace_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nothing_paced_without_sheds),
        cmocka_unit_test(paced_at_k_times_accepted),
        cmocka_unit_test(fifo_order_and_front),
        cmocka_unit_test(gives_up_before_deadline),
        cmocka_unit_test(stops_pacing),
        cmocka_unit_test(queue_grows_twice_accepted_without_sheds),
        cmocka_unit_test(take_all_returns_each_once),
        cmocka_unit_test(fully_shed_cell_is_paced),
        cmocka_unit_test(queue_not_flushed_when_cell_takes_nothing),
        cmocka_unit_test(clock_read_before_a_racing_shed),
        cmocka_unit_test(front_create_not_refused_for_the_queue_behind_it),
        cmocka_unit_test(stats_send_per_s_zero_when_not_paced),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
