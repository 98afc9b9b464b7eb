/* test_fleet.c - fleet handling end to end on a real nats-server: listing a tenant's sandboxes from
 * the nodes (filters, pages, tenants, missing nodes, bad input), removing by label, per-tenant
 * events. */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/cell.h"
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
static const char *dsecd_path;

static struct {
    dsec_cell *cell, *cell2;
    dsec_cell_conf *conf, *conf2;
    dsec_client *clients[3];
    dsec_event_watch *watches[2];
    pid_t pid;
} live;

static int test_teardown(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++)
        dsec_event_watch_free(live.watches[i]);
    if (live.pid > 0) {
        kill(live.pid, SIGKILL);
        waitpid(live.pid, NULL, 0);
    }
    for (int i = 0; i < 3; i++)
        dsec_client_free(live.clients[i]);
    dsec_cell_stop(live.cell, true);
    dsec_cell_stop(live.cell2, true);
    if (live.conf)
        dsec_cell_conf_release(live.conf);
    if (live.conf2)
        dsec_cell_conf_release(live.conf2);
    memset(&live, 0, sizeof live);
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    return dsec_test_server_start("dsec-fleet", false, &natsd, root, sizeof root);
}

static int group_teardown(void **state)
{
    (void)state;
    return dsec_test_server_stop(natsd, root);
}

static void conf_for(dsec_cell_conf *c, const char *name)
{
    dsec_cell_conf_defaults(c);
    snprintf(c->cell, sizeof c->cell, "%s", name);
    snprintf(c->url, sizeof c->url, "%s", dsec_natsd_url(natsd));
    snprintf(c->state_dir, sizeof c->state_dir, "%s/%s-%ld", root, name, (long)random());
    c->capacity_ms = 20;
    c->full_ms = 500;
    c->heartbeat_ms = 100;
    c->reap_ms = 100;
    c->summary_ms = 100;
    c->dead_after_ms = 60000;
}

static void add_node(dsec_cell_conf *c, const char *name, const char *zone)
{
    static const char *const types[] = {"container", "function", NULL};
    dsec_err err;
    assert_int_equal(dsec_cell_conf_add_sim_nodes(c, name, 1, 64000, 65536, 100, types, "0", &err),
                     0);
    dsec_cell_node *n = &c->nodes[c->nnodes - 1];
    snprintf(n->name, sizeof n->name, "%s", name);
    n->labels[0].key = dsec_strdup("zone");
    n->labels[0].value = dsec_strdup(zone);
    n->nlabels = 1;
}

static dsec_client *client(const char *tenant)
{
    dsec_client *cl = NULL;
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = tenant, .timeout_ms = 3000};
    dsec_err err;
    if (dsec_client_connect(&cl, &o, &err) < 0)
        fail_msg("client: %s", err.msg);
    for (int i = 0; i < 3; i++)
        if (live.clients[i] == NULL) {
            live.clients[i] = cl;
            break;
        }
    return cl;
}

static void wait_nodes(dsec_cell *cell, uint64_t want)
{
    dsec_sched_stats ss = {0};
    for (int waited = 0; waited < 10000; waited += 20) {
        dsec_sched_stats_get(dsec_cell_sched_at(cell, 0), &ss);
        if (ss.nodes == want)
            return;
        msleep(20);
    }
    fail_msg("scheduler sees %" PRIu64 " nodes, wanted %" PRIu64, ss.nodes, want);
}

static void make(dsec_client *cl, const char *type, const char *zone, const char *const *labels,
                 char *id_out)
{
    char aff[32];
    snprintf(aff, sizeof aff, "zone=%s", zone);
    const char *affinity[] = {aff, NULL};
    dsec_create_spec spec = {.type = type, .labels = labels, .affinity = affinity};
    dsec_sandbox_info info;
    dsec_err err;
    if (dsec_create(cl, &spec, &info, &err) < 0)
        fail_msg("create: %s", err.msg);
    snprintf(id_out, DSEC_ID_MAX, "%s", info.id);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The ids of one listing (everything on one page, checked complete), sorted, as a string
 * "id,id,...": what a test compares with what it expects. */
static void list_ids(dsec_client *cl, const dsec_list_opts *o, char *out, size_t n)
{
    dsec_list_page p;
    dsec_err err;
    if (dsec_list_sandboxes(cl, o, &p, &err) < 0)
        fail_msg("list: %s", err.msg);
    assert_int_equal(p.nmissing, 0);
    assert_string_equal(p.next_cursor, "");
    out[0] = '\0';
    for (size_t i = 0; i < p.n; i++) {
        if (i > 0)
            assert_true(strcmp(p.entries[i - 1].id, p.entries[i].id) < 0);
        snprintf(out + strlen(out), n - strlen(out), "%s%s", i ? "," : "", p.entries[i].id);
    }
    dsec_list_page_release(&p);
}

static void expect_ids(char *const *ids, size_t k, char *out, size_t n)
{
    const char *v[64];
    for (size_t i = 0; i < k; i++)
        v[i] = ids[i];
    qsort(v, k, sizeof *v, cmp_str);
    out[0] = '\0';
    for (size_t i = 0; i < k; i++)
        snprintf(out + strlen(out), n - strlen(out), "%s%s", i ? "," : "", v[i]);
}

#define EXPECT_LIST(cl, opts, ...)                                                                 \
    do {                                                                                           \
        char *want_[] = {__VA_ARGS__};                                                             \
        char got_[4096], exp_[4096];                                                               \
        list_ids(cl, opts, got_, sizeof got_);                                                     \
        expect_ids(want_, sizeof want_ / sizeof *want_, exp_, sizeof exp_);                        \
        assert_string_equal(got_, exp_);                                                           \
    } while (0)

/* The ghost node, answering at last: its matches sort before every real one, and each answer
 * carries one of them with more (as a node whose page was cut to fit the payload limit). */
static const char *const ghost_ids[] = {"t40-0-0000000000000001", "t40-0-0000000000000002",
                                        "t40-0-0000000000000003"};

static void on_ghost_list(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)ud;
    dsec_err err;
    dsec_msg_list q;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_LIST, dsec_msg_data(m), dsec_msg_len(m), &q,
                    &err) < 0)
        return;
    size_t i = 0;
    while (i < 3 && q.after != NULL && strcmp(ghost_ids[i], q.after) <= 0)
        i++;
    dsec_msg_sbx_info item = {.id = i < 3 ? ghost_ids[i] : "",
                              .type = "container",
                              .state = "running",
                              .node = "t40-ghost"};
    dsec_msg_list_reply r = {
        .node = "t40-ghost", .items = {&item, i < 3 ? 1 : 0}, .more = i + 1 < 3};
    dsec_wire_reply(a, m, DSEC_MSG_LIST_REPLY, &r, &err);
}

/* Listing from the nodes: filters by label, state and type give exactly the matching ids,
 * across both nodes; pages of 2 walk them all once; one tenant never sees another's; bad
 * input names its field; a node the scheduler knows that does not answer is missing. */
static void list_filters_pages_and_tenants(void **state)
{
    (void)state;
    static dsec_cell_conf c;
    conf_for(&c, "t40");
    add_node(&c, "t40-a", "a");
    add_node(&c, "t40-b", "b");
    live.conf = &c;
    dsec_err err;
    if (dsec_cell_start(&live.cell, &c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        fail_msg("cell: %s", err.msg);
    wait_nodes(live.cell, 2);
    dsec_client *ca = client("t40a"), *cb = client("t40b");
    static const char *const exp7rl[] = {"run=exp-7", "team=rl", NULL};
    static const char *const exp7[] = {"run=exp-7", NULL};
    static const char *const exp8[] = {"run=exp-8", NULL};
    char a7[4][DSEC_ID_MAX], a7p[DSEC_ID_MAX], a8[2][DSEC_ID_MAX], b7[3][DSEC_ID_MAX];
    char plain[DSEC_ID_MAX];
    for (int i = 0; i < 4; i++)
        make(ca, "container", i % 2 ? "a" : "b", exp7rl, a7[i]);
    make(ca, "container", "a", exp7, a7p);
    for (int i = 0; i < 2; i++)
        make(ca, "function", i % 2 ? "a" : "b", exp8, a8[i]);
    make(ca, "container", "b", NULL, plain);
    for (int i = 0; i < 3; i++)
        make(cb, "container", i % 2 ? "a" : "b", exp7, b7[i]);
    assert_int_equal(dsec_pause(ca, a7p, &err), 0);

    dsec_list_opts o = {.labels = exp7};
    EXPECT_LIST(ca, &o, a7[0], a7[1], a7[2], a7[3], a7p);
    o = (dsec_list_opts){.labels = exp7rl};
    EXPECT_LIST(ca, &o, a7[0], a7[1], a7[2], a7[3]);
    o = (dsec_list_opts){.state = "paused"};
    EXPECT_LIST(ca, &o, a7p);
    o = (dsec_list_opts){.type = "function"};
    EXPECT_LIST(ca, &o, a8[0], a8[1]);
    o = (dsec_list_opts){.labels = exp8, .type = "container"};
    char none[16];
    list_ids(ca, &o, none, sizeof none);
    assert_string_equal(none, "");
    EXPECT_LIST(ca, NULL, a7[0], a7[1], a7[2], a7[3], a7p, a8[0], a8[1], plain);
    /* tenant b sees its own, and only those, whatever the filter */
    o = (dsec_list_opts){.labels = exp7};
    EXPECT_LIST(cb, &o, b7[0], b7[1], b7[2]);
    EXPECT_LIST(cb, NULL, b7[0], b7[1], b7[2]);

    /* the entries say what they are */
    dsec_list_page p;
    o = (dsec_list_opts){.state = "paused"};
    assert_int_equal(dsec_list_sandboxes(ca, &o, &p, &err), 0);
    assert_int_equal(p.n, 1);
    assert_string_equal(p.entries[0].node, "t40-a");
    assert_string_equal(p.entries[0].type, "container");
    assert_string_equal(p.entries[0].state, "paused");
    assert_int_equal(p.entries[0].nlabels, 1);
    assert_string_equal(p.entries[0].labels[0], "run=exp-7");
    assert_true(p.entries[0].created_ns > 0);
    assert_int_equal(p.nodes_asked, 2);
    assert_int_equal(p.nodes_answered, 2);
    dsec_list_page_release(&p);

    /* pages of 2 walk all 8 once, in order, and end with an empty cursor */
    char all[4096], walked[4096] = "";
    list_ids(ca, NULL, all, sizeof all);
    char cursor[DSEC_ID_MAX] = "";
    int pages = 0;
    for (;;) {
        o = (dsec_list_opts){.limit = 2, .cursor = cursor};
        assert_int_equal(dsec_list_sandboxes(ca, &o, &p, &err), 0);
        assert_true(p.n <= 2);
        for (size_t i = 0; i < p.n; i++)
            snprintf(walked + strlen(walked), sizeof walked - strlen(walked), "%s%s",
                     walked[0] ? "," : "", p.entries[i].id);
        pages++;
        snprintf(cursor, sizeof cursor, "%s", p.next_cursor);
        dsec_list_page_release(&p);
        if (cursor[0] == '\0')
            break;
        assert_true(pages < 10);
    }
    assert_string_equal(walked, all);
    assert_int_equal(pages, 4);

    /* bad input: refused before anything is sent, naming the field */
    static const char *const bad_label[] = {"foo", NULL};
    o = (dsec_list_opts){.labels = bad_label};
    assert_int_equal(dsec_list_sandboxes(ca, &o, &p, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "labels"));
    assert_non_null(strstr(err.msg, "foo"));
    o = (dsec_list_opts){.limit = DSEC_LIST_LIMIT_MAX + 1};
    assert_int_equal(dsec_list_sandboxes(ca, &o, &p, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "limit"));
    o = (dsec_list_opts){.cursor = "not an id"};
    assert_int_equal(dsec_list_sandboxes(ca, &o, &p, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "cursor"));
    o = (dsec_list_opts){.state = "sleeping"};
    assert_int_equal(dsec_list_sandboxes(ca, &o, &p, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "state"));

    /* a node that bypasses libdsec's checks is answered by the node, naming the field */
    dsec_bus *bus = NULL;
    assert_int_equal(dsec_bus_connect(&bus, &(dsec_bus_opts){.url = dsec_natsd_url(natsd)}, &err),
                     0);
    dsec_msg_list q = {.limit = 5, .state = "gone-fishing"};
    dsec_buf b;
    dsec_buf_init(&b);
    assert_int_equal(dsec_encode(&b, DSEC_MSG_LIST, &q, &err), 0);
    dsec_msg *reply = NULL;
    assert_int_equal(
        dsec_bus_request_sync(bus, "dsec.v1.t40a.list",
                              &(dsec_hdr){.type = "list", .schema = DSEC_SCHEMA_VERSION}, b.data,
                              b.len, 3000, &reply, &err),
        0);
    assert_string_equal(dsec_msg_type(reply), "error");
    dsec_decoder *d = dsec_decoder_new(NULL);
    dsec_msg_error e;
    assert_int_equal(
        dsec_decode(d, DSEC_MSG_ERROR, dsec_msg_data(reply), dsec_msg_len(reply), &e, &err), 0);
    assert_string_equal(e.field, "state");
    dsec_msg_free(reply);

    /* a node the scheduler knows of that never answers: the page says it may be short */
    dsec_msg_capacity cap = {.node = "t40-ghost",
                             .cell = "t40",
                             .seq = 1,
                             .full = true,
                             .cpu_free_milli = 1000,
                             .mem_free_mb = 1000,
                             .slots_free = 1,
                             .cpu_milli = 1000,
                             .memory_mb = 1000,
                             .slots = 1};
    assert_int_equal(dsec_encode(&b, DSEC_MSG_CAPACITY, &cap, &err), 0);
    assert_int_equal(
        dsec_bus_publish(bus, "dsec.v1.ctl.evt.t40.node.t40-ghost.capacity", NULL,
                         &(dsec_hdr){.type = "capacity", .schema = DSEC_SCHEMA_VERSION}, b.data,
                         b.len, &err),
        0);
    assert_int_equal(dsec_bus_flush(bus, 2000, &err), 0);
    wait_nodes(live.cell, 3);
    o = (dsec_list_opts){.labels = exp7, .timeout_ms = 700};
    assert_int_equal(dsec_list_sandboxes(ca, &o, &p, &err), 0);
    assert_int_equal(p.n, 5); /* what the others hold is still there */
    assert_int_equal(p.nodes_asked, 3);
    assert_int_equal(p.nodes_answered, 2);
    assert_int_equal(p.nmissing, 1);
    assert_string_equal(p.missing[0], "t40-ghost");
    dsec_list_page_release(&p);

    /* the ghost answers, one item at a time with more: pages of 4 still walk every id once,
     * its three first, never skipping what it has not sent yet */
    dsec_actor *ghost = NULL;
    assert_int_equal(dsec_actor_new(&ghost, bus, "ghost", &err), 0);
    assert_int_equal(dsec_actor_on(ghost, "dsec.v1.t40a.list", NULL, on_ghost_list, NULL, &err), 0);
    assert_int_equal(dsec_bus_flush(bus, 2000, &err), 0);
    char want[8192];
    snprintf(want, sizeof want, "%s,%s,%s,%s", ghost_ids[0], ghost_ids[1], ghost_ids[2], all);
    walked[0] = '\0';
    cursor[0] = '\0';
    pages = 0;
    for (;;) {
        o = (dsec_list_opts){.limit = 4, .cursor = cursor};
        assert_int_equal(dsec_list_sandboxes(ca, &o, &p, &err), 0);
        assert_int_equal(p.nmissing, 0);
        for (size_t i = 0; i < p.n; i++)
            snprintf(walked + strlen(walked), sizeof walked - strlen(walked), "%s%s",
                     walked[0] ? "," : "", p.entries[i].id);
        pages++;
        snprintf(cursor, sizeof cursor, "%s", p.next_cursor);
        dsec_list_page_release(&p);
        if (cursor[0] == '\0')
            break;
        assert_true(pages < 10);
    }
    assert_string_equal(walked, want);
    dsec_actor_free(ghost);
    dsec_decoder_free(d);
    dsec_buf_release(&b);
    dsec_bus_free(bus);
}

/* ---- events ------------------------------------------------------------------------------- */

struct seen {
    pthread_mutex_t mu;
    char lines[256][160]; /* "id state" */
    size_t n;
};

static void on_event(const dsec_sbx_event *ev, void *ud)
{
    struct seen *s = ud;
    pthread_mutex_lock(&s->mu);
    if (s->n < 256)
        snprintf(s->lines[s->n++], sizeof s->lines[0], "%s %s", ev->id, ev->state);
    pthread_mutex_unlock(&s->mu);
}

static bool saw(struct seen *s, const char *id, const char *state)
{
    char want[1024];
    snprintf(want, sizeof want, "%s %s", id, state);
    pthread_mutex_lock(&s->mu);
    bool found = false;
    for (size_t i = 0; i < s->n && !found; i++)
        found = strcmp(s->lines[i], want) == 0;
    pthread_mutex_unlock(&s->mu);
    return found;
}

static bool saw_id(struct seen *s, const char *id)
{
    size_t len = strlen(id);
    pthread_mutex_lock(&s->mu);
    bool found = false;
    for (size_t i = 0; i < s->n && !found; i++)
        found = strncmp(s->lines[i], id, len) == 0 && s->lines[i][len] == ' ';
    pthread_mutex_unlock(&s->mu);
    return found;
}

/* Removing by label (what `dsec rm --label` does: list every page, destroy each) removes
 * exactly the matches; each tenant's event stream has its own sandboxes' creates and
 * destroys and none of the other tenant's. */
static void rm_by_label_and_tenant_events(void **state)
{
    (void)state;
    static dsec_cell_conf c;
    conf_for(&c, "t41");
    add_node(&c, "t41-a", "a");
    add_node(&c, "t41-b", "b");
    live.conf = &c;
    dsec_err err;
    if (dsec_cell_start(&live.cell, &c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        fail_msg("cell: %s", err.msg);
    wait_nodes(live.cell, 2);
    dsec_client *ca = client("t41a"), *cb = client("t41b");
    static struct seen sa = {.mu = PTHREAD_MUTEX_INITIALIZER},
                       sb = {.mu = PTHREAD_MUTEX_INITIALIZER};
    sa.n = sb.n = 0;
    assert_int_equal(dsec_watch_events(ca, on_event, &sa, &live.watches[0], &err), 0);
    assert_int_equal(dsec_watch_events(cb, on_event, &sb, &live.watches[1], &err), 0);
    static const char *const exp7[] = {"run=exp-7", NULL};
    static const char *const exp8[] = {"run=exp-8", NULL};
    char a7[5][DSEC_ID_MAX], a8[DSEC_ID_MAX], b7[2][DSEC_ID_MAX];
    for (int i = 0; i < 5; i++)
        make(ca, "container", i % 2 ? "a" : "b", exp7, a7[i]);
    make(ca, "container", "a", exp8, a8);
    for (int i = 0; i < 2; i++)
        make(cb, "container", i % 2 ? "a" : "b", exp7, b7[i]);

    /* rm --label run=exp-7, pages of 2 */
    dsec_list_opts o = {.labels = exp7, .limit = 2};
    char doomed[16][DSEC_ID_MAX];
    size_t nd = 0;
    char cursor[DSEC_ID_MAX] = "";
    do {
        dsec_list_page p;
        o.cursor = cursor;
        assert_int_equal(dsec_list_sandboxes(ca, &o, &p, &err), 0);
        for (size_t i = 0; i < p.n && nd < 16; i++)
            snprintf(doomed[nd++], DSEC_ID_MAX, "%s", p.entries[i].id);
        snprintf(cursor, sizeof cursor, "%s", p.next_cursor);
        dsec_list_page_release(&p);
    } while (cursor[0] != '\0');
    assert_int_equal(nd, 5);
    for (size_t i = 0; i < nd; i++)
        assert_int_equal(dsec_destroy(ca, doomed[i], &err), 0);
    o = (dsec_list_opts){.labels = exp7};
    char got[1024];
    list_ids(ca, &o, got, sizeof got);
    assert_string_equal(got, "");
    EXPECT_LIST(ca, NULL, a8);
    EXPECT_LIST(cb, &o, b7[0], b7[1]);

    /* the events: a's creates and destroys reach a, b's reach b, never the other */
    bool all = false;
    for (int waited = 0; waited < 5000 && !all; waited += 50) {
        all = saw(&sa, a8, "running") && saw(&sb, b7[0], "running") && saw(&sb, b7[1], "running");
        for (int i = 0; i < 5; i++)
            all = all && saw(&sa, a7[i], "running") && saw(&sa, a7[i], "gone");
        if (!all)
            msleep(50);
    }
    assert_true(all);
    for (int i = 0; i < 5; i++)
        assert_false(saw_id(&sb, a7[i]));
    assert_false(saw_id(&sb, a8));
    for (int i = 0; i < 2; i++)
        assert_false(saw_id(&sa, b7[i]));
    assert_false(saw(&sb, b7[0], "gone"));
}

/* ---- labels outlive a restart -----------------------------------------------------------------
 */

/* A node manager in its own process, killed and started again: the sandboxes it re-adopts
 * from its journal are listed with their labels. */
static void labels_outlive_a_restart(void **state)
{
    (void)state;
    static dsec_cell_conf c;
    conf_for(&c, "t42");
    live.conf = &c;
    dsec_err err;
    if (dsec_cell_start(&live.cell, &c, DSEC_ROLE_SCHEDULER, &err) < 0)
        fail_msg("cell: %s", err.msg);
    char cfg[256], st[256];
    snprintf(cfg, sizeof cfg, "%s/t42.yaml", root);
    snprintf(st, sizeof st, "%s/t42-node", root);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    fprintf(f,
            "cell: t42\nstate_dir: %s\nbus: {url: \"%s\"}\n"
            "reports: {capacity_ms: 20, full_ms: 300, heartbeat_ms: 100, reap_ms: 100}\n"
            "nodes:\n  - name: t42-n\n    slots: 20\n    types: [sim]\n    sim: {time_scale: 0}\n",
            st, dsec_natsd_url(natsd));
    fclose(f);
    for (int round = 0; round < 2; round++) {
        live.pid = fork();
        if (live.pid == 0) {
            execl(dsecd_path, "dsecd", "--config", cfg, "--roles", "node", (char *)NULL);
            _exit(127);
        }
        wait_nodes(live.cell, 1);
        if (round == 1)
            break;
        dsec_client *cl = client("t42");
        /* labels with the journal's separators in them, and a long set */
        static const char *const labels[] = {"run=exp-7",
                                             "odd=a\x1f"
                                             "b\x1e"
                                             "c",
                                             "eq=x=y", NULL};
        dsec_create_spec spec = {.type = "sim", .labels = labels};
        dsec_sandbox_info info;
        assert_int_equal(dsec_create(cl, &spec, &info, &err), 0);
        kill(live.pid, SIGKILL);
        waitpid(live.pid, NULL, 0);
        live.pid = 0;
    }
    dsec_client *cl = live.clients[0];
    static const char *const want[] = {"odd=a\x1f"
                                       "b\x1e"
                                       "c",
                                       NULL};
    dsec_list_opts o = {.labels = want};
    dsec_list_page p = {0};
    int rc = -1;
    for (int i = 0; i < 250; i++) { /* until the restarted node answers with it */
        rc = dsec_list_sandboxes(cl, &o, &p, &err);
        if (rc == 0 && p.n == 1 && p.nmissing == 0)
            break;
        if (rc == 0)
            dsec_list_page_release(&p);
        msleep(20);
    }
    assert_int_equal(rc, 0);
    assert_int_equal(p.n, 1);
    assert_int_equal(p.entries[0].nlabels, 3);
    assert_string_equal(p.entries[0].labels[0], "run=exp-7");
    assert_string_equal(p.entries[0].labels[1], "odd=a\x1f"
                                                "b\x1e"
                                                "c");
    assert_string_equal(p.entries[0].labels[2], "eq=x=y");
    dsec_list_page_release(&p);
}

/* ---- cells ---------------------------------------------------------------------------------- */

/* Two cells: one listing waits for both cells' schedulers (each names the other) and then
 * for every node of both, and merges their pages. */
static void list_spans_cells(void **state)
{
    (void)state;
    static dsec_cell_conf c1, c2;
    conf_for(&c1, "t43x");
    conf_for(&c2, "t43y");
    add_node(&c1, "t43x-n", "a");
    add_node(&c2, "t43y-n", "a");
    live.conf = &c1;
    live.conf2 = &c2;
    dsec_err err;
    if (dsec_cell_start(&live.cell, &c1, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0 ||
        dsec_cell_start(&live.cell2, &c2, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        fail_msg("cell: %s", err.msg);
    wait_nodes(live.cell, 1);
    wait_nodes(live.cell2, 1);
    dsec_client *cl = client("t43");
    static const char *const run[] = {"run=exp-9", NULL};
    char ids[4][DSEC_ID_MAX];
    for (int i = 0; i < 4; i++) {
        dsec_create_spec spec = {
            .type = "container", .labels = run, .cell = i % 2 ? "t43y" : "t43x"};
        dsec_sandbox_info info;
        if (dsec_create(cl, &spec, &info, &err) < 0)
            fail_msg("create: %s", err.msg);
        assert_string_equal(info.node, i % 2 ? "t43y-n" : "t43x-n");
        snprintf(ids[i], DSEC_ID_MAX, "%s", info.id);
    }
    msleep(400); /* each scheduler has heard the other cell's summary */
    dsec_list_opts o = {.labels = run};
    for (int k = 0; k < 5; k++) { /* every time: both cells, both nodes */
        dsec_list_page p;
        assert_int_equal(dsec_list_sandboxes(cl, &o, &p, &err), 0);
        assert_int_equal(p.nodes_asked, 2);
        assert_int_equal(p.nodes_answered, 2);
        assert_int_equal(p.nmissing, 0);
        assert_int_equal(p.n, 4);
        dsec_list_page_release(&p);
    }
    EXPECT_LIST(cl, &o, ids[0], ids[1], ids[2], ids[3]);
}

int main(int argc, char **argv)
{
    dsecd_path = argc > 1 ? argv[1] : "./dsecd";
    srandom((unsigned)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(list_filters_pages_and_tenants, test_teardown),
        cmocka_unit_test_teardown(rm_by_label_and_tenant_events, test_teardown),
        cmocka_unit_test_teardown(labels_outlive_a_restart, test_teardown),
        cmocka_unit_test_teardown(list_spans_cells, test_teardown),
    };
    if (getenv("DSEC_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("DSEC_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
