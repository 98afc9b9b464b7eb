/* test_client_batch.c - dsec_cq_create_batch on a real nats-server and cell: each create's answer
 * under its own token, per-create failures in a batch, bad arguments. */
#include <inttypes.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "actors/cell.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tests/fixture.h"

static dsec_natsd *natsd;
static char root[64];

/* What a test started, stopped by the teardown even when an assertion failed. */
static struct {
    dsec_cell *cell;
    dsec_cell_conf conf;
    bool conf_set;
    dsec_client *client;
    dsec_cq *q;
} live;

static int group_setup(void **state)
{
    return dsec_test_server_start("dsec-client-batch", false, &natsd, root, sizeof root);
}

static int group_teardown(void **state)
{
    return dsec_test_server_stop(natsd, root);
}

static int test_teardown(void **state)
{
    dsec_client_free(live.client); /* answers every pending create into the queue */
    dsec_cq_free(live.q);
    dsec_cell_stop(live.cell, true);
    if (live.conf_set)
        dsec_cell_conf_release(&live.conf);
    memset(&live, 0, sizeof live);
    return 0;
}

/* A cell named name with one sim node of slots slots, and a client of tenant name. */
static void start_cell(const char *name, uint64_t slots)
{
    dsec_cell_conf *c = &live.conf;
    dsec_err err;
    dsec_cell_conf_defaults(c);
    live.conf_set = true;
    snprintf(c->cell, sizeof c->cell, "%s", name);
    snprintf(c->url, sizeof c->url, "%s", dsec_natsd_url(natsd));
    snprintf(c->state_dir, sizeof c->state_dir, "%s/%s", root, name);
    c->capacity_ms = 20;
    c->heartbeat_ms = 100;
    static const char *const types[] = {"sim", NULL};
    assert_int_equal(
        dsec_cell_conf_add_sim_nodes(c, name, 1, 64000, 65536, slots, types, "0", &err), 0);
    if (dsec_cell_start(&live.cell, c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        fail_msg("cell %s: %s", name, err.msg);
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = name, .timeout_ms = 5000};
    if (dsec_client_connect(&live.client, &o, &err) < 0)
        fail_msg("client: %s", err.msg);
    if (dsec_cq_new(&live.q, &err) < 0)
        fail_msg("cq: %s", err.msg);
}

/* Collect n events from q (waiting on its fd), at most 20 s; each into ev[]. */
static void collect(dsec_cq *q, dsec_cq_event *ev, size_t n)
{
    size_t got = 0;
    for (int waited = 0; got < n; waited += 100) {
        if (waited > 20000)
            fail_msg("only %zu of %zu answers after 20 s", got, n);
        struct pollfd p = {.fd = dsec_cq_fd(q), .events = POLLIN};
        if (poll(&p, 1, 100) == 1)
            got += dsec_cq_poll(q, ev + got, n - got);
    }
    dsec_cq_event extra;
    assert_int_equal(dsec_cq_poll(q, &extra, 1), 0); /* exactly one answer per create */
}

static const dsec_cq_event *by_token(const dsec_cq_event *ev, size_t n, uint64_t token)
{
    const dsec_cq_event *found = NULL;
    for (size_t i = 0; i < n; i++)
        if (ev[i].token == token) {
            if (found != NULL)
                fail_msg("token %" PRIu64 " answered twice", token);
            found = &ev[i];
        }
    if (found == NULL)
        fail_msg("token %" PRIu64 " never answered", token);
    return found;
}

#define NB 24

/* Each create's answer comes under its own token: the request ids given in
 * the batch name the sandboxes its events report (a blocking create with the
 * same request id finds the same sandbox). */
static void batch_answers_each_create_under_its_token(void **state)
{
    start_cell("cb1", 100);
    char rid[NB][32], lab[NB][32];
    const char *labels[NB][2];
    dsec_create_spec spec[NB];
    const dsec_create_spec *specs[NB];
    uint64_t tokens[NB];
    for (int i = 0; i < NB; i++) {
        snprintf(rid[i], sizeof rid[i], "batch-req-%d", i);
        snprintf(lab[i], sizeof lab[i], "i=%d", i);
        labels[i][0] = lab[i];
        labels[i][1] = NULL;
        spec[i] = (dsec_create_spec){
            .type = "sim", .req_id = rid[i], .labels = labels[i], .memory_mb = 1};
        specs[i] = &spec[i];
        tokens[i] = 7000 + (uint64_t)(NB - i) * 3; /* not in send order */
    }
    dsec_err err;
    assert_int_equal(dsec_cq_create_batch(live.q, live.client, specs, tokens, NB, &err), 0);
    dsec_cq_event ev[NB];
    collect(live.q, ev, NB);
    for (int i = 0; i < NB; i++) {
        const dsec_cq_event *e = by_token(ev, NB, tokens[i]);
        if (e->status != 0)
            fail_msg("create %d: %s", i, e->err.msg);
        assert_string_equal(e->info.type, "sim");
        assert_false(e->info.existing);
        for (int j = 0; j < i; j++) /* a sandbox each */
            assert_string_not_equal(by_token(ev, NB, tokens[j])->info.id, e->info.id);
        dsec_sandbox_info again;
        dsec_create_spec same = spec[i];
        if (dsec_create(live.client, &same, &again, &err) < 0)
            fail_msg("create again %d: %s", i, err.msg);
        assert_true(again.existing);
        assert_string_equal(again.id, e->info.id); /* token i's event is request i's sandbox */
    }
}

/* Bad specs in a batch fail alone, each with its own error under its token;
 * the good ones around them are created. */
static void batch_failures_are_per_create(void **state)
{
    start_cell("cb2", 100);
    static const char *const bad_labels[] = {"no-equals-sign", NULL};
    dsec_create_spec ok = {.type = "sim", .memory_mb = 1};
    dsec_create_spec bad_project = {.type = "sim", .project = "not a project!"};
    dsec_create_spec bad_label = {.type = "sim", .labels = bad_labels};
    dsec_create_spec banana = {.type = "banana"}; /* refused by the scheduler, not locally */
    dsec_create_spec long_rid = {.type = "sim",
                                 .req_id = "0123456789012345678901234567890123456789"};
    const dsec_create_spec *specs[] = {&ok,  &bad_project, &ok, &bad_label,
                                       NULL, &banana,      &ok, &long_rid};
    uint64_t tokens[] = {1, 2, 3, 4, 5, 6, 7, 8};
    size_t n = sizeof specs / sizeof specs[0];
    dsec_err err;
    assert_int_equal(dsec_cq_create_batch(live.q, live.client, specs, tokens, n, &err), 0);
    dsec_cq_event ev[8];
    collect(live.q, ev, n);
    static const uint64_t good[] = {1, 3, 7};
    for (int i = 0; i < 3; i++) {
        const dsec_cq_event *g = by_token(ev, n, good[i]);
        if (g->status != 0)
            fail_msg("create with token %" PRIu64 ": %s", good[i], g->err.msg);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(by_token(ev, n, good[j])->info.id, g->info.id);
    }
    const dsec_cq_event *e = by_token(ev, n, 2);
    assert_int_equal(e->status, -1);
    assert_int_equal(e->err.code, DSEC_E_INVALID);
    assert_non_null(strstr(e->err.msg, "not a project!"));
    e = by_token(ev, n, 4);
    assert_int_equal(e->status, -1);
    assert_int_equal(e->err.code, DSEC_E_INVALID);
    assert_non_null(strstr(e->err.msg, "no-equals-sign"));
    e = by_token(ev, n, 5);
    assert_int_equal(e->status, -1);
    assert_int_equal(e->err.code, DSEC_E_INVALID);
    assert_non_null(strstr(e->err.msg, "spec 4 is NULL"));
    e = by_token(ev, n, 6);
    assert_int_equal(e->status, -1);
    assert_int_equal(e->err.code, DSEC_E_UNSUPPORTED);
    assert_non_null(strstr(e->err.msg, "banana"));
    e = by_token(ev, n, 8);
    assert_int_equal(e->status, -1);
    assert_int_equal(e->err.code, DSEC_E_INVALID);
    assert_non_null(strstr(e->err.msg, "req_id"));
}

/* Arguments that leave nothing to answer fail the call and queue nothing. */
static void batch_bad_arguments(void **state)
{
    start_cell("cb3", 10);
    dsec_create_spec ok = {.type = "sim"};
    const dsec_create_spec *specs[] = {&ok};
    uint64_t tokens[] = {1};
    dsec_err err;
    assert_int_equal(dsec_cq_create_batch(NULL, live.client, specs, tokens, 1, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "completion queue"));
    assert_int_equal(dsec_cq_create_batch(live.q, NULL, specs, tokens, 1, &err), -1);
    assert_non_null(strstr(err.msg, "client"));
    assert_int_equal(dsec_cq_create_batch(live.q, live.client, NULL, tokens, 1, &err), -1);
    assert_non_null(strstr(err.msg, "specs"));
    assert_int_equal(dsec_cq_create_batch(live.q, live.client, specs, NULL, 1, &err), -1);
    assert_non_null(strstr(err.msg, "tokens"));
    assert_int_equal(dsec_cq_create_batch(live.q, live.client, NULL, NULL, 0, &err), 0);
    dsec_cq_event e;
    assert_int_equal(dsec_cq_poll(live.q, &e, 1), 0);
    struct pollfd p = {.fd = dsec_cq_fd(live.q), .events = POLLIN};
    assert_int_equal(poll(&p, 1, 0), 0); /* nothing queued: not readable */
    /* and the queue still works afterwards */
    assert_int_equal(dsec_cq_create_batch(live.q, live.client, specs, tokens, 1, &err), 0);
    collect(live.q, &e, 1);
    assert_int_equal(e.token, 1);
    assert_int_equal(e.status, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(batch_answers_each_create_under_its_token, test_teardown),
        cmocka_unit_test_teardown(batch_failures_are_per_create, test_teardown),
        cmocka_unit_test_teardown(batch_bad_arguments, test_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
