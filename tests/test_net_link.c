/* test_net_link.c - a sandbox's network plumbing for real (root): namespaces, veths, addresses,
 * routes, traffic to the gateway, cleanup on failure, concurrent creates, create/destroy cost. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
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
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/net/net-int.h"
#include "dsec/alloc.h"
#include "dsec/err.h"

/*
 * Every name here starts with dsvtest and every address comes from
 * 100.127.250.0/24 (gateway .1) and fd7f:d5ec:0:fa::/64 (gateway ::1); netns
 * files live in a private temporary directory. The sweep at the start and
 * the end removes all of them, so a failed run leaves nothing behind.
 */

#define PREFIX "dsvtest"
#define IDX_A 2
#define IDX_B 3

static bool root;
static bool have_v6;
static char dir[64];

static void spec_for(dsec__net_link_spec *s, unsigned idx, char *path, size_t plen, char *name,
                     size_t nlen)
{
    memset(s, 0, sizeof *s);
    snprintf(name, nlen, PREFIX "%04x", idx);
    snprintf(path, plen, "%s/ns%04x", dir, idx);
    s->netns_path = path;
    s->host_if = name;
    inet_pton(AF_INET, "100.127.250.1", &s->gw4);
    s->addr4.s_addr = htonl(0x647ffa00u | (idx & 0xff)); /* 100.127.250.idx */
    s->v6 = have_v6;
    inet_pton(AF_INET6, "fd7f:d5ec:0:fa::1", &s->gw6);
    inet_pton(AF_INET6, "fd7f:d5ec:0:fa::", &s->addr6);
    s->addr6.s6_addr[14] = (uint8_t)(idx >> 8);
    s->addr6.s6_addr[15] = (uint8_t)idx;
}

static void sweep(void)
{
    char **v = NULL;
    size_t n = 0;
    dsec_err err;
    if (dsec__net_link_list(PREFIX, &v, &n, &err) == 0) {
        for (size_t i = 0; i < n; i++)
            dsec__net_link_destroy(NULL, v[i], &err);
        dsec__net_strv_free(v, n);
    }
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char p[sizeof dir + sizeof e->d_name + 1];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        umount2(p, MNT_DETACH);
        unlink(p);
    }
    closedir(d);
}

static ino_t own_netns(void)
{
    struct stat st;
    if (stat("/proc/thread-self/ns/net", &st) < 0)
        return 0;
    return st.st_ino;
}

static bool exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

static int group_setup(void **state)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_net_link: needs root (namespaces, veths, mounts); skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    root = true;
    FILE *f = fopen("/proc/sys/net/ipv6/conf/all/disable_ipv6", "re");
    if (f != NULL) {
        have_v6 = fgetc(f) == '0';
        fclose(f);
    }
    snprintf(dir, sizeof dir, "/tmp/dsec-nltest-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return -1;
    sweep();
    dsec_err err;
    if (dsec__net_link_host_prepare(have_v6, &err) < 0) {
        fprintf(stderr, "host_prepare: %s\n", err.msg);
        return -1;
    }
    /* the gateway lives on the node's gateway device, as dsec_net makes it */
    struct in_addr gw4;
    struct in6_addr gw6;
    inet_pton(AF_INET, "100.127.250.1", &gw4);
    inet_pton(AF_INET6, "fd7f:d5ec:0:fa::1", &gw6);
    if (dsec__net_link_gateway(&gw4, have_v6 ? &gw6 : NULL, &err) < 0) {
        fprintf(stderr, "gateway: %s\n", err.msg);
        return -1;
    }
    fprintf(stderr, "test_net_link: IPv6 %s\n", have_v6 ? "on" : "off (host has it disabled)");
    return 0;
}

static int group_teardown(void **state)
{
    if (!root)
        return 0;
    sweep();
    dsec_err err;
    struct in_addr gw4;
    struct in6_addr gw6;
    inet_pton(AF_INET, "100.127.250.1", &gw4);
    inet_pton(AF_INET6, "fd7f:d5ec:0:fa::1", &gw6);
    if (dsec__net_link_gateway_del(&gw4, have_v6 ? &gw6 : NULL, &err) < 0)
        fprintf(stderr, "removing the gateway: %s\n", err.msg);
    rmdir(dir);
    return 0;
}

#define NEED_ROOT()                                                                                \
    do {                                                                                           \
        if (!root)                                                                                 \
            skip();                                                                                \
    } while (0)

/* ---- running code inside a sandbox's namespace (a thread of its own that joins it) -------- */

struct in_ns {
    const char *path;
    int (*fn)(void *);
    void *arg;
    int rc;
    char why[200];
};

static void *in_ns_main(void *p)
{
    struct in_ns *j = p;
    int fd = open(j->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) {
        snprintf(j->why, sizeof j->why, "joining %s: %s", j->path, strerror(errno));
        j->rc = -1;
    } else {
        j->rc = j->fn(j->arg);
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

static pthread_t in_ns_start(struct in_ns *j)
{
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, in_ns_main, j), 0);
    return t;
}

static int in_ns_run(struct in_ns *j)
{
    pthread_join(in_ns_start(j), NULL);
    if (j->rc != 0)
        fprintf(stderr, "in namespace: %s (rc %d)\n", j->why, j->rc);
    return j->rc;
}

/* ---- facts about interfaces and routes of the calling thread's namespace ------------------ */

struct facts {
    char ifname[IFNAMSIZ];
    bool up, lo_up, has4, has6;
    int mtu;
    struct in_addr a4;
    struct in6_addr a6;
};

static void read_facts(struct facts *f)
{
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) < 0)
        return;
    for (struct ifaddrs *i = ifa; i != NULL; i = i->ifa_next) {
        if (strcmp(i->ifa_name, "lo") == 0 && (i->ifa_flags & IFF_UP))
            f->lo_up = true;
        if (strcmp(i->ifa_name, f->ifname) != 0)
            continue;
        if (i->ifa_flags & IFF_UP)
            f->up = true;
        if (i->ifa_addr == NULL)
            continue;
        if (i->ifa_addr->sa_family == AF_INET &&
            ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == f->a4.s_addr)
            f->has4 = true;
        if (i->ifa_addr->sa_family == AF_INET6 &&
            IN6_ARE_ADDR_EQUAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, &f->a6))
            f->has6 = true;
    }
    freeifaddrs(ifa);
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq r;
    memset(&r, 0, sizeof r);
    snprintf(r.ifr_name, sizeof r.ifr_name, "%s", f->ifname);
    if (s >= 0 && ioctl(s, SIOCGIFMTU, &r) == 0)
        f->mtu = r.ifr_mtu;
    if (s >= 0)
        close(s);
}

/* An IPv4 route dst/mask out of dev (via gw, 0 for none) in /proc/thread-self/net/route. */
static bool route4(const char *dev, in_addr_t dst, in_addr_t mask, in_addr_t gw)
{
    FILE *f = fopen("/proc/thread-self/net/route", "re");
    if (f == NULL)
        return false;
    char line[256], ifn[IFNAMSIZ + 1];
    unsigned d, g, fl, rc, use, met, m;
    bool found = false;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "%16s %x %x %x %u %u %u %x", ifn, &d, &g, &fl, &rc, &use, &met, &m) != 8)
            continue;
        found = strcmp(ifn, dev) == 0 && d == dst && m == mask && g == gw;
    }
    fclose(f);
    return found;
}

static void hex16(const struct in6_addr *a, char out[33])
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", a->s6_addr[i]);
}

/* An IPv6 route dst/plen out of dev via gw (NULL for none) in ipv6_route. */
static bool route6(const char *dev, const struct in6_addr *dst, unsigned plen,
                   const struct in6_addr *gw)
{
    FILE *f = fopen("/proc/thread-self/net/ipv6_route", "re");
    if (f == NULL)
        return false;
    char want_d[33], want_g[33], line[512], d[33], g[33], src[33], ifn[IFNAMSIZ + 1];
    hex16(dst, want_d);
    hex16(gw != NULL ? gw : &in6addr_any, want_g);
    unsigned pl, spl, met, rc, use, fl;
    bool found = false;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "%32s %x %32s %x %32s %x %x %x %x %16s", d, &pl, src, &spl, g, &met, &rc,
                   &use, &fl, ifn) != 10)
            continue;
        found =
            strcmp(ifn, dev) == 0 && strcmp(d, want_d) == 0 && pl == plen && strcmp(g, want_g) == 0;
    }
    fclose(f);
    return found;
}

struct inside_check {
    const dsec__net_link_spec *s;
    struct facts f;
    bool r_gw4, r_def4, r_gw6, r_def6;
};

static int inside_facts(void *p)
{
    struct inside_check *c = p;
    snprintf(c->f.ifname, sizeof c->f.ifname, "eth0");
    c->f.a4 = c->s->addr4;
    c->f.a6 = c->s->addr6;
    read_facts(&c->f);
    c->r_gw4 = route4("eth0", c->s->gw4.s_addr, 0xffffffffu, 0);
    c->r_def4 = route4("eth0", 0, 0, c->s->gw4.s_addr);
    if (c->s->v6) {
        c->r_gw6 = route6("eth0", &c->s->gw6, 128, NULL);
        c->r_def6 = route6("eth0", &in6addr_any, 0, &c->s->gw6);
    }
    return 0;
}

static void check_created(const dsec__net_link_spec *s, int ifindex, uint32_t mtu)
{
    assert_true(ifindex > 0);
    assert_int_equal(dsec__net_link_ifindex(s->host_if), ifindex);
    assert_true(exists(s->netns_path));

    /* Host side: up, no address of its own (the gateway is on the gateway device),
     * the host route, strict reverse-path filter. */
    struct facts h = {0};
    snprintf(h.ifname, sizeof h.ifname, "%s", s->host_if);
    h.a4 = s->gw4;
    h.a6 = s->gw6;
    read_facts(&h);
    assert_true(h.up);
    assert_false(h.has4);
    assert_true(route4(s->host_if, s->addr4.s_addr, 0xffffffffu, 0));
    if (s->v6) {
        assert_false(h.has6);
        assert_true(route6(s->host_if, &s->addr6, 128, NULL));
    }
    if (mtu != 0)
        assert_int_equal(h.mtu, (int)mtu);
    char p[128], v[8] = "";
    snprintf(p, sizeof p, "/proc/sys/net/ipv4/conf/%s/rp_filter", s->host_if);
    FILE *f = fopen(p, "re");
    assert_non_null(f);
    assert_non_null(fgets(v, sizeof v, f));
    fclose(f);
    assert_int_equal(v[0], '1');

    /* Inside. */
    struct inside_check c = {.s = s};
    struct in_ns j = {.path = s->netns_path, .fn = inside_facts, .arg = &c};
    assert_int_equal(in_ns_run(&j), 0);
    assert_true(c.f.lo_up);
    assert_true(c.f.up);
    assert_true(c.f.has4);
    assert_true(c.r_gw4);
    assert_true(c.r_def4);
    if (s->v6) {
        assert_true(c.f.has6);
        assert_true(c.r_gw6);
        assert_true(c.r_def6);
    }
    if (mtu != 0)
        assert_int_equal(c.f.mtu, (int)mtu);
}

static void check_gone(const dsec__net_link_spec *s)
{
    assert_int_equal(dsec__net_link_ifindex(s->host_if), 0);
    assert_false(exists(s->netns_path));
}

/* ---- traffic: a TCP connection from inside to a listener on the gateway -------------------- */

struct client {
    int family;
    struct sockaddr_storage to;
    char msg[32];
    char reply[32];
};

static int client_main(void *p)
{
    struct client *c = p;
    int s = socket(c->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return -1;
    socklen_t len = c->family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    int rc = -2;
    if (connect(s, (struct sockaddr *)&c->to, len) < 0 && errno != EINPROGRESS)
        goto out;
    struct pollfd pf = {s, POLLOUT, 0};
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (poll(&pf, 1, 5000) != 1 || getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 ||
        soerr != 0) {
        rc = -3;
        goto out;
    }
    if (send(s, c->msg, strlen(c->msg), MSG_NOSIGNAL) != (ssize_t)strlen(c->msg)) {
        rc = -4;
        goto out;
    }
    pf.events = POLLIN;
    if (poll(&pf, 1, 5000) != 1 || recv(s, c->reply, sizeof c->reply - 1, 0) <= 0) {
        rc = -5;
        goto out;
    }
    rc = 0;
out:
    close(s);
    return rc;
}

/* From inside s's namespace, connect to the gateway; the host accepts on a
 * listener bound to the gateway address and answers. Proves both directions
 * and that the packets carry the sandbox's own address. */
static void talk(const dsec__net_link_spec *s, int family)
{
    int l = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(l >= 0);
    int one = 1;
    if (family == AF_INET)
        setsockopt(l, IPPROTO_IP, IP_FREEBIND, &one, sizeof one);
    else
        setsockopt(l, IPPROTO_IPV6, IPV6_FREEBIND, &one, sizeof one);
    struct sockaddr_storage a;
    memset(&a, 0, sizeof a);
    socklen_t alen;
    if (family == AF_INET) {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&a;
        a4->sin_family = AF_INET;
        a4->sin_addr = s->gw4;
        alen = sizeof *a4;
    } else {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&a;
        a6->sin6_family = AF_INET6;
        a6->sin6_addr = s->gw6;
        alen = sizeof *a6;
    }
    assert_int_equal(bind(l, (struct sockaddr *)&a, alen), 0);
    assert_int_equal(listen(l, 4), 0);
    assert_int_equal(getsockname(l, (struct sockaddr *)&a, &alen), 0);

    struct client c = {.family = family, .to = a};
    snprintf(c.msg, sizeof c.msg, "hello from %s", s->host_if);
    struct in_ns j = {.path = s->netns_path, .fn = client_main, .arg = &c};
    pthread_t t = in_ns_start(&j);

    struct pollfd pf = {l, POLLIN, 0};
    int cs = -1;
    if (poll(&pf, 1, 5000) == 1)
        cs = accept4(l, (struct sockaddr *)&a, &alen, SOCK_CLOEXEC);
    char buf[64] = "";
    bool from_sandbox = false;
    if (cs >= 0) {
        if (family == AF_INET)
            from_sandbox = ((struct sockaddr_in *)&a)->sin_addr.s_addr == s->addr4.s_addr;
        else
            from_sandbox = IN6_ARE_ADDR_EQUAL(&((struct sockaddr_in6 *)&a)->sin6_addr, &s->addr6);
        pf.fd = cs;
        if (poll(&pf, 1, 5000) == 1 && recv(cs, buf, sizeof buf - 1, 0) > 0)
            send(cs, "pong", 4, MSG_NOSIGNAL);
    }
    pthread_join(t, NULL);
    if (cs >= 0)
        close(cs);
    close(l);
    assert_true(cs >= 0);
    assert_true(from_sandbox);
    assert_string_equal(buf, c.msg);
    assert_int_equal(j.rc, 0);
    assert_string_equal(c.reply, "pong");
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_host_prepare(void **state)
{
    NEED_ROOT();
    dsec_err err;
    assert_int_equal(dsec__net_link_host_prepare(have_v6, &err), 0);
    assert_int_equal(dsec__net_link_host_prepare(have_v6, &err), 0);
    /* the gateway's addresses: idempotent, and removable */
    struct in_addr gw4, other;
    inet_pton(AF_INET, "100.127.250.1", &gw4);
    inet_pton(AF_INET, "100.127.249.1", &other);
    assert_int_equal(dsec__net_link_gateway(&gw4, NULL, &err), 0);
    assert_int_equal(dsec__net_link_gateway(&other, NULL, &err), 0);
    assert_int_equal(system("ip -4 -o addr show dev lo | grep -q ' 100.127.249.1/32'"), 0);
    assert_int_equal(dsec__net_link_gateway_del(&other, NULL, &err), 0);
    assert_int_equal(dsec__net_link_gateway_del(&other, NULL, &err), 0);
    assert_int_not_equal(system("ip -4 -o addr show dev lo | grep -q ' 100.127.249.1/32'"), 0);
    FILE *f = fopen("/proc/sys/net/ipv4/ip_forward", "re");
    assert_non_null(f);
    assert_int_equal(fgetc(f), '1');
    fclose(f);
}

static void test_two_sandboxes(void **state)
{
    NEED_ROOT();
    char pa[128], na[16], pb[128], nb[16];
    dsec__net_link_spec a, b;
    spec_for(&a, IDX_A, pa, sizeof pa, na, sizeof na);
    spec_for(&b, IDX_B, pb, sizeof pb, nb, sizeof nb);
    b.mtu = 1400;
    ino_t before = own_netns();
    dsec_err err = {0};
    int ia = 0, ib = 0;
    if (dsec__net_link_create(&a, &ia, &err) < 0)
        fail_msg("create A: %s", err.msg);
    if (dsec__net_link_create(&b, &ib, &err) < 0)
        fail_msg("create B: %s", err.msg);
    assert_int_equal(own_netns(), before);
    assert_int_not_equal(ia, ib);
    check_created(&a, ia, 0);
    check_created(&b, ib, 1400);

    /* Both hold the gateway address; each reaches it with its own. */
    talk(&a, AF_INET);
    talk(&b, AF_INET);
    if (have_v6) {
        talk(&a, AF_INET6);
        talk(&b, AF_INET6);
    }

    char **v = NULL;
    size_t n = 0;
    assert_int_equal(dsec__net_link_list(PREFIX, &v, &n, &err), 0);
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        assert_memory_equal(v[i], PREFIX, strlen(PREFIX));
        seen += strcmp(v[i], na) == 0 || strcmp(v[i], nb) == 0;
    }
    assert_int_equal(seen, 2);
    dsec__net_strv_free(v, n);
    assert_int_equal(dsec__net_link_list("dsvtest-no-such", &v, &n, &err), 0);
    assert_int_equal(n, 0);
    dsec__net_strv_free(v, n);

    /* Destroying A leaves B working. */
    assert_int_equal(dsec__net_link_destroy(a.netns_path, a.host_if, &err), 0);
    check_gone(&a);
    assert_int_equal(dsec__net_link_destroy(a.netns_path, a.host_if, &err), 0);
    talk(&b, AF_INET);
    assert_int_equal(dsec__net_link_destroy(b.netns_path, b.host_if, &err), 0);
    check_gone(&b);
    assert_int_equal(dsec__net_link_destroy(b.netns_path, b.host_if, &err), 0);
    assert_int_equal(dsec__net_link_destroy(NULL, NULL, &err), 0);
}

static void test_failures_leave_nothing(void **state)
{
    NEED_ROOT();
    char pa[128], na[16], pc[128], nc[16];
    dsec__net_link_spec a, c;
    spec_for(&a, 4, pa, sizeof pa, na, sizeof na);
    spec_for(&c, 5, pc, sizeof pc, nc, sizeof nc);
    ino_t before = own_netns();
    dsec_err err = {0};

    /* The netns file exists already: refused, and that file is left alone. */
    int fd = open(a.netns_path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "mine", 4), 4);
    close(fd);
    assert_int_equal(dsec__net_link_create(&a, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_EXISTS);
    assert_non_null(strstr(err.msg, a.netns_path));
    assert_int_equal(dsec__net_link_ifindex(a.host_if), 0);
    struct stat st;
    assert_int_equal(stat(a.netns_path, &st), 0);
    assert_int_equal(st.st_size, 4);
    unlink(a.netns_path);

    int ia = 0;
    if (dsec__net_link_create(&a, &ia, &err) < 0)
        fail_msg("create: %s", err.msg);

    /* The host interface name is taken: fails after the namespace was made;
     * the new netns file goes again, A is untouched. */
    dsec__net_link_spec dup = c;
    dup.host_if = a.host_if;
    assert_int_equal(dsec__net_link_create(&dup, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_EXISTS);
    assert_non_null(strstr(err.msg, a.host_if));
    assert_false(exists(c.netns_path));
    assert_int_equal(own_netns(), before);

    /* The sandbox address is taken (its host route exists): fails after the
     * veth was made; the veth and the file go again. */
    dup = c;
    dup.addr4 = a.addr4;
    assert_int_equal(dsec__net_link_create(&dup, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_EXISTS);
    assert_non_null(strstr(err.msg, "route"));
    fprintf(stderr, "address taken: %s\n", err.msg);
    check_gone(&c);
    assert_int_equal(own_netns(), before);

    /* A bad MTU: the kernel's reason reaches the message. */
    dup = c;
    dup.mtu = 10;
    assert_int_equal(dsec__net_link_create(&dup, NULL, &err), -1);
    assert_int_not_equal(err.code, DSEC_OK);
    assert_non_null(strstr(err.msg, "veth"));
    fprintf(stderr, "bad mtu: %s\n", err.msg);
    check_gone(&c);
    assert_int_equal(own_netns(), before);

    check_created(&a, ia, 0);
    talk(&a, AF_INET);
    assert_int_equal(dsec__net_link_destroy(a.netns_path, a.host_if, &err), 0);
    check_gone(&a);
}

static void test_bad_input(void **state)
{
    NEED_ROOT();
    char p[128], n[16];
    dsec__net_link_spec s;
    dsec_err err = {0};
    spec_for(&s, 6, p, sizeof p, n, sizeof n);

    assert_int_equal(dsec__net_link_create(NULL, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    dsec__net_link_spec b = s;
    b.netns_path = NULL;
    assert_int_equal(dsec__net_link_create(&b, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    b = s;
    b.host_if = "dsvtest-much-too-long";
    assert_int_equal(dsec__net_link_create(&b, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "dsvtest-much-too-long"));
    b = s;
    b.host_if = "dsv/../x";
    assert_int_equal(dsec__net_link_create(&b, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    b = s;
    b.addr4 = b.gw4;
    assert_int_equal(dsec__net_link_create(&b, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    b = s;
    b.v6 = true;
    memset(&b.addr6, 0, sizeof b.addr6);
    assert_int_equal(dsec__net_link_create(&b, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    b = s;
    char missing[200];
    snprintf(missing, sizeof missing, "%s/no-such-dir/ns", dir);
    b.netns_path = missing;
    assert_int_equal(dsec__net_link_create(&b, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, missing));
    assert_int_equal(dsec__net_link_ifindex(s.host_if), 0);
    assert_false(exists(s.netns_path));

    assert_int_equal(dsec__net_link_destroy(NULL, "dsvtest/x", &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    /* Only a veth is ever deleted (lo cannot be, so this is safe to try). */
    int lo = dsec__net_link_ifindex("lo");
    assert_true(lo > 0);
    assert_int_equal(dsec__net_link_destroy(NULL, "lo", &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "not a sandbox's veth"));
    assert_int_equal(dsec__net_link_ifindex("lo"), lo);
    assert_int_equal(dsec__net_link_ifindex("dsvtest-much-too-long"), 0);
    assert_int_equal(dsec__net_link_ifindex(NULL), 0);
    assert_int_equal(dsec__net_link_list(PREFIX, NULL, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
}

#define PER_THREAD 20

struct worker {
    unsigned base;
    ino_t before, after;
    int created, ifindex_ok, destroyed, gone;
    char why[DSEC_ERR_MSG_MAX];
};

static void *worker_main(void *p)
{
    struct worker *w = p;
    char paths[PER_THREAD][128], names[PER_THREAD][16];
    dsec__net_link_spec s[PER_THREAD];
    w->before = own_netns();
    for (int i = 0; i < PER_THREAD; i++) {
        spec_for(&s[i], w->base + (unsigned)i, paths[i], sizeof paths[i], names[i],
                 sizeof names[i]);
        dsec_err err;
        int ix = 0;
        if (dsec__net_link_create(&s[i], &ix, &err) < 0) {
            snprintf(w->why, sizeof w->why, "%s", err.msg);
            continue;
        }
        w->created++;
        w->ifindex_ok +=
            ix > 0 && dsec__net_link_ifindex(s[i].host_if) == ix && exists(s[i].netns_path);
    }
    w->after = own_netns();
    for (int i = 0; i < PER_THREAD; i++) {
        dsec_err err;
        if (dsec__net_link_destroy(s[i].netns_path, s[i].host_if, &err) == 0)
            w->destroyed++;
        else
            snprintf(w->why, sizeof w->why, "%s", err.msg);
        w->gone += dsec__net_link_ifindex(s[i].host_if) == 0 && !exists(s[i].netns_path);
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    NEED_ROOT();
    ino_t before = own_netns();
    struct worker w[2] = {{.base = 0x10}, {.base = 0x40}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++) {
        if (w[i].why[0] != '\0')
            fprintf(stderr, "worker %d: %s\n", i, w[i].why);
        assert_int_equal(w[i].created, PER_THREAD);
        assert_int_equal(w[i].ifindex_ok, PER_THREAD);
        assert_int_equal(w[i].destroyed, PER_THREAD);
        assert_int_equal(w[i].gone, PER_THREAD);
        assert_true(w[i].before != 0);
        assert_true(w[i].before == w[i].after);
    }
    assert_true(own_netns() == before);
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* A burst of N creates, then N destroys (the namespaces' own teardown runs in
 * the kernel afterwards, so it does not land in the create figures). */
static void timing(bool v6)
{
    enum { N = 100 };
    static char paths[N][128], names[N][16];
    static dsec__net_link_spec s[N];
    double tc = 0, td = 0, maxc = 0, maxd = 0;
    for (int i = 0; i < N; i++) {
        spec_for(&s[i], 0x80u + (unsigned)i, paths[i], sizeof paths[i], names[i], sizeof names[i]);
        s[i].v6 = v6;
    }
    for (int i = 0; i < N; i++) {
        dsec_err err;
        double t0 = now_us();
        if (dsec__net_link_create(&s[i], NULL, &err) < 0)
            fail_msg("create %d: %s", i, err.msg);
        double t = now_us() - t0;
        tc += t;
        maxc = t > maxc ? t : maxc;
    }
    for (int i = 0; i < N; i++) {
        dsec_err err;
        double t0 = now_us();
        if (dsec__net_link_destroy(s[i].netns_path, s[i].host_if, &err) < 0)
            fail_msg("destroy %d: %s", i, err.msg);
        double t = now_us() - t0;
        td += t;
        maxd = t > maxd ? t : maxd;
        check_gone(&s[i]);
    }
    fprintf(stderr,
            "net link (%s): create mean %.0f us (max %.0f), destroy mean %.0f us (max %.0f), "
            "over %d\n",
            v6 ? "v4+v6" : "v4 only", tc / N, maxc, td / N, maxd, N);
}

static void test_timing(void **state)
{
    NEED_ROOT();
    timing(false);
    if (have_v6)
        timing(true);
}

/* A link dump the kernel cuts short because links changed while it ran is taken again: in a
 * namespace of its own with 300 links (150 veth pairs: a dump of several parts), list while another
 * process adds and removes links. */
static void test_list_while_links_change(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (unshare(CLONE_NEWNET) < 0 || system("for i in $(seq 150); do echo link add " PREFIX
                                                "da$i type veth peer name " PREFIX
                                                "db$i; done | ip -batch - >/dev/null 2>&1") != 0)
            _exit(2);
        pid_t churn = fork();
        if (churn == 0) {
            for (;;)
                if (system("ip link add " PREFIX "ca type veth peer name " PREFIX "cb 2>/dev/null; "
                           "ip link del " PREFIX "ca 2>/dev/null") < 0)
                    _exit(0);
        }
        int failed = 0;
        for (int i = 0; i < 300; i++) {
            char **v = NULL;
            size_t n = 0;
            dsec_err err;
            if (dsec__net_link_list(PREFIX "d", &v, &n, &err) < 0 || n != 300) {
                if (failed++ == 0)
                    fprintf(stderr, "list %d: %s (%zu links)\n", i, err.msg, n);
            }
            dsec__net_strv_free(v, n);
        }
        kill(churn, SIGKILL);
        waitpid(churn, NULL, 0);
        _exit(failed ? 1 : 0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_prepare),
        cmocka_unit_test(test_two_sandboxes),
        cmocka_unit_test(test_failures_leave_nothing),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_timing),
        cmocka_unit_test(test_list_while_links_change),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
