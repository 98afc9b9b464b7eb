/* agent.c - dsec-agent: the static init of a container or microVM sandbox that runs commands and
 * file operations for the node manager over a unix socket or virtio-serial port (agent-proto.h) */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/reboot.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/agent/agent-proto.h"
#include "backends/agent/agent-watch.h"

#ifdef DSEC_AGENT_FUZZ
/* fuzz/fuzz_agent.c compiles this file in. Requests are decoded and commands prepared and forked
 * for real, but no program ever runs: execve always fails as for a missing file, so the child
 * walks the PATH search and reports the failure (exit 127). main is renamed out of the way. */
static int fuzz_execve(const char *file, char *const argv[], char *const envp[])
{
    (void)file;
    (void)argv;
    (void)envp;
    errno = ENOENT;
    return -1;
}
#define execve fuzz_execve
#define main dsec__agent_main
int dsec__agent_main(int argc, char **argv);
#endif

/*
 * One thread, one epoll loop. Everything the loop watches starts with a
 * `kind` field so an event finds its object. Objects that die during a batch
 * of events are only unlinked and marked dead; they are freed after the
 * batch, so a later event of the same batch never touches freed memory.
 *
 * The agent is self-contained (libc only) because it is linked statically and
 * copied into sandboxes. It never exits on bad input: a broken frame costs the
 * connection that sent it, nothing more.
 *
 * Commands are started with vfork: the agent is tiny, but vfork skips even the
 * page-table copy, and the child only makes system calls on memory the parent
 * prepared before exec'ing.
 *
 * In a microVM the agent is PID 1 and serves virtio-serial ports instead of a
 * socket (--port / --port-name). A port is one connection slot: the host side
 * is a QEMU unix-socket chardev, and the guest kernel reports whether a host
 * client is connected (poll: POLLHUP while none is, POLLOUT once one is). The
 * port is watched edge-triggered while no connection is served (POLLHUP is
 * level and would spin the loop), and level-triggered, as a socket, while one
 * is. When the host disconnects, the connection's unsent answers are dropped
 * and the port is closed and reopened, which makes the kernel discard what the
 * old client sent and we did not read, so nothing of one host connection
 * reaches the next. QEMU discards what the guest wrote but the host did not
 * read yet.
 *
 * The guest kernel offers no connection counter, and QEMU accepts the next
 * client microseconds after the last one left, so a disconnect and a
 * reconnect often reach the guest together and look like no change at all.
 * A client therefore starts with SYNC (its id a random nonce): the agent
 * drops whatever it still had queued for the connection, detaches the
 * connection's commands (their output then goes nowhere, as after a
 * disconnect) and answers with a HELLO whose id is the nonce. The client
 * discards every byte before that 17-byte HELLO, so stale frames, even a
 * partly sent one, never reach it as answers.
 */

#define SOCK_BACKLOG 128
#define WBUF_HIGH (1u << 20)  /* stop reading a command's output while this much waits to go out */
#define READ_STOP (16u << 20) /* stop reading requests from a peer that does not read answers */
#define DRAIN_MAX (1u << 20)  /* most output read from one stream after its command exited */
#define BUF_KEEP (256u << 10) /* larger idle connection buffers are given back */
/* ... once idle this long: a transfer's next piece reuses them (fresh pages fault in, and a
 * fault costs 2-13 us on some hosts: 1,000 of them per 4 MiB piece) */
#define BUF_IDLE_NS (1000000000ull)
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define PORTS_MAX 8
#define PORT_WAIT_MS 10000 /* how long --port-name waits for its port to appear */
#ifdef DSEC_AGENT_FUZZ
#define SHEP_IDLE_MAX 0 /* the harness waits for each command's shepherd to exit */
#else
#define SHEP_IDLE_MAX 4 /* idle shepherds kept for the next commands (see "exec cleanup") */
#endif

enum { K_LISTEN = 1, K_SIGNAL, K_CONN, K_PIPE, K_PORT };

struct cmd;
struct port;
struct proc;

struct conn {
    int kind; /* K_CONN */
    int fd;
    bool dead, closing, want_out;
    bool processing;   /* inside conn_process */
    bool stalled;      /* requests wait until the answers drain */
    bool resync;       /* port connections: framing was lost; input is skipped up to a SYNC */
    struct port *port; /* the virtio-serial port it is served on, or NULL for a socket */
    uint8_t *rbuf;
    size_t rlen, rcap;
    uint8_t *wbuf;
    size_t woff, wlen, wcap;
    uint64_t big_idle_ns; /* when its large buffers last went idle; 0: in use or small */
    struct conn *next, *prev;
    struct conn *next_dead;
};

struct pipe_ep {
    int kind;   /* K_PIPE */
    int fd;     /* the agent's end, or -1 once closed */
    int stream; /* 0 stdin, 1 stdout, 2 stderr, 3 the shepherd's report */
    bool paused;
    struct cmd *cmd;
};

/* A virtio-serial port: one host connection at a time. */
struct port {
    int kind; /* K_PORT */
    int fd;   /* the open port, or -1 while it could not be reopened */
    char path[PATH_MAX];
    struct conn *conn; /* the host connection being served, or NULL */
};

struct cmd {
    struct conn *conn; /* NULL once the connection is gone: output is then discarded */
    struct proc *proc; /* a background process (PSTART): its output goes to its rings */
    uint32_t id;
    pid_t pid;  /* its shepherd, the agent's child (see "exec cleanup"); 0 once gone or idle */
    pid_t pgid; /* the main process: also its process group and session id (setsid) */
    struct pipe_ep io[3];
    struct pipe_ep rep;    /* stream 3: the shepherd's report (struct shep_report) */
    bool doomed;           /* the agent ends it (timeout, KILL, SIGTERM): its whole tree goes */
    bool main_reaped;      /* the main process, orphaned by its shepherd, was reaped here: */
    int main_status;       /* its status, */
    struct rusage main_ru; /* and its usage */
    uint8_t *in;
    size_t in_len, in_off;
    uint64_t out_max;
    uint64_t seen[3]; /* bytes read per stream, sent or not */
    uint64_t start_ns, deadline_ns;
    bool exited, timed_out, dead;
    struct cmd *next, *prev;
    struct cmd *next_dead;
};

/* The last bytes of one stream of a background process: stream offset o is at buf[o % cap].
 * buf grows up to cap as bytes come, so a quiet process costs little. */
struct ring {
    uint8_t *buf;
    size_t cap, alloc;
    uint64_t total; /* bytes the stream produced in all */
};

/* A background process (PSTART), kept after it ended until evicted. */
struct proc {
    uint64_t handle;
    struct cmd *cmd; /* while it runs */
    pid_t pid;
    bool running, stdin_open, timed_out;
    int32_t exit_code, sig;
    uint64_t started_ns, ended_ns; /* CLOCK_REALTIME */
    struct ring ring[2];           /* stdout, stderr */
    char cmdline[DSEC__AGENT_CMDLINE_MAX + 1];
    /* A PSTDIN answered once its bytes (the command's pending stdin) are taken. */
    struct conn *in_conn; /* NULL: nobody to answer (none waits, or its connection left) */
    uint32_t in_id;
    bool in_close; /* close stdin once the pending bytes are taken */
    bool pty;      /* on a pseudo-terminal: its master is the command's io[1] (and io[0]) */
    struct sess *sess; /* a shell session (PSTART's session flag) */
};

/* A POUTPUT held until its process has output past the offsets asked, ends, or the wait
 * passes (waiters_run, after each batch of events). */
struct waiter {
    struct conn *conn;
    uint32_t id;
    uint64_t handle, off[2], max, deadline_ns;
    struct waiter *next;
};

/* What a shepherd answers a command with on its socket: first the main process's pid (pid_t;
 * a negative errno when it could not be started), then, once the command's whole tree is
 * gone, this. */
struct shep_report {
    int32_t status;   /* the main process's wait status */
    uint64_t exit_ns; /* when it exited (CLOCK_MONOTONIC) */
    struct rusage ru; /* its resource usage, as wait4 gives it */
    int32_t reusable; /* the shepherd waits for another command */
};

static struct {
    int ep;
    int listen_fd;
    int sig_fd;
    int null_fd; /* /dev/null, the stdin of commands given none */
    int listen_kind, sig_kind;
    char *listen_path; /* unlinked at exit when we bound it */
    char **base_env;
    size_t nbase_env;
    const char *workdir;
    const char *default_user;
    bool set_up; /* SETUP was answered: the defaults are final */
    /* The descriptor limit the agent was given, which commands get back: the agent raises its
     * own soft limit to the hard one, as each background process holds 3 or 4 descriptors
     * (DSEC__AGENT_PROC_MAX of them would not fit the usual 1024). */
    struct rlimit nofile;
    bool nofile_raised;
    struct conn *conns;
    struct cmd *cmds;
    struct proc **procs; /* background processes, by handle */
    size_t nprocs, proc_max;
    uint64_t next_handle;
    struct conn *dead_conns;
    struct cmd *dead_cmds;
    struct waiter *waiters; /* held POUTPUTs */
    struct port ports[PORTS_MAX];
    size_t nports;
    struct {
        pid_t pid;
        int fd;
    } idle[SHEP_IDLE_MAX > 0 ? SHEP_IDLE_MAX : 1]; /* shepherds waiting for a command */
    size_t nidle;
    bool terminating;
} g = {.ep = -1,
       .listen_fd = -1,
       .sig_fd = -1,
       .null_fd = -1,
       .proc_max = DSEC__AGENT_PROC_MAX,
       .next_handle = 1,
       .listen_kind = K_LISTEN,
       .sig_kind = K_SIGNAL};

static uint8_t iobuf[DSEC__AGENT_CHUNK];

static void logmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logmsg(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("dsec-agent: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL) {
        logmsg("out of memory (%zu bytes)", n);
        abort();
    }
    return q;
}

static char *xstrndup(const char *s, size_t n)
{
    char *d = xrealloc(NULL, n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void ep_ctl(int op, int fd, uint32_t events, void *ptr)
{
    struct epoll_event ev = {.events = events, .data.ptr = ptr};
    if (epoll_ctl(g.ep, op, fd, &ev) < 0 && op != EPOLL_CTL_DEL)
        logmsg("epoll_ctl(%d, fd %d): %s", op, fd, strerror(errno));
}

/* ---- connections: buffered, non-blocking frame output --------------------------------------- */

static void port_lost(struct port *p);

/* c goes (or a new client starts on it): PSTDIN answers waiting for it are not sent. The
 * bytes still go to their processes. */
static void sess_forget_conn(struct proc *p, const struct conn *c);

static void procs_forget_conn(const struct conn *c)
{
    for (size_t i = 0; i < g.nprocs; i++) {
        if (g.procs[i]->in_conn == c)
            g.procs[i]->in_conn = NULL;
        if (g.procs[i]->sess)
            sess_forget_conn(g.procs[i], c);
    }
    for (struct waiter **w = &g.waiters; *w;) {
        if ((*w)->conn == c) {
            struct waiter *d = *w;
            *w = d->next;
            free(d);
        } else {
            w = &(*w)->next;
        }
    }
}

static void conn_close(struct conn *c)
{
    if (c->dead)
        return;
    c->dead = true;
    ep_ctl(EPOLL_CTL_DEL, c->fd, 0, NULL);
    close(c->fd);
    c->fd = -1;
    if (c->prev)
        c->prev->next = c->next;
    else
        g.conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->next_dead = g.dead_conns;
    g.dead_conns = c;
    procs_forget_conn(c);
    /* Its commands run on; their output has nowhere to go and is read and dropped. */
    for (struct cmd *m = g.cmds; m; m = m->next)
        if (m->conn == c) {
            m->conn = NULL;
            for (int s = 1; s <= 2; s++)
                if (m->io[s].paused && m->io[s].fd >= 0) {
                    m->io[s].paused = false;
                    ep_ctl(EPOLL_CTL_MOD, m->io[s].fd, EPOLLIN, &m->io[s]);
                }
        }
    if (c->port)
        port_lost(c->port);
}

static size_t conn_backlog(const struct conn *c)
{
    return c->wlen - c->woff;
}

/* Room for n more bytes at the end of the output buffer; the caller commits them. keep:
 * bytes already written past the end (a frame being built) that must move along. */
static uint8_t *conn_reserve_keep(struct conn *c, size_t n, size_t keep)
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
            c->wbuf = xrealloc(c->wbuf, cap);
            c->wcap = cap;
        }
    }
    return c->wbuf + c->wlen;
}

static uint8_t *conn_reserve(struct conn *c, size_t n)
{
    return conn_reserve_keep(c, n, 0);
}

static void resume_output(struct conn *c)
{
    for (struct cmd *m = g.cmds; m; m = m->next)
        if (m->conn == c)
            for (int s = 1; s <= 2; s++)
                if (m->io[s].paused && m->io[s].fd >= 0) {
                    m->io[s].paused = false;
                    ep_ctl(EPOLL_CTL_MOD, m->io[s].fd, EPOLLIN, &m->io[s]);
                }
}

static void conn_process(struct conn *c);

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
                    ep_ctl(EPOLL_CTL_MOD, c->fd, c->closing ? EPOLLOUT : EPOLLIN | EPOLLOUT, c);
                }
                return;
            }
            conn_close(c); /* the peer went away */
            return;
        }
        c->woff += (size_t)n;
    }
    if (c->dead)
        return;
    c->woff = c->wlen = 0;
    if (c->wcap > BUF_KEEP && c->rlen == 0)
        c->big_idle_ns = now_ns(); /* kept a while: see bufs_sweep */
    if (c->closing) {
        conn_close(c);
        return;
    }
    if (c->want_out) {
        c->want_out = false;
        ep_ctl(EPOLL_CTL_MOD, c->fd, EPOLLIN, c);
    }
    resume_output(c);
    if (c->stalled) {
        c->stalled = false;
        conn_process(c);
    }
}

/* Commit a frame built at conn_reserve's pointer and try to send it now. */
static void conn_commit(struct conn *c, size_t n)
{
    c->wlen += n;
    conn_flush(c);
}

static void send_error(struct conn *c, uint32_t id, uint32_t kind, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void send_error(struct conn *c, uint32_t id, uint32_t kind, int errnum, const char *fmt, ...)
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
    uint8_t *p0 = conn_reserve(c, DSEC__AGENT_HDR + plen), *p = p0;
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_ERROR, id, plen);
    p = dsec__agent_put_u32(p, kind);
    p = dsec__agent_put_u32(p, (uint32_t)errnum);
    p = dsec__agent_put_bytes(p, msg, ml);
    conn_commit(c, (size_t)(p - p0));
}

/* An errno error about a path: "open \"/x\": No such file or directory". */
static void send_errno(struct conn *c, uint32_t id, int errnum, const char *what, const char *path)
{
    send_error(c, id, DSEC__AGENT_ERR_IO, errnum, "%s \"%s\": %s", what, path, strerror(errnum));
}

static void send_hello(struct conn *c, uint32_t id)
{
    uint8_t *p0 = conn_reserve(c, DSEC__AGENT_HDR + 8), *p = p0;
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_HELLO, id, 8);
    p = dsec__agent_put_u32(p, DSEC__AGENT_VERSION);
    p = dsec__agent_put_u32(p, DSEC__AGENT_FRAME_MAX);
    conn_commit(c, (size_t)(p - p0));
}

static void send_ok(struct conn *c, uint32_t id, uint64_t value)
{
    uint8_t *p0 = conn_reserve(c, DSEC__AGENT_HDR + 8), *p = p0;
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_OK, id, 8);
    p = dsec__agent_put_u64(p, value);
    conn_commit(c, (size_t)(p - p0));
}

/* ---- commands ---------------------------------------------------------------------------------
 */

static void pipe_close(struct pipe_ep *e)
{
    if (e->fd < 0)
        return;
    ep_ctl(EPOLL_CTL_DEL, e->fd, 0, NULL);
    close(e->fd);
    e->fd = -1;
    e->paused = false;
}

/* Keep the last cap bytes of data in r. */
static void ring_put(struct ring *r, const uint8_t *data, size_t n)
{
    size_t k = n < r->cap ? n : r->cap;
    uint64_t end = r->total + n;
    size_t need = end < r->cap ? (size_t)end : r->cap;
    if (r->alloc < need) { /* nothing wrapped yet: offsets are positions */
        size_t a = r->alloc ? r->alloc : 4096;
        while (a < need)
            a *= 2;
        r->alloc = a < r->cap ? a : r->cap;
        r->buf = xrealloc(r->buf, r->alloc);
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

/* An EXIT frame to c (nothing when c is NULL or gone). */
static void send_exit(struct conn *c, uint32_t id, int32_t code, int32_t sig, uint8_t flags,
                      uint64_t dur_us, uint64_t cpu_us, uint64_t rss_kb)
{
    if (c == NULL || c->dead)
        return;
    size_t plen = 4 + 4 + 1 + 8 + 8 + 8;
    uint8_t *p0 = conn_reserve(c, DSEC__AGENT_HDR + plen), *p = p0;
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_EXIT, id, plen);
    p = dsec__agent_put_u32(p, (uint32_t)code);
    p = dsec__agent_put_u32(p, (uint32_t)sig);
    p = dsec__agent_put_u8(p, flags);
    p = dsec__agent_put_u64(p, dur_us);
    p = dsec__agent_put_u64(p, cpu_us);
    p = dsec__agent_put_u64(p, rss_kb);
    conn_commit(c, (size_t)(p - p0));
}

/* ---- shell sessions ------------------------------------------------------------------------- */

/*
 * A session is a background process whose main process is a shell reading its commands from
 * stdin, a pipe only the agent writes. Started, it is given a few definitions (SESS_BOOT);
 * each EXEC on it is written as one line that runs the command line through eval inside a
 * function (so cd, variables, functions and exports stay in the shell) with stdin /dev/null,
 * then prints a marker, "\036" + a token random per session + ":" + the status + "\n", on
 * stdout and on stderr. The agent takes the markers out of the streams; once both came, the
 * command's output is complete and its EXIT goes out. The token is in a shell variable, never
 * next to "\036" in anything the shell prints but the markers, so a command cannot print one
 * by accident.
 *
 * The bootstrap ends with a marker of its own (status 0) on both streams: until both came, the
 * INT trap may not be set, and no SIGINT is sent (it would kill the shell).
 *
 * An interrupt (PSIGNAL SIGINT, a timeout, KILL) sends SIGINT to the shell's process group
 * every SESS_INT_EVERY_MS until the marker comes: the command's processes get it as from a
 * terminal, and the shell's INT trap returns from the function running the command (busy
 * loops of builtins included), at most once per command: the trap clears __dsec_busy, which
 * is set only inside the function, so a late SIGINT never returns from anything else. It
 * also sets __dsec_intd, which makes the status 130: busybox's ash may give a function left by
 * a trap's return the status from before the trap. (The
 * trap is the session's: a command's own INT trap lasts until the next command.) After
 * SESS_INT_KILL_MS what is below the shell gets SIGKILL; after SESS_INT_END_MS the session
 * is killed and the command's EXIT says SESSION_ENDED.
 */

#define SESS_INT_EVERY_MS 200
#define SESS_INT_KILL_MS 2000
#define SESS_INT_END_MS 4000
#define SESS_INT_KILL_WAIT_MS 150 /* KILL: the first SIGINT after the signal */
#define SESS_TOK_LEN 36 /* "dsec" + 32 hex digits */
#define SESS_MARK_MAX (1 + SESS_TOK_LEN + 1 + 12 + 1)

static const char SESS_BOOT[] =
    "__dsec_busy=\n"
    "__dsec_int='if [ -n \"${__dsec_busy:-}\" ]; then __dsec_busy=; __dsec_intd=1; return 130; "
    "fi'\n"
    "trap \"$__dsec_int\" INT\n"
    "__dsec_run() { __dsec_cmd=$1; shift; __dsec_busy=1; command eval \"$__dsec_cmd\"; "
    "__dsec_st=$?; __dsec_busy=; return $__dsec_st; }\n"
    "exec 7>&1 8>&2\n"
    "command printf '\\036%s:0\\n' \"$__dsec_tok\"\n"
    "command printf '\\036%s:0\\n' \"$__dsec_tok\" >&2\n";

struct sess {
    char tok[SESS_TOK_LEN + 1];
    uint8_t mark[SESS_MARK_MAX]; /* "\036" tok ":" */
    size_t mark_len;
    /* per stream: bytes that may be the start of a marker, held back */
    uint8_t hold[2][SESS_MARK_MAX];
    size_t hold_len[2];
    /* per stream: the bootstrap's marker came (SIGINT waits for both: before its trap is set, it
     * would kill the shell) */
    bool booted[2];
    /* the command running, if busy */
    bool busy, marked[2];
    int32_t status;
    struct conn *conn; /* NULL once its connection left: it runs on, answered to nobody */
    uint32_t id;
    uint64_t out_max, seen[2];
    uint64_t start_ns, deadline_ns;
    bool timed_out, interrupted;
    uint64_t int_at, int_next; /* an interrupt under way: when it began, the next SIGINT */
    int int_stage;             /* 1: what is below the shell was killed, 2: the session */
};

static void sess_forget_conn(struct proc *p, const struct conn *c)
{
    if (p->sess->conn == c)
        p->sess->conn = NULL;
}

/* Bytes of the session's stream s (0 stdout, 1 stderr) that are not a marker: the ring, and
 * the running command's client while its marker on s has not come. */
static void sess_emit(struct proc *p, int s, const uint8_t *data, size_t n)
{
    struct sess *x = p->sess;
    if (n == 0)
        return;
    ring_put(&p->ring[s], data, n);
    if (!x->booted[s] || !x->busy || x->marked[s])
        return;
    uint64_t before = x->seen[s];
    x->seen[s] += n;
    if (x->conn == NULL || x->conn->dead || before >= x->out_max)
        return;
    size_t send_n = (size_t)(x->out_max - before < n ? x->out_max - before : n);
    size_t plen = 1 + 4 + send_n;
    uint8_t *p0 = conn_reserve(x->conn, DSEC__AGENT_HDR + plen), *o = p0;
    o = dsec__agent_put_hdr(o, DSEC__AGENT_T_OUTPUT, x->id, plen);
    o = dsec__agent_put_u8(o, (uint8_t)(s + 1));
    o = dsec__agent_put_bytes(o, data, send_n);
    conn_commit(x->conn, (size_t)(o - p0));
}

/* The running command is over: its EXIT (code, or sig for a shell that was killed). */
static void sess_done(struct proc *p, int32_t code, int32_t sig, bool ended)
{
    struct sess *x = p->sess;
    uint8_t flags = (uint8_t)((x->timed_out ? DSEC__AGENT_X_TIMED_OUT : 0) |
                              (x->seen[0] > x->out_max ? DSEC__AGENT_X_STDOUT_TRUNC : 0) |
                              (x->seen[1] > x->out_max ? DSEC__AGENT_X_STDERR_TRUNC : 0) |
                              (x->interrupted && !x->timed_out ? DSEC__AGENT_X_INTERRUPTED : 0) |
                              (ended ? DSEC__AGENT_X_SESSION_ENDED : 0));
    struct conn *c = x->conn;
    uint32_t id = x->id;
    uint64_t dur = (now_ns() - x->start_ns) / 1000u;
    x->busy = false;
    x->conn = NULL;
    x->int_at = x->int_next = 0;
    x->int_stage = 0;
    x->deadline_ns = 0;
    send_exit(c, id, code, sig, flags, dur, 0, 0);
}

/* Whether a marker is due on stream s: the bootstrap's, or the running command's. */
static bool sess_looking(const struct sess *x, int s)
{
    return !x->booted[s] || (x->busy && !x->marked[s]);
}

/* Output of the session's shell on stream s: markers out, the rest to sess_emit. */
static void sess_output(struct proc *p, int s, const uint8_t *data, size_t n)
{
    struct sess *x = p->sess;
    static uint8_t buf[DSEC__AGENT_CHUNK + SESS_MARK_MAX];
    while (n > 0) {
        if (!sess_looking(x, s)) { /* no marker to look for: between commands */
            sess_emit(p, s, data, n);
            return;
        }
        size_t take = n < DSEC__AGENT_CHUNK ? n : DSEC__AGENT_CHUNK;
        size_t len = x->hold_len[s];
        memcpy(buf, x->hold[s], len);
        memcpy(buf + len, data, take);
        len += take;
        data += take;
        n -= take;
        x->hold_len[s] = 0;
        size_t pos = 0;
        while (pos < len && sess_looking(x, s)) {
            const uint8_t *hit = memmem(buf + pos, len - pos, x->mark, x->mark_len);
            if (hit == NULL) { /* hold a tail that may begin a marker */
                size_t k = len - pos < x->mark_len - 1 ? len - pos : x->mark_len - 1;
                for (; k > 0; k--)
                    if (memcmp(buf + len - k, x->mark, k) == 0)
                        break;
                sess_emit(p, s, buf + pos, len - pos - k);
                memcpy(x->hold[s], buf + len - k, k);
                x->hold_len[s] = k;
                pos = len;
                break;
            }
            size_t at = (size_t)(hit - buf);
            sess_emit(p, s, buf + pos, at - pos);
            size_t q = at + x->mark_len;
            int32_t st = 0;
            bool neg = q < len && buf[q] == '-', bad = false;
            q += neg;
            size_t digits = 0;
            while (q < len && buf[q] >= '0' && buf[q] <= '9' && digits < 10) {
                st = st * 10 + (buf[q++] - '0');
                digits++;
            }
            if (q == len && len - at < SESS_MARK_MAX) { /* the rest comes later */
                memcpy(x->hold[s], buf + at, len - at);
                x->hold_len[s] = len - at;
                pos = len;
                break;
            }
            bad = q == len || buf[q] != '\n' || digits == 0;
            if (bad) { /* not ours after all: plain output */
                sess_emit(p, s, buf + at, 1);
                pos = at + 1;
                continue;
            }
            pos = q + 1;
            if (!x->booted[s]) { /* the bootstrap's: what follows may be a command's */
                x->booted[s] = true;
                continue;
            }
            x->marked[s] = true;
            if (s == 0)
                x->status = neg ? -st : st;
            if (x->marked[0] && x->marked[1]) {
                sess_done(p, x->status, 0, false);
                /* the rest is the session's; and sending the EXIT may have let the client's
                 * next command in already, which must not get it */
                if (pos < len)
                    ring_put(&p->ring[s], buf + pos, len - pos);
                if (n > 0)
                    ring_put(&p->ring[s], data, n);
                return;
            }
        }
        if (pos < len) /* after the marker: the session's, not the command's */
            sess_emit(p, s, buf + pos, len - pos);
    }
}

/* The shell ended (status, its wait status): what was held is output; a command running
 * ends with it. */
static void sess_ended(struct proc *p, int status)
{
    struct sess *x = p->sess;
    for (int s = 0; s < 2; s++) {
        size_t k = x->hold_len[s];
        x->hold_len[s] = 0;
        sess_emit(p, s, x->hold[s], k);
    }
    if (x->busy)
        sess_done(p, WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                  WIFSIGNALED(status) ? WTERMSIG(status) : 0, true);
}

/* Forward output to the client within the cap; what is past it is counted and dropped. A
 * background process's goes to its ring. */
static void cmd_output(struct cmd *m, int stream, const uint8_t *data, size_t n)
{
    uint64_t before = m->seen[stream];
    m->seen[stream] += n;
    if (m->proc && m->proc->sess) {
        sess_output(m->proc, stream - 1, data, n);
        return;
    }
    if (m->proc)
        ring_put(&m->proc->ring[stream - 1], data, n);
    if (m->conn == NULL || before >= m->out_max)
        return;
    size_t send_n = (size_t)(m->out_max - before < n ? m->out_max - before : n);
    size_t plen = 1 + 4 + send_n;
    uint8_t *p0 = conn_reserve(m->conn, DSEC__AGENT_HDR + plen), *p = p0;
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_OUTPUT, m->id, plen);
    p = dsec__agent_put_u8(p, (uint8_t)stream);
    p = dsec__agent_put_bytes(p, data, send_n);
    conn_commit(m->conn, (size_t)(p - p0));
}

/* Read one chunk; returns bytes read, 0 at EOF (pipe closed), -1 when nothing is there. */
static ssize_t pipe_read(struct cmd *m, int stream)
{
    struct pipe_ep *e = &m->io[stream];
    ssize_t n;
    do
        n = read(e->fd, iobuf, sizeof iobuf);
    while (n < 0 && errno == EINTR);
    if (n > 0) {
        cmd_output(m, stream, iobuf, (size_t)n);
        return n;
    }
    if (n == 0 || errno != EAGAIN) {
        pipe_close(e);
        return 0;
    }
    return -1;
}

static void cmd_unlink(struct cmd *m)
{
    m->dead = true;
    if (m->prev)
        m->prev->next = m->next;
    else
        g.cmds = m->next;
    if (m->next)
        m->next->prev = m->prev;
    m->next_dead = g.dead_cmds;
    g.dead_cmds = m;
}

/* A background process's main process ended and its tree is gone: record how; a PSTDIN still
 * waiting gets its answer. It stays listed until evicted. */
static void proc_ended(struct proc *p, struct cmd *m, int status, uint64_t end)
{
    p->cmd = NULL;
    p->running = p->stdin_open = false;
    p->timed_out = m->timed_out;
    p->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    p->sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    uint64_t mono = now_ns(), wall = wall_ns();
    p->ended_ns = wall - (mono > end ? mono - end : 0);
    if (p->in_conn)
        send_error(p->in_conn, p->in_id, DSEC__AGENT_ERR_INVALID, 0,
                   "process %" PRIu64 " ended before it took all of its stdin (%zu bytes left)",
                   p->handle, m->in_len - m->in_off);
    p->in_conn = NULL;
    if (p->sess)
        sess_ended(p, status);
}

/* The main process ended (at end, CLOCK_MONOTONIC) and its shepherd reported (after killing
 * the rest of the tree if the agent ended the command): collect what it wrote, report, forget
 * the command. Processes left in the background lose the pipes. */
static void cmd_exited(struct cmd *m, int status, const struct rusage *ru, uint64_t end)
{
    m->exited = true;
    pipe_close(&m->rep);
    for (int s = 1; s <= 2; s++) {
        size_t drained = 0;
        while (m->io[s].fd >= 0 && drained < DRAIN_MAX) {
            ssize_t n = pipe_read(m, s);
            if (n <= 0)
                break;
            drained += (size_t)n;
        }
    }
    for (int s = 0; s <= 2; s++)
        pipe_close(&m->io[s]);
    if (m->proc)
        proc_ended(m->proc, m, status, end);
    if (m->conn) {
        int32_t code = -1, sig = 0;
        if (WIFEXITED(status))
            code = WEXITSTATUS(status);
        else if (WIFSIGNALED(status))
            sig = WTERMSIG(status);
        uint8_t flags = (uint8_t)((m->timed_out ? DSEC__AGENT_X_TIMED_OUT : 0) |
                                  (m->seen[1] > m->out_max ? DSEC__AGENT_X_STDOUT_TRUNC : 0) |
                                  (m->seen[2] > m->out_max ? DSEC__AGENT_X_STDERR_TRUNC : 0));
        uint64_t cpu = (uint64_t)ru->ru_utime.tv_sec * 1000000u + (uint64_t)ru->ru_utime.tv_usec +
                       (uint64_t)ru->ru_stime.tv_sec * 1000000u + (uint64_t)ru->ru_stime.tv_usec;
        send_exit(m->conn, m->id, code, sig, flags, (end - m->start_ns) / 1000u, cpu,
                  (uint64_t)(ru->ru_maxrss > 0 ? ru->ru_maxrss : 0));
    }
    cmd_unlink(m);
}

/* The shepherd's report, written in one piece: 1 when read, 0 when not there yet, -1 when it
 * will never come (the pipe is closed then). */
static int read_report(struct cmd *m, struct shep_report *rp)
{
    if (m->rep.fd < 0)
        return -1;
    ssize_t n;
    do
        n = recv(m->rep.fd, rp, sizeof *rp, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof *rp)
        return 1;
    if (n < 0 && errno == EAGAIN)
        return 0;
    pipe_close(&m->rep);
    return -1;
}

/* The report came: the main process is gone, and so is the rest of the tree if the command
 * was doomed; answer now. The shepherd waits for the next command (kept idle: nothing was left
 * under it) or exits (reaped later; what it left behind comes to us). */
static void on_report(struct cmd *m)
{
    struct shep_report rp;
    if (read_report(m, &rp) != 1)
        return;
    if (rp.reusable && g.nidle + 1 <= SHEP_IDLE_MAX && !g.terminating) {
        ep_ctl(EPOLL_CTL_DEL, m->rep.fd, 0, NULL);
        g.idle[g.nidle].pid = m->pid;
        g.idle[g.nidle++].fd = m->rep.fd;
        m->rep.fd = -1;
        m->pid = 0;
    }
    cmd_exited(m, rp.status, &rp.ru, rp.exit_ns);
}

/* A shepherd exited (status, ru its own) before its report was seen: it may be in the pipe. */
static void shepherd_gone(struct cmd *m, int status, const struct rusage *ru)
{
    struct shep_report rp;
    m->pid = 0;
    if (read_report(m, &rp) == 1) {
        cmd_exited(m, rp.status, &rp.ru, rp.exit_ns);
        return;
    }
    /* Killed before it reported (a root command can SIGKILL its parent): the main process,
     * if it still runs, is our child now and is reaped as one (reap); its tree is no longer
     * told apart from other commands', so when it ends only its process group is
     * killed. */
    logmsg("exec %" PRIu32 ": the command's shepherd died (status %#x) before it reported", m->id,
           (unsigned)status);
    int st;
    struct rusage cru;
    if (m->main_reaped) { /* it ended before its shepherd was reaped */
        cmd_exited(m, m->main_status, &m->main_ru, now_ns());
        return;
    }
    pid_t p = wait4(m->pgid, &st, WNOHANG, &cru);
    if (p == m->pgid) {
        kill(-m->pgid, SIGKILL); /* what is left of its group */
        cmd_exited(m, st, &cru, now_ns());
    } else if (p != 0) {
        cmd_exited(m, status, ru, now_ns());
    }
}

/* Whether m's shepherd has exited (reaped or not): only then can m's main process be our child.
 * Orphans of commands come here too, and one may have a pid the main process had. */
static bool shepherd_dead(const struct cmd *m)
{
    if (m->pid == 0)
        return true;
    siginfo_t si = {0};
    return waitid(P_PID, (id_t)m->pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           si.si_pid == m->pid;
}

static void reap(void)
{
    for (;;) {
        int status;
        struct rusage ru;
        pid_t pid = wait4(-1, &status, WNOHANG, &ru);
        if (pid <= 0)
            return;
        for (size_t i = 0; i < g.nidle; i++)
            if (g.idle[i].pid == pid) { /* an idle shepherd died (killed): forget it */
                if (g.idle[i].fd >= 0)
                    close(g.idle[i].fd);
                g.idle[i] = g.idle[--g.nidle];
                break;
            }
        /* Besides shepherds, the main process of a command whose shepherd died comes here;
         * what commands left in the background and processes of the sandbox that were not ours
         * (we are init or a subreaper) are just reaped. So is a shepherd whose report was
         * answered already. */
        for (struct cmd *m = g.cmds; m; m = m->next) {
            if (m->pid == pid && !m->exited) {
                shepherd_gone(m, status, &ru);
                break;
            }
            if (m->pgid == pid && !m->exited && shepherd_dead(m)) { /* the main is ours */
                kill(-pid, SIGKILL); /* what is left of its group: it outlives its leader */
                if (m->pid == 0) {
                    cmd_exited(m, status, &ru, now_ns());
                } else { /* the shepherd is reaped after it (shepherd_gone) */
                    m->main_reaped = true;
                    m->main_status = status;
                    m->main_ru = ru;
                }
                break;
            }
        }
    }
}

/* A background process's pending stdin went in (all of it, or all but left bytes when it
 * closed its end): answer the PSTDIN waiting, close stdin if asked or broken, stop watching. */
static void proc_stdin_taken(struct proc *p, struct cmd *m, size_t left)
{
    bool all = left == 0;
    free(m->in);
    m->in = NULL;
    m->in_len = m->in_off = 0;
    if (!all || p->in_close) {
        pipe_close(&m->io[0]);
        p->stdin_open = false;
    } else {
        ep_ctl(EPOLL_CTL_DEL, m->io[0].fd, 0, NULL);
    }
    if (p->in_conn) {
        if (all)
            send_ok(p->in_conn, p->in_id, 0);
        else
            send_error(p->in_conn, p->in_id, DSEC__AGENT_ERR_INVALID, EPIPE,
                       "process %" PRIu64 " closed its stdin with %zu bytes not taken", p->handle,
                       left);
    }
    p->in_conn = NULL;
    p->in_close = false;
}

static void on_pipe(struct pipe_ep *e, uint32_t events)
{
    struct cmd *m = e->cmd;
    if (m->dead || e->fd < 0)
        return;
    if (e->stream == 3) {
        on_report(m);
        return;
    }
    if (e->stream == 0) {
        if (m->proc && m->in == NULL)
            return; /* nothing pending (a background process's stdin is watched only then) */
        while (m->in_off < m->in_len) {
            ssize_t n = write(e->fd, m->in + m->in_off, m->in_len - m->in_off);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && errno == EAGAIN)
                return;
            if (n < 0) /* EPIPE: the command does not want the rest */
                break;
            m->in_off += (size_t)n;
        }
        if (m->proc) {
            proc_stdin_taken(m->proc, m, m->in_len - m->in_off);
            return;
        }
        pipe_close(e);
        free(m->in);
        m->in = NULL;
        return;
    }
    /* Slow client: leave the output in the pipe (the command blocks) until the backlog drains. */
    if (m->conn && conn_backlog(m->conn) > WBUF_HIGH && m->seen[e->stream] < m->out_max) {
        e->paused = true;
        ep_ctl(EPOLL_CTL_MOD, e->fd, 0, e);
        return;
    }
    pipe_read(m, e->stream);
}

/* ---- users: the sandbox's own /etc/passwd and /etc/group (static glibc has no NSS) ------------
 */

#define GROUPS_MAX 64

struct ident {
    bool set;
    uid_t uid;
    gid_t gid;
    gid_t groups[GROUPS_MAX];
    size_t ngroups;
    char name[DSEC__AGENT_USER_MAX + 1]; /* empty when the uid has no passwd entry */
    char home[DSEC__AGENT_PATH_MAX + 1];
};

static bool parse_id(const char *s, size_t len, unsigned long *out)
{
    if (len == 0 || len > 10)
        return false;
    unsigned long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (unsigned long)(s[i] - '0');
    }
    if (v > UINT32_MAX - 1) /* (uid_t)-1 means "unchanged" to the kernel */
        return false;
    *out = v;
    return true;
}

/* Split a colon line into at most max fields (in place). Returns the field count. */
static int split_colon(char *line, char **f, int max)
{
    int n = 0;
    f[n++] = line;
    for (char *p = line; *p && n < max; p++)
        if (*p == ':') {
            *p = 0;
            f[n++] = p + 1;
        }
    return n;
}

/* Find a passwd entry by name (by_name) or uid. Fills name, uid, gid, home. */
static bool passwd_find(const char *name, uid_t uid, bool by_name, struct ident *id)
{
    FILE *f = fopen("/etc/passwd", "re");
    if (f == NULL)
        return false;
    char *line = NULL;
    size_t cap = 0;
    bool found = false;
    while (!found && getline(&line, &cap, f) > 0) {
        line[strcspn(line, "\n")] = 0;
        char *fl[7];
        unsigned long u, gg;
        if (split_colon(line, fl, 7) < 7 || !parse_id(fl[2], strlen(fl[2]), &u) ||
            !parse_id(fl[3], strlen(fl[3]), &gg))
            continue;
        if (by_name ? strcmp(fl[0], name) == 0 : (uid_t)u == uid) {
            found = strlen(fl[0]) <= DSEC__AGENT_USER_MAX && strlen(fl[5]) <= DSEC__AGENT_PATH_MAX;
            if (found) {
                strcpy(id->name, fl[0]);
                strcpy(id->home, fl[5]);
                id->uid = (uid_t)u;
                id->gid = (gid_t)gg;
            }
        }
    }
    free(line);
    fclose(f);
    return found;
}

static bool group_find(const char *name, gid_t *gid)
{
    FILE *f = fopen("/etc/group", "re");
    if (f == NULL)
        return false;
    char *line = NULL;
    size_t cap = 0;
    bool found = false;
    while (!found && getline(&line, &cap, f) > 0) {
        line[strcspn(line, "\n")] = 0;
        char *fl[4];
        unsigned long gg;
        if (split_colon(line, fl, 4) >= 3 && strcmp(fl[0], name) == 0 &&
            parse_id(fl[2], strlen(fl[2]), &gg)) {
            *gid = (gid_t)gg;
            found = true;
        }
    }
    free(line);
    fclose(f);
    return found;
}

/* The primary group, then every group of /etc/group that lists the user. */
static void supplementary_groups(struct ident *id)
{
    id->groups[0] = id->gid;
    id->ngroups = 1;
    if (id->name[0] == 0)
        return;
    FILE *f = fopen("/etc/group", "re");
    if (f == NULL)
        return;
    char *line = NULL;
    size_t cap = 0;
    while (id->ngroups < GROUPS_MAX && getline(&line, &cap, f) > 0) {
        line[strcspn(line, "\n")] = 0;
        char *fl[4];
        unsigned long gg;
        if (split_colon(line, fl, 4) < 4 || !parse_id(fl[2], strlen(fl[2]), &gg) ||
            (gid_t)gg == id->gid)
            continue;
        for (char *tok = strtok(fl[3], ","); tok; tok = strtok(NULL, ","))
            if (strcmp(tok, id->name) == 0) {
                id->groups[id->ngroups++] = (gid_t)gg;
                break;
            }
    }
    free(line);
    fclose(f);
}

/*
 * "name", "name:group", "uid" or "uid:gid" (numbers need no passwd entry: a
 * uid without one runs with gid = uid unless a gid is given). Returns NULL or
 * a message saying what is wrong.
 */
static const char *resolve_user(const char *spec, struct ident *id)
{
    memset(id, 0, sizeof *id);
    id->set = true;
    const char *colon = strchr(spec, ':');
    size_t ulen = colon ? (size_t)(colon - spec) : strlen(spec);
    char uname[DSEC__AGENT_USER_MAX + 1];
    if (ulen == 0 || ulen > DSEC__AGENT_USER_MAX)
        return "empty or overlong user name";
    memcpy(uname, spec, ulen);
    uname[ulen] = 0;
    unsigned long num;
    if (parse_id(uname, ulen, &num)) {
        if (!passwd_find(NULL, (uid_t)num, false, id)) {
            id->uid = (uid_t)num;
            id->gid = (gid_t)num;
        }
    } else if (!passwd_find(uname, 0, true, id)) {
        return "no such user in /etc/passwd";
    }
    if (colon) {
        const char *gs = colon + 1;
        if (parse_id(gs, strlen(gs), &num))
            id->gid = (gid_t)num;
        else if (!group_find(gs, &id->gid))
            return "no such group in /etc/group";
        id->groups[0] = id->gid;
        id->ngroups = 1;
    } else {
        supplementary_groups(id);
    }
    return NULL;
}

/* ---- spawning -----------------------------------------------------------------------------------
 */

/* Everything the vfork child needs, prepared by the parent: the child allocates nothing. */
struct spawn {
    char **argv;
    char **envp;
    const char *path_env; /* PATH for a bare argv[0] */
    const char *cwd;      /* NULL: inherit */
    const struct ident *id;
    int fds[3];    /* the child's stdin, stdout, stderr */
    char *scratch; /* a PATH candidate */
    size_t scratch_len;
    char *msg; /* the failure message written to stderr */
    size_t msg_len;
    int pid_fd; /* the child writes its pid here (pid_t) before anything of the command runs;
                 * -1: the shepherd does once the child exec'd */
    bool tty;   /* fds are a pty's slave: it becomes the controlling terminal */
};

static void __attribute__((noreturn))
child_fail(const struct spawn *s, const char *what, const char *arg, int errnum)
{
    const char *parts[] = {"dsec-agent: ", what, " \"", arg, "\": ", strerrordesc_np(errnum), "\n"};
    size_t n = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        const char *p = parts[i] ? parts[i] : "?";
        size_t l = strlen(p);
        if (l > s->msg_len - n)
            l = s->msg_len - n;
        memcpy(s->msg + n, p, l);
        n += l;
    }
    ssize_t w = write(2, s->msg, n);
    (void)w;
    _exit(127);
}

static void child_run(const struct spawn *s) __attribute__((noreturn));
static void child_run(const struct spawn *s)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setsid();
    if (g.nofile_raised) /* a raw system call, as below */
        syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, &g.nofile, NULL);
    /* Before the command can do anything (such as kill its shepherd): the agent learns the
     * pid even then. The descriptor is close-on-exec. */
    pid_t self = (pid_t)syscall(SYS_getpid);
    if (s->pid_fd >= 0 && write(s->pid_fd, &self, sizeof self) != (ssize_t)sizeof self)
        _exit(127);
    for (int i = 0; i < 3; i++)
        if (dup2(s->fds[i], i) < 0)
            child_fail(s, "cannot set up descriptor for", s->argv[0], errno);
    if (s->tty && ioctl(0, TIOCSCTTY, 0) < 0) /* setsid above: a session without a terminal */
        child_fail(s, "cannot make the terminal controlling for", s->argv[0], errno);
    if (s->id && s->id->set) {
        /* Raw system calls: glibc's wrappers would synchronise threads we do not have,
         * in memory this child shares with its parent. */
        if (syscall(SYS_setgroups, s->id->ngroups, s->id->groups) < 0 ||
            syscall(SYS_setresgid, s->id->gid, s->id->gid, s->id->gid) < 0 ||
            syscall(SYS_setresuid, s->id->uid, s->id->uid, s->id->uid) < 0)
            child_fail(s, "cannot switch user for", s->argv[0], errno);
    }
    if (s->cwd && chdir(s->cwd) < 0)
        child_fail(s, "cannot change directory to", s->cwd, errno);
    const char *file = s->argv[0];
    if (strchr(file, '/')) {
        execve(file, s->argv, s->envp);
        child_fail(s, "cannot run", file, errno);
    }
    /* PATH search as execvp does it, without its allocations. */
    size_t flen = strlen(file);
    bool denied = false;
    int last = ENOENT;
    for (const char *p = s->path_env;;) {
        const char *end = strchrnul(p, ':');
        size_t dlen = (size_t)(end - p);
        if (dlen + 1 + flen < s->scratch_len) {
            memcpy(s->scratch, p, dlen);
            size_t o = dlen;
            if (dlen == 0) /* an empty entry is the current directory */
                s->scratch[o++] = '.';
            s->scratch[o++] = '/';
            memcpy(s->scratch + o, file, flen + 1);
            execve(s->scratch, s->argv, s->envp);
            last = errno;
            if (last == EACCES)
                denied = true;
            else if (last != ENOENT && last != ENOTDIR && last != ESTALE && last != ENODEV &&
                     last != ETIMEDOUT)
                break;
        }
        if (*end == 0)
            break;
        p = end + 1;
    }
    child_fail(s, "cannot run", file, denied && last != EACCES ? EACCES : last);
}

/* The child's buffers: static, so a spawn costs no allocation and no fresh pages. */
static char spawn_path[DSEC__AGENT_PATH_MAX + DSEC__AGENT_ARG_LEN_MAX + 2];
static char spawn_msg[DSEC__AGENT_ARG_LEN_MAX + 256];

#ifdef DSEC_AGENT_FUZZ
/* Defined by the harness: checks, in the parent, what the child is about to get. */
static void fuzz_check_spawn(const struct spawn *s);
#endif

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* vfork in a function of its own: the caller's locals stay out of the child's way. */
static pid_t __attribute__((noinline)) spawn_child(const struct spawn *s)
{
    pid_t pid = vfork();
    if (pid == 0)
        child_run(s);
    return pid;
}

/* ---- exec cleanup: a shepherd under each command ------------------------------------------------
 */

/*
 * When an exec ends or times out, or is ended by KILL or the agent's SIGTERM, everything it
 * started ends with it, however it forked (setsid, double forks, reparenting): a command's
 * leftovers would otherwise hold its pipes, slow the sandbox's next commands (a fork bomb left
 * 191 processes behind) and outlive anything that could name them. Processes meant to run on
 * are started with PSTART (background processes), which have the same shepherd and a handle
 * to signal them by. A process group does not hold a tree: any member
 * can leave it with setsid. What holds it is ancestry, and an orphan's ancestry is kept by
 * the nearest child subreaper above it. So each command runs under a shepherd: a fork of
 * the agent that made itself a child subreaper, starts the command (vfork, as the agent did)
 * and waits. Every process the command starts is a descendant of the shepherd for as long as
 * it lives, whoever of its ancestors died; the shepherd has no child left exactly when
 * nothing of the tree is left. The agent answers EXIT on the shepherd's report of the main
 * process's status. When the main process exits, the shepherd kills the rest of the tree and
 * reaps it, then reports. Before it signals a command at the timeout, KILL or SIGTERM, the
 * agent dooms it (a header on the shepherd's socket); the shepherd ends the tree either way,
 * so a doom only makes it stop waiting for that command's headers.
 *
 * A shepherd with nothing left under it serves the next command (never one with something
 * left: its tree would be mixed with the next): up to SHEP_IDLE_MAX wait idle, so a fork of
 * the agent is paid only when more commands than that run at once. The command comes over the
 * shepherd's socket (its strings, and its stdio by SCM_RIGHTS).
 *
 * Why not the alternatives. kill(-1) from the agent as PID 1 of the sandbox's pid namespace
 * would also kill the other commands running at the same time: execs overlap (several per
 * connection, several connections or ports), and each must end only its own. A cgroup per
 * exec needs a writable, delegated cgroup tree, which containers do not give (read-only
 * cgroupfs, and the runtime owns the container's cgroup) and which gVisor and older guests
 * may lack. The agent as the only subreaper (it is init in a sandbox) gets every orphan but
 * cannot tell whose it was. A shepherd works the same in a container (agent PID 1), in a
 * microVM (agent PID 1 of the guest, exec'd by its init) and outside any pid namespace.
 *
 * The kill: the descendants of the shepherd are found in /proc (PPid chains) and each gets
 * SIGKILL, and so does each process group of the tree (a group-wide signal reaches a child
 * forked while it is delivered, so a fork bomb inside one group cannot outrun it). Children
 * forked before their parent died are found in the next round; rounds go on until the
 * shepherd has no child. /proc is used only when it is the shepherd's own pid namespace's
 * (/proc/self names the shepherd): numbers from another namespace's /proc would be other
 * processes. Without it, only the main process's group is killed and the shepherd reports
 * after TREE_KILL_MS and then waits for the rest on its own.
 *
 * A command that is root in the sandbox can SIGKILL its shepherd (its parent); its processes
 * then go to the agent, which kills the main process's group and otherwise only reaps them.
 */

#define TREE_KILL_MS 5000 /* report after this even if something of the tree is not gone */

struct proc_ent {
    pid_t pid, ppid, pgid;
    bool in; /* a descendant of the shepherd */
};

static int proc_ent_cmp(const void *a, const void *b)
{
    pid_t x = ((const struct proc_ent *)a)->pid, y = ((const struct proc_ent *)b)->pid;
    return x < y ? -1 : x > y;
}

static struct proc_ent *proc_find(struct proc_ent *v, size_t n, pid_t pid)
{
    struct proc_ent key = {.pid = pid};
    return bsearch(&key, v, n, sizeof *v, proc_ent_cmp);
}

/* Whether this /proc is our pid namespace's, so its numbers are pids we can signal. */
static bool proc_is_ours(void)
{
    char buf[32];
    ssize_t n = readlink("/proc/self", buf, sizeof buf - 1);
    if (n <= 0)
        return false;
    buf[n] = 0;
    return strtol(buf, NULL, 10) == (long)getpid();
}

/* One round: sig to every descendant of root and, with groups, SIGKILL to their groups.
 * main_pgid: the main process's group, which outlives its leader while members remain. */
static void kill_below(pid_t root, pid_t main_pgid, int sig, bool groups)
{
    static struct proc_ent *v;
    static size_t cap;
    size_t n = 0;
    pid_t self = root, own_pgid = getpgrp();
    DIR *d = opendir("/proc");
    if (d == NULL)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char *end, path[64], buf[512];
        long pid = strtol(de->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue; /* gone meanwhile */
        ssize_t r = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (r <= 0)
            continue;
        buf[r] = 0;
        const char *rp = strrchr(buf, ')'); /* the name may hold anything, ')' included */
        char state;
        int ppid, pgid;
        if (rp == NULL || sscanf(rp + 1, " %c %d %d", &state, &ppid, &pgid) != 3)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            v = xrealloc(v, cap * sizeof *v);
        }
        v[n++] = (struct proc_ent){.pid = (pid_t)pid, .ppid = ppid, .pgid = pgid};
    }
    closedir(d);
    qsort(v, n, sizeof *v, proc_ent_cmp);
    for (bool more = true; more;) { /* as many passes as the tree is deep */
        more = false;
        for (size_t i = 0; i < n; i++) {
            if (v[i].in)
                continue;
            struct proc_ent *p = v[i].ppid == self ? NULL : proc_find(v, n, v[i].ppid);
            if (v[i].ppid == self || (p && p->in))
                v[i].in = more = true;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!v[i].in)
            continue;
        kill(v[i].pid, sig);
        if (!groups)
            continue;
        /* A group of the tree: the main process's, or one a descendant leads. Groups live
         * within a session, and every session here was made by the tree. */
        pid_t pg = v[i].pgid;
        struct proc_ent *leader = proc_find(v, n, pg);
        if (pg > 1 && pg != own_pgid && pg != self && (pg == main_pgid || (leader && leader->in)))
            kill(-pg, SIGKILL);
    }
}

/* In the shepherd: reap what of the tree has ended; whether nothing of it is left (a child
 * subreaper with no child has no descendant). */
static bool tree_gone(void)
{
    pid_t p;
    do
        p = waitpid(-1, NULL, WNOHANG);
    while (p > 0 || (p < 0 && errno == EINTR));
    return p < 0; /* ECHILD */
}

/* Kill and reap everything this process (the shepherd) has below it. Returns true when
 * nothing is left, false when something still is after until_ns (0: no limit). */
static bool tree_kill(pid_t main_pgid, uint64_t until_ns)
{
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int use_proc = -1; /* not known yet: most commands leave nothing, and then /proc is not read */
    for (;;) {
        if (tree_gone())
            return true;
        if (until_ns && now_ns() >= until_ns)
            return false;
        if (use_proc < 0)
            use_proc = proc_is_ours();
        if (use_proc)
            kill_below(getpid(), main_pgid, SIGKILL, true);
        else
            kill(-main_pgid, SIGKILL);
        /* SIGCHLD is blocked: wait for one, or 10 ms, then look again */
        struct timespec ts = {0, 10000000};
        sigtimedwait(&chld, NULL, &ts);
    }
}

/* Close every descriptor from 3 up except those in keep (sorted, each >= 3). */
static void close_others(const int *keep, size_t n)
{
    unsigned from = 3;
    for (size_t i = 0; i <= n; i++) {
        unsigned to = i < n ? (unsigned)keep[i] : ~0u;
        if (to > from && syscall(SYS_close_range, from, to - 1, 0u) < 0) {
            /* no close_range (before Linux 5.9): the descriptors that are open */
            DIR *d = opendir("/proc/self/fd");
            int dfd = d ? dirfd(d) : -1;
            struct dirent *de;
            while (d && (de = readdir(d)) != NULL) {
                int fd = atoi(de->d_name);
                if (de->d_name[0] != '.' && fd != dfd && (unsigned)fd >= from && (unsigned)fd < to)
                    close(fd);
            }
            if (d)
                closedir(d);
        }
        if (i < n)
            from = (unsigned)keep[i] + 1;
    }
}

static int write_all(int fd, const void *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1; /* the other side is gone */
        p = (const char *)p + w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *p, size_t n)
{
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            errno = EPIPE;
        if (r <= 0)
            return -1;
        p = (char *)p + r;
        n -= (size_t)r;
    }
    return 0;
}

/* A command for a shepherd: this header, carrying the command's stdin, stdout and stderr
 * (SCM_RIGHTS), then len bytes: the struct ident, then NUL-terminated argv (argc strings),
 * envp (nenv), PATH and, when has_cwd & 1, the directory (has_cwd & 2: the stdio is a
 * terminal's, spawn.tty). A header alone, all zero, is no
 * command: it dooms the running one (shep_doom); an idle shepherd skips it (it came late). */
struct shep_req {
    uint32_t len, argc, nenv, has_cwd;
};

/* Send s to the shepherd on fd (blocking); 0, or -1 with errno set. */
static int shep_send(int fd, const struct spawn *s)
{
    size_t argc = 0, nenv = 0, len = sizeof *s->id + strlen(s->path_env) + 1;
    for (; s->argv[argc]; argc++)
        len += strlen(s->argv[argc]) + 1;
    for (; s->envp[nenv]; nenv++)
        len += strlen(s->envp[nenv]) + 1;
    if (s->cwd)
        len += strlen(s->cwd) + 1;
    char *buf = malloc(len), *p = buf;
    if (buf == NULL) {
        errno = ENOMEM;
        return -1;
    }
    memcpy(p, s->id, sizeof *s->id);
    p += sizeof *s->id;
    for (size_t i = 0; i < argc; i++)
        p = stpcpy(p, s->argv[i]) + 1;
    for (size_t i = 0; i < nenv; i++)
        p = stpcpy(p, s->envp[i]) + 1;
    p = stpcpy(p, s->path_env) + 1;
    if (s->cwd)
        stpcpy(p, s->cwd);
    struct shep_req h = {(uint32_t)len, (uint32_t)argc, (uint32_t)nenv,
                         (s->cwd != NULL ? 1u : 0u) | (s->tty ? 2u : 0u)};
    struct iovec iov = {.iov_base = &h, .iov_len = sizeof h};
    union {
        char b[CMSG_SPACE(3 * sizeof(int))];
        struct cmsghdr align;
    } cm;
    memset(&cm, 0, sizeof cm);
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof cm.b};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(3 * sizeof(int));
    memcpy(CMSG_DATA(c), s->fds, 3 * sizeof(int));
    ssize_t n;
    do
        n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    int rc = n == (ssize_t)sizeof h ? write_all(fd, buf, len) : -1;
    if (rc < 0 && errno == 0)
        errno = EPIPE;
    free(buf);
    return rc;
}

/* In the shepherd: the next command from the agent into s (its strings in *buf, its arrays
 * in s->argv and s->envp, all the caller's to free). false when the agent closed the socket. */
static bool shep_recv(int sock, struct spawn *s, char **buf)
{
    struct shep_req h;
    struct iovec iov = {.iov_base = &h, .iov_len = sizeof h};
    union {
        char b[CMSG_SPACE(3 * sizeof(int))];
        struct cmsghdr align;
    } cm;
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof cm.b};
    ssize_t n;
    do {
        mh.msg_controllen = sizeof cm.b;
        n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    } while ((n < 0 && errno == EINTR) || (n == (ssize_t)sizeof h && h.len == 0));
    struct cmsghdr *c = n == (ssize_t)sizeof h ? CMSG_FIRSTHDR(&mh) : NULL;
    if (c == NULL || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(3 * sizeof(int)))
        return false;
    memcpy(s->fds, CMSG_DATA(c), 3 * sizeof(int));
    char *b = malloc(h.len);
    s->argv = calloc(h.argc + 1, sizeof *s->argv);
    s->envp = calloc(h.nenv + 1, sizeof *s->envp);
    if (b == NULL || s->argv == NULL || s->envp == NULL || h.len < sizeof(struct ident) ||
        read_all(sock, b, h.len) < 0 || b[h.len - 1] != 0)
        return false; /* the shepherd exits: nothing to free */
    *buf = b;
    s->id = (const struct ident *)b;
    const char *p = b + sizeof(struct ident), *end = b + h.len;
    for (uint32_t i = 0; i < h.argc && p < end; i++, p += strlen(p) + 1)
        s->argv[i] = (char *)p;
    for (uint32_t i = 0; i < h.nenv && p < end; i++, p += strlen(p) + 1)
        s->envp[i] = (char *)p;
    s->path_env = p < end ? p : "";
    p += p < end ? strlen(p) + 1 : 0;
    s->cwd = (h.has_cwd & 1) && p < end ? p : NULL;
    s->tty = (h.has_cwd & 2) != 0;
    return s->argv[0] != NULL;
}

/* In the shepherd, while a command runs: whether the agent doomed it on sock (any message
 * then is a doom header), or is gone (sock closed). Reads what is there. */
static bool shep_doomed(int sock)
{
    struct shep_req h[8];
    bool doomed = false;
    for (;;) {
        ssize_t n = recv(sock, h, sizeof h, MSG_DONTWAIT);
        if (n > 0)
            doomed = true;
        else if (n == 0 || (errno != EINTR && errno != EAGAIN))
            return true; /* nothing will answer the command: it ends whole */
        else if (errno == EAGAIN)
            return doomed;
    }
}

/* The shepherd (a forked agent), serving the agent on sock: for each command, start it, tell
 * its pid, wait for its main process, kill and reap the rest of its tree, report, and be
 * ready for the next one. Should something of the tree outlive TREE_KILL_MS of SIGKILL, it
 * reports all the same, goes on killing, and exits. Holds nothing of the agent but sock. */
static void __attribute__((noreturn)) shepherd(int sock)
{
    sigset_t all;
    sigfillset(&all); /* signals for the command (KILL requests) go to its group, not here */
    sigprocmask(SIG_SETMASK, &all, NULL);
    close_others(&sock, 1);
    /* Without it (no kernel of ours lacks it), orphans go to the agent: the tree is then
     * killed only as far as /proc still links it to the shepherd, and by process group. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
        dprintf(2, "dsec-agent: shepherd: PR_SET_CHILD_SUBREAPER: %s\n", strerror(errno));
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    int sfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC); /* -1: look every 10 ms */
    for (;;) {
        struct spawn s = {.scratch = spawn_path,
                          .scratch_len = sizeof spawn_path,
                          .msg = spawn_msg,
                          .msg_len = sizeof spawn_msg,
#ifdef DSEC_AGENT_FUZZ /* the harness expects each child gone (execve fails) before KILL */
                          .pid_fd = -1};
#else
                          .pid_fd = sock};
#endif
        char *buf = NULL;
        if (!shep_recv(sock, &s, &buf))
            _exit(0);
        pid_t pid = spawn_child(&s); /* the child told the agent its pid (pid_fd) */
        pid_t said = pid < 0 ? -errno : pid;
        for (int i = 0; i < 3; i++) /* only the command holds its pipes now */
            close(s.fds[i]);
        free(buf);
        free(s.argv);
        free(s.envp);
        if ((pid < 0 || s.pid_fd < 0) && write_all(sock, &said, sizeof said) < 0 && pid < 0)
            _exit(0); /* the agent is gone; a command is still finished below */
        if (pid < 0)
            continue;
        struct shep_report rp = {0};
        struct pollfd pf[2] = {{.fd = sock, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
        for (;;) {
            int st;
            struct rusage ru;
            pid_t p = wait4(-1, &st, WNOHANG, &ru);
            if (p == pid) {
                rp.status = st;
                rp.ru = ru;
                break;
            }
            if (p > 0 || (p < 0 && errno == EINTR))
                continue; /* an orphan of the tree: reaped */
            if (p < 0) { /* cannot be: the main process is our child */
                rp.status = 0x7f00;
                break;
            }
            if (poll(pf, 2, sfd >= 0 ? -1 : 10) <= 0)
                continue;
            if (pf[0].revents && shep_doomed(sock))
                pf[0].fd = -1; /* doomed; later doom headers are skipped when idle */
            struct signalfd_siginfo si;
            while (pf[1].revents && read(sfd, &si, sizeof si) > 0)
                ;
        }
        rp.exit_ns = now_ns();
        /* Whether the agent doomed it or it ended by itself, its tree ends with it (a doom
         * header that comes later is skipped by shep_recv). */
        bool clean = tree_kill(pid, rp.exit_ns + TREE_KILL_MS * 1000000ull);
        rp.reusable = clean && SHEP_IDLE_MAX > 0;
        int w = write_all(sock, &rp, sizeof rp);
        if (!clean) {
            dprintf(2, "dsec-agent: exec: processes of command %d outlived %d ms of SIGKILL\n",
                    (int)pid, TREE_KILL_MS);
            tree_kill(pid, 0);
        }
        if (!rp.reusable || w < 0)
            _exit(0);
    }
}

/* Wait until the shepherd sh answers on fd. Shepherds live in the sandbox, where its root
 * can stop them (SIGSTOP): a slow one is continued, so the agent never waits on a stopped one
 * for long. 0, or -1 when poll failed. */
static int shep_wait(pid_t sh, int fd)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    for (;;) {
        int n = poll(&pf, 1, 100);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -1;
        if (n == 0)
            kill(sh, SIGCONT);
    }
}

/* The agent ends m (timeout, KILL, SIGTERM): tell its shepherd to kill the whole tree when
 * the main process exits, before signalling that process so the shepherd knows by then.
 * Left alone, a command's background processes outlive it. Once a command: a doom header
 * is never refused for room then. Without a shepherd (it died), only the main process's
 * group is killed when it exits (reap, shepherd_gone). */
static void shep_doom(struct cmd *m)
{
    if (m->doomed)
        return;
    m->doomed = true;
    if (m->rep.fd < 0)
        return;
    struct shep_req h = {0};
    ssize_t n;
    do
        n = send(m->rep.fd, &h, sizeof h, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof h)
        logmsg("exec %" PRIu32 ": cannot tell its shepherd to end its tree: %s", m->id,
               n < 0 ? strerror(errno) : "short write");
}

/* Start s under a shepherd: an idle one, or a new fork of the agent. Returns the shepherd's
 * pid and sets *main_pid and *sock (the shepherd's socket, the caller's now); -1 with errno
 * set on failure. */
static pid_t spawn_shepherd(const struct spawn *s, pid_t *main_pid, int *sock)
{
#ifdef DSEC_AGENT_FUZZ
    fuzz_check_spawn(s);
#endif
    for (;;) {
        pid_t sh;
        int fd;
        bool fresh = g.nidle == 0;
        if (!fresh) {
            g.nidle--;
            sh = g.idle[g.nidle].pid;
            fd = g.idle[g.nidle].fd;
        } else {
            int sv[2];
            if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
                return -1;
            sh = fork();
            if (sh == 0) {
                close(sv[0]);
                shepherd(sv[1]);
            }
            int e = errno;
            close(sv[1]);
            if (sh < 0) {
                close(sv[0]);
                errno = e;
                return -1;
            }
            fd = sv[0];
        }
        /* The pid comes as soon as the command exec'd (vfork): as long as the agent's own
         * vfork kept it before. Waiting for it also keeps a rule of the event loop: a new
         * shepherd has closed its copies of the agent's descriptors by then, so an fd the
         * agent closes leaves its epoll set (a copy open elsewhere would keep it there). */
        pid_t said = 0;
        bool sent = shep_send(fd, s) == 0;
        if (sent && shep_wait(sh, fd) == 0 && read_all(fd, &said, sizeof said) == 0) {
            if (said > 0) {
                *main_pid = said;
                *sock = fd;
                return sh;
            }
            /* the command could not be started; the shepherd waits for the next one */
            if (SHEP_IDLE_MAX > 0 && g.nidle + 1 <= SHEP_IDLE_MAX) {
                g.idle[g.nidle].pid = sh;
                g.idle[g.nidle++].fd = fd;
            } else {
                close(fd); /* it exits */
            }
            errno = -said;
            return -1;
        }
        /* Dead (an idle shepherd killed meanwhile) or broken: never used again. Not reaped
         * yet, so its pid is still ours to kill. */
        int e = errno;
        close(fd);
        kill(sh, SIGKILL);
        while (waitpid(sh, NULL, 0) < 0 && errno == EINTR)
            ;
        /* An idle one that could not take the command (it died with the command unread:
         * ECONNRESET): the next, down to a new one. Once taken, the command may have
         * started: it is not started twice. */
        if (fresh || (sent && e != ECONNRESET)) {
            errno = e ? e : EIO;
            return -1;
        }
    }
}

/* ---- background processes: the table ----------------------------------------------------------
 */

static void proc_free(struct proc *p)
{
    free(p->sess);
    free(p->ring[0].buf);
    free(p->ring[1].buf);
    free(p);
}

/* Whether one more process fits the table, making room by forgetting the oldest ended one. */
static bool procs_room(void)
{
    if (g.nprocs < g.proc_max)
        return true;
    for (size_t i = 0; i < g.nprocs; i++)
        if (!g.procs[i]->running) {
            proc_free(g.procs[i]);
            memmove(g.procs + i, g.procs + i + 1, (g.nprocs - i - 1) * sizeof *g.procs);
            g.nprocs--;
            return true;
        }
    return false;
}

/* A new entry for m, started now (procs_room said there is room). */
static struct proc *proc_new(struct cmd *m, char **argv, uint64_t ring_max)
{
    struct proc *p = xrealloc(NULL, sizeof *p);
    memset(p, 0, sizeof *p);
    p->handle = g.next_handle++;
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
    if (g.procs == NULL)
        g.procs = xrealloc(NULL, g.proc_max * sizeof *g.procs);
    g.procs[g.nprocs++] = p;
    return p;
}

static struct proc *proc_by_handle(uint64_t handle)
{
    size_t lo = 0, hi = g.nprocs; /* sorted: handles only grow */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g.procs[mid]->handle == handle)
            return g.procs[mid];
        if (g.procs[mid]->handle < handle)
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
static void send_proc(struct conn *c, uint32_t id, uint8_t type, const struct proc *p)
{
    size_t plen = proc_info_len(p);
    uint8_t *p0 = conn_reserve(c, DSEC__AGENT_HDR + plen), *o = p0;
    o = dsec__agent_put_hdr(o, type, id, plen);
    o = put_proc_info(o, p);
    conn_commit(c, (size_t)(o - p0));
}

/* "K=V" entries: replace an entry with the same key or add one. */
static void env_set(char ***env, size_t *n, char *kv)
{
    size_t klen = strcspn(kv, "=");
    for (size_t i = 0; i < *n; i++)
        if (strncmp((*env)[i], kv, klen) == 0 && (*env)[i][klen] == '=') {
            (*env)[i] = kv;
            return;
        }
    (*env)[(*n)++] = kv;
}

static const char *env_get(char **env, size_t n, const char *key)
{
    size_t klen = strlen(key);
    for (size_t i = 0; i < n; i++)
        if (strncmp(env[i], key, klen) == 0 && env[i][klen] == '=')
            return env[i] + klen + 1;
    return NULL;
}

static void handle_sexec(struct conn *c, uint32_t id, uint64_t handle, const char *cmd,
                         size_t cmd_len, uint64_t timeout_ms, uint64_t out_max);
static int open_pty(int *master, int *slave, uint32_t rows, uint32_t cols);
static void sess_start(struct proc *p);
static void sess_interrupt(struct proc *p);
static void sess_tick(struct proc *p, uint64_t now);

/* EXEC, or PSTART (bg): a background process, which answers PROC at once. */
static void handle_exec(struct conn *c, uint32_t id, dsec__agent_rd *r, bool bg)
{
    const char *op = bg ? "start" : "exec";
    uint64_t timeout_ms = dsec__agent_get_u64(r);
    uint64_t out_max = bg ? 0 : dsec__agent_get_u64(r);
    uint64_t ring_max = 0, session = 0;
    bool keep_stdin = false, pty = false, sess = false;
    uint32_t rows = 0, cols = 0;
    size_t cwd_len, user_len, argc, nenv, in_len;
    const char *cwd = dsec__agent_get_str(r, DSEC__AGENT_PATH_MAX, &cwd_len);
    const char *user = dsec__agent_get_str(r, DSEC__AGENT_USER_MAX, &user_len);
    const char *arg0 = NULL;
    size_t arg0_len = 0;
    argc = dsec__agent_get_u32(r);
    /* argc 0 is a session's default shell (the flags come at the end: checked there) */
    if (r->bad || (argc == 0 && !bg) || argc > DSEC__AGENT_ARGV_MAX) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
                   "%s: bad cwd, user or argument count (1..%u arguments)", op,
                   DSEC__AGENT_ARGV_MAX);
        return;
    }
    /* Every string is copied once into one block, NUL-terminated, for execve. */
    char **argv = calloc(argc + 2, sizeof *argv); /* + a session's default shell */
    char **envp = NULL;
    char *block = NULL;
    struct cmd *m = NULL;
    int pfd[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};
    const uint8_t *rd_start = r->p;
    if (argv == NULL)
        goto nomem;
    size_t total = 0;
    for (size_t i = 0; i < argc; i++) {
        size_t l;
        const char *a = dsec__agent_get_str(r, DSEC__AGENT_ARG_LEN_MAX, &l);
        if (a == NULL)
            break;
        if (i == 0) {
            arg0 = a;
            arg0_len = l;
        }
        total += l + 1;
    }
    nenv = dsec__agent_get_u32(r);
    if (r->bad || nenv > DSEC__AGENT_ENV_MAX) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
                   "%s: bad argument or environment count (at most %u variables, %u bytes each)",
                   op, DSEC__AGENT_ENV_MAX, DSEC__AGENT_ARG_LEN_MAX);
        goto out;
    }
    const uint8_t *env_start = r->p;
    for (size_t i = 0; i < nenv; i++) {
        size_t kl, vl;
        const char *k = dsec__agent_get_str(r, DSEC__AGENT_ARG_LEN_MAX, &kl);
        dsec__agent_get_str(r, DSEC__AGENT_ARG_LEN_MAX, &vl);
        if (r->bad)
            break;
        if (kl == 0 || memchr(k, '=', kl)) {
            send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                       "%s: environment variable %zu has an empty name or one with '='", op, i);
            goto out;
        }
        total += kl + vl + 2;
    }
    const uint8_t *in = dsec__agent_get_bytes(r, DSEC__AGENT_STDIN_MAX, &in_len);
    if (bg) {
        ring_max = dsec__agent_get_u64(r);
        keep_stdin = dsec__agent_get_u8(r) != 0;
        if (r->p < r->end) { /* terminals and sessions: absent in older requests */
            uint8_t fl = dsec__agent_get_u8(r);
            rows = dsec__agent_get_u32(r);
            cols = dsec__agent_get_u32(r);
            pty = fl & DSEC__AGENT_S_PTY;
            sess = fl & DSEC__AGENT_S_SESSION;
        }
    } else if (r->p < r->end) {
        session = dsec__agent_get_u64(r);
    }
    if (!dsec__agent_done(r)) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "%s: malformed request", op);
        goto out;
    }
    if (session) {
        const char *field = argc != 1  ? NULL
                            : nenv     ? "environment variables"
                            : cwd_len  ? "cwd"
                            : user_len ? "user"
                            : in_len   ? "stdin"
                                       : "";
        if (field == NULL)
            send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                       "exec: a session command is one shell command line, not %zu arguments",
                       argc);
        else if (field[0])
            send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                       "exec: a session command takes no %s: it runs in the session's shell "
                       "(use cd and export there)",
                       field);
        else
            handle_sexec(c, id, session, arg0, arg0_len, timeout_ms, out_max);
        goto out;
    }
    if (argc == 0 && !sess) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
                   "start: no argument (only a shell session may leave argv empty)");
        goto out;
    }
    if (pty && sess) {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                   "start: a shell session runs without a terminal (pty and session are "
                   "exclusive)");
        goto out;
    }
    if (sess && in_len) {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                   "start: a shell session takes no stdin (its commands come with exec)");
        goto out;
    }
    if (pty && (rows > 65535 || cols > 65535)) {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                   "start: a window of %" PRIu32 " x %" PRIu32 " (at most 65535 x 65535)", rows,
                   cols);
        goto out;
    }
    if (sess && argc == 0) {
        argv[0] = (char *)(access("/bin/bash", X_OK) == 0 ? "/bin/bash" : "/bin/sh");
        argv[1] = NULL;
    }
    if (bg && ring_max > DSEC__AGENT_RING_MAX) {
        send_error(c, id, DSEC__AGENT_ERR_TOO_LARGE, 0,
                   "start: ring_max %" PRIu64 " is over the limit of %u bytes per stream", ring_max,
                   DSEC__AGENT_RING_MAX);
        goto out;
    }
    if (bg && !procs_room()) {
        send_error(c, id, DSEC__AGENT_ERR_TOO_LARGE, 0,
                   "start: %zu background processes are running, the most this sandbox keeps; "
                   "end one first",
                   g.proc_max);
        goto out;
    }

    /* The user first: an unknown one is the caller's error, not the command's. */
    struct ident ident = {0};
    char user_z[DSEC__AGENT_USER_MAX + 1];
    const char *user_spec = user_len ? memcpy(user_z, user, user_len) : g.default_user;
    if (user_len)
        user_z[user_len] = 0;
    if (user_spec) {
        const char *why = resolve_user(user_spec, &ident);
        if (why) {
            send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "%s: user \"%s\": %s", op, user_spec,
                       why);
            goto out;
        }
    }

    size_t home_len = strlen(ident.home), name_len = strlen(ident.name);
    total += cwd_len + 1 + (ident.name[0] ? home_len + 2 * name_len + 24 : 0);
    block = malloc(total);
    envp = calloc(g.nbase_env + nenv + 5, sizeof *envp);
    if (block == NULL || envp == NULL)
        goto nomem;
    char *b = block;
    dsec__agent_rd r2 = {.p = rd_start, .end = r->end};
    for (size_t i = 0; i < argc; i++) {
        size_t l;
        const char *s = dsec__agent_get_str(&r2, DSEC__AGENT_ARG_LEN_MAX, &l);
        argv[i] = memcpy(b, s, l);
        b[l] = 0;
        b += l + 1;
    }
    size_t ne = g.nbase_env;
    memcpy(envp, g.base_env, ne * sizeof *envp);
    if (ident.name[0]) { /* a passwd user gets its own HOME, USER and LOGNAME; the request may
                            override */
        b += sprintf(b, "HOME=%s", ident.home) + 1;
        env_set(&envp, &ne, b - home_len - 6);
        b += sprintf(b, "USER=%s", ident.name) + 1;
        env_set(&envp, &ne, b - name_len - 6);
        b += sprintf(b, "LOGNAME=%s", ident.name) + 1;
        env_set(&envp, &ne, b - name_len - 9);
    }
    if (pty)
        env_set(&envp, &ne, (char *)"TERM=xterm-256color");
    r2.p = env_start;
    for (size_t i = 0; i < nenv; i++) {
        size_t kl, vl;
        const char *k = dsec__agent_get_str(&r2, DSEC__AGENT_ARG_LEN_MAX, &kl);
        const char *v = dsec__agent_get_str(&r2, DSEC__AGENT_ARG_LEN_MAX, &vl);
        char *kv = b;
        memcpy(b, k, kl);
        b[kl] = '=';
        memcpy(b + kl + 1, v, vl);
        b[kl + 1 + vl] = 0;
        b += kl + vl + 2;
        env_set(&envp, &ne, kv);
    }
    envp[ne] = NULL;
    const char *cwd_z = g.workdir;
    if (cwd_len) {
        cwd_z = memcpy(b, cwd, cwd_len);
        b[cwd_len] = 0;
        b += cwd_len + 1;
    }
    const char *path_env = env_get(envp, ne, "PATH");

    m = calloc(1, sizeof *m);
    if (m == NULL)
        goto nomem;
    if (pty || sess)
        keep_stdin = true; /* a terminal's input; a session's commands */
    char boot[sizeof SESS_BOOT + SESS_TOK_LEN + 16];
    /* No stdin: the shared /dev/null instead of a pipe closed at once (fewer system calls). */
    bool null_in = in_len == 0 && !keep_stdin && g.null_fd >= 0;
    if (pty) {
        /* The slave is the child's stdin, stdout and stderr (pfd[0][0]); the master is read
         * as stdout (pfd[1][0]) and written as stdin through a copy (pfd[0][1]), as epoll
         * watches each descriptor once. */
        int e = open_pty(&pfd[1][0], &pfd[0][0], rows ? rows : 24, cols ? cols : 80);
        if (e == 0 && (pfd[0][1] = fcntl(pfd[1][0], F_DUPFD_CLOEXEC, 3)) < 0)
            e = errno;
        if (e) {
            send_error(c, id, DSEC__AGENT_ERR_IO, e, "start: a terminal: %s", strerror(e));
            goto out;
        }
    }
    for (int i = null_in ? 1 : 0; i < 3 && !pty; i++)
        if (pipe2(pfd[i], O_CLOEXEC) < 0) {
            send_error(c, id, DSEC__AGENT_ERR_IO, errno, "%s: pipe: %s", op, strerror(errno));
            goto out;
        }
    struct spawn s = {
        .argv = argv,
        .envp = envp,
        .path_env = path_env ? path_env : DEFAULT_PATH,
        .cwd = cwd_z,
        .id = &ident,
        .fds = {null_in ? g.null_fd : pfd[0][0], pty ? pfd[0][0] : pfd[1][1],
                pty ? pfd[0][0] : pfd[2][1]},
        .tty = pty,
        .scratch = spawn_path,
        .scratch_len = sizeof spawn_path,
        .msg = spawn_msg,
        .msg_len = sizeof spawn_msg,
    };
    m->start_ns = now_ns();
    pid_t main_pid = 0;
    int rep_fd = -1;
    pid_t pid = spawn_shepherd(&s, &main_pid, &rep_fd);
    if (pid < 0) {
        send_error(c, id, DSEC__AGENT_ERR_IO, errno, "%s: cannot start the command: %s", op,
                   strerror(errno));
        goto out;
    }
    m->conn = c;
    m->id = id;
    m->pid = pid;
    m->pgid = main_pid;
    m->rep = (struct pipe_ep){.kind = K_PIPE, .fd = rep_fd, .stream = 3, .cmd = m};
    ep_ctl(EPOLL_CTL_ADD, rep_fd, EPOLLIN, &m->rep);
    m->out_max = out_max;
    m->deadline_ns = timeout_ms ? m->start_ns + timeout_ms * 1000000u : 0;
    if (timeout_ms > UINT64_MAX / 2000000u) /* effectively forever; avoid the overflow */
        m->deadline_ns = 0;
    m->next = g.cmds;
    if (g.cmds)
        g.cmds->prev = m;
    g.cmds = m;
    if (bg) {
        m->conn = NULL; /* no connection's: PROC answers now, and output goes to the rings */
        m->proc = proc_new(m, argv, ring_max);
        m->proc->pty = pty;
        if (sess) {
            sess_start(m->proc);
            in_len = (size_t)snprintf(boot, sizeof boot, "__dsec_tok=%s\n%s", m->proc->sess->tok,
                                      SESS_BOOT);
            in = (const uint8_t *)boot;
        }
    }
    int mine[3] = {pfd[0][1], pfd[1][0], pfd[2][0]};
    for (int i = 0; i < 3; i++) {
        m->io[i] = (struct pipe_ep){.kind = K_PIPE, .fd = mine[i], .stream = i, .cmd = m};
        if (mine[i] < 0)
            continue;
        int theirs = i == 0 ? pfd[0][0] : pfd[i][1];
        if (theirs >= 0)
            close(theirs);
        fcntl(mine[i], F_SETFL, i == 0 ? O_WRONLY | O_NONBLOCK : O_RDONLY | O_NONBLOCK);
    }
    /* Feed stdin now; whatever the pipe does not take waits for EPOLLOUT. */
    size_t off = 0;
    while (off < in_len) {
        ssize_t n = write(m->io[0].fd, in + off, in_len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    if (off < in_len && errno == EAGAIN) {
        m->in = malloc(in_len - off);
        if (m->in) {
            memcpy(m->in, in + off, in_len - off);
            m->in_len = in_len - off;
            ep_ctl(EPOLL_CTL_ADD, m->io[0].fd, EPOLLOUT, &m->io[0]);
            if (m->proc) /* the rest goes in behind the answer; then stdin closes unless kept */
                m->proc->in_close = !keep_stdin;
        } else {
            close(m->io[0].fd);
            m->io[0].fd = -1;
        }
    } else if (m->io[0].fd >= 0 && !(keep_stdin && off == in_len)) {
        close(m->io[0].fd);
        m->io[0].fd = -1;
    }
    if (m->proc)
        m->proc->stdin_open = m->io[0].fd >= 0 && !sess; /* a session's is the agent's */
    for (int i = 1; i <= 2; i++)
        if (m->io[i].fd >= 0)
            ep_ctl(EPOLL_CTL_ADD, m->io[i].fd, EPOLLIN, &m->io[i]);
    if (m->proc)
        send_proc(c, id, DSEC__AGENT_T_PROC, m->proc);
    m = NULL;
    for (int i = 0; i < 3; i++)
        pfd[i][0] = pfd[i][1] = -1;
    goto out;
nomem:
    send_error(c, id, DSEC__AGENT_ERR_IO, ENOMEM, "%s: out of memory", op);
out:
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 2; j++)
            if (pfd[i][j] >= 0)
                close(pfd[i][j]);
    free(m);
    free(envp);
    free(block);
    free(argv);
}

static void check_timeouts(void)
{
    uint64_t now = now_ns();
    for (struct cmd *m = g.cmds; m; m = m->next)
        if (m->proc && m->proc->sess && m->proc->sess->busy && !m->exited)
            sess_tick(m->proc, now);
    for (struct cmd *m = g.cmds; m; m = m->next)
        if (m->deadline_ns && !m->exited && now >= m->deadline_ns) {
            m->timed_out = true;
            m->deadline_ns = 0;
            shep_doom(m);
            kill(-m->pgid, SIGKILL); /* its shepherd then kills the rest of its tree */
            if (m->pid > 0)
                kill(m->pid, SIGCONT); /* should the sandbox's root have stopped it */
        }
}

static int next_timeout_ms(void)
{
    uint64_t now = now_ns(), best = 0;
    for (struct cmd *m = g.cmds; m; m = m->next)
        if (m->deadline_ns && (best == 0 || m->deadline_ns < best))
            best = m->deadline_ns;
    for (struct cmd *m = g.cmds; m; m = m->next) {
        const struct sess *x = m->proc ? m->proc->sess : NULL;
        if (x && x->busy && x->deadline_ns && (best == 0 || x->deadline_ns < best))
            best = x->deadline_ns;
        if (x && x->busy && x->int_at && x->int_stage < 2) {
            uint64_t t = x->int_next;
            uint64_t step =
                x->int_at + (x->int_stage == 0 ? SESS_INT_KILL_MS : SESS_INT_END_MS) * 1000000ull;
            if (step < t)
                t = step;
            if (best == 0 || t < best)
                best = t;
        }
    }
    for (const struct waiter *w = g.waiters; w; w = w->next)
        if (best == 0 || w->deadline_ns < best)
            best = w->deadline_ns;
    for (size_t i = 0; i < g.nports; i++)
        if (g.ports[i].fd < 0 && g.ports[i].conn == NULL && (best == 0 || now + 1000000000u < best))
            best = now + 1000000000u; /* a port to reopen */
    if (best == 0)
        return -1;
    if (best <= now)
        return 0;
    uint64_t ms = (best - now + 999999u) / 1000000u;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* A new client starts on this connection (on a port, maybe without our having seen the last
 * one leave): nothing queued or running for the old one reaches it. */
static void handle_sync(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    if (!dsec__agent_done(r)) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "sync: malformed request");
        return;
    }
    c->woff = c->wlen = 0;
    procs_forget_conn(c);
    for (struct cmd *m = g.cmds; m; m = m->next)
        if (m->conn == c) {
            m->conn = NULL;
            for (int s = 1; s <= 2; s++)
                if (m->io[s].paused && m->io[s].fd >= 0) {
                    m->io[s].paused = false;
                    ep_ctl(EPOLL_CTL_MOD, m->io[s].fd, EPOLLIN, &m->io[s]);
                }
        }
    send_hello(c, id);
}

/* The process defaults of the sandbox this agent now serves, given once by the node to an
 * agent of the warm pool after its root became the sandbox's: the base environment (when any
 * variable is given: exactly those, as --env), the working directory and the user, which must
 * exist in the new root's /etc/passwd (as --user). */
static void handle_setup(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    if (g.set_up) {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "setup: the defaults are already set");
        return;
    }
    uint32_t n = dsec__agent_get_u32(r);
    if (n > DSEC__AGENT_ENV_MAX) {
        send_error(c, id, DSEC__AGENT_ERR_TOO_LARGE, 0, "setup: %" PRIu32 " variables (most %u)", n,
                   DSEC__AGENT_ENV_MAX);
        return;
    }
    const uint8_t *start = r->p;
    for (uint32_t i = 0; i < n; i++) {
        size_t l;
        const char *kv = dsec__agent_get_str(r, DSEC__AGENT_ARG_LEN_MAX, &l);
        if (kv != NULL && (l == 0 || kv[0] == '=' || memchr(kv, '=', l) == NULL)) {
            send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "setup: variable %" PRIu32 " is not K=V",
                       i);
            return;
        }
    }
    size_t wl, ul;
    const char *wd = dsec__agent_get_str(r, DSEC__AGENT_PATH_MAX, &wl);
    const char *us = dsec__agent_get_str(r, DSEC__AGENT_USER_MAX, &ul);
    if (wd == NULL || us == NULL || !dsec__agent_done(r) || wl == 0 || ul == 0) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "setup: malformed request");
        return;
    }
    char user[DSEC__AGENT_USER_MAX + 1];
    memcpy(user, us, ul);
    user[ul] = 0;
    struct ident ident;
    const char *why = resolve_user(user, &ident);
    if (why) {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "--user %s: %s", user, why);
        return;
    }
    if (n > 0) {
        char **env = xrealloc(NULL, (n + 1) * sizeof *env);
        size_t ne = 0;
        dsec__agent_rd r2 = {.p = start, .end = r->end};
        for (uint32_t i = 0; i < n; i++) {
            size_t l;
            const char *kv = dsec__agent_get_str(&r2, DSEC__AGENT_ARG_LEN_MAX, &l);
            char *copy = xrealloc(NULL, l + 1);
            memcpy(copy, kv, l);
            copy[l] = 0;
            env_set(&env, &ne, copy);
        }
        env[ne] = NULL;
        g.base_env = env; /* the old one stays: main's, or the runtime's environ */
        g.nbase_env = ne;
    }
    char *w = xrealloc(NULL, wl + 1), *u = xrealloc(NULL, ul + 1);
    memcpy(w, wd, wl);
    w[wl] = 0;
    memcpy(u, user, ul + 1);
    g.workdir = w;
    g.default_user = u;
    g.set_up = true;
    if (chdir("/") < 0) /* the new root, whatever the old cwd was */
        logmsg("setup: chdir /: %s", strerror(errno));
    /* Idle shepherds were forked before: their cwd may be the old one. They go (and exit). */
    for (size_t i = 0; i < g.nidle; i++)
        close(g.idle[i].fd);
    g.nidle = 0;
    send_ok(c, id, 0);
}

static void handle_kill(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    uint32_t sig = dsec__agent_get_u32(r);
    if (!dsec__agent_done(r)) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "kill: malformed request");
        return;
    }
    if (sig < 1 || sig > (uint32_t)SIGRTMAX) {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "kill: no signal %" PRIu32, sig);
        return;
    }
    uint64_t n = 0;
    for (struct cmd *m = g.cmds; m; m = m->next) {
        if (!m->exited && m->proc && m->proc->sess && m->proc->sess->busy) {
            /* a session's command, not its shell: SIGINT interrupts it; another signal goes
             * to what is below the shell, and the interrupt unwinds the shell's part */
            bool below = sig != SIGINT && proc_is_ours();
            if (below)
                kill_below(m->pgid, m->pgid, (int)sig, false);
            sess_interrupt(m->proc);
            /* what was signalled ends first: bash says what killed it within the command's
             * output, which a return from the INT trap during its wait would put off to the
             * next command's */
            if (below && m->proc->sess->int_next == m->proc->sess->int_at)
                m->proc->sess->int_next += SESS_INT_KILL_WAIT_MS * 1000000ull;
            sess_tick(m->proc, now_ns());
            n++;
            continue;
        }
        if (m->exited || m->proc) /* background processes have PSIGNAL */
            continue;
        shep_doom(m); /* when the main process exits, its tree goes too */
        if (kill(-m->pgid, (int)sig) == 0)
            n++;
    }
    send_ok(c, id, n);
}

/* ---- background processes: the requests --------------------------------------------------------
 */

/* The process a request names, or NULL with the error sent. */
static struct proc *get_proc(struct conn *c, uint32_t id, uint64_t handle, const char *op)
{
    struct proc *p = proc_by_handle(handle);
    if (p == NULL)
        send_error(c, id, DSEC__AGENT_ERR_NOT_FOUND, 0,
                   "%s: no process with handle %" PRIu64 " in this sandbox", op, handle);
    return p;
}

/* A new pseudo-terminal of rows x cols: its master (non-blocking) and its slave, both
 * close-on-exec. 0 or an errno. The slave is opened through the master (TIOCGPTPEER) where
 * the kernel can, so a /dev/pts of another mount never gets in the way. */
static int open_pty(int *master, int *slave, uint32_t rows, uint32_t cols)
{
    int m = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
    if (m < 0)
        return errno;
    int unlock = 0, e = 0;
    struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
    if (ioctl(m, TIOCSPTLCK, &unlock) < 0 || ioctl(m, TIOCSWINSZ, &ws) < 0) {
        e = errno;
        close(m);
        return e;
    }
    int sl = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (sl < 0) {
        unsigned n;
        char path[64];
        if (ioctl(m, TIOCGPTN, &n) == 0) {
            snprintf(path, sizeof path, "/dev/pts/%u", n);
            sl = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC);
        }
        if (sl < 0) {
            e = errno;
            close(m);
            return e;
        }
    }
    *master = m;
    *slave = sl;
    return 0;
}

/* p becomes a session: its token and marker. The shell gets SESS_BOOT as its first stdin. */
static void sess_start(struct proc *p)
{
    struct sess *x = xrealloc(NULL, sizeof *x);
    memset(x, 0, sizeof *x);
    uint8_t rnd[16];
    size_t got = 0;
    while (got < sizeof rnd) {
        ssize_t n = getrandom(rnd + got, sizeof rnd - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) { /* no getrandom: the clock and pid, still unknown to commands */
            uint64_t t = now_ns() ^ ((uint64_t)getpid() << 32) ^ p->handle;
            for (; got < sizeof rnd; got++, t = t * 6364136223846793005ull + 1442695040888963407ull)
                rnd[got] = (uint8_t)(t >> 56);
            break;
        }
        got += (size_t)n;
    }
    memcpy(x->tok, "dsec", 4);
    for (size_t i = 0; i < sizeof rnd; i++)
        snprintf(x->tok + 4 + 2 * i, 3, "%02x", rnd[i]);
    x->mark[0] = 036;
    memcpy(x->mark + 1, x->tok, SESS_TOK_LEN);
    x->mark[1 + SESS_TOK_LEN] = ':';
    x->mark_len = SESS_TOK_LEN + 2;
    p->sess = x;
}

/* Queue bytes for the stdin of p's command (a session's shell): straight into the pipe as far
 * as it takes them, the rest behind what is pending (written on EPOLLOUT, answered to nobody). */
static void proc_feed(struct proc *p, const uint8_t *data, size_t len)
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
    size_t rest = m->in ? m->in_len - m->in_off : 0;
    uint8_t *b = xrealloc(NULL, rest + len - off);
    if (rest)
        memcpy(b, m->in + m->in_off, rest);
    memcpy(b + rest, data + off, len - off);
    bool watched = m->in != NULL;
    free(m->in);
    m->in = b;
    m->in_off = 0;
    m->in_len = rest + len - off;
    if (!watched)
        ep_ctl(EPOLL_CTL_ADD, m->io[0].fd, EPOLLOUT, &m->io[0]);
}

/* EXEC in a session: the command line goes to the shell, single-quoted (a quote becomes
 * '\''), so nothing in it is shell syntax until eval. */
static void handle_sexec(struct conn *c, uint32_t id, uint64_t handle, const char *cmd,
                         size_t cmd_len, uint64_t timeout_ms, uint64_t out_max)
{
    struct proc *p = proc_by_handle(handle);
    if (p == NULL) {
        send_error(c, id, DSEC__AGENT_ERR_NOT_FOUND, 0,
                   "exec: no process with handle %" PRIu64 " in this sandbox", handle);
        return;
    }
    if (p->sess == NULL) {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                   "exec: process %" PRIu64 " is not a shell session", handle);
        return;
    }
    struct sess *x = p->sess;
    if (!p->running || p->cmd == NULL || p->cmd->io[0].fd < 0) {
        send_error(c, id, DSEC__AGENT_ERR_STATE, 0, "exec: session %" PRIu64 " has ended", handle);
        return;
    }
    if (x->busy) {
        send_error(c, id, DSEC__AGENT_ERR_STATE, 0,
                   "exec: session %" PRIu64 " is running a command; wait for it or interrupt it",
                   handle);
        return;
    }
    /* The trap is set again each time: bash, its return having cut short a wait for a child
     * that SIGINT ended, leaves its own SIGINT handler in a state that no longer runs it. */
    static const char head[] = "trap \"$__dsec_int\" INT; __dsec_run '";
    static const char tail[] =
        "' </dev/null 7>&- 8>&-; __dsec_st=$?; [ -z \"${__dsec_intd:-}\" ] || __dsec_st=130; "
        "__dsec_intd=; "
        "command printf '\\036%s:%d\\n' \"$__dsec_tok\" \"$__dsec_st\" >&7; "
        "command printf '\\036%s:%d\\n' \"$__dsec_tok\" \"$__dsec_st\" >&8\n";
    size_t quotes = 0;
    for (size_t i = 0; i < cmd_len; i++)
        quotes += cmd[i] == '\'';
    size_t len = sizeof head - 1 + cmd_len + 3 * quotes + sizeof tail - 1;
    uint8_t *line = xrealloc(NULL, len), *o = line;
    memcpy(o, head, sizeof head - 1);
    o += sizeof head - 1;
    for (size_t i = 0; i < cmd_len; i++) {
        if (cmd[i] == '\'') {
            memcpy(o, "'\\''", 4);
            o += 4;
        } else {
            *o++ = (uint8_t)cmd[i];
        }
    }
    memcpy(o, tail, sizeof tail - 1);
    x->busy = true;
    x->marked[0] = x->marked[1] = false;
    x->status = 0;
    x->conn = c;
    x->id = id;
    x->out_max = out_max;
    x->seen[0] = x->seen[1] = 0;
    x->start_ns = now_ns();
    x->deadline_ns =
        timeout_ms && timeout_ms <= UINT64_MAX / 2000000u ? x->start_ns + timeout_ms * 1000000u : 0;
    x->timed_out = x->interrupted = false;
    x->int_at = x->int_next = 0;
    x->int_stage = 0;
    proc_feed(p, line, len);
    free(line);
}

/* Interrupt the command running in session p (sess_tick carries it on). */
static void sess_interrupt(struct proc *p)
{
    struct sess *x = p->sess;
    if (!x->busy || x->int_at)
        return;
    x->int_at = x->int_next = now_ns();
}

/* An interrupt under way, at now: SIGINT again, or the next step up. */
static void sess_tick(struct proc *p, uint64_t now)
{
    struct sess *x = p->sess;
    struct cmd *m = p->cmd;
    if (x->deadline_ns && now >= x->deadline_ns) {
        x->timed_out = true;
        x->deadline_ns = 0;
        sess_interrupt(p);
        now = now_ns(); /* as late as the interrupt's start */
    }
    if (!x->busy || x->int_at == 0 || m == NULL || m->exited)
        return;
    uint64_t since = now > x->int_at ? now - x->int_at : 0;
    if (since >= SESS_INT_END_MS * 1000000ull && x->int_stage < 2) {
        logmsg("session %" PRIu64 ": the shell did not come back from an interrupt; ending it",
               p->handle);
        x->int_stage = 2;
        shep_doom(m);
        kill(-m->pgid, SIGKILL);
        if (m->pid > 0)
            kill(m->pid, SIGCONT);
        return;
    }
    if (since >= SESS_INT_KILL_MS * 1000000ull && x->int_stage < 1) {
        x->int_stage = 1;
        if (proc_is_ours())
            kill_below(m->pgid, m->pgid, SIGKILL, false);
    }
    if (x->int_stage < 2 && now >= x->int_next && !(x->booted[0] && x->booted[1])) {
        x->int_next = now + 20000000u; /* the trap is not set yet: look again soon */
    } else if (x->int_stage < 2 && now >= x->int_next) {
        kill(-m->pgid, SIGINT);
        x->int_next = now + SESS_INT_EVERY_MS * 1000000ull;
    }
}

static void handle_presize(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    uint64_t handle = dsec__agent_get_u64(r);
    uint32_t rows = dsec__agent_get_u32(r), cols = dsec__agent_get_u32(r);
    if (!dsec__agent_done(r)) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "resize: malformed request");
        return;
    }
    if (rows < 1 || cols < 1 || rows > 65535 || cols > 65535) {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                   "resize: a window of %" PRIu32 " x %" PRIu32 " (1..65535 each)", rows, cols);
        return;
    }
    struct proc *p = get_proc(c, id, handle, "resize");
    if (p == NULL)
        return;
    if (!p->pty) {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "resize: process %" PRIu64 " has no terminal",
                   handle);
        return;
    }
    if (!p->running || p->cmd == NULL || p->cmd->io[1].fd < 0) {
        send_error(c, id, DSEC__AGENT_ERR_STATE, 0, "resize: process %" PRIu64 " has ended",
                   handle);
        return;
    }
    struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
    if (ioctl(p->cmd->io[1].fd, TIOCSWINSZ, &ws) < 0) {
        send_error(c, id, DSEC__AGENT_ERR_IO, errno, "resize: process %" PRIu64 ": %s", handle,
                   strerror(errno));
        return;
    }
    send_ok(c, id, 0);
}

static void handle_plist(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    if (!dsec__agent_done(r)) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "list processes: malformed request");
        return;
    }
    size_t plen = 4;
    for (size_t i = 0; i < g.nprocs; i++)
        plen += proc_info_len(g.procs[i]);
    uint8_t *p0 = conn_reserve(c, DSEC__AGENT_HDR + plen), *o = p0;
    o = dsec__agent_put_hdr(o, DSEC__AGENT_T_PROCS, id, plen);
    o = dsec__agent_put_u32(o, (uint32_t)g.nprocs);
    for (size_t i = 0; i < g.nprocs; i++)
        o = put_proc_info(o, g.procs[i]);
    conn_commit(c, (size_t)(o - p0));
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

static void handle_psignal(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    uint64_t handle = dsec__agent_get_u64(r);
    uint32_t sig = dsec__agent_get_u32(r);
    if (!dsec__agent_done(r)) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "signal: malformed request");
        return;
    }
    if (sig < 1 || sig > (uint32_t)SIGRTMAX) {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "signal: no signal %" PRIu32, sig);
        return;
    }
    struct proc *p = get_proc(c, id, handle, "signal");
    if (p == NULL)
        return;
    if (!p->running) {
        char how[96];
        send_error(c, id, DSEC__AGENT_ERR_STATE, 0, "signal: process %" PRIu64 " already exited %s",
                   handle, proc_how(p, how, sizeof how));
        return;
    }
    struct cmd *m = p->cmd;
    if (p->sess && sig == SIGINT) { /* the running command only; idle: nothing to do */
        if (p->sess->busy) {
            p->sess->interrupted = true;
            sess_interrupt(p);
            sess_tick(p, now_ns());
        }
        send_ok(c, id, 0);
        return;
    }
    if (sig == SIGKILL) { /* as at a timeout: its shepherd kills the rest of its tree */
        shep_doom(m);
        kill(-m->pgid, SIGKILL);
        if (m->pid > 0)
            kill(m->pid, SIGCONT);
    } else {
        /* the group; when the main process exits, its shepherd ends the rest of the tree */
        kill(-m->pgid, (int)sig);
    }
    send_ok(c, id, 0);
}

static void handle_pstdin(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    uint64_t handle = dsec__agent_get_u64(r);
    bool close_after = dsec__agent_get_u8(r) != 0;
    size_t len;
    const uint8_t *data = dsec__agent_get_bytes(r, DSEC__AGENT_STDIN_MAX, &len);
    if (!dsec__agent_done(r)) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
                   "stdin: malformed request or more than %u bytes", DSEC__AGENT_STDIN_MAX);
        return;
    }
    struct proc *p = get_proc(c, id, handle, "stdin");
    if (p == NULL)
        return;
    if (!p->running) {
        char how[96];
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "stdin: process %" PRIu64 " ended %s", handle,
                   proc_how(p, how, sizeof how));
        return;
    }
    struct cmd *m = p->cmd;
    if (p->sess) {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                   "stdin: process %" PRIu64 " is a shell session; run commands in it with exec",
                   handle);
        return;
    }
    uint8_t *eot = NULL; /* a terminal's close: ^D, as typed (the terminal stays) */
    if (p->pty && close_after) {
        eot = xrealloc(NULL, len + 1);
        if (len)
            memcpy(eot, data, len);
        eot[len++] = 4;
        data = eot;
        close_after = false;
    }
    if (!p->stdin_open || m->io[0].fd < 0 || p->in_close) {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                   "stdin: the stdin of process %" PRIu64 " is closed", handle);
        goto out;
    }
    if (p->in_conn) {
        send_error(c, id, DSEC__AGENT_ERR_STATE, 0,
                   "stdin: process %" PRIu64
                   " has not taken the bytes of an earlier write yet; wait for its answer",
                   handle);
        goto out;
    }
    if (m->in_len - m->in_off + len > DSEC__AGENT_STDIN_MAX) { /* bytes of PSTART still pending */
        send_error(c, id, DSEC__AGENT_ERR_TOO_LARGE, 0,
                   "stdin: process %" PRIu64 " has %zu bytes pending, at most %u", handle,
                   m->in_len - m->in_off, DSEC__AGENT_STDIN_MAX);
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
        size_t rest = m->in_len - m->in_off;
        uint8_t *b = xrealloc(NULL, rest + len - off);
        if (rest)
            memcpy(b, m->in + m->in_off, rest);
        memcpy(b + rest, data + off, len - off);
        bool watched = m->in != NULL;
        free(m->in);
        m->in = b;
        m->in_off = 0;
        m->in_len = rest + len - off;
        if (!watched)
            ep_ctl(EPOLL_CTL_ADD, m->io[0].fd, EPOLLOUT, &m->io[0]);
        goto out;
    }
    proc_stdin_taken(p, m, broken ? len - off : 0);
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
    uint8_t *p0 = conn_reserve(c, DSEC__AGENT_HDR + plen), *o = p0;
    o = dsec__agent_put_hdr(o, DSEC__AGENT_T_POUT, id, plen);
    o = put_proc_info(o, p);
    for (int s = 0; s < 2; s++) {
        o = dsec__agent_put_u64(o, from[s]);
        o = dsec__agent_put_u32(o, (uint32_t)n[s]);
        if (n[s])
            ring_get(&p->ring[s], from[s], n[s], o);
        o += n[s];
    }
    conn_commit(c, (size_t)(o - p0));
}

/* Whether a POUTPUT on p from off has nothing to wait for. */
static bool pout_ready(const struct proc *p, const uint64_t off[2])
{
    return !p->running || p->ring[0].total > off[0] || p->ring[1].total > off[1];
}

static void handle_poutput(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    uint64_t handle = dsec__agent_get_u64(r);
    uint64_t off[2];
    off[0] = dsec__agent_get_u64(r);
    off[1] = dsec__agent_get_u64(r);
    uint64_t max = dsec__agent_get_u64(r);
    uint32_t wait_ms = r->p < r->end ? dsec__agent_get_u32(r) : 0; /* absent in older requests */
    if (!dsec__agent_done(r)) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "output: malformed request");
        return;
    }
    if (wait_ms > DSEC__AGENT_WAIT_MAX_MS) {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
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
    struct waiter *w = xrealloc(NULL, sizeof *w);
    *w = (struct waiter){.conn = c,
                         .id = id,
                         .handle = handle,
                         .off = {off[0], off[1]},
                         .max = max,
                         .deadline_ns = now_ns() + (uint64_t)wait_ms * 1000000u,
                         .next = g.waiters};
    g.waiters = w;
}

/* Answer the held POUTPUTs that have something (or waited enough). They are taken off the
 * list first: an answer may close a connection, which drops its waiters from the list. */
static void waiters_run(void)
{
    uint64_t now = now_ns();
    struct waiter *ready = NULL;
    for (struct waiter **w = &g.waiters; *w;) {
        struct proc *p = proc_by_handle((*w)->handle);
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
        struct proc *p = proc_by_handle(d->handle);
        if (p == NULL) /* forgotten meanwhile (the table was full) */
            send_error(d->conn, d->id, DSEC__AGENT_ERR_NOT_FOUND, 0,
                       "output: process %" PRIu64 " was forgotten while waited for", d->handle);
        else
            send_pout(d->conn, d->id, p, d->off, d->max);
        free(d);
    }
}

/* ---- files --------------------------------------------------------------------------------------
 */

/* The path field of a file request, NUL-terminated in buf; false (and an error sent) if bad. */
static bool get_path(struct conn *c, uint32_t id, dsec__agent_rd *r, const char *op,
                     char buf[DSEC__AGENT_PATH_MAX + 1])
{
    size_t len;
    const char *p = dsec__agent_get_str(r, DSEC__AGENT_PATH_MAX, &len);
    if (p == NULL) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
                   "%s: malformed request or path longer than %u bytes", op, DSEC__AGENT_PATH_MAX);
        return false;
    }
    memcpy(buf, p, len);
    buf[len] = 0;
    if (buf[0] != '/') {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "%s: path \"%s\" is not absolute", op, buf);
        return false;
    }
    return true;
}

/* ---- uploads' temporary files: watched, and swept when stale --------------------------- */

/* Temporary files of uploads this agent wrote (DSEC__AGENT_UPLOAD_PREFIX): a client that
 * vanished mid-transfer leaves nothing behind for longer than the stale time. */
struct upload_tmp {
    char *path;
    uint64_t touched_ns;
    struct upload_tmp *next;
};

static struct {
    struct upload_tmp *list;
    uint64_t stale_ns;
} up = {.stale_ns = (uint64_t)DSEC__AGENT_UPLOAD_STALE_S * 1000000000u};

static bool is_upload_tmp(const char *path)
{
    const char *b = strrchr(path, '/');
    return b != NULL && strncmp(b + 1, DSEC__AGENT_UPLOAD_PREFIX,
                                sizeof DSEC__AGENT_UPLOAD_PREFIX - 1) == 0;
}

static void upload_touch(const char *path)
{
    if (!is_upload_tmp(path))
        return;
    for (struct upload_tmp *u = up.list; u; u = u->next)
        if (strcmp(u->path, path) == 0) {
            u->touched_ns = now_ns();
            return;
        }
    struct upload_tmp *u = malloc(sizeof *u);
    if (u == NULL || (u->path = strdup(path)) == NULL) {
        free(u);
        return; /* unwatched: the next write tries again */
    }
    u->touched_ns = now_ns();
    u->next = up.list;
    up.list = u;
}

static void upload_forget(const char *path)
{
    for (struct upload_tmp **pp = &up.list; *pp; pp = &(*pp)->next)
        if (strcmp((*pp)->path, path) == 0) {
            struct upload_tmp *u = *pp;
            *pp = u->next;
            free(u->path);
            free(u);
            return;
        }
}

static void uploads_sweep(void)
{
    uint64_t now = now_ns();
    for (struct upload_tmp **pp = &up.list; *pp;) {
        struct upload_tmp *u = *pp;
        if (now - u->touched_ns < up.stale_ns) {
            pp = &u->next;
            continue;
        }
        if (unlink(u->path) < 0 && errno != ENOENT)
            logmsg("removing the stale upload %s: %s", u->path, strerror(errno));
        else
            logmsg("removed the stale upload %s", u->path);
        *pp = u->next;
        free(u->path);
        free(u);
    }
}

/* Milliseconds until the next stale upload is due (-1: none), folded into timeout_ms. */
static int uploads_timeout(int timeout_ms)
{
    uint64_t now = now_ns(), best = 0;
    for (struct upload_tmp *u = up.list; u; u = u->next) {
        uint64_t due = u->touched_ns + up.stale_ns;
        if (best == 0 || due < best)
            best = due;
    }
    if (best == 0)
        return timeout_ms;
    uint64_t ms = best <= now ? 0 : (best - now + 999999u) / 1000000u;
    if (ms > INT_MAX)
        ms = INT_MAX;
    return timeout_ms < 0 || (int)ms < timeout_ms ? (int)ms : timeout_ms;
}

static int mkdir_parents(char *path)
{
    for (char *p = path + 1; (p = strchr(p, '/')) != NULL; p++) {
        *p = 0;
        int rc = mkdir(path, 0755);
        int e = errno;
        *p = '/';
        if (rc < 0 && e != EEXIST) {
            errno = e;
            return -1;
        }
    }
    return 0;
}

static void handle_fwrite(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    char path[DSEC__AGENT_PATH_MAX + 1];
    uint32_t mode = dsec__agent_get_u32(r);
    bool append = dsec__agent_get_u8(r) != 0;
    if (!get_path(c, id, r, "write", path))
        return;
    size_t len;
    const uint8_t *data = dsec__agent_get_bytes(r, DSEC__AGENT_FILE_MAX, &len);
    if (!dsec__agent_done(r)) {
        send_error(c, id, DSEC__AGENT_ERR_TOO_LARGE, 0,
                   "write \"%s\": malformed request or more than %u bytes", path,
                   DSEC__AGENT_FILE_MAX);
        return;
    }
    if (mkdir_parents(path) < 0) {
        send_errno(c, id, errno, "creating the parent directories of", path);
        return;
    }
    int fd =
        open(path,
             O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | (append ? O_APPEND : O_TRUNC),
             mode ? mode & 07777 : 0644);
    if (fd < 0) {
        send_errno(c, id, errno, "opening for writing", path);
        return;
    }
    struct stat st;
    if (fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
        close(fd);
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "write \"%s\": not a regular file", path);
        return;
    }
    size_t off = 0;
    while (off < len) {
        ssize_t n = write(fd, data + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            close(fd);
            send_errno(c, id, e, "writing", path);
            return;
        }
        off += (size_t)n;
    }
    if (mode != 0 && fchmod(fd, mode & 07777) < 0) {
        int e = errno;
        close(fd);
        send_errno(c, id, e, "setting the mode of", path);
        return;
    }
    if (close(fd) < 0) {
        send_errno(c, id, errno, "closing", path);
        return;
    }
    upload_touch(path);
    send_ok(c, id, 0);
}

static void handle_fmkdir(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    char path[DSEC__AGENT_PATH_MAX + 1];
    bool parents = dsec__agent_get_u8(r) != 0;
    uint32_t mode = dsec__agent_get_u32(r);
    if (!get_path(c, id, r, "mkdir", path))
        return;
    if (!dsec__agent_done(r)) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "mkdir \"%s\": malformed request", path);
        return;
    }
    mode = mode ? mode & 07777 : 0755;
    if (parents && mkdir_parents(path) < 0) {
        send_errno(c, id, errno, "creating the parent directories of", path);
        return;
    }
    if (mkdir(path, mode) < 0) {
        struct stat st;
        int e = errno;
        if (!(parents && e == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))) {
            send_errno(c, id, e, "mkdir", path);
            return;
        }
    } else if (chmod(path, mode) < 0) { /* the umask took bits away */
        send_errno(c, id, errno, "setting the mode of", path);
        return;
    }
    send_ok(c, id, 0);
}

static int fsync_path(const char *path, bool dir)
{
    int fd = open(path, (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC | O_NOCTTY |
                            O_NONBLOCK);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

static void handle_frename(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    char from[DSEC__AGENT_PATH_MAX + 1], to[DSEC__AGENT_PATH_MAX + 1];
    bool sync_it = dsec__agent_get_u8(r) != 0;
    if (!get_path(c, id, r, "rename", from) || !get_path(c, id, r, "rename", to))
        return;
    if (!dsec__agent_done(r)) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "rename \"%s\": malformed request", from);
        return;
    }
    struct stat st;
    if (sync_it && lstat(from, &st) == 0 && S_ISREG(st.st_mode) && fsync_path(from, false) < 0) {
        send_errno(c, id, errno, "syncing", from);
        return;
    }
    if (rename(from, to) < 0) {
        send_errno(c, id, errno, "rename", from);
        return;
    }
    upload_forget(from);
    if (sync_it) {
        char dir[DSEC__AGENT_PATH_MAX + 1];
        memcpy(dir, to, strlen(to) + 1);
        char *slash = strrchr(dir, '/');
        if (slash == dir)
            slash[1] = 0;
        else
            *slash = 0;
        if (fsync_path(dir, true) < 0) {
            send_errno(c, id, errno, "syncing the directory of", to);
            return;
        }
    }
    send_ok(c, id, 0);
}

static void handle_fread(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    char path[DSEC__AGENT_PATH_MAX + 1];
    uint64_t offset = dsec__agent_get_u64(r);
    uint64_t max = dsec__agent_get_u64(r);
    if (!get_path(c, id, r, "read", path))
        return;
    if (!dsec__agent_done(r)) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "read \"%s\": malformed request", path);
        return;
    }
    /* O_NONBLOCK: a FIFO must not stall the agent (it is refused below). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        send_errno(c, id, errno, "opening for reading", path);
        return;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        send_errno(c, id, errno, "stat", path);
        close(fd);
        return;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        if (S_ISDIR(st.st_mode))
            send_errno(c, id, EISDIR, "read", path);
        else
            send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "read \"%s\": not a regular file", path);
        return;
    }
    uint64_t want = max == 0 || max > DSEC__AGENT_FILE_MAX ? DSEC__AGENT_FILE_MAX : max;
    uint64_t size = (uint64_t)st.st_size;
    /* Files of /proc say size 0 yet have content: read those until EOF. */
    size_t alloc = size > 0
                       ? (size_t)(offset < size ? (size - offset < want ? size - offset : want) : 0)
                       : (size_t)(want < 65536 ? want : 65536);
    size_t plen_fixed = 8 + 1 + 4;
    uint8_t *p0 = conn_reserve(c, DSEC__AGENT_HDR + plen_fixed + alloc);
    size_t got = 0;
    bool eof = false;
    for (;;) {
        if (got == alloc) {
            if (got >= want || size > 0) /* a regular file may have grown: the next call sees it */
                break;
            alloc = alloc * 2 > want ? (size_t)want : alloc * 2;
            p0 = conn_reserve_keep(c, DSEC__AGENT_HDR + plen_fixed + alloc,
                                   DSEC__AGENT_HDR + plen_fixed + got);
        }
        ssize_t n =
            pread(fd, p0 + DSEC__AGENT_HDR + plen_fixed + got, alloc - got, (off_t)(offset + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            close(fd);
            send_errno(c, id, e, "reading", path);
            return;
        }
        if (n == 0) {
            eof = true;
            break;
        }
        got += (size_t)n;
    }
    close(fd);
    if (size > 0 && offset + got >= size)
        eof = true;
    if (eof && offset + got > size)
        size = offset + got;
    uint8_t *p = p0;
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_DATA, id, plen_fixed + got);
    p = dsec__agent_put_u64(p, size);
    p = dsec__agent_put_u8(p, eof);
    p = dsec__agent_put_u32(p, (uint32_t)got);
    conn_commit(c, (size_t)(p - p0) + got);
}

struct entry {
    char *name;
    uint8_t kind;
    uint64_t size;
    uint32_t mode;
    int64_t mtime;
};

static void entry_fill(struct entry *e, const struct stat *st)
{
    e->kind = S_ISREG(st->st_mode) ? 1 : S_ISDIR(st->st_mode) ? 2 : S_ISLNK(st->st_mode) ? 3 : 4;
    e->size = S_ISREG(st->st_mode) || S_ISLNK(st->st_mode) ? (uint64_t)st->st_size : 0;
    e->mode = st->st_mode & 07777;
    e->mtime = (int64_t)st->st_mtime;
}

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s && s[1] ? s + 1 : path;
}

static void send_entries(struct conn *c, uint32_t id, struct entry *v, size_t n, const char *path)
{
    size_t plen = 4;
    for (size_t i = 0; i < n; i++)
        plen += 4 + strlen(v[i].name) + 1 + 8 + 4 + 8;
    if (n > DSEC__AGENT_LIST_MAX || plen + 5 > DSEC__AGENT_FRAME_MAX) {
        send_error(c, id, DSEC__AGENT_ERR_TOO_LARGE, 0,
                   "list \"%s\": %zu entries, more than one answer holds (%u)", path, n,
                   DSEC__AGENT_LIST_MAX);
        return;
    }
    uint8_t *p0 = conn_reserve(c, DSEC__AGENT_HDR + plen), *p = p0;
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_ENTRIES, id, plen);
    p = dsec__agent_put_u32(p, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        p = dsec__agent_put_bytes(p, v[i].name, strlen(v[i].name));
        p = dsec__agent_put_u8(p, v[i].kind);
        p = dsec__agent_put_u64(p, v[i].size);
        p = dsec__agent_put_u32(p, v[i].mode);
        p = dsec__agent_put_u64(p, (uint64_t)v[i].mtime);
    }
    conn_commit(c, (size_t)(p - p0));
}

static void handle_fstat(struct conn *c, uint32_t id, dsec__agent_rd *r, bool list)
{
    const char *op = list ? "list" : "stat";
    char path[DSEC__AGENT_PATH_MAX + 1];
    if (!get_path(c, id, r, op, path))
        return;
    if (!dsec__agent_done(r)) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "%s \"%s\": malformed request", op, path);
        return;
    }
    struct stat st;
    /* A listing follows a symlink to a directory, as ls does; stat describes the link. */
    if ((list ? stat(path, &st) : lstat(path, &st)) < 0) {
        send_errno(c, id, errno, op, path);
        return;
    }
    if (!list || !S_ISDIR(st.st_mode)) {
        if (list && lstat(path, &st) < 0) {
            send_errno(c, id, errno, op, path);
            return;
        }
        struct entry e = {.name = (char *)base_name(path)};
        entry_fill(&e, &st);
        send_entries(c, id, &e, 1, path);
        return;
    }
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
    if (d == NULL) {
        send_errno(c, id, errno, "opening directory", path);
        if (dfd >= 0)
            close(dfd);
        return;
    }
    struct entry *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        struct stat es;
        if (fstatat(dfd, de->d_name, &es, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* removed meanwhile */
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            v = xrealloc(v, cap * sizeof *v);
        }
        v[n].name = xstrndup(de->d_name, strlen(de->d_name));
        entry_fill(&v[n], &es);
        n++;
        if (n > DSEC__AGENT_LIST_MAX)
            break;
    }
    closedir(d);
    if (n > 1)
        qsort(v, n, sizeof *v, entry_cmp);
    send_entries(c, id, v, n, path);
    for (size_t i = 0; i < n; i++)
        free(v[i].name);
    free(v);
}

/* Remove name under dirfd and, for a directory, all it holds; symlinks are never followed. */
static int remove_tree(int dirfd, const char *name)
{
    if (unlinkat(dirfd, name, 0) == 0)
        return 0;
    if (errno != EISDIR && errno != EPERM)
        return -1;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        close(fd);
        return -1;
    }
    /* Entries removed while readdir runs may make it skip others: a few passes settle it. */
    int rc = 0;
    for (int pass = 0; pass < 4 && rc == 0; pass++) {
        struct dirent *de;
        bool any = false;
        rewinddir(d);
        while (rc == 0 && (de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            any = true;
            rc = remove_tree(fd, de->d_name);
        }
        if (!any)
            break;
    }
    int e = errno;
    closedir(d);
    if (rc < 0) {
        errno = e;
        return -1;
    }
    return unlinkat(dirfd, name, AT_REMOVEDIR);
}

static void handle_fremove(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    char path[DSEC__AGENT_PATH_MAX + 1];
    bool recursive = dsec__agent_get_u8(r) != 0;
    if (!get_path(c, id, r, "remove", path))
        return;
    if (!dsec__agent_done(r)) {
        send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "remove \"%s\": malformed request", path);
        return;
    }
    if (path[strspn(path, "/")] == 0) {
        send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "remove \"%s\": refusing to remove /", path);
        return;
    }
    struct stat st;
    if (lstat(path, &st) < 0) {
        send_errno(c, id, errno, "remove", path);
        return;
    }
    int rc;
    if (!S_ISDIR(st.st_mode))
        rc = unlink(path);
    else if (!recursive)
        rc = rmdir(path);
    else
        rc = remove_tree(AT_FDCWD, path);
    if (rc < 0) {
        int e = errno;
        if (e == ENOTEMPTY || e == EEXIST)
            send_error(c, id, DSEC__AGENT_ERR_IO, ENOTEMPTY,
                       "remove \"%s\": directory not empty (remove it recursively)", path);
        else
            send_errno(c, id, e, "remove", path);
        return;
    }
    upload_forget(path);
    send_ok(c, id, 0);
}

/* ---- the loop
 * ------------------------------------------------------------------------------------ */

static void handle_frame(struct conn *c, uint8_t type, uint32_t id, const uint8_t *payload,
                         size_t len)
{
    dsec__agent_rd r = {.p = payload, .end = payload + len};
    switch (type) {
    case DSEC__AGENT_T_EXEC:
        handle_exec(c, id, &r, false);
        break;
    case DSEC__AGENT_T_PSTART:
        handle_exec(c, id, &r, true);
        break;
    case DSEC__AGENT_T_PLIST:
        handle_plist(c, id, &r);
        break;
    case DSEC__AGENT_T_PSIGNAL:
        handle_psignal(c, id, &r);
        break;
    case DSEC__AGENT_T_PSTDIN:
        handle_pstdin(c, id, &r);
        break;
    case DSEC__AGENT_T_POUTPUT:
        handle_poutput(c, id, &r);
        break;
    case DSEC__AGENT_T_PRESIZE:
        handle_presize(c, id, &r);
        break;
    case DSEC__AGENT_T_KILL:
        handle_kill(c, id, &r);
        break;
    case DSEC__AGENT_T_SYNC:
        handle_sync(c, id, &r);
        break;
    case DSEC__AGENT_T_SETUP:
        handle_setup(c, id, &r);
        break;
    case DSEC__AGENT_T_FWRITE:
        handle_fwrite(c, id, &r);
        break;
    case DSEC__AGENT_T_FREAD:
        handle_fread(c, id, &r);
        break;
    case DSEC__AGENT_T_FLIST:
        handle_fstat(c, id, &r, true);
        break;
    case DSEC__AGENT_T_FSTAT:
        handle_fstat(c, id, &r, false);
        break;
    case DSEC__AGENT_T_FREMOVE:
        handle_fremove(c, id, &r);
        break;
    case DSEC__AGENT_T_FMKDIR:
        handle_fmkdir(c, id, &r);
        break;
    case DSEC__AGENT_T_FRENAME:
        handle_frename(c, id, &r);
        break;
    default:
        send_error(c, id, DSEC__AGENT_ERR_UNSUPPORTED, 0, "unknown request type %u", type);
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
        if (conn_backlog(c) > READ_STOP) {
            c->stalled = true;
            c->want_out = true;
            ep_ctl(EPOLL_CTL_MOD, c->fd, EPOLLOUT, c);
            break;
        }
        uint32_t len = dsec__agent_get_u32le(c->rbuf + off);
        if (len < 5 || len > DSEC__AGENT_FRAME_MAX) {
            if (c->port) { /* a port cannot be closed from here: wait for the next SYNC */
                send_error(c, 0, DSEC__AGENT_ERR_BAD_FRAME, 0,
                           "frame length %" PRIu32 " out of bounds (5..%u); skipping input "
                           "up to the next sync",
                           len, DSEC__AGENT_FRAME_MAX);
                c->resync = true;
                off++;
                continue;
            }
            send_error(c, 0, DSEC__AGENT_ERR_BAD_FRAME, 0,
                       "frame length %" PRIu32 " out of bounds (5..%u); closing the connection",
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
                c->rbuf = xrealloc(c->rbuf, c->rcap);
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
        c->big_idle_ns = now_ns(); /* kept a while: see bufs_sweep */
}

/* Give back the large buffers of connections idle for BUF_IDLE_NS; the loop's timeout
 * (at most timeout_ms) until the next one is due. */
static int bufs_sweep(int timeout_ms)
{
    uint64_t now = now_ns(), best = 0;
    for (struct conn *c = g.conns; c; c = c->next) {
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

static void on_conn(struct conn *c, uint32_t events)
{
    if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR))
        conn_flush(c); /* a gone peer shows here as EPIPE */
    if (c->dead || c->closing || c->stalled || !(events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        return;
    if (c->rcap - c->rlen < 65536) {
        c->rcap = c->rlen + 65536;
        c->rbuf = xrealloc(c->rbuf, c->rcap);
    }
    /* A port reads 0 once the host is not connected and nothing is buffered. */
    ssize_t n = c->port ? read(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen)
                        : recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        conn_close(c);
        return;
    }
    c->rlen += (size_t)n;
    conn_process(c);
}

/* Start serving fd (accepted, or a port whose host just connected) and greet the peer.
 * epoll_op adds fd to the loop (a new socket) or modifies its registration (a port). */
static struct conn *conn_new(int fd, struct port *port, int epoll_op)
{
    struct conn *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->kind = K_CONN;
    c->fd = fd;
    c->port = port;
    c->next = g.conns;
    if (g.conns)
        g.conns->prev = c;
    g.conns = c;
    ep_ctl(epoll_op, fd, EPOLLIN, c);
    send_hello(c, 0);
    return c;
}

static void on_listen(void)
{
    for (;;) {
        int fd = accept4(g.listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN)
                logmsg("accept: %s", strerror(errno));
            return;
        }
        if (conn_new(fd, NULL, EPOLL_CTL_ADD) == NULL)
            close(fd);
    }
}

/* ---- virtio-serial ports ------------------------------------------------------------------- */

/* (Re)open the port and watch it edge-triggered: an event on every change of the host's
 * connection (and on input), never a spin on the level POLLHUP of an unconnected port. */
static void port_open(struct port *p)
{
    p->fd = open(p->path, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (p->fd < 0) {
        logmsg("opening port %s: %s (retrying)", p->path, strerror(errno));
        return;
    }
    ep_ctl(EPOLL_CTL_ADD, p->fd, EPOLLIN | EPOLLOUT | EPOLLET, p);
}

/* The host connection served on p ended (its fd is closed). Reopening discards whatever the
 * host sent that was not read. */
static void port_lost(struct port *p)
{
    p->conn = NULL;
    p->fd = -1;
    if (!g.terminating)
        port_open(p);
}

/* An edge on a port no connection is served on: see where the host stands now. */
static void on_port(struct port *p)
{
    if (p->fd < 0 || p->conn)
        return;
    struct pollfd pfd = {.fd = p->fd, .events = POLLIN | POLLOUT};
    if (poll(&pfd, 1, 0) < 0 || pfd.revents == 0)
        return;
    if (pfd.revents & (POLLHUP | POLLERR | POLLNVAL)) /* no host connected */
        return;
    /* From now on the fd is level-triggered and its events go to the connection. */
    p->conn = conn_new(p->fd, p, EPOLL_CTL_MOD);
    if (p->conn == NULL) { /* out of memory: try again on the next edge */
        ep_ctl(EPOLL_CTL_MOD, p->fd, EPOLLIN | EPOLLOUT | EPOLLET, p);
    }
}

/* Ports that could not be reopened are retried once a second. */
static void ports_retry(void)
{
    for (size_t i = 0; i < g.nports; i++)
        if (g.ports[i].fd < 0 && g.ports[i].conn == NULL)
            port_open(&g.ports[i]);
}

/* The /dev path of the virtio-serial port named name (/sys/class/virtio-ports/vportNpM/name),
 * waiting up to PORT_WAIT_MS for the driver to create it. */
static int port_by_name(const char *name, char *path, size_t size)
{
    uint64_t until = now_ns() + (uint64_t)PORT_WAIT_MS * 1000000u;
    for (;;) {
        DIR *d = opendir("/sys/class/virtio-ports");
        struct dirent *de;
        while (d && (de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.')
                continue;
            char file[PATH_MAX], buf[256];
            snprintf(file, sizeof file, "/sys/class/virtio-ports/%s/name", de->d_name);
            int fd = open(file, O_RDONLY | O_CLOEXEC);
            if (fd < 0)
                continue;
            ssize_t n = read(fd, buf, sizeof buf - 1);
            close(fd);
            if (n <= 0)
                continue;
            buf[n] = 0;
            buf[strcspn(buf, "\n")] = 0;
            if (strcmp(buf, name) == 0) {
                snprintf(path, size, "/dev/%s", de->d_name);
                closedir(d);
                return 0;
            }
        }
        if (d)
            closedir(d);
        if (now_ns() >= until)
            return -1;
        struct timespec ts = {0, 50000000};
        nanosleep(&ts, NULL);
    }
}

static void on_signal(void)
{
    struct signalfd_siginfo si;
    while (read(g.sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT)
            g.terminating = true;
    }
    reap();
}

static void free_dead(void)
{
    while (g.dead_conns) {
        struct conn *c = g.dead_conns;
        g.dead_conns = c->next_dead;
        free(c->rbuf);
        free(c->wbuf);
        free(c);
    }
    while (g.dead_cmds) {
        struct cmd *m = g.dead_cmds;
        g.dead_cmds = m->next_dead;
        free(m->in);
        free(m);
    }
}

/* SIGTERM/SIGINT: every command's tree dies with the agent. */
static void shutdown_all(void)
{
    g.terminating = true; /* no shepherd is kept idle from here on */
    for (struct cmd *m = g.cmds; m; m = m->next)
        if (!m->exited) {
            shep_doom(m);
            kill(-m->pgid, SIGKILL); /* and its shepherd kills the rest */
            if (m->pid > 0)
                kill(m->pid, SIGCONT);
        }
    for (size_t i = 0; i < g.nidle; i++) {
        close(g.idle[i].fd); /* idle shepherds exit */
        g.idle[i].fd = -1;
    }
    /* Give the shepherds a moment to finish the trees so they are reaped here, not left to
     * others. */
    uint64_t until = now_ns() + 2000000000u;
    while ((g.cmds || g.nidle) && now_ns() < until) {
        for (struct cmd *m = g.cmds, *next; m; m = next) {
            next = m->next;
            on_report(m);
        }
        reap();
        free_dead();
        if (g.cmds || g.nidle) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
    while (g.conns)
        conn_close(g.conns); /* and their held POUTPUTs */
    free_dead();
    for (size_t i = 0; i < g.nprocs; i++)
        proc_free(g.procs[i]);
    free(g.procs);
    g.procs = NULL;
    g.nprocs = 0;
    if (g.listen_path)
        unlink(g.listen_path);
}

/* ---- start-up -----------------------------------------------------------------------------------
 */

/* Bind path, going through its directory when it is longer than sun_path. */
static int listen_on(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int dfd = -1;
    if (strlen(path) < sizeof sa.sun_path) {
        strcpy(sa.sun_path, path);
    } else {
        const char *slash = strrchr(path, '/');
        if (slash == NULL || slash == path) {
            errno = ENAMETOOLONG;
            return -1;
        }
        char *dir = xstrndup(path, (size_t)(slash - path));
        dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        free(dir);
        if (dfd < 0)
            return -1;
        if ((size_t)snprintf(sa.sun_path, sizeof sa.sun_path, "/proc/self/fd/%d/%s", dfd,
                             slash + 1) >= sizeof sa.sun_path) {
            close(dfd);
            errno = ENAMETOOLONG;
            return -1;
        }
    }
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(path); /* a stale socket of an earlier run */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc = fd < 0 ? -1 : bind(fd, (struct sockaddr *)&sa, sizeof sa);
    if (rc == 0)
        rc = listen(fd, SOCK_BACKLOG);
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

static int load_env_file(const char *file, char ***env, size_t *n, size_t *cap)
{
    FILE *f = fopen(file, "re");
    if (f == NULL)
        return -1;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    while ((len = getline(&line, &lcap, f)) > 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (len == 0 || line[0] == '#')
            continue;
        if (strchr(line, '=') == NULL || line[0] == '=') {
            logmsg("%s: ignoring line without NAME=value: %s", file, line);
            continue;
        }
        if (*n + 1 >= *cap) {
            *cap = *cap ? *cap * 2 : 32;
            *env = xrealloc(*env, *cap * sizeof **env);
        }
        env_set(env, n, xstrndup(line, (size_t)len));
    }
    free(line);
    fclose(f);
    return 0;
}

/* One turn of the event loop: wait up to timeout_ms (-1: no limit) for events and handle them.
 * Returns -1 when epoll_wait itself failed. (fuzz/fuzz_agent.c turns it too.) */
static int loop_once(int timeout_ms)
{
    struct epoll_event evs[64];
    timeout_ms = bufs_sweep(uploads_timeout(timeout_ms));
    int n = epoll_wait(g.ep, evs, 64, timeout_ms);
    if (n < 0 && errno != EINTR) {
        logmsg("epoll_wait: %s", strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int kind = *(int *)evs[i].data.ptr;
        if (kind == K_LISTEN)
            on_listen();
        else if (kind == K_SIGNAL)
            on_signal();
        else if (kind == K_CONN) {
            struct conn *c = evs[i].data.ptr;
            if (c->dead)
                continue;
            if (c->port && (evs[i].events & (EPOLLHUP | EPOLLERR))) {
                conn_close(c); /* the host disconnected: drop what it did not get */
            } else {
                on_conn(c, evs[i].events);
            }
        } else if (kind == K_PIPE) {
            on_pipe(evs[i].data.ptr, evs[i].events);
        } else if (kind == K_PORT) {
            on_port(evs[i].data.ptr);
        }
    }
    check_timeouts();
    waiters_run();
    uploads_sweep();
    ports_retry();
    free_dead();
    return 0;
}

static void usage(void)
{
    fputs("usage: dsec-agent (--listen-fd N | --listen PATH | (--port DEV | --port-name NAME)...)\n"
          "                  [--env-file FILE] [--env K=V]... [--workdir DIR] [--user USER]\n",
          stderr);
    exit(2);
}

/* The end of the agent. As the init of a microVM (it serves ports as PID 1) it powers the
 * machine off, so the host sees QEMU exit instead of a kernel panic. */
static int finish(int rc)
{
    if (g.nports > 0 && getpid() == 1) {
        logmsg("exiting (%d): powering off", rc);
        sync();
        reboot(RB_POWER_OFF);
    }
    return rc;
}

int main(int argc, char **argv)
{
    /* a directory watcher, started as a background process (agent-watch.c) */
    if (argc >= 2 && strcmp(argv[1], "--watch") == 0)
        return dsec__agent_watch_main(argc, argv);
    int listen_fd = -1;
    const char *listen_path = NULL;
    char **env = NULL;
    size_t nenv = 0, cap = 0;
    bool env_given = false;
    const char *port_args[PORTS_MAX];
    bool port_is_name[PORTS_MAX];
    size_t nport_args = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            usage();
        i++;
        if (strcmp(a, "--listen-fd") == 0) {
            char *end;
            long fd = strtol(v, &end, 10);
            if (*end || fd < 0 || fd > INT_MAX)
                usage();
            listen_fd = (int)fd;
        } else if (strcmp(a, "--listen") == 0) {
            listen_path = v;
        } else if (strcmp(a, "--port") == 0 || strcmp(a, "--port-name") == 0) {
            if (nport_args == PORTS_MAX || v[0] == 0) {
                logmsg("%s %s: at most %d non-empty ports", a, v, PORTS_MAX);
                usage();
            }
            port_is_name[nport_args] = strcmp(a, "--port-name") == 0;
            port_args[nport_args++] = v;
        } else if (strcmp(a, "--env-file") == 0) {
            env_given = true;
            if (load_env_file(v, &env, &nenv, &cap) < 0) {
                logmsg("--env-file %s: %s", v, strerror(errno));
                return 1;
            }
        } else if (strcmp(a, "--env") == 0) {
            env_given = true;
            if (strchr(v, '=') == NULL || v[0] == '=')
                usage();
            if (nenv + 1 >= cap) {
                cap = cap ? cap * 2 : 32;
                env = xrealloc(env, cap * sizeof *env);
            }
            env_set(&env, &nenv, (char *)v);
        } else if (strcmp(a, "--workdir") == 0) {
            g.workdir = v;
        } else if (strcmp(a, "--user") == 0) {
            g.default_user = v;
        } else if (strcmp(a, "--proc-max") == 0) { /* hidden: tests lower the limit */
            char *end;
            unsigned long n = strtoul(v, &end, 10);
            if (*end || n == 0 || n > DSEC__AGENT_PROC_MAX)
                usage();
            g.proc_max = n;
        } else if (strcmp(a, "--upload-stale-s") == 0) { /* hidden: tests sweep sooner */
            char *end;
            unsigned long n = strtoul(v, &end, 10);
            if (*end || n == 0 || n > 86400)
                usage();
            up.stale_ns = (uint64_t)n * 1000000000u;
        } else {
            usage();
        }
    }
    if ((listen_fd >= 0 && listen_path) || (listen_fd < 0 && !listen_path && nport_args == 0))
        usage();
    g.nports = nport_args; /* from here on, a failure as a VM's init powers off (finish) */
    if (!env_given) { /* the environment the runtime gave us */
        extern char **environ;
        for (char **e = environ; e && *e; e++) {
            if (nenv + 1 >= cap) {
                cap = cap ? cap * 2 : 32;
                env = xrealloc(env, cap * sizeof *env);
            }
            env[nenv++] = *e;
        }
    }
    g.base_env = env;
    g.nbase_env = nenv;
    if (g.default_user) {
        struct ident id;
        const char *why = resolve_user(g.default_user, &id);
        if (why) {
            logmsg("--user %s: %s", g.default_user, why);
            return finish(1);
        }
    }

    if (getrlimit(RLIMIT_NOFILE, &g.nofile) == 0 && g.nofile.rlim_cur < g.nofile.rlim_max) {
        struct rlimit raised = {g.nofile.rlim_max, g.nofile.rlim_max};
        g.nofile_raised = setrlimit(RLIMIT_NOFILE, &raised) == 0;
    }
    /* Descriptors 0-2 must exist so the pipes of commands never land on them. */
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0)
            return finish(1);
    /* Nothing inherited (the node's preserved fds included) reaches a command. */
    syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);
    if (getpid() != 1) /* outside a pid namespace, orphans of commands come to us all the same */
        prctl(PR_SET_CHILD_SUBREAPER, 1);
    /* Not dumpable: a command (root in the sandbox, without CAP_SYS_PTRACE)
     * cannot open /proc/<agent>/fd or /proc/<agent>/mem to reach the channel.
     * execve resets the flag, so commands themselves stay dumpable. */
    prctl(PR_SET_DUMPABLE, 0);

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigset_t block = mask;
    sigaddset(&block, SIGPIPE); /* writes to a gone peer return EPIPE instead */
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, NULL);

    if (listen_path) {
        listen_fd = listen_on(listen_path);
        if (listen_fd < 0) {
            logmsg("listening on %s: %s", listen_path, strerror(errno));
            return finish(1);
        }
        g.listen_path = (char *)listen_path;
    } else if (listen_fd >= 0) {
        int acc = 0;
        socklen_t sl = sizeof acc;
        if (getsockopt(listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &sl) < 0 || !acc) {
            logmsg("--listen-fd %d is not a listening socket", listen_fd);
            return finish(1);
        }
        fcntl(listen_fd, F_SETFD, FD_CLOEXEC);
        set_nonblock(listen_fd);
    }
    g.listen_fd = listen_fd;
    g.null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* may be missing: pipes then */
    g.sig_fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    g.ep = epoll_create1(EPOLL_CLOEXEC);
    if (g.sig_fd < 0 || g.ep < 0) {
        logmsg("signalfd/epoll: %s", strerror(errno));
        return finish(1);
    }
    if (g.listen_fd >= 0)
        ep_ctl(EPOLL_CTL_ADD, g.listen_fd, EPOLLIN, &g.listen_kind);
    ep_ctl(EPOLL_CTL_ADD, g.sig_fd, EPOLLIN, &g.sig_kind);
    for (size_t i = 0; i < g.nports; i++) {
        struct port *p = &g.ports[i];
        p->kind = K_PORT;
        if (!port_is_name[i]) {
            if ((size_t)snprintf(p->path, sizeof p->path, "%s", port_args[i]) >= sizeof p->path) {
                logmsg("--port %s: path too long", port_args[i]);
                return finish(1);
            }
        } else if (port_by_name(port_args[i], p->path, sizeof p->path) < 0) {
            logmsg("--port-name %s: no virtio-serial port of that name in "
                   "/sys/class/virtio-ports after %d ms",
                   port_args[i], PORT_WAIT_MS);
            return finish(1);
        }
        port_open(p);
        if (p->fd < 0) /* a port that is not there at all is a configuration error */
            return finish(1);
    }

    while (!g.terminating)
        if (loop_once(next_timeout_ms()) < 0)
            break;
    shutdown_all();
    return finish(0);
}
