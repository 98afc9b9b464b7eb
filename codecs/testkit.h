/* testkit.h - test support for codecs: a full sample of every message and a strict JSON checker.
 * Linked by tests, fuzz harnesses and benchmarks (dsec_codecs_testkit), never by daemons. */
#ifndef DSEC_CODECS_TESTKIT_H
#define DSEC_CODECS_TESTKIT_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Fill out (a struct of type) with every field set to a valid, distinctive
 * value: lists of several items, maps, bins with zero bytes inside, values at
 * the edge of their ranges. Pointers refer to static storage: nothing to
 * free. Returns false for an unknown type. */
bool dsec_testkit_sample(int type, void *out);

/* Strict RFC 8259 check: whether s[0..n) is exactly one JSON value (with
 * optional surrounding whitespace), strings valid UTF-8 with valid escapes.
 * On false, *where (if not NULL) is the byte offset of the first error. */
bool dsec_testkit_json_valid(const char *s, size_t n, size_t *where);

#ifdef __cplusplus
}
#endif
#endif
