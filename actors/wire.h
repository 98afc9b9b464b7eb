/* wire.h - what every actor needs to speak the protocol: per-thread codec state and reply helpers.
 */
#ifndef DSEC_ACTORS_WIRE_H
#define DSEC_ACTORS_WIRE_H

#include <stdbool.h>
#include <stddef.h>

#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/err.h"

/* This thread's decoder and encode buffer (created on first use, freed when
 * the thread exits). Never NULL unless memory ran out. */
dsec_decoder *dsec_wire_decoder(void);
dsec_buf *dsec_wire_buf(void);

/* Encode msg of type and publish it to subject (reply may be NULL).
 * Counted in actor's msgs_out when actor is not NULL. */
int dsec_wire_send(dsec_actor *actor, dsec_bus *bus, const char *subject, const char *reply,
                   int type, const void *msg, const char *req_id, dsec_err *err);

/* Answer msg (its reply subject) with msg of type. No-op without a reply subject. */
int dsec_wire_reply(dsec_actor *actor, dsec_msg *m, int type, const void *msg, dsec_err *err);

/* Send an "error" message built from e to subject (or to m's reply subject
 * when subject is NULL). field may be NULL. Failures are counted, not returned:
 * an error path must not fail again. */
void dsec_wire_error_to(dsec_actor *actor, dsec_bus *bus, const char *subject, const dsec_err *e,
                        const char *field, const char *req_id);
/* Answer m's reply subject with an error built from e. decode and too_large
 * errors name the decoder's bad field and echo the payload's req_id when it
 * can be read (else the Dsec-Req-Id header). */
void dsec_wire_error(dsec_actor *actor, dsec_msg *m, const dsec_err *e);
/* dsec_wire_error with the offending field (a payload field, "Dsec-Type" or
 * "subject"; NULL: none). */
void dsec_wire_error_field(dsec_actor *actor, dsec_msg *m, const dsec_err *e, const char *field);

/* Whether m's Dsec-Type header names type: a receiver picks the decoder from
 * it and never from the subject alone (docs/protocol.md, Transport). When it
 * does not (absent, unknown, or another message), a request is answered
 * "unsupported" with field "Dsec-Type", the actor counts an error, and false
 * is returned: the handler must not read the payload. */
bool dsec_wire_type_ok(dsec_actor *actor, dsec_msg *m, int type);
/* Whether reply is a bus-level error answer (empty body, Dsec-Error-Code:
 * the responder's mailbox was full, it was closing, or it cannot read the
 * schema): no actor read the request. Then *e (may be NULL) gets that code
 * and a message naming who (printf-style, formatted only then), e.g. "the
 * quota actor of cell c1". Such a reply must not be passed on as it is: its
 * empty body carries no code. */
bool dsec_wire_bus_error(dsec_msg *reply, dsec_err *e, const char *who_fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Split subject into at most max tokens (pointers into buf, a copy of
 * subject of size n). Returns the token count, or -1 if it does not fit. */
int dsec_wire_tokens(const char *subject, char *buf, size_t n, const char **tok, int max);

#endif
