/* net-link-int.h - the rtnetlink plumbing (net-link-nl.c) that net-link.c builds on. */
#ifndef DSEC_BACKENDS_NET_LINK_INT_H
#define DSEC_BACKENDS_NET_LINK_INT_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsec/err.h"

struct mnl_socket;
struct nlmsghdr;

#define BATCH_MAX 12
#define WHAT_MAX 112
#define NL_BUF 4096

/* One rtnetlink socket with a batch of requests being built or awaiting acks. */
struct nl {
    struct mnl_socket *sock;
    const char *where; /* "host" or "sandbox": which namespace, for messages */
    uint32_t seq;      /* sequence number of the next request */
    int n;             /* requests in the batch (built or sent, not yet acked) */
    size_t len;        /* bytes of completed requests in buf */
    struct nlmsghdr *last;
    char what[BATCH_MAX][WHAT_MAX];
    char buf[NL_BUF] __attribute__((aligned(8)));
};

/* The dsec error code of an errno. */
int dsec__nl_code_of(int e);
/* Open nl's socket in the calling thread's namespace; where names it in errors. Closed by
 * dsec__nl_close (nl itself is the caller's). */
int dsec__nl_open(struct nl *nl, const char *where, dsec_err *err);
void dsec__nl_close(struct nl *nl);
/* The socket's descriptor (for ioctls answered in its namespace). */
int dsec__nl_fd(struct nl *nl);
/* Drop whatever is built or awaiting acks (the acks of a closed batch are
 * skipped by their sequence numbers). */
void dsec__nl_reset(struct nl *nl);
/* Start a request in the batch; what names it in an error. Messages here are
 * a few hundred bytes at most, so BATCH_MAX of them always fit in buf. */
struct nlmsghdr *dsec__nl_put(struct nl *nl, uint16_t type, uint16_t flags, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Send the requests built, in one syscall; their acks stay to be read by dsec__nl_wait. */
int dsec__nl_send(struct nl *nl, dsec_err *err);
/* Read the acks of every request sent; the first failure becomes the error
 * (code from its errno), later ones are read and dropped. */
int dsec__nl_wait(struct nl *nl, dsec_err *err);
/* Send and wait: the batch's first failure, or 0. */
int dsec__nl_run(struct nl *nl, dsec_err *err);
/* Set a link up (by name when ifindex is 0); rp_filter > 0 also sets the
 * IPv4 reverse-path filter mode of the interface. */
int dsec__nl_link_up(struct nl *nl, int ifindex, const char *name, int rp_filter);
/* The MACs of a sandbox's veth ends, fixed from its address so that each
 * side can hold a permanent neighbour entry for the other: no ARP or NDP
 * for the gateway, which therefore needs no address on the veth. */
void dsec__nl_veth_macs(const struct in_addr *a4, uint8_t host[6], uint8_t peer[6]);
/* Request builders: each adds one request to the batch, -1 when it does not fit (see
 * dsec__nl_overflow). A veth pair, its peer named eth0 in the namespace of peer_ns_fd. */
int dsec__nl_veth_new(struct nl *nl, const char *host_if, int peer_ns_fd, uint32_t mtu,
                      const uint8_t host_mac[6], const uint8_t peer_mac[6]);
/* Delete a link (by name when ifindex is 0). */
int dsec__nl_link_del(struct nl *nl, int ifindex, const char *name);
/* An address addr/plen on ifindex. */
int dsec__nl_addr_add(struct nl *nl, int family, int ifindex, const char *ifname, const void *addr,
                      uint8_t plen);
/* A permanent neighbour entry: addr is at lladdr on ifindex. */
int dsec__nl_neigh_add(struct nl *nl, int family, int ifindex, const char *ifname, const void *addr,
                       const uint8_t lladdr[6]);
/* A route in the main table: dst/plen out of ifindex, via gw when not NULL
 * (on-link: the gateway needs no covering prefix), preferring source src. */
int dsec__nl_route_add(struct nl *nl, int family, int ifindex, const char *ifname, const void *dst,
                       uint8_t plen, const void *gw, const void *src);
/* The ifindex of name in the namespace fd's socket belongs to (the ioctl is
 * answered in the socket's namespace, not the thread's). */
int dsec__nl_ifindex_in(int fd, const char *name);
/* Write val to a sysctl file of the calling thread's network namespace. */
int dsec__nl_sysctl_put(const char *path, const char *val, bool missing_ok, dsec_err *err);
/* Set a sysctl to "1" unless it already is (forwarding changes walk every
 * device, so the write is worth skipping). */
int dsec__nl_sysctl_on(const char *path, dsec_err *err);
/* name is a usable interface name; what names the operation in the error. */
int dsec__nl_ifname_check(const char *name, const char *what, dsec_err *err);
/* The error of a request that did not fit its batch: the batches are sized for what they carry. */
int dsec__nl_overflow(dsec_err *err);

#endif
