/* image-pull-json.c - a small strict JSON reader for registry manifests, tokens and auth files. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsec/alloc.h"
#include "backends/layers/image-pull-int.h"

#define MAX_DEPTH 64

typedef struct pj_in {
    const char *p, *end, *start;
    const char *what;
    dsec_err *err;
} pj_in;

static int bad(pj_in *in, const char *why)
{
    return dsec_err_set(in->err, DSEC_E_DECODE, 0, "%s is not valid JSON: %s at byte %zu", in->what,
                        why, (size_t)(in->p - in->start));
}

static void skip_ws(pj_in *in)
{
    while (in->p < in->end && (*in->p == ' ' || *in->p == '\t' || *in->p == '\n' || *in->p == '\r'))
        in->p++;
}

static int hex4(pj_in *in, unsigned *out)
{
    if (in->end - in->p < 4)
        return bad(in, "short \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = in->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return bad(in, "bad \\u escape");
    }
    in->p += 4;
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int escape(pj_in *in, char *o, size_t *n)
{
    char c = *in->p++;
    const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
    const char *hit = c != '\0' ? strchr(from, c) : NULL;
    if (hit != NULL) {
        o[(*n)++] = to[hit - from];
        return 0;
    }
    if (c != 'u')
        return bad(in, "bad escape");
    unsigned cp;
    if (hex4(in, &cp) < 0)
        return -1;
    if (cp >= 0xD800 && cp < 0xDC00) {
        unsigned lo;
        if (in->end - in->p < 6 || in->p[0] != '\\' || in->p[1] != 'u')
            return bad(in, "lone surrogate");
        in->p += 2;
        if (hex4(in, &lo) < 0)
            return -1;
        if (lo < 0xDC00 || lo > 0xDFFF)
            return bad(in, "bad surrogate pair");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    } else if (cp >= 0xDC00 && cp < 0xE000) {
        return bad(in, "lone surrogate");
    }
    if (cp == 0)
        return bad(in, "NUL in a string");
    *n += put_utf8(o + *n, cp);
    return 0;
}

/* At the opening quote; *out dsec_malloc'd. Escapes never grow the text. */
static int string(pj_in *in, char **out)
{
    in->p++;
    const char *q = in->p;
    while (q < in->end && *q != '"')
        q += (*q == '\\' && q + 1 < in->end) ? 2 : 1;
    if (q >= in->end)
        return bad(in, "unterminated string");
    char *o = dsec_malloc((size_t)(q - in->p) + 1);
    if (o == NULL)
        return dsec_err_set(in->err, DSEC_E_NOMEM, 0, "out of memory reading %s", in->what);
    size_t n = 0;
    while (*in->p != '"') {
        unsigned char c = (unsigned char)*in->p;
        if (c < 0x20) {
            dsec_free(o);
            return bad(in, "control character in a string");
        }
        if (c == '\\') {
            in->p++;
            if (escape(in, o, &n) < 0) {
                dsec_free(o);
                return -1;
            }
        } else {
            o[n++] = (char)c;
            in->p++;
        }
    }
    in->p++;
    o[n] = '\0';
    *out = o;
    return 0;
}

static int value(pj_in *in, dsec__pj *v, unsigned depth);

static int grow(pj_in *in, dsec__pj *v, size_t *cap, bool keys)
{
    if (v->n < *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 4;
    dsec__pj *k = dsec_realloc(v->kids, nc * sizeof *k);
    if (k == NULL)
        return dsec_err_set(in->err, DSEC_E_NOMEM, 0, "out of memory reading %s", in->what);
    v->kids = k;
    if (keys) {
        char **ks = dsec_realloc(v->keys, nc * sizeof *ks);
        if (ks == NULL)
            return dsec_err_set(in->err, DSEC_E_NOMEM, 0, "out of memory reading %s", in->what);
        v->keys = ks;
    }
    *cap = nc;
    return 0;
}

/* An array or object, at its opening bracket. */
static int container(pj_in *in, dsec__pj *v, unsigned depth)
{
    bool obj = *in->p == '{';
    char close = obj ? '}' : ']';
    v->type = obj ? DSEC__PJ_OBJ : DSEC__PJ_ARR;
    in->p++;
    skip_ws(in);
    if (in->p < in->end && *in->p == close) {
        in->p++;
        return 0;
    }
    size_t cap = 0;
    for (;;) {
        if (grow(in, v, &cap, obj) < 0)
            return -1;
        dsec__pj *kid = &v->kids[v->n];
        memset(kid, 0, sizeof *kid);
        if (obj) {
            skip_ws(in);
            if (in->p >= in->end || *in->p != '"')
                return bad(in, "expected a key");
            if (string(in, &v->keys[v->n]) < 0)
                return -1;
            skip_ws(in);
            if (in->p >= in->end || *in->p != ':') {
                dsec_free(v->keys[v->n]);
                return bad(in, "expected ':'");
            }
            in->p++;
        }
        v->n++;
        if (value(in, kid, depth + 1) < 0)
            return -1;
        skip_ws(in);
        if (in->p < in->end && *in->p == ',') {
            in->p++;
            continue;
        }
        if (in->p < in->end && *in->p == close) {
            in->p++;
            return 0;
        }
        return bad(in, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static int number(pj_in *in, dsec__pj *v)
{
    const char *s = in->p;
    while (in->p < in->end && strchr("+-0123456789.eE", *in->p) != NULL && *in->p != '\0')
        in->p++;
    if (in->p == s)
        return bad(in, "unexpected character");
    v->type = DSEC__PJ_NUM;
    v->s = dsec_strndup(s, (size_t)(in->p - s));
    if (v->s == NULL)
        return dsec_err_set(in->err, DSEC_E_NOMEM, 0, "out of memory reading %s", in->what);
    return 0;
}

static int literal(pj_in *in, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(in->end - in->p) < n || memcmp(in->p, word, n) != 0)
        return bad(in, "unexpected word");
    in->p += n;
    return 0;
}

static int value(pj_in *in, dsec__pj *v, unsigned depth)
{
    if (depth > MAX_DEPTH)
        return bad(in, "nested too deep");
    skip_ws(in);
    if (in->p >= in->end)
        return bad(in, "unexpected end");
    switch (*in->p) {
    case '{':
    case '[':
        return container(in, v, depth);
    case '"':
        v->type = DSEC__PJ_STR;
        return string(in, &v->s);
    case 't':
        v->type = DSEC__PJ_BOOL;
        v->b = true;
        return literal(in, "true");
    case 'f':
        v->type = DSEC__PJ_BOOL;
        return literal(in, "false");
    case 'n':
        v->type = DSEC__PJ_NULL;
        return literal(in, "null");
    default:
        return number(in, v);
    }
}

static void pj_clear(dsec__pj *v)
{
    for (size_t i = 0; i < v->n; i++) {
        pj_clear(&v->kids[i]);
        if (v->keys != NULL)
            dsec_free(v->keys[i]);
    }
    dsec_free(v->kids);
    dsec_free(v->keys);
    dsec_free(v->s);
}

void dsec__pj_free(dsec__pj *v)
{
    if (v == NULL)
        return;
    pj_clear(v);
    dsec_free(v);
}

int dsec__pj_parse(const char *text, size_t len, const char *what, dsec__pj **out, dsec_err *err)
{
    pj_in in = {.p = text, .end = text + len, .start = text, .what = what, .err = err};
    dsec__pj *v = dsec_calloc(1, sizeof *v);
    if (v == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory reading %s", what);
    if (value(&in, v, 0) < 0) {
        dsec__pj_free(v);
        return -1;
    }
    skip_ws(&in);
    if (in.p != in.end) {
        dsec__pj_free(v);
        return bad(&in, "trailing bytes");
    }
    *out = v;
    return 0;
}

const dsec__pj *dsec__pj_get(const dsec__pj *v, const char *key)
{
    if (v == NULL || v->type != DSEC__PJ_OBJ)
        return NULL;
    for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->keys[i], key) == 0)
            return &v->kids[i];
    return NULL;
}

const char *dsec__pj_str(const dsec__pj *v, const char *key)
{
    const dsec__pj *m = dsec__pj_get(v, key);
    return m != NULL && m->type == DSEC__PJ_STR ? m->s : NULL;
}
