/* agent-conn.c - connections: frames read and dispatched, answers buffered and sent */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/agent/agent-int.h"

#define READ_STOP (16u << 20) /* stop reading requests from a peer that does not read answers */
#define BUF_KEEP (256u << 10) /* larger idle connection buffers are given back */
/* ... once idle this long: a transfer's next piece reuses them (fresh pages fault in, and a
 * fault costs 2-13 us on some hosts: 1,000 of them per 4 MiB piece) */
#define BUF_IDLE_NS (1000000000ull)

static void conn_process(struct conn *c);

/* Read m's paused output streams again. */
static void cmd_resume(struct cmd *m)
{
    for (int s = 1; s <= 2; s++)
        if (m->io[s].paused && m->io[s].fd >= 0) {
            m->io[s].paused = false;
            dsec__agent_ep_ctl(EPOLL_CTL_MOD, m->io[s].fd, EPOLLIN, &m->io[s]);
        }
}

/* c's commands run on without it: their output has nowhere to go and is read and dropped. */
static void cmds_detach(const struct conn *c)
{
    for (struct cmd *m = dsec__agent_g.cmds; m; m = m->next)
        if (m->conn == c) {
            m->conn = NULL;
            cmd_resume(m);
        }
}

void dsec__agent_conn_close(struct conn *c)
{
    if (c->dead)
        return;
    c->dead = true;
    dsec__agent_ep_ctl(EPOLL_CTL_DEL, c->fd, 0, NULL);
    close(c->fd);
    c->fd = -1;
    if (c->prev)
        c->prev->next = c->next;
    else
        dsec__agent_g.conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->next_dead = dsec__agent_g.dead_conns;
    dsec__agent_g.dead_conns = c;
    dsec__agent_procs_forget_conn(c);
    cmds_detach(c);
    if (c->port)
        dsec__agent_port_lost(c->port);
}

size_t dsec__agent_conn_backlog(const struct conn *c)
{
    return c->wlen - c->woff;
}

/* Room for n more bytes at the end of the output buffer; the caller commits them. keep:
 * bytes already written past the end (a frame being built) that must move along. */
uint8_t *dsec__agent_conn_reserve_keep(struct conn *c, size_t n, size_t keep)
{
    if (c->wcap - c->wlen < n) {
        if (c->woff > 0) {
            memmove(c->wbuf, c->wbuf + c->woff, c->wlen - c->woff + keep);
            c->wlen -= c->woff;
            c->woff = 0;
        }
        if (c->wcap - c->wlen < n) {
            size_t cap = c->wcap ? c->wcap : 4096;
            while (cap - c->wlen < n)
                cap *= 2;
            c->wbuf = dsec__agent_xrealloc(c->wbuf, cap);
            c->wcap = cap;
        }
    }
    return c->wbuf + c->wlen;
}

uint8_t *dsec__agent_conn_reserve(struct conn *c, size_t n)
{
    return dsec__agent_conn_reserve_keep(c, n, 0);
}

static void resume_output(struct conn *c)
{
    for (struct cmd *m = dsec__agent_g.cmds; m; m = m->next)
        if (m->conn == c)
            cmd_resume(m);
}

static void conn_flush(struct conn *c)
{
    while (!c->dead && c->woff < c->wlen) {
        ssize_t n = c->port ? write(c->fd, c->wbuf + c->woff, c->wlen - c->woff)
                            : send(c->fd, c->wbuf + c->woff, c->wlen - c->woff,
                                   MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                if (!c->want_out) {
                    c->want_out = true;
                    dsec__agent_ep_ctl(EPOLL_CTL_MOD, c->fd,
                                       c->closing ? EPOLLOUT : EPOLLIN | EPOLLOUT, c);
                }
                return;
            }
            dsec__agent_conn_close(c); /* the peer went away */
            return;
        }
        c->woff += (size_t)n;
    }
    if (c->dead)
        return;
    c->woff = c->wlen = 0;
    if (c->wcap > BUF_KEEP && c->rlen == 0)
        c->big_idle_ns = dsec__agent_now_ns(); /* kept a while: see dsec__agent_bufs_sweep */
    if (c->closing) {
        dsec__agent_conn_close(c);
        return;
    }
    if (c->want_out) {
        c->want_out = false;
        dsec__agent_ep_ctl(EPOLL_CTL_MOD, c->fd, EPOLLIN, c);
    }
    resume_output(c);
    if (c->stalled) {
        c->stalled = false;
        conn_process(c);
    }
}

/* Commit a frame built at dsec__agent_conn_reserve's pointer and try to send it now. */
void dsec__agent_conn_commit(struct conn *c, size_t n)
{
    c->wlen += n;
    conn_flush(c);
}
void dsec__agent_send_error(struct conn *c, uint32_t id, uint32_t kind, int errnum, const char *fmt,
                            ...)
{
    if (c == NULL || c->dead)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t ml = m < 0 ? 0 : (size_t)m >= sizeof msg ? sizeof msg - 1 : (size_t)m;
    size_t plen = 4 + 4 + 4 + ml;
    uint8_t *p0 = dsec__agent_conn_reserve(c, DSEC__AGENT_HDR + plen), *p = p0;
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_ERROR, id, plen);
    p = dsec__agent_put_u32(p, kind);
    p = dsec__agent_put_u32(p, (uint32_t)errnum);
    p = dsec__agent_put_bytes(p, msg, ml);
    dsec__agent_conn_commit(c, (size_t)(p - p0));
}

/* An errno error about a path: "open \"/x\": No such file or directory". */
void dsec__agent_send_errno(struct conn *c, uint32_t id, int errnum, const char *what,
                            const char *path)
{
    dsec__agent_send_error(c, id, DSEC__AGENT_ERR_IO, errnum, "%s \"%s\": %s", what, path,
                           strerror(errnum));
}

static void send_hello(struct conn *c, uint32_t id)
{
    uint8_t *p0 = dsec__agent_conn_reserve(c, DSEC__AGENT_HDR + 8), *p = p0;
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_HELLO, id, 8);
    p = dsec__agent_put_u32(p, DSEC__AGENT_VERSION);
    p = dsec__agent_put_u32(p, DSEC__AGENT_FRAME_MAX);
    dsec__agent_conn_commit(c, (size_t)(p - p0));
}

void dsec__agent_send_ok(struct conn *c, uint32_t id, uint64_t value)
{
    uint8_t *p0 = dsec__agent_conn_reserve(c, DSEC__AGENT_HDR + 8), *p = p0;
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_OK, id, 8);
    p = dsec__agent_put_u64(p, value);
    dsec__agent_conn_commit(c, (size_t)(p - p0));
}

/* A new client starts on this connection (on a port, maybe without our having seen the last
 * one leave): nothing queued or running for the old one reaches it. */
static void handle_sync(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    if (!dsec__agent_done(r)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "sync: malformed request");
        return;
    }
    c->woff = c->wlen = 0;
    dsec__agent_procs_forget_conn(c);
    cmds_detach(c);
    send_hello(c, id);
}

/* ---- frames in ------------------------------------------------------------------------------- */

static void handle_frame(struct conn *c, uint8_t type, uint32_t id, const uint8_t *payload,
                         size_t len)
{
    dsec__agent_rd r = {.p = payload, .end = payload + len};
    switch (type) {
    case DSEC__AGENT_T_EXEC:
        dsec__agent_handle_exec(c, id, &r, false);
        break;
    case DSEC__AGENT_T_PSTART:
        dsec__agent_handle_exec(c, id, &r, true);
        break;
    case DSEC__AGENT_T_PLIST:
        dsec__agent_handle_plist(c, id, &r);
        break;
    case DSEC__AGENT_T_PSIGNAL:
        dsec__agent_handle_psignal(c, id, &r);
        break;
    case DSEC__AGENT_T_PSTDIN:
        dsec__agent_handle_pstdin(c, id, &r);
        break;
    case DSEC__AGENT_T_POUTPUT:
        dsec__agent_handle_poutput(c, id, &r);
        break;
    case DSEC__AGENT_T_PRESIZE:
        dsec__agent_handle_presize(c, id, &r);
        break;
    case DSEC__AGENT_T_KILL:
        dsec__agent_handle_kill(c, id, &r);
        break;
    case DSEC__AGENT_T_SYNC:
        handle_sync(c, id, &r);
        break;
    case DSEC__AGENT_T_SETUP:
        dsec__agent_handle_setup(c, id, &r);
        break;
    case DSEC__AGENT_T_FWRITE:
        dsec__agent_handle_fwrite(c, id, &r);
        break;
    case DSEC__AGENT_T_FREAD:
        dsec__agent_handle_fread(c, id, &r);
        break;
    case DSEC__AGENT_T_FLIST:
        dsec__agent_handle_fstat(c, id, &r, true);
        break;
    case DSEC__AGENT_T_FSTAT:
        dsec__agent_handle_fstat(c, id, &r, false);
        break;
    case DSEC__AGENT_T_FREMOVE:
        dsec__agent_handle_fremove(c, id, &r);
        break;
    case DSEC__AGENT_T_FMKDIR:
        dsec__agent_handle_fmkdir(c, id, &r);
        break;
    case DSEC__AGENT_T_FRENAME:
        dsec__agent_handle_frename(c, id, &r);
        break;
    default:
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_UNSUPPORTED, 0, "unknown request type %u",
                               type);
    }
}

/* Handle the complete frames buffered on c. A peer that sends requests without reading the
 * answers is stalled once READ_STOP bytes wait for it: its frames stay buffered, nothing more
 * is read, and conn_flush resumes here when the answers have drained. */
static void conn_process(struct conn *c)
{
    if (c->processing || c->dead)
        return;
    c->processing = true;
    size_t off = 0;
    while (!c->dead && !c->closing && c->rlen - off >= 4) {
        if (c->resync) {
            static const uint8_t sync[5] = {5, 0, 0, 0, DSEC__AGENT_T_SYNC};
            const uint8_t *hit = memmem(c->rbuf + off, c->rlen - off, sync, sizeof sync);
            if (hit == NULL) { /* keep a tail that may be the start of one */
                off = c->rlen - (c->rlen - off < 4 ? c->rlen - off : 4);
                break;
            }
            off = (size_t)(hit - c->rbuf);
            c->resync = false;
        }
        if (dsec__agent_conn_backlog(c) > READ_STOP) {
            c->stalled = true;
            c->want_out = true;
            dsec__agent_ep_ctl(EPOLL_CTL_MOD, c->fd, EPOLLOUT, c);
            break;
        }
        uint32_t len = dsec__agent_get_u32le(c->rbuf + off);
        if (len < 5 || len > DSEC__AGENT_FRAME_MAX) {
            if (c->port) { /* a port cannot be closed from here: wait for the next SYNC */
                dsec__agent_send_error(c, 0, DSEC__AGENT_ERR_BAD_FRAME, 0,
                                       "frame length %" PRIu32
                                       " out of bounds (5..%u); skipping input "
                                       "up to the next sync",
                                       len, DSEC__AGENT_FRAME_MAX);
                c->resync = true;
                off++;
                continue;
            }
            dsec__agent_send_error(c, 0, DSEC__AGENT_ERR_BAD_FRAME, 0,
                                   "frame length %" PRIu32
                                   " out of bounds (5..%u); closing the connection",
                                   len, DSEC__AGENT_FRAME_MAX);
            c->closing = true;
            c->rlen = off = 0;
            conn_flush(c);
            break;
        }
        if (c->rlen - off < 4 + (size_t)len) {
            if (c->rcap < 4 + (size_t)len) { /* room for the whole frame */
                memmove(c->rbuf, c->rbuf + off, c->rlen - off);
                c->rlen -= off;
                off = 0;
                c->rcap = 4 + (size_t)len;
                c->rbuf = dsec__agent_xrealloc(c->rbuf, c->rcap);
            }
            break;
        }
        const uint8_t *f = c->rbuf + off;
        handle_frame(c, f[4], dsec__agent_get_u32le(f + 5), f + DSEC__AGENT_HDR, len - 5);
        off += 4 + (size_t)len;
    }
    c->processing = false;
    if (c->dead)
        return;
    memmove(c->rbuf, c->rbuf + off, c->rlen - off);
    c->rlen -= off;
    if (c->rlen == 0 && c->wlen == 0 && (c->rcap > BUF_KEEP || c->wcap > BUF_KEEP))
        c->big_idle_ns = dsec__agent_now_ns(); /* kept a while: see dsec__agent_bufs_sweep */
}

/* Give back the large buffers of connections idle for BUF_IDLE_NS; the loop's timeout
 * (at most timeout_ms) until the next one is due. */
int dsec__agent_bufs_sweep(int timeout_ms)
{
    uint64_t now = dsec__agent_now_ns(), best = 0;
    for (struct conn *c = dsec__agent_g.conns; c; c = c->next) {
        if (c->big_idle_ns == 0)
            continue;
        if (c->rlen != 0 || c->wlen != 0) { /* busy again */
            c->big_idle_ns = 0;
            continue;
        }
        uint64_t due = c->big_idle_ns + BUF_IDLE_NS;
        if (due > now) {
            best = best == 0 || due < best ? due : best;
            continue;
        }
        if (c->rcap > BUF_KEEP) {
            free(c->rbuf);
            c->rbuf = NULL;
            c->rcap = 0;
        }
        if (c->wcap > BUF_KEEP) {
            free(c->wbuf);
            c->wbuf = NULL;
            c->wcap = 0;
        }
        c->big_idle_ns = 0;
    }
    if (best == 0)
        return timeout_ms;
    int ms = (int)((best - now + 999999u) / 1000000u);
    return timeout_ms < 0 || ms < timeout_ms ? ms : timeout_ms;
}

void dsec__agent_on_conn(struct conn *c, uint32_t events)
{
    if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR))
        conn_flush(c); /* a gone peer shows here as EPIPE */
    if (c->dead || c->closing || c->stalled || !(events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        return;
    if (c->rcap - c->rlen < 65536) {
        c->rcap = c->rlen + 65536;
        c->rbuf = dsec__agent_xrealloc(c->rbuf, c->rcap);
    }
    /* A port reads 0 once the host is not connected and nothing is buffered. */
    ssize_t n = c->port ? read(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen)
                        : recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        dsec__agent_conn_close(c);
        return;
    }
    c->rlen += (size_t)n;
    conn_process(c);
}

/* Start serving fd (accepted, or a port whose host just connected) and greet the peer.
 * epoll_op adds fd to the loop (a new socket) or modifies its registration (a port). */
struct conn *dsec__agent_conn_new(int fd, struct port *port, int epoll_op)
{
    struct conn *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->kind = K_CONN;
    c->fd = fd;
    c->port = port;
    c->next = dsec__agent_g.conns;
    if (dsec__agent_g.conns)
        dsec__agent_g.conns->prev = c;
    dsec__agent_g.conns = c;
    dsec__agent_ep_ctl(epoll_op, fd, EPOLLIN, c);
    send_hello(c, 0);
    return c;
}

void dsec__agent_on_listen(void)
{
    for (;;) {
        int fd = accept4(dsec__agent_g.listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN)
                dsec__agent_logmsg("accept: %s", strerror(errno));
            return;
        }
        if (dsec__agent_conn_new(fd, NULL, EPOLL_CTL_ADD) == NULL)
            close(fd);
    }
}
