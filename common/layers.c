/* layers.c - the generic part of layers: digests, names, the registry wrappers, environment
 * documents. */
#define _GNU_SOURCE
#include "dsec/io.h"
#include "dsec/layers.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsec/alloc.h"
#include "dsec/sha256.h"

#define NAME_MAX_LEN 255
#define ENV_DOC_MAX (1u << 20)
#define ENV_MAX_LAYERS 128
#define ENV_MAX_VARS 4096

struct dsec_layer_registry {
    const dsec_layer_registry_ops *ops;
    void *self;
};

/* ---- formats, digests, names ------------------------------------------------------------- */

const char *dsec_layer_format_name(dsec_layer_format f)
{
    switch (f) {
    case DSEC_LAYER_EROFS:
        return "erofs";
    case DSEC_LAYER_DIR:
        return "dir";
    }
    return "unknown";
}

int dsec_layer_format_parse(const char *s, dsec_layer_format *out, dsec_err *err)
{
    if (s != NULL && strcmp(s, "erofs") == 0)
        *out = DSEC_LAYER_EROFS;
    else if (s != NULL && strcmp(s, "dir") == 0)
        *out = DSEC_LAYER_DIR;
    else
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "unknown layer format \"%s\" (want erofs or dir)",
                            s != NULL ? s : "(null)");
    return 0;
}

bool dsec_digest_valid(const char *s)
{
    if (s == NULL || strncmp(s, "sha256:", 7) != 0 || strlen(s) != DSEC_DIGEST_STRLEN)
        return false;
    for (const char *p = s + 7; *p != '\0'; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return false;
    return true;
}

static bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
}

/* Names become paths in directory registries (tags/<name>/<version>), so
 * beyond the character sets a component may not be empty, "." or "..". */
static bool component_ok(const char *s, size_t n, bool version)
{
    if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!(name_char(c) || (version && c >= 'A' && c <= 'Z')))
            return false;
    }
    return true;
}

/* An image reference's registry host may carry a port: "host:PORT" as the
 * first of at least two components ("127.0.0.1:5000/swe/task:1"). */
static bool host_port_ok(const char *s, size_t n)
{
    const char *c = memchr(s, ':', n);
    if (c == NULL)
        return component_ok(s, n, false);
    size_t pl = n - (size_t)(c - s) - 1;
    if (pl == 0 || pl > 5 || !component_ok(s, (size_t)(c - s), false))
        return false;
    for (size_t i = 1; i <= pl; i++)
        if (c[i] < '0' || c[i] > '9')
            return false;
    return true;
}

bool dsec_layer_name_valid(const char *s)
{
    if (s == NULL || strlen(s) > NAME_MAX_LEN)
        return false;
    const char *colon = strrchr(s, ':');
    if (colon == NULL || colon == s || !component_ok(colon + 1, strlen(colon + 1), true))
        return false;
    const char *p = s;
    bool first = true;
    while (p < colon) {
        const char *slash = memchr(p, '/', (size_t)(colon - p));
        const char *end = slash != NULL ? slash : colon;
        bool ok = first && slash != NULL ? host_port_ok(p, (size_t)(end - p))
                                         : component_ok(p, (size_t)(end - p), false);
        if (!ok)
            return false;
        first = false;
        p = slash != NULL ? slash + 1 : colon;
        if (slash != NULL && p == colon)
            return false; /* trailing '/' */
    }
    return true;
}

void dsec_digest_from_raw(const uint8_t raw[32], dsec_digest out)
{
    static const char hex[] = "0123456789abcdef";
    memcpy(out, "sha256:", 7);
    for (int i = 0; i < 32; i++) {
        out[7 + 2 * i] = hex[raw[i] >> 4];
        out[8 + 2 * i] = hex[raw[i] & 15];
    }
    out[DSEC_DIGEST_STRLEN] = '\0';
}

int dsec_digest_file(const char *path, dsec_digest out, dsec_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "opening %s to digest it", path);
    enum { BUF = 1 << 20 };
    uint8_t *buf = dsec_malloc(BUF);
    if (buf == NULL) {
        close(fd);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "digesting %s: out of memory", path);
    }
    dsec_sha256 c;
    dsec_sha256_init(&c);
    int rc = 0;
    for (;;) {
        ssize_t n = dsec_read_eintr(fd, buf, BUF);
        if (n < 0) {
            rc = dsec_err_set(err, DSEC_E_IO, errno, "reading %s to digest it", path);
            break;
        }
        if (n == 0)
            break;
        dsec_sha256_update(&c, buf, (size_t)n);
    }
    dsec_free(buf);
    close(fd);
    if (rc == 0) {
        uint8_t raw[DSEC_SHA256_LEN];
        dsec_sha256_final(&c, raw);
        dsec_digest_from_raw(raw, out);
    }
    return rc;
}

void dsec_layer_infos_free(dsec_layer_info *v, size_t n)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        dsec_free(v[i].name);
    dsec_free(v);
}

void dsec_layer_names_free(char **names, size_t n)
{
    if (names == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        dsec_free(names[i]);
    dsec_free(names);
}

/* ---- argument checks ---------------------------------------------------------------------- */

static int check_digest(const char *what, const char *s, dsec_err *err)
{
    if (dsec_digest_valid(s))
        return 0;
    return dsec_err_set(err, DSEC_E_INVALID, 0,
                        "%s: \"%.80s\" is not a layer digest (want sha256: and 64 lower-case hex "
                        "digits)",
                        what, s != NULL ? s : "(null)");
}

static int check_name(const char *what, const char *s, dsec_err *err)
{
    if (dsec_layer_name_valid(s))
        return 0;
    return dsec_err_set(err, DSEC_E_INVALID, 0,
                        "%s: \"%.80s\" is not a name:version (name of [a-z0-9._-] parts joined by "
                        "'/', the first may be HOST:PORT; version of [A-Za-z0-9._-], neither \".\" "
                        "nor \"..\")",
                        what, s != NULL ? s : "(null)");
}

/* A blob must be what its format says: the EROFS superblock magic at 1024,
 * or an (uncompressed) tar header's "ustar" at 257. Cheap, and it keeps a
 * mislabelled file from reaching nodes as a layer that cannot be mounted. */
static int check_magic(const char *path, dsec_layer_format fmt, dsec_err *err)
{
    unsigned char b[1028];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "opening layer file %s", path);
    ssize_t n = pread(fd, b, sizeof b, 0);
    close(fd);
    if (fmt == DSEC_LAYER_EROFS &&
        !(n >= 1028 && b[1024] == 0xe2 && b[1025] == 0xe1 && b[1026] == 0xf5 && b[1027] == 0xe0))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s is not an EROFS image", path);
    if (fmt == DSEC_LAYER_DIR && !(n >= 262 && memcmp(b + 257, "ustar", 5) == 0))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "%s is not a tar archive (format dir wants an uncompressed tar)", path);
    return 0;
}

/* ---- the registry wrappers ---------------------------------------------------------------- */

int dsec_layer_registry_new(dsec_layer_registry **out, const dsec_layer_registry_ops *ops,
                            void *self, dsec_err *err)
{
    *out = NULL;
    if (ops == NULL || ops->get == NULL || ops->put == NULL || ops->tag_set == NULL ||
        ops->tag_get == NULL || ops->list == NULL || ops->remove == NULL || ops->env_put == NULL ||
        ops->env_get == NULL || ops->close == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "layer registry: incomplete ops table");
    dsec_layer_registry *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "layer registry: out of memory");
    r->ops = ops;
    r->self = self;
    *out = r;
    return 0;
}

void dsec_layer_registry_free(dsec_layer_registry *r)
{
    if (r == NULL)
        return;
    r->ops->close(r->self);
    dsec_free(r);
}

const char *dsec_layer_registry_kind(const dsec_layer_registry *r)
{
    return r->ops->kind != NULL ? r->ops->kind : "unknown";
}

int dsec_layer_registry_get(dsec_layer_registry *r, const char *digest, const char *dest,
                            dsec_err *err)
{
    if (check_digest("fetching a layer", digest, err) < 0)
        return -1;
    if (dest == NULL || dest[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "fetching layer %s: no destination path",
                            digest);
    return r->ops->get(r->self, digest, dest, err);
}

char *dsec_layer_registry_direct_path(dsec_layer_registry *r, const char *digest)
{
    if (r->ops->direct_path == NULL || !dsec_digest_valid(digest))
        return NULL;
    return r->ops->direct_path(r->self, digest);
}

int dsec_layer_registry_put(dsec_layer_registry *r, const char *digest, dsec_layer_format fmt,
                            const char *src, dsec_err *err)
{
    if (check_digest("storing a layer", digest, err) < 0)
        return -1;
    if (fmt != DSEC_LAYER_EROFS && fmt != DSEC_LAYER_DIR)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "storing layer %s: unknown format %d", digest,
                            (int)fmt);
    if (src == NULL || src[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "storing layer %s: no source file", digest);
    if (check_magic(src, fmt, err) < 0)
        return dsec_err_wrap(err, "storing layer %s", digest);
    return r->ops->put(r->self, digest, fmt, src, err);
}

int dsec_layer_registry_tag_set(dsec_layer_registry *r, const char *name, const char *digest,
                                dsec_err *err)
{
    if (check_name("tagging a layer", name, err) < 0 ||
        check_digest("tagging a layer", digest, err) < 0)
        return -1;
    return r->ops->tag_set(r->self, name, digest, err);
}

int dsec_layer_registry_resolve(dsec_layer_registry *r, const char *name_or_digest, dsec_digest out,
                                dsec_err *err)
{
    if (dsec_digest_valid(name_or_digest)) {
        memcpy(out, name_or_digest, DSEC_DIGEST_STRLEN + 1);
        return 0;
    }
    if (!dsec_layer_name_valid(name_or_digest))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "\"%.80s\" is neither a layer name:version nor a sha256: digest",
                            name_or_digest != NULL ? name_or_digest : "(null)");
    if (r->ops->tag_get(r->self, name_or_digest, out, err) < 0)
        return -1;
    if (!dsec_digest_valid(out))
        return dsec_err_set(err, DSEC_E_DECODE, 0, "tag %s holds a malformed digest",
                            name_or_digest);
    return 0;
}

int dsec_layer_registry_list(dsec_layer_registry *r, dsec_layer_info **out, size_t *n,
                             dsec_err *err)
{
    *out = NULL;
    *n = 0;
    return r->ops->list(r->self, out, n, err);
}

int dsec_layer_registry_remove(dsec_layer_registry *r, const char *name_or_digest, dsec_err *err)
{
    if (!dsec_digest_valid(name_or_digest) && !dsec_layer_name_valid(name_or_digest))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "removing \"%.80s\": neither a layer name:version nor a sha256: digest",
                            name_or_digest != NULL ? name_or_digest : "(null)");
    return r->ops->remove(r->self, name_or_digest, err);
}

int dsec_layer_registry_env_list(dsec_layer_registry *r, char ***names, size_t *n, dsec_err *err)
{
    *names = NULL;
    *n = 0;
    if (r->ops->env_list == NULL)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "the %s layer registry cannot list environments",
                            dsec_layer_registry_kind(r));
    return r->ops->env_list(r->self, names, n, err);
}

/* ---- documents ---------------------------------------------------------------------------- */

int dsec_layer_doc_key_encode(const char *key, char *out, size_t outlen)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)key; *p != '\0'; p++) {
        bool plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                     (*p >= '0' && *p <= '9') || *p == '_' || *p == '-';
        if (k + (plain ? 1 : 3) >= outlen)
            return -1;
        if (plain) {
            out[k++] = (char)*p;
        } else {
            out[k++] = '=';
            out[k++] = hex[*p >> 4];
            out[k++] = hex[*p & 15];
        }
    }
    if (k == 0 || k >= outlen)
        return -1;
    out[k] = '\0';
    return 0;
}

static int unhex(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

char *dsec_layer_doc_key_decode(const char *enc)
{
    size_t n = strlen(enc);
    char *o = dsec_malloc(n + 1);
    size_t k = 0;
    if (o == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (enc[i] != '=') {
            o[k++] = enc[i];
            continue;
        }
        int hi = i + 2 < n ? unhex(enc[i + 1]) : -1, lo = hi >= 0 ? unhex(enc[i + 2]) : -1;
        if (lo < 0 || (hi == 0 && lo == 0)) {
            dsec_free(o);
            return NULL;
        }
        o[k++] = (char)(hi << 4 | lo);
        i += 2;
    }
    o[k] = '\0';
    return o;
}

static int check_doc(dsec_layer_registry *r, bool supported, const char *kind, const char *key,
                     dsec_err *err)
{
    if (!supported)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "the %s layer registry cannot store image records",
                            dsec_layer_registry_kind(r));
    if (kind == NULL || kind[0] == '\0' ||
        strspn(kind, "abcdefghijklmnopqrstuvwxyz") != strlen(kind))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "document kind \"%.40s\" is not [a-z]+",
                            kind != NULL ? kind : "(null)");
    char enc[DSEC_LAYER_DOC_KEY_MAX * 3 + 1];
    if (key != NULL && dsec_layer_doc_key_encode(key, enc, sizeof enc) < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "%s document key \"%.80s\" is empty or longer than %d bytes", kind, key,
                            DSEC_LAYER_DOC_KEY_MAX);
    return 0;
}

int dsec_layer_registry_doc_put(dsec_layer_registry *r, const char *kind, const char *key,
                                const void *data, size_t len, dsec_err *err)
{
    if (check_doc(r, r->ops->doc_put != NULL, kind, key, err) < 0)
        return -1;
    if (key == NULL || data == NULL || len > ENV_DOC_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "storing %s document: no key, no data, or "
                            "over %u bytes",
                            kind, ENV_DOC_MAX);
    return r->ops->doc_put(r->self, kind, key, data, len, err);
}

int dsec_layer_registry_doc_get(dsec_layer_registry *r, const char *kind, const char *key,
                                char **data, size_t *len, dsec_err *err)
{
    *data = NULL;
    *len = 0;
    if (check_doc(r, r->ops->doc_get != NULL, kind, key, err) < 0)
        return -1;
    if (key == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "reading a %s document: no key", kind);
    return r->ops->doc_get(r->self, kind, key, data, len, err);
}

int dsec_layer_registry_doc_list(dsec_layer_registry *r, const char *kind, char ***keys, size_t *n,
                                 dsec_err *err)
{
    *keys = NULL;
    *n = 0;
    if (check_doc(r, r->ops->doc_list != NULL, kind, NULL, err) < 0)
        return -1;
    return r->ops->doc_list(r->self, kind, keys, n, err);
}

int dsec_layer_registry_doc_remove(dsec_layer_registry *r, const char *kind, const char *key,
                                   dsec_err *err)
{
    if (check_doc(r, r->ops->doc_remove != NULL, kind, key, err) < 0)
        return -1;
    if (key == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "removing a %s document: no key", kind);
    return r->ops->doc_remove(r->self, kind, key, err);
}

int dsec_layer_registry_env_remove(dsec_layer_registry *r, const char *name, dsec_err *err)
{
    if (check_name("removing an environment", name, err) < 0)
        return -1;
    if (r->ops->env_remove == NULL)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "the %s layer registry cannot remove environments",
                            dsec_layer_registry_kind(r));
    return r->ops->env_remove(r->self, name, err);
}

/* ---- environments ------------------------------------------------------------------------- */

void dsec_env_free(dsec_env *e)
{
    if (e == NULL)
        return;
    dsec_free(e->name);
    for (size_t i = 0; i < e->nlayers; i++)
        dsec_free(e->layers[i]);
    dsec_free(e->layers);
    dsec_free(e->formats);
    for (size_t i = 0; i < e->nvars; i++)
        dsec_free(e->vars[i]);
    dsec_free(e->vars);
    dsec_free(e->workdir);
    dsec_free(e->user);
    dsec_layer_names_free(e->cmd, e->ncmd);
    dsec_layer_names_free(e->labels, e->nlabels);
    dsec_free(e->image);
    dsec_free(e->image_digest);
    dsec_free(e);
}

static bool var_ok(const char *v)
{
    const char *eq = strchr(v, '=');
    if (eq == NULL || eq == v)
        return false;
    for (const char *p = v; p < eq; p++) {
        char c = *p;
        bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
        if (!(alpha || (p > v && c >= '0' && c <= '9')))
            return false;
    }
    return strchr(eq, '\n') == NULL;
}

static bool user_ok(const char *u)
{
    if (u[0] == '\0' || strlen(u) > 64)
        return false;
    for (const char *p = u; *p != '\0'; p++)
        if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '-' || *p == '.' || *p == ':'))
            return false;
    return true;
}

static bool workdir_ok(const char *w)
{
    return w[0] == '/' && strlen(w) < 4096 && strchr(w, '\n') == NULL;
}

/* The checks shared by encode and decode; formats may be NULL (not yet filled). */
static int env_validate(const dsec_env *e, dsec_err *err)
{
    if (check_name("environment", e->name, err) < 0)
        return -1;
    if (e->nlayers == 0 || e->layers == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "environment %s has no layers", e->name);
    if (e->nlayers > ENV_MAX_LAYERS)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "environment %s has %zu layers (at most %d)",
                            e->name, e->nlayers, ENV_MAX_LAYERS);
    for (size_t i = 0; i < e->nlayers; i++) {
        if (!dsec_digest_valid(e->layers[i]))
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "environment %s: layer %zu \"%.80s\" is not a sha256: digest",
                                e->name, i + 1, e->layers[i] != NULL ? e->layers[i] : "(null)");
        if (e->formats != NULL && e->formats[i] != DSEC_LAYER_EROFS &&
            e->formats[i] != DSEC_LAYER_DIR)
            return dsec_err_set(err, DSEC_E_INVALID, 0, "environment %s: layer %zu has format %d",
                                e->name, i + 1, (int)e->formats[i]);
    }
    if (e->nvars > ENV_MAX_VARS)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "environment %s has %zu variables (at most %d)", e->name, e->nvars,
                            ENV_MAX_VARS);
    for (size_t i = 0; i < e->nvars; i++)
        if (e->vars[i] == NULL || !var_ok(e->vars[i]))
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "environment %s: variable \"%.80s\" is not KEY=VALUE (KEY of "
                                "[A-Za-z0-9_] not starting with a digit, no newline in VALUE)",
                                e->name, e->vars[i] != NULL ? e->vars[i] : "(null)");
    if (e->workdir != NULL && !workdir_ok(e->workdir))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "environment %s: workdir \"%.80s\" is not an absolute path", e->name,
                            e->workdir);
    if (e->user != NULL && !user_ok(e->user))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "environment %s: user \"%.80s\" is not a user name or uid[:gid]",
                            e->name, e->user);
    if (e->ncmd > ENV_MAX_VARS || e->nlabels > ENV_MAX_VARS)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "environment %s: more than %d command arguments or labels", e->name,
                            ENV_MAX_VARS);
    if (e->nentry > e->ncmd)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "environment %s: an entrypoint of %zu arguments in a command of %zu",
                            e->name, e->nentry, e->ncmd);
    for (size_t i = 0; i < e->ncmd; i++)
        if (e->cmd[i] == NULL)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "environment %s: command argument %zu is "
                                "missing",
                                e->name, i + 1);
    for (size_t i = 0; i < e->nlabels; i++)
        if (e->labels[i] == NULL || strchr(e->labels[i], '=') == NULL)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "environment %s: label \"%.80s\" is not "
                                "KEY=VALUE",
                                e->name, e->labels[i] ? e->labels[i] : "(null)");
    if (e->image != NULL && (e->image[0] == '\0' || strpbrk(e->image, " \n") != NULL))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "environment %s: image reference \"%.80s\" "
                            "is empty or holds a space",
                            e->name, e->image);
    if (e->image_digest != NULL && !dsec_digest_valid(e->image_digest))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "environment %s: pin \"%.80s\" is not a "
                            "sha256: digest",
                            e->name, e->image_digest);
    return 0;
}

void dsec_doc_put_escaped(FILE *f, const char *key, const char *v)
{
    fprintf(f, "%s ", key);
    for (; *v != '\0'; v++) {
        if (*v == '\\')
            fputs("\\\\", f);
        else if (*v == '\n')
            fputs("\\n", f);
        else
            fputc(*v, f);
    }
    fputc('\n', f);
}

char *dsec_doc_unescape(const char *v, size_t n, bool *bad)
{
    char *o = dsec_malloc(n + 1);
    size_t k = 0;
    *bad = false;
    if (o == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (v[i] != '\\') {
            o[k++] = v[i];
            continue;
        }
        if (i + 1 < n && (v[i + 1] == '\\' || v[i + 1] == 'n')) {
            o[k++] = v[i + 1] == 'n' ? '\n' : '\\';
            i++;
            continue;
        }
        *bad = true;
        dsec_free(o);
        return NULL;
    }
    o[k] = '\0';
    return o;
}

int dsec_env_encode(const dsec_env *env, char **doc, size_t *len, dsec_err *err)
{
    *doc = NULL;
    *len = 0;
    if (env == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "encoding an environment: none given");
    if (env_validate(env, err) < 0)
        return -1;
    if (env->formats == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "environment %s: layer formats not set",
                            env->name);
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    if (f == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, errno, "encoding environment %s", env->name);
    bool v2 = env->ncmd > 0 || env->nlabels > 0 || env->image != NULL || env->image_digest != NULL;
    fprintf(f, "dsec-env %d\nname %s\n", v2 ? 2 : 1, env->name);
    for (size_t i = 0; i < env->nlayers; i++)
        fprintf(f, "layer %s %s\n", env->layers[i], dsec_layer_format_name(env->formats[i]));
    for (size_t i = 0; i < env->nvars; i++)
        fprintf(f, "env %s\n", env->vars[i]);
    fprintf(f, "workdir %s\nuser %s\n", env->workdir != NULL ? env->workdir : "/",
            env->user != NULL ? env->user : "root");
    for (size_t i = 0; i < env->ncmd; i++)
        dsec_doc_put_escaped(f, "cmd", env->cmd[i]);
    if (env->nentry > 0)
        fprintf(f, "entrypoint %zu\n", env->nentry);
    for (size_t i = 0; i < env->nlabels; i++)
        dsec_doc_put_escaped(f, "label", env->labels[i]);
    if (env->image != NULL)
        fprintf(f, "image %s\n", env->image);
    if (env->image_digest != NULL)
        fprintf(f, "pin %s\n", env->image_digest);
    if (fclose(f) != 0 || buf == NULL) {
        free(buf); /* open_memstream's buffer comes from libc */
        return dsec_err_set(err, DSEC_E_NOMEM, errno, "encoding environment %s", env->name);
    }
    if (size > ENV_DOC_MAX) {
        free(buf);
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "environment %s: document of %zu bytes (at most %u)", env->name, size,
                            ENV_DOC_MAX);
    }
    *doc = dsec_strndup(buf, size);
    free(buf);
    if (*doc == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "encoding environment %s", env->name);
    *len = size;
    return 0;
}

static int push_str(char ***v, size_t *n, const char *s, size_t len)
{
    char **nv = dsec_realloc(*v, (*n + 1) * sizeof **v);
    if (nv == NULL)
        return -1;
    *v = nv;
    nv[*n] = dsec_strndup(s, len);
    if (nv[*n] == NULL)
        return -1;
    (*n)++;
    return 0;
}

/* One line of an environment document: "KEY VALUE", its number, and the document's version. */
struct env_line {
    const char *key, *val;
    size_t kl, vl;
    int lineno;
    bool v2;
};

static bool key_is(const struct env_line *l, const char *k)
{
    return l->kl == strlen(k) && memcmp(l->key, k, l->kl) == 0;
}

static int env_nomem(dsec_err *err)
{
    return dsec_err_set(err, DSEC_E_NOMEM, 0, "decoding an environment document: out of memory");
}

/* "layer DIGEST FORMAT"; fcap: how many formats e->formats has room for. */
static int env_take_layer(dsec_env *e, const struct env_line *l, size_t *fcap, dsec_err *err)
{
    const char *val = l->val;
    size_t vl = l->vl;
    const char *sp2 = memchr(val, ' ', vl);
    char fmt[16];
    size_t dl = sp2 != NULL ? (size_t)(sp2 - val) : vl;
    size_t fl = sp2 != NULL ? (size_t)(val + vl - sp2 - 1) : 0;
    if (sp2 == NULL || fl == 0 || fl >= sizeof fmt)
        return dsec_err_set(err, DSEC_E_DECODE, 0,
                            "environment document line %d: want \"layer DIGEST FORMAT\"",
                            l->lineno);
    if (e->nlayers >= ENV_MAX_LAYERS)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "environment document: more than %d layers",
                            ENV_MAX_LAYERS);
    memcpy(fmt, sp2 + 1, fl);
    fmt[fl] = '\0';
    dsec_layer_format f;
    if (dsec_layer_format_parse(fmt, &f, err) < 0) {
        dsec_err_wrap(err, "environment document line %d", l->lineno);
        err->code = DSEC_E_DECODE;
        return -1;
    }
    if (push_str(&e->layers, &e->nlayers, val, dl) < 0)
        return env_nomem(err);
    if (e->nlayers > *fcap) {
        dsec_layer_format *nf = dsec_realloc(e->formats, e->nlayers * sizeof *nf);
        if (nf == NULL)
            return env_nomem(err);
        e->formats = nf;
        *fcap = e->nlayers;
    }
    e->formats[e->nlayers - 1] = f;
    return 0;
}

/* "cmd ARG" or "label TEXT" (version 2), escaped. */
static int env_take_escaped(dsec_env *e, const struct env_line *l, dsec_err *err)
{
    bool is_cmd = key_is(l, "cmd"), bad;
    char ***v = is_cmd ? &e->cmd : &e->labels;
    size_t *nv = is_cmd ? &e->ncmd : &e->nlabels;
    if (*nv >= ENV_MAX_VARS)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "environment document: more than %d %s",
                            ENV_MAX_VARS, is_cmd ? "command arguments" : "labels");
    char *u = dsec_doc_unescape(l->val, l->vl, &bad);
    if (u == NULL && bad)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "environment document line %d: bad escape",
                            l->lineno);
    int prc = u != NULL ? push_str(v, nv, u, strlen(u)) : -1;
    dsec_free(u);
    return prc < 0 ? env_nomem(err) : 0;
}

/* "entrypoint N" (version 2): the first N cmd lines are the entrypoint. */
static int env_take_entrypoint(dsec_env *e, const struct env_line *l, dsec_err *err)
{
    char num[16];
    char *stop = NULL;
    unsigned long k = 0;
    if (l->vl < sizeof num) {
        memcpy(num, l->val, l->vl);
        num[l->vl] = '\0';
        k = strtoul(num, &stop, 10);
    }
    if (l->vl >= sizeof num || stop == num || *stop != '\0' || num[0] == '-' || e->nentry != 0 ||
        k == 0 || k > ENV_MAX_VARS)
        return dsec_err_set(err, DSEC_E_DECODE, 0,
                            "environment document line %d: want one \"entrypoint N\" (1..%d)",
                            l->lineno, ENV_MAX_VARS);
    e->nentry = k;
    return 0;
}

/* A field that may be given once: its value into *slot. */
static int env_take_once(char **slot, const struct env_line *l, dsec_err *err)
{
    if (*slot != NULL)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "environment document line %d: second %.*s",
                            l->lineno, (int)l->kl, l->key);
    if ((*slot = dsec_strndup(l->val, l->vl)) == NULL)
        return env_nomem(err);
    return 0;
}

/* One line after the first into e. */
static int env_take_line(dsec_env *e, const struct env_line *l, size_t *fcap, dsec_err *err)
{
    if (key_is(l, "name")) {
        if (e->name != NULL)
            return dsec_err_set(err, DSEC_E_DECODE, 0, "environment document line %d: second name",
                                l->lineno);
        return (e->name = dsec_strndup(l->val, l->vl)) == NULL ? env_nomem(err) : 0;
    }
    if (key_is(l, "layer"))
        return env_take_layer(e, l, fcap, err);
    if (key_is(l, "env")) {
        if (e->nvars >= ENV_MAX_VARS)
            return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                                "environment document: more than %d variables", ENV_MAX_VARS);
        return push_str(&e->vars, &e->nvars, l->val, l->vl) < 0 ? env_nomem(err) : 0;
    }
    if (key_is(l, "workdir") || key_is(l, "user"))
        return env_take_once(key_is(l, "workdir") ? &e->workdir : &e->user, l, err);
    if (l->v2 && (key_is(l, "cmd") || key_is(l, "label")))
        return env_take_escaped(e, l, err);
    if (l->v2 && key_is(l, "entrypoint"))
        return env_take_entrypoint(e, l, err);
    if (l->v2 && (key_is(l, "image") || key_is(l, "pin")))
        return env_take_once(key_is(l, "image") ? &e->image : &e->image_digest, l, err);
    return dsec_err_set(err, DSEC_E_DECODE, 0,
                        "environment document line %d: unknown field \"%.*s\"", l->lineno,
                        (int)(l->kl > 40 ? 40 : l->kl), l->key);
}

/* Line 1: "dsec-env 1" or "dsec-env 2"; *v2 says which. */
static int env_take_version(const struct env_line *l, bool *v2, dsec_err *err)
{
    if (!key_is(l, "dsec-env"))
        return dsec_err_set(err, DSEC_E_DECODE, 0,
                            "not an environment document (line 1 should be \"dsec-env 1\")");
    if (!(l->vl == 1 && (l->val[0] == '1' || l->val[0] == '2')))
        return dsec_err_set(err, DSEC_E_DECODE, 0,
                            "environment document version \"%.*s\" is not supported (want 1 "
                            "or 2)",
                            (int)(l->vl > 20 ? 20 : l->vl), l->val);
    *v2 = l->val[0] == '2';
    return 0;
}

int dsec_env_decode(const void *doc, size_t len, dsec_env **out, dsec_err *err)
{
    *out = NULL;
    const char *s = doc;
    if (doc == NULL || len == 0)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "environment document is empty");
    if (len > ENV_DOC_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "environment document of %zu bytes (at most %u)", len, ENV_DOC_MAX);
    if (memchr(s, '\0', len) != NULL)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "environment document holds a NUL byte");
    if (s[len - 1] != '\n')
        return dsec_err_set(err, DSEC_E_DECODE, 0,
                            "environment document does not end with a newline (truncated?)");
    dsec_env *e = dsec_calloc(1, sizeof *e);
    if (e == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "decoding an environment document");
    size_t fcap = 0;
    int lineno = 0;
    bool v2 = false;
    const char *p = s, *end = s + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ll = (size_t)(nl - p);
        lineno++;
        const char *sp = memchr(p, ' ', ll);
        struct env_line l = {.key = p,
                             .kl = sp != NULL ? (size_t)(sp - p) : ll,
                             .val = sp != NULL ? sp + 1 : nl,
                             .lineno = lineno,
                             .v2 = v2};
        l.vl = (size_t)(nl - l.val);
        if (lineno == 1) {
            if (env_take_version(&l, &v2, err) < 0)
                goto fail;
        } else if (sp == NULL || (l.vl == 0 && !(v2 && key_is(&l, "cmd")))) {
            dsec_err_set(err, DSEC_E_DECODE, 0,
                         "environment document line %d: \"%.*s\" has no value", lineno,
                         (int)(ll > 40 ? 40 : ll), p);
            goto fail;
        } else if (env_take_line(e, &l, &fcap, err) < 0) {
            goto fail;
        }
        p = nl + 1;
    }
    if (e->name == NULL) {
        dsec_err_set(err, DSEC_E_DECODE, 0, "environment document has no name line");
        goto fail;
    }
    if ((e->workdir == NULL && (e->workdir = dsec_strdup("/")) == NULL) ||
        (e->user == NULL && (e->user = dsec_strdup("root")) == NULL)) {
        env_nomem(err);
        goto fail;
    }
    if (env_validate(e, err) < 0) {
        err->code = DSEC_E_DECODE;
        dsec_err_wrap(err, "malformed environment document");
        goto fail;
    }
    *out = e;
    return 0;
fail:
    dsec_env_free(e);
    return -1;
}

/* Whether digest is a blob of r; its format in *fmt. */
static int blob_format(dsec_layer_registry *r, const char *digest, dsec_layer_format *fmt,
                       dsec_err *err)
{
    dsec_layer_info *v;
    size_t n;
    if (dsec_layer_registry_list(r, &v, &n, err) < 0)
        return -1;
    int rc = dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "layer %s is not in the %s registry", digest,
                          dsec_layer_registry_kind(r));
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].digest, digest) == 0) {
            *fmt = v[i].format;
            rc = 0;
            dsec_err_clear(err);
            break;
        }
    dsec_layer_infos_free(v, n);
    return rc;
}

int dsec_layer_registry_env_put(dsec_layer_registry *r, const dsec_env *env, dsec_err *err)
{
    if (env == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "storing an environment: none given");
    if (env_validate(env, err) < 0)
        return -1;
    dsec_layer_format *formats = dsec_calloc(env->nlayers, sizeof *formats);
    if (formats == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "storing environment %s", env->name);
    for (size_t i = 0; i < env->nlayers; i++) {
        if (blob_format(r, env->layers[i], &formats[i], err) < 0) {
            dsec_free(formats);
            return dsec_err_wrap(err, "storing environment %s", env->name);
        }
        if (env->formats != NULL && env->formats[i] != formats[i]) {
            dsec_err_set(err, DSEC_E_INVALID, 0,
                         "storing environment %s: layer %s is %s in the registry, not %s",
                         env->name, env->layers[i], dsec_layer_format_name(formats[i]),
                         dsec_layer_format_name(env->formats[i]));
            dsec_free(formats);
            return -1;
        }
    }
    dsec_env copy = *env;
    copy.formats = formats;
    char *doc;
    size_t len;
    int rc = dsec_env_encode(&copy, &doc, &len, err);
    dsec_free(formats);
    if (rc < 0)
        return -1;
    rc = r->ops->env_put(r->self, env->name, doc, len, err);
    dsec_free(doc);
    return rc;
}

int dsec_layer_registry_env_get(dsec_layer_registry *r, const char *name, dsec_env **out,
                                dsec_err *err)
{
    *out = NULL;
    if (check_name("looking up an environment", name, err) < 0)
        return -1;
    void *doc = NULL;
    size_t len = 0;
    if (r->ops->env_get(r->self, name, &doc, &len, err) < 0)
        return -1;
    dsec_env *e;
    int rc = dsec_env_decode(doc, len, &e, err);
    dsec_free(doc);
    if (rc < 0)
        return dsec_err_wrap(err, "environment %s", name);
    if (strcmp(e->name, name) != 0) {
        dsec_err_set(err, DSEC_E_DECODE, 0, "environment %s: the stored document names %s", name,
                     e->name);
        dsec_env_free(e);
        return -1;
    }
    *out = e;
    return 0;
}
