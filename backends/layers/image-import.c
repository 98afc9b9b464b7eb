/* image-import.c - dsec_image_import: docker-archive, OCI layout and OCI archive into layers, an
 * environment and an image record. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends/layers/image-int.h"
#include "backends/layers/layer-int.h"
#include "dsec/alloc.h"
#include "dsec/image.h"
#include "dsec/io.h"
#include "dsec/json.h"
#include "dsec/sha256.h"

#define JSON_MAX (4u << 20)
#define INDEX_DEPTH 4
#define MAX_LAYERS 127

typedef struct layer_desc {
    char *path;         /* relative to the layout's root */
    dsec_digest digest; /* "" when the archive names none (old docker save) */
    int64_t size;       /* -1 when unknown */
} layer_desc;

typedef struct imp {
    dsec_layer_registry *r;
    const dsec_image_import_opts *o;
    dsec_layer_format fmt;
    const char *src;
    char *work;
    int root;
    char *archive_ref;
    dsec_digest manifest, config;
    dsec_json *cfg;
    layer_desc *layers;
    size_t nlayers;
    dsec_layer_info *have; /* the registry's blobs before we started */
    size_t nhave;
    dsec_err *err;
} imp;

void dsec__image_progress(const dsec_image_import_opts *o, const char *fmt, ...)
{
    if (o == NULL || o->progress == NULL)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->progress(o->progress_arg, line);
}

#define progress(m, ...) dsec__image_progress((m)->o, __VA_ARGS__)

/* ---- blobs -------------------------------------------------------------------------------- */

/* Read rel (at most JSON_MAX), check it against want (may be NULL), parse it. */
static int read_json(imp *m, const char *rel, const char *want, dsec_json **out, dsec_digest got)
{
    int fd = dsec__image_open_in(m->root, rel, m->src, m->err);
    if (fd < 0)
        return -1;
    char *buf = dsec_malloc(JSON_MAX + 1);
    size_t n = 0;
    int rc = -1;
    if (buf == NULL) {
        dsec_err_set(m->err, DSEC_E_NOMEM, 0, "reading %s", rel);
        goto out;
    }
    for (;;) {
        ssize_t k = dsec_read_eintr(fd, buf + n, JSON_MAX + 1 - n);
        if (k < 0) {
            dsec_err_set(m->err, DSEC_E_IO, errno, "reading %s", rel);
            goto out;
        }
        if (k == 0)
            break;
        n += (size_t)k;
        if (n > JSON_MAX) {
            dsec_err_set(m->err, DSEC_E_TOO_LARGE, 0, "%s is over %u bytes", rel, JSON_MAX);
            goto out;
        }
    }
    dsec_sha256 c;
    uint8_t raw[DSEC_SHA256_LEN];
    dsec_digest d;
    dsec_sha256_init(&c);
    dsec_sha256_update(&c, buf, n);
    dsec_sha256_final(&c, raw);
    dsec_digest_from_raw(raw, d);
    if (want != NULL && strcmp(d, want) != 0) {
        dsec_err_set(m->err, DSEC_E_INVALID, 0, "%s: digest mismatch: it hashes to %s, not %s", rel,
                     d, want);
        goto out;
    }
    if (got != NULL)
        memcpy(got, d, sizeof d);
    if (dsec_json_parse(buf, n, out, m->err) < 0) {
        dsec_err_wrap(m->err, "%s", rel);
        goto out;
    }
    rc = 0;
out:
    dsec_free(buf);
    close(fd);
    return rc;
}

static char *blob_path(const char *digest)
{
    return dsec__layer_path("blobs/sha256/%s", digest + 7);
}

/* A descriptor's digest, checked; NULL with err. */
static const char *desc_digest(imp *m, const dsec_json *d, const char *what)
{
    const char *dg = dsec_json_get_str(d, "digest");
    if (!dsec_digest_valid(dg)) {
        dsec_err_set(m->err, DSEC_E_INVALID, 0,
                     "%s: %s descriptor has no sha256 digest (\"%.80s\")", m->src, what,
                     dg != NULL ? dg : "");
        return NULL;
    }
    return dg;
}

static bool media_is(const char *mt, const char *const *list)
{
    for (; mt != NULL && *list != NULL; list++)
        if (strcmp(mt, *list) == 0)
            return true;
    return false;
}

static const char *const INDEX_TYPES[] = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json", NULL};
static const char *const MANIFEST_TYPES[] = {"application/vnd.oci.image.manifest.v1+json",
                                             "application/vnd.docker.distribution.manifest.v2+json",
                                             NULL};
static const char *const CONFIG_TYPES[] = {"application/vnd.oci.image.config.v1+json",
                                           "application/vnd.docker.container.image.v1+json", NULL};
static const char *const LAYER_TYPES[] = {"application/vnd.oci.image.layer.v1.tar",
                                          "application/vnd.oci.image.layer.v1.tar+gzip",
                                          "application/vnd.oci.image.layer.v1.tar+zstd",
                                          "application/vnd.docker.image.rootfs.diff.tar",
                                          "application/vnd.docker.image.rootfs.diff.tar.gzip",
                                          "application/vnd.docker.image.rootfs.diff.tar.zstd",
                                          NULL};

/* ---- OCI layouts -------------------------------------------------------------------------- */

static bool platform_ok(imp *m, const dsec_json *desc)
{
    const char *want = m->o != NULL && m->o->platform != NULL ? m->o->platform : "linux/amd64";
    const dsec_json *p = dsec_json_get_object(desc, "platform");
    const char *os = dsec_json_get_str(p, "os"), *arch = dsec_json_get_str(p, "architecture");
    if (os == NULL || arch == NULL)
        return false;
    size_t ol = strlen(os);
    return strncmp(want, os, ol) == 0 && want[ol] == '/' && strcmp(want + ol + 1, arch) == 0;
}

static int read_manifest(imp *m, const char *digest);

/* Pick the manifest of index (depth levels down) for the platform. */
static int pick_from_index(imp *m, const dsec_json *index, int depth, const char *tag)
{
    const dsec_json *ms = dsec_json_get_array(index, "manifests");
    if (ms == NULL || ms->len == 0)
        return dsec_err_set(m->err, DSEC_E_INVALID, 0, "%s: an image index without manifests",
                            m->src);
    const dsec_json *pick = NULL;
    for (int pass = 0; pass < 3 && pick == NULL; pass++)
        for (size_t i = 0; i < ms->len && pick == NULL; i++) {
            const dsec_json *d = ms->items[i];
            const dsec_json *ann = dsec_json_get_object(d, "annotations");
            const char *rn = dsec_json_get_str(ann, "org.opencontainers.image.ref.name");
            bool named = tag == NULL || depth > 0 || (rn != NULL && strcmp(rn, tag) == 0);
            bool plat = platform_ok(m, d) || dsec_json_get(d, "platform") == NULL;
            if ((pass == 0 && named && platform_ok(m, d)) || (pass == 1 && named && plat) ||
                (pass == 2 && plat && tag != NULL))
                pick = d;
        }
    if (pick == NULL)
        return dsec_err_set(
            m->err, DSEC_E_NOT_FOUND, 0, "%s: the image index has no %s entry", m->src,
            m->o != NULL && m->o->platform != NULL ? m->o->platform : "linux/amd64");
    const char *dg = desc_digest(m, pick, "index entry");
    if (dg == NULL)
        return -1;
    if (depth == 0 && m->archive_ref == NULL) {
        const dsec_json *ann = dsec_json_get_object(pick, "annotations");
        const char *full = dsec_json_get_str(ann, "io.containerd.image.name");
        const char *rn = dsec_json_get_str(ann, "org.opencontainers.image.ref.name");
        if (full == NULL && rn != NULL && strpbrk(rn, "/:") != NULL)
            full = rn;
        if (full != NULL)
            m->archive_ref = dsec_strdup(full);
    }
    const char *mt = dsec_json_get_str(pick, "mediaType");
    if (media_is(mt, INDEX_TYPES)) {
        if (depth >= INDEX_DEPTH)
            return dsec_err_set(m->err, DSEC_E_INVALID, 0, "%s: image indexes nested over %d deep",
                                m->src, INDEX_DEPTH);
        char *p = blob_path(dg);
        dsec_json *sub = NULL;
        int rc = p != NULL ? read_json(m, p, dg, &sub, NULL) : -1;
        dsec_free(p);
        if (rc == 0)
            rc = pick_from_index(m, sub, depth + 1, tag);
        dsec_json_free(sub);
        return rc;
    }
    if (!media_is(mt, MANIFEST_TYPES))
        return dsec_err_set(m->err, DSEC_E_UNSUPPORTED, 0,
                            "%s: unknown media type \"%.100s\" "
                            "in the image index",
                            m->src, mt != NULL ? mt : "(none)");
    return read_manifest(m, dg);
}

/* The manifest blob digest: its config and layers. */
static int read_manifest(imp *m, const char *digest)
{
    char *p = blob_path(digest);
    dsec_json *mf = NULL;
    int rc = p != NULL ? read_json(m, p, digest, &mf, NULL) : -1;
    dsec_free(p);
    if (rc < 0)
        return -1;
    memcpy(m->manifest, digest, sizeof m->manifest);
    const dsec_json *cd = dsec_json_get_object(mf, "config");
    const dsec_json *ls = dsec_json_get_array(mf, "layers");
    const char *mt = dsec_json_get_str(mf, "mediaType");
    const char *cmt = dsec_json_get_str(cd, "mediaType");
    const char *cdg = NULL;
    rc = -1;
    if (mt != NULL && !media_is(mt, MANIFEST_TYPES))
        dsec_err_set(m->err, DSEC_E_UNSUPPORTED, 0,
                     "%s: manifest %s has unknown media type "
                     "\"%.100s\"",
                     m->src, digest, mt);
    else if (cd == NULL || ls == NULL || ls->len == 0 || ls->len > MAX_LAYERS)
        dsec_err_set(m->err, DSEC_E_INVALID, 0, "%s: manifest %s has no config or 1..%d layers",
                     m->src, digest, MAX_LAYERS);
    else if (!media_is(cmt, CONFIG_TYPES))
        dsec_err_set(m->err, DSEC_E_UNSUPPORTED, 0, "%s: unknown config media type \"%.100s\"",
                     m->src, cmt != NULL ? cmt : "(none)");
    else if ((cdg = desc_digest(m, cd, "config")) != NULL &&
             (m->layers = dsec_calloc(ls->len, sizeof *m->layers)) != NULL)
        rc = 0;
    for (size_t i = 0; rc == 0 && i < ls->len; i++) {
        const dsec_json *d = ls->items[i];
        const char *lmt = dsec_json_get_str(d, "mediaType");
        const char *ldg = desc_digest(m, d, "layer");
        if (ldg == NULL) {
            rc = -1;
        } else if (!media_is(lmt, LAYER_TYPES)) {
            rc = dsec_err_set(m->err, DSEC_E_UNSUPPORTED, 0,
                              "%s: layer %s has unknown media "
                              "type \"%.100s\"",
                              m->src, ldg, lmt != NULL ? lmt : "(none)");
        } else {
            layer_desc *l = &m->layers[m->nlayers++];
            memcpy(l->digest, ldg, sizeof l->digest);
            l->size = dsec_json_get_uint(d, "size");
            if ((l->path = blob_path(ldg)) == NULL)
                rc = dsec_err_set(m->err, DSEC_E_NOMEM, 0, "reading %s", m->src);
        }
    }
    if (rc == 0) {
        p = blob_path(cdg);
        rc = p != NULL ? read_json(m, p, cdg, &m->cfg, NULL) : -1;
        dsec_free(p);
        memcpy(m->config, cdg, sizeof m->config);
    }
    dsec_json_free(mf);
    return rc;
}

static int resolve_oci(imp *m, const char *tag)
{
    dsec_json *index = NULL;
    if (read_json(m, "index.json", NULL, &index, NULL) < 0)
        return -1;
    int rc = pick_from_index(m, index, 0, tag);
    dsec_json_free(index);
    return rc;
}

/* ---- docker save archives ------------------------------------------------------------------ */

/* "blobs/sha256/<hex>" or "<hex>.json" or "<hex>/layer.tar": the digest its name says, or "". */
static void digest_of_name(const char *p, dsec_digest out)
{
    out[0] = '\0';
    const char *h = strncmp(p, "blobs/sha256/", 13) == 0 ? p + 13 : p;
    size_t hl = strspn(h, "0123456789abcdef");
    if (hl != 64 || !(h[64] == '\0' || strcmp(h + 64, ".json") == 0))
        return;
    snprintf(out, DSEC_DIGEST_STRLEN + 1, "sha256:%.64s", h);
}

static int resolve_docker(imp *m)
{
    dsec_json *mf = NULL;
    if (read_json(m, "manifest.json", NULL, &mf, m->manifest) < 0)
        return -1;
    int rc = -1;
    const dsec_json *e = mf->type == DSEC_JSON_ARRAY && mf->len > 0 ? mf->items[0] : NULL;
    const char *cfg = dsec_json_get_str(e, "Config");
    const dsec_json *ls = dsec_json_get_array(e, "Layers");
    const dsec_json *tags = dsec_json_get_array(e, "RepoTags");
    if (cfg == NULL || ls == NULL || ls->len == 0 || ls->len > MAX_LAYERS) {
        dsec_err_set(m->err, DSEC_E_INVALID, 0, "%s: manifest.json has no Config or 1..%d Layers",
                     m->src, MAX_LAYERS);
        goto out;
    }
    if (tags != NULL && tags->len > 0 && tags->items[0]->type == DSEC_JSON_STRING &&
        (m->archive_ref = dsec_strdup(tags->items[0]->str)) == NULL)
        goto nomem;
    dsec_digest want;
    digest_of_name(cfg, want);
    if (read_json(m, cfg, want[0] ? want : NULL, &m->cfg, m->config) < 0)
        goto out;
    if ((m->layers = dsec_calloc(ls->len, sizeof *m->layers)) == NULL)
        goto nomem;
    for (size_t i = 0; i < ls->len; i++) {
        if (ls->items[i]->type != DSEC_JSON_STRING) {
            dsec_err_set(m->err, DSEC_E_INVALID, 0, "%s: manifest.json layer %zu is not a path",
                         m->src, i + 1);
            goto out;
        }
        layer_desc *l = &m->layers[m->nlayers++];
        l->size = -1;
        if (strncmp(ls->items[i]->str, "blobs/sha256/", 13) == 0)
            digest_of_name(ls->items[i]->str, l->digest);
        if ((l->path = dsec_strdup(ls->items[i]->str)) == NULL)
            goto nomem;
    }
    rc = 0;
    goto out;
nomem:
    dsec_err_set(m->err, DSEC_E_NOMEM, 0, "reading %s", m->src);
out:
    dsec_json_free(mf);
    return rc;
}

/* ---- layers ------------------------------------------------------------------------------- */

int dsec__image_diffid_held(dsec_layer_registry *r, const dsec_layer_info *have, size_t nhave,
                            const char *diff_id, dsec_layer_format fmt, dsec_digest layer,
                            uint64_t *size, dsec_err *err)
{
    char key[128], *doc = NULL;
    size_t len;
    dsec_err e;
    snprintf(key, sizeof key, "%s.%s", diff_id, dsec_layer_format_name(fmt));
    if (dsec_layer_registry_doc_get(r, "diffid", key, &doc, &len, &e) < 0) {
        if (e.code == DSEC_E_NOT_FOUND)
            return 0;
        *err = e;
        return -1;
    }
    int held = 0;
    if (len >= DSEC_DIGEST_STRLEN && (doc[DSEC_DIGEST_STRLEN] = '\0', 1) && dsec_digest_valid(doc))
        for (size_t i = 0; !held && i < nhave; i++)
            if (strcmp(have[i].digest, doc) == 0 && have[i].format == fmt) {
                memcpy(layer, doc, sizeof(dsec_digest));
                *size = have[i].size;
                held = 1;
            }
    dsec_free(doc);
    return held;
}

/* Convert layer i (blob at l) whose config diff_id is diff_id into a stored dsec layer. */
static int convert_layer(imp *m, size_t i, const layer_desc *l, const char *diff_id,
                         dsec_image_layer *out)
{
    char *tar = dsec__layer_path("%s/layer-%zu.tar", m->work, i);
    char *tree = dsec__layer_path("%s/layer-%zu", m->work, i);
    char *blob = dsec__layer_path("%s/layer-%zu.blob", m->work, i);
    int rc = -1, fd = -1;
    if (tar == NULL || tree == NULL || blob == NULL) {
        dsec_err_set(m->err, DSEC_E_NOMEM, 0, "converting a layer");
        goto out;
    }
    fd = dsec__image_open_in(m->root, l->path, m->src, m->err);
    dsec_digest got, got_diff;
    uint64_t bsize;
    if (fd < 0 || dsec__image_unpack_blob(fd, tar, got, got_diff, &bsize, m->err) < 0)
        goto out;
    if (l->digest[0] != '\0' && strcmp(got, l->digest) != 0) {
        dsec_err_set(m->err, DSEC_E_INVALID, 0, "blob digest mismatch: %s hashes to %s, not %s",
                     l->path, got, l->digest);
        goto out;
    }
    if (l->size >= 0 && (uint64_t)l->size != bsize) {
        dsec_err_set(m->err, DSEC_E_INVALID, 0, "blob %s is %llu bytes, the manifest says %lld",
                     l->path, (unsigned long long)bsize, (long long)l->size);
        goto out;
    }
    if (strcmp(got_diff, diff_id) != 0) {
        dsec_err_set(m->err, DSEC_E_INVALID, 0,
                     "diff_id mismatch: the uncompressed %s hashes "
                     "to %s, the config says %s",
                     l->path, got_diff, diff_id);
        goto out;
    }
    if (mkdir(tree, 0755) < 0) {
        dsec_err_set(m->err, DSEC_E_IO, errno, "creating %s", tree);
        goto out;
    }
    if (dsec__image_extract_layer(tar, tree, m->err) < 0)
        goto out;
    unlink(tar);
    if (dsec_layer_build(tree, m->fmt, NULL, 0, blob, out->layer, m->err) < 0 ||
        dsec_layer_registry_put(m->r, out->layer, m->fmt, blob, m->err) < 0)
        goto out;
    struct stat st;
    out->size = stat(blob, &st) == 0 ? (uint64_t)st.st_size : 0;
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    if (tar != NULL)
        unlink(tar);
    if (blob != NULL)
        unlink(blob);
    if (tree != NULL)
        dsec__layer_rm_rf(tree, NULL);
    dsec_free(tar);
    dsec_free(tree);
    dsec_free(blob);
    return rc;
}

/* Layer i: reused through its diff_id record, or converted and recorded. */
static int import_layer(imp *m, size_t i, const char *diff_id, dsec_image_layer *out)
{
    memcpy(out->diff_id, diff_id, sizeof out->diff_id);
    int held = dsec__image_diffid_held(m->r, m->have, m->nhave, diff_id, m->fmt, out->layer,
                                       &out->size, m->err);
    if (held < 0)
        return -1;
    if (held) {
        out->reused = true;
        progress(m, "layer %zu/%zu %s reused (%s)", i + 1, m->nlayers, diff_id, out->layer);
        return 0;
    }
    if (convert_layer(m, i, &m->layers[i], diff_id, out) < 0)
        return -1;
    char key[128];
    snprintf(key, sizeof key, "%s.%s", diff_id, dsec_layer_format_name(m->fmt));
    char line[DSEC_DIGEST_STRLEN + 2];
    int n = snprintf(line, sizeof line, "%s\n", out->layer);
    if (dsec_layer_registry_doc_put(m->r, "diffid", key, line, (size_t)n, m->err) < 0)
        return -1;
    progress(m, "layer %zu/%zu %s converted (%s, %llu bytes)", i + 1, m->nlayers, diff_id,
             out->layer, (unsigned long long)out->size);
    return 0;
}

/* ---- the config: diff_ids, and the environment ------------------------------------------- */

static int string_list(imp *m, const dsec_json *a, const char *what, char ***v, size_t *n)
{
    for (size_t i = 0; a != NULL && i < a->len; i++) {
        if (a->items[i]->type != DSEC_JSON_STRING)
            return dsec_err_set(m->err, DSEC_E_INVALID, 0, "%s: config %s holds a non-string",
                                m->src, what);
        char **nv = dsec_realloc(*v, (*n + 1) * sizeof *nv);
        if (nv == NULL)
            return dsec_err_set(m->err, DSEC_E_NOMEM, 0, "reading the config");
        *v = nv;
        if ((nv[*n] = dsec_strdup(a->items[i]->str)) == NULL)
            return dsec_err_set(m->err, DSEC_E_NOMEM, 0, "reading the config");
        (*n)++;
    }
    return 0;
}

static int config_to_info(imp *m, dsec_image_info *info)
{
    const dsec_json *c = dsec_json_get_object(m->cfg, "config");
    const dsec_json *labels = dsec_json_get_object(c, "Labels");
    if (string_list(m, dsec_json_get_array(c, "Entrypoint"), "Entrypoint", &info->cmd,
                    &info->ncmd) < 0 ||
        string_list(m, dsec_json_get_array(c, "Cmd"), "Cmd", &info->cmd, &info->ncmd) < 0)
        return -1;
    for (size_t i = 0; labels != NULL && i < labels->len; i++) {
        if (labels->items[i]->type != DSEC_JSON_STRING)
            continue;
        char *kv = dsec__layer_path("%s=%s", labels->keys[i], labels->items[i]->str);
        char **nv =
            kv != NULL ? dsec_realloc(info->labels, (info->nlabels + 1) * sizeof *nv) : NULL;
        if (nv == NULL) {
            dsec_free(kv);
            return dsec_err_set(m->err, DSEC_E_NOMEM, 0, "reading the config");
        }
        info->labels = nv;
        nv[info->nlabels++] = kv;
    }
    return 0;
}

static int put_env(imp *m, const dsec_image_info *info)
{
    const dsec_json *c = dsec_json_get_object(m->cfg, "config");
    dsec_env env = {.name = info->env,
                    .nlayers = info->nlayers,
                    .cmd = info->cmd,
                    .ncmd = info->ncmd,
                    .labels = info->labels,
                    .nlabels = info->nlabels,
                    .image = info->ref,
                    .image_digest = (char *)info->manifest};
    const dsec_json *ep = dsec_json_get_array(c, "Entrypoint");
    env.nentry = ep != NULL && ep->len <= info->ncmd ? ep->len : 0; /* config_to_info read them */
    const char *wd = dsec_json_get_str(c, "WorkingDir"), *user = dsec_json_get_str(c, "User");
    env.workdir = wd != NULL && wd[0] != '\0' ? (char *)wd : NULL;
    env.user = user != NULL && user[0] != '\0' ? (char *)user : NULL;
    env.layers = dsec_calloc(info->nlayers, sizeof *env.layers);
    int rc =
        env.layers == NULL ? dsec_err_set(m->err, DSEC_E_NOMEM, 0, "storing the environment") : 0;
    for (size_t i = 0; rc == 0 && i < info->nlayers; i++)
        env.layers[i] = (char *)info->layers[i].layer;
    if (rc == 0)
        rc = string_list(m, dsec_json_get_array(c, "Env"), "Env", &env.vars, &env.nvars);
    if (rc == 0)
        rc = dsec_layer_registry_env_put(m->r, &env, m->err);
    dsec_layer_names_free(env.vars, env.nvars);
    dsec_free(env.layers);
    return rc;
}

/* ---- scratch space ------------------------------------------------------------------------ */

static int make_work(imp *m)
{
    const char *base = m->o != NULL ? m->o->work_dir : NULL;
    if (base == NULL)
        base =
            getenv("TMPDIR") != NULL && getenv("TMPDIR")[0] != '\0' ? getenv("TMPDIR") : "/var/tmp";
    if (dsec__layer_mkdir_p(base, 0700, m->err) < 0)
        return dsec_err_wrap(m->err, "image scratch space");
    dsec__layer_sweep_scratch(base, "dsec-import-");
    m->work = dsec__layer_path("%s/dsec-import-%d.XXXXXX", base, (int)getpid());
    if (m->work == NULL)
        return dsec_err_set(m->err, DSEC_E_NOMEM, 0, "image scratch space");
    if (mkdtemp(m->work) == NULL) {
        dsec_err_set(m->err, DSEC_E_IO, errno, "creating scratch space %s", m->work);
        dsec_free(m->work);
        m->work = NULL;
        return -1;
    }
    return 0;
}

/* Open the layout: the directory itself, or an archive unpacked into the scratch space. */
static int open_source(imp *m)
{
    struct stat st;
    if (stat(m->src, &st) < 0)
        return dsec_err_set(m->err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "image %s", m->src);
    const char *dir = m->src;
    char *unpacked = NULL;
    if (!S_ISDIR(st.st_mode)) {
        unpacked = dsec__layer_path("%s/src", m->work);
        if (unpacked == NULL || mkdir(unpacked, 0700) < 0) {
            dsec_free(unpacked);
            return dsec_err_set(m->err, DSEC_E_IO, errno, "unpacking %s", m->src);
        }
        if (dsec__image_extract_outer(m->src, unpacked, m->err) < 0) {
            dsec_free(unpacked);
            return dsec_err_wrap(m->err, "image archive %s", m->src);
        }
        dir = unpacked;
    }
    m->root = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    int e = errno;
    dsec_free(unpacked);
    if (m->root < 0)
        return dsec_err_set(m->err, DSEC_E_IO, e, "opening %s", m->src);
    return 0;
}

static bool has(imp *m, const char *name)
{
    return faccessat(m->root, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

/* The config's rootfs.diff_ids, one per layer. */
static int check_diff_ids(imp *m, const dsec_json **ids)
{
    const dsec_json *rootfs = dsec_json_get_object(m->cfg, "rootfs");
    *ids = dsec_json_get_array(rootfs, "diff_ids");
    if (*ids == NULL || (*ids)->len != m->nlayers)
        return dsec_err_set(m->err, DSEC_E_INVALID, 0,
                            "%s: the config lists %zu diff_ids for "
                            "%zu layers",
                            m->src, *ids != NULL ? (*ids)->len : 0, m->nlayers);
    for (size_t i = 0; i < m->nlayers; i++)
        if ((*ids)->items[i]->type != DSEC_JSON_STRING || !dsec_digest_valid((*ids)->items[i]->str))
            return dsec_err_set(m->err, DSEC_E_INVALID, 0,
                                "%s: config diff_id %zu is not a "
                                "sha256: digest",
                                m->src, i + 1);
    return 0;
}

static int find_layout(imp *m, const char *tag)
{
    if (has(m, "oci-layout") && has(m, "index.json"))
        return resolve_oci(m, tag);
    if (has(m, "manifest.json"))
        return resolve_docker(m);
    return dsec_err_set(m->err, DSEC_E_INVALID, 0,
                        "%s is neither a docker save archive (manifest.json) nor an OCI image "
                        "layout (oci-layout, index.json) or archive of one",
                        m->src);
}

/* Layers, then the environment, then the record: nothing visible until all is in. */
static int import_all(imp *m, dsec_image_info *info)
{
    const dsec_json *ids;
    if (check_diff_ids(m, &ids) < 0)
        return -1;
    if ((info->layers = dsec_calloc(m->nlayers, sizeof *info->layers)) == NULL)
        return dsec_err_set(m->err, DSEC_E_NOMEM, 0, "importing %s", m->src);
    if (dsec_layer_registry_list(m->r, &m->have, &m->nhave, m->err) < 0)
        return -1;
    for (size_t i = 0; i < m->nlayers; i++, info->nlayers++)
        if (import_layer(m, i, ids->items[i]->str, &info->layers[i]) < 0)
            return dsec_err_wrap(m->err, "image %s: layer %zu/%zu %s", info->ref, i + 1, m->nlayers,
                                 ids->items[i]->str);
    memcpy(info->manifest, m->manifest, sizeof info->manifest);
    memcpy(info->config, m->config, sizeof info->config);
    if (config_to_info(m, info) < 0 || put_env(m, info) < 0)
        return dsec_err_wrap(m->err, "image %s", info->ref);
    info->created_unix = (int64_t)time(NULL);
    char *doc;
    size_t len;
    if (dsec__image_record_encode(info, &doc, &len) < 0)
        return dsec_err_set(m->err, DSEC_E_NOMEM, 0, "image %s: its record", info->ref);
    int rc = dsec_layer_registry_doc_put(m->r, "image", info->ref, doc, len, m->err);
    dsec_free(doc);
    if (rc == 0)
        progress(m, "image %s: %zu layers, environment %s", info->ref, info->nlayers, info->env);
    return rc;
}

static int run_import(imp *m, dsec_image_info *info)
{
    if (make_work(m) < 0 || open_source(m) < 0)
        return -1;
    /* a tag from the caller's reference picks among an OCI layout's tagged manifests */
    char *host = NULL, *path = NULL, *tag = NULL, *digest = NULL;
    if (m->o != NULL && m->o->ref != NULL &&
        dsec_image_ref_parse(m->o->ref, &host, &path, &tag, &digest, m->err) < 0)
        return -1;
    int rc = find_layout(m, tag);
    dsec_free(host), dsec_free(path), dsec_free(tag), dsec_free(digest);
    if (rc < 0)
        return -1;
    const char *ref = m->o != NULL && m->o->ref != NULL ? m->o->ref : m->archive_ref;
    if (ref == NULL)
        return dsec_err_set(m->err, DSEC_E_INVALID, 0,
                            "%s names no image reference (no RepoTags, no ref.name annotation): "
                            "give one (--name REF)",
                            m->src);
    if (dsec__image_ref_normalize(ref, &info->ref, &info->env, m->err) < 0)
        return -1;
    progress(m, "image %s: manifest %s, %zu layers", info->ref, m->manifest, m->nlayers);
    return import_all(m, info);
}

int dsec_image_import(dsec_layer_registry *r, const char *path, const dsec_image_import_opts *o,
                      dsec_image_info **out, dsec_err *err)
{
    if (out != NULL)
        *out = NULL;
    if (r == NULL || path == NULL || path[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "importing an image: no registry or path");
    imp m = {.r = r,
             .o = o,
             .src = path,
             .root = -1,
             .err = err,
             .fmt = o != NULL && o->format != 0 ? o->format : DSEC_LAYER_EROFS};
    dsec_image_info *info = dsec_calloc(1, sizeof *info);
    int rc = info != NULL ? run_import(&m, info)
                          : dsec_err_set(err, DSEC_E_NOMEM, 0, "importing %s", path);
    if (m.root >= 0)
        close(m.root);
    if (m.work != NULL)
        dsec__layer_rm_rf(m.work, NULL);
    dsec_free(m.work);
    dsec_free(m.archive_ref);
    dsec_json_free(m.cfg);
    for (size_t i = 0; i < m.nlayers; i++)
        dsec_free(m.layers[i].path);
    dsec_free(m.layers);
    dsec_layer_infos_free(m.have, m.nhave);
    if (rc == 0 && out != NULL)
        *out = info;
    else
        dsec_image_info_free(info);
    return rc;
}
