/* control_plane.c - make bench S=control-plane: 160 sim nodes, 2 scheduler replicas, an open-loop
 * load generator, one nats-server.
 *
 * Environment, for A/B and diagnostic runs: DSEC_BENCH_SHED_AFTER_MS,
 * DSEC_BENCH_ADMIT_DELAY_MS and DSEC_BENCH_WINDOW_MS set scheduler.shed_after_ms,
 * scheduler.admit_delay_ms and scheduler.window_ms; DSEC_BENCH_PACE=0 sends every create at
 * once, shed or not (the generator otherwise paces them while they are shed, as libdsec does:
 * dsec/pace.h);
 * CP_OVERLOAD_ONLY=RATE runs the overload phase alone at RATE creates/s on a fresh cell (no
 * targets judged); CP_TRACE=1 prints, every 100 ms of it, nats-server's backlog and the
 * replicas' admission (limit, placements taken, placement delay, creates shed late), and every
 * 500 ms the generator's pace. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdatomic.h>
#include <stdbool.h>
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
#include "dsec/pace.h"
#include "sim/sim.h"

/* What an `overloaded` answer says to wait before trying again (100 ms when it says nothing). */
#define SHED_RETRY_AFTER_MS(e) ((e)->retry_after_ms ? (e)->retry_after_ms : 100)

/* The figures of one DSec unit (ARCHITECTURE.md). */
#define NODES 160
#define PHASE1_RATE 5000.0
#define LIVE_TARGET 380000
/* raw nats.c msg/s of the runs in docs/control-plane.md: slower hosts scale the targets */
#define RAW_REF 1470000.0

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

static pid_t run_child(const char *url, const char *state, int roles, int replica, int gen,
                       int metrics_port, int slots)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the benchmark */
    dsec_cell_conf c;
    dsec_cell_conf_defaults(&c);
    snprintf(c.cell, sizeof c.cell, "bench");
    snprintf(c.url, sizeof c.url, "%s", url);
    snprintf(c.state_dir, sizeof c.state_dir, "%s/%s-%d-%d", state,
             roles == DSEC_ROLE_NODE ? "nodes" : "sched", replica, gen);
    c.threads = 2;
    c.sched_replicas = 1;
    c.full_ms = 5000;
    c.capacity_ms = 100;
    c.dead_after_ms = 10000;
    c.default_ttl_s = 7200;
    /* DSEC_BENCH_SHED_AFTER_MS: scheduler.shed_after_ms for an A/B run (0: no shedding by wait) */
    const char *shed = getenv("DSEC_BENCH_SHED_AFTER_MS");
    if (shed != NULL && shed[0] != '\0')
        c.shed_after_ms = (uint32_t)strtoul(shed, NULL, 10);
    /* DSEC_BENCH_ADMIT_DELAY_MS: scheduler.admit_delay_ms for an A/B run (0: no admission by
     * delay) */
    const char *ad = getenv("DSEC_BENCH_ADMIT_DELAY_MS");
    if (ad != NULL && ad[0] != '\0')
        c.admit_delay_ms = (uint32_t)strtoul(ad, NULL, 10);
    /* DSEC_BENCH_WINDOW_MS: scheduler.window_ms for an A/B run (0: no window) */
    const char *win = getenv("DSEC_BENCH_WINDOW_MS");
    if (win != NULL && win[0] != '\0')
        c.window_ms = (uint32_t)strtoul(win, NULL, 10);
    /* DSEC_BENCH_SHARED_DELIVERY=0: bus.shared_delivery off for an A/B run (a delivery thread
     * per subscription) */
    const char *sd = getenv("DSEC_BENCH_SHARED_DELIVERY");
    if (sd != NULL && sd[0] != '\0')
        c.shared_delivery = strcmp(sd, "0") != 0;
    dsec_err err;
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", metrics_port);
    if (metrics_port > 0 && dsec_cell_conf_set_metrics(&c, listen, &err) < 0) {
        fprintf(stderr, "bench child: %s\n", err.msg);
        _exit(1);
    }
    static const char *const types[] = {"sim", NULL};
    if (roles == DSEC_ROLE_NODE &&
        dsec_cell_conf_add_sim_nodes(&c, "n", NODES, (uint32_t)slots * 64, 1572864, (uint32_t)slots,
                                     types, "0", &err) < 0) {
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

/* ---- HTTP on loopback: nats-server's /varz, the schedulers' /metrics ------------------- */

/* The body of GET path on 127.0.0.1:port into buf, or -1. */
static int http_get(int port, const char *path, char *buf, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    char req[256];
    int rl = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    if (write(fd, req, (size_t)rl) != rl) {
        close(fd);
        return -1;
    }
    size_t n = 0;
    ssize_t r;
    while (n < cap - 1 && (r = read(fd, buf + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    close(fd);
    buf[n] = '\0';
    return 0;
}

static int64_t varz_in_msgs(int port)
{
    static char buf[1 << 16];
    if (http_get(port, "/varz", buf, sizeof buf) < 0)
        return -1;
    char *p = strstr(buf, "\"in_msgs\":");
    return p ? strtoll(p + 10, NULL, 10) : -1;
}

/* A counter's value in a scheduler's /metrics (summed over its label sets), or -1. */
static double metric(int port, const char *name)
{
    static char buf[1 << 20];
    if (http_get(port, "/metrics", buf, sizeof buf) < 0)
        return -1;
    double sum = 0;
    bool seen = false;
    size_t nl = strlen(name);
    for (char *line = buf; line != NULL && *line != '\0';) {
        char *end = strchr(line, '\n');
        if (strncmp(line, name, nl) == 0 && (line[nl] == ' ' || line[nl] == '{')) {
            char *sp = end != NULL ? end : line + strlen(line);
            while (sp > line && sp[-1] != ' ')
                sp--;
            sum += strtod(sp, NULL);
            seen = true;
        }
        line = end != NULL ? end + 1 : NULL;
    }
    return seen ? sum : -1;
}

/* nats-server's outbound backlog during a phase: the most bytes pending towards any one
 * connection (the cell's processes and the generator), sampled every 100 ms from /connz. A
 * backlog there is a wait no actor's mailbox sees. */
struct connz_watch {
    int port;
    int sched_ports[2]; /* with CP_TRACE set: the replicas' admission, printed per sample */
    _Atomic bool stop;
    pthread_t th;
    char top_name[64];
    int64_t top_pending; /* the largest sample, with its connection's name */
    int64_t sum_max;     /* the largest sum over connections in one sample */
};

static void connz_sample(struct connz_watch *w)
{
    static char buf[1 << 18];
    if (http_get(w->port, "/connz?limit=256", buf, sizeof buf) < 0)
        return;
    int64_t sum = 0;
    for (char *p = strstr(buf, "\"pending_bytes\":"); p != NULL;
         p = strstr(p + 1, "\"pending_bytes\":")) {
        int64_t v = strtoll(p + 16, NULL, 10);
        sum += v;
        if (v <= w->top_pending)
            continue;
        w->top_pending = v;
        char *nm = strstr(p, "\"name\":");
        char *next = strstr(p + 1, "\"cid\":");
        if (nm != NULL && (next == NULL || nm < next)) {
            nm += 7;
            nm += strspn(nm, " \"");
            snprintf(w->top_name, sizeof w->top_name, "%.*s", (int)strcspn(nm, "\""), nm);
        }
    }
    if (sum > w->sum_max)
        w->sum_max = sum;
    if (getenv("CP_TRACE") != NULL && w->sched_ports[0] > 0) {
        double lim = 0, delay = 0, shed = 0, taken = 0;
        for (int i = 0; i < 2; i++) {
            taken += metric(w->sched_ports[i], "dsec_scheduler_placements_taken_per_second");
            lim += metric(w->sched_ports[i], "dsec_scheduler_admit_limit");
            double d = metric(w->sched_ports[i], "dsec_scheduler_place_delay_seconds");
            delay = d > delay ? d : delay;
            shed += metric(w->sched_ports[i], "dsec_scheduler_shed_late_total");
        }
        printf(
            "    trace: backlog %.0f KiB, admit limit %.0f/s, taken %.0f/s, place delay %.1f ms, "
            "shed late %.0f\n",
            (double)sum / 1024, lim, taken, delay * 1000, shed);
    }
}

static void *connz_run(void *p)
{
    struct connz_watch *w = p;
    while (!atomic_load(&w->stop)) {
        connz_sample(w);
        usleep(100000);
    }
    return NULL;
}

static void connz_start(struct connz_watch *w, int port)
{
    memset(w, 0, sizeof *w);
    w->port = port;
    snprintf(w->top_name, sizeof w->top_name, "-");
    pthread_create(&w->th, NULL, connz_run, w);
}

static void connz_stop(struct connz_watch *w, const char *phase)
{
    atomic_store(&w->stop, true);
    pthread_join(w->th, NULL);
    printf("  %s: nats-server's largest outbound backlog %.1f KiB (to %s), %.1f KiB over all "
           "connections at once\n",
           phase, (double)w->top_pending / 1024, w->top_name, (double)w->sum_max / 1024);
}

/* ---- the load generator ----------------------------------------------------------------- */

enum { OP_CREATE, OP_EXEC, OP_DESTROY };

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct req {
    struct gen *g;
    double due;      /* scheduled send time (open loop: latency counts from here) */
    double sent;     /* this attempt's send time */
    double retry_at; /* when a shed create goes again */
    double deadline; /* wall clock: the create's deadline, the same for every attempt */
    int op;
    unsigned tries;
    bool paced;        /* the client's pace let this attempt go (dsec/pace.h) */
    dsec_pace_item pi; /* in the client's queue of creates the pace holds back */
    char rid[33];      /* one req_id for every attempt of a create, as libdsec does */
    char id[DSEC_SBX_ID_LEN_MAX + 1];
};

struct gen {
    dsec_bus *bus;
    int phase;         /* 1: creates + exec + destroy; 2: creates only */
    bool retry_shed;   /* retry `overloaded` after retry_after_ms with jitter, like libdsec */
    dsec_pace *pace;   /* pace creates while they are shed, like libdsec; NULL: not */
    _Atomic long held; /* creates the pace held back on the client */
    int timeout_ms;    /* a create's deadline from its first send */
    double *lat;       /* create latencies from the first send, ms, per phase */
    double *alat;      /* the admitted attempt's latency, ms, per phase */
    _Atomic long nlat, nalat;
    long cap_lat;
    _Atomic long created, failed, destroyed, execs, in_flight;
    _Atomic long attempts, shed, shed_final, timeouts, late;
    _Atomic long shed_wait_ms; /* the retry_after_ms the sheds said, summed */
    char last_error[DSEC_ERR_MSG_MAX];
    /* shed creates waiting for their retry: a heap on retry_at */
    pthread_mutex_t rmu;
    struct req **rheap;
    size_t nr, capr;
};

static void send_req(struct req *r);

/* The pace's clock: the wall clock, as the creates' deadlines are. */
static uint64_t wall_us(void)
{
    return (uint64_t)(wall_s() * 1e6);
}

static void retry_push(struct gen *g, struct req *r)
{
    pthread_mutex_lock(&g->rmu);
    if (g->nr == g->capr) {
        size_t cap = g->capr ? g->capr * 2 : 4096;
        struct req **h = dsec_realloc(g->rheap, cap * sizeof *h);
        if (h == NULL) {
            pthread_mutex_unlock(&g->rmu);
            atomic_fetch_add(&g->failed, 1);
            dsec_free(r);
            return;
        }
        g->rheap = h;
        g->capr = cap;
    }
    size_t i = g->nr++;
    while (i > 0 && g->rheap[(i - 1) / 2]->retry_at > r->retry_at) {
        g->rheap[i] = g->rheap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    g->rheap[i] = r;
    atomic_fetch_add(&g->in_flight, 1); /* still owed an answer */
    pthread_mutex_unlock(&g->rmu);
}

/* The next shed create due by t, or NULL. */
static struct req *retry_pop(struct gen *g, double t)
{
    pthread_mutex_lock(&g->rmu);
    if (g->nr == 0 || g->rheap[0]->retry_at > t) {
        pthread_mutex_unlock(&g->rmu);
        return NULL;
    }
    struct req *top = g->rheap[0], *last = g->rheap[--g->nr];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= g->nr)
            break;
        if (c + 1 < g->nr && g->rheap[c + 1]->retry_at < g->rheap[c]->retry_at)
            c++;
        if (g->rheap[c]->retry_at >= last->retry_at)
            break;
        g->rheap[i] = g->rheap[c];
        i = c;
    }
    if (g->nr > 0)
        g->rheap[i] = last;
    atomic_fetch_sub(&g->in_flight, 1);
    pthread_mutex_unlock(&g->rmu);
    return top;
}

static void retries_due(struct gen *g, double t)
{
    struct req *r;
    while ((r = retry_pop(g, t)) != NULL)
        send_req(r);
}

/* A create the pace gives up: answered "overloaded" on the client, before its deadline. */
static void pace_give_up(struct gen *g, struct req *r)
{
    atomic_fetch_add(&g->shed_final, 1);
    atomic_fetch_add(&g->failed, 1);
    dsec_free(r);
}

/* Creates the client's pace holds back wait in its queue on the client, as libdsec's do
 * (client/create.c); a shed create back from its retry_after_ms goes to the front (it came
 * first). true: r was taken (held, or given up there and then). */
static bool pace_hold(struct gen *g, struct req *r, bool front)
{
    r->pi.deadline_us = (uint64_t)(r->deadline * 1e6);
    int rc = dsec_pace_admit(g->pace, &r->pi, wall_us(), front);
    if (rc == 0)
        return false;
    atomic_fetch_add(&g->held, 1);
    if (rc < 0)
        pace_give_up(g, r);
    else
        atomic_fetch_add(&g->in_flight, 1); /* still owed an answer */
    return true;
}

/* The held creates whose turn has come go; those whose deadline came too near are given up. */
static void pace_due(struct gen *g)
{
    if (g->pace == NULL)
        return;
    bool give_up;
    uint64_t next;
    dsec_pace_item *it;
    while ((it = dsec_pace_due(g->pace, wall_us(), &give_up, &next)) != NULL) {
        struct req *r = (struct req *)((char *)it - offsetof(struct req, pi));
        atomic_fetch_sub(&g->in_flight, 1);
        if (give_up) {
            pace_give_up(g, r);
            continue;
        }
        r->paced = true;
        send_req(r);
    }
}

/* An error answer: a shed create goes again after retry_after_ms (+0-50% jitter) when that is
 * before its deadline; everything else is a failure. true: r is kept. */
static bool on_error(struct gen *g, struct req *r, const dsec_msg_error *e)
{
    snprintf(g->last_error, sizeof g->last_error, "%s: %s", e->code, e->message);
    if (r->op != OP_CREATE || strcmp(e->code, "overloaded") != 0)
        return false; /* other errors say nothing of the cell's room: not the pace's */
    if (g->pace != NULL)
        dsec_pace_answer(g->pace, wall_us(), true);
    atomic_fetch_add(&g->shed, 1);
    uint64_t after = SHED_RETRY_AFTER_MS(e);
    atomic_fetch_add(&g->shed_wait_ms, (long)after);
    double at = now_s() + (double)after / 1000.0 * (1.0 + 0.5 * drand48());
    if (!g->retry_shed || wall_s() + (at - now_s()) >= r->deadline) {
        atomic_fetch_add(&g->shed_final, 1);
        return false;
    }
    r->retry_at = at;
    retry_push(g, r);
    return true;
}

static void reply_in(int status, dsec_msg *reply, const dsec_err *err, struct req *r)
{
    struct gen *g = r->g;
    const char *type = status == 0 ? dsec_msg_type(reply) : NULL;
    bool ok = type != NULL && strcmp(type, "error") != 0;
    if (r->op == OP_CREATE && status == 0 && wall_s() > r->deadline)
        atomic_fetch_add(&g->late, 1); /* answered, but after the create's deadline */
    if (!ok) {
        if (status < 0) {
            if (err->code == DSEC_E_TIMEOUT)
                atomic_fetch_add(&g->timeouts, 1);
            snprintf(g->last_error, sizeof g->last_error, "%s", err->msg);
        } else {
            dsec_msg_error e;
            dsec_err derr;
            if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_ERROR, dsec_msg_data(reply),
                            dsec_msg_len(reply), &e, &derr) == 0 &&
                on_error(g, r, &e))
                return;
        }
        atomic_fetch_add(&g->failed, 1);
        dsec_free(r);
        return;
    }
    if (r->op == OP_CREATE) {
        if (g->pace != NULL)
            dsec_pace_answer(g->pace, wall_us(), false); /* accepted */
        double t = now_s();
        long i = atomic_fetch_add(&g->nlat, 1);
        if (i < g->cap_lat)
            g->lat[i] = (t - r->due) * 1000.0;
        i = atomic_fetch_add(&g->nalat, 1);
        if (i < g->cap_lat)
            g->alat[i] = (t - r->sent) * 1000.0;
        atomic_fetch_add(&g->created, 1);
        dsec_msg_created c;
        dsec_err derr;
        if (g->phase == 1 &&
            dsec_decode(dsec_wire_decoder(), DSEC_MSG_CREATED, dsec_msg_data(reply),
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

/* in_flight drops after what the answer leads to (a retry, the next op) counted itself in. */
static void on_reply(int status, dsec_msg *reply, const dsec_err *err, void *ud)
{
    struct gen *g = ((struct req *)ud)->g;
    reply_in(status, reply, err, ud);
    atomic_fetch_sub(&g->in_flight, 1);
}

static void send_req(struct req *r)
{
    struct gen *g = r->g;
    dsec_buf *b = dsec_wire_buf();
    dsec_err err;
    char subj[256];
    const char *type, *rid = NULL;
    int rc, timeout_ms = 30000;
    r->sent = now_s();
    if (r->op == OP_CREATE) {
        bool first = r->deadline == 0;
        if (first) {
            dsec_bus_new_id(r->rid);
            r->deadline = wall_s() + (r->due - r->sent) + g->timeout_ms / 1000.0;
        }
        if (g->pace != NULL && !r->paced && pace_hold(g, r, !first))
            return;
        r->paced = false;
        r->tries++;
        double left = r->deadline - wall_s();
        timeout_ms = left > 0.001 ? (int)(left * 1000.0) : 1;
        /* An overloaded create goes again as the same attempt, retry count 0 as libdsec
         * sends it (client.c, defer_overloaded): a retry count above 0 would make the
         * scheduler ask every node whether an earlier attempt made it (a lookup), which
         * libdsec only wants after an attempt that may have been placed. */
        dsec_msg_create m = {.req_id = r->rid,
                             .type = "sim",
                             .cpu_milli = 50,
                             .memory_mb = 64,
                             .cls = "rollout",
                             .retry = 0,
                             .deadline_ns = (uint64_t)(r->deadline * 1e9)};
        rc = dsec_encode(b, DSEC_MSG_CREATE, &m, &err);
        snprintf(subj, sizeof subj, "dsec.v1.bench.create");
        type = "create";
        rid = r->rid;
        atomic_fetch_add(&g->attempts, 1);
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
    }
    dsec_hdr h = {.type = type, .schema = DSEC_SCHEMA_VERSION, .req_id = rid};
    atomic_fetch_add(&g->in_flight, 1);
    if (rc < 0 ||
        dsec_bus_request(g->bus, subj, &h, b->data, b->len, timeout_ms, on_reply, r, &err) < 0) {
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
    atomic_store(&g->nalat, 0);
    long created0 = atomic_load(&g->created);
    double t0 = now_s(), t_rate = t0, next_check = t0 + 1.0;
    long sent_at_rate = 0, shed_seen = atomic_load(&g->shed);
    bool trace_pace = getenv("CP_TRACE") != NULL;
    double next_trace = t0;
    for (;;) {
        double t = now_s();
        if (t - t0 >= secs || (stop_at_created > 0 && atomic_load(&g->created) >= stop_at_created))
            break;
        if (adapt && t >= next_check) {
            long backlog = atomic_load(&g->in_flight), shed = atomic_load(&g->shed);
            /* a create shed and retried is in the backlog; one shed for good is a failure */
            rate = backlog > (long)(rate * 0.05) || (!g->retry_shed && shed > shed_seen)
                       ? rate * 0.9
                       : rate * 1.05;
            shed_seen = shed;
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
        retries_due(g, t);
        pace_due(g);
        if (trace_pace && g->pace != NULL && t >= next_trace) {
            dsec_pace_stats ps;
            dsec_pace_stats_get(g->pace, wall_us(), &ps);
            fprintf(stderr,
                    "pace %.1f s: shed lately %d, accepted %" PRIu64 "/s, queue goes at %" PRIu64
                    "/s; created %ld, attempts %ld, shed %ld, held %ld, given up %ld\n",
                    t - t0, ps.shed_lately, ps.accepted_per_s, ps.send_per_s,
                    atomic_load(&g->created) - created0, atomic_load(&g->attempts),
                    atomic_load(&g->shed), atomic_load(&g->held), atomic_load(&g->shed_final));
            next_trace = t + 0.5;
        }
        sleep_until(t + 0.0005);
    }
    double t_sent = now_s();
    while (atomic_load(&g->in_flight) > 0 && now_s() - t_sent < 30) {
        retries_due(g, now_s());
        pace_due(g);
        usleep(2000);
    }
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

/* p99 of the admitted attempts' latencies of the last phase (from that attempt's send). */
static double admitted_p99(struct gen *g)
{
    long n = atomic_load(&g->nalat);
    if (n > g->cap_lat)
        n = g->cap_lat;
    qsort(g->alat, (size_t)n, sizeof g->alat[0], cmp_d);
    return pctl(g->alat, n, 0.99);
}

/* Live sandboxes as the nodes report them. */
static _Atomic long node_live[NODES];
static void on_capacity(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_msg_capacity c;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CAPACITY, dsec_msg_data(m), dsec_msg_len(m), &c,
                    &err) < 0)
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
    sim_replay_opts o = {.speed = speed,
                         .destroy_at_end = true,
                         .drain_s = 30,
                         .force_type = "sim",
                         .tenant = "bench"};
    dsec_bus_opts bo = {.url = url,
                        .name = "bench-replay",
                        .threads = 2,
                        .mailbox_max = 1 << 20,
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

/* ---- the cell's processes, and CPU-bound neighbours ------------------------------------- */

struct cellp {
    const char *url, *state;
    pid_t kids[3]; /* the node process, two scheduler replicas */
    int metrics[3];
    int gen;
    int slots; /* sandboxes per node (a create asks 50 millicores: the CPUs hold 64 per slot) */
};

static void cell_start(struct cellp *c)
{
    c->gen++;
    c->kids[0] = run_child(c->url, c->state, DSEC_ROLE_NODE, 0, c->gen, 0, c->slots);
    sleep(2);
    for (int i = 1; i <= 2; i++)
        c->kids[i] =
            run_child(c->url, c->state, DSEC_ROLE_SCHEDULER, i, c->gen, c->metrics[i], c->slots);
    sleep(3);
}

static void cell_stop(struct cellp *c)
{
    for (int i = 2; i >= 0; i--) { /* schedulers first: they would report the nodes gone */
        kill(c->kids[i], SIGKILL);
        waitpid(c->kids[i], NULL, 0);
    }
}

/* Nodes the schedulers took out of placement for silence, ever (both replicas), or -1. */
static double nodes_drained(const struct cellp *c)
{
    double sum = 0;
    for (int i = 1; i <= 2; i++) {
        double v = metric(c->metrics[i], "dsec_scheduler_nodes_expired_total");
        if (v < 0)
            return -1;
        sum += v;
    }
    return sum;
}

/* n CPU-bound processes at the bench's own priority. */
static void burners_start(pid_t *pids, int n)
{
    for (int i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            volatile unsigned long x = 0;
            for (;;)
                x++;
        }
    }
}

static void burners_stop(pid_t *pids, int n)
{
    for (int i = 0; i < n; i++)
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
            waitpid(pids[i], NULL, 0);
        }
}

static void gen_reset(struct gen *g, int phase, bool retry_shed, int timeout_ms)
{
    g->phase = phase;
    g->retry_shed = retry_shed;
    g->timeout_ms = timeout_ms;
    /* a fresh pace per phase (a client's measure of its cell), as libdsec paces a client that
     * retries "overloaded"; DSEC_BENCH_PACE=0: none, the A/B */
    const char *pace = getenv("DSEC_BENCH_PACE");
    dsec_pace_free(g->pace);
    g->pace = !retry_shed || (pace != NULL && strcmp(pace, "0") == 0) ? NULL : dsec_pace_new();
    atomic_store(&g->held, 0);
    atomic_store(&g->failed, 0);
    atomic_store(&g->attempts, 0);
    atomic_store(&g->shed, 0);
    atomic_store(&g->shed_final, 0);
    atomic_store(&g->shed_wait_ms, 0);
    atomic_store(&g->timeouts, 0);
    atomic_store(&g->late, 0);
}

/* The end of a diagnostic run (CP_OVERLOAD_ONLY, CP_BUSY_ONLY): everything stopped, the state
 * removed; the exit code. */
static int diag_end(struct cellp *cell, dsec_actor *cap, dsec_bus *bus, dsec_natsd *natsd,
                    const char *state)
{
    cell_stop(cell);
    dsec_actor_free(cap);
    dsec_bus_free(bus);
    dsec_natsd_stop(natsd);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf '%s'", state);
    return system(rm) == 0 ? 0 : 1;
}

struct busy_out {
    double rate, p99, drained, slowdown;
};

/* The busy-host phase: phase 1's load beside two CPU-bound processes per core at the cell's own
 * priority, with the raw nats.c rate measured beside them; its line printed. */
static void busy_host(struct gen *g, struct cellp *cellp, const char *url, double raw,
                      double phase1_secs, struct busy_out *o)
{
    int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN), nburn = 2 * (ncpu > 0 ? ncpu : 1);
    pid_t burn[256] = {0};
    if (nburn > 256)
        nburn = 256;
    burners_start(burn, nburn);
    sleep(1);
    double raw_busy = dsec_bench_raw_publish_rate(url, 1000000);
    o->slowdown = raw_busy > 0 ? raw / raw_busy : -1;
    double d0 = nodes_drained(cellp);
    gen_reset(g, 1, true, 10000);
    double p50c, p999c, el3;
    o->rate = run_phase(g, PHASE1_RATE, phase1_secs, 0, false, &p50c, &o->p99, &p999c, &el3);
    sleep(1); /* a drain pass after the load */
    double d1 = nodes_drained(cellp);
    burners_stop(burn, nburn);
    o->drained = d0 >= 0 && d1 >= 0 ? d1 - d0 : -1;
    long f3 = atomic_load(&g->failed);
    printf("busy host: %d CPU-bound processes beside the cell; raw nats.c %.0f msg/s beside them"
           " (%.2fx slower than %.0f); target %.0f creates/s for %.0f s: %.0f creates/s answered"
           " (%ld failed, %ld answered overloaded), create latency p50 %.2f ms, p99 %.2f ms;"
           " nodes drained %.0f\n",
           nburn, raw_busy, o->slowdown, raw, PHASE1_RATE, phase1_secs, o->rate, f3,
           atomic_load(&g->shed), p50c, o->p99, o->drained);
    if (f3 > 0)
        printf("  last error: %s\n", g->last_error);
}

static const char *verdict(bool ok)
{
    return ok ? "PASS" : "FAIL";
}

int main(int argc, char **argv)
{
    double phase1_secs = argc > 1 ? atof(argv[1]) : 10;
    double phase2_rate = argc > 2 ? atof(argv[2]) : 20000;
    double overload_secs = argc > 3 ? atof(argv[3]) : 10;
    signal(SIGPIPE, SIG_IGN);
    srand48(getpid());
    char state[] = "/tmp/dsec-bench-cp-XXXXXX";
    if (mkdtemp(state) == NULL)
        return 1;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/nats", state);
    mkdir(dir, 0700);
    /* ports from the pid, apart from another dsec's defaults */
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
    dsec_cell_conf dc;
    dsec_cell_conf_defaults(&dc);
    const char *shed_env = getenv("DSEC_BENCH_SHED_AFTER_MS");
    const char *ad_env = getenv("DSEC_BENCH_ADMIT_DELAY_MS");
    const char *win_env = getenv("DSEC_BENCH_WINDOW_MS");
    printf(
        "control-plane bench: nats-server %s, %d sim nodes (1 process), 2 scheduler replicas (2 "
        "processes),"
        " scheduler.shed_after_ms %lu, scheduler.admit_delay_ms %lu, scheduler.window_ms %lu\n",
        url, NODES,
        shed_env != NULL && shed_env[0] ? strtoul(shed_env, NULL, 10)
                                        : (unsigned long)dc.shed_after_ms,
        ad_env != NULL && ad_env[0] ? strtoul(ad_env, NULL, 10) : (unsigned long)dc.admit_delay_ms,
        win_env != NULL && win_env[0] ? strtoul(win_env, NULL, 10) : (unsigned long)dc.window_ms);
    dsec_cell_conf_release(&dc);

    double raw = dsec_bench_raw_publish_rate(url, 1000000);
    printf("baseline: raw nats.c publish -> async subscriber, 200 B: %.0f msg/s\n", raw);
    /* the targets hold on a host as fast as the runs in docs/control-plane.md; a slower host
     * scales them by its own raw rate */
    double scale = raw > 0 && raw < RAW_REF ? raw / RAW_REF : 1.0;
    printf("targets scaled by raw %.0f / %.0f = %.3f: >= %.0f creates/s in phase 2, p99 <= %.1f ms "
           "at 5k/s\n",
           raw, RAW_REF, scale, 20000 * scale, 20.0 / scale);

    struct cellp cell = {.url = url, .state = state, .slots = 3000};
    cell.metrics[1] = 20222 + (int)(getpid() % 1000) * 2;
    cell.metrics[2] = cell.metrics[1] + 1;
    cell_start(&cell);

    struct gen g = {.cap_lat = 2000000, .timeout_ms = 30000};
    pthread_mutex_init(&g.rmu, NULL);
    g.lat = dsec_calloc((size_t)g.cap_lat, sizeof *g.lat);
    g.alat = dsec_calloc((size_t)g.cap_lat, sizeof *g.alat);
    /* like libdsec: publish at once */
    dsec_bus_opts bo = {
        .url = url, .name = "bench-gen", .threads = 1, .mailbox_max = 1 << 20, .low_latency = true};
    dsec_actor *cap = NULL;
    if (dsec_bus_connect(&g.bus, &bo, &err) < 0 ||
        dsec_actor_new(&cap, g.bus, "capacity", &err) < 0 ||
        dsec_actor_on(cap, "dsec.v1.ctl.evt.bench.node.*.capacity", NULL, on_capacity, NULL, &err) <
            0 ||
        dsec_bus_publish(g.bus, "dsec.v1.ctl.sync", NULL, &(dsec_hdr){.type = "sync"}, "", 0,
                         &err) < 0) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    sleep(1);

    /* CP_OVERLOAD_ONLY=RATE: only the overload phase, offered RATE creates/s on a fresh cell
     * (a diagnostic run: where an overload's wait is spent; no targets are judged) */
    const char *only = getenv("CP_OVERLOAD_ONLY");
    if (only != NULL && only[0] != '\0') {
        struct connz_watch cw;
        gen_reset(&g, 2, true, 10000);
        double p50o, p99o, p999o, elo;
        connz_start(&cw, mon_port);
        cw.sched_ports[0] = cell.metrics[1];
        cw.sched_ports[1] = cell.metrics[2];
        double gp = run_phase(&g, atof(only), overload_secs, 0, false, &p50o, &p99o, &p999o, &elo);
        connz_stop(&cw, "overload");
        printf("overload only: offered %.0f creates/s for %.0f s: goodput %.0f creates/s over "
               "%.1f s; %ld attempts, %ld answered overloaded (told to wait %.0f ms on average),"
               " %ld held back by the client's pace, %ld given up, %ld timeouts; admitted attempt "
               "p99 %.2f ms; first send to ok p50 %.2f ms, p99 "
               "%.2f ms\n",
               atof(only), overload_secs, gp, elo, atomic_load(&g.attempts), atomic_load(&g.shed),
               (double)atomic_load(&g.shed_wait_ms) /
                   (double)(atomic_load(&g.shed) ? atomic_load(&g.shed) : 1),
               atomic_load(&g.held), atomic_load(&g.shed_final),
               atomic_load(&g.timeouts) + atomic_load(&g.late), admitted_p99(&g), p50o, p99o);
        return diag_end(&cell, cap, g.bus, natsd, state);
    }

    /* CP_BUSY_ONLY=1: only the busy-host phase, on a fresh cell (a diagnostic run, as above) */
    const char *busy_only = getenv("CP_BUSY_ONLY");
    if (busy_only != NULL && busy_only[0] != '\0' && strcmp(busy_only, "0") != 0) {
        struct busy_out bz;
        busy_host(&g, &cell, url, raw, phase1_secs, &bz);
        printf("busy only: p99 %.2f ms against 20 ms x %.2f = %.1f ms\n", bz.p99, bz.slowdown,
               20 * bz.slowdown);
        return diag_end(&cell, cap, g.bus, natsd, state);
    }

    /* phase 1: DSec's production rate, with exec and destroy mixed in */
    gen_reset(&g, 1, true, 30000); /* a shed create goes again, paced, as libdsec sends it */
    double p50a, p99a, p999a, el1;
    double rate1 = run_phase(&g, PHASE1_RATE, phase1_secs, 0, false, &p50a, &p99a, &p999a, &el1);
    long f1 = atomic_load(&g.failed);
    printf("phase 1: target %.0f creates/s for %.0f s: %.0f creates/s answered, %ld execs, %ld "
           "destroys, %ld failed;"
           " create latency p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms\n",
           PHASE1_RATE, phase1_secs, rate1, atomic_load(&g.execs), atomic_load(&g.destroyed), f1,
           p50a, p99a, p999a);
    if (f1 > 0)
        printf("  last error: %s\n", g.last_error);
    sleep(1);

    /* the DSec-profile trace through the replay engine */
    sim_replay_result rr = {0};
    uint64_t trace_creates = 0;
    if (replay_dsec_trace(url, 120, 10, &rr, &trace_creates) == 0)
        printf("replay: DSec-profile trace (120 s of trace time, %" PRIu64
               " creates incl. one job's burst,"
               " at 10x): %" PRIu64 " creates answered ok, %" PRIu64 " errors; latency p50 %.2f ms,"
               " p99 %.2f ms\n",
               trace_creates, rr.creates_ok, rr.errors, rr.lat_p50_ms, rr.lat_p99_ms);
    sleep(1);

    /* phase 2: as fast as it will go, until 380,000 live */
    gen_reset(&g, 2, true, 30000); /* a shed create goes again, paced, as libdsec sends it */
    double p50b, p99b, p999b, el2;
    long created_before = atomic_load(&g.created);
    int64_t m2 = varz_in_msgs(mon_port);
    double rate2 = run_phase(&g, phase2_rate, 120, created_before + LIVE_TARGET, true, &p50b, &p99b,
                             &p999b, &el2);
    int64_t m3 = varz_in_msgs(mon_port);
    long c2 = atomic_load(&g.created) - created_before, f2 = atomic_load(&g.failed);
    sleep(1); /* the last capacity deltas */
    long live = live_now();
    double per_create = m2 >= 0 && m3 >= 0 && c2 > 0 ? (double)(m3 - m2) / (double)c2 : -1;
    printf("phase 2: offered from %.0f creates/s, adapting to the cell: %.0f creates/s sustained "
           "over %.1f s"
           " (%ld created, %ld failed, %ld answered overloaded); create latency p50 %.2f ms, p99 "
           "%.2f ms,"
           " p99.9 %.2f ms\n",
           phase2_rate, rate2, el2, c2, f2, atomic_load(&g.shed), p50b, p99b, p999b);
    printf("live sandboxes (as the nodes report): %ld; bus messages per create in phase 2 (server "
           "in_msgs): %.2f\n",
           live, per_create);
    if (f2 > 0)
        printf("  last error: %s\n", g.last_error);

    /* A fresh cell for the last two phases: the 380,000 live leave no room for an overload. It
     * has room for all the overload phase offers (twice phase 2 for overload_secs, and a tenth
     * more), so that phase measures the cell's admission, not its size: a cell of 3,000 per node
     * (480,000) is full before the end of an overload offered at 2 x 24,000/s. */
    cell_stop(&cell);
    memset(node_live, 0, sizeof node_live);
    double want = 2 * rate2 * overload_secs * 1.1 / NODES;
    cell.slots = want > 3000 ? (int)want + 1 : 3000;
    cell_start(&cell);
    printf("the last two phases' cell: %d sandboxes per node (%d in all)\n", cell.slots,
           cell.slots * NODES);
    dsec_bus_publish(g.bus, "dsec.v1.ctl.sync", NULL, &(dsec_hdr){.type = "sync"}, "", 0, &err);
    sleep(1);

    /* busy host: phase 1's load beside two CPU-bound processes per core, same priority */
    struct busy_out bz;
    busy_host(&g, &cell, url, raw, phase1_secs, &bz);
    double rate3 = bz.rate, p99c = bz.p99, drained = bz.drained, slowdown = bz.slowdown;
    sleep(2);

    /* overload: twice what phase 2 sustained, every create with a 10 s deadline, shed creates
     * retried after retry_after_ms with jitter within it (libdsec's behaviour) */
    gen_reset(&g, 2, true, 10000);
    double p50d, p99d, p999d, el4;
    long created_before4 = atomic_load(&g.created);
    int64_t m4 = varz_in_msgs(mon_port);
    double offered = 2 * rate2;
    struct connz_watch cw;
    connz_start(&cw, mon_port);
    double goodput = run_phase(&g, offered, overload_secs, 0, false, &p50d, &p99d, &p999d, &el4);
    connz_stop(&cw, "overload");
    int64_t m5 = varz_in_msgs(mon_port);
    double ap99 = admitted_p99(&g);
    long c4 = atomic_load(&g.created) - created_before4, attempts = atomic_load(&g.attempts);
    long shed = atomic_load(&g.shed), timeouts = atomic_load(&g.timeouts) + atomic_load(&g.late);
    double shed_share = attempts > 0 ? (double)shed / (double)attempts : 0;
    double offered_n = offered * overload_secs;
    double per_offered = m4 >= 0 && m5 >= 0 ? (double)(m5 - m4) / offered_n : -1;
    printf("overload: offered %.0f creates/s (2x phase 2) for %.0f s, 10 s deadlines: goodput %.0f "
           "creates/s"
           " over %.1f s (%ld created); %ld attempts, %.1f%% answered overloaded, %ld held back by"
           " the client's pace (%ld given up before their deadline), %ld timeouts or late answers, "
           "%ld other failures; admitted attempt p99"
           " %.2f ms; first send to ok p50 %.2f ms, p99 %.2f ms; bus messages per offered create "
           "%.2f\n",
           offered, overload_secs, goodput, el4, c4, attempts, 100 * shed_share,
           atomic_load(&g.held), atomic_load(&g.shed_final), timeouts,
           atomic_load(&g.failed) - atomic_load(&g.shed_final) - atomic_load(&g.timeouts), ap99,
           p50d, p99d, per_offered);
    if (atomic_load(&g.failed) > 0)
        printf("  last error: %s\n", g.last_error);

    printf("targets (scaled %.3f): phase 2 >= %.0f creates/s: %s; p99 at 5k/s <= %.1f ms: %s;"
           " >= %d live: %s; <= 4 msgs per create: %s\n",
           scale, 20000 * scale, verdict(rate2 >= 20000 * scale), 20.0 / scale,
           verdict(p99a <= 20.0 / scale), LIVE_TARGET, verdict(live >= LIVE_TARGET),
           verdict(per_create > 0 && per_create <= 4));
    printf("targets: overload goodput >= 90%% of phase 2 (%.0f): %s; 0 timeouts: %s; admitted p99 "
           "<= 100 ms: %s\n",
           0.9 * rate2, verdict(goodput >= 0.9 * rate2), verdict(timeouts == 0),
           verdict(ap99 <= 100));
    printf("targets: busy host >= 95%% of 5000/s answered: %s; 0 nodes drained: %s;"
           " p99 <= 20 ms x %.2f = %.1f ms: %s\n",
           verdict(rate3 >= 0.95 * PHASE1_RATE), verdict(drained == 0), slowdown, 20 * slowdown,
           verdict(slowdown > 0 && p99c <= 20 * slowdown));

    cell_stop(&cell);
    dsec_actor_free(cap);
    dsec_bus_free(g.bus);
    dsec_natsd_stop(natsd);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", state);
    if (system(cmd) != 0)
        fprintf(stderr, "bench: could not remove %s\n", state);
    printf(
        "{\"scenario\":\"control-plane\",\"creates_per_s\":%.0f,\"p50_ms_at_5k\":%.2f,\"p99_ms_at_"
        "5k\":%.2f,"
        "\"p999_ms_at_5k\":%.2f,\"p99_ms_phase2\":%.2f,\"live_peak\":%ld,\"msgs_per_create\":%.2f,"
        "\"raw_nats_msgs_per_s\":%.0f,\"phase1_creates_per_s\":%.0f,"
        "\"replay_creates\":%" PRIu64 ",\"replay_errors\":%" PRIu64 ",\"replay_p99_ms\":%.2f,"
        "\"overload_goodput_per_s\":%.0f,\"overload_shed_share\":%.3f,\"overload_timeouts\":%ld,"
        "\"overload_p99_ms\":%.2f,\"overload_msgs_per_create\":%.2f,\"busy_creates_per_s\":%.0f,"
        "\"busy_p99_ms\":%.2f,\"busy_nodes_drained\":%.0f,\"busy_raw_slowdown\":%.2f}\n",
        rate2, p50a, p99a, p999a, p99b, live, per_create, raw, rate1, rr.creates_ok, rr.errors,
        rr.lat_p99_ms, goodput, shed_share, timeouts, ap99, per_offered, rate3, p99c, drained,
        slowdown);
    return 0;
}
