/* json.h - a small strict JSON parser into a tree (image manifests, configs, indexes). */
#ifndef DSEC_JSON_H
#define DSEC_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsec/err.h"

/*
 * RFC 8259, strictly: one value, no trailing commas, no comments, no
 * control characters in strings, valid UTF-8 escapes (surrogate pairs
 * joined), numbers in JSON's grammar. Bounded: nesting at most
 * DSEC_JSON_MAX_DEPTH, at most DSEC_JSON_MAX_NODES values, and input at
 * most the caller's max length. Errors are DSEC_E_DECODE with the byte
 * offset of the fault ("JSON at byte 17: expected ':'").
 * Duplicate object keys are refused (a manifest that says two things is not
 * one we can check).
 */
#define DSEC_JSON_MAX_DEPTH 64
#define DSEC_JSON_MAX_NODES 1000000

typedef enum dsec_json_type {
    DSEC_JSON_NULL,
    DSEC_JSON_BOOL,
    DSEC_JSON_NUMBER,
    DSEC_JSON_STRING,
    DSEC_JSON_ARRAY,
    DSEC_JSON_OBJECT,
} dsec_json_type;

typedef struct dsec_json dsec_json;
struct dsec_json {
    dsec_json_type type;
    bool b;
    double num;        /* NUMBER */
    char *str;         /* STRING (NUL-terminated; an embedded \u0000 is refused) */
    size_t len;        /* STRING bytes; ARRAY/OBJECT members */
    char **keys;       /* OBJECT: len keys */
    dsec_json **items; /* ARRAY/OBJECT: len values */
};

/* Parse len bytes; *out caller-owned (dsec_json_free). */
int dsec_json_parse(const char *text, size_t len, dsec_json **out, dsec_err *err);
void dsec_json_free(dsec_json *j);

/* Lookups that return NULL when absent or of another type. */
const dsec_json *dsec_json_get(const dsec_json *obj, const char *key);
const char *dsec_json_get_str(const dsec_json *obj, const char *key);
const dsec_json *dsec_json_get_array(const dsec_json *obj, const char *key);
const dsec_json *dsec_json_get_object(const dsec_json *obj, const char *key);
/* A NUMBER that is a whole number in [0, 2^53]; -1 otherwise. */
int64_t dsec_json_get_uint(const dsec_json *obj, const char *key);

#endif
