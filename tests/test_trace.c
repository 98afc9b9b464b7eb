/* test_trace.c - a request's Dsec-Trace-Id end to end on a real nats-server, and dsec trace's hop
 * record. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/cell.h"
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

/* What a spy saw: every message on the subjects it watches. */
#define SEEN_MAX 512
struct seen {
    char subject[160];
    char type[32];
    char trace[80];
    char ev_ids[4][48];    /* sandbox_events: the sandbox ids ... */
    char ev_traces[4][80]; /* ... and their trace_id fields */
    char ev_states[4][16];
    int nev;
};

static struct {
    pthread_mutex_t mu;
    struct seen s[SEEN_MAX];
    int n;
} spy = {.mu = PTHREAD_MUTEX_INITIALIZER};

static struct {
    dsec_cell *cell;
    dsec_cell_conf conf;
    dsec_cell *cell2; /* forwarding: the cell with room */
    dsec_cell_conf conf2;
    dsec_client *client;
    dsec_bus *bus; /* the spy's */
} live;

static void copy(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src != NULL ? src : "");
}

static void on_spy(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a;
    (void)ud;
    pthread_mutex_lock(&spy.mu);
    if (spy.n < SEEN_MAX) {
        struct seen *s = &spy.s[spy.n++];
        memset(s, 0, sizeof *s);
        copy(s->subject, sizeof s->subject, dsec_msg_subject(m));
        copy(s->type, sizeof s->type, dsec_msg_type(m));
        copy(s->trace, sizeof s->trace, dsec_msg_header(m, DSEC_HDR_TRACE_ID));
        dsec_msg_sandbox_events evs;
        dsec_err err;
        if (strcmp(s->type, "sandbox_events") == 0 &&
            dsec_decode(dsec_wire_decoder(), DSEC_MSG_SANDBOX_EVENTS, dsec_msg_data(m),
                        dsec_msg_len(m), &evs, &err) == 0) {
            const dsec_msg_sandbox_event *e = evs.events.items;
            for (uint32_t i = 0; i < evs.events.n && s->nev < 4; i++, s->nev++) {
                copy(s->ev_ids[s->nev], sizeof s->ev_ids[0], e[i].id);
                copy(s->ev_traces[s->nev], sizeof s->ev_traces[0], e[i].trace_id);
                copy(s->ev_states[s->nev], sizeof s->ev_states[0], e[i].state);
            }
        }
    }
    pthread_mutex_unlock(&spy.mu);
}

static int group_setup(void **state)
{
    (void)state;
    /* JetStream: the quota actor's admission puts a request callback between
     * the create and its place, which must carry the trace across. */
    return dsec_test_server_start("dsec-trace", true, &natsd, root, sizeof root);
}

static int group_teardown(void **state)
{
    (void)state;
    return dsec_test_server_stop(natsd, root);
}

static int teardown(void **state)
{
    (void)state;
    dsec_trace_set(NULL, NULL);
    dsec_client_free(live.client);
    dsec_bus_free(live.bus);
    dsec_cell_stop(live.cell, true);
    dsec_cell_stop(live.cell2, true);
    dsec_cell_conf_release(&live.conf);
    dsec_cell_conf_release(&live.conf2);
    memset(&live, 0, sizeof live);
    pthread_mutex_lock(&spy.mu);
    spy.n = 0;
    pthread_mutex_unlock(&spy.mu);
    return 0;
}

static void conf_cell(dsec_cell_conf *c, double sample_rate, uint32_t slow_ms, uint64_t slots)
{
    dsec_cell_conf_defaults(c);
    snprintf(c->cell, sizeof c->cell, "tr%d-%ld", ++serial, (long)getpid());
    snprintf(c->url, sizeof c->url, "%s", dsec_natsd_url(natsd));
    snprintf(c->state_dir, sizeof c->state_dir, "%s/%s", root, c->cell);
    c->capacity_ms = 20;
    c->full_ms = 300;
    c->heartbeat_ms = 100;
    c->summary_ms = 100;
    c->trace_sample_rate = sample_rate;
    c->trace_slow_ms = slow_ms;
    c->trace_ring = 256;
    static const char *const types[] = {"sim", NULL};
    char prefix[80];
    snprintf(prefix, sizeof prefix, "%s-n", c->cell);
    dsec_err err;
    assert_int_equal(
        dsec_cell_conf_add_sim_nodes(c, prefix, 1, 64000, 65536, slots, types, "0", &err), 0);
}

/* The spy (on the first cell's node's place subject, its sandbox events and
 * _INBOX.spy.>) and a client of tenant acme. */
static void start_spy_and_client(void)
{
    dsec_cell_conf *c = &live.conf;
    dsec_err err;
    dsec_bus_opts bo = {.url = dsec_natsd_url(natsd), .name = "spy"};
    assert_int_equal(dsec_bus_connect(&live.bus, &bo, &err), 0);
    dsec_actor *a;
    assert_int_equal(dsec_actor_new(&a, live.bus, "spy", &err), 0);
    char subj[200];
    snprintf(subj, sizeof subj, "dsec.v1.ctl.place.%s", c->nodes[0].name);
    assert_int_equal(dsec_actor_on(a, subj, NULL, on_spy, NULL, &err), 0);
    snprintf(subj, sizeof subj, "dsec.v1.ctl.evt.%s.sbx.>", c->cell);
    assert_int_equal(dsec_actor_on(a, subj, NULL, on_spy, NULL, &err), 0);
    assert_int_equal(dsec_actor_on(a, "_INBOX.spy.>", NULL, on_spy, NULL, &err), 0);
    assert_int_equal(dsec_bus_flush(live.bus, 2000, &err), 0);

    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = "acme", .timeout_ms = 5000};
    assert_int_equal(dsec_client_connect(&live.client, &o, &err), 0);
}

/* A cell of one sim node with quotas on, tracing as asked, the spy and a client. */
static void start(double sample_rate, uint32_t slow_ms)
{
    dsec_cell_conf *c = &live.conf;
    conf_cell(c, sample_rate, slow_ms, 100);
    c->quota = true;
    dsec_err err;
    if (dsec_cell_start(&live.cell, c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE | DSEC_ROLE_QUOTA,
                        &err) < 0)
        fail_msg("cell %s: %s", c->cell, err.msg);
    start_spy_and_client();
}

/* One request from the spy's bus with trace id trace; the reply is the caller's. */
static dsec_msg *request(const char *subject, int type, const void *msg, const char *trace)
{
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_err err;
    assert_int_equal(dsec_encode(&b, type, msg, &err), 0);
    dsec_hdr hdr = {
        .type = dsec_msg_type_name(type), .schema = DSEC_SCHEMA_VERSION, .trace_id = trace};
    dsec_msg *reply = NULL;
    if (dsec_bus_request_sync(live.bus, subject, &hdr, b.data, b.len, 5000, &reply, &err) < 0)
        fail_msg("%s: %s", subject, err.msg);
    dsec_buf_release(&b);
    return reply;
}

/* How many seen messages of type carry trace (and how many of that type in all). */
static int count_seen(const char *type, const char *trace, int *all)
{
    int k = 0, n = 0;
    pthread_mutex_lock(&spy.mu);
    for (int i = 0; i < spy.n; i++)
        if (strcmp(spy.s[i].type, type) == 0) {
            n++;
            k += strcmp(spy.s[i].trace, trace) == 0;
        }
    pthread_mutex_unlock(&spy.mu);
    if (all != NULL)
        *all = n;
    return k;
}

/* count_seen once at least want messages of type arrived (the spy's
 * connection may deliver after the answer the test waited for). */
static int wait_seen(const char *type, const char *trace, int want, int *all)
{
    int n = 0;
    for (int i = 0; i < 300; i++) {
        count_seen(type, trace, &n);
        if (n >= want)
            break;
        msleep(10);
    }
    msleep(20); /* and a little more, for any that should not come */
    return count_seen(type, trace, all);
}

/* The trace_id of sandbox id's event in state, "" when it has none, NULL when not seen. */
static const char *event_trace(const char *id, const char *state, char *buf, size_t n)
{
    const char *r = NULL;
    pthread_mutex_lock(&spy.mu);
    for (int i = 0; i < spy.n && r == NULL; i++)
        for (int k = 0; k < spy.s[i].nev; k++)
            if (strcmp(spy.s[i].ev_ids[k], id) == 0 && strcmp(spy.s[i].ev_states[k], state) == 0) {
                copy(buf, n, spy.s[i].ev_traces[k]);
                r = buf;
                break;
            }
    pthread_mutex_unlock(&spy.mu);
    return r;
}

/* ---- the trace id follows the request ---------------------------------------- */

static void create_and_exec_carry_the_callers_trace(void **state)
{
    (void)state;
    start(1.0, 60000);
    const char *tid = "create-trace-0001";
    char subj[200];
    snprintf(subj, sizeof subj, "dsec.v1.acme.create");
    dsec_msg_create cr = {.req_id = "trace-req-1", .type = "sim"};
    dsec_msg *reply = request(subj, DSEC_MSG_CREATE, &cr, tid);
    assert_string_equal(dsec_msg_type(reply), "created");
    /* the created answer is the node's, after the scheduler and the quota actor */
    assert_string_equal(dsec_msg_header(reply, DSEC_HDR_TRACE_ID), tid);
    dsec_msg_created created;
    dsec_err err;
    assert_int_equal(dsec_decode(dsec_wire_decoder(), DSEC_MSG_CREATED, dsec_msg_data(reply),
                                 dsec_msg_len(reply), &created, &err),
                     0);
    char id[64], node[64];
    copy(id, sizeof id, created.id);
    copy(node, sizeof node, created.node);
    dsec_msg_free(reply);
    int all;
    assert_int_equal(wait_seen("place", tid, 1, &all), 1); /* the place the node got */
    assert_int_equal(all, 1);

    const char *xid = "exec-trace-0002";
    static const char *argv[] = {"echo", "hello"};
    dsec_msg_exec x = {.id = id, .argv = {argv, 2}, .stream_to = "_INBOX.spy.exec1"};
    snprintf(subj, sizeof subj, "dsec.v1.acme.sbx.%s.%s.exec", node, id);
    reply = request(subj, DSEC_MSG_EXEC, &x, xid);
    assert_string_equal(dsec_msg_type(reply), "exec_result");
    assert_string_equal(dsec_msg_header(reply, DSEC_HDR_TRACE_ID), xid);
    dsec_msg_free(reply);

    /* the exec's output chunks, and the lifecycle events the create caused */
    char buf[80];
    const char *ev = NULL;
    int chunks = 0;
    for (int i = 0; i < 300 && (ev == NULL || chunks == 0); i++) {
        msleep(10);
        ev = event_trace(id, "running", buf, sizeof buf);
        chunks = count_seen("exec_chunk", xid, &all);
    }
    assert_true(chunks > 0);
    assert_int_equal(chunks, all);
    assert_non_null(ev);
    assert_string_equal(ev, tid);
    assert_non_null(event_trace(id, "starting", buf, sizeof buf));
    assert_string_equal(buf, tid);

    /* a destroy's events carry the destroy's trace, not the create's */
    assert_int_equal(dsec_trace_set("destroy-trace-0003", &err), 0);
    assert_int_equal(dsec_destroy(live.client, id, &err), 0);
    assert_int_equal(dsec_trace_set(NULL, &err), 0);
    for (int i = 0; i < 300 && event_trace(id, "gone", buf, sizeof buf) == NULL; i++)
        msleep(10);
    assert_non_null(event_trace(id, "gone", buf, sizeof buf));
    assert_string_equal(buf, "destroy-trace-0003");
}

/* libdsec: the caller's id on its thread reaches the node; without one,
 * each create gets its own fresh id. */
static void libdsec_calls_carry_the_threads_trace(void **state)
{
    (void)state;
    start(1.0, 60000);
    dsec_err err;
    assert_int_equal(dsec_trace_set("bad id", &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_null(dsec_trace_get());
    assert_int_equal(dsec_trace_set("lib-trace-0004", &err), 0);
    assert_string_equal(dsec_trace_get(), "lib-trace-0004");
    dsec_sandbox_info info;
    assert_int_equal(dsec_create(live.client, &(dsec_create_spec){.type = "sim"}, &info, &err), 0);
    assert_int_equal(wait_seen("place", "lib-trace-0004", 1, NULL), 1);
    assert_int_equal(dsec_trace_set(NULL, &err), 0);
    assert_int_equal(dsec_create(live.client, &(dsec_create_spec){.type = "sim"}, &info, &err), 0);
    assert_int_equal(dsec_create(live.client, &(dsec_create_spec){.type = "sim"}, &info, &err), 0);
    int all;
    assert_int_equal(wait_seen("place", "lib-trace-0004", 3, &all), 1);
    assert_int_equal(all, 3);
    pthread_mutex_lock(&spy.mu);
    char a[80] = "", b[80] = "";
    for (int i = 0; i < spy.n; i++)
        if (strcmp(spy.s[i].type, "place") == 0 && strcmp(spy.s[i].trace, "lib-trace-0004") != 0)
            copy(a[0] ? b : a, sizeof a, spy.s[i].trace);
    pthread_mutex_unlock(&spy.mu);
    assert_true(a[0] != '\0' && b[0] != '\0');
    assert_string_not_equal(a, b);
}

/* ---- dsec trace: the hops ------------------------------------------------------ */

static const dsec_trace_hop_info *find_hop(const dsec_trace_hop_info *h, size_t n, const char *type)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(h[i].type, type) == 0)
            return &h[i];
    return NULL;
}

static void trace_shows_scheduler_then_node(void **state)
{
    (void)state;
    start(1.0, 60000);
    dsec_err err;
    assert_int_equal(dsec_trace_set("hops-trace-0005", &err), 0);
    dsec_sandbox_info info;
    assert_int_equal(dsec_create(live.client, &(dsec_create_spec){.type = "sim"}, &info, &err), 0);
    static const char *const argv[] = {"true", NULL};
    dsec_exec_reply res;
    assert_int_equal(dsec_exec(live.client, info.id, &(dsec_exec_opts){.argv = argv}, &res, &err),
                     0);
    dsec_exec_reply_release(&res);
    assert_int_equal(dsec_trace_set(NULL, &err), 0);

    dsec_trace_hop_info *h = NULL;
    size_t n = 0, answered = 0;
    const dsec_trace_hop_info *create = NULL, *admit = NULL, *place = NULL, *exec = NULL;
    /* a handler records its hop when it returns, which may be after its answer reached the
     * caller (the node's exec hop after its result came back): ask again until all are there */
    for (int round = 0; round < 100; round++) {
        if (h != NULL)
            dsec_trace_hops_free(h);
        h = NULL;
        assert_int_equal(
            dsec_trace_hops(live.client, "hops-trace-0005", 300, &h, &n, &answered, &err), 0);
        create = find_hop(h, n, "create");
        admit = find_hop(h, n, "admit");
        place = find_hop(h, n, "place");
        exec = find_hop(h, n, "exec");
        if (answered >= 1 && create && admit && place && exec)
            break;
        msleep(50);
    }
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "  hop %zu: %s %s %s -> %s [%s] %.3f ms\n", i, h[i].actor, h[i].subject,
                h[i].type, h[i].sent, h[i].kept, (double)(h[i].end_ns - h[i].start_ns) / 1e6);
    assert_true(answered >= 1);
    assert_non_null(create);
    assert_non_null(admit);
    assert_non_null(place);
    assert_non_null(exec);
    assert_string_equal(create->sent, "admit"); /* the scheduler asks the quota actor first */
    assert_string_equal(admit->sent, "admit");
    assert_string_equal(place->sent, "created");
    assert_string_equal(exec->sent, "exec_result");
    assert_string_equal(place->actor, info.node);
    assert_string_equal(place->kept, "sample");
    assert_false(place->error);
    /* the scheduler's callback for the quota actor's answer sent the place */
    const dsec_trace_hop_info *admitted = NULL;
    for (size_t i = 0; i < n; i++)
        if (strcmp(h[i].actor, create->actor) == 0 && strcmp(h[i].type, "admit") == 0)
            admitted = &h[i];
    assert_non_null(admitted);
    assert_string_equal(admitted->sent, "place");
    /* causal order: the quota actor's answer came before it, and its place before the node's
     * hop, and the node's place hop before the exec's. Not end against start: a handler may
     * still be finishing after it sent its answer while the next hop has begun (seen under
     * make check's load: the callback after it sent the place; the node's place hop after
     * its "created" reached the client, whose exec had begun). */
    assert_true(admitted->start_ns >= admit->start_ns && admitted->start_ns <= place->start_ns);
    assert_true(create->start_ns <= admit->start_ns);
    assert_true(admit->start_ns <= place->start_ns);
    assert_true(place->start_ns <= exec->start_ns);
    for (size_t i = 1; i < n; i++) /* ordered by start */
        assert_true(h[i - 1].start_ns <= h[i].start_ns);
    dsec_trace_hops_free(h);
}

/* At sample rate 0 only errors (and slow hops) are kept. */
static void errors_are_kept_at_sample_rate_zero(void **state)
{
    (void)state;
    start(0.0, 60000);
    dsec_err err;
    dsec_sandbox_info info;
    assert_int_equal(dsec_trace_set("ok-trace-0006", &err), 0);
    assert_int_equal(dsec_create(live.client, &(dsec_create_spec){.type = "sim"}, &info, &err), 0);
    assert_int_equal(dsec_trace_set("err-trace-0007", &err), 0);
    assert_int_equal(dsec_create(live.client, &(dsec_create_spec){.type = "banana"}, &info, &err),
                     -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    assert_int_equal(dsec_trace_set(NULL, &err), 0);

    dsec_trace_hop_info *h = NULL;
    size_t n = 0;
    assert_int_equal(dsec_trace_hops(live.client, "ok-trace-0006", 300, &h, &n, NULL, &err), 0);
    assert_int_equal(n, 0);
    dsec_trace_hops_free(h);
    assert_int_equal(dsec_trace_hops(live.client, "err-trace-0007", 300, &h, &n, NULL, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(h[0].type, "create");
    assert_string_equal(h[0].sent, "error");
    assert_string_equal(h[0].kept, "error");
    assert_true(h[0].error);
    dsec_trace_hops_free(h);
    assert_int_equal(dsec_trace_hops(live.client, "bad id", 300, &h, &n, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
}

/* Slow hops are kept at sample rate 0 too: every hop is "slow" at 0 ms. */
static void slow_hops_are_kept(void **state)
{
    (void)state;
    start(0.0, 0);
    dsec_err err;
    dsec_sandbox_info info;
    assert_int_equal(dsec_trace_set("slow-trace-0008", &err), 0);
    assert_int_equal(dsec_create(live.client, &(dsec_create_spec){.type = "sim"}, &info, &err), 0);
    assert_int_equal(dsec_trace_set(NULL, &err), 0);
    dsec_trace_hop_info *h = NULL;
    size_t n = 0;
    assert_int_equal(dsec_trace_hops(live.client, "slow-trace-0008", 300, &h, &n, NULL, &err), 0);
    const dsec_trace_hop_info *place = find_hop(h, n, "place");
    assert_non_null(place);
    assert_string_equal(place->kept, "slow");
    dsec_trace_hops_free(h);
}

/* A create that reaches a full cell goes on to another: the forwarded
 * create, that cell's place and the answer keep the caller's id, and both
 * processes' hops come back. */
static void a_forwarded_create_keeps_its_trace(void **state)
{
    (void)state;
    conf_cell(&live.conf, 1.0, 60000, 1);
    conf_cell(&live.conf2, 1.0, 60000, 4);
    dsec_err err;
    int roles = DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE;
    if (dsec_cell_start(&live.cell, &live.conf, roles, &err) < 0 ||
        dsec_cell_start(&live.cell2, &live.conf2, roles, &err) < 0)
        fail_msg("cells: %s", err.msg);
    start_spy_and_client();
    char subj[200];
    snprintf(subj, sizeof subj, "dsec.v1.acme.create.%s", live.conf.cell);
    dsec_msg_create fill = {.req_id = "fill-1", .type = "sim"};
    dsec_msg *reply = request(subj, DSEC_MSG_CREATE, &fill, "fill-trace-0009");
    assert_string_equal(dsec_msg_type(reply), "created");
    dsec_msg_free(reply);
    msleep(500); /* a few summary periods: the first cell is full, the other not */

    const char *tid = "fwd-trace-0010";
    dsec_msg_create cr = {.req_id = "fwd-1", .type = "sim"};
    reply = request(subj, DSEC_MSG_CREATE, &cr, tid);
    assert_string_equal(dsec_msg_type(reply), "created");
    assert_string_equal(dsec_msg_header(reply, DSEC_HDR_TRACE_ID), tid);
    dsec_msg_created created;
    assert_int_equal(dsec_decode(dsec_wire_decoder(), DSEC_MSG_CREATED, dsec_msg_data(reply),
                                 dsec_msg_len(reply), &created, &err),
                     0);
    assert_string_equal(created.cell, live.conf2.cell);
    dsec_msg_free(reply);

    dsec_trace_hop_info *h = NULL;
    size_t n = 0, answered = 0;
    int forwarded = 0, placed = 0, made = 0;
    /* a handler records its hop when it returns, which may be after its answer reached the
     * caller (the node's place hop after "created" came back): ask again until all are there */
    for (int round = 0; round < 100; round++) {
        if (h != NULL)
            dsec_trace_hops_free(h);
        h = NULL;
        assert_int_equal(dsec_trace_hops(live.client, tid, 300, &h, &n, &answered, &err), 0);
        /* the first cell's scheduler forwarded (sent a create); the second's placed */
        forwarded = placed = made = 0;
        for (size_t i = 0; i < n; i++) {
            bool first = strstr(h[i].process, live.conf.cell) != NULL;
            if (first && strcmp(h[i].type, "create") == 0 && strcmp(h[i].sent, "create") == 0)
                forwarded++;
            if (!first && strcmp(h[i].type, "create") == 0 && strcmp(h[i].sent, "place") == 0)
                placed++;
            if (!first && strcmp(h[i].type, "place") == 0 && strcmp(h[i].sent, "created") == 0)
                made++;
        }
        if (answered == 2 && forwarded > 0 && placed > 0 && made > 0)
            break;
        msleep(50);
    }
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "  hop %zu: %s/%s %s %s -> %s\n", i, h[i].process, h[i].actor, h[i].subject,
                h[i].type, h[i].sent);
    assert_int_equal(answered, 2);
    assert_int_equal(forwarded, 1);
    assert_int_equal(placed, 1);
    assert_int_equal(made, 1);
    dsec_trace_hops_free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(create_and_exec_carry_the_callers_trace, teardown),
        cmocka_unit_test_teardown(libdsec_calls_carry_the_threads_trace, teardown),
        cmocka_unit_test_teardown(trace_shows_scheduler_then_node, teardown),
        cmocka_unit_test_teardown(errors_are_kept_at_sample_rate_zero, teardown),
        cmocka_unit_test_teardown(slow_hops_are_kept, teardown),
        cmocka_unit_test_teardown(a_forwarded_create_keeps_its_trace, teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
