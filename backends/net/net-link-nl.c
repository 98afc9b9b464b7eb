/* net-link-nl.c - rtnetlink for the link plumbing: a socket with a batch of requests (sent
 * with one syscall, acks read after), the requests net-link.c makes, and sysctl files. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_ether.h>
#include <linux/if_link.h>
#include <linux/if_tun.h>
#include <linux/neighbour.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/pkt_sched.h>
#include <linux/sockios.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/tc_act/tc_mirred.h>
#include <linux/veth.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <libmnl/libmnl.h>

#include "backends/net/net-int.h"
#include "backends/net/net-link-int.h"
#include "dsec/alloc.h"

/*
 * rtnetlink handles a request synchronously inside sendmsg(), so several
 * requests are packed into one buffer and sent with one syscall; their acks
 * are read afterwards and the first failure, with the kernel's extended-ack
 * text where it gives one, becomes the error.
 */

int dsec__nl_code_of(int e)
{
    switch (e) {
    case EPERM:
    case EACCES:
        return DSEC_E_PERMISSION;
    case EEXIST:
        return DSEC_E_EXISTS;
    case ENOMEM:
    case ENOBUFS:
        return DSEC_E_NOMEM;
    case ENOENT:
    case ENODEV:
        return DSEC_E_NOT_FOUND;
    default:
        return DSEC_E_IO;
    }
}

int dsec__nl_open(struct nl *nl, const char *where, dsec_err *err)
{
    nl->where = where;
    nl->seq = 1;
    nl->n = 0;
    nl->len = 0;
    nl->last = NULL;
    nl->sock = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
    if (nl->sock == NULL)
        return dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: rtnetlink socket (%s)",
                            where);
    int one = 1;
    /* Extended acks carry the kernel's reason; capped acks skip echoing the request. */
    mnl_socket_setsockopt(nl->sock, NETLINK_EXT_ACK, &one, sizeof one);
    mnl_socket_setsockopt(nl->sock, NETLINK_CAP_ACK, &one, sizeof one);
    if (mnl_socket_bind(nl->sock, 0, MNL_SOCKET_AUTOPID) < 0) {
        int e = errno;
        mnl_socket_close(nl->sock);
        nl->sock = NULL;
        return dsec_err_set(err, dsec__nl_code_of(e), e, "net: binding rtnetlink socket (%s)",
                            where);
    }
    return 0;
}

void dsec__nl_close(struct nl *nl)
{
    if (nl->sock != NULL)
        mnl_socket_close(nl->sock);
    nl->sock = NULL;
}

int dsec__nl_fd(struct nl *nl)
{
    return mnl_socket_get_fd(nl->sock);
}

/* Drop whatever is built or awaiting acks (the acks of a closed batch are
 * skipped by their sequence numbers). */
void dsec__nl_reset(struct nl *nl)
{
    nl->seq += (uint32_t)nl->n;
    nl->n = 0;
    nl->len = 0;
    nl->last = NULL;
}

static void nl_seal(struct nl *nl)
{
    if (nl->last != NULL)
        nl->len += NLMSG_ALIGN(nl->last->nlmsg_len);
    nl->last = NULL;
}

/* Start a request in the batch; what names it in an error. Messages here are
 * a few hundred bytes at most, so BATCH_MAX of them always fit in buf. */
struct nlmsghdr *dsec__nl_put(struct nl *nl, uint16_t type, uint16_t flags, const char *fmt, ...)
{
    nl_seal(nl);
    if (nl->n >= BATCH_MAX || nl->len + 512 > sizeof nl->buf)
        return NULL;
    struct nlmsghdr *h = mnl_nlmsg_put_header(nl->buf + nl->len);
    h->nlmsg_type = type;
    h->nlmsg_flags = (uint16_t)(NLM_F_REQUEST | NLM_F_ACK | flags);
    h->nlmsg_seq = nl->seq + (uint32_t)nl->n;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(nl->what[nl->n], WHAT_MAX, fmt, ap);
    va_end(ap);
    nl->n++;
    nl->last = h;
    return h;
}

int dsec__nl_send(struct nl *nl, dsec_err *err)
{
    nl_seal(nl);
    if (nl->len == 0)
        return 0;
    ssize_t r = mnl_socket_sendto(nl->sock, nl->buf, nl->len);
    nl->len = 0;
    if (r < 0)
        return dsec_err_set(err, dsec__nl_code_of(errno), errno,
                            "net: sending rtnetlink requests (%s)", nl->where);
    return 0;
}

struct extack {
    const char *msg;
};

static int extack_attr(const struct nlattr *a, void *data)
{
    struct extack *x = data;
    if (mnl_attr_get_type(a) == NLMSGERR_ATTR_MSG && mnl_attr_validate(a, MNL_TYPE_NUL_STRING) == 0)
        x->msg = mnl_attr_get_str(a);
    return MNL_CB_OK;
}

/* Read the acks of every request sent; the first failure becomes the error
 * (code from its errno), later ones are read and dropped. */
int dsec__nl_wait(struct nl *nl, dsec_err *err)
{
    char rbuf[NL_BUF] __attribute__((aligned(8)));
    uint32_t end = nl->seq + (uint32_t)nl->n;
    int acked = 0, rc = 0;
    while (acked < nl->n) {
        ssize_t r = mnl_socket_recvfrom(nl->sock, rbuf, sizeof rbuf);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            rc = dsec_err_set(err, dsec__nl_code_of(errno), errno,
                              "net: reading rtnetlink acks (%s)", nl->where);
            break;
        }
        int left = (int)r;
        for (struct nlmsghdr *h = (struct nlmsghdr *)rbuf; mnl_nlmsg_ok(h, left);
             h = mnl_nlmsg_next(h, &left)) {
            if (h->nlmsg_type != NLMSG_ERROR || h->nlmsg_seq < nl->seq || h->nlmsg_seq >= end)
                continue;
            acked++;
            if (h->nlmsg_len < NLMSG_HDRLEN + sizeof(struct nlmsgerr))
                continue;
            const struct nlmsgerr *e = mnl_nlmsg_get_payload(h);
            if (e->error == 0 || rc < 0)
                continue;
            struct extack x = {NULL};
            if (h->nlmsg_flags & NLM_F_ACK_TLVS) {
                size_t off = sizeof *e;
                if (!(h->nlmsg_flags & NLM_F_CAPPED))
                    off += e->msg.nlmsg_len - NLMSG_HDRLEN;
                if (NLMSG_HDRLEN + off < h->nlmsg_len)
                    mnl_attr_parse(h, (unsigned int)off, extack_attr, &x);
            }
            int en = -e->error;
            const char *what = nl->what[h->nlmsg_seq - nl->seq];
            if (x.msg != NULL && x.msg[0] != '\0')
                rc = dsec_err_set(err, dsec__nl_code_of(en), en,
                                  "net: %s (%s namespace; kernel: %s)", what, nl->where, x.msg);
            else
                rc = dsec_err_set(err, dsec__nl_code_of(en), en, "net: %s (%s namespace)", what,
                                  nl->where);
        }
    }
    nl->seq = end;
    nl->n = 0;
    return rc;
}

int dsec__nl_run(struct nl *nl, dsec_err *err)
{
    if (dsec__nl_send(nl, err) < 0) {
        dsec__nl_reset(nl);
        return -1;
    }
    return dsec__nl_wait(nl, err);
}

/* ---- request builders -------------------------------------------------------------------- */

/* Set a link up (by name when ifindex is 0); rp_filter > 0 also sets the
 * IPv4 reverse-path filter mode of the interface. */
int dsec__nl_link_up(struct nl *nl, int ifindex, const char *name, int rp_filter)
{
    struct nlmsghdr *h = dsec__nl_put(nl, RTM_NEWLINK, 0, "setting %s up", name);
    if (h == NULL)
        return -1;
    struct ifinfomsg *ifi = mnl_nlmsg_put_extra_header(h, sizeof *ifi);
    ifi->ifi_family = AF_UNSPEC;
    ifi->ifi_index = ifindex;
    ifi->ifi_flags = IFF_UP;
    ifi->ifi_change = IFF_UP;
    if (ifindex == 0)
        mnl_attr_put_strz(h, IFLA_IFNAME, name);
    if (rp_filter > 0) {
        struct nlattr *af = mnl_attr_nest_start(h, IFLA_AF_SPEC);
        struct nlattr *in = mnl_attr_nest_start(h, AF_INET);
        struct nlattr *conf = mnl_attr_nest_start(h, IFLA_INET_CONF);
        mnl_attr_put_u32(h, IPV4_DEVCONF_RP_FILTER, (uint32_t)rp_filter);
        mnl_attr_nest_end(h, conf);
        mnl_attr_nest_end(h, in);
        /* The host side gets no IPv6 link-local address: each would add an
         * fe80::/64 route beside every other veth's, a list the kernel
         * scans on each add. Forwarding needs none: both ends hold static
         * neighbour entries. */
        struct nlattr *in6 = mnl_attr_nest_start(h, AF_INET6);
        mnl_attr_put_u8(h, IFLA_INET6_ADDR_GEN_MODE, IN6_ADDR_GEN_MODE_NONE);
        mnl_attr_nest_end(h, in6);
        mnl_attr_nest_end(h, af);
    }
    return 0;
}

/* The MACs of a sandbox's veth ends, fixed from its address so that each
 * side can hold a permanent neighbour entry for the other: no ARP or NDP
 * for the gateway, which therefore needs no address on the veth. */
void dsec__nl_veth_macs(const struct in_addr *a4, uint8_t host[6], uint8_t peer[6])
{
    const uint8_t *a = (const uint8_t *)&a4->s_addr;
    host[0] = peer[0] = 0x02; /* locally administered, unicast */
    host[1] = 0xd5;
    peer[1] = 0xd6;
    memcpy(host + 2, a, 4);
    memcpy(peer + 2, a, 4);
}

int dsec__nl_veth_new(struct nl *nl, const char *host_if, int peer_ns_fd, uint32_t mtu,
                      const uint8_t host_mac[6], const uint8_t peer_mac[6])
{
    struct nlmsghdr *h = dsec__nl_put(nl, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL,
                                      "creating veth %s (peer eth0 in the sandbox)", host_if);
    if (h == NULL)
        return -1;
    struct ifinfomsg *ifi = mnl_nlmsg_put_extra_header(h, sizeof *ifi);
    ifi->ifi_family = AF_UNSPEC;
    mnl_attr_put_strz(h, IFLA_IFNAME, host_if);
    mnl_attr_put(h, IFLA_ADDRESS, 6, host_mac);
    if (mtu != 0)
        mnl_attr_put_u32(h, IFLA_MTU, mtu);
    /* One queue each, asked for: veth otherwise registers a queue per CPU
     * and then shrinks to one, which waits for an RCU grace period. */
    mnl_attr_put_u32(h, IFLA_NUM_TX_QUEUES, 1);
    mnl_attr_put_u32(h, IFLA_NUM_RX_QUEUES, 1);
    struct nlattr *li = mnl_attr_nest_start(h, IFLA_LINKINFO);
    mnl_attr_put_strz(h, IFLA_INFO_KIND, "veth");
    struct nlattr *data = mnl_attr_nest_start(h, IFLA_INFO_DATA);
    struct nlattr *peer = mnl_attr_nest_start(h, VETH_INFO_PEER);
    /* The peer's attributes follow an ifinfomsg of its own. */
    struct ifinfomsg *pifi = (struct ifinfomsg *)((char *)h + NLMSG_ALIGN(h->nlmsg_len));
    memset(pifi, 0, sizeof *pifi);
    pifi->ifi_family = AF_UNSPEC;
    h->nlmsg_len += NLMSG_ALIGN(sizeof *pifi);
    mnl_attr_put_strz(h, IFLA_IFNAME, "eth0");
    mnl_attr_put(h, IFLA_ADDRESS, 6, peer_mac);
    mnl_attr_put_u32(h, IFLA_NET_NS_FD, (uint32_t)peer_ns_fd);
    if (mtu != 0)
        mnl_attr_put_u32(h, IFLA_MTU, mtu);
    mnl_attr_put_u32(h, IFLA_NUM_TX_QUEUES, 1);
    mnl_attr_put_u32(h, IFLA_NUM_RX_QUEUES, 1);
    mnl_attr_nest_end(h, peer);
    mnl_attr_nest_end(h, data);
    mnl_attr_nest_end(h, li);
    return 0;
}

int dsec__nl_link_del(struct nl *nl, int ifindex, const char *name)
{
    struct nlmsghdr *h = dsec__nl_put(nl, RTM_DELLINK, 0, "deleting %s", name);
    if (h == NULL)
        return -1;
    struct ifinfomsg *ifi = mnl_nlmsg_put_extra_header(h, sizeof *ifi);
    ifi->ifi_family = AF_UNSPEC;
    ifi->ifi_index = ifindex;
    if (ifindex == 0)
        mnl_attr_put_strz(h, IFLA_IFNAME, name);
    return 0;
}

int dsec__nl_addr_add(struct nl *nl, int family, int ifindex, const char *ifname, const void *addr,
                      uint8_t plen)
{
    char txt[INET6_ADDRSTRLEN];
    inet_ntop(family, addr, txt, sizeof txt);
    struct nlmsghdr *h = dsec__nl_put(nl, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL,
                                      "adding %s/%u to %s", txt, plen, ifname);
    if (h == NULL)
        return -1;
    struct ifaddrmsg *ifa = mnl_nlmsg_put_extra_header(h, sizeof *ifa);
    ifa->ifa_family = (uint8_t)family;
    ifa->ifa_prefixlen = plen;
    ifa->ifa_scope = RT_SCOPE_UNIVERSE;
    ifa->ifa_index = (uint32_t)ifindex;
    if (family == AF_INET) {
        mnl_attr_put(h, IFA_LOCAL, 4, addr);
        mnl_attr_put(h, IFA_ADDRESS, 4, addr);
    } else {
        /* No duplicate address detection: the pool hands each address to one
         * sandbox, and DAD would keep it tentative (unusable) for a second. */
        ifa->ifa_flags = IFA_F_NODAD;
        mnl_attr_put(h, IFA_ADDRESS, 16, addr);
        mnl_attr_put_u32(h, IFA_FLAGS, IFA_F_NODAD);
    }
    return 0;
}

/* A permanent neighbour entry: addr is at lladdr on ifindex. */
int dsec__nl_neigh_add(struct nl *nl, int family, int ifindex, const char *ifname, const void *addr,
                       const uint8_t lladdr[6])
{
    char txt[INET6_ADDRSTRLEN];
    inet_ntop(family, addr, txt, sizeof txt);
    struct nlmsghdr *h = dsec__nl_put(nl, RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE,
                                      "adding neighbour %s on %s", txt, ifname);
    if (h == NULL)
        return -1;
    struct ndmsg *nd = mnl_nlmsg_put_extra_header(h, sizeof *nd);
    nd->ndm_family = (uint8_t)family;
    nd->ndm_ifindex = ifindex;
    nd->ndm_state = NUD_PERMANENT;
    mnl_attr_put(h, NDA_DST, family == AF_INET ? 4 : 16, addr);
    mnl_attr_put(h, NDA_LLADDR, 6, lladdr);
    return 0;
}

/* A route in the main table: dst/plen out of ifindex, via gw when not NULL
 * (on-link: the gateway needs no covering prefix), preferring source src. */
int dsec__nl_route_add(struct nl *nl, int family, int ifindex, const char *ifname, const void *dst,
                       uint8_t plen, const void *gw, const void *src)
{
    size_t alen = family == AF_INET ? 4 : 16;
    char a[INET6_ADDRSTRLEN], dtxt[INET6_ADDRSTRLEN + 8], via[INET6_ADDRSTRLEN + 8] = "";
    if (plen == 0) {
        snprintf(dtxt, sizeof dtxt, "default");
    } else {
        inet_ntop(family, dst, a, sizeof a);
        snprintf(dtxt, sizeof dtxt, "%s/%u", a, plen);
    }
    if (gw != NULL) {
        inet_ntop(family, gw, a, sizeof a);
        snprintf(via, sizeof via, " via %s", a);
    }
    struct nlmsghdr *h = dsec__nl_put(nl, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL,
                                      "adding route %s%s dev %s", dtxt, via, ifname);
    if (h == NULL)
        return -1;
    struct rtmsg *rtm = mnl_nlmsg_put_extra_header(h, sizeof *rtm);
    rtm->rtm_family = (uint8_t)family;
    rtm->rtm_dst_len = plen;
    rtm->rtm_table = RT_TABLE_MAIN;
    rtm->rtm_protocol = RTPROT_STATIC;
    rtm->rtm_type = RTN_UNICAST;
    rtm->rtm_scope = gw != NULL ? RT_SCOPE_UNIVERSE : RT_SCOPE_LINK;
    if (gw != NULL)
        rtm->rtm_flags = RTNH_F_ONLINK;
    if (plen != 0)
        mnl_attr_put(h, RTA_DST, alen, dst);
    mnl_attr_put_u32(h, RTA_OIF, (uint32_t)ifindex);
    if (gw != NULL)
        mnl_attr_put(h, RTA_GATEWAY, alen, gw);
    if (src != NULL)
        mnl_attr_put(h, RTA_PREFSRC, alen, src);
    return 0;
}

/* ---- helpers -------------------------------------------------------------------------------- */

/* The ifindex of name in the namespace fd's socket belongs to (the ioctl is
 * answered in the socket's namespace, not the thread's). */
int dsec__nl_ifindex_in(int fd, const char *name)
{
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", name);
    if (ioctl(fd, SIOCGIFINDEX, &ifr) < 0)
        return 0;
    return ifr.ifr_ifindex;
}

/* Write val to a sysctl file of the calling thread's network namespace. */
int dsec__nl_sysctl_put(const char *path, const char *val, bool missing_ok, dsec_err *err)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        if (missing_ok && errno == ENOENT)
            return 0;
        return dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: opening %s", path);
    }
    size_t n = strlen(val);
    ssize_t w = write(fd, val, n);
    int e = errno;
    close(fd);
    if (w != (ssize_t)n)
        return dsec_err_set(err, dsec__nl_code_of(w < 0 ? e : EIO), w < 0 ? e : EIO,
                            "net: writing %s to %s", val, path);
    return 0;
}

/* Set a sysctl to "1" unless it already is (forwarding changes walk every
 * device, so the write is worth skipping). */
int dsec__nl_sysctl_on(const char *path, dsec_err *err)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: opening %s", path);
    char c = 0;
    ssize_t r = read(fd, &c, 1);
    int rc = 0;
    if (r != 1 || c != '1') {
        if (pwrite(fd, "1", 1, 0) != 1)
            rc = dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: writing 1 to %s", path);
    }
    close(fd);
    return rc;
}

int dsec__nl_ifname_check(const char *name, const char *what, dsec_err *err)
{
    if (name == NULL || name[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "net: %s: no interface name given", what);
    size_t n = strlen(name);
    if (n >= IFNAMSIZ)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "net: %s: interface name '%s' is longer than %d bytes", what, name,
                            IFNAMSIZ - 1);
    if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "net: %s: bad interface name '%s'", what, name);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c == '/' || c == ':' || c <= ' ' || c >= 0x7f)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "net: %s: interface name '%s' has a bad character", what, name);
    }
    return 0;
}

/* The error of a request that did not fit its batch: the batches are sized for what they carry. */
int dsec__nl_overflow(dsec_err *err)
{
    return dsec_err_set(err, DSEC_E_INTERNAL, 0, "net: rtnetlink batch overflow (a bug)");
}
