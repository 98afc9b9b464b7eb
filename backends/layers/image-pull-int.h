/* image-pull-int.h - the registry pull's internals: fetch to an OCI layout, and its small JSON
 * reader. */
#ifndef DSEC_BACKENDS_IMAGE_PULL_INT_H
#define DSEC_BACKENDS_IMAGE_PULL_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "dsec/err.h"
#include "dsec/image.h"

/*
 * Fetch ref from its registry (HTTP API v2) into dir (which must exist and
 * be empty) as an OCI image layout: oci-layout, index.json naming the one
 * image manifest (an index is resolved to o->import.platform first), and
 * blobs/sha256/HEX for that manifest, its config and its layers, each
 * checked against its digest. *norm_ref (may be NULL) gets the normalized
 * reference (HOST[:PORT]/PATH:TAG or HOST[:PORT]/PATH@sha256:HEX),
 * dsec_malloc'd, caller frees. On failure dir may hold partial files: the
 * caller removes it.
 */
int dsec__image_fetch_layout(const char *ref, const dsec_image_pull_opts *o, const char *dir,
                             char **norm_ref, dsec_err *err);

/* A parsed JSON value (image-pull-json.c). Strings are NUL-terminated
 * (a string holding NUL is refused); numbers keep their text. */
typedef enum dsec__pj_type {
    DSEC__PJ_NULL,
    DSEC__PJ_BOOL,
    DSEC__PJ_NUM,
    DSEC__PJ_STR,
    DSEC__PJ_ARR,
    DSEC__PJ_OBJ,
} dsec__pj_type;

typedef struct dsec__pj {
    dsec__pj_type type;
    bool b;
    char *s;               /* STR: the string; NUM: its text */
    struct dsec__pj *kids; /* ARR, OBJ: n values */
    char **keys;           /* OBJ: n keys */
    size_t n;
} dsec__pj;

/* Parse len bytes of what (named in errors, e.g. "manifest of swe/task:1");
 * *out caller-owned (dsec__pj_free). Nesting deeper than 64 is refused. */
int dsec__pj_parse(const char *text, size_t len, const char *what, dsec__pj **out, dsec_err *err);
void dsec__pj_free(dsec__pj *v);
/* The member key of an object (NULL when v is not an object or has none). */
const dsec__pj *dsec__pj_get(const dsec__pj *v, const char *key);
/* The string member key, or NULL when absent or not a string. */
const char *dsec__pj_str(const dsec__pj *v, const char *key);

#endif
