/* layer-util.c - small file and process helpers for the layer registry, builder and cache. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/layers/layer-int.h"
#include "dsec/alloc.h"
#include "dsec/io.h"

extern char **environ;

char *dsec__layer_path(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *tmp = NULL;
    int n = vasprintf(&tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *s = dsec_strdup(tmp);
    free(tmp); /* vasprintf's buffer comes from libc */
    return s;
}

int dsec__layer_run(const char *const *argv, int in_fd, int out_fd, dsec_err *err)
{
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "running %s: pipe", argv[0]);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (in_fd >= 0)
        posix_spawn_file_actions_adddup2(&fa, in_fd, 0);
    else
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (out_fd >= 0)
        posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
    else
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(pipefd[1]);
    if (rc != 0) {
        close(pipefd[0]);
        return dsec_err_set(err, DSEC_E_IO, rc, "running %s", argv[0]);
    }
    /* keep the tail of stderr: that is where tools say what went wrong */
    char tail[160];
    size_t used = 0;
    char buf[4096];
    for (;;) {
        ssize_t n = dsec_read_eintr(pipefd[0], buf, sizeof buf);
        if (n <= 0)
            break;
        for (ssize_t i = 0; i < n; i++) {
            if (used == sizeof tail - 1) {
                memmove(tail, tail + 1, used - 1);
                used--;
            }
            tail[used++] = buf[i] == '\n' ? ' ' : buf[i];
        }
    }
    close(pipefd[0]);
    tail[used] = '\0';
    int status;
    if (dsec_waitpid_eintr(pid, &status, 0) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "waiting for %s", argv[0]);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (WIFEXITED(status))
        return dsec_err_set(err, DSEC_E_IO, 0, "%s exited with status %d: %s", argv[0],
                            WEXITSTATUS(status), tail);
    return dsec_err_set(err, DSEC_E_IO, 0, "%s killed by signal %d: %s", argv[0], WTERMSIG(status),
                        tail);
}

int dsec__layer_mkdir_p(const char *path, mode_t mode, dsec_err *err)
{
    char *p = dsec_strdup(path);
    if (p == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "creating %s", path);
    for (char *s = p + 1;; s++) {
        char c = *s;
        if (c != '/' && c != '\0')
            continue;
        *s = '\0';
        if (mkdir(p, mode) < 0 && errno != EEXIST) {
            int e = errno;
            dsec_err_set(err, DSEC_E_IO, e, "creating directory %s", p);
            dsec_free(p);
            return -1;
        }
        *s = c;
        if (c == '\0')
            break;
    }
    struct stat st;
    if (stat(p, &st) < 0 || !S_ISDIR(st.st_mode)) {
        dsec_err_set(err, DSEC_E_EXISTS, stat(p, &st) < 0 ? errno : ENOTDIR,
                     "%s exists and is not a directory", p);
        dsec_free(p);
        return -1;
    }
    dsec_free(p);
    return 0;
}

int dsec__layer_rm_rf(const char *path, dsec_err *err)
{
    if (dsec_rm_tree(path) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "removing %s", path);
    return 0;
}

static unsigned long long tree_total;
static int count_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)path;
    (void)flag;
    (void)ftw;
    __atomic_add_fetch(&tree_total, (unsigned long long)st->st_blocks * 512u, __ATOMIC_RELAXED);
    return 0;
}

unsigned long long dsec__layer_tree_bytes(const char *path)
{
    /* nftw has no user pointer: serialise the (rare, post-unpack) walks */
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    tree_total = 0;
    nftw(path, count_one, 32, FTW_PHYS | FTW_MOUNT);
    unsigned long long t = tree_total;
    pthread_mutex_unlock(&mu);
    return t;
}

static int fsync_dir_of(const char *path)
{
    char *d = dsec_strdup(path);
    if (d == NULL)
        return -1;
    int fd = open(dirname(d), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    dsec_free(d);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int dsec__layer_write_atomic(const char *path, const void *data, size_t len, dsec_err *err)
{
    /* '#' is in no name or digest, so listings never mistake a temp file for an entry */
    char *d = dsec_strdup(path);
    char *tmp = d != NULL ? dsec__layer_path("%s/#tmp.XXXXXX", dirname(d)) : NULL;
    dsec_free(d);
    if (tmp == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "writing %s", path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "creating a temp file beside %s", path);
        dsec_free(tmp);
        return -1;
    }
    if (dsec_write_all(fd, data, len) < 0 || fchmod(fd, 0644) < 0 || fsync(fd) < 0)
        goto fail;
    close(fd);
    fd = -1;
    if (rename(tmp, path) < 0)
        goto fail;
    dsec_free(tmp);
    fsync_dir_of(path);
    return 0;
fail:
    dsec_err_set(err, errno == EISDIR ? DSEC_E_EXISTS : DSEC_E_IO, errno, "writing %s", path);
    if (fd >= 0)
        close(fd);
    unlink(tmp);
    dsec_free(tmp);
    return -1;
}

void dsec__layer_sweep_scratch(const char *base, const char *prefix)
{
    DIR *d = opendir(base);
    if (d == NULL)
        return;
    size_t pl = strlen(prefix);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char *end;
        if (strncmp(de->d_name, prefix, pl) != 0)
            continue;
        long pid = strtol(de->d_name + pl, &end, 10);
        if (end == de->d_name + pl || *end != '.' || pid <= 0 || pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* alive, or not ours to judge */
        char *p = dsec__layer_path("%s/%s", base, de->d_name);
        if (p != NULL)
            dsec__layer_rm_rf(p, NULL);
        dsec_free(p);
    }
    closedir(d);
}
