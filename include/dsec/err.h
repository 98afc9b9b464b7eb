/* err.h - the one error contract of dsec: negative return plus a filled dsec_err. */
#ifndef DSEC_ERR_H
#define DSEC_ERR_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes. Stable: they travel on the wire (docs/protocol.md). */
typedef enum dsec_code {
    DSEC_OK = 0,
    DSEC_E_INVALID = 1,       /* bad argument or bad request field */
    DSEC_E_NOMEM = 2,         /* allocation failed */
    DSEC_E_IO = 3,            /* system call failed; see errnum */
    DSEC_E_TIMEOUT = 4,       /* deadline passed without an answer */
    DSEC_E_NO_RESPONDERS = 5, /* nobody subscribes to the subject */
    DSEC_E_CONN = 6,          /* connection to the bus lost or refused */
    DSEC_E_DECODE = 7,        /* malformed payload */
    DSEC_E_TOO_LARGE = 8,     /* a field or payload exceeds its limit */
    DSEC_E_NOT_FOUND = 9,     /* no such sandbox, node, file, ... */
    DSEC_E_EXISTS = 10,       /* already exists */
    DSEC_E_CAPACITY = 11,     /* no room for the request anywhere it may go */
    DSEC_E_UNSUPPORTED = 12,  /* unknown type or capability, unsupported op */
    DSEC_E_STATE = 13,        /* operation not valid in the current state */
    DSEC_E_OVERFLOW = 14,     /* a mailbox or queue is full */
    DSEC_E_CLOSED = 15,       /* object is shutting down or closed */
    DSEC_E_REFUSED = 16,      /* a node refused the placement */
    DSEC_E_PERMISSION = 17,   /* caller is not allowed to do this */
    DSEC_E_CONFIG = 18,       /* bad configuration */
    DSEC_E_INTERNAL = 19,     /* a bug in dsec */
    DSEC_E_BACKEND = 20,      /* the sandbox backend failed */
    DSEC_E_DIVERGED = 21,     /* a rollout step differs from the one its trajectory log holds */
    DSEC_E_QUOTA = 22,        /* the tenant's or a project's quota has no room for the request */
    DSEC_E_OVERLOADED = 23,   /* the scheduler holds all the work it may: try again after
                                 retry_after_ms (nothing was placed) */
    DSEC_CODE_MAX_
} dsec_code;

#define DSEC_ERR_MSG_MAX 1024

/* One error: a code, an errno where there is one, and a message naming what failed. */
typedef struct dsec_err {
    int code;   /* a dsec_code */
    int errnum; /* errno, or 0 */
    char msg[DSEC_ERR_MSG_MAX];
    /* With DSEC_E_OVERLOADED: how long to wait before the retry (the error
     * reply's retry_after_ms); 0 otherwise. Last, so code, errnum and msg
     * keep their offsets. dsec_err_set resets it. */
    unsigned retry_after_ms;
} dsec_err;

/* Fill err (which may be NULL) and return -1. The message is printf-style. */
int dsec_err_set(dsec_err *err, int code, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Prefix err's message with context ("opening state dir: ..."); return -1. */
int dsec_err_wrap(dsec_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Reset err to DSEC_OK with an empty message. */
void dsec_err_clear(dsec_err *err);

/* The stable name of a code ("timeout"); never NULL. */
const char *dsec_code_name(int code);

/* Parse a name produced by dsec_code_name; returns DSEC_E_INTERNAL if unknown. */
int dsec_code_from_name(const char *name);

/* Whether a request that failed with this code can be retried without harm
 * (assuming the request carries a request id, so creates are idempotent). */
bool dsec_code_retry_safe(int code);

#ifdef __cplusplus
}
#endif
#endif
