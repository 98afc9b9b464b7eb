/* net-box.c - the allowlist algebra without the kernel: address ranges, boxes of allow entries. */
#define _GNU_SOURCE
#include "backends/net/net-box.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dsec/alloc.h"

/* ---- address ranges -------------------------------------------------------------------------- */

unsigned dsec__addr_len(int family)
{
    return family == AF_INET ? 4 : 16;
}

int dsec__addr_cmp(const uint8_t *a, const uint8_t *b, unsigned len)
{
    return memcmp(a, b, len);
}

/* a += 1 (or -= 1); returns false on wrap */
bool dsec__addr_step(uint8_t *a, unsigned len, int dir)
{
    for (unsigned i = len; i-- > 0;) {
        if (dir > 0) {
            if (++a[i] != 0)
                return true;
        } else {
            if (a[i]-- != 0)
                return true;
        }
    }
    return false;
}

void dsec__prefix_range(const uint8_t *addr, unsigned plen, unsigned len, uint8_t *lo, uint8_t *hi)
{
    for (unsigned i = 0; i < len; i++) {
        unsigned bits = plen > i * 8 ? plen - i * 8 : 0;
        uint8_t m = bits >= 8 ? 0xff : (uint8_t)(0xff << (8 - bits));
        lo[i] = addr[i] & m;
        hi[i] = (uint8_t)(addr[i] | (uint8_t)~m);
    }
}

/* "a.b.c.d/n" or "x::y/n" (no "/n": one address) */
int dsec__parse_cidr(const char *s, int *family, uint8_t *addr, unsigned *plen)
{
    char buf[INET6_ADDRSTRLEN + 8];
    if (s == NULL || strlen(s) >= sizeof buf)
        return -1;
    strcpy(buf, s);
    char *slash = strchr(buf, '/');
    long n = -1;
    if (slash != NULL) {
        *slash = 0;
        char *end;
        errno = 0;
        n = strtol(slash + 1, &end, 10);
        if (errno != 0 || end == slash + 1 || *end != 0 || n < 0)
            return -1;
    }
    memset(addr, 0, 16);
    if (inet_pton(AF_INET, buf, addr) == 1)
        *family = AF_INET;
    else if (inet_pton(AF_INET6, buf, addr) == 1)
        *family = AF_INET6;
    else
        return -1;
    unsigned max = dsec__addr_len(*family) * 8;
    if (n > (long)max)
        return -1;
    *plen = n < 0 ? max : (unsigned)n;
    return 0;
}

/* ---- the box algebra of allow entries ------------------------------------------------------ */

bool dsec__box_overlap(const struct dsec__box *a, const struct dsec__box *b)
{
    if (a->family != b->family || a->proto != b->proto)
        return false;
    unsigned len = dsec__addr_len(a->family);
    return dsec__addr_cmp(a->lo, b->hi, len) <= 0 && dsec__addr_cmp(b->lo, a->hi, len) <= 0 &&
           a->plo <= b->phi && b->plo <= a->phi;
}

bool dsec__box_contains(const struct dsec__box *a, const struct dsec__box *b)
{
    unsigned len = dsec__addr_len(a->family);
    return a->family == b->family && a->proto == b->proto &&
           dsec__addr_cmp(a->lo, b->lo, len) <= 0 && dsec__addr_cmp(b->hi, a->hi, len) <= 0 &&
           a->plo <= b->plo && b->phi <= a->phi;
}

/* Does a outlive (or live as long as) b? */
bool dsec__box_strong(const struct dsec__box *a, const struct dsec__box *b)
{
    return a->exp_ms == 0 || (b->exp_ms != 0 && a->exp_ms >= b->exp_ms);
}

/* b minus a (they overlap) into out (up to 4 boxes); returns the count. */
size_t dsec__box_sub(const struct dsec__box *b, const struct dsec__box *a, struct dsec__box *out)
{
    unsigned len = dsec__addr_len(b->family);
    size_t n = 0;
    struct dsec__box mid = *b;
    if (dsec__addr_cmp(b->lo, a->lo, len) < 0) {
        out[n] = *b;
        memcpy(out[n].hi, a->lo, len);
        dsec__addr_step(out[n].hi, len, -1);
        n++;
        memcpy(mid.lo, a->lo, len);
    }
    if (dsec__addr_cmp(b->hi, a->hi, len) > 0) {
        out[n] = *b;
        memcpy(out[n].lo, a->hi, len);
        dsec__addr_step(out[n].lo, len, 1);
        n++;
        memcpy(mid.hi, a->hi, len);
    }
    if (b->plo < a->plo) {
        out[n] = mid;
        out[n].phi = (uint16_t)(a->plo - 1);
        n++;
    }
    if (b->phi > a->phi) {
        out[n] = mid;
        out[n].plo = (uint16_t)(a->phi + 1);
        n++;
    }
    return n;
}

void dsec__boxv_push(struct dsec__boxv *bv, const struct dsec__box *b)
{
    if (bv->oom)
        return;
    if (bv->n == bv->cap) {
        size_t cap = bv->cap ? bv->cap * 2 : 16;
        struct dsec__box *v = dsec_realloc(bv->v, cap * sizeof *v);
        if (v == NULL) {
            bv->oom = true;
            return;
        }
        bv->v = v;
        bv->cap = cap;
    }
    bv->v[bv->n++] = *b;
}

void dsec__opv_push(struct dsec__opv *ov, bool del, const struct dsec__box *b)
{
    if (ov->oom)
        return;
    if (ov->n == ov->cap) {
        size_t cap = ov->cap ? ov->cap * 2 : 16;
        struct dsec__op *v = dsec_realloc(ov->v, cap * sizeof *v);
        if (v == NULL) {
            ov->oom = true;
            return;
        }
        ov->v = v;
        ov->cap = cap;
    }
    ov->v[ov->n].del = del;
    ov->v[ov->n].b = *b;
    ov->n++;
}

/* Insert nb into the disjoint set s (in place), recording kernel operations in ops. */
void dsec__box_insert(struct dsec__boxv *s, const struct dsec__box *nb, struct dsec__opv *ops,
                      uint64_t now)
{
    struct dsec__boxv pieces = {0};
    dsec__boxv_push(&pieces, nb);
    for (size_t i = 0; i < s->n && !pieces.oom;) {
        struct dsec__box *a = &s->v[i];
        if (!dsec__box_overlap(a, nb)) {
            i++;
            continue;
        }
        if (dsec__box_strong(a, nb)) {
            /* cut the new pieces around a */
            struct dsec__boxv next = {0};
            for (size_t k = 0; k < pieces.n; k++) {
                if (!dsec__box_overlap(&pieces.v[k], a)) {
                    dsec__boxv_push(&next, &pieces.v[k]);
                    continue;
                }
                struct dsec__box out[4];
                size_t m = dsec__box_sub(&pieces.v[k], a, out);
                for (size_t j = 0; j < m; j++)
                    dsec__boxv_push(&next, &out[j]);
            }
            dsec_free(pieces.v);
            pieces = next;
            i++;
        } else {
            /* a weaker box: replace it by its parts outside nb */
            struct dsec__box old = *a;
            dsec__opv_push(ops, true, &old);
            s->v[i] = s->v[--s->n];
            if (old.exp_ms > now + 1) {
                struct dsec__box out[4];
                size_t m = dsec__box_sub(&old, nb, out);
                for (size_t j = 0; j < m; j++) {
                    dsec__opv_push(ops, false, &out[j]);
                    dsec__boxv_push(s, &out[j]);
                }
            }
            /* s->v may have moved; i now holds an unvisited box (or a remainder, which does
             * not overlap nb) */
        }
    }
    for (size_t k = 0; k < pieces.n; k++) {
        dsec__opv_push(ops, false, &pieces.v[k]);
        dsec__boxv_push(s, &pieces.v[k]);
    }
    if (pieces.oom)
        s->oom = true;
    dsec_free(pieces.v);
}
