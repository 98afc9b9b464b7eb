/* layer-build.c - dsec_layer_build: a directory or tarball into a reproducible EROFS image or tar
 * blob. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/layers/layer-int.h"
#include "dsec/alloc.h"
#include "dsec/layers.h"

/*
 * Reproducibility: both formats put entries in name order, give every file
 * the timestamp 0 and keep numeric owners, modes, device numbers, symlinks,
 * hard links and xattrs (so overlay whiteouts - char 0/0 - and
 * trusted.overlay.opaque survive: container snapshots are overlay upper dirs).
 * EROFS images carry a fixed UUID; tar blobs are POSIX (pax) archives with no
 * atime/ctime and pax header names without the pid.
 *
 * Excludes: a path (relative to src, no leading "./") is left out, with all
 * below it, when a pattern fnmatch()es it (no FNM_PATHNAME: '*' crosses '/'),
 * or when a pattern without '/' matches its last component. The tar list is
 * walked here; for mkfs.erofs the same rule is handed over as regexes.
 */

#define EROFS_UUID "d5ec0000-1a7e-4000-8000-000000000000"
#define TAR_XATTR_OPTS "--xattrs", "--xattrs-include=*"

int dsec__layer_untar(const char *tarball, const char *dir, dsec_err *err)
{
    const char *argv[] = {"tar",
                          "--extract",
                          "--file",
                          tarball,
                          "--directory",
                          dir,
                          "--numeric-owner",
                          "--same-owner",
                          "--same-permissions",
                          TAR_XATTR_OPTS,
                          NULL};
    if (dsec__layer_run(argv, -1, -1, err) < 0)
        return dsec_err_wrap(err, "unpacking %s", tarball);
    return 0;
}

static bool excluded(const char *rel, const char *const *pats, size_t n)
{
    const char *base = strrchr(rel, '/');
    base = base != NULL ? base + 1 : rel;
    for (size_t i = 0; i < n; i++) {
        if (fnmatch(pats[i], rel, 0) == 0)
            return true;
        if (strchr(pats[i], '/') == NULL && fnmatch(pats[i], base, 0) == 0)
            return true;
    }
    return false;
}

static int name_cmp(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Write every path under root/rel not excluded, NUL-terminated, in name order. */
static int walk_list(const char *root, const char *rel, const char *const *pats, size_t n,
                     FILE *out, dsec_err *err)
{
    char *path = rel[0] != '\0' ? dsec__layer_path("%s/%s", root, rel) : dsec_strdup(root);
    if (path == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "listing %s", root);
    struct dirent **ents;
    int ne = scandir(path, &ents, NULL, name_cmp);
    if (ne < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "listing %s", path);
        dsec_free(path);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < ne; i++) {
        const char *nm = ents[i]->d_name;
        if (rc == 0 && strcmp(nm, ".") != 0 && strcmp(nm, "..") != 0) {
            char *child = rel[0] != '\0' ? dsec__layer_path("%s/%s", rel, nm) : dsec_strdup(nm);
            char *full = dsec__layer_path("%s/%s", path, nm);
            struct stat st;
            if (child == NULL || full == NULL) {
                rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "listing %s", root);
            } else if (!excluded(child, pats, n)) {
                fwrite(child, 1, strlen(child) + 1, out);
                if (lstat(full, &st) < 0)
                    rc = dsec_err_set(err, DSEC_E_IO, errno, "reading %s", full);
                else if (S_ISDIR(st.st_mode))
                    rc = walk_list(root, child, pats, n, out, err);
            }
            dsec_free(child);
            dsec_free(full);
        }
        free(ents[i]); /* scandir's entries come from libc */
    }
    free(ents);
    dsec_free(path);
    return rc;
}

/* Append the ERE for glob g to f ('*' and '?' as given: any char, or none but '/'). */
static void glob_to_ere(FILE *f, const char *g, bool slash_ok)
{
    for (const char *p = g; *p != '\0'; p++) {
        switch (*p) {
        case '*':
            fputs(slash_ok ? ".*" : "[^/]*", f);
            break;
        case '?':
            fputs(slash_ok ? "." : "[^/]", f);
            break;
        case '\\':
            if (p[1] != '\0')
                p++;
            fprintf(f, "\\%c", *p);
            break;
        case '[': {
            const char *q = p + 1;
            if (*q == '!' || *q == '^')
                q++;
            if (*q == ']')
                q++;
            while (*q != '\0' && *q != ']')
                q++;
            if (*q != ']') { /* no closing bracket: a literal '[' (as fnmatch takes it) */
                fputs("\\[", f);
                break;
            }
            fputc('[', f);
            const char *r = p + 1;
            if (*r == '!' || *r == '^') {
                fputc('^', f);
                r++;
            }
            for (; r <= q; r++)
                fputc(*r, f);
            p = q;
            break;
        }
        default:
            if (strchr(".^$+(){}|]", *p) != NULL)
                fputc('\\', f);
            fputc(*p, f);
        }
    }
}

/* The --exclude-regex= argument for one pattern; dsec_malloc'd. */
static char *exclude_regex_arg(const char *pat)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f == NULL)
        return NULL;
    fputs("--exclude-regex=^(", f);
    glob_to_ere(f, pat, true);
    fputs(")$", f);
    if (strchr(pat, '/') == NULL) {
        fputs("|^(.*/)?(", f);
        glob_to_ere(f, pat, false);
        fputs(")$", f);
    }
    char *out = NULL;
    if (fclose(f) == 0)
        out = dsec_strdup(buf);
    free(buf); /* open_memstream's buffer comes from libc */
    return out;
}

static int build_tar(const char *tree, const char *work, const char *const *exclude,
                     size_t nexclude, int out_fd, dsec_err *err)
{
    char *list = dsec__layer_path("%s/list", work);
    if (list == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "building a layer");
    FILE *f = fopen(list, "we");
    if (f == NULL) {
        dsec_err_set(err, DSEC_E_IO, errno, "creating %s", list);
        dsec_free(list);
        return -1;
    }
    fwrite(".", 1, 2, f); /* the root itself: its mode, owner and xattrs */
    int rc = walk_list(tree, "", exclude, nexclude, f, err);
    if (fclose(f) != 0 && rc == 0)
        rc = dsec_err_set(err, DSEC_E_IO, errno, "writing %s", list);
    if (rc == 0) {
        char *files_from = dsec__layer_path("--files-from=%s", list);
        const char *argv[] = {"tar",
                              "--create",
                              "--file=-",
                              "--directory",
                              tree,
                              "--format=posix",
                              "--numeric-owner",
                              "--mtime=@0",
                              "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
                              TAR_XATTR_OPTS,
                              "--no-recursion",
                              "--null",
                              "--verbatim-files-from",
                              "--no-unquote",
                              files_from,
                              NULL};
        rc = files_from == NULL ? dsec_err_set(err, DSEC_E_NOMEM, 0, "building a layer")
                                : dsec__layer_run(argv, -1, out_fd, err);
        dsec_free(files_from);
    }
    dsec_free(list);
    return rc;
}

static int build_erofs(const char *tree, const char *const *exclude, size_t nexclude,
                       const char *out_blob, dsec_err *err)
{
    size_t argc = 0, cap = 8 + nexclude;
    const char **argv = dsec_calloc(cap, sizeof *argv);
    char **rx = dsec_calloc(nexclude + 1, sizeof *rx);
    int rc = -1;
    if (argv == NULL || rx == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "building a layer");
        goto out;
    }
    argv[argc++] = "mkfs.erofs";
    argv[argc++] = "--quiet";
    argv[argc++] = "-T0";
    argv[argc++] = "-U" EROFS_UUID;
    for (size_t i = 0; i < nexclude; i++) {
        if ((rx[i] = exclude_regex_arg(exclude[i])) == NULL) {
            dsec_err_set(err, DSEC_E_NOMEM, 0, "building a layer");
            goto out;
        }
        argv[argc++] = rx[i];
    }
    argv[argc++] = out_blob;
    argv[argc++] = tree;
    argv[argc] = NULL;
    rc = dsec__layer_run(argv, -1, -1, err);
out:
    for (size_t i = 0; rx != NULL && i < nexclude; i++)
        dsec_free(rx[i]);
    dsec_free(rx);
    dsec_free(argv);
    return rc;
}

/* Whether path is tree or inside it (both resolved). */
static bool path_inside(const char *path, const char *tree)
{
    size_t n = strlen(tree);
    return strncmp(path, tree, n) == 0 && (path[n] == '\0' || path[n] == '/' || n == 1);
}

int dsec_layer_build(const char *src, dsec_layer_format fmt, const char *const *exclude,
                     size_t nexclude, const char *out_blob, dsec_digest digest, dsec_err *err)
{
    if (src == NULL || out_blob == NULL || src[0] == '\0' || out_blob[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "building a layer: source and output are required");
    if (fmt != DSEC_LAYER_EROFS && fmt != DSEC_LAYER_DIR)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "building a layer: unknown format %d",
                            (int)fmt);
    for (size_t i = 0; i < nexclude; i++)
        if (exclude[i] == NULL || exclude[i][0] == '\0' || strchr(exclude[i], '\n') != NULL)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "building a layer: exclude pattern %zu is empty or holds a newline",
                                i + 1);
    struct stat st;
    if (stat(src, &st) < 0)
        return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "building a layer from %s", src);
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "building a layer from %s: not a directory nor a tarball", src);

    int out_fd = open(out_blob, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out_fd < 0)
        return dsec_err_set(err, errno == EEXIST ? DSEC_E_EXISTS : DSEC_E_IO, errno,
                            "creating the layer file %s", out_blob);
    int rc = -1;
    char *tree = NULL, *work = NULL, *out_real = NULL;
    char *d = dsec_strdup(out_blob);
    if (d == NULL || (work = dsec__layer_path("%s/#build.XXXXXX", dirname(d))) == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "building a layer");
        goto out;
    }
    if (mkdtemp(work) == NULL) {
        dsec_err_set(err, DSEC_E_IO, errno, "creating a work directory beside %s", out_blob);
        dsec_free(work);
        work = NULL;
        goto out;
    }
    if (S_ISDIR(st.st_mode)) {
        char *r = realpath(src, NULL);
        tree = r != NULL ? dsec_strdup(r) : NULL;
        free(r);
        char *o = realpath(out_blob, NULL);
        out_real = o != NULL ? dsec_strdup(o) : NULL;
        free(o);
        if (tree == NULL || out_real == NULL) {
            dsec_err_set(err, DSEC_E_IO, errno, "resolving %s", src);
            goto out;
        }
        if (path_inside(out_real, tree)) {
            dsec_err_set(err, DSEC_E_INVALID, 0,
                         "building a layer from %s: the output %s is inside it; write it elsewhere",
                         src, out_blob);
            goto out;
        }
    } else {
        if ((tree = dsec__layer_path("%s/tree", work)) == NULL) {
            dsec_err_set(err, DSEC_E_NOMEM, 0, "building a layer");
            goto out;
        }
        if (mkdir(tree, 0755) < 0) {
            dsec_err_set(err, DSEC_E_IO, errno, "creating %s", tree);
            goto out;
        }
        if (dsec__layer_untar(src, tree, err) < 0) {
            dsec_err_wrap(err, "building a layer from %s (not a tarball?)", src);
            goto out;
        }
    }
    if (fmt == DSEC_LAYER_DIR)
        rc = build_tar(tree, work, exclude, nexclude, out_fd, err);
    else
        rc = build_erofs(tree, exclude, nexclude, out_blob, err);
    if (rc == 0 && fsync(out_fd) < 0)
        rc = dsec_err_set(err, DSEC_E_IO, errno, "writing %s", out_blob);
    if (rc == 0)
        rc = dsec_digest_file(out_blob, digest, err);
out:
    close(out_fd);
    if (work != NULL)
        dsec__layer_rm_rf(work, NULL);
    if (rc < 0)
        unlink(out_blob);
    dsec_free(d);
    dsec_free(work);
    dsec_free(tree);
    dsec_free(out_real);
    return rc;
}
