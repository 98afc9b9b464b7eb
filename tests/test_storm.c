/* test_storm.c - a malformed-message storm on every subject of a running cell leaves it serving. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <inttypes.h>
#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/arbiter.h"
#include "actors/cell.h"
#include "runtime/ticker.h"
#include "bus/bus.h"
#include "codecs/msg.h"
#include "codecs/testkit.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/job.h"
#include "tests/fixture.h"
#include "tests/test_util.h"

/* Issue 10: "A malformed message on any subject gets an error reply. The
 * process keeps serving, with no leak (ASan build)". Every subject an actor
 * of the cell subscribes to gets the same storm: random bytes, truncated
 * msgpack, well-formed msgpack of the wrong shape, missing and mistyped
 * fields, huge strings and counts, deep nesting, bad UTF-8, duplicate keys,
 * wrong and missing headers, overlong and non-UTF-8 subject tokens. A
 * request must be answered with an error before its deadline, never with
 * silence; events are only absorbed. Afterwards the cell must still create,
 * run, report and destroy. LeakSanitizer checks the exit of the ASan build. */

#define NODES 4
#define REQ_TIMEOUT_MS 10000
#define IN_FLIGHT 128

static struct {
    dsec_natsd *natsd;
    char root[64];
    dsec_cell_conf conf;
    dsec_cell *cell;
    dsec_client *client;
    dsec_job *job;
    dsec_bus *bus;    /* the storm's own connection: an outsider's */
    char sid[96];     /* a live sandbox the storm aims at */
    char snode[80];   /* its node */
    dsec_cell *plain; /* a second cell, without the quota actor */
    dsec_cell_conf plain_conf;
} g;

static uint64_t mono_ms(void)
{
    return dsec_now_ns() / 1000000ull;
}

/* ---- msgpack written by hand: the storm must say things the encoder never would ---- */

static void put(dsec_buf *b, const void *p, size_t n)
{
    dsec_err err;
    if (n > 0 && dsec_buf_append(b, p, n, &err) < 0)
        fail_msg("buffer: %s", err.msg);
}

static void put1(dsec_buf *b, uint8_t c)
{
    put(b, &c, 1);
}

static void put_be(dsec_buf *b, uint64_t v, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--)
        put1(b, (uint8_t)(v >> (8 * i)));
}

static void mp_map(dsec_buf *b, uint32_t n)
{
    if (n < 16)
        put1(b, (uint8_t)(0x80 | n));
    else if (n < 65536)
        put1(b, 0xde), put_be(b, n, 2);
    else
        put1(b, 0xdf), put_be(b, n, 4);
}

static void mp_arr(dsec_buf *b, uint32_t n)
{
    if (n < 16)
        put1(b, (uint8_t)(0x90 | n));
    else if (n < 65536)
        put1(b, 0xdc), put_be(b, n, 2);
    else
        put1(b, 0xdd), put_be(b, n, 4);
}

static void mp_strn(dsec_buf *b, const char *s, size_t n)
{
    if (n < 32)
        put1(b, (uint8_t)(0xa0 | n));
    else if (n < 256)
        put1(b, 0xd9), put_be(b, n, 1);
    else if (n < 65536)
        put1(b, 0xda), put_be(b, n, 2);
    else
        put1(b, 0xdb), put_be(b, n, 4);
    put(b, s, n);
}

static void mp_str(dsec_buf *b, const char *s)
{
    mp_strn(b, s, strlen(s));
}

static void mp_u64(dsec_buf *b, uint64_t v)
{
    put1(b, 0xcf), put_be(b, v, 8);
}

static void mp_float(dsec_buf *b)
{
    put1(b, 0xcb);
    put_be(b, 0x3ff8000000000000ull, 8); /* 1.5 */
}

static void mp_fill_str(dsec_buf *b, char c, size_t n)
{
    char *s = dsec_malloc(n ? n : 1);
    assert_non_null(s);
    memset(s, c, n);
    mp_strn(b, s, n);
    dsec_free(s);
}

/* A value of the wrong kind for a field, in one of three styles. */
static void mp_wrong(dsec_buf *b, dsec_field_kind k, int style)
{
    if (style == 2) {
        if (k == DSEC_F_U64 || k == DSEC_F_I64)
            mp_float(b);
        else
            put1(b, 0xc0); /* nil where a value is expected */
        return;
    }
    switch (k) {
    case DSEC_F_STR:
        if (style == 0)
            mp_u64(b, 7);
        else
            mp_arr(b, 1), mp_str(b, "a");
        break;
    case DSEC_F_BIN:
        mp_str(b, "x"); /* a str is refused where bin is expected */
        break;
    case DSEC_F_U64:
        if (style == 0)
            put1(b, 0xff); /* -1 */
        else
            mp_str(b, "1");
        break;
    case DSEC_F_I64:
        if (style == 0)
            mp_str(b, "1");
        else
            mp_u64(b, UINT64_MAX); /* does not fit int64 */
        break;
    case DSEC_F_BOOL:
        mp_u64(b, 1);
        break;
    case DSEC_F_STRV:
        if (style == 0)
            mp_str(b, "a");
        else
            mp_arr(b, 2), mp_u64(b, 1), put1(b, 0xc3);
        break;
    case DSEC_F_KV:
        if (style == 0)
            mp_arr(b, 1), mp_str(b, "a");
        else
            mp_map(b, 1), mp_str(b, "a"), mp_u64(b, 1);
        break;
    case DSEC_F_LIST:
        if (style == 0)
            mp_map(b, 0);
        else
            mp_arr(b, 1), mp_u64(b, 1);
        break;
    }
}

/* ---- the payload set -------------------------------------------------------------- */

typedef struct payload {
    uint8_t *data;
    size_t len;
    char what[64];
} payload;

typedef struct payloads {
    payload *v;
    size_t n, cap;
    size_t valid_skipped; /* generated, but the type decodes it: not malformed */
} payloads;

static void ps_add(payloads *ps, const void *data, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void ps_add(payloads *ps, const void *data, size_t len, const char *fmt, ...)
{
    if (ps->n == ps->cap) {
        size_t nc = ps->cap ? ps->cap * 2 : 64;
        payload *nv = dsec_realloc(ps->v, nc * sizeof *nv);
        assert_non_null(nv);
        ps->v = nv;
        ps->cap = nc;
    }
    payload *p = &ps->v[ps->n++];
    p->data = dsec_malloc(len ? len : 1);
    assert_non_null(p->data);
    if (len)
        memcpy(p->data, data, len);
    p->len = len;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->what, sizeof p->what, fmt, ap);
    va_end(ap);
}

static void ps_add_buf(payloads *ps, dsec_buf *b, const char *what)
{
    ps_add(ps, b->data, b->len, "%s", what);
    b->len = 0;
}

static void ps_free(payloads *ps)
{
    for (size_t i = 0; i < ps->n; i++)
        dsec_free(ps->v[i].data);
    dsec_free(ps->v);
    memset(ps, 0, sizeof *ps);
}

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static void random_bytes(dsec_buf *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        put1(b, (uint8_t)rnd());
}

/* What any subject gets, whatever it expects: nothing in it is a valid
 * message of any type with a required field. */
static void generic_payloads(payloads *ps, bool big)
{
    dsec_buf b;
    dsec_buf_init(&b);
    ps_add(ps, "", 0, "empty body");
    static const size_t lens[] = {1, 2, 7, 64, 1000, 4096};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
        random_bytes(&b, lens[i]);
        char what[64];
        snprintf(what, sizeof what, "%zu random bytes", lens[i]);
        ps_add_buf(ps, &b, what);
    }
    if (big) {
        random_bytes(&b, 1u << 20);
        ps_add_buf(ps, &b, "1 MiB of random bytes");
    }
    put1(&b, 0x05);
    ps_add_buf(ps, &b, "an integer, not a map");
    put1(&b, 0xc0);
    ps_add_buf(ps, &b, "nil, not a map");
    put1(&b, 0xc3);
    ps_add_buf(ps, &b, "true, not a map");
    mp_str(&b, "create");
    ps_add_buf(ps, &b, "a string, not a map");
    mp_float(&b);
    ps_add_buf(ps, &b, "a float, not a map");
    put1(&b, 0xc4), put1(&b, 2), put1(&b, 0), put1(&b, 1);
    ps_add_buf(ps, &b, "a bin, not a map");
    mp_arr(&b, 3), mp_u64(&b, 1), mp_str(&b, "a"), put1(&b, 0xc3);
    ps_add_buf(ps, &b, "an array instead of a map");
    put1(&b, 0xc1);
    ps_add_buf(ps, &b, "the reserved byte 0xc1");
    mp_map(&b, 1), mp_str(&b, "zz"), put1(&b, 0xc1);
    ps_add_buf(ps, &b, "0xc1 as a value");
    mp_map(&b, 1), mp_u64(&b, 1), mp_u64(&b, 2);
    ps_add_buf(ps, &b, "an integer map key");
    mp_map(&b, 1), put1(&b, 0xc0), mp_u64(&b, 2);
    ps_add_buf(ps, &b, "a nil map key");
    mp_map(&b, 2), mp_str(&b, "zz"), mp_u64(&b, 1), mp_str(&b, "zz"), mp_u64(&b, 1);
    ps_add_buf(ps, &b, "duplicate keys");
    put1(&b, 0xdf), put_be(&b, 0xffffffffu, 4);
    ps_add_buf(ps, &b, "a map declaring 2^32-1 entries");
    put1(&b, 0xdd), put_be(&b, 0xffffffffu, 4);
    ps_add_buf(ps, &b, "an array declaring 2^32-1 items");
    mp_map(&b, 1), mp_str(&b, "zz"), put1(&b, 0xdb), put_be(&b, 0x7fffffffu, 4), put(&b, "abc", 3);
    ps_add_buf(ps, &b, "a string declaring 2 GiB");
    mp_map(&b, 1), mp_str(&b, "zz"), put1(&b, 0xc6), put_be(&b, 0xffffffffu, 4);
    ps_add_buf(ps, &b, "a bin declaring 4 GiB");
    mp_map(&b, 1), mp_str(&b, "zz"), put1(&b, 0xd4), put1(&b, 1), put1(&b, 0);
    ps_add_buf(ps, &b, "an ext value, nothing required");
    mp_map(&b, 1), mp_str(&b, "zz"), mp_fill_str(&b, 'a', 200000);
    ps_add_buf(ps, &b, "a 200 kB unknown string");
    mp_map(&b, 1), mp_str(&b, "zz"), mp_arr(&b, 70000);
    for (int i = 0; i < 70000; i++)
        put1(&b, 0);
    ps_add_buf(ps, &b, "an array of 70000 items");
    mp_map(&b, 70000);
    for (int i = 0; i < 70000; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        mp_str(&b, k), put1(&b, 0);
    }
    ps_add_buf(ps, &b, "a map of 70000 unknown fields");
    static const int depths[] = {9, 100, 100000};
    for (size_t i = 0; i < sizeof depths / sizeof *depths; i++) {
        for (int d = 0; d < depths[i]; d++)
            put1(&b, 0x91);
        put1(&b, 0);
        char what[64];
        snprintf(what, sizeof what, "arrays nested %d deep", depths[i]);
        ps_add_buf(ps, &b, what);
    }
    mp_map(&b, 1), mp_str(&b, "zz");
    for (int d = 0; d < 40; d++)
        mp_map(&b, 1), mp_str(&b, "zz");
    put1(&b, 0);
    ps_add_buf(ps, &b, "maps nested 42 deep in an unknown field");
    mp_map(&b, 1), mp_str(&b, "zz"), mp_strn(&b, "\xff\xfe\xc0\xaf", 4);
    ps_add_buf(ps, &b, "a string that is not UTF-8");
    mp_map(&b, 1), mp_str(&b, "zz"), mp_strn(&b, "a\0b", 3);
    ps_add_buf(ps, &b, "a string with a NUL byte");
    mp_map(&b, 0), put1(&b, 0);
    ps_add_buf(ps, &b, "an empty map and a trailing byte");
    dsec_buf_release(&b);
}

/* Whether payload p is a valid message of type (then it is not malformed). */
static bool decodes_as(int type, const void *p, size_t len)
{
    if (type == DSEC_MSG_NONE)
        return false;
    dsec_decoder *d = dsec_decoder_new(NULL);
    assert_non_null(d);
    void *out = dsec_calloc(1, dsec_schema_of(type)->size);
    assert_non_null(out);
    dsec_err err;
    bool ok = dsec_decode(d, type, p, len, out, &err) == 0;
    dsec_free(out);
    dsec_decoder_free(d);
    return ok;
}

/* The storm aimed at a subject that expects messages of type: the generic
 * set plus what the type's schema makes possible. Every payload kept fails
 * to decode as type, checked here. */
static void make_payloads(payloads *ps, int type, bool big)
{
    generic_payloads(ps, big);
    const dsec_schema *s = type != DSEC_MSG_NONE ? dsec_schema_of(type) : NULL;
    if (s == NULL)
        return;
    dsec_buf b;
    dsec_buf_init(&b);
    char what[64];
    /* the shape is right, every value is wrong */
    for (int style = 0; style < 3; style++) {
        mp_map(&b, (uint32_t)s->nfields);
        for (size_t i = 0; i < s->nfields; i++) {
            mp_str(&b, s->fields[i].name);
            mp_wrong(&b, s->fields[i].kind, style);
        }
        snprintf(what, sizeof what, "every field mistyped (style %d)", style);
        ps_add_buf(ps, &b, what);
    }
    /* one field at a time, mistyped; the others missing */
    for (size_t i = 0; i < s->nfields; i++)
        for (int style = 0; style < 3; style++) {
            mp_map(&b, 1);
            mp_str(&b, s->fields[i].name);
            mp_wrong(&b, s->fields[i].kind, style);
            snprintf(what, sizeof what, "only %.30s, mistyped (%d)", s->fields[i].name, style);
            ps_add_buf(ps, &b, what);
        }
    mp_map(&b, 0);
    ps_add_buf(ps, &b, "an empty map (required fields missing)");
    /* strings too long, not UTF-8, with NUL */
    static const struct {
        const char *what;
        const char *s;
        size_t n;
    } bad_str[] = {{"every string 100 kB", NULL, 100000},
                   {"every string not UTF-8", "\xff\xfe", 2},
                   {"every string an overlong UTF-8 '/'", "\xc0\xaf", 2},
                   {"every string with a NUL", "x\0y", 3},
                   {"every string empty", "", 0}};
    for (size_t k = 0; k < sizeof bad_str / sizeof *bad_str; k++) {
        uint32_t nstr = 0;
        for (size_t i = 0; i < s->nfields; i++)
            nstr += s->fields[i].kind == DSEC_F_STR;
        if (nstr == 0)
            break;
        mp_map(&b, nstr);
        for (size_t i = 0; i < s->nfields; i++) {
            if (s->fields[i].kind != DSEC_F_STR)
                continue;
            mp_str(&b, s->fields[i].name);
            if (bad_str[k].s == NULL)
                mp_fill_str(&b, 'a', bad_str[k].n);
            else
                mp_strn(&b, bad_str[k].s, bad_str[k].n);
        }
        ps_add_buf(ps, &b, bad_str[k].what);
    }
    /* a valid message, damaged */
    void *sample = dsec_calloc(1, s->size);
    assert_non_null(sample);
    dsec_buf enc;
    dsec_buf_init(&enc);
    dsec_err err;
    if (dsec_testkit_sample(type, sample) && dsec_encode(&enc, type, sample, &err) == 0) {
        size_t step = enc.len / 24 ? enc.len / 24 : 1;
        for (size_t cut = 1; cut < enc.len; cut += step) {
            snprintf(what, sizeof what, "a valid %s cut to %zu of %zu bytes", s->name, cut,
                     enc.len);
            ps_add(ps, enc.data, cut, "%s", what);
        }
        put(&b, enc.data, enc.len), put1(&b, 0);
        snprintf(what, sizeof what, "a valid %s and a trailing byte", s->name);
        ps_add_buf(ps, &b, what);
        put(&b, enc.data, enc.len), put(&b, enc.data, enc.len);
        snprintf(what, sizeof what, "a valid %s twice", s->name);
        ps_add_buf(ps, &b, what);
        mp_arr(&b, 1), put(&b, enc.data, enc.len);
        snprintf(what, sizeof what, "a valid %s inside an array", s->name);
        ps_add_buf(ps, &b, what);
        /* its first field twice */
        if (enc.len > 1 && ((uint8_t)enc.data[0] & 0xf0) == 0x80 &&
            ((uint8_t)enc.data[0] & 0x0f) < 15) {
            put1(&b, (uint8_t)(enc.data[0] + 1));
            put(&b, enc.data + 1, enc.len - 1);
            mp_str(&b, s->fields[0].name);
            mp_wrong(&b, s->fields[0].kind, 0);
            snprintf(what, sizeof what, "a valid %s with its first field again", s->name);
            ps_add_buf(ps, &b, what);
        }
    } else {
        fail_msg("no valid sample of %s to damage: %s", s->name, err.msg);
    }
    dsec_buf_release(&enc);
    dsec_free(sample);
    dsec_buf_release(&b);
    /* keep only what the type refuses */
    size_t k = 0;
    for (size_t i = 0; i < ps->n; i++) {
        if (decodes_as(type, ps->v[i].data, ps->v[i].len)) {
            dsec_free(ps->v[i].data);
            ps->valid_skipped++;
            continue;
        }
        ps->v[k++] = ps->v[i];
    }
    ps->n = k;
}

/* ---- headers ---------------------------------------------------------------------- */

#define NHDR 8
static char long_req_id[251];

/* Header variant i for a message whose right type is type_name. *use_hdr is
 * false for "no dsec headers given". */
static dsec_hdr header_variant(int i, const char *type_name, char *rid, size_t n, bool *use_hdr)
{
    *use_hdr = true;
    snprintf(rid, n, "storm-%d-%08" PRIx64, i, rnd() & 0xffffffffu);
    switch (i % NHDR) {
    case 0:
        return (dsec_hdr){.type = type_name, .schema = DSEC_SCHEMA_VERSION, .req_id = rid};
    case 1:
        *use_hdr = false;
        return (dsec_hdr){0};
    case 2:
        return (dsec_hdr){.type = "no-such-type", .schema = DSEC_SCHEMA_VERSION, .req_id = rid};
    case 3:
        return (dsec_hdr){.type = "created", .schema = DSEC_SCHEMA_VERSION};
    case 4:
        return (dsec_hdr){.type = type_name, .schema = 999999, .req_id = rid};
    case 5:
        return (dsec_hdr){.type = type_name, .schema = DSEC_SCHEMA_VERSION, .req_id = long_req_id};
    case 6:
        return (dsec_hdr){.type = type_name,
                          .schema = DSEC_SCHEMA_VERSION,
                          .req_id = "\xff\xfe not UTF-8 \x01\x02"};
    default:
        return (dsec_hdr){.type = "",
                          .schema = DSEC_SCHEMA_VERSION,
                          .req_id = "",
                          .trace_id = "\xc3\xa9t\xc3\xa9 \x7f"};
    }
}

/* ---- requests and their answers ------------------------------------------------- */

/* The answer a malformed request may get: an error, from the actor (an
 * "error" message naming a code) or from the bus (empty, with
 * Dsec-Error-Code). want_code, when set, is the code the target must give. */
typedef struct target {
    char subject[600];
    int type;              /* what the subject expects; DSEC_MSG_NONE: no schema */
    const char *want_code; /* the codes it may answer, comma-separated; NULL: decode,too_large */
    const char *note;
} target;

typedef struct tally {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned inflight;
    unsigned sent, answered, errors, silent, wrong, unsendable, skipped;
    unsigned codes[DSEC_CODE_MAX_ + 1];
    char failures[4096];
    size_t flen;
    unsigned nfail_logged;
} tally;

typedef struct req_ctx {
    tally *t;
    const target *tg;
    char what[64];
    int hdr;
} req_ctx;

/* The subject as a terminal can show it (the storm's are not all UTF-8). */
static void printable(char *out, size_t n, const char *s)
{
    size_t o = 0;
    for (; *s && o + 1 < n; s++)
        out[o++] = (unsigned char)*s >= 0x20 && (unsigned char)*s < 0x7f ? *s : '?';
    out[o] = '\0';
}

static void note_failure(tally *t, const req_ctx *c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Called with t->mu held. */
static void note_failure(tally *t, const req_ctx *c, const char *fmt, ...)
{
    if (t->nfail_logged++ >= 12 || t->flen >= sizeof t->failures - 256)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char subj[128];
    printable(subj, sizeof subj, c->tg->subject);
    t->flen += (size_t)snprintf(t->failures + t->flen, sizeof t->failures - t->flen,
                                "  %.120s <- %s (headers %d): %s\n", subj, c->what, c->hdr, line);
}

/* Whether code is one of the comma-separated names in list. */
static bool code_in(const char *code, const char *list)
{
    size_t n = strlen(code);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t k = end ? (size_t)(end - p) : strlen(p);
        if (k == n && strncmp(p, code, n) == 0)
            return true;
        p += k + (end != NULL);
    }
    return false;
}

static void on_answer(int status, dsec_msg *reply, const dsec_err *berr, void *ud)
{
    req_ctx *c = ud;
    tally *t = c->t;
    char code[65] = "";
    bool is_error = false;
    char why[DSEC_ERR_MSG_MAX + 64] = "";
    if (status < 0) {
        snprintf(why, sizeof why, "no answer: %s", berr ? berr->msg : "?");
    } else {
        const char *type = dsec_msg_type(reply);
        if (type == NULL || strcmp(type, DSEC_TYPE_ERROR) != 0) {
            snprintf(why, sizeof why, "answered \"%s\", not an error", type ? type : "(no type)");
        } else if (dsec_msg_len(reply) == 0) {
            const char *bc = dsec_msg_header(reply, DSEC_HDR_ERROR_CODE);
            if (bc == NULL)
                snprintf(why, sizeof why, "an empty error without Dsec-Error-Code");
            else
                is_error = true, snprintf(code, sizeof code, "%s", bc);
        } else {
            dsec_decoder *d = dsec_decoder_new(NULL);
            dsec_msg_error e;
            dsec_err err;
            if (d == NULL || dsec_decode(d, DSEC_MSG_ERROR, dsec_msg_data(reply),
                                         dsec_msg_len(reply), &e, &err) < 0) {
                snprintf(why, sizeof why, "an error that does not decode: %s",
                         d ? err.msg : "nomem");
            } else {
                is_error = true;
                snprintf(code, sizeof code, "%s", e.code);
                if (e.message == NULL || e.message[0] == '\0')
                    snprintf(why, sizeof why, "an error without a message"), is_error = false;
            }
            dsec_decoder_free(d);
        }
    }
    pthread_mutex_lock(&t->mu);
    t->answered++;
    if (status < 0) {
        t->silent++;
        note_failure(t, c, "%s", why);
    } else if (!is_error) {
        t->wrong++;
        note_failure(t, c, "%s", why);
    } else {
        int k = dsec_code_from_name(code);
        bool known = strcmp(dsec_code_name(k), code) == 0;
        const char *want = c->tg->want_code;
        /* Dsec-Schema 999999: refused before anything reads the payload */
        if (c->hdr == 4)
            want = "unsupported";
        /* No Dsec-Type, an unknown, another message's or an empty one: the
         * decoder is never picked (docs/protocol.md, Transport), so a
         * payload-level storm gets unsupported; a subject-level fault may
         * still be found first. */
        char wbuf[128];
        if (c->hdr == 1 || c->hdr == 2 || c->hdr == 3 || c->hdr == 7) {
            if (want == NULL)
                want = "unsupported";
            else if (!code_in("unsupported", want)) {
                snprintf(wbuf, sizeof wbuf, "%s,unsupported", want);
                want = wbuf;
            }
        }
        bool right = code_in(code, want ? want : "decode,too_large");
        if (known && right) {
            t->errors++;
            t->codes[k]++;
        } else {
            t->wrong++;
            note_failure(t, c, "error code \"%s\", expected one of %s", code,
                         want ? want : "decode,too_large");
        }
    }
    t->inflight--;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    dsec_free(c);
}

static void tally_init(tally *t)
{
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
}

static void tally_destroy(tally *t)
{
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
}

/* Send every payload of the target's storm as a request, at most IN_FLIGHT
 * at a time; wait for every answer or deadline. */
static void storm_requests(tally *t, const target *tg)
{
    payloads ps = {0};
    make_payloads(&ps, tg->type, true);
    const char *tname = tg->type != DSEC_MSG_NONE ? dsec_msg_type_name(tg->type) : "sync";
    for (size_t i = 0; i < ps.n; i++) {
        req_ctx *c = dsec_calloc(1, sizeof *c);
        assert_non_null(c);
        c->t = t;
        c->tg = tg;
        c->hdr = (int)(i % NHDR);
        snprintf(c->what, sizeof c->what, "%s", ps.v[i].what);
        char rid[64];
        bool use_hdr;
        dsec_hdr h = header_variant(c->hdr, tname, rid, sizeof rid, &use_hdr);
        pthread_mutex_lock(&t->mu);
        while (t->inflight >= IN_FLIGHT)
            pthread_cond_wait(&t->cv, &t->mu);
        t->inflight++;
        t->sent++;
        pthread_mutex_unlock(&t->mu);
        dsec_err err;
        if (dsec_bus_request(g.bus, tg->subject, use_hdr ? &h : NULL, ps.v[i].data, ps.v[i].len,
                             REQ_TIMEOUT_MS, on_answer, c, &err) < 0) {
            pthread_mutex_lock(&t->mu);
            t->inflight--;
            t->sent--;
            t->unsendable++;
            pthread_mutex_unlock(&t->mu);
            fprintf(stderr, "storm: could not send %s to %.80s: %s\n", c->what, tg->subject,
                    err.msg);
            dsec_free(c);
        }
    }
    pthread_mutex_lock(&t->mu);
    while (t->inflight > 0)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    t->skipped = (unsigned)ps.valid_skipped;
    ps_free(&ps);
}

/* Storm each target; print what each answered; fail on any request that was
 * not answered with the right error. */
static void storm_targets(const target *tgs, size_t n)
{
    unsigned bad = 0, total = 0;
    for (size_t i = 0; i < n; i++) {
        tally t;
        tally_init(&t);
        uint64_t t0 = mono_ms();
        storm_requests(&t, &tgs[i]);
        total += t.sent;
        char codes[256] = "";
        size_t o = 0;
        for (int k = 0; k <= DSEC_CODE_MAX_ && o < sizeof codes - 32; k++)
            if (t.codes[k])
                o += (size_t)snprintf(codes + o, sizeof codes - o, " %s=%u", dsec_code_name(k),
                                      t.codes[k]);
        char shown[80];
        printable(shown, sizeof shown, tgs[i].subject);
        fprintf(stderr,
                "storm: %-70.70s %4u sent, %4u errors (%s ), %u silent, %u wrong, %u unsendable, "
                "%u valid skipped, %" PRIu64 " ms [%s]\n",
                shown, t.sent, t.errors, codes, t.silent, t.wrong, t.unsendable, t.skipped,
                mono_ms() - t0, tgs[i].note);
        if (t.silent || t.wrong || t.sent == 0) {
            fprintf(stderr, "%s", t.failures);
            bad++;
        }
        tally_destroy(&t);
    }
    fprintf(stderr, "storm: %u requests on %zu subjects\n", total, n);
    if (bad)
        fail_msg(
            "%u of %zu subjects left a malformed request without its error reply (listed above)",
            bad, n);
}

/* Publish every payload of the storm to an event subject (nobody answers). */
static unsigned storm_events(const char *subject, int type, bool big)
{
    payloads ps = {0};
    make_payloads(&ps, type, big);
    const char *tname = type != DSEC_MSG_NONE ? dsec_msg_type_name(type) : "sync";
    unsigned sent = 0;
    for (size_t i = 0; i < ps.n; i++) {
        char rid[64];
        bool use_hdr;
        dsec_hdr h = header_variant((int)i, tname, rid, sizeof rid, &use_hdr);
        dsec_err err;
        if (dsec_bus_publish(g.bus, subject, NULL, use_hdr ? &h : NULL, ps.v[i].data, ps.v[i].len,
                             &err) < 0)
            fprintf(stderr, "storm: could not publish %s to %.80s: %s\n", ps.v[i].what, subject,
                    err.msg);
        else
            sent++;
        if (i % 64 == 63) /* let the cell keep up: the point is malformed, not many */
            assert_int_equal(dsec_bus_flush(g.bus, 10000, &err), 0);
    }
    dsec_err err;
    assert_int_equal(dsec_bus_flush(g.bus, 10000, &err), 0);
    fprintf(stderr, "storm: %-70.70s %4u published\n", subject, sent);
    ps_free(&ps);
    return sent;
}

/* ---- setup ------------------------------------------------------------------------ */

static const char *node_name(size_t i)
{
    return g.conf.nodes[i].name;
}

/* A valid request on the storm's connection; *reply is the caller's. */
static int valid_request(const char *subject, int type, const void *msg, dsec_msg **reply,
                         dsec_err *err)
{
    dsec_buf b;
    dsec_buf_init(&b);
    int rc = dsec_encode(&b, type, msg, err);
    dsec_hdr h = {.type = dsec_msg_type_name(type), .schema = DSEC_SCHEMA_VERSION};
    if (rc == 0)
        rc = dsec_bus_request_sync(g.bus, subject, &h, b.data, b.len, REQ_TIMEOUT_MS, reply, err);
    dsec_buf_release(&b);
    return rc;
}

static int group_setup(void **state)
{
    memset(long_req_id, 'r', sizeof long_req_id - 1);
    if (dsec_test_server_start("dsec-storm", true, &g.natsd, g.root, sizeof g.root) < 0)
        return -1;
    dsec_cell_conf *c = &g.conf;
    dsec_cell_conf_defaults(c);
    snprintf(c->cell, sizeof c->cell, "storm-%ld", (long)getpid());
    snprintf(c->url, sizeof c->url, "%s", dsec_natsd_url(g.natsd));
    snprintf(c->state_dir, sizeof c->state_dir, "%s/%s", g.root, c->cell);
    c->sched_replicas = 2;
    c->capacity_ms = 20;
    c->full_ms = 500;
    c->heartbeat_ms = 100;
    c->summary_ms = 200;
    c->arbiter_lease_ms = 600;
    c->quota = true;
    static const char *const types[] = {"sim", NULL};
    char prefix[80];
    snprintf(prefix, sizeof prefix, "%s-n", c->cell);
    dsec_err err;
    if (dsec_cell_conf_add_sim_nodes(c, prefix, NODES, 4000, 8192, 100, types, "0", &err) < 0 ||
        dsec_cell_start(&g.cell, c,
                        DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE | DSEC_ROLE_ARBITER | DSEC_ROLE_QUOTA,
                        &err) < 0) {
        fprintf(stderr, "cell: %s\n", err.msg);
        return -1;
    }
    dsec_client_opts o = {.url = c->url, .tenant = "storm", .timeout_ms = REQ_TIMEOUT_MS};
    dsec_bus_opts bo = {.url = c->url, .name = "storm", .threads = 2};
    if (dsec_client_connect(&g.client, &o, &err) < 0 || dsec_bus_connect(&g.bus, &bo, &err) < 0) {
        fprintf(stderr, "client: %s\n", err.msg);
        return -1;
    }
    dsec_job_spec js = {.name = "storm-job", .cell = c->cell, .cls = "job"};
    if (dsec_job_start(g.client, &js, NULL, NULL, &g.job, &err) < 0) {
        fprintf(stderr, "job: %s\n", err.msg);
        return -1;
    }
    dsec_create_spec cs = {.type = "sim", .cpu_milli = 100, .memory_mb = 64, .cell = c->cell};
    dsec_sandbox_info info;
    if (dsec_create(g.client, &cs, &info, &err) < 0) {
        fprintf(stderr, "create: %s\n", err.msg);
        return -1;
    }
    snprintf(g.sid, sizeof g.sid, "%s", info.id);
    snprintf(g.snode, sizeof g.snode, "%s", info.node);
    return 0;
}

static int group_teardown(void **state)
{
    dsec_job_free(g.job, true);
    dsec_bus_free(g.bus);
    dsec_client_free(g.client);
    dsec_cell_stop(g.cell, true);
    dsec_cell_conf_release(&g.conf);
    int rc = g.natsd ? dsec_test_server_stop(g.natsd, g.root) : 0;
    memset(&g, 0, sizeof g);
    return rc;
}

/* ---- tests ---------------------------------------------------------------------- */

static target *tg_add(target *v, size_t *n, int type, const char *want, const char *note,
                      const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static target *tg_add(target *v, size_t *n, int type, const char *want, const char *note,
                      const char *fmt, ...)
{
    target *t = &v[(*n)++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->subject, sizeof t->subject, fmt, ap);
    va_end(ap);
    t->type = type;
    t->want_code = want;
    t->note = note;
    return t;
}

static void repeat(char *out, size_t n, const char *unit, int times)
{
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < times && o + strlen(unit) < n; i++)
        o += (size_t)snprintf(out + o, n - o, "%s", unit);
}

/* Every request subject of the schedulers and node managers. */
static void malformed_requests_get_error_replies(void **state)
{
    static target tg[48];
    size_t n = 0;
    const char *cell = g.conf.cell, *sn = g.snode, *sid = g.sid;
    char x300[301], e150[301], xe150[302];
    repeat(x300, sizeof x300, "x", 300);
    repeat(e150, sizeof e150, "\xc3\xa9", 150);
    snprintf(xe150, sizeof xe150, "x%s", e150);

    tg_add(tg, &n, DSEC_MSG_CREATE, NULL, "scheduler", "dsec.v1.storm.create");
    tg_add(tg, &n, DSEC_MSG_CREATE, NULL, "scheduler, pinned", "dsec.v1.storm.create.%s", cell);
    tg_add(tg, &n, DSEC_MSG_CREATE, "decode,too_large,invalid", "scheduler, 300-byte tenant",
           "dsec.v1.%s.create", x300);
    tg_add(tg, &n, DSEC_MSG_CREATE, "decode,too_large,invalid", "scheduler, non-UTF-8 tenant",
           "dsec.v1.\xff\xfe.create");
    tg_add(tg, &n, DSEC_MSG_PING, NULL, "scheduler ping", "dsec.v1.ctl.ping");
    for (size_t i = 0; i < 2; i++)
        tg_add(tg, &n, DSEC_MSG_PLACE, NULL, "node place", "dsec.v1.ctl.place.%s", node_name(i));
    tg_add(tg, &n, DSEC_MSG_JOB_HOLD, NULL, "node hold", "dsec.v1.ctl.hold.%s", node_name(0));
    static const struct {
        const char *op;
        int type;
    } qops[] = {{"admit", DSEC_MSG_ADMIT},
                {"set", DSEC_MSG_QUOTA},
                {"get", DSEC_MSG_QUOTA},
                {"list", DSEC_MSG_QUOTA_LIST}};
    for (size_t i = 0; i < sizeof qops / sizeof *qops; i++)
        tg_add(tg, &n, qops[i].type, NULL, "quota actor", "dsec.v1.ctl.quota.%s.%s", cell,
               qops[i].op);
    static const struct {
        const char *op;
        int type;
    } ops[] = {{"exec", DSEC_MSG_EXEC},
               {"write", DSEC_MSG_FILE_WRITE},
               {"read", DSEC_MSG_FILE_READ},
               {"ls", DSEC_MSG_FILE_LIST},
               {"op", DSEC_MSG_OP}};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        tg_add(tg, &n, ops[i].type, NULL, "sandbox", "dsec.v1.storm.sbx.%s.%s.%s", sn, sid,
               ops[i].op);
    tg_add(tg, &n, DSEC_MSG_OP, "unsupported", "sandbox, unknown operation",
           "dsec.v1.storm.sbx.%s.%s.bogus", sn, sid);
    tg_add(tg, &n, DSEC_MSG_EXEC, "permission", "sandbox of another tenant",
           "dsec.v1.other.sbx.%s.%s.exec", sn, sid);
    tg_add(tg, &n, DSEC_MSG_OP, "permission", "sandbox, non-UTF-8 tenant",
           "dsec.v1.\xff\xfe\xc3.sbx.%s.%s.op", sn, sid);
    tg_add(tg, &n, DSEC_MSG_EXEC, "not_found", "no such sandbox",
           "dsec.v1.storm.sbx.%s.%s-ffffffffffffffff.exec", sn, sn);
    tg_add(tg, &n, DSEC_MSG_EXEC, "invalid", "sandbox, extra tokens",
           "dsec.v1.storm.sbx.%s.%s.exec.more.tokens", sn, sid);
    tg_add(tg, &n, DSEC_MSG_EXEC, "invalid", "sandbox, 300-byte id", "dsec.v1.storm.sbx.%s.%s.exec",
           sn, x300);
    tg_add(tg, &n, DSEC_MSG_EXEC, "invalid", "sandbox, 300-byte UTF-8 op (even cut)",
           "dsec.v1.storm.sbx.%s.%s.%s", sn, sid, e150);
    tg_add(tg, &n, DSEC_MSG_EXEC, "invalid", "sandbox, 301-byte UTF-8 op (odd cut)",
           "dsec.v1.storm.sbx.%s.%s.%s", sn, sid, xe150);
    storm_targets(tg, n);
}

/* dsec.v1.ctl.lookup.<cell> reaches every node; a malformed lookup is a
 * malformed request like any other (nodes stay silent only for a valid
 * lookup of a request id they do not hold). */
static void malformed_lookup_gets_error_reply(void **state)
{
    static target tg[1];
    size_t n = 0;
    tg_add(tg, &n, DSEC_MSG_OP, NULL, "node lookup (every node)", "dsec.v1.ctl.lookup.%s",
           g.conf.cell);
    storm_targets(tg, n);
}

/* A preemptible job's reclaim subject (libdsec answers for the job). */
static void malformed_reclaim_gets_error_reply(void **state)
{
    static target tg[1];
    size_t n = 0;
    tg_add(tg, &n, DSEC_MSG_RECLAIM, NULL, "job reclaim (libdsec)",
           "dsec.v1.ctl.job.%s.storm-job.reclaim", g.conf.cell);
    storm_targets(tg, n);
}

/* Learn the scheduler replicas' names (their back subjects) from pings. */
static size_t sched_names(char names[2][65])
{
    size_t k = 0;
    for (int i = 0; i < 64 && k < 2; i++) {
        dsec_msg_ping p = {.seq = (uint64_t)i + 1};
        dsec_msg *reply = NULL;
        dsec_err err;
        if (valid_request("dsec.v1.ctl.ping", DSEC_MSG_PING, &p, &reply, &err) < 0)
            fail_msg("ping: %s", err.msg);
        dsec_decoder *d = dsec_decoder_new(NULL);
        dsec_msg_pong pong;
        assert_int_equal(
            dsec_decode(d, DSEC_MSG_PONG, dsec_msg_data(reply), dsec_msg_len(reply), &pong, &err),
            0);
        if (pong.actor != NULL && (k == 0 || strcmp(names[0], pong.actor) != 0))
            snprintf(names[k++], 65, "%s", pong.actor);
        dsec_decoder_free(d);
        dsec_msg_free(reply);
    }
    return k;
}

/* Every event subject the schedulers, node managers and the arbiter read,
 * the trajectory stream, and the arbiter's KV records: absorbed without a
 * crash, and the cell's view of itself heals. */
static void event_storm_is_absorbed(void **state)
{
    const char *cell = g.conf.cell, *n0 = node_name(0);
    char subj[600], x300[301];
    repeat(x300, sizeof x300, "x", 300);
    char names[2][65];
    assert_int_equal(sched_names(names), 2);
    unsigned sent = 0;
    static const struct {
        const char *kind;
        int type;
    } node_evt[] = {{"capacity", DSEC_MSG_CAPACITY},
                    {"heartbeat", DSEC_MSG_HEARTBEAT},
                    {"announce", DSEC_MSG_NODE_ANNOUNCE}};
    for (size_t i = 0; i < 3; i++) {
        snprintf(subj, sizeof subj, "dsec.v1.ctl.evt.%s.node.%s.%s", cell, n0, node_evt[i].kind);
        sent += storm_events(subj, node_evt[i].type, i == 0);
    }
    snprintf(subj, sizeof subj, "dsec.v1.ctl.evt.%s.node.%s.capacity", cell, x300);
    sent += storm_events(subj, DSEC_MSG_CAPACITY, false);
    snprintf(subj, sizeof subj, "dsec.v1.ctl.evt.%s.summary", cell);
    sent += storm_events(subj, DSEC_MSG_CELL_SUMMARY, true);
    sent += storm_events("dsec.v1.ctl.evt.other-cell.summary", DSEC_MSG_CELL_SUMMARY, false);
    snprintf(subj, sizeof subj, "dsec.v1.ctl.evt.%s.demand", cell);
    sent += storm_events(subj, DSEC_MSG_DEMAND, true);
    snprintf(subj, sizeof subj, "dsec.v1.ctl.evt.%s.sbx.%s", cell, n0);
    sent += storm_events(subj, DSEC_MSG_SANDBOX_EVENTS, false);
    for (size_t i = 0; i < 2; i++) {
        snprintf(subj, sizeof subj, "dsec.v1.ctl.sched.%s.%s.back", cell, names[i]);
        sent += storm_events(subj, DSEC_MSG_PLACE, i == 0);
    }
    snprintf(subj, sizeof subj, "dsec.v1.ctl.job.%s.register", cell);
    sent += storm_events(subj, DSEC_MSG_JOB_REGISTER, true);
    snprintf(subj, sizeof subj, "dsec.v1.ctl.job.%s.storm-job.released", cell);
    sent += storm_events(subj, DSEC_MSG_RECLAIM_OUTCOME, true);
    snprintf(subj, sizeof subj, "dsec.v1.ctl.job.%s.storm-job.forced", cell);
    sent += storm_events(subj, DSEC_MSG_RECLAIM_OUTCOME, false);
    sent += storm_events("dsec.v1.ctl.quota.changed", DSEC_MSG_QUOTA, true);
    snprintf(subj, sizeof subj, "dsec.v1.ctl.sync.%s", cell);
    sent += storm_events(subj, DSEC_MSG_NONE, false);
    sent += storm_events("dsec.v1.ctl.sync", DSEC_MSG_NONE, false);
    /* the trajectory log: garbage where steps 0.. of rollout storm-r belong */
    payloads ps = {0};
    generic_payloads(&ps, false);
    for (size_t i = 0; i < ps.n; i++) {
        dsec_err err;
        snprintf(subj, sizeof subj, "dsec.v1.traj.storm-r.%zu", i);
        assert_int_equal(dsec_bus_publish(g.bus, subj, NULL, NULL, ps.v[i].data, ps.v[i].len, &err),
                         0);
    }
    /* the arbiter's lease and reclaim records */
    for (size_t i = 0; i < ps.n; i++) {
        dsec_err err;
        snprintf(subj, sizeof subj, "$KV.dsec-arbiter-%s.lease", cell);
        assert_int_equal(dsec_bus_publish(g.bus, subj, NULL, NULL, ps.v[i].data, ps.v[i].len, &err),
                         0);
        snprintf(subj, sizeof subj, "$KV.dsec-reclaim-%s.rc.storm-job", cell);
        assert_int_equal(dsec_bus_publish(g.bus, subj, NULL, NULL, ps.v[i].data, ps.v[i].len, &err),
                         0);
    }
    sent += 3 * (unsigned)ps.n;
    ps_free(&ps);
    dsec_err err;
    assert_int_equal(dsec_bus_flush(g.bus, 10000, &err), 0);
    fprintf(stderr, "storm: %u events published\n", sent);

    /* the schedulers' view heals: every node placed again, none lost */
    for (size_t i = 0; i < 2; i++) {
        dsec_sched_stats st = {0};
        uint64_t t0 = mono_ms();
        do {
            dsec_sched_stats_get(dsec_cell_sched_at(g.cell, i), &st);
            if (st.nodes == NODES)
                break;
            msleep(20);
        } while (mono_ms() - t0 < 10000);
        assert_int_equal(st.nodes, NODES);
    }
    /* the arbiter holds its lease again (the storm overwrote it) */
    dsec_arbiter_stats as = {0};
    uint64_t t0 = mono_ms();
    do {
        msleep(50);
        dsec_arbiter_stats_get(dsec_cell_arbiter(g.cell), &as);
    } while (!as.active && mono_ms() - t0 < 10000);
    assert_true(as.active);
}

/* What a cell's reports look like from outside: per node, heartbeats and capacity. */
struct watch {
    pthread_mutex_t mu;
    char nodes[NODES][80];
    unsigned hb[NODES], cap[NODES];
};

static void on_report(dsec_actor *a, dsec_msg *m, void *ud)
{
    struct watch *w = ud;
    const char *subj = dsec_msg_subject(m);
    const char *kind = strrchr(subj, '.');
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; kind && i < NODES; i++) {
        char want[200];
        snprintf(want, sizeof want, ".node.%s.", w->nodes[i]);
        const char *p = strstr(subj, want);
        if (p == NULL || p + strlen(want) != kind + 1)
            continue;
        if (strcmp(kind, ".heartbeat") == 0)
            w->hb[i]++;
        else if (strcmp(kind, ".capacity") == 0)
            w->cap[i]++;
    }
    pthread_mutex_unlock(&w->mu);
}

/* After the storm the cell does everything it did before it. */
static void cell_still_serves(void **state)
{
    dsec_err err;
    /* reports flow from every node */
    struct watch w = {0};
    pthread_mutex_init(&w.mu, NULL);
    for (size_t i = 0; i < NODES; i++)
        snprintf(w.nodes[i], sizeof w.nodes[i], "%s", node_name(i));
    dsec_actor *a = NULL;
    char subj[256];
    snprintf(subj, sizeof subj, "dsec.v1.ctl.evt.%s.node.>", g.conf.cell);
    assert_int_equal(dsec_actor_new(&a, g.bus, "storm-watch", &err), 0);
    assert_int_equal(dsec_actor_on(a, subj, NULL, on_report, &w, &err), 0);
    assert_int_equal(dsec_bus_flush(g.bus, 5000, &err), 0);

    /* the sandbox the storm aimed at is untouched and still works */
    dsec_sandbox_info info;
    if (dsec_status(g.client, g.sid, &info, &err) < 0)
        fail_msg("status of %s after the storm: %s", g.sid, err.msg);
    assert_string_equal(info.state, "running");
    const char *argv[] = {"echo", "after", NULL};
    dsec_exec_opts xo = {.argv = argv};
    dsec_exec_reply xr;
    if (dsec_exec(g.client, g.sid, &xo, &xr, &err) < 0)
        fail_msg("exec in %s after the storm: %s", g.sid, err.msg);
    assert_int_equal(xr.exit_code, 0);
    dsec_exec_reply_release(&xr);

    /* a new create, through either scheduler */
    char ids[4][96];
    for (int i = 0; i < 4; i++) {
        dsec_create_spec cs = {
            .type = "sim", .cpu_milli = 100, .memory_mb = 64, .cell = i % 2 ? g.conf.cell : NULL};
        if (dsec_create(g.client, &cs, &info, &err) < 0)
            fail_msg("create %d after the storm: %s", i, err.msg);
        snprintf(ids[i], sizeof ids[i], "%s", info.id);
        if (dsec_exec(g.client, ids[i], &xo, &xr, &err) < 0)
            fail_msg("exec in %s: %s", ids[i], err.msg);
        assert_int_equal(xr.exit_code, 0);
        dsec_exec_reply_release(&xr);
        assert_int_equal(dsec_status(g.client, ids[i], &info, &err), 0);
        assert_string_equal(info.state, "running");
    }

    /* the trajectory log: a garbage record answers an error, a real rollout logs and replays */
    const char *argv2[] = {"echo", "step", NULL};
    dsec_exec_opts ro = {.argv = argv2, .rollout_id = "storm-r", .step = 3};
    assert_int_equal(dsec_exec(g.client, ids[0], &ro, &xr, &err), -1);
    fprintf(stderr, "storm: a garbage trajectory record answers: %s (%s)\n", err.msg,
            dsec_code_name(err.code));
    assert_true(err.code == DSEC_E_DECODE || err.code == DSEC_E_TOO_LARGE);
    ro.rollout_id = "storm-ok";
    ro.step = 0;
    for (int i = 0; i < 2; i++) {
        if (dsec_exec(g.client, ids[0], &ro, &xr, &err) < 0)
            fail_msg("rollout exec %d after the storm: %s", i, err.msg);
        assert_int_equal(xr.exit_code, 0);
        dsec_exec_reply_release(&xr);
    }

    /* ping and hold, the other request subjects */
    dsec_msg *reply = NULL;
    dsec_msg_ping p = {.seq = 42};
    assert_int_equal(valid_request("dsec.v1.ctl.ping", DSEC_MSG_PING, &p, &reply, &err), 0);
    assert_string_equal(dsec_msg_type(reply), "pong");
    dsec_msg_free(reply);
    for (int rel = 0; rel < 2; rel++) {
        dsec_msg_job_hold h = {.job = "storm-hold",
                               .node = node_name(1),
                               .cpu_milli = 100,
                               .memory_mb = 10,
                               .release = rel == 1};
        snprintf(subj, sizeof subj, "dsec.v1.ctl.hold.%s", node_name(1));
        assert_int_equal(valid_request(subj, DSEC_MSG_JOB_HOLD, &h, &reply, &err), 0);
        assert_string_equal(dsec_msg_type(reply), "op_reply");
        dsec_msg_free(reply);
    }

    /* the quota actor lists its (no) definitions */
    dsec_msg_quota_list ql = {0};
    snprintf(subj, sizeof subj, "dsec.v1.ctl.quota.%s.list", g.conf.cell);
    assert_int_equal(valid_request(subj, DSEC_MSG_QUOTA_LIST, &ql, &reply, &err), 0);
    assert_string_equal(dsec_msg_type(reply), "quota_list");
    dsec_msg_free(reply);

    /* destroy: gone afterwards */
    for (int i = 0; i < 4; i++) {
        if (dsec_destroy(g.client, ids[i], &err) < 0)
            fail_msg("destroy %s after the storm: %s", ids[i], err.msg);
        assert_int_equal(dsec_status(g.client, ids[i], &info, &err), -1);
        assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    }
    assert_int_equal(dsec_destroy(g.client, g.sid, &err), 0);

    /* heartbeats and capacity from every node within a second and a half */
    msleep(1500);
    pthread_mutex_lock(&w.mu);
    for (size_t i = 0; i < NODES; i++) {
        if (w.hb[i] == 0 || w.cap[i] == 0)
            fail_msg("node %s sent %u heartbeats and %u capacity reports in 1.5 s after the storm",
                     w.nodes[i], w.hb[i], w.cap[i]);
    }
    pthread_mutex_unlock(&w.mu);
    dsec_actor_free(a);
    pthread_mutex_destroy(&w.mu);
    for (size_t i = 0; i < 2; i++) {
        dsec_sched_stats st;
        dsec_sched_stats_get(dsec_cell_sched_at(g.cell, i), &st);
        assert_int_equal(st.nodes, NODES);
    }
    dsec_bus_stats bs;
    dsec_bus_stats_get(dsec_cell_bus(g.cell), &bs);
    assert_int_equal(bs.mailbox_drops, 0);
    assert_int_equal(bs.disconnects, 0);
}

/* A well-formed body does not make a malformed subject acceptable: a
 * create whose tenant token is no tenant name is refused, not placed, in a
 * cell with the quota actor (which checks the tenant too) and in one
 * without it. */
static int stop_plain_cell(void **state)
{
    dsec_cell_stop(g.plain, true);
    dsec_cell_conf_release(&g.plain_conf);
    g.plain = NULL;
    return 0;
}

static void valid_create_on_malformed_subject_is_refused(void **state)
{
    dsec_cell_conf *c = &g.plain_conf;
    dsec_cell_conf_defaults(c);
    snprintf(c->cell, sizeof c->cell, "storm-plain-%ld", (long)getpid());
    snprintf(c->url, sizeof c->url, "%s", dsec_natsd_url(g.natsd));
    snprintf(c->state_dir, sizeof c->state_dir, "%s/%s", g.root, c->cell);
    c->quota = false;
    static const char *const types[] = {"sim", NULL};
    char prefix[80];
    snprintf(prefix, sizeof prefix, "%s-n", c->cell);
    dsec_err err;
    if (dsec_cell_conf_add_sim_nodes(c, prefix, 1, 4000, 8192, 100, types, "0", &err) < 0 ||
        dsec_cell_start(&g.plain, c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        fail_msg("cell without quota: %s", err.msg);
    char x300[301], x65[66];
    repeat(x300, sizeof x300, "x", 300);
    repeat(x65, sizeof x65, "x", 65);
    const char *cells[2] = {g.conf.cell, c->cell};
    int accepted = 0, tried = 0;
    for (int k = 0; k < 2; k++) {
        char subjects[3][400];
        snprintf(subjects[0], sizeof subjects[0], "dsec.v1.%s.create.%s", x300, cells[k]);
        snprintf(subjects[1], sizeof subjects[1], "dsec.v1.\xff\xfe.create.%s", cells[k]);
        snprintf(subjects[2], sizeof subjects[2], "dsec.v1.%s.create.%s", x65, cells[k]);
        for (int i = 0; i < 3; i++, tried++) {
            char rid[40];
            snprintf(rid, sizeof rid, "storm-valid-%d-%d", k, i);
            dsec_msg_create cr = {.req_id = rid, .type = "sim", .cpu_milli = 10, .memory_mb = 16};
            dsec_msg *reply = NULL;
            if (valid_request(subjects[i], DSEC_MSG_CREATE, &cr, &reply, &err) < 0)
                fail_msg("a valid create on a malformed subject: no answer: %s", err.msg);
            const char *type = dsec_msg_type(reply);
            fprintf(stderr, "storm: a valid create, tenant token %s, cell %s: answered %s\n",
                    i == 0   ? "300 bytes"
                    : i == 1 ? "not UTF-8"
                             : "65 bytes",
                    cells[k], type ? type : "(none)");
            if (type == NULL || strcmp(type, "error") != 0)
                accepted++;
            dsec_msg_free(reply);
        }
    }
    if (accepted)
        fail_msg(
            "%d of %d valid creates on subjects whose tenant token is no name were not refused",
            accepted, tried);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(malformed_requests_get_error_replies),
        cmocka_unit_test(malformed_lookup_gets_error_reply),
        cmocka_unit_test(malformed_reclaim_gets_error_reply),
        cmocka_unit_test(event_storm_is_absorbed),
        cmocka_unit_test_teardown(valid_create_on_malformed_subject_is_refused, stop_plain_cell),
        cmocka_unit_test(cell_still_serves),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
