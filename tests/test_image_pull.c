/* test_image_pull.c - image pull against a real registry (plain, TLS + htpasswd) and a hostile
 * in-test HTTP server. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/layers/image-pull-int.h"
#include "dsec/alloc.h"
#include "dsec/image.h"
#include "dsec/layers.h"
#include "dsec/sha256.h"
#include "tools/image-pull.h"

static char root[64]; /* this run's temp dir */

static char *pathf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *pathf(const char *fmt, ...)
{
    static char bufs[16][1024];
    static int next;
    char *b = bufs[next++ % 16];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof bufs[0], fmt, ap);
    va_end(ap);
    return b;
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The first line a shell command prints (static buffer). */
static const char *sh_out(const char *cmd)
{
    static char line[512];
    line[0] = '\0';
    FILE *f = popen(cmd, "r");
    if (f == NULL)
        return line;
    if (fgets(line, sizeof line, f) != NULL)
        line[strcspn(line, "\n")] = '\0';
    pclose(f);
    return line;
}

static bool dir_empty(const char *d)
{
    DIR *dp = opendir(d);
    if (dp == NULL)
        return errno == ENOENT;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(dp)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(dp);
    return n == 0;
}

static int listen_loopback(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 16) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &n) < 0)
        return -1;
    *port = ntohs(a.sin_port);
    return fd;
}

static int free_port(void)
{
    int port = 0, fd = listen_loopback(&port);
    if (fd >= 0)
        close(fd);
    return port;
}

static void sha_hex(const void *data, size_t n, char out[DSEC_DIGEST_STRLEN + 1])
{
    dsec_sha256 c;
    uint8_t raw[DSEC_SHA256_LEN];
    dsec_sha256_init(&c);
    dsec_sha256_update(&c, data, n);
    dsec_sha256_final(&c, raw);
    dsec_digest_from_raw(raw, out);
}

/* ---- the reference parser ---------------------------------------------------------- */

static void test_bad_references(void **state)
{
    (void)state;
    const char *bad[] = {"127.0.0.1:1/Swe/task:1", "127.0.0.1:1/swe/task@sha256:zz",
                         "127.0.0.1:1/swe//task",  "127.0.0.1:1/swe/task:-x",
                         "127.0.0.1:1/",           ""};
    dsec_image_pull_opts o = {.plain_http = true};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dsec_err err = {0};
        assert_int_equal(dsec__image_fetch_layout(bad[i], &o, pathf("%s/ref", root), NULL, &err),
                         -1);
        assert_int_equal(err.code, DSEC_E_INVALID);
        assert_non_null(strstr(err.msg, "image reference"));
    }
}

/* ---- the hostile registry: a thread answering crafted responses -------------------- */

typedef enum scenario {
    S_OK,
    S_INDEX,
    S_BEARER,
    S_BASIC_BAD,
    S_404,
    S_BLOB404,
    S_500,
    S_LOOP,
    S_REDIRECT,
    S_STALL,
    S_MISMATCH,
    S_NOAMD64,
    S_UNKNOWN_MT,
    S_TOKEN,
} scenario;

typedef struct fake {
    int lfd, port, stop[2];
    pthread_t th;
    scenario s;
    char config[512], layer[4096], manifest[1024], index[1024];
    size_t layer_len;
    dsec_digest cfg_d, layer_d, man_d, idx_d;
    int token_gets, cdn_gets, auth_on_cdn;
    char jwt[4096]; /* S_TOKEN: the token /token hands out (a real registry checks it) */
} fake;

/* A ustar archive of one file, etc/hello ("hello\n"): the fake's only layer. */
static size_t tiny_tar(char *out, size_t cap)
{
    assert_true(cap >= 2048);
    memset(out, 0, 2048);
    char *h = out;
    strcpy(h, "etc/hello");
    strcpy(h + 100, "0000644");
    strcpy(h + 108, "0000000");
    strcpy(h + 116, "0000000");
    strcpy(h + 124, "00000000006");
    strcpy(h + 136, "00000000000");
    h[156] = '0';
    memcpy(h + 257,
           "ustar\0"
           "00",
           8);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += (unsigned char)h[i];
    snprintf(h + 148, 8, "%06o", sum);
    memcpy(out + 512, "hello\n", 6);
    return 2048; /* header, one data block, two zero blocks */
}

static void fake_image(fake *f)
{
    f->layer_len = tiny_tar(f->layer, sizeof f->layer);
    sha_hex(f->layer, f->layer_len, f->layer_d);
    snprintf(f->config, sizeof f->config,
             "{\"architecture\":\"amd64\",\"os\":\"linux\",\"rootfs\":{\"type\":\"layers\","
             "\"diff_ids\":[\"%s\"]}}",
             f->layer_d);
    sha_hex(f->config, strlen(f->config), f->cfg_d);
    snprintf(
        f->manifest, sizeof f->manifest,
        "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\","
        "\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"%s\","
        "\"size\":%zu},\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\","
        "\"digest\":\"%s\",\"size\":%zu}]}",
        f->cfg_d, strlen(f->config), f->layer_d, f->layer_len);
    sha_hex(f->manifest, strlen(f->manifest), f->man_d);
    snprintf(
        f->index, sizeof f->index,
        "{\"schemaVersion\":2,\"mediaType\":\"application/"
        "vnd.oci.image.index.v1+json\",\"manifests\":["
        "{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:%064d\","
        "\"size\":10,\"platform\":{\"os\":\"linux\",\"architecture\":\"arm64\",\"variant\":\"v8\"}}"
        ","
        "{\"mediaType\":\"application/"
        "vnd.oci.image.manifest.v1+json\",\"digest\":\"%s\",\"size\":%zu,"
        "\"platform\":{\"os\":\"linux\",\"architecture\":\"%s\"}}]}",
        0, f->man_d, strlen(f->manifest), f->s == S_NOAMD64 ? "s390x" : "amd64");
    sha_hex(f->index, strlen(f->index), f->idx_d);
}

static void reply(int fd, const char *status, const char *headers, const char *body, size_t n)
{
    char h[2048];
    int k =
        snprintf(h, sizeof h, "HTTP/1.1 %s\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n",
                 status, n, headers ? headers : "");
    if (write(fd, h, (size_t)k) < 0 || (n > 0 && write(fd, body, n) < 0))
        return;
}

static void reply_str(int fd, const char *status, const char *headers, const char *body)
{
    reply(fd, status, headers, body, strlen(body));
}

static void serve_blob(fake *f, int fd, const char *digest)
{
    if (strcmp(digest, f->cfg_d) == 0) {
        reply_str(fd, "200 OK", "Content-Type: application/octet-stream\r\n", f->config);
    } else if (strcmp(digest, f->layer_d) == 0) {
        char copy[sizeof f->layer];
        memcpy(copy, f->layer, sizeof copy);
        if (f->s == S_MISMATCH)
            copy[600] ^= 1; /* same size, other bytes */
        reply(fd, "200 OK", "Content-Type: application/octet-stream\r\n", copy, f->layer_len);
    } else {
        reply_str(
            fd, "404 Not Found", "Content-Type: application/json\r\n",
            "{\"errors\":[{\"code\":\"BLOB_UNKNOWN\",\"message\":\"blob unknown to registry\"}]}");
    }
}

static void serve_stall(fake *f, int fd)
{
    const char *h = "HTTP/1.1 200 OK\r\nContent-Length: 4095\r\nConnection: close\r\n\r\nabcde";
    if (write(fd, h, strlen(h)) < 0)
        return;
    struct pollfd p = {.fd = f->stop[0], .events = POLLIN};
    poll(&p, 1, 20000); /* until the test ends, or 20 s */
}

static bool authorized(fake *f, int fd, const char *auth)
{
    char hdr[512];
    if (f->s == S_BASIC_BAD) {
        reply_str(
            fd, "401 Unauthorized", "WWW-Authenticate: Basic realm=\"fake\"\r\n",
            "{\"errors\":[{\"code\":\"UNAUTHORIZED\",\"message\":\"authentication required\"}]}");
        return false;
    }
    if (f->s != S_BEARER || strcmp(auth, "Bearer tok-123") == 0)
        return true;
    snprintf(hdr, sizeof hdr,
             "WWW-Authenticate: Bearer realm=\"http://127.0.0.1:%d/token\",service=\"fake\","
             "scope=\"repository:swe/task:pull\"\r\n",
             f->port);
    reply_str(fd, "401 Unauthorized", hdr, "{\"errors\":[{\"code\":\"UNAUTHORIZED\"}]}");
    return false;
}

static void serve_v2(fake *f, int fd, const char *path, const char *auth)
{
    char loc[512];
    const char *mt = "Content-Type: application/vnd.oci.image.manifest.v1+json\r\n";
    const char *it = "Content-Type: application/vnd.oci.image.index.v1+json\r\n";
    if (!authorized(f, fd, auth))
        return;
    if (f->s == S_500)
        return reply_str(fd, "500 Internal Server Error", NULL, "internal boom");
    if (f->s == S_LOOP) {
        snprintf(loc, sizeof loc, "Location: %.400s\r\n", path);
        return reply_str(fd, "302 Found", loc, "");
    }
    if (strncmp(path, "/v2/swe/task/manifests/", 23) == 0) {
        const char *ref = path + 23;
        if (f->s == S_404)
            return reply_str(
                fd, "404 Not Found", "Content-Type: application/json\r\n",
                "{\"errors\":[{\"code\":\"MANIFEST_UNKNOWN\",\"message\":\"manifest unknown\"}]}");
        if (f->s == S_UNKNOWN_MT)
            return reply_str(fd, "200 OK", "Content-Type: application/vnd.example.thing+json\r\n",
                             "{\"mediaType\":\"application/vnd.example.thing+json\"}");
        if ((f->s == S_INDEX || f->s == S_NOAMD64) && strcmp(ref, "1") == 0)
            return reply_str(fd, "200 OK", it, f->index);
        if (strcmp(ref, "1") == 0 || strcmp(ref, f->man_d) == 0)
            return reply_str(fd, "200 OK", mt, f->manifest);
        return reply_str(fd, "404 Not Found", NULL,
                         "{\"errors\":[{\"code\":\"MANIFEST_UNKNOWN\"}]}");
    }
    if (strncmp(path, "/v2/swe/task/blobs/", 19) == 0) {
        const char *d = path + 19;
        if (f->s == S_BLOB404)
            return serve_blob(f, fd, "sha256:none");
        if (f->s == S_STALL && strcmp(d, f->layer_d) == 0)
            return serve_stall(f, fd);
        if (f->s == S_REDIRECT || f->s == S_BEARER) {
            snprintf(loc, sizeof loc, "Location: http://localhost:%d/cdn/%.80s\r\n", f->port, d);
            return reply_str(fd, "307 Temporary Redirect", loc, "");
        }
        return serve_blob(f, fd, d);
    }
    reply_str(fd, "404 Not Found", NULL, "no such route");
}

static void serve_one(fake *f, int fd)
{
    char req[8192];
    size_t n = 0;
    while (n < sizeof req - 1 && (n < 4 || memmem(req, n, "\r\n\r\n", 4) == NULL)) {
        ssize_t r = read(fd, req + n, sizeof req - 1 - n);
        if (r <= 0)
            return;
        n += (size_t)r;
    }
    req[n] = '\0';
    char path[2048] = "", auth[1024] = "";
    if (sscanf(req, "GET %2047s ", path) != 1)
        return reply_str(fd, "405 Method Not Allowed", NULL, "");
    const char *a = strcasestr(req, "\r\nAuthorization: ");
    if (a != NULL)
        snprintf(auth, sizeof auth, "%.*s", (int)strcspn(a + 17, "\r"), a + 17);
    if (strncmp(path, "/token?", 7) == 0) {
        f->token_gets++;
        bool scope_ok = strstr(path, "scope=repository%3Aswe%2Ftask%3Apull") != NULL;
        bool creds_ok = strcmp(auth, "Basic dTpw") == 0; /* u:p */
        if (f->s == S_TOKEN && creds_ok)
            return reply_str(fd, "200 OK", "Content-Type: application/json\r\n",
                             pathf("{\"token\":\"%s\"}", f->jwt));
        if (!scope_ok || !creds_ok)
            return reply_str(fd, "401 Unauthorized", NULL,
                             "{\"details\":\"bad scope or credentials\"}");
        return reply_str(fd, "200 OK", "Content-Type: application/json\r\n",
                         "{\"access_token\":\"tok-123\",\"expires_in\":300}");
    }
    if (strncmp(path, "/cdn/", 5) == 0) {
        f->cdn_gets++;
        f->auth_on_cdn += auth[0] != '\0';
        return serve_blob(f, fd, path + 5);
    }
    serve_v2(f, fd, path, auth);
}

static void *fake_main(void *arg)
{
    fake *f = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = f->lfd, .events = POLLIN},
                              {.fd = f->stop[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        if (!(p[0].revents & POLLIN))
            continue;
        int c = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0)
            continue;
        serve_one(f, c);
        close(c);
    }
    return NULL;
}

static fake *fake_start(scenario s)
{
    fake *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->s = s;
    assert_true((f->lfd = listen_loopback(&f->port)) >= 0);
    assert_int_equal(pipe2(f->stop, O_CLOEXEC), 0);
    fake_image(f);
    assert_int_equal(pthread_create(&f->th, NULL, fake_main, f), 0);
    return f;
}

static void fake_stop(fake *f)
{
    if (write(f->stop[1], "x", 1) < 0)
        fail();
    pthread_join(f->th, NULL);
    close(f->lfd);
    close(f->stop[0]);
    close(f->stop[1]);
    free(f);
}

/* ---- the hostile cases: each fails clearly and leaves nothing behind ---------------- */

static int seq;

static dsec_image_pull_opts fake_opts(const char *work)
{
    dsec_image_pull_opts o = {.plain_http = true, .timeout_s = 2};
    o.import.work_dir = work;
    return o;
}

static void expect_pull_fails(scenario s, const char *user, int code, const char *want1,
                              const char *want2)
{
    fake *f = fake_start(s);
    char *work = pathf("%s/work-%d", root, ++seq), *regdir = pathf("%s/reg-%d", root, seq);
    /* what a killed pull left (pid 2^22 + 1 is above pid_max's limit: never alive) */
    assert_int_equal(sh("mkdir -p %s/dsec-pull-4194305.abcdef/blobs", work), 0);
    char ref[256];
    snprintf(ref, sizeof ref, "127.0.0.1:%d/swe/task:1", f->port);
    dsec_layer_registry *r = NULL;
    dsec_err err = {0};
    assert_int_equal(dsec_layer_registry_local(&r, regdir, &err), 0);
    dsec_image_pull_opts o = fake_opts(work);
    o.username = user;
    o.password = user ? "wrong" : NULL;
    dsec_image_info *info = NULL;
    time_t t0 = time(NULL);
    assert_int_equal(dsec_image_pull(r, ref, &o, &info, &err), -1);
    print_message("  %s\n", err.msg);
    assert_true(time(NULL) - t0 < 15);
    assert_int_equal(err.code, code);
    assert_non_null(strstr(err.msg, want1));
    if (want2 != NULL)
        assert_non_null(strstr(err.msg, want2));
    assert_null(info);
    assert_true(dir_empty(work)); /* the scratch layout went */
    dsec_image_info *imgs = NULL;
    size_t nimg = 99;
    assert_int_equal(dsec_image_list(r, &imgs, &nimg, &err), 0);
    assert_int_equal(nimg, 0); /* no image */
    dsec_image_infos_free(imgs, nimg);
    char **envs = NULL;
    size_t nenv = 99;
    assert_int_equal(dsec_layer_registry_env_list(r, &envs, &nenv, &err), 0);
    assert_int_equal(nenv, 0); /* no environment */
    dsec_layer_names_free(envs, nenv);
    dsec_layer_info *li = NULL;
    size_t n = 99;
    assert_int_equal(dsec_layer_registry_list(r, &li, &n, &err), 0);
    assert_int_equal(n, 0);
    dsec_layer_infos_free(li, n);
    dsec_layer_registry_free(r);
    fake_stop(f);
}

static void test_bad_credentials(void **state)
{
    (void)state;
    expect_pull_fails(S_BASIC_BAD, "u", DSEC_E_PERMISSION,
                      "refused the credentials for swe/task: 401", "127.0.0.1:");
    expect_pull_fails(S_BASIC_BAD, NULL, DSEC_E_PERMISSION, "wants credentials for swe/task", NULL);
}

static void test_not_found(void **state)
{
    (void)state;
    expect_pull_fails(S_404, NULL, DSEC_E_NOT_FOUND, "has no manifest swe/task:1",
                      "MANIFEST_UNKNOWN");
    expect_pull_fails(S_BLOB404, NULL, DSEC_E_NOT_FOUND, "has no config sha256:", "BLOB_UNKNOWN");
}

static void test_server_error(void **state)
{
    (void)state;
    expect_pull_fails(S_500, NULL, DSEC_E_IO, "answered 500 for manifest swe/task:1",
                      "internal boom");
}

static void test_redirect_loop(void **state)
{
    (void)state;
    expect_pull_fails(S_LOOP, NULL, DSEC_E_IO, "redirect loop", "manifest swe/task:1");
}

static void test_stalled_body(void **state)
{
    (void)state;
    expect_pull_fails(S_STALL, NULL, DSEC_E_TIMEOUT, "stalled", "layer sha256:");
}

static void test_digest_mismatch(void **state)
{
    (void)state;
    expect_pull_fails(S_MISMATCH, NULL, DSEC_E_DECODE, "does not match its digest",
                      "layer sha256:");
}

static void test_index_without_platform(void **state)
{
    (void)state;
    expect_pull_fails(S_NOAMD64, NULL, DSEC_E_NOT_FOUND, "has no linux/amd64 image",
                      "linux/arm64/v8, linux/s390x");
}

static void test_unknown_media_type(void **state)
{
    (void)state;
    expect_pull_fails(S_UNKNOWN_MT, NULL, DSEC_E_UNSUPPORTED, "application/vnd.example.thing+json",
                      "manifest swe/task:1");
}

/* A fetch from the fake server that works: the layout holds what the server had. */
static void fetch_fake(scenario s, const char *user, const char *pass, fake **out, char *dir)
{
    fake *f = fake_start(s);
    snprintf(dir, 512, "%s/layout-%d", root, ++seq);
    assert_int_equal(mkdir(dir, 0755), 0);
    char ref[256];
    snprintf(ref, sizeof ref, "127.0.0.1:%d/swe/task:1", f->port);
    dsec_image_pull_opts o = fake_opts(NULL);
    o.username = user;
    o.password = pass;
    dsec_err err = {0};
    char *norm = NULL;
    if (dsec__image_fetch_layout(ref, &o, dir, &norm, &err) < 0)
        fail_msg("fetch: %s", err.msg);
    assert_string_equal(norm, ref);
    dsec_free(norm);
    const dsec_digest *want[] = {&f->man_d, &f->cfg_d, &f->layer_d};
    for (size_t i = 0; i < 3; i++) {
        dsec_digest got;
        assert_int_equal(
            dsec_digest_file(pathf("%s/blobs/sha256/%s", dir, *want[i] + 7), got, &err), 0);
        assert_string_equal(got, *want[i]);
    }
    assert_int_equal(sh("grep -q '\"digest\":\"%s\"' %s/index.json", f->man_d, dir), 0);
    assert_int_equal(sh("grep -q imageLayoutVersion %s/oci-layout", dir), 0);
    *out = f;
}

static void test_fake_ok_and_index(void **state)
{
    (void)state;
    char dir[512];
    fake *f;
    fetch_fake(S_OK, NULL, NULL, &f, dir);
    fake_stop(f);
    fetch_fake(S_INDEX, NULL, NULL, &f, dir); /* resolved to linux/amd64 */
    fake_stop(f);
}

static void test_bearer_token(void **state)
{
    (void)state;
    char dir[512];
    fake *f;
    fetch_fake(S_BEARER, "u", "p", &f, dir);
    assert_int_equal(f->token_gets, 1);  /* one token, reused for every blob */
    assert_int_equal(f->cdn_gets, 2);    /* blobs redirected to another host name... */
    assert_int_equal(f->auth_on_cdn, 0); /* ...which never sees the registry's token */
    fake_stop(f);
}

static void test_blob_redirect(void **state)
{
    (void)state;
    char dir[512];
    fake *f;
    fetch_fake(S_REDIRECT, "u", "p", &f, dir);
    assert_int_equal(f->cdn_gets, 2);
    fake_stop(f);
}

/* ---- a real registry: docker-registry (distribution v2.8) on loopback ------------- */

typedef struct reg {
    pid_t pid;
    int port;
    char dir[512];
} reg;

static void wait_port(int port)
{
    for (int i = 0; i < 200; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int rc = connect(fd, (struct sockaddr *)&a, sizeof a);
        close(fd);
        if (rc == 0)
            return;
        usleep(50000);
    }
    fail_msg("the registry did not listen on port %d", port);
}

/* TLS: a CA, a server cert for 127.0.0.1, and htpasswd user u / password p. */
static void make_tls(const char *d)
{
    assert_int_equal(
        sh("cd %s && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt "
           "-days 2 -subj /CN=dsec-test-ca 2>/dev/null && "
           "openssl req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj /CN=127.0.0.1 "
           "2>/dev/null && printf 'subjectAltName=IP:127.0.0.1\\n' > ext && "
           "openssl x509 -req -in srv.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out srv.crt "
           "-days 2 -extfile ext 2>/dev/null && mkdir certs && cp ca.crt certs/ && "
           "htpasswd -Bbn u p > htpasswd",
           d),
        0);
}

/* A signing cert for registry tokens and one RS256 token (pull, push on swe/task) signed with
 * it, its kid the libtrust key id of the public key, as distribution checks it. */
static void make_jwt(const char *d, char *jwt, size_t n)
{
    assert_int_equal(
        sh("cd %s && openssl req -x509 -newkey rsa:2048 -nodes -keyout tok.key -out tok.crt "
           "-days 2 -subj /CN=dsec-token 2>/dev/null && "
           "b64u() { openssl base64 -A | tr '+/' '-_' | tr -d '='; } && "
           "kid=$(openssl x509 -in tok.crt -pubkey -noout | openssl pkey -pubin -outform DER | "
           "openssl dgst -sha256 -binary | head -c 30 | base32 | tr -d '=' | sed 's/..../&:/g; "
           "s/:$//') && "
           "h=$(printf '{\"typ\":\"JWT\",\"alg\":\"RS256\",\"kid\":\"%%s\"}' $kid | b64u) && "
           "now=$(date +%%s) && p=$(printf '{\"iss\":\"dsec-test-issuer\",\"sub\":\"u\","
           "\"aud\":\"dsec-test\",\"exp\":%%d,\"nbf\":%%d,\"iat\":%%d,\"jti\":\"t1\","
           "\"access\":[{\"type\":\"repository\",\"name\":\"swe/task\",\"actions\":"
           "[\"pull\",\"push\"]}]}' $((now+3600)) $((now-60)) $((now-60)) | b64u) && "
           "s=$(printf '%%s.%%s' $h $p | openssl dgst -sha256 -sign tok.key -binary | b64u) && "
           "echo $h.$p.$s > jwt",
           d),
        0);
    FILE *f = fopen(pathf("%s/jwt", d), "r");
    assert_non_null(f);
    assert_non_null(fgets(jwt, (int)n, f));
    jwt[strcspn(jwt, "\n")] = '\0';
    fclose(f);
}

static int token_port; /* reg_start with token auth: the realm's port */

static void reg_start(reg *g, bool tls)
{
    snprintf(g->dir, sizeof g->dir, "%s/registry-%d", root, ++seq);
    assert_int_equal(mkdir(g->dir, 0755), 0);
    g->port = free_port();
    if (tls)
        make_tls(g->dir);
    FILE *f = fopen(pathf("%s/config.yml", g->dir), "w");
    assert_non_null(f);
    fprintf(
        f,
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s/store\n"
        "http:\n  addr: 127.0.0.1:%d\n  secret: dsec-test\n",
        g->dir, g->port);
    if (token_port != 0)
        fprintf(f,
                "auth:\n  token:\n    realm: http://127.0.0.1:%d/token\n    service: dsec-test\n"
                "    issuer: dsec-test-issuer\n    rootcertbundle: %s/tok.crt\n",
                token_port, root);
    if (tls)
        fprintf(f,
                "  tls:\n    certificate: %s/srv.crt\n    key: %s/srv.key\nauth:\n  htpasswd:\n"
                "    realm: dsec-test\n    path: %s/htpasswd\n",
                g->dir, g->dir, g->dir);
    fclose(f);
    g->pid = fork();
    assert_true(g->pid >= 0);
    if (g->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the run (it would hold its locks) */
        int log = open(pathf("%s/log", g->dir), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(log, 1);
        dup2(log, 2);
        execlp("docker-registry", "docker-registry", "serve", pathf("%s/config.yml", g->dir),
               (char *)NULL);
        _exit(127);
    }
    wait_port(g->port);
}

static void reg_stop(reg *g)
{
    kill(g->pid, SIGTERM);
    waitpid(g->pid, NULL, 0);
}

/* Build the 3-layer busybox layout and push it as swe/task:TAG; returns the manifest digest. */
static void push(reg *g, bool tls, const char *tag, const char *format, char *digest)
{
    char *src = pathf("%s/src-%d", root, ++seq);
    snprintf(digest, DSEC_DIGEST_STRLEN + 1, "%s",
             sh_out(pathf("%s %s %s", IMAGE_PULL_LAYOUT_SH, src, tag)));
    assert_true(dsec_digest_valid(digest));
    assert_int_equal(sh("skopeo copy -q %s %s %s %s oci:%s:%s docker://127.0.0.1:%d/swe/task:%s "
                        ">%s/push.log 2>&1",
                        tls ? pathf("--dest-cert-dir %s/certs --dest-creds u:p", g->dir)
                            : "--dest-tls-verify=false",
                        token_port ? "--dest-creds u:p" : "", format ? "--format" : "",
                        format ? format : "", src, tag, g->port, tag, root),
                     0);
}

/* Every blob in the layout is named by its digest, and skopeo reads the layout. */
static void check_layout(const char *dir, const char *manifest)
{
    assert_int_equal(
        sh("cd %s/blobs/sha256 && for f in *; do echo \"$f  $f\"; done | sha256sum -c --quiet",
           dir),
        0);
    assert_int_equal(sh("skopeo inspect oci:%s >/dev/null", dir), 0);
    if (manifest != NULL)
        assert_int_equal(sh("grep -q '\"digest\":\"%s\"' %s/index.json", manifest, dir), 0);
}

/* Progress lines of a pull: layers downloaded, and layers left out as already held. */
struct fetched {
    int fetched, skipped;
};

static void count_fetched(void *arg, const char *line)
{
    struct fetched *f = arg;
    if (strncmp(line, "layer ", 6) != 0)
        return;
    if (strstr(line, " fetched (") != NULL)
        f->fetched++;
    else if (strstr(line, " not fetched: already a layer") != NULL)
        f->skipped++;
}

static void test_registry_plain(void **state)
{
    (void)state;
    reg g;
    reg_start(&g, false);
    char oci[DSEC_DIGEST_STRLEN + 1];
    push(&g, false, "1", NULL, oci);
    push(&g, false, "2", "v2s2", (char[DSEC_DIGEST_STRLEN + 1]){0}); /* Docker schema 2 */
    dsec_image_pull_opts o = {.plain_http = true, .timeout_s = 10};
    dsec_err err = {0};
    char *dir = pathf("%s/pulled-%d", root, ++seq), ref[256];
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(ref, sizeof ref, "127.0.0.1:%d/swe/task:1", g.port);
    if (dsec__image_fetch_layout(ref, &o, dir, NULL, &err) < 0)
        fail_msg("fetch %s: %s", ref, err.msg);
    check_layout(dir, oci); /* the OCI manifest came back byte for byte */
    /* the same by digest */
    char *dir2 = pathf("%s/pulled-%d", root, ++seq), ref2[256], *norm = NULL;
    assert_int_equal(mkdir(dir2, 0755), 0);
    snprintf(ref2, sizeof ref2, "127.0.0.1:%d/swe/task@%s", g.port, oci);
    if (dsec__image_fetch_layout(ref2, &o, dir2, &norm, &err) < 0)
        fail_msg("fetch %s: %s", ref2, err.msg);
    assert_string_equal(norm, ref2);
    dsec_free(norm);
    check_layout(dir2, oci);
    /* Docker schema 2 */
    char *dir3 = pathf("%s/pulled-%d", root, ++seq);
    assert_int_equal(mkdir(dir3, 0755), 0);
    snprintf(ref, sizeof ref, "127.0.0.1:%d/swe/task:2", g.port);
    if (dsec__image_fetch_layout(ref, &o, dir3, NULL, &err) < 0)
        fail_msg("fetch %s: %s", ref, err.msg);
    check_layout(dir3, NULL);
    assert_int_equal(
        sh("grep -q application/vnd.docker.distribution.manifest.v2+json %s/index.json", dir3), 0);
    /* whole pulls, imported: the OCI image, then the Docker one (two of its three layers the same)
     */
    dsec_layer_registry *r = NULL;
    assert_int_equal(dsec_layer_registry_local(&r, pathf("%s/full-reg", root), &err), 0);
    dsec_image_pull_opts po = {.plain_http = true, .timeout_s = 30};
    po.import.work_dir = pathf("%s/full-work", root);
    dsec_image_info *i1 = NULL, *i2 = NULL;
    snprintf(ref, sizeof ref, "127.0.0.1:%d/swe/task:1", g.port);
    if (dsec_image_pull(r, ref, &po, &i1, &err) < 0)
        fail_msg("pull %s: %s", ref, err.msg);
    assert_string_equal(i1->ref, ref);
    assert_string_equal(i1->manifest, oci);
    assert_int_equal(i1->nlayers, 3);
    for (size_t i = 0; i < 3; i++)
        assert_false(i1->layers[i].reused);
    dsec_env *env = NULL;
    if (dsec_layer_registry_env_get(r, i1->env, &env, &err) < 0)
        fail_msg("env %s: %s", i1->env, err.msg);
    assert_int_equal(env->nlayers, 3);
    dsec_env_free(env);
    snprintf(ref, sizeof ref, "127.0.0.1:%d/swe/task:2", g.port);
    struct fetched f2 = {0};
    po.import.progress = count_fetched, po.import.progress_arg = &f2;
    if (dsec_image_pull(r, ref, &po, &i2, &err) < 0)
        fail_msg("pull %s: %s", ref, err.msg);
    assert_int_equal(i2->nlayers, 3);
    assert_int_equal(f2.skipped, 2); /* the two layers already held are not even downloaded */
    assert_int_equal(f2.fetched, 1);
    for (size_t i = 0; i < 2; i++) {       /* busybox and motd: the same tars in both images */
        assert_true(i2->layers[i].reused); /* same diff_ids: neither converted nor stored again */
        assert_string_equal(i2->layers[i].layer, i1->layers[i].layer);
    }
    assert_false(i2->layers[2].reused); /* each build of the layout has its own random file */
    assert_true(dir_empty(po.import.work_dir));
    dsec_image_info_free(i1);
    dsec_image_info_free(i2);
    dsec_layer_registry_free(r);
    /* a tag that is not there */
    snprintf(ref, sizeof ref, "127.0.0.1:%d/swe/task:nope", g.port);
    assert_int_equal(
        dsec__image_fetch_layout(ref, &o, pathf("%s/pulled-%d", root, ++seq), NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "has no manifest swe/task:nope"));
    reg_stop(&g);
}

static int fetch_tls(reg *g, dsec_image_pull_opts *o, dsec_err *err)
{
    char *dir = pathf("%s/pulled-%d", root, ++seq), ref[256];
    snprintf(ref, sizeof ref, "127.0.0.1:%d/swe/task:1", g->port);
    dsec_err_clear(err);
    int rc = dsec__image_fetch_layout(ref, o, dir, NULL, err);
    if (rc == 0)
        check_layout(dir, NULL);
    else
        print_message("  %s\n", err->msg);
    return rc;
}

static void test_registry_tls_htpasswd(void **state)
{
    (void)state;
    reg g;
    reg_start(&g, true);
    char oci[DSEC_DIGEST_STRLEN + 1];
    push(&g, true, "1", NULL, oci);
    char *ca = pathf("%s/ca.crt", g.dir);
    dsec_err err = {0};
    dsec_image_pull_opts o = {.ca_file = ca, .username = "u", .password = "p", .timeout_s = 10};
    if (fetch_tls(&g, &o, &err) < 0)
        fail_msg("%s", err.msg);
    /* credentials from a docker config.json, keyed https://HOST:PORT ("u:p" in base64) */
    char *auth = pathf("%s/auth.json", g.dir);
    assert_int_equal(
        sh("printf '{\"auths\":{\"other:1\":{\"auth\":\"eDp5\"},\"https://127.0.0.1:%d\":"
           "{\"auth\":\"dTpw\"}}}' > %s",
           g.port, auth),
        0);
    dsec_image_pull_opts oa = {.ca_file = ca, .auth_file = auth, .timeout_s = 10};
    if (fetch_tls(&g, &oa, &err) < 0)
        fail_msg("%s", err.msg);
    /* wrong password */
    o.password = "wrong";
    assert_int_equal(fetch_tls(&g, &o, &err), -1);
    assert_int_equal(err.code, DSEC_E_PERMISSION);
    assert_non_null(strstr(
        err.msg, pathf("registry 127.0.0.1:%d refused the credentials for swe/task: 401", g.port)));
    /* no credentials at all */
    dsec_image_pull_opts on = {
        .ca_file = ca, .auth_file = pathf("%s/none.json", root), .timeout_s = 10};
    assert_int_equal(fetch_tls(&g, &on, &err), -1);
    assert_non_null(strstr(err.msg, "reading the auth file")); /* a named auth file must exist */
    assert_int_equal(sh("echo '{}' > %s/none.json", root), 0);
    assert_int_equal(fetch_tls(&g, &on, &err), -1);
    assert_int_equal(err.code, DSEC_E_PERMISSION);
    assert_non_null(strstr(err.msg, "wants credentials for swe/task"));
    /* a CA the system does not trust */
    o.password = "p";
    o.ca_file = NULL;
    assert_int_equal(fetch_tls(&g, &o, &err), -1);
    assert_int_equal(err.code, DSEC_E_CONN);
    assert_non_null(strstr(err.msg, "TLS with registry 127.0.0.1:"));
    reg_stop(&g);
}

/* Run the CLI with stdin from the string in (NULL: unchanged); its exit code. */
static int cli(const char *in, int argc, const char **argv)
{
    int saved = dup(0), p[2];
    assert_int_equal(pipe(p), 0);
    if (in != NULL) {
        assert_int_equal(write(p[1], in, strlen(in)), (ssize_t)strlen(in));
        dup2(p[0], 0);
        clearerr(stdin);
    }
    close(p[0]);
    close(p[1]);
    int rc = dsec__cli_image_pull(argc, (char **)argv);
    dup2(saved, 0);
    close(saved);
    clearerr(stdin);
    return rc;
}

static bool no_scratch(void)
{
    return sh("ls -d %s/dsec-pull-* >/dev/null 2>&1", root) != 0;
}

static void test_cli(void **state)
{
    (void)state;
    char *regdir = pathf("%s/cli-reg", root);
    const char *a1[] = {"pull", NULL};
    assert_int_equal(cli(NULL, 1, a1), 2);
    const char *a2[] = {"pull", "127.0.0.1:1/x:1", "--password-stdin", NULL};
    assert_int_equal(cli(NULL, 3, a2), 2);
    const char *a3[] = {"pull", "127.0.0.1:1/x:1", "--format", "squashfs", NULL};
    assert_int_equal(cli(NULL, 4, a3), 2);
    /* refused credentials, the password read from stdin */
    fake *f = fake_start(S_BASIC_BAD);
    char ref[256];
    snprintf(ref, sizeof ref, "127.0.0.1:%d/swe/task:1", f->port);
    const char *a4[] = {"pull",         ref,          "--user", "u", "--password-stdin",
                        "--plain-http", "--registry", regdir,   NULL};
    assert_int_equal(cli("wrong\n", 8, a4), 1);
    assert_true(no_scratch());
    fake_stop(f);
    /* https against a plain-HTTP server: a clear TLS failure */
    f = fake_start(S_OK);
    snprintf(ref, sizeof ref, "127.0.0.1:%d/swe/task:1", f->port);
    const char *a5[] = {"pull", ref, "--registry", regdir, "--timeout", "3", NULL};
    assert_int_equal(cli(NULL, 6, a5), 1);
    dsec_image_pull_opts o = {.timeout_s = 2};
    dsec_err err = {0};
    assert_int_equal(dsec__image_fetch_layout(ref, &o, pathf("%s/cli-l", root), NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_TIMEOUT);
    assert_non_null(strstr(err.msg, "needs --plain-http"));
    /* a whole pull, imported: the image is listed under the normalized ref */
    const char *a6[] = {"pull", ref, "--plain-http", "--registry", regdir, "--format", "dir", NULL};
    assert_int_equal(cli(NULL, 7, a6), 0);
    assert_true(no_scratch());
    dsec_layer_registry *r = NULL;
    dsec_image_info *info = NULL;
    assert_int_equal(dsec_layer_registry_local(&r, regdir, &err), 0);
    if (dsec_image_get(r, ref, &info, &err) < 0)
        fail_msg("%s", err.msg);
    assert_string_equal(info->ref, ref);
    assert_string_equal(info->manifest, f->man_d);
    assert_string_equal(info->config, f->cfg_d);
    assert_int_equal(info->nlayers, 1);
    assert_string_equal(info->layers[0].diff_id, f->layer_d);
    dsec_image_info_free(info);
    dsec_layer_registry_free(r);
    fake_stop(f);
}

/* The registry's own token auth: it checks the RS256 token our token service hands out. */
static void test_registry_bearer(void **state)
{
    (void)state;
    fake *f = fake_start(S_TOKEN);
    make_jwt(root, f->jwt, sizeof f->jwt);
    token_port = f->port;
    reg g;
    reg_start(&g, false);
    char oci[DSEC_DIGEST_STRLEN + 1];
    push(&g, false, "1", NULL, oci);
    int gets = f->token_gets;
    dsec_image_pull_opts o = {
        .plain_http = true, .timeout_s = 10, .username = "u", .password = "p"};
    dsec_err err = {0};
    char *dir = pathf("%s/pulled-%d", root, ++seq), ref[256];
    snprintf(ref, sizeof ref, "127.0.0.1:%d/swe/task:1", g.port);
    if (dsec__image_fetch_layout(ref, &o, dir, NULL, &err) < 0)
        fail_msg("fetch %s: %s", ref, err.msg);
    check_layout(dir, oci);
    assert_int_equal(f->token_gets, gets + 1);
    /* no credentials: the token service refuses, and says so */
    dsec_image_pull_opts on = {.plain_http = true, .timeout_s = 10};
    assert_int_equal(
        dsec__image_fetch_layout(ref, &on, pathf("%s/pulled-%d", root, ++seq), NULL, &err), -1);
    print_message("  %s\n", err.msg);
    assert_int_equal(err.code, DSEC_E_PERMISSION);
    assert_non_null(strstr(err.msg, "refused anonymous access for swe/task"));
    reg_stop(&g);
    token_port = 0;
    fake_stop(f);
}

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof root, "/tmp/dsec-pull-XXXXXX");
    if (mkdtemp(root) == NULL)
        return -1;
    setenv("DOCKER_CONFIG", root, 1); /* no config.json there: no stray credentials */
    setenv("TMPDIR", root, 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return sh("rm -rf %s", root) == 0 ? 0 : -1;
}

int main(void)
{
    const char *need[] = {"docker-registry", "skopeo", "openssl", "htpasswd", "tar", "gzip",
                          "sha256sum",       "base32"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (sh("command -v %s >/dev/null", need[i]) != 0 || access("/bin/busybox", X_OK) != 0) {
            fprintf(stderr,
                    "test_image_pull: %s or /bin/busybox missing (scripts/install-deps.sh)\n",
                    need[i]);
            return 77;
        }
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_references),
        cmocka_unit_test(test_fake_ok_and_index),
        cmocka_unit_test(test_bearer_token),
        cmocka_unit_test(test_blob_redirect),
        cmocka_unit_test(test_bad_credentials),
        cmocka_unit_test(test_not_found),
        cmocka_unit_test(test_server_error),
        cmocka_unit_test(test_redirect_loop),
        cmocka_unit_test(test_stalled_body),
        cmocka_unit_test(test_digest_mismatch),
        cmocka_unit_test(test_index_without_platform),
        cmocka_unit_test(test_unknown_media_type),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_registry_plain),
        cmocka_unit_test(test_registry_tls_htpasswd),
        cmocka_unit_test(test_registry_bearer),
    };
    if (getenv("DSEC_TEST_FILTER") != NULL && *getenv("DSEC_TEST_FILTER"))
        cmocka_set_test_filter(getenv("DSEC_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
