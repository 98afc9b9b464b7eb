/* cp-dir.c - dsec cp -r: a directory tree into or out of a sandbox, one checked transfer per file.
 */
#define _GNU_SOURCE /* nftw's FTW_ACTIONRETVAL */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tools/cli.h"

/*
 * As `docker cp` copies a directory: PATH becomes a copy of DIR (made when missing, merged
 * into when there). Every regular file goes as its own transfer (uploads are atomic and
 * sha256-checked, downloads hashed), directories are made with their modes, and symbolic
 * links and special files are skipped and counted (a sandbox's link could point anywhere on
 * the host's side, and the reverse). The first failure stops the copy and says which file.
 */

struct up {
    dsec_client *c;
    const char *id, *root_local, *root_remote;
    unsigned files, dirs, skipped;
    uint64_t bytes;
    int rc;
};

static struct up *g_up; /* nftw has no user pointer */

static void remote_of(const struct up *u, const char *local, char *out, size_t n)
{
    const char *rel = local + strlen(u->root_local);
    snprintf(out, n, "%s%s", u->root_remote, rel);
}

static int up_one(const char *local, const struct stat *st, int type, struct FTW *ftw)
{
    (void)ftw;
    struct up *u = g_up;
    char remote[4096];
    remote_of(u, local, remote, sizeof remote);
    dsec_err err;
    if (type == FTW_D) {
        if (dsec_file_mkdir(u->c, u->id, remote, st->st_mode & 07777, true, &err) < 0) {
            dsec_err_wrap(&err, "making %s", remote);
            u->rc = dsec_cli_fail("cp -r", &err);
            return FTW_STOP;
        }
        u->dirs++;
        return FTW_CONTINUE;
    }
    if (type != FTW_F || !S_ISREG(st->st_mode)) {
        if (type == FTW_DNR || type == FTW_NS) {
            fprintf(stderr, "dsec cp -r: %s: cannot be read\n", local);
            u->rc = 1;
            return FTW_STOP;
        }
        u->skipped++; /* links, devices, sockets, FIFOs */
        return FTW_CONTINUE;
    }
    int fd = open(local, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "dsec cp -r: %s: %s\n", local, strerror(errno));
        u->rc = 1;
        return FTW_STOP;
    }
    dsec_upload_opts o = {.mode = st->st_mode & 07777};
    dsec_transfer_result res;
    int rc = dsec_file_upload_fd(u->c, u->id, remote, &o, fd, &res, &err);
    close(fd);
    if (rc < 0) {
        dsec_err_wrap(&err, "%s to %s", local, remote);
        u->rc = dsec_cli_fail("cp -r", &err);
        return FTW_STOP;
    }
    u->files++;
    u->bytes += res.size;
    return FTW_CONTINUE;
}

int dsec_cli_cp_dir_up(dsec_client *c, const char *local, const char *id, const char *path)
{
    struct stat st;
    if (stat(local, &st) < 0) {
        fprintf(stderr, "dsec cp -r: %s: %s\n", local, strerror(errno));
        return 2;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "dsec cp -r: %s is not a directory (copy a file without -r)\n", local);
        return 2;
    }
    char root[4096];
    snprintf(root, sizeof root, "%s", local);
    for (size_t n = strlen(root); n > 1 && root[n - 1] == '/'; n--)
        root[n - 1] = '\0';
    char rroot[4096];
    snprintf(rroot, sizeof rroot, "%s", path);
    for (size_t n = strlen(rroot); n > 1 && rroot[n - 1] == '/'; n--)
        rroot[n - 1] = '\0';
    struct up u = {.c = c, .id = id, .root_local = root, .root_remote = rroot};
    g_up = &u;
    if (nftw(root, up_one, 32, FTW_PHYS | FTW_ACTIONRETVAL) < 0 && u.rc == 0) {
        fprintf(stderr, "dsec cp -r: %s: %s\n", root, strerror(errno));
        return 1;
    }
    if (u.rc != 0)
        return u.rc;
    fprintf(stderr, "%u files (%" PRIu64 " bytes) and %u directories copied%s", u.files, u.bytes,
            u.dirs, u.skipped ? "" : "\n");
    if (u.skipped)
        fprintf(stderr, "; %u links or special files skipped\n", u.skipped);
    return 0;
}

struct down {
    dsec_client *c;
    const char *id;
    unsigned files, dirs, skipped;
    uint64_t bytes;
};

static int down_dir(struct down *d, const char *remote, const char *local, unsigned mode)
{
    if (mkdir(local, mode ? mode : 0755) < 0 && errno != EEXIST) {
        fprintf(stderr, "dsec cp -r: %s: %s\n", local, strerror(errno));
        return 1;
    }
    d->dirs++;
    dsec_dirent *v;
    size_t n;
    dsec_err err;
    if (dsec_file_list(d->c, d->id, remote, &v, &n, &err) < 0) {
        dsec_err_wrap(&err, "listing %s", remote);
        return dsec_cli_fail("cp -r", &err);
    }
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char r[4096], l[4096];
        snprintf(r, sizeof r, "%s%s%s", remote, strcmp(remote, "/") ? "/" : "", v[i].name);
        snprintf(l, sizeof l, "%s/%s", local, v[i].name);
        if (strcmp(v[i].kind, "dir") == 0) {
            rc = down_dir(d, r, l, (unsigned)(v[i].mode & 07777));
        } else if (strcmp(v[i].kind, "file") == 0) {
            int fd = open(l, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                          (mode_t)(v[i].mode & 07777 ? v[i].mode & 07777 : 0644));
            if (fd < 0) {
                fprintf(stderr, "dsec cp -r: %s: %s\n", l, strerror(errno));
                rc = 1;
                break;
            }
            dsec_transfer_result res;
            if (dsec_file_download_fd(d->c, d->id, r, NULL, fd, &res, &err) < 0) {
                dsec_err_wrap(&err, "%s to %s", r, l);
                rc = dsec_cli_fail("cp -r", &err);
            } else {
                d->files++;
                d->bytes += res.size;
            }
            if (close(fd) < 0 && rc == 0) {
                fprintf(stderr, "dsec cp -r: %s: %s\n", l, strerror(errno));
                rc = 1;
            }
        } else {
            d->skipped++;
        }
    }
    dsec_dirents_free(v, n);
    return rc;
}

int dsec_cli_cp_dir_down(dsec_client *c, const char *id, const char *path, const char *local)
{
    dsec_dirent st;
    dsec_err err;
    if (dsec_file_stat(c, id, path, &st, &err) < 0)
        return dsec_cli_fail("cp -r", &err);
    bool dir = strcmp(st.kind, "dir") == 0;
    unsigned mode = (unsigned)(st.mode & 07777);
    dsec_free(st.name);
    if (!dir) {
        fprintf(stderr, "dsec cp -r: %s:%s is not a directory (copy a file without -r)\n", id,
                path);
        return 2;
    }
    struct down d = {.c = c, .id = id};
    int rc = down_dir(&d, path, local, mode);
    if (rc != 0)
        return rc;
    fprintf(stderr, "%u files (%" PRIu64 " bytes) and %u directories copied%s", d.files, d.bytes,
            d.dirs, d.skipped ? "" : "\n");
    if (d.skipped)
        fprintf(stderr, "; %u links or special files skipped\n", d.skipped);
    return 0;
}
