/* procs.c - make bench S=procs: 1,000 background processes streaming output at once, read live
 * through the whole stack, beside the same processes on the host. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "actors/cell.h"
#include "bench/common.h"
#include "dsec/alloc.h"
#include "dsec/client.h"

/*
 * Scenario (one node, this machine, one run):
 *  - SANDBOXES busybox:1 containers, each running PER background processes
 *    (1,000 in all, DSEC_BENCH_STREAMS), started through dsec_proc_start.
 *  - Every process writes LINES numbered lines of its own ("p0042 000123\n",
 *    13 bytes) in BURSTS bursts a second apart, so output keeps arriving for
 *    several seconds while all of them run.
 *  - One reader thread per sandbox follows each of its processes by offset
 *    (dsec_proc_read from where the last answer ended) until every process
 *    has exited and all its output is read; each byte is checked against what
 *    the process must have written. bytes_lost counts every byte missing or
 *    wrong (the rings are large enough to hold a whole stream: a loss is a
 *    bug, not an overflow).
 *  - The node's RSS (this process: the embedded cell's node manager, its bus
 *    and the client) is sampled during the run. The rings themselves live in
 *    the agents, inside each container's memory limit, not in the node.
 *  - Baseline, same run: the same 1,000 programs on the host, their stdout
 *    drained through pipes by one thread with poll(2): the wall time the
 *    machine needs for the processes themselves.
 */

#define SANDBOXES 10
#define LINES 2000
#define BURSTS 5
#define LINE_LEN 13 /* "p0042 000123\n" */

static char g_node[32]; /* this run's node: its cgroups and mounts are named after it */

static uint64_t rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    uint64_t v = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %" SCNu64, &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

/* The program each process runs (busybox awk in a sandbox, the host's awk for the baseline):
 * LINES lines "pNNNN LLLLLL\n" in BURSTS bursts, a pause of `pause` seconds between them. */
static void program(char *out, size_t n, unsigned k, const char *pause)
{
    snprintf(out, n,
             "BEGIN { for (i = 0; i < %d; i++) { printf \"p%%04d %%06d\\n\", %u, i; "
             "if (i %% %d == %d) { fflush(); system(\"sleep %s\") } } }",
             LINES, k, LINES / BURSTS, LINES / BURSTS - 1, pause);
}

/* What process k must have written at stream offset off (one byte). */
static char expected_at(unsigned k, uint64_t off)
{
    char line[LINE_LEN + 1];
    snprintf(line, sizeof line, "p%04u %06u\n", k, (unsigned)(off / LINE_LEN));
    return line[off % LINE_LEN];
}

typedef struct {
    dsec_client *cl;
    char id[DSEC_ID_MAX];
    unsigned first, n; /* process numbers first .. first + n - 1 */
    uint64_t handle[1024];
    uint64_t off[1024];
    bool done[1024];
    uint64_t bytes, lost, reads;
    double last_s;
    dsec_err err;
    bool failed;
} reader;

static _Atomic unsigned g_finished; /* readers that have returned */

static void *follow_all(void *p);

static void *follow(void *p)
{
    follow_all(p);
    g_finished++;
    return NULL;
}

static void *follow_all(void *p)
{
    reader *r = p;
    unsigned left = r->n;
    while (left > 0) {
        bool got = false;
        for (unsigned i = 0; i < r->n; i++) {
            if (r->done[i])
                continue;
            dsec_proc_out o;
            if (dsec_proc_read(r->cl, r->id, r->handle[i], r->off[i], 0, 0, &o, &r->err) < 0) {
                r->failed = true;
                return NULL;
            }
            r->reads++;
            unsigned k = r->first + i;
            if (o.out_from > r->off[i]) /* dropped before it was read */
                r->lost += o.out_from - r->off[i];
            for (size_t b = 0; b < o.out_len; b++)
                if (o.out[b] != expected_at(k, o.out_from + b))
                    r->lost++;
            r->bytes += o.out_len;
            r->off[i] = o.out_from + o.out_len;
            got |= o.out_len > 0;
            if (!o.info.running && r->off[i] >= o.info.out_total) {
                r->done[i] = true;
                left--;
                if (o.info.exit_code != 0 || o.info.out_total != (uint64_t)LINES * LINE_LEN) {
                    fprintf(stderr, "bench procs: process %u in %s: exit %d, %" PRIu64 " bytes\n",
                            k, r->id, o.info.exit_code, o.info.out_total);
                    r->lost += (uint64_t)LINES * LINE_LEN > o.info.out_total
                                   ? (uint64_t)LINES * LINE_LEN - o.info.out_total
                                   : 0;
                }
            }
            dsec_proc_out_free(&o);
        }
        r->last_s = dsec_bench_now_s();
        if (!got)
            usleep(50 * 1000);
    }
    return NULL;
}

/* The baseline: n programs on the host, stdout through pipes drained with poll(2). */
static double host_run(unsigned n, uint64_t *bytes)
{
    pid_t *pid = dsec_calloc(n, sizeof *pid);
    struct pollfd *pf = dsec_calloc(n, sizeof *pf);
    double t0 = dsec_bench_now_s();
    for (unsigned k = 0; k < n; k++) {
        int fd[2];
        if (pipe(fd) < 0)
            dsec_bench_die("pipe", NULL);
        char prog[512];
        program(prog, sizeof prog, k, "1");
        if ((pid[k] = fork()) == 0) {
            dup2(fd[1], 1);
            close(fd[0]);
            close(fd[1]);
            execlp("awk", "awk", prog, (char *)NULL);
            _exit(127);
        }
        close(fd[1]);
        pf[k] = (struct pollfd){.fd = fd[0], .events = POLLIN};
    }
    unsigned open = n;
    char buf[65536];
    *bytes = 0;
    while (open > 0) {
        if (poll(pf, n, -1) < 0 && errno != EINTR)
            dsec_bench_die("poll", NULL);
        for (unsigned k = 0; k < n; k++) {
            if (pf[k].fd < 0 || pf[k].revents == 0)
                continue;
            ssize_t r = read(pf[k].fd, buf, sizeof buf);
            if (r > 0) {
                *bytes += (uint64_t)r;
            } else if (r == 0 || errno != EINTR) {
                close(pf[k].fd);
                pf[k].fd = -1;
                open--;
            }
        }
    }
    for (unsigned k = 0; k < n; k++)
        waitpid(pid[k], NULL, 0);
    double wall = dsec_bench_now_s() - t0;
    dsec_free(pid);
    dsec_free(pf);
    return wall;
}

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "bench procs: needs root (containers, mounts, cgroups)\n");
        return 2;
    }
    const char *s_env = getenv("DSEC_BENCH_STREAMS");
    unsigned streams = s_env ? (unsigned)atoi(s_env) : 1000;
    if (streams < SANDBOXES || streams % SANDBOXES != 0 || streams / SANDBOXES > 1024) {
        fprintf(stderr, "bench procs: DSEC_BENCH_STREAMS must be a multiple of %d, at most %d\n",
                SANDBOXES, SANDBOXES * 1024);
        return 2;
    }
    unsigned per = streams / SANDBOXES;
    setvbuf(stdout, NULL, _IOLBF, 0);

    /* the baseline first, on a quiet machine */
    uint64_t host_bytes;
    double host_wall = host_run(streams, &host_bytes);
    printf("host: %u awk processes, %" PRIu64 " bytes drained through pipes in %.2f s\n", streams,
           host_bytes, host_wall);

    char root[] = "/var/tmp/dsec-bench-procs-XXXXXX";
    if (mkdtemp(root) == NULL)
        dsec_bench_die("mkdtemp", NULL);
    snprintf(g_node, sizeof g_node, "%s-%d", "procs", (int)getpid());
    dsec_bench_run("procs", root, g_node, NULL);
    if (dsec_bench_sh(
            "%s/scripts/build-envs.sh --dsec %s --registry %s/layers --state-dir %s --only busybox "
            ">/dev/null",
            DSEC_SRC, DSEC_CLI, root, root) != 0) {
        fprintf(stderr, "bench procs: building busybox:1 failed\n");
        dsec_bench_end();
        return 1;
    }
    dsec_cell_conf conf;
    dsec_cell_conf_defaults(&conf);
    conf.embedded_nats = true;
    conf.nats_port = 0;
    conf.sched_replicas = 1;
    snprintf(conf.state_dir, sizeof conf.state_dir, "%s/state", root);
    snprintf(conf.layers_path, sizeof conf.layers_path, "%s/layers", root);
    dsec_cell_node node = {.cpu_milli = 1000000, .memory_mb = 1u << 20, .slots = 64};
    snprintf(node.name, sizeof node.name, "%s", g_node);
    snprintf(node.backend, sizeof node.backend, "native");
    node.types[0] = dsec_strdup("container");
    node.opts[0] = (dsec_backend_kv){dsec_strdup("warm_pool"), dsec_strdup("0")};
    node.nopts = 1;
    conf.nodes = dsec_calloc(1, sizeof node);
    conf.nodes[0] = node;
    conf.nnodes = 1;
    dsec_err err;
    dsec_cell *g_cell;
    if (dsec_cell_start(&g_cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        dsec_bench_die("starting the cell", &err);
    dsec_bench_set_cell(g_cell);
    dsec_client *cl;
    dsec_client_opts co = {.url = dsec_cell_url(g_cell), .timeout_ms = 120000, .threads = 4};
    if (dsec_client_connect(&cl, &co, &err) < 0)
        dsec_bench_die("connecting", &err);

    static reader rd[SANDBOXES];
    for (int s = 0; s < SANDBOXES; s++) {
        /* room for PER processes and their rings: the agent is the container's init */
        dsec_create_spec cs = {.type = "container",
                               .env = "busybox:1",
                               .cpu_milli = 1000,
                               .memory_mb = 1024,
                               .ttl_s = 3600,
                               .idle_s = 3600};
        dsec_sandbox_info info;
        if (dsec_create(cl, &cs, &info, &err) < 0)
            dsec_bench_die("create", &err);
        rd[s] = (reader){.cl = cl, .first = (unsigned)s * per, .n = per};
        snprintf(rd[s].id, sizeof rd[s].id, "%s", info.id);
    }
    uint64_t rss0 = rss_kb();
    double t0 = dsec_bench_now_s();
    for (int s = 0; s < SANDBOXES; s++)
        for (unsigned i = 0; i < per; i++) {
            char prog[512];
            program(prog, sizeof prog, rd[s].first + i, "1");
            const char *argv[] = {"awk", prog, NULL};
            dsec_proc p;
            if (dsec_proc_start(cl, rd[s].id, &(dsec_proc_opts){.argv = argv}, &p, &err) < 0)
                dsec_bench_die("proc start", &err);
            rd[s].handle[i] = p.handle;
        }
    double started_s = dsec_bench_now_s() - t0;
    printf("dsec: %u background processes started in %.2f s (%.2f ms each)\n", streams, started_s,
           started_s * 1000 / streams);
    pthread_t th[SANDBOXES];
    for (int s = 0; s < SANDBOXES; s++)
        pthread_create(&th[s], NULL, follow, &rd[s]);
    uint64_t rss_peak = rss0;
    while (g_finished < SANDBOXES) {
        uint64_t r = rss_kb();
        rss_peak = r > rss_peak ? r : rss_peak;
        usleep(100 * 1000);
    }
    for (int s = 0; s < SANDBOXES; s++)
        pthread_join(th[s], NULL);
    double wall = dsec_bench_now_s() - t0;
    uint64_t bytes = 0, lost = 0, reads = 0;
    for (int s = 0; s < SANDBOXES; s++) {
        if (rd[s].failed)
            dsec_bench_die("reading output", &rd[s].err);
        bytes += rd[s].bytes;
        lost += rd[s].lost;
        reads += rd[s].reads;
    }
    uint64_t want = (uint64_t)streams * LINES * LINE_LEN;
    printf("dsec: %u streams, %" PRIu64 " of %" PRIu64 " bytes read live and checked, %" PRIu64
           " lost, in %.2f s (host %.2f s: %.2fx); %" PRIu64 " output reads (%.0f/s)\n",
           streams, bytes, want, lost, wall, host_wall, wall / host_wall, reads,
           (double)reads / wall);
    printf("node process RSS: %.1f MiB before the processes, %.1f MiB at most while they ran\n",
           rss0 / 1024.0, rss_peak / 1024.0);
    for (int s = 0; s < SANDBOXES; s++) {
        dsec_err e2;
        dsec_destroy(cl, rd[s].id, &e2);
    }
    dsec_client_free(cl);
    dsec_bench_end();
    dsec_cell_conf_release(&conf);
    printf("{\"scenario\":\"procs\",\"streams\":%u,\"bytes\":%" PRIu64
           ",\"bytes_expected\":%" PRIu64 ",\"bytes_lost\":%" PRIu64
           ",\"wall_s\":%.2f,\"host_wall_s\":%.2f,\"start_ms_each\":%.2f,"
           "\"reads_per_s\":%.0f,\"node_rss_mib_before\":%.1f,\"node_rss_mib_peak\":%.1f}\n",
           streams, bytes, want, lost + (want > bytes ? want - bytes : 0), wall, host_wall,
           started_s * 1000 / streams, (double)reads / wall, rss0 / 1024.0, rss_peak / 1024.0);
    return lost == 0 && bytes == want ? 0 : 1;
}
