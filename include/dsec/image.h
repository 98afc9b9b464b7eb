/* image.h - OCI and Docker images as dsec environments: import from archives, layouts and
 * registries. */
#ifndef DSEC_IMAGE_H
#define DSEC_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsec/client.h"
#include "dsec/err.h"
#include "dsec/layers.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * An image is imported into a layer registry (dsec/layers.h) as:
 *  - one dsec layer per image layer (OCI whiteouts turned into overlay ones),
 *    recorded by the layer's diff_id (the sha256 of its uncompressed tar) so
 *    that a layer already imported is neither converted nor stored again;
 *  - an environment named by the image reference, with the config's Env,
 *    WorkingDir, User, Entrypoint/Cmd and labels, pinned to the manifest
 *    digest;
 *  - an image record (this header's dsec_image_info), listed by
 *    dsec_image_list.
 * Nothing is visible until the whole image is in: layers first, then the
 * environment, then the record (no layer tag is made). docs/images.md says
 * the rest.
 *
 * References: [HOST[:PORT]/]PATH[:TAG][@sha256:HEX], as Docker writes them;
 * a reference without a tag or digest means ":latest".
 */

typedef struct dsec_image_import_opts {
    /* The reference to record the image under. NULL: the archive's own
     * (docker-archive RepoTags[0], OCI annotation
     * org.opencontainers.image.ref.name); none at all is an error naming
     * the archive. */
    const char *ref;
    /* The format of the layers made; 0 means DSEC_LAYER_EROFS. */
    dsec_layer_format format;
    /* "linux/amd64" when NULL; an index is resolved to this platform. */
    const char *platform;
    /* Scratch space (created if missing); NULL: a directory under $TMPDIR
     * or /var/tmp. Whatever the import made there is removed. */
    const char *work_dir;
    /* Called with one line of progress ("layer 2/5 sha256:… converted");
     * may be NULL. */
    void (*progress)(void *arg, const char *line);
    void *progress_arg;
} dsec_image_import_opts;

typedef struct dsec_image_layer {
    dsec_digest diff_id; /* sha256 of the uncompressed layer tar */
    dsec_digest layer;   /* the dsec layer it became */
    uint64_t size;       /* the dsec layer blob's bytes */
    bool reused;         /* already in the registry: not converted or stored again */
} dsec_image_layer;

/* An imported image. Every pointer is owned by the struct (dsec_image_info_free). */
typedef struct dsec_image_info {
    char *ref;                /* normalized: HOST[:PORT]/PATH:TAG, or PATH:TAG */
    dsec_digest manifest;     /* the image manifest's digest (not the index's) */
    dsec_digest config;       /* the config blob's digest (the image id) */
    char *env;                /* the environment's name (== ref) */
    dsec_image_layer *layers; /* lowest first */
    size_t nlayers;
    char **cmd; /* Entrypoint followed by Cmd; may be empty */
    size_t ncmd;
    char **labels; /* "KEY=VALUE" */
    size_t nlabels;
    int64_t created_unix; /* when the import finished */
} dsec_image_info;
void dsec_image_info_free(dsec_image_info *i);
void dsec_image_infos_free(dsec_image_info *v, size_t n);

/*
 * Import path into r: a docker-archive tar (`docker save`, with
 * manifest.json), an OCI image layout directory, or an OCI archive (that
 * directory as a tar). The kind is found from the contents. Layers may be
 * plain, gzip or zstd tars; Docker schema 2 and OCI media types are both
 * taken. Every blob's digest is checked as it is read. Hostile entries (a
 * ".." component, an absolute path, a hard link out of the layer, a device
 * node that is not a whiteout, an entry written through a symlink) fail the
 * import with an error naming the image, the layer and the entry. *out
 * (may be NULL) is caller-owned.
 */
int dsec_image_import(dsec_layer_registry *r, const char *path, const dsec_image_import_opts *o,
                      dsec_image_info **out, dsec_err *err);

/* Every imported image, sorted by reference; *out caller-owned. */
int dsec_image_list(dsec_layer_registry *r, dsec_image_info **out, size_t *n, dsec_err *err);
/* One image by reference (normalized first) or by manifest digest; DSEC_E_NOT_FOUND. */
int dsec_image_get(dsec_layer_registry *r, const char *ref, dsec_image_info **out, dsec_err *err);
/* Remove the record, then its environment; its layers stay while another
 * image, environment or tag holds them, and otherwise go too (with their
 * diff_id records). */
int dsec_image_remove(dsec_layer_registry *r, const char *ref, dsec_err *err);

/* Record an image made here rather than imported (`dsec image build`): info->env must
 * already be in r; manifest and config are the maker's content digests (a build gives the
 * digest of its environment document). Replaces a record of the same reference. */
int dsec_image_record(dsec_layer_registry *r, const dsec_image_info *info, dsec_err *err);

/* Parse a reference into its parts (dsec_malloc'd, caller frees; tag or
 * digest may come back NULL, not both); host NULL when none was named. */
int dsec_image_ref_parse(const char *ref, char **host, char **path, char **tag, char **digest,
                         dsec_err *err);

/*
 * Pull from an OCI distribution registry (HTTP API v2) and import, as
 * dsec_image_import does, recording the image under ref (normalized).
 */
typedef struct dsec_image_pull_opts {
    dsec_image_import_opts import; /* import.ref is ignored: the pulled ref is used */
    const char *username;          /* basic or token credentials; NULL: from auth_file */
    const char *password;
    const char *auth_file; /* docker-style config.json ("auths"); NULL: $DOCKER_CONFIG/config.json,
                              ~/.docker/config.json */
    const char *ca_file;   /* PEM bundle to trust; NULL: the system's */
    bool plain_http;       /* http:// instead of https:// (only when asked) */
    unsigned timeout_s;    /* a stalled transfer fails after this many seconds; 0: 60 */
} dsec_image_pull_opts;
int dsec_image_pull(dsec_layer_registry *r, const char *ref, const dsec_image_pull_opts *o,
                    dsec_image_info **out, dsec_err *err);

/*
 * Registries for libdsec users (client/images.c); free with dsec_layer_registry_free.
 *
 * dsec_layer_registry_open: where is a directory (a local registry there, created when
 * missing, as dsec_layer_registry_local) or nats://HOST:PORT[?bucket=NAME] (a cell's JetStream
 * registry, bucket DSEC_LAYERS by default, over a connection of its own that
 * dsec_layer_registry_free closes). Anything else fails with DSEC_E_INVALID naming where.
 *
 * dsec_client_layer_registry: the cell's JetStream registry over c's own connection; bucket
 * NULL means "DSEC_LAYERS" (the cell's layers.bucket default). c must outlive *out.
 */
int dsec_layer_registry_open(dsec_layer_registry **out, const char *where, dsec_err *err);
int dsec_client_layer_registry(dsec_client *c, const char *bucket, dsec_layer_registry **out,
                               dsec_err *err);

#ifdef __cplusplus
}
#endif
#endif
