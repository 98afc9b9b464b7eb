/* test_conformance.c - docs/protocol.md held against a running cell: every request message of its
 * tables, every answer's headers and fields. */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/cell.h"
#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/job.h"
#include "tests/fixture.h"

#define TENANT "conf"
#define TIMEOUT_MS 5000
#define PAYLOAD_MAX (8u << 20) /* dsec's payload limit (docs/protocol.md, Transport) */

/* One message as it arrived: its headers and body, copied. */
typedef struct snap {
    char subject[300];
    char *type, *schema, *ctype, *req_id, *trace, *ecode;
    uint8_t *data;
    size_t len;
} snap;

/* What the probe actor caught on _INBOX.conform.> and the sync subjects. */
#define CAUGHT_MAX 256
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    snap v[CAUGHT_MAX];
    size_t n;
} caught = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {{{0}}}, 0};

static struct {
    dsec_natsd *natsd;
    char root[64];
    dsec_cell_conf conf;
    dsec_cell *cell;
    dsec_bus *bus; /* the requests' own connection, as any client's */
    dsec_bus *tap; /* the probe's */
    dsec_client *client;
    dsec_job *job;
    char sid[80], node[80], node1[80], create_rid[64];
} g;

static char *dup_or_null(const char *s)
{
    return s != NULL ? dsec_strdup(s) : NULL;
}

static void snap_take(snap *s, dsec_msg *m)
{
    memset(s, 0, sizeof *s);
    snprintf(s->subject, sizeof s->subject, "%s", dsec_msg_subject(m));
    s->type = dup_or_null(dsec_msg_header(m, DSEC_HDR_TYPE));
    s->schema = dup_or_null(dsec_msg_header(m, DSEC_HDR_SCHEMA));
    s->ctype = dup_or_null(dsec_msg_header(m, DSEC_HDR_CONTENT_TYPE));
    s->req_id = dup_or_null(dsec_msg_header(m, DSEC_HDR_REQ_ID));
    s->trace = dup_or_null(dsec_msg_header(m, DSEC_HDR_TRACE_ID));
    s->ecode = dup_or_null(dsec_msg_header(m, DSEC_HDR_ERROR_CODE));
    s->len = dsec_msg_len(m);
    s->data = dsec_malloc(s->len ? s->len : 1);
    assert_non_null(s->data);
    if (s->len)
        memcpy(s->data, dsec_msg_data(m), s->len);
}

static void snap_free(snap *s)
{
    dsec_free(s->type);
    dsec_free(s->schema);
    dsec_free(s->ctype);
    dsec_free(s->req_id);
    dsec_free(s->trace);
    dsec_free(s->ecode);
    dsec_free(s->data);
    memset(s, 0, sizeof *s);
}

static void on_probe(dsec_actor *a, dsec_msg *m, void *ud)
{
    pthread_mutex_lock(&caught.mu);
    if (caught.n < CAUGHT_MAX)
        snap_take(&caught.v[caught.n++], m);
    pthread_cond_broadcast(&caught.cv);
    pthread_mutex_unlock(&caught.mu);
}

/* Wait for the first message caught on subject; *out is the caller's. */
static bool catch_on(const char *subject, snap *out)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += TIMEOUT_MS / 1000;
    bool found = false;
    pthread_mutex_lock(&caught.mu);
    for (;;) {
        for (size_t i = 0; i < caught.n && !found; i++)
            if (strcmp(caught.v[i].subject, subject) == 0) {
                *out = caught.v[i];
                memmove(&caught.v[i], &caught.v[i + 1], (caught.n - i - 1) * sizeof *caught.v);
                caught.n--;
                found = true;
            }
        if (found || pthread_cond_timedwait(&caught.cv, &caught.mu, &dl) != 0)
            break;
    }
    pthread_mutex_unlock(&caught.mu);
    return found;
}

/* ---- the doc's rules for every message ---------------------------------------- */

/* A decoded error, its strings copied. */
typedef struct err_body {
    char code[65], field[257], req_id[65], message[512];
    bool retry_safe;
} err_body;

/* The headers table and the message tables of docs/protocol.md, applied to
 * one answer: Dsec-Type names a message of the tables, Dsec-Schema is 1,
 * Content-Type is msgpack, a trace id is there, and the body decodes
 * strictly as the message Dsec-Type names (the schemas the tables are
 * generated from). An error names its code; decode, too_large and invalid
 * errors name their field; a req_id in an error is the one in its header.
 * want_req_id, when not NULL, is the request's: the answer carries it. */
static void check_message(const snap *s, const char *want_req_id, err_body *eb, const char *what)
{
    if (eb != NULL)
        memset(eb, 0, sizeof *eb);
    if (s->type == NULL)
        fail_msg("%s: no Dsec-Type", what);
    bool is_error = strcmp(s->type, DSEC_TYPE_ERROR) == 0;
    int type = dsec_msg_type_from_name(s->type);
    if (type == DSEC_MSG_NONE && strcmp(s->type, "sync") != 0)
        fail_msg("%s: Dsec-Type \"%s\" is no message of the tables", what, s->type);
    if (s->schema == NULL || strcmp(s->schema, "1") != 0)
        fail_msg("%s (%s): Dsec-Schema is \"%s\", not 1", what, s->type,
                 s->schema ? s->schema : "(none)");
    if (s->ctype == NULL || strcmp(s->ctype, DSEC_CONTENT_TYPE) != 0)
        fail_msg("%s (%s): Content-Type is \"%s\"", what, s->type, s->ctype ? s->ctype : "(none)");
    if (s->trace == NULL || s->trace[0] == '\0')
        fail_msg("%s (%s): no Dsec-Trace-Id", what, s->type);
    if (want_req_id != NULL && (s->req_id == NULL || strcmp(s->req_id, want_req_id) != 0))
        fail_msg("%s (%s): Dsec-Req-Id is \"%s\", the request's is \"%s\"", what, s->type,
                 s->req_id ? s->req_id : "(none)", want_req_id);
    if (strcmp(s->type, "sync") == 0) {
        assert_int_equal(s->len, 0);
        return;
    }
    if (s->len == 0) {
        /* a bus-level error: the code is in its header */
        if (!is_error || s->ecode == NULL)
            fail_msg("%s: an empty %s without Dsec-Error-Code", what, s->type);
        assert_string_equal(dsec_code_name(dsec_code_from_name(s->ecode)), s->ecode);
        if (eb != NULL)
            snprintf(eb->code, sizeof eb->code, "%s", s->ecode);
        return;
    }
    dsec_decoder *d = dsec_decoder_new(NULL);
    assert_non_null(d);
    union {
        dsec_msg_error e;
        char any[4096];
    } u;
    dsec_err err;
    if (dsec_decode(d, type, s->data, s->len, &u, &err) < 0)
        fail_msg("%s: the %s answer does not decode by its table: %s", what, s->type, err.msg);
    if (is_error) {
        const dsec_msg_error *e = &u.e;
        if (strcmp(dsec_code_name(dsec_code_from_name(e->code)), e->code) != 0)
            fail_msg("%s: error code \"%s\" is not in the Errors table", what, e->code);
        if (e->retry_safe != dsec_code_retry_safe(dsec_code_from_name(e->code)))
            fail_msg("%s: %s error with retry_safe %d", what, e->code, e->retry_safe);
        /* decode and too_large name no field only when the payload as a whole
         * is at fault (not a map, truncated, over 8 MiB) */
        bool whole = strncmp(e->message, "payload:", 8) == 0;
        bool needs_field =
            ((strcmp(e->code, "decode") == 0 || strcmp(e->code, "too_large") == 0) && !whole) ||
            strcmp(e->code, "invalid") == 0;
        if (needs_field && (e->field == NULL || e->field[0] == '\0'))
            fail_msg("%s: %s error without its field: %s", what, e->code, e->message);
        if (e->req_id != NULL && (s->req_id == NULL || strcmp(e->req_id, s->req_id) != 0))
            fail_msg("%s: error req_id \"%s\" but Dsec-Req-Id \"%s\"", what, e->req_id,
                     s->req_id ? s->req_id : "(none)");
        if (eb != NULL) {
            snprintf(eb->code, sizeof eb->code, "%s", e->code);
            snprintf(eb->field, sizeof eb->field, "%s", e->field ? e->field : "");
            snprintf(eb->req_id, sizeof eb->req_id, "%s", e->req_id ? e->req_id : "");
            snprintf(eb->message, sizeof eb->message, "%s", e->message);
            eb->retry_safe = e->retry_safe;
        }
    }
    dsec_decoder_free(d);
}

/* ---- requests ------------------------------------------------------------------- */

/* Send payload as a request. type NULL: no headers at all. */
static void raw_request(const char *subject, const char *type, const char *req_id, const void *data,
                        size_t len, snap *out)
{
    dsec_hdr h = {.type = type, .schema = DSEC_SCHEMA_VERSION, .req_id = req_id};
    dsec_msg *reply = NULL;
    dsec_err err;
    if (dsec_bus_request_sync(g.bus, subject, type ? &h : NULL, data, len, TIMEOUT_MS, &reply,
                              &err) < 0)
        fail_msg("request %s (%s, %zu bytes): %s", subject, type ? type : "no headers", len,
                 err.msg);
    snap_take(out, reply);
    dsec_msg_free(reply);
}

static void encode(dsec_buf *b, int type, const void *msg)
{
    dsec_buf_init(b);
    dsec_err err;
    if (dsec_encode(b, type, msg, &err) < 0)
        fail_msg("encoding %s: %s", dsec_msg_type_name(type), err.msg);
}

/* Send msg as a request of its own type (or as_type) and check the answer
 * by the doc; *out is the caller's. */
static void request_as(const char *subject, int type, const void *msg, const char *as_type,
                       const char *req_id, snap *out, err_body *eb)
{
    dsec_buf b;
    encode(&b, type, msg);
    /* Dsec-Req-Id is the payload's req_id when it has one (Transport) */
    char body_id[65];
    if (req_id != NULL && dsec_msgpack_peek_str(b.data, b.len, "req_id", body_id, sizeof body_id))
        req_id = body_id;
    raw_request(subject, as_type, req_id, b.data, b.len, out);
    dsec_buf_release(&b);
    char what[400];
    snprintf(what, sizeof what, "%s to %s", as_type ? as_type : "(no headers)", subject);
    check_message(out, req_id, eb, what);
}

/* A valid request: answered with want (a type name). */
static void expect_answer(const char *subject, int type, const void *msg, const char *want,
                          snap *out)
{
    char rid[64];
    snprintf(rid, sizeof rid, "cf-%08lx", random());
    err_body eb;
    request_as(subject, type, msg, dsec_msg_type_name(type), rid, out, &eb);
    if (strcmp(out->type, want) != 0)
        fail_msg("%s to %s: answered %s (%s, field \"%s\": %s), not %s", dsec_msg_type_name(type),
                 subject, out->type, eb.code, eb.field, eb.message, want);
}

/* A request answered with an error of code naming field (NULL: no check). */
static void expect_error(const char *subject, int type, const void *msg, const char *as_type,
                         const char *code, const char *field)
{
    snap s;
    err_body eb;
    char rid[64];
    snprintf(rid, sizeof rid, "cf-%08lx", random());
    request_as(subject, type, msg, as_type, as_type ? rid : NULL, &s, &eb);
    if (strcmp(s.type, DSEC_TYPE_ERROR) != 0)
        fail_msg("%s sent as %s to %s: answered %s, not an error", dsec_msg_type_name(type),
                 as_type ? as_type : "(no headers)", subject, s.type);
    if (strcmp(eb.code, code) != 0 || (field != NULL && strcmp(eb.field, field) != 0))
        fail_msg("%s sent as %s to %s: error %s field \"%s\", expected %s field \"%s\"",
                 dsec_msg_type_name(type), as_type ? as_type : "(no headers)", subject, eb.code,
                 eb.field, code, field ? field : "");
    snap_free(&s);
}

static void sbx_subject(char *out, size_t n, const char *op)
{
    snprintf(out, n, "dsec.v1." TENANT ".sbx.%s.%s.%s", g.node, g.sid, op);
}

/* ---- setup ------------------------------------------------------------------------ */

static int group_setup(void **state)
{
    srandom((unsigned)getpid());
    if (dsec_test_server_start("dsec-conform", true, &g.natsd, g.root, sizeof g.root) < 0)
        return -1;
    dsec_err err;
    dsec_bus_opts to = {.url = dsec_natsd_url(g.natsd), .name = "conform-tap", .threads = 1};
    dsec_actor *probe;
    if (dsec_bus_connect(&g.tap, &to, &err) < 0 ||
        dsec_actor_new(&probe, g.tap, "probe", &err) < 0 ||
        dsec_actor_on(probe, "_INBOX.conform.>", NULL, on_probe, NULL, &err) < 0 ||
        dsec_actor_on(probe, "dsec.v1.ctl.sync", NULL, on_probe, NULL, &err) < 0 ||
        dsec_actor_on(probe, "dsec.v1.ctl.sync.>", NULL, on_probe, NULL, &err) < 0 ||
        dsec_bus_flush(g.tap, 2000, &err) < 0) {
        fprintf(stderr, "tap: %s\n", err.msg);
        return -1;
    }
    dsec_cell_conf *c = &g.conf;
    dsec_cell_conf_defaults(c);
    snprintf(c->cell, sizeof c->cell, "conf-%ld", (long)getpid());
    snprintf(c->url, sizeof c->url, "%s", dsec_natsd_url(g.natsd));
    snprintf(c->state_dir, sizeof c->state_dir, "%s/%s", g.root, c->cell);
    c->capacity_ms = 20;
    c->full_ms = 500;
    c->heartbeat_ms = 100;
    c->summary_ms = 200;
    c->quota = true;
    static const char *const types[] = {"sim", NULL};
    char prefix[80];
    snprintf(prefix, sizeof prefix, "%s-n", c->cell);
    if (dsec_cell_conf_add_sim_nodes(c, prefix, 2, 4000, 8192, 100, types, "0", &err) < 0 ||
        dsec_cell_start(&g.cell, c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE | DSEC_ROLE_QUOTA, &err) <
            0) {
        fprintf(stderr, "cell: %s\n", err.msg);
        return -1;
    }
    snprintf(g.node1, sizeof g.node1, "%s", c->nodes[1].name);
    dsec_bus_opts bo = {.url = c->url, .name = "conform", .threads = 2};
    dsec_client_opts o = {.url = c->url, .tenant = TENANT, .timeout_ms = TIMEOUT_MS};
    if (dsec_bus_connect(&g.bus, &bo, &err) < 0 || dsec_client_connect(&g.client, &o, &err) < 0) {
        fprintf(stderr, "client: %s\n", err.msg);
        return -1;
    }
    dsec_job_spec js = {.name = "conf-job", .cell = c->cell, .cls = "job"};
    if (dsec_job_start(g.client, &js, NULL, NULL, &g.job, &err) < 0) {
        fprintf(stderr, "job: %s\n", err.msg);
        return -1;
    }
    /* the quota actor serves once it holds its lease; creates are admitted by it */
    char subj[160];
    snprintf(subj, sizeof subj, "dsec.v1.ctl.quota.%s.list", c->cell);
    dsec_buf b;
    encode(&b, DSEC_MSG_QUOTA_LIST, &(dsec_msg_quota_list){0});
    dsec_hdr h = {.type = "quota_list", .schema = DSEC_SCHEMA_VERSION};
    int rc = -1;
    for (int i = 0; i < 100 && rc < 0; i++) {
        dsec_msg *reply = NULL;
        rc = dsec_bus_request_sync(g.bus, subj, &h, b.data, b.len, 500, &reply, &err);
        dsec_msg_free(reply);
        if (rc < 0)
            usleep(100000);
    }
    dsec_buf_release(&b);
    if (rc < 0) {
        fprintf(stderr, "quota actor: %s\n", err.msg);
        return -1;
    }
    /* the sandbox the sandbox operations work on */
    snprintf(g.create_rid, sizeof g.create_rid, "cf-create-%ld", (long)getpid());
    dsec_msg_create cr = {.req_id = g.create_rid, .type = "sim", .cpu_milli = 100, .memory_mb = 64};
    snap s;
    snprintf(subj, sizeof subj, "dsec.v1." TENANT ".create.%s", c->cell);
    for (int i = 0; i < 100; i++) { /* until the schedulers saw the nodes */
        dsec_buf cb;
        encode(&cb, DSEC_MSG_CREATE, &cr);
        raw_request(subj, "create", g.create_rid, cb.data, cb.len, &s);
        dsec_buf_release(&cb);
        if (strcmp(s.type, "created") == 0)
            break;
        snap_free(&s);
        cr.retry = (uint64_t)i + 1;
        usleep(100000);
    }
    if (s.type == NULL || strcmp(s.type, "created") != 0) {
        fprintf(stderr, "no sandbox was created\n");
        return -1;
    }
    dsec_decoder *d = dsec_decoder_new(NULL);
    dsec_msg_created cd;
    if (dsec_decode(d, DSEC_MSG_CREATED, s.data, s.len, &cd, &err) < 0)
        return -1;
    snprintf(g.sid, sizeof g.sid, "%s", cd.id);
    snprintf(g.node, sizeof g.node, "%s", cd.node);
    if (strcmp(g.node, g.node1) == 0)
        snprintf(g.node1, sizeof g.node1, "%s", c->nodes[0].name);
    dsec_decoder_free(d);
    snap_free(&s);
    return 0;
}

static int group_teardown(void **state)
{
    dsec_job_free(g.job, true);
    dsec_client_free(g.client);
    dsec_bus_free(g.bus);
    dsec_cell_stop(g.cell, true);
    dsec_bus_free(g.tap);
    dsec_cell_conf_release(&g.conf);
    pthread_mutex_lock(&caught.mu);
    for (size_t i = 0; i < caught.n; i++)
        snap_free(&caught.v[i]);
    caught.n = 0;
    pthread_mutex_unlock(&caught.mu);
    int rc = g.natsd ? dsec_test_server_stop(g.natsd, g.root) : 0;
    memset(&g, 0, sizeof g);
    return rc;
}

/* ---- the request subjects of the doc's Subjects table ------------------------------ */

/* One valid request per request subject: its subject, message and answer. */
typedef struct target {
    char subject[300];
    int type;
    const void *msg;
    const char *answer; /* the reply's Dsec-Type */
} target;

static dsec_msg_create t_create;
static dsec_msg_place t_place;
static dsec_msg_exec t_exec;
static dsec_msg_file_write t_write;
static dsec_msg_file_read t_read;
static dsec_msg_file_list t_ls;
static dsec_msg_op t_op, t_lookup;
static dsec_msg_ping t_ping;
static dsec_msg_job_hold t_hold;
static dsec_msg_reclaim t_reclaim;
static dsec_msg_admit t_admit;
static dsec_msg_quota t_quota;
static dsec_msg_quota_list t_qlist;
static dsec_msg_node_lost t_lost;
static dsec_msg_superseded_list t_sup;
static dsec_msg_node_set t_nodes;
static dsec_msg_list t_list;

static size_t targets(target *t)
{
    static const char *argv[] = {"echo", "conformance"};
    const char *cell = g.conf.cell;
    size_t n = 0;
    t_create =
        (dsec_msg_create){.req_id = "cf-t-create", .type = "sim", .cpu_milli = 10, .memory_mb = 8};
    t_place = (dsec_msg_place){.c = t_create, .reply_to = "_INBOX.conform.place", .attempt = 1};
    t_place.c.tenant = TENANT;
    t_place.c.req_id = "cf-t-place";
    t_exec = (dsec_msg_exec){.id = g.sid, .argv = {argv, 2}};
    t_write = (dsec_msg_file_write){
        .id = g.sid, .path = "/conf.txt", .data = {(const uint8_t *)"hello", 5}};
    t_read = (dsec_msg_file_read){.id = g.sid, .path = "/conf.txt"};
    t_ls = (dsec_msg_file_list){.id = g.sid, .path = "/"};
    t_op = (dsec_msg_op){.id = g.sid, .op = "status"};
    t_lookup = (dsec_msg_op){
        .id = "lookup", .op = "lookup", .req_id = g.create_rid, .tenant = TENANT, .retry = 1};
    t_ping = (dsec_msg_ping){.seq = 7};
    t_hold = (dsec_msg_job_hold){
        .job = "conf-hold", .node = g.node, .unit = "u1", .cpu_milli = 10, .memory_mb = 8};
    t_reclaim = (dsec_msg_reclaim){.req_id = "cf-reclaim", .job = "conf-job"};
    t_admit = (dsec_msg_admit){.tenant = TENANT, .req_id = "cf-admit", .n = 1};
    t_quota = (dsec_msg_quota){.tenant = TENANT, .sandboxes = 1000};
    t_qlist = (dsec_msg_quota_list){.tenant = TENANT};
    t_lost = (dsec_msg_node_lost){.node = g.node, .lost_ns = 1};
    t_sup = (dsec_msg_superseded_list){.by = "conformance"};
    t_nodes = (dsec_msg_node_set){0};
    t_list = (dsec_msg_list){.limit = 10};
#define T(typ, m, ans, ...)                                                                        \
    do {                                                                                           \
        snprintf(t[n].subject, sizeof t[n].subject, __VA_ARGS__);                                  \
        t[n].type = typ, t[n].msg = m, t[n].answer = ans;                                          \
        n++;                                                                                       \
    } while (0)
    T(DSEC_MSG_CREATE, &t_create, "created", "dsec.v1." TENANT ".create");
    T(DSEC_MSG_CREATE, &t_create, "created", "dsec.v1." TENANT ".create.%s", cell);
    T(DSEC_MSG_EXEC, &t_exec, "exec_result", "dsec.v1." TENANT ".sbx.%s.%s.exec", g.node, g.sid);
    T(DSEC_MSG_FILE_WRITE, &t_write, "file_data", "dsec.v1." TENANT ".sbx.%s.%s.write", g.node,
      g.sid);
    T(DSEC_MSG_FILE_READ, &t_read, "file_data", "dsec.v1." TENANT ".sbx.%s.%s.read", g.node, g.sid);
    T(DSEC_MSG_FILE_LIST, &t_ls, "file_list_reply", "dsec.v1." TENANT ".sbx.%s.%s.ls", g.node,
      g.sid);
    T(DSEC_MSG_OP, &t_op, "op_reply", "dsec.v1." TENANT ".sbx.%s.%s.op", g.node, g.sid);
    T(DSEC_MSG_OP, &t_lookup, "created", "dsec.v1.ctl.lookup.%s", cell);
    T(DSEC_MSG_PING, &t_ping, "pong", "dsec.v1.ctl.ping");
    T(DSEC_MSG_JOB_HOLD, &t_hold, "op_reply", "dsec.v1.ctl.hold.%s", g.node);
    T(DSEC_MSG_RECLAIM, &t_reclaim, "reclaim_ack", "dsec.v1.ctl.job.%s.conf-job.reclaim", cell);
    T(DSEC_MSG_ADMIT, &t_admit, "admit", "dsec.v1.ctl.quota.%s.admit", cell);
    /* after the creates: a new definition is counted for a while before creates pass */
    T(DSEC_MSG_QUOTA, &t_quota, "quota", "dsec.v1.ctl.quota.%s.set", cell);
    T(DSEC_MSG_QUOTA, &t_quota, "quota", "dsec.v1.ctl.quota.%s.get", cell);
    T(DSEC_MSG_QUOTA_LIST, &t_qlist, "quota_list", "dsec.v1.ctl.quota.%s.list", cell);
    T(DSEC_MSG_NODE_LOST, &t_lost, "op_reply", "dsec.v1.ctl.reconcile.%s", g.node);
    T(DSEC_MSG_SUPERSEDED_LIST, &t_sup, "op_reply", "dsec.v1.ctl.superseded.%s.%s", cell, g.node);
    T(DSEC_MSG_NODE_SET, &t_nodes, "node_set", "dsec.v1." TENANT ".nodes");
    T(DSEC_MSG_LIST, &t_list, "list_reply", "dsec.v1." TENANT ".list");
    /* place answers the client's reply_to, not the requester: last, see below */
    T(DSEC_MSG_PLACE, &t_place, "created", "dsec.v1.ctl.place.%s", g.node);
#undef T
    return n;
}

/* Every request subject answers its valid request with the reply the table
 * names, headers and fields as the doc says. */
static void every_request_is_answered_by_the_tables(void **state)
{
    static target t[32];
    size_t n = targets(t);
    for (size_t i = 0; i < n; i++) {
        snap s;
        if (t[i].type == DSEC_MSG_PLACE) {
            /* the node answers created to reply_to; the NATS reply gets nothing */
            dsec_buf b;
            encode(&b, DSEC_MSG_PLACE, t[i].msg);
            dsec_hdr h = {.type = "place", .schema = DSEC_SCHEMA_VERSION, .req_id = "cf-t-place"};
            dsec_err err;
            assert_int_equal(dsec_bus_publish(g.bus, t[i].subject, NULL, &h, b.data, b.len, &err),
                             0);
            dsec_buf_release(&b);
            if (!catch_on("_INBOX.conform.place", &s))
                fail_msg("place to %s: no created on its reply_to", t[i].subject);
            check_message(&s, "cf-t-place", NULL, "created for a place");
        } else {
            expect_answer(t[i].subject, t[i].type, t[i].msg, t[i].answer, &s);
        }
        assert_string_equal(s.type, t[i].answer);
        snap_free(&s);
    }

    /* every op of the op table: each answered op_reply or error, by the doc */
    static const char *const ops[] = {"status", "pause",    "resume", "fork",
                                      "freeze", "snapshot", "net",    "destroy"};
    char subj[300], child[80] = "";
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        /* destroy the fork's child, not the sandbox the other tests use */
        bool destroy = strcmp(ops[i], "destroy") == 0;
        assert_true(!destroy || child[0] != '\0');
        dsec_msg_op op = {
            .id = destroy ? child : g.sid, .op = ops[i], .n = 1, .name = "conf-snap:1"};
        snap s;
        err_body eb;
        snprintf(subj, sizeof subj, "dsec.v1." TENANT ".sbx.%s.%s.op", g.node, op.id);
        request_as(subj, DSEC_MSG_OP, &op, "op", "cf-op", &s, &eb);
        /* a fork is admitted by the quota actor, which counts a while after a set */
        for (int k = 0; k < 50 && strcmp(eb.code, "quota") == 0; k++) {
            snap_free(&s);
            usleep(200000);
            request_as(subj, DSEC_MSG_OP, &op, "op", "cf-op", &s, &eb);
        }
        if (strcmp(ops[i], "fork") == 0 && strcmp(s.type, "op_reply") == 0) {
            dsec_decoder *d = dsec_decoder_new(NULL);
            dsec_msg_op_reply r;
            dsec_err err;
            assert_int_equal(dsec_decode(d, DSEC_MSG_OP_REPLY, s.data, s.len, &r, &err), 0);
            assert_int_equal(r.ids.n, 1);
            snprintf(child, sizeof child, "%s", r.ids.v[0]);
            dsec_decoder_free(d);
        }
        if (strcmp(s.type, "op_reply") != 0 && strcmp(s.type, DSEC_TYPE_ERROR) != 0)
            fail_msg("op %s: answered %s", ops[i], s.type);
        if (strcmp(ops[i], "status") == 0 || strcmp(ops[i], "pause") == 0 ||
            strcmp(ops[i], "resume") == 0 || strcmp(ops[i], "fork") == 0 || destroy)
            if (strcmp(s.type, "op_reply") != 0)
                fail_msg("op %s: %s %s", ops[i], eb.code, eb.field);
        snap_free(&s);
    }

    /* exec with stream_to: the output also comes as exec_chunk */
    static const char *argv[] = {"echo", "chunk"};
    dsec_msg_exec x = {.id = g.sid, .argv = {argv, 2}, .stream_to = "_INBOX.conform.chunks"};
    snap s;
    sbx_subject(subj, sizeof subj, "exec");
    expect_answer(subj, DSEC_MSG_EXEC, &x, "exec_result", &s);
    snap_free(&s);
    if (!catch_on("_INBOX.conform.chunks", &s))
        fail_msg("exec with stream_to: no exec_chunk");
    check_message(&s, NULL, NULL, "exec_chunk");
    assert_string_equal(s.type, "exec_chunk");
    snap_free(&s);

    /* a job holding: taken, then given back */
    dsec_msg_job_hold rel = t_hold;
    rel.release = true;
    snprintf(subj, sizeof subj, "dsec.v1.ctl.hold.%s", g.node);
    expect_answer(subj, DSEC_MSG_JOB_HOLD, &rel, "op_reply", &s);
    snap_free(&s);
}

/* The sync message and the bus's own error replies carry Dsec-Schema 1 too. */
static void sync_and_bus_errors_carry_the_schema(void **state)
{
    snap s;
    char subj[200];
    snprintf(subj, sizeof subj, "dsec.v1.ctl.sync.%s", g.conf.cell);
    /* the schedulers asked for one when they started */
    if (!catch_on(subj, &s) && !catch_on("dsec.v1.ctl.sync", &s))
        fail_msg("no sync was seen");
    check_message(&s, NULL, NULL, "sync");
    snap_free(&s);

    /* a Dsec-Schema newer than the cell reads: the bus answers, empty-bodied */
    dsec_buf b;
    encode(&b, DSEC_MSG_PING, &(dsec_msg_ping){.seq = 1});
    dsec_hdr h = {.type = "ping", .schema = 999, .req_id = "cf-newer"};
    dsec_msg *reply = NULL;
    dsec_err err;
    assert_int_equal(dsec_bus_request_sync(g.bus, "dsec.v1.ctl.ping", &h, b.data, b.len, TIMEOUT_MS,
                                           &reply, &err),
                     0);
    dsec_buf_release(&b);
    snap_take(&s, reply);
    dsec_msg_free(reply);
    err_body eb;
    check_message(&s, "cf-newer", &eb, "bus-level error");
    assert_int_equal(s.len, 0);
    assert_string_equal(eb.code, "unsupported");
    snap_free(&s);
}

/* Dsec-Type picks the decoder: a valid payload under another type, an
 * unknown type, or none, is refused on every request subject, and nothing
 * is done with it. */
static void dsec_type_is_checked_on_every_request_subject(void **state)
{
    static target t[32];
    size_t n = targets(t);
    for (size_t i = 0; i < n; i++) {
        const char *wrong = t[i].type == DSEC_MSG_EXEC ? "create" : "exec";
        expect_error(t[i].subject, t[i].type, t[i].msg, wrong, "unsupported", DSEC_HDR_TYPE);
        expect_error(t[i].subject, t[i].type, t[i].msg, "no-such-type", "unsupported",
                     DSEC_HDR_TYPE);
        expect_error(t[i].subject, t[i].type, t[i].msg, NULL, "unsupported", DSEC_HDR_TYPE);
    }
    /* nothing reached the place's reply_to: no sandbox was made */
    pthread_mutex_lock(&caught.mu);
    size_t answered = 0;
    for (size_t i = 0; i < caught.n; i++)
        answered += strcmp(caught.v[i].subject, "_INBOX.conform.place") == 0;
    pthread_mutex_unlock(&caught.mu);
    if (answered > 0)
        fail_msg("%zu mislabelled place(s) answered on their reply_to", answered);
}

/* A msgpack map {req_id: rid, pad: bin of padn bytes}: over the payload
 * limit when padn is, whatever the message. */
static uint8_t *padded(const char *rid, size_t padn, size_t *len)
{
    size_t rl = strlen(rid);
    uint8_t *p = dsec_malloc(padn + rl + 64);
    assert_non_null(p);
    size_t o = 0;
    p[o++] = 0x82;
    p[o++] = 0xa6;
    memcpy(p + o, "req_id", 6), o += 6;
    p[o++] = (uint8_t)(0xa0 | rl);
    memcpy(p + o, rid, rl), o += rl;
    p[o++] = 0xa3;
    memcpy(p + o, "pad", 3), o += 3;
    p[o++] = 0xc6;
    p[o++] = (uint8_t)(padn >> 24), p[o++] = (uint8_t)(padn >> 16);
    p[o++] = (uint8_t)(padn >> 8), p[o++] = (uint8_t)padn;
    memset(p + o, 'x', padn), o += padn;
    *len = o;
    return p;
}

/* A payload just over 8 MiB reaches dsec (the server's max_payload leaves
 * room for it and its headers) and is answered too_large, echoing the
 * req_id of the body. */
static void too_large_payloads_are_answered(void **state)
{
    char subj[300];
    const char *subjects[3];
    char c[200];
    snprintf(c, sizeof c, "dsec.v1." TENANT ".create.%s", g.conf.cell);
    sbx_subject(subj, sizeof subj, "exec");
    subjects[0] = "dsec.v1." TENANT ".create";
    subjects[1] = c;
    subjects[2] = subj;
    static const char *const types[] = {"create", "create", "exec"};
    for (size_t i = 0; i < 3; i++) {
        size_t len;
        uint8_t *p = padded("cf-big", PAYLOAD_MAX - 20, &len);
        assert_true(len > PAYLOAD_MAX);
        snap s;
        err_body eb;
        raw_request(subjects[i], types[i], NULL, p, len, &s);
        dsec_free(p);
        check_message(&s, NULL, &eb, "too large");
        if (strcmp(eb.code, "too_large") != 0)
            fail_msg("%zu-byte %s: %s, not too_large", len, types[i], eb.code);
        assert_string_equal(eb.req_id, "cf-big");
        snap_free(&s);
    }
}

/* A create that does not decode still echoes its body's req_id, over a
 * header that says otherwise or none. */
static void decode_errors_echo_the_body_req_id(void **state)
{
    /* {req_id: "cf-dec", memory_mb: "lots"} */
    static const uint8_t p[] = {0x82, 0xa6, 'r', 'e', 'q', '_',  'i', 'd', 0xa6, 'c',
                                'f',  '-',  'd', 'e', 'c', 0xa9, 'm', 'e', 'm',  'o',
                                'r',  'y',  '_', 'm', 'b', 0xa4, 'l', 'o', 't',  's'};
    char c[200];
    snprintf(c, sizeof c, "dsec.v1." TENANT ".create.%s", g.conf.cell);
    const char *hdr_ids[] = {NULL, "cf-header"};
    for (size_t i = 0; i < 2; i++) {
        snap s;
        err_body eb;
        raw_request(c, "create", hdr_ids[i], p, sizeof p, &s);
        check_message(&s, NULL, &eb, "undecodable create");
        assert_string_equal(eb.code, "decode");
        assert_string_equal(eb.field, "memory_mb");
        assert_string_equal(eb.req_id, "cf-dec");
        snap_free(&s);
    }
}

/* Every invalid error names its field. */
static void invalid_errors_name_their_field(void **state)
{
    char subj[300], other[120];
    snprintf(other, sizeof other, "%s-ffffffffffffffff", g.node);
    static const char *argv[] = {"echo"};
    const char *cell = g.conf.cell;

    sbx_subject(subj, sizeof subj, "exec");
    dsec_msg_exec x = {.id = other, .argv = {argv, 1}};
    expect_error(subj, DSEC_MSG_EXEC, &x, "exec", "invalid", "id");
    x = (dsec_msg_exec){.id = g.sid, .argv = {argv, 1}, .stream_to = "dsec.v1.ctl.ping"};
    expect_error(subj, DSEC_MSG_EXEC, &x, "exec", "invalid", "stream_to");

    sbx_subject(subj, sizeof subj, "write");
    dsec_msg_file_write w = {.id = other, .path = "/x"};
    expect_error(subj, DSEC_MSG_FILE_WRITE, &w, "file_write", "invalid", "id");
    w = (dsec_msg_file_write){.id = g.sid, .path = "relative/x"};
    expect_error(subj, DSEC_MSG_FILE_WRITE, &w, "file_write", "invalid", "path");
    sbx_subject(subj, sizeof subj, "read");
    dsec_msg_file_read r = {.id = g.sid, .path = "/"};
    expect_error(subj, DSEC_MSG_FILE_READ, &r, "file_read", "invalid", "path");
    sbx_subject(subj, sizeof subj, "ls");
    dsec_msg_file_list l = {.id = other, .path = "/"};
    expect_error(subj, DSEC_MSG_FILE_LIST, &l, "file_list", "invalid", "id");

    sbx_subject(subj, sizeof subj, "op");
    dsec_msg_op op = {.id = other, .op = "status"};
    expect_error(subj, DSEC_MSG_OP, &op, "op", "invalid", "id");
    op = (dsec_msg_op){.id = g.sid, .op = "fork"};
    expect_error(subj, DSEC_MSG_OP, &op, "op", "invalid", "n");
    op = (dsec_msg_op){.id = g.sid, .op = "snapshot", .name = "no version"};
    expect_error(subj, DSEC_MSG_OP, &op, "op", "invalid", "name");

    snprintf(subj, sizeof subj, "dsec.v1." TENANT ".sbx.%s.%s.exec.more", g.node, g.sid);
    x = (dsec_msg_exec){.id = g.sid, .argv = {argv, 1}};
    expect_error(subj, DSEC_MSG_EXEC, &x, "exec", "invalid", "subject");

    dsec_msg_create cr = {.req_id = "cf-inv", .cell = "elsewhere"};
    snprintf(subj, sizeof subj, "dsec.v1." TENANT ".create.%s", cell);
    expect_error(subj, DSEC_MSG_CREATE, &cr, "create", "invalid", "cell");
    cr = (dsec_msg_create){.req_id = "cf-inv"};
    expect_error("dsec.v1.no=tenant.create", DSEC_MSG_CREATE, &cr, "create", "invalid", "tenant");

    dsec_msg_job_hold h = {.job = "not a name", .node = g.node};
    snprintf(subj, sizeof subj, "dsec.v1.ctl.hold.%s", g.node);
    expect_error(subj, DSEC_MSG_JOB_HOLD, &h, "job_hold", "invalid", "job");

    dsec_msg_op lk = {.id = "lookup", .op = "lookup", .tenant = TENANT};
    snprintf(subj, sizeof subj, "dsec.v1.ctl.lookup.%s", cell);
    expect_error(subj, DSEC_MSG_OP, &lk, "op", "invalid", "req_id");

    dsec_msg_node_lost nl = {.node = g.node1, .lost_ns = 1};
    snprintf(subj, sizeof subj, "dsec.v1.ctl.reconcile.%s", g.node);
    expect_error(subj, DSEC_MSG_NODE_LOST, &nl, "node_lost", "invalid", "node");

    snprintf(subj, sizeof subj, "dsec.v1.ctl.quota.%s.set", cell);
    dsec_msg_quota q = {.tenant = "not a name"};
    expect_error(subj, DSEC_MSG_QUOTA, &q, "quota", "invalid", "tenant");
    q = (dsec_msg_quota){.tenant = TENANT, .project = "a//b"};
    expect_error(subj, DSEC_MSG_QUOTA, &q, "quota", "invalid", "project");
    q = (dsec_msg_quota){.tenant = TENANT, .sandboxes = 1000};
    snap s;
    expect_answer(subj, DSEC_MSG_QUOTA, &q, "quota", &s);
    snap_free(&s);
    q = (dsec_msg_quota){.tenant = TENANT, .project = "p", .sandboxes = 2000};
    expect_error(subj, DSEC_MSG_QUOTA, &q, "quota", "invalid", "sandboxes");
    snprintf(subj, sizeof subj, "dsec.v1.ctl.quota.%s.admit", cell);
    dsec_msg_admit ad = {.tenant = "not a name", .req_id = "cf-adm"};
    expect_error(subj, DSEC_MSG_ADMIT, &ad, "admit", "invalid", "tenant");

    /* place: the error goes to the client's reply_to */
    dsec_msg_place p = {.c = {.req_id = "cf-inv-place", .tenant = "not a name", .type = "sim"},
                        .reply_to = "_INBOX.conform.badplace"};
    dsec_buf b;
    encode(&b, DSEC_MSG_PLACE, &p);
    dsec_hdr hd = {.type = "place", .schema = DSEC_SCHEMA_VERSION, .req_id = "cf-inv-place"};
    dsec_err err;
    snprintf(subj, sizeof subj, "dsec.v1.ctl.place.%s", g.node);
    assert_int_equal(dsec_bus_publish(g.bus, subj, NULL, &hd, b.data, b.len, &err), 0);
    dsec_buf_release(&b);
    if (!catch_on("_INBOX.conform.badplace", &s))
        fail_msg("place with a bad tenant: no answer on its reply_to");
    err_body eb;
    check_message(&s, "cf-inv-place", &eb, "bad place");
    assert_string_equal(eb.code, "invalid");
    assert_string_equal(eb.field, "tenant");
    snap_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sync_and_bus_errors_carry_the_schema),
        cmocka_unit_test(every_request_is_answered_by_the_tables),
        cmocka_unit_test(dsec_type_is_checked_on_every_request_subject),
        cmocka_unit_test(too_large_payloads_are_answered),
        cmocka_unit_test(decode_errors_echo_the_body_req_id),
        cmocka_unit_test(invalid_errors_name_their_field),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
