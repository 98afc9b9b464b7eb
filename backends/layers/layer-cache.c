/* layer-cache.c - the node's layer cache: one fetch per layer, verified, mounted read-only,
 * LRU-evicted. */
#define _GNU_SOURCE
#include "backends/layers/layer-cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/loop.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/layers/layer-int.h"
#include "dsec/alloc.h"
#include "dsec/io.h"
#include "dsec/log.h"

/*
 * On disk under dir:
 *   blobs/<hex>     a fetched EROFS image, the loop device's backing file
 *   layers/<hex>    the layer: an EROFS mount, or an unpacked tar tree
 *                   bind-mounted read-only onto itself
 *   meta/<hex>      written last, once the layer is complete: format,
 *                   source (local, or direct from a shared registry), bytes
 *   tmp/            fetches and unpacks in progress (emptied at open)
 *   .lock           flock: one cache instance per directory
 * A layer without its meta file is a crashed fetch and is removed at open.
 *
 * Each digest has one entry. Its state moves absent -> FETCHING -> READY,
 * or, after a restart, IDLE (on disk, not mounted) -> MOUNTING -> READY;
 * READY/IDLE -> EVICTING -> gone. The slow work of those transitions runs
 * outside the mutex by the one thread that started it; everyone else who
 * wants the layer waits on the condition variable. An entry that leaves the
 * list (failed fetch, eviction) while threads wait on it is freed by the
 * last of them (nwait).
 *
 * Layers found still mounted at open were in use when the previous instance
 * stopped (it unmounts unused ones): they are "adopted" and not evicted until
 * acquired and released once here, so a sandbox the node manager has not yet
 * re-adopted cannot lose its lower layer.
 */

typedef enum estate {
    ST_FETCHING,
    ST_MOUNTING,
    ST_EVICTING,
    ST_READY,
    ST_IDLE,
    ST_FAILED,
    ST_GONE
} estate;

typedef struct entry {
    struct entry *next;
    char hex[65];
    estate state;
    dsec_layer_format fmt;
    bool direct;       /* EROFS mounted from the registry's own path */
    bool adopted;      /* found mounted at open */
    bool evict_failed; /* unmount refused; skip until used again */
    uint64_t users;
    uint64_t bytes;
    uint64_t last_used;
    int nwait;
    dsec_err err; /* why the fetch failed (ST_FAILED) */
} entry;

struct dsec_layer_cache {
    char *dir;
    uint64_t budget;
    dsec_layer_registry *reg;
    int lock_fd;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    entry *entries;
    uint64_t tick, bytes, fetches, hits, evictions;
    unsigned shares; /* openers through dsec_layer_cache_share; 0: not shared */
    struct dsec_layer_cache *next_shared;
};

/* The caches opened with dsec_layer_cache_share, by directory. */
static pthread_mutex_t shared_mu = PTHREAD_MUTEX_INITIALIZER;
static dsec_layer_cache *shared_list;

#define META_MAX 512
#define EROFS_MAGIC 0xE0F5E1E2u

static bool busy(const entry *e)
{
    return e->state == ST_FETCHING || e->state == ST_MOUNTING || e->state == ST_EVICTING;
}

static entry *find(dsec_layer_cache *c, const char *hex)
{
    for (entry *e = c->entries; e != NULL; e = e->next)
        if (strcmp(e->hex, hex) == 0)
            return e;
    return NULL;
}

static void detach(dsec_layer_cache *c, entry *e)
{
    for (entry **pp = &c->entries; *pp != NULL; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    e->next = NULL;
}

static char *lpath(dsec_layer_cache *c, const char *sub, const char *hex)
{
    return dsec__layer_path("%s/%s/%s", c->dir, sub, hex);
}

/* ---- mounting ----------------------------------------------------------------------------- */

int dsec_layer_loop_mount(const char *file, const char *target, const char *fstype, bool rdonly,
                          dsec_err *err)
{
    int bfd = open(file, (rdonly ? O_RDONLY : O_RDWR) | O_CLOEXEC);
    if (bfd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "opening image %s", file);
    int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (ctl < 0) {
        close(bfd);
        return dsec_err_set(err, DSEC_E_IO, errno, "opening /dev/loop-control (needs root)");
    }
    int rc = -1;
    for (int tries = 0; tries < 64; tries++) {
        int n = ioctl(ctl, LOOP_CTL_GET_FREE);
        if (n < 0) {
            dsec_err_set(err, DSEC_E_IO, errno, "finding a free loop device");
            break;
        }
        char dev[32];
        snprintf(dev, sizeof dev, "/dev/loop%d", n);
        int lfd = open(dev, (rdonly ? O_RDONLY : O_RDWR) | O_CLOEXEC);
        if (lfd < 0) {
            dsec_err_set(err, DSEC_E_IO, errno, "opening %s", dev);
            break;
        }
        struct loop_config cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.fd = (uint32_t)bfd;
        cfg.info.lo_flags = (rdonly ? LO_FLAGS_READ_ONLY : 0) | LO_FLAGS_AUTOCLEAR;
        snprintf((char *)cfg.info.lo_file_name, LO_NAME_SIZE, "%s", file);
        if (ioctl(lfd, LOOP_CONFIGURE, &cfg) < 0) {
            int e = errno;
            close(lfd);
            if (e == EBUSY)
                continue; /* another process took it between GET_FREE and CONFIGURE */
            dsec_err_set(err, DSEC_E_IO, e, "attaching %s to %s", file, dev);
            break;
        }
        /* the mount holds the device from here; our fd may go (autoclear) */
        if (mount(dev, target, fstype, rdonly ? MS_RDONLY : 0, NULL) < 0)
            dsec_err_set(err, DSEC_E_IO, errno, "mounting %s (from %s) on %s", dev, file, target);
        else
            rc = 0;
        close(lfd);
        break;
    }
    close(ctl);
    close(bfd);
    return rc;
}

static int bind_ro(const char *path, dsec_err *err)
{
    if (mount(path, path, NULL, MS_BIND, NULL) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "bind-mounting %s", path);
    if (mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL) < 0) {
        int e = errno;
        umount2(path, MNT_DETACH);
        return dsec_err_set(err, DSEC_E_IO, e, "making %s read-only", path);
    }
    return 0;
}

/* Whether path is a mount point (per /proc/self/mountinfo). */
static bool is_mounted(const char *path)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (f == NULL)
        return false;
    char *line = NULL;
    size_t cap = 0;
    bool found = false;
    while (!found && getline(&line, &cap, f) > 0) {
        char mp[4096];
        if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1)
            continue;
        /* mountinfo escapes space, tab, newline and backslash as \ooo */
        char *w = mp;
        for (char *r = mp; *r != '\0'; r++) {
            if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] != '\0' && r[3] != '\0') {
                *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
                r += 3;
            } else {
                *w++ = *r;
            }
        }
        *w = '\0';
        found = strcmp(mp, path) == 0;
    }
    free(line); /* getline's buffer comes from libc */
    fclose(f);
    return found;
}

/* Unmount every mount stacked on path; lazily when told (closing), else a busy one fails. */
static int unmount_all(const char *path, bool lazy, dsec_err *err)
{
    for (int i = 0; i < 16 && is_mounted(path); i++)
        if (umount2(path, lazy ? MNT_DETACH : 0) < 0)
            return dsec_err_set(err, DSEC_E_IO, errno, "unmounting layer %s", path);
    return 0;
}

/* The blob's format from its magic: EROFS superblock at 1024, "ustar" at 257. */
static int sniff(const char *file, const char *digest, dsec_layer_format *fmt, dsec_err *err)
{
    unsigned char b[1028];
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "opening %s", file);
    ssize_t n = pread(fd, b, sizeof b, 0);
    close(fd);
    if (n >= 1028 &&
        (uint32_t)(b[1024] | b[1025] << 8 | b[1026] << 16 | (uint32_t)b[1027] << 24) == EROFS_MAGIC)
        *fmt = DSEC_LAYER_EROFS;
    else if (n >= 262 && memcmp(b + 257, "ustar", 5) == 0)
        *fmt = DSEC_LAYER_DIR;
    else
        return dsec_err_set(err, DSEC_E_DECODE, 0,
                            "layer %s is neither an EROFS image nor a tar archive", digest);
    return 0;
}

/* Check file against the digest; on mismatch, delete it when it is ours. */
static int verify(const char *file, const char *digest, const char *from, bool ours, dsec_err *err)
{
    dsec_digest got;
    if (dsec_digest_file(file, got, err) < 0)
        return -1;
    if (strcmp(got, digest) == 0)
        return 0;
    if (ours)
        unlink(file);
    return dsec_err_set(err, DSEC_E_INVALID, 0,
                        "layer %s from %s: digest mismatch, the blob hashes to %s; %s", digest,
                        from, got, ours ? "deleted it" : "refusing it");
}

static int write_meta(dsec_layer_cache *c, entry *e, dsec_err *err)
{
    char doc[META_MAX];
    int n = snprintf(doc, sizeof doc, "dsec-cache 1\nformat %s\nsource %s\nbytes %llu\n",
                     dsec_layer_format_name(e->fmt), e->direct ? "direct" : "local",
                     (unsigned long long)e->bytes);
    char *p = lpath(c, "meta", e->hex);
    int rc = p != NULL ? dsec__layer_write_atomic(p, doc, (size_t)n, err)
                       : dsec_err_set(err, DSEC_E_NOMEM, 0, "caching a layer");
    dsec_free(p);
    return rc;
}

/* Remove every trace of the layer (mounts, tree, blob, meta). */
static int remove_layer(dsec_layer_cache *c, const char *hex, bool lazy, dsec_err *err)
{
    char *layer = lpath(c, "layers", hex), *blob = lpath(c, "blobs", hex),
         *meta = lpath(c, "meta", hex);
    int rc = 0;
    if (layer == NULL || blob == NULL || meta == NULL)
        rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "removing a cached layer");
    if (rc == 0)
        rc = unmount_all(layer, lazy, err);
    if (rc == 0) {
        unlink(meta); /* first: what is left without it is garbage to the next open */
        if (dsec__layer_rm_rf(layer, err) < 0 || dsec__layer_rm_rf(blob, err) < 0)
            rc = -1;
    }
    dsec_free(layer);
    dsec_free(blob);
    dsec_free(meta);
    return rc;
}

/* ---- fetching ----------------------------------------------------------------------------- */

/* Make e's layer from the registry (called by the one fetching thread, unlocked). */
static int fetch(dsec_layer_cache *c, entry *e, dsec_err *err)
{
    dsec_digest digest;
    snprintf(digest, sizeof digest, "sha256:%s", e->hex);
    char *layer = lpath(c, "layers", e->hex), *blob = lpath(c, "blobs", e->hex);
    char *tmp = dsec__layer_path("%s/tmp/fetch.XXXXXX", c->dir);
    char *direct = dsec_layer_registry_direct_path(c->reg, digest);
    char *fetched = NULL, *tree = NULL;
    int rc = -1;
    if (layer == NULL || blob == NULL || tmp == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "fetching layer %s", digest);
        goto out;
    }
    if (mkdtemp(tmp) == NULL) {
        dsec_err_set(err, DSEC_E_IO, errno, "creating a fetch directory in %s/tmp", c->dir);
        dsec_free(tmp);
        tmp = NULL;
        goto out;
    }
    /* a stale tree from a crash before its meta was written */
    if (remove_layer(c, e->hex, true, err) < 0)
        goto out;
    const char *src;
    if (direct != NULL) {
        /* read in place from the shared filesystem: verified, never deleted by us */
        if (verify(direct, digest, direct, false, err) < 0 ||
            sniff(direct, digest, &e->fmt, err) < 0)
            goto out;
        src = direct;
    } else {
        if ((fetched = dsec__layer_path("%s/blob", tmp)) == NULL) {
            dsec_err_set(err, DSEC_E_NOMEM, 0, "fetching layer %s", digest);
            goto out;
        }
        if (dsec_layer_registry_get(c->reg, digest, fetched, err) < 0) {
            dsec_err_wrap(err, "fetching layer from the %s registry",
                          dsec_layer_registry_kind(c->reg));
            goto out;
        }
        char from[64];
        snprintf(from, sizeof from, "the %s registry", dsec_layer_registry_kind(c->reg));
        if (verify(fetched, digest, from, true, err) < 0 ||
            sniff(fetched, digest, &e->fmt, err) < 0)
            goto out;
        src = fetched;
    }
    if (e->fmt == DSEC_LAYER_EROFS) {
        if (direct == NULL) {
            if (chmod(fetched, 0444) < 0 || rename(fetched, blob) < 0) {
                dsec_err_set(err, DSEC_E_IO, errno, "keeping layer %s as %s", digest, blob);
                goto out;
            }
            src = blob;
        }
        if (mkdir(layer, 0755) < 0) {
            dsec_err_set(err, DSEC_E_IO, errno, "creating %s", layer);
            goto out;
        }
        if (dsec_layer_loop_mount(src, layer, "erofs", true, err) < 0)
            goto out;
        struct stat st;
        e->direct = direct != NULL;
        e->bytes = direct == NULL && stat(blob, &st) == 0 ? (uint64_t)st.st_blocks * 512u : 0;
    } else {
        if ((tree = dsec__layer_path("%s/tree", tmp)) == NULL) {
            dsec_err_set(err, DSEC_E_NOMEM, 0, "fetching layer %s", digest);
            goto out;
        }
        if (mkdir(tree, 0755) < 0) {
            dsec_err_set(err, DSEC_E_IO, errno, "creating %s", tree);
            goto out;
        }
        if (dsec__layer_untar(src, tree, err) < 0)
            goto out;
        if (rename(tree, layer) < 0) {
            dsec_err_set(err, DSEC_E_IO, errno, "moving the unpacked layer to %s", layer);
            goto out;
        }
        if (bind_ro(layer, err) < 0)
            goto out;
        e->direct = false;
        e->bytes = dsec__layer_tree_bytes(layer);
    }
    if (write_meta(c, e, err) < 0) {
        unmount_all(layer, true, NULL);
        goto out;
    }
    rc = 0;
out:
    if (rc < 0 && layer != NULL)
        remove_layer(c, e->hex, true, NULL);
    if (tmp != NULL)
        dsec__layer_rm_rf(tmp, NULL);
    dsec_free(layer);
    dsec_free(blob);
    dsec_free(tmp);
    dsec_free(direct);
    dsec_free(fetched);
    dsec_free(tree);
    return rc;
}

/* Mount a layer that is on disk but not mounted (after a restart), re-verifying EROFS images. */
static int remount(dsec_layer_cache *c, entry *e, dsec_err *err)
{
    dsec_digest digest;
    snprintf(digest, sizeof digest, "sha256:%s", e->hex);
    char *layer = lpath(c, "layers", e->hex), *blob = lpath(c, "blobs", e->hex);
    char *direct = NULL;
    int rc = -1;
    if (layer == NULL || blob == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "mounting layer %s", digest);
        goto out;
    }
    if (e->fmt == DSEC_LAYER_DIR) {
        rc = bind_ro(layer, err);
        goto out;
    }
    const char *src = blob;
    if (e->direct) {
        if ((direct = dsec_layer_registry_direct_path(c->reg, digest)) == NULL) {
            dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "layer %s is no longer readable in place",
                         digest);
            goto out;
        }
        src = direct;
    }
    if (verify(src, digest, src, !e->direct, err) < 0)
        goto out;
    if (mkdir(layer, 0755) < 0 && errno != EEXIST) {
        dsec_err_set(err, DSEC_E_IO, errno, "creating %s", layer);
        goto out;
    }
    rc = dsec_layer_loop_mount(src, layer, "erofs", true, err);
out:
    dsec_free(layer);
    dsec_free(blob);
    dsec_free(direct);
    return rc;
}

/* ---- eviction ----------------------------------------------------------------------------- */

/* With c->mu held: evict unused layers, least recently used first, until
 * within budget. The mutex is dropped around each unmount and delete. */
static void evict_over_budget(dsec_layer_cache *c)
{
    while (c->budget > 0 && c->bytes > c->budget) {
        entry *victim = NULL;
        for (entry *e = c->entries; e != NULL; e = e->next)
            if ((e->state == ST_READY || e->state == ST_IDLE) && e->users == 0 && !e->adopted &&
                !e->evict_failed && e->bytes > 0 &&
                (victim == NULL || e->last_used < victim->last_used))
                victim = e;
        if (victim == NULL)
            return; /* everything left is in use: stay over budget rather than break a sandbox */
        estate was = victim->state;
        victim->state = ST_EVICTING;
        pthread_mutex_unlock(&c->mu);
        dsec_err err;
        int rc = remove_layer(c, victim->hex, false, &err);
        if (rc < 0)
            dsec_log_warn("dsec layer cache: evicting %s: %s", victim->hex, err.msg);
        pthread_mutex_lock(&c->mu);
        if (rc < 0) {
            victim->state = was;
            victim->evict_failed = true;
        } else {
            c->bytes -= victim->bytes;
            c->evictions++;
            detach(c, victim);
            victim->state = ST_GONE;
            if (victim->nwait == 0)
                dsec_free(victim);
        }
        pthread_cond_broadcast(&c->cv);
    }
}

/* ---- the API ------------------------------------------------------------------------------ */

int dsec_layer_cache_acquire(dsec_layer_cache *c, const char *digest, char **path, dsec_err *err)
{
    *path = NULL;
    if (!dsec_digest_valid(digest))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "acquiring a layer: \"%.80s\" is not a sha256: digest",
                            digest != NULL ? digest : "(null)");
    const char *hex = digest + 7;
    char *p = lpath(c, "layers", hex);
    if (p == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "acquiring layer %s", digest);
    pthread_mutex_lock(&c->mu);
    entry *e;
    for (;;) {
        e = find(c, hex);
        if (e == NULL) {
            e = dsec_calloc(1, sizeof *e);
            if (e == NULL) {
                pthread_mutex_unlock(&c->mu);
                dsec_free(p);
                return dsec_err_set(err, DSEC_E_NOMEM, 0, "acquiring layer %s", digest);
            }
            memcpy(e->hex, hex, 65);
            e->state = ST_FETCHING;
            e->next = c->entries;
            c->entries = e;
            c->fetches++;
            pthread_mutex_unlock(&c->mu);
            dsec_err ferr;
            dsec_err_clear(&ferr);
            int rc = fetch(c, e, &ferr);
            pthread_mutex_lock(&c->mu);
            if (rc < 0) {
                detach(c, e);
                e->state = ST_FAILED;
                e->err = ferr;
                pthread_cond_broadcast(&c->cv);
                if (e->nwait == 0)
                    dsec_free(e);
                pthread_mutex_unlock(&c->mu);
                dsec_free(p);
                if (err != NULL)
                    *err = ferr;
                return -1;
            }
            e->state = ST_READY;
            c->bytes += e->bytes;
            pthread_cond_broadcast(&c->cv);
            break;
        }
        if (busy(e)) {
            e->nwait++;
            while (busy(e))
                pthread_cond_wait(&c->cv, &c->mu);
            e->nwait--;
            if (e->state == ST_FAILED || e->state == ST_GONE) {
                estate st = e->state;
                dsec_err ferr = e->err;
                if (e->nwait == 0)
                    dsec_free(e);
                if (st == ST_GONE)
                    continue; /* evicted while we waited: fetch it again */
                pthread_mutex_unlock(&c->mu);
                dsec_free(p);
                if (err != NULL)
                    *err = ferr;
                return -1;
            }
            continue;
        }
        if (e->state == ST_IDLE) {
            e->state = ST_MOUNTING;
            pthread_mutex_unlock(&c->mu);
            dsec_err merr;
            int rc = remount(c, e, &merr);
            if (rc < 0) {
                /* a damaged copy: drop it and fetch afresh */
                dsec_log_warn("dsec layer cache: %s; fetching it again", merr.msg);
                remove_layer(c, e->hex, true, NULL);
            }
            pthread_mutex_lock(&c->mu);
            if (rc < 0) {
                c->bytes -= e->bytes;
                detach(c, e);
                e->state = ST_GONE;
                pthread_cond_broadcast(&c->cv);
                if (e->nwait == 0)
                    dsec_free(e);
                continue;
            }
            e->state = ST_READY;
            pthread_cond_broadcast(&c->cv);
        }
        c->hits++;
        break;
    }
    e->users++;
    e->last_used = ++c->tick;
    e->adopted = false;
    e->evict_failed = false;
    evict_over_budget(c);
    pthread_mutex_unlock(&c->mu);
    *path = p;
    return 0;
}

void dsec_layer_cache_release(dsec_layer_cache *c, const char *digest)
{
    if (c == NULL || !dsec_digest_valid(digest))
        return;
    pthread_mutex_lock(&c->mu);
    entry *e = find(c, digest + 7);
    if (e != NULL && e->users > 0) {
        e->users--;
        e->last_used = ++c->tick;
        evict_over_budget(c);
    }
    pthread_mutex_unlock(&c->mu);
}

bool dsec_layer_cache_has(dsec_layer_cache *c, const char *digest)
{
    if (c == NULL || !dsec_digest_valid(digest))
        return false;
    pthread_mutex_lock(&c->mu);
    const entry *e = find(c, digest + 7);
    bool has = e != NULL && e->state != ST_EVICTING && e->state != ST_FAILED && e->state != ST_GONE;
    pthread_mutex_unlock(&c->mu);
    return has;
}

void dsec_layer_cache_stats_get(dsec_layer_cache *c, dsec_layer_cache_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&c->mu);
    for (entry *e = c->entries; e != NULL; e = e->next) {
        if (e->state != ST_FETCHING)
            out->layers++;
        if (e->users > 0)
            out->in_use++;
    }
    out->bytes = c->bytes;
    out->fetches = c->fetches;
    out->hits = c->hits;
    out->evictions = c->evictions;
    pthread_mutex_unlock(&c->mu);
}

dsec_layer_registry *dsec_layer_cache_registry(dsec_layer_cache *c)
{
    return c->reg;
}

/* ---- open and close ----------------------------------------------------------------------- */

static bool is_hex64(const char *s)
{
    if (strlen(s) != 64)
        return false;
    for (; *s != '\0'; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return false;
    return true;
}

/* Read meta/<hex> into e; -1 when missing or malformed. */
static int read_meta(dsec_layer_cache *c, entry *e)
{
    char *p = lpath(c, "meta", e->hex);
    char *doc = NULL;
    size_t len;
    int rc = -1;
    if (p != NULL && dsec_read_file(p, META_MAX, &doc, &len, NULL) == 0) {
        char f[16], src[16];
        unsigned long long b;
        dsec_err err;
        if (sscanf(doc, "dsec-cache 1\nformat %15s\nsource %15s\nbytes %llu\n", f, src, &b) == 3 &&
            dsec_layer_format_parse(f, &e->fmt, &err) == 0 &&
            (strcmp(src, "local") == 0 || strcmp(src, "direct") == 0)) {
            e->direct = strcmp(src, "direct") == 0;
            e->bytes = b;
            rc = 0;
        }
    }
    dsec_free(p);
    dsec_free(doc);
    return rc;
}

/* Find what a previous instance left under dir: complete layers become
 * entries (READY when still mounted, else IDLE); the rest is removed. */
static int rediscover(dsec_layer_cache *c, dsec_err *err)
{
    char *tmp = dsec__layer_path("%s/tmp", c->dir);
    if (tmp == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "opening the layer cache");
    int rc = dsec__layer_rm_rf(tmp, err);
    if (rc == 0 && mkdir(tmp, 0700) < 0)
        rc = dsec_err_set(err, DSEC_E_IO, errno, "creating %s", tmp);
    dsec_free(tmp);
    if (rc < 0)
        return -1;
    static const char *const subs[] = {"meta", "layers", "blobs"};
    for (size_t s = 0; s < 3; s++) {
        char *d = dsec__layer_path("%s/%s", c->dir, subs[s]);
        DIR *dp = d != NULL ? opendir(d) : NULL;
        if (dp == NULL) {
            dsec_err_set(err, DSEC_E_IO, errno, "listing %s/%s", c->dir, subs[s]);
            dsec_free(d);
            return -1;
        }
        struct dirent *de;
        while ((de = readdir(dp)) != NULL) {
            if (de->d_name[0] == '.')
                continue;
            if (!is_hex64(de->d_name)) {
                if (s == 0 && de->d_name[0] == '#') { /* an interrupted atomic write */
                    char *t = dsec__layer_path("%s/%s", d, de->d_name);
                    if (t != NULL)
                        unlink(t);
                    dsec_free(t);
                }
                continue;
            }
            if (find(c, de->d_name) != NULL)
                continue;
            entry probe;
            memset(&probe, 0, sizeof probe);
            memcpy(probe.hex, de->d_name, 65);
            char *layer = lpath(c, "layers", probe.hex), *blob = lpath(c, "blobs", probe.hex);
            struct stat st;
            bool complete = layer != NULL && blob != NULL && read_meta(c, &probe) == 0;
            bool mounted = complete && is_mounted(layer);
            if (complete && !mounted) {
                if (probe.fmt == DSEC_LAYER_DIR)
                    complete = stat(layer, &st) == 0 && S_ISDIR(st.st_mode);
                else if (!probe.direct)
                    complete = stat(blob, &st) == 0 && S_ISREG(st.st_mode);
            }
            entry *e = complete ? dsec_calloc(1, sizeof *e) : NULL;
            if (e != NULL) {
                *e = probe;
                e->state = mounted ? ST_READY : ST_IDLE;
                e->adopted = mounted;
                e->next = c->entries;
                c->entries = e;
                c->bytes += e->bytes;
            } else if (layer != NULL && blob != NULL) {
                dsec_err rerr;
                if (remove_layer(c, probe.hex, true, &rerr) < 0)
                    dsec_log_warn("dsec layer cache: clearing an incomplete layer: %s", rerr.msg);
            }
            dsec_free(layer);
            dsec_free(blob);
        }
        closedir(dp);
        dsec_free(d);
    }
    return 0;
}

/* The cache's directory given, made if missing, and a registry to fill it. */
static int dir_ready(const char *dir, const dsec_layer_registry *reg, dsec_err *err)
{
    if (dir == NULL || dir[0] == '\0' || reg == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "layer cache: a directory and a registry are required");
    if (dsec__layer_mkdir_p(dir, 0755, err) < 0)
        return dsec_err_wrap(err, "layer cache");
    return 0;
}

int dsec_layer_cache_new(dsec_layer_cache **out, const char *dir, uint64_t budget_bytes,
                         dsec_layer_registry *reg, dsec_err *err)
{
    *out = NULL;
    if (dir_ready(dir, reg, err) < 0)
        return -1;
    dsec_layer_cache *c = dsec_calloc(1, sizeof *c);
    if (c == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "layer cache");
    c->lock_fd = -1;
    char *real = realpath(dir, NULL);
    c->dir = real != NULL ? dsec_strdup(real) : NULL;
    free(real); /* realpath's buffer comes from libc */
    if (c->dir == NULL) {
        dsec_err_set(err, DSEC_E_IO, errno, "layer cache: resolving %s", dir);
        goto fail;
    }
    static const char *const subs[] = {"blobs", "layers", "meta"};
    for (size_t i = 0; i < 3; i++) {
        char *p = dsec__layer_path("%s/%s", c->dir, subs[i]);
        int rc = p != NULL ? dsec__layer_mkdir_p(p, 0755, err)
                           : dsec_err_set(err, DSEC_E_NOMEM, 0, "layer cache");
        dsec_free(p);
        if (rc < 0)
            goto fail;
    }
    char *lk = dsec__layer_path("%s/.lock", c->dir);
    c->lock_fd = lk != NULL ? open(lk, O_RDWR | O_CREAT | O_CLOEXEC, 0644) : -1;
    dsec_free(lk);
    if (c->lock_fd < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "layer cache: opening %s/.lock", c->dir);
        goto fail;
    }
    if (flock(c->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        dsec_err_set(err, errno == EWOULDBLOCK ? DSEC_E_STATE : DSEC_E_IO, errno,
                     "layer cache %s is open in another cache instance", c->dir);
        goto fail;
    }
    c->budget = budget_bytes;
    c->reg = reg;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    if (rediscover(c, err) < 0) {
        dsec_err_wrap(err, "layer cache %s", c->dir);
        dsec_layer_cache_free(c);
        return -1;
    }
    *out = c;
    return 0;
fail:
    if (c->lock_fd >= 0)
        close(c->lock_fd);
    dsec_free(c->dir);
    dsec_free(c);
    return -1;
}

int dsec_layer_cache_share(dsec_layer_cache **out, const char *dir, uint64_t budget_bytes,
                           dsec_layer_registry *reg, dsec_err *err)
{
    *out = NULL;
    if (dir_ready(dir, reg, err) < 0)
        return -1;
    char *real = realpath(dir, NULL);
    if (real == NULL)
        return dsec_err_set(err, DSEC_E_IO, errno, "layer cache: resolving %s", dir);
    pthread_mutex_lock(&shared_mu);
    dsec_layer_cache *c = shared_list;
    while (c != NULL && strcmp(c->dir, real) != 0)
        c = c->next_shared;
    int rc = 0;
    if (c != NULL && c->reg != reg) {
        rc = dsec_err_set(err, DSEC_E_STATE, 0,
                          "layer cache %s is already open on another layer registry", real);
    } else if (c != NULL) {
        c->shares++;
        *out = c;
    } else if ((rc = dsec_layer_cache_new(&c, real, budget_bytes, reg, err)) == 0) {
        c->shares = 1;
        c->next_shared = shared_list;
        shared_list = c;
        *out = c;
    }
    pthread_mutex_unlock(&shared_mu);
    free(real); /* realpath's buffer comes from libc */
    return rc;
}

void dsec_layer_cache_free(dsec_layer_cache *c)
{
    if (c == NULL)
        return;
    if (c->shares > 0) {
        pthread_mutex_lock(&shared_mu);
        bool last = --c->shares == 0;
        if (last) {
            dsec_layer_cache **pp = &shared_list;
            while (*pp != NULL && *pp != c)
                pp = &(*pp)->next_shared;
            if (*pp == c)
                *pp = c->next_shared;
        }
        pthread_mutex_unlock(&shared_mu);
        if (!last)
            return;
    }
    pthread_mutex_lock(&c->mu);
    entry *e = c->entries;
    while (e != NULL) {
        entry *next = e->next;
        if (e->state == ST_READY && e->users == 0) {
            char *layer = lpath(c, "layers", e->hex);
            dsec_err err;
            if (layer != NULL && unmount_all(layer, true, &err) < 0)
                dsec_log_warn("dsec layer cache: %s", err.msg);
            dsec_free(layer);
        }
        dsec_free(e);
        e = next;
    }
    c->entries = NULL;
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    close(c->lock_fd);
    dsec_free(c->dir);
    dsec_free(c);
}
