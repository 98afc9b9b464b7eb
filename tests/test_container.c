/* test_container.c - the container backend for real: crun containers on a busybox layer built
 * here, exec and files through the agent, isolation, limits, fork, snapshot, pause, cleanup. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/backend.h"
#include "backends/loop.h"
#include "backends/container/container.h"
#include "backends/cgroup-tune.h"
#include "dsec/alloc.h"
#include "dsec/err.h"
#include "dsec/layers.h"
#include "tests/test_util.h"

/*
 * One backend instance serves the group, as one serves a node. The layer is
 * a busybox tree built into a local registry at set-up, so the test needs
 * nothing but busybox-static, crun and btrfs-progs on the host. The node is
 * "cttest<pid>": its cgroups live under dsec-ct-cttest<pid> in every hierarchy.
 */

/* The backend's node name, cttest<pid>: its cgroups (dsec-ct-<node>) are this run's alone, not
 * another test run's beside it. */
static char node_name[32];
#define NODE node_name
#define PIDS_MAX 96

/* The OCI runtime under test: built once per runtime (tests/container.cmake). */
#ifndef CT_RUNTIME
#define CT_RUNTIME "crun"
#endif

static void *ct;
static dsec_layer_registry *reg;
static char top[32];       /* the test's temp dir */
static char state_dir[64]; /* the backend's */
static int seq;

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Run a host shell line; its first line of output in out (may be NULL). */
static int host(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int host(char *out, size_t len, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return -1;
    char buf[4096];
    size_t got = fread(buf, 1, sizeof buf - 1, p);
    buf[got] = '\0';
    if (out != NULL)
        snprintf(out, len, "%s", buf);
    return pclose(p);
}

static const char *warm_pool; /* option warm_pool, or NULL for the default */

/* The group's backend with option runtime=runtime, and one more option k=v when k is set. */
static int open_backend_with(const char *runtime, const char *k, const char *v)
{
    char pids[16];
    snprintf(pids, sizeof pids, "%d", PIDS_MAX);
    dsec_backend_kv opts[7] = {
        {"runtime", runtime}, {"pids_max", pids},   {"upper_gb", "16"},
        {"function.x", "1"},  {"warm_refill", "3"}, /* more refill threads than cores: their
                                                       accounting must hold */
    };
    size_t n = 5;
    if (warm_pool != NULL)
        opts[n++] = (dsec_backend_kv){"warm_pool", warm_pool};
    if (k != NULL)
        opts[n++] = (dsec_backend_kv){k, v};
    dsec_backend_config cfg = {
        .state_dir = state_dir, .node = NODE, .opts = opts, .nopts = n, .layers = reg};
    dsec_err err;
    if (dsec_container_ops.init(&ct, &cfg, &err) < 0) {
        fprintf(stderr, "container backend: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int open_backend(void)
{
    return open_backend_with(CT_RUNTIME, NULL, NULL);
}

/* The busybox base layer and environment "busybox:1". */
static int build_base(void)
{
    if (host(NULL, 0,
             "set -e; t=%s/tree; mkdir -p $t/bin $t/etc $t/proc $t/sys $t/dev $t/tmp $t/root; "
             "cp /bin/busybox $t/bin/busybox; for a in $(/bin/busybox --list); do "
             "[ \"$a\" = busybox ] || ln -s busybox $t/bin/$a; done; "
             "printf 'root:x:0:0:root:/root:/bin/sh\\nnobody:x:65534:65534:nobody:/:/bin/false\\n'"
             " > $t/etc/passwd; printf 'root:x:0:\\nnogroup:x:65534:\\n' > $t/etc/group; "
             "chmod 1777 $t/tmp",
             top) != 0)
        return -1;
    char tree[128], blob[128];
    snprintf(tree, sizeof tree, "%s/tree", top);
    snprintf(blob, sizeof blob, "%s/base.blob", top);
    dsec_digest d;
    dsec_err err;
    char regdir[128];
    snprintf(regdir, sizeof regdir, "%s/registry", top);
    if (dsec_layer_registry_local(&reg, regdir, &err) < 0 ||
        dsec_layer_build(tree, DSEC_LAYER_DIR, NULL, 0, blob, d, &err) < 0 ||
        dsec_layer_registry_put(reg, d, DSEC_LAYER_DIR, blob, &err) < 0) {
        fprintf(stderr, "base layer: %s\n", err.msg);
        return -1;
    }
    char *layers[] = {d};
    dsec_layer_format fmts[] = {DSEC_LAYER_DIR};
    char *vars[] = {"HOME=/root", "DSEC_TEST=yes"};
    dsec_env env = {.name = "busybox:1",
                    .layers = layers,
                    .formats = fmts,
                    .nlayers = 1,
                    .vars = vars,
                    .nvars = 2,
                    .workdir = "/root",
                    .user = "root"};
    if (dsec_layer_registry_env_put(reg, &env, &err) < 0) {
        fprintf(stderr, "environment: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int group_setup(void **state)
{
    if (geteuid() != 0 || access("/bin/busybox", X_OK) != 0) {
        fprintf(stderr, "test_container: needs root and busybox-static; skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    snprintf(node_name, sizeof node_name, "cttest%d", (int)getpid());
    snprintf(top, sizeof top, "/tmp/dsec-cttest-XXXXXX");
    if (mkdtemp(top) == NULL)
        return -1;
    snprintf(state_dir, sizeof state_dir, "%s/state", top);
    if (build_base() < 0)
        return -1;
    return open_backend();
}

static int group_teardown(void **state)
{
    int rc = 0;
    if (ct != NULL) {
        dsec_container_ops.fini(ct);
        ct = NULL;
        /* closing the instance leaves no mount, cgroup or container */
        char out[4096];
        host(out, sizeof out, "grep -c ' %s' /proc/self/mountinfo", state_dir);
        if (atoi(out) != 0) {
            fprintf(stderr, "test_container: %s mounts outlived the backend\n", out);
            rc = -1;
        }
        if (host(NULL, 0, "ls -d /sys/fs/cgroup/*/dsec-ct-%s 2>/dev/null | grep -q .", NODE) == 0) {
            fprintf(stderr, "test_container: cgroups of the backend outlived it\n");
            rc = -1;
        }
    }
    dsec_layer_registry_free(reg);
    if (top[0] != '\0' && host(NULL, 0, "rm -rf '%s'", top) != 0)
        rc = -1;
    return rc;
}

static int need_root(void **state)
{
    if (ct == NULL)
        skip();
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------ */

struct sbx {
    dsec_sandbox *h;
    char *bstate;
    char id[64];
    char rid[96]; /* its runtime id and cgroup name: id, or the warm container's it took */
};

/* The runtime id the sandbox's record (meta) names; its id when none. */
static void set_rid(struct sbx *s)
{
    snprintf(s->rid, sizeof s->rid, "%s", s->id);
    char p[512], line[256];
    snprintf(p, sizeof p, "%s/meta", s->bstate);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    while (fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "rid ", 4) == 0) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(s->rid, sizeof s->rid, "%.90s", line + 4);
        }
    fclose(f);
}

static struct sbx *mk_spec(dsec_sandbox_spec *spec)
{
    struct sbx *s = calloc(1, sizeof *s);
    assert_non_null(s);
    snprintf(s->id, sizeof s->id, "cttest-%d-%d", (int)getpid(), __atomic_add_fetch(&seq, 1, 0));
    spec->id = s->id;
    spec->type = "container";
    dsec_err err;
    if (dsec_container_ops.create(ct, spec, &s->h, &s->bstate, &err) < 0)
        fail_msg("create %s: %s", s->id, err.msg);
    set_rid(s);
    return s;
}

static struct sbx *mk(uint64_t memory_mb, uint64_t cpu_milli)
{
    dsec_sandbox_spec spec = {.env = "busybox:1", .memory_mb = memory_mb, .cpu_milli = cpu_milli};
    return mk_spec(&spec);
}

/* Run a shell line; returns the exit code (or 128+signal), stdout in out. */
static int sh_full(struct sbx *s, const char *line, char *out, size_t len, dsec_exec_result *keep)
{
    const char *argv[] = {"/bin/sh", "-c", line};
    dsec_exec_req req = {.argv = argv, .argc = 3, .timeout_ms = 60000};
    dsec_exec_result res = {0};
    dsec_err err;
    if (dsec_container_ops.exec(ct, s->h, &req, &res, &err) < 0)
        fail_msg("exec \"%s\" in %s: %s", line, s->id, err.msg);
    if (out != NULL)
        snprintf(out, len, "%.*s", (int)res.stdout_len,
                 res.stdout_data ? (char *)res.stdout_data : "");
    int rc = res.signal ? 128 + res.signal : res.exit_code;
    if (keep != NULL)
        *keep = res;
    else
        dsec_exec_result_release(&res);
    return rc;
}

static int sh(struct sbx *s, const char *line, char *out, size_t len)
{
    return sh_full(s, line, out, len, NULL);
}

/* sh -c line as a background process of the sandbox (a foreground command's leftovers end
 * with it); its handle. */
static uint64_t sh_bg(void *be, dsec_sandbox *h, const char *line)
{
    const char *argv[] = {"/bin/sh", "-c", line, NULL};
    dsec_proc_start_req req = {.exec = {.argv = argv, .argc = 3}};
    dsec_proc_info p;
    dsec_err err;
    if (dsec_container_ops.proc_start(be, h, &req, &p, &err) < 0)
        fail_msg("proc start %s: %s", line, err.msg);
    return p.handle;
}

static void put_file(struct sbx *s, const char *path, const char *data)
{
    dsec_err err;
    if (dsec_container_ops.file_write(ct, s->h, path, data, strlen(data), 0644, false, &err) < 0)
        fail_msg("write %s: %s", path, err.msg);
}

/* Nothing of sandbox id (runtime id rid, or NULL: id) is left: mounts, cgroups, runtime
 * state, files, processes. */
static void assert_gone(const char *id, const char *rid, const int *pids, int npids)
{
    char out[4096];
    host(out, sizeof out, "grep -c '%s/sb/%s' /proc/self/mountinfo", state_dir, id);
    assert_int_equal(atoi(out), 0);
    for (int k = 0; k < 2; k++) {
        const char *name = k == 0 || rid == NULL ? id : rid;
        host(out, sizeof out, "ls -d /sys/fs/cgroup/*/dsec-ct-%s/%s 2>/dev/null | wc -l", NODE,
             name);
        assert_int_equal(atoi(out), 0);
        char rp[512];
        snprintf(rp, sizeof rp, "%s/run/%s", state_dir, name);
        assert_int_not_equal(access(rp, F_OK), 0);
        snprintf(rp, sizeof rp, "%s/pool/%s", state_dir, name);
        assert_int_not_equal(access(rp, F_OK), 0);
    }
    char p[512];
    snprintf(p, sizeof p, "%s/sb/%s", state_dir, id);
    assert_int_not_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/upper/sb/%s", state_dir, id);
    assert_int_not_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "%s/run/%s", state_dir, id);
    assert_int_not_equal(access(p, F_OK), 0);
    for (int i = 0; i < npids; i++) {
        snprintf(p, sizeof p, "/proc/%d/status", pids[i]);
        /* dead is enough: a zombie waits for the host's init to reap it */
        char st[4096];
        if (access(p, F_OK) == 0 && host(st, sizeof st, "grep -E 'State|Name' %s", p) == 0 &&
            strstr(st, "(zombie)") == NULL)
            fail_msg("process %d of %s outlived it: %s", pids[i], id, st);
    }
}

/* The host pids of a sandbox's processes (from its pids cgroup; id: its runtime id). */
static int sb_pids(const char *id, int *pids, int max)
{
    char p[256];
    snprintf(p, sizeof p, "/sys/fs/cgroup/pids/dsec-ct-%s/%s/cgroup.procs", NODE, id);
    FILE *f = fopen(p, "r");
    if (f == NULL) {
        snprintf(p, sizeof p, "/sys/fs/cgroup/dsec-ct-%s/%s/cgroup.procs", NODE, id);
        f = fopen(p, "r");
    }
    int n = 0;
    while (f != NULL && n < max && fscanf(f, "%d", &pids[n]) == 1)
        n++;
    if (f != NULL)
        fclose(f);
    return n;
}

static void drop(struct sbx *s)
{
    int pids[64];
    int n = sb_pids(s->rid, pids, 64);
    assert_true(n >= 1); /* at least the agent */
    dsec_err err;
    if (dsec_container_ops.destroy(ct, s->h, &err) < 0)
        fail_msg("destroy %s: %s", s->id, err.msg);
    assert_gone(s->id, s->rid, pids, n);
    dsec_free(s->bstate);
    free(s);
}

/* v1 path of a cgroup file of sandbox id for controller ctrl. */
static void cg_file(const char *ctrl, const char *id, const char *file, char *out, size_t len)
{
    snprintf(out, len, "/sys/fs/cgroup/%s/dsec-ct-%s/%s/%s", ctrl, NODE, id, file);
    if (access(out, F_OK) != 0)
        snprintf(out, len, "/sys/fs/cgroup/dsec-ct-%s/%s/%s", NODE, id, file);
}

/* Build the directory layer of top/<name> and put it in the registry; its digest in d. */
static void tree_layer(const char *name, dsec_digest d)
{
    char tree[128], blob[128];
    dsec_err err;
    snprintf(tree, sizeof tree, "%s/%s", top, name);
    snprintf(blob, sizeof blob, "%s/%s.blob", top, name);
    assert_int_equal(dsec_layer_build(tree, DSEC_LAYER_DIR, NULL, 0, blob, d, &err), 0);
    assert_int_equal(dsec_layer_registry_put(reg, d, DSEC_LAYER_DIR, blob, &err), 0);
}

static char *slurp(const char *path)
{
    static char buf[4096];
    FILE *f = fopen(path, "r");
    buf[0] = '\0';
    if (f != NULL) {
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf;
}

/* ---- tests --------------------------------------------------------------------------------- */

static void test_exec_and_files(void **state)
{
    uint64_t t0 = now_us();
    struct sbx *a = mk(256, 1000);
    uint64_t t1 = now_us();
    char out[4096];
    /* the runtime under test holds it, in the backend's state root (--root) */
    char rs[512];
    snprintf(rs, sizeof rs, "%s/run/%s/%s", state_dir, a->rid,
             strcmp(CT_RUNTIME, "runc") == 0 ? "state.json" : "status");
    if (access(rs, F_OK) != 0)
        fail_msg("%s has no state file %s", CT_RUNTIME, rs);
    dsec_exec_result r;
    assert_int_equal(sh_full(a, "echo hi; echo err >&2; exit 3", out, sizeof out, &r), 3);
    assert_string_equal(out, "hi\n");
    assert_int_equal(r.stderr_len, 4);
    assert_memory_equal(r.stderr_data, "err\n", 4);
    dsec_exec_result_release(&r);
    /* the environment's variables and working directory */
    assert_int_equal(sh(a, "echo $DSEC_TEST $HOME; pwd", out, sizeof out), 0);
    assert_string_equal(out, "yes /root\n/root\n");
    /* exec round trip through the agent */
    uint64_t t2 = now_us();
    for (int i = 0; i < 20; i++)
        assert_int_equal(sh(a, "true", NULL, 0), 0);
    uint64_t t3 = now_us();
    const char *argv[] = {"/bin/true"};
    dsec_exec_req req = {.argv = argv, .argc = 1};
    dsec_err err;
    uint64_t t4 = now_us();
    for (int i = 0; i < 20; i++) {
        dsec_exec_result res;
        assert_int_equal(dsec_container_ops.exec(ct, a->h, &req, &res, &err), 0);
        dsec_exec_result_release(&res);
    }
    uint64_t t5 = now_us();
    printf("container: create %.1f ms; exec round trip: sh -c true %.2f ms, /bin/true %.2f ms\n",
           (t1 - t0) / 1000.0, (t3 - t2) / 20000.0, (t5 - t4) / 20000.0);

    /* files */
    put_file(a, "/work/sub/x.txt", "data");
    assert_int_equal(sh(a, "cat /work/sub/x.txt", out, sizeof out), 0);
    assert_string_equal(out, "data");
    assert_int_equal(
        dsec_container_ops.file_write(ct, a->h, "/work/sub/x.txt", "+more", 5, 0644, true, &err),
        0);
    dsec_file_data fd;
    assert_int_equal(dsec_container_ops.file_read(ct, a->h, "/work/sub/x.txt", 0, 0, &fd, &err), 0);
    assert_int_equal(fd.len, 9);
    assert_memory_equal(fd.data, "data+more", 9);
    dsec_free(fd.data);
    dsec_file_entry *ents;
    size_t n;
    assert_int_equal(dsec_container_ops.file_list(ct, a->h, "/work/sub", &ents, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(ents[0].name, "x.txt");
    assert_int_equal(ents[0].kind, DSEC_FILE_REG);
    dsec_file_entries_free(ents, n);
    assert_int_equal(dsec_container_ops.file_read(ct, a->h, "/nope", 0, 0, &fd, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);

    /* isolation seen from inside */
    assert_int_equal(sh(a, "ls /sys/class/net", out, sizeof out), 0);
    assert_string_equal(out, "lo\n");
    assert_int_equal(sh(a, "head -c 64 /proc/kpagecgroup 2>/dev/null | wc -c", out, sizeof out), 0);
    assert_int_equal(atoi(out), 0);
    assert_int_equal(sh(a, "grep CapEff /proc/self/status", out, sizeof out), 0);
    unsigned long long capeff = strtoull(strchr(out, ':') + 1, NULL, 16);
    assert_true(capeff & (1ull << 0));   /* chown */
    assert_false(capeff & (1ull << 21)); /* sys_admin */
    assert_false(capeff & (1ull << 13)); /* net_raw */
    assert_false(capeff & (1ull << 27)); /* mknod */
    assert_false(capeff & (1ull << 19)); /* sys_ptrace */
    assert_int_equal(sh(a, "grep NoNewPrivs /proc/self/status", out, sizeof out), 0);
    assert_string_equal(out, "NoNewPrivs:\t1\n");
    assert_int_equal(sh(a, "grep Seccomp: /proc/self/status", out, sizeof out), 0);
    assert_string_equal(out, "Seccomp:\t2\n");
    /* the agent's channel: no socket among a command's fds, and none of
     * the agent's can be opened (or even listed) */
    assert_int_equal(sh(a, "ls -l /proc/self/fd/ | grep -c socket", out, sizeof out), 1);
    assert_int_equal(atoi(out), 0);
    assert_int_equal(sh(a,
                        "for f in /proc/1/fd/*; do case $(readlink $f 2>/dev/null) in socket:*) "
                        "cat $f </dev/null >/dev/null 2>&1 && echo OPENED;; esac; done; true",
                        out, sizeof out),
                     0);
    assert_string_equal(out, "");
    /* the agent is not dumpable: its fds cannot even be named */
    assert_int_not_equal(sh(a, "readlink /proc/1/fd/0 >/dev/null 2>&1", NULL, 0), 0);
    /* denied: mounting, new namespaces */
    assert_int_not_equal(sh(a, "mount -t tmpfs x /mnt 2>/dev/null", NULL, 0), 0);
    assert_int_not_equal(sh(a, "unshare -n true 2>/dev/null", NULL, 0), 0);
    char want[80];
    snprintf(want, sizeof want, "%s\n", a->id);
    assert_int_equal(sh(a, "hostname", out, sizeof out), 0);
    assert_string_equal(out, want);

    dsec_sandbox_stats st;
    assert_int_equal(dsec_container_ops.stats(ct, a->h, &st, &err), 0);
    assert_true(st.memory_bytes > 0);
    assert_true(st.cpu_used_us > 0);
    assert_true(st.disk_bytes >= 9);
    assert_true(st.nfiles >= 1);
    printf("container: idle sandbox memory (cgroup, minus inactive file) %.2f MiB, upper %" PRIu64
           " bytes in %" PRIu64 " files\n",
           st.memory_bytes / 1048576.0, st.disk_bytes, st.nfiles);
    drop(a);
}

/* The node's parent cgroup is there, at a quarter of the default CPU weight. */
static void assert_parent_weighed(void)
{
    char shares[128], weight[128], pin[160];
    snprintf(shares, sizeof shares, "/sys/fs/cgroup/cpu/dsec-ct-%s/cpu.shares", NODE);
    snprintf(weight, sizeof weight, "/sys/fs/cgroup/dsec-ct-%s/cpu.weight", NODE);
    snprintf(pin, sizeof pin, "/sys/fs/cgroup/freezer/dsec-ct-%s/dsec-freeze-pin/freezer.state",
             NODE);
    if (access(shares, F_OK) == 0)
        assert_int_equal(atoi(slurp(shares)), 256);
    else
        assert_int_equal(atoi(slurp(weight)), 25);
    /* on v1, an empty cgroup kept frozen beside the sandboxes, so that freezing and thawing
     * one does not patch kernel text (container-runtime.c) */
    if (access(shares, F_OK) == 0)
        assert_string_equal(slurp(pin), "FROZEN\n");
}

struct stopped {
    _Atomic bool ended;
    int rc;
    dsec_err err;
};

static void on_stopped(void *ud, int rc, dsec_err *err)
{
    struct stopped *b = ud;
    b->rc = rc;
    if (rc < 0)
        b->err = *err;
    atomic_store(&b->ended, true);
}

static void pool_counts(int *all, int *ready);

/* create_start of busybox:1 on loop: its rc (1: up at once, 0: it came up on the loop). */
static int mk_on_loop(dsec_loop *loop, struct sbx **made)
{
    struct sbx *s = calloc(1, sizeof *s);
    assert_non_null(s);
    snprintf(s->id, sizeof s->id, "cttest-%d-%d", (int)getpid(), __atomic_add_fetch(&seq, 1, 0));
    dsec_sandbox_spec spec = {.id = s->id, .type = "container", .env = "busybox:1"};
    struct stopped b = {0};
    dsec_err err;
    int rc =
        dsec_container_ops.create_start(ct, &spec, loop, on_stopped, &b, &s->h, &s->bstate, &err);
    if (rc < 0)
        fail_msg("create_start %s: %s", s->id, err.msg);
    for (int i = 0; rc == 0 && i < 3000 && !atomic_load(&b.ended); i++)
        usleep(10000);
    if (rc == 0 && !atomic_load(&b.ended))
        fail_msg("create_start %s: no answer in 30 s", s->id);
    if (rc == 0 && b.rc != 0)
        fail_msg("create_start %s: %s", s->id, b.err.msg);
    set_rid(s);
    char out[64];
    assert_int_equal(sh(s, "printf up", out, sizeof out), 0);
    assert_string_equal(out, "up");
    *made = s;
    return rc;
}

/* A destroy's wait for the sandbox's processes to end, on a loop (stop_start): 50 background
 * sleeps and the agent are killed, the wait ends when the cgroup is empty, and destroy then
 * leaves nothing. A paused (frozen) sandbox is thawed for it: a frozen process does not die. */
static void test_stop_on_loop(void **state)
{
    (void)state;
    dsec_err err;
    dsec_loop *loop = NULL;
    assert_int_equal(dsec_loop_new(&loop, "ct-stop", &err), 0);
    struct sbx *s[2] = {mk(0, 0), mk(0, 0)};
    sh_bg(ct, s[0]->h, "for i in $(seq 50); do sleep 1000 & done; wait");
    int pids[512], n = 0;
    for (int i = 0; i < 500 && (n = sb_pids(s[0]->rid, pids, 512)) < 52; i++)
        usleep(20000);
    assert_true(n >= 52); /* the agent, the shell, 50 sleeps */
    assert_int_equal(dsec_container_ops.pause(ct, s[1]->h, &err), 0);
    int pids1[64], n1 = sb_pids(s[1]->rid, pids1, 64);
    struct stopped b[2] = {0};
    for (int i = 0; i < 2; i++) {
        int rc = dsec_container_ops.stop_start(ct, s[i]->h, loop, on_stopped, &b[i], &err);
        if (rc < 0)
            fail_msg("stop_start %s: %s", s[i]->id, err.msg);
        if (rc == 1) /* nothing to wait for: every process had gone at the first look */
            atomic_store(&b[i].ended, true);
    }
    uint64_t t0 = dsec_loop_now_ns();
    for (int i = 0; i < 2; i++)
        while (!atomic_load(&b[i].ended) && dsec_loop_now_ns() - t0 < 60000000000ull)
            usleep(10000);
    for (int i = 0; i < 2; i++) {
        assert_true(atomic_load(&b[i].ended));
        if (b[i].rc != 0)
            fail_msg("stop of %s: %s", s[i]->id, b[i].err.msg);
        int left[8];
        assert_int_equal(sb_pids(s[i]->rid, left, 8), 0);
    }
    for (int i = 0; i < 2; i++) {
        if (dsec_container_ops.destroy(ct, s[i]->h, &err) < 0)
            fail_msg("destroy %s after its stop: %s", s[i]->id, err.msg);
    }
    assert_gone(s[0]->id, s[0]->rid, pids, n);
    assert_gone(s[1]->id, s[1]->rid, pids1, n1);
    for (int i = 0; i < 2; i++) {
        dsec_free(s[i]->bstate);
        free(s[i]);
    }
    dsec_loop_free(loop);
}

/* fork_start of p into n children on loop (1: up at once, 0: they came up on the loop); each
 * child sees p's /root/mark. */
static int fork_on_loop(dsec_loop *loop, struct sbx *p, size_t n, struct sbx **kids)
{
    const char *ids[8];
    dsec_sandbox *hs[8];
    char *states[8];
    assert_true(n <= 8);
    for (size_t i = 0; i < n; i++) {
        kids[i] = calloc(1, sizeof **kids);
        assert_non_null(kids[i]);
        snprintf(kids[i]->id, sizeof kids[i]->id, "cttest-%d-%d", (int)getpid(),
                 __atomic_add_fetch(&seq, 1, 0));
        ids[i] = kids[i]->id;
    }
    put_file(p, "/root/mark", "from the parent");
    struct stopped b = {0};
    dsec_err err;
    int rc =
        dsec_container_ops.fork_start(ct, p->h, ids, n, loop, on_stopped, &b, hs, states, &err);
    if (rc < 0)
        fail_msg("fork_start of %s: %s", p->id, err.msg);
    for (int i = 0; rc == 0 && i < 3000 && !atomic_load(&b.ended); i++)
        usleep(10000);
    if (rc == 0 && !atomic_load(&b.ended))
        fail_msg("fork_start of %s: no answer in 30 s", p->id);
    if (rc == 0 && b.rc != 0)
        fail_msg("fork_start of %s: %s", p->id, b.err.msg);
    for (size_t i = 0; i < n; i++) {
        kids[i]->h = hs[i];
        kids[i]->bstate = states[i];
        set_rid(kids[i]);
        char out[64];
        assert_int_equal(sh(kids[i], "cat /root/mark", out, sizeof out), 0);
        assert_string_equal(out, "from the parent");
    }
    return rc;
}

/* A create and a fork on the node's loop (create_start, fork_start): with warm containers
 * ready they are up at once (1); test_cold checks the cold path, whose wait for the agents is
 * the loop's. */
static void test_create_on_loop(void **state)
{
    (void)state;
    dsec_err err;
    dsec_loop *loop = NULL;
    assert_int_equal(dsec_loop_new(&loop, "ct-create", &err), 0);
    int all = 0, ready = 0;
    for (int i = 0; i < 3000 && ready == 0; i++) {
        pool_counts(&all, &ready);
        if (ready == 0)
            usleep(10000);
    }
    assert_true(ready > 0);
    struct sbx *s;
    assert_int_equal(mk_on_loop(loop, &s), 1);
    assert_string_not_equal(s->rid, s->id); /* a warm container's */
    /* a fork whose children take warm containers: up at once too */
    for (int i = 0; i < 3000 && ready < 2; i++) {
        pool_counts(&all, &ready);
        if (ready < 2)
            usleep(10000);
    }
    assert_true(ready >= 2);
    struct sbx *kids[2];
    assert_int_equal(fork_on_loop(loop, s, 2, kids), 1);
    for (int i = 0; i < 2; i++)
        drop(kids[i]);
    drop(s);
    dsec_loop_free(loop);
}

static void test_limits(void **state)
{
    struct sbx *a = mk(64, 500);
    char p[512], out[4096];
    cg_file("cpu", a->rid, "cpu.cfs_quota_us", p, sizeof p);
    if (access(p, F_OK) == 0)
        assert_int_equal(atoi(slurp(p)), 50000);
    else {
        cg_file("cpu", a->rid, "cpu.max", p, sizeof p);
        assert_int_equal(atoi(slurp(p)), 50000);
    }
    cg_file("memory", a->rid, "memory.limit_in_bytes", p, sizeof p);
    if (access(p, F_OK) == 0)
        assert_int_equal(strtoull(slurp(p), NULL, 10), 64ull << 20);
    /* the node's sandboxes together weigh a quarter of the node manager on the CPU */
    assert_parent_weighed();

    /* a memory bomb dies in its own cgroup; the agent and the node go on */
    int rc = sh(a, "x=0123456789abcdef; while true; do x=$x$x; done", NULL, 0);
    assert_int_equal(rc, 128 + SIGKILL);
    assert_int_equal(sh(a, "echo alive", out, sizeof out), 0);
    assert_string_equal(out, "alive\n");

    /* a fork bomb stops at the pids limit */
    rc = sh(a,
            "i=0; while [ $i -lt 200 ]; do sleep 3 2>/dev/null & i=$((i+1)); done 2>/dev/null; "
            "echo done",
            out, sizeof out);
    cg_file("pids", a->rid, "pids.current", p, sizeof p);
    int cur = atoi(slurp(p));
    assert_true(cur <= PIDS_MAX);
    cg_file("pids", a->rid, "pids.events", p, sizeof p);
    assert_non_null(strstr(slurp(p), "max "));
    assert_true(atoi(strstr(slurp(p), "max ") + 4) > 0);
    printf("container: fork bomb held at %d processes (limit %d), %s", cur, PIDS_MAX, slurp(p));
    msleep(3500);
    assert_int_equal(sh(a, "echo alive", out, sizeof out), 0);
    assert_string_equal(out, "alive\n");
    drop(a);
}

static void test_layer_immutable(void **state)
{
    char before[256], after[256];
#define LAYER_SUM                                                                                  \
    "cd %s/layers && (find . -printf '%%p %%y %%m %%s\\n' | sort; "                                \
    "find . -type f -print0 | sort -z | xargs -0 md5sum) | md5sum"
    host(before, sizeof before, LAYER_SUM, state_dir);
    struct sbx *a = mk(128, 0), *b = mk(128, 0);
    char out[256];
    assert_int_equal(
        sh(a, "rm /bin/sh && echo hacked > /bin/sh && busybox cat /bin/sh", out, sizeof out), 0);
    assert_string_equal(out, "hacked\n");
    assert_int_equal(sh(b, "readlink /bin/sh; [ -L /bin/sh ] && echo link", out, sizeof out), 0);
    assert_string_equal(out, "busybox\nlink\n");
    host(after, sizeof after, LAYER_SUM, state_dir);
    assert_string_equal(before, after);
    /* a new sandbox gets the original too */
    struct sbx *c = mk(128, 0);
    assert_int_equal(sh(c, "readlink /bin/sh", out, sizeof out), 0);
    assert_string_equal(out, "busybox\n");
    drop(a);
    drop(b);
    drop(c);
}

static double fork_ms(struct sbx *p, size_t n, struct sbx **kids)
{
    const char *ids[8];
    dsec_sandbox *ch[8];
    char *st[8];
    for (size_t i = 0; i < n; i++) {
        kids[i] = calloc(1, sizeof *kids[i]);
        snprintf(kids[i]->id, sizeof kids[i]->id, "cttest-%d-%d", (int)getpid(),
                 __atomic_add_fetch(&seq, 1, 0));
        ids[i] = kids[i]->id;
    }
    dsec_err err;
    uint64_t t0 = now_us();
    if (dsec_container_ops.fork(ct, p->h, ids, n, ch, st, &err) < 0)
        fail_msg("fork: %s", err.msg);
    uint64_t t1 = now_us();
    for (size_t i = 0; i < n; i++) {
        kids[i]->h = ch[i];
        kids[i]->bstate = st[i];
        set_rid(kids[i]);
    }
    return (t1 - t0) / 1000.0;
}

static void test_fork(void **state)
{
    setenv("DSEC_CONTAINER_TRACE", "1", 1);
    struct sbx *p = mk(256, 0);
    char out[256];
    assert_int_equal(
        sh(p, "mkdir /data && echo 1 > /data/a && echo t > /tmp/t && rm /bin/ls", NULL, 0), 0);
    struct sbx *k[2];
    double ms = fork_ms(p, 2, k);
    printf("container: fork of 2 children of a small sandbox: %.1f ms (%.1f ms/child)\n", ms,
           ms / 2);
    /* the parent writes on after the branch point */
    assert_int_equal(sh(p, "echo late > /data/b; echo 2 >> /data/a", NULL, 0), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(
            sh(k[i], "cat /data/a /tmp/t; ls /data; [ -e /bin/ls ] || echo nols", out, sizeof out),
            0);
        assert_string_equal(out, "1\nt\na\nnols\n");
    }
    /* siblings do not see each other */
    assert_int_equal(sh(k[0], "echo mine > /data/c0", NULL, 0), 0);
    assert_int_not_equal(sh(k[1], "cat /data/c0 2>/dev/null", NULL, 0), 0);
    assert_int_equal(sh(p, "cat /data/a; [ -e /data/c0 ] || echo none", out, sizeof out), 0);
    assert_string_equal(out, "1\n2\nnone\n");
    /* a fork of a fork stacks the snapshots */
    struct sbx *g[1];
    fork_ms(k[0], 1, g);
    assert_int_equal(sh(g[0], "cat /data/a /data/c0", out, sizeof out), 0);
    assert_string_equal(out, "1\nmine\n");

    /* cost does not grow with the data held: 1 GiB in the parent */
    struct sbx *big = mk(0, 0);
    assert_int_equal(sh(big,
                        "dd if=/dev/zero of=/big bs=1M count=1024 2>/dev/null; sync; "
                        "ls -l /big | awk '{print $5}'",
                        out, sizeof out),
                     0);
    assert_string_equal(out, "1073741824\n");
    struct sbx *e1[1], *b1[1], *b4[4];
    double empty = fork_ms(p, 1, e1);
    double full = fork_ms(big, 1, b1);
    double four = fork_ms(big, 4, b4);
    printf("container: fork (1 child): small parent %.1f ms, 1 GiB parent %.1f ms; "
           "4 children of the 1 GiB parent %.1f ms (%.1f ms/child)\n",
           empty, full, four, four / 4);
    assert_int_equal(sh(b4[3], "ls -l /big | awk '{print $5}'", out, sizeof out), 0);
    assert_string_equal(out, "1073741824\n");
    unsetenv("DSEC_CONTAINER_TRACE");

    drop(e1[0]);
    drop(b1[0]);
    for (int i = 0; i < 4; i++)
        drop(b4[i]);
    drop(big);
    drop(g[0]);
    drop(k[0]);
    drop(k[1]);
    drop(p);
    /* the last child took the snapshots with it */
    char snaps[512];
    snprintf(snaps, sizeof snaps, "%s/upper/snap", state_dir);
    DIR *d = opendir(snaps);
    assert_non_null(d);
    struct dirent *de;
    int left = 0;
    while ((de = readdir(d)) != NULL)
        left += de->d_name[0] != '.';
    closedir(d);
    assert_int_equal(left, 0);
}

/* The btrfs id of sandbox id's upper subvolume (its qgroup is 0/<id>). */
static unsigned long subvol_id(const char *id)
{
    char out[64];
    if (host(out, sizeof out, "btrfs inspect-internal rootid %s/upper/sb/%s", state_dir, id) != 0)
        fail_msg("no subvolume for %s", id);
    return strtoul(out, NULL, 10);
}

/* Whether qgroup 0/qid exists, once deleted subvolumes are dropped (a commit wakes the cleaner). */
static bool qgroup_exists(unsigned long qid)
{
    char out[4096];
    host(NULL, 0, "btrfs filesystem sync %s/upper && btrfs subvolume sync %s/upper >/dev/null",
         state_dir, state_dir);
    return host(out, sizeof out, "btrfs qgroup show %s/upper | grep -q '^0/%lu '", state_dir,
                qid) == 0;
}

static bool quotas_on(void)
{
    return host(NULL, 0, "btrfs qgroup show %s/upper >/dev/null 2>&1", state_dir) == 0;
}

static double mk_ms(uint64_t disk_mb, struct sbx **out)
{
    dsec_sandbox_spec spec = {.env = "busybox:1", .memory_mb = 128, .disk_mb = disk_mb};
    uint64_t t0 = now_us();
    *out = mk_spec(&spec);
    return (now_us() - t0) / 1000.0;
}

static void test_disk_quota(void **state)
{
    setenv("DSEC_CONTAINER_TRACE", "1", 1);
    struct sbx *a;
    double first = mk_ms(20, &a);
    printf("container: the first create with disk_mb (switches quotas on): %.1f ms\n", first);
    assert_true(quotas_on());
    struct sbx *b = mk(128, 0);
    char out[512];
    dsec_exec_result r;
    /* 50 MB into a 20 MB quota: the write fails, in the sandbox */
    int rc =
        sh_full(a, "dd if=/dev/zero of=/root/big bs=1M count=50; e=$?; sync; exit $e", NULL, 0, &r);
    assert_int_not_equal(rc, 0);
    printf("container: dd of 50 MB with disk_mb=20: exit %d, \"%.*s\"\n", rc,
           (int)strcspn((char *)r.stderr_data, "\n"), (char *)r.stderr_data);
    assert_non_null(strstr((char *)r.stderr_data, "Disk quota exceeded"));
    dsec_exec_result_release(&r);
    assert_int_equal(sh(a, "ls -l /root/big | awk '{print $5}'", out, sizeof out), 0);
    assert_true(strtoull(out, NULL, 10) <= 21u << 20);
    /* the sandbox and the node go on; freeing space makes room again */
    assert_int_equal(sh(a, "rm /root/big; sync; echo alive", out, sizeof out), 0);
    assert_string_equal(out, "alive\n");
    assert_int_equal(
        sh(a, "dd if=/dev/urandom of=/root/f10 bs=1M count=10 2>&1; sync", out, sizeof out), 0);
    /* a sandbox without a quota is unaffected */
    assert_int_equal(sh(b,
                        "dd if=/dev/zero of=/root/big bs=1M count=50 2>/dev/null && sync && "
                        "ls -l /root/big | awk '{print $5}'",
                        out, sizeof out),
                     0);
    assert_string_equal(out, "52428800\n");

    /* a child inherits the limit, and pays for what it writes, not for what it shares:
     * rewriting the parent's 10 MB file is a copy-up (a reflink), then 15 MB of its own fit */
    struct sbx *k[1];
    fork_ms(a, 1, k);
    assert_int_equal(sh(k[0],
                        "echo more >> /root/f10 && sync && "
                        "dd if=/dev/zero of=/root/own bs=1M count=15 2>&1 && sync",
                        out, sizeof out),
                     0);
    rc = sh_full(k[0], "dd if=/dev/zero of=/root/big bs=1M count=50; e=$?; sync; exit $e", NULL, 0,
                 &r);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr((char *)r.stderr_data, "Disk quota exceeded"));
    dsec_exec_result_release(&r);
    assert_int_equal(sh(k[0], "echo alive", out, sizeof out), 0);
    assert_string_equal(out, "alive\n");

    unsigned long qa = subvol_id(a->id), qk = subvol_id(k[0]->id), qb = subvol_id(b->id);
    assert_true(qgroup_exists(qa));
    drop(k[0]);
    drop(a);
    drop(b);
    /* the qgroups go with their subvolumes */
    assert_false(qgroup_exists(qa));
    assert_false(qgroup_exists(qk));
    assert_false(qgroup_exists(qb));
    /* nor the fork snapshot's: no sandbox is left, so only the top level's qgroup is */
    char out2[4096];
    host(out2, sizeof out2, "btrfs qgroup show %s/upper | grep -c '^0/'", state_dir);
    assert_int_equal(atoi(out2), 1);

    unsetenv("DSEC_CONTAINER_TRACE");
}

static void test_snapshot_restore(void **state)
{
    dsec_backend_kv labels[] = {{"snapshot_name", "snaptest:1"}};
    dsec_sandbox_spec spec = {.env = "busybox:1", .memory_mb = 128, .labels = labels, .nlabels = 1};
    struct sbx *s = mk_spec(&spec);
    assert_int_equal(sh(s,
                        "mkdir -p /work/__pycache__ /work/.cache && echo keep > /work/keep.txt && "
                        "echo x > /work/__pycache__/m.pyc && echo y > /work/y.pyc && "
                        "echo z > /tmp/junk && echo c > /work/.cache/c && rm /bin/vi",
                        NULL, 0),
                     0);
    char path[256];
    snprintf(path, sizeof path, "%s/snap1", top);
    dsec_err err;
    if (dsec_container_ops.snapshot(ct, s->h, path, NULL, &err) < 0)
        fail_msg("snapshot: %s", err.msg);
    /* the sandbox goes on */
    char out[512];
    assert_int_equal(sh(s, "cat /work/keep.txt", out, sizeof out), 0);
    assert_string_equal(out, "keep\n");

    struct sbx *r = calloc(1, sizeof *r);
    snprintf(r->id, sizeof r->id, "cttest-%d-%d", (int)getpid(), __atomic_add_fetch(&seq, 1, 0));
    dsec_sandbox_spec rs = {.id = r->id, .type = "container", .memory_mb = 128};
    if (dsec_container_ops.restore(ct, &rs, path, &r->h, &r->bstate, &err) < 0)
        fail_msg("restore: %s", err.msg);
    set_rid(r);
    const char *check = "cat /work/keep.txt; for f in /work/__pycache__ /work/y.pyc /tmp/junk "
                        "/work/.cache /bin/vi; do [ -e $f ] && echo has $f; done; [ -d /tmp ] "
                        "&& echo tmp; echo $DSEC_TEST";
    assert_int_equal(sh(r, check, out, sizeof out), 0);
    assert_string_equal(out, "keep\ntmp\nyes\n");
    /* by environment name, as any node of the cell would */
    dsec_sandbox_spec byname = {.env = "snaptest:1", .memory_mb = 128};
    struct sbx *n = mk_spec(&byname);
    assert_int_equal(sh(n, check, out, sizeof out), 0);
    assert_string_equal(out, "keep\ntmp\nyes\n");
    /* a bad snapshot file is refused clearly */
    snprintf(path, sizeof path, "%s/tree/etc/passwd", top);
    struct sbx bad = {0};
    rs.id = "cttest-bad";
    assert_int_equal(dsec_container_ops.restore(ct, &rs, path, &bad.h, &bad.bstate, &err), -1);
    assert_int_equal(err.code, DSEC_E_DECODE);
    drop(n);
    drop(r);
    drop(s);
}

static void test_pause_resume(void **state)
{
    struct sbx *a = mk(128, 0);
    sh_bg(ct, a->h,
          "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; "
          "mv /tmp/count.new /tmp/count; usleep 20000; done");
    msleep(300);
    char count[512], freezer[512];
    snprintf(count, sizeof count, "%s/upper/sb/%s/upper/tmp/count", state_dir, a->id);
    dsec_err err;
    assert_int_equal(dsec_container_ops.pause(ct, a->h, &err), 0);
    cg_file("freezer", a->rid, "freezer.state", freezer, sizeof freezer);
    if (access(freezer, F_OK) == 0)
        assert_string_equal(slurp(freezer), "FROZEN\n");
    int c1 = atoi(slurp(count));
    assert_true(c1 > 0);
    msleep(400);
    assert_int_equal(atoi(slurp(count)), c1);
    assert_int_equal(dsec_container_ops.resume(ct, a->h, &err), 0);
    /* the ticker goes on once thawed; on a loaded machine its next step may take a while */
    int c2 = c1;
    for (int i = 0; i < 500 && c2 <= c1; i++) {
        msleep(20);
        c2 = atoi(slurp(count));
    }
    assert_true(c2 > c1);
    char out[64];
    assert_int_equal(sh(a, "echo ok", out, sizeof out), 0);
    assert_string_equal(out, "ok\n");
    /* destroying a paused sandbox works too */
    assert_int_equal(dsec_container_ops.pause(ct, a->h, &err), 0);
    drop(a);
}

struct par {
    struct sbx *s;
    int ok;
    char err[DSEC_ERR_MSG_MAX + 16];
};

static void *par_create(void *arg)
{
    struct par *p = arg;
    p->s = calloc(1, sizeof *p->s);
    snprintf(p->s->id, sizeof p->s->id, "cttest-%d-%d", (int)getpid(),
             __atomic_add_fetch(&seq, 1, 0));
    dsec_sandbox_spec spec = {
        .id = p->s->id, .type = "container", .env = "busybox:1", .memory_mb = 64};
    dsec_err err;
    if (dsec_container_ops.create(ct, &spec, &p->s->h, &p->s->bstate, &err) < 0) {
        snprintf(p->err, sizeof p->err, "create: %s", err.msg);
        return NULL;
    }
    set_rid(p->s);
    const char *argv[] = {"/bin/echo", "ok"};
    dsec_exec_req req = {.argv = argv, .argc = 2};
    dsec_exec_result res;
    if (dsec_container_ops.exec(ct, p->s->h, &req, &res, &err) < 0) {
        snprintf(p->err, sizeof p->err, "exec: %s", err.msg);
        return NULL;
    }
    p->ok = res.exit_code == 0 && res.stdout_len == 3 && memcmp(res.stdout_data, "ok\n", 3) == 0;
    dsec_exec_result_release(&res);
    return NULL;
}

static void *par_destroy(void *arg)
{
    struct par *p = arg;
    dsec_err err;
    if (p->s->h != NULL && dsec_container_ops.destroy(ct, p->s->h, &err) < 0)
        snprintf(p->err, sizeof p->err, "destroy: %s", err.msg);
    else
        p->s->h = NULL;
    return NULL;
}

static void test_parallel_creates(void **state)
{
    enum { N = 50 };
    static struct par ps[N];
    pthread_t th[N];
    memset(ps, 0, sizeof ps);
    uint64_t t0 = now_us();
    for (int i = 0; i < N; i++)
        assert_int_equal(pthread_create(&th[i], NULL, par_create, &ps[i]), 0);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    uint64_t t1 = now_us();
    uint64_t mem = 0;
    for (int i = 0; i < N; i++) {
        if (!ps[i].ok)
            fail_msg("sandbox %d: %s", i, ps[i].err);
        dsec_sandbox_stats st;
        dsec_err err;
        assert_int_equal(dsec_container_ops.stats(ct, ps[i].s->h, &st, &err), 0);
        mem += st.memory_bytes;
    }
    printf("container: %d parallel creates + exec in %.0f ms; idle memory %.2f MiB/sandbox\n", N,
           (t1 - t0) / 1000.0, mem / (double)N / 1048576.0);
    for (int i = 0; i < N; i++)
        assert_int_equal(pthread_create(&th[i], NULL, par_destroy, &ps[i]), 0);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        if (ps[i].s->h != NULL)
            fail_msg("sandbox %d: %s", i, ps[i].err);
        assert_gone(ps[i].s->id, ps[i].s->rid, NULL, 0);
        dsec_free(ps[i].s->bstate);
        free(ps[i].s);
    }
    printf("container: %d parallel destroys in %.0f ms\n", N, (now_us() - t1) / 1000.0);
}

static void test_crash_adopt(void **state)
{
    struct sbx *x = mk(128, 0);
    char out[256];
    assert_int_equal(sh(x, "echo before > /root/f", NULL, 0), 0);
    struct sbx *y[1];
    fork_ms(x, 1, y);
    /* one of them paused: adopt takes it as the runtime reports it (paused) */
    dsec_err err;
    assert_int_equal(dsec_container_ops.pause(ct, y[0]->h, &err), 0);
    /* the node manager goes away: handles forgotten, instance closed */
    dsec_container_ops.detach(ct, x->h);
    dsec_container_ops.detach(ct, y[0]->h);
    dsec_container_ops.fini(ct);
    ct = NULL;
    assert_int_equal(open_backend(), 0);
    dsec_sandbox_spec sx = {.id = x->id, .type = "container", .env = "busybox:1"};
    assert_int_equal(dsec_container_ops.adopt(ct, &sx, x->bstate, &x->h, &err), 0);
    if (dsec_container_ops.adopt(ct, NULL, y[0]->bstate, &y[0]->h, &err) < 0)
        fail_msg("adopt of a paused sandbox: %s", err.msg);
    assert_int_equal(dsec_container_ops.resume(ct, y[0]->h, &err), 0);
    assert_int_equal(sh(x, "cat /root/f", out, sizeof out), 0);
    assert_string_equal(out, "before\n");
    assert_int_equal(sh(y[0], "cat /root/f", out, sizeof out), 0);
    assert_string_equal(out, "before\n");
    /* a record that is not of this backend is refused */
    struct sbx z = {0};
    assert_int_equal(dsec_container_ops.adopt(ct, NULL, "/nonexistent/sb/q", &z.h, &err), -1);
    drop(x);
    drop(y[0]);
}

/* The host pid of a sandbox's agent: the process of its cgroup that is pid 1 of its own pid
 * namespace (the last field of NSpid); -1 when there is none. */
static int agent_pid(const char *rid)
{
    int pids[PIDS_MAX + 8];
    int n = sb_pids(rid, pids, PIDS_MAX + 8);
    for (int i = 0; i < n; i++) {
        char p[64], line[256];
        snprintf(p, sizeof p, "/proc/%d/status", pids[i]);
        FILE *f = fopen(p, "r");
        bool init = false;
        while (f != NULL && fgets(line, sizeof line, f) != NULL)
            if (strncmp(line, "NSpid:", 6) == 0) {
                line[strcspn(line, "\n")] = '\0';
                char *last = strrchr(line, '\t');
                init = last != NULL && strcmp(last + 1, "1") == 0;
            }
        if (f != NULL)
            fclose(f);
        if (init)
            return pids[i];
    }
    return -1;
}

/* One exec of "echo hi" that must fail: its error, with the time it took. */
static dsec_err exec_fails(struct sbx *s, uint64_t *ms)
{
    const char *argv[] = {"/bin/sh", "-c", "echo hi"};
    dsec_exec_req req = {.argv = argv, .argc = 3, .timeout_ms = 10000};
    dsec_exec_result res = {0};
    dsec_err err;
    dsec_err_clear(&err);
    uint64_t t0 = now_us();
    if (dsec_container_ops.exec(ct, s->h, &req, &res, &err) == 0) {
        dsec_exec_result_release(&res);
        fail_msg("exec in %s ran, expected it to fail", s->id);
    }
    *ms = (now_us() - t0) / 1000;
    printf("container: %s after %llu ms: %s\n", dsec_code_name(err.code), (unsigned long long)*ms,
           err.msg);
    return err;
}

/* An agent that does not answer is reported as what it is: alive and stopped (or starved), or
 * dead - and then whether its memory cgroup saw an OOM kill. A stopped agent used to be
 * reported "gone (its init died: out of memory, or killed)". */
static void test_agent_unresponsive_or_dead(void **state)
{
    struct sbx *x = mk(64, 0);
    char out[256];
    assert_int_equal(sh(x, "echo up", out, sizeof out), 0);
    int pid = agent_pid(x->rid);
    assert_true(pid > 0);
    /* stopped, and the node manager restarts: adopt cannot reach it, the next exec says why */
    assert_int_equal(kill(pid, SIGSTOP), 0);
    dsec_container_ops.detach(ct, x->h);
    dsec_container_ops.fini(ct);
    ct = NULL;
    assert_int_equal(open_backend(), 0);
    dsec_err err;
    assert_int_equal(dsec_container_ops.adopt(ct, NULL, x->bstate, &x->h, &err), 0);
    uint64_t ms;
    err = exec_fails(x, &ms);
    if (err.code != DSEC_E_TIMEOUT || strstr(err.msg, "agent is alive") == NULL ||
        strstr(err.msg, "stopped (state T") == NULL || strstr(err.msg, "dead") != NULL ||
        strstr(err.msg, "gone") != NULL)
        fail_msg("a stopped agent, expected timeout \"agent is alive ... stopped\", got %s: %s",
                 dsec_code_name(err.code), err.msg);
    /* and it was alive: continued, it answers again */
    assert_int_equal(kill(pid, SIGCONT), 0);
    assert_int_equal(sh(x, "echo back", out, sizeof out), 0);
    assert_string_equal(out, "back\n");

    /* killed between two calls: the connection's end says dead, and so does the next call,
     * at once (no wait for an agent that cannot answer) */
    assert_int_equal(kill(pid, SIGKILL), 0);
    for (int i = 0; i < 200 && agent_pid(x->rid) > 0; i++)
        msleep(10);
    for (int i = 0; i < 2; i++) {
        err = exec_fails(x, &ms);
        if (err.code != DSEC_E_BACKEND || strstr(err.msg, "agent is dead") == NULL ||
            strstr(err.msg, "no OOM kill is recorded") == NULL || strstr(err.msg, "alive") != NULL)
            fail_msg("a killed agent (call %d), expected \"agent is dead ... no OOM kill\", got "
                     "%s: %s",
                     i + 1, dsec_code_name(err.code), err.msg);
        if (i == 1 && ms > 1000)
            fail_msg("a dead agent took %llu ms to report", (unsigned long long)ms);
    }
    assert_int_equal(dsec_container_ops.destroy(ct, x->h, &err), 0);
    dsec_free(x->bstate);
    free(x);

    /* an OOM kill in its memory cgroup is named as the likely cause */
    struct sbx *y = mk(32, 0);
    int rc = sh(y, "dd if=/dev/zero of=/dev/null bs=96M count=1", out, sizeof out);
    assert_int_not_equal(rc, 0); /* the OOM killer took dd */
    pid = agent_pid(y->rid);
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGKILL), 0);
    for (int i = 0; i < 200 && agent_pid(y->rid) > 0; i++)
        msleep(10);
    err = exec_fails(y, &ms);
    if (err.code != DSEC_E_BACKEND || strstr(err.msg, "agent is dead") == NULL ||
        strstr(err.msg, "OOM kill(s) at its limit of 32 MiB") == NULL)
        fail_msg("a dead agent after an OOM kill, expected \"agent is dead ... OOM kill(s) at its "
                 "limit of 32 MiB\", got %s: %s",
                 dsec_code_name(err.code), err.msg);
    assert_int_equal(dsec_container_ops.destroy(ct, y->h, &err), 0);
    dsec_free(y->bstate);
    free(y);
}

static void test_failed_create(void **state)
{
    char id[64];
    snprintf(id, sizeof id, "cttest-%d-fail", (int)getpid());
    const char *missing[] = {
        "sha256:0000000000000000000000000000000000000000000000000000000000000000"};
    dsec_sandbox_spec spec = {.id = id, .type = "container", .layers = missing, .nlayers = 1};
    dsec_sandbox *h = NULL;
    char *bs = NULL;
    dsec_err err;
    assert_int_equal(dsec_container_ops.create(ct, &spec, &h, &bs, &err), -1);
    assert_null(h);
    assert_null(bs);
    assert_non_null(strstr(err.msg, "sha256:0000"));
    printf("container: missing layer: %s\n", err.msg);
    assert_gone(id, NULL, NULL, 0);
    /* an unknown environment */
    dsec_sandbox_spec s2 = {.id = id, .type = "container", .env = "nope:1"};
    assert_int_equal(dsec_container_ops.create(ct, &s2, &h, &bs, &err), -1);
    assert_non_null(strstr(err.msg, "nope:1"));
    assert_gone(id, NULL, NULL, 0);
    /* a bad id */
    dsec_sandbox_spec s3 = {.id = "a/../b", .type = "container", .env = "busybox:1"};
    assert_int_equal(dsec_container_ops.create(ct, &s3, &h, &bs, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    /* a runtime failure after the rootfs is mounted: a working dir that is a file */
    char *layers[] = {NULL};
    dsec_env *base = NULL;
    assert_int_equal(dsec_layer_registry_env_get(reg, "busybox:1", &base, &err), 0);
    layers[0] = base->layers[0];
    dsec_layer_format fmts[] = {DSEC_LAYER_DIR};
    dsec_env broken = {.name = "broken:1",
                       .layers = layers,
                       .formats = fmts,
                       .nlayers = 1,
                       .workdir = "/",
                       .user = "nosuchuser"};
    assert_int_equal(dsec_layer_registry_env_put(reg, &broken, &err), 0);
    dsec_env_free(base);
    dsec_sandbox_spec s4 = {.id = id, .type = "container", .env = "broken:1"};
    int rc = dsec_container_ops.create(ct, &s4, &h, &bs, &err);
    if (rc == 0) {
        /* the agent may accept an unknown default user and fail each exec instead */
        assert_int_equal(dsec_container_ops.destroy(ct, h, &err), 0);
        dsec_free(bs);
    } else {
        printf("container: broken environment: %s\n", err.msg);
    }
    assert_gone(id, NULL, NULL, 0);
}

/* Warm containers in the pool directory (ready or being started), and the ready ones. */
static void pool_counts(int *all, int *ready)
{
    char p[512];
    snprintf(p, sizeof p, "%s/pool", state_dir);
    *all = *ready = 0;
    DIR *d = opendir(p);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] != 'w')
            continue;
        (*all)++;
        snprintf(p, sizeof p, "%s/pool/%s/ready", state_dir, e->d_name);
        *ready += access(p, F_OK) == 0;
    }
    closedir(d);
}

/* A create takes a warm container (started ahead on an empty root) and switches its root to
 * the sandbox's overlay: the sandbox has its own hostname, files, limits and environment
 * defaults and sees nothing of the empty root; destroy removes the warm container with it.
 * With warm_pool=0 every create starts its own container. */
static void test_warm_pool(void **state)
{
    char out[512];
    /* the pool (warm_pool 8, 3 refill threads) fills in the background, and refills after a
     * burst takes some: never more than 8, started or starting */
    int all = 0, ready = 0;
    for (int i = 0; i < 1200 && ready < 8; i++) {
        pool_counts(&all, &ready);
        assert_in_range(all, 0, 8);
        usleep(50000);
    }
    assert_int_equal(ready, 8);
    struct sbx *burst[5];
    for (int i = 0; i < 5; i++)
        burst[i] = mk(64, 0);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(burst[i]->rid[0], 'w'); /* each took a warm one */
        /* its commands run at the node's priority, though the pool started it at a lower one
         * (field 19 of stat: the nice value) */
        assert_int_equal(sh(burst[i], "cut -d' ' -f19 /proc/self/stat", out, sizeof out), 0);
        assert_string_equal(out, "0\n");
    }
    ready = 0;
    for (int i = 0; i < 6000 && ready < 8; i++) {
        pool_counts(&all, &ready);
        assert_in_range(all, 0, 8);
        usleep(10000);
    }
    assert_int_equal(ready, 8);
    for (int i = 0; i < 5; i++)
        drop(burst[i]);
    char *layers[] = {NULL};
    dsec_env *base = NULL;
    dsec_err err;
    assert_int_equal(dsec_layer_registry_env_get(reg, "busybox:1", &base, &err), 0);
    layers[0] = base->layers[0];
    dsec_layer_format fmts[] = {DSEC_LAYER_DIR};
    char *vars[] = {"WARM=yes", "PATH=/bin"};
    dsec_env warm = {.name = "warmtest:1",
                     .layers = layers,
                     .formats = fmts,
                     .nlayers = 1,
                     .vars = vars,
                     .nvars = 2,
                     .workdir = "/tmp",
                     .user = "nobody"};
    assert_int_equal(dsec_layer_registry_env_put(reg, &warm, &err), 0);
    dsec_env_free(base);
    dsec_sandbox_spec spec = {.env = "warmtest:1", .memory_mb = 96};
    struct sbx *s = mk_spec(&spec);
    assert_int_equal(s->rid[0], 'w');
    assert_string_not_equal(s->rid, s->id);
    assert_int_equal(sh(s,
                        "hostname; pwd; id -u; echo $WARM; ls -a /.dsec | tr '\n' ' '; echo; "
                        "echo $(grep -c -e /.dsec/root -e /pool/ /proc/self/mountinfo); "
                        "echo hi > /tmp/w",
                        out, sizeof out),
                     0);
    char want[256];
    snprintf(want, sizeof want, "%s\n/tmp\n65534\nyes\n. .. agent \n0\n", s->id);
    assert_string_equal(out, want);
    /* its writes land in its own upper layer */
    char p[512];
    snprintf(p, sizeof p, "%s/upper/sb/%s/upper/tmp/w", state_dir, s->id);
    assert_string_equal(slurp(p), "hi\n");
    /* and the agent's own root is that overlay: the agent's, and its idle shepherd's (the
     * process that ran the command, kept for the next), the only ones left in its cgroup */
    int pids[8];
    int np = sb_pids(s->rid, pids, 8);
    assert_true(np >= 1 && np <= 2);
    for (int i = 0; i < np; i++) {
        snprintf(p, sizeof p, "/proc/%d/root/tmp/w", pids[i]);
        assert_string_equal(slurp(p), "hi\n");
    }
    cg_file("memory", s->rid, "memory.limit_in_bytes", p, sizeof p);
    if (access(p, F_OK) != 0)
        cg_file("memory", s->rid, "memory.max", p, sizeof p);
    assert_int_equal(strtoull(slurp(p), NULL, 10), 96ull << 20);
    drop(s);

    /* the switch runs as the host's root on the sandbox's layers: a mount point that is a
     * symlink (here /dev -> /tmp) is refused, and the failed create leaves nothing */
    assert_int_equal(host(NULL, 0,
                          "set -e; t=%s/linktree; mkdir -p $t/etc $t/tmp; ln -s /tmp $t/dev; "
                          "cp %s/tree/etc/passwd $t/etc/",
                          top, top),
                     0);
    dsec_digest d;
    tree_layer("linktree", d);
    char *llayers[] = {d};
    dsec_env linked = {.name = "devlink:1", .layers = llayers, .formats = fmts, .nlayers = 1};
    assert_int_equal(dsec_layer_registry_env_put(reg, &linked, &err), 0);
    char lid[64];
    snprintf(lid, sizeof lid, "cttest-%d-devlink", (int)getpid());
    dsec_sandbox_spec ls = {.id = lid, .type = "container", .env = "devlink:1"};
    dsec_sandbox *h = NULL;
    char *bs = NULL;
    assert_int_equal(dsec_container_ops.create(ct, &ls, &h, &bs, &err), -1);
    assert_non_null(strstr(err.msg, "/proc, /dev, /sys and /.dsec must be directories"));
    assert_gone(lid, NULL, NULL, 0);

    dsec_container_ops.fini(ct);
    ct = NULL;
    warm_pool = "0";
    assert_int_equal(open_backend(), 0);
    struct sbx *c = mk(64, 0);
    assert_string_equal(c->rid, c->id);
    assert_int_equal(sh(c, "hostname", out, sizeof out), 0);
    snprintf(want, sizeof want, "%s\n", c->id);
    assert_string_equal(out, want);
    host(out, sizeof out, "ls %s/pool | grep -c '^w'", state_dir);
    assert_int_equal(atoi(out), 0);
    drop(c);
    dsec_container_ops.fini(ct);
    ct = NULL;
    warm_pool = NULL;
    assert_int_equal(open_backend(), 0);
}

/* Entries in the store's snapshot dir. */
static int nsnaps(void)
{
    char p[512];
    snprintf(p, sizeof p, "%s/upper/snap", state_dir);
    DIR *d = opendir(p);
    assert_non_null(d);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)) != NULL)
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

static void test_sweep(void **state)
{
    /* a parent and two children; the node manager crashes and its journal
     * brings back only the parent and one child */
    struct sbx *p = mk(128, 0);
    assert_int_equal(sh(p, "echo shared > /root/f", NULL, 0), 0);
    struct sbx *c[2];
    fork_ms(p, 2, c);
    assert_int_equal(nsnaps(), 1);
    int pids[64];
    int npids = sb_pids(c[1]->rid, pids, 64);
    assert_true(npids >= 1);
    /* and what crashes mid-operation leave: a bundle without meta, a
     * snapshot no one took, a half-written layer blob */
    char stray[64];
    snprintf(stray, sizeof stray, "cttest-%d-stray", (int)getpid());
    assert_int_equal(host(NULL, 0,
                          "mkdir -p %s/sb/%s/rootfs && btrfs subvolume create %s/upper/snap/%s-f1 "
                          ">/dev/null && touch %s/pack-x1.blob",
                          state_dir, stray, state_dir, stray, state_dir),
                     0);
    dsec_container_ops.detach(ct, p->h);
    dsec_container_ops.detach(ct, c[0]->h);
    dsec_container_ops.detach(ct, c[1]->h);
    dsec_container_ops.fini(ct);
    ct = NULL;
    assert_int_equal(open_backend(), 0);
    dsec_err err;
    assert_int_equal(dsec_container_ops.adopt(ct, NULL, p->bstate, &p->h, &err), 0);
    assert_int_equal(dsec_container_ops.adopt(ct, NULL, c[0]->bstate, &c[0]->h, &err), 0);
    /* nothing is reclaimed while the node may still be re-adopting */
    assert_int_equal(access(c[1]->bstate, F_OK), 0);
    assert_int_equal(nsnaps(), 2);
    /* the first create after that reclaims the rest */
    struct sbx *q = mk(64, 0);
    assert_gone(c[1]->id, c[1]->rid, pids, npids);
    assert_gone(stray, NULL, NULL, 0);
    char path[512];
    snprintf(path, sizeof path, "%s/pack-x1.blob", state_dir);
    assert_int_not_equal(access(path, F_OK), 0);
    /* the snapshot the adopted child reads stays, and so does what it reads */
    assert_int_equal(nsnaps(), 1);
    char out[64];
    assert_int_equal(sh(c[0], "cat /root/f", out, sizeof out), 0);
    assert_string_equal(out, "shared\n");
    assert_int_equal(sh(p, "cat /root/f", out, sizeof out), 0);
    assert_string_equal(out, "shared\n");
    /* its last child gone, the snapshot goes */
    drop(c[0]);
    assert_int_equal(nsnaps(), 0);
    drop(p);
    drop(q);
    dsec_free(c[1]->bstate);
    free(c[1]);
}

/* A sandbox's root overlay exists only in its own mount namespace: the
 * host's mount table does not grow with the sandboxes. */
static void test_rootfs_private(void **state)
{
    (void)state;
    struct sbx *a = mk(64, 0);
    char out[512];
    assert_int_equal(
        host(out, sizeof out, "grep -c '%s/sb/%s' /proc/self/mountinfo", state_dir, a->id),
        256); /* grep -c: 0 lines, exit status 1 */
    assert_string_equal(out, "0\n");
    assert_int_equal(
        sh(a, "awk '$5 == \"/\" { print $(NF-2) }' /proc/self/mountinfo", out, sizeof out), 0);
    assert_string_equal(out, "overlay\n");
    assert_int_equal(sh(a, "echo hi > /root/x && cat /root/x", out, sizeof out), 0);
    assert_string_equal(out, "hi\n");
    drop(a);
}

/* The backend remounted cgroup2 with favordynmods at init (crun's task
 * migrations then skip an RCU grace period); a bad value is refused. */
static void test_cgroup_favordynmods(void **state)
{
    (void)state;
    char where[512];
    dsec_err err;
    int rc = dsec_cgroup_favor_dynmods(where, sizeof where, &err);
    if (rc < 0 && err.code == DSEC_E_UNSUPPORTED) {
        fprintf(stderr, "container: favordynmods not available here: %s\n", err.msg);
    } else {
        if (rc < 0)
            fail_msg("favordynmods: %s", err.msg);
        /* the mount in mountinfo carries it now */
        char out[512];
        assert_int_equal(
            host(out, sizeof out,
                 "awk '$5 == \"%s\" && / - cgroup2 / {print $NF}' /proc/self/mountinfo", where),
            0);
        assert_non_null(strstr(out, "favordynmods"));
    }
    dsec_backend_kv opts[] = {{"cgroup_favordynmods", "maybe"}};
    dsec_backend_config cfg = {.state_dir = state_dir, .node = NODE, .opts = opts, .nopts = 1};
    void *other = NULL;
    assert_int_equal(dsec_container_ops.init(&other, &cfg, &err), -1);
    assert_int_equal(err.code, DSEC_E_CONFIG);
    assert_non_null(strstr(err.msg, "cgroup_favordynmods=\"maybe\": expected true or false"));
}

/* The node runs the runtime (crun or runc) from one sealed in-memory copy of it (option
 * runtime_memfd), so it skips copying itself on every call; the copy must be the installed
 * binary, byte for byte, and sealed against any write. */
static void test_runtime_memfd(void **state)
{
    (void)state;
    char rt[256] = "";
    assert_int_equal(host(rt, sizeof rt,
                          "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
                          "/sbin:/bin command -v " CT_RUNTIME),
                     0);
    rt[strcspn(rt, "\n")] = '\0';
    FILE *f = fopen(rt, "rb");
    assert_non_null(f);
    enum { MAX = 64 << 20 }; /* runc, a Go binary, is about 9 MiB */
    char *want = malloc(MAX), *got = malloc(MAX);
    assert_true(want != NULL && got != NULL);
    size_t nwant = fread(want, 1, MAX, f);
    fclose(f);
    assert_true(nwant > 0 && nwant < MAX);
    int found = 0;
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        char p[300], link[300];
        snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(p, link, sizeof link - 1);
        if (n <= 0)
            continue;
        link[n] = '\0';
        if (strncmp(link, "/memfd:dsec-runtime", 19) != 0)
            continue;
        int fd = atoi(e->d_name);
        assert_int_equal(fcntl(fd, F_GET_SEALS),
                         F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE);
        assert_int_equal(pwrite(fd, "x", 1, 0), -1); /* sealed: nobody may change it */
        ssize_t ngot = pread(fd, got, MAX, 0);
        assert_int_equal(ngot, (ssize_t)nwant);
        assert_memory_equal(got, want, nwant);
        found++;
    }
    closedir(d);
    free(want);
    free(got);
    assert_int_equal(found, 1); /* the group's backend made exactly one */

    dsec_backend_kv opts[] = {{"runtime_memfd", "yes please"}};
    dsec_backend_config cfg = {.state_dir = state_dir, .node = NODE, .opts = opts, .nopts = 1};
    dsec_err err;
    void *other = NULL;
    assert_int_equal(dsec_container_ops.init(&other, &cfg, &err), -1);
    assert_int_equal(err.code, DSEC_E_CONFIG);
    assert_non_null(strstr(err.msg, "runtime_memfd=\"yes please\": expected true or false"));
}

/* The core scenarios on containers the runtime starts itself, from config.json (warm_pool=0):
 * elsewhere most creates take a warm container, whose memory and CPU limits the backend
 * writes, and whose root it switches. */
static void test_cold(void **state)
{
    dsec_container_ops.fini(ct);
    ct = NULL;
    warm_pool = "0";
    assert_int_equal(open_backend(), 0);
    struct sbx *c = mk(64, 0);
    assert_string_equal(c->rid, c->id); /* no warm container: its own */
    drop(c);
    /* on the node's loop: the cold start's wait for its agent is the loop's */
    dsec_loop *loop = NULL;
    dsec_err lerr;
    assert_int_equal(dsec_loop_new(&loop, "ct-cold", &lerr), 0);
    assert_int_equal(mk_on_loop(loop, &c), 0);
    assert_string_equal(c->rid, c->id);
    struct sbx *kids[2];
    assert_int_equal(fork_on_loop(loop, c, 2, kids), 0);
    for (int i = 0; i < 2; i++)
        drop(kids[i]);
    drop(c);
    dsec_loop_free(loop);
    test_exec_and_files(state);
    test_limits(state);
    test_fork(state);
    test_pause_resume(state);
    test_crash_adopt(state);
    /* the runtime itself fails (/proc in the root is a file): its message comes back, and
     * the failed create leaves nothing */
    dsec_err err;
    assert_int_equal(host(NULL, 0,
                          "set -e; t=%s/proctree; mkdir -p $t/etc; touch $t/proc; "
                          "cp %s/tree/etc/passwd $t/etc/",
                          top, top),
                     0);
    dsec_digest d;
    tree_layer("proctree", d);
    const char *layers[] = {d};
    char id[64];
    snprintf(id, sizeof id, "cttest-%d-procfile", (int)getpid());
    dsec_sandbox_spec spec = {.id = id, .type = "container", .layers = layers, .nlayers = 1};
    dsec_sandbox *h = NULL;
    char *bs = NULL;
    assert_int_equal(dsec_container_ops.create(ct, &spec, &h, &bs, &err), -1);
    printf("container: cold create on a root whose /proc is a file: %s\n", err.msg);
    assert_non_null(strstr(err.msg, CT_RUNTIME " run failed"));
    assert_non_null(strstr(err.msg, "proc"));
    assert_null(strstr(err.msg, "level=error")); /* runc's log line, down to its message */
    assert_null(h);
    assert_gone(id, NULL, NULL, 0);
    dsec_container_ops.fini(ct);
    ct = NULL;
    warm_pool = NULL;
    assert_int_equal(open_backend(), 0);
}

/* A runtime that is not there fails the backend's opening (so the node serves no container
 * create) with a message naming the runtime, where it was looked for and what to do: runsc
 * (gVisor) is not packaged for Debian. A runtime path that does not exist, and an unknown
 * runtime, are named too. */
static void test_runtime_missing(void **state)
{
    (void)state;
    dsec_err err;
    void *other = NULL;
    if (host(NULL, 0,
             "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
             "command -v runsc >/dev/null") == 0) {
        fprintf(stderr, "container: runsc is installed here; its missing case is not tested\n");
    } else {
        dsec_backend_kv opts[] = {{"runtime", "runsc"}};
        dsec_backend_config cfg = {.state_dir = state_dir, .node = NODE, .opts = opts, .nopts = 1};
        assert_int_equal(dsec_container_ops.init(&other, &cfg, &err), -1);
        assert_null(other);
        assert_int_equal(err.code, DSEC_E_CONFIG);
        printf("container: runtime=runsc without runsc: %s\n", err.msg);
        assert_non_null(strstr(err.msg, "runtime=runsc, but no runsc binary is installed"));
        assert_non_null(strstr(err.msg, "https://gvisor.dev/"));
        assert_non_null(strstr(err.msg, "runtime_path"));
    }
    dsec_backend_kv opts2[] = {{"runtime", CT_RUNTIME}, {"runtime_path", "/nonexistent/rt"}};
    dsec_backend_config cfg2 = {.state_dir = state_dir, .node = NODE, .opts = opts2, .nopts = 2};
    assert_int_equal(dsec_container_ops.init(&other, &cfg2, &err), -1);
    assert_int_equal(err.code, DSEC_E_CONFIG);
    assert_non_null(strstr(err.msg, "/nonexistent/rt is missing or not executable"));
    dsec_backend_kv opts3[] = {{"runtime", "kata"}};
    dsec_backend_config cfg3 = {.state_dir = state_dir, .node = NODE, .opts = opts3, .nopts = 1};
    assert_int_equal(dsec_container_ops.init(&other, &cfg3, &err), -1);
    assert_non_null(strstr(err.msg, "expected crun, runc or runsc"));
    /* A refused instance leaves the node's parent cgroup alone. It used to remove it when no
     * sandbox was in it, and the next sandbox's runtime made it again at the default weight
     * (seen as cpu.shares 1024 in test_limits). */
    assert_parent_weighed();
}

/* ---- a node restarted with another runtime ------------------------------------------------ */

/* The runtime these tests switch to: the other one of crun and runc. */
#define OTHER_RT (strcmp(CT_RUNTIME, "crun") == 0 ? "runc" : "crun")

static bool rt_installed(const char *name)
{
    return host(NULL, 0,
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
                "command -v %s >/dev/null",
                name) == 0;
}

/* The value of a sandbox's meta line key ("" when it has none). */
static const char *meta_value(const char *bstate, const char *key)
{
    static char v[128];
    char p[512], line[256];
    snprintf(p, sizeof p, "%s/meta", bstate);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    v[0] = '\0';
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, key, kl) == 0 && line[kl] == ' ') {
            line[strcspn(line, "\n")] = '\0';
            snprintf(v, sizeof v, "%.120s", line + kl + 1);
        }
    fclose(f);
    return v;
}

/* Ready warm containers in the pool directory: their runtime ids in rids (up to max). */
static int ready_warm(char rids[][96], int max)
{
    char p[512];
    snprintf(p, sizeof p, "%s/pool", state_dir);
    DIR *d = opendir(p);
    int n = 0;
    for (struct dirent *e; d != NULL && n < max && (e = readdir(d)) != NULL;) {
        snprintf(p, sizeof p, "%s/pool/%s/ready", state_dir, e->d_name);
        if (e->d_name[0] == 'w' && access(p, F_OK) == 0)
            snprintf(rids[n++], 96, "%.90s", e->d_name);
    }
    if (d != NULL)
        closedir(d);
    return n;
}

/* A node manager on runtime `from` that crashes: run in a child process, which opens the
 * backend (2 warm containers), creates sandbox id, writes /root/f and starts a background
 * sleep (its pid in /root/pid), waits until its pool is full again and ends without closing
 * anything. Only the child's own calls here, no cmocka: it exits 0 when all went well. */
static void crash_on(const char *from, const char *id)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        warm_pool = "2";
        if (open_backend_with(from, NULL, NULL) < 0)
            _exit(2);
        dsec_sandbox_spec spec = {
            .id = id, .type = "container", .env = "busybox:1", .memory_mb = 128};
        dsec_sandbox *h = NULL;
        char *bs = NULL;
        dsec_err err;
        if (dsec_container_ops.create(ct, &spec, &h, &bs, &err) < 0) {
            fprintf(stderr, "child: create on %s: %s\n", from, err.msg);
            _exit(3);
        }
        const char *argv[] = {"/bin/sh", "-c",
                              "echo before > /root/f && echo $$ > /root/pid && exec sleep 1000"};
        dsec_proc_start_req req = {.exec = {.argv = argv, .argc = 3}};
        dsec_proc_info bg;
        if (dsec_container_ops.proc_start(ct, h, &req, &bg, &err) < 0) {
            fprintf(stderr, "child: proc start: %s\n", err.msg);
            _exit(4);
        }
        for (int i = 0; i < 500; i++) { /* the pid file is written */
            dsec_file_data fd = {0};
            if (dsec_container_ops.file_read(ct, h, "/root/pid", 0, 0, &fd, &err) == 0 &&
                fd.len > 0) {
                dsec_free(fd.data);
                break;
            }
            dsec_free(fd.data);
            msleep(10);
        }
        char rids[4][96];
        for (int i = 0; i < 1200 && ready_warm(rids, 4) < 2; i++)
            msleep(50);
        _exit(ready_warm(rids, 4) == 2 ? 0 : 5);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* A node manager started by the group's runtime crashes (its sandbox running, two warm
 * containers ready); the next one is configured with the other runtime. It adopts the sandbox
 * with the runtime that started it (the meta says which): exec works, the file and the
 * background process are still there, pause and resume work, and destroy leaves nothing of it
 * (the runtime's state dir included). The crashed instance's warm containers are removed by
 * its runtime at the sweep, and the new sandboxes are the configured runtime's. */
static void test_runtime_switch(void **state)
{
    const char *to = OTHER_RT;
    if (!rt_installed(to)) {
        fprintf(stderr, "container: %s is not installed; runtime switch not tested\n", to);
        skip();
    }
    dsec_container_ops.fini(ct);
    ct = NULL;
    struct sbx *x = calloc(1, sizeof *x);
    assert_non_null(x);
    snprintf(x->id, sizeof x->id, "cttest-%d-switch", (int)getpid());
    crash_on(CT_RUNTIME, x->id);
    char p[512];
    snprintf(p, sizeof p, "%s/sb/%s", state_dir, x->id);
    x->bstate = dsec_strdup(p);
    set_rid(x);
    assert_string_equal(meta_value(x->bstate, "runtime"), CT_RUNTIME);
    int xp[64];
    int nxp = sb_pids(x->rid, xp, 64);
    assert_true(nxp >= 2); /* the agent and the sleep */
    char x_id[64], x_rid[96];
    memcpy(x_id, x->id, sizeof x_id);
    memcpy(x_rid, x->rid, sizeof x_rid);
    /* what the crash left of the pool */
    char warm[4][96];
    int wpids[4][8], nw[4];
    int nwarm = ready_warm(warm, 4);
    assert_int_equal(nwarm, 2);
    for (int i = 0; i < nwarm; i++) {
        nw[i] = sb_pids(warm[i], wpids[i], 8);
        assert_true(nw[i] >= 1);
    }

    assert_int_equal(open_backend_with(to, NULL, NULL), 0);
    dsec_err err;
    if (dsec_container_ops.adopt(ct, NULL, x->bstate, &x->h, &err) < 0)
        fail_msg("adopt of a %s sandbox by a %s node: %s", CT_RUNTIME, to, err.msg);
    char out[256];
    assert_int_equal(sh(x, "cat /root/f", out, sizeof out), 0);
    assert_string_equal(out, "before\n");
    assert_int_equal(
        sh(x, "test \"$(pidof sleep)\" = \"$(cat /root/pid)\" && echo same", out, sizeof out), 0);
    assert_string_equal(out, "same\n");
    assert_int_equal(dsec_container_ops.pause(ct, x->h, &err), 0);
    assert_int_equal(dsec_container_ops.resume(ct, x->h, &err), 0);
    put_file(x, "/root/g", "after\n");
    assert_int_equal(sh(x, "cat /root/g", out, sizeof out), 0);
    assert_string_equal(out, "after\n");

    /* the first create sweeps: the crashed instance's warm containers go, by their runtime */
    struct sbx *q = mk(64, 0);
    assert_string_equal(meta_value(q->bstate, "runtime"), to);
    snprintf(p, sizeof p, "%s/run/%s/%s", state_dir, q->rid,
             strcmp(to, "runc") == 0 ? "state.json" : "status");
    if (access(p, F_OK) != 0)
        fail_msg("the new sandbox is not %s's: no %s", to, p);
    for (int i = 0; i < nwarm; i++)
        assert_gone(warm[i], warm[i], wpids[i], nw[i]);
    /* a fork of the adopted sandbox: children on the configured runtime */
    struct sbx *kid[1];
    fork_ms(x, 1, kid);
    assert_string_equal(meta_value(kid[0]->bstate, "runtime"), to);
    assert_int_equal(sh(kid[0], "cat /root/f", out, sizeof out), 0);
    assert_string_equal(out, "before\n");
    drop(kid[0]);
    drop(q);
    drop(x); /* its state dir too: destroyed by the runtime that started it */
    assert_gone(x_id, x_rid, xp, nxp);
    dsec_container_ops.fini(ct);
    ct = NULL;
    assert_int_equal(open_backend(), 0);
}

/* A meta written before it named the runtime is read as the configured runtime's. */
static void test_adopt_meta_without_runtime(void **state)
{
    struct sbx *x = mk(64, 0);
    assert_int_equal(sh(x, "echo old > /root/f", NULL, 0), 0);
    assert_string_equal(meta_value(x->bstate, "runtime"), CT_RUNTIME);
    dsec_container_ops.detach(ct, x->h);
    dsec_container_ops.fini(ct);
    ct = NULL;
    assert_int_equal(host(NULL, 0, "sed -i '/^runtime /d' %s/meta", x->bstate), 0);
    assert_string_equal(meta_value(x->bstate, "runtime"), "");
    assert_int_equal(open_backend(), 0);
    dsec_err err;
    if (dsec_container_ops.adopt(ct, NULL, x->bstate, &x->h, &err) < 0)
        fail_msg("adopt of a meta without a runtime line: %s", err.msg);
    char out[64];
    assert_int_equal(sh(x, "cat /root/f", out, sizeof out), 0);
    assert_string_equal(out, "old\n");
    drop(x); /* nothing left: its runtime state dir went with the configured runtime */
}

/* The runtime that started a sandbox is not installed on the node that restarts (here: its
 * binary path points nowhere). Adopt fails with DSEC_E_CONFIG (the node keeps the record),
 * naming the runtime and what to do; the sandbox runs on with its files, the sweep leaves it
 * alone, and a node manager that has the runtime adopts it. */
static void test_runtime_not_installed(void **state)
{
    const char *to = OTHER_RT;
    if (!rt_installed(to)) {
        fprintf(stderr, "container: %s is not installed; runtime switch not tested\n", to);
        skip();
    }
    struct sbx *x = mk(64, 0);
    assert_int_equal(sh(x, "echo kept > /root/f", NULL, 0), 0);
    int xp[64];
    int nxp = sb_pids(x->rid, xp, 64);
    assert_true(nxp >= 1);
    dsec_container_ops.detach(ct, x->h);
    x->h = NULL;
    dsec_container_ops.fini(ct);
    ct = NULL;
    char key[32], path[64];
    snprintf(key, sizeof key, "%s_path", CT_RUNTIME);
    snprintf(path, sizeof path, "/nonexistent/%s", CT_RUNTIME);
    assert_int_equal(open_backend_with(to, key, path), 0);
    dsec_err err;
    assert_int_equal(dsec_container_ops.adopt(ct, NULL, x->bstate, &x->h, &err), -1);
    assert_null(x->h);
    printf("container: adopt without the runtime that started it: %s\n", err.msg);
    assert_int_equal(err.code, DSEC_E_CONFIG);
    char want[128];
    snprintf(want, sizeof want, "was started by %s, which this node cannot run", CT_RUNTIME);
    assert_non_null(strstr(err.msg, want));
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, key));
    snprintf(want, sizeof want, "apt-get install %s", CT_RUNTIME);
    assert_non_null(strstr(err.msg, want));
    assert_non_null(strstr(err.msg, "left as it is"));
    /* the sweep (at this create) leaves it: files, cgroup, processes, runtime state */
    struct sbx *q = mk(64, 0);
    assert_int_equal(access(x->bstate, F_OK), 0);
    char p[512];
    snprintf(p, sizeof p, "%s/upper/sb/%s/upper/root/f", state_dir, x->id);
    assert_string_equal(slurp(p), "kept\n");
    snprintf(p, sizeof p, "%s/run/%s", state_dir, x->rid);
    assert_int_equal(access(p, F_OK), 0);
    for (int i = 0; i < nxp; i++) {
        snprintf(p, sizeof p, "/proc/%d", xp[i]);
        assert_int_equal(access(p, F_OK), 0);
    }
    drop(q);
    dsec_container_ops.fini(ct);
    ct = NULL;
    /* with the runtime there again: adopted, as it was */
    assert_int_equal(open_backend(), 0);
    if (dsec_container_ops.adopt(ct, NULL, x->bstate, &x->h, &err) < 0)
        fail_msg("adopt once %s is back: %s", CT_RUNTIME, err.msg);
    char out[64];
    assert_int_equal(sh(x, "cat /root/f", out, sizeof out), 0);
    assert_string_equal(out, "kept\n");
    drop(x);
}

/* ---- terminals and shell sessions ----------------------------------------------------------
 */

/* A proc_follow_start waited for here. */
struct follow_wait {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    int rc;
    dsec_proc_output out;
    dsec_err err;
};

static void follow_done(void *ud, int rc, dsec_proc_output *out, dsec_err *err)
{
    struct follow_wait *w = ud;
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    if (out != NULL)
        w->out = *out;
    if (rc < 0)
        w->err = *err;
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

/* Follow process handle of s from out_off for up to wait_ms; the rc (w->out filled on 0). */
static int follow(struct sbx *s, dsec_loop *loop, uint64_t handle, uint64_t out_off,
                  uint32_t wait_ms, struct follow_wait *w)
{
    *w = (struct follow_wait){.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    dsec_err err;
    if (dsec_container_ops.proc_follow_start(ct, s->h, handle, out_off, 0, 0, wait_ms, loop,
                                             follow_done, w, &err) < 0)
        fail_msg("follow %" PRIu64 ": %s", handle, err.msg);
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        pthread_cond_wait(&w->cond, &w->mu);
    pthread_mutex_unlock(&w->mu);
    return w->rc;
}

/* How many bytes process h of s wrote to stdout so far. */
static uint64_t out_total(struct sbx *s, uint64_t h)
{
    dsec_proc_info *v = NULL;
    size_t n = 0;
    dsec_err err;
    if (dsec_container_ops.proc_list(ct, s->h, &v, &n, &err) < 0)
        fail_msg("list processes: %s", err.msg);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (v[i].handle == h)
            total = v[i].out_total;
    dsec_free(v);
    return total;
}

/* Output of a terminal from off until want shows, following (each wait ends on output). */
static bool follow_until(struct sbx *s, dsec_loop *loop, uint64_t h, uint64_t off, const char *want,
                         char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < 50 && strstr(buf, want) == NULL; i++) {
        struct follow_wait w;
        if (follow(s, loop, h, off, 2000, &w) < 0)
            fail_msg("follow: %s", w.err.msg);
        size_t k = w.out.out_len < size - 1 - n ? w.out.out_len : size - 1 - n;
        memcpy(buf + n, w.out.out ? (const char *)w.out.out : "", k);
        n += k;
        buf[n] = 0;
        off = w.out.out_from + w.out.out_len;
        bool ended = !w.out.info.running;
        dsec_proc_output_release(&w.out);
        if (ended)
            break;
    }
    return strstr(buf, want) != NULL;
}

/* Through the backend: a session's commands keep the shell's state (busybox's sh here), a
 * process on a terminal is resized and typed to, proc_follow_start wakes on output on a
 * connection of its own, and ends with an error when the sandbox goes under it. */
static void test_sessions_terminals(void **state)
{
    struct sbx *s = mk(0, 0);
    dsec_err err;
    dsec_loop *loop = NULL;
    assert_int_equal(dsec_loop_new(&loop, "ct-test", &err), 0);

    dsec_proc_start_req sreq = {.session = true};
    dsec_proc_info info;
    if (dsec_container_ops.proc_start(ct, s->h, &sreq, &info, &err) < 0)
        fail_msg("start a session: %s", err.msg);
    assert_true(info.session);
    uint64_t sess = info.handle;
    const char *lines[] = {"cd /tmp; X=3", "echo $X; pwd; echo e >&2; (exit 4)"};
    dsec_exec_result res;
    for (int i = 0; i < 2; i++) {
        const char *argv[] = {lines[i], NULL};
        dsec_exec_req req = {.argv = argv, .argc = 1, .session = sess, .timeout_ms = 10000};
        if (dsec_container_ops.exec(ct, s->h, &req, &res, &err) < 0)
            fail_msg("session exec %s: %s", lines[i], err.msg);
        if (i == 1) {
            assert_int_equal(res.exit_code, 4);
            assert_int_equal(res.stdout_len, 7);
            assert_memory_equal(res.stdout_data, "3\n/tmp\n", 7);
            assert_int_equal(res.stderr_len, 2);
            assert_false(res.session_ended || res.interrupted || res.timed_out);
        }
        dsec_exec_result_release(&res);
    }
    /* a command that outlives its wait: timed out, the session on */
    const char *slow[] = {"sleep 100", NULL};
    dsec_exec_req sl = {.argv = slow, .argc = 1, .session = sess, .timeout_ms = 300};
    assert_int_equal(dsec_container_ops.exec(ct, s->h, &sl, &res, &err), 0);
    assert_true(res.timed_out);
    assert_false(res.session_ended);
    dsec_exec_result_release(&res);

    /* a terminal */
    const char *sh_i[] = {"/bin/sh", "-i", NULL};
    dsec_backend_kv env[] = {{"PS1", "$ "}};
    dsec_proc_start_req treq = {.exec = {.argv = sh_i, .argc = 2, .env = env, .nenv = 1},
                                .pty = true};
    if (dsec_container_ops.proc_start(ct, s->h, &treq, &info, &err) < 0)
        fail_msg("start on a terminal: %s", err.msg);
    assert_true(info.pty);
    uint64_t tty = info.handle;
    static char buf[1 << 16];
    assert_true(follow_until(s, loop, tty, 0, "$ ", buf, sizeof buf)); /* the prompt */
    assert_int_equal(dsec_container_ops.proc_resize(ct, s->h, tty, 40, 100, &err), 0);
    uint64_t off = out_total(s, tty);
    assert_true(off > 0);
    assert_int_equal(dsec_container_ops.proc_stdin(ct, s->h, tty, "stty size\n", 10, false, &err),
                     0);
    if (!follow_until(s, loop, tty, off, "40 100", buf, sizeof buf))
        fail_msg("the terminal's new size: %s", buf);

    /* a follow that waits for output, and one the sandbox's end cuts short */
    uint64_t late = sh_bg(ct, s->h, "sleep 0.5; echo late; sleep 100");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct follow_wait w;
    assert_int_equal(follow(s, loop, late, 0, 10000, &w), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    assert_true(took > 0.3 && took < 5);
    assert_int_equal(w.out.out_len, 5);
    assert_memory_equal(w.out.out, "late\n", 5);
    dsec_proc_output_release(&w.out);
    w = (struct follow_wait){.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    assert_int_equal(dsec_container_ops.proc_follow_start(ct, s->h, late, 5, 0, 0, 60000, loop,
                                                          follow_done, &w, &err),
                     0);
    drop(s);
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cond, &w.mu);
    pthread_mutex_unlock(&w.mu);
    assert_int_equal(w.rc, -1);
    dsec_loop_free(loop);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_cgroup_favordynmods, need_root),
        cmocka_unit_test_setup(test_runtime_memfd, need_root),
        cmocka_unit_test_setup(test_rootfs_private, need_root),
        cmocka_unit_test_setup(test_exec_and_files, need_root),
        cmocka_unit_test_setup(test_stop_on_loop, need_root),
        cmocka_unit_test_setup(test_create_on_loop, need_root),
        cmocka_unit_test_setup(test_sessions_terminals, need_root),
        cmocka_unit_test_setup(test_limits, need_root),
        cmocka_unit_test_setup(test_layer_immutable, need_root),
        cmocka_unit_test_setup(test_fork, need_root),
        cmocka_unit_test_setup(test_snapshot_restore, need_root),
        cmocka_unit_test_setup(test_pause_resume, need_root),
        cmocka_unit_test_setup(test_parallel_creates, need_root),
        cmocka_unit_test_setup(test_failed_create, need_root),
        cmocka_unit_test_setup(test_crash_adopt, need_root),
        cmocka_unit_test_setup(test_agent_unresponsive_or_dead, need_root),
        cmocka_unit_test_setup(test_sweep, need_root),
        cmocka_unit_test_setup(test_disk_quota, need_root),
        cmocka_unit_test_setup(test_warm_pool, need_root),
        cmocka_unit_test_setup(test_runtime_missing, need_root),
        cmocka_unit_test_setup(test_runtime_switch, need_root),
        cmocka_unit_test_setup(test_adopt_meta_without_runtime, need_root),
        cmocka_unit_test_setup(test_runtime_not_installed, need_root),
    };
    /* Another runtime runs what depends on it; not the cgroup remount nor the disk quota
     * (the node's, whatever the runtime). */
    const struct CMUnitTest other_rt[] = {
        cmocka_unit_test_setup(test_runtime_memfd, need_root),
        cmocka_unit_test_setup(test_runtime_missing, need_root),
        cmocka_unit_test_setup(test_rootfs_private, need_root),
        cmocka_unit_test_setup(test_exec_and_files, need_root),
        cmocka_unit_test_setup(test_stop_on_loop, need_root),
        cmocka_unit_test_setup(test_create_on_loop, need_root),
        cmocka_unit_test_setup(test_limits, need_root),
        cmocka_unit_test_setup(test_layer_immutable, need_root),
        cmocka_unit_test_setup(test_fork, need_root),
        cmocka_unit_test_setup(test_snapshot_restore, need_root),
        cmocka_unit_test_setup(test_pause_resume, need_root),
        cmocka_unit_test_setup(test_parallel_creates, need_root),
        cmocka_unit_test_setup(test_failed_create, need_root),
        cmocka_unit_test_setup(test_crash_adopt, need_root),
        cmocka_unit_test_setup(test_sweep, need_root),
        cmocka_unit_test_setup(test_warm_pool, need_root),
        cmocka_unit_test_setup(test_cold, need_root),
        cmocka_unit_test_setup(test_runtime_switch, need_root),
        cmocka_unit_test_setup(test_adopt_meta_without_runtime, need_root),
        cmocka_unit_test_setup(test_runtime_not_installed, need_root),
    };
    /* DSEC_TEST_FILTER=test_fork (a cmocka pattern) runs only what matches */
    if (getenv("DSEC_TEST_FILTER") != NULL)
        cmocka_set_test_filter(getenv("DSEC_TEST_FILTER"));
    if (strcmp(CT_RUNTIME, "crun") != 0)
        return cmocka_run_group_tests_name("container_" CT_RUNTIME, other_rt, group_setup,
                                           group_teardown);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
