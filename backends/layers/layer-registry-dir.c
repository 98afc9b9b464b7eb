/* layer-registry-dir.c - the local-directory and shared-filesystem layer registries (one on-disk
 * layout). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/layers/layer-int.h"
#include "dsec/alloc.h"
#include "dsec/io.h"
#include "dsec/layers.h"
#include "dsec/sha256.h"

/*
 * Layout under the root:
 *   blobs/sha256/<hex>        the blob (0444)
 *   blobs/sha256/<hex>.meta   "dsec-blob 1 / format F / size N", written before the blob
 *   tags/<name>/<version>     "sha256:<hex>\n"
 *   envs/<name>/<version>     an environment document
 *   docs/<kind>/<key>         a document (image records, diff_id records); the key
 *                             encoded by dsec_layer_doc_key_encode (no '/', no ':')
 *   .lock                     flock: shared for adding references, exclusive for removal
 * Every file appears by rename(2) of a fsync'd temp file ("#tmp.*", '#' being
 * in no name) from the same directory, so several processes, on several
 * hosts for a shared filesystem, can write at once: readers see whole files
 * only. The lock makes "refuse to remove a blob still referenced" and "add a
 * reference to an existing blob" exclude each other.
 */

typedef struct dirreg {
    char *root;
    bool shared;
} dirreg;

#define META_MAX 256
#define ENV_MAX (1u << 20)

static const char *hex_of(const char *digest)
{
    return digest + 7;
}

/* flock the registry's lock file; returns the fd to close, or -1 with err. */
static int reg_lock(dirreg *g, int how, dsec_err *err)
{
    char *p = dsec__layer_path("%s/.lock", g->root);
    if (p == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "locking the layer registry");
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "opening %s", p);
        dsec_free(p);
        return -1;
    }
    while (flock(fd, how) < 0) {
        if (errno == EINTR)
            continue;
        dsec_err_set(err, DSEC_E_IO, errno, "locking %s", p);
        close(fd);
        dsec_free(p);
        return -1;
    }
    dsec_free(p);
    return fd;
}

static void reg_unlock(int fd)
{
    if (fd >= 0)
        close(fd); /* drops the flock */
}

/* "<root>/<sub>/<name>/<version>" for name:version (the version is after the last ':';
 * a registry host's port stays in the first directory's name). */
static char *named_path(dirreg *g, const char *sub, const char *name)
{
    const char *colon = strrchr(name, ':');
    return dsec__layer_path("%s/%s/%.*s/%s", g->root, sub, (int)(colon - name), name, colon + 1);
}

static bool blob_exists(dirreg *g, const char *digest)
{
    char *p = dsec__layer_path("%s/blobs/sha256/%s", g->root, hex_of(digest));
    bool ok = p != NULL && access(p, F_OK) == 0;
    dsec_free(p);
    return ok;
}

/* ---- blobs -------------------------------------------------------------------------------- */

static int dir_get(void *self, const char *digest, const char *dest, dsec_err *err)
{
    dirreg *g = self;
    char *p = dsec__layer_path("%s/blobs/sha256/%s", g->root, hex_of(digest));
    if (p == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "fetching layer %s", digest);
    int in = open(p, O_RDONLY | O_CLOEXEC);
    if (in < 0) {
        dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                     "layer %s is not in the registry at %s", digest, g->root);
        dsec_free(p);
        return -1;
    }
    dsec_free(p);
    int out = open(dest, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (out < 0) {
        dsec_err_set(err, errno == EEXIST ? DSEC_E_EXISTS : DSEC_E_IO, errno,
                     "fetching layer %s into %s", digest, dest);
        close(in);
        return -1;
    }
    int rc = 0;
    for (;;) {
        ssize_t n = copy_file_range(in, NULL, out, NULL, 1 << 30, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = dsec_err_set(err, DSEC_E_IO, errno, "copying layer %s into %s", digest, dest);
            break;
        }
        if (n == 0)
            break;
    }
    close(in);
    if (close(out) < 0 && rc == 0)
        rc = dsec_err_set(err, DSEC_E_IO, errno, "writing %s", dest);
    if (rc < 0)
        unlink(dest);
    return rc;
}

static char *dir_direct_path(void *self, const char *digest)
{
    dirreg *g = self;
    if (!g->shared)
        return NULL;
    char *p = dsec__layer_path("%s/blobs/sha256/%s", g->root, hex_of(digest));
    if (p != NULL && access(p, R_OK) != 0) {
        dsec_free(p);
        return NULL;
    }
    return p;
}

/* Copy src to the open fd, hashing on the way, and check the digest. */
static int copy_hashed(const char *src, int out, const char *digest, dsec_err *err)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "opening layer file %s", src);
    enum { BUF = 1 << 20 };
    char *buf = dsec_malloc(BUF);
    if (buf == NULL) {
        close(in);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "storing %s", src);
    }
    dsec_sha256 c;
    dsec_sha256_init(&c);
    int rc = 0;
    for (;;) {
        ssize_t n = dsec_read_eintr(in, buf, BUF);
        if (n < 0) {
            rc = dsec_err_set(err, DSEC_E_IO, errno, "reading %s", src);
            break;
        }
        if (n == 0)
            break;
        dsec_sha256_update(&c, buf, (size_t)n);
        if (dsec_write_all(out, buf, (size_t)n) < 0) {
            rc = dsec_err_set(err, DSEC_E_IO, errno, "writing the copy of %s", src);
            break;
        }
    }
    dsec_free(buf);
    close(in);
    if (rc < 0)
        return -1;
    uint8_t raw[DSEC_SHA256_LEN];
    dsec_sha256_final(&c, raw);
    dsec_digest got;
    dsec_digest_from_raw(raw, got);
    if (strcmp(got, digest) != 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "layer file %s does not match its digest: it hashes to %s, not %s", src,
                            got, digest);
    return 0;
}

static int dir_put(void *self, const char *digest, dsec_layer_format fmt, const char *src,
                   dsec_err *err)
{
    dirreg *g = self;
    char *blob = dsec__layer_path("%s/blobs/sha256/%s", g->root, hex_of(digest));
    char *meta = dsec__layer_path("%s/blobs/sha256/%s.meta", g->root, hex_of(digest));
    char *tmp = dsec__layer_path("%s/blobs/sha256/#tmp.XXXXXX", g->root);
    int rc = -1, fd = -1;
    if (blob == NULL || meta == NULL || tmp == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "storing layer %s", digest);
        goto out;
    }
    if (access(blob, F_OK) == 0 && access(meta, F_OK) == 0) {
        rc = 0; /* content-addressed: the same digest is the same bytes */
        goto out;
    }
    fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "creating a temp file in %s/blobs/sha256", g->root);
        goto out;
    }
    if (copy_hashed(src, fd, digest, err) < 0)
        goto out_unlink;
    struct stat st;
    if (fstat(fd, &st) < 0 || fchmod(fd, 0444) < 0 || fsync(fd) < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "storing layer %s", digest);
        goto out_unlink;
    }
    char doc[META_MAX];
    int n = snprintf(doc, sizeof doc, "dsec-blob 1\nformat %s\nsize %llu\n",
                     dsec_layer_format_name(fmt), (unsigned long long)st.st_size);
    /* the metadata goes first: a visible blob always has it */
    if (dsec__layer_write_atomic(meta, doc, (size_t)n, err) < 0)
        goto out_unlink;
    if (rename(tmp, blob) < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "storing layer %s as %s", digest, blob);
        goto out_unlink;
    }
    rc = 0;
    goto out;
out_unlink:
    unlink(tmp);
out:
    if (fd >= 0)
        close(fd);
    dsec_free(blob);
    dsec_free(meta);
    dsec_free(tmp);
    return rc;
}

/* Read a blob's metadata; -1 (no err) when missing or malformed. */
static int read_meta(dirreg *g, const char *hex, dsec_layer_format *fmt, uint64_t *size)
{
    char *p = dsec__layer_path("%s/blobs/sha256/%s.meta", g->root, hex);
    char *doc = NULL;
    size_t len;
    int rc = -1;
    if (p != NULL && dsec_read_file(p, META_MAX, &doc, &len, NULL) == 0) {
        char f[16];
        unsigned long long s;
        dsec_err e;
        if (sscanf(doc, "dsec-blob 1\nformat %15s\nsize %llu\n", f, &s) == 2 &&
            dsec_layer_format_parse(f, fmt, &e) == 0) {
            *size = s;
            rc = 0;
        }
    }
    dsec_free(p);
    dsec_free(doc);
    return rc;
}

/* ---- names (tags and environments) ----------------------------------------------------------- */

typedef struct namelist {
    char **names;  /* "name:version" */
    char **values; /* file contents (trimmed) when asked for, else NULL */
    size_t n;
} namelist;

static void namelist_free(namelist *l)
{
    dsec_layer_names_free(l->names, l->n);
    dsec_layer_names_free(l->values, l->values != NULL ? l->n : 0);
    memset(l, 0, sizeof *l);
}

/* Walk <root>/<sub>: every regular file <a>/<b>/<v> is the name "a/b:v"; with
 * values, its contents too (trimmed of trailing newlines with trim). */
static int walk_names(const char *base, const char *rel, bool values, bool trim, namelist *l,
                      dsec_err *err)
{
    char *path = rel[0] != '\0' ? dsec__layer_path("%s/%s", base, rel) : dsec_strdup(base);
    if (path == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "listing %s", base);
    DIR *d = opendir(path);
    if (d == NULL) {
        int e = errno;
        dsec_free(path);
        return e == ENOENT ? 0 : dsec_err_set(err, DSEC_E_IO, e, "listing %s", base);
    }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '#' || strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        char *child =
            rel[0] != '\0' ? dsec__layer_path("%s/%s", rel, de->d_name) : dsec_strdup(de->d_name);
        char *full = dsec__layer_path("%s/%s", path, de->d_name);
        struct stat st;
        if (child == NULL || full == NULL) {
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "listing %s", base);
        } else if (lstat(full, &st) == 0 && S_ISDIR(st.st_mode)) {
            rc = walk_names(base, child, values, trim, l, err);
        } else if (S_ISREG(st.st_mode) && rel[0] != '\0') {
            char *name = dsec__layer_path("%s:%s", rel, de->d_name);
            char *val = NULL;
            size_t vlen = 0;
            if (name == NULL || !dsec_layer_name_valid(name) ||
                (values && dsec_read_file(full, ENV_MAX, &val, &vlen, NULL) < 0)) {
                dsec_free(name); /* a stray file, or one removed under us: not a name */
            } else {
                char **nn = dsec_realloc(l->names, (l->n + 1) * sizeof *nn);
                if (nn != NULL)
                    l->names = nn;
                char **nv = values ? dsec_realloc(l->values, (l->n + 1) * sizeof *nv) : NULL;
                if (nv != NULL)
                    l->values = nv;
                if (nn == NULL || (values && nv == NULL)) {
                    dsec_free(name);
                    dsec_free(val);
                    rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "listing %s", base);
                } else {
                    while (trim && val != NULL && vlen > 0 && val[vlen - 1] == '\n')
                        val[--vlen] = '\0';
                    l->names[l->n] = name;
                    if (values)
                        l->values[l->n] = val;
                    l->n++;
                }
            }
        }
        dsec_free(child);
        dsec_free(full);
    }
    closedir(d);
    dsec_free(path);
    return rc;
}

static int list_names(dirreg *g, const char *sub, bool values, namelist *l, dsec_err *err)
{
    memset(l, 0, sizeof *l);
    char *base = dsec__layer_path("%s/%s", g->root, sub);
    if (base == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "listing %s", sub);
    /* tag files end in a newline the digest does not have */
    int rc = walk_names(base, "", values, strcmp(sub, "tags") == 0, l, err);
    dsec_free(base);
    if (rc < 0)
        namelist_free(l);
    return rc;
}

/* Write <root>/<sub>/<name>/<version>, telling a name that collides with
 * another's path (tag "a:1" against "a/1:2") apart from plain I/O errors. */
static int write_named(dirreg *g, const char *sub, const char *what, const char *name,
                       const void *data, size_t len, dsec_err *err)
{
    char *p = named_path(g, sub, name);
    if (p == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "writing %s %s", what, name);
    char *dir = dsec_strdup(p);
    int rc = -1;
    if (dir == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "writing %s %s", what, name);
        goto out;
    }
    *strrchr(dir, '/') = '\0';
    if (dsec__layer_mkdir_p(dir, 0755, err) < 0) {
        if (err != NULL && err->code == DSEC_E_EXISTS)
            dsec_err_set(err, DSEC_E_EXISTS, 0,
                         "%s %s collides with an existing %s whose name:version is a prefix of its "
                         "path; choose another name",
                         what, name, what);
        goto out;
    }
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
        dsec_err_set(err, DSEC_E_EXISTS, 0,
                     "%s %s collides with existing %ss named %s/...; choose another version", what,
                     name, what, strchr(name, ':') + 1);
        goto out;
    }
    rc = dsec__layer_write_atomic(p, data, len, err);
out:
    dsec_free(p);
    dsec_free(dir);
    return rc;
}

/* Remove <root>/<sub>/<name>/<version> and the parents it leaves empty. */
static int remove_named(dirreg *g, const char *sub, const char *name)
{
    char *p = named_path(g, sub, name);
    if (p == NULL)
        return -1;
    struct stat st;
    if (lstat(p, &st) < 0 || !S_ISREG(st.st_mode) || unlink(p) < 0) {
        dsec_free(p);
        return -1;
    }
    size_t stop = strlen(g->root) + 1 + strlen(sub);
    for (char *s = strrchr(p, '/'); s != NULL && (size_t)(s - p) > stop; s = strrchr(p, '/')) {
        *s = '\0';
        if (rmdir(p) < 0)
            break;
    }
    dsec_free(p);
    return 0;
}

static int dir_tag_set(void *self, const char *name, const char *digest, dsec_err *err)
{
    dirreg *g = self;
    int lk = reg_lock(g, LOCK_SH, err);
    if (lk < 0)
        return -1;
    int rc;
    if (!blob_exists(g, digest)) {
        rc = dsec_err_set(err, DSEC_E_NOT_FOUND, 0,
                          "tagging %s: layer %s is not in the registry at %s", name, digest,
                          g->root);
    } else {
        char line[DSEC_DIGEST_STRLEN + 2];
        int n = snprintf(line, sizeof line, "%s\n", digest);
        rc = write_named(g, "tags", "tag", name, line, (size_t)n, err);
    }
    reg_unlock(lk);
    return rc;
}

static int dir_tag_get(void *self, const char *name, dsec_digest out, dsec_err *err)
{
    dirreg *g = self;
    char *p = named_path(g, "tags", name);
    if (p == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "looking up %s", name);
    char *doc = NULL;
    size_t len;
    int rc = dsec_read_file(p, 128, &doc, &len, err);
    dsec_free(p);
    if (rc < 0) {
        if (err != NULL && err->code == DSEC_E_NOT_FOUND)
            dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "no layer named %s in the registry at %s", name,
                         g->root);
        return -1;
    }
    while (len > 0 && doc[len - 1] == '\n')
        doc[--len] = '\0';
    if (!dsec_digest_valid(doc)) {
        dsec_free(doc);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "tag %s in %s holds a malformed digest", name,
                            g->root);
    }
    memcpy(out, doc, DSEC_DIGEST_STRLEN + 1);
    dsec_free(doc);
    return 0;
}

/* ---- listing and removal ------------------------------------------------------------------ */

static int info_cmp(const void *a, const void *b)
{
    const dsec_layer_info *x = a, *y = b;
    if ((x->name == NULL) != (y->name == NULL))
        return x->name == NULL ? 1 : -1; /* named first */
    if (x->name != NULL) {
        int c = strcmp(x->name, y->name);
        if (c != 0)
            return c;
    }
    return strcmp(x->digest, y->digest);
}

static int dir_list(void *self, dsec_layer_info **out, size_t *n, dsec_err *err)
{
    dirreg *g = self;
    *out = NULL;
    *n = 0;
    namelist tags;
    if (list_names(g, "tags", true, &tags, err) < 0)
        return -1;
    char *bdir = dsec__layer_path("%s/blobs/sha256", g->root);
    DIR *d = bdir != NULL ? opendir(bdir) : NULL;
    if (d == NULL) {
        int e = errno;
        namelist_free(&tags);
        dsec_free(bdir);
        return e == ENOENT ? 0
                           : dsec_err_set(err, DSEC_E_IO, e, "listing the registry at %s", g->root);
    }
    dsec_layer_info *v = NULL;
    size_t nv = 0;
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        dsec_digest dg;
        if (strlen(de->d_name) != 64)
            continue;
        memcpy(dg, "sha256:", 7);
        memcpy(dg + 7, de->d_name, 65);
        dsec_layer_format fmt;
        uint64_t size;
        if (!dsec_digest_valid(dg) || read_meta(g, de->d_name, &fmt, &size) < 0)
            continue;
        bool named = false;
        for (size_t i = 0; i <= tags.n && rc == 0; i++) {
            bool last = i == tags.n;
            if (!last && strcmp(tags.values[i], dg) != 0)
                continue;
            if (last && named)
                break;
            dsec_layer_info *nvv = dsec_realloc(v, (nv + 1) * sizeof *v);
            if (nvv == NULL) {
                rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "listing the registry");
                break;
            }
            v = nvv;
            memset(&v[nv], 0, sizeof v[nv]);
            memcpy(v[nv].digest, dg, sizeof dg);
            v[nv].format = fmt;
            v[nv].size = size;
            if (!last) {
                named = true;
                if ((v[nv].name = dsec_strdup(tags.names[i])) == NULL)
                    rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "listing the registry");
            }
            nv++;
        }
    }
    closedir(d);
    dsec_free(bdir);
    namelist_free(&tags);
    if (rc < 0) {
        dsec_layer_infos_free(v, nv);
        return -1;
    }
    if (nv > 1)
        qsort(v, nv, sizeof *v, info_cmp);
    *out = v;
    *n = nv;
    return 0;
}

/* Why digest may not go: a tag or an environment naming it; 0 when free. */
static int blob_referenced(dirreg *g, const char *digest, dsec_err *err)
{
    namelist l;
    if (list_names(g, "tags", true, &l, err) < 0)
        return -1;
    for (size_t i = 0; i < l.n; i++)
        if (strcmp(l.values[i], digest) == 0) {
            dsec_err_set(err, DSEC_E_STATE, 0, "layer %s is still tagged %s; remove the tag first",
                         digest, l.names[i]);
            namelist_free(&l);
            return -1;
        }
    namelist_free(&l);
    if (list_names(g, "envs", true, &l, err) < 0)
        return -1;
    int rc = 0;
    for (size_t i = 0; i < l.n && rc == 0; i++) {
        dsec_env *e;
        if (dsec_env_decode(l.values[i], strlen(l.values[i]), &e, NULL) < 0)
            continue; /* a malformed document references nothing we can honour */
        for (size_t j = 0; j < e->nlayers; j++)
            if (strcmp(e->layers[j], digest) == 0) {
                rc = dsec_err_set(err, DSEC_E_STATE, 0, "layer %s is still used by environment %s",
                                  digest, l.names[i]);
                break;
            }
        dsec_env_free(e);
    }
    namelist_free(&l);
    return rc;
}

static int dir_remove(void *self, const char *what, dsec_err *err)
{
    dirreg *g = self;
    int lk = reg_lock(g, LOCK_EX, err);
    if (lk < 0)
        return -1;
    int rc = 0;
    if (!dsec_digest_valid(what)) {
        if (remove_named(g, "tags", what) < 0)
            rc = dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "no layer named %s in the registry at %s",
                              what, g->root);
    } else if (!blob_exists(g, what)) {
        rc = dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "layer %s is not in the registry at %s", what,
                          g->root);
    } else if (blob_referenced(g, what, err) < 0) {
        rc = -1;
    } else {
        char *blob = dsec__layer_path("%s/blobs/sha256/%s", g->root, hex_of(what));
        char *meta = dsec__layer_path("%s/blobs/sha256/%s.meta", g->root, hex_of(what));
        if (blob == NULL || meta == NULL)
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "removing %s", what);
        else if (unlink(blob) < 0)
            rc = dsec_err_set(err, DSEC_E_IO, errno, "removing %s", blob);
        else
            unlink(meta);
        dsec_free(blob);
        dsec_free(meta);
    }
    reg_unlock(lk);
    return rc;
}

/* ---- environments ------------------------------------------------------------------------- */

static int dir_env_put(void *self, const char *name, const void *doc, size_t len, dsec_err *err)
{
    dirreg *g = self;
    int lk = reg_lock(g, LOCK_SH, err);
    if (lk < 0)
        return -1;
    /* the caller checked the layers exist; under the lock none can go before we write */
    dsec_env *e = NULL;
    int rc = dsec_env_decode(doc, len, &e, err);
    for (size_t i = 0; rc == 0 && i < e->nlayers; i++)
        if (!blob_exists(g, e->layers[i]))
            rc = dsec_err_set(err, DSEC_E_NOT_FOUND, 0,
                              "environment %s: layer %s is not in the registry at %s", name,
                              e->layers[i], g->root);
    dsec_env_free(e);
    if (rc == 0)
        rc = write_named(g, "envs", "environment", name, doc, len, err);
    reg_unlock(lk);
    return rc;
}

static int dir_env_get(void *self, const char *name, void **doc, size_t *len, dsec_err *err)
{
    dirreg *g = self;
    char *p = named_path(g, "envs", name);
    if (p == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "looking up environment %s", name);
    char *d;
    int rc = dsec_read_file(p, ENV_MAX, &d, len, err);
    dsec_free(p);
    if (rc < 0) {
        if (err != NULL && err->code == DSEC_E_NOT_FOUND)
            dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "no environment named %s in the registry at %s",
                         name, g->root);
        return -1;
    }
    *doc = d;
    return 0;
}

static int dir_env_remove(void *self, const char *name, dsec_err *err)
{
    dirreg *g = self;
    int lk = reg_lock(g, LOCK_EX, err);
    if (lk < 0)
        return -1;
    int rc = 0;
    if (remove_named(g, "envs", name) < 0)
        rc = dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "no environment named %s in the registry at %s",
                          name, g->root);
    reg_unlock(lk);
    return rc;
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int dir_env_list(void *self, char ***names, size_t *n, dsec_err *err)
{
    namelist l;
    if (list_names(self, "envs", false, &l, err) < 0)
        return -1;
    if (l.n > 1)
        qsort(l.names, l.n, sizeof *l.names, str_cmp);
    *names = l.names;
    *n = l.n;
    return 0;
}

/* ---- documents ---------------------------------------------------------------------------- */

static char *doc_path(dirreg *g, const char *kind, const char *key)
{
    char enc[DSEC_LAYER_DOC_KEY_MAX * 3 + 1];
    if (dsec_layer_doc_key_encode(key, enc, sizeof enc) < 0)
        return NULL;
    return dsec__layer_path("%s/docs/%s/%s", g->root, kind, enc);
}

static int dir_doc_put(void *self, const char *kind, const char *key, const void *data, size_t len,
                       dsec_err *err)
{
    dirreg *g = self;
    char *dir = dsec__layer_path("%s/docs/%s", g->root, kind);
    char *p = doc_path(g, kind, key);
    int rc = -1;
    if (dir == NULL || p == NULL)
        dsec_err_set(err, DSEC_E_NOMEM, 0, "storing %s document %s", kind, key);
    else if (dsec__layer_mkdir_p(dir, 0755, err) == 0)
        rc = dsec__layer_write_atomic(p, data, len, err);
    dsec_free(dir);
    dsec_free(p);
    return rc;
}

static int dir_doc_get(void *self, const char *kind, const char *key, char **data, size_t *len,
                       dsec_err *err)
{
    dirreg *g = self;
    char *p = doc_path(g, kind, key);
    if (p == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "reading %s document %s", kind, key);
    int rc = dsec_read_file(p, ENV_MAX, data, len, err);
    dsec_free(p);
    if (rc < 0 && err != NULL && err->code == DSEC_E_NOT_FOUND)
        dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "no %s %s in the registry at %s", kind, key,
                     g->root);
    return rc;
}

static int dir_doc_list(void *self, const char *kind, char ***keys, size_t *n, dsec_err *err)
{
    dirreg *g = self;
    char *dir = dsec__layer_path("%s/docs/%s", g->root, kind);
    if (dir == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "listing %s documents", kind);
    DIR *d = opendir(dir);
    if (d == NULL) {
        int e = errno;
        dsec_free(dir);
        return e == ENOENT ? 0 : dsec_err_set(err, DSEC_E_IO, e, "listing %s documents", kind);
    }
    char **v = NULL;
    size_t nv = 0;
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '#' || de->d_name[0] == '.')
            continue;
        char *k = dsec_layer_doc_key_decode(de->d_name);
        if (k == NULL)
            continue; /* not a key we wrote */
        char **nn = dsec_realloc(v, (nv + 1) * sizeof *nn);
        if (nn == NULL) {
            dsec_free(k);
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "listing %s documents", kind);
            break;
        }
        v = nn;
        v[nv++] = k;
    }
    closedir(d);
    dsec_free(dir);
    if (rc < 0) {
        dsec_layer_names_free(v, nv);
        return -1;
    }
    if (nv > 1)
        qsort(v, nv, sizeof *v, str_cmp);
    *keys = v;
    *n = nv;
    return 0;
}

static int dir_doc_remove(void *self, const char *kind, const char *key, dsec_err *err)
{
    dirreg *g = self;
    char *p = doc_path(g, kind, key);
    if (p == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "removing %s document %s", kind, key);
    int rc = 0;
    if (unlink(p) < 0)
        rc = dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                          "removing %s %s from the registry at %s", kind, key, g->root);
    dsec_free(p);
    return rc;
}

static void dir_close(void *self)
{
    dirreg *g = self;
    dsec_free(g->root);
    dsec_free(g);
}

/* A node's own directory and one shared by several nodes differ only in kind. */
#define DIR_OPS(KIND)                                                                              \
    {                                                                                              \
        .kind = KIND, .env_remove = dir_env_remove, .doc_put = dir_doc_put,                        \
        .doc_get = dir_doc_get, .doc_list = dir_doc_list, .doc_remove = dir_doc_remove,            \
        .get = dir_get, .direct_path = dir_direct_path, .put = dir_put, .tag_set = dir_tag_set,    \
        .tag_get = dir_tag_get, .list = dir_list, .remove = dir_remove, .env_put = dir_env_put,    \
        .env_get = dir_env_get, .close = dir_close, .env_list = dir_env_list,                      \
    }
static const dsec_layer_registry_ops local_ops = DIR_OPS("local");
static const dsec_layer_registry_ops shared_ops = DIR_OPS("shared");

static int open_dir(dsec_layer_registry **out, const char *dir, bool shared, dsec_err *err)
{
    *out = NULL;
    if (dir == NULL || dir[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "layer registry: no directory given");
    char *root = realpath(dir, NULL);
    if (root == NULL && errno == ENOENT) {
        if (dsec__layer_mkdir_p(dir, 0755, err) < 0)
            return dsec_err_wrap(err, "creating the layer registry");
        root = realpath(dir, NULL);
    }
    if (root == NULL)
        return dsec_err_set(err, DSEC_E_IO, errno, "layer registry at %s", dir);
    dirreg *g = dsec_calloc(1, sizeof *g);
    char *r2 = dsec_strdup(root);
    free(root); /* realpath's buffer comes from libc */
    if (g == NULL || r2 == NULL) {
        dsec_free(g);
        dsec_free(r2);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "opening the layer registry at %s", dir);
    }
    g->root = r2;
    g->shared = shared;
    static const char *const subs[] = {"blobs/sha256", "tags", "envs"};
    for (size_t i = 0; i < 3; i++) {
        char *p = dsec__layer_path("%s/%s", g->root, subs[i]);
        int rc = p != NULL ? dsec__layer_mkdir_p(p, 0755, err)
                           : dsec_err_set(err, DSEC_E_NOMEM, 0, "opening the layer registry");
        dsec_free(p);
        if (rc < 0) {
            dir_close(g);
            return dsec_err_wrap(err, "opening the layer registry at %s", dir);
        }
    }
    if (dsec_layer_registry_new(out, shared ? &shared_ops : &local_ops, g, err) < 0) {
        dir_close(g);
        return -1;
    }
    return 0;
}

int dsec_layer_registry_local(dsec_layer_registry **out, const char *dir, dsec_err *err)
{
    return open_dir(out, dir, false, err);
}

int dsec_layer_registry_shared(dsec_layer_registry **out, const char *dir, dsec_err *err)
{
    return open_dir(out, dir, true, err);
}
