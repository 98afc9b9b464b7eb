/* agent-client.c - the node side of the dsec-agent channel: connect, exec, kill, file and
 * background process calls. */
#define _GNU_SOURCE
#include "backends/agent/agent-client.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "backends/agent/agent-proto.h"
#include "backends/loop.h"
#include "dsec/alloc.h"

_Static_assert(DSEC_AGENT_FILE_MAX == DSEC__AGENT_FILE_MAX, "one file piece limit on both sides");
_Static_assert(DSEC_PROC_MAX == DSEC__AGENT_PROC_MAX &&
                   DSEC_PROC_RING_MAX == DSEC__AGENT_RING_MAX &&
                   DSEC_PROC_RING_DEFAULT == DSEC__AGENT_RING_DEFAULT,
               "one set of background process limits on both sides");
_Static_assert(sizeof(((dsec_proc_info *)0)->cmdline) == DSEC__AGENT_CMDLINE_MAX + 1,
               "a cmdline on the wire fits dsec_proc_info");
_Static_assert(DSEC_PROC_WAIT_MAX_MS == DSEC__AGENT_WAIT_MAX_MS,
               "one longest output wait on both sides");

/*
 * A connection is a non-blocking socket driven with poll, so every wait has a
 * deadline. When a call fails in the middle of an exchange (timeout, broken
 * frame, lost connection) the stream is out of step: the connection is then
 * closed and later calls fail with DSEC_E_CLOSED. An ERROR answer keeps it
 * usable.
 */

#define FILE_OP_TIMEOUT_MS                                                                         \
    60000u /* the agent answers file calls at once; this only catches a wedged one */
#define EXEC_GRACE_MS 30000u /* past the command's own timeout, which the agent enforces */
#define KILL_TIMEOUT_MS 5000u
#define SYNC_TIMEOUT_MS 2000u /* a SYNC swallowed by a half-received stale request: reconnect */

struct dsec_agent {
    int fd;    /* -1 once broken */
    bool busy; /* an exec started with dsec_agent_exec_start is in flight */
    uint32_t next_id;
    uint8_t *buf; /* received bytes: [off, len) not yet consumed */
    size_t off, len, cap;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* 0 means no deadline. */
static uint64_t deadline_after(uint64_t ms)
{
    return ms ? now_ms() + ms : 0;
}

static int wait_fd(int fd, short events, uint64_t deadline, dsec_err *err)
{
    for (;;) {
        int timeout = -1;
        if (deadline) {
            uint64_t now = now_ms();
            if (now >= deadline)
                return dsec_err_set(err, DSEC_E_TIMEOUT, 0, "no answer from the agent in time");
            timeout = deadline - now > 1000000 ? 1000000 : (int)(deadline - now);
        }
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, timeout);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return dsec_err_set(err, DSEC_E_IO, errno, "waiting for the agent: %s",
                                strerror(errno));
    }
}

static void mark_broken(dsec_agent *a)
{
    if (a->fd >= 0) {
        close(a->fd);
        a->fd = -1;
    }
}

static int check_open(dsec_agent *a, dsec_err *err)
{
    if (a == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "agent connection is NULL");
    if (a->fd < 0)
        return dsec_err_set(err, DSEC_E_CLOSED, 0,
                            "connection to the agent is broken by an earlier failure; reconnect");
    if (a->busy)
        return dsec_err_set(err, DSEC_E_STATE, 0,
                            "the agent connection is running a command; one call at a time");
    return 0;
}

static int send_all(dsec_agent *a, const uint8_t *p, size_t n, uint64_t deadline, dsec_err *err)
{
    while (n > 0) {
        ssize_t w = send(a->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            if (wait_fd(a->fd, POLLOUT, deadline, err) < 0)
                return -1;
            continue;
        }
        return dsec_err_set(err, DSEC_E_CLOSED, errno, "sending to the agent: %s", strerror(errno));
    }
    return 0;
}

/* Receive at least one byte into buf (at most len), waiting until deadline. Returns the count,
 * or -1 with err set (DSEC_E_CLOSED when the agent hung up or the socket failed). */
static ssize_t recv_some(dsec_agent *a, void *buf, size_t len, uint64_t deadline, dsec_err *err)
{
    for (;;) {
        ssize_t n = recv(a->fd, buf, len, 0);
        if (n > 0)
            return n;
        if (n == 0)
            return dsec_err_set(err, DSEC_E_CLOSED, 0, "the agent closed the connection");
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN)
            return dsec_err_set(err, DSEC_E_CLOSED, errno, "receiving from the agent: %s",
                                strerror(errno));
        if (wait_fd(a->fd, POLLIN, deadline, err) < 0)
            return -1;
    }
}

/* The next frame if the buffer holds all of it: 1, with payload valid until the next call
 * on a; 0 when more bytes are needed (the buffer then has room for them); -1 on a bad frame
 * or out of memory. */
static int next_frame(dsec_agent *a, uint8_t *type, uint32_t *id, const uint8_t **payload,
                      size_t *plen, dsec_err *err)
{
    size_t need = 4, have = a->len - a->off;
    if (have >= 4) {
        uint32_t flen = dsec__agent_get_u32le(a->buf + a->off);
        if (flen < 5 || flen > DSEC__AGENT_FRAME_MAX)
            return dsec_err_set(err, DSEC_E_DECODE, 0,
                                "agent sent a frame of %" PRIu32 " bytes (5..%u)", flen,
                                DSEC__AGENT_FRAME_MAX);
        need = 4 + (size_t)flen;
        if (have >= need) {
            const uint8_t *f = a->buf + a->off;
            *type = f[4];
            *id = dsec__agent_get_u32le(f + 5);
            *payload = f + DSEC__AGENT_HDR;
            *plen = flen - 5;
            a->off += need;
            return 1;
        }
    }
    /* Make room for the rest of the frame (and a read-ahead). */
    if (a->off > 0) {
        memmove(a->buf, a->buf + a->off, have);
        a->len = have;
        a->off = 0;
    }
    size_t want = need > 65536 ? need : 65536;
    if (a->cap < want) {
        uint8_t *nb = dsec_realloc(a->buf, want);
        if (nb == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "receive buffer of %zu bytes", want);
        a->buf = nb;
        a->cap = want;
    }
    return 0;
}

/* The next frame, waiting for it until deadline. payload stays valid until the next call on a. */
static int recv_frame(dsec_agent *a, uint64_t deadline, uint8_t *type, uint32_t *id,
                      const uint8_t **payload, size_t *plen, dsec_err *err)
{
    for (;;) {
        int r = next_frame(a, type, id, payload, plen, err);
        if (r != 0)
            return r < 0 ? -1 : 0;
        ssize_t n = recv_some(a, a->buf + a->len, a->cap - a->len, deadline, err);
        if (n < 0)
            return -1;
        a->len += (size_t)n;
    }
}

/* Turn an ERROR frame into err. */
static int error_frame(const uint8_t *payload, size_t plen, dsec_err *err)
{
    dsec__agent_rd r = {.p = payload, .end = payload + plen};
    uint32_t kind = dsec__agent_get_u32(&r);
    int errnum = (int)dsec__agent_get_u32(&r);
    size_t ml;
    const uint8_t *msg = dsec__agent_get_bytes(&r, 4096, &ml);
    if (r.bad)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "agent sent a malformed error frame");
    int code;
    switch (kind) {
    case DSEC__AGENT_ERR_IO:
        switch (errnum) {
        case ENOENT:
            code = DSEC_E_NOT_FOUND;
            break;
        case EEXIST:
            code = DSEC_E_EXISTS;
            break;
        case ENOTDIR:
        case EISDIR:
        case ENOTEMPTY:
        case EINVAL:
        case ENAMETOOLONG:
        case ELOOP:
            code = DSEC_E_INVALID;
            break;
        case EFBIG:
        case E2BIG:
        case ENOSPC:
        case EDQUOT:
            code = DSEC_E_TOO_LARGE;
            break;
        case EACCES:
        case EPERM:
        case EROFS:
            code = DSEC_E_PERMISSION;
            break;
        case ENOMEM:
            code = DSEC_E_NOMEM;
            break;
        default:
            code = DSEC_E_IO;
        }
        break;
    case DSEC__AGENT_ERR_BAD_FRAME:
        code = DSEC_E_DECODE;
        break;
    case DSEC__AGENT_ERR_TOO_LARGE:
        code = DSEC_E_TOO_LARGE;
        break;
    case DSEC__AGENT_ERR_INVALID:
        code = DSEC_E_INVALID;
        break;
    case DSEC__AGENT_ERR_UNSUPPORTED:
        code = DSEC_E_UNSUPPORTED;
        break;
    case DSEC__AGENT_ERR_NOT_FOUND:
        code = DSEC_E_NOT_FOUND;
        break;
    case DSEC__AGENT_ERR_STATE:
        code = DSEC_E_STATE;
        break;
    default:
        code = DSEC_E_BACKEND;
    }
    if (ml == 0)
        return dsec_err_set(err, code, errnum, "agent error %" PRIu32 " (%s)", kind,
                            errnum ? strerror(errnum) : "no detail");
    return dsec_err_set(err, code, errnum, "%.*s", (int)ml, (const char *)msg);
}

/* Send a request frame and read its one answer, which must be of type want (or an ERROR).
 * On an error that leaves the stream out of step the connection is closed. */
static int roundtrip(dsec_agent *a, uint8_t *frame, size_t flen, uint8_t want,
                     const uint8_t **payload, size_t *plen, dsec_err *err)
{
    uint64_t deadline = deadline_after(FILE_OP_TIMEOUT_MS);
    uint32_t id = dsec__agent_get_u32le(frame + 5);
    uint8_t type = 0;
    uint32_t rid = 0;
    if (send_all(a, frame, flen, deadline, err) < 0 ||
        recv_frame(a, deadline, &type, &rid, payload, plen, err) < 0)
        goto broken;
    if (rid != id) {
        dsec_err_set(err, DSEC_E_DECODE, 0,
                     "agent answered request %" PRIu32 " instead of %" PRIu32, rid, id);
        goto broken;
    }
    if (type == DSEC__AGENT_T_ERROR)
        return error_frame(*payload, *plen, err);
    if (type != want) {
        dsec_err_set(err, DSEC_E_DECODE, 0, "agent answered with frame type %u, expected %u", type,
                     want);
        goto broken;
    }
    return 0;
broken:
    mark_broken(a);
    return -1;
}

/* A request frame of payload_len bytes; the caller fills the payload after the header. */
static uint8_t *new_frame(dsec_agent *a, uint8_t type, size_t payload_len, uint8_t **payload,
                          dsec_err *err)
{
    if (payload_len + 5 > DSEC__AGENT_FRAME_MAX) {
        dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "request of %zu bytes exceeds the agent's %u",
                     payload_len, DSEC__AGENT_FRAME_MAX);
        return NULL;
    }
    uint8_t *f = dsec_malloc(DSEC__AGENT_HDR + payload_len);
    if (f == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "request of %zu bytes", payload_len);
        return NULL;
    }
    uint32_t id = ++a->next_id;
    if (id == 0)
        id = ++a->next_id; /* 0 is the agent's "no request" */
    *payload = dsec__agent_put_hdr(f, type, id, payload_len);
    return f;
}

/* ---- connecting -------------------------------------------------------------------------------
 */

/* One connect attempt; returns the fd, or -1 with errno. A path longer than sun_path
 * goes through a descriptor of its directory. */
static int connect_once(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int dfd = -1;
    if (strlen(path) < sizeof sa.sun_path) {
        memcpy(sa.sun_path, path, strlen(path) + 1);
    } else {
        const char *slash = strrchr(path, '/');
        char dir[4096];
        if (slash == NULL || (size_t)(slash - path) >= sizeof dir) {
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = 0;
        dfd = open(slash == path ? "/" : dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
            return -1;
        if ((size_t)snprintf(sa.sun_path, sizeof sa.sun_path, "/proc/self/fd/%d/%s", dfd,
                             slash + 1) >= sizeof sa.sun_path) {
            close(dfd);
            errno = ENAMETOOLONG;
            return -1;
        }
    }
    /* non-blocking from the start: a blocking connect to an agent that does not accept (its
     * sandbox frozen, its backlog full) would wait for ever; this one fails with EAGAIN, and
     * the caller retries until its deadline */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0)
        dsec__agent_sndbuf(fd);
    int rc = fd < 0 ? -1 : connect(fd, (struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    if (dfd >= 0)
        close(dfd);
    if (rc < 0) {
        if (fd >= 0)
            close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* Start a fresh exchange on a just-connected a: send SYNC with a random nonce and discard every
 * byte until the HELLO that carries the latest one. On a virtio-serial port the bytes before it may be
 * what the agent still had queued for an earlier client, even half a frame, so they are
 * scanned as raw bytes, never parsed. An agent older than SYNC answers it with an
 * "unsupported" ERROR carrying the nonce; it only ever served sockets, where a connection is
 * fresh by construction, so that answer is as good. Fails with DSEC_E_TIMEOUT (reconnect),
 * DSEC_E_CLOSED or DSEC_E_UNSUPPORTED (protocol version). */
static int sync_hello(dsec_agent *a, const char *path, uint64_t deadline, dsec_err *err)
{
    uint8_t tag[5] = {DSEC__AGENT_T_HELLO}, etag[5] = {DSEC__AGENT_T_ERROR};
    /* the greeting an agent sends on its own when a client arrives (id 0) */
    static const uint8_t greet[9] = {13, 0, 0, 0, DSEC__AGENT_T_HELLO, 0, 0, 0, 0};
    uint8_t win[65536 + 32];
    size_t have = 0;
    bool resync = true;
    for (;;) {
        /* A SYNC with a fresh nonce: first, and again whenever the agent greets on its own. A
         * greeting means it has just started serving this channel, and an agent starting on a
         * virtio-serial port discards what was sent before, our SYNC included. Answers to
         * earlier SYNCs come before the latest one's and are skipped like any stale byte. */
        if (resync) {
            uint32_t nonce = 0;
            while (nonce == 0)
                if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
                    nonce = (uint32_t)now_ms() ^ (uint32_t)getpid() ^ 0x5a5a5a5au;
            uint8_t sync[DSEC__AGENT_HDR];
            dsec__agent_put_hdr(sync, DSEC__AGENT_T_SYNC, nonce, 0);
            if (send_all(a, sync, sizeof sync, deadline, err) < 0)
                return -1;
            dsec__agent_put_u32(tag + 1, nonce);
            dsec__agent_put_u32(etag + 1, nonce);
            resync = false;
        }
        /* a hit at i means a frame starts at i - 4 */
        for (size_t i = 4; i + 5 <= have; i++) {
            uint32_t flen = dsec__agent_get_u32le(win + i - 4);
            if (i + 9 <= have && memcmp(win + i - 4, greet, sizeof greet) == 0) {
                /* drop everything up to it, so it is not seen again */
                size_t used = i + 13 <= have ? i + 13 : i + 5;
                memmove(win, win + used, have - used);
                have -= used;
                resync = true;
                break;
            }
            if (memcmp(win + i, tag, 5) == 0 && flen == 13 && i + 13 <= have) {
                uint32_t version = dsec__agent_get_u32le(win + i + 5);
                if (version != DSEC__AGENT_VERSION)
                    return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                                        "agent at %s speaks protocol %" PRIu32 ", this node %u",
                                        path, version, DSEC__AGENT_VERSION);
                return 0; /* nothing legitimate follows before our first request */
            }
            if (memcmp(win + i, etag, 5) == 0 && flen >= 13 && i + 9 <= have &&
                dsec__agent_get_u32le(win + i + 5) == DSEC__AGENT_ERR_UNSUPPORTED) {
                /* an agent without SYNC: drain the rest of its ERROR frame */
                size_t rest = (size_t)flen - 9; /* type, id and kind are in the window */
                size_t left = have - (i + 9);
                size_t take = left < rest ? left : rest;
                rest -= take;
                while (rest > 0) {
                    uint8_t junk[4096];
                    ssize_t n = recv_some(a, junk, rest < sizeof junk ? rest : sizeof junk,
                                          deadline, err);
                    if (n < 0)
                        return -1;
                    rest -= (size_t)n;
                }
                return 0;
            }
        }
        if (resync)
            continue;
        /* keep a tail that may hold the start of the HELLO */
        if (have > 16) {
            memmove(win, win + have - 16, 16);
            have = 16;
        }
        ssize_t n = recv_some(a, win + have, sizeof win - have, deadline, err);
        if (n < 0)
            return -1;
        have += (size_t)n;
    }
}

int dsec__agent_from_fd(dsec_agent **out, int fd, const char *name, uint64_t timeout_ms,
                        dsec_err *err)
{
    *out = NULL;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        int e = errno;
        close(fd);
        return dsec_err_set(err, DSEC_E_IO, e, "agent connection %s: %s", name, strerror(e));
    }
    dsec_agent *a = dsec_calloc(1, sizeof *a);
    if (a == NULL) {
        close(fd);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "agent connection");
    }
    a->fd = fd;
    if (sync_hello(a, name, now_ms() + timeout_ms, err) < 0) {
        dsec_agent_free(a);
        return -1;
    }
    *out = a;
    return 0;
}

int dsec_agent_connect(dsec_agent **out, const char *path, uint64_t timeout_ms, dsec_err *err)
{
    if (out == NULL || path == NULL || path[0] == 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "agent socket path is missing");
    *out = NULL;
    uint64_t deadline = now_ms() + timeout_ms;
    uint64_t backoff = 1;
    int last = 0;
    dsec_err why = {0};
    for (;;) {
        int fd = connect_once(path);
        if (fd >= 0) {
            dsec_agent *a = dsec_calloc(1, sizeof *a);
            if (a == NULL) {
                close(fd);
                return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "agent connection");
            }
            a->fd = fd;
            /* Once the agent has answered our SYNC, it is serving this connection. */
            uint64_t now = now_ms();
            uint64_t until = now + SYNC_TIMEOUT_MS < deadline ? now + SYNC_TIMEOUT_MS : deadline;
            int rc = sync_hello(a, path, until > now ? until : now + 1, &why);
            if (rc == 0) {
                *out = a;
                return 0;
            }
            dsec_agent_free(a);
            if (why.code == DSEC_E_UNSUPPORTED) {
                *err = why;
                return -1;
            }
            /* closed or silent: an agent on its way up or down, or a SYNC lost in stale input */
            last = why.errnum;
        } else {
            last = errno;
            if (errno != ENOENT && errno != ECONNREFUSED && errno != EAGAIN && errno != ENOTDIR)
                return dsec_err_set(err, DSEC_E_CONN, errno, "connecting to the agent at %s: %s",
                                    path, strerror(errno));
        }
        uint64_t now = now_ms();
        if (now >= deadline)
            break;
        uint64_t nap = backoff < deadline - now ? backoff : deadline - now;
        struct timespec ts = {(time_t)(nap / 1000), (long)(nap % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        if (backoff < 100)
            backoff *= 2;
    }
    return dsec_err_set(err, DSEC_E_TIMEOUT, last,
                        "agent at %s did not answer within %" PRIu64 " ms%s%s", path, timeout_ms,
                        last ? ": " : "", last ? strerror(last) : "");
}

void dsec_agent_free(dsec_agent *a)
{
    if (a == NULL)
        return;
    mark_broken(a);
    dsec_free(a->buf);
    dsec_free(a);
}

bool dsec_agent_broken(const dsec_agent *a)
{
    return a == NULL || a->fd < 0;
}

/* ---- exec ------------------------------------------------------------------------------------ */

struct outbuf {
    uint8_t *data;
    size_t len, cap;
};

static int outbuf_add(struct outbuf *o, const uint8_t *p, size_t n, size_t max)
{
    if (o->len + n > max)
        n = max - o->len; /* the agent caps already; this only guards the buffer */
    if (n == 0)
        return 0;
    if (o->cap - o->len < n) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap - o->len < n)
            cap *= 2;
        if (cap > max)
            cap = max;
        uint8_t *nb = dsec_realloc(o->data, cap);
        if (nb == NULL)
            return -1;
        o->data = nb;
        o->cap = cap;
    }
    memcpy(o->data + o->len, p, n);
    o->len += n;
    return 0;
}

/* empty_ok: a shell session's start, whose argv may be empty (the default shell). */
static int check_exec_req(const dsec_exec_req *req, bool empty_ok, size_t *plen, dsec_err *err)
{
    if (req == NULL || ((req->argv == NULL || req->argc == 0) && !(empty_ok && req->argc == 0)))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec needs at least one argument");
    if (req->argc > DSEC__AGENT_ARGV_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "exec: %zu arguments, at most %u", req->argc,
                            DSEC__AGENT_ARGV_MAX);
    if (req->nenv > DSEC__AGENT_ENV_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "exec: %zu environment variables, at most %u",
                            req->nenv, DSEC__AGENT_ENV_MAX);
    if (req->nenv > 0 && req->env == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: env is NULL but nenv is %zu", req->nenv);
    if (req->stdin_len > DSEC__AGENT_STDIN_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "exec: stdin of %zu bytes, at most %u",
                            req->stdin_len, DSEC__AGENT_STDIN_MAX);
    if (req->stdin_len > 0 && req->stdin_data == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: stdin_data is NULL but stdin_len is %zu",
                            req->stdin_len);
    size_t n = 8 + 8 + 4 + 4 + 4 + 4 + 4 + req->stdin_len;
    size_t cl = req->cwd ? strlen(req->cwd) : 0, ul = req->user ? strlen(req->user) : 0;
    if (cl > DSEC__AGENT_PATH_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "exec: cwd longer than %u bytes",
                            DSEC__AGENT_PATH_MAX);
    if (ul > DSEC__AGENT_USER_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "exec: user longer than %u bytes",
                            DSEC__AGENT_USER_MAX);
    n += cl + ul;
    for (size_t i = 0; i < req->argc; i++) {
        if (req->argv[i] == NULL)
            return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: argument %zu is NULL", i);
        size_t l = strlen(req->argv[i]);
        if (l > DSEC__AGENT_ARG_LEN_MAX)
            return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                                "exec: argument %zu is %zu bytes long, at most %u", i, l,
                                DSEC__AGENT_ARG_LEN_MAX);
        n += 4 + l;
    }
    for (size_t i = 0; i < req->nenv; i++) {
        const char *k = req->env[i].key, *v = req->env[i].value;
        if (k == NULL || k[0] == 0 || strchr(k, '=') != NULL)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "exec: environment variable %zu has no name or one with '='", i);
        size_t kl = strlen(k), vl = v ? strlen(v) : 0;
        if (kl > DSEC__AGENT_ARG_LEN_MAX || vl > DSEC__AGENT_ARG_LEN_MAX)
            return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                                "exec: environment variable %s is longer than %u bytes", k,
                                DSEC__AGENT_ARG_LEN_MAX);
        n += 8 + kl + vl;
    }
    *plen = n;
    return 0;
}

static uint8_t *put_exec_body(uint8_t *p, const dsec_exec_req *req);

/* The EXEC request for req; *id is its request id. */
static uint8_t *exec_frame(dsec_agent *a, const dsec_exec_req *req, size_t out_max, size_t *flen,
                           uint32_t *id, dsec_err *err)
{
    size_t plen = 0;
    if (check_exec_req(req, false, &plen, err) < 0)
        return NULL;
    if (req->session)
        plen += 8;
    uint8_t *p;
    uint8_t *frame = new_frame(a, DSEC__AGENT_T_EXEC, plen, &p, err);
    if (frame == NULL)
        return NULL;
    p = dsec__agent_put_u64(p, req->timeout_ms);
    p = dsec__agent_put_u64(p, out_max);
    p = put_exec_body(p, req);
    if (req->session) /* only then: an agent of before sessions takes the frame as ever */
        p = dsec__agent_put_u64(p, req->session);
    *id = dsec__agent_get_u32le(frame + 5);
    *flen = (size_t)(p - frame);
    return frame;
}

/* The fields EXEC and PSTART share after timeout_ms (and EXEC's output_max): cwd to stdin. */
static uint8_t *put_exec_body(uint8_t *p, const dsec_exec_req *req)
{
    p = dsec__agent_put_bytes(p, req->cwd, req->cwd ? strlen(req->cwd) : 0);
    p = dsec__agent_put_bytes(p, req->user, req->user ? strlen(req->user) : 0);
    p = dsec__agent_put_u32(p, (uint32_t)req->argc);
    for (size_t i = 0; i < req->argc; i++)
        p = dsec__agent_put_bytes(p, req->argv[i], strlen(req->argv[i]));
    p = dsec__agent_put_u32(p, (uint32_t)req->nenv);
    for (size_t i = 0; i < req->nenv; i++) {
        const char *v = req->env[i].value ? req->env[i].value : "";
        p = dsec__agent_put_bytes(p, req->env[i].key, strlen(req->env[i].key));
        p = dsec__agent_put_bytes(p, v, strlen(v));
    }
    return dsec__agent_put_bytes(p, req->stdin_data, req->stdin_len);
}

/* What one exec has received so far. */
struct exec_state {
    uint32_t id;
    size_t out_max;
    struct outbuf out[3];
    dsec_agent_output_fn on_output;
    void *arg;
};

enum { EXEC_MORE = 0, EXEC_EXITED = 1, EXEC_REFUSED = 2, EXEC_BROKEN = -1 };

/* One frame of an exec's answer: EXEC_MORE (output, keep reading), EXEC_EXITED (*res is
 * filled and owns the output), EXEC_REFUSED (an ERROR answer: the connection is still in
 * step) or EXEC_BROKEN (the stream is out of step), err set for the last two. */
static int exec_frame_in(struct exec_state *x, uint8_t type, uint32_t rid, const uint8_t *pl,
                         size_t pn, dsec_exec_result *res, dsec_err *err)
{
    if (rid != x->id) {
        dsec_err_set(err, DSEC_E_DECODE, 0,
                     "agent answered request %" PRIu32 " while exec %" PRIu32 " ran", rid, x->id);
        return EXEC_BROKEN;
    }
    dsec__agent_rd r = {.p = pl, .end = pl + pn};
    if (type == DSEC__AGENT_T_OUTPUT) {
        uint8_t stream = dsec__agent_get_u8(&r);
        size_t dl;
        const uint8_t *d = dsec__agent_get_bytes(&r, DSEC__AGENT_FRAME_MAX, &dl);
        if (!dsec__agent_done(&r) || (stream != 1 && stream != 2)) {
            dsec_err_set(err, DSEC_E_DECODE, 0, "agent sent a malformed output frame");
            return EXEC_BROKEN;
        }
        if (x->on_output && dl > 0)
            x->on_output(x->arg, stream, d, dl);
        if (outbuf_add(&x->out[stream], d, dl, x->out_max) < 0) {
            dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "exec: buffering %zu bytes of output",
                         x->out[stream].len + dl);
            return EXEC_BROKEN;
        }
        return EXEC_MORE;
    }
    if (type == DSEC__AGENT_T_EXIT) {
        memset(res, 0, sizeof *res);
        res->exit_code = (int32_t)dsec__agent_get_u32(&r);
        res->signal = (int32_t)dsec__agent_get_u32(&r);
        uint8_t flags = dsec__agent_get_u8(&r);
        res->duration_us = dsec__agent_get_u64(&r);
        res->cpu_us = dsec__agent_get_u64(&r);
        res->peak_rss_kb = dsec__agent_get_u64(&r);
        if (!dsec__agent_done(&r)) {
            memset(res, 0, sizeof *res);
            dsec_err_set(err, DSEC_E_DECODE, 0, "agent sent a malformed exit frame");
            return EXEC_BROKEN;
        }
        res->timed_out = flags & DSEC__AGENT_X_TIMED_OUT;
        res->stdout_truncated = flags & DSEC__AGENT_X_STDOUT_TRUNC;
        res->stderr_truncated = flags & DSEC__AGENT_X_STDERR_TRUNC;
        res->interrupted = flags & DSEC__AGENT_X_INTERRUPTED;
        res->session_ended = flags & DSEC__AGENT_X_SESSION_ENDED;
        res->stdout_data = x->out[1].data;
        res->stdout_len = x->out[1].len;
        res->stderr_data = x->out[2].data;
        res->stderr_len = x->out[2].len;
        x->out[1] = x->out[2] = (struct outbuf){0};
        return EXEC_EXITED;
    }
    if (type == DSEC__AGENT_T_ERROR) {
        /* Refused before it started: nothing else comes for this request. */
        error_frame(pl, pn, err);
        return EXEC_REFUSED;
    }
    dsec_err_set(err, DSEC_E_DECODE, 0, "agent sent frame type %u during exec", type);
    return EXEC_BROKEN;
}

static void exec_state_release(struct exec_state *x)
{
    dsec_free(x->out[1].data);
    dsec_free(x->out[2].data);
    x->out[1] = x->out[2] = (struct outbuf){0};
}

int dsec_agent_exec(dsec_agent *a, const dsec_exec_req *req, dsec_agent_output_fn on_output,
                    void *arg, dsec_exec_result *res, dsec_err *err)
{
    if (res == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: result is NULL");
    memset(res, 0, sizeof *res);
    if (check_open(a, err) < 0)
        return -1;
    struct exec_state x = {.out_max = req && req->output_max ? req->output_max
                                                             : DSEC_EXEC_OUTPUT_DEFAULT,
                           .on_output = on_output,
                           .arg = arg};
    size_t flen;
    uint8_t *frame = exec_frame(a, req, x.out_max, &flen, &x.id, err);
    if (frame == NULL)
        return -1;
    /* The agent enforces the command's timeout; this deadline only catches a wedged agent. */
    uint64_t deadline = req->timeout_ms ? deadline_after(req->timeout_ms + EXEC_GRACE_MS) : 0;
    int rc = send_all(a, frame, flen, deadline, err);
    dsec_free(frame);
    int st = rc < 0 ? EXEC_BROKEN : EXEC_MORE;
    while (st == EXEC_MORE) {
        uint8_t type = 0;
        uint32_t rid = 0;
        const uint8_t *pl = NULL;
        size_t pn = 0;
        if (recv_frame(a, deadline, &type, &rid, &pl, &pn, err) < 0)
            st = EXEC_BROKEN;
        else
            st = exec_frame_in(&x, type, rid, pl, pn, res, err);
    }
    exec_state_release(&x);
    if (st == EXEC_EXITED)
        return 0;
    if (st == EXEC_BROKEN)
        mark_broken(a);
    return -1;
}

/* ---- calls without a thread: the same exchanges, driven by the node's loop --------------- */

/* One exchange on the loop: the request goes out as the socket takes it, then the answer's
 * frames are read as they come and handed to frame_in until it says how the exchange ended.
 * The agent is the exchange's until then (a->busy). */
struct loop_run {
    dsec_agent *a;
    uint8_t *frame; /* the request, until sent */
    size_t flen, sent;
    uint64_t deadline_ns; /* when a wedged agent is given up on; 0: never */
    dsec_loop_watch *w;
    const char *what; /* "the command", "the file transfer": what a stopping node abandons */
    /* One frame of the answer: EXEC_MORE to read on, otherwise how the exchange ended (err
     * set for EXEC_REFUSED and EXEC_BROKEN). It may send the next request (loop_next). */
    int (*frame_in)(struct loop_run *r, uint8_t type, uint32_t rid, const uint8_t *pl, size_t pn,
                    dsec_err *err);
    /* Once, at the end, with frame_in's last answer or EXEC_BROKEN; frees the run. The last
     * frame's payload is still valid. */
    void (*end)(struct loop_run *r, int st, dsec_err *err);
};

static void loop_run_end(struct loop_run *r, int st, dsec_err *err)
{
    dsec_loop_del(r->w);
    r->w = NULL;
    if (st == EXEC_BROKEN)
        mark_broken(r->a);
    r->a->busy = false;
    dsec_free(r->frame);
    r->frame = NULL;
    r->end(r, st, err);
}

/* The frames the buffer holds: 1 when the exchange ended (end called). */
static int loop_frames(struct loop_run *r)
{
    dsec_err err;
    uint8_t type = 0;
    uint32_t rid = 0;
    const uint8_t *pl = NULL;
    size_t pn = 0;
    int got, st;
    while ((got = next_frame(r->a, &type, &rid, &pl, &pn, &err)) == 1)
        if ((st = r->frame_in(r, type, rid, pl, pn, &err)) != EXEC_MORE) {
            loop_run_end(r, st, &err);
            return 1;
        }
    if (got < 0) {
        loop_run_end(r, EXEC_BROKEN, &err);
        return 1;
    }
    return 0;
}

/* Send a further request of the same exchange (the next piece of a file): frame is taken. */
static void loop_next(struct loop_run *r, uint8_t *frame, size_t flen)
{
    dsec_free(r->frame);
    r->frame = frame;
    r->flen = flen;
    r->sent = 0;
    dsec_loop_set(r->w, DSEC_LOOP_IN | DSEC_LOOP_OUT, r->deadline_ns);
}

static void loop_ready(dsec_loop_watch *w, unsigned events, void *ud)
{
    (void)w;
    struct loop_run *r = ud;
    dsec_agent *a = r->a;
    dsec_err err;
    if (events & DSEC_LOOP_CANCEL) {
        dsec_err_set(&err, DSEC_E_CLOSED, 0,
                     "the node manager stopped waiting for %s (it may still run in the sandbox)",
                     r->what);
        loop_run_end(r, EXEC_BROKEN, &err);
        return;
    }
    if (events & DSEC_LOOP_TIMER) {
        dsec_err_set(&err, DSEC_E_TIMEOUT, 0, "no answer from the agent in time");
        loop_run_end(r, EXEC_BROKEN, &err);
        return;
    }
    if (r->frame != NULL && r->sent < r->flen) {
        ssize_t n = send(a->fd, r->frame + r->sent, r->flen - r->sent, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            dsec_err_set(&err, DSEC_E_CLOSED, errno, "sending to the agent: %s", strerror(errno));
            loop_run_end(r, EXEC_BROKEN, &err);
            return;
        }
        if (n > 0)
            r->sent += (size_t)n;
        if (r->sent == r->flen) {
            dsec_free(r->frame);
            r->frame = NULL;
            dsec_loop_set(r->w, DSEC_LOOP_IN, r->deadline_ns);
        }
        if (!(events & DSEC_LOOP_IN))
            return;
    }
    /* One read per wake-up (the loop is level-triggered): other sandboxes' turn comes
     * between two reads of a chatty command. */
    if (loop_frames(r) || !(events & DSEC_LOOP_IN))
        return;
    ssize_t n = recv(a->fd, a->buf + a->len, a->cap - a->len, 0);
    if (n == 0) {
        dsec_err_set(&err, DSEC_E_CLOSED, 0, "the agent closed the connection");
        loop_run_end(r, EXEC_BROKEN, &err);
        return;
    }
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR)
            return;
        dsec_err_set(&err, DSEC_E_CLOSED, errno, "receiving from the agent: %s", strerror(errno));
        loop_run_end(r, EXEC_BROKEN, &err);
        return;
    }
    a->len += (size_t)n;
    loop_frames(r);
}

/* Start r (its frame, frame_in, end and what set): -1 (end never called, frame freed) when
 * it could not be watched. */
static int loop_run_start(struct loop_run *r, dsec_agent *a, struct dsec_loop *loop,
                          dsec_err *err)
{
    r->a = a;
    a->busy = true;
    /* the first wake-up comes when the socket takes the request (at once, mostly) */
    if (dsec_loop_add(loop, a->fd, DSEC_LOOP_OUT, r->deadline_ns, loop_ready, r, &r->w, err) <
        0) {
        a->busy = false;
        dsec_free(r->frame);
        r->frame = NULL;
        return -1;
    }
    return 0;
}

struct exec_run {
    struct loop_run run; /* first: the run is the exec */
    struct exec_state x;
    dsec_exec_result res;
    dsec_agent_exec_done_fn done;
    void *ud;
};

static int exec_run_frame(struct loop_run *lr, uint8_t type, uint32_t rid, const uint8_t *pl,
                          size_t pn, dsec_err *err)
{
    struct exec_run *r = (struct exec_run *)lr;
    return exec_frame_in(&r->x, type, rid, pl, pn, &r->res, err);
}

static void exec_run_end(struct loop_run *lr, int st, dsec_err *err)
{
    struct exec_run *r = (struct exec_run *)lr;
    exec_state_release(&r->x);
    dsec_agent_exec_done_fn done = r->done;
    void *ud = r->ud;
    dsec_exec_result res = r->res;
    dsec_free(r);
    done(ud, st == EXEC_EXITED ? 0 : -1, st == EXEC_EXITED ? &res : NULL, err);
}

int dsec_agent_exec_start(dsec_agent *a, struct dsec_loop *loop, const dsec_exec_req *req,
                          dsec_agent_output_fn on_output, void *arg, dsec_agent_exec_done_fn done,
                          void *ud, dsec_err *err)
{
    if (check_open(a, err) < 0)
        return -1;
    struct exec_run *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "exec: a command in flight");
    r->x = (struct exec_state){.out_max = req && req->output_max ? req->output_max
                                                                 : DSEC_EXEC_OUTPUT_DEFAULT,
                               .on_output = on_output,
                               .arg = arg};
    r->run.frame = exec_frame(a, req, r->x.out_max, &r->run.flen, &r->x.id, err);
    if (r->run.frame == NULL) {
        dsec_free(r);
        return -1;
    }
    r->run.deadline_ns =
        req->timeout_ms ? dsec_loop_now_ns() + (req->timeout_ms + EXEC_GRACE_MS) * 1000000ull : 0;
    r->run.what = "the command";
    r->run.frame_in = exec_run_frame;
    r->run.end = exec_run_end;
    r->done = done;
    r->ud = ud;
    if (loop_run_start(&r->run, a, loop, err) < 0) {
        dsec_free(r);
        return -1;
    }
    return 0;
}

int dsec_agent_kill(const char *path, int sig, dsec_err *err)
{
    if (sig <= 0 || sig > 64)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "kill: no signal %d", sig);
    dsec_agent *a;
    if (dsec_agent_connect(&a, path, KILL_TIMEOUT_MS, err) < 0)
        return dsec_err_wrap(err, "kill");
    uint8_t *p;
    uint8_t *frame = new_frame(a, DSEC__AGENT_T_KILL, 4, &p, err);
    int rc = -1;
    if (frame) {
        p = dsec__agent_put_u32(p, (uint32_t)sig);
        const uint8_t *pl;
        size_t pn;
        rc = roundtrip(a, frame, (size_t)(p - frame), DSEC__AGENT_T_OK, &pl, &pn, err);
        dsec_free(frame);
    }
    dsec_agent_free(a);
    return rc;
}

/* ---- files ------------------------------------------------------------------------------------
 */

static int check_path(const char *op, const char *path, dsec_err *err)
{
    if (path == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: path is NULL", op);
    size_t n = strlen(path);
    if (n > DSEC__AGENT_PATH_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: path longer than %u bytes", op,
                            DSEC__AGENT_PATH_MAX);
    if (path[0] != '/')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: path \"%s\" is not absolute", op, path);
    return 0;
}

/* The request for one piece of a write. */
static uint8_t *write_frame(dsec_agent *a, const char *path, const void *data, size_t len,
                            uint32_t mode, bool append, size_t *flen, dsec_err *err)
{
    if (check_path("write", path, err) < 0)
        return NULL;
    if (len > DSEC_AGENT_FILE_MAX) {
        dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                     "write \"%s\": %zu bytes, at most %u per call (append the rest)", path, len,
                     DSEC_AGENT_FILE_MAX);
        return NULL;
    }
    if (len > 0 && data == NULL) {
        dsec_err_set(err, DSEC_E_INVALID, 0, "write \"%s\": data is NULL", path);
        return NULL;
    }
    size_t pl = strlen(path);
    uint8_t *p;
    uint8_t *frame = new_frame(a, DSEC__AGENT_T_FWRITE, 4 + 1 + 4 + pl + 4 + len, &p, err);
    if (frame == NULL)
        return NULL;
    p = dsec__agent_put_u32(p, mode);
    p = dsec__agent_put_u8(p, append);
    p = dsec__agent_put_bytes(p, path, pl);
    p = dsec__agent_put_bytes(p, data, len);
    *flen = (size_t)(p - frame);
    return frame;
}

int dsec_agent_file_write(dsec_agent *a, const char *path, const void *data, size_t len,
                          uint32_t mode, bool append, dsec_err *err)
{
    if (check_open(a, err) < 0)
        return -1;
    size_t flen;
    uint8_t *frame = write_frame(a, path, data, len, mode, append, &flen, err);
    if (frame == NULL)
        return -1;
    const uint8_t *rp;
    size_t rn;
    int rc = roundtrip(a, frame, flen, DSEC__AGENT_T_OK, &rp, &rn, err);
    dsec_free(frame);
    return rc;
}

/* The request for one piece of a read. */
static uint8_t *read_frame(dsec_agent *a, const char *path, uint64_t offset, uint64_t max,
                           size_t *flen, dsec_err *err)
{
    if (check_path("read", path, err) < 0)
        return NULL;
    size_t pl = strlen(path);
    uint8_t *p;
    uint8_t *frame = new_frame(a, DSEC__AGENT_T_FREAD, 8 + 8 + 4 + pl, &p, err);
    if (frame == NULL)
        return NULL;
    p = dsec__agent_put_u64(p, offset);
    p = dsec__agent_put_u64(p, max);
    p = dsec__agent_put_bytes(p, path, pl);
    *flen = (size_t)(p - frame);
    return frame;
}

/* A read's DATA answer into out (its data copied). -1 with err set when it is malformed
 * (the stream is then out of step) or memory runs out. */
static int read_answer(const char *path, uint64_t max, const uint8_t *rp, size_t rn,
                       dsec_file_data *out, dsec_err *err)
{
    dsec__agent_rd r = {.p = rp, .end = rp + rn};
    uint64_t size = dsec__agent_get_u64(&r);
    bool eof = dsec__agent_get_u8(&r) != 0;
    size_t dl;
    const uint8_t *d = dsec__agent_get_bytes(&r, DSEC__AGENT_FILE_MAX, &dl);
    if (!dsec__agent_done(&r) || (max && dl > max))
        return dsec_err_set(err, DSEC_E_DECODE, 0, "read \"%s\": malformed answer", path);
    memset(out, 0, sizeof *out);
    if (dl > 0) {
        out->data = dsec_malloc(dl);
        if (out->data == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "read \"%s\": %zu bytes", path, dl);
        memcpy(out->data, d, dl);
    }
    out->len = dl;
    out->size = size;
    out->eof = eof;
    return 0;
}

int dsec_agent_file_read(dsec_agent *a, const char *path, uint64_t offset, uint64_t max,
                         dsec_file_data *out, dsec_err *err)
{
    if (out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "read: out is NULL");
    memset(out, 0, sizeof *out);
    if (check_open(a, err) < 0)
        return -1;
    size_t flen;
    uint8_t *frame = read_frame(a, path, offset, max, &flen, err);
    if (frame == NULL)
        return -1;
    const uint8_t *rp;
    size_t rn;
    int rc = roundtrip(a, frame, flen, DSEC__AGENT_T_DATA, &rp, &rn, err);
    dsec_free(frame);
    if (rc < 0)
        return -1;
    if (read_answer(path, max, rp, rn, out, err) < 0) {
        if (err->code == DSEC_E_DECODE)
            mark_broken(a);
        return -1;
    }
    return 0;
}

/* ---- files without a thread: a whole transfer, piece by piece, on the loop --------------- */

struct file_run {
    struct loop_run run; /* first: the run is the transfer */
    uint32_t id;         /* the piece in flight */
    bool read;
    char *path;
    const uint8_t *data; /* a write's, borrowed until done */
    size_t len, off;
    uint32_t mode;
    bool append;
    uint64_t offset, max; /* a read's */
    dsec_file_data out;
    dsec_agent_file_done_fn done;
    void *ud;
};

/* The request for the transfer's next piece; -1 with err set. */
static int file_run_next(struct file_run *r, uint8_t **frame, size_t *flen, dsec_err *err)
{
    if (r->read) {
        uint64_t want = r->max == 0 ? 0 : r->max - r->out.len;
        *frame = read_frame(r->run.a, r->path, r->offset + r->out.len, want, flen, err);
    } else {
        size_t n = r->len - r->off > DSEC_AGENT_FILE_MAX ? DSEC_AGENT_FILE_MAX : r->len - r->off;
        *frame = write_frame(r->run.a, r->path, r->data + r->off, n, r->mode,
                             r->append || r->off > 0, flen, err);
    }
    if (*frame == NULL)
        return -1;
    r->id = dsec__agent_get_u32le(*frame + 5);
    return 0;
}

static int file_run_frame(struct loop_run *lr, uint8_t type, uint32_t rid, const uint8_t *pl,
                          size_t pn, dsec_err *err)
{
    struct file_run *r = (struct file_run *)lr;
    if (rid != r->id) {
        dsec_err_set(err, DSEC_E_DECODE, 0,
                     "agent answered request %" PRIu32 " instead of %" PRIu32, rid, r->id);
        return EXEC_BROKEN;
    }
    if (type == DSEC__AGENT_T_ERROR) {
        error_frame(pl, pn, err);
        return EXEC_REFUSED;
    }
    uint8_t want = r->read ? DSEC__AGENT_T_DATA : DSEC__AGENT_T_OK;
    if (type != want) {
        dsec_err_set(err, DSEC_E_DECODE, 0, "agent answered with frame type %u, expected %u",
                     type, want);
        return EXEC_BROKEN;
    }
    bool more;
    if (r->read) {
        dsec_file_data part;
        uint64_t left = r->max == 0 ? 0 : r->max - r->out.len;
        if (read_answer(r->path, left, pl, pn, &part, err) < 0)
            return err->code == DSEC_E_DECODE ? EXEC_BROKEN : EXEC_REFUSED;
        if (part.len > 0 && r->out.data != NULL) {
            uint8_t *grown = dsec_realloc(r->out.data, r->out.len + part.len);
            if (grown == NULL) {
                dsec_free(part.data);
                dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "read \"%s\": out of memory", r->path);
                return EXEC_REFUSED;
            }
            memcpy(grown + r->out.len, part.data, part.len);
            r->out.data = grown;
            dsec_free(part.data);
        } else if (part.len > 0) {
            r->out.data = part.data;
        }
        r->out.len += part.len;
        r->out.size = part.size;
        r->out.eof = part.eof;
        more = !part.eof && part.len > 0 && (r->max == 0 || r->out.len < r->max);
    } else {
        r->off += r->len - r->off > DSEC_AGENT_FILE_MAX ? DSEC_AGENT_FILE_MAX : r->len - r->off;
        more = r->off < r->len;
    }
    if (!more)
        return EXEC_EXITED;
    uint8_t *frame;
    size_t flen;
    if (file_run_next(r, &frame, &flen, err) < 0)
        return EXEC_REFUSED;
    loop_next(lr, frame, flen);
    return EXEC_MORE;
}

static void file_run_end(struct loop_run *lr, int st, dsec_err *err)
{
    struct file_run *r = (struct file_run *)lr;
    dsec_agent_file_done_fn done = r->done;
    void *ud = r->ud;
    dsec_file_data out = r->out;
    bool read = r->read;
    dsec_free(r->path);
    dsec_free(r);
    if (st != EXEC_EXITED) {
        dsec_free(out.data);
        done(ud, -1, NULL, err);
        return;
    }
    done(ud, 0, read ? &out : NULL, err);
}

static int file_run_start(struct file_run *r, dsec_agent *a, struct dsec_loop *loop,
                          const char *path, dsec_err *err)
{
    r->run.a = a;
    r->run.what = "the file transfer";
    r->run.frame_in = file_run_frame;
    r->run.end = file_run_end;
    r->run.deadline_ns = dsec_loop_now_ns() + FILE_OP_TIMEOUT_MS * 1000000ull;
    if (check_open(a, err) < 0)
        goto fail;
    if ((r->path = dsec_strdup(path)) == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "\"%s\": a file transfer in flight", path);
        goto fail;
    }
    if (file_run_next(r, &r->run.frame, &r->run.flen, err) < 0 ||
        loop_run_start(&r->run, a, loop, err) < 0)
        goto fail;
    return 0;
fail:
    dsec_free(r->path);
    dsec_free(r);
    return -1;
}

int dsec_agent_file_write_start(dsec_agent *a, struct dsec_loop *loop, const char *path,
                                const void *data, size_t len, uint32_t mode, bool append,
                                dsec_agent_file_done_fn done, void *ud, dsec_err *err)
{
    if (check_path("write", path, err) < 0)
        return -1;
    struct file_run *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "write \"%s\": a transfer in flight",
                            path);
    *r = (struct file_run){.data = data, .len = len, .mode = mode, .append = append,
                           .done = done, .ud = ud};
    return file_run_start(r, a, loop, path, err);
}

int dsec_agent_file_read_start(dsec_agent *a, struct dsec_loop *loop, const char *path,
                               uint64_t offset, uint64_t max, dsec_agent_file_done_fn done,
                               void *ud, dsec_err *err)
{
    if (check_path("read", path, err) < 0)
        return -1;
    struct file_run *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "read \"%s\": a transfer in flight",
                            path);
    *r = (struct file_run){.read = true, .offset = offset, .max = max, .done = done, .ud = ud};
    return file_run_start(r, a, loop, path, err);
}

/* Decode an ENTRIES answer into a caller-owned array. */
static int decode_entries(const uint8_t *p, size_t n, const char *path, dsec_file_entry **entries,
                          size_t *count, dsec_err *err)
{
    dsec__agent_rd r = {.p = p, .end = p + n};
    uint32_t cnt = dsec__agent_get_u32(&r);
    if (r.bad || cnt > DSEC__AGENT_LIST_MAX)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "list \"%s\": malformed answer", path);
    dsec_file_entry *v = dsec_calloc(cnt ? cnt : 1, sizeof *v);
    if (v == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "list \"%s\": %" PRIu32 " entries", path,
                            cnt);
    for (uint32_t i = 0; i < cnt; i++) {
        size_t nl;
        const char *name = dsec__agent_get_str(&r, DSEC__AGENT_PATH_MAX, &nl);
        uint8_t kind = dsec__agent_get_u8(&r);
        v[i].size = dsec__agent_get_u64(&r);
        v[i].mode = dsec__agent_get_u32(&r);
        v[i].mtime = (int64_t)dsec__agent_get_u64(&r);
        if (r.bad || kind < DSEC_FILE_REG || kind > DSEC_FILE_OTHER) {
            dsec_file_entries_free(v, i);
            return dsec_err_set(err, DSEC_E_DECODE, 0, "list \"%s\": malformed entry %" PRIu32,
                                path, i);
        }
        v[i].kind = (dsec_file_kind)kind;
        v[i].name = dsec_strndup(name, nl);
        if (v[i].name == NULL) {
            dsec_file_entries_free(v, i);
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "list \"%s\"", path);
        }
    }
    if (!dsec__agent_done(&r)) {
        dsec_file_entries_free(v, cnt);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "list \"%s\": trailing bytes in answer", path);
    }
    *entries = v;
    *count = cnt;
    return 0;
}

static int path_request(dsec_agent *a, uint8_t type, uint8_t want, const char *op, const char *path,
                        const uint8_t **rp, size_t *rn, dsec_err *err)
{
    if (check_open(a, err) < 0 || check_path(op, path, err) < 0)
        return -1;
    size_t pl = strlen(path);
    uint8_t *p;
    uint8_t *frame = new_frame(a, type, 4 + pl, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_bytes(p, path, pl);
    int rc = roundtrip(a, frame, (size_t)(p - frame), want, rp, rn, err);
    dsec_free(frame);
    return rc;
}

int dsec_agent_file_list(dsec_agent *a, const char *path, dsec_file_entry **entries, size_t *n,
                         dsec_err *err)
{
    if (entries == NULL || n == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "list: entries or n is NULL");
    *entries = NULL;
    *n = 0;
    const uint8_t *rp;
    size_t rn;
    if (path_request(a, DSEC__AGENT_T_FLIST, DSEC__AGENT_T_ENTRIES, "list", path, &rp, &rn, err) <
        0)
        return -1;
    if (decode_entries(rp, rn, path, entries, n, err) < 0) {
        mark_broken(a);
        return -1;
    }
    return 0;
}

int dsec_agent_file_stat(dsec_agent *a, const char *path, dsec_file_entry *out, dsec_err *err)
{
    if (out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "stat: out is NULL");
    memset(out, 0, sizeof *out);
    const uint8_t *rp;
    size_t rn;
    if (path_request(a, DSEC__AGENT_T_FSTAT, DSEC__AGENT_T_ENTRIES, "stat", path, &rp, &rn, err) <
        0)
        return -1;
    dsec_file_entry *v;
    size_t cnt;
    if (decode_entries(rp, rn, path, &v, &cnt, err) < 0) {
        mark_broken(a);
        return -1;
    }
    if (cnt != 1) {
        dsec_file_entries_free(v, cnt);
        mark_broken(a);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "stat \"%s\": %zu entries in the answer", path,
                            cnt);
    }
    *out = v[0];
    dsec_free(v); /* the name moves to out */
    return 0;
}

int dsec_agent_file_remove(dsec_agent *a, const char *path, bool recursive, dsec_err *err)
{
    if (check_open(a, err) < 0 || check_path("remove", path, err) < 0)
        return -1;
    size_t pl = strlen(path);
    uint8_t *p;
    uint8_t *frame = new_frame(a, DSEC__AGENT_T_FREMOVE, 1 + 4 + pl, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u8(p, recursive);
    p = dsec__agent_put_bytes(p, path, pl);
    const uint8_t *rp;
    size_t rn;
    int rc = roundtrip(a, frame, (size_t)(p - frame), DSEC__AGENT_T_OK, &rp, &rn, err);
    dsec_free(frame);
    return rc;
}

int dsec_agent_file_mkdir(dsec_agent *a, const char *path, uint32_t mode, bool parents,
                          dsec_err *err)
{
    if (check_open(a, err) < 0 || check_path("mkdir", path, err) < 0)
        return -1;
    size_t pl = strlen(path);
    uint8_t *p;
    uint8_t *frame = new_frame(a, DSEC__AGENT_T_FMKDIR, 1 + 4 + 4 + pl, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u8(p, parents);
    p = dsec__agent_put_u32(p, mode);
    p = dsec__agent_put_bytes(p, path, pl);
    const uint8_t *rp;
    size_t rn;
    int rc = roundtrip(a, frame, (size_t)(p - frame), DSEC__AGENT_T_OK, &rp, &rn, err);
    dsec_free(frame);
    return rc;
}

int dsec_agent_file_rename(dsec_agent *a, const char *from, const char *to, bool sync,
                           dsec_err *err)
{
    if (check_open(a, err) < 0 || check_path("rename", from, err) < 0 ||
        check_path("rename", to, err) < 0)
        return -1;
    size_t fl = strlen(from), tl = strlen(to);
    uint8_t *p;
    uint8_t *frame = new_frame(a, DSEC__AGENT_T_FRENAME, 1 + 4 + fl + 4 + tl, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u8(p, sync);
    p = dsec__agent_put_bytes(p, from, fl);
    p = dsec__agent_put_bytes(p, to, tl);
    const uint8_t *rp;
    size_t rn;
    int rc = roundtrip(a, frame, (size_t)(p - frame), DSEC__AGENT_T_OK, &rp, &rn, err);
    dsec_free(frame);
    return rc;
}

int dsec_agent_file_op(dsec_agent *a, const dsec_file_op *op, dsec_file_entry *st, dsec_err *err)
{
    switch (op->kind) {
    case DSEC_FOP_MKDIR:
        return dsec_agent_file_mkdir(a, op->path, op->mode, op->parents, err);
    case DSEC_FOP_STAT:
        return dsec_agent_file_stat(a, op->path, st, err);
    case DSEC_FOP_RENAME:
        return dsec_agent_file_rename(a, op->path, op->to, op->sync, err);
    case DSEC_FOP_REMOVE:
        return dsec_agent_file_remove(a, op->path, op->recursive, err);
    }
    return dsec_err_set(err, DSEC_E_INVALID, 0, "file op %d is unknown", (int)op->kind);
}

int dsec_agent_setup(dsec_agent *a, const char *const *vars, size_t n, const char *workdir,
                     const char *user, dsec_err *err)
{
    if (check_open(a, err) < 0)
        return -1;
    if (n > DSEC__AGENT_ENV_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "agent setup: %zu variables (most %u)", n,
                            DSEC__AGENT_ENV_MAX);
    size_t wl = strlen(workdir), ul = strlen(user), len = 4 + 4 + wl + 4 + ul;
    for (size_t i = 0; i < n; i++)
        len += 4 + strlen(vars[i]);
    uint8_t *p;
    uint8_t *frame = new_frame(a, DSEC__AGENT_T_SETUP, len, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u32(p, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        p = dsec__agent_put_bytes(p, vars[i], strlen(vars[i]));
    p = dsec__agent_put_bytes(p, workdir, wl);
    p = dsec__agent_put_bytes(p, user, ul);
    const uint8_t *rp;
    size_t rn;
    int rc = roundtrip(a, frame, (size_t)(p - frame), DSEC__AGENT_T_OK, &rp, &rn, err);
    dsec_free(frame);
    return rc;
}

/* ---- background processes ------------------------------------------------------------------ */

/* One process info from r into *out; false when it is malformed (r is then bad). */
static bool get_proc_info(dsec__agent_rd *r, dsec_proc_info *out)
{
    memset(out, 0, sizeof *out);
    out->handle = dsec__agent_get_u64(r);
    out->pid = (int32_t)dsec__agent_get_u32(r);
    uint8_t flags = dsec__agent_get_u8(r);
    out->exit_code = (int32_t)dsec__agent_get_u32(r);
    out->signal = (int32_t)dsec__agent_get_u32(r);
    out->started_ns = dsec__agent_get_u64(r);
    out->ended_ns = dsec__agent_get_u64(r);
    out->out_total = dsec__agent_get_u64(r);
    out->err_total = dsec__agent_get_u64(r);
    size_t cl;
    const char *cmd = dsec__agent_get_str(r, DSEC__AGENT_CMDLINE_MAX, &cl);
    if (r->bad || out->handle == 0 ||
        (flags & ~(DSEC__AGENT_P_RUNNING | DSEC__AGENT_P_STDIN_OPEN | DSEC__AGENT_P_TIMED_OUT |
                   DSEC__AGENT_P_PTY | DSEC__AGENT_P_SESSION | DSEC__AGENT_P_BUSY))) {
        r->bad = true;
        return false;
    }
    out->running = flags & DSEC__AGENT_P_RUNNING;
    out->stdin_open = flags & DSEC__AGENT_P_STDIN_OPEN;
    out->timed_out = flags & DSEC__AGENT_P_TIMED_OUT;
    out->pty = flags & DSEC__AGENT_P_PTY;
    out->session = flags & DSEC__AGENT_P_SESSION;
    out->busy = flags & DSEC__AGENT_P_BUSY;
    memcpy(out->cmdline, cmd, cl);
    out->cmdline[cl] = 0;
    return true;
}

int dsec_agent_proc_start(dsec_agent *a, const dsec_proc_start_req *req, dsec_proc_info *out,
                          dsec_err *err)
{
    if (req == NULL || out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "start: request or out is NULL");
    memset(out, 0, sizeof *out);
    if (check_open(a, err) < 0)
        return -1;
    if (req->ring_max > DSEC__AGENT_RING_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "start: ring_max %" PRIu64 " is over the limit of %u bytes",
                            req->ring_max, DSEC__AGENT_RING_MAX);
    size_t plen = 0;
    if (check_exec_req(&req->exec, req->session, &plen, err) < 0)
        return -1;
    if (req->session && req->pty)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "start: a shell session runs without a terminal (pty and session "
                            "are exclusive)");
    bool ext = req->pty || req->session; /* the trailing fields, only then (older agents) */
    plen = plen - 8 + 8 + 1 + (ext ? 1 + 4 + 4 : 0); /* no output_max; ring_max, keep_stdin */
    uint8_t *p;
    uint8_t *frame = new_frame(a, DSEC__AGENT_T_PSTART, plen, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u64(p, req->exec.timeout_ms);
    p = put_exec_body(p, &req->exec);
    p = dsec__agent_put_u64(p, req->ring_max);
    p = dsec__agent_put_u8(p, req->keep_stdin);
    if (ext) {
        p = dsec__agent_put_u8(p, (uint8_t)((req->pty ? DSEC__AGENT_S_PTY : 0) |
                                            (req->session ? DSEC__AGENT_S_SESSION : 0)));
        p = dsec__agent_put_u32(p, req->rows);
        p = dsec__agent_put_u32(p, req->cols);
    }
    const uint8_t *rp;
    size_t rn;
    int rc = roundtrip(a, frame, (size_t)(p - frame), DSEC__AGENT_T_PROC, &rp, &rn, err);
    dsec_free(frame);
    if (rc < 0)
        return -1;
    dsec__agent_rd r = {.p = rp, .end = rp + rn};
    if (!get_proc_info(&r, out) || !dsec__agent_done(&r)) {
        mark_broken(a);
        memset(out, 0, sizeof *out);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "start: malformed answer from the agent");
    }
    return 0;
}

int dsec_agent_proc_list(dsec_agent *a, dsec_proc_info **out, size_t *n, dsec_err *err)
{
    if (out == NULL || n == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "list processes: out or n is NULL");
    *out = NULL;
    *n = 0;
    if (check_open(a, err) < 0)
        return -1;
    uint8_t *p;
    uint8_t *frame = new_frame(a, DSEC__AGENT_T_PLIST, 0, &p, err);
    if (frame == NULL)
        return -1;
    const uint8_t *rp;
    size_t rn;
    int rc = roundtrip(a, frame, (size_t)(p - frame), DSEC__AGENT_T_PROCS, &rp, &rn, err);
    dsec_free(frame);
    if (rc < 0)
        return -1;
    dsec__agent_rd r = {.p = rp, .end = rp + rn};
    uint32_t cnt = dsec__agent_get_u32(&r);
    if (r.bad || cnt > DSEC__AGENT_PROC_MAX) {
        mark_broken(a);
        return dsec_err_set(err, DSEC_E_DECODE, 0,
                            "list processes: malformed answer (%" PRIu32 " processes, most %u)",
                            cnt, DSEC__AGENT_PROC_MAX);
    }
    dsec_proc_info *v = dsec_calloc(cnt ? cnt : 1, sizeof *v);
    if (v == NULL) {
        mark_broken(a); /* nothing is out of step, but the answer is lost: keep it simple */
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "list processes: %" PRIu32 " entries", cnt);
    }
    for (uint32_t i = 0; i < cnt; i++)
        get_proc_info(&r, &v[i]);
    if (!dsec__agent_done(&r)) {
        dsec_free(v);
        mark_broken(a);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "list processes: malformed answer");
    }
    *out = v;
    *n = cnt;
    return 0;
}

/* A request of fixed fields answered by OK. */
static int proc_ok_request(dsec_agent *a, uint8_t *frame, size_t flen, dsec_err *err)
{
    const uint8_t *rp;
    size_t rn;
    int rc = roundtrip(a, frame, flen, DSEC__AGENT_T_OK, &rp, &rn, err);
    dsec_free(frame);
    if (rc == 0 && rn != 8) {
        mark_broken(a);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "agent sent an OK of %zu bytes", rn);
    }
    return rc;
}

int dsec_agent_proc_signal(dsec_agent *a, uint64_t handle, int sig, dsec_err *err)
{
    if (check_open(a, err) < 0)
        return -1;
    if (sig <= 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "signal: %d is not a signal number", sig);
    uint8_t *p;
    uint8_t *frame = new_frame(a, DSEC__AGENT_T_PSIGNAL, 8 + 4, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u64(p, handle);
    p = dsec__agent_put_u32(p, (uint32_t)sig);
    return proc_ok_request(a, frame, (size_t)(p - frame), err);
}

int dsec_agent_proc_stdin(dsec_agent *a, uint64_t handle, const void *data, size_t len, bool close,
                          dsec_err *err)
{
    if (check_open(a, err) < 0)
        return -1;
    if (data == NULL && len > 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "stdin: %zu bytes but no data", len);
    if (len > DSEC__AGENT_STDIN_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "stdin: %zu bytes in one write, at most %u: write in pieces", len,
                            DSEC__AGENT_STDIN_MAX);
    uint8_t *p;
    uint8_t *frame = new_frame(a, DSEC__AGENT_T_PSTDIN, 8 + 1 + 4 + len, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u64(p, handle);
    p = dsec__agent_put_u8(p, close);
    p = dsec__agent_put_bytes(p, data, len);
    return proc_ok_request(a, frame, (size_t)(p - frame), err);
}

/* One stream of a POUT: its offset and bytes (copied into *data, dsec_malloc'd); false when
 * malformed: more than asked, or past what the stream produced. */
static bool get_stream(dsec__agent_rd *r, uint64_t max, uint64_t total, uint64_t *from,
                       uint8_t **data, size_t *len)
{
    *from = dsec__agent_get_u64(r);
    const uint8_t *d = dsec__agent_get_bytes(r, DSEC__AGENT_POUT_MAX, len);
    if (r->bad || (max && *len > max) || *from > total || *len > total - *from) {
        r->bad = true;
        return false;
    }
    if (*len > 0) {
        *data = dsec_malloc(*len);
        if (*data == NULL)
            return false;
        memcpy(*data, d, *len);
    }
    return true;
}

/* The POUTPUT request (wait_ms 0: no wait, and no field, as before waits existed). */
static uint8_t *pout_frame(dsec_agent *a, uint64_t handle, uint64_t out_off, uint64_t err_off,
                           uint64_t max, uint32_t wait_ms, size_t *flen, dsec_err *err)
{
    uint8_t *p;
    uint8_t *frame = new_frame(a, DSEC__AGENT_T_POUTPUT, 8 * 4 + (wait_ms ? 4 : 0), &p, err);
    if (frame == NULL)
        return NULL;
    p = dsec__agent_put_u64(p, handle);
    p = dsec__agent_put_u64(p, out_off);
    p = dsec__agent_put_u64(p, err_off);
    p = dsec__agent_put_u64(p, max);
    if (wait_ms)
        p = dsec__agent_put_u32(p, wait_ms);
    *flen = (size_t)(p - frame);
    return frame;
}

/* A POUT into *out: 0, or -1 with err (broken: the answer was malformed). */
static int pout_decode(const uint8_t *rp, size_t rn, uint64_t handle, uint64_t max,
                       dsec_proc_output *out, bool *broken, dsec_err *err)
{
    dsec__agent_rd r = {.p = rp, .end = rp + rn};
    bool ok = get_proc_info(&r, &out->info) &&
              get_stream(&r, max, out->info.out_total, &out->out_from, &out->out, &out->out_len) &&
              get_stream(&r, max, out->info.err_total, &out->err_from, &out->err, &out->err_len) &&
              dsec__agent_done(&r);
    *broken = false;
    if (ok)
        return 0;
    dsec_proc_output_release(out);
    memset(out, 0, sizeof *out);
    if (!r.bad)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "output of process %" PRIu64, handle);
    *broken = true;
    return dsec_err_set(err, DSEC_E_DECODE, 0, "output: malformed answer from the agent");
}

int dsec_agent_proc_output(dsec_agent *a, uint64_t handle, uint64_t out_off, uint64_t err_off,
                           uint64_t max, dsec_proc_output *out, dsec_err *err)
{
    if (out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "output: out is NULL");
    memset(out, 0, sizeof *out);
    if (check_open(a, err) < 0)
        return -1;
    size_t flen;
    uint8_t *frame = pout_frame(a, handle, out_off, err_off, max, 0, &flen, err);
    if (frame == NULL)
        return -1;
    const uint8_t *rp;
    size_t rn;
    int rc = roundtrip(a, frame, flen, DSEC__AGENT_T_POUT, &rp, &rn, err);
    dsec_free(frame);
    if (rc < 0)
        return -1;
    bool broken;
    if (pout_decode(rp, rn, handle, max, out, &broken, err) < 0) {
        if (broken)
            mark_broken(a);
        return -1;
    }
    return 0;
}

struct pout_run {
    struct loop_run run; /* first: the run is the request */
    uint32_t id;
    uint64_t handle, max;
    dsec_proc_output out;
    dsec_proc_output_done_fn done;
    void *ud;
};

static int pout_run_frame(struct loop_run *lr, uint8_t type, uint32_t rid, const uint8_t *pl,
                          size_t pn, dsec_err *err)
{
    struct pout_run *r = (struct pout_run *)lr;
    if (rid != r->id) {
        dsec_err_set(err, DSEC_E_DECODE, 0,
                     "agent answered request %" PRIu32 " while output %" PRIu32 " waited", rid,
                     r->id);
        return EXEC_BROKEN;
    }
    if (type == DSEC__AGENT_T_ERROR) {
        error_frame(pl, pn, err);
        return EXEC_REFUSED;
    }
    if (type != DSEC__AGENT_T_POUT) {
        dsec_err_set(err, DSEC_E_DECODE, 0, "agent sent frame type %u for output", type);
        return EXEC_BROKEN;
    }
    bool broken;
    if (pout_decode(pl, pn, r->handle, r->max, &r->out, &broken, err) < 0)
        return broken ? EXEC_BROKEN : EXEC_REFUSED;
    return EXEC_EXITED;
}

static void pout_run_end(struct loop_run *lr, int st, dsec_err *err)
{
    struct pout_run *r = (struct pout_run *)lr;
    dsec_proc_output_done_fn done = r->done;
    void *ud = r->ud;
    dsec_proc_output out = r->out;
    dsec_free(r);
    if (st == EXEC_EXITED) {
        done(ud, 0, &out, err);
        return;
    }
    done(ud, -1, NULL, err);
}

int dsec_agent_proc_output_start(dsec_agent *a, struct dsec_loop *loop, uint64_t handle,
                                 uint64_t out_off, uint64_t err_off, uint64_t max, uint32_t wait_ms,
                                 dsec_proc_output_done_fn done, void *ud, dsec_err *err)
{
    if (done == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "output: done is NULL");
    if (wait_ms > DSEC__AGENT_WAIT_MAX_MS)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "output: wait of %" PRIu32 " ms is over the limit of %u ms", wait_ms,
                            DSEC__AGENT_WAIT_MAX_MS);
    if (check_open(a, err) < 0)
        return -1;
    struct pout_run *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "output: a request in flight");
    r->run.frame = pout_frame(a, handle, out_off, err_off, max, wait_ms, &r->run.flen, err);
    if (r->run.frame == NULL) {
        dsec_free(r);
        return -1;
    }
    r->id = dsec__agent_get_u32le(r->run.frame + 5);
    r->handle = handle;
    r->max = max;
    r->run.deadline_ns = dsec_loop_now_ns() + ((uint64_t)wait_ms + EXEC_GRACE_MS) * 1000000ull;
    r->run.what = "the process output";
    r->run.frame_in = pout_run_frame;
    r->run.end = pout_run_end;
    r->done = done;
    r->ud = ud;
    if (loop_run_start(&r->run, a, loop, err) < 0) {
        dsec_free(r);
        return -1;
    }
    return 0;
}

int dsec_agent_proc_resize(dsec_agent *a, uint64_t handle, uint16_t rows, uint16_t cols,
                           dsec_err *err)
{
    if (check_open(a, err) < 0)
        return -1;
    uint8_t *p;
    uint8_t *frame = new_frame(a, DSEC__AGENT_T_PRESIZE, 8 + 4 + 4, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u64(p, handle);
    p = dsec__agent_put_u32(p, rows);
    p = dsec__agent_put_u32(p, cols);
    return proc_ok_request(a, frame, (size_t)(p - frame), err);
}
