/* net-dns-upstream.c - the resolver's queries in flight: sent upstream (UDP, then TCP when
 * truncated), coalesced, matched, answered, timed out. */
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

/* Random bits for upstream ids and socket choice, from the kernel's CSPRNG. */
static uint16_t rand16(dsec__dns *d)
{
    if (d->rnd_left < 2) {
        ssize_t n = getrandom(d->rnd, sizeof d->rnd, 0);
        if (n < (ssize_t)sizeof d->rnd) {
            /* getrandom does not fail short for 256 bytes once seeded; if it
             * ever does, the clock still beats a constant */
            uint64_t t = dsec__dns_now_us();
            for (size_t i = 0; i < sizeof d->rnd; i++)
                d->rnd[i] ^= (uint8_t)((t >> ((i % 8) * 8)) + i * 131u);
        }
        d->rnd_left = sizeof d->rnd;
    }
    d->rnd_left -= 2;
    return (uint16_t)(d->rnd[d->rnd_left] | d->rnd[d->rnd_left + 1] << 8);
}

/* ---- upstream ----------------------------------------------------------------------------- */

static void plist_del(dsec__dns *d, pend *p)
{
    if (p->prev != NULL)
        p->prev->next = p->next;
    else
        d->phead = p->next;
    if (p->next != NULL)
        p->next->prev = p->prev;
    else
        d->ptail = p->prev;
    p->prev = p->next = NULL;
}

static void plist_append(dsec__dns *d, pend *p)
{
    p->next = NULL;
    p->prev = d->ptail;
    if (d->ptail != NULL)
        d->ptail->next = p;
    else
        d->phead = p;
    d->ptail = p;
}

static void pend_unlink(dsec__dns *d, pend *p)
{
    plist_del(d, p);
    d->by_id[p->up_id] = NULL;
    pend **pp = &d->key_tab[p->key % KEY_BUCKETS];
    while (*pp != NULL && *pp != p)
        pp = &(*pp)->knext;
    if (*pp != NULL)
        *pp = p->knext;
    d->npend--;
    if (p->cl != NULL)
        p->cl->inflight--;
    if (p->tc != NULL)
        p->tc->npend--;
}

static void up_tcp_close(dsec__dns *d, pend *p)
{
    if (p->tev.fd < 0)
        return;
    epoll_ctl(d->epfd, EPOLL_CTL_DEL, p->tev.fd, NULL);
    close(p->tev.fd);
    p->tev.fd = -1;
    d->nuptcp--;
}

static void pend_free(dsec__dns *d, pend *p)
{
    up_tcp_close(d, p);
    if (p->qq.q != NULL)
        ldns_pkt_free(p->qq.q);
    dsec_free(p->tbuf);
    dsec_free(p);
}

/* A finished query: freed after this turn of the loop, since an event of
 * its TCP connection may still be queued. */
static void pend_retire(dsec__dns *d, pend *p)
{
    up_tcp_close(d, p);
    p->dead = true;
    p->next = d->pdead;
    d->pdead = p;
}

void dsec__dns_reply_now(dsec__dns *d, int lfd, conn *tc, const struct sockaddr *peer,
                         const uint8_t *out, size_t len)
{
    if (tc != NULL)
        dsec__dns_conn_send(d, tc, out, len);
    else
        sendto(lfd, out, len, MSG_DONTWAIT, peer, dsec__dns_sa_len(peer));
}

/* The reply to one client's query qq into out (cap bytes, at least OUT_MAX):
 * SERVFAIL, or the upstream's rcode with raw (its answer records, fresh or
 * cached) put through this client's CNAME-chain filter (REFUSED when the
 * chain leaves its allowed names). Every address in it is pinned before
 * this returns, so before it is sent. With build false (the client is gone)
 * only the filter runs and nothing is pinned. Returns the reply's length, 0
 * when there is none. */
static size_t answer(dsec__dns *d, const query *qq, const struct sockaddr *peer, uint8_t rcode,
                     const ldns_rr_list *raw, bool build, uint8_t *out, size_t cap)
{
    ldns_rr_list *ans = NULL;
    if (rcode != LDNS_RCODE_SERVFAIL) {
        ans = ldns_rr_list_new();
        if (ans == NULL) {
            rcode = LDNS_RCODE_SERVFAIL;
        } else if (dsec__dns_chain_filter(d, peer, qq, raw, ans) < 0) {
            STAT_ADD(d, refused);
            dsec__dns_refuse_cb(d, peer, qq->qname, qq->qtype, "cname");
            rcode = LDNS_RCODE_REFUSED;
            ldns_rr_list_deep_free(ans);
            ans = NULL;
        } else {
            STAT_ADD(d, answered);
        }
    }
    bool trunc = false;
    size_t len = build ? dsec__dns_build_reply(qq, rcode, ans, out, cap, &trunc) : 0;
    if (len > 0 && !trunc && ans != NULL && d->c.pin != NULL) {
        for (size_t i = 0; i < ldns_rr_list_rr_count(ans); i++) {
            const ldns_rr *rr = ldns_rr_list_rr(ans, i);
            ldns_rr_type t = ldns_rr_get_type(rr);
            if (t != LDNS_RR_TYPE_A && t != LDNS_RR_TYPE_AAAA)
                continue;
            const ldns_rdf *a = ldns_rr_rdf(rr, 0);
            d->c.pin(d->c.ud, peer, qq->qname, t == LDNS_RR_TYPE_A ? AF_INET : AF_INET6,
                     ldns_rdf_data(a), ldns_rr_ttl(rr));
        }
    }
    if (ans != NULL)
        ldns_rr_list_deep_free(ans);
    return len;
}

/* Answer one client (over UDP on lfd, or TCP on tc when tcp) with answer's
 * reply. */
static void deliver(dsec__dns *d, const query *qq, int lfd, conn *tc, bool tcp,
                    const struct sockaddr *peer, uint8_t rcode, const ldns_rr_list *raw)
{
    /* over TCP with its connection gone: nobody to pin for */
    size_t len = answer(d, qq, peer, rcode, raw, !(tcp && tc == NULL), d->obuf, sizeof d->obuf);
    if (len > 0)
        dsec__dns_reply_now(d, lfd, tc, peer, d->obuf, len);
}

/* What the upstream's answer r to p (NULL: none, SERVFAIL) means for its
 * clients: the rcode they get, and in *raw the records each client's filter
 * takes (r's answer section; NULL with SERVFAIL). NOERROR and NXDOMAIN are
 * cached; other rcodes are SERVFAIL and not kept. */
static uint8_t upstream_outcome(dsec__dns *d, const pend *p, const ldns_pkt *r,
                                const ldns_rr_list **raw)
{
    *raw = NULL;
    if (r == NULL)
        return LDNS_RCODE_SERVFAIL;
    ldns_pkt_rcode rc = ldns_pkt_get_rcode(r);
    if (rc != LDNS_RCODE_NOERROR && rc != LDNS_RCODE_NXDOMAIN)
        return LDNS_RCODE_SERVFAIL;
    dsec__dns_cache_put(d, p->key, &p->qq, r, dsec__dns_now_ms());
    *raw = ldns_pkt_answer(r);
    return (uint8_t)rc;
}

/* p (unlinked) is over: r is the upstream's matching answer, or NULL for
 * SERVFAIL (timeout, broken TCP reply, no way to ask). Caches r, answers p's
 * client and every waiter, retires p. */
static void pend_done(dsec__dns *d, pend *p, const ldns_pkt *r)
{
    const ldns_rr_list *raw;
    uint8_t rcode = upstream_outcome(d, p, r, &raw);
    deliver(d, &p->qq, p->lfd, p->tc, p->tcp, (const struct sockaddr *)&p->peer, rcode, raw);
    while (p->waiters != NULL) {
        pend *w = p->waiters;
        p->waiters = w->next;
        deliver(d, &w->qq, w->lfd, w->tc, w->tcp, (const struct sockaddr *)&w->peer, rcode, raw);
        if (w->cl != NULL)
            w->cl->inflight--;
        if (w->tc != NULL)
            w->tc->npend--;
        d->nwait--;
        pend_free(d, w);
    }
    pend_retire(d, p);
}

static void servfail_now(dsec__dns *d, int lfd, conn *tc, const struct sockaddr *peer, query *qq)
{
    uint8_t out[OUT_MAX];
    bool trunc;
    size_t len = dsec__dns_build_reply(qq, LDNS_RCODE_SERVFAIL, NULL, out, sizeof out, &trunc);
    if (len > 0)
        dsec__dns_reply_now(d, lfd, tc, peer, out, len);
    ldns_pkt_free(qq->q);
    qq->q = NULL;
}

/* The query sent upstream, built afresh from the name and type alone;
 * *w is LDNS_FREE'd by the caller. */
static int upstream_wire(const query *qq, uint16_t id, uint8_t **w, size_t *wlen)
{
    *w = NULL;
    ldns_rdf *name = ldns_dname_new_frm_str(qq->qname[0] ? qq->qname : ".");
    if (name == NULL)
        return -1;
    ldns_pkt *uq = ldns_pkt_query_new(name, qq->qtype, LDNS_RR_CLASS_IN, LDNS_RD);
    if (uq == NULL) {
        ldns_rdf_deep_free(name);
        return -1;
    }
    ldns_pkt_set_id(uq, id);
    ldns_pkt_set_edns_udp_size(uq, EDNS_SIZE);
    int rc = ldns_pkt2wire(w, uq, wlen) == LDNS_STATUS_OK && *w != NULL ? 0 : -1;
    ldns_pkt_free(uq);
    if (rc < 0) {
        LDNS_FREE(*w);
        *w = NULL;
    }
    return rc;
}

/* The client's half of a query in flight or waiting; takes qq->q. */
static void pend_fill(pend *p, query *qq, client *cl, int lfd, conn *tc,
                      const struct sockaddr *peer)
{
    p->tev.fd = -1;
    p->qq = *qq;
    qq->q = NULL;
    p->cl = cl;
    p->tc = tc;
    p->tcp = tc != NULL;
    p->lfd = lfd;
    memcpy(&p->peer, peer, dsec__dns_sa_len(peer));
}

/* qq answered from the cache (its entry under key) into out, as answer()
 * does; false on a miss. *len: the reply's length, 0 when there is none. */
static bool cache_answer(dsec__dns *d, uint32_t key, const query *qq, const struct sockaddr *peer,
                         uint8_t *out, size_t cap, size_t *len)
{
    *len = 0;
    if (d->cache == NULL)
        return false;
    uint8_t rc = 0;
    ldns_rr_list *hit = dsec__dns_cache_get(d, key, qq, dsec__dns_now_ms(), &rc);
    if (hit == NULL) {
        STAT_ADD(d, cache_misses);
        return false;
    }
    STAT_ADD(d, cache_hits);
    *len = answer(d, qq, peer, rc, hit, true, out, cap);
    ldns_rr_list_deep_free(hit);
    return true;
}

/* Answer qq from the cache, or join an identical query in flight, or send
 * it upstream on behalf of client cl. Takes qq->q. */
void dsec__dns_forward(dsec__dns *d, client *cl, int lfd, conn *tc, const struct sockaddr *peer,
                       query *qq)
{
    uint32_t key = dsec__dns_key_hash(d, qq->qname, qq->qtype);
    size_t len = 0;
    if (cache_answer(d, key, qq, peer, d->obuf, sizeof d->obuf, &len)) {
        if (len > 0)
            dsec__dns_reply_now(d, lfd, tc, peer, d->obuf, len);
        ldns_pkt_free(qq->q);
        qq->q = NULL;
        return;
    }
    if (cl->inflight >= d->c.client_inflight || d->npend + d->nwait >= MAX_PENDING) {
        servfail_now(d, lfd, tc, peer, qq);
        return;
    }
    for (pend *o = d->key_tab[key % KEY_BUCKETS]; o != NULL; o = o->knext) {
        if (o->key != key || o->qq.qtype != qq->qtype || strcmp(o->qq.qname, qq->qname) != 0)
            continue;
        pend *w = dsec_calloc(1, sizeof *w);
        if (w == NULL) {
            servfail_now(d, lfd, tc, peer, qq);
            return;
        }
        pend_fill(w, qq, cl, lfd, tc, peer);
        w->next = o->waiters;
        o->waiters = w;
        d->nwait++;
        cl->inflight++;
        if (tc != NULL)
            tc->npend++;
        STAT_ADD(d, coalesced);
        return;
    }
    size_t upi = d->up_rr++ % d->c.nupstream;
    const struct sockaddr_storage *up = &d->c.upstream[upi];
    int upfd = -1;
    size_t cand[2 * UP_SOCKS], ncand = 0;
    for (size_t i = 0; i < d->nup; i++)
        if (d->up[i].family == up->ss_family)
            cand[ncand++] = i;
    if (ncand > 0)
        upfd = d->up[cand[rand16(d) % ncand]].fd;
    uint16_t id;
    do
        id = rand16(d);
    while (d->by_id[id] != NULL);

    uint8_t *w = NULL;
    size_t wlen = 0;
    pend *p = NULL;
    if (upfd >= 0 && upstream_wire(qq, id, &w, &wlen) == 0)
        p = dsec_calloc(1, sizeof *p);
    if (p == NULL || sendto(upfd, w, wlen, MSG_DONTWAIT, (const struct sockaddr *)up,
                            dsec__dns_sa_len((const void *)up)) < 0) {
        LDNS_FREE(w);
        dsec_free(p);
        servfail_now(d, lfd, tc, peer, qq);
        return;
    }
    LDNS_FREE(w);
    STAT_ADD(d, upstream_sent);
    pend_fill(p, qq, cl, lfd, tc, peer);
    p->up_id = id;
    p->upfd = upfd;
    p->upi = upi;
    p->key = key;
    p->deadline_ms = dsec__dns_now_ms() + d->c.upstream_timeout_ms;
    plist_append(d, p);
    d->by_id[id] = p;
    p->knext = d->key_tab[key % KEY_BUCKETS];
    d->key_tab[key % KEY_BUCKETS] = p;
    d->npend++;
    cl->inflight++;
    if (tc != NULL)
        tc->npend++;
}

/* buf parsed, when it answers p: its id, QR, opcode and exact question;
 * NULL for anything else. */
static ldns_pkt *upstream_match(const pend *p, const uint8_t *buf, size_t len)
{
    if (len < 12 || (uint16_t)(buf[0] << 8 | buf[1]) != p->up_id)
        return NULL;
    ldns_pkt *r = NULL;
    if (ldns_wire2pkt(&r, buf, len) != LDNS_STATUS_OK || r == NULL)
        return NULL;
    const ldns_rr *qrr = ldns_rr_list_rr(ldns_pkt_question(r), 0);
    char qn[NAME_TXT];
    if (!ldns_pkt_qr(r) || ldns_pkt_get_opcode(r) != LDNS_PACKET_QUERY ||
        ldns_pkt_qdcount(r) != 1 || qrr == NULL || (uint16_t)ldns_rr_get_type(qrr) != p->qq.qtype ||
        ldns_rr_get_class(qrr) != LDNS_RR_CLASS_IN ||
        dsec__dns_name_text(ldns_rr_owner(qrr), qn) < 0 || strcmp(qn, p->qq.qname) != 0) {
        ldns_pkt_free(r);
        return NULL;
    }
    return r;
}

/* buf, p's upstream's reply over TCP, parsed when it answers p and is not
 * truncated itself; NULL (SERVFAIL: nobody else writes into that
 * connection) otherwise. */
static ldns_pkt *up_tcp_match(const pend *p, const uint8_t *buf, size_t len)
{
    ldns_pkt *r = upstream_match(p, buf, len);
    if (r != NULL && ldns_pkt_tc(r)) {
        ldns_pkt_free(r);
        r = NULL;
    }
    return r;
}

/* Ask p's upstream again over TCP (its UDP answer was truncated): same id
 * and question, a fresh timeout. p stays in flight, off the UDP sockets. */
static int up_tcp_start(dsec__dns *d, pend *p)
{
    if (d->nuptcp >= UP_TCP_MAX)
        return -1;
    const struct sockaddr_storage *up = &d->c.upstream[p->upi];
    uint8_t *w = NULL;
    size_t wlen = 0;
    if (upstream_wire(&p->qq, p->up_id, &w, &wlen) < 0)
        return -1;
    p->tbuf = dsec_malloc(2 + wlen);
    if (p->tbuf == NULL) {
        LDNS_FREE(w);
        return -1;
    }
    p->tbuf[0] = (uint8_t)(wlen >> 8);
    p->tbuf[1] = (uint8_t)wlen;
    memcpy(p->tbuf + 2, w, wlen);
    LDNS_FREE(w);
    p->tlen = 2 + wlen;
    p->toff = 0;
    int fd = socket(up->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (const struct sockaddr *)up, dsec__dns_sa_len((const void *)up)) < 0 &&
        errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    p->tev = (evsrc){.kind = EV_UPTCP, .fd = fd, .family = up->ss_family};
    struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = &p->tev};
    if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        close(fd);
        p->tev.fd = -1;
        return -1;
    }
    d->nuptcp++;
    p->upfd = -1; /* no UDP reply matches it any more */
    plist_del(d, p);
    p->deadline_ms = dsec__dns_now_ms() + d->c.upstream_timeout_ms;
    plist_append(d, p);
    STAT_ADD(d, upstream_tcp);
    return 0;
}

static void up_tcp_fail(dsec__dns *d, pend *p)
{
    pend_unlink(d, p);
    pend_done(d, p, NULL);
}

/* The TCP connection of p: send the query, then read one framed reply (at
 * most 65535 bytes by its framing). Over TCP only the server asked can
 * write, so a reply that does not match is SERVFAIL, not ignored. */
void dsec__dns_up_tcp_event(dsec__dns *d, pend *p, uint32_t events)
{
    if (p->dead)
        return;
    int fd = p->tev.fd;
    if (!p->tsent) {
        if (events & (EPOLLERR | EPOLLHUP)) {
            up_tcp_fail(d, p);
            return;
        }
        while (p->toff < p->tlen) {
            ssize_t n = send(fd, p->tbuf + p->toff, p->tlen - p->toff, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return;
            if (n < 0) {
                up_tcp_fail(d, p);
                return;
            }
            p->toff += (size_t)n;
        }
        dsec_free(p->tbuf);
        p->tbuf = NULL;
        p->tlen = p->toff = 0;
        p->tsent = true;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &p->tev};
        if (epoll_ctl(d->epfd, EPOLL_CTL_MOD, fd, &ev) < 0)
            up_tcp_fail(d, p);
        return;
    }
    for (;;) {
        bool hdr = p->thlen < 2;
        ssize_t n = hdr ? recv(fd, p->thdr + p->thlen, 2 - p->thlen, MSG_DONTWAIT)
                        : recv(fd, p->tbuf + p->toff, p->tlen - p->toff, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            up_tcp_fail(d, p); /* an error, or closed before the whole reply */
            return;
        }
        if (!hdr) {
            p->toff += (size_t)n;
            if (p->toff == p->tlen)
                break;
            continue;
        }
        p->thlen += (size_t)n;
        if (p->thlen < 2)
            continue;
        p->tlen = (size_t)p->thdr[0] << 8 | p->thdr[1];
        p->toff = 0;
        if (p->tlen < 12 || (p->tbuf = dsec_malloc(p->tlen)) == NULL) {
            up_tcp_fail(d, p);
            return;
        }
    }
    ldns_pkt *r = up_tcp_match(p, p->tbuf, p->tlen);
    pend_unlink(d, p);
    pend_done(d, p, r);
    if (r != NULL)
        ldns_pkt_free(r);
}

/* An upstream reply over UDP: accepted only from the server asked, on the
 * socket used, with the id and the exact question of a query in flight. A
 * truncated one sends the query to TCP. */
void dsec__dns_upstream_reply(dsec__dns *d, int fd, const uint8_t *buf, size_t len,
                              const struct sockaddr_storage *src)
{
    if (len < 12)
        return;
    pend *p = d->by_id[(uint16_t)(buf[0] << 8 | buf[1])];
    if (p == NULL || p->upfd != fd || !dsec__dns_sa_same(src, &d->c.upstream[p->upi]))
        return;
    ldns_pkt *r = upstream_match(p, buf, len);
    if (r == NULL)
        return;
    if (ldns_pkt_tc(r)) {
        ldns_pkt_free(r);
        if (up_tcp_start(d, p) == 0)
            return;
        pend_unlink(d, p);
        pend_done(d, p, NULL);
        return;
    }
    pend_unlink(d, p);
    pend_done(d, p, r);
    ldns_pkt_free(r);
}

void dsec__dns_pend_expire(dsec__dns *d, uint64_t nowms)
{
    while (d->phead != NULL && d->phead->deadline_ms <= nowms) {
        pend *p = d->phead;
        pend_unlink(d, p);
        STAT_ADD(d, upstream_timeouts);
        pend_done(d, p, NULL);
    }
}

void dsec__dns_pend_reap(dsec__dns *d)
{
    while (d->pdead != NULL) {
        pend *p = d->pdead;
        d->pdead = p->next;
        pend_free(d, p);
    }
}

void dsec__dns_pend_free_all(dsec__dns *d)
{
    while (d->phead != NULL) {
        pend *p = d->phead;
        pend_unlink(d, p);
        while (p->waiters != NULL) {
            pend *w = p->waiters;
            p->waiters = w->next;
            pend_free(d, w);
        }
        pend_free(d, p);
    }
    dsec__dns_pend_reap(d);
}

int dsec__dns_upstream_offline(dsec__dns *d, const struct sockaddr *cl, const uint8_t *pkt,
                               size_t len, const uint8_t *up, size_t uplen, unsigned flags,
                               uint8_t *out, size_t cap, size_t *out_len)
{
    *out_len = 0;
    if (d == NULL || d->started || cl == NULL || (pkt == NULL && len > 0) ||
        (up == NULL && uplen > 0) || uplen > 65535 || out == NULL)
        return -1;
    bool client_tcp = (flags & DSEC__DNS_OFFLINE_CLIENT_TCP) != 0;
    bool up_tcp = (flags & DSEC__DNS_OFFLINE_UPSTREAM_TCP) != 0;
    STAT_ADD(d, queries);
    size_t n = 0;
    query qq;
    int act = dsec__dns_decide(d, cl, pkt, len, client_tcp, &qq, d->obuf, &n);
    if (act == ACT_FORWARD) {
        /* dsec__dns_forward(), with the upstream asked under the client's own id */
        uint32_t key = dsec__dns_key_hash(d, qq.qname, qq.qtype);
        if (!cache_answer(d, key, &qq, cl, d->obuf, sizeof d->obuf, &n)) {
            pend p = {.qq = qq, .key = key, .up_id = ldns_pkt_id(qq.q)};
            STAT_ADD(d, upstream_sent);
            ldns_pkt *r = up_tcp ? up_tcp_match(&p, up, uplen) : upstream_match(&p, up, uplen);
            if (up_tcp) {
                STAT_ADD(d, upstream_tcp);
            } else if (r == NULL) {
                STAT_ADD(d, upstream_timeouts); /* ignored: the query times out */
            } else if (ldns_pkt_tc(r)) {
                ldns_pkt_free(r); /* to TCP, whose reply this call does not have */
                r = NULL;
            }
            const ldns_rr_list *raw;
            uint8_t rcode = upstream_outcome(d, &p, r, &raw);
            n = answer(d, &qq, cl, rcode, raw, true, d->obuf, sizeof d->obuf);
            if (r != NULL)
                ldns_pkt_free(r);
        }
        ldns_pkt_free(qq.q);
    } else if (act == ACT_DROP) {
        n = 0;
    }
    if (n > cap)
        return -1;
    memcpy(out, d->obuf, n);
    *out_len = n;
    return 0;
}
