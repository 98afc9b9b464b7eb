/* results.c - make bench S=results: what keeping command answers on disk (so that they outlive
 * the node manager) costs a named exec, beside keeping them in memory only, in the same run. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "actors/cell.h"
#include "actors/node-results.h"
#include "bench/common.h"
#include "bus/bus.h"
#include "dsec/alloc.h"
#include "dsec/client.h"

/*
 * 1. The table alone: dsec_results_begin (the command's start, appended to the log) and
 *    dsec_results_put (its answer, appended) per command, each with its own req_id over 100
 *    sandboxes, at the default budget (64 MiB: large answers evict, and the log is rewritten
 *    on a thread of its own once it passes 3 * budget, while the timed calls go on), for
 *    answers of 0 B to 1 MiB; baseline: the same calls on a table in memory only. The
 *    slowest call is printed too: a rewrite must not hold the others up. Under DSEC_BENCH_DIR
 * (default build/bench/results-run): the disk a node's state dir would be on.
 * 2. End to end: execs through the client, bus and a sim node (time_scale 0: the command costs
 *    nothing, so what is left is dsec's path), each with a req_id as libdsec gives every exec,
 *    on a node that persists and on one that does not, alternated (ABAB) to share the noise.
 * The last line is JSON.
 */

#define N_TABLE 2000
#define N_TABLE_BIG 240 /* 240 MiB of answers appended: past the rewrite threshold (192 MiB) */
#define N_E2E 2000

static const char *g_dir;

static bool keep_all(const char *sbx, void *ud)
{
    (void)sbx, (void)ud;
    return true;
}

static double g_max_us; /* the slowest put of all: the one that rewrote the log */

static void table_run(bool persist, size_t out_len, size_t n, double *p50, double *p99)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/table-%d-%zu", g_dir, persist, out_len);
    dsec_results *r;
    dsec_err err;
    if (dsec_results_new(&r, 64ull << 20, 600000, persist ? dir : NULL, &err) < 0 ||
        dsec_results_load(r, keep_all, NULL, &err) < 0)
        dsec_bench_die("results table", &err);
    uint8_t *out = dsec_calloc(1, out_len ? out_len : 1);
    double *lat = dsec_malloc(n * sizeof *lat);
    static const uint8_t hash[32] = {7};
    for (size_t i = 0; i < n; i++) {
        char sbx[32], req[40];
        snprintf(sbx, sizeof sbx, "bench-%016zx", i % 100);
        snprintf(req, sizeof req, "req-%zu", i);
        dsec_msg_exec_result res = {.id = sbx, .stdout_data = {out, out_len}, .duration_us = 1000};
        double t0 = dsec_bench_now_s();
        dsec_results_begin(r, sbx, req, hash);
        dsec_results_put(r, sbx, req, hash, &res);
        lat[i] = (dsec_bench_now_s() - t0) * 1e6;
        if (persist && lat[i] > g_max_us)
            g_max_us = lat[i];
    }
    dsec_results_stats st;
    dsec_results_stats_get(r, &st);
    if (st.persist_errors != 0) {
        fprintf(stderr, "bench results: %" PRIu64 " answers not persisted in %s\n",
                st.persist_errors, dir);
        exit(1);
    }
    for (size_t i = 0; i < 100; i++) {
        char sbx[32];
        snprintf(sbx, sizeof sbx, "bench-%016zx", i);
        dsec_results_drop(r, sbx);
    }
    dsec_results_free(r);
    dsec_bench_sh("rm -rf %s", dir);
    *p50 = dsec_bench_pct(lat, n, 0.5);
    *p99 = dsec_bench_pct(lat, n, 0.99);
    dsec_free(lat);
    dsec_free(out);
}

static void e2e_run(const char *url, bool persist, const char *cmd, double *lat)
{
    dsec_cell_conf c;
    dsec_cell_conf_defaults(&c);
    snprintf(c.cell, sizeof c.cell, "rb%d", persist);
    snprintf(c.url, sizeof c.url, "%s", url);
    snprintf(c.state_dir, sizeof c.state_dir, "%s/cell-%d-%s", g_dir, persist, cmd);
    c.threads = 2;
    c.journal_sync_ms = -1;
    dsec_err err;
    static const char *const types[] = {"sim", NULL};
    dsec_cell *cell = NULL;
    if (dsec_cell_conf_add_sim_nodes(&c, c.cell, 1, 64000, 65536, 64, types, "0", &err) < 0)
        dsec_bench_die("cell conf", &err);
    c.nodes[0].results_volatile = !persist;
    if (dsec_cell_start(&cell, &c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        dsec_bench_die("cell", &err);
    dsec_cell_conf_release(&c);
    dsec_client *cl = NULL;
    dsec_client_opts co = {.url = url, .tenant = "bench", .timeout_ms = 10000};
    if (dsec_client_connect(&cl, &co, &err) < 0)
        dsec_bench_die("client", &err);
    dsec_sandbox_info sb;
    dsec_create_spec cs = {.type = "sim"};
    if (dsec_create(cl, &cs, &sb, &err) < 0)
        dsec_bench_die("create", &err);
    static uint8_t file[64 << 10];
    memset(file, 'x', sizeof file);
    if (dsec_file_write(cl, sb.id, "/f", file, sizeof file, 0644, &err) < 0)
        dsec_bench_die("file_write", &err);
    const char *echo[] = {"echo", "hi", NULL}, *cat[] = {"cat", "/f", NULL};
    dsec_exec_opts eo = {.argv = strcmp(cmd, "cat") == 0 ? cat : echo};
    for (int i = -100; i < N_E2E; i++) { /* 100 to warm up */
        dsec_exec_reply r;
        double t0 = dsec_bench_now_s();
        if (dsec_exec(cl, sb.id, &eo, &r, &err) < 0)
            dsec_bench_die("exec", &err);
        if (i >= 0)
            lat[i] = (dsec_bench_now_s() - t0) * 1e6;
        dsec_exec_reply_release(&r);
    }
    dsec_destroy(cl, sb.id, &err);
    dsec_client_free(cl);
    dsec_cell_stop(cell, true);
}

int main(void)
{
    const char *d = getenv("DSEC_BENCH_DIR");
    static char dir[512];
    snprintf(dir, sizeof dir, "%s", d && d[0] ? d : "build/bench/results-run");
    g_dir = dir;
    if (dsec_bench_sh("mkdir -p %s", g_dir) != 0) {
        fprintf(stderr, "bench results: cannot create %s\n", g_dir);
        return 1;
    }
    dsec_bench_run("results", g_dir, "none", NULL);
    printf("bench results: the kept answers' table, per named command (begin + put), in %s\n",
           g_dir);
    printf("%10s  %22s  %22s\n", "answer", "persisted p50/p99 us", "memory only p50/p99 us");
    static const size_t sizes[] = {0, 4096, 65536, 1 << 20};
    double tp[4][2], tm[4][2];
    for (int i = 0; i < 4; i++) {
        size_t n = sizes[i] >= (1u << 20) ? N_TABLE_BIG : N_TABLE;
        table_run(true, sizes[i], n, &tp[i][0], &tp[i][1]);
        table_run(false, sizes[i], n, &tm[i][0], &tm[i][1]);
        printf("%9zuB  %10.1f / %-9.1f  %10.1f / %-9.1f\n", sizes[i], tp[i][0], tp[i][1], tm[i][0],
               tm[i][1]);
    }

    printf("the slowest persisted call: %.1f ms (the 1 MiB answers pass 3 * budget of appends: "
           "the log is rewritten meanwhile, on its own thread)\n",
           g_max_us / 1000);

    char nd[600];
    snprintf(nd, sizeof nd, "%s/nats", g_dir);
    mkdir(nd, 0700);
    dsec_natsd *ns = NULL;
    dsec_natsd_opts no = {.state_dir = nd};
    dsec_err err;
    if (dsec_natsd_start(&ns, &no, &err) < 0)
        dsec_bench_die("nats-server", &err);
    static const char *const cmds[] = {"echo", "cat"};
    double e2e[2][2][2]; /* cmd, persist, p50/p99 */
    printf("bench results: exec round trips through a sim node (%d each, ABAB), us\n", 2 * N_E2E);
    for (int k = 0; k < 2; k++) {
        double *lat[2];
        for (int p = 0; p < 2; p++)
            lat[p] = dsec_malloc(2 * N_E2E * sizeof(double));
        for (int round = 0; round < 2; round++)
            for (int p = 1; p >= 0; p--)
                e2e_run(dsec_natsd_url(ns), p == 1, cmds[k], lat[p] + round * N_E2E);
        for (int p = 0; p < 2; p++) {
            e2e[k][p][0] = dsec_bench_pct(lat[p], 2 * N_E2E, 0.5);
            e2e[k][p][1] = dsec_bench_pct(lat[p], 2 * N_E2E, 0.99);
            dsec_free(lat[p]);
        }
        printf("%10s  persisted %8.1f / %-8.1f  memory only %8.1f / %-8.1f  (p50 / p99)\n",
               k ? "cat 64 KiB" : "echo hi", e2e[k][1][0], e2e[k][1][1], e2e[k][0][0],
               e2e[k][0][1]);
    }
    dsec_natsd_stop(ns);
    dsec_bench_end();
    printf("{\"scenario\":\"results\",\"table_us_p50\":{\"0\":%.1f,\"4096\":%.1f,\"65536\":%.1f,"
           "\"1048576\":%.1f},\"table_mem_us_p50\":{\"0\":%.1f,\"4096\":%.1f,\"65536\":%.1f,"
           "\"1048576\":%.1f},\"exec_echo_p50_us\":%.1f,\"exec_echo_mem_p50_us\":%.1f,"
           "\"exec_cat64k_p50_us\":%.1f,\"exec_cat64k_mem_p50_us\":%.1f,\"slowest_put_ms\":%.1f}\n",
           tp[0][0], tp[1][0], tp[2][0], tp[3][0], tm[0][0], tm[1][0], tm[2][0], tm[3][0],
           e2e[0][1][0], e2e[0][0][0], e2e[1][1][0], e2e[1][0][0], g_max_us / 1000);
    return 0;
}
