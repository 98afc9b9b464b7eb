/* image-extract.c - reading image blobs and unpacking layer tars safely (whiteouts, no escapes). */
#define _GNU_SOURCE
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "backends/layers/image-int.h"
#include "dsec/alloc.h"
#include "dsec/io.h"
#include "dsec/sha256.h"

/*
 * Every path is resolved with openat2 under the directory being filled:
 * RESOLVE_IN_ROOT keeps a blob lookup inside the image, and for layer
 * entries RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH refuses a parent that is a
 * symlink: an entry "etc/x" after "etc -> /host/etc" is an attack, not a
 * layout. Symlinks themselves are made as they are (absolute targets
 * included: they resolve inside the sandbox's own root at run time).
 */

#define BUF_SIZE (1 << 20)

static int openat2_(int dirfd, const char *path, int flags, uint64_t resolve)
{
    struct open_how how = {.flags = (uint64_t)flags, .mode = 0, .resolve = resolve};
    return (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
}

int dsec__image_open_in(int root_fd, const char *rel, const char *what, dsec_err *err)
{
    while (rel[0] == '/')
        rel++;
    /* non-blocking: a FIFO planted as a blob must fail, not hang the import */
    int fd = openat2_(root_fd, rel, O_RDONLY | O_CLOEXEC | O_NONBLOCK,
                      RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS);
    if (fd < 0)
        return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "%s: cannot open %s", what, rel);
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || fcntl(fd, F_SETFL, 0) < 0) {
        close(fd);
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: %s is not a regular file", what, rel);
    }
    return fd;
}

/* ---- blobs: hash compressed and uncompressed as they go ---------------------------------- */

typedef struct hashed_in {
    int fd;
    dsec_sha256 sha;
    uint64_t n;
    char *buf;
} hashed_in;

static la_ssize_t hashed_read(struct archive *a, void *arg, const void **out)
{
    hashed_in *h = arg;
    for (;;) {
        ssize_t n = dsec_read_eintr(h->fd, h->buf, BUF_SIZE);
        if (n < 0) {
            archive_set_error(a, errno, "read failed");
            return -1;
        }
        dsec_sha256_update(&h->sha, h->buf, (size_t)n);
        h->n += (uint64_t)n;
        *out = h->buf;
        return n;
    }
}

int dsec__image_unpack_blob(int fd, const char *tar_out, dsec_digest blob, dsec_digest diff_id,
                            uint64_t *blob_size, dsec_err *err)
{
    hashed_in h = {.fd = fd, .buf = dsec_malloc(BUF_SIZE)};
    struct archive *a = archive_read_new();
    int out = -1, rc = -1;
    dsec_sha256 tar_sha;
    dsec_sha256_init(&tar_sha);
    dsec_sha256_init(&h.sha);
    if (h.buf == NULL || a == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "reading a layer blob");
        goto out;
    }
    archive_read_support_filter_gzip(a);
    archive_read_support_filter_zstd(a);
    archive_read_support_format_raw(a);
    struct archive_entry *e;
    if (archive_read_open(a, &h, NULL, hashed_read, NULL) != ARCHIVE_OK ||
        archive_read_next_header(a, &e) != ARCHIVE_OK) {
        dsec_err_set(err, DSEC_E_DECODE, 0, "layer blob is not a plain, gzip or zstd stream: %s",
                     archive_error_string(a) ? archive_error_string(a) : "empty");
        goto out;
    }
    out = open(tar_out, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "creating %s", tar_out);
        goto out;
    }
    char *ubuf = dsec_malloc(BUF_SIZE);
    if (ubuf == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "reading a layer blob");
        goto out;
    }
    for (;;) {
        la_ssize_t n = archive_read_data(a, ubuf, BUF_SIZE);
        if (n < 0) {
            dsec_err_set(err, DSEC_E_DECODE, 0, "layer blob is corrupt or truncated: %s",
                         archive_error_string(a) ? archive_error_string(a) : "read error");
            dsec_free(ubuf);
            goto out;
        }
        if (n == 0)
            break;
        dsec_sha256_update(&tar_sha, ubuf, (size_t)n);
        if (dsec_write_all(out, ubuf, (size_t)n) < 0) {
            dsec_err_set(err, DSEC_E_IO, errno, "writing %s", tar_out);
            dsec_free(ubuf);
            goto out;
        }
    }
    dsec_free(ubuf);
    /* the decompressor may stop before the blob's end: hash the rest too */
    for (;;) {
        const void *p;
        la_ssize_t n = hashed_read(a, &h, &p);
        if (n < 0) {
            dsec_err_set(err, DSEC_E_IO, errno, "reading a layer blob");
            goto out;
        }
        if (n == 0)
            break;
    }
    uint8_t raw[DSEC_SHA256_LEN];
    dsec_sha256_final(&h.sha, raw);
    dsec_digest_from_raw(raw, blob);
    dsec_sha256_final(&tar_sha, raw);
    dsec_digest_from_raw(raw, diff_id);
    *blob_size = h.n;
    if (close(out) < 0) {
        out = -1;
        dsec_err_set(err, DSEC_E_IO, errno, "writing %s", tar_out);
        goto out;
    }
    out = -1;
    rc = 0;
out:
    if (out >= 0)
        close(out);
    if (rc < 0)
        unlink(tar_out);
    if (a != NULL)
        archive_read_free(a);
    dsec_free(h.buf);
    return rc;
}

/* ---- layer entries ------------------------------------------------------------------------ */

/* Strip "./" and refuse what cannot be a path inside the layer; NULL with err. */
static char *clean_path(const char *p, const char *what, dsec_err *err)
{
    if (p == NULL || p[0] == '\0') {
        dsec_err_set(err, DSEC_E_INVALID, 0, "%s: an entry has no name", what);
        return NULL;
    }
    if (p[0] == '/') {
        dsec_err_set(err, DSEC_E_INVALID, 0, "entry \"%.200s\": an absolute path", p);
        return NULL;
    }
    while (p[0] == '.' && p[1] == '/')
        p += 2;
    char *c = dsec_strdup(p);
    if (c == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "%s", what);
        return NULL;
    }
    size_t n = strlen(c);
    while (n > 0 && c[n - 1] == '/')
        c[--n] = '\0';
    for (char *s = c; *s != '\0';) {
        char *slash = strchr(s, '/');
        size_t l = slash != NULL ? (size_t)(slash - s) : strlen(s);
        if (l == 2 && s[0] == '.' && s[1] == '.') {
            dsec_err_set(err, DSEC_E_INVALID, 0, "entry \"%.200s\": a \"..\" component", p);
            dsec_free(c);
            return NULL;
        }
        if (l == 0) {
            dsec_err_set(err, DSEC_E_INVALID, 0, "entry \"%.200s\": an empty component", p);
            dsec_free(c);
            return NULL;
        }
        s = slash != NULL ? slash + 1 : s + l;
    }
    return c;
}

/* The directory that will hold rel (created 0755 as needed, never through a
 * symlink); *base points into rel at the last component. */
static int open_parent(int root, char *rel, const char **base, dsec_err *err)
{
    char *slash = strrchr(rel, '/');
    *base = slash != NULL ? slash + 1 : rel;
    if (slash == NULL)
        return dup(root);
    *slash = '\0';
    int fd = dup(root);
    for (char *s = rel; fd >= 0 && s != NULL;) {
        char *next = strchr(s, '/');
        if (next != NULL)
            *next = '\0';
        int nfd = openat2_(fd, s, O_PATH | O_DIRECTORY | O_CLOEXEC,
                           RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
        if (nfd < 0 && errno == ENOENT && mkdirat(fd, s, 0755) == 0)
            nfd = openat2_(fd, s, O_PATH | O_DIRECTORY | O_CLOEXEC,
                           RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
        int e = errno;
        close(fd);
        fd = nfd;
        if (next != NULL)
            *next = '/';
        if (fd < 0) {
            *slash = '/';
            return dsec_err_set(
                err, DSEC_E_INVALID, e,
                e == ELOOP || e == ENOTDIR || e == EXDEV
                    ? "entry \"%.200s\": written through a symlink or a non-directory"
                    : "entry \"%.200s\": cannot open its directory",
                rel);
        }
        s = next != NULL ? next + 1 : NULL;
    }
    *slash = '/';
    return fd;
}

/* Remove what an earlier entry of the layer left at base (a later entry wins). */
static void clear_slot(int dfd, const char *base, bool keep_dir)
{
    struct stat st;
    if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return;
    if (S_ISDIR(st.st_mode)) {
        if (!keep_dir)
            unlinkat(dfd, base, AT_REMOVEDIR); /* a non-empty dir stays: the create then fails */
        return;
    }
    unlinkat(dfd, base, 0);
}

static int set_xattrs(int dfd, const char *base, struct archive_entry *e, const char *rel,
                      dsec_err *err)
{
    if (archive_entry_xattr_reset(e) == 0)
        return 0;
    int fd = openat(dfd, base, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "entry \"%.200s\": opening it for xattrs", rel);
    const char *name;
    const void *val;
    size_t len;
    int rc = 0;
    while (rc == 0 && archive_entry_xattr_next(e, &name, &val, &len) == ARCHIVE_OK) {
        if (strncmp(name, "trusted.overlay.", 16) == 0)
            rc = dsec_err_set(err, DSEC_E_INVALID, 0,
                              "entry \"%.200s\": carries overlay xattr %s (only whiteouts make "
                              "those)",
                              rel, name);
        else if (fsetxattr(fd, name, val, len, 0) < 0 && errno != ENOTSUP)
            rc = dsec_err_set(err, DSEC_E_IO, errno, "entry \"%.200s\": setting xattr %s", rel,
                              name);
    }
    close(fd);
    return rc;
}

/* A regular file's data. */
static int write_file(struct archive *a, int dfd, const char *base, const char *rel, char *buf,
                      dsec_err *err)
{
    int fd = openat(dfd, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "entry \"%.200s\": creating it", rel);
    int rc = 0;
    for (;;) {
        la_ssize_t n = archive_read_data(a, buf, BUF_SIZE);
        if (n < 0) {
            rc = dsec_err_set(err, DSEC_E_DECODE, 0,
                              "entry \"%.200s\": truncated or corrupt "
                              "tar: %s",
                              rel, archive_error_string(a));
            break;
        }
        if (n == 0)
            break;
        if (dsec_write_all(fd, buf, (size_t)n) < 0) {
            rc = dsec_err_set(err, DSEC_E_IO, errno, "entry \"%.200s\": writing it", rel);
            break;
        }
    }
    close(fd);
    return rc;
}

/* Paths of the layer's entries so far (hard links may name only those): a hash set, so a
 * layer of many entries and hard links is not checked in quadratic time. */
typedef struct seen {
    char **slot; /* open addressing, linear probing; NULL is empty; cap a power of two */
    size_t cap;
    size_t n; /* entries taken (repeats of a path count once) */
} seen;

static size_t seen_hash(const char *p)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return (size_t)(h ^ (h >> 29));
}

static bool seen_has(const seen *s, const char *p)
{
    for (size_t i = s->cap ? seen_hash(p) & (s->cap - 1) : 0; s->cap && s->slot[i];
         i = (i + 1) & (s->cap - 1))
        if (strcmp(s->slot[i], p) == 0)
            return true;
    return false;
}

static void seen_put(char **slot, size_t cap, char *p)
{
    size_t i = seen_hash(p) & (cap - 1);
    while (slot[i] != NULL)
        i = (i + 1) & (cap - 1);
    slot[i] = p;
}

static int seen_add(seen *s, const char *p)
{
    if (seen_has(s, p))
        return 0;
    if ((s->n + 1) * 2 > s->cap) { /* at most half full */
        size_t cap = s->cap ? s->cap * 2 : 1024;
        char **slot = dsec_calloc(cap, sizeof *slot);
        if (slot == NULL)
            return -1;
        for (size_t i = 0; i < s->cap; i++)
            if (s->slot[i] != NULL)
                seen_put(slot, cap, s->slot[i]);
        dsec_free(s->slot);
        s->slot = slot;
        s->cap = cap;
    }
    char *d = dsec_strdup(p);
    if (d == NULL)
        return -1;
    seen_put(s->slot, s->cap, d);
    s->n++;
    return 0;
}

static void seen_free(seen *s)
{
    for (size_t i = 0; i < s->cap; i++)
        dsec_free(s->slot[i]);
    dsec_free(s->slot);
}

static int make_hardlink(int root, int dfd, const char *base, const char *rel, const char *target,
                         const seen *s, dsec_err *err)
{
    char *t = clean_path(target, rel, err);
    if (t == NULL)
        return dsec_err_wrap(err, "entry \"%.200s\": hard link target", rel);
    int rc = -1;
    if (!seen_has(s, t)) {
        dsec_err_set(err, DSEC_E_INVALID, 0,
                     "entry \"%.200s\": hard link to \"%.200s\", which is not an earlier entry "
                     "of the layer",
                     rel, t);
        goto out;
    }
    const char *tbase;
    int tfd = open_parent(root, t, &tbase, err);
    if (tfd < 0)
        goto out;
    struct stat st;
    if (fstatat(tfd, tbase, &st, AT_SYMLINK_NOFOLLOW) < 0 || S_ISDIR(st.st_mode))
        dsec_err_set(err, DSEC_E_INVALID, errno,
                     "entry \"%.200s\": hard link to \"%.200s\", gone or a directory", rel, t);
    else if (clear_slot(dfd, base, false), linkat(tfd, tbase, dfd, base, 0) < 0)
        dsec_err_set(err, DSEC_E_IO, errno, "entry \"%.200s\": linking to %.200s", rel, t);
    else
        rc = 0;
    close(tfd);
out:
    dsec_free(t);
    return rc;
}

/* A ".wh." entry: an overlay whiteout (char 0/0) or the opaque xattr. */
static int make_whiteout(int dfd, const char *base, const char *rel, dsec_err *err)
{
    if (strcmp(base, ".wh..wh..opq") == 0) {
        int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        int rc = fd < 0 || fsetxattr(fd, "trusted.overlay.opaque", "y", 1, 0) < 0 ? -1 : 0;
        int e = errno;
        if (fd >= 0)
            close(fd);
        return rc == 0 ? 0
                       : dsec_err_set(err, DSEC_E_IO, e,
                                      "entry \"%.200s\": marking the "
                                      "directory opaque",
                                      rel);
    }
    const char *name = base + 4;
    if (name[0] == '\0' || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "entry \"%.200s\": a whiteout of nothing", rel);
    clear_slot(dfd, name, false);
    if (mknodat(dfd, name, S_IFCHR | 0, makedev(0, 0)) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "entry \"%.200s\": making the whiteout", rel);
    return 0;
}

/* One entry (not a whiteout) at dfd/base. */
static int make_entry(struct archive *a, struct archive_entry *e, int root, int dfd,
                      const char *base, const char *rel, const seen *s, char *buf, dsec_err *err)
{
    mode_t type = archive_entry_filetype(e);
    const char *hl = archive_entry_hardlink(e);
    int rc;
    if (hl != NULL)
        return make_hardlink(root, dfd, base, rel, hl, s, err);
    switch (type) {
    case AE_IFDIR:
        clear_slot(dfd, base, true);
        rc = mkdirat(dfd, base, 0700) < 0 && errno != EEXIST ? -1 : 0;
        break;
    case AE_IFREG:
        clear_slot(dfd, base, false);
        return write_file(a, dfd, base, rel, buf, err) < 0 ? -1 : 1;
    case AE_IFLNK:
        clear_slot(dfd, base, false);
        rc = symlinkat(archive_entry_symlink(e) ? archive_entry_symlink(e) : "", dfd, base);
        break;
    case AE_IFIFO:
        clear_slot(dfd, base, false);
        rc = mknodat(dfd, base, S_IFIFO | 0600, 0);
        break;
    case AE_IFCHR:
    case AE_IFBLK:
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "entry \"%.200s\": a %s device node (%lu:%lu); layers may not carry "
                            "devices",
                            rel, type == AE_IFCHR ? "char" : "block",
                            (unsigned long)archive_entry_rdevmajor(e),
                            (unsigned long)archive_entry_rdevminor(e));
    default:
        return dsec_err_set(err, DSEC_E_INVALID, 0, "entry \"%.200s\": unknown type 0%o", rel,
                            (unsigned)type);
    }
    if (rc < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "entry \"%.200s\": creating it", rel);
    return 1;
}

/* Owner, mode (after the owner: chown clears setuid), xattrs. */
static int set_meta(int dfd, const char *base, struct archive_entry *e, const char *rel,
                    dsec_err *err)
{
    if (fchownat(dfd, base, (uid_t)archive_entry_uid(e), (gid_t)archive_entry_gid(e),
                 AT_SYMLINK_NOFOLLOW) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "entry \"%.200s\": setting its owner", rel);
    if (archive_entry_filetype(e) == AE_IFLNK)
        return 0;
    if (fchmodat(dfd, base, archive_entry_perm(e) & 07777, 0) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "entry \"%.200s\": setting its mode", rel);
    return set_xattrs(dfd, base, e, rel, err);
}

static int extract_one(struct archive *a, struct archive_entry *e, int root, seen *s, char *buf,
                       bool outer, dsec_err *err)
{
    char *rel = clean_path(archive_entry_pathname(e), "layer", err);
    if (rel == NULL)
        return -1;
    int rc = 0;
    if (rel[0] == '\0')
        goto out; /* "./" itself */
    const char *base;
    int dfd = open_parent(root, rel, &base, err);
    if (dfd < 0) {
        rc = -1;
        goto out;
    }
    mode_t type = archive_entry_filetype(e);
    if (outer && archive_entry_hardlink(e) == NULL && type != AE_IFREG && type != AE_IFDIR &&
        type != AE_IFLNK) {
        rc = dsec_err_set(err, DSEC_E_INVALID, 0,
                          "entry \"%.200s\": not a file, directory or "
                          "symlink",
                          rel);
    } else if (!outer && strncmp(base, ".wh.", 4) == 0) {
        rc = make_whiteout(dfd, base, rel, err);
    } else if ((rc = make_entry(a, e, root, dfd, base, rel, s, buf, err)) > 0) {
        rc = outer ? 0 : set_meta(dfd, base, e, rel, err);
        if (rc == 0 && seen_add(s, rel) < 0)
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "unpacking a layer");
    }
    close(dfd);
out:
    dsec_free(rel);
    return rc;
}

static int extract(const char *tarball, const char *dir, bool outer, dsec_err *err)
{
    int root = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "opening %s", dir);
    struct archive *a = archive_read_new();
    char *buf = dsec_malloc(BUF_SIZE);
    seen s = {0};
    int rc = -1;
    if (a == NULL || buf == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "unpacking %s", tarball);
        goto out;
    }
    archive_read_support_format_tar(a);
    if (outer) {
        archive_read_support_filter_gzip(a);
        archive_read_support_filter_zstd(a);
    }
    if (archive_read_open_filename(a, tarball, BUF_SIZE) != ARCHIVE_OK) {
        dsec_err_set(err, DSEC_E_DECODE, 0, "%s is not a tar archive: %s", tarball,
                     archive_error_string(a));
        goto out;
    }
    for (;;) {
        struct archive_entry *e;
        int r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF)
            break;
        if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
            dsec_err_set(err, DSEC_E_DECODE, 0, "truncated or corrupt tar after %zu entries: %s",
                         s.n, archive_error_string(a) ? archive_error_string(a) : "bad header");
            goto out;
        }
        if (extract_one(a, e, root, &s, buf, outer, err) < 0)
            goto out;
    }
    rc = 0;
out:
    seen_free(&s);
    dsec_free(buf);
    if (a != NULL)
        archive_read_free(a);
    close(root);
    return rc;
}

int dsec__image_extract_layer(const char *tar, const char *dir, dsec_err *err)
{
    return extract(tar, dir, false, err);
}

int dsec__image_extract_outer(const char *archive, const char *dir, dsec_err *err)
{
    return extract(archive, dir, true, err);
}
