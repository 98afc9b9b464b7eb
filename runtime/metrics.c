/* metrics.c - Prometheus text exposition and its one-thread non-blocking HTTP server. */
#define _GNU_SOURCE /* accept4, pipe2 */
#include "runtime/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dsec/alloc.h"

/* ---- histograms ------------------------------------------------------------------------ */

/* From 100 µs (a sim create) to 10 s (a microVM boot under TCG). */
const double dsec_metrics_hist_le[DSEC_METRICS_HIST_BOUNDS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};

static const uint64_t le_ns[DSEC_METRICS_HIST_BOUNDS] = {
    100000ull,     250000ull,     500000ull,     1000000ull,    2500000ull,   5000000ull,
    10000000ull,   25000000ull,   50000000ull,   100000000ull,  250000000ull, 500000000ull,
    1000000000ull, 2500000000ull, 5000000000ull, 10000000000ull};

void dsec_metrics_hist_observe(dsec_metrics_hist *h, uint64_t ns)
{
    size_t i = 0;
    while (i < DSEC_METRICS_HIST_BOUNDS && ns > le_ns[i])
        i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

void dsec_metrics_hist_read(const dsec_metrics_hist *h, dsec_metrics_hist_snap *out)
{
    out->count = 0;
    for (size_t i = 0; i <= DSEC_METRICS_HIST_BOUNDS; i++) {
        out->bucket[i] = atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
        out->count += out->bucket[i];
    }
    out->sum_ns = atomic_load_explicit(&h->sum_ns, memory_order_relaxed);
}

/* ---- text -------------------------------------------------------------------------------- */

void dsec_metrics_text_release(dsec_metrics_text *t)
{
    dsec_free(t->data);
    memset(t, 0, sizeof *t);
}

static bool reserve(dsec_metrics_text *t, size_t more)
{
    if (t->failed)
        return false;
    if (t->len + more + 1 <= t->cap)
        return true;
    size_t cap = t->cap ? t->cap : 4096;
    while (cap < t->len + more + 1)
        cap *= 2;
    char *d = dsec_realloc(t->data, cap);
    if (d == NULL) {
        t->failed = 1;
        return false;
    }
    t->data = d;
    t->cap = cap;
    return true;
}

static void put(dsec_metrics_text *t, const char *s, size_t n)
{
    if (!reserve(t, n))
        return;
    memcpy(t->data + t->len, s, n);
    t->len += n;
    t->data[t->len] = '\0';
}

static void puts_(dsec_metrics_text *t, const char *s)
{
    put(t, s, strlen(s));
}

static void putf(dsec_metrics_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void putf(dsec_metrics_text *t, const char *fmt, ...)
{
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0)
        put(t, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

/* Label values escape \, " and newline; HELP text only \ and newline. */
static void put_escaped(dsec_metrics_text *t, const char *s, bool quotes)
{
    for (; *s; s++) {
        if (*s == '\\')
            puts_(t, "\\\\");
        else if (*s == '\n')
            puts_(t, "\\n");
        else if (*s == '"' && quotes)
            puts_(t, "\\\"");
        else
            put(t, s, 1);
    }
}

void dsec_metrics_family(dsec_metrics_text *t, const char *name, const char *type, const char *help)
{
    putf(t, "# HELP %s ", name);
    put_escaped(t, help, false);
    putf(t, "\n# TYPE %s %s\n", name, type);
}

static void put_labels(dsec_metrics_text *t, const char *const *labels, size_t nlabels,
                       const char *le)
{
    if (nlabels == 0 && le == NULL)
        return;
    puts_(t, "{");
    for (size_t i = 0; i < nlabels; i++) {
        putf(t, "%s%s=\"", i ? "," : "", labels[2 * i]);
        put_escaped(t, labels[2 * i + 1] ? labels[2 * i + 1] : "", true);
        puts_(t, "\"");
    }
    if (le != NULL)
        putf(t, "%sle=\"%s\"", nlabels ? "," : "", le);
    puts_(t, "}");
}

static void put_value(dsec_metrics_text *t, double v)
{
    putf(t, " %.15g\n", v);
}

void dsec_metrics_sample(dsec_metrics_text *t, const char *name, const char *const *labels,
                         size_t nlabels, double value)
{
    puts_(t, name);
    put_labels(t, labels, nlabels, NULL);
    put_value(t, value);
}

void dsec_metrics_hist_samples(dsec_metrics_text *t, const char *name, const char *const *labels,
                               size_t nlabels, const dsec_metrics_hist_snap *h)
{
    uint64_t cum = 0;
    char le[32];
    for (size_t i = 0; i <= DSEC_METRICS_HIST_BOUNDS; i++) {
        cum += h->bucket[i];
        if (i < DSEC_METRICS_HIST_BOUNDS)
            snprintf(le, sizeof le, "%g", dsec_metrics_hist_le[i]);
        else
            snprintf(le, sizeof le, "+Inf");
        putf(t, "%s_bucket", name);
        put_labels(t, labels, nlabels, le);
        put_value(t, (double)cum);
    }
    putf(t, "%s_sum", name);
    put_labels(t, labels, nlabels, NULL);
    put_value(t, (double)h->sum_ns / 1e9);
    putf(t, "%s_count", name);
    put_labels(t, labels, nlabels, NULL);
    put_value(t, (double)cum);
}

/* ---- the server -------------------------------------------------------------------------- */

#define MAX_CLIENTS 64
#define REQ_MAX 8192
#define LINGER_MS                                                                                  \
    1000 /* after the answer: read what the client still sends, so close sends no RST */

enum cstate { C_READ, C_WRITE, C_DRAIN };

struct client {
    int fd; /* -1: free slot */
    enum cstate st;
    uint64_t deadline_ms;
    size_t rlen;
    char req[REQ_MAX];
    char *out; /* owned */
    size_t olen, opos;
};

struct dsec_metrics {
    int lfd;
    int wake[2]; /* stop writes a byte */
    uint16_t port;
    uint32_t timeout_ms;
    dsec_metrics_render_fn render;
    void *ud;
    pthread_t th;
    bool started;
    struct client *clients; /* MAX_CLIENTS */
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void client_close(struct client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    dsec_free(c->out);
    c->out = NULL;
    c->fd = -1;
    c->rlen = c->olen = c->opos = 0;
}

/* Queue an answer; the body is copied after the headers. */
static void respond(struct client *c, int status, const char *reason, const char *ctype,
                    const char *extra, const char *body, size_t blen, bool head)
{
    char hdr[512];
    int n = snprintf(
        hdr, sizeof hdr,
        "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n",
        status, reason, ctype, blen, extra ? extra : "");
    size_t hl = n > 0 && (size_t)n < sizeof hdr ? (size_t)n : 0;
    size_t total = hl + (head ? 0 : blen);
    c->out = dsec_malloc(total ? total : 1);
    if (c->out == NULL) { /* nothing to say it with: drop the client */
        client_close(c);
        return;
    }
    memcpy(c->out, hdr, hl);
    if (!head && blen)
        memcpy(c->out + hl, body, blen);
    c->olen = total;
    c->opos = 0;
    c->st = C_WRITE;
}

static void respond_text(struct client *c, int status, const char *reason, const char *extra,
                         const char *body)
{
    respond(c, status, reason, "text/plain; charset=utf-8", extra, body, strlen(body), false);
}

static bool token_char(char ch)
{
    return ch >= 'A' && ch <= 'Z';
}

/* The request line is "METHOD SP TARGET SP HTTP/1.x": false when it is not. */
static bool parse_request_line(const char *line, size_t len, char *method, size_t mcap, char *path,
                               size_t pcap)
{
    size_t i = 0, m = 0;
    while (i < len && token_char(line[i]) && m + 1 < mcap)
        method[m++] = line[i++];
    method[m] = '\0';
    if (m == 0 || i >= len || line[i] != ' ')
        return false;
    i++;
    size_t p = 0, ts = i;
    while (i < len && line[i] != ' ') {
        unsigned char ch = (unsigned char)line[i];
        if (ch <= 0x20 || ch >= 0x7f)
            return false;
        i++;
    }
    if (i == ts || line[ts] != '/' || i >= len)
        return false;
    for (size_t k = ts; k < i && line[k] != '?' && p + 1 < pcap; k++)
        path[p++] = line[k];
    path[p] = '\0';
    i++;
    size_t vl = len - i;
    if (vl > 0 && line[len - 1] == '\r')
        vl--;
    return vl == 8 &&
           (memcmp(line + i, "HTTP/1.1", 8) == 0 || memcmp(line + i, "HTTP/1.0", 8) == 0);
}

static void handle_request(struct dsec_metrics *s, struct client *c, size_t line_len)
{
    char method[17], path[256];
    if (!parse_request_line(c->req, line_len, method, sizeof method, path, sizeof path)) {
        respond_text(c, 400, "Bad Request", NULL,
                     "bad request: expected \"GET /metrics HTTP/1.1\"\n");
        return;
    }
    if (strcmp(path, "/metrics") != 0) {
        respond_text(c, 404, "Not Found", NULL, "not found: only /metrics is served here\n");
        return;
    }
    bool head = strcmp(method, "HEAD") == 0;
    if (!head && strcmp(method, "GET") != 0) {
        respond_text(c, 405, "Method Not Allowed", "Allow: GET, HEAD\r\n",
                     "method not allowed: /metrics takes GET or HEAD\n");
        return;
    }
    dsec_metrics_text t = {0};
    if (s->render(&t, s->ud) < 0 || t.failed) {
        dsec_metrics_text_release(&t);
        respond_text(c, 500, "Internal Server Error", NULL, "rendering the metrics failed\n");
        return;
    }
    respond(c, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", NULL, t.data ? t.data : "",
            t.len, head);
    dsec_metrics_text_release(&t);
}

/* Could these bytes begin a request line? (A-Z method, then printable ASCII) */
static bool plausible_start(const char *b, size_t n)
{
    if (n > 0 && !token_char(b[0]))
        return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)b[i] < 0x20 ? b[i] != '\r' : (unsigned char)b[i] >= 0x7f)
            return false;
    return true;
}

/* Read what is there; answer once the request line is bad or the headers end. */
static void client_read(struct dsec_metrics *s, struct client *c)
{
    for (;;) {
        if (c->rlen == REQ_MAX) {
            respond_text(c, 431, "Request Header Fields Too Large", NULL,
                         "request too large: at most 8192 bytes of request line and headers\n");
            return;
        }
        ssize_t r = recv(c->fd, c->req + c->rlen, REQ_MAX - c->rlen, 0);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            client_close(c);
            return;
        }
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        size_t from = c->rlen;
        c->rlen += (size_t)r;
        char *nl = memchr(c->req, '\n', c->rlen);
        if (nl == NULL) {
            if (!plausible_start(c->req, c->rlen)) { /* garbage: say so now, not at the timeout */
                respond_text(c, 400, "Bad Request", NULL,
                             "bad request: expected \"GET /metrics HTTP/1.1\"\n");
                return;
            }
            continue;
        }
        size_t line_len = (size_t)(nl - c->req);
        /* a bad request line is answered without waiting for headers that may never come */
        char method[17], path[256];
        if (!parse_request_line(c->req, line_len, method, sizeof method, path, sizeof path)) {
            respond_text(c, 400, "Bad Request", NULL,
                         "bad request: expected \"GET /metrics HTTP/1.1\"\n");
            return;
        }
        /* the end of the headers: an empty line (CRLF or bare LF) */
        size_t scan = from > 3 ? from - 3 : 0;
        for (size_t i = scan; i < c->rlen; i++) {
            if (c->req[i] != '\n')
                continue;
            if ((i >= 1 && c->req[i - 1] == '\n') ||
                (i >= 2 && c->req[i - 1] == '\r' && c->req[i - 2] == '\n')) {
                handle_request(s, c, line_len);
                return;
            }
        }
    }
}

static void client_write(struct client *c)
{
    while (c->opos < c->olen) {
        ssize_t w = send(c->fd, c->out + c->opos, c->olen - c->opos, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (w <= 0) {
            client_close(c);
            return;
        }
        c->opos += (size_t)w;
    }
    shutdown(c->fd, SHUT_WR);
    c->st = C_DRAIN;
    uint64_t linger = mono_ms() + LINGER_MS;
    if (linger < c->deadline_ms)
        c->deadline_ms = linger;
}

static void client_drain(struct client *c)
{
    char buf[4096];
    for (;;) {
        ssize_t r = recv(c->fd, buf, sizeof buf, 0);
        if (r > 0)
            continue;
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        client_close(c);
        return;
    }
}

static void accept_all(struct dsec_metrics *s)
{
    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return; /* EAGAIN, or out of descriptors: the backlog waits for the next round */
        }
        struct client *c = NULL;
        for (size_t i = 0; i < MAX_CLIENTS && c == NULL; i++)
            if (s->clients[i].fd < 0)
                c = &s->clients[i];
        if (c == NULL) { /* full: the timeouts free slots; say nothing rather than block */
            close(fd);
            continue;
        }
        c->fd = fd;
        c->st = C_READ;
        c->rlen = 0;
        c->deadline_ms = mono_ms() + s->timeout_ms;
    }
}

static void *serve(void *arg)
{
    struct dsec_metrics *s = arg;
    struct pollfd pfd[MAX_CLIENTS + 2];
    struct client *who[MAX_CLIENTS + 2];
    for (;;) {
        size_t n = 0;
        pfd[n++] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
        uint64_t now = mono_ms(), next = now + 1000;
        for (size_t i = 0; i < MAX_CLIENTS; i++) {
            struct client *c = &s->clients[i];
            if (c->fd < 0)
                continue;
            if (c->deadline_ms <= now) { /* slow, idle or half-open: its slot goes to others */
                client_close(c);
                continue;
            }
            if (c->deadline_ms < next)
                next = c->deadline_ms;
            who[n] = c;
            pfd[n++] = (struct pollfd){.fd = c->fd, .events = c->st == C_WRITE ? POLLOUT : POLLIN};
        }
        int rc = poll(pfd, n, (int)(next - now));
        if (rc < 0 && errno != EINTR)
            break;
        if (rc <= 0)
            continue;
        if (pfd[0].revents)
            break;
        if (pfd[1].revents & POLLIN)
            accept_all(s);
        for (size_t i = 2; i < n; i++) {
            struct client *c = who[i];
            if (pfd[i].revents == 0 || c->fd != pfd[i].fd)
                continue;
            if (c->st == C_READ)
                client_read(s, c);
            if (c->fd >= 0 && c->st == C_WRITE)
                client_write(c); /* most answers fit the socket buffer: no round through poll */
            else if (c->fd >= 0 && c->st == C_DRAIN)
                client_drain(c);
        }
    }
    return NULL;
}

/* Split "HOST:PORT", "[V6]:PORT" or ":PORT" into host ("" for any) and port. */
static int split_listen(const char *addr, char *host, size_t hcap, char *port, size_t pcap,
                        dsec_err *err)
{
    const char *colon;
    if (addr == NULL || addr[0] == '\0')
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "metrics listen address is empty (expected HOST:PORT)");
    if (addr[0] == '[') {
        const char *rb = strchr(addr, ']');
        if (rb == NULL || rb[1] != ':')
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "metrics listen address \"%s\": expected [IPV6]:PORT", addr);
        if ((size_t)(rb - addr - 1) >= hcap)
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "metrics listen address \"%s\": host too long", addr);
        snprintf(host, hcap, "%.*s", (int)(rb - addr - 1), addr + 1);
        colon = rb + 1;
    } else {
        colon = strrchr(addr, ':');
        if (colon == NULL)
            return dsec_err_set(
                err, DSEC_E_CONFIG, 0,
                "metrics listen address \"%s\": expected HOST:PORT (e.g. 127.0.0.1:9464)", addr);
        if ((size_t)(colon - addr) >= hcap || memchr(addr, ':', (size_t)(colon - addr)))
            return dsec_err_set(
                err, DSEC_E_CONFIG, 0,
                "metrics listen address \"%s\": write IPv6 addresses as [ADDR]:PORT", addr);
        snprintf(host, hcap, "%.*s", (int)(colon - addr), addr);
    }
    const char *p = colon + 1;
    char *end;
    errno = 0;
    unsigned long v = strtoul(p, &end, 10);
    if (*p < '0' || *p > '9' || *end != '\0' || errno != 0 || v > 65535)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "metrics listen address \"%s\": port \"%s\" is not a number 0-65535",
                            addr, p);
    snprintf(port, pcap, "%lu", v);
    return 0;
}

int dsec_metrics_listen_check(const char *addr, dsec_err *err)
{
    char host[256], port[8];
    return split_listen(addr, host, sizeof host, port, sizeof port, err);
}

static int open_listener(const char *addr, int *out_fd, uint16_t *out_port, dsec_err *err)
{
    char host[256], port[8];
    if (split_listen(addr, host, sizeof host, port, sizeof port, err) < 0)
        return -1;
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *res = NULL;
    int gai = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
    if (gai != 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "metrics listen address \"%s\": %s", addr,
                            gai_strerror(gai));
    int fd = -1, saved = 0;
    for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 64) < 0) {
            saved = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, saved, "metrics: cannot listen on %s", addr);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        saved = errno;
        close(fd);
        return dsec_err_set(err, DSEC_E_IO, saved, "metrics: getsockname on %s", addr);
    }
    *out_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *out_fd = fd;
    return 0;
}

int dsec_metrics_start(dsec_metrics **out, const dsec_metrics_opts *opts, dsec_err *err)
{
    *out = NULL;
    if (opts == NULL || opts->render == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "metrics: no render function");
    dsec_metrics *s = dsec_calloc(1, sizeof *s);
    struct client *cl = dsec_calloc(MAX_CLIENTS, sizeof *cl);
    if (s == NULL || cl == NULL) {
        dsec_free(s);
        dsec_free(cl);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    s->clients = cl;
    for (size_t i = 0; i < MAX_CLIENTS; i++)
        cl[i].fd = -1;
    s->lfd = s->wake[0] = s->wake[1] = -1;
    s->timeout_ms = opts->timeout_ms ? opts->timeout_ms : 5000;
    s->render = opts->render;
    s->ud = opts->ud;
    if (open_listener(opts->listen, &s->lfd, &s->port, err) < 0)
        goto out_fail;
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "metrics: pipe");
        goto out_fail;
    }
    int rc = pthread_create(&s->th, NULL, serve, s);
    if (rc != 0) {
        dsec_err_set(err, DSEC_E_IO, rc, "metrics: starting the server thread");
        goto out_fail;
    }
    s->started = true;
    *out = s;
    return 0;
out_fail:
    dsec_metrics_stop(s);
    return -1;
}

uint16_t dsec_metrics_port(const dsec_metrics *m)
{
    return m ? m->port : 0;
}

void dsec_metrics_stop(dsec_metrics *m)
{
    if (m == NULL)
        return;
    if (m->started) {
        ssize_t w;
        do
            w = write(m->wake[1], "x", 1);
        while (w < 0 && errno == EINTR);
        pthread_join(m->th, NULL);
    }
    for (size_t i = 0; i < MAX_CLIENTS; i++)
        client_close(&m->clients[i]);
    if (m->lfd >= 0)
        close(m->lfd);
    if (m->wake[0] >= 0)
        close(m->wake[0]);
    if (m->wake[1] >= 0)
        close(m->wake[1]);
    dsec_free(m->clients);
    dsec_free(m);
}
