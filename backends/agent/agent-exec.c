/* agent-exec.c - EXEC and PSTART: a request decoded, its command prepared and started */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "backends/agent/agent-int.h"

#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* "K=V" entries: replace an entry with the same key or add one. */
void dsec__agent_env_set(char ***env, size_t *n, char *kv)
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

/* An EXEC or PSTART request, decoded: its strings point into the frame. */
struct exec_req {
    const char *op; /* "exec" or "start", for messages */
    bool bg;        /* PSTART: a background process, which answers PROC at once */
    uint64_t timeout_ms, out_max, ring_max, session;
    bool keep_stdin, pty, sess;
    uint32_t rows, cols;
    const char *cwd, *user, *arg0;
    size_t cwd_len, user_len, arg0_len, argc, nenv, in_len;
    const uint8_t *in;
    const uint8_t *args, *env, *end; /* where the arguments and the variables are in the frame */
    size_t total;                    /* their bytes, each NUL-terminated */
};

/* What a command is started with, and what it holds until it is. */
struct exec_job {
    char **argv, **envp;
    char *block; /* every string, copied once, NUL-terminated, for execve */
    const char *cwd, *path_env;
    struct ident ident;
    struct cmd *m;
    int pfd[3][2]; /* the command's stdin, stdout and stderr, both ends */
    bool null_in;
};

/* The fields up to the argument count; false with the error sent. */
static bool exec_decode_head(struct conn *c, uint32_t id, dsec__agent_rd *r, struct exec_req *q)
{
    q->timeout_ms = dsec__agent_get_u64(r);
    q->out_max = q->bg ? 0 : dsec__agent_get_u64(r);
    q->cwd = dsec__agent_get_str(r, DSEC__AGENT_PATH_MAX, &q->cwd_len);
    q->user = dsec__agent_get_str(r, DSEC__AGENT_USER_MAX, &q->user_len);
    q->argc = dsec__agent_get_u32(r);
    /* argc 0 is a session's default shell (the flags come at the end: checked there) */
    if (r->bad || (q->argc == 0 && !q->bg) || q->argc > DSEC__AGENT_ARGV_MAX) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
                               "%s: bad cwd, user or argument count (1..%u arguments)", q->op,
                               DSEC__AGENT_ARGV_MAX);
        return false;
    }
    return true;
}

/* The rest: arguments, environment, stdin and the trailing fields; false with the error sent. */
static bool exec_decode_rest(struct conn *c, uint32_t id, dsec__agent_rd *r, struct exec_req *q)
{
    q->args = r->p;
    for (size_t i = 0; i < q->argc; i++) {
        size_t l;
        const char *a = dsec__agent_get_str(r, DSEC__AGENT_ARG_LEN_MAX, &l);
        if (a == NULL)
            break;
        if (i == 0) {
            q->arg0 = a;
            q->arg0_len = l;
        }
        q->total += l + 1;
    }
    q->nenv = dsec__agent_get_u32(r);
    if (r->bad || q->nenv > DSEC__AGENT_ENV_MAX) {
        dsec__agent_send_error(
            c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
            "%s: bad argument or environment count (at most %u variables, %u bytes each)", q->op,
            DSEC__AGENT_ENV_MAX, DSEC__AGENT_ARG_LEN_MAX);
        return false;
    }
    q->env = r->p;
    for (size_t i = 0; i < q->nenv; i++) {
        size_t kl, vl;
        const char *k = dsec__agent_get_str(r, DSEC__AGENT_ARG_LEN_MAX, &kl);
        dsec__agent_get_str(r, DSEC__AGENT_ARG_LEN_MAX, &vl);
        if (r->bad)
            break;
        if (kl == 0 || memchr(k, '=', kl)) {
            dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                                   "%s: environment variable %zu has an empty name or one with '='",
                                   q->op, i);
            return false;
        }
        q->total += kl + vl + 2;
    }
    q->in = dsec__agent_get_bytes(r, DSEC__AGENT_STDIN_MAX, &q->in_len);
    if (q->bg) {
        q->ring_max = dsec__agent_get_u64(r);
        q->keep_stdin = dsec__agent_get_u8(r) != 0;
        if (r->p < r->end) { /* terminals and sessions: absent in older requests */
            uint8_t fl = dsec__agent_get_u8(r);
            q->rows = dsec__agent_get_u32(r);
            q->cols = dsec__agent_get_u32(r);
            q->pty = fl & DSEC__AGENT_S_PTY;
            q->sess = fl & DSEC__AGENT_S_SESSION;
        }
    } else if (r->p < r->end) {
        q->session = dsec__agent_get_u64(r);
    }
    q->end = r->end;
    if (!dsec__agent_done(r)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "%s: malformed request", q->op);
        return false;
    }
    return true;
}

/* An EXEC in a session: one command line, nothing else; it goes to the session's shell. */
static void exec_in_session(struct conn *c, uint32_t id, const struct exec_req *q)
{
    const char *field = q->argc != 1  ? NULL
                        : q->nenv     ? "environment variables"
                        : q->cwd_len  ? "cwd"
                        : q->user_len ? "user"
                        : q->in_len   ? "stdin"
                                      : "";
    if (field == NULL)
        dsec__agent_send_error(
            c, id, DSEC__AGENT_ERR_INVALID, 0,
            "exec: a session command is one shell command line, not %zu arguments", q->argc);
    else if (field[0])
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                               "exec: a session command takes no %s: it runs in the session's "
                               "shell (use cd and export there)",
                               field);
    else
        dsec__agent_handle_sexec(c, id, q->session, q->arg0, q->arg0_len, q->timeout_ms,
                                 q->out_max);
}

/* Whether the request's terminal, session and background fields go together (a session's
 * default shell goes into argv); false with the error sent. */
static bool exec_check(struct conn *c, uint32_t id, const struct exec_req *q, char **argv)
{
    if (q->argc == 0 && !q->sess) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0,
                               "start: no argument (only a shell session may leave argv empty)");
        return false;
    }
    if (q->pty && q->sess) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                               "start: a shell session runs without a terminal (pty and session "
                               "are exclusive)");
        return false;
    }
    if (q->sess && q->in_len) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                               "start: a shell session takes no stdin (its commands come with "
                               "exec)");
        return false;
    }
    if (q->pty && (q->rows > 65535 || q->cols > 65535)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                               "start: a window of %" PRIu32 " x %" PRIu32
                               " (at most 65535 x 65535)",
                               q->rows, q->cols);
        return false;
    }
    if (q->sess && q->argc == 0) {
        argv[0] = (char *)(access("/bin/bash", X_OK) == 0 ? "/bin/bash" : "/bin/sh");
        argv[1] = NULL;
    }
    if (q->bg && q->ring_max > DSEC__AGENT_RING_MAX) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_TOO_LARGE, 0,
                               "start: ring_max %" PRIu64
                               " is over the limit of %u bytes per stream",
                               q->ring_max, DSEC__AGENT_RING_MAX);
        return false;
    }
    if (q->bg && !dsec__agent_procs_room()) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_TOO_LARGE, 0,
                               "start: %zu background processes are running, the most this "
                               "sandbox keeps; end one first",
                               dsec__agent_g.proc_max);
        return false;
    }
    return true;
}

/* The user the command runs as: the request's, or the sandbox's default. The user first: an
 * unknown one is the caller's error, not the command's. false with the error sent. */
static bool exec_user(struct conn *c, uint32_t id, const struct exec_req *q, struct ident *ident)
{
    char user_z[DSEC__AGENT_USER_MAX + 1];
    const char *user_spec =
        q->user_len ? memcpy(user_z, q->user, q->user_len) : dsec__agent_g.default_user;
    if (q->user_len)
        user_z[q->user_len] = 0;
    if (user_spec) {
        const char *why = dsec__agent_resolve_user(user_spec, ident);
        if (why) {
            dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "%s: user \"%s\": %s", q->op,
                                   user_spec, why);
            return false;
        }
    }
    return true;
}

/* argv, the environment (the base one, a passwd user's HOME, USER and LOGNAME, a terminal's
 * TERM, then the request's) and the directory, copied into one block; -1 when out of memory. */
static int exec_strings(const struct exec_req *q, struct exec_job *j)
{
    const struct ident *ident = &j->ident;
    size_t home_len = strlen(ident->home), name_len = strlen(ident->name);
    size_t total = q->total + q->cwd_len + 1 + (ident->name[0] ? home_len + 2 * name_len + 24 : 0);
    j->block = malloc(total);
    j->envp = calloc(dsec__agent_g.nbase_env + q->nenv + 5, sizeof *j->envp);
    if (j->block == NULL || j->envp == NULL)
        return -1;
    char *b = j->block;
    dsec__agent_rd r2 = {.p = q->args, .end = q->end};
    for (size_t i = 0; i < q->argc; i++) {
        size_t l;
        const char *s = dsec__agent_get_str(&r2, DSEC__AGENT_ARG_LEN_MAX, &l);
        j->argv[i] = memcpy(b, s, l);
        b[l] = 0;
        b += l + 1;
    }
    size_t ne = dsec__agent_g.nbase_env;
    memcpy(j->envp, dsec__agent_g.base_env, ne * sizeof *j->envp);
    if (ident->name[0]) { /* a passwd user gets its own HOME, USER and LOGNAME; the request may
                             override */
        b += sprintf(b, "HOME=%s", ident->home) + 1;
        dsec__agent_env_set(&j->envp, &ne, b - home_len - 6);
        b += sprintf(b, "USER=%s", ident->name) + 1;
        dsec__agent_env_set(&j->envp, &ne, b - name_len - 6);
        b += sprintf(b, "LOGNAME=%s", ident->name) + 1;
        dsec__agent_env_set(&j->envp, &ne, b - name_len - 9);
    }
    if (q->pty)
        dsec__agent_env_set(&j->envp, &ne, (char *)"TERM=xterm-256color");
    r2.p = q->env;
    for (size_t i = 0; i < q->nenv; i++) {
        size_t kl, vl;
        const char *k = dsec__agent_get_str(&r2, DSEC__AGENT_ARG_LEN_MAX, &kl);
        const char *v = dsec__agent_get_str(&r2, DSEC__AGENT_ARG_LEN_MAX, &vl);
        char *kv = b;
        memcpy(b, k, kl);
        b[kl] = '=';
        memcpy(b + kl + 1, v, vl);
        b[kl + 1 + vl] = 0;
        b += kl + vl + 2;
        dsec__agent_env_set(&j->envp, &ne, kv);
    }
    j->envp[ne] = NULL;
    j->cwd = dsec__agent_g.workdir;
    if (q->cwd_len) {
        j->cwd = memcpy(b, q->cwd, q->cwd_len);
        b[q->cwd_len] = 0;
        b += q->cwd_len + 1;
    }
    j->path_env = env_get(j->envp, ne, "PATH");
    return 0;
}

/* The command's stdin, stdout and stderr: pipes, a terminal, or /dev/null for no stdin. false
 * with the error sent. */
static bool exec_stdio(struct conn *c, uint32_t id, const struct exec_req *q, struct exec_job *j)
{
    /* No stdin: the shared /dev/null instead of a pipe closed at once (fewer system calls). */
    j->null_in = q->in_len == 0 && !q->keep_stdin && dsec__agent_g.null_fd >= 0;
    if (q->pty) {
        /* The slave is the child's stdin, stdout and stderr (pfd[0][0]); the master is read
         * as stdout (pfd[1][0]) and written as stdin through a copy (pfd[0][1]), as epoll
         * watches each descriptor once. */
        int e =
            open_pty(&j->pfd[1][0], &j->pfd[0][0], q->rows ? q->rows : 24, q->cols ? q->cols : 80);
        if (e == 0 && (j->pfd[0][1] = fcntl(j->pfd[1][0], F_DUPFD_CLOEXEC, 3)) < 0)
            e = errno;
        if (e) {
            dsec__agent_send_error(c, id, DSEC__AGENT_ERR_IO, e, "start: a terminal: %s",
                                   strerror(e));
            return false;
        }
    }
    for (int i = j->null_in ? 1 : 0; i < 3 && !q->pty; i++)
        if (pipe2(j->pfd[i], O_CLOEXEC) < 0) {
            dsec__agent_send_error(c, id, DSEC__AGENT_ERR_IO, errno, "%s: pipe: %s", q->op,
                                   strerror(errno));
            return false;
        }
    return true;
}

/* m, started by its shepherd pid (main_pid its main process, rep_fd the shepherd's socket),
 * joins the commands the loop watches. */
static void exec_register(struct cmd *m, struct conn *c, uint32_t id, const struct exec_req *q,
                          pid_t pid, pid_t main_pid, int rep_fd)
{
    m->conn = c;
    m->id = id;
    m->pid = pid;
    m->pgid = main_pid;
    m->rep = (struct pipe_ep){.kind = K_PIPE, .fd = rep_fd, .stream = 3, .cmd = m};
    dsec__agent_ep_ctl(EPOLL_CTL_ADD, rep_fd, EPOLLIN, &m->rep);
    m->out_max = q->out_max;
    m->deadline_ns = q->timeout_ms ? m->start_ns + q->timeout_ms * 1000000u : 0;
    if (q->timeout_ms > UINT64_MAX / 2000000u) /* effectively forever; avoid the overflow */
        m->deadline_ns = 0;
    m->next = dsec__agent_g.cmds;
    if (dsec__agent_g.cmds)
        dsec__agent_g.cmds->prev = m;
    dsec__agent_g.cmds = m;
}

/* The agent's ends of m's stdio (the command's are closed: the command holds them now). */
static void exec_pipes(struct cmd *m, int pfd[3][2])
{
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
}

/* Feed stdin now; whatever the pipe does not take waits for EPOLLOUT. Without keep_stdin,
 * stdin closes once all is in. */
static void exec_feed(struct cmd *m, const uint8_t *in, size_t in_len, bool keep_stdin)
{
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
            dsec__agent_ep_ctl(EPOLL_CTL_ADD, m->io[0].fd, EPOLLOUT, &m->io[0]);
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
}

/* Start the prepared command under a shepherd and watch it; a background process answers
 * PROC now. false with the error sent (nothing started). */
static bool exec_start(struct conn *c, uint32_t id, struct exec_req *q, struct exec_job *j)
{
    struct cmd *m = j->m;
    int(*pfd)[2] = j->pfd;
    struct spawn s = {
        .argv = j->argv,
        .envp = j->envp,
        .path_env = j->path_env ? j->path_env : DEFAULT_PATH,
        .cwd = j->cwd,
        .id = &j->ident,
        .fds = {j->null_in ? dsec__agent_g.null_fd : pfd[0][0], q->pty ? pfd[0][0] : pfd[1][1],
                q->pty ? pfd[0][0] : pfd[2][1]},
        .tty = q->pty,
    };
    m->start_ns = dsec__agent_now_ns();
    pid_t main_pid = 0;
    int rep_fd = -1;
    pid_t pid = dsec__agent_spawn_shepherd(&s, &main_pid, &rep_fd);
    if (pid < 0) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_IO, errno, "%s: cannot start the command: %s",
                               q->op, strerror(errno));
        return false;
    }
    exec_register(m, c, id, q, pid, main_pid, rep_fd);
    if (q->bg) {
        m->conn = NULL; /* no connection's: PROC answers now, and output goes to the rings */
        m->proc = dsec__agent_proc_new(m, j->argv, q->ring_max);
        m->proc->pty = q->pty;
        if (q->sess)
            q->in = (const uint8_t *)dsec__agent_sess_start(m->proc, &q->in_len);
    }
    exec_pipes(m, pfd);
    exec_feed(m, q->in, q->in_len, q->keep_stdin);
    if (m->proc)
        m->proc->stdin_open = m->io[0].fd >= 0 && !q->sess; /* a session's is the agent's */
    for (int i = 1; i <= 2; i++)
        if (m->io[i].fd >= 0)
            dsec__agent_ep_ctl(EPOLL_CTL_ADD, m->io[i].fd, EPOLLIN, &m->io[i]);
    if (m->proc)
        dsec__agent_send_proc(c, id, DSEC__AGENT_T_PROC, m->proc);
    j->m = NULL; /* the loop's now, and so are the pipes */
    for (int i = 0; i < 3; i++)
        pfd[i][0] = pfd[i][1] = -1;
    return true;
}

static void exec_job_free(struct exec_job *j)
{
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++)
            if (j->pfd[i][k] >= 0)
                close(j->pfd[i][k]);
    free(j->m);
    free(j->envp);
    free(j->block);
    free(j->argv);
}

/* EXEC, or PSTART (bg): a background process, which answers PROC at once. */
void dsec__agent_handle_exec(struct conn *c, uint32_t id, dsec__agent_rd *r, bool bg)
{
    struct exec_req q = {.op = bg ? "start" : "exec", .bg = bg};
    if (!exec_decode_head(c, id, r, &q))
        return;
    struct exec_job j = {.pfd = {{-1, -1}, {-1, -1}, {-1, -1}}};
    j.argv = calloc(q.argc + 2, sizeof *j.argv); /* + a session's default shell */
    if (j.argv == NULL)
        goto nomem;
    if (!exec_decode_rest(c, id, r, &q))
        goto out;
    if (q.session) {
        exec_in_session(c, id, &q);
        goto out;
    }
    if (!exec_check(c, id, &q, j.argv) || !exec_user(c, id, &q, &j.ident))
        goto out;
    if (exec_strings(&q, &j) < 0 || (j.m = calloc(1, sizeof *j.m)) == NULL)
        goto nomem;
    if (q.pty || q.sess)
        q.keep_stdin = true; /* a terminal's input; a session's commands */
    if (exec_stdio(c, id, &q, &j))
        exec_start(c, id, &q, &j);
    goto out;
nomem:
    dsec__agent_send_error(c, id, DSEC__AGENT_ERR_IO, ENOMEM, "%s: out of memory", q.op);
out:
    exec_job_free(&j);
}
