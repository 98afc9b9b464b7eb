/* io.c - the shared I/O helpers (dsec/io.h): EINTR-safe calls, whole writes, small files,
 * running a program and capturing its output. */
#define _GNU_SOURCE
#include "dsec/io.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <spawn.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dsec/alloc.h"

extern char **environ;

ssize_t dsec_read_eintr(int fd, void *buf, size_t n)
{
    ssize_t r;
    while ((r = read(fd, buf, n)) < 0 && errno == EINTR) {
    }
    return r;
}

ssize_t dsec_write_eintr(int fd, const void *buf, size_t n)
{
    ssize_t r;
    while ((r = write(fd, buf, n)) < 0 && errno == EINTR) {
    }
    return r;
}

ssize_t dsec_pread_eintr(int fd, void *buf, size_t n, off_t off)
{
    ssize_t r;
    while ((r = pread(fd, buf, n, off)) < 0 && errno == EINTR) {
    }
    return r;
}

ssize_t dsec_pwrite_eintr(int fd, const void *buf, size_t n, off_t off)
{
    ssize_t r;
    while ((r = pwrite(fd, buf, n, off)) < 0 && errno == EINTR) {
    }
    return r;
}

pid_t dsec_waitpid_eintr(pid_t pid, int *status, int options)
{
    pid_t r;
    while ((r = waitpid(pid, status, options)) < 0 && errno == EINTR) {
    }
    return r;
}

int dsec_write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = dsec_write_eintr(fd, p, n);
        if (w < 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int dsec_pwrite_all(int fd, const void *buf, size_t n, off_t off)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = dsec_pwrite_eintr(fd, p, n, off);
        if (w < 0)
            return -1;
        p += w;
        off += w;
        n -= (size_t)w;
    }
    return 0;
}

ssize_t dsec_read_full(int fd, void *buf, size_t n)
{
    char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = dsec_read_eintr(fd, p + got, n - got);
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

int dsec_read_file(const char *path, size_t max, char **data, size_t *len, dsec_err *err)
{
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dsec_err_set(err, errno == ENOENT || errno == ENOTDIR ? DSEC_E_NOT_FOUND : DSEC_E_IO,
                            errno, "opening %s", path);
    /* start from the file's size (one read for most), grow for files that grow or lie (/proc) */
    struct stat st;
    size_t cap = fstat(fd, &st) == 0 && st.st_size > 0 && (size_t)st.st_size <= max
                     ? (size_t)st.st_size + 1
                     : (max < 4096 ? max + 1 : 4096);
    char *buf = dsec_malloc(cap + 1);
    if (buf == NULL) {
        close(fd);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "reading %s", path);
    }
    size_t n = 0;
    for (;;) {
        if (n == cap) { /* cap <= max here: a read past max has failed already */
            size_t ncap = cap * 2 > max + 1 ? max + 1 : cap * 2;
            char *nb = dsec_realloc(buf, ncap + 1);
            if (nb == NULL) {
                dsec_err_set(err, DSEC_E_NOMEM, 0, "reading %s", path);
                break;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = dsec_read_eintr(fd, buf + n, cap - n);
        if (r < 0) {
            dsec_err_set(err, DSEC_E_IO, errno, "reading %s", path);
            break;
        }
        if (r == 0) {
            close(fd);
            buf[n] = '\0';
            *data = buf;
            *len = n;
            return 0;
        }
        n += (size_t)r;
        if (n > max) {
            dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "%s is larger than %zu bytes", path, max);
            break;
        }
    }
    close(fd);
    dsec_free(buf);
    return -1;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP)
        return rmdir(path) < 0 && errno != ENOENT ? -1 : 0;
    return unlink(path) < 0 && errno != ENOENT ? -1 : 0;
}

int dsec_rm_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode))
        return unlink(path) < 0 && errno != ENOENT ? -1 : 0;
    return nftw(path, rm_one, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0 ? -1 : 0;
}

size_t dsec_drain_into(int fd, char *out, size_t outlen)
{
    size_t got = 0;
    char sink[4096];
    for (;;) {
        bool keep = out != NULL && got + 1 < outlen;
        ssize_t r =
            dsec_read_eintr(fd, keep ? out + got : sink, keep ? outlen - 1 - got : sizeof sink);
        if (r <= 0)
            break;
        if (keep)
            got += (size_t)r;
    }
    if (out != NULL && outlen > 0)
        out[got] = '\0';
    return got;
}

int dsec_run_capture(const char *const *argv, const char *in, char *out, size_t outlen,
                     dsec_err *err)
{
    int p[2], q[2] = {-1, -1};
    if (in != NULL) {
        /* small enough for the pipe's buffer: written before the program starts */
        size_t inlen = strlen(in);
        if (inlen > 4096 || pipe2(q, O_CLOEXEC) < 0)
            return dsec_err_set(err, DSEC_E_IO, errno, "stdin for %s", argv[0]);
        int w = dsec_write_all(q[1], in, inlen);
        close(q[1]);
        if (w < 0) {
            close(q[0]);
            return dsec_err_set(err, DSEC_E_IO, errno, "stdin for %s", argv[0]);
        }
    }
    if (pipe2(p, O_CLOEXEC) < 0) {
        if (q[0] >= 0)
            close(q[0]);
        return dsec_err_set(err, DSEC_E_IO, errno, "running %s", argv[0]);
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (q[0] >= 0)
        posix_spawn_file_actions_adddup2(&fa, q[0], 0);
    else
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, p[1], 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    if (q[0] >= 0)
        close(q[0]);
    if (rc != 0) {
        close(p[0]);
        return dsec_err_set(err, DSEC_E_CONFIG, rc, "cannot run %s: %s", argv[0], strerror(rc));
    }
    dsec_drain_into(p[0], out, outlen);
    close(p[0]);
    int st;
    if (dsec_waitpid_eintr(pid, &st, 0) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "waiting for %s", argv[0]);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
