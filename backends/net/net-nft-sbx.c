/* net-nft-sbx.c - the sandboxes of the node's nftables tables: each one's chain, allow set and
 * main-table entries, and the mirror of its allow elements as disjoint boxes. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <linux/netfilter/nf_tables.h>
#include <net/if.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libnftnl/set.h>

#include "backends/net/net-box.h"
#include "backends/net/net-int.h"
#include "backends/net/net-nft-int.h"
#include "dsec/alloc.h"

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

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
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
        struct nftnl_set *s = dsec__nft_set_obj(nm->shard, nm->set);
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
        dsec__nft_elems_send(b, s, del ? NFT_MSG_DESTROYSETELEM : NFT_MSG_NEWSETELEM, nel,
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

/* The mirror of s becomes bv's boxes (bv left empty). */
static void sbx_adopt(struct sbx *s, struct dsec__boxv *bv)
{
    dsec_free(s->b);
    s->b = bv->v;
    s->n = bv->n;
    s->cap = bv->cap;
    bv->v = NULL;
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

/* Drop the mirror of sandbox idx, if there is one. */
static void sbx_forget(dsec__nft *t, uint32_t idx)
{
    struct sbx *s = *sbx_slot(t, idx);
    if (s != NULL) {
        sbx_unlink(t, s);
        sbx_free(s);
    }
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
    struct nftnl_set *s = dsec__nft_set_obj(t->table, set);
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
    dsec__nft_elems_send(
        b, s, type, 1,
        type == NFT_MSG_NEWSETELEM ? "adding the interface to set" : "deleting from set", set);
}

/* The interface in the main table's ifs, and its (interface, address) pairs in src4 / src6. */
static void main_ifelems(struct batch *b, const dsec__nft *t, uint16_t type, const char *ifname,
                         const struct in_addr *a4, const struct in6_addr *a6)
{
    main_ifelem(b, t, "ifs", type, ifname, NULL, 0);
    if (a4 != NULL)
        main_ifelem(b, t, "src4", type, ifname, a4, 4);
    if (a6 != NULL && t->c.v6)
        main_ifelem(b, t, "src6", type, ifname, a6, 16);
}

/* The interface out of its shard's verdict map. */
static void vfwd_del(struct batch *b, const struct names *nm, const char *ifname)
{
    struct nftnl_set *so = dsec__nft_set_obj(nm->shard, "vfwd");
    dsec__nft_elem_ifname(so, ifname, NULL);
    dsec__nft_elems_send(b, so, NFT_MSG_DESTROYSETELEM, 1, "deleting the interface from map",
                         "vfwd");
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
    struct batch *b = dsec__nft_batch_open(t);
    /* the main table: the interface is a sandbox's, with these source addresses */
    main_ifelems(b, t, NFT_MSG_NEWSETELEM, ifname, a4, a6);
    /* the shard: its chain and set (flushed when re-adopted), and the map entry */
    vfwd_del(b, &nm, ifname);
    dsec__nft_chain_add(b, nm.shard, nm.chain, NULL, 0, 0);
    dsec__nft_chain_op(b, nm.shard, nm.chain, NFT_MSG_DELRULE);
    dsec__nft_set_add(b, nm.shard, nm.set, DT_CONCAT3(DT_IP6ADDR, DT_INET_PROTO, DT_INET_SERVICE),
                      24, NFT_SET_INTERVAL | NFT_SET_TIMEOUT | NFT_SET_CONCAT, fields, 3, false);
    dsec__nft_set_op(b, nm.shard, nm.set, NFT_MSG_DELSETELEM);
    dsec__nft_sbx_rules(b, t, &nm);
    struct nftnl_set *so = dsec__nft_set_obj(nm.shard, "vfwd");
    dsec__nft_elem_ifname(so, ifname, nm.chain);
    dsec__nft_elems_send(b, so, NFT_MSG_NEWSETELEM, 1, "adding the interface to map", "vfwd");
    ops_emit(b, &nm, &ops, now_ms());
    int rc = dsec__nft_batch_commit(t, "adding sandbox", err);
    if (rc == 0) {
        sbx_forget(t, idx);
        sbx_adopt(ns, &s);
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
    struct batch *b = dsec__nft_batch_open(t);
    /* the addresses it was added with, when the caller does not know them */
    struct sbx *known = *sbx_slot(t, idx);
    if (known != NULL && ifname != NULL && strcmp(known->ifname, ifname) != 0)
        known = NULL;
    if (a4 == NULL && known != NULL && known->has4)
        a4 = &known->a4;
    if (a6 == NULL && known != NULL && known->has6)
        a6 = &known->a6;
    if (ifname != NULL) {
        main_ifelems(b, t, NFT_MSG_DESTROYSETELEM, ifname, a4, a6);
        /* and its meter state, so that a later sandbox on the same name starts afresh */
        static const char *const meters[] = {"connm", "dnsm", "logm"};
        for (int m = 0; m < 3; m++)
            main_ifelem(b, t, meters[m], NFT_MSG_DESTROYSETELEM, ifname, NULL, 0);
        vfwd_del(b, &nm, ifname);
    }
    dsec__nft_chain_op(b, nm.shard, nm.chain, NFT_MSG_DESTROYCHAIN);
    dsec__nft_set_op(b, nm.shard, nm.set, NFT_MSG_DESTROYSET);
    int rc = dsec__nft_batch_commit(t, "removing sandbox", err);
    if (rc == 0)
        sbx_forget(t, idx);
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
        struct batch *b = dsec__nft_batch_open(t);
        dsec__nft_set_op(b, nm.shard, nm.set, NFT_MSG_DELSETELEM);
        ops_emit(b, &nm, &ops, now_ms());
        rc = dsec__nft_batch_commit(t, "replacing allow entries", err);
        if (rc == 0)
            sbx_adopt(sb, &s);
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
        struct batch *b = dsec__nft_batch_open(t);
        ops_emit(b, &nm, &ops, now_ms());
        rc = dsec__nft_batch_commit(t, "pinning allow entries", err);
    }
    if (rc == 0)
        sbx_adopt(sb, &s);
out:
    pthread_mutex_unlock(&t->mu);
    dsec_free(in);
    dsec_free(s.v);
    dsec_free(ops.v);
    if (rc < 0)
        return dsec_err_wrap(err, "sandbox %" PRIx32, idx);
    return 0;
}

bool dsec__nft_sbx_by_ifname(dsec__nft *t, const char *ifname, uint32_t *idx)
{
    pthread_mutex_lock(&t->mu);
    struct sbx *s = *sbx_islot(t, ifname);
    bool found = s != NULL;
    *idx = found ? s->idx : 0;
    pthread_mutex_unlock(&t->mu);
    return found;
}

void dsec__nft_sbx_free_all(dsec__nft *t)
{
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
}
