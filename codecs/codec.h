/* codec.h - internals shared by the files of codecs/; nothing outside codecs/ includes it. */
#ifndef DSEC_CODECS_CODEC_H
#define DSEC_CODECS_CODEC_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "codecs/msg.h"
#include "dsec/err.h"

/* ---- arena: reusable storage for one decoded message ----------------------
 * Chunks are kept across resets, so steady-state decoding allocates nothing;
 * a reset after a message that needed several chunks merges them into one
 * (up to `retain` bytes) so the next such message fits in place. */
typedef struct dsec__arena_chunk dsec__arena_chunk;

typedef struct dsec__arena {
    dsec__arena_chunk *head; /* in allocation order */
    dsec__arena_chunk *cur;  /* the chunk being filled */
    size_t chunk_size;       /* the smallest chunk */
    size_t retain;           /* most bytes kept in one chunk across resets */
    size_t used;             /* bytes handed out since the last reset */
} dsec__arena;

void dsec__arena_init(dsec__arena *a, size_t chunk_size, size_t retain);
void dsec__arena_release(dsec__arena *a);
/* Forget every allocation; pointers handed out before become invalid. */
void dsec__arena_reset(dsec__arena *a);
/* n bytes aligned to align (a power of two <= 16); NULL when out of memory. */
void *dsec__arena_alloc(dsec__arena *a, size_t n, size_t align);

/* ---- structural scan of raw msgpack ----------------------------------------
 * Walks one msgpack object without building anything: finds where it ends,
 * rejects truncation, invalid bytes, nesting deeper than max_depth (<=
 * DSEC_JSON_MAX_DEPTH) and containers that claim more items than bytes
 * remain. zone_bytes is what msgpack_unpack will take from its zone, so
 * callers can size the zone and never hand msgpack-c an allocation an
 * attacker chose. Errors are DSEC_E_DECODE, prefixed "payload: ". */
typedef struct dsec__mp_shape {
    size_t end;        /* bytes used by the object */
    size_t zone_bytes; /* upper bound of msgpack_unpack's zone use */
} dsec__mp_shape;

int dsec__mp_scan(const uint8_t *p, size_t len, unsigned max_depth, dsec__mp_shape *out,
                  dsec_err *err);

/* Unpack one scanned object from p[0..shape->end) into zone. The zone must
 * have been initialised; this grows its chunk size when the object needs
 * more than one chunk and the need is at most `retain` bytes. */
int dsec__mp_unpack(msgpack_zone *zone, size_t retain, const uint8_t *p,
                    const dsec__mp_shape *shape, msgpack_object *out, dsec_err *err);

/* ---- text helpers -------------------------------------------------------- */
bool dsec__utf8_valid(const char *s, size_t n);
int dsec__base64_append(dsec_buf *b, const void *p, size_t n, dsec_err *err);
int dsec__buf_printf(dsec_buf *b, dsec_err *err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Render s[0..n) for an error message: printable ASCII as is, other bytes
 * as \xNN, cut at about outsz - 8 bytes with "...". */
void dsec__quote(char *out, size_t outsz, const char *s, size_t n);
/* "string", "unsigned integer", ... for type errors. */
const char *dsec__mp_type_name(const msgpack_object *o);
/* msgpack_packer write callback; data is a dsec_buf *. */
int dsec__buf_write_cb(void *data, const char *p, size_t n);

/* ---- schema helpers -------------------------------------------------------- */
/* The effective limit of a string/bin field (bytes) or array/map field (items). */
uint32_t dsec__field_limit(const dsec_field *f, const dsec_codec_limits *lim);
/* The effective byte limit of one string inside a STRV or KV field. */
uint32_t dsec__item_limit(const dsec_field *f, const dsec_codec_limits *lim);
/* Whether the field has an integer range to check. */
static inline bool dsec__field_ranged(const dsec_field *f)
{
    return f->min != 0 || f->max != 0;
}
/* The field of schema s whose wire name is name[0..n), or NULL. *hint (0
 * at first) is where the search starts; it is left past the match. */
const dsec_field *dsec__field_find(const dsec_schema *s, const char *name, size_t n, size_t *hint);

#endif
