/* net-nft.c - the node's nftables table (per-sandbox chains and allow sets, built with libnftnl
 * batches over libmnl), conntrack cuts, and the NFLOG reader of blocked packets. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <net/if_arp.h>
#include <linux/if_packet.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <linux/netlink.h>
#include <net/if.h>
#include <netinet/ip.h>
#include <netinet/ip6.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <libmnl/libmnl.h>
#include <libnetfilter_conntrack/libnetfilter_conntrack.h>
#include <libnftnl/chain.h>
#include <libnftnl/common.h>
#include <libnftnl/expr.h>
#include <libnftnl/rule.h>
#include <libnftnl/set.h>
#include <libnftnl/table.h>
#include <libnftnl/udata.h>

#include "backends/net/net-box.h"
#include "backends/net/net-int.h"
#include "dsec/alloc.h"

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

/* ---- the per-sandbox mirror of allow elements ------------------------------------------------ */

struct sbx {
    struct sbx *next;  /* by idx */
    struct sbx *inext; /* by ifname */
    uint32_t idx;
    char ifname[IFNAMSIZ];
    bool has4, has6; /* the anti-spoof pairs it got, for sbx_del */
    struct in_addr a4;
    struct in6_addr a6;
    struct dsec__box *b;
    size_t n, cap;
};

/* ---- a growable batch of nfnetlink messages ---------------------------------------------------
 */

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

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void batch_reset(struct batch *b, uint32_t seq)
{
    b->len = 0;
    b->seq0 = b->seq = seq;
    b->oom = false;
    b->nwhat = 0;
}

static void batch_fini(struct batch *b)
{
    dsec_free(b->p);
    dsec_free(b->what);
    memset(b, 0, sizeof *b);
}

/* Room for one message of up to `room` bytes; NULL when out of memory. libnftnl writes
 * without bounds, so callers over-estimate. */
static char *batch_room(struct batch *b, size_t room)
{
    if (b->oom)
        return NULL;
    if (b->len + room > b->cap) {
        size_t cap = b->cap ? b->cap : 16384;
        while (cap < b->len + room)
            cap *= 2;
        char *p = dsec_realloc(b->p, cap);
        if (p == NULL) {
            b->oom = true;
            return NULL;
        }
        b->p = p;
        b->cap = cap;
    }
    memset(b->p + b->len, 0, room);
    return b->p + b->len;
}

static void batch_what(struct batch *b, const char *what, const char *name)
{
    if (b->nwhat == b->capwhat) {
        size_t cap = b->capwhat ? b->capwhat * 2 : 64;
        char(*w)[64] = dsec_realloc(b->what, cap * sizeof *w);
        if (w == NULL) {
            b->oom = true;
            return;
        }
        b->what = w;
        b->capwhat = cap;
    }
    snprintf(b->what[b->nwhat++], 64, "%s%s%s", what, name ? " " : "", name ? name : "");
}

/* Start a message of type (NFT_MSG_*), described as "what name" in error messages. */
static struct nlmsghdr *msg_begin(struct batch *b, uint16_t type, uint16_t flags, size_t room,
                                  const char *what, const char *name)
{
    char *p = batch_room(b, room + 256);
    if (p == NULL)
        return NULL;
    batch_what(b, what, name);
    return nftnl_nlmsg_build_hdr(p, type, NFPROTO_INET, flags, b->seq++);
}

static void msg_end(struct batch *b, struct nlmsghdr *nlh)
{
    b->len += NLMSG_ALIGN(nlh->nlmsg_len);
}

static void batch_edge(struct batch *b, bool begin)
{
    char *p = batch_room(b, 64);
    if (p == NULL)
        return;
    batch_what(b, begin ? "batch begin" : "batch end", NULL);
    struct nlmsghdr *nlh = begin ? nftnl_batch_begin(p, b->seq++) : nftnl_batch_end(p, b->seq++);
    msg_end(b, nlh);
}

/* Send the batch and collect the kernel's verdict. nfnetlink runs a batch inside sendmsg, so
 * every error is queued by the time it returns; only errors are asked for. */
static int batch_send(dsec__nft *t, struct batch *b, const char *doing, dsec_err *err)
{
    if (b->oom)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: out of memory building the batch",
                            doing);
    if (mnl_socket_sendto(t->nl, b->p, b->len) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "%s: sending the nftables batch (%zu bytes): %s",
                            doing, b->len, strerror(errno));
    char buf[16384] __attribute__((aligned(4)));
    int first = 0;
    char what[64] = "", kmsg[160] = "";
    for (;;) {
        ssize_t n = recv(mnl_socket_get_fd(t->nl), buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            if (first == 0)
                first = errno;
            break;
        }
        const struct nlmsghdr *nlh = (const struct nlmsghdr *)buf;
        size_t left = (size_t)n;
        while (mnl_nlmsg_ok(nlh, (int)left)) {
            if (nlh->nlmsg_type == NLMSG_ERROR &&
                nlh->nlmsg_len >= NLMSG_LENGTH(sizeof(struct nlmsgerr))) {
                const struct nlmsgerr *e = mnl_nlmsg_get_payload(nlh);
                if (e->error != 0 && first == 0) {
                    first = -e->error;
                    uint32_t i = e->msg.nlmsg_seq - b->seq0;
                    if (i < b->nwhat)
                        snprintf(what, sizeof what, "%s", b->what[i]);
                    if (nlh->nlmsg_flags & NLM_F_ACK_TLVS) {
                        const struct nlattr *a;
                        mnl_attr_for_each(a, nlh, sizeof *e)
                        {
                            if (mnl_attr_get_type(a) == NLMSGERR_ATTR_MSG &&
                                mnl_attr_validate(a, MNL_TYPE_NUL_STRING) == 0)
                                snprintf(kmsg, sizeof kmsg, " (%s)", mnl_attr_get_str(a));
                        }
                    }
                }
            }
            nlh = mnl_nlmsg_next(nlh, (int *)&left);
        }
    }
    if (first != 0)
        return dsec_err_set(err, DSEC_E_IO, first, "%s: nftables refused %s: %s%s", doing,
                            what[0] ? what : "the batch", strerror(first), kmsg);
    return 0;
}

/* ---- expressions -------------------------------------------------------------------------- */

/* A rule missing one expression could match more than meant (a lookup lost from an accept
 * rule accepts everything), so a failed allocation poisons the rule being built, and
 * rule_add then fails the whole batch. Rules are built by one thread at a time per table,
 * but tables are independent: thread-local. */
static __thread bool expr_oom;

static struct nftnl_rule *rule_new(const char *table, const char *chain)
{
    expr_oom = false;
    struct nftnl_rule *r = nftnl_rule_alloc();
    if (r == NULL)
        return NULL;
    nftnl_rule_set_str(r, NFTNL_RULE_TABLE, table);
    nftnl_rule_set_str(r, NFTNL_RULE_CHAIN, chain);
    nftnl_rule_set_u32(r, NFTNL_RULE_FAMILY, NFPROTO_INET);
    return r;
}

/* The expression helpers tolerate r == NULL (out of memory, reported when the rule is added). */
static struct nftnl_expr *expr(struct nftnl_rule *r, const char *name)
{
    if (r == NULL)
        return NULL;
    struct nftnl_expr *e = nftnl_expr_alloc(name);
    if (e != NULL)
        nftnl_rule_add_expr(r, e);
    else
        expr_oom = true;
    return e;
}

static void e_meta(struct nftnl_rule *r, uint32_t key, uint32_t dreg)
{
    struct nftnl_expr *e = expr(r, "meta");
    if (e == NULL)
        return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_KEY, key);
    nftnl_expr_set_u32(e, NFTNL_EXPR_META_DREG, dreg);
}

static void e_cmp(struct nftnl_rule *r, uint32_t op, const void *data, uint32_t len)
{
    struct nftnl_expr *e = expr(r, "cmp");
    if (e == NULL)
        return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_CMP_SREG, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_CMP_OP, op);
    nftnl_expr_set(e, NFTNL_EXPR_CMP_DATA, data, len);
}

static void e_cmp8(struct nftnl_rule *r, uint32_t op, uint8_t v)
{
    e_cmp(r, op, &v, 1);
}

static void e_payload(struct nftnl_rule *r, uint32_t base, uint32_t off, uint32_t len,
                      uint32_t dreg)
{
    struct nftnl_expr *e = expr(r, "payload");
    if (e == NULL)
        return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_BASE, base);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_OFFSET, off);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_LEN, len);
    nftnl_expr_set_u32(e, NFTNL_EXPR_PAYLOAD_DREG, dreg);
}

static void e_lookup(struct nftnl_rule *r, uint32_t sreg, const char *set, bool inv, bool vmap)
{
    struct nftnl_expr *e = expr(r, "lookup");
    if (e == NULL)
        return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_LOOKUP_SREG, sreg);
    nftnl_expr_set_str(e, NFTNL_EXPR_LOOKUP_SET, set);
    if (vmap)
        nftnl_expr_set_u32(e, NFTNL_EXPR_LOOKUP_DREG, NFT_REG_VERDICT);
    if (inv)
        nftnl_expr_set_u32(e, NFTNL_EXPR_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
}

static void e_verdict(struct nftnl_rule *r, int verdict)
{
    struct nftnl_expr *e = expr(r, "immediate");
    if (e == NULL)
        return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_DREG, NFT_REG_VERDICT);
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_VERDICT, (uint32_t)verdict);
}

static void e_ct_state(struct nftnl_rule *r, uint32_t bits)
{
    struct nftnl_expr *e = expr(r, "ct");
    if (e != NULL) {
        nftnl_expr_set_u32(e, NFTNL_EXPR_CT_KEY, NFT_CT_STATE);
        nftnl_expr_set_u32(e, NFTNL_EXPR_CT_DREG, NFT_REG_1);
    }
    e = expr(r, "bitwise");
    if (e != NULL) {
        uint32_t zero = 0;
        nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_SREG, NFT_REG_1);
        nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_DREG, NFT_REG_1);
        nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_LEN, 4);
        nftnl_expr_set(e, NFTNL_EXPR_BITWISE_MASK, &bits, 4);
        nftnl_expr_set(e, NFTNL_EXPR_BITWISE_XOR, &zero, 4);
    }
    uint32_t zero = 0;
    e_cmp(r, NFT_CMP_NEQ, &zero, 4);
}

static void e_limit(struct nftnl_rule *r, uint32_t rate, bool over)
{
    struct nftnl_expr *e = expr(r, "limit");
    if (e == NULL)
        return;
    nftnl_expr_set_u64(e, NFTNL_EXPR_LIMIT_RATE, rate);
    nftnl_expr_set_u64(e, NFTNL_EXPR_LIMIT_UNIT, 1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_LIMIT_BURST, LIMIT_BURST);
    nftnl_expr_set_u32(e, NFTNL_EXPR_LIMIT_TYPE, NFT_LIMIT_PKTS);
    nftnl_expr_set_u32(e, NFTNL_EXPR_LIMIT_FLAGS, over ? NFT_LIMIT_F_INV : 0);
}

/* nfproto == family; then the network-header field at off (len bytes) compared with the
 * prefix addr/plen (bitwise mask first when plen is short of the whole field). */
static void e_nfproto(struct nftnl_rule *r, uint8_t nfproto)
{
    e_meta(r, NFT_META_NFPROTO, NFT_REG_1);
    e_cmp8(r, NFT_CMP_EQ, nfproto);
}

static void e_addr(struct nftnl_rule *r, uint32_t off, uint32_t len, const uint8_t *addr,
                   unsigned plen, uint32_t op)
{
    e_payload(r, NFT_PAYLOAD_NETWORK_HEADER, off, len, NFT_REG_1);
    uint8_t a[16] = {0};
    memcpy(a, addr, len);
    if (plen < len * 8) {
        uint8_t mask[16] = {0}, zero[16] = {0};
        for (unsigned i = 0; i < len; i++) {
            unsigned bits = plen > i * 8 ? plen - i * 8 : 0;
            mask[i] = bits >= 8 ? 0xff : (uint8_t)(0xff << (8 - bits));
            a[i] &= mask[i];
        }
        struct nftnl_expr *e = expr(r, "bitwise");
        if (e != NULL) {
            nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_SREG, NFT_REG_1);
            nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_DREG, NFT_REG_1);
            nftnl_expr_set_u32(e, NFTNL_EXPR_BITWISE_LEN, len);
            nftnl_expr_set(e, NFTNL_EXPR_BITWISE_MASK, mask, len);
            nftnl_expr_set(e, NFTNL_EXPR_BITWISE_XOR, zero, len);
        }
    }
    e_cmp(r, op, a, len);
}

/* ip saddr (v4) / ip6 saddr */
#define OFF_SADDR4 12
#define OFF_DADDR4 16
#define OFF_SADDR6 8
#define OFF_DADDR6 24

static void e_log(struct nftnl_rule *r, uint16_t group, const char *prefix)
{
    struct nftnl_expr *e = expr(r, "log");
    if (e == NULL)
        return;
    nftnl_expr_set_u16(e, NFTNL_EXPR_LOG_GROUP, group);
    nftnl_expr_set_str(e, NFTNL_EXPR_LOG_PREFIX, prefix);
    nftnl_expr_set_u32(e, NFTNL_EXPR_LOG_SNAPLEN, LOG_SNAPLEN);
}

/* Append r (consumed) to the batch. */
static void rule_add(struct batch *b, struct nftnl_rule *r, const char *chain)
{
    if (r == NULL || expr_oom) {
        b->oom = true;
        if (r != NULL)
            nftnl_rule_free(r);
        return;
    }
    struct nlmsghdr *nlh =
        msg_begin(b, NFT_MSG_NEWRULE, NLM_F_APPEND | NLM_F_CREATE, 4096, "a rule of chain", chain);
    if (nlh != NULL) {
        nftnl_rule_nlmsg_build_payload(nlh, r);
        msg_end(b, nlh);
    }
    nftnl_rule_free(r);
}

/* ---- chains and sets ---------------------------------------------------------------------- */

static void chain_add(struct batch *b, const char *table, const char *name, const char *type,
                      int hook, int prio)
{
    struct nftnl_chain *c = nftnl_chain_alloc();
    if (c == NULL) {
        b->oom = true;
        return;
    }
    nftnl_chain_set_str(c, NFTNL_CHAIN_TABLE, table);
    nftnl_chain_set_str(c, NFTNL_CHAIN_NAME, name);
    nftnl_chain_set_u32(c, NFTNL_CHAIN_FAMILY, NFPROTO_INET);
    if (type != NULL) {
        nftnl_chain_set_str(c, NFTNL_CHAIN_TYPE, type);
        nftnl_chain_set_u32(c, NFTNL_CHAIN_HOOKNUM, (uint32_t)hook);
        nftnl_chain_set_s32(c, NFTNL_CHAIN_PRIO, prio);
        nftnl_chain_set_u32(c, NFTNL_CHAIN_POLICY, NF_ACCEPT);
    }
    struct nlmsghdr *nlh = msg_begin(b, NFT_MSG_NEWCHAIN, NLM_F_CREATE, 512, "chain", name);
    if (nlh != NULL) {
        nftnl_chain_nlmsg_build_payload(nlh, c);
        msg_end(b, nlh);
    }
    nftnl_chain_free(c);
}

/* type NFT_MSG_DELRULE without a handle flushes the chain; DESTROYCHAIN deletes it (and its
 * rules) if present. */
static void chain_op(struct batch *b, const char *table, const char *name, uint16_t type)
{
    bool rules = type == NFT_MSG_DELRULE;
    struct nlmsghdr *nlh =
        msg_begin(b, type, 0, 512, rules ? "flushing chain" : "deleting chain", name);
    if (nlh == NULL)
        return;
    if (rules) {
        struct nftnl_rule *r = rule_new(table, name);
        if (r == NULL) {
            b->oom = true;
            return;
        }
        nftnl_rule_nlmsg_build_payload(nlh, r);
        nftnl_rule_free(r);
    } else {
        struct nftnl_chain *c = nftnl_chain_alloc();
        if (c == NULL) {
            b->oom = true;
            return;
        }
        nftnl_chain_set_str(c, NFTNL_CHAIN_TABLE, table);
        nftnl_chain_set_str(c, NFTNL_CHAIN_NAME, name);
        nftnl_chain_set_u32(c, NFTNL_CHAIN_FAMILY, NFPROTO_INET);
        nftnl_chain_nlmsg_build_payload(nlh, c);
        nftnl_chain_free(c);
    }
    msg_end(b, nlh);
}

static struct nftnl_set *set_obj(const char *table, const char *name)
{
    struct nftnl_set *s = nftnl_set_alloc();
    if (s == NULL)
        return NULL;
    nftnl_set_set_str(s, NFTNL_SET_TABLE, table);
    nftnl_set_set_str(s, NFTNL_SET_NAME, name);
    nftnl_set_set_u32(s, NFTNL_SET_FAMILY, NFPROTO_INET);
    return s;
}

/* A set: key of key_len bytes (concat: the field lengths in fields[nfields]); vmap: a verdict
 * map. */
static void set_add(struct batch *b, const char *table, const char *name, uint32_t key_type,
                    uint32_t key_len, uint32_t flags, const uint8_t *fields, unsigned nfields,
                    bool vmap)
{
    struct nftnl_set *s = set_obj(table, name);
    if (s == NULL) {
        b->oom = true;
        return;
    }
    nftnl_set_set_u32(s, NFTNL_SET_KEY_TYPE, key_type);
    nftnl_set_set_u32(s, NFTNL_SET_KEY_LEN, key_len);
    nftnl_set_set_u32(s, NFTNL_SET_ID, b->seq);
    if (vmap) {
        flags |= NFT_SET_MAP;
        nftnl_set_set_u32(s, NFTNL_SET_DATA_TYPE, NFT_DATA_VERDICT);
        nftnl_set_set_u32(s, NFTNL_SET_DATA_LEN, 0);
    }
    nftnl_set_set_u32(s, NFTNL_SET_FLAGS, flags);
    if (key_type == DT_IFNAME) {
        /* nft prints a string key the right way round only when told it is in host order */
        struct nftnl_udata_buf *ud = nftnl_udata_buf_alloc(16);
        if (ud == NULL || !nftnl_udata_put_u32(ud, NFTNL_UDATA_SET_KEYBYTEORDER, 1))
            b->oom = true;
        else
            nftnl_set_set_data(s, NFTNL_SET_USERDATA, nftnl_udata_buf_data(ud),
                               nftnl_udata_buf_len(ud));
        if (ud != NULL)
            nftnl_udata_buf_free(ud);
    }
    if (nfields > 0)
        nftnl_set_set_data(s, NFTNL_SET_DESC_CONCAT, fields, nfields);
    if (flags & NFT_SET_EVAL) {
        /* a meter: one element per sandbox interface, forgotten a minute after its last use */
        nftnl_set_set_u32(s, NFTNL_SET_DESC_SIZE, 65535);
        nftnl_set_set_u64(s, NFTNL_SET_TIMEOUT, 60000);
    }
    struct nlmsghdr *nlh = msg_begin(b, NFT_MSG_NEWSET, NLM_F_CREATE, 1024, "set", name);
    if (nlh != NULL) {
        nftnl_set_nlmsg_build_payload(nlh, s);
        msg_end(b, nlh);
    }
    nftnl_set_free(s);
}

/* type NFT_MSG_DELSETELEM with no elements flushes; DESTROYSET deletes the set if present. */
static void set_op(struct batch *b, const char *table, const char *name, uint16_t type)
{
    struct nftnl_set *s = set_obj(table, name);
    if (s == NULL) {
        b->oom = true;
        return;
    }
    bool flush = type == NFT_MSG_DELSETELEM;
    struct nlmsghdr *nlh =
        msg_begin(b, type, 0, 512, flush ? "flushing set" : "deleting set", name);
    if (nlh != NULL) {
        if (flush)
            nftnl_set_elems_nlmsg_build_payload(nlh, s);
        else
            nftnl_set_nlmsg_build_payload(nlh, s);
        msg_end(b, nlh);
    }
    nftnl_set_free(s);
}

/* Elements go into an nftnl_set, then into one message. */
static void elems_send(struct batch *b, struct nftnl_set *s, uint16_t type, size_t n,
                       const char *what, const char *name)
{
    if (s == NULL) {
        b->oom = true;
        return;
    }
    struct nlmsghdr *nlh = msg_begin(b, type, type == NFT_MSG_NEWSETELEM ? NLM_F_CREATE : 0,
                                     512 + n * 192, what, name);
    if (nlh != NULL) {
        nftnl_set_elems_nlmsg_build_payload(nlh, s);
        msg_end(b, nlh);
    }
    nftnl_set_free(s);
}

static void elem_ifname(struct nftnl_set *s, const char *ifname, const char *chain)
{
    if (s == NULL)
        return;
    struct nftnl_set_elem *e = nftnl_set_elem_alloc();
    if (e == NULL)
        return;
    char key[IFNAMSIZ] = {0};
    memcpy(key, ifname, strnlen(ifname, IFNAMSIZ - 1));
    nftnl_set_elem_set(e, NFTNL_SET_ELEM_KEY, key, sizeof key);
    if (chain != NULL) {
        nftnl_set_elem_set_u32(e, NFTNL_SET_ELEM_VERDICT, (uint32_t)NFT_JUMP);
        nftnl_set_elem_set_str(e, NFTNL_SET_ELEM_CHAIN, chain);
    }
    nftnl_set_elem_add(s, e);
}

/* ---- address ranges -------------------------------------------------------------------------- */

struct range {
    uint8_t lo[16], hi[16];
};

static int range_cmp_len;
static int range_cmp(const void *a, const void *b)
{
    return memcmp(((const struct range *)a)->lo, ((const struct range *)b)->lo,
                  (size_t)range_cmp_len);
}

/* The deny set of one family: merged, sorted intervals as rbtree elements (start, end+1 with
 * INTERVAL_END), the way nft itself sends them. */
static void deny_elems(struct batch *b, const char *table, const char *name, int family,
                       struct range *r, size_t n)
{
    unsigned len = dsec__addr_len(family);
    /* qsort's comparator has no context argument; the mutex of new() is not taken yet but
     * new() runs once per table and the length is constant per call. */
    range_cmp_len = (int)len;
    qsort(r, n, sizeof *r, range_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m > 0) {
            uint8_t next[16];
            memcpy(next, r[m - 1].hi, len);
            bool wrap = !dsec__addr_step(next, len, 1);
            if (wrap || dsec__addr_cmp(r[i].lo, next, len) <= 0) {
                if (dsec__addr_cmp(r[i].hi, r[m - 1].hi, len) > 0)
                    memcpy(r[m - 1].hi, r[i].hi, len);
                continue;
            }
        }
        r[m++] = r[i];
    }
    struct nftnl_set *s = set_obj(table, name);
    if (s == NULL) {
        b->oom = true;
        return;
    }
    static const uint8_t zero[16];
    size_t nel = 0;
    for (size_t i = 0; i < m; i++) {
        if (i == 0 && dsec__addr_cmp(r[0].lo, zero, len) != 0) {
            struct nftnl_set_elem *e = nftnl_set_elem_alloc();
            if (e == NULL)
                goto oom;
            nftnl_set_elem_set(e, NFTNL_SET_ELEM_KEY, zero, len);
            nftnl_set_elem_set_u32(e, NFTNL_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END);
            nftnl_set_elem_add(s, e);
            nel++;
        }
        struct nftnl_set_elem *e = nftnl_set_elem_alloc();
        if (e == NULL)
            goto oom;
        nftnl_set_elem_set(e, NFTNL_SET_ELEM_KEY, r[i].lo, len);
        nftnl_set_elem_add(s, e);
        nel++;
        uint8_t end[16];
        memcpy(end, r[i].hi, len);
        if (dsec__addr_step(end, len, 1)) {
            e = nftnl_set_elem_alloc();
            if (e == NULL)
                goto oom;
            nftnl_set_elem_set(e, NFTNL_SET_ELEM_KEY, end, len);
            nftnl_set_elem_set_u32(e, NFTNL_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END);
            nftnl_set_elem_add(s, e);
            nel++;
        }
    }
    elems_send(b, s, NFT_MSG_NEWSETELEM, nel, "elements of set", name);
    return;
oom:
    nftnl_set_free(s);
    b->oom = true;
}

/* ---- the box algebra of allow entries ------------------------------------------------------ */

static int elem_box(const dsec__nft *t, const dsec__nft_elem *e, uint64_t now, struct dsec__box *b,
                    dsec_err *err)
{
    memset(b, 0, sizeof *b);
    if (e->family != AF_INET && e->family != AF_INET6)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "allow entry: family %d is neither AF_INET nor AF_INET6", e->family);
    if (e->family == AF_INET6 && !t->c.v6)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "allow entry: an IPv6 destination, but the node runs without IPv6");
    unsigned len = dsec__addr_len(e->family);
    if (e->prefix > len * 8)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "allow entry: prefix /%u is too long for %s",
                            e->prefix, e->family == AF_INET ? "IPv4" : "IPv6");
    b->family = AF_INET6;
    b->proto = e->proto;
    if (e->family == AF_INET) {
        uint8_t mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        memcpy(mapped + 12, e->addr, 4);
        dsec__prefix_range(mapped, 96u + e->prefix, 16, b->lo, b->hi);
    } else {
        dsec__prefix_range(e->addr, e->prefix, 16, b->lo, b->hi);
    }
    switch (e->proto) {
    case IPPROTO_TCP:
    case IPPROTO_UDP:
        if (e->port_lo > e->port_hi)
            return dsec_err_set(err, DSEC_E_INVALID, 0, "allow entry: port range %u-%u is empty",
                                e->port_lo, e->port_hi);
        b->plo = e->port_lo;
        b->phi = e->port_hi;
        break;
    case IPPROTO_ICMP:
    case IPPROTO_ICMPV6:
        if ((e->proto == IPPROTO_ICMP) != (e->family == AF_INET))
            return dsec_err_set(err, DSEC_E_INVALID, 0, "allow entry: %s is not a protocol of %s",
                                e->proto == IPPROTO_ICMP ? "ICMP" : "ICMPv6",
                                e->family == AF_INET ? "IPv4" : "IPv6");
        b->plo = 0;
        b->phi = 65535;
        break;
    default:
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "allow entry: protocol %u is not tcp, udp, icmp or icmpv6", e->proto);
    }
    b->exp_ms = e->timeout_ms ? now + e->timeout_ms : 0;
    return 0;
}

/* Stronger first, so that a list inserted in this order never deletes. */
static int box_strength_cmp(const void *pa, const void *pb)
{
    const struct dsec__box *a = pa, *b = pb;
    if (a->exp_ms == b->exp_ms)
        return 0;
    if (a->exp_ms == 0)
        return -1;
    if (b->exp_ms == 0)
        return 1;
    return a->exp_ms > b->exp_ms ? -1 : 1;
}

struct names {
    const char *shard; /* the shard table */
    char chain[32];    /* s_IDX */
    char set[32];      /* a_IDX */
    char prefix[32];   /* the NFLOG prefix */
};

static void names_of(const dsec__nft *t, uint32_t idx, struct names *n)
{
    n->shard = t->shard[idx % NSHARDS];
    snprintf(n->chain, sizeof n->chain, "s_%" PRIx32, idx);
    snprintf(n->set, sizeof n->set, "a_%" PRIx32, idx);
    snprintf(n->prefix, sizeof n->prefix, "dsec:%" PRIu32, idx);
}

/* The elements of ops as messages, grouped by runs of adds or deletes. */
static void ops_emit(struct batch *b, const struct names *nm, const struct dsec__opv *ops,
                     uint64_t now)
{
    for (size_t i = 0; i < ops->n;) {
        size_t j = i;
        bool del = ops->v[i].del;
        struct nftnl_set *s = set_obj(nm->shard, nm->set);
        if (s == NULL) {
            b->oom = true;
            return;
        }
        size_t nel = 0;
        for (; j < ops->n && ops->v[j].del == del; j++) {
            const struct dsec__box *x = &ops->v[j].b;
            uint8_t key[24] = {0}, end[24] = {0};
            memcpy(key, x->lo, 16);
            memcpy(end, x->hi, 16);
            key[16] = end[16] = x->proto;
            uint16_t plo = htons(x->plo), phi = htons(x->phi);
            memcpy(key + 20, &plo, 2);
            memcpy(end + 20, &phi, 2);
            struct nftnl_set_elem *e = nftnl_set_elem_alloc();
            if (e == NULL) {
                b->oom = true;
                break;
            }
            nftnl_set_elem_set(e, NFTNL_SET_ELEM_KEY, key, sizeof key);
            nftnl_set_elem_set(e, NFTNL_SET_ELEM_KEY_END, end, sizeof end);
            if (!del && x->exp_ms != 0) {
                uint64_t left = x->exp_ms > now ? x->exp_ms - now : 1;
                nftnl_set_elem_set_u64(e, NFTNL_SET_ELEM_TIMEOUT, left);
            }
            nftnl_set_elem_add(s, e);
            nel++;
        }
        elems_send(b, s, del ? NFT_MSG_DESTROYSETELEM : NFT_MSG_NEWSETELEM, nel,
                   del ? "deleting elements of set" : "elements of set", nm->set);
        i = j;
    }
}

/* Build the mirror of a whole entry list (replacing), with its operations. */
static int boxes_from_list(const dsec__nft *t, const dsec__nft_elem *e, size_t n,
                           struct dsec__boxv *s, struct dsec__opv *ops, dsec_err *err)
{
    uint64_t now = now_ms();
    struct dsec__boxv in = {0};
    for (size_t i = 0; i < n; i++) {
        struct dsec__box b;
        if (elem_box(t, &e[i], now, &b, err) < 0) {
            dsec_free(in.v);
            return dsec_err_wrap(err, "entry %zu", i);
        }
        dsec__boxv_push(&in, &b);
    }
    if (in.n > 0)
        qsort(in.v, in.n, sizeof *in.v, box_strength_cmp);
    for (size_t i = 0; i < in.n && !in.oom; i++)
        dsec__box_insert(s, &in.v[i], ops, now);
    bool oom = in.oom || s->oom || ops->oom;
    dsec_free(in.v);
    if (oom)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
    return 0;
}

/* ---- sandboxes ------------------------------------------------------------------------------- */

static size_t ifname_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static struct sbx **sbx_slot(dsec__nft *t, uint32_t idx)
{
    struct sbx **p = &t->ht[(idx * 2654435761u) & (t->nbuckets - 1)];
    while (*p != NULL && (*p)->idx != idx)
        p = &(*p)->next;
    return p;
}

static struct sbx **sbx_islot(dsec__nft *t, const char *ifname)
{
    struct sbx **p = &t->iht[ifname_hash(ifname) & (t->nbuckets - 1)];
    while (*p != NULL && strcmp((*p)->ifname, ifname) != 0)
        p = &(*p)->inext;
    return p;
}

static void sbx_free(struct sbx *s)
{
    if (s != NULL) {
        dsec_free(s->b);
        dsec_free(s);
    }
}

/* Take s out of both tables. */
static void sbx_unlink(dsec__nft *t, struct sbx *s)
{
    struct sbx **p = sbx_slot(t, s->idx);
    if (*p == s)
        *p = s->next;
    p = sbx_islot(t, s->ifname);
    if (*p == s)
        *p = s->inext;
    t->count--;
}

static void sbx_link(dsec__nft *t, struct sbx *s)
{
    struct sbx **p = sbx_slot(t, s->idx);
    s->next = *p;
    *p = s;
    p = sbx_islot(t, s->ifname);
    s->inext = *p;
    *p = s;
    t->count++;
}

static void sbx_grow(dsec__nft *t)
{
    if (t->count < t->nbuckets * 2)
        return;
    size_t nb = t->nbuckets * 4;
    struct sbx **ht = dsec_calloc(nb, sizeof *ht), **iht = dsec_calloc(nb, sizeof *iht);
    if (ht == NULL || iht == NULL) {
        /* longer chains only cost lookup time */
        dsec_free(ht);
        dsec_free(iht);
        return;
    }
    struct sbx *all = NULL;
    for (size_t i = 0; i < t->nbuckets; i++) {
        for (struct sbx *s = t->ht[i], *next; s != NULL; s = next) {
            next = s->next;
            s->next = all;
            all = s;
        }
    }
    dsec_free(t->ht);
    dsec_free(t->iht);
    t->ht = ht;
    t->iht = iht;
    t->nbuckets = nb;
    t->count = 0;
    for (struct sbx *s = all, *next; s != NULL; s = next) {
        next = s->next;
        sbx_link(t, s);
    }
}

/* The rules of s_IDX, in the sandbox's shard. */
static void sbx_rules(struct batch *b, const dsec__nft *t, const struct names *nm)
{
    const char *tb = nm->shard, *chain = nm->chain;
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    for (int f = 0; f < (t->c.v6 ? 2 : 1); f++) {
        bool is4 = f == 0;
        struct nftnl_rule *r = rule_new(tb, chain);
        e_nfproto(r, is4 ? NFPROTO_IPV4 : NFPROTO_IPV6);
        e_payload(r, NFT_PAYLOAD_NETWORK_HEADER, is4 ? OFF_DADDR4 : OFF_DADDR6, is4 ? 4 : 16,
                  NFT_REG_1);
        e_lookup(r, NFT_REG_1, is4 ? "deny4" : "deny6", true, false);
        if (is4) {
            struct nftnl_expr *e = expr(r, "immediate");
            if (e != NULL) {
                nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_DREG, NFT_REG32_00);
                nftnl_expr_set(e, NFTNL_EXPR_IMM_DATA, mapped, sizeof mapped);
            }
            e_payload(r, NFT_PAYLOAD_NETWORK_HEADER, OFF_DADDR4, 4, NFT_REG32_03);
        } else {
            e_payload(r, NFT_PAYLOAD_NETWORK_HEADER, OFF_DADDR6, 16, NFT_REG32_00);
        }
        e_meta(r, NFT_META_L4PROTO, NFT_REG32_04);
        e_payload(r, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, NFT_REG32_05);
        e_lookup(r, NFT_REG32_00, nm->set, false, false);
        e_verdict(r, NF_ACCEPT);
        rule_add(b, r, chain);
    }
    struct nftnl_rule *r;
    if (t->c.log_rate > 0) {
        r = rule_new(tb, chain);
        e_limit(r, t->c.log_rate, false);
        e_log(r, t->c.log_group, nm->prefix);
        rule_add(b, r, chain);
    }
    /* TCP gets a reset: an ICMP error that arrives while connect() still holds the socket
     * (a reject on the local veth is that fast) is dropped by TCP, and connect() would wait
     * for the retransmission a second later; a reset is queued to the socket's backlog */
    r = rule_new(tb, chain);
    e_meta(r, NFT_META_L4PROTO, NFT_REG_1);
    e_cmp8(r, NFT_CMP_EQ, IPPROTO_TCP);
    struct nftnl_expr *e = expr(r, "reject");
    if (e != NULL) {
        nftnl_expr_set_u32(e, NFTNL_EXPR_REJECT_TYPE, NFT_REJECT_TCP_RST);
        nftnl_expr_set_u8(e, NFTNL_EXPR_REJECT_CODE, 0);
    }
    rule_add(b, r, chain);
    r = rule_new(tb, chain);
    e = expr(r, "reject");
    if (e != NULL) {
        nftnl_expr_set_u32(e, NFTNL_EXPR_REJECT_TYPE, NFT_REJECT_ICMPX_UNREACH);
        nftnl_expr_set_u8(e, NFTNL_EXPR_REJECT_CODE, NFT_REJECT_ICMPX_ADMIN_PROHIBITED);
    }
    rule_add(b, r, chain);
}

static int check_ifname(const char *ifname, dsec_err *err)
{
    size_t n = ifname != NULL ? strlen(ifname) : 0;
    if (n == 0 || n >= IFNAMSIZ)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "sandbox interface name \"%s\" must be 1 to %d bytes",
                            ifname != NULL ? ifname : "(null)", IFNAMSIZ - 1);
    return 0;
}

/* (ifname . address) elements of the main table's src4 / src6 (and plain ifname for ifs). */
static void main_ifelem(struct batch *b, const dsec__nft *t, const char *set, uint16_t type,
                        const char *ifname, const void *addr, size_t alen_)
{
    struct nftnl_set *s = set_obj(t->table, set);
    struct nftnl_set_elem *e = s != NULL ? nftnl_set_elem_alloc() : NULL;
    if (e == NULL) {
        if (s != NULL)
            nftnl_set_free(s);
        b->oom = true;
        return;
    }
    uint8_t key[IFNAMSIZ + 16] = {0};
    memcpy(key, ifname, strnlen(ifname, IFNAMSIZ - 1));
    if (addr != NULL)
        memcpy(key + IFNAMSIZ, addr, alen_);
    nftnl_set_elem_set(e, NFTNL_SET_ELEM_KEY, key, IFNAMSIZ + alen_);
    nftnl_set_elem_add(s, e);
    elems_send(b, s, type, 1,
               type == NFT_MSG_NEWSETELEM ? "adding the interface to set" : "deleting from set",
               set);
}

int dsec__nft_sbx_add(dsec__nft *t, uint32_t idx, const char *ifname, const struct in_addr *a4,
                      const struct in6_addr *a6, const dsec__nft_elem *e, size_t n, dsec_err *err)
{
    if (check_ifname(ifname, err) < 0)
        return -1;
    if (n > 0 && e == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "sandbox %" PRIx32 ": entries missing", idx);
    struct sbx *ns = dsec_calloc(1, sizeof *ns);
    if (ns == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
    ns->idx = idx;
    snprintf(ns->ifname, sizeof ns->ifname, "%s", ifname);
    if (a4 != NULL) {
        ns->has4 = true;
        ns->a4 = *a4;
    }
    if (a6 != NULL && t->c.v6) {
        ns->has6 = true;
        ns->a6 = *a6;
    }
    struct dsec__boxv s = {0};
    struct dsec__opv ops = {0};
    if (boxes_from_list(t, e, n, &s, &ops, err) < 0) {
        dsec_free(s.v);
        dsec_free(ops.v);
        sbx_free(ns);
        return dsec_err_wrap(err, "sandbox %" PRIx32, idx);
    }
    struct names nm;
    names_of(t, idx, &nm);
    static const uint8_t fields[] = {16, 1, 2};

    pthread_mutex_lock(&t->mu);
    struct batch *b = &t->b;
    batch_reset(b, t->seq);
    batch_edge(b, true);
    /* the main table: the interface is a sandbox's, with these source addresses */
    main_ifelem(b, t, "ifs", NFT_MSG_NEWSETELEM, ifname, NULL, 0);
    if (a4 != NULL)
        main_ifelem(b, t, "src4", NFT_MSG_NEWSETELEM, ifname, a4, 4);
    if (a6 != NULL && t->c.v6)
        main_ifelem(b, t, "src6", NFT_MSG_NEWSETELEM, ifname, a6, 16);
    /* the shard: its chain and set (flushed when re-adopted), and the map entry */
    struct nftnl_set *so = set_obj(nm.shard, "vfwd");
    elem_ifname(so, ifname, NULL);
    elems_send(b, so, NFT_MSG_DESTROYSETELEM, 1, "deleting the interface from map", "vfwd");
    chain_add(b, nm.shard, nm.chain, NULL, 0, 0);
    chain_op(b, nm.shard, nm.chain, NFT_MSG_DELRULE);
    set_add(b, nm.shard, nm.set, DT_CONCAT3(DT_IP6ADDR, DT_INET_PROTO, DT_INET_SERVICE), 24,
            NFT_SET_INTERVAL | NFT_SET_TIMEOUT | NFT_SET_CONCAT, fields, 3, false);
    set_op(b, nm.shard, nm.set, NFT_MSG_DELSETELEM);
    sbx_rules(b, t, &nm);
    so = set_obj(nm.shard, "vfwd");
    elem_ifname(so, ifname, nm.chain);
    elems_send(b, so, NFT_MSG_NEWSETELEM, 1, "adding the interface to map", "vfwd");
    ops_emit(b, &nm, &ops, now_ms());
    batch_edge(b, false);
    t->seq = b->seq;
    int rc = batch_send(t, b, "adding sandbox", err);
    if (rc == 0) {
        struct sbx *old = *sbx_slot(t, idx);
        if (old != NULL) {
            sbx_unlink(t, old);
            sbx_free(old);
        }
        ns->b = s.v;
        ns->n = s.n;
        ns->cap = s.cap;
        s.v = NULL;
        sbx_link(t, ns);
        ns = NULL;
        sbx_grow(t);
    }
    pthread_mutex_unlock(&t->mu);
    dsec_free(s.v);
    dsec_free(ops.v);
    sbx_free(ns);
    if (rc < 0)
        return dsec_err_wrap(err, "sandbox %" PRIx32 " (%s)", idx, ifname);
    return 0;
}

int dsec__nft_sbx_del(dsec__nft *t, uint32_t idx, const char *ifname, const struct in_addr *a4,
                      const struct in6_addr *a6, dsec_err *err)
{
    if (ifname != NULL && check_ifname(ifname, err) < 0)
        return -1;
    struct names nm;
    names_of(t, idx, &nm);
    pthread_mutex_lock(&t->mu);
    struct batch *b = &t->b;
    batch_reset(b, t->seq);
    batch_edge(b, true);
    /* the addresses it was added with, when the caller does not know them */
    struct sbx *known = *sbx_slot(t, idx);
    if (known != NULL && ifname != NULL && strcmp(known->ifname, ifname) != 0)
        known = NULL;
    if (a4 == NULL && known != NULL && known->has4)
        a4 = &known->a4;
    if (a6 == NULL && known != NULL && known->has6)
        a6 = &known->a6;
    if (ifname != NULL) {
        main_ifelem(b, t, "ifs", NFT_MSG_DESTROYSETELEM, ifname, NULL, 0);
        if (a4 != NULL)
            main_ifelem(b, t, "src4", NFT_MSG_DESTROYSETELEM, ifname, a4, 4);
        if (a6 != NULL && t->c.v6)
            main_ifelem(b, t, "src6", NFT_MSG_DESTROYSETELEM, ifname, a6, 16);
        /* and its meter state, so that a later sandbox on the same name starts afresh */
        static const char *const meters[] = {"connm", "dnsm", "logm"};
        for (int m = 0; m < 3; m++)
            main_ifelem(b, t, meters[m], NFT_MSG_DESTROYSETELEM, ifname, NULL, 0);
        struct nftnl_set *so = set_obj(nm.shard, "vfwd");
        elem_ifname(so, ifname, NULL);
        elems_send(b, so, NFT_MSG_DESTROYSETELEM, 1, "deleting the interface from map", "vfwd");
    }
    chain_op(b, nm.shard, nm.chain, NFT_MSG_DESTROYCHAIN);
    set_op(b, nm.shard, nm.set, NFT_MSG_DESTROYSET);
    batch_edge(b, false);
    t->seq = b->seq;
    int rc = batch_send(t, b, "removing sandbox", err);
    if (rc == 0) {
        struct sbx *s = *sbx_slot(t, idx);
        if (s != NULL) {
            sbx_unlink(t, s);
            sbx_free(s);
        }
    }
    pthread_mutex_unlock(&t->mu);
    if (rc < 0)
        return dsec_err_wrap(err, "sandbox %" PRIx32, idx);
    return 0;
}

int dsec__nft_sbx_replace(dsec__nft *t, uint32_t idx, const dsec__nft_elem *e, size_t n,
                          dsec_err *err)
{
    if (n > 0 && e == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "sandbox %" PRIx32 ": entries missing", idx);
    struct dsec__boxv s = {0};
    struct dsec__opv ops = {0};
    if (boxes_from_list(t, e, n, &s, &ops, err) < 0) {
        dsec_free(s.v);
        dsec_free(ops.v);
        return dsec_err_wrap(err, "sandbox %" PRIx32, idx);
    }
    struct names nm;
    names_of(t, idx, &nm);
    int rc;
    pthread_mutex_lock(&t->mu);
    struct sbx *sb = *sbx_slot(t, idx);
    if (sb == NULL) {
        rc = dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "sandbox %" PRIx32 " has no nftables chain",
                          idx);
    } else {
        struct batch *b = &t->b;
        batch_reset(b, t->seq);
        batch_edge(b, true);
        set_op(b, nm.shard, nm.set, NFT_MSG_DELSETELEM);
        ops_emit(b, &nm, &ops, now_ms());
        batch_edge(b, false);
        t->seq = b->seq;
        rc = batch_send(t, b, "replacing allow entries", err);
        if (rc == 0) {
            dsec_free(sb->b);
            sb->b = s.v;
            sb->n = s.n;
            sb->cap = s.cap;
            s.v = NULL;
        }
    }
    pthread_mutex_unlock(&t->mu);
    dsec_free(s.v);
    dsec_free(ops.v);
    if (rc < 0)
        return dsec_err_wrap(err, "sandbox %" PRIx32, idx);
    return 0;
}

int dsec__nft_sbx_pin(dsec__nft *t, uint32_t idx, const dsec__nft_elem *e, size_t n, dsec_err *err)
{
    if (n == 0)
        return 0;
    if (e == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "sandbox %" PRIx32 ": entries missing", idx);
    uint64_t now = now_ms();
    struct dsec__box *in = dsec_malloc(n * sizeof *in);
    if (in == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (elem_box(t, &e[i], now, &in[i], err) < 0) {
            dsec_free(in);
            return dsec_err_wrap(err, "sandbox %" PRIx32 ": pin %zu", idx, i);
        }
    }
    struct names nm;
    names_of(t, idx, &nm);
    int rc;
    struct dsec__boxv s = {0};
    struct dsec__opv ops = {0};
    pthread_mutex_lock(&t->mu);
    struct sbx *sb = *sbx_slot(t, idx);
    if (sb == NULL) {
        rc = dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "sandbox %" PRIx32 " has no nftables chain",
                          idx);
        goto out;
    }
    /* work on a copy without what has expired (a grace of 50 ms for the kernel's clock) */
    for (size_t i = 0; i < sb->n; i++)
        if (sb->b[i].exp_ms == 0 || sb->b[i].exp_ms + 50 > now)
            dsec__boxv_push(&s, &sb->b[i]);
    for (size_t i = 0; i < n; i++) {
        /* already covered by one box living as long: nothing to do */
        bool covered = false;
        for (size_t k = 0; k < s.n && !covered; k++)
            covered = dsec__box_contains(&s.v[k], &in[i]) && dsec__box_strong(&s.v[k], &in[i]);
        if (!covered)
            dsec__box_insert(&s, &in[i], &ops, now);
    }
    if (s.oom || ops.oom) {
        rc = dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
        goto out;
    }
    rc = 0;
    if (ops.n > 0) {
        struct batch *b = &t->b;
        batch_reset(b, t->seq);
        batch_edge(b, true);
        ops_emit(b, &nm, &ops, now_ms());
        batch_edge(b, false);
        t->seq = b->seq;
        rc = batch_send(t, b, "pinning allow entries", err);
    }
    if (rc == 0) {
        dsec_free(sb->b);
        sb->b = s.v;
        sb->n = s.n;
        sb->cap = s.cap;
        s.v = NULL;
    }
out:
    pthread_mutex_unlock(&t->mu);
    dsec_free(in);
    dsec_free(s.v);
    dsec_free(ops.v);
    if (rc < 0)
        return dsec_err_wrap(err, "sandbox %" PRIx32, idx);
    return 0;
}

/* ---- the tables ---------------------------------------------------------------------------- */

static void e_imm_chain(struct nftnl_rule *r, int verdict, const char *chain)
{
    struct nftnl_expr *e = expr(r, "immediate");
    if (e == NULL)
        return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_DREG, NFT_REG_VERDICT);
    nftnl_expr_set_u32(e, NFTNL_EXPR_IMM_VERDICT, (uint32_t)verdict);
    nftnl_expr_set_str(e, NFTNL_EXPR_IMM_CHAIN, chain);
}

/* meta iifname -> reg 1; add @set { iifname limit rate [over] rate/s burst burst } */
static void e_meter(struct nftnl_rule *r, const char *set, uint32_t rate, uint32_t burst, bool over)
{
    e_meta(r, NFT_META_IIFNAME, NFT_REG_1);
    struct nftnl_expr *e = expr(r, "dynset");
    if (e == NULL)
        return;
    nftnl_expr_set_u32(e, NFTNL_EXPR_DYNSET_SREG_KEY, NFT_REG_1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_DYNSET_OP, NFT_DYNSET_OP_ADD);
    nftnl_expr_set_str(e, NFTNL_EXPR_DYNSET_SET_NAME, set);
    struct nftnl_expr *l = nftnl_expr_alloc("limit");
    if (l == NULL) {
        expr_oom = true;
        return;
    }
    nftnl_expr_set_u64(l, NFTNL_EXPR_LIMIT_RATE, rate);
    nftnl_expr_set_u64(l, NFTNL_EXPR_LIMIT_UNIT, 1);
    nftnl_expr_set_u32(l, NFTNL_EXPR_LIMIT_BURST, burst);
    nftnl_expr_set_u32(l, NFTNL_EXPR_LIMIT_TYPE, NFT_LIMIT_PKTS);
    nftnl_expr_set_u32(l, NFTNL_EXPR_LIMIT_FLAGS, over ? NFT_LIMIT_F_INV : 0);
    nftnl_expr_set(e, NFTNL_EXPR_DYNSET_EXPR, l, 0);
}

/* meta nfproto F; iifname . saddr not in @src4/@src6 (or no address of that family) -> drop */
static void spoof_rules(struct batch *b, const dsec__nft *t, const char *chain)
{
    for (int f = 0; f < 2; f++) {
        bool is4 = f == 0;
        struct nftnl_rule *r = rule_new(t->table, chain);
        e_nfproto(r, is4 ? NFPROTO_IPV4 : NFPROTO_IPV6);
        if (is4 || t->c.v6) {
            e_meta(r, NFT_META_IIFNAME, NFT_REG32_00);
            e_payload(r, NFT_PAYLOAD_NETWORK_HEADER, is4 ? OFF_SADDR4 : OFF_SADDR6, is4 ? 4 : 16,
                      NFT_REG32_04);
            e_lookup(r, NFT_REG32_00, is4 ? "src4" : "src6", true, false);
        }
        e_verdict(r, NF_DROP);
        rule_add(b, r, chain);
    }
}

static uint32_t burst_of(uint32_t rate)
{
    return rate > LIMIT_BURST ? rate : LIMIT_BURST;
}

static void main_rules(struct batch *b, const dsec__nft *t)
{
    const char *tb = t->table;
    /* sandbox traffic leaves the base chains for the shared sandbox chains */
    for (int i = 0; i < 2; i++) {
        const char *chain = i == 0 ? "forward" : "input";
        struct nftnl_rule *r = rule_new(tb, chain);
        e_meta(r, NFT_META_IIFNAME, NFT_REG_1);
        e_lookup(r, NFT_REG_1, "ifs", false, false);
        e_imm_chain(r, NFT_GOTO, i == 0 ? "sbx_fwd" : "sbx_in");
        rule_add(b, r, chain);
    }
    /* sbx_fwd: what holds for every sandbox; what it may reach is its shard chain's business */
    spoof_rules(b, t, "sbx_fwd");
    struct nftnl_rule *r;
    if (t->c.conn_rate > 0) {
        r = rule_new(tb, "sbx_fwd");
        e_ct_state(r, NF_CT_STATE_BIT(IP_CT_NEW));
        /* a burst of one second's worth: a sandbox opening a dozen connections at once (a
         * browser, a parallel download) must not lose SYNs to a five-packet bucket */
        e_meter(r, "connm", t->c.conn_rate, burst_of(t->c.conn_rate), true);
        e_verdict(r, NF_DROP);
        rule_add(b, r, "sbx_fwd");
    }
    /* sbx_in: a sandbox talking to the node */
    if (t->c.v6) {
        /* neighbour discovery (NS to the gateway may come from a link-local address) */
        r = rule_new(tb, "sbx_in");
        e_meta(r, NFT_META_L4PROTO, NFT_REG_1);
        e_cmp8(r, NFT_CMP_EQ, IPPROTO_ICMPV6);
        e_payload(r, NFT_PAYLOAD_NETWORK_HEADER, 7, 1, NFT_REG_1);
        e_cmp8(r, NFT_CMP_EQ, 255);
        e_payload(r, NFT_PAYLOAD_TRANSPORT_HEADER, 0, 1, NFT_REG_1);
        e_cmp8(r, NFT_CMP_GTE, 133);
        e_cmp8(r, NFT_CMP_LTE, 136);
        e_verdict(r, NF_ACCEPT);
        rule_add(b, r, "sbx_in");
    }
    spoof_rules(b, t, "sbx_in");
    /* only unicast to the node counts; multicast chatter (MLD, mDNS) is dropped quietly */
    r = rule_new(tb, "sbx_in");
    e_meta(r, NFT_META_PKTTYPE, NFT_REG_1);
    e_cmp8(r, NFT_CMP_NEQ, PACKET_HOST);
    e_verdict(r, NF_DROP);
    rule_add(b, r, "sbx_in");
    uint16_t port = htons(t->c.dns_port);
    if (t->c.dns_rate > 0) {
        r = rule_new(tb, "sbx_in");
        e_meta(r, NFT_META_L4PROTO, NFT_REG_1);
        e_lookup(r, NFT_REG_1, "tcpudp", false, false);
        e_payload(r, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, NFT_REG_1);
        e_cmp(r, NFT_CMP_EQ, &port, 2);
        e_meter(r, "dnsm", t->c.dns_rate, burst_of(t->c.dns_rate), true);
        e_verdict(r, NF_DROP);
        rule_add(b, r, "sbx_in");
    }
    for (int f = 0; f < (t->c.v6 ? 2 : 1); f++) {
        bool is4 = f == 0;
        r = rule_new(tb, "sbx_in");
        e_nfproto(r, is4 ? NFPROTO_IPV4 : NFPROTO_IPV6);
        if (is4)
            e_addr(r, OFF_DADDR4, 4, (const uint8_t *)&t->c.gw4, 32, NFT_CMP_EQ);
        else
            e_addr(r, OFF_DADDR6, 16, t->c.gw6.s6_addr, 128, NFT_CMP_EQ);
        e_meta(r, NFT_META_L4PROTO, NFT_REG_1);
        e_lookup(r, NFT_REG_1, "tcpudp", false, false);
        e_payload(r, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, NFT_REG_1);
        e_cmp(r, NFT_CMP_EQ, &port, 2);
        e_verdict(r, NF_ACCEPT);
        rule_add(b, r, "sbx_in");
    }
    /* connections the node opened into the sandbox */
    r = rule_new(tb, "sbx_in");
    e_ct_state(r, NF_CT_STATE_BIT(IP_CT_ESTABLISHED) | NF_CT_STATE_BIT(IP_CT_RELATED));
    e_verdict(r, NF_ACCEPT);
    rule_add(b, r, "sbx_in");
    if (t->c.log_rate > 0) {
        /* shared chain: the reader maps the input interface back to the sandbox */
        r = rule_new(tb, "sbx_in");
        e_meter(r, "logm", t->c.log_rate, LIMIT_BURST, false);
        e_log(r, t->c.log_group, LOG_PREFIX_IN);
        rule_add(b, r, "sbx_in");
    }
    r = rule_new(tb, "sbx_in");
    e_verdict(r, NF_DROP);
    rule_add(b, r, "sbx_in");

    for (int f = 0; f < (t->c.v6 ? 2 : 1); f++) {
        bool is4 = f == 0;
        uint8_t nfp = is4 ? NFPROTO_IPV4 : NFPROTO_IPV6;
        unsigned len = is4 ? 4 : 16;
        const uint8_t *pool = is4 ? (const uint8_t *)&t->c.pool4 : t->c.pool6.s6_addr;
        unsigned plen = is4 ? t->c.pool4_len : t->c.pool6_len;
        uint32_t soff = is4 ? OFF_SADDR4 : OFF_SADDR6, doff = is4 ? OFF_DADDR4 : OFF_DADDR6;

        /* forward: a sandbox veth not (yet) in the table sends nothing */
        r = rule_new(tb, "forward");
        e_nfproto(r, nfp);
        e_addr(r, soff, len, pool, plen, NFT_CMP_EQ);
        e_verdict(r, NF_DROP);
        rule_add(b, r, "forward");
        /* replies into sandboxes pass; nothing else enters one */
        r = rule_new(tb, "forward");
        e_nfproto(r, nfp);
        e_addr(r, doff, len, pool, plen, NFT_CMP_EQ);
        e_ct_state(r, NF_CT_STATE_BIT(IP_CT_ESTABLISHED) | NF_CT_STATE_BIT(IP_CT_RELATED));
        e_verdict(r, NF_ACCEPT);
        rule_add(b, r, "forward");
        r = rule_new(tb, "forward");
        e_nfproto(r, nfp);
        e_addr(r, doff, len, pool, plen, NFT_CMP_EQ);
        e_verdict(r, NF_DROP);
        rule_add(b, r, "forward");
        /* input: the same for the node itself (its own traffic to the gateway comes by lo) */
        r = rule_new(tb, "input");
        e_meta(r, NFT_META_IIFTYPE, NFT_REG_1);
        uint16_t lo = ARPHRD_LOOPBACK;
        e_cmp(r, NFT_CMP_NEQ, &lo, 2);
        e_nfproto(r, nfp);
        e_addr(r, soff, len, pool, plen, NFT_CMP_EQ);
        e_verdict(r, NF_DROP);
        rule_add(b, r, "input");
        if (t->c.masquerade) {
            r = rule_new(tb, "post");
            e_nfproto(r, nfp);
            e_addr(r, soff, len, pool, plen, NFT_CMP_EQ);
            e_addr(r, doff, len, pool, plen, NFT_CMP_NEQ);
            expr(r, "masq");
            rule_add(b, r, "post");
        }
    }
}

static int open_nl(struct mnl_socket **out, uint32_t *portid, dsec_err *err)
{
    struct mnl_socket *nl = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
    if (nl == NULL)
        return dsec_err_set(err, DSEC_E_IO, errno, "opening a netfilter netlink socket: %s",
                            strerror(errno));
    if (mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
        int e = errno;
        mnl_socket_close(nl);
        return dsec_err_set(err, DSEC_E_IO, e, "binding a netfilter netlink socket: %s",
                            strerror(e));
    }
    int one = 1, sz = 1 << 20;
    mnl_socket_setsockopt(nl, NETLINK_CAP_ACK, &one, sizeof one);
    mnl_socket_setsockopt(nl, NETLINK_EXT_ACK, &one, sizeof one);
    setsockopt(mnl_socket_get_fd(nl), SOL_SOCKET, SO_RCVBUFFORCE, &sz, sizeof sz);
    sz = 4 << 20;
    setsockopt(mnl_socket_get_fd(nl), SOL_SOCKET, SO_SNDBUFFORCE, &sz, sizeof sz);
    *out = nl;
    if (portid != NULL)
        *portid = mnl_socket_get_portid(nl);
    return 0;
}

static void table_msg(struct batch *b, const char *name, uint16_t type)
{
    struct nftnl_table *tb = nftnl_table_alloc();
    if (tb == NULL) {
        b->oom = true;
        return;
    }
    nftnl_table_set_str(tb, NFTNL_TABLE_NAME, name);
    nftnl_table_set_u32(tb, NFTNL_TABLE_FAMILY, NFPROTO_INET);
    struct nlmsghdr *nlh = msg_begin(b, type, type == NFT_MSG_NEWTABLE ? NLM_F_CREATE : 0, 256,
                                     type == NFT_MSG_NEWTABLE ? "table" : "deleting table", name);
    if (nlh != NULL) {
        nftnl_table_nlmsg_build_payload(nlh, tb);
        msg_end(b, nlh);
    }
    nftnl_table_free(tb);
}

/* Parse the deny list (built-in and conf) into ranges per family. */
static int deny_ranges(const dsec__nft_conf *c, struct range *r4, size_t *n4, struct range *r6,
                       size_t *n6, dsec_err *err)
{
    static const char *const builtin[] = {
        "0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4",       "240.0.0.0/4",  "::/128",
        "::1/128",   "fe80::/10",   "ff00::/8",       "fd00:ec2::254/128", "::ffff:0:0/96"};
    size_t nb = sizeof builtin / sizeof builtin[0];
    *n4 = *n6 = 0;
    dsec__prefix_range((const uint8_t *)&c->pool4, c->pool4_len, 4, r4[*n4].lo, r4[*n4].hi);
    (*n4)++;
    if (c->v6) {
        dsec__prefix_range(c->pool6.s6_addr, c->pool6_len, 16, r6[*n6].lo, r6[*n6].hi);
        (*n6)++;
    }
    for (size_t i = 0; i < nb + c->ndeny; i++) {
        const char *s = i < nb ? builtin[i] : c->deny[i - nb];
        int fam;
        uint8_t a[16];
        unsigned plen;
        if (dsec__parse_cidr(s, &fam, a, &plen) < 0)
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "denied destination \"%s\" is not an address or CIDR prefix",
                                s ? s : "(null)");
        if (fam == AF_INET) {
            dsec__prefix_range(a, plen, 4, r4[*n4].lo, r4[*n4].hi);
            (*n4)++;
        } else {
            dsec__prefix_range(a, plen, 16, r6[*n6].lo, r6[*n6].hi);
            (*n6)++;
        }
    }
    return 0;
}

int dsec__nft_new(dsec__nft **out, const dsec__nft_conf *c, dsec_err *err)
{
    *out = NULL;
    if (c == NULL || c->table == NULL || c->table[0] == 0 || strlen(c->table) >= 60)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "nftables table name missing or too long");
    if (c->pool4_len > 32 || (c->v6 && c->pool6_len > 128))
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "sandbox pool prefix length out of range");
    if (c->dns_port == 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "DNS port 0");
    if (c->ndeny > 0 && c->deny == NULL)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "denied destinations missing");
    size_t nr = 16 + c->ndeny;
    struct range *r4 = dsec_calloc(nr, sizeof *r4), *r6 = dsec_calloc(nr, sizeof *r6);
    dsec__nft *t = dsec_calloc(1, sizeof *t);
    int rc = -1;
    size_t n4 = 0, n6 = 0;
    if (r4 == NULL || r6 == NULL || t == NULL) {
        dsec_free(t);
        t = NULL;
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
        goto out;
    }
    if (deny_ranges(c, r4, &n4, r6, &n6, err) < 0) {
        dsec_free(t);
        t = NULL;
        goto out;
    }
    pthread_mutex_init(&t->mu, NULL);
    t->log_efd = -1;
    snprintf(t->table, sizeof t->table, "%s", c->table);
    for (int k = 0; k < NSHARDS; k++)
        snprintf(t->shard[k], sizeof t->shard[k], "%s_%d", c->table, k);
    t->c = *c;
    t->c.table = t->table;
    t->c.deny = NULL;
    t->c.ndeny = 0;
    t->nbuckets = 1024;
    t->ht = dsec_calloc(t->nbuckets, sizeof *t->ht);
    t->iht = dsec_calloc(t->nbuckets, sizeof *t->iht);
    if (t->ht == NULL || t->iht == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
        goto out;
    }
    if (open_nl(&t->nl, &t->portid, err) < 0)
        goto out;
    t->seq = (uint32_t)time(NULL);

    struct batch *b = &t->b;
    /* Every batch here relies on the delete-if-present messages (Linux 6.3):
     * ask once, so an older kernel gets a plain answer instead of a failure
     * deep in a sandbox's create. */
    batch_reset(b, t->seq);
    batch_edge(b, true);
    char probe[40];
    snprintf(probe, sizeof probe, "dsec_probe_%d", (int)getpid());
    table_msg(b, probe, NFT_MSG_DESTROYTABLE);
    batch_edge(b, false);
    t->seq = b->seq;
    if (batch_send(t, b, "probing the kernel's nftables", err) < 0) {
        if (err->errnum == EOPNOTSUPP || err->errnum == EINVAL) {
            struct utsname u;
            uname(&u);
            dsec_err_set(err, DSEC_E_UNSUPPORTED, err->errnum,
                         "network containment needs Linux 6.3 or newer (nftables "
                         "delete-if-present messages); this kernel is %s",
                         u.release);
        }
        goto out;
    }
    batch_reset(b, t->seq);
    batch_edge(b, true);
    /* replace stale tables in the same transaction: sandboxes are never uncontained */
    const char *tb = t->table;
    table_msg(b, tb, NFT_MSG_DESTROYTABLE);
    table_msg(b, tb, NFT_MSG_NEWTABLE);
    static const uint8_t f4[] = {IFNAMSIZ, 4}, f6[] = {IFNAMSIZ, 16};
    set_add(b, tb, "ifs", DT_IFNAME, IFNAMSIZ, 0, NULL, 0, false);
    set_add(b, tb, "src4", (DT_IFNAME << 6) | DT_IPADDR, IFNAMSIZ + 4, NFT_SET_CONCAT, f4, 2,
            false);
    if (c->v6)
        set_add(b, tb, "src6", (DT_IFNAME << 6) | DT_IP6ADDR, IFNAMSIZ + 16, NFT_SET_CONCAT, f6, 2,
                false);
    set_add(b, tb, "tcpudp", DT_INET_PROTO, 1, 0, NULL, 0, false);
    struct nftnl_set *so = set_obj(tb, "tcpudp");
    for (int i = 0; i < 2 && so != NULL; i++) {
        struct nftnl_set_elem *e = nftnl_set_elem_alloc();
        if (e == NULL) {
            b->oom = true;
            break;
        }
        uint8_t p = i == 0 ? IPPROTO_TCP : IPPROTO_UDP;
        nftnl_set_elem_set(e, NFTNL_SET_ELEM_KEY, &p, 1);
        nftnl_set_elem_add(so, e);
    }
    elems_send(b, so, NFT_MSG_NEWSETELEM, 2, "elements of set", "tcpudp");
    set_add(b, tb, "connm", DT_IFNAME, IFNAMSIZ, NFT_SET_EVAL | NFT_SET_TIMEOUT, NULL, 0, false);
    set_add(b, tb, "dnsm", DT_IFNAME, IFNAMSIZ, NFT_SET_EVAL | NFT_SET_TIMEOUT, NULL, 0, false);
    set_add(b, tb, "logm", DT_IFNAME, IFNAMSIZ, NFT_SET_EVAL | NFT_SET_TIMEOUT, NULL, 0, false);
    chain_add(b, tb, "forward", "filter", NF_INET_FORWARD, -2);
    chain_add(b, tb, "input", "filter", NF_INET_LOCAL_IN, -2);
    chain_add(b, tb, "sbx_fwd", NULL, 0, 0);
    chain_add(b, tb, "sbx_in", NULL, 0, 0);
    if (c->masquerade)
        chain_add(b, tb, "post", "nat", NF_INET_POST_ROUTING, 100);
    main_rules(b, t);
    /* the shards: after the main table (priority filter - 1), each maps its sandboxes'
     * interfaces to their chains */
    for (int k = 0; k < NSHARDS; k++) {
        tb = t->shard[k];
        table_msg(b, tb, NFT_MSG_DESTROYTABLE);
        table_msg(b, tb, NFT_MSG_NEWTABLE);
        set_add(b, tb, "vfwd", DT_IFNAME, IFNAMSIZ, 0, NULL, 0, true);
        set_add(b, tb, "deny4", DT_IPADDR, 4, NFT_SET_INTERVAL, NULL, 0, false);
        deny_elems(b, tb, "deny4", AF_INET, r4, n4);
        if (c->v6) {
            set_add(b, tb, "deny6", DT_IP6ADDR, 16, NFT_SET_INTERVAL, NULL, 0, false);
            deny_elems(b, tb, "deny6", AF_INET6, r6, n6);
        }
        chain_add(b, tb, "forward", "filter", NF_INET_FORWARD, -1);
        struct nftnl_rule *r = rule_new(tb, "forward");
        e_meta(r, NFT_META_IIFNAME, NFT_REG_1);
        e_lookup(r, NFT_REG_1, "vfwd", false, true);
        rule_add(b, r, "forward");
    }
    batch_edge(b, false);
    t->seq = b->seq;
    if (batch_send(t, b, "creating the nftables tables", err) < 0) {
        dsec_err_wrap(err, "table inet %s", t->table);
        goto out;
    }
    *out = t;
    t = NULL;
    rc = 0;
out:
    dsec_free(r4);
    dsec_free(r6);
    if (t != NULL)
        dsec__nft_free(t, false);
    return rc;
}

static void log_stop(dsec__nft *t)
{
    if (t->log_running) {
        uint64_t one = 1;
        ssize_t w = write(t->log_efd, &one, sizeof one);
        (void)w;
        pthread_join(t->log_thr, NULL);
        t->log_running = false;
    }
    if (t->log_nl != NULL) {
        mnl_socket_close(t->log_nl);
        t->log_nl = NULL;
    }
    if (t->log_efd >= 0) {
        close(t->log_efd);
        t->log_efd = -1;
    }
}

void dsec__nft_free(dsec__nft *t, bool remove_table)
{
    if (t == NULL)
        return;
    log_stop(t);
    if (remove_table && t->nl != NULL) {
        pthread_mutex_lock(&t->mu);
        struct batch *b = &t->b;
        batch_reset(b, t->seq);
        batch_edge(b, true);
        table_msg(b, t->table, NFT_MSG_DESTROYTABLE);
        for (int k = 0; k < NSHARDS; k++)
            table_msg(b, t->shard[k], NFT_MSG_DESTROYTABLE);
        batch_edge(b, false);
        dsec_err e;
        if (batch_send(t, b, "removing the tables", &e) < 0)
            fprintf(stderr, "dsec: nftables: %s\n", e.msg);
        pthread_mutex_unlock(&t->mu);
    }
    if (t->nl != NULL)
        mnl_socket_close(t->nl);
    if (t->ht != NULL) {
        for (size_t i = 0; i < t->nbuckets; i++) {
            for (struct sbx *s = t->ht[i], *next; s != NULL; s = next) {
                next = s->next;
                sbx_free(s);
            }
        }
    }
    dsec_free(t->ht);
    dsec_free(t->iht);
    batch_fini(&t->b);
    pthread_mutex_destroy(&t->mu);
    dsec_free(t);
}

/* ---- conntrack ------------------------------------------------------------------------------ */

struct ct_dump {
    int family;
    const uint8_t *src;
    struct nf_conntrack **v;
    size_t n, cap;
    bool oom;
};

static int ct_collect(enum nf_conntrack_msg_type type, struct nf_conntrack *ct, void *data)
{
    (void)type;
    struct ct_dump *d = data;
    const void *s =
        nfct_get_attr(ct, d->family == AF_INET ? ATTR_ORIG_IPV4_SRC : ATTR_ORIG_IPV6_SRC);
    if (s == NULL || memcmp(s, d->src, dsec__addr_len(d->family)) != 0)
        return NFCT_CB_CONTINUE;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 32;
        struct nf_conntrack **v = dsec_realloc(d->v, cap * sizeof *v);
        if (v == NULL) {
            d->oom = true;
            return NFCT_CB_STOP;
        }
        d->v = v;
        d->cap = cap;
    }
    struct nf_conntrack *c = nfct_clone(ct);
    if (c == NULL) {
        d->oom = true;
        return NFCT_CB_STOP;
    }
    d->v[d->n++] = c;
    return NFCT_CB_CONTINUE;
}

int dsec__nft_ct_cut(int family, const uint8_t *src,
                     bool (*keep)(void *ud, int family, const uint8_t *dst, uint8_t proto,
                                  uint16_t dport),
                     void *ud, dsec_err *err)
{
    if ((family != AF_INET && family != AF_INET6) || src == NULL || keep == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "conntrack cut: bad family, source or callback");
    struct nfct_handle *h = nfct_open(CONNTRACK, 0);
    if (h == NULL)
        return dsec_err_set(err, DSEC_E_IO, errno, "conntrack cut: opening ctnetlink: %s",
                            strerror(errno));
    struct ct_dump d = {.family = family, .src = src};
    nfct_callback_register(h, NFCT_T_ALL, ct_collect, &d);
    uint32_t fam = (uint32_t)family;
    int rc = 0;
    if (nfct_query(h, NFCT_Q_DUMP, &fam) < 0 && !d.oom)
        rc = dsec_err_set(err, DSEC_E_IO, errno, "conntrack cut: dumping the conntrack table: %s",
                          strerror(errno));
    else if (d.oom)
        rc = dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "conntrack cut: out of memory");
    nfct_callback_unregister(h);
    for (size_t i = 0; i < d.n; i++) {
        struct nf_conntrack *ct = d.v[i];
        if (rc == 0) {
            const uint8_t *dst =
                nfct_get_attr(ct, family == AF_INET ? ATTR_ORIG_IPV4_DST : ATTR_ORIG_IPV6_DST);
            uint8_t proto = nfct_get_attr_u8(ct, ATTR_ORIG_L4PROTO);
            uint16_t dport = 0;
            if (proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP ||
                proto == IPPROTO_UDPLITE || proto == IPPROTO_DCCP)
                dport = ntohs(nfct_get_attr_u16(ct, ATTR_ORIG_PORT_DST));
            if (dst != NULL && !keep(ud, family, dst, proto, dport) &&
                nfct_query(h, NFCT_Q_DESTROY, ct) < 0 && errno != ENOENT)
                rc = dsec_err_set(err, DSEC_E_IO, errno, "conntrack cut: deleting a connection: %s",
                                  strerror(errno));
        }
        nfct_destroy(ct);
    }
    dsec_free(d.v);
    nfct_close(h);
    return rc;
}

/* ---- NFLOG ---------------------------------------------------------------------------------- */

static int nflog_config(struct mnl_socket *nl, uint16_t group, uint8_t cmd, bool mode,
                        dsec_err *err)
{
    char buf[512] __attribute__((aligned(4))) = {0};
    struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
    nlh->nlmsg_type = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG;
    nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
    nlh->nlmsg_seq = (uint32_t)time(NULL);
    struct nfgenmsg *g = mnl_nlmsg_put_extra_header(nlh, sizeof *g);
    g->nfgen_family = AF_UNSPEC;
    g->version = NFNETLINK_V0;
    g->res_id = htons(group);
    if (mode) {
        struct nfulnl_msg_config_mode m = {.copy_range = htonl(LOG_SNAPLEN),
                                           .copy_mode = NFULNL_COPY_PACKET};
        mnl_attr_put(nlh, NFULA_CFG_MODE, sizeof m, &m);
        mnl_attr_put_u32(nlh, NFULA_CFG_QTHRESH, htonl(1)); /* deliver each at once */
    } else {
        struct nfulnl_msg_config_cmd cm = {.command = cmd};
        mnl_attr_put(nlh, NFULA_CFG_CMD, sizeof cm, &cm);
    }
    if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "NFLOG group %u: sending config: %s", group,
                            strerror(errno));
    for (;;) {
        ssize_t n = mnl_socket_recvfrom(nl, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return dsec_err_set(err, DSEC_E_IO, errno, "NFLOG group %u: reading config ack: %s",
                                group, strerror(errno));
        }
        int r = mnl_cb_run(buf, (size_t)n, nlh->nlmsg_seq, mnl_socket_get_portid(nl), NULL, NULL);
        if (r < 0)
            return dsec_err_set(err, DSEC_E_IO, errno, "NFLOG group %u: %s%s", group,
                                strerror(errno),
                                errno == EBUSY ? " (another process reads this group)" : "");
        if (r == MNL_CB_STOP)
            return 0;
    }
}

/* One logged packet -> block (0 when it parses). */
static int parse_block(dsec__nft *t, const struct nlattr **tb, dsec__nft_block *out)
{
    if (tb[NFULA_PREFIX] == NULL || tb[NFULA_PAYLOAD] == NULL)
        return -1;
    const char *prefix = mnl_attr_get_str(tb[NFULA_PREFIX]);
    unsigned long idx;
    if (strcmp(prefix, LOG_PREFIX_IN) == 0) {
        /* the shared input chain: which sandbox is known by the interface it came in by */
        char ifname[IF_NAMESIZE];
        if (tb[NFULA_IFINDEX_INDEV] == NULL ||
            if_indextoname(ntohl(mnl_attr_get_u32(tb[NFULA_IFINDEX_INDEV])), ifname) == NULL)
            return -1;
        pthread_mutex_lock(&t->mu);
        struct sbx *s = *sbx_islot(t, ifname);
        bool found = s != NULL;
        idx = found ? s->idx : 0;
        pthread_mutex_unlock(&t->mu);
        if (!found)
            return -1;
    } else {
        if (strncmp(prefix, "dsec:", 5) != 0 || prefix[5] < '0' || prefix[5] > '9')
            return -1;
        char *end;
        errno = 0;
        idx = strtoul(prefix + 5, &end, 10);
        if (errno != 0 || *end != 0 || idx > UINT32_MAX)
            return -1;
    }
    const uint8_t *p = mnl_attr_get_payload(tb[NFULA_PAYLOAD]);
    size_t len = mnl_attr_get_payload_len(tb[NFULA_PAYLOAD]);
    memset(out, 0, sizeof *out);
    out->idx = (uint32_t)idx;
    if (len < 1)
        return -1;
    size_t thoff;
    uint8_t proto;
    bool first_frag = true;
    if ((p[0] >> 4) == 4) {
        if (len < 20 || (p[0] & 0xf) < 5)
            return -1;
        out->family = AF_INET;
        memcpy(out->dst, p + 16, 4);
        proto = p[9];
        thoff = (size_t)(p[0] & 0xf) * 4;
        first_frag = ((p[6] & 0x1f) | p[7]) == 0;
    } else if ((p[0] >> 4) == 6) {
        if (len < 40)
            return -1;
        out->family = AF_INET6;
        memcpy(out->dst, p + 24, 16);
        proto = p[6];
        thoff = 40;
        /* skip extension headers */
        for (int hops = 0; hops < 8; hops++) {
            if (proto == 0 || proto == 43 || proto == 60) {
                if (len < thoff + 8)
                    break;
                uint8_t nx = p[thoff];
                thoff += ((size_t)p[thoff + 1] + 1) * 8;
                proto = nx;
            } else if (proto == 44) {
                if (len < thoff + 8)
                    break;
                uint8_t nx = p[thoff];
                first_frag = ((p[thoff + 2] << 8 | p[thoff + 3]) & 0xfff8) == 0;
                thoff += 8;
                proto = nx;
            } else {
                break;
            }
        }
    } else {
        return -1;
    }
    out->proto = proto;
    if ((proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP ||
         proto == IPPROTO_UDPLITE || proto == IPPROTO_DCCP) &&
        first_frag && len >= thoff + 4)
        out->dport = (uint16_t)(p[thoff + 2] << 8 | p[thoff + 3]);
    return 0;
}

static int log_attr_cb(const struct nlattr *a, void *data)
{
    const struct nlattr **tb = data;
    int type = mnl_attr_get_type(a);
    if (mnl_attr_type_valid(a, NFULA_MAX) < 0)
        return MNL_CB_OK;
    if (type == NFULA_PREFIX && mnl_attr_validate(a, MNL_TYPE_NUL_STRING) < 0)
        return MNL_CB_OK;
    tb[type] = a;
    return MNL_CB_OK;
}

static int log_msg_cb(const struct nlmsghdr *nlh, void *data)
{
    dsec__nft *t = data;
    if ((nlh->nlmsg_type & 0xff) != NFULNL_MSG_PACKET)
        return MNL_CB_OK;
    const struct nlattr *tb[NFULA_MAX + 1] = {0};
    if (mnl_attr_parse(nlh, sizeof(struct nfgenmsg), log_attr_cb, tb) < 0)
        return MNL_CB_OK;
    dsec__nft_block blk;
    if (parse_block(t, tb, &blk) == 0)
        t->log_fn(t->log_ud, &blk);
    return MNL_CB_OK;
}

static void *log_main(void *arg)
{
    dsec__nft *t = arg;
    size_t cap = 65536;
    char *buf = dsec_malloc(cap);
    if (buf == NULL)
        return NULL;
    struct pollfd pf[2] = {{mnl_socket_get_fd(t->log_nl), POLLIN, 0}, {t->log_efd, POLLIN, 0}};
    for (;;) {
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (pf[1].revents)
            break;
        if (!(pf[0].revents & POLLIN))
            continue;
        ssize_t n = recv(pf[0].fd, buf, cap, MSG_DONTWAIT);
        if (n < 0) {
            /* ENOBUFS: the kernel dropped log messages while we were slow; go on */
            continue;
        }
        mnl_cb_run(buf, (size_t)n, 0, 0, log_msg_cb, t);
    }
    dsec_free(buf);
    return NULL;
}

int dsec__nft_log_start(dsec__nft *t, void (*fn)(void *ud, const dsec__nft_block *b), void *ud,
                        dsec_err *err)
{
    if (fn == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "NFLOG reader: no callback");
    if (t->log_running)
        return dsec_err_set(err, DSEC_E_STATE, 0, "NFLOG reader already running");
    if (open_nl(&t->log_nl, NULL, err) < 0)
        return dsec_err_wrap(err, "NFLOG reader");
    t->log_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (t->log_efd < 0) {
        int e = errno;
        log_stop(t);
        return dsec_err_set(err, DSEC_E_IO, e, "NFLOG reader: eventfd: %s", strerror(e));
    }
    if (nflog_config(t->log_nl, t->c.log_group, NFULNL_CFG_CMD_BIND, false, err) < 0 ||
        nflog_config(t->log_nl, t->c.log_group, 0, true, err) < 0) {
        log_stop(t);
        return -1;
    }
    t->log_fn = fn;
    t->log_ud = ud;
    int e = pthread_create(&t->log_thr, NULL, log_main, t);
    if (e != 0) {
        log_stop(t);
        return dsec_err_set(err, DSEC_E_IO, e, "NFLOG reader: starting its thread: %s",
                            strerror(e));
    }
    t->log_running = true;
    return 0;
}
