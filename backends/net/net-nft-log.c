/* net-nft-log.c - the NFLOG reader: packets the tables blocked, mapped back to their sandbox. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <linux/netlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <libmnl/libmnl.h>

#include "backends/net/net-box.h"
#include "backends/net/net-int.h"
#include "backends/net/net-nft-int.h"
#include "dsec/alloc.h"

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
        uint32_t i;
        if (!dsec__nft_sbx_by_ifname(t, ifname, &i))
            return -1;
        idx = i;
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
    if (dsec__nft_open_nl(&t->log_nl, NULL, err) < 0)
        return dsec_err_wrap(err, "NFLOG reader");
    t->log_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (t->log_efd < 0) {
        int e = errno;
        dsec__nft_log_stop(t);
        return dsec_err_set(err, DSEC_E_IO, e, "NFLOG reader: eventfd: %s", strerror(e));
    }
    if (nflog_config(t->log_nl, t->c.log_group, NFULNL_CFG_CMD_BIND, false, err) < 0 ||
        nflog_config(t->log_nl, t->c.log_group, 0, true, err) < 0) {
        dsec__nft_log_stop(t);
        return -1;
    }
    t->log_fn = fn;
    t->log_ud = ud;
    int e = pthread_create(&t->log_thr, NULL, log_main, t);
    if (e != 0) {
        dsec__nft_log_stop(t);
        return dsec_err_set(err, DSEC_E_IO, e, "NFLOG reader: starting its thread: %s",
                            strerror(e));
    }
    t->log_running = true;
    return 0;
}

void dsec__nft_log_stop(dsec__nft *t)
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
