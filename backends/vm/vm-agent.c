/* vm-agent.c - a VM's agent: its connection, and the exec, file and process calls made through
 * it (a call on a connection that broke is tried once more on a fresh one when that is safe). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backends/loop.h"
#include "backends/vm/vm-int.h"
#include "dsec/alloc.h"

static int oom(const struct vm_backend *be, dsec_err *err, const char *what)
{
    return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: %s", be->type, what);
}

static int agent(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    if (sb->paused)
        return dsec_err_set(err, DSEC_E_STATE, 0, "%s: the sandbox is paused (resume it first)",
                            be->type);
    if (sb->agent != NULL)
        return 0;
    return dsec__vm_agent_dial(be, sb, 20000, err);
}

/* After a failed agent call, a lost connection is dropped so the next call reconnects. */
static int agent_failed(dsec_sandbox *sb, dsec_err *err)
{
    if (sb->agent != NULL && dsec_agent_broken(sb->agent)) {
        dsec_agent_free(sb->agent);
        sb->agent = NULL;
    }
    return -1;
}

/* A call through the agent, retried once on a fresh connection when the old one broke. */
#define AGENT_CALL(be, sb, err, call)                                                              \
    do {                                                                                           \
        for (int try_ = 0;; try_++) {                                                              \
            if (agent(be, sb, err) < 0)                                                            \
                return -1;                                                                         \
            if ((call) == 0)                                                                       \
                break;                                                                             \
            bool broken_ = dsec_agent_broken(sb->agent);                                           \
            agent_failed(sb, err);                                                                 \
            if (!broken_ || try_ > 0 || (err)->code == DSEC_E_TIMEOUT)                             \
                return -1;                                                                         \
        }                                                                                          \
    } while (0)

int dsec__vm_exec(void *self, dsec_sandbox *sb, const dsec_exec_req *req, dsec_exec_result *res,
                  dsec_err *err)
{
    struct vm_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    /* not retried: the command may have run */
    if (dsec_agent_exec(sb->agent, req, req->on_output, req->on_output_arg, res, err) < 0)
        return agent_failed(sb, err);
    return 0;
}

struct vm_run {
    dsec_sandbox *sb;
    dsec_exec_done_fn done;
    void *ud;
};

static void vm_exec_done(void *ud, int rc, dsec_exec_result *res, dsec_err *err)
{
    struct vm_run r = *(struct vm_run *)ud;
    dsec_free(ud);
    if (rc < 0)
        agent_failed(r.sb, err);
    r.done(r.ud, rc, res, err);
}

size_t dsec__vm_default_cmd(void *self, dsec_sandbox *sb, const char *const **argv)
{
    (void)self;
    *argv = (const char *const *)sb->env.base.cmd;
    return sb->env.base.ncmd;
}

int dsec__vm_exec_start(void *self, dsec_sandbox *sb, const dsec_exec_req *req,
                        struct dsec_loop *loop, dsec_exec_done_fn done, void *ud, dsec_err *err)
{
    struct vm_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    struct vm_run *r = dsec_malloc(sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: a command in flight", be->type);
    *r = (struct vm_run){.sb = sb, .done = done, .ud = ud};
    /* not retried: the command may have run */
    if (dsec_agent_exec_start(sb->agent, loop, req, req->on_output, req->on_output_arg,
                              vm_exec_done, r, err) < 0) {
        dsec_free(r);
        return agent_failed(sb, err);
    }
    return 0;
}

/* A file transfer in flight: a lost connection is dropped when it ends (the next call
 * re-dials). Not retried on the loop: a dial may wait up to 20 s. */
struct vm_xfer {
    dsec_sandbox *sb;
    dsec_file_done_fn done;
    void *ud;
};

static void vm_xfer_done(void *ud, int rc, dsec_file_data *data, dsec_err *err)
{
    struct vm_xfer x = *(struct vm_xfer *)ud;
    dsec_free(ud);
    if (rc < 0)
        agent_failed(x.sb, err);
    x.done(x.ud, rc, data, err);
}

static struct vm_xfer *vm_xfer_new(struct vm_backend *be, dsec_sandbox *sb, dsec_file_done_fn done,
                                   void *ud, dsec_err *err)
{
    if (agent(be, sb, err) < 0)
        return NULL;
    struct vm_xfer *x = dsec_malloc(sizeof *x);
    if (x == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: a file transfer in flight", be->type);
        return NULL;
    }
    *x = (struct vm_xfer){.sb = sb, .done = done, .ud = ud};
    return x;
}

int dsec__vm_file_write_start(void *self, dsec_sandbox *sb, const char *path, const void *data,
                              size_t len, uint32_t mode, bool append, struct dsec_loop *loop,
                              dsec_file_done_fn done, void *ud, dsec_err *err)
{
    struct vm_xfer *x = vm_xfer_new(self, sb, done, ud, err);
    if (x == NULL)
        return -1;
    if (dsec_agent_file_write_start(sb->agent, loop, path, data, len, mode, append, vm_xfer_done, x,
                                    err) < 0) {
        dsec_free(x);
        return agent_failed(sb, err);
    }
    return 0;
}

int dsec__vm_file_read_start(void *self, dsec_sandbox *sb, const char *path, uint64_t offset,
                             uint64_t max, struct dsec_loop *loop, dsec_file_done_fn done, void *ud,
                             dsec_err *err)
{
    struct vm_xfer *x = vm_xfer_new(self, sb, done, ud, err);
    if (x == NULL)
        return -1;
    if (dsec_agent_file_read_start(sb->agent, loop, path, offset, max, vm_xfer_done, x, err) < 0) {
        dsec_free(x);
        return agent_failed(sb, err);
    }
    return 0;
}

int dsec__vm_file_write(void *self, dsec_sandbox *sb, const char *path, const void *data,
                        size_t len, uint32_t mode, bool append, dsec_err *err)
{
    struct vm_backend *be = self;
    const uint8_t *p = data;
    size_t off = 0;
    do {
        size_t n = len - off > DSEC_AGENT_FILE_MAX ? DSEC_AGENT_FILE_MAX : len - off;
        AGENT_CALL(
            be, sb, err,
            dsec_agent_file_write(sb->agent, path, p + off, n, mode, append || off > 0, err));
        off += n;
    } while (off < len);
    return 0;
}

int dsec__vm_file_read(void *self, dsec_sandbox *sb, const char *path, uint64_t offset,
                       uint64_t max, dsec_file_data *out, dsec_err *err)
{
    struct vm_backend *be = self;
    memset(out, 0, sizeof *out);
    for (;;) {
        uint64_t want = max == 0 ? 0 : max - out->len;
        dsec_file_data part = {0};
        int rc = 0;
        for (int attempt = 0;; attempt++) {
            if ((rc = agent(be, sb, err)) < 0)
                break;
            if ((rc = dsec_agent_file_read(sb->agent, path, offset + out->len, want, &part, err)) ==
                0)
                break;
            bool broken = dsec_agent_broken(sb->agent);
            agent_failed(sb, err);
            if (!broken || attempt > 0)
                break;
        }
        if (rc < 0) {
            dsec_free(out->data);
            memset(out, 0, sizeof *out);
            return -1;
        }
        int more = dsec_sbx_file_page(out, &part, max);
        if (more < 0)
            return oom(be, err, "file data");
        if (more == 0)
            return 0;
    }
}

int dsec__vm_file_list(void *self, dsec_sandbox *sb, const char *path, dsec_file_entry **entries,
                       size_t *n, dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_CALL(be, sb, err, dsec_agent_file_list(sb->agent, path, entries, n, err));
    return 0;
}

int dsec__vm_file_op(void *self, dsec_sandbox *sb, const dsec_file_op *op, dsec_file_entry *st,
                     dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_CALL(be, sb, err, dsec_agent_file_op(sb->agent, op, st, err));
    return 0;
}

/* ---- background processes ------------------------------------------------------------------ */

/* A start is not sent again on a fresh connection (the first may have reached the agent: a
 * process would start twice). */
#define AGENT_ONCE(be, sb, err, call)                                                              \
    do {                                                                                           \
        if (agent(be, sb, err) < 0)                                                                \
            return -1;                                                                             \
        if ((call) < 0)                                                                            \
            return agent_failed(sb, err);                                                          \
    } while (0)

int dsec__vm_proc_start(void *self, dsec_sandbox *sb, const dsec_proc_start_req *req,
                        dsec_proc_info *out, dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_ONCE(be, sb, err, dsec_agent_proc_start(sb->agent, req, out, err));
    return 0;
}

/*
 * The other process calls go on the guest's second channel, ctl.sock, multiplexed on the
 * node's loop (dsec_agent_mux_on): beside a command running on agent.sock (a signal that
 * interrupts a shell session's command) and beside one another (a stdin write the process has
 * not read yet, an output read that waits). The connection is shared by the sandbox's record
 * and the calls in flight, each holding a reference; it goes with the last. Without the node's
 * loop (a backend opened alone) they go on agent.sock as before.
 */
struct vm_side {
    _Atomic int refs;
    dsec_agent *a;
    dsec_loop *loop;
};

static pthread_mutex_t side_mu = PTHREAD_MUTEX_INITIALIZER; /* guards every sb->side */
static pthread_cond_t side_cv = PTHREAD_COND_INITIALIZER;   /* a sandbox's dial ended */

static void side_free(struct vm_side *c)
{
    dsec_agent_free(c->a);
    dsec_free(c);
}

static void side_free_posted(dsec_loop_watch *w, unsigned events, void *ud)
{
    (void)w;
    (void)events;
    side_free(ud);
}

/* A holder let go; the last frees it, after the loop's callback that let go (the connection's
 * own code is still running below it). */
static void side_unref(struct vm_side *c)
{
    if (c == NULL || atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    dsec_err err;
    if (!dsec_loop_is_current(c->loop) || dsec_loop_post(c->loop, side_free_posted, c, &err) < 0)
        side_free(c);
}

void dsec__vm_side_drop(dsec_sandbox *sb)
{
    pthread_mutex_lock(&side_mu);
    struct vm_side *c = sb->side;
    sb->side = NULL;
    pthread_mutex_unlock(&side_mu);
    side_unref(c);
}

/* A dial that failed ended: the calls waiting for it may dial themselves. */
static struct vm_side *side_dialed(dsec_sandbox *sb, struct vm_side *c)
{
    pthread_mutex_lock(&side_mu);
    sb->side_dialing = false;
    pthread_cond_broadcast(&side_cv);
    pthread_mutex_unlock(&side_mu);
    return c;
}

/* The side connection for a call (what), a reference the caller gives back with side_unref:
 * the one kept, or a new one when there is none or it broke. */
static struct vm_side *side_take(struct vm_backend *be, dsec_sandbox *sb, const char *what,
                                 dsec_err *err)
{
    if (sb->paused) {
        dsec_err_set(err, DSEC_E_STATE, 0, "%s: the sandbox is paused (resume it first)", be->type);
        return NULL;
    }
    pthread_mutex_lock(&side_mu);
    /* One dial at a time per sandbox: the guest's agent serves one connection on ctl.sock, so
     * a second dial beside the first would wait out its timeout and fail. The calls that came
     * meanwhile take the connection the first one made. */
    while (sb->side_dialing && !dsec_loop_is_current(be->loop))
        pthread_cond_wait(&side_cv, &side_mu);
    struct vm_side *c = sb->side, *old = NULL;
    if (c != NULL && dsec_agent_broken(c->a)) {
        old = c;
        c = sb->side = NULL;
    }
    if (c != NULL)
        atomic_fetch_add(&c->refs, 1);
    else
        sb->side_dialing = true;
    pthread_mutex_unlock(&side_mu);
    side_unref(old);
    if (c != NULL)
        return c;
    char sp[PATH_MAX + 16];
    dsec__vm_fmt(sp, sizeof sp, "%s/ctl.sock", sb->dir);
    struct vm_side *n = dsec_calloc(1, sizeof *n);
    if (n == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: %s", be->type, what);
        return side_dialed(sb, NULL);
    }
    n->loop = be->loop;
    atomic_store(&n->refs, 2); /* the record's and the caller's */
    if (dsec_agent_connect(&n->a, sp, 2000, err) < 0 ||
        dsec_agent_mux_on(n->a, be->loop, err) < 0) {
        dsec_agent_free(n->a);
        dsec_free(n);
        dsec_err_wrap(err, "%s: the guest's second channel, for %s", be->type, what);
        return side_dialed(sb, NULL);
    }
    pthread_mutex_lock(&side_mu);
    sb->side_dialing = false;
    pthread_cond_broadcast(&side_cv);
    if (sb->side == NULL) {
        sb->side = n;
        n = NULL;
        c = sb->side;
    } else { /* another call made one meanwhile */
        c = sb->side;
        atomic_fetch_add(&c->refs, 1);
    }
    pthread_mutex_unlock(&side_mu);
    if (n != NULL)
        side_free(n);
    return c;
}

/* call on the side connection (a), or on agent.sock without the node's loop, there with
 * main_call: AGENT_CALL (list, output, resize: asked again on a fresh connection) or AGENT_ONCE
 * (a signal or a stdin write must not be done twice). The side connection is not dialled
 * again for a call: its next call dials. */
#define VM_SIDE(be, sb, what, err, call, main_call)                                                \
    do {                                                                                           \
        if ((be)->loop == NULL) {                                                                  \
            dsec_agent *a;                                                                         \
            main_call(be, sb, err, (a = (sb)->agent, call));                                       \
            return 0;                                                                              \
        }                                                                                          \
        struct vm_side *c_ = side_take((be), (sb), (what), (err));                                 \
        if (c_ == NULL)                                                                            \
            return -1;                                                                             \
        dsec_agent *a = c_->a;                                                                     \
        int rc_ = (call);                                                                          \
        side_unref(c_);                                                                            \
        return rc_;                                                                                \
    } while (0)

int dsec__vm_proc_list(void *self, dsec_sandbox *sb, dsec_proc_info **out, size_t *n, dsec_err *err)
{
    VM_SIDE((struct vm_backend *)self, sb, "listing processes", err,
            dsec_agent_proc_list(a, out, n, err), AGENT_CALL);
}

int dsec__vm_proc_signal(void *self, dsec_sandbox *sb, uint64_t handle, int sig, dsec_err *err)
{
    VM_SIDE((struct vm_backend *)self, sb, "signalling a process", err,
            dsec_agent_proc_signal(a, handle, sig, err), AGENT_ONCE);
}

int dsec__vm_proc_stdin(void *self, dsec_sandbox *sb, uint64_t handle, const void *data, size_t len,
                        bool close, dsec_err *err)
{
    VM_SIDE((struct vm_backend *)self, sb, "writing a process's stdin", err,
            dsec_agent_proc_stdin(a, handle, data, len, close, err), AGENT_ONCE);
}

/* A resize sets the window whatever it was. */
int dsec__vm_proc_resize(void *self, dsec_sandbox *sb, uint64_t handle, uint16_t rows,
                         uint16_t cols, dsec_err *err)
{
    VM_SIDE((struct vm_backend *)self, sb, "resizing a terminal", err,
            dsec_agent_proc_resize(a, handle, rows, cols, err), AGENT_CALL);
}

int dsec__vm_proc_output(void *self, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                         uint64_t err_off, uint64_t max, dsec_proc_output *out, dsec_err *err)
{
    VM_SIDE((struct vm_backend *)self, sb, "reading a process's output", err,
            dsec_agent_proc_output(a, handle, out_off, err_off, max, out, err), AGENT_CALL);
}

/* A waiting call on the side connection: the reference it holds, and whom to tell. */
struct vm_wait {
    struct vm_side *c;
    dsec_proc_done_fn done;
    dsec_proc_output_done_fn out_done;
    void *ud;
};

static struct vm_wait *wait_new(struct vm_backend *be, dsec_sandbox *sb, const char *what, void *ud,
                                dsec_err *err)
{
    if (be->loop == NULL) {
        dsec_err_set(err, DSEC_E_UNSUPPORTED, 0, "%s: %s that waits needs the node's loop",
                     be->type, what);
        return NULL;
    }
    struct vm_wait *w = dsec_calloc(1, sizeof *w);
    if (w == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: %s", be->type, what);
        return NULL;
    }
    if ((w->c = side_take(be, sb, what, err)) == NULL) {
        dsec_free(w);
        return NULL;
    }
    w->ud = ud;
    return w;
}

static int wait_unsent(struct vm_wait *w)
{
    side_unref(w->c);
    dsec_free(w);
    return -1;
}

static void vm_stdin_done(void *ud, int rc, dsec_err *err)
{
    struct vm_wait w = *(struct vm_wait *)ud;
    dsec_free(ud);
    w.done(w.ud, rc, err);
    side_unref(w.c);
}

static void vm_follow_done(void *ud, int rc, dsec_proc_output *out, dsec_err *err)
{
    struct vm_wait w = *(struct vm_wait *)ud;
    dsec_free(ud);
    w.out_done(w.ud, rc, out, err);
    side_unref(w.c);
}

int dsec__vm_proc_stdin_start(void *self, dsec_sandbox *sb, uint64_t handle, const void *data,
                              size_t len, bool close, struct dsec_loop *loop,
                              dsec_proc_done_fn done, void *ud, dsec_err *err)
{
    (void)loop; /* the connection's: the node's */
    struct vm_wait *w = wait_new(self, sb, "writing a process's stdin", ud, err);
    if (w == NULL)
        return -1;
    w->done = done;
    if (dsec_agent_proc_stdin_start(w->c->a, w->c->loop, handle, data, len, close, 0, vm_stdin_done,
                                    w, err) < 0)
        return wait_unsent(w);
    return 0;
}

int dsec__vm_proc_follow_start(void *self, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                               uint64_t err_off, uint64_t max, uint32_t wait_ms,
                               struct dsec_loop *loop, dsec_proc_output_done_fn done, void *ud,
                               dsec_err *err)
{
    (void)loop;
    struct vm_wait *w = wait_new(self, sb, "following a process", ud, err);
    if (w == NULL)
        return -1;
    w->out_done = done;
    if (dsec_agent_proc_output_start(w->c->a, w->c->loop, handle, out_off, err_off, max, wait_ms,
                                     vm_follow_done, w, err) < 0)
        return wait_unsent(w);
    return 0;
}
