/* scan.c - validate raw msgpack structure before msgpack-c builds objects from it. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codecs/codec.h"

/* What one msgpack header says about the object that follows it. */
typedef struct head {
    size_t hdr;     /* header bytes, type byte included */
    size_t body;    /* payload bytes after the header */
    uint64_t items; /* containers: objects that follow (2 per map entry) */
    uint32_t count; /* containers: array items or map entries */
    bool container;
    bool map;
    const char *what;
} head;

static uint32_t be(const uint8_t *p, size_t n)
{
    uint32_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static void set_fixed(head *h, size_t hdr, size_t body, const char *what)
{
    h->hdr = hdr;
    h->body = body;
    h->what = what;
}

/* Sizes given by the type byte alone. Returns false for a length-prefixed type. */
static bool head_fixed(uint8_t t, head *h)
{
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) {
        set_fixed(h, 1, 0, "scalar");
    } else if (t >= 0xa0 && t <= 0xbf) {
        set_fixed(h, 1, t & 0x1f, "string");
    } else if (t >= 0xcc && t <= 0xcf) {
        set_fixed(h, 1, (size_t)1 << (t - 0xcc), "integer");
    } else if (t >= 0xd0 && t <= 0xd3) {
        set_fixed(h, 1, (size_t)1 << (t - 0xd0), "integer");
    } else if (t == 0xca || t == 0xcb) {
        set_fixed(h, 1, t == 0xca ? 4 : 8, "float");
    } else if (t >= 0xd4 && t <= 0xd8) {
        set_fixed(h, 2, (size_t)1 << (t - 0xd4), "ext");
    } else {
        return false;
    }
    return true;
}

static void set_container(head *h, size_t hdr, uint32_t count, bool map)
{
    h->hdr = hdr;
    h->container = true;
    h->map = map;
    h->count = count;
    h->items = map ? 2 * (uint64_t)count : count;
    h->what = map ? "map" : "array";
}

/* Decode the header at p[0..left). Returns 1 with *h filled, 0 when the
 * header itself runs past the end, -1 for the reserved byte 0xc1. */
static int read_head(const uint8_t *p, size_t left, head *h)
{
    memset(h, 0, sizeof *h);
    uint8_t t = p[0];
    if (t == 0xc1)
        return -1;
    if (head_fixed(t, h))
        return 1;
    if (t >= 0x80 && t <= 0x8f) {
        set_container(h, 1, t & 0x0f, true);
        return 1;
    }
    if (t >= 0x90 && t <= 0x9f) {
        set_container(h, 1, t & 0x0f, false);
        return 1;
    }
    /* Length-prefixed: str8/16/32, bin8/16/32, ext8/16/32, array16/32, map16/32. */
    static const struct {
        uint8_t t, lenb, extra;
        const char *what;
    } tab[] = {
        {0xd9, 1, 0, "string"}, {0xda, 2, 0, "string"}, {0xdb, 4, 0, "string"},
        {0xc4, 1, 0, "binary"}, {0xc5, 2, 0, "binary"}, {0xc6, 4, 0, "binary"},
        {0xc7, 1, 1, "ext"},    {0xc8, 2, 1, "ext"},    {0xc9, 4, 1, "ext"},
        {0xdc, 2, 0, "array"},  {0xdd, 4, 0, "array"},  {0xde, 2, 0, "map"},
        {0xdf, 4, 0, "map"},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
        if (tab[i].t != t)
            continue;
        size_t hdr = 1 + (size_t)tab[i].lenb + tab[i].extra;
        if (left < hdr)
            return 0;
        uint32_t n = be(p + 1, tab[i].lenb);
        if (t >= 0xdc)
            set_container(h, hdr, n, t >= 0xde);
        else
            set_fixed(h, hdr, n, tab[i].what);
        return 1;
    }
    return -1; /* unreachable: every byte is covered above */
}

static size_t zone_need(const head *h)
{
    size_t each = h->map ? sizeof(msgpack_object_kv) : sizeof(msgpack_object);
    return (size_t)h->count * each + MSGPACK_ZONE_ALIGN;
}

int dsec__mp_scan(const uint8_t *p, size_t len, unsigned max_depth, dsec__mp_shape *out,
                  dsec_err *err)
{
    uint64_t left[DSEC_JSON_MAX_DEPTH + 1]; /* objects still to read at each depth */
    unsigned depth = 0;
    size_t pos = 0;
    if (max_depth > DSEC_JSON_MAX_DEPTH)
        max_depth = DSEC_JSON_MAX_DEPTH;
    out->end = 0;
    out->zone_bytes = 0;
    if (len == 0)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "payload: empty");
    left[0] = 1;
    for (;;) {
        while (left[depth] == 0) {
            if (depth == 0) {
                out->end = pos;
                return 0;
            }
            depth--;
        }
        left[depth]--;
        if (pos >= len)
            return dsec_err_set(err, DSEC_E_DECODE, 0,
                                "payload: truncated: %llu more objects expected at byte %zu",
                                (unsigned long long)left[depth] + 1, pos);
        head h;
        int r = read_head(p + pos, len - pos, &h);
        if (r < 0)
            return dsec_err_set(err, DSEC_E_DECODE, 0,
                                "payload: invalid msgpack type byte 0x%02x at byte %zu", p[pos],
                                pos);
        if (r == 0 || h.hdr > len - pos)
            return dsec_err_set(err, DSEC_E_DECODE, 0,
                                "payload: truncated: header at byte %zu runs past the end", pos);
        size_t at = pos;
        pos += h.hdr;
        if (!h.container) {
            if (h.body > len - pos)
                return dsec_err_set(
                    err, DSEC_E_DECODE, 0,
                    "payload: truncated: %s at byte %zu needs %zu bytes, %zu remain", h.what, at,
                    h.body, len - pos);
            pos += h.body;
            continue;
        }
        /* Every item takes at least one byte: a count beyond the bytes left
         * is truncated input, and must not reach msgpack-c's allocator. */
        if (h.items > len - pos)
            return dsec_err_set(err, DSEC_E_DECODE, 0,
                                "payload: truncated: %s at byte %zu has %u %s, %zu bytes remain",
                                h.what, at, h.count, h.map ? "entries" : "items", len - pos);
        /* Empty containers count too: msgpack-c's parse stack holds them. */
        if (depth + 1 > max_depth)
            return dsec_err_set(err, DSEC_E_DECODE, 0,
                                "payload: %s at byte %zu nests deeper than %u levels", h.what, at,
                                max_depth);
        if (h.count == 0)
            continue;
        out->zone_bytes += zone_need(&h);
        left[++depth] = h.items;
    }
}

int dsec__mp_unpack(msgpack_zone *zone, size_t retain, const uint8_t *p,
                    const dsec__mp_shape *shape, msgpack_object *out, dsec_err *err)
{
    if (shape->zone_bytes > zone->chunk_size && shape->zone_bytes <= retain) {
        /* Grow the one chunk the zone keeps across clears to this message's
         * need, so messages like it are unpacked without allocating. */
        size_t cap = zone->chunk_size;
        while (cap < shape->zone_bytes)
            cap *= 2;
        msgpack_zone bigger;
        if (msgpack_zone_init(&bigger, cap)) {
            msgpack_zone_destroy(zone);
            *zone = bigger;
        }
    }
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack((const char *)p, shape->end, &off, zone, out);
    if (r == MSGPACK_UNPACK_SUCCESS && off == shape->end)
        return 0;
    if (r == MSGPACK_UNPACK_NOMEM_ERROR)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "payload: out of memory unpacking %zu bytes",
                            shape->end);
    /* The scan accepted what msgpack-c refused: a bug on one side. */
    return dsec_err_set(err, DSEC_E_INTERNAL, 0, "payload: msgpack-c refused it (%d)", (int)r);
}

/* Skip the object at p[*pos..len): containers with everything in them,
 * without recursion (a counter of objects still to skip). */
static bool skip_object(const uint8_t *p, size_t len, size_t *pos)
{
    uint64_t left = 1;
    while (left > 0) {
        head h;
        if (*pos >= len || read_head(p + *pos, len - *pos, &h) != 1 || h.hdr > len - *pos)
            return false;
        *pos += h.hdr;
        left--;
        if (h.container) {
            if (h.items > len - *pos) /* each item takes a byte at least */
                return false;
            left += h.items;
        } else {
            if (h.body > len - *pos)
                return false;
            *pos += h.body;
        }
    }
    return true;
}

bool dsec_msgpack_peek_str(const void *buf, size_t len, const char *key, char *out, size_t n)
{
    const uint8_t *p = buf;
    size_t klen = strlen(key), pos = 0;
    head h;
    if (n == 0)
        return false;
    out[0] = '\0';
    if (p == NULL || len == 0 || read_head(p, len, &h) != 1 || !h.map || h.hdr > len)
        return false;
    pos = h.hdr;
    for (uint32_t i = 0; i < h.count; i++) {
        head k;
        if (pos >= len || read_head(p + pos, len - pos, &k) != 1 || k.hdr > len - pos)
            return false;
        bool str = k.what != NULL && strcmp(k.what, "string") == 0;
        if (str && k.body == klen && k.body <= len - pos - k.hdr &&
            memcmp(p + pos + k.hdr, key, klen) == 0) {
            pos += k.hdr + k.body;
            head v;
            if (pos >= len || read_head(p + pos, len - pos, &v) != 1 || v.hdr > len - pos ||
                v.what == NULL || strcmp(v.what, "string") != 0 || v.body >= n ||
                v.body > len - pos - v.hdr)
                return false;
            const char *s = (const char *)p + pos + v.hdr;
            if (memchr(s, '\0', v.body) != NULL || !dsec__utf8_valid(s, v.body))
                return false;
            memcpy(out, s, v.body);
            out[v.body] = '\0';
            return true;
        }
        if (!skip_object(p, len, &pos) || !skip_object(p, len, &pos))
            return false;
    }
    return false;
}
