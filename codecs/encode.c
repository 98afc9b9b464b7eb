/* encode.c - validate a message struct against its schema, then pack it as a msgpack map. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/codec.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"

enum { SMALL_MAP = 16 };

/* Where validation is: the list item being checked, for error messages. */
typedef struct ectx {
    const dsec_codec_limits *lim;
    dsec_err *err;
    const char *list;
    uint32_t idx;
} ectx;

static int efail(const ectx *c, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int efail(const ectx *c, const char *field, const char *fmt, ...)
{
    char name[128];
    if (c->list != NULL)
        snprintf(name, sizeof name, "%s[%u].%s", c->list, c->idx, field);
    else
        snprintf(name, sizeof name, "%s", field);
    char msg[DSEC_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dsec_err_set(c->err, DSEC_E_INVALID, 0, "field \"%s\": %s", name, msg);
}

#define AT(src, T) (*(const T *)(src))

/* Whether the field goes on the wire: optional zero values are omitted. */
static bool present(const dsec_field *f, const void *src)
{
    switch (f->kind) {
    case DSEC_F_STR: {
        const char *s = AT(src, char *);
        return s != NULL && s[0] != '\0';
    }
    case DSEC_F_BIN:
        return AT(src, dsec_bytes).len != 0;
    case DSEC_F_U64:
        return f->required || AT(src, uint64_t) != 0;
    case DSEC_F_I64:
        return f->required || AT(src, int64_t) != 0;
    case DSEC_F_BOOL:
        return f->required || AT(src, bool);
    case DSEC_F_STRV:
        return AT(src, dsec_strv).n != 0;
    case DSEC_F_KV:
        return AT(src, dsec_kv).n != 0;
    case DSEC_F_LIST:
        return AT(src, dsec_list).n != 0;
    }
    return false;
}

/* One string as the decoder will check it. what is "" or "item 3: ". */
static int check_str(const ectx *c, const dsec_field *f, const char *what, const char *s,
                     uint32_t limit)
{
    if (s == NULL)
        return efail(c, f->name, "%sNULL string", what);
    size_t n = strlen(s);
    if (n > limit)
        return efail(c, f->name, "%s%zu bytes exceeds limit %u", what, n, limit);
    if (!dsec__utf8_valid(s, n))
        return efail(c, f->name, "%sstring is not valid UTF-8", what);
    return 0;
}

static int check_count(const ectx *c, const dsec_field *f, const void *arr, uint32_t n)
{
    uint32_t limit = dsec__field_limit(f, c->lim);
    if (arr == NULL)
        return efail(c, f->name, "%u items but a NULL array", n);
    if (n > limit)
        return efail(c, f->name, "%u items exceeds limit %u", n, limit);
    return 0;
}

static int check_strv(const ectx *c, const dsec_field *f, const dsec_strv *v)
{
    if (check_count(c, f, v->v, v->n) < 0)
        return -1;
    uint32_t limit = dsec__item_limit(f, c->lim);
    for (uint32_t i = 0; i < v->n; i++) {
        char what[32];
        snprintf(what, sizeof what, "item %u: ", i);
        if (check_str(c, f, what, v->v[i], limit) < 0)
            return -1;
    }
    return 0;
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The decoder refuses repeated keys, so never send them. */
static int check_kv_dups(const ectx *c, const dsec_field *f, const dsec_kv *kv)
{
    const char *dup = NULL;
    if (kv->n <= SMALL_MAP) {
        for (uint32_t i = 1; i < kv->n && dup == NULL; i++)
            for (uint32_t j = 0; j < i && dup == NULL; j++)
                if (strcmp(kv->k[i], kv->k[j]) == 0)
                    dup = kv->k[i];
    } else {
        const char **sorted DSEC_AUTOFREE = dsec_malloc(kv->n * sizeof *sorted);
        if (sorted == NULL)
            return dsec_err_set(c->err, DSEC_E_NOMEM, 0, "encode: out of memory");
        memcpy(sorted, kv->k, kv->n * sizeof *sorted);
        qsort(sorted, kv->n, sizeof *sorted, str_cmp);
        for (uint32_t i = 1; i < kv->n && dup == NULL; i++)
            if (strcmp(sorted[i], sorted[i - 1]) == 0)
                dup = sorted[i];
    }
    if (dup == NULL)
        return 0;
    char name[80];
    dsec__quote(name, sizeof name, dup, strlen(dup));
    return efail(c, f->name, "duplicate key \"%s\"", name);
}

static int check_kv(const ectx *c, const dsec_field *f, const dsec_kv *kv)
{
    if (check_count(c, f, kv->k, kv->n) < 0 || check_count(c, f, kv->v, kv->n) < 0)
        return -1;
    uint32_t limit = dsec__item_limit(f, c->lim);
    for (uint32_t i = 0; i < kv->n; i++) {
        char what[32];
        snprintf(what, sizeof what, "key %u: ", i);
        if (check_str(c, f, what, kv->k[i], limit) < 0)
            return -1;
        snprintf(what, sizeof what, "value %u: ", i);
        if (check_str(c, f, what, kv->v[i], limit) < 0)
            return -1;
    }
    return check_kv_dups(c, f, kv);
}

static int check_map(const ectx *c, const dsec_schema *s, const void *msg);

static int check_list(const ectx *c, const dsec_field *f, const dsec_list *l)
{
    const dsec_schema *sub = dsec_schema_of(f->sub_type);
    if (sub == NULL)
        return dsec_err_set(c->err, DSEC_E_INTERNAL, 0, "schema: field \"%s\" has no item type",
                            f->name);
    if (check_count(c, f, l->items, l->n) < 0)
        return -1;
    for (uint32_t i = 0; i < l->n; i++) {
        ectx inner = {.lim = c->lim, .err = c->err, .list = f->name, .idx = i};
        if (check_map(&inner, sub, (const char *)l->items + (size_t)i * sub->size) < 0)
            return -1;
    }
    return 0;
}

static int range_fail(const ectx *c, const dsec_field *f, const char *val)
{
    return efail(c, f->name, "%s out of range %lld..%lld", val, (long long)f->min,
                 (long long)f->max);
}

static int check_ints(const ectx *c, const dsec_field *f, const void *src)
{
    char val[24];
    if (!dsec__field_ranged(f))
        return 0;
    if (f->kind == DSEC_F_U64) {
        uint64_t v = AT(src, uint64_t);
        if (v >= (uint64_t)f->min && v <= (uint64_t)f->max)
            return 0;
        snprintf(val, sizeof val, "%llu", (unsigned long long)v);
    } else {
        int64_t v = AT(src, int64_t);
        if (v >= f->min && v <= f->max)
            return 0;
        snprintf(val, sizeof val, "%lld", (long long)v);
    }
    return range_fail(c, f, val);
}

/* A present value, checked as the decoder will check it. */
static int check_value(const ectx *c, const dsec_field *f, const void *src)
{
    switch (f->kind) {
    case DSEC_F_STR:
        return check_str(c, f, "", AT(src, char *), dsec__field_limit(f, c->lim));
    case DSEC_F_BIN: {
        const dsec_bytes *b = src;
        if (b->ptr == NULL)
            return efail(c, f->name, "%zu bytes but a NULL pointer", b->len);
        if (b->len > dsec__field_limit(f, c->lim))
            return efail(c, f->name, "%zu bytes exceeds limit %u", b->len,
                         dsec__field_limit(f, c->lim));
        return 0;
    }
    case DSEC_F_U64:
    case DSEC_F_I64:
        return check_ints(c, f, src);
    case DSEC_F_BOOL:
        return 0;
    case DSEC_F_STRV:
        return check_strv(c, f, src);
    case DSEC_F_KV:
        return check_kv(c, f, src);
    case DSEC_F_LIST:
        return check_list(c, f, src);
    }
    return dsec_err_set(c->err, DSEC_E_INTERNAL, 0, "schema: field \"%s\" has kind %d", f->name,
                        (int)f->kind);
}

static int check_map(const ectx *c, const dsec_schema *s, const void *msg)
{
    for (size_t i = 0; i < s->nfields; i++) {
        const dsec_field *f = &s->fields[i];
        const void *src = (const char *)msg + f->offset;
        if (present(f, src)) {
            if (check_value(c, f, src) < 0)
                return -1;
        } else if (f->required) {
            bool empty = f->kind == DSEC_F_STR && AT(src, char *) != NULL;
            return efail(c, f->name, "%s (required)", empty ? "empty" : "missing");
        }
    }
    return 0;
}

/* ---- packing (after validation: only allocation can fail) ------------------- */

static int pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    return msgpack_pack_str(pk, n) || msgpack_pack_str_body(pk, s, n);
}

static int pack_map(msgpack_packer *pk, const dsec_schema *s, const void *msg);

static int pack_value(msgpack_packer *pk, const dsec_field *f, const void *src)
{
    switch (f->kind) {
    case DSEC_F_STR:
        return pack_str(pk, AT(src, char *));
    case DSEC_F_BIN: {
        const dsec_bytes *b = src;
        return msgpack_pack_bin(pk, b->len) || msgpack_pack_bin_body(pk, b->ptr, b->len);
    }
    case DSEC_F_U64:
        return msgpack_pack_uint64(pk, AT(src, uint64_t));
    case DSEC_F_I64:
        return msgpack_pack_int64(pk, AT(src, int64_t));
    case DSEC_F_BOOL:
        return AT(src, bool) ? msgpack_pack_true(pk) : msgpack_pack_false(pk);
    case DSEC_F_STRV: {
        const dsec_strv *v = src;
        int rc = msgpack_pack_array(pk, v->n);
        for (uint32_t i = 0; i < v->n && rc == 0; i++)
            rc = pack_str(pk, v->v[i]);
        return rc;
    }
    case DSEC_F_KV: {
        const dsec_kv *kv = src;
        int rc = msgpack_pack_map(pk, kv->n);
        for (uint32_t i = 0; i < kv->n && rc == 0; i++)
            rc = pack_str(pk, kv->k[i]) || pack_str(pk, kv->v[i]);
        return rc;
    }
    case DSEC_F_LIST: {
        const dsec_list *l = src;
        const dsec_schema *sub = dsec_schema_of(f->sub_type);
        int rc = msgpack_pack_array(pk, l->n);
        for (uint32_t i = 0; i < l->n && rc == 0; i++)
            rc = pack_map(pk, sub, (const char *)l->items + (size_t)i * sub->size);
        return rc;
    }
    }
    return -1;
}

static int pack_map(msgpack_packer *pk, const dsec_schema *s, const void *msg)
{
    uint32_t n = 0;
    for (size_t i = 0; i < s->nfields; i++)
        n += present(&s->fields[i], (const char *)msg + s->fields[i].offset);
    int rc = msgpack_pack_map(pk, n);
    for (size_t i = 0; i < s->nfields && rc == 0; i++) {
        const dsec_field *f = &s->fields[i];
        const void *src = (const char *)msg + f->offset;
        if (present(f, src))
            rc = pack_str(pk, f->name) || pack_value(pk, f, src);
    }
    return rc;
}

int dsec_encode(dsec_buf *b, int type, const void *msg, dsec_err *err)
{
    if (b == NULL || msg == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "encode: no buffer or message");
    const dsec_schema *s = dsec_schema_of(type);
    if (s == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "encode: unknown message type %d", type);
    dsec_codec_limits lim;
    dsec_codec_limits_default(&lim);
    ectx c = {.lim = &lim, .err = err};
    b->len = 0;
    if (check_map(&c, s, msg) < 0)
        return -1;
    msgpack_packer pk;
    msgpack_packer_init(&pk, b, dsec__buf_write_cb);
    if (pack_map(&pk, s, msg) != 0) {
        b->len = 0;
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "encode %s: out of memory", s->name);
    }
    if (b->len > lim.max_payload) {
        size_t n = b->len;
        b->len = 0;
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "encode %s: %zu bytes exceeds the payload limit %zu", s->name, n,
                            lim.max_payload);
    }
    return 0;
}
