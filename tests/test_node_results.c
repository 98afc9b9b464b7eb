/* test_node_results.c - kept command answers: by req_id, bounded, and read back after a restart. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/node-results.h"

static char dir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/dsec-results-XXXXXX");
    return mkdtemp(dir) != NULL ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const uint8_t H1[32] = {1}, H2[32] = {2};

static dsec_results *open_at(uint64_t budget, uint64_t ttl_ms, bool (*keep)(const char *, void *),
                             int want_loaded)
{
    dsec_results *r = NULL;
    dsec_err err;
    char d[300];
    snprintf(d, sizeof d, "%s/results", dir);
    if (dsec_results_new(&r, budget, ttl_ms, d, &err) < 0)
        fail_msg("%s", err.msg);
    int n = dsec_results_load(r, keep, NULL, &err);
    if (n < 0)
        fail_msg("%s", err.msg);
    assert_int_equal(n, want_loaded);
    return r;
}

static bool keep_all(const char *sbx, void *ud)
{
    (void)sbx, (void)ud;
    return true;
}

static bool keep_a(const char *sbx, void *ud)
{
    (void)ud;
    return strcmp(sbx, "n-a") == 0;
}

static void put(dsec_results *r, const char *sbx, const char *req, const uint8_t *h,
                const char *out)
{
    dsec_msg_exec_result res = {.id = sbx,
                                .exit_code = 3,
                                .signal = 0,
                                .stdout_data = {(const uint8_t *)out, strlen(out)},
                                .stderr_data = {(const uint8_t *)"e", 1},
                                .duration_us = 1234,
                                .timed_out = true};
    dsec_results_begin(r, sbx, req, h);
    dsec_results_put(r, sbx, req, h, &res);
}

static int get(dsec_results *r, const char *sbx, const char *req, char *out, size_t len)
{
    dsec_msg_exec_result res;
    uint8_t h[32];
    void *hold;
    int what = dsec_results_get(r, sbx, req, &res, h, &hold);
    if (what == DSEC_RESULTS_ANSWER)
        snprintf(out, len, "%.*s|%d|%d", (int)res.stdout_data.len,
                 (const char *)res.stdout_data.ptr, (int)res.exit_code, res.timed_out);
    dsec_results_release(hold);
    return what;
}

/* An answer and a command that was running outlive the process: the answer whole, the
 * running one as lost, and lost it stays after one more restart. */
static void answers_and_lost_commands_outlive_a_restart(void **state)
{
    (void)state;
    dsec_results *r = open_at(1 << 20, 60000, keep_all, 0);
    char out[64];
    put(r, "n-a", "req-1", H1, "hello");
    dsec_results_begin(r, "n-a", "req/2 odd", H2); /* it runs when the process goes */
    dsec_results_begin(r, "n-a", "req-3", H1);
    dsec_results_abandon(r, "n-a", "req-3"); /* refused: a retry may run it */
    assert_int_equal(get(r, "n-a", "req-1", out, sizeof out), DSEC_RESULTS_ANSWER);
    assert_int_equal(get(r, "n-a", "req/2 odd", out, sizeof out), DSEC_RESULTS_NONE);
    dsec_results_free(r);

    r = open_at(1 << 20, 60000, keep_all, 2);
    assert_int_equal(get(r, "n-a", "req-1", out, sizeof out), DSEC_RESULTS_ANSWER);
    assert_string_equal(out, "hello|3|1");
    assert_int_equal(get(r, "n-a", "req/2 odd", out, sizeof out), DSEC_RESULTS_LOST);
    assert_int_equal(get(r, "n-a", "req-3", out, sizeof out), DSEC_RESULTS_NONE);
    dsec_results_stats st;
    dsec_results_stats_get(r, &st);
    assert_int_equal(st.lost, 1);
    assert_int_equal(st.loaded, 2);
    dsec_results_free(r);

    r = open_at(1 << 20, 60000, keep_all, 2);
    assert_int_equal(get(r, "n-a", "req/2 odd", out, sizeof out), DSEC_RESULTS_LOST);
    /* a destroyed sandbox's answers go, from memory and from the log */
    dsec_results_drop(r, "n-a");
    assert_int_equal(get(r, "n-a", "req-1", out, sizeof out), DSEC_RESULTS_NONE);
    dsec_results_free(r);
    r = open_at(1 << 20, 60000, keep_all, 0);
    dsec_results_free(r);
}

/* At start: a sandbox no longer here loses its answers; the TTL counts from when the command
 * finished, across the restart; the budget drops the oldest first. */
static void load_keeps_ttl_budget_and_sandboxes(void **state)
{
    (void)state;
    dsec_results *r = open_at(1 << 20, 60000, keep_all, 0);
    char out[64], big[2048];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    put(r, "n-a", "old", H1, big);
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
    put(r, "n-a", "new", H1, big);
    put(r, "n-b", "gone-with-b", H1, "b");
    dsec_results_free(r);

    /* room for one of the two big ones: the newer stays; n-b is not here any more */
    r = open_at(3500, 60000, keep_a, 1);
    assert_int_equal(get(r, "n-a", "new", out, sizeof out), DSEC_RESULTS_ANSWER);
    assert_int_equal(get(r, "n-a", "old", out, sizeof out), DSEC_RESULTS_NONE);
    assert_int_equal(get(r, "n-b", "gone-with-b", out, sizeof out), DSEC_RESULTS_NONE);
    dsec_results_free(r);
    r = open_at(1 << 20, 60000, keep_all, 1); /* and what was dropped left the log */
    dsec_results_drop(r, "n-a");
    dsec_results_free(r);

    /* 300 ms after it finished, a 200 ms TTL is over, though no process kept counting */
    r = open_at(1 << 20, 200, keep_all, 0);
    put(r, "n-a", "brief", H1, "b");
    dsec_results_free(r);
    ts.tv_nsec = 300 * 1000000L;
    nanosleep(&ts, NULL);
    r = open_at(1 << 20, 200, keep_all, 0);
    assert_int_equal(get(r, "n-a", "brief", out, sizeof out), DSEC_RESULTS_NONE);
    dsec_results_free(r);
}

/* A record torn by a crash mid-append ends the log: what came before is read, the rest is
 * cut, and appends go on after it. */
static void torn_tail_is_cut(void **state)
{
    (void)state;
    dsec_results *r = open_at(1 << 20, 60000, keep_all, 0);
    put(r, "n-a", "ok", H1, "fine");
    put(r, "n-a", "torn", H2, "this answer is cut short by a crash");
    dsec_results_free(r);
    char p[400];
    snprintf(p, sizeof p, "%s/results/answers.log", dir);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(truncate(p, st.st_size - 10), 0);
    r = open_at(1 << 20, 60000, keep_all, 2);
    char out[64];
    assert_int_equal(get(r, "n-a", "ok", out, sizeof out), DSEC_RESULTS_ANSWER);
    assert_string_equal(out, "fine|3|1");
    /* its start is whole: the command is lost, not missing (it may have run) */
    assert_int_equal(get(r, "n-a", "torn", out, sizeof out), DSEC_RESULTS_LOST);
    put(r, "n-a", "after", H1, "later");
    dsec_results_free(r);
    r = open_at(1 << 20, 60000, keep_all, 3);
    assert_int_equal(get(r, "n-a", "after", out, sizeof out), DSEC_RESULTS_ANSWER);
    assert_string_equal(out, "later|3|1");
    dsec_results_free(r);
}

/* Answers keep coming while the log is rewritten (past 3 * budget of appends, on its own
 * thread): the log stays bounded, and what the table holds is what a restart reads back. */
static void log_rewritten_while_answers_come(void **state)
{
    (void)state;
    enum { N = 3000 };
    dsec_results *r = open_at(64 << 10, 60000, keep_all, 0);
    char big[1024], req[32], out[1100];
    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    for (int i = 0; i < N; i++) {
        snprintf(req, sizeof req, "r-%d", i);
        put(r, i % 2 ? "n-a" : "n-b", req, H1, big);
        if (i % 7 == 0)
            dsec_results_drop(r, "n-c"); /* records of another kind between them */
    }
    dsec_results_stats st;
    dsec_results_stats_get(r, &st);
    assert_int_equal(st.persist_errors, 0);
    uint64_t held = st.entries;
    assert_true(held > 10);
    dsec_results_free(r); /* waits for a rewrite under way */
    r = open_at(64 << 10, 60000, keep_all, (int)held);
    /* read back, it holds what is kept and nothing else (the 4 MB appended are gone) */
    char p[400];
    struct stat fs;
    snprintf(p, sizeof p, "%s/results/answers.log", dir);
    assert_int_equal(stat(p, &fs), 0);
    assert_true(fs.st_size < (96 << 10));
    snprintf(req, sizeof req, "r-%d", N - 1);
    assert_int_equal(get(r, "n-a", req, out, sizeof out), DSEC_RESULTS_ANSWER);
    assert_int_equal(get(r, "n-b", "r-0", out, sizeof out), DSEC_RESULTS_NONE);
    dsec_results_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(answers_and_lost_commands_outlive_a_restart, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(load_keeps_ttl_budget_and_sandboxes, setup, teardown),
        cmocka_unit_test_setup_teardown(torn_tail_is_cut, setup, teardown),
        cmocka_unit_test_setup_teardown(log_rewritten_while_answers_come, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
