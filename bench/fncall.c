/* fncall.c - make bench S=fncall: function calls (latency, calls/s, memory of warm workers) against
 * cold python3 and the raw fresh-namespace fork rate, measured in the same run. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/backend.h"
#include "backends/function/function.h"
#include "dsec/alloc.h"
#include "dsec/layers.h"

/*
 * Scenario (all on this machine, in this run):
 *  1. raw: the rate at which two processes (one per core) can fork a child
 *     into fresh mount, pid, ipc, uts and network namespaces and reap it -
 *     the floor cost of a fresh sandbox.
 *  2. cold: `python3 -c` running the same trivial function, started and
 *     reaped sequentially: its latency and peak RSS (bare, and with the
 *     modules the zygote preloads imported).
 *  3. the function backend with its default options but larger pools:
 *     - latency of the trivial call (python3 --call f -c 'def f(x): ...' 41)
 *       one at a time with 2 ms between calls (a lightly loaded node), and
 *       back to back;
 *     - the same latency in an environment of layers (busybox and this
 *       host's python3 standard library, built into a local registry here)
 *       against the host-base call's: what an environment adds;
 *     - calls per second with 4 threads calling back to back on both cores,
 *       beside the rate two python3 processes holding the same modules fork
 *       a child that exits at once (the ceiling of any call forked from
 *       CPython, whatever the sandbox costs);
 *     - PSS of 100 idle warm workers (zygote counted once: the supervisors
 *       share its memory; each call process's own PSS added).
 */

#define CALL_CODE "def f(x):\n    return x + 1\n"
#define COLD_CODE "def f(x):\n    return x + 1\nprint(f(41))"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* ---- 1. the raw fresh-namespace fork rate ------------------------------------------------ */

static long ns_fork_loop(double secs)
{
    const int flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET;
    long n = 0;
    double end = now_s() + secs;
    while (now_s() < end) {
        pid_t p = (pid_t)syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
        if (p == 0)
            _exit(0);
        if (p < 0)
            return -1;
        waitpid(p, NULL, 0);
        n++;
    }
    return n;
}

/* Two small processes (forked before the backend exists), one per core. */
static double raw_ns_forks_per_s(double secs, double *cpu_ms_per_fork, double *faults_per_fork)
{
    int fds[2][2];
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        if (pipe(fds[i]) < 0)
            return -1;
        pids[i] = fork();
        if (pids[i] == 0) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(i % (int)sysconf(_SC_NPROCESSORS_ONLN), &set);
            sched_setaffinity(0, sizeof set, &set);
            long n = ns_fork_loop(secs);
            ssize_t w = write(fds[i][1], &n, sizeof n);
            _exit(w == (ssize_t)sizeof n ? 0 : 1);
        }
        close(fds[i][1]);
    }
    long total = 0;
    struct rusage ru_before, ru_after;
    getrusage(RUSAGE_CHILDREN, &ru_before);
    for (int i = 0; i < 2; i++) {
        long n = 0;
        if (read(fds[i][0], &n, sizeof n) != (ssize_t)sizeof n || n < 0)
            return -1;
        total += n;
        close(fds[i][0]);
        waitpid(pids[i], NULL, 0);
    }
    getrusage(RUSAGE_CHILDREN, &ru_after);
    double cpu = (double)(ru_after.ru_utime.tv_sec - ru_before.ru_utime.tv_sec +
                          ru_after.ru_stime.tv_sec - ru_before.ru_stime.tv_sec) +
                 (double)(ru_after.ru_utime.tv_usec - ru_before.ru_utime.tv_usec +
                          ru_after.ru_stime.tv_usec - ru_before.ru_stime.tv_usec) /
                     1e6;
    *cpu_ms_per_fork = total ? cpu * 1000.0 / (double)total : 0;
    *faults_per_fork =
        total ? (double)(ru_after.ru_minflt - ru_before.ru_minflt) / (double)total : 0;
    return (double)total / secs;
}

/* ---- 2. cold python3 --------------------------------------------------------------------- */

/* Run argv to completion; wall seconds, peak RSS (KiB) of the child. */
static int run_cold(char *const *argv, double *secs, long *maxrss_kb)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", 1 /* O_WRONLY */, 0);
    pid_t pid;
    double t0 = now_s();
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, NULL);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -1;
    int st;
    struct rusage ru;
    if (wait4(pid, &st, 0, &ru) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return -1;
    *secs = now_s() - t0;
    *maxrss_kb = ru.ru_maxrss;
    return 0;
}

/* ---- 2b. the bare CPython fork rate ----------------------------------------------------- */

/* The rate at which two python3 processes (one per core), holding the
 * modules the zygote preloads with their GC frozen as the zygote has it,
 * can fork a child that runs one statement (os._exit) and reap it: no
 * namespaces, no sandbox, no call. Every call of the design is at
 * least one such fork of a CPython image, so this is the ceiling of calls/s
 * on this machine, measured beside the raw namespace fork. */
static double py_forks_per_s(double secs, const char *preloaded)
{
    char code[2048];
    int len = snprintf(code, sizeof code,
                       "import gc, os, sys, time\n"
                       "import %s\n"
                       "gc.freeze()\n"
                       "os.sched_setaffinity(0, {int(sys.argv[1]) %% os.cpu_count()})\n"
                       "n = 0\n"
                       "end = time.monotonic() + %.3f\n"
                       "while time.monotonic() < end:\n"
                       "    p = os.fork()\n"
                       "    if p == 0:\n"
                       "        os._exit(0)\n"
                       "    os.waitpid(p, 0)\n"
                       "    n += 1\n"
                       "print(n)\n",
                       preloaded, secs);
    if (len < 0 || (size_t)len >= sizeof code)
        return -1;
    int fds[2][2];
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        if (pipe2(fds[i], O_CLOEXEC) < 0)
            return -1;
        char cpu[8];
        snprintf(cpu, sizeof cpu, "%d", i);
        char *argv[] = {"/usr/bin/python3", "-I", "-c", code, cpu, NULL};
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, fds[i][1], 1);
        int rc = posix_spawn(&pids[i], argv[0], &fa, NULL, argv, NULL);
        posix_spawn_file_actions_destroy(&fa);
        close(fds[i][1]);
        if (rc != 0)
            return -1;
    }
    long total = 0;
    bool ok = true;
    for (int i = 0; i < 2; i++) {
        char buf[64] = {0};
        ssize_t r = read(fds[i][0], buf, sizeof buf - 1);
        close(fds[i][0]);
        int st;
        if (waitpid(pids[i], &st, 0) != pids[i] || !WIFEXITED(st) || WEXITSTATUS(st) != 0 || r <= 0)
            ok = false;
        else
            total += atol(buf);
    }
    return ok ? (double)total / secs : -1;
}

/* ---- 3. the backend ---------------------------------------------------------------------- */

static void *fn;
static atomic_long calls_done, call_failures;
static atomic_bool stop_calls;

static dsec_sandbox *mk_in(const char *id, const char *env)
{
    dsec_sandbox *h;
    char *st;
    dsec_err err;
    dsec_backend_kv rt = {"runtime", "python3"};
    dsec_sandbox_spec spec = {
        .id = id, .type = "function", .env = env, .memory_mb = 256, .labels = &rt, .nlabels = 1};
    if (dsec_function_ops.create(fn, &spec, &h, &st, &err) < 0) {
        fprintf(stderr, "bench_fncall: create: %s\n", err.msg);
        exit(1);
    }
    dsec_free(st);
    return h;
}

static dsec_sandbox *mk(const char *id)
{
    return mk_in(id, NULL);
}

/* Environment "benchpy:1" in a local registry under dir: busybox, and this
 * host's python3 standard library (minus its tests), as two DIR layers. */
static dsec_layer_registry *bench_env(const char *dir)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "set -e; d=%s; lib=$(/usr/bin/python3 -c 'import os; print(os.path.dirname("
             "os.__file__))'); mkdir -p $d/base/bin $d/py$lib; cp /bin/busybox $d/base/bin/; "
             "ln -s busybox $d/base/bin/sh; cd $lib && tar --exclude=./test --exclude=./idlelib "
             "--exclude=./tkinter -cf - . | tar -C $d/py$lib -xf -",
             dir);
    if (system(cmd) != 0)
        return NULL;
    dsec_layer_registry *reg = NULL;
    dsec_digest d[2];
    char *layers[2] = {d[0], d[1]};
    const char *names[2] = {"base", "py"};
    char path[512], blob[512];
    dsec_err err;
    snprintf(path, sizeof path, "%s/registry", dir);
    if (dsec_layer_registry_local(&reg, path, &err) < 0)
        goto fail;
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        snprintf(blob, sizeof blob, "%s/%s.blob", dir, names[i]);
        if (dsec_layer_build(path, DSEC_LAYER_DIR, NULL, 0, blob, d[i], &err) < 0 ||
            dsec_layer_registry_put(reg, d[i], DSEC_LAYER_DIR, blob, &err) < 0)
            goto fail;
    }
    dsec_env env = {.name = "benchpy:1", .layers = layers, .nlayers = 2};
    if (dsec_layer_registry_env_put(reg, &env, &err) < 0)
        goto fail;
    return reg;
fail:
    fprintf(stderr, "bench_fncall: the environment: %s\n", err.msg);
    dsec_layer_registry_free(reg);
    return NULL;
}

/* Page faults of every process of the backend's calls so far (workers being
 * made, supervisors, calls): the memory controller's count over this
 * process's dsec-fn-* cgroups (v1 total_pgfault, v2 pgfault), or -1 when
 * they cannot be read. */
static long long fn_cgroup_pgfaults(void)
{
    char own[PATH_MAX] = "", line[PATH_MAX + 64];
    bool v2 = false;
    FILE *f = fopen("/proc/self/cgroup", "re");
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (c2 == NULL)
            continue;
        *c2 = 0;
        if (strstr(c1 + 1, "memory") != NULL) {
            snprintf(own, sizeof own, "%s", c2 + 1);
            v2 = false;
            break;
        }
        if (c1[1] == 0) { /* 0::path, kept unless a v1 memory line comes */
            snprintf(own, sizeof own, "%s", c2 + 1);
            v2 = true;
        }
    }
    if (f)
        fclose(f);
    char mnt[2 * PATH_MAX + 16] = "";
    f = fopen("/proc/self/mountinfo", "re");
    while (f && fgets(line, sizeof line, f)) {
        char root[PATH_MAX], mp[PATH_MAX], fstype[64], opts[1024];
        char *sep = strstr(line, " - ");
        if (sep == NULL || sscanf(line, "%*s %*s %*s %4095s %4095s", root, mp) != 2 ||
            sscanf(sep + 3, "%63s %*s %1023s", fstype, opts) != 2)
            continue;
        bool want = v2 ? strcmp(fstype, "cgroup2") == 0
                       : strcmp(fstype, "cgroup") == 0 && strstr(opts, "memory") != NULL;
        if (want) {
            /* the cgroup path is relative to the mount's root */
            size_t rl = strcmp(root, "/") == 0 ? 0 : strlen(root);
            snprintf(mnt, sizeof mnt, "%s%s", mp, strncmp(own, root, rl) == 0 ? own + rl : own);
            break;
        }
    }
    if (f)
        fclose(f);
    if (mnt[0] == 0)
        return -1;
    /* v2: the node moves itself into <own>/dsec-node; its calls are siblings */
    size_t ml = strlen(mnt);
    if (ml > 10 && strcmp(mnt + ml - 10, "/dsec-node") == 0)
        mnt[ml - 10] = 0;
    DIR *d = opendir(mnt);
    long long sum = -1;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "dsec-fn-", 8) != 0)
            continue;
        char p[sizeof mnt + 300];
        snprintf(p, sizeof p, "%s/%s/memory.stat", mnt, e->d_name);
        FILE *s = fopen(p, "re");
        const char *key = v2 ? "pgfault " : "total_pgfault ";
        while (s && fgets(line, sizeof line, s))
            if (strncmp(line, key, strlen(key)) == 0)
                sum = (sum < 0 ? 0 : sum) + atoll(line + strlen(key));
        if (s)
            fclose(s);
    }
    if (d)
        closedir(d);
    return sum;
}

/* One trivial call; its wall time in seconds, or -1. */
static double call_once(dsec_sandbox *h, uint64_t *cpu_us)
{
    static const char *const argv[] = {"python3", "--call", "f", "-c", CALL_CODE, "41"};
    dsec_exec_req req = {.argv = argv, .argc = 6, .timeout_ms = 10000};
    dsec_exec_result r = {0};
    dsec_err err;
    double t0 = now_s();
    if (dsec_function_ops.exec(fn, h, &req, &r, &err) < 0) {
        fprintf(stderr, "bench_fncall: exec: %s\n", err.msg);
        return -1;
    }
    double d = now_s() - t0;
    bool good = r.exit_code == 0 && r.stdout_len == 3 && memcmp(r.stdout_data, "42\n", 3) == 0;
    if (cpu_us)
        *cpu_us = r.cpu_us;
    dsec_exec_result_release(&r);
    return good ? d : -1;
}

static void *caller(void *arg)
{
    dsec_sandbox *h = arg;
    while (!atomic_load(&stop_calls)) {
        if (call_once(h, NULL) < 0)
            atomic_fetch_add(&call_failures, 1);
        else
            atomic_fetch_add(&calls_done, 1);
    }
    return NULL;
}

static long smaps_field(pid_t pid, const char *field)
{
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/smaps_rollup", (int)pid);
    FILE *f = fopen(p, "re");
    long v = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0)
            v = atol(line + n);
    if (f)
        fclose(f);
    return v;
}

static long status_field(pid_t pid, const char *field)
{
    char p[64], line[256];
    snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
    FILE *f = fopen(p, "re");
    long v = -1;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0)
            v = atol(line + n);
    if (f)
        fclose(f);
    return v;
}

/* The children of each pid in parents (the call processes of supervisors). */
static size_t children_of(const pid_t *parents, size_t np, pid_t *out, size_t max)
{
    size_t n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL && n < max) {
        pid_t p = (pid_t)atoi(e->d_name);
        if (p <= 0)
            continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "re");
        if (f == NULL)
            continue;
        if (fgets(buf, sizeof buf, f) != NULL) {
            char *c = strrchr(buf, ')');
            int ppid;
            if (c && sscanf(c + 2, "%*c %d", &ppid) == 1)
                for (size_t i = 0; i < np; i++)
                    if (parents[i] == ppid)
                        out[n++] = p;
        }
        fclose(f);
    }
    if (d)
        closedir(d);
    return n;
}

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "bench_fncall: function sandboxes need root\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("fncall: function calls against their baselines, this machine, this run (%ld cores)\n\n",
           sysconf(_SC_NPROCESSORS_ONLN));

    /* 1. raw */
    double raw_cpu_ms, raw_faults;
    double raw = raw_ns_forks_per_s(3.0, &raw_cpu_ms, &raw_faults);
    if (raw < 0) {
        fprintf(stderr, "bench_fncall: the raw namespace fork loop failed\n");
        return 1;
    }

    /* 2. cold python3 */
    enum { COLD_N = 40 };
    double cold[COLD_N];
    long cold_rss = 0, cold_pre_rss = 0;
    char *cold_argv[] = {"/usr/bin/python3", "-c", COLD_CODE, NULL};
    for (int i = 0; i < COLD_N; i++)
        if (run_cold(cold_argv, &cold[i], &cold_rss) < 0) {
            fprintf(stderr, "bench_fncall: /usr/bin/python3 -c failed\n");
            return 1;
        }
    double cold_p50 = pct(cold, COLD_N, 0.5) * 1000.0;

    /* 3. the backend */
    char envdir[] = "/tmp/dsec-bench-fnenv-XXXXXX", cachedir[64];
    if (mkdtemp(envdir) == NULL) {
        perror("bench_fncall: mkdtemp");
        return 1;
    }
    snprintf(cachedir, sizeof cachedir, "%s/cache", envdir);
    dsec_layer_registry *reg = bench_env(envdir);
    if (reg == NULL)
        return 1;
    dsec_backend_kv opts[] = {{"pool_python3", "16"}, {"max_workers", "128"}, {"pool_sh", "0"},
                              {"pool_native", "0"},   {"env_warm", "16"},     {"env_hot", "2"}};
    dsec_backend_config cfg = {.node = "bench",
                               .opts = opts,
                               .nopts = sizeof opts / sizeof opts[0],
                               .layers = reg,
                               .layer_cache_dir = cachedir};
    dsec_err err;
    if (dsec_function_ops.init(&fn, &cfg, &err) < 0) {
        fprintf(stderr, "bench_fncall: %s\n", err.msg);
        return 1;
    }
    dsec_function_pool_info info;
    dsec_function_pool_info_get(fn, "python3", &info, &err);
    /* the same modules in a cold interpreter: the fair memory baseline */
    char pre_code[1024];
    dsec_sandbox *h0 = mk("bench-0");
    dsec_function_pool_info_get(fn, "python3", &info, &err);
    snprintf(pre_code, sizeof pre_code, "import %s\n" COLD_CODE, info.preloaded);
    char *pre_argv[] = {"/usr/bin/python3", "-I", "-c", pre_code, NULL};
    double pre_secs;
    if (run_cold(pre_argv, &pre_secs, &cold_pre_rss) < 0) {
        fprintf(stderr, "bench_fncall: python3 with the preloaded modules failed\n");
        return 1;
    }
    if (dsec_function_pool_warm(fn, "python3", 16, 2, 30000, &err) < 0) {
        fprintf(stderr, "bench_fncall: %s\n", err.msg);
        return 1;
    }
    for (int i = 0; i < 20; i++)
        call_once(h0, NULL);

    enum { LAT_N = 400 };
    static double paced[LAT_N], b2b[LAT_N];
    uint64_t cpu_sum = 0;
    for (int i = 0; i < LAT_N; i++) {
        struct timespec gap = {0, 2 * 1000000L};
        nanosleep(&gap, NULL);
        uint64_t cpu;
        if ((paced[i] = call_once(h0, &cpu)) < 0)
            return 1;
        cpu_sum += cpu;
    }
    for (int i = 0; i < LAT_N; i++)
        if ((b2b[i] = call_once(h0, NULL)) < 0)
            return 1;
    double p50 = pct(paced, LAT_N, 0.5) * 1000.0, p99 = pct(paced, LAT_N, 0.99) * 1000.0;
    double b50 = pct(b2b, LAT_N, 0.5) * 1000.0, b99 = pct(b2b, LAT_N, 0.99) * 1000.0;

    /* the same call in an environment, its pool as warm as the host's; the
     * host's again right after, so both see the same machine */
    dsec_sandbox *he = mk_in("bench-env", "benchpy:1");
    dsec_function_pool_info einfo;
    for (int i = 0; i < 200 && dsec_function_env_pools(fn, &einfo, 1) == 1 && einfo.warm < 16;
         i++) {
        struct timespec w = {0, 50 * 1000000L};
        nanosleep(&w, NULL);
    }
    for (int i = 0; i < 20; i++)
        call_once(he, NULL);
    static double env_paced[LAT_N], host_again[LAT_N];
    for (int i = 0; i < LAT_N; i++) {
        struct timespec gap = {0, 2 * 1000000L};
        nanosleep(&gap, NULL);
        if ((env_paced[i] = call_once(he, NULL)) < 0)
            return 1;
        nanosleep(&gap, NULL);
        if ((host_again[i] = call_once(h0, NULL)) < 0)
            return 1;
    }
    double e50 = pct(env_paced, LAT_N, 0.5) * 1000.0, e99 = pct(env_paced, LAT_N, 0.99) * 1000.0;
    double h50 = pct(host_again, LAT_N, 0.5) * 1000.0;
    dsec_function_ops.destroy(fn, he, &err);

    /* the CPython fork ceiling, while the pools stand full and idle */
    struct timespec quiet = {0, 500 * 1000000L};
    nanosleep(&quiet, NULL);
    double pyf = py_forks_per_s(3.0, info.preloaded);
    if (pyf < 0) {
        fprintf(stderr, "bench_fncall: the python3 fork loop failed\n");
        return 1;
    }

    /* throughput: 4 callers, both cores, 5 s */
    enum { THREADS = 4 };
    pthread_t th[THREADS];
    dsec_sandbox *hs[THREADS];
    for (int i = 0; i < THREADS; i++) {
        char id[32];
        snprintf(id, sizeof id, "bench-t%d", i);
        hs[i] = mk(id);
    }
    struct rusage ru0, ru1;
    getrusage(RUSAGE_SELF, &ru0);
    long long pf0 = fn_cgroup_pgfaults();
    double t0 = now_s();
    for (int i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, caller, hs[i]);
    struct timespec five = {5, 0};
    nanosleep(&five, NULL);
    atomic_store(&stop_calls, true);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    double took = now_s() - t0;
    getrusage(RUSAGE_SELF, &ru1);
    long long pf1 = fn_cgroup_pgfaults();
    double faults_per_call = pf0 >= 0 && pf1 >= pf0 && atomic_load(&calls_done) > 0
                                 ? (double)(pf1 - pf0) / (double)atomic_load(&calls_done)
                                 : -1;
    double cps = (double)atomic_load(&calls_done) / took;
    double backend_cpu = (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec + ru1.ru_stime.tv_sec -
                                  ru0.ru_stime.tv_sec) +
                         (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec +
                                  ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) /
                             1e6;

    /* memory: 100 idle warm workers (the default 2 of them hot) */
    if (dsec_function_pool_warm(fn, "python3", 100, 2, 60000, &err) < 0) {
        fprintf(stderr, "bench_fncall: %s\n", err.msg);
        return 1;
    }
    struct timespec settle = {1, 0};
    nanosleep(&settle, NULL);
    pid_t sup[128], procs[128];
    size_t nsup = dsec_function_pool_pids(fn, "python3", sup, 128);
    size_t nproc = children_of(sup, nsup, procs, 128);
    dsec_function_pool_info_get(fn, "python3", &info, &err);
    long zyg_pss = smaps_field(info.zygote_pid, "Pss:"),
         zyg_rss = smaps_field(info.zygote_pid, "Rss:");
    long w_pss = 0, w_priv = 0, pte = status_field(info.zygote_pid, "VmPTE:");
    for (size_t i = 0; i < nproc; i++) {
        w_pss += smaps_field(procs[i], "Pss:");
        w_priv += smaps_field(procs[i], "Private_Dirty:") + smaps_field(procs[i], "Private_Clean:");
        pte += status_field(procs[i], "VmPTE:");
    }
    double pss_mib = (double)(zyg_pss + w_pss) / 1024.0;

    printf("%-52s %12s %12s\n", "", "dsec", "baseline");
    printf("%-52s %12.3f %12.3f   (cold python3 -c, p50 of %d)\n",
           "trivial python call p50, ms (2 ms apart)", p50, cold_p50, COLD_N);
    printf("%-52s %12.3f\n", "trivial python call p99, ms (2 ms apart)", p99);
    printf("%-52s %12.3f\n", "trivial python call p50, ms (back to back)", b50);
    printf("%-52s %12.3f\n", "trivial python call p99, ms (back to back)", b99);
    printf("%-52s %12.0f\n", "call CPU in its cgroup, us (mean)", (double)cpu_sum / LAT_N);
    printf("%-52s %12.3f %12.3f   (the same call on the host's base, interleaved)\n",
           "  in an environment of 2 layers: p50, ms", e50, h50);
    printf("%-52s %12.3f\n", "  in an environment of 2 layers: p99, ms", e99);
    printf("%-52s %12.0f %12.0f   (fork into fresh mnt,pid,ipc,uts,net + reap, 2 procs)\n",
           "calls per second, 4 callers on both cores", cps, raw);
    printf("%-52s %11.0f%%\n", "  calls/s as a share of the raw rate", 100.0 * cps / raw);
    printf(
        "%-52s %12s %12.0f   (python3 with the preloaded modules: fork, os._exit, reap; 2 procs)\n",
        "  ceiling of any call forked from CPython", "", pyf);
    printf("%-52s %11.0f%%\n", "  calls/s as a share of that ceiling", 100.0 * cps / pyf);
    printf("%-52s %11.0f%%\n", "  that ceiling as a share of the raw rate", 100.0 * pyf / raw);
    /* A call needs both: a CPython fork and a set of fresh namespaces. Even
     * with nothing else added, calls/s <= 1 / (1/pyf + 1/raw). */
    double bound = pyf * raw / (pyf + raw);
    printf(
        "%-52s %12.0f %11.0f%%   (1 / (1/ceiling + 1/raw): a CPython fork plus fresh namespaces, "
        "nothing else; share of the raw rate)\n",
        "  best calls/s any forked CPython sandbox could get", bound, 100.0 * bound / raw);
    printf("%-52s %12.2f\n", "  raw: CPU ms per namespace fork (its processes)", raw_cpu_ms);
    printf("%-52s %12.0f %12.0f   (raw: per namespace fork)\n",
           "  page faults per call, all its processes", faults_per_call, raw_faults);
    printf("%-52s %12.2f\n", "  backend process CPU per call, ms",
           backend_cpu * 1000.0 / (double)atomic_load(&calls_done));
    printf("%-52s %12ld\n", "  failed calls", (long)atomic_load(&call_failures));
    printf("%-52s %12.1f %12.1f   (cold python3 with the same modules: RSS)\n",
           "PSS of 100 idle warm workers, MiB", pss_mib, (double)cold_pre_rss / 1024.0);
    printf("%-52s %12.2fx\n", "  ratio", pss_mib / ((double)cold_pre_rss / 1024.0));
    printf("%-52s %12s %12.1f   (bare cold python3 -c: RSS)\n", "", "", (double)cold_rss / 1024.0);
    printf("%-52s %12zu\n", "  warm workers measured (call processes found)", nproc);
    printf("%-52s %12.1f\n", "  zygote RSS, MiB (shared with every worker)",
           (double)zyg_rss / 1024.0);
    printf("%-52s %12.1f\n", "  private memory per worker, KiB (mean)",
           nproc ? (double)w_priv / (double)nproc : 0);
    printf("%-52s %12.1f\n", "  page tables (kernel, not in PSS), MiB", (double)pte / 1024.0);
    printf("\n{\"scenario\":\"fncall\",\"call_p50_ms\":%.3f,\"call_p99_ms\":%.3f,\"cold_python_p50_"
           "ms\":%.3f,"
           "\"calls_per_s\":%.0f,\"raw_ns_forks_per_s\":%.0f,\"pss_100_workers_mib\":%.1f,"
           "\"cold_rss_mib\":%.1f,\"cold_bare_rss_mib\":%.1f,\"env_call_p50_ms\":%.3f,"
           "\"env_host_call_p50_ms\":%.3f,\"faults_per_call\":%.0f,\"raw_faults_per_fork\":%.0f,"
           "\"py_forks_per_s\":%.0f,\"bound_calls_per_s\":%.0f}\n",
           p50, p99, cold_p50, cps, raw, pss_mib, (double)cold_pre_rss / 1024.0,
           (double)cold_rss / 1024.0, e50, h50, faults_per_call, raw_faults, pyf, bound);

    dsec_err e2;
    dsec_function_ops.destroy(fn, h0, &e2);
    for (int i = 0; i < THREADS; i++)
        dsec_function_ops.destroy(fn, hs[i], &e2);
    dsec_function_ops.fini(fn);
    dsec_layer_registry_free(reg);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf '%s'", envdir);
    if (system(rm) != 0)
        fprintf(stderr, "bench_fncall: could not remove %s\n", envdir);
    return atomic_load(&call_failures) ? 1 : 0;
}
