/* buf.c - dsec_buf, the growable byte buffer encoders and renderers write into. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "codecs/codec.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"

void dsec_buf_init(dsec_buf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void dsec_buf_release(dsec_buf *b)
{
    if (b == NULL)
        return;
    dsec_free(b->data);
    dsec_buf_init(b);
}

int dsec_buf_reserve(dsec_buf *b, size_t n, dsec_err *err)
{
    if (n <= b->cap - b->len)
        return 0;
    if (n > SIZE_MAX / 2 - b->len)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "buffer: %zu bytes is too many", n);
    size_t cap = b->cap < 256 ? 256 : b->cap;
    while (cap - b->len < n)
        cap *= 2;
    char *p = dsec_realloc(b->data, cap);
    if (p == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "buffer: out of memory growing to %zu bytes",
                            cap);
    b->data = p;
    b->cap = cap;
    return 0;
}

int dsec_buf_append(dsec_buf *b, const void *p, size_t n, dsec_err *err)
{
    if (n == 0)
        return 0;
    if (dsec_buf_reserve(b, n, err) < 0)
        return -1;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int dsec__buf_printf(dsec_buf *b, dsec_err *err, const char *fmt, ...)
{
    char small[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return dsec_err_set(err, DSEC_E_INTERNAL, 0, "buffer: bad format");
    if ((size_t)n < sizeof small)
        return dsec_buf_append(b, small, (size_t)n, err);
    /* Rare: format straight into the buffer, with room for vsnprintf's NUL. */
    if (dsec_buf_reserve(b, (size_t)n + 1, err) < 0)
        return -1;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

int dsec__buf_write_cb(void *data, const char *p, size_t n)
{
    return dsec_buf_append(data, p, n, NULL);
}
