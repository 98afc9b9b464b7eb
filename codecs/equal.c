/* equal.c - dsec_msg_equal: compare two message structs as their wire encodings would. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "codecs/codec.h"
#include "codecs/msg.h"

#define AT(src, T) (*(const T *)(src))

/* NULL and "" are the same on the wire: both are omitted. */
static bool str_eq(const char *a, const char *b)
{
    return strcmp(a != NULL ? a : "", b != NULL ? b : "") == 0;
}

static bool bytes_eq(const dsec_bytes *a, const dsec_bytes *b)
{
    return a->len == b->len && (a->len == 0 || memcmp(a->ptr, b->ptr, a->len) == 0);
}

static bool strv_eq(const dsec_strv *a, const dsec_strv *b)
{
    if (a->n != b->n)
        return false;
    for (uint32_t i = 0; i < a->n; i++)
        if (!str_eq(a->v[i], b->v[i]))
            return false;
    return true;
}

static bool kv_eq(const dsec_kv *a, const dsec_kv *b)
{
    if (a->n != b->n)
        return false;
    for (uint32_t i = 0; i < a->n; i++)
        if (!str_eq(a->k[i], b->k[i]) || !str_eq(a->v[i], b->v[i]))
            return false;
    return true;
}

static bool list_eq(int sub_type, const dsec_list *a, const dsec_list *b)
{
    const dsec_schema *s = dsec_schema_of(sub_type);
    if (a->n != b->n || s == NULL)
        return a->n == b->n;
    for (uint32_t i = 0; i < a->n; i++) {
        size_t off = (size_t)i * s->size;
        if (!dsec_msg_equal(sub_type, (const char *)a->items + off, (const char *)b->items + off))
            return false;
    }
    return true;
}

static bool field_eq(const dsec_field *f, const void *a, const void *b)
{
    switch (f->kind) {
    case DSEC_F_STR:
        return str_eq(AT(a, char *), AT(b, char *));
    case DSEC_F_BIN:
        return bytes_eq(a, b);
    case DSEC_F_U64:
        return AT(a, uint64_t) == AT(b, uint64_t);
    case DSEC_F_I64:
        return AT(a, int64_t) == AT(b, int64_t);
    case DSEC_F_BOOL:
        return AT(a, bool) == AT(b, bool);
    case DSEC_F_STRV:
        return strv_eq(a, b);
    case DSEC_F_KV:
        return kv_eq(a, b);
    case DSEC_F_LIST:
        return list_eq(f->sub_type, a, b);
    }
    return false;
}

bool dsec_msg_equal(int type, const void *a, const void *b)
{
    const dsec_schema *s = dsec_schema_of(type);
    if (s == NULL || a == NULL || b == NULL)
        return false;
    for (size_t i = 0; i < s->nfields; i++) {
        const dsec_field *f = &s->fields[i];
        if (!field_eq(f, (const char *)a + f->offset, (const char *)b + f->offset))
            return false;
    }
    return true;
}
