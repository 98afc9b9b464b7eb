/* err.c - dsec_err: fill once, wrap with context on the way up. */
#include "dsec/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const code_names[DSEC_CODE_MAX_] = {
    [DSEC_OK] = "ok",
    [DSEC_E_INVALID] = "invalid",
    [DSEC_E_NOMEM] = "nomem",
    [DSEC_E_IO] = "io",
    [DSEC_E_TIMEOUT] = "timeout",
    [DSEC_E_NO_RESPONDERS] = "no_responders",
    [DSEC_E_CONN] = "connection",
    [DSEC_E_DECODE] = "decode",
    [DSEC_E_TOO_LARGE] = "too_large",
    [DSEC_E_NOT_FOUND] = "not_found",
    [DSEC_E_EXISTS] = "exists",
    [DSEC_E_CAPACITY] = "capacity",
    [DSEC_E_UNSUPPORTED] = "unsupported",
    [DSEC_E_STATE] = "state",
    [DSEC_E_OVERFLOW] = "overflow",
    [DSEC_E_CLOSED] = "closed",
    [DSEC_E_REFUSED] = "refused",
    [DSEC_E_PERMISSION] = "permission",
    [DSEC_E_CONFIG] = "config",
    [DSEC_E_INTERNAL] = "internal",
    [DSEC_E_BACKEND] = "backend",
    [DSEC_E_DIVERGED] = "diverged",
    [DSEC_E_QUOTA] = "quota",
    [DSEC_E_OVERLOADED] = "overloaded",
};

int dsec_err_set(dsec_err *err, int code, int errnum, const char *fmt, ...)
{
    if (err == NULL)
        return -1;
    err->code = code;
    err->errnum = errnum;
    err->retry_after_ms = 0;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    if (errnum != 0 && n >= 0 && (size_t)n < sizeof err->msg)
        snprintf(err->msg + n, sizeof err->msg - (size_t)n, ": %s", strerror(errnum));
    return -1;
}

int dsec_err_wrap(dsec_err *err, const char *fmt, ...)
{
    if (err == NULL)
        return -1;
    char prefix[DSEC_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[DSEC_ERR_MSG_MAX];
    memcpy(old, err->msg, sizeof old);
    /* the message is bounded: keep the context, cut the tail of the cause */
    size_t plen = strnlen(prefix, sizeof err->msg - 3);
    memcpy(err->msg, prefix, plen);
    memcpy(err->msg + plen, ": ", 2);
    size_t room = sizeof err->msg - plen - 3;
    size_t olen = strnlen(old, room);
    memcpy(err->msg + plen + 2, old, olen);
    err->msg[plen + 2 + olen] = '\0';
    if (err->code == DSEC_OK)
        err->code = DSEC_E_INTERNAL;
    return -1;
}

void dsec_err_clear(dsec_err *err)
{
    if (err == NULL)
        return;
    err->code = DSEC_OK;
    err->errnum = 0;
    err->msg[0] = '\0';
    err->retry_after_ms = 0;
}

const char *dsec_code_name(int code)
{
    if (code < 0 || code >= DSEC_CODE_MAX_ || code_names[code] == NULL)
        return "unknown";
    return code_names[code];
}

int dsec_code_from_name(const char *name)
{
    for (int i = 0; i < DSEC_CODE_MAX_; i++)
        if (code_names[i] != NULL && strcmp(code_names[i], name) == 0)
            return i;
    return DSEC_E_INTERNAL;
}

bool dsec_code_retry_safe(int code)
{
    switch (code) {
    case DSEC_E_TIMEOUT:
    case DSEC_E_NO_RESPONDERS:
    case DSEC_E_CONN:
    case DSEC_E_CAPACITY:
    case DSEC_E_QUOTA:      /* like capacity: room comes back as sandboxes end */
    case DSEC_E_OVERLOADED: /* answered before anything was placed */
    case DSEC_E_OVERFLOW:
    case DSEC_E_REFUSED:
    case DSEC_E_CLOSED:
    case DSEC_E_NOMEM:
        return true;
    default:
        return false;
    }
}
