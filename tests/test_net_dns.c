/* test_net_dns.c - the sandbox DNS resolver against a fake upstream: policy, pins, abuse, TCP. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
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
#include <ldns/ldns.h>

#include "backends/net/net-int.h"
#include "dsec/alloc.h"
#include "dsec/err.h"

/*
 * No root needed: everything is on loopback with unprivileged ports. The
 * "sandboxes" are client sockets bound to distinct loopback addresses:
 *   127.0.0.2, 127.0.0.5, 127.0.0.6 may resolve names under allowed.test;
 *   127.0.0.3 may resolve names under other.test;
 *   127.0.0.4 may resolve names under allowed.test but target.allowed.test;
 *   any other address is no sandbox's (the policy says no to everything).
 * The fake upstream logs every name it is asked (over TCP with "tcp:" in
 * front), so "never forwarded" and "answered from the cache" are checked
 * where it matters: on the far side. It answers names starting with "tc"
 * truncated over UDP and in full (or broken, or never) over TCP on the
 * same port.
 */

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static int last_octet(const struct sockaddr *sa)
{
    if (sa->sa_family != AF_INET)
        return -1;
    return (int)(ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) & 0xffu);
}

static bool under(const char *name, const char *zone)
{
    size_t n = strlen(name), z = strlen(zone);
    return n == z ? strcmp(name, zone) == 0
                  : n > z && name[n - z - 1] == '.' && strcmp(name + n - z, zone) == 0;
}

/* ---- the fake upstream -------------------------------------------------------------------- */

static struct {
    int fd, tfd;  /* UDP, and the TCP listener on the same port */
    int slow[16]; /* TCP connections left unanswered */
    size_t nslow;
    uint16_t port;
    pthread_t th;
    volatile bool stop;
    pthread_mutex_t mu;
    char **log; /* every name asked, as received */
    size_t nlog, caplog;
} up = {.fd = -1, .tfd = -1, .mu = PTHREAD_MUTEX_INITIALIZER};

/* How many times the upstream was asked name (with or without the final
 * dot, any letter case) over UDP, or over TCP when tcp. */
static size_t upstream_count(const char *name, bool tcp)
{
    char want[300];
    snprintf(want, sizeof want, "%s%s%s", tcp ? "tcp:" : "", name,
             name[strlen(name) - 1] == '.' ? "" : ".");
    size_t n = 0;
    pthread_mutex_lock(&up.mu);
    for (size_t i = 0; i < up.nlog; i++)
        n += strcasecmp(up.log[i], want) == 0;
    pthread_mutex_unlock(&up.mu);
    return n;
}

/* Whether any name the upstream was asked contains needle (in any letter case). */
static bool upstream_saw(const char *needle)
{
    bool found = false;
    pthread_mutex_lock(&up.mu);
    for (size_t i = 0; i < up.nlog && !found; i++)
        found = strcasestr(up.log[i], needle) != NULL;
    pthread_mutex_unlock(&up.mu);
    return found;
}

/* Whether any name the upstream was asked contains needle exactly (case too). */
static bool upstream_saw_case(const char *needle)
{
    bool found = false;
    pthread_mutex_lock(&up.mu);
    for (size_t i = 0; i < up.nlog && !found; i++)
        found = strstr(up.log[i], needle) != NULL;
    pthread_mutex_unlock(&up.mu);
    return found;
}

static void add_rr(ldns_pkt *p, ldns_pkt_section sec, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void add_rr(ldns_pkt *p, ldns_pkt_section sec, const char *fmt, ...)
{
    char s[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s, sizeof s, fmt, ap);
    va_end(ap);
    ldns_rr *rr = NULL;
    if (ldns_rr_new_frm_str(&rr, s, 0, NULL, NULL) == LDNS_STATUS_OK)
        ldns_pkt_push_rr(p, sec, rr);
}

static void fake_send(ldns_pkt *r, const struct sockaddr_storage *to, socklen_t tl)
{
    uint8_t *w = NULL;
    size_t n = 0;
    if (ldns_pkt2wire(&w, r, &n) == LDNS_STATUS_OK)
        sendto(up.fd, w, n, 0, (const struct sockaddr *)to, tl);
    LDNS_FREE(w);
}

static ldns_pkt *fake_reply_to(const ldns_pkt *q)
{
    ldns_pkt *r = ldns_pkt_new();
    ldns_pkt_set_id(r, ldns_pkt_id(q));
    ldns_pkt_set_qr(r, true);
    ldns_pkt_set_rd(r, true);
    ldns_pkt_set_ra(r, true);
    ldns_pkt_push_rr(r, LDNS_SECTION_QUESTION,
                     ldns_rr_clone(ldns_rr_list_rr(ldns_pkt_question(q), 0)));
    return r;
}

static void fake_log(const char *prefix, const char *name)
{
    char s[300];
    snprintf(s, sizeof s, "%s%s", prefix, name);
    pthread_mutex_lock(&up.mu);
    if (up.nlog == up.caplog) {
        up.caplog = up.caplog ? 2 * up.caplog : 1024;
        up.log = dsec_realloc(up.log, up.caplog * sizeof *up.log);
    }
    up.log[up.nlog++] = dsec_strdup(s);
    pthread_mutex_unlock(&up.mu);
}

/* A negative answer with the zone's SOA (TTL and minimum as given). */
static void add_soa(ldns_pkt *r, uint32_t ttl, uint32_t minimum)
{
    add_rr(r, LDNS_SECTION_AUTHORITY,
           "allowed.test. %u IN SOA ns.allowed.test. host.allowed.test. 1 3600 600 86400 %u", ttl,
           minimum);
}

/* Answer one query from the table. */
static void fake_answer(const ldns_pkt *q, const struct sockaddr_storage *from, socklen_t fl)
{
    const ldns_rr *qrr = ldns_rr_list_rr(ldns_pkt_question(q), 0);
    if (qrr == NULL)
        return;
    char *name = ldns_rdf2str(ldns_rr_owner(qrr));
    if (name == NULL)
        return;
    fake_log("", name);
    bool a = ldns_rr_get_type(qrr) == LDNS_RR_TYPE_A;
    ldns_pkt *r = fake_reply_to(q);
    if (strncmp(name, "tc", 2) == 0) {
        ldns_pkt_set_tc(r, true); /* ask again over TCP */
    } else if (strcmp(name, "cache1.allowed.test.") == 0) {
        add_rr(r, LDNS_SECTION_ANSWER, "%s 60 IN A 192.0.2.41", name);
    } else if (strcmp(name, "exp.allowed.test.") == 0) {
        add_rr(r, LDNS_SECTION_ANSWER, "%s 0 IN A 192.0.2.42", name);
    } else if (strcmp(name, "slow.allowed.test.") == 0) {
        usleep(200000); /* identical queries meanwhile share this one */
        add_rr(r, LDNS_SECTION_ANSWER, "%s 60 IN A 192.0.2.43", name);
    } else if (strcmp(name, "negshort.allowed.test.") == 0) {
        ldns_pkt_set_rcode(r, LDNS_RCODE_NXDOMAIN);
        add_soa(r, 3600, 1);
    } else if (strcmp(name, "neglong.allowed.test.") == 0) {
        ldns_pkt_set_rcode(r, LDNS_RCODE_NXDOMAIN);
        add_soa(r, 3600, 3600);
    } else if (strcmp(name, "nodata.allowed.test.") == 0) {
        add_soa(r, 2, 3600);
    } else if (strcmp(name, "othertype.allowed.test.") == 0) {
        /* NODATA for A, with a long-lived AAAA beside it and no SOA */
        add_rr(r, LDNS_SECTION_ANSWER, "%s 300 IN AAAA 2001:db8::7", name);
    } else if (strcmp(name, "sf.allowed.test.") == 0) {
        ldns_pkt_set_rcode(r, LDNS_RCODE_SERVFAIL);
    } else if (strncmp(name, "silent", 6) == 0) {
        ldns_pkt_free(r);
        LDNS_FREE(name);
        return;
    } else if (strcmp(name, "a.allowed.test.") == 0 || strcmp(name, "www.other.test.") == 0 ||
               strncmp(name, "p", 1) == 0 || strncmp(name, "flood", 5) == 0) {
        if (a)
            add_rr(r, LDNS_SECTION_ANSWER, "%s 60 IN A 192.0.2.1", name);
        else
            add_rr(r, LDNS_SECTION_ANSWER, "%s 60 IN AAAA 2001:db8::1", name);
    } else if (strcmp(name, "short.allowed.test.") == 0) {
        add_rr(r, LDNS_SECTION_ANSWER, "%s 0 IN A 192.0.2.5", name);
    } else if (strcmp(name, "long.allowed.test.") == 0) {
        add_rr(r, LDNS_SECTION_ANSWER, "%s 86400 IN A 192.0.2.6", name);
    } else if (strcmp(name, "alias.allowed.test.") == 0) {
        add_rr(r, LDNS_SECTION_ANSWER, "%s 120 IN CNAME target.allowed.test.", name);
        add_rr(r, LDNS_SECTION_ANSWER, "target.allowed.test. 30 IN A 192.0.2.2");
        add_rr(r, LDNS_SECTION_ANSWER, "stray.outside.test. 30 IN A 203.0.113.9");
        add_rr(r, LDNS_SECTION_ANSWER, "%s 30 IN A 203.0.113.10", name); /* not the chain's end */
        add_rr(r, LDNS_SECTION_AUTHORITY, "allowed.test. 30 IN NS ns.evil.test.");
        add_rr(r, LDNS_SECTION_ADDITIONAL, "ns.evil.test. 30 IN A 203.0.113.11");
    } else if (strcmp(name, "leak.allowed.test.") == 0) {
        add_rr(r, LDNS_SECTION_ANSWER, "%s 120 IN CNAME x.exfil.example.", name);
        add_rr(r, LDNS_SECTION_ANSWER, "x.exfil.example. 30 IN A 198.51.100.7");
    } else if (strcmp(name, "loop.allowed.test.") == 0) {
        add_rr(r, LDNS_SECTION_ANSWER, "%s 120 IN CNAME loop2.allowed.test.", name);
        add_rr(r, LDNS_SECTION_ANSWER, "loop2.allowed.test. 120 IN CNAME loop.allowed.test.");
    } else if (strcmp(name, "big.allowed.test.") == 0) {
        for (int i = 1; i <= 40; i++)
            add_rr(r, LDNS_SECTION_ANSWER, "%s 60 IN A 10.1.0.%d", name, i);
    } else if (strcmp(name, "spoof.allowed.test.") == 0) {
        /* first a wrong id, then the right id with another question, then the truth */
        ldns_pkt *bad = fake_reply_to(q);
        ldns_pkt_set_id(bad, (uint16_t)(ldns_pkt_id(q) ^ 0x5a5a));
        add_rr(bad, LDNS_SECTION_ANSWER, "%s 60 IN A 203.0.113.66", name);
        fake_send(bad, from, fl);
        ldns_pkt_free(bad);
        ldns_pkt *q2 = NULL;
        ldns_pkt_query_new_frm_str(&q2, "other.allowed.test.", LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN,
                                   LDNS_RD);
        ldns_pkt_set_id(q2, ldns_pkt_id(q));
        bad = fake_reply_to(q2);
        add_rr(bad, LDNS_SECTION_ANSWER, "other.allowed.test. 60 IN A 203.0.113.67");
        fake_send(bad, from, fl);
        ldns_pkt_free(bad);
        ldns_pkt_free(q2);
        add_rr(r, LDNS_SECTION_ANSWER, "%s 60 IN A 192.0.2.77", name);
    } else {
        ldns_pkt_set_rcode(r, LDNS_RCODE_NXDOMAIN);
    }
    fake_send(r, from, fl);
    ldns_pkt_free(r);
    LDNS_FREE(name);
}

static void tcp_send_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0)
            return;
        p += k, n -= (size_t)k;
    }
}

static void tcp_send_pkt(int fd, ldns_pkt *r)
{
    uint8_t *w = NULL;
    size_t n = 0;
    if (ldns_pkt2wire(&w, r, &n) == LDNS_STATUS_OK) {
        uint8_t hdr[2] = {(uint8_t)(n >> 8), (uint8_t)n};
        tcp_send_all(fd, hdr, 2);
        tcp_send_all(fd, w, n);
    }
    LDNS_FREE(w);
}

/* One connection to the fake's TCP side: one framed query, answered from
 * the "tc" table (whole, broken, or never). */
static void fake_tcp(int fd)
{
    struct timeval tv = {.tv_sec = 1};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t hdr[2], buf[4096];
    ldns_pkt *q = NULL;
    if (recv(fd, hdr, 2, MSG_WAITALL) != 2) {
        close(fd);
        return;
    }
    size_t len = (size_t)hdr[0] << 8 | hdr[1];
    if (len > sizeof buf || recv(fd, buf, len, MSG_WAITALL) != (ssize_t)len ||
        ldns_wire2pkt(&q, buf, len) != LDNS_STATUS_OK) {
        close(fd);
        return;
    }
    const ldns_rr *qrr = ldns_rr_list_rr(ldns_pkt_question(q), 0);
    char *name = qrr != NULL ? ldns_rdf2str(ldns_rr_owner(qrr)) : NULL;
    if (name == NULL) {
        ldns_pkt_free(q);
        close(fd);
        return;
    }
    fake_log("tcp:", name);
    ldns_pkt *r = fake_reply_to(q);
    if (strcmp(name, "tc.allowed.test.") == 0) {
        for (int i = 1; i <= 3; i++)
            add_rr(r, LDNS_SECTION_ANSWER, "%s 60 IN A 192.0.2.3%d", name, i);
        tcp_send_pkt(fd, r);
    } else if (strcmp(name, "tcbig.allowed.test.") == 0) {
        for (int i = 0; i < 200; i++)
            add_rr(r, LDNS_SECTION_ANSWER, "%s 60 IN A 10.2.%d.%d", name, i / 100, i % 100 + 1);
        tcp_send_pkt(fd, r);
    } else if (strcmp(name, "tcbad.allowed.test.") == 0) {
        uint8_t junk[42] = {0, 40, buf[0], buf[1], 0x81, 0x80, 0, 1, 0, 9};
        for (size_t i = 10; i < sizeof junk; i++)
            junk[i] = (uint8_t)(i * 37);
        tcp_send_all(fd, junk, sizeof junk);
    } else if (strcmp(name, "tcover.allowed.test.") == 0) {
        /* the largest frame there is, of junk after a plausible header, and more behind it */
        uint8_t *big = dsec_calloc(1, 2 + 65535 + 65536);
        memset(big + 2, 0xc0, 65535 + 65536);
        big[0] = 0xff, big[1] = 0xff, big[2] = buf[0], big[3] = buf[1], big[4] = 0x81;
        big[5] = 0x80, big[6] = 0, big[7] = 1, big[8] = 0xff, big[9] = 0xff;
        tcp_send_all(fd, big, 2 + 65535 + 65536);
        dsec_free(big);
    } else if (strcmp(name, "tcshort.allowed.test.") == 0) {
        uint8_t part[102] = {0x01, 0xf4, buf[0], buf[1], 0x81, 0x80}; /* 500 promised, 100 sent */
        tcp_send_all(fd, part, sizeof part);
    } else if (strcmp(name, "tcwrongid.allowed.test.") == 0) {
        ldns_pkt_set_id(r, (uint16_t)(ldns_pkt_id(q) ^ 1));
        add_rr(r, LDNS_SECTION_ANSWER, "%s 60 IN A 203.0.113.70", name);
        tcp_send_pkt(fd, r);
    } else if (strcmp(name, "tcslow.allowed.test.") == 0 && up.nslow < 16) {
        up.slow[up.nslow++] = fd; /* connected, never answered */
        fd = -1;
    }
    ldns_pkt_free(r);
    ldns_pkt_free(q);
    LDNS_FREE(name);
    if (fd >= 0)
        close(fd);
}

static void *fake_thread(void *arg)
{
    (void)arg;
    uint8_t buf[4096];
    while (!up.stop) {
        struct pollfd pfds[2] = {{.fd = up.fd, .events = POLLIN}, {.fd = up.tfd, .events = POLLIN}};
        if (poll(pfds, 2, 50) <= 0)
            continue;
        if (pfds[1].revents & POLLIN) {
            int c = accept4(up.tfd, NULL, NULL, SOCK_CLOEXEC);
            if (c >= 0)
                fake_tcp(c);
        }
        if (!(pfds[0].revents & POLLIN))
            continue;
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(up.fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
        if (n <= 0)
            continue;
        ldns_pkt *q = NULL;
        if (ldns_wire2pkt(&q, buf, (size_t)n) == LDNS_STATUS_OK) {
            fake_answer(q, &from, fl);
            ldns_pkt_free(q);
        }
    }
    return NULL;
}

static int fake_start(void)
{
    for (int tries = 0; up.tfd < 0 && tries < 50; tries++) {
        if (up.fd >= 0)
            close(up.fd);
        up.fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof a;
        int sz = 4 << 20;
        setsockopt(up.fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
        if (up.fd < 0 || bind(up.fd, (struct sockaddr *)&a, sizeof a) < 0 ||
            getsockname(up.fd, (struct sockaddr *)&a, &al) < 0)
            return -1;
        up.port = ntohs(a.sin_port);
        /* the TCP side on the same port (taken by someone else's TCP: another port) */
        int t = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (t >= 0 && bind(t, (struct sockaddr *)&a, sizeof a) == 0 && listen(t, 64) == 0)
            up.tfd = t;
        else if (t >= 0)
            close(t);
    }
    if (up.tfd < 0)
        return -1;
    up.stop = false;
    return pthread_create(&up.th, NULL, fake_thread, NULL) == 0 ? 0 : -1;
}

static void fake_stop(void)
{
    up.stop = true;
    pthread_join(up.th, NULL);
    close(up.fd);
    close(up.tfd);
    up.fd = up.tfd = -1;
    for (size_t i = 0; i < up.nslow; i++)
        close(up.slow[i]);
    up.nslow = 0;
    for (size_t i = 0; i < up.nlog; i++)
        dsec_free(up.log[i]);
    dsec_free(up.log);
    up.log = NULL;
    up.nlog = up.caplog = 0;
}

/* ---- the policy and what the resolver reports --------------------------------------------- */

typedef struct pinrec {
    int client;
    int family;
    uint8_t addr[16];
    uint32_t ttl;
    char qname[256];
} pinrec;

typedef struct refrec {
    int client;
    char qname[256];
    uint16_t qtype;
    char why[16];
} refrec;

static struct {
    pthread_mutex_t mu;
    pinrec pins[256];
    size_t npins; /* all pins; only the first 256 kept */
    refrec refs[256];
    size_t nrefs;
    size_t floods[256]; /* "flood" reports per client octet */
} cb = {.mu = PTHREAD_MUTEX_INITIALIZER};

static bool policy(void *ud, const struct sockaddr *cl, const char *name)
{
    (void)ud;
    switch (last_octet(cl)) {
    case 2:
    case 5:
    case 6:
        return under(name, "allowed.test");
    case 3:
        return under(name, "other.test");
    case 4:
        return under(name, "allowed.test") && strcmp(name, "target.allowed.test") != 0;
    default:
        return false;
    }
}

static void on_pin(void *ud, const struct sockaddr *cl, const char *qname, int family,
                   const uint8_t *addr, uint32_t ttl)
{
    (void)ud;
    pthread_mutex_lock(&cb.mu);
    if (cb.npins < 256) {
        pinrec *p = &cb.pins[cb.npins];
        p->client = last_octet(cl);
        p->family = family;
        memcpy(p->addr, addr, family == AF_INET ? 4 : 16);
        p->ttl = ttl;
        snprintf(p->qname, sizeof p->qname, "%s", qname);
    }
    cb.npins++;
    pthread_mutex_unlock(&cb.mu);
}

static void on_refused(void *ud, const struct sockaddr *cl, const char *qname, uint16_t qtype,
                       const char *why)
{
    (void)ud;
    pthread_mutex_lock(&cb.mu);
    int o = last_octet(cl);
    if (strcmp(why, "flood") == 0 && o >= 0)
        cb.floods[o]++;
    if (cb.nrefs < 256) {
        refrec *r = &cb.refs[cb.nrefs];
        r->client = o;
        snprintf(r->qname, sizeof r->qname, "%s", qname);
        r->qtype = qtype;
        snprintf(r->why, sizeof r->why, "%s", why);
    }
    cb.nrefs++;
    pthread_mutex_unlock(&cb.mu);
}

static void cb_reset(void)
{
    pthread_mutex_lock(&cb.mu);
    cb.npins = cb.nrefs = 0;
    memset(cb.floods, 0, sizeof cb.floods);
    pthread_mutex_unlock(&cb.mu);
}

/* The pin of addr (text) for client, or NULL. */
static const pinrec *pinned(int client, const char *addr)
{
    uint8_t a[16] = {0};
    int fam = strchr(addr, ':') ? AF_INET6 : AF_INET;
    inet_pton(fam, addr, a);
    const pinrec *found = NULL;
    pthread_mutex_lock(&cb.mu);
    for (size_t i = 0; i < cb.npins && i < 256 && found == NULL; i++)
        if (cb.pins[i].client == client && cb.pins[i].family == fam &&
            memcmp(cb.pins[i].addr, a, fam == AF_INET ? 4 : 16) == 0)
            found = &cb.pins[i];
    pthread_mutex_unlock(&cb.mu);
    return found;
}

static bool refused_with(int client, const char *qname, const char *why)
{
    bool found = false;
    pthread_mutex_lock(&cb.mu);
    for (size_t i = 0; i < cb.nrefs && i < 256 && !found; i++)
        found = cb.refs[i].client == client && strcmp(cb.refs[i].qname, qname) == 0 &&
                strcmp(cb.refs[i].why, why) == 0;
    pthread_mutex_unlock(&cb.mu);
    return found;
}

/* ---- clients ------------------------------------------------------------------------------ */

static dsec__dns *dns; /* the resolver most tests share */
static uint16_t dns_port;

/* A port free for both UDP and TCP on 127.0.0.1. */
static uint16_t free_port(void)
{
    for (int tries = 0; tries < 50; tries++) {
        int u = socket(AF_INET, SOCK_DGRAM, 0), t = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof a;
        uint16_t port = 0;
        if (bind(u, (struct sockaddr *)&a, sizeof a) == 0 &&
            getsockname(u, (struct sockaddr *)&a, &al) == 0 &&
            bind(t, (struct sockaddr *)&a, sizeof a) == 0)
            port = ntohs(a.sin_port);
        close(u);
        close(t);
        if (port != 0)
            return port;
    }
    return 0;
}

static void set_in(struct sockaddr_storage *ss, const char *ip, uint16_t port)
{
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    inet_pton(AF_INET, ip, &a->sin_addr);
}

static int client_sock(const char *src, int type)
{
    int fd = socket(AF_INET, type | SOCK_CLOEXEC, 0);
    struct sockaddr_storage a;
    set_in(&a, src, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(struct sockaddr_in)) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static size_t mkquery(const char *name, ldns_rr_type t, ldns_rr_class c, bool edns, uint16_t id,
                      uint8_t *out)
{
    ldns_pkt *q = NULL;
    assert_int_equal(ldns_pkt_query_new_frm_str(&q, name, t, c, LDNS_RD), LDNS_STATUS_OK);
    ldns_pkt_set_id(q, id);
    if (edns)
        ldns_pkt_set_edns_udp_size(q, 1232);
    uint8_t *w = NULL;
    size_t n = 0;
    assert_int_equal(ldns_pkt2wire(&w, q, &n), LDNS_STATUS_OK);
    memcpy(out, w, n);
    LDNS_FREE(w);
    ldns_pkt_free(q);
    return n;
}

/* Send raw bytes over UDP from src to the resolver at port; the reply's
 * length, or -1 when none came within timeout_ms. */
static ssize_t ask_raw(const char *src, uint16_t port, const uint8_t *pkt, size_t len,
                       uint8_t *rbuf, size_t cap, int timeout_ms)
{
    int fd = client_sock(src, SOCK_DGRAM);
    assert_true(fd >= 0);
    struct sockaddr_storage to;
    set_in(&to, "127.0.0.1", port);
    assert_int_equal(sendto(fd, pkt, len, 0, (struct sockaddr *)&to, sizeof(struct sockaddr_in)),
                     (ssize_t)len);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    ssize_t n = -1;
    if (poll(&pfd, 1, timeout_ms) == 1)
        n = recv(fd, rbuf, cap, 0);
    close(fd);
    return n;
}

/* Ask name/type from src over UDP; the parsed reply (id checked), or NULL on silence. */
static ldns_pkt *ask_cls(const char *src, const char *name, ldns_rr_type t, ldns_rr_class c,
                         bool edns, int timeout_ms)
{
    uint8_t q[512], r[65536];
    uint16_t id = (uint16_t)(now_us() * 2654435761u >> 7);
    size_t ql = mkquery(name, t, c, edns, id, q);
    ssize_t n = ask_raw(src, dns_port, q, ql, r, sizeof r, timeout_ms);
    if (n < 0)
        return NULL;
    ldns_pkt *p = NULL;
    assert_int_equal(ldns_wire2pkt(&p, r, (size_t)n), LDNS_STATUS_OK);
    assert_int_equal(ldns_pkt_id(p), id);
    assert_true(ldns_pkt_qr(p));
    return p;
}

static ldns_pkt *ask(const char *src, const char *name, ldns_rr_type t)
{
    return ask_cls(src, name, t, LDNS_RR_CLASS_IN, false, 2000);
}

/* The text of answer record i's address (A/AAAA), into buf. */
static const char *ans_addr(const ldns_pkt *p, size_t i, char *buf, size_t n)
{
    const ldns_rr *rr = ldns_rr_list_rr(ldns_pkt_answer(p), i);
    const ldns_rdf *a = ldns_rr_rdf(rr, 0);
    inet_ntop(ldns_rr_get_type(rr) == LDNS_RR_TYPE_A ? AF_INET : AF_INET6, ldns_rdf_data(a), buf,
              (socklen_t)n);
    return buf;
}

static void expect_rcode(const char *src, const char *name, ldns_rr_type t, ldns_pkt_rcode rc)
{
    ldns_pkt *p = ask(src, name, t);
    assert_non_null(p);
    assert_int_equal(ldns_pkt_get_rcode(p), rc);
    if (rc == LDNS_RCODE_REFUSED)
        assert_int_equal(ldns_pkt_ancount(p), 0);
    ldns_pkt_free(p);
}

static dsec__dns *mk_resolver(uint16_t port, uint32_t qps, uint32_t burst, uint32_t inflight,
                              uint32_t cache_entries)
{
    dsec__dns_conf c = {.nlisten = 1,
                        .nupstream = 1,
                        .upstream_timeout_ms = 300,
                        .client_qps = qps,
                        .client_burst = burst,
                        .client_inflight = inflight,
                        .cache_entries = cache_entries,
                        .allowed = policy,
                        .pin = on_pin,
                        .refused = on_refused};
    set_in(&c.listen[0], "127.0.0.1", port);
    set_in(&c.upstream[0], "127.0.0.1", up.port);
    dsec__dns *d = NULL;
    dsec_err err;
    if (dsec__dns_new(&d, &c, &err) < 0) {
        fprintf(stderr, "dsec__dns_new: %s\n", err.msg);
        return NULL;
    }
    return d;
}

static int group_setup(void **state)
{
    (void)state;
    if (fake_start() < 0)
        return -1;
    dns_port = free_port();
    dns = dns_port != 0 ? mk_resolver(dns_port, 2000, 4000, 64, 0) : NULL;
    return dns != NULL ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    dsec__dns_free(dns);
    fake_stop();
    return 0;
}

/* ---- tests -------------------------------------------------------------------------------- */

static void bad_configs_are_refused_with_a_reason(void **state)
{
    (void)state;
    dsec__dns *d = NULL;
    dsec_err err;
    dsec__dns_conf c = {.nlisten = 1, .allowed = NULL};
    set_in(&c.listen[0], "127.0.0.1", 0);
    assert_int_equal(dsec__dns_new(&d, &c, &err), -1);
    assert_null(d);
    assert_non_null(strstr(err.msg, "policy"));
    c.allowed = policy;
    assert_int_equal(dsec__dns_new(&d, &c, &err), -1);
    assert_non_null(strstr(err.msg, "upstream"));
    /* the port is taken (by the shared resolver): the message names the address */
    c.nupstream = 1;
    set_in(&c.upstream[0], "127.0.0.1", up.port);
    set_in(&c.listen[0], "127.0.0.1", dns_port);
    assert_int_equal(dsec__dns_new(&d, &c, &err), -1);
    assert_int_equal(err.code, DSEC_E_IO);
    char want[32];
    snprintf(want, sizeof want, "127.0.0.1:%u", dns_port);
    assert_non_null(strstr(err.msg, want));
    assert_null(d);
}

static void allowed_names_resolve_and_are_pinned_first(void **state)
{
    (void)state;
    cb_reset();
    char buf[64];
    ldns_pkt *p = ask("127.0.0.2", "a.allowed.test", LDNS_RR_TYPE_A);
    assert_non_null(p);
    /* the pin is already there the moment the reply is read */
    const pinrec *pin = pinned(2, "192.0.2.1");
    assert_non_null(pin);
    assert_int_equal(pin->ttl, 60);
    assert_string_equal(pin->qname, "a.allowed.test");
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_NOERROR);
    assert_true(ldns_pkt_ra(p));
    assert_int_equal(ldns_pkt_ancount(p), 1);
    assert_string_equal(ans_addr(p, 0, buf, sizeof buf), "192.0.2.1");
    assert_int_equal(ldns_rr_ttl(ldns_rr_list_rr(ldns_pkt_answer(p), 0)), 60);
    ldns_pkt_free(p);

    /* AAAA, and the client's letter case changes nothing upstream */
    p = ask("127.0.0.2", "A.AlLoWeD.TeSt", LDNS_RR_TYPE_AAAA);
    assert_non_null(p);
    assert_non_null(pinned(2, "2001:db8::1"));
    assert_int_equal(ldns_pkt_ancount(p), 1);
    assert_string_equal(ans_addr(p, 0, buf, sizeof buf), "2001:db8::1");
    ldns_pkt_free(p);
    assert_true(upstream_saw("a.allowed.test"));
    assert_false(upstream_saw_case("AlLoWeD"));

    /* TTLs are clamped to [5, 300] in the reply and in the pin alike */
    p = ask("127.0.0.2", "short.allowed.test", LDNS_RR_TYPE_A);
    assert_non_null(p);
    assert_int_equal(ldns_rr_ttl(ldns_rr_list_rr(ldns_pkt_answer(p), 0)), 5);
    assert_int_equal(pinned(2, "192.0.2.5")->ttl, 5);
    ldns_pkt_free(p);
    p = ask("127.0.0.2", "long.allowed.test", LDNS_RR_TYPE_A);
    assert_non_null(p);
    assert_int_equal(ldns_rr_ttl(ldns_rr_list_rr(ldns_pkt_answer(p), 0)), 300);
    assert_int_equal(pinned(2, "192.0.2.6")->ttl, 300);
    ldns_pkt_free(p);

    /* the other sandbox has its own policy */
    p = ask("127.0.0.3", "www.other.test", LDNS_RR_TYPE_A);
    assert_non_null(p);
    assert_int_equal(ldns_pkt_ancount(p), 1);
    assert_non_null(pinned(3, "192.0.2.1"));
    ldns_pkt_free(p);
}

static void denied_names_are_refused_and_never_forwarded(void **state)
{
    (void)state;
    cb_reset();
    expect_rcode("127.0.0.2", "data.exfil.example", LDNS_RR_TYPE_A, LDNS_RCODE_REFUSED);
    expect_rcode("127.0.0.2", "c2VjcmV0.Data.EXFIL.example", LDNS_RR_TYPE_AAAA, LDNS_RCODE_REFUSED);
    expect_rcode("127.0.0.2", "exfil.example", LDNS_RR_TYPE_A, LDNS_RCODE_REFUSED);
    /* a suffix that is not a label boundary */
    expect_rcode("127.0.0.2", "evilallowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_REFUSED);
    /* one sandbox's names are not another's */
    expect_rcode("127.0.0.3", "crosscheck.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_REFUSED);
    /* an address that is no sandbox's */
    expect_rcode("127.0.0.9", "stranger.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_REFUSED);
    /* a name the policy cannot read unambiguously (a dot inside a label) */
    uint8_t q[512], r[512];
    size_t ql = mkquery("x\\.allowed.test", LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN, false, 77, q);
    ssize_t n = ask_raw("127.0.0.2", dns_port, q, ql, r, sizeof r, 2000);
    assert_true(n >= 12);
    assert_int_equal(r[3] & 0x0f, LDNS_RCODE_REFUSED);

    assert_true(refused_with(2, "data.exfil.example", "denied"));
    assert_true(refused_with(2, "c2vjcmv0.data.exfil.example", "denied"));
    assert_true(refused_with(3, "crosscheck.allowed.test", "denied"));
    assert_true(refused_with(9, "stranger.allowed.test", "denied"));
    assert_false(upstream_saw("exfil"));
    assert_false(upstream_saw("evilallowed"));
    assert_false(upstream_saw("crosscheck"));
    assert_false(upstream_saw("stranger"));
    assert_false(upstream_saw("x\\."));
}

static void other_types_are_refused_and_never_forwarded(void **state)
{
    (void)state;
    cb_reset();
    ldns_rr_type types[] = {LDNS_RR_TYPE_TXT, LDNS_RR_TYPE_NS,    LDNS_RR_TYPE_ANY,
                            LDNS_RR_TYPE_MX,  LDNS_RR_TYPE_CNAME, LDNS_RR_TYPE_PTR,
                            LDNS_RR_TYPE_SRV, LDNS_RR_TYPE_NULL,  LDNS_RR_TYPE_AXFR};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        expect_rcode("127.0.0.2", "types.allowed.test", types[i], LDNS_RCODE_REFUSED);
    /* class CHAOS A */
    ldns_pkt *p =
        ask_cls("127.0.0.2", "types.allowed.test", LDNS_RR_TYPE_A, LDNS_RR_CLASS_CH, false, 2000);
    assert_non_null(p);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_REFUSED);
    ldns_pkt_free(p);
    assert_true(refused_with(2, "types.allowed.test", "type"));
    assert_false(upstream_saw("types.allowed"));
}

static void cname_chains_stay_inside_allowed_names(void **state)
{
    (void)state;
    cb_reset();
    char buf[64];
    ldns_pkt *p = ask("127.0.0.2", "alias.allowed.test", LDNS_RR_TYPE_A);
    assert_non_null(p);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_NOERROR);
    /* the chain and its end's address only: no stray records, no other sections */
    assert_int_equal(ldns_pkt_ancount(p), 2);
    assert_int_equal(ldns_pkt_nscount(p), 0);
    assert_int_equal(ldns_pkt_arcount(p), 0);
    const ldns_rr *cn = ldns_rr_list_rr(ldns_pkt_answer(p), 0);
    assert_int_equal(ldns_rr_get_type(cn), LDNS_RR_TYPE_CNAME);
    assert_int_equal(ldns_rr_get_type(ldns_rr_list_rr(ldns_pkt_answer(p), 1)), LDNS_RR_TYPE_A);
    assert_string_equal(ans_addr(p, 1, buf, sizeof buf), "192.0.2.2");
    ldns_pkt_free(p);
    const pinrec *pin = pinned(2, "192.0.2.2");
    assert_non_null(pin);
    assert_string_equal(pin->qname, "alias.allowed.test");
    assert_null(pinned(2, "203.0.113.9"));
    assert_null(pinned(2, "203.0.113.10"));
    assert_null(pinned(2, "203.0.113.11"));

    /* a chain that leaves the allowed names: refused, nothing pinned */
    expect_rcode("127.0.0.2", "leak.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_REFUSED);
    assert_true(refused_with(2, "leak.allowed.test", "cname"));
    assert_null(pinned(2, "198.51.100.7"));

    /* a loop inside allowed names: answered without addresses, no hang */
    p = ask("127.0.0.2", "loop.allowed.test", LDNS_RR_TYPE_A);
    assert_non_null(p);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_NOERROR);
    for (size_t i = 0; i < ldns_pkt_ancount(p); i++)
        assert_int_equal(ldns_rr_get_type(ldns_rr_list_rr(ldns_pkt_answer(p), i)),
                         LDNS_RR_TYPE_CNAME);
    ldns_pkt_free(p);
}

static void nxdomain_passes_and_silence_is_servfail(void **state)
{
    (void)state;
    dsec__dns_stats s0, s1;
    dsec__dns_stats_get(dns, &s0);
    expect_rcode("127.0.0.2", "nx.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_NXDOMAIN);
    uint64_t t0 = now_us();
    expect_rcode("127.0.0.2", "silent.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_SERVFAIL);
    uint64_t ms = (now_us() - t0) / 1000u;
    assert_true(ms >= 250 && ms < 1500); /* upstream_timeout_ms is 300 */
    dsec__dns_stats_get(dns, &s1);
    assert_int_equal(s1.answered - s0.answered, 1);
    assert_int_equal(s1.upstream_timeouts - s0.upstream_timeouts, 1);
    assert_true(upstream_saw("silent.allowed.test"));
}

static void spoofed_upstream_replies_are_ignored(void **state)
{
    (void)state;
    char buf[64];
    ldns_pkt *p = ask("127.0.0.2", "spoof.allowed.test", LDNS_RR_TYPE_A);
    assert_non_null(p);
    assert_int_equal(ldns_pkt_ancount(p), 1);
    assert_string_equal(ans_addr(p, 0, buf, sizeof buf), "192.0.2.77");
    ldns_pkt_free(p);
    assert_null(pinned(2, "203.0.113.66"));
    assert_null(pinned(2, "203.0.113.67"));
}

/* 1 byte per label, 127 labels: the longest legal name; then one too long. */
static size_t long_name_query(uint8_t *q, int labels)
{
    memset(q, 0, 12);
    q[0] = 0x12, q[1] = 0x34, q[2] = 0x01, q[5] = 1;
    size_t o = 12;
    for (int i = 0; i < labels; i++)
        q[o++] = 1, q[o++] = 'a';
    q[o++] = 0;
    q[o++] = 0, q[o++] = 1, q[o++] = 0, q[o++] = 1;
    return o;
}

static void malformed_packets_get_formerr_or_nothing(void **state)
{
    (void)state;
    uint8_t q[1024], r[4096];
    size_t ql = mkquery("m.allowed.test", LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN, false, 0x4242, q);

    /* under a header: nothing */
    assert_true(ask_raw("127.0.0.2", dns_port, q, 5, r, sizeof r, 200) < 0);
    /* a response: nothing (no reflection loops) */
    uint8_t resp[512];
    memcpy(resp, q, ql);
    resp[2] |= 0x80;
    assert_true(ask_raw("127.0.0.2", dns_port, resp, ql, r, sizeof r, 200) < 0);

    /* qdcount 0 and 2 */
    uint8_t b[512];
    memcpy(b, q, ql);
    b[5] = 0;
    ssize_t n = ask_raw("127.0.0.2", dns_port, b, ql, r, sizeof r, 2000);
    assert_int_equal(n, 12);
    assert_int_equal(r[0] << 8 | r[1], 0x4242);
    assert_int_equal(r[3] & 0x0f, LDNS_RCODE_FORMERR);
    b[5] = 2;
    n = ask_raw("127.0.0.2", dns_port, b, ql, r, sizeof r, 2000);
    assert_int_equal(r[3] & 0x0f, LDNS_RCODE_FORMERR);

    /* a compression pointer to itself */
    uint8_t loop[] = {0xab, 0xcd, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1};
    n = ask_raw("127.0.0.2", dns_port, loop, sizeof loop, r, sizeof r, 2000);
    assert_int_equal(n, 12);
    assert_int_equal(r[3] & 0x0f, LDNS_RCODE_FORMERR);

    /* the longest legal name (not allowed: refused); one label more: FORMERR */
    size_t ll = long_name_query(b, 127);
    n = ask_raw("127.0.0.2", dns_port, b, ll, r, sizeof r, 2000);
    assert_true(n >= 12);
    assert_int_equal(r[3] & 0x0f, LDNS_RCODE_REFUSED);
    ll = long_name_query(b, 128);
    n = ask_raw("127.0.0.2", dns_port, b, ll, r, sizeof r, 2000);
    assert_int_equal(r[3] & 0x0f, LDNS_RCODE_FORMERR);

    /* an opcode other than QUERY (UPDATE) */
    memcpy(b, q, ql);
    b[2] = (uint8_t)(5 << 3);
    n = ask_raw("127.0.0.2", dns_port, b, ql, r, sizeof r, 2000);
    assert_int_equal(n, 12);
    assert_int_equal(r[3] & 0x0f, LDNS_RCODE_REFUSED);

    /* every truncation of a good query, and random bytes, through the offline path */
    dsec__dns_conf oc = {.allowed = policy};
    dsec__dns *off = NULL;
    dsec_err err;
    assert_int_equal(dsec__dns_new(&off, &oc, &err), 0);
    struct sockaddr_storage cl;
    set_in(&cl, "127.0.0.2", 5353);
    for (size_t len = 0; len <= ql; len++) {
        uint8_t *rep = NULL;
        size_t rl = 0;
        uint8_t *exact = dsec_malloc(len ? len : 1);
        memcpy(exact, q, len);
        assert_int_equal(
            dsec__dns_query_offline(off, (struct sockaddr *)&cl, exact, len, &rep, &rl), 0);
        if (len < 12)
            assert_null(rep);
        else if (len < ql)
            assert_true(rep != NULL && rl == 12 && (rep[3] & 0x0f) == LDNS_RCODE_FORMERR);
        else
            assert_null(rep); /* complete and allowed: it would be forwarded */
        dsec_free(rep);
        dsec_free(exact);
    }
    srand(12345);
    for (int i = 0; i < 20000; i++) {
        size_t len = (size_t)(rand() % 300);
        uint8_t *pk = dsec_malloc(len ? len : 1);
        for (size_t k = 0; k < len; k++)
            pk[k] = (uint8_t)rand();
        if (len > 12 && i % 2 == 0) /* keep half of them plausible headers */
            pk[2] &= 0x07, pk[4] = 0, pk[5] = 1;
        uint8_t *rep = NULL;
        size_t rl = 0;
        assert_int_equal(dsec__dns_query_offline(off, (struct sockaddr *)&cl, pk, len, &rep, &rl),
                         0);
        if (rep != NULL) {
            assert_true(rl >= 12);
            assert_true(rep[2] & 0x80);
            assert_int_equal(rep[0] << 8 | rep[1], pk[0] << 8 | pk[1]);
        }
        dsec_free(rep);
        dsec_free(pk);
    }
    dsec__dns_free(off);

    /* random bytes at the live resolver, then it still serves */
    int fd = client_sock("127.0.0.2", SOCK_DGRAM);
    struct sockaddr_storage to;
    set_in(&to, "127.0.0.1", dns_port);
    for (int i = 0; i < 500; i++) {
        uint8_t pk[300];
        size_t len = (size_t)(rand() % (int)sizeof pk);
        for (size_t k = 0; k < len; k++)
            pk[k] = (uint8_t)rand();
        pk[2] &= 0x7f;
        sendto(fd, pk, len, 0, (struct sockaddr *)&to, sizeof(struct sockaddr_in));
        if (i % 50 == 0)
            usleep(10000); /* stay under the client's rate */
    }
    close(fd);
    expect_rcode("127.0.0.2", "a.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_NOERROR);
}

static int tcp_connect(const char *src, uint16_t port)
{
    int fd = client_sock(src, SOCK_STREAM);
    assert_true(fd >= 0);
    struct sockaddr_storage to;
    set_in(&to, "127.0.0.1", port);
    assert_int_equal(connect(fd, (struct sockaddr *)&to, sizeof(struct sockaddr_in)), 0);
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static ldns_pkt *tcp_read(int fd)
{
    uint8_t hdr[2], buf[65536];
    if (recv(fd, hdr, 2, MSG_WAITALL) != 2)
        return NULL;
    size_t len = (size_t)hdr[0] << 8 | hdr[1];
    if (recv(fd, buf, len, MSG_WAITALL) != (ssize_t)len)
        return NULL;
    ldns_pkt *p = NULL;
    assert_int_equal(ldns_wire2pkt(&p, buf, len), LDNS_STATUS_OK);
    return p;
}

static void tcp_works_and_big_answers_truncate_over_udp(void **state)
{
    (void)state;
    cb_reset();
    /* 40 addresses do not fit 512 bytes: TC, no answers, nothing pinned */
    ldns_pkt *p = ask("127.0.0.2", "big.allowed.test", LDNS_RR_TYPE_A);
    assert_non_null(p);
    assert_true(ldns_pkt_tc(p));
    assert_int_equal(ldns_pkt_ancount(p), 0);
    ldns_pkt_free(p);
    assert_null(pinned(2, "10.1.0.1"));
    /* with EDNS (1232 bytes) they fit */
    p = ask_cls("127.0.0.2", "big.allowed.test", LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN, true, 2000);
    assert_non_null(p);
    assert_false(ldns_pkt_tc(p));
    assert_int_equal(ldns_pkt_ancount(p), 40);
    assert_true(ldns_pkt_edns(p));
    ldns_pkt_free(p);

    /* over TCP: two pipelined queries in one write, then a denied one */
    int fd = tcp_connect("127.0.0.2", dns_port);
    uint8_t w[2048];
    size_t o = 0;
    const char *names[] = {"big.allowed.test", "a.allowed.test"};
    for (int i = 0; i < 2; i++) {
        size_t l = mkquery(names[i], LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN, false, (uint16_t)(100 + i),
                           w + o + 2);
        w[o] = (uint8_t)(l >> 8), w[o + 1] = (uint8_t)l;
        o += 2 + l;
    }
    assert_int_equal(send(fd, w, o, 0), (ssize_t)o);
    int got = 0;
    for (int i = 0; i < 2; i++) {
        p = tcp_read(fd);
        assert_non_null(p);
        assert_false(ldns_pkt_tc(p));
        if (ldns_pkt_id(p) == 100)
            assert_int_equal(ldns_pkt_ancount(p), 40), got |= 1;
        else if (ldns_pkt_id(p) == 101)
            assert_int_equal(ldns_pkt_ancount(p), 1), got |= 2;
        ldns_pkt_free(p);
    }
    assert_int_equal(got, 3);
    assert_non_null(pinned(2, "10.1.0.40"));
    size_t l = mkquery("tcp.exfil.example", LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN, false, 7, w + 2);
    w[0] = (uint8_t)(l >> 8), w[1] = (uint8_t)l;
    assert_int_equal(send(fd, w, l + 2, 0), (ssize_t)(l + 2));
    p = tcp_read(fd);
    assert_non_null(p);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_REFUSED);
    ldns_pkt_free(p);
    assert_false(upstream_saw("tcp.exfil"));
    /* a bad frame length closes the connection */
    w[0] = 0, w[1] = 3;
    assert_int_equal(send(fd, w, 5, 0), 5);
    uint8_t c;
    assert_int_equal(recv(fd, &c, 1, 0), 0);
    close(fd);

    /* at most 8 connections per client: the ninth is closed at once */
    int fds[9];
    for (int i = 0; i < 9; i++)
        fds[i] = tcp_connect("127.0.0.6", dns_port);
    assert_int_equal(recv(fds[8], &c, 1, 0), 0);
    for (int i = 0; i < 8; i++) {
        l = mkquery("a.allowed.test", LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN, false, 9, w + 2);
        w[0] = (uint8_t)(l >> 8), w[1] = (uint8_t)l;
        assert_int_equal(send(fds[i], w, l + 2, 0), (ssize_t)(l + 2));
        p = tcp_read(fds[i]);
        assert_non_null(p);
        assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_NOERROR);
        ldns_pkt_free(p);
    }
    for (int i = 0; i < 9; i++)
        close(fds[i]);
}

/* ---- upstream over TCP, the cache ---------------------------------------------------------- */

/* One query over TCP from src; the parsed reply or NULL. */
static ldns_pkt *ask_tcp(const char *src, const char *name, ldns_rr_type t, uint16_t id)
{
    int fd = tcp_connect(src, dns_port);
    uint8_t w[600];
    size_t l = mkquery(name, t, LDNS_RR_CLASS_IN, false, id, w + 2);
    w[0] = (uint8_t)(l >> 8), w[1] = (uint8_t)l;
    assert_int_equal(send(fd, w, l + 2, 0), (ssize_t)(l + 2));
    ldns_pkt *p = tcp_read(fd);
    close(fd);
    return p;
}

static void truncated_upstream_answers_are_asked_again_over_tcp(void **state)
{
    (void)state;
    cb_reset();
    dsec__dns_stats s0, s1;
    dsec__dns_stats_get(dns, &s0);
    /* truncated over UDP, three addresses over TCP: the client gets them whole over UDP */
    char buf[64];
    ldns_pkt *p = ask("127.0.0.2", "tc.allowed.test", LDNS_RR_TYPE_A);
    assert_non_null(p);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_NOERROR);
    assert_false(ldns_pkt_tc(p));
    assert_int_equal(ldns_pkt_ancount(p), 3);
    assert_string_equal(ans_addr(p, 2, buf, sizeof buf), "192.0.2.33");
    ldns_pkt_free(p);
    assert_non_null(pinned(2, "192.0.2.31"));
    assert_int_equal(upstream_count("tc.allowed.test", false), 1);
    assert_int_equal(upstream_count("tc.allowed.test", true), 1);

    /* 200 addresses: too big for the client's UDP even with EDNS, so TC and
     * nothing pinned; over TCP to the resolver the client gets all (from the
     * cache: the upstream is not asked a second time) */
    p = ask_cls("127.0.0.2", "tcbig.allowed.test", LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN, true, 2000);
    assert_non_null(p);
    assert_true(ldns_pkt_tc(p));
    assert_int_equal(ldns_pkt_ancount(p), 0);
    ldns_pkt_free(p);
    assert_null(pinned(2, "10.2.1.100"));
    p = ask_tcp("127.0.0.2", "tcbig.allowed.test", LDNS_RR_TYPE_A, 4242);
    assert_non_null(p);
    assert_int_equal(ldns_pkt_id(p), 4242);
    assert_false(ldns_pkt_tc(p));
    assert_int_equal(ldns_pkt_ancount(p), 200);
    ldns_pkt_free(p);
    assert_non_null(pinned(2, "10.2.1.100"));
    assert_int_equal(upstream_count("tcbig.allowed.test", true), 1);
    dsec__dns_stats_get(dns, &s1);
    assert_int_equal(s1.upstream_tcp - s0.upstream_tcp, 2);
}

static void broken_or_silent_tcp_upstreams_give_servfail(void **state)
{
    (void)state;
    cb_reset();
    /* unparseable, the largest frame of junk (and more behind it), cut
     * short, the wrong id: SERVFAIL at once, nothing pinned */
    const char *names[] = {"tcbad.allowed.test", "tcover.allowed.test", "tcshort.allowed.test",
                           "tcwrongid.allowed.test"};
    for (size_t i = 0; i < 4; i++) {
        uint64_t t0 = now_us();
        expect_rcode("127.0.0.2", names[i], LDNS_RR_TYPE_A, LDNS_RCODE_SERVFAIL);
        assert_true(now_us() - t0 < 250000u); /* not the timeout */
        assert_int_equal(upstream_count(names[i], true), 1);
    }
    assert_null(pinned(2, "203.0.113.70"));
    /* failures are not cached */
    expect_rcode("127.0.0.2", "tcbad.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_SERVFAIL);
    assert_int_equal(upstream_count("tcbad.allowed.test", true), 2);

    /* connected, never answered: SERVFAIL after the upstream timeout (300 ms) */
    dsec__dns_stats s0, s1;
    dsec__dns_stats_get(dns, &s0);
    uint64_t t0 = now_us();
    expect_rcode("127.0.0.2", "tcslow.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_SERVFAIL);
    uint64_t ms = (now_us() - t0) / 1000u;
    assert_true(ms >= 250 && ms < 1500);
    dsec__dns_stats_get(dns, &s1);
    assert_int_equal(s1.upstream_timeouts - s0.upstream_timeouts, 1);
    /* and it still serves */
    expect_rcode("127.0.0.2", "tc.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_NOERROR);
}

static void answers_are_cached_with_their_ttl_counting_down(void **state)
{
    (void)state;
    cb_reset();
    ldns_pkt *p = ask("127.0.0.2", "cache1.allowed.test", LDNS_RR_TYPE_A);
    assert_non_null(p);
    assert_int_equal(ldns_rr_ttl(ldns_rr_list_rr(ldns_pkt_answer(p), 0)), 60);
    ldns_pkt_free(p);
    usleep(1100000);
    dsec__dns_stats s0, s1;
    dsec__dns_stats_get(dns, &s0);
    /* another sandbox, over UDP and TCP: the upstream is not asked again */
    p = ask("127.0.0.5", "cache1.allowed.test", LDNS_RR_TYPE_A);
    assert_non_null(p);
    assert_int_equal(ldns_pkt_ancount(p), 1);
    uint32_t ttl = ldns_rr_ttl(ldns_rr_list_rr(ldns_pkt_answer(p), 0));
    assert_true(ttl >= 55 && ttl <= 59);
    ldns_pkt_free(p);
    const pinrec *pin = pinned(5, "192.0.2.41");
    assert_non_null(pin);
    assert_int_equal(pin->ttl, ttl); /* the pin lasts as long as the client may keep it */
    p = ask_tcp("127.0.0.6", "Cache1.Allowed.Test", LDNS_RR_TYPE_A, 77);
    assert_non_null(p);
    assert_int_equal(ldns_pkt_ancount(p), 1);
    assert_true(ldns_rr_ttl(ldns_rr_list_rr(ldns_pkt_answer(p), 0)) <= ttl);
    ldns_pkt_free(p);
    assert_non_null(pinned(6, "192.0.2.41"));
    assert_int_equal(upstream_count("cache1.allowed.test", false), 1);
    dsec__dns_stats_get(dns, &s1);
    assert_int_equal(s1.cache_hits - s0.cache_hits, 2);
    assert_int_equal(s1.upstream_sent - s0.upstream_sent, 0);
    /* another type is another entry (the fake has only an A record: no addresses) */
    p = ask("127.0.0.2", "cache1.allowed.test", LDNS_RR_TYPE_AAAA);
    assert_non_null(p);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_NOERROR);
    assert_int_equal(ldns_pkt_ancount(p), 0);
    ldns_pkt_free(p);
    assert_int_equal(upstream_count("cache1.allowed.test", false), 2);
}

static void cached_answers_still_meet_each_sandbox_policy(void **state)
{
    (void)state;
    cb_reset();
    /* cached by the first sandbox's query (the CNAME test may have done it already) */
    ldns_pkt *p = ask("127.0.0.2", "alias.allowed.test", LDNS_RR_TYPE_A);
    assert_non_null(p);
    assert_int_equal(ldns_pkt_ancount(p), 2);
    ldns_pkt_free(p);
    size_t asked = upstream_count("alias.allowed.test", false);
    assert_true(asked >= 1);
    /* a sandbox whose policy does not allow the name: refused, as before any cache */
    expect_rcode("127.0.0.3", "alias.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_REFUSED);
    assert_true(refused_with(3, "alias.allowed.test", "denied"));
    assert_null(pinned(3, "192.0.2.2"));
    /* one that allows the name but not where its CNAME leads: refused too */
    expect_rcode("127.0.0.4", "alias.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_REFUSED);
    assert_true(refused_with(4, "alias.allowed.test", "cname"));
    assert_null(pinned(4, "192.0.2.2"));
    /* one that allows both gets the filtered chain, pinned for itself */
    p = ask("127.0.0.5", "alias.allowed.test", LDNS_RR_TYPE_A);
    assert_non_null(p);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_NOERROR);
    assert_int_equal(ldns_pkt_ancount(p), 2);
    ldns_pkt_free(p);
    assert_non_null(pinned(5, "192.0.2.2"));
    assert_null(pinned(5, "203.0.113.9"));
    assert_int_equal(upstream_count("alias.allowed.test", false), asked);
}

static void cache_entries_expire_and_failures_are_not_kept(void **state)
{
    (void)state;
    const char *names[] = {"exp.allowed.test",    "negshort.allowed.test",  "neglong.allowed.test",
                           "nodata.allowed.test", "othertype.allowed.test", "sf.allowed.test"};
    ldns_pkt_rcode rcs[] = {LDNS_RCODE_NOERROR, LDNS_RCODE_NXDOMAIN, LDNS_RCODE_NXDOMAIN,
                            LDNS_RCODE_NOERROR, LDNS_RCODE_NOERROR,  LDNS_RCODE_SERVFAIL};
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < 6; i++)
            expect_rcode("127.0.0.2", names[i], LDNS_RR_TYPE_A, rcs[i]);
    assert_int_equal(upstream_count("othertype.allowed.test", false), 1);
    assert_int_equal(upstream_count("exp.allowed.test", false), 1);
    assert_int_equal(upstream_count("negshort.allowed.test", false), 1);
    assert_int_equal(upstream_count("neglong.allowed.test", false), 1);
    assert_int_equal(upstream_count("nodata.allowed.test", false), 1);
    assert_int_equal(upstream_count("sf.allowed.test", false), 2); /* SERVFAIL is not kept */
    /* TTL 0 (5 s after clamping) and negative answers with a SOA minimum of
     * 1 and TTL 2 s (5 s) are gone after 5 s, and so is a NODATA without a
     * SOA, whatever the TTL of the other type's record beside it; a SOA of
     * 3600 s keeps the NXDOMAIN for 60 s */
    usleep(5300000);
    for (size_t i = 0; i < 5; i++)
        expect_rcode("127.0.0.2", names[i], LDNS_RR_TYPE_A, rcs[i]);
    assert_int_equal(upstream_count("exp.allowed.test", false), 2);
    assert_int_equal(upstream_count("negshort.allowed.test", false), 2);
    assert_int_equal(upstream_count("nodata.allowed.test", false), 2);
    assert_int_equal(upstream_count("othertype.allowed.test", false), 2);
    assert_int_equal(upstream_count("neglong.allowed.test", false), 1);
}

static void the_cache_is_bounded(void **state)
{
    (void)state;
    uint16_t port = free_port();
    dsec__dns *d = mk_resolver(port, 1000, 1000, 32, 4); /* four entries */
    assert_non_null(d);
    uint16_t shared = dns_port;
    dns_port = port; /* ask() goes to dns_port */
    char name[64];
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof name, "pbound%d.allowed.test", i);
        expect_rcode("127.0.0.2", name, LDNS_RR_TYPE_A, LDNS_RCODE_NOERROR);
    }
    dsec__dns_stats st;
    dsec__dns_stats_get(d, &st);
    assert_int_equal(st.cache_entries, 4);
    assert_int_equal(st.cache_evictions, 6);
    /* the newest is still there, the oldest went first */
    expect_rcode("127.0.0.2", "pbound9.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_NOERROR);
    assert_int_equal(upstream_count("pbound9.allowed.test", false), 1);
    expect_rcode("127.0.0.2", "pbound0.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_NOERROR);
    assert_int_equal(upstream_count("pbound0.allowed.test", false), 2);
    dsec__dns_stats_get(d, &st);
    assert_int_equal(st.cache_entries, 4);
    dns_port = shared;
    dsec__dns_free(d);
}

static void identical_queries_in_flight_share_one_upstream_query(void **state)
{
    (void)state;
    cb_reset();
    dsec__dns_stats s0, s1;
    dsec__dns_stats_get(dns, &s0);
    const char *src[] = {"127.0.0.2", "127.0.0.5", "127.0.0.6", "127.0.0.3"};
    int fds[4];
    struct sockaddr_storage to;
    set_in(&to, "127.0.0.1", dns_port);
    uint8_t q[512], r[512];
    for (int i = 0; i < 4; i++) {
        fds[i] = client_sock(src[i], SOCK_DGRAM);
        assert_true(fds[i] >= 0);
        size_t ql = mkquery("slow.allowed.test", LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN, false,
                            (uint16_t)(900 + i), q);
        assert_int_equal(
            sendto(fds[i], q, ql, 0, (struct sockaddr *)&to, sizeof(struct sockaddr_in)),
            (ssize_t)ql);
    }
    for (int i = 0; i < 4; i++) {
        struct pollfd pfd = {.fd = fds[i], .events = POLLIN};
        assert_int_equal(poll(&pfd, 1, 2000), 1);
        ssize_t n = recv(fds[i], r, sizeof r, 0);
        ldns_pkt *p = NULL;
        assert_int_equal(ldns_wire2pkt(&p, r, (size_t)n), LDNS_STATUS_OK);
        assert_int_equal(ldns_pkt_id(p), 900 + i);
        /* the sandbox that may not ask is refused before any sharing */
        assert_int_equal(ldns_pkt_get_rcode(p), i == 3 ? LDNS_RCODE_REFUSED : LDNS_RCODE_NOERROR);
        assert_int_equal(ldns_pkt_ancount(p), i == 3 ? 0 : 1);
        ldns_pkt_free(p);
        close(fds[i]);
    }
    assert_non_null(pinned(2, "192.0.2.43"));
    assert_non_null(pinned(5, "192.0.2.43"));
    assert_non_null(pinned(6, "192.0.2.43"));
    assert_null(pinned(3, "192.0.2.43"));
    assert_int_equal(upstream_count("slow.allowed.test", false), 1);
    dsec__dns_stats_get(dns, &s1);
    assert_int_equal(s1.coalesced - s0.coalesced, 2);
}

static void stats_count_what_happened(void **state)
{
    (void)state;
    usleep(100000); /* let stray packets of earlier tests settle */
    dsec__dns_stats s0, s1;
    dsec__dns_stats_get(dns, &s0);
    expect_rcode("127.0.0.2", "pstats.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_NOERROR);
    expect_rcode("127.0.0.5", "pstats.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_NOERROR);
    expect_rcode("127.0.0.2", "stats.exfil.example", LDNS_RR_TYPE_A, LDNS_RCODE_REFUSED);
    expect_rcode("127.0.0.2", "a.allowed.test", LDNS_RR_TYPE_TXT, LDNS_RCODE_REFUSED);
    uint8_t r[512], junk[3] = {1, 2, 3};
    assert_true(ask_raw("127.0.0.2", dns_port, junk, sizeof junk, r, sizeof r, 200) < 0);
    dsec__dns_stats_get(dns, &s1);
    assert_int_equal(s1.queries - s0.queries, 5);
    assert_int_equal(s1.answered - s0.answered, 2);
    assert_int_equal(s1.refused - s0.refused, 2);
    assert_int_equal(s1.dropped - s0.dropped, 1);
    assert_int_equal(s1.upstream_sent - s0.upstream_sent, 1);
    assert_int_equal(s1.upstream_timeouts - s0.upstream_timeouts, 0);
    assert_int_equal(s1.cache_misses - s0.cache_misses, 1);
    assert_int_equal(s1.cache_hits - s0.cache_hits, 1); /* the second sandbox's */
    assert_int_equal(s1.upstream_tcp - s0.upstream_tcp, 0);
}

/* ---- flood and fairness ------------------------------------------------------------------- */

typedef struct flood_arg {
    uint16_t port;
    volatile bool *done;
    size_t sent;
} flood_arg;

static void *flooder(void *arg)
{
    flood_arg *f = arg;
    int fds[4]; /* several source ports: the resolver must tell clients by address */
    for (int i = 0; i < 4; i++)
        fds[i] = client_sock("127.0.0.5", SOCK_DGRAM);
    struct sockaddr_storage to;
    set_in(&to, "127.0.0.1", f->port);
    uint8_t q[512];
    size_t ql = mkquery("flood.allowed.test", LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN, false, 1, q);
    uint64_t t0 = now_us();
    /* at least 20,000, and on until the other client is done (3 s at most) */
    while (f->sent < 20000 || (!*f->done && now_us() - t0 < 3000000u)) {
        q[0] = (uint8_t)f->sent, q[1] = (uint8_t)(f->sent >> 8);
        if (sendto(fds[f->sent % 4], q, ql, 0, (struct sockaddr *)&to, sizeof(struct sockaddr_in)) >
            0)
            f->sent++;
    }
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    return NULL;
}

static void inflight_cap_answers_servfail_at_once(void **state)
{
    (void)state;
    uint16_t port = free_port();
    dsec__dns *d = mk_resolver(port, 1000, 1000, 2, 0); /* two upstream queries per client */
    assert_non_null(d);
    int fd = client_sock("127.0.0.2", SOCK_DGRAM);
    struct sockaddr_storage to;
    set_in(&to, "127.0.0.1", port);
    uint8_t q[512], r[512];
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "silent%d.allowed.test", i);
        size_t ql = mkquery(name, LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN, false, (uint16_t)(500 + i), q);
        assert_int_equal(sendto(fd, q, ql, 0, (struct sockaddr *)&to, sizeof(struct sockaddr_in)),
                         (ssize_t)ql);
    }
    /* the third is over the cap: SERVFAIL long before the 300 ms upstream timeout */
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 150), 1);
    assert_true(recv(fd, r, sizeof r, 0) >= 12);
    assert_int_equal(r[0] << 8 | r[1], 502);
    assert_int_equal(r[3] & 0x0f, LDNS_RCODE_SERVFAIL);
    /* the other two time out */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(poll(&pfd, 1, 2000), 1);
        assert_true(recv(fd, r, sizeof r, 0) >= 12);
        assert_int_equal(r[3] & 0x0f, LDNS_RCODE_SERVFAIL);
    }
    close(fd);
    dsec__dns_stats st;
    dsec__dns_stats_get(d, &st);
    assert_int_equal(st.upstream_sent, 2);
    assert_int_equal(st.upstream_timeouts, 2);
    dsec__dns_free(d);
}

static void listens_before_the_gateway_exists_and_on_ipv6(void **state)
{
    (void)state;
    uint16_t port = free_port();
    dsec__dns_conf c = {.nlisten = 2, .nupstream = 1, .allowed = policy};
    /* an address on no interface (TEST-NET-1): FREEBIND lets it bind now */
    set_in(&c.listen[0], "192.0.2.53", port);
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&c.listen[1];
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(port);
    a6->sin6_addr = in6addr_loopback;
    set_in(&c.upstream[0], "127.0.0.1", up.port);
    dsec__dns *d = NULL;
    dsec_err err;
    if (dsec__dns_new(&d, &c, &err) < 0)
        fail_msg("dsec__dns_new: %s", err.msg);
    /* ::1 is no sandbox's address: the reply comes back over IPv6, REFUSED */
    int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    uint8_t q[512], r[512];
    size_t ql = mkquery("a.allowed.test", LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN, false, 61, q);
    assert_int_equal(sendto(fd, q, ql, 0, (struct sockaddr *)a6, sizeof *a6), (ssize_t)ql);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    assert_int_equal(poll(&pfd, 1, 2000), 1);
    assert_true(recv(fd, r, sizeof r, 0) >= 12);
    assert_int_equal(r[0] << 8 | r[1], 61);
    assert_int_equal(r[3] & 0x0f, LDNS_RCODE_REFUSED);
    close(fd);
    dsec__dns_free(d);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void a_flood_does_not_starve_other_clients(void **state)
{
    (void)state;
    uint16_t port = free_port();
    dsec__dns *d = mk_resolver(port, 0, 0, 0, 0); /* the defaults: 100 qps, burst 200 */
    assert_non_null(d);
    cb_reset();
    volatile bool done = false;
    flood_arg fa = {.port = port, .done = &done};
    pthread_t th;
    uint64_t t0 = now_us();
    assert_int_equal(pthread_create(&th, NULL, flooder, &fa), 0);
    usleep(20000);
    uint8_t q[512], r[4096];
    uint64_t worst = 0, lats[30];
    int fd = client_sock("127.0.0.3", SOCK_DGRAM);
    struct sockaddr_storage to;
    set_in(&to, "127.0.0.1", port);
    for (int i = 0; i < 30; i++) {
        size_t ql = mkquery("www.other.test", LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN, false,
                            (uint16_t)(1000 + i), q);
        uint64_t s = now_us();
        assert_int_equal(sendto(fd, q, ql, 0, (struct sockaddr *)&to, sizeof(struct sockaddr_in)),
                         (ssize_t)ql);
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        assert_int_equal(poll(&pfd, 1, 1000), 1);
        ssize_t n = recv(fd, r, sizeof r, 0);
        assert_true(n >= 12);
        assert_int_equal(r[0] << 8 | r[1], 1000 + i);
        assert_int_equal(r[3] & 0x0f, LDNS_RCODE_NOERROR);
        uint64_t lat = now_us() - s;
        lats[i] = lat;
        if (lat > worst)
            worst = lat;
        usleep(20000);
    }
    close(fd);
    done = true;
    pthread_join(th, NULL);
    double secs = (double)(now_us() - t0) / 1e6;
    usleep(200000);
    dsec__dns_stats st;
    dsec__dns_stats_get(d, &st);
    pthread_mutex_lock(&cb.mu);
    size_t floods = cb.floods[5];
    pthread_mutex_unlock(&cb.mu);
    qsort(lats, 30, sizeof lats[0], cmp_u64);
    printf("flood: %zu packets in %.2f s from one client; the other client's latency over 30 "
           "queries: median %.1f ms, worst %.1f ms; resolver saw %llu, dropped %llu, %zu "
           "\"flood\" reports\n",
           fa.sent, secs, (double)lats[15] / 1000.0, (double)worst / 1000.0,
           (unsigned long long)st.queries, (unsigned long long)st.dropped, floods);
    assert_true(worst < 500000u);
    /* reported, but about once a second, not per packet */
    assert_true(floods >= 1);
    assert_true(floods <= (size_t)secs + 2);
    /* the flooder got no more than its burst plus its rate upstream */
    assert_true(st.upstream_sent <= 30 + 200 + (uint64_t)(100 * (secs + 1)));
    assert_true(st.dropped > 0);
    dsec__dns_free(d);
}

/* ---- throughput (printed, not asserted) ---------------------------------------------------- */

/* total queries for <prefix><i>.<zone>, window of them in flight; answers per second. */
static double run_window(uint16_t port, const char *src, const char *prefix, const char *zone,
                         int total, int window, int *lost)
{
    int fd = client_sock(src, SOCK_DGRAM);
    assert_true(fd >= 0);
    int sz = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
    struct sockaddr_storage to;
    set_in(&to, "127.0.0.1", port);
    uint8_t q[512], r[4096];
    char name[128];
    int sent = 0, got = 0;
    uint64_t t0 = now_us();
    *lost = 0;
    while (got + *lost < total) {
        while (sent < total && sent - got - *lost < window) {
            snprintf(name, sizeof name, "%s%d.%s", prefix, sent, zone);
            size_t ql = mkquery(name, LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN, false, (uint16_t)sent, q);
            sendto(fd, q, ql, 0, (struct sockaddr *)&to, sizeof(struct sockaddr_in));
            sent++;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 1000) != 1) {
            *lost = sent - got; /* whatever is still out is lost */
            break;
        }
        if (recv(fd, r, sizeof r, 0) >= 12)
            got++;
    }
    double secs = (double)(now_us() - t0) / 1e6;
    close(fd);
    return got / secs;
}

/* An upstream reply to name/type under id, as wire bytes into out (its length). */
static size_t up_wire(uint16_t id, const char *name, ldns_rr_type t, ldns_pkt_rcode rc, bool tc,
                      const char *ans1, const char *ans2, uint8_t *out)
{
    ldns_pkt *q = NULL;
    assert_int_equal(ldns_pkt_query_new_frm_str(&q, name, t, LDNS_RR_CLASS_IN, LDNS_RD),
                     LDNS_STATUS_OK);
    ldns_pkt_set_id(q, id);
    ldns_pkt *r = fake_reply_to(q);
    ldns_pkt_set_rcode(r, rc);
    ldns_pkt_set_tc(r, tc);
    if (ans1 != NULL)
        add_rr(r, LDNS_SECTION_ANSWER, "%s", ans1);
    if (ans2 != NULL)
        add_rr(r, LDNS_SECTION_ANSWER, "%s", ans2);
    if (rc == LDNS_RCODE_NXDOMAIN)
        add_soa(r, 3600, 30);
    uint8_t *w = NULL;
    size_t n = 0;
    assert_int_equal(ldns_pkt2wire(&w, r, &n), LDNS_STATUS_OK);
    memcpy(out, w, n);
    LDNS_FREE(w);
    ldns_pkt_free(r);
    ldns_pkt_free(q);
    return n;
}

/* The client's reply from dsec__dns_upstream_offline, parsed (id checked). */
static ldns_pkt *offline_ask(dsec__dns *d, const char *src, const char *name, const uint8_t *upw,
                             size_t upl, unsigned flags)
{
    struct sockaddr_storage cl;
    set_in(&cl, src, 5353);
    uint8_t q[512], out[65536];
    size_t ql = mkquery(name, LDNS_RR_TYPE_A, LDNS_RR_CLASS_IN, false, 0x4242, q), n = 0;
    assert_int_equal(dsec__dns_upstream_offline(d, (struct sockaddr *)&cl, q, ql, upw, upl, flags,
                                                out, sizeof out, &n),
                     0);
    assert_true(n >= 12);
    ldns_pkt *p = NULL;
    assert_int_equal(ldns_wire2pkt(&p, out, n), LDNS_STATUS_OK);
    assert_int_equal(ldns_pkt_id(p), 0x4242);
    return p;
}

static void the_offline_upstream_path_filters_pins_and_caches(void **state)
{
    (void)state;
    dsec__dns_conf c = {.allowed = policy, .pin = on_pin, .refused = on_refused};
    dsec__dns *d = NULL;
    dsec_err err;
    assert_int_equal(dsec__dns_new(&d, &c, &err), 0);
    uint8_t w[4096];
    dsec__dns_stats st;
    cb_reset();

    /* a chain inside the allowed names: answered, clamped, pinned, kept */
    size_t n = up_wire(0x4242, "a.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_NOERROR, false,
                       "a.allowed.test. 60 IN CNAME b.allowed.test.",
                       "b.allowed.test. 86400 IN A 192.0.2.5", w);
    ldns_pkt *p = offline_ask(d, "127.0.0.4", "a.allowed.test", w, n, 0);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_NOERROR);
    assert_int_equal(ldns_pkt_ancount(p), 2);
    ldns_pkt_free(p);
    const pinrec *pin = pinned(4, "192.0.2.5");
    assert_non_null(pin);
    assert_int_equal(pin->ttl, 300);
    /* again, with no reply to give: from the cache */
    cb_reset();
    p = offline_ask(d, "127.0.0.4", "a.allowed.test", NULL, 0, 0);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_NOERROR);
    assert_int_equal(ldns_pkt_ancount(p), 2);
    ldns_pkt_free(p);
    assert_non_null(pinned(4, "192.0.2.5"));
    dsec__dns_stats_get(d, &st);
    assert_int_equal(st.cache_hits, 1);
    assert_int_equal(st.cache_entries, 1);

    /* a chain that leaves this client's names: REFUSED, nothing pinned */
    cb_reset();
    n = up_wire(0x4242, "c.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_NOERROR, false,
                "c.allowed.test. 60 IN CNAME target.allowed.test.",
                "target.allowed.test. 60 IN A 192.0.2.6", w);
    p = offline_ask(d, "127.0.0.4", "c.allowed.test", w, n, 0);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_REFUSED);
    assert_int_equal(ldns_pkt_ancount(p), 0);
    ldns_pkt_free(p);
    assert_int_equal(cb.npins, 0);
    assert_true(refused_with(4, "c.allowed.test", "cname"));

    /* another id, or truncated over UDP: SERVFAIL, not kept */
    n = up_wire(0x4243, "d.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_NOERROR, false,
                "d.allowed.test. 60 IN A 192.0.2.7", NULL, w);
    p = offline_ask(d, "127.0.0.4", "d.allowed.test", w, n, 0);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_SERVFAIL);
    ldns_pkt_free(p);
    n = up_wire(0x4242, "d.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_NOERROR, true, NULL, NULL, w);
    p = offline_ask(d, "127.0.0.4", "d.allowed.test", w, n, 0);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_SERVFAIL);
    ldns_pkt_free(p);
    assert_int_equal(cb.npins, 0);
    /* the TCP reply after it: answered; truncated again over TCP: SERVFAIL */
    p = offline_ask(d, "127.0.0.4", "d.allowed.test", w, n, DSEC__DNS_OFFLINE_UPSTREAM_TCP);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_SERVFAIL);
    ldns_pkt_free(p);
    n = up_wire(0x4242, "d.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_NOERROR, false,
                "d.allowed.test. 60 IN A 192.0.2.7", NULL, w);
    p = offline_ask(d, "127.0.0.4", "d.allowed.test", w, n, DSEC__DNS_OFFLINE_UPSTREAM_TCP);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_NOERROR);
    ldns_pkt_free(p);
    assert_non_null(pinned(4, "192.0.2.7"));

    /* NXDOMAIN with a SOA: passed on and kept */
    n = up_wire(0x4242, "e.allowed.test", LDNS_RR_TYPE_A, LDNS_RCODE_NXDOMAIN, false, NULL, NULL,
                w);
    p = offline_ask(d, "127.0.0.4", "e.allowed.test", w, n, 0);
    assert_int_equal(ldns_pkt_get_rcode(p), LDNS_RCODE_NXDOMAIN);
    ldns_pkt_free(p);
    dsec__dns_stats_get(d, &st);
    assert_int_equal(st.cache_entries, 4); /* a, c (kept before any filter), d over TCP, e */
    assert_int_equal(st.upstream_timeouts, 1);
    dsec__dns_free(d);

    /* not on a resolver whose thread runs */
    uint8_t out[512];
    struct sockaddr_storage cl;
    set_in(&cl, "127.0.0.4", 5353);
    assert_int_equal(
        dsec__dns_upstream_offline(dns, (struct sockaddr *)&cl, w, n, w, n, 0, out, sizeof out, &n),
        -1);
}

static void throughput_is_measured(void **state)
{
    (void)state;
    uint16_t port = free_port();
    dsec__dns *d = mk_resolver(port, 1000000, 1000000, 256, 0);
    assert_non_null(d);
    int lost;
    double fwd = run_window(port, "127.0.0.6", "p", "allowed.test", 20000, 64, &lost);
    printf("throughput: allowed A queries through the fake upstream, 64 in flight: %.0f/s "
           "(%d lost)\n",
           fwd, lost);
    assert_true(fwd > 0);
    double ref = run_window(port, "127.0.0.6", "q", "exfil.example", 50000, 64, &lost);
    printf("throughput: denied queries, 64 in flight: %.0f/s (%d lost)\n", ref, lost);
    assert_true(ref > 0);
    assert_false(upstream_saw("exfil.example"));
    dsec__dns_free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_configs_are_refused_with_a_reason),
        cmocka_unit_test(allowed_names_resolve_and_are_pinned_first),
        cmocka_unit_test(denied_names_are_refused_and_never_forwarded),
        cmocka_unit_test(other_types_are_refused_and_never_forwarded),
        cmocka_unit_test(cname_chains_stay_inside_allowed_names),
        cmocka_unit_test(nxdomain_passes_and_silence_is_servfail),
        cmocka_unit_test(spoofed_upstream_replies_are_ignored),
        cmocka_unit_test(malformed_packets_get_formerr_or_nothing),
        cmocka_unit_test(tcp_works_and_big_answers_truncate_over_udp),
        cmocka_unit_test(truncated_upstream_answers_are_asked_again_over_tcp),
        cmocka_unit_test(broken_or_silent_tcp_upstreams_give_servfail),
        cmocka_unit_test(answers_are_cached_with_their_ttl_counting_down),
        cmocka_unit_test(cached_answers_still_meet_each_sandbox_policy),
        cmocka_unit_test(cache_entries_expire_and_failures_are_not_kept),
        cmocka_unit_test(the_cache_is_bounded),
        cmocka_unit_test(identical_queries_in_flight_share_one_upstream_query),
        cmocka_unit_test(stats_count_what_happened),
        cmocka_unit_test(inflight_cap_answers_servfail_at_once),
        cmocka_unit_test(listens_before_the_gateway_exists_and_on_ipv6),
        cmocka_unit_test(a_flood_does_not_starve_other_clients),
        cmocka_unit_test(the_offline_upstream_path_filters_pins_and_caches),
        cmocka_unit_test(throughput_is_measured),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
