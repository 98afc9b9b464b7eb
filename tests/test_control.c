/* test_control.c - the control plane end to end on a real nats-server: placement, retries, cells,
 * reaping, idempotency, re-adoption, draining, bad input. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <inttypes.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/cell.h"
#include "actors/wire.h"
#include "bus/bus.h"
#include "tests/fixture.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tests/test_util.h"

static dsec_natsd *natsd;

/* What a test started, stopped by the teardown even when an assertion
 * failed half-way (a leaked scheduler would join the next test's queue group). */
static struct {
    dsec_cell *cells[4];
    dsec_cell_conf *confs[4];
    dsec_client *clients[4];
    pid_t pids[2];
} live;

static int test_teardown(void **state)
{
    for (int i = 0; i < 2; i++)
        if (live.pids[i] > 0) {
            kill(live.pids[i], SIGCONT);
            kill(live.pids[i], SIGKILL);
            waitpid(live.pids[i], NULL, 0);
        }
    for (int i = 0; i < 4; i++) {
        dsec_client_free(live.clients[i]);
        dsec_cell_stop(live.cells[i], true);
        if (live.confs[i])
            dsec_cell_conf_release(live.confs[i]);
    }
    memset(&live, 0, sizeof live);
    return 0;
}

static void track_cell(dsec_cell *c, dsec_cell_conf *conf)
{
    for (int i = 0; i < 4; i++)
        if (live.cells[i] == NULL) {
            live.cells[i] = c;
            live.confs[i] = conf;
            return;
        }
}

static void track_client(dsec_client *c)
{
    for (int i = 0; i < 4; i++)
        if (live.clients[i] == NULL) {
            live.clients[i] = c;
            return;
        }
}

static void track_pid(pid_t pid)
{
    live.pids[live.pids[0] > 0 ? 1 : 0] = pid;
}
static char root[64];
static const char *dsecd_path;

static int group_setup(void **state)
{
    return dsec_test_server_start("dsec-control", false, &natsd, root, sizeof root);
}

static int group_teardown(void **state)
{
    return dsec_test_server_stop(natsd, root);
}

/* A cell named name on the shared server with fast reports. */
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
    c->dead_after_ms = 600;
}

static void add_node(dsec_cell_conf *c, const char *name, uint64_t slots, const char *const *types,
                     const char *label)
{
    dsec_err err;
    assert_int_equal(
        dsec_cell_conf_add_sim_nodes(c, name, 1, 64000, 65536, slots, types, "0", &err), 0);
    dsec_cell_node *n = &c->nodes[c->nnodes - 1];
    snprintf(n->name, sizeof n->name, "%s", name);
    if (label != NULL) {
        n->labels[0].key = dsec_strdup("zone");
        n->labels[0].value = dsec_strdup(label);
        n->nlabels = 1;
    }
}

static dsec_cell *start(dsec_cell_conf *c, int roles)
{
    dsec_cell *cell = NULL;
    dsec_err err;
    if (dsec_cell_start(&cell, c, roles, &err) < 0)
        fail_msg("cell %s: %s", c->cell, err.msg);
    track_cell(cell, c);
    return cell;
}

static dsec_client *client(const char *tenant)
{
    dsec_client *cl = NULL;
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = tenant, .timeout_ms = 3000};
    dsec_err err;
    if (dsec_client_connect(&cl, &o, &err) < 0)
        fail_msg("client: %s", err.msg);
    track_client(cl);
    return cl;
}

static int create(dsec_client *cl, dsec_create_spec spec, dsec_sandbox_info *info, dsec_err *err)
{
    int rc = dsec_create(cl, &spec, info, err);
    if (rc < 0)
        fprintf(stderr, "  (create: %s: %s)\n", dsec_code_name(err->code), err->msg);
    return rc;
}

/* ---- placement ---------------------------------------------------------------- */

static void lightest_type_labels_and_errors(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t1");
    static const char *const ta[] = {"function", "container", NULL};
    static const char *const tb[] = {"container", "microvm", NULL};
    add_node(&c, "t1-a", 100, ta, "a");
    add_node(&c, "t1-b", 100, tb, "b");
    start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_client *cl = client("t1");
    dsec_sandbox_info info;
    dsec_err err;

    assert_int_equal(create(cl, (dsec_create_spec){.cell = "t1"}, &info, &err), 0);
    assert_string_equal(info.type, "function"); /* the lightest type */
    assert_string_equal(info.node, "t1-a");

    static const char *const kernel[] = {"own_kernel", NULL};
    assert_int_equal(create(cl, (dsec_create_spec){.requires = kernel}, &info, &err), 0);
    assert_string_equal(info.type, "microvm");
    assert_string_equal(info.node, "t1-b");

    static const char *const zone_b[] = {"zone=b", NULL};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(
            create(cl, (dsec_create_spec){.type = "container", .affinity = zone_b}, &info, &err),
            0);
        assert_string_equal(info.node, "t1-b");
    }

    assert_int_equal(create(cl, (dsec_create_spec){.type = "vm"}, &info, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    assert_int_equal(create(cl, (dsec_create_spec){.type = "banana"}, &info, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "banana"));
    static const char *const zone_c[] = {"zone=c", NULL};
    assert_int_equal(
        create(cl, (dsec_create_spec){.type = "container", .affinity = zone_c}, &info, &err), -1);
    assert_int_equal(err.code, DSEC_E_CAPACITY);
    assert_non_null(strstr(err.msg, "zone"));
    static const char *const bogus[] = {"wings", NULL};
    assert_int_equal(create(cl, (dsec_create_spec){.requires = bogus}, &info, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "wings"));
}

static void capacity_is_respected(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t2");
    static const char *const t[] = {"sim", NULL};
    add_node(&c, "t2-a", 3, t, NULL);
    dsec_cell *cell = start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_client *cl = client("t2");
    dsec_sandbox_info info[4];
    dsec_err err;
    for (int i = 0; i < 3; i++)
        assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &info[i], &err), 0);
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &info[3], &err), -1);
    assert_true(err.code == DSEC_E_CAPACITY || err.code == DSEC_E_REFUSED);
    assert_true(dsec_code_retry_safe(err.code));
    dsec_node_stats ns;
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &ns);
    assert_int_equal(ns.live, 3);
    /* memory: a request larger than any node never lands */
    assert_int_equal(
        create(cl, (dsec_create_spec){.type = "sim", .memory_mb = 1u << 20}, &info[3], &err), -1);
    assert_int_equal(err.code, DSEC_E_CAPACITY);
    assert_non_null(strstr(err.msg, "memory"));
    /* freeing a slot lets the next create in once the node has reported it */
    assert_int_equal(dsec_destroy(cl, info[0].id, &err), 0);
    int rc = -1;
    for (int i = 0; i < 100 && rc < 0; i++) {
        rc = create(cl, (dsec_create_spec){.type = "sim"}, &info[3], &err);
        if (rc < 0)
            msleep(20);
    }
    assert_int_equal(rc, 0);
}

/* Fill node A behind the scheduler's back (reports are slow in this cell):
 * the scheduler still believes A is empty, A refuses, the retry lands on B. */
static void refusal_is_retried_elsewhere(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t3");
    c.capacity_ms = 60000;
    c.full_ms = 60000;
    c.dead_after_ms = 120000;
    static const char *const t[] = {"sim", NULL};
    add_node(&c, "t3-a", 2, t, NULL);
    add_node(&c, "t3-b", 2, t, NULL);
    dsec_cell *cell = start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_bus *bus = dsec_cell_bus(cell);
    dsec_err err;
    for (int i = 0; i < 2; i++) {
        char rid[32];
        snprintf(rid, sizeof rid, "direct-%d", i);
        dsec_msg_place p = {.c = {.req_id = rid, .tenant = "t3", .type = "sim"},
                            .reply_to = "test.sink",
                            .attempt = 1};
        assert_int_equal(dsec_wire_send(NULL, bus, "dsec.v1.ctl.place.t3-a", NULL, DSEC_MSG_PLACE,
                                        &p, rid, &err),
                         0);
    }
    dsec_node_stats ns = {0};
    for (int i = 0; i < 200 && ns.live < 2; i++) {
        msleep(10);
        dsec_node_stats_get(dsec_cell_node_at(cell, 0), &ns);
    }
    assert_int_equal(ns.live, 2);

    dsec_client *cl = client("t3");
    dsec_sandbox_info info;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &info, &err), 0);
        assert_string_equal(info.node, "t3-b");
    }
    dsec_sched_stats ss;
    dsec_sched_stats_get(dsec_cell_sched_at(cell, 0), &ss);
    assert_true(ss.retried >= 1);
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &ns);
    assert_true(ns.refused >= 1);
    /* now both are full: the answer says the placement was refused, with why */
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &info, &err), -1);
    assert_true(err.code == DSEC_E_REFUSED || err.code == DSEC_E_CAPACITY);
    assert_non_null(strstr(err.msg, "slot"));
}

/* Disk is admitted like memory: each sandbox holds its disk_mb (the cell default when
 * it names none) from the node's disk less the reserve, which no sandbox gets. */
static void disk_is_admitted_above_a_reserve(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t11");
    c.default_disk_mb = 1;
    static const char *const t[] = {"sim", NULL};
    add_node(&c, "t11-a", 100, t, NULL);
    c.nodes[0].disk_mb = 1000;
    c.nodes[0].disk_reserve_mb = 200;
    dsec_cell *cell = start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_node *node = dsec_cell_node_at(cell, 0);
    dsec_client *cl = client("t11");
    dsec_sandbox_info a, b, x;
    dsec_err err;
    dsec_node_stats ns;
    dsec_node_stats_get(node, &ns);
    assert_int_equal(ns.disk_free_mb, 800);

    /* no disk_mb: the cell default, held by the node and enforced by the backend */
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &a, &err), 0);
    dsec_node_stats_get(node, &ns);
    assert_int_equal(ns.disk_free_mb, 799);
    static uint8_t big[1536 * 1024];
    assert_int_equal(dsec_file_write(cl, a.id, "/work/small", big, 512 * 1024, 0644, &err), 0);
    assert_int_equal(dsec_file_write(cl, a.id, "/work/big", big, sizeof big, 0644, &err), -1);

    /* more than is free: the scheduler sees it, and the answer names disk */
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim", .disk_mb = 800}, &x, &err), -1);
    assert_int_equal(err.code, DSEC_E_CAPACITY);
    assert_string_equal(err.msg, "no node in cell t11 has 800 MB of disk free (best: 799)");
    /* all that is free fits; then the reserve is left, and nothing more gets in */
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim", .disk_mb = 799}, &b, &err), 0);
    dsec_node_stats_get(node, &ns);
    assert_int_equal(ns.disk_free_mb, 0);
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim", .disk_mb = 1}, &x, &err), -1);
    assert_string_equal(err.msg, "no node in cell t11 has 1 MB of disk free (best: 0)");
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &x, &err), -1);
    assert_string_equal(err.msg, "no node in cell t11 has 1 MB of disk free (best: 0)");
    dsec_node_stats_get(node, &ns);
    assert_int_equal(ns.refused, 0); /* none of them reached the node */
    /* fork children hold their parent's disk_mb each */
    char **kids = NULL;
    size_t nkids = 0;
    assert_int_equal(dsec_fork(cl, a.id, 1, &kids, &nkids, &err), -1);
    assert_int_equal(err.code, DSEC_E_CAPACITY);
    assert_non_null(strstr(err.msg, "MB of disk"));

    /* a destroy gives the disk back */
    assert_int_equal(dsec_destroy(cl, b.id, &err), 0);
    dsec_node_stats_get(node, &ns);
    assert_int_equal(ns.disk_free_mb, 799);
    assert_int_equal(dsec_fork(cl, a.id, 2, &kids, &nkids, &err), 0);
    dsec_strv_free(kids, nkids);
    dsec_node_stats_get(node, &ns);
    assert_int_equal(ns.disk_free_mb, 797);
    (void)state;
}

/* Function sandboxes, many and small, get defaults.function_disk_mb; other types defaults.disk_mb.
 */
static void function_sandboxes_get_their_own_default_disk(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t14");
    c.default_disk_mb = 100;
    c.default_function_disk_mb = 7;
    static const char *const t[] = {"function", "sim", NULL};
    add_node(&c, "t14-a", 10, t, NULL);
    c.nodes[0].disk_mb = 1000;
    c.nodes[0].disk_reserve_mb = 100;
    dsec_cell *cell = start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_client *cl = client("t14");
    dsec_sandbox_info info;
    dsec_err err;
    dsec_node_stats ns;
    assert_int_equal(create(cl, (dsec_create_spec){.type = "function"}, &info, &err), 0);
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &ns);
    assert_int_equal(ns.disk_free_mb, 893);
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &info, &err), 0);
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &ns);
    assert_int_equal(ns.disk_free_mb, 793);
    assert_int_equal(create(cl, (dsec_create_spec){.type = "function", .disk_mb = 93}, &info, &err),
                     0);
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &ns);
    assert_int_equal(ns.disk_free_mb, 700);
    (void)state;
}

/* A node whose disk is all reserve would admit no sandbox: it does not start, and says why. */
static void disk_no_more_than_the_reserve_is_refused(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t13");
    static const char *const t[] = {"sim", NULL};
    add_node(&c, "t13-a", 10, t, NULL);
    c.nodes[0].disk_mb = 2048;
    dsec_cell *cell = NULL;
    dsec_err err;
    assert_int_equal(dsec_cell_start(&cell, &c, DSEC_ROLE_NODE, &err), -1);
    assert_null(cell);
    assert_int_equal(err.code, DSEC_E_CONFIG);
    assert_non_null(strstr(err.msg, "disk_mb 2048 is not more than disk_reserve_mb 2048"));
    dsec_cell_conf_release(&c);
    (void)state;
}

/* A restarted node counts the disk of the sandboxes it re-adopts (journal records). */
static void readopted_sandboxes_hold_their_disk(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t12");
    static const char *const t[] = {"sim", NULL};
    add_node(&c, "t12-a", 100, t, NULL);
    c.nodes[0].disk_mb = 1000;
    c.nodes[0].disk_reserve_mb = 100;
    dsec_cell *cell = NULL;
    dsec_err err;
    if (dsec_cell_start(&cell, &c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        fail_msg("cell t12: %s", err.msg);
    dsec_client *cl = client("t12");
    dsec_sandbox_info a;
    int rc = create(cl, (dsec_create_spec){.type = "sim", .disk_mb = 300}, &a, &err);
    dsec_cell_stop(cell, false); /* sandboxes stay, to be re-adopted */
    assert_int_equal(rc, 0);
    cell = start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_node_stats ns;
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &ns);
    assert_int_equal(ns.adopted, 1);
    assert_int_equal(ns.disk_free_mb, 600);
    /* the restarted node's reports count them too: the scheduler answers */
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim", .disk_mb = 601}, &a, &err), -1);
    assert_int_equal(err.code, DSEC_E_CAPACITY);
    assert_string_equal(err.msg, "no node in cell t12 has 601 MB of disk free (best: 600)");
    (void)state;
}

/* What a node's capacity reports last said, for the disk tests. */
static struct {
    pthread_mutex_t mu;
    uint64_t reports, full, disk_free_mb, disk_mb;
} seen_cap = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void on_capacity(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_msg_capacity c;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CAPACITY, dsec_msg_data(m), dsec_msg_len(m), &c,
                    &err) < 0)
        return;
    pthread_mutex_lock(&seen_cap.mu);
    seen_cap.reports++;
    seen_cap.disk_free_mb = c.disk_free_mb;
    if (c.full) {
        seen_cap.full++;
        seen_cap.disk_mb = c.disk_mb;
    }
    pthread_mutex_unlock(&seen_cap.mu);
    (void)a, (void)ud;
}

/* Wait for a capacity report saying free (and a full one saying total). */
static bool capacity_says(uint64_t free_mb, uint64_t total_mb)
{
    for (int i = 0; i < 300; i++) {
        pthread_mutex_lock(&seen_cap.mu);
        bool ok =
            seen_cap.full > 0 && seen_cap.disk_free_mb == free_mb && seen_cap.disk_mb == total_mb;
        pthread_mutex_unlock(&seen_cap.mu);
        if (ok)
            return true;
        msleep(10);
    }
    return false;
}

struct rollout_arg {
    dsec_client *cl;
    dsec_sandbox_info info;
    dsec_err err;
    int rc;
};

static void *create_rollout(void *p)
{
    struct rollout_arg *r = p;
    r->rc = create(r->cl, (dsec_create_spec){.type = "sim", .disk_mb = 700, .cls = "rollout"},
                   &r->info, &r->err);
    return NULL;
}

/* Placement sees disk like memory: capacity reports carry it, a node short of it
 * is skipped (no refusal), a create that fits no node is answered capacity without
 * going from node to node, a refusal for room carries the node's free disk, and a
 * rollout waits for disk. */
static void placement_sees_disk(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t13");
    static const char *const t[] = {"sim", NULL};
    add_node(&c, "t13-a", 100, t, NULL);
    add_node(&c, "t13-b", 100, t, NULL);
    c.nodes[0].disk_mb = 2000;
    c.nodes[0].disk_reserve_mb = 200; /* 1800 for sandboxes */
    c.nodes[1].disk_mb = 1000;
    c.nodes[1].disk_reserve_mb = 700; /* 300 */
    dsec_cell *cell = start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_err err;
    dsec_actor *spy = NULL;
    assert_int_equal(dsec_actor_new(&spy, dsec_cell_bus(cell), "t13-spy", &err), 0);
    assert_int_equal(dsec_actor_on(spy, "dsec.v1.ctl.evt.t13.node.t13-a.capacity", NULL,
                                   on_capacity, NULL, &err),
                     0);
    assert_true(capacity_says(1800, 1800));
    dsec_client *cl = client("t13");
    dsec_sandbox_info info[3];

    /* alike but for disk: each lands on the node with room, none is refused */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(
            create(cl, (dsec_create_spec){.type = "sim", .disk_mb = 400}, &info[i], &err), 0);
        assert_string_equal(info[i].node, "t13-a");
    }
    dsec_node_stats na, nb;
    dsec_node_stats_get(dsec_cell_node_at(cell, 1), &nb);
    assert_int_equal(nb.refused, 0);       /* t13-b was never tried */
    assert_true(capacity_says(600, 1800)); /* every report carries the free disk */

    /* more than any node has: capacity at once, from the scheduler */
    dsec_sandbox_info x;
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim", .disk_mb = 2000}, &x, &err), -1);
    assert_int_equal(err.code, DSEC_E_CAPACITY);
    assert_string_equal(err.msg, "no node in cell t13 has 2000 MB of disk free (best: 600)");
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &na);
    dsec_node_stats_get(dsec_cell_node_at(cell, 1), &nb);
    assert_int_equal(na.refused, 0);
    assert_int_equal(nb.refused, 0);
    dsec_sched_stats ss;
    dsec_sched_stats_get(dsec_cell_sched_at(cell, 0), &ss);
    assert_int_equal(ss.retried, 0);

    /* a node refusing for disk tells what it has left */
    dsec_msg_place p = {
        .c = {.req_id = "t13-direct", .tenant = "t13", .type = "sim", .disk_mb = 500},
        .reply_to = "test.sink",
        .attempt = 1};
    dsec_buf b;
    dsec_buf_init(&b);
    assert_int_equal(dsec_encode(&b, DSEC_MSG_PLACE, &p, &err), 0);
    dsec_msg *back = NULL;
    assert_int_equal(
        dsec_bus_request_sync(dsec_cell_bus(cell), "dsec.v1.ctl.place.t13-b",
                              &(dsec_hdr){.type = "place", .schema = DSEC_SCHEMA_VERSION}, b.data,
                              b.len, 2000, &back, &err),
        0);
    dsec_buf_release(&b);
    dsec_msg_place r;
    assert_int_equal(dsec_decode(dsec_wire_decoder(), DSEC_MSG_PLACE, dsec_msg_data(back),
                                 dsec_msg_len(back), &r, &err),
                     0);
    assert_string_equal(r.short_of, "disk");
    assert_int_equal(r.free_disk_mb, 300);
    assert_int_not_equal(r.free_seq, 0);
    dsec_msg_free(back);

    /* a rollout waits for disk, and is placed when a node has it */
    struct rollout_arg ra = {.cl = cl, .rc = -2};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, create_rollout, &ra), 0);
    for (int i = 0; i < 200; i++) {
        dsec_sched_stats_get(dsec_cell_sched_at(cell, 0), &ss);
        if (ss.waiting == 1)
            break;
        msleep(10);
    }
    assert_int_equal(ss.waiting, 1);
    assert_int_equal(dsec_destroy(cl, info[0].id, &err), 0);
    pthread_join(th, NULL);
    assert_int_equal(ra.rc, 0);
    assert_string_equal(ra.info.node, "t13-a");
    dsec_actor_free(spy);
    (void)state;
}

static void two_cells_fan_out_and_fill_over(void **state)
{
    static dsec_cell_conf c1, c2;
    conf_for(&c1, "c1");
    conf_for(&c2, "c2");
    static const char *const t[] = {"sim", NULL};
    add_node(&c1, "c1-n", 1, t, NULL);
    add_node(&c2, "c2-n", 2, t, NULL);
    dsec_cell *cell1 = start(&c1, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    start(&c2, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    msleep(400); /* a few summary periods */
    dsec_client *cl = client("fan");
    dsec_sandbox_info info, on_c2[2];
    dsec_err err;
    int on1 = 0, on2 = 0;
    for (int i = 0; i < 3; i++) {
        if (create(cl, (dsec_create_spec){.type = "sim"}, &info, &err) < 0)
            fail_msg("create %d: %s", i, err.msg);
        if (strcmp(info.cell, "c1") == 0)
            on1++;
        else if (strcmp(info.cell, "c2") == 0 && on2 < 2)
            on_c2[on2++] = info;
        msleep(150); /* let the summaries catch up with each fill */
    }
    assert_int_equal(on1, 1);
    assert_int_equal(on2, 2);
    /* everything is full: the answer is a capacity error */
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &info, &err), -1);
    assert_true(err.code == DSEC_E_CAPACITY || err.code == DSEC_E_REFUSED);
    /* a request for one cell stays there */
    assert_int_equal(dsec_destroy(cl, on_c2[0].id, &err), 0);
    msleep(400);
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim", .cell = "c1"}, &info, &err), -1);
    assert_true(err.code == DSEC_E_CAPACITY || err.code == DSEC_E_REFUSED);
    /* forwarding, deterministically: an any-cell request that reaches full
     * c1's schedulers goes on to c2, which has room again */
    dsec_sched_stats before, after;
    dsec_sched_stats_get(dsec_cell_sched_at(cell1, 0), &before);
    dsec_msg_create m = {.req_id = "fan-forward-1", .type = "sim"};
    dsec_buf b;
    dsec_buf_init(&b);
    assert_int_equal(dsec_encode(&b, DSEC_MSG_CREATE, &m, &err), 0);
    dsec_msg *reply = NULL;
    dsec_hdr h = {.type = "create", .schema = 1, .req_id = m.req_id};
    assert_int_equal(dsec_bus_request_sync(dsec_cell_bus(cell1), "dsec.v1.fan.create.c1", &h,
                                           b.data, b.len, 3000, &reply, &err),
                     0);
    dsec_buf_release(&b);
    assert_string_equal(dsec_msg_type(reply), "created");
    dsec_decoder *d = dsec_decoder_new(NULL);
    dsec_msg_created cr;
    assert_int_equal(
        dsec_decode(d, DSEC_MSG_CREATED, dsec_msg_data(reply), dsec_msg_len(reply), &cr, &err), 0);
    assert_string_equal(cr.cell, "c2");
    dsec_decoder_free(d);
    dsec_msg_free(reply);
    dsec_sched_stats_get(dsec_cell_sched_at(cell1, 0), &after);
    assert_int_equal(after.forwarded, before.forwarded + 1);
}

/* ---- lifecycle ------------------------------------------------------------------- */

static void lifetime_and_idle_reclaim(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t5");
    static const char *const t[] = {"sim", NULL};
    add_node(&c, "t5-a", 10, t, NULL);
    dsec_cell *cell = start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_client *cl = client("t5");
    dsec_sandbox_info ttl, idle, busy;
    dsec_err err;
    assert_int_equal(
        create(cl, (dsec_create_spec){.type = "sim", .ttl_s = 1, .idle_s = 60}, &ttl, &err), 0);
    assert_int_equal(
        create(cl, (dsec_create_spec){.type = "sim", .ttl_s = 60, .idle_s = 1}, &idle, &err), 0);
    assert_int_equal(
        create(cl, (dsec_create_spec){.type = "sim", .ttl_s = 60, .idle_s = 2}, &busy, &err), 0);
    const char *argv[] = {"echo", "hi", NULL};
    /* keep one busy for 5 s, past its 2 s idle_s, with a command every 0.5 s: a loaded
     * machine (make check's) may stretch a gap, not to 2 s */
    for (int i = 0; i < 10; i++) {
        dsec_exec_reply r;
        assert_int_equal(dsec_exec(cl, busy.id, &(dsec_exec_opts){.argv = argv}, &r, &err), 0);
        dsec_exec_reply_release(&r);
        msleep(500);
    }
    assert_int_equal(dsec_wait_state(cl, ttl.id, "gone", 3000, &err), 0);
    assert_int_equal(dsec_wait_state(cl, idle.id, "gone", 3000, &err), 0);
    dsec_sandbox_info st;
    assert_int_equal(dsec_status(cl, busy.id, &st, &err), 0);
    assert_string_equal(st.state, "running");
    dsec_node_stats ns;
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &ns);
    assert_int_equal(ns.reaped_ttl, 1);
    assert_int_equal(ns.reaped_idle, 1);
}

struct retried {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, status;
    dsec_sandbox_info info;
    dsec_err err;
};

static void on_retried(int status, const dsec_sandbox_info *info, const dsec_err *err, void *ud)
{
    struct retried *r = ud;
    pthread_mutex_lock(&r->mu);
    r->status = status;
    if (info != NULL)
        r->info = *info;
    if (err != NULL)
        r->err = *err;
    r->done = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* The spec is borrowed only for dsec_create_async: a retry after the first
 * attempt timed out must not read the caller's (since freed) strings. With
 * direct callbacks the timeouts and the resends run on the bus's timer
 * thread instead of a callback thread, and must do the same. */
static void async_retry_check(const char *tag, bool direct)
{
    static dsec_cell_conf c;
    conf_for(&c, tag);
    static const char *const t[] = {"container", NULL};
    dsec_err err;
    char node[32];
    snprintf(node, sizeof node, "%s-a", tag);
    /* sim containers that take ~1 s to start: the first 400 ms attempt times out */
    assert_int_equal(dsec_cell_conf_add_sim_nodes(&c, node, 1, 64000, 65536, 10, t, "25", &err), 0);
    dsec_cell *cell = start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_client *cl = NULL;
    dsec_client_opts o = {.url = dsec_natsd_url(natsd),
                          .tenant = tag,
                          .timeout_ms = 400,
                          .retries = 6,
                          .direct_callbacks = direct};
    if (dsec_client_connect(&cl, &o, &err) < 0)
        fail_msg("client: %s", err.msg);
    track_client(cl);
    char *type = dsec_strdup("container"), *rollout = dsec_strdup("rollout-retry"),
         *label = dsec_strdup("k=v");
    const char **labels = dsec_calloc(2, sizeof *labels);
    labels[0] = label;
    dsec_create_spec spec = {
        .type = type, .rollout_id = rollout, .labels = labels, .memory_mb = 64};
    struct retried r = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    assert_int_equal(dsec_create_async(cl, &spec, on_retried, &r, &err), 0);
    /* the caller's strings go away at once, overwritten first */
    memset(type, 'X', strlen(type));
    memset(rollout, 0xff, strlen(rollout));
    dsec_free(type);
    dsec_free(rollout);
    dsec_free(label);
    dsec_free(labels);
    pthread_mutex_lock(&r.mu);
    while (!r.done)
        pthread_cond_wait(&r.cv, &r.mu);
    pthread_mutex_unlock(&r.mu);
    if (r.status < 0)
        fail_msg("create: %s", r.err.msg);
    assert_string_equal(r.info.type, "container");
    dsec_node_stats ns;
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &ns);
    assert_int_equal(ns.created, 1); /* the retries found the first attempt's sandbox */
}

static void async_retry_outlives_the_callers_spec(void **state)
{
    async_retry_check("t11", false);
}

static void async_retry_direct_callbacks(void **state)
{
    async_retry_check("t12", true);
}

static void idempotent_create_under_retries(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t6");
    static const char *const t[] = {"sim", NULL};
    add_node(&c, "t6-a", 50, t, NULL);
    add_node(&c, "t6-b", 50, t, NULL);
    dsec_cell *cell = start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_client *cl = client("t6");
    dsec_sandbox_info first, again;
    dsec_err err;
    assert_int_equal(
        create(cl, (dsec_create_spec){.type = "sim", .req_id = "job-7-step-1"}, &first, &err), 0);
    assert_false(first.existing);
    assert_int_equal(
        create(cl, (dsec_create_spec){.type = "sim", .req_id = "job-7-step-1"}, &again, &err), 0);
    /* the same id whichever node a first attempt would land on next... */
    if (strcmp(again.id, first.id) != 0) {
        /* ...unless it went to the other node: only a retry (which carries
         * retry > 0) is checked across the cell; see below */
        assert_string_not_equal(again.node, first.node);
    } else {
        assert_true(again.existing);
    }
    /* a client retry (retry > 0) finds the sandbox wherever it is */
    for (int i = 0; i < 6; i++) {
        dsec_msg_create m = {.req_id = "job-7-step-1", .type = "sim", .retry = 1};
        dsec_buf b;
        dsec_buf_init(&b);
        assert_int_equal(dsec_encode(&b, DSEC_MSG_CREATE, &m, &err), 0);
        dsec_msg *reply = NULL;
        dsec_hdr h = {.type = "create", .schema = 1, .req_id = "job-7-step-1"};
        assert_int_equal(dsec_bus_request_sync(dsec_cell_bus(cell), "dsec.v1.t6.create", &h, b.data,
                                               b.len, 3000, &reply, &err),
                         0);
        assert_string_equal(dsec_msg_type(reply), "created");
        dsec_decoder *d = dsec_decoder_new(NULL);
        dsec_msg_created cr;
        assert_int_equal(
            dsec_decode(d, DSEC_MSG_CREATED, dsec_msg_data(reply), dsec_msg_len(reply), &cr, &err),
            0);
        assert_true(cr.existing);
        assert_true(strcmp(cr.id, first.id) == 0 || strcmp(cr.id, again.id) == 0);
        dsec_decoder_free(d);
        dsec_msg_free(reply);
        dsec_buf_release(&b);
    }
    dsec_node_stats a, bb;
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &a);
    dsec_node_stats_get(dsec_cell_node_at(cell, 1), &bb);
    assert_true(a.created + bb.created <= 2);
}

static void sandbox_operations(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t7");
    static const char *const t[] = {"sim", NULL};
    add_node(&c, "t7-a", 20, t, NULL);
    dsec_cell *cell = start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_client *cl = client("t7");
    dsec_sandbox_info sb;
    dsec_err err;
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &sb, &err), 0);
    const char *argv[] = {"cat", NULL};
    dsec_exec_reply r;
    assert_int_equal(
        dsec_exec(cl, sb.id,
                  &(dsec_exec_opts){.argv = argv, .stdin_data = "in\0put", .stdin_len = 6}, &r,
                  &err),
        0);
    assert_int_equal(r.out_len, 6);
    assert_memory_equal(r.out, "in\0put", 6);
    dsec_exec_reply_release(&r);
    const char *fargv[] = {"false", NULL};
    assert_int_equal(dsec_exec(cl, sb.id, &(dsec_exec_opts){.argv = fargv}, &r, &err), 0);
    assert_int_equal(r.exit_code, 1);
    dsec_exec_reply_release(&r);
    assert_int_equal(dsec_file_write(cl, sb.id, "/w/a.txt", "parent", 6, 0644, &err), 0);
    char **kids;
    size_t nk;
    assert_int_equal(dsec_fork(cl, sb.id, 2, &kids, &nk, &err), 0);
    assert_int_equal(nk, 2);
    assert_int_equal(dsec_file_write(cl, sb.id, "/w/a.txt", "later!", 6, 0644, &err), 0);
    assert_int_equal(dsec_file_write(cl, kids[0], "/w/b.txt", "kid0", 4, 0644, &err), 0);
    uint8_t *data;
    size_t len;
    assert_int_equal(dsec_file_read(cl, kids[1], "/w/a.txt", &data, &len, &err), 0);
    assert_int_equal(len, 6);
    assert_memory_equal(data, "parent", 6); /* the branch point, not later writes */
    dsec_free(data);
    assert_int_equal(dsec_file_read(cl, kids[1], "/w/b.txt", &data, &len, &err),
                     -1); /* siblings apart */
    dsec_dirent *e;
    size_t ne;
    assert_int_equal(dsec_file_list(cl, kids[0], "/w", &e, &ne, &err), 0);
    assert_int_equal(ne, 2);
    dsec_dirents_free(e, ne);
    assert_int_equal(dsec_pause(cl, sb.id, &err), 0);
    assert_int_equal(dsec_exec(cl, sb.id, &(dsec_exec_opts){.argv = argv}, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    assert_int_equal(dsec_resume(cl, sb.id, &err), 0);
    assert_int_equal(dsec_wait_state(cl, sb.id, "running", 1000, &err), 0);
    for (size_t i = 0; i < nk; i++)
        assert_int_equal(dsec_destroy(cl, kids[i], &err), 0);
    dsec_strv_free(kids, nk);
    assert_int_equal(dsec_destroy(cl, sb.id, &err), 0);
    assert_int_equal(dsec_status(cl, sb.id, &sb, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    dsec_node_stats ns;
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &ns);
    assert_int_equal(ns.live, 0);
}

/* ---- bad input ------------------------------------------------------------------------ */

static dsec_msg_error request_error(dsec_bus *bus, const char *subject, const char *type,
                                    const void *data, size_t len, char *code, size_t ncode,
                                    char *field, size_t nfield)
{
    dsec_err err;
    dsec_msg *reply = NULL;
    dsec_hdr h = {.type = type, .schema = 1, .req_id = "bad-1"};
    if (dsec_bus_request_sync(bus, subject, &h, data, len, 3000, &reply, &err) < 0)
        fail_msg("%s: no answer: %s", subject, err.msg);
    assert_string_equal(dsec_msg_type(reply), "error");
    dsec_decoder *d = dsec_decoder_new(NULL);
    dsec_msg_error e;
    assert_int_equal(
        dsec_decode(d, DSEC_MSG_ERROR, dsec_msg_data(reply), dsec_msg_len(reply), &e, &err), 0);
    snprintf(code, ncode, "%s", e.code);
    snprintf(field, nfield, "%s", e.field ? e.field : "");
    dsec_decoder_free(d);
    dsec_msg_free(reply);
    return (dsec_msg_error){0};
}

static void malformed_requests_get_errors(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t8");
    static const char *const t[] = {"sim", NULL};
    add_node(&c, "t8-a", 10, t, NULL);
    dsec_cell *cell = start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_bus *bus = dsec_cell_bus(cell);
    char code[32], field[32];
    request_error(bus, "dsec.v1.t8.create.t8", "create", "\xc1garbage", 8, code, sizeof code, field,
                  sizeof field);
    assert_string_equal(code, "decode");
    static const uint8_t no_req_id[] = {0x81, 0xa4, 't', 'y', 'p', 'e', 0xa3, 's', 'i', 'm'};
    request_error(bus, "dsec.v1.t8.create.t8", "create", no_req_id, sizeof no_req_id, code,
                  sizeof code, field, sizeof field);
    assert_string_equal(code, "decode");
    assert_string_equal(field, "req_id");
    static const uint8_t bad_cpu[] = {0x82, 0xa6, 'r',  'e', 'q',  '_', 'i', 'd',
                                      0xa1, 'x',  0xa9, 'c', 'p',  'u', '_', 'm',
                                      'i',  'l',  'l',  'i', 0xa3, 'l', 'o', 't'};
    request_error(bus, "dsec.v1.t8.create.t8", "create", bad_cpu, sizeof bad_cpu, code, sizeof code,
                  field, sizeof field);
    assert_string_equal(field, "cpu_milli");

    dsec_client *cl = client("t8");
    dsec_sandbox_info sb;
    dsec_err err;
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &sb, &err), 0);
    char subj[256];
    snprintf(subj, sizeof subj, "dsec.v1.t8.sbx.t8-a.%s.exec", sb.id);
    request_error(bus, subj, "exec", "\x93\x01\x02", 3, code, sizeof code, field, sizeof field);
    assert_string_equal(code, "decode");
    snprintf(subj, sizeof subj, "dsec.v1.other.sbx.t8-a.%s.exec", sb.id);
    request_error(bus, subj, "exec", "\x80", 1, code, sizeof code, field, sizeof field);
    assert_string_equal(code, "permission"); /* another tenant's sandbox */
    request_error(bus, "dsec.v1.t8.sbx.t8-a.t8-a-0000000000000000.exec", "exec", "\x80", 1, code,
                  sizeof code, field, sizeof field);
    assert_string_equal(code, "not_found");
    snprintf(subj, sizeof subj, "dsec.v1.t8.sbx.t8-a.%s.explode", sb.id);
    request_error(bus, subj, "exec", "\x80", 1, code, sizeof code, field, sizeof field);
    assert_string_equal(code, "unsupported");
    request_error(bus, "dsec.v1.t8.sbx.t8-a.short", "exec", "\x80", 1, code, sizeof code, field,
                  sizeof field);
    assert_string_equal(code, "invalid");
    dsec_msg_op op = {.id = sb.id, .op = "explode"};
    dsec_buf b;
    dsec_buf_init(&b);
    assert_int_equal(dsec_encode(&b, DSEC_MSG_OP, &op, &err), 0);
    snprintf(subj, sizeof subj, "dsec.v1.t8.sbx.t8-a.%s.op", sb.id);
    request_error(bus, subj, "op", b.data, b.len, code, sizeof code, field, sizeof field);
    assert_string_equal(code, "unsupported");
    dsec_buf_release(&b);
    /* health check: any replica answers a ping; a bad ping gets an error */
    dsec_msg_ping ping = {.seq = 42};
    dsec_buf_init(&b);
    assert_int_equal(dsec_encode(&b, DSEC_MSG_PING, &ping, &err), 0);
    dsec_msg *reply = NULL;
    assert_int_equal(dsec_bus_request_sync(bus, "dsec.v1.ctl.ping",
                                           &(dsec_hdr){.type = "ping", .schema = 1}, b.data, b.len,
                                           3000, &reply, &err),
                     0);
    dsec_buf_release(&b);
    assert_string_equal(dsec_msg_type(reply), "pong");
    dsec_decoder *d = dsec_decoder_new(NULL);
    dsec_msg_pong pong;
    assert_int_equal(
        dsec_decode(d, DSEC_MSG_PONG, dsec_msg_data(reply), dsec_msg_len(reply), &pong, &err), 0);
    assert_int_equal(pong.seq, 42);
    assert_non_null(pong.actor);
    dsec_decoder_free(d);
    dsec_msg_free(reply);
    request_error(bus, "dsec.v1.ctl.ping", "ping", "\x80", 1, code, sizeof code, field,
                  sizeof field);
    assert_string_equal(code, "decode");
    /* and the cell still serves */
    assert_int_equal(dsec_status(cl, sb.id, &sb, &err), 0);
    assert_string_equal(sb.state, "running");
}

/* ---- node managers in their own process ---------------------------------------------------- */

static pid_t spawn_dsecd(const char *config)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl(dsecd_path, "dsecd", "--config", config, "--roles", "node", (char *)NULL);
        _exit(127);
    }
    track_pid(pid);
    return pid;
}

static void write_node_config(const char *path, const char *cell, const char *node,
                              const char *state)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "cell: %s\nstate_dir: %s\nbus: {url: \"%s\"}\n"
            "reports: {capacity_ms: 20, full_ms: 300, heartbeat_ms: 100, reap_ms: 100}\n"
            "nodes:\n  - name: %s\n    slots: 20\n    types: [sim]\n    sim: {time_scale: 0}\n",
            cell, state, dsec_natsd_url(natsd), node);
    fclose(f);
}

static void wait_nodes(dsec_cell *sched_cell, uint64_t want, int timeout_ms)
{
    dsec_sched_stats ss = {0};
    for (int waited = 0; waited < timeout_ms; waited += 20) {
        dsec_sched_stats_get(dsec_cell_sched_at(sched_cell, 0), &ss);
        if (ss.nodes == want)
            return;
        msleep(20);
    }
    fail_msg("scheduler sees %" PRIu64 " nodes, wanted %" PRIu64, ss.nodes, want);
}

/* ---- commands without threads ------------------------------------------------- */

struct exec_arg {
    dsec_client *cl;
    const char *id;
    int rc;
    int exit_code;
    char err[256];
};

static void *exec_sleep(void *p)
{
    struct exec_arg *a = p;
    /* long enough for all 120 to be sent, even from a sanitizer build on a busy host */
    static const char *const argv[] = {"sleep", "8", NULL};
    dsec_exec_reply r;
    dsec_err err;
    a->rc = dsec_exec(a->cl, a->id, &(dsec_exec_opts){.argv = argv, .timeout_ms = 20000}, &r, &err);
    if (a->rc == 0) {
        a->exit_code = r.exit_code;
        dsec_exec_reply_release(&r);
    } else {
        snprintf(a->err, sizeof a->err, "%.200s", err.msg);
    }
    return NULL;
}

/* A node runs as many commands at once as it has sandboxes busy, not as many as it has
 * threads: 120 sandboxes each start an 8 s command at the same moment (sim models the time
 * a real command takes), and all 120 are in flight together. */
static void commands_run_at_once(void **state)
{
    enum { N = 120 };
    static dsec_cell_conf c;
    conf_for(&c, "t21");
    static const char *const types[] = {"sim", NULL};
    dsec_err err;
    assert_int_equal(
        dsec_cell_conf_add_sim_nodes(&c, "t21-n", 1, 640000, 655360, 1000, types, "1", &err), 0);
    dsec_cell *cell = start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_client *cl = client("t21");
    static dsec_sandbox_info sb[N];
    for (int i = 0; i < N; i++)
        assert_int_equal(
            create(cl, (dsec_create_spec){.type = "sim", .cpu_milli = 100, .memory_mb = 64}, &sb[i],
                   &err),
            0);
    static struct exec_arg args[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        args[i] = (struct exec_arg){.cl = cl, .id = sb[i].id, .rc = -1};
        assert_int_equal(pthread_create(&th[i], NULL, exec_sleep, &args[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        if (args[i].rc != 0)
            fail_msg("exec %d in %s: %s", i, args[i].id, args[i].err);
        assert_int_equal(args[i].exit_code, 0);
    }
    dsec_node_stats ns;
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &ns);
    fprintf(stderr, "  commands in flight at once: %" PRIu64 " of %d\n", ns.execs_peak, N);
    assert_int_equal(ns.execs_peak, N);
    assert_int_equal(ns.execs_inflight, 0);
}

struct hog_arg {
    dsec_client *cl;
    const char *id;
    int rc;
};

static void *hog_exec(void *p)
{
    struct hog_arg *a = p;
    static const char *const argv[] = {"sleep", "12", NULL};
    dsec_exec_reply r;
    dsec_err err;
    a->rc = dsec_exec(a->cl, a->id, &(dsec_exec_opts){.argv = argv, .timeout_ms = 60000}, &r, &err);
    if (a->rc == 0)
        dsec_exec_reply_release(&r);
    return NULL;
}

/* One tenant's 100 sandboxes all run long commands; another tenant's sandbox runs a command
 * and moves a file meanwhile, and is answered while all 100 are still running (it used to
 * wait for a bus worker that the long commands held). */
static void busy_tenant_does_not_hold_up_another(void **state)
{
    enum { N = 100 };
    static dsec_cell_conf c;
    conf_for(&c, "t22");
    static const char *const types[] = {"sim", NULL};
    dsec_err err;
    assert_int_equal(
        dsec_cell_conf_add_sim_nodes(&c, "t22-n", 1, 640000, 655360, 1000, types, "1", &err), 0);
    dsec_cell *cell = start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_client *hog = client("hog");
    dsec_client *other = client("other");
    static dsec_sandbox_info sb[N];
    for (int i = 0; i < N; i++)
        assert_int_equal(
            create(hog, (dsec_create_spec){.type = "sim", .cpu_milli = 100, .memory_mb = 64},
                   &sb[i], &err),
            0);
    dsec_sandbox_info mine;
    assert_int_equal(create(other, (dsec_create_spec){.type = "sim"}, &mine, &err), 0);
    static struct hog_arg args[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        args[i] = (struct hog_arg){.cl = hog, .id = sb[i].id, .rc = -1};
        assert_int_equal(pthread_create(&th[i], NULL, hog_exec, &args[i]), 0);
    }
    dsec_node *node = dsec_cell_node_at(cell, 0);
    dsec_node_stats ns = {0};
    for (int w = 0; w < 10000 && ns.execs_inflight < N; w += 10) {
        msleep(10);
        dsec_node_stats_get(node, &ns);
    }
    assert_int_equal(ns.execs_inflight, N);

    static const char *const argv[] = {"echo", "still", "served", NULL};
    dsec_exec_reply r;
    assert_int_equal(dsec_exec(other, mine.id, &(dsec_exec_opts){.argv = argv}, &r, &err), 0);
    assert_string_equal((char *)r.out, "still served\n");
    dsec_exec_reply_release(&r);
    assert_int_equal(dsec_file_write(other, mine.id, "/work/f", "abc", 3, 0644, &err), 0);
    uint8_t *data = NULL;
    size_t len = 0;
    assert_int_equal(dsec_file_read(other, mine.id, "/work/f", &data, &len, &err), 0);
    assert_int_equal(len, 3);
    dsec_free(data);
    dsec_node_stats_get(node, &ns);
    assert_int_equal(ns.execs_inflight, N); /* every long command still ran meanwhile */

    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].rc, 0);
    }
}

/* A command that runs longer than the sandbox's idle time keeps it alive: the sandbox is
 * busy, not idle (the reaper used to queue a destroy that ran as soon as the command
 * ended). */
static void long_command_is_not_idle(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t23");
    static const char *const types[] = {"sim", NULL};
    dsec_err err;
    assert_int_equal(
        dsec_cell_conf_add_sim_nodes(&c, "t23-n", 1, 64000, 65536, 10, types, "1", &err), 0);
    start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_client *cl = client("t23");
    dsec_sandbox_info sb;
    assert_int_equal(
        create(cl, (dsec_create_spec){.type = "sim", .ttl_s = 60, .idle_s = 1}, &sb, &err), 0);
    static const char *const argv[] = {"sleep", "3", NULL};
    dsec_exec_reply r;
    assert_int_equal(
        dsec_exec(cl, sb.id, &(dsec_exec_opts){.argv = argv, .timeout_ms = 10000}, &r, &err), 0);
    dsec_exec_reply_release(&r);
    msleep(300); /* three reaper rounds: a destroy queued behind the command would have run */
    dsec_sandbox_info st;
    assert_int_equal(dsec_status(cl, sb.id, &st, &err), 0);
    assert_string_equal(st.state, "running");
    /* and idle after it, it goes */
    assert_int_equal(dsec_wait_state(cl, sb.id, "gone", 5000, &err), 0);
}

static void restarted_node_readopts_its_sandboxes(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t9");
    dsec_cell *sched = start(&c, DSEC_ROLE_SCHEDULER);
    char cfg[256], st[256];
    snprintf(cfg, sizeof cfg, "%s/t9.yaml", root);
    snprintf(st, sizeof st, "%s/t9-node", root);
    write_node_config(cfg, "t9", "t9-n", st);
    pid_t pid = spawn_dsecd(cfg);
    wait_nodes(sched, 1, 5000);
    dsec_client *cl = client("t9");
    dsec_sandbox_info sb[3];
    dsec_err err;
    for (int i = 0; i < 3; i++)
        assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &sb[i], &err), 0);
    assert_int_equal(dsec_destroy(cl, sb[2].id, &err), 0);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_int_equal(dsec_status(cl, sb[0].id, &sb[0], &err), -1); /* nobody serves it now */
    pid = spawn_dsecd(cfg);
    dsec_sandbox_info s;
    int rc = -1;
    for (int i = 0; i < 250 && rc < 0; i++) {
        rc = dsec_status(cl, sb[0].id, &s, &err);
        if (rc < 0)
            msleep(20);
    }
    assert_int_equal(rc, 0);
    assert_string_equal(s.state, "running");
    assert_int_equal(dsec_status(cl, sb[1].id, &s, &err), 0);
    assert_int_equal(dsec_status(cl, sb[2].id, &s, &err), -1); /* destroyed stays destroyed */
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    const char *argv[] = {"echo", "back", NULL};
    dsec_exec_reply r;
    assert_int_equal(dsec_exec(cl, sb[1].id, &(dsec_exec_opts){.argv = argv}, &r, &err), 0);
    assert_int_equal(r.out_len, 5);
    dsec_exec_reply_release(&r);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* Wait until the restarted node manager serves id again. */
static void wait_served(dsec_client *cl, const char *id)
{
    dsec_sandbox_info s;
    dsec_err err;
    for (int i = 0; i < 250; i++) {
        if (dsec_status(cl, id, &s, &err) == 0)
            return;
        msleep(20);
    }
    fail_msg("%s is not served after the restart: %s", id, err.msg);
}

/* A command run with a req_id, from a client that gave up waiting (its 300 ms passed). */
static void exec_given_up(const char *tenant, const char *id, const char *const *argv,
                          const char *req_id)
{
    dsec_client *quick = NULL;
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = tenant, .timeout_ms = 300};
    dsec_err err;
    assert_int_equal(dsec_client_connect(&quick, &o, &err), 0);
    dsec_exec_reply r;
    assert_int_equal(
        dsec_exec(quick, id, &(dsec_exec_opts){.argv = argv, .req_id = req_id}, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_TIMEOUT);
    dsec_client_free(quick);
}

/* The answers a node keeps by req_id outlive its node manager: killed with -9 or stopped, then
 * started again, it answers a retry with the first run's answer. A command that was running
 * when it went away is not run again: its retry hears that the outcome was lost. */
static void exec_answers_outlive_node_manager_restarts(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t30");
    dsec_cell *sched = start(&c, DSEC_ROLE_SCHEDULER);
    char cfg[256], st[256];
    snprintf(cfg, sizeof cfg, "%s/t30.yaml", root);
    snprintf(st, sizeof st, "%s/t30-node", root);
    FILE *f = fopen(cfg, "w");
    assert_non_null(f);
    /* time_scale 1: a sim "sleep" takes its time, on the node's loop, as a real command */
    fprintf(f,
            "cell: t30\nstate_dir: %s\nbus: {url: \"%s\"}\n"
            "reports: {capacity_ms: 20, full_ms: 300, heartbeat_ms: 100, reap_ms: 100}\n"
            "nodes:\n  - name: t30-n\n    slots: 20\n    types: [sim]\n"
            "    sim: {time_scale: 1}\n    results_ttl_s: 120\n",
            st, dsec_natsd_url(natsd));
    fclose(f);
    pid_t pid = spawn_dsecd(cfg);
    wait_nodes(sched, 1, 5000);
    dsec_client *cl = client("t30");
    dsec_sandbox_info sb;
    dsec_err err;
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &sb, &err), 0);
    assert_int_equal(dsec_file_write(cl, sb.id, "/f", "first", 5, 0644, &err), 0);
    const char *cat[] = {"cat", "/f", NULL}, *sleep30[] = {"sleep", "30", NULL};
    dsec_exec_reply r;
    assert_int_equal(
        dsec_exec(cl, sb.id, &(dsec_exec_opts){.argv = cat, .req_id = "t30-cat"}, &r, &err), 0);
    assert_string_equal((char *)r.out, "first");
    dsec_exec_reply_release(&r);
    exec_given_up("t30", sb.id, sleep30, "t30-sleep");

    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    pid = spawn_dsecd(cfg);
    wait_served(cl, sb.id);
    /* the kept answer; a sim sandbox's files died with the process, so a second run of the
     * same command would say "No such file" */
    assert_int_equal(
        dsec_exec(cl, sb.id, &(dsec_exec_opts){.argv = cat, .req_id = "t30-cat"}, &r, &err), 0);
    assert_int_equal(r.exit_code, 0);
    assert_string_equal((char *)r.out, "first");
    dsec_exec_reply_release(&r);
    assert_int_equal(dsec_exec(cl, sb.id, &(dsec_exec_opts){.argv = cat}, &r, &err), 0);
    assert_int_equal(r.exit_code, 1);
    dsec_exec_reply_release(&r);
    /* the command that ran when the node manager was killed: lost, not run again */
    assert_int_equal(
        dsec_exec(cl, sb.id, &(dsec_exec_opts){.argv = sleep30, .req_id = "t30-sleep"}, &r, &err),
        -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    if (strstr(err.msg, "outcome of req_id t30-sleep") == NULL ||
        strstr(err.msg, "is lost") == NULL || strstr(err.msg, "not run again") == NULL)
        fail_msg("a retry of a command lost with its node manager: %s", err.msg);
    /* and the req_id still names only that command */
    const char *other[] = {"echo", "x", NULL};
    assert_int_equal(
        dsec_exec(cl, sb.id, &(dsec_exec_opts){.argv = other, .req_id = "t30-cat"}, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);

    /* a graceful stop: what ran goes on in the sandbox, its outcome unknown to the next one */
    exec_given_up("t30", sb.id, sleep30, "t30-sleep-2");
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    pid = spawn_dsecd(cfg);
    wait_served(cl, sb.id);
    assert_int_equal(
        dsec_exec(cl, sb.id, &(dsec_exec_opts){.argv = cat, .req_id = "t30-cat"}, &r, &err), 0);
    assert_string_equal((char *)r.out, "first");
    dsec_exec_reply_release(&r);
    for (int i = 0; i < 2; i++) {
        const char *rid = i ? "t30-sleep-2" : "t30-sleep";
        assert_int_equal(
            dsec_exec(cl, sb.id, &(dsec_exec_opts){.argv = sleep30, .req_id = rid}, &r, &err), -1);
        assert_int_equal(err.code, DSEC_E_STATE);
        assert_non_null(strstr(err.msg, "is lost"));
    }
    /* its answers are kept in the node's state dir, and go with the sandbox */
    char log[512];
    struct stat sst;
    snprintf(log, sizeof log, "%s/node-t30-n/results/answers.log", st);
    assert_int_equal(stat(log, &sst), 0);
    assert_int_equal(dsec_destroy(cl, sb.id, &err), 0);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    assert_int_equal(stat(log, &sst), 0);
    assert_true(sst.st_size > 0); /* the drop's record */
    pid = spawn_dsecd(cfg);
    /* read back at start and rewritten with nothing to keep */
    for (int i = 0; i < 250 && (stat(log, &sst) < 0 || sst.st_size != 0); i++)
        msleep(20);
    assert_int_equal(stat(log, &sst), 0);
    assert_int_equal(sst.st_size, 0);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* Background processes on a type without them (sim): a clear "unsupported", whatever asks. */
static void background_processes_unsupported_on_sim(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t28");
    static const char *const t[] = {"sim", NULL};
    add_node(&c, "t28-a", 10, t, NULL);
    start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    dsec_client *cl = client("t28");
    dsec_sandbox_info sb;
    dsec_err err;
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &sb, &err), 0);
    const char *argv[] = {"sleep", "10", NULL};
    dsec_proc p;
    assert_int_equal(dsec_proc_start(cl, sb.id, &(dsec_proc_opts){.argv = argv}, &p, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "does not support background processes"));
    dsec_proc *v;
    size_t n;
    assert_int_equal(dsec_proc_list(cl, sb.id, &v, &n, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    /* a terminal, a shell session, a session command, an interrupt, a watch: each says so */
    const char *sh[] = {"sh", NULL};
    assert_int_equal(
        dsec_proc_start(cl, sb.id, &(dsec_proc_opts){.argv = sh, .pty = true}, &p, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "does not support terminals (pty)"));
    assert_int_equal(dsec_session_start(cl, sb.id, NULL, &p, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "does not support shell sessions"));
    const char *line[] = {"cd /tmp", NULL};
    dsec_exec_reply r;
    assert_int_equal(dsec_exec(cl, sb.id, &(dsec_exec_opts){.argv = line, .session = 1}, &r, &err),
                     -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "does not support shell sessions"));
    assert_int_equal(dsec_session_interrupt(cl, sb.id, 1, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    assert_int_equal(dsec_dir_watch(cl, sb.id, "/work", false, &p, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    /* and malformed asks are refused before any backend sees them */
    assert_int_equal(dsec_proc_resize(cl, sb.id, 1, 0, 80, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_int_equal(dsec_proc_read_wait(cl, sb.id, 1, 0, 0, 0, 60001, &(dsec_proc_out){0}, &err),
                     -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    /* no argv asks for the environment's default command: sim runs no background process */
    assert_int_equal(dsec_proc_start(cl, sb.id, &(dsec_proc_opts){0}, &p, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    assert_int_equal(dsec_proc_signal(cl, sb.id, 1, 0, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
}

/* A sandbox's end moves while it runs (dsec_set_ttl), later and sooner, within the cell's
 * max_ttl_s, and the change holds across a kill -9 of its node manager (it is journaled). */
static void ttl_moves_a_sandboxs_end(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t27");
    dsec_cell *sched = start(&c, DSEC_ROLE_SCHEDULER);
    char cfg[256], st[256];
    snprintf(cfg, sizeof cfg, "%s/t27.yaml", root);
    snprintf(st, sizeof st, "%s/t27-node", root);
    write_node_config(cfg, "t27", "t27-n", st);
    pid_t pid = spawn_dsecd(cfg);
    wait_nodes(sched, 1, 5000);
    dsec_client *cl = client("t27");
    dsec_sandbox_info a, b, s;
    dsec_err err;
    assert_int_equal(
        create(cl, (dsec_create_spec){.type = "sim", .ttl_s = 2, .idle_s = 600}, &a, &err), 0);
    assert_int_equal(
        create(cl, (dsec_create_spec){.type = "sim", .ttl_s = 600, .idle_s = 600}, &b, &err), 0);
    /* later: a lives on past its 2 s, and the answer says until when */
    uint64_t end = 0, t0 = dsec_wall_ns();
    assert_int_equal(dsec_set_ttl(cl, a.id, 30, &end, &err), 0);
    assert_true(end >= t0 + 29000000000ull && end <= dsec_wall_ns() + 30000000000ull);
    /* beyond the cell's max_ttl_s (86400 by default), or none: refused, saying why */
    assert_int_equal(dsec_set_ttl(cl, b.id, 86400, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "max_ttl_s 86400"));
    assert_non_null(strstr(err.msg, "s more"));
    assert_int_equal(dsec_set_ttl(cl, b.id, 0, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    char missing[sizeof a.id];
    memcpy(missing, a.id, sizeof missing); /* same node, another sandbox */
    size_t ln = strlen(missing);
    missing[ln - 1] = missing[ln - 1] == '0' ? '1' : '0';
    assert_int_equal(dsec_set_ttl(cl, missing, 10, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    /* the node manager dies and comes back: a's new end holds (the old one has passed) */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    pid = spawn_dsecd(cfg);
    int rc = -1;
    for (int i = 0; i < 250 && rc < 0; i++) {
        rc = dsec_status(cl, a.id, &s, &err);
        if (rc < 0)
            msleep(20);
    }
    assert_int_equal(rc, 0);
    msleep(2500); /* past its first end (2 s after creation), several reaper passes */
    assert_int_equal(dsec_status(cl, a.id, &s, &err), 0);
    assert_string_equal(s.state, "running");
    /* sooner: b (600 s) ends in 1 s, reaped for its lifetime */
    assert_int_equal(dsec_set_ttl(cl, b.id, 1, NULL, &err), 0);
    assert_int_equal(dsec_wait_state(cl, b.id, "gone", 5000, &err), 0);
    assert_int_equal(dsec_status(cl, b.id, &s, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "max lifetime reached"));
    assert_int_equal(dsec_status(cl, a.id, &s, &err), 0);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* A node manager killed with -9 right after it acknowledged creates: after its restart, every
 * sandbox it acknowledged is there, or its answer says why it is gone. While it is down an
 * operation gets a retry-safe error, never "not found". Some of them were reaped idle before the
 * kill: their owner may never have heard the event that said so (the chaos benchmark counted
 * such sandboxes as lost), so the node's answer itself must say it, restart or not. */
static void killed_node_keeps_or_explains_acknowledged(void **state)
{
    enum { IDLE = 8, KEPT = 12 };
    static dsec_cell_conf c;
    conf_for(&c, "t24");
    dsec_cell *sched = start(&c, DSEC_ROLE_SCHEDULER);
    char cfg[256], st[256];
    snprintf(cfg, sizeof cfg, "%s/t24.yaml", root);
    snprintf(st, sizeof st, "%s/t24-node", root);
    write_node_config(cfg, "t24", "t24-n", st);
    pid_t pid = spawn_dsecd(cfg);
    wait_nodes(sched, 1, 5000);
    dsec_client *cl = client("t24");
    dsec_sandbox_info idle[IDLE], kept[KEPT], s;
    dsec_err err;
    for (int i = 0; i < IDLE; i++)
        assert_int_equal(
            create(cl,
                   (dsec_create_spec){.type = "sim", .cpu_milli = 10, .memory_mb = 16, .idle_s = 1},
                   &idle[i], &err),
            0);
    /* reaped idle (reap_ms is 100): gone on the node's own account */
    for (int w = 0; w < 5000; w += 50) {
        msleep(50);
        if (dsec_status(cl, idle[IDLE - 1].id, &s, &err) < 0 && err.code == DSEC_E_NOT_FOUND)
            break;
    }
    for (int i = 0; i < KEPT; i++)
        assert_int_equal(create(cl,
                                (dsec_create_spec){.type = "sim", .cpu_milli = 10, .memory_mb = 16},
                                &kept[i], &err),
                         0);
    kill(pid, SIGKILL); /* right after the last answer */
    waitpid(pid, NULL, 0);
    assert_int_equal(dsec_status(cl, kept[0].id, &s, &err), -1);
    if (!dsec_code_retry_safe(err.code))
        fail_msg("an operation while the node manager is down: %s: %s (not retry-safe)",
                 dsec_code_name(err.code), err.msg);
    pid = spawn_dsecd(cfg);
    int rc = -1;
    for (int i = 0; i < 250 && rc < 0; i++) {
        rc = dsec_status(cl, kept[KEPT - 1].id, &s, &err);
        if (rc < 0) {
            if (!dsec_code_retry_safe(err.code))
                fail_msg("an operation while the node manager restarts: %s: %s (not retry-safe)",
                         dsec_code_name(err.code), err.msg);
            msleep(20);
        }
    }
    assert_int_equal(rc, 0);
    for (int i = 0; i < KEPT; i++) {
        if (dsec_status(cl, kept[i].id, &s, &err) < 0)
            fail_msg("acknowledged %s is not there after the restart: %s", kept[i].id, err.msg);
        assert_string_equal(s.state, "running");
    }
    for (int i = 0; i < IDLE; i++) {
        assert_int_equal(dsec_status(cl, idle[i].id, &s, &err), -1);
        assert_int_equal(err.code, DSEC_E_NOT_FOUND);
        if (strstr(err.msg, " is gone: idle timeout") == NULL)
            fail_msg("acknowledged %s, reaped idle before the kill, is not found without a "
                     "reason: %s",
                     idle[i].id, err.msg);
    }
    /* and a sandbox destroyed at its owner's request is simply not found */
    assert_int_equal(dsec_destroy(cl, kept[0].id, &err), 0);
    assert_int_equal(dsec_status(cl, kept[0].id, &s, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_null(strstr(err.msg, "is gone"));
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* A node answered the lookup of attempt 2 of a create with the sandbox it made for attempt 0
 * (the scheduler passed that answer to the client), then its node manager was killed before
 * the notice naming it for attempt 2 came. After its restart the notice of attempt 1, placed
 * on another node by the other scheduler replica, arrives first: the sandbox the client holds
 * must stay (it used to be destroyed as superseded: what it answered lived in memory only). */
static void restarted_node_keeps_what_its_lookup_answered(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t25");
    dsec_cell *sched = start(&c, DSEC_ROLE_SCHEDULER);
    char cfg[256], st[256];
    snprintf(cfg, sizeof cfg, "%s/t25.yaml", root);
    snprintf(st, sizeof st, "%s/t25-node", root);
    write_node_config(cfg, "t25", "t25-n", st);
    pid_t pid = spawn_dsecd(cfg);
    wait_nodes(sched, 1, 5000);
    dsec_client *cl = client("t25");
    dsec_sandbox_info sb, s;
    dsec_err err;
    assert_int_equal(
        create(cl,
               (dsec_create_spec){
                   .type = "sim", .cpu_milli = 10, .memory_mb = 16, .req_id = "t25-req"},
               &sb, &err),
        0);
    dsec_bus *bus = dsec_cell_bus(sched);
    dsec_msg_op look = {
        .id = "-", .op = "lookup", .req_id = "t25-req", .tenant = "t25", .retry = 2};
    dsec_msg *reply = NULL;
    dsec_buf buf;
    dsec_buf_init(&buf);
    assert_int_equal(dsec_encode(&buf, DSEC_MSG_OP, &look, &err), 0);
    assert_int_equal(dsec_bus_request_sync(bus, "dsec.v1.ctl.lookup.t25", &(dsec_hdr){.type = "op"},
                                           buf.data, buf.len, 3000, &reply, &err),
                     0); /* the node holds it: it answers */
    dsec_msg_free(reply);
    dsec_buf_release(&buf);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    pid = spawn_dsecd(cfg);
    int rc = -1;
    for (int i = 0; i < 250 && rc < 0; i++) {
        rc = dsec_status(cl, sb.id, &s, &err);
        if (rc < 0)
            msleep(20);
    }
    assert_int_equal(rc, 0);
    dsec_msg_superseded item = {
        .tenant = "t25", .req_id = "t25-req", .node = "t25-other", .retry = 1};
    dsec_msg_superseded_list l = {.by = "test", .items = {.items = &item, .n = 1}};
    assert_int_equal(dsec_wire_send(NULL, bus, "dsec.v1.ctl.superseded.t25", NULL,
                                    DSEC_MSG_SUPERSEDED_LIST, &l, NULL, &err),
                     0);
    msleep(500); /* five reaper rounds: a superseded sandbox would be gone */
    if (dsec_status(cl, sb.id, &s, &err) < 0)
        fail_msg("the sandbox the lookup of attempt 2 answered with is gone: %s", err.msg);
    assert_string_equal(s.state, "running");
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

static void silent_node_is_drained(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t10");
    dsec_cell *sched = start(&c, DSEC_ROLE_SCHEDULER);
    char cfg[256], st[256];
    snprintf(cfg, sizeof cfg, "%s/t10.yaml", root);
    snprintf(st, sizeof st, "%s/t10-node", root);
    write_node_config(cfg, "t10", "t10-n", st);
    pid_t pid = spawn_dsecd(cfg);
    wait_nodes(sched, 1, 5000);
    kill(pid, SIGSTOP); /* alive but silent: no heartbeats, no reports */
    wait_nodes(sched, 0, 5000);
    dsec_client *cl = client("t10");
    dsec_sandbox_info sb;
    dsec_err err;
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &sb, &err), -1);
    assert_int_equal(err.code, DSEC_E_CAPACITY);
    kill(pid, SIGCONT); /* its next full report brings it back */
    wait_nodes(sched, 1, 5000);
    assert_int_equal(create(cl, (dsec_create_spec){.type = "sim"}, &sb, &err), 0);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}

/* Two node managers stopped together (alive but silent, answering nothing): the replica drains
 * one, and the other only drain_gap_ms later; a third node stays. The old scheduler drained
 * both in one pass. (Which node a create prefers meanwhile is test_placement's business: here
 * the in-process node's own heartbeats may run late on a busy host.) */
static void silent_nodes_are_drained_one_at_a_time(void **state)
{
    static dsec_cell_conf c;
    conf_for(&c, "t25");
    c.drain_gap_ms = 3000; /* far longer than two reads of the stats, however busy the host */
    static const char *const sim[] = {"sim", NULL};
    add_node(&c, "t25-ok", 20, sim, NULL);
    dsec_cell *sched = start(&c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    char cfg[2][256], st[2][256], name[2][16];
    pid_t pid[2];
    for (int i = 0; i < 2; i++) {
        snprintf(cfg[i], sizeof cfg[i], "%s/t25-%d.yaml", root, i);
        snprintf(st[i], sizeof st[i], "%s/t25-node-%d", root, i);
        snprintf(name[i], sizeof name[i], "t25-n%d", i);
        write_node_config(cfg[i], "t25", name[i], st[i]);
        pid[i] = spawn_dsecd(cfg[i]);
    }
    wait_nodes(sched, 3, 5000);
    dsec_sched *r = dsec_cell_sched_at(sched, 0);
    dsec_sched_stats ss;
    dsec_sched_stats_get(r, &ss);
    uint64_t expired0 = ss.expired, deferred0 = ss.drains_deferred;
    kill(pid[0], SIGSTOP);
    kill(pid[1], SIGSTOP);
    /* both suspect first, still in the view */
    for (int waited = 0; waited < 10000; waited += 20) {
        dsec_sched_stats_get(r, &ss);
        if (ss.suspect >= 2 || ss.expired > expired0)
            break;
        msleep(20);
    }
    assert_true(ss.suspect >= 2 || ss.expired > expired0);
    /* the first drain */
    for (int waited = 0; waited < 10000 && ss.expired == expired0; waited += 20) {
        msleep(20);
        dsec_sched_stats_get(r, &ss);
    }
    assert_int_equal(ss.expired, expired0 + 1);
    assert_int_equal(ss.nodes, 2);
    /* the second, a drain gap later, put off meanwhile */
    for (int waited = 0; waited < 20000 && ss.expired == expired0 + 1; waited += 20) {
        msleep(20);
        dsec_sched_stats_get(r, &ss);
    }
    assert_int_equal(ss.expired, expired0 + 2);
    assert_int_equal(ss.nodes, 1);
    assert_true(ss.drains_deferred > deferred0);
    for (int i = 0; i < 2; i++) {
        kill(pid[i], SIGCONT); /* its next full report re-admits it */
        kill(pid[i], SIGTERM);
        waitpid(pid[i], NULL, 0);
    }
}

int main(int argc, char **argv)
{
    dsecd_path = argc > 1 ? argv[1] : "./dsecd";
    srandom((unsigned)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(lightest_type_labels_and_errors, test_teardown),
        cmocka_unit_test_teardown(capacity_is_respected, test_teardown),
        cmocka_unit_test_teardown(refusal_is_retried_elsewhere, test_teardown),
        cmocka_unit_test_teardown(disk_is_admitted_above_a_reserve, test_teardown),
        cmocka_unit_test_teardown(readopted_sandboxes_hold_their_disk, test_teardown),
        cmocka_unit_test_teardown(disk_no_more_than_the_reserve_is_refused, test_teardown),
        cmocka_unit_test_teardown(function_sandboxes_get_their_own_default_disk, test_teardown),
        cmocka_unit_test_teardown(placement_sees_disk, test_teardown),
        cmocka_unit_test_teardown(two_cells_fan_out_and_fill_over, test_teardown),
        cmocka_unit_test_teardown(lifetime_and_idle_reclaim, test_teardown),
        cmocka_unit_test_teardown(idempotent_create_under_retries, test_teardown),
        cmocka_unit_test_teardown(async_retry_outlives_the_callers_spec, test_teardown),
        cmocka_unit_test_teardown(async_retry_direct_callbacks, test_teardown),
        cmocka_unit_test_teardown(sandbox_operations, test_teardown),
        cmocka_unit_test_teardown(commands_run_at_once, test_teardown),
        cmocka_unit_test_teardown(busy_tenant_does_not_hold_up_another, test_teardown),
        cmocka_unit_test_teardown(long_command_is_not_idle, test_teardown),
        cmocka_unit_test_teardown(malformed_requests_get_errors, test_teardown),
        cmocka_unit_test_teardown(restarted_node_readopts_its_sandboxes, test_teardown),
        cmocka_unit_test_teardown(exec_answers_outlive_node_manager_restarts, test_teardown),
        cmocka_unit_test_teardown(ttl_moves_a_sandboxs_end, test_teardown),
        cmocka_unit_test_teardown(background_processes_unsupported_on_sim, test_teardown),
        cmocka_unit_test_teardown(killed_node_keeps_or_explains_acknowledged, test_teardown),
        cmocka_unit_test_teardown(restarted_node_keeps_what_its_lookup_answered, test_teardown),
        cmocka_unit_test_teardown(silent_node_is_drained, test_teardown),
        cmocka_unit_test_teardown(silent_nodes_are_drained_one_at_a_time, test_teardown),
    };
    /* DSEC_TEST_FILTER=killed_node* (a cmocka pattern) runs only what matches */
    if (getenv("DSEC_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("DSEC_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
