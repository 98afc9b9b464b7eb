/* net-nft-int.h - internals of the node's nftables tables shared by the net-nft*.c files. */
#ifndef DSEC_BACKENDS_NET_NFT_INT_H
#define DSEC_BACKENDS_NET_NFT_INT_H

#include <net/if.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/net/net-int.h"
#include "dsec/err.h"

struct mnl_socket;
struct nlmsghdr;
struct nftnl_rule;
struct nftnl_set;
struct sbx;

/*
 * The main table (inet <conf->table>) holds what is shared; NSHARDS shard tables
 * (<table>_<k>, sandbox idx % NSHARDS) hold the per-sandbox chains. Names use hex indexes.
 *
 * main:
 *   set ifs { ifname }, src4 { ifname . ipv4_addr }, src6 { ifname . ipv6_addr }
 *       the sandbox veths and the source address each may use (anti-spoof)
 *   meters connm, dnsm, logm { ifname } (dynamic, 1 min timeout): per-sandbox rate limits
 *   chain forward (filter - 2): iifname @ifs goto sbx_fwd; then for everything else:
 *       ip saddr POOL drop (a sandbox veth not registered yet); ip daddr POOL ct state
 *       established,related accept; ip daddr POOL drop (nothing initiates into a sandbox).
 *   chain sbx_fwd: iifname . ip saddr != @src4 drop (v6 alike); ct state new, over
 *       conn_rate/s per iifname: drop. Then policy accept hands the packet to the shards.
 *   chain input (filter - 2): iifname @ifs goto sbx_in; meta iiftype != loopback ip saddr
 *       POOL drop.
 *   chain sbx_in: ICMPv6 ND (hop limit 255) accept; anti-spoof; pkttype != host drop; DNS
 *       (tcp/udp dns_port) over dns_rate/s per iifname drop; DNS to gw4/gw6 accept; ct state
 *       established,related accept (connections the node opened); log (per-iifname meter,
 *       prefix "dsec:in": the reader maps the input interface back to the sandbox); drop.
 *   chain post (nat, srcnat), when masquerading: ip saddr POOL ip daddr != POOL masquerade.
 * shard k:
 *   map vfwd { ifname : verdict } (veth -> jump s_IDX); sets deny4, deny6 (intervals: the
 *       pool, loopback, link-local, multicast, metadata services, conf->deny)
 *   chain forward (filter - 1): iifname vmap @vfwd
 *   chain s_IDX: ip daddr != @deny4 ::ffff:<ip daddr> . meta l4proto . th dport @a_IDX
 *       accept; ip6 daddr != @deny6 ip6 daddr . meta l4proto . th dport @a_IDX accept;
 *       limit rate log_rate/s log group G prefix "dsec:IDX"; reject (tcp reset for TCP,
 *       else icmpx admin-prohibited).
 *   set a_IDX { ipv6_addr . inet_proto . inet_service; flags interval,timeout } (pipapo):
 *       one set for both families, IPv4 as ::ffff:a.b.c.d (which deny6 keeps IPv6 packets
 *       from using). ICMP entries are (range, icmp, 0-65535): th dport then reads the ICMP
 *       checksum, which any value matches.
 * Every packet of a sandbox meets a fixed number of hash lookups (main's sets, one vmap per
 * shard) and its own small sets: the cost does not grow with the number of sandboxes.
 *
 * The allow chains have no established shortcut: every packet is checked, so removing an
 * entry also stops flows already open (ct_cut then clears their conntrack state).
 *
 * pipapo refuses an element whose first or last point lies inside another element. So each
 * sandbox keeps a mirror of its elements as disjoint boxes (address range x port range per
 * protocol) with their expiry: a new entry is cut around stronger boxes (permanent, or living
 * at least as long), and weaker boxes it overlaps are deleted and re-added minus the new one.
 * The union is what the caller asked for, and a DNS pin refreshes what it overlaps.
 */

#ifndef NFT_MSG_DESTROYCHAIN
/* Delete-if-present messages (Linux 6.3); Debian 12's headers predate them. */
#define NFT_MSG_DESTROYTABLE 26
#define NFT_MSG_DESTROYCHAIN 27
#define NFT_MSG_DESTROYSET 29
#define NFT_MSG_DESTROYSETELEM 30
#endif

/* nft's datatype numbers, so `nft list` shows the sets readably. */
enum {
    DT_VERDICT = 1,
    DT_IPADDR = 7,
    DT_IP6ADDR = 8,
    DT_INET_PROTO = 12,
    DT_INET_SERVICE = 13,
    DT_IFNAME = 41,
};
#define DT_CONCAT3(a, b, c) ((((a) << 6) | (b)) << 6 | (c))

#define LOG_SNAPLEN 128
#define LIMIT_BURST 5
/* Sandboxes are spread over this many shard tables (idx % NSHARDS): the kernel re-validates
 * every chain a table's verdict maps reach on each commit that adds a jump, and looks sets up
 * by name in a list, so a table's size sets the cost of adding a sandbox to it. Each shard
 * costs forwarded packets one more hook with one hash lookup. */
#define NSHARDS 16
#define LOG_PREFIX_IN "dsec:in"

/* ---- a growable batch of nfnetlink messages, and the table -------------------------------- */

struct batch {
    char *p;
    size_t len, cap;
    uint32_t seq0, seq;
    bool oom;
    char (*what)[64]; /* what each message does, by seq - seq0, for error messages */
    size_t nwhat, capwhat;
};

struct dsec__nft {
    pthread_mutex_t mu; /* the socket, seq, the mirrors */
    struct mnl_socket *nl;
    uint32_t portid;
    uint32_t seq;
    char table[64];
    char shard[NSHARDS][72]; /* <table>_<k> */
    dsec__nft_conf c;        /* deny not kept */
    struct sbx **ht, **iht;  /* by idx, by ifname; iht read by the log thread under mu */
    size_t nbuckets, count;
    struct batch b;
    /* NFLOG reader */
    pthread_t log_thr;
    bool log_running;
    int log_efd;
    struct mnl_socket *log_nl;
    void (*log_fn)(void *ud, const dsec__nft_block *b);
    void *log_ud;
};

/* The names of one sandbox's objects in its shard. */
struct names {
    const char *shard; /* the shard table */
    char chain[32];    /* s_IDX */
    char set[32];      /* a_IDX */
    char prefix[32];   /* the NFLOG prefix */
};

/* ---- net-nft-batch.c: batches of nfnetlink messages ---------------------------------------- */

/* Start the table's batch (t->mu held, or t not shared yet): batch begin, at the table's
 * next sequence number. */
struct batch *dsec__nft_batch_open(dsec__nft *t);

/* End the batch, send it and collect the kernel's verdict (locking as for _open). doing names the
 * work in error messages. */
int dsec__nft_batch_commit(dsec__nft *t, const char *doing, dsec_err *err);

void dsec__nft_batch_release(struct batch *b);

/* Start a message of type (NFT_MSG_*), described as "what name" in error messages; NULL when
 * out of memory (b->oom set). Ended by dsec__nft_msg_end. */
struct nlmsghdr *dsec__nft_msg_begin(struct batch *b, uint16_t type, uint16_t flags, size_t room,
                                     const char *what, const char *name);
void dsec__nft_msg_end(struct batch *b, struct nlmsghdr *nlh);

/* Tables, chains and sets. Out of memory marks the batch (b->oom), which then fails to send. */
void dsec__nft_table_msg(struct batch *b, const char *name, uint16_t type);
void dsec__nft_chain_add(struct batch *b, const char *table, const char *name, const char *type,
                         int hook, int prio);
void dsec__nft_chain_op(struct batch *b, const char *table, const char *name, uint16_t type);
void dsec__nft_set_add(struct batch *b, const char *table, const char *name, uint32_t key_type,
                       uint32_t key_len, uint32_t flags, const uint8_t *fields, unsigned nfields,
                       bool vmap);
void dsec__nft_set_op(struct batch *b, const char *table, const char *name, uint16_t type);

/* A set object to carry elements (NULL when out of memory), the caller's until handed to
 * dsec__nft_elems_send, which sends its elements and frees it (and fails the batch on NULL). */
struct nftnl_set *dsec__nft_set_obj(const char *table, const char *name);
void dsec__nft_elems_send(struct batch *b, struct nftnl_set *s, uint16_t type, size_t n,
                          const char *what, const char *name);
/* An ifname element into s (a jump to chain when chain is not NULL); s may be NULL. */
void dsec__nft_elem_ifname(struct nftnl_set *s, const char *ifname, const char *chain);

/* A netfilter netlink socket (*out closed by the caller with mnl_socket_close); portid may be
 * NULL. */
int dsec__nft_open_nl(struct mnl_socket **out, uint32_t *portid, dsec_err *err);

/* ---- net-nft-rules.c: rules ---------------------------------------------------------------- */

/* An empty rule of table's chain (NULL when out of memory), freed by the caller or consumed by
 * a rule append. */
struct nftnl_rule *dsec__nft_rule_new(const char *table, const char *chain);

/* The main table's rules (its chains exist), a shard's dispatch rule, a sandbox's chain. */
void dsec__nft_main_rules(struct batch *b, const dsec__nft *t);
void dsec__nft_shard_rules(struct batch *b, const char *shard);
void dsec__nft_sbx_rules(struct batch *b, const dsec__nft *t, const struct names *nm);

/* ---- net-nft-sbx.c: the sandboxes ---------------------------------------------------------- */

/* The sandbox whose veth is ifname: its idx into *idx, false when none (takes t->mu). */
bool dsec__nft_sbx_by_ifname(dsec__nft *t, const char *ifname, uint32_t *idx);

/* Free every sandbox's mirror and the tables that find them. */
void dsec__nft_sbx_free_all(dsec__nft *t);

/* ---- net-nft-log.c: the NFLOG reader ------------------------------------------------------- */

/* Stop the reader thread (if running) and close its sockets. */
void dsec__nft_log_stop(dsec__nft *t);

#endif
