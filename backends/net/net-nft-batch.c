/* net-nft-batch.c - batches of nfnetlink messages for the node's nftables tables: building them
 * (tables, chains, sets, elements) and sending them, with the kernel's verdict as a dsec_err. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netlink.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libmnl/libmnl.h>
#include <libnftnl/chain.h>
#include <libnftnl/common.h>
#include <libnftnl/rule.h>
#include <libnftnl/set.h>
#include <libnftnl/table.h>
#include <libnftnl/udata.h>

#include "backends/net/net-box.h"
#include "backends/net/net-int.h"
#include "backends/net/net-nft-int.h"
#include "dsec/alloc.h"

static void batch_reset(struct batch *b, uint32_t seq)
{
    b->len = 0;
    b->seq0 = b->seq = seq;
    b->oom = false;
    b->nwhat = 0;
}

void dsec__nft_batch_release(struct batch *b)
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
struct nlmsghdr *dsec__nft_msg_begin(struct batch *b, uint16_t type, uint16_t flags, size_t room,
                                     const char *what, const char *name)
{
    char *p = batch_room(b, room + 256);
    if (p == NULL)
        return NULL;
    batch_what(b, what, name);
    return nftnl_nlmsg_build_hdr(p, type, NFPROTO_INET, flags, b->seq++);
}

void dsec__nft_msg_end(struct batch *b, struct nlmsghdr *nlh)
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
    dsec__nft_msg_end(b, nlh);
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

struct batch *dsec__nft_batch_open(dsec__nft *t)
{
    struct batch *b = &t->b;
    batch_reset(b, t->seq);
    batch_edge(b, true);
    return b;
}

int dsec__nft_batch_commit(dsec__nft *t, const char *doing, dsec_err *err)
{
    struct batch *b = &t->b;
    batch_edge(b, false);
    t->seq = b->seq;
    return batch_send(t, b, doing, err);
}

/* ---- chains and sets ---------------------------------------------------------------------- */

static struct nftnl_chain *chain_obj(const char *table, const char *name)
{
    struct nftnl_chain *c = nftnl_chain_alloc();
    if (c == NULL)
        return NULL;
    nftnl_chain_set_str(c, NFTNL_CHAIN_TABLE, table);
    nftnl_chain_set_str(c, NFTNL_CHAIN_NAME, name);
    nftnl_chain_set_u32(c, NFTNL_CHAIN_FAMILY, NFPROTO_INET);
    return c;
}

void dsec__nft_chain_add(struct batch *b, const char *table, const char *name, const char *type,
                         int hook, int prio)
{
    struct nftnl_chain *c = chain_obj(table, name);
    if (c == NULL) {
        b->oom = true;
        return;
    }
    if (type != NULL) {
        nftnl_chain_set_str(c, NFTNL_CHAIN_TYPE, type);
        nftnl_chain_set_u32(c, NFTNL_CHAIN_HOOKNUM, (uint32_t)hook);
        nftnl_chain_set_s32(c, NFTNL_CHAIN_PRIO, prio);
        nftnl_chain_set_u32(c, NFTNL_CHAIN_POLICY, NF_ACCEPT);
    }
    struct nlmsghdr *nlh =
        dsec__nft_msg_begin(b, NFT_MSG_NEWCHAIN, NLM_F_CREATE, 512, "chain", name);
    if (nlh != NULL) {
        nftnl_chain_nlmsg_build_payload(nlh, c);
        dsec__nft_msg_end(b, nlh);
    }
    nftnl_chain_free(c);
}

/* type NFT_MSG_DELRULE without a handle flushes the chain; DESTROYCHAIN deletes it (and its
 * rules) if present. */
void dsec__nft_chain_op(struct batch *b, const char *table, const char *name, uint16_t type)
{
    bool rules = type == NFT_MSG_DELRULE;
    struct nlmsghdr *nlh =
        dsec__nft_msg_begin(b, type, 0, 512, rules ? "flushing chain" : "deleting chain", name);
    if (nlh == NULL)
        return;
    if (rules) {
        struct nftnl_rule *r = dsec__nft_rule_new(table, name);
        if (r == NULL) {
            b->oom = true;
            return;
        }
        nftnl_rule_nlmsg_build_payload(nlh, r);
        nftnl_rule_free(r);
    } else {
        struct nftnl_chain *c = chain_obj(table, name);
        if (c == NULL) {
            b->oom = true;
            return;
        }
        nftnl_chain_nlmsg_build_payload(nlh, c);
        nftnl_chain_free(c);
    }
    dsec__nft_msg_end(b, nlh);
}

struct nftnl_set *dsec__nft_set_obj(const char *table, const char *name)
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
void dsec__nft_set_add(struct batch *b, const char *table, const char *name, uint32_t key_type,
                       uint32_t key_len, uint32_t flags, const uint8_t *fields, unsigned nfields,
                       bool vmap)
{
    struct nftnl_set *s = dsec__nft_set_obj(table, name);
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
    struct nlmsghdr *nlh = dsec__nft_msg_begin(b, NFT_MSG_NEWSET, NLM_F_CREATE, 1024, "set", name);
    if (nlh != NULL) {
        nftnl_set_nlmsg_build_payload(nlh, s);
        dsec__nft_msg_end(b, nlh);
    }
    nftnl_set_free(s);
}

/* type NFT_MSG_DELSETELEM with no elements flushes; DESTROYSET deletes the set if present. */
void dsec__nft_set_op(struct batch *b, const char *table, const char *name, uint16_t type)
{
    struct nftnl_set *s = dsec__nft_set_obj(table, name);
    if (s == NULL) {
        b->oom = true;
        return;
    }
    bool flush = type == NFT_MSG_DELSETELEM;
    struct nlmsghdr *nlh =
        dsec__nft_msg_begin(b, type, 0, 512, flush ? "flushing set" : "deleting set", name);
    if (nlh != NULL) {
        if (flush)
            nftnl_set_elems_nlmsg_build_payload(nlh, s);
        else
            nftnl_set_nlmsg_build_payload(nlh, s);
        dsec__nft_msg_end(b, nlh);
    }
    nftnl_set_free(s);
}

/* Elements go into an nftnl_set, then into one message. */
void dsec__nft_elems_send(struct batch *b, struct nftnl_set *s, uint16_t type, size_t n,
                          const char *what, const char *name)
{
    if (s == NULL) {
        b->oom = true;
        return;
    }
    struct nlmsghdr *nlh = dsec__nft_msg_begin(
        b, type, type == NFT_MSG_NEWSETELEM ? NLM_F_CREATE : 0, 512 + n * 192, what, name);
    if (nlh != NULL) {
        nftnl_set_elems_nlmsg_build_payload(nlh, s);
        dsec__nft_msg_end(b, nlh);
    }
    nftnl_set_free(s);
}

void dsec__nft_elem_ifname(struct nftnl_set *s, const char *ifname, const char *chain)
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

int dsec__nft_open_nl(struct mnl_socket **out, uint32_t *portid, dsec_err *err)
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

void dsec__nft_table_msg(struct batch *b, const char *name, uint16_t type)
{
    struct nftnl_table *tb = nftnl_table_alloc();
    if (tb == NULL) {
        b->oom = true;
        return;
    }
    nftnl_table_set_str(tb, NFTNL_TABLE_NAME, name);
    nftnl_table_set_u32(tb, NFTNL_TABLE_FAMILY, NFPROTO_INET);
    struct nlmsghdr *nlh =
        dsec__nft_msg_begin(b, type, type == NFT_MSG_NEWTABLE ? NLM_F_CREATE : 0, 256,
                            type == NFT_MSG_NEWTABLE ? "table" : "deleting table", name);
    if (nlh != NULL) {
        nftnl_table_nlmsg_build_payload(nlh, tb);
        dsec__nft_msg_end(b, nlh);
    }
    nftnl_table_free(tb);
}
