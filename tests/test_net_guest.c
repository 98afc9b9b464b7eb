/* test_net_guest.c - a VM's NIC on a sandbox's network (root): the tap from dsec_net_guest_link,
 * driven as the guest would drive it, against a real dsec_net with its resolver and policy. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/net/net-int.h"
#include "backends/net/net.h"
#include "dsec/alloc.h"
#include "dsec/err.h"

/*
 * Two nodes' containment, tags 0xe6 (IPv4 only) and 0xe7 (IPv4 and IPv6),
 * with their state in a private temporary directory. Their resolvers forward
 * allowed names to a fake upstream on 127.0.0.1 that answers every A query
 * with UPSTREAM_A and logs the names it is asked. The test writes Ethernet
 * frames into the tap's file as a guest's virtio-net would, and reads what
 * the guest would receive.
 */

#define TAG4 0xe6
#define TAG6 0xe7
#define UPSTREAM_A "198.51.100.7"
#define QUIET_MS 400 /* how long "nothing comes back" is watched for */

static bool root;
static bool have_v6;
static char dir[64];
static dsec_net *net4, *net6;

/* ---- the fake upstream -------------------------------------------------------------------- */

static struct {
    int fd;
    uint16_t port;
    pthread_t t;
    volatile bool stop;
    pthread_mutex_t lock;
    char asked[64][128];
    size_t nasked;
} up = {.fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER};

/* The name of a DNS message's question as dotted text; its end offset, or 0 if malformed. */
static size_t qname_of(const uint8_t *m, size_t len, char *out, size_t outlen)
{
    size_t off = 12, o = 0;
    out[0] = '\0';
    while (off < len && m[off] != 0) {
        size_t l = m[off++];
        if (l > 63 || off + l > len || o + l + 2 > outlen)
            return 0;
        if (o)
            out[o++] = '.';
        memcpy(out + o, m + off, l);
        o += l;
        off += l;
    }
    out[o] = '\0';
    return off < len ? off + 1 : 0;
}

static void *up_main(void *arg)
{
    (void)arg;
    while (!up.stop) {
        struct pollfd p = {up.fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        uint8_t q[512], r[600];
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(up.fd, q, sizeof q, 0, (struct sockaddr *)&from, &fl);
        char name[128];
        size_t qend = n >= 12 ? qname_of(q, (size_t)n, name, sizeof name) : 0;
        if (qend == 0 || qend + 4 > (size_t)n)
            continue;
        pthread_mutex_lock(&up.lock);
        if (up.nasked < 64)
            snprintf(up.asked[up.nasked++], sizeof up.asked[0], "%s", name);
        pthread_mutex_unlock(&up.lock);
        uint16_t qtype = (uint16_t)(q[qend] << 8 | q[qend + 1]);
        /* header and question as asked; one A record, or none for other types */
        size_t len = qend + 4;
        memcpy(r, q, len);
        r[2] = 0x81; /* QR, RD */
        r[3] = 0x80; /* RA, NOERROR */
        r[4] = 0, r[5] = 1;
        r[6] = 0, r[7] = qtype == 1 ? 1 : 0;
        memset(r + 8, 0, 4);
        if (qtype == 1) {
            static const uint8_t rr[] = {0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4};
            memcpy(r + len, rr, sizeof rr);
            len += sizeof rr;
            inet_pton(AF_INET, UPSTREAM_A, r + len);
            len += 4;
        }
        sendto(up.fd, r, len, 0, (struct sockaddr *)&from, fl);
    }
    return NULL;
}

static bool upstream_asked(const char *name)
{
    bool seen = false;
    pthread_mutex_lock(&up.lock);
    for (size_t i = 0; i < up.nasked && !seen; i++)
        seen = strcmp(up.asked[i], name) == 0;
    pthread_mutex_unlock(&up.lock);
    return seen;
}

/* ---- frames ------------------------------------------------------------------------------- */

static uint32_t csum_add(uint32_t sum, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i + 1 < n; i += 2)
        sum += (uint32_t)(p[i] << 8 | p[i + 1]);
    if (n & 1)
        sum += (uint32_t)(p[n - 1] << 8);
    return sum;
}

static uint16_t csum_fold(uint32_t sum)
{
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return (uint16_t)~sum;
}

/* The UDP checksum over the pseudo-header of either family (alen 4 or 16). */
static uint16_t udp_csum(const uint8_t *src, const uint8_t *dst, size_t alen, const uint8_t *udp,
                         size_t ulen)
{
    uint32_t s = csum_add(0, src, alen);
    s = csum_add(s, dst, alen);
    s += 17 + (uint32_t)ulen;
    return csum_fold(csum_add(s, udp, ulen));
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static void mac_parse(const char *s, uint8_t m[6])
{
    unsigned v[6];
    assert_int_equal(sscanf(s, "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]), 6);
    for (int i = 0; i < 6; i++)
        m[i] = (uint8_t)v[i];
}

/* An address of "A/PFX" or "A" text. */
static void addr_parse(int family, const char *s, uint8_t *a)
{
    char b[64];
    snprintf(b, sizeof b, "%s", s);
    char *slash = strchr(b, '/');
    if (slash)
        *slash = '\0';
    assert_int_equal(inet_pton(family, b, a), 1);
}

/* A DNS query for name (type A) with id. */
static size_t dns_query(uint8_t *out, const char *name, uint16_t id)
{
    memset(out, 0, 12);
    put16(out, id);
    out[2] = 0x01; /* RD */
    out[5] = 1;    /* one question */
    size_t o = 12;
    const char *p = name;
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t l = dot ? (size_t)(dot - p) : strlen(p);
        out[o++] = (uint8_t)l;
        memcpy(out + o, p, l);
        o += l;
        p += l + (dot ? 1 : 0);
    }
    out[o++] = 0;
    put16(out + o, 1);     /* A */
    put16(out + o + 2, 1); /* IN */
    return o + 4;
}

/* What a guest sends and what it expects back. */
struct flow {
    int family;
    uint8_t mac[6], gw_mac[6];
    uint8_t src[16], dst[16]; /* guest address (or a spoofed one), the resolver */
    uint16_t sport;
};

static void flow_of(struct flow *f, const dsec_net_guest *g, int family)
{
    memset(f, 0, sizeof *f);
    f->family = family;
    mac_parse(g->mac, f->mac);
    mac_parse(g->gw_mac, f->gw_mac);
    if (family == AF_INET) {
        addr_parse(AF_INET, g->addr4, f->src);
        addr_parse(AF_INET, g->dns4, f->dst);
    } else {
        addr_parse(AF_INET6, g->addr6, f->src);
        addr_parse(AF_INET6, g->gw6, f->dst);
    }
    f->sport = (uint16_t)(40000 + (rand() % 20000));
}

/* An Ethernet frame carrying payload over UDP from f->src:sport to f->dst:dport. */
static size_t udp_frame(uint8_t *fr, const struct flow *f, uint16_t dport, const uint8_t *payload,
                        size_t plen)
{
    memcpy(fr, f->gw_mac, 6);
    memcpy(fr + 6, f->mac, 6);
    size_t ip = 14, alen = f->family == AF_INET ? 4 : 16;
    size_t iph = f->family == AF_INET ? 20 : 40, udp = ip + iph, ulen = 8 + plen;
    if (f->family == AF_INET) {
        put16(fr + 12, 0x0800);
        memset(fr + ip, 0, 20);
        fr[ip] = 0x45;
        put16(fr + ip + 2, (uint16_t)(20 + ulen));
        put16(fr + ip + 4, (uint16_t)rand());
        put16(fr + ip + 6, 0x4000); /* DF */
        fr[ip + 8] = 64;
        fr[ip + 9] = 17;
        memcpy(fr + ip + 12, f->src, 4);
        memcpy(fr + ip + 16, f->dst, 4);
        put16(fr + ip + 10, csum_fold(csum_add(0, fr + ip, 20)));
    } else {
        put16(fr + 12, 0x86dd);
        memset(fr + ip, 0, 40);
        fr[ip] = 0x60;
        put16(fr + ip + 4, (uint16_t)ulen);
        fr[ip + 6] = 17;
        fr[ip + 7] = 64;
        memcpy(fr + ip + 8, f->src, 16);
        memcpy(fr + ip + 24, f->dst, 16);
    }
    put16(fr + udp, f->sport);
    put16(fr + udp + 2, dport);
    put16(fr + udp + 4, (uint16_t)ulen);
    put16(fr + udp + 6, 0);
    memcpy(fr + udp + 8, payload, plen);
    uint16_t c = udp_csum(f->src, f->dst, alen, fr + udp, ulen);
    put16(fr + udp + 6, c ? c : 0xffff);
    return udp + ulen;
}

/* The UDP payload of a frame the guest receives for flow f (from f->dst:sport_from to
 * f->src:f->sport, to the guest's MAC from the gateway's), with every header and checksum
 * checked as the guest's kernel would; NULL when the frame is something else. */
static const uint8_t *udp_payload_for(const struct flow *f, uint16_t sport_from, const uint8_t *fr,
                                      size_t n, size_t *plen)
{
    size_t ip = 14, alen = f->family == AF_INET ? 4 : 16;
    if (n < ip + 28 || memcmp(fr, f->mac, 6) != 0 || memcmp(fr + 6, f->gw_mac, 6) != 0)
        return NULL;
    size_t udp;
    const uint8_t *src, *dst;
    if (f->family == AF_INET) {
        if (get16(fr + 12) != 0x0800 || fr[ip] != 0x45 || fr[ip + 9] != 17)
            return NULL;
        assert_int_equal(csum_fold(csum_add(0, fr + ip, 20)), 0); /* IPv4 header checksum */
        src = fr + ip + 12;
        dst = fr + ip + 16;
        udp = ip + 20;
        assert_true(ip + get16(fr + ip + 2) <= n);
    } else {
        if (n < ip + 48 || get16(fr + 12) != 0x86dd || fr[ip + 6] != 17)
            return NULL;
        src = fr + ip + 8;
        dst = fr + ip + 24;
        udp = ip + 40;
        assert_true(udp + get16(fr + ip + 4) <= n);
    }
    if (memcmp(src, f->dst, alen) != 0 || memcmp(dst, f->src, alen) != 0 ||
        get16(fr + udp) != sport_from || get16(fr + udp + 2) != f->sport)
        return NULL;
    size_t ulen = get16(fr + udp + 4);
    assert_true(ulen >= 8 && udp + ulen <= n);
    if (f->family == AF_INET6 || get16(fr + udp + 6) != 0) /* IPv4 may send none */
        assert_int_equal(udp_csum(src, dst, alen, fr + udp, ulen), 0);
    *plen = ulen - 8;
    return fr + udp + 8;
}

/* Read frames from the tap for up to ms; the UDP payload of the first one for flow f from
 * port sport_from is copied to out (returns its length), else 0. Frames for something else
 * that do not come from the gateway's MAC (the host side of the link; it may send IPv6
 * multicast listener reports) are counted in *others: nothing else is on the guest's link. */
static size_t tap_wait(int fd, int ms, const struct flow *f, uint16_t sport_from, uint8_t *out,
                       size_t outlen, int *others)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        long left = ms - ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
        if (left <= 0)
            return 0;
        struct pollfd p = {fd, POLLIN, 0};
        int r = poll(&p, 1, (int)left);
        assert_true(r >= 0);
        if (r == 0)
            return 0;
        uint8_t fr[2048];
        ssize_t n = read(fd, fr, sizeof fr);
        if (n < 0)
            fail_msg("reading the tap: %s", strerror(errno));
        size_t plen;
        const uint8_t *pl = udp_payload_for(f, sport_from, fr, (size_t)n, &plen);
        if (pl == NULL) {
            if (others && (n < 12 || memcmp(fr + 6, f->gw_mac, 6) != 0))
                (*others)++;
            continue;
        }
        assert_true(plen <= outlen);
        memcpy(out, pl, plen);
        return plen;
    }
}

/* Ask the resolver name (type A) as the guest, through the tap; the reply's length in ans
 * (0: nothing came back within ms). */
static size_t guest_ask(int fd, const struct flow *f, const char *name, uint16_t id, uint8_t *ans,
                        size_t anslen, int ms)
{
    uint8_t q[300], fr[400];
    size_t ql = dns_query(q, name, id);
    size_t fl = udp_frame(fr, f, 53, q, ql);
    ssize_t w = write(fd, fr, fl);
    if (w != (ssize_t)fl)
        fail_msg("writing a frame to the tap: %s", w < 0 ? strerror(errno) : "short write");
    return tap_wait(fd, ms, f, 53, ans, anslen, NULL);
}

/* A DNS reply to query id for name: QR set, the question echoed; its rcode. */
static int dns_rcode(const uint8_t *a, size_t n, uint16_t id, const char *name)
{
    char q[128];
    assert_true(n >= 12);
    assert_int_equal(get16(a), id);
    assert_true(a[2] & 0x80);
    assert_int_equal(get16(a + 4), 1);
    assert_true(qname_of(a, n, q, sizeof q) > 0);
    assert_string_equal(q, name);
    return a[3] & 0x0f;
}

/* The first A record's address in a reply, dotted ("" when none). */
static void dns_first_a(const uint8_t *a, size_t n, char *out, size_t outlen)
{
    char q[128];
    size_t o = qname_of(a, n, q, sizeof q) + 4;
    out[0] = '\0';
    for (unsigned i = 0; i < get16(a + 6) && o < n; i++) {
        while (o < n && a[o] != 0 && (a[o] & 0xc0) != 0xc0)
            o += 1u + a[o];
        o += o < n && (a[o] & 0xc0) == 0xc0 ? 2 : 1;
        if (o + 10 > n)
            return;
        uint16_t type = get16(a + o), rdlen = get16(a + o + 8);
        o += 10;
        if (type == 1 && rdlen == 4 && o + 4 <= n) {
            inet_ntop(AF_INET, a + o, out, (socklen_t)outlen);
            return;
        }
        o += rdlen;
    }
}

/* ---- the nodes ---------------------------------------------------------------------------- */

static dsec_net *node(unsigned tag, bool v6)
{
    char up_addr[32];
    snprintf(up_addr, sizeof up_addr, "127.0.0.1:%u", up.port);
    const char *ups[] = {up_addr};
    dsec_net_conf c = {.state_dir = dir,
                       .tag = tag,
                       .pool6 = v6 ? NULL : "",
                       .upstream = ups,
                       .nupstream = 1,
                       .warm = UINT32_MAX};
    dsec_net *n = NULL;
    dsec_err err;
    if (dsec_net_new(&n, &c, &err) < 0) {
        fprintf(stderr, "test_net_guest: node %02x: %s\n", tag, err.msg);
        return NULL;
    }
    return n;
}

static int group_setup(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "test_net_guest: needs root (namespaces, taps, nftables); skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    root = true;
    srand((unsigned)time(NULL) ^ (unsigned)getpid());
    FILE *f = fopen("/proc/sys/net/ipv6/conf/all/disable_ipv6", "re");
    if (f != NULL) {
        have_v6 = fgetc(f) == '0';
        fclose(f);
    }
    snprintf(dir, sizeof dir, "/tmp/dsec-guesttest-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return -1;
    up.fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (up.fd < 0 || bind(up.fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        getsockname(up.fd, (struct sockaddr *)&a, &al) < 0)
        return -1;
    up.port = ntohs(a.sin_port);
    if (pthread_create(&up.t, NULL, up_main, NULL) != 0)
        return -1;
    net4 = node(TAG4, false);
    if (net4 == NULL)
        return -1;
    if (have_v6 && (net6 = node(TAG6, true)) == NULL)
        return -1;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (!root)
        return 0;
    dsec_net_free(net4, false);
    dsec_net_free(net6, false);
    up.stop = true;
    pthread_join(up.t, NULL);
    close(up.fd);
    char p[sizeof dir + 8];
    snprintf(p, sizeof p, "%s/netns", dir);
    rmdir(p);
    rmdir(dir);
    return 0;
}

#define NEED_ROOT()                                                                                \
    do {                                                                                           \
        if (!root)                                                                                 \
            skip();                                                                                \
    } while (0)

static dsec_net_sbx *attach(dsec_net *n, const char *id)
{
    static const char *const pol[] = {"*.allowed.test"};
    dsec_net_sbx *s = NULL;
    dsec_err err;
    if (dsec_net_attach(n, id, "t", pol, 1, &s, &err) < 0)
        fail_msg("attach %s: %s", id, err.msg);
    return s;
}

static dsec_net_guest link_guest(dsec_net_sbx *s)
{
    dsec_net_guest g;
    dsec_err err;
    if (dsec_net_guest_link(s, &g, &err) < 0)
        fail_msg("guest link: %s", err.msg);
    assert_true(g.tap_fd >= 0);
    return g;
}

static uint64_t dns_queries(dsec_net *n)
{
    dsec_net_stats st;
    dsec_net_stats_get(n, &st);
    return st.dns_queries;
}

/* A sysctl of the namespace at path, read on a thread of our own that joins it. */
struct ns_read {
    const char *ns, *file;
    char val[16];
};

static void *ns_read_main(void *arg)
{
    struct ns_read *r = arg;
    int fd = open(r->ns, O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && setns(fd, CLONE_NEWNET) == 0) {
        FILE *f = fopen(r->file, "re");
        if (f != NULL) {
            if (fgets(r->val, sizeof r->val, f) == NULL)
                r->val[0] = '\0';
            fclose(f);
        }
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

static void ns_sysctl(const char *ns, const char *file, char *val, size_t len)
{
    struct ns_read r = {ns, file, "?"};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, ns_read_main, &r), 0);
    pthread_join(t, NULL);
    r.val[strcspn(r.val, "\n")] = '\0';
    snprintf(val, len, "%s", r.val);
}

/* ---- tests -------------------------------------------------------------------------------- */

static void test_bad_input(void **state)
{
    (void)state;
    dsec_net_guest g;
    dsec_err err;
    memset(&g, 0x55, sizeof g);
    assert_int_equal(dsec_net_guest_link(NULL, &g, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "no sandbox network"));
    assert_int_equal(g.tap_fd, -1);
    assert_int_equal(dsec_net_guest_link(NULL, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);

    /* the plumbing below it names what is wrong */
    NEED_ROOT();
    int fd = 7;
    char missing[sizeof dir + 16];
    snprintf(missing, sizeof missing, "%s/no-such-ns", dir);
    assert_int_equal(dsec__net_link_guest(missing, "tap0", &fd, &err), -1);
    assert_int_equal(fd, -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, missing));
    assert_int_equal(dsec__net_link_guest("/proc/self/ns/uts", "tap0", &fd, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "not a network namespace"));
    assert_int_equal(dsec__net_link_guest("/proc/self/ns/net", "eth0", &fd, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_int_equal(dsec__net_link_guest("/proc/self/ns/net", "a-name-far-too-long", &fd, &err),
                     -1);
    assert_non_null(strstr(err.msg, "longer than"));
    assert_int_equal(dsec__net_link_guest("/proc/self/ns/net", "tap0", &fd, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "host's own network namespace"));
    assert_int_equal(dsec__net_link_guest("", "tap0", &fd, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
}

/* The guest is the sandbox: its description, and DNS through the tap for an allowed name, a
 * refused one, and from a spoofed address. */
static void test_guest_is_the_sandbox(void **state)
{
    (void)state;
    NEED_ROOT();
    dsec_net_sbx *s = attach(net4, "vm-a");
    dsec_net_guest g = link_guest(s);

    assert_string_equal(g.tap, "tap0");
    assert_int_equal(strlen(g.mac), 17);
    assert_int_equal(strncmp(g.mac, "02:", 3), 0); /* locally administered, unicast */
    assert_int_equal(strlen(g.gw_mac), 17);
    assert_string_not_equal(g.mac, g.gw_mac);
    char want[32];
    snprintf(want, sizeof want, "%s/32", dsec_net_sbx_addr(s));
    assert_string_equal(g.addr4, want);
    assert_string_equal(g.gw4, dsec_net_sbx_resolver(s));
    assert_string_equal(g.dns4, dsec_net_sbx_resolver(s));
    assert_string_equal(g.addr6, "");
    assert_string_equal(g.gw6, "");
    int fl = fcntl(g.tap_fd, F_GETFD);
    assert_true(fl >= 0 && (fl & FD_CLOEXEC));

    /* the namespace's own stack says nothing on the guest's link */
    char v[16];
    ns_sysctl(dsec_net_sbx_netns(s), "/proc/sys/net/ipv6/conf/eth0/disable_ipv6", v, sizeof v);
    assert_string_equal(v, "1");
    ns_sysctl(dsec_net_sbx_netns(s), "/proc/sys/net/ipv6/conf/tap0/disable_ipv6", v, sizeof v);
    assert_string_equal(v, "1");

    struct flow f;
    flow_of(&f, &g, AF_INET);
    uint8_t ans[600];
    size_t n = guest_ask(g.tap_fd, &f, "www.allowed.test", 0x1234, ans, sizeof ans, 3000);
    assert_true(n > 0);
    assert_int_equal(dns_rcode(ans, n, 0x1234, "www.allowed.test"), 0);
    char a[INET_ADDRSTRLEN];
    dns_first_a(ans, n, a, sizeof a);
    assert_string_equal(a, UPSTREAM_A);
    assert_true(upstream_asked("www.allowed.test"));

    n = guest_ask(g.tap_fd, &f, "exfil.evil.test", 0x4321, ans, sizeof ans, 3000);
    assert_true(n > 0);
    assert_int_equal(dns_rcode(ans, n, 0x4321, "exfil.evil.test"), 5); /* REFUSED */
    assert_false(upstream_asked("exfil.evil.test"));

    /* from another address (the pool's next, no sandbox's): the host drops it before the
     * resolver sees it, and nothing comes back */
    struct flow spoof = f;
    uint32_t other;
    memcpy(&other, f.src, 4);
    other = htonl(ntohl(other) + 1);
    memcpy(spoof.src, &other, 4);
    uint64_t q0 = dns_queries(net4);
    n = guest_ask(g.tap_fd, &spoof, "spoof.allowed.test", 0x5555, ans, sizeof ans, QUIET_MS);
    assert_int_equal(n, 0);
    assert_int_equal(dns_queries(net4), q0);
    assert_false(upstream_asked("spoof.allowed.test"));
    /* while the real address, right after, is answered */
    n = guest_ask(g.tap_fd, &f, "real.allowed.test", 0x6666, ans, sizeof ans, 3000);
    assert_true(n > 0);
    assert_int_equal(dns_rcode(ans, n, 0x6666, "real.allowed.test"), 0);
    assert_int_equal(dns_queries(net4), q0 + 1);

    /* the host's own datagram to the sandbox's address reaches the guest, not the
     * namespace's stack (which would answer with a port unreachable instead) */
    int us = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(f.sport)};
    memcpy(&to.sin_addr, f.src, 4);
    struct sockaddr_in me = {.sin_family = AF_INET};
    memcpy(&me.sin_addr, f.dst, 4); /* from the gateway, as the resolver would */
    assert_int_equal(bind(us, (struct sockaddr *)&me, sizeof me), 0);
    socklen_t ml = sizeof me;
    assert_int_equal(getsockname(us, (struct sockaddr *)&me, &ml), 0);
    assert_int_equal(sendto(us, "hello guest", 11, 0, (struct sockaddr *)&to, sizeof to), 11);
    n = tap_wait(g.tap_fd, 3000, &f, ntohs(me.sin_port), ans, sizeof ans, NULL);
    assert_int_equal(n, 11);
    assert_memory_equal(ans, "hello guest", 11);
    close(us);

    close(g.tap_fd);
    dsec_err err;
    assert_int_equal(dsec_net_detach(s, &err), 0);
}

/* A second link replaces the tap: the old file is dead, the new one works; a link after the
 * tap went away with its last file works too. */
static void test_relink(void **state)
{
    (void)state;
    NEED_ROOT();
    dsec_net_sbx *s = attach(net4, "vm-b");
    dsec_net_guest g1 = link_guest(s);
    dsec_net_guest g2 = link_guest(s);
    assert_true(g2.tap_fd != g1.tap_fd);
    assert_string_equal(g1.mac, g2.mac);
    assert_string_equal(g1.addr4, g2.addr4);

    struct flow f;
    flow_of(&f, &g2, AF_INET);
    uint8_t fr[400], q[300];
    size_t fl = udp_frame(fr, &f, 53, q, dns_query(q, "old.allowed.test", 7));
    errno = 0;
    assert_int_equal(write(g1.tap_fd, fr, fl), -1);
    assert_int_equal(errno, EBADFD);
    uint8_t ans[600];
    size_t n = guest_ask(g2.tap_fd, &f, "new.allowed.test", 0x2222, ans, sizeof ans, 3000);
    assert_true(n > 0);
    assert_int_equal(dns_rcode(ans, n, 0x2222, "new.allowed.test"), 0);
    assert_false(upstream_asked("old.allowed.test"));
    close(g1.tap_fd);

    /* the VM stopped: its tap is gone with its file; the next start links afresh */
    close(g2.tap_fd);
    dsec_net_guest g3 = link_guest(s);
    n = guest_ask(g3.tap_fd, &f, "third.allowed.test", 0x3333, ans, sizeof ans, 3000);
    assert_true(n > 0);
    assert_int_equal(dns_rcode(ans, n, 0x3333, "third.allowed.test"), 0);

    /* detached with the file still open: the guest reaches nothing */
    dsec_err err;
    assert_int_equal(dsec_net_detach(s, &err), 0);
    uint64_t q0 = dns_queries(net4);
    n = guest_ask(g3.tap_fd, &f, "after.allowed.test", 0x4444, ans, sizeof ans, QUIET_MS);
    assert_int_equal(n, 0);
    assert_int_equal(dns_queries(net4), q0);
    close(g3.tap_fd);
}

/* Two guests of one node: each answered on its own tap only. */
static void test_two_guests(void **state)
{
    (void)state;
    NEED_ROOT();
    dsec_net_sbx *s1 = attach(net4, "vm-c"), *s2 = attach(net4, "vm-d");
    dsec_net_guest g1 = link_guest(s1), g2 = link_guest(s2);
    assert_string_not_equal(g1.mac, g2.mac);
    assert_string_not_equal(g1.addr4, g2.addr4);
    struct flow f1, f2;
    flow_of(&f1, &g1, AF_INET);
    flow_of(&f2, &g2, AF_INET);
    uint8_t ans[600];
    size_t n = guest_ask(g1.tap_fd, &f1, "one.allowed.test", 0x0101, ans, sizeof ans, 3000);
    assert_true(n > 0);
    int others = 0;
    /* nothing of guest 1's exchange shows on guest 2's tap */
    assert_int_equal(tap_wait(g2.tap_fd, QUIET_MS, &f2, 53, ans, sizeof ans, &others), 0);
    assert_int_equal(others, 0);
    n = guest_ask(g2.tap_fd, &f2, "two.allowed.test", 0x0202, ans, sizeof ans, 3000);
    assert_true(n > 0);
    assert_int_equal(dns_rcode(ans, n, 0x0202, "two.allowed.test"), 0);
    close(g1.tap_fd);
    close(g2.tap_fd);
    dsec_err err;
    assert_int_equal(dsec_net_detach(s1, &err), 0);
    assert_int_equal(dsec_net_detach(s2, &err), 0);
}

/* With IPv6 on: the guest's IPv6 description, DNS over IPv6 through the tap, and a quiet
 * link (no IPv6 chatter of the namespace's own stack, duplicate address detection or router
 * solicitations from the tap, reaches the guest). */
static void test_guest_v6(void **state)
{
    (void)state;
    NEED_ROOT();
    if (!have_v6)
        skip();
    dsec_net_sbx *s = attach(net6, "vm-6");
    dsec_net_guest g = link_guest(s);
    assert_non_null(strstr(g.addr6, "/128"));
    assert_string_not_equal(g.gw6, "");
    struct in6_addr a6, gw6;
    addr_parse(AF_INET6, g.addr6, a6.s6_addr);
    addr_parse(AF_INET6, g.gw6, gw6.s6_addr);
    assert_false(IN6_ARE_ADDR_EQUAL(&a6, &gw6));

    struct flow f6, f4;
    flow_of(&f6, &g, AF_INET6);
    flow_of(&f4, &g, AF_INET);
    int others = 0;
    uint8_t ans[600];
    /* the kernel delays its first IPv6 messages on a new link by up to a second */
    assert_int_equal(tap_wait(g.tap_fd, 1500, &f6, 53, ans, sizeof ans, &others), 0);
    assert_int_equal(others, 0);
    size_t n = guest_ask(g.tap_fd, &f6, "six.allowed.test", 0x0606, ans, sizeof ans, 3000);
    assert_true(n > 0);
    assert_int_equal(dns_rcode(ans, n, 0x0606, "six.allowed.test"), 0);
    char a[INET_ADDRSTRLEN];
    dns_first_a(ans, n, a, sizeof a);
    assert_string_equal(a, UPSTREAM_A);
    n = guest_ask(g.tap_fd, &f4, "four.allowed.test", 0x0404, ans, sizeof ans, 3000);
    assert_true(n > 0);
    assert_int_equal(dns_rcode(ans, n, 0x0404, "four.allowed.test"), 0);

    /* a spoofed IPv6 source is dropped before the resolver */
    struct flow spoof = f6;
    spoof.src[15] ^= 0x40;
    uint64_t q0 = dns_queries(net6);
    assert_int_equal(
        guest_ask(g.tap_fd, &spoof, "spoof6.allowed.test", 0x0707, ans, sizeof ans, QUIET_MS), 0);
    assert_int_equal(dns_queries(net6), q0);
    close(g.tap_fd);
    dsec_err err;
    assert_int_equal(dsec_net_detach(s, &err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_input), cmocka_unit_test(test_guest_is_the_sandbox),
        cmocka_unit_test(test_relink),    cmocka_unit_test(test_two_guests),
        cmocka_unit_test(test_guest_v6),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
