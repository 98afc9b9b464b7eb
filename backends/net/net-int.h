/* net-int.h - internals of network containment shared by its files: link plumbing, nftables, the
 * DNS resolver. */
#ifndef DSEC_BACKENDS_NET_INT_H
#define DSEC_BACKENDS_NET_INT_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "dsec/err.h"

/*
 * The model (docs/network.md):
 *
 *  - Each sandbox gets its own network namespace, bind-mounted on a file so
 *    that a runtime (crun, QEMU) can join it by path. Inside: `lo` and `eth0`,
 *    one veth pair whose host side is named by the node (dsvTTIIIIII: node
 *    tag TT, sandbox index IIIIII, both hex). eth0 holds the sandbox's /32
 *    (and /128) with a default route to the gateway, which is the first
 *    address of the node's pool and sits on the host's loopback; the veth
 *    ends know each other's MAC.
 *  - One nftables table per node (inet dsec_TT) decides every packet a
 *    sandbox sends: a verdict map keyed by the host-side veth jumps to that
 *    sandbox's own chain, which checks its own small sets. The cost per
 *    packet does not grow with the number of sandboxes.
 *  - A node-local DNS resolver listening on the gateway answers only names
 *    the sandbox's policy allows and pins their addresses into its sets.
 *
 * Threading: the link and nft functions are called from several threads at
 * once (sandbox actors of different sandboxes, the resolver thread pinning);
 * each implementation makes its calls thread-safe (a netlink socket per
 * call, or one under a mutex). The callbacks a resolver or log reader calls
 * run on that component's own thread.
 */

/* ---- net-link.c: netns, veth, addresses, routes (rtnetlink through libmnl) ------------------ */

typedef struct dsec__net_link_spec {
    const char *netns_path; /* file to bind-mount the new namespace on (created; must not exist) */
    const char *host_if;    /* host-side veth name, <= 15 bytes */
    struct in_addr gw4;     /* gateway (on the host's lo): default route inside */
    struct in_addr addr4;   /* the sandbox's address: /32 on eth0, host route via host_if */
    bool v6;                /* also IPv6: */
    struct in6_addr gw6;    /* gateway (on the host's lo), default route inside */
    struct in6_addr addr6;  /* sandbox's /128 on eth0 (nodad), host route via host_if */
    uint32_t mtu;           /* 0: the kernel's default */
} dsec__net_link_spec;

/* Prepare the host once per node: IPv4 (and IPv6 when v6) forwarding on.
 * Idempotent. */
int dsec__net_link_host_prepare(bool v6, dsec_err *err);

/* The gateway's addresses on the host's loopback (gw6 may be NULL), which
 * the sandboxes reach through their veths (each veth end holds a permanent
 * neighbour entry for the other, so no veth needs an address: the same
 * address on thousands of interfaces would make every address add scan them
 * all). Idempotent; _del removes them (absent ones are fine). */
int dsec__net_link_gateway(const struct in_addr *gw4, const struct in6_addr *gw6, dsec_err *err);
int dsec__net_link_gateway_del(const struct in_addr *gw4, const struct in6_addr *gw6,
                               dsec_err *err);

/* Create the namespace (with lo up), bind-mount it on netns_path, create the
 * veth pair with the peer inside named eth0, set addresses, routes and links
 * up on both sides. On failure nothing of it is left behind. *ifindex_out
 * (may be NULL) gets the host side's ifindex. Safe to call from any thread
 * of a multithreaded process (the calling thread's namespace is restored). */
int dsec__net_link_create(const dsec__net_link_spec *s, int *ifindex_out, dsec_err *err);

/* Remove the host-side veth (its peer goes with it), unmount and unlink
 * netns_path. Either may be NULL. Missing pieces are not an error (so a
 * half-created or already-removed sandbox is cleaned by the same call). */
int dsec__net_link_destroy(const char *netns_path, const char *host_if, dsec_err *err);

/* The ifindex of a host interface, 0 when there is none. */
int dsec__net_link_ifindex(const char *ifname);

/* Names of host interfaces starting with prefix (for sweeping leftovers of
 * a previous run). *names_out: dsec_malloc'd array of dsec_malloc'd
 * strings, freed by the caller with dsec__net_strv_free. */
int dsec__net_link_list(const char *prefix, char ***names_out, size_t *n_out, dsec_err *err);
void dsec__net_strv_free(char **v, size_t n);

/* The fixed MACs of the veth ends of the sandbox with address a4: host side,
 * and the sandbox's eth0 (which each end holds a permanent neighbour entry for). */
void dsec__net_link_macs(const struct in_addr *a4, uint8_t host[6], uint8_t peer[6]);

/* A VM's NIC in the namespace bind-mounted on netns_path: remove a previous
 * tap of that name (a file still attached to it is left dead: reads and
 * writes fail with EBADFD) and eth0's old redirect, create the tap
 * (IFF_TAP | IFF_NO_PI), turn IPv6 off on it and on eth0 (the namespace's
 * own stack has nothing to say on the guest's link), bring it up, and
 * redirect every frame arriving on either of eth0 and the tap out of the
 * other (ingress qdiscs, u32 match-all, mirred egress redirect), so the
 * namespace's stack sees none. *fd_out: the tap's /dev/net/tun file
 * (O_CLOEXEC, blocking), the caller's to close; the tap lives while any copy
 * of it is open, and once it is gone eth0's redirect drops frames. On
 * failure no tap and no redirect is left. The work runs on a thread of its
 * own that joins the namespace; the caller's thread never changes namespace. */
int dsec__net_link_guest(const char *netns_path, const char *tap, int *fd_out, dsec_err *err);

/* ---- net-nft.c: the node's nftables table (libnftnl + libmnl) ------------------------------ */

typedef struct dsec__nft dsec__nft;

typedef struct dsec__nft_conf {
    const char *table;    /* "dsec_TT"; a stale table of that name is replaced */
    struct in_addr gw4;   /* the resolver listens here */
    struct in_addr pool4; /* the node's sandbox pool (network address) */
    uint8_t pool4_len;    /* its prefix length */
    bool v6;
    struct in6_addr gw6;
    struct in6_addr pool6;
    uint8_t pool6_len;
    uint16_t dns_port;  /* 53 */
    bool masquerade;    /* SNAT sandbox traffic leaving by a non-sandbox interface */
    uint16_t log_group; /* NFLOG group for blocked packets */
    uint32_t log_rate;  /* blocked packets logged per second per sandbox (kernel limit) */
    uint32_t dns_rate;  /* DNS packets per second per sandbox to the resolver (kernel meter) */
    uint32_t conn_rate; /* new connections per second per sandbox */
    /* Extra destinations no sandbox ever reaches, whatever its policy
     * (beyond the built-in: the pool, loopback, link-local incl.
     * 169.254.169.254, fd00:ec2::254, multicast). CIDR strings. */
    const char *const *deny;
    size_t ndeny;
} dsec__nft_conf;

/* One allow entry of a sandbox. */
typedef struct dsec__nft_elem {
    int family;       /* AF_INET or AF_INET6 */
    uint8_t addr[16]; /* network address (4 bytes used for AF_INET) */
    uint8_t prefix;   /* prefix length: 32 / 128 for one address */
    uint8_t proto;    /* IPPROTO_TCP, IPPROTO_UDP, IPPROTO_ICMP / IPPROTO_ICMPV6 */
    uint16_t port_lo; /* destination port range (TCP/UDP); 0..65535 for all */
    uint16_t port_hi;
    uint32_t timeout_ms; /* 0: until removed; else expires (DNS pins, for the TTL) */
} dsec__nft_elem;

/* Create (replacing any stale one) the table with its chains, maps and
 * rules. *out freed by dsec__nft_free. */
int dsec__nft_new(dsec__nft **out, const dsec__nft_conf *c, dsec_err *err);

/* Free; the table is deleted from the kernel when remove_table (else it
 * stays, so sandboxes stay contained across a node restart). NULL: no-op. */
void dsec__nft_free(dsec__nft *t, bool remove_table);

/* Add one sandbox in one atomic batch: its chain and sets, its veth in the
 * verdict map and the sandbox interface set, its (veth, address) pairs in
 * the anti-spoof sets, and its initial allow entries. Idempotent for an idx
 * already present (re-adopting after a restart): its entries are replaced. */
int dsec__nft_sbx_add(dsec__nft *t, uint32_t idx, const char *ifname, const struct in_addr *a4,
                      const struct in6_addr *a6, const dsec__nft_elem *e, size_t n, dsec_err *err);

/* Remove everything of one sandbox (missing pieces are not an error). */
int dsec__nft_sbx_del(dsec__nft *t, uint32_t idx, const char *ifname, const struct in_addr *a4,
                      const struct in6_addr *a6, dsec_err *err);

/* Replace a sandbox's allow entries atomically (flush its sets, add e). */
int dsec__nft_sbx_replace(dsec__nft *t, uint32_t idx, const dsec__nft_elem *e, size_t n,
                          dsec_err *err);

/* Add entries (an element already present gets its timeout refreshed). */
int dsec__nft_sbx_pin(dsec__nft *t, uint32_t idx, const dsec__nft_elem *e, size_t n, dsec_err *err);

/* Delete the conntrack entries whose original source is src (4 or 16 bytes
 * by family) and for which keep() returns false, so that removing an allow
 * entry also cuts the connections it let through. */
int dsec__nft_ct_cut(int family, const uint8_t *src,
                     bool (*keep)(void *ud, int family, const uint8_t *dst, uint8_t proto,
                                  uint16_t dport),
                     void *ud, dsec_err *err);

/* A packet a sandbox was not allowed to send (read from NFLOG). */
typedef struct dsec__nft_block {
    uint32_t idx; /* the sandbox (from the log prefix) */
    int family;
    uint8_t dst[16];
    uint8_t proto;
    uint16_t dport; /* 0 when the protocol has no ports */
} dsec__nft_block;

/* Start a thread reading the table's NFLOG group; fn runs on it for every
 * blocked packet. Stopped by dsec__nft_free. */
int dsec__nft_log_start(dsec__nft *t, void (*fn)(void *ud, const dsec__nft_block *b), void *ud,
                        dsec_err *err);

/* ---- net-dns.c: the node-local resolver (ldns) ---------------------------------------------- */

typedef struct dsec__dns dsec__dns;

typedef struct dsec__dns_conf {
    struct sockaddr_storage
        listen[2]; /* the gateway addresses with the DNS port; bound with FREEBIND */
    size_t nlisten;
    struct sockaddr_storage upstream[4]; /* where allowed queries go */
    size_t nupstream;
    uint32_t upstream_timeout_ms; /* 0: 2000 */
    uint32_t client_qps;          /* per client address; 0: 100 */
    uint32_t client_burst;        /* 0: 2 * client_qps */
    uint32_t client_inflight;     /* upstream queries in flight per client; 0: 32 */
    uint32_t cache_entries;       /* upstream answers cached, node-wide; 0: 10000 */
    size_t cache_bytes;           /* and their size, roughly; 0: 16 MiB */
    /* The policy, called on the resolver thread. name: lower case, without
     * the trailing dot. True when this client may resolve name. An address
     * that is no sandbox's gets false. */
    bool (*allowed)(void *ud, const struct sockaddr *client, const char *name);
    /* Called for every address about to be returned, before the reply is
     * sent (so a connect right after it succeeds). qname: the name the
     * client asked (the head of a CNAME chain). */
    void (*pin)(void *ud, const struct sockaddr *client, const char *qname, int family,
                const uint8_t *addr, uint32_t ttl);
    /* A refused query. why: "denied" (name not allowed), "type" (not A or
     * AAAA), "cname" (the chain leaves the allowed names), "flood" (over the
     * client's rate), "malformed". qname may be "" when unparseable. */
    void (*refused)(void *ud, const struct sockaddr *client, const char *qname, uint16_t qtype,
                    const char *why);
    void *ud;
} dsec__dns_conf;

typedef struct dsec__dns_stats {
    uint64_t queries;           /* packets received */
    uint64_t answered;          /* replies with addresses or an upstream NXDOMAIN/NODATA */
    uint64_t refused;           /* REFUSED replies (denied, type, cname, malformed) */
    uint64_t dropped;           /* not answered at all (flood, unparseable header) */
    uint64_t upstream_sent;     /* queries sent over UDP */
    uint64_t upstream_timeouts; /* of those, unanswered in time (over UDP or TCP) */
    uint64_t upstream_tcp;      /* truncated UDP answers asked again over TCP */
    uint64_t cache_hits;        /* allowed queries answered from the cache */
    uint64_t cache_misses;      /* allowed queries not in the cache */
    uint64_t cache_evictions;   /* entries dropped for room (not for expiry) */
    uint64_t cache_entries;     /* entries now */
    uint64_t coalesced;         /* misses that joined an identical query in flight */
} dsec__dns_stats;

/* Bind the listeners and start the resolver thread. *out freed by
 * dsec__dns_free (which stops the thread). */
int dsec__dns_new(dsec__dns **out, const dsec__dns_conf *c, dsec_err *err);
void dsec__dns_free(dsec__dns *d);
void dsec__dns_stats_get(dsec__dns *d, dsec__dns_stats *out);

/* The query path without sockets, for the fuzz harness: parse pkt as a
 * query from client and produce the reply the resolver would send at once
 * (REFUSED and friends) into *reply (dsec_malloc'd, caller frees), or set
 * *reply NULL when it would forward upstream or drop. Never crashes on any
 * input. d may be a resolver made with nlisten == 0 (no sockets, no thread). */
int dsec__dns_query_offline(dsec__dns *d, const struct sockaddr *client, const uint8_t *pkt,
                            size_t len, uint8_t **reply, size_t *reply_len);

/* Flags of dsec__dns_upstream_offline. */
enum {
    DSEC__DNS_OFFLINE_CLIENT_TCP = 1,   /* the client asked over TCP (replies up to 64 KiB) */
    DSEC__DNS_OFFLINE_UPSTREAM_TCP = 2, /* up is the reply read over TCP after a truncated one */
};

/* The upstream path without sockets, for the fuzz harness and tests: pkt
 * goes through the query path as from client; when the resolver would ask
 * the upstream (not answered from the cache), up (uplen <= 65535 bytes) is
 * taken as the reply of the upstream asked, as it comes: the upstream query
 * carries pkt's own id, and a reply whose id or question does not match is
 * ignored over UDP (the query then times out: SERVFAIL) and SERVFAIL over
 * TCP. A truncated UDP reply ends as SERVFAIL (the TCP reply is another
 * call's, with DSEC__DNS_OFFLINE_UPSTREAM_TCP). The answer is cached, the
 * pin and refused callbacks run and the stats count, as on the resolver
 * thread. The reply the client would get goes into out (cap bytes;
 * *out_len 0 when it gets none). -1 for bad arguments, a reply larger than
 * cap, or a resolver whose thread runs (d must be made with nlisten == 0;
 * one call at a time). */
int dsec__dns_upstream_offline(dsec__dns *d, const struct sockaddr *client, const uint8_t *pkt,
                               size_t len, const uint8_t *up, size_t uplen, unsigned flags,
                               uint8_t *out, size_t cap, size_t *out_len);

#endif
