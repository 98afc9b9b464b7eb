/* test_vm.c - the QEMU backends for real under TCG (or KVM): boot a busybox layer, exec and files
 * through the agent, snapshot and restore, fork with shared guest RAM, pause, adopt, q35, cleanup.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <setjmp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/backend.h"
#include "backends/loop.h"
#include "backends/layers/layer-cache.h"
#include "backends/net/net.h"
#include "backends/vm/vm.h"
#include "dsec/alloc.h"
#include "dsec/err.h"
#include "dsec/layers.h"

#ifndef DSEC_VMKIT_DIR
#define DSEC_VMKIT_DIR ""
#endif

/*
 * Boots are the cost here (seconds each under TCG), so one microvm from
 * the busybox layer serves most checks, and its snapshot and fork give the
 * clones; one q35 VM boots on no layers at all. Every test ends by checking
 * that nothing of its sandboxes is left: no QEMU naming the state dir, no
 * directory, no fork snapshot.
 */

static void *mvm; /* the microvm instance */
static dsec_layer_registry *reg;
static char top[64];
static char state_dir[96], state_q35[96];
static char kit[PATH_MAX] = DSEC_VMKIT_DIR;
static int seq;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

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

static int open_vm(const dsec_backend_ops *ops, const char *sd, const char *kitdir, void **out,
                   dsec_err *err)
{
    dsec_backend_kv opts[] = {{"vm_kit", kitdir}, {"container.pids_max", "64"}};
    dsec_backend_config cfg = {
        .state_dir = sd, .node = "vmtest", .opts = opts, .nopts = 2, .layers = reg};
    return ops->init(out, &cfg, err);
}

/* The busybox base layer and environment "busybox:1". */
static int build_base(void)
{
    if (host(NULL, 0,
             "set -e; t=%s/tree; mkdir -p $t/bin $t/etc $t/proc $t/sys $t/dev $t/tmp $t/root; "
             "cp /bin/busybox $t/bin/busybox; for a in $(/bin/busybox --list); do "
             "[ \"$a\" = busybox ] || ln -s busybox $t/bin/$a; done; "
             "printf 'root:x:0:0:root:/root:/bin/sh\\n' > $t/etc/passwd; "
             "printf 'root:x:0:\\n' > $t/etc/group; chmod 1777 $t/tmp",
             top) != 0)
        return -1;
    char tree[128], blob[128], regdir[128];
    snprintf(tree, sizeof tree, "%s/tree", top);
    snprintf(blob, sizeof blob, "%s/base.blob", top);
    snprintf(regdir, sizeof regdir, "%s/registry", top);
    dsec_digest d;
    dsec_err err;
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
    (void)state;
    char out[256];
    if (geteuid() != 0) {
        fprintf(stderr, "test_vm: needs root; skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    if (host(out, sizeof out, "command -v qemu-system-x86_64") != 0) {
        fprintf(stderr, "test_vm: qemu-system-x86_64 is not installed (apt-get install "
                        "qemu-system-x86); skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    char k[PATH_MAX + 16];
    snprintf(k, sizeof k, "%s/vmlinuz", kit);
    if (kit[0] == '\0' || access(k, R_OK) != 0) {
        fprintf(stderr, "test_vm: no VM kit in \"%s\" (build target vmkit); skipping\n", kit);
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    snprintf(top, sizeof top, "/tmp/dsec-vmtest-XXXXXX");
    if (mkdtemp(top) == NULL)
        return -1;
    snprintf(state_dir, sizeof state_dir, "%s/state", top);
    snprintf(state_q35, sizeof state_q35, "%s/state-q35", top);
    if (build_base() < 0)
        return -1;
    dsec_err err;
    if (open_vm(&dsec_microvm_ops, state_dir, kit, &mvm, &err) < 0) {
        fprintf(stderr, "microvm backend: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* The QEMU processes (not zombies) that name dir in their command line: their count, and
 * up to max of their pids into pids (may be NULL). */
static int qemu_pids(const char *dir, long *pids, int max)
{
    DIR *d = opendir("/proc");
    assert_non_null(d);
    char needle[PATH_MAX];
    snprintf(needle, sizeof needle, "%s/", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        char p[300], buf[1 << 15];
        snprintf(p, sizeof p, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(p, "r");
        if (f == NULL)
            continue;
        size_t got = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[got] = '\0';
        char *rp = strrchr(buf, ')');
        if (strstr(buf, "(qemu-system") == NULL || rp == NULL || rp[2] == 'Z')
            continue;
        snprintf(p, sizeof p, "/proc/%s/cmdline", e->d_name);
        if ((f = fopen(p, "r")) == NULL)
            continue;
        got = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t i = 0; i < got; i++)
            if (buf[i] == '\0')
                buf[i] = ' ';
        buf[got] = '\0';
        if (strstr(buf, needle) == NULL)
            continue;
        if (pids != NULL && n < max)
            pids[n] = strtol(e->d_name, NULL, 10);
        n++;
    }
    closedir(d);
    return n;
}

/* How many QEMU processes (not zombies) name dir in their command line. */
static int procs_naming(const char *dir)
{
    return qemu_pids(dir, NULL, 0);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* QEMU pid's mount namespace and root are its own: a read-only root holding its sandbox's
 * directory, disk and RAM, but not the host's files, /tmp, other sandboxes or the layer cache. */
static void assert_qemu_jailed(long pid, const char *id)
{
    char p[PATH_MAX + 64], mine[64] = "", its[64] = "";
    snprintf(p, sizeof p, "/proc/%ld/ns/mnt", pid);
    assert_true(readlink("/proc/self/ns/mnt", mine, sizeof mine - 1) > 0);
    assert_true(readlink(p, its, sizeof its - 1) > 0);
    if (strcmp(mine, its) == 0)
        fail_msg("QEMU %ld of %s shares the host's mount namespace (%s)", pid, id, its);
    struct stat host_root, root;
    snprintf(p, sizeof p, "/proc/%ld/root/", pid);
    assert_int_equal(stat("/", &host_root), 0);
    assert_int_equal(stat(p, &root), 0);
    if (root.st_dev == host_root.st_dev && root.st_ino == host_root.st_ino)
        fail_msg("QEMU %ld of %s has the host's root", pid, id);
    /* the host's directories are not there, but for the ways down to what the jail binds
     * (the test's state directory is under /tmp, and so is the kit, kernel and initrd, in a
     * build tree cloned there): then they hold those names and nothing else */
    const char *absent[] = {"etc", "tmp", "home", "var", "root", "sys", "proc", "run"};
    const char *ways[] = {state_dir, kit};
    for (size_t i = 0; i < sizeof absent / sizeof *absent; i++) {
        size_t l = strlen(absent[i]);
        snprintf(p, sizeof p, "/proc/%ld/root/%s", pid, absent[i]);
        bool on_way = false;
        for (size_t w = 0; w < sizeof ways / sizeof *ways; w++)
            on_way = on_way || (strncmp(ways[w] + 1, absent[i], l) == 0 && ways[w][l + 1] == '/');
        if (!on_way) {
            if (access(p, F_OK) == 0 || errno != ENOENT)
                fail_msg("QEMU %ld of %s sees /%s", pid, id, absent[i]);
            continue;
        }
        DIR *d = opendir(p);
        assert_non_null(d);
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            bool expected = false;
            for (size_t w = 0; w < sizeof ways / sizeof *ways && !expected; w++) {
                if (strncmp(ways[w] + 1, absent[i], l) != 0 || ways[w][l + 1] != '/')
                    continue;
                const char *next = ways[w] + l + 2;
                size_t nl = strcspn(next, "/");
                expected = strlen(e->d_name) == nl && strncmp(e->d_name, next, nl) == 0;
            }
            if (!expected)
                fail_msg("QEMU %ld of %s sees /%s/%s", pid, id, absent[i], e->d_name);
        }
        closedir(d);
    }
    snprintf(p, sizeof p, "/proc/%ld/root/etc/passwd", pid);
    assert_int_equal(access(p, F_OK), -1);
    /* its own directory is there; no other sandbox's, no layer cache */
    snprintf(p, sizeof p, "/proc/%ld/root%s/sb/%s/disk.img", pid, state_dir, id);
    assert_int_equal(access(p, F_OK), 0);
    snprintf(p, sizeof p, "/proc/%ld/root%s/layers", pid, state_dir);
    assert_int_equal(access(p, F_OK), -1);
    snprintf(p, sizeof p, "/proc/%ld/root%s/sb", pid, state_dir);
    DIR *d = opendir(p);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' && strcmp(e->d_name, id) != 0)
            fail_msg("QEMU %ld of %s sees sandbox %s", pid, id, e->d_name);
    closedir(d);
    /* the root itself is read-only */
    snprintf(p, sizeof p, "/proc/%ld/mountinfo", pid);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    char line[1024], mnt[512], opts[256];
    bool ro = false;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%*s %*s %*s %*s %511s %255s", mnt, opts) == 2 && strcmp(mnt, "/") == 0)
            ro = strncmp(opts, "ro,", 3) == 0 || strcmp(opts, "ro") == 0;
    fclose(f);
    if (!ro)
        fail_msg("QEMU %ld of %s: its root is writable", pid, id);
}

/* The QEMU of sandbox id runs as uid and gid 1600000000 + its pid (vm_uid_base's default),
 * with no capabilities, no_new_privs and its seccomp filter on, in a root of its own, detached:
 * not a child of the node manager (this test), in another session. */
static void assert_qemu_confined(const char *id)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/sb/%s", state_dir, id);
    long pid = 0;
    assert_int_equal(qemu_pids(dir, &pid, 1), 1);
    unsigned long want = 1600000000ul + (unsigned long)pid;
    char p[64];
    snprintf(p, sizeof p, "/proc/%ld/status", pid);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    unsigned long ids[2][4] = {{0}};
    char cap[32] = "", nnp[8] = "", sec[8] = "";
    char line[256];
    long ppid = 0;
    while (fgets(line, sizeof line, f)) {
        sscanf(line, "PPid: %ld", &ppid);
        sscanf(line, "Uid: %lu %lu %lu %lu", &ids[0][0], &ids[0][1], &ids[0][2], &ids[0][3]);
        sscanf(line, "Gid: %lu %lu %lu %lu", &ids[1][0], &ids[1][1], &ids[1][2], &ids[1][3]);
        sscanf(line, "CapEff: %31s", cap);
        sscanf(line, "NoNewPrivs: %7s", nnp);
        sscanf(line, "Seccomp: %7s", sec);
    }
    fclose(f);
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++)
            if (ids[k][i] != want)
                fail_msg("QEMU %ld of %s: %s %d is %lu, want %lu", pid, id, k ? "gid" : "uid", i,
                         ids[k][i], want);
    assert_string_equal(cap, "0000000000000000");
    assert_string_equal(nnp, "1");
    assert_string_equal(sec, "2");
    pid_t sid = getsid((pid_t)pid);
    if (ppid <= 0 || ppid == (long)getpid() || sid < 0 || sid == getsid(0))
        fail_msg("QEMU %ld of %s is not detached: parent %ld (the test is %ld), session %ld", pid,
                 id, ppid, (long)getpid(), (long)sid);
    assert_qemu_jailed(pid, id);
}

static int group_teardown(void **state)
{
    (void)state;
    int rc = 0;
    if (mvm != NULL) {
        dsec_microvm_ops.fini(mvm);
        mvm = NULL;
        if (procs_naming(state_dir) != 0) {
            fprintf(stderr, "test_vm: QEMU processes outlived the backend\n");
            /* only this run's; "[q]" keeps pkill off its own shell */
            host(NULL, 0, "pkill -9 -f '[q]emu-system.*%s/'", state_dir);
            rc = -1;
        }
        char out[4096];
        host(out, sizeof out, "grep -c ' %s' /proc/self/mountinfo", state_dir);
        if (atoi(out) != 0) {
            fprintf(stderr, "test_vm: %s mounts outlived the backend\n", out);
            rc = -1;
        }
        host(out, sizeof out,
             "for m in $(grep ' %s' /proc/self/mountinfo | cut -d' ' -f5); "
             "do umount -l $m; done",
             state_dir);
    }
    dsec_layer_registry_free(reg);
    if (top[0] != '\0' && host(NULL, 0, "rm -rf '%s'", top) != 0)
        rc = -1;
    return rc;
}

static int need_vm(void **state)
{
    (void)state;
    if (mvm == NULL)
        skip();
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------ */

struct sbx {
    const dsec_backend_ops *ops;
    void *be;
    dsec_sandbox *h;
    char *bstate;
    char id[64];
};

static struct sbx *sbx_new(const dsec_backend_ops *ops, void *be, const char *tag)
{
    struct sbx *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->ops = ops;
    s->be = be;
    snprintf(s->id, sizeof s->id, "vmt-%s-%d-%d", tag, (int)getpid(),
             __atomic_add_fetch(&seq, 1, 0));
    return s;
}

static struct sbx *mk(const dsec_backend_ops *ops, void *be, const char *env)
{
    struct sbx *s = sbx_new(ops, be, "c");
    dsec_sandbox_spec spec = {.id = s->id, .type = ops->type, .env = env};
    dsec_err err;
    uint64_t t0 = now_ms();
    if (ops->create(be, &spec, &s->h, &s->bstate, &err) < 0)
        fail_msg("create %s: %s", s->id, err.msg);
    fprintf(stderr, "test_vm: %s booted in %" PRIu64 " ms\n", s->id, now_ms() - t0);
    return s;
}

/* Run a shell line; the exit code, stdout in out (may be NULL). */
static int sh(struct sbx *s, const char *line, char *out, size_t len)
{
    const char *argv[] = {"/bin/sh", "-c", line};
    dsec_exec_req req = {.argv = argv, .argc = 3, .timeout_ms = 60000};
    dsec_exec_result res = {0};
    dsec_err err;
    if (s->ops->exec(s->be, s->h, &req, &res, &err) < 0)
        fail_msg("exec \"%s\" in %s: %s", line, s->id, err.msg);
    if (out != NULL) {
        snprintf(out, len, "%.*s", (int)res.stdout_len,
                 res.stdout_data ? (char *)res.stdout_data : "");
        size_t n = strlen(out);
        while (n > 0 && out[n - 1] == '\n')
            out[--n] = '\0';
    }
    int rc = res.signal ? 128 + res.signal : res.exit_code;
    dsec_exec_result_release(&res);
    return rc;
}

static void put_file(struct sbx *s, const char *path, const char *data)
{
    dsec_err err;
    if (s->ops->file_write(s->be, s->h, path, data, strlen(data), 0644, false, &err) < 0)
        fail_msg("write %s in %s: %s", path, s->id, err.msg);
}

static pid_t qemu_pid(const struct sbx *s)
{
    char p[PATH_MAX], out[64];
    snprintf(p, sizeof p, "%s/meta", s->bstate);
    host(out, sizeof out, "awk '$1==\"pid\"{print $2}' '%s'", p);
    return (pid_t)atoi(out);
}

static void destroy(struct sbx *s)
{
    dsec_err err;
    if (s->ops->destroy(s->be, s->h, &err) < 0)
        fail_msg("destroy %s: %s", s->id, err.msg);
    /* nothing of it is left: no QEMU naming its dir, no dir */
    assert_int_equal(procs_naming(s->bstate), 0);
    assert_int_not_equal(access(s->bstate, F_OK), 0);
    free(s->bstate);
    free(s);
}

/* Rss and Pss (KiB) of the mapping of a file named `name` in pid; whole-process RSS in *total. */
static void mapping_kb(pid_t pid, const char *name, long *rss, long *pss, long *total)
{
    char p[64], line[512];
    snprintf(p, sizeof p, "/proc/%d/smaps", (int)pid);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    *rss = *pss = *total = 0;
    bool in = false;
    while (fgets(line, sizeof line, f) != NULL) {
        long v;
        size_t hx = strspn(line, "0123456789abcdef");
        if (hx > 0 && line[hx] == '-') { /* a mapping's header line */
            size_t n = strlen(line);
            while (n > 0 && line[n - 1] == '\n')
                line[--n] = '\0';
            in = n >= strlen(name) && strcmp(line + n - strlen(name), name) == 0;
            continue;
        }
        if (sscanf(line, "Rss: %ld kB", &v) == 1) {
            *total += v;
            if (in)
                *rss += v;
        } else if (in && sscanf(line, "Pss: %ld kB", &v) == 1) {
            *pss += v;
        }
    }
    fclose(f);
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_bad_input(void **state)
{
    (void)state;
    dsec_err err;
    /* a kit without a kernel: a clear error at init */
    char emptykit[128], sd[128];
    snprintf(emptykit, sizeof emptykit, "%s/emptykit", top);
    snprintf(sd, sizeof sd, "%s/state-bad", top);
    mkdir(emptykit, 0700);
    void *be = NULL;
    assert_int_equal(open_vm(&dsec_microvm_ops, sd, emptykit, &be, &err), -1);
    assert_null(be);
    assert_non_null(strstr(err.msg, "vmlinuz"));
    assert_non_null(strstr(err.msg, "make"));
    /* an unknown option of our own */
    dsec_backend_kv bad[] = {{"microvm.bogus", "1"}};
    dsec_backend_config cfg = {.state_dir = sd, .opts = bad, .nopts = 1, .layers = reg};
    assert_int_equal(dsec_microvm_ops.init(&be, &cfg, &err), -1);
    assert_non_null(strstr(err.msg, "microvm.bogus"));
    /* a missing QEMU */
    dsec_backend_kv noq[] = {{"qemu", "/nonexistent/qemu"}, {"vm_kit", kit}};
    cfg.opts = noq;
    cfg.nopts = 2;
    assert_int_equal(dsec_microvm_ops.init(&be, &cfg, &err), -1);
    assert_non_null(strstr(err.msg, "apt-get install qemu-system-x86"));

    /* 1 MiB of memory */
    dsec_sandbox *h = NULL;
    char *bs = NULL;
    dsec_sandbox_spec spec = {.id = "vmt-bad-mem", .env = "busybox:1", .memory_mb = 1};
    assert_int_equal(dsec_microvm_ops.create(mvm, &spec, &h, &bs, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "memory_mb 1 "));
    /* a layer digest nobody has */
    const char *missing[] = {
        "sha256:0000000000000000000000000000000000000000000000000000000000000000"};
    dsec_sandbox_spec spec2 = {.id = "vmt-bad-layer", .layers = missing, .nlayers = 1};
    assert_int_equal(dsec_microvm_ops.create(mvm, &spec2, &h, &bs, &err), -1);
    assert_non_null(strstr(err.msg, missing[0]));
    char p[256];
    snprintf(p, sizeof p, "%s/sb/vmt-bad-layer", state_dir);
    assert_int_not_equal(access(p, F_OK), 0);
    /* QEMU's root cannot be built (S/jail is gone): the start fails naming the step and the
     * path, and leaves nothing behind */
    snprintf(p, sizeof p, "%s/jail", state_dir);
    assert_int_equal(rmdir(p), 0);
    dsec_sandbox_spec spec4 = {.id = "vmt-bad-jail", .env = "busybox:1"};
    int rc = dsec_microvm_ops.create(mvm, &spec4, &h, &bs, &err);
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(rc, -1);
    if (strstr(err.msg, "mounting QEMU's root") == NULL || strstr(err.msg, p) == NULL)
        fail_msg("create without S/jail: %s", err.msg);
    snprintf(p, sizeof p, "%s/sb/vmt-bad-jail", state_dir);
    assert_int_not_equal(access(p, F_OK), 0);
    assert_int_equal(procs_naming(state_dir), 0);
    /* a restore from a directory that holds no snapshot */
    dsec_sandbox_spec spec3 = {.id = "vmt-bad-restore"};
    assert_int_equal(dsec_microvm_ops.restore(mvm, &spec3, top, &h, &bs, &err), -1);
    assert_non_null(strstr(err.msg, "meta"));
    snprintf(p, sizeof p, "%s/sb/vmt-bad-restore", state_dir);
    assert_int_not_equal(access(p, F_OK), 0);
    /* a relative path */
    assert_int_equal(dsec_microvm_ops.restore(mvm, &spec3, "snap", &h, &bs, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "absolute"));
}

/* One VM for the lot: exec, files, stats, snapshot + restore, fork with shared RAM, pause,
 * adopt. */
static void test_microvm(void **state)
{
    (void)state;
    char out[4096], out2[512], mid_a[64], mid[64];
    dsec_err err;
    struct sbx *a = mk(&dsec_microvm_ops, mvm, "busybox:1");
    /* a guest that breaks out of the emulator is an unprivileged process of its own */
    assert_qemu_confined(a->id);

    /* exec: the environment's variables, workdir, the layer's busybox, a kernel of its own */
    assert_int_equal(sh(a, "echo $DSEC_TEST $HOME; pwd; uname -r", out, sizeof out), 0);
    assert_non_null(strstr(out, "yes /root"));
    assert_non_null(strstr(out, "cloud-amd64"));
    assert_int_equal(sh(a, "exit 7", NULL, 0), 7);
    assert_int_equal(sh(a, "hostname", out, sizeof out), 0);
    assert_string_equal(out, a->id);
    assert_int_equal(sh(a, "cat /etc/machine-id", mid_a, sizeof mid_a), 0);
    assert_int_equal(strlen(mid_a), 32);
    /* the clock was set at boot (the machine has no RTC: it would read 1970) */
    assert_int_equal(sh(a, "date +%s", out, sizeof out), 0);
    assert_true(llabs(atoll(out) - (long long)time(NULL)) < 600);
    /* /init loaded what this VM needs (layers: erofs), not the NIC's driver (no network) */
    assert_int_equal(sh(a, "cut -d' ' -f1 /proc/modules", out, sizeof out), 0);
    assert_non_null(strstr(out, "erofs"));
    assert_non_null(strstr(out, "virtio_blk"));
    assert_null(strstr(out, "virtio_net"));
    /* the agent's tools are read-only to the sandbox */
    assert_true(sh(a, "touch /.dsec/x 2>/dev/null", NULL, 0) != 0);
    assert_int_equal(sh(a, "test -x /.dsec/dsec-agent && test -x /.dsec/busybox", NULL, 0), 0);

    /* files through the agent */
    put_file(a, "/root/note", "before the snapshot\n");
    dsec_file_data fd = {0};
    if (dsec_microvm_ops.file_read(mvm, a->h, "/root/note", 0, 0, &fd, &err) < 0)
        fail_msg("read: %s", err.msg);
    assert_int_equal(fd.len, 20);
    assert_memory_equal(fd.data, "before the snapshot\n", 20);
    dsec_free(fd.data);
    dsec_file_entry *ents = NULL;
    size_t n = 0;
    if (dsec_microvm_ops.file_list(mvm, a->h, "/root", &ents, &n, &err) < 0)
        fail_msg("list: %s", err.msg);
    bool found = false;
    for (size_t i = 0; i < n; i++)
        found = found || strcmp(ents[i].name, "note") == 0;
    dsec_file_entries_free(ents, n);
    assert_true(found);
    assert_int_equal(sh(a, "cat /root/note", out, sizeof out), 0);
    assert_string_equal(out, "before the snapshot");

    dsec_sandbox_stats st;
    if (dsec_microvm_ops.stats(mvm, a->h, &st, &err) < 0)
        fail_msg("stats: %s", err.msg);
    assert_true(st.cpu_used_us > 0);
    assert_true(st.memory_bytes > (16u << 20));
    assert_true(st.disk_bytes > 0);

    /* snapshot, then a restore sees the file; the original goes on on its own */
    /* QEMU never sees the path (the node hands it the open file), so a path a shell
     * would misread is fine */
    char snap[256];
    snprintf(snap, sizeof snap, "%s/snap 'it\"s' $(touch owned) `touch owned`", top);
    uint64_t t0 = now_ms();
    if (dsec_microvm_ops.snapshot(mvm, a->h, snap, NULL, &err) < 0)
        fail_msg("snapshot: %s", err.msg);
    fprintf(stderr, "test_vm: snapshot in %" PRIu64 " ms\n", now_ms() - t0);
    put_file(a, "/root/after", "after\n");
    struct sbx *b = sbx_new(&dsec_microvm_ops, mvm, "r");
    dsec_sandbox_spec rs = {.id = b->id, .type = "microvm"};
    t0 = now_ms();
    if (dsec_microvm_ops.restore(mvm, &rs, snap, &b->h, &b->bstate, &err) < 0)
        fail_msg("restore: %s", err.msg);
    fprintf(stderr, "test_vm: restore in %" PRIu64 " ms\n", now_ms() - t0);
    assert_qemu_confined(b->id);
    char owned[PATH_MAX];
    snprintf(owned, sizeof owned, "%s/sb/%s/owned", state_dir, a->id); /* QEMU's directory */
    assert_int_not_equal(access(owned, F_OK), 0);
    assert_int_equal(sh(b, "cat /root/note; hostname", out, sizeof out), 0);
    snprintf(out2, sizeof out2, "before the snapshot\n%s", b->id);
    assert_string_equal(out, out2);
    assert_int_not_equal(sh(b, "test -e /root/after", NULL, 0), 0);
    assert_int_equal(sh(b, "cat /etc/machine-id", mid, sizeof mid), 0);
    assert_int_equal(strlen(mid), 32);
    assert_string_not_equal(mid, mid_a);
    assert_int_equal(sh(a, "cat /root/after", out, sizeof out), 0);
    assert_string_equal(out, "after");
    /* another node (its own state, layer cache and images; the same registry) resumes the
     * snapshot too: the layer images it makes are the bytes the guest was reading */
    char sd2[128];
    snprintf(sd2, sizeof sd2, "%s/state-other-node", top);
    assert_int_equal(mkdir(sd2, 0700), 0);
    void *other = NULL;
    if (open_vm(&dsec_microvm_ops, sd2, kit, &other, &err) < 0)
        fail_msg("opening a second microvm instance: %s", err.msg);
    struct sbx *o = sbx_new(&dsec_microvm_ops, other, "o");
    dsec_sandbox_spec os = {.id = o->id, .type = "microvm"};
    if (dsec_microvm_ops.restore(other, &os, snap, &o->h, &o->bstate, &err) < 0)
        fail_msg("restore on another node: %s", err.msg);
    assert_int_equal(sh(o, "cat /root/note; hostname", out, sizeof out), 0);
    snprintf(out2, sizeof out2, "before the snapshot\n%s", o->id);
    assert_string_equal(out, out2);
    destroy(o);
    dsec_microvm_ops.fini(other);
    assert_int_equal(procs_naming(sd2), 0);

    /* the snapshot may go: the clone holds what it maps */
    assert_int_equal(nftw(snap, rm_entry, 16, FTW_DEPTH | FTW_PHYS), 0);
    assert_int_equal(sh(b, "echo still", out, sizeof out), 0);
    assert_string_equal(out, "still");

    /* fork(2): the parent's file in both, identities and writes of their own */
    struct sbx *c[2] = {sbx_new(&dsec_microvm_ops, mvm, "f"), sbx_new(&dsec_microvm_ops, mvm, "f")};
    const char *ids[2] = {c[0]->id, c[1]->id};
    dsec_sandbox *kids[2];
    char *kstates[2];
    t0 = now_ms();
    if (dsec_microvm_ops.fork(mvm, a->h, ids, 2, kids, kstates, &err) < 0)
        fail_msg("fork: %s", err.msg);
    fprintf(stderr, "test_vm: fork of 2 in %" PRIu64 " ms\n", now_ms() - t0);
    char mids[2][64];
    for (int i = 0; i < 2; i++) {
        c[i]->h = kids[i];
        c[i]->bstate = kstates[i];
        assert_int_equal(sh(c[i], "cat /root/note /root/after; hostname", out, sizeof out), 0);
        snprintf(out2, sizeof out2, "before the snapshot\nafter\n%s", c[i]->id);
        assert_string_equal(out, out2);
        assert_int_equal(sh(c[i], "cat /etc/machine-id", mids[i], sizeof mids[i]), 0);
        assert_string_not_equal(mids[i], mid_a);
    }
    assert_string_not_equal(mids[0], mids[1]);
    assert_qemu_confined(c[0]->id);
    put_file(c[0], "/root/only-c0", "c0\n");
    assert_int_equal(sh(c[0], "cat /root/only-c0", out, sizeof out), 0);
    assert_int_not_equal(sh(c[1], "test -e /root/only-c0", NULL, 0), 0);
    assert_int_not_equal(sh(a, "test -e /root/only-c0", NULL, 0), 0);
    /* the fork's snapshot is gone; the children hold its RAM file by links */
    host(out, sizeof out, "ls '%s/forks' | wc -l", state_dir);
    assert_int_equal(atoi(out), 0);

    /* the two children share the pages of the RAM file they both map */
    long rss[2], pss[2], total[2];
    for (int i = 0; i < 2; i++) {
        /* touch some memory in the guest first, so the numbers say something */
        assert_int_equal(sh(c[i], "cat /bin/busybox > /dev/null; sync", NULL, 0), 0);
        mapping_kb(qemu_pid(c[i]), "/base.mem", &rss[i], &pss[i], &total[i]);
        fprintf(stderr,
                "test_vm: clone %d guest RAM mapping: Rss %ld KiB, Pss %ld KiB; whole QEMU "
                "Rss %ld KiB\n",
                i, rss[i], pss[i], total[i]);
        assert_true(rss[i] > 8 * 1024);
        assert_true(pss[i] * 10 < rss[i] * 8);
    }

    /* pause frees QEMU; resume brings the same sandbox back */
    put_file(c[1], "/root/paused", "kept\n");
    pid_t before = qemu_pid(c[1]);
    if (dsec_microvm_ops.pause(mvm, c[1]->h, &err) < 0)
        fail_msg("pause: %s", err.msg);
    assert_int_equal(procs_naming(c[1]->bstate), 0);
    (void)before;
    dsec_exec_req req = {.argv = (const char *[]){"/bin/true"}, .argc = 1};
    dsec_exec_result res = {0};
    assert_int_equal(dsec_microvm_ops.exec(mvm, c[1]->h, &req, &res, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    t0 = now_ms();
    if (dsec_microvm_ops.resume(mvm, c[1]->h, &err) < 0)
        fail_msg("resume: %s", err.msg);
    fprintf(stderr, "test_vm: resume in %" PRIu64 " ms\n", now_ms() - t0);
    assert_int_equal(sh(c[1], "cat /root/paused; hostname", out, sizeof out), 0);
    snprintf(out2, sizeof out2, "kept\n%s", c[1]->id);
    assert_string_equal(out, out2);

    /* detach leaves QEMU running; adopt takes it back */
    pid_t pa = qemu_pid(a);
    dsec_microvm_ops.detach(mvm, a->h);
    a->h = NULL;
    assert_int_equal(kill(pa, 0), 0);
    dsec_sandbox_spec as = {.id = a->id, .type = "microvm"};
    if (dsec_microvm_ops.adopt(mvm, &as, a->bstate, &a->h, &err) < 0)
        fail_msg("adopt: %s", err.msg);
    assert_int_equal(sh(a, "cat /root/after", out, sizeof out), 0);
    assert_string_equal(out, "after");

    destroy(c[0]);
    destroy(c[1]);
    destroy(b);
    destroy(a);
    host(out, sizeof out, "ls '%s/sb' | wc -l", state_dir);
    assert_int_equal(atoi(out), 0);
}

/* How many layer images (and their sha256 files) the instance at sd holds. */
static int images_in(const char *sd)
{
    char out[64];
    host(out, sizeof out, "ls '%s/images' | grep -c '\\.erofs'", sd);
    return atoi(out);
}

/* A layer's image goes when the cache evicts the layer and no QEMU reads it: here the cache's
 * budget is one byte, so a layer goes as soon as no sandbox holds it. */
static void test_images_evicted(void **state)
{
    (void)state;
    char sd[128], cdir[160];
    snprintf(sd, sizeof sd, "%s/state-gc", top);
    snprintf(cdir, sizeof cdir, "%s/layers", sd);
    assert_int_equal(mkdir(sd, 0700), 0);
    /* the backend shares the node's cache: this one, opened first, sets its budget */
    dsec_layer_cache *cache = NULL;
    dsec_err err;
    if (dsec_layer_cache_share(&cache, cdir, 1, reg, &err) < 0)
        fail_msg("cache: %s", err.msg);
    void *be = NULL;
    if (open_vm(&dsec_microvm_ops, sd, kit, &be, &err) < 0)
        fail_msg("microvm backend: %s", err.msg);
    struct sbx *a = mk(&dsec_microvm_ops, be, "busybox:1");
    struct sbx *b = mk(&dsec_microvm_ops, be, "busybox:1");
    assert_int_equal(images_in(sd), 2); /* the image and its sha256 */
    /* b still runs on the layer: it stays, and so does its image */
    destroy(a);
    assert_int_equal(images_in(sd), 2);
    /* detached, b's QEMU runs on with no holder of the layer: the cache lets the layer go,
     * but the image QEMU reads stays */
    dsec_layer_cache_stats st;
    dsec_layer_cache_stats_get(cache, &st);
    uint64_t evicted = st.evictions;
    dsec_microvm_ops.detach(be, b->h);
    b->h = NULL;
    dsec_layer_cache_stats_get(cache, &st);
    assert_int_equal(st.evictions, evicted + 1);
    assert_int_equal(images_in(sd), 2);
    /* adopt takes the layer again (fetched anew) and finds the image */
    dsec_sandbox_spec as = {.id = b->id, .type = "microvm"};
    if (dsec_microvm_ops.adopt(be, &as, b->bstate, &b->h, &err) < 0)
        fail_msg("adopt: %s", err.msg);
    char out[64];
    assert_int_equal(sh(b, "echo still", out, sizeof out), 0);
    assert_string_equal(out, "still");
    /* the last user gone, the layer and its image go */
    destroy(b);
    dsec_layer_cache_stats_get(cache, &st);
    assert_int_equal(st.evictions, evicted + 2);
    assert_int_equal(images_in(sd), 0);
    dsec_microvm_ops.fini(be);
    dsec_layer_cache_free(cache);
    assert_int_equal(procs_naming(sd), 0);
}

/* The q35 machine boots the same kit, here on no layers (the initrd's busybox world). */
/* ---- boots on the loop (create_start) ------------------------------------------------------ */

struct booted {
    _Atomic bool ended;
    int rc;
    dsec_err err;
};

static void on_booted(void *ud, int rc, dsec_err *err)
{
    struct booted *b = ud;
    b->rc = rc;
    if (rc < 0)
        b->err = *err;
    atomic_store(&b->ended, true);
}

/* Three microVMs started on one loop: each start returns once QEMU runs, so the three boot at
 * once and no thread waits for any of them. Two come up and take calls; the third's QEMU is
 * killed mid-boot, which its wait reports (the guest stopped) instead of waiting out the
 * boot timeout; destroying it then leaves nothing. */
static void test_boot_on_loop(void **state)
{
    (void)state;
    dsec_err err;
    dsec_loop *loop = NULL;
    assert_int_equal(dsec_loop_new(&loop, "vm-test", &err), 0);
    struct sbx *s[3];
    struct booted b[3] = {0};
    for (int i = 0; i < 3; i++) {
        s[i] = sbx_new(&dsec_microvm_ops, mvm, "l");
        dsec_sandbox_spec spec = {.id = s[i]->id, .type = "microvm", .env = "busybox:1"};
        if (dsec_microvm_ops.create_start(mvm, &spec, loop, on_booted, &b[i], &s[i]->h,
                                          &s[i]->bstate, &err) < 0)
            fail_msg("create_start %s: %s", s[i]->id, err.msg);
        assert_non_null(s[i]->h);
        assert_non_null(s[i]->bstate);
    }
    /* a guest's boot takes seconds here: the first is still booting after the third started */
    assert_false(atomic_load(&b[0].ended));
    assert_int_equal(kill(qemu_pid(s[2]), SIGKILL), 0);
    uint64_t t0 = now_ms();
    for (int i = 0; i < 3; i++)
        while (!atomic_load(&b[i].ended) && now_ms() - t0 < 180000)
            usleep(20000);
    for (int i = 0; i < 3; i++)
        if (!atomic_load(&b[i].ended))
            fail_msg("%s: no answer from its boot in 180 s", s[i]->id);
    for (int i = 0; i < 2; i++) {
        if (b[i].rc != 0)
            fail_msg("boot %s: %s", s[i]->id, b[i].err.msg);
        char out[64];
        assert_int_equal(sh(s[i], "hostname", out, sizeof out), 0);
        assert_string_equal(out, s[i]->id);
    }
    assert_int_equal(b[2].rc, -1);
    if (strstr(b[2].err.msg, "the VM stopped before its agent answered") == NULL)
        fail_msg("a killed boot: %s", b[2].err.msg);
    for (int i = 0; i < 3; i++)
        destroy(s[i]);
    dsec_loop_free(loop);
}

/* A fork whose children settle on a loop: fork_start returns once the children's guests run
 * again, while their agents and identities are still to come, and the parent takes calls
 * meanwhile. The children answer with identities of their own and the parent's file. A child
 * whose QEMU dies before it settles fails the fork, and the children then destroy cleanly. */
static void test_fork_on_loop(void **state)
{
    (void)state;
    dsec_err err;
    dsec_loop *loop = NULL;
    assert_int_equal(dsec_loop_new(&loop, "vm-fork", &err), 0);
    struct sbx *p = mk(&dsec_microvm_ops, mvm, "busybox:1");
    put_file(p, "/root/mark", "from the parent\n");
    char out[256], mid_p[64];
    assert_int_equal(sh(p, "cat /etc/machine-id", mid_p, sizeof mid_p), 0);
    struct sbx *c[3];
    const char *ids[3];
    dsec_sandbox *kids[3];
    char *kstates[3];
    for (int i = 0; i < 3; i++) {
        c[i] = sbx_new(&dsec_microvm_ops, mvm, "fl");
        ids[i] = c[i]->id;
    }
    struct booted b = {0};
    uint64_t t0 = now_ms();
    if (dsec_microvm_ops.fork_start(mvm, p->h, ids, 2, loop, on_booted, &b, kids, kstates, &err) <
        0)
        fail_msg("fork_start: %s", err.msg);
    fprintf(stderr, "test_vm: fork_start of 2 returned in %" PRIu64 " ms\n", now_ms() - t0);
    /* the identities (a command in each guest, 0.3 s or more under TCG) are still to come */
    assert_false(atomic_load(&b.ended));
    assert_int_equal(sh(p, "echo parent-free", out, sizeof out), 0);
    assert_string_equal(out, "parent-free");
    while (!atomic_load(&b.ended) && now_ms() - t0 < 120000)
        usleep(10000);
    assert_true(atomic_load(&b.ended));
    fprintf(stderr, "test_vm: fork of 2 settled in %" PRIu64 " ms\n", now_ms() - t0);
    if (b.rc != 0)
        fail_msg("fork children: %s", b.err.msg);
    char mids[2][64];
    for (int i = 0; i < 2; i++) {
        c[i]->h = kids[i];
        c[i]->bstate = kstates[i];
        assert_int_equal(sh(c[i], "cat /root/mark; hostname", out, sizeof out), 0);
        char want[128];
        snprintf(want, sizeof want, "from the parent\n%s", c[i]->id);
        assert_string_equal(out, want);
        assert_int_equal(sh(c[i], "cat /etc/machine-id", mids[i], sizeof mids[i]), 0);
        assert_string_not_equal(mids[i], mid_p);
    }
    assert_string_not_equal(mids[0], mids[1]);
    for (int i = 0; i < 2; i++)
        destroy(c[i]);

    /* a child whose guest dies before it settles */
    b = (struct booted){0};
    if (dsec_microvm_ops.fork_start(mvm, p->h, &ids[2], 1, loop, on_booted, &b, kids, kstates,
                                    &err) < 0)
        fail_msg("fork_start: %s", err.msg);
    c[2]->h = kids[0];
    c[2]->bstate = kstates[0];
    assert_int_equal(kill(qemu_pid(c[2]), SIGKILL), 0);
    t0 = now_ms();
    while (!atomic_load(&b.ended) && now_ms() - t0 < 120000)
        usleep(10000);
    assert_true(atomic_load(&b.ended));
    assert_int_equal(b.rc, -1);
    if (strstr(b.err.msg, c[2]->id) == NULL)
        fail_msg("a child that died: the error does not name it: %s", b.err.msg);
    fprintf(stderr, "test_vm: a child killed mid-fork: %s\n", b.err.msg);
    destroy(c[2]);
    destroy(p);
    dsec_loop_free(loop);
}

/* A destroy's wait for QEMU to end, on a loop (stop_start): a running guest's QEMU quits at
 * once on the request; a QEMU that cannot answer (stopped with SIGSTOP here, as a hung one)
 * is killed after its grace, while the thread that asked has long gone back. Destroy then
 * finds nothing to wait for, and leaves no QEMU and no directory. */
static void test_stop_on_loop(void **state)
{
    (void)state;
    dsec_err err;
    dsec_loop *loop = NULL;
    assert_int_equal(dsec_loop_new(&loop, "vm-stop", &err), 0);
    struct sbx *s[2] = {mk(&dsec_microvm_ops, mvm, "busybox:1"),
                        mk(&dsec_microvm_ops, mvm, "busybox:1")};
    assert_int_equal(kill(qemu_pid(s[1]), SIGSTOP), 0);
    struct booted b[2] = {0};
    for (int i = 0; i < 2; i++) {
        int rc = dsec_microvm_ops.stop_start(mvm, s[i]->h, loop, on_booted, &b[i], &err);
        if (rc != 0)
            fail_msg("stop_start %s: rc %d: %s", s[i]->id, rc, rc < 0 ? err.msg : "");
    }
    /* the hung one's grace (3 s) is still to run */
    assert_false(atomic_load(&b[1].ended));
    uint64_t t0 = now_ms();
    for (int i = 0; i < 2; i++)
        while (!atomic_load(&b[i].ended) && now_ms() - t0 < 60000)
            usleep(10000);
    for (int i = 0; i < 2; i++) {
        assert_true(atomic_load(&b[i].ended));
        if (b[i].rc != 0)
            fail_msg("stop of %s: %s", s[i]->id, b[i].err.msg);
        assert_int_equal(procs_naming(s[i]->bstate), 0);
    }
    fprintf(stderr, "test_vm: a hung QEMU ended %" PRIu64 " ms after its stop began\n",
            now_ms() - t0);
    for (int i = 0; i < 2; i++)
        destroy(s[i]);
    dsec_loop_free(loop);
}

/* A microVM's process calls, from several threads at once on a guest whose second channel is
 * not open yet (the backend opened with the node's loop): one dials it, the others wait for
 * that dial and take its connection. The guest serves one connection on that channel, so a
 * second dial beside the first waited out its 2 s and failed the call. */
struct side_call {
    pthread_barrier_t *go;
    struct sbx *s;
    int rc;
    dsec_err err;
};

static void *side_list(void *ud)
{
    struct side_call *c = ud;
    pthread_barrier_wait(c->go);
    dsec_proc_info *v = NULL;
    size_t n = 0;
    c->rc = c->s->ops->proc_list(c->s->be, c->s->h, &v, &n, &c->err);
    (void)n;
    dsec_free(v);
    return NULL;
}

static void test_side_dial_once(void **state)
{
    (void)state;
    dsec_err err;
    dsec_loop *loop = NULL;
    assert_int_equal(dsec_loop_new(&loop, "vm-side", &err), 0);
    char sd[PATH_MAX];
    snprintf(sd, sizeof sd, "%s/state-side", top);
    dsec_backend_kv opts[] = {{"vm_kit", kit}};
    dsec_backend_config cfg = {
        .state_dir = sd, .node = "vmtest", .opts = opts, .nopts = 1, .layers = reg, .loop = loop};
    void *be = NULL;
    if (dsec_microvm_ops.init(&be, &cfg, &err) < 0)
        fail_msg("microvm backend with a loop: %s", err.msg);
    struct sbx *s = mk(&dsec_microvm_ops, be, "busybox:1");
    enum { N = 4 };
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, N);
    struct side_call c[N];
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        c[i] = (struct side_call){.go = &go, .s = s};
        assert_int_equal(pthread_create(&t[i], NULL, side_list, &c[i]), 0);
    }
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&go);
    for (int i = 0; i < N; i++)
        if (c[i].rc != 0)
            fail_msg("process list %d of %d at once, on a new guest: %s", i + 1, N, c[i].err.msg);
    destroy(s);
    dsec_microvm_ops.fini(be);
    dsec_loop_free(loop);
}

static void test_q35(void **state)
{
    (void)state;
    void *be = NULL;
    dsec_err err;
    if (open_vm(&dsec_vm_ops, state_q35, kit, &be, &err) < 0)
        fail_msg("vm backend: %s", err.msg);
    struct sbx *s = sbx_new(&dsec_vm_ops, be, "q");
    dsec_sandbox_spec spec = {.id = s->id, .type = "vm", .memory_mb = 256};
    uint64_t t0 = now_ms();
    if (dsec_vm_ops.create(be, &spec, &s->h, &s->bstate, &err) < 0)
        fail_msg("create q35: %s", err.msg);
    fprintf(stderr, "test_vm: q35 booted in %" PRIu64 " ms\n", now_ms() - t0);
    char out[1024];
    /* virtio devices on PCI (vendor 0x1af4), not on virtio-mmio */
    assert_int_equal(sh(s, "cat /sys/bus/pci/devices/*/vendor | grep -c 0x1af4", out, sizeof out),
                     0);
    assert_true(atoi(out) >= 2); /* virtio-serial and the disk */
    assert_int_equal(sh(s, "echo hello from q35 > /tmp/x; cat /tmp/x", out, sizeof out), 0);
    assert_string_equal(out, "hello from q35");
    /* no layers: the initrd's busybox world is the root, and /init loaded the PCI transport
     * but neither the layers' driver nor the NIC's */
    assert_int_equal(sh(s, "cut -d' ' -f1 /proc/modules", out, sizeof out), 0);
    assert_non_null(strstr(out, "virtio_pci"));
    assert_null(strstr(out, "erofs"));
    assert_null(strstr(out, "virtio_net"));
    assert_int_equal(
        sh(s, "hostname; cat /etc/machine-id | wc -c; ls /bin/sh /bin/ls", out, sizeof out), 0);
    assert_non_null(strstr(out, "\n33\n"));
    destroy(s);
    dsec_vm_ops.fini(be);
    assert_int_equal(procs_naming(state_q35), 0);
}

/* With the node's network containment: the guest's eth0 gets the sandbox's address and route,
 * and the node's resolver answers it (a name the policy does not allow is refused, which is
 * an answer: the NIC, the tap and the redirects carry its traffic both ways). */
static void test_network(void **state)
{
    (void)state;
    char nd[128], sd[128], out[2048];
    snprintf(nd, sizeof nd, "%s/net", top);
    snprintf(sd, sizeof sd, "%s/state-net", top);
    mkdir(nd, 0700);
    const char *ups[] = {"127.0.0.1:9"};
    dsec_net_conf c = {.state_dir = nd,
                       .tag = 0xd9,
                       .pool6 = "",
                       .upstream = ups,
                       .nupstream = 1,
                       .warm = UINT32_MAX};
    dsec_net *net = NULL;
    dsec_err err;
    if (dsec_net_new(&net, &c, &err) < 0)
        fail_msg("net: %s", err.msg);
    dsec_backend_kv opts[] = {{"vm_kit", kit}};
    dsec_backend_config cfg = {
        .state_dir = sd, .node = "vmtest", .opts = opts, .nopts = 1, .layers = reg, .net = net};
    void *be = NULL;
    if (dsec_microvm_ops.init(&be, &cfg, &err) < 0)
        fail_msg("microvm backend with a network: %s", err.msg);
    struct sbx *s = mk(&dsec_microvm_ops, be, "busybox:1");
    assert_int_equal(sh(s, "ip -4 -o addr show dev eth0", out, sizeof out), 0);
    fprintf(stderr, "test_vm: guest eth0: %s\n", out);
    assert_non_null(strstr(out, "inet 100."));
    assert_int_equal(sh(s, "ip route show default", out, sizeof out), 0);
    assert_non_null(strstr(out, "default via"));
    char dns[64] = "";
    assert_int_equal(sh(s, "awk '/^nameserver/{print $2; exit}' /etc/resolv.conf", dns, sizeof dns),
                     0);
    assert_true(dns[0] != '\0');
    sh(s, "nslookup not-allowed.example 2>&1", out, sizeof out);
    fprintf(stderr, "test_vm: nslookup from the guest: %s\n", out);
    assert_null(strstr(out, "timed out"));
    assert_non_null(strstr(out, dns));
    /* a policy change goes through to the sandbox's handle */
    const char *pol[] = {"example.com"};
    if (dsec_microvm_ops.net_set(be, s->h, pol, 1, &err) < 0)
        fail_msg("net_set: %s", err.msg);
    destroy(s);
    dsec_microvm_ops.fini(be);
    assert_int_equal(procs_naming(sd), 0);
    dsec_net_stats ns;
    dsec_net_stats_get(net, &ns);
    assert_int_equal(ns.sandboxes, 0);
    dsec_net_free(net, false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_bad_input, need_vm),
        cmocka_unit_test_setup(test_microvm, need_vm),
        cmocka_unit_test_setup(test_images_evicted, need_vm),
        cmocka_unit_test_setup(test_boot_on_loop, need_vm),
        cmocka_unit_test_setup(test_side_dial_once, need_vm),
        cmocka_unit_test_setup(test_fork_on_loop, need_vm),
        cmocka_unit_test_setup(test_stop_on_loop, need_vm),
        cmocka_unit_test_setup(test_q35, need_vm),
        cmocka_unit_test_setup(test_network, need_vm),
    };
    if (getenv("DSEC_TEST_FILTER") != NULL) /* one test by name, while working on it */
        cmocka_set_test_filter(getenv("DSEC_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
