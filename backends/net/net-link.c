/* net-link.c - a sandbox's network plumbing: its netns bind-mounted on a file, the veth pair,
 * addresses, routes, per-interface sysctls and a VM's tap with its tc redirects, all through
 * rtnetlink (libmnl), no `ip` or `tc` forks. */
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
 * Create runs on the sandbox's own actor thread, so it may only change that
 * thread's network namespace, and only briefly: unshare(CLONE_NEWNET) moves
 * just the calling thread, a netlink socket opened then stays bound to the
 * new namespace for as long as it lives, and setns() brings the thread back
 * at once. Everything after that (the bind mount from the socket's namespace
 * fd, the veth, addresses, routes) is done from the host namespace through
 * the two sockets.
 *
 * Costs that matter (2-core VM, kernel 6.18): unshare ~0.5 ms and the veth
 * pair ~0.45 ms are kernel work; the rest is ~0.15 ms. Deleting a veth waits
 * for RCU grace periods (~35 ms wall), mostly after RTNL is released, so it
 * delays its caller, not other creates.
 */

int dsec__net_link_host_prepare(bool v6, dsec_err *err)
{
    if (dsec__nl_sysctl_on("/proc/sys/net/ipv4/ip_forward", err) < 0)
        return dsec_err_wrap(err, "net: enabling IPv4 forwarding");
    if (v6 && dsec__nl_sysctl_on("/proc/sys/net/ipv6/conf/all/forwarding", err) < 0)
        return dsec_err_wrap(err, "net: enabling IPv6 forwarding");
    return 0;
}

/* The gateway's addresses go on the host's loopback: always there (a dummy
 * device needs a module some kernels lack), local to the host, and reached
 * from each sandbox through its veth. */
static int gateway_addrs(uint16_t type, const struct in_addr *gw4, const struct in6_addr *gw6,
                         dsec_err *err)
{
    struct nl *np = dsec_calloc(1, sizeof *np);
    if (np == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "net: gateway addresses");
    if (dsec__nl_open(np, "host", err) < 0) {
        dsec_free(np);
        return -1;
    }
    int rc = 0, lo = dsec__nl_ifindex_in(dsec__nl_fd(np), "lo");
    for (int fam = 0; fam < 2 && rc == 0; fam++) {
        if (fam == 1 && gw6 == NULL)
            break;
        const void *a = fam ? (const void *)gw6 : (const void *)gw4;
        dsec__nl_reset(np);
        if (dsec__nl_addr_add(np, fam ? AF_INET6 : AF_INET, lo, "lo", a, fam ? 128 : 32) < 0) {
            rc = dsec__nl_overflow(err);
            break;
        }
        if (type == RTM_DELADDR) { /* the same message, as a removal */
            struct nlmsghdr *h = (struct nlmsghdr *)np->buf;
            h->nlmsg_type = RTM_DELADDR;
            h->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
        }
        if (dsec__nl_run(np, err) < 0) {
            /* already there (a restart), or already gone */
            if (err->errnum == (type == RTM_NEWADDR ? EEXIST : EADDRNOTAVAIL))
                dsec_err_clear(err);
            else
                rc = -1;
        }
    }
    dsec__nl_close(np);
    dsec_free(np);
    return rc;
}

int dsec__net_link_gateway(const struct in_addr *gw4, const struct in6_addr *gw6, dsec_err *err)
{
    return gateway_addrs(RTM_NEWADDR, gw4, gw6, err) < 0
               ? dsec_err_wrap(err, "net: the gateway's addresses on lo")
               : 0;
}

int dsec__net_link_gateway_del(const struct in_addr *gw4, const struct in6_addr *gw6, dsec_err *err)
{
    return gateway_addrs(RTM_DELADDR, gw4, gw6, err) < 0
               ? dsec_err_wrap(err, "net: removing the gateway's addresses from lo")
               : 0;
}

/* ---- create ---------------------------------------------------------------------------------- */

static int spec_check(const dsec__net_link_spec *s, dsec_err *err)
{
    if (s == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "net: link create: no spec");
    if (s->netns_path == NULL || s->netns_path[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "net: link create: no netns path given");
    if (dsec__nl_ifname_check(s->host_if, "link create", err) < 0)
        return -1;
    if (strcmp(s->host_if, "eth0") == 0 || strcmp(s->host_if, "lo") == 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "net: link create: host interface may not be named '%s'", s->host_if);
    if (s->addr4.s_addr == INADDR_ANY || s->gw4.s_addr == INADDR_ANY)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "net: link create: sandbox and gateway IPv4 addresses are required");
    if (s->addr4.s_addr == s->gw4.s_addr)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "net: link create: sandbox address equals the gateway address");
    if (s->v6) {
        if (IN6_IS_ADDR_UNSPECIFIED(&s->addr6) || IN6_IS_ADDR_UNSPECIFIED(&s->gw6))
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "net: link create: v6 set but an IPv6 address is missing");
        if (IN6_ARE_ADDR_EQUAL(&s->addr6, &s->gw6))
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "net: link create: sandbox IPv6 address equals the gateway's");
    }
    return 0;
}

/* The host side's IPv6 sysctls (rp_filter travels with the link-up request;
 * IPv6 device settings have no netlink form). */
static int host_sysctls(const dsec__net_link_spec *s, dsec_err *err)
{
    char p[128];
    /* Without v6 the host side gets no IPv6 at all: no link-local address
     * the sandbox could talk to, no DAD or MLD chatter per sandbox. */
    snprintf(p, sizeof p, "/proc/sys/net/ipv6/conf/%s/disable_ipv6", s->host_if);
    if (dsec__nl_sysctl_put(p, s->v6 ? "0" : "1", !s->v6, err) < 0)
        return -1;
    if (s->v6) {
        snprintf(p, sizeof p, "/proc/sys/net/ipv6/conf/%s/accept_ra", s->host_if);
        if (dsec__nl_sysctl_put(p, "0", false, err) < 0)
            return -1;
    }
    return 0;
}

/* What a create has made so far, for its next steps and for undoing it. */
struct made {
    struct nl *in, *host; /* rtnetlink inside the new namespace, and on the host */
    int orig, nsfd;       /* this thread's namespace; the new one */
    int hidx, eidx;       /* ifindexes of the host side and of eth0 inside */
    bool mounted, veth;
    uint8_t host_mac[6], peer_mac[6];
};

/* The file the namespace is bind-mounted on; it must not exist. */
static int netns_file(const dsec__net_link_spec *s, dsec_err *err)
{
    int fd = open(s->netns_path, O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0444);
    if (fd < 0) {
        if (errno == EEXIST)
            return dsec_err_set(err, DSEC_E_EXISTS, 0,
                                "net: netns file %s already exists (a sandbox's leftover?)",
                                s->netns_path);
        return dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: creating netns file %s",
                            s->netns_path);
    }
    close(fd);
    return 0;
}

/* The namespace: made by this thread, which leaves it again at once with a socket inside it
 * (m->in), and bind-mounted on the file. */
static int netns_new(const dsec__net_link_spec *s, struct made *m, dsec_err *err)
{
    m->orig = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (m->orig < 0)
        return dsec_err_set(err, dsec__nl_code_of(errno), errno,
                            "net: opening this thread's network namespace");
    if (unshare(CLONE_NEWNET) < 0)
        return dsec_err_set(err, dsec__nl_code_of(errno), errno,
                            "net: creating a network namespace");
    /* In the new namespace only long enough to open a socket there. */
    int irc = dsec__nl_open(m->in, "sandbox", err);
    if (setns(m->orig, CLONE_NEWNET) < 0 && setns(m->orig, CLONE_NEWNET) < 0) {
        /* Only ENOMEM can get here; tell the caller its thread is stranded. */
        return dsec_err_set(err, DSEC_E_INTERNAL, errno,
                            "net: cannot return to the original network namespace");
    }
    if (irc < 0)
        return -1;
    m->nsfd = ioctl(dsec__nl_fd(m->in), SIOCGSKNS);
    if (m->nsfd < 0)
        return dsec_err_set(err, dsec__nl_code_of(errno), errno,
                            "net: getting the new namespace's fd");
    char src[64];
    snprintf(src, sizeof src, "/proc/thread-self/fd/%d", m->nsfd);
    if (mount(src, s->netns_path, NULL, MS_BIND, NULL) < 0)
        return dsec_err_set(err, dsec__nl_code_of(errno), errno,
                            "net: bind-mounting the namespace on %s", s->netns_path);
    m->mounted = true;
    return 0;
}

/* lo up inside, and the veth pair with its peer inside as eth0; the host side's sysctls. */
static int veth_make(const dsec__net_link_spec *s, struct made *m, dsec_err *err)
{
    if (dsec__nl_open(m->host, "host", err) < 0)
        return -1;
    /* lo inside and the veth pair go out together; the rest needs the
     * ifindexes of both ends. */
    dsec__nl_veth_macs(&s->addr4, m->host_mac, m->peer_mac);
    if (dsec__nl_link_up(m->in, 0, "lo", 0) < 0 ||
        dsec__nl_veth_new(m->host, s->host_if, m->nsfd, s->mtu, m->host_mac, m->peer_mac) < 0)
        return dsec__nl_overflow(err);
    if (dsec__nl_send(m->in, err) < 0 || dsec__nl_run(m->host, err) < 0)
        return -1;
    m->veth = true;
    m->hidx = dsec__nl_ifindex_in(dsec__nl_fd(m->host), s->host_if);
    m->eidx = dsec__nl_ifindex_in(dsec__nl_fd(m->in), "eth0");
    if (m->hidx <= 0 || m->eidx <= 0)
        return dsec_err_set(err, DSEC_E_INTERNAL, errno, "net: veth %s made, but %s has no ifindex",
                            s->host_if, m->hidx <= 0 ? s->host_if : "its peer eth0");
    if (dsec__nl_wait(m->in, err) < 0)
        return -1;
    if (host_sysctls(s, err) < 0)
        return dsec_err_wrap(err, "net: IPv6 settings of %s", s->host_if);
    return 0;
}

/* Both ends up, with their addresses, routes and permanent neighbours. */
static int veth_config(const dsec__net_link_spec *s, struct made *m, dsec_err *err)
{
    static const struct in_addr any4 = {0};
    struct nl *in = m->in, *host = m->host;
    int eidx = m->eidx, hidx = m->hidx;
    const uint8_t *host_mac = m->host_mac, *peer_mac = m->peer_mac;
    /* The gateway's addresses live once on the node's gateway device
     * (dsec__net_link_gateway), not on each veth: the same address on
     * thousands of interfaces makes every address add scan all of them.
     * Each end knows the other's MAC instead. */
    if (dsec__nl_link_up(in, eidx, "eth0", 0) < 0 ||
        dsec__nl_addr_add(in, AF_INET, eidx, "eth0", &s->addr4, 32) < 0 ||
        dsec__nl_route_add(in, AF_INET, eidx, "eth0", &s->gw4, 32, NULL, &s->addr4) < 0 ||
        dsec__nl_route_add(in, AF_INET, eidx, "eth0", &any4, 0, &s->gw4, &s->addr4) < 0 ||
        dsec__nl_neigh_add(in, AF_INET, eidx, "eth0", &s->gw4, host_mac) < 0)
        return dsec__nl_overflow(err);
    if (s->v6 &&
        (dsec__nl_addr_add(in, AF_INET6, eidx, "eth0", &s->addr6, 128) < 0 ||
         dsec__nl_route_add(in, AF_INET6, eidx, "eth0", &s->gw6, 128, NULL, NULL) < 0 ||
         dsec__nl_route_add(in, AF_INET6, eidx, "eth0", &in6addr_any, 0, &s->gw6, NULL) < 0 ||
         dsec__nl_neigh_add(in, AF_INET6, eidx, "eth0", &s->gw6, host_mac) < 0))
        return dsec__nl_overflow(err);
    if (dsec__nl_link_up(host, hidx, s->host_if, 1) < 0 ||
        dsec__nl_route_add(host, AF_INET, hidx, s->host_if, &s->addr4, 32, NULL, &s->gw4) < 0 ||
        dsec__nl_neigh_add(host, AF_INET, hidx, s->host_if, &s->addr4, peer_mac) < 0)
        return dsec__nl_overflow(err);
    if (s->v6 &&
        (dsec__nl_route_add(host, AF_INET6, hidx, s->host_if, &s->addr6, 128, NULL, NULL) < 0 ||
         dsec__nl_neigh_add(host, AF_INET6, hidx, s->host_if, &s->addr6, peer_mac) < 0))
        return dsec__nl_overflow(err);
    if (dsec__nl_send(in, err) < 0 || dsec__nl_send(host, err) < 0)
        return -1;
    if (dsec__nl_wait(in, err) < 0 || dsec__nl_wait(host, err) < 0)
        return -1;
    return 0;
}

/* Close what m holds; on failure (rc < 0) also remove what it made. */
static void made_end(const dsec__net_link_spec *s, struct made *m, int rc)
{
    if (rc < 0 && m->veth && m->host->sock != NULL) {
        /* Its peer, and with it everything inside, goes too. */
        dsec_err tmp;
        dsec__nl_reset(m->host);
        if (dsec__nl_link_del(m->host, m->hidx, s->host_if) == 0)
            dsec__nl_run(m->host, &tmp);
    }
    if (m->host != NULL)
        dsec__nl_close(m->host);
    if (m->in != NULL)
        dsec__nl_close(m->in);
    if (m->nsfd >= 0)
        close(m->nsfd);
    if (m->orig >= 0)
        close(m->orig);
    if (rc < 0) {
        if (m->mounted)
            umount2(s->netns_path, MNT_DETACH);
        unlink(s->netns_path);
    }
    dsec_free(m->in);
    dsec_free(m->host);
}

int dsec__net_link_create(const dsec__net_link_spec *s, int *ifindex_out, dsec_err *err)
{
    if (ifindex_out != NULL)
        *ifindex_out = 0;
    if (spec_check(s, err) < 0 || netns_file(s, err) < 0)
        return -1;
    struct made m = {.in = dsec_calloc(1, sizeof *m.in),
                     .host = dsec_calloc(1, sizeof *m.host),
                     .orig = -1,
                     .nsfd = -1};
    int rc = -1;
    if (m.in == NULL || m.host == NULL)
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "net: link create");
    else if (netns_new(s, &m, err) == 0 && veth_make(s, &m, err) == 0 &&
             veth_config(s, &m, err) == 0)
        rc = 0;
    if (rc == 0 && ifindex_out != NULL)
        *ifindex_out = m.hidx;
    made_end(s, &m, rc);
    return rc;
}

/* ---- destroy, lookups ------------------------------------------------------------------------ */

struct lookup {
    int ifindex;
    char *kind;
    size_t kind_len;
};

static int lookup_kind(const struct nlattr *a, void *data)
{
    struct lookup *l = data;
    if (mnl_attr_get_type(a) == IFLA_INFO_KIND && mnl_attr_validate(a, MNL_TYPE_STRING) == 0)
        snprintf(l->kind, l->kind_len, "%.*s",
                 (int)strnlen(mnl_attr_get_str(a), mnl_attr_get_payload_len(a)),
                 mnl_attr_get_str(a));
    return MNL_CB_OK;
}

static int lookup_attr(const struct nlattr *a, void *data)
{
    if (mnl_attr_get_type(a) == IFLA_LINKINFO && mnl_attr_validate(a, MNL_TYPE_NESTED) == 0)
        mnl_attr_parse_nested(a, lookup_kind, data);
    return MNL_CB_OK;
}

static int lookup_msg(const struct nlmsghdr *h, void *data)
{
    struct lookup *l = data;
    if (h->nlmsg_type != RTM_NEWLINK || mnl_nlmsg_get_payload_len(h) < sizeof(struct ifinfomsg))
        return MNL_CB_OK;
    const struct ifinfomsg *ifi = mnl_nlmsg_get_payload(h);
    l->ifindex = ifi->ifi_index;
    mnl_attr_parse(h, sizeof *ifi, lookup_attr, data);
    return MNL_CB_STOP;
}

/* The ifindex of a host link and its kind ("veth"; "" for devices without
 * one); 0 when there is no such link, -1 on failure. */
static int link_lookup(struct nl *nl, const char *name, char *kind, size_t kind_len, dsec_err *err)
{
    struct nlmsghdr *h = mnl_nlmsg_put_header(nl->buf);
    h->nlmsg_type = RTM_GETLINK;
    h->nlmsg_flags = NLM_F_REQUEST;
    h->nlmsg_seq = nl->seq++;
    struct ifinfomsg *ifi = mnl_nlmsg_put_extra_header(h, sizeof *ifi);
    ifi->ifi_family = AF_UNSPEC;
    mnl_attr_put_strz(h, IFLA_IFNAME, name);
    mnl_attr_put_u32(h, IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS);
    if (mnl_socket_sendto(nl->sock, h, h->nlmsg_len) < 0)
        return dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: looking up %s", name);
    struct lookup l = {0, kind, kind_len};
    kind[0] = '\0';
    char rbuf[8192] __attribute__((aligned(8)));
    for (;;) {
        ssize_t r = mnl_socket_recvfrom(nl->sock, rbuf, sizeof rbuf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: looking up %s", name);
        int cr = mnl_cb_run(rbuf, (size_t)r, h->nlmsg_seq, mnl_socket_get_portid(nl->sock),
                            lookup_msg, &l);
        if (cr == MNL_CB_STOP)
            return l.ifindex;
        if (cr < 0) {
            if (errno == ENODEV)
                return 0;
            return dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: looking up %s", name);
        }
    }
}

int dsec__net_link_destroy(const char *netns_path, const char *host_if, dsec_err *err)
{
    int rc = 0;
    dsec_err e1;
    if (host_if != NULL) {
        if (dsec__nl_ifname_check(host_if, "link destroy", err) < 0)
            return -1;
        struct nl *nl = dsec_malloc(sizeof *nl);
        if (nl == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "net: link destroy");
        if (dsec__nl_open(nl, "host", err) < 0) {
            dsec_free(nl);
            return -1;
        }
        char kind[32] = "";
        int idx = link_lookup(nl, host_if, kind, sizeof kind, err);
        if (idx < 0) {
            rc = -1;
        } else if (idx > 0 && strcmp(kind, "veth") != 0) {
            /* A wrong name must not take down a host's uplink. */
            rc = dsec_err_set(err, DSEC_E_INVALID, 0,
                              "net: link destroy: %s is a %s device, not a sandbox's veth; "
                              "not deleting it",
                              host_if, kind[0] ? kind : "plain");
        } else if (idx > 0) {
            dsec__nl_link_del(nl, idx, host_if);
            if (dsec__nl_run(nl, &e1) < 0 && e1.errnum != ENODEV) {
                if (err != NULL)
                    *err = e1;
                rc = -1;
            }
        }
        dsec__nl_close(nl);
        dsec_free(nl);
    }
    if (netns_path != NULL && netns_path[0] != '\0') {
        /* EINVAL: not a mount point (half-created); ENOENT: already gone. */
        if (umount2(netns_path, MNT_DETACH | UMOUNT_NOFOLLOW) < 0 && errno != EINVAL &&
            errno != ENOENT && rc == 0)
            rc = dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: unmounting netns %s",
                              netns_path);
        if (unlink(netns_path) < 0 && errno != ENOENT && rc == 0)
            rc = dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: removing netns file %s",
                              netns_path);
    }
    return rc;
}

int dsec__net_link_ifindex(const char *ifname)
{
    if (ifname == NULL || ifname[0] == '\0' || strlen(ifname) >= IFNAMSIZ)
        return 0;
    return (int)if_nametoindex(ifname);
}

struct list_ctx {
    const char *prefix;
    size_t plen;
    char **v;
    size_t n, cap;
    bool nomem;
};

static int list_attr(const struct nlattr *a, void *data)
{
    const char **name = data;
    if (mnl_attr_get_type(a) == IFLA_IFNAME && mnl_attr_validate(a, MNL_TYPE_NUL_STRING) == 0)
        *name = mnl_attr_get_str(a);
    return MNL_CB_OK;
}

static int list_msg(const struct nlmsghdr *h, void *data)
{
    struct list_ctx *c = data;
    if (h->nlmsg_type != RTM_NEWLINK)
        return MNL_CB_OK;
    const char *name = NULL;
    if (mnl_attr_parse(h, sizeof(struct ifinfomsg), list_attr, &name) < 0 || name == NULL)
        return MNL_CB_OK;
    if (strncmp(name, c->prefix, c->plen) != 0)
        return MNL_CB_OK;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        char **v = dsec_realloc(c->v, cap * sizeof *v);
        if (v == NULL) {
            c->nomem = true;
            return MNL_CB_ERROR;
        }
        c->v = v;
        c->cap = cap;
    }
    char *d = dsec_strdup(name);
    if (d == NULL) {
        c->nomem = true;
        return MNL_CB_ERROR;
    }
    c->v[c->n++] = d;
    return MNL_CB_OK;
}

/* One RTM_GETLINK dump into c. -1 with err set; *interrupted when the kernel
 * flagged the dump as inconsistent (links changed while it ran: libmnl's
 * EINTR), which a fresh dump on a fresh socket gets past. */
static int link_list_once(struct list_ctx *c, bool *interrupted, dsec_err *err)
{
    *interrupted = false;
    struct mnl_socket *sock = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
    if (sock == NULL)
        return dsec_err_set(err, dsec__nl_code_of(errno), errno,
                            "net: link list: rtnetlink socket");
    if (mnl_socket_bind(sock, 0, MNL_SOCKET_AUTOPID) < 0) {
        int e = errno;
        mnl_socket_close(sock);
        return dsec_err_set(err, dsec__nl_code_of(e), e,
                            "net: link list: binding rtnetlink socket");
    }
    uint32_t portid = mnl_socket_get_portid(sock);
    size_t bsz = 32768; /* the size libmnl later calls MNL_SOCKET_DUMP_SIZE */
    char *buf = dsec_malloc(bsz);
    int rc = -1;
    if (buf == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "net: link list");
        goto out;
    }
    struct nlmsghdr *h = mnl_nlmsg_put_header(buf);
    h->nlmsg_type = RTM_GETLINK;
    h->nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    h->nlmsg_seq = 1;
    struct ifinfomsg *ifi = mnl_nlmsg_put_extra_header(h, sizeof *ifi);
    ifi->ifi_family = AF_UNSPEC;
    mnl_attr_put_u32(h, IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS);
    if (mnl_socket_sendto(sock, h, h->nlmsg_len) < 0) {
        dsec_err_set(err, dsec__nl_code_of(errno), errno,
                     "net: link list: sending the dump request");
        goto out;
    }
    for (;;) {
        ssize_t r = mnl_socket_recvfrom(sock, buf, bsz);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: link list: reading the dump");
            goto out;
        }
        int cr = mnl_cb_run(buf, (size_t)r, 1, portid, list_msg, c);
        if (cr == MNL_CB_STOP)
            break;
        if (cr < 0) {
            if (c->nomem) {
                dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "net: link list");
            } else {
                *interrupted = errno == EINTR;
                dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: link list: dump failed");
            }
            goto out;
        }
    }
    rc = 0;
out:
    dsec_free(buf);
    mnl_socket_close(sock);
    return rc;
}

int dsec__net_link_list(const char *prefix, char ***names_out, size_t *n_out, dsec_err *err)
{
    if (names_out == NULL || n_out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "net: link list: no output given");
    *names_out = NULL;
    *n_out = 0;
    for (int attempt = 0;; attempt++) {
        struct list_ctx c = {.prefix = prefix ? prefix : "", .plen = prefix ? strlen(prefix) : 0};
        bool interrupted;
        int rc = link_list_once(&c, &interrupted, err);
        if (rc == 0) {
            *names_out = c.v;
            *n_out = c.n;
            return 0;
        }
        dsec__net_strv_free(c.v, c.n);
        /* links come and go on a busy node: a dump they cut short is taken again */
        if (!interrupted || attempt == 7)
            return -1;
    }
}

void dsec__net_strv_free(char **v, size_t n)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        dsec_free(v[i]);
    dsec_free(v);
}

/* ---- a virtual machine's tap ----------------------------------------------------------------- */

/*
 * A VM's NIC is a tap in the sandbox's namespace, and the namespace's own
 * stack steps aside: tc on the ingress of eth0 and of the tap sends every
 * frame that arrives on one out of the other (mirred egress redirect; the
 * frame is stolen before the namespace's stack sees it). So the guest, using
 * eth0's MAC and the sandbox's address, is on the wire exactly where the
 * namespace was, and the host's neighbour entry, anti-spoofing and policy
 * apply to it unchanged. A tap with no file attached is gone (it is not
 * persistent), and eth0's redirect then drops frames: when the VM stops,
 * nothing reaches the namespace's stack either.
 *
 * The work runs on a thread of its own that joins the namespace, because
 * the tap is created in the namespace of the thread that opens
 * /dev/net/tun, tc has no way to name another namespace's devices, and the
 * /proc/sys/net files are those of the opening thread's namespace. The
 * thread ends with the call; the files it opened stay bound to the
 * namespace.
 */

/* Add (or remove) the ingress qdisc of a device. Removing it removes its filters. */
static int ingress_qdisc(struct nl *nl, uint16_t type, int ifindex, const char *name)
{
    bool add = type == RTM_NEWQDISC;
    struct nlmsghdr *h =
        dsec__nl_put(nl, type, add ? NLM_F_CREATE | NLM_F_EXCL : 0, "%s the ingress qdisc of %s",
                     add ? "adding" : "removing", name);
    if (h == NULL)
        return -1;
    struct tcmsg *t = mnl_nlmsg_put_extra_header(h, sizeof *t);
    t->tcm_family = AF_UNSPEC;
    t->tcm_ifindex = ifindex;
    t->tcm_handle = TC_H_MAKE(TC_H_INGRESS, 0);
    t->tcm_parent = TC_H_INGRESS;
    if (add)
        mnl_attr_put_strz(h, TCA_KIND, "ingress");
    return 0;
}

/* `tc filter add dev FROM parent ffff: protocol all prio 1 u32 match u32 0 0
 *  action mirred egress redirect dev TO`. u32 because kernels without
 * cls_matchall (this is one) all have it; one key with mask 0 matches every
 * frame, and TERMINAL makes the match run the action. */
static int redirect_add(struct nl *nl, int from, const char *from_name, int to, const char *to_name)
{
    struct nlmsghdr *h = dsec__nl_put(nl, RTM_NEWTFILTER, NLM_F_CREATE | NLM_F_EXCL,
                                      "redirecting %s to %s (tc u32, mirred)", from_name, to_name);
    if (h == NULL)
        return -1;
    struct tcmsg *t = mnl_nlmsg_put_extra_header(h, sizeof *t);
    t->tcm_family = AF_UNSPEC;
    t->tcm_ifindex = from;
    t->tcm_handle = 0; /* the kernel picks 800::800 */
    t->tcm_parent = TC_H_MAKE(TC_H_INGRESS, 0);
    t->tcm_info = TC_H_MAKE(1u << 16, htons(ETH_P_ALL)); /* prio 1, every protocol */
    mnl_attr_put_strz(h, TCA_KIND, "u32");
    struct nlattr *opts = mnl_attr_nest_start(h, TCA_OPTIONS);
    /* tc_u32_sel ends in a flexible array of keys: the selector and its one key, packed. */
    struct tc_u32_sel sel;
    struct tc_u32_key key;
    memset(&sel, 0, sizeof sel);
    memset(&key, 0, sizeof key); /* mask 0, value 0: every frame */
    sel.flags = TC_U32_TERMINAL;
    sel.nkeys = 1;
    uint8_t selbuf[sizeof sel + sizeof key];
    memcpy(selbuf, &sel, sizeof sel);
    memcpy(selbuf + sizeof sel, &key, sizeof key);
    mnl_attr_put(h, TCA_U32_SEL, sizeof selbuf, selbuf);
    struct nlattr *acts = mnl_attr_nest_start(h, TCA_U32_ACT);
    struct nlattr *a1 = mnl_attr_nest_start(h, 1); /* the first action */
    mnl_attr_put_strz(h, TCA_ACT_KIND, "mirred");
    struct nlattr *ao = mnl_attr_nest_start(h, TCA_ACT_OPTIONS);
    struct tc_mirred m;
    memset(&m, 0, sizeof m);
    m.action = TC_ACT_STOLEN;
    m.eaction = TCA_EGRESS_REDIR;
    m.ifindex = (uint32_t)to;
    mnl_attr_put(h, TCA_MIRRED_PARMS, sizeof m, &m);
    mnl_attr_nest_end(h, ao);
    mnl_attr_nest_end(h, a1);
    mnl_attr_nest_end(h, acts);
    mnl_attr_nest_end(h, opts);
    return 0;
}

struct guest_job {
    const char *netns_path;
    const char *tap;
    int fd;
    dsec_err err;
};

/* Everything of dsec__net_link_guest, on a thread inside the namespace. */
static int guest_in_ns(struct guest_job *j, struct nl *nl)
{
    dsec_err *err = &j->err;
    int nsfd = open(j->netns_path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0)
        return dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: opening netns %s",
                            j->netns_path);
    /* The host's eth0 must never lose its ingress qdisc to a wrong path. */
    struct stat a, b;
    if (fstat(nsfd, &a) == 0 && stat("/proc/thread-self/ns/net", &b) == 0 && a.st_dev == b.st_dev &&
        a.st_ino == b.st_ino) {
        close(nsfd);
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "net: %s is the host's own network namespace, not a sandbox's",
                            j->netns_path);
    }
    if (setns(nsfd, CLONE_NEWNET) < 0) {
        int e = errno;
        close(nsfd);
        return dsec_err_set(err, e == EINVAL ? DSEC_E_INVALID : dsec__nl_code_of(e), e,
                            "net: joining netns %s%s", j->netns_path,
                            e == EINVAL ? " (not a network namespace)" : "");
    }
    close(nsfd);
    if (dsec__nl_open(nl, "sandbox", err) < 0)
        return -1;
    int eidx = dsec__nl_ifindex_in(dsec__nl_fd(nl), "eth0");
    if (eidx <= 0)
        return dsec_err_set(err, DSEC_E_NOT_FOUND, 0,
                            "net: netns %s has no eth0 (not a sandbox's namespace?)",
                            j->netns_path);

    /* The previous tap (a VM started before) goes, and with it its filter;
     * eth0's filter, which points at it, goes with eth0's ingress qdisc. */
    char kind[32] = "";
    int old = link_lookup(nl, j->tap, kind, sizeof kind, err);
    if (old < 0)
        return -1;
    if (old > 0) {
        if (strcmp(kind, "tun") != 0)
            return dsec_err_set(err, DSEC_E_EXISTS, 0,
                                "net: %s in netns %s is a %s device, not a tap; not replacing it",
                                j->tap, j->netns_path, kind[0] ? kind : "plain");
        if (dsec__nl_link_del(nl, old, j->tap) < 0)
            goto overflow;
        if (dsec__nl_run(nl, err) < 0 && err->errnum != ENODEV)
            return -1;
    }
    if (ingress_qdisc(nl, RTM_DELQDISC, eidx, "eth0") < 0)
        goto overflow;
    if (dsec__nl_run(nl, err) < 0) {
        if (err->errnum != ENOENT && err->errnum != EINVAL)
            return -1;
        dsec_err_clear(err); /* there was none */
    }

    /* The namespace's own stack would still speak IPv6 on eth0 (router
     * solicitations, MLD) with the guest's MAC, and on the tap to the guest;
     * it has nothing to say on the guest's link. */
    char p[128];
    snprintf(p, sizeof p, "/proc/sys/net/ipv6/conf/eth0/disable_ipv6");
    if (dsec__nl_sysctl_put(p, "1", true, err) < 0)
        return -1;

    j->fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    if (j->fd < 0)
        return dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: opening /dev/net/tun");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", j->tap);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    if (ioctl(j->fd, TUNSETIFF, &ifr) < 0)
        return dsec_err_set(err, dsec__nl_code_of(errno), errno, "net: creating tap %s in netns %s",
                            j->tap, j->netns_path);
    int tidx = dsec__nl_ifindex_in(dsec__nl_fd(nl), j->tap);
    if (tidx <= 0)
        return dsec_err_set(err, DSEC_E_INTERNAL, errno, "net: tap %s made, but has no ifindex",
                            j->tap);
    /* Down still, so it has said nothing yet. */
    snprintf(p, sizeof p, "/proc/sys/net/ipv6/conf/%s/disable_ipv6", j->tap);
    if (dsec__nl_sysctl_put(p, "1", true, err) < 0)
        return -1;

    if (dsec__nl_link_up(nl, tidx, j->tap, 0) < 0 ||
        ingress_qdisc(nl, RTM_NEWQDISC, tidx, j->tap) < 0 ||
        ingress_qdisc(nl, RTM_NEWQDISC, eidx, "eth0") < 0 ||
        redirect_add(nl, tidx, j->tap, eidx, "eth0") < 0 ||
        redirect_add(nl, eidx, "eth0", tidx, j->tap) < 0)
        goto overflow;
    return dsec__nl_run(nl, err);

overflow:
    return dsec_err_set(err, DSEC_E_INTERNAL, 0, "net: rtnetlink batch overflow (a bug)");
}

static void *guest_main(void *arg)
{
    struct guest_job *j = arg;
    struct nl *nl = dsec_calloc(1, sizeof *nl);
    if (nl == NULL) {
        dsec_err_set(&j->err, DSEC_E_NOMEM, ENOMEM, "net: guest link");
        return NULL;
    }
    if (guest_in_ns(j, nl) < 0) {
        if (j->fd >= 0) {
            close(j->fd); /* the tap goes with its only file */
            j->fd = -1;
        }
        if (nl->sock != NULL) {
            /* eth0 back as it was, so the namespace stands as a container's would */
            dsec_err tmp;
            int eidx = dsec__nl_ifindex_in(dsec__nl_fd(nl), "eth0");
            dsec__nl_reset(nl);
            if (eidx > 0 && ingress_qdisc(nl, RTM_DELQDISC, eidx, "eth0") == 0)
                dsec__nl_run(nl, &tmp);
        }
    }
    dsec__nl_close(nl);
    dsec_free(nl);
    return NULL;
}

int dsec__net_link_guest(const char *netns_path, const char *tap, int *fd_out, dsec_err *err)
{
    if (fd_out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "net: guest link: no output given");
    *fd_out = -1;
    if (netns_path == NULL || netns_path[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "net: guest link: no netns path given");
    if (dsec__nl_ifname_check(tap, "guest link", err) < 0)
        return -1;
    if (strcmp(tap, "eth0") == 0 || strcmp(tap, "lo") == 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "net: guest link: the tap may not be named '%s'", tap);
    struct guest_job *j = dsec_calloc(1, sizeof *j);
    if (j == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "net: guest link");
    j->netns_path = netns_path;
    j->tap = tap;
    j->fd = -1;
    dsec_err_set(&j->err, DSEC_E_INTERNAL, 0, "net: guest link: the worker did not finish");
    pthread_t t;
    int e = pthread_create(&t, NULL, guest_main, j);
    if (e != 0) {
        dsec_free(j);
        return dsec_err_set(err, dsec__nl_code_of(e), e, "net: guest link: starting a thread");
    }
    pthread_join(t, NULL);
    int rc = 0;
    if (j->fd < 0) {
        if (err != NULL)
            *err = j->err;
        rc = -1;
    } else {
        *fd_out = j->fd;
    }
    dsec_free(j);
    return rc;
}

void dsec__net_link_macs(const struct in_addr *a4, uint8_t host[6], uint8_t peer[6])
{
    dsec__nl_veth_macs(a4, host, peer);
}
