/* netpolicy.c - `make bench S=netpolicy`: what network containment costs: policy setup per sandbox,
 * the resolver's query rate, and TCP connect latency with 3,200 sandboxes' policies loaded. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends/net/net.h"
#include "dsec/alloc.h"

#define OUT_NS "dsecbench-out"
#define OUT_IF "dsbo0"
#define UPSTREAM_PORT 5399

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double p50_us(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_u64);
    return (double)v[n / 2] / 1000.0;
}

static double p99_us(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_u64);
    return (double)v[n * 99 / 100] / 1000.0;
}

static void sh(const char *cmd)
{
    if (system(cmd) != 0)
        fprintf(stderr, "bench netpolicy: `%s` failed\n", cmd);
}

static void outside_down(void)
{
    sh("ip netns del " OUT_NS " 2>/dev/null; ip link del " OUT_IF " 2>/dev/null; true");
}

/* ---- a fake upstream resolver: every A query gets 198.18.99.2 ------------------------------ */

static int up_fd = -1;
static atomic_bool stopping;

static void *upstream_main(void *arg)
{
    (void)arg;
    uint8_t pkt[1500];
    while (!stopping) {
        struct sockaddr_storage peer;
        socklen_t pl = sizeof peer;
        ssize_t n = recvfrom(up_fd, pkt, sizeof pkt - 32, 0, (struct sockaddr *)&peer, &pl);
        if (n < 17)
            continue;
        size_t off = 12;
        while (off < (size_t)n && pkt[off] != 0)
            off += 1u + pkt[off];
        off += 5; /* root label, qtype, qclass */
        if (off > (size_t)n)
            continue;
        pkt[2] = 0x81;
        pkt[3] = 0x80;
        pkt[6] = 0;
        pkt[7] = 1; /* one answer */
        pkt[8] = pkt[9] = pkt[10] = pkt[11] = 0;
        static const uint8_t ans[] = {0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 198, 18, 99, 2};
        memcpy(pkt + off, ans, sizeof ans);
        sendto(up_fd, pkt, off + sizeof ans, 0, (struct sockaddr *)&peer, pl);
    }
    return NULL;
}

/* ---- the outside: a TCP listener in its own namespace ------------------------------------- */

static int out_listener = -1;

static void *outside_accept(void *arg)
{
    (void)arg;
    while (!stopping) {
        int c = accept(out_listener, NULL, NULL);
        if (c < 0)
            continue;
        close(c);
    }
    return NULL;
}

static int enter_ns(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = setns(fd, CLONE_NEWNET);
    close(fd);
    return rc;
}

/* TCP connects from inside netns to 198.18.99.2:8080, n of them; latencies into v. */
struct connect_job {
    const char *netns;
    uint64_t *v;
    size_t n;
    int failed;
};

static void *connect_main(void *arg)
{
    struct connect_job *j = arg;
    if (enter_ns(j->netns) < 0) {
        j->failed = (int)j->n;
        return NULL;
    }
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(8080)};
    inet_pton(AF_INET, "198.18.99.2", &to.sin_addr);
    for (size_t i = 0; i < j->n; i++) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct linger lg = {1, 0}; /* RST on close: no TIME_WAIT pile-up across thousands */
        setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        uint64_t t0 = now_ns();
        if (connect(s, (struct sockaddr *)&to, sizeof to) < 0)
            j->failed++;
        j->v[i] = now_ns() - t0;
        close(s);
    }
    return NULL;
}

static int connect_p50(const char *netns, size_t n, double *p50, double *p99)
{
    struct connect_job j = {.netns = netns, .n = n, .v = dsec_calloc(n, sizeof(uint64_t))};
    pthread_t t;
    pthread_create(&t, NULL, connect_main, &j);
    pthread_join(t, NULL);
    if (j.failed) {
        fprintf(stderr, "bench netpolicy: %d of %zu connects failed\n", j.failed, n);
        dsec_free(j.v);
        return -1;
    }
    *p50 = p50_us(j.v, n);
    *p99 = p99_us(j.v, n);
    dsec_free(j.v);
    return 0;
}

/* DNS queries from inside netns to the resolver, window in flight, for secs. */
struct dns_job {
    const char *netns;
    struct sockaddr_in to;
    const char *name;
    bool fresh; /* a name of its own per query (f<n>.name): every one misses the resolver's cache */
    double secs;
    uint64_t answered, sent;
};

static size_t build_query(uint8_t *q, uint16_t id, const char *name)
{
    memset(q, 0, 12);
    q[0] = (uint8_t)(id >> 8);
    q[1] = (uint8_t)id;
    q[2] = 0x01;
    q[5] = 1;
    size_t off = 12;
    while (*name) {
        const char *dot = strchr(name, '.');
        size_t l = dot ? (size_t)(dot - name) : strlen(name);
        q[off++] = (uint8_t)l;
        memcpy(q + off, name, l);
        off += l;
        name += l + (dot ? 1 : 0);
    }
    q[off++] = 0;
    q[off++] = 0;
    q[off++] = 1;
    q[off++] = 0;
    q[off++] = 1;
    return off;
}

static void *dns_main(void *arg)
{
    struct dns_job *j = arg;
    if (j->netns && enter_ns(j->netns) < 0)
        return NULL;
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    connect(s, (struct sockaddr *)&j->to, sizeof j->to);
    struct timeval tv = {0, 200000};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t q[300], r[1500];
    uint64_t end = now_ns() + (uint64_t)(j->secs * 1e9);
    int inflight = 0;
    uint16_t id = 1;
    uint32_t nth = 0;
    char fresh[200];
    while (now_ns() < end) {
        while (inflight < 32) {
            if (j->fresh)
                snprintf(fresh, sizeof fresh, "f%u.%s", nth++, j->name);
            size_t len = build_query(q, id++, j->fresh ? fresh : j->name);
            if (send(s, q, len, 0) > 0) {
                inflight++;
                j->sent++;
            }
        }
        ssize_t n = recv(s, r, sizeof r, 0);
        if (n > 0) {
            j->answered++;
            inflight--;
        } else {
            inflight = 0; /* lost ones: refill the window */
        }
    }
    close(s);
    return NULL;
}

static double dns_qps(const char *netns, const struct sockaddr_in *to, const char *name, bool fresh,
                      double secs)
{
    struct dns_job j = {.netns = netns, .to = *to, .name = name, .fresh = fresh, .secs = secs};
    pthread_t t;
    pthread_create(&t, NULL, dns_main, &j);
    pthread_join(t, NULL);
    return (double)j.answered / secs;
}

/* The baseline of policy setup: what a sandbox gets without containment, an
 * empty network namespace of its own (crun's default). */
static uint64_t empty_netns_ns(const char *path)
{
    uint64_t t0 = now_ns();
    int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    int fd = open(path, O_CREAT | O_EXCL | O_RDONLY | O_CLOEXEC, 0600);
    if (fd >= 0)
        close(fd);
    if (unshare(CLONE_NEWNET) == 0) {
        mount("/proc/thread-self/ns/net", path, NULL, MS_BIND, NULL);
        setns(self, CLONE_NEWNET);
    }
    close(self);
    uint64_t dt = now_ns() - t0;
    umount2(path, MNT_DETACH);
    unlink(path);
    return dt;
}

int main(void)
{
    /* DSEC_BENCH_LOADED: fewer (or more) sandboxes loaded, for a quick look */
    const char *lenv = getenv("DSEC_BENCH_LOADED");
    size_t LOADED = lenv && atoi(lenv) > 200 ? (size_t)atoi(lenv) : 3200;
    if (geteuid() != 0) {
        fprintf(stderr, "bench netpolicy: needs root (namespaces, nftables)\n");
        return 2;
    }
    char dir[] = "/tmp/dsec-bench-net-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    outside_down();
    sh("ip netns add " OUT_NS " && ip link add " OUT_IF " type veth peer name eth0 netns " OUT_NS
       " && ip addr add 198.18.99.1/24 dev " OUT_IF " && ip link set " OUT_IF " up"
       " && ip -n " OUT_NS " link set lo up && ip -n " OUT_NS " link set eth0 up"
       " && ip -n " OUT_NS " addr add 198.18.99.2/24 dev eth0"
       " && ip -n " OUT_NS " route add default via 198.18.99.1");

    /* upstream resolver on loopback; the outside listener in its namespace */
    up_fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in ua = {.sin_family = AF_INET, .sin_port = htons(UPSTREAM_PORT)};
    inet_pton(AF_INET, "127.0.0.1", &ua.sin_addr);
    struct timeval tv = {0, 100000};
    setsockopt(up_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (bind(up_fd, (struct sockaddr *)&ua, sizeof ua) < 0) {
        perror("bench netpolicy: upstream bind");
        return 1;
    }
    pthread_t up_t, out_t;
    pthread_create(&up_t, NULL, upstream_main, NULL);
    {
        int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
        if (enter_ns("/run/netns/" OUT_NS) < 0) {
            perror("bench netpolicy: entering the outside namespace");
            return 1;
        }
        out_listener = socket(AF_INET, SOCK_STREAM, 0);
        setns(self, CLONE_NEWNET);
        close(self);
        struct sockaddr_in oa = {.sin_family = AF_INET, .sin_port = htons(8080)};
        inet_pton(AF_INET, "198.18.99.2", &oa.sin_addr);
        if (bind(out_listener, (struct sockaddr *)&oa, sizeof oa) < 0 ||
            listen(out_listener, 1024) < 0) {
            perror("bench netpolicy: outside listener");
            return 1;
        }
        struct timeval atv = {0, 200000};
        setsockopt(out_listener, SOL_SOCKET, SO_RCVTIMEO, &atv, sizeof atv);
        pthread_create(&out_t, NULL, outside_accept, NULL);
    }

    static const char *const ups[] = {"127.0.0.1:5399"};
    dsec_net_conf nc = {.state_dir = dir,
                        .tag = 254,
                        .upstream = ups,
                        .nupstream = 1,
                        /* IPv6 as the cell's default has it (off); NET_BENCH_V6=1 turns it on */
                        .pool6 = getenv("NET_BENCH_V6") ? NULL : "",
                        .masquerade = true,
                        .dns_qps = 1000000, /* the kernel and per-sandbox limits out of the way:
                                               this measures the resolver */
                        .conn_rate = 1000000};
    dsec_net *net = NULL;
    dsec_err err;
    if (dsec_net_new(&net, &nc, &err) < 0) {
        fprintf(stderr, "bench netpolicy: %s\n", err.msg);
        return 1;
    }
    static const char *const pol[] = {"198.18.99.2:8080/tcp", "*.allowed.test:443/tcp",
                                      "pkg.example.org:443/tcp", "203.0.113.0/24:80/tcp",
                                      "[2001:db8::/32]:443/tcp"};
    const size_t npol = sizeof pol / sizeof pol[0];
    dsec_net_sbx **sb = dsec_calloc(LOADED + 256, sizeof *sb);
    size_t nsb = 0;
    char id[64];
    int rc = 1;

    /* 1. connect latency with one policy loaded, then the same with 3,200 */
    snprintf(id, sizeof id, "probe");
    if (dsec_net_attach(net, id, "bench", pol, npol, &sb[nsb++], &err) < 0) {
        fprintf(stderr, "bench netpolicy: %s\n", err.msg);
        goto out;
    }
    const char *probe_ns = dsec_net_sbx_netns(sb[0]);
    double c_empty, c_empty99, c_full, c_full99;
    if (connect_p50(probe_ns, 200, &c_empty, &c_empty99) < 0 || /* warm-up */
        connect_p50(probe_ns, 3000, &c_empty, &c_empty99) < 0)
        goto out;
    fprintf(stderr, "connect with 1 policy: p50 %.1f us, p99 %.1f us\n", c_empty, c_empty99);

    /* 2. policy setup: attach (namespace, veth, addresses, rules) against an empty namespace */
    uint64_t *att = dsec_calloc(LOADED, sizeof(uint64_t)),
             *base = dsec_calloc(200, sizeof(uint64_t));
    for (size_t i = 0; i < 200; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/empty-%zu", dir, i);
        base[i] = empty_netns_ns(p);
    }
    double base_p50 = p50_us(base, 200);
    uint64_t t_load = now_ns();
    for (size_t i = 1; i < LOADED; i++) {
        snprintf(id, sizeof id, "sbx-%zu", i);
        uint64_t t0 = now_ns();
        if (dsec_net_attach(net, id, "bench", pol, npol, &sb[nsb], &err) < 0) {
            fprintf(stderr, "bench netpolicy: sandbox %zu: %s\n", i, err.msg);
            goto out;
        }
        att[i - 1] = now_ns() - t0;
        nsb++;
        if (i % 400 == 0)
            fprintf(stderr, "  %zu sandboxes attached (%.1f s)\n", i,
                    (double)(now_ns() - t_load) / 1e9);
    }
    double att_first = p50_us(att, 200);
    double att_p50 = p50_us(att, LOADED - 1);
    /* setup at full load: 200 more attached one after another (then removed), and 200
     * attach+detach cycles, where each destroy's kernel work (the veth waits for other CPUs
     * to drop it, the namespace is torn down in a worker) competes with the next create */
    uint64_t at_full[200], churn[200];
    dsec_net_sbx *more[200];
    for (size_t i = 0; i < 200; i++) {
        snprintf(id, sizeof id, "more-%zu", i);
        uint64_t t0 = now_ns();
        if (dsec_net_attach(net, id, "bench", pol, npol, &more[i], &err) < 0) {
            fprintf(stderr, "bench netpolicy: %s\n", err.msg);
            goto out;
        }
        at_full[i] = now_ns() - t0;
    }
    for (size_t i = 0; i < 200; i++)
        dsec_net_detach(more[i], &err);
    for (size_t i = 0; i < 200; i++) {
        dsec_net_sbx *x;
        snprintf(id, sizeof id, "extra-%zu", i);
        uint64_t t0 = now_ns();
        if (dsec_net_attach(net, id, "bench", pol, npol, &x, &err) < 0) {
            fprintf(stderr, "bench netpolicy: %s\n", err.msg);
            goto out;
        }
        churn[i] = now_ns() - t0;
        dsec_net_detach(x, &err);
    }
    double churn_p50 = p50_us(churn, 200);
    double full_p50 = p50_us(at_full, 200);
    fprintf(stderr,
            "policy setup: attach p50 %.1f us (first 200), %.1f us (all %zu), %.1f us at "
            "%zu loaded, %.1f us at %zu loaded between destroys; empty netns p50 %.1f us\n",
            att_first, att_p50, LOADED, full_p50, LOADED, churn_p50, LOADED, base_p50);

    if (connect_p50(probe_ns, 3000, &c_full, &c_full99) < 0)
        goto out;
    fprintf(stderr, "connect with %zu policies: p50 %.1f us, p99 %.1f us\n", LOADED, c_full,
            c_full99);
    /* and the empty case again, after, for the noise between runs */
    for (size_t i = 1; i < nsb; i++)
        dsec_net_detach(sb[i], &err);
    nsb = 1;
    double c_empty2, c_empty2_99;
    if (connect_p50(probe_ns, 3000, &c_empty2, &c_empty2_99) < 0)
        goto out;
    fprintf(stderr, "connect with 1 policy again: p50 %.1f us\n", c_empty2);
    double c_base = (c_empty + c_empty2) / 2;

    /* 3. the resolver: allowed names (forwarded: a new name each, answered, pinned), one
     * allowed name again and again (answered from the cache, pinned) and refused ones,
     * against the upstream asked directly */
    struct sockaddr_in gw = {.sin_family = AF_INET, .sin_port = htons(53)};
    inet_pton(AF_INET, dsec_net_sbx_resolver(sb[0]), &gw.sin_addr);
    double raw = dns_qps(NULL, &ua, "x.allowed.test", true, 3.0);
    double allowed = dns_qps(probe_ns, &gw, "x.allowed.test", true, 3.0);
    double cached = dns_qps(probe_ns, &gw, "x.allowed.test", false, 3.0);
    double refused = dns_qps(probe_ns, &gw, "q.exfil.example", false, 3.0);
    fprintf(stderr,
            "dns: %.0f allowed queries/s forwarded, %.0f/s from the cache, %.0f refused/s; "
            "upstream asked directly %.0f/s\n",
            allowed, cached, refused, raw);

    printf("{\"scenario\":\"netpolicy\",\"loaded\":%zu,\"ipv6\":%s,\"policy_setup_p50_ms\":%.3f,"
           "\"policy_setup_p50_ms_at_3200\":%.3f,"
           "\"policy_setup_p50_ms_at_3200_between_destroys\":%.3f,"
           "\"empty_netns_p50_ms\":%.3f,\"attach_p50_ms\":%.3f,"
           "\"dns_qps\":%.0f,\"dns_cached_qps\":%.0f,\"dns_refused_qps\":%.0f,"
           "\"dns_upstream_raw_qps\":%.0f,"
           "\"connect_p50_us_3200\":%.1f,\"connect_p50_us_empty\":%.1f,"
           "\"connect_p99_us_3200\":%.1f,\"connect_p99_us_empty\":%.1f}\n",
           LOADED, getenv("NET_BENCH_V6") ? "true" : "false", (att_p50 - base_p50) / 1000.0,
           (full_p50 - base_p50) / 1000.0, (churn_p50 - base_p50) / 1000.0, base_p50 / 1000.0,
           att_p50 / 1000.0, allowed, cached, refused, raw, c_full, c_base, c_full99, c_empty99);
    rc = 0;
out:
    for (size_t i = 0; i < nsb; i++)
        dsec_net_detach(sb[i], &err);
    dsec_net_free(net, false);
    stopping = true;
    shutdown(out_listener, SHUT_RDWR);
    close(out_listener);
    pthread_join(out_t, NULL);
    pthread_join(up_t, NULL);
    close(up_fd);
    outside_down();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    sh(cmd);
    return rc;
}
