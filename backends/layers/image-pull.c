/* image-pull.c - pull an image from an OCI distribution registry (HTTP API v2) into an OCI layout,
 * then import it. */
#define _GNU_SOURCE
#include <ctype.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/layers/image-int.h"
#include "backends/layers/image-pull-int.h"
#include "backends/layers/layer-int.h"
#include "dsec/alloc.h"
#include "dsec/io.h"
#include "dsec/json.h"
#include "dsec/sha256.h"

#define MT_OCI_INDEX "application/vnd.oci.image.index.v1+json"
#define MT_OCI_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define MT_DOCKER_LIST "application/vnd.docker.distribution.manifest.list.v2+json"
#define MT_DOCKER_V2 "application/vnd.docker.distribution.manifest.v2+json"
#define MANIFEST_MAX (4u << 20)
#define SNIPPET_MAX 200
#define MAX_REDIRS 10L

/* ---- references ---------------------------------------------------------------------- */

/* A pull reference's parts, all dsec_malloc'd. The private twin of
 * dsec_image_ref_parse (image import), kept small so one can replace the other. */
typedef struct pull_ref {
    char *host;   /* as named, "docker.io" when none was */
    char *path;   /* "library/x" for a bare Docker Hub name */
    char *tag;    /* NULL with a digest only */
    char *digest; /* NULL with a tag only */
} pull_ref;

static void pull_ref_free(pull_ref *r)
{
    dsec_free(r->host);
    dsec_free(r->path);
    dsec_free(r->tag);
    dsec_free(r->digest);
    memset(r, 0, sizeof *r);
}

static bool path_ok(const char *s)
{
    if (*s == '\0' || *s == '/' || s[strlen(s) - 1] == '/' || strstr(s, "//") != NULL)
        return false;
    for (; *s; s++)
        if (!(islower((unsigned char)*s) || isdigit((unsigned char)*s) || strchr("._-/", *s)))
            return false;
    return true;
}

static bool tag_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 128 || *s == '.' || *s == '-')
        return false;
    for (; *s; s++)
        if (!(isalnum((unsigned char)*s) || strchr("._-", *s)))
            return false;
    return true;
}

static int pull_ref_parse(const char *ref, pull_ref *r, dsec_err *err)
{
    memset(r, 0, sizeof *r);
    char *host, *path, *tag, *digest; /* split as the importer splits it (dsec/image.h) */
    if (dsec_image_ref_parse(ref, &host, &path, &tag, &digest, err) < 0)
        return -1;
    r->digest = digest;
    r->tag = tag != NULL || digest != NULL ? tag : dsec_strdup("latest");
    r->host = host != NULL ? host : dsec_strdup("docker.io");
    if (host == NULL && strchr(path, '/') == NULL) { /* docker.io/NAME is library/NAME */
        r->path = dsec__layer_path("library/%s", path);
        dsec_free(path);
    } else {
        r->path = path;
    }
    if (r->host == NULL || r->path == NULL || (r->tag == NULL && r->digest == NULL)) {
        pull_ref_free(r);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    if (!path_ok(r->path) || (r->tag != NULL && !tag_ok(r->tag)) || *r->host == '\0') {
        pull_ref_free(r);
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "image reference %s: expected [HOST[:PORT]/]PATH[:TAG][@sha256:HEX] "
                            "(PATH in [a-z0-9._/-])",
                            ref);
    }
    return 0;
}

/* HOST[:PORT]/PATH:TAG, or HOST[:PORT]/PATH@DIGEST without a tag. */
static char *pull_ref_normalize(const pull_ref *r)
{
    if (r->tag != NULL)
        return dsec__layer_path("%s/%s:%s", r->host, r->path, r->tag);
    return dsec__layer_path("%s/%s@%s", r->host, r->path, r->digest);
}

/* ---- base64 -------------------------------------------------------------------------- */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const char *in, size_t n)
{
    char *o = dsec_malloc((n + 2) / 3 * 4 + 1), *p = o;
    if (o == NULL)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned char)in[i] << 16;
        if (i + 1 < n)
            v |= (unsigned char)in[i + 1] << 8;
        if (i + 2 < n)
            v |= (unsigned char)in[i + 2];
        *p++ = b64[(v >> 18) & 63];
        *p++ = b64[(v >> 12) & 63];
        *p++ = i + 1 < n ? b64[(v >> 6) & 63] : '=';
        *p++ = i + 2 < n ? b64[v & 63] : '=';
    }
    *p = '\0';
    return o;
}

/* NULL on bad input; the result is NUL-terminated. */
static char *b64_decode(const char *in)
{
    size_t n = strlen(in);
    char *o = dsec_malloc(n / 4 * 3 + 4), *p = o;
    if (o == NULL)
        return NULL;
    unsigned v = 0, bits = 0;
    for (; *in && *in != '='; in++) {
        const char *c = strchr(b64, *in);
        if (c == NULL || *in == '\0') {
            dsec_free(o);
            return NULL;
        }
        v = (v << 6) | (unsigned)(c - b64);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            *p++ = (char)((v >> bits) & 0xFF);
        }
    }
    *p = '\0';
    return o;
}

/* ---- credentials --------------------------------------------------------------------- */

/* Whether a config.json "auths" key names host: "host", "https://host", "http://host/v2/". */
static bool auth_key_matches(const char *key, const char *host)
{
    if (strncmp(key, "https://", 8) == 0)
        key += 8;
    else if (strncmp(key, "http://", 7) == 0)
        key += 7;
    size_t n = strcspn(key, "/");
    return strlen(host) == n && strncmp(key, host, n) == 0;
}

/* Parse a JSON document the registry or a file gave; errors name what it was. */
static int pj_parse(const char *text, size_t len, const char *what, dsec_json **out, dsec_err *err)
{
    if (dsec_json_parse(text, len, out, err) < 0)
        return dsec_err_wrap(err, "%s", what);
    return 0;
}

static int auth_from_entry(const dsec_json *e, const char *file, char **user, char **pass,
                           dsec_err *err)
{
    const char *a = dsec_json_get_str(e, "auth");
    if (a != NULL && *a != '\0') {
        char *d = b64_decode(a), *c = d != NULL ? strchr(d, ':') : NULL;
        if (c == NULL) {
            dsec_free(d);
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "auth file %s: an \"auth\" field is not base64 of USER:PASSWORD",
                                file);
        }
        *c = '\0';
        *user = dsec_strdup(d);
        *pass = dsec_strdup(c + 1);
        dsec_free(d);
    } else if (dsec_json_get_str(e, "username") != NULL &&
               dsec_json_get_str(e, "password") != NULL) {
        *user = dsec_strdup(dsec_json_get_str(e, "username"));
        *pass = dsec_strdup(dsec_json_get_str(e, "password"));
    } else {
        return 0;
    }
    if (*user == NULL || *pass == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    return 0;
}

/* Credentials for host from a docker-style config.json; none is not an
 * error; a missing default file is not one either. */
static int auth_from_file(const char *file, bool given, const char *host, char **user, char **pass,
                          dsec_err *err)
{
    char *text DSEC_AUTOFREE = NULL;
    size_t len;
    dsec_err e2 = {0};
    if (dsec_read_file(file, 1u << 20, &text, &len, &e2) < 0) {
        if (e2.code == DSEC_E_NOT_FOUND && !given)
            return 0;
        *err = e2;
        return dsec_err_wrap(err, "reading the auth file");
    }
    dsec_json *doc = NULL;
    if (pj_parse(text, len, file, &doc, err) < 0)
        return -1;
    const dsec_json *auths = dsec_json_get(doc, "auths");
    int rc = 0;
    for (size_t i = 0; auths != NULL && auths->type == DSEC_JSON_OBJECT && i < auths->len; i++) {
        if (auth_key_matches(auths->keys[i], host)) {
            rc = auth_from_entry(auths->items[i], file, user, pass, err);
            break;
        }
    }
    dsec_json_free(doc);
    return rc;
}

static int find_credentials(const dsec_image_pull_opts *o, const char *host, char **user,
                            char **pass, dsec_err *err)
{
    if (o->username != NULL) {
        *user = dsec_strdup(o->username);
        *pass = dsec_strdup(o->password != NULL ? o->password : "");
        return *user != NULL && *pass != NULL ? 0
                                              : dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    if (o->auth_file != NULL)
        return auth_from_file(o->auth_file, true, host, user, pass, err);
    char path[4096];
    const char *dc = getenv("DOCKER_CONFIG"), *home = getenv("HOME");
    if (dc != NULL && *dc != '\0')
        snprintf(path, sizeof path, "%s/config.json", dc);
    else if (home != NULL && *home != '\0')
        snprintf(path, sizeof path, "%s/.docker/config.json", home);
    else
        return 0;
    return auth_from_file(path, false, host, user, pass, err);
}

/* ---- HTTP ---------------------------------------------------------------------------- */

typedef struct puller {
    CURL *curl;
    const dsec_image_pull_opts *o;
    pull_ref ref;
    char *base;        /* "https://HOST/v2/PATH" */
    char *user, *pass; /* NULL when none were found */
    char *auth;        /* the "Authorization: ..." header to send, or NULL */
    unsigned timeout_s;
    char errbuf[CURL_ERROR_SIZE];
} puller;

/* One transfer: its body goes to memory (fd < 0) or to a file while hashed. */
typedef struct xfer {
    CURL *curl;
    char *buf;
    size_t len, max;
    int fd;
    dsec_sha256 sha;
    uint64_t bytes, limit;
    bool over;
    int werrno;
    char errbody[SNIPPET_MAX + 1]; /* the body of an answer that is not 200 */
    size_t errlen;
    char *www_auth, *ctype; /* of the last response (a redirect's are dropped) */
} xfer;

static void xfer_reset(xfer *x)
{
    x->len = 0;
    x->bytes = 0;
    x->over = false;
    x->werrno = 0;
    x->errlen = 0;
    x->errbody[0] = '\0';
    dsec_free(x->www_auth);
    dsec_free(x->ctype);
    x->www_auth = x->ctype = NULL;
    if (x->fd >= 0) {
        dsec_sha256_init(&x->sha);
        if (ftruncate(x->fd, 0) < 0 || lseek(x->fd, 0, SEEK_SET) < 0)
            x->werrno = errno;
    }
}

static void xfer_done(xfer *x)
{
    dsec_free(x->buf);
    dsec_free(x->www_auth);
    dsec_free(x->ctype);
    x->buf = x->www_auth = x->ctype = NULL;
}

static int sink_file(xfer *x, const char *data, size_t n)
{
    if (x->bytes + n > x->limit) {
        x->over = true;
        return -1;
    }
    dsec_sha256_update(&x->sha, data, n);
    x->bytes += n;
    if (dsec_write_all(x->fd, data, n) < 0) {
        x->werrno = errno;
        return -1;
    }
    return 0;
}

static int sink_mem(xfer *x, const char *data, size_t n)
{
    if (x->len + n > x->max) {
        x->over = true;
        return -1;
    }
    char *b = dsec_realloc(x->buf, x->len + n + 1);
    if (b == NULL) {
        x->werrno = ENOMEM;
        return -1;
    }
    memcpy(b + x->len, data, n);
    x->len += n;
    b[x->len] = '\0';
    x->buf = b;
    return 0;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    xfer *x = arg;
    size_t n = size * nmemb;
    long code = 0;
    curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 300 && code < 400)
        return n;
    if (code != 200) {
        size_t room = SNIPPET_MAX - x->errlen, k = n < room ? n : room;
        memcpy(x->errbody + x->errlen, data, k);
        x->errlen += k;
        x->errbody[x->errlen] = '\0';
        return n;
    }
    int rc = x->fd >= 0 ? sink_file(x, data, n) : sink_mem(x, data, n);
    return rc < 0 ? 0 : n;
}

static char *header_value(const char *line, size_t n, const char *name)
{
    size_t k = strlen(name);
    if (n <= k || strncasecmp(line, name, k) != 0)
        return NULL;
    const char *v = line + k, *e = line + n;
    while (v < e && (*v == ' ' || *v == '\t'))
        v++;
    while (e > v && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' '))
        e--;
    return dsec_strndup(v, (size_t)(e - v));
}

static size_t on_header(char *line, size_t size, size_t nmemb, void *arg)
{
    xfer *x = arg;
    size_t n = size * nmemb;
    if (n >= 5 && strncmp(line, "HTTP/", 5) == 0) {
        dsec_free(x->www_auth);
        dsec_free(x->ctype);
        x->www_auth = x->ctype = NULL;
    } else if (x->www_auth == NULL &&
               (x->www_auth = header_value(line, n, "www-authenticate:")) != NULL) {
    } else if (x->ctype == NULL) {
        x->ctype = header_value(line, n, "content-type:");
    }
    return n;
}

/* The printable start of an error body, for messages. */
static const char *snippet(xfer *x)
{
    for (size_t i = 0; i < x->errlen; i++)
        if (!isprint((unsigned char)x->errbody[i]))
            x->errbody[i] = ' ';
    return x->errlen > 0 ? x->errbody : "(no body)";
}

static int curl_failed(puller *p, xfer *x, CURLcode rc, const char *what, dsec_err *err)
{
    const char *h = p->ref.host, *why = p->errbuf[0] ? p->errbuf : curl_easy_strerror(rc);
    switch (rc) {
    case CURLE_WRITE_ERROR:
        if (x->over)
            return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                                "registry %s sent more bytes than expected for %s", h, what);
        return dsec_err_set(err, x->werrno == ENOMEM ? DSEC_E_NOMEM : DSEC_E_IO, x->werrno,
                            "writing %s from registry %s", what, h);
    case CURLE_TOO_MANY_REDIRECTS:
        return dsec_err_set(err, DSEC_E_IO, 0,
                            "registry %s: a redirect loop fetching %s (more than %ld redirects)", h,
                            what, MAX_REDIRS);
    case CURLE_OPERATION_TIMEDOUT:
        if (strstr(why, "SSL") != NULL)
            return dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                                "TLS with registry %s: no handshake within %u s fetching %s (a "
                                "plain-HTTP registry needs --plain-http)",
                                h, p->timeout_s, what);
        return dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                            "registry %s stalled: nothing received for %u s fetching %s (%s)", h,
                            p->timeout_s, what, why);
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
        return dsec_err_set(err, DSEC_E_CONN, 0,
                            "TLS with registry %s failed fetching %s: %s (trust its CA with "
                            "--ca-file; plain HTTP needs --plain-http)",
                            h, what, why);
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
        return dsec_err_set(err, DSEC_E_CONN, 0, "cannot reach registry %s fetching %s: %s", h,
                            what, why);
    case CURLE_UNSUPPORTED_PROTOCOL:
        return dsec_err_set(err, DSEC_E_PERMISSION, 0,
                            "registry %s sent %s to a URL dsec will not follow: %s (plain HTTP "
                            "needs --plain-http)",
                            h, what, why);
    default:
        return dsec_err_set(err, DSEC_E_IO, 0, "registry %s, fetching %s: %s", h, what, why);
    }
}

/* GET url into x; *code is the final status. Transport failures fail here. */
static int http_get(puller *p, const char *url, const char *accept, const char *auth, xfer *x,
                    long *code, const char *what, dsec_err *err)
{
    struct curl_slist *hl = NULL, *t;
    char acc[512];
    if (accept != NULL) {
        snprintf(acc, sizeof acc, "Accept: %s", accept);
        if ((t = curl_slist_append(hl, acc)) == NULL)
            goto nomem;
        hl = t;
    }
    if (auth != NULL) {
        if ((t = curl_slist_append(hl, auth)) == NULL)
            goto nomem;
        hl = t;
    }
    xfer_reset(x);
    x->curl = p->curl;
    p->errbuf[0] = '\0';
    curl_easy_setopt(p->curl, CURLOPT_URL, url);
    curl_easy_setopt(p->curl, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(p->curl, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(p->curl, CURLOPT_HEADERDATA, x);
    CURLcode rc = curl_easy_perform(p->curl);
    curl_easy_setopt(p->curl, CURLOPT_HTTPHEADER, NULL);
    curl_slist_free_all(hl);
    if (rc == CURLE_OK && x->werrno != 0)
        rc = CURLE_WRITE_ERROR;
    if (rc != CURLE_OK)
        return curl_failed(p, x, rc, what, err);
    curl_easy_getinfo(p->curl, CURLINFO_RESPONSE_CODE, code);
    return 0;
nomem:
    curl_slist_free_all(hl);
    return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static int puller_init(puller *p, const char *ref, const dsec_image_pull_opts *o, dsec_err *err)
{
    memset(p, 0, sizeof *p);
    p->o = o;
    p->timeout_s = o->timeout_s ? o->timeout_s : 60;
    if (pull_ref_parse(ref, &p->ref, err) < 0)
        return -1;
    if (strcmp(p->ref.host, "docker.io") == 0)
        p->base = dsec__layer_path("https://registry-1.docker.io/v2/%s", p->ref.path);
    else
        p->base = dsec__layer_path("%s://%s/v2/%s", o->plain_http ? "http" : "https", p->ref.host,
                                   p->ref.path);
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK)
        return dsec_err_set(err, DSEC_E_INTERNAL, 0, "libcurl: %s",
                            curl_easy_strerror(curl_init_rc));
    if (p->base == NULL || (p->curl = curl_easy_init()) == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    if (find_credentials(o, p->ref.host, &p->user, &p->pass, err) < 0)
        return -1;
    const char *protos = o->plain_http ? "http,https" : "https";
    CURL *c = p->curl;
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, protos);
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, protos);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, MAX_REDIRS);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)p->timeout_s);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, (long)p->timeout_s);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "dsec-image-pull");
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, p->errbuf);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    if (o->ca_file != NULL)
        curl_easy_setopt(c, CURLOPT_CAINFO, o->ca_file);
    return 0;
}

static void puller_done(puller *p)
{
    if (p->curl != NULL)
        curl_easy_cleanup(p->curl);
    pull_ref_free(&p->ref);
    dsec_free(p->base);
    dsec_free(p->user);
    if (p->pass != NULL)
        explicit_bzero(p->pass, strlen(p->pass));
    dsec_free(p->pass);
    dsec_free(p->auth);
}

/* ---- authentication ------------------------------------------------------------------ */

/* The value of param key in a WWW-Authenticate challenge (quoted or not); dsec_malloc'd or NULL. */
static char *challenge_param(const char *ch, const char *key)
{
    const char *s = ch + strcspn(ch, " "); /* past the scheme */
    size_t k = strlen(key);
    while (*s) {
        while (*s == ' ' || *s == ',')
            s++;
        const char *eq = strchr(s, '=');
        if (eq == NULL)
            return NULL;
        bool hit = (size_t)(eq - s) == k && strncasecmp(s, key, k) == 0;
        const char *v = eq + 1, *e;
        if (*v == '"') {
            v++;
            for (e = v; *e && *e != '"'; e++)
                if (*e == '\\' && e[1])
                    e++;
            s = *e ? e + 1 : e;
        } else {
            e = v + strcspn(v, ",");
            s = e;
        }
        if (hit)
            return dsec_strndup(v, (size_t)(e - v));
    }
    return NULL;
}

static char *basic_header(const puller *p)
{
    char *up DSEC_AUTOFREE = dsec__layer_path("%s:%s", p->user, p->pass);
    char *enc DSEC_AUTOFREE = up != NULL ? b64_encode(up, strlen(up)) : NULL;
    if (up != NULL)
        explicit_bzero(up, strlen(up));
    return enc != NULL ? dsec__layer_path("Authorization: Basic %s", enc) : NULL;
}

static int fetch_token(puller *p, const char *ch, dsec_err *err)
{
    char *realm DSEC_AUTOFREE = challenge_param(ch, "realm");
    char *service DSEC_AUTOFREE = challenge_param(ch, "service");
    char *scope DSEC_AUTOFREE = challenge_param(ch, "scope");
    if (realm == NULL)
        return dsec_err_set(err, DSEC_E_DECODE, 0,
                            "registry %s: a Bearer challenge without a realm: %s", p->ref.host, ch);
    char *dflt DSEC_AUTOFREE = dsec__layer_path("repository:%s:pull", p->ref.path);
    char *es = curl_easy_escape(p->curl, service ? service : "", 0);
    char *ec = curl_easy_escape(p->curl, scope ? scope : dflt ? dflt : "", 0);
    char *url DSEC_AUTOFREE = es && ec ? dsec__layer_path("%s%cservice=%s&scope=%s", realm,
                                                          strchr(realm, '?') ? '&' : '?', es, ec)
                                       : NULL;
    curl_free(es);
    curl_free(ec);
    char *basic DSEC_AUTOFREE = p->user != NULL ? basic_header(p) : NULL;
    if (url == NULL || (p->user != NULL && basic == NULL))
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    xfer x = {.fd = -1, .max = 1u << 20};
    long code = 0;
    char what[512];
    snprintf(what, sizeof what, "a token for %s from %s", p->ref.path, realm);
    int rc = http_get(p, url, "application/json", basic, &x, &code, what, err);
    if (rc == 0 && code != 200)
        rc = dsec_err_set(err, code == 401 || code == 403 ? DSEC_E_PERMISSION : DSEC_E_IO, 0,
                          "token service %s %s for %s: %ld %s", realm,
                          p->user ? "refused the credentials" : "refused anonymous access",
                          p->ref.path, code, snippet(&x));
    dsec_json *doc = NULL;
    if (rc == 0)
        rc = pj_parse(x.buf ? x.buf : "", x.len, "the token service's answer", &doc, err);
    const char *tok = rc == 0 ? dsec_json_get_str(doc, "token") : NULL;
    if (rc == 0 && (tok == NULL || *tok == '\0'))
        tok = dsec_json_get_str(doc, "access_token");
    if (rc == 0 && (tok == NULL || *tok == '\0'))
        rc =
            dsec_err_set(err, DSEC_E_DECODE, 0, "token service %s answered without a token", realm);
    if (rc == 0) {
        dsec_free(p->auth);
        if ((p->auth = dsec__layer_path("Authorization: Bearer %s", tok)) == NULL)
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    dsec_json_free(doc);
    xfer_done(&x);
    return rc;
}

/* Answer a 401's challenge: set p->auth for the retry. */
static int authorize(puller *p, const char *ch, dsec_err *err)
{
    if (ch == NULL)
        return dsec_err_set(err, DSEC_E_PERMISSION, 0,
                            "registry %s answered 401 for %s without a WWW-Authenticate challenge",
                            p->ref.host, p->ref.path);
    if (strncasecmp(ch, "Bearer ", 7) == 0)
        return fetch_token(p, ch, err);
    if (strncasecmp(ch, "Basic", 5) != 0)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "registry %s asks for an authentication scheme dsec does not speak: %s",
                            p->ref.host, ch);
    if (p->user == NULL)
        return dsec_err_set(err, DSEC_E_PERMISSION, 0,
                            "registry %s wants credentials for %s: give --user and "
                            "--password-stdin, or an auth file",
                            p->ref.host, p->ref.path);
    dsec_free(p->auth);
    p->auth = basic_header(p);
    return p->auth != NULL ? 0 : dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
}

/* http_get with the registry's auth: a 401 is answered once, a second one is a refusal. */
static int reg_get(puller *p, const char *url, const char *accept, xfer *x, long *code,
                   const char *what, dsec_err *err)
{
    for (int attempt = 0;; attempt++) {
        if (http_get(p, url, accept, p->auth, x, code, what, err) < 0)
            return -1;
        if (*code != 401)
            return 0;
        if (attempt == 1)
            return dsec_err_set(
                err, DSEC_E_PERMISSION, 0, "registry %s refused the %s for %s: 401 %s", p->ref.host,
                p->user ? "credentials" : "anonymous access", p->ref.path, snippet(x));
        char *ch DSEC_AUTOFREE = x->www_auth ? dsec_strdup(x->www_auth) : NULL;
        if (authorize(p, ch, err) < 0)
            return -1;
    }
}

/* A status other than 200: 404 names what is missing, the rest quote the registry. */
static int status_error(puller *p, long code, xfer *x, const char *what, dsec_err *err)
{
    if (code == 404)
        return dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "registry %s has no %s (404 %s)", p->ref.host,
                            what, snippet(x));
    if (code == 403)
        return dsec_err_set(err, DSEC_E_PERMISSION, 0, "registry %s forbids %s (403 %s)",
                            p->ref.host, what, snippet(x));
    return dsec_err_set(err, DSEC_E_IO, 0, "registry %s answered %ld for %s: %s", p->ref.host, code,
                        what, snippet(x));
}

/* ---- manifests and blobs ------------------------------------------------------------- */

typedef struct manifest {
    char *body;
    size_t len;
    const char *mtype; /* one of the MT_ constants */
    dsec_digest digest;
    dsec_json *doc;
} manifest;

static void manifest_done(manifest *m)
{
    dsec_free(m->body);
    dsec_json_free(m->doc);
    memset(m, 0, sizeof *m);
}

static const char *known_manifest_type(const char *t)
{
    static const char *const known[] = {MT_OCI_INDEX, MT_OCI_MANIFEST, MT_DOCKER_LIST,
                                        MT_DOCKER_V2};
    for (size_t i = 0; t != NULL && i < sizeof known / sizeof known[0]; i++)
        if (strcmp(t, known[i]) == 0)
            return known[i];
    return NULL;
}

static bool is_index(const manifest *m)
{
    return strcmp(m->mtype, MT_OCI_INDEX) == 0 || strcmp(m->mtype, MT_DOCKER_LIST) == 0;
}

/* The manifest's media type: the Content-Type, else its mediaType field, else its shape. */
static int manifest_type(manifest *m, const char *ctype, const char *what, dsec_err *err)
{
    char ct[256] = "";
    if (ctype != NULL)
        snprintf(ct, sizeof ct, "%.*s", (int)strcspn(ctype, "; "), ctype);
    const char *field = dsec_json_get_str(m->doc, "mediaType");
    m->mtype = known_manifest_type(ct);
    if (m->mtype == NULL && (ct[0] == '\0' || strcmp(ct, "application/json") == 0)) {
        m->mtype = known_manifest_type(field);
        if (m->mtype == NULL && field == NULL)
            m->mtype = dsec_json_get(m->doc, "manifests") ? MT_OCI_INDEX
                       : dsec_json_get(m->doc, "layers")  ? MT_OCI_MANIFEST
                                                          : NULL;
    }
    if (m->mtype == NULL)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "%s has media type %s, which dsec does not pull (expected an OCI or "
                            "Docker schema 2 manifest or index)",
                            what,
                            ct[0]   ? ct
                            : field ? field
                                    : "(none)");
    return 0;
}

/* GET manifests/REF (a tag or a digest, checked when it is one). */
static int get_manifest(puller *p, const char *ref, manifest *m, dsec_err *err)
{
    char *url DSEC_AUTOFREE = dsec__layer_path("%s/manifests/%s", p->base, ref);
    char what[512];
    snprintf(what, sizeof what, "manifest %s%c%s", p->ref.path, strchr(ref, ':') ? '@' : ':', ref);
    if (url == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    xfer x = {.fd = -1, .max = MANIFEST_MAX};
    long code = 0;
    int rc =
        reg_get(p, url, MT_OCI_INDEX ", " MT_OCI_MANIFEST ", " MT_DOCKER_LIST ", " MT_DOCKER_V2, &x,
                &code, what, err);
    if (rc == 0 && code != 200)
        rc = status_error(p, code, &x, what, err);
    if (rc == 0) {
        m->body = x.buf;
        m->len = x.len;
        x.buf = NULL;
        uint8_t raw[DSEC_SHA256_LEN];
        dsec_sha256 c;
        dsec_sha256_init(&c);
        dsec_sha256_update(&c, m->body ? m->body : "", m->len);
        dsec_sha256_final(&c, raw);
        dsec_digest_from_raw(raw, m->digest);
        if (dsec_digest_valid(ref) && strcmp(ref, m->digest) != 0)
            rc = dsec_err_set(err, DSEC_E_DECODE, 0,
                              "registry %s sent %s that does not match its digest (got %s)",
                              p->ref.host, what, m->digest);
    }
    if (rc == 0)
        rc = pj_parse(m->body ? m->body : "", m->len, what, &m->doc, err);
    if (rc == 0)
        rc = manifest_type(m, x.ctype, what, err);
    xfer_done(&x);
    if (rc < 0)
        manifest_done(m);
    return rc;
}

/* An index resolved to platform ("os/arch[/variant]"): *m becomes that image's manifest. */
static int resolve_index(puller *p, const char *platform, manifest *m, dsec_err *err)
{
    char want[128];
    snprintf(want, sizeof want, "%s", platform);
    char *arch = strchr(want, '/'), *variant = NULL;
    if (arch == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "platform %s: expected OS/ARCH[/VARIANT]",
                            platform);
    *arch++ = '\0';
    if ((variant = strchr(arch, '/')) != NULL)
        *variant++ = '\0';
    const dsec_json *list = dsec_json_get(m->doc, "manifests");
    char offered[512] = "";
    size_t used = 0;
    const char *pick = NULL;
    for (size_t i = 0; list != NULL && list->type == DSEC_JSON_ARRAY && i < list->len; i++) {
        const dsec_json *pl = dsec_json_get(list->items[i], "platform");
        const char *os = dsec_json_get_str(pl, "os"), *ar = dsec_json_get_str(pl, "architecture");
        const char *va = dsec_json_get_str(pl, "variant");
        if (os == NULL || ar == NULL)
            continue;
        if (strcmp(os, want) == 0 && strcmp(ar, arch) == 0 &&
            (variant == NULL || (va != NULL && strcmp(va, variant) == 0))) {
            pick = dsec_json_get_str(list->items[i], "digest");
            break;
        }
        if (used < sizeof offered)
            used += (size_t)snprintf(offered + used, sizeof offered - used, "%s%s/%s%s%s",
                                     used ? ", " : "", os, ar, va ? "/" : "", va ? va : "");
    }
    if (pick == NULL)
        return dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "image %s/%s has no %s image; it offers: %s",
                            p->ref.host, p->ref.path, platform, used ? offered : "(no platforms)");
    if (!dsec_digest_valid(pick))
        return dsec_err_set(
            err, DSEC_E_UNSUPPORTED, 0,
            "image %s/%s: the %s entry of its index has digest %s (dsec takes sha256 only)",
            p->ref.host, p->ref.path, platform, pick);
    manifest one = {0};
    if (get_manifest(p, pick, &one, err) < 0)
        return -1;
    if (is_index(&one)) {
        manifest_done(&one);
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "image %s/%s: the %s entry of its index is itself an index",
                            p->ref.host, p->ref.path, platform);
    }
    manifest_done(m);
    *m = one;
    return 0;
}

/* A blob descriptor: a sha256 digest and a size. */
static int descriptor(puller *p, const dsec_json *d, const char *what, const char **digest,
                      uint64_t *size, dsec_err *err)
{
    *digest = dsec_json_get_str(d, "digest");
    *size = 0;
    int64_t v = dsec_json_get_uint(d, "size");
    if (*digest == NULL || !dsec_digest_valid(*digest) || v < 0)
        return dsec_err_set(err, DSEC_E_DECODE, 0,
                            "image %s/%s: the manifest's %s needs a sha256 digest and a size",
                            p->ref.host, p->ref.path, what);
    *size = (uint64_t)v;
    return 0;
}

static bool known_blob_type(const char *t, bool config)
{
    static const char *const configs[] = {"application/vnd.oci.image.config.v1+json",
                                          "application/vnd.docker.container.image.v1+json"};
    static const char *const layers[] = {
        "application/vnd.oci.image.layer.v1.tar",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.oci.image.layer.v1.tar+zstd",
        "application/vnd.oci.image.layer.nondistributable.v1.tar",
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
        "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
        "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
    };
    const char *const *v = config ? configs : layers;
    size_t n = config ? 2 : sizeof layers / sizeof layers[0];
    for (size_t i = 0; t != NULL && i < n; i++)
        if (strcmp(t, v[i]) == 0)
            return true;
    return false;
}

/* GET blobs/DIGEST into dir/blobs/sha256/HEX, hashed as it streams. */
static int get_blob(puller *p, const char *dir, const char *digest, uint64_t size, const char *what,
                    dsec_err *err)
{
    char *file DSEC_AUTOFREE = dsec__layer_path("%s/blobs/sha256/%s", dir, digest + 7);
    char *url DSEC_AUTOFREE = dsec__layer_path("%s/blobs/%s", p->base, digest);
    if (file == NULL || url == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    int fd = open(file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST)
        return 0; /* the same blob twice in one image */
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "creating %s", file);
    char full[512];
    snprintf(full, sizeof full, "%s %s of %s", what, digest, p->ref.path);
    xfer x = {.fd = fd, .limit = size};
    long code = 0;
    int rc = reg_get(p, url, NULL, &x, &code, full, err);
    if (rc == 0 && code != 200)
        rc = status_error(p, code, &x, full, err);
    if (rc == 0 && x.bytes != size)
        rc =
            dsec_err_set(err, DSEC_E_DECODE, 0, "registry %s sent %llu bytes of %s, which has %llu",
                         p->ref.host, (unsigned long long)x.bytes, full, (unsigned long long)size);
    if (rc == 0) {
        uint8_t raw[DSEC_SHA256_LEN];
        dsec_digest got;
        dsec_sha256_final(&x.sha, raw);
        dsec_digest_from_raw(raw, got);
        if (strcmp(got, digest) != 0)
            rc = dsec_err_set(err, DSEC_E_DECODE, 0,
                              "registry %s sent %s that does not match its digest (got %s)",
                              p->ref.host, full, got);
    }
    close(fd); /* no fsync: the layout is scratch, read back at once */
    xfer_done(&x);
    return rc;
}

/* ---- the layout ---------------------------------------------------------------------- */

#define progress(o, ...) dsec__image_progress(&(o)->import, __VA_ARGS__)

/* Which of the config's layers (rootfs.diff_ids, in order) held[] marks as already a dsec
 * layer of r in the import's format: those are not fetched (the import reuses them by their
 * diff_id and never reads their blob). held[] has nlayers entries. */
static int find_held(puller *p, dsec_layer_registry *r, const char *dir, const char *config,
                     size_t nlayers, bool *held, size_t *nheld, dsec_err *err)
{
    *nheld = 0;
    char *file DSEC_AUTOFREE = dsec__layer_path("%s/blobs/sha256/%s", dir, config + 7);
    char *text = NULL;
    size_t len = 0;
    if (file == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    if (dsec_read_file(file, 1u << 22, &text, &len, err) < 0)
        return -1;
    dsec_json *cfg = NULL;
    int rc = pj_parse(text, len, "image config", &cfg, err);
    dsec_free(text);
    if (rc < 0)
        return -1;
    const dsec_json *ids = dsec_json_get_array(dsec_json_get_object(cfg, "rootfs"), "diff_ids");
    dsec_layer_info *have = NULL;
    size_t nhave = 0;
    dsec_layer_format fmt = p->o->import.format != 0 ? p->o->import.format : DSEC_LAYER_EROFS;
    /* a config whose diff_ids do not match the layers is the import's to refuse */
    if (ids != NULL && ids->len == nlayers &&
        (rc = dsec_layer_registry_list(r, &have, &nhave, err)) == 0)
        for (size_t i = 0; rc == 0 && i < nlayers; i++) {
            const char *id = ids->items[i]->type == DSEC_JSON_STRING ? ids->items[i]->str : NULL;
            dsec_digest layer;
            uint64_t size;
            rc = id != NULL && dsec_digest_valid(id)
                     ? dsec__image_diffid_held(r, have, nhave, id, fmt, layer, &size, err)
                     : 0;
            if (rc == 1) {
                held[i] = true;
                (*nheld)++;
                rc = 0;
            }
        }
    dsec_layer_infos_free(have, nhave);
    dsec_json_free(cfg);
    return rc < 0 ? -1 : 0;
}

/* The config and every layer of the image manifest m (with r: those r does not hold yet). */
static int get_blobs(puller *p, const manifest *m, const char *dir, dsec_layer_registry *r,
                     dsec_err *err)
{
    const dsec_json *cfg = dsec_json_get(m->doc, "config"),
                    *layers = dsec_json_get(m->doc, "layers");
    const char *digest, *mt = dsec_json_get_str(cfg, "mediaType");
    uint64_t size;
    if (descriptor(p, cfg, "config", &digest, &size, err) < 0)
        return -1;
    if (!known_blob_type(mt, true))
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "image %s/%s: config media type %s is not a container image's",
                            p->ref.host, p->ref.path, mt ? mt : "(none)");
    if (layers == NULL || layers->type != DSEC_JSON_ARRAY)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "image %s/%s: its manifest has no layers list",
                            p->ref.host, p->ref.path);
    if (get_blob(p, dir, digest, size, "config", err) < 0)
        return -1;
    bool *held DSEC_AUTOFREE = dsec_calloc(layers->len + 1, sizeof *held);
    size_t nheld = 0;
    if (held == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    if (r != NULL && find_held(p, r, dir, digest, layers->len, held, &nheld, err) < 0)
        return dsec_err_wrap(err, "image %s/%s", p->ref.host, p->ref.path);
    for (size_t i = 0; i < layers->len; i++) {
        char what[64];
        snprintf(what, sizeof what, "layer %zu/%zu", i + 1, layers->len);
        mt = dsec_json_get_str(layers->items[i], "mediaType");
        if (descriptor(p, layers->items[i], what, &digest, &size, err) < 0)
            return -1;
        if (!known_blob_type(mt, false))
            return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                                "image %s/%s: %s has media type %s, which dsec does not import",
                                p->ref.host, p->ref.path, what, mt ? mt : "(none)");
        if (held[i]) {
            progress(p->o, "%s %s not fetched: already a layer of the registry", what, digest);
            continue;
        }
        if (get_blob(p, dir, digest, size, "layer", err) < 0)
            return -1;
        progress(p->o, "%s %s fetched (%llu bytes)", what, digest, (unsigned long long)size);
    }
    return 0;
}

static int write_layout(puller *p, const manifest *m, const char *dir, dsec_err *err)
{
    char *mf DSEC_AUTOFREE = dsec__layer_path("%s/blobs/sha256/%s", dir, m->digest + 7);
    char *lay DSEC_AUTOFREE = dsec__layer_path("%s/oci-layout", dir);
    char *idx DSEC_AUTOFREE = dsec__layer_path("%s/index.json", dir);
    char *ann DSEC_AUTOFREE =
        p->ref.tag
            ? dsec__layer_path(",\"annotations\":{\"org.opencontainers.image.ref.name\":\"%s\"}",
                               p->ref.tag)
            : dsec_strdup("");
    char *doc DSEC_AUTOFREE =
        ann ? dsec__layer_path(
                  "{\"schemaVersion\":2,\"mediaType\":\"%s\",\"manifests\":[{\"mediaType\":\"%s\","
                  "\"digest\":\"%s\",\"size\":%zu%s}]}\n",
                  MT_OCI_INDEX, m->mtype, m->digest, m->len, ann)
            : NULL;
    static const char layout[] = "{\"imageLayoutVersion\":\"1.0.0\"}\n";
    if (mf == NULL || lay == NULL || idx == NULL || doc == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    if (dsec__layer_write_atomic(mf, m->body, m->len, err) < 0 ||
        dsec__layer_write_atomic(lay, layout, sizeof layout - 1, err) < 0 ||
        dsec__layer_write_atomic(idx, doc, strlen(doc), err) < 0)
        return dsec_err_wrap(err, "writing the OCI layout in %s", dir);
    return 0;
}

int dsec__image_fetch_layout(const char *ref, const dsec_image_pull_opts *o, const char *dir,
                             char **norm_ref, dsec_err *err)
{
    return dsec__image_fetch_layout_for(ref, o, dir, NULL, norm_ref, err);
}

int dsec__image_fetch_layout_for(const char *ref, const dsec_image_pull_opts *o, const char *dir,
                                 dsec_layer_registry *held_in, char **norm_ref, dsec_err *err)
{
    if (ref == NULL || o == NULL || dir == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "image pull: ref, options and dir are required");
    puller p;
    manifest m = {0};
    char *blobs DSEC_AUTOFREE = dsec__layer_path("%s/blobs/sha256", dir);
    int rc = puller_init(&p, ref, o, err);
    if (rc == 0 && blobs == NULL)
        rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    if (rc == 0)
        rc = dsec__layer_mkdir_p(blobs, 0755, err);
    if (rc == 0)
        rc = get_manifest(&p, p.ref.digest ? p.ref.digest : p.ref.tag, &m, err);
    if (rc == 0 && is_index(&m))
        rc = resolve_index(&p, o->import.platform ? o->import.platform : "linux/amd64", &m, err);
    if (rc == 0) {
        progress(o, "manifest %s of %s/%s", m.digest, p.ref.host, p.ref.path);
        rc = get_blobs(&p, &m, dir, held_in, err);
    }
    if (rc == 0)
        rc = write_layout(&p, &m, dir, err);
    if (rc == 0 && norm_ref != NULL && (*norm_ref = pull_ref_normalize(&p.ref)) == NULL)
        rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    manifest_done(&m);
    puller_done(&p);
    return rc;
}

int dsec_image_pull(dsec_layer_registry *r, const char *ref, const dsec_image_pull_opts *o,
                    dsec_image_info **out, dsec_err *err)
{
    if (r == NULL || ref == NULL || o == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "image pull: registry, ref and options are required");
    const char *base = o->import.work_dir;
    if (base == NULL)
        base = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/var/tmp";
    if (dsec__layer_mkdir_p(base, 0700, err) < 0)
        return dsec_err_wrap(err, "image pull scratch space");
    dsec__layer_sweep_scratch(base, "dsec-pull-");
    char *dir DSEC_AUTOFREE = dsec__layer_path("%s/dsec-pull-%d.XXXXXX", base, (int)getpid());
    if (dir == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    if (mkdtemp(dir) == NULL)
        return dsec_err_set(err, DSEC_E_IO, errno, "creating a scratch directory in %s", base);
    char *norm DSEC_AUTOFREE = NULL;
    int rc = dsec__image_fetch_layout_for(ref, o, dir, r, &norm, err);
    if (rc == 0) {
        dsec_image_import_opts io = o->import;
        io.ref = norm;
        rc = dsec_image_import(r, dir, &io, out, err);
        if (rc < 0)
            dsec_err_wrap(err, "importing %s", norm);
    }
    dsec_err e2 = {0};
    if (dsec__layer_rm_rf(dir, &e2) < 0 && rc == 0)
        rc = dsec_err_set(err, e2.code, e2.errnum, "%s", e2.msg);
    return rc;
}
