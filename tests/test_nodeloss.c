/* test_nodeloss.c - a node that goes silent: owners are told its sandboxes are lost, and when it
 * returns it reclaims them, so none is left orphaned; a sandbox made for a create attempt whose
 * answer was lost, and whose retry was kept elsewhere, is dropped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <inttypes.h>
#include <pthread.h>
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
#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tests/fixture.h"
#include "tests/test_util.h"

static dsec_natsd *natsd;
static char root[64];

static struct {
    dsec_cell *sched, *keep, *flaky;
    dsec_cell_conf sched_conf, keep_conf, flaky_conf;
    dsec_client *client;
} live;

static struct {
    pthread_mutex_t mu;
    int n;
    char node[80];
} heard = {PTHREAD_MUTEX_INITIALIZER, 0, ""};

static void on_lost(const char *node, const char *cell, uint64_t lost_ns, void *ud)
{
    (void)cell;
    (void)ud;
    (void)lost_ns;
    pthread_mutex_lock(&heard.mu);
    heard.n++;
    snprintf(heard.node, sizeof heard.node, "%s", node);
    pthread_mutex_unlock(&heard.mu);
}

static int heard_count(void)
{
    pthread_mutex_lock(&heard.mu);
    int n = heard.n;
    pthread_mutex_unlock(&heard.mu);
    return n;
}

static int group_setup(void **state)
{
    (void)state;
    return dsec_test_server_start("dsec-nodeloss", true, &natsd, root, sizeof root);
}

static int group_teardown(void **state)
{
    (void)state;
    dsec_client_free(live.client);
    dsec_cell_stop(live.flaky, true);
    dsec_cell_stop(live.keep, true);
    dsec_cell_stop(live.sched, true);
    dsec_cell_conf_release(&live.flaky_conf);
    dsec_cell_conf_release(&live.keep_conf);
    dsec_cell_conf_release(&live.sched_conf);
    return dsec_test_server_stop(natsd, root);
}

/* One process per "host": the schedulers, a node that stays, a node that goes. */
static void conf_for(dsec_cell_conf *c, const char *part, const char *node, const char *zone)
{
    dsec_cell_conf_defaults(c);
    snprintf(c->cell, sizeof c->cell, "loss%ld", (long)getpid());
    snprintf(c->url, sizeof c->url, "%s", dsec_natsd_url(natsd));
    snprintf(c->state_dir, sizeof c->state_dir, "%s/%s", root, part);
    c->capacity_ms = 20;
    c->full_ms = 200;
    c->heartbeat_ms = 50;
    c->reap_ms = 50;
    c->dead_after_ms = 300;
    /* well above a stop and restart of a node on a loaded host (1.1 s seen under make check) */
    c->lost_after_ms = 2500;
    c->summary_ms = 100;
    if (node != NULL) {
        static const char *const types[] = {"sim", NULL};
        dsec_err err;
        assert_int_equal(
            dsec_cell_conf_add_sim_nodes(c, node, 1, 8000, 8192, 100, types, "0", &err), 0);
        assert_true(strlen(node) < sizeof c->nodes[0].name);
        memcpy(c->nodes[0].name, node, strlen(node) + 1);
        c->nodes[0].labels[0] = (dsec_backend_kv){dsec_strdup("zone"), dsec_strdup(zone)};
        c->nodes[0].nlabels = 1;
    }
}

static void start(dsec_cell **cell, dsec_cell_conf *c, int roles)
{
    dsec_err err;
    if (dsec_cell_start(cell, c, roles, &err) < 0)
        fail_msg("cell part %s: %s", c->state_dir, err.msg);
}

static const char *status_of(const char *id, dsec_err *err)
{
    static dsec_sandbox_info st;
    if (dsec_status(live.client, id, &st, err) < 0)
        return NULL;
    return st.state;
}

static void test_lost_then_reclaimed(void **state)
{
    (void)state;
    char keep_node[80], flaky_node[80];
    snprintf(keep_node, sizeof keep_node, "keep%ld", (long)getpid());
    snprintf(flaky_node, sizeof flaky_node, "flaky%ld", (long)getpid());
    conf_for(&live.sched_conf, "sched", NULL, NULL);
    conf_for(&live.keep_conf, "keep", keep_node, "stays");
    conf_for(&live.flaky_conf, "flaky", flaky_node, "goes");
    start(&live.keep, &live.keep_conf, DSEC_ROLE_NODE);
    start(&live.flaky, &live.flaky_conf, DSEC_ROLE_NODE);
    start(&live.sched, &live.sched_conf, DSEC_ROLE_SCHEDULER);
    msleep(500); /* the replica hears both nodes */

    dsec_err err;
    dsec_client_opts o = {
        .url = dsec_natsd_url(natsd), .tenant = "own", .timeout_ms = 3000, .retries = -1};
    assert_int_equal(dsec_client_connect(&live.client, &o, &err), 0);
    assert_int_equal(dsec_watch_lost(live.client, on_lost, NULL, &err), 0);
    const char *goes[] = {"zone=goes", NULL}, *stays[] = {"zone=stays", NULL};
    dsec_create_spec on_flaky = {.type = "sim", .affinity = goes};
    dsec_create_spec on_keep = {.type = "sim", .affinity = stays};
    dsec_sandbox_info a[3], kept;
    for (int i = 0; i < 3; i++)
        assert_int_equal(dsec_create(live.client, &on_flaky, &a[i], &err), 0);
    assert_int_equal(dsec_create(live.client, &on_keep, &kept, &err), 0);
    msleep(400); /* a full report carries the tenant */

    /* a short outage (under lost_after_ms) loses nothing */
    dsec_cell_stop(live.flaky, false);
    live.flaky = NULL;
    msleep(300);
    start(&live.flaky, &live.flaky_conf, DSEC_ROLE_NODE);
    msleep(1200);
    assert_int_equal(heard_count(), 0);
    for (int i = 0; i < 3; i++) {
        const char *st = status_of(a[i].id, &err);
        assert_non_null(st);
        assert_string_equal(st, "running");
    }

    /* a long one: the owner hears the node is lost */
    dsec_cell_stop(live.flaky, false);
    live.flaky = NULL;
    for (int i = 0; i < 200 && heard_count() == 0; i++) /* 10 s */
        msleep(50);
    assert_true(heard_count() >= 1);
    pthread_mutex_lock(&heard.mu);
    assert_string_equal(heard.node, flaky_node);
    pthread_mutex_unlock(&heard.mu);
    printf("nodeloss: owner told node %s is lost\n", flaky_node);

    /* it returns with its sandboxes re-adopted from the journal; they are reclaimed */
    start(&live.flaky, &live.flaky_conf, DSEC_ROLE_NODE);
    int gone = 0;
    for (int t = 0; t < 100 && gone < 3; t++) {
        gone = 0;
        for (int i = 0; i < 3; i++)
            gone += status_of(a[i].id, &err) == NULL && err.code == DSEC_E_NOT_FOUND;
        msleep(50);
    }
    assert_int_equal(gone, 3);
    printf("nodeloss: the returned node reclaimed its %d lost sandboxes\n", gone);

    /* what it makes after returning is not touched, nor the other node's */
    dsec_sandbox_info fresh;
    assert_int_equal(dsec_create(live.client, &on_flaky, &fresh, &err), 0);
    msleep(500);
    const char *st = status_of(fresh.id, &err);
    assert_non_null(st);
    assert_string_equal(st, "running");
    st = status_of(kept.id, &err);
    assert_non_null(st);
    assert_string_equal(st, "running");
}

static bool gone_within(const char *id, int ms)
{
    dsec_err err;
    for (int t = 0; t < ms / 50; t++) {
        if (status_of(id, &err) == NULL && err.code == DSEC_E_NOT_FOUND)
            return true;
        msleep(50);
    }
    return false;
}

/* A node that made a sandbox for attempt 0 of a request hears that attempt 1
 * was placed on another node (its own answer was lost): it destroys its copy,
 * and a placement of attempt 0 that reaches it later is not created. */
static void test_superseded_copy_dropped(void **state)
{
    (void)state;
    assert_non_null(live.flaky);
    dsec_err err;
    const char *goes[] = {"zone=goes", NULL};
    dsec_sandbox_info x;
    dsec_create_spec spec = {.type = "sim", .affinity = goes, .req_id = "sup-live-1"};
    assert_int_equal(dsec_create(live.client, &spec, &x, &err), 0);
    dsec_node_stats before, after;
    dsec_node_stats_get(dsec_cell_node_at(live.flaky, 0), &before);

    dsec_msg_superseded item = {
        .tenant = "own", .req_id = "sup-live-1", .node = live.keep_conf.nodes[0].name, .retry = 1};
    dsec_msg_superseded_list l = {.by = "test", .items = {.items = &item, .n = 1}};
    char subj[160];
    snprintf(subj, sizeof subj, "dsec.v1.ctl.superseded.%s", live.sched_conf.cell);
    assert_int_equal(dsec_wire_send(NULL, dsec_cell_bus(live.sched), subj, NULL,
                                    DSEC_MSG_SUPERSEDED_LIST, &l, NULL, &err),
                     0);
    assert_true(gone_within(x.id, 3000));
    dsec_node_stats_get(dsec_cell_node_at(live.flaky, 0), &after);
    assert_int_equal(after.reaped_superseded, before.reaped_superseded + 1);

    /* attempt 0 placed there again (late): refused, retry-safe; nothing made */
    dsec_sandbox_info y;
    assert_int_equal(dsec_create(live.client, &spec, &y, &err), -1);
    assert_int_equal(err.code, DSEC_E_TIMEOUT);
    assert_non_null(strstr(err.msg, "not created"));
    dsec_node_stats_get(dsec_cell_node_at(live.flaky, 0), &after);
    assert_int_equal(after.stale_places, before.stale_places + 1);
    assert_int_equal(after.created, before.created);
    printf("superseded: a live node dropped its copy and refused a late placement: %s\n", err.msg);

    /* a notice naming the node itself keeps what it holds */
    dsec_sandbox_info z;
    spec.req_id = "sup-live-2";
    assert_int_equal(dsec_create(live.client, &spec, &z, &err), 0);
    item = (dsec_msg_superseded){
        .tenant = "own", .req_id = "sup-live-2", .node = live.flaky_conf.nodes[0].name, .retry = 1};
    assert_int_equal(dsec_wire_send(NULL, dsec_cell_bus(live.sched), subj, NULL,
                                    DSEC_MSG_SUPERSEDED_LIST, &l, NULL, &err),
                     0);
    msleep(300);
    const char *st = status_of(z.id, &err);
    assert_non_null(st);
    assert_string_equal(st, "running");
}

/* The answer of attempt 0 is lost with its node (stopped before the retry):
 * the retry's lookup finds nothing, it is placed on the other node, and the
 * node, back within lost_after_ms (so not declared lost), hears of it from
 * the scheduler when it speaks again and destroys its copy. One sandbox
 * answers the request. */
static void test_superseded_told_on_return(void **state)
{
    (void)state;
    dsec_err err;
    const char *goes[] = {"zone=goes", NULL};
    dsec_sandbox_info x;
    dsec_create_spec spec = {.type = "sim", .affinity = goes, .req_id = "sup-back-1"};
    assert_int_equal(dsec_create(live.client, &spec, &x, &err), 0);
    msleep(300); /* journaled, and a report or two */
    int heard_before = heard_count();
    dsec_sched_stats sb, sa;
    dsec_sched_stats_get(dsec_cell_sched_at(live.sched, 0), &sb);

    dsec_cell_stop(live.flaky, false); /* its sandboxes stay, in its journal */
    live.flaky = NULL;
    dsec_msg_create m = {.req_id = "sup-back-1", .type = "sim", .retry = 1};
    dsec_buf b;
    dsec_buf_init(&b);
    assert_int_equal(dsec_encode(&b, DSEC_MSG_CREATE, &m, &err), 0);
    dsec_msg *reply = NULL;
    dsec_hdr h = {.type = "create", .schema = 1, .req_id = m.req_id};
    assert_int_equal(dsec_bus_request_sync(dsec_cell_bus(live.sched), "dsec.v1.own.create", &h,
                                           b.data, b.len, 3000, &reply, &err),
                     0);
    dsec_buf_release(&b);
    assert_string_equal(dsec_msg_type(reply), "created");
    dsec_decoder *d = dsec_decoder_new(NULL);
    dsec_msg_created cr;
    assert_int_equal(
        dsec_decode(d, DSEC_MSG_CREATED, dsec_msg_data(reply), dsec_msg_len(reply), &cr, &err), 0);
    assert_string_equal(cr.node, live.keep_conf.nodes[0].name);
    assert_false(cr.existing);
    char kept[96];
    snprintf(kept, sizeof kept, "%s", cr.id);
    dsec_decoder_free(d);
    dsec_msg_free(reply);

    msleep(400); /* silent past dead_after_ms (300), short of lost_after_ms (2500) */
    start(&live.flaky, &live.flaky_conf, DSEC_ROLE_NODE);
    assert_true(gone_within(x.id, 3000));
    assert_int_equal(heard_count(), heard_before); /* not the lost-node reconcile */
    const char *st = status_of(kept, &err);
    assert_non_null(st);
    assert_string_equal(st, "running");
    dsec_sched_stats_get(dsec_cell_sched_at(live.sched, 0), &sa);
    assert_true(sa.superseded >= sb.superseded + 1);
    assert_true(sa.superseded_resent >= sb.superseded_resent + 1);
    printf("superseded: the returned node dropped %s; %s answers the request\n", x.id, kept);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lost_then_reclaimed),
        cmocka_unit_test(test_superseded_copy_dropped),
        cmocka_unit_test(test_superseded_told_on_return),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
