/* image.c - image references, image records in the registry, and listing and removing images. */
#define _GNU_SOURCE
#include "dsec/image.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/layers/image-int.h"
#include "backends/layers/layer-int.h"
#include "dsec/alloc.h"

/*
 * An image record is a "image" document (dsec_layer_registry_doc_put) keyed
 * by the normalized reference, line-oriented text:
 *     dsec-image 1
 *     ref R
 *     manifest sha256:<hex>
 *     config sha256:<hex>
 *     env NAME
 *     layer <diff_id> <layer digest> <size>   (lowest first)
 *     cmd ARG                                 (escaped as in env documents)
 *     label KEY=VALUE
 *     created UNIX
 * diff_id records are "diffid" documents keyed "<diff_id>.<format>" holding
 * the dsec layer digest the uncompressed layer became in that format.
 */

#define RECORD_MAX (1u << 20)

/* ---- references --------------------------------------------------------------------------- */

int dsec_image_ref_parse(const char *ref, char **host, char **path, char **tag, char **digest,
                         dsec_err *err)
{
    *host = *path = *tag = *digest = NULL;
    if (ref == NULL || ref[0] == '\0' || strlen(ref) > 512 || strpbrk(ref, " \t\n") != NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "image reference \"%.80s\" is empty, too "
                            "long or holds a space",
                            ref != NULL ? ref : "(null)");
    const char *at = strchr(ref, '@');
    size_t nl = at != NULL ? (size_t)(at - ref) : strlen(ref);
    if (at != NULL && !dsec_digest_valid(at + 1))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "image reference \"%.80s\": \"%s\" is not a "
                            "sha256: digest",
                            ref, at + 1);
    /* the first component is a registry host when it looks like one (Docker's rule) */
    const char *slash = memchr(ref, '/', nl);
    const char *rest = ref;
    if (slash != NULL) {
        size_t hl = (size_t)(slash - ref);
        if (memchr(ref, '.', hl) != NULL || memchr(ref, ':', hl) != NULL ||
            (hl == 9 && memcmp(ref, "localhost", 9) == 0)) {
            *host = dsec_strndup(ref, hl);
            rest = slash + 1;
        }
    }
    const char *lastslash = memrchr(rest, '/', nl - (size_t)(rest - ref));
    const char *colon = memchr(lastslash != NULL ? lastslash : rest, ':',
                               nl - (size_t)((lastslash != NULL ? lastslash : rest) - ref));
    size_t pl = colon != NULL ? (size_t)(colon - rest) : nl - (size_t)(rest - ref);
    *path = dsec_strndup(rest, pl);
    if (colon != NULL)
        *tag = dsec_strndup(colon + 1, nl - (size_t)(colon + 1 - ref));
    if (at != NULL)
        *digest = dsec_strdup(at + 1);
    if (*path == NULL || (colon != NULL && *tag == NULL) || (at != NULL && *digest == NULL) ||
        (slash != NULL && rest != ref && *host == NULL)) {
        dsec_free(*host), dsec_free(*path), dsec_free(*tag), dsec_free(*digest);
        *host = *path = *tag = *digest = NULL;
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "parsing image reference %s", ref);
    }
    return 0;
}

/* The normalized reference and the environment name it gives; both dsec_malloc'd. */
int dsec__image_ref_normalize(const char *ref, char **norm, char **env, dsec_err *err)
{
    char *host, *path, *tag, *digest;
    *norm = *env = NULL;
    if (dsec_image_ref_parse(ref, &host, &path, &tag, &digest, err) < 0)
        return -1;
    char *name = NULL;
    if (tag != NULL || digest == NULL)
        name = dsec__layer_path("%s%s%s:%s", host ? host : "", host ? "/" : "", path,
                                tag ? tag : "latest");
    else /* digest only: the version is the digest's start (no ':' in a version) */
        name = dsec__layer_path("%s%s%s:sha256-%.16s", host ? host : "", host ? "/" : "", path,
                                digest + 7);
    int rc = 0;
    if (name == NULL) {
        rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "normalizing %s", ref);
    } else if (!dsec_layer_name_valid(name)) {
        rc = dsec_err_set(err, DSEC_E_INVALID, 0,
                          "image reference \"%.200s\" cannot name an environment: want "
                          "[HOST[:PORT]/]PATH[:TAG] with PATH of [a-z0-9._-] parts joined by '/'",
                          ref);
    } else {
        *norm = digest != NULL ? dsec__layer_path("%s@%s", name, digest) : dsec_strdup(name);
        *env = name;
        name = NULL;
        if (*norm == NULL) {
            dsec_free(*env);
            *env = NULL;
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "normalizing %s", ref);
        }
    }
    dsec_free(name);
    dsec_free(host), dsec_free(path), dsec_free(tag), dsec_free(digest);
    return rc;
}

/* ---- records ------------------------------------------------------------------------------ */

void dsec_image_info_free(dsec_image_info *i)
{
    if (i == NULL)
        return;
    dsec_image_infos_free(i, 1);
}

static void info_clear(dsec_image_info *i)
{
    dsec_free(i->ref);
    dsec_free(i->env);
    dsec_free(i->layers);
    dsec_layer_names_free(i->cmd, i->ncmd);
    dsec_layer_names_free(i->labels, i->nlabels);
    memset(i, 0, sizeof *i);
}

void dsec_image_infos_free(dsec_image_info *v, size_t n)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        info_clear(&v[i]);
    dsec_free(v);
}

/* A record's escaped value; NULL when malformed or out of memory. */
static char *unescape(const char *v)
{
    bool bad;
    return dsec_doc_unescape(v, strlen(v), &bad);
}

int dsec__image_record_encode(const dsec_image_info *i, char **doc, size_t *len)
{
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    if (f == NULL)
        return -1;
    fprintf(f, "dsec-image 1\nref %s\nmanifest %s\nconfig %s\nenv %s\n", i->ref, i->manifest,
            i->config, i->env);
    for (size_t k = 0; k < i->nlayers; k++)
        fprintf(f, "layer %s %s %llu\n", i->layers[k].diff_id, i->layers[k].layer,
                (unsigned long long)i->layers[k].size);
    for (size_t k = 0; k < i->ncmd; k++)
        dsec_doc_put_escaped(f, "cmd", i->cmd[k]);
    for (size_t k = 0; k < i->nlabels; k++)
        dsec_doc_put_escaped(f, "label", i->labels[k]);
    fprintf(f, "created %lld\n", (long long)i->created_unix);
    if (fclose(f) != 0 || buf == NULL) {
        free(buf); /* open_memstream's buffer comes from libc */
        return -1;
    }
    *doc = dsec_strndup(buf, size);
    *len = size;
    free(buf);
    return *doc != NULL ? 0 : -1;
}

static int push(char ***v, size_t *n, char *s)
{
    char **nv = s != NULL ? dsec_realloc(*v, (*n + 1) * sizeof *nv) : NULL;
    if (nv == NULL) {
        dsec_free(s);
        return -1;
    }
    nv[(*n)++] = s;
    *v = nv;
    return 0;
}

/* One line of a record into i; -1 when malformed or out of memory. */
static int record_line(dsec_image_info *i, char *line)
{
    char *sp = strchr(line, ' ');
    if (sp == NULL)
        return -1;
    *sp = '\0';
    const char *k = line, *v = sp + 1;
    if (strcmp(k, "ref") == 0 && i->ref == NULL)
        return (i->ref = dsec_strdup(v)) != NULL ? 0 : -1;
    if (strcmp(k, "env") == 0 && i->env == NULL)
        return (i->env = dsec_strdup(v)) != NULL ? 0 : -1;
    if ((strcmp(k, "manifest") == 0 || strcmp(k, "config") == 0) && dsec_digest_valid(v)) {
        memcpy(k[0] == 'm' ? i->manifest : i->config, v, DSEC_DIGEST_STRLEN + 1);
        return 0;
    }
    if (strcmp(k, "layer") == 0) {
        dsec_image_layer l = {0};
        unsigned long long size;
        char d1[80], d2[80];
        if (sscanf(v, "%79s %79s %llu", d1, d2, &size) != 3 || !dsec_digest_valid(d1) ||
            !dsec_digest_valid(d2))
            return -1;
        memcpy(l.diff_id, d1, sizeof l.diff_id);
        memcpy(l.layer, d2, sizeof l.layer);
        l.size = size;
        dsec_image_layer *nl = dsec_realloc(i->layers, (i->nlayers + 1) * sizeof *nl);
        if (nl == NULL)
            return -1;
        i->layers = nl;
        i->layers[i->nlayers++] = l;
        return 0;
    }
    if (strcmp(k, "cmd") == 0)
        return push(&i->cmd, &i->ncmd, unescape(v));
    if (strcmp(k, "label") == 0)
        return push(&i->labels, &i->nlabels, unescape(v));
    if (strcmp(k, "created") == 0)
        return (i->created_unix = strtoll(v, NULL, 10)), 0;
    return -1;
}

static int record_decode(const char *key, char *doc, dsec_image_info *i, dsec_err *err)
{
    memset(i, 0, sizeof *i);
    char *save = NULL;
    char *line = strtok_r(doc, "\n", &save);
    if (line == NULL || strcmp(line, "dsec-image 1") != 0)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "image record %s: not a dsec-image 1 document",
                            key);
    while ((line = strtok_r(NULL, "\n", &save)) != NULL)
        if (record_line(i, line) < 0) {
            info_clear(i);
            return dsec_err_set(err, DSEC_E_DECODE, 0, "image record %s: malformed line", key);
        }
    if (i->ref == NULL || i->env == NULL || i->nlayers == 0 || !dsec_digest_valid(i->manifest)) {
        info_clear(i);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "image record %s: incomplete", key);
    }
    return 0;
}

static int record_get(dsec_layer_registry *r, const char *key, dsec_image_info *i, dsec_err *err)
{
    char *doc;
    size_t len;
    if (dsec_layer_registry_doc_get(r, "image", key, &doc, &len, err) < 0)
        return -1;
    int rc = record_decode(key, doc, i, err);
    dsec_free(doc);
    return rc;
}

/* ---- list, get, remove -------------------------------------------------------------------- */

int dsec_image_list(dsec_layer_registry *r, dsec_image_info **out, size_t *n, dsec_err *err)
{
    *out = NULL;
    *n = 0;
    char **keys;
    size_t nk;
    if (dsec_layer_registry_doc_list(r, "image", &keys, &nk, err) < 0)
        return dsec_err_wrap(err, "listing images");
    dsec_image_info *v = dsec_calloc(nk ? nk : 1, sizeof *v);
    if (v == NULL) {
        dsec_layer_names_free(keys, nk);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "listing images");
    }
    size_t k = 0;
    for (size_t i = 0; i < nk; i++) {
        dsec_err e;
        if (record_get(r, keys[i], &v[k], &e) == 0)
            k++; /* removed under us, or not ours to read: not listed */
    }
    dsec_layer_names_free(keys, nk);
    if (k == 0) {
        dsec_free(v);
        v = NULL;
    }
    *out = v;
    *n = k;
    return 0;
}

int dsec_image_get(dsec_layer_registry *r, const char *ref, dsec_image_info **out, dsec_err *err)
{
    *out = NULL;
    dsec_image_info *i = dsec_calloc(1, sizeof *i);
    if (i == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "looking up image %s", ref ? ref : "");
    if (ref != NULL && dsec_digest_valid(ref)) {
        dsec_image_info *v;
        size_t n;
        if (dsec_image_list(r, &v, &n, err) < 0) {
            dsec_free(i);
            return -1;
        }
        int rc = dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "no image with manifest %s", ref);
        for (size_t k = 0; k < n && rc < 0; k++)
            if (strcmp(v[k].manifest, ref) == 0 || strcmp(v[k].config, ref) == 0) {
                *i = v[k];
                memset(&v[k], 0, sizeof v[k]);
                rc = 0;
            }
        dsec_image_infos_free(v, n);
        if (rc < 0)
            dsec_free(i);
        else
            *out = i;
        return rc;
    }
    char *norm, *env;
    if (dsec__image_ref_normalize(ref, &norm, &env, err) < 0) {
        dsec_free(i);
        return -1;
    }
    int rc = record_get(r, norm, i, err);
    dsec_free(norm);
    dsec_free(env);
    if (rc < 0) {
        dsec_free(i);
        return -1;
    }
    *out = i;
    return 0;
}

int dsec_image_remove(dsec_layer_registry *r, const char *ref, dsec_err *err)
{
    dsec_image_info *i;
    if (dsec_image_get(r, ref, &i, err) < 0)
        return -1;
    /* the record first: from here on the image is not listed, whatever else fails */
    int rc = dsec_layer_registry_doc_remove(r, "image", i->ref, err);
    if (rc == 0)
        rc = dsec_layer_registry_env_remove(r, i->env, err);
    if (rc < 0 && err != NULL && err->code == DSEC_E_NOT_FOUND)
        rc = 0; /* an environment already gone is what we wanted */
    for (size_t k = 0; rc == 0 && k < i->nlayers; k++) {
        dsec_err e;
        /* a layer another image or environment holds stays (DSEC_E_STATE) */
        if (dsec_layer_registry_remove(r, i->layers[k].layer, &e) == 0) {
            for (int f = DSEC_LAYER_EROFS; f <= DSEC_LAYER_DIR; f++) {
                char key[128];
                snprintf(key, sizeof key, "%s.%s", i->layers[k].diff_id,
                         dsec_layer_format_name((dsec_layer_format)f));
                char *doc;
                size_t len;
                if (dsec_layer_registry_doc_get(r, "diffid", key, &doc, &len, &e) == 0) {
                    if (strncmp(doc, i->layers[k].layer, DSEC_DIGEST_STRLEN) == 0)
                        dsec_layer_registry_doc_remove(r, "diffid", key, &e);
                    dsec_free(doc);
                }
            }
        }
    }
    dsec_image_info_free(i);
    return rc;
}

int dsec_image_record(dsec_layer_registry *r, const dsec_image_info *info, dsec_err *err)
{
    dsec_env *e = NULL;
    if (info == NULL || info->ref == NULL || info->env == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "image record: no reference or environment");
    if (dsec_layer_registry_env_get(r, info->env, &e, err) < 0)
        return dsec_err_wrap(err, "image %s", info->ref);
    dsec_env_free(e);
    char *doc;
    size_t len;
    if (dsec__image_record_encode(info, &doc, &len) < 0)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "image %s: its record", info->ref);
    int rc = dsec_layer_registry_doc_put(r, "image", info->ref, doc, len, err);
    dsec_free(doc);
    return rc;
}
