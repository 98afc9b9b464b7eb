/* internal.h - what the files of libdsec share; never installed. */
#ifndef DSEC_CLIENT_INTERNAL_H
#define DSEC_CLIENT_INTERNAL_H

#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/client.h"

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
int dsec__client_sbx_call(dsec_client *c, const char *id, const char *op, int type,
                          const void *msg, int reply_type, dsec_decoder *dec,
                          dsec_msg **keep, void *out, dsec_err *err);
/* An upload of len bytes of data to path (files.c): atomic and hashed. */
int dsec__file_upload_mem(dsec_client *c, const char *id, const char *path, const void *data,
                          size_t len, unsigned mode, dsec_err *err);

#endif
