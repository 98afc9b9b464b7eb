/* net-dns-wire.c - the resolver's wire: socket addresses, names as text, replies built. */
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

socklen_t dsec__dns_sa_len(const struct sockaddr *sa)
{
    return sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

void dsec__dns_sa_str(const struct sockaddr_storage *ss, char *buf, size_t n)
{
    char a[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &s->sin_addr, a, sizeof a);
        port = ntohs(s->sin_port);
        snprintf(buf, n, "%s:%u", a, port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &s->sin6_addr, a, sizeof a);
        port = ntohs(s->sin6_port);
        snprintf(buf, n, "[%s]:%u", a, port);
    } else {
        snprintf(buf, n, "(family %d)", ss->ss_family);
    }
}

/* Address and port equal (for matching upstream replies to the server asked). */
bool dsec__dns_sa_same(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return false;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
    return x->sin6_port == y->sin6_port &&
           memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0;
}

/* ---- names -------------------------------------------------------------------------------- */

/* The name in r as lower-case text without the trailing dot; -1 when it
 * holds anything but letters, digits, '-' and '_' (see the top comment). */
int dsec__dns_name_text(const ldns_rdf *r, char out[NAME_TXT])
{
    if (r == NULL || ldns_rdf_get_type(r) != LDNS_RDF_TYPE_DNAME)
        return -1;
    const uint8_t *p = ldns_rdf_data(r);
    size_t n = ldns_rdf_size(r), i = 0, o = 0;
    while (i < n) {
        size_t l = p[i++];
        if (l == 0)
            break;
        if (l > 63 || i + l > n || o + l + 2 > NAME_TXT)
            return -1;
        if (o > 0)
            out[o++] = '.';
        for (size_t k = 0; k < l; k++) {
            char c = (char)p[i + k];
            if (c >= 'A' && c <= 'Z')
                c = (char)(c - 'A' + 'a');
            if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
                return -1;
            out[o++] = c;
        }
        i += l;
    }
    out[o] = '\0';
    return 0;
}

/* ---- replies ------------------------------------------------------------------------------ */

/* A reply of only a header: for queries whose question cannot be read. */
size_t dsec__dns_header_reply(const uint8_t *pkt, uint8_t rcode, uint8_t *out)
{
    memset(out, 0, 12);
    out[0] = pkt[0];
    out[1] = pkt[1];
    out[2] = (uint8_t)(0x80u | (pkt[2] & 0x79u)); /* QR, the client's opcode and RD */
    out[3] = (uint8_t)(0x80u | (rcode & 0x0fu));  /* RA */
    return 12;
}

static int pkt_wire(const ldns_pkt *r, uint8_t *out, size_t cap, size_t *len)
{
    uint8_t *w = NULL;
    size_t n = 0;
    if (ldns_pkt2wire(&w, r, &n) != LDNS_STATUS_OK || w == NULL || n > cap) {
        LDNS_FREE(w);
        return -1;
    }
    memcpy(out, w, n);
    LDNS_FREE(w);
    *len = n;
    return 0;
}

/* Build the reply to q with rcode and copies of ans (may be NULL) into out
 * (cap bytes, at least OUT_MAX). When it would exceed q's limit the answers
 * are left out and TC set, so the client retries over TCP. *truncated tells
 * which. */
size_t dsec__dns_build_reply(const query *q, uint8_t rcode, const ldns_rr_list *ans, uint8_t *out,
                             size_t cap, bool *truncated)
{
    *truncated = false;
    ldns_pkt *r = ldns_pkt_new();
    if (r == NULL)
        return 0;
    ldns_pkt_set_id(r, ldns_pkt_id(q->q));
    ldns_pkt_set_qr(r, true);
    ldns_pkt_set_opcode(r, LDNS_PACKET_QUERY);
    ldns_pkt_set_rd(r, ldns_pkt_rd(q->q));
    ldns_pkt_set_cd(r, ldns_pkt_cd(q->q));
    ldns_pkt_set_ra(r, true);
    ldns_pkt_set_rcode(r, rcode);
    ldns_rr *qrr = ldns_rr_list_rr(ldns_pkt_question(q->q), 0);
    if (qrr != NULL)
        ldns_pkt_push_rr(r, LDNS_SECTION_QUESTION, ldns_rr_clone(qrr));
    if (q->edns)
        ldns_pkt_set_edns_udp_size(r, EDNS_SIZE);
    size_t len = 0;
    size_t nans = ans != NULL ? ldns_rr_list_rr_count(ans) : 0;
    if (nans > 0) {
        ldns_pkt *full = ldns_pkt_clone(r);
        if (full != NULL) {
            for (size_t i = 0; i < nans; i++)
                ldns_pkt_push_rr(full, LDNS_SECTION_ANSWER, ldns_rr_clone(ldns_rr_list_rr(ans, i)));
            int rc = pkt_wire(full, out, cap, &len);
            ldns_pkt_free(full);
            if (rc == 0 && len <= q->max_len) {
                ldns_pkt_free(r);
                return len;
            }
        }
        *truncated = true;
        ldns_pkt_set_tc(r, true);
    }
    if (pkt_wire(r, out, OUT_MAX, &len) < 0)
        len = 0;
    ldns_pkt_free(r);
    return len;
}
