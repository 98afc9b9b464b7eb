/* backend.c - backend instances and the wrappers that check arguments once for all backends. */
#include "backends/backend.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "backends/layers/layer-cache.h"
#include "backends/loop.h"
#include "dsec/alloc.h"

struct dsec_backend {
    const dsec_backend_ops *ops;
    void *self;
    struct dsec_loop *loop;
    bool own_loop;
};

void dsec_exec_result_release(dsec_exec_result *r)
{
    if (r == NULL)
        return;
    dsec_free(r->stdout_data);
    dsec_free(r->stderr_data);
    memset(r, 0, sizeof *r);
}

const char *dsec_file_kind_name(dsec_file_kind k)
{
    switch (k) {
    case DSEC_FILE_REG:
        return "file";
    case DSEC_FILE_DIR:
        return "dir";
    case DSEC_FILE_LINK:
        return "link";
    default:
        return "other";
    }
}

void dsec_proc_output_release(dsec_proc_output *o)
{
    if (o == NULL)
        return;
    dsec_free(o->out);
    dsec_free(o->err);
    o->out = o->err = NULL;
    o->out_len = o->err_len = 0;
}

void dsec_file_entries_free(dsec_file_entry *entries, size_t n)
{
    if (entries == NULL)
        return;
    for (size_t i = 0; i < n; i++)
        dsec_free(entries[i].name);
    dsec_free(entries);
}

int dsec_backend_new(dsec_backend **out, const dsec_backend_ops *ops,
                     const dsec_backend_config *cfg, dsec_err *err)
{
    if (ops == NULL || ops->init == NULL || ops->fini == NULL || ops->create == NULL ||
        ops->destroy == NULL || ops->detach == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "backend type \"%s\" lacks init, fini, create, destroy or detach",
                            ops && ops->type ? ops->type : "(null)");
    static const dsec_backend_config empty = {0};
    dsec_backend *be = dsec_calloc(1, sizeof *be);
    if (be == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "opening backend \"%s\"", ops->type);
    be->ops = ops;
    be->loop = cfg ? cfg->loop : NULL;
    if (be->loop == NULL && ops->exec_start != NULL) {
        if (dsec_loop_new(&be->loop, ops->type, err) < 0) {
            dsec_err_wrap(err, "opening backend \"%s\"", ops->type);
            goto out_free;
        }
        be->own_loop = true;
    }
    /* the backend sees the loop its commands complete on, its own or the node's */
    dsec_backend_config with_loop = cfg ? *cfg : empty;
    with_loop.loop = be->loop;
    if (ops->init(&be->self, &with_loop, err) < 0) {
        dsec_err_wrap(err, "opening backend \"%s\"", ops->type);
        goto out_loop;
    }
    *out = be;
    return 0;

out_loop:
    if (be->own_loop)
        dsec_loop_free(be->loop);
out_free:
    dsec_free(be);
    return -1;
}

void dsec_backend_free(dsec_backend *be)
{
    if (be == NULL)
        return;
    /* commands still running hear DSEC_LOOP_CANCEL before the instance goes */
    if (be->own_loop)
        dsec_loop_free(be->loop);
    be->ops->fini(be->self);
    dsec_free(be);
}

const char *dsec_backend_type(const dsec_backend *be)
{
    return be->ops->type;
}

static int unsupported(const dsec_backend *be, const char *op, dsec_err *err)
{
    return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0, "sandbox type \"%s\" does not support %s",
                        be->ops->type, op);
}

static int no_sandbox(const char *op, dsec_err *err)
{
    return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: no sandbox handle", op);
}

int dsec_backend_create(dsec_backend *be, const dsec_sandbox_spec *spec, dsec_sandbox **out,
                        char **backend_state, dsec_err *err)
{
    if (spec == NULL || out == NULL || backend_state == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "create: missing spec or out parameter");
    *out = NULL;
    *backend_state = NULL;
    return be->ops->create(be->self, spec, out, backend_state, err);
}

bool dsec_backend_creates_async(const dsec_backend *be)
{
    return be->ops->create_start != NULL;
}

int dsec_backend_create_start(dsec_backend *be, const dsec_sandbox_spec *spec,
                              struct dsec_loop *loop, dsec_ready_fn done, void *ud,
                              dsec_sandbox **out, char **backend_state, dsec_err *err)
{
    if (be->ops->create_start == NULL)
        return unsupported(be, "create_start", err);
    if (spec == NULL || out == NULL || backend_state == NULL || loop == NULL || done == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "create_start: missing spec, loop, done or out parameter");
    *out = NULL;
    *backend_state = NULL;
    return be->ops->create_start(be->self, spec, loop, done, ud, out, backend_state, err);
}

static int check_exec(dsec_backend *be, dsec_sandbox *sb, const dsec_exec_req *req, dsec_err *err)
{
    if (be->ops->exec == NULL && be->ops->exec_start == NULL)
        return unsupported(be, "exec", err);
    if (sb == NULL)
        return no_sandbox("exec", err);
    if (req == NULL || (req->argc > 0 && (req->argv == NULL || req->argv[0] == NULL)))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: argv must hold at least a command");
    if (req->session == 0)
        return 0;
    if (be->ops->proc_start == NULL)
        return unsupported(be, "shell sessions", err);
    if (req->argc != 1)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "exec: a session command is one shell command line, not %zu "
                            "arguments",
                            req->argc);
    if (req->nenv > 0 || req->cwd != NULL || req->user != NULL || req->stdin_len > 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "exec: a session command takes no %s: it runs in the session's "
                            "shell (use cd and export there)",
                            req->nenv > 0       ? "environment variables"
                            : req->cwd != NULL  ? "cwd"
                            : req->user != NULL ? "user"
                                                : "stdin");
    return 0;
}

/* req, or *copy with the sandbox's default command when req names none; -1 with err when
 * the sandbox has none. */
static const dsec_exec_req *with_default_cmd(dsec_backend *be, dsec_sandbox *sb,
                                             const dsec_exec_req *req, dsec_exec_req *copy,
                                             dsec_err *err)
{
    if (req->argc > 0)
        return req;
    const char *const *argv = NULL;
    size_t argc = be->ops->default_cmd != NULL ? be->ops->default_cmd(be->self, sb, &argv) : 0;
    if (argc == 0) {
        dsec_err_set(err, DSEC_E_INVALID, 0,
                     "exec: no command named, and the sandbox's environment has no default "
                     "command (an image's Entrypoint or Cmd): name the command to run");
        return NULL;
    }
    *copy = *req;
    copy->argv = argv;
    copy->argc = argc;
    return copy;
}

/* A synchronous exec over exec_start: the caller's thread waits for done. */
struct exec_wait {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    int rc;
    dsec_exec_result *res;
    dsec_err *err;
};

static void exec_waited(void *ud, int rc, dsec_exec_result *res, dsec_err *err)
{
    struct exec_wait *w = ud;
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    if (rc == 0)
        *w->res = *res; /* the buffers pass to the waiting caller */
    else if (w->err != NULL)
        *w->err = *err;
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

int dsec_backend_exec(dsec_backend *be, dsec_sandbox *sb, const dsec_exec_req *req,
                      dsec_exec_result *res, dsec_err *err)
{
    dsec_exec_req copy;
    if (check_exec(be, sb, req, err) < 0 ||
        (req = with_default_cmd(be, sb, req, &copy, err)) == NULL)
        return -1;
    if (res == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: no result");
    memset(res, 0, sizeof *res);
    if (be->ops->exec != NULL)
        return be->ops->exec(be->self, sb, req, res, err);
    struct exec_wait w = {.res = res, .err = err};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cond, NULL);
    int rc = be->ops->exec_start(be->self, sb, req, be->loop, exec_waited, &w, err);
    if (rc == 0) {
        pthread_mutex_lock(&w.mu);
        while (!w.done)
            pthread_cond_wait(&w.cond, &w.mu);
        pthread_mutex_unlock(&w.mu);
        rc = w.rc;
    }
    pthread_cond_destroy(&w.cond);
    pthread_mutex_destroy(&w.mu);
    return rc;
}

bool dsec_backend_instant(const dsec_backend *be)
{
    return be->ops->instant != NULL && be->ops->instant(be->self);
}

bool dsec_backend_exec_async(const dsec_backend *be)
{
    return be->ops->exec_start != NULL && be->loop != NULL;
}

int dsec_backend_exec_start(dsec_backend *be, dsec_sandbox *sb, const dsec_exec_req *req,
                            dsec_exec_done_fn done, void *ud, dsec_err *err)
{
    dsec_exec_req copy;
    if (check_exec(be, sb, req, err) < 0 ||
        (req = with_default_cmd(be, sb, req, &copy, err)) == NULL)
        return -1;
    if (!dsec_backend_exec_async(be))
        return unsupported(be, "starting a command without waiting for it", err);
    if (done == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "exec: no completion callback");
    return be->ops->exec_start(be->self, sb, req, be->loop, done, ud, err);
}

int dsec_backend_file_write(dsec_backend *be, dsec_sandbox *sb, const char *path, const void *data,
                            size_t len, uint32_t mode, bool append, dsec_err *err)
{
    if (be->ops->file_write == NULL)
        return unsupported(be, "file writes", err);
    if (sb == NULL)
        return no_sandbox("file_write", err);
    if (path == NULL || (data == NULL && len > 0))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "file_write: missing path or data");
    return be->ops->file_write(be->self, sb, path, data, len, mode, append, err);
}

int dsec_backend_file_read(dsec_backend *be, dsec_sandbox *sb, const char *path, uint64_t offset,
                           uint64_t max, dsec_file_data *out, dsec_err *err)
{
    if (be->ops->file_read == NULL)
        return unsupported(be, "file reads", err);
    if (sb == NULL)
        return no_sandbox("file_read", err);
    if (path == NULL || out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "file_read: missing path or out parameter");
    memset(out, 0, sizeof *out);
    return be->ops->file_read(be->self, sb, path, offset, max, out, err);
}

bool dsec_backend_files_async(const dsec_backend *be)
{
    return be->ops->file_write_start != NULL && be->ops->file_read_start != NULL &&
           be->loop != NULL;
}

int dsec_backend_file_write_start(dsec_backend *be, dsec_sandbox *sb, const char *path,
                                  const void *data, size_t len, uint32_t mode, bool append,
                                  dsec_file_done_fn done, void *ud, dsec_err *err)
{
    if (!dsec_backend_files_async(be))
        return unsupported(be, "file writes without waiting", err);
    if (sb == NULL)
        return no_sandbox("file_write_start", err);
    if (path == NULL || (data == NULL && len > 0) || done == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "file_write_start: missing path, data or completion callback");
    return be->ops->file_write_start(be->self, sb, path, data, len, mode, append, be->loop, done,
                                     ud, err);
}

int dsec_backend_file_read_start(dsec_backend *be, dsec_sandbox *sb, const char *path,
                                 uint64_t offset, uint64_t max, dsec_file_done_fn done, void *ud,
                                 dsec_err *err)
{
    if (!dsec_backend_files_async(be))
        return unsupported(be, "file reads without waiting", err);
    if (sb == NULL)
        return no_sandbox("file_read_start", err);
    if (path == NULL || done == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "file_read_start: missing path or completion callback");
    return be->ops->file_read_start(be->self, sb, path, offset, max, be->loop, done, ud, err);
}

int dsec_backend_file_list(dsec_backend *be, dsec_sandbox *sb, const char *path,
                           dsec_file_entry **entries, size_t *n, dsec_err *err)
{
    if (be->ops->file_list == NULL)
        return unsupported(be, "file listing", err);
    if (sb == NULL)
        return no_sandbox("file_list", err);
    if (path == NULL || entries == NULL || n == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "file_list: missing path or out parameter");
    *entries = NULL;
    *n = 0;
    return be->ops->file_list(be->self, sb, path, entries, n, err);
}

int dsec_backend_file_op(dsec_backend *be, dsec_sandbox *sb, const dsec_file_op *op,
                         dsec_file_entry *st, dsec_err *err)
{
    if (be->ops->file_op == NULL)
        return unsupported(be, "mkdir, stat, rename and remove", err);
    if (sb == NULL)
        return no_sandbox("file_op", err);
    if (op == NULL || op->path == NULL || (op->kind == DSEC_FOP_RENAME && op->to == NULL) ||
        (op->kind == DSEC_FOP_STAT && st == NULL))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "file_op: missing path, to or out parameter");
    if (st != NULL)
        memset(st, 0, sizeof *st);
    return be->ops->file_op(be->self, sb, op, st, err);
}

static int check_fork(dsec_sandbox *sb, const char *const *ids, size_t n, dsec_sandbox **children,
                      char **states, dsec_err *err)
{
    if (sb == NULL)
        return no_sandbox("fork", err);
    if (n == 0 || n > DSEC_FORK_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "fork: %zu children; must be 1..%d", n,
                            DSEC_FORK_MAX);
    if (ids == NULL || children == NULL || states == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "fork: missing ids or out arrays");
    for (size_t i = 0; i < n; i++) {
        if (ids[i] == NULL || ids[i][0] == '\0')
            return dsec_err_set(err, DSEC_E_INVALID, 0, "fork: child %zu has no id", i);
        children[i] = NULL;
        states[i] = NULL;
    }
    return 0;
}

int dsec_backend_fork(dsec_backend *be, dsec_sandbox *sb, const char *const *ids, size_t n,
                      dsec_sandbox **children, char **states, dsec_err *err)
{
    if (be->ops->fork == NULL)
        return unsupported(be, "fork", err);
    if (check_fork(sb, ids, n, children, states, err) < 0)
        return -1;
    return be->ops->fork(be->self, sb, ids, n, children, states, err);
}

bool dsec_backend_forks_async(const dsec_backend *be)
{
    return be->ops->fork_start != NULL;
}

int dsec_backend_fork_start(dsec_backend *be, dsec_sandbox *sb, const char *const *ids, size_t n,
                            struct dsec_loop *loop, dsec_ready_fn done, void *ud,
                            dsec_sandbox **children, char **states, dsec_err *err)
{
    if (be->ops->fork_start == NULL)
        return unsupported(be, "fork_start", err);
    if (loop == NULL || done == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "fork_start: missing loop or done");
    if (check_fork(sb, ids, n, children, states, err) < 0)
        return -1;
    return be->ops->fork_start(be->self, sb, ids, n, loop, done, ud, children, states, err);
}

int dsec_backend_pause(dsec_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    if (be->ops->pause == NULL)
        return unsupported(be, "pause", err);
    if (sb == NULL)
        return no_sandbox("pause", err);
    return be->ops->pause(be->self, sb, err);
}

int dsec_backend_resume(dsec_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    if (be->ops->resume == NULL)
        return unsupported(be, "resume", err);
    if (sb == NULL)
        return no_sandbox("resume", err);
    return be->ops->resume(be->self, sb, err);
}

int dsec_backend_snapshot(dsec_backend *be, dsec_sandbox *sb, const char *path, const char *name,
                          dsec_err *err)
{
    if (be->ops->snapshot == NULL)
        return unsupported(be, "snapshot", err);
    if (sb == NULL)
        return no_sandbox("snapshot", err);
    if (path == NULL || path[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "snapshot: no path");
    return be->ops->snapshot(be->self, sb, path, name, err);
}

int dsec_backend_restore(dsec_backend *be, const dsec_sandbox_spec *spec, const char *path,
                         dsec_sandbox **out, char **backend_state, dsec_err *err)
{
    if (be->ops->restore == NULL)
        return unsupported(be, "restore", err);
    if (spec == NULL || path == NULL || out == NULL || backend_state == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "restore: missing spec, path or out parameter");
    *out = NULL;
    *backend_state = NULL;
    return be->ops->restore(be->self, spec, path, out, backend_state, err);
}

int dsec_backend_destroy(dsec_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    if (sb == NULL)
        return no_sandbox("destroy", err);
    return be->ops->destroy(be->self, sb, err);
}

bool dsec_backend_stops_async(const dsec_backend *be)
{
    return be->ops->stop_start != NULL;
}

int dsec_backend_stop_start(dsec_backend *be, dsec_sandbox *sb, struct dsec_loop *loop,
                            dsec_ready_fn done, void *ud, dsec_err *err)
{
    if (be->ops->stop_start == NULL)
        return unsupported(be, "stop_start", err);
    if (sb == NULL)
        return no_sandbox("stop_start", err);
    if (loop == NULL || done == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "stop_start: missing loop or done");
    return be->ops->stop_start(be->self, sb, loop, done, ud, err);
}

int dsec_backend_stats(dsec_backend *be, dsec_sandbox *sb, dsec_sandbox_stats *out, dsec_err *err)
{
    if (be->ops->stats == NULL)
        return unsupported(be, "stats", err);
    if (sb == NULL)
        return no_sandbox("stats", err);
    if (out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "stats: no out parameter");
    memset(out, 0, sizeof *out);
    return be->ops->stats(be->self, sb, out, err);
}

int dsec_backend_adopt(dsec_backend *be, const dsec_sandbox_spec *spec, const char *backend_state,
                       dsec_sandbox **out, dsec_err *err)
{
    if (be->ops->adopt == NULL)
        return unsupported(be, "adopt", err);
    if (backend_state == NULL || out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "adopt: missing backend_state or out parameter");
    *out = NULL;
    return be->ops->adopt(be->self, spec, backend_state, out, err);
}

void dsec_backend_detach(dsec_backend *be, dsec_sandbox *sb)
{
    if (sb != NULL)
        be->ops->detach(be->self, sb);
}

int dsec_backend_net_set(dsec_backend *be, dsec_sandbox *sb, const char *const *entries, size_t n,
                         dsec_err *err)
{
    if (be->ops->net_set == NULL)
        return unsupported(be, "network policy changes", err);
    if (sb == NULL)
        return no_sandbox("net_set", err);
    if (n > 0 && entries == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "net_set: %zu entries but no array", n);
    return be->ops->net_set(be->self, sb, entries, n, err);
}

int dsec_backend_proc_start(dsec_backend *be, dsec_sandbox *sb, const dsec_proc_start_req *req,
                            dsec_proc_info *out, dsec_err *err)
{
    if (be->ops->proc_start == NULL)
        return unsupported(be,
                           req != NULL && req->pty       ? "terminals (pty)"
                           : req != NULL && req->session ? "shell sessions"
                                                         : "background processes",
                           err);
    if (sb == NULL)
        return no_sandbox("proc_start", err);
    if (req == NULL || out == NULL || (req->exec.argc > 0 && req->exec.argv == NULL))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "proc_start: missing argv or out parameter");
    dsec_proc_start_req copy;
    if (!req->session && req->exec.argc == 0) { /* the default command, in the background */
        copy = *req;
        if (with_default_cmd(be, sb, &req->exec, &copy.exec, err) == NULL)
            return -1;
        req = &copy;
    }
    if (req->session && req->pty)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "proc_start: a shell session runs without a terminal (pty and "
                            "session are exclusive)");
    if (req->ring_max > DSEC_PROC_RING_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "proc_start: ring_max %" PRIu64 " is over the limit of %u bytes",
                            req->ring_max, DSEC_PROC_RING_MAX);
    memset(out, 0, sizeof *out);
    return be->ops->proc_start(be->self, sb, req, out, err);
}

int dsec_backend_proc_list(dsec_backend *be, dsec_sandbox *sb, dsec_proc_info **out, size_t *n,
                           dsec_err *err)
{
    if (be->ops->proc_list == NULL)
        return unsupported(be, "background processes", err);
    if (sb == NULL)
        return no_sandbox("proc_list", err);
    *out = NULL;
    *n = 0;
    return be->ops->proc_list(be->self, sb, out, n, err);
}

int dsec_backend_proc_signal(dsec_backend *be, dsec_sandbox *sb, uint64_t handle, int sig,
                             dsec_err *err)
{
    if (be->ops->proc_signal == NULL)
        return unsupported(be, "background processes", err);
    if (sb == NULL)
        return no_sandbox("proc_signal", err);
    if (sig <= 0 || sig >= 65)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "proc_signal: %d is not a signal number", sig);
    return be->ops->proc_signal(be->self, sb, handle, sig, err);
}

int dsec_backend_proc_stdin(dsec_backend *be, dsec_sandbox *sb, uint64_t handle, const void *data,
                            size_t len, bool close, dsec_err *err)
{
    if (be->ops->proc_stdin == NULL)
        return unsupported(be, "background processes", err);
    if (sb == NULL)
        return no_sandbox("proc_stdin", err);
    if (data == NULL && len > 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "proc_stdin: %zu bytes but no data", len);
    return be->ops->proc_stdin(be->self, sb, handle, data, len, close, err);
}

int dsec_backend_proc_output(dsec_backend *be, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                             uint64_t err_off, uint64_t max, dsec_proc_output *out, dsec_err *err)
{
    if (be->ops->proc_output == NULL)
        return unsupported(be, "background processes", err);
    if (sb == NULL)
        return no_sandbox("proc_output", err);
    memset(out, 0, sizeof *out);
    return be->ops->proc_output(be->self, sb, handle, out_off, err_off, max, out, err);
}

int dsec_backend_proc_resize(dsec_backend *be, dsec_sandbox *sb, uint64_t handle, uint16_t rows,
                             uint16_t cols, dsec_err *err)
{
    if (be->ops->proc_resize == NULL)
        return unsupported(be, "terminals", err);
    if (sb == NULL)
        return no_sandbox("proc_resize", err);
    if (rows == 0 || cols == 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "proc_resize: a window of %u rows and %u columns; both must be at "
                            "least 1",
                            rows, cols);
    return be->ops->proc_resize(be->self, sb, handle, rows, cols, err);
}

bool dsec_backend_proc_follows(const dsec_backend *be)
{
    return be->ops->proc_follow_start != NULL;
}

int dsec_backend_proc_follow_start(dsec_backend *be, dsec_sandbox *sb, uint64_t handle,
                                   uint64_t out_off, uint64_t err_off, uint64_t max,
                                   uint32_t wait_ms, struct dsec_loop *loop,
                                   dsec_proc_output_done_fn done, void *ud, dsec_err *err)
{
    if (be->ops->proc_follow_start == NULL)
        return unsupported(be, "waiting for process output", err);
    if (sb == NULL)
        return no_sandbox("proc_follow_start", err);
    if (wait_ms > DSEC_PROC_WAIT_MAX_MS)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "proc_follow_start: wait_ms %u is over the limit of %u", wait_ms,
                            DSEC_PROC_WAIT_MAX_MS);
    return be->ops->proc_follow_start(be->self, sb, handle, out_off, err_off, max, wait_ms, loop,
                                      done, ud, err);
}

bool dsec_backend_proc_stdin_async(const dsec_backend *be)
{
    return be->ops->proc_stdin_start != NULL;
}

int dsec_backend_proc_stdin_start(dsec_backend *be, dsec_sandbox *sb, uint64_t handle,
                                  const void *data, size_t len, bool close, struct dsec_loop *loop,
                                  dsec_proc_done_fn done, void *ud, dsec_err *err)
{
    if (be->ops->proc_stdin_start == NULL)
        return unsupported(be, "stdin writes without a thread", err);
    if (sb == NULL)
        return no_sandbox("proc_stdin_start", err);
    if (data == NULL && len > 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "proc_stdin: %zu bytes but no data", len);
    return be->ops->proc_stdin_start(be->self, sb, handle, data, len, close, loop, done, ud, err);
}

int dsec_backend_layer_cache(const dsec_backend_config *cfg, const char *state_dir,
                             uint64_t budget_bytes, struct dsec_layer_cache **out, dsec_err *err)
{
    char p[PATH_MAX + 16];
    int n = cfg->layer_cache_dir != NULL ? snprintf(p, sizeof p, "%s", cfg->layer_cache_dir)
                                         : snprintf(p, sizeof p, "%s/layers", state_dir);
    if (n < 0 || (size_t)n >= sizeof p)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "layer cache directory: path too long");
    if (dsec_layer_cache_share(out, p, budget_bytes, cfg->layers, err) < 0)
        return dsec_err_wrap(err, "layer cache");
    return 0;
}

int dsec_backend_opt_bool(const char *key, const char *v, bool *out, dsec_err *err)
{
    if (strcmp(v, "true") != 0 && strcmp(v, "false") != 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "option %s=\"%s\": expected true or false", key,
                            v);
    *out = strcmp(v, "true") == 0;
    return 0;
}
