/* msg.c - dsec messages on NATS: the headers every publish carries, the
 * accessors handlers use, replies, and fresh request/trace ids. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <uuid/uuid.h>

#include "bus/internal.h"
#include "dsec/alloc.h"

#ifdef DSEC_NATS_RAW_HEADERS
/* Exported by libnats 3.x, not declared in nats.h; see bus/CMakeLists.txt. */
natsStatus natsMsg_create(natsMsg **newMsg, const char *subject, int subjLen, const char *reply,
                          int replyLen, const char *buf, int bufLen, int hdrLen);
void natsMsg_free(void *object);

/* natsMsg_Destroy does not free a received message: it queues it for nats.c's
 * garbage-collector thread under one process-wide lock, and wakes that thread
 * whenever the queue was empty. With every request and reply destroyed that
 * way, the lock, the wake-ups and the thread's own context switches were the
 * largest single cost the bus added to a round trip. dsec frees them at once
 * with the same function the collector would call, natsMsg_free, but only
 * where natsMsg_Destroy itself would free the message: its collector hook
 * (natsGCItem.freeCb, the first member after the GC list link) is
 * natsMsg_free, and its flags lack nats.c's "no destroy" bit (1 << 2, set
 * while JetStream's auto-ack callback still needs the message). Both fields
 * sit in nats.c's internal struct __natsMsg, so they are read only after
 * free_selfcheck has found them where 3.x puts them; anything else goes to
 * natsMsg_Destroy. */
#define NATS_MSG_FREECB_OFF sizeof(void *)
#define NATS_MSG_FLAGS_OFF 68
#define NATS_MSG_NO_DESTROY (1 << 2)

static pthread_once_t free_once = PTHREAD_ONCE_INIT;
static bool free_ok;

static void *msg_free_cb(const natsMsg *nm)
{
    void *cb;
    memcpy(&cb, (const char *)nm + NATS_MSG_FREECB_OFF, sizeof cb);
    return cb;
}

static int msg_flags(const natsMsg *nm)
{
    int f;
    memcpy(&f, (const char *)nm + NATS_MSG_FLAGS_OFF, sizeof f);
    return f;
}

/* natsMsg_create sets the flags to exactly "needs lift" (1 << 0) for a
 * message with headers and to 0 without, a header read clears that bit, and
 * every message it makes carries natsMsg_free as its collector hook. */
static void free_selfcheck(void)
{
    static const char blk[] = "NATS/1.0\r\nX: y\r\n\r\n";
    natsMsg *with = NULL, *without = NULL;
    const char *v = NULL;
    bool ok = natsMsg_create(&with, "dsec.check", 10, NULL, 0, blk, (int)sizeof blk - 1,
                             (int)sizeof blk - 1) == NATS_OK &&
              natsMsg_create(&without, "dsec.check", 10, NULL, 0, "x", 1, 0) == NATS_OK;
    ok = ok && msg_free_cb(with) == (void *)natsMsg_free &&
         msg_free_cb(without) == (void *)natsMsg_free && msg_flags(with) == 1 &&
         msg_flags(without) == 0;
    ok = ok && natsMsgHeader_Get(with, "X", &v) == NATS_OK && v != NULL && strcmp(v, "y") == 0 &&
         msg_flags(with) == 0;
    natsMsg_free(with);
    natsMsg_free(without);
    free_ok = ok;
}

bool dsec__msg_free_inline(void)
{
    pthread_once(&free_once, free_selfcheck);
    return free_ok;
}
#else
bool dsec__msg_free_inline(void)
{
    return false;
}
#endif

void dsec__msg_destroy(natsMsg **nm)
{
    /* Every natsMsg that reaches dsec - received, built for a publish, or a
     * reply held by a future - dies here, so ownership is easy to audit. */
    natsMsg *m = *nm;
    *nm = NULL;
    if (m == NULL)
        return;
#ifdef DSEC_NATS_RAW_HEADERS
    if (dsec__msg_free_inline() && msg_free_cb(m) == (void *)natsMsg_free &&
        (msg_flags(m) & NATS_MSG_NO_DESTROY) == 0) {
        natsMsg_free(m);
        return;
    }
#endif
    natsMsg_Destroy(m);
}

/* ---- ids --------------------------------------------------------------- */

/* xoshiro256** per thread, seeded from libuuid's random source: ids are
 * needed per publish (trace ids), and reading the kernel's entropy for each
 * one would cost a syscall. */
static _Thread_local uint64_t rng[4];
static _Thread_local bool rng_seeded;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* A forked child must not replay its parent's sequence. */
static void rng_after_fork(void)
{
    rng_seeded = false;
}

static void rng_register_atfork(void)
{
    pthread_atfork(NULL, NULL, rng_after_fork);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(void)
{
    uint64_t r = rotl(rng[1] * 5, 7) * 9;
    uint64_t t = rng[1] << 17;
    rng[2] ^= rng[0];
    rng[3] ^= rng[1];
    rng[1] ^= rng[2];
    rng[0] ^= rng[3];
    rng[2] ^= t;
    rng[3] = rotl(rng[3], 45);
    return r;
}

static void rng_seed(void)
{
    pthread_once(&atfork_once, rng_register_atfork);
    uuid_t a, b;
    uuid_generate_random(a);
    uuid_generate_random(b);
    memcpy(&rng[0], a, 16);
    memcpy(&rng[2], b, 16);
    if ((rng[0] | rng[1] | rng[2] | rng[3]) == 0)
        rng[0] = 0x9e3779b97f4a7c15ull; /* the all-zero state is a fixed point */
    rng_seeded = true;
}

void dsec_bus_new_id(char out[33])
{
    static const char hex[] = "0123456789abcdef";
    if (!rng_seeded)
        rng_seed();
    uint64_t w[2] = {rng_next(), rng_next()};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 16; j++)
            out[i * 16 + j] = hex[(w[i] >> (60 - 4 * j)) & 0xf];
    out[32] = '\0';
}

/* ---- publish ----------------------------------------------------------- */

static char *utoa10(char *end, unsigned v)
{
    *--end = '\0';
    do
        *--end = (char)('0' + v % 10);
    while ((v /= 10) != 0);
    return end;
}

#ifdef DSEC_NATS_RAW_HEADERS
/* nats.c builds a message's headers as a hash of separately allocated keys
 * and values: about 20 allocations for our five headers, which cut publish
 * throughput to 40% of a header-less publish. nats.c exports the constructor
 * it uses for received messages, which takes the encoded header block as is
 * and is published without re-encoding. CMake enables this path only when
 * the installed libnats links it (see bus/CMakeLists.txt); the bus tests
 * check every header arrives. */
/* One header of an outgoing message; lengths are measured once. */
struct out_hdr {
    const char *key;
    size_t kl;
    const char *value;
    size_t vl;
};

static int add_hdr(struct out_hdr *h, int n, const char *key, size_t kl, const char *value)
{
    if (value == NULL)
        return n;
    h[n] = (struct out_hdr){key, kl, value, strlen(value)};
    return n + 1;
}

#define KEY(k) k, sizeof k - 1

static natsStatus raw_headers_msg(natsMsg **out, const char *subject, const char *reply,
                                  const dsec_hdr *hdr, const char *schema, const char *trace_id,
                                  const char *err_code, const void *data, size_t len)
{
    struct out_hdr h[6];
    int n = 0;
    n = add_hdr(h, n, KEY(DSEC_HDR_TYPE), hdr != NULL ? hdr->type : NULL);
    n = add_hdr(h, n, KEY(DSEC_HDR_SCHEMA), schema);
    h[n++] = (struct out_hdr){KEY(DSEC_HDR_CONTENT_TYPE), KEY(DSEC_CONTENT_TYPE)};
    n = add_hdr(h, n, KEY(DSEC_HDR_REQ_ID), hdr != NULL ? hdr->req_id : NULL);
    n = add_hdr(h, n, KEY(DSEC_HDR_TRACE_ID), trace_id);
    n = add_hdr(h, n, KEY(DSEC_HDR_ERROR_CODE), err_code);
    /* The block's exact size: "NATS/1.0\r\n", "Key: value\r\n" each, "\r\n".
     * Ids are whatever the requester sent, so no fixed bound fits them all.
     * Values with CR or LF are refused: they would forge headers. */
    size_t hl = 10 + 2;
    for (int i = 0; i < n; i++) {
        if (memchr(h[i].value, '\r', h[i].vl) != NULL || memchr(h[i].value, '\n', h[i].vl) != NULL)
            return NATS_INVALID_ARG;
        hl += h[i].kl + h[i].vl + 4;
    }
    if (hl + len > INT_MAX)
        return NATS_INVALID_ARG;
    char stackbuf[2048];
    size_t cap = hl + len;
    char *buf = cap <= sizeof stackbuf ? stackbuf : dsec_malloc(cap);
    if (buf == NULL)
        return NATS_NO_MEMORY;
    char *p = buf;
    memcpy(p, "NATS/1.0\r\n", 10);
    p += 10;
    for (int i = 0; i < n; i++) {
        memcpy(p, h[i].key, h[i].kl);
        p += h[i].kl;
        *p++ = ':';
        *p++ = ' ';
        memcpy(p, h[i].value, h[i].vl);
        p += h[i].vl;
        *p++ = '\r';
        *p++ = '\n';
    }
    *p++ = '\r';
    *p++ = '\n';
    if (len > 0)
        memcpy(p, data, len);
    natsStatus s = natsMsg_create(out, subject, (int)strlen(subject), reply,
                                  reply ? (int)strlen(reply) : 0, buf, (int)(hl + len), (int)hl);
    if (buf != stackbuf)
        dsec_free(buf);
    return s;
}
#endif

int dsec__publish(dsec_bus *bus, const char *subject, const char *reply, const dsec_hdr *hdr,
                  const void *data, size_t len, const char *err_code, dsec_err *err)
{
    if (subject == NULL || subject[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "publish: empty subject");
    if (len > INT_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "publish to %s: %zu bytes is too large",
                            subject, len);
    if (data == NULL && len > 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "publish to %s: NULL data", subject);
    /* Every message carries its schema version: the bus's own error replies,
     * and a sender's that named none, get DSEC_BUS_SCHEMA (bus.h). */
    dsec_hdr versioned = hdr != NULL ? *hdr : (dsec_hdr){0};
    if (versioned.schema == 0)
        versioned.schema = DSEC_BUS_SCHEMA;
    hdr = &versioned;

    char schema_buf[12];
    char trace[33];
    const char *trace_id = hdr != NULL ? hdr->trace_id : NULL;
    if (trace_id == NULL)
        trace_id = dsec_trace_current(); /* what this thread works for carries on */
    if (trace_id == NULL) {
        dsec_bus_new_id(trace);
        trace_id = trace;
    }
    dsec__trace_note_send(hdr, err_code);
    const char *schema = utoa10(schema_buf + sizeof schema_buf, hdr != NULL ? hdr->schema : 0);
    natsMsg *nm = NULL;
    natsStatus s;
#ifdef DSEC_NATS_RAW_HEADERS
    s = raw_headers_msg(&nm, subject, reply, hdr, schema, trace_id, err_code, data, len);
#else
    s = natsMsg_Create(&nm, subject, reply, data, (int)len);
    if (s == NATS_OK && hdr != NULL && hdr->type != NULL)
        s = natsMsgHeader_Set(nm, DSEC_HDR_TYPE, hdr->type);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(nm, DSEC_HDR_SCHEMA, schema);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(nm, DSEC_HDR_CONTENT_TYPE, DSEC_CONTENT_TYPE);
    if (s == NATS_OK && hdr != NULL && hdr->req_id != NULL)
        s = natsMsgHeader_Set(nm, DSEC_HDR_REQ_ID, hdr->req_id);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(nm, DSEC_HDR_TRACE_ID, trace_id);
    if (s == NATS_OK && err_code != NULL)
        s = natsMsgHeader_Set(nm, DSEC_HDR_ERROR_CODE, err_code);
#endif
    if (s == NATS_OK)
        s = natsConnection_PublishMsg(bus->nc, nm);
    dsec__msg_destroy(&nm); /* freed at once: see dsec__msg_destroy */
    if (s != NATS_OK)
        return dsec__nats_err(err, s, "publish to %s", subject);
    return 0;
}

int dsec_bus_publish(dsec_bus *bus, const char *subject, const char *reply, const dsec_hdr *hdr,
                     const void *data, size_t len, dsec_err *err)
{
    return dsec__publish(bus, subject, reply, hdr, data, len, NULL, err);
}

/* ---- reading headers ----------------------------------------------------- */

/* natsMsgHeader_Get parses a received message's whole header block into a
 * hash of separately allocated entries on first use, which cost more than
 * the rest of a request's handling on the receiving side. dsec reads a few
 * headers per message, so it reads them from the raw block instead:
 * nats.c's natsMsg_create, which makes every received message, lays one
 * allocation out as subject NUL [reply NUL] header-block NUL data NUL. That
 * layout is nats.c's internal business, so it is relied on only after a
 * self-check on messages built by the same constructor, and each block must
 * look untouched ("NATS/1.0\r\n" ... "\r\n\r\n", no NUL: nats.c's own parse
 * writes NULs into it). Anything else goes to natsMsgHeader_Get. */

static const char *header_or_null(natsMsg *nm, const char *key)
{
    const char *v = NULL;
    return natsMsgHeader_Get(nm, key, &v) == NATS_OK ? v : NULL;
}

static bool hspace(char c)
{
    /* isspace() in the C locale, which nats.c's parser uses */
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* The untouched header block right before nm's data, or false. */
static bool raw_block(natsMsg *nm, const char **block, size_t *len)
{
    const char *data = natsMsg_GetData(nm), *subject = natsMsg_GetSubject(nm);
    const char *reply = natsMsg_GetReply(nm);
    if (data == NULL || subject == NULL)
        return false;
    const char *start = reply != NULL ? reply + strlen(reply) + 1 : subject + strlen(subject) + 1;
    uintptr_t s = (uintptr_t)start, d = (uintptr_t)data;
    /* data - 1 is the NUL natsMsg_create puts after the block; a block
     * larger than nats.c's own buffers would mean we are not looking at one */
    if (d <= s || d - s - 1 < 12 || d - s - 1 > 1024 * 1024)
        return false;
    size_t n = d - s - 1;
    if (data[-1] != '\0' || memcmp(start, "NATS/1.0\r\n", 10) != 0 ||
        memcmp(start + n - 4, "\r\n\r\n", 4) != 0 || memchr(start, '\0', n) != NULL)
        return false;
    *block = start;
    *len = n;
    return true;
}

/* Find key in an untouched block the way nats.c's parser reads it: "Key:"
 * up to the first colon, the value with surrounding white space trimmed, the
 * first of repeated keys. Lines nats.c reads in a way of its own (folded
 * continuation lines, empty values, a key without a colon, a status after
 * "NATS/1.0") return -1, and so does any such line after key's, because
 * nats.c then fails the whole block. */
static int block_find(const char *b, size_t n, const char *key, size_t kl, const char **value,
                      size_t *vlen)
{
    const char *p = b + 10, *last = b + n - 2; /* last: the blank line's CRLF */
    int found = 0;
    while (p != last) {
        if (hspace(*p))
            return -1;
        const char *colon = memchr(p, ':', (size_t)(last - p));
        if (colon == NULL || memchr(p, '\n', (size_t)(colon - p)) != NULL ||
            memchr(p, '\r', (size_t)(colon - p)) != NULL)
            return -1;
        const char *v = colon + 1;
        while (hspace(*v) && !(v[0] == '\r' && v[1] == '\n'))
            v++;
        if (v[0] == '\r' && v[1] == '\n')
            return -1;
        const char *eol = v + 1;
        while (!(eol[0] == '\r' && eol[1] == '\n'))
            eol++; /* stops at last at the latest */
        const char *ve = eol;
        while (ve > v && hspace(ve[-1]))
            ve--;
        if (!found && (size_t)(colon - p) == kl && memcmp(p, key, kl) == 0) {
            *value = v;
            *vlen = (size_t)(ve - v);
            found = 1;
        }
        p = eol + 2;
        if (p > last)
            return -1; /* a value ran into the blank line */
    }
    return found;
}

#ifdef DSEC_NATS_RAW_HEADERS
static pthread_once_t raw_once = PTHREAD_ONCE_INIT;
static bool raw_ok;

/* Build messages the way nats.c builds received ones, with and without a
 * reply, and check raw_block finds exactly the header bytes. */
static void raw_selfcheck(void)
{
    static const char blk[] = "NATS/1.0\r\nDsec-Type: t\r\nX: y\r\n\r\n";
    static const char body[] = "payload";
    char buf[sizeof blk + sizeof body];
    memcpy(buf, blk, sizeof blk - 1);
    memcpy(buf + sizeof blk - 1, body, sizeof body - 1);
    int hl = (int)sizeof blk - 1, total = hl + (int)sizeof body - 1;
    bool ok = true;
    for (int with_reply = 0; with_reply < 2 && ok; with_reply++) {
        natsMsg *nm = NULL;
        if (natsMsg_create(&nm, "dsec.check", 10, with_reply ? "_INBOX.check" : NULL,
                           with_reply ? 12 : 0, buf, total, hl) != NATS_OK)
            return;
        const char *b = NULL, *v = NULL;
        size_t n = 0, vl = 0;
        ok = raw_block(nm, &b, &n) && n == (size_t)hl && memcmp(b, blk, n) == 0 &&
             b + n + 1 == natsMsg_GetData(nm) && natsMsg_GetDataLength(nm) == total - hl &&
             block_find(b, n, "X", 1, &v, &vl) == 1 && vl == 1 && *v == 'y';
        natsMsg_free(nm);
    }
    raw_ok = ok;
}
#endif

static bool raw_usable(natsMsg *nm, const char **b, size_t *n)
{
#ifdef DSEC_NATS_RAW_HEADERS
    pthread_once(&raw_once, raw_selfcheck);
    return raw_ok && nm != NULL && raw_block(nm, b, n);
#else
    (void)nm, (void)b, (void)n;
    return false;
#endif
}

int dsec__msg_header_raw(natsMsg *nm, const char *key, const char **value, size_t *len)
{
    const char *b;
    size_t n;
    if (key == NULL || !raw_usable(nm, &b, &n))
        return -1;
    return block_find(b, n, key, strlen(key), value, len);
}

const char *dsec__msg_header(dsec_msg *m, const char *key)
{
    /* The block is checked once per message: nothing in dsec parses it
     * through nats.c before hstate turns 2. */
    if (m->hstate == 0) {
        const char *b;
        size_t n;
        if (raw_usable(m->nm, &b, &n) && n <= UINT32_MAX) {
            m->hblock = b;
            m->hlen = (uint32_t)n;
            m->hstate = 1;
        } else {
            m->hstate = 2;
        }
    }
    const char *v = NULL;
    size_t vl = 0;
    int found = m->hstate == 1 ? block_find(m->hblock, m->hlen, key, strlen(key), &v, &vl) : -1;
    if (found == 0)
        return NULL;
    if (found == 1) {
        /* The same value read again gets the same copy. */
        for (size_t off = 0; off < m->hused;) {
            const char *c = m->hcache + off;
            size_t cl = strlen(c);
            if (cl == vl && memcmp(c, v, vl) == 0)
                return c;
            off += cl + 1;
        }
        if (m->hused + vl + 1 <= sizeof m->hcache) {
            char *c = m->hcache + m->hused;
            memcpy(c, v, vl);
            c[vl] = '\0';
            m->hused = (uint16_t)(m->hused + vl + 1);
            return c;
        }
    }
    /* nats.c parses the block in place: later reads of m come here too,
     * while the copies handed out so far stay valid. */
    m->hstate = 2;
    return header_or_null(m->nm, key);
}

void dsec__reply_error(dsec_bus *bus, natsMsg *nm, const char *code_name)
{
    const char *reply = natsMsg_GetReply(nm);
    if (reply == NULL || reply[0] == '\0')
        return;
    /* Keep the request's ids so the requester can correlate the failure. */
    dsec_msg view;
    dsec__msg_init(&view, nm, bus);
    dsec_hdr h = {
        .type = DSEC_TYPE_ERROR,
        .req_id = dsec__msg_header(&view, DSEC_HDR_REQ_ID),
        .trace_id = dsec__msg_header(&view, DSEC_HDR_TRACE_ID),
    };
    /* Best effort: if even this publish fails, the request's deadline still
     * ends it on the requester's side. */
    dsec__publish(bus, reply, NULL, &h, NULL, 0, code_name, NULL);
}

/* ---- accessors --------------------------------------------------------- */

const char *dsec_msg_subject(const dsec_msg *m)
{
    return natsMsg_GetSubject(m->nm);
}

const char *dsec_msg_reply(const dsec_msg *m)
{
    const char *r = natsMsg_GetReply(m->nm);
    return r != NULL && r[0] != '\0' ? r : NULL;
}

const void *dsec_msg_data(const dsec_msg *m)
{
    return natsMsg_GetData(m->nm);
}

size_t dsec_msg_len(const dsec_msg *m)
{
    int n = natsMsg_GetDataLength(m->nm);
    return n > 0 ? (size_t)n : 0;
}

const char *dsec_msg_header(dsec_msg *m, const char *key)
{
    if (m == NULL || key == NULL || key[0] == '\0')
        return NULL;
    return dsec__msg_header(m, key);
}

const char *dsec_msg_type(dsec_msg *m)
{
    return dsec_msg_header(m, DSEC_HDR_TYPE);
}

int dsec_msg_respond(dsec_actor *actor, dsec_msg *m, const dsec_hdr *hdr, const void *data,
                     size_t len, dsec_err *err)
{
    const char *reply = dsec_msg_reply(m);
    if (reply == NULL)
        return 0;
    /* A reply carries the request's ids unless the caller sets its own: the
     * trace stays end to end and the requester can match retries. */
    dsec_hdr h = hdr != NULL ? *hdr : (dsec_hdr){0};
    if (h.trace_id == NULL)
        h.trace_id = dsec__msg_header(m, DSEC_HDR_TRACE_ID);
    if (h.req_id == NULL)
        h.req_id = dsec__msg_header(m, DSEC_HDR_REQ_ID);
    dsec_bus *bus = actor != NULL ? dsec_actor_bus(actor) : m->bus;
    if (dsec__publish(bus, reply, NULL, &h, data, len, NULL, err) < 0)
        return -1;
    if (actor != NULL)
        dsec__actor_count_out(actor);
    return 0;
}

void dsec_msg_free(dsec_msg *m)
{
    /* Only messages handed out by dsec_bus_request_sync are the caller's;
     * borrowed ones (handlers, futures) are freed by their owner. */
    if (m == NULL || !m->heap)
        return;
    dsec__msg_destroy(&m->nm);
    dsec_free(m);
}
