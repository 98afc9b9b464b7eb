/* test_image.c - image import for real: docker-archive, OCI layout and OCI archive into a local
 * registry; whiteouts, links, modes; layer reuse; every hostile archive refused with nothing left.
 */
#define _GNU_SOURCE
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
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
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "dsec/alloc.h"
#include "dsec/err.h"
#include "dsec/image.h"
#include "dsec/layers.h"
#include "image_kit.h"

static char top[64];     /* this run's temp dir */
static char regdir[128]; /* the registry */
static char work[128];   /* import scratch */
static ik_layer base, app, app2;

#define pathf ik_pathf

#define PASSWD "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234:app:/home/app:/bin/sh\n"
#define GROUP "root:x:0:\napp:x:1234:\n"
#define CONFIG_EXTRA                                                                               \
    "\"Env\":[\"PATH=/bin\",\"GREETING=hello image\"],\"WorkingDir\":\"/work\","                   \
    "\"User\":\"app\",\"Entrypoint\":[\"/bin/sh\",\"-c\"],\"Cmd\":[\"echo hi\"],"                  \
    "\"Labels\":{\"org.test\":\"yes\"}"

/* The base: busybox with its applets as absolute symlinks, users, and what layer 2 changes. */
static const ik_entry BASE[] = {
    {'d', "bin", NULL, 0755, 0, 0, NULL, NULL},
    {'f', "bin/busybox", NULL, 0755, 0, 0, "/bin/busybox", NULL},
    {'l', "bin/sh", "/bin/busybox", 0777, 0, 0, NULL, NULL},
    {'l', "bin/id", "/bin/busybox", 0777, 0, 0, NULL, NULL},
    {'l', "bin/ls", "/bin/busybox", 0777, 0, 0, NULL, NULL},
    {'l', "bin/cat", "/bin/busybox", 0777, 0, 0, NULL, NULL},
    {'l', "bin/stat", "/bin/busybox", 0777, 0, 0, NULL, NULL},
    {'l', "bin/env", "/bin/busybox", 0777, 0, 0, NULL, NULL},
    {'l', "bin/pwd", "/bin/busybox", 0777, 0, 0, NULL, NULL},
    {'f', "bin/suid", "#!/bin/sh\n", 04755, 0, 0, NULL, NULL},
    {'d', "etc", NULL, 0755, 0, 0, NULL, NULL},
    {'f', "etc/passwd", PASSWD, 0644, 0, 0, NULL, NULL},
    {'f', "etc/group", GROUP, 0644, 0, 0, NULL, NULL},
    {'d', "home/app", NULL, 0755, 1234, 1234, NULL, NULL}, /* parent "home" implied */
    {'d', "del", NULL, 0755, 0, 0, NULL, NULL},
    {'f', "del/gone.txt", "deleted above\n", 0644, 0, 0, NULL, NULL},
    {'d', "opq", NULL, 0755, 0, 0, NULL, NULL},
    {'f', "opq/lower.txt", "hidden by the opaque dir\n", 0644, 0, 0, NULL, NULL},
    {'p', "fifo", NULL, 0600, 0, 0, NULL, NULL},
    {'f', "xattr.txt", "x\n", 0644, 0, 0, NULL, "user.test=v1"},
};

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

static const ik_entry APP2[] = {
    {'f', "task.txt", "task two\n", 0644, 0, 0, NULL, NULL},
};

static dsec_layer_registry *open_reg(void)
{
    dsec_layer_registry *r;
    dsec_err err;
    if (dsec_layer_registry_local(&r, regdir, &err) != 0)
        fail_msg("registry: %s", err.msg);
    return r;
}

static dsec_image_info *import_ok(dsec_layer_registry *r, const char *path, const char *ref,
                                  dsec_layer_format fmt)
{
    dsec_image_import_opts o = {.ref = ref, .format = fmt, .work_dir = work};
    dsec_image_info *info;
    dsec_err err;
    if (dsec_image_import(r, path, &o, &info, &err) != 0)
        fail_msg("import %s: %s", path, err.msg);
    return info;
}

static size_t count_dir(const char *p)
{
    DIR *d = opendir(p);
    size_t n = 0;
    if (d == NULL)
        return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

static int setup_all(void **state)
{
    (void)state;
    snprintf(top, sizeof top, "/var/tmp/dsec-test-image-%d.XXXXXX", (int)getpid());
    if (mkdtemp(top) == NULL)
        return -1;
    snprintf(regdir, sizeof regdir, "%s/reg", top);
    snprintf(work, sizeof work, "%s/work", top);
    ik_layer_make(&base, BASE, sizeof BASE / sizeof *BASE, true);
    ik_layer_make(&app, APP, sizeof APP / sizeof *APP, false);
    ik_layer_make(&app2, APP2, sizeof APP2 / sizeof *APP2, true);
    return 0;
}

static int teardown_all(void **state)
{
    (void)state;
    ik_layer_free(&base);
    ik_layer_free(&app);
    ik_layer_free(&app2);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    return system(cmd) == 0 ? 0 : -1;
}

/* Start each test from an empty registry. */
static int setup(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s' '%s/img'; mkdir -p '%s/img'", regdir, work, top,
             top);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- reading a DIR-format layer back ------------------------------------------------------ */

typedef struct seen_entry {
    mode_t type, perm;
    unsigned uid, rdev_major, rdev_minor;
    char link[256], hardlink[256], xattr[256];
    bool found;
} seen_entry;

/* Find path in the tar blob of layer digest (a DIR layer) and describe it. */
static seen_entry layer_entry(dsec_layer_registry *r, const char *digest, const char *path)
{
    char *dest = pathf("%s/fetched-%d", top, rand());
    dsec_err err;
    if (dsec_layer_registry_get(r, digest, dest, &err) != 0)
        fail_msg("get %s: %s", digest, err.msg);
    seen_entry s = {0};
    struct archive *a = archive_read_new();
    archive_read_support_format_tar(a);
    assert_int_equal(archive_read_open_filename(a, dest, 65536), ARCHIVE_OK);
    struct archive_entry *e;
    while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
        const char *p = archive_entry_pathname(e);
        while (p[0] == '.' && p[1] == '/')
            p += 2;
        size_t pl = strlen(p);
        if (strncmp(p, path, strlen(path)) != 0 ||
            !(pl == strlen(path) || (pl == strlen(path) + 1 && p[pl - 1] == '/')))
            continue;
        s.found = true;
        s.type = archive_entry_filetype(e);
        s.perm = archive_entry_perm(e);
        s.uid = (unsigned)archive_entry_uid(e);
        s.rdev_major = (unsigned)archive_entry_rdevmajor(e);
        s.rdev_minor = (unsigned)archive_entry_rdevminor(e);
        if (archive_entry_symlink(e))
            snprintf(s.link, sizeof s.link, "%s", archive_entry_symlink(e));
        if (archive_entry_hardlink(e))
            snprintf(s.hardlink, sizeof s.hardlink, "%s", archive_entry_hardlink(e));
        const char *n;
        const void *v;
        size_t vl;
        archive_entry_xattr_reset(e);
        while (archive_entry_xattr_next(e, &n, &v, &vl) == ARCHIVE_OK)
            snprintf(s.xattr + strlen(s.xattr), sizeof s.xattr - strlen(s.xattr), "%s=%.*s;", n,
                     (int)vl, (const char *)v);
    }
    archive_read_free(a);
    unlink(dest);
    return s;
}

static bool any_whiteout_file(dsec_layer_registry *r, const char *digest)
{
    char *dest = pathf("%s/fetched-wh-%d", top, rand());
    dsec_err err;
    assert_int_equal(dsec_layer_registry_get(r, digest, dest, &err), 0);
    struct archive *a = archive_read_new();
    archive_read_support_format_tar(a);
    assert_int_equal(archive_read_open_filename(a, dest, 65536), ARCHIVE_OK);
    struct archive_entry *e;
    bool found = false;
    while (archive_read_next_header(a, &e) == ARCHIVE_OK)
        found |= strstr(archive_entry_pathname(e), ".wh.") != NULL;
    archive_read_free(a);
    unlink(dest);
    return found;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_docker_archive(void **state)
{
    (void)state;
    ik_layer *ls[] = {&base, &app};
    ik_image im = {.config_json_extra = CONFIG_EXTRA, .ref = "127.0.0.1:5000/swe/task:1"};
    char *tar = pathf("%s/img/docker.tar", top);
    ik_write_docker_archive(tar, &im, ls, 2);
    dsec_layer_registry *r = open_reg();
    dsec_image_info *info = import_ok(r, tar, NULL, DSEC_LAYER_DIR);
    assert_string_equal(info->ref, "127.0.0.1:5000/swe/task:1");
    assert_string_equal(info->env, "127.0.0.1:5000/swe/task:1");
    assert_int_equal(info->nlayers, 2);
    assert_false(info->layers[0].reused || info->layers[1].reused);
    assert_string_equal(info->layers[0].diff_id, base.diff_id);
    assert_int_equal(info->ncmd, 3);
    assert_string_equal(info->cmd[0], "/bin/sh");
    assert_string_equal(info->cmd[2], "echo hi");
    assert_int_equal(info->nlabels, 1);
    assert_string_equal(info->labels[0], "org.test=yes");

    /* the environment, by the name create(env=...) uses */
    dsec_env *e;
    dsec_err err;
    if (dsec_layer_registry_env_get(r, "127.0.0.1:5000/swe/task:1", &e, &err) != 0)
        fail_msg("env: %s", err.msg);
    assert_int_equal(e->nlayers, 2);
    assert_string_equal(e->layers[1], info->layers[1].layer);
    assert_int_equal(e->nvars, 2);
    assert_string_equal(e->vars[1], "GREETING=hello image");
    assert_string_equal(e->workdir, "/work");
    assert_string_equal(e->user, "app");
    assert_int_equal(e->ncmd, 3);
    assert_string_equal(e->image, info->ref);
    assert_string_equal(e->image_digest, info->manifest);
    dsec_env_free(e);

    /* listed, and found by reference and by digest */
    dsec_image_info *v, *g;
    size_t n;
    assert_int_equal(dsec_image_list(r, &v, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].ref, info->ref);
    assert_int_equal(v[0].nlayers, 2);
    dsec_image_infos_free(v, n);
    assert_int_equal(dsec_image_get(r, "127.0.0.1:5000/swe/task:1", &g, &err), 0);
    dsec_image_info_free(g);
    assert_int_equal(dsec_image_get(r, info->manifest, &g, &err), 0);
    dsec_image_info_free(g);
    assert_int_equal(dsec_image_get(r, "swe/nope", &g, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);

    /* the layers as converted: whiteouts, opaque dir, links, modes, owners, xattrs */
    const char *l0 = info->layers[0].layer, *l1 = info->layers[1].layer;
    seen_entry s = layer_entry(r, l1, "del/gone.txt");
    assert_true(s.found && s.type == AE_IFCHR && s.rdev_major == 0 && s.rdev_minor == 0);
    s = layer_entry(r, l1, "opq");
    assert_true(s.found && s.type == AE_IFDIR);
    assert_non_null(strstr(s.xattr, "trusted.overlay.opaque=y"));
    s = layer_entry(r, l1, "other/b.txt");
    if (!s.found || strstr(s.hardlink, "data/a.txt") == NULL)
        s = layer_entry(r, l1, "data/a.txt"); /* the tar may list either name first */
    assert_true(s.found && strstr(s.hardlink, ".txt") != NULL);
    assert_false(any_whiteout_file(r, l1));
    s = layer_entry(r, l0, "bin/suid");
    assert_true(s.found && s.perm == 04755);
    s = layer_entry(r, l0, "bin/sh");
    assert_true(s.found && s.type == AE_IFLNK);
    assert_string_equal(s.link, "/bin/busybox");
    s = layer_entry(r, l0, "home/app");
    assert_true(s.found && s.uid == 1234);
    s = layer_entry(r, l0, "fifo");
    assert_true(s.found && s.type == AE_IFIFO);
    s = layer_entry(r, l0, "xattr.txt");
    assert_non_null(strstr(s.xattr, "user.test=v1"));
    assert_int_equal(count_dir(work), 0); /* scratch cleaned */
    dsec_image_info_free(info);
    dsec_layer_registry_free(r);
}

static uint64_t registry_bytes(dsec_layer_registry *r)
{
    dsec_layer_info *v;
    size_t n;
    dsec_err err;
    assert_int_equal(dsec_layer_registry_list(r, &v, &n, &err), 0);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i].size;
    dsec_layer_infos_free(v, n);
    return sum;
}

static void test_oci_layouts_and_reuse(void **state)
{
    (void)state;
    ik_layer *ls[] = {&base, &app}, *ls2[] = {&base, &app2};
    ik_image im = {.config_json_extra = CONFIG_EXTRA, .ref = "registry.local:5000/swe/task-1"};
    ik_image im2 = {.config_json_extra = "\"Env\":[\"PATH=/bin\"]", .nested_index = true};
    char *dir = pathf("%s/img/oci1", top), *otar = pathf("%s/img/oci1.tar", top);
    char *dir2 = pathf("%s/img/oci2", top);
    ik_write_oci_dir(dir, &im, ls, 2);
    ik_tar_dir(dir, otar);
    ik_write_oci_dir(dir2, &im2, ls2, 2);
    dsec_layer_registry *r = open_reg();
    dsec_image_info *a = import_ok(r, dir, NULL, 0);
    assert_string_equal(a->ref, "registry.local:5000/swe/task-1:latest");
    assert_false(a->layers[0].reused || a->layers[1].reused);
    uint64_t after_a = registry_bytes(r);

    /* the same image as an OCI archive: nothing converted, nothing stored */
    dsec_image_info *b = import_ok(r, otar, "swe/copy:2", 0);
    assert_true(b->layers[0].reused && b->layers[1].reused);
    assert_string_equal(b->layers[0].layer, a->layers[0].layer);
    assert_string_equal(b->manifest, a->manifest);
    assert_int_equal(registry_bytes(r), after_a);

    /* a second task over the same base (nested index): the base reused, its own layer added */
    dsec_image_info *c = import_ok(r, dir2, "swe/task-2", 0);
    assert_true(c->layers[0].reused);
    assert_false(c->layers[1].reused);
    assert_int_equal(registry_bytes(r), after_a + c->layers[1].size);
    assert_true(c->layers[1].size < a->layers[0].size);

    dsec_image_info *v;
    size_t n;
    dsec_err err;
    assert_int_equal(dsec_image_list(r, &v, &n, &err), 0);
    assert_int_equal(n, 3);
    dsec_image_infos_free(v, n);

    /* removal: shared layers stay while an image holds them */
    assert_int_equal(dsec_image_remove(r, "registry.local:5000/swe/task-1", &err), 0);
    dsec_env *e;
    assert_int_equal(dsec_layer_registry_env_get(r, a->env, &e, &err), -1);
    assert_int_equal(registry_bytes(r), after_a + c->layers[1].size); /* copy holds both */
    assert_int_equal(dsec_image_remove(r, "swe/copy:2", &err), 0);
    assert_int_equal(registry_bytes(r), a->layers[0].size + c->layers[1].size);
    char **keys;
    assert_int_equal(dsec_layer_registry_doc_list(r, "diffid", &keys, &n, &err), 0);
    assert_int_equal(n, 2); /* app's record went with its layer */
    dsec_layer_names_free(keys, n);
    assert_int_equal(dsec_image_remove(r, "swe/copy:2", &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    dsec_image_info_free(a);
    dsec_image_info_free(b);
    dsec_image_info_free(c);
    dsec_layer_registry_free(r);
}

/* Nothing of a failed import may be left: no image, environment, diff_id record, blob, scratch. */
static void assert_nothing_left(dsec_layer_registry *r, const char *what)
{
    dsec_err err;
    size_t n;
    dsec_image_info *v;
    char **names;
    assert_int_equal(dsec_image_list(r, &v, &n, &err), 0);
    dsec_image_infos_free(v, n);
    if (n != 0)
        fail_msg("%s: an image record was left", what);
    assert_int_equal(dsec_layer_registry_env_list(r, &names, &n, &err), 0);
    dsec_layer_names_free(names, n);
    if (n != 0)
        fail_msg("%s: an environment was left", what);
    assert_int_equal(dsec_layer_registry_doc_list(r, "diffid", &names, &n, &err), 0);
    dsec_layer_names_free(names, n);
    if (n != 0)
        fail_msg("%s: a diff_id record was left", what);
    if (registry_bytes(r) != 0)
        fail_msg("%s: a layer was left", what);
    if (count_dir(work) != 0)
        fail_msg("%s: scratch was left in %s", what, work);
}

static void test_hostile(void **state)
{
    (void)state;
    static const ik_entry dotdot[] = {{'f', "a/../../etc/x", "x", 0644, 0, 0, NULL, NULL}};
    static const ik_entry absolute[] = {{'f', "/etc/x", "x", 0644, 0, 0, NULL, NULL}};
    static const ik_entry via_link[] = {{'l', "lnk", "/tmp", 0777, 0, 0, NULL, NULL},
                                        {'f', "lnk/x", "x", 0644, 0, 0, NULL, NULL}};
    static const ik_entry hl_out[] = {{'h', "x", "../../etc/passwd", 0644, 0, 0, NULL, NULL}};
    static const ik_entry hl_later[] = {{'h', "x", "later.txt", 0644, 0, 0, NULL, NULL},
                                        {'f', "later.txt", "x", 0644, 0, 0, NULL, NULL}};
    static const ik_entry hl_abs[] = {{'h', "x", "/etc/passwd", 0644, 0, 0, NULL, NULL}};
    static const ik_entry device[] = {{'c', "dev/mem", NULL, 0600, 0, 0, NULL, NULL}};
    static const ik_entry forged[] = {
        {'d', "d", NULL, 0755, 0, 0, NULL, "trusted.overlay.opaque=y"}};
    static const ik_entry fine[] = {{'f', "ok.txt", "ok", 0644, 0, 0, NULL, NULL}};
    const char *zero = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
    struct {
        const char *name;
        const ik_entry *e;
        size_t n;
        ik_image im;
        size_t truncate_to;
        const char *want;
    } cases[] = {
        {"dotdot", dotdot, 1, {0}, 0, "\"..\" component"},
        {"absolute", absolute, 1, {0}, 0, "absolute path"},
        {"via-symlink", via_link, 2, {0}, 0, "written through a symlink"},
        {"hardlink-out", hl_out, 1, {0}, 0, "\"..\" component"},
        {"hardlink-later", hl_later, 2, {0}, 0, "not an earlier entry"},
        {"hardlink-absolute", hl_abs, 1, {0}, 0, "absolute path"},
        {"device", device, 1, {0}, 0, "device node"},
        {"forged-overlay-xattr", forged, 1, {0}, 0, "overlay xattr"},
        {"truncated", BASE, sizeof BASE / sizeof *BASE, {0}, 100000, "truncated"},
        {"digest-mismatch", fine, 1, {.bad_layer_digest = zero}, 0, "digest mismatch"},
        {"diff-id-mismatch", fine, 1, {.bad_diff_id = zero}, 0, "diff_id mismatch"},
        {"media-type",
         fine,
         1,
         {.layer_media = "application/vnd.example.layer"},
         0,
         "unknown media type"},
        {"platform", fine, 1, {.platform_arch = "arm64"}, 0, "no linux/amd64 entry"},
    };
    dsec_layer_registry *r = open_reg();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ik_layer l = {.truncate_to = cases[i].truncate_to};
        ik_layer_make(&l, cases[i].e, cases[i].n, false);
        ik_layer *ls[] = {&l};
        char *dir = pathf("%s/img/hostile-%s", top, cases[i].name);
        ik_write_oci_dir(dir, &cases[i].im, ls, 1);
        dsec_image_import_opts o = {.ref = "swe/hostile:1", .work_dir = work};
        dsec_image_info *info = (dsec_image_info *)1;
        dsec_err err;
        if (dsec_image_import(r, dir, &o, &info, &err) == 0)
            fail_msg("%s: imported", cases[i].name);
        assert_null(info);
        if (strstr(err.msg, cases[i].want) == NULL)
            fail_msg("%s: \"%s\" does not say \"%s\"", cases[i].name, err.msg, cases[i].want);
        /* entry errors name the image and the layer too */
        if (i < 9 &&
            (strstr(err.msg, "swe/hostile:1") == NULL || strstr(err.msg, l.diff_id) == NULL))
            fail_msg("%s: \"%s\" names no image or layer", cases[i].name, err.msg);
        assert_nothing_left(r, cases[i].name);
        ik_layer_free(&l);
    }
    /* a FIFO where a blob should be: refused, not waited on */
    ik_layer fl = {0};
    ik_layer_make(&fl, fine, 1, false);
    ik_layer *fls[] = {&fl};
    ik_image fim = {0};
    char *fdir = pathf("%s/img/hostile-fifo", top);
    ik_write_oci_dir(fdir, &fim, fls, 1);
    char *blobp = pathf("%s/blobs/sha256/%s", fdir, fl.digest + 7);
    assert_int_equal(unlink(blobp), 0);
    assert_int_equal(mkfifo(blobp, 0600), 0);
    dsec_image_import_opts fo = {.ref = "swe/fifo:1", .work_dir = work};
    dsec_err ferr;
    assert_int_equal(dsec_image_import(r, fdir, &fo, NULL, &ferr), -1);
    assert_non_null(strstr(ferr.msg, "not a regular file"));
    assert_nothing_left(r, "fifo");
    ik_layer_free(&fl);
    /* and not an archive at all */
    char *junk = pathf("%s/img/junk", top);
    FILE *f = fopen(junk, "w");
    fputs("not an image\n", f);
    fclose(f);
    dsec_err err;
    dsec_image_import_opts o = {.ref = "swe/junk:1", .work_dir = work};
    assert_int_equal(dsec_image_import(r, junk, &o, NULL, &err), -1);
    assert_nothing_left(r, "junk");
    dsec_layer_registry_free(r);
}

static void kill_after_first(void *arg, const char *line)
{
    (void)arg;
    if (strstr(line, "layer 1/2") != NULL && strstr(line, "converted") != NULL)
        raise(SIGKILL);
}

/* kill -9 in the middle: no record, no environment; the next import restarts clean. */
static void test_killed_midway(void **state)
{
    (void)state;
    ik_layer *ls[] = {&base, &app};
    ik_image im = {.config_json_extra = CONFIG_EXTRA};
    char *dir = pathf("%s/img/oci-kill", top);
    ik_write_oci_dir(dir, &im, ls, 2);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dsec_layer_registry *r = open_reg();
        dsec_image_import_opts o = {
            .ref = "swe/kill:1", .work_dir = work, .progress = kill_after_first};
        dsec_err err;
        dsec_image_import(r, dir, &o, NULL, &err);
        _exit(3); /* not reached when the kill came */
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    dsec_layer_registry *r = open_reg();
    dsec_image_info *v;
    size_t n;
    dsec_err err;
    assert_int_equal(dsec_image_list(r, &v, &n, &err), 0);
    dsec_image_infos_free(v, n);
    assert_int_equal(n, 0);
    dsec_env *e;
    assert_int_equal(dsec_layer_registry_env_get(r, "swe/kill:1", &e, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(count_dir(work), 1); /* the killed import's scratch */
    dsec_image_info *info = import_ok(r, dir, "swe/kill:1", 0);
    assert_true(info->layers[0].reused); /* stored before the kill */
    assert_false(info->layers[1].reused);
    assert_int_equal(count_dir(work), 0); /* stale scratch removed */
    dsec_image_info_free(info);
    dsec_layer_registry_free(r);
}

static void test_refs_and_docs(void **state)
{
    (void)state;
    char *h, *p, *t, *d;
    dsec_err err;
    assert_int_equal(dsec_image_ref_parse("127.0.0.1:5000/swe/task:1", &h, &p, &t, &d, &err), 0);
    assert_string_equal(h, "127.0.0.1:5000");
    assert_string_equal(p, "swe/task");
    assert_string_equal(t, "1");
    assert_null(d);
    dsec_free(h), dsec_free(p), dsec_free(t);
    assert_int_equal(dsec_image_ref_parse("busybox", &h, &p, &t, &d, &err), 0);
    assert_null(h);
    assert_string_equal(p, "busybox");
    assert_null(t);
    dsec_free(p);
    assert_int_equal(dsec_image_ref_parse("a b", &h, &p, &t, &d, &err), -1);
    assert_int_equal(dsec_image_ref_parse("x@sha256:12", &h, &p, &t, &d, &err), -1);

    dsec_layer_registry *r = open_reg();
    const char *k = "127.0.0.1:5000/a/../b:1";
    assert_int_equal(dsec_layer_registry_doc_put(r, "image", k, "v1", 2, &err), 0);
    assert_int_equal(dsec_layer_registry_doc_put(r, "image", k, "v2", 2, &err), 0);
    char *doc, **keys;
    size_t len, n;
    assert_int_equal(dsec_layer_registry_doc_get(r, "image", k, &doc, &len, &err), 0);
    assert_string_equal(doc, "v2");
    dsec_free(doc);
    assert_int_equal(count_dir(pathf("%s/docs/image", regdir)), 1); /* one file, no dirs made */
    assert_int_equal(dsec_layer_registry_doc_list(r, "image", &keys, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(keys[0], k);
    dsec_layer_names_free(keys, n);
    assert_int_equal(dsec_layer_registry_doc_remove(r, "image", k, &err), 0);
    assert_int_equal(dsec_layer_registry_doc_get(r, "image", k, &doc, &len, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(dsec_layer_registry_doc_put(r, "Bad", "x", "v", 1, &err), -1);
    dsec_layer_registry_free(r);
}

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_image: needs root (whiteouts are device nodes, opaque dirs trusted "
                        "xattrs); skipped\n");
        return 77;
    }
    if (access("/bin/busybox", X_OK) != 0 || system("command -v mkfs.erofs >/dev/null") != 0) {
        fprintf(stderr, "test_image: needs /bin/busybox and mkfs.erofs; skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_refs_and_docs, setup),
        cmocka_unit_test_setup(test_docker_archive, setup),
        cmocka_unit_test_setup(test_oci_layouts_and_reuse, setup),
        cmocka_unit_test_setup(test_hostile, setup),
        cmocka_unit_test_setup(test_killed_midway, setup),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
