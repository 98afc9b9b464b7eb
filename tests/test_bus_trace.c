/* test_bus_trace.c - the bus's trace ids (inherited by what handlers and callbacks send) and its
 * hop record. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "bus/bus.h"
#include "dsec/alloc.h"
#include "tests/fixture.h"
#include "tests/test_util.h"

static dsec_natsd *natsd;
static char root[64];

static dsec_bus *open_bus(const char *name)
{
    dsec_bus *b = NULL;
    dsec_err err;
    dsec_bus_opts o = {.url = dsec_natsd_url(natsd), .name = name, .low_latency = true};
    if (dsec_bus_connect(&b, &o, &err) < 0)
        fail_msg("connect: %s", err.msg);
    return b;
}

/* What the spy saw, by subject. */
static struct {
    pthread_mutex_t mu;
    char subject[16][32];
    char trace[16][80];
    int n;
} seen = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void on_spy(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a;
    (void)ud;
    pthread_mutex_lock(&seen.mu);
    if (seen.n < 16) {
        snprintf(seen.subject[seen.n], sizeof seen.subject[0], "%s", dsec_msg_subject(m));
        const char *t = dsec_msg_header(m, DSEC_HDR_TRACE_ID);
        snprintf(seen.trace[seen.n], sizeof seen.trace[0], "%s", t ? t : "");
        seen.n++;
    }
    pthread_mutex_unlock(&seen.mu);
}

/* The trace the spy saw on subject, or NULL (after waiting a while). */
static const char *seen_on(const char *subject, char *buf, size_t n)
{
    for (int i = 0; i < 300; i++) {
        pthread_mutex_lock(&seen.mu);
        for (int k = 0; k < seen.n; k++)
            if (strcmp(seen.subject[k], subject) == 0) {
                snprintf(buf, n, "%s", seen.trace[k]);
                pthread_mutex_unlock(&seen.mu);
                return buf;
            }
        pthread_mutex_unlock(&seen.mu);
        msleep(10);
    }
    return NULL;
}

static void on_service(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)ud;
    dsec_msg_respond(a, m, &(dsec_hdr){.type = "pong"}, "", 0, NULL);
}

static void on_answer(int status, dsec_msg *reply, const dsec_err *err, void *ud)
{
    (void)reply;
    (void)err;
    dsec_bus *bus = ud;
    assert_int_equal(status, 0);
    /* a callback works for the request it answers */
    dsec_bus_publish(bus, "tt.cb", NULL, &(dsec_hdr){.type = "note"}, "", 0, NULL);
}

static void on_in(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)m;
    (void)ud;
    dsec_bus *bus = dsec_actor_bus(a);
    dsec_err err;
    assert_non_null(dsec_trace_current());
    dsec_actor_publish(a, "tt.out", NULL, &(dsec_hdr){.type = "note"}, "", 0, &err);
    dsec_actor_publish(a, "tt.own", NULL, &(dsec_hdr){.type = "note", .trace_id = "own-id"}, "", 0,
                       &err);
    dsec_bus_request(bus, "tt.svc", &(dsec_hdr){.type = "ping"}, "", 0, 2000, on_answer, bus, &err);
}

static void handlers_and_callbacks_inherit_the_trace(void **state)
{
    (void)state;
    dsec_bus *bus = open_bus("inherit");
    dsec_err err;
    dsec_actor *spy, *in, *svc;
    assert_int_equal(dsec_actor_new(&spy, bus, "spy", &err), 0);
    assert_int_equal(dsec_actor_on(spy, "tt.out", NULL, on_spy, NULL, &err), 0);
    assert_int_equal(dsec_actor_on(spy, "tt.own", NULL, on_spy, NULL, &err), 0);
    assert_int_equal(dsec_actor_on(spy, "tt.cb", NULL, on_spy, NULL, &err), 0);
    assert_int_equal(dsec_actor_on(spy, "tt.plain", NULL, on_spy, NULL, &err), 0);
    assert_int_equal(dsec_actor_on(spy, "tt.thread", NULL, on_spy, NULL, &err), 0);
    assert_int_equal(dsec_actor_new(&in, bus, "in", &err), 0);
    assert_int_equal(dsec_actor_on(in, "tt.in", NULL, on_in, NULL, &err), 0);
    assert_int_equal(dsec_actor_new(&svc, bus, "svc", &err), 0);
    assert_int_equal(dsec_actor_on(svc, "tt.svc", NULL, on_service, NULL, &err), 0);
    assert_int_equal(dsec_bus_flush(bus, 2000, &err), 0);

    assert_null(dsec_trace_current());
    assert_int_equal(dsec_bus_publish(bus, "tt.in", NULL,
                                      &(dsec_hdr){.type = "note", .trace_id = "caller-1"}, "", 0,
                                      &err),
                     0);
    char buf[80];
    assert_non_null(seen_on("tt.out", buf, sizeof buf));
    assert_string_equal(buf, "caller-1");
    assert_non_null(seen_on("tt.cb", buf, sizeof buf));
    assert_string_equal(buf, "caller-1");
    assert_non_null(seen_on("tt.own", buf, sizeof buf)); /* an explicit id wins */
    assert_string_equal(buf, "own-id");

    /* outside any scope: a fresh id; with the thread's id set: that one */
    assert_int_equal(dsec_bus_publish(bus, "tt.plain", NULL, NULL, "", 0, &err), 0);
    assert_non_null(seen_on("tt.plain", buf, sizeof buf));
    assert_int_equal(strlen(buf), 32);
    assert_int_equal(dsec_trace_set_thread("bad id"), -1);
    assert_int_equal(dsec_trace_set_thread("thread-2"), 0);
    assert_string_equal(dsec_trace_current(), "thread-2");
    assert_int_equal(dsec_bus_publish(bus, "tt.thread", NULL, NULL, "", 0, &err), 0);
    assert_int_equal(dsec_trace_set_thread(NULL), 0);
    assert_null(dsec_trace_current());
    assert_non_null(seen_on("tt.thread", buf, sizeof buf));
    assert_string_equal(buf, "thread-2");

    /* scopes nest, and an id the bus does not follow is none */
    dsec_trace_scope a, b;
    dsec_trace_enter(&a, NULL, "outer", NULL, NULL);
    dsec_trace_enter(&b, NULL, "has space", NULL, NULL);
    assert_null(dsec_trace_current());
    dsec_trace_leave(&b);
    assert_string_equal(dsec_trace_current(), "outer");
    dsec_trace_leave(&a);
    assert_null(dsec_trace_current());
    dsec_bus_free(bus);
}

/* Hops recorded through scopes of an actor, without traffic. */
static void hop(dsec_actor *a, const char *id, bool error)
{
    dsec_trace_scope sc;
    dsec_trace_enter(&sc, a, id, "tt.work", "work");
    if (error)
        dsec_actor_count_error(a);
    dsec_trace_leave(&sc);
}

static size_t kept(dsec_bus *bus, const char *id, dsec_trace_hop *first)
{
    dsec_trace_hop *h = NULL;
    size_t n = 0;
    dsec_err err;
    assert_int_equal(dsec_bus_trace_hops(bus, id, &h, &n, &err), 0);
    if (n > 0 && first != NULL)
        *first = h[0];
    dsec_free(h);
    return n;
}

static void the_record_keeps_errors_slow_and_sampled_hops(void **state)
{
    (void)state;
    dsec_bus *bus = open_bus("record");
    dsec_err err;
    dsec_actor *a;
    assert_int_equal(dsec_actor_new(&a, bus, "worker", &err), 0);
    hop(a, "before-conf", true); /* off until configured */
    assert_int_equal(kept(bus, "before-conf", NULL), 0);

    dsec_trace_conf c = {.sample_rate = 0, .slow_ms = 60000, .ring = 8};
    assert_int_equal(dsec_bus_trace_conf(bus, &c, &err), 0);
    hop(a, "fine-1", false);
    hop(a, "failed-1", true);
    assert_int_equal(kept(bus, "fine-1", NULL), 0);
    dsec_trace_hop h;
    assert_int_equal(kept(bus, "failed-1", &h), 1);
    assert_true(h.error);
    assert_string_equal(h.kept, "error");
    assert_string_equal(h.actor, "worker");
    assert_string_equal(h.subject, "tt.work");
    assert_string_equal(h.type, "work");
    assert_true(h.end_ns >= h.start_ns && h.start_ns > 0);

    c.slow_ms = 0; /* every hop is slow */
    assert_int_equal(dsec_bus_trace_conf(bus, &c, &err), 0);
    assert_int_equal(kept(bus, "failed-1", NULL), 0); /* a new ring */
    hop(a, "slow-1", false);
    assert_int_equal(kept(bus, "slow-1", &h), 1);
    assert_string_equal(h.kept, "slow");

    /* the ring is bounded: the oldest go */
    c = (dsec_trace_conf){.sample_rate = 1, .slow_ms = 60000, .ring = 4};
    assert_int_equal(dsec_bus_trace_conf(bus, &c, &err), 0);
    char id[32];
    for (int i = 0; i < 10; i++) {
        snprintf(id, sizeof id, "ring-%d", i);
        hop(a, id, false);
    }
    assert_int_equal(kept(bus, "ring-5", NULL), 0);
    assert_int_equal(kept(bus, "ring-6", &h), 1);
    assert_string_equal(h.kept, "sample");
    assert_int_equal(kept(bus, "ring-9", NULL), 1);

    /* sampling is by the id: about the rate, and the same id always alike */
    c = (dsec_trace_conf){.sample_rate = 0.25, .slow_ms = 60000, .ring = 4096};
    assert_int_equal(dsec_bus_trace_conf(bus, &c, &err), 0);
    int n = 0;
    for (int i = 0; i < 2000; i++) {
        snprintf(id, sizeof id, "req-%d", i);
        hop(a, id, false);
        hop(a, id, false);
        size_t k = kept(bus, id, NULL);
        assert_true(k == 0 || k == 2);
        n += k > 0;
    }
    assert_in_range(n, 400, 600);

    c.sample_rate = 1.5;
    assert_int_equal(dsec_bus_trace_conf(bus, &c, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    dsec_bus_free(bus);
}

static int group_setup(void **state)
{
    (void)state;
    return dsec_test_server_start("dsec-bus-trace", false, &natsd, root, sizeof root);
}

static int group_teardown(void **state)
{
    (void)state;
    return dsec_test_server_stop(natsd, root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(handlers_and_callbacks_inherit_the_trace),
        cmocka_unit_test(the_record_keeps_errors_slow_and_sampled_hops),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
