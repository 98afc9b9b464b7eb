/* container-rootfs.c - a container's root filesystem: the btrfs upper store (subvolume per
 * sandbox, read-only snapshots for fork), the overlay mount on the layers, and tree walks. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/btrfs.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "backends/container/container-int.h"
#include "dsec/alloc.h"
#include "dsec/log.h"

static bool is_btrfs(const char *path)
{
    struct statfs s;
    return statfs(path, &s) == 0 && s.f_type == BTRFS_SUPER_MAGIC;
}

static int mkdir_p1(const char *path, dsec_err *err)
{
    if (mkdir(path, 0700) < 0 && errno != EEXIST)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", path);
    return 0;
}

/* A loop-mounted btrfs image at S/upper.img, made on first use. */
static int store_loop(struct ct_backend *be, uint64_t image_gb, char *why, size_t whylen)
{
    char img[PATH_MAX + 16], out[1024];
    dsec__ct_fmt(img, sizeof img, "%s/upper.img", be->state_dir);
    dsec_err err;
    if (access(img, F_OK) != 0) {
        int fd = open(img, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
            dsec__ct_fmt(why, whylen, "creating %s: %s", img, strerror(errno));
            return -1;
        }
        /* sparse: it costs what the sandboxes write, not its size */
        int rc = ftruncate(fd, (off_t)(image_gb << 30));
        int e = errno;
        close(fd);
        const char *mkfs[] = {"/usr/sbin/mkfs.btrfs", "-q", "-f", img, NULL};
        if (rc < 0 || access(mkfs[0], X_OK) != 0 ||
            dsec__ct_run(mkfs, out, sizeof out, &err) != 0) {
            dsec__ct_fmt(why, whylen, "%s",
                         rc < 0 ? strerror(e)
                         : access(mkfs[0], X_OK) != 0
                             ? "mkfs.btrfs is not installed (package btrfs-progs)"
                             : "mkfs.btrfs failed");
            unlink(img);
            return -1;
        }
    }
    const char *mnt[] = {"/bin/mount", "-t", "btrfs", "-o", "loop,noatime", img, be->store, NULL};
    int st = dsec__ct_run(mnt, out, sizeof out, &err);
    if (st != 0) {
        out[strcspn(out, "\n")] = '\0';
        dsec__ct_fmt(why, whylen, "mounting %s: %s", img, st < 0 ? err.msg : out);
        return -1;
    }
    return 0;
}

int dsec__ct_store_open(struct ct_backend *be, uint64_t image_gb, dsec_err *err)
{
    dsec__ct_fmt(be->store, sizeof be->store, "%s/upper", be->state_dir);
    if (mkdir_p1(be->store, err) < 0)
        return -1;
    char why[512] = "";
    if (is_btrfs(be->state_dir)) {
        be->btrfs = true;
    } else if (is_btrfs(be->store)) {
        be->btrfs = be->store_mounted = true; /* mounted by an earlier instance */
    } else if (store_loop(be, image_gb, why, sizeof why) == 0 && is_btrfs(be->store)) {
        be->btrfs = be->store_mounted = true;
    } else {
        be->btrfs = false;
        dsec_log_warn(
            "dsec container: no btrfs upper store (%s); upper layers are plain directories "
            "and fork copies them (cp -a --reflink=auto)",
            why[0] ? why : "not btrfs");
    }
    char p[PATH_MAX + 16];
    dsec__ct_fmt(p, sizeof p, "%s/sb", be->store);
    if (mkdir_p1(p, err) < 0)
        return -1;
    dsec__ct_fmt(p, sizeof p, "%s/snap", be->store);
    return mkdir_p1(p, err);
}

static bool dir_empty(const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL)
        return true;
    struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(d)) != NULL)
        empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    closedir(d);
    return empty;
}

void dsec__ct_store_close(struct ct_backend *be)
{
    if (!be->store_mounted)
        return;
    char sb[PATH_MAX + 16], snap[PATH_MAX + 16];
    dsec__ct_fmt(sb, sizeof sb, "%s/sb", be->store);
    dsec__ct_fmt(snap, sizeof snap, "%s/snap", be->store);
    /* sandboxes left running (detached) keep the store for a later adopt */
    if (!dir_empty(sb) || !dir_empty(snap))
        return;
    if (umount2(be->store, 0) == 0) /* the loop device goes with it (autoclear) */
        be->store_mounted = false;
}

/* Quotas on the store, once per instance. Full qgroups: each subvolume's
 * exclusive bytes are known, so a fork child is charged for what it writes
 * (its copy-ups are reflinks of the snapshot's extents: shared, not charged).
 * They are switched on only on the backend's own image: on a btrfs the host
 * also uses they cost every snapshot and commit there, so that is the
 * administrator's call. */
static int quota_on(struct ct_backend *be, dsec_err *err)
{
    pthread_mutex_lock(&be->lock);
    int rc = 0;
    if (!be->quota && be->store_mounted) {
        int fd = open(be->store, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        struct btrfs_ioctl_quota_ctl_args q = {.cmd = BTRFS_QUOTA_CTL_ENABLE};
        uint64_t t0 = dsec_now_ns();
        if (fd < 0 || ioctl(fd, BTRFS_IOC_QUOTA_CTL, &q) < 0)
            rc = dsec_err_set(err, DSEC_E_IO, errno, "container: enabling btrfs quotas on %s",
                              be->store);
        else
            dsec_log_info("dsec container: btrfs quotas enabled on %s (%.1f ms)", be->store,
                          (double)(dsec_now_ns() - t0) / 1e6);
        if (fd >= 0)
            close(fd);
    }
    if (rc == 0)
        be->quota = true;
    pthread_mutex_unlock(&be->lock);
    return rc;
}

int dsec__ct_subvol_limit(struct ct_backend *be, const char *path, uint64_t bytes, dsec_err *err)
{
    if (!be->btrfs)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "container: disk_mb needs the btrfs upper store, which this node "
                            "lacks (install btrfs-progs)");
    if (quota_on(be, err) < 0)
        return -1;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: opening %s", path);
    /* qgroupid 0: the qgroup of the subvolume fd is in */
    struct btrfs_ioctl_qgroup_limit_args a;
    memset(&a, 0, sizeof a);
    a.lim.flags = BTRFS_QGROUP_LIMIT_MAX_EXCL;
    a.lim.max_excl = bytes;
    int rc = ioctl(fd, BTRFS_IOC_QGROUP_LIMIT, &a);
    int e = errno;
    close(fd);
    if (rc == 0)
        return 0;
    if (e == ENOTCONN)
        return dsec_err_set(err, DSEC_E_CONFIG, e,
                            "container: disk_mb needs btrfs quotas, which are off on the "
                            "filesystem of %s (the backend enables them only on its own image: "
                            "run 'btrfs quota enable' on it)",
                            be->store);
    return dsec_err_set(err, DSEC_E_IO, e, "container: setting the disk quota of %s", path);
}

static int split(const char *path, char *parent, size_t plen, const char **base)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL || (size_t)(slash - path) >= plen || strlen(slash + 1) > BTRFS_PATH_NAME_MAX)
        return -1;
    dsec__ct_fmt(parent, plen, "%.*s", (int)(slash - path), path);
    *base = slash + 1;
    return 0;
}

static int inner_dirs(const char *path, dsec_err *err)
{
    char p[PATH_MAX + 16];
    dsec__ct_fmt(p, sizeof p, "%s/upper", path);
    if (mkdir(p, 0755) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", p);
    dsec__ct_fmt(p, sizeof p, "%s/work", path);
    if (mkdir(p, 0700) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", p);
    return 0;
}

/* A btrfs volume ioctl (create, destroy) on path's last component, through its parent. */
static int vol_ioctl(const char *path, unsigned long req, const char *what, dsec_err *err)
{
    char parent[PATH_MAX];
    const char *base;
    if (split(path, parent, sizeof parent, &base) < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "container: bad subvolume path %s", path);
    int dfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: opening %s", parent);
    struct btrfs_ioctl_vol_args args;
    memset(&args, 0, sizeof args);
    dsec__ct_fmt(args.name, sizeof args.name, "%s", base);
    int rc = ioctl(dfd, req, &args);
    int e = errno;
    close(dfd);
    if (rc < 0)
        return dsec_err_set(err, DSEC_E_IO, e, "container: %s btrfs subvolume %s", what, path);
    return 0;
}

int dsec__ct_subvol_create(const struct ct_backend *be, const char *path, dsec_err *err)
{
    if (!be->btrfs) {
        if (mkdir(path, 0700) < 0)
            return dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", path);
        return inner_dirs(path, err);
    }
    if (vol_ioctl(path, BTRFS_IOC_SUBVOL_CREATE, "creating", err) < 0)
        return -1;
    if (inner_dirs(path, err) < 0) {
        dsec_err ignore;
        dsec__ct_subvol_delete(be, path, &ignore);
        return -1;
    }
    return 0;
}

int dsec__ct_subvol_delete(const struct ct_backend *be, const char *path, dsec_err *err)
{
    struct stat st;
    if (lstat(path, &st) < 0)
        return errno == ENOENT
                   ? 0
                   : dsec_err_set(err, DSEC_E_IO, errno, "container: examining %s", path);
    /* a subvolume's root has inode 256; anything else is a plain directory
     * (the copy fallback) */
    if (!be->btrfs || st.st_ino != 256) {
        if (dsec__ct_rmtree(path) < 0)
            return dsec_err_set(err, DSEC_E_IO, errno, "container: removing %s", path);
        return 0;
    }
    return vol_ioctl(path, BTRFS_IOC_SNAP_DESTROY, "deleting", err);
}

int dsec__ct_subvol_snapshot(const struct ct_backend *be, const char *src, const char *dst,
                             dsec_err *err)
{
    if (!be->btrfs) {
        const char *cp[] = {"/bin/cp", "-a", "--reflink=auto", src, dst, NULL};
        char out[512];
        int st = dsec__ct_run(cp, out, sizeof out, err);
        if (st < 0)
            return -1;
        if (st != 0) {
            out[strcspn(out, "\n")] = '\0';
            dsec__ct_rmtree(dst);
            return dsec_err_set(err, DSEC_E_IO, 0, "container: copying %s: %s", src, out);
        }
        return 0;
    }
    char parent[PATH_MAX];
    const char *base;
    if (split(dst, parent, sizeof parent, &base) < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "container: bad snapshot path %s", dst);
    int sfd = open(src, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (sfd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: opening %s", src);
    int dfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        int e = errno;
        close(sfd);
        return dsec_err_set(err, DSEC_E_IO, e, "container: opening %s", parent);
    }
    struct btrfs_ioctl_vol_args_v2 args;
    memset(&args, 0, sizeof args);
    args.fd = sfd;
    args.flags = BTRFS_SUBVOL_RDONLY;
    dsec__ct_fmt(args.name, sizeof args.name, "%s", base);
    int rc = ioctl(dfd, BTRFS_IOC_SNAP_CREATE_V2, &args);
    int e = errno;
    close(sfd);
    close(dfd);
    if (rc < 0)
        return dsec_err_set(err, DSEC_E_IO, e, "container: snapshotting %s", src);
    return 0;
}

/* The overlay's own complaint (the new mount API queues it on the fs fd). */
static void fs_msg(int fs, char *out, size_t len)
{
    out[0] = '\0';
    char buf[512];
    ssize_t n;
    while ((n = read(fs, buf, sizeof buf - 1)) > 0) {
        buf[n] = '\0';
        dsec__ct_fmt(out, len, "%s", buf);
    }
}

/* The lowers as one "a:b:c" string (malloc'ed; NULL with err set), for the
 * kernels that take them only that way. */
static char *lowers_joined(const char *const *lowers, size_t n, dsec_err *err)
{
    size_t need = 1;
    for (size_t i = 0; i < n; i++)
        need += strlen(lowers[i]) + 1;
    char *all = dsec_malloc(need);
    if (all == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container: overlay options");
        return NULL;
    }
    size_t off = 0;
    all[0] = '\0';
    for (size_t i = 0; i < n; i++)
        off += (size_t)dsec__ct_fmt(all + off, need - off, "%s%s", i ? ":" : "", lowers[i]);
    return all;
}

/* The classic mount(2) form: every lower in one option string (at most a page). */
static int overlay_mount_legacy(const char *const *lowers, size_t n, const char *upper,
                                const char *work, const char *target, dsec_err *err)
{
    char *all = lowers_joined(lowers, n, err);
    if (all == NULL)
        return -1;
    size_t need = strlen(all) + strlen(upper) + strlen(work) + 64;
    char *opts = need > 4000 ? NULL : dsec_malloc(need);
    if (opts == NULL) {
        dsec_free(all);
        if (need > 4000)
            return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                                "container: %zu lower layers do not fit one overlay mount", n);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container: overlay options");
    }
    dsec__ct_fmt(opts, need, "lowerdir=%s,upperdir=%s,workdir=%s,index=off", all, upper, work);
    dsec_free(all);
    int rc = mount("overlay", target, "overlay", 0, opts);
    int e = errno;
    dsec_free(opts);
    if (rc < 0)
        return dsec_err_set(err, DSEC_E_IO, e, "container: mounting the overlay at %s", target);
    return 0;
}

int dsec__ct_overlay_make(const char *const *lowers, size_t n, const char *upper, const char *work,
                          const char *target, int *mfd, dsec_err *err)
{
    *mfd = -1;
    int fs = fsopen("overlay", FSOPEN_CLOEXEC);
    if (fs < 0)
        return errno == ENOSYS ? 1
                               : dsec_err_set(err, DSEC_E_IO, errno, "container: fsopen overlay");
    /* fsconfig takes each lower separately, so no option-string limit on
     * how many layers (forks of forks stack up); kernels before 6.8 take
     * one lowerdir string */
    char msg[512];
    bool one_string = false;
    for (size_t i = 0; i < n; i++)
        if (fsconfig(fs, FSCONFIG_SET_STRING, "lowerdir+", lowers[i], 0) < 0) {
            int e = errno;
            fs_msg(fs, msg, sizeof msg);
            if (e == EINVAL && i == 0) {
                one_string = true;
                break;
            }
            close(fs);
            return dsec_err_set(err, DSEC_E_IO, e, "container: overlay lower %s: %s", lowers[i],
                                msg);
        }
    if (one_string) {
        char *all = lowers_joined(lowers, n, err);
        if (all == NULL) {
            close(fs);
            return -1;
        }
        int rc = fsconfig(fs, FSCONFIG_SET_STRING, "lowerdir", all, 0);
        int e = errno;
        dsec_free(all);
        if (rc < 0) {
            fs_msg(fs, msg, sizeof msg);
            close(fs);
            return dsec_err_set(err, DSEC_E_IO, e, "container: overlay lowers for %s: %s", target,
                                msg);
        }
    }
    if (fsconfig(fs, FSCONFIG_SET_STRING, "upperdir", upper, 0) < 0 ||
        fsconfig(fs, FSCONFIG_SET_STRING, "workdir", work, 0) < 0 ||
        fsconfig(fs, FSCONFIG_SET_STRING, "index", "off", 0) < 0 ||
        fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0) {
        int e = errno;
        fs_msg(fs, msg, sizeof msg);
        close(fs);
        return dsec_err_set(err, DSEC_E_IO, e, "container: creating the overlay for %s: %s", target,
                            msg);
    }
    *mfd = fsmount(fs, FSMOUNT_CLOEXEC, 0);
    int e = errno;
    close(fs);
    if (*mfd < 0)
        return dsec_err_set(err, DSEC_E_IO, e, "container: fsmount of the overlay for %s", target);
    return 0;
}

int dsec__ct_overlay_mount(const char *const *lowers, size_t n, const char *upper, const char *work,
                           const char *target, dsec_err *err)
{
    int mfd;
    int rc = dsec__ct_overlay_make(lowers, n, upper, work, target, &mfd, err);
    if (rc == 1)
        return overlay_mount_legacy(lowers, n, upper, work, target, err);
    if (rc < 0)
        return -1;
    rc = move_mount(mfd, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH);
    int e = errno;
    close(mfd);
    if (rc < 0)
        return dsec_err_set(err, DSEC_E_IO, e, "container: attaching the overlay at %s", target);
    return 0;
}

int dsec__ct_overlay_umount(const char *target, dsec_err *err)
{
    if (umount2(target, UMOUNT_NOFOLLOW) == 0 || errno == EINVAL || errno == ENOENT)
        return 0;
    if (errno == EBUSY && umount2(target, MNT_DETACH | UMOUNT_NOFOLLOW) == 0)
        return 0;
    return dsec_err_set(err, DSEC_E_IO, errno, "container: unmounting %s", target);
}

static bool mount_root(int dfd, const char *name)
{
    struct statx sx;
    return statx(dfd, name, AT_SYMLINK_NOFOLLOW, 0, &sx) == 0 &&
           (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) &&
           (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT);
}

static void du_at(int dfd, uint64_t *bytes, uint64_t *files, int depth)
{
    DIR *d = fdopendir(dfd);
    if (d == NULL) {
        close(dfd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            int sub = depth < 256 ? openat(dirfd(d), e->d_name,
                                           O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                                  : -1;
            if (sub >= 0)
                du_at(sub, bytes, files, depth + 1);
        } else {
            *files += 1;
            if (S_ISREG(st.st_mode))
                *bytes += (uint64_t)st.st_size;
        }
    }
    closedir(d);
}

void dsec__ct_du(const char *dir, uint64_t *bytes, uint64_t *files)
{
    *bytes = *files = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0)
        du_at(fd, bytes, files, 0);
}

static int rm_at(int dfd, int depth)
{
    DIR *d = fdopendir(dfd);
    if (d == NULL) {
        close(dfd);
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            continue;
        if (errno != EISDIR || mount_root(dirfd(d), e->d_name) || depth > 512) {
            rc = -1;
            continue;
        }
        int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0 || rm_at(sub, depth + 1) < 0 || unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) < 0)
            rc = -1;
    }
    closedir(d);
    return rc;
}

int dsec__ct_rmtree(const char *path)
{
    if (unlink(path) == 0 || errno == ENOENT)
        return 0;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = rm_at(fd, 0);
    if (rmdir(path) < 0 && errno != ENOENT)
        rc = -1;
    return rc;
}

void dsec__ct_snap_path(const struct ct_backend *be, const char *name, char *out, size_t len)
{
    dsec__ct_fmt(out, len, "%s/snap/%s", be->store, name);
}

int dsec__ct_snap_sweep(struct ct_backend *be)
{
    char dir[PATH_MAX + 16];
    dsec__ct_fmt(dir, sizeof dir, "%s/snap", be->store);
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    int gone = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        /* under the lock: a reference taken meanwhile (an adopt) either
         * comes first and keeps it, or finds it gone */
        pthread_mutex_lock(&be->lock);
        struct ct_snap *s = be->snaps;
        while (s != NULL && strcmp(s->name, e->d_name) != 0)
            s = s->next;
        if (s == NULL) {
            char p[PATH_MAX + 300];
            dsec__ct_fmt(p, sizeof p, "%s/%s", dir, e->d_name);
            dsec_err err;
            if (dsec__ct_subvol_delete(be, p, &err) < 0)
                dsec_log_warn("dsec container: %s", err.msg);
            else
                gone++;
        }
        pthread_mutex_unlock(&be->lock);
    }
    closedir(d);
    return gone;
}

void dsec__ct_snap_ref(struct ct_backend *be, const char *name)
{
    pthread_mutex_lock(&be->lock);
    struct ct_snap *s = be->snaps;
    while (s != NULL && strcmp(s->name, name) != 0)
        s = s->next;
    if (s == NULL && (s = dsec_calloc(1, sizeof *s)) != NULL) {
        dsec__ct_fmt(s->name, sizeof s->name, "%s", name);
        s->next = be->snaps;
        be->snaps = s;
    }
    if (s != NULL)
        s->refs++;
    pthread_mutex_unlock(&be->lock);
}

void dsec__ct_snap_unref(struct ct_backend *be, const char *name)
{
    pthread_mutex_lock(&be->lock);
    struct ct_snap **pp = &be->snaps, *gone = NULL;
    while (*pp != NULL && strcmp((*pp)->name, name) != 0)
        pp = &(*pp)->next;
    if (*pp != NULL && --(*pp)->refs == 0) {
        gone = *pp;
        *pp = gone->next;
    }
    pthread_mutex_unlock(&be->lock);
    if (gone == NULL)
        return;
    /* the last child is gone: so is the snapshot it branched from */
    char p[PATH_MAX + 128];
    dsec__ct_snap_path(be, gone->name, p, sizeof p);
    dsec_err err;
    if (dsec__ct_subvol_delete(be, p, &err) < 0)
        dsec_log_warn("dsec container: %s", err.msg);
    dsec_free(gone);
}
