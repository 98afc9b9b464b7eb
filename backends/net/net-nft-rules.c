/* net-nft-rules.c - the rules of the node's nftables tables, expression by expression: the main
 * table's shared chains, each shard's dispatch, and each sandbox's own chain. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <net/if_arp.h>
#include <linux/if_packet.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_conntrack_common.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netlink.h>
#include <net/if.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <libnftnl/expr.h>
#include <libnftnl/rule.h>

#include "backends/net/net-box.h"
#include "backends/net/net-int.h"
#include "backends/net/net-nft-int.h"
#include "dsec/alloc.h"

/* ---- expressions -------------------------------------------------------------------------- */

/* A rule missing one expression could match more than meant (a lookup lost from an accept
 * rule accepts everything), so a failed allocation poisons the rule being built, and
 * rule_add then fails the whole batch. Rules are built by one thread at a time per table,
 * but tables are independent: thread-local. */
static __thread bool expr_oom;

struct nftnl_rule *dsec__nft_rule_new(const char *table, const char *chain)
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

/* limit rate [over] rate/s burst burst packets, into the limit expression e */
static void limit_set(struct nftnl_expr *e, uint32_t rate, uint32_t burst, bool over)
{
    nftnl_expr_set_u64(e, NFTNL_EXPR_LIMIT_RATE, rate);
    nftnl_expr_set_u64(e, NFTNL_EXPR_LIMIT_UNIT, 1);
    nftnl_expr_set_u32(e, NFTNL_EXPR_LIMIT_BURST, burst);
    nftnl_expr_set_u32(e, NFTNL_EXPR_LIMIT_TYPE, NFT_LIMIT_PKTS);
    nftnl_expr_set_u32(e, NFTNL_EXPR_LIMIT_FLAGS, over ? NFT_LIMIT_F_INV : 0);
}

static void e_limit(struct nftnl_rule *r, uint32_t rate, bool over)
{
    struct nftnl_expr *e = expr(r, "limit");
    if (e == NULL)
        return;
    limit_set(e, rate, LIMIT_BURST, over);
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
    struct nlmsghdr *nlh = dsec__nft_msg_begin(b, NFT_MSG_NEWRULE, NLM_F_APPEND | NLM_F_CREATE,
                                               4096, "a rule of chain", chain);
    if (nlh != NULL) {
        nftnl_rule_nlmsg_build_payload(nlh, r);
        dsec__nft_msg_end(b, nlh);
    }
    nftnl_rule_free(r);
}

/* ---- the main table's shared chains -----------------------------------------------------------
 */

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
    limit_set(l, rate, burst, over);
    nftnl_expr_set(e, NFTNL_EXPR_DYNSET_EXPR, l, 0);
}

/* meta nfproto F; iifname . saddr not in @src4/@src6 (or no address of that family) -> drop */
static void spoof_rules(struct batch *b, const dsec__nft *t, const char *chain)
{
    for (int f = 0; f < 2; f++) {
        bool is4 = f == 0;
        struct nftnl_rule *r = dsec__nft_rule_new(t->table, chain);
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

/* Sandbox traffic leaves the base chains for the shared sandbox chains. */
static void base_jumps(struct batch *b, const dsec__nft *t)
{
    const char *tb = t->table;
    for (int i = 0; i < 2; i++) {
        const char *chain = i == 0 ? "forward" : "input";
        struct nftnl_rule *r = dsec__nft_rule_new(tb, chain);
        e_meta(r, NFT_META_IIFNAME, NFT_REG_1);
        e_lookup(r, NFT_REG_1, "ifs", false, false);
        e_imm_chain(r, NFT_GOTO, i == 0 ? "sbx_fwd" : "sbx_in");
        rule_add(b, r, chain);
    }
}

/* sbx_fwd: what holds for every sandbox; what it may reach is its shard chain's business */
static void sbx_fwd_rules(struct batch *b, const dsec__nft *t)
{
    spoof_rules(b, t, "sbx_fwd");
    if (t->c.conn_rate > 0) {
        struct nftnl_rule *r = dsec__nft_rule_new(t->table, "sbx_fwd");
        e_ct_state(r, NF_CT_STATE_BIT(IP_CT_NEW));
        /* a burst of one second's worth: a sandbox opening a dozen connections at once (a
         * browser, a parallel download) must not lose SYNs to a five-packet bucket */
        e_meter(r, "connm", t->c.conn_rate, burst_of(t->c.conn_rate), true);
        e_verdict(r, NF_DROP);
        rule_add(b, r, "sbx_fwd");
    }
}

/* meta l4proto @tcpudp th dport port */
static void e_dport(struct nftnl_rule *r, const uint16_t *port)
{
    e_meta(r, NFT_META_L4PROTO, NFT_REG_1);
    e_lookup(r, NFT_REG_1, "tcpudp", false, false);
    e_payload(r, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, NFT_REG_1);
    e_cmp(r, NFT_CMP_EQ, port, 2);
}

/* sbx_in, DNS: over dns_rate/s per sandbox dropped, then to the gateway accepted */
static void dns_rules(struct batch *b, const dsec__nft *t)
{
    const char *tb = t->table;
    struct nftnl_rule *r;
    uint16_t port = htons(t->c.dns_port);
    if (t->c.dns_rate > 0) {
        r = dsec__nft_rule_new(tb, "sbx_in");
        e_dport(r, &port);
        e_meter(r, "dnsm", t->c.dns_rate, burst_of(t->c.dns_rate), true);
        e_verdict(r, NF_DROP);
        rule_add(b, r, "sbx_in");
    }
    for (int f = 0; f < (t->c.v6 ? 2 : 1); f++) {
        bool is4 = f == 0;
        r = dsec__nft_rule_new(tb, "sbx_in");
        e_nfproto(r, is4 ? NFPROTO_IPV4 : NFPROTO_IPV6);
        if (is4)
            e_addr(r, OFF_DADDR4, 4, (const uint8_t *)&t->c.gw4, 32, NFT_CMP_EQ);
        else
            e_addr(r, OFF_DADDR6, 16, t->c.gw6.s6_addr, 128, NFT_CMP_EQ);
        e_dport(r, &port);
        e_verdict(r, NF_ACCEPT);
        rule_add(b, r, "sbx_in");
    }
}

/* sbx_in: a sandbox talking to the node */
static void sbx_in_rules(struct batch *b, const dsec__nft *t)
{
    const char *tb = t->table;
    struct nftnl_rule *r;
    if (t->c.v6) {
        /* neighbour discovery (NS to the gateway may come from a link-local address) */
        r = dsec__nft_rule_new(tb, "sbx_in");
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
    r = dsec__nft_rule_new(tb, "sbx_in");
    e_meta(r, NFT_META_PKTTYPE, NFT_REG_1);
    e_cmp8(r, NFT_CMP_NEQ, PACKET_HOST);
    e_verdict(r, NF_DROP);
    rule_add(b, r, "sbx_in");
    dns_rules(b, t);
    /* connections the node opened into the sandbox */
    r = dsec__nft_rule_new(tb, "sbx_in");
    e_ct_state(r, NF_CT_STATE_BIT(IP_CT_ESTABLISHED) | NF_CT_STATE_BIT(IP_CT_RELATED));
    e_verdict(r, NF_ACCEPT);
    rule_add(b, r, "sbx_in");
    if (t->c.log_rate > 0) {
        /* shared chain: the reader maps the input interface back to the sandbox */
        r = dsec__nft_rule_new(tb, "sbx_in");
        e_meter(r, "logm", t->c.log_rate, LIMIT_BURST, false);
        e_log(r, t->c.log_group, LOG_PREFIX_IN);
        rule_add(b, r, "sbx_in");
    }
    r = dsec__nft_rule_new(tb, "sbx_in");
    e_verdict(r, NF_DROP);
    rule_add(b, r, "sbx_in");
}

/* One family's pool, for matching an address field against it. */
struct pool_match {
    uint8_t nfp;
    unsigned len, plen;
    const uint8_t *pool;
};

/* meta nfproto F; the address field at off is in the pool */
static void e_in_pool(struct nftnl_rule *r, const struct pool_match *m, uint32_t off)
{
    e_nfproto(r, m->nfp);
    e_addr(r, off, m->len, m->pool, m->plen, NFT_CMP_EQ);
}

/* The pool's rules of one family in the base chains (and the nat chain, when masquerading). */
static void pool_rules(struct batch *b, const dsec__nft *t, bool is4)
{
    const char *tb = t->table;
    struct pool_match m = {
        .nfp = is4 ? NFPROTO_IPV4 : NFPROTO_IPV6,
        .len = is4 ? 4 : 16,
        .plen = is4 ? t->c.pool4_len : t->c.pool6_len,
        .pool = is4 ? (const uint8_t *)&t->c.pool4 : t->c.pool6.s6_addr,
    };
    uint32_t soff = is4 ? OFF_SADDR4 : OFF_SADDR6, doff = is4 ? OFF_DADDR4 : OFF_DADDR6;
    struct nftnl_rule *r;

    /* forward: a sandbox veth not (yet) in the table sends nothing */
    r = dsec__nft_rule_new(tb, "forward");
    e_in_pool(r, &m, soff);
    e_verdict(r, NF_DROP);
    rule_add(b, r, "forward");
    /* replies into sandboxes pass; nothing else enters one */
    r = dsec__nft_rule_new(tb, "forward");
    e_in_pool(r, &m, doff);
    e_ct_state(r, NF_CT_STATE_BIT(IP_CT_ESTABLISHED) | NF_CT_STATE_BIT(IP_CT_RELATED));
    e_verdict(r, NF_ACCEPT);
    rule_add(b, r, "forward");
    r = dsec__nft_rule_new(tb, "forward");
    e_in_pool(r, &m, doff);
    e_verdict(r, NF_DROP);
    rule_add(b, r, "forward");
    /* input: the same for the node itself (its own traffic to the gateway comes by lo) */
    r = dsec__nft_rule_new(tb, "input");
    e_meta(r, NFT_META_IIFTYPE, NFT_REG_1);
    uint16_t lo = ARPHRD_LOOPBACK;
    e_cmp(r, NFT_CMP_NEQ, &lo, 2);
    e_in_pool(r, &m, soff);
    e_verdict(r, NF_DROP);
    rule_add(b, r, "input");
    if (t->c.masquerade) {
        r = dsec__nft_rule_new(tb, "post");
        e_in_pool(r, &m, soff);
        e_addr(r, doff, m.len, m.pool, m.plen, NFT_CMP_NEQ);
        expr(r, "masq");
        rule_add(b, r, "post");
    }
}

void dsec__nft_main_rules(struct batch *b, const dsec__nft *t)
{
    base_jumps(b, t);
    sbx_fwd_rules(b, t);
    sbx_in_rules(b, t);
    for (int f = 0; f < (t->c.v6 ? 2 : 1); f++)
        pool_rules(b, t, f == 0);
}

/* A shard's forward chain: iifname vmap @vfwd */
void dsec__nft_shard_rules(struct batch *b, const char *shard)
{
    struct nftnl_rule *r = dsec__nft_rule_new(shard, "forward");
    e_meta(r, NFT_META_IIFNAME, NFT_REG_1);
    e_lookup(r, NFT_REG_1, "vfwd", false, true);
    rule_add(b, r, "forward");
}

/* The rules of s_IDX, in the sandbox's shard. */
void dsec__nft_sbx_rules(struct batch *b, const dsec__nft *t, const struct names *nm)
{
    const char *tb = nm->shard, *chain = nm->chain;
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    for (int f = 0; f < (t->c.v6 ? 2 : 1); f++) {
        bool is4 = f == 0;
        struct nftnl_rule *r = dsec__nft_rule_new(tb, chain);
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
        r = dsec__nft_rule_new(tb, chain);
        e_limit(r, t->c.log_rate, false);
        e_log(r, t->c.log_group, nm->prefix);
        rule_add(b, r, chain);
    }
    /* TCP gets a reset: an ICMP error that arrives while connect() still holds the socket
     * (a reject on the local veth is that fast) is dropped by TCP, and connect() would wait
     * for the retransmission a second later; a reset is queued to the socket's backlog */
    r = dsec__nft_rule_new(tb, chain);
    e_meta(r, NFT_META_L4PROTO, NFT_REG_1);
    e_cmp8(r, NFT_CMP_EQ, IPPROTO_TCP);
    struct nftnl_expr *e = expr(r, "reject");
    if (e != NULL) {
        nftnl_expr_set_u32(e, NFTNL_EXPR_REJECT_TYPE, NFT_REJECT_TCP_RST);
        nftnl_expr_set_u8(e, NFTNL_EXPR_REJECT_CODE, 0);
    }
    rule_add(b, r, chain);
    r = dsec__nft_rule_new(tb, chain);
    e = expr(r, "reject");
    if (e != NULL) {
        nftnl_expr_set_u32(e, NFTNL_EXPR_REJECT_TYPE, NFT_REJECT_ICMPX_UNREACH);
        nftnl_expr_set_u8(e, NFTNL_EXPR_REJECT_CODE, NFT_REJECT_ICMPX_ADMIN_PROHIBITED);
    }
    rule_add(b, r, chain);
}
