/* net-node-int.h - internals of a node's network containment (net.c) shared by its files: the
 * node, its sandboxes and their policies. */
#ifndef DSEC_BACKENDS_NET_NODE_INT_H
#define DSEC_BACKENDS_NET_NODE_INT_H

#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "backends/net/net-int.h"
#include "backends/net/net.h"

#define NET_ENTRIES_MAX 64
#define NET_ENTRY_LEN_MAX 255
#define NET_PINS_MAX 512
#define AGG_SLOTS 512

enum { P_TCP = 1, P_UDP = 2, P_ICMP = 4 };

/* One parsed policy entry: a domain rule (answered by the resolver, its
 * addresses pinned on answer) or an address-range rule (in the sets at once). */
struct rule {
    char *domain;  /* NULL for a range; lower case, no trailing dot */
    bool wildcard; /* "*.domain": names strictly under domain */
    int family;
    uint8_t addr[16];
    uint8_t prefix;
    unsigned protos; /* P_* */
    uint16_t port_lo, port_hi;
};

struct policy {
    struct rule *r;
    size_t n;
};

/* An address the resolver returned, kept so a policy change can keep (or
 * cut) it and re-pin it for the rest of its TTL. */
struct pin {
    char name[256];
    int family;
    uint8_t addr[16];
    uint64_t expires_ns; /* monotonic */
};

struct dsec_net_sbx {
    dsec_net *net;
    char *id;
    char *tenant;
    uint32_t idx;
    char ifname[16];
    struct in_addr a4;
    struct in6_addr a6;
    char addr_str[INET_ADDRSTRLEN];
    char netns[PATH_MAX];
    char state[32];
    struct policy pol; /* guarded by net->lock */
    struct pin *pins;
    size_t npins;
};

/* Alerts of one window, keyed by (sandbox, kind, dest, detail). */
struct agg {
    bool used;
    uint32_t idx;
    char sandbox[96];
    char tenant[72];
    char kind[16];
    char dest[256];
    char detail[24];
    uint64_t count, first_ns, last_ns;
};

struct dsec_net {
    dsec_net_conf conf; /* copied strings below */
    char *state_dir;
    unsigned tag;
    char table[16];
    char prefix[8]; /* "dsvTT" */
    bool gw_made;   /* the gateway's addresses are on lo */
    struct in_addr base4;
    uint8_t len4;
    bool v6;
    struct in6_addr base6;
    uint8_t len6;
    struct in_addr gw4;
    struct in6_addr gw6;
    char gw4_str[INET_ADDRSTRLEN];
    uint32_t capacity; /* sandboxes the pool holds */

    /* mirrors: name -> parsed entries */
    struct mirror {
        char *name;
        struct policy pol;
    } * mirrors;
    size_t nmirrors;

    dsec__nft *nft;
    dsec__dns *dns;

    pthread_mutex_t lock; /* sandboxes, policies, pins */
    dsec_net_sbx **sbx;   /* by idx, capacity slots */
    uint32_t next;        /* allocation hint */
    uint64_t nsbx;
    uint64_t released; /* handles forgotten with their network left in place (restart) */
    bool swept;        /* dsec_net_sweep ran: a slot's leftovers are no adoptee's any more */

    pthread_mutex_t alock; /* alerts */
    struct agg agg[AGG_SLOTS];
    struct agg batch[AGG_SLOTS]; /* the flusher's copy of a window */
    uint64_t agg_dropped;        /* no slot left this window */
    uint64_t blocked, alerts, suppressed;
    bool trace; /* DSEC_NET_TRACE=1: time each attach's steps on stderr */

    /* Warm links: namespaces and veths made ahead of the create that takes
     * them (off its path), by their own thread; their slots hold the
     * reserved marker. Guarded by lock. */
    uint32_t *warm;
    uint32_t nwarm, warm_max;
    pthread_t warmer;
    bool warmer_on, warm_stop;
    pthread_cond_t warm_cv;
    pthread_t flusher;
    bool flusher_on;
    pthread_cond_t stop_cv;
    bool stopping;
};

static inline uint64_t dsec__net_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t dsec__net_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- net-policy.c: policies --------------------------------------------------------------------
 */

/* Free p's rules; p is left empty. */
void dsec__net_policy_clear(struct policy *p);
/* 1..64 of [A-Za-z0-9_-]: a mirror's name. */
bool dsec__net_mirror_name_ok(const char *s);
/* "addr" or "addr/prefix" of family into addr and *prefix; -1 when it is not one. */
int dsec__net_parse_cidr(const char *s, int family, uint8_t *addr, uint8_t *prefix);
/* Parse one entry into p; a mirror name expands into the mirror's entries. */
int dsec__net_parse_entry(const dsec_net *n, const char *e, struct policy *p, dsec_err *err);
/* A whole entry list into p (emptied first; freed with dsec__net_policy_clear). */
int dsec__net_parse_policy(const dsec_net *n, const char *const *entries, size_t count,
                           struct policy *p, dsec_err *err);
/* Does domain rule r cover name? */
bool dsec__net_name_matches(const struct rule *r, const char *name);
/* Is address a inside net/prefix? */
bool dsec__net_in_range(int family, const uint8_t *a, const uint8_t *net, uint8_t prefix);
/* Does r allow protocol proto to port? */
bool dsec__net_rule_allows(const struct rule *r, uint8_t proto, uint16_t port);
/* The nft elements of one rule for a destination (the rule's range, or one
 * pinned address); returns how many were written (at most 3). */
size_t dsec__net_rule_elems(const struct rule *r, int family, const uint8_t *addr, uint8_t prefix,
                            uint32_t timeout_ms, dsec__nft_elem *out);
/* Elements for a sandbox's static rules and its live pins (under lock). *out dsec_malloc'd. */
int dsec__net_sbx_elems(dsec_net_sbx *s, dsec__nft_elem **out, size_t *nout, dsec_err *err);

/* ---- net-alert.c: alerts -----------------------------------------------------------------------
 */

/* Count one event (any thread). Copies what the flush needs, so the sandbox
 * may be gone by then. */
void dsec__net_alert_note(dsec_net *n, const dsec_net_sbx *s, const char *kind, const char *dest,
                          const char *detail);
/* The alert thread (arg: the node): a flush per window until the node stops. */
void *dsec__net_flusher_main(void *arg);

/* ---- net-hooks.c: the resolver's and the log reader's callbacks (ud: the node) -----------------
 */

bool dsec__net_dns_allowed(void *ud, const struct sockaddr *client, const char *name);
void dsec__net_dns_pin(void *ud, const struct sockaddr *client, const char *qname, int family,
                       const uint8_t *addr, uint32_t ttl);
void dsec__net_dns_refused(void *ud, const struct sockaddr *client, const char *qname,
                           uint16_t qtype, const char *why);
void dsec__net_on_block(void *ud, const dsec__nft_block *b);

/* ---- net.c: lookups ----------------------------------------------------------------------------
 */

/* The sandbox in slot i (under lock), or NULL. */
dsec_net_sbx *dsec__net_slot_get(const dsec_net *n, uint64_t i);
/* The sandbox that owns a client address (under lock), or NULL. */
dsec_net_sbx *dsec__net_sbx_by_addr(dsec_net *n, const struct sockaddr *sa);
#endif
