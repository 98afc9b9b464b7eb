/* net-dns-policy.c - what the resolver lets a client ask: a query's checks against the
 * policy, the CNAME-chain filter of answers, and each client's rate. */
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

/* ---- the query path (shared by the resolver thread and the offline entry) ---------------- */

void dsec__dns_refuse_cb(dsec__dns *d, const struct sockaddr *cl, const char *qname, uint16_t qtype,
                         const char *why)
{
    if (d->c.refused != NULL)
        d->c.refused(d->c.ud, cl, qname, qtype, why);
}

/* Parse pkt and apply the policy. ACT_REPLY: the reply is in out/outlen.
 * ACT_FORWARD: qq holds the query (the caller owns qq->q). ACT_DROP: nothing. */
int dsec__dns_decide(dsec__dns *d, const struct sockaddr *cl, const uint8_t *pkt, size_t len,
                     bool tcp, query *qq, uint8_t *out, size_t *outlen)
{
    memset(qq, 0, sizeof *qq);
    if (len < 12 || (pkt[2] & 0x80u) != 0) {
        /* no header to answer, or a response: answering responses is how
         * reflection loops start */
        STAT_ADD(d, dropped);
        return ACT_DROP;
    }
    unsigned opcode = (pkt[2] >> 3) & 0x0fu;
    unsigned qdcount = (unsigned)pkt[4] << 8 | pkt[5];
    if (opcode != LDNS_PACKET_QUERY) {
        *outlen = dsec__dns_header_reply(pkt, LDNS_RCODE_REFUSED, out);
        STAT_ADD(d, refused);
        dsec__dns_refuse_cb(d, cl, "", 0, "malformed");
        return ACT_REPLY;
    }
    ldns_pkt *q = NULL;
    if (qdcount != 1 || ldns_wire2pkt(&q, pkt, len) != LDNS_STATUS_OK || q == NULL ||
        ldns_pkt_qdcount(q) != 1 || ldns_rr_list_rr(ldns_pkt_question(q), 0) == NULL) {
        if (q != NULL)
            ldns_pkt_free(q);
        *outlen = dsec__dns_header_reply(pkt, LDNS_RCODE_FORMERR, out);
        STAT_ADD(d, refused);
        dsec__dns_refuse_cb(d, cl, "", 0, "malformed");
        return ACT_REPLY;
    }
    qq->q = q;
    qq->edns = ldns_pkt_edns(q);
    if (tcp)
        qq->max_len = 65535;
    else if (qq->edns)
        qq->max_len =
            (uint16_t)(ldns_pkt_edns_udp_size(q) < 512         ? 512
                       : ldns_pkt_edns_udp_size(q) > EDNS_SIZE ? EDNS_SIZE
                                                               : ldns_pkt_edns_udp_size(q));
    else
        qq->max_len = 512;
    const ldns_rr *qrr = ldns_rr_list_rr(ldns_pkt_question(q), 0);
    qq->qtype = (uint16_t)ldns_rr_get_type(qrr);
    const char *why = NULL;
    if (dsec__dns_name_text(ldns_rr_owner(qrr), qq->qname) < 0) {
        qq->qname[0] = '\0';
        why = "malformed";
    } else if (ldns_rr_get_class(qrr) != LDNS_RR_CLASS_IN ||
               (qq->qtype != LDNS_RR_TYPE_A && qq->qtype != LDNS_RR_TYPE_AAAA)) {
        why = "type";
    } else if (!d->c.allowed(d->c.ud, cl, qq->qname)) {
        why = "denied";
    }
    if (why == NULL)
        return ACT_FORWARD;
    bool tc;
    *outlen = dsec__dns_build_reply(qq, LDNS_RCODE_REFUSED, NULL, out, OUT_MAX, &tc);
    if (*outlen == 0)
        *outlen = dsec__dns_header_reply(pkt, LDNS_RCODE_REFUSED, out);
    STAT_ADD(d, refused);
    dsec__dns_refuse_cb(d, cl, qq->qname, qq->qtype, why);
    ldns_pkt_free(q);
    qq->q = NULL;
    return ACT_REPLY;
}

uint32_t dsec__dns_ttl_clamp(uint32_t t)
{
    return t < TTL_MIN ? TTL_MIN : t > TTL_MAX ? TTL_MAX : t;
}

/* Keep from an upstream answer section only the chain that starts at the
 * query's name: CNAMEs whose owner is the current end of the chain (each
 * target must be allowed too), then the A/AAAA of the final name. Copies
 * go into *out (the caller frees it with ldns_rr_list_deep_free). Returns
 * -1 when the chain leaves the allowed names. */
int dsec__dns_chain_filter(dsec__dns *d, const struct sockaddr *cl, const query *q,
                           const ldns_rr_list *ans, ldns_rr_list *out)
{
    char cur[NAME_TXT], owner[NAME_TXT], seen[CNAME_HOPS][NAME_TXT];
    size_t nseen = 0, n = ans != NULL ? ldns_rr_list_rr_count(ans) : 0;
    snprintf(cur, sizeof cur, "%s", q->qname);
    for (int hop = 0; hop <= CNAME_HOPS; hop++) {
        const ldns_rr *cn = NULL;
        for (size_t i = 0; i < n && cn == NULL; i++) {
            const ldns_rr *rr = ldns_rr_list_rr(ans, i);
            if (ldns_rr_get_type(rr) == LDNS_RR_TYPE_CNAME &&
                ldns_rr_get_class(rr) == LDNS_RR_CLASS_IN &&
                dsec__dns_name_text(ldns_rr_owner(rr), owner) == 0 && strcmp(owner, cur) == 0)
                cn = rr;
        }
        if (cn == NULL)
            break;
        if (hop == CNAME_HOPS)
            return -1; /* longer than we follow: treat as leaving */
        char target[NAME_TXT];
        if (dsec__dns_name_text(ldns_rr_rdf(cn, 0), target) < 0 ||
            !d->c.allowed(d->c.ud, cl, target))
            return -1;
        snprintf(seen[nseen++], NAME_TXT, "%s", cur);
        bool loop = false;
        for (size_t s = 0; s < nseen; s++)
            loop |= strcmp(seen[s], target) == 0;
        if (loop)
            break; /* the upstream's problem, not a way out: answer the chain without addresses */
        ldns_rr *c = ldns_rr_clone(cn);
        if (c == NULL)
            return -1;
        ldns_rr_set_ttl(c, dsec__dns_ttl_clamp(ldns_rr_ttl(c)));
        ldns_rr_list_push_rr(out, c);
        snprintf(cur, sizeof cur, "%s", target);
    }
    for (size_t i = 0; i < n; i++) {
        const ldns_rr *rr = ldns_rr_list_rr(ans, i);
        if ((uint16_t)ldns_rr_get_type(rr) != q->qtype || ldns_rr_get_class(rr) != LDNS_RR_CLASS_IN)
            continue;
        const ldns_rdf *a = ldns_rr_rdf(rr, 0);
        size_t want = q->qtype == LDNS_RR_TYPE_A ? 4 : 16;
        if (a == NULL || ldns_rdf_size(a) != want ||
            dsec__dns_name_text(ldns_rr_owner(rr), owner) < 0 || strcmp(owner, cur) != 0)
            continue;
        ldns_rr *c = ldns_rr_clone(rr);
        if (c == NULL)
            continue;
        ldns_rr_set_ttl(c, dsec__dns_ttl_clamp(ldns_rr_ttl(c)));
        ldns_rr_list_push_rr(out, c);
    }
    return 0;
}

/* ---- clients ------------------------------------------------------------------------------ */

static size_t client_key(const struct sockaddr *sa, uint8_t key[16], int *family)
{
    memset(key, 0, 16);
    *family = sa->sa_family;
    if (sa->sa_family == AF_INET) {
        memcpy(key, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        return 4;
    }
    memcpy(key, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    return 16;
}

client *dsec__dns_client_get(dsec__dns *d, const struct sockaddr *sa, uint64_t now)
{
    uint8_t key[16];
    int fam;
    client_key(sa, key, &fam);
    uint32_t h = 2166136261u; /* FNV-1a */
    for (int i = 0; i < 16; i++)
        h = (h ^ key[i]) * 16777619u;
    h ^= (uint32_t)fam;
    client **b = &d->ctab[h % CLIENT_BUCKETS];
    for (client *c = *b; c != NULL; c = c->next)
        if (c->family == fam && memcmp(c->addr, key, 16) == 0)
            return c;
    if (d->nclients >= MAX_CLIENTS)
        return NULL;
    client *c = dsec_calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->family = fam;
    memcpy(c->addr, key, 16);
    memcpy(&c->sa, sa, dsec__dns_sa_len(sa));
    if (fam == AF_INET)
        ((struct sockaddr_in *)&c->sa)->sin_port = 0;
    else
        ((struct sockaddr_in6 *)&c->sa)->sin6_port = 0;
    c->tokens = d->c.client_burst;
    c->refill_us = now;
    c->next = *b;
    *b = c;
    d->nclients++;
    return c;
}

/* One token from the client's bucket; false when it is empty (then the
 * packet is dropped, and "flood" reported at most once a second). */
bool dsec__dns_client_take(dsec__dns *d, client *c, uint64_t now)
{
    c->seen_ms = now / 1000u;
    c->tokens += (double)(now - c->refill_us) * d->c.client_qps / 1e6;
    c->refill_us = now;
    if (c->tokens > d->c.client_burst)
        c->tokens = d->c.client_burst;
    if (c->tokens >= 1.0) {
        c->tokens -= 1.0;
        return true;
    }
    STAT_ADD(d, dropped);
    if (!c->flood_reported || c->seen_ms - c->flood_ms >= 1000u) {
        c->flood_reported = true;
        c->flood_ms = c->seen_ms;
        dsec__dns_refuse_cb(d, (const struct sockaddr *)&c->sa, "", 0, "flood");
    }
    return false;
}

void dsec__dns_clients_sweep(dsec__dns *d, uint64_t nowms)
{
    for (size_t i = 0; i < CLIENT_BUCKETS; i++) {
        client **pp = &d->ctab[i];
        while (*pp != NULL) {
            client *c = *pp;
            if (c->inflight == 0 && c->nconn == 0 && nowms - c->seen_ms > CLIENT_IDLE_MS) {
                *pp = c->next;
                dsec_free(c);
                d->nclients--;
            } else {
                pp = &c->next;
            }
        }
    }
}

void dsec__dns_clients_free(dsec__dns *d)
{
    for (size_t i = 0; i < CLIENT_BUCKETS; i++)
        while (d->ctab[i] != NULL) {
            client *c = d->ctab[i];
            d->ctab[i] = c->next;
            dsec_free(c);
        }
}
