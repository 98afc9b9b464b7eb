/* net-dns.c - node-local DNS resolver: A/AAAA of allowed names only, addresses pinned first. */
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

/*
 * Why it is built this way: sandboxes run untrusted code, and DNS is the
 * classic way out of a network that allows nothing else (queries for names
 * under a zone the attacker's server is authoritative for). So:
 *
 *  - A denied name is never sent anywhere: the policy is asked before any
 *    upstream query exists, and the upstream query is built afresh from the
 *    lower-cased name and the type alone (letter case, ids, EDNS options,
 *    extra records of the client's packet never leave the node).
 *  - Only A and AAAA: TXT and friends carry data back in; a CNAME chain is
 *    followed only while each target is itself allowed, so an allowed name
 *    cannot point into the attacker's zone.
 *  - Names are letters, digits, '-' and '_' only: the policy then sees one
 *    spelling of each name (no escapes, no dots inside labels).
 *  - Returned TTLs are clamped to [TTL_MIN, TTL_MAX] and the pin gets the
 *    same TTL, so a client never caches an address longer than the firewall
 *    lets it be reached; the floor keeps a TTL-0 answer usable for the
 *    connect that follows it.
 *  - One thread, one epoll loop. Each listen address has UDP_SHARDS UDP
 *    sockets in one SO_REUSEPORT group, and a classic BPF program picks the
 *    socket by the client's address: a flooding client fills only its own
 *    shard's queue. Each socket gets one bounded batch per turn of the loop,
 *    so a query from another shard waits for a few batches, not behind the
 *    whole flood. A client over its token bucket costs a hash lookup and
 *    nothing else (no parse, no callback except one "flood" report a
 *    second). The TCP listener on the same port (bound first, without
 *    SO_REUSEPORT) keeps a second resolver from joining the UDP group, and
 *    SO_REUSEADDR is set on TCP only: on UDP it would let another socket
 *    share the port.
 *  - Upstream replies must come from the server asked, on the socket used,
 *    with the random id and the exact question of a query in flight.
 *    Anything else is ignored (not failed: a spoofer must not be able to cut
 *    a real answer short). A truncated upstream answer is asked again of
 *    the same server over TCP (non-blocking, in the same loop, at most
 *    UP_TCP_MAX at once), with the same id and question; over TCP a reply
 *    that does not match, does not parse or does not arrive in time is
 *    SERVFAIL, since nobody else can write into that connection.
 *  - A node-wide cache keyed by (name, type) holds the upstream's answer
 *    records before any policy filter (policies differ per sandbox; the
 *    policy check, the CNAME-chain filter and the pins run on every answer,
 *    cached or not), with the clamped TTLs counted down while cached.
 *    Identical queries in flight share one upstream query.
 */

/* ---- sending to clients ------------------------------------------------------------------- */

static void conn_close(dsec__dns *d, conn *c);

static void conn_want_out(dsec__dns *d, conn *c, bool on)
{
    if (c->wantout == on)
        return;
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = &c->ev};
    if (epoll_ctl(d->epfd, EPOLL_CTL_MOD, c->ev.fd, &ev) == 0)
        c->wantout = on;
}

static void conn_flush(dsec__dns *d, conn *c)
{
    while (c->wlen > 0) {
        ssize_t n = send(c->ev.fd, c->wbuf, c->wlen, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                conn_close(d, c);
            break;
        }
        memmove(c->wbuf, c->wbuf + n, c->wlen - (size_t)n);
        c->wlen -= (size_t)n;
    }
    if (!c->dead)
        conn_want_out(d, c, c->wlen > 0);
}

/* Queue one reply, length-framed; a client that does not read its replies
 * is closed rather than buffered for without bound. */
void dsec__dns_conn_send(dsec__dns *d, conn *c, const uint8_t *msg, size_t len)
{
    if (c->dead)
        return;
    if (c->wlen + 2 + len > TCP_WBUF_MAX) {
        conn_close(d, c);
        return;
    }
    if (c->wlen + 2 + len > c->wcap) {
        size_t cap = c->wcap ? c->wcap : 1024;
        while (cap < c->wlen + 2 + len)
            cap *= 2;
        uint8_t *nb = dsec_realloc(c->wbuf, cap);
        if (nb == NULL) {
            conn_close(d, c);
            return;
        }
        c->wbuf = nb;
        c->wcap = cap;
    }
    c->wbuf[c->wlen] = (uint8_t)(len >> 8);
    c->wbuf[c->wlen + 1] = (uint8_t)len;
    memcpy(c->wbuf + c->wlen + 2, msg, len);
    c->wlen += 2 + len;
    conn_flush(d, c);
}

/* ---- receiving ---------------------------------------------------------------------------- */

/* One query from a client over UDP (lfd) or TCP (tc). */
static void client_query(dsec__dns *d, int lfd, conn *tc, const struct sockaddr *peer,
                         const uint8_t *pkt, size_t len)
{
    STAT_ADD(d, queries);
    uint64_t now = dsec__dns_now_us();
    client *cl = tc != NULL ? tc->cl : dsec__dns_client_get(d, peer, now);
    if (cl == NULL) {
        STAT_ADD(d, dropped);
        return;
    }
    if (!dsec__dns_client_take(d, cl, now))
        return;
    uint8_t out[OUT_MAX];
    size_t outlen = 0;
    query qq;
    switch (dsec__dns_decide(d, peer, pkt, len, tc != NULL, &qq, out, &outlen)) {
    case ACT_REPLY:
        dsec__dns_reply_now(d, lfd, tc, peer, out, outlen);
        break;
    case ACT_FORWARD:
        dsec__dns_forward(d, cl, lfd, tc, peer, &qq);
        break;
    default:
        break;
    }
}

static void udp_batch(dsec__dns *d, int fd)
{
    for (int i = 0; i < UDP_BATCH; i++) {
        d->iov[i] = (struct iovec){.iov_base = d->rx[i], .iov_len = MAX_QUERY};
        d->msgs[i].msg_hdr = (struct msghdr){.msg_name = &d->from[i],
                                             .msg_namelen = sizeof d->from[i],
                                             .msg_iov = &d->iov[i],
                                             .msg_iovlen = 1};
        d->msgs[i].msg_len = 0;
    }
    int n = recvmmsg(fd, d->msgs, UDP_BATCH, MSG_DONTWAIT, NULL);
    for (int i = 0; i < n; i++) {
        const struct sockaddr *from = (const struct sockaddr *)&d->from[i];
        if (from->sa_family != AF_INET && from->sa_family != AF_INET6)
            continue;
        if (d->msgs[i].msg_hdr.msg_flags & MSG_TRUNC) {
            /* larger than any query we take: count it, answer nothing */
            STAT_ADD(d, queries);
            STAT_ADD(d, dropped);
            continue;
        }
        client_query(d, fd, NULL, from, d->rx[i], d->msgs[i].msg_len);
    }
}

static void upstream_batch(dsec__dns *d, int fd)
{
    for (int i = 0; i < UDP_BATCH; i++) {
        struct sockaddr_storage src;
        socklen_t sl = sizeof src;
        ssize_t n =
            recvfrom(fd, d->upbuf, sizeof d->upbuf, MSG_DONTWAIT, (struct sockaddr *)&src, &sl);
        if (n < 0)
            break;
        dsec__dns_upstream_reply(d, fd, d->upbuf, (size_t)n, &src);
    }
}

static void conn_close(dsec__dns *d, conn *c)
{
    if (c->dead)
        return;
    c->dead = true;
    epoll_ctl(d->epfd, EPOLL_CTL_DEL, c->ev.fd, NULL);
    close(c->ev.fd);
    c->ev.fd = -1;
    if (c->npend > 0)
        for (pend *p = d->phead; p != NULL; p = p->next) {
            if (p->tc == c)
                p->tc = NULL;
            for (pend *w = p->waiters; w != NULL; w = w->next)
                if (w->tc == c)
                    w->tc = NULL;
        }
    c->npend = 0;
    c->cl->nconn--;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        d->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    d->nconns--;
    /* freed after this turn of the loop: an event for it may still be queued */
    c->next = d->dead;
    d->dead = c;
}

static void tcp_accept(dsec__dns *d, int lfd)
{
    for (int i = 0; i < 16; i++) {
        struct sockaddr_storage peer;
        socklen_t pl = sizeof peer;
        int fd = accept4(lfd, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        uint64_t now = dsec__dns_now_us();
        client *cl = (peer.ss_family == AF_INET || peer.ss_family == AF_INET6)
                         ? dsec__dns_client_get(d, (const struct sockaddr *)&peer, now)
                         : NULL;
        conn *c = NULL;
        if (cl != NULL && cl->nconn < TCP_PER_CLIENT && d->nconns < TCP_TOTAL)
            c = dsec_calloc(1, sizeof *c);
        if (c == NULL) {
            close(fd); /* over the caps: closing at once keeps the backlog free */
            continue;
        }
        c->ev = (evsrc){.kind = EV_CONN, .fd = fd, .family = peer.ss_family};
        c->cl = cl;
        memcpy(&c->peer, &peer, sizeof peer);
        c->seen_ms = now / 1000u;
        cl->seen_ms = c->seen_ms;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c->ev};
        if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
            close(fd);
            dsec_free(c);
            continue;
        }
        cl->nconn++;
        c->next = d->conns;
        if (d->conns != NULL)
            d->conns->prev = c;
        d->conns = c;
        d->nconns++;
    }
}

static void conn_read(dsec__dns *d, conn *c)
{
    ssize_t n = recv(c->ev.fd, c->rbuf + c->rlen, sizeof c->rbuf - c->rlen, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        conn_close(d, c);
        return;
    }
    if (n < 0)
        return;
    c->rlen += (size_t)n;
    c->seen_ms = dsec__dns_now_ms();
    size_t off = 0;
    while (!c->dead && c->rlen - off >= 2) {
        size_t ml = (size_t)c->rbuf[off] << 8 | c->rbuf[off + 1];
        if (ml < 12 || ml > MAX_QUERY) {
            conn_close(d, c); /* no framing to resynchronise on */
            return;
        }
        if (c->rlen - off < 2 + ml)
            break;
        client_query(d, -1, c, (const struct sockaddr *)&c->peer, c->rbuf + off + 2, ml);
        off += 2 + ml;
    }
    if (!c->dead && off > 0) {
        memmove(c->rbuf, c->rbuf + off, c->rlen - off);
        c->rlen -= off;
    }
}

static void conns_sweep(dsec__dns *d, uint64_t nowms)
{
    conn *next;
    for (conn *c = d->conns; c != NULL; c = next) {
        next = c->next;
        if (c->npend == 0 && nowms - c->seen_ms > TCP_IDLE_MS)
            conn_close(d, c);
    }
}

/* Free the connections closed this turn of the loop. */
static void conns_reap(dsec__dns *d)
{
    while (d->dead != NULL) {
        conn *c = d->dead;
        d->dead = c->next;
        dsec_free(c->wbuf);
        dsec_free(c);
    }
}

/* ---- the thread --------------------------------------------------------------------------- */

static void *dns_thread(void *arg)
{
    dsec__dns *d = arg;
    struct epoll_event evs[64];
    bool stop = false;
    while (!stop) {
        uint64_t nowms = dsec__dns_now_ms();
        uint64_t wake = d->next_sweep_ms;
        if (d->phead != NULL && d->phead->deadline_ms < wake)
            wake = d->phead->deadline_ms;
        int timeout = wake <= nowms ? 0 : (int)(wake - nowms);
        int n = epoll_wait(d->epfd, evs, 64, timeout);
        for (int i = 0; i < n; i++) {
            evsrc *s = evs[i].data.ptr;
            switch (s->kind) {
            case EV_STOP:
                stop = true;
                break;
            case EV_UDP:
                udp_batch(d, s->fd);
                break;
            case EV_TCPL:
                tcp_accept(d, s->fd);
                break;
            case EV_UP:
                upstream_batch(d, s->fd);
                break;
            case EV_UPTCP:
                dsec__dns_up_tcp_event(d, (pend *)s, evs[i].events);
                break;
            case EV_CONN: {
                conn *c = (conn *)s;
                if (!c->dead && (evs[i].events & EPOLLIN))
                    conn_read(d, c);
                if (!c->dead && (evs[i].events & EPOLLOUT))
                    conn_flush(d, c);
                if (!c->dead && (evs[i].events & (EPOLLERR | EPOLLHUP)))
                    conn_close(d, c);
                break;
            }
            }
        }
        nowms = dsec__dns_now_ms();
        dsec__dns_pend_expire(d, nowms);
        if (nowms >= d->next_sweep_ms) {
            conns_sweep(d, nowms);
            dsec__dns_clients_sweep(d, nowms);
            dsec__dns_cache_sweep(d, nowms);
            d->next_sweep_ms = nowms + SWEEP_MS;
        }
        dsec__dns_pend_reap(d);
        conns_reap(d);
    }
    return NULL;
}

/* ---- set-up ------------------------------------------------------------------------------- */

static int sock_listen(const struct sockaddr_storage *a, int type, dsec_err *err)
{
    int one = 1;
    char as[64];
    dsec__dns_sa_str(a, as, sizeof as);
    const char *what = type == SOCK_DGRAM ? "UDP" : "TCP";
    int fd = socket(a->ss_family, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "dns: %s socket for %s", what, as);
    if (type == SOCK_STREAM)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    else
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    /* FREEBIND: the gateway address may not be on any interface yet */
    if (a->ss_family == AF_INET6) {
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        setsockopt(fd, IPPROTO_IPV6, IPV6_FREEBIND, &one, sizeof one);
    } else {
        setsockopt(fd, IPPROTO_IP, IP_FREEBIND, &one, sizeof one);
    }
    if (type == SOCK_DGRAM) {
        /* a burst from many sandboxes at once must queue, not drop; FORCE
         * passes rmem_max where we may (CAP_NET_ADMIN) */
        int sz = RCVBUF_BYTES;
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof sz) < 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    }
    if (bind(fd, (const struct sockaddr *)a, dsec__dns_sa_len((const struct sockaddr *)a)) < 0) {
        int e = errno;
        close(fd);
        return dsec_err_set(err, DSEC_E_IO, e, "dns: binding the %s listener on %s", what, as);
    }
    if (type == SOCK_STREAM && listen(fd, 128) < 0) {
        int e = errno;
        close(fd);
        return dsec_err_set(err, DSEC_E_IO, e, "dns: listening on %s", as);
    }
    return fd;
}

/* Steer each datagram to shard hash(client address) % UDP_SHARDS. Best
 * effort: without it the kernel hashes address and port, which still keeps
 * a flood from one socket on one shard. */
static void shard_by_client(int fd, int family)
{
    uint32_t off = family == AF_INET6 ? 8 + 12 : 12; /* v4 source, or v6 source's last word */
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)SKF_NET_OFF + off),
        BPF_STMT(BPF_MISC | BPF_TAX, 0),
        BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, 16),
        BPF_STMT(BPF_ALU | BPF_XOR | BPF_X, 0),
        BPF_STMT(BPF_MISC | BPF_TAX, 0),
        BPF_STMT(BPF_ALU | BPF_RSH | BPF_K, 8),
        BPF_STMT(BPF_ALU | BPF_XOR | BPF_X, 0),
        BPF_STMT(BPF_ALU | BPF_MOD | BPF_K, UDP_SHARDS),
        BPF_STMT(BPF_RET | BPF_A, 0),
    };
    struct sock_fprog prog = {.len = sizeof code / sizeof code[0], .filter = code};
    setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog);
}

static int ep_add(dsec__dns *d, evsrc *s, dsec_err *err)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s};
    if (epoll_ctl(d->epfd, EPOLL_CTL_ADD, s->fd, &ev) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "dns: epoll_ctl");
    return 0;
}

static int conf_check(const dsec__dns_conf *c, dsec_err *err)
{
    if (c == NULL || c->allowed == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "dns: the configuration needs a policy (allowed)");
    if (c->nlisten > 2 || c->nupstream > 4)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "dns: %zu listen and %zu upstream addresses (at most 2 and 4)",
                            c->nlisten, c->nupstream);
    if (c->nlisten > 0 && c->nupstream == 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "dns: no upstream resolver configured for the node resolver");
    for (size_t i = 0; i < c->nlisten; i++)
        if (c->listen[i].ss_family != AF_INET && c->listen[i].ss_family != AF_INET6)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "dns: listen address %zu is neither IPv4 nor IPv6", i);
    for (size_t i = 0; i < c->nupstream; i++)
        if (c->upstream[i].ss_family != AF_INET && c->upstream[i].ss_family != AF_INET6)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "dns: upstream address %zu is neither IPv4 nor IPv6", i);
    return 0;
}

/* The listeners of c: per address, a TCP one and a group of UDP_SHARDS UDP ones. */
static int listeners_open(dsec__dns *d, const dsec__dns_conf *c, dsec_err *err)
{
    for (size_t i = 0; i < c->nlisten; i++) {
        int fam = c->listen[i].ss_family;
        int fd = sock_listen(&c->listen[i], SOCK_STREAM, err);
        if (fd < 0)
            return -1;
        d->tcpl[d->ntcpl++] = (evsrc){.kind = EV_TCPL, .fd = fd, .family = fam};
        if (ep_add(d, &d->tcpl[d->ntcpl - 1], err) < 0)
            return -1;
        size_t first = d->nudp;
        for (int k = 0; k < UDP_SHARDS; k++) {
            fd = sock_listen(&c->listen[i], SOCK_DGRAM, err);
            if (fd < 0)
                return -1;
            d->udp[d->nudp++] = (evsrc){.kind = EV_UDP, .fd = fd, .family = fam};
            if (ep_add(d, &d->udp[d->nudp - 1], err) < 0)
                return -1;
        }
        shard_by_client(d->udp[first].fd, fam);
    }
    return 0;
}

/* upstream: UP_SOCKS sockets per family in use, each on an ephemeral port
 * the kernel picks at random; every query goes out on a random one */
static int upstreams_open(dsec__dns *d, const dsec__dns_conf *c, dsec_err *err)
{
    for (int fam = AF_INET; fam <= AF_INET6; fam += AF_INET6 - AF_INET) {
        bool used = false;
        for (size_t i = 0; i < c->nupstream; i++)
            used |= c->upstream[i].ss_family == fam;
        for (int k = 0; used && k < UP_SOCKS; k++) {
            int fd = socket(fam, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (fd < 0)
                return dsec_err_set(err, DSEC_E_IO, errno, "dns: upstream socket (%s)",
                                    fam == AF_INET ? "IPv4" : "IPv6");
            int sz = 1 << 20;
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
            d->up[d->nup++] = (evsrc){.kind = EV_UP, .fd = fd, .family = fam};
            if (ep_add(d, &d->up[d->nup - 1], err) < 0)
                return -1;
        }
    }
    return 0;
}

int dsec__dns_new(dsec__dns **out, const dsec__dns_conf *c, dsec_err *err)
{
    *out = NULL;
    if (conf_check(c, err) < 0)
        return -1;
    dsec__dns *d = dsec_calloc(1, sizeof *d);
    if (d == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "dns: allocating the resolver");
    d->c = *c;
    if (d->c.upstream_timeout_ms == 0)
        d->c.upstream_timeout_ms = DEF_TIMEOUT_MS;
    if (d->c.client_qps == 0)
        d->c.client_qps = DEF_QPS;
    if (d->c.client_burst == 0)
        d->c.client_burst = 2 * d->c.client_qps;
    if (d->c.client_inflight == 0)
        d->c.client_inflight = DEF_INFLIGHT;
    if (d->c.cache_entries == 0)
        d->c.cache_entries = DEF_CACHE_ENTRIES;
    if (d->c.cache_bytes == 0)
        d->c.cache_bytes = DEF_CACHE_BYTES;
    d->epfd = d->stop.fd = -1;
    if (getrandom(d->hkey, sizeof d->hkey, 0) != (ssize_t)sizeof d->hkey) {
        dsec_err_set(err, DSEC_E_IO, errno, "dns: reading a random hash key");
        goto fail;
    }
    d->cbuckets = 16;
    while (d->cbuckets < d->c.cache_entries && d->cbuckets < (1u << 20))
        d->cbuckets *= 2;
    d->cache = dsec_calloc(d->cbuckets, sizeof *d->cache);
    if (d->cache == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "dns: allocating the cache");
        goto fail;
    }
    if (c->nlisten == 0) {
        *out = d; /* offline: the query and upstream paths without sockets */
        return 0;
    }
    d->by_id = dsec_calloc(65536, sizeof *d->by_id);
    if (d->by_id == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "dns: allocating the pending table");
        goto fail;
    }
    d->epfd = epoll_create1(EPOLL_CLOEXEC);
    d->stop = (evsrc){.kind = EV_STOP, .fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};
    if (d->epfd < 0 || d->stop.fd < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "dns: creating epoll/eventfd");
        goto fail;
    }
    if (ep_add(d, &d->stop, err) < 0)
        goto fail;
    if (listeners_open(d, c, err) < 0 || upstreams_open(d, c, err) < 0)
        goto fail;
    d->next_sweep_ms = dsec__dns_now_ms() + SWEEP_MS;
    int e = pthread_create(&d->th, NULL, dns_thread, d);
    if (e != 0) {
        dsec_err_set(err, DSEC_E_IO, e, "dns: starting the resolver thread");
        goto fail;
    }
    d->started = true;
    *out = d;
    return 0;
fail:
    dsec__dns_free(d);
    return -1;
}

void dsec__dns_free(dsec__dns *d)
{
    if (d == NULL)
        return;
    if (d->started) {
        uint64_t one = 1;
        while (write(d->stop.fd, &one, sizeof one) < 0 && errno == EINTR)
            ;
        pthread_join(d->th, NULL);
    }
    dsec__dns_pend_free_all(d);
    dsec__dns_cache_clear(d);
    while (d->conns != NULL)
        conn_close(d, d->conns);
    conns_reap(d);
    dsec__dns_clients_free(d);
    for (size_t i = 0; i < d->nudp; i++)
        close(d->udp[i].fd);
    for (size_t i = 0; i < d->ntcpl; i++)
        close(d->tcpl[i].fd);
    for (size_t i = 0; i < d->nup; i++)
        close(d->up[i].fd);
    if (d->stop.fd >= 0)
        close(d->stop.fd);
    if (d->epfd >= 0)
        close(d->epfd);
    dsec_free(d->by_id);
    dsec_free(d->cache);
    dsec_free(d);
}

void dsec__dns_stats_get(dsec__dns *d, dsec__dns_stats *out)
{
    out->queries = __atomic_load_n(&d->st.queries, __ATOMIC_RELAXED);
    out->answered = __atomic_load_n(&d->st.answered, __ATOMIC_RELAXED);
    out->refused = __atomic_load_n(&d->st.refused, __ATOMIC_RELAXED);
    out->dropped = __atomic_load_n(&d->st.dropped, __ATOMIC_RELAXED);
    out->upstream_sent = __atomic_load_n(&d->st.upstream_sent, __ATOMIC_RELAXED);
    out->upstream_timeouts = __atomic_load_n(&d->st.upstream_timeouts, __ATOMIC_RELAXED);
    out->upstream_tcp = __atomic_load_n(&d->st.upstream_tcp, __ATOMIC_RELAXED);
    out->cache_hits = __atomic_load_n(&d->st.cache_hits, __ATOMIC_RELAXED);
    out->cache_misses = __atomic_load_n(&d->st.cache_misses, __ATOMIC_RELAXED);
    out->cache_evictions = __atomic_load_n(&d->st.cache_evictions, __ATOMIC_RELAXED);
    out->cache_entries = __atomic_load_n(&d->st.cache_entries, __ATOMIC_RELAXED);
    out->coalesced = __atomic_load_n(&d->st.coalesced, __ATOMIC_RELAXED);
}

int dsec__dns_query_offline(dsec__dns *d, const struct sockaddr *cl, const uint8_t *pkt, size_t len,
                            uint8_t **reply, size_t *reply_len)
{
    *reply = NULL;
    *reply_len = 0;
    if (d == NULL || cl == NULL || (pkt == NULL && len > 0))
        return -1;
    STAT_ADD(d, queries);
    uint8_t out[OUT_MAX];
    size_t outlen = 0;
    query qq;
    int act = dsec__dns_decide(d, cl, pkt, len, false, &qq, out, &outlen);
    if (act == ACT_FORWARD) {
        ldns_pkt_free(qq.q);
        return 0;
    }
    if (act == ACT_REPLY && outlen > 0) {
        *reply = dsec_malloc(outlen);
        if (*reply == NULL)
            return -1;
        memcpy(*reply, out, outlen);
        *reply_len = outlen;
    }
    return 0;
}
