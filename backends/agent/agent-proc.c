/* agent-proc.c - background processes (PSTART): the table, their rings, the requests on them */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/agent/agent-int.h"

/* c goes (or a new client starts on it): PSTDIN answers and held POUTPUTs waiting for it are
 * not sent. The bytes still go to their processes. */
void dsec__agent_procs_forget_conn(const struct conn *c)
{
    for (size_t i = 0; i < dsec__agent_g.nprocs; i++) {
        if (dsec__agent_g.procs[i]->in_conn == c)
            dsec__agent_g.procs[i]->in_conn = NULL;
        if (dsec__agent_g.procs[i]->sess)
            dsec__agent_sess_forget_conn(dsec__agent_g.procs[i], c);
    }
    for (struct waiter **w = &dsec__agent_g.waiters; *w;) {
        if ((*w)->conn == c) {
            struct waiter *d = *w;
            *w = d->next;
            free(d);
        } else {
            w = &(*w)->next;
        }
    }
}

/* Keep the last cap bytes of data in r. */
void dsec__agent_ring_put(struct ring *r, const uint8_t *data, size_t n)
{
    size_t k = n < r->cap ? n : r->cap;
    uint64_t end = r->total + n;
    size_t need = end < r->cap ? (size_t)end : r->cap;
    if (r->alloc < need) { /* nothing wrapped yet: offsets are positions */
        size_t a = r->alloc ? r->alloc : 4096;
        while (a < need)
            a *= 2;
        r->alloc = a < r->cap ? a : r->cap;
        r->buf = dsec__agent_xrealloc(r->buf, r->alloc);
    }
    const uint8_t *src = data + (n - k);
    size_t pos = (size_t)((end - k) % r->cap), first = r->cap - pos < k ? r->cap - pos : k;
    memcpy(r->buf + pos, src, first);
    memcpy(r->buf, src + first, k - first);
    r->total = end;
}

/* The stream offset of the oldest byte r holds. */
static uint64_t ring_from(const struct ring *r)
{
    return r->total > r->cap ? r->total - r->cap : 0;
}

/* Copy n held bytes from stream offset from (ring_from <= from, from + n <= total). */
static void ring_get(const struct ring *r, uint64_t from, size_t n, uint8_t *dst)
{
    size_t pos = (size_t)(from % r->cap), first = r->cap - pos < n ? r->cap - pos : n;
    memcpy(dst, r->buf + pos, first);
    memcpy(dst + first, r->buf, n - first);
}

static uint64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A background process's main process ended and its tree is gone: record how; a PSTDIN still
 * waiting gets its answer. It stays listed until evicted. */
void dsec__agent_proc_ended(struct proc *p, struct cmd *m, int status, uint64_t end)
{
    p->cmd = NULL;
    p->running = p->stdin_open = false;
    p->timed_out = m->timed_out;
    p->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    p->sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    uint64_t mono = dsec__agent_now_ns(), wall = wall_ns();
    p->ended_ns = wall - (mono > end ? mono - end : 0);
    if (p->in_conn)
        dsec__agent_send_error(p->in_conn, p->in_id, DSEC__AGENT_ERR_INVALID, 0,
                               "process %" PRIu64
                               " ended before it took all of its stdin (%zu bytes left)",
                               p->handle, m->in_len - m->in_off);
    p->in_conn = NULL;
    if (p->sess)
        dsec__agent_sess_ended(p, status);
}

/* A background process's pending stdin went in (all of it, or all but left bytes when it
 * closed its end): answer the PSTDIN waiting, close stdin if asked or broken, stop watching. */
void dsec__agent_proc_stdin_taken(struct proc *p, struct cmd *m, size_t left)
{
    bool all = left == 0;
    free(m->in);
    m->in = NULL;
    m->in_len = m->in_off = 0;
    if (!all || p->in_close) {
        dsec__agent_pipe_close(&m->io[0]);
        p->stdin_open = false;
    } else {
        dsec__agent_ep_ctl(EPOLL_CTL_DEL, m->io[0].fd, 0, NULL);
    }
    if (p->in_conn) {
        if (all)
            dsec__agent_send_ok(p->in_conn, p->in_id, 0);
        else
            dsec__agent_send_error(p->in_conn, p->in_id, DSEC__AGENT_ERR_INVALID, EPIPE,
                                   "process %" PRIu64 " closed its stdin with %zu bytes not taken",
                                   p->handle, left);
    }
    p->in_conn = NULL;
    p->in_close = false;
}

/* ---- background processes: the table ----------------------------------------------------------
 */

void dsec__agent_proc_free(struct proc *p)
{
    free(p->sess);
    free(p->ring[0].buf);
    free(p->ring[1].buf);
    free(p);
}

/* Whether one more process fits the table, making room by forgetting the oldest ended one. */
bool dsec__agent_procs_room(void)
{
    if (dsec__agent_g.nprocs < dsec__agent_g.proc_max)
        return true;
    for (size_t i = 0; i < dsec__agent_g.nprocs; i++)
        if (!dsec__agent_g.procs[i]->running) {
            dsec__agent_proc_free(dsec__agent_g.procs[i]);
            memmove(dsec__agent_g.procs + i, dsec__agent_g.procs + i + 1,
                    (dsec__agent_g.nprocs - i - 1) * sizeof *dsec__agent_g.procs);
            dsec__agent_g.nprocs--;
            return true;
        }
    return false;
}

/* A new entry for m, started now (dsec__agent_procs_room said there is room). */
struct proc *dsec__agent_proc_new(struct cmd *m, char **argv, uint64_t ring_max)
{
    struct proc *p = dsec__agent_xrealloc(NULL, sizeof *p);
    memset(p, 0, sizeof *p);
    p->handle = dsec__agent_g.next_handle++;
    p->cmd = m;
    p->pid = m->pgid;
    p->running = true;
    p->started_ns = wall_ns();
    for (int s = 0; s < 2; s++)
        p->ring[s].cap = ring_max ? (size_t)ring_max : DSEC__AGENT_RING_DEFAULT;
    size_t n = 0;
    for (size_t i = 0; argv[i] && n < DSEC__AGENT_CMDLINE_MAX; i++) {
        if (i > 0)
            p->cmdline[n++] = ' ';
        size_t l = strlen(argv[i]);
        if (l > DSEC__AGENT_CMDLINE_MAX - n)
            l = DSEC__AGENT_CMDLINE_MAX - n;
        memcpy(p->cmdline + n, argv[i], l);
        n += l;
    }
    p->cmdline[n] = 0;
    if (dsec__agent_g.procs == NULL)
        dsec__agent_g.procs =
            dsec__agent_xrealloc(NULL, dsec__agent_g.proc_max * sizeof *dsec__agent_g.procs);
    dsec__agent_g.procs[dsec__agent_g.nprocs++] = p;
    return p;
}

struct proc *dsec__agent_proc_by_handle(uint64_t handle)
{
    size_t lo = 0, hi = dsec__agent_g.nprocs; /* sorted: handles only grow */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (dsec__agent_g.procs[mid]->handle == handle)
            return dsec__agent_g.procs[mid];
        if (dsec__agent_g.procs[mid]->handle < handle)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static size_t proc_info_len(const struct proc *p)
{
    return 8 + 4 + 1 + 4 + 4 + 8 + 8 + 8 + 8 + 4 + strlen(p->cmdline);
}

static uint8_t *put_proc_info(uint8_t *o, const struct proc *p)
{
    o = dsec__agent_put_u64(o, p->handle);
    o = dsec__agent_put_u32(o, (uint32_t)p->pid);
    o = dsec__agent_put_u8(o, (uint8_t)((p->running ? DSEC__AGENT_P_RUNNING : 0) |
                                        (p->stdin_open ? DSEC__AGENT_P_STDIN_OPEN : 0) |
                                        (p->timed_out ? DSEC__AGENT_P_TIMED_OUT : 0) |
                                        (p->pty ? DSEC__AGENT_P_PTY : 0) |
                                        (p->sess ? DSEC__AGENT_P_SESSION : 0) |
                                        (p->sess && p->sess->busy ? DSEC__AGENT_P_BUSY : 0)));
    o = dsec__agent_put_u32(o, (uint32_t)(p->running ? 0 : p->exit_code));
    o = dsec__agent_put_u32(o, (uint32_t)(p->running ? 0 : p->sig));
    o = dsec__agent_put_u64(o, p->started_ns);
    o = dsec__agent_put_u64(o, p->ended_ns);
    o = dsec__agent_put_u64(o, p->ring[0].total);
    o = dsec__agent_put_u64(o, p->ring[1].total);
    return dsec__agent_put_bytes(o, p->cmdline, strlen(p->cmdline));
}

/* A PROC frame: one process's info. */
void dsec__agent_send_proc(struct conn *c, uint32_t id, uint8_t type, const struct proc *p)
{
    size_t plen = proc_info_len(p);
    uint8_t *p0 = dsec__agent_conn_reserve(c, DSEC__AGENT_HDR + plen), *o = p0;
    o = dsec__agent_put_hdr(o, type, id, plen);
    o = put_proc_info(o, p);
    dsec__agent_conn_commit(c, (size_t)(o - p0));
}

/* ---- background processes: the requests --------------------------------------------------------
 */

/* The process a request names, or NULL with the error sent. */
static struct proc *get_proc(struct conn *c, uint32_t id, uint64_t handle, const char *op)
{
    struct proc *p = dsec__agent_proc_by_handle(handle);
    if (p == NULL)
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_NOT_FOUND, 0,
                               "%s: no process with handle %" PRIu64 " in this sandbox", op,
                               handle);
    return p;
}

void dsec__agent_handle_presize(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    uint64_t handle = dsec__agent_get_u64(r);
    uint32_t rows = dsec__agent_get_u32(r), cols = dsec__agent_get_u32(r);
    if (!dsec__agent_done(r)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "resize: malformed request");
        return;
    }
    if (rows < 1 || cols < 1 || rows > 65535 || cols > 65535) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                               "resize: a window of %" PRIu32 " x %" PRIu32 " (1..65535 each)",
                               rows, cols);
        return;
    }
    struct proc *p = get_proc(c, id, handle, "resize");
    if (p == NULL)
        return;
    if (!p->pty) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                               "resize: process %" PRIu64 " has no terminal", handle);
        return;
    }
    if (!p->running || p->cmd == NULL || p->cmd->io[1].fd < 0) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_STATE, 0,
                               "resize: process %" PRIu64 " has ended", handle);
        return;
    }
    struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
    if (ioctl(p->cmd->io[1].fd, TIOCSWINSZ, &ws) < 0) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_IO, errno, "resize: process %" PRIu64 ": %s",
                               handle, strerror(errno));
        return;
    }
    dsec__agent_send_ok(c, id, 0);
}

void dsec__agent_handle_plist(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    if (!dsec__agent_done(r)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
                               "list processes: malformed request");
        return;
    }
    size_t plen = 4;
    for (size_t i = 0; i < dsec__agent_g.nprocs; i++)
        plen += proc_info_len(dsec__agent_g.procs[i]);
    uint8_t *p0 = dsec__agent_conn_reserve(c, DSEC__AGENT_HDR + plen), *o = p0;
    o = dsec__agent_put_hdr(o, DSEC__AGENT_T_PROCS, id, plen);
    o = dsec__agent_put_u32(o, (uint32_t)dsec__agent_g.nprocs);
    for (size_t i = 0; i < dsec__agent_g.nprocs; i++)
        o = put_proc_info(o, dsec__agent_g.procs[i]);
    dsec__agent_conn_commit(c, (size_t)(o - p0));
}

/* How an ended process ended, for messages: "with code 3", "by signal 15". */
static const char *proc_how(const struct proc *p, char *buf, size_t size)
{
    if (p->sig)
        snprintf(buf, size, "by signal %d (%s)%s", (int)p->sig, strsignal(p->sig),
                 p->timed_out ? " at its timeout" : "");
    else
        snprintf(buf, size, "with code %d", (int)p->exit_code);
    return buf;
}

/* The running process a request names, or NULL with the error sent: no process has the
 * handle, or it ended (an error of kind, saying "process N <ended> how"). */
static struct proc *get_running(struct conn *c, uint32_t id, uint64_t handle, const char *op,
                                uint32_t kind, const char *ended)
{
    struct proc *p = get_proc(c, id, handle, op);
    if (p != NULL && !p->running) {
        char how[96];
        dsec__agent_send_error(c, id, kind, 0, "%s: process %" PRIu64 " %s %s", op, handle, ended,
                               proc_how(p, how, sizeof how));
        return NULL;
    }
    return p;
}

void dsec__agent_handle_psignal(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    uint64_t handle = dsec__agent_get_u64(r);
    uint32_t sig = dsec__agent_get_u32(r);
    if (!dsec__agent_done(r)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "signal: malformed request");
        return;
    }
    if (sig < 1 || sig > (uint32_t)SIGRTMAX) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "signal: no signal %" PRIu32,
                               sig);
        return;
    }
    struct proc *p = get_running(c, id, handle, "signal", DSEC__AGENT_ERR_STATE, "already exited");
    if (p == NULL)
        return;
    struct cmd *m = p->cmd;
    if (p->sess && sig == SIGINT) { /* the running command only; idle: nothing to do */
        if (p->sess->busy) {
            p->sess->interrupted = true;
            dsec__agent_sess_interrupt(p);
            dsec__agent_sess_tick(p, dsec__agent_now_ns());
        }
        dsec__agent_send_ok(c, id, 0);
        return;
    }
    if (sig == SIGKILL) { /* as at a timeout: its shepherd kills the rest of its tree */
        dsec__agent_cmd_end(m);
    } else {
        /* the group; when the main process exits, its shepherd ends the rest of the tree */
        kill(-m->pgid, (int)sig);
    }
    dsec__agent_send_ok(c, id, 0);
}

/* Queue n bytes for m's stdin behind what is pending; the pipe is watched for room from the
 * first pending byte on (on_pipe writes them). */
static void stdin_queue(struct cmd *m, const uint8_t *data, size_t n)
{
    size_t rest = m->in ? m->in_len - m->in_off : 0;
    uint8_t *b = dsec__agent_xrealloc(NULL, rest + n);
    if (rest)
        memcpy(b, m->in + m->in_off, rest);
    memcpy(b + rest, data, n);
    bool watched = m->in != NULL;
    free(m->in);
    m->in = b;
    m->in_off = 0;
    m->in_len = rest + n;
    if (!watched)
        dsec__agent_ep_ctl(EPOLL_CTL_ADD, m->io[0].fd, EPOLLOUT, &m->io[0]);
}

/* Queue bytes for the stdin of p's command (a session's shell): straight into the pipe as far
 * as it takes them, the rest behind what is pending (written on EPOLLOUT, answered to nobody). */
void dsec__agent_proc_feed(struct proc *p, const uint8_t *data, size_t len)
{
    struct cmd *m = p->cmd;
    if (m == NULL || m->io[0].fd < 0)
        return;
    size_t off = 0;
    if (m->in == NULL) {
        while (off < len) {
            ssize_t n = write(m->io[0].fd, data + off, len - off);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                break;
            off += (size_t)n;
        }
        if (off == len || errno != EAGAIN)
            return; /* all in, or the shell closed its stdin (it is ending) */
    }
    stdin_queue(m, data + off, len - off);
}

void dsec__agent_handle_pstdin(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    uint64_t handle = dsec__agent_get_u64(r);
    bool close_after = dsec__agent_get_u8(r) != 0;
    size_t len;
    const uint8_t *data = dsec__agent_get_bytes(r, DSEC__AGENT_STDIN_MAX, &len);
    if (!dsec__agent_done(r)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
                               "stdin: malformed request or more than %u bytes",
                               DSEC__AGENT_STDIN_MAX);
        return;
    }
    struct proc *p = get_running(c, id, handle, "stdin", DSEC__AGENT_ERR_INVALID, "ended");
    if (p == NULL)
        return;
    struct cmd *m = p->cmd;
    if (p->sess) {
        dsec__agent_send_error(
            c, id, DSEC__AGENT_ERR_INVALID, 0,
            "stdin: process %" PRIu64 " is a shell session; run commands in it with exec", handle);
        return;
    }
    uint8_t *eot = NULL; /* a terminal's close: ^D, as typed (the terminal stays) */
    if (p->pty && close_after) {
        eot = dsec__agent_xrealloc(NULL, len + 1);
        if (len)
            memcpy(eot, data, len);
        eot[len++] = 4;
        data = eot;
        close_after = false;
    }
    if (!p->stdin_open || m->io[0].fd < 0 || p->in_close) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                               "stdin: the stdin of process %" PRIu64 " is closed", handle);
        goto out;
    }
    if (p->in_conn) {
        dsec__agent_send_error(
            c, id, DSEC__AGENT_ERR_STATE, 0,
            "stdin: process %" PRIu64
            " has not taken the bytes of an earlier write yet; wait for its answer",
            handle);
        goto out;
    }
    if (m->in_len - m->in_off + len > DSEC__AGENT_STDIN_MAX) { /* bytes of PSTART still pending */
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_TOO_LARGE, 0,
                               "stdin: process %" PRIu64 " has %zu bytes pending, at most %u",
                               handle, m->in_len - m->in_off, DSEC__AGENT_STDIN_MAX);
        goto out;
    }
    size_t off = 0;
    bool broken = false;
    if (m->in == NULL) { /* straight into the pipe as far as it takes them */
        while (off < len) {
            ssize_t n = write(m->io[0].fd, data + off, len - off);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0) {
                broken = errno != EAGAIN;
                break;
            }
            off += (size_t)n;
        }
    }
    p->in_conn = c;
    p->in_id = id;
    p->in_close = close_after;
    /* The rest waits for the process, and the answer with it; so do these bytes (even none)
     * behind bytes still pending from PSTART or a writer that left. */
    if (m->in != NULL || (off < len && !broken)) {
        stdin_queue(m, data + off, len - off);
        goto out;
    }
    dsec__agent_proc_stdin_taken(p, m, broken ? len - off : 0);
out:
    free(eot);
}

/* A POUT of p's streams from off (clamped to what the rings hold), at most max per stream. */
static void send_pout(struct conn *c, uint32_t id, const struct proc *p, const uint64_t off[2],
                      uint64_t max)
{
    if (c == NULL || c->dead)
        return;
    /* What a running process wrote so far, up to the last byte the pipes gave. */
    uint64_t from[2];
    size_t n[2];
    for (int s = 0; s < 2; s++) {
        const struct ring *rg = &p->ring[s];
        from[s] = off[s] < ring_from(rg) ? ring_from(rg) : off[s] > rg->total ? rg->total : off[s];
        uint64_t avail = rg->total - from[s];
        if (max && avail > max)
            avail = max;
        n[s] = (size_t)(avail > DSEC__AGENT_POUT_MAX ? DSEC__AGENT_POUT_MAX : avail);
    }
    size_t plen = proc_info_len(p) + 8 + 4 + n[0] + 8 + 4 + n[1];
    uint8_t *p0 = dsec__agent_conn_reserve(c, DSEC__AGENT_HDR + plen), *o = p0;
    o = dsec__agent_put_hdr(o, DSEC__AGENT_T_POUT, id, plen);
    o = put_proc_info(o, p);
    for (int s = 0; s < 2; s++) {
        o = dsec__agent_put_u64(o, from[s]);
        o = dsec__agent_put_u32(o, (uint32_t)n[s]);
        if (n[s])
            ring_get(&p->ring[s], from[s], n[s], o);
        o += n[s];
    }
    dsec__agent_conn_commit(c, (size_t)(o - p0));
}

/* Whether a POUTPUT on p from off has nothing to wait for. */
static bool pout_ready(const struct proc *p, const uint64_t off[2])
{
    return !p->running || p->ring[0].total > off[0] || p->ring[1].total > off[1];
}

void dsec__agent_handle_poutput(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    uint64_t handle = dsec__agent_get_u64(r);
    uint64_t off[2];
    off[0] = dsec__agent_get_u64(r);
    off[1] = dsec__agent_get_u64(r);
    uint64_t max = dsec__agent_get_u64(r);
    uint32_t wait_ms = r->p < r->end ? dsec__agent_get_u32(r) : 0; /* absent in older requests */
    if (!dsec__agent_done(r)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "output: malformed request");
        return;
    }
    if (wait_ms > DSEC__AGENT_WAIT_MAX_MS) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                               "output: wait of %" PRIu32 " ms is over the limit of %u ms", wait_ms,
                               DSEC__AGENT_WAIT_MAX_MS);
        return;
    }
    struct proc *p = get_proc(c, id, handle, "output");
    if (p == NULL)
        return;
    if (wait_ms == 0 || pout_ready(p, off)) {
        send_pout(c, id, p, off, max);
        return;
    }
    struct waiter *w = dsec__agent_xrealloc(NULL, sizeof *w);
    *w = (struct waiter){.conn = c,
                         .id = id,
                         .handle = handle,
                         .off = {off[0], off[1]},
                         .max = max,
                         .deadline_ns = dsec__agent_now_ns() + (uint64_t)wait_ms * 1000000u,
                         .next = dsec__agent_g.waiters};
    dsec__agent_g.waiters = w;
}

/* Answer the held POUTPUTs that have something (or waited enough). They are taken off the
 * list first: an answer may close a connection, which drops its waiters from the list. */
void dsec__agent_waiters_run(void)
{
    uint64_t now = dsec__agent_now_ns();
    struct waiter *ready = NULL;
    for (struct waiter **w = &dsec__agent_g.waiters; *w;) {
        struct proc *p = dsec__agent_proc_by_handle((*w)->handle);
        if (p == NULL || pout_ready(p, (*w)->off) || now >= (*w)->deadline_ns) {
            struct waiter *d = *w;
            *w = d->next;
            d->next = ready;
            ready = d;
        } else {
            w = &(*w)->next;
        }
    }
    while (ready) {
        struct waiter *d = ready;
        ready = d->next;
        struct proc *p = dsec__agent_proc_by_handle(d->handle);
        if (p == NULL) /* forgotten meanwhile (the table was full) */
            dsec__agent_send_error(d->conn, d->id, DSEC__AGENT_ERR_NOT_FOUND, 0,
                                   "output: process %" PRIu64 " was forgotten while waited for",
                                   d->handle);
        else
            send_pout(d->conn, d->id, p, d->off, d->max);
        free(d);
    }
}
