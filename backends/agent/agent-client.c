/* agent-client.c - the node side of the dsec-agent channel: a connection, its frames, and
 * exchanges driven by the node's loop (the calls: agent-client-exec.c, -files.c, -proc.c). */
#define _GNU_SOURCE
#include "backends/agent/agent-client-int.h"

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

#define SYNC_TIMEOUT_MS 2000u /* a SYNC swallowed by a half-received stale request: reconnect */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* 0 means no deadline. */
uint64_t dsec__agent_deadline_after(uint64_t ms)
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

/* fd is read by other threads on a multiplexed connection (dsec_agent_broken): atomically. */
void dsec__agent_mark_broken(dsec_agent *a)
{
    int fd = __atomic_load_n(&a->fd, __ATOMIC_ACQUIRE);
    if (fd >= 0) {
        __atomic_store_n(&a->fd, -1, __ATOMIC_RELEASE);
        close(fd);
    }
}

int dsec__agent_check_open(dsec_agent *a, dsec_err *err)
{
    if (a == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "agent connection is NULL");
    if (dsec_agent_broken(a))
        return dsec_err_set(err, DSEC_E_CLOSED, 0,
                            "connection to the agent is broken by an earlier failure; reconnect");
    if (a->busy)
        return dsec_err_set(err, DSEC_E_STATE, 0,
                            "the agent connection is running a command; one call at a time");
    return 0;
}

int dsec__agent_send_all(dsec_agent *a, const uint8_t *p, size_t n, uint64_t deadline,
                         dsec_err *err)
{
    if (a->mux != NULL) /* its bytes are the loop's to send */
        return dsec_err_set(err, DSEC_E_INTERNAL, 0,
                            "a call that streams was made on a multiplexed agent connection");
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

int dsec__agent_next_frame(dsec_agent *a, uint8_t *type, uint32_t *id, const uint8_t **payload,
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
int dsec__agent_recv_frame(dsec_agent *a, uint64_t deadline, uint8_t *type, uint32_t *id,
                           const uint8_t **payload, size_t *plen, dsec_err *err)
{
    for (;;) {
        int r = dsec__agent_next_frame(a, type, id, payload, plen, err);
        if (r != 0)
            return r < 0 ? -1 : 0;
        ssize_t n = recv_some(a, a->buf + a->len, a->cap - a->len, deadline, err);
        if (n < 0)
            return -1;
        a->len += (size_t)n;
    }
}

/* Turn an ERROR frame into err. */
int dsec__agent_error_frame(const uint8_t *payload, size_t plen, dsec_err *err)
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
int dsec__agent_roundtrip(dsec_agent *a, uint8_t *frame, size_t flen, uint8_t want,
                          const uint8_t **payload, size_t *plen, dsec_err *err)
{
    if (a->mux != NULL)
        return dsec__agent_mux_roundtrip(a, frame, flen, want, payload, plen, err);
    uint64_t deadline = dsec__agent_deadline_after(FILE_OP_TIMEOUT_MS);
    uint32_t id = dsec__agent_get_u32le(frame + 5);
    uint8_t type = 0;
    uint32_t rid = 0;
    if (dsec__agent_send_all(a, frame, flen, deadline, err) < 0 ||
        dsec__agent_recv_frame(a, deadline, &type, &rid, payload, plen, err) < 0)
        goto broken;
    if (rid != id) {
        dsec_err_set(err, DSEC_E_DECODE, 0,
                     "agent answered request %" PRIu32 " instead of %" PRIu32, rid, id);
        goto broken;
    }
    if (type == DSEC__AGENT_T_ERROR)
        return dsec__agent_error_frame(*payload, *plen, err);
    if (type != want) {
        dsec_err_set(err, DSEC_E_DECODE, 0, "agent answered with frame type %u, expected %u", type,
                     want);
        goto broken;
    }
    return 0;
broken:
    dsec__agent_mark_broken(a);
    return -1;
}

/* Send frame (taken: freed here) and read its answer, an OK (or an ERROR): as roundtrip. */
int dsec__agent_request_ok(dsec_agent *a, uint8_t *frame, size_t flen, dsec_err *err)
{
    const uint8_t *rp;
    size_t rn;
    int rc = dsec__agent_roundtrip(a, frame, flen, DSEC__AGENT_T_OK, &rp, &rn, err);
    dsec_free(frame);
    return rc;
}

/* A request frame of payload_len bytes; the caller fills the payload after the header. */
uint8_t *dsec__agent_new_frame(dsec_agent *a, uint8_t type, size_t payload_len, uint8_t **payload,
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
    uint32_t id = __atomic_add_fetch(&a->next_id, 1, __ATOMIC_RELAXED);
    if (id == 0)
        id = __atomic_add_fetch(&a->next_id, 1, __ATOMIC_RELAXED); /* 0: "no request" */
    *payload = dsec__agent_put_hdr(f, type, id, payload_len);
    return f;
}

/* ---- connecting -------------------------------------------------------------------------------
 */

/* One connect attempt; returns the fd, or -1 with errno. A path longer than sun_path
 * goes through a descriptor of its directory. */
int dsec__agent_connect_once(const char *path)
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

/* A SYNC frame with a fresh random nonce in sync, and the two answers that carry it: the HELLO
 * (tag) and an older agent's "unsupported" ERROR (etag), as the 5 bytes after a frame's length. */
void dsec__agent_sync_new(uint8_t sync[DSEC__AGENT_HDR], uint8_t tag[5], uint8_t etag[5])
{
    uint32_t nonce = 0;
    while (nonce == 0)
        if (getrandom(&nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce)
            nonce = (uint32_t)now_ms() ^ (uint32_t)getpid() ^ 0x5a5a5a5au;
    dsec__agent_put_hdr(sync, DSEC__AGENT_T_SYNC, nonce, 0);
    tag[0] = DSEC__AGENT_T_HELLO;
    etag[0] = DSEC__AGENT_T_ERROR;
    dsec__agent_put_u32(tag + 1, nonce);
    dsec__agent_put_u32(etag + 1, nonce);
}

int dsec__agent_hello_scan(uint8_t *win, size_t *have, const uint8_t tag[5], const uint8_t etag[5],
                           uint32_t *version, size_t *drain)
{
    /* the greeting an agent sends on its own when a client arrives (id 0) */
    static const uint8_t greet[9] = {13, 0, 0, 0, DSEC__AGENT_T_HELLO, 0, 0, 0, 0};
    size_t n = *have;
    /* a hit at i means a frame starts at i - 4 */
    for (size_t i = 4; i + 5 <= n; i++) {
        uint32_t flen = dsec__agent_get_u32le(win + i - 4);
        if (i + 9 <= n && memcmp(win + i - 4, greet, sizeof greet) == 0) {
            /* drop everything up to it, so it is not seen again */
            size_t used = i + 13 <= n ? i + 13 : i + 5;
            memmove(win, win + used, n - used);
            *have = n - used;
            return DSEC__AGENT_HELLO_GREET;
        }
        if (memcmp(win + i, tag, 5) == 0 && flen == 13 && i + 13 <= n) {
            *version = dsec__agent_get_u32le(win + i + 5);
            return DSEC__AGENT_HELLO_OK; /* nothing legitimate follows before our first request */
        }
        if (memcmp(win + i, etag, 5) == 0 && flen >= 13 && i + 9 <= n &&
            dsec__agent_get_u32le(win + i + 5) == DSEC__AGENT_ERR_UNSUPPORTED) {
            /* an agent without SYNC: the rest of its ERROR frame is to be read and dropped
             * (type, id and kind are in the window) */
            size_t rest = (size_t)flen - 9, left = n - (i + 9);
            *drain = rest - (left < rest ? left : rest);
            return DSEC__AGENT_HELLO_OLD;
        }
    }
    /* keep a tail that may hold the start of the HELLO */
    if (n > 16) {
        memmove(win, win + n - 16, 16);
        *have = 16;
    }
    return DSEC__AGENT_HELLO_NONE;
}

int dsec__agent_hello_version(uint32_t version, const char *path, dsec_err *err)
{
    if (version != DSEC__AGENT_VERSION)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "agent at %s speaks protocol %" PRIu32 ", this node %u", path, version,
                            DSEC__AGENT_VERSION);
    return 0;
}

/* Start a fresh exchange on a just-connected a: send SYNC with a random nonce and discard every
 * byte until the HELLO that carries the latest one. On a virtio-serial port the bytes before it may
 * be what the agent still had queued for an earlier client, even half a frame, so they are scanned
 * as raw bytes, never parsed. An agent older than SYNC answers it with an "unsupported" ERROR
 * carrying the nonce; it only ever served sockets, where a connection is fresh by construction, so
 * that answer is as good. Fails with DSEC_E_TIMEOUT (reconnect), DSEC_E_CLOSED or
 * DSEC_E_UNSUPPORTED (protocol version). */
static int sync_hello(dsec_agent *a, const char *path, uint64_t deadline, dsec_err *err)
{
    uint8_t tag[5], etag[5], sync[DSEC__AGENT_HDR];
    uint8_t win[65536 + 32];
    size_t have = 0, drain = 0;
    uint32_t version = 0;
    bool resync = true;
    for (;;) {
        /* A SYNC with a fresh nonce: first, and again whenever the agent greets on its own. A
         * greeting means it has just started serving this channel, and an agent starting on a
         * virtio-serial port discards what was sent before, our SYNC included. Answers to
         * earlier SYNCs come before the latest one's and are skipped like any stale byte. */
        if (resync) {
            dsec__agent_sync_new(sync, tag, etag);
            if (dsec__agent_send_all(a, sync, sizeof sync, deadline, err) < 0)
                return -1;
            resync = false;
        }
        switch (dsec__agent_hello_scan(win, &have, tag, etag, &version, &drain)) {
        case DSEC__AGENT_HELLO_OK:
            return dsec__agent_hello_version(version, path, err);
        case DSEC__AGENT_HELLO_GREET:
            resync = true;
            continue;
        case DSEC__AGENT_HELLO_OLD:
            while (drain > 0) {
                uint8_t junk[4096];
                ssize_t n =
                    recv_some(a, junk, drain < sizeof junk ? drain : sizeof junk, deadline, err);
                if (n < 0)
                    return -1;
                drain -= (size_t)n;
            }
            return 0;
        default:
            break;
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
        int fd = dsec__agent_connect_once(path);
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
    if (a->mux != NULL && dsec__agent_mux_close(a))
        return; /* freed at the end of the connection's callback that runs now */
    dsec__agent_mark_broken(a);
    dsec_free(a->buf);
    dsec_free(a);
}

bool dsec_agent_broken(const dsec_agent *a)
{
    return a == NULL || __atomic_load_n(&a->fd, __ATOMIC_ACQUIRE) < 0;
}

/* ---- calls without a thread: the same exchanges, driven by the node's loop --------------- */

static void loop_run_end(struct loop_run *r, int st, dsec_err *err)
{
    dsec_loop_del(r->w);
    r->w = NULL;
    if (st == EXEC_BROKEN)
        dsec__agent_mark_broken(r->a);
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
    while ((got = dsec__agent_next_frame(r->a, &type, &rid, &pl, &pn, &err)) == 1)
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
void dsec__agent_loop_next(struct loop_run *r, uint8_t *frame, size_t flen)
{
    dsec_free(r->frame);
    r->frame = frame;
    r->flen = flen;
    r->sent = 0;
    if (r->a->mux != NULL) {
        dsec__agent_mux_next(r);
        return;
    }
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

int dsec__agent_loop_answer(uint32_t id, uint8_t want, const char *what, uint8_t type, uint32_t rid,
                            const uint8_t *pl, size_t pn, dsec_err *err)
{
    if (rid != id) {
        dsec_err_set(err, DSEC_E_DECODE, 0,
                     "agent answered request %" PRIu32 " while %s %" PRIu32 " waited", rid, what,
                     id);
        return EXEC_BROKEN;
    }
    if (type == DSEC__AGENT_T_ERROR) {
        dsec__agent_error_frame(pl, pn, err);
        return EXEC_REFUSED;
    }
    if (type != want) {
        dsec_err_set(err, DSEC_E_DECODE, 0, "agent answered %s with frame type %u, expected %u",
                     what, type, want);
        return EXEC_BROKEN;
    }
    return 0;
}

/* Start r (its frame, frame_in, end and what set): -1 (end never called, frame freed) when
 * it could not be watched. */
int dsec__agent_loop_run_start(struct loop_run *r, dsec_agent *a, struct dsec_loop *loop,
                               dsec_err *err)
{
    if (a->mux != NULL)
        return dsec__agent_mux_run(r, a, err);
    r->a = a;
    a->busy = true;
    /* the first wake-up comes when the socket takes the request (at once, mostly) */
    if (dsec_loop_add(loop, a->fd, DSEC_LOOP_OUT, r->deadline_ns, loop_ready, r, &r->w, err) < 0) {
        a->busy = false;
        dsec_free(r->frame);
        r->frame = NULL;
        return -1;
    }
    return 0;
}

/* dsec__agent_loop_run_start for a run that is the first member of a dsec_malloc'd block, which
 * is freed (and its frame) when it cannot start. */
int dsec__agent_loop_run_own(struct loop_run *r, dsec_agent *a, struct dsec_loop *loop,
                             dsec_err *err)
{
    if (dsec__agent_loop_run_start(r, a, loop, err) < 0) {
        dsec_free(r);
        return -1;
    }
    return 0;
}
