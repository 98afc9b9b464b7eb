/* agent-cmd.c - running commands: their output, their exit, reaping, timeouts and KILL */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/agent/agent-int.h"

#define WBUF_HIGH (1u << 20) /* stop reading a command's output while this much waits to go out */
#define DRAIN_MAX (1u << 20) /* most output read from one stream after its command exited */

static uint8_t iobuf[DSEC__AGENT_CHUNK];

void dsec__agent_pipe_close(struct pipe_ep *e)
{
    if (e->fd < 0)
        return;
    dsec__agent_ep_ctl(EPOLL_CTL_DEL, e->fd, 0, NULL);
    close(e->fd);
    e->fd = -1;
    e->paused = false;
}

/* An EXIT frame to c (nothing when c is NULL or gone). */
void dsec__agent_send_exit(struct conn *c, uint32_t id, int32_t code, int32_t sig, uint8_t flags,
                           uint64_t dur_us, uint64_t cpu_us, uint64_t rss_kb)
{
    if (c == NULL || c->dead)
        return;
    size_t plen = 4 + 4 + 1 + 8 + 8 + 8;
    uint8_t *p0 = dsec__agent_conn_reserve(c, DSEC__AGENT_HDR + plen), *p = p0;
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_EXIT, id, plen);
    p = dsec__agent_put_u32(p, (uint32_t)code);
    p = dsec__agent_put_u32(p, (uint32_t)sig);
    p = dsec__agent_put_u8(p, flags);
    p = dsec__agent_put_u64(p, dur_us);
    p = dsec__agent_put_u64(p, cpu_us);
    p = dsec__agent_put_u64(p, rss_kb);
    dsec__agent_conn_commit(c, (size_t)(p - p0));
}

/* Forward output to the client within the cap; what is past it is counted and dropped. A
 * background process's goes to its ring. */
static void cmd_output(struct cmd *m, int stream, const uint8_t *data, size_t n)
{
    uint64_t before = m->seen[stream];
    m->seen[stream] += n;
    if (m->proc && m->proc->sess) {
        dsec__agent_sess_output(m->proc, stream - 1, data, n);
        return;
    }
    if (m->proc)
        dsec__agent_ring_put(&m->proc->ring[stream - 1], data, n);
    if (m->conn == NULL || before >= m->out_max)
        return;
    size_t send_n = (size_t)(m->out_max - before < n ? m->out_max - before : n);
    size_t plen = 1 + 4 + send_n;
    uint8_t *p0 = dsec__agent_conn_reserve(m->conn, DSEC__AGENT_HDR + plen), *p = p0;
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_OUTPUT, m->id, plen);
    p = dsec__agent_put_u8(p, (uint8_t)stream);
    p = dsec__agent_put_bytes(p, data, send_n);
    dsec__agent_conn_commit(m->conn, (size_t)(p - p0));
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
        dsec__agent_pipe_close(e);
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
        dsec__agent_g.cmds = m->next;
    if (m->next)
        m->next->prev = m->prev;
    m->next_dead = dsec__agent_g.dead_cmds;
    dsec__agent_g.dead_cmds = m;
}

/* The main process ended (at end, CLOCK_MONOTONIC) and its shepherd reported (after killing
 * the rest of the tree if the agent ended the command): collect what it wrote, report, forget
 * the command. Processes left in the background lose the pipes. */
static void cmd_exited(struct cmd *m, int status, const struct rusage *ru, uint64_t end)
{
    m->exited = true;
    dsec__agent_pipe_close(&m->rep);
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
        dsec__agent_pipe_close(&m->io[s]);
    if (m->proc)
        dsec__agent_proc_ended(m->proc, m, status, end);
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
        dsec__agent_send_exit(m->conn, m->id, code, sig, flags, (end - m->start_ns) / 1000u, cpu,
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
    dsec__agent_pipe_close(&m->rep);
    return -1;
}

/* The report came: the main process is gone, and so is the rest of the tree if the command
 * was doomed; answer now. The shepherd waits for the next command (kept idle: nothing was left
 * under it) or exits (reaped later; what it left behind comes to us). */
void dsec__agent_on_report(struct cmd *m)
{
    struct shep_report rp;
    if (read_report(m, &rp) != 1)
        return;
    if (rp.reusable && dsec__agent_g.nidle + 1 <= SHEP_IDLE_MAX && !dsec__agent_g.terminating) {
        dsec__agent_ep_ctl(EPOLL_CTL_DEL, m->rep.fd, 0, NULL);
        dsec__agent_g.idle[dsec__agent_g.nidle].pid = m->pid;
        dsec__agent_g.idle[dsec__agent_g.nidle++].fd = m->rep.fd;
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
    dsec__agent_logmsg("exec %" PRIu32
                       ": the command's shepherd died (status %#x) before it reported",
                       m->id, (unsigned)status);
    int st;
    struct rusage cru;
    if (m->main_reaped) { /* it ended before its shepherd was reaped */
        cmd_exited(m, m->main_status, &m->main_ru, dsec__agent_now_ns());
        return;
    }
    pid_t p = wait4(m->pgid, &st, WNOHANG, &cru);
    if (p == m->pgid) {
        kill(-m->pgid, SIGKILL); /* what is left of its group */
        cmd_exited(m, st, &cru, dsec__agent_now_ns());
    } else if (p != 0) {
        cmd_exited(m, status, ru, dsec__agent_now_ns());
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

void dsec__agent_reap(void)
{
    for (;;) {
        int status;
        struct rusage ru;
        pid_t pid = wait4(-1, &status, WNOHANG, &ru);
        if (pid <= 0)
            return;
        for (size_t i = 0; i < dsec__agent_g.nidle; i++)
            if (dsec__agent_g.idle[i].pid == pid) { /* an idle shepherd died (killed): forget it */
                if (dsec__agent_g.idle[i].fd >= 0)
                    close(dsec__agent_g.idle[i].fd);
                dsec__agent_g.idle[i] = dsec__agent_g.idle[--dsec__agent_g.nidle];
                break;
            }
        /* Besides shepherds, the main process of a command whose shepherd died comes here;
         * what commands left in the background and processes of the sandbox that were not ours
         * (we are init or a subreaper) are just reaped. So is a shepherd whose report was
         * answered already. */
        for (struct cmd *m = dsec__agent_g.cmds; m; m = m->next) {
            if (m->pid == pid && !m->exited) {
                shepherd_gone(m, status, &ru);
                break;
            }
            if (m->pgid == pid && !m->exited && shepherd_dead(m)) { /* the main is ours */
                kill(-pid, SIGKILL); /* what is left of its group: it outlives its leader */
                if (m->pid == 0) {
                    cmd_exited(m, status, &ru, dsec__agent_now_ns());
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

void dsec__agent_on_pipe(struct pipe_ep *e, uint32_t events)
{
    struct cmd *m = e->cmd;
    if (m->dead || e->fd < 0)
        return;
    if (e->stream == 3) {
        dsec__agent_on_report(m);
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
            dsec__agent_proc_stdin_taken(m->proc, m, m->in_len - m->in_off);
            return;
        }
        dsec__agent_pipe_close(e);
        free(m->in);
        m->in = NULL;
        return;
    }
    /* Slow client: leave the output in the pipe (the command blocks) until the backlog drains. */
    if (m->conn && dsec__agent_conn_backlog(m->conn) > WBUF_HIGH &&
        m->seen[e->stream] < m->out_max) {
        e->paused = true;
        dsec__agent_ep_ctl(EPOLL_CTL_MOD, e->fd, 0, e);
        return;
    }
    pipe_read(m, e->stream);
}

/* The agent ends m (timeout, KILL, SIGTERM): SIGKILL to its main process's group, and its
 * shepherd, told first, kills the rest of its tree. */
void dsec__agent_cmd_end(struct cmd *m)
{
    dsec__agent_shep_doom(m);
    kill(-m->pgid, SIGKILL);
    if (m->pid > 0)
        kill(m->pid, SIGCONT); /* should the sandbox's root have stopped it */
}

void dsec__agent_check_timeouts(void)
{
    uint64_t now = dsec__agent_now_ns();
    for (struct cmd *m = dsec__agent_g.cmds; m; m = m->next)
        if (m->proc && m->proc->sess && m->proc->sess->busy && !m->exited)
            dsec__agent_sess_tick(m->proc, now);
    for (struct cmd *m = dsec__agent_g.cmds; m; m = m->next)
        if (m->deadline_ns && !m->exited && now >= m->deadline_ns) {
            m->timed_out = true;
            m->deadline_ns = 0;
            dsec__agent_cmd_end(m);
        }
}

void dsec__agent_handle_kill(struct conn *c, uint32_t id, dsec__agent_rd *r)
{
    uint32_t sig = dsec__agent_get_u32(r);
    if (!dsec__agent_done(r)) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_BAD_FRAME, 0, "kill: malformed request");
        return;
    }
    if (sig < 1 || sig > (uint32_t)SIGRTMAX) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0, "kill: no signal %" PRIu32, sig);
        return;
    }
    uint64_t n = 0;
    for (struct cmd *m = dsec__agent_g.cmds; m; m = m->next) {
        if (!m->exited && m->proc && m->proc->sess && m->proc->sess->busy) {
            dsec__agent_sess_signal(m, sig); /* a session's command, not its shell */
            n++;
            continue;
        }
        if (m->exited || m->proc) /* background processes have PSIGNAL */
            continue;
        dsec__agent_shep_doom(m); /* when the main process exits, its tree goes too */
        if (kill(-m->pgid, (int)sig) == 0)
            n++;
    }
    dsec__agent_send_ok(c, id, n);
}
