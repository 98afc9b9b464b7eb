/* agent-client-dial.c - connecting to an agent without a thread: the connects, the SYNC and the
 * wait for its HELLO as watches on the node's loop (a VM's boot is seconds of waiting for it). */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/agent/agent-client-int.h"
#include "backends/agent/agent-proto.h"
#include "backends/loop.h"
#include "dsec/alloc.h"

#define DIAL_ALIVE_NS 1000000000u /* how often alive is asked */
#define DIAL_BACKOFF_MAX_MS 100u  /* the longest pause between two refused connects */

/* One dial. While fd is -1 its watch is a timer for the next connect; then it watches fd. */
struct dial {
    dsec_loop *loop;
    dsec_loop_watch *w;
    char *path;
    int fd;
    uint64_t timeout_ms, attempt_ms, backoff_ms;
    uint64_t deadline_ns; /* the whole dial's */
    uint64_t attempt_ns;  /* this connection's wait for its HELLO */
    uint64_t alive_ns;    /* the next time alive is asked */
    int last_errno;       /* why the last connection did not answer */
    bool old;             /* dropping the rest of an older agent's ERROR (drain bytes) */
    size_t have, drain;
    uint8_t tag[5], etag[5];
    dsec_agent_alive_fn alive;
    dsec_agent_dial_fn done;
    void *ud;
    uint8_t win[65536 + 32];
};

static void on_dial(dsec_loop_watch *w, unsigned events, void *ud);

static uint64_t min_ns(uint64_t a, uint64_t b)
{
    return a < b ? a : b;
}

/* The dial ended: done hears how, then everything of it goes (a, when made, is done's). */
static void dial_end(struct dial *d, int rc, dsec_err *err)
{
    dsec_loop_del(d->w);
    dsec_agent *a = NULL;
    if (rc == 0) {
        a = dsec_calloc(1, sizeof *a);
        if (a == NULL) {
            rc = dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "agent connection");
        } else {
            a->fd = d->fd;
            d->fd = -1;
        }
    }
    if (d->fd >= 0)
        close(d->fd);
    d->done(d->ud, rc, a, err);
    dsec_free(d->path);
    dsec_free(d);
}

/* Watch fd (or, with -1, nothing: a timer at at_ns) from now on, instead of what was watched. */
static int rewatch(struct dial *d, int fd, unsigned events, uint64_t at_ns, dsec_err *err)
{
    dsec_loop_del(d->w);
    d->w = NULL;
    return dsec_loop_add(d->loop, fd, events, at_ns, on_dial, d, &d->w, err);
}

/* The connection went silent or away: drop it, connect again after a pause. */
static int redial(struct dial *d, int why, dsec_err *err)
{
    dsec_loop_del(d->w); /* before the close: epoll forgets the fd */
    d->w = NULL;
    if (d->fd >= 0)
        close(d->fd);
    d->fd = -1;
    d->last_errno = why;
    d->old = false;
    uint64_t at = dsec_loop_now_ns() + d->backoff_ms * 1000000u;
    if (d->backoff_ms < DIAL_BACKOFF_MAX_MS)
        d->backoff_ms *= 2;
    return rewatch(d, -1, 0, min_ns(at, d->deadline_ns), err);
}

/* The SYNC with a fresh nonce (a new connection, or the agent greeted on its own). It is 9
 * bytes into an empty socket buffer: anything short of all of them is a broken connection. */
static int send_sync(struct dial *d)
{
    uint8_t sync[DSEC__AGENT_HDR];
    dsec__agent_sync_new(sync, d->tag, d->etag);
    ssize_t n = send(d->fd, sync, sizeof sync, MSG_NOSIGNAL);
    if (n == (ssize_t)sizeof sync)
        return 0;
    return n < 0 ? errno : EPIPE;
}

/* Scan what came: 1 when the dial ended (answered), 0 to read on, -1 to connect again (errno
 * value in *why). */
static int got_bytes(struct dial *d, int *why, dsec_err *err)
{
    for (;;) {
        uint32_t version = 0;
        switch (dsec__agent_hello_scan(d->win, &d->have, d->tag, d->etag, &version, &d->drain)) {
        case DSEC__AGENT_HELLO_OK:
            dial_end(d, dsec__agent_hello_version(version, d->path, err), err);
            return 1;
        case DSEC__AGENT_HELLO_GREET:
            if ((*why = send_sync(d)) != 0)
                return -1;
            continue;
        case DSEC__AGENT_HELLO_OLD:
            if (d->drain == 0) {
                dial_end(d, 0, err);
                return 1;
            }
            d->old = true;
            return 0;
        default:
            return 0;
        }
    }
}

/* The fd is readable: read once (the loop is level-triggered). */
static void dial_read(struct dial *d)
{
    dsec_err err;
    int why = 0;
    size_t room =
        d->old ? (d->drain < sizeof d->win ? d->drain : sizeof d->win) : sizeof d->win - d->have;
    ssize_t n = recv(d->fd, d->old ? d->win : d->win + d->have, room, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        why = n == 0 ? ECONNRESET : errno;
    } else if (d->old) {
        d->drain -= (size_t)n;
        if (d->drain == 0) {
            dial_end(d, 0, &err);
            return;
        }
        return;
    } else {
        d->have += (size_t)n;
        int rc = got_bytes(d, &why, &err);
        if (rc >= 0)
            return;
    }
    if (redial(d, why, &err) < 0)
        dial_end(d, -1, &err);
}

/* Connect now: 0 when connected or to be tried again, -1 with err when it cannot be. */
static int dial_connect(struct dial *d, dsec_err *err)
{
    int fd = dsec__agent_connect_once(d->path);
    if (fd < 0) {
        int e = errno;
        if (e != ENOENT && e != ECONNREFUSED && e != EAGAIN && e != ENOTDIR)
            return dsec_err_set(err, DSEC_E_CONN, e, "connecting to the agent at %s: %s", d->path,
                                strerror(e));
        return redial(d, e, err);
    }
    d->fd = fd;
    d->have = 0;
    int why = send_sync(d);
    if (why != 0)
        return redial(d, why, err);
    d->attempt_ns = dsec_loop_now_ns() + d->attempt_ms * 1000000u;
    return rewatch(d, fd, DSEC_LOOP_IN, min_ns(min_ns(d->attempt_ns, d->alive_ns), d->deadline_ns),
                   err);
}

/* A deadline passed: 1 when the dial ended, 0 to go on. */
static int dial_timer(struct dial *d, dsec_err *err)
{
    uint64_t now = dsec_loop_now_ns();
    if (now >= d->alive_ns) {
        d->alive_ns = now + DIAL_ALIVE_NS;
        if (d->alive != NULL && !d->alive(d->ud, err)) {
            dial_end(d, -1, err);
            return 1;
        }
    }
    if (now >= d->deadline_ns) {
        int e = d->last_errno;
        dsec_err_set(err, DSEC_E_TIMEOUT, e, "agent at %s did not answer within %" PRIu64 " ms%s%s",
                     d->path, d->timeout_ms, e ? ": " : "", e ? strerror(e) : "");
        dial_end(d, -1, err);
        return 1;
    }
    if (d->fd >= 0 && now >= d->attempt_ns) { /* a SYNC lost in stale input: connect again */
        if (redial(d, ETIMEDOUT, err) < 0) {
            dial_end(d, -1, err);
            return 1;
        }
        return 0;
    }
    if (d->fd >= 0)
        dsec_loop_set(d->w, DSEC_LOOP_IN,
                      min_ns(min_ns(d->attempt_ns, d->alive_ns), d->deadline_ns));
    return 0;
}

static void on_dial(dsec_loop_watch *w, unsigned events, void *ud)
{
    (void)w;
    struct dial *d = ud;
    dsec_err err;
    if (events & DSEC_LOOP_CANCEL) {
        dsec_err_set(&err, DSEC_E_CLOSED, 0,
                     "the node manager stopped while waiting for the agent at %s", d->path);
        dial_end(d, -1, &err);
        return;
    }
    if ((events & DSEC_LOOP_TIMER) && dial_timer(d, &err))
        return;
    if (d->fd < 0) {
        if ((events & DSEC_LOOP_TIMER) && dial_connect(d, &err) < 0)
            dial_end(d, -1, &err);
        return;
    }
    if (events & (DSEC_LOOP_IN | DSEC_LOOP_ERR))
        dial_read(d);
}

int dsec_agent_connect_start(struct dsec_loop *loop, const char *path, uint64_t timeout_ms,
                             uint64_t attempt_ms, dsec_agent_alive_fn alive,
                             dsec_agent_dial_fn done, void *ud, dsec_err *err)
{
    if (loop == NULL || path == NULL || path[0] == '\0' || done == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "agent dial: loop, path and done are needed");
    struct dial *d = dsec_calloc(1, sizeof *d);
    if (d == NULL || (d->path = dsec_strdup(path)) == NULL) {
        dsec_free(d);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "agent dial");
    }
    uint64_t now = dsec_loop_now_ns();
    d->loop = loop;
    d->fd = -1;
    d->timeout_ms = timeout_ms;
    d->attempt_ms = attempt_ms ? attempt_ms : 2000;
    d->backoff_ms = 1;
    d->deadline_ns = now + timeout_ms * 1000000u;
    d->alive_ns = now + DIAL_ALIVE_NS;
    d->alive = alive;
    d->done = done;
    d->ud = ud;
    /* the first connect is the first wake-up's, on the loop's thread */
    if (dsec_loop_add(loop, -1, 0, now, on_dial, d, &d->w, err) < 0) {
        dsec_free(d->path);
        dsec_free(d);
        return -1;
    }
    return 0;
}
