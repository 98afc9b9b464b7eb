/* image-int.h - helpers shared by image import's files (module-internal). */
#ifndef DSEC_BACKENDS_IMAGE_INT_H
#define DSEC_BACKENDS_IMAGE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "dsec/err.h"
#include "dsec/image.h"
#include "dsec/layers.h"

/* Open rel (no leading '/') under the directory root_fd for reading, never
 * leaving root (openat2 RESOLVE_IN_ROOT); -1 with err naming what. */
int dsec__image_open_in(int root_fd, const char *rel, const char *what, dsec_err *err);

/* Copy the layer blob (plain, gzip or zstd tar) open at fd to the new file
 * tar_out, uncompressed: *blob is the sha256 of the bytes read from fd and
 * *diff_id that of the tar written; *blob_size the bytes read. */
int dsec__image_unpack_blob(int fd, const char *tar_out, dsec_digest blob, dsec_digest diff_id,
                            uint64_t *blob_size, dsec_err *err);

/* Unpack the uncompressed layer tar into the empty directory dir, safely:
 * OCI whiteouts become overlay ones, and hostile entries (a ".." component,
 * an absolute path, a write through a symlink, a hard link to anything but
 * an earlier entry of the layer, a char or block device, a trusted.overlay
 * xattr) fail with an error naming the entry. */
int dsec__image_extract_layer(const char *tar, const char *dir, dsec_err *err);

/* Unpack an outer archive (docker save, OCI archive) into dir: regular
 * files, directories and symlinks only, names checked as above. */
int dsec__image_extract_outer(const char *archive, const char *dir, dsec_err *err);

/* The normalized reference (with "@digest" when it had one) and the
 * environment name it gives (HOST[:PORT]/PATH:TAG, ":latest" by default);
 * both dsec_malloc'd (image.c). */
int dsec__image_ref_normalize(const char *ref, char **norm, char **env, dsec_err *err);
/* An image record's document (dsec_malloc'd); -1 when out of memory. */
struct dsec_image_info;
int dsec__image_record_encode(const struct dsec_image_info *i, char **doc, size_t *len);
/* Whether the image layer diff_id is already a dsec layer of format fmt in r: its diff_id
 * record names a layer whose blob is among have[] (dsec_layer_registry_list). 1 with *layer
 * and *size set, 0 when not, -1 with err when the registry fails. */
int dsec__image_diffid_held(dsec_layer_registry *r, const dsec_layer_info *have, size_t nhave,
                            const char *diff_id, dsec_layer_format fmt, dsec_digest layer,
                            uint64_t *size, dsec_err *err);

/* One progress line to o's callback (none when o or its callback is NULL); lines are cut at
 * 511 bytes. Shared by import and pull. */
void dsec__image_progress(const dsec_image_import_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
