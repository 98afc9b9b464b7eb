/* runtime.c - make bench S=runtime: what an agent scaffold drives: files in and out, shell-session
 * commands, terminal keystrokes, and many live output streams, each beside its baseline from the
 * same run. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "actors/cell.h"
#include "bench/common.h"
#include "bench/raw_nats.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/sha256.h"

/*
 * One node on this machine, busybox:1 containers, one run:
 *  1. Files: 1 GiB into a container (dsec_file_write_ex) and back out (dsec_file_read_pages),
 *     checked byte for byte; baseline: raw nats.c moving the same bytes in the same chunk size
 *     (4 MiB) to a responder that acknowledges each, with 1 and with 4 chunks in flight.
 *     Beside the rates, the host's core-seconds per GiB of each (every process, from
 *     /proc/stat) and SHA-256's rate on one core: on a host of few cores the end-to-end check's
 *     two hash passes are what keeps a transfer under the raw bus's rate.
 *  2. Shell session: N commands of each kind (`cd /tmp`, `echo $X`, `true`) run in one session
 *     (dsec_exec with .session); baseline: the same commands as plain execs (/bin/sh -c).
 *  3. Terminal: N keystrokes typed into `cat` on a pty, each timed from the write until a
 *     reader following the terminal (waiting reads, as dsec exec -it does) sees its echo;
 *     baseline: raw nats.c request round trips.
 *  4. 1,000 background processes streaming output at once: bench_procs (make bench S=procs)
 *     run as a child, its bytes lost and node RSS taken from its JSON line.
 * The last line is the JSON the issue names.
 */

#define XFER_BYTES (1ull << 30)
#define XFER_CHUNK (4u << 20)
#define N_CMDS 200
#define N_KEYS 300

static char g_node[32]; /* this run's node: its cgroups and mounts are named after it */

/* ---- 1. files ---------------------------------------------------------------------- */

struct down {
    const uint8_t *want;
    uint64_t at, bad;
};

static int check_page(void *ud, const uint8_t *data, size_t len, uint64_t size)
{
    struct down *d = ud;
    (void)size;
    if (d->at + len > XFER_BYTES || memcmp(data, d->want + d->at, len) != 0)
        d->bad++;
    d->at += len;
    return 0;
}

/* The host's core-seconds spent per GiB moved by a phase (every process: client, nats-server,
 * node, agent, kernel). */
struct cost {
    double up, down, raw4;
};

/* SHA-256 on one core here, MB/s: what each of an upload's two passes (client, node) costs. */
static double sha256_mb_s(const uint8_t *data, size_t len)
{
    dsec_sha256 h;
    uint8_t d[DSEC_SHA256_LEN];
    double t0 = dsec_bench_now_s();
    dsec_sha256_init(&h);
    for (size_t o = 0; o < len; o += XFER_CHUNK)
        dsec_sha256_update(&h, data + o, len - o < XFER_CHUNK ? len - o : XFER_CHUNK);
    dsec_sha256_final(&h, d);
    return (double)len / (1 << 20) / (dsec_bench_now_s() - t0);
}

static void files(dsec_client *cl, const char *id, double *up, double *down, struct cost *cost,
                  double *sha_mb_s)
{
    uint8_t *data = dsec_malloc(XFER_BYTES);
    if (data == NULL)
        dsec_bench_die("1 GiB buffer", NULL);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i < XFER_BYTES; i += 8) { /* not compressible, not all alike */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(data + i, &x, 8);
    }
    *sha_mb_s = sha256_mb_s(data, 256u << 20);
    dsec_err err;
    dsec_bench_perf_phase("upload");
    double t0 = dsec_bench_now_s(), c0 = dsec_bench_host_cpu_s();
    if (dsec_file_write_ex(cl, id, "/big.bin", data, XFER_BYTES, NULL, &err) < 0)
        dsec_bench_die("upload", &err);
    *up = (double)XFER_BYTES / (1 << 20) / (dsec_bench_now_s() - t0);
    cost->up = dsec_bench_host_cpu_s() - c0;
    dsec_bench_perf_phase("download");
    struct down d = {.want = data};
    t0 = dsec_bench_now_s();
    c0 = dsec_bench_host_cpu_s();
    if (dsec_file_read_pages(cl, id, "/big.bin", check_page, &d, &err) < 0)
        dsec_bench_die("download", &err);
    *down = (double)XFER_BYTES / (1 << 20) / (dsec_bench_now_s() - t0);
    cost->down = dsec_bench_host_cpu_s() - c0;
    dsec_bench_perf_phase("");
    if (d.at != XFER_BYTES || d.bad != 0) {
        fprintf(stderr, "bench runtime: download: %" PRIu64 " bytes, %" PRIu64 " bad pages\n", d.at,
                d.bad);
        exit(1);
    }
    dsec_free(data);
}

/* The disk's own rate inside the sandbox: dd of 1 GiB written (and synced) then read back
 * (from the page cache, mostly, as a download right after an upload reads), timed by the
 * command itself: what a transfer that ends on that disk cannot beat. */
static double dd_run(dsec_client *cl, const char *id, const char *line)
{
    const char *argv[] = {"/bin/sh", "-c", line, NULL};
    dsec_exec_reply r;
    dsec_err err;
    if (dsec_exec(cl, id, &(dsec_exec_opts){.argv = argv, .timeout_ms = 300000}, &r, &err) < 0)
        dsec_bench_die("dd in the sandbox", &err);
    if (r.exit_code != 0 || r.duration_us == 0) {
        fprintf(stderr, "bench runtime: '%s' in the sandbox: exit %d: %.*s\n", line, r.exit_code,
                (int)r.err_len, (const char *)r.err_out);
        exit(1);
    }
    double mb_s = 1024.0 / ((double)r.duration_us / 1e6); /* its run time, as the agent saw it */
    dsec_exec_reply_release(&r);
    return mb_s;
}

static void disk_rates(dsec_client *cl, const char *id, double *wr, double *rd)
{
    /* the transfers' file goes first: both would not fit the sandbox's disk quota */
    *wr = dd_run(
        cl, id,
        "rm -f /big.bin && dd if=/dev/zero of=/dd.bin bs=4M count=256 conv=fsync 2>/dev/null");
    *rd = dd_run(cl, id, "dd if=/dd.bin of=/dev/null bs=4M 2>/dev/null && rm /dd.bin");
}

/* ---- 2. shell session against exec ----------------------------------------------------- */

static double run_one(dsec_client *cl, const char *id, const char *line, uint64_t session)
{
    const char *sh_argv[] = {"/bin/sh", "-c", line, NULL};
    const char *s_argv[] = {line, NULL};
    dsec_exec_opts eo = {
        .argv = session ? s_argv : sh_argv, .session = session, .timeout_ms = 30000};
    dsec_exec_reply r;
    dsec_err err;
    double t0 = dsec_bench_now_s();
    if (dsec_exec(cl, id, &eo, &r, &err) < 0)
        dsec_bench_die(session ? "session command" : "exec", &err);
    double ms = (dsec_bench_now_s() - t0) * 1000;
    if (r.exit_code != 0) {
        fprintf(stderr, "bench runtime: '%s' exited %d\n", line, r.exit_code);
        exit(1);
    }
    dsec_exec_reply_release(&r);
    return ms;
}

/* ---- 3. terminal echo ----------------------------------------------------------------- */

struct tty {
    dsec_client *cl;
    const char *id;
    uint64_t handle;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t seen; /* bytes of output seen by the follower */
    bool stop, failed;
    dsec_err err;
};

static void *tty_follow(void *p)
{
    struct tty *t = p;
    uint64_t off = 0;
    for (;;) {
        pthread_mutex_lock(&t->mu);
        bool stop = t->stop;
        pthread_mutex_unlock(&t->mu);
        if (stop)
            return NULL;
        dsec_proc_out o;
        if (dsec_proc_read_wait(t->cl, t->id, t->handle, off, 0, 0, 1000, &o, &t->err) < 0) {
            pthread_mutex_lock(&t->mu);
            t->failed = true;
            pthread_cond_signal(&t->cv);
            pthread_mutex_unlock(&t->mu);
            return NULL;
        }
        off = o.out_from + o.out_len;
        dsec_proc_out_free(&o);
        pthread_mutex_lock(&t->mu);
        t->seen = off;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&t->mu);
    }
}

static double tty_echo(dsec_client *cl, const char *id, double *lat)
{
    const char *argv[] = {"cat", NULL};
    dsec_proc p;
    dsec_err err;
    if (dsec_proc_start(cl, id, &(dsec_proc_opts){.argv = argv, .pty = true}, &p, &err) < 0)
        dsec_bench_die("pty start", &err);
    struct tty t = {.cl = cl, .id = id, .handle = p.handle};
    pthread_mutex_init(&t.mu, NULL);
    pthread_cond_init(&t.cv, NULL);
    pthread_t th;
    pthread_create(&th, NULL, tty_follow, &t);
    usleep(200 * 1000); /* the follower is waiting */
    uint64_t want = 0;
    for (int i = 0; i < N_KEYS; i++) {
        char key = (char)('a' + i % 26);
        if (i % 60 == 59)
            key = '\r'; /* a line now and then: cat prints it back (echo + its output) */
        pthread_mutex_lock(&t.mu);
        uint64_t before = t.seen;
        pthread_mutex_unlock(&t.mu);
        double t0 = dsec_bench_now_s();
        if (dsec_proc_write(cl, id, p.handle, &key, 1, false, &err) < 0)
            dsec_bench_die("typing", &err);
        pthread_mutex_lock(&t.mu);
        while (t.seen <= before && !t.failed)
            pthread_cond_wait(&t.cv, &t.mu);
        want = t.seen;
        pthread_mutex_unlock(&t.mu);
        if (t.failed)
            dsec_bench_die("following the terminal", &t.err);
        lat[i] = (dsec_bench_now_s() - t0) * 1000;
        if (key == '\r')
            usleep(20 * 1000); /* the line cat writes back comes after the echo */
    }
    pthread_mutex_lock(&t.mu);
    t.stop = true;
    pthread_mutex_unlock(&t.mu);
    dsec_proc_signal(cl, id, p.handle, 9, &err);
    pthread_join(th, NULL);
    return (double)want;
}

/* ---- 4. 1,000 streams: bench_procs --------------------------------------------------- */

static int streams(unsigned *n, uint64_t *lost, double *rss)
{
    char path[4096];
    ssize_t k = readlink("/proc/self/exe", path, sizeof path - 32);
    if (k < 0)
        return -1;
    path[k] = '\0';
    char *slash = strrchr(path, '/');
    snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "bench_procs");
    FILE *f = popen(path, "r");
    if (f == NULL)
        return -1;
    char line[2048], last[2048] = "";
    while (fgets(line, sizeof line, f) != NULL) {
        fputs("  procs: ", stdout);
        fputs(line, stdout);
        snprintf(last, sizeof last, "%s", line);
    }
    int st = pclose(f);
    char *s = strstr(last, "\"streams\":"), *l = strstr(last, "\"bytes_lost\":"),
         *r = strstr(last, "\"node_rss_mib_peak\":");
    if (s == NULL || l == NULL || r == NULL)
        return -1;
    *n = (unsigned)strtoul(s + 10, NULL, 10);
    *lost = strtoull(l + 13, NULL, 10);
    *rss = strtod(r + 20, NULL);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "bench runtime: needs root (containers, mounts, cgroups)\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    char root[] = "/var/tmp/dsec-bench-runtime-XXXXXX";
    if (mkdtemp(root) == NULL)
        dsec_bench_die("mkdtemp", NULL);
    snprintf(g_node, sizeof g_node, "%s-%d", "rt", (int)getpid());
    dsec_bench_run("runtime", root, g_node, NULL);
    if (dsec_bench_sh(
            "%s/scripts/build-envs.sh --dsec %s --registry %s/layers --state-dir %s --only busybox "
            ">/dev/null",
            DSEC_SRC, DSEC_CLI, root, root) != 0) {
        fprintf(stderr, "bench runtime: building busybox:1 failed\n");
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
    dsec_cell_node node = {.cpu_milli = 64000, .memory_mb = 65536, .slots = 16};
    snprintf(node.name, sizeof node.name, "%s", g_node);
    snprintf(node.backend, sizeof node.backend, "native");
    node.types[0] = dsec_strdup("container");
    conf.nodes = dsec_calloc(1, sizeof node);
    conf.nodes[0] = node;
    conf.nnodes = 1;
    dsec_err err;
    dsec_cell *g_cell;
    if (dsec_cell_start(&g_cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        dsec_bench_die("starting the cell", &err);
    dsec_bench_set_cell(g_cell);
    const char *url = dsec_cell_url(g_cell);
    dsec_client *cl;
    dsec_client_opts co = {.url = url, .timeout_ms = 120000, .threads = 4};
    if (dsec_client_connect(&cl, &co, &err) < 0)
        dsec_bench_die("connecting", &err);
    dsec_create_spec cs = {.type = "container",
                           .env = "busybox:1",
                           .cpu_milli = 1000,
                           .memory_mb = 512,
                           .disk_mb = 2048,
                           .ttl_s = 3600,
                           .idle_s = 3600};
    dsec_sandbox_info sb;
    if (dsec_create(cl, &cs, &sb, &err) < 0)
        dsec_bench_die("create", &err);

    /* 1. files */
    double raw1 = dsec_bench_raw_transfer_mb_s(url, XFER_BYTES, XFER_CHUNK, 1);
    struct cost cost;
    double c0 = dsec_bench_host_cpu_s();
    double raw4 = dsec_bench_raw_transfer_mb_s(url, XFER_BYTES, XFER_CHUNK, 4);
    cost.raw4 = dsec_bench_host_cpu_s() - c0;
    double raw = raw1 > raw4 ? raw1 : raw4;
    double up, down, dd_w, dd_r, sha;
    files(cl, sb.id, &up, &down, &cost, &sha);
    disk_rates(cl, sb.id, &dd_w, &dd_r);
    printf("files: 1 GiB up %.0f MB/s, down %.0f MB/s; raw nats.c, 4 MiB chunks: %.0f MB/s "
           "(1 in flight), %.0f MB/s (4 in flight): up %.0f%%, down %.0f%% of the better "
           "(target >= 70%%) %s\n",
           up, down, raw1, raw4, 100 * up / raw, 100 * down / raw,
           up >= 0.7 * raw && down >= 0.7 * raw ? "PASS" : "FAIL");
    printf("  the sandbox's disk, dd of 1 GiB inside it: write+fsync %.0f MB/s, read back "
           "%.0f MB/s: up is %.0f%% of the disk's write rate\n",
           dd_w, dd_r, 100 * up / dd_w);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("  the host's CPU per GiB (%ld cores, every process): raw nats.c 4 in flight %.2f "
           "core-s, up %.2f, down %.2f; sha256 here %.0f MB/s on one core, so the two passes "
           "an end-to-end check takes (client, node) are %.2f core-s of it\n",
           cores, cost.raw4, cost.up, cost.down, sha, 2 * 1024.0 / sha);

    /* 2. session commands against execs */
    dsec_proc s;
    if (dsec_session_start(cl, sb.id, NULL, &s, &err) < 0)
        dsec_bench_die("session start", &err);
    run_one(cl, sb.id, "X=1; cd /", s.handle);
    static const char *const kinds[] = {"cd /tmp", "echo $X", "true"};
    static double sess[3 * N_CMDS], exe[3 * N_CMDS];
    for (int i = 0; i < N_CMDS; i++) /* interleaved: both see the same machine */
        for (int k = 0; k < 3; k++) {
            sess[k * N_CMDS + i] = run_one(cl, sb.id, kinds[k], s.handle);
            exe[k * N_CMDS + i] = run_one(cl, sb.id, kinds[k], 0);
        }
    for (int k = 0; k < 3; k++)
        printf("  '%s': session p50 %.2f ms, exec p50 %.2f ms\n", kinds[k],
               dsec_bench_pct(sess + k * N_CMDS, N_CMDS, 0.5),
               dsec_bench_pct(exe + k * N_CMDS, N_CMDS, 0.5));
    double sess_p50 = dsec_bench_pct(sess, 3 * N_CMDS, 0.5),
           sess_p95 = dsec_bench_pct(sess, 3 * N_CMDS, 0.95);
    double exec_p50 = dsec_bench_pct(exe, 3 * N_CMDS, 0.5),
           exec_p95 = dsec_bench_pct(exe, 3 * N_CMDS, 0.95);
    printf("session: %d commands, p50 %.2f ms p95 %.2f ms; exec of the same: p50 %.2f ms p95 "
           "%.2f ms (target: session p50 <= exec p50) %s\n",
           3 * N_CMDS, sess_p50, sess_p95, exec_p50, exec_p95,
           sess_p50 <= exec_p50 ? "PASS" : "FAIL");

    /* 3. terminal echo */
    static double keys[N_KEYS], rtt[N_KEYS];
    tty_echo(cl, sb.id, keys);
    if (dsec_bench_raw_rtt_ms(url, N_KEYS, rtt) < 0)
        dsec_bench_die("raw round trips", NULL);
    double echo_p50 = dsec_bench_pct(keys, N_KEYS, 0.5),
           echo_p95 = dsec_bench_pct(keys, N_KEYS, 0.95);
    double rtt_p50 = dsec_bench_pct(rtt, N_KEYS, 0.5);
    printf("pty: %d keystrokes, echo p50 %.2f ms p95 %.2f ms (raw nats.c round trip p50 %.3f "
           "ms; target p50 <= 2 ms) %s\n",
           N_KEYS, echo_p50, echo_p95, rtt_p50, echo_p50 <= 2.0 ? "PASS" : "FAIL");

    dsec_destroy(cl, sb.id, &err);
    dsec_client_free(cl);
    dsec_bench_end();
    dsec_cell_conf_release(&conf);

    /* 4. 1,000 streams (its own cell) */
    unsigned nstreams = 0;
    uint64_t lost = 0;
    double rss = 0;
    int prc = streams(&nstreams, &lost, &rss);
    if (prc < 0)
        fprintf(stderr, "bench runtime: bench_procs gave no result\n");
    printf(
        "{\"scenario\":\"runtime\",\"upload_mb_s\":%.0f,\"download_mb_s\":%.0f,\"raw_mb_s\":%.0f,"
        "\"raw_mb_s_1_in_flight\":%.0f,\"disk_write_mb_s\":%.0f,\"session_p50_ms\":%.2f,\"exec_p50_"
        "ms\":%.2f,"
        "\"pty_echo_p50_ms\":%.2f,\"raw_rtt_p50_ms\":%.3f,\"streams\":%u,\"bytes_lost\":%" PRIu64
        ",\"node_rss_mib\":%.1f,\"cpu_s_per_gib_raw\":%.2f,\"cpu_s_per_gib_up\":%.2f,"
        "\"cpu_s_per_gib_down\":%.2f,\"sha256_mb_s\":%.0f}\n",
        up, down, raw, raw1, dd_w, sess_p50, exec_p50, echo_p50, rtt_p50, nstreams, lost, rss,
        cost.raw4, cost.up, cost.down, sha);
    return prc == 0 ? 0 : 1;
}
