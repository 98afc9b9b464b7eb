/* reclaim.c - make bench S=reclaim: a 160-node sim cell full of training jobs takes a burst of
 * 32,000 rollout creates. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "actors/arbiter.h"
#include "actors/cell.h"
#include "bus/bus.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/job.h"

#define NODES 160
#define BURST 32000     /* DSec's largest single-job burst */
#define NODE_CPU 8000   /* milli-CPU per node */
#define NODE_MEM 16384  /* MB per node */
#define UNITS_PER_JOB 4 /* each job holds its node in four units */
#define ROLLOUT_CPU 20  /* the burst needs half the cell: 640,000 milli-CPU */
#define ROLLOUT_MEM 40

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct burst {
    double start;
    double *lat; /* seconds, per create */
    _Atomic size_t done, ok, next;
    _Atomic uint64_t last_ok_us; /* since start */
    dsec_err first_err;
    pthread_mutex_t mu;
};

struct slot {
    struct burst *b;
    double sent;
};

static void on_created(int status, const dsec_sandbox_info *info, const dsec_err *err, void *ud)
{
    struct slot *s = ud;
    struct burst *b = s->b;
    double t = now_s();
    size_t i = atomic_fetch_add(&b->next, 1);
    b->lat[i] = t - s->sent;
    if (status == 0) {
        atomic_fetch_add(&b->ok, 1);
        uint64_t us = (uint64_t)((t - b->start) * 1e6);
        uint64_t prev = atomic_load(&b->last_ok_us);
        while (us > prev && !atomic_compare_exchange_weak(&b->last_ok_us, &prev, us))
            ;
    } else {
        pthread_mutex_lock(&b->mu);
        if (b->first_err.code == 0)
            b->first_err = *err;
        pthread_mutex_unlock(&b->mu);
    }
    atomic_fetch_add(&b->done, 1);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Fire the whole burst at once and wait for every answer. */
static int run_burst(dsec_client *cl, const char *cell, struct burst *b, double *p50, double *p99)
{
    struct slot *slots = dsec_calloc(BURST, sizeof *slots);
    b->lat = dsec_calloc(BURST, sizeof *b->lat);
    pthread_mutex_init(&b->mu, NULL);
    dsec_create_spec spec = {.type = "sim",
                             .cpu_milli = ROLLOUT_CPU,
                             .memory_mb = ROLLOUT_MEM,
                             .cls = "rollout",
                             .cell = cell,
                             .ttl_s = 7200};
    dsec_err err;
    b->start = now_s();
    for (size_t i = 0; i < BURST; i++) {
        slots[i] = (struct slot){b, now_s()};
        if (dsec_create_async(cl, &spec, on_created, &slots[i], &err) < 0) {
            fprintf(stderr, "bench reclaim: create %zu: %s\n", i, err.msg);
            return -1;
        }
    }
    while (atomic_load(&b->done) < BURST && now_s() - b->start < 300)
        usleep(20000);
    size_t n = atomic_load(&b->next);
    qsort(b->lat, n, sizeof *b->lat, cmp_d);
    *p50 = n ? b->lat[n / 2] : 0;
    *p99 = n ? b->lat[(size_t)((double)n * 0.99)] : 0;
    dsec_free(slots);
    return atomic_load(&b->done) == BURST ? 0 : -1;
}

static dsec_cell *start_cell(const char *name, const char *url, const char *state, int roles)
{
    dsec_cell_conf c;
    dsec_cell_conf_defaults(&c);
    snprintf(c.cell, sizeof c.cell, "%s", name);
    snprintf(c.url, sizeof c.url, "%s", url);
    snprintf(c.state_dir, sizeof c.state_dir, "%s/%s", state, name);
    c.threads = 2;
    c.capacity_ms = 50;
    c.full_ms = 2000;
    c.dead_after_ms = 15000;
    c.journal_sync_ms = -1;
    c.wait_ms = 120000;
    c.arbiter_max_per_min = 10000;
    c.arbiter_lease_ms = 3000;
    dsec_err err;
    static const char *const types[] = {"sim", NULL};
    dsec_cell *cell = NULL;
    if (dsec_cell_conf_add_sim_nodes(&c, name, NODES, NODE_CPU, NODE_MEM, 8192, types, "0", &err) <
            0 ||
        dsec_cell_start(&cell, &c, roles, &err) < 0)
        fprintf(stderr, "bench reclaim: cell %s: %s\n", name, err.msg);
    dsec_cell_conf_release(&c);
    return cell;
}

static int ckpt(dsec_job *job, const dsec_job_reclaim *r, void *ud)
{
    uint64_t ms = (uint64_t)(uintptr_t)ud;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    return 0;
}

int main(void)
{
    char state[] = "/tmp/dsec-bench-reclaim-XXXXXX";
    if (mkdtemp(state) == NULL)
        return 2;
    char dir[256];
    snprintf(dir, sizeof dir, "%s/nats", state);
    mkdir(dir, 0700);
    dsec_natsd *nd = NULL;
    dsec_err err;
    dsec_natsd_opts no = {.state_dir = dir, .jetstream = true};
    if (dsec_natsd_start(&nd, &no, &err) < 0) {
        fprintf(stderr, "bench reclaim: nats-server: %s\n", err.msg);
        return 2;
    }
    const char *url = dsec_natsd_url(nd);
    dsec_client *cl = NULL;
    dsec_client_opts co = {
        .url = url, .tenant = "bench", .timeout_ms = 120000, .retries = -1, .threads = 2};
    if (dsec_client_connect(&cl, &co, &err) < 0) {
        fprintf(stderr, "bench reclaim: client: %s\n", err.msg);
        return 2;
    }

    /* Baseline: the same burst into an empty cell, for the extra latency. */
    printf("baseline: %d nodes, empty; burst of %d rollout creates\n", NODES, BURST);
    fflush(stdout);
    dsec_cell *base = start_cell("base", url, state, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE);
    if (base == NULL)
        return 1;
    struct burst b0 = {0};
    double b50, b99;
    int rc0 = run_burst(cl, "base", &b0, &b50, &b99);
    printf("baseline: %zu/%d running in %.2f s; create p50 %.1f ms, p99 %.1f ms\n",
           atomic_load(&b0.ok), BURST, (double)atomic_load(&b0.last_ok_us) / 1e6, b50 * 1e3,
           b99 * 1e3);
    fflush(stdout);
    dsec_cell_stop(base, false);

    /* The cell full of training jobs. */
    dsec_cell *cell =
        start_cell("full", url, state, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE | DSEC_ROLE_ARBITER);
    if (cell == NULL)
        return 1;
    dsec_job *jobs[NODES];
    uint64_t max_ckpt = 0;
    for (int i = 0; i < NODES; i++) {
        char name[32], node[80];
        snprintf(name, sizeof name, "train-%03d", i);
        snprintf(node, sizeof node, "%s", dsec_node_name(dsec_cell_node_at(cell, (size_t)i)));
        dsec_job_unit u[UNITS_PER_JOB];
        for (int k = 0; k < UNITS_PER_JOB; k++)
            u[k] = (dsec_job_unit){.node = node,
                                   .cpu_milli = NODE_CPU / UNITS_PER_JOB,
                                   .memory_mb = NODE_MEM / UNITS_PER_JOB};
        uint64_t ck = 1000 + (uint64_t)(i % 5) * 500; /* 1.0 .. 3.0 s checkpoints */
        if (ck > max_ckpt)
            max_ckpt = ck;
        dsec_job_spec spec = {.name = name,
                              .cell = "full",
                              .cls = "job",
                              .priority = i % 4,
                              .checkpoint_ms = ck,
                              .grace_ms = ck + 2000,
                              .units = u,
                              .nunits = UNITS_PER_JOB};
        if (dsec_job_start(cl, &spec, ckpt, (void *)(uintptr_t)ck, &jobs[i], &err) < 0) {
            fprintf(stderr, "bench reclaim: %s\n", err.msg);
            return 1;
        }
    }
    sleep(2); /* registrations and capacity reports settle; the arbiter holds the lease */
    printf("full: %d nodes held by %d jobs (%d units each; checkpoints 1.0-3.0 s); burst of %d\n",
           NODES, NODES, UNITS_PER_JOB, BURST);
    fflush(stdout);
    struct burst b1 = {0};
    double p50, p99;
    int rc1 = run_burst(cl, "full", &b1, &p50, &p99);
    double all_running = (double)atomic_load(&b1.last_ok_us) / 1e6;
    sleep(1);
    dsec_arbiter_stats as;
    dsec_arbiter_stats_get(dsec_cell_arbiter(cell), &as);
    uint64_t live = 0, destroyed = 0;
    for (size_t i = 0; i < dsec_cell_node_count(cell); i++) {
        dsec_node_stats st;
        dsec_node_stats_get(dsec_cell_node_at(cell, i), &st);
        live += st.live;
        destroyed += st.destroyed;
    }
    /* placements a node refused and the scheduler placed again: what a view that
     * counts room the nodes no longer have costs */
    uint64_t placed = 0, retried = 0;
    for (size_t i = 0; i < dsec_cell_sched_count(cell); i++) {
        dsec_sched_stats ss;
        dsec_sched_stats_get(dsec_cell_sched_at(cell, i), &ss);
        placed += ss.placed;
        retried += ss.retried;
    }
    uint64_t job_reclaims = 0, job_released = 0;
    for (int i = 0; i < NODES; i++) {
        dsec_job_stats js;
        dsec_job_stats_get(jobs[i], &js);
        job_reclaims += js.reclaims;
        job_released += js.released;
    }
    printf("full: %zu/%d running after %.2f s (create p50 %.1f ms, p99 %.1f ms); %" PRIu64
           " rollouts live, %" PRIu64 " destroyed\n",
           atomic_load(&b1.ok), BURST, all_running, p50 * 1e3, p99 * 1e3, live, destroyed);
    printf("arbiter: %" PRIu64 " reclaim requests, %" PRIu64 " acknowledged, %" PRIu64
           " honoured, %" PRIu64 " forced, longest grace %.1f s; jobs saw %" PRIu64
           " requests and released %" PRIu64 " times\n",
           as.requests, as.acked, as.honoured, as.forced, (double)as.max_grace_ms / 1e3,
           job_reclaims, job_released);
    printf("scheduler: %" PRIu64 " placements sent, %" PRIu64 " of them after a node's refusal\n",
           placed, retried);
    if (b1.first_err.code != 0)
        printf("first failed create: %s (%s)\n", b1.first_err.msg,
               dsec_code_name(b1.first_err.code));
    double extra = (p99 - b99) * 1e3;
    printf("{\"scenario\":\"reclaim\",\"nodes\":%d,\"burst\":%d,\"all_running_s\":%.2f,\"max_grace_"
           "s\":%.1f,"
           "\"reclaim_requests\":%" PRIu64 ",\"reclaims_honoured\":%" PRIu64
           ",\"forced_reclaims\":%" PRIu64 ",\"rollouts_preempted\":%" PRIu64
           ",\"rollouts_running\":%zu,\"p99_extra_ms\":%.1f,"
           "\"p99_ms\":%.1f,\"baseline_p99_ms\":%.1f,\"placements\":%" PRIu64
           ",\"placements_after_refusal\":%" PRIu64 ",\"target_met\":%s}\n",
           NODES, BURST, all_running, (double)as.max_grace_ms / 1e3, as.requests, as.honoured,
           as.forced, destroyed, atomic_load(&b1.ok), extra, p99 * 1e3, b99 * 1e3, placed, retried,
           rc0 == 0 && rc1 == 0 && atomic_load(&b1.ok) == BURST && as.forced == 0 &&
                   destroyed == 0 && all_running <= (double)as.max_grace_ms / 1e3 + 5.0
               ? "true"
               : "false");
    fflush(stdout);
    for (int i = 0; i < NODES; i++)
        dsec_job_free(jobs[i], false);
    dsec_client_free(cl);
    dsec_cell_stop(cell, false);
    dsec_natsd_stop(nd);
    dsec_free(b0.lat);
    dsec_free(b1.lat);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", state);
    if (system(cmd) != 0)
        fprintf(stderr, "bench reclaim: could not remove %s\n", state);
    return 0;
}
