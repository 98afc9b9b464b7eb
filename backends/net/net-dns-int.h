/* net-dns-int.h - internals of the node-local resolver shared by the net-dns*.c files. */
#ifndef DSEC_BACKENDS_NET_DNS_INT_H
#define DSEC_BACKENDS_NET_DNS_INT_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>

#include <ldns/ldns.h>

#include "backends/net/net-int.h"

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
#define MAX_QUERY 1500u         /* largest client query accepted */
#define OUT_MAX 4096u           /* largest reply built on the stack (refusals, SERVFAIL) */
#define UP_TCP_MAX 64u          /* TCP connections to upstreams at once (truncated answers) */
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

static inline uint64_t dsec__dns_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static inline uint64_t dsec__dns_now_ms(void)
{
    return dsec__dns_now_us() / 1000u;
}

/* What the query path decides for one query (dsec__dns_decide). */
enum { ACT_DROP, ACT_REPLY, ACT_FORWARD };

/* ---- net-dns-wire.c: addresses, names, replies -------------------------------------------------
 */
socklen_t dsec__dns_sa_len(const struct sockaddr *sa);
void dsec__dns_sa_str(const struct sockaddr_storage *ss, char *buf, size_t n);
/* Address and port equal (for matching upstream replies to the server asked). */
bool dsec__dns_sa_same(const struct sockaddr_storage *a, const struct sockaddr_storage *b);
/* The name in r as lower-case text without the trailing dot; -1 when it
 * holds anything but letters, digits, '-' and '_' (see the top comment). */
int dsec__dns_name_text(const ldns_rdf *r, char out[NAME_TXT]);
/* A reply of only a header: for queries whose question cannot be read. */
size_t dsec__dns_header_reply(const uint8_t *pkt, uint8_t rcode, uint8_t *out);
/* Build the reply to q with rcode and copies of ans (may be NULL) into out
 * (cap bytes, at least OUT_MAX). When it would exceed q's limit the answers
 * are left out and TC set, so the client retries over TCP. *truncated tells
 * which. */
size_t dsec__dns_build_reply(const query *q, uint8_t rcode, const ldns_rr_list *ans, uint8_t *out,
                             size_t cap, bool *truncated);

/* ---- net-dns-policy.c: the query path, the answer filter, clients ------------------------------
 */
void dsec__dns_refuse_cb(dsec__dns *d, const struct sockaddr *cl, const char *qname, uint16_t qtype,
                         const char *why);
/* Parse pkt and apply the policy. ACT_REPLY: the reply is in out/outlen.
 * ACT_FORWARD: qq holds the query (the caller owns qq->q). ACT_DROP: nothing. */
int dsec__dns_decide(dsec__dns *d, const struct sockaddr *cl, const uint8_t *pkt, size_t len,
                     bool tcp, query *qq, uint8_t *out, size_t *outlen);
uint32_t dsec__dns_ttl_clamp(uint32_t t);
/* Keep from an upstream answer section only the chain that starts at the
 * query's name: CNAMEs whose owner is the current end of the chain (each
 * target must be allowed too), then the A/AAAA of the final name. Copies
 * go into *out (the caller frees it with ldns_rr_list_deep_free). Returns
 * -1 when the chain leaves the allowed names. */
int dsec__dns_chain_filter(dsec__dns *d, const struct sockaddr *cl, const query *q,
                           const ldns_rr_list *ans, ldns_rr_list *out);
client *dsec__dns_client_get(dsec__dns *d, const struct sockaddr *sa, uint64_t now);
/* One token from the client's bucket; false when it is empty (then the
 * packet is dropped, and "flood" reported at most once a second). */
bool dsec__dns_client_take(dsec__dns *d, client *c, uint64_t now);
void dsec__dns_clients_sweep(dsec__dns *d, uint64_t nowms);
/* Free every client (the resolver is being freed). */
void dsec__dns_clients_free(dsec__dns *d);

/* ---- net-dns-cache.c: the cache ----------------------------------------------------------------
 */
uint32_t dsec__dns_key_hash(const dsec__dns *d, const char *name, uint16_t qtype);
/* A copy of the cached answer to q (the caller frees it with
 * ldns_rr_list_deep_free) with its TTLs counted down, and its rcode; NULL
 * when there is none or it has expired. */
ldns_rr_list *dsec__dns_cache_get(dsec__dns *d, uint32_t key, const query *q, uint64_t nowms,
                                  uint8_t *rcode);
/* Keep the upstream's answer r to q (NOERROR or NXDOMAIN): its IN A, AAAA
 * and CNAME records with clamped TTLs, until the first of them expires (a
 * negative answer: per neg_ttl). Least recently used entries go first when
 * over the bounds. */
void dsec__dns_cache_put(dsec__dns *d, uint32_t key, const query *q, const ldns_pkt *r,
                         uint64_t nowms);
/* Give back the memory of expired entries that nobody asks for any more
 * (those at the cold end; the others go when asked or evicted). */
void dsec__dns_cache_sweep(dsec__dns *d, uint64_t nowms);
/* Drop every entry (the resolver is being freed). */
void dsec__dns_cache_clear(dsec__dns *d);

/* ---- net-dns-upstream.c: queries in flight -----------------------------------------------------
 */
void dsec__dns_reply_now(dsec__dns *d, int lfd, conn *tc, const struct sockaddr *peer,
                         const uint8_t *out, size_t len);
/* Answer qq from the cache, or join an identical query in flight, or send
 * it upstream on behalf of client cl. Takes qq->q. */
void dsec__dns_forward(dsec__dns *d, client *cl, int lfd, conn *tc, const struct sockaddr *peer,
                       query *qq);
/* The TCP connection of p: send the query, then read one framed reply (at
 * most 65535 bytes by its framing). Over TCP only the server asked can
 * write, so a reply that does not match is SERVFAIL, not ignored. */
void dsec__dns_up_tcp_event(dsec__dns *d, pend *p, uint32_t events);
/* An upstream reply over UDP: accepted only from the server asked, on the
 * socket used, with the id and the exact question of a query in flight. A
 * truncated one sends the query to TCP. */
void dsec__dns_upstream_reply(dsec__dns *d, int fd, const uint8_t *buf, size_t len,
                              const struct sockaddr_storage *src);
void dsec__dns_pend_expire(dsec__dns *d, uint64_t nowms);
/* Free the queries finished this turn of the loop. */
void dsec__dns_pend_reap(dsec__dns *d);
/* Free every query in flight and its waiters, unanswered (the resolver is being freed). */
void dsec__dns_pend_free_all(dsec__dns *d);

/* ---- net-dns.c: client connections -------------------------------------------------------------
 */
/* Queue one reply, length-framed; a client that does not read its replies
 * is closed rather than buffered for without bound. */
void dsec__dns_conn_send(dsec__dns *d, conn *c, const uint8_t *msg, size_t len);
#endif
