/* test_sim.c - the replay simulator: profile statistics, broken traces, record then replay, a short
 * replay on a 160-node sim cell, replayed training jobs honouring reclaims. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/cell.h"
#include "actors/wire.h"
#include "codecs/msg.h"
#include "codecs/record.h"
#include "dsec/alloc.h"
#include "sim/sim.h"

/* Generate a dsec-profile trace into memory. */
static char *gen_mem(const sim_profile *p, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    dsec_err err;
    uint64_t n;
    assert_int_equal(sim_gen(p, f, "test", &n, &err), 0);
    fclose(f);
    assert_true(n > 0);
    return buf;
}

/* Tolerances (docs/simulator.md): lifetime median 17 min +-10%, p99 > 3 h; low-CPU share 0.90
 * +-0.02; fan-out median 3 +-1, p90 28 within [20, 38]; the largest burst is exactly burst-max from
 * one job; the type mix within 2 points of its weights; every training job unit present. */
static void test_gen_matches_profile(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        sim_profile p;
        sim_profile_dsec(&p);
        p.seed = seed;
        p.duration_s = 120;
        size_t len;
        char *buf = gen_mem(&p, &len);
        sim_trace t;
        dsec_err err;
        assert_int_equal(sim_trace_load_mem(&t, buf, len, "gen", &err), 0);
        sim_stats s;
        assert_int_equal(sim_stats_compute(&t, &s, &err), 0);
        assert_true(fabs(s.life_p50_s - 1020) < 102);
        assert_true(s.life_p99_s > 3 * 3600);
        assert_true(fabs(s.low_use_share - 0.90) < 0.02);
        assert_true(s.fanout_p50 >= 2 && s.fanout_p50 <= 4);
        assert_true(s.fanout_p90 >= 20 && s.fanout_p90 <= 38);
        assert_int_equal(s.max_job_creates, 32000);
        assert_int_equal(s.jobs, (size_t)p.jobs);
        assert_int_equal(s.job_holders, (size_t)(p.jobs * p.job_units));
        assert_int_equal(s.job_cpu_milli,
                         (uint64_t)p.jobs * (uint64_t)p.job_units * p.job_cpu_milli);
        assert_true(s.create_rate_peak > 5000); /* the 32,000 burst over 4 s */
        static const struct {
            const char *type;
            double w;
        } mix[] = {{"function", .35}, {"container", .40}, {"microvm", .15}, {"vm", .10}};
        size_t rollouts =
            s.creates; /* the jobs hold capacity through the job protocol, not creates */
        for (size_t m = 0; m < 4; m++) {
            size_t n = 0;
            for (size_t i = 0; i < s.ntypes; i++)
                if (strcmp(s.types[i], mix[m].type) == 0)
                    n = s.type_n[i];
            assert_true(fabs((double)n / (double)rollouts - mix[m].w) < 0.02);
        }
        /* each job: its holds (left to the job itself in a replay), then one registration the
         * replayer runs */
        size_t njob = 0, nhold = 0;
        for (size_t i = 0; i < t.n; i++) {
            const sim_op *o = &t.ops[i];
            if (strcmp(o->msg_type, "job_hold") == 0) {
                assert_int_equal(o->kind, SIM_OP_SEEN);
                nhold++;
            }
            if (o->kind != SIM_OP_JOB)
                continue;
            njob++;
            assert_non_null(strstr(o->subject, "dsec.v1.ctl.job.sim.register"));
            assert_string_equal(o->cls, "job");
            assert_int_equal(o->checkpoint_ms, (uint64_t)(p.job_checkpoint_s * 1000));
            assert_int_equal(o->nunits, (size_t)p.job_units);
            for (size_t u = 0; u < o->nunits; u++) {
                assert_string_equal(o->units[u].node, SIM_NODE_ANY);
                assert_int_equal(o->units[u].cpu_milli, p.job_cpu_milli);
                assert_int_equal(o->units[u].memory_mb, p.job_memory_mb);
            }
            assert_true(o->t_ns < 1000000000ull); /* in the first second */
        }
        assert_int_equal(njob, (size_t)p.jobs);
        assert_int_equal(nhold, (size_t)(p.jobs * p.job_units));
        /* overrides take */
        sim_trace_free(&t);
        free(buf);
    }
    sim_profile p;
    sim_profile_dsec(&p);
    dsec_err err;
    assert_int_equal(sim_profile_set(&p, "burst-max", "500", &err), 0);
    assert_int_equal(sim_profile_set(&p, "duration", "30", &err), 0);
    assert_int_equal(sim_profile_set(&p, "life-median", "60", &err), 0);
    assert_int_equal(sim_profile_set(&p, "burst-every", "0", &err), 0);
    assert_int_equal(sim_profile_set(&p, "no-such", "1", &err), -1);
    assert_non_null(strstr(err.msg, "no-such"));
    assert_int_equal(sim_profile_set(&p, "rate", "x", &err), -1);
    assert_int_equal(sim_profile_set(&p, "job-checkpoint", "0.5", &err), 0);
    assert_true(fabs(p.job_checkpoint_s - 0.5) < 1e-9);
    {
        sim_profile bad = p;
        bad.job_units = 0;
        FILE *nf = fopen("/dev/null", "wb");
        assert_int_equal(sim_gen(&bad, nf, "test", NULL, &err), -1);
        assert_non_null(strstr(err.msg, "job-units"));
        fclose(nf);
    }
    size_t len;
    char *buf = gen_mem(&p, &len);
    sim_trace t;
    sim_stats s;
    assert_int_equal(sim_trace_load_mem(&t, buf, len, "gen", &err), 0);
    sim_stats_compute(&t, &s, &err);
    assert_int_equal(s.max_job_creates, 500);
    assert_true(fabs(s.life_p50_s - 60) < 10);
    assert_true(s.duration_s <= 30.0 + 4);
    sim_trace_free(&t);
    free(buf);
}

/* A cut or corrupted file names the record and byte where it broke. */
static void test_broken_traces(void **state)
{
    (void)state;
    sim_profile p;
    sim_profile_dsec(&p);
    p.duration_s = 5;
    p.burst_max = 10;
    p.burst_min = 1;
    p.burst_every_s = 0;
    size_t len;
    char *buf = gen_mem(&p, &len);
    sim_trace t;
    dsec_err err;
    assert_int_equal(sim_trace_load_mem(&t, buf, len, "ok", &err), 0);
    size_t n = t.n;
    sim_trace_free(&t);
    assert_true(n > 100);
    /* truncated in the middle of a record */
    assert_int_equal(sim_trace_load_mem(&t, buf, len - 7, "cut.trc", &err), -1);
    assert_int_equal(err.code, DSEC_E_DECODE);
    char want[64];
    snprintf(want, sizeof want, "record %zu ", n);
    assert_non_null(strstr(err.msg, "cut.trc"));
    assert_non_null(strstr(err.msg, want));
    assert_non_null(strstr(err.msg, "at byte"));
    assert_non_null(strstr(err.msg, "truncated"));
    /* garbage in a record's body: the first record breaks */
    char *bad = dsec_malloc(len);
    memcpy(bad, buf, len);
    size_t hdr_end = 8 + 1 + (uint8_t)bad[8]; /* magic, header length (one byte), header */
    memset(bad + hdr_end + 2, 0xff, 12);
    assert_int_equal(sim_trace_load_mem(&t, bad, len, "bad.trc", &err), -1);
    assert_non_null(strstr(err.msg, "record 1 "));
    /* a wrong magic */
    memcpy(bad, "NOTATRAC", 8);
    assert_int_equal(sim_trace_load_mem(&t, bad, len, "magic.trc", &err), -1);
    assert_non_null(strstr(err.msg, "magic.trc"));
    /* only the header */
    assert_int_equal(sim_trace_load_mem(&t, buf, hdr_end, "empty.trc", &err), 0);
    assert_int_equal(t.n, 0);
    sim_trace_free(&t);
    assert_int_equal(sim_trace_load(&t, "/nonexistent/x.trc", &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/x.trc"));
    dsec_free(bad);
    free(buf);
}

/* A create the client sent again under its req_id (a shed create back from its retry_after_ms,
 * as a recorder taps it) is one create: the trace has two creates, not three, and the "created"
 * reply names the first send. */
static void test_resent_create_counts_once(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    dsec_record_writer *wr = dsec_record_writer_new_file(f, 0);
    dsec_err err;
    dsec_trace_header h = {.format_version = DSEC_TRACE_FORMAT_VERSION, .source = "test"};
    assert_int_equal(dsec_trace_header_write(wr, &h, &err), 0);
    static const char *const ids[] = {"r1", "r1", "r2"};
    dsec_buf b;
    dsec_buf_init(&b);
    for (int i = 0; i < 3; i++) {
        dsec_msg_create m = {.req_id = (char *)ids[i], .tenant = "t", .type = "sim"};
        assert_int_equal(dsec_encode(&b, DSEC_MSG_CREATE, &m, &err), 0);
        dsec_trace_record r = {.ts_ns = 1000000000ull * (uint64_t)(i + 1),
                               .subject = "dsec.v1.t.create",
                               .msg_type = "create",
                               .req_id = (char *)ids[i],
                               .payload = {.data = (uint8_t *)b.data, .len = b.len},
                               .expects_reply = true};
        assert_int_equal(dsec_trace_record_write(wr, &r, &err), 0);
    }
    dsec_buf_release(&b);
    assert_int_equal(dsec_record_writer_flush(wr, &err), 0);
    dsec_record_writer_free(wr);
    fclose(f);
    sim_trace t;
    if (sim_trace_load_mem(&t, buf, len, "resent.trc", &err) < 0)
        fail_msg("load: %s", err.msg);
    assert_int_equal(t.n, 3);
    assert_int_equal(t.ops[0].kind, SIM_OP_CREATE);
    assert_int_equal(t.ops[1].kind, SIM_OP_SEEN); /* the resend */
    assert_int_equal(t.ops[2].kind, SIM_OP_CREATE);
    sim_stats st;
    assert_int_equal(sim_stats_compute(&t, &st, &err), 0);
    assert_int_equal(st.creates, 2);
    sim_trace_free(&t);
    free(buf);
}

/* ---- a cell in this process ---------------------------------------------------------- */
static dsec_cell *start_cell_sized(size_t nodes, uint64_t cpu, uint64_t mem, unsigned replicas,
                                   char *dir)
{
    strcpy(dir, "/tmp/dsec-test-sim-XXXXXX");
    assert_non_null(mkdtemp(dir));
    dsec_cell_conf c;
    dsec_cell_conf_defaults(&c);
    snprintf(c.cell, sizeof c.cell, "sim");
    snprintf(c.state_dir, sizeof c.state_dir, "%s", dir);
    c.embedded_nats = true;
    c.jetstream = true;
    c.sched_replicas = replicas;
    c.threads = 2;
    c.capacity_ms = 100;
    dsec_err err;
    static const char *const types[] = {"sim", "function", "container", "microvm", "vm", NULL};
    assert_int_equal(dsec_cell_conf_add_sim_nodes(&c, "n", nodes, cpu, mem, 3000, types, "0", &err),
                     0);
    dsec_cell *cell;
    int rc =
        dsec_cell_start(&cell, &c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE | DSEC_ROLE_ARBITER, &err);
    if (rc < 0)
        fprintf(stderr, "cell: %s\n", err.msg);
    assert_int_equal(rc, 0);
    dsec_cell_conf_release(&c);
    usleep(500000);
    return cell;
}

static dsec_cell *start_cell(size_t nodes, char *dir)
{
    return start_cell_sized(nodes, 192000, 1572864, 2, dir);
}

static void stop_cell(dsec_cell *cell, const char *dir)
{
    dsec_cell_stop(cell, true);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static dsec_bus *connect_bus(const char *url)
{
    dsec_bus *bus;
    dsec_err err;
    dsec_bus_opts bo = {.url = url, .name = "test-sim", .threads = 2, .low_latency = true};
    assert_int_equal(dsec_bus_connect(&bus, &bo, &err), 0);
    return bus;
}

static dsec_msg *request(dsec_bus *bus, const char *subj, const char *type, int mt, const void *m,
                         const char *rid)
{
    dsec_buf *b = dsec_wire_buf();
    dsec_err err;
    assert_int_equal(dsec_encode(b, mt, m, &err), 0);
    dsec_hdr h = {.type = type, .schema = DSEC_SCHEMA_VERSION, .req_id = rid};
    dsec_msg *reply;
    int rc = dsec_bus_request_sync(bus, subj, &h, b->data, b->len, 5000, &reply, &err);
    if (rc < 0)
        fprintf(stderr, "%s: %s\n", subj, err.msg);
    assert_int_equal(rc, 0);
    assert_string_not_equal(dsec_msg_type(reply), "error");
    return reply;
}

struct seq {
    char type[32], verb[16];
    double t;
};

/* The client-side operations of a trace, in order, with their times (s). */
static size_t client_ops(const sim_trace *t, struct seq *out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < t->n && n < max; i++) {
        const sim_op *o = &t->ops[i];
        if (o->kind == SIM_OP_SEEN)
            continue;
        snprintf(out[n].type, sizeof out[n].type, "%s", o->msg_type);
        const char *v = strrchr(o->subject, '.');
        snprintf(out[n].verb, sizeof out[n].verb, "%s",
                 o->kind == SIM_OP_CREATE ? "create" : v + 1);
        out[n].t = (double)o->t_ns / 1e9;
        n++;
    }
    return n;
}

/* Record a client session, replay the trace against the same cell while recording again:
 * the same operations in the same order, each within 50 ms of its recorded offset. */
static void test_record_then_replay(void **state)
{
    (void)state;
    char dir[64];
    dsec_cell *cell = start_cell(4, dir);
    const char *url = dsec_cell_url(cell);
    dsec_bus *bus = connect_bus(url), *tapbus = connect_bus(url);
    char path[128];
    snprintf(path, sizeof path, "%s/rec.trc", dir);
    FILE *f = fopen(path, "wb");
    sim_recorder *rec;
    dsec_err err;
    assert_int_equal(sim_record_start(&rec, tapbus, f, NULL, "test", &err), 0);
    /* the session: 3 creates, an exec and a status on each, a destroy of each, paced */
    char ids[3][96], nodes[3][72];
    for (int i = 0; i < 3; i++) {
        char rid[40];
        snprintf(rid, sizeof rid, "rec-%d-%d", i, (int)getpid());
        dsec_msg_create m = {
            .req_id = rid, .type = "sim", .cpu_milli = 100, .memory_mb = 64, .cls = "rollout"};
        dsec_msg *r = request(bus, "dsec.v1.acme.create", "create", DSEC_MSG_CREATE, &m, rid);
        dsec_msg_created c;
        assert_int_equal(dsec_decode(dsec_wire_decoder(), DSEC_MSG_CREATED, dsec_msg_data(r),
                                     dsec_msg_len(r), &c, &err),
                         0);
        snprintf(ids[i], sizeof ids[i], "%s", c.id);
        snprintf(nodes[i], sizeof nodes[i], "%s", c.node);
        dsec_msg_free(r);
        usleep(60000);
    }
    for (int i = 0; i < 3; i++) {
        char subj[1024];
        const char *argv[] = {"echo", "hi"};
        dsec_msg_exec e = {.id = ids[i], .argv = {argv, 2}};
        snprintf(subj, sizeof subj, "dsec.v1.acme.sbx.%s.%s.exec", nodes[i], ids[i]);
        dsec_msg_free(request(bus, subj, "exec", DSEC_MSG_EXEC, &e, NULL));
        usleep(40000);
        dsec_msg_op o = {.id = ids[i], .op = "status"};
        snprintf(subj, sizeof subj, "dsec.v1.acme.sbx.%s.%s.op", nodes[i], ids[i]);
        dsec_msg_free(request(bus, subj, "op", DSEC_MSG_OP, &o, NULL));
        usleep(40000);
    }
    for (int i = 0; i < 3; i++) {
        char subj[1024];
        dsec_msg_op o = {.id = ids[i], .op = "destroy"};
        snprintf(subj, sizeof subj, "dsec.v1.acme.sbx.%s.%s.op", nodes[i], ids[i]);
        dsec_msg_free(request(bus, subj, "op", DSEC_MSG_OP, &o, NULL));
        usleep(30000);
    }
    uint64_t dropped;
    assert_int_equal(sim_record_stop(rec, &dropped, &err), 0);
    assert_int_equal(dropped, 0);
    fclose(f);

    sim_trace t1;
    assert_int_equal(sim_trace_load(&t1, path, &err), 0);
    struct seq a[64], b[64];
    size_t na = client_ops(&t1, a, 64);
    assert_int_equal(na, 12);

    /* replay at speed 1, tapped by a second recorder */
    char path2[128];
    snprintf(path2, sizeof path2, "%s/replay.trc", dir);
    FILE *f2 = fopen(path2, "wb");
    assert_int_equal(sim_record_start(&rec, tapbus, f2, NULL, "test", &err), 0);
    sim_sink sink;
    sim_bus_sink *bs;
    sim_replay *r;
    sim_replay_opts o = {.speed = 1, .destroy_at_end = true, .drain_s = 3};
    assert_int_equal(sim_bus_sink_new(&bs, bus, &sink, &err), 0);
    assert_int_equal(sim_replay_new(&r, &t1, &sink, &o, &err), 0);
    assert_int_equal(sim_replay_run(r, &err), 0);
    sim_replay_result res;
    sim_replay_result_get(r, &res);
    assert_int_equal(res.errors, 0);
    assert_int_equal(res.unmapped, 0);
    assert_int_equal(res.creates_ok, 3);
    assert_int_equal(res.sbx_sent, 9);
    assert_int_equal(res.destroys_sent, 0); /* the trace destroys them itself */
    assert_int_equal(res.in_flight, 0);
    assert_int_equal(sim_record_stop(rec, &dropped, &err), 0);
    fclose(f2);
    sim_bus_sink_free(bs);
    sim_replay_free(r);

    sim_trace t2;
    assert_int_equal(sim_trace_load(&t2, path2, &err), 0);
    size_t nb = client_ops(&t2, b, 64);
    assert_int_equal(nb, na);
    for (size_t i = 0; i < na; i++) {
        assert_string_equal(a[i].type, b[i].type);
        assert_string_equal(a[i].verb, b[i].verb);
        if (fabs(a[i].t - b[i].t) > 0.050)
            fail_msg("op %zu (%s): recorded at %.3f s, replayed at %.3f s", i, a[i].type, a[i].t,
                     b[i].t);
    }
    /* the replayed operations address the replayed sandboxes */
    for (size_t i = 0; i < t2.n; i++)
        if (t2.ops[i].kind == SIM_OP_SBX)
            assert_true(t2.ops[i].create_ix >= 0);
    sim_trace_free(&t1);
    sim_trace_free(&t2);
    dsec_bus_free(bus);
    dsec_bus_free(tapbus);
    stop_cell(cell, dir);
}

/* A DSec-profile trace, a few seconds long at speed, against 160 sim nodes. */
static void test_replay_160_nodes(void **state)
{
    (void)state;
    char dir[64];
    dsec_cell *cell = start_cell(160, dir);
    dsec_bus *bus = connect_bus(dsec_cell_url(cell));
    sim_profile p;
    sim_profile_dsec(&p);
    p.duration_s = 60;
    p.rate = 20;
    p.burst_max = 1500;
    p.burst_every_s = 0;
    p.life_median_s = 30;
    p.life_max_s = 300;
    p.jobs = 2;
    p.job_units = 2;
    size_t len;
    char *buf = gen_mem(&p, &len);
    sim_trace t;
    dsec_err err;
    assert_int_equal(sim_trace_load_mem(&t, buf, len, "gen", &err), 0);
    sim_stats st;
    assert_int_equal(sim_stats_compute(&t, &st, &err), 0);
    sim_sink sink;
    sim_bus_sink *bs;
    sim_replay *r;
    sim_replay_opts o = {.speed = 20, .destroy_at_end = true, .drain_s = 5, .force_type = "sim"};
    assert_int_equal(sim_bus_sink_new(&bs, bus, &sink, &err), 0);
    assert_int_equal(sim_replay_new(&r, &t, &sink, &o, &err), 0);
    assert_int_equal(sim_bus_sink_observe(bs, r, &err), 0);
    uint64_t sync;
    assert_int_equal(sim_bus_sink_sync(bs, &sync, &err), 0);
    assert_int_equal(sim_replay_sync_wait(r, sync, 100, 3000), 160); /* the starting loads */
    double t0 = sim_now();
    assert_int_equal(sim_replay_run(r, &err), 0);
    assert_true(sim_now() - t0 < 15);
    /* every node's load after the last destroy, rather than whatever a fixed wait caught */
    assert_int_equal(sim_bus_sink_sync(bs, &sync, &err), 0);
    assert_int_equal(sim_replay_sync_wait(r, sync, 0, 3000), 160);
    sim_replay_result res;
    sim_replay_result_get(r, &res);
    if (res.errors)
        sim_replay_report(r, NULL, stderr, &err);
    assert_int_equal(res.creates_sent, st.creates);
    assert_int_equal(res.creates_ok, st.creates);
    assert_int_equal(res.errors, 0);
    assert_int_equal(res.destroys_sent, st.creates);
    assert_int_equal(res.jobs_started, 2); /* a cell this size has room: nothing to reclaim */
    assert_int_equal(res.jobs_failed, 0);
    assert_int_equal(res.reclaim_requested, 0);
    assert_int_equal(res.lost, 0);
    char rep[128];
    snprintf(rep, sizeof rep, "%s/report", dir);
    assert_int_equal(sim_replay_report(r, rep, NULL, &err), 0);
    char jp[160];
    snprintf(jp, sizeof jp, "%s/report.json", rep);
    FILE *jf = fopen(jp, "r");
    assert_non_null(jf);
    char js[4096];
    size_t jn = fread(js, 1, sizeof js - 1, jf);
    js[jn] = '\0';
    fclose(jf);
    assert_non_null(strstr(js, "\"nodes\":160"));
    assert_non_null(strstr(js, "\"errors\":0"));
    snprintf(jp, sizeof jp, "%s/nodes.dat", rep);
    FILE *nf = fopen(jp, "r");
    assert_non_null(nf);
    char line[256], name[128];
    unsigned long long live, peak, nodes = 0, peaks = 0;
    while (fgets(line, sizeof line, nf) != NULL)
        if (line[0] != '#' && sscanf(line, "%127s %llu %llu", name, &live, &peak) == 3) {
            nodes++;
            peaks += peak;
            if (live != 0)
                fail_msg("node %s: %llu sandboxes live at the end of the replay", name, live);
        }
    fclose(nf);
    assert_int_equal(nodes, 160);
    assert_true(peaks > 0);
    sim_bus_sink_free(bs); /* the observer first: it reports into r */
    dsec_bus_free(bus);    /* then the bus: any late answer lands before r goes */
    sim_replay_free(r);
    sim_trace_free(&t);
    free(buf);
    stop_cell(cell, dir);
}

/* ---- a sink that answers in the calling thread ------------------------------------------ */
struct fake_sink {
    dsec_buf created, not_found;
    int ncreates, nops;
};

static int fake_request(void *ctx, const char *subject, const dsec_hdr *h, const void *data,
                        size_t len, int timeout_ms, void *req, dsec_err *err)
{
    (void)h, (void)data, (void)len, (void)timeout_ms, (void)err;
    struct fake_sink *f = ctx;
    size_t n = strlen(subject);
    if (n > 7 && strcmp(subject + n - 7, ".create") == 0) {
        f->ncreates++;
        sim_replay_answer(req, 0, "created", NULL, f->created.data, f->created.len, NULL);
    } else { /* every sandbox has vanished by the time the replay comes back to it */
        f->nops++;
        sim_replay_answer(req, 0, "error", "not_found", f->not_found.data, f->not_found.len, NULL);
    }
    return 0;
}

static int fake_publish(void *ctx, const char *subject, const dsec_hdr *h, const void *data,
                        size_t len, dsec_err *err)
{
    (void)ctx, (void)subject, (void)h, (void)data, (void)len, (void)err;
    return 0;
}

/* Sandboxes gone before the replay destroyed them count as lost, once each; a
 * sink without a job URL does not run the trace's jobs and says so. */
static void test_lost_and_jobs_skipped(void **state)
{
    (void)state;
    sim_profile p;
    sim_profile_dsec(&p);
    p.duration_s = 2;
    p.rate = 20;
    p.burst_max = 5;
    p.burst_min = 5;
    p.burst_every_s = 0;
    p.jobs = 3;
    size_t len;
    char *buf = gen_mem(&p, &len);
    sim_trace t;
    dsec_err err;
    assert_int_equal(sim_trace_load_mem(&t, buf, len, "gen", &err), 0);
    sim_stats st;
    sim_stats_compute(&t, &st, &err);
    struct fake_sink f = {0};
    dsec_buf_init(&f.created);
    dsec_msg_created c = {.id = "n-0000-00000000000000ab", .node = "n-0000", .type = "sim"};
    assert_int_equal(dsec_encode(&f.created, DSEC_MSG_CREATED, &c, &err), 0);
    dsec_buf_init(&f.not_found);
    dsec_msg_error nf = {.code = "not_found",
                         .message = "no sandbox n-0000-00000000000000ab\non node n-0000"};
    assert_int_equal(dsec_encode(&f.not_found, DSEC_MSG_ERROR, &nf, &err), 0);
    sim_sink sink = {.request = fake_request, .publish = fake_publish, .ctx = &f};
    sim_replay *r;
    sim_replay_opts o = {.speed = 0, .destroy_at_end = true, .drain_s = 1};
    assert_int_equal(sim_replay_new(&r, &t, &sink, &o, &err), 0);
    assert_int_equal(sim_replay_run(r, &err), 0);
    sim_replay_result res;
    sim_replay_result_get(r, &res);
    assert_int_equal(res.creates_ok, st.creates);
    assert_int_equal(f.nops, (int)st.creates);
    assert_int_equal(res.lost, st.creates);
    assert_int_equal(res.jobs_skipped, 3);
    assert_int_equal(res.jobs_started, 0);
    char *txt = NULL;
    size_t tn = 0;
    FILE *tf = open_memstream(&txt, &tn);
    assert_int_equal(sim_replay_report(r, NULL, tf, &err), 0);
    fclose(tf);
    assert_non_null(strstr(txt, "jobs not run (no job URL)"));
    assert_non_null(strstr(txt, "rollouts lost (preempted)"));
    /* under its kind, the first error's message, on one line */
    assert_non_null(
        strstr(txt, "\n    first: no sandbox n-0000-00000000000000ab on node n-0000\n"));
    free(txt);
    sim_replay_free(r);
    dsec_buf_release(&f.created);
    dsec_buf_release(&f.not_found);
    sim_trace_free(&t);
    free(buf);
}

/* ---- training jobs and reclaims ----------------------------------------------------------- */

/* Replay t against cell (bus) at speed 2 and return the figures; the observer sees the cell's
 * reclaim events. */
static void replay_observed(dsec_bus *bus, const sim_trace *t, sim_replay_result *res,
                            char *report_json, size_t n)
{
    sim_sink sink;
    sim_bus_sink *bs;
    sim_replay *r;
    dsec_err err;
    sim_replay_opts o = {.speed = 2, .destroy_at_end = true, .drain_s = 5, .force_type = "sim"};
    assert_int_equal(sim_bus_sink_new(&bs, bus, &sink, &err), 0);
    assert_int_equal(sim_replay_new(&r, t, &sink, &o, &err), 0);
    assert_int_equal(sim_bus_sink_observe(bs, r, &err), 0);
    uint64_t sync;
    assert_int_equal(sim_bus_sink_sync(bs, &sync, &err), 0);
    assert_true(sim_replay_sync_wait(r, sync, 100, 3000) > 0); /* where the jobs' units can go */
    assert_int_equal(sim_replay_run(r, &err), 0);
    usleep(500000); /* the last reclaim events */
    sim_replay_result_get(r, res);
    if (res->errors || res->reclaim_requested == 0)
        sim_replay_report(r, NULL, stderr, &err);
    char dir[] = "/tmp/dsec-test-simrep-XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(sim_replay_report(r, dir, NULL, &err), 0);
    char jp[128];
    snprintf(jp, sizeof jp, "%s/report.json", dir);
    FILE *jf = fopen(jp, "r");
    assert_non_null(jf);
    size_t jn = fread(report_json, 1, n - 1, jf);
    report_json[jn] = '\0';
    fclose(jf);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    sim_bus_sink_free(bs);
    sim_replay_free(r);
}

/* A generated trace whose two jobs hold most of a small cell, and a rollout burst that needs
 * room: the replayed jobs are asked to give capacity back, checkpoint (the profile's delay)
 * and release; the arbiter reports every reclaim honoured, none forced, and no rollout is
 * lost. Recorded beside the replay, the job traffic replays again: the jobs run anew (on the
 * recorded nodes) and the burst again gets its room by reclaims. */
static void test_replay_jobs_reclaim(void **state)
{
    (void)state;
    char dir[64];
    /* 4 nodes of 8 CPUs: 2 jobs x 4 units x 3.5 CPUs leave 4 CPUs for 200 rollouts of ~0.13 CPU */
    dsec_cell *cell = start_cell_sized(4, 8000, 16384, 1, dir);
    const char *url = dsec_cell_url(cell);
    dsec_bus *bus = connect_bus(url), *tapbus = connect_bus(url);
    sim_profile p;
    sim_profile_dsec(&p);
    p.duration_s = 10;
    p.rate = 2;
    p.burst_min = p.burst_max = 200;
    p.burst_every_s = 0;
    p.burst_spread_s = 1;
    p.life_median_s = 20;
    p.life_max_s = 60;
    p.jobs = 2;
    p.job_units = 4;
    p.job_cpu_milli = 3500;
    p.job_memory_mb = 6000;
    p.job_checkpoint_s = 1;
    p.memory_mb = 64;
    size_t len;
    char *buf = gen_mem(&p, &len);
    sim_trace t;
    dsec_err err;
    assert_int_equal(sim_trace_load_mem(&t, buf, len, "gen", &err), 0);
    sim_stats st;
    sim_stats_compute(&t, &st, &err);

    char path[128];
    snprintf(path, sizeof path, "%s/jobs.trc", dir);
    FILE *f = fopen(path, "wb");
    sim_recorder *rec;
    assert_int_equal(sim_record_start(&rec, tapbus, f, NULL, "test", &err), 0);
    double t0 = sim_now();
    sim_replay_result res;
    char js[8192];
    replay_observed(bus, &t, &res, js, sizeof js);
    assert_true(sim_now() - t0 < 20);
    uint64_t dropped;
    assert_int_equal(sim_record_stop(rec, &dropped, &err), 0);
    fclose(f);
    assert_int_equal(res.jobs_started, 2);
    assert_int_equal(res.jobs_failed, 0);
    assert_int_equal(res.creates_ok, st.creates);
    assert_int_equal(res.errors, 0);
    assert_true(res.reclaim_requested >= 1);
    assert_int_equal(res.reclaim_honoured, res.reclaim_requested);
    assert_int_equal(res.reclaim_forced, 0);
    assert_int_equal(res.reclaim_failed, 0);
    assert_int_equal(res.job_reclaims,
                     res.reclaim_requested); /* every request reached a replayed job */
    assert_int_equal(res.job_checkpoints, res.job_reclaims);
    assert_true(res.job_units_released >= 1);
    assert_int_equal(res.job_units_forced, 0);
    assert_int_equal(res.lost, 0); /* no rollout preempted */
    char want[128];
    snprintf(want, sizeof want,
             "\"reclaims\":{\"requested\":%" PRIu64 ",\"honoured\":%" PRIu64 ",\"forced\":0",
             res.reclaim_requested, res.reclaim_honoured);
    if (!strstr(js, want))
        fail_msg("report.json lacks %s: %s", want, js);
    assert_non_null(strstr(js, "\"rollouts_lost\":0"));

    /* the recording: the jobs' first registrations (with the nodes they held) run, their
     * holds, releases and the arbiter's reclaims and events are not re-sent */
    sim_trace t2;
    assert_int_equal(sim_trace_load(&t2, path, &err), 0);
    size_t njob = 0, nreleased = 0, nhold = 0, nreclaim_evt = 0;
    for (size_t i = 0; i < t2.n; i++) {
        const sim_op *o = &t2.ops[i];
        size_t sl = strlen(o->subject);
        if (o->kind == SIM_OP_JOB) {
            njob++;
            assert_int_equal(o->nunits, 4);
            assert_non_null(strstr(o->job_id, "train-"));
            for (size_t u = 0; u < o->nunits; u++)
                assert_int_equal(strncmp(o->units[u].node, "n-000", 5), 0);
        }
        if (sl > 9 && strcmp(o->subject + sl - 9, ".released") == 0) {
            nreleased++;
            assert_int_equal(o->kind, SIM_OP_SEEN);
        }
        if (strncmp(o->subject, "dsec.v1.ctl.hold.", 17) == 0) {
            nhold++;
            assert_int_equal(o->kind, SIM_OP_SEEN);
        }
        if (strcmp(o->subject, "dsec.v1.ctl.evt.sim.reclaim") == 0) {
            nreclaim_evt++;
            assert_int_equal(o->kind, SIM_OP_SEEN);
        }
    }
    assert_int_equal(njob, 2);
    assert_int_equal(nreleased, res.reclaim_honoured);
    assert_true(nhold >=
                8 + res.job_units_released); /* taken, given back by reclaims, and at the end */
    assert_true(nreclaim_evt >= 2 * res.reclaim_requested);
    sim_replay_result res2;
    replay_observed(bus, &t2, &res2, js, sizeof js);
    assert_int_equal(res2.jobs_started, 2);
    assert_int_equal(res2.jobs_failed, 0);
    assert_int_equal(res2.errors, 0);
    assert_int_equal(res2.creates_ok, st.creates);
    assert_true(res2.reclaim_requested >= 1);
    assert_int_equal(res2.reclaim_honoured, res2.reclaim_requested);
    assert_int_equal(res2.reclaim_forced, 0);
    assert_int_equal(res2.lost, 0);
    sim_trace_free(&t2);
    sim_trace_free(&t);
    free(buf);
    dsec_bus_free(bus);
    dsec_bus_free(tapbus);
    stop_cell(cell, dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gen_matches_profile),
        cmocka_unit_test(test_broken_traces),
        cmocka_unit_test(test_resent_create_counts_once),
        cmocka_unit_test(test_record_then_replay),
        cmocka_unit_test(test_replay_160_nodes),
        cmocka_unit_test(test_lost_and_jobs_skipped),
        cmocka_unit_test(test_replay_jobs_reclaim),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
