/* agent-files.c - file requests (write, read, list, stat, remove, mkdir, rename), stale uploads */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/agent/agent-int.h"

/* The path field of a file request, NUL-terminated in buf; false (and an error sent) if bad. */
static bool get_path(struct conn *c, uint32_t id, dsec__agent_rd *r, const char *op,
                     char buf[DSEC__AGENT_PATH_MAX + 1])
{
    size_t len;
    const char *p = dsec__agent_get_str(r, DSEC__AGENT_PATH_MAX, &len);
    if (p == NULL) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
                               "%s: malformed request or path longer than %u bytes", op,
                               DSEC__AGENT_PATH_MAX);
        return false;
    }
    memcpy(buf, p, len);
    buf[len] = 0;
    if (buf[0] != '/') {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "%s: path \"%s\" is not absolute",
                               op, buf);
        return false;
    }
    return true;
}

/* ---- uploads' temporary files: watched, and swept when stale --------------------------- */

/* Temporary files of uploads this agent wrote (DSEC__AGENT_UPLOAD_PREFIX): a client that
 * vanished mid-transfer leaves nothing behind for longer than the stale time. */
struct upload_tmp {
    char *path;
    uint64_t touched_ns;
    struct upload_tmp *next;
};

static struct {
    struct upload_tmp *list;
    uint64_t stale_ns;
} up = {.stale_ns = (uint64_t)DSEC__AGENT_UPLOAD_STALE_S * 1000000000u};

void dsec__agent_uploads_set_stale(uint64_t stale_ns)
{
    up.stale_ns = stale_ns;
}

static bool is_upload_tmp(const char *path)
{
    const char *b = strrchr(path, '/');
    return b != NULL &&
           strncmp(b + 1, DSEC__AGENT_UPLOAD_PREFIX, sizeof DSEC__AGENT_UPLOAD_PREFIX - 1) == 0;
}

static void upload_touch(const char *path)
{
    if (!is_upload_tmp(path))
        return;
    for (struct upload_tmp *u = up.list; u; u = u->next)
        if (strcmp(u->path, path) == 0) {
            u->touched_ns = dsec__agent_now_ns();
            return;
        }
    struct upload_tmp *u = malloc(sizeof *u);
    if (u == NULL || (u->path = strdup(path)) == NULL) {
        free(u);
        return; /* unwatched: the next write tries again */
    }
    u->touched_ns = dsec__agent_now_ns();
    u->next = up.list;
    up.list = u;
}

static void upload_forget(const char *path)
{
    for (struct upload_tmp **pp = &up.list; *pp; pp = &(*pp)->next)
        if (strcmp((*pp)->path, path) == 0) {
            struct upload_tmp *u = *pp;
            *pp = u->next;
            free(u->path);
            free(u);
            return;
        }
}

void dsec__agent_uploads_sweep(void)
{
    uint64_t now = dsec__agent_now_ns();
    for (struct upload_tmp **pp = &up.list; *pp;) {
        struct upload_tmp *u = *pp;
        if (now - u->touched_ns < up.stale_ns) {
            pp = &u->next;
            continue;
        }
        if (unlink(u->path) < 0 && errno != ENOENT)
            dsec__agent_logmsg("removing the stale upload %s: %s", u->path, strerror(errno));
        else
            dsec__agent_logmsg("removed the stale upload %s", u->path);
        *pp = u->next;
        free(u->path);
        free(u);
    }
}

/* Milliseconds until the next stale upload is due (-1: none), folded into timeout_ms. */
int dsec__agent_uploads_timeout(int timeout_ms)
{
    uint64_t now = dsec__agent_now_ns(), best = 0;
    for (struct upload_tmp *u = up.list; u; u = u->next) {
        uint64_t due = u->touched_ns + up.stale_ns;
        if (best == 0 || due < best)
            best = due;
    }
    if (best == 0)
        return timeout_ms;
    uint64_t ms = best <= now ? 0 : (best - now + 999999u) / 1000000u;
    if (ms > INT_MAX)
        ms = INT_MAX;
    return timeout_ms < 0 || (int)ms < timeout_ms ? (int)ms : timeout_ms;
}

static int mkdir_parents(char *path)
{
    for (char *p = path + 1; (p = strchr(p, '/')) != NULL; p++) {
        *p = 0;
        int rc = mkdir(path, 0755);
        int e = errno;
        *p = '/';
        if (rc < 0 && e != EEXIST) {
            errno = e;
            return -1;
        }
    }
    return 0;
}

void dsec__agent_handle_fwrite(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    char path[DSEC__AGENT_PATH_MAX + 1];
    uint32_t mode = dsec__agent_get_u32(r);
    bool append = dsec__agent_get_u8(r) != 0;
    if (!get_path(c, id, r, "write", path))
        return;
    size_t len;
    const uint8_t *data = dsec__agent_get_bytes(r, DSEC__AGENT_FILE_MAX, &len);
    if (!dsec__agent_done(r)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_TOO_LARGE, 0,
                               "write \"%s\": malformed request or more than %u bytes", path,
                               DSEC__AGENT_FILE_MAX);
        return;
    }
    if (mkdir_parents(path) < 0) {
        dsec__agent_send_errno(c, id, errno, "creating the parent directories of", path);
        return;
    }
    int fd =
        open(path,
             O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | (append ? O_APPEND : O_TRUNC),
             mode ? mode & 07777 : 0644);
    if (fd < 0) {
        dsec__agent_send_errno(c, id, errno, "opening for writing", path);
        return;
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
        close(fd);
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                               "write \"%s\": not a regular file", path);
        return;
    }
    size_t off = 0;
    while (off < len) {
        ssize_t n = write(fd, data + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            close(fd);
            dsec__agent_send_errno(c, id, e, "writing", path);
            return;
        }
        off += (size_t)n;
    }
    if (mode != 0 && fchmod(fd, mode & 07777) < 0) {
        int e = errno;
        close(fd);
        dsec__agent_send_errno(c, id, e, "setting the mode of", path);
        return;
    }
    if (close(fd) < 0) {
        dsec__agent_send_errno(c, id, errno, "closing", path);
        return;
    }
    upload_touch(path);
    dsec__agent_send_ok(c, id, 0);
}

void dsec__agent_handle_fmkdir(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    char path[DSEC__AGENT_PATH_MAX + 1];
    bool parents = dsec__agent_get_u8(r) != 0;
    uint32_t mode = dsec__agent_get_u32(r);
    if (!get_path(c, id, r, "mkdir", path))
        return;
    if (!dsec__agent_done(r)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
                               "mkdir \"%s\": malformed request", path);
        return;
    }
    mode = mode ? mode & 07777 : 0755;
    if (parents && mkdir_parents(path) < 0) {
        dsec__agent_send_errno(c, id, errno, "creating the parent directories of", path);
        return;
    }
    if (mkdir(path, mode) < 0) {
        struct stat st;
        int e = errno;
        if (!(parents && e == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))) {
            dsec__agent_send_errno(c, id, e, "mkdir", path);
            return;
        }
    } else if (chmod(path, mode) < 0) { /* the umask took bits away */
        dsec__agent_send_errno(c, id, errno, "setting the mode of", path);
        return;
    }
    dsec__agent_send_ok(c, id, 0);
}

static int fsync_path(const char *path, bool dir)
{
    int fd =
        open(path, (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

void dsec__agent_handle_frename(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    char from[DSEC__AGENT_PATH_MAX + 1], to[DSEC__AGENT_PATH_MAX + 1];
    bool sync_it = dsec__agent_get_u8(r) != 0;
    if (!get_path(c, id, r, "rename", from) || !get_path(c, id, r, "rename", to))
        return;
    if (!dsec__agent_done(r)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
                               "rename \"%s\": malformed request", from);
        return;
    }
    struct stat st;
    if (sync_it && lstat(from, &st) == 0 && S_ISREG(st.st_mode) && fsync_path(from, false) < 0) {
        dsec__agent_send_errno(c, id, errno, "syncing", from);
        return;
    }
    if (rename(from, to) < 0) {
        dsec__agent_send_errno(c, id, errno, "rename", from);
        return;
    }
    upload_forget(from);
    if (sync_it) {
        char dir[DSEC__AGENT_PATH_MAX + 1];
        memcpy(dir, to, strlen(to) + 1);
        char *slash = strrchr(dir, '/');
        if (slash == dir)
            slash[1] = 0;
        else
            *slash = 0;
        if (fsync_path(dir, true) < 0) {
            dsec__agent_send_errno(c, id, errno, "syncing the directory of", to);
            return;
        }
    }
    dsec__agent_send_ok(c, id, 0);
}

void dsec__agent_handle_fread(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    char path[DSEC__AGENT_PATH_MAX + 1];
    uint64_t offset = dsec__agent_get_u64(r);
    uint64_t max = dsec__agent_get_u64(r);
    if (!get_path(c, id, r, "read", path))
        return;
    if (!dsec__agent_done(r)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
                               "read \"%s\": malformed request", path);
        return;
    }
    /* O_NONBLOCK: a FIFO must not stall the agent (it is refused below). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        dsec__agent_send_errno(c, id, errno, "opening for reading", path);
        return;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        dsec__agent_send_errno(c, id, errno, "stat", path);
        close(fd);
        return;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        if (S_ISDIR(st.st_mode))
            dsec__agent_send_errno(c, id, EISDIR, "read", path);
        else
            dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                                   "read \"%s\": not a regular file", path);
        return;
    }
    uint64_t want = max == 0 || max > DSEC__AGENT_FILE_MAX ? DSEC__AGENT_FILE_MAX : max;
    uint64_t size = (uint64_t)st.st_size;
    /* Files of /proc say size 0 yet have content: read those until EOF. */
    size_t alloc = size > 0
                       ? (size_t)(offset < size ? (size - offset < want ? size - offset : want) : 0)
                       : (size_t)(want < 65536 ? want : 65536);
    size_t plen_fixed = 8 + 1 + 4;
    uint8_t *p0 = dsec__agent_conn_reserve(c, DSEC__AGENT_HDR + plen_fixed + alloc);
    size_t got = 0;
    bool eof = false;
    for (;;) {
        if (got == alloc) {
            if (got >= want || size > 0) /* a regular file may have grown: the next call sees it */
                break;
            alloc = alloc * 2 > want ? (size_t)want : alloc * 2;
            p0 = dsec__agent_conn_reserve_keep(c, DSEC__AGENT_HDR + plen_fixed + alloc,
                                               DSEC__AGENT_HDR + plen_fixed + got);
        }
        ssize_t n =
            pread(fd, p0 + DSEC__AGENT_HDR + plen_fixed + got, alloc - got, (off_t)(offset + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            close(fd);
            dsec__agent_send_errno(c, id, e, "reading", path);
            return;
        }
        if (n == 0) {
            eof = true;
            break;
        }
        got += (size_t)n;
    }
    close(fd);
    if (size > 0 && offset + got >= size)
        eof = true;
    if (eof && offset + got > size)
        size = offset + got;
    uint8_t *p = p0;
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_DATA, id, plen_fixed + got);
    p = dsec__agent_put_u64(p, size);
    p = dsec__agent_put_u8(p, eof);
    p = dsec__agent_put_u32(p, (uint32_t)got);
    dsec__agent_conn_commit(c, (size_t)(p - p0) + got);
}

struct entry {
    char *name;
    uint8_t kind;
    uint64_t size;
    uint32_t mode;
    int64_t mtime;
};

static void entry_fill(struct entry *e, const struct stat *st)
{
    e->kind = S_ISREG(st->st_mode) ? 1 : S_ISDIR(st->st_mode) ? 2 : S_ISLNK(st->st_mode) ? 3 : 4;
    e->size = S_ISREG(st->st_mode) || S_ISLNK(st->st_mode) ? (uint64_t)st->st_size : 0;
    e->mode = st->st_mode & 07777;
    e->mtime = (int64_t)st->st_mtime;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s && s[1] ? s + 1 : path;
}

static void send_entries(struct conn *c, uint32_t id, struct entry *v, size_t n, const char *path)
{
    size_t plen = 4;
    for (size_t i = 0; i < n; i++)
        plen += 4 + strlen(v[i].name) + 1 + 8 + 4 + 8;
    if (n > DSEC__AGENT_LIST_MAX || plen + 5 > DSEC__AGENT_FRAME_MAX) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_TOO_LARGE, 0,
                               "list \"%s\": %zu entries, more than one answer holds (%u)", path, n,
                               DSEC__AGENT_LIST_MAX);
        return;
    }
    uint8_t *p0 = dsec__agent_conn_reserve(c, DSEC__AGENT_HDR + plen), *p = p0;
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_ENTRIES, id, plen);
    p = dsec__agent_put_u32(p, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        p = dsec__agent_put_bytes(p, v[i].name, strlen(v[i].name));
        p = dsec__agent_put_u8(p, v[i].kind);
        p = dsec__agent_put_u64(p, v[i].size);
        p = dsec__agent_put_u32(p, v[i].mode);
        p = dsec__agent_put_u64(p, (uint64_t)v[i].mtime);
    }
    dsec__agent_conn_commit(c, (size_t)(p - p0));
}

void dsec__agent_handle_fstat(struct conn *c, uint32_t id, dsec__agent_rd *r, bool list)
{
    const char *op = list ? "list" : "stat";
    char path[DSEC__AGENT_PATH_MAX + 1];
    if (!get_path(c, id, r, op, path))
        return;
    if (!dsec__agent_done(r)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "%s \"%s\": malformed request",
                               op, path);
        return;
    }
    struct stat st;
    /* A listing follows a symlink to a directory, as ls does; stat describes the link. */
    if ((list ? stat(path, &st) : lstat(path, &st)) < 0) {
        dsec__agent_send_errno(c, id, errno, op, path);
        return;
    }
    if (!list || !S_ISDIR(st.st_mode)) {
        if (list && lstat(path, &st) < 0) {
            dsec__agent_send_errno(c, id, errno, op, path);
            return;
        }
        struct entry e = {.name = (char *)base_name(path)};
        entry_fill(&e, &st);
        send_entries(c, id, &e, 1, path);
        return;
    }
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
    if (d == NULL) {
        dsec__agent_send_errno(c, id, errno, "opening directory", path);
        if (dfd >= 0)
            close(dfd);
        return;
    }
    struct entry *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        struct stat es;
        if (fstatat(dfd, de->d_name, &es, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* removed meanwhile */
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            v = dsec__agent_xrealloc(v, cap * sizeof *v);
        }
        v[n].name = dsec__agent_xstrndup(de->d_name, strlen(de->d_name));
        entry_fill(&v[n], &es);
        n++;
        if (n > DSEC__AGENT_LIST_MAX)
            break;
    }
    closedir(d);
    if (n > 1)
        qsort(v, n, sizeof *v, entry_cmp);
    send_entries(c, id, v, n, path);
    for (size_t i = 0; i < n; i++)
        free(v[i].name);
    free(v);
}

/* Remove name under dirfd and, for a directory, all it holds; symlinks are never followed. */
int dsec__agent_remove_tree(int dirfd, const char *name)
{
    if (unlinkat(dirfd, name, 0) == 0)
        return 0;
    if (errno != EISDIR && errno != EPERM)
        return -1;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        close(fd);
        return -1;
    }
    /* Entries removed while readdir runs may make it skip others: a few passes settle it. */
    int rc = 0;
    for (int pass = 0; pass < 4 && rc == 0; pass++) {
        struct dirent *de;
        bool any = false;
        rewinddir(d);
        while (rc == 0 && (de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            any = true;
            rc = dsec__agent_remove_tree(fd, de->d_name);
        }
        if (!any)
            break;
    }
    int e = errno;
    closedir(d);
    if (rc < 0) {
        errno = e;
        return -1;
    }
    return unlinkat(dirfd, name, AT_REMOVEDIR);
}

void dsec__agent_handle_fremove(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    char path[DSEC__AGENT_PATH_MAX + 1];
    bool recursive = dsec__agent_get_u8(r) != 0;
    if (!get_path(c, id, r, "remove", path))
        return;
    if (!dsec__agent_done(r)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
                               "remove \"%s\": malformed request", path);
        return;
    }
    if (path[strspn(path, "/")] == 0) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                               "remove \"%s\": refusing to remove /", path);
        return;
    }
    struct stat st;
    if (lstat(path, &st) < 0) {
        dsec__agent_send_errno(c, id, errno, "remove", path);
        return;
    }
    int rc;
    if (!S_ISDIR(st.st_mode))
        rc = unlink(path);
    else if (!recursive)
        rc = rmdir(path);
    else
        rc = dsec__agent_remove_tree(AT_FDCWD, path);
    if (rc < 0) {
        int e = errno;
        if (e == ENOTEMPTY || e == EEXIST)
            dsec__agent_send_error(c, id, DSEC__AGENT_ERR_IO, ENOTEMPTY,
                                   "remove \"%s\": directory not empty (remove it recursively)",
                                   path);
        else
            dsec__agent_send_errno(c, id, e, "remove", path);
        return;
    }
    upload_forget(path);
    dsec__agent_send_ok(c, id, 0);
}
