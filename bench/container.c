/* container.c - make bench S=container: container sandboxes through the whole stack (client -> NATS
 * -> node -> crun/agent) beside raw crun on an equivalent bundle, measured in the same run. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "actors/cell.h"
#include "bench/common.h"
#include "dsec/alloc.h"
#include "dsec/client.h"

/*
 * Scenario (one node, this machine, one run):
 *  1. create -> first exec ready: dsec_create of a busybox:1 container, then
 *     dsec_exec of `true`, sequentially (layers cached), against raw
 *     `crun run -d` of the same config.json with the agent replaced by sleep,
 *     on its own overlay of the same layers. The node runs with a warm pool
 *     of FORK_N containers (DSEC_BENCH_WARM_POOL), so creates take warm ones
 *     and the pool refills between them.
 *  2. exec round trip of `true`: client -> NATS -> node -> agent, against raw
 *     `crun exec` into the raw container.
 *  3. fork: a sandbox holding FORK_GIB GiB of files forks into FORK_N
 *     children; ms per child, disk (upper store) and memory added per child.
 *     The same fork of an empty sandbox shows the cost does not grow with data.
 *     Each fork starts with the pool full and every child takes a warm
 *     container; memory per child is read once the pool is full again, so it
 *     includes the containers started to replace those the fork took.
 *  4. density: idle containers created until DENSITY are live at once (or a
 *     create fails); memory per idle sandbox from MemAvailable.
 * crun runs the way the backend runs it: in a private mount namespace with
 * the hybrid cgroup2 mount detached, when the host has one.
 */

#define CREATE_N 30
#define EXEC_N 500
#define RAW_EXEC_N 30
#define FORK_N 100

static uint64_t mem_available_kb(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t v = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %" SCNu64, &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

static bool hybrid_cgroups(void)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    char line[1024];
    bool found = false;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, " /sys/fs/cgroup/unified ") && strstr(line, " - cgroup2 "))
            found = true;
    if (f)
        fclose(f);
    return found;
}

/* Run argv (crun) the way the backend does; wait; its exit status. */
static int run_crun(char *const argv[], bool hybrid)
{
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(null, 1);
        if (hybrid) {
            if (unshare(CLONE_NEWNS) < 0 || mount("", "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
                _exit(126);
            umount2("/sys/fs/cgroup/unified", MNT_DETACH);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The lower layers of a sandbox's root overlay, top first, as a lowerdir=
 * value. The backend attaches that overlay only in the container's own mount
 * namespace, so it is read from the mountinfo of a process of the container
 * (found through its cgroup); mountinfo shows the lowers as lowerdir=a:b or
 * as one lowerdir+=x per layer. */
static int lowerdirs_of(const char *sb_dir, const char *sb_id, char *out, size_t n)
{
    /* its cgroups are named by its runtime id: a warm container's (meta's rid) or its id */
    char id[256], mp0[2600], line0[512];
    snprintf(id, sizeof id, "%s", sb_id);
    snprintf(mp0, sizeof mp0, "%s/meta", sb_dir);
    FILE *mf = fopen(mp0, "r");
    while (mf != NULL && fgets(line0, sizeof line0, mf) != NULL)
        if (strncmp(line0, "rid ", 4) == 0) {
            line0[strcspn(line0, "\n")] = '\0';
            snprintf(id, sizeof id, "%.200s", line0 + 4);
        }
    if (mf != NULL)
        fclose(mf);
    char pat[2][600];
    snprintf(pat[0], sizeof pat[0], "/sys/fs/cgroup/pids/dsec-ct-*/%s/cgroup.procs", id);
    snprintf(pat[1], sizeof pat[1], "/sys/fs/cgroup/*dsec-ct-*/%s/cgroup.procs", id);
    long pid = -1;
    for (int k = 0; k < 2 && pid < 0; k++) {
        glob_t g;
        if (glob(pat[k], 0, NULL, &g) == 0 && g.gl_pathc > 0) {
            FILE *f = fopen(g.gl_pathv[0], "r");
            if (f == NULL || fscanf(f, "%ld", &pid) != 1)
                pid = -1;
            if (f)
                fclose(f);
        }
        globfree(&g);
    }
    if (pid < 0)
        return -1;
    char mi[64];
    snprintf(mi, sizeof mi, "/proc/%ld/mountinfo", pid);
    FILE *f = fopen(mi, "r");
    char *line = NULL;
    size_t cap = 0;
    int rc = -1;
    while (f && getline(&line, &cap, f) > 0) {
        char mp[4096];
        if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1 || strcmp(mp, "/") != 0 ||
            strstr(line, " - overlay ") == NULL)
            continue;
        size_t len = 0;
        out[0] = '\0';
        for (char *l = line; (l = strstr(l, "lowerdir")) != NULL;) {
            l += strlen("lowerdir");
            if (*l == '+')
                l++;
            if (*l++ != '=')
                continue;
            size_t k = strcspn(l, ", \n");
            if (len + k + 2 >= n)
                break;
            if (len > 0)
                out[len++] = ':';
            memcpy(out + len, l, k);
            len += k;
            out[len] = '\0';
            rc = 0;
        }
    }
    free(line);
    if (f)
        fclose(f);
    return rc;
}

typedef struct raw {
    char dir[256];
    char id[64];
    bool mounted, running;
} raw;

/* An equivalent raw bundle: the sandbox's config.json with sleep as the
 * process and a fresh overlay of the same lower layers as its root. */
static int raw_prepare(raw *r, const char *root, const char *sb_dir, const char *sb_id, int i)
{
    char lowers[8192];
    if (snprintf(r->dir, sizeof r->dir, "%s/raw-%d", root, i) >= (int)sizeof r->dir)
        return -1;
    snprintf(r->id, sizeof r->id, "dsec-bench-raw-%d-%d", (int)getpid(), i);
    if (lowerdirs_of(sb_dir, sb_id, lowers, sizeof lowers) < 0)
        return -1;
    if (dsec_bench_sh("mkdir -p %s/rootfs %s/upper %s/work", r->dir, r->dir, r->dir) != 0)
        return -1;
    char opts[17000], rootfs[4200];
    if (snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s/upper,workdir=%s/work", lowers, r->dir,
                 r->dir) >= (int)sizeof opts ||
        snprintf(rootfs, sizeof rootfs, "%s/rootfs", r->dir) >= (int)sizeof rootfs)
        return -1;
    if (mount("overlay", rootfs, "overlay", 0, opts) < 0)
        return -1;
    r->mounted = true;
    return dsec_bench_sh(
        "python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); "
        "c[\"root\"][\"path\"]=sys.argv[2]; c[\"process\"][\"args\"]=[\"/bin/sleep\",\"1000000\"]; "
        "c[\"linux\"][\"cgroupsPath\"]=\"dsec-bench/\"+sys.argv[3]; "
        "json.dump(c,open(sys.argv[4],\"w\"))' %s/config.json %s %s %s/config.json",
        sb_dir, rootfs, r->id, r->dir);
}

static void raw_cleanup(raw *r, bool hybrid)
{
    if (r->running) {
        char *del[] = {"crun", "delete", "-f", r->id, NULL};
        run_crun(del, hybrid);
    }
    if (r->mounted) {
        char rootfs[4200];
        if (snprintf(rootfs, sizeof rootfs, "%s/rootfs", r->dir) < (int)sizeof rootfs)
            umount2(rootfs, MNT_DETACH);
    }
    dsec_bench_sh("rm -rf %s", r->dir);
}

/* The floor of any exec here: vfork + execve + wait of the same static
 * busybox `true` on the host (process creation is slow under nested
 * virtualisation), ms per run. */
static double host_spawn_floor_ms(int n, double *samples)
{
    char *argv[] = {"/bin/busybox", "true", NULL};
    char *envp[] = {"PATH=/bin", NULL};
    for (int i = 0; i < n; i++) {
        double t0 = dsec_bench_now_s();
        pid_t pid = vfork();
        if (pid == 0) {
            execve(argv[0], argv, envp);
            _exit(127);
        }
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        samples[i] = (dsec_bench_now_s() - t0) * 1000;
    }
    return dsec_bench_pct(samples, (size_t)n, 0.5);
}

static void exec_true(dsec_client *cl, const char *id, double *lat, double *in_agent)
{
    const char *argv[] = {"/bin/true", NULL};
    dsec_exec_opts eo = {.argv = argv};
    dsec_exec_reply res;
    dsec_err err;
    double t0 = dsec_bench_now_s();
    if (dsec_exec(cl, id, &eo, &res, &err) < 0)
        dsec_bench_die("exec", &err);
    if (lat)
        *lat = dsec_bench_now_s() - t0;
    if (in_agent)
        *in_agent = (double)res.duration_us / 1e6;
    if (res.exit_code != 0) {
        fprintf(stderr, "bench container: /bin/true exited %d\n", res.exit_code);
        exit(1);
    }
    dsec_exec_reply_release(&res);
}

/* A whole core: a smaller CPU quota would throttle the back-to-back execs
 * measured in it (the density sandboxes below ask for a tenth). */
static void make(dsec_client *cl, dsec_sandbox_info *info)
{
    dsec_create_spec cs = {.type = "container",
                           .env = "busybox:1",
                           .cpu_milli = 1000,
                           .memory_mb = 64,
                           .ttl_s = 86400,
                           .idle_s = 86400};
    dsec_err err;
    if (dsec_create(cl, &cs, info, &err) < 0)
        dsec_bench_die("create", &err);
}

static void destroy(dsec_client *cl, const char *id)
{
    dsec_err err;
    if (dsec_destroy(cl, id, &err) < 0)
        dsec_bench_die("destroy", &err);
}

static uint64_t used_bytes(const char *path)
{
    sync();
    struct statvfs v;
    if (statvfs(path, &v) < 0)
        return 0;
    return (uint64_t)(v.f_blocks - v.f_bfree) * v.f_frsize;
}

/* The node's warm pool: wait until it holds at least n ready containers (each marks its
 * directory with "ready"), at most 120 s; returns the seconds waited. */
static char g_pool[1300];
static unsigned g_warm;      /* the node's option warm_pool */
static const char *g_refill; /* its option warm_refill, as given ("default" when not) */
static double g_refill_s;    /* after the last fork: how long the pool took to be full again,
                                counted from its children's first exec */
static double wait_pool(unsigned n)
{
    double t0 = dsec_bench_now_s();
    while (dsec_bench_now_s() - t0 < 120) {
        unsigned ready = 0;
        DIR *d = opendir(g_pool);
        struct dirent *e;
        while (d != NULL && (e = readdir(d)) != NULL) {
            char p[1600];
            snprintf(p, sizeof p, "%s/%s/ready", g_pool, e->d_name);
            ready += e->d_name[0] == 'w' && access(p, F_OK) == 0;
        }
        if (d != NULL)
            closedir(d);
        if (ready >= n)
            break;
        usleep(20000);
    }
    return dsec_bench_now_s() - t0;
}

/* Fork sb into n children; ms per child; *disk and *mem get bytes added per child, memory
 * counted once the warm pool has started as many containers again as the fork took. */
static double fork_children(dsec_client *cl, const char *id, unsigned n, const char *store,
                            double *disk, double *mem, char ***kids)
{
    dsec_err err;
    size_t nk = 0;
    uint64_t d0 = used_bytes(store), m0 = mem_available_kb();
    double t0 = dsec_bench_now_s();
    if (dsec_fork(cl, id, n, kids, &nk, &err) < 0)
        dsec_bench_die("fork", &err);
    double dt = dsec_bench_now_s() - t0;
    if (nk != n) {
        fprintf(stderr, "bench container: fork made %zu children, asked %u\n", nk, n);
        exit(1);
    }
    /* every child answers, so its container is really running */
    for (size_t i = 0; i < nk; i++)
        exec_true(cl, (*kids)[i], NULL, NULL);
    g_refill_s = wait_pool(g_warm);
    uint64_t d1 = used_bytes(store), m1 = mem_available_kb();
    *disk = d1 > d0 ? (double)(d1 - d0) / n : 0;
    *mem = m0 > m1 ? (double)(m0 - m1) * 1024 / n : 0;
    return dt * 1000 / n;
}

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "bench container: needs root (containers, mounts, cgroups)\n");
        return 2;
    }
    const char *dens_env = getenv("DSEC_BENCH_DENSITY");
    size_t density_target = dens_env ? strtoull(dens_env, NULL, 10) : 3200;
    const char *gib_env = getenv("DSEC_BENCH_FORK_GIB");
    unsigned fork_gib = gib_env ? (unsigned)atoi(gib_env) : 1;
    bool hybrid = hybrid_cgroups();
    setvbuf(stdout, NULL, _IOLBF, 0);

    char root[] = "/var/tmp/dsec-bench-ct-XXXXXX";
    if (mkdtemp(root) == NULL)
        dsec_bench_die("mkdtemp", NULL);
    dsec_bench_run("container", root, "ct-0",
                   "rmdir /sys/fs/cgroup/*/dsec-bench /sys/fs/cgroup/dsec-bench 2>/dev/null");
    printf("container bench in %s (cgroups: %s)\n", root,
           hybrid ? "hybrid v1 + cgroup2" : "as the host has them");
    if (dsec_bench_sh("%s/scripts/build-envs.sh --dsec %s --registry %s/layers --state-dir %s "
                      "--only busybox >/dev/null",
                      DSEC_SRC, DSEC_CLI, root, root) != 0) {
        fprintf(stderr, "bench container: building busybox:1 failed\n");
        return 1;
    }

    dsec_cell_conf conf;
    dsec_cell_conf_defaults(&conf);
    conf.embedded_nats = true;
    conf.nats_port = 0;
    conf.sched_replicas = 1;
    snprintf(conf.state_dir, sizeof conf.state_dir, "%s/state", root);
    snprintf(conf.layers_path, sizeof conf.layers_path, "%s/layers", root);
    dsec_cell_node node = {.cpu_milli = 1000000, .memory_mb = 1u << 22, .slots = 8192};
    snprintf(node.name, sizeof node.name, "ct-0");
    snprintf(node.backend, sizeof node.backend, "native");
    node.types[0] = dsec_strdup("container");
    /* warm containers for a whole fork: every child takes one */
    const char *warm_env = getenv("DSEC_BENCH_WARM_POOL");
    g_warm = warm_env ? (unsigned)atoi(warm_env) : FORK_N;
    char warm_opt[16];
    snprintf(warm_opt, sizeof warm_opt, "%u", g_warm);
    node.opts[0] = (dsec_backend_kv){dsec_strdup("warm_pool"), dsec_strdup(warm_opt)};
    node.nopts = 1;
    /* refill threads: the backend's default (online CPUs, at most 4) unless given */
    const char *refill_env = getenv("DSEC_BENCH_WARM_REFILL");
    if (refill_env != NULL && *refill_env) {
        node.opts[1] = (dsec_backend_kv){dsec_strdup("warm_refill"), dsec_strdup(refill_env)};
        node.nopts = 2;
    }
    g_refill = refill_env != NULL && *refill_env ? refill_env : "default";
    conf.nodes = dsec_calloc(1, sizeof node);
    conf.nodes[0] = node;
    conf.nnodes = 1;
    dsec_cell *cell;
    dsec_err err;
    if (dsec_cell_start(&cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        dsec_bench_die("starting the cell", &err);
    dsec_bench_set_cell(cell);
    dsec_client *cl;
    /* generous: filling the fork sandbox with a GiB is one long exec */
    dsec_client_opts co = {.url = dsec_cell_url(cell), .timeout_ms = 600000, .threads = 2};
    if (dsec_client_connect(&cl, &co, &err) < 0)
        dsec_bench_die("connecting", &err);
    char store[1200], sbroot[1200];
    snprintf(store, sizeof store, "%s/state/node-ct-0/container/upper", root);
    snprintf(g_pool, sizeof g_pool, "%s/state/node-ct-0/container/pool", root);
    snprintf(sbroot, sizeof sbroot, "%s/state/node-ct-0/container/sb", root);

    /* warm-up: the layers enter the node's cache */
    dsec_sandbox_info warm;
    make(cl, &warm);
    exec_true(cl, warm.id, NULL, NULL);

    /* 1. create -> first exec ready */
    double create_lat[CREATE_N], answered[CREATE_N], first_exec[CREATE_N];
    for (int i = 0; i < CREATE_N; i++) {
        dsec_sandbox_info info;
        double t0 = dsec_bench_now_s();
        make(cl, &info);
        answered[i] = dsec_bench_now_s() - t0;
        exec_true(cl, info.id, &first_exec[i], NULL);
        create_lat[i] = dsec_bench_now_s() - t0;
        destroy(cl, info.id);
    }
    double create_p50 = dsec_bench_pct(create_lat, CREATE_N, 0.5) * 1000,
           create_p99 = dsec_bench_pct(create_lat, CREATE_N, 0.99) * 1000;

    char sbdir[2400];
    snprintf(sbdir, sizeof sbdir, "%s/%s", sbroot, warm.id);
    double raw_lat[CREATE_N];
    raw raws[CREATE_N];
    memset(raws, 0, sizeof raws);
    for (int i = 0; i < CREATE_N; i++) {
        if (raw_prepare(&raws[i], root, sbdir, warm.id, i) != 0) {
            fprintf(stderr, "bench container: preparing the raw bundle from %s failed\n", sbdir);
            dsec_bench_die("raw bundle", NULL);
        }
        char *run[] = {"crun", "run", "-d", "--bundle", raws[i].dir, raws[i].id, NULL};
        double t0 = dsec_bench_now_s();
        int rc = run_crun(run, hybrid);
        raw_lat[i] = dsec_bench_now_s() - t0;
        if (rc != 0) {
            fprintf(stderr, "bench container: crun run -d exited %d\n", rc);
            dsec_bench_die("raw crun run", NULL);
        }
        raws[i].running = true;
    }
    double crun_run_p50 = dsec_bench_pct(raw_lat, CREATE_N, 0.5) * 1000,
           crun_run_p99 = dsec_bench_pct(raw_lat, CREATE_N, 0.99) * 1000;
    printf("create -> first exec ready   p50 %7.2f ms  p99 %7.2f ms   raw crun run -d  p50 %7.2f "
           "ms  p99 %7.2f ms  "
           "(%.2fx)\n",
           create_p50, create_p99, crun_run_p50, crun_run_p99, create_p50 / crun_run_p50);
    printf("  of which: create answered p50 %.2f ms, then the first exec p50 %.2f ms\n",
           dsec_bench_pct(answered, CREATE_N, 0.5) * 1000,
           dsec_bench_pct(first_exec, CREATE_N, 0.5) * 1000);

    /* 2. exec round trip */
    double *ex = dsec_calloc(EXEC_N, sizeof *ex), *exa = dsec_calloc(EXEC_N, sizeof *exa);
    for (int i = 0; i < EXEC_N; i++)
        exec_true(cl, warm.id, &ex[i], &exa[i]);
    double exec_p50 = dsec_bench_pct(ex, EXEC_N, 0.5) * 1000,
           exec_p99 = dsec_bench_pct(ex, EXEC_N, 0.99) * 1000;
    double floor_samples[EXEC_N];
    double spawn_floor = host_spawn_floor_ms(EXEC_N, floor_samples);
    double rex[RAW_EXEC_N];
    for (int i = 0; i < RAW_EXEC_N; i++) {
        char *e[] = {"crun", "exec", raws[0].id, "/bin/true", NULL};
        double t0 = dsec_bench_now_s();
        int rc = run_crun(e, hybrid);
        rex[i] = dsec_bench_now_s() - t0;
        if (rc != 0) {
            fprintf(stderr, "bench container: crun exec exited %d\n", rc);
            dsec_bench_die("raw crun exec", NULL);
        }
    }
    double crun_exec_p50 = dsec_bench_pct(rex, RAW_EXEC_N, 0.5) * 1000,
           crun_exec_p99 = dsec_bench_pct(rex, RAW_EXEC_N, 0.99) * 1000;
    printf("exec of true, round trip      p50 %7.3f ms  p99 %7.3f ms   raw crun exec    p50 %7.2f "
           "ms  p99 %7.2f ms\n",
           exec_p50, exec_p99, crun_exec_p50, crun_exec_p99);
    printf("  floor: vfork+exec+wait of the same busybox true on the host, p50 %.3f ms\n",
           spawn_floor);
    printf("  of the round trip, in the agent (command start to exit): p50 %.3f ms\n",
           dsec_bench_pct(exa, EXEC_N, 0.5) * 1000);
    /* the same path without a process: read a small file through the agent */
    for (int i = 0; i < EXEC_N; i++) {
        uint8_t *data = NULL;
        size_t len = 0;
        double t0 = dsec_bench_now_s();
        if (dsec_file_read(cl, warm.id, "/etc/passwd", &data, &len, &err) < 0)
            dsec_bench_die("file read", &err);
        exa[i] = dsec_bench_now_s() - t0;
        dsec_free(data);
    }
    printf("  the same path without a process (read of /etc/passwd): p50 %.3f ms\n",
           dsec_bench_pct(exa, EXEC_N, 0.5) * 1000);
    dsec_free(exa);
    for (int i = 0; i < CREATE_N; i++)
        raw_cleanup(&raws[i], hybrid);

    /* 3. fork: empty, then holding fork_gib GiB */
    double disk_e, mem_e, disk_f, mem_f;
    char **kids = NULL;
    dsec_sandbox_info empty;
    make(cl, &empty);
    wait_pool(g_warm);
    double ms_empty = fork_children(cl, empty.id, FORK_N, store, &disk_e, &mem_e, &kids);
    for (int i = 0; i < FORK_N; i++) {
        destroy(cl, kids[i]);
        dsec_free(kids[i]);
    }
    dsec_free(kids);
    kids = NULL;
    dsec_sandbox_info full;
    make(cl, &full);
    char script[256];
    snprintf(script, sizeof script,
             "mkdir -p /data && i=0; while [ $i -lt %u ]; do head -c 67108864 /dev/zero > "
             "/data/f$i; i=$((i+1)); done",
             fork_gib * 16);
    const char *fill[] = {"/bin/sh", "-c", script, NULL};
    dsec_exec_opts fo = {.argv = fill, .timeout_ms = 600000};
    dsec_exec_reply fr;
    if (dsec_exec(cl, full.id, &fo, &fr, &err) < 0 || fr.exit_code != 0)
        dsec_bench_die("filling the sandbox", &err);
    dsec_exec_reply_release(&fr);
    wait_pool(g_warm);
    double ms_full = fork_children(cl, full.id, FORK_N, store, &disk_f, &mem_f, &kids);
    /* a child sees the data */
    const char *ls[] = {"/bin/sh", "-c", "du -sm /data | cut -f1", NULL};
    dsec_exec_opts lo = {.argv = ls};
    if (dsec_exec(cl, kids[0], &lo, &fr, &err) < 0)
        dsec_bench_die("reading the data in a child", &err);
    printf("fork into %d children         empty: %6.2f ms/child   holding %u GiB: %6.2f ms/child "
           "(child sees %.*s MiB)\n",
           FORK_N, ms_empty, fork_gib, ms_full, (int)(fr.out_len ? fr.out_len - 1 : 0),
           (char *)fr.out);
    printf("  added per child             disk %.1f KiB, memory %.1f KiB (MemAvailable, its warm "
           "container's "
           "replacement included)\n",
           disk_f / 1024, mem_f / 1024);
    printf(
        "  warm pool                   %u containers (option warm_pool), refill threads %s (option "
        "warm_refill): full again %.1f s after the children's first exec\n",
        g_warm, g_refill, g_refill_s);
    dsec_exec_reply_release(&fr);
    for (int i = 0; i < FORK_N; i++) {
        destroy(cl, kids[i]);
        dsec_free(kids[i]);
    }
    dsec_free(kids);
    destroy(cl, full.id);
    destroy(cl, empty.id);
    destroy(cl, warm.id);

    /* 4. density */
    wait_pool(g_warm);
    uint64_t m0 = mem_available_kb();
    char(*ids)[DSEC_ID_MAX] = dsec_calloc(density_target ? density_target : 1, DSEC_ID_MAX);
    size_t live = 0;
    double d0 = dsec_bench_now_s();
    dsec_err derr = {0};
    for (; live < density_target; live++) {
        /* idle on purpose, for longer than the default idle timeout may allow */
        dsec_create_spec cs = {.type = "container",
                               .env = "busybox:1",
                               .cpu_milli = 100,
                               .memory_mb = 16,
                               .ttl_s = 86400,
                               .idle_s = 86400};
        dsec_sandbox_info info;
        if (dsec_create(cl, &cs, &info, &derr) < 0)
            break;
        snprintf(ids[live], DSEC_ID_MAX, "%s", info.id);
        if (live % 500 == 499)
            printf("  density: %zu live (%.0f s)\n", live + 1, dsec_bench_now_s() - d0);
    }
    double dens_s = dsec_bench_now_s() - d0;
    wait_pool(g_warm); /* the pool as full as at m0 */
    sleep(2);
    uint64_t m1 = mem_available_kb();
    double mib_per_idle = live ? (double)(m0 > m1 ? m0 - m1 : 0) / 1024 / (double)live : 0;
    if (live > 0) {
        exec_true(cl, ids[0], NULL, NULL);
        exec_true(cl, ids[live - 1], NULL, NULL);
    }
    printf("density                       %zu idle containers live at once (target %zu) in %.0f s, "
           "%.2f MiB each%s%s\n",
           live, density_target, dens_s, mib_per_idle,
           live < density_target ? "; stopped by: " : "", live < density_target ? derr.msg : "");
    for (size_t i = 0; i < live; i++) {
        dsec_err e2;
        dsec_destroy(cl, ids[i], &e2);
    }
    dsec_free(ids);
    dsec_free(ex);
    dsec_client_free(cl);
    dsec_bench_end();
    dsec_cell_conf_release(&conf);

    printf("{\"scenario\":\"container\",\"create_p50_ms\":%.2f,\"create_p99_ms\":%.2f,\"crun_run_"
           "p50_ms\":%.2f,"
           "\"crun_run_p99_ms\":%.2f,\"exec_p50_ms\":%.3f,\"exec_p99_ms\":%.3f,\"crun_exec_p50_"
           "ms\":%.2f,"
           "\"crun_exec_p99_ms\":%.2f,\"host_spawn_p50_ms\":%.3f,\"fork_ms_per_child\":%.2f,\"fork_"
           "ms_per_child_empty\":%.2f,"
           "\"fork_disk_kib_per_child\":%.1f,\"fork_mem_kib_per_child\":%.1f,\"density\":%zu,"
           "\"mib_per_idle\":%.2f,\"warm_pool\":%u,\"warm_refill_after_fork_s\":%.1f}\n",
           create_p50, create_p99, crun_run_p50, crun_run_p99, exec_p50, exec_p99, crun_exec_p50,
           crun_exec_p99, spawn_floor, ms_full, ms_empty, disk_f / 1024, mem_f / 1024, live,
           mib_per_idle, g_warm, g_refill_s);
    return 0;
}
