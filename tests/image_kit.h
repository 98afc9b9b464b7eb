/* image_kit.h - test images written in-process: layer tars, OCI layouts, OCI and docker archives.
 */
#ifndef DSEC_TESTS_IMAGE_KIT_H
#define DSEC_TESTS_IMAGE_KIT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* One tar entry. type: 'f' file, 'd' dir, 'l' symlink, 'h' hard link, 'c' char dev, 'p' fifo. */
typedef struct ik_entry {
    char type;
    const char *path;
    const char *data; /* file contents; for 'l'/'h' the target */
    mode_t mode;
    unsigned uid, gid;
    const char *from_file; /* file contents from this host file instead */
    const char *xattr;     /* "name=value" or NULL */
} ik_entry;

/* A layer blob in memory. */
typedef struct ik_layer {
    char *blob; /* gzip'd (or plain) tar */
    size_t len;
    char digest[72];  /* of blob */
    char diff_id[72]; /* of the uncompressed tar */
    bool gzip;
    size_t truncate_to; /* nonzero: keep only so many uncompressed bytes (a truncated tar) */
} ik_layer;

/* Build a layer from n entries; gzip'd when gzip. */
/* A formatted path in one of 8 rotating static buffers of 1 KiB (valid for 8 more calls). */
char *ik_pathf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void ik_layer_make(ik_layer *l, const ik_entry *e, size_t n, bool gzip);
void ik_layer_free(ik_layer *l);

/* An image: its config's parts, and what the manifest/index say. */
typedef struct ik_image {
    const char *config_json_extra; /* e.g. "\"Env\":[...],\"User\":\"app\"" inside "config" */
    const char *ref;               /* the annotation / RepoTags; NULL: none */
    const char *layer_media;       /* NULL: the OCI gzip one */
    const char *platform_arch;     /* NULL: amd64 */
    const char *bad_layer_digest;  /* manifest names this digest for layer 0 instead */
    const char *bad_diff_id;       /* the config says this for layer 0 */
    bool nested_index;             /* index -> index -> manifest */
} ik_image;

/* Write an OCI layout into dir (created). */
void ik_write_oci_dir(const char *dir, const ik_image *im, ik_layer *const *layers, size_t n);
/* The layout dir as a tar at path. */
void ik_tar_dir(const char *dir, const char *path);
/* A docker save archive (manifest.json, <hex>.json, <id>/layer.tar) at path. */
void ik_write_docker_archive(const char *path, const ik_image *im, ik_layer *const *layers,
                             size_t n);

#endif
