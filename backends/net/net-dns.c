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
#define TCP_WBUF_MAX (2u << 16) /* unread replies queued per connection before it is closed */
#define MAX_QUERY 1500u        /* largest client query accepted */
#define OUT_MAX 4096u          /* largest reply built on the stack (refusals, SERVFAIL) */
#define UP_TCP_MAX 64u         /* TCP connections to upstreams at once (truncated answers) */
#define DEF_CACHE_ENTRIES 10000u
#define DEF_CACHE_BYTES (16u << 20)
#define NEG_TTL_MIN 5u /* seconds a NXDOMAIN/NODATA is cached, from the SOA's minimum */
#define NEG_TTL_MAX 60u
#define KEY_BUCKETS 4096u      /* in-flight queries by (name, type), for coalescing */
#define UDP_BATCH 32           /* packets read per socket per turn of the loop */
#define UDP_SHARDS 8           /* UDP sockets per listen address, chosen by client address */
#define UP_SOCKS 4             /* upstream sockets per family, each on its own random port */
#define NAME_TXT 256           /* a name as text, with its NUL */
#define RCVBUF_BYTES (2 << 20) /* per shard */

typedef enum ev_kind { EV_STOP, EV_UDP, EV_TCPL, EV_UP, EV_CONN, EV_UPTCP } ev_kind;

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

/* One upstream query in flight, or (waiter) a client's identical query
 * waiting on one: a waiter has only the client's half (qq, cl, tc, lfd, tcp,
 * peer) and is linked by next from its query's waiters. */
struct pend {
    evsrc tev;         /* the TCP connection to the upstream (EV_UPTCP), fd -1 when none */
    pend *prev, *next; /* in deadline order (the timeout is the same for all) */
    pend *knext;       /* chain of key_tab */
    pend *waiters;
    uint32_t key; /* key_hash of (qname, qtype) */
    bool dead;    /* finished; freed after this turn of the loop */
    query qq;
    client *cl;
    conn *tc; /* TCP client, or NULL */
    int lfd;  /* UDP listener it came in on (when tc is NULL and !tcp) */
    bool tcp;
    struct sockaddr_storage peer;
    uint16_t up_id;
    int upfd;
    size_t upi; /* which upstream */
    uint64_t deadline_ms;
    /* over TCP: the framed query while it is sent, then the reply */
    uint8_t *tbuf;
    size_t tlen, toff;
    uint8_t thdr[2];
    size_t thlen;
    bool tsent;
};

/* One cached upstream answer. */
typedef struct centry centry;
struct centry {
    centry *hnext;         /* bucket chain */
    centry *lprev, *lnext; /* LRU order, most recent first */
    uint32_t key;
    uint16_t qtype;
    uint8_t rcode;     /* NOERROR or NXDOMAIN */
    ldns_rr_list *rrs; /* IN A/AAAA/CNAME of the answer section, TTLs clamped */
    uint64_t stored_ms, expires_ms;
    size_t bytes;
    char name[];
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
    pend *key_tab[KEY_BUCKETS];
    size_t nwait;  /* waiters, all queries */
    size_t nuptcp; /* TCP connections to upstreams */
    pend *pdead;   /* finished queries whose TCP events may still be queued */

    centry **cache; /* cbuckets chains (a power of two) */
    size_t cbuckets, centries, cbytes;
    centry *lru_head, *lru_tail;

    uint8_t rnd[256];
    size_t rnd_left;
    uint8_t hkey[16]; /* key_hash's */

    dsec__dns_stats st; /* updated with atomics: read from other threads */

    /* receive buffers of the resolver thread */
    struct mmsghdr msgs[UDP_BATCH];
    struct iovec iov[UDP_BATCH];
    struct sockaddr_storage from[UDP_BATCH];
    uint8_t rx[UDP_BATCH][MAX_QUERY];
    uint8_t upbuf[65536];
    uint8_t obuf[65535]; /* replies to answered queries (TCP clients take up to 64 KiB) */
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
 * (cap bytes, at least OUT_MAX). When it would exceed q's limit the answers
 * are left out and TC set, so the client retries over TCP. *truncated tells
 * which. */
static size_t build_reply(const query *q, uint8_t rcode, const ldns_rr_list *ans, uint8_t *out,
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
    *outlen = build_reply(qq, LDNS_RCODE_REFUSED, NULL, out, OUT_MAX, &tc);
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

static uint32_t key_hash(const dsec__dns *d, const char *name, uint16_t qtype)
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
static ldns_rr_list *cache_get(dsec__dns *d, uint32_t key, const query *q, uint64_t nowms,
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
static void cache_put(dsec__dns *d, uint32_t key, const query *q, const ldns_pkt *r, uint64_t nowms)
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
        uint32_t ct = ttl_clamp(ldns_rr_ttl(c));
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
static void cache_sweep(dsec__dns *d, uint64_t nowms)
{
    while (d->lru_tail != NULL && nowms >= d->lru_tail->expires_ms)
        centry_remove(d, d->lru_tail);
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

static void reply_now(dsec__dns *d, int lfd, conn *tc, const struct sockaddr *peer,
                      const uint8_t *out, size_t len)
{
    if (tc != NULL)
        conn_send(d, tc, out, len);
    else
        sendto(lfd, out, len, MSG_DONTWAIT, peer, sa_len(peer));
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
        } else if (chain_filter(d, peer, qq, raw, ans) < 0) {
            STAT_ADD(d, refused);
            refuse_cb(d, peer, qq->qname, qq->qtype, "cname");
            rcode = LDNS_RCODE_REFUSED;
            ldns_rr_list_deep_free(ans);
            ans = NULL;
        } else {
            STAT_ADD(d, answered);
        }
    }
    bool trunc = false;
    size_t len = build ? build_reply(qq, rcode, ans, out, cap, &trunc) : 0;
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
        reply_now(d, lfd, tc, peer, d->obuf, len);
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
    cache_put(d, p->key, &p->qq, r, now_ms());
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
    size_t len = build_reply(qq, LDNS_RCODE_SERVFAIL, NULL, out, sizeof out, &trunc);
    if (len > 0)
        reply_now(d, lfd, tc, peer, out, len);
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
    memcpy(&p->peer, peer, sa_len(peer));
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
    ldns_rr_list *hit = cache_get(d, key, qq, now_ms(), &rc);
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
static void forward(dsec__dns *d, client *cl, int lfd, conn *tc, const struct sockaddr *peer,
                    query *qq)
{
    uint32_t key = key_hash(d, qq->qname, qq->qtype);
    size_t len = 0;
    if (cache_answer(d, key, qq, peer, d->obuf, sizeof d->obuf, &len)) {
        if (len > 0)
            reply_now(d, lfd, tc, peer, d->obuf, len);
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
                            sa_len((const void *)up)) < 0) {
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
    p->deadline_ms = now_ms() + d->c.upstream_timeout_ms;
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
        ldns_rr_get_class(qrr) != LDNS_RR_CLASS_IN || name_text(ldns_rr_owner(qrr), qn) < 0 ||
        strcmp(qn, p->qq.qname) != 0) {
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
    if (connect(fd, (const struct sockaddr *)up, sa_len((const void *)up)) < 0 &&
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
    p->deadline_ms = now_ms() + d->c.upstream_timeout_ms;
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
static void up_tcp_event(dsec__dns *d, pend *p, uint32_t events)
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
static void upstream_reply(dsec__dns *d, int fd, const uint8_t *buf, size_t len,
                           const struct sockaddr_storage *src)
{
    if (len < 12)
        return;
    pend *p = d->by_id[(uint16_t)(buf[0] << 8 | buf[1])];
    if (p == NULL || p->upfd != fd || !sa_same(src, &d->c.upstream[p->upi]))
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

static void pend_expire(dsec__dns *d, uint64_t nowms)
{
    while (d->phead != NULL && d->phead->deadline_ms <= nowms) {
        pend *p = d->phead;
        pend_unlink(d, p);
        STAT_ADD(d, upstream_timeouts);
        pend_done(d, p, NULL);
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
            case EV_UPTCP:
                up_tcp_event(d, (pend *)s, evs[i].events);
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
            cache_sweep(d, nowms);
            d->next_sweep_ms = nowms + SWEEP_MS;
        }
        while (d->pdead != NULL) {
            pend *p = d->pdead;
            d->pdead = p->next;
            pend_free(d, p);
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
        while (p->waiters != NULL) {
            pend *w = p->waiters;
            p->waiters = w->next;
            pend_free(d, w);
        }
        pend_free(d, p);
    }
    while (d->pdead != NULL) {
        pend *p = d->pdead;
        d->pdead = p->next;
        pend_free(d, p);
    }
    while (d->lru_head != NULL)
        centry_remove(d, d->lru_head);
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
    int act = decide(d, cl, pkt, len, client_tcp, &qq, d->obuf, &n);
    if (act == ACT_FORWARD) {
        /* forward(), with the upstream asked under the client's own id */
        uint32_t key = key_hash(d, qq.qname, qq.qtype);
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
