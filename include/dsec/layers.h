/* layers.h - layers and environments: content digests, the registry interface, environment
 * documents. */
#ifndef DSEC_LAYERS_H
#define DSEC_LAYERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A layer is immutable and named by the sha256 of its blob: "sha256:" and 64
 * lower-case hex digits. A blob is one file in one of two formats:
 *  - EROFS: an EROFS image (mkfs.erofs), mounted read-only with a loop device;
 *  - DIR:   a tar archive of a directory tree, unpacked once per node.
 * Human names "name:version" map to digests (tags). An environment is an
 * ordered list of layers (lowest first) plus environment variables, a working
 * directory and a user; it is a small document stored in the registry under
 * its own "name:version".
 */
#define DSEC_DIGEST_STRLEN 71 /* "sha256:" + 64 hex */
typedef char dsec_digest[DSEC_DIGEST_STRLEN + 1];

typedef enum dsec_layer_format {
    DSEC_LAYER_EROFS = 1,
    DSEC_LAYER_DIR = 2,
} dsec_layer_format;

/* "erofs" / "dir"; parse returns 0 or -1 with err naming the bad word. */
const char *dsec_layer_format_name(dsec_layer_format f);
int dsec_layer_format_parse(const char *s, dsec_layer_format *out, dsec_err *err);

/* Whether s is a well-formed digest string. */
bool dsec_digest_valid(const char *s);
/* Whether s is a well-formed "name:version" (name [a-z0-9._/-]+, version [A-Za-z0-9._-]+). */
bool dsec_layer_name_valid(const char *s);

/* The digest of a file's bytes. */
int dsec_digest_file(const char *path, dsec_digest out, dsec_err *err);
/* The digest string of a raw 32-byte SHA-256 (for callers hashing as they copy). */
void dsec_digest_from_raw(const uint8_t raw[32], dsec_digest out);

/* One entry of a registry listing. */
typedef struct dsec_layer_info {
    dsec_digest digest;
    dsec_layer_format format;
    uint64_t size; /* blob bytes */
    char *name;    /* "name:version" tag pointing at it, or NULL */
} dsec_layer_info;
void dsec_layer_infos_free(dsec_layer_info *v, size_t n);

/*
 * A registry holds blobs, tags and environment documents. Implementations:
 * a local directory (the embedded default) and a shared filesystem path
 * (backends/layers), and a JetStream bucket (bus/). Every implementation is
 * thread-safe. Blobs are verified against their digest by whoever reads them.
 */
typedef struct dsec_layer_registry dsec_layer_registry;

typedef struct dsec_layer_registry_ops {
    const char *kind; /* "local", "shared", "jetstream" */
    /* Copy the blob to the new file dest (created 0644, must not exist). */
    int (*get)(void *self, const char *digest, const char *dest, dsec_err *err);
    /* The blob's path when it can be read in place (a shared filesystem), as a
     * dsec_malloc'd string the caller frees; NULL when it must be fetched. */
    char *(*direct_path)(void *self, const char *digest);
    /* Store the file src as the blob for digest (already computed by the
     * caller). Storing a blob that exists is a success. */
    int (*put)(void *self, const char *digest, dsec_layer_format fmt, const char *src,
               dsec_err *err);
    /* Tags: name:version -> digest. tag_get fails with DSEC_E_NOT_FOUND. */
    int (*tag_set)(void *self, const char *name, const char *digest, dsec_err *err);
    int (*tag_get)(void *self, const char *name, dsec_digest out, dsec_err *err);
    /* Every blob, with its tag when it has one (a blob with several tags is
     * listed once per tag); *out caller-owned (dsec_layer_infos_free). */
    int (*list)(void *self, dsec_layer_info **out, size_t *n, dsec_err *err);
    /* Remove a tag or a blob (by name:version or digest). A blob still named
     * by a tag or an environment is refused with DSEC_E_STATE. */
    int (*remove)(void *self, const char *name_or_digest, dsec_err *err);
    /* Environment documents (opaque bytes, dsec_env_encode/decode), by name:version. */
    int (*env_put)(void *self, const char *name, const void *doc, size_t len, dsec_err *err);
    int (*env_get)(void *self, const char *name, void **doc, size_t *len, dsec_err *err);
    void (*close)(void *self);
    /* Optional (NULL: unsupported). The names of every environment document,
     * sorted; *names and each string dsec_malloc'd, caller frees
     * (dsec_layer_names_free). */
    int (*env_list)(void *self, char ***names, size_t *n, dsec_err *err);
    /* Optional (NULL: unsupported). Small documents by kind ([a-z]+: "image",
     * "diffid") and key (any bytes but NUL, at most DSEC_LAYER_DOC_KEY_MAX):
     * image records and diff_id -> layer records (dsec/image.h). put replaces
     * atomically (readers see the old or the new bytes); get fails with
     * DSEC_E_NOT_FOUND and returns a dsec_malloc'd NUL-terminated *data;
     * list returns the keys sorted (dsec_layer_names_free); remove of a
     * missing key fails with DSEC_E_NOT_FOUND. */
    int (*doc_put)(void *self, const char *kind, const char *key, const void *data, size_t len,
                   dsec_err *err);
    int (*doc_get)(void *self, const char *kind, const char *key, char **data, size_t *len,
                   dsec_err *err);
    int (*doc_list)(void *self, const char *kind, char ***keys, size_t *n, dsec_err *err);
    int (*doc_remove)(void *self, const char *kind, const char *key, dsec_err *err);
    /* Optional (NULL: unsupported). Remove an environment document;
     * DSEC_E_NOT_FOUND when there is none. Its layers stay. */
    int (*env_remove)(void *self, const char *name, dsec_err *err);
} dsec_layer_registry_ops;

#define DSEC_LAYER_DOC_KEY_MAX 255
/* Keys as file names and KV keys: [A-Za-z0-9_-] as they are, any other byte
 * as "=XX" (upper-case hex). encode: 0, or -1 when key is empty or out is
 * too small; decode: a dsec_malloc'd key, NULL when malformed or no memory. */
int dsec_layer_doc_key_encode(const char *key, char *out, size_t outlen);
char *dsec_layer_doc_key_decode(const char *enc);

/* Wrap an implementation (ops static, self owned by the registry: close frees it). */
int dsec_layer_registry_new(dsec_layer_registry **out, const dsec_layer_registry_ops *ops,
                            void *self, dsec_err *err);
/* Close; NULL is a no-op. */
void dsec_layer_registry_free(dsec_layer_registry *r);
const char *dsec_layer_registry_kind(const dsec_layer_registry *r);

/* The local directory registry at dir (created). */
int dsec_layer_registry_local(dsec_layer_registry **out, const char *dir, dsec_err *err);
/* The shared-filesystem registry at dir (NFS, CephFS, 3FS mount): same
 * layout as local, but EROFS blobs are mounted straight from it. */
int dsec_layer_registry_shared(dsec_layer_registry **out, const char *dir, dsec_err *err);

/* Wrappers (argument checks, then the op). */
int dsec_layer_registry_get(dsec_layer_registry *r, const char *digest, const char *dest,
                            dsec_err *err);
char *dsec_layer_registry_direct_path(dsec_layer_registry *r, const char *digest);
int dsec_layer_registry_put(dsec_layer_registry *r, const char *digest, dsec_layer_format fmt,
                            const char *src, dsec_err *err);
int dsec_layer_registry_tag_set(dsec_layer_registry *r, const char *name, const char *digest,
                                dsec_err *err);
/* Resolve "name:version" or pass a digest through. */
int dsec_layer_registry_resolve(dsec_layer_registry *r, const char *name_or_digest, dsec_digest out,
                                dsec_err *err);
int dsec_layer_registry_list(dsec_layer_registry *r, dsec_layer_info **out, size_t *n,
                             dsec_err *err);
int dsec_layer_registry_remove(dsec_layer_registry *r, const char *name_or_digest, dsec_err *err);

/* An environment. Every string is owned by the struct (dsec_env_free). */
typedef struct dsec_env {
    char *name;                 /* "name:version" */
    char **layers;              /* digests, lowest first */
    dsec_layer_format *formats; /* one per layer */
    size_t nlayers;
    char **vars; /* "KEY=VALUE" */
    size_t nvars;
    char *workdir; /* "/" when unset */
    char *user;    /* "root" when unset */
    /* From an imported image (dsec/image.h); all may be empty/NULL. */
    char **cmd; /* the default command: Entrypoint then Cmd */
    size_t ncmd;
    size_t nentry; /* how many of cmd's first arguments are the Entrypoint (<= ncmd) */
    char **labels; /* "KEY=VALUE" */
    size_t nlabels;
    char *image;        /* the image reference it came from */
    char *image_digest; /* the manifest digest it is pinned to */
} dsec_env;
void dsec_env_free(dsec_env *e);

/* Store env under env->name; every layer must already be in r. env->formats
 * may be NULL: the registry's formats are filled in; when given they must
 * match the registry's. */
int dsec_layer_registry_env_put(dsec_layer_registry *r, const dsec_env *env, dsec_err *err);
/* Look up an environment by name:version; *out caller-owned. */
int dsec_layer_registry_env_get(dsec_layer_registry *r, const char *name, dsec_env **out,
                                dsec_err *err);
/* Every environment's name (fails with DSEC_E_UNSUPPORTED when the registry
 * cannot list them); *names caller-owned (dsec_layer_names_free). */
int dsec_layer_registry_env_list(dsec_layer_registry *r, char ***names, size_t *n, dsec_err *err);
void dsec_layer_names_free(char **names, size_t n);

/* Documents (the ops' doc_* above): DSEC_E_UNSUPPORTED when the registry has none. */
int dsec_layer_registry_doc_put(dsec_layer_registry *r, const char *kind, const char *key,
                                const void *data, size_t len, dsec_err *err);
int dsec_layer_registry_doc_get(dsec_layer_registry *r, const char *kind, const char *key,
                                char **data, size_t *len, dsec_err *err);
int dsec_layer_registry_doc_list(dsec_layer_registry *r, const char *kind, char ***keys, size_t *n,
                                 dsec_err *err);
int dsec_layer_registry_doc_remove(dsec_layer_registry *r, const char *kind, const char *key,
                                   dsec_err *err);
/* Remove an environment (its layers stay); DSEC_E_UNSUPPORTED when the registry cannot. */
int dsec_layer_registry_env_remove(dsec_layer_registry *r, const char *name, dsec_err *err);

/*
 * The environment document: versioned, line-oriented text, one field a line,
 *     dsec-env 1
 *     name python:3
 *     layer sha256:<hex> erofs      (one per layer, lowest first; at least one)
 *     env KEY=VALUE                 (any number)
 *     workdir /
 *     user root
 * every line ending in '\n'. Values cannot hold newlines or NULs.
 * A document with any of the image fields is "dsec-env 2" and adds
 *     cmd ARG                       (one per argument, in order)
 *     label KEY=VALUE               (any number)
 *     image REF                     (the image reference)
 *     pin sha256:<hex>              (the manifest digest)
 * where cmd and label values escape '\\' as "\\\\" and newline as "\\n".
 * Documents without them stay "dsec-env 1"; decode takes both. encode
 * validates env and returns a dsec_malloc'd *doc (caller frees, NUL-terminated,
 * *len without the NUL); decode refuses malformed documents with
 * DSEC_E_DECODE naming the line, and returns a caller-owned *out (dsec_env_free).
 */
/* The line documents' values (environment cmd and label, image records): "KEY VALUE\n" with
 * '\\' and newline escaped so each value stays one line; unescape is the inverse (NULL on a
 * bad escape, *bad set, or no memory; dsec_malloc'd). */
void dsec_doc_put_escaped(FILE *f, const char *key, const char *v);
char *dsec_doc_unescape(const char *v, size_t n, bool *bad);
int dsec_env_encode(const dsec_env *env, char **doc, size_t *len, dsec_err *err);
int dsec_env_decode(const void *doc, size_t len, dsec_env **out, dsec_err *err);

/*
 * Building layers. src is a directory or a tarball (.tar, .tar.gz); out_blob
 * is written (it must not exist) and its digest returned. Builds are
 * reproducible: the same tree gives the same digest (sorted entries, fixed
 * timestamps, numeric owners). exclude: glob patterns (fnmatch without
 * FNM_PATHNAME, so '*' also matches '/') matched against each path relative
 * to src ("usr/lib/x.pyc", no leading "./"); a pattern without '/' also
 * matches the last component alone. A matched path is left out of the layer
 * with everything below it. Examples: "*.pyc", "__pycache__", "tmp/?*"
 * (the contents of tmp, not tmp itself). exclude may be NULL.
 * Ownership, modes, symlinks, hard links, device nodes and xattrs are kept
 * (overlay whiteouts too). The caller deletes out_blob.
 */
int dsec_layer_build(const char *src, dsec_layer_format fmt, const char *const *exclude,
                     size_t nexclude, const char *out_blob, dsec_digest digest, dsec_err *err);

#ifdef __cplusplus
}
#endif
#endif
