/* metrics.c - Prometheus text exposition, served over HTTP by libmicrohttpd. */
#include "runtime/metrics.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

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

/* ---- the server --------------------------------------------------------------------------
 * libmicrohttpd with its own polling thread (epoll where there is one). It reads and parses
 * requests, bounds them (REQ_MAX of memory per connection: longer headers get its 431),
 * closes connections idle past the timeout and answers malformed requests itself;
 * on_request only routes. */

#define MAX_CLIENTS 64
#define REQ_MAX 8192
#define BODY_MAX 65536 /* request body a 404 or 405 reads and ignores before answering */

static const char ctype_text[] = "text/plain; charset=utf-8";
static const char ctype_metrics[] = "text/plain; version=0.0.4; charset=utf-8";

struct dsec_metrics {
    struct MHD_Daemon *d;
    int lfd; /* until MHD_start_daemon takes it */
    uint16_t port;
    dsec_metrics_render_fn render;
    void *ud;
};

/* Queue an answer that closes its connection; body is taken (freed with dsec_free) when
 * owned, else static. HEAD gets the headers only (MHD leaves the body out). */
static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status, const char *ctype,
                               const char *allow, char *body, size_t blen, bool owned)
{
    struct MHD_Response *r =
        owned ? MHD_create_response_from_buffer_with_free_callback(blen, body, dsec_free)
              : MHD_create_response_from_buffer(blen, body, MHD_RESPMEM_PERSISTENT);
    if (r == NULL) {
        if (owned)
            dsec_free(body);
        return MHD_NO; /* nothing to say it with: MHD drops the connection */
    }
    MHD_set_response_options(r, MHD_RF_HTTP_1_0_COMPATIBLE_STRICT, MHD_RO_END);
    enum MHD_Result ok = MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (ok == MHD_YES && allow != NULL)
        ok = MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (ok == MHD_YES)
        ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned status, const char *allow,
                                    const char *body)
{
    return respond(conn, status, ctype_text, allow, (char *)body, strlen(body), false);
}

static enum MHD_Result respond_metrics(struct dsec_metrics *s, struct MHD_Connection *conn)
{
    dsec_metrics_text t = {0};
    if (s->render(&t, s->ud) < 0 || t.failed) {
        dsec_metrics_text_release(&t);
        return respond_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, NULL,
                            "rendering the metrics failed\n");
    }
    if (t.data == NULL)
        return respond(conn, MHD_HTTP_OK, ctype_metrics, NULL, (char *)"", 0, false);
    return respond(conn, MHD_HTTP_OK, ctype_metrics, NULL, t.data, t.len, true);
}

/* MHD calls this once the headers are in (*req_cls NULL), then once per piece of body and
 * once more at its end: *req_cls counts the body read so far, plus one. The query string is
 * not in url. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
    struct dsec_metrics *s = cls;
    (void)version;
    (void)upload_data;
    uintptr_t seen = (uintptr_t)*req_cls;
    if (seen == 0) { /* the headers: wait for the body, if any */
        *req_cls = (void *)(uintptr_t)1;
        return MHD_YES;
    }
    if (*upload_data_size > 0) { /* read and ignore it, up to BODY_MAX */
        seen += *upload_data_size;
        *upload_data_size = 0;
        *req_cls = (void *)seen;
        if (seen <= BODY_MAX)
            return MHD_YES;
    }
    if (url[0] != '/')
        return respond_text(conn, MHD_HTTP_BAD_REQUEST, NULL,
                            "bad request: expected \"GET /metrics HTTP/1.1\"\n");
    if (strcmp(url, "/metrics") != 0)
        return respond_text(conn, MHD_HTTP_NOT_FOUND, NULL,
                            "not found: only /metrics is served here\n");
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return respond_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "GET, HEAD",
                            "method not allowed: /metrics takes GET or HEAD\n");
    return respond_metrics(s, conn);
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
    if (s == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    s->lfd = -1;
    s->render = opts->render;
    s->ud = opts->ud;
    if (open_listener(opts->listen, &s->lfd, &s->port, err) < 0)
        goto out_fail;
    /* MHD closes a connection after whole seconds without traffic, not at a deadline from
     * accept: half of timeout_ms (rounded up) closes a silent or half-open client well
     * within it, as the deadline did */
    uint32_t ms = opts->timeout_ms ? opts->timeout_ms : 5000;
    unsigned timeout_s = (unsigned)((ms / 2 + 999) / 1000);
    s->d =
        MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD, 0, NULL, NULL, on_request, s,
                         MHD_OPTION_LISTEN_SOCKET, (MHD_socket)s->lfd, MHD_OPTION_CONNECTION_LIMIT,
                         (unsigned)MAX_CLIENTS, MHD_OPTION_CONNECTION_TIMEOUT, timeout_s,
                         MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)REQ_MAX, MHD_OPTION_END);
    if (s->d == NULL) {
        dsec_err_set(err, DSEC_E_IO, errno, "metrics: starting the HTTP server on %s",
                     opts->listen);
        goto out_fail;
    }
    s->lfd = -1; /* the daemon's now: MHD_stop_daemon closes it */
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
    if (m->d != NULL)
        MHD_stop_daemon(m->d); /* joins its thread, closes every connection and the listener */
    if (m->lfd >= 0)
        close(m->lfd);
    dsec_free(m);
}
