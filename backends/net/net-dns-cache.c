/* net-dns-cache.c - the resolver's node-wide cache of upstream answers, keyed by (name, type). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/filter.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <ldns/ldns.h>

#include "backends/net/net-dns-int.h"
#include "backends/net/net-int.h"
#include "dsec/alloc.h"
#include "dsec/err.h"

/* ---- the cache ---------------------------------------------------------------------------- */

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1, v1 = ROTL(v1, 13), v1 ^= v0, v0 = ROTL(v0, 32);                                  \
        v2 += v3, v3 = ROTL(v3, 16), v3 ^= v2;                                                     \
        v0 += v3, v3 = ROTL(v3, 21), v3 ^= v0;                                                     \
        v2 += v1, v1 = ROTL(v1, 17), v1 ^= v2, v2 = ROTL(v2, 32);                                  \
    } while (0)

/* SipHash-1-3 with the resolver's random key: sandboxes choose the names
 * (anything under an allowed wildcard), so an unkeyed hash would let one
 * pile them all into one chain. */
static uint64_t siphash13(const uint8_t k[16], const uint8_t *in, size_t n)
{
    uint64_t k0, k1;
    memcpy(&k0, k, 8);
    memcpy(&k1, k + 8, 8);
    uint64_t v0 = 0x736f6d6570736575ull ^ k0, v1 = 0x646f72616e646f6dull ^ k1;
    uint64_t v2 = 0x6c7967656e657261ull ^ k0, v3 = 0x7465646279746573ull ^ k1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t m;
        memcpy(&m, in + i, 8);
        v3 ^= m;
        SIPROUND;
        v0 ^= m;
    }
    uint64_t b = (uint64_t)n << 56;
    for (size_t j = 0; i + j < n; j++)
        b |= (uint64_t)in[i + j] << (8 * j);
    v3 ^= b;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

uint32_t dsec__dns_key_hash(const dsec__dns *d, const char *name, uint16_t qtype)
{
    uint8_t buf[NAME_TXT + 2];
    size_t n = strlen(name);
    memcpy(buf, name, n);
    buf[n] = (uint8_t)(qtype >> 8);
    buf[n + 1] = (uint8_t)qtype;
    return (uint32_t)siphash13(d->hkey, buf, n + 2);
}

static void lru_unlink(dsec__dns *d, centry *e)
{
    if (e->lprev != NULL)
        e->lprev->lnext = e->lnext;
    else
        d->lru_head = e->lnext;
    if (e->lnext != NULL)
        e->lnext->lprev = e->lprev;
    else
        d->lru_tail = e->lprev;
    e->lprev = e->lnext = NULL;
}

static void lru_push(dsec__dns *d, centry *e)
{
    e->lprev = NULL;
    e->lnext = d->lru_head;
    if (d->lru_head != NULL)
        d->lru_head->lprev = e;
    else
        d->lru_tail = e;
    d->lru_head = e;
}

static void centry_remove(dsec__dns *d, centry *e)
{
    centry **pp = &d->cache[e->key & (d->cbuckets - 1)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    lru_unlink(d, e);
    d->centries--;
    d->cbytes -= e->bytes;
    ldns_rr_list_deep_free(e->rrs);
    dsec_free(e);
    __atomic_store_n(&d->st.cache_entries, d->centries, __ATOMIC_RELAXED);
}

static centry *cache_find(dsec__dns *d, uint32_t key, const char *name, uint16_t qtype)
{
    for (centry *e = d->cache[key & (d->cbuckets - 1)]; e != NULL; e = e->hnext)
        if (e->key == key && e->qtype == qtype && strcmp(e->name, name) == 0)
            return e;
    return NULL;
}

/* A copy of the cached answer to q (the caller frees it with
 * ldns_rr_list_deep_free) with its TTLs counted down, and its rcode; NULL
 * when there is none or it has expired. */
ldns_rr_list *dsec__dns_cache_get(dsec__dns *d, uint32_t key, const query *q, uint64_t nowms,
                                  uint8_t *rcode)
{
    centry *e = cache_find(d, key, q->qname, q->qtype);
    if (e == NULL)
        return NULL;
    if (nowms >= e->expires_ms) {
        centry_remove(d, e);
        return NULL;
    }
    ldns_rr_list *out = ldns_rr_list_new();
    if (out == NULL)
        return NULL;
    uint32_t age = (uint32_t)((nowms - e->stored_ms) / 1000u);
    for (size_t i = 0; i < ldns_rr_list_rr_count(e->rrs); i++) {
        ldns_rr *c = ldns_rr_clone(ldns_rr_list_rr(e->rrs, i));
        if (c == NULL || !ldns_rr_list_push_rr(out, c)) {
            ldns_rr_free(c);
            ldns_rr_list_deep_free(out);
            return NULL;
        }
        uint32_t t = ldns_rr_ttl(c);
        ldns_rr_set_ttl(c, t > age ? t - age : 0);
    }
    lru_unlink(d, e);
    lru_push(d, e);
    *rcode = e->rcode;
    return out;
}

/* How long a NXDOMAIN or NODATA is kept: the SOA's minimum or its TTL,
 * whichever is less (RFC 2308), within [NEG_TTL_MIN, NEG_TTL_MAX]. */
static uint32_t neg_ttl(const ldns_pkt *r)
{
    const ldns_rr_list *auth = ldns_pkt_authority(r);
    for (size_t i = 0; auth != NULL && i < ldns_rr_list_rr_count(auth); i++) {
        const ldns_rr *rr = ldns_rr_list_rr(auth, i);
        if (ldns_rr_get_type(rr) != LDNS_RR_TYPE_SOA || ldns_rr_rd_count(rr) < 7)
            continue;
        const ldns_rdf *m = ldns_rr_rdf(rr, 6);
        if (m == NULL || ldns_rdf_size(m) != 4)
            continue;
        uint32_t t = ldns_rdf2native_int32(m);
        if (ldns_rr_ttl(rr) < t)
            t = ldns_rr_ttl(rr);
        return t < NEG_TTL_MIN ? NEG_TTL_MIN : t > NEG_TTL_MAX ? NEG_TTL_MAX : t;
    }
    return NEG_TTL_MIN;
}

/* Keep the upstream's answer r to q (NOERROR or NXDOMAIN): its IN A, AAAA
 * and CNAME records with clamped TTLs, until the first of them expires (a
 * negative answer: per neg_ttl). Least recently used entries go first when
 * over the bounds. */
void dsec__dns_cache_put(dsec__dns *d, uint32_t key, const query *q, const ldns_pkt *r,
                         uint64_t nowms)
{
    if (d->cache == NULL)
        return;
    size_t nl = strlen(q->qname);
    centry *e = dsec_calloc(1, sizeof *e + nl + 1);
    if (e == NULL)
        return;
    e->rrs = ldns_rr_list_new();
    if (e->rrs == NULL) {
        dsec_free(e);
        return;
    }
    e->bytes = sizeof *e + nl + 1;
    uint32_t ttl = UINT32_MAX;
    bool of_type = false; /* a record of the type asked: else the answer is NODATA */
    const ldns_rr_list *ans = ldns_pkt_answer(r);
    for (size_t i = 0; ans != NULL && i < ldns_rr_list_rr_count(ans); i++) {
        const ldns_rr *rr = ldns_rr_list_rr(ans, i);
        ldns_rr_type t = ldns_rr_get_type(rr);
        if (ldns_rr_get_class(rr) != LDNS_RR_CLASS_IN ||
            (t != LDNS_RR_TYPE_A && t != LDNS_RR_TYPE_AAAA && t != LDNS_RR_TYPE_CNAME))
            continue;
        of_type = of_type || (uint16_t)t == q->qtype;
        ldns_rr *c = ldns_rr_clone(rr);
        if (c == NULL || !ldns_rr_list_push_rr(e->rrs, c)) {
            ldns_rr_free(c);
            goto drop;
        }
        uint32_t ct = dsec__dns_ttl_clamp(ldns_rr_ttl(c));
        ldns_rr_set_ttl(c, ct);
        if (ct < ttl)
            ttl = ct;
        e->bytes += ldns_rr_uncompressed_size(c) + 64; /* and ldns's structures, roughly */
    }
    /* NXDOMAIN, and NODATA however many records of other types came with it (a CNAME
     * chain to no address, AAAA for A), are kept as negative answers */
    if (!of_type || ldns_pkt_get_rcode(r) == LDNS_RCODE_NXDOMAIN) {
        uint32_t nt = neg_ttl(r);
        if (nt < ttl)
            ttl = nt;
    }
    if (e->bytes > d->c.cache_bytes / 8)
        goto drop; /* no one answer takes much of the cache */
    e->key = key;
    e->qtype = q->qtype;
    e->rcode = (uint8_t)ldns_pkt_get_rcode(r);
    memcpy(e->name, q->qname, nl + 1);
    e->stored_ms = nowms;
    e->expires_ms = nowms + (uint64_t)ttl * 1000u;
    centry *old = cache_find(d, key, q->qname, q->qtype);
    if (old != NULL)
        centry_remove(d, old);
    centry **b = &d->cache[key & (d->cbuckets - 1)];
    e->hnext = *b;
    *b = e;
    lru_push(d, e);
    d->centries++;
    d->cbytes += e->bytes;
    while ((d->centries > d->c.cache_entries || d->cbytes > d->c.cache_bytes) && d->lru_tail != e) {
        centry_remove(d, d->lru_tail);
        STAT_ADD(d, cache_evictions);
    }
    __atomic_store_n(&d->st.cache_entries, d->centries, __ATOMIC_RELAXED);
    return;
drop:
    ldns_rr_list_deep_free(e->rrs);
    dsec_free(e);
}

/* Give back the memory of expired entries that nobody asks for any more
 * (those at the cold end; the others go when asked or evicted). */
void dsec__dns_cache_sweep(dsec__dns *d, uint64_t nowms)
{
    while (d->lru_tail != NULL && nowms >= d->lru_tail->expires_ms)
        centry_remove(d, d->lru_tail);
}

void dsec__dns_cache_clear(dsec__dns *d)
{
    while (d->lru_head != NULL)
        centry_remove(d, d->lru_head);
}
