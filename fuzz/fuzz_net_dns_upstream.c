/* fuzz_net_dns_upstream.c - fuzz the resolver's upstream answers: nothing pinned unallowed. */
#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <ldns/ldns.h>

#include "backends/net/net-int.h"
#include "dsec/alloc.h"
#include "dsec/err.h"

/*
 * Input: up to MAX_EXCH exchanges with one resolver, each: a flag byte
 * (bit 0: the client asks over TCP; bit 1: the reply is the upstream's over
 * TCP, after a truncated one; bit 2: client B instead of A), the query's
 * length (2 bytes, big-endian), the query, the reply's length (2 bytes),
 * the upstream's reply. The upstream query carries the client's id, so a
 * reply that copies the query's id and question matches. A holds names
 * under allowed.test and cdn.example, B only those under allowed.test; the
 * cache holds two answers, so exchanges evict each other and B is asked
 * what A's answers left there.
 *
 * Checked, beyond ASan/UBSan/LSan: every query with a header gets a
 * well-formed reply with its id, question and size limit; answers only
 * with NOERROR/NXDOMAIN, only IN A/AAAA of the type asked and CNAMEs, every
 * owner and CNAME target a name the asking client's policy allows, TTLs
 * within 5..300 s; every address in it pinned (for an allowed name, with
 * its TTL) and nothing else pinned; an answer the cache kept is what the
 * same query gets right after, from the cache alone; the cache stays
 * within its bound.
 */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define TTL_LO 5u
#define TTL_HI 300u
#define MAX_PINS 8192
#define MAX_EXCH 4
#define CACHE_ENTRIES 2

/* The policy: names under allowed.test (and itself) for both clients,
 * cdn.example (a second zone, for chains that cross zones) for A only. */
static bool allows(bool client_b, const char *name)
{
    size_t n = strlen(name), z = sizeof "allowed.test" - 1;
    if (strcmp(name, "allowed.test") == 0 || (!client_b && strcmp(name, "cdn.example") == 0))
        return true;
    return n > z && name[n - z - 1] == '.' && strcmp(name + n - z, "allowed.test") == 0;
}

static bool is_b(const struct sockaddr *cl)
{
    const struct sockaddr_in *a = (const struct sockaddr_in *)cl;
    return (ntohl(a->sin_addr.s_addr) & 0xffu) == 3;
}

typedef struct pin {
    int family;
    uint8_t addr[16];
    uint32_t ttl;
} pin;

static struct {
    pin pins[MAX_PINS];
    size_t npins;
    int qtype; /* of the query under test: the pins' family follows it */
} st;

static _Noreturn void die(const char *what)
{
    fprintf(stderr, "fuzz_net_dns_upstream: %s\n", what);
    abort();
}

static bool on_allowed(void *ud, const struct sockaddr *cl, const char *name)
{
    (void)ud;
    return allows(is_b(cl), name);
}

static void on_pin(void *ud, const struct sockaddr *cl, const char *qname, int family,
                   const uint8_t *addr, uint32_t ttl)
{
    (void)ud;
    if (!allows(is_b(cl), qname))
        die("an address pinned for a name the policy does not allow");
    if (ttl < TTL_LO || ttl > TTL_HI)
        die("a pin's TTL outside 5..300 s");
    if (family != (st.qtype == LDNS_RR_TYPE_A ? AF_INET : AF_INET6))
        die("a pin of the other family than the query's type");
    if (st.npins == MAX_PINS)
        die("more pins than a 64 KiB reply holds");
    pin *p = &st.pins[st.npins++];
    p->family = family;
    memset(p->addr, 0, sizeof p->addr);
    memcpy(p->addr, addr, family == AF_INET ? 4 : 16);
    p->ttl = ttl;
}

static void on_refused(void *ud, const struct sockaddr *cl, const char *qname, uint16_t qtype,
                       const char *why)
{
    (void)ud;
    (void)cl;
    (void)qname;
    (void)qtype;
    (void)why;
}

/* The name in r as lower-case text without the trailing dot (ldns escapes
 * anything odd, which then fails the policy, as it should). */
static void name_of(const ldns_rdf *r, char *out, size_t cap)
{
    char *s = r != NULL ? ldns_rdf2str(r) : NULL;
    snprintf(out, cap, "%s", s != NULL ? s : "");
    free(s);
    size_t n = strlen(out);
    if (n > 1 && out[n - 1] == '.')
        out[n - 1] = '\0';
    for (char *c = out; *c; c++)
        *c = (char)tolower((unsigned char)*c);
}

/* What a reply said, for comparing the cached answer with the fresh one. */
typedef struct seen {
    unsigned rcode;
    size_t nans;
    size_t npins;
} seen;

/* Check one reply to query q (parsed; NULL when ldns cannot read it). */
static void check_reply(const uint8_t *qw, size_t qlen, const ldns_pkt *q, bool client_tcp,
                        bool client_b, const uint8_t *rw, size_t rlen, seen *out)
{
    if (rlen < 12 || (rw[2] & 0x80) == 0)
        die("a reply without a header or without QR");
    if (rw[0] != qw[0] || rw[1] != qw[1])
        die("a reply that does not carry the query's id");
    if (rw[8] != 0 || rw[9] != 0 || rw[10] != 0 || rw[11] > 1)
        die("a reply with authority records or additional ones beyond OPT");
    size_t limit = 512;
    if (client_tcp)
        limit = 65535;
    else if (q != NULL && ldns_pkt_edns(q))
        limit = ldns_pkt_edns_udp_size(q) < 512    ? 512
                : ldns_pkt_edns_udp_size(q) > 1232 ? 1232
                                                   : ldns_pkt_edns_udp_size(q);
    if (rlen > limit)
        die("a reply larger than the client takes");
    ldns_pkt *r = NULL;
    if (ldns_wire2pkt(&r, rw, rlen) != LDNS_STATUS_OK || r == NULL)
        die("a reply ldns cannot parse");
    unsigned rcode = ldns_pkt_get_rcode(r);
    if (rcode != LDNS_RCODE_NOERROR && rcode != LDNS_RCODE_NXDOMAIN &&
        rcode != LDNS_RCODE_REFUSED && rcode != LDNS_RCODE_SERVFAIL && rcode != LDNS_RCODE_FORMERR)
        die("a reply with an rcode the resolver never gives");
    const ldns_rr_list *ans = ldns_pkt_answer(r);
    size_t nans = ldns_rr_list_rr_count(ans);
    if (nans > 0 && rcode != LDNS_RCODE_NOERROR && rcode != LDNS_RCODE_NXDOMAIN)
        die("answers in a reply that is no NOERROR/NXDOMAIN");
    if (nans > 0 && ldns_pkt_tc(r))
        die("answers in a truncated reply");
    if (st.npins > 0 && (nans == 0 || ldns_pkt_tc(r)))
        die("pins for a reply without answers (refused, failed or truncated)");

    /* the question: the client's, whenever it could be read */
    const ldns_rr *qq = q != NULL ? ldns_rr_list_rr(ldns_pkt_question(q), 0) : NULL;
    const ldns_rr *rq = ldns_rr_list_rr(ldns_pkt_question(r), 0);
    char qname[1024] = "", n[1024];
    if (qq != NULL) {
        name_of(ldns_rr_owner(qq), qname, sizeof qname);
        if (nans > 0 &&
            (rq == NULL || ldns_rdf_compare(ldns_rr_owner(qq), ldns_rr_owner(rq)) != 0 ||
             ldns_rr_get_type(qq) != ldns_rr_get_type(rq)))
            die("answers under another question than the client's");
    }
    if (nans > 0 && !allows(client_b, qname))
        die("answers for a name the policy does not allow");

    size_t naddr = 0;
    for (size_t i = 0; i < nans; i++) {
        const ldns_rr *rr = ldns_rr_list_rr(ans, i);
        ldns_rr_type t = ldns_rr_get_type(rr);
        if (ldns_rr_get_class(rr) != LDNS_RR_CLASS_IN)
            die("an answer of a class other than IN");
        if (t != LDNS_RR_TYPE_CNAME && (qq == NULL || t != ldns_rr_get_type(qq)))
            die("an answer record neither CNAME nor of the type asked");
        if (ldns_rr_ttl(rr) < TTL_LO || ldns_rr_ttl(rr) > TTL_HI)
            die("an answer TTL outside 5..300 s");
        name_of(ldns_rr_owner(rr), n, sizeof n);
        if (!allows(client_b, n))
            die("an answer record owned by a name the policy does not allow");
        if (t == LDNS_RR_TYPE_CNAME) {
            name_of(ldns_rr_rdf(rr, 0), n, sizeof n);
            if (!allows(client_b, n))
                die("a CNAME to a name the policy does not allow");
            continue;
        }
        const ldns_rdf *a = ldns_rr_rdf(rr, 0);
        size_t al = t == LDNS_RR_TYPE_A ? 4 : 16;
        if (a == NULL || ldns_rdf_size(a) != al)
            die("an address record with an address of the wrong size");
        /* pinned, with the TTL the client sees */
        bool found = false;
        for (size_t k = 0; k < st.npins && !found; k++)
            found = memcmp(st.pins[k].addr, ldns_rdf_data(a), al) == 0 &&
                    st.pins[k].ttl == ldns_rr_ttl(rr);
        if (!found)
            die("an address in the reply that was not pinned (with its TTL)");
        naddr++;
    }
    if (st.npins != naddr)
        die("pins for addresses the reply does not hold");
    out->rcode = rcode;
    out->nans = nans;
    out->npins = st.npins;
    ldns_pkt_free(r);
}

/* One exchange: query qw from client (B when client_b), up as the upstream's
 * reply; then, when its answer was kept, the same query again. */
static void exchange(dsec__dns *d, unsigned flags, const uint8_t *qw, size_t qlen,
                     const uint8_t *up, size_t uplen)
{
    bool client_tcp = (flags & DSEC__DNS_OFFLINE_CLIENT_TCP) != 0, client_b = (flags & 4u) != 0;
    flags &= DSEC__DNS_OFFLINE_CLIENT_TCP | DSEC__DNS_OFFLINE_UPSTREAM_TCP;
    ldns_pkt *q = NULL;
    if (ldns_wire2pkt(&q, qw, qlen) != LDNS_STATUS_OK)
        q = NULL;
    const ldns_rr *qrr = q != NULL ? ldns_rr_list_rr(ldns_pkt_question(q), 0) : NULL;
    st.qtype = qrr != NULL ? (int)ldns_rr_get_type(qrr) : -1;

    struct sockaddr_in cl = {.sin_family = AF_INET, .sin_port = htons(5353)};
    inet_pton(AF_INET, client_b ? "10.0.0.3" : "10.0.0.2", &cl.sin_addr);
    static uint8_t out[65536];
    size_t olen = 0;
    seen first = {0}, again = {0};
    dsec__dns_stats s0, s1, s2;
    dsec__dns_stats_get(d, &s0);
    st.npins = 0;
    if (dsec__dns_upstream_offline(d, (const struct sockaddr *)&cl, qw, qlen, up, uplen, flags, out,
                                   sizeof out, &olen) < 0)
        die("the offline upstream path failed");
    dsec__dns_stats_get(d, &s1);
    if (s1.cache_entries > CACHE_ENTRIES)
        die("the cache holds more entries than its bound");
    bool has_query = qlen >= 12 && (qw[2] & 0x80) == 0;
    if (olen == 0) {
        if (has_query)
            die("a query with a header got no reply");
        if (st.npins != 0)
            die("pins without a reply");
        goto out;
    }
    if (!has_query)
        die("a reply to a packet without a header or to a response");
    check_reply(qw, qlen, q, client_tcp, client_b, out, olen, &first);

    /* kept (one entry more, or one in for one evicted): the same query
     * again is answered from the cache alone (no reply passed along), with
     * the same outcome */
    if (s1.cache_entries + s1.cache_evictions != s0.cache_entries + s0.cache_evictions + 1)
        goto out;
    if (s1.cache_misses != s0.cache_misses + 1)
        die("an answer kept without a cache miss");
    st.npins = 0;
    if (dsec__dns_upstream_offline(d, (const struct sockaddr *)&cl, qw, qlen, NULL, 0, flags, out,
                                   sizeof out, &olen) < 0 ||
        olen == 0)
        die("the same query again got no reply");
    dsec__dns_stats_get(d, &s2);
    if (s2.cache_hits != s1.cache_hits + 1 || s2.upstream_sent != s1.upstream_sent)
        die("a kept answer was not what answered the same query again");
    check_reply(qw, qlen, q, client_tcp, client_b, out, olen, &again);
    if (again.rcode != first.rcode || again.nans != first.nans || again.npins != first.npins)
        die("the cached answer differs from the fresh one");
out:
    if (q != NULL)
        ldns_pkt_free(q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a fresh resolver per input, so an input means the same every time */
    dsec__dns_conf c = {
        .allowed = on_allowed,
        .pin = on_pin,
        .refused = on_refused,
        .cache_entries = CACHE_ENTRIES,
        .cache_bytes = 32u << 10, /* no answer over 4 KiB is kept */
    };
    dsec__dns *d = NULL;
    dsec_err err;
    if (dsec__dns_new(&d, &c, &err) < 0) {
        fprintf(stderr, "fuzz_net_dns_upstream: %s\n", err.msg);
        abort();
    }
    size_t off = 0;
    for (int i = 0; i < MAX_EXCH && size - off >= 5; i++) {
        unsigned flags = data[off];
        size_t qlen = (size_t)data[off + 1] << 8 | data[off + 2];
        off += 3;
        if (qlen + 2 > size - off)
            break;
        const uint8_t *qw = data + off;
        off += qlen;
        size_t uplen = (size_t)data[off] << 8 | data[off + 1];
        off += 2;
        if (uplen > size - off)
            uplen = size - off; /* the last reply may be cut short */
        exchange(d, flags, qw, qlen, data + off, uplen);
        off += uplen;
    }
    dsec__dns_free(d);
    return 0;
}
