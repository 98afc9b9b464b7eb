/* container-agent.c - the container's agent: its connection, and the exec, file and process
 * calls made through it (with what the host sees when it does not answer). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "backends/container/container-int.h"
#include "dsec/alloc.h"

/* An agent that does not answer is either dead or alive and busy; the two need different
 * answers (destroy the sandbox, or wait and lighten its load), so an error says which, from
 * what the host sees of its container - its cgroups and /proc, never the agent itself. The
 * agent is the container's init: when it dies, the kernel kills the rest of the container.
 * Fills err (keeping what was seen of the failure in its message) and returns -1. */
static int agent_unanswered(const struct ct_backend *be, const dsec_sandbox *sb, dsec_err *err)
{
    struct ct_agent_probe p;
    dsec__ct_agent_probe(be, sb->rid, &p);
    char seen[DSEC_ERR_MSG_MAX];
    dsec__ct_fmt(seen, sizeof seen, "%s", err->msg[0] ? err->msg : "no answer");
    int errnum = err->errnum;
    if (p.init == 0 || p.state == 'Z' || p.state == 'X') {
        char where[160], cause[200];
        if (!p.cgroup)
            dsec__ct_fmt(where, sizeof where, "its container's cgroup is gone");
        else if (p.init != 0)
            dsec__ct_fmt(where, sizeof where, "its init (pid %d on the host) has exited",
                         (int)p.init);
        else if (p.nprocs > 0)
            dsec__ct_fmt(where, sizeof where, "its init is gone, %u processes remain", p.nprocs);
        else
            dsec__ct_fmt(where, sizeof where, "its container has no processes left");
        if (p.oom_kills > 0 && p.mem_limit > 0)
            dsec__ct_fmt(cause, sizeof cause,
                         "its memory cgroup recorded %" PRIu64 " OOM kill(s) at its limit of "
                         "%" PRIu64 " MiB: out of memory is the likely cause",
                         p.oom_kills, p.mem_limit >> 20);
        else if (p.oom_kills > 0)
            dsec__ct_fmt(cause, sizeof cause,
                         "its memory cgroup recorded %" PRIu64
                         " OOM kill(s): out of memory is the likely cause",
                         p.oom_kills);
        else
            dsec__ct_fmt(cause, sizeof cause,
                         "no OOM kill is recorded in its memory cgroup: it was killed or crashed");
        return dsec_err_set(err, DSEC_E_BACKEND, 0, /* a broken pipe says nothing more */
                            "container: the sandbox's agent is dead: %s; %s. Nothing more can run "
                            "in this sandbox: destroy it",
                            where, cause);
    }
    /* Alive: say what keeps it from answering, as far as the host can tell. */
    char why[320] = "";
    size_t used = 0;
#define WHY(...)                                                                                   \
    do {                                                                                           \
        if (used < sizeof why)                                                                     \
            used += (size_t)snprintf(why + used, sizeof why - used, __VA_ARGS__);                  \
    } while (0)
    if (p.frozen)
        WHY("; its cgroup is frozen (the sandbox is paused)");
    if (p.state == 'T' || p.state == 't')
        WHY("; it is stopped (state %c: SIGSTOP or a debugger)", p.state);
    if (p.pids_max > 0 && p.pids >= p.pids_max)
        WHY("; its container is at its process limit (pids %" PRIu64 " of %" PRIu64
            "), as in a fork bomb",
            p.pids, p.pids_max);
    if (p.cpu_throttled > 0)
        WHY("; its CPU quota has throttled it %" PRIu64 " times", p.cpu_throttled);
    if (p.oom_kills > 0)
        WHY("; its memory cgroup recorded %" PRIu64 " OOM kill(s) of other processes", p.oom_kills);
    if (!p.frozen && p.state != 'T' && p.state != 't' && p.nprocs > 1)
        WHY("; it may be starved of CPU by the %u other processes of its container", p.nprocs - 1);
    else if (!p.frozen && p.state != 'T' && p.state != 't')
        WHY("; it may be starved of CPU or memory on the host");
#undef WHY
    return dsec_err_set(err, err->code, errnum,
                        "container: the sandbox's agent is alive (pid %d on the host, state %c) "
                        "but %s: %s%s",
                        (int)p.init, p.state ? p.state : '?',
                        err->code == DSEC_E_TIMEOUT ? "did not answer in time"
                                                    : "its connection failed",
                        seen, why);
}

/* The connection, re-made when an earlier call lost it. */
static int agent(const struct ct_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    if (sb->agent != NULL)
        return 0;
    /* dead: say so now, not after the connect's wait. Dead is no init (pid 1 of the
     * container), not no process: a killed init's last processes linger a moment. */
    struct ct_agent_probe p;
    dsec__ct_agent_probe(be, sb->rid, &p);
    if (p.init == 0 || p.state == 'Z' || p.state == 'X') {
        dsec_err_set(err, DSEC_E_CONN, 0, "no init in its container");
        return agent_unanswered(be, sb, err);
    }
    char sp[PATH_MAX + 16];
    dsec__ct_sock_path(sb, sp, sizeof sp);
    if (dsec_agent_connect(&sb->agent, sp, 2000, err) < 0)
        return agent_unanswered(be, sb, err);
    return 0;
}

/* After a failed agent call: a lost connection is dropped so the next call reconnects, and
 * the error says whether the agent is dead or alive and not answering. */
static int agent_failed(const struct ct_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    if (err->code == DSEC_E_CONN || err->code == DSEC_E_IO || err->code == DSEC_E_CLOSED ||
        err->code == DSEC_E_TIMEOUT || err->code == DSEC_E_DECODE) {
        dsec_agent_free(sb->agent);
        sb->agent = NULL;
        return agent_unanswered(be, sb, err);
    }
    return -1;
}

size_t dsec__ct_default_cmd(void *self, dsec_sandbox *sb, const char *const **argv)
{
    (void)self;
    *argv = (const char *const *)sb->env.base.cmd;
    return sb->env.base.ncmd;
}

int dsec__ct_exec(void *self, dsec_sandbox *sb, const dsec_exec_req *req, dsec_exec_result *res,
                  dsec_err *err)
{
    const struct ct_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    if (dsec_agent_exec(sb->agent, req, req->on_output, req->on_output_arg, res, err) < 0)
        return agent_failed(be, sb, err);
    return 0;
}

/* A command in flight: on failure, the lost connection is dropped and the error says
 * whether the agent is dead or alive, as for a waited exec. */
struct ct_run {
    const struct ct_backend *be;
    dsec_sandbox *sb;
    dsec_exec_done_fn done;
    void *ud;
};

static void ct_exec_done(void *ud, int rc, dsec_exec_result *res, dsec_err *err)
{
    struct ct_run r = *(struct ct_run *)ud;
    dsec_free(ud);
    if (rc < 0)
        agent_failed(r.be, r.sb, err);
    r.done(r.ud, rc, res, err);
}

int dsec__ct_exec_start(void *self, dsec_sandbox *sb, const dsec_exec_req *req,
                        struct dsec_loop *loop, dsec_exec_done_fn done, void *ud, dsec_err *err)
{
    const struct ct_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    struct ct_run *r = dsec_malloc(sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container: a command in flight");
    *r = (struct ct_run){.be = be, .sb = sb, .done = done, .ud = ud};
    if (dsec_agent_exec_start(sb->agent, loop, req, req->on_output, req->on_output_arg,
                              ct_exec_done, r, err) < 0) {
        dsec_free(r);
        return agent_failed(be, sb, err);
    }
    return 0;
}

/* A file transfer in flight: on failure, as a command's (ct_exec_done). */
struct ct_xfer {
    const struct ct_backend *be;
    dsec_sandbox *sb;
    dsec_file_done_fn done;
    void *ud;
};

static void ct_xfer_done(void *ud, int rc, dsec_file_data *data, dsec_err *err)
{
    struct ct_xfer x = *(struct ct_xfer *)ud;
    dsec_free(ud);
    if (rc < 0 && dsec_agent_broken(x.sb->agent))
        agent_failed(x.be, x.sb, err);
    x.done(x.ud, rc, data, err);
}

/* The transfer's state, and the agent's connection for it; NULL with err set. */
static struct ct_xfer *ct_xfer_new(const struct ct_backend *be, dsec_sandbox *sb,
                                   dsec_file_done_fn done, void *ud, dsec_err *err)
{
    if (agent(be, sb, err) < 0)
        return NULL;
    struct ct_xfer *x = dsec_malloc(sizeof *x);
    if (x == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container: a file transfer in flight");
        return NULL;
    }
    *x = (struct ct_xfer){.be = be, .sb = sb, .done = done, .ud = ud};
    return x;
}

int dsec__ct_file_write_start(void *self, dsec_sandbox *sb, const char *path, const void *data,
                              size_t len, uint32_t mode, bool append, struct dsec_loop *loop,
                              dsec_file_done_fn done, void *ud, dsec_err *err)
{
    struct ct_xfer *x = ct_xfer_new(self, sb, done, ud, err);
    if (x == NULL)
        return -1;
    if (dsec_agent_file_write_start(sb->agent, loop, path, data, len, mode, append, ct_xfer_done, x,
                                    err) < 0) {
        dsec_free(x);
        return dsec_agent_broken(sb->agent) ? agent_failed(self, sb, err) : -1;
    }
    return 0;
}

int dsec__ct_file_read_start(void *self, dsec_sandbox *sb, const char *path, uint64_t offset,
                             uint64_t max, struct dsec_loop *loop, dsec_file_done_fn done, void *ud,
                             dsec_err *err)
{
    struct ct_xfer *x = ct_xfer_new(self, sb, done, ud, err);
    if (x == NULL)
        return -1;
    if (dsec_agent_file_read_start(sb->agent, loop, path, offset, max, ct_xfer_done, x, err) < 0) {
        dsec_free(x);
        return dsec_agent_broken(sb->agent) ? agent_failed(self, sb, err) : -1;
    }
    return 0;
}

int dsec__ct_file_write(void *self, dsec_sandbox *sb, const char *path, const void *data,
                        size_t len, uint32_t mode, bool append, dsec_err *err)
{
    const struct ct_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    /* the agent takes at most DSEC_AGENT_FILE_MAX per call: larger writes go in pieces */
    const uint8_t *p = data;
    size_t off = 0;
    do {
        size_t n = len - off > DSEC_AGENT_FILE_MAX ? DSEC_AGENT_FILE_MAX : len - off;
        if (dsec_agent_file_write(sb->agent, path, p + off, n, mode, append || off > 0, err) < 0)
            return agent_failed(be, sb, err);
        off += n;
    } while (off < len);
    return 0;
}

int dsec__ct_file_read(void *self, dsec_sandbox *sb, const char *path, uint64_t offset,
                       uint64_t max, dsec_file_data *out, dsec_err *err)
{
    const struct ct_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    /* the agent answers at most DSEC_AGENT_FILE_MAX a call: page until max or the end */
    memset(out, 0, sizeof *out);
    for (;;) {
        uint64_t want = max == 0 ? 0 : max - out->len;
        dsec_file_data part;
        if (dsec_agent_file_read(sb->agent, path, offset + out->len, want, &part, err) < 0) {
            dsec_free(out->data);
            memset(out, 0, sizeof *out);
            return agent_failed(be, sb, err);
        }
        int more = dsec_sbx_file_page(out, &part, max);
        if (more < 0)
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "container: reading %s: out of memory", path);
        if (more == 0)
            return 0;
    }
}

int dsec__ct_file_list(void *self, dsec_sandbox *sb, const char *path, dsec_file_entry **entries,
                       size_t *n, dsec_err *err)
{
    const struct ct_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    if (dsec_agent_file_list(sb->agent, path, entries, n, err) < 0)
        return agent_failed(be, sb, err);
    return 0;
}

int dsec__ct_file_op(void *self, dsec_sandbox *sb, const dsec_file_op *op, dsec_file_entry *st,
                     dsec_err *err)
{
    const struct ct_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    if (dsec_agent_file_op(sb->agent, op, st, err) < 0)
        return agent_failed(be, sb, err);
    return 0;
}

/* ---- background processes --------------------------------------------------------------- */

/* Each call once: a failure drops a lost connection (agent_failed) and is reported, never sent
 * again (a start or a stdin write may have reached the agent). */
#define CT_AGENT(be, sb, err, call)                                                                \
    do {                                                                                           \
        if (agent(be, sb, err) < 0)                                                                \
            return -1;                                                                             \
        if ((call) < 0)                                                                            \
            return agent_failed(be, sb, err);                                                      \
        return 0;                                                                                  \
    } while (0)

int dsec__ct_proc_start(void *self, dsec_sandbox *sb, const dsec_proc_start_req *req,
                        dsec_proc_info *out, dsec_err *err)
{
    CT_AGENT((const struct ct_backend *)self, sb, err,
             dsec_agent_proc_start(sb->agent, req, out, err));
}

/* The process calls but start go on a connection other than the sandbox's own (backend.h):
 * the node makes them beside a command or a transfer that holds that one (its side lane),
 * to interrupt a shell session's command or to read, feed and list processes meanwhile. */
static int side_connect(const struct ct_backend *be, dsec_sandbox *sb, const char *what,
                        dsec_agent **a, dsec_err *err)
{
    *a = NULL;
    struct ct_agent_probe pr;
    dsec__ct_agent_probe(be, sb->rid, &pr);
    if (pr.init == 0 || pr.state == 'Z' || pr.state == 'X')
        return dsec_err_set(err, DSEC_E_CONN, 0,
                            "container %s: no agent for %s (no init in its container)", sb->rid,
                            what);
    char sp[PATH_MAX + 16];
    dsec__ct_sock_path(sb, sp, sizeof sp);
    if (dsec_agent_connect(a, sp, 1000, err) < 0)
        return dsec_err_wrap(err, "container %s: %s", sb->rid, what);
    return 0;
}

/* The side lane's connection, kept from call to call (a keystroke need not pay a connect), for
 * every process call but start: on a work thread or on the loop. A call takes it, or opens one
 * of its own while another call holds it (a signal beside a waiting stdin write), and gives it
 * back at its end. The slot is shared by the sandbox's record and the calls in flight, each
 * holding a reference: it outlives a record freed while a call still waits (that call's
 * connection is then closed at its end, not kept). */
struct ct_keep {
    pthread_mutex_t mu;
    int refs;    /* the record's, and each call's in flight */
    bool closed; /* the record let go: keep nothing more */
    dsec_agent *idle;
};

static void keep_unref(struct ct_keep *k)
{
    pthread_mutex_lock(&k->mu);
    bool last = --k->refs == 0;
    pthread_mutex_unlock(&k->mu);
    if (last) {
        dsec_agent_free(k->idle);
        pthread_mutex_destroy(&k->mu);
        dsec_free(k);
    }
}

void dsec__ct_keep_close(dsec_sandbox *sb)
{
    struct ct_keep *k = sb->keep;
    if (k == NULL)
        return;
    sb->keep = NULL;
    pthread_mutex_lock(&k->mu);
    k->closed = true;
    dsec_agent *a = k->idle;
    k->idle = NULL;
    pthread_mutex_unlock(&k->mu);
    dsec_agent_free(a);
    keep_unref(k);
}

/* The kept connection (or a new one) for a call (what), which holds a reference to *kp until
 * keep_give. */
static int keep_take(const struct ct_backend *be, dsec_sandbox *sb, const char *what,
                     dsec_agent **a, struct ct_keep **kp, dsec_err *err)
{
    /* made by the first call; a call on the sandbox's own lane may race one on its side lane */
    static pthread_mutex_t make_mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&make_mu);
    struct ct_keep *k = sb->keep;
    if (k == NULL && (k = dsec_calloc(1, sizeof *k)) != NULL) {
        pthread_mutex_init(&k->mu, NULL);
        k->refs = 1;
        sb->keep = k;
    }
    pthread_mutex_unlock(&make_mu);
    if (k == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container %s: %s", sb->rid, what);
    pthread_mutex_lock(&k->mu);
    *a = k->idle;
    k->idle = NULL;
    pthread_mutex_unlock(&k->mu);
    if (*a != NULL && dsec_agent_broken(*a)) {
        dsec_agent_free(*a);
        *a = NULL;
    }
    if (*a == NULL && side_connect(be, sb, what, a, err) < 0)
        return -1;
    pthread_mutex_lock(&k->mu);
    k->refs++;
    pthread_mutex_unlock(&k->mu);
    *kp = k;
    return 0;
}

/* A call ended: its connection is kept for the next one, unless broken, another is kept
 * already, or the record is gone. */
static void keep_give(struct ct_keep *k, dsec_agent *a)
{
    pthread_mutex_lock(&k->mu);
    if (!k->closed && k->idle == NULL && !dsec_agent_broken(a)) {
        k->idle = a;
        a = NULL;
    }
    pthread_mutex_unlock(&k->mu);
    dsec_agent_free(a);
    keep_unref(k);
}

#define CT_SIDE(be, sb, what, err, call)                                                           \
    do {                                                                                           \
        dsec_agent *a;                                                                             \
        struct ct_keep *k;                                                                         \
        if (keep_take((be), (sb), (what), &a, &k, (err)) < 0)                                      \
            return -1;                                                                             \
        int rc_ = (call);                                                                          \
        keep_give(k, a);                                                                           \
        return rc_;                                                                                \
    } while (0)

int dsec__ct_proc_list(void *self, dsec_sandbox *sb, dsec_proc_info **out, size_t *n, dsec_err *err)
{
    CT_SIDE((const struct ct_backend *)self, sb, "listing processes", err,
            dsec_agent_proc_list(a, out, n, err));
}

int dsec__ct_proc_signal(void *self, dsec_sandbox *sb, uint64_t handle, int sig, dsec_err *err)
{
    CT_SIDE((const struct ct_backend *)self, sb, "signalling a process", err,
            dsec_agent_proc_signal(a, handle, sig, err));
}

int dsec__ct_proc_stdin(void *self, dsec_sandbox *sb, uint64_t handle, const void *data, size_t len,
                        bool close, dsec_err *err)
{
    CT_SIDE((const struct ct_backend *)self, sb, "writing a process's stdin", err,
            dsec_agent_proc_stdin(a, handle, data, len, close, err));
}

int dsec__ct_proc_output(void *self, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                         uint64_t err_off, uint64_t max, dsec_proc_output *out, dsec_err *err)
{
    CT_SIDE((const struct ct_backend *)self, sb, "reading a process's output", err,
            dsec_agent_proc_output(a, handle, out_off, err_off, max, out, err));
}

int dsec__ct_proc_resize(void *self, dsec_sandbox *sb, uint64_t handle, uint16_t rows,
                         uint16_t cols, dsec_err *err)
{
    CT_SIDE((const struct ct_backend *)self, sb, "resizing a terminal", err,
            dsec_agent_proc_resize(a, handle, rows, cols, err));
}

/* A side-lane call on the loop (a stdin write, a waiting output read): the kept slot's
 * connection it holds, and whom to tell at its end. Destroyed meanwhile, the sandbox's agent
 * goes and the connection with it, which ends the call with an error. */
struct ct_loop_call {
    struct ct_keep *keep;
    dsec_agent *a;
    dsec_proc_done_fn done;            /* a stdin write's */
    dsec_proc_output_done_fn out_done; /* a waiting read's */
    void *ud;
};

static struct ct_loop_call *loop_call_new(const struct ct_backend *be, dsec_sandbox *sb,
                                          const char *what, void *ud, dsec_err *err)
{
    struct ct_loop_call *c = dsec_calloc(1, sizeof *c);
    if (c == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container %s: %s", sb->rid, what);
        return NULL;
    }
    if (keep_take(be, sb, what, &c->a, &c->keep, err) < 0) {
        dsec_free(c);
        return NULL;
    }
    c->ud = ud;
    return c;
}

/* It could not be sent (its done is never called): -1. */
static int loop_call_unsent(struct ct_loop_call *c)
{
    keep_give(c->keep, c->a);
    dsec_free(c);
    return -1;
}

static struct ct_loop_call loop_call_end(void *ud)
{
    struct ct_loop_call c = *(struct ct_loop_call *)ud;
    dsec_free(ud);
    return c;
}

static void ct_stdin_done(void *ud, int rc, dsec_err *err)
{
    struct ct_loop_call c = loop_call_end(ud);
    c.done(c.ud, rc, err);
    keep_give(c.keep, c.a);
}

static void ct_follow_done(void *ud, int rc, dsec_proc_output *out, dsec_err *err)
{
    struct ct_loop_call c = loop_call_end(ud);
    c.out_done(c.ud, rc, out, err);
    keep_give(c.keep, c.a);
}

int dsec__ct_proc_stdin_start(void *self, dsec_sandbox *sb, uint64_t handle, const void *data,
                              size_t len, bool close, struct dsec_loop *loop,
                              dsec_proc_done_fn done, void *ud, dsec_err *err)
{
    struct ct_loop_call *c = loop_call_new(self, sb, "writing a process's stdin", ud, err);
    if (c == NULL)
        return -1;
    c->done = done;
    if (dsec_agent_proc_stdin_start(c->a, loop, handle, data, len, close, 0, ct_stdin_done, c,
                                    err) < 0)
        return loop_call_unsent(c);
    return 0;
}

int dsec__ct_proc_follow_start(void *self, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                               uint64_t err_off, uint64_t max, uint32_t wait_ms,
                               struct dsec_loop *loop, dsec_proc_output_done_fn done, void *ud,
                               dsec_err *err)
{
    /* on the loop's thread: a dead agent is told at once, not after a connect's retries */
    struct ct_loop_call *c = loop_call_new(self, sb, "following a process", ud, err);
    if (c == NULL)
        return -1;
    c->out_done = done;
    if (dsec_agent_proc_output_start(c->a, loop, handle, out_off, err_off, max, wait_ms,
                                     ct_follow_done, c, err) < 0)
        return loop_call_unsent(c);
    return 0;
}
