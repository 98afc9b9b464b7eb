/* layer-cache.h - a node's layer cache: fetch once, verify, share read-only, evict LRU under a
 * budget. */
#ifndef DSEC_BACKENDS_LAYER_CACHE_H
#define DSEC_BACKENDS_LAYER_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "dsec/err.h"
#include "dsec/layers.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The cache keeps each layer as a read-only directory: an EROFS blob is
 * loop-mounted (from the registry's own path when the registry is a shared
 * filesystem, so it is read on demand), a DIR blob is unpacked once. Many
 * threads may acquire the same layer at once; one fetch happens and the others
 * wait for it. A layer with users is never evicted; unused layers go
 * least-recently-used first when the cache holds more than budget bytes.
 * The cache survives restarts: what is on disk under dir is found again (and
 * re-verified) by dsec_layer_cache_new. All calls are thread-safe.
 */
typedef struct dsec_layer_cache dsec_layer_cache;

/* Open the cache under dir (created). reg is borrowed and must outlive the
 * cache. budget_bytes 0 means no limit. */
int dsec_layer_cache_new(dsec_layer_cache **out, const char *dir, uint64_t budget_bytes,
                         dsec_layer_registry *reg, dsec_err *err);
/* The node's cache: every caller in this process that names the same
 * directory (and registry) gets the same instance, so a layer is fetched
 * and mounted once per node however many backends use it. The budget is the
 * first opener's. Each share is closed with dsec_layer_cache_free; the last
 * one closes the cache. A different registry on the same directory fails
 * with DSEC_E_STATE. */
int dsec_layer_cache_share(dsec_layer_cache **out, const char *dir, uint64_t budget_bytes,
                           dsec_layer_registry *reg, dsec_err *err);
/* Unmount and close (for a shared cache: when its last share goes). Layers still acquired are left
 * mounted (a node-manager restart re-adopts them). NULL is a no-op. */
void dsec_layer_cache_free(dsec_layer_cache *c);

dsec_layer_registry *dsec_layer_cache_registry(dsec_layer_cache *c);

/* Make the layer available (fetching and verifying it if needed) and count
 * one user. *path is the read-only directory to use as an overlay lower
 * layer; it is a dsec_malloc'd string the caller frees. */
int dsec_layer_cache_acquire(dsec_layer_cache *c, const char *digest, char **path, dsec_err *err);
/* Drop one user taken by acquire. */
void dsec_layer_cache_release(dsec_layer_cache *c, const char *digest);
/* Whether the layer is in the cache now (on disk or on its way in, used or not); false once it
 * is evicted or being evicted. What a backend makes from a layer can go with it. */
bool dsec_layer_cache_has(dsec_layer_cache *c, const char *digest);

/* Attach the image file to a free loop device (autoclear) and mount it as
 * fstype ("erofs", "ext4") on target, read-only when rdonly. The device goes
 * with the mount. Needs root. */
int dsec_layer_loop_mount(const char *file, const char *target, const char *fstype, bool rdonly,
                          dsec_err *err);

/* Figures for tests and the node's reports. */
typedef struct dsec_layer_cache_stats {
    uint64_t layers;  /* present on disk */
    uint64_t in_use;  /* with users */
    uint64_t bytes;   /* held on disk */
    uint64_t fetches; /* registry fetches since open */
    uint64_t hits;    /* acquires served without a fetch */
    uint64_t evictions;
} dsec_layer_cache_stats;
void dsec_layer_cache_stats_get(dsec_layer_cache *c, dsec_layer_cache_stats *out);

#ifdef __cplusplus
}
#endif
#endif
