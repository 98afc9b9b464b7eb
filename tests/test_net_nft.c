/* test_net_nft.c - the node's nftables table for real: two sandboxes and an outside host in
 * namespaces, what a sandbox can reach with and without allow entries, cuts, NFLOG, scale. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/ip_icmp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
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
#include "dsec/alloc.h"
#include "dsec/err.h"
#include "tests/test_util.h"

/*
 * The whole test runs in a network namespace of its own (unshare at setup), which plays the
 * node: the table, the host-side veths and the forwarding sysctls live there and vanish with
 * the process. The sandboxes and the outside host are named namespaces (ip netns), removed
 * at the end and before starting (a killed run leaves them behind).
 *
 *   sbxA (dsect9a)  eth0 100.127.251.2/32, fd7e:9::2/128  <->  dsvt9000001 (gw .1, fd7e:9::1)
 *   sbxB (dsect9b)  eth0 100.127.251.3/32, fd7e:9::3/128  <->  dsvt9000002
 *   outside (dsect9o) eth0 198.18.251.2/24, fd7f:251::2/64 <-> dsot9 198.18.251.1/24, fd7f:251::1
 * The outside has no route back to the pool: replies only come back through masquerade.
 */

#define TABLE "dsec_t9"
#define GW4 "100.127.251.1"
#define A4 "100.127.251.2"
#define B4 "100.127.251.3"
#define GW6 "fd7e:9::1"
#define A6 "fd7e:9::2"
#define OUT4 "198.18.251.2"
#define HOST_OUT4 "198.18.251.1"
#define OUT6 "fd7f:251::2"
#define DNS_PORT 5353
#define LOG_GROUP 2931
#define IDX_A 1
#define IDX_B 2

static bool root;
static int self_ns = -1, ns_a = -1, ns_b = -1, ns_o = -1;
static dsec__nft *nft;

static pthread_mutex_t blk_mu = PTHREAD_MUTEX_INITIALIZER;
static dsec__nft_block blocks[256];
static size_t nblocks;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return rc == 0 ? 0 : -1;
}

static void on_block(void *ud, const dsec__nft_block *b)
{
    (void)ud;
    pthread_mutex_lock(&blk_mu);
    if (nblocks < sizeof blocks / sizeof blocks[0])
        blocks[nblocks++] = *b;
    pthread_mutex_unlock(&blk_mu);
}

/* Wait for a logged block matching (idx, dst, proto, dport). */
static bool wait_block(uint32_t idx, int family, const char *dst, uint8_t proto, uint16_t dport,
                       int timeout_ms)
{
    uint8_t d[16] = {0};
    inet_pton(family, dst, d);
    uint64_t end = now_ms() + (uint64_t)timeout_ms;
    do {
        pthread_mutex_lock(&blk_mu);
        for (size_t i = 0; i < nblocks; i++) {
            const dsec__nft_block *b = &blocks[i];
            if (b->idx == idx && b->family == family && b->proto == proto && b->dport == dport &&
                memcmp(b->dst, d, family == AF_INET ? 4 : 16) == 0) {
                pthread_mutex_unlock(&blk_mu);
                return true;
            }
        }
        pthread_mutex_unlock(&blk_mu);
        msleep(20);
    } while (now_ms() < end);
    pthread_mutex_lock(&blk_mu);
    for (size_t i = 0; i < nblocks; i++) {
        char a[64];
        inet_ntop(blocks[i].family, blocks[i].dst, a, sizeof a);
        fprintf(stderr, "  logged: sandbox %u %s proto %u port %u\n", blocks[i].idx, a,
                blocks[i].proto, blocks[i].dport);
    }
    pthread_mutex_unlock(&blk_mu);
    return false;
}

/* A socket made inside the namespace nsfd (sockets keep the namespace they were made in). */
static int ns_socket(int nsfd, int family, int type, int proto)
{
    if (setns(nsfd, CLONE_NEWNET) < 0)
        return -1;
    int fd = socket(family, type | SOCK_CLOEXEC, proto);
    int e = errno;
    if (setns(self_ns, CLONE_NEWNET) < 0)
        abort();
    errno = e;
    return fd;
}

static socklen_t mkaddr(struct sockaddr_storage *ss, int family, const char *ip, int port)
{
    memset(ss, 0, sizeof *ss);
    if (family == AF_INET) {
        struct sockaddr_in *s = (struct sockaddr_in *)ss;
        s->sin_family = AF_INET;
        s->sin_port = htons((uint16_t)port);
        inet_pton(AF_INET, ip, &s->sin_addr);
        return sizeof *s;
    }
    struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
    s->sin6_family = AF_INET6;
    s->sin6_port = htons((uint16_t)port);
    inet_pton(AF_INET6, ip, &s->sin6_addr);
    return sizeof *s;
}

/* Listeners of the running test, closed after it even when it fails. */
static int open_fds[64];
static size_t nopen;

static int close_fds(void **state)
{
    (void)state;
    for (size_t i = 0; i < nopen; i++)
        close(open_fds[i]);
    nopen = 0;
    return 0;
}

static int listen_in(int nsfd, int family, const char *ip, int port, int type)
{
    int fd = ns_socket(nsfd, family, type, 0);
    assert_true(fd >= 0);
    if (nopen < sizeof open_fds / sizeof open_fds[0])
        open_fds[nopen++] = fd;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, SOL_IP, IP_FREEBIND, &one, sizeof one);
    struct sockaddr_storage ss;
    socklen_t sl = mkaddr(&ss, family, ip, port);
    if (bind(fd, (struct sockaddr *)&ss, sl) < 0)
        fail_msg("bind %s:%d: %s", ip, port, strerror(errno));
    if (type == SOCK_STREAM)
        assert_int_equal(listen(fd, 16), 0);
    return fd;
}

/* Connect from namespace nsfd (bound to src when not NULL). 0 when connected (*fd_out gets
 * the socket, else closed), else the errno (ETIMEDOUT after timeout_ms); *ms the time taken. */
static int try_connect(int nsfd, int family, const char *src, const char *dst, int port,
                       int timeout_ms, int *fd_out, int *ms)
{
    int fd = ns_socket(nsfd, family, SOCK_STREAM | SOCK_NONBLOCK, 0);
    assert_true(fd >= 0);
    struct sockaddr_storage ss;
    if (src != NULL) {
        socklen_t sl = mkaddr(&ss, family, src, 0);
        assert_int_equal(bind(fd, (struct sockaddr *)&ss, sl), 0);
    }
    socklen_t sl = mkaddr(&ss, family, dst, port);
    uint64_t t0 = now_ms();
    int rc = connect(fd, (struct sockaddr *)&ss, sl);
    if (rc < 0 && errno == EINPROGRESS) {
        struct pollfd pf = {fd, POLLOUT, 0};
        int n = poll(&pf, 1, timeout_ms);
        if (n == 0) {
            rc = ETIMEDOUT;
        } else {
            int e = 0;
            socklen_t el = sizeof e;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
            rc = e;
        }
    } else if (rc < 0) {
        rc = errno;
    }
    if (ms != NULL)
        *ms = (int)(now_ms() - t0);
    if (rc == 0 && fd_out != NULL)
        *fd_out = fd;
    else
        close(fd);
    return rc;
}

/* Accept whatever is pending on a listener (so the backlog stays empty); returns the last
 * accepted socket or -1. */
static int accept_one(int lfd, int timeout_ms)
{
    struct pollfd pf = {lfd, POLLIN, 0};
    if (poll(&pf, 1, timeout_ms) <= 0)
        return -1;
    return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

/* Did anything arrive on fd within timeout_ms? */
static ssize_t recv_within(int fd, char *buf, size_t n, int timeout_ms)
{
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, timeout_ms) <= 0)
        return -1;
    return recv(fd, buf, n, MSG_DONTWAIT);
}

static void udp_send(int nsfd, const char *src, const char *dst, int port, const char *msg)
{
    int fd = ns_socket(nsfd, AF_INET, SOCK_DGRAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_storage ss;
    if (src != NULL) {
        socklen_t sl = mkaddr(&ss, AF_INET, src, 0);
        assert_int_equal(bind(fd, (struct sockaddr *)&ss, sl), 0);
    }
    socklen_t sl = mkaddr(&ss, AF_INET, dst, port);
    sendto(fd, msg, strlen(msg), 0, (struct sockaddr *)&ss, sl);
    close(fd);
}

static void elem4(dsec__nft_elem *e, const char *cidr_ip, uint8_t plen, uint8_t proto, uint16_t lo,
                  uint16_t hi, uint32_t timeout_ms)
{
    memset(e, 0, sizeof *e);
    e->family = AF_INET;
    inet_pton(AF_INET, cidr_ip, e->addr);
    e->prefix = plen;
    e->proto = proto;
    e->port_lo = lo;
    e->port_hi = hi;
    e->timeout_ms = timeout_ms;
}

static void teardown_topology(void)
{
    sh("ip netns del dsect9a 2>/dev/null; ip netns del dsect9b 2>/dev/null; "
       "ip netns del dsect9o 2>/dev/null; ip link del dsvt9000001 2>/dev/null; "
       "ip link del dsvt9000002 2>/dev/null; ip link del dsot9 2>/dev/null; true");
}

static int group_setup(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "test_net_nft: needs root (namespaces, veths, nftables); skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    teardown_topology(); /* leftovers of a killed run */
    if (unshare(CLONE_NEWNET) < 0) {
        fprintf(stderr, "test_net_nft: unshare(CLONE_NEWNET): %s\n", strerror(errno));
        return -1;
    }
    self_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int rc =
        sh("set -e; ip link set lo up\n"
           "echo 1 > /proc/sys/net/ipv4/ip_forward\n"
           "echo 1 > /proc/sys/net/ipv6/conf/all/forwarding\n"
           "for s in a b; do ip netns add dsect9$s; ip -n dsect9$s link set lo up; done\n"
           "ip netns add dsect9o; ip -n dsect9o link set lo up\n"
           "mk() { ns=$1 host=$2 a4=$3 a6=$4\n"
           "  ip link add $host type veth peer name eth0 netns $ns\n"
           "  ip addr add " GW4 "/32 dev $host; ip -6 addr add " GW6 "/128 dev $host nodad\n"
           "  ip link set $host up\n"
           "  ip -n $ns link set eth0 up\n"
           "  ip -n $ns addr add $a4/32 dev eth0; ip -n $ns -6 addr add $a6/128 dev eth0 nodad\n"
           "  ip -n $ns route add " GW4 " dev eth0; ip -n $ns route add default via " GW4 "\n"
           "  ip -n $ns -6 route add " GW6 " dev eth0; ip -n $ns -6 route add default via " GW6 "\n"
           "  ip route add $a4/32 dev $host; ip -6 route add $a6/128 dev $host\n"
           "}\n"
           "mk dsect9a dsvt9000001 " A4 " " A6 "\n"
           "mk dsect9b dsvt9000002 " B4 " fd7e:9::3\n"
           "ip link add dsot9 type veth peer name eth0 netns dsect9o\n"
           "ip addr add " HOST_OUT4 "/24 dev dsot9; ip -6 addr add fd7f:251::1/64 dev dsot9 nodad\n"
           "ip link set dsot9 up; ip -n dsect9o link set eth0 up\n"
           "ip -n dsect9o addr add " OUT4 "/24 dev eth0\n"
           "ip -n dsect9o -6 addr add " OUT6 "/64 dev eth0 nodad\n");
    if (rc < 0) {
        fprintf(stderr, "test_net_nft: building the topology failed\n");
        teardown_topology();
        return -1;
    }
    ns_a = open("/run/netns/dsect9a", O_RDONLY | O_CLOEXEC);
    ns_b = open("/run/netns/dsect9b", O_RDONLY | O_CLOEXEC);
    ns_o = open("/run/netns/dsect9o", O_RDONLY | O_CLOEXEC);
    if (ns_a < 0 || ns_b < 0 || ns_o < 0) {
        teardown_topology();
        return -1;
    }
    root = true;
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (!root)
        return 0;
    dsec__nft_free(nft, true);
    nft = NULL;
    int gone = sh("nft list tables | grep -q " TABLE);
    teardown_topology();
    if (gone == 0) {
        fprintf(stderr, "test_net_nft: the table outlived dsec__nft_free(remove_table)\n");
        return -1;
    }
    return 0;
}

static int need_root(void **state)
{
    (void)state;
    if (!root)
        skip();
    return 0;
}

static void conf_fill(dsec__nft_conf *c, const char *const *deny, size_t ndeny)
{
    memset(c, 0, sizeof *c);
    c->table = TABLE;
    inet_pton(AF_INET, GW4, &c->gw4);
    inet_pton(AF_INET, "100.127.251.0", &c->pool4);
    c->pool4_len = 24;
    c->v6 = true;
    inet_pton(AF_INET6, GW6, &c->gw6);
    inet_pton(AF_INET6, "fd7e:9::", &c->pool6);
    c->pool6_len = 64;
    c->dns_port = DNS_PORT;
    c->masquerade = true;
    c->log_group = LOG_GROUP;
    c->log_rate = 50;
    c->dns_rate = 100;
    c->conn_rate = 200;
    c->deny = deny;
    c->ndeny = ndeny;
}

static void sbx_add(uint32_t idx, const char *ifname, const char *a4, const char *a6,
                    const dsec__nft_elem *e, size_t n)
{
    struct in_addr ia;
    struct in6_addr ia6;
    inet_pton(AF_INET, a4, &ia);
    inet_pton(AF_INET6, a6, &ia6);
    dsec_err err;
    if (dsec__nft_sbx_add(nft, idx, ifname, &ia, &ia6, e, n, &err) < 0)
        fail_msg("sbx_add %u: %s", idx, err.msg);
}

/* Blocked by reject: fails, and at once. */
static void assert_rejected(int nsfd, int family, const char *dst, int port)
{
    int ms = 0;
    int rc = try_connect(nsfd, family, NULL, dst, port, 3000, NULL, &ms);
    if (rc == 0 || rc == ETIMEDOUT || ms > 1000)
        fail_msg("connect to %s port %d: %s after %d ms (want a quick refusal)", dst, port,
                 rc ? strerror(rc) : "connected", ms);
}

/* Blocked by drop: never connects. */
static void assert_dropped(int nsfd, const char *src, const char *dst, int port)
{
    int rc = try_connect(nsfd, AF_INET, src, dst, port, 700, NULL, NULL);
    if (rc == 0)
        fail_msg("connect from %s to %s port %d succeeded", src ? src : "sandbox", dst, port);
}

static void assert_connects(int nsfd, int family, const char *dst, int port, int lfd)
{
    int ms = 0;
    int rc = try_connect(nsfd, family, NULL, dst, port, 3000, NULL, &ms);
    if (rc != 0)
        fail_msg("connect to %s port %d: %s after %d ms", dst, port, strerror(rc), ms);
    int s = accept_one(lfd, 1000);
    assert_true(s >= 0);
    close(s);
}

static void a_sandbox_with_no_entries_reaches_nothing(void **state)
{
    (void)state;
    const char *deny[] = {"203.0.113.0/24", "2001:db8:dead::/48", "100.127.0.0/16"};
    dsec__nft_conf c;
    conf_fill(&c, deny, 3);
    dsec_err err;
    /* a stale table of the same name is replaced */
    assert_int_equal(sh("nft add table inet " TABLE " && nft add chain inet " TABLE " junk"), 0);
    if (dsec__nft_new(&nft, &c, &err) < 0)
        fail_msg("nft_new: %s", err.msg);
    assert_int_not_equal(sh("nft list chain inet " TABLE " junk >/dev/null 2>&1"), 0);
    if (dsec__nft_log_start(nft, on_block, NULL, &err) < 0)
        fail_msg("log_start: %s", err.msg);
    sbx_add(IDX_A, "dsvt9000001", A4, A6, NULL, 0);
    sbx_add(IDX_B, "dsvt9000002", B4, "fd7e:9::3", NULL, 0);
    /* idempotent: adding again (a node re-adopting its sandboxes) is fine */
    sbx_add(IDX_A, "dsvt9000001", A4, A6, NULL, 0);

    int out = listen_in(ns_o, AF_INET, OUT4, 8080, SOCK_STREAM);
    int host_gw = listen_in(self_ns, AF_INET, GW4, 7000, SOCK_STREAM);
    int host_out = listen_in(self_ns, AF_INET, HOST_OUT4, 7000, SOCK_STREAM);
    int in_b = listen_in(ns_b, AF_INET, B4, 7001, SOCK_STREAM);

    assert_rejected(ns_a, AF_INET, OUT4, 8080);
    assert_true(wait_block(IDX_A, AF_INET, OUT4, IPPROTO_TCP, 8080, 2000));
    assert_rejected(ns_a, AF_INET, B4, 7001);
    assert_true(wait_block(IDX_A, AF_INET, B4, IPPROTO_TCP, 7001, 2000));
    assert_rejected(ns_a, AF_INET6, OUT6, 8080);
    assert_true(wait_block(IDX_A, AF_INET6, OUT6, IPPROTO_TCP, 8080, 2000));
    /* the node's own services, on the gateway or on another address of the node */
    assert_dropped(ns_a, NULL, GW4, 7000);
    assert_dropped(ns_a, NULL, HOST_OUT4, 7000);
    assert_true(wait_block(IDX_A, AF_INET, HOST_OUT4, IPPROTO_TCP, 7000, 2000));
    assert_int_equal(accept_one(host_gw, 0), -1);
    assert_int_equal(accept_one(host_out, 0), -1);
    assert_int_equal(accept_one(in_b, 0), -1);
    assert_int_equal(accept_one(out, 0), -1);

    /* DNS on the gateway is the one service a sandbox reaches */
    int dns = listen_in(self_ns, AF_INET, GW4, DNS_PORT, SOCK_DGRAM);
    int other = listen_in(self_ns, AF_INET, GW4, DNS_PORT + 1, SOCK_DGRAM);
    udp_send(ns_a, NULL, GW4, DNS_PORT, "q1");
    udp_send(ns_a, NULL, GW4, DNS_PORT + 1, "q2");
    char buf[64];
    assert_int_equal(recv_within(dns, buf, sizeof buf, 1000), 2);
    assert_memory_equal(buf, "q1", 2);
    assert_int_equal(recv_within(other, buf, sizeof buf, 500), -1);
    /* and so does a TCP DNS connection */
    int dns_tcp = listen_in(self_ns, AF_INET, GW4, DNS_PORT, SOCK_STREAM);
    assert_connects(ns_a, AF_INET, GW4, DNS_PORT, dns_tcp);
    /* and from the node's side, sandbox B is as closed */
    listen_in(ns_o, AF_INET, OUT4, 8081, SOCK_STREAM);
    assert_rejected(ns_b, AF_INET, OUT4, 8081);
    assert_true(wait_block(IDX_B, AF_INET, OUT4, IPPROTO_TCP, 8081, 2000));
}

struct seen {
    int n;
    bool saw;
};

/* ct_cut's keep: keep nothing, note the TCP connection to the outside port 8080. */
static bool keep_none(void *ud, int family, const uint8_t *dst, uint8_t proto, uint16_t dport)
{
    struct seen *s = ud;
    uint8_t o[4];
    inet_pton(AF_INET, OUT4, o);
    s->n++;
    if (family == AF_INET && memcmp(dst, o, 4) == 0 && proto == IPPROTO_TCP && dport == 8080)
        s->saw = true;
    return false;
}

static uint16_t icmp_sum(const struct icmphdr *h)
{
    uint16_t w[4];
    memcpy(w, h, 8);
    uint32_t s = 0;
    for (int i = 0; i < 4; i++)
        s += w[i];
    while (s >> 16)
        s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}

static void entries_allow_expire_and_cut(void **state)
{
    (void)state;
    assert_non_null(nft);
    dsec_err err;
    int out = listen_in(ns_o, AF_INET, OUT4, 8080, SOCK_STREAM);
    int out2 = listen_in(ns_o, AF_INET, OUT4, 8081, SOCK_STREAM);
    int out5 = listen_in(ns_o, AF_INET, OUT4, 8085, SOCK_STREAM);
    int out6 = listen_in(ns_o, AF_INET6, OUT6, 8080, SOCK_STREAM);

    /* a pin opens exactly its port */
    dsec__nft_elem e[3];
    elem4(&e[0], OUT4, 32, IPPROTO_TCP, 8080, 8080, 0);
    if (dsec__nft_sbx_pin(nft, IDX_A, e, 1, &err) < 0)
        fail_msg("pin: %s", err.msg);
    assert_connects(ns_a, AF_INET, OUT4, 8080, out);
    assert_rejected(ns_a, AF_INET, OUT4, 8081);
    /* sandbox B got nothing */
    assert_rejected(ns_b, AF_INET, OUT4, 8080);

    /* a timed pin lives its timeout; a second pin before the end refreshes it */
    elem4(&e[0], OUT4, 32, IPPROTO_TCP, 8081, 8081, 1000);
    assert_int_equal(dsec__nft_sbx_pin(nft, IDX_A, e, 1, &err), 0);
    assert_connects(ns_a, AF_INET, OUT4, 8081, out2);
    msleep(700);
    assert_int_equal(dsec__nft_sbx_pin(nft, IDX_A, e, 1, &err), 0);
    msleep(600);
    assert_connects(ns_a, AF_INET, OUT4, 8081, out2); /* 1300 ms after the first pin */
    msleep(900);
    assert_rejected(ns_a, AF_INET, OUT4, 8081);

    /* overlapping entries: a CIDR with a port range, then pins inside and across it */
    elem4(&e[0], "198.18.251.0", 24, IPPROTO_TCP, 8080, 8081, 0);
    elem4(&e[1], OUT4, 32, IPPROTO_TCP, 8080, 8080, 0); /* inside e[0] */
    elem4(&e[2], OUT4, 32, IPPROTO_UDP, 9000, 9000, 0);
    if (dsec__nft_sbx_replace(nft, IDX_A, e, 3, &err) < 0)
        fail_msg("replace: %s", err.msg);
    assert_connects(ns_a, AF_INET, OUT4, 8081, out2);
    assert_rejected(ns_a, AF_INET, OUT4, 8085);
    elem4(&e[0], OUT4, 32, IPPROTO_TCP, 8081, 8081, 1000); /* covered: no change */
    elem4(&e[1], OUT4, 32, IPPROTO_TCP, 8000, 8090, 1000); /* across the permanent range */
    if (dsec__nft_sbx_pin(nft, IDX_A, e, 2, &err) < 0)
        fail_msg("overlapping pin: %s", err.msg);
    assert_connects(ns_a, AF_INET, OUT4, 8085, out5);
    msleep(1300);
    assert_rejected(ns_a, AF_INET, OUT4, 8085);
    assert_connects(ns_a, AF_INET, OUT4, 8081, out2); /* the permanent part stays */
    assert_connects(ns_a, AF_INET, OUT4, 8080, out);

    /* UDP both ways (the reply comes back through masquerade and conntrack) */
    int echo = listen_in(ns_o, AF_INET, OUT4, 9000, SOCK_DGRAM);
    int u = ns_socket(ns_a, AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_storage ss;
    socklen_t sl = mkaddr(&ss, AF_INET, OUT4, 9000);
    assert_int_equal(sendto(u, "ping", 4, 0, (struct sockaddr *)&ss, sl), 4);
    char buf[64];
    struct sockaddr_storage from;
    socklen_t fl = sizeof from;
    struct pollfd pf = {echo, POLLIN, 0};
    assert_int_equal(poll(&pf, 1, 1000), 1);
    assert_int_equal(recvfrom(echo, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl), 4);
    char fs[64];
    inet_ntop(AF_INET, &((struct sockaddr_in *)&from)->sin_addr, fs, sizeof fs);
    assert_string_equal(fs, HOST_OUT4); /* masqueraded */
    assert_int_equal(sendto(echo, "pong", 4, 0, (struct sockaddr *)&from, fl), 4);
    assert_int_equal(recv_within(u, buf, sizeof buf, 1000), 4);
    close(u);

    /* IPv6 and ICMP entries */
    dsec__nft_elem e6 = {
        .family = AF_INET6, .prefix = 128, .proto = IPPROTO_TCP, .port_lo = 8080, .port_hi = 8080};
    inet_pton(AF_INET6, OUT6, e6.addr);
    assert_int_equal(dsec__nft_sbx_pin(nft, IDX_A, &e6, 1, &err), 0);
    assert_connects(ns_a, AF_INET6, OUT6, 8080, out6);
    int icmp = ns_socket(ns_a, AF_INET, SOCK_RAW, IPPROTO_ICMP);
    assert_true(icmp >= 0);
    struct icmphdr ih = {.type = ICMP_ECHO, .un.echo.id = htons(77), .un.echo.sequence = htons(1)};
    ih.checksum = icmp_sum(&ih);
    sl = mkaddr(&ss, AF_INET, OUT4, 0);
    assert_int_equal(sendto(icmp, &ih, sizeof ih, 0, (struct sockaddr *)&ss, sl), 8);
    bool echoed = false;
    for (uint64_t end = now_ms() + 500; !echoed && now_ms() < end;) {
        ssize_t n = recv_within(icmp, buf, sizeof buf, 100);
        echoed = n >= 28 && buf[20] == ICMP_ECHOREPLY;
    }
    assert_false(echoed);
    assert_true(wait_block(IDX_A, AF_INET, OUT4, IPPROTO_ICMP, 0, 2000));
    dsec__nft_elem ei;
    elem4(&ei, OUT4, 32, IPPROTO_ICMP, 0, 0, 0);
    assert_int_equal(dsec__nft_sbx_pin(nft, IDX_A, &ei, 1, &err), 0);
    assert_int_equal(sendto(icmp, &ih, sizeof ih, 0, (struct sockaddr *)&ss, sl), 8);
    for (uint64_t end = now_ms() + 1000; !echoed && now_ms() < end;) {
        ssize_t n = recv_within(icmp, buf, sizeof buf, 100);
        echoed = n >= 28 && buf[20] == ICMP_ECHOREPLY;
    }
    assert_true(echoed);
    close(icmp);

    /* replacing the entries cuts a connection already open */
    elem4(&e[0], OUT4, 32, IPPROTO_TCP, 8080, 8080, 0);
    assert_int_equal(dsec__nft_sbx_replace(nft, IDX_A, e, 1, &err), 0);
    int cfd = -1;
    assert_int_equal(try_connect(ns_a, AF_INET, NULL, OUT4, 8080, 2000, &cfd, NULL), 0);
    int sfd = accept_one(out, 1000);
    assert_true(sfd >= 0);
    assert_int_equal(send(cfd, "a", 1, 0), 1);
    assert_int_equal(recv_within(sfd, buf, sizeof buf, 1000), 1);
    assert_int_equal(dsec__nft_sbx_replace(nft, IDX_A, NULL, 0, &err), 0);
    assert_rejected(ns_a, AF_INET, OUT4, 8080);
    send(cfd, "b", 1, MSG_DONTWAIT);
    assert_int_equal(recv_within(sfd, buf, sizeof buf, 600), -1);
    /* ct_cut finds the connection and forgets it: nothing comes back in either */
    struct seen seen = {0, false};
    uint8_t src[4];
    inet_pton(AF_INET, A4, src);
    if (dsec__nft_ct_cut(AF_INET, src, keep_none, &seen, &err) < 0)
        fail_msg("ct_cut: %s", err.msg);
    assert_true(seen.saw);
    seen.saw = false;
    assert_int_equal(dsec__nft_ct_cut(AF_INET, src, keep_none, &seen, &err), 0);
    assert_false(seen.saw);
    send(sfd, "c", 1, MSG_DONTWAIT);
    assert_int_equal(recv_within(cfd, buf, sizeof buf, 600), -1);
    close(cfd);
    close(sfd);
}

static void a_spoofed_source_is_dropped(void **state)
{
    (void)state;
    assert_non_null(nft);
    dsec_err err;
    dsec__nft_elem e;
    elem4(&e, OUT4, 32, IPPROTO_TCP, 8080, 8080, 0);
    assert_int_equal(dsec__nft_sbx_replace(nft, IDX_A, &e, 1, &err), 0);
    assert_int_equal(sh("ip -n dsect9a addr add 100.127.251.50/32 dev eth0"), 0);
    int out = listen_in(ns_o, AF_INET, OUT4, 8080, SOCK_STREAM);
    int dns = listen_in(self_ns, AF_INET, GW4, DNS_PORT, SOCK_DGRAM);
    assert_connects(ns_a, AF_INET, OUT4, 8080, out); /* the real address passes */
    assert_dropped(ns_a, "100.127.251.50", OUT4, 8080);
    assert_dropped(ns_a, "100.127.251.50", GW4, DNS_PORT);
    udp_send(ns_a, "100.127.251.50", GW4, DNS_PORT, "spoof");
    char buf[16];
    assert_int_equal(recv_within(dns, buf, sizeof buf, 500), -1);
    assert_int_equal(accept_one(out, 0), -1);
    sh("ip -n dsect9a addr del 100.127.251.50/32 dev eth0");
}

static char *nft_json(void)
{
    FILE *p = popen("nft -j list ruleset 2>&1", "r");
    assert_non_null(p);
    size_t cap = 1 << 20, n = 0;
    char *s = dsec_malloc(cap);
    assert_non_null(s);
    size_t r;
    while ((r = fread(s + n, 1, cap - 1 - n, p)) > 0)
        n += r;
    s[n] = 0;
    pclose(p);
    return s;
}

static void removing_a_sandbox_removes_its_pieces(void **state)
{
    (void)state;
    assert_non_null(nft);
    dsec_err err;
    char *j = nft_json();
    if (strstr(j, "\"dsvt9000001\"") == NULL)
        fprintf(stderr, "nft -j list ruleset: %.600s\n", j);
    assert_non_null(strstr(j, "\"s_1\""));
    assert_non_null(strstr(j, "\"a_1\""));
    assert_non_null(strstr(j, "\"dsvt9000001\""));
    dsec_free(j);
    struct in_addr a4;
    inet_pton(AF_INET, A4, &a4);
    if (dsec__nft_sbx_del(nft, IDX_A, "dsvt9000001", &a4, NULL, &err) < 0)
        fail_msg("sbx_del: %s", err.msg);
    /* again: missing pieces are not an error */
    assert_int_equal(dsec__nft_sbx_del(nft, IDX_A, "dsvt9000001", &a4, NULL, &err), 0);
    j = nft_json();
    assert_null(strstr(j, "\"s_1\""));
    assert_null(strstr(j, "\"a_1\""));
    assert_null(strstr(j, "\"dsvt9000001\""));
    assert_non_null(strstr(j, "\"s_2\""));
    dsec_free(j);
    /* a veth no longer in the table sends nothing at all */
    int out = listen_in(ns_o, AF_INET, OUT4, 8080, SOCK_STREAM);
    assert_dropped(ns_a, NULL, OUT4, 8080);
    assert_int_equal(accept_one(out, 0), -1);
    dsec__nft_elem e;
    elem4(&e, OUT4, 32, IPPROTO_TCP, 8080, 8080, 0);
    assert_int_equal(dsec__nft_sbx_pin(nft, IDX_A, &e, 1, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
}

static void bad_input_gets_clear_errors(void **state)
{
    (void)state;
    assert_non_null(nft);
    dsec_err err;
    struct in_addr a4;
    inet_pton(AF_INET, "100.127.251.9", &a4);
    dsec__nft_elem e;
    elem4(&e, OUT4, 33, IPPROTO_TCP, 1, 2, 0);
    assert_int_equal(dsec__nft_sbx_add(nft, 9, "dsvt9000009", &a4, NULL, &e, 1, &err), -1);
    assert_non_null(strstr(err.msg, "prefix /33"));
    elem4(&e, OUT4, 32, 47, 1, 2, 0);
    assert_int_equal(dsec__nft_sbx_add(nft, 9, "dsvt9000009", &a4, NULL, &e, 1, &err), -1);
    assert_non_null(strstr(err.msg, "protocol 47"));
    elem4(&e, OUT4, 32, IPPROTO_TCP, 9, 2, 0);
    assert_int_equal(dsec__nft_sbx_add(nft, 9, "dsvt9000009", &a4, NULL, &e, 1, &err), -1);
    assert_non_null(strstr(err.msg, "port range 9-2"));
    elem4(&e, OUT4, 32, IPPROTO_ICMPV6, 0, 0, 0);
    assert_int_equal(dsec__nft_sbx_add(nft, 9, "dsvt9000009", &a4, NULL, &e, 1, &err), -1);
    assert_non_null(strstr(err.msg, "ICMPv6 is not a protocol of IPv4"));
    assert_int_equal(dsec__nft_sbx_add(nft, 9, "a-much-too-long-name", &a4, NULL, NULL, 0, &err),
                     -1);
    assert_non_null(strstr(err.msg, "a-much-too-long-name"));
    assert_int_equal(dsec__nft_sbx_replace(nft, 12345, NULL, 0, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    /* nothing of sandbox 9 was made */
    char *j = nft_json();
    assert_null(strstr(j, "\"s_9\""));
    dsec_free(j);

    dsec__nft *t2 = NULL;
    const char *deny[] = {"10.0.0.0/99"};
    dsec__nft_conf c;
    conf_fill(&c, deny, 1);
    c.table = "dsec_t9bad";
    assert_int_equal(dsec__nft_new(&t2, &c, &err), -1);
    assert_int_equal(err.code, DSEC_E_CONFIG);
    assert_non_null(strstr(err.msg, "10.0.0.0/99"));
    assert_null(t2);
    /* the NFLOG group is taken by our reader */
    conf_fill(&c, NULL, 0);
    c.table = "dsec_t9two";
    assert_int_equal(dsec__nft_new(&t2, &c, &err), 0);
    assert_int_equal(dsec__nft_log_start(t2, on_block, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "NFLOG group"));
    dsec__nft_free(t2, true);
    assert_int_not_equal(sh("nft list tables | grep -q dsec_t9two"), 0);
}

struct churn {
    int id;
    int failures;
    char msg[DSEC_ERR_MSG_MAX];
};

/* One thread's sandboxes: add, pin, replace, delete, over and over. */
static void *churn_main(void *arg)
{
    struct churn *c = arg;
    for (int i = 0; i < 40; i++) {
        uint32_t idx = 0x5000u + (uint32_t)c->id * 100u + (uint32_t)i;
        char ifn[16];
        snprintf(ifn, sizeof ifn, "dsvt9c%d_%d", c->id, i);
        struct in_addr a4 = {htonl(0x647f4000u + idx)};
        dsec__nft_elem e[2];
        elem4(&e[0], "192.0.2.0", 24, IPPROTO_TCP, 443, 443, 0);
        elem4(&e[1], "192.0.2.9", 32, IPPROTO_TCP, 400, 500, 2000);
        dsec_err err;
        if (dsec__nft_sbx_add(nft, idx, ifn, &a4, NULL, e, 1, &err) < 0 ||
            dsec__nft_sbx_pin(nft, idx, &e[1], 1, &err) < 0 ||
            dsec__nft_sbx_pin(nft, idx, &e[1], 1, &err) < 0 ||
            dsec__nft_sbx_replace(nft, idx, e, 2, &err) < 0 ||
            dsec__nft_sbx_del(nft, idx, ifn, &a4, NULL, &err) < 0) {
            c->failures++;
            snprintf(c->msg, sizeof c->msg, "%s", err.msg);
        }
    }
    return NULL;
}

static void concurrent_calls_for_different_sandboxes(void **state)
{
    (void)state;
    assert_non_null(nft);
    pthread_t th[4];
    struct churn c[4];
    for (int i = 0; i < 4; i++) {
        c[i] = (struct churn){.id = i};
        assert_int_equal(pthread_create(&th[i], NULL, churn_main, &c[i]), 0);
    }
    /* meanwhile the resolver's pins for a sandbox that stays */
    dsec_err err;
    for (int i = 0; i < 40; i++) {
        dsec__nft_elem e;
        elem4(&e, "192.0.2.0", 32, IPPROTO_UDP, (uint16_t)(1000 + i), (uint16_t)(1000 + i), 5000);
        e.addr[3] = (uint8_t)i;
        assert_int_equal(dsec__nft_sbx_pin(nft, IDX_B, &e, 1, &err), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        if (c[i].failures)
            fail_msg("thread %d: %d failures, last: %s", i, c[i].failures, c[i].msg);
    }
    char *j = nft_json();
    assert_null(strstr(j, "dsvt9c"));
    assert_null(strstr(j, "\"s_50"));
    dsec_free(j);
}

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double p50(double *v, size_t n)
{
    qsort(v, n, sizeof *v, dcmp);
    return v[n / 2];
}

static void five_entries(dsec__nft_elem *e, uint32_t i)
{
    char ip[32];
    snprintf(ip, sizeof ip, "203.0.%u.%u", (i >> 8) & 0xff, i & 0xff);
    elem4(&e[0], "198.51.100.0", 24, IPPROTO_TCP, 443, 443, 0);
    elem4(&e[1], "198.51.100.0", 24, IPPROTO_TCP, 80, 80, 0);
    elem4(&e[2], ip, 32, IPPROTO_TCP, 1000, 2000, 0);
    elem4(&e[3], "192.0.2.53", 32, IPPROTO_UDP, 53, 53, 0);
    elem4(&e[4], "192.0.2.0", 24, IPPROTO_ICMP, 0, 0, 0);
}

static void scale_3200_sandboxes(void **state)
{
    (void)state;
    assert_non_null(nft);
    dsec_err err;
    enum { N = 3200, CYCLES = 200 };
    static double add_us[N], cyc_add[CYCLES], cyc_del[CYCLES], cyc_pin[CYCLES];
    dsec__nft_elem e[5];
    double t0 = now_us();
    for (uint32_t i = 0; i < N; i++) {
        char ifn[16];
        snprintf(ifn, sizeof ifn, "dsvt9p%05x", i);
        struct in_addr a4 = {htonl(0x647f0000u + 0x100u + i)};
        struct in6_addr a6;
        inet_pton(AF_INET6, "fd7e:9::1:0", &a6);
        a6.s6_addr[14] = (uint8_t)(i >> 8);
        a6.s6_addr[15] = (uint8_t)i;
        five_entries(e, i);
        double s = now_us();
        if (dsec__nft_sbx_add(nft, 0x10000 + i, ifn, &a4, &a6, e, 5, &err) < 0)
            fail_msg("sbx_add #%u: %s", i, err.msg);
        add_us[i] = now_us() - s;
    }
    double fill_s = (now_us() - t0) / 1e6;
    double first = p50(add_us, 100), last;
    /* the last hundred, at close to full size */
    last = p50(add_us + N - 100, 100);
    for (uint32_t k = 0; k < CYCLES; k++) {
        uint32_t idx = 0x20000 + k;
        struct in_addr a4 = {htonl(0x647f8000u + k)};
        five_entries(e, k);
        double s = now_us();
        if (dsec__nft_sbx_add(nft, idx, "dsvt9cycle", &a4, NULL, e, 5, &err) < 0)
            fail_msg("sbx_add cycle %u: %s", k, err.msg);
        cyc_add[k] = now_us() - s;
        dsec__nft_elem pin;
        elem4(&pin, "192.0.2.77", 32, IPPROTO_TCP, 443, 443, 30000);
        s = now_us();
        assert_int_equal(dsec__nft_sbx_pin(nft, idx, &pin, 1, &err), 0);
        cyc_pin[k] = now_us() - s;
        s = now_us();
        if (dsec__nft_sbx_del(nft, idx, "dsvt9cycle", &a4, NULL, &err) < 0)
            fail_msg("sbx_del cycle %u: %s", k, err.msg);
        cyc_del[k] = now_us() - s;
    }
    printf("nft scale: filled %d sandboxes (5 entries each) in %.2f s; sbx_add p50 %.0f us for "
           "the first 100, %.0f us for the last 100\n",
           N, fill_s, first, last);
    printf("nft scale: at %d sandboxes, over %d cycles: sbx_add p50 %.0f us, sbx_pin p50 %.0f "
           "us, sbx_del p50 %.0f us\n",
           N, CYCLES, p50(cyc_add, CYCLES), p50(cyc_pin, CYCLES), p50(cyc_del, CYCLES));
    fflush(stdout);

    /* still correct at that size: sandbox B opens with an entry and A-less traffic stays shut */
    int out = listen_in(ns_o, AF_INET, OUT4, 8090, SOCK_STREAM);
    assert_rejected(ns_b, AF_INET, OUT4, 8090);
    elem4(&e[0], OUT4, 32, IPPROTO_TCP, 8090, 8090, 0);
    assert_int_equal(dsec__nft_sbx_pin(nft, IDX_B, e, 1, &err), 0);
    assert_connects(ns_b, AF_INET, OUT4, 8090, out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(a_sandbox_with_no_entries_reaches_nothing, need_root,
                                        close_fds),
        cmocka_unit_test_setup_teardown(entries_allow_expire_and_cut, need_root, close_fds),
        cmocka_unit_test_setup_teardown(a_spoofed_source_is_dropped, need_root, close_fds),
        cmocka_unit_test_setup_teardown(removing_a_sandbox_removes_its_pieces, need_root,
                                        close_fds),
        cmocka_unit_test_setup_teardown(bad_input_gets_clear_errors, need_root, close_fds),
        cmocka_unit_test_setup_teardown(concurrent_calls_for_different_sandboxes, need_root,
                                        close_fds),
        cmocka_unit_test_setup_teardown(scale_3200_sandboxes, need_root, close_fds),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
