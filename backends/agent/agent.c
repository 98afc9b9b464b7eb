/* agent.c - dsec-agent: the static init of a container or microVM sandbox that runs commands and
 * file operations for the node manager over a unix socket or virtio-serial port (agent-proto.h) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "backends/agent/agent-int.h"
#include "backends/agent/agent-watch.h"

#ifdef DSEC_AGENT_FUZZ
/* fuzz/fuzz_agent.c compiles this file in (and builds the agent's other files with
 * DSEC_AGENT_FUZZ: see agent-spawn.c). main is renamed out of the way; the harness checks what
 * each child is about to get. */
#define main dsec__agent_main
int dsec__agent_main(int argc, char **argv);
static void fuzz_check_spawn(const struct spawn *s);
void (*dsec__agent_fuzz_check_spawn)(const struct spawn *s) = fuzz_check_spawn;
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

struct dsec__agent_state dsec__agent_g = {.ep = -1,
                                          .listen_fd = -1,
                                          .sig_fd = -1,
                                          .null_fd = -1,
                                          .proc_max = DSEC__AGENT_PROC_MAX,
                                          .next_handle = 1,
                                          .listen_kind = K_LISTEN,
                                          .sig_kind = K_SIGNAL};

/* ---- basics ---------------------------------------------------------------------------------- */

void dsec__agent_logmsg(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("dsec-agent: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void *dsec__agent_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL) {
        dsec__agent_logmsg("out of memory (%zu bytes)", n);
        abort();
    }
    return q;
}

char *dsec__agent_xstrndup(const char *s, size_t n)
{
    char *d = dsec__agent_xrealloc(NULL, n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

uint64_t dsec__agent_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void dsec__agent_ep_ctl(int op, int fd, uint32_t events, void *ptr)
{
    struct epoll_event ev = {.events = events, .data.ptr = ptr};
    if (epoll_ctl(dsec__agent_g.ep, op, fd, &ev) < 0 && op != EPOLL_CTL_DEL)
        dsec__agent_logmsg("epoll_ctl(%d, fd %d): %s", op, fd, strerror(errno));
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* ---- the loop ------------------------------------------------------------------------------ */

/* How long the loop may wait for events (ms): until the next deadline of a command, a session,
 * a held POUTPUT or a port to reopen; -1: none. */
static int next_timeout_ms(void)
{
    uint64_t now = dsec__agent_now_ns(), best = 0;
    for (struct cmd *m = dsec__agent_g.cmds; m; m = m->next)
        if (m->deadline_ns && (best == 0 || m->deadline_ns < best))
            best = m->deadline_ns;
    for (struct cmd *m = dsec__agent_g.cmds; m; m = m->next) {
        uint64_t t = m->proc && m->proc->sess ? dsec__agent_sess_due(m->proc->sess) : 0;
        if (t && (best == 0 || t < best))
            best = t;
    }
    for (const struct waiter *w = dsec__agent_g.waiters; w; w = w->next)
        if (best == 0 || w->deadline_ns < best)
            best = w->deadline_ns;
    for (size_t i = 0; i < dsec__agent_g.nports; i++)
        if (dsec__agent_g.ports[i].fd < 0 && dsec__agent_g.ports[i].conn == NULL &&
            (best == 0 || now + 1000000000u < best))
            best = now + 1000000000u; /* a port to reopen */
    if (best == 0)
        return -1;
    if (best <= now)
        return 0;
    uint64_t ms = (best - now + 999999u) / 1000000u;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* ---- the defaults: SETUP ------------------------------------------------------------------- */

/* The process defaults of the sandbox this agent now serves, given once by the node to an
 * agent of the warm pool after its root became the sandbox's: the base environment (when any
 * variable is given: exactly those, as --env), the working directory and the user, which must
 * exist in the new root's /etc/passwd (as --user). */
void dsec__agent_handle_setup(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    if (dsec__agent_g.set_up) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                               "setup: the defaults are already set");
        return;
    }
    uint32_t n = dsec__agent_get_u32(r);
    if (n > DSEC__AGENT_ENV_MAX) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_TOO_LARGE, 0,
                               "setup: %" PRIu32 " variables (most %u)", n, DSEC__AGENT_ENV_MAX);
        return;
    }
    const uint8_t *start = r->p;
    for (uint32_t i = 0; i < n; i++) {
        size_t l;
        const char *kv = dsec__agent_get_str(r, DSEC__AGENT_ARG_LEN_MAX, &l);
        if (kv != NULL && (l == 0 || kv[0] == '=' || memchr(kv, '=', l) == NULL)) {
            dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                                   "setup: variable %" PRIu32 " is not K=V", i);
            return;
        }
    }
    size_t wl, ul;
    const char *wd = dsec__agent_get_str(r, DSEC__AGENT_PATH_MAX, &wl);
    const char *us = dsec__agent_get_str(r, DSEC__AGENT_USER_MAX, &ul);
    if (wd == NULL || us == NULL || !dsec__agent_done(r) || wl == 0 || ul == 0) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "setup: malformed request");
        return;
    }
    char user[DSEC__AGENT_USER_MAX + 1];
    memcpy(user, us, ul);
    user[ul] = 0;
    struct ident ident;
    const char *why = dsec__agent_resolve_user(user, &ident);
    if (why) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "--user %s: %s", user, why);
        return;
    }
    if (n > 0) {
        char **env = dsec__agent_xrealloc(NULL, (n + 1) * sizeof *env);
        size_t ne = 0;
        dsec__agent_rd r2 = {.p = start, .end = r->end};
        for (uint32_t i = 0; i < n; i++) {
            size_t l;
            const char *kv = dsec__agent_get_str(&r2, DSEC__AGENT_ARG_LEN_MAX, &l);
            char *copy = dsec__agent_xrealloc(NULL, l + 1);
            memcpy(copy, kv, l);
            copy[l] = 0;
            dsec__agent_env_set(&env, &ne, copy);
        }
        env[ne] = NULL;
        dsec__agent_g.base_env = env; /* the old one stays: main's, or the runtime's environ */
        dsec__agent_g.nbase_env = ne;
    }
    char *w = dsec__agent_xrealloc(NULL, wl + 1), *u = dsec__agent_xrealloc(NULL, ul + 1);
    memcpy(w, wd, wl);
    w[wl] = 0;
    memcpy(u, user, ul + 1);
    dsec__agent_g.workdir = w;
    dsec__agent_g.default_user = u;
    dsec__agent_g.set_up = true;
    if (chdir("/") < 0) /* the new root, whatever the old cwd was */
        dsec__agent_logmsg("setup: chdir /: %s", strerror(errno));
    /* Idle shepherds were forked before: their cwd may be the old one. They go (and exit). */
    for (size_t i = 0; i < dsec__agent_g.nidle; i++)
        close(dsec__agent_g.idle[i].fd);
    dsec__agent_g.nidle = 0;
    dsec__agent_send_ok(c, id, 0);
}

/* ---- the loop's own events, and its end ---------------------------------------------------- */

static void on_signal(void)
{
    struct signalfd_siginfo si;
    while (read(dsec__agent_g.sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT)
            dsec__agent_g.terminating = true;
    }
    dsec__agent_reap();
}

static void free_dead(void)
{
    while (dsec__agent_g.dead_conns) {
        struct conn *c = dsec__agent_g.dead_conns;
        dsec__agent_g.dead_conns = c->next_dead;
        free(c->rbuf);
        free(c->wbuf);
        free(c);
    }
    while (dsec__agent_g.dead_cmds) {
        struct cmd *m = dsec__agent_g.dead_cmds;
        dsec__agent_g.dead_cmds = m->next_dead;
        free(m->in);
        free(m);
    }
}

/* SIGTERM/SIGINT: every command's tree dies with the agent. */
static void shutdown_all(void)
{
    dsec__agent_g.terminating = true; /* no shepherd is kept idle from here on */
    for (struct cmd *m = dsec__agent_g.cmds; m; m = m->next)
        if (!m->exited) {
            dsec__agent_cmd_end(m);
        }
    for (size_t i = 0; i < dsec__agent_g.nidle; i++) {
        close(dsec__agent_g.idle[i].fd); /* idle shepherds exit */
        dsec__agent_g.idle[i].fd = -1;
    }
    /* Give the shepherds a moment to finish the trees so they are reaped here, not left to
     * others. */
    uint64_t until = dsec__agent_now_ns() + 2000000000u;
    while ((dsec__agent_g.cmds || dsec__agent_g.nidle) && dsec__agent_now_ns() < until) {
        for (struct cmd *m = dsec__agent_g.cmds, *next; m; m = next) {
            next = m->next;
            dsec__agent_on_report(m);
        }
        dsec__agent_reap();
        free_dead();
        if (dsec__agent_g.cmds || dsec__agent_g.nidle) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
    while (dsec__agent_g.conns)
        dsec__agent_conn_close(dsec__agent_g.conns); /* and their held POUTPUTs */
    free_dead();
    for (size_t i = 0; i < dsec__agent_g.nprocs; i++)
        dsec__agent_proc_free(dsec__agent_g.procs[i]);
    free(dsec__agent_g.procs);
    dsec__agent_g.procs = NULL;
    dsec__agent_g.nprocs = 0;
    if (dsec__agent_g.listen_path)
        unlink(dsec__agent_g.listen_path);
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
        char *dir = dsec__agent_xstrndup(path, (size_t)(slash - path));
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

/* Room in env (n entries, cap slots) for one more entry and the NULL after it. */
static void env_grow(char ***env, size_t n, size_t *cap)
{
    if (n + 1 >= *cap) {
        *cap = *cap ? *cap * 2 : 32;
        *env = dsec__agent_xrealloc(*env, *cap * sizeof **env);
    }
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
            dsec__agent_logmsg("%s: ignoring line without NAME=value: %s", file, line);
            continue;
        }
        env_grow(env, *n, cap);
        dsec__agent_env_set(env, n, dsec__agent_xstrndup(line, (size_t)len));
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
    timeout_ms = dsec__agent_bufs_sweep(dsec__agent_uploads_timeout(timeout_ms));
    int n = epoll_wait(dsec__agent_g.ep, evs, 64, timeout_ms);
    if (n < 0 && errno != EINTR) {
        dsec__agent_logmsg("epoll_wait: %s", strerror(errno));
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int kind = *(int *)evs[i].data.ptr;
        if (kind == K_LISTEN)
            dsec__agent_on_listen();
        else if (kind == K_SIGNAL)
            on_signal();
        else if (kind == K_CONN) {
            struct conn *c = evs[i].data.ptr;
            if (c->dead)
                continue;
            if (c->port && (evs[i].events & (EPOLLHUP | EPOLLERR))) {
                dsec__agent_conn_close(c); /* the host disconnected: drop what it did not get */
            } else {
                dsec__agent_on_conn(c, evs[i].events);
            }
        } else if (kind == K_PIPE) {
            dsec__agent_on_pipe(evs[i].data.ptr, evs[i].events);
        } else if (kind == K_PORT) {
            dsec__agent_on_port(evs[i].data.ptr);
        }
    }
    dsec__agent_check_timeouts();
    dsec__agent_waiters_run();
    dsec__agent_uploads_sweep();
    dsec__agent_ports_retry();
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
    if (dsec__agent_g.nports > 0 && getpid() == 1) {
        dsec__agent_logmsg("exiting (%d): powering off", rc);
        sync();
        reboot(RB_POWER_OFF);
    }
    return rc;
}

/* What the command line asks for. */
struct args {
    int listen_fd;
    const char *listen_path;
    char **env; /* the base environment: --env-file and --env, or the runtime's */
    size_t nenv, cap;
    bool env_given;
    const char *ports[PORTS_MAX]; /* --port DEV or --port-name NAME */
    bool port_is_name[PORTS_MAX];
    size_t nports;
};

/* A number option's value, or usage. */
static unsigned long number_arg(const char *v, unsigned long max)
{
    char *end;
    unsigned long n = strtoul(v, &end, 10);
    if (*end || n == 0 || n > max)
        usage();
    return n;
}

/* One option and its value into a (usage when either is wrong); -1 when an env file cannot be
 * read (said). */
static int parse_option(struct args *a, const char *opt, const char *v)
{
    if (strcmp(opt, "--listen-fd") == 0) {
        char *end;
        long fd = strtol(v, &end, 10);
        if (*end || fd < 0 || fd > INT_MAX)
            usage();
        a->listen_fd = (int)fd;
    } else if (strcmp(opt, "--listen") == 0) {
        a->listen_path = v;
    } else if (strcmp(opt, "--port") == 0 || strcmp(opt, "--port-name") == 0) {
        if (a->nports == PORTS_MAX || v[0] == 0) {
            dsec__agent_logmsg("%s %s: at most %d non-empty ports", opt, v, PORTS_MAX);
            usage();
        }
        a->port_is_name[a->nports] = strcmp(opt, "--port-name") == 0;
        a->ports[a->nports++] = v;
    } else if (strcmp(opt, "--env-file") == 0) {
        a->env_given = true;
        if (load_env_file(v, &a->env, &a->nenv, &a->cap) < 0) {
            dsec__agent_logmsg("--env-file %s: %s", v, strerror(errno));
            return -1;
        }
    } else if (strcmp(opt, "--env") == 0) {
        a->env_given = true;
        if (strchr(v, '=') == NULL || v[0] == '=')
            usage();
        env_grow(&a->env, a->nenv, &a->cap);
        dsec__agent_env_set(&a->env, &a->nenv, (char *)v);
    } else if (strcmp(opt, "--workdir") == 0) {
        dsec__agent_g.workdir = v;
    } else if (strcmp(opt, "--user") == 0) {
        dsec__agent_g.default_user = v;
    } else if (strcmp(opt, "--proc-max") == 0) { /* hidden: tests lower the limit */
        dsec__agent_g.proc_max = number_arg(v, DSEC__AGENT_PROC_MAX);
    } else if (strcmp(opt, "--upload-stale-s") == 0) { /* hidden: tests sweep sooner */
        dsec__agent_uploads_set_stale((uint64_t)number_arg(v, 86400) * 1000000000u);
    } else {
        usage();
    }
    return 0;
}

/* Every option into a (usage when one is wrong); -1 when an env file cannot be read. */
static int parse_args(int argc, char **argv, struct args *a)
{
    for (int i = 1; i < argc; i++) {
        const char *opt = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            usage();
        i++;
        if (parse_option(a, opt, v) < 0)
            return -1;
    }
    if ((a->listen_fd >= 0 && a->listen_path) ||
        (a->listen_fd < 0 && !a->listen_path && a->nports == 0))
        usage();
    return 0;
}

/* The process as the agent runs it: descriptors, limits, dumpability, blocked signals (mask:
 * those the loop reads from its signalfd). -1 when it cannot be. */
static int set_up_process(sigset_t *mask)
{
    struct rlimit *nofile = &dsec__agent_g.nofile;
    if (getrlimit(RLIMIT_NOFILE, nofile) == 0 && nofile->rlim_cur < nofile->rlim_max) {
        struct rlimit raised = {nofile->rlim_max, nofile->rlim_max};
        dsec__agent_g.nofile_raised = setrlimit(RLIMIT_NOFILE, &raised) == 0;
    }
    /* Descriptors 0-2 must exist so the pipes of commands never land on them. */
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0)
            return -1;
    /* Nothing inherited (the node's preserved fds included) reaches a command. */
    syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);
    if (getpid() != 1) /* outside a pid namespace, orphans of commands come to us all the same */
        prctl(PR_SET_CHILD_SUBREAPER, 1);
    /* Not dumpable: a command (root in the sandbox, without CAP_SYS_PTRACE)
     * cannot open /proc/<agent>/fd or /proc/<agent>/mem to reach the channel.
     * execve resets the flag, so commands themselves stay dumpable. */
    prctl(PR_SET_DUMPABLE, 0);

    sigemptyset(mask);
    sigaddset(mask, SIGCHLD);
    sigaddset(mask, SIGTERM);
    sigaddset(mask, SIGINT);
    sigset_t block = *mask;
    sigaddset(&block, SIGPIPE); /* writes to a gone peer return EPIPE instead */
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, NULL);
    return 0;
}

/* The listening socket: bound at --listen PATH, or the one given (--listen-fd). -1 (said) when
 * it cannot be. */
static int open_listener(const struct args *a)
{
    int listen_fd = a->listen_fd;
    if (a->listen_path) {
        listen_fd = listen_on(a->listen_path);
        if (listen_fd < 0) {
            dsec__agent_logmsg("listening on %s: %s", a->listen_path, strerror(errno));
            return -1;
        }
        dsec__agent_g.listen_path = (char *)a->listen_path;
    } else if (listen_fd >= 0) {
        int acc = 0;
        socklen_t sl = sizeof acc;
        if (getsockopt(listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &sl) < 0 || !acc) {
            dsec__agent_logmsg("--listen-fd %d is not a listening socket", listen_fd);
            return -1;
        }
        fcntl(listen_fd, F_SETFD, FD_CLOEXEC);
        set_nonblock(listen_fd);
    }
    dsec__agent_g.listen_fd = listen_fd;
    return 0;
}

/* The loop's own descriptors: /dev/null, the signalfd for mask, epoll, and the listener in it.
 * -1 (said) when they cannot be. */
static int open_loop(const sigset_t *mask)
{
    struct dsec__agent_state *g = &dsec__agent_g;
    g->null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC); /* may be missing: pipes then */
    g->sig_fd = signalfd(-1, mask, SFD_NONBLOCK | SFD_CLOEXEC);
    g->ep = epoll_create1(EPOLL_CLOEXEC);
    if (g->sig_fd < 0 || g->ep < 0) {
        dsec__agent_logmsg("signalfd/epoll: %s", strerror(errno));
        return -1;
    }
    if (g->listen_fd >= 0)
        dsec__agent_ep_ctl(EPOLL_CTL_ADD, g->listen_fd, EPOLLIN, &g->listen_kind);
    dsec__agent_ep_ctl(EPOLL_CTL_ADD, g->sig_fd, EPOLLIN, &g->sig_kind);
    return 0;
}

int main(int argc, char **argv)
{
    /* a directory watcher, started as a background process (agent-watch.c) */
    if (argc >= 2 && strcmp(argv[1], "--watch") == 0)
        return dsec__agent_watch_main(argc, argv);
    struct args a = {.listen_fd = -1};
    if (parse_args(argc, argv, &a) < 0)
        return 1;
    dsec__agent_g.nports =
        a.nports;       /* from here on, a failure as a VM's init powers off (finish) */
    if (!a.env_given) { /* the environment the runtime gave us */
        extern char **environ;
        for (char **e = environ; e && *e; e++) {
            env_grow(&a.env, a.nenv, &a.cap);
            a.env[a.nenv++] = *e;
        }
    }
    dsec__agent_g.base_env = a.env;
    dsec__agent_g.nbase_env = a.nenv;
    if (dsec__agent_g.default_user) {
        struct ident id;
        const char *why = dsec__agent_resolve_user(dsec__agent_g.default_user, &id);
        if (why) {
            dsec__agent_logmsg("--user %s: %s", dsec__agent_g.default_user, why);
            return finish(1);
        }
    }
    sigset_t mask;
    if (set_up_process(&mask) < 0 || open_listener(&a) < 0 || open_loop(&mask) < 0 ||
        dsec__agent_ports_start(a.ports, a.port_is_name) < 0)
        return finish(1);

    while (!dsec__agent_g.terminating)
        if (loop_once(next_timeout_ms()) < 0)
            break;
    shutdown_all();
    return finish(0);
}
