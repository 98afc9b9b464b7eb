/* agent-sess.c - shell sessions: a background shell that runs EXEC command lines one at a time */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/agent/agent-int.h"

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
 * The shell's own stderr is /dev/null: only a command's runs (2>&8) reach the stream. Bash
 * says some things late, as it reads the next line: "Killed" about a background job that a
 * signal ended, or about a command whose interrupt returned before bash said it; on the
 * stream, they would be the next command's stderr. Bash says them when it next parses, so
 * each line parses ("eval :") before the command's stderr is put in place.
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

static const char SESS_BOOT[] =
    "__dsec_busy=\n"
    "__dsec_int='if [ -n \"${__dsec_busy:-}\" ]; then __dsec_busy=; __dsec_intd=1; return 130; "
    "fi'\n"
    "trap \"$__dsec_int\" INT\n"
    "__dsec_run() { __dsec_cmd=$1; shift; __dsec_busy=1; command eval \"$__dsec_cmd\"; "
    "__dsec_st=$?; __dsec_busy=; return $__dsec_st; }\n"
    "exec 7>&1 8>&2 2>/dev/null\n"
    "command printf '\\036%s:0\\n' \"$__dsec_tok\" >&7\n"
    "command printf '\\036%s:0\\n' \"$__dsec_tok\" >&8\n";

void dsec__agent_sess_forget_conn(struct proc *p, const struct conn *c)
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
    dsec__agent_ring_put(&p->ring[s], data, n);
    if (!x->booted[s] || !x->busy || x->marked[s])
        return;
    uint64_t before = x->seen[s];
    x->seen[s] += n;
    if (x->conn == NULL || x->conn->dead || before >= x->out_max)
        return;
    size_t send_n = (size_t)(x->out_max - before < n ? x->out_max - before : n);
    size_t plen = 1 + 4 + send_n;
    uint8_t *p0 = dsec__agent_conn_reserve(x->conn, DSEC__AGENT_HDR + plen), *o = p0;
    o = dsec__agent_put_hdr(o, DSEC__AGENT_T_OUTPUT, x->id, plen);
    o = dsec__agent_put_u8(o, (uint8_t)(s + 1));
    o = dsec__agent_put_bytes(o, data, send_n);
    dsec__agent_conn_commit(x->conn, (size_t)(o - p0));
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
    uint64_t dur = (dsec__agent_now_ns() - x->start_ns) / 1000u;
    x->busy = false;
    x->conn = NULL;
    x->int_at = x->int_next = 0;
    x->int_stage = 0;
    x->deadline_ns = 0;
    dsec__agent_send_exit(c, id, code, sig, flags, dur, 0, 0);
}

/* Whether a marker is due on stream s: the bootstrap's, or the running command's. */
static bool sess_looking(const struct sess *x, int s)
{
    return !x->booted[s] || (x->busy && !x->marked[s]);
}

/* Output of the session's shell on stream s: markers out, the rest to sess_emit. */
void dsec__agent_sess_output(struct proc *p, int s, const uint8_t *data, size_t n)
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
                    dsec__agent_ring_put(&p->ring[s], buf + pos, len - pos);
                if (n > 0)
                    dsec__agent_ring_put(&p->ring[s], data, n);
                return;
            }
        }
        if (pos < len) /* after the marker: the session's, not the command's */
            sess_emit(p, s, buf + pos, len - pos);
    }
}

/* The shell ended (status, its wait status): what was held is output; a command running
 * ends with it. */
void dsec__agent_sess_ended(struct proc *p, int status)
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

/* p becomes a session: its token and marker. Returns what the shell gets as its first stdin
 * (the token, then SESS_BOOT), *boot_len bytes valid until the next call. */
const char *dsec__agent_sess_start(struct proc *p, size_t *boot_len)
{
    static char boot[sizeof SESS_BOOT + SESS_TOK_LEN + 16];
    struct sess *x = dsec__agent_xrealloc(NULL, sizeof *x);
    memset(x, 0, sizeof *x);
    uint8_t rnd[16];
    size_t got = 0;
    while (got < sizeof rnd) {
        ssize_t n = getrandom(rnd + got, sizeof rnd - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) { /* no getrandom: the clock and pid, still unknown to commands */
            uint64_t t = dsec__agent_now_ns() ^ ((uint64_t)getpid() << 32) ^ p->handle;
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
    *boot_len = (size_t)snprintf(boot, sizeof boot, "__dsec_tok=%s\n%s", x->tok, SESS_BOOT);
    return boot;
}

/* EXEC in a session: the command line goes to the shell, single-quoted (a quote becomes
 * '\''), so nothing in it is shell syntax until eval. */
void dsec__agent_handle_sexec(struct conn *c, uint32_t id, uint64_t handle, const char *cmd,
                              size_t cmd_len, uint64_t timeout_ms, uint64_t out_max)
{
    struct proc *p = dsec__agent_proc_by_handle(handle);
    if (p == NULL) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_NOT_FOUND, 0,
                               "exec: no process with handle %" PRIu64 " in this sandbox", handle);
        return;
    }
    if (p->sess == NULL) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_INVALID, 0,
                               "exec: process %" PRIu64 " is not a shell session", handle);
        return;
    }
    struct sess *x = p->sess;
    if (!p->running || p->cmd == NULL || p->cmd->io[0].fd < 0) {
        dsec__agent_send_error(c, id, DSEC__AGENT_ERR_STATE, 0,
                               "exec: session %" PRIu64 " has ended", handle);
        return;
    }
    if (x->busy) {
        dsec__agent_send_error(
            c, id, DSEC__AGENT_ERR_STATE, 0,
            "exec: session %" PRIu64 " is running a command; wait for it or interrupt it", handle);
        return;
    }
    /* The trap is set again each time: bash, its return having cut short a wait for a child
     * that SIGINT ended, leaves its own SIGINT handler in a state that no longer runs it. */
    static const char head[] = "trap \"$__dsec_int\" INT; command eval :; __dsec_run '";
    static const char tail[] =
        "' </dev/null 2>&8 7>&- 8>&-; __dsec_st=$?; [ -z \"${__dsec_intd:-}\" ] || __dsec_st=130; "
        "__dsec_intd=; "
        "command printf '\\036%s:%d\\n' \"$__dsec_tok\" \"$__dsec_st\" >&7; "
        "command printf '\\036%s:%d\\n' \"$__dsec_tok\" \"$__dsec_st\" >&8\n";
    size_t quotes = 0;
    for (size_t i = 0; i < cmd_len; i++)
        quotes += cmd[i] == '\'';
    size_t len = sizeof head - 1 + cmd_len + 3 * quotes + sizeof tail - 1;
    uint8_t *line = dsec__agent_xrealloc(NULL, len), *o = line;
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
    x->start_ns = dsec__agent_now_ns();
    x->deadline_ns =
        timeout_ms && timeout_ms <= UINT64_MAX / 2000000u ? x->start_ns + timeout_ms * 1000000u : 0;
    x->timed_out = x->interrupted = false;
    x->int_at = x->int_next = 0;
    x->int_stage = 0;
    dsec__agent_proc_feed(p, line, len);
    free(line);
}

/* Interrupt the command running in session p (dsec__agent_sess_tick carries it on). */
void dsec__agent_sess_interrupt(struct proc *p)
{
    struct sess *x = p->sess;
    if (!x->busy || x->int_at)
        return;
    x->int_at = x->int_next = dsec__agent_now_ns();
}

/* KILL's sig for m, the running command of a session, not its shell: SIGINT interrupts it;
 * another signal goes to what is below the shell, and the interrupt unwinds the shell's part. */
void dsec__agent_sess_signal(struct cmd *m, uint32_t sig)
{
    bool below = sig != SIGINT && dsec__agent_proc_is_ours();
    if (below)
        dsec__agent_kill_below(m->pgid, m->pgid, (int)sig, false);
    dsec__agent_sess_interrupt(m->proc);
    /* what was signalled ends first: bash says what killed it within the command's
     * output, which a return from the INT trap during its wait would put off to the
     * next command's */
    if (below && m->proc->sess->int_next == m->proc->sess->int_at)
        m->proc->sess->int_next += SESS_INT_KILL_WAIT_MS * 1000000ull;
    dsec__agent_sess_tick(m->proc, dsec__agent_now_ns());
}

/* When x next needs dsec__agent_sess_tick (its command's deadline, or the next step of an
 * interrupt); 0: never. */
uint64_t dsec__agent_sess_due(const struct sess *x)
{
    uint64_t best = 0;
    if (x->busy && x->deadline_ns)
        best = x->deadline_ns;
    if (x->busy && x->int_at && x->int_stage < 2) {
        uint64_t t = x->int_next;
        uint64_t step =
            x->int_at + (x->int_stage == 0 ? SESS_INT_KILL_MS : SESS_INT_END_MS) * 1000000ull;
        if (step < t)
            t = step;
        if (best == 0 || t < best)
            best = t;
    }
    return best;
}

/* An interrupt under way, at now: SIGINT again, or the next step up. */
void dsec__agent_sess_tick(struct proc *p, uint64_t now)
{
    struct sess *x = p->sess;
    struct cmd *m = p->cmd;
    if (x->deadline_ns && now >= x->deadline_ns) {
        x->timed_out = true;
        x->deadline_ns = 0;
        dsec__agent_sess_interrupt(p);
        now = dsec__agent_now_ns(); /* as late as the interrupt's start */
    }
    if (!x->busy || x->int_at == 0 || m == NULL || m->exited)
        return;
    uint64_t since = now > x->int_at ? now - x->int_at : 0;
    if (since >= SESS_INT_END_MS * 1000000ull && x->int_stage < 2) {
        dsec__agent_logmsg("session %" PRIu64
                           ": the shell did not come back from an interrupt; ending it",
                           p->handle);
        x->int_stage = 2;
        dsec__agent_cmd_end(m);
        return;
    }
    if (since >= SESS_INT_KILL_MS * 1000000ull && x->int_stage < 1) {
        x->int_stage = 1;
        if (dsec__agent_proc_is_ours())
            dsec__agent_kill_below(m->pgid, m->pgid, SIGKILL, false);
    }
    if (x->int_stage < 2 && now >= x->int_next && !(x->booted[0] && x->booted[1])) {
        x->int_next = now + 20000000u; /* the trap is not set yet: look again soon */
    } else if (x->int_stage < 2 && now >= x->int_next) {
        kill(-m->pgid, SIGINT);
        x->int_next = now + SESS_INT_EVERY_MS * 1000000ull;
    }
}
