/* wire.c - per-thread codec state and the reply helpers shared by actors. */
#include "actors/wire.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "dsec/alloc.h"
#include "dsec/utf8.h"

struct wire_tls {
    dsec_decoder *dec;
    dsec_buf buf;
};

static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

static void tls_free(void *p)
{
    struct wire_tls *w = p;
    dsec_decoder_free(w->dec);
    dsec_buf_release(&w->buf);
    dsec_free(w);
}

static void tls_init(void)
{
    pthread_key_create(&tls_key, tls_free);
}

static struct wire_tls *tls(void)
{
    pthread_once(&tls_once, tls_init);
    struct wire_tls *w = pthread_getspecific(tls_key);
    if (w == NULL) {
        w = dsec_calloc(1, sizeof *w);
        if (w == NULL)
            return NULL;
        w->dec = dsec_decoder_new(NULL);
        dsec_buf_init(&w->buf);
        if (w->dec == NULL) {
            dsec_free(w);
            return NULL;
        }
        pthread_setspecific(tls_key, w);
    }
    return w;
}

dsec_decoder *dsec_wire_decoder(void)
{
    struct wire_tls *w = tls();
    return w ? w->dec : NULL;
}

dsec_buf *dsec_wire_buf(void)
{
    struct wire_tls *w = tls();
    return w ? &w->buf : NULL;
}

static const char *req_id_or_null(const char *id);

/* bus/ writes this Dsec-Schema when a sender gives none; it must be the
 * version the codecs speak. */
_Static_assert(DSEC_BUS_SCHEMA == DSEC_SCHEMA_VERSION, "bus and codecs disagree on Dsec-Schema");

int dsec_wire_send(dsec_actor *actor, dsec_bus *bus, const char *subject, const char *reply,
                   int type, const void *msg, const char *req_id, dsec_err *err)
{
    dsec_buf *b = dsec_wire_buf();
    if (b == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    if (dsec_encode(b, type, msg, err) < 0)
        return -1;
    dsec_hdr hdr = {
        .type = dsec_msg_type_name(type), .schema = DSEC_SCHEMA_VERSION, .req_id = req_id};
    if (actor != NULL)
        return dsec_actor_publish(actor, subject, reply, &hdr, b->data, b->len, err);
    return dsec_bus_publish(bus, subject, reply, &hdr, b->data, b->len, err);
}

int dsec_wire_reply(dsec_actor *actor, dsec_msg *m, int type, const void *msg, dsec_err *err)
{
    const char *reply = dsec_msg_reply(m);
    if (reply == NULL)
        return 0;
    return dsec_wire_send(actor, dsec_actor_bus(actor), reply, NULL, type, msg,
                          req_id_or_null(dsec_msg_header(m, DSEC_HDR_REQ_ID)), err);
}

/* Copy src into dst (size n > 0) as valid UTF-8: bytes that are not part of
 * a valid sequence become '?', and a sequence that does not fit is cut
 * whole. Error texts quote subjects and fields byte for byte, and a fixed
 * buffer may cut them mid-character: either would make the error
 * unencodable. */
static void utf8_clean(char *dst, size_t n, const char *src)
{
    const unsigned char *s = (const unsigned char *)src;
    size_t left = strlen(src), o = 0;
    while (left > 0) {
        size_t k = dsec_utf8_seq(s, left);
        if (o + (k ? k : 1) >= n)
            break;
        if (k == 0) {
            dst[o++] = '?';
            k = 1;
        } else {
            memcpy(dst + o, s, k);
            o += k;
        }
        s += k;
        left -= k;
    }
    dst[o] = '\0';
}

/* A request id as the protocol allows it (1-64 bytes of UTF-8 without
 * control characters), else NULL: an id a requester put in a header is
 * echoed only when the reply can carry it. */
static const char *req_id_or_null(const char *id)
{
    if (id == NULL)
        return NULL;
    size_t n = strlen(id);
    if (n == 0 || n > 64)
        return NULL;
    const unsigned char *s = (const unsigned char *)id;
    for (size_t i = 0; i < n;) {
        if (s[i] < 0x20 || s[i] == 0x7f)
            return NULL;
        size_t k = dsec_utf8_seq(s + i, n - i);
        if (k == 0)
            return NULL;
        i += k;
    }
    return id;
}

void dsec_wire_error_to(dsec_actor *actor, dsec_bus *bus, const char *subject, const dsec_err *e,
                        const char *field, const char *req_id)
{
    if (actor != NULL)
        dsec_actor_count_error(actor);
    if (subject == NULL)
        return;
    /* Nothing the failed request carried may stop its answer: every string
     * is made encodable first, so a malformed request never meets silence. */
    char msg[DSEC_ERR_MSG_MAX], fld[257];
    utf8_clean(msg, sizeof msg, e->msg);
    if (msg[0] == '\0')
        snprintf(msg, sizeof msg, "%s", dsec_code_name(e->code));
    if (field != NULL) {
        utf8_clean(fld, sizeof fld, field);
        field = fld[0] != '\0' ? fld : NULL;
    }
    req_id = req_id_or_null(req_id);
    dsec_msg_error m = {.code = dsec_code_name(e->code),
                        .message = msg,
                        .retry_safe = dsec_code_retry_safe(e->code),
                        .field = field,
                        .req_id = req_id,
                        /* only overloaded says it: other codes' errors may be filled without it */
                        .retry_after_ms = e->code == DSEC_E_OVERLOADED ? e->retry_after_ms : 0};
    dsec_err ignored;
    dsec_wire_send(actor, actor ? dsec_actor_bus(actor) : bus, subject, NULL, DSEC_MSG_ERROR, &m,
                   req_id, &ignored);
}

bool dsec_wire_bus_error(dsec_msg *reply, dsec_err *e, const char *who_fmt, ...)
{
    if (dsec_msg_len(reply) != 0)
        return false;
    const char *bc = dsec_msg_header(reply, DSEC_HDR_ERROR_CODE);
    if (bc == NULL)
        return false;
    char who[DSEC_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, who_fmt);
    vsnprintf(who, sizeof who, who_fmt, ap);
    va_end(ap);
    dsec_err_set(e, dsec_code_from_name(bc), 0, "%s could not take the request (%s)", who, bc);
    return true;
}

void dsec_wire_error_field(dsec_actor *actor, dsec_msg *m, const dsec_err *e, const char *field)
{
    const char *req_id = dsec_msg_header(m, DSEC_HDR_REQ_ID);
    char body_id[65];
    if (e->code == DSEC_E_DECODE || e->code == DSEC_E_TOO_LARGE) {
        if (field == NULL) {
            dsec_decoder *d = dsec_wire_decoder();
            field = d ? dsec_decoder_bad_field(d) : NULL;
            if (field != NULL && field[0] == '\0')
                field = NULL;
        }
        /* The payload did not decode, but its req_id may still be readable:
         * that one is the request's own, the header only a copy. */
        if (dsec_msgpack_peek_str(dsec_msg_data(m), dsec_msg_len(m), "req_id", body_id,
                                  sizeof body_id) &&
            req_id_or_null(body_id) != NULL)
            req_id = body_id;
    }
    dsec_wire_error_to(actor, dsec_actor_bus(actor), dsec_msg_reply(m), e, field, req_id);
}

void dsec_wire_error(dsec_actor *actor, dsec_msg *m, const dsec_err *e)
{
    dsec_wire_error_field(actor, m, e, NULL);
}

bool dsec_wire_type_ok(dsec_actor *actor, dsec_msg *m, int type)
{
    const char *want = dsec_msg_type_name(type);
    const char *got = dsec_msg_type(m);
    if (got != NULL && strcmp(got, want) == 0)
        return true;
    dsec_err e;
    if (got == NULL)
        dsec_err_set(&e, DSEC_E_UNSUPPORTED, 0,
                     "%.200s takes Dsec-Type \"%s\"; the request has no Dsec-Type header",
                     dsec_msg_subject(m), want);
    else
        dsec_err_set(&e, DSEC_E_UNSUPPORTED, 0,
                     "%.200s takes Dsec-Type \"%s\", not \"%.64s\" (the payload was not read)",
                     dsec_msg_subject(m), want, got);
    dsec_wire_error_to(actor, dsec_actor_bus(actor), dsec_msg_reply(m), &e, DSEC_HDR_TYPE,
                       dsec_msg_header(m, DSEC_HDR_REQ_ID));
    return false;
}

int dsec_wire_tokens(const char *subject, char *buf, size_t n, const char **tok, int max)
{
    size_t len = strlen(subject);
    if (len + 1 > n)
        return -1;
    memcpy(buf, subject, len + 1);
    int count = 0;
    char *p = buf;
    for (;;) {
        if (count == max)
            return -1;
        tok[count++] = p;
        char *dot = strchr(p, '.');
        if (dot == NULL)
            break;
        *dot = '\0';
        p = dot + 1;
    }
    return count;
}
