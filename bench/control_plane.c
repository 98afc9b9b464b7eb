/* control_plane.c - make bench S=control-plane: 160 sim nodes, 2 scheduler replicas, an open-loop load generator, one nats-server. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "bench/raw_nats.h"

#include "actors/cell.h"
#include "actors/wire.h"
#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/names.h"
#include "sim/sim.h"

/* The figures of one DSec unit (ARCHITECTURE.md). */
#define NODES 160
#define PHASE1_RATE 5000.0
#define LIVE_TARGET 380000

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_until(double t)
{
    double d = t - now_s();
    if (d <= 0)
        return;
    struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- the cell: child processes ------------------------------------------------------ */

static pid_t run_child(const char *url, const char *state, int roles, int replica)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the benchmark */
    dsec_cell_conf c;
    dsec_cell_conf_defaults(&c);
    snprintf(c.cell, sizeof c.cell, "bench");
    snprintf(c.url, sizeof c.url, "%s", url);
    snprintf(c.state_dir, sizeof c.state_dir, "%s/%s-%d", state,
             roles == DSEC_ROLE_NODE ? "nodes" : "sched", replica);
    c.threads = 2;
    c.sched_replicas = 1;
    c.full_ms = 5000;
    c.capacity_ms = 100;
    c.dead_after_ms = 10000;
    c.default_ttl_s = 7200;
    dsec_err err;
    static const char *const types[] = {"sim", NULL};
    if (roles == DSEC_ROLE_NODE &&
        dsec_cell_conf_add_sim_nodes(&c, "n", NODES, 192000, 1572864, 3000, types, "0", &err) < 0) {
        fprintf(stderr, "bench child: %s\n", err.msg);
        _exit(1);
    }
    dsec_cell *cell;
    if (dsec_cell_start(&cell, &c, roles, &err) < 0) {
        fprintf(stderr, "bench child: %s\n", err.msg);
        _exit(1);
    }
    pause(); /* until the parent kills us */
    _exit(0);
}

/* ---- nats-server monitoring: in_msgs from /varz -------------------------------------- */

static int64_t varz_in_msgs(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    const char req[] = "GET /varz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req, sizeof req - 1) < 0) {
        close(fd);
        return -1;
    }
    static char buf[1 << 16];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(fd, buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)r;
    close(fd);
    buf[n] = '\0';
    char *p = strstr(buf, "\"in_msgs\":");
    return p ? strtoll(p + 10, NULL, 10) : -1;
}


/* ---- the load generator ----------------------------------------------------------------- */

enum { OP_CREATE, OP_EXEC, OP_DESTROY };

struct req {
    struct gen *g;
    double due;  /* scheduled send time (open loop: latency counts from here) */
    int op;
    char id[DSEC_SBX_ID_LEN_MAX + 1];
};

struct gen {
    dsec_bus *bus;
    int phase;          /* 1: creates + exec + destroy; 2: creates only */
    double *lat;        /* create latencies, ms, per phase */
    _Atomic long nlat;
    long cap_lat;
    _Atomic long created, failed, destroyed, execs, in_flight;
    char last_error[DSEC_ERR_MSG_MAX];
};

static void send_req(struct req *r);

static void on_reply(int status, dsec_msg *reply, const dsec_err *err, void *ud)
{
    struct req *r = ud;
    struct gen *g = r->g;
    atomic_fetch_sub(&g->in_flight, 1);
    const char *type = status == 0 ? dsec_msg_type(reply) : NULL;
    bool ok = type != NULL && strcmp(type, "error") != 0;
    if (!ok) {
        atomic_fetch_add(&g->failed, 1);
        if (status < 0)
            snprintf(g->last_error, sizeof g->last_error, "%s", err->msg);
        else {
            dsec_msg_error e;
            dsec_err derr;
            if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_ERROR, dsec_msg_data(reply),
                            dsec_msg_len(reply), &e, &derr) == 0)
                snprintf(g->last_error, sizeof g->last_error, "%s", e.message);
        }
        dsec_free(r);
        return;
    }
    if (r->op == OP_CREATE) {
        long i = atomic_fetch_add(&g->nlat, 1);
        if (i < g->cap_lat)
            g->lat[i] = (now_s() - r->due) * 1000.0;
        atomic_fetch_add(&g->created, 1);
        dsec_msg_created c;
        dsec_err derr;
        if (g->phase == 1 && dsec_decode(dsec_wire_decoder(), DSEC_MSG_CREATED, dsec_msg_data(reply),
                                         dsec_msg_len(reply), &c, &derr) == 0) {
            snprintf(r->id, sizeof r->id, "%s", c.id);
            r->op = OP_EXEC;
            r->due = now_s();
            send_req(r);
            return;
        }
    } else if (r->op == OP_EXEC) {
        atomic_fetch_add(&g->execs, 1);
        r->op = OP_DESTROY;
        r->due = now_s();
        send_req(r);
        return;
    } else {
        atomic_fetch_add(&g->destroyed, 1);
    }
    dsec_free(r);
}

static void send_req(struct req *r)
{
    struct gen *g = r->g;
    dsec_buf *b = dsec_wire_buf();
    dsec_err err;
    char subj[256], rid[33];
    const char *type;
    int rc;
    if (r->op == OP_CREATE) {
        dsec_bus_new_id(rid);
        dsec_msg_create m = {.req_id = rid, .type = "sim", .cpu_milli = 50, .memory_mb = 64,
                             .cls = "rollout"};
        rc = dsec_encode(b, DSEC_MSG_CREATE, &m, &err);
        snprintf(subj, sizeof subj, "dsec.v1.bench.create");
        type = "create";
    } else {
        char node[72];
        snprintf(node, sizeof node, "%.*s", (int)(strrchr(r->id, '-') - r->id), r->id);
        if (r->op == OP_EXEC) {
            const char *argv[] = {"echo", "step"};
            dsec_msg_exec m = {.id = r->id, .argv = {argv, 2}};
            rc = dsec_encode(b, DSEC_MSG_EXEC, &m, &err);
            snprintf(subj, sizeof subj, "dsec.v1.bench.sbx.%s.%s.exec", node, r->id);
            type = "exec";
        } else {
            dsec_msg_op m = {.id = r->id, .op = "destroy"};
            rc = dsec_encode(b, DSEC_MSG_OP, &m, &err);
            snprintf(subj, sizeof subj, "dsec.v1.bench.sbx.%s.%s.op", node, r->id);
            type = "op";
        }
        rid[0] = '\0';
    }
    dsec_hdr h = {.type = type, .schema = DSEC_SCHEMA_VERSION, .req_id = rid[0] ? rid : NULL};
    atomic_fetch_add(&g->in_flight, 1);
    if (rc < 0 || dsec_bus_request(g->bus, subj, &h, b->data, b->len, 30000, on_reply, r, &err) < 0) {
        atomic_fetch_sub(&g->in_flight, 1);
        atomic_fetch_add(&g->failed, 1);
        snprintf(g->last_error, sizeof g->last_error, "%s", err.msg);
        dsec_free(r);
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pctl(double *v, long n, double p)
{
    if (n <= 0)
        return 0;
    long i = (long)(p * (double)(n - 1));
    return v[i];
}

/* Send creates at rate for up to secs (or until stop_at_created answered).
 * With adapt, the offered rate follows what the cell sustains: every second
 * it rises by 5% while less than 50 ms of work is in flight, and falls by 10%
 * when more is (open loop within each second: send times never wait for
 * replies). Returns creates answered per second over the phase. */
static double run_phase(struct gen *g, double rate, double secs, long stop_at_created, bool adapt,
                        double *p50, double *p99, double *p999, double *elapsed)
{
    atomic_store(&g->nlat, 0);
    long created0 = atomic_load(&g->created);
    double t0 = now_s(), t_rate = t0, next_check = t0 + 1.0;
    long sent_at_rate = 0;
    for (;;) {
        double t = now_s();
        if (t - t0 >= secs || (stop_at_created > 0 && atomic_load(&g->created) >= stop_at_created))
            break;
        if (adapt && t >= next_check) {
            long backlog = atomic_load(&g->in_flight);
            rate = backlog > (long)(rate * 0.05) ? rate * 0.9 : rate * 1.05;
            t_rate = t;
            sent_at_rate = 0;
            next_check = t + 1.0;
        }
        long due_n = (long)((t - t_rate) * rate);
        for (; sent_at_rate < due_n; sent_at_rate++) {
            struct req *r = dsec_calloc(1, sizeof *r);
            r->g = g;
            r->op = OP_CREATE;
            r->due = t_rate + (double)sent_at_rate / rate;
            send_req(r);
        }
        sleep_until(t + 0.0005);
    }
    double t_sent = now_s();
    while (atomic_load(&g->in_flight) > 0 && now_s() - t_sent < 30)
        usleep(2000);
    *elapsed = now_s() - t0;
    long n = atomic_load(&g->nlat);
    if (n > g->cap_lat)
        n = g->cap_lat;
    qsort(g->lat, (size_t)n, sizeof g->lat[0], cmp_d);
    *p50 = pctl(g->lat, n, 0.50);
    *p99 = pctl(g->lat, n, 0.99);
    *p999 = pctl(g->lat, n, 0.999);
    return (double)(atomic_load(&g->created) - created0) / *elapsed;
}

/* Live sandboxes as the nodes report them. */
static _Atomic long node_live[NODES];
static void on_capacity(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_msg_capacity c;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CAPACITY, dsec_msg_data(m), dsec_msg_len(m), &c, &err) < 0)
        return;
    int idx = atoi(c.node + 2); /* n-0042 */
    if (idx >= 0 && idx < NODES)
        atomic_store(&node_live[idx], (long)c.live);
}

static long live_now(void)
{
    long s = 0;
    for (int i = 0; i < NODES; i++)
        s += atomic_load(&node_live[i]);
    return s;
}

/* The DSec-shaped part: a trace from the simulator's "dsec" profile (one
 * job's burst of 32,000 creates on top of Poisson background traffic,
 * lognormal lifetimes, a type mix), replayed open loop through the replay
 * engine against the same cell. Everything is created as sim sandboxes with
 * the benchmark's small requests so that the cell's room is not the limit. */
static int replay_dsec_trace(const char *url, double trace_s, double speed, sim_replay_result *res,
                             uint64_t *creates)
{
    sim_profile p;
    sim_profile_dsec(&p);
    p.duration_s = trace_s;
    p.cpu_milli = 50;
    p.memory_mb = 64;
    p.jobs = 0;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    dsec_err err;
    uint64_t n = 0;
    int rc = f != NULL && sim_gen(&p, f, "bench_control_plane", &n, &err) == 0 ? 0 : -1;
    if (f != NULL)
        fclose(f);
    sim_trace t;
    if (rc < 0 || sim_trace_load_mem(&t, buf, len, "dsec-profile", &err) < 0) {
        fprintf(stderr, "bench: generating the trace: %s\n", err.msg);
        free(buf);
        return -1;
    }
    *creates = t.n;
    dsec_bus *bus = NULL;
    sim_sink sink;
    sim_bus_sink *bs = NULL;
    sim_replay *r = NULL;
    sim_replay_opts o = {.speed = speed, .destroy_at_end = true, .drain_s = 30,
                         .force_type = "sim", .tenant = "bench"};
    dsec_bus_opts bo = {.url = url, .name = "bench-replay", .threads = 2, .mailbox_max = 1 << 20,
                        .low_latency = true};
    rc = -1;
    if (dsec_bus_connect(&bus, &bo, &err) == 0 && sim_bus_sink_new(&bs, bus, &sink, &err) == 0 &&
        sim_replay_new(&r, &t, &sink, &o, &err) == 0 && sim_replay_run(r, &err) == 0) {
        sim_replay_result_get(r, res);
        rc = 0;
    } else {
        fprintf(stderr, "bench: replay: %s\n", err.msg);
    }
    sim_bus_sink_free(bs);
    dsec_bus_free(bus);
    sim_replay_free(r);
    sim_trace_free(&t);
    free(buf);
    return rc;
}

int main(int argc, char **argv)
{
    double phase1_secs = argc > 1 ? atof(argv[1]) : 10;
    double phase2_rate = argc > 2 ? atof(argv[2]) : 20000;
    signal(SIGPIPE, SIG_IGN);
    char state[] = "/tmp/dsec-bench-cp-XXXXXX";
    if (mkdtemp(state) == NULL)
        return 1;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/nats", state);
    mkdir(dir, 0700);
    int mon_port = 18222 + (int)(getpid() % 1000);
    char extra[64];
    snprintf(extra, sizeof extra, "http: \"127.0.0.1:%d\"\n", mon_port);
    dsec_natsd *natsd;
    dsec_err err;
    dsec_natsd_opts no = {.state_dir = dir, .extra_conf = extra};
    if (dsec_natsd_start(&natsd, &no, &err) < 0) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    const char *url = dsec_natsd_url(natsd);
    printf("control-plane bench: nats-server %s, %d sim nodes (1 process), 2 scheduler replicas (2 processes)\n",
           url, NODES);

    double raw = dsec_bench_raw_publish_rate(url, 1000000);
    printf("baseline: raw nats.c publish -> async subscriber, 200 B: %.0f msg/s\n", raw);

    pid_t kids[3];
    kids[0] = run_child(url, state, DSEC_ROLE_NODE, 0);
    sleep(2);
    kids[1] = run_child(url, state, DSEC_ROLE_SCHEDULER, 1);
    kids[2] = run_child(url, state, DSEC_ROLE_SCHEDULER, 2);
    sleep(3);

    struct gen g = {.cap_lat = 2000000};
    g.lat = dsec_calloc((size_t)g.cap_lat, sizeof *g.lat);
    /* like libdsec: publish at once */
    dsec_bus_opts bo = {.url = url, .name = "bench-gen", .threads = 1, .mailbox_max = 1 << 20,
                        .low_latency = true};
    dsec_actor *cap = NULL;
    if (dsec_bus_connect(&g.bus, &bo, &err) < 0 || dsec_actor_new(&cap, g.bus, "capacity", &err) < 0 ||
        dsec_actor_on(cap, "dsec.v1.ctl.evt.bench.node.*.capacity", NULL, on_capacity, NULL, &err) < 0 ||
        dsec_bus_publish(g.bus, "dsec.v1.ctl.sync", NULL, &(dsec_hdr){.type = "sync"}, "", 0, &err) < 0) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    sleep(1);

    /* phase 1: DSec's production rate, with exec and destroy mixed in */
    g.phase = 1;
    double p50a, p99a, p999a, el1;
    int64_t m0 = varz_in_msgs(mon_port);
    double rate1 = run_phase(&g, PHASE1_RATE, phase1_secs, 0, false, &p50a, &p99a, &p999a, &el1);
    int64_t m1 = varz_in_msgs(mon_port);
    long c1 = atomic_load(&g.created), f1 = atomic_load(&g.failed);
    printf("phase 1: target %.0f creates/s for %.0f s: %.0f creates/s answered, %ld execs, %ld destroys, %ld failed;"
           " create latency p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms\n",
           PHASE1_RATE, phase1_secs, rate1, atomic_load(&g.execs), atomic_load(&g.destroyed), f1,
           p50a, p99a, p999a);
    if (f1 > 0)
        printf("  last error: %s\n", g.last_error);
    (void)m0;
    (void)m1;
    sleep(1);

    /* the DSec-profile trace through the replay engine */
    sim_replay_result rr = {0};
    uint64_t trace_creates = 0;
    if (replay_dsec_trace(url, 120, 10, &rr, &trace_creates) == 0)
        printf("replay: DSec-profile trace (120 s of trace time, %" PRIu64 " creates incl. one job's burst,"
               " at 10x): %" PRIu64 " creates answered ok, %" PRIu64 " errors; latency p50 %.2f ms,"
               " p99 %.2f ms\n",
               trace_creates, rr.creates_ok, rr.errors, rr.lat_p50_ms, rr.lat_p99_ms);
    sleep(1);

    /* phase 2: as fast as it will go, until 380,000 live */
    g.phase = 2;
    double p50b, p99b, p999b, el2;
    long created_before = atomic_load(&g.created);
    int64_t m2 = varz_in_msgs(mon_port);
    double rate2 = run_phase(&g, phase2_rate, 120, created_before + LIVE_TARGET, true, &p50b, &p99b,
                             &p999b, &el2);
    int64_t m3 = varz_in_msgs(mon_port);
    long c2 = atomic_load(&g.created) - created_before;
    sleep(1); /* the last capacity deltas */
    long live = live_now();
    double per_create = m2 >= 0 && m3 >= 0 && c2 > 0 ? (double)(m3 - m2) / (double)c2 : -1;
    printf("phase 2: offered from %.0f creates/s, adapting to the cell: %.0f creates/s sustained over %.1f s"
           " (%ld created, %ld failed); create latency p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms\n",
           phase2_rate, rate2, el2, c2, atomic_load(&g.failed) - f1, p50b, p99b, p999b);
    printf("live sandboxes (as the nodes report): %ld; bus messages per create in phase 2 (server in_msgs): %.2f\n",
           live, per_create);
    if (atomic_load(&g.failed) > f1)
        printf("  last error: %s\n", g.last_error);
    printf("targets: >= 20000 creates/s in phase 2; p99 <= 20 ms at 5k/s; >= 380000 live; <= 4 msgs per create\n");

    for (int i = 2; i >= 0; i--) { /* schedulers first: they would report the nodes gone */
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
    }
    dsec_actor_free(cap);
    dsec_bus_free(g.bus);
    dsec_natsd_stop(natsd);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", state);
    if (system(cmd) != 0)
        fprintf(stderr, "bench: could not remove %s\n", state);
    printf("{\"scenario\":\"control-plane\",\"creates_per_s\":%.0f,\"p50_ms_at_5k\":%.2f,\"p99_ms_at_5k\":%.2f,"
           "\"p999_ms_at_5k\":%.2f,\"p99_ms_phase2\":%.2f,\"live_peak\":%ld,\"msgs_per_create\":%.2f,"
           "\"raw_nats_msgs_per_s\":%.0f,\"phase1_creates_per_s\":%.0f,"
           "\"replay_creates\":%" PRIu64 ",\"replay_errors\":%" PRIu64 ",\"replay_p99_ms\":%.2f}\n",
           rate2, p50a, p99a, p999a, p99b, live, per_create, raw, rate1, rr.creates_ok, rr.errors,
           rr.lat_p99_ms);
    (void)c1;
    return 0;
}
