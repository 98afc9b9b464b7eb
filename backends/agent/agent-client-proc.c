/* agent-client-proc.c - background process calls: start, list, signal, stdin, output, resize */
#define _GNU_SOURCE
#include "backends/agent/agent-client-int.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "backends/agent/agent-proto.h"
#include "dsec/alloc.h"

/* One process info from r into *out; false when it is malformed (r is then bad). */
static bool get_proc_info(dsec__agent_rd *r, dsec_proc_info *out)
{
    memset(out, 0, sizeof *out);
    out->handle = dsec__agent_get_u64(r);
    out->pid = (int32_t)dsec__agent_get_u32(r);
    uint8_t flags = dsec__agent_get_u8(r);
    out->exit_code = (int32_t)dsec__agent_get_u32(r);
    out->signal = (int32_t)dsec__agent_get_u32(r);
    out->started_ns = dsec__agent_get_u64(r);
    out->ended_ns = dsec__agent_get_u64(r);
    out->out_total = dsec__agent_get_u64(r);
    out->err_total = dsec__agent_get_u64(r);
    size_t cl;
    const char *cmd = dsec__agent_get_str(r, DSEC__AGENT_CMDLINE_MAX, &cl);
    if (r->bad || out->handle == 0 ||
        (flags & ~(DSEC__AGENT_P_RUNNING | DSEC__AGENT_P_STDIN_OPEN | DSEC__AGENT_P_TIMED_OUT |
                   DSEC__AGENT_P_PTY | DSEC__AGENT_P_SESSION | DSEC__AGENT_P_BUSY))) {
        r->bad = true;
        return false;
    }
    out->running = flags & DSEC__AGENT_P_RUNNING;
    out->stdin_open = flags & DSEC__AGENT_P_STDIN_OPEN;
    out->timed_out = flags & DSEC__AGENT_P_TIMED_OUT;
    out->pty = flags & DSEC__AGENT_P_PTY;
    out->session = flags & DSEC__AGENT_P_SESSION;
    out->busy = flags & DSEC__AGENT_P_BUSY;
    memcpy(out->cmdline, cmd, cl);
    out->cmdline[cl] = 0;
    return true;
}

int dsec_agent_proc_start(dsec_agent *a, const dsec_proc_start_req *req, dsec_proc_info *out,
                          dsec_err *err)
{
    if (req == NULL || out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "start: request or out is NULL");
    memset(out, 0, sizeof *out);
    if (dsec__agent_check_open(a, err) < 0)
        return -1;
    if (req->ring_max > DSEC__AGENT_RING_MAX)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "start: ring_max %" PRIu64 " is over the limit of %u bytes",
                            req->ring_max, DSEC__AGENT_RING_MAX);
    size_t plen = 0;
    if (dsec__agent_check_exec_req(&req->exec, req->session, &plen, err) < 0)
        return -1;
    if (req->session && req->pty)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "start: a shell session runs without a terminal (pty and session "
                            "are exclusive)");
    bool ext = req->pty || req->session; /* the trailing fields, only then (older agents) */
    plen = plen - 8 + 8 + 1 + (ext ? 1 + 4 + 4 : 0); /* no output_max; ring_max, keep_stdin */
    uint8_t *p;
    uint8_t *frame = dsec__agent_new_frame(a, DSEC__AGENT_T_PSTART, plen, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u64(p, req->exec.timeout_ms);
    p = dsec__agent_put_exec_body(p, &req->exec);
    p = dsec__agent_put_u64(p, req->ring_max);
    p = dsec__agent_put_u8(p, req->keep_stdin);
    if (ext) {
        p = dsec__agent_put_u8(p, (uint8_t)((req->pty ? DSEC__AGENT_S_PTY : 0) |
                                            (req->session ? DSEC__AGENT_S_SESSION : 0)));
        p = dsec__agent_put_u32(p, req->rows);
        p = dsec__agent_put_u32(p, req->cols);
    }
    const uint8_t *rp;
    size_t rn;
    int rc =
        dsec__agent_roundtrip(a, frame, (size_t)(p - frame), DSEC__AGENT_T_PROC, &rp, &rn, err);
    dsec_free(frame);
    if (rc < 0)
        return -1;
    dsec__agent_rd r = {.p = rp, .end = rp + rn};
    if (!get_proc_info(&r, out) || !dsec__agent_done(&r)) {
        dsec__agent_mark_broken(a);
        memset(out, 0, sizeof *out);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "start: malformed answer from the agent");
    }
    return 0;
}

int dsec_agent_proc_list(dsec_agent *a, dsec_proc_info **out, size_t *n, dsec_err *err)
{
    if (out == NULL || n == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "list processes: out or n is NULL");
    *out = NULL;
    *n = 0;
    if (dsec__agent_check_open(a, err) < 0)
        return -1;
    uint8_t *p;
    uint8_t *frame = dsec__agent_new_frame(a, DSEC__AGENT_T_PLIST, 0, &p, err);
    if (frame == NULL)
        return -1;
    const uint8_t *rp;
    size_t rn;
    int rc =
        dsec__agent_roundtrip(a, frame, (size_t)(p - frame), DSEC__AGENT_T_PROCS, &rp, &rn, err);
    dsec_free(frame);
    if (rc < 0)
        return -1;
    dsec__agent_rd r = {.p = rp, .end = rp + rn};
    uint32_t cnt = dsec__agent_get_u32(&r);
    if (r.bad || cnt > DSEC__AGENT_PROC_MAX) {
        dsec__agent_mark_broken(a);
        return dsec_err_set(err, DSEC_E_DECODE, 0,
                            "list processes: malformed answer (%" PRIu32 " processes, most %u)",
                            cnt, DSEC__AGENT_PROC_MAX);
    }
    dsec_proc_info *v = dsec_calloc(cnt ? cnt : 1, sizeof *v);
    if (v == NULL) {
        dsec__agent_mark_broken(
            a); /* nothing is out of step, but the answer is lost: keep it simple */
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "list processes: %" PRIu32 " entries", cnt);
    }
    for (uint32_t i = 0; i < cnt; i++)
        get_proc_info(&r, &v[i]);
    if (!dsec__agent_done(&r)) {
        dsec_free(v);
        dsec__agent_mark_broken(a);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "list processes: malformed answer");
    }
    *out = v;
    *n = cnt;
    return 0;
}

/* A request of fixed fields answered by OK. */
static int proc_ok_request(dsec_agent *a, uint8_t *frame, size_t flen, dsec_err *err)
{
    const uint8_t *rp;
    size_t rn;
    int rc = dsec__agent_roundtrip(a, frame, flen, DSEC__AGENT_T_OK, &rp, &rn, err);
    dsec_free(frame);
    if (rc == 0 && rn != 8) {
        dsec__agent_mark_broken(a);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "agent sent an OK of %zu bytes", rn);
    }
    return rc;
}

int dsec_agent_proc_signal(dsec_agent *a, uint64_t handle, int sig, dsec_err *err)
{
    if (dsec__agent_check_open(a, err) < 0)
        return -1;
    if (sig <= 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "signal: %d is not a signal number", sig);
    uint8_t *p;
    uint8_t *frame = dsec__agent_new_frame(a, DSEC__AGENT_T_PSIGNAL, 8 + 4, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u64(p, handle);
    p = dsec__agent_put_u32(p, (uint32_t)sig);
    return proc_ok_request(a, frame, (size_t)(p - frame), err);
}

/* The PSTDIN request; NULL with err set. */
static uint8_t *stdin_frame(dsec_agent *a, uint64_t handle, const void *data, size_t len,
                            bool close, size_t *flen, dsec_err *err)
{
    if (dsec__agent_check_open(a, err) < 0)
        return NULL;
    if (data == NULL && len > 0) {
        dsec_err_set(err, DSEC_E_INVALID, 0, "stdin: %zu bytes but no data", len);
        return NULL;
    }
    if (len > DSEC__AGENT_STDIN_MAX) {
        dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                     "stdin: %zu bytes in one write, at most %u: write in pieces", len,
                     DSEC__AGENT_STDIN_MAX);
        return NULL;
    }
    uint8_t *p;
    uint8_t *frame = dsec__agent_new_frame(a, DSEC__AGENT_T_PSTDIN, 8 + 1 + 4 + len, &p, err);
    if (frame == NULL)
        return NULL;
    p = dsec__agent_put_u64(p, handle);
    p = dsec__agent_put_u8(p, close);
    p = dsec__agent_put_bytes(p, data, len);
    *flen = (size_t)(p - frame);
    return frame;
}

int dsec_agent_proc_stdin(dsec_agent *a, uint64_t handle, const void *data, size_t len, bool close,
                          dsec_err *err)
{
    size_t flen;
    uint8_t *frame = stdin_frame(a, handle, data, len, close, &flen, err);
    return frame == NULL ? -1 : proc_ok_request(a, frame, flen, err);
}

/* A stdin write waiting on the loop for the process to take the bytes. */
struct stdin_run {
    struct loop_run run; /* first: the run is the request */
    uint32_t id;
    uint32_t wait_max_ms;
    uint64_t handle;
    dsec_proc_done_fn done;
    void *ud;
};

static int stdin_run_frame(struct loop_run *lr, uint8_t type, uint32_t rid, const uint8_t *pl,
                           size_t pn, dsec_err *err)
{
    struct stdin_run *r = (struct stdin_run *)lr;
    int st =
        dsec__agent_loop_answer(r->id, DSEC__AGENT_T_OK, "stdin write", type, rid, pl, pn, err);
    if (st != 0)
        return st;
    if (pn != 8) {
        dsec_err_set(err, DSEC_E_DECODE, 0, "agent sent an OK of %zu bytes for stdin", pn);
        return EXEC_BROKEN;
    }
    return EXEC_EXITED;
}

static void stdin_run_end(struct loop_run *lr, int st, dsec_err *err)
{
    struct stdin_run *r = (struct stdin_run *)lr;
    dsec_proc_done_fn done = r->done;
    void *ud = r->ud;
    uint64_t handle = r->handle;
    uint32_t wait_max_ms = r->wait_max_ms;
    dsec_free(r);
    if (st == EXEC_EXITED) {
        done(ud, 0, NULL);
        return;
    }
    if (st == EXEC_BROKEN && err->code == DSEC_E_TIMEOUT) /* the loop's deadline */
        dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                     "process %" PRIu64 " did not take the bytes within %u ms; they wait in "
                     "the sandbox and go in as it reads",
                     handle, wait_max_ms);
    done(ud, -1, err);
}

int dsec_agent_proc_stdin_start(dsec_agent *a, struct dsec_loop *loop, uint64_t handle,
                                const void *data, size_t len, bool close, uint32_t wait_max_ms,
                                dsec_proc_done_fn done, void *ud, dsec_err *err)
{
    if (done == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "stdin: done is NULL");
    if (wait_max_ms > DSEC_PROC_WAIT_MAX_MS)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "stdin: a wait of %u ms, at most %u",
                            wait_max_ms, DSEC_PROC_WAIT_MAX_MS);
    if (wait_max_ms == 0)
        wait_max_ms = DSEC_PROC_WAIT_MAX_MS;
    struct stdin_run *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "stdin: a write in flight");
    r->run.frame = stdin_frame(a, handle, data, len, close, &r->run.flen, err);
    if (r->run.frame == NULL) {
        dsec_free(r);
        return -1;
    }
    r->id = dsec__agent_get_u32le(r->run.frame + 5);
    r->handle = handle;
    r->wait_max_ms = wait_max_ms;
    r->run.deadline_ns = dsec_loop_now_ns() + (uint64_t)wait_max_ms * 1000000ull;
    r->run.what = "the stdin write";
    r->run.frame_in = stdin_run_frame;
    r->run.end = stdin_run_end;
    r->done = done;
    r->ud = ud;
    return dsec__agent_loop_run_own(&r->run, a, loop, err);
}

/* One stream of a POUT: its offset and bytes (copied into *data, dsec_malloc'd); false when
 * malformed: more than asked, or past what the stream produced. */
static bool get_stream(dsec__agent_rd *r, uint64_t max, uint64_t total, uint64_t *from,
                       uint8_t **data, size_t *len)
{
    *from = dsec__agent_get_u64(r);
    const uint8_t *d = dsec__agent_get_bytes(r, DSEC__AGENT_POUT_MAX, len);
    if (r->bad || (max && *len > max) || *from > total || *len > total - *from) {
        r->bad = true;
        return false;
    }
    if (*len > 0) {
        *data = dsec_malloc(*len);
        if (*data == NULL)
            return false;
        memcpy(*data, d, *len);
    }
    return true;
}

/* The POUTPUT request (wait_ms 0: no wait, and no field, as before waits existed). */
static uint8_t *pout_frame(dsec_agent *a, uint64_t handle, uint64_t out_off, uint64_t err_off,
                           uint64_t max, uint32_t wait_ms, size_t *flen, dsec_err *err)
{
    uint8_t *p;
    uint8_t *frame =
        dsec__agent_new_frame(a, DSEC__AGENT_T_POUTPUT, 8 * 4 + (wait_ms ? 4 : 0), &p, err);
    if (frame == NULL)
        return NULL;
    p = dsec__agent_put_u64(p, handle);
    p = dsec__agent_put_u64(p, out_off);
    p = dsec__agent_put_u64(p, err_off);
    p = dsec__agent_put_u64(p, max);
    if (wait_ms)
        p = dsec__agent_put_u32(p, wait_ms);
    *flen = (size_t)(p - frame);
    return frame;
}

/* A POUT into *out: 0, or -1 with err (broken: the answer was malformed). */
static int pout_decode(const uint8_t *rp, size_t rn, uint64_t handle, uint64_t max,
                       dsec_proc_output *out, bool *broken, dsec_err *err)
{
    dsec__agent_rd r = {.p = rp, .end = rp + rn};
    bool ok = get_proc_info(&r, &out->info) &&
              get_stream(&r, max, out->info.out_total, &out->out_from, &out->out, &out->out_len) &&
              get_stream(&r, max, out->info.err_total, &out->err_from, &out->err, &out->err_len) &&
              dsec__agent_done(&r);
    *broken = false;
    if (ok)
        return 0;
    dsec_proc_output_release(out);
    memset(out, 0, sizeof *out);
    if (!r.bad)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "output of process %" PRIu64, handle);
    *broken = true;
    return dsec_err_set(err, DSEC_E_DECODE, 0, "output: malformed answer from the agent");
}

int dsec_agent_proc_output(dsec_agent *a, uint64_t handle, uint64_t out_off, uint64_t err_off,
                           uint64_t max, dsec_proc_output *out, dsec_err *err)
{
    if (out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "output: out is NULL");
    memset(out, 0, sizeof *out);
    if (dsec__agent_check_open(a, err) < 0)
        return -1;
    size_t flen;
    uint8_t *frame = pout_frame(a, handle, out_off, err_off, max, 0, &flen, err);
    if (frame == NULL)
        return -1;
    const uint8_t *rp;
    size_t rn;
    int rc = dsec__agent_roundtrip(a, frame, flen, DSEC__AGENT_T_POUT, &rp, &rn, err);
    dsec_free(frame);
    if (rc < 0)
        return -1;
    bool broken;
    if (pout_decode(rp, rn, handle, max, out, &broken, err) < 0) {
        if (broken)
            dsec__agent_mark_broken(a);
        return -1;
    }
    return 0;
}

struct pout_run {
    struct loop_run run; /* first: the run is the request */
    uint32_t id;
    uint64_t handle, max;
    dsec_proc_output out;
    dsec_proc_output_done_fn done;
    void *ud;
};

static int pout_run_frame(struct loop_run *lr, uint8_t type, uint32_t rid, const uint8_t *pl,
                          size_t pn, dsec_err *err)
{
    struct pout_run *r = (struct pout_run *)lr;
    int st = dsec__agent_loop_answer(r->id, DSEC__AGENT_T_POUT, "output", type, rid, pl, pn, err);
    if (st != 0)
        return st;
    bool broken;
    if (pout_decode(pl, pn, r->handle, r->max, &r->out, &broken, err) < 0)
        return broken ? EXEC_BROKEN : EXEC_REFUSED;
    return EXEC_EXITED;
}

static void pout_run_end(struct loop_run *lr, int st, dsec_err *err)
{
    struct pout_run *r = (struct pout_run *)lr;
    dsec_proc_output_done_fn done = r->done;
    void *ud = r->ud;
    dsec_proc_output out = r->out;
    dsec_free(r);
    if (st == EXEC_EXITED) {
        done(ud, 0, &out, err);
        return;
    }
    done(ud, -1, NULL, err);
}

int dsec_agent_proc_output_start(dsec_agent *a, struct dsec_loop *loop, uint64_t handle,
                                 uint64_t out_off, uint64_t err_off, uint64_t max, uint32_t wait_ms,
                                 dsec_proc_output_done_fn done, void *ud, dsec_err *err)
{
    if (done == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "output: done is NULL");
    if (wait_ms > DSEC__AGENT_WAIT_MAX_MS)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "output: wait of %" PRIu32 " ms is over the limit of %u ms", wait_ms,
                            DSEC__AGENT_WAIT_MAX_MS);
    if (dsec__agent_check_open(a, err) < 0)
        return -1;
    struct pout_run *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "output: a request in flight");
    r->run.frame = pout_frame(a, handle, out_off, err_off, max, wait_ms, &r->run.flen, err);
    if (r->run.frame == NULL) {
        dsec_free(r);
        return -1;
    }
    r->id = dsec__agent_get_u32le(r->run.frame + 5);
    r->handle = handle;
    r->max = max;
    r->run.deadline_ns = dsec_loop_now_ns() + ((uint64_t)wait_ms + EXEC_GRACE_MS) * 1000000ull;
    r->run.what = "the process output";
    r->run.frame_in = pout_run_frame;
    r->run.end = pout_run_end;
    r->done = done;
    r->ud = ud;
    return dsec__agent_loop_run_own(&r->run, a, loop, err);
}

int dsec_agent_proc_resize(dsec_agent *a, uint64_t handle, uint16_t rows, uint16_t cols,
                           dsec_err *err)
{
    if (dsec__agent_check_open(a, err) < 0)
        return -1;
    uint8_t *p;
    uint8_t *frame = dsec__agent_new_frame(a, DSEC__AGENT_T_PRESIZE, 8 + 4 + 4, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u64(p, handle);
    p = dsec__agent_put_u32(p, rows);
    p = dsec__agent_put_u32(p, cols);
    return proc_ok_request(a, frame, (size_t)(p - frame), err);
}
