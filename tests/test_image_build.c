/* test_image_build.c - `dsec image build`: Dockerfiles built in real crun containers of a cell on
 * busybox:1, the result started and checked from inside. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/cell.h"
#include "actors/node.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/image.h"
#include "dsec/layers.h"
#include "tests/image_kit.h"
#include "tests/fixture-client.h"
#include "tests/fixture.h"

static dsec_natsd *natsd;
static char root[64];
static dsec_cell_conf conf;
static dsec_cell *cell;
static dsec_client *cl;

static int group_setup(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "test_image_build: needs root (containers); skipping\n");
        exit(77);
    }
    if (dsec_test_server_start("dsec-imgbuild", false, &natsd, root, sizeof root) < 0)
        return -1;
    char cmd[1024];
    snprintf(
        cmd, sizeof cmd,
        "%s/scripts/build-envs.sh --dsec %s --registry %s/layers --state-dir %s --only busybox "
        ">/dev/null",
        DSEC_SRC, DSEC_CLI, root, root);
    if (system(cmd) != 0) {
        fprintf(stderr, "building busybox:1 failed: %s\n", cmd);
        return -1;
    }
    dsec_err err;
    dsec_cell_conf_defaults(&conf);
    snprintf(conf.cell, sizeof conf.cell, "imgbuild");
    snprintf(conf.url, sizeof conf.url, "%s", dsec_natsd_url(natsd));
    snprintf(conf.state_dir, sizeof conf.state_dir, "%s/cell", root);
    snprintf(conf.layers_path, sizeof conf.layers_path, "%s/layers", root);
    conf.default_disk_mb = 64;
    static const char *const types[] = {"container", NULL};
    char node[64];
    snprintf(node, sizeof node, "imgb%d", (int)getpid());
    if (dsec_cell_conf_add_sim_nodes(&conf, node, 1, 8000, 16384, 64, types, NULL, &err) < 0) {
        fprintf(stderr, "conf: %s\n", err.msg);
        return -1;
    }
    snprintf(conf.nodes[0].backend, sizeof conf.nodes[0].backend, "native");
    if (dsec_cell_start(&cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0) {
        fprintf(stderr, "cell: %s\n", err.msg);
        return -1;
    }
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = "imgbuild", .timeout_ms = 30000};
    if (dsec_client_connect(&cl, &o, &err) < 0) {
        fprintf(stderr, "client: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    dsec_client_free(cl);
    if (cell != NULL)
        dsec_cell_stop(cell, true);
    dsec_cell_conf_release(&conf);
    if (natsd == NULL)
        return 0;
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "for m in $(awk -v w='%s/' 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | "
             "sort -r); do umount -l $m; done",
             root);
    if (system(cmd) != 0)
        fprintf(stderr, "teardown: unmounting under %s failed\n", root);
    return dsec_test_server_stop(natsd, root);
}

/* Write text to root/rel (parents made). */
static void put(const char *rel, const char *text, unsigned mode)
{
    char path[512], cmd[600];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    assert_int_equal(system(cmd), 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(path, mode), 0);
}

/* Run `dsec image build ARGS` against the cell; its exit code, its stderr in errout. */
static int build(const char *args, char *errout, size_t n)
{
    char cmd[2048], log[128];
    snprintf(log, sizeof log, "%s/build.err", root);
    snprintf(
        cmd, sizeof cmd,
        "DSEC_URL=%s DSEC_TENANT=imgbuild %s image build --registry %s/layers %s >%s/build.out "
        "2>%s",
        dsec_natsd_url(natsd), DSEC_CLI, root, args, root, log);
    int st = system(cmd);
    FILE *f = fopen(log, "r");
    size_t k = f != NULL ? fread(errout, 1, n - 1, f) : 0;
    errout[k] = '\0';
    if (f != NULL)
        fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void make(const char *env, dsec_sandbox_info *info)
{
    dsec_create_spec cs = {.type = "container", .env = env, .cpu_milli = 500, .memory_mb = 64};
    dsec_test_create(cl, &cs, env, info);
}

/* sh -c line in id with the environment's defaults (line NULL: its default command); stdout
 * without its last newline. */
static int sh(const char *id, const char *line, char *out, size_t n)
{
    return dsec_test_exec_sh(cl, id, line, 20000, false, out, n);
}

/* How many sandboxes of this tenant are alive (a build must leave none). */
static size_t live_sandboxes(void)
{
    dsec_list_page p;
    dsec_err err;
    if (dsec_list_sandboxes(cl, NULL, &p, &err) < 0)
        fail_msg("list: %s", err.msg);
    size_t n = p.n;
    dsec_list_page_release(&p);
    return n;
}

static bool env_exists(const char *name)
{
    char dir[128];
    snprintf(dir, sizeof dir, "%s/layers", root);
    dsec_layer_registry *r;
    dsec_err err;
    if (dsec_layer_registry_local(&r, dir, &err) < 0)
        fail_msg("registry: %s", err.msg);
    dsec_env *e = NULL;
    bool ok = dsec_layer_registry_env_get(r, name, &e, &err) == 0;
    dsec_env_free(e);
    dsec_layer_registry_free(r);
    return ok;
}

/* One Dockerfile with every instruction a task image uses, built, then started and looked at. */
static void test_build_and_run(void **state)
{
    (void)state;
    put("ctx/bin/hello", "#!/bin/sh\necho hello from $APP_HOME\n", 0755);
    put("ctx/data.txt", "data\n", 0644);
    put("ctx/secret.txt", "s3cret\n", 0644);
    put("ctx/owned.txt", "mine\n", 0644);
    put("ctx/skip.log", "left out\n", 0644);
    put("ctx/.dockerignore", "# logs stay home\n*.log\n", 0644);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "cd %s && mkdir -p t/sub && echo unpacked > t/sub/f && ln -s sub/f t/link && tar -czf "
             "ctx/files.tar.gz -C t . && ln -sf data.txt ctx/bin/data-link",
             root);
    assert_int_equal(system(cmd), 0);
    put("ctx/Dockerfile",
        "# syntax=docker/dockerfile:1\n"
        "ARG BASE=busybox:1\n"
        "FROM ${BASE} AS base\n"
        "ARG GREETING=hello\n"
        "ENV APP_HOME=/opt/app \\\n"
        "    PATH=/opt/app/bin:$PATH\n"
        "WORKDIR $APP_HOME\n"
        "COPY bin/ bin/\n"
        "COPY data.txt *.log ./\n"
        "COPY --chmod=0600 secret.txt /etc/secret.txt\n"
        "ADD files.tar.gz /opt/unpacked/\n"
        "RUN echo \"$GREETING from $(pwd)\" > greeting.txt && rm /bin/vi\n"
        "RUN echo app:x:1234:1234::/home/app:/bin/sh >> /etc/passwd && echo app:x:1234: >> "
        "/etc/group\n"
        "COPY --chown=app:app owned.txt /home/app/\n"
        "LABEL org.example.task=\"task 7\"\n"
        "EXPOSE 8080\n"
        "USER app\n"
        "CMD [\"hello\"]\n",
        0644);
    char errout[8192], args[512];
    size_t before = live_sandboxes();
    snprintf(args, sizeof args, "--name task/seven:1 --build-arg GREETING=hey %s/ctx", root);
    int rc = build(args, errout, sizeof errout);
    if (rc != 0)
        fail_msg("build exited %d: %s", rc, errout);
    assert_non_null(strstr(errout, "STEP 2/16: FROM ${BASE} AS base"));
    assert_int_equal(live_sandboxes(), before); /* the build's containers are gone */

    dsec_sandbox_info sb;
    make("task/seven:1", &sb);
    char out[512];
    assert_int_equal(sh(sb.id, "pwd; id -u; echo $APP_HOME", out, sizeof out), 0);
    assert_string_equal(out, "/opt/app\n1234\n/opt/app");     /* WORKDIR, USER, ENV */
    assert_int_equal(sh(sb.id, "hello", out, sizeof out), 0); /* PATH from ENV, COPY bin/ */
    assert_string_equal(out, "hello from /opt/app");
    assert_int_equal(sh(sb.id, "cat greeting.txt", out, sizeof out), 0); /* --build-arg */
    assert_string_equal(out, "hey from /opt/app");
    assert_int_equal(sh(sb.id, "ls /opt/app; readlink /opt/app/bin/data-link", out, sizeof out), 0);
    assert_string_equal(out, "bin\ndata.txt\ngreeting.txt\ndata.txt"); /* no skip.log */
    assert_int_equal(sh(sb.id, "stat -c '%a %u' /etc/secret.txt", out, sizeof out), 0);
    assert_string_equal(out, "600 0");
    assert_int_equal(
        sh(sb.id, "cat /opt/unpacked/sub/f; readlink /opt/unpacked/link", out, sizeof out), 0);
    assert_string_equal(out, "unpacked\nsub/f");
    assert_int_equal(sh(sb.id, "stat -c '%u:%g' /home/app/owned.txt", out, sizeof out), 0);
    assert_string_equal(out, "1234:1234");
    assert_int_not_equal(sh(sb.id, "test -e /bin/vi", out, sizeof out), 0); /* deleted in a RUN */
    assert_int_equal(sh(sb.id, NULL, out, sizeof out), 0); /* no command: CMD ["hello"] */
    assert_string_equal(out, "hello from /opt/app");
    dsec_err err;
    assert_int_equal(dsec_destroy(cl, sb.id, &err), 0);
}

/* A stage's result copied into another; --target stops at a named stage. */
static void test_multi_stage(void **state)
{
    (void)state;
    put("ms/Dockerfile",
        "FROM busybox:1 AS build\n"
        "RUN mkdir -p /out/lib && echo built > /out/artifact && echo so > /out/lib/x.so\n"
        "FROM build AS test\n"
        "RUN test \"$(cat /out/artifact)\" = built\n"
        "FROM busybox:1\n"
        "COPY --from=build /out/artifact /usr/local/bin/\n"
        "COPY --from=0 /out/lib /usr/lib/app\n",
        0644);
    char errout[8192], args[512];
    snprintf(args, sizeof args, "--name ms:1 %s/ms", root);
    int rc = build(args, errout, sizeof errout);
    if (rc != 0)
        fail_msg("build exited %d: %s", rc, errout);
    dsec_sandbox_info sb;
    make("ms:1", &sb);
    char out[256];
    assert_int_equal(sh(sb.id,
                        "cat /usr/local/bin/artifact /usr/lib/app/x.so; test -e /out || echo clean",
                        out, sizeof out),
                     0);
    assert_string_equal(out, "built\nso\nclean");
    dsec_err err;
    assert_int_equal(dsec_destroy(cl, sb.id, &err), 0);

    snprintf(args, sizeof args, "--name ms-build:1 --target build %s/ms", root);
    rc = build(args, errout, sizeof errout);
    if (rc != 0)
        fail_msg("build --target exited %d: %s", rc, errout);
    make("ms-build:1", &sb);
    assert_int_equal(sh(sb.id, "cat /out/artifact", out, sizeof out), 0);
    assert_string_equal(out, "built");
    assert_int_equal(dsec_destroy(cl, sb.id, &err), 0);
}

/* Each failure names the file, the line and what went wrong; no sandbox and no environment is
 * left behind. */
static void test_failures(void **state)
{
    (void)state;
    static const struct {
        const char *dockerfile, *want;
    } cases[] = {
        {"FROM busybox:1\nRUN echo start\nRUN exit 3\n", "Dockerfile:3: RUN exit 3: exited with 3"},
        {"FROM busybox:1\nCOPY missing.txt /\n", "missing.txt: no file of the build context"},
        {"FROM busybox:1\nCOPY ../outside.txt /\n", "resolves outside the build context"},
        {"FROM busybox:1\nADD https://example.com/x.tgz /\n", "a build reaches no network"},
        {"FROM nosuch:9\n", "FROM nosuch:9: no such environment or image"},
        {"FROM busybox:1\nFETCH x\n", "Dockerfile:2: unknown instruction \"FETCH\""},
        {"RUN true\n", "the first instruction must be FROM"},
        {"FROM busybox:1\nRUN <<EOF\necho x\nEOF\n", "heredoc"},
        {"FROM busybox:1\nCOPY --from=nope /x /\n", "--from=nope: no earlier stage"},
        {"FROM busybox:1\nSHELL /bin/bash -c\n", "SHELL must be a JSON array"},
        {"FROM busybox:1\nENV A=\"unterminated\n", "unterminated double quote"},
    };
    put("bad/outside.txt", "x\n", 0644);
    size_t before = live_sandboxes();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        put("bad/ctx/Dockerfile", cases[i].dockerfile, 0644);
        char errout[8192], args[512];
        snprintf(args, sizeof args, "--quiet --name bad/case:%zu %s/bad/ctx", i, root);
        int rc = build(args, errout, sizeof errout);
        if (rc == 0 || strstr(errout, cases[i].want) == NULL)
            fail_msg("case %zu: exit %d, wanted \"%s\" in: %s", i, rc, cases[i].want, errout);
        char name[32];
        snprintf(name, sizeof name, "bad/case:%zu", i);
        assert_false(env_exists(name));
    }
    assert_int_equal(live_sandboxes(), before);
    /* usage errors: no name, a bad name, a context that is not a directory */
    char errout[4096], args[512];
    snprintf(args, sizeof args, "%s/bad/ctx", root);
    assert_int_equal(build(args, errout, sizeof errout), 2);
    snprintf(args, sizeof args, "--name 'Bad Name' %s/bad/ctx", root);
    assert_int_equal(build(args, errout, sizeof errout), 2);
    assert_non_null(strstr(errout, "expected NAME:TAG"));
    snprintf(args, sizeof args, "--name ok:1 %s/bad/ctx/Dockerfile", root);
    assert_int_not_equal(build(args, errout, sizeof errout), 0);
    assert_non_null(strstr(errout, "is not a directory"));
}

/* Run a dsec command line (with the test's registry); its stdout into out. */
static int dsec_out(const char *args, char *out, size_t n)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s --registry %s/layers", DSEC_CLI, args, root);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t k = fread(out, 1, n - 1, p);
    out[k] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* FROM an imported image named by a registry host:port reference: the build is recorded as an
 * image of its own (its base's layers with their diff_ids, one layer of its own, its CMD and
 * labels), and a sandbox from it runs with them. */
static void test_from_imported_image(void **state)
{
    (void)state;
    static const char *const applets[] = {"sh", "cat", "echo", "ls", "id"};
    ik_entry ents[16];
    size_t n = 0;
    ents[n++] = (ik_entry){.type = 'd', .path = "bin", .mode = 0755};
    ents[n++] =
        (ik_entry){.type = 'f', .path = "bin/busybox", .mode = 0755, .from_file = "/bin/busybox"};
    for (size_t i = 0; i < sizeof applets / sizeof *applets; i++) {
        static char paths[8][32];
        snprintf(paths[i], sizeof paths[i], "bin/%s", applets[i]);
        ents[n++] = (ik_entry){.type = 'l', .path = paths[i], .data = "busybox", .mode = 0777};
    }
    ents[n++] = (ik_entry){.type = 'd', .path = "etc", .mode = 0755};
    ents[n++] = (ik_entry){
        .type = 'f', .path = "etc/passwd", .mode = 0644, .data = "root:x:0:0:root:/root:/bin/sh\n"};
    ik_layer base = {0}; /* truncate_to must be 0: a whole layer */
    ik_layer_make(&base, ents, n, true);
    ik_layer *layers[] = {&base};
    ik_image im = {.config_json_extra = "\"Env\":[\"PATH=/bin\",\"FROM_BASE=1\"],"
                                        "\"Labels\":{\"base\":\"yes\"}",
                   .ref = "1"};
    char dir[256], args[1024], out[8192];
    snprintf(dir, sizeof dir, "%s/base-oci", root);
    ik_write_oci_dir(dir, &im, layers, 1);
    snprintf(args, sizeof args, "image import %s --name 127.0.0.1:5000/swe/base:1", dir);
    assert_int_equal(dsec_out(args, out, sizeof out), 0);

    put("fromimg/Dockerfile",
        "FROM 127.0.0.1:5000/swe/base:1\n"
        "RUN echo \"built $FROM_BASE\" > /built\n"
        "LABEL task=7\n"
        "CMD [\"cat\", \"/built\"]\n",
        0644);
    snprintf(args, sizeof args, "--quiet --name swe/task-7:1 %s/fromimg", root);
    char errout[8192];
    int rc = build(args, errout, sizeof errout);
    if (rc != 0)
        fail_msg("build exited %d: %s", rc, errout);

    assert_int_equal(dsec_out("image inspect swe/task-7:1 --json", out, sizeof out), 0);
    assert_non_null(strstr(out, "\"ref\":\"swe/task-7:1\""));
    assert_non_null(strstr(out, "\"cmd\":[\"cat\",\"/built\"]"));
    assert_non_null(strstr(out, "\"base=yes\"")); /* the base's labels carry over */
    assert_non_null(strstr(out, "\"task=7\""));
    char want[128];
    snprintf(want, sizeof want, "{\"diff_id\":\"%s\"",
             base.diff_id); /* the base layer, as imported */
    assert_non_null(strstr(out, want));
    const char *l2 = strstr(strstr(out, want) + 1, "{\"diff_id\"");
    assert_non_null(l2); /* and one layer of the build's own */
    assert_null(strstr(l2 + 1, "{\"diff_id\""));
    assert_int_equal(dsec_out("image ls", out, sizeof out), 0);
    assert_non_null(strstr(out, "swe/task-7:1"));
    assert_non_null(strstr(out, "127.0.0.1:5000/swe/base:1"));

    dsec_sandbox_info sb;
    make("swe/task-7:1", &sb);
    assert_int_equal(sh(sb.id, "cat /built; echo $FROM_BASE", out, sizeof out), 0);
    assert_string_equal(out, "built 1\n1");
    /* the default command, from the command line too: CMD ["cat", "/built"] */
    snprintf(args, sizeof args, "DSEC_URL=%s DSEC_TENANT=imgbuild %s exec %s",
             dsec_natsd_url(natsd), DSEC_CLI, sb.id);
    FILE *p = popen(args, "r");
    assert_non_null(p);
    size_t k = fread(out, 1, sizeof out - 1, p);
    out[k] = '\0';
    assert_int_equal(pclose(p), 0);
    assert_string_equal(out, "built 1\n");
    dsec_err err;
    assert_int_equal(dsec_destroy(cl, sb.id, &err), 0);

    /* a base with an ENTRYPOINT: a Dockerfile that sets only CMD keeps it, as Docker does */
    ik_image ime = {.config_json_extra = "\"Env\":[\"PATH=/bin\"],"
                                         "\"Entrypoint\":[\"echo\",\"entry:\"],"
                                         "\"Cmd\":[\"base-cmd\"]",
                    .ref = "1"};
    snprintf(dir, sizeof dir, "%s/entry-oci", root);
    ik_write_oci_dir(dir, &ime, layers, 1);
    snprintf(args, sizeof args, "image import %s --name swe/entry:1", dir);
    assert_int_equal(dsec_out(args, out, sizeof out), 0);
    put("cmdonly/Dockerfile", "FROM swe/entry:1\nCMD [\"task-cmd\"]\n", 0644);
    snprintf(args, sizeof args, "--quiet --name swe/cmdonly:1 %s/cmdonly", root);
    rc = build(args, errout, sizeof errout);
    if (rc != 0)
        fail_msg("build exited %d: %s", rc, errout);
    assert_int_equal(dsec_out("image inspect swe/cmdonly:1 --json", out, sizeof out), 0);
    assert_non_null(strstr(out, "\"cmd\":[\"echo\",\"entry:\",\"task-cmd\"]"));
    make("swe/cmdonly:1", &sb);
    assert_int_equal(sh(sb.id, NULL, out, sizeof out), 0);
    assert_string_equal(out, "entry: task-cmd");
    assert_int_equal(dsec_destroy(cl, sb.id, &err), 0);

    /* an image without Entrypoint or Cmd: an exec that names no command says so */
    make("127.0.0.1:5000/swe/base:1", &sb);
    const char *none[] = {NULL};
    dsec_exec_opts eo = {.argv = none, .timeout_ms = 20000};
    dsec_exec_reply r;
    assert_int_equal(dsec_exec(cl, sb.id, &eo, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "no default command"));
    assert_int_equal(dsec_destroy(cl, sb.id, &err), 0);
    ik_layer_free(&base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_build_and_run),
        cmocka_unit_test(test_multi_stage),
        cmocka_unit_test(test_from_imported_image),
        cmocka_unit_test(test_failures),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
