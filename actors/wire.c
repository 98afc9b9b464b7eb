/* wire.c - per-thread codec state and the reply helpers shared by actors. */
#include "actors/wire.h"

#include <pthread.h>
#include <string.h>

#include "dsec/alloc.h"

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

static void tls_init(void) { pthread_key_create(&tls_key, tls_free); }

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

int dsec_wire_send(dsec_actor *actor, dsec_bus *bus, const char *subject, const char *reply,
                   int type, const void *msg, const char *req_id, dsec_err *err)
{
    dsec_buf *b = dsec_wire_buf();
    if (b == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    if (dsec_encode(b, type, msg, err) < 0)
        return -1;
    dsec_hdr hdr = {.type = dsec_msg_type_name(type), .schema = DSEC_SCHEMA_VERSION,
                    .req_id = req_id};
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
                          dsec_msg_header(m, DSEC_HDR_REQ_ID), err);
}

void dsec_wire_error_to(dsec_actor *actor, dsec_bus *bus, const char *subject, const dsec_err *e,
                        const char *field, const char *req_id)
{
    if (actor != NULL)
        dsec_actor_count_error(actor);
    if (subject == NULL)
        return;
    dsec_msg_error m = {.code = dsec_code_name(e->code), .message = e->msg,
                        .retry_safe = dsec_code_retry_safe(e->code), .field = field,
                        .req_id = req_id};
    dsec_err ignored;
    dsec_wire_send(actor, actor ? dsec_actor_bus(actor) : bus, subject, NULL, DSEC_MSG_ERROR, &m,
                   req_id, &ignored);
}

void dsec_wire_error(dsec_actor *actor, dsec_msg *m, const dsec_err *e)
{
    const char *field = NULL;
    if (e->code == DSEC_E_DECODE || e->code == DSEC_E_TOO_LARGE) {
        dsec_decoder *d = dsec_wire_decoder();
        field = d ? dsec_decoder_bad_field(d) : NULL;
        if (field != NULL && field[0] == '\0')
            field = NULL;
    }
    dsec_wire_error_to(actor, dsec_actor_bus(actor), dsec_msg_reply(m), e, field,
                       dsec_msg_header(m, DSEC_HDR_REQ_ID));
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
