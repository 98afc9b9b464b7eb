/* msg.c - dsec messages on NATS: the headers every publish carries, the
 * accessors handlers use, replies, and fresh request/trace ids. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <uuid/uuid.h>

#include "bus/internal.h"
#include "dsec/alloc.h"

void dsec__msg_destroy(natsMsg **nm)
{
    /* Every natsMsg that reaches dsec - received, built for a publish, or a
     * reply held by a future - dies here, so ownership is easy to audit. */
    natsMsg_Destroy(*nm);
    *nm = NULL;
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
natsStatus natsMsg_create(natsMsg **newMsg, const char *subject, int subjLen, const char *reply,
                          int replyLen, const char *buf, int bufLen, int hdrLen);
/* Frees at once. natsMsg_Destroy hands every message to nats.c's garbage
 * collector thread, which matters only for messages a subscription owns; one
 * we built and published is ours alone. */
void natsMsg_free(void *object);

/* Append "Key: value\r\n"; values with CR or LF are refused (they would
 * forge headers). Returns the new position or NULL when it does not fit. */
static char *put_header(char *p, char *end, const char *key, const char *value)
{
    size_t kl = strlen(key), vl = strlen(value);
    if ((size_t)(end - p) < kl + vl + 4 || strpbrk(value, "\r\n") != NULL)
        return NULL;
    memcpy(p, key, kl);
    p += kl;
    *p++ = ':';
    *p++ = ' ';
    memcpy(p, value, vl);
    p += vl;
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

/* The bytes put_header writes for key and value (0 without a value). */
static size_t header_len(const char *key, const char *value)
{
    return value != NULL ? strlen(key) + strlen(value) + 4 : 0;
}

static natsStatus raw_headers_msg(natsMsg **out, const char *subject, const char *reply,
                                  const dsec_hdr *hdr, const char *schema, const char *trace_id,
                                  const char *err_code, const void *data, size_t len)
{
    /* The block's exact size: "NATS/1.0\r\n", "Key: value\r\n" each, "\r\n".
     * Ids are whatever the requester sent, so no fixed bound fits them all. */
    size_t hcap = 10 + 2 + header_len(DSEC_HDR_TYPE, hdr != NULL ? hdr->type : NULL) +
                  header_len(DSEC_HDR_SCHEMA, schema) +
                  header_len(DSEC_HDR_CONTENT_TYPE, DSEC_CONTENT_TYPE) +
                  header_len(DSEC_HDR_REQ_ID, hdr != NULL ? hdr->req_id : NULL) +
                  header_len(DSEC_HDR_TRACE_ID, trace_id) + header_len(DSEC_HDR_ERROR_CODE, err_code);
    if (hcap + len > INT_MAX)
        return NATS_INVALID_ARG;
    char stackbuf[2048];
    size_t cap = hcap + len;
    char *buf = cap <= sizeof stackbuf ? stackbuf : dsec_malloc(cap);
    if (buf == NULL)
        return NATS_NO_MEMORY;
    char *end = buf + hcap, *p = buf;
    memcpy(p, "NATS/1.0\r\n", 10);
    p += 10;
    if (p && hdr != NULL && hdr->type != NULL)
        p = put_header(p, end, DSEC_HDR_TYPE, hdr->type);
    if (p)
        p = put_header(p, end, DSEC_HDR_SCHEMA, schema);
    if (p)
        p = put_header(p, end, DSEC_HDR_CONTENT_TYPE, DSEC_CONTENT_TYPE);
    if (p && hdr != NULL && hdr->req_id != NULL)
        p = put_header(p, end, DSEC_HDR_REQ_ID, hdr->req_id);
    if (p)
        p = put_header(p, end, DSEC_HDR_TRACE_ID, trace_id);
    if (p && err_code != NULL)
        p = put_header(p, end, DSEC_HDR_ERROR_CODE, err_code);
    natsStatus s = NATS_INVALID_ARG; /* a header too long or with CR/LF */
    if (p != NULL && end - p >= 2) {
        *p++ = '\r';
        *p++ = '\n';
        int hdr_len = (int)(p - buf);
        if (len > 0)
            memcpy(p, data, len);
        s = natsMsg_create(out, subject, (int)strlen(subject), reply,
                           reply ? (int)strlen(reply) : 0, buf, hdr_len + (int)len, hdr_len);
    }
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

    char schema_buf[12];
    char trace[33];
    const char *trace_id = hdr != NULL ? hdr->trace_id : NULL;
    if (trace_id == NULL) {
        dsec_bus_new_id(trace);
        trace_id = trace;
    }
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
#ifdef DSEC_NATS_RAW_HEADERS
    natsMsg_free(nm);
#else
    dsec__msg_destroy(&nm);
#endif
    if (s != NATS_OK)
        return dsec__nats_err(err, s, "publish to %s", subject);
    return 0;
}

int dsec_bus_publish(dsec_bus *bus, const char *subject, const char *reply, const dsec_hdr *hdr,
                     const void *data, size_t len, dsec_err *err)
{
    return dsec__publish(bus, subject, reply, hdr, data, len, NULL, err);
}

static const char *header_or_null(natsMsg *nm, const char *key)
{
    const char *v = NULL;
    return natsMsgHeader_Get(nm, key, &v) == NATS_OK ? v : NULL;
}

void dsec__reply_error(dsec_bus *bus, natsMsg *nm, const char *code_name)
{
    const char *reply = natsMsg_GetReply(nm);
    if (reply == NULL || reply[0] == '\0')
        return;
    /* Keep the request's ids so the requester can correlate the failure. */
    dsec_hdr h = {
        .type = DSEC_TYPE_ERROR,
        .req_id = header_or_null(nm, DSEC_HDR_REQ_ID),
        .trace_id = header_or_null(nm, DSEC_HDR_TRACE_ID),
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
    return header_or_null(m->nm, key);
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
        h.trace_id = header_or_null(m->nm, DSEC_HDR_TRACE_ID);
    if (h.req_id == NULL)
        h.req_id = header_or_null(m->nm, DSEC_HDR_REQ_ID);
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
