/* test_client_images.c - libdsec.so's image calls as an outside C program makes them. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/err.h"
#include "dsec/image.h"
#include "dsec/layers.h"
#include "image_kit.h"

/* Import, list, get and remove in a directory registry and in a cell's JetStream registry
 * (over the client's connection and over one of its own), and the errors. Only what
 * libdsec.so exports is used (the build links nothing else of dsec but image_kit's hasher),
 * so a symbol missing from client/exports.map fails the link. */

#define REF_A "registry.local:5000/swe/task:1"
#define REF_B "swe/other:2"
#define CONFIG_A                                                                                   \
    "\"Env\":[\"PATH=/bin\",\"GREETING=hi\"],\"Entrypoint\":[\"/bin/sh\",\"-c\"],"                 \
    "\"Cmd\":[\"echo hi\"],\"Labels\":{\"org.test\":\"yes\"}"

static const ik_entry BASE[] = {
    {'d', "bin", NULL, 0755, 0, 0, NULL, NULL},
    {'l', "bin/sh", "/bin/busybox", 0777, 0, 0, NULL, NULL},
    {'d', "etc", NULL, 0755, 0, 0, NULL, NULL},
    {'f', "etc/os-release", "ID=test\n", 0644, 0, 0, NULL, NULL},
    {'d', "del", NULL, 0755, 0, 0, NULL, NULL},
    {'f', "del/gone.txt", "deleted above\n", 0644, 0, 0, NULL, NULL},
};
/* a whiteout: the import makes it a 0/0 device node, which takes root */
static const ik_entry APP[] = {
    {'f', "del/.wh.gone.txt", "", 0644, 0, 0, NULL, NULL},
    {'f', "app.txt", "app\n", 0644, 0, 0, NULL, NULL},
};
static const ik_entry APP2[] = {
    {'f', "task.txt", "task two\n", 0644, 0, 0, NULL, NULL},
};

static char top[64];        /* this run's temp dir */
static char tar_a[128];     /* docker-archive: base + app, RepoTags REF_A */
static char tar_b[128];     /* docker-archive: base + app2, no RepoTags */
static char not_image[128]; /* a text file */
static char work[128];      /* import scratch */
static ik_layer base, app, app2;
static pid_t nats_pid = -1;
static char nats_url[64];

#define pathf ik_pathf

/* ---- a nats-server with JetStream, started here (libdsec.so has no server helper) -------- */

static const char *nats_binary(void)
{
    static char found[256];
    const char *env = getenv("DSEC_NATS_SERVER");
    if (env != NULL && env[0] != '\0')
        return env;
    const char *path = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof dirs, "%s:/usr/sbin:/usr/bin", path != NULL ? path : "");
    for (char *save, *d = strtok_r(dirs, ":", &save); d != NULL; d = strtok_r(NULL, ":", &save)) {
        snprintf(found, sizeof found, "%s/nats-server", d);
        if (access(found, X_OK) == 0)
            return found;
    }
    return NULL;
}

/* A loopback port nothing listens on right now. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static bool port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* Start `nats-server -js` on a free port with its store under top; a port taken between
 * the probe and the server's bind is tried again with another. */
static int nats_start(void)
{
    const char *bin = nats_binary();
    if (bin == NULL) {
        fprintf(stderr, "test_client_images: nats-server not found (PATH, /usr/sbin, /usr/bin "
                        "or $DSEC_NATS_SERVER)\n");
        return -1;
    }
    char *store = pathf("%s/js", top), *log = pathf("%s/nats.log", top);
    for (int attempt = 0; attempt < 5; attempt++) {
        int port = free_port();
        if (port < 0)
            return -1;
        char ports[16];
        snprintf(ports, sizeof ports, "%d", port);
        pid_t pid = fork();
        if (pid < 0)
            return -1;
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
            }
            execl(bin, "nats-server", "-a", "127.0.0.1", "-p", ports, "-js", "-sd", store,
                  (char *)NULL);
            _exit(127);
        }
        for (int i = 0; i < 200; i++) { /* 10 s */
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid)
                break; /* died: the port was taken, or worse (the log says) */
            if (port_open(port)) {
                nats_pid = pid;
                snprintf(nats_url, sizeof nats_url, "nats://127.0.0.1:%d", port);
                return 0;
            }
            usleep(50 * 1000);
        }
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    fprintf(stderr, "test_client_images: nats-server did not start (see %s)\n", log);
    return -1;
}

static void nats_stop(void)
{
    if (nats_pid <= 0)
        return;
    kill(nats_pid, SIGTERM);
    for (int i = 0; i < 100 && waitpid(nats_pid, NULL, WNOHANG) == 0; i++)
        usleep(50 * 1000);
    kill(nats_pid, SIGKILL);
    waitpid(nats_pid, NULL, 0);
    nats_pid = -1;
}

/* ---- fixtures ----------------------------------------------------------------------------- */

static int setup_all(void **state)
{
    (void)state;
    snprintf(top, sizeof top, "/var/tmp/dsec-test-climg-%d.XXXXXX", (int)getpid());
    if (mkdtemp(top) == NULL) {
        perror("mkdtemp");
        return -1;
    }
    snprintf(tar_a, sizeof tar_a, "%s/a.tar", top);
    snprintf(tar_b, sizeof tar_b, "%s/b.tar", top);
    snprintf(not_image, sizeof not_image, "%s/notes.txt", top);
    snprintf(work, sizeof work, "%s/work", top);
    ik_layer_make(&base, BASE, sizeof BASE / sizeof *BASE, true);
    ik_layer_make(&app, APP, sizeof APP / sizeof *APP, false);
    ik_layer_make(&app2, APP2, sizeof APP2 / sizeof *APP2, true);
    ik_layer *la[] = {&base, &app}, *lb[] = {&base, &app2};
    ik_image ia = {.config_json_extra = CONFIG_A, .ref = REF_A};
    ik_image ib = {.config_json_extra = "\"Env\":[\"PATH=/bin\"],\"Cmd\":[\"cat\",\"task.txt\"]"};
    ik_write_docker_archive(tar_a, &ia, la, 2);
    ik_write_docker_archive(tar_b, &ib, lb, 2);
    FILE *f = fopen(not_image, "w");
    if (f == NULL || fputs("not an image\n", f) < 0 || fclose(f) != 0)
        return -1;
    return nats_start();
}

static int teardown_all(void **state)
{
    (void)state;
    nats_stop();
    ik_layer_free(&base);
    ik_layer_free(&app);
    ik_layer_free(&app2);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    return system(cmd) == 0 ? 0 : -1;
}

static void count_line(void *arg, const char *line)
{
    (void)line;
    ++*(int *)arg;
}

static dsec_image_info *import_ok(dsec_layer_registry *r, const char *path, const char *ref,
                                  dsec_layer_format fmt, int *lines)
{
    dsec_image_import_opts o = {.ref = ref,
                                .format = fmt,
                                .work_dir = work,
                                .progress = lines ? count_line : NULL,
                                .progress_arg = lines};
    dsec_image_info *info = NULL;
    dsec_err err;
    if (dsec_image_import(r, path, &o, &info, &err) != 0)
        fail_msg("import %s: %s", path, err.msg);
    return info;
}

static size_t count_images(dsec_layer_registry *r)
{
    dsec_image_info *v;
    size_t n;
    dsec_err err;
    if (dsec_image_list(r, &v, &n, &err) != 0)
        fail_msg("list: %s", err.msg);
    dsec_image_infos_free(v, n);
    return n;
}

/*
 * The same story in any registry: A (base + app) imported and checked, listed, found; B over
 * the same base reuses it; A removed, B stays. fmt: the layers' format.
 */
static void import_list_get_remove(dsec_layer_registry *r, dsec_layer_format fmt)
{
    int lines = 0;
    dsec_image_info *a = import_ok(r, tar_a, NULL, fmt, &lines);
    assert_true(lines > 0); /* the progress callback crossed the library boundary */
    assert_string_equal(a->ref, REF_A);
    assert_string_equal(a->env, REF_A);
    assert_true(dsec_digest_valid(a->manifest) && dsec_digest_valid(a->config));
    assert_int_equal(a->nlayers, 2);
    assert_string_equal(a->layers[0].diff_id, base.diff_id);
    assert_string_equal(a->layers[1].diff_id, app.diff_id);
    assert_false(a->layers[0].reused || a->layers[1].reused);
    assert_true(a->layers[0].size > 0 && dsec_digest_valid(a->layers[0].layer));
    assert_int_equal(a->ncmd, 3);
    assert_string_equal(a->cmd[0], "/bin/sh");
    assert_string_equal(a->cmd[1], "-c");
    assert_string_equal(a->cmd[2], "echo hi");
    assert_int_equal(a->nlabels, 1);
    assert_string_equal(a->labels[0], "org.test=yes");
    assert_true(a->created_unix > 1600000000 && a->created_unix <= (int64_t)time(NULL) + 1);

    /* listed; found by reference (normalized: no tag means :latest) and by manifest digest */
    dsec_image_info *v, *g;
    size_t n;
    dsec_err err;
    assert_int_equal(dsec_image_list(r, &v, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].ref, REF_A);
    assert_int_equal(v[0].nlayers, 2);
    assert_string_equal(v[0].manifest, a->manifest);
    dsec_image_infos_free(v, n);
    assert_int_equal(dsec_image_get(r, REF_A, &g, &err), 0);
    assert_string_equal(g->config, a->config);
    assert_string_equal(g->layers[1].layer, a->layers[1].layer);
    dsec_image_info_free(g);
    assert_int_equal(dsec_image_get(r, a->manifest, &g, &err), 0);
    assert_string_equal(g->ref, REF_A);
    dsec_image_info_free(g);
    assert_int_equal(dsec_image_get(r, "swe/nope", &g, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "swe/nope"));

    /* B over the same base: the base layer is reused, B's own is new */
    dsec_image_info *b = import_ok(r, tar_b, REF_B, fmt, NULL);
    assert_string_equal(b->ref, REF_B);
    assert_true(b->layers[0].reused);
    assert_false(b->layers[1].reused);
    assert_string_equal(b->layers[0].layer, a->layers[0].layer);
    assert_int_equal(b->ncmd, 2);
    assert_int_equal(count_images(r), 2);

    /* remove A: gone, B intact, a second remove says not found */
    assert_int_equal(dsec_image_remove(r, REF_A, &err), 0);
    assert_int_equal(dsec_image_get(r, REF_A, &g, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(dsec_image_remove(r, REF_A, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(dsec_image_list(r, &v, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].ref, REF_B);
    assert_string_equal(v[0].layers[0].layer, a->layers[0].layer);
    dsec_image_infos_free(v, n);
    dsec_image_info_free(a);
    dsec_image_info_free(b);
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_directory_registry(void **state)
{
    (void)state;
    char *dir = pathf("%s/reg-dir", top);
    dsec_layer_registry *r;
    dsec_err err;
    if (dsec_layer_registry_open(&r, dir, &err) != 0)
        fail_msg("open %s: %s", dir, err.msg);
    assert_string_equal(dsec_layer_registry_kind(r), "local");
    import_list_get_remove(r, DSEC_LAYER_DIR);
    dsec_layer_registry_free(r);

    /* what was left is in the directory: another opener sees B alone */
    assert_int_equal(dsec_layer_registry_local(&r, dir, &err), 0);
    dsec_image_info *g;
    assert_int_equal(dsec_image_get(r, REF_B, &g, &err), 0);
    assert_int_equal(g->nlayers, 2);
    dsec_image_info_free(g);
    assert_int_equal(count_images(r), 1);
    assert_int_equal(dsec_image_remove(r, REF_B, &err), 0);
    assert_int_equal(count_images(r), 0);
    dsec_layer_registry_free(r);
}

static void test_errors(void **state)
{
    (void)state;
    dsec_layer_registry *r;
    dsec_err err;
    char *dir = pathf("%s/reg-err", top);
    assert_int_equal(dsec_layer_registry_open(&r, dir, &err), 0);

    /* a text file and a missing path are not images: the message names them, nothing is kept */
    dsec_image_info *info = NULL;
    dsec_image_import_opts o = {.format = DSEC_LAYER_DIR, .work_dir = work};
    assert_int_equal(dsec_image_import(r, not_image, &o, &info, &err), -1);
    assert_null(info);
    assert_int_not_equal(err.code, 0);
    if (strstr(err.msg, not_image) == NULL)
        fail_msg("the error does not name %s: %s", not_image, err.msg);
    char *missing = pathf("%s/no-such.tar", top);
    assert_int_equal(dsec_image_import(r, missing, &o, &info, &err), -1);
    if (strstr(err.msg, missing) == NULL)
        fail_msg("the error does not name %s: %s", missing, err.msg);
    assert_int_equal(count_images(r), 0);
    dsec_image_info *g;
    assert_int_equal(dsec_image_get(r, "swe/a b", &g, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    dsec_layer_registry_free(r);

    /* registries that cannot be opened, each named */
    const char *bad[] = {"ftp://host/layers", "nats://",
                         "nats://127.0.0.1:4222?bucket=", "nats://127.0.0.1:4222?bkt=X"};
    static char sentinel;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        r = (dsec_layer_registry *)&sentinel; /* must come back NULL */
        if (dsec_layer_registry_open(&r, bad[i], &err) != -1)
            fail_msg("registry %s was opened", bad[i]);
        assert_null(r);
        assert_int_equal(err.code, DSEC_E_INVALID);
        if (strstr(err.msg, bad[i]) == NULL)
            fail_msg("the error does not name %s: %s", bad[i], err.msg);
    }
    assert_int_equal(dsec_layer_registry_open(&r, "", &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    /* nothing listens there: the connection fails, and says for which registry */
    char *dead = pathf("nats://127.0.0.1:%d", free_port());
    assert_int_equal(dsec_layer_registry_open(&r, dead, &err), -1);
    assert_null(r);
    if (strstr(err.msg, dead) == NULL)
        fail_msg("the error does not name %s: %s", dead, err.msg);

    /* references parse as Docker writes them */
    char *host, *path, *tag, *digest;
    assert_int_equal(dsec_image_ref_parse(REF_A, &host, &path, &tag, &digest, &err), 0);
    assert_string_equal(host, "registry.local:5000");
    assert_string_equal(path, "swe/task");
    assert_string_equal(tag, "1");
    assert_null(digest);
    dsec_free(host), dsec_free(path), dsec_free(tag);
    assert_int_equal(
        dsec_image_ref_parse("swe/task@sha256:beef", &host, &path, &tag, &digest, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "sha256:beef"));
}

/* The cell's JetStream registry: over the client's connection and over one of its own. */
static void test_jetstream_registry(void **state)
{
    (void)state;
    dsec_client *c;
    dsec_err err;
    dsec_client_opts co = {.url = nats_url, .name = "test-client-images"};
    if (dsec_client_connect(&c, &co, &err) != 0)
        fail_msg("connect %s: %s", nats_url, err.msg);
    dsec_layer_registry *r;
    if (dsec_client_layer_registry(c, NULL, &r, &err) != 0)
        fail_msg("client registry: %s", err.msg);
    assert_string_equal(dsec_layer_registry_kind(r), "jetstream");
    import_list_get_remove(r, 0); /* 0: EROFS layers */
    dsec_layer_registry_free(r);

    /* another bucket, opened by URL on a connection the registry owns */
    char *where = pathf("%s?bucket=CLIMG", nats_url);
    if (dsec_layer_registry_open(&r, where, &err) != 0)
        fail_msg("open %s: %s", where, err.msg);
    assert_string_equal(dsec_layer_registry_kind(r), "jetstream");
    assert_int_equal(count_images(r), 0); /* not DSEC_LAYERS */
    dsec_image_info *a = import_ok(r, tar_a, NULL, DSEC_LAYER_DIR, NULL);
    dsec_layer_registry_free(r); /* closes its connection too */

    /* the same bucket through the client: the record is the cell's, not the connection's */
    assert_int_equal(dsec_client_layer_registry(c, "CLIMG", &r, &err), 0);
    dsec_image_info *g;
    assert_int_equal(dsec_image_get(r, REF_A, &g, &err), 0);
    assert_string_equal(g->manifest, a->manifest);
    assert_string_equal(g->layers[0].layer, a->layers[0].layer);
    dsec_image_info_free(g);
    assert_int_equal(dsec_image_remove(r, REF_A, &err), 0);
    assert_int_equal(count_images(r), 0);
    dsec_layer_registry_free(r);
    dsec_image_info_free(a);

    /* the bucket's name is checked */
    assert_int_equal(dsec_client_layer_registry(c, "bad bucket!", &r, &err), -1);
    assert_null(r);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "bad bucket!"));
    dsec_client_free(c);
}

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_client_images: skipped: needs root (whiteouts become device "
                        "nodes)\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_directory_registry),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_jetstream_registry),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
