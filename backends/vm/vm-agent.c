/* vm-agent.c - a VM's agent: its connection, and the exec, file and process calls made through
 * it (a call on a connection that broke is tried once more on a fresh one when that is safe). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>

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

/* A start or a stdin write is not sent again on a fresh connection (the first may have reached
 * the agent: a process would start twice); a signal neither (a second SIGTERM is not the
 * first's). list and output are asked again, as the file calls are. */
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

int dsec__vm_proc_list(void *self, dsec_sandbox *sb, dsec_proc_info **out, size_t *n, dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_CALL(be, sb, err, dsec_agent_proc_list(sb->agent, out, n, err));
    return 0;
}

int dsec__vm_proc_signal(void *self, dsec_sandbox *sb, uint64_t handle, int sig, dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_ONCE(be, sb, err, dsec_agent_proc_signal(sb->agent, handle, sig, err));
    return 0;
}

int dsec__vm_proc_stdin(void *self, dsec_sandbox *sb, uint64_t handle, const void *data, size_t len,
                        bool close, dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_ONCE(be, sb, err, dsec_agent_proc_stdin(sb->agent, handle, data, len, close, err));
    return 0;
}

/* A resize sets the window whatever it was: sent again after a lost channel, it does no harm.
 * (No proc_follow_start: the guest has one channel, which a waiting request would hold.) */
int dsec__vm_proc_resize(void *self, dsec_sandbox *sb, uint64_t handle, uint16_t rows,
                         uint16_t cols, dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_CALL(be, sb, err, dsec_agent_proc_resize(sb->agent, handle, rows, cols, err));
    return 0;
}

int dsec__vm_proc_output(void *self, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                         uint64_t err_off, uint64_t max, dsec_proc_output *out, dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_CALL(be, sb, err,
               dsec_agent_proc_output(sb->agent, handle, out_off, err_off, max, out, err));
    return 0;
}
