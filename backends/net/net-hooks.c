/* net-hooks.c - the resolver's and the NFLOG reader's callbacks: names allowed, addresses pinned,
 * refusals and blocked packets turned into alerts. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/net/net-int.h"
#include "backends/net/net-node-int.h"
#include "backends/net/net.h"
#include "dsec/alloc.h"
#include "dsec/log.h"

/* ---- resolver and log callbacks ----------------------------------------------------------- */

bool dsec__net_dns_allowed(void *ud, const struct sockaddr *client, const char *name)
{
    dsec_net *n = ud;
    bool ok = false;
    pthread_mutex_lock(&n->lock);
    dsec_net_sbx *s = dsec__net_sbx_by_addr(n, client);
    for (size_t i = 0; s && i < s->pol.n && !ok; i++)
        ok = dsec__net_name_matches(&s->pol.r[i], name);
    pthread_mutex_unlock(&n->lock);
    return ok;
}

void dsec__net_dns_pin(void *ud, const struct sockaddr *client, const char *qname, int family,
                       const uint8_t *addr, uint32_t ttl)
{
    dsec_net *n = ud;
    if (family == AF_INET6 && !n->v6)
        return;
    pthread_mutex_lock(&n->lock);
    dsec_net_sbx *s = dsec__net_sbx_by_addr(n, client);
    if (!s)
        goto out;
    uint64_t now = dsec__net_mono_ns();
    /* remember it (for policy changes), replacing an expired or equal pin */
    struct pin *slot = NULL;
    for (size_t i = 0; i < s->npins && !slot; i++)
        if (s->pins[i].expires_ns <= now ||
            (s->pins[i].family == family &&
             memcmp(s->pins[i].addr, addr, family == AF_INET ? 4 : 16) == 0 &&
             strcmp(s->pins[i].name, qname) == 0))
            slot = &s->pins[i];
    if (!slot && s->npins < NET_PINS_MAX) {
        struct pin *np = dsec_realloc(s->pins, (s->npins + 1) * sizeof *np);
        if (np) {
            s->pins = np;
            slot = &s->pins[s->npins++];
        }
    }
    if (slot) {
        snprintf(slot->name, sizeof slot->name, "%s", qname);
        slot->family = family;
        memset(slot->addr, 0, sizeof slot->addr);
        memcpy(slot->addr, addr, family == AF_INET ? 4 : 16);
        slot->expires_ns = now + (uint64_t)ttl * 1000000000u;
    }
    dsec__nft_elem e[3 * NET_ENTRIES_MAX];
    size_t k = 0;
    for (size_t i = 0; i < s->pol.n && k + 3 <= sizeof e / sizeof e[0]; i++)
        if (dsec__net_name_matches(&s->pol.r[i], qname))
            k += dsec__net_rule_elems(&s->pol.r[i], family, addr, family == AF_INET ? 32 : 128,
                                      ttl * 1000u, e + k);
    dsec_err err;
    if (k && dsec__nft_sbx_pin(n->nft, s->idx, e, k, &err) < 0)
        dsec_log_warn("dsec net: pinning an address for %s: %s", s->id, err.msg);
out:
    pthread_mutex_unlock(&n->lock);
}

static const char *qtype_name(uint16_t t, char *buf, size_t len)
{
    static const struct {
        uint16_t t;
        const char *n;
    } names[] = {{1, "A"},     {2, "NS"},     {5, "CNAME"},  {6, "SOA"},
                 {12, "PTR"},  {15, "MX"},    {16, "TXT"},   {28, "AAAA"},
                 {33, "SRV"},  {35, "NAPTR"}, {43, "DS"},    {48, "DNSKEY"},
                 {64, "SVCB"}, {65, "HTTPS"}, {252, "AXFR"}, {255, "ANY"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].t == t)
            return names[i].n;
    snprintf(buf, len, "TYPE%u", t);
    return buf;
}

void dsec__net_dns_refused(void *ud, const struct sockaddr *client, const char *qname,
                           uint16_t qtype, const char *why)
{
    dsec_net *n = ud;
    char kind[16], tb[16];
    snprintf(kind, sizeof kind, "dns_%s", why);
    pthread_mutex_lock(&n->lock);
    dsec_net_sbx *s = dsec__net_sbx_by_addr(n, client);
    if (s)
        dsec__net_alert_note(n, s, kind, qname, qtype_name(qtype, tb, sizeof tb));
    pthread_mutex_unlock(&n->lock);
}

void dsec__net_on_block(void *ud, const dsec__nft_block *b)
{
    dsec_net *n = ud;
    char dest[INET6_ADDRSTRLEN], detail[24];
    inet_ntop(b->family, b->dst, dest, sizeof dest);
    if (b->proto == IPPROTO_TCP)
        snprintf(detail, sizeof detail, "tcp/%u", b->dport);
    else if (b->proto == IPPROTO_UDP)
        snprintf(detail, sizeof detail, "udp/%u", b->dport);
    else if (b->proto == IPPROTO_ICMP || b->proto == IPPROTO_ICMPV6)
        snprintf(detail, sizeof detail, "icmp");
    else
        snprintf(detail, sizeof detail, "proto/%u", b->proto);
    pthread_mutex_lock(&n->alock);
    n->blocked++;
    pthread_mutex_unlock(&n->alock);
    pthread_mutex_lock(&n->lock);
    dsec_net_sbx *s = dsec__net_slot_get(n, b->idx);
    if (s)
        dsec__net_alert_note(n, s, "blocked", dest, detail);
    pthread_mutex_unlock(&n->lock);
}
