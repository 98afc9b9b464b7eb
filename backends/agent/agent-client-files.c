/* agent-client-files.c - file calls: writes and reads (also piecewise on the loop), list... */
#define _GNU_SOURCE
#include "backends/agent/agent-client-int.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

#include "backends/agent/agent-proto.h"
#include "dsec/alloc.h"

static int check_path(const char *op, const char *path, dsec_err *err)
{
    if (path == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: path is NULL", op);
    size_t n = strlen(path);
    if (n > DSEC__AGENT_PATH_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: path longer than %u bytes", op,
                            DSEC__AGENT_PATH_MAX);
    if (path[0] != '/')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: path \"%s\" is not absolute", op, path);
    return 0;
}

/* The request for one piece of a write. */
static uint8_t *write_frame(dsec_agent *a, const char *path, const void *data, size_t len,
                            uint32_t mode, bool append, size_t *flen, dsec_err *err)
{
    if (check_path("write", path, err) < 0)
        return NULL;
    if (len > DSEC_AGENT_FILE_MAX) {
        dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                     "write \"%s\": %zu bytes, at most %u per call (append the rest)", path, len,
                     DSEC_AGENT_FILE_MAX);
        return NULL;
    }
    if (len > 0 && data == NULL) {
        dsec_err_set(err, DSEC_E_INVALID, 0, "write \"%s\": data is NULL", path);
        return NULL;
    }
    size_t pl = strlen(path);
    uint8_t *p;
    uint8_t *frame =
        dsec__agent_new_frame(a, DSEC__AGENT_T_FWRITE, 4 + 1 + 4 + pl + 4 + len, &p, err);
    if (frame == NULL)
        return NULL;
    p = dsec__agent_put_u32(p, mode);
    p = dsec__agent_put_u8(p, append);
    p = dsec__agent_put_bytes(p, path, pl);
    p = dsec__agent_put_bytes(p, data, len);
    *flen = (size_t)(p - frame);
    return frame;
}

int dsec_agent_file_write(dsec_agent *a, const char *path, const void *data, size_t len,
                          uint32_t mode, bool append, dsec_err *err)
{
    if (dsec__agent_check_open(a, err) < 0)
        return -1;
    size_t flen;
    uint8_t *frame = write_frame(a, path, data, len, mode, append, &flen, err);
    if (frame == NULL)
        return -1;
    return dsec__agent_request_ok(a, frame, flen, err);
}

/* The request for one piece of a read. */
static uint8_t *read_frame(dsec_agent *a, const char *path, uint64_t offset, uint64_t max,
                           size_t *flen, dsec_err *err)
{
    if (check_path("read", path, err) < 0)
        return NULL;
    size_t pl = strlen(path);
    uint8_t *p;
    uint8_t *frame = dsec__agent_new_frame(a, DSEC__AGENT_T_FREAD, 8 + 8 + 4 + pl, &p, err);
    if (frame == NULL)
        return NULL;
    p = dsec__agent_put_u64(p, offset);
    p = dsec__agent_put_u64(p, max);
    p = dsec__agent_put_bytes(p, path, pl);
    *flen = (size_t)(p - frame);
    return frame;
}

/* A read's DATA answer into out (its data copied). -1 with err set when it is malformed
 * (the stream is then out of step) or memory runs out. */
static int read_answer(const char *path, uint64_t max, const uint8_t *rp, size_t rn,
                       dsec_file_data *out, dsec_err *err)
{
    dsec__agent_rd r = {.p = rp, .end = rp + rn};
    uint64_t size = dsec__agent_get_u64(&r);
    bool eof = dsec__agent_get_u8(&r) != 0;
    size_t dl;
    const uint8_t *d = dsec__agent_get_bytes(&r, DSEC__AGENT_FILE_MAX, &dl);
    if (!dsec__agent_done(&r) || (max && dl > max))
        return dsec_err_set(err, DSEC_E_DECODE, 0, "read \"%s\": malformed answer", path);
    memset(out, 0, sizeof *out);
    if (dl > 0) {
        out->data = dsec_malloc(dl);
        if (out->data == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "read \"%s\": %zu bytes", path, dl);
        memcpy(out->data, d, dl);
    }
    out->len = dl;
    out->size = size;
    out->eof = eof;
    return 0;
}

int dsec_agent_file_read(dsec_agent *a, const char *path, uint64_t offset, uint64_t max,
                         dsec_file_data *out, dsec_err *err)
{
    if (out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "read: out is NULL");
    memset(out, 0, sizeof *out);
    if (dsec__agent_check_open(a, err) < 0)
        return -1;
    size_t flen;
    uint8_t *frame = read_frame(a, path, offset, max, &flen, err);
    if (frame == NULL)
        return -1;
    const uint8_t *rp;
    size_t rn;
    int rc = dsec__agent_roundtrip(a, frame, flen, DSEC__AGENT_T_DATA, &rp, &rn, err);
    dsec_free(frame);
    if (rc < 0)
        return -1;
    if (read_answer(path, max, rp, rn, out, err) < 0) {
        if (err->code == DSEC_E_DECODE)
            dsec__agent_mark_broken(a);
        return -1;
    }
    return 0;
}

/* ---- files without a thread: a whole transfer, piece by piece, on the loop --------------- */

struct file_run {
    struct loop_run run; /* first: the run is the transfer */
    uint32_t id;         /* the piece in flight */
    bool read;
    char *path;
    const uint8_t *data; /* a write's, borrowed until done */
    size_t len, off;
    uint32_t mode;
    bool append;
    uint64_t offset, max; /* a read's */
    dsec_file_data out;
    dsec_agent_file_done_fn done;
    void *ud;
};

/* The request for the transfer's next piece; -1 with err set. */
static int file_run_next(struct file_run *r, uint8_t **frame, size_t *flen, dsec_err *err)
{
    if (r->read) {
        uint64_t want = r->max == 0 ? 0 : r->max - r->out.len;
        *frame = read_frame(r->run.a, r->path, r->offset + r->out.len, want, flen, err);
    } else {
        size_t n = r->len - r->off > DSEC_AGENT_FILE_MAX ? DSEC_AGENT_FILE_MAX : r->len - r->off;
        *frame = write_frame(r->run.a, r->path, r->data + r->off, n, r->mode,
                             r->append || r->off > 0, flen, err);
    }
    if (*frame == NULL)
        return -1;
    r->id = dsec__agent_get_u32le(*frame + 5);
    return 0;
}

static int file_run_frame(struct loop_run *lr, uint8_t type, uint32_t rid, const uint8_t *pl,
                          size_t pn, dsec_err *err)
{
    struct file_run *r = (struct file_run *)lr;
    int st = dsec__agent_loop_answer(r->id, r->read ? DSEC__AGENT_T_DATA : DSEC__AGENT_T_OK,
                                     "file transfer piece", type, rid, pl, pn, err);
    if (st != 0)
        return st;
    bool more;
    if (r->read) {
        dsec_file_data part;
        uint64_t left = r->max == 0 ? 0 : r->max - r->out.len;
        if (read_answer(r->path, left, pl, pn, &part, err) < 0)
            return err->code == DSEC_E_DECODE ? EXEC_BROKEN : EXEC_REFUSED;
        if (part.len > 0 && r->out.data != NULL) {
            uint8_t *grown = dsec_realloc(r->out.data, r->out.len + part.len);
            if (grown == NULL) {
                dsec_free(part.data);
                dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "read \"%s\": out of memory", r->path);
                return EXEC_REFUSED;
            }
            memcpy(grown + r->out.len, part.data, part.len);
            r->out.data = grown;
            dsec_free(part.data);
        } else if (part.len > 0) {
            r->out.data = part.data;
        }
        r->out.len += part.len;
        r->out.size = part.size;
        r->out.eof = part.eof;
        more = !part.eof && part.len > 0 && (r->max == 0 || r->out.len < r->max);
    } else {
        r->off += r->len - r->off > DSEC_AGENT_FILE_MAX ? DSEC_AGENT_FILE_MAX : r->len - r->off;
        more = r->off < r->len;
    }
    if (!more)
        return EXEC_EXITED;
    uint8_t *frame;
    size_t flen;
    if (file_run_next(r, &frame, &flen, err) < 0)
        return EXEC_REFUSED;
    dsec__agent_loop_next(lr, frame, flen);
    return EXEC_MORE;
}

static void file_run_end(struct loop_run *lr, int st, dsec_err *err)
{
    struct file_run *r = (struct file_run *)lr;
    dsec_agent_file_done_fn done = r->done;
    void *ud = r->ud;
    dsec_file_data out = r->out;
    bool read = r->read;
    dsec_free(r->path);
    dsec_free(r);
    if (st != EXEC_EXITED) {
        dsec_free(out.data);
        done(ud, -1, NULL, err);
        return;
    }
    done(ud, 0, read ? &out : NULL, err);
}

static int file_run_start(struct file_run *r, dsec_agent *a, struct dsec_loop *loop,
                          const char *path, dsec_err *err)
{
    r->run.a = a;
    r->run.what = "the file transfer";
    r->run.frame_in = file_run_frame;
    r->run.end = file_run_end;
    r->run.deadline_ns = dsec_loop_now_ns() + FILE_OP_TIMEOUT_MS * 1000000ull;
    if (dsec__agent_check_open(a, err) < 0)
        goto fail;
    if ((r->path = dsec_strdup(path)) == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "\"%s\": a file transfer in flight", path);
        goto fail;
    }
    if (file_run_next(r, &r->run.frame, &r->run.flen, err) < 0 ||
        dsec__agent_loop_run_start(&r->run, a, loop, err) < 0)
        goto fail;
    return 0;
fail:
    dsec_free(r->path);
    dsec_free(r);
    return -1;
}

int dsec_agent_file_write_start(dsec_agent *a, struct dsec_loop *loop, const char *path,
                                const void *data, size_t len, uint32_t mode, bool append,
                                dsec_agent_file_done_fn done, void *ud, dsec_err *err)
{
    if (check_path("write", path, err) < 0)
        return -1;
    struct file_run *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "write \"%s\": a transfer in flight", path);
    *r = (struct file_run){
        .data = data, .len = len, .mode = mode, .append = append, .done = done, .ud = ud};
    return file_run_start(r, a, loop, path, err);
}

int dsec_agent_file_read_start(dsec_agent *a, struct dsec_loop *loop, const char *path,
                               uint64_t offset, uint64_t max, dsec_agent_file_done_fn done,
                               void *ud, dsec_err *err)
{
    if (check_path("read", path, err) < 0)
        return -1;
    struct file_run *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "read \"%s\": a transfer in flight", path);
    *r = (struct file_run){.read = true, .offset = offset, .max = max, .done = done, .ud = ud};
    return file_run_start(r, a, loop, path, err);
}

/* Decode an ENTRIES answer into a caller-owned array. */
static int decode_entries(const uint8_t *p, size_t n, const char *path, dsec_file_entry **entries,
                          size_t *count, dsec_err *err)
{
    dsec__agent_rd r = {.p = p, .end = p + n};
    uint32_t cnt = dsec__agent_get_u32(&r);
    if (r.bad || cnt > DSEC__AGENT_LIST_MAX)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "list \"%s\": malformed answer", path);
    dsec_file_entry *v = dsec_calloc(cnt ? cnt : 1, sizeof *v);
    if (v == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "list \"%s\": %" PRIu32 " entries", path,
                            cnt);
    for (uint32_t i = 0; i < cnt; i++) {
        size_t nl;
        const char *name = dsec__agent_get_str(&r, DSEC__AGENT_PATH_MAX, &nl);
        uint8_t kind = dsec__agent_get_u8(&r);
        v[i].size = dsec__agent_get_u64(&r);
        v[i].mode = dsec__agent_get_u32(&r);
        v[i].mtime = (int64_t)dsec__agent_get_u64(&r);
        if (r.bad || kind < DSEC_FILE_REG || kind > DSEC_FILE_OTHER) {
            dsec_file_entries_free(v, i);
            return dsec_err_set(err, DSEC_E_DECODE, 0, "list \"%s\": malformed entry %" PRIu32,
                                path, i);
        }
        v[i].kind = (dsec_file_kind)kind;
        v[i].name = dsec_strndup(name, nl);
        if (v[i].name == NULL) {
            dsec_file_entries_free(v, i);
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "list \"%s\"", path);
        }
    }
    if (!dsec__agent_done(&r)) {
        dsec_file_entries_free(v, cnt);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "list \"%s\": trailing bytes in answer", path);
    }
    *entries = v;
    *count = cnt;
    return 0;
}

static int path_request(dsec_agent *a, uint8_t type, uint8_t want, const char *op, const char *path,
                        const uint8_t **rp, size_t *rn, dsec_err *err)
{
    if (dsec__agent_check_open(a, err) < 0 || check_path(op, path, err) < 0)
        return -1;
    size_t pl = strlen(path);
    uint8_t *p;
    uint8_t *frame = dsec__agent_new_frame(a, type, 4 + pl, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_bytes(p, path, pl);
    int rc = dsec__agent_roundtrip(a, frame, (size_t)(p - frame), want, rp, rn, err);
    dsec_free(frame);
    return rc;
}

int dsec_agent_file_list(dsec_agent *a, const char *path, dsec_file_entry **entries, size_t *n,
                         dsec_err *err)
{
    if (entries == NULL || n == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "list: entries or n is NULL");
    *entries = NULL;
    *n = 0;
    const uint8_t *rp;
    size_t rn;
    if (path_request(a, DSEC__AGENT_T_FLIST, DSEC__AGENT_T_ENTRIES, "list", path, &rp, &rn, err) <
        0)
        return -1;
    if (decode_entries(rp, rn, path, entries, n, err) < 0) {
        dsec__agent_mark_broken(a);
        return -1;
    }
    return 0;
}

int dsec_agent_file_stat(dsec_agent *a, const char *path, dsec_file_entry *out, dsec_err *err)
{
    if (out == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "stat: out is NULL");
    memset(out, 0, sizeof *out);
    const uint8_t *rp;
    size_t rn;
    if (path_request(a, DSEC__AGENT_T_FSTAT, DSEC__AGENT_T_ENTRIES, "stat", path, &rp, &rn, err) <
        0)
        return -1;
    dsec_file_entry *v;
    size_t cnt;
    if (decode_entries(rp, rn, path, &v, &cnt, err) < 0) {
        dsec__agent_mark_broken(a);
        return -1;
    }
    if (cnt != 1) {
        dsec_file_entries_free(v, cnt);
        dsec__agent_mark_broken(a);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "stat \"%s\": %zu entries in the answer", path,
                            cnt);
    }
    *out = v[0];
    dsec_free(v); /* the name moves to out */
    return 0;
}

int dsec_agent_file_remove(dsec_agent *a, const char *path, bool recursive, dsec_err *err)
{
    if (dsec__agent_check_open(a, err) < 0 || check_path("remove", path, err) < 0)
        return -1;
    size_t pl = strlen(path);
    uint8_t *p;
    uint8_t *frame = dsec__agent_new_frame(a, DSEC__AGENT_T_FREMOVE, 1 + 4 + pl, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u8(p, recursive);
    p = dsec__agent_put_bytes(p, path, pl);
    return dsec__agent_request_ok(a, frame, (size_t)(p - frame), err);
}

int dsec_agent_file_mkdir(dsec_agent *a, const char *path, uint32_t mode, bool parents,
                          dsec_err *err)
{
    if (dsec__agent_check_open(a, err) < 0 || check_path("mkdir", path, err) < 0)
        return -1;
    size_t pl = strlen(path);
    uint8_t *p;
    uint8_t *frame = dsec__agent_new_frame(a, DSEC__AGENT_T_FMKDIR, 1 + 4 + 4 + pl, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u8(p, parents);
    p = dsec__agent_put_u32(p, mode);
    p = dsec__agent_put_bytes(p, path, pl);
    return dsec__agent_request_ok(a, frame, (size_t)(p - frame), err);
}

int dsec_agent_file_rename(dsec_agent *a, const char *from, const char *to, bool sync,
                           dsec_err *err)
{
    if (dsec__agent_check_open(a, err) < 0 || check_path("rename", from, err) < 0 ||
        check_path("rename", to, err) < 0)
        return -1;
    size_t fl = strlen(from), tl = strlen(to);
    uint8_t *p;
    uint8_t *frame = dsec__agent_new_frame(a, DSEC__AGENT_T_FRENAME, 1 + 4 + fl + 4 + tl, &p, err);
    if (frame == NULL)
        return -1;
    p = dsec__agent_put_u8(p, sync);
    p = dsec__agent_put_bytes(p, from, fl);
    p = dsec__agent_put_bytes(p, to, tl);
    return dsec__agent_request_ok(a, frame, (size_t)(p - frame), err);
}

int dsec_agent_file_op(dsec_agent *a, const dsec_file_op *op, dsec_file_entry *st, dsec_err *err)
{
    switch (op->kind) {
    case DSEC_FOP_MKDIR:
        return dsec_agent_file_mkdir(a, op->path, op->mode, op->parents, err);
    case DSEC_FOP_STAT:
        return dsec_agent_file_stat(a, op->path, st, err);
    case DSEC_FOP_RENAME:
        return dsec_agent_file_rename(a, op->path, op->to, op->sync, err);
    case DSEC_FOP_REMOVE:
        return dsec_agent_file_remove(a, op->path, op->recursive, err);
    }
    return dsec_err_set(err, DSEC_E_INVALID, 0, "file op %d is unknown", (int)op->kind);
}
