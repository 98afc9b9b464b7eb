/* net.h - network containment of a node's sandboxes: own namespace, nftables policy, node-local
 * DNS, alerts. */
#ifndef DSEC_BACKENDS_NET_H
#define DSEC_BACKENDS_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * One dsec_net per node. Backends that give sandboxes a network namespace
 * (container; microVM and VM through a tap in it) attach each sandbox at
 * create and detach it at destroy. A sandbox reaches nothing but the
 * node-local resolver until its policy allows more.
 *
 * Policy entries (strings, docs/network.md):
 *   pypi                      a mirror named in the cell configuration
 *   example.com               a domain (resolvable, and its addresses reachable)
 *   *.example.com             any name under example.com (not example.com itself)
 *   198.51.100.0/24           an IPv4 range; [2001:db8::/32] an IPv6 range
 *   TARGET:443  TARGET:8000-8100  ports (TCP and UDP unless a protocol follows)
 *   TARGET/tcp  TARGET:53/udp  TARGET/icmp   a protocol (icmp takes no ports)
 * Addresses of the sandbox pools, loopback, link-local (metadata
 * 169.254.169.254 among them), multicast and fd00:ec2::254 are never
 * reachable, whatever the policy says.
 */

typedef struct dsec_net dsec_net;
typedef struct dsec_net_sbx dsec_net_sbx;

/* A named mirror: its targets are policy entries (domains or ranges with
 * ports), e.g. {"pypi.mirror.internal:443/tcp"}. */
typedef struct dsec_net_mirror {
    const char *name;
    const char *const *targets;
    size_t ntargets;
} dsec_net_mirror;

/* One alert: blocked traffic of one sandbox to one destination, aggregated
 * over a window. Strings borrowed for the callback. */
typedef struct dsec_net_alert {
    const char *sandbox;
    const char *tenant; /* "" when the sandbox has none */
    const char *kind;   /* "dns_denied" | "dns_type" | "dns_cname" | "dns_flood" | "dns_malformed" |
                           "blocked" */
    const char *dest;   /* the name asked, or the address */
    const char *detail; /* "TXT", "tcp/443", "udp/53", "icmp", ... */
    uint64_t count;     /* occurrences in the window (after kernel rate limits) */
    uint64_t first_ns;  /* wall clock */
    uint64_t last_ns;
} dsec_net_alert;

typedef struct dsec_net_conf {
    const char *state_dir; /* namespace files live in <state_dir>/netns */
    unsigned tag;          /* 0..255, distinct per node on one host: names the table and veths */
    const char *pool4;     /* this node's sandbox addresses; NULL: 100.(64+tag/4)... see net.c */
    const char *pool6;     /* NULL: fd64:d5ec:0:TT00::/56; "" turns IPv6 off */
    const char *const
        *upstream;    /* resolvers for allowed names, "ip" or "ip:port" / "[ip6]:port"; */
    size_t nupstream; /* none: the host's /etc/resolv.conf */
    const dsec_net_mirror *mirrors;
    size_t nmirrors;
    const char *const *deny; /* extra CIDRs never reachable (e.g. the bus's addresses) */
    size_t ndeny;
    bool masquerade;          /* SNAT sandbox traffic leaving the node (off in tests) */
    uint16_t dns_port;        /* 0: 53 */
    uint32_t dns_qps;         /* per sandbox; 0: 100 */
    uint32_t dns_cache;       /* resolver answers cached for all the node's sandboxes; 0: 10000 */
    uint32_t conn_rate;       /* new connections per second per sandbox; 0: 200 */
    uint32_t alert_window_ms; /* aggregation window; 0: 1000 */
    uint32_t
        alerts_per_window; /* per sandbox; more are summed into one "suppressed" alert; 0: 16 */
    uint32_t warm;         /* namespaces and veths kept ready ahead of creates, made by a
                              thread of their own; 0: 8; UINT32_MAX: none */
    /* Called on the net module's own thread for each alert. */
    void (*on_alert)(void *arg, const dsec_net_alert *a);
    void *alert_arg;
} dsec_net_conf;

/* Open the node's containment: host forwarding, the nftables table (a stale
 * one is replaced), the resolver on the gateway addresses. *out freed by
 * dsec_net_free. */
int dsec_net_new(dsec_net **out, const dsec_net_conf *c, dsec_err *err);

/* Close. keep: leave attached sandboxes' namespaces, veths and table in
 * place (node restart; dsec_net_adopt re-attaches), else remove all. Every
 * handle must be detached or released first. NULL: no-op. */
void dsec_net_free(dsec_net *n, bool keep);

/* Check a policy without applying it: 0, or -1 with err naming the bad
 * entry. n may be NULL (then mirrors are not known: names pass when they
 * are valid names). */
int dsec_net_policy_check(const dsec_net *n, const char *const *entries, size_t count,
                          dsec_err *err);

/* Give sandbox id its namespace, veth and policy. *out is released by
 * dsec_net_detach (removes it) or dsec_net_release (keeps it for adopt). */
int dsec_net_attach(dsec_net *n, const char *id, const char *tenant, const char *const *entries,
                    size_t count, dsec_net_sbx **out, dsec_err *err);

/* Re-attach after a node restart: state is what dsec_net_sbx_state gave. */
int dsec_net_adopt(dsec_net *n, const char *id, const char *tenant, const char *state,
                   const char *const *entries, size_t count, dsec_net_sbx **out, dsec_err *err);

/* Remove the sandbox's namespace, veth, rules and pins. NULL: no-op. */
int dsec_net_detach(dsec_net_sbx *s, dsec_err *err);
/* Forget the handle, leave everything in place. NULL: no-op. */
void dsec_net_release(dsec_net_sbx *s);

/* After adoption: remove namespaces and veths of this node that no sandbox
 * holds (leftovers of a crash). Returns how many were removed, or -1. */
int dsec_net_sweep(dsec_net *n, dsec_err *err);

/* Replace the policy while the sandbox runs: new connections follow it at
 * once, and connections the new policy no longer allows are cut. */
int dsec_net_set(dsec_net_sbx *s, const char *const *entries, size_t count, dsec_err *err);

/* Give an attached sandbox's network another sandbox id and tenant (what alerts and
 * messages name it by): a namespace made ahead for a warm container, taken by a sandbox. */
int dsec_net_rename(dsec_net_sbx *s, const char *id, const char *tenant, dsec_err *err);

/* The bind-mounted namespace to join (valid while attached). */
const char *dsec_net_sbx_netns(const dsec_net_sbx *s);
/* The resolver address to write into the sandbox's resolv.conf. */
const char *dsec_net_sbx_resolver(const dsec_net_sbx *s);
/* The sandbox's IPv4 address, dotted. */
const char *dsec_net_sbx_addr(const dsec_net_sbx *s);
/* What adopt needs back ("idx=N"), a static-lifetime string of the handle. */
const char *dsec_net_sbx_state(const dsec_net_sbx *s);

/* A virtual machine's side of its sandbox's network. The guest's NIC sends and
 * receives as the sandbox itself: a tap device in the sandbox's namespace
 * whose frames are redirected (tc ingress, u32 match-all, mirred) to and
 * from the namespace's veth, so the guest uses the veth's MAC and address
 * and the host-side policy applies unchanged (a guest sending from any other
 * address reaches nothing). Strings are empty when not applicable (IPv6 off). */
typedef struct dsec_net_guest {
    int tap_fd;              /* /dev/net/tun bound to the tap (IFF_TAP|IFF_NO_PI, no vnet header),
                              * O_CLOEXEC: give QEMU an inheritable dup of it (-netdev
                              * tap,id=n0,fd=N,vhost=off); the caller owns and closes it once QEMU
                              * holds its copy. The tap lives while any copy is open. */
    char tap[16];            /* the tap's name inside the namespace ("tap0") */
    char mac[18];            /* the MAC the guest's NIC must use, "02:d6:.." (virtio-net mac=) */
    char addr4[24];          /* "A.B.C.D/32" for the guest's NIC: a /32, so the gateway is reached
                              * by a link route (ip route add GW dev eth0, then default via GW;
                              * or "default via GW dev eth0 onlink") */
    char gw4[16];            /* next hop, dotted */
    char gw_mac[18];         /* the gateway's MAC: the guest installs a permanent neighbour for it
                              * (nothing on the link answers ARP or NDP) */
    char dns4[16];           /* the resolver the guest's resolv.conf names (the gateway) */
    char addr6[48], gw6[40]; /* "ADDR/128" and the gateway, like addr4/gw4; gw_mac serves both */
} dsec_net_guest;

/* Create the tap and the redirects for s, and describe what the guest must
 * configure. Call once per QEMU start; a second call replaces the tap (a file
 * still open on the old one is left dead: its reads and writes fail with
 * EBADFD). A VM that survives a node restart keeps its tap: after
 * dsec_net_adopt, call this only to start QEMU again. The namespace's own
 * stack is shut out of the link (frames arriving on its veth go to the tap,
 * its IPv6 is off), so when QEMU is gone and the tap with it, frames for the
 * guest are dropped. An open tap file keeps the namespace alive: stop QEMU
 * before dsec_net_detach (which removes the veth: a tap outliving it reaches
 * nothing). On failure out->tap_fd is -1 and no tap is left. Thread-safe for
 * different sandboxes; the calling thread's namespace never changes. */
int dsec_net_guest_link(dsec_net_sbx *s, dsec_net_guest *out, dsec_err *err);

typedef struct dsec_net_stats {
    uint64_t sandboxes;
    uint64_t dns_queries, dns_answered, dns_refused, dns_dropped;
    uint64_t dns_cache_hits, dns_cache_misses, dns_cache_evictions;
    uint64_t dns_upstream_tcp; /* truncated upstream answers asked again over TCP */
    uint64_t blocked;          /* blocked packets seen (after kernel log limits) */
    uint64_t alerts;           /* alerts emitted */
    uint64_t alerts_suppressed;
} dsec_net_stats;
void dsec_net_stats_get(dsec_net *n, dsec_net_stats *out);

#ifdef __cplusplus
}
#endif
#endif
