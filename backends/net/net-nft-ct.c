/* net-nft-ct.c - conntrack cuts: the connections an allow entry let through end with it. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <libnetfilter_conntrack/libnetfilter_conntrack.h>

#include "backends/net/net-box.h"
#include "backends/net/net-int.h"
#include "backends/net/net-nft-int.h"
#include "dsec/alloc.h"

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
