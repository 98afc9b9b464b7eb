/* json.c - render any msgpack value as valid JSON, for `dsec decode` and logs. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/codec.h"
#include "codecs/msg.h"

typedef struct jctx {
    dsec_buf *b;
    dsec_err *err;
    bool pretty;
} jctx;

static int put(const jctx *j, const char *s, size_t n)
{
    return dsec_buf_append(j->b, s, n, j->err);
}

#define PUT_LIT(j, lit) put((j), (lit), sizeof(lit) - 1)

static int newline(const jctx *j, unsigned depth)
{
    if (!j->pretty)
        return 0;
    if (dsec_buf_reserve(j->b, 1 + 2 * (size_t)depth, j->err) < 0)
        return -1;
    j->b->data[j->b->len++] = '\n';
    memset(j->b->data + j->b->len, ' ', 2 * (size_t)depth);
    j->b->len += 2 * (size_t)depth;
    return 0;
}

/* s is valid UTF-8: copy it, escaping what JSON requires. */
static int put_string(const jctx *j, const char *s, size_t n)
{
    if (n == 0) /* msgpack-c gives an empty string a NULL pointer */
        return PUT_LIT(j, "\"\"");
    if (PUT_LIT(j, "\"") < 0)
        return -1;
    size_t run = 0; /* start of the bytes not yet copied */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        if (put(j, s + run, i - run) < 0)
            return -1;
        run = i + 1;
        char esc[8];
        switch (c) {
        case '"':
        case '\\':
            esc[0] = '\\';
            esc[1] = (char)c;
            esc[2] = '\0';
            break;
        case '\n':
            memcpy(esc, "\\n", 3);
            break;
        case '\r':
            memcpy(esc, "\\r", 3);
            break;
        case '\t':
            memcpy(esc, "\\t", 3);
            break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
        }
        if (put(j, esc, strlen(esc)) < 0)
            return -1;
    }
    if (put(j, s + run, n - run) < 0)
        return -1;
    return PUT_LIT(j, "\"");
}

static int put_base64(const jctx *j, const void *p, size_t n)
{
    if (PUT_LIT(j, "\"") < 0 || dsec__base64_append(j->b, p, n, j->err) < 0)
        return -1;
    return PUT_LIT(j, "\"");
}

static int put_bin(const jctx *j, const void *p, size_t n)
{
    if (PUT_LIT(j, "{\"$bin\":") < 0 || put_base64(j, p, n) < 0)
        return -1;
    return PUT_LIT(j, "}");
}

static int put_ext(const jctx *j, const msgpack_object_ext *e)
{
    if (dsec__buf_printf(j->b, j->err, "{\"$ext\":%d,\"data\":", (int)e->type) < 0 ||
        put_base64(j, e->ptr, e->size) < 0)
        return -1;
    return PUT_LIT(j, "}");
}

/* The shortest decimal that reads back as the same value, in JSON syntax. */
static int put_float(const jctx *j, double v, bool single)
{
    if (!isfinite(v))
        return PUT_LIT(j, "null"); /* JSON has no NaN or infinity */
    char tmp[40];
    int lo = single ? 6 : 15, hi = single ? 9 : 17;
    for (int prec = lo; prec <= hi; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, v);
        double back = strtod(tmp, NULL);
        if (single ? (float)back == (float)v : back == v)
            break;
    }
    for (char *c = tmp; *c != '\0'; c++)
        if (*c == ',') /* a locale with a decimal comma */
            *c = '.';
    return put(j, tmp, strlen(tmp));
}

static int put_value(const jctx *j, const msgpack_object *o, unsigned depth);

/* JSON keys are strings: a key that is not a UTF-8 string becomes the JSON
 * text of its value, as a string ({"1": ...} for the integer key 1). */
static int put_key(const jctx *j, const msgpack_object *k, unsigned depth)
{
    if (k->type == MSGPACK_OBJECT_STR && dsec__utf8_valid(k->via.str.ptr, k->via.str.size))
        return put_string(j, k->via.str.ptr, k->via.str.size);
    dsec_buf tmp;
    dsec_buf_init(&tmp);
    jctx t = {.b = &tmp, .err = j->err, .pretty = false};
    int rc = put_value(&t, k, depth);
    if (rc == 0)
        rc = put_string(j, tmp.data, tmp.len);
    dsec_buf_release(&tmp);
    return rc;
}

static int put_array(const jctx *j, const msgpack_object_array *a, unsigned depth)
{
    if (a->size == 0)
        return PUT_LIT(j, "[]");
    if (PUT_LIT(j, "[") < 0)
        return -1;
    for (uint32_t i = 0; i < a->size; i++) {
        if ((i > 0 && PUT_LIT(j, ",") < 0) || newline(j, depth + 1) < 0 ||
            put_value(j, &a->ptr[i], depth + 1) < 0)
            return -1;
    }
    if (newline(j, depth) < 0)
        return -1;
    return PUT_LIT(j, "]");
}

static int put_map(const jctx *j, const msgpack_object_map *m, unsigned depth)
{
    if (m->size == 0)
        return PUT_LIT(j, "{}");
    if (PUT_LIT(j, "{") < 0)
        return -1;
    for (uint32_t i = 0; i < m->size; i++) {
        if ((i > 0 && PUT_LIT(j, ",") < 0) || newline(j, depth + 1) < 0 ||
            put_key(j, &m->ptr[i].key, depth + 1) < 0)
            return -1;
        if ((j->pretty ? PUT_LIT(j, ": ") : PUT_LIT(j, ":")) < 0 ||
            put_value(j, &m->ptr[i].val, depth + 1) < 0)
            return -1;
    }
    if (newline(j, depth) < 0)
        return -1;
    return PUT_LIT(j, "}");
}

static int put_value(const jctx *j, const msgpack_object *o, unsigned depth)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return PUT_LIT(j, "null");
    case MSGPACK_OBJECT_BOOLEAN:
        return o->via.boolean ? PUT_LIT(j, "true") : PUT_LIT(j, "false");
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return dsec__buf_printf(j->b, j->err, "%llu", (unsigned long long)o->via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return dsec__buf_printf(j->b, j->err, "%lld", (long long)o->via.i64);
    case MSGPACK_OBJECT_FLOAT32:
        return put_float(j, o->via.f64, true);
    case MSGPACK_OBJECT_FLOAT64:
        return put_float(j, o->via.f64, false);
    case MSGPACK_OBJECT_STR:
        if (dsec__utf8_valid(o->via.str.ptr, o->via.str.size))
            return put_string(j, o->via.str.ptr, o->via.str.size);
        return put_bin(j, o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_BIN:
        return put_bin(j, o->via.bin.ptr, o->via.bin.size);
    case MSGPACK_OBJECT_EXT:
        return put_ext(j, &o->via.ext);
    case MSGPACK_OBJECT_ARRAY:
        return put_array(j, &o->via.array, depth);
    case MSGPACK_OBJECT_MAP:
        return put_map(j, &o->via.map, depth);
    }
    return dsec_err_set(j->err, DSEC_E_INTERNAL, 0, "json: msgpack object type %d", (int)o->type);
}

int dsec_msgpack_to_json_ex(dsec_buf *b, const void *buf, size_t len, unsigned flags, dsec_err *err)
{
    if (b == NULL || (buf == NULL && len != 0))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "json: no buffer or input");
    b->len = 0;
    dsec__mp_shape shape;
    if (dsec__mp_scan(buf, len, DSEC_JSON_MAX_DEPTH, &shape, err) < 0)
        return -1;
    if (shape.end != len)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "payload: %zu trailing bytes after the message",
                            len - shape.end);
    /* One chunk that holds the whole tree: the scan measured it. */
    msgpack_zone zone;
    size_t chunk = shape.zone_bytes < 1024 ? 1024 : shape.zone_bytes;
    if (!msgpack_zone_init(&zone, chunk))
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "json: out of memory for %zu bytes", chunk);
    msgpack_object root;
    int rc = dsec__mp_unpack(&zone, 0, buf, &shape, &root, err);
    if (rc == 0) {
        jctx j = {.b = b, .err = err, .pretty = (flags & DSEC_JSON_PRETTY) != 0};
        rc = put_value(&j, &root, 0);
    }
    msgpack_zone_destroy(&zone);
    if (rc < 0)
        b->len = 0;
    return rc;
}

int dsec_msgpack_to_json(dsec_buf *b, const void *buf, size_t len, dsec_err *err)
{
    return dsec_msgpack_to_json_ex(b, buf, len, 0, err);
}
