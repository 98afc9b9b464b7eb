/* decode.c - strict, table-driven decoding of msgpack wire messages into their structs. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "codecs/codec.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"

enum {
    ZONE_CHUNK = 16 << 10,  /* msgpack objects of a typical message */
    ZONE_RETAIN = 1 << 20,  /* the zone grows its kept chunk up to this */
    ARENA_CHUNK = 8 << 10,  /* strings and arrays of a typical message */
    ARENA_RETAIN = 1 << 20, /* the arena keeps up to this across messages */
    SMALL_MAP = 16,         /* up to this many keys: pairwise duplicate check */
    BAD_FIELD_MAX = 128,
};

struct dsec_decoder {
    dsec_codec_limits lim;
    msgpack_zone zone;
    dsec__arena arena;
    const msgpack_object **keys; /* scratch for the duplicate-key check */
    size_t keys_cap;
    char bad_field[BAD_FIELD_MAX];
};

/* Where decoding is: the list item being decoded, for error messages. */
typedef struct dctx {
    dsec_decoder *d;
    dsec_err *err;
    const char *list; /* the enclosing list field, inside one of its items */
    uint32_t idx;
} dctx;

void dsec_codec_limits_default(dsec_codec_limits *out)
{
    out->max_payload = 8u << 20;
    out->max_str = 4096;
    out->max_bin = 8u << 20;
    out->max_items = 65536;
}

dsec_decoder *dsec_decoder_new(const dsec_codec_limits *limits)
{
    dsec_decoder *d = dsec_calloc(1, sizeof *d);
    if (d == NULL)
        return NULL;
    dsec_codec_limits def;
    dsec_codec_limits_default(&def);
    d->lim = limits != NULL ? *limits : def;
    /* A zero limit means "the default", so callers can set only what they care about. */
    if (d->lim.max_payload == 0)
        d->lim.max_payload = def.max_payload;
    if (d->lim.max_str == 0)
        d->lim.max_str = def.max_str;
    if (d->lim.max_bin == 0)
        d->lim.max_bin = def.max_bin;
    if (d->lim.max_items == 0)
        d->lim.max_items = def.max_items;
    if (!msgpack_zone_init(&d->zone, ZONE_CHUNK)) {
        dsec_free(d);
        return NULL;
    }
    dsec__arena_init(&d->arena, ARENA_CHUNK, ARENA_RETAIN);
    return d;
}

void dsec_decoder_free(dsec_decoder *d)
{
    if (d == NULL)
        return;
    msgpack_zone_destroy(&d->zone);
    dsec__arena_release(&d->arena);
    dsec_free(d->keys);
    dsec_free(d);
}

const char *dsec_decoder_bad_field(const dsec_decoder *d)
{
    return d != NULL ? d->bad_field : "";
}

/* ---- errors ---------------------------------------------------------------- */

static int vfail(const dctx *c, const char *field, int code, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

static int vfail(const dctx *c, const char *field, int code, const char *fmt, va_list ap)
{
    dsec_decoder *d = c->d;
    if (c->list != NULL && field != NULL)
        snprintf(d->bad_field, sizeof d->bad_field, "%s[%u].%s", c->list, c->idx, field);
    else if (c->list != NULL)
        snprintf(d->bad_field, sizeof d->bad_field, "%s[%u]", c->list, c->idx);
    else
        snprintf(d->bad_field, sizeof d->bad_field, "%s", field != NULL ? field : "");
    char msg[DSEC_ERR_MSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (d->bad_field[0] == '\0')
        return dsec_err_set(c->err, code, 0, "payload: %s", msg);
    return dsec_err_set(c->err, code, 0, "field \"%s\": %s", d->bad_field, msg);
}

/* Fail naming field (NULL: the map being decoded itself). */
static int fail(const dctx *c, const char *field, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(const dctx *c, const char *field, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(c, field, code, fmt, ap);
    va_end(ap);
    return -1;
}

/* Fail about one string inside an array or map field: "key 2: ...". */
static int item_fail(const dctx *c, const dsec_field *f, const char *role, uint32_t idx, int code,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static int item_fail(const dctx *c, const dsec_field *f, const char *role, uint32_t idx, int code,
                     const char *fmt, ...)
{
    char what[DSEC_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (role == NULL)
        return fail(c, f->name, code, "%s", what);
    return fail(c, f->name, code, "%s %u: %s", role, idx, what);
}

static int type_fail(const dctx *c, const dsec_field *f, const char *want, const msgpack_object *o)
{
    return fail(c, f->name, DSEC_E_DECODE, "expected %s, got %s", want, dsec__mp_type_name(o));
}

static int nomem(const dctx *c)
{
    return dsec_err_set(c->err, DSEC_E_NOMEM, 0, "decoder: out of memory");
}

/* ---- map keys -------------------------------------------------------------- */

static int key_cmp(const void *a, const void *b)
{
    const msgpack_object *x = *(const msgpack_object *const *)a;
    const msgpack_object *y = *(const msgpack_object *const *)b;
    if (x->via.str.size != y->via.str.size)
        return x->via.str.size < y->via.str.size ? -1 : 1;
    return x->via.str.size == 0 ? 0 : memcmp(x->via.str.ptr, y->via.str.ptr, x->via.str.size);
}

static bool key_eq(const msgpack_object *x, const msgpack_object *y)
{
    return key_cmp(&x, &y) == 0;
}

/* In-place heapsort of key pointers: O(n log n) like qsort, but glibc's
 * qsort may malloc a buffer, and decoding must not allocate per message. */
static void sift_down(const msgpack_object **k, size_t root, size_t n)
{
    for (size_t child; (child = 2 * root + 1) < n; root = child) {
        if (child + 1 < n && key_cmp(&k[child], &k[child + 1]) < 0)
            child++;
        if (key_cmp(&k[root], &k[child]) >= 0)
            return;
        const msgpack_object *t = k[root];
        k[root] = k[child];
        k[child] = t;
    }
}

static void sort_keys(const msgpack_object **k, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift_down(k, i, n);
    for (size_t end = n; end-- > 1;) {
        const msgpack_object *t = k[0];
        k[0] = k[end];
        k[end] = t;
        sift_down(k, 0, end);
    }
}

/* Find a repeated key among n string keys: pairwise for small maps, by
 * sorting pointers in the decoder's scratch for big ones (never O(n^2)). */
static int find_dup(dsec_decoder *d, const msgpack_object_kv *kv, uint32_t n,
                    const msgpack_object **dup)
{
    *dup = NULL;
    if (n <= SMALL_MAP) {
        for (uint32_t i = 1; i < n; i++)
            for (uint32_t j = 0; j < i; j++)
                if (key_eq(&kv[i].key, &kv[j].key)) {
                    *dup = &kv[i].key;
                    return 0;
                }
        return 0;
    }
    if (n > d->keys_cap) {
        const msgpack_object **k = dsec_realloc(d->keys, n * sizeof *k);
        if (k == NULL)
            return -1;
        d->keys = k;
        d->keys_cap = n;
    }
    for (uint32_t i = 0; i < n; i++)
        d->keys[i] = &kv[i].key;
    sort_keys(d->keys, n);
    for (uint32_t i = 1; i < n; i++)
        if (key_eq(d->keys[i], d->keys[i - 1])) {
            *dup = d->keys[i];
            return 0;
        }
    return 0;
}

/* Keys of a message map: all strings, none repeated. */
static int check_msg_keys(const dctx *c, const msgpack_object_map *m)
{
    if (m->size > c->d->lim.max_items)
        return fail(c, NULL, DSEC_E_TOO_LARGE, "map of %u entries exceeds limit %u", m->size,
                    c->d->lim.max_items);
    for (uint32_t i = 0; i < m->size; i++)
        if (m->ptr[i].key.type != MSGPACK_OBJECT_STR)
            return fail(c, NULL, DSEC_E_DECODE, "map key %u is not a string (got %s)", i,
                        dsec__mp_type_name(&m->ptr[i].key));
    const msgpack_object *dup;
    if (find_dup(c->d, m->ptr, m->size, &dup) < 0)
        return nomem(c);
    if (dup != NULL) {
        char name[80];
        dsec__quote(name, sizeof name, dup->via.str.ptr, dup->via.str.size);
        return fail(c, name, DSEC_E_DECODE, "duplicate key");
    }
    return 0;
}

/* Unknown fields are skipped, but still may not hold oversize containers. */
static bool within_items(const dsec_codec_limits *lim, const msgpack_object *v)
{
    if (v->type == MSGPACK_OBJECT_ARRAY) {
        if (v->via.array.size > lim->max_items)
            return false;
        for (uint32_t i = 0; i < v->via.array.size; i++)
            if (!within_items(lim, &v->via.array.ptr[i]))
                return false;
    } else if (v->type == MSGPACK_OBJECT_MAP) {
        if (v->via.map.size > lim->max_items)
            return false;
        for (uint32_t i = 0; i < v->via.map.size; i++)
            if (!within_items(lim, &v->via.map.ptr[i].key) ||
                !within_items(lim, &v->via.map.ptr[i].val))
                return false;
    }
    return true;
}

static int check_unknown(const dctx *c, const msgpack_object *key, const msgpack_object *v)
{
    if (within_items(&c->d->lim, v))
        return 0;
    char name[80];
    dsec__quote(name, sizeof name, key->via.str.ptr, key->via.str.size);
    return fail(c, name, DSEC_E_TOO_LARGE, "unknown field holds a container over %u items",
                c->d->lim.max_items);
}

/* ---- values ---------------------------------------------------------------- */

/* Copy one msgpack string into the arena, NUL-terminated. role/idx name the
 * item inside an array or map field (role NULL for a plain string field). */
static int take_str(const dctx *c, const dsec_field *f, const msgpack_object *o, const char *role,
                    uint32_t idx, uint32_t limit, const char **out)
{
    if (o->type != MSGPACK_OBJECT_STR)
        return item_fail(c, f, role, idx, DSEC_E_DECODE, "expected string, got %s",
                         dsec__mp_type_name(o));
    const char *p = o->via.str.ptr;
    uint32_t n = o->via.str.size;
    if (n > limit)
        return item_fail(c, f, role, idx, DSEC_E_TOO_LARGE, "%u bytes exceeds limit %u", n, limit);
    if (n != 0 && memchr(p, '\0', n) != NULL)
        return item_fail(c, f, role, idx, DSEC_E_DECODE, "string contains a NUL byte");
    if (!dsec__utf8_valid(p, n))
        return item_fail(c, f, role, idx, DSEC_E_DECODE, "string is not valid UTF-8");
    char *s = dsec__arena_alloc(&c->d->arena, (size_t)n + 1, 1);
    if (s == NULL)
        return nomem(c);
    if (n != 0)
        memcpy(s, p, n);
    s[n] = '\0';
    *out = s;
    return 0;
}

static int take_field_str(const dctx *c, const dsec_field *f, const msgpack_object *o, void *dst)
{
    if (f->required && o->type == MSGPACK_OBJECT_STR && o->via.str.size == 0)
        return fail(c, f->name, DSEC_E_DECODE, "empty (required)");
    return take_str(c, f, o, NULL, 0, dsec__field_limit(f, &c->d->lim), dst);
}

static int take_bin(const dctx *c, const dsec_field *f, const msgpack_object *o, dsec_bytes *dst)
{
    if (o->type != MSGPACK_OBJECT_BIN)
        return type_fail(c, f, "binary", o);
    uint32_t limit = dsec__field_limit(f, &c->d->lim);
    if (o->via.bin.size > limit)
        return fail(c, f->name, DSEC_E_TOO_LARGE, "%u bytes exceeds limit %u", o->via.bin.size,
                    limit);
    dst->ptr = (const uint8_t *)o->via.bin.ptr; /* in place: points into the input */
    dst->len = o->via.bin.size;
    return 0;
}

static int range_fail(const dctx *c, const dsec_field *f, const char *val)
{
    return fail(c, f->name, DSEC_E_DECODE, "%s out of range %lld..%lld", val, (long long)f->min,
                (long long)f->max);
}

static int take_u64(const dctx *c, const dsec_field *f, const msgpack_object *o, uint64_t *dst)
{
    /* msgpack-c reports any non-negative integer, however it was encoded, as
     * POSITIVE_INTEGER; NEGATIVE_INTEGER is always below zero. */
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return type_fail(c, f, "unsigned integer", o);
    uint64_t v = o->via.u64;
    if (dsec__field_ranged(f) && (v < (uint64_t)f->min || v > (uint64_t)f->max)) {
        char val[24];
        snprintf(val, sizeof val, "%llu", (unsigned long long)v);
        return range_fail(c, f, val);
    }
    *dst = v;
    return 0;
}

static int take_i64(const dctx *c, const dsec_field *f, const msgpack_object *o, int64_t *dst)
{
    int64_t v;
    char val[24];
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > INT64_MAX) {
            snprintf(val, sizeof val, "%llu", (unsigned long long)o->via.u64);
            return fail(c, f->name, DSEC_E_DECODE, "%s out of range for a signed integer", val);
        }
        v = (int64_t)o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        v = o->via.i64;
    } else {
        return type_fail(c, f, "integer", o);
    }
    if (dsec__field_ranged(f) && (v < f->min || v > f->max)) {
        snprintf(val, sizeof val, "%lld", (long long)v);
        return range_fail(c, f, val);
    }
    *dst = v;
    return 0;
}

static int take_bool(const dctx *c, const dsec_field *f, const msgpack_object *o, bool *dst)
{
    if (o->type != MSGPACK_OBJECT_BOOLEAN)
        return type_fail(c, f, "boolean", o);
    *dst = o->via.boolean;
    return 0;
}

/* Common checks of an array or map field's size. */
static int check_count(const dctx *c, const dsec_field *f, uint32_t n)
{
    uint32_t limit = dsec__field_limit(f, &c->d->lim);
    if (n > limit)
        return fail(c, f->name, DSEC_E_TOO_LARGE, "%u items exceeds limit %u", n, limit);
    if (f->required && n == 0)
        return fail(c, f->name, DSEC_E_DECODE, "empty (required)");
    return 0;
}

static int take_strv(const dctx *c, const dsec_field *f, const msgpack_object *o, dsec_strv *dst)
{
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return type_fail(c, f, "array of strings", o);
    uint32_t n = o->via.array.size;
    if (check_count(c, f, n) < 0)
        return -1;
    if (n == 0)
        return 0;
    const char **v = dsec__arena_alloc(&c->d->arena, n * sizeof *v, sizeof(void *));
    if (v == NULL)
        return nomem(c);
    uint32_t limit = dsec__item_limit(f, &c->d->lim);
    for (uint32_t i = 0; i < n; i++)
        if (take_str(c, f, &o->via.array.ptr[i], "item", i, limit, &v[i]) < 0)
            return -1;
    dst->v = v;
    dst->n = n;
    return 0;
}

static int take_kv(const dctx *c, const dsec_field *f, const msgpack_object *o, dsec_kv *dst)
{
    if (o->type != MSGPACK_OBJECT_MAP)
        return type_fail(c, f, "map of strings", o);
    const msgpack_object_map *m = &o->via.map;
    if (check_count(c, f, m->size) < 0)
        return -1;
    if (m->size == 0)
        return 0;
    const char **k = dsec__arena_alloc(&c->d->arena, m->size * sizeof *k, sizeof(void *));
    const char **v = dsec__arena_alloc(&c->d->arena, m->size * sizeof *v, sizeof(void *));
    if (k == NULL || v == NULL)
        return nomem(c);
    uint32_t limit = dsec__item_limit(f, &c->d->lim);
    for (uint32_t i = 0; i < m->size; i++) {
        if (take_str(c, f, &m->ptr[i].key, "key", i, limit, &k[i]) < 0 ||
            take_str(c, f, &m->ptr[i].val, "value", i, limit, &v[i]) < 0)
            return -1;
    }
    const msgpack_object *dup;
    if (find_dup(c->d, m->ptr, m->size, &dup) < 0)
        return nomem(c);
    if (dup != NULL) {
        char name[80];
        dsec__quote(name, sizeof name, dup->via.str.ptr, dup->via.str.size);
        return fail(c, f->name, DSEC_E_DECODE, "duplicate key \"%s\"", name);
    }
    dst->k = k;
    dst->v = v;
    dst->n = m->size;
    return 0;
}

static int decode_map(const dctx *c, const dsec_schema *s, const msgpack_object *o, void *out);

static int take_list(const dctx *c, const dsec_field *f, const msgpack_object *o, dsec_list *dst)
{
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return type_fail(c, f, "array of maps", o);
    uint32_t n = o->via.array.size;
    if (check_count(c, f, n) < 0)
        return -1;
    const dsec_schema *sub = dsec_schema_of(f->sub_type);
    if (n == 0 || sub == NULL)
        return 0;
    char *items = dsec__arena_alloc(&c->d->arena, n * sub->size, 16);
    if (items == NULL)
        return nomem(c);
    memset(items, 0, n * sub->size);
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *it = &o->via.array.ptr[i];
        if (it->type != MSGPACK_OBJECT_MAP)
            return fail(c, f->name, DSEC_E_DECODE, "item %u: expected map, got %s", i,
                        dsec__mp_type_name(it));
        dctx inner = {.d = c->d, .err = c->err, .list = f->name, .idx = i};
        if (decode_map(&inner, sub, it, items + (size_t)i * sub->size) < 0)
            return -1;
    }
    dst->items = items;
    dst->n = n;
    return 0;
}

static int decode_field(const dctx *c, const dsec_field *f, const msgpack_object *o, void *dst)
{
    switch (f->kind) {
    case DSEC_F_STR:
        return take_field_str(c, f, o, dst);
    case DSEC_F_BIN:
        return take_bin(c, f, o, dst);
    case DSEC_F_U64:
        return take_u64(c, f, o, dst);
    case DSEC_F_I64:
        return take_i64(c, f, o, dst);
    case DSEC_F_BOOL:
        return take_bool(c, f, o, dst);
    case DSEC_F_STRV:
        return take_strv(c, f, o, dst);
    case DSEC_F_KV:
        return take_kv(c, f, o, dst);
    case DSEC_F_LIST:
        return take_list(c, f, o, dst);
    }
    return dsec_err_set(c->err, DSEC_E_INTERNAL, 0, "schema: field \"%s\" has kind %d", f->name,
                        (int)f->kind);
}

static int decode_map(const dctx *c, const dsec_schema *s, const msgpack_object *o, void *out)
{
    const msgpack_object_map *m = &o->via.map;
    if (check_msg_keys(c, m) < 0)
        return -1;
    uint64_t seen = 0;
    size_t hint = 0;
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object *k = &m->ptr[i].key;
        const dsec_field *f = dsec__field_find(s, k->via.str.ptr, k->via.str.size, &hint);
        if (f == NULL) {
            if (check_unknown(c, k, &m->ptr[i].val) < 0)
                return -1;
            continue;
        }
        seen |= UINT64_C(1) << (f - s->fields);
        if (decode_field(c, f, &m->ptr[i].val, (char *)out + f->offset) < 0)
            return -1;
    }
    for (size_t i = 0; i < s->nfields; i++)
        if (s->fields[i].required && !(seen >> i & 1))
            return fail(c, s->fields[i].name, DSEC_E_DECODE, "missing (required)");
    return 0;
}

/* ---- entry point ------------------------------------------------------------- */

static int decode_root(dsec_decoder *d, const dsec_schema *s, const uint8_t *p, size_t len,
                       void *out, dsec_err *err)
{
    if (len > d->lim.max_payload)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "payload: %zu bytes exceeds limit %zu", len,
                            d->lim.max_payload);
    dsec__mp_shape shape;
    if (dsec__mp_scan(p, len, DSEC_DECODE_MAX_DEPTH, &shape, err) < 0)
        return -1;
    if (shape.end != len)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "payload: %zu trailing bytes after the message",
                            len - shape.end);
    msgpack_object root;
    if (dsec__mp_unpack(&d->zone, ZONE_RETAIN, p, &shape, &root, err) < 0)
        return -1;
    if (root.type != MSGPACK_OBJECT_MAP)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "payload: not a msgpack map (got %s)",
                            dsec__mp_type_name(&root));
    dctx c = {.d = d, .err = err};
    return decode_map(&c, s, &root, out);
}

int dsec_decode(dsec_decoder *d, int type, const void *buf, size_t len, void *out, dsec_err *err)
{
    if (d == NULL || out == NULL || (buf == NULL && len != 0))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "decode: no decoder, input or output");
    const dsec_schema *s = dsec_schema_of(type);
    d->bad_field[0] = '\0';
    if (s == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "decode: unknown message type %d", type);
    /* The previous message's strings die here, as msg.h promises. */
    dsec__arena_reset(&d->arena);
    memset(out, 0, s->size);
    int rc = decode_root(d, s, buf, len, out, err);
    msgpack_zone_clear(&d->zone); /* the objects are not needed past this call */
    if (rc < 0)
        memset(out, 0, s->size); /* no half-filled struct pointing into the arena */
    return rc;
}
