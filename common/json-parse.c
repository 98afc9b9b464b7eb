/* json-parse.c - a small strict JSON parser into a tree of dsec_json values. */
#include "dsec/json.h"
#include "dsec/utf8.h"

#include <stdlib.h>
#include <string.h>

#include "dsec/alloc.h"

typedef struct parser {
    const char *s;
    size_t len, pos;
    size_t nodes;
    dsec_err *err;
} parser;

static int fail(parser *p, const char *what)
{
    return dsec_err_set(p->err, DSEC_E_DECODE, 0, "JSON at byte %zu: %s", p->pos, what);
}

static void skip_ws(parser *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static dsec_json *node(parser *p, dsec_json_type t)
{
    if (++p->nodes > DSEC_JSON_MAX_NODES) {
        fail(p, "too many values");
        return NULL;
    }
    dsec_json *j = dsec_calloc(1, sizeof *j);
    if (j == NULL)
        dsec_err_set(p->err, DSEC_E_NOMEM, 0, "parsing JSON: out of memory");
    else
        j->type = t;
    return j;
}

static int hex4(parser *p, unsigned *out)
{
    if (p->len - p->pos < 4)
        return fail(p, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos + (size_t)i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return fail(p, "bad hex digit in \\u escape");
    }
    p->pos += 4;
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
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* One \uXXXX (a surrogate pair joined) after the backslash-u. */
static int unicode_escape(parser *p, char *o, size_t *n)
{
    unsigned cp;
    if (hex4(p, &cp) < 0)
        return -1;
    if (cp >= 0xdc00 && cp <= 0xdfff)
        return fail(p, "lone low surrogate in \\u escape");
    if (cp >= 0xd800 && cp <= 0xdbff) {
        unsigned lo;
        if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
            return fail(p, "high surrogate without its low half");
        p->pos += 2;
        if (hex4(p, &lo) < 0)
            return -1;
        if (lo < 0xdc00 || lo > 0xdfff)
            return fail(p, "high surrogate without its low half");
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    }
    if (cp == 0)
        return fail(p, "\\u0000 in a string");
    *n = put_utf8(o, cp);
    return 0;
}

/* A string at p->pos (the opening quote); *out dsec_malloc'd. */
static int parse_string(parser *p, char **out, size_t *outlen)
{
    p->pos++;
    size_t start = p->pos, cap = 16;
    char *o = dsec_malloc(cap);
    size_t n = 0;
    if (o == NULL)
        return dsec_err_set(p->err, DSEC_E_NOMEM, 0, "parsing JSON: out of memory");
    for (;;) {
        if (p->pos >= p->len) {
            p->pos = start - 1;
            dsec_free(o);
            return fail(p, "unterminated string");
        }
        if (cap - n < 8) {
            char *no = dsec_realloc(o, cap * 2);
            if (no == NULL) {
                dsec_free(o);
                return dsec_err_set(p->err, DSEC_E_NOMEM, 0, "parsing JSON: out of memory");
            }
            o = no;
            cap *= 2;
        }
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) {
            dsec_free(o);
            return fail(p, "control character in a string");
        }
        if (c >= 0x80) {
            size_t k = dsec_utf8_seq((const unsigned char *)p->s + p->pos, p->len - p->pos);
            if (k == 0) {
                dsec_free(o);
                return fail(p, "invalid UTF-8 in a string");
            }
            memcpy(o + n, p->s + p->pos, k);
            n += k;
            p->pos += k;
            continue;
        }
        if (c != '\\') {
            o[n++] = (char)c;
            p->pos++;
            continue;
        }
        if (++p->pos >= p->len) {
            dsec_free(o);
            return fail(p, "truncated escape");
        }
        char e = p->s[p->pos++];
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        const char *hit = strchr(from, e);
        if (e == 'u') {
            size_t k = 0;
            if (unicode_escape(p, o + n, &k) < 0) {
                dsec_free(o);
                return -1;
            }
            n += k;
        } else if (e != '\0' && hit != NULL) {
            o[n++] = to[hit - from];
        } else {
            p->pos--;
            dsec_free(o);
            return fail(p, "unknown escape");
        }
    }
    o[n] = '\0';
    *out = o;
    *outlen = n;
    return 0;
}

static int parse_number(parser *p, dsec_json *j)
{
    size_t st = p->pos;
    const char *s = p->s;
    size_t i = p->pos;
    if (i < p->len && s[i] == '-')
        i++;
    if (i >= p->len || s[i] < '0' || s[i] > '9')
        return fail(p, "bad number");
    if (s[i] == '0')
        i++;
    else
        while (i < p->len && s[i] >= '0' && s[i] <= '9')
            i++;
    if (i < p->len && s[i] == '.') {
        i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9')
            return fail(p, "bad number: no digit after '.'");
        while (i < p->len && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9')
            return fail(p, "bad number: no digit in the exponent");
        while (i < p->len && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    char buf[64];
    if (i - st >= sizeof buf)
        return fail(p, "number too long");
    memcpy(buf, s + st, i - st);
    buf[i - st] = '\0';
    j->num = strtod(buf, NULL);
    if (j->num > 1.7e308 || j->num < -1.7e308)
        return fail(p, "number out of range");
    p->pos = i;
    return 0;
}

static int parse_value(parser *p, int depth, dsec_json **out);

static int add_member(parser *p, dsec_json *j, char *key, dsec_json *v)
{
    if ((j->len & (j->len - 1)) == 0) { /* 0, 1, 2, 4, ...: grow */
        size_t cap = j->len == 0 ? 4 : j->len * 2;
        dsec_json **ni = dsec_realloc(j->items, cap * sizeof *ni);
        if (ni != NULL)
            j->items = ni;
        char **nk = j->type == DSEC_JSON_OBJECT ? dsec_realloc(j->keys, cap * sizeof *nk) : NULL;
        if (nk != NULL)
            j->keys = nk;
        if (ni == NULL || (j->type == DSEC_JSON_OBJECT && nk == NULL)) {
            dsec_free(key);
            dsec_json_free(v);
            return dsec_err_set(p->err, DSEC_E_NOMEM, 0, "parsing JSON: out of memory");
        }
    }
    if (j->type == DSEC_JSON_OBJECT)
        j->keys[j->len] = key;
    j->items[j->len++] = v;
    return 0;
}

static int parse_container(parser *p, int depth, dsec_json *j)
{
    bool obj = j->type == DSEC_JSON_OBJECT;
    char close = obj ? '}' : ']';
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return 0;
    }
    for (;;) {
        skip_ws(p);
        char *key = NULL;
        if (obj) {
            size_t klen, kpos = p->pos;
            if (p->pos >= p->len || p->s[p->pos] != '"')
                return fail(p, "expected a string key");
            if (parse_string(p, &key, &klen) < 0)
                return -1;
            for (size_t i = 0; i < j->len; i++)
                if (strcmp(j->keys[i], key) == 0) {
                    dsec_free(key);
                    p->pos = kpos;
                    return fail(p, "duplicate key");
                }
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') {
                dsec_free(key);
                return fail(p, "expected ':'");
            }
            p->pos++;
        }
        dsec_json *v;
        if (parse_value(p, depth + 1, &v) < 0) {
            dsec_free(key);
            return -1;
        }
        if (add_member(p, j, key, v) < 0)
            return -1;
        skip_ws(p);
        if (p->pos >= p->len)
            return fail(p, obj ? "unterminated object" : "unterminated array");
        char c = p->s[p->pos++];
        if (c == close)
            return 0;
        if (c != ',') {
            p->pos--;
            return fail(p, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
}

static int parse_value(parser *p, int depth, dsec_json **out)
{
    *out = NULL;
    if (depth > DSEC_JSON_MAX_DEPTH)
        return fail(p, "nested too deep");
    skip_ws(p);
    if (p->pos >= p->len)
        return fail(p, "expected a value, found the end");
    char c = p->s[p->pos];
    static const struct {
        const char *word;
        dsec_json_type t;
        bool b;
    } words[] = {{"null", DSEC_JSON_NULL, false},
                 {"true", DSEC_JSON_BOOL, true},
                 {"false", DSEC_JSON_BOOL, false}};
    dsec_json *j = NULL;
    int rc = 0;
    if (c == '{' || c == '[') {
        if ((j = node(p, c == '{' ? DSEC_JSON_OBJECT : DSEC_JSON_ARRAY)) == NULL)
            return -1;
        rc = parse_container(p, depth, j);
    } else if (c == '"') {
        if ((j = node(p, DSEC_JSON_STRING)) == NULL)
            return -1;
        rc = parse_string(p, &j->str, &j->len);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        if ((j = node(p, DSEC_JSON_NUMBER)) == NULL)
            return -1;
        rc = parse_number(p, j);
    } else {
        for (size_t i = 0; i < 3 && j == NULL; i++) {
            size_t wl = strlen(words[i].word);
            if (p->len - p->pos >= wl && memcmp(p->s + p->pos, words[i].word, wl) == 0) {
                if ((j = node(p, words[i].t)) == NULL)
                    return -1;
                j->b = words[i].b;
                p->pos += wl;
            }
        }
        if (j == NULL)
            return fail(p, "unexpected character");
    }
    if (rc < 0) {
        dsec_json_free(j);
        return -1;
    }
    *out = j;
    return 0;
}

int dsec_json_parse(const char *text, size_t len, dsec_json **out, dsec_err *err)
{
    parser p = {.s = text, .len = len, .err = err};
    *out = NULL;
    dsec_json *j;
    if (parse_value(&p, 0, &j) < 0)
        return -1;
    skip_ws(&p);
    if (p.pos != p.len) {
        dsec_json_free(j);
        return fail(&p, "trailing data after the value");
    }
    *out = j;
    return 0;
}

void dsec_json_free(dsec_json *j)
{
    if (j == NULL)
        return;
    for (size_t i = 0; (j->type == DSEC_JSON_ARRAY || j->type == DSEC_JSON_OBJECT) && i < j->len;
         i++) {
        dsec_json_free(j->items[i]);
        if (j->keys != NULL)
            dsec_free(j->keys[i]);
    }
    dsec_free(j->items);
    dsec_free(j->keys);
    dsec_free(j->str);
    dsec_free(j);
}

const dsec_json *dsec_json_get(const dsec_json *obj, const char *key)
{
    if (obj == NULL || obj->type != DSEC_JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < obj->len; i++)
        if (strcmp(obj->keys[i], key) == 0)
            return obj->items[i];
    return NULL;
}

const char *dsec_json_get_str(const dsec_json *obj, const char *key)
{
    const dsec_json *v = dsec_json_get(obj, key);
    return v != NULL && v->type == DSEC_JSON_STRING ? v->str : NULL;
}

const dsec_json *dsec_json_get_array(const dsec_json *obj, const char *key)
{
    const dsec_json *v = dsec_json_get(obj, key);
    return v != NULL && v->type == DSEC_JSON_ARRAY ? v : NULL;
}

const dsec_json *dsec_json_get_object(const dsec_json *obj, const char *key)
{
    const dsec_json *v = dsec_json_get(obj, key);
    return v != NULL && v->type == DSEC_JSON_OBJECT ? v : NULL;
}

int64_t dsec_json_get_uint(const dsec_json *obj, const char *key)
{
    const dsec_json *v = dsec_json_get(obj, key);
    if (v == NULL || v->type != DSEC_JSON_NUMBER || v->num < 0 || v->num > 9007199254740992.0 ||
        v->num != (double)(int64_t)v->num)
        return -1;
    return (int64_t)v->num;
}
