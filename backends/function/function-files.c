/* function-files.c - a function sandbox's files: a host directory that stands for /work, and the
 * sealed bundle each call copies into its own /work. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "backends/function/function-int.h"
#include "backends/function/function-proto.h"
#include "dsec/io.h"
#include "dsec/alloc.h"

/*
 * Only the backend writes these directories, from file_write, so they hold
 * regular files and directories and nothing else. Every open still resolves
 * beneath the sandbox's directory without following symlinks (openat2), so a
 * bug elsewhere cannot turn a path into a way out of it.
 */

#define PATH_MAX_LEN 4096
#define READ_MAX (64ull << 20)

static int open_beneath(int dirfd, const char *rel, int flags, mode_t mode)
{
    struct open_how how = {
        .flags = (uint64_t)(flags | O_CLOEXEC | O_NOFOLLOW),
        .mode = (flags & O_CREAT) ? mode : 0,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    return (int)syscall(SYS_openat2, dirfd, rel, &how, sizeof how);
}

/* Absolute and normal: no empty, "." or ".." component, no trailing slash. */
static int check_path(const char *path, dsec_err *err)
{
    size_t n = strnlen(path, PATH_MAX_LEN + 1);
    if (n > PATH_MAX_LEN)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "path longer than %d bytes", PATH_MAX_LEN);
    if (path[0] != '/')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "path \"%s\" is not absolute", path);
    if (n == 1)
        return 0;
    const char *c = path + 1;
    for (;;) {
        const char *slash = strchr(c, '/');
        size_t len = slash ? (size_t)(slash - c) : strlen(c);
        if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "path \"%s\" is not normal (empty, \".\" or \"..\" component, or "
                                "trailing slash)",
                                path);
        if (slash == NULL)
            return 0;
        c = slash + 1;
    }
}

/* "/work" -> ".", "/work/a/b" -> "a/b"; anything else is refused. */
static int rel_of(const char *path, const char **rel, dsec_err *err)
{
    if (check_path(path, err) < 0)
        return -1;
    if (strcmp(path, "/work") == 0) {
        *rel = ".";
        return 0;
    }
    if (strncmp(path, "/work/", 6) == 0) {
        *rel = path + 6;
        return 0;
    }
    return dsec_err_set(err, DSEC_E_INVALID, 0,
                        "function sandboxes keep their files under /work (each call starts with "
                        "a copy of them there); \"%s\" is outside",
                        path);
}

/* A stream over the directory dfd refers to, with its own descriptor. */
static DIR *opendir_at(int dfd)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL && fd >= 0)
        close(fd);
    return d;
}

/* Sum of sizes and count of regular files below dirfd. */
static int usage(int dfd, uint64_t *bytes, uint64_t *files, int depth)
{
    if (depth > 64)
        return -1;
    DIR *d = opendir_at(dfd);
    if (d == NULL)
        return -1;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (S_ISREG(st.st_mode)) {
            *bytes += (uint64_t)st.st_size;
            *files += 1;
        } else if (S_ISDIR(st.st_mode)) {
            int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0 || usage(sub, bytes, files, depth + 1) < 0)
                rc = -1;
            if (sub >= 0)
                close(sub);
        }
    }
    closedir(d);
    return rc;
}

int dsec__fn_files_open(struct fn_files *f, const char *dir, bool create, uint64_t max_bytes,
                        uint64_t max_files, dsec_err *err)
{
    memset(f, 0, sizeof *f);
    f->dirfd = f->bundle_fd = -1;
    if (create && mkdir(dir, 0700) < 0)
        return dsec_err_set(err, errno == EEXIST ? DSEC_E_EXISTS : DSEC_E_IO, errno,
                            "function: creating the sandbox's file directory %s", dir);
    f->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (f->dirfd < 0)
        return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "function: opening the sandbox's file directory %s", dir);
    if (!create && usage(f->dirfd, &f->bytes, &f->nfiles, 0) < 0) {
        close(f->dirfd);
        f->dirfd = -1;
        return dsec_err_set(err, DSEC_E_IO, errno, "function: reading %s", dir);
    }
    f->max_bytes = max_bytes;
    f->max_files = max_files;
    f->dirty = true;
    return 0;
}

void dsec__fn_files_close(struct fn_files *f)
{
    if (f->dirfd >= 0)
        close(f->dirfd);
    if (f->bundle_fd >= 0)
        close(f->bundle_fd);
    f->dirfd = f->bundle_fd = -1;
}

static int rm_tree(int dfd, int depth)
{
    if (depth > 64)
        return -1;
    DIR *d = opendir_at(dfd);
    if (d == NULL)
        return -1;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            continue;
        if (errno != EISDIR && errno != EPERM) {
            rc = -1;
            continue;
        }
        int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0 || rm_tree(sub, depth + 1) < 0)
            rc = -1;
        if (sub >= 0)
            close(sub);
        if (unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) < 0)
            rc = -1;
    }
    closedir(d);
    return rc;
}

int dsec__fn_files_remove(const char *dir, dsec_err *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0
                               : dsec_err_set(err, DSEC_E_IO, errno, "function: opening %s", dir);
    int rc = rm_tree(fd, 0);
    int e = errno;
    close(fd);
    if (rc < 0 || rmdir(dir) < 0)
        return dsec_err_set(err, DSEC_E_IO, rc < 0 ? e : errno, "function: removing %s", dir);
    return 0;
}

int dsec__fn_files_write(struct fn_files *f, const char *path, const void *data, size_t len,
                         uint32_t mode, bool append, dsec_err *err)
{
    const char *rel = NULL;
    if (rel_of(path, &rel, err) < 0)
        return -1;
    if (strcmp(rel, ".") == 0)
        return dsec_err_set(err, DSEC_E_INVALID, EISDIR, "writing %s: it is a directory", path);
    /* parents */
    char buf[PATH_MAX_LEN + 1];
    snprintf(buf, sizeof buf, "%s", rel);
    for (char *s = strchr(buf, '/'); s != NULL; s = strchr(s + 1, '/')) {
        *s = '\0';
        if (mkdirat(f->dirfd, buf, 0755) < 0 && errno != EEXIST)
            return dsec_err_set(err, DSEC_E_IO, errno, "writing %s: creating /work/%s", path, buf);
        *s = '/';
    }
    struct stat st;
    bool existed = fstatat(f->dirfd, rel, &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (existed && !S_ISREG(st.st_mode))
        return dsec_err_set(err, DSEC_E_INVALID, EISDIR, "writing %s: it is a directory", path);
    uint64_t old = existed ? (uint64_t)st.st_size : 0;
    uint64_t size = append ? old + len : len;
    if (f->bytes - old + size > f->max_bytes)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, EDQUOT,
                            "writing %s: the sandbox's files would hold %" PRIu64
                            " bytes, over its quota of %" PRIu64 " (disk_mb)",
                            path, f->bytes - old + size, f->max_bytes);
    if (!existed && f->nfiles + 1 > f->max_files)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, EDQUOT,
                            "writing %s: the sandbox already holds %" PRIu64 " files, its limit",
                            path, f->nfiles);
    int fd = open_beneath(f->dirfd, rel, O_WRONLY | O_CREAT, mode ? (mode & 0777) : 0644);
    if (fd < 0)
        return dsec_err_set(err, errno == ENOTDIR ? DSEC_E_INVALID : DSEC_E_IO, errno, "writing %s",
                            path);
    int rc = 0;
    if ((!append && ftruncate(fd, 0) < 0) ||
        dsec_pwrite_all(fd, data, len, append ? (off_t)old : 0) < 0 ||
        (mode != 0 && fchmod(fd, mode & 0777) < 0)) {
        rc = dsec_err_set(err, DSEC_E_IO, errno, "writing %s", path);
        /* what is there now is what counts */
        if (fstat(fd, &st) == 0)
            size = (uint64_t)st.st_size;
    }
    close(fd);
    f->bytes = f->bytes - old + size;
    if (!existed)
        f->nfiles++;
    f->dirty = true;
    return rc;
}

int dsec__fn_files_read(struct fn_files *f, const char *path, uint64_t offset, uint64_t max,
                        dsec_file_data *out, dsec_err *err)
{
    const char *rel = NULL;
    if (rel_of(path, &rel, err) < 0)
        return -1;
    int fd = open_beneath(f->dirfd, rel, O_RDONLY, 0);
    if (fd < 0)
        return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "reading %s", path);
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        int e = fstat(fd, &st) < 0 ? errno : EISDIR;
        close(fd);
        return dsec_err_set(err, DSEC_E_INVALID, e, "reading %s: not a regular file", path);
    }
    uint64_t size = (uint64_t)st.st_size;
    uint64_t n = offset >= size ? 0 : size - offset;
    if (max != 0 && n > max)
        n = max;
    if (n > READ_MAX)
        n = READ_MAX;
    out->size = size;
    out->eof = offset + n >= size;
    out->data = NULL;
    out->len = 0;
    if (n > 0) {
        out->data = dsec_malloc((size_t)n);
        if (out->data == NULL) {
            close(fd);
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "reading %s", path);
        }
        ssize_t r = pread(fd, out->data, (size_t)n, (off_t)offset);
        if (r < 0) {
            int e = errno;
            dsec_free(out->data);
            out->data = NULL;
            close(fd);
            return dsec_err_set(err, DSEC_E_IO, e, "reading %s", path);
        }
        out->len = (size_t)r;
        out->eof = offset + (uint64_t)r >= size;
    }
    close(fd);
    return 0;
}

static dsec_file_kind kind_of(mode_t m)
{
    return S_ISREG(m)   ? DSEC_FILE_REG
           : S_ISDIR(m) ? DSEC_FILE_DIR
           : S_ISLNK(m) ? DSEC_FILE_LINK
                        : DSEC_FILE_OTHER;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const dsec_file_entry *)a)->name, ((const dsec_file_entry *)b)->name);
}

int dsec__fn_files_list(struct fn_files *f, const char *path, dsec_file_entry **entries, size_t *n,
                        dsec_err *err)
{
    *entries = NULL;
    *n = 0;
    if (check_path(path, err) < 0)
        return -1;
    struct stat st;
    if (strcmp(path, "/") == 0) {
        dsec_file_entry *v = dsec_calloc(1, sizeof *v);
        if (v == NULL || (v[0].name = dsec_strdup("work")) == NULL) {
            dsec_free(v);
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "listing /");
        }
        fstat(f->dirfd, &st);
        v[0].kind = DSEC_FILE_DIR;
        v[0].mode = 0755;
        v[0].mtime = (int64_t)st.st_mtime;
        *entries = v;
        *n = 1;
        return 0;
    }
    const char *rel = NULL;
    if (rel_of(path, &rel, err) < 0)
        return -1;
    int fd = open_beneath(f->dirfd, rel, O_RDONLY, 0);
    if (fd < 0 || fstat(fd, &st) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return dsec_err_set(err, e == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, e, "listing %s", path);
    }
    if (!S_ISDIR(st.st_mode)) { /* like ls: a file lists as itself */
        close(fd);
        dsec_file_entry *v = dsec_calloc(1, sizeof *v);
        const char *base = strrchr(path, '/') + 1;
        if (v == NULL || (v[0].name = dsec_strdup(base)) == NULL) {
            dsec_free(v);
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "listing %s", path);
        }
        v[0].kind = kind_of(st.st_mode);
        v[0].size = (uint64_t)st.st_size;
        v[0].mode = st.st_mode & 07777;
        v[0].mtime = (int64_t)st.st_mtime;
        *entries = v;
        *n = 1;
        return 0;
    }
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        close(fd);
        return dsec_err_set(err, DSEC_E_IO, errno, "listing %s", path);
    }
    dsec_file_entry *v = NULL;
    size_t nv = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (nv == cap) {
            size_t c = cap ? cap * 2 : 16;
            dsec_file_entry *p = dsec_realloc(v, c * sizeof *p);
            if (p == NULL)
                goto out_nomem;
            v = p;
            cap = c;
        }
        if ((v[nv].name = dsec_strdup(e->d_name)) == NULL)
            goto out_nomem;
        v[nv].kind = kind_of(st.st_mode);
        v[nv].size = S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
        v[nv].mode = st.st_mode & 07777;
        v[nv].mtime = (int64_t)st.st_mtime;
        nv++;
    }
    closedir(d);
    if (nv > 1)
        qsort(v, nv, sizeof *v, entry_cmp);
    *entries = v;
    *n = nv;
    return 0;

out_nomem:
    closedir(d);
    dsec_file_entries_free(v, nv);
    return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "listing %s", path);
}

/* Count again what the directory holds, after a rename or remove changed it. */
static void recount(struct fn_files *f)
{
    uint64_t bytes = 0, files = 0;
    if (usage(f->dirfd, &bytes, &files, 0) == 0) {
        f->bytes = bytes;
        f->nfiles = files;
    }
    f->dirty = true;
}

static int fn_mkdir(struct fn_files *f, const char *path, const char *rel, uint32_t mode,
                    bool parents, dsec_err *err)
{
    mode = mode ? mode & 0777 : 0755;
    if (strcmp(rel, ".") == 0) {
        if (parents)
            return 0;
        return dsec_err_set(err, DSEC_E_EXISTS, EEXIST, "mkdir %s: it exists", path);
    }
    char buf[PATH_MAX_LEN + 1];
    snprintf(buf, sizeof buf, "%s", rel);
    if (parents)
        for (char *s = strchr(buf, '/'); s != NULL; s = strchr(s + 1, '/')) {
            *s = '\0';
            if (mkdirat(f->dirfd, buf, 0755) < 0 && errno != EEXIST)
                return dsec_err_set(err, DSEC_E_IO, errno, "mkdir %s: creating /work/%s", path,
                                    buf);
            *s = '/';
        }
    struct stat st;
    if (mkdirat(f->dirfd, rel, mode) < 0) {
        int e = errno;
        if (parents && e == EEXIST && fstatat(f->dirfd, rel, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISDIR(st.st_mode))
            return 0;
        return dsec_err_set(err,
                            e == EEXIST   ? DSEC_E_EXISTS
                            : e == ENOENT ? DSEC_E_NOT_FOUND
                                          : DSEC_E_IO,
                            e, "mkdir %s%s", path,
                            e == ENOENT ? ": its parent is missing (use parents)" : "");
    }
    int fd = open_beneath(f->dirfd, rel, O_RDONLY | O_DIRECTORY, 0);
    if (fd >= 0) {
        (void)fchmod(fd, mode); /* what the umask took away */
        close(fd);
    }
    f->dirty = true;
    return 0;
}

int dsec__fn_files_op(struct fn_files *f, const dsec_file_op *op, dsec_file_entry *out,
                      dsec_err *err)
{
    const char *rel = NULL;
    if (rel_of(op->path, &rel, err) < 0)
        return -1;
    struct stat st;
    switch (op->kind) {
    case DSEC_FOP_MKDIR:
        return fn_mkdir(f, op->path, rel, op->mode, op->parents, err);
    case DSEC_FOP_STAT: {
        if (fstatat(f->dirfd, rel, &st, AT_SYMLINK_NOFOLLOW) < 0)
            return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                                "stat %s", op->path);
        const char *base = strrchr(op->path, '/');
        out->name = dsec_strdup(base[1] ? base + 1 : "/");
        out->kind = kind_of(st.st_mode);
        out->size = (uint64_t)st.st_size;
        out->mode = st.st_mode & 07777;
        out->mtime = st.st_mtime;
        return 0;
    }
    case DSEC_FOP_RENAME: {
        const char *to = NULL;
        if (rel_of(op->to, &to, err) < 0)
            return -1;
        if (strcmp(rel, ".") == 0 || strcmp(to, ".") == 0)
            return dsec_err_set(err, DSEC_E_INVALID, EBUSY, "rename %s to %s: /work stays",
                                op->path, op->to);
        if (op->sync) {
            int fd = open_beneath(f->dirfd, rel, O_RDONLY, 0);
            if (fd >= 0) {
                int rc = fsync(fd);
                int e = errno;
                close(fd);
                if (rc < 0)
                    return dsec_err_set(err, DSEC_E_IO, e, "syncing %s", op->path);
            }
        }
        if (renameat(f->dirfd, rel, f->dirfd, to) < 0)
            return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                                "rename %s to %s", op->path, op->to);
        recount(f);
        return 0;
    }
    case DSEC_FOP_REMOVE: {
        if (strcmp(rel, ".") == 0)
            return dsec_err_set(err, DSEC_E_INVALID, EBUSY,
                                "remove /work: it stays (remove "
                                "what it holds)");
        if (fstatat(f->dirfd, rel, &st, AT_SYMLINK_NOFOLLOW) < 0)
            return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                                "remove %s", op->path);
        int rc;
        if (!S_ISDIR(st.st_mode)) {
            rc = unlinkat(f->dirfd, rel, 0);
        } else {
            rc = 0;
            if (op->recursive) {
                int sub = open_beneath(f->dirfd, rel, O_RDONLY | O_DIRECTORY, 0);
                rc = sub < 0 ? -1 : rm_tree(sub, 0);
                if (sub >= 0)
                    close(sub);
            }
            if (rc == 0)
                rc = unlinkat(f->dirfd, rel, AT_REMOVEDIR);
        }
        int e = errno;
        recount(f);
        if (rc < 0)
            return dsec_err_set(err, DSEC_E_IO, e, "remove %s%s", op->path,
                                e == ENOTEMPTY ? ": directory not empty (remove it recursively)"
                                               : "");
        return 0;
    }
    }
    return dsec_err_set(err, DSEC_E_INVALID, 0, "file op %d is unknown", (int)op->kind);
}

/* ---- the bundle ------------------------------------------------------------------------ */

static int put_rec(int out, uint8_t kind, const char *rel, uint32_t mode, uint64_t size)
{
    struct fnp_bundle_rec r = {
        .kind = kind, .path_len = (uint16_t)strlen(rel), .mode = mode, .size = size};
    struct iovec iov[2] = {{&r, sizeof r}, {(void *)rel, strlen(rel)}};
    ssize_t want = (ssize_t)(sizeof r + strlen(rel));
    return writev(out, iov, 2) == want ? 0 : -1;
}

/* Pre-order: each directory's record before what it holds. */
static int bundle_dir(int out, int dfd, char *prefix, size_t plen, int depth)
{
    if (depth > 64)
        return -1;
    DIR *d = opendir_at(dfd);
    if (d == NULL)
        return -1;
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        size_t nl = strlen(e->d_name);
        if (plen + nl + 2 > PATH_MAX_LEN) {
            rc = -1;
            break;
        }
        size_t at = plen;
        if (plen > 0)
            prefix[at++] = '/';
        memcpy(prefix + at, e->d_name, nl + 1);
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            rc = -1;
        } else if (S_ISDIR(st.st_mode)) {
            int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            rc = sub < 0 || put_rec(out, FNP_BUNDLE_DIR, prefix, st.st_mode & 0777, 0) < 0 ||
                         bundle_dir(out, sub, prefix, at + nl, depth + 1) < 0
                     ? -1
                     : 0;
            if (sub >= 0)
                close(sub);
        } else if (S_ISREG(st.st_mode)) {
            int in = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
            if (in < 0 || fstat(in, &st) < 0 ||
                put_rec(out, FNP_BUNDLE_FILE, prefix, st.st_mode & 0777, (uint64_t)st.st_size) <
                    0) {
                rc = -1;
            } else {
                off_t left = st.st_size;
                while (left > 0) {
                    ssize_t s = sendfile(out, in, NULL, (size_t)left);
                    if (s <= 0) {
                        rc = -1;
                        break;
                    }
                    left -= s;
                }
            }
            if (in >= 0)
                close(in);
        }
        prefix[plen] = '\0';
    }
    closedir(d);
    return rc;
}

int dsec__fn_files_bundle(struct fn_files *f, int *fd, uint64_t *len, dsec_err *err)
{
    if (!f->dirty) {
        *fd = f->bundle_fd;
        *len = f->bundle_len;
        return 0;
    }
    if (f->bundle_fd >= 0)
        close(f->bundle_fd);
    f->bundle_fd = -1;
    f->bundle_len = 0;
    if (f->nfiles == 0) {
        f->dirty = false;
        *fd = -1;
        *len = 0;
        return 0;
    }
    int m = memfd_create("dsec-fn-bundle", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (m < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "function: memfd for the sandbox's files");
    char prefix[PATH_MAX_LEN + 1] = "";
    struct stat st;
    if (write(m, FNP_BUNDLE_MAGIC, 4) != 4 || bundle_dir(m, f->dirfd, prefix, 0, 0) < 0 ||
        fstat(m, &st) < 0 ||
        fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0) {
        int e = errno;
        close(m);
        return dsec_err_set(err, DSEC_E_IO, e, "function: bundling the sandbox's files");
    }
    f->bundle_fd = m;
    f->bundle_len = (uint64_t)st.st_size;
    f->dirty = false;
    *fd = m;
    *len = f->bundle_len;
    return 0;
}
