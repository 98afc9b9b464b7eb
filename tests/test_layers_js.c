/* test_layers_js.c - the JetStream layer registry against a real nats-server: chunked blobs, tags,
 * environments, removal, corruption. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bus/js.h"
#include "bus/layers-js.h"
#include "dsec/alloc.h"
#include "dsec/image.h"
#include "dsec/layers.h"
#include "tests/image_kit.h"
#include "tests/fixture.h"

typedef struct fx {
    dsec_natsd *nd;
    char root[256];
    dsec_bus *bus;
    dsec_layer_registry *reg;
} fx;

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    if (dsec_test_server_start("dsec-ljs", true, &f->nd, f->root, sizeof f->root) < 0)
        return -1;
    dsec_err err;
    dsec_bus_opts bo = {.url = dsec_natsd_url(f->nd), .name = "test-layers-js"};
    if (dsec_bus_connect(&f->bus, &bo, &err) < 0) {
        fprintf(stderr, "connect: %s\n", err.msg);
        return -1;
    }
    /* Small chunks so a test blob spans many of them. */
    dsec_js_layers_conf lc = {.bucket = "TL", .chunk_bytes = 1000};
    if (dsec_layer_registry_jetstream(&f->reg, f->bus, &lc, &err) < 0) {
        fprintf(stderr, "registry: %s\n", err.msg);
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    dsec_layer_registry_free(f->reg);
    dsec_bus_free(f->bus);
    int rc = dsec_test_server_stop(f->nd, f->root);
    free(f);
    return rc;
}

/* A real layer blob (a DIR-format tar of one file of n pseudo-random bytes)
 * at root/name; its digest into d. */
static void make_blob(fx *f, const char *name, size_t n, unsigned seed, char *path, size_t plen,
                      dsec_digest d)
{
    char dir[512], file[600];
    snprintf(dir, sizeof dir, "%s/%s.tree", f->root, name);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(file, sizeof file, "%s/data", dir);
    FILE *fp = fopen(file, "wb");
    assert_non_null(fp);
    for (size_t i = 0; i < n; i++)
        fputc((int)((i * 2654435761u + seed) >> 7) & 0xff, fp);
    assert_int_equal(fclose(fp), 0);
    snprintf(path, plen, "%s/%s", f->root, name);
    dsec_err err;
    if (dsec_layer_build(dir, DSEC_LAYER_DIR, NULL, 0, path, d, &err) < 0)
        fail_msg("building %s: %s", name, err.msg);
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_size;
}

static int same_file(const char *a, const char *b)
{
    FILE *x = fopen(a, "rb"), *y = fopen(b, "rb");
    int same = x && y;
    while (same) {
        int cx = fgetc(x), cy = fgetc(y);
        if (cx != cy)
            same = 0;
        if (cx == EOF || cy == EOF)
            break;
    }
    if (x)
        fclose(x);
    if (y)
        fclose(y);
    return same;
}

static void test_roundtrip(void **state)
{
    fx *f = *state;
    dsec_err err;
    char src[512], dst[512];
    dsec_digest d, got;
    make_blob(f, "a.blob", 10500, 1, src, sizeof src, d); /* a dozen chunks, the last partial */
    assert_true(file_size(src) % 1000 != 0);
    assert_int_equal(dsec_layer_registry_put(f->reg, d, DSEC_LAYER_DIR, src, &err), 0);
    /* A second put of the same content is a success. */
    assert_int_equal(dsec_layer_registry_put(f->reg, d, DSEC_LAYER_DIR, src, &err), 0);
    snprintf(dst, sizeof dst, "%s/a.out", f->root);
    assert_int_equal(dsec_layer_registry_get(f->reg, d, dst, &err), 0);
    assert_true(same_file(src, dst));
    assert_int_equal(dsec_digest_file(dst, got, &err), 0);
    assert_string_equal(got, d);
    assert_null(dsec_layer_registry_direct_path(f->reg, d));

    /* A tar is a multiple of 512 bytes: with 512-byte chunks it ends on a chunk boundary. */
    dsec_layer_registry *r512;
    dsec_js_layers_conf lc = {.bucket = "TL512", .chunk_bytes = 512};
    assert_int_equal(dsec_layer_registry_jetstream(&r512, f->bus, &lc, &err), 0);
    char src2[512];
    dsec_digest d2;
    make_blob(f, "b.blob", 3000, 2, src2, sizeof src2, d2);
    assert_int_equal(file_size(src2) % 512, 0);
    assert_int_equal(dsec_layer_registry_put(r512, d2, DSEC_LAYER_DIR, src2, &err), 0);
    snprintf(dst, sizeof dst, "%s/b.out", f->root);
    assert_int_equal(dsec_layer_registry_get(r512, d2, dst, &err), 0);
    assert_true(same_file(src2, dst));
    dsec_layer_registry_free(r512);

    /* Tags and listing. */
    assert_int_equal(dsec_layer_registry_tag_set(f->reg, "tools/base:1.0", d, &err), 0);
    assert_int_equal(dsec_layer_registry_resolve(f->reg, "tools/base:1.0", got, &err), 0);
    assert_string_equal(got, d);
    assert_int_equal(dsec_layer_registry_resolve(f->reg, "tools/base:2.0", got, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    dsec_layer_info *v;
    size_t n;
    assert_int_equal(dsec_layer_registry_list(f->reg, &v, &n, &err), 0);
    /* a second tag lists the blob twice, once per name */
    assert_int_equal(n, 1);
    dsec_layer_infos_free(v, n);
    assert_int_equal(dsec_layer_registry_tag_set(f->reg, "tools/base:latest", d, &err), 0);
    assert_int_equal(dsec_layer_registry_list(f->reg, &v, &n, &err), 0);
    assert_int_equal(n, 2);
    int named = 0;
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(v[i].digest, d);
        assert_non_null(v[i].name);
        named |= strcmp(v[i].name, "tools/base:1.0") == 0      ? 1
                 : strcmp(v[i].name, "tools/base:latest") == 0 ? 2
                                                               : 0;
        assert_int_equal(v[i].format, DSEC_LAYER_DIR);
        assert_int_equal(v[i].size, file_size(src));
    }
    assert_int_equal(named, 3);
    dsec_layer_infos_free(v, n);
}

static void test_env_and_remove(void **state)
{
    fx *f = *state;
    dsec_err err;
    char src[512], dst[512];
    dsec_digest d, d2;
    make_blob(f, "e1.blob", 2500, 4, src, sizeof src, d);
    assert_int_equal(dsec_layer_registry_put(f->reg, d, DSEC_LAYER_DIR, src, &err), 0);
    make_blob(f, "e2.blob", 100, 5, src, sizeof src, d2);
    assert_int_equal(dsec_layer_registry_put(f->reg, d2, DSEC_LAYER_DIR, src, &err), 0);

    char *layers[] = {d, d2};
    dsec_layer_format fmts[] = {DSEC_LAYER_DIR, DSEC_LAYER_DIR};
    char *vars[] = {"LANG=C.UTF-8"};
    dsec_env e = {.name = "py:3",
                  .layers = layers,
                  .formats = fmts,
                  .nlayers = 2,
                  .vars = vars,
                  .nvars = 1,
                  .workdir = "/work",
                  .user = "nobody"};
    assert_int_equal(dsec_layer_registry_env_put(f->reg, &e, &err), 0);
    dsec_env *back = NULL;
    assert_int_equal(dsec_layer_registry_env_get(f->reg, "py:3", &back, &err), 0);
    assert_int_equal(back->nlayers, 2);
    assert_string_equal(back->layers[0], d);
    assert_string_equal(back->layers[1], d2);
    assert_int_equal(back->formats[1], DSEC_LAYER_DIR);
    assert_string_equal(back->workdir, "/work");
    assert_string_equal(back->user, "nobody");
    assert_int_equal(back->nvars, 1);
    assert_string_equal(back->vars[0], "LANG=C.UTF-8");
    dsec_env_free(back);
    char **names = NULL;
    size_t nn = 0;
    assert_int_equal(dsec_layer_registry_env_list(f->reg, &names, &nn, &err), 0);
    assert_int_equal(nn, 1);
    assert_string_equal(names[0], "py:3");
    dsec_layer_names_free(names, nn);
    assert_int_equal(dsec_layer_registry_env_get(f->reg, "py:4", &back, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);

    /* A blob an environment names cannot go. */
    assert_int_equal(dsec_layer_registry_remove(f->reg, d2, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    assert_non_null(strstr(err.msg, "py:3"));

    /* A tagged blob cannot go until its tag does; then it is gone. */
    char src3[512];
    dsec_digest d3;
    make_blob(f, "e3.blob", 4000, 6, src3, sizeof src3, d3);
    assert_int_equal(dsec_layer_registry_put(f->reg, d3, DSEC_LAYER_DIR, src3, &err), 0);
    assert_int_equal(dsec_layer_registry_tag_set(f->reg, "gone:1", d3, &err), 0);
    assert_int_equal(dsec_layer_registry_remove(f->reg, d3, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    assert_int_equal(dsec_layer_registry_remove(f->reg, "gone:1", &err), 0);
    assert_int_equal(dsec_layer_registry_remove(f->reg, d3, &err), 0);
    snprintf(dst, sizeof dst, "%s/e3.out", f->root);
    assert_int_equal(dsec_layer_registry_get(f->reg, d3, dst, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_not_equal(access(dst, F_OK), 0);
}

/* Image records, diff_id records and environments named by a registry host:port, in JetStream. */
static void test_images(void **state)
{
    fx *f = *state;
    dsec_err err;
    static const ik_entry files[] = {{'d', "etc", NULL, 0755, 0, 0, NULL, NULL},
                                     {'f', "etc/motd", "hello\n", 0644, 0, 0, NULL, NULL}};
    ik_layer l = {0};
    ik_layer_make(&l, files, 2, true);
    ik_layer *ls[] = {&l};
    ik_image im = {.config_json_extra = "\"Env\":[\"A=1\"],\"Cmd\":[\"sh\"]"};
    char dir[512], work[512];
    snprintf(dir, sizeof dir, "%s/oci", f->root);
    snprintf(work, sizeof work, "%s/work", f->root);
    ik_write_oci_dir(dir, &im, ls, 1);
    ik_layer_free(&l);
    dsec_image_import_opts o = {
        .ref = "127.0.0.1:5000/swe/task:1", .format = DSEC_LAYER_DIR, .work_dir = work};
    dsec_image_info *a = NULL, *b = NULL;
    if (dsec_image_import(f->reg, dir, &o, &a, &err) != 0)
        fail_msg("import: %s", err.msg);
    o.ref = "swe/again";
    assert_int_equal(dsec_image_import(f->reg, dir, &o, &b, &err), 0);
    assert_true(b->layers[0].reused); /* the diff_id record is in the bucket */
    dsec_env *e = NULL;
    assert_int_equal(dsec_layer_registry_env_get(f->reg, "127.0.0.1:5000/swe/task:1", &e, &err), 0);
    assert_string_equal(e->cmd[0], "sh");
    assert_string_equal(e->image_digest, a->manifest);
    dsec_env_free(e);
    char **names = NULL;
    size_t n = 0;
    assert_int_equal(dsec_layer_registry_env_list(f->reg, &names, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "127.0.0.1:5000/swe/task:1");
    dsec_layer_names_free(names, n);
    dsec_image_info *v = NULL;
    assert_int_equal(dsec_image_list(f->reg, &v, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(v[0].ref, "127.0.0.1:5000/swe/task:1");
    dsec_image_infos_free(v, n);
    assert_int_equal(dsec_image_remove(f->reg, "127.0.0.1:5000/swe/task:1", &err), 0);
    assert_int_equal(dsec_layer_registry_env_get(f->reg, "127.0.0.1:5000/swe/task:1", &e, &err),
                     -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(dsec_image_remove(f->reg, "swe/again", &err), 0);
    dsec_layer_info *li = NULL;
    assert_int_equal(dsec_layer_registry_list(f->reg, &li, &n, &err), 0);
    assert_int_equal(n, 0); /* the last image took its layer */
    dsec_layer_infos_free(li, n);
    dsec_image_info_free(a);
    dsec_image_info_free(b);
}

static void test_corrupt_chunk_refused(void **state)
{
    fx *f = *state;
    dsec_err err;
    char src[512], dst[512];
    dsec_digest d;
    make_blob(f, "x.blob", 5000, 7, src, sizeof src, d);
    assert_int_equal(dsec_layer_registry_put(f->reg, d, DSEC_LAYER_DIR, src, &err), 0);
    /* Someone with bus access overwrites chunk 2 with other bytes of the same size. */
    dsec_js *js;
    assert_int_equal(dsec_js_new(&js, f->bus, 0, &err), 0);
    char subj[200], junk[1000];
    memset(junk, 'X', sizeof junk);
    snprintf(subj, sizeof subj, "dsec.layers.TL.%s.2", d + 7);
    assert_int_equal(dsec_js_publish(js, subj, junk, sizeof junk, NULL, &err), 0);
    dsec_js_free(js);
    snprintf(dst, sizeof dst, "%s/x.out", f->root);
    assert_int_equal(dsec_layer_registry_get(f->reg, d, dst, &err), -1);
    assert_int_equal(err.code, DSEC_E_DECODE);
    assert_non_null(strstr(err.msg, "digest"));
    assert_int_not_equal(access(dst, F_OK), 0); /* nothing half-written is left */
}

static void test_bad_input(void **state)
{
    fx *f = *state;
    dsec_err err;
    dsec_layer_registry *r;
    dsec_js_layers_conf lc = {.bucket = "bad bucket!"};
    assert_int_equal(dsec_layer_registry_jetstream(&r, f->bus, &lc, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "bad bucket!"));
    dsec_digest d;
    assert_int_equal(dsec_layer_registry_resolve(f->reg, "no-version", d, &err), -1);
    assert_int_equal(dsec_layer_registry_tag_set(f->reg, "x:1", "sha256:1234", &err), -1);
    char dst[512];
    snprintf(dst, sizeof dst, "%s/none.out", f->root);
    assert_int_equal(dsec_layer_registry_get(
                         f->reg,
                         "sha256:0000000000000000000000000000000000000000000000000000000000000000",
                         dst, &err),
                     -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_env_and_remove, setup, teardown),
        cmocka_unit_test_setup_teardown(test_images, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_chunk_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
