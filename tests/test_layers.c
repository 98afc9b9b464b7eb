/* test_layers.c - layers for real: digests and names, env documents, reproducible builds, the
 * directory registries, and the node's layer cache (mounts, one fetch, verification, LRU, restart).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/layers/layer-cache.h"
#include "dsec/alloc.h"
#include "dsec/err.h"
#include "dsec/layers.h"

/*
 * Every test works under its own temp dir. The process runs in a private
 * mount namespace (main), so whatever a failed test leaves mounted goes when
 * the process exits; teardown still unmounts and removes all it can.
 */

static char root[64]; /* this test's temp dir */
static bool have_root;

static char *pathf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *pathf(const char *fmt, ...)
{
    static char bufs[8][1024];
    static int next;
    char *b = bufs[next++ % 8];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof bufs[0], fmt, ap);
    va_end(ap);
    return b;
}

static void write_file(const char *path, const char *content, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, content, strlen(content)), (ssize_t)strlen(content));
    assert_int_equal(fchmod(fd, mode), 0);
    close(fd);
}

static bool file_has(const char *path, const char *content)
{
    char buf[256];
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0)
        return false;
    buf[n] = '\0';
    return strcmp(buf, content) == 0;
}

/* Unmount everything at or below prefix (deepest first). */
static void unmount_below(const char *prefix)
{
    for (int round = 0; round < 64; round++) {
        FILE *f = fopen("/proc/self/mountinfo", "re");
        if (f == NULL)
            return;
        char line[4096], best[1024] = "";
        while (fgets(line, sizeof line, f) != NULL) {
            char mp[1024];
            if (sscanf(line, "%*s %*s %*s %*s %1023s", mp) == 1 &&
                strncmp(mp, prefix, strlen(prefix)) == 0 && strlen(mp) > strlen(best))
                snprintf(best, sizeof best, "%s", mp);
        }
        fclose(f);
        if (best[0] == '\0' || umount2(best, MNT_DETACH) < 0)
            return;
    }
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(p) : unlink(p);
}

static void rm_rf(const char *p)
{
    nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int setup(void **state)
{
    if (!have_root)
        skip();
    snprintf(root, sizeof root, "/tmp/dsec-layers-XXXXXX");
    assert_non_null(mkdtemp(root));
    return 0;
}

static int teardown(void **state)
{
    if (root[0] != '\0') {
        unmount_below(root);
        rm_rf(root);
        root[0] = '\0';
    }
    return 0;
}

/*
 * A tree with what layers must keep: nested dirs, modes, a non-root owner,
 * a symlink, a hard link, an overlay whiteout (char 0/0), an opaque dir
 * (trusted.overlay.opaque), plus things to exclude.
 */
static void make_tree(const char *t)
{
    assert_int_equal(mkdir(t, 0755), 0);
    assert_int_equal(mkdir(pathf("%s/etc", t), 0755), 0);
    write_file(pathf("%s/etc/hello", t), "hello\n", 0644);
    write_file(pathf("%s/etc/secret", t), "s3cret\n", 0600);
    assert_int_equal(chown(pathf("%s/etc/secret", t), 1234, 4321), 0);
    assert_int_equal(symlink("hello", pathf("%s/etc/link", t)), 0);
    assert_int_equal(link(pathf("%s/etc/hello", t), pathf("%s/etc/hard", t)), 0);
    assert_int_equal(mkdir(pathf("%s/gone", t), 0755), 0);
    assert_int_equal(mknod(pathf("%s/gone/x", t), S_IFCHR | 0000, makedev(0, 0)), 0);
    assert_int_equal(mkdir(pathf("%s/opaque", t), 0755), 0);
    assert_int_equal(setxattr(pathf("%s/opaque", t), "trusted.overlay.opaque", "y", 1, 0), 0);
    write_file(pathf("%s/opaque/z", t), "z\n", 0644);
    assert_int_equal(mkdir(pathf("%s/lib", t), 0755), 0);
    assert_int_equal(mkdir(pathf("%s/lib/__pycache__", t), 0755), 0);
    write_file(pathf("%s/lib/__pycache__/m.cpython.pyc", t), "pyc", 0644);
    write_file(pathf("%s/lib/m.py", t), "print(1)\n", 0644);
    write_file(pathf("%s/lib/n.pyc", t), "pyc", 0644);
    assert_int_equal(mkdir(pathf("%s/tmp", t), 01777), 0);
    assert_int_equal(chmod(pathf("%s/tmp", t), 01777), 0);
    write_file(pathf("%s/tmp/junk", t), "junk", 0644);
}

static void build(const char *src, dsec_layer_format fmt, const char *const *ex, size_t nex,
                  const char *out, dsec_digest d)
{
    dsec_err err;
    if (dsec_layer_build(src, fmt, ex, nex, out, d, &err) < 0)
        fail_msg("build %s: %s", src, err.msg);
    assert_true(dsec_digest_valid(d));
}

static void build_put(dsec_layer_registry *r, const char *src, dsec_layer_format fmt,
                      const char *name, dsec_digest d)
{
    static int seq;
    char *out = pathf("%s/blob-%d", root, seq++);
    build(src, fmt, NULL, 0, out, d);
    dsec_err err;
    if (dsec_layer_registry_put(r, d, fmt, out, &err) < 0)
        fail_msg("put: %s", err.msg);
    if (name != NULL && dsec_layer_registry_tag_set(r, name, d, &err) < 0)
        fail_msg("tag: %s", err.msg);
    unlink(out);
}

/* ---- digests, names, formats -------------------------------------------------------------- */

static void digests_names_and_formats(void **state)
{
    const char *good = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    assert_true(dsec_digest_valid(good));
    assert_false(dsec_digest_valid(NULL));
    assert_false(dsec_digest_valid(""));
    assert_false(dsec_digest_valid("sha256:0123"));
    assert_false(dsec_digest_valid(
        "sha256:0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef"));
    assert_false(dsec_digest_valid(
        "sha512:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"));
    assert_false(dsec_digest_valid(
        "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0"));

    const char *names_ok[] = {"busybox:1",
                              "debian-py:12",
                              "lib/x.y/z:v1.2_RC-3",
                              "a:B",
                              "a_b:1",
                              "127.0.0.1:5000/swe/task:1",
                              "registry.local:5000/a/b_c:latest"};
    for (size_t i = 0; i < sizeof names_ok / sizeof *names_ok; i++)
        assert_true(dsec_layer_name_valid(names_ok[i]));
    const char *names_bad[] = {
        NULL,     "",       "busybox",  "Busybox:1", ":1",           "a:",         "a:b:c",
        "../x:1", "a/..:1", "a:..",     "/a:1",      "a/:1",         "a//b:1",     "a b:1",
        "a:1 2",  "a:v/1",  "h:5000:1", "h:x/a:1",   "h:123456/a:1", "a/h:50/b:1", ":5000/a:1"};
    for (size_t i = 0; i < sizeof names_bad / sizeof *names_bad; i++)
        if (dsec_layer_name_valid(names_bad[i]))
            fail_msg("name \"%s\" should be refused", names_bad[i] ? names_bad[i] : "(null)");

    dsec_layer_format f;
    dsec_err err;
    assert_int_equal(dsec_layer_format_parse("erofs", &f, &err), 0);
    assert_int_equal(f, DSEC_LAYER_EROFS);
    assert_int_equal(dsec_layer_format_parse("dir", &f, &err), 0);
    assert_int_equal(f, DSEC_LAYER_DIR);
    assert_string_equal(dsec_layer_format_name(DSEC_LAYER_DIR), "dir");
    assert_int_equal(dsec_layer_format_parse("squashfs", &f, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "squashfs"));

    /* the digest of a file is the sha256 of its bytes */
    write_file(pathf("%s/abc", root), "abc", 0644);
    dsec_digest d;
    assert_int_equal(dsec_digest_file(pathf("%s/abc", root), d, &err), 0);
    assert_string_equal(d,
                        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    assert_int_equal(dsec_digest_file(pathf("%s/none", root), d, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);

    /* the wrappers refuse bad arguments with messages naming them */
    dsec_layer_registry *r;
    assert_int_equal(dsec_layer_registry_local(&r, pathf("%s/reg", root), &err), 0);
    assert_string_equal(dsec_layer_registry_kind(r), "local");
    assert_int_equal(dsec_layer_registry_get(r, "sha256:nothex", pathf("%s/x", root), &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "sha256:nothex"));
    assert_int_equal(dsec_layer_registry_tag_set(r, "No Way:1", good, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "No Way:1"));
    assert_int_equal(
        dsec_layer_registry_put(r, good, (dsec_layer_format)7, pathf("%s/abc", root), &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    dsec_digest out;
    assert_int_equal(dsec_layer_registry_resolve(r, "bogus", out, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "bogus"));
    assert_int_equal(dsec_layer_registry_resolve(r, good, out, &err), 0);
    assert_string_equal(out, good);
    assert_int_equal(dsec_layer_registry_resolve(r, "absent:1", out, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(dsec_layer_registry_remove(r, "../../etc:passwd", &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_null(dsec_layer_registry_direct_path(r, good)); /* local: never in place */
    dsec_layer_registry_free(r);
    dsec_layer_registry_free(NULL);
}

/* ---- environment documents ---------------------------------------------------------------- */

#define D1 "sha256:1111111111111111111111111111111111111111111111111111111111111111"
#define D2 "sha256:2222222222222222222222222222222222222222222222222222222222222222"

static void env_documents_round_trip_and_refuse_malformed(void **state)
{
    char *layers[] = {D1, D2};
    dsec_layer_format formats[] = {DSEC_LAYER_EROFS, DSEC_LAYER_DIR};
    char *vars[] = {"PATH=/usr/bin:/bin", "GREETING=hello world = yes"};
    dsec_env env = {.name = "python:3",
                    .layers = layers,
                    .formats = formats,
                    .nlayers = 2,
                    .vars = vars,
                    .nvars = 2,
                    .workdir = "/work",
                    .user = "1000:1000"};
    char *doc;
    size_t len;
    dsec_err err;
    assert_int_equal(dsec_env_encode(&env, &doc, &len, &err), 0);
    assert_int_equal(strlen(doc), len);
    assert_non_null(strstr(doc, "dsec-env 1\n"));
    dsec_env *e;
    assert_int_equal(dsec_env_decode(doc, len, &e, &err), 0);
    assert_string_equal(e->name, "python:3");
    assert_int_equal(e->nlayers, 2);
    assert_string_equal(e->layers[1], D2);
    assert_int_equal(e->formats[0], DSEC_LAYER_EROFS);
    assert_int_equal(e->formats[1], DSEC_LAYER_DIR);
    assert_int_equal(e->nvars, 2);
    assert_string_equal(e->vars[1], "GREETING=hello world = yes");
    assert_string_equal(e->workdir, "/work");
    assert_string_equal(e->user, "1000:1000");
    dsec_env_free(e);
    dsec_free(doc);

    /* image fields: version 2, escapes round trip; without them the document stays 1 */
    {
        char *l1[] = {D1};
        dsec_layer_format f1[] = {DSEC_LAYER_EROFS};
        char *cmd[] = {"/bin/sh", "-c", "echo a\\b\nx", ""};
        char *labels[] = {"org.x=y\nz"};
        dsec_env v2 = {.name = "127.0.0.1:5000/swe/task:1",
                       .layers = l1,
                       .formats = f1,
                       .nlayers = 1,
                       .cmd = cmd,
                       .ncmd = 4,
                       .nentry = 2,
                       .labels = labels,
                       .nlabels = 1,
                       .image = "127.0.0.1:5000/swe/task:1",
                       .image_digest = D1};
        char *d2;
        size_t l2;
        assert_int_equal(dsec_env_encode(&v2, &d2, &l2, &err), 0);
        assert_memory_equal(d2, "dsec-env 2\n", 11);
        dsec_env *e2;
        if (dsec_env_decode(d2, l2, &e2, &err) != 0)
            fail_msg("v2 decode: %s\n%s", err.msg, d2);
        assert_int_equal(e2->ncmd, 4);
        assert_int_equal(e2->nentry, 2); /* /bin/sh -c is the Entrypoint, the rest the Cmd */
        for (size_t i = 0; i < 4; i++)
            assert_string_equal(e2->cmd[i], cmd[i]);
        assert_int_equal(e2->nlabels, 1);
        assert_string_equal(e2->labels[0], labels[0]);
        assert_string_equal(e2->image, v2.image);
        assert_string_equal(e2->image_digest, D1);
        dsec_env_free(e2);
        dsec_free(d2);
        v2.nentry = 5; /* more than the command holds */
        assert_int_equal(dsec_env_encode(&v2, &d2, &l2, &err), -1);
        assert_non_null(strstr(err.msg, "an entrypoint of 5 arguments in a command of 4"));
        v2.ncmd = v2.nlabels = v2.nentry = 0;
        v2.image = v2.image_digest = NULL;
        assert_int_equal(dsec_env_encode(&v2, &d2, &l2, &err), 0);
        assert_memory_equal(d2, "dsec-env 1\n", 11);
        dsec_free(d2);
    }

    /* defaults */
    const char *min = "dsec-env 1\nname a:1\nlayer " D1 " dir\n";
    assert_int_equal(dsec_env_decode(min, strlen(min), &e, &err), 0);
    assert_string_equal(e->workdir, "/");
    assert_string_equal(e->user, "root");
    dsec_env_free(e);

    struct {
        const char *doc, *want;
    } bad[] = {
        {"", "empty"},
        {"dsec-env 3\nname a:1\nlayer " D1 " dir\n", "version"},
        {"dsec-env 1\nname a:1\nlayer " D1 " dir\ncmd sh\n", "unknown field"},
        {"dsec-env 2\nname a:1\nlayer " D1 " dir\ncmd a\\x\n", "bad escape"},
        {"dsec-env 2\nname a:1\nlayer " D1 " dir\npin sha256:12\n", "pin"},
        {"dsec-env 2\nname a:1\nlayer " D1 " dir\nlabel nokv\n", "nokv"},
        {"dsec-env 2\nname a:1\nlayer " D1 " dir\ncmd a\nentrypoint 2\n", "entrypoint of 2"},
        {"dsec-env 2\nname a:1\nlayer " D1 " dir\ncmd a\nentrypoint x\n", "entrypoint N"},
        {"dsec-env 2\nname a:1\nlayer " D1 " dir\ncmd a\nentrypoint -1\n", "entrypoint N"},
        {"hello\n", "dsec-env 1"},
        {"dsec-env 1\nname a:1\nlayer " D1 " dir", "newline"},
        {"dsec-env 1\nname a:1\n", "no layers"},
        {"dsec-env 1\nlayer " D1 " dir\n", "no name"},
        {"dsec-env 1\nname a:1\nlayer sha256:xyz dir\n", "sha256:xyz"},
        {"dsec-env 1\nname a:1\nlayer " D1 " squashfs\n", "squashfs"},
        {"dsec-env 1\nname a:1\nlayer " D1 "\n", "layer DIGEST FORMAT"},
        {"dsec-env 1\nname a:1\nlayer " D1 " dir\ncolour blue\n", "unknown field"},
        {"dsec-env 1\nname a:1\nlayer " D1 " dir\nworkdir /\nworkdir /x\n", "second workdir"},
        {"dsec-env 1\nname a:1\nlayer " D1 " dir\nworkdir relative\n", "workdir"},
        {"dsec-env 1\nname a:1\nlayer " D1 " dir\nenv NOEQUALS\n", "NOEQUALS"},
        {"dsec-env 1\nname a:1\nlayer " D1 " dir\nenv 9X=1\n", "9X=1"},
        {"dsec-env 1\nname Not Valid\nlayer " D1 " dir\n", "Not Valid"},
        {"dsec-env 1\nname a:1\nlayer " D1 " dir\nuser\n", "no value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dsec_err_clear(&err);
        e = (dsec_env *)1;
        if (dsec_env_decode(bad[i].doc, strlen(bad[i].doc), &e, &err) == 0)
            fail_msg("malformed doc %zu was accepted", i);
        assert_null(e);
        assert_true(err.code == DSEC_E_DECODE || err.code == DSEC_E_TOO_LARGE);
        if (strstr(err.msg, bad[i].want) == NULL)
            fail_msg("doc %zu: message \"%s\" does not mention \"%s\"", i, err.msg, bad[i].want);
    }
    const char nul[] = "dsec-env 1\nname a:1\0\nlayer " D1 " dir\n";
    assert_int_equal(dsec_env_decode(nul, sizeof nul - 1, &e, &err), -1);
    assert_non_null(strstr(err.msg, "NUL"));

    /* encode refuses what decode would */
    char *badvars[] = {"A=1\nB=2"};
    env.vars = badvars;
    env.nvars = 1;
    assert_int_equal(dsec_env_encode(&env, &doc, &len, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
}

/* ---- builds ------------------------------------------------------------------------------- */

/* A second tree with the same contents, created in a different order. */
static void copy_tree_reordered(const char *from, const char *to)
{
    (void)from;
    assert_int_equal(mkdir(to, 0755), 0);
    assert_int_equal(mkdir(pathf("%s/tmp", to), 01777), 0);
    assert_int_equal(chmod(pathf("%s/tmp", to), 01777), 0);
    write_file(pathf("%s/tmp/junk", to), "junk", 0644);
    assert_int_equal(mkdir(pathf("%s/lib", to), 0755), 0);
    write_file(pathf("%s/lib/n.pyc", to), "pyc", 0644);
    write_file(pathf("%s/lib/m.py", to), "print(1)\n", 0644);
    assert_int_equal(mkdir(pathf("%s/lib/__pycache__", to), 0755), 0);
    write_file(pathf("%s/lib/__pycache__/m.cpython.pyc", to), "pyc", 0644);
    assert_int_equal(mkdir(pathf("%s/opaque", to), 0755), 0);
    write_file(pathf("%s/opaque/z", to), "z\n", 0644);
    assert_int_equal(setxattr(pathf("%s/opaque", to), "trusted.overlay.opaque", "y", 1, 0), 0);
    assert_int_equal(mkdir(pathf("%s/gone", to), 0755), 0);
    assert_int_equal(mknod(pathf("%s/gone/x", to), S_IFCHR | 0000, makedev(0, 0)), 0);
    assert_int_equal(mkdir(pathf("%s/etc", to), 0755), 0);
    assert_int_equal(symlink("hello", pathf("%s/etc/link", to)), 0);
    write_file(pathf("%s/etc/secret", to), "s3cret\n", 0600);
    assert_int_equal(chown(pathf("%s/etc/secret", to), 1234, 4321), 0);
    write_file(pathf("%s/etc/hello", to), "hello\n", 0644);
    assert_int_equal(link(pathf("%s/etc/hello", to), pathf("%s/etc/hard", to)), 0);
    sleep(1); /* different mtimes too */
}

static void reproducible(dsec_layer_format fmt)
{
    char *t1 = dsec_strdup(pathf("%s/t1", root)), *t2 = dsec_strdup(pathf("%s/t2", root));
    make_tree(t1);
    copy_tree_reordered(t1, t2);
    dsec_digest a, b, c, d;
    build(t1, fmt, NULL, 0, pathf("%s/a", root), a);
    build(t2, fmt, NULL, 0, pathf("%s/b", root), b);
    assert_string_equal(a, b);
    build(t1, fmt, NULL, 0, pathf("%s/c", root), c);
    assert_string_equal(a, c);
    /* one changed byte, or a changed mode, gives another digest */
    write_file(pathf("%s/lib/m.py", t2), "print(2)\n", 0644);
    build(t2, fmt, NULL, 0, pathf("%s/d", root), d);
    assert_string_not_equal(a, d);
    dsec_digest e2;
    write_file(pathf("%s/lib/m.py", t2), "print(1)\n", 0755);
    build(t2, fmt, NULL, 0, pathf("%s/e", root), e2);
    assert_string_not_equal(a, e2);
    assert_string_not_equal(d, e2);

    /* a tarball source gives the same layer as the tree it holds */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "tar --xattrs --xattrs-include='*' -C %s -czf %s/t1.tar.gz .", t1,
             root);
    assert_int_equal(system(cmd), 0);
    dsec_digest g;
    build(pathf("%s/t1.tar.gz", root), fmt, NULL, 0, pathf("%s/g", root), g);
    assert_string_equal(a, g);

    /* the output must not exist; failures leave nothing behind */
    dsec_err err;
    assert_int_equal(dsec_layer_build(t1, fmt, NULL, 0, pathf("%s/a", root), d, &err), -1);
    assert_int_equal(err.code, DSEC_E_EXISTS);
    assert_int_equal(
        dsec_layer_build(pathf("%s/none", root), fmt, NULL, 0, pathf("%s/h", root), d, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    write_file(pathf("%s/not.tar", root), "this is not a tarball", 0644);
    assert_int_equal(
        dsec_layer_build(pathf("%s/not.tar", root), fmt, NULL, 0, pathf("%s/h", root), d, &err),
        -1);
    assert_non_null(strstr(err.msg, "not.tar"));
    assert_int_equal(access(pathf("%s/h", root), F_OK), -1);
    assert_int_equal(dsec_layer_build(t1, fmt, NULL, 0, pathf("%s/inside", t1), d, &err), -1);
    assert_non_null(strstr(err.msg, "inside"));
    dsec_free(t1);
    dsec_free(t2);
}

static void builds_are_reproducible_dir(void **state)
{
    reproducible(DSEC_LAYER_DIR);
}

static void builds_are_reproducible_erofs(void **state)
{
    reproducible(DSEC_LAYER_EROFS);
}

/* ---- registry ----------------------------------------------------------------------------- */

static void registry_blobs_tags_envs(void **state)
{
    dsec_layer_registry *r;
    dsec_err err;
    char *rdir = dsec_strdup(pathf("%s/reg", root));
    assert_int_equal(dsec_layer_registry_local(&r, rdir, &err), 0);
    char *t = dsec_strdup(pathf("%s/t", root));
    make_tree(t);
    dsec_digest a, b;
    build_put(r, t, DSEC_LAYER_EROFS, "base:1", a);
    write_file(pathf("%s/etc/hello", t), "changed\n", 0644);
    build_put(r, t, DSEC_LAYER_DIR, NULL, b);
    /* putting the same blob again is a success */
    char *blob = pathf("%s/again", root);
    assert_int_equal(dsec_layer_registry_get(r, b, blob, &err), 0);
    assert_int_equal(dsec_layer_registry_put(r, b, DSEC_LAYER_DIR, blob, &err), 0);
    /* get: the same bytes, a new file that must not exist */
    dsec_digest g;
    assert_int_equal(dsec_digest_file(blob, g, &err), 0);
    assert_string_equal(g, b);
    assert_int_equal(dsec_layer_registry_get(r, b, blob, &err), -1);
    assert_int_equal(err.code, DSEC_E_EXISTS);
    assert_int_equal(dsec_layer_registry_get(r, D1, pathf("%s/x", root), &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    /* a blob must be what its format says */
    assert_int_equal(dsec_layer_registry_put(r, b, DSEC_LAYER_EROFS, blob, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "not an EROFS image"));
    /* a put whose bytes do not match the digest is refused */
    assert_int_equal(dsec_layer_registry_put(r, D1, DSEC_LAYER_DIR, blob, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "does not match"));

    /* tags */
    assert_int_equal(dsec_layer_registry_tag_set(r, "tools/py:3.11", b, &err), 0);
    assert_int_equal(dsec_layer_registry_tag_set(r, "nothing:1", D1, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    dsec_digest out;
    assert_int_equal(dsec_layer_registry_resolve(r, "base:1", out, &err), 0);
    assert_string_equal(out, a);
    assert_int_equal(dsec_layer_registry_resolve(r, "tools/py:3.11", out, &err), 0);
    assert_string_equal(out, b);
    /* retag moves the name */
    assert_int_equal(dsec_layer_registry_tag_set(r, "base:1", b, &err), 0);
    assert_int_equal(dsec_layer_registry_resolve(r, "base:1", out, &err), 0);
    assert_string_equal(out, b);
    assert_int_equal(dsec_layer_registry_tag_set(r, "base:1", a, &err), 0);
    /* a name whose path another name's version occupies */
    assert_int_equal(dsec_layer_registry_tag_set(r, "base/1:x", a, &err), -1);
    assert_int_equal(err.code, DSEC_E_EXISTS);
    assert_non_null(strstr(err.msg, "collides"));

    /* listing: each blob with its tags */
    dsec_layer_info *v;
    size_t n;
    assert_int_equal(dsec_layer_registry_list(r, &v, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(v[0].name, "base:1");
    assert_string_equal(v[0].digest, a);
    assert_int_equal(v[0].format, DSEC_LAYER_EROFS);
    assert_string_equal(v[1].name, "tools/py:3.11");
    assert_int_equal(v[1].format, DSEC_LAYER_DIR);
    struct stat st;
    assert_int_equal(stat(blob, &st), 0);
    assert_int_equal(v[1].size, (uint64_t)st.st_size);
    dsec_layer_infos_free(v, n);

    /* environments */
    char *layers[] = {a, b};
    char *vars[] = {"LANG=C.UTF-8"};
    dsec_env env = {.name = "py:3", .layers = layers, .nlayers = 2, .vars = vars, .nvars = 1};
    assert_int_equal(dsec_layer_registry_env_put(r, &env, &err), 0);
    dsec_env *e;
    assert_int_equal(dsec_layer_registry_env_get(r, "py:3", &e, &err), 0);
    assert_int_equal(e->nlayers, 2);
    assert_string_equal(e->layers[0], a);
    assert_int_equal(e->formats[0], DSEC_LAYER_EROFS);
    assert_int_equal(e->formats[1], DSEC_LAYER_DIR);
    assert_string_equal(e->vars[0], "LANG=C.UTF-8");
    assert_string_equal(e->user, "root");
    dsec_env_free(e);
    dsec_layer_format wrong[] = {DSEC_LAYER_DIR, DSEC_LAYER_DIR};
    env.formats = wrong;
    assert_int_equal(dsec_layer_registry_env_put(r, &env, &err), -1);
    assert_non_null(strstr(err.msg, "is erofs in the registry"));
    env.formats = NULL;
    char *missing[] = {a, D2};
    env.layers = missing;
    env.name = "broken:1";
    assert_int_equal(dsec_layer_registry_env_put(r, &env, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, D2));
    assert_int_equal(dsec_layer_registry_env_get(r, "broken:1", &e, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    char **names;
    assert_int_equal(dsec_layer_registry_env_list(r, &names, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(names[0], "py:3");
    dsec_layer_names_free(names, n);
    /* a malformed document in the store is refused, not half-read */
    assert_int_equal(mkdir(pathf("%s/envs/bad", rdir), 0755), 0);
    write_file(pathf("%s/envs/bad/1", rdir), "dsec-env 1\nname bad:1\nlayer nope dir\n", 0644);
    assert_int_equal(dsec_layer_registry_env_get(r, "bad:1", &e, &err), -1);
    assert_int_equal(err.code, DSEC_E_DECODE);
    assert_non_null(strstr(err.msg, "nope"));
    write_file(pathf("%s/envs/bad/1", rdir), "dsec-env 1\nname other:1\nlayer " D1 " dir\n", 0644);
    assert_int_equal(dsec_layer_registry_env_get(r, "bad:1", &e, &err), -1);
    assert_non_null(strstr(err.msg, "other:1"));

    /* removal: a tagged blob, or one an environment uses, stays */
    assert_int_equal(dsec_layer_registry_remove(r, a, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    assert_non_null(strstr(err.msg, "base:1"));
    assert_int_equal(dsec_layer_registry_remove(r, "base:1", &err), 0);
    assert_int_equal(dsec_layer_registry_resolve(r, "base:1", out, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(dsec_layer_registry_remove(r, a, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    assert_non_null(strstr(err.msg, "py:3"));
    unlink(pathf("%s/envs/py/3", rdir));
    assert_int_equal(dsec_layer_registry_remove(r, a, &err), 0);
    assert_int_equal(dsec_layer_registry_remove(r, a, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(dsec_layer_registry_remove(r, "base:1", &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(dsec_layer_registry_list(r, &v, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].digest, b);
    dsec_layer_infos_free(v, n);
    /* the empty tag directory went with the tag; a reopened registry sees the same */
    assert_int_equal(access(pathf("%s/tags/base", rdir), F_OK), -1);
    dsec_layer_registry_free(r);
    assert_int_equal(dsec_layer_registry_local(&r, rdir, &err), 0);
    assert_int_equal(dsec_layer_registry_resolve(r, "tools/py:3.11", out, &err), 0);
    assert_string_equal(out, b);
    dsec_layer_registry_free(r);
    dsec_free(rdir);
    dsec_free(t);
}

/* ---- cache -------------------------------------------------------------------------------- */

typedef struct fixture {
    dsec_layer_registry *reg;
    dsec_layer_cache *cache;
    char cdir[256];
} fixture;

static void fixture_open(fixture *f, bool shared, uint64_t budget)
{
    dsec_err err;
    int rc = shared ? dsec_layer_registry_shared(&f->reg, pathf("%s/reg", root), &err)
                    : dsec_layer_registry_local(&f->reg, pathf("%s/reg", root), &err);
    assert_int_equal(rc, 0);
    snprintf(f->cdir, sizeof f->cdir, "%s/cache", root);
    if (dsec_layer_cache_new(&f->cache, f->cdir, budget, f->reg, &err) < 0)
        fail_msg("cache: %s", err.msg);
}

static void fixture_close(fixture *f)
{
    dsec_layer_cache_free(f->cache);
    dsec_layer_registry_free(f->reg);
}

static char *acquire(fixture *f, const char *d)
{
    char *p;
    dsec_err err;
    if (dsec_layer_cache_acquire(f->cache, d, &p, &err) < 0)
        fail_msg("acquire %s: %s", d, err.msg);
    return p;
}

/* What a layer built from make_tree must show when mounted. */
static void check_layer(const char *p)
{
    struct stat st;
    assert_true(file_has(pathf("%s/etc/hello", p), "hello\n"));
    assert_int_equal(lstat(pathf("%s/etc/secret", p), &st), 0);
    assert_int_equal(st.st_uid, 1234);
    assert_int_equal(st.st_gid, 4321);
    assert_int_equal(st.st_mode & 07777, 0600);
    assert_int_equal(lstat(pathf("%s/tmp", p), &st), 0);
    assert_int_equal(st.st_mode & 07777, 01777);
    char lnk[64];
    ssize_t n = readlink(pathf("%s/etc/link", p), lnk, sizeof lnk);
    assert_int_equal(n, 5);
    assert_memory_equal(lnk, "hello", 5);
    struct stat h1, h2;
    assert_int_equal(lstat(pathf("%s/etc/hello", p), &h1), 0);
    assert_int_equal(lstat(pathf("%s/etc/hard", p), &h2), 0);
    assert_int_equal(h1.st_ino, h2.st_ino);
    /* the overlay whiteout and the opaque marker */
    assert_int_equal(lstat(pathf("%s/gone/x", p), &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    assert_int_equal(st.st_rdev, makedev(0, 0));
    char v[8];
    assert_int_equal(getxattr(pathf("%s/opaque", p), "trusted.overlay.opaque", v, sizeof v), 1);
    assert_int_equal(v[0], 'y');
    /* read-only */
    int fd = open(pathf("%s/etc/new", p), O_WRONLY | O_CREAT, 0644);
    assert_int_equal(fd, -1);
    assert_int_equal(errno, EROFS);
    assert_int_equal(unlink(pathf("%s/etc/hello", p)), -1);
    assert_int_equal(errno, EROFS);
}

/* Overlay semantics through the layer: the whiteout hides a lower file, the
 * opaque dir hides a lower dir's contents. */
static void check_overlay(const char *layer)
{
    char *base = dsec_strdup(pathf("%s/ovl-base", root));
    char *mnt = dsec_strdup(pathf("%s/ovl-mnt", root));
    assert_int_equal(mkdir(base, 0755), 0);
    assert_int_equal(mkdir(pathf("%s/gone", base), 0755), 0);
    write_file(pathf("%s/gone/x", base), "x", 0644);
    write_file(pathf("%s/gone/kept", base), "k", 0644);
    assert_int_equal(mkdir(pathf("%s/opaque", base), 0755), 0);
    write_file(pathf("%s/opaque/hidden", base), "h", 0644);
    assert_int_equal(mkdir(mnt, 0755), 0);
    char opts[1024];
    snprintf(opts, sizeof opts, "lowerdir=%s:%s", layer, base);
    if (mount("overlay", mnt, "overlay", MS_RDONLY, opts) < 0)
        fail_msg("overlay %s: %s", opts, strerror(errno));
    assert_int_equal(access(pathf("%s/gone/x", mnt), F_OK), -1);
    assert_int_equal(access(pathf("%s/gone/kept", mnt), F_OK), 0);
    assert_int_equal(access(pathf("%s/opaque/hidden", mnt), F_OK), -1);
    assert_int_equal(access(pathf("%s/opaque/z", mnt), F_OK), 0);
    assert_int_equal(umount2(mnt, 0), 0);
    rm_rf(base);
    rmdir(mnt);
    dsec_free(base);
    dsec_free(mnt);
}

static void cache_mounts(dsec_layer_format fmt)
{
    fixture f;
    fixture_open(&f, false, 0);
    char *t = dsec_strdup(pathf("%s/t", root));
    make_tree(t);
    dsec_digest d;
    build_put(f.reg, t, fmt, "t:1", d);
    char *p = acquire(&f, d);
    check_layer(p);
    check_overlay(p);
    assert_true(file_has(pathf("%s/lib/__pycache__/m.cpython.pyc", p), "pyc"));
    dsec_layer_cache_stats st;
    dsec_layer_cache_stats_get(f.cache, &st);
    assert_int_equal(st.layers, 1);
    assert_int_equal(st.in_use, 1);
    assert_int_equal(st.fetches, 1);
    assert_true(st.bytes > 0);
    dsec_layer_cache_release(f.cache, d);
    dsec_layer_cache_stats_get(f.cache, &st);
    assert_int_equal(st.in_use, 0);
    dsec_free(p);

    /* excludes: the same tree minus the patterns, in both formats */
    const char *ex[] = {"__pycache__", "*.pyc", "tmp/?*"};
    dsec_digest e;
    char *out = pathf("%s/ex-blob", root);
    build(t, fmt, ex, 3, out, e);
    dsec_err err;
    assert_int_equal(dsec_layer_registry_put(f.reg, e, fmt, out, &err), 0);
    assert_string_not_equal(d, e);
    p = acquire(&f, e);
    assert_int_equal(access(pathf("%s/lib/__pycache__", p), F_OK), -1);
    assert_int_equal(access(pathf("%s/lib/n.pyc", p), F_OK), -1);
    assert_true(file_has(pathf("%s/lib/m.py", p), "print(1)\n"));
    assert_int_equal(access(pathf("%s/tmp", p), F_OK), 0);
    assert_int_equal(access(pathf("%s/tmp/junk", p), F_OK), -1);
    assert_true(file_has(pathf("%s/etc/hello", p), "hello\n"));
    dsec_layer_cache_release(f.cache, e);
    dsec_free(p);
    fixture_close(&f);
    dsec_free(t);
}

static void cache_mounts_dir_layers_read_only(void **state)
{
    cache_mounts(DSEC_LAYER_DIR);
}

static void cache_mounts_erofs_layers_read_only(void **state)
{
    cache_mounts(DSEC_LAYER_EROFS);
}

typedef struct racer {
    fixture *f;
    const char *digest;
    char *path;
    int rc;
} racer;

static void *race(void *arg)
{
    racer *r = arg;
    dsec_err err;
    r->rc = dsec_layer_cache_acquire(r->f->cache, r->digest, &r->path, &err);
    return NULL;
}

static void cache_concurrent_acquires_fetch_once(void **state)
{
    fixture f;
    fixture_open(&f, false, 0);
    char *t = dsec_strdup(pathf("%s/t", root));
    make_tree(t);
    /* some bulk so the fetch takes long enough for the others to pile up */
    char big[65536];
    memset(big, 'b', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    for (int i = 0; i < 64; i++)
        write_file(pathf("%s/etc/big%d", t, i), big, 0644);
    dsec_digest d;
    build_put(f.reg, t, DSEC_LAYER_DIR, NULL, d);
    racer r[8];
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        r[i] = (racer){.f = &f, .digest = d};
        assert_int_equal(pthread_create(&th[i], NULL, race, &r[i]), 0);
    }
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(r[i].rc, 0);
        assert_string_equal(r[i].path, r[0].path);
    }
    check_layer(r[0].path);
    dsec_layer_cache_stats st;
    dsec_layer_cache_stats_get(f.cache, &st);
    assert_int_equal(st.fetches, 1);
    assert_int_equal(st.hits, 7);
    assert_int_equal(st.layers, 1);
    assert_int_equal(st.in_use, 1);
    for (int i = 0; i < 8; i++) {
        dsec_layer_cache_release(f.cache, d);
        dsec_free(r[i].path);
    }
    dsec_layer_cache_stats_get(f.cache, &st);
    assert_int_equal(st.in_use, 0);
    fixture_close(&f);
    dsec_free(t);
}

static void cache_refuses_a_corrupted_blob(void **state)
{
    fixture f;
    fixture_open(&f, false, 0);
    char *t = dsec_strdup(pathf("%s/t", root));
    make_tree(t);
    dsec_digest d;
    build_put(f.reg, t, DSEC_LAYER_EROFS, NULL, d);
    /* flip a byte of the stored blob */
    char *blob = pathf("%s/reg/blobs/sha256/%s", root, d + 7);
    assert_int_equal(chmod(blob, 0644), 0);
    int fd = open(blob, O_RDWR);
    assert_true(fd >= 0);
    char c;
    assert_int_equal(pread(fd, &c, 1, 100), 1);
    c ^= 0x5a;
    assert_int_equal(pwrite(fd, &c, 1, 100), 1);
    close(fd);
    /* concurrent acquirers all get the error; one fetch */
    racer r[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        r[i] = (racer){.f = &f, .digest = d};
        assert_int_equal(pthread_create(&th[i], NULL, race, &r[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(r[i].rc, -1);
        assert_null(r[i].path);
    }
    char *p = NULL;
    dsec_err err;
    assert_int_equal(dsec_layer_cache_acquire(f.cache, d, &p, &err), -1);
    assert_null(p);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "digest mismatch"));
    assert_non_null(strstr(err.msg, d));
    dsec_layer_cache_stats st;
    dsec_layer_cache_stats_get(f.cache, &st);
    assert_int_equal(st.layers, 0);
    assert_int_equal(st.bytes, 0);
    /* nothing of it stays in the cache */
    assert_int_equal(access(pathf("%s/blobs/%s", f.cdir, d + 7), F_OK), -1);
    assert_int_equal(access(pathf("%s/layers/%s", f.cdir, d + 7), F_OK), -1);
    assert_int_equal(rmdir(pathf("%s/tmp", f.cdir)), 0); /* empty */
    assert_int_equal(mkdir(pathf("%s/tmp", f.cdir), 0700), 0);
    /* a digest the registry does not have */
    assert_int_equal(dsec_layer_cache_acquire(f.cache, D1, &p, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(dsec_layer_cache_acquire(f.cache, "sha256:zz", &p, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    fixture_close(&f);
    dsec_free(t);
}

/* Three DIR layers of the same size (distinct contents). */
static void three_layers(fixture *f, dsec_digest d[3])
{
    for (int i = 0; i < 3; i++) {
        char *t = dsec_strdup(pathf("%s/t%d", root, i));
        assert_int_equal(mkdir(t, 0755), 0);
        char body[40000];
        memset(body, 'a' + i, sizeof body - 1);
        body[sizeof body - 1] = '\0';
        write_file(pathf("%s/data", t), body, 0644);
        build_put(f->reg, t, DSEC_LAYER_DIR, NULL, d[i]);
        dsec_free(t);
    }
}

static void cache_evicts_lru_unused_only(void **state)
{
    fixture f;
    fixture_open(&f, false, 0);
    dsec_digest d[3];
    three_layers(&f, d);
    /* measure one layer's bytes with an unlimited cache */
    char *p = acquire(&f, d[0]);
    dsec_free(p);
    dsec_layer_cache_release(f.cache, d[0]);
    dsec_layer_cache_stats st;
    dsec_layer_cache_stats_get(f.cache, &st);
    uint64_t one = st.bytes;
    assert_true(one > 0);
    fixture_close(&f);
    unmount_below(pathf("%s/cache", root));
    rm_rf(pathf("%s/cache", root));

    /* room for two */
    fixture_open(&f, false, one * 2 + one / 2);
    char *pa = acquire(&f, d[0]); /* held throughout */
    char *pb = acquire(&f, d[1]);
    dsec_layer_cache_release(f.cache, d[1]);
    dsec_free(pb);
    dsec_layer_cache_stats_get(f.cache, &st);
    assert_int_equal(st.evictions, 0);
    char *pc = acquire(&f, d[2]); /* over budget: b is the only unused one */
    dsec_layer_cache_stats_get(f.cache, &st);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.layers, 2);
    assert_true(st.bytes <= one * 2 + one / 2);
    assert_int_equal(access(pathf("%s/layers/%s", f.cdir, d[1] + 7), F_OK), -1);
    assert_int_equal(access(pathf("%s/data", pa), R_OK), 0);
    assert_int_equal(access(pathf("%s/data", pc), R_OK), 0);
    dsec_free(pc);
    /* c released, then b back: c is now the least recently used unused one */
    dsec_layer_cache_release(f.cache, d[2]);
    pb = acquire(&f, d[1]);
    dsec_layer_cache_stats_get(f.cache, &st);
    assert_int_equal(st.fetches, 4);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(access(pathf("%s/layers/%s", f.cdir, d[2] + 7), F_OK), -1);
    assert_int_equal(access(pathf("%s/data", pa), R_OK), 0);
    dsec_layer_cache_release(f.cache, d[1]);
    dsec_free(pb);
    dsec_layer_cache_release(f.cache, d[0]);
    dsec_free(pa);
    fixture_close(&f);
    unmount_below(pathf("%s/cache", root));
    rm_rf(pathf("%s/cache", root));

    /* a budget nothing fits in: layers in use are kept regardless, and go when released */
    fixture_open(&f, false, 1);
    pa = acquire(&f, d[0]);
    pb = acquire(&f, d[1]);
    dsec_layer_cache_stats_get(f.cache, &st);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(st.layers, 2);
    assert_true(st.bytes > 1);
    assert_int_equal(access(pathf("%s/data", pa), R_OK), 0);
    dsec_layer_cache_release(f.cache, d[1]);
    dsec_layer_cache_stats_get(f.cache, &st);
    assert_int_equal(st.evictions, 1);
    assert_int_equal(st.layers, 1);
    assert_int_equal(access(pathf("%s/data", pa), R_OK), 0);
    dsec_layer_cache_release(f.cache, d[0]);
    dsec_layer_cache_stats_get(f.cache, &st);
    assert_int_equal(st.layers, 0);
    assert_int_equal(st.bytes, 0);
    dsec_free(pa);
    dsec_free(pb);
    fixture_close(&f);
}

/* Backends of one node share one cache: the same instance per directory. */
static void cache_is_shared_per_directory(void **state)
{
    fixture f;
    fixture_open(&f, false, 0);
    dsec_layer_cache_free(f.cache); /* the fixture's own, unshared instance */
    char *t = dsec_strdup(pathf("%s/tree", root));
    make_tree(t);
    dsec_digest d;
    build_put(f.reg, t, DSEC_LAYER_DIR, NULL, d);
    dsec_err err;
    dsec_layer_cache *a, *b, *c;
    assert_int_equal(dsec_layer_cache_share(&a, f.cdir, 0, f.reg, &err), 0);
    /* the same directory by another spelling: the same instance */
    assert_int_equal(dsec_layer_cache_share(&b, pathf("%s/../cache/.", f.cdir), 0, f.reg, &err), 0);
    assert_ptr_equal(a, b);
    f.cache = a;
    char *p = acquire(&f, d);
    f.cache = b;
    char *q = acquire(&f, d);
    assert_string_equal(p, q);
    dsec_layer_cache_stats st;
    dsec_layer_cache_stats_get(b, &st);
    assert_int_equal(st.fetches, 1);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.in_use, 1);
    /* another registry on the same directory is refused */
    dsec_layer_registry *other;
    assert_int_equal(dsec_layer_registry_local(&other, pathf("%s/reg2", root), &err), 0);
    assert_int_equal(dsec_layer_cache_share(&c, f.cdir, 0, other, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    dsec_layer_registry_free(other);
    /* one share closing leaves the cache to the other, layer still mounted */
    dsec_layer_cache_release(a, d);
    dsec_layer_cache_free(a);
    check_layer(q);
    dsec_layer_cache_release(b, d);
    dsec_layer_cache_stats_get(b, &st);
    assert_int_equal(st.in_use, 0);
    dsec_layer_cache_free(b);
    /* the last share closed it: the directory can be opened again */
    assert_int_equal(dsec_layer_cache_new(&f.cache, f.cdir, 0, f.reg, &err), 0);
    dsec_free(p);
    dsec_free(q);
    dsec_free(t);
    fixture_close(&f);
}

static void cache_rediscovers_after_restart(void **state)
{
    fixture f;
    fixture_open(&f, false, 0);
    char *t = dsec_strdup(pathf("%s/t", root));
    make_tree(t);
    dsec_digest de, dd;
    build_put(f.reg, t, DSEC_LAYER_EROFS, NULL, de);
    build_put(f.reg, t, DSEC_LAYER_DIR, NULL, dd);
    char *p = acquire(&f, de);
    dsec_free(p);
    dsec_layer_cache_release(f.cache, de);
    char *held = acquire(&f, dd); /* still in use when the cache closes */
    dsec_layer_cache_stats st;
    dsec_layer_cache_stats_get(f.cache, &st);
    uint64_t bytes = st.bytes;
    /* a second instance on the same directory is refused */
    dsec_layer_cache *other;
    dsec_err err;
    assert_int_equal(dsec_layer_cache_new(&other, f.cdir, 0, f.reg, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    dsec_layer_cache_free(f.cache);
    /* the unused one was unmounted, the used one left mounted */
    assert_int_equal(access(pathf("%s/etc/hello", pathf("%s/layers/%s", f.cdir, de + 7)), F_OK),
                     -1);
    assert_true(file_has(pathf("%s/etc/hello", held), "hello\n"));
    /* a crashed fetch's leftovers */
    assert_int_equal(mkdir(pathf("%s/layers/%s", f.cdir, D1 + 7), 0755), 0);
    assert_int_equal(mkdir(pathf("%s/tmp/fetch.junk", f.cdir), 0755), 0);

    if (dsec_layer_cache_new(&f.cache, f.cdir, 0, f.reg, &err) < 0)
        fail_msg("reopen: %s", err.msg);
    dsec_layer_cache_stats_get(f.cache, &st);
    assert_int_equal(st.layers, 2);
    assert_int_equal(st.bytes, bytes);
    assert_int_equal(st.fetches, 0);
    assert_int_equal(access(pathf("%s/layers/%s", f.cdir, D1 + 7), F_OK), -1);
    assert_int_equal(access(pathf("%s/tmp/fetch.junk", f.cdir), F_OK), -1);
    /* the registry loses its copies: the cache needs none of them */
    assert_int_equal(system(pathf("rm -rf %s/reg/blobs", root)), 0);
    p = acquire(&f, de);
    check_layer(p);
    char *q = acquire(&f, dd);
    assert_string_equal(q, held);
    check_layer(q);
    dsec_layer_cache_stats_get(f.cache, &st);
    assert_int_equal(st.fetches, 0);
    assert_int_equal(st.hits, 2);
    dsec_layer_cache_release(f.cache, de);
    dsec_layer_cache_release(f.cache, dd);
    dsec_free(p);
    dsec_free(q);
    dsec_free(held);
    fixture_close(&f);
    dsec_free(t);
}

static void cache_mounts_shared_registry_blobs_in_place(void **state)
{
    fixture f;
    fixture_open(&f, true, 0);
    assert_string_equal(dsec_layer_registry_kind(f.reg), "shared");
    char *t = dsec_strdup(pathf("%s/t", root));
    make_tree(t);
    dsec_digest d;
    build_put(f.reg, t, DSEC_LAYER_EROFS, NULL, d);
    char *direct = dsec_layer_registry_direct_path(f.reg, d);
    assert_non_null(direct);
    assert_string_equal(direct, pathf("%s/reg/blobs/sha256/%s", root, d + 7));
    assert_null(dsec_layer_registry_direct_path(f.reg, D1));
    char *p = acquire(&f, d);
    check_layer(p);
    /* the loop device reads the registry's own file; nothing was copied */
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(major(st.st_dev), 7);
    char bf[1024] = "";
    FILE *fp = fopen(
        pathf("/sys/dev/block/%u:%u/loop/backing_file", major(st.st_dev), minor(st.st_dev)), "r");
    assert_non_null(fp);
    assert_non_null(fgets(bf, sizeof bf, fp));
    fclose(fp);
    bf[strcspn(bf, "\n")] = '\0';
    assert_string_equal(bf, direct);
    assert_int_equal(access(pathf("%s/blobs/%s", f.cdir, d + 7), F_OK), -1);
    dsec_layer_cache_stats cs;
    dsec_layer_cache_stats_get(f.cache, &cs);
    assert_int_equal(cs.bytes, 0);
    assert_int_equal(cs.fetches, 1);
    dsec_layer_cache_release(f.cache, d);
    dsec_free(p);
    /* after a restart it is mounted in place again */
    dsec_layer_cache_free(f.cache);
    dsec_err err;
    assert_int_equal(dsec_layer_cache_new(&f.cache, f.cdir, 0, f.reg, &err), 0);
    p = acquire(&f, d);
    check_layer(p);
    dsec_layer_cache_stats_get(f.cache, &cs);
    assert_int_equal(cs.hits, 1);
    assert_int_equal(cs.fetches, 0);
    dsec_layer_cache_release(f.cache, d);
    dsec_free(p);
    dsec_free(direct);
    /* a tar layer is unpacked straight from the shared file: a local tree, no blob copy */
    dsec_digest dd;
    build_put(f.reg, t, DSEC_LAYER_DIR, NULL, dd);
    p = acquire(&f, dd);
    check_layer(p);
    dsec_layer_cache_stats_get(f.cache, &cs);
    assert_true(cs.bytes > 0);
    assert_int_equal(cs.fetches, 1);
    assert_int_equal(access(pathf("%s/blobs/%s", f.cdir, dd + 7), F_OK), -1);
    dsec_layer_cache_release(f.cache, dd);
    dsec_free(p);
    fixture_close(&f);
    dsec_free(t);
}

int main(void)
{
    have_root = geteuid() == 0;
    if (!have_root) {
        fprintf(stderr, "test_layers: needs root (mounts, loop devices, chown); skipping\n");
    } else {
        /* a private mount namespace: nothing mounted here outlives the process */
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
            fprintf(stderr, "test_layers: private mount namespace: %s\n", strerror(errno));
            return 1;
        }
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(digests_names_and_formats, setup, teardown),
        cmocka_unit_test_setup_teardown(env_documents_round_trip_and_refuse_malformed, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(builds_are_reproducible_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(builds_are_reproducible_erofs, setup, teardown),
        cmocka_unit_test_setup_teardown(registry_blobs_tags_envs, setup, teardown),
        cmocka_unit_test_setup_teardown(cache_mounts_dir_layers_read_only, setup, teardown),
        cmocka_unit_test_setup_teardown(cache_mounts_erofs_layers_read_only, setup, teardown),
        cmocka_unit_test_setup_teardown(cache_concurrent_acquires_fetch_once, setup, teardown),
        cmocka_unit_test_setup_teardown(cache_refuses_a_corrupted_blob, setup, teardown),
        cmocka_unit_test_setup_teardown(cache_evicts_lru_unused_only, setup, teardown),
        cmocka_unit_test_setup_teardown(cache_is_shared_per_directory, setup, teardown),
        cmocka_unit_test_setup_teardown(cache_rediscovers_after_restart, setup, teardown),
        cmocka_unit_test_setup_teardown(cache_mounts_shared_registry_blobs_in_place, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
