/* sha256.c - SHA-256 (FIPS 180-4), for request digests in the trajectory log. */
#include "dsec/sha256.h"

#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_SHANI_CODE 1
#endif

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void block(dsec_sha256 *c, const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = c->h[0], b = c->h[1], cc = c->h[2], d = c->h[3], e = c->h[4], f = c->h[5],
             g = c->h[6], h = c->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 =
            h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & cc) ^ (b & cc));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = cc;
        cc = b;
        b = a;
        a = t1 + t2;
    }
    c->h[0] += a;
    c->h[1] += b;
    c->h[2] += cc;
    c->h[3] += d;
    c->h[4] += e;
    c->h[5] += f;
    c->h[6] += g;
    c->h[7] += h;
}

static void blocks_portable(dsec_sha256 *c, const uint8_t *p, size_t nb)
{
    for (; nb > 0; nb--, p += 64)
        block(c, p);
}

#ifdef HAVE_SHANI_CODE
/* The x86 SHA extensions: four rounds per two instructions, about ten times the portable
 * code, which matters to file transfers (each byte is hashed at both ends). */
__attribute__((target("sha,sse4.1,ssse3"))) static void blocks_shani(dsec_sha256 *c,
                                                                     const uint8_t *p, size_t nb)
{
    const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i tmp = _mm_loadu_si128((const __m128i *)&c->h[0]);
    __m128i s1 = _mm_loadu_si128((const __m128i *)&c->h[4]);
    tmp = _mm_shuffle_epi32(tmp, 0xB1);       /* CDAB */
    s1 = _mm_shuffle_epi32(s1, 0x1B);         /* EFGH */
    __m128i s0 = _mm_alignr_epi8(tmp, s1, 8); /* ABEF */
    s1 = _mm_blend_epi16(s1, tmp, 0xF0);      /* CDGH */
    for (; nb > 0; nb--, p += 64) {
        __m128i abef = s0, cdgh = s1, m[4];
        for (int i = 0; i < 4; i++)
            m[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), mask);
        for (int r = 0; r < 16; r++) {
            __m128i msg = _mm_add_epi32(m[r & 3], _mm_loadu_si128((const __m128i *)&K[4 * r]));
            s1 = _mm_sha256rnds2_epu32(s1, s0, msg);
            s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(msg, 0x0E));
            if (r < 12) { /* the schedule's words 4(r+4) .. 4(r+4)+3 */
                __m128i t = _mm_sha256msg1_epu32(m[r & 3], m[(r + 1) & 3]);
                t = _mm_add_epi32(t, _mm_alignr_epi8(m[(r + 3) & 3], m[(r + 2) & 3], 4));
                m[r & 3] = _mm_sha256msg2_epu32(t, m[(r + 3) & 3]);
            }
        }
        s0 = _mm_add_epi32(s0, abef);
        s1 = _mm_add_epi32(s1, cdgh);
    }
    tmp = _mm_shuffle_epi32(s0, 0x1B);   /* FEBA */
    s1 = _mm_shuffle_epi32(s1, 0xB1);    /* DCHG */
    s0 = _mm_blend_epi16(tmp, s1, 0xF0); /* DCBA */
    s1 = _mm_alignr_epi8(s1, tmp, 8);    /* HGFE */
    _mm_storeu_si128((__m128i *)&c->h[0], s0);
    _mm_storeu_si128((__m128i *)&c->h[4], s1);
}

static bool has_shani(void)
{
    unsigned a, b, cc, d;
    if (!__get_cpuid(1, &a, &b, &cc, &d) || !(cc & (1u << 19)) || !(cc & (1u << 9)))
        return false;
    return __get_cpuid_count(7, 0, &a, &b, &cc, &d) && (b & (1u << 29));
}
#endif

static void blocks(dsec_sha256 *c, const uint8_t *p, size_t nb)
{
#ifdef HAVE_SHANI_CODE
    static int shani = -1; /* racy but idempotent: every thread finds the same answer */
    if (shani < 0)
        shani = has_shani();
    if (shani) {
        blocks_shani(c, p, nb);
        return;
    }
#endif
    blocks_portable(c, p, nb);
}

void dsec_sha256_init(dsec_sha256 *c)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, iv, sizeof iv);
    c->len = 0;
    c->used = 0;
}

void dsec_sha256_update(dsec_sha256 *c, const void *data, size_t n)
{
    const uint8_t *p = data;
    c->len += n;
    if (c->used == 0 && n >= 64) { /* whole blocks straight from the input */
        blocks(c, p, n / 64);
        p += n / 64 * 64;
        n %= 64;
    }
    while (n > 0) {
        size_t take = 64 - c->used < n ? 64 - c->used : n;
        memcpy(c->buf + c->used, p, take);
        c->used += take;
        p += take;
        n -= take;
        if (c->used == 64) {
            blocks(c, c->buf, 1);
            c->used = 0;
            if (n >= 64) {
                blocks(c, p, n / 64);
                p += n / 64 * 64;
                n %= 64;
            }
        }
    }
}

void dsec_sha256_final(dsec_sha256 *c, uint8_t out[DSEC_SHA256_LEN])
{
    uint64_t bits = c->len * 8;
    uint8_t pad = 0x80;
    dsec_sha256_update(c, &pad, 1);
    pad = 0;
    while (c->used != 56)
        dsec_sha256_update(c, &pad, 1);
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++)
        lenb[i] = (uint8_t)(bits >> (56 - 8 * i));
    dsec_sha256_update(c, lenb, 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
}

void dsec_sha256_hex(const uint8_t d[DSEC_SHA256_LEN], char out[2 * DSEC_SHA256_LEN + 1])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < DSEC_SHA256_LEN; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[2 * DSEC_SHA256_LEN] = '\0';
}
