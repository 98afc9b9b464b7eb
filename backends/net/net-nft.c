/* net-nft.c - the node's nftables tables: made (replacing stale ones) and removed; their layout
 * is in net-nft-int.h, the rules in net-nft-rules.c, the sandboxes in net-nft-sbx.c. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <net/if.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <libmnl/libmnl.h>
#include <libnftnl/set.h>

#include "backends/net/net-box.h"
#include "backends/net/net-int.h"
#include "backends/net/net-nft-int.h"
#include "dsec/alloc.h"
#include "dsec/log.h"

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
    struct nftnl_set *s = dsec__nft_set_obj(table, name);
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
    dsec__nft_elems_send(b, s, NFT_MSG_NEWSETELEM, nel, "elements of set", name);
    return;
oom:
    nftnl_set_free(s);
    b->oom = true;
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

/* The configuration's own checks, before anything is made. */
static int conf_check(const dsec__nft_conf *c, dsec_err *err)
{
    if (c == NULL || c->table == NULL || c->table[0] == 0 || strlen(c->table) >= 60)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "nftables table name missing or too long");
    if (c->pool4_len > 32 || (c->v6 && c->pool6_len > 128))
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "sandbox pool prefix length out of range");
    if (c->dns_port == 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "DNS port 0");
    if (c->ndeny > 0 && c->deny == NULL)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "denied destinations missing");
    return 0;
}

/* t (zeroed) for c: names, configuration, the sandbox tables and the netlink socket. Once it
 * returns, even failing, t is dsec__nft_free's. */
static int table_init(dsec__nft *t, const dsec__nft_conf *c, dsec_err *err)
{
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
    if (t->ht == NULL || t->iht == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
    if (dsec__nft_open_nl(&t->nl, &t->portid, err) < 0)
        return -1;
    t->seq = (uint32_t)time(NULL);
    return 0;
}

/* Every batch here relies on the delete-if-present messages (Linux 6.3):
 * ask once, so an older kernel gets a plain answer instead of a failure
 * deep in a sandbox's create. */
static int probe_kernel(dsec__nft *t, dsec_err *err)
{
    struct batch *b = dsec__nft_batch_open(t);
    char probe[40];
    snprintf(probe, sizeof probe, "dsec_probe_%d", (int)getpid());
    dsec__nft_table_msg(b, probe, NFT_MSG_DESTROYTABLE);
    if (dsec__nft_batch_commit(t, "probing the kernel's nftables", err) < 0) {
        if (err->errnum == EOPNOTSUPP || err->errnum == EINVAL) {
            struct utsname u;
            uname(&u);
            dsec_err_set(err, DSEC_E_UNSUPPORTED, err->errnum,
                         "network containment needs Linux 6.3 or newer (nftables "
                         "delete-if-present messages); this kernel is %s",
                         u.release);
        }
        return -1;
    }
    return 0;
}

/* The main table, in a batch that first deletes a stale one: its sets, chains and rules. */
static void main_table(struct batch *b, const dsec__nft *t)
{
    const char *tb = t->table;
    dsec__nft_table_msg(b, tb, NFT_MSG_DESTROYTABLE);
    dsec__nft_table_msg(b, tb, NFT_MSG_NEWTABLE);
    static const uint8_t f4[] = {IFNAMSIZ, 4}, f6[] = {IFNAMSIZ, 16};
    dsec__nft_set_add(b, tb, "ifs", DT_IFNAME, IFNAMSIZ, 0, NULL, 0, false);
    dsec__nft_set_add(b, tb, "src4", (DT_IFNAME << 6) | DT_IPADDR, IFNAMSIZ + 4, NFT_SET_CONCAT, f4,
                      2, false);
    if (t->c.v6)
        dsec__nft_set_add(b, tb, "src6", (DT_IFNAME << 6) | DT_IP6ADDR, IFNAMSIZ + 16,
                          NFT_SET_CONCAT, f6, 2, false);
    dsec__nft_set_add(b, tb, "tcpudp", DT_INET_PROTO, 1, 0, NULL, 0, false);
    struct nftnl_set *so = dsec__nft_set_obj(tb, "tcpudp");
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
    dsec__nft_elems_send(b, so, NFT_MSG_NEWSETELEM, 2, "elements of set", "tcpudp");
    dsec__nft_set_add(b, tb, "connm", DT_IFNAME, IFNAMSIZ, NFT_SET_EVAL | NFT_SET_TIMEOUT, NULL, 0,
                      false);
    dsec__nft_set_add(b, tb, "dnsm", DT_IFNAME, IFNAMSIZ, NFT_SET_EVAL | NFT_SET_TIMEOUT, NULL, 0,
                      false);
    dsec__nft_set_add(b, tb, "logm", DT_IFNAME, IFNAMSIZ, NFT_SET_EVAL | NFT_SET_TIMEOUT, NULL, 0,
                      false);
    dsec__nft_chain_add(b, tb, "forward", "filter", NF_INET_FORWARD, -2);
    dsec__nft_chain_add(b, tb, "input", "filter", NF_INET_LOCAL_IN, -2);
    dsec__nft_chain_add(b, tb, "sbx_fwd", NULL, 0, 0);
    dsec__nft_chain_add(b, tb, "sbx_in", NULL, 0, 0);
    if (t->c.masquerade)
        dsec__nft_chain_add(b, tb, "post", "nat", NF_INET_POST_ROUTING, 100);
    dsec__nft_main_rules(b, t);
}

/* Shard table tb, replacing a stale one: its verdict map, deny sets and dispatch rule. */
static void shard_table(struct batch *b, const dsec__nft *t, const char *tb, struct range *r4,
                        size_t n4, struct range *r6, size_t n6)
{
    dsec__nft_table_msg(b, tb, NFT_MSG_DESTROYTABLE);
    dsec__nft_table_msg(b, tb, NFT_MSG_NEWTABLE);
    dsec__nft_set_add(b, tb, "vfwd", DT_IFNAME, IFNAMSIZ, 0, NULL, 0, true);
    dsec__nft_set_add(b, tb, "deny4", DT_IPADDR, 4, NFT_SET_INTERVAL, NULL, 0, false);
    deny_elems(b, tb, "deny4", AF_INET, r4, n4);
    if (t->c.v6) {
        dsec__nft_set_add(b, tb, "deny6", DT_IP6ADDR, 16, NFT_SET_INTERVAL, NULL, 0, false);
        deny_elems(b, tb, "deny6", AF_INET6, r6, n6);
    }
    dsec__nft_chain_add(b, tb, "forward", "filter", NF_INET_FORWARD, -1);
    dsec__nft_shard_rules(b, tb);
}

int dsec__nft_new(dsec__nft **out, const dsec__nft_conf *c, dsec_err *err)
{
    *out = NULL;
    int rc = conf_check(c, err);
    if (rc < 0)
        return rc;
    size_t nr = 16 + c->ndeny;
    struct range *r4 = dsec_calloc(nr, sizeof *r4), *r6 = dsec_calloc(nr, sizeof *r6);
    dsec__nft *t = dsec_calloc(1, sizeof *t);
    rc = -1;
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
    if (table_init(t, c, err) < 0 || probe_kernel(t, err) < 0)
        goto out;
    struct batch *b = dsec__nft_batch_open(t);
    /* replace stale tables in the same transaction: sandboxes are never uncontained */
    main_table(b, t);
    /* the shards: after the main table (priority filter - 1), each maps its sandboxes'
     * interfaces to their chains */
    for (int k = 0; k < NSHARDS; k++)
        shard_table(b, t, t->shard[k], r4, n4, r6, n6);
    if (dsec__nft_batch_commit(t, "creating the nftables tables", err) < 0) {
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

void dsec__nft_free(dsec__nft *t, bool remove_table)
{
    if (t == NULL)
        return;
    dsec__nft_log_stop(t);
    if (remove_table && t->nl != NULL) {
        pthread_mutex_lock(&t->mu);
        struct batch *b = dsec__nft_batch_open(t);
        dsec__nft_table_msg(b, t->table, NFT_MSG_DESTROYTABLE);
        for (int k = 0; k < NSHARDS; k++)
            dsec__nft_table_msg(b, t->shard[k], NFT_MSG_DESTROYTABLE);
        dsec_err e;
        if (dsec__nft_batch_commit(t, "removing the tables", &e) < 0)
            dsec_log_warn("dsec: nftables: %s", e.msg);
        pthread_mutex_unlock(&t->mu);
    }
    if (t->nl != NULL)
        mnl_socket_close(t->nl);
    dsec__nft_sbx_free_all(t);
    dsec__nft_batch_release(&t->b);
    pthread_mutex_destroy(&t->mu);
    dsec_free(t);
}
