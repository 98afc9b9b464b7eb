/* layers-js.c - the JetStream layer registry: chunked, digest-verified blobs, tags and environments
 * (layers-js.h). */
#include "bus/layers-js.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bus/js.h"
#include "dsec/alloc.h"
#include "dsec/io.h"
#include "dsec/sha256.h"

#define DEFAULT_BUCKET "DSEC_LAYERS"
#define DEFAULT_CHUNK (512u * 1024)
#define MAX_BLOB_CHUNKS (1u << 20)

typedef struct jsreg {
    dsec_js *js;
    dsec_kv_bucket *kv;
    dsec_bus *owned_bus; /* conf->own_bus: freed after the rest */
    char bucket[64];
    char stream[80];
    size_t chunk;
} jsreg;

/* "sha256:<hex>" -> "<hex>" (the wrappers validated the digest). */
static const char *hex_of(const char *digest)
{
    const char *c = strchr(digest, ':');
    return c ? c + 1 : digest;
}

/* "name:version" -> "<prefix>.name/version" (':' is not a KV key character;
 * versions hold no '/', so the last '/' splits it back). A registry port's
 * ':' in the name ("127.0.0.1:5000/a:1") becomes '=', in no name. */
static int name_key(char *buf, size_t len, const char *prefix, const char *name, dsec_err *err)
{
    const char *c = strrchr(name, ':');
    if (c == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "\"%s\" is not name:version", name);
    int n = snprintf(buf, len, "%s.%.*s/%s", prefix, (int)(c - name), name, c + 1);
    if (n < 0 || (size_t)n >= len)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "name \"%s\" is too long", name);
    for (char *q = buf + strlen(prefix) + 1 + (c - name); q > buf; q--)
        if (*q == ':')
            *q = '=';
    return 0;
}

static void key_name(char *buf, size_t len, const char *key)
{
    const char *s = strchr(key, '.') + 1;
    const char *slash = strrchr(s, '/');
    snprintf(buf, len, "%.*s:%s", (int)(slash - s), s, slash + 1);
    for (char *q = buf; *q != '\0' && q < buf + (slash - s); q++)
        if (*q == '=')
            *q = ':';
}

typedef struct blob_meta {
    dsec_layer_format fmt;
    uint64_t size;
    uint64_t chunks;
} blob_meta;

static int meta_get(jsreg *r, const char *digest, blob_meta *m, dsec_err *err)
{
    char key[128], *val = NULL;
    size_t len;
    snprintf(key, sizeof key, "blob.%s", hex_of(digest));
    if (dsec_kv_get(r->kv, key, &val, &len, NULL, err) < 0) {
        if (err != NULL && err->code == DSEC_E_NOT_FOUND)
            dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "layer %s is not in registry %s", digest,
                         r->bucket);
        return -1;
    }
    unsigned v = 0;
    char fmt[16];
    int ok =
        sscanf(val, "dsec-blob %u %15s %" SCNu64 " %" SCNu64, &v, fmt, &m->size, &m->chunks) == 4 &&
        v == 1 && dsec_layer_format_parse(fmt, &m->fmt, NULL) == 0 && m->chunks <= MAX_BLOB_CHUNKS;
    dsec_free(val);
    if (!ok)
        return dsec_err_set(err, DSEC_E_DECODE, 0,
                            "registry %s: the metadata of layer %s is malformed", r->bucket,
                            digest);
    return 0;
}

static int js_get(void *self, const char *digest, const char *dest, dsec_err *err)
{
    jsreg *r = self;
    blob_meta m;
    if (meta_get(r, digest, &m, err) < 0)
        return -1;
    int fd = open(dest, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "creating %s", dest);
    uint64_t got = 0;
    dsec_sha256 h;
    dsec_sha256_init(&h);
    for (uint64_t i = 0; i < m.chunks; i++) {
        char subj[200];
        snprintf(subj, sizeof subj, "dsec.layers.%s.%s.%" PRIu64, r->bucket, hex_of(digest), i);
        void *data = NULL;
        size_t len = 0;
        if (dsec_js_last(r->js, r->stream, subj, &data, &len, err) < 0) {
            dsec_err_wrap(err, "registry %s: layer %s chunk %" PRIu64 "/%" PRIu64, r->bucket,
                          digest, i, m.chunks);
            goto out_fail;
        }
        dsec_sha256_update(&h, data, len);
        int w = dsec_write_all(fd, data, len);
        dsec_free(data);
        if (w < 0) {
            dsec_err_set(err, DSEC_E_IO, errno, "writing %s", dest);
            goto out_fail;
        }
        got += len;
    }
    if (got != m.size) {
        dsec_err_set(err, DSEC_E_DECODE, 0,
                     "registry %s: layer %s has %" PRIu64 " bytes, its metadata says %" PRIu64,
                     r->bucket, digest, got, m.size);
        goto out_fail;
    }
    /* Verify here too: a chunk replaced under us must not reach the cache. */
    uint8_t sum[DSEC_SHA256_LEN];
    dsec_sha256_final(&h, sum);
    char hex[2 * DSEC_SHA256_LEN + 1];
    for (int i = 0; i < DSEC_SHA256_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", sum[i]);
    if (strcmp(hex, hex_of(digest)) != 0) {
        dsec_err_set(err, DSEC_E_DECODE, 0, "registry %s: layer %s arrived with digest sha256:%s",
                     r->bucket, digest, hex);
        goto out_fail;
    }
    if (fsync(fd) < 0 || close(fd) < 0) {
        fd = -1;
        dsec_err_set(err, DSEC_E_IO, errno, "writing %s", dest);
        goto out_fail;
    }
    return 0;
out_fail:
    if (fd >= 0)
        close(fd);
    unlink(dest);
    return -1;
}

static int js_put(void *self, const char *digest, dsec_layer_format fmt, const char *src,
                  dsec_err *err)
{
    jsreg *r = self;
    blob_meta m;
    dsec_err e;
    if (meta_get(r, digest, &m, &e) == 0)
        return 0; /* content-addressed: already there means the same bytes */
    if (e.code != DSEC_E_NOT_FOUND)
        return dsec_err_set(err, e.code, e.errnum, "%s", e.msg);
    int fd = open(src, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "opening %s", src);
    uint8_t *buf = dsec_malloc(r->chunk);
    if (buf == NULL) {
        close(fd);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    uint64_t size = 0, chunks = 0;
    int rc = -1;
    for (;;) {
        size_t have = 0;
        while (have < r->chunk) {
            ssize_t n = dsec_read_eintr(fd, buf + have, r->chunk - have);
            if (n < 0) {
                dsec_err_set(err, DSEC_E_IO, errno, "reading %s", src);
                goto out;
            }
            if (n == 0)
                break;
            have += (size_t)n;
        }
        if (have == 0 && chunks > 0)
            break;
        if (chunks >= MAX_BLOB_CHUNKS) {
            dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "%s is larger than %u chunks of %zu bytes", src,
                         MAX_BLOB_CHUNKS, r->chunk);
            goto out;
        }
        char subj[200];
        snprintf(subj, sizeof subj, "dsec.layers.%s.%s.%" PRIu64, r->bucket, hex_of(digest),
                 chunks);
        if (dsec_js_publish(r->js, subj, buf, have, NULL, err) < 0) {
            dsec_err_wrap(err, "registry %s: storing layer %s", r->bucket, digest);
            goto out;
        }
        chunks++;
        size += have;
        if (have < r->chunk)
            break;
    }
    char key[128], val[128];
    snprintf(key, sizeof key, "blob.%s", hex_of(digest));
    int n = snprintf(val, sizeof val, "dsec-blob 1 %s %" PRIu64 " %" PRIu64,
                     dsec_layer_format_name(fmt), size, chunks);
    if (dsec_kv_put(r->kv, key, val, (size_t)n, NULL, err) < 0) {
        dsec_err_wrap(err, "registry %s: recording layer %s", r->bucket, digest);
        goto out;
    }
    rc = 0;
out:
    dsec_free(buf);
    close(fd);
    return rc;
}

static int js_tag_set(void *self, const char *name, const char *digest, dsec_err *err)
{
    jsreg *r = self;
    char key[512];
    if (name_key(key, sizeof key, "tag", name, err) < 0)
        return -1;
    blob_meta m;
    if (meta_get(r, digest, &m, err) < 0)
        return dsec_err_wrap(err, "tagging %s", name);
    return dsec_kv_put(r->kv, key, digest, strlen(digest), NULL, err);
}

static int js_tag_get(void *self, const char *name, dsec_digest out, dsec_err *err)
{
    jsreg *r = self;
    char key[512], *val = NULL;
    size_t len;
    if (name_key(key, sizeof key, "tag", name, err) < 0)
        return -1;
    if (dsec_kv_get(r->kv, key, &val, &len, NULL, err) < 0) {
        if (err != NULL && err->code == DSEC_E_NOT_FOUND)
            dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "no layer is named %s in registry %s", name,
                         r->bucket);
        return -1;
    }
    int ok = dsec_digest_valid(val);
    if (ok)
        snprintf(out, sizeof(dsec_digest), "%s", val);
    dsec_free(val);
    if (!ok)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "registry %s: tag %s holds no digest", r->bucket,
                            name);
    return 0;
}

/* Blobs are listed once per tag naming them, and once untagged when none does. */
static int js_list(void *self, dsec_layer_info **out, size_t *n, dsec_err *err)
{
    jsreg *r = self;
    *out = NULL;
    *n = 0;
    char **keys = NULL;
    size_t nk = 0;
    if (dsec_kv_keys(r->kv, &keys, &nk, err) < 0) {
        if (err != NULL && err->code == DSEC_E_NOT_FOUND)
            return 0; /* an empty bucket has no keys */
        return -1;
    }
    dsec_layer_info *v = dsec_calloc(nk ? nk : 1, sizeof *v); /* at most one entry per key */
    bool *tagged = dsec_calloc(nk ? nk : 1, sizeof *tagged);
    if (v == NULL || tagged == NULL) {
        dsec_free(v);
        dsec_free(tagged);
        dsec_kv_keys_free(keys, nk);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    size_t nb = 0;
    for (size_t i = 0; i < nk; i++) {
        if (strncmp(keys[i], "blob.", 5) != 0)
            continue;
        snprintf(v[nb].digest, sizeof v[nb].digest, "sha256:%s", keys[i] + 5);
        blob_meta m;
        if (!dsec_digest_valid(v[nb].digest) || meta_get(r, v[nb].digest, &m, NULL) < 0)
            continue; /* removed meanwhile, or not ours */
        v[nb].format = m.fmt;
        v[nb].size = m.size;
        nb++;
    }
    size_t k = nb;
    for (size_t i = 0; i < nk; i++) {
        if (strncmp(keys[i], "tag.", 4) != 0 || strchr(keys[i], '/') == NULL)
            continue;
        char *val = NULL;
        size_t len;
        if (dsec_kv_get(r->kv, keys[i], &val, &len, NULL, NULL) < 0)
            continue;
        for (size_t j = 0; j < nb; j++) {
            if (strcmp(v[j].digest, val) != 0)
                continue;
            char name[512];
            key_name(name, sizeof name, keys[i]);
            dsec_layer_info *e = tagged[j] ? &v[k++] : &v[j];
            *e = v[j];
            e->name = dsec_strdup(name);
            tagged[j] = true;
            break;
        }
        dsec_free(val);
    }
    dsec_free(tagged);
    dsec_kv_keys_free(keys, nk);
    *out = v;
    *n = k;
    return 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int js_env_list(void *self, char ***names, size_t *n, dsec_err *err)
{
    jsreg *r = self;
    *names = NULL;
    *n = 0;
    char **keys = NULL;
    size_t nk = 0;
    if (dsec_kv_keys(r->kv, &keys, &nk, err) < 0)
        return err != NULL && err->code == DSEC_E_NOT_FOUND ? 0 : -1;
    char **v = dsec_calloc(nk ? nk : 1, sizeof *v);
    if (v == NULL) {
        dsec_kv_keys_free(keys, nk);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < nk; i++) {
        if (strncmp(keys[i], "env.", 4) != 0 || strchr(keys[i], '/') == NULL)
            continue;
        char name[512];
        key_name(name, sizeof name, keys[i]);
        if ((v[k] = dsec_strdup(name)) != NULL)
            k++;
    }
    dsec_kv_keys_free(keys, nk);
    qsort(v, k, sizeof *v, cmp_str);
    *names = v;
    *n = k;
    return 0;
}

/* Whether any tag or environment document names digest. */
static int referenced(jsreg *r, const char *digest, char *who, size_t wlen, dsec_err *err)
{
    char **keys = NULL;
    size_t nk = 0;
    if (dsec_kv_keys(r->kv, &keys, &nk, err) < 0)
        return err != NULL && err->code == DSEC_E_NOT_FOUND ? 0 : -1;
    int found = 0;
    for (size_t i = 0; i < nk && !found; i++) {
        if (strncmp(keys[i], "tag.", 4) != 0 && strncmp(keys[i], "env.", 4) != 0)
            continue;
        char *val = NULL;
        size_t len;
        if (dsec_kv_get(r->kv, keys[i], &val, &len, NULL, NULL) < 0)
            continue;
        if (strstr(val, hex_of(digest)) != NULL) {
            char name[512];
            key_name(name, sizeof name, keys[i]);
            snprintf(who, wlen, "%s %s", keys[i][0] == 't' ? "tag" : "environment", name);
            found = 1;
        }
        dsec_free(val);
    }
    dsec_kv_keys_free(keys, nk);
    return found;
}

static int js_remove(void *self, const char *what, dsec_err *err)
{
    jsreg *r = self;
    char key[512];
    if (!dsec_digest_valid(what)) {
        if (name_key(key, sizeof key, "tag", what, err) < 0)
            return -1;
        dsec_digest d;
        if (js_tag_get(self, what, d, err) < 0)
            return -1;
        return dsec_kv_delete(r->kv, key, err);
    }
    blob_meta m;
    if (meta_get(r, what, &m, err) < 0)
        return -1;
    char who[600];
    int ref = referenced(r, what, who, sizeof who, err);
    if (ref < 0)
        return -1;
    if (ref > 0)
        return dsec_err_set(err, DSEC_E_STATE, 0,
                            "layer %s is still named by %s; remove that first", what, who);
    /* Metadata first: the blob disappears at once for readers, then its chunks go. */
    snprintf(key, sizeof key, "blob.%s", hex_of(what));
    if (dsec_kv_delete(r->kv, key, err) < 0)
        return -1;
    char subj[200];
    snprintf(subj, sizeof subj, "dsec.layers.%s.%s.*", r->bucket, hex_of(what));
    return dsec_js_purge(r->js, r->stream, subj, err);
}

static int js_env_put(void *self, const char *name, const void *doc, size_t len, dsec_err *err)
{
    jsreg *r = self;
    char key[512];
    if (name_key(key, sizeof key, "env", name, err) < 0)
        return -1;
    return dsec_kv_put(r->kv, key, doc, len, NULL, err);
}

static int js_env_get(void *self, const char *name, void **doc, size_t *len, dsec_err *err)
{
    jsreg *r = self;
    char key[512], *val = NULL;
    if (name_key(key, sizeof key, "env", name, err) < 0)
        return -1;
    if (dsec_kv_get(r->kv, key, &val, len, NULL, err) < 0) {
        if (err != NULL && err->code == DSEC_E_NOT_FOUND)
            dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "no environment %s in registry %s", name,
                         r->bucket);
        return -1;
    }
    *doc = val;
    return 0;
}

static int js_env_remove(void *self, const char *name, dsec_err *err)
{
    jsreg *r = self;
    char key[512], *val = NULL;
    size_t len;
    if (name_key(key, sizeof key, "env", name, err) < 0)
        return -1;
    if (dsec_kv_get(r->kv, key, &val, &len, NULL, err) < 0)
        return -1;
    dsec_free(val);
    return dsec_kv_delete(r->kv, key, err);
}

/* ---- documents: "doc.<kind>.<key encoded>" ------------------------------------------------- */

static int doc_key(char *buf, size_t len, const char *kind, const char *key, dsec_err *err)
{
    char enc[DSEC_LAYER_DOC_KEY_MAX * 3 + 1];
    if (dsec_layer_doc_key_encode(key, enc, sizeof enc) < 0 ||
        snprintf(buf, len, "doc.%s.%s", kind, enc) >= (int)len)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "%s key \"%.80s\" is too long", kind, key);
    return 0;
}

static int js_doc_put(void *self, const char *kind, const char *key, const void *data, size_t len,
                      dsec_err *err)
{
    jsreg *r = self;
    char k[1024];
    if (doc_key(k, sizeof k, kind, key, err) < 0)
        return -1;
    return dsec_kv_put(r->kv, k, data, len, NULL, err);
}

static int js_doc_get(void *self, const char *kind, const char *key, char **data, size_t *len,
                      dsec_err *err)
{
    jsreg *r = self;
    char k[1024];
    if (doc_key(k, sizeof k, kind, key, err) < 0)
        return -1;
    if (dsec_kv_get(r->kv, k, data, len, NULL, err) < 0) {
        if (err != NULL && err->code == DSEC_E_NOT_FOUND)
            dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "no %s %s in registry %s", kind, key, r->bucket);
        return -1;
    }
    return 0;
}

static int js_doc_list(void *self, const char *kind, char ***out, size_t *n, dsec_err *err)
{
    jsreg *r = self;
    char **keys = NULL, prefix[64];
    size_t nk = 0;
    snprintf(prefix, sizeof prefix, "doc.%s.", kind);
    if (dsec_kv_keys(r->kv, &keys, &nk, err) < 0)
        return err != NULL && err->code == DSEC_E_NOT_FOUND ? 0 : -1;
    char **v = dsec_calloc(nk ? nk : 1, sizeof *v);
    if (v == NULL) {
        dsec_kv_keys_free(keys, nk);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    size_t k = 0;
    for (size_t i = 0; i < nk; i++)
        if (strncmp(keys[i], prefix, strlen(prefix)) == 0 &&
            (v[k] = dsec_layer_doc_key_decode(keys[i] + strlen(prefix))) != NULL)
            k++;
    dsec_kv_keys_free(keys, nk);
    qsort(v, k, sizeof *v, cmp_str);
    *out = v;
    *n = k;
    return 0;
}

static int js_doc_remove(void *self, const char *kind, const char *key, dsec_err *err)
{
    jsreg *r = self;
    char k[1024], *val = NULL;
    size_t len;
    if (doc_key(k, sizeof k, kind, key, err) < 0)
        return -1;
    if (dsec_kv_get(r->kv, k, &val, &len, NULL, err) < 0)
        return -1;
    dsec_free(val);
    return dsec_kv_delete(r->kv, k, err);
}

static void js_close(void *self)
{
    jsreg *r = self;
    if (r == NULL)
        return;
    dsec_kv_close(r->kv);
    dsec_js_free(r->js);
    dsec_bus_free(r->owned_bus);
    dsec_free(r);
}

static const dsec_layer_registry_ops js_ops = {
    .kind = "jetstream",
    .get = js_get,
    .direct_path = NULL,
    .put = js_put,
    .tag_set = js_tag_set,
    .tag_get = js_tag_get,
    .list = js_list,
    .remove = js_remove,
    .env_put = js_env_put,
    .env_get = js_env_get,
    .close = js_close,
    .env_list = js_env_list,
    .doc_put = js_doc_put,
    .doc_get = js_doc_get,
    .doc_list = js_doc_list,
    .doc_remove = js_doc_remove,
    .env_remove = js_env_remove,
};

int dsec_layer_registry_jetstream(dsec_layer_registry **out, dsec_bus *bus,
                                  const dsec_js_layers_conf *conf, dsec_err *err)
{
    *out = NULL;
    const char *bucket = conf && conf->bucket ? conf->bucket : DEFAULT_BUCKET;
    size_t bl = strlen(bucket);
    if (bl == 0 || bl > 48 ||
        strspn(bucket, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") != bl)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "layer bucket \"%s\" must be 1-48 characters A-Z a-z 0-9 _ -", bucket);
    jsreg *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    snprintf(r->bucket, sizeof r->bucket, "%s", bucket);
    snprintf(r->stream, sizeof r->stream, "%s_BLOBS", bucket);
    r->chunk = conf && conf->chunk_bytes ? conf->chunk_bytes : DEFAULT_CHUNK;
    int replicas = conf && conf->replicas > 0 ? conf->replicas : 1;
    char subj[128];
    snprintf(subj, sizeof subj, "dsec.layers.%s.>", bucket);
    const char *subjects[] = {subj};
    dsec_stream_conf sc = {.name = r->stream,
                           .subjects = subjects,
                           .nsubjects = 1,
                           .replicas = replicas,
                           .max_msgs_per_subject = 1};
    dsec_kv_conf kc = {.bucket = bucket, .replicas = replicas};
    if (dsec_js_new(&r->js, bus, 0, err) < 0 || dsec_js_stream_ensure(r->js, &sc, err) < 0 ||
        dsec_kv_open(&r->kv, r->js, &kc, err) < 0) {
        dsec_err_wrap(err, "opening layer registry %s", bucket);
        js_close(r);
        return -1;
    }
    if (dsec_layer_registry_new(out, &js_ops, r, err) < 0) {
        js_close(r);
        return -1;
    }
    if (conf != NULL && conf->own_bus)
        r->owned_bus = bus;
    return 0;
}
