/* net-box.h - the allowlist algebra without the kernel: address ranges, boxes of allow entries. */
#ifndef DSEC_BACKENDS_NET_BOX_H
#define DSEC_BACKENDS_NET_BOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- address ranges (big-endian byte strings of 4 or 16 bytes) ---------------------------- */

/* 4 for AF_INET, else 16. */
unsigned dsec__addr_len(int family);
int dsec__addr_cmp(const uint8_t *a, const uint8_t *b, unsigned len);
/* a += 1 (dir > 0) or a -= 1; false when it wrapped around. */
bool dsec__addr_step(uint8_t *a, unsigned len, int dir);
/* The first and last address of addr/plen. */
void dsec__prefix_range(const uint8_t *addr, unsigned plen, unsigned len, uint8_t *lo, uint8_t *hi);
/* "a.b.c.d/n" or "x::y/n" (no "/n": one address); -1 when it is neither. */
int dsec__parse_cidr(const char *s, int *family, uint8_t *addr, unsigned *plen);

/* ---- boxes ------------------------------------------------------------------------------- */

/* What one allow entry lets through: a protocol, an address range and a port range, until an
 * expiry. A sandbox's allow set in the kernel is a set of disjoint boxes; where entries
 * overlap, the one that lives longer holds the overlap (so a short-lived entry never cuts a
 * hole in a permanent one when it expires). */
struct dsec__box {
    uint8_t family; /* AF_INET6 for all: IPv4 ranges are kept as ::ffff:a.b.c.d */
    uint8_t proto;
    uint16_t plo, phi;
    uint8_t lo[16], hi[16]; /* address range, big-endian */
    uint64_t exp_ms;        /* CLOCK_MONOTONIC expiry; 0: permanent */
};

bool dsec__box_overlap(const struct dsec__box *a, const struct dsec__box *b);
/* Whether a covers all of b. */
bool dsec__box_contains(const struct dsec__box *a, const struct dsec__box *b);
/* Whether a outlives (or lives as long as) b. */
bool dsec__box_strong(const struct dsec__box *a, const struct dsec__box *b);
/* b minus a (they overlap) into out (up to 4 boxes); returns the count. */
size_t dsec__box_sub(const struct dsec__box *b, const struct dsec__box *a, struct dsec__box *out);

/* A growable list of boxes; oom is set (and pushes stop) when memory ran out. */
struct dsec__boxv {
    struct dsec__box *v;
    size_t n, cap;
    bool oom;
};

/* One kernel element operation on an allow set. */
struct dsec__op {
    bool del;
    struct dsec__box b;
};

struct dsec__opv {
    struct dsec__op *v;
    size_t n, cap;
    bool oom;
};

void dsec__boxv_push(struct dsec__boxv *bv, const struct dsec__box *b);
void dsec__opv_push(struct dsec__opv *ov, bool del, const struct dsec__box *b);
/* Insert nb into the disjoint set s (in place), recording the kernel operations that turn the
 * old set into the new one in ops (deletions of boxes, additions of boxes). Boxes of s that
 * expire by now are not re-added in pieces. s->oom is set when memory ran out. */
void dsec__box_insert(struct dsec__boxv *s, const struct dsec__box *nb, struct dsec__opv *ops,
                      uint64_t now);

#endif
