/* test_metrics.c - a sim cell's Prometheus endpoint scraped over TCP and checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "actors/cell.h"
#include "runtime/metrics.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tests/fixture.h"
#include "tests/test_util.h"

static dsec_natsd *natsd;
static char root[64];
static int serial;

/* What a test started; the teardown stops it even after a failed assertion. */
static struct {
    dsec_cell *cell;
    dsec_cell_conf conf;
    dsec_client *client;
    dsec_metrics *server; /* a bare server (no cell) */
    int fds[4];
} live;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int test_setup(void **state)
{
    (void)state;
    for (int i = 0; i < 4; i++)
        live.fds[i] = -1;
    return 0;
}

static int test_teardown(void **state)
{
    (void)state;
    for (int i = 0; i < 4; i++)
        if (live.fds[i] >= 0)
            close(live.fds[i]);
    dsec_client_free(live.client);
    dsec_metrics_stop(live.server);
    dsec_cell_stop(live.cell, true);
    dsec_cell_conf_release(&live.conf);
    memset(&live, 0, sizeof live);
    return 0;
}

static int group_setup(void **state)
{
    (void)state;
    return dsec_test_server_start("dsec-metrics", true, &natsd, root, sizeof root);
}

static int group_teardown(void **state)
{
    (void)state;
    return dsec_test_server_stop(natsd, root);
}

/* ---- HTTP over a real socket ------------------------------------------------------------ */

static int connect_to(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0)
        fail_msg("connect to 127.0.0.1:%u: %s", port, strerror(errno));
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static void send_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t w = send(fd, data, len, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            fail_msg("send: %s", strerror(errno));
        data += w;
        len -= (size_t)w;
    }
}

/* Everything the server sends until it closes; NUL-terminated, caller frees. */
static char *read_all(int fd, size_t *len)
{
    size_t cap = 65536, n = 0;
    char *buf = dsec_malloc(cap);
    assert_non_null(buf);
    for (;;) {
        if (n + 1 >= cap) {
            cap *= 2;
            buf = dsec_realloc(buf, cap);
            assert_non_null(buf);
        }
        ssize_t r = recv(fd, buf + n, cap - n - 1, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            fail_msg("recv: %s (the server neither answered nor closed)", strerror(errno));
        if (r == 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

/* One request, raw; the whole answer (status line, headers, body). */
static char *http_raw(uint16_t port, const char *req, size_t len)
{
    int fd = connect_to(port);
    send_all(fd, req, len);
    char *out = read_all(fd, NULL);
    close(fd);
    return out;
}

static int status_of(const char *resp)
{
    int code = 0;
    if (sscanf(resp, "HTTP/1.1 %d", &code) != 1)
        fail_msg("not an HTTP answer: %.80s", resp);
    return code;
}

static const char *body_of(const char *resp)
{
    const char *b = strstr(resp, "\r\n\r\n");
    assert_non_null(b);
    return b + 4;
}

/* GET /metrics: the body (caller frees), asserting 200 and the exposition content type. */
static char *scrape(uint16_t port)
{
    static const char req[] = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
    char *resp = http_raw(port, req, sizeof req - 1);
    assert_int_equal(status_of(resp), 200);
    assert_non_null(strstr(resp, "Content-Type: text/plain; version=0.0.4"));
    const char *b = body_of(resp);
    long clen = -1;
    const char *cl = strstr(resp, "Content-Length: ");
    assert_non_null(cl);
    clen = strtol(cl + 16, NULL, 10);
    assert_int_equal((size_t)clen, strlen(b));
    char *body = dsec_strdup(b);
    dsec_free(resp);
    return body;
}

/* ---- the text format ---------------------------------------------------------------------- */

/* Sum of the samples of series name whose labels contain every "k=\"v\"" filter
 * (NULL-terminated); *count gets how many matched. */
static double sum_of(const char *text, const char *name, const char *const *filters, int *count)
{
    double sum = 0;
    int n = 0;
    size_t nl = strlen(name);
    for (const char *line = text; line && *line;
         line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (strncmp(line, name, nl) != 0 || (line[nl] != '{' && line[nl] != ' '))
            continue;
        const char *eol = strchr(line, '\n');
        size_t ll = eol ? (size_t)(eol - line) : strlen(line);
        char buf[1024];
        snprintf(buf, sizeof buf, "%.*s", (int)ll, line);
        bool ok = true;
        for (size_t i = 0; filters && filters[i] && ok; i++)
            ok = strstr(buf, filters[i]) != NULL;
        if (!ok)
            continue;
        const char *sp = strrchr(buf, ' ');
        assert_non_null(sp);
        sum += strtod(sp + 1, NULL);
        n++;
    }
    if (count)
        *count = n;
    return sum;
}

static double total(const char *text, const char *name)
{
    return sum_of(text, name, NULL, NULL);
}

/* Every sample line belongs to a family announced by # HELP and # TYPE just
 * before its group; families appear once; counters end in _total; label
 * values are quoted and values parse. */
static void check_format(const char *text)
{
    char family[128] = "", type[16] = "";
    char seen[256][128];
    size_t nseen = 0;
    size_t lines = 0;
    for (const char *line = text; *line;) {
        const char *eol = strchr(line, '\n');
        assert_non_null(eol); /* every line ends in \n, the last too */
        char buf[2048];
        snprintf(buf, sizeof buf, "%.*s", (int)(eol - line), line);
        line = eol + 1;
        lines++;
        if (strncmp(buf, "# HELP ", 7) == 0) {
            char name[128];
            assert_int_equal(sscanf(buf + 7, "%127s", name), 1);
            for (size_t i = 0; i < nseen; i++)
                if (strcmp(seen[i], name) == 0)
                    fail_msg("family %s announced twice", name);
            assert_true(nseen < 256);
            snprintf(seen[nseen++], sizeof seen[0], "%s", name);
            snprintf(family, sizeof family, "%s", name);
            type[0] = '\0';
            continue;
        }
        if (strncmp(buf, "# TYPE ", 7) == 0) {
            char name[128];
            assert_int_equal(sscanf(buf + 7, "%127s %15s", name, type), 2);
            assert_string_equal(name, family);
            assert_true(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 ||
                        strcmp(type, "histogram") == 0);
            if (strcmp(type, "counter") == 0) {
                size_t l = strlen(name);
                if (l < 6 || strcmp(name + l - 6, "_total") != 0)
                    fail_msg("counter %s does not end in _total", name);
            }
            continue;
        }
        assert_true(buf[0] != '#' && buf[0] != '\0');
        assert_true(type[0] != '\0');
        size_t fl = strlen(family);
        if (strncmp(buf, family, fl) != 0)
            fail_msg("sample \"%s\" outside its family (%s)", buf, family);
        const char *rest = buf + fl;
        if (strcmp(type, "histogram") == 0) {
            if (strncmp(rest, "_bucket{", 8) == 0)
                rest += 7;
            else if (strncmp(rest, "_sum", 4) == 0 || strncmp(rest, "_count", 6) == 0)
                rest += rest[1] == 's' ? 4 : 6;
            else
                fail_msg("histogram sample \"%s\" is no _bucket, _sum or _count", buf);
        }
        if (*rest == '{') {
            const char *p = rest + 1;
            while (*p != '}') {
                while ((*p >= 'a' && *p <= 'z') || *p == '_')
                    p++;
                if (p[0] != '=' || p[1] != '"')
                    fail_msg("bad label in \"%s\"", buf);
                p += 2;
                while (*p && *p != '"')
                    p += *p == '\\' ? 2 : 1;
                assert_int_equal(*p, '"');
                p++;
                if (*p == ',')
                    p++;
                else if (*p != '}')
                    fail_msg("bad label list in \"%s\"", buf);
            }
            rest = p + 1;
        }
        assert_int_equal(*rest, ' ');
        char *end;
        double v = strtod(rest + 1, &end);
        assert_true(*end == '\0' && end != rest + 1);
        assert_false(isnan(v));
    }
    assert_true(lines > 0);
}

/* A histogram of one label set: buckets ascending in le and cumulative,
 * +Inf equal to _count. Returns _count. */
static double check_histogram(const char *text, const char *name, const char *label)
{
    char bucket[160], cnt[160], sum[160];
    snprintf(bucket, sizeof bucket, "%s_bucket{", name);
    snprintf(cnt, sizeof cnt, "%s_count", name);
    snprintf(sum, sizeof sum, "%s_sum", name);
    const char *f[] = {label, NULL};
    double prev_le = -1, prev = 0, inf = -1;
    int nb = 0;
    for (const char *line = strstr(text, bucket); line; line = strstr(line + 1, bucket)) {
        if (line != text && line[-1] != '\n')
            continue;
        const char *eol = strchr(line, '\n');
        char buf[512];
        snprintf(buf, sizeof buf, "%.*s", (int)(eol - line), line);
        if (strstr(buf, label) == NULL)
            continue;
        const char *le = strstr(buf, "le=\"");
        assert_non_null(le);
        double v = strtod(strrchr(buf, ' ') + 1, NULL);
        assert_true(v >= prev); /* cumulative */
        prev = v;
        nb++;
        if (strncmp(le + 4, "+Inf\"", 5) == 0) {
            inf = v;
            continue;
        }
        double bound = strtod(le + 4, NULL);
        assert_true(bound > prev_le); /* ascending */
        prev_le = bound;
    }
    assert_int_equal(nb, DSEC_METRICS_HIST_BOUNDS + 1);
    int n;
    double count = sum_of(text, cnt, f, &n);
    assert_int_equal(n, 1);
    assert_true(inf == count);
    double s = sum_of(text, sum, f, &n);
    assert_int_equal(n, 1);
    assert_true(s >= 0 && (count == 0 || s > 0));
    return count;
}

/* ---- a cell ------------------------------------------------------------------------------- */

static uint16_t start_cell(void)
{
    dsec_cell_conf *c = &live.conf;
    dsec_cell_conf_defaults(c);
    snprintf(c->cell, sizeof c->cell, "m%d-%ld", ++serial, (long)getpid());
    snprintf(c->url, sizeof c->url, "%s", dsec_natsd_url(natsd));
    snprintf(c->state_dir, sizeof c->state_dir, "%s/%s", root, c->cell);
    snprintf(c->metrics_listen, sizeof c->metrics_listen, "127.0.0.1:0");
    c->capacity_ms = 20;
    c->full_ms = 300;
    c->heartbeat_ms = 100;
    c->summary_ms = 100;
    c->arbiter_lease_ms = 500;
    c->quota = true;
    static const char *const types[] = {"sim", NULL};
    char prefix[80];
    snprintf(prefix, sizeof prefix, "%s-n", c->cell);
    dsec_err err;
    assert_int_equal(
        dsec_cell_conf_add_sim_nodes(c, prefix, 2, 400000, 400000, 100, types, "0", &err), 0);
    int roles = DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE | DSEC_ROLE_ARBITER | DSEC_ROLE_QUOTA;
    if (dsec_cell_start(&live.cell, c, roles, &err) < 0)
        fail_msg("cell %s: %s", c->cell, err.msg);
    uint16_t port = dsec_cell_metrics_port(live.cell);
    assert_true(port > 0);
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = "acme", .timeout_ms = 10000};
    if (dsec_client_connect(&live.client, &o, &err) < 0)
        fail_msg("client: %s", err.msg);
    return port;
}

/* Scrape until the sum of name reaches want (counters other threads bump
 * just after answering the client), at most 5 s. The last body (caller frees). */
static char *scrape_until(uint16_t port, const char *name, double want)
{
    uint64_t until = now_ms() + 5000;
    for (;;) {
        char *body = scrape(port);
        if (total(body, name) == want || now_ms() > until)
            return body;
        dsec_free(body);
        msleep(20);
    }
}

/* Creates, execs, destroys and a refused create; every figure the scrape
 * shows is the one that happened. */
static void test_counters_match(void **state)
{
    (void)state;
    uint16_t port = start_cell();
    dsec_err err;
    enum { N = 6, DESTROYED = 2 };
    char ids[N][DSEC_ID_MAX];
    for (int i = 0; i < N; i++) {
        dsec_create_spec spec = {.type = "sim"};
        dsec_sandbox_info info;
        if (dsec_create(live.client, &spec, &info, &err) < 0)
            fail_msg("create %d: %s", i, err.msg);
        snprintf(ids[i], sizeof ids[i], "%s", info.id);
    }
    static const char *const argv[] = {"echo", "hi", NULL};
    for (int i = 0; i < 3; i++) {
        dsec_exec_opts eo = {.argv = argv};
        dsec_exec_reply r;
        if (dsec_exec(live.client, ids[i], &eo, &r, &err) < 0)
            fail_msg("exec: %s", err.msg);
        dsec_exec_reply_release(&r);
    }
    for (int i = 0; i < DESTROYED; i++)
        if (dsec_destroy(live.client, ids[i], &err) < 0)
            fail_msg("destroy: %s", err.msg);
    dsec_create_spec bad = {.type = "no-such-type"};
    dsec_sandbox_info info;
    assert_int_equal(dsec_create(live.client, &bad, &info, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);

    char *body = scrape_until(port, "dsec_scheduler_placement_seconds_count", N);
    dsec_free(body);
    body = scrape_until(port, "dsec_node_sandboxes_destroyed_total", DESTROYED);
    check_format(body);
    char cell_label[128];
    snprintf(cell_label, sizeof cell_label, "cell=\"%s\"", live.conf.cell);
    const char *in_cell[] = {cell_label, NULL};
    int n;
    /* the scheduler */
    assert_true(sum_of(body, "dsec_scheduler_creates_total", in_cell, &n) == N + 1);
    assert_int_equal(n, 1); /* one replica */
    assert_true(total(body, "dsec_scheduler_placed_total") == N);
    assert_true(total(body, "dsec_scheduler_failed_total") == 1);
    assert_true(total(body, "dsec_scheduler_retried_total") == 0);
    assert_true(total(body, "dsec_scheduler_over_quota_total") == 0);
    assert_true(total(body, "dsec_scheduler_waiting") == 0);
    assert_true(total(body, "dsec_scheduler_nodes") == 2);
    /* the silence counters are exported, one sample per replica; nobody was drained */
    const char *silence[] = {"dsec_scheduler_nodes_suspect", "dsec_scheduler_drains_deferred_total",
                             "dsec_scheduler_nodes_readmitted_total",
                             "dsec_scheduler_nodes_expired_total"};
    for (size_t i = 0; i < sizeof silence / sizeof *silence; i++) {
        double v = sum_of(body, silence[i], in_cell, &n);
        assert_int_equal(n, 1);
        assert_true(v >= 0);
    }
    assert_true(total(body, "dsec_scheduler_nodes_expired_total") == 0);
    /* the nodes */
    assert_true(sum_of(body, "dsec_node_sandboxes_created_total", in_cell, &n) == N);
    assert_int_equal(n, 2);
    assert_true(total(body, "dsec_node_sandboxes_destroyed_total") == DESTROYED);
    const char *running[] = {"state=\"running\"", NULL}, *starting[] = {"state=\"starting\"", NULL};
    assert_true(sum_of(body, "dsec_node_sandboxes", running, &n) == N - DESTROYED);
    assert_int_equal(n, 2);
    assert_true(sum_of(body, "dsec_node_sandboxes", starting, NULL) == 0);
    assert_true(total(body, "dsec_node_sandboxes") == N - DESTROYED);
    const char *sim[] = {"type=\"sim\"", NULL};
    assert_true(sum_of(body, "dsec_node_sandboxes_by_type", sim, &n) == N - DESTROYED);
    assert_int_equal(n, 2);
    /* 1000 milli-CPU and 512 MB each by default, out of 400 cores and 400000 MB per node */
    assert_true(total(body, "dsec_node_cpu_free_cores") == 800 - (N - DESTROYED));
    assert_true(total(body, "dsec_node_memory_free_bytes") ==
                (800000.0 - 512.0 * (N - DESTROYED)) * 1048576.0);
    assert_true(total(body, "dsec_node_slots_free") == 200 - (N - DESTROYED));
    /* at rest: no command in flight, nothing waiting for a work thread (one sample a node) */
    static const char *const idle[] = {"dsec_node_execs_in_flight", "dsec_node_work_queued"};
    for (size_t i = 0; i < 2; i++) {
        int samples = 0;
        assert_true(sum_of(body, idle[i], NULL, &samples) == 0);
        assert_int_equal(samples, 2);
    }
    /* sim nodes offer 1 PiB of disk less the 2048 MB reserve; 1024 MB each by default
     * (printed with 15 significant digits: compare to the MB) */
    double disk_free = total(body, "dsec_node_disk_free_bytes") / 1048576.0;
    double disk_want = 2.0 * ((1u << 30) - 2048.0) - 1024.0 * (N - DESTROYED);
    assert_true(disk_free > disk_want - 1.0 && disk_free < disk_want + 1.0);
    assert_true(total(body, "dsec_node_network_alerts_total") == 0);
    /* sim nodes have no network containment: its families are there, at 0 */
    static const char *const netfam[] = {
        "dsec_node_network_blocked_total",  "dsec_node_dns_queries_total",
        "dsec_node_dns_refused_total",      "dsec_node_dns_cache_hits_total",
        "dsec_node_dns_cache_misses_total", "dsec_node_dns_cache_evictions_total",
        "dsec_node_dns_upstream_tcp_total"};
    for (size_t i = 0; i < sizeof netfam / sizeof *netfam; i++) {
        char type[128];
        snprintf(type, sizeof type, "# TYPE %s counter", netfam[i]);
        if (strstr(body, type) == NULL)
            fail_msg("no %s", type);
        assert_true(total(body, netfam[i]) == 0);
    }
    assert_true(total(body, "dsec_node_adopt_failed_total") == 0);
    /* latency histograms: one per node and per replica; their counts are the creates */
    double hn = 0;
    for (size_t i = 0; i < 2; i++) {
        char node[128];
        snprintf(node, sizeof node, "node=\"%s\"", live.conf.nodes[i].name);
        hn += check_histogram(body, "dsec_node_create_seconds", node);
    }
    assert_true(hn == N);
    assert_true(check_histogram(body, "dsec_scheduler_placement_seconds", "replica=\"") == N);
    /* the quota actor admitted every create it was asked about (the bad type never got there) */
    assert_true(total(body, "dsec_quota_admitted_total") == N);
    assert_true(total(body, "dsec_quota_refused_total") == 0);
    /* the arbiter reports, and no reclaims happened */
    assert_true(sum_of(body, "dsec_arbiter_active", in_cell, &n) <= 1);
    assert_int_equal(n, 1);
    assert_true(total(body, "dsec_arbiter_reclaims_requested_total") == 0);
    /* actors: the nodes handled at least every place, exec and destroy */
    const char *node_actor[] = {"actor=\"", NULL};
    assert_true(sum_of(body, "dsec_actor_messages_in_total", node_actor, &n) >= N + 3 + DESTROYED);
    assert_true(n >= 2 + 2 + 2); /* 2 nodes, 2 scheduler actors, arbiter, quota */
    assert_true(total(body, "dsec_bus_slow_consumers_total") == 0);
    dsec_free(body);
}

/* 404, 405, 400, 431, HEAD and a query string. */
static void test_http_errors(void **state)
{
    (void)state;
    uint16_t port = start_cell();
    /* or_close: libmicrohttpd (the server) closes the connection without an answer on a
     * request line with no spaces, answers 505 to HTTP/2.0, and closes a client that sends no
     * line end at its idle timeout; no option of it makes these 400. Such a case passes on any
     * 4xx/5xx or a close without an answer within the read timeout. */
    struct {
        const char *req;
        int status;
        const char *must;
        bool or_close;
    } cases[] = {
        {"GET /nope HTTP/1.1\r\n\r\n", 404, "only /metrics"},
        {"GET / HTTP/1.1\r\n\r\n", 404, NULL},
        {"POST /metrics HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd", 405, "Allow: GET, HEAD"},
        {"DELETE /metrics HTTP/1.1\r\n\r\n", 405, NULL},
        {"garbage\r\n\r\n", 400, NULL, true},
        {"GET /metrics\r\n\r\n", 400, NULL},
        {"GET /metrics HTTP/2.0\r\n\r\n", 400, NULL, true},
        {"GET metrics HTTP/1.1\r\n\r\n", 400, NULL},
        {"\x16\x03\x01\x02\x00\x01\x00", 400, NULL, true}, /* a TLS hello, no newline ever */
        {"GET /metrics?x=1 HTTP/1.0\n\n", 200, "dsec_scheduler_creates_total"},
        {"HEAD /metrics HTTP/1.1\r\n\r\n", 200, "Content-Length: "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *resp = http_raw(port, cases[i].req, strlen(cases[i].req));
        if (cases[i].or_close) {
            int st = resp[0] ? status_of(resp) : 0;
            if (resp[0] && (st < 400 || st > 599))
                fail_msg("case %zu (%.20s): status %d, want 4xx, 5xx or a close", i, cases[i].req,
                         st);
            dsec_free(resp);
            continue;
        }
        if (status_of(resp) != cases[i].status)
            fail_msg("case %zu (%.20s): status %d, want %d", i, cases[i].req, status_of(resp),
                     cases[i].status);
        if (cases[i].must && strstr(resp, cases[i].must) == NULL)
            fail_msg("case %zu: \"%s\" missing from %.200s", i, cases[i].must, resp);
        if (strncmp(cases[i].req, "HEAD", 4) == 0)
            assert_string_equal(body_of(resp), ""); /* headers only */
        dsec_free(resp);
    }
    /* headers beyond 8 KiB */
    size_t big = 12000;
    char *req = dsec_malloc(big + 64);
    assert_non_null(req);
    int hl = snprintf(req, 64, "GET /metrics HTTP/1.1\r\nX-Pad: ");
    memset(req + hl, 'a', big);
    memcpy(req + hl + big, "\r\n\r\n", 5);
    int fd = connect_to(port);
    /* the server answers after 8 KiB and stops reading: send what fits, then read */
    ssize_t w = send(fd, req, (size_t)hl + big + 4, MSG_NOSIGNAL);
    assert_true(w > 8192);
    char *resp = read_all(fd, NULL);
    close(fd);
    assert_int_equal(status_of(resp), 431);
    dsec_free(resp);
    dsec_free(req);
    /* after all that, a normal scrape */
    char *body = scrape(port);
    check_format(body);
    dsec_free(body);
}

struct scraper {
    uint16_t port;
    char *body;
    uint64_t ms;
};

static void *scrape_thread(void *arg)
{
    struct scraper *s = arg;
    uint64_t t0 = now_ms();
    static const char req[] = "GET /metrics HTTP/1.1\r\n\r\n";
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(s->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        send(fd, req, sizeof req - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof req - 1)) {
        size_t cap = 1 << 20, n = 0;
        char *buf = dsec_malloc(cap);
        ssize_t r;
        while (buf && n + 1 < cap && (r = recv(fd, buf + n, cap - n - 1, 0)) > 0)
            n += (size_t)r;
        if (buf)
            buf[n] = '\0';
        s->body = buf;
    }
    if (fd >= 0)
        close(fd);
    s->ms = now_ms() - t0;
    return NULL;
}

/* A client that sends half a request, one that sends nothing, and one that
 * never reads do not hold up other scrapes; two scrapes at once both work. */
static void test_slow_clients(void **state)
{
    (void)state;
    uint16_t port = start_cell();
    live.fds[0] = connect_to(port);
    send_all(live.fds[0], "GET /metr", 9);
    live.fds[1] = connect_to(port); /* connected, silent */
    live.fds[2] = connect_to(port); /* asks, then never reads its answer */
    int rcv = 1024;
    setsockopt(live.fds[2], SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    send_all(live.fds[2], "GET /metrics HTTP/1.1\r\n\r\n", 25);
    msleep(50);
    uint64_t t0 = now_ms();
    char *body = scrape(port);
    assert_true(now_ms() - t0 < 1000);
    assert_non_null(strstr(body, "dsec_node_sandboxes{"));
    dsec_free(body);

    struct scraper s[2] = {{.port = port}, {.port = port}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, scrape_thread, &s[i]), 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        assert_non_null(s[i].body);
        assert_int_equal(status_of(s[i].body), 200);
        assert_non_null(strstr(s[i].body, "dsec_scheduler_creates_total{"));
        assert_true(s[i].ms < 2000);
        dsec_free(s[i].body);
    }
    /* the half request still gets its answer when it completes */
    send_all(live.fds[0], "ics HTTP/1.1\r\n\r\n", 17);
    char *resp = read_all(live.fds[0], NULL);
    assert_int_equal(status_of(resp), 200);
    dsec_free(resp);
}

/* ---- the server alone ------------------------------------------------------------------- */

static int render_fixed(dsec_metrics_text *t, void *ud)
{
    (void)ud;
    dsec_metrics_family(t, "x_things_total", "counter", "Things,\nwith a \\ in the help.");
    const char *l[] = {"who", "a\"b\\c\nd"};
    dsec_metrics_sample(t, "x_things_total", l, 1, 3);
    dsec_metrics_hist h;
    memset(&h, 0, sizeof h);
    dsec_metrics_hist_observe(&h, 50000);       /* 50 µs: first bucket */
    dsec_metrics_hist_observe(&h, 1000000);     /* 1 ms exactly: le="0.001" */
    dsec_metrics_hist_observe(&h, 20000000000); /* 20 s: only +Inf */
    dsec_metrics_hist_snap sn;
    dsec_metrics_hist_read(&h, &sn);
    dsec_metrics_family(t, "x_seconds", "histogram", "Latency.");
    dsec_metrics_hist_samples(t, "x_seconds", NULL, 0, &sn);
    return 0;
}

static uint16_t start_bare(uint32_t timeout_ms)
{
    dsec_metrics_opts o = {
        .listen = "127.0.0.1:0", .timeout_ms = timeout_ms, .render = render_fixed};
    dsec_err err;
    if (dsec_metrics_start(&live.server, &o, &err) < 0)
        fail_msg("metrics: %s", err.msg);
    return dsec_metrics_port(live.server);
}

/* Escaping, histogram arithmetic, and slow clients closed at their deadline. */
static void test_server_alone(void **state)
{
    (void)state;
    uint16_t port = start_bare(300);
    char *body = scrape(port);
    check_format(body);
    assert_non_null(strstr(body, "# HELP x_things_total Things,\\nwith a \\\\ in the help.\n"));
    assert_non_null(strstr(body, "x_things_total{who=\"a\\\"b\\\\c\\nd\"} 3\n"));
    assert_non_null(strstr(body, "x_seconds_bucket{le=\"0.0001\"} 1\n"));
    assert_non_null(strstr(body, "x_seconds_bucket{le=\"0.0005\"} 1\n"));
    assert_non_null(strstr(body, "x_seconds_bucket{le=\"0.001\"} 2\n"));
    assert_non_null(strstr(body, "x_seconds_bucket{le=\"10\"} 2\n"));
    assert_non_null(strstr(body, "x_seconds_bucket{le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(body, "x_seconds_count 3\n"));
    assert_non_null(strstr(body, "x_seconds_sum 20.00105\n"));
    dsec_free(body);

    /* a half-open client is closed at its deadline (300 ms here) */
    live.fds[0] = connect_to(port);
    send_all(live.fds[0], "GET /", 5);
    uint64_t t0 = now_ms();
    char buf[16];
    ssize_t r = recv(live.fds[0], buf, sizeof buf, 0);
    assert_int_equal(r, 0);
    uint64_t took = now_ms() - t0;
    assert_true(took >= 200 && took < 3000);

    /* the port is taken: a second server says which address */
    dsec_metrics *other;
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    dsec_metrics_opts o = {.listen = addr, .render = render_fixed};
    dsec_err err;
    assert_int_equal(dsec_metrics_start(&other, &o, &err), -1);
    assert_non_null(strstr(err.msg, addr));
}

/* The metrics section of the cell config, and its mistakes. */
static void test_config(void **state)
{
    (void)state;
    struct {
        const char *yaml;
        const char *want_err; /* NULL: loads */
        const char *listen;
    } cases[] = {
        {"cell: a\n", NULL, ""},
        {"metrics:\n  listen: \"127.0.0.1:9464\"\n", NULL, "127.0.0.1:9464"},
        {"metrics:\n  listen: \"[::1]:9464\"\n", NULL, "[::1]:9464"},
        {"metrics:\n  listen: \":9464\"\n", NULL, ":9464"},
        {"metrics:\n  listen: \"\"\n", NULL, ""},
        {"metrics:\n  listen: \"9464\"\n", "expected HOST:PORT", NULL},
        {"metrics:\n  listen: \"127.0.0.1:70000\"\n", "not a number 0-65535", NULL},
        {"metrics:\n  listen: \"127.0.0.1:x\"\n", "not a number", NULL},
        {"metrics:\n  port: 9464\n", "port", NULL},
        {"metrics: 9464\n", "metrics", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsec_cell_conf c;
        dsec_cell_conf_defaults(&c);
        dsec_err err;
        int rc = dsec_cell_conf_parse(&c, "t.yaml", cases[i].yaml, strlen(cases[i].yaml), &err);
        if (cases[i].want_err == NULL) {
            if (rc < 0)
                fail_msg("case %zu: %s", i, err.msg);
            assert_string_equal(c.metrics_listen, cases[i].listen);
        } else {
            assert_int_equal(rc, -1);
            if (strstr(err.msg, cases[i].want_err) == NULL || strstr(err.msg, "t.yaml") == NULL)
                fail_msg("case %zu: error \"%s\" should name t.yaml and say \"%s\"", i, err.msg,
                         cases[i].want_err);
        }
        dsec_cell_conf_release(&c);
    }
    /* a cell whose endpoint cannot bind fails to start, naming the address */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 1), 0);
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    live.fds[3] = fd;
    dsec_cell_conf *c = &live.conf;
    dsec_cell_conf_defaults(c);
    snprintf(c->cell, sizeof c->cell, "m%d-%ld", ++serial, (long)getpid());
    snprintf(c->url, sizeof c->url, "%s", dsec_natsd_url(natsd));
    snprintf(c->state_dir, sizeof c->state_dir, "%s/%s", root, c->cell);
    snprintf(c->metrics_listen, sizeof c->metrics_listen, "127.0.0.1:%u", ntohs(sa.sin_port));
    c->sched_replicas = 1;
    dsec_err err;
    assert_int_equal(dsec_cell_start(&live.cell, c, DSEC_ROLE_SCHEDULER, &err), -1);
    assert_null(live.cell);
    assert_non_null(strstr(err.msg, c->metrics_listen));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_config, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_server_alone, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_counters_match, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_http_errors, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_slow_clients, test_setup, test_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
