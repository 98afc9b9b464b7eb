/* utf8.h - UTF-8 validation shared by the JSON parser and the wire's error texts. */
#ifndef DSEC_UTF8_H
#define DSEC_UTF8_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The length of the valid UTF-8 sequence at s (n >= 1 bytes left): 1 for ASCII, 0 when the bytes
 * there are not a valid sequence (overlong forms, surrogates and code points past U+10FFFF
 * included, a sequence cut short by n). */
size_t dsec_utf8_seq(const unsigned char *s, size_t n);

#ifdef __cplusplus
}
#endif
#endif
