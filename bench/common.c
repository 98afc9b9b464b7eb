/* common.c - the container benchmarks' clock, shell, percentiles and cleanup. */
#include "bench/common.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct {
    char name[32];
    char root[128];
    char node[64];
    char extra[512];
    dsec_cell *cell;
} run;

double dsec_bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int dsec_bench_sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

double dsec_bench_host_cpu_s(void)
{
    FILE *f = fopen("/proc/stat", "re");
    unsigned long long v[8] = {0};
    int n = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                       &v[4], &v[5], &v[6], &v[7])
              : 0;
    if (f)
        fclose(f);
    if (n < 8)
        return -1;
    /* user nice system idle iowait irq softirq steal: all but idle and iowait */
    unsigned long long busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    return (double)busy / (double)sysconf(_SC_CLK_TCK);
}

void dsec_bench_perf_phase(const char *name)
{
    const char *fifo = getenv("DSEC_BENCH_PERF_CTL"), *want = getenv("DSEC_BENCH_PERF_PHASE");
    if (fifo == NULL || *fifo == '\0' || want == NULL)
        return;
    FILE *f = fopen(fifo, "we");
    if (f == NULL)
        return;
    fprintf(f, "%s\n", strcmp(name, want) == 0 ? "enable" : "disable");
    fclose(f);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double dsec_bench_pct(double *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

void dsec_bench_end(void)
{
    dsec_cell *c = run.cell;
    run.cell = NULL;
    if (c != NULL)
        dsec_cell_stop(c, true);
    if (run.root[0] != '\0')
        dsec_bench_sh("umount -l %s/state/node-%s/container/upper 2>/dev/null; rm -rf %s%s%s",
                      run.root, run.node, run.root, run.extra[0] ? "; " : "", run.extra);
    run.root[0] = '\0';
}

void dsec_bench_die(const char *what, const dsec_err *err)
{
    fprintf(stderr, "bench %s: %s: %s\n", run.name, what, err ? err->msg : strerror(errno));
    dsec_bench_end();
    exit(1);
}

static void on_signal(int sig)
{
    (void)sig;
    fprintf(stderr, "bench %s: interrupted; cleaning up\n", run.name);
    dsec_bench_end();
    _exit(130);
}

void dsec_bench_run(const char *name, const char *root, const char *node, const char *extra)
{
    snprintf(run.name, sizeof run.name, "%s", name);
    snprintf(run.root, sizeof run.root, "%s", root);
    snprintf(run.node, sizeof run.node, "%s", node);
    snprintf(run.extra, sizeof run.extra, "%s", extra ? extra : "");
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
}

void dsec_bench_set_cell(dsec_cell *cell)
{
    run.cell = cell;
}
