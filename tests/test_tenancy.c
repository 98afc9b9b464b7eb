/* test_tenancy.c - tenants, nested project quotas and owner checks end to end: a cell with two
 * scheduler replicas, sim nodes and the quota actor on a real nats-server. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/cell.h"
#include "actors/quota.h"
#include "actors/wire.h"
#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tests/fixture.h"
#include "tests/test_util.h"

static dsec_natsd *natsd;
static char root[64];
static int serial;
static const char *dsec_bin; /* argv[1]: the dsec tool, for the CLI test */

/* What a test started; the teardown stops it even after a failed assertion. */
static struct {
    dsec_cell *cell;
    dsec_cell_conf conf;
    dsec_quota *quota; /* started by the test itself (restart, standby tests) */
    dsec_quota *standby;
    dsec_bus *standby_bus; /* the standby's own connection, as another host's would be */
    dsec_client *clients[3];
} live;

static int test_teardown(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++)
        dsec_client_free(live.clients[i]);
    dsec_quota_stop(live.quota); /* on the cell's bus: before the cell */
    dsec_quota_stop(live.standby);
    dsec_bus_free(live.standby_bus);
    dsec_cell_stop(live.cell, true);
    dsec_cell_conf_release(&live.conf);
    memset(&live, 0, sizeof live);
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    return dsec_test_server_start("dsec-tenancy", true, &natsd, root, sizeof root);
}

static int group_teardown(void **state)
{
    (void)state;
    return dsec_test_server_stop(natsd, root);
}

/* A cell of 4 sim nodes (room for 400 sandboxes) and 2 scheduler replicas
 * with quotas on; the quota actor too unless the test starts its own. */
static void start_cell(bool with_quota_role)
{
    dsec_cell_conf *c = &live.conf;
    dsec_cell_conf_defaults(c);
    snprintf(c->cell, sizeof c->cell, "q%d-%ld", ++serial, (long)getpid());
    snprintf(c->url, sizeof c->url, "%s", dsec_natsd_url(natsd));
    snprintf(c->state_dir, sizeof c->state_dir, "%s/%s", root, c->cell);
    c->capacity_ms = 20;
    c->full_ms = 300;
    c->heartbeat_ms = 100;
    c->summary_ms = 100;
    c->sched_replicas = 2;
    c->quota = true;
    c->quota_reload_ms = 200;
    static const char *const types[] = {"sim", NULL};
    char prefix[80];
    snprintf(prefix, sizeof prefix, "%s-n", c->cell);
    dsec_err err;
    assert_int_equal(
        dsec_cell_conf_add_sim_nodes(c, prefix, 4, 400000, 400000, 100, types, "0", &err), 0);
    int roles = DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE | (with_quota_role ? DSEC_ROLE_QUOTA : 0);
    if (dsec_cell_start(&live.cell, c, roles, &err) < 0)
        fail_msg("cell %s: %s", c->cell, err.msg);
}

static dsec_client *client_for(int slot, const char *tenant)
{
    dsec_client_opts o = {.url = dsec_natsd_url(natsd),
                          .tenant = tenant,
                          .timeout_ms = 10000,
                          .retries = -1 /* see every refusal: no automatic retry */};
    dsec_err err;
    if (dsec_client_connect(&live.clients[slot], &o, &err) < 0)
        fail_msg("client: %s", err.msg);
    return live.clients[slot];
}

/* One request to the cell's quota actor; 0, or -1 with *err from its error answer. */
static int quota_req(const char *op, int type, const void *msg, dsec_msg_quota *out_q,
                     dsec_msg **keep, dsec_err *err)
{
    dsec_bus *bus = dsec_cell_bus(live.cell);
    char subj[160];
    snprintf(subj, sizeof subj, "dsec.v1.ctl.quota.%s.%s", live.conf.cell, op);
    dsec_buf b;
    dsec_buf_init(&b);
    assert_int_equal(dsec_encode(&b, type, msg, err), 0);
    dsec_msg *reply = NULL;
    dsec_hdr hdr = {.type = dsec_msg_type_name(type)};
    int rc = dsec_bus_request_sync(bus, subj, &hdr, b.data, b.len, 5000, &reply, err);
    dsec_buf_release(&b);
    if (rc < 0)
        fail_msg("quota %s: %s", op, err->msg);
    if (strcmp(dsec_msg_type(reply), "error") == 0) {
        dsec_msg_error e;
        assert_int_equal(dsec_decode(dsec_wire_decoder(), DSEC_MSG_ERROR, dsec_msg_data(reply),
                                     dsec_msg_len(reply), &e, err),
                         0);
        dsec_err_set(err, dsec_code_from_name(e.code), 0, "%s", e.message);
        dsec_msg_free(reply);
        return -1;
    }
    if (out_q != NULL)
        assert_int_equal(dsec_decode(dsec_wire_decoder(), DSEC_MSG_QUOTA, dsec_msg_data(reply),
                                     dsec_msg_len(reply), out_q, err),
                         0);
    *keep = reply; /* out_q's strings point into it */
    return 0;
}

static int quota_set(const char *tenant, const char *project, uint64_t sandboxes, uint64_t cpu,
                     uint64_t mem, dsec_err *err)
{
    dsec_msg_quota q = {.tenant = tenant,
                        .project = project,
                        .sandboxes = sandboxes,
                        .cpu_milli = cpu,
                        .memory_mb = mem};
    dsec_msg *keep = NULL;
    int rc = quota_req("set", DSEC_MSG_QUOTA, &q, NULL, &keep, err);
    dsec_msg_free(keep);
    return rc;
}

static uint64_t used_sandboxes(const char *tenant, const char *project)
{
    dsec_msg_quota q = {.tenant = tenant, .project = project}, out;
    dsec_msg *keep = NULL;
    dsec_err err;
    if (quota_req("get", DSEC_MSG_QUOTA, &q, &out, &keep, &err) < 0)
        fail_msg("quota get %s/%s: %s", tenant, project ? project : "", err.msg);
    uint64_t n = out.used_sandboxes;
    dsec_msg_free(keep);
    return n;
}

/* Wait until the quota actor counts want sandboxes for tenant[/project]. */
static void wait_used(const char *tenant, const char *project, uint64_t want)
{
    uint64_t got = 0;
    for (int i = 0; i < 300; i++) {
        if ((got = used_sandboxes(tenant, project)) == want)
            return;
        msleep(20);
    }
    fail_msg("%s/%s uses %" PRIu64 " sandboxes, expected %" PRIu64, tenant, project ? project : "",
             got, want);
}

/* ---- 100 parallel creates at the boundary -------------------------------------------- */

struct tally {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, ok, quota, other, other_unsafe; /* other_unsafe: not safe to retry */
    char ids[128][DSEC_ID_MAX];
    char other_msg[DSEC_ERR_MSG_MAX];
    char other_codes[256]; /* "code,code,..." of the others */
};

static void on_created(int status, const dsec_sandbox_info *info, const dsec_err *err, void *ud)
{
    struct tally *t = ud;
    pthread_mutex_lock(&t->mu);
    if (status == 0)
        snprintf(t->ids[t->ok++], DSEC_ID_MAX, "%s", info->id);
    else if (err->code == DSEC_E_QUOTA)
        t->quota++;
    else {
        t->other++;
        t->other_unsafe += !dsec_code_retry_safe(err->code);
        snprintf(t->other_msg, sizeof t->other_msg, "%s", err->msg);
        size_t k = strlen(t->other_codes);
        snprintf(t->other_codes + k, sizeof t->other_codes - k, "%s,", dsec_code_name(err->code));
    }
    t->done++;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static void fire(dsec_client *c, const char *project, int n, struct tally *t)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    dsec_create_spec spec = {.type = "sim", .cpu_milli = 100, .memory_mb = 64, .project = project};
    dsec_err err;
    for (int i = 0; i < n; i++)
        if (dsec_create_async(c, &spec, on_created, t, &err) < 0)
            fail_msg("create_async: %s", err.msg);
    pthread_mutex_lock(&t->mu);
    while (t->done < n)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
}

static void test_parallel_creates_at_boundary(void **state)
{
    (void)state;
    start_cell(true);
    dsec_err err;
    msleep((int)live.conf.full_ms + 1100); /* the quota actor's start-up count */
    assert_int_equal(quota_set("acme", NULL, 50, 0, 0, &err), 0);
    dsec_client *c = client_for(0, "acme");
    struct tally t;
    fire(c, NULL, 100, &t);
    printf("tenancy: 100 parallel creates against a quota of 50 over 2 replicas: %d created, %d "
           "refused for quota, %d other\n",
           t.ok, t.quota, t.other);
    assert_int_equal(t.other, 0);
    assert_int_equal(t.ok, 50);
    assert_int_equal(t.quota, 50);
    wait_used("acme", NULL, 50);

    /* room comes back as sandboxes end: destroy 10, then exactly 10 more fit */
    for (int i = 0; i < 10; i++)
        assert_int_equal(dsec_destroy(c, t.ids[i], &err), 0);
    wait_used("acme", NULL, 40);
    struct tally t2;
    fire(c, NULL, 30, &t2);
    assert_int_equal(t2.other, 0);
    assert_int_equal(t2.ok, 10);
    assert_int_equal(t2.quota, 20);

    /* the refusal names the level and the figures */
    dsec_create_spec spec = {.type = "sim", .cpu_milli = 100, .memory_mb = 64};
    dsec_sandbox_info info;
    assert_int_equal(dsec_create(c, &spec, &info, &err), -1);
    assert_int_equal(err.code, DSEC_E_QUOTA);
    assert_true(dsec_code_retry_safe(err.code));
    assert_non_null(strstr(err.msg, "tenant acme uses 50 of its 50 sandboxes"));

    /* a tenant without a quota is not held back by acme's */
    dsec_client *other = client_for(1, "beta");
    struct tally t3;
    fire(other, NULL, 60, &t3);
    assert_int_equal(t3.ok, 60);

    /* the scheduler replicas shared the work */
    for (size_t i = 0; i < dsec_cell_sched_count(live.cell); i++) {
        dsec_sched_stats st;
        dsec_sched_stats_get(dsec_cell_sched_at(live.cell, i), &st);
        printf("tenancy: replica %zu handled %" PRIu64 " creates, %" PRIu64 " over quota\n", i,
               st.creates, st.over_quota);
    }
}

/* ---- nested projects: delegation and admission at every level ------------------------- */

static void test_nested_projects(void **state)
{
    (void)state;
    start_cell(true);
    msleep((int)live.conf.full_ms + 1100);
    dsec_err err;
    /* a project needs its parent, and stays within it */
    assert_int_equal(quota_set("nest", "rl", 10, 0, 0, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "define its parent tenant nest first"));
    assert_int_equal(quota_set("nest", NULL, 20, 4000, 0, &err), 0);
    assert_int_equal(quota_set("nest", "rl", 10, 0, 0, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID); /* acme limits CPU, so rl must too */
    assert_non_null(strstr(err.msg, "milli-CPU must be limited"));
    assert_int_equal(quota_set("nest", "rl", 30, 4000, 0, &err), -1);
    assert_non_null(strstr(err.msg, "30 sandboxes exceeds the 20 of tenant nest"));
    assert_int_equal(quota_set("nest", "rl", 10, 4000, 0, &err), 0);
    assert_int_equal(quota_set("nest", "rl/math", 11, 1000, 0, &err), -1);
    assert_non_null(strstr(err.msg, "exceeds the 10 of project nest/rl"));
    assert_int_equal(quota_set("nest", "rl/math", 5, 1000, 0, &err), 0);
    /* a parent cannot shrink below a child */
    assert_int_equal(quota_set("nest", "rl", 4, 4000, 0, &err), -1);
    assert_non_null(strstr(err.msg, "below what its sub-project nest/rl/math has"));
    assert_int_equal(quota_set("nest", "bad//name", 1, 1, 0, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);

    dsec_client *c = client_for(0, "nest");
    struct tally t;
    fire(c, "rl/math", 8, &t); /* 5 fit rl/math */
    assert_int_equal(t.ok, 5);
    assert_int_equal(t.quota, 3);
    fire(c, "rl", 8, &t); /* rl holds 10 with its sub-project: 5 more */
    assert_int_equal(t.ok, 5);
    assert_int_equal(t.quota, 3);
    dsec_create_spec spec = {
        .type = "sim", .cpu_milli = 100, .memory_mb = 64, .project = "rl/other"};
    dsec_sandbox_info info;
    assert_int_equal(dsec_create(c, &spec, &info, &err),
                     -1); /* an undefined sub-project is bounded by rl */
    assert_non_null(strstr(err.msg, "project nest/rl uses 10 of its 10 sandboxes"));
    fire(c, NULL, 15, &t); /* the tenant holds 20: 10 more outside rl */
    assert_int_equal(t.ok, 10);
    assert_int_equal(t.quota, 5);
    wait_used("nest", NULL, 20);
    wait_used("nest", "rl", 10);
    wait_used("nest", "rl/math", 5);

    /* CPU is counted too: 20 x 100 milli of acme's 4000; a 3000-milli create does not fit */
    assert_int_equal(quota_set("nest", NULL, 100, 4000, 0, &err), 0);
    spec = (dsec_create_spec){.type = "sim", .cpu_milli = 3000, .memory_mb = 64};
    assert_int_equal(dsec_create(c, &spec, &info, &err), -1);
    assert_non_null(strstr(err.msg, "tenant nest uses 2000 of its 4000 milli-CPU"));

    /* a tenant with projects cannot be removed; the projects can, deepest first */
    dsec_msg_quota rm = {.tenant = "nest", .remove = true};
    dsec_msg *keep = NULL;
    assert_int_equal(quota_req("set", DSEC_MSG_QUOTA, &rm, NULL, &keep, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    rm.project = "rl";
    assert_int_equal(quota_req("set", DSEC_MSG_QUOTA, &rm, NULL, &keep, &err), -1);
    rm.project = "rl/math";
    assert_int_equal(quota_req("set", DSEC_MSG_QUOTA, &rm, NULL, &keep, &err), 0);
    dsec_msg_free(keep);

    /* the list holds what is left, sorted, with usage */
    dsec_msg_quota_list lr = {.tenant = "nest"}, lo;
    dsec_bus *bus = dsec_cell_bus(live.cell);
    char subj[160];
    snprintf(subj, sizeof subj, "dsec.v1.ctl.quota.%s.list", live.conf.cell);
    dsec_buf b;
    dsec_buf_init(&b);
    assert_int_equal(dsec_encode(&b, DSEC_MSG_QUOTA_LIST, &lr, &err), 0);
    dsec_msg *reply = NULL;
    dsec_hdr lh = {.type = "quota_list", .schema = DSEC_SCHEMA_VERSION};
    assert_int_equal(dsec_bus_request_sync(bus, subj, &lh, b.data, b.len, 5000, &reply, &err), 0);
    dsec_buf_release(&b);
    assert_int_equal(dsec_decode(dsec_wire_decoder(), DSEC_MSG_QUOTA_LIST, dsec_msg_data(reply),
                                 dsec_msg_len(reply), &lo, &err),
                     0);
    assert_int_equal(lo.items.n, 2);
    const dsec_msg_quota *it = lo.items.items;
    assert_null(it[0].project);
    assert_int_equal(it[0].used_sandboxes, 20);
    assert_string_equal(it[1].project, "rl");
    assert_int_equal(it[1].used_sandboxes, 10);
    dsec_msg_free(reply);
}

/* ---- forks ask for their children too ----------------------------------------------------- */

static void test_fork_within_quota(void **state)
{
    (void)state;
    start_cell(true);
    msleep((int)live.conf.full_ms + 1100);
    dsec_err err;
    assert_int_equal(quota_set("frk", NULL, 6, 0, 0, &err), 0);
    dsec_client *c = client_for(0, "frk");
    dsec_create_spec spec = {.type = "sim", .cpu_milli = 100, .memory_mb = 64};
    dsec_sandbox_info a, b;
    assert_int_equal(dsec_create(c, &spec, &a, &err), 0);
    assert_int_equal(dsec_create(c, &spec, &b, &err), 0);
    char **kids = NULL;
    size_t nk = 0;
    assert_int_equal(dsec_fork(c, a.id, 3, &kids, &nk, &err), 0);
    assert_int_equal(nk, 3);
    dsec_strv_free(kids, nk);
    /* 5 of 6 held: a fork into 2 does not fit, and says so */
    assert_int_equal(dsec_fork(c, b.id, 2, &kids, &nk, &err), -1);
    assert_int_equal(err.code, DSEC_E_QUOTA);
    assert_non_null(strstr(err.msg, "tenant frk uses 5 of its 6 sandboxes"));
    wait_used("frk", NULL, 5);
    /* the children count once (their events), not twice (their admission too) */
    msleep((int)live.conf.full_ms * 2);
    assert_int_equal(used_sandboxes("frk", NULL), 5);
    assert_int_equal(dsec_fork(c, b.id, 1, &kids, &nk, &err), 0);
    dsec_strv_free(kids, nk);
    wait_used("frk", NULL, 6);
}

/* ---- a restarted quota actor counts from the nodes' reports ----------------------------- */

static void test_restart_counts_from_nodes(void **state)
{
    (void)state;
    start_cell(false);
    dsec_err err;
    dsec_quota_conf qc = {.cell = live.conf.cell, .full_ms = live.conf.full_ms, .reload_ms = 200};
    assert_int_equal(dsec_quota_start(&live.quota, dsec_cell_bus(live.cell), &qc, &err), 0);
    msleep((int)live.conf.full_ms + 1100);
    assert_int_equal(quota_set("rst", NULL, 30, 0, 0, &err), 0);
    dsec_client *c = client_for(0, "rst");
    struct tally t;
    fire(c, NULL, 25, &t);
    assert_int_equal(t.ok, 25);

    /* the actor goes away: creates of a tenant with a quota fail, safe to retry */
    dsec_quota_stop(live.quota);
    live.quota = NULL;
    dsec_create_spec spec = {.type = "sim", .cpu_milli = 100, .memory_mb = 64};
    dsec_sandbox_info info;
    assert_int_equal(dsec_create(c, &spec, &info, &err), -1);
    assert_true(dsec_code_retry_safe(err.code));
    printf("tenancy: with no quota actor: %s (%s)\n", err.msg, dsec_code_name(err.code));

    /* a new one refuses while it counts, then knows the 25 from the nodes alone */
    assert_int_equal(dsec_quota_start(&live.quota, dsec_cell_bus(live.cell), &qc, &err), 0);
    assert_int_equal(dsec_create(c, &spec, &info, &err), -1);
    assert_int_equal(err.code, DSEC_E_QUOTA);
    assert_non_null(strstr(err.msg, "still counting"));
    msleep((int)live.conf.full_ms + 1100);
    wait_used("rst", NULL, 25);
    fire(c, NULL, 10, &t);
    assert_int_equal(t.ok, 5);
    assert_int_equal(t.quota, 5);
}

/* ---- a standby quota actor takes over, already knowing the usage ------------------------- */

static void test_standby_takes_over(void **state)
{
    (void)state;
    start_cell(false);
    dsec_err err;
    dsec_quota_conf qc = {
        .cell = live.conf.cell, .full_ms = live.conf.full_ms, .reload_ms = 200, .lease_ms = 900};
    assert_int_equal(dsec_quota_start(&live.quota, dsec_cell_bus(live.cell), &qc, &err), 0);
    dsec_bus_opts bo = {.url = dsec_natsd_url(natsd), .name = "quota-standby"};
    assert_int_equal(dsec_bus_connect(&live.standby_bus, &bo, &err), 0);
    assert_int_equal(dsec_quota_start(&live.standby, live.standby_bus, &qc, &err), 0);
    dsec_quota_stats a, b;
    dsec_quota_stats_get(live.quota, &a);
    dsec_quota_stats_get(live.standby, &b);
    assert_int_equal(a.active, 1);
    assert_int_equal(b.active, 0);
    msleep((int)live.conf.full_ms + 1100);
    assert_int_equal(quota_set("sby", NULL, 30, 0, 0, &err), 0);
    dsec_client *c = client_for(0, "sby");
    struct tally t;
    fire(c, NULL, 25, &t);
    assert_int_equal(t.ok, 25);
    /* the standby admitted nothing but counts the 25 from the nodes' events */
    dsec_quota_stats_get(live.standby, &b);
    assert_int_equal(b.admitted, 0);

    /* the active one stops: the standby holds the lease within a step and admits at once,
     * 5 more and no further */
    dsec_quota_stop(live.quota);
    live.quota = NULL;
    for (int i = 0; i < 100 && (dsec_quota_stats_get(live.standby, &b), b.active == 0); i++)
        msleep(20);
    assert_int_equal(b.active, 1);
    assert_int_equal(b.takeovers, 1);
    wait_used("sby", NULL, 25);
    fire(c, NULL, 10, &t);
    assert_int_equal(t.ok, 5);
    assert_int_equal(t.quota, 5);
    printf("tenancy: standby quota actor took over: %d more admitted, %d refused for quota\n", t.ok,
           t.quota);

    /* a restarted one stands by while the lease is held */
    assert_int_equal(dsec_quota_start(&live.quota, dsec_cell_bus(live.cell), &qc, &err), 0);
    msleep(700);
    dsec_quota_stats_get(live.quota, &a);
    dsec_quota_stats_get(live.standby, &b);
    assert_int_equal(a.active, 0);
    assert_int_equal(b.active, 1);
}

/* ---- the quota actor's bus answers instead of the actor: the client gets the code ------- */

struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool open;
    int entered;
};

/* A stand-in quota actor stuck in its first admission, so its one-slot mailbox
 * overflows and its bus answers the rest (as a quota actor handing its lease
 * over answers "closed"). */
static void stuck_admit(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a, (void)m;
    struct gate *g = ud;
    pthread_mutex_lock(&g->mu);
    g->entered++;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void test_bus_answer_keeps_its_code(void **state)
{
    (void)state;
    start_cell(false);
    struct gate g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    dsec_bus_opts bo = {
        .url = dsec_natsd_url(natsd), .name = "stuck-quota", .threads = 1, .mailbox_max = 1};
    dsec_err err;
    assert_int_equal(dsec_bus_connect(&live.standby_bus, &bo, &err), 0);
    dsec_actor *a = NULL;
    char subj[160];
    snprintf(subj, sizeof subj, "dsec.v1.ctl.quota.%s.admit", live.conf.cell);
    assert_int_equal(dsec_actor_new(&a, live.standby_bus, "stuck", &err), 0);
    assert_int_equal(dsec_actor_on(a, subj, NULL, stuck_admit, &g, &err), 0);
    assert_int_equal(dsec_bus_flush(live.standby_bus, 2000, &err), 0);
    dsec_client *c = client_for(0, "stk");
    struct tally t;
    /* one is held and one queued (both time out at the scheduler), the others overflow */
    fire(c, NULL, 6, &t);
    pthread_mutex_lock(&g.mu);
    g.open = true;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    /* every create failed with its code, each safe to retry; none became "internal" */
    printf("tenancy: creates while the quota actor's mailbox overflows: %s\n", t.other_codes);
    assert_int_equal(t.ok, 0);
    assert_int_equal(t.other, 6);
    assert_int_equal(t.other_unsafe, 0);
    assert_non_null(strstr(t.other_codes, "overflow"));
    dsec_actor_free(a);
}

/* ---- owners: another tenant's sandbox is out of reach, forged fields included ------------- */

static void test_other_tenants_sandbox(void **state)
{
    (void)state;
    start_cell(true);
    dsec_client *a = client_for(0, "alice");
    dsec_client *b = client_for(1, "bob");
    dsec_err err;
    dsec_create_spec spec = {.type = "sim"};
    dsec_sandbox_info info, st;
    assert_int_equal(dsec_create(a, &spec, &info, &err), 0);
    const char *argv[] = {"true", NULL};
    dsec_exec_opts eo = {.argv = argv};
    dsec_exec_reply r;
    char **kids = NULL;
    size_t nk = 0;
    uint8_t *data = NULL;
    size_t len = 0;
    dsec_dirent *ents = NULL;
    size_t ne = 0;
    /* each operation of bob on alice's sandbox is refused, and says why */
    assert_int_equal(dsec_status(b, info.id, &st, &err), -1);
    assert_int_equal(err.code, DSEC_E_PERMISSION);
    assert_non_null(strstr(err.msg, "does not belong to tenant bob"));
    assert_int_equal(dsec_exec(b, info.id, &eo, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_PERMISSION);
    assert_int_equal(dsec_file_write(b, info.id, "/x", "x", 1, 0644, &err), -1);
    assert_int_equal(err.code, DSEC_E_PERMISSION);
    assert_int_equal(dsec_file_read(b, info.id, "/x", &data, &len, &err), -1);
    assert_int_equal(err.code, DSEC_E_PERMISSION);
    assert_int_equal(dsec_file_list(b, info.id, "/", &ents, &ne, &err), -1);
    assert_int_equal(err.code, DSEC_E_PERMISSION);
    assert_int_equal(dsec_fork(b, info.id, 1, &kids, &nk, &err), -1);
    assert_int_equal(err.code, DSEC_E_PERMISSION);
    assert_int_equal(dsec_destroy(b, info.id, &err), -1);
    assert_int_equal(err.code, DSEC_E_PERMISSION);

    /* forged fields: bob's subject with alice in the body is still bob */
    char node[72], subj[256];
    assert_int_equal(dsec_id_node(info.id, node, sizeof node, &err), 0);
    snprintf(subj, sizeof subj, "dsec.v1.bob.sbx.%s.%s.op", node, info.id);
    dsec_msg_op op = {.id = info.id, .op = "destroy", .tenant = "alice"};
    dsec_buf buf;
    dsec_buf_init(&buf);
    assert_int_equal(dsec_encode(&buf, DSEC_MSG_OP, &op, &err), 0);
    dsec_msg *reply = NULL;
    assert_int_equal(dsec_bus_request_sync(dsec_cell_bus(live.cell), subj,
                                           &(dsec_hdr){.type = "op"}, buf.data, buf.len, 5000,
                                           &reply, &err),
                     0);
    assert_string_equal(dsec_msg_type(reply), "error");
    dsec_msg_free(reply);
    /* a create for alice sent on bob's subject is refused */
    snprintf(subj, sizeof subj, "dsec.v1.bob.create");
    dsec_msg_create cr = {.req_id = "forged-1", .tenant = "alice", .type = "sim"};
    buf.len = 0;
    assert_int_equal(dsec_encode(&buf, DSEC_MSG_CREATE, &cr, &err), 0);
    assert_int_equal(dsec_bus_request_sync(dsec_cell_bus(live.cell), subj,
                                           &(dsec_hdr){.type = "create"}, buf.data, buf.len, 5000,
                                           &reply, &err),
                     0);
    dsec_msg_error e;
    assert_string_equal(dsec_msg_type(reply), "error");
    assert_int_equal(dsec_decode(dsec_wire_decoder(), DSEC_MSG_ERROR, dsec_msg_data(reply),
                                 dsec_msg_len(reply), &e, &err),
                     0);
    assert_string_equal(e.code, "permission");
    dsec_msg_free(reply);
    dsec_buf_release(&buf);

    /* and alice's sandbox is untouched */
    assert_int_equal(dsec_status(a, info.id, &st, &err), 0);
    assert_string_equal(st.state, "running");
}

/* ---- the CLI ---------------------------------------------------------------------------- */

static int run_cli(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run_cli(char *out, size_t n, const char *fmt, ...)
{
    char args[512], cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "DSEC_URL='%s' DSEC_CELL='%s' '%s' %s 2>&1", dsec_natsd_url(natsd),
             live.conf.cell, dsec_bin, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t got = fread(out, 1, n - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(void **state)
{
    (void)state;
    if (dsec_bin == NULL)
        skip();
    start_cell(true);
    char out[4096];
    assert_int_equal(run_cli(out, sizeof out, "tenant set clit --sandboxes 10 --cpu 8000"), 0);
    assert_non_null(strstr(out, "clit"));
    assert_non_null(strstr(out, "0/10"));
    assert_int_equal(run_cli(out, sizeof out, "project set clit/rl --sandboxes 4 --cpu 2000"), 0);
    assert_int_equal(run_cli(out, sizeof out, "project set clit/rl/math --sandboxes 9 --cpu 100"),
                     1);
    assert_non_null(strstr(out, "9 sandboxes exceeds the 4 of project clit/rl"));
    assert_int_equal(run_cli(out, sizeof out, "project set clit --sandboxes 1"), 2);
    assert_non_null(strstr(out, "TENANT/PROJECT"));
    assert_int_equal(run_cli(out, sizeof out, "tenant set clit --sandboxes lots"), 2);
    assert_non_null(strstr(out, "expected a whole number"));
    assert_int_equal(run_cli(out, sizeof out, "tenant ls"), 0);
    assert_non_null(strstr(out, "clit"));
    assert_null(strstr(out, "clit/rl"));
    assert_int_equal(run_cli(out, sizeof out, "project ls clit"), 0);
    assert_non_null(strstr(out, "clit/rl"));
    assert_int_equal(run_cli(out, sizeof out, "tenant get nobody"), 1);
    assert_non_null(strstr(out, "tenant nobody is not defined"));
    assert_int_equal(run_cli(out, sizeof out, "tenant rm clit"), 1);
    assert_non_null(strstr(out, "has sub-projects"));
    assert_int_equal(run_cli(out, sizeof out, "project rm clit/rl"), 0);
    assert_int_equal(run_cli(out, sizeof out, "tenant rm clit"), 0);
    assert_int_equal(run_cli(out, sizeof out, "tenant ls"), 0);
    assert_null(strstr(out, "clit"));
}

int main(int argc, char **argv)
{
    dsec_bin = argc > 1 ? argv[1] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_parallel_creates_at_boundary, test_teardown),
        cmocka_unit_test_teardown(test_nested_projects, test_teardown),
        cmocka_unit_test_teardown(test_fork_within_quota, test_teardown),
        cmocka_unit_test_teardown(test_restart_counts_from_nodes, test_teardown),
        cmocka_unit_test_teardown(test_standby_takes_over, test_teardown),
        cmocka_unit_test_teardown(test_bus_answer_keeps_its_code, test_teardown),
        cmocka_unit_test_teardown(test_other_tenants_sandbox, test_teardown),
        cmocka_unit_test_teardown(test_cli, test_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
