/* net-policy.c - a sandbox's network policy: entries parsed, matched, and turned into allow
 * elements. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/net/net-int.h"
#include "backends/net/net-node-int.h"
#include "backends/net/net.h"
#include "dsec/alloc.h"

/* ---- policy entries ---------------------------------------------------------------------- */

void dsec__net_policy_clear(struct policy *p)
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

bool dsec__net_mirror_name_ok(const char *s)
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

int dsec__net_parse_cidr(const char *s, int family, uint8_t *addr, uint8_t *prefix)
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
/* A mirror name: the mirror's entries into p (without a node: only the name's form counts). */
static int parse_mirror(const dsec_net *n, const char *e, struct policy *p, dsec_err *err)
{
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

int dsec__net_parse_entry(const dsec_net *n, const char *e, struct policy *p, dsec_err *err)
{
    size_t len = strlen(e);
    if (len == 0)
        return bad_entry(err, e, "empty");
    if (len > NET_ENTRY_LEN_MAX)
        return bad_entry(err, e, "longer than 255 bytes");

    if (dsec__net_mirror_name_ok(e) && !strchr(e, '.'))
        return parse_mirror(n, e, p, err);

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
        if (dsec__net_parse_cidr(target, AF_INET6, r.addr, &r.prefix) < 0)
            return bad_entry(err, e, "not an IPv6 address or range");
    } else if (isdigit((unsigned char)target[0]) &&
               strspn(target, "0123456789./") == strlen(target)) {
        r.family = AF_INET;
        if (dsec__net_parse_cidr(target, AF_INET, r.addr, &r.prefix) < 0)
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

int dsec__net_parse_policy(const dsec_net *n, const char *const *entries, size_t count,
                           struct policy *p, dsec_err *err)
{
    memset(p, 0, sizeof *p);
    if (count > NET_ENTRIES_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "network policy has %zu entries; at most %d are allowed", count,
                            NET_ENTRIES_MAX);
    for (size_t i = 0; i < count; i++) {
        if (!entries[i] || dsec__net_parse_entry(n, entries[i], p, err) < 0) {
            if (!entries[i])
                dsec_err_set(err, DSEC_E_INVALID, 0, "network policy entry %zu is missing", i);
            dsec__net_policy_clear(p);
            return -1;
        }
    }
    return 0;
}

int dsec_net_policy_check(const dsec_net *n, const char *const *entries, size_t count,
                          dsec_err *err)
{
    struct policy p;
    if (dsec__net_parse_policy(n, entries, count, &p, err) < 0)
        return -1;
    dsec__net_policy_clear(&p);
    return 0;
}

bool dsec__net_name_matches(const struct rule *r, const char *name)
{
    if (!r->domain)
        return false;
    if (!r->wildcard)
        return strcmp(name, r->domain) == 0;
    size_t nl = strlen(name), dl = strlen(r->domain);
    return nl > dl + 1 && name[nl - dl - 1] == '.' && strcmp(name + nl - dl, r->domain) == 0;
}

bool dsec__net_in_range(int family, const uint8_t *a, const uint8_t *net, uint8_t prefix)
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

bool dsec__net_rule_allows(const struct rule *r, uint8_t proto, uint16_t port)
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
size_t dsec__net_rule_elems(const struct rule *r, int family, const uint8_t *addr, uint8_t prefix,
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
int dsec__net_sbx_elems(dsec_net_sbx *s, dsec__nft_elem **out, size_t *nout, dsec_err *err)
{
    size_t cap = 3 * (s->pol.n + s->npins * s->pol.n) + 1, k = 0;
    dsec__nft_elem *e = dsec_calloc(cap, sizeof *e);
    if (!e)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "out of memory for a policy");
    uint64_t now = dsec__net_mono_ns();
    for (size_t i = 0; i < s->pol.n; i++) {
        const struct rule *r = &s->pol.r[i];
        if (r->domain)
            continue;
        if (r->family == AF_INET6 && !s->net->v6)
            continue;
        k += dsec__net_rule_elems(r, r->family, r->addr, r->prefix, 0, e + k);
    }
    for (size_t j = 0; j < s->npins; j++) {
        const struct pin *pn = &s->pins[j];
        if (pn->expires_ns <= now)
            continue;
        uint32_t left = (uint32_t)((pn->expires_ns - now) / 1000000u) + 1;
        for (size_t i = 0; i < s->pol.n; i++)
            if (dsec__net_name_matches(&s->pol.r[i], pn->name))
                k += dsec__net_rule_elems(&s->pol.r[i], pn->family, pn->addr,
                                          pn->family == AF_INET ? 32 : 128, left, e + k);
    }
    *out = e;
    *nout = k;
    return 0;
}
