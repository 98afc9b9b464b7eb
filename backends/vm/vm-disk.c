/* vm-disk.c - disks of the VM backend: EROFS images of layers (made once per node), the writable
 * ext4 disk of a sandbox, and sparse (or reflinked) copies. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/vm/vm-int.h"
#include "dsec/alloc.h"
#include "dsec/io.h"

/* Trim trailing space and turn newlines into "; " so a tool's output reads in one line. */
static void one_line(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == ' '))
        s[--n] = '\0';
    for (char *c = s; *c; c++)
        if (*c == '\n')
            *c = ';';
}

/* ---- layer images ---------------------------------------------------------------------------- */

static bool building(struct vm_backend *be, const char *digest)
{
    for (size_t i = 0; i < be->nbuilding; i++)
        if (strcmp(be->building[i], digest) == 0)
            return true;
    return false;
}

/* The image's digest, from the file beside it (or hashed and written there). */
static int image_digest(const char *path, dsec_digest image, dsec_err *err)
{
    char side[PATH_MAX + 176];
    dsec__vm_fmt(side, sizeof side, "%s.sha256", path);
    char *d = dsec_sbx_read_file(side, sizeof(dsec_digest) + 8);
    if (d != NULL) {
        d[strcspn(d, "\n")] = '\0';
        bool ok = dsec_digest_valid(d);
        if (ok)
            dsec__vm_fmt(image, sizeof(dsec_digest), "%s", d);
        dsec_free(d);
        if (ok)
            return 0;
    }
    if (dsec_digest_file(path, image, err) < 0)
        return dsec_err_wrap(err, "hashing %s", path);
    FILE *f = fopen(side, "we");
    if (f != NULL) {
        fprintf(f, "%s\n", image);
        fclose(f);
    }
    return 0;
}

static int build_image(struct vm_backend *be, const char *digest, const char *dir, const char *path,
                       dsec_digest image, dsec_err *err)
{
    char tmp[PATH_MAX + 160], side[PATH_MAX + 176];
    dsec__vm_fmt(tmp, sizeof tmp, "%s.tmp", path);
    dsec__vm_fmt(side, sizeof side, "%s.sha256", path);
    unlink(tmp);
    /* reproducible (sorted, fixed times and UUID) and uncompressed: one image serves every
     * sandbox of the node, and a snapshot's guest finds the same bytes on any other node */
    if (dsec_layer_build(dir, DSEC_LAYER_EROFS, NULL, 0, tmp, image, err) < 0) {
        unlink(tmp);
        return dsec_err_wrap(err, "%s: making the EROFS image of layer %s", be->type, digest);
    }
    FILE *f = fopen(side, "we");
    if (f == NULL || fprintf(f, "%s\n", image) < 0 || fclose(f) != 0) {
        int e = errno;
        unlink(tmp);
        return dsec_err_set(err, DSEC_E_IO, e, "%s: writing %s", be->type, side);
    }
    if (rename(tmp, path) < 0) {
        int e = errno;
        unlink(tmp);
        return dsec_err_set(err, DSEC_E_IO, e, "%s: renaming %s", be->type, tmp);
    }
    return 0;
}

int dsec__vm_image(struct vm_backend *be, const char *digest, const char *dir, char *out,
                   size_t len, dsec_digest image, dsec_err *err)
{
    dsec__vm_fmt(out, len, "%s/%s.erofs", be->images, digest);
    pthread_mutex_lock(&be->lock);
    for (;;) {
        if (!building(be, digest) && access(out, F_OK) == 0) {
            pthread_mutex_unlock(&be->lock);
            return image_digest(out, image, err);
        }
        if (!building(be, digest))
            break;
        pthread_cond_wait(&be->built, &be->lock);
    }
    char **nb = dsec_realloc(be->building, (be->nbuilding + 1) * sizeof *nb);
    char *d = dsec_strdup(digest);
    if (nb != NULL)
        be->building = nb;
    if (nb == NULL || d == NULL) {
        pthread_mutex_unlock(&be->lock);
        dsec_free(d);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: image list", be->type);
    }
    be->building[be->nbuilding++] = d;
    pthread_mutex_unlock(&be->lock);

    int rc = build_image(be, digest, dir, out, image, err);

    pthread_mutex_lock(&be->lock);
    for (size_t i = 0; i < be->nbuilding; i++)
        if (be->building[i] == d) {
            be->building[i] = be->building[--be->nbuilding];
            break;
        }
    pthread_cond_broadcast(&be->built);
    pthread_mutex_unlock(&be->lock);
    dsec_free(d);
    return rc;
}

void dsec__vm_images_gc(struct vm_backend *be)
{
    if (be->cache == NULL)
        return;
    /* under the lock a dsec__vm_image of the same layer waits: it holds the layer first, so
     * either the cache has it here (kept) or the image is made again after */
    pthread_mutex_lock(&be->lock);
    DIR *d = opendir(be->images);
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        dsec_digest digest;
        if (l <= 6 || l - 6 >= sizeof digest || strcmp(e->d_name + l - 6, ".erofs") != 0)
            continue;
        memcpy(digest, e->d_name, l - 6);
        digest[l - 6] = '\0';
        if (!dsec_digest_valid(digest) || building(be, digest) ||
            dsec_layer_cache_has(be->cache, digest))
            continue;
        char path[PATH_MAX + 128], side[PATH_MAX + 160];
        dsec__vm_fmt(path, sizeof path, "%s/%s", be->images, e->d_name);
        if (dsec__vm_qemu_uses(path))
            continue;
        dsec__vm_fmt(side, sizeof side, "%s.sha256", e->d_name);
        unlinkat(dirfd(d), e->d_name, 0);
        unlinkat(dirfd(d), side, 0);
    }
    if (d != NULL)
        closedir(d);
    pthread_mutex_unlock(&be->lock);
}

/* ---- the writable disk ------------------------------------------------------------------------
 */

static int put_file(const char *path, const char *data, dsec_err *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "creating %s", path);
    if (dsec_write_all(fd, data, strlen(data)) < 0) {
        int e = errno;
        close(fd);
        return dsec_err_set(err, DSEC_E_IO, e, "writing %s", path);
    }
    if (close(fd) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "writing %s", path);
    return 0;
}

int dsec__vm_disk_make(const dsec_sandbox *sb, const char *conf, const char *envfile, dsec_err *err)
{
    char seed[PATH_MAX + 32], p[PATH_MAX + 64], img[PATH_MAX + 16];
    dsec__vm_fmt(seed, sizeof seed, "%s/seed", sb->dir);
    dsec__vm_fmt(img, sizeof img, "%s/disk.img", sb->dir);
    dsec__vm_rmtree(seed);
    int rc = -1;
    if (mkdir(seed, 0755) < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "creating %s", seed);
        goto out;
    }
    static const char *const sub[] = {"dsec", "upper", "work"};
    for (size_t i = 0; i < 3; i++) {
        dsec__vm_fmt(p, sizeof p, "%s/%s", seed, sub[i]);
        if (mkdir(p, 0755) < 0) {
            dsec_err_set(err, DSEC_E_IO, errno, "creating %s", p);
            goto out;
        }
    }
    dsec__vm_fmt(p, sizeof p, "%s/dsec/conf", seed);
    if (put_file(p, conf, err) < 0)
        goto out;
    dsec__vm_fmt(p, sizeof p, "%s/dsec/env", seed);
    if (put_file(p, envfile, err) < 0)
        goto out;
    /* sparse: only what the guest writes takes room on the node */
    int fd = open(img, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)(sb->disk_mb << 20)) < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "creating %s", img);
        if (fd >= 0)
            close(fd);
        goto out;
    }
    close(fd);
    const char *argv[] = {
        "mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1",
        "-d",        seed, img,  NULL};
    char out[1024];
    int st = dsec_run_capture(argv, NULL, out, sizeof out, err);
    if (st < 0) {
        dsec_err_wrap(err, "making the sandbox's disk (apt-get install e2fsprogs)");
        goto out;
    }
    if (st != 0) {
        one_line(out);
        dsec_err_set(err, DSEC_E_BACKEND, 0, "mkfs.ext4 of %s failed (status %d): %.300s", img, st,
                     out);
        goto out;
    }
    rc = 0;
out:
    dsec__vm_rmtree(seed);
    return rc;
}

/* ---- copies ------------------------------------------------------------------------------------
 */

static int copy_range(int in, int out, off_t off, off_t end)
{
    while (off < end) {
        loff_t a = off, b = off;
        ssize_t n = copy_file_range(in, &a, out, &b, (size_t)(end - off), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 &&
            (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL)) {
            char buf[1 << 16];
            size_t want = (size_t)(end - off) < sizeof buf ? (size_t)(end - off) : sizeof buf;
            n = pread(in, buf, want, off);
            if (n > 0 && pwrite(out, buf, (size_t)n, off) != n)
                return -1;
        }
        if (n <= 0)
            return n == 0 ? (errno = EIO, -1) : -1;
        off += n;
    }
    return 0;
}

int dsec__vm_copy_sparse(const char *src, const char *dst, dsec_err *err)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "opening %s", src);
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    struct stat st;
    if (out < 0 || fstat(in, &st) < 0) {
        int e = errno;
        close(in);
        if (out >= 0)
            close(out);
        return dsec_err_set(err, DSEC_E_IO, e, "copying %s to %s", src, dst);
    }
    int rc = 0;
    if (ioctl(out, FICLONE, in) == 0)
        goto done;
    if (ftruncate(out, st.st_size) < 0) {
        rc = -1;
        goto done;
    }
    off_t off = 0;
    while (off < st.st_size) {
        off_t data = lseek(in, off, SEEK_DATA);
        if (data < 0) {
            if (errno != ENXIO)
                rc = -1;
            break;
        }
        off_t hole = lseek(in, data, SEEK_HOLE);
        if (hole < 0)
            hole = st.st_size;
        if (copy_range(in, out, data, hole) < 0) {
            rc = -1;
            break;
        }
        off = hole;
    }
done:;
    int e = errno;
    close(in);
    if (close(out) < 0 && rc == 0) {
        rc = -1;
        e = errno;
    }
    if (rc < 0) {
        unlink(dst);
        return dsec_err_set(err, e == ENOSPC ? DSEC_E_CAPACITY : DSEC_E_IO, e, "copying %s to %s",
                            src, dst);
    }
    return 0;
}

uint64_t dsec__vm_allocated(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_blocks * 512u : 0;
}

int dsec__vm_rmtree(const char *path)
{
    return dsec_rm_tree(path);
}
