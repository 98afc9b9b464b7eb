/* net.c - a node's network containment: policies, address pool, attach/detach, DNS policy, alerts. */
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
#include "net-int.h"

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
    bool gw_made; /* the gateway's addresses are on lo */
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
    } *mirrors;
    size_t nmirrors;

    dsec__nft *nft;
    dsec__dns *dns;

    pthread_mutex_t lock; /* sandboxes, policies, pins */
    dsec_net_sbx **sbx;   /* by idx, capacity slots */
    uint32_t next;        /* allocation hint */
    uint64_t nsbx;
    uint64_t released;    /* handles forgotten with their network left in place (restart) */

    pthread_mutex_t alock; /* alerts */
    struct agg agg[AGG_SLOTS];
    struct agg batch[AGG_SLOTS]; /* the flusher's copy of a window */
    uint64_t agg_dropped; /* no slot left this window */
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

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- policy entries ---------------------------------------------------------------------- */

static void policy_clear(struct policy *p)
{
    for (size_t i = 0; i < p->n; i++)
        dsec_free(p->r[i].domain);
    dsec_free(p->r);
    p->r = NULL;
    p->n = 0;
}

static int push_rule(struct policy *p, const struct rule *r, dsec_err *err)
{
    struct rule *nr = dsec_realloc(p->r, (p->n + 1) * sizeof *nr);
    if (!nr)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory for a policy");
    p->r = nr;
    p->r[p->n++] = *r;
    return 0;
}

static bool valid_label_char(char c)
{
    return isalnum((unsigned char)c) || c == '-' || c == '_';
}

/* A domain: labels of [A-Za-z0-9_-], 1..63 each, at least two labels, <= 253. */
static bool domain_ok(const char *d)
{
    size_t n = strlen(d), lab = 0, labels = 1;
    if (n == 0 || n > 253 || d[0] == '.' || d[n - 1] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        if (d[i] == '.') {
            if (lab == 0)
                return false;
            lab = 0;
            labels++;
        } else if (!valid_label_char(d[i]) || ++lab > 63) {
            return false;
        }
    }
    return labels >= 2;
}

static bool mirror_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!valid_label_char(s[i]))
            return false;
    return true;
}

/* "443", "8000-8100" */
static int parse_ports(const char *s, uint16_t *lo, uint16_t *hi)
{
    char *end;
    errno = 0;
    unsigned long a = strtoul(s, &end, 10), b;
    if (errno || end == s || a > 65535 || !isdigit((unsigned char)*s))
        return -1;
    if (*end == '-') {
        const char *t = end + 1;
        if (!isdigit((unsigned char)*t))
            return -1;
        b = strtoul(t, &end, 10);
        if (errno || b > 65535 || b < a)
            return -1;
    } else {
        b = a;
    }
    if (*end)
        return -1;
    *lo = (uint16_t)a;
    *hi = (uint16_t)b;
    return 0;
}

static int parse_cidr(const char *s, int family, uint8_t *addr, uint8_t *prefix)
{
    char buf[64];
    const char *slash = strchr(s, '/');
    size_t alen = slash ? (size_t)(slash - s) : strlen(s);
    if (alen == 0 || alen >= sizeof buf)
        return -1;
    memcpy(buf, s, alen);
    buf[alen] = 0;
    if (inet_pton(family, buf, addr) != 1)
        return -1;
    unsigned max = family == AF_INET ? 32 : 128;
    unsigned len = max;
    if (slash) {
        char *end;
        if (!isdigit((unsigned char)slash[1]))
            return -1;
        errno = 0;
        unsigned long l = strtoul(slash + 1, &end, 10);
        if (errno || *end || l > max)
            return -1;
        len = (unsigned)l;
    }
    /* the network address: host bits cleared, so a range means what it says */
    size_t nb = max / 8;
    for (size_t i = 0; i < nb; i++) {
        unsigned bit0 = (unsigned)i * 8;
        if (bit0 >= len)
            addr[i] = 0;
        else if (bit0 + 8 > len)
            addr[i] &= (uint8_t)(0xff << (8 - (len - bit0)));
    }
    *prefix = (uint8_t)len;
    return 0;
}

static int bad_entry(dsec_err *err, const char *e, const char *why)
{
    return dsec_err_set(err, DSEC_E_INVALID, 0, "network policy entry \"%.80s\": %s", e, why);
}

/* Parse one entry into p; a mirror name expands into the mirror's entries. */
static int parse_entry(const dsec_net *n, const char *e, struct policy *p, dsec_err *err)
{
    size_t len = strlen(e);
    if (len == 0)
        return bad_entry(err, e, "empty");
    if (len > NET_ENTRY_LEN_MAX)
        return bad_entry(err, e, "longer than 255 bytes");

    if (mirror_name_ok(e) && !strchr(e, '.')) {
        if (!n)
            return 0; /* checked without a node: the name is well formed */
        for (size_t i = 0; i < n->nmirrors; i++) {
            if (strcmp(n->mirrors[i].name, e) == 0) {
                for (size_t j = 0; j < n->mirrors[i].pol.n; j++) {
                    struct rule r = n->mirrors[i].pol.r[j];
                    if (r.domain && !(r.domain = dsec_strdup(r.domain)))
                        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
                    if (push_rule(p, &r, err) < 0) {
                        dsec_free(r.domain);
                        return -1;
                    }
                }
                return 0;
            }
        }
        char names[256] = "";
        size_t off = 0;
        for (size_t i = 0; i < n->nmirrors && off < sizeof names - 1; i++)
            off += (size_t)snprintf(names + off, sizeof names - off, "%s%s", i ? ", " : "",
                                    n->mirrors[i].name);
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "network policy entry \"%s\": no mirror of that name in the cell "
                            "configuration (mirrors: %s)",
                            e, n->nmirrors ? names : "none");
    }

    struct rule r = {.protos = P_TCP | P_UDP, .port_lo = 0, .port_hi = 65535};
    char buf[NET_ENTRY_LEN_MAX + 1];
    memcpy(buf, e, len + 1);

    /* trailing "/tcp" | "/udp" | "/icmp" | "/any" */
    char *proto = strrchr(buf, '/');
    if (proto && isalpha((unsigned char)proto[1])) {
        *proto++ = 0;
        if (strcmp(proto, "tcp") == 0)
            r.protos = P_TCP;
        else if (strcmp(proto, "udp") == 0)
            r.protos = P_UDP;
        else if (strcmp(proto, "icmp") == 0)
            r.protos = P_ICMP;
        else if (strcmp(proto, "any") == 0)
            r.protos = P_TCP | P_UDP | P_ICMP;
        else
            return bad_entry(err, e, "unknown protocol (tcp, udp, icmp or any)");
    }

    char *target = buf, *ports = NULL;
    if (buf[0] == '[') { /* [v6 range] with optional :ports */
        char *close = strchr(buf, ']');
        if (!close)
            return bad_entry(err, e, "missing ']' after an IPv6 range");
        *close = 0;
        target = buf + 1;
        if (close[1] == ':')
            ports = close + 2;
        else if (close[1])
            return bad_entry(err, e, "expected ':PORTS' after ']'");
        r.family = AF_INET6;
    } else if (strchr(buf, ':') != strrchr(buf, ':')) { /* bare IPv6, no ports */
        r.family = AF_INET6;
    } else {
        char *colon = strchr(buf, ':');
        if (colon) {
            *colon = 0;
            ports = colon + 1;
        }
    }
    if (ports && parse_ports(ports, &r.port_lo, &r.port_hi) < 0)
        return bad_entry(err, e, "bad port or port range (N or N-M, 0..65535)");
    if (ports && r.protos == P_ICMP)
        return bad_entry(err, e, "icmp takes no ports");

    if (r.family == AF_INET6) {
        if (parse_cidr(target, AF_INET6, r.addr, &r.prefix) < 0)
            return bad_entry(err, e, "not an IPv6 address or range");
    } else if (isdigit((unsigned char)target[0]) &&
               strspn(target, "0123456789./") == strlen(target)) {
        r.family = AF_INET;
        if (parse_cidr(target, AF_INET, r.addr, &r.prefix) < 0)
            return bad_entry(err, e, "not an IPv4 address or range (a.b.c.d or a.b.c.d/len)");
    } else {
        if (strncmp(target, "*.", 2) == 0) {
            r.wildcard = true;
            target += 2;
        }
        for (char *c = target; *c; c++)
            *c = (char)tolower((unsigned char)*c);
        if (!domain_ok(target))
            return bad_entry(err, e,
                             "not a mirror name, domain (example.com, *.example.com) or "
                             "address range");
        if (!(r.domain = dsec_strdup(target)))
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
    }
    if (push_rule(p, &r, err) < 0) {
        dsec_free(r.domain);
        return -1;
    }
    return 0;
}

static int parse_policy(const dsec_net *n, const char *const *entries, size_t count,
                        struct policy *p, dsec_err *err)
{
    memset(p, 0, sizeof *p);
    if (count > NET_ENTRIES_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "network policy has %zu entries; at most %d are allowed", count,
                            NET_ENTRIES_MAX);
    for (size_t i = 0; i < count; i++) {
        if (!entries[i] || parse_entry(n, entries[i], p, err) < 0) {
            if (!entries[i])
                dsec_err_set(err, DSEC_E_INVALID, 0, "network policy entry %zu is missing", i);
            policy_clear(p);
            return -1;
        }
    }
    return 0;
}

int dsec_net_policy_check(const dsec_net *n, const char *const *entries, size_t count,
                          dsec_err *err)
{
    struct policy p;
    if (parse_policy(n, entries, count, &p, err) < 0)
        return -1;
    policy_clear(&p);
    return 0;
}

static bool name_matches(const struct rule *r, const char *name)
{
    if (!r->domain)
        return false;
    if (!r->wildcard)
        return strcmp(name, r->domain) == 0;
    size_t nl = strlen(name), dl = strlen(r->domain);
    return nl > dl + 1 && name[nl - dl - 1] == '.' && strcmp(name + nl - dl, r->domain) == 0;
}

static bool in_range(int family, const uint8_t *a, const uint8_t *net, uint8_t prefix)
{
    (void)family;
    size_t full = prefix / 8;
    if (memcmp(a, net, full) != 0)
        return false;
    unsigned rest = prefix % 8;
    if (rest == 0)
        return true;
    uint8_t mask = (uint8_t)(0xff << (8 - rest));
    return (a[full] & mask) == (net[full] & mask);
}

static bool rule_allows(const struct rule *r, uint8_t proto, uint16_t port)
{
    if (proto == IPPROTO_TCP)
        return (r->protos & P_TCP) && port >= r->port_lo && port <= r->port_hi;
    if (proto == IPPROTO_UDP)
        return (r->protos & P_UDP) && port >= r->port_lo && port <= r->port_hi;
    if (proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6)
        return r->protos & P_ICMP;
    return false;
}

/* The nft elements of one rule for a destination (the rule's range, or one
 * pinned address); returns how many were written (at most 3). */
static size_t rule_elems(const struct rule *r, int family, const uint8_t *addr, uint8_t prefix,
                         uint32_t timeout_ms, dsec__nft_elem *out)
{
    size_t k = 0;
    static const struct {
        unsigned bit;
        uint8_t p4, p6;
    } pr[] = {{P_TCP, IPPROTO_TCP, IPPROTO_TCP},
              {P_UDP, IPPROTO_UDP, IPPROTO_UDP},
              {P_ICMP, IPPROTO_ICMP, IPPROTO_ICMPV6}};
    for (size_t i = 0; i < 3; i++) {
        if (!(r->protos & pr[i].bit))
            continue;
        dsec__nft_elem *e = &out[k++];
        memset(e, 0, sizeof *e);
        e->family = family;
        memcpy(e->addr, addr, family == AF_INET ? 4 : 16);
        e->prefix = prefix;
        e->proto = family == AF_INET ? pr[i].p4 : pr[i].p6;
        e->port_lo = r->port_lo;
        e->port_hi = r->port_hi;
        e->timeout_ms = timeout_ms;
    }
    return k;
}

/* Elements for a sandbox's static rules and its live pins (under lock). *out dsec_malloc'd. */
static int sbx_elems(dsec_net_sbx *s, dsec__nft_elem **out, size_t *nout, dsec_err *err)
{
    size_t cap = 3 * (s->pol.n + s->npins * s->pol.n) + 1, k = 0;
    dsec__nft_elem *e = dsec_calloc(cap, sizeof *e);
    if (!e)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory for a policy");
    uint64_t now = mono_ns();
    for (size_t i = 0; i < s->pol.n; i++) {
        const struct rule *r = &s->pol.r[i];
        if (r->domain)
            continue;
        if (r->family == AF_INET6 && !s->net->v6)
            continue;
        k += rule_elems(r, r->family, r->addr, r->prefix, 0, e + k);
    }
    for (size_t j = 0; j < s->npins; j++) {
        const struct pin *pn = &s->pins[j];
        if (pn->expires_ns <= now)
            continue;
        uint32_t left = (uint32_t)((pn->expires_ns - now) / 1000000u) + 1;
        for (size_t i = 0; i < s->pol.n; i++)
            if (name_matches(&s->pol.r[i], pn->name))
                k += rule_elems(&s->pol.r[i], pn->family, pn->addr,
                                pn->family == AF_INET ? 32 : 128, left, e + k);
    }
    *out = e;
    *nout = k;
    return 0;
}

/* ---- alerts ------------------------------------------------------------------------------- */

static uint64_t fnv(const char *s, uint64_t h)
{
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211u;
    return h;
}

/* Count one event (any thread). Copies what the flush needs, so the sandbox
 * may be gone by then. */
static void alert_note(dsec_net *n, const dsec_net_sbx *s, const char *kind, const char *dest,
                       const char *detail)
{
    uint64_t h = fnv(kind, fnv(dest, fnv(detail, 1469598103934665603u ^ s->idx)));
    uint64_t now = wall_ns();
    pthread_mutex_lock(&n->alock);
    for (size_t probe = 0; probe < 8; probe++) {
        struct agg *a = &n->agg[(h + probe) % AGG_SLOTS];
        if (a->used && a->idx == s->idx && strcmp(a->kind, kind) == 0 &&
            strcmp(a->dest, dest) == 0 && strcmp(a->detail, detail) == 0 &&
            strcmp(a->sandbox, s->id) == 0) {
            a->count++;
            a->last_ns = now;
            goto out;
        }
        if (!a->used) {
            memset(a, 0, sizeof *a);
            a->used = true;
            a->idx = s->idx;
            snprintf(a->sandbox, sizeof a->sandbox, "%s", s->id);
            snprintf(a->tenant, sizeof a->tenant, "%s", s->tenant ? s->tenant : "");
            snprintf(a->kind, sizeof a->kind, "%s", kind);
            snprintf(a->dest, sizeof a->dest, "%s", dest);
            snprintf(a->detail, sizeof a->detail, "%s", detail);
            a->count = 1;
            a->first_ns = a->last_ns = now;
            goto out;
        }
    }
    n->agg_dropped++;
out:
    pthread_mutex_unlock(&n->alock);
}

/* Emit a window's alerts: at most alerts_per_window per sandbox, the rest
 * summed into one "suppressed" alert per sandbox. */
static void alert_flush(dsec_net *n)
{
    struct agg *batch = n->batch;
    size_t nb = 0;
    uint64_t lost;
    pthread_mutex_lock(&n->alock);
    for (size_t i = 0; i < AGG_SLOTS; i++) {
        if (n->agg[i].used) {
            batch[nb++] = n->agg[i];
            n->agg[i].used = false;
        }
    }
    lost = n->agg_dropped;
    n->agg_dropped = 0;
    pthread_mutex_unlock(&n->alock);

    uint32_t per = n->conf.alerts_per_window;
    for (size_t i = 0; i < nb; i++) {
        if (!batch[i].used)
            continue;
        uint32_t emitted = 0;
        uint64_t supp = 0, supp_first = 0, supp_last = 0;
        for (size_t j = i; j < nb; j++) {
            struct agg *a = &batch[j];
            if (!a->used || a->idx != batch[i].idx || strcmp(a->sandbox, batch[i].sandbox) != 0)
                continue;
            if (emitted < per) {
                dsec_net_alert al = {a->sandbox, a->tenant, a->kind,   a->dest,
                                     a->detail,  a->count,  a->first_ns, a->last_ns};
                if (n->conf.on_alert)
                    n->conf.on_alert(n->conf.alert_arg, &al);
                emitted++;
            } else {
                supp += a->count;
                if (!supp_first || a->first_ns < supp_first)
                    supp_first = a->first_ns;
                if (a->last_ns > supp_last)
                    supp_last = a->last_ns;
            }
            if (j != i)
                a->used = false;
        }
        if (supp) {
            dsec_net_alert al = {batch[i].sandbox, batch[i].tenant, "suppressed", "", "",
                                 supp, supp_first, supp_last};
            if (n->conf.on_alert)
                n->conf.on_alert(n->conf.alert_arg, &al);
        }
        batch[i].used = false;
        pthread_mutex_lock(&n->alock);
        n->alerts += emitted + (supp ? 1 : 0);
        n->suppressed += supp;
        pthread_mutex_unlock(&n->alock);
    }
    if (lost) {
        pthread_mutex_lock(&n->alock);
        n->suppressed += lost;
        pthread_mutex_unlock(&n->alock);
    }
}

static void *flusher_main(void *arg)
{
    dsec_net *n = arg;
    pthread_mutex_lock(&n->alock);
    while (!n->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)n->conf.alert_window_ms * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&n->stop_cv, &n->alock, &ts);
        pthread_mutex_unlock(&n->alock);
        alert_flush(n);
        pthread_mutex_lock(&n->alock);
    }
    pthread_mutex_unlock(&n->alock);
    alert_flush(n); /* what the last window held */
    return NULL;
}

/* ---- addresses and lookups ---------------------------------------------------------------- */

/* A placeholder holding a slot while its sandbox is set up: lookups skip it. */
static dsec_net_sbx reserved_marker;

/* The sandbox in slot i (under lock), or NULL. */
static dsec_net_sbx *slot_get(const dsec_net *n, uint64_t i)
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
static dsec_net_sbx *sbx_by_addr(dsec_net *n, const struct sockaddr *sa)
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
    return slot_get(n, off);
}

/* ---- resolver and log callbacks ----------------------------------------------------------- */

static bool dns_allowed(void *ud, const struct sockaddr *client, const char *name)
{
    dsec_net *n = ud;
    bool ok = false;
    pthread_mutex_lock(&n->lock);
    dsec_net_sbx *s = sbx_by_addr(n, client);
    for (size_t i = 0; s && i < s->pol.n && !ok; i++)
        ok = name_matches(&s->pol.r[i], name);
    pthread_mutex_unlock(&n->lock);
    return ok;
}

static void dns_pin(void *ud, const struct sockaddr *client, const char *qname, int family,
                    const uint8_t *addr, uint32_t ttl)
{
    dsec_net *n = ud;
    if (family == AF_INET6 && !n->v6)
        return;
    pthread_mutex_lock(&n->lock);
    dsec_net_sbx *s = sbx_by_addr(n, client);
    if (!s)
        goto out;
    uint64_t now = mono_ns();
    /* remember it (for policy changes), replacing an expired or equal pin */
    struct pin *slot = NULL;
    for (size_t i = 0; i < s->npins && !slot; i++)
        if (s->pins[i].expires_ns <= now ||
            (s->pins[i].family == family &&
             memcmp(s->pins[i].addr, addr, family == AF_INET ? 4 : 16) == 0 &&
             strcmp(s->pins[i].name, qname) == 0))
            slot = &s->pins[i];
    if (!slot && s->npins < NET_PINS_MAX) {
        struct pin *np = dsec_realloc(s->pins, (s->npins + 1) * sizeof *np);
        if (np) {
            s->pins = np;
            slot = &s->pins[s->npins++];
        }
    }
    if (slot) {
        snprintf(slot->name, sizeof slot->name, "%s", qname);
        slot->family = family;
        memset(slot->addr, 0, sizeof slot->addr);
        memcpy(slot->addr, addr, family == AF_INET ? 4 : 16);
        slot->expires_ns = now + (uint64_t)ttl * 1000000000u;
    }
    dsec__nft_elem e[3 * NET_ENTRIES_MAX];
    size_t k = 0;
    for (size_t i = 0; i < s->pol.n && k + 3 <= sizeof e / sizeof e[0]; i++)
        if (name_matches(&s->pol.r[i], qname))
            k += rule_elems(&s->pol.r[i], family, addr, family == AF_INET ? 32 : 128,
                            ttl * 1000u, e + k);
    dsec_err err;
    if (k && dsec__nft_sbx_pin(n->nft, s->idx, e, k, &err) < 0)
        fprintf(stderr, "dsec net: pinning an address for %s: %s\n", s->id, err.msg);
out:
    pthread_mutex_unlock(&n->lock);
}

static const char *qtype_name(uint16_t t, char *buf, size_t len)
{
    static const struct {
        uint16_t t;
        const char *n;
    } names[] = {{1, "A"},    {2, "NS"},     {5, "CNAME"}, {6, "SOA"},   {12, "PTR"},
                 {15, "MX"},  {16, "TXT"},   {28, "AAAA"}, {33, "SRV"},  {35, "NAPTR"},
                 {43, "DS"},  {48, "DNSKEY"}, {64, "SVCB"}, {65, "HTTPS"}, {252, "AXFR"},
                 {255, "ANY"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].t == t)
            return names[i].n;
    snprintf(buf, len, "TYPE%u", t);
    return buf;
}

static void dns_refused(void *ud, const struct sockaddr *client, const char *qname,
                        uint16_t qtype, const char *why)
{
    dsec_net *n = ud;
    char kind[16], tb[16];
    snprintf(kind, sizeof kind, "dns_%s", why);
    pthread_mutex_lock(&n->lock);
    dsec_net_sbx *s = sbx_by_addr(n, client);
    if (s)
        alert_note(n, s, kind, qname, qtype_name(qtype, tb, sizeof tb));
    pthread_mutex_unlock(&n->lock);
}

static void on_block(void *ud, const dsec__nft_block *b)
{
    dsec_net *n = ud;
    char dest[INET6_ADDRSTRLEN], detail[24];
    inet_ntop(b->family, b->dst, dest, sizeof dest);
    if (b->proto == IPPROTO_TCP)
        snprintf(detail, sizeof detail, "tcp/%u", b->dport);
    else if (b->proto == IPPROTO_UDP)
        snprintf(detail, sizeof detail, "udp/%u", b->dport);
    else if (b->proto == IPPROTO_ICMP || b->proto == IPPROTO_ICMPV6)
        snprintf(detail, sizeof detail, "icmp");
    else
        snprintf(detail, sizeof detail, "proto/%u", b->proto);
    pthread_mutex_lock(&n->alock);
    n->blocked++;
    pthread_mutex_unlock(&n->alock);
    pthread_mutex_lock(&n->lock);
    dsec_net_sbx *s = slot_get(n, b->idx);
    if (s)
        alert_note(n, s, "blocked", dest, detail);
    pthread_mutex_unlock(&n->lock);
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
        if (parse_cidr(c->pool4, AF_INET, a, &n->len4) < 0 || n->len4 > 28)
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
            if (parse_cidr(c->pool6, AF_INET6, a, &n->len6) < 0 || n->len6 > 112 ||
                n->len6 < 64)
                return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                    "net pool6 \"%s\": expected an IPv6 range /64../112",
                                    c->pool6);
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
    if (!(n->state_dir = dsec_strdup(c->state_dir))) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
        goto fail;
    }
    n->conf.state_dir = n->state_dir;
    if (setup_pools(n, c, err) < 0)
        goto fail;
    if (!(n->sbx = dsec_calloc(n->capacity, sizeof *n->sbx))) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory for %u sandbox slots",
                     n->capacity);
        goto fail;
    }

    /* mirrors: parsed once; a mirror's targets may not name other mirrors */
    if (c->nmirrors && !(n->mirrors = dsec_calloc(c->nmirrors, sizeof *n->mirrors))) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < c->nmirrors; i++) {
        if (!c->mirrors[i].name || !mirror_name_ok(c->mirrors[i].name)) {
            dsec_err_set(err, DSEC_E_CONFIG, 0,
                         "net mirror \"%s\": a mirror name is 1..64 of [A-Za-z0-9_-]",
                         c->mirrors[i].name ? c->mirrors[i].name : "");
            goto fail;
        }
        n->mirrors[i].name = dsec_strdup(c->mirrors[i].name);
        n->nmirrors = i + 1;
        for (size_t j = 0; j < c->mirrors[i].ntargets; j++) {
            const char *t = c->mirrors[i].targets[j];
            if (!t || (mirror_name_ok(t) && !strchr(t, '.'))) {
                dsec_err_set(err, DSEC_E_CONFIG, 0,
                             "net mirror \"%s\": target \"%s\" must be a domain or address "
                             "range with ports",
                             c->mirrors[i].name, t ? t : "");
                goto fail;
            }
            if (parse_entry(NULL, t, &n->mirrors[i].pol, err) < 0) {
                dsec_err_wrap(err, "net mirror \"%s\"", c->mirrors[i].name);
                err->code = DSEC_E_CONFIG;
                goto fail;
            }
        }
    }

    if (dsec__net_link_host_prepare(n->v6, err) < 0 ||
        dsec__net_link_gateway(&n->gw4, n->v6 ? &n->gw6 : NULL, err) < 0)
        goto fail;
    n->gw_made = true;
    char netns_dir[PATH_MAX];
    snprintf(netns_dir, sizeof netns_dir, "%s/netns", n->state_dir);
    if (mkdir(netns_dir, 0700) < 0 && errno != EEXIST) {
        dsec_err_set(err, DSEC_E_IO, errno, "creating %s", netns_dir);
        goto fail;
    }

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
        goto fail;
    if (dsec__nft_log_start(n->nft, on_block, n, err) < 0)
        goto fail;

    dsec__dns_conf dc = {.allowed = dns_allowed, .pin = dns_pin, .refused = dns_refused, .ud = n};
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
        if (parse_hostport(c->upstream[i], 53, &dc.upstream[dc.nupstream]) < 0) {
            dsec_err_set(err, DSEC_E_CONFIG, 0,
                         "net upstream \"%s\": expected ip, ip:port or [ip6]:port",
                         c->upstream[i]);
            goto fail;
        }
        dc.nupstream++;
    }
    if (!dc.nupstream)
        dc.nupstream = host_resolvers(dc.upstream, 4);
    dc.client_qps = n->conf.dns_qps;
    dc.cache_entries = n->conf.dns_cache;
    if (dsec__dns_new(&n->dns, &dc, err) < 0)
        goto fail;

    if (pthread_create(&n->flusher, NULL, flusher_main, n) != 0) {
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
        dsec_net_sbx *s = slot_get(n, i);
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
            fprintf(stderr, "dsec net: %s\n", e2.msg);
    }
    for (size_t i = 0; i < n->nmirrors; i++) {
        dsec_free(n->mirrors[i].name);
        policy_clear(&n->mirrors[i].pol);
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
    policy_clear(&s->pol);
    dsec_free(s->pins);
    dsec_free(s->id);
    dsec_free(s->tenant);
    dsec_free(s);
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
    snprintf(s->ifname, sizeof s->ifname, "%s%06x", n->prefix, idx);
    idx_addrs(n, idx, &s->a4, &s->a6);
    inet_ntop(AF_INET, &s->a4, s->addr_str, sizeof s->addr_str);
    snprintf(s->netns, sizeof s->netns, "%s/netns/%s%06x", n->state_dir, n->prefix, idx);
    snprintf(s->state, sizeof s->state, "idx=%u", idx);
    return s;
}

/* Reserve a free slot (under lock): the slot holds s from now on. */
static int reserve(dsec_net *n, dsec_net_sbx *s_proto, uint32_t *idx, dsec_err *err)
{
    for (uint32_t k = 0; k < n->capacity; k++) {
        uint32_t i = (n->next + k) % n->capacity;
        if (!n->sbx[i]) {
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

static int sbx_install(dsec_net *n, dsec_net_sbx *s, struct policy *pol, bool fresh,
                       dsec_err *err)
{
    uint64_t t0 = mono_ns(), t1 = t0;
    if (fresh) {
        if (link_fresh(n, s, err) < 0)
            return -1;
        t1 = mono_ns();
    }
    s->pol = *pol;
    memset(pol, 0, sizeof *pol);
    dsec__nft_elem *e = NULL;
    size_t ne = 0;
    if (sbx_elems(s, &e, &ne, err) < 0 ||
        dsec__nft_sbx_add(n->nft, s->idx, s->ifname, &s->a4, n->v6 ? &s->a6 : NULL, e, ne,
                          err) < 0) {
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
        fprintf(stderr, "dsec net: %s slot %u: link %.3f ms, rules %.3f ms\n", s->id, s->idx,
                (double)(t1 - t0) / 1e6, (double)(mono_ns() - t1) / 1e6);
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
                fprintf(stderr, "dsec net: preparing a sandbox network: %s\n", err.msg);
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
            fprintf(stderr, "dsec net: removing a prepared sandbox network: %s\n", err.msg);
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
    if (parse_policy(n, entries, count, &pol, err) < 0)
        return -1;
    uint32_t idx = 0;
    int rc = 0;
    bool warm = false;
    pthread_mutex_lock(&n->lock);
    if (n->warm_max > 0 && !n->warmer_on && !n->warm_stop) {
        if (pthread_create(&n->warmer, NULL, warmer_main, n) == 0)
            n->warmer_on = true;
        else
            fprintf(stderr, "dsec net: no thread to prepare networks ahead: %s\n",
                    strerror(errno));
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
        policy_clear(&pol);
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
    policy_clear(&pol);
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
    if (parse_policy(n, entries, count, &pol, err) < 0)
        return dsec_err_wrap(err, "network of %s", id);
    pthread_mutex_lock(&n->lock);
    bool taken = n->sbx[idx] != NULL;
    if (!taken)
        n->sbx[idx] = &reserved_marker;
    pthread_mutex_unlock(&n->lock);
    if (taken) {
        policy_clear(&pol);
        return dsec_err_set(err, DSEC_E_EXISTS, 0, "network of %s: slot %lu is already held",
                            id, idx);
    }
    dsec_net_sbx *s = sbx_new(n, id, tenant, (uint32_t)idx);
    struct stat st;
    if (!s) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory");
        goto fail;
    }
    if (dsec__net_link_ifindex(s->ifname) <= 0 || stat(s->netns, &st) < 0) {
        dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "network of %s: %s or %s is gone", id,
                     s->ifname, s->netns);
        goto fail;
    }
    if (sbx_install(n, s, &pol, false, err) < 0)
        goto fail;
    slot_settle(n, (uint32_t)idx, s);
    *out = s;
    return 0;
fail:
    policy_clear(&pol);
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
    uint64_t now = mono_ns();
    for (size_t i = 0; i < s->pol.n; i++) {
        const struct rule *r = &s->pol.r[i];
        if (!rule_allows(r, proto, dport))
            continue;
        if (!r->domain) {
            if (r->family == family && in_range(family, dst, r->addr, r->prefix))
                return true;
            continue;
        }
        for (size_t j = 0; j < s->npins; j++) {
            const struct pin *p = &s->pins[j];
            if (p->expires_ns > now && p->family == family &&
                memcmp(p->addr, dst, family == AF_INET ? 4 : 16) == 0 &&
                name_matches(r, p->name))
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
    if (parse_policy(n, entries, count, &pol, err) < 0)
        return -1;
    pthread_mutex_lock(&n->lock);
    struct policy old = s->pol;
    s->pol = pol;
    dsec__nft_elem *e = NULL;
    size_t ne = 0;
    int rc = sbx_elems(s, &e, &ne, err);
    if (rc == 0)
        rc = dsec__nft_sbx_replace(n->nft, s->idx, e, ne, err);
    dsec_free(e);
    if (rc < 0) {
        s->pol = old;
        pthread_mutex_unlock(&n->lock);
        policy_clear(&pol);
        return dsec_err_wrap(err, "network policy of %s", s->id);
    }
    policy_clear(&old);
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

const char *dsec_net_sbx_netns(const dsec_net_sbx *s) { return s->netns; }
const char *dsec_net_sbx_resolver(const dsec_net_sbx *s) { return s->net->gw4_str; }
const char *dsec_net_sbx_addr(const dsec_net_sbx *s) { return s->addr_str; }
const char *dsec_net_sbx_state(const dsec_net_sbx *s) { return s->state; }

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
