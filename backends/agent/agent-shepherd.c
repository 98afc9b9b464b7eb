/* agent-shepherd.c - exec cleanup: a shepherd under each command ends all it leaves behind */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/agent/agent-int.h"

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
bool dsec__agent_proc_is_ours(void)
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
void dsec__agent_kill_below(pid_t root, pid_t main_pgid, int sig, bool groups)
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
            v = dsec__agent_xrealloc(v, cap * sizeof *v);
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
        if (until_ns && dsec__agent_now_ns() >= until_ns)
            return false;
        if (use_proc < 0)
            use_proc = dsec__agent_proc_is_ours();
        if (use_proc)
            dsec__agent_kill_below(getpid(), main_pgid, SIGKILL, true);
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
 * command: it dooms the running one (dsec__agent_shep_doom); an idle shepherd skips it (it came
 * late). */
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
#ifdef DSEC_AGENT_FUZZ /* the harness expects each child gone (execve fails) before KILL */
        struct spawn s = {.pid_fd = -1};
#else
        struct spawn s = {.pid_fd = sock};
#endif
        char *buf = NULL;
        if (!shep_recv(sock, &s, &buf))
            _exit(0);
        pid_t pid = dsec__agent_spawn(&s); /* the child told the agent its pid (pid_fd) */
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
            if (p < 0) {  /* cannot be: the main process is our child */
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
        rp.exit_ns = dsec__agent_now_ns();
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
void dsec__agent_shep_doom(struct cmd *m)
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
        dsec__agent_logmsg("exec %" PRIu32 ": cannot tell its shepherd to end its tree: %s", m->id,
                           n < 0 ? strerror(errno) : "short write");
}

/* Start s under a shepherd: an idle one, or a new fork of the agent. Returns the shepherd's
 * pid and sets *main_pid and *sock (the shepherd's socket, the caller's now); -1 with errno
 * set on failure. */
pid_t dsec__agent_spawn_shepherd(const struct spawn *s, pid_t *main_pid, int *sock)
{
#ifdef DSEC_AGENT_FUZZ
    dsec__agent_fuzz_check_spawn(s);
#endif
    for (;;) {
        pid_t sh;
        int fd;
        bool fresh = dsec__agent_g.nidle == 0;
        if (!fresh) {
            dsec__agent_g.nidle--;
            sh = dsec__agent_g.idle[dsec__agent_g.nidle].pid;
            fd = dsec__agent_g.idle[dsec__agent_g.nidle].fd;
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
            if (SHEP_IDLE_MAX > 0 && dsec__agent_g.nidle + 1 <= SHEP_IDLE_MAX) {
                dsec__agent_g.idle[dsec__agent_g.nidle].pid = sh;
                dsec__agent_g.idle[dsec__agent_g.nidle++].fd = fd;
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
