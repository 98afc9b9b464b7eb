/* rollout.c - make bench S=rollout: one node running 1,000 busy container sandboxes, each an agent
 * loop of SWE-like steps, against the ideal time and the same steps run directly on the host in the
 * same run. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "actors/cell.h"
#include "bench/common.h"
#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/client.h"

/*
 * Scenario (one node on this machine, one run; parameters from the environment):
 *  0. The node (scheduler, node manager and an embedded nats-server on a free port) runs in a
 *     child process of its own, forked before any thread exists, so its CPU is its own and a
 *     crash of it is seen (and cleaned up) by the bench. Its cell and node are named after the
 *     bench's pid, so cgroups, runtime state and subjects cannot meet another dsec on the host.
 *  1. ROLLOUT_SANDBOXES (1000) busybox:1 containers are created, 32 creates at a time.
 *  2. Idle window (ROLLOUT_IDLE_S, 10 s): heartbeat gaps and node CPU with every sandbox idle, the
 *     baseline of the figures under load; then 200 sequential execs of `true` through dsec beside
 *     200 vfork+exec+wait of the same busybox `true` on the host.
 *  3. Sleep phase: every sandbox starts `sleep ROLLOUT_SLEEP_S` (5) at the same moment (a barrier
 *     releases one thread per sandbox); its wall time beside the same number of `sleep` child
 *     processes started the same way on the host.
 *  4. Rollout: every sandbox runs its own plan of steps (a fixed-seed PRNG per sandbox, so the plan
 *     does not depend on timing): commands whose durations are lognormal (median 2 s, sigma 1.5,
 *     at most ROLLOUT_MAX_CMD_S), nearly all `sleep` (waiting), 0.2% a busy loop of at most 2 s
 *     (CPU-bound); file writes of 1 KiB-10 MiB (90% below 256 KiB) and reads of the file written;
 *     now and then a fork into one child that runs `true` and is destroyed. Commands are drawn
 *     until their planned durations sum to ROLLOUT_BUDGET_S (150) exactly, the last one clipped.
 *     Ideal time: for each sandbox the sum of its steps' durations when nothing waits on the node,
 *     that is the planned durations of its commands (file transfers and forks count zero: all of
 *     their time is overhead); then the maximum over sandboxes, since they run in parallel. By
 *     construction every sandbox's sum is ROLLOUT_BUDGET_S. Wall time: from the moment every
 *     sandbox starts its first step to the end of the last step of the last sandbox.
 *  5. The same plans run directly on the host (ROLLOUT_HOST_BASELINE=1): one thread per sandbox,
 *     fork+exec of the same busybox commands, the same bytes written to and read from files.
 *  Heartbeats are received on a connection of their own all along; the node's execs in flight
 *  and CPU are sampled every 250 ms.
 */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* v is sorted in place. */
static double pct(double *v, size_t n, double p)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static unsigned long env_ul(const char *name, unsigned long def)
{
    const char *v = getenv(name);
    return v && *v ? strtoul(v, NULL, 10) : def;
}

/* ---- the plan ------------------------------------------------------------------------- */

enum { K_SLEEP, K_CPU, K_WRITE, K_READ, K_FORK, K_N };
static const char *const kind_names[K_N] = {"sleep", "cpu", "write", "read", "fork"};

typedef struct step {
    uint8_t kind;
    uint32_t planned_ms; /* commands */
    uint32_t bytes;      /* writes */
    /* measured */
    float wall_ms;      /* as the client saw it */
    float own_ms;       /* the agent's duration of the command */
    float host_wall_ms; /* the same step on the host */
    bool failed;
} step;

typedef struct sandbox {
    char id[DSEC_ID_MAX];
    step *steps;
    size_t nsteps;
    double end_s; /* when its last step ended (phase clock) */
    double host_end_s;
    uint64_t rng;
    char err[256]; /* the first failure */
} sandbox;

static uint64_t rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) /* (0, 1) */
{
    return ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_normal(uint64_t *s)
{
    return sqrt(-2 * log(rng_unit(s))) * cos(2 * M_PI * rng_unit(s));
}

#define MEDIAN_S 2.0
#define SIGMA 1.5
#define CPU_SHARE 0.002
#define CPU_MAX_MS 2000
#define FILE_SHARE 0.20
#define FORK_SHARE 0.005
#define FILE_MAX (10u << 20)

static void plan(sandbox *sb, uint64_t seed, unsigned idx, uint32_t budget_ms, uint32_t max_cmd_ms)
{
    sb->rng = seed * 1000003u + idx;
    size_t cap = 64, n = 0;
    step *v = dsec_calloc(cap, sizeof *v);
    uint64_t sum = 0;
    bool wrote = false;
    while (sum < budget_ms) {
        if (n + 1 >= cap) {
            v = dsec_realloc(v, cap * 2 * sizeof *v);
            memset(v + cap, 0, cap * sizeof *v);
            cap *= 2;
        }
        step *st = &v[n++];
        double u = rng_unit(&sb->rng);
        if (u < FORK_SHARE) {
            st->kind = K_FORK;
        } else if (u < FORK_SHARE + FILE_SHARE) {
            if (wrote && rng_unit(&sb->rng) < 0.5) {
                st->kind = K_READ;
            } else {
                st->kind = K_WRITE;
                /* log-uniform: 90% in 1 KiB-256 KiB, 10% in 256 KiB-10 MiB */
                double lo = 1024, hi = 256 * 1024;
                if (rng_unit(&sb->rng) < 0.1)
                    lo = hi, hi = FILE_MAX;
                st->bytes = (uint32_t)exp(log(lo) + rng_unit(&sb->rng) * (log(hi) - log(lo)));
                wrote = true;
            }
        } else {
            bool cpu = rng_unit(&sb->rng) < CPU_SHARE;
            double d = MEDIAN_S * exp(SIGMA * rng_normal(&sb->rng)) * 1000;
            if (d < 20)
                d = 20;
            if (d > max_cmd_ms)
                d = max_cmd_ms;
            if (cpu && d > CPU_MAX_MS)
                d = CPU_MAX_MS;
            uint32_t ms = (uint32_t)d;
            if (sum + ms >= budget_ms)
                ms = (uint32_t)(budget_ms - sum);
            st->kind = cpu ? K_CPU : K_SLEEP;
            st->planned_ms = ms;
            sum += ms;
        }
    }
    sb->steps = v;
    sb->nsteps = n;
}

/* argv of a command step; buf holds its numbers */
static void step_argv(const step *st, const char *argv[8], char buf[32])
{
    snprintf(buf, 32, "%u.%03u", st->planned_ms / 1000, st->planned_ms % 1000);
    if (st->kind == K_SLEEP) {
        argv[0] = "sleep", argv[1] = buf, argv[2] = NULL;
    } else {
        argv[0] = "timeout", argv[1] = buf, argv[2] = "sh", argv[3] = "-c",
        argv[4] = "while :; do :; done", argv[5] = NULL;
    }
}

/* ---- the node, in a child process --------------------------------------------------------- */

static pid_t g_child = -1;
static int g_cmd = -1, g_resp = -1; /* pipes to and from the child */
static FILE *g_resp_f;
static pthread_mutex_t g_child_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_root[64];
static char g_node[48], g_cell[48];
static bool g_hybrid;

typedef struct node_sample {
    uint64_t inflight, peak, work_queued, work_peak, live;
    double cpu_s;     /* user + system of the node's process */
    uint64_t expired; /* times the cell's scheduler took the node out of placement for silence */
} node_sample;

static int child_main(int cmd, int resp, const char *root)
{
    /* the bench stops this process through the pipe (a 'Q', or EOF when the bench dies however
     * it dies), so that the cell destroys its sandboxes first: a ^C to the terminal is the bench's
     */
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGTERM, SIG_DFL);
    FILE *out = fdopen(resp, "w");
    setvbuf(out, NULL, _IOLBF, 0);
    dsec_cell_conf conf;
    dsec_cell_conf_defaults(&conf);
    snprintf(conf.cell, sizeof conf.cell, "%s", g_cell);
    conf.embedded_nats = true;
    conf.nats_port = 0;
    conf.sched_replicas = 1;
    snprintf(conf.state_dir, sizeof conf.state_dir, "%s/state", root);
    snprintf(conf.layers_path, sizeof conf.layers_path, "%s/layers", root);
    dsec_cell_node node = {
        .cpu_milli = 100000000, .memory_mb = 1u << 24, .slots = 8192, .disk_mb = 1u << 30};
    snprintf(node.name, sizeof node.name, "%s", g_node);
    snprintf(node.backend, sizeof node.backend, "native");
    node.types[0] = dsec_strdup("container");
    conf.nodes = dsec_calloc(1, sizeof node);
    conf.nodes[0] = node;
    conf.nnodes = 1;
    dsec_cell *cell;
    dsec_err err;
    if (dsec_cell_start(&cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0) {
        fprintf(out, "ERR %s\n", err.msg);
        return 1;
    }
    fprintf(out, "URL %s %u\n", dsec_cell_url(cell), conf.heartbeat_ms);
    dsec_node *n = dsec_cell_node_at(cell, 0);
    char c;
    while (read(cmd, &c, 1) == 1 && c == 'S') {
        dsec_node_stats ns;
        dsec_node_stats_get(n, &ns);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                     (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
        dsec_sched_stats ss;
        dsec_sched_stats_get(dsec_cell_sched_at(cell, 0), &ss);
        fprintf(out,
                "%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %.6f %" PRIu64 "\n",
                ns.execs_inflight, ns.execs_peak, ns.work_queued, ns.work_peak, ns.live, cpu,
                ss.expired);
    }
    /* 'Q' or the bench went away: destroy everything, then go */
    dsec_cell_stop(cell, true);
    dsec_cell_conf_release(&conf);
    fprintf(out, "BYE\n");
    return 0;
}

static atomic_bool g_node_dead;

/* 0 and *s filled, or -1 when the node's process is gone. */
static int node_query(node_sample *s)
{
    pthread_mutex_lock(&g_child_mu);
    char line[256];
    int rc = -1;
    if (g_child > 0 && write(g_cmd, "S", 1) == 1 && fgets(line, sizeof line, g_resp_f) != NULL &&
        sscanf(line, "%" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %lf %" SCNu64,
               &s->inflight, &s->peak, &s->work_queued, &s->work_peak, &s->live, &s->cpu_s,
               &s->expired) == 7)
        rc = 0;
    pthread_mutex_unlock(&g_child_mu);
    if (rc < 0)
        atomic_store(&g_node_dead, true);
    return rc;
}

/* crun the way the backend calls it: in a private mount namespace without the hybrid cgroup2 mount.
 */
static void crun_quiet(const char *const argv[])
{
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0), dup2(null, 1), dup2(null, 2);
        if (g_hybrid) {
            if (unshare(CLONE_NEWNS) < 0 || mount("", "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
                _exit(126);
            umount2("/sys/fs/cgroup/unified", MNT_DETACH);
        }
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    while (pid > 0 && waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
}

/* Everything the bench made goes, whatever state the node is in: the node's process (asked to
 * destroy its sandboxes, killed when it does not within 300 s), then any container still in
 * its runtime state, its cgroups, the upper store and the bench's directory. */
static void cleanup(void)
{
    static atomic_bool done;
    if (atomic_exchange(&done, true) || g_root[0] == '\0')
        return;
    if (g_child > 0) {
        ssize_t w = write(g_cmd, "Q", 1); /* fails when the node is gone: then EOF tells it */
        (void)w;
        close(g_cmd);
        double t0 = dsec_bench_now_s();
        int st;
        while (waitpid(g_child, &st, WNOHANG) == 0) {
            if (dsec_bench_now_s() - t0 > 300) {
                fprintf(stderr, "bench rollout: the node did not stop in 300 s; killing it\n");
                kill(g_child, SIGKILL);
                waitpid(g_child, &st, 0);
                break;
            }
            usleep(50000);
        }
        g_child = -1;
    }
    /* containers left behind (a node that crashed or was killed) */
    char run[512], line[512];
    snprintf(run, sizeof run, "%s/state/node-%s/container/run", g_root, g_node);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "ls %s 2>/dev/null", run);
    FILE *p = popen(cmd, "r");
    int left = 0;
    while (p && fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        const char *del[] = {"crun", "--root", run, "delete", "-f", line, NULL};
        crun_quiet(del);
        left++;
    }
    if (p)
        pclose(p);
    if (left > 0)
        fprintf(stderr, "bench rollout: %d containers were left in %s; deleted\n", left, run);
    dsec_bench_sh(
        "for d in $(find /sys/fs/cgroup/*/dsec-ct-%s /sys/fs/cgroup/dsec-ct-%s -depth -type d "
        "2>/dev/null); do "
        "rmdir $d 2>/dev/null; done; "
        "grep -o ' %s[^ ]*' /proc/self/mounts | sort -r | while read m; do umount -l $m; done; rm "
        "-rf %s",
        g_node, g_node, g_root, g_root);
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "bench rollout: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    cleanup();
    _exit(1);
}

static void on_signal(int sig)
{
    /* cleanup forks and waits: not async-signal-safe, but the bench is ending anyway */
    fprintf(stderr, "bench rollout: signal %d; cleaning up\n", sig);
    cleanup();
    _exit(128 + sig);
}

/* ---- heartbeats and samples --------------------------------------------------------------- */

enum { PH_SETUP, PH_IDLE, PH_SLEEP, PH_HOST_SLEEP, PH_ROLLOUT, PH_HOST_ROLLOUT, PH_END, PH_N };
static const char *const phase_names[PH_N] = {"setup",   "idle",         "sleep", "host-sleep",
                                              "rollout", "host-rollout", "end"};
static atomic_int g_phase;

typedef struct phase_stats {
    double hb_gap_ms;      /* the longest gap between heartbeats as they arrived here */
    double hb_send_gap_ms; /* the same from the node's own timestamps */
    uint64_t hbs;
    uint64_t inflight_max; /* sampled */
    uint64_t work_max;
    double t0, t1; /* phase clock */
    double node_cpu0, node_cpu1;
    uint64_t expired0, expired1;
    uint64_t host_busy0, host_total0, host_busy1, host_total1; /* /proc/stat jiffies */
    double self_cpu0, self_cpu1;
} phase_stats;

static phase_stats g_ph[PH_N];
static pthread_mutex_t g_hb_mu = PTHREAD_MUTEX_INITIALIZER;
static double g_hb_last_arrival, g_hb_last_sent;
static uint64_t g_hb_last_seq, g_hb_lost;

static void on_heartbeat(dsec_actor *a, dsec_msg *m, void *ud)
{
    double t = dsec_bench_now_s();
    dsec_decoder *dec = ud;
    dsec_msg_heartbeat hb;
    dsec_err err;
    if (dsec_decode(dec, DSEC_MSG_HEARTBEAT, dsec_msg_data(m), dsec_msg_len(m), &hb, &err) < 0)
        return;
    pthread_mutex_lock(&g_hb_mu);
    int ph = atomic_load(&g_phase);
    double sent = (double)hb.ts_ns / 1e9;
    if (g_hb_last_arrival > 0) {
        double gap = (t - g_hb_last_arrival) * 1000, sgap = (sent - g_hb_last_sent) * 1000;
        if (gap > g_ph[ph].hb_gap_ms)
            g_ph[ph].hb_gap_ms = gap;
        if (sgap > g_ph[ph].hb_send_gap_ms)
            g_ph[ph].hb_send_gap_ms = sgap;
        if (hb.seq > g_hb_last_seq + 1)
            g_hb_lost += hb.seq - g_hb_last_seq - 1;
    }
    g_ph[ph].hbs++;
    g_hb_last_arrival = t;
    g_hb_last_sent = sent;
    g_hb_last_seq = hb.seq;
    pthread_mutex_unlock(&g_hb_mu);
}

static void host_jiffies(uint64_t *busy, uint64_t *total)
{
    FILE *f = fopen("/proc/stat", "r");
    uint64_t v[10] = {0};
    if (f && fscanf(f,
                    "cpu %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
                    " %" SCNu64 " %" SCNu64,
                    &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) == 8) {
        *total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
        *busy = *total - v[3] - v[4];
    }
    if (f)
        fclose(f);
}

static double self_cpu(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static void phase_begin(int ph)
{
    node_sample s = {0};
    node_query(&s);
    double t = dsec_bench_now_s();
    pthread_mutex_lock(&g_hb_mu);
    int old = atomic_load(&g_phase);
    g_ph[old].t1 = t;
    g_ph[old].node_cpu1 = s.cpu_s;
    g_ph[old].expired1 = s.expired;
    host_jiffies(&g_ph[old].host_busy1, &g_ph[old].host_total1);
    g_ph[old].self_cpu1 = self_cpu();
    g_ph[ph].t0 = t;
    g_ph[ph].node_cpu0 = s.cpu_s;
    g_ph[ph].expired0 = s.expired;
    host_jiffies(&g_ph[ph].host_busy0, &g_ph[ph].host_total0);
    g_ph[ph].self_cpu0 = self_cpu();
    atomic_store(&g_phase, ph);
    pthread_mutex_unlock(&g_hb_mu);
    dsec_bench_perf_phase(phase_names[ph]);
}

static atomic_bool g_stop_monitor;
static double g_deadline; /* the run is declared hung past it (0: none) */
static atomic_uint_fast64_t g_steps_done, g_steps_total;

static void *monitor(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_stop_monitor)) {
        node_sample s;
        if (node_query(&s) < 0) {
            int st;
            pid_t r = waitpid(g_child, &st, WNOHANG);
            fprintf(stderr,
                    "bench rollout: FAILURE: the node's process is gone (%s %d) during phase %s; "
                    "steps done %" PRIuFAST64 " of %" PRIuFAST64 "\n",
                    r > 0 && WIFSIGNALED(st) ? "killed by signal" : "exit status",
                    r > 0 ? (WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st)) : -1,
                    phase_names[atomic_load(&g_phase)], atomic_load(&g_steps_done),
                    atomic_load(&g_steps_total));
            if (r > 0)
                g_child = -1;
            cleanup();
            printf("FAIL: the node crashed; no figures\n");
            _exit(1);
        }
        int ph = atomic_load(&g_phase);
        if (s.inflight > g_ph[ph].inflight_max)
            g_ph[ph].inflight_max = s.inflight;
        if (s.work_queued > g_ph[ph].work_max)
            g_ph[ph].work_max = s.work_queued;
        if (g_deadline > 0 && dsec_bench_now_s() > g_deadline) {
            fprintf(stderr,
                    "bench rollout: FAILURE: phase %s passed its deadline (hang?): steps done "
                    "%" PRIuFAST64 " of %" PRIuFAST64 ", execs in flight on the node %" PRIu64
                    ", work queued %" PRIu64 "\n",
                    phase_names[ph], atomic_load(&g_steps_done), atomic_load(&g_steps_total),
                    s.inflight, s.work_queued);
            cleanup();
            printf("FAIL: the run hung; no figures\n");
            _exit(1);
        }
        usleep(250000);
    }
    return NULL;
}

/* ---- running many things at once ---------------------------------------------------------- */

static pthread_barrier_t g_barrier;
static double g_go; /* phase clock origin, set by the barrier's last thread */

static void run_all(size_t n, void *(*fn)(void *), void *args, size_t argsz)
{
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 512 * 1024);
    pthread_t *th = dsec_calloc(n, sizeof *th);
    pthread_barrier_init(&g_barrier, NULL, (unsigned)n + 1);
    for (size_t i = 0; i < n; i++)
        if (pthread_create(&th[i], &at, fn, (char *)args + i * argsz) != 0)
            die("pthread_create: %s", strerror(errno));
    g_go = dsec_bench_now_s();
    pthread_barrier_wait(&g_barrier);
    for (size_t i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&g_barrier);
    pthread_attr_destroy(&at);
    dsec_free(th);
}

static dsec_client *g_cl;
static sandbox *g_sb;
static size_t g_n;
static uint8_t *g_bytes; /* FILE_MAX bytes every write takes its data from */
static atomic_uint_fast64_t g_fail[K_N + 1];
static char g_first_err[K_N + 1][640]; /* the first failure of each kind */
static pthread_mutex_t g_err_mu = PTHREAD_MUTEX_INITIALIZER;

static void note_fail(int kind, const char *id, const char *what)
{
    atomic_fetch_add(&g_fail[kind], 1);
    pthread_mutex_lock(&g_err_mu);
    if (g_first_err[kind][0] == '\0')
        snprintf(g_first_err[kind], sizeof g_first_err[kind], "%s in %s: %.400s",
                 kind < K_N ? kind_names[kind] : "sleep-phase", id, what);
    pthread_mutex_unlock(&g_err_mu);
}

/* creates: 32 at a time */
static atomic_size_t g_next_create;
static void *create_worker(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&g_barrier);
    for (size_t i; (i = atomic_fetch_add(&g_next_create, 1)) < g_n;) {
        dsec_create_spec cs = {.type = "container",
                               .env = "busybox:1",
                               .cpu_milli = 1000,
                               .memory_mb = 256,
                               .disk_mb = 256,
                               .ttl_s = 86400,
                               .idle_s = 86400};
        dsec_sandbox_info info;
        dsec_err err;
        if (dsec_create(g_cl, &cs, &info, &err) < 0) {
            snprintf(g_sb[i].err, sizeof g_sb[i].err, "create: %.200s", err.msg);
            continue;
        }
        snprintf(g_sb[i].id, sizeof g_sb[i].id, "%s", info.id);
    }
    return NULL;
}

static void *destroy_worker(void *arg)
{
    (void)arg;
    pthread_barrier_wait(&g_barrier);
    for (size_t i; (i = atomic_fetch_add(&g_next_create, 1)) < g_n;) {
        dsec_err err;
        if (g_sb[i].id[0] != '\0' && dsec_destroy(g_cl, g_sb[i].id, &err) < 0)
            note_fail(K_N, g_sb[i].id, err.msg);
    }
    return NULL;
}

/* The write steps by how they travel: up to 4 MiB one message (written on the node's loop),
 * above it an upload (4 MiB chunks, hashed, renamed into place). */
static void write_sizes(void)
{
    size_t n[2] = {0, 0}, all = 1;
    for (size_t i = 0; i < g_n; i++)
        all += g_sb[i].nsteps;
    double *v[2];
    for (int h = 0; h < 2; h++)
        v[h] = dsec_calloc(all, sizeof(double));
    for (size_t i = 0; i < g_n; i++)
        for (size_t k = 0; k < g_sb[i].nsteps; k++) {
            const step *st = &g_sb[i].steps[k];
            if (st->kind == K_WRITE && !st->failed) {
                int h = st->bytes > (4u << 20);
                v[h][n[h]++] = st->wall_ms;
            }
        }
    char a[96], b[96];
    snprintf(a, sizeof a, "<= 4 MiB (%zu): p50 %.2f ms p99 %.2f ms", n[0],
             n[0] ? pct(v[0], n[0], 0.5) : 0, n[0] ? pct(v[0], n[0], 0.99) : 0);
    snprintf(b, sizeof b, "> 4 MiB, an upload (%zu): p50 %.2f ms p99 %.2f ms", n[1],
             n[1] ? pct(v[1], n[1], 0.5) : 0, n[1] ? pct(v[1], n[1], 0.99) : 0);
    printf("%-28s %-44s %-44s\n", "", a, b);
    dsec_free(v[0]);
    dsec_free(v[1]);
}

/* the sleep phase */
typedef struct sleep_arg {
    size_t i;
    double end_s;
    double start_s; /* dsec: the answer's time less the agent's own duration of the command */
    int rc;
} sleep_arg;
static char g_sleep_arg[16];

static void *sleep_dsec(void *p)
{
    sleep_arg *a = p;
    const char *argv[] = {"sleep", g_sleep_arg, NULL};
    dsec_exec_opts eo = {.argv = argv, .timeout_ms = 120000};
    dsec_exec_reply r;
    dsec_err err;
    pthread_barrier_wait(&g_barrier);
    a->rc = dsec_exec(g_cl, g_sb[a->i].id, &eo, &r, &err);
    a->end_s = dsec_bench_now_s() - g_go;
    if (a->rc < 0)
        note_fail(K_N, g_sb[a->i].id, err.msg);
    else if (r.exit_code != 0)
        note_fail(K_N, g_sb[a->i].id, "sleep exited non-zero"), a->rc = -1;
    if (a->rc == 0) {
        a->start_s = a->end_s - (double)r.duration_us / 1e6;
        dsec_exec_reply_release(&r);
    }
    return NULL;
}

static int host_run(const char *const argv[])
{
    extern char **environ;
    pid_t pid;
    if (posix_spawn(&pid, "/bin/busybox", NULL, NULL, (char *const *)argv, environ) != 0)
        return -1;
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void *sleep_host(void *p)
{
    sleep_arg *a = p;
    const char *argv[] = {"busybox", "sleep", g_sleep_arg, NULL};
    pthread_barrier_wait(&g_barrier);
    a->rc = host_run(argv);
    a->end_s = dsec_bench_now_s() - g_go;
    return NULL;
}

/* the rollout */
static void *rollout_dsec(void *p)
{
    sandbox *sb = p;
    pthread_barrier_wait(&g_barrier);
    for (size_t k = 0; k < sb->nsteps; k++) {
        step *st = &sb->steps[k];
        dsec_err err;
        double t0 = dsec_bench_now_s();
        switch (st->kind) {
        case K_SLEEP:
        case K_CPU: {
            const char *argv[8];
            char buf[32];
            step_argv(st, argv, buf);
            dsec_exec_opts eo = {.argv = argv, .timeout_ms = st->planned_ms + 120000};
            dsec_exec_reply r;
            if (dsec_exec(g_cl, sb->id, &eo, &r, &err) < 0) {
                st->failed = true;
                note_fail(st->kind, sb->id, err.msg);
                break;
            }
            st->own_ms = (float)((double)r.duration_us / 1000);
            /* busybox timeout execs the busy loop and ends it with SIGTERM: for a CPU-bound step
             * that (or exit code 143 or 124) is success */
            bool ended = st->kind == K_CPU &&
                         (r.signal == SIGTERM || r.exit_code == 143 || r.exit_code == 124);
            if (r.exit_code != 0 && !ended) {
                char m[96];
                snprintf(m, sizeof m, "exit code %d, signal %d", r.exit_code, r.signal);
                st->failed = true;
                note_fail(st->kind, sb->id, m);
            }
            dsec_exec_reply_release(&r);
            break;
        }
        case K_WRITE:
            if (dsec_file_write(g_cl, sb->id, "/work/data", g_bytes, st->bytes, 0644, &err) < 0) {
                st->failed = true;
                note_fail(st->kind, sb->id, err.msg);
            }
            break;
        case K_READ: {
            uint8_t *data = NULL;
            size_t len = 0;
            if (dsec_file_read(g_cl, sb->id, "/work/data", &data, &len, &err) < 0) {
                st->failed = true;
                note_fail(st->kind, sb->id, err.msg);
            } else {
                st->bytes = (uint32_t)len;
            }
            dsec_free(data);
            break;
        }
        case K_FORK: {
            char **kids = NULL;
            size_t nk = 0;
            if (dsec_fork(g_cl, sb->id, 1, &kids, &nk, &err) < 0 || nk != 1) {
                st->failed = true;
                note_fail(st->kind, sb->id, nk != 1 && kids ? "fork made no child" : err.msg);
                dsec_strv_free(kids, nk);
                break;
            }
            const char *argv[] = {"true", NULL};
            dsec_exec_opts eo = {.argv = argv};
            dsec_exec_reply r;
            if (dsec_exec(g_cl, kids[0], &eo, &r, &err) < 0) {
                st->failed = true;
                note_fail(st->kind, kids[0], err.msg);
            } else {
                dsec_exec_reply_release(&r);
            }
            if (dsec_destroy(g_cl, kids[0], &err) < 0) {
                st->failed = true;
                note_fail(st->kind, kids[0], err.msg);
            }
            dsec_strv_free(kids, nk);
            break;
        }
        }
        st->wall_ms = (float)((dsec_bench_now_s() - t0) * 1000);
        atomic_fetch_add(&g_steps_done, 1);
    }
    sb->end_s = dsec_bench_now_s() - g_go;
    return NULL;
}

static char g_hostdir[128];

static void *rollout_host(void *p)
{
    sandbox *sb = p;
    char path[256];
    snprintf(path, sizeof path, "%s/%zu", g_hostdir, (size_t)(sb - g_sb));
    uint8_t *rd = NULL;
    pthread_barrier_wait(&g_barrier);
    for (size_t k = 0; k < sb->nsteps; k++) {
        step *st = &sb->steps[k];
        double t0 = dsec_bench_now_s();
        if (st->kind == K_SLEEP || st->kind == K_CPU) {
            const char *cargv[8], *argv[9] = {"busybox"};
            char buf[32];
            step_argv(st, cargv, buf);
            for (int j = 0; j < 8 && (argv[j + 1] = cargv[j]) != NULL; j++)
                ;
            host_run(argv);
        } else if (st->kind == K_WRITE) {
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (fd >= 0) {
                for (size_t off = 0; off < st->bytes;) {
                    ssize_t w = write(fd, g_bytes + off, st->bytes - off);
                    if (w <= 0)
                        break;
                    off += (size_t)w;
                }
                close(fd);
            }
        } else if (st->kind == K_READ) {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            struct stat sst;
            if (fd >= 0 && fstat(fd, &sst) == 0) {
                rd = dsec_realloc(rd, (size_t)sst.st_size + 1);
                for (size_t off = 0; off < (size_t)sst.st_size;) {
                    ssize_t r = read(fd, rd + off, (size_t)sst.st_size - off);
                    if (r <= 0)
                        break;
                    off += (size_t)r;
                }
            }
            if (fd >= 0)
                close(fd);
        }
        /* a fork has no host equivalent worth timing: zero, as in the ideal */
        st->host_wall_ms = (float)((dsec_bench_now_s() - t0) * 1000);
    }
    dsec_free(rd);
    sb->host_end_s = dsec_bench_now_s() - g_go;
    return NULL;
}

static const char *pf(bool ok)
{
    return ok ? "PASS" : "FAIL";
}

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "bench rollout: needs root (containers, mounts, cgroups)\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    g_n = env_ul("ROLLOUT_SANDBOXES", 1000);
    uint32_t budget_ms = (uint32_t)(env_ul("ROLLOUT_BUDGET_S", 150) * 1000);
    uint32_t max_cmd_ms = (uint32_t)(env_ul("ROLLOUT_MAX_CMD_S", 120) * 1000);
    uint64_t seed = env_ul("ROLLOUT_SEED", 36);
    unsigned sleep_s = (unsigned)env_ul("ROLLOUT_SLEEP_S", 5);
    unsigned idle_s = (unsigned)env_ul("ROLLOUT_IDLE_S", 10);
    bool host_baseline = env_ul("ROLLOUT_HOST_BASELINE", 1) != 0;
    if (g_n == 0 || budget_ms == 0)
        die("ROLLOUT_SANDBOXES and ROLLOUT_BUDGET_S must be positive");
    snprintf(g_sleep_arg, sizeof g_sleep_arg, "%u", sleep_s);
    snprintf(g_node, sizeof g_node, "rollout-%d", (int)getpid());
    snprintf(g_cell, sizeof g_cell, "rollout%d", (int)getpid());

    char root[] = "/var/tmp/dsec-bench-rollout-XXXXXX";
    if (mkdtemp(root) == NULL)
        die("mkdtemp: %s", strerror(errno));
    snprintf(g_root, sizeof g_root, "%s", root);
    atexit(cleanup);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    signal(SIGPIPE, SIG_IGN);
    FILE *mi = fopen("/proc/self/mountinfo", "r");
    char line[1024];
    while (mi && fgets(line, sizeof line, mi))
        if (strstr(line, " /sys/fs/cgroup/unified ") && strstr(line, " - cgroup2 "))
            g_hybrid = true;
    if (mi)
        fclose(mi);

    /* the plans, before anything runs: the ideal is known up front */
    g_sb = dsec_calloc(g_n, sizeof *g_sb);
    size_t nsteps = 0, count[K_N] = {0};
    uint64_t bytes = 0;
    double cpu_demand_s = 0, ideal_s = 0;
    for (size_t i = 0; i < g_n; i++) {
        plan(&g_sb[i], seed, (unsigned)i, budget_ms, max_cmd_ms);
        double sum = 0;
        for (size_t k = 0; k < g_sb[i].nsteps; k++) {
            step *st = &g_sb[i].steps[k];
            count[st->kind]++;
            bytes += st->kind == K_WRITE ? st->bytes : 0;
            cpu_demand_s += st->kind == K_CPU ? st->planned_ms / 1000.0 : 0;
            sum += st->planned_ms / 1000.0;
        }
        if (sum > ideal_s)
            ideal_s = sum;
        nsteps += g_sb[i].nsteps;
    }
    atomic_store(&g_steps_total, nsteps);
    size_t ncmd = count[K_SLEEP] + count[K_CPU];
    double *cmd_ms = dsec_calloc(ncmd ? ncmd : 1, sizeof *cmd_ms);
    size_t c = 0, over60 = 0;
    for (size_t i = 0; i < g_n; i++)
        for (size_t k = 0; k < g_sb[i].nsteps; k++)
            if (g_sb[i].steps[k].kind <= K_CPU) {
                cmd_ms[c++] = g_sb[i].steps[k].planned_ms;
                over60 += g_sb[i].steps[k].planned_ms > 60000;
            }
    printf("rollout bench in %s: node %s, cell %s (cgroups: %s)\n", root, g_node, g_cell,
           g_hybrid ? "hybrid v1 + cgroup2" : "as the host has them");
    printf("plan (seed %" PRIu64
           "): %zu sandboxes, %zu steps: %zu sleep, %zu cpu-bound, %zu writes (%.1f MiB in all), "
           "%zu reads, %zu forks\n",
           seed, g_n, nsteps, count[K_SLEEP], count[K_CPU], count[K_WRITE], (double)bytes / 1048576,
           count[K_READ], count[K_FORK]);
    printf("  command durations: p50 %.2f s, p90 %.2f s, p99 %.2f s, max %.1f s, %zu over 60 s; "
           "CPU-bound demand %.0f "
           "CPU-s (%.2f cores over the ideal)\n",
           pct(cmd_ms, ncmd, 0.5) / 1000, pct(cmd_ms, ncmd, 0.9) / 1000,
           pct(cmd_ms, ncmd, 0.99) / 1000, pct(cmd_ms, ncmd, 1.0) / 1000, over60, cpu_demand_s,
           cpu_demand_s / ideal_s);
    printf("  ideal time = max over sandboxes of (sum of the planned durations of that sandbox's "
           "commands; file\n"
           "  transfers and forks count 0) = %.3f s (each sandbox's commands sum to "
           "ROLLOUT_BUDGET_S)\n",
           ideal_s);

    if (dsec_bench_sh(
            "%s/scripts/build-envs.sh --dsec %s --registry %s/layers --state-dir %s --only busybox "
            ">/dev/null",
            DSEC_SRC, DSEC_CLI, root, root) != 0)
        die("building busybox:1 failed");
    snprintf(g_hostdir, sizeof g_hostdir, "%s/host", root);
    mkdir(g_hostdir, 0755);

    /* the node's process, forked before this one has any thread */
    int p1[2], p2[2];
    if (pipe2(p1, O_CLOEXEC) < 0 || pipe2(p2, O_CLOEXEC) < 0)
        die("pipe: %s", strerror(errno));
    g_child = fork();
    if (g_child < 0)
        die("fork: %s", strerror(errno));
    if (g_child == 0) {
        close(p1[1]), close(p2[0]);
        g_root[0] = '\0'; /* cleanup is the bench's */
        _exit(child_main(p1[0], p2[1], root));
    }
    close(p1[0]), close(p2[1]);
    g_cmd = p1[1], g_resp = p2[0];
    g_resp_f = fdopen(g_resp, "r");
    char url[512] = "";
    unsigned hb_ms = 0;
    if (fgets(line, sizeof line, g_resp_f) == NULL ||
        sscanf(line, "URL %511s %u", url, &hb_ms) != 2)
        die("the node did not start: %s", line);

    dsec_err err;
    dsec_client_opts co = {.url = url, .timeout_ms = 600000, .threads = 4, .name = "bench-rollout"};
    if (dsec_client_connect(&g_cl, &co, &err) < 0)
        die("connecting: %s", err.msg);
    dsec_bus *hbus;
    dsec_actor *hact;
    dsec_bus_opts bo = {.url = url, .name = "bench-rollout-heartbeats", .threads = 1};
    char subj[256];
    snprintf(subj, sizeof subj, "dsec.v1.ctl.evt.%s.node.%s.heartbeat", g_cell, g_node);
    dsec_decoder *hdec = dsec_decoder_new(NULL);
    if (dsec_bus_connect(&hbus, &bo, &err) < 0 ||
        dsec_actor_new(&hact, hbus, "heartbeats", &err) < 0 ||
        dsec_actor_on(hact, subj, NULL, on_heartbeat, hdec, &err) < 0)
        die("subscribing to heartbeats: %s", err.msg);
    pthread_t mon;
    pthread_create(&mon, NULL, monitor, NULL);

    g_bytes = dsec_malloc(FILE_MAX);
    uint64_t r = seed;
    for (size_t i = 0; i < FILE_MAX / 8; i++)
        ((uint64_t *)g_bytes)[i] = rng_next(&r);

    /* 1. creates */
    double t0 = dsec_bench_now_s();
    g_deadline = t0 + 1800;
    run_all(32, create_worker, (char[32]){0}, 1);
    double create_s = dsec_bench_now_s() - t0;
    size_t created = 0;
    for (size_t i = 0; i < g_n; i++)
        created += g_sb[i].id[0] != '\0';
    printf("create                 %zu of %zu containers in %.1f s (%.1f ms each, 32 at a time)\n",
           created, g_n, create_s, create_s * 1000 / (double)g_n);
    if (created < g_n) {
        for (size_t i = 0; i < g_n; i++)
            if (g_sb[i].id[0] == '\0') {
                printf("FAIL: sandbox %zu was not created: %s\n", i, g_sb[i].err);
                break;
            }
        die("not every sandbox was created");
    }

    /* 2. idle baseline */
    phase_begin(PH_IDLE);
    sleep(idle_s);
    enum { TRUE_N = 200 };
    double tl[TRUE_N], hl[TRUE_N];
    for (int i = 0; i < TRUE_N; i++) {
        const char *argv[] = {"true", NULL};
        dsec_exec_opts eo = {.argv = argv};
        dsec_exec_reply rr;
        double a = dsec_bench_now_s();
        if (dsec_exec(g_cl, g_sb[i % g_n].id, &eo, &rr, &err) < 0)
            die("exec of true: %s", err.msg);
        tl[i] = (dsec_bench_now_s() - a) * 1000 - (double)rr.duration_us / 1000;
        dsec_exec_reply_release(&rr);
        const char *hargv[] = {"busybox", "true", NULL};
        a = dsec_bench_now_s();
        host_run(hargv);
        hl[i] = (dsec_bench_now_s() - a) * 1000;
    }
    double idle_true_over = pct(tl, TRUE_N, 0.5), idle_true_over99 = pct(tl, TRUE_N, 0.99);
    double host_spawn = pct(hl, TRUE_N, 0.5), host_spawn99 = pct(hl, TRUE_N, 0.99);

    /* 3. sleep phase */
    sleep_arg *sa = dsec_calloc(g_n, sizeof *sa);
    for (size_t i = 0; i < g_n; i++)
        sa[i].i = i;
    printf("sleep phase            starting: %zu x sleep %u\n", g_n, sleep_s);
    fflush(stdout); /* a profiler started on this line sees the phase */
    phase_begin(PH_SLEEP);
    g_deadline = dsec_bench_now_s() + sleep_s + 300;
    run_all(g_n, sleep_dsec, sa, sizeof *sa);
    double sleep_wall = 0;
    size_t sleep_ok = 0;
    for (size_t i = 0; i < g_n; i++) {
        sleep_ok += sa[i].rc == 0;
        if (sa[i].end_s > sleep_wall)
            sleep_wall = sa[i].end_s;
    }
    /* The answers' times less the agents' own durations (from an agent's receipt of the command
     * to its main process's exit): the time spent outside the agents, client to agent and back;
     * and when the answers came. */
    double *sb = dsec_calloc(g_n, sizeof *sb), *en = dsec_calloc(g_n, sizeof *en);
    size_t nst = 0;
    for (size_t i = 0; i < g_n; i++)
        if (sa[i].rc == 0) {
            sb[nst] = sa[i].start_s;
            en[nst++] = sa[i].end_s;
        }
    printf("sleep phase            outside the agents p50 %.2f s, p90 %.2f s, max %.2f s; "
           "answered p50 %.2f s, p90 %.2f s\n",
           pct(sb, nst, 0.5), pct(sb, nst, 0.9), pct(sb, nst, 1.0), pct(en, nst, 0.5),
           pct(en, nst, 0.9));
    dsec_free(sb);
    dsec_free(en);
    node_sample ns;
    node_query(&ns);
    uint64_t sleep_peak = ns.peak; /* the node's own counter: nothing ran before but 200 `true` */
    phase_begin(PH_HOST_SLEEP);
    g_deadline = dsec_bench_now_s() + sleep_s + 300;
    run_all(g_n, sleep_host, sa, sizeof *sa);
    double host_sleep_wall = 0;
    for (size_t i = 0; i < g_n; i++)
        if (sa[i].end_s > host_sleep_wall)
            host_sleep_wall = sa[i].end_s;
    dsec_free(sa);

    /* 4. rollout */
    printf("rollout                starting: %zu steps over %zu sandboxes, ideal %.0f s\n", nsteps,
           g_n, ideal_s);
    phase_begin(PH_ROLLOUT);
    g_deadline = dsec_bench_now_s() + 3 * ideal_s + 600;
    run_all(g_n, rollout_dsec, g_sb, sizeof *g_sb);
    double wall = 0;
    for (size_t i = 0; i < g_n; i++)
        if (g_sb[i].end_s > wall)
            wall = g_sb[i].end_s;
    node_query(&ns);
    uint64_t peak_all = ns.peak;

    /* 5. the same plans on the host */
    double host_wall = NAN;
    if (host_baseline) {
        printf("host baseline          running the same plans directly on the host\n");
        phase_begin(PH_HOST_ROLLOUT);
        g_deadline = dsec_bench_now_s() + 3 * ideal_s + 600;
        run_all(g_n, rollout_host, g_sb, sizeof *g_sb);
        host_wall = 0;
        for (size_t i = 0; i < g_n; i++)
            if (g_sb[i].host_end_s > host_wall)
                host_wall = g_sb[i].host_end_s;
    }
    phase_begin(PH_END);
    g_deadline = 0;

    /* figures */
    double *ov = dsec_calloc(nsteps, sizeof *ov), *ovp = dsec_calloc(nsteps, sizeof *ovp),
           *hov = dsec_calloc(nsteps, sizeof *hov);
    double *lat[K_N], *hlat[K_N];
    size_t nl[K_N] = {0}, nov = 0, nhov = 0, failed = 0;
    double own_max_s = 0;
    for (int k = 0; k < K_N; k++) {
        lat[k] = dsec_calloc(count[k] ? count[k] : 1, sizeof(double));
        hlat[k] = dsec_calloc(count[k] ? count[k] : 1, sizeof(double));
    }
    for (size_t i = 0; i < g_n; i++) {
        double own = 0;
        for (size_t k = 0; k < g_sb[i].nsteps; k++) {
            step *st = &g_sb[i].steps[k];
            if (st->failed) {
                failed++;
                continue;
            }
            hlat[st->kind][nl[st->kind]] = st->host_wall_ms;
            lat[st->kind][nl[st->kind]++] = st->wall_ms;
            if (st->kind <= K_CPU) {
                own += st->own_ms / 1000.0;
                ov[nov] = st->wall_ms - st->own_ms;
                ovp[nov++] = st->wall_ms - st->planned_ms;
                hov[nhov++] = st->host_wall_ms - st->planned_ms;
            }
        }
        if (own > own_max_s)
            own_max_s = own;
    }
    size_t slow = 0;
    for (size_t i = 1; i < g_n; i++)
        if (g_sb[i].end_s > g_sb[slow].end_s)
            slow = i;
    double slow_own = 0, slow_planned = 0, slow_files = 0;
    for (size_t k = 0; k < g_sb[slow].nsteps; k++) {
        step *st = &g_sb[slow].steps[k];
        slow_own += st->own_ms / 1000.0;
        slow_planned += st->planned_ms / 1000.0;
        slow_files += st->kind >= K_WRITE ? st->wall_ms / 1000.0 : 0;
    }
    double ov50 = pct(ov, nov, 0.5), ov99 = pct(ov, nov, 0.99), ovmax = pct(ov, nov, 1.0);
    double ovp50 = pct(ovp, nov, 0.5), ovp99 = pct(ovp, nov, 0.99);
    double hov50 = host_baseline ? pct(hov, nhov, 0.5) : NAN,
           hov99 = host_baseline ? pct(hov, nhov, 0.99) : NAN;

    double max_gap = 0, max_sgap = 0;
    for (int ph = PH_SLEEP; ph <= PH_ROLLOUT; ph += PH_ROLLOUT - PH_SLEEP) {
        if (g_ph[ph].hb_gap_ms > max_gap)
            max_gap = g_ph[ph].hb_gap_ms;
        if (g_ph[ph].hb_send_gap_ms > max_sgap)
            max_sgap = g_ph[ph].hb_send_gap_ms;
    }
    phase_stats *pr = &g_ph[PH_ROLLOUT], *pi = &g_ph[PH_IDLE], *ps = &g_ph[PH_SLEEP];
    double ro_s = pr->t1 - pr->t0, idle_len = pi->t1 - pi->t0;
    double node_cpu = pr->node_cpu1 - pr->node_cpu0, node_cpu_idle = pi->node_cpu1 - pi->node_cpu0;
    double host_busy =
        (double)(pr->host_busy1 - pr->host_busy0) /
        (double)(pr->host_total1 - pr->host_total0 ? pr->host_total1 - pr->host_total0 : 1);
    double self_ro = pr->self_cpu1 - pr->self_cpu0;
    phase_stats *ph_host = &g_ph[PH_HOST_ROLLOUT];
    double busy_idle =
        (double)(pi->host_busy1 - pi->host_busy0) /
        (double)(pi->host_total1 - pi->host_total0 ? pi->host_total1 - pi->host_total0 : 1);
    double busy_host = (double)(ph_host->host_busy1 - ph_host->host_busy0) /
                       (double)(ph_host->host_total1 - ph_host->host_total0
                                    ? ph_host->host_total1 - ph_host->host_total0
                                    : 1);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

    printf("\n%-28s %-44s %-44s %s\n", "figure", "dsec", "baseline (same run)", "target");
    printf("%-28s %-44s %-44s %s\n", "", "", "", "");
    char a[128], b[128];
    snprintf(a, sizeof a, "%.2f s (%zu of %zu ok)", sleep_wall, sleep_ok, g_n);
    snprintf(b, sizeof b, "%.2f s (%zu host processes)", host_sleep_wall, g_n);
    bool t_sleep = sleep_ok == g_n && sleep_wall <= sleep_s * 1.1;
    printf("%-28s %-44s %-44s <= %.1f s %s\n", "sleep phase wall", a, b, sleep_s * 1.1,
           pf(t_sleep));
    /* the machine is shared: the same target scaled by what the host itself took, for reading only
     */
    double scaled = sleep_s * 1.1 * host_sleep_wall / sleep_s;
    snprintf(a, sizeof a, "%.2f s over the host's", sleep_wall - host_sleep_wall);
    snprintf(b, sizeof b, "(scaled by the host: <= %.2f s %s)", scaled,
             pf(sleep_ok == g_n && sleep_wall <= scaled));
    printf("%-28s %-44s %-44s\n", "", a, b);
    snprintf(a, sizeof a, "%" PRIu64 " (sleep phase; sampled %" PRIu64 ")", sleep_peak,
             ps->inflight_max);
    snprintf(b, sizeof b, "%zu sandboxes", g_n);
    bool t_inflight = peak_all >= g_n;
    printf("%-28s %-44s %-44s >= %zu %s\n", "execs in flight, most", a, b, g_n, pf(t_inflight));
    snprintf(a, sizeof a, "%" PRIu64 " (sampled in the rollout)", pr->inflight_max);
    printf("%-28s %-44s %-44s\n", "", a, "");
    snprintf(a, sizeof a, "%.1f s = %.4f x ideal", wall, wall / ideal_s);
    if (host_baseline)
        snprintf(b, sizeof b, "host %.1f s = %.4f x ideal", host_wall, host_wall / ideal_s);
    else
        snprintf(b, sizeof b, "host run skipped");
    bool t_wall = failed == 0 && wall <= 1.1 * ideal_s;
    printf("%-28s %-44s %-44s <= 1.1 x %s\n", "rollout wall", a, b, pf(t_wall));
    snprintf(a, sizeof a, "ideal %.1f s; sum of agents' durations %.1f s", ideal_s, own_max_s);
    printf("%-28s %-44s\n", "", a);
    printf(
        "%-28s the last to finish, %s: %zu steps, planned %.1f s, its commands' own time %.1f s,\n"
        "%-28s its file transfers and forks %.1f s, the rest (exec overhead) %.1f s\n",
        "", g_sb[slow].id, g_sb[slow].nsteps, slow_planned, slow_own, "", slow_files,
        g_sb[slow].end_s - slow_own - slow_files);
    snprintf(a, sizeof a, "p50 %.2f ms p99 %.2f ms max %.0f ms", ov50, ov99, ovmax);
    snprintf(b, sizeof b, "idle: p50 %.2f ms p99 %.2f ms (exec of true)", idle_true_over,
             idle_true_over99);
    printf("%-28s %-44s %-44s\n", "overhead/command (-agent)", a, b);
    snprintf(a, sizeof a, "p50 %.2f ms p99 %.2f ms", ovp50, ovp99);
    snprintf(b, sizeof b, "host fork+exec: p50 %.2f ms p99 %.2f ms", hov50, hov99);
    printf("%-28s %-44s %-44s\n", "overhead/command (-planned)", a, b);
    snprintf(b, sizeof b, "host spawn of true: p50 %.2f ms p99 %.2f ms", host_spawn, host_spawn99);
    printf("%-28s %-44s %-44s\n", "", "", b);
    for (int k = K_WRITE; k <= K_FORK; k++) {
        char name[40];
        snprintf(name, sizeof name, "%s step (%zu)", kind_names[k], nl[k]);
        double m = pct(hlat[k], nl[k], 0.5), m99 = pct(hlat[k], nl[k], 0.99);
        snprintf(a, sizeof a, "p50 %.2f ms p99 %.2f ms", pct(lat[k], nl[k], 0.5),
                 pct(lat[k], nl[k], 0.99));
        if (k == K_FORK)
            snprintf(b, sizeof b, "(fork + exec of true + destroy of the child)");
        else
            snprintf(b, sizeof b, "host file: p50 %.2f ms p99 %.2f ms", m, m99);
        printf("%-28s %-44s %-44s\n", name, a, b);
        if (k == K_WRITE)
            write_sizes();
    }
    snprintf(a, sizeof a, "%.0f ms (node's clock %.0f ms)", max_gap, max_sgap);
    snprintf(b, sizeof b, "idle: %.0f ms (node's clock %.0f ms)", pi->hb_gap_ms,
             pi->hb_send_gap_ms);
    bool t_hb = max_gap > 0 && max_gap <= 2.0 * hb_ms;
    printf("%-28s %-44s %-44s <= %u ms %s\n", "heartbeat gap, longest", a, b, 2 * hb_ms, pf(t_hb));
    snprintf(a, sizeof a, "%" PRIu64 " received in the rollout, %" PRIu64 " lost", pr->hbs,
             g_hb_lost);
    printf("%-28s %-44s\n", "", a);
    uint64_t exp_load = ps->expired1 - ps->expired0 + pr->expired1 - pr->expired0;
    snprintf(a, sizeof a, "%" PRIu64 " times (sleep phase and rollout)", exp_load);
    snprintf(b, sizeof b, "idle: %" PRIu64 " times", pi->expired1 - pi->expired0);
    printf("%-28s %-44s %-44s 0 %s\n", "node taken out for silence", a, b, pf(exp_load == 0));
    snprintf(a, sizeof a, "%.1f CPU-s = %.1f%% of a core", node_cpu, 100 * node_cpu / ro_s);
    snprintf(b, sizeof b, "idle: %.1f%% of a core", 100 * node_cpu_idle / idle_len);
    printf("%-28s %-44s %-44s\n", "node process CPU, rollout", a, b);
    snprintf(a, sizeof a, "%.0f%% of %ld during the rollout", 100 * host_busy, ncpu);
    snprintf(b, sizeof b, "idle window %.0f%% (others' load); host run %.0f%%", 100 * busy_idle,
             100 * busy_host);
    printf("%-28s %-44s %-44s\n", "machine CPU busy", a, b);
    snprintf(a, sizeof a, "%.1f CPU-s (1 thread per sandbox)", self_ro);
    printf("%-28s %-44s\n", "bench client CPU, rollout", a);
    snprintf(a, sizeof a, "%" PRIu64 " queued at most (sampled)", pr->work_max);
    printf("%-28s %-44s\n", "node work queue", a);
    printf("failed steps: %zu (sleep %" PRIuFAST64 ", cpu %" PRIuFAST64 ", write %" PRIuFAST64
           ", read %" PRIuFAST64 ", fork %" PRIuFAST64 ", other %" PRIuFAST64 ")\n",
           failed, atomic_load(&g_fail[K_SLEEP]), atomic_load(&g_fail[K_CPU]),
           atomic_load(&g_fail[K_WRITE]), atomic_load(&g_fail[K_READ]),
           atomic_load(&g_fail[K_FORK]), atomic_load(&g_fail[K_N]));
    for (int k = 0; k <= K_N; k++)
        if (g_first_err[k][0] != '\0')
            printf("  first failure: %s\n", g_first_err[k]);

    /* destroy */
    atomic_store(&g_next_create, 0);
    t0 = dsec_bench_now_s();
    g_deadline = t0 + 1200;
    run_all(32, destroy_worker, (char[32]){0}, 1);
    printf("destroy                %zu containers in %.1f s\n", g_n, dsec_bench_now_s() - t0);
    g_deadline = 0;
    atomic_store(&g_stop_monitor, true);
    pthread_join(mon, NULL);
    dsec_actor_free(hact);
    dsec_bus_free(hbus);
    dsec_decoder_free(hdec);
    dsec_client_free(g_cl);
    cleanup();

    printf("targets: sleep phase %s, execs in flight %s, wall/ideal %s, heartbeat gap %s\n",
           pf(t_sleep), pf(t_inflight), pf(t_wall), pf(t_hb));
    printf("{\"scenario\":\"rollout\",\"sandboxes\":%zu,\"sleep_phase_s\":%.2f,\"max_inflight\":"
           "%" PRIu64 ",\"wall_over_ideal\":%.4f,\"overhead_p50_ms\":%.2f,\"overhead_p99_ms\":%.2f,"
           "\"max_heartbeat_gap_ms\":%.0f,"
           "\"heartbeat_interval_ms\":%u}\n",
           g_n, sleep_wall, peak_all, wall / ideal_s, ov50, ov99, max_gap, hb_ms);
    return 0;
}
