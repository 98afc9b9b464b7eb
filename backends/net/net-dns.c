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
 *    a real answer short). No TCP to upstream: a truncated upstream answer
 *    is SERVFAIL (A/AAAA answers fit 1232 bytes in practice).
 */

#define DEF_TIMEOUT_MS 2000u
#define DEF_QPS 100u
#define DEF_INFLIGHT 32u
#define EDNS_SIZE 1232u /* our EDNS buffer upstream and to clients (no fragmentation) */
#define TTL_MIN 5u      /* seconds */
#define TTL_MAX 300u
#define CNAME_HOPS 16      /* longest chain followed */
#define MAX_PENDING 8192u  /* upstream queries in flight, all clients */
#define MAX_CLIENTS 65536u /* client addresses tracked at once */
#define CLIENT_BUCKETS 4096u
#define CLIENT_IDLE_MS 60000u
#define SWEEP_MS 1000u
#define TCP_PER_CLIENT 8u
#define TCP_TOTAL 512u
#define TCP_IDLE_MS 10000u
#define TCP_WBUF_MAX 65536u    /* unread replies queued per connection before it is closed */
#define MAX_QUERY 1500u        /* largest client query accepted */
#define OUT_MAX 4096u          /* largest reply built (upstream asked for <= 1232 bytes) */
#define UDP_BATCH 32           /* packets read per socket per turn of the loop */
#define UDP_SHARDS 8           /* UDP sockets per listen address, chosen by client address */
#define UP_SOCKS 4             /* upstream sockets per family, each on its own random port */
#define NAME_TXT 256           /* a name as text, with its NUL */
#define RCVBUF_BYTES (2 << 20) /* per shard */

typedef enum ev_kind { EV_STOP, EV_UDP, EV_TCPL, EV_UP, EV_CONN } ev_kind;

/* What an epoll event points at; first member of each source. */
typedef struct evsrc {
    ev_kind kind;
    int fd;
    int family;
} evsrc;

typedef struct client client;
typedef struct conn conn;
typedef struct pend pend;

/* One client address (port ignored): its rate, its in-flight count. */
struct client {
    client *next; /* hash chain */
    int family;
    uint8_t addr[16];
    struct sockaddr_storage sa; /* port 0: what the "flood" report names */
    double tokens;
    uint64_t refill_us;
    uint64_t seen_ms;
    uint64_t flood_ms; /* last "flood" report */
    bool flood_reported;
    uint32_t inflight;
    uint32_t nconn;
};

/* One DNS-over-TCP client connection. */
struct conn {
    evsrc ev;
    conn *prev, *next; /* live connections; next alone links the dead ones */
    client *cl;
    struct sockaddr_storage peer;
    uint8_t rbuf[2 + MAX_QUERY];
    size_t rlen;
    uint8_t *wbuf; /* dsec_malloc'd; queued length-framed replies */
    size_t wlen, wcap;
    uint64_t seen_ms;
    uint32_t npend;
    bool dead, wantout;
};

/* The parsed query of a client, as far as the policy needs it. */
typedef struct query {
    ldns_pkt *q; /* owned: its id, flags and question go into the reply */
    char qname[NAME_TXT];
    uint16_t qtype;
    bool edns;
    uint16_t max_len; /* the largest reply this client takes */
} query;

/* One upstream query in flight. */
struct pend {
    pend *prev, *next; /* in deadline order (the timeout is the same for all) */
    query qq;
    client *cl;
    conn *tc; /* TCP client, or NULL */
    int lfd;  /* UDP listener it came in on (when tc is NULL and !tcp) */
    bool tcp;
    struct sockaddr_storage peer;
    socklen_t peerlen;
    uint16_t up_id;
    int upfd;
    size_t upi; /* which upstream */
    uint64_t deadline_ms;
};

struct dsec__dns {
    dsec__dns_conf c;
    int epfd;
    evsrc stop;
    evsrc udp[2 * UDP_SHARDS], tcpl[2];
    size_t nudp, ntcpl;
    evsrc up[2 * UP_SOCKS];
    size_t nup;
    pthread_t th;
    bool started;

    client *ctab[CLIENT_BUCKETS];
    size_t nclients;
    conn *conns, *dead;
    size_t nconns;
    pend **by_id; /* 65536 slots: upstream id -> query in flight */
    pend *phead, *ptail;
    size_t npend;
    size_t up_rr;
    uint64_t next_sweep_ms;

    uint8_t rnd[256];
    size_t rnd_left;

    dsec__dns_stats st; /* updated with atomics: read from other threads */

    /* receive buffers of the resolver thread */
    struct mmsghdr msgs[UDP_BATCH];
    struct iovec iov[UDP_BATCH];
    struct sockaddr_storage from[UDP_BATCH];
    uint8_t rx[UDP_BATCH][MAX_QUERY];
    uint8_t upbuf[65536];
};

#define STAT_ADD(d, f) __atomic_fetch_add(&(d)->st.f, 1, __ATOMIC_RELAXED)

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t now_ms(void)
{
    return now_us() / 1000u;
}

/* Random bits for upstream ids and socket choice, from the kernel's CSPRNG. */
static uint16_t rand16(dsec__dns *d)
{
    if (d->rnd_left < 2) {
        ssize_t n = getrandom(d->rnd, sizeof d->rnd, 0);
        if (n < (ssize_t)sizeof d->rnd) {
            /* getrandom does not fail short for 256 bytes once seeded; if it
             * ever does, the clock still beats a constant */
            uint64_t t = now_us();
            for (size_t i = 0; i < sizeof d->rnd; i++)
                d->rnd[i] ^= (uint8_t)((t >> ((i % 8) * 8)) + i * 131u);
        }
        d->rnd_left = sizeof d->rnd;
    }
    d->rnd_left -= 2;
    return (uint16_t)(d->rnd[d->rnd_left] | d->rnd[d->rnd_left + 1] << 8);
}

static socklen_t sa_len(const struct sockaddr *sa)
{
    return sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

static void sa_str(const struct sockaddr_storage *ss, char *buf, size_t n)
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
static bool sa_same(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
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
static int name_text(const ldns_rdf *r, char out[NAME_TXT])
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
static size_t header_reply(const uint8_t *pkt, uint8_t rcode, uint8_t *out)
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
 * (OUT_MAX bytes). When it would exceed q's limit the answers are left out
 * and TC set, so the client retries over TCP. *truncated tells which. */
static size_t build_reply(const query *q, uint8_t rcode, const ldns_rr_list *ans, uint8_t *out,
                          bool *truncated)
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
            int rc = pkt_wire(full, out, OUT_MAX, &len);
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

/* ---- the query path (shared by the resolver thread and the offline entry) ---------------- */

enum { ACT_DROP, ACT_REPLY, ACT_FORWARD };

static void refuse_cb(dsec__dns *d, const struct sockaddr *cl, const char *qname, uint16_t qtype,
                      const char *why)
{
    if (d->c.refused != NULL)
        d->c.refused(d->c.ud, cl, qname, qtype, why);
}

/* Parse pkt and apply the policy. ACT_REPLY: the reply is in out/outlen.
 * ACT_FORWARD: qq holds the query (the caller owns qq->q). ACT_DROP: nothing. */
static int decide(dsec__dns *d, const struct sockaddr *cl, const uint8_t *pkt, size_t len, bool tcp,
                  query *qq, uint8_t *out, size_t *outlen)
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
        *outlen = header_reply(pkt, LDNS_RCODE_REFUSED, out);
        STAT_ADD(d, refused);
        refuse_cb(d, cl, "", 0, "malformed");
        return ACT_REPLY;
    }
    ldns_pkt *q = NULL;
    if (qdcount != 1 || ldns_wire2pkt(&q, pkt, len) != LDNS_STATUS_OK || q == NULL ||
        ldns_pkt_qdcount(q) != 1 || ldns_rr_list_rr(ldns_pkt_question(q), 0) == NULL) {
        if (q != NULL)
            ldns_pkt_free(q);
        *outlen = header_reply(pkt, LDNS_RCODE_FORMERR, out);
        STAT_ADD(d, refused);
        refuse_cb(d, cl, "", 0, "malformed");
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
    if (name_text(ldns_rr_owner(qrr), qq->qname) < 0) {
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
    *outlen = build_reply(qq, LDNS_RCODE_REFUSED, NULL, out, &tc);
    if (*outlen == 0)
        *outlen = header_reply(pkt, LDNS_RCODE_REFUSED, out);
    STAT_ADD(d, refused);
    refuse_cb(d, cl, qq->qname, qq->qtype, why);
    ldns_pkt_free(q);
    qq->q = NULL;
    return ACT_REPLY;
}

static uint32_t ttl_clamp(uint32_t t)
{
    return t < TTL_MIN ? TTL_MIN : t > TTL_MAX ? TTL_MAX : t;
}

/* Keep from an upstream answer section only the chain that starts at the
 * query's name: CNAMEs whose owner is the current end of the chain (each
 * target must be allowed too), then the A/AAAA of the final name. Copies
 * go into *out (the caller frees it with ldns_rr_list_deep_free). Returns
 * -1 when the chain leaves the allowed names. */
static int chain_filter(dsec__dns *d, const struct sockaddr *cl, const query *q,
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
                name_text(ldns_rr_owner(rr), owner) == 0 && strcmp(owner, cur) == 0)
                cn = rr;
        }
        if (cn == NULL)
            break;
        if (hop == CNAME_HOPS)
            return -1; /* longer than we follow: treat as leaving */
        char target[NAME_TXT];
        if (name_text(ldns_rr_rdf(cn, 0), target) < 0 || !d->c.allowed(d->c.ud, cl, target))
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
        ldns_rr_set_ttl(c, ttl_clamp(ldns_rr_ttl(c)));
        ldns_rr_list_push_rr(out, c);
        snprintf(cur, sizeof cur, "%s", target);
    }
    for (size_t i = 0; i < n; i++) {
        const ldns_rr *rr = ldns_rr_list_rr(ans, i);
        if ((uint16_t)ldns_rr_get_type(rr) != q->qtype || ldns_rr_get_class(rr) != LDNS_RR_CLASS_IN)
            continue;
        const ldns_rdf *a = ldns_rr_rdf(rr, 0);
        size_t want = q->qtype == LDNS_RR_TYPE_A ? 4 : 16;
        if (a == NULL || ldns_rdf_size(a) != want || name_text(ldns_rr_owner(rr), owner) < 0 ||
            strcmp(owner, cur) != 0)
            continue;
        ldns_rr *c = ldns_rr_clone(rr);
        if (c == NULL)
            continue;
        ldns_rr_set_ttl(c, ttl_clamp(ldns_rr_ttl(c)));
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

static client *client_get(dsec__dns *d, const struct sockaddr *sa, uint64_t now)
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
    memcpy(&c->sa, sa, sa_len(sa));
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
static bool client_take(dsec__dns *d, client *c, uint64_t now)
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
        refuse_cb(d, (const struct sockaddr *)&c->sa, "", 0, "flood");
    }
    return false;
}

static void clients_sweep(dsec__dns *d, uint64_t nowms)
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
static void conn_send(dsec__dns *d, conn *c, const uint8_t *msg, size_t len)
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

/* ---- upstream ----------------------------------------------------------------------------- */

static void pend_unlink(dsec__dns *d, pend *p)
{
    if (p->prev != NULL)
        p->prev->next = p->next;
    else
        d->phead = p->next;
    if (p->next != NULL)
        p->next->prev = p->prev;
    else
        d->ptail = p->prev;
    d->by_id[p->up_id] = NULL;
    d->npend--;
    if (p->cl != NULL)
        p->cl->inflight--;
    if (p->tc != NULL)
        p->tc->npend--;
}

static void pend_free(pend *p)
{
    if (p->qq.q != NULL)
        ldns_pkt_free(p->qq.q);
    dsec_free(p);
}

/* Reply to the client of p (UDP or TCP); calls pin for every address in it first. */
static void pend_answer(dsec__dns *d, pend *p, uint8_t rcode, const ldns_rr_list *ans)
{
    if (p->tcp && p->tc == NULL)
        return; /* its connection is gone: nobody to pin for */
    uint8_t out[OUT_MAX];
    bool tc;
    size_t len = build_reply(&p->qq, rcode, ans, out, &tc);
    if (len == 0)
        return;
    if (!tc && ans != NULL && d->c.pin != NULL) {
        for (size_t i = 0; i < ldns_rr_list_rr_count(ans); i++) {
            const ldns_rr *rr = ldns_rr_list_rr(ans, i);
            ldns_rr_type t = ldns_rr_get_type(rr);
            if (t != LDNS_RR_TYPE_A && t != LDNS_RR_TYPE_AAAA)
                continue;
            const ldns_rdf *a = ldns_rr_rdf(rr, 0);
            d->c.pin(d->c.ud, (const struct sockaddr *)&p->peer, p->qq.qname,
                     t == LDNS_RR_TYPE_A ? AF_INET : AF_INET6, ldns_rdf_data(a), ldns_rr_ttl(rr));
        }
    }
    if (p->tc != NULL)
        conn_send(d, p->tc, out, len);
    else
        sendto(p->lfd, out, len, MSG_DONTWAIT, (const struct sockaddr *)&p->peer, p->peerlen);
}

static void reply_now(dsec__dns *d, int lfd, conn *tc, const struct sockaddr *peer,
                      const uint8_t *out, size_t len)
{
    if (tc != NULL)
        conn_send(d, tc, out, len);
    else
        sendto(lfd, out, len, MSG_DONTWAIT, peer, sa_len(peer));
}

/* Send qq upstream on behalf of client cl. Takes qq->q. */
static void forward(dsec__dns *d, client *cl, int lfd, conn *tc, const struct sockaddr *peer,
                    query *qq)
{
    uint8_t out[OUT_MAX];
    bool trunc;
    if (cl->inflight >= d->c.client_inflight || d->npend >= MAX_PENDING) {
        size_t len = build_reply(qq, LDNS_RCODE_SERVFAIL, NULL, out, &trunc);
        reply_now(d, lfd, tc, peer, out, len);
        ldns_pkt_free(qq->q);
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
    ldns_rdf *name = ldns_dname_new_frm_str(qq->qname[0] ? qq->qname : ".");
    ldns_pkt *uq =
        name != NULL ? ldns_pkt_query_new(name, qq->qtype, LDNS_RR_CLASS_IN, LDNS_RD) : NULL;
    if (uq != NULL) {
        ldns_pkt_set_id(uq, id);
        ldns_pkt_set_edns_udp_size(uq, EDNS_SIZE);
        if (ldns_pkt2wire(&w, uq, &wlen) != LDNS_STATUS_OK) {
            LDNS_FREE(w);
            w = NULL;
        }
        ldns_pkt_free(uq);
    } else if (name != NULL && uq == NULL) {
        ldns_rdf_deep_free(name);
    }
    pend *p = w != NULL && upfd >= 0 ? dsec_calloc(1, sizeof *p) : NULL;
    if (p == NULL || sendto(upfd, w, wlen, MSG_DONTWAIT, (const struct sockaddr *)up,
                            sa_len((const void *)up)) < 0) {
        LDNS_FREE(w);
        dsec_free(p);
        size_t len = build_reply(qq, LDNS_RCODE_SERVFAIL, NULL, out, &trunc);
        reply_now(d, lfd, tc, peer, out, len);
        ldns_pkt_free(qq->q);
        return;
    }
    LDNS_FREE(w);
    STAT_ADD(d, upstream_sent);
    p->qq = *qq;
    qq->q = NULL;
    p->cl = cl;
    p->tc = tc;
    p->tcp = tc != NULL;
    p->lfd = lfd;
    memcpy(&p->peer, peer, sa_len(peer));
    p->peerlen = sa_len(peer);
    p->up_id = id;
    p->upfd = upfd;
    p->upi = upi;
    p->deadline_ms = now_ms() + d->c.upstream_timeout_ms;
    p->prev = d->ptail;
    if (d->ptail != NULL)
        d->ptail->next = p;
    else
        d->phead = p;
    d->ptail = p;
    d->by_id[id] = p;
    d->npend++;
    cl->inflight++;
    if (tc != NULL)
        tc->npend++;
}

/* An upstream reply: accepted only from the server asked, on the socket
 * used, with the id and the exact question of a query in flight. */
static void upstream_reply(dsec__dns *d, int fd, const uint8_t *buf, size_t len,
                           const struct sockaddr_storage *src)
{
    if (len < 12)
        return;
    pend *p = d->by_id[(uint16_t)(buf[0] << 8 | buf[1])];
    if (p == NULL || p->upfd != fd || !sa_same(src, &d->c.upstream[p->upi]))
        return;
    ldns_pkt *r = NULL;
    if (ldns_wire2pkt(&r, buf, len) != LDNS_STATUS_OK || r == NULL)
        return;
    const ldns_rr *qrr = ldns_rr_list_rr(ldns_pkt_question(r), 0);
    char qn[NAME_TXT];
    if (!ldns_pkt_qr(r) || ldns_pkt_get_opcode(r) != LDNS_PACKET_QUERY ||
        ldns_pkt_qdcount(r) != 1 || qrr == NULL || (uint16_t)ldns_rr_get_type(qrr) != p->qq.qtype ||
        ldns_rr_get_class(qrr) != LDNS_RR_CLASS_IN || name_text(ldns_rr_owner(qrr), qn) < 0 ||
        strcmp(qn, p->qq.qname) != 0) {
        ldns_pkt_free(r);
        return;
    }
    pend_unlink(d, p);
    const struct sockaddr *cl = (const struct sockaddr *)&p->peer;
    ldns_pkt_rcode rc = ldns_pkt_get_rcode(r);
    if (ldns_pkt_tc(r) || (rc != LDNS_RCODE_NOERROR && rc != LDNS_RCODE_NXDOMAIN)) {
        pend_answer(d, p, LDNS_RCODE_SERVFAIL, NULL);
    } else {
        ldns_rr_list *ans = ldns_rr_list_new();
        if (ans == NULL) {
            pend_answer(d, p, LDNS_RCODE_SERVFAIL, NULL);
        } else if (chain_filter(d, cl, &p->qq, ldns_pkt_answer(r), ans) < 0) {
            STAT_ADD(d, refused);
            refuse_cb(d, cl, p->qq.qname, p->qq.qtype, "cname");
            pend_answer(d, p, LDNS_RCODE_REFUSED, NULL);
        } else {
            STAT_ADD(d, answered);
            pend_answer(d, p, (uint8_t)rc, ans);
        }
        if (ans != NULL)
            ldns_rr_list_deep_free(ans);
    }
    ldns_pkt_free(r);
    pend_free(p);
}

static void pend_expire(dsec__dns *d, uint64_t nowms)
{
    while (d->phead != NULL && d->phead->deadline_ms <= nowms) {
        pend *p = d->phead;
        pend_unlink(d, p);
        STAT_ADD(d, upstream_timeouts);
        pend_answer(d, p, LDNS_RCODE_SERVFAIL, NULL);
        pend_free(p);
    }
}

/* ---- receiving ---------------------------------------------------------------------------- */

/* One query from a client over UDP (lfd) or TCP (tc). */
static void client_query(dsec__dns *d, int lfd, conn *tc, const struct sockaddr *peer,
                         const uint8_t *pkt, size_t len)
{
    STAT_ADD(d, queries);
    uint64_t now = now_us();
    client *cl = tc != NULL ? tc->cl : client_get(d, peer, now);
    if (cl == NULL) {
        STAT_ADD(d, dropped);
        return;
    }
    if (!client_take(d, cl, now))
        return;
    uint8_t out[OUT_MAX];
    size_t outlen = 0;
    query qq;
    switch (decide(d, peer, pkt, len, tc != NULL, &qq, out, &outlen)) {
    case ACT_REPLY:
        reply_now(d, lfd, tc, peer, out, outlen);
        break;
    case ACT_FORWARD:
        forward(d, cl, lfd, tc, peer, &qq);
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
        upstream_reply(d, fd, d->upbuf, (size_t)n, &src);
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
        for (pend *p = d->phead; p != NULL; p = p->next)
            if (p->tc == c)
                p->tc = NULL;
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
        uint64_t now = now_us();
        client *cl = (peer.ss_family == AF_INET || peer.ss_family == AF_INET6)
                         ? client_get(d, (const struct sockaddr *)&peer, now)
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
    c->seen_ms = now_ms();
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

/* ---- the thread --------------------------------------------------------------------------- */

static void *dns_thread(void *arg)
{
    dsec__dns *d = arg;
    struct epoll_event evs[64];
    bool stop = false;
    while (!stop) {
        uint64_t nowms = now_ms();
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
        nowms = now_ms();
        pend_expire(d, nowms);
        if (nowms >= d->next_sweep_ms) {
            conns_sweep(d, nowms);
            clients_sweep(d, nowms);
            d->next_sweep_ms = nowms + SWEEP_MS;
        }
        while (d->dead != NULL) {
            conn *c = d->dead;
            d->dead = c->next;
            dsec_free(c->wbuf);
            dsec_free(c);
        }
    }
    return NULL;
}

/* ---- set-up ------------------------------------------------------------------------------- */

static int sock_listen(const struct sockaddr_storage *a, int type, dsec_err *err)
{
    int one = 1;
    char as[64];
    sa_str(a, as, sizeof as);
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
    if (bind(fd, (const struct sockaddr *)a, sa_len((const struct sockaddr *)a)) < 0) {
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
    d->epfd = d->stop.fd = -1;
    if (c->nlisten == 0) {
        *out = d; /* offline: the query path only */
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
    for (size_t i = 0; i < c->nlisten; i++) {
        int fam = c->listen[i].ss_family;
        int fd = sock_listen(&c->listen[i], SOCK_STREAM, err);
        if (fd < 0)
            goto fail;
        d->tcpl[d->ntcpl++] = (evsrc){.kind = EV_TCPL, .fd = fd, .family = fam};
        if (ep_add(d, &d->tcpl[d->ntcpl - 1], err) < 0)
            goto fail;
        size_t first = d->nudp;
        for (int k = 0; k < UDP_SHARDS; k++) {
            fd = sock_listen(&c->listen[i], SOCK_DGRAM, err);
            if (fd < 0)
                goto fail;
            d->udp[d->nudp++] = (evsrc){.kind = EV_UDP, .fd = fd, .family = fam};
            if (ep_add(d, &d->udp[d->nudp - 1], err) < 0)
                goto fail;
        }
        shard_by_client(d->udp[first].fd, fam);
    }
    /* upstream: UP_SOCKS sockets per family in use, each on an ephemeral port
     * the kernel picks at random; every query goes out on a random one */
    for (int fam = AF_INET; fam <= AF_INET6; fam += AF_INET6 - AF_INET) {
        bool used = false;
        for (size_t i = 0; i < c->nupstream; i++)
            used |= c->upstream[i].ss_family == fam;
        for (int k = 0; used && k < UP_SOCKS; k++) {
            int fd = socket(fam, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (fd < 0) {
                dsec_err_set(err, DSEC_E_IO, errno, "dns: upstream socket (%s)",
                             fam == AF_INET ? "IPv4" : "IPv6");
                goto fail;
            }
            int sz = 1 << 20;
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
            d->up[d->nup++] = (evsrc){.kind = EV_UP, .fd = fd, .family = fam};
            if (ep_add(d, &d->up[d->nup - 1], err) < 0)
                goto fail;
        }
    }
    d->next_sweep_ms = now_ms() + SWEEP_MS;
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
    while (d->phead != NULL) {
        pend *p = d->phead;
        pend_unlink(d, p);
        pend_free(p);
    }
    while (d->conns != NULL)
        conn_close(d, d->conns);
    while (d->dead != NULL) {
        conn *c = d->dead;
        d->dead = c->next;
        dsec_free(c->wbuf);
        dsec_free(c);
    }
    for (size_t i = 0; i < CLIENT_BUCKETS; i++)
        while (d->ctab[i] != NULL) {
            client *c = d->ctab[i];
            d->ctab[i] = c->next;
            dsec_free(c);
        }
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
    int act = decide(d, cl, pkt, len, false, &qq, out, &outlen);
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
