/* internal.h - what the files of libdsec share; never installed. */
#ifndef DSEC_CLIENT_INTERNAL_H
#define DSEC_CLIENT_INTERNAL_H

#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/client.h"
#include "dsec/pace.h"

#include <pthread.h>
#include <stdbool.h>

struct async_create;

/* A connected client (client.c makes and frees it; create.c runs its retrier). */
struct dsec_client {
    dsec_bus *bus;
    char *tenant;
    int timeout_ms;
    int retries;
    bool direct_callbacks; /* dsec_client_opts.direct_callbacks */
    dsec_actor *lost;      /* dsec_watch_lost's subscription */
    /* creates whose connection dropped mid-request wait here until that attempt's
     * deadline before their retry (see defer_retry) */
    pthread_mutex_t rmu;
    pthread_cond_t rcv;
    struct async_create *rhead, *rtail;
    pthread_t retrier;
    dsec_pace *pace; /* creates held back while the cell sheds them (dsec/pace.h) */
    bool retrier_started, retrier_stop;
    dsec_node_lost_cb lost_cb;
    void *lost_ud;
};

/* The client's bus (owned by the client). */
dsec_bus *dsec__client_bus(dsec_client *c);
/* How long a request waits for its answer (dsec_client_opts.timeout_ms). */
int dsec__client_timeout_ms(const dsec_client *c);
/* "dsec.v1.<tenant>.sbx.<node>.<id>.<op>" into subj. */
int dsec__client_sbx_subject(dsec_client *c, const char *id, const char *op, char *subj, size_t n,
                             dsec_err *err);
/* A reply: the expected message of type (decoded into out with dec) or the error it carries. */

int dsec__client_decode_reply(dsec_decoder *dec, dsec_msg *reply, int type, void *out,
                              dsec_err *err);
/* One request on the sandbox's op subject and its decoded answer; *keep (the reply) is the
 * caller's to free with dsec_msg_free. */
int dsec__client_sbx_call(dsec_client *c, const char *id, const char *op, int type, const void *msg,
                          int reply_type, dsec_decoder *dec, dsec_msg **keep, void *out,
                          dsec_err *err);
/* The same, with the request's id (NULL: none) and its own wait. */
int dsec__client_sbx_call_for(dsec_client *c, const char *id, const char *op, int type,
                              const void *msg, const char *req_id, int reply_type,
                              dsec_decoder *dec, dsec_msg **keep, void *out, int timeout_ms,
                              dsec_err *err);
/* The strings in the NULL-terminated v (NULL: none). */
uint32_t dsec__client_count_nt(const char *const *v);
/* Split "k=v" strings into kv (at most 256; what names them in errors); the keys are copies,
 * freed with the arrays by dsec__client_kv_release, the values borrow pairs. */
int dsec__client_kv_from_pairs(const char *const *pairs, dsec_kv *kv, const char *what,
                               dsec_err *err);
void dsec__client_kv_release(dsec_kv *kv);
/* src (NULL: "") into dst of n bytes, cut to fit. */
void dsec__client_copy_str(char *dst, size_t n, const char *src);
/* An upload of len bytes of data to path (files.c): atomic and hashed. */
int dsec__file_upload_mem(dsec_client *c, const char *id, const char *path, const void *data,
                          size_t len, unsigned mode, dsec_err *err);

#endif
