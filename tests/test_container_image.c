/* test_container_image.c - a crun container (built with IMG_VM a microVM, with IMG_Q35 too a
 * VM; with IMG_FN a function call) from an imported image: whiteouts, opaque dirs, links,
 * setuid and the image's Env, WorkingDir, USER and default command (Entrypoint, Cmd), over a
 * dozen lower layers; and two images over one base, whose base a node fetches once. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/backend.h"
#include "backends/container/container.h"
#include "backends/function/function.h"
#include "backends/layers/layer-cache.h"
#include "backends/vm/vm.h"
#include "dsec/alloc.h"
#include "dsec/err.h"
#include "dsec/image.h"
#include "dsec/layers.h"
#include "image_kit.h"

#if defined(IMG_VM) && defined(IMG_Q35)
#define OPS dsec_vm_ops
#define WHAT "vm"
#elif defined(IMG_VM)
#define OPS dsec_microvm_ops
#define WHAT "microvm"
#elif defined(IMG_FN)
#define OPS dsec_function_ops
#define WHAT "function"
#else
#define OPS dsec_container_ops
#define WHAT "container"
#endif
#ifndef DSEC_VMKIT_DIR
#define DSEC_VMKIT_DIR ""
#endif
#define REF "127.0.0.1:5000/swe/task:1"
#define REF2 "127.0.0.1:5000/swe/task-two:1"
#define NEXTRA 10 /* layers above the two that matter: 12 lower dirs in all */

static void *ct;
static dsec_layer_registry *reg;
static char top[64];

static const char *const APPLETS[] = {"sh",  "id",   "ls",  "cat",   "stat", "readlink", "test",
                                      "pwd", "echo", "env", "mkdir", "rm",   "sleep",    "true"};

static const ik_entry APP[] = {
    {'f', "del/.wh.gone.txt", "", 0644, 0, 0, NULL, NULL},
    {'f', "opq/.wh..wh..opq", "", 0644, 0, 0, NULL, NULL},
    {'f', "opq/upper.txt", "upper\n", 0644, 0, 0, NULL, NULL},
    {'d', "data", NULL, 0755, 0, 0, NULL, NULL},
    {'f', "data/a.txt", "linked\n", 0644, 0, 0, NULL, NULL},
    {'d', "other", NULL, 0755, 0, 0, NULL, NULL},
    {'h', "other/b.txt", "data/a.txt", 0644, 0, 0, NULL, NULL},
    {'d', "work", NULL, 0755, 1234, 1234, NULL, NULL},
};

/* Base (busybox, absolute applet links, users), APP, then NEXTRA one-file layers; imported. */
static int import_image(void)
{
    ik_entry base[64];
    size_t n = 0;
    static const char *const dirs[] = {"bin", "etc",  "proc", "sys", "dev",
                                       "tmp", "root", "del",  "opq"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++)
        base[n++] =
            (ik_entry){'d', dirs[i], NULL, strcmp(dirs[i], "tmp") ? 0755 : 01777, 0, 0, NULL, NULL};
    base[n++] = (ik_entry){'f', "bin/busybox", NULL, 0755, 0, 0, "/bin/busybox", NULL};
    static char links[32][32];
    for (size_t i = 0; i < sizeof APPLETS / sizeof *APPLETS; i++) {
        snprintf(links[i], sizeof links[i], "bin/%s", APPLETS[i]);
        base[n++] = (ik_entry){'l', links[i], "/bin/busybox", 0777, 0, 0, NULL, NULL};
    }
    base[n++] = (ik_entry){'f', "bin/suid", "#!/bin/sh\n", 04755, 0, 0, NULL, NULL};
    base[n++] = (ik_entry){'f',
                           "etc/passwd",
                           "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234::/work:/bin/sh\n",
                           0644,
                           0,
                           0,
                           NULL,
                           NULL};
    base[n++] = (ik_entry){'f', "etc/group", "root:x:0:\napp:x:1234:\n", 0644, 0, 0, NULL, NULL};
    base[n++] = (ik_entry){'f', "del/gone.txt", "gone\n", 0644, 0, 0, NULL, NULL};
    base[n++] = (ik_entry){'f', "opq/lower.txt", "lower\n", 0644, 0, 0, NULL, NULL};
    ik_layer layers[2 + NEXTRA];
    ik_layer *lp[2 + NEXTRA];
    memset(layers, 0, sizeof layers);
    ik_layer_make(&layers[0], base, n, true);
    ik_layer_make(&layers[1], APP, sizeof APP / sizeof *APP, false);
    char paths[NEXTRA][32], data[NEXTRA][8];
    for (int i = 0; i < NEXTRA; i++) {
        snprintf(paths[i], sizeof paths[i], "layers/%d", i);
        snprintf(data[i], sizeof data[i], "%d", i);
        ik_entry e = {'f', paths[i], data[i], 0644, 0, 0, NULL, NULL};
        ik_layer_make(&layers[2 + i], &e, 1, true);
    }
    for (int i = 0; i < 2 + NEXTRA; i++)
        lp[i] = &layers[i];
    ik_image im = {.ref = REF,
                   .config_json_extra = "\"Env\":[\"PATH=/bin\",\"GREETING=hello image\"],"
                                        "\"WorkingDir\":\"/work\",\"User\":\"app\","
                                        "\"Entrypoint\":[\"/bin/sh\",\"-c\"],"
                                        "\"Cmd\":[\"echo \\\"default: $GREETING\\\"\"]"};
    char dir[128], regdir[128], work[128];
    snprintf(dir, sizeof dir, "%s/oci", top);
    snprintf(regdir, sizeof regdir, "%s/registry", top);
    snprintf(work, sizeof work, "%s/work", top);
    ik_write_oci_dir(dir, &im, lp, 2 + NEXTRA);
    /* a second task image over the same base, with one small layer of its own */
    ik_layer own = {0}; /* truncate_to must be 0: a whole layer */
    ik_entry mine = {'f', "own.txt", "task two\n", 0644, 0, 0, NULL, NULL};
    ik_layer_make(&own, &mine, 1, true);
    ik_layer *lp2[] = {&layers[0], &own};
    ik_image im2 = {.ref = REF2, .config_json_extra = "\"Env\":[\"PATH=/bin\"]"};
    char dir2[128];
    snprintf(dir2, sizeof dir2, "%s/oci2", top);
    ik_write_oci_dir(dir2, &im2, lp2, 2);
    ik_layer_free(&own);
    for (int i = 0; i < 2 + NEXTRA; i++)
        ik_layer_free(&layers[i]);
    dsec_err err;
    dsec_image_import_opts o = {.work_dir = work};
    dsec_image_info *info = NULL;
    if (dsec_layer_registry_local(&reg, regdir, &err) < 0 ||
        dsec_image_import(reg, dir, &o, NULL, &err) < 0 ||
        dsec_image_import(reg, dir2, &o, &info, &err) < 0) {
        fprintf(stderr, "import: %s\n", err.msg);
        return -1;
    }
    /* the base is stored once: the second import reused it */
    bool reused = info->nlayers == 2 && info->layers[0].reused && !info->layers[1].reused;
    dsec_image_info_free(info);
    if (!reused) {
        fprintf(stderr, "import: %s did not reuse the base layer it shares with %s\n", REF2, REF);
        return -1;
    }
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    if (geteuid() != 0 || access("/bin/busybox", X_OK) != 0 ||
        system("command -v crun >/dev/null && command -v mkfs.erofs >/dev/null") != 0) {
        fprintf(stderr,
                "test_%s_image: needs root, busybox-static, crun, mkfs.erofs; "
                "skipping\n",
                WHAT);
        exit(77);
    }
#ifdef IMG_VM
    char kitfile[512];
    snprintf(kitfile, sizeof kitfile, "%s/vmlinuz", DSEC_VMKIT_DIR);
    if (DSEC_VMKIT_DIR[0] == '\0' || access(kitfile, R_OK) != 0 ||
        system("command -v qemu-system-x86_64 >/dev/null") != 0) {
        fprintf(stderr, "test_%s_image: no VM kit or QEMU; skipping\n", WHAT);
        exit(77);
    }
#endif
    snprintf(top, sizeof top, "/tmp/dsec-ctimg-%d-XXXXXX", (int)getpid());
    if (mkdtemp(top) == NULL || import_image() < 0)
        return -1;
    char state_dir[128];
    snprintf(state_dir, sizeof state_dir, "%s/state", top);
    char cache_dir[128];
    snprintf(cache_dir, sizeof cache_dir, "%s/cache", top);
#ifdef IMG_VM
    dsec_backend_kv opts[] = {{"vm_kit", DSEC_VMKIT_DIR}, {"container.pids_max", "64"}};
#elif defined(IMG_FN)
    dsec_backend_kv opts[] = {{"pool_python3", "0"}, {"hot_python3", "0"}, {"pool_sh", "0"},
                              {"pool_native", "0"},  {"env_pools", "1"},   {"env_warm", "1"}};
#else
    dsec_backend_kv opts[] = {{"runtime", "crun"}, {"upper_gb", "4"}, {"warm_pool", "0"}};
#endif
    char node[32]; /* its own cgroups and runtime state: never another run's */
    snprintf(node, sizeof node, "ctimg%d", (int)getpid());
    dsec_backend_config cfg = {.state_dir = state_dir,
                               .layer_cache_dir = cache_dir,
                               .node = node,
                               .opts = opts,
                               .nopts = sizeof opts / sizeof *opts,
                               .layers = reg};
    dsec_err err;
    if (OPS.init(&ct, &cfg, &err) < 0) {
        fprintf(stderr, "%s backend: %s\n", WHAT, err.msg);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (ct != NULL)
        OPS.fini(ct);
    dsec_layer_registry_free(reg);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    return system(cmd) == 0 ? 0 : -1;
}

static int sh(dsec_sandbox *h, const char *line, char *out, size_t len)
{
    const char *argv[] = {"/bin/sh", "-c", line};
    dsec_exec_req req = {.argv = argv, .argc = 3, .timeout_ms = 60000};
    dsec_exec_result res = {0};
    dsec_err err;
    if (OPS.exec(ct, h, &req, &res, &err) < 0)
        fail_msg("exec \"%s\": %s", line, err.msg);
    snprintf(out, len, "%.*s", (int)res.stdout_len, res.stdout_data ? (char *)res.stdout_data : "");
    int rc = res.signal ? 128 + res.signal : res.exit_code;
    dsec_exec_result_release(&res);
    return rc;
}

#define SH_IS(line, want)                                                                          \
    do {                                                                                           \
        char out_[4096];                                                                           \
        int rc_ = sh(h, line, out_, sizeof out_);                                                  \
        if (rc_ != 0 || strcmp(out_, want) != 0)                                                   \
            fail_msg("%s: exit %d, \"%s\", want \"%s\"", line, rc_, out_, want);                   \
    } while (0)

static void test_container_from_image(void **state)
{
    (void)state;
    char id[64];
    snprintf(id, sizeof id, "ctimg-%d", (int)getpid());
    dsec_backend_kv kv[] = {{"runtime", "sh"}};
    dsec_sandbox_spec spec = {.id = id, .type = OPS.type, .env = REF, .memory_mb = 128};
#ifdef IMG_FN
    spec.labels = kv, spec.nlabels = 1; /* a function call runs as the pool's user, in / */
#else
    (void)kv;
#endif
    dsec_sandbox *h;
    char *bstate;
    dsec_err err;
    if (OPS.create(ct, &spec, &h, &bstate, &err) < 0)
        fail_msg("create from %s: %s", REF, err.msg);
#ifndef IMG_FN                /* a function call runs as its pool's user, in / */
    SH_IS("id -u", "1234\n"); /* USER app, resolved in the image's /etc/passwd */
    SH_IS("pwd", "/work\n");  /* WorkingDir */
#endif
    SH_IS("echo \"$GREETING\"", "hello image\n");
    SH_IS("test -e /del/gone.txt || echo absent", "absent\n");
    SH_IS("ls /opq", "upper.txt\n");
    SH_IS("[ $(stat -c %i /data/a.txt) = $(stat -c %i /other/b.txt) ] && stat -c %h /data/a.txt",
          "2\n");                                /* one file under two names */
    SH_IS("readlink /bin/sh", "/bin/busybox\n"); /* absolute: resolved in the sandbox's root */
    SH_IS("stat -c %a /bin/suid", "4755\n");
    SH_IS("cat /layers/0 /layers/9", "09"); /* every one of the 12 lower layers is there */
    /* Entrypoint then Cmd: the default command, kept with the sandbox */
    const char *const *dargv = NULL;
    assert_int_equal(OPS.default_cmd(ct, h, &dargv), 3);
    assert_string_equal(dargv[0], "/bin/sh");
    assert_string_equal(dargv[2], "echo \"default: $GREETING\"");
    dsec_exec_req dreq = {.argv = dargv, .argc = 3, .timeout_ms = 60000};
    dsec_exec_result dres = {0};
    if (OPS.exec(ct, h, &dreq, &dres, &err) < 0)
        fail_msg("the default command: %s", err.msg);
    assert_int_equal(dres.exit_code, 0);
    assert_int_equal(dres.stdout_len, strlen("default: hello image\n"));
    assert_memory_equal(dres.stdout_data, "default: hello image\n", dres.stdout_len);
    dsec_exec_result_release(&dres);
    OPS.destroy(ct, h, &err);
    dsec_free(bstate);
}

/* Two task images over one base, on one node: the base is fetched into the node's layer cache
 * once, and the second sandbox finds it there (only its own layer is fetched). */
static void test_shared_base_fetched_once(void **state)
{
    (void)state;
    char cache_dir[128];
    snprintf(cache_dir, sizeof cache_dir, "%s/cache", top);
    dsec_layer_cache *cache;
    dsec_err err;
    if (dsec_layer_cache_share(&cache, cache_dir, 0, reg, &err) < 0) /* the backend's own */
        fail_msg("layer cache: %s", err.msg);
    const char *refs[] = {REF, REF2};
    dsec_layer_cache_stats st[3];
    dsec_layer_cache_stats_get(cache, &st[0]);
    dsec_backend_kv kv[] = {{"runtime", "sh"}};
    for (int i = 0; i < 2; i++) {
        char id[64];
        snprintf(id, sizeof id, "ctimg-%d-%d", (int)getpid(), i);
        dsec_sandbox_spec spec = {.id = id, .type = OPS.type, .env = refs[i], .memory_mb = 128};
#ifdef IMG_FN
        spec.labels = kv, spec.nlabels = 1;
#else
        (void)kv;
#endif
        dsec_sandbox *h;
        char *bstate;
        if (OPS.create(ct, &spec, &h, &bstate, &err) < 0)
            fail_msg("create from %s: %s", refs[i], err.msg);
        if (i == 1)
            SH_IS("cat /own.txt; test -e /data/a.txt || echo base only", "task two\nbase only\n");
        OPS.destroy(ct, h, &err);
        dsec_free(bstate);
        dsec_layer_cache_stats_get(cache, &st[i + 1]);
    }
    fprintf(stderr,
            "%s_image: layer cache fetches %" PRIu64 " -> %" PRIu64 " -> %" PRIu64 ", hits %" PRIu64
            " -> %" PRIu64 "\n",
            WHAT, st[0].fetches, st[1].fetches, st[2].fetches, st[1].hits, st[2].hits);
    assert_int_equal(st[2].fetches - st[1].fetches, 1); /* the second image's own layer only */
    assert_true(st[2].hits > st[1].hits);               /* the base, from the cache */
    dsec_layer_cache_free(cache);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_container_from_image),
                                       cmocka_unit_test(test_shared_base_fetched_once)};
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
