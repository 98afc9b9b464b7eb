/* test_lost.c - a scheduler replica's superseded notices (actors/lost.c): told to the cell at once,
 * and sent again to a node back from a silence or a reconnect, in batches, until it answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "actors/lost.h"
#include "actors/wire.h"
#include "bus/bus.h"
#include "codecs/msg.h"
#include "tests/fixture.h"
#include "tests/test_util.h"

static dsec_natsd *natsd;
static char root[64];
static dsec_bus *bus;
static dsec_actor *probe;

/* What the probe heard: broadcasts, and requests to each node. */
static struct {
    pthread_mutex_t mu;
    int broadcasts;
    int requests;       /* superseded_list requests to any node */
    size_t items;       /* their items, in all */
    char last_node[80]; /* the node the last request was for */
    char req_ids[8192]; /* the last request's req_ids, space-separated */
    int refuse;         /* answer this many requests with an error first */
} heard = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void on_notice(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)ud;
    dsec_err err;
    dsec_msg_superseded_list l;
    assert_int_equal(dsec_decode(dsec_wire_decoder(), DSEC_MSG_SUPERSEDED_LIST, dsec_msg_data(m),
                                 dsec_msg_len(m), &l, &err),
                     0);
    const char *subj = dsec_msg_subject(m);
    const dsec_msg_superseded *it = l.items.items;
    pthread_mutex_lock(&heard.mu);
    if (dsec_msg_reply(m) == NULL) {
        heard.broadcasts++;
        pthread_mutex_unlock(&heard.mu);
        return;
    }
    heard.requests++;
    heard.items += l.items.n;
    snprintf(heard.last_node, sizeof heard.last_node, "%s", strrchr(subj, '.') + 1);
    size_t used = 0;
    heard.req_ids[0] = '\0';
    for (size_t i = 0; i < l.items.n && used < sizeof heard.req_ids; i++)
        used += (size_t)snprintf(heard.req_ids + used, sizeof heard.req_ids - used, "%s%s",
                                 i ? " " : "", it[i].req_id);
    bool refuse = heard.refuse > 0;
    heard.refuse -= refuse;
    pthread_mutex_unlock(&heard.mu);
    if (refuse) {
        dsec_err_set(&err, DSEC_E_OVERFLOW, 0, "busy");
        dsec_wire_error(a, m, &err);
        return;
    }
    dsec_msg_op_reply r = {.id = "node", .state = "superseded"};
    assert_int_equal(dsec_wire_reply(a, m, DSEC_MSG_OP_REPLY, &r, &err), 0);
}

static int requests(void)
{
    pthread_mutex_lock(&heard.mu);
    int n = heard.requests;
    pthread_mutex_unlock(&heard.mu);
    return n;
}

/* Wait for the count of requests to reach want: up to 10 s when it should (a loaded host, or
 * a sanitizer, can take over a second for a second batch), 1 s when it should not. */
static int wait_requests(int want, bool should)
{
    for (int i = 0; i < (should ? 1000 : 100) && requests() < want; i++)
        msleep(10);
    msleep(50); /* and a moment for any that should not come */
    return requests();
}

static int group_setup(void **state)
{
    (void)state;
    if (dsec_test_server_start("dsec-lost", false, &natsd, root, sizeof root) < 0)
        return -1;
    dsec_err err;
    dsec_bus_opts o = {.url = dsec_natsd_url(natsd), .name = "test-lost"};
    if (dsec_bus_connect(&bus, &o, &err) < 0 || dsec_actor_new(&probe, bus, "probe", &err) < 0 ||
        dsec_actor_on(probe, "dsec.v1.ctl.superseded.c1", NULL, on_notice, NULL, &err) < 0 ||
        dsec_actor_on(probe, "dsec.v1.ctl.superseded.c1.*", NULL, on_notice, NULL, &err) < 0) {
        fprintf(stderr, "test_lost: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    dsec_bus_free(bus);
    return dsec_test_server_stop(natsd, root);
}

static dsec_lost *new_watch(void)
{
    dsec_lost *w;
    dsec_err err;
    assert_int_equal(dsec_lost_new(&w, bus, "c1", "sched-test", 30000, 3000, &err), 0);
    return w;
}

/* A notice goes to the cell at once; a node that was silent for gap_ms gets
 * those from its silence when it speaks again, until it answers. */
static void test_resent_after_silence(void **state)
{
    (void)state;
    dsec_lost *w = new_watch();
    int base = requests();
    dsec_lost_seen(w, "n1", false, NULL, 0, 0, 1000);
    dsec_lost_superseded(w, "acme", "r-1", "n2", 1, 1100);
    msleep(200);
    pthread_mutex_lock(&heard.mu);
    assert_int_equal(heard.broadcasts, 1);
    heard.refuse = 1; /* the node's first answer is an error: it is asked again */
    pthread_mutex_unlock(&heard.mu);
    dsec_lost_seen(w, "n1", false, NULL, 0, 0, 1200); /* no silence: nothing to resend */
    assert_int_equal(wait_requests(base + 1, false), base);
    dsec_lost_seen(w, "n1", false, NULL, 0, 0, 4300); /* 3100 ms of silence */
    assert_int_equal(wait_requests(base + 1, true), base + 1);
    pthread_mutex_lock(&heard.mu);
    assert_string_equal(heard.last_node, "n1");
    assert_string_equal(heard.req_ids, "r-1");
    pthread_mutex_unlock(&heard.mu);
    dsec_lost_stats st;
    dsec_lost_stats_get(w, &st);
    assert_int_equal(st.resent, 0); /* refused */
    dsec_lost_seen(w, "n1", false, NULL, 0, 0, 4400);
    assert_int_equal(wait_requests(base + 2, true), base + 2);
    dsec_lost_stats_get(w, &st);
    assert_int_equal(st.resent, 1);
    assert_int_equal(st.superseded, 1);
    dsec_lost_seen(w, "n1", false, NULL, 0, 0, 4500); /* answered: nothing more */
    assert_int_equal(wait_requests(base + 3, false), base + 2);

    /* notices older than the silence (with gap_ms of slack) are not sent */
    dsec_lost_seen(w, "n9", false, NULL, 0, 0, 10000);
    dsec_lost_seen(w, "n9", false, NULL, 0, 0, 14000);
    assert_int_equal(wait_requests(base + 3, false), base + 2);
    dsec_lost_free(w);
}

/* A node that restarted or reconnected (its reports' conn changed) may have
 * missed notices without a silence: it is sent those since its last report
 * of before. */
static void test_resent_after_reconnect(void **state)
{
    (void)state;
    dsec_lost *w = new_watch();
    int base = requests();
    dsec_lost_seen(w, "n3", true, NULL, 0, 77, 1000);
    dsec_lost_superseded(w, "acme", "old", "n4", 1, 100); /* within gap_ms before that report */
    dsec_lost_superseded(w, "acme", "r-2", "n4", 2, 1050);
    dsec_lost_seen(w, "n3", false, NULL, 0, 0, 1100); /* a heartbeat: no conn */
    dsec_lost_seen(w, "n3", false, NULL, 0, 77, 1200);
    assert_int_equal(wait_requests(base + 1, false), base);
    dsec_lost_seen(w, "n3", true, NULL, 0, 78, 1300);
    assert_int_equal(wait_requests(base + 1, true), base + 1);
    pthread_mutex_lock(&heard.mu);
    assert_string_equal(heard.last_node, "n3");
    assert_string_equal(heard.req_ids, "old r-2");
    pthread_mutex_unlock(&heard.mu);
    dsec_lost_free(w);
}

/* More notices than one request carries go in batches, back to back. */
static void test_resent_in_batches(void **state)
{
    (void)state;
    dsec_lost *w = new_watch();
    int base = requests();
    pthread_mutex_lock(&heard.mu);
    size_t items0 = heard.items;
    pthread_mutex_unlock(&heard.mu);
    dsec_lost_seen(w, "n5", false, NULL, 0, 0, 1000);
    char rid[32];
    for (int i = 0; i < 1500; i++) {
        snprintf(rid, sizeof rid, "b-%d", i);
        dsec_lost_superseded(w, "acme", rid, "n6", 1, 1001);
    }
    dsec_lost_seen(w, "n5", false, NULL, 0, 0, 5000);
    assert_int_equal(wait_requests(base + 2, true), base + 2);
    pthread_mutex_lock(&heard.mu);
    assert_int_equal(heard.items - items0, 1500);
    assert_non_null(strstr(heard.req_ids, "b-1499"));
    pthread_mutex_unlock(&heard.mu);
    dsec_lost_stats st;
    dsec_lost_stats_get(w, &st);
    assert_int_equal(st.resent, 1500);
    dsec_lost_free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resent_after_silence),
        cmocka_unit_test(test_resent_after_reconnect),
        cmocka_unit_test(test_resent_in_batches),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
