/* net.c - a node's network containment: its set-up, address pool, and sandboxes attached,
 * adopted, changed and detached (policies: net-policy.c; alerts: net-alert.c). */
#define _GNU_SOURCE
#include "net.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dsec/alloc.h"
#include "dsec/log.h"
#include "net-int.h"
#include "net-node-int.h"

/* ---- addresses and lookups ---------------------------------------------------------------- */

/* A placeholder holding a slot while its sandbox is set up: lookups skip it. */
static dsec_net_sbx reserved_marker;

/* The sandbox in slot i (under lock), or NULL. */
dsec_net_sbx *dsec__net_slot_get(const dsec_net *n, uint64_t i)
{
    if (i >= n->capacity || n->sbx[i] == &reserved_marker)
        return NULL;
    return n->sbx[i];
}

static void idx_addrs(const dsec_net *n, uint32_t idx, struct in_addr *a4, struct in6_addr *a6)
{
    a4->s_addr = htonl(ntohl(n->base4.s_addr) + 2 + idx);
    *a6 = n->base6;
    uint32_t low;
    memcpy(&low, &a6->s6_addr[12], 4);
    low = htonl(ntohl(low) + 2 + idx);
    memcpy(&a6->s6_addr[12], &low, 4);
}

/* The sandbox that owns a client address (under lock), or NULL. */
dsec_net_sbx *dsec__net_sbx_by_addr(dsec_net *n, const struct sockaddr *sa)
{
    uint64_t off;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        uint32_t a = ntohl(in->sin_addr.s_addr), b = ntohl(n->base4.s_addr);
        if (a < b + 2)
            return NULL;
        off = (uint64_t)a - b - 2;
    } else if (sa->sa_family == AF_INET6 && n->v6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        if (memcmp(in6->sin6_addr.s6_addr, n->base6.s6_addr, 12) != 0)
            return NULL;
        uint32_t low, blow;
        memcpy(&low, &in6->sin6_addr.s6_addr[12], 4);
        memcpy(&blow, &n->base6.s6_addr[12], 4);
        if (ntohl(low) < ntohl(blow) + 2)
            return NULL;
        off = (uint64_t)ntohl(low) - ntohl(blow) - 2;
    } else {
        return NULL;
    }
    return dsec__net_slot_get(n, off);
}
/* ---- the node's containment --------------------------------------------------------------- */

static int parse_hostport(const char *s, uint16_t defport, struct sockaddr_storage *ss)
{
    char host[64];
    unsigned long port = defport;
    memset(ss, 0, sizeof *ss);
    const char *p = s;
    if (*p == '[') {
        const char *close = strchr(p, ']');
        if (!close || (size_t)(close - p - 1) >= sizeof host)
            return -1;
        memcpy(host, p + 1, (size_t)(close - p - 1));
        host[close - p - 1] = 0;
        p = close + 1;
        if (*p == ':')
            port = strtoul(p + 1, NULL, 10);
        else if (*p)
            return -1;
    } else {
        const char *colon = strchr(p, ':');
        if (colon && strchr(colon + 1, ':'))
            colon = NULL; /* bare IPv6 */
        size_t hl = colon ? (size_t)(colon - p) : strlen(p);
        if (hl >= sizeof host)
            return -1;
        memcpy(host, p, hl);
        host[hl] = 0;
        if (colon)
            port = strtoul(colon + 1, NULL, 10);
    }
    if (port == 0 || port > 65535)
        return -1;
    struct sockaddr_in *in = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &in->sin_addr) == 1) {
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)port);
        return 0;
    }
    if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        return 0;
    }
    return -1;
}

/* The host's resolvers from /etc/resolv.conf. */
static size_t host_resolvers(struct sockaddr_storage *out, size_t max)
{
    FILE *f = fopen("/etc/resolv.conf", "re");
    size_t k = 0;
    char line[256];
    while (f && k < max && fgets(line, sizeof line, f)) {
        char addr[128];
        if (sscanf(line, " nameserver %127s", addr) == 1) {
            char *pct = strchr(addr, '%');
            if (pct)
                *pct = 0;
            if (parse_hostport(addr, 53, &out[k]) == 0)
                k++;
        }
    }
    if (f)
        fclose(f);
    return k;
}

static int setup_pools(dsec_net *n, const dsec_net_conf *c, dsec_err *err)
{
    uint8_t a[16];
    if (c->pool4) {
        if (dsec__net_parse_cidr(c->pool4, AF_INET, a, &n->len4) < 0 || n->len4 > 28)
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "net pool4 \"%s\": expected an IPv4 range of /28 or larger",
                                c->pool4);
        memcpy(&n->base4, a, 4);
    } else { /* 100.64.0.0/10 split in 256 /18s, one per node tag */
        n->base4.s_addr = htonl(0x64400000u + ((uint32_t)n->tag << 14));
        n->len4 = 18;
    }
    n->v6 = !(c->pool6 && !*c->pool6);
    if (n->v6) {
        if (c->pool6) {
            if (dsec__net_parse_cidr(c->pool6, AF_INET6, a, &n->len6) < 0 || n->len6 > 112 ||
                n->len6 < 64)
                return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                    "net pool6 \"%s\": expected an IPv6 range /64../112", c->pool6);
            memcpy(&n->base6, a, 16);
        } else {
            inet_pton(AF_INET6, "fd64:d5ec::", &n->base6);
            n->base6.s6_addr[6] = (uint8_t)n->tag;
            n->len6 = 64;
        }
    }
    uint64_t cap4 = (1ull << (32 - n->len4)) - 3; /* network, gateway, broadcast */
    n->capacity = (uint32_t)(cap4 > 65536 ? 65536 : cap4);
    n->gw4.s_addr = htonl(ntohl(n->base4.s_addr) + 1);
    n->gw6 = n->base6;
    n->gw6.s6_addr[15] |= 1;
    inet_ntop(AF_INET, &n->gw4, n->gw4_str, sizeof n->gw4_str);
    return 0;
}

static void warm_drain(dsec_net *n);

/* The node's settings (defaults filled in, strings its own) and names. */
static int node_init(dsec_net *n, const dsec_net_conf *c, dsec_err *err)
{
    n->conf = *c;
    n->conf.on_alert = c->on_alert;
    if (!n->conf.dns_port)
        n->conf.dns_port = 53;
    if (!n->conf.dns_qps)
        n->conf.dns_qps = 100;
    if (!n->conf.conn_rate)
        n->conf.conn_rate = 200;
    if (!n->conf.alert_window_ms)
        n->conf.alert_window_ms = 1000;
    if (!n->conf.alerts_per_window)
        n->conf.alerts_per_window = 16;
    n->tag = c->tag;
    const char *tr = getenv("DSEC_NET_TRACE");
    n->trace = tr != NULL && tr[0] == '1';
    snprintf(n->table, sizeof n->table, "dsec_%02x", n->tag);
    snprintf(n->prefix, sizeof n->prefix, "dsv%02x", n->tag);
    if (!(n->state_dir = dsec_strdup(c->state_dir)))
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
    n->conf.state_dir = n->state_dir;
    return 0;
}

/* mirrors: parsed once; a mirror's targets may not name other mirrors */
static int mirrors_parse(dsec_net *n, const dsec_net_conf *c, dsec_err *err)
{
    if (c->nmirrors && !(n->mirrors = dsec_calloc(c->nmirrors, sizeof *n->mirrors)))
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
    for (size_t i = 0; i < c->nmirrors; i++) {
        if (!c->mirrors[i].name || !dsec__net_mirror_name_ok(c->mirrors[i].name))
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "net mirror \"%s\": a mirror name is 1..64 of [A-Za-z0-9_-]",
                                c->mirrors[i].name ? c->mirrors[i].name : "");
        n->mirrors[i].name = dsec_strdup(c->mirrors[i].name);
        n->nmirrors = i + 1;
        for (size_t j = 0; j < c->mirrors[i].ntargets; j++) {
            const char *t = c->mirrors[i].targets[j];
            if (!t || (dsec__net_mirror_name_ok(t) && !strchr(t, '.')))
                return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                    "net mirror \"%s\": target \"%s\" must be a domain or "
                                    "address range with ports",
                                    c->mirrors[i].name, t ? t : "");
            if (dsec__net_parse_entry(NULL, t, &n->mirrors[i].pol, err) < 0) {
                dsec_err_wrap(err, "net mirror \"%s\"", c->mirrors[i].name);
                err->code = DSEC_E_CONFIG;
                return -1;
            }
        }
    }
    return 0;
}

/* The host: forwarding on, the gateway's addresses on lo, the namespaces' directory. */
static int host_setup(dsec_net *n, dsec_err *err)
{
    if (dsec__net_link_host_prepare(n->v6, err) < 0 ||
        dsec__net_link_gateway(&n->gw4, n->v6 ? &n->gw6 : NULL, err) < 0)
        return -1;
    n->gw_made = true;
    char netns_dir[PATH_MAX];
    snprintf(netns_dir, sizeof netns_dir, "%s/netns", n->state_dir);
    if (mkdir(netns_dir, 0700) < 0 && errno != EEXIST)
        return dsec_err_set(err, DSEC_E_IO, errno, "creating %s", netns_dir);
    return 0;
}

/* The node's nftables tables, and the reader of what they block. */
static int nft_start(dsec_net *n, const dsec_net_conf *c, dsec_err *err)
{
    dsec__nft_conf nc = {
        .table = n->table,
        .gw4 = n->gw4,
        .pool4 = n->base4,
        .pool4_len = n->len4,
        .v6 = n->v6,
        .gw6 = n->gw6,
        .pool6 = n->base6,
        .pool6_len = n->len6,
        .dns_port = n->conf.dns_port,
        .masquerade = c->masquerade,
        .log_group = (uint16_t)(3000 + n->tag),
        .log_rate = 20,
        .dns_rate = n->conf.dns_qps * 2,
        .conn_rate = n->conf.conn_rate,
        .deny = c->deny,
        .ndeny = c->ndeny,
    };
    if (dsec__nft_new(&n->nft, &nc, err) < 0)
        return -1;
    return dsec__nft_log_start(n->nft, dsec__net_on_block, n, err);
}

/* The resolver, listening on the gateway, asking c's upstreams (or the host's). */
static int dns_start(dsec_net *n, const dsec_net_conf *c, dsec_err *err)
{
    dsec__dns_conf dc = {.allowed = dsec__net_dns_allowed,
                         .pin = dsec__net_dns_pin,
                         .refused = dsec__net_dns_refused,
                         .ud = n};
    struct sockaddr_in *l4 = (struct sockaddr_in *)&dc.listen[0];
    l4->sin_family = AF_INET;
    l4->sin_addr = n->gw4;
    l4->sin_port = htons(n->conf.dns_port);
    dc.nlisten = 1;
    if (n->v6) {
        struct sockaddr_in6 *l6 = (struct sockaddr_in6 *)&dc.listen[1];
        l6->sin6_family = AF_INET6;
        l6->sin6_addr = n->gw6;
        l6->sin6_port = htons(n->conf.dns_port);
        dc.nlisten = 2;
    }
    for (size_t i = 0; i < c->nupstream && dc.nupstream < 4; i++) {
        if (parse_hostport(c->upstream[i], 53, &dc.upstream[dc.nupstream]) < 0)
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "net upstream \"%s\": expected ip, ip:port or [ip6]:port",
                                c->upstream[i]);
        dc.nupstream++;
    }
    if (!dc.nupstream)
        dc.nupstream = host_resolvers(dc.upstream, 4);
    dc.client_qps = n->conf.dns_qps;
    dc.cache_entries = n->conf.dns_cache;
    return dsec__dns_new(&n->dns, &dc, err);
}

int dsec_net_new(dsec_net **out, const dsec_net_conf *c, dsec_err *err)
{
    *out = NULL;
    if (!c || !c->state_dir)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "net: no state directory");
    if (c->tag > 255)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "net: node tag %u is over 255", c->tag);
    dsec_net *n = dsec_calloc(1, sizeof *n);
    if (!n)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
    pthread_mutex_init(&n->lock, NULL);
    pthread_mutex_init(&n->alock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&n->stop_cv, &ca);
    pthread_cond_init(&n->warm_cv, &ca);
    pthread_condattr_destroy(&ca);
    if (node_init(n, c, err) < 0 || setup_pools(n, c, err) < 0)
        goto fail;
    if (!(n->sbx = dsec_calloc(n->capacity, sizeof *n->sbx))) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory for %u sandbox slots", n->capacity);
        goto fail;
    }
    if (mirrors_parse(n, c, err) < 0 || host_setup(n, err) < 0 || nft_start(n, c, err) < 0 ||
        dns_start(n, c, err) < 0)
        goto fail;
    if (pthread_create(&n->flusher, NULL, dsec__net_flusher_main, n) != 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "starting the alert thread");
        goto fail;
    }
    n->flusher_on = true;
    /* the warmer starts with the first attach: adoption (before it) must
     * find its sandboxes' slots free, and the sweep their leftovers */
    n->warm_max = c->warm == 0 ? 8 : c->warm == UINT32_MAX ? 0 : c->warm;
    if (n->warm_max > 0 && !(n->warm = dsec_calloc(n->warm_max, sizeof *n->warm))) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
        goto fail;
    }
    *out = n;
    return 0;
fail:
    dsec_err_wrap(err, "network containment");
    dsec_net_free(n, true);
    return -1;
}

void dsec_net_free(dsec_net *n, bool keep)
{
    if (!n)
        return;
    if (n->flusher_on) {
        pthread_mutex_lock(&n->alock);
        n->stopping = true;
        pthread_cond_signal(&n->stop_cv);
        pthread_mutex_unlock(&n->alock);
        pthread_join(n->flusher, NULL);
    }
    dsec__dns_free(n->dns);
    warm_drain(n);
    /* kept for adoption only if something is there to adopt (sandboxes
     * still attached, or released by their backends for a restart): a node
     * that stops with no sandboxes leaves no table behind */
    if (keep && n->nsbx == 0 && n->released == 0)
        keep = false;
    for (uint32_t i = 0; n->sbx && i < n->capacity; i++) {
        dsec_net_sbx *s = dsec__net_slot_get(n, i);
        if (!s)
            continue;
        if (keep) {
            dsec_net_release(s);
        } else {
            dsec_err err;
            dsec_net_detach(s, &err);
        }
    }
    dsec__nft_free(n->nft, !keep);
    if (!keep && n->gw_made) {
        dsec_err e2;
        if (dsec__net_link_gateway_del(&n->gw4, n->v6 ? &n->gw6 : NULL, &e2) < 0)
            dsec_log_warn("dsec net: %s", e2.msg);
    }
    for (size_t i = 0; i < n->nmirrors; i++) {
        dsec_free(n->mirrors[i].name);
        dsec__net_policy_clear(&n->mirrors[i].pol);
    }
    dsec_free(n->mirrors);
    dsec_free(n->sbx);
    dsec_free(n->warm);
    dsec_free(n->state_dir);
    pthread_cond_destroy(&n->warm_cv);
    pthread_cond_destroy(&n->stop_cv);
    pthread_mutex_destroy(&n->alock);
    pthread_mutex_destroy(&n->lock);
    dsec_free(n);
}

/* ---- sandboxes ---------------------------------------------------------------------------- */

static void sbx_free(dsec_net_sbx *s)
{
    if (!s)
        return;
    dsec__net_policy_clear(&s->pol);
    dsec_free(s->pins);
    dsec_free(s->id);
    dsec_free(s->tenant);
    dsec_free(s);
}

/* Slot idx's host veth name (ifname, 16 bytes) and namespace file (netns, PATH_MAX bytes). */
static void slot_names(const dsec_net *n, uint32_t idx, char *ifname, char *netns)
{
    snprintf(ifname, sizeof((dsec_net_sbx *)0)->ifname, "%s%06x", n->prefix, idx);
    snprintf(netns, sizeof((dsec_net_sbx *)0)->netns, "%s/netns/%s", n->state_dir, ifname);
}

static dsec_net_sbx *sbx_new(dsec_net *n, const char *id, const char *tenant, uint32_t idx)
{
    dsec_net_sbx *s = dsec_calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->net = n;
    s->idx = idx;
    s->id = dsec_strdup(id);
    s->tenant = dsec_strdup(tenant ? tenant : "");
    if (!s->id || !s->tenant) {
        sbx_free(s);
        return NULL;
    }
    slot_names(n, idx, s->ifname, s->netns);
    idx_addrs(n, idx, &s->a4, &s->a6);
    inet_ntop(AF_INET, &s->a4, s->addr_str, sizeof s->addr_str);
    snprintf(s->state, sizeof s->state, "idx=%u", idx);
    return s;
}

/* Whether slot idx has a veth or namespace file on the host. Before the node's sweep, that may
 * be the network of a sandbox still to be adopted (a backend's warm pool attaches from its
 * start, before the node re-adopts): its slot is not handed out, or link_fresh would remove the
 * live sandbox's network and its adoption would then find the slot taken. */
static bool slot_has_leftovers(const dsec_net *n, uint32_t idx)
{
    char ifname[sizeof((dsec_net_sbx *)0)->ifname], path[sizeof((dsec_net_sbx *)0)->netns];
    slot_names(n, idx, ifname, path);
    struct stat st;
    return stat(path, &st) == 0 || dsec__net_link_ifindex(ifname) > 0;
}

/* Reserve a free slot (under lock): the slot holds s from now on. */
static int reserve(dsec_net *n, dsec_net_sbx *s_proto, uint32_t *idx, dsec_err *err)
{
    for (uint32_t k = 0; k < n->capacity; k++) {
        uint32_t i = (n->next + k) % n->capacity;
        if (!n->sbx[i] && (n->swept || !slot_has_leftovers(n, i))) {
            n->sbx[i] = s_proto;
            n->next = (i + 1) % n->capacity;
            *idx = i;
            return 0;
        }
    }
    return dsec_err_set(err, DSEC_E_CAPACITY, 0,
                        "the node's sandbox address pool (%u addresses) is used up", n->capacity);
}

/* Make slot s's namespace and veth, first removing what a crashed earlier
 * holder of the slot may have left. */
static int link_fresh(const dsec_net *n, const dsec_net_sbx *s, dsec_err *err)
{
    struct stat st;
    if (dsec__net_link_ifindex(s->ifname) > 0 || stat(s->netns, &st) == 0) {
        dsec_err e2;
        dsec__net_link_destroy(s->netns, s->ifname, &e2);
    }
    dsec__net_link_spec ls = {.netns_path = s->netns,
                              .host_if = s->ifname,
                              .gw4 = n->gw4,
                              .addr4 = s->a4,
                              .v6 = n->v6,
                              .gw6 = n->gw6,
                              .addr6 = s->a6};
    return dsec__net_link_create(&ls, NULL, err);
}

/* Slot idx ends its reservation: it holds s from now on, or is free when s is NULL. */
static void slot_settle(dsec_net *n, uint32_t idx, dsec_net_sbx *s)
{
    pthread_mutex_lock(&n->lock);
    n->sbx[idx] = s;
    if (s != NULL)
        n->nsbx++;
    pthread_mutex_unlock(&n->lock);
}

static int sbx_install(dsec_net *n, dsec_net_sbx *s, struct policy *pol, bool fresh, dsec_err *err)
{
    uint64_t t0 = dsec__net_mono_ns(), t1 = t0;
    if (fresh) {
        if (link_fresh(n, s, err) < 0)
            return -1;
        t1 = dsec__net_mono_ns();
    }
    s->pol = *pol;
    memset(pol, 0, sizeof *pol);
    dsec__nft_elem *e = NULL;
    size_t ne = 0;
    if (dsec__net_sbx_elems(s, &e, &ne, err) < 0 ||
        dsec__nft_sbx_add(n->nft, s->idx, s->ifname, &s->a4, n->v6 ? &s->a6 : NULL, e, ne, err) <
            0) {
        dsec_free(e);
        *pol = s->pol;
        memset(&s->pol, 0, sizeof s->pol);
        if (fresh) {
            dsec_err e2;
            dsec__net_link_destroy(s->netns, s->ifname, &e2);
        }
        return -1;
    }
    dsec_free(e);
    if (n->trace)
        dsec_log_info("dsec net: %s slot %u: link %.3f ms, rules %.3f ms", s->id, s->idx,
                      (double)(t1 - t0) / 1e6, (double)(dsec__net_mono_ns() - t1) / 1e6);
    return 0;
}

/* Keep warm_max links ready; sleeps while the pool is full. */
static void *warmer_main(void *arg)
{
    dsec_net *n = arg;
    pthread_mutex_lock(&n->lock);
    while (!n->warm_stop) {
        if (n->nwarm >= n->warm_max) {
            pthread_cond_wait(&n->warm_cv, &n->lock);
            continue;
        }
        uint32_t idx = 0; /* set by reserve; the compiler cannot see it */
        dsec_err err;
        if (reserve(n, &reserved_marker, &idx, &err) < 0) {
            pthread_cond_wait(&n->warm_cv, &n->lock); /* the pool is full: wait for a free */
            continue;
        }
        pthread_mutex_unlock(&n->lock);
        dsec_net_sbx *t = sbx_new(n, "warm", "", idx);
        int rc = -1;
        if (t != NULL) {
            rc = link_fresh(n, t, &err);
            if (rc < 0)
                dsec_log_warn("dsec net: preparing a sandbox network: %s", err.msg);
        }
        sbx_free(t);
        pthread_mutex_lock(&n->lock);
        if (rc == 0) {
            n->warm[n->nwarm++] = idx;
        } else {
            n->sbx[idx] = NULL;
            /* do not spin on a failing kernel: try again in a second */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&n->warm_cv, &n->lock, &ts);
        }
    }
    pthread_mutex_unlock(&n->lock);
    return NULL;
}

/* Stop the warmer and remove the links it made (their slots go free). */
static void warm_drain(dsec_net *n)
{
    if (n->warmer_on) {
        pthread_mutex_lock(&n->lock);
        n->warm_stop = true;
        pthread_cond_broadcast(&n->warm_cv);
        pthread_mutex_unlock(&n->lock);
        pthread_join(n->warmer, NULL);
        n->warmer_on = false;
    }
    for (uint32_t i = 0; i < n->nwarm; i++) {
        dsec_net_sbx *t = sbx_new(n, "warm", "", n->warm[i]);
        dsec_err err;
        if (t != NULL && dsec__net_link_destroy(t->netns, t->ifname, &err) < 0)
            dsec_log_warn("dsec net: removing a prepared sandbox network: %s", err.msg);
        sbx_free(t);
        n->sbx[n->warm[i]] = NULL;
    }
    n->nwarm = 0;
}

int dsec_net_attach(dsec_net *n, const char *id, const char *tenant, const char *const *entries,
                    size_t count, dsec_net_sbx **out, dsec_err *err)
{
    *out = NULL;
    struct policy pol;
    if (dsec__net_parse_policy(n, entries, count, &pol, err) < 0)
        return -1;
    uint32_t idx = 0;
    int rc = 0;
    bool warm = false;
    pthread_mutex_lock(&n->lock);
    if (n->warm_max > 0 && !n->warmer_on && !n->warm_stop) {
        if (pthread_create(&n->warmer, NULL, warmer_main, n) == 0)
            n->warmer_on = true;
        else
            dsec_log_warn("dsec net: no thread to prepare networks ahead: %s", strerror(errno));
    }
    if (n->nwarm > 0) { /* a link made ahead: only the rules are left to do */
        idx = n->warm[--n->nwarm];
        warm = true;
        pthread_cond_signal(&n->warm_cv);
    } else {
        rc = reserve(n, &reserved_marker, &idx, err);
    }
    pthread_mutex_unlock(&n->lock);
    if (rc < 0) {
        dsec__net_policy_clear(&pol);
        return -1;
    }
    dsec_net_sbx *s = sbx_new(n, id, tenant, idx);
    if (!s) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
        goto fail;
    }
    if (sbx_install(n, s, &pol, !warm, err) < 0) {
        if (warm) {
            dsec_err e2;
            dsec__net_link_destroy(s->netns, s->ifname, &e2);
        }
        goto fail;
    }
    slot_settle(n, idx, s);
    *out = s;
    return 0;
fail:
    dsec__net_policy_clear(&pol);
    sbx_free(s);
    slot_settle(n, idx, NULL);
    return dsec_err_wrap(err, "network for %s", id);
}

int dsec_net_adopt(dsec_net *n, const char *id, const char *tenant, const char *state,
                   const char *const *entries, size_t count, dsec_net_sbx **out, dsec_err *err)
{
    *out = NULL;
    unsigned long idx;
    char *end;
    if (!state || strncmp(state, "idx=", 4) != 0 ||
        (errno = 0, idx = strtoul(state + 4, &end, 10), errno || *end) || idx >= n->capacity)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "network of %s: unreadable adoption state \"%s\"", id,
                            state ? state : "");
    struct policy pol;
    if (dsec__net_parse_policy(n, entries, count, &pol, err) < 0)
        return dsec_err_wrap(err, "network of %s", id);
    pthread_mutex_lock(&n->lock);
    bool taken = n->sbx[idx] != NULL;
    if (!taken)
        n->sbx[idx] = &reserved_marker;
    pthread_mutex_unlock(&n->lock);
    if (taken) {
        dsec__net_policy_clear(&pol);
        return dsec_err_set(err, DSEC_E_EXISTS, 0, "network of %s: slot %lu is already held", id,
                            idx);
    }
    dsec_net_sbx *s = sbx_new(n, id, tenant, (uint32_t)idx);
    struct stat st;
    if (!s) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
        goto fail;
    }
    if (dsec__net_link_ifindex(s->ifname) <= 0 || stat(s->netns, &st) < 0) {
        dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "network of %s: %s or %s is gone", id, s->ifname,
                     s->netns);
        goto fail;
    }
    if (sbx_install(n, s, &pol, false, err) < 0)
        goto fail;
    slot_settle(n, (uint32_t)idx, s);
    *out = s;
    return 0;
fail:
    dsec__net_policy_clear(&pol);
    sbx_free(s);
    slot_settle(n, (uint32_t)idx, NULL);
    return -1;
}

static void unregister(dsec_net_sbx *s)
{
    dsec_net *n = s->net;
    pthread_mutex_lock(&n->lock);
    if (n->sbx[s->idx] == s) {
        n->sbx[s->idx] = NULL;
        n->nsbx--;
    }
    pthread_mutex_unlock(&n->lock);
}

int dsec_net_detach(dsec_net_sbx *s, dsec_err *err)
{
    if (!s)
        return 0;
    dsec_net *n = s->net;
    unregister(s);
    int rc = 0;
    if (dsec__nft_sbx_del(n->nft, s->idx, s->ifname, &s->a4, n->v6 ? &s->a6 : NULL, err) < 0)
        rc = -1;
    dsec_err e2;
    if (dsec__net_link_destroy(s->netns, s->ifname, rc < 0 ? &e2 : err) < 0)
        rc = -1;
    sbx_free(s);
    return rc;
}

void dsec_net_release(dsec_net_sbx *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->net->lock);
    s->net->released++;
    pthread_mutex_unlock(&s->net->lock);
    unregister(s);
    sbx_free(s);
}

struct keep_ctx {
    dsec_net_sbx *s;
};

/* Whether the sandbox's current policy (ranges and live pins) lets a flow through. */
static bool keep_flow(void *ud, int family, const uint8_t *dst, uint8_t proto, uint16_t dport)
{
    dsec_net_sbx *s = ((struct keep_ctx *)ud)->s;
    uint64_t now = dsec__net_mono_ns();
    for (size_t i = 0; i < s->pol.n; i++) {
        const struct rule *r = &s->pol.r[i];
        if (!dsec__net_rule_allows(r, proto, dport))
            continue;
        if (!r->domain) {
            if (r->family == family && dsec__net_in_range(family, dst, r->addr, r->prefix))
                return true;
            continue;
        }
        for (size_t j = 0; j < s->npins; j++) {
            const struct pin *p = &s->pins[j];
            if (p->expires_ns > now && p->family == family &&
                memcmp(p->addr, dst, family == AF_INET ? 4 : 16) == 0 &&
                dsec__net_name_matches(r, p->name))
                return true;
        }
    }
    return false;
}

int dsec_net_rename(dsec_net_sbx *s, const char *id, const char *tenant, dsec_err *err)
{
    char *nid = dsec_strdup(id), *nt = dsec_strdup(tenant ? tenant : "");
    if (nid == NULL || nt == NULL) {
        dsec_free(nid);
        dsec_free(nt);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "network of %s: out of memory", id);
    }
    /* other threads read them (alerts, pins) only under n->lock */
    pthread_mutex_lock(&s->net->lock);
    char *oid = s->id, *ot = s->tenant;
    s->id = nid;
    s->tenant = nt;
    pthread_mutex_unlock(&s->net->lock);
    dsec_free(oid);
    dsec_free(ot);
    return 0;
}

int dsec_net_set(dsec_net_sbx *s, const char *const *entries, size_t count, dsec_err *err)
{
    dsec_net *n = s->net;
    struct policy pol;
    if (dsec__net_parse_policy(n, entries, count, &pol, err) < 0)
        return -1;
    pthread_mutex_lock(&n->lock);
    struct policy old = s->pol;
    s->pol = pol;
    dsec__nft_elem *e = NULL;
    size_t ne = 0;
    int rc = dsec__net_sbx_elems(s, &e, &ne, err);
    if (rc == 0)
        rc = dsec__nft_sbx_replace(n->nft, s->idx, e, ne, err);
    dsec_free(e);
    if (rc < 0) {
        s->pol = old;
        pthread_mutex_unlock(&n->lock);
        dsec__net_policy_clear(&pol);
        return dsec_err_wrap(err, "network policy of %s", s->id);
    }
    dsec__net_policy_clear(&old);
    /* flows the new policy does not allow are cut now, not when they end */
    struct keep_ctx kc = {s};
    rc = dsec__nft_ct_cut(AF_INET, (const uint8_t *)&s->a4, keep_flow, &kc, err);
    if (rc == 0 && n->v6)
        rc = dsec__nft_ct_cut(AF_INET6, s->a6.s6_addr, keep_flow, &kc, err);
    pthread_mutex_unlock(&n->lock);
    return rc < 0 ? dsec_err_wrap(err, "cutting connections of %s", s->id) : 0;
}

int dsec_net_sweep(dsec_net *n, dsec_err *err)
{
    char **names = NULL;
    size_t nn = 0;
    int removed = 0;
    if (dsec__net_link_list(n->prefix, &names, &nn, err) < 0)
        return -1;
    for (size_t i = 0; i < nn; i++) {
        char *end;
        unsigned long idx = strtoul(names[i] + strlen(n->prefix), &end, 16);
        pthread_mutex_lock(&n->lock);
        bool held = !*end && idx < n->capacity && n->sbx[idx];
        pthread_mutex_unlock(&n->lock);
        if (held)
            continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/netns/%s", n->state_dir, names[i]);
        dsec_err e2;
        if (dsec__net_link_destroy(path, names[i], &e2) == 0)
            removed++;
    }
    dsec__net_strv_free(names, nn);
    pthread_mutex_lock(&n->lock);
    n->swept = true; /* adoption is over: what no sandbox holds from here on is a leftover */
    pthread_mutex_unlock(&n->lock);
    /* namespace files without a veth */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/netns", n->state_dir);
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (strncmp(de->d_name, n->prefix, strlen(n->prefix)) != 0)
            continue;
        char *end;
        unsigned long idx = strtoul(de->d_name + strlen(n->prefix), &end, 16);
        pthread_mutex_lock(&n->lock);
        bool held = !*end && idx < n->capacity && n->sbx[idx];
        pthread_mutex_unlock(&n->lock);
        if (held)
            continue;
        char path[PATH_MAX + 256];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        dsec_err e2;
        if (dsec__net_link_destroy(path, NULL, &e2) == 0)
            removed++;
    }
    if (d)
        closedir(d);
    return removed;
}

#define GUEST_TAP "tap0"

static void mac_str(const uint8_t m[6], char out[18])
{
    snprintf(out, 18, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
}

int dsec_net_guest_link(dsec_net_sbx *s, dsec_net_guest *out, dsec_err *err)
{
    if (out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "net: guest link: no output given");
    memset(out, 0, sizeof *out);
    out->tap_fd = -1;
    if (s == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "net: guest link: no sandbox network given");
    dsec_net *n = s->net;
    if (dsec__net_link_guest(s->netns, GUEST_TAP, &out->tap_fd, err) < 0)
        return dsec_err_wrap(err, "network of %s: the VM's tap", s->id);
    /* The guest is the sandbox on the wire: eth0's MAC (the host's
     * permanent neighbour entry for the sandbox's address names it), the
     * sandbox's address, the host side's MAC for the gateway. */
    uint8_t host_mac[6], peer_mac[6];
    dsec__net_link_macs(&s->a4, host_mac, peer_mac);
    snprintf(out->tap, sizeof out->tap, "%s", GUEST_TAP);
    mac_str(peer_mac, out->mac);
    mac_str(host_mac, out->gw_mac);
    snprintf(out->addr4, sizeof out->addr4, "%s/32", s->addr_str);
    snprintf(out->gw4, sizeof out->gw4, "%s", n->gw4_str);
    snprintf(out->dns4, sizeof out->dns4, "%s", n->gw4_str);
    if (n->v6) {
        char a[40]; /* the longest an address of a pool prints as (eight groups) */
        inet_ntop(AF_INET6, &s->a6, a, sizeof a);
        snprintf(out->addr6, sizeof out->addr6, "%s/128", a);
        inet_ntop(AF_INET6, &n->gw6, out->gw6, sizeof out->gw6);
    }
    return 0;
}

const char *dsec_net_sbx_netns(const dsec_net_sbx *s)
{
    return s->netns;
}
const char *dsec_net_sbx_resolver(const dsec_net_sbx *s)
{
    return s->net->gw4_str;
}
const char *dsec_net_sbx_addr(const dsec_net_sbx *s)
{
    return s->addr_str;
}
const char *dsec_net_sbx_state(const dsec_net_sbx *s)
{
    return s->state;
}

void dsec_net_stats_get(dsec_net *n, dsec_net_stats *o)
{
    memset(o, 0, sizeof *o);
    dsec__dns_stats ds = {0};
    if (n->dns)
        dsec__dns_stats_get(n->dns, &ds);
    o->dns_queries = ds.queries;
    o->dns_answered = ds.answered;
    o->dns_refused = ds.refused;
    o->dns_dropped = ds.dropped;
    o->dns_cache_hits = ds.cache_hits;
    o->dns_cache_misses = ds.cache_misses;
    o->dns_cache_evictions = ds.cache_evictions;
    o->dns_upstream_tcp = ds.upstream_tcp;
    pthread_mutex_lock(&n->lock);
    o->sandboxes = n->nsbx;
    pthread_mutex_unlock(&n->lock);
    pthread_mutex_lock(&n->alock);
    o->blocked = n->blocked;
    o->alerts = n->alerts;
    o->alerts_suppressed = n->suppressed;
    pthread_mutex_unlock(&n->alock);
}
