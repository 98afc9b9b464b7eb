/* test_function_env.c - function calls in environments of layers: the call sees the environment's
 * files and variables, not the host's; one pool per (runtime, environment), shared by its
 * sandboxes, gone (with its layers) once idle; clear errors; adoption. */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
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
#include "backends/function/function.h"
#include "backends/layers/layer-cache.h"
#include "dsec/alloc.h"
#include "dsec/err.h"
#include "dsec/layers.h"
#include "tests/test_util.h"

/*
 * A local registry built at set-up from this host's files:
 *   base  busybox and its links, /etc/marker "base", /etc/passwd
 *   top   /etc/marker "top", /usr/local/share/envfile
 *   py    this host's python3 standard library (/usr/lib/python3.N) and a
 *         module only this layer has, /usr/lib/python3/dist-packages/envmod.py
 * Environments: box:1 = [base, top] with ENV_ONE=1; py:1 = [base, py].
 * The backend keeps at most two environment pools, each dropped 300 ms
 * after its last sandbox.
 */

#define UID_BASE 1660000000u
#define IDLE_MS 300

static char top[64];
static char state_dir[128], cache_dir[128];
static dsec_layer_registry *reg;
static void *fn;
static dsec_digest d_base, d_top, d_py;
static int seq;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

static int layer(const char *name, dsec_digest out)
{
    char tree[128], blob[128];
    snprintf(tree, sizeof tree, "%s/%s", top, name);
    snprintf(blob, sizeof blob, "%s/%s.blob", top, name);
    dsec_err err;
    if (dsec_layer_build(tree, DSEC_LAYER_DIR, NULL, 0, blob, out, &err) < 0 ||
        dsec_layer_registry_put(reg, out, DSEC_LAYER_DIR, blob, &err) < 0) {
        fprintf(stderr, "layer %s: %s\n", name, err.msg);
        return -1;
    }
    return 0;
}

static int env(const char *name, char *l0, char *l1, char **vars, size_t nvars)
{
    char *layers[] = {l0, l1};
    dsec_env e = {.name = (char *)name,
                  .layers = layers,
                  .nlayers = 2,
                  .vars = vars,
                  .nvars = nvars,
                  .workdir = "/",
                  .user = "root"};
    dsec_err err;
    if (dsec_layer_registry_env_put(reg, &e, &err) < 0) {
        fprintf(stderr, "environment %s: %s\n", name, err.msg);
        return -1;
    }
    return 0;
}

static int open_backend(void **out, const char *node, dsec_layer_registry *r, uint32_t uid_base,
                        dsec_err *err)
{
    char uid[16];
    snprintf(uid, sizeof uid, "%u", uid_base);
    dsec_backend_kv opts[] = {
        {"max_workers", "12"},  {"pool_python3", "0"},
        {"hot_python3", "0"},   {"pool_sh", "0"},
        {"pool_native", "0"},   {"uid_base", uid},
        {"env_pools", "2"},     {"env_warm", "1"},
        {"env_idle_ms", "300"}, {"max_timeout_ms", "20000"},
    };
    dsec_backend_config cfg = {.state_dir = state_dir,
                               .node = node,
                               .opts = opts,
                               .nopts = sizeof opts / sizeof opts[0],
                               .layers = r,
                               .layer_cache_dir = cache_dir};
    return dsec_function_ops.init(out, &cfg, err);
}

static int group_setup(void **state)
{
    if (geteuid() != 0 || access("/bin/busybox", X_OK) != 0 ||
        access("/usr/lib/python3/dist-packages", F_OK) != 0) {
        fprintf(stderr, "test_function_env: needs root, busybox-static and Debian's python3; "
                        "skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    snprintf(top, sizeof top, "/tmp/dsec-fnenv-XXXXXX");
    if (mkdtemp(top) == NULL)
        return -1;
    snprintf(state_dir, sizeof state_dir, "%s/state", top);
    snprintf(cache_dir, sizeof cache_dir, "%s/cache", top);
    const char *stdlib = "/usr/lib/python3.11";
    FILE *p = popen("/usr/bin/python3 -c 'import os; print(os.path.dirname(os.__file__))'", "r");
    static char lib[256];
    if (p != NULL && fgets(lib, sizeof lib, p) != NULL) {
        lib[strcspn(lib, "\n")] = '\0';
        stdlib = lib;
    }
    if (p != NULL)
        pclose(p);
    if (sh("set -e; t=%s/base; mkdir -p $t/bin $t/etc; cp /bin/busybox $t/bin/busybox; "
           "for a in $(/bin/busybox --list); do [ \"$a\" = busybox ] || ln -s busybox $t/bin/$a; "
           "done; echo base > $t/etc/marker; "
           "printf 'root:x:0:0:root:/root:/bin/sh\\n' > $t/etc/passwd; "
           "t=%s/top; mkdir -p $t/etc $t/usr/local/share; echo top > $t/etc/marker; "
           "echo envfile > $t/usr/local/share/envfile; "
           "t=%s/py; mkdir -p $t%s $t/usr/lib/python3/dist-packages; "
           "cd %s && tar --exclude=./test --exclude=./idlelib --exclude=./tkinter "
           "--exclude=./lib2to3 --exclude=./ensurepip --exclude=./pydoc_data -cf - . "
           "| tar -C $t%s -xf -; echo 'VALUE = 42' > $t/usr/lib/python3/dist-packages/envmod.py",
           top, top, top, stdlib, stdlib, stdlib) != 0)
        return -1;
    char regdir[128];
    snprintf(regdir, sizeof regdir, "%s/registry", top);
    dsec_err err;
    if (dsec_layer_registry_local(&reg, regdir, &err) < 0) {
        fprintf(stderr, "registry: %s\n", err.msg);
        return -1;
    }
    char *box_vars[] = {"ENV_ONE=1", "PATH=/bin:/usr/bin"};
    if (layer("base", d_base) < 0 || layer("top", d_top) < 0 || layer("py", d_py) < 0 ||
        env("box:1", d_base, d_top, box_vars, 2) < 0 || env("py:1", d_base, d_py, NULL, 0) < 0)
        return -1;
    if (open_backend(&fn, "fnenv", reg, UID_BASE, &err) < 0) {
        fprintf(stderr, "function backend: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int mounts_under(const char *dir)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    char line[4096];
    int n = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (strstr(line, dir) != NULL)
            n++;
    if (f != NULL)
        fclose(f);
    return n;
}

static int group_teardown(void **state)
{
    int rc = 0;
    if (fn != NULL) {
        dsec_function_ops.fini(fn);
        fn = NULL;
        /* the backend took its layers' mounts with it */
        if (mounts_under(top) != 0) {
            fprintf(stderr, "test_function_env: %d mounts left under %s\n", mounts_under(top), top);
            rc = -1;
        }
    }
    dsec_layer_registry_free(reg);
    reg = NULL;
    if (top[0] != '\0' && sh("rm -rf '%s'", top) != 0)
        rc = -1;
    return rc;
}

static int need_root(void **state)
{
    if (fn == NULL)
        skip();
    return 0;
}

/* ---- helpers ----------------------------------------------------------------------- */

struct sbx {
    dsec_sandbox *h;
    char *bstate;
    char id[32];
};

static int mk_err(const char *runtime, const char *envname, const char *const *layers,
                  size_t nlayers, struct sbx *s, dsec_err *err)
{
    snprintf(s->id, sizeof s->id, "fnenv-%04d", seq++);
    dsec_backend_kv kv[] = {{"runtime", runtime}};
    dsec_sandbox_spec spec = {.id = s->id,
                              .type = "function",
                              .env = envname,
                              .layers = layers,
                              .nlayers = nlayers,
                              .memory_mb = 256,
                              .labels = kv,
                              .nlabels = 1};
    dsec_err_clear(err);
    return dsec_function_ops.create(fn, &spec, &s->h, &s->bstate, err);
}

static struct sbx *mk(const char *runtime, const char *envname)
{
    struct sbx *s = calloc(1, sizeof *s);
    assert_non_null(s);
    dsec_err err;
    if (mk_err(runtime, envname, NULL, 0, s, &err) < 0)
        fail_msg("create %s in %s: %s", runtime, envname ? envname : "the host", err.msg);
    return s;
}

static void rm(struct sbx *s)
{
    dsec_err err;
    if (dsec_function_ops.destroy(fn, s->h, &err) < 0)
        fail_msg("destroy %s: %s", s->id, err.msg);
    dsec_free(s->bstate);
    free(s);
}

/* Run argv in s; returns stdout (static) and sets *code to exit code, or
 * 128 + signal. */
static char *run(struct sbx *s, int *code, const char *const *argv)
{
    size_t argc = 0;
    while (argv[argc])
        argc++;
    dsec_exec_req req = {.argv = argv, .argc = argc, .timeout_ms = 10000};
    dsec_exec_result r;
    memset(&r, 0, sizeof r);
    dsec_err err;
    if (dsec_function_ops.exec(fn, s->h, &req, &r, &err) < 0)
        fail_msg("exec %s in %s: %s", argv[0], s->id, err.msg);
    static char out[8192];
    size_t n = r.stdout_len < sizeof out - 1 ? r.stdout_len : sizeof out - 1;
    memcpy(out, r.stdout_data ? (const char *)r.stdout_data : "", n);
    out[n] = '\0';
    *code = r.signal ? 128 + r.signal : r.exit_code;
    if (*code != 0 && r.stderr_len > 0)
        fprintf(stderr, "  (%s: stderr %.*s)\n", argv[0], (int)r.stderr_len, r.stderr_data);
    dsec_exec_result_release(&r);
    return out;
}

static char *sh_ok(struct sbx *s, const char *script)
{
    int code = -1;
    const char *argv[] = {"sh", "-c", script, NULL};
    char *out = run(s, &code, argv);
    if (code != 0)
        fail_msg("sh -c '%s' in %s: exit %d", script, s->id, code);
    return out;
}

static int sh_code(struct sbx *s, const char *script)
{
    int code = -1;
    const char *argv[] = {"sh", "-c", script, NULL};
    run(s, &code, argv);
    return code;
}

static size_t pools(dsec_function_pool_info *out, size_t max)
{
    return dsec_function_env_pools(fn, out, max);
}

/* Wait (bounded) for the environment pools to go idle and be taken down. */
static size_t pools_after_idle(void)
{
    dsec_function_pool_info info[4];
    size_t n = pools(info, 4);
    for (int i = 0; i < 100 && n > 0; i++) {
        msleep(50);
        n = pools(info, 4);
    }
    return n;
}

/* ---- tests ------------------------------------------------------------------------- */

static void a_call_sees_its_environment_not_the_host(void **state)
{
    struct sbx *s = mk("sh", "box:1");
    /* the top layer wins over the base; both are there */
    assert_string_equal(sh_ok(s, "cat /etc/marker /usr/local/share/envfile"), "top\nenvfile\n");
    /* the environment's variables, under the call's own defaults */
    assert_string_equal(sh_ok(s, "echo $ENV_ONE:$PATH:$HOME"), "1:/bin:/usr/bin:/work\n");
    /* the host's /usr is not there: no python3, no host libraries */
    assert_int_equal(sh_code(s, "test -e /usr/bin/python3 || test -e /usr/lib/x86_64-linux-gnu"),
                     1);
    /* the environment is read-only; /tmp and /work are the call's own */
    assert_int_not_equal(sh_code(s, "echo x > /etc/marker"), 0);
    assert_int_not_equal(sh_code(s, "touch /bin/new"), 0);
    sh_ok(s, "echo left > /tmp/left && echo left > /work/left");
    assert_int_equal(sh_code(s, "test -e /tmp/left || test -e /work/left"), 1);
    /* a program of the environment runs as itself: busybox from the layer */
    int code = -1;
    const char *argv[] = {"/bin/busybox", "basename", "/a/b/c", NULL};
    assert_string_equal(run(s, &code, argv), "c\n");
    assert_int_equal(code, 0);
    rm(s);
}

static void python_runs_the_environments_modules(void **state)
{
    struct sbx *s = mk("python3", "py:1");
    int code = -1;
    const char *a1[] = {"python3", "-c", "import envmod, json; print(json.dumps(envmod.VALUE))",
                        NULL};
    assert_string_equal(run(s, &code, a1), "42\n");
    assert_int_equal(code, 0);
    const char *a2[] = {
        "python3", "--call", "f", "-c", "import envmod\ndef f(x): return x + envmod.VALUE",
        "8",       NULL};
    assert_string_equal(run(s, &code, a2), "50\n");
    assert_int_equal(code, 0);
    /* busybox from the base layer, run from python */
    const char *a3[] = {"python3", "-c",
                        "import subprocess; print(subprocess.run(['cat', '/etc/marker'], "
                        "capture_output=True, text=True).stdout, end='')",
                        NULL};
    assert_string_equal(run(s, &code, a3), "base\n");
    assert_int_equal(code, 0);
    /* the host's python3 sandbox has no envmod */
    struct sbx *h = mk("python3", NULL);
    const char *a4[] = {"python3", "-c", "import envmod", NULL};
    run(h, &code, a4);
    assert_int_equal(code, 1);
    rm(h);
    rm(s);
    assert_int_equal(pools_after_idle(), 0);
}

static void one_pool_per_environment_gone_when_idle(void **state)
{
    dsec_function_pool_info info[4];
    struct sbx *a = mk("sh", "box:1"), *b = mk("sh", "box:1");
    assert_int_equal(pools(info, 4), 1);
    assert_int_equal(info[0].sandboxes, 2);
    assert_string_equal(info[0].name, "sh in box:1");
    assert_string_equal(info[0].state, "up");
    pid_t zygote = info[0].zygote_pid;
    assert_true(zygote > 0);
    sh_ok(a, "true");
    sh_ok(b, "true");
    /* the same layers given as a list: the same pool */
    struct sbx *c = calloc(1, sizeof *c);
    dsec_err err;
    const char *same[] = {d_base, d_top};
    if (mk_err("sh", NULL, same, 2, c, &err) < 0)
        fail_msg("create with layers: %s", err.msg);
    assert_int_equal(pools(info, 4), 1);
    assert_int_equal(info[0].sandboxes, 3);
    /* another runtime or other layers: another pool, up to env_pools (2) */
    const char *only_base[] = {d_base};
    struct sbx *d = calloc(1, sizeof *d);
    if (mk_err("native", NULL, only_base, 1, d, &err) < 0)
        fail_msg("create on the base layer: %s", err.msg);
    assert_string_equal(sh_ok(d, "cat /etc/marker"), "base\n");
    assert_int_equal(pools(info, 4), 2);
    struct sbx e;
    assert_int_equal(mk_err("sh", "py:1", NULL, 0, &e, &err), -1);
    assert_int_equal(err.code, DSEC_E_CAPACITY);
    assert_non_null(strstr(err.msg, "env_pools"));
    rm(d);
    /* once idle, the base-only pool gives its place to py:1 */
    struct sbx *f = mk("sh", "py:1");
    assert_string_equal(sh_ok(f, "cat /etc/marker"), "base\n");
    rm(f);
    rm(a);
    rm(b);
    rm(c);
    /* nothing uses them: after env_idle_ms the zygotes are gone, and the
     * node's cache no longer counts their layers as used */
    assert_int_equal(pools_after_idle(), 0);
    assert_int_equal(kill(zygote, 0), -1);
    dsec_layer_cache *cache;
    assert_int_equal(dsec_layer_cache_share(&cache, cache_dir, 0, reg, &err), 0);
    dsec_layer_cache_stats st;
    dsec_layer_cache_stats_get(cache, &st);
    assert_int_equal(st.in_use, 0);
    assert_int_equal(st.layers, 3);
    assert_int_equal(st.fetches, 3); /* each layer fetched once, whatever used it */
    dsec_layer_cache_free(cache);
}

static void a_killed_environment_zygote_comes_back_on_its_root(void **state)
{
    struct sbx *s = mk("sh", "box:1");
    dsec_function_pool_info info[4];
    assert_int_equal(pools(info, 4), 1);
    pid_t old = info[0].zygote_pid;
    assert_int_equal(kill(old, SIGKILL), 0);
    /* rebuilt: a new zygote, up again, and its calls see the environment */
    for (int i = 0; i < 200; i++) {
        assert_int_equal(pools(info, 4), 1);
        if (info[0].zygote_pid != old && info[0].zygote_pid > 0 && strcmp(info[0].state, "up") == 0)
            break;
        msleep(20);
    }
    assert_int_not_equal(info[0].zygote_pid, old);
    assert_string_equal(info[0].state, "up");
    assert_true(info[0].zygote_starts >= 2);
    for (int i = 0; i < 4; i++) /* warm workers forked before the kill, then new ones */
        assert_string_equal(sh_ok(s, "cat /etc/marker; echo $ENV_ONE"), "top\n1\n");
    assert_int_equal(sh_code(s, "test -e /usr/bin/python3"), 1);
    rm(s);
    assert_int_equal(pools_after_idle(), 0);
}

static void bad_environments_get_clear_errors(void **state)
{
    struct sbx s;
    dsec_err err;
    /* python3 where the environment has no standard library */
    assert_int_equal(mk_err("python3", "box:1", NULL, 0, &s, &err), -1);
    assert_int_equal(err.code, DSEC_E_BACKEND);
    assert_non_null(strstr(err.msg, "standard library"));
    /* whole, to its last words */
    if (strstr(err.msg, "runtime sh or native for an environment's own programs") == NULL)
        fail_msg("message: %s", err.msg);
    /* an environment the registry does not have */
    assert_int_equal(mk_err("sh", "nope:9", NULL, 0, &s, &err), -1);
    assert_non_null(strstr(err.msg, "nope:9"));
    /* a layer that is not a digest, and one the registry does not hold */
    const char *bad[] = {"sha256:xyz"};
    assert_int_equal(mk_err("sh", NULL, bad, 1, &s, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "sha256:xyz"));
    const char *missing[] = {
        "sha256:0000000000000000000000000000000000000000000000000000000000000000"};
    assert_int_equal(mk_err("sh", NULL, missing, 1, &s, &err), -1);
    assert_non_null(strstr(err.msg, missing[0]));
    /* failed pools do not stay */
    assert_int_equal(pools_after_idle(), 0);
    /* a node without a registry runs function calls on the host only */
    void *bare = NULL;
    char saved[128];
    snprintf(saved, sizeof saved, "%s", state_dir);
    snprintf(state_dir, sizeof state_dir, "%s/bare", top);
    void *keep = fn;
    dsec_err e2;
    if (open_backend(&bare, "fnenv2", NULL, UID_BASE + 100, &e2) < 0)
        fail_msg("a second backend: %s", e2.msg);
    snprintf(state_dir, sizeof state_dir, "%s", saved);
    fn = bare;
    int rc = mk_err("sh", "box:1", NULL, 0, &s, &err);
    fn = keep;
    dsec_function_ops.fini(bare);
    assert_int_equal(rc, -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "no layer registry"));
}

static void adopted_sandboxes_keep_their_environment(void **state)
{
    struct sbx *s = mk("sh", "box:1");
    assert_non_null(strstr(s->bstate, ";layers="));
    assert_non_null(strstr(s->bstate, ";env=box:1"));
    dsec_function_ops.detach(fn, s->h);
    s->h = NULL;
    dsec_err err;
    dsec_sandbox_spec spec = {.id = s->id, .type = "function"};
    if (dsec_function_ops.adopt(fn, &spec, s->bstate, &s->h, &err) < 0)
        fail_msg("adopt: %s", err.msg);
    assert_string_equal(sh_ok(s, "cat /etc/marker; echo $ENV_ONE"), "top\n1\n");
    dsec_function_pool_info info[4];
    assert_int_equal(pools(info, 4), 1);
    assert_int_equal(info[0].sandboxes, 1);
    /* a create that fails after taking the pool gives back only its own use */
    dsec_sandbox *dup = NULL;
    char *dup_state = NULL;
    dsec_backend_kv kv[] = {{"runtime", "sh"}};
    dsec_sandbox_spec again = {
        .id = s->id, .type = "function", .env = "box:1", .labels = kv, .nlabels = 1};
    assert_int_equal(dsec_function_ops.create(fn, &again, &dup, &dup_state, &err), -1);
    assert_int_equal(pools(info, 4), 1);
    assert_int_equal(info[0].sandboxes, 1);
    assert_string_equal(sh_ok(s, "cat /etc/marker"), "top\n");
    /* a state naming a layer list this backend never wrote is refused */
    dsec_sandbox *h2 = NULL;
    char bad[512];
    snprintf(bad, sizeof bad, "%s;bogus=1", s->bstate);
    assert_int_equal(dsec_function_ops.adopt(fn, NULL, bad, &h2, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    rm(s);
    assert_int_equal(pools_after_idle(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(a_call_sees_its_environment_not_the_host, need_root),
        cmocka_unit_test_setup(python_runs_the_environments_modules, need_root),
        cmocka_unit_test_setup(one_pool_per_environment_gone_when_idle, need_root),
        cmocka_unit_test_setup(a_killed_environment_zygote_comes_back_on_its_root, need_root),
        cmocka_unit_test_setup(bad_environments_get_clear_errors, need_root),
        cmocka_unit_test_setup(adopted_sandboxes_keep_their_environment, need_root),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
