/* sha256.h - SHA-256 digests (request digests of the trajectory log). */
#ifndef DSEC_SHA256_H
#define DSEC_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define DSEC_SHA256_LEN 32

typedef struct dsec_sha256 {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t used;
} dsec_sha256;

void dsec_sha256_init(dsec_sha256 *c);
void dsec_sha256_update(dsec_sha256 *c, const void *data, size_t n);
void dsec_sha256_final(dsec_sha256 *c, uint8_t out[DSEC_SHA256_LEN]);
/* A digest as 64 lowercase hex digits and a NUL. */
void dsec_sha256_hex(const uint8_t d[DSEC_SHA256_LEN], char out[2 * DSEC_SHA256_LEN + 1]);

#endif
