/* files.c - libdsec's file requests: writes, reads and listings, streamed transfers (uploads and
 * downloads with sha256, a window of messages in flight, resume) and mkdir, stat, rename, remove.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "client/internal.h"
#include "dsec/io.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/sha256.h"

#define XFER_CHUNK_DEFAULT (4u << 20) /* a message's bytes: the node's read page too */
#define XFER_CHUNK_MIN (64u << 10)
#define XFER_CHUNK_MAX (4u << 20) /* well under the bus's payload limit */
#define XFER_WINDOW_DEFAULT 4u
#define XFER_WINDOW_MAX 16u

static size_t chunk_of(size_t want)
{
    if (want == 0)
        return XFER_CHUNK_DEFAULT;
    return want < XFER_CHUNK_MIN ? XFER_CHUNK_MIN : want > XFER_CHUNK_MAX ? XFER_CHUNK_MAX : want;
}

static unsigned window_of(unsigned want)
{
    return want == 0 ? XFER_WINDOW_DEFAULT : want > XFER_WINDOW_MAX ? XFER_WINDOW_MAX : want;
}

/* Messages in flight, answered in the order they were sent (the sandbox's operations run
 * one at a time, in order). */
struct flight {
    dsec_client *c;
    char subj[256];
    const char *type_name;
    dsec_future *f[XFER_WINDOW_MAX];
    uint64_t tag[XFER_WINDOW_MAX]; /* the offset each one is about */
    unsigned head, n, window;
    dsec_buf buf;
    dsec_decoder *dec;
};

static int flight_open(struct flight *fl, dsec_client *c, const char *id, const char *op,
                       const char *type_name, unsigned window, dsec_err *err)
{
    memset(fl, 0, sizeof *fl);
    fl->c = c;
    fl->type_name = type_name;
    fl->window = window;
    dsec_buf_init(&fl->buf);
    if (dsec__client_sbx_subject(c, id, op, fl->subj, sizeof fl->subj, err) < 0)
        return -1;
    if ((fl->dec = dsec_decoder_new(NULL)) == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    return 0;
}

static void flight_close(struct flight *fl)
{
    for (unsigned i = 0; i < fl->n; i++)
        dsec_future_free(fl->f[(fl->head + i) % XFER_WINDOW_MAX]);
    fl->n = 0;
    dsec_buf_release(&fl->buf);
    dsec_decoder_free(fl->dec);
    fl->dec = NULL;
}

static int flight_send(struct flight *fl, int type, const void *msg, uint64_t tag, dsec_err *err)
{
    if (dsec_encode(&fl->buf, type, msg, err) < 0)
        return -1;
    dsec_hdr hdr = {.type = fl->type_name, .schema = DSEC_SCHEMA_VERSION};
    unsigned slot = (fl->head + fl->n) % XFER_WINDOW_MAX;
    if (dsec_bus_request_future(dsec__client_bus(fl->c), fl->subj, &hdr, fl->buf.data, fl->buf.len,
                                dsec__client_timeout_ms(fl->c), &fl->f[slot], err) < 0)
        return -1;
    fl->tag[slot] = tag;
    fl->n++;
    return 0;
}

/* The oldest answer, decoded into out (valid until the next flight_next or flight_close). */
static int flight_next(struct flight *fl, dsec_future **done, void *out, uint64_t *tag,
                       dsec_err *err)
{
    if (*done != NULL) {
        dsec_future_free(*done);
        *done = NULL;
    }
    unsigned slot = fl->head;
    dsec_future *f = fl->f[slot];
    fl->head = (fl->head + 1) % XFER_WINDOW_MAX;
    fl->n--;
    *done = f;
    *tag = fl->tag[slot];
    dsec_msg *reply;
    if (dsec_future_wait(f, &reply, err) < 0)
        return -1;
    return dsec__client_decode_reply(fl->dec, reply, DSEC_MSG_FILE_DATA, out, err);
}

/* ---- uploads ----------------------------------------------------------------------------- */

/* Fill buf with up to n bytes from rd; fewer only at the end of the source. */
static ssize_t read_full(dsec_upload_read_fn rd, void *ud, uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = rd(ud, buf + got, n - got);
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static int probe(dsec_client *c, const char *id, const char *path, const char *upload,
                 uint64_t *held, dsec_err *err)
{
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg_file_write m = {.id = id, .path = path, .upload = upload, .resume = true};
    dsec_msg *keep = NULL;
    dsec_msg_file_data r;
    int rc = dsec__client_sbx_call(c, id, "upload", DSEC_MSG_FILE_WRITE, &m, DSEC_MSG_FILE_DATA,
                                   dec, &keep, &r, err);
    if (rc == 0)
        *held = r.size;
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

int dsec_file_upload_held(dsec_client *c, const char *id, const char *path, const char *upload_id,
                          uint64_t *held, dsec_err *err)
{
    *held = 0;
    if (upload_id == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "upload of %s in %s: no upload id", path, id);
    return probe(c, id, path, upload_id, held, err);
}

/* A resumed upload: what the sandbox holds is not sent again, but it is read and hashed again
 * here (into h, with *off its length, buf of chunk bytes the space to read it in). */
static int upload_resume(dsec_client *c, const char *id, const char *path, const char *up,
                         dsec_upload_read_fn rd, void *ud, uint8_t *buf, size_t chunk,
                         dsec_sha256 *h, uint64_t *off, dsec_transfer_result *res, dsec_err *err)
{
    uint64_t held = 0;
    if (probe(c, id, path, up, &held, err) < 0)
        return dsec_err_wrap(err, "upload %s of %s in %s: asking what it holds", up, path, id);
    while (*off < held) {
        size_t want = held - *off < chunk ? (size_t)(held - *off) : chunk;
        ssize_t n = read_full(rd, ud, buf, want);
        if (n < 0)
            return dsec_err_set(err, DSEC_E_IO, errno, "upload %s of %s: reading the source", up,
                                path);
        if ((size_t)n < want)
            return dsec_err_set(err, DSEC_E_STATE, 0,
                                "upload %s of %s in %s: the sandbox holds %" PRIu64
                                " bytes but the source has only %" PRIu64
                                "; upload it again under another id",
                                up, path, id, held, *off + (uint64_t)n);
        dsec_sha256_update(h, buf, (size_t)n);
        *off += (uint64_t)n;
    }
    res->resumed_from = held;
    return 0;
}

int dsec_file_upload(dsec_client *c, const char *id, const char *path, const dsec_upload_opts *o,
                     dsec_upload_read_fn rd, void *ud, dsec_transfer_result *res, dsec_err *err)
{
    dsec_upload_opts none = {0};
    if (o == NULL)
        o = &none;
    dsec_transfer_result local;
    if (res == NULL)
        res = &local;
    memset(res, 0, sizeof *res);
    if (o->upload_id != NULL)
        snprintf(res->upload_id, sizeof res->upload_id, "%s", o->upload_id);
    else
        dsec_bus_new_id(res->upload_id);
    const char *up = res->upload_id;
    size_t chunk = chunk_of(o->chunk);
    /* two buffers: the chunk to send, and the next one read ahead, so the last chunk is
     * known for the last and carries the commit */
    uint8_t *buf = dsec_malloc(2 * chunk), *ahead = buf + chunk;
    if (buf == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_sha256 h;
    dsec_sha256_init(&h);
    uint64_t off = 0, acked = 0;
    int rc = 0;
    struct flight fl;
    dsec_future *done = NULL;
    bool sent_all = false;
    memset(&fl, 0, sizeof fl);
    if (o->resume &&
        (rc = upload_resume(c, id, path, up, rd, ud, buf, chunk, &h, &off, res, err)) < 0)
        goto out_fl;
    acked = off;
    if ((rc = flight_open(&fl, c, id, "upload", "file_write", window_of(o->window), err)) < 0)
        goto out_fl;
    uint8_t *cur = buf;
    ssize_t n = read_full(rd, ud, cur, chunk);
    while (!sent_all || fl.n > 0) {
        while (!sent_all && fl.n < fl.window) {
            ssize_t nn = n == (ssize_t)chunk ? read_full(rd, ud, ahead, chunk) : 0;
            if (n < 0 || nn < 0) {
                rc = dsec_err_set(err, DSEC_E_IO, errno, "upload %s of %s: reading the source", up,
                                  path);
                goto out_fl;
            }
            dsec_sha256_update(&h, cur, (size_t)n);
            bool last = nn == 0;
            char hex[2 * DSEC_SHA256_LEN + 1] = "";
            if (last) {
                uint8_t d[DSEC_SHA256_LEN];
                dsec_sha256_final(&h, d);
                dsec_sha256_hex(d, hex);
                memcpy(res->sha256, hex, sizeof hex);
                res->size = off + (uint64_t)n;
            }
            dsec_msg_file_write m = {.id = id,
                                     .path = path,
                                     .data = {cur, (size_t)n},
                                     .mode = o->mode,
                                     .upload = up,
                                     .offset = off,
                                     .commit = last,
                                     .sha256 = last ? hex : NULL,
                                     .size = last ? res->size : 0};
            if ((rc = flight_send(&fl, DSEC_MSG_FILE_WRITE, &m, off, err)) < 0)
                goto out_fl;
            off += (uint64_t)n;
            sent_all = last;
            uint8_t *t = cur; /* the bus copied cur: it takes the next chunk */
            cur = ahead;
            ahead = t;
            n = nn;
        }
        dsec_msg_file_data r;
        uint64_t tag;
        if ((rc = flight_next(&fl, &done, &r, &tag, err)) < 0)
            goto out_fl;
        acked = r.size;
        if (fl.n == 0 && sent_all) {
            if (!r.eof || r.sha256 == NULL || strcmp(r.sha256, res->sha256) != 0 ||
                r.size != res->size)
                rc = dsec_err_set(err, DSEC_E_BACKEND, 0,
                                  "upload %s of %s in %s: the sandbox confirmed %" PRIu64
                                  " bytes with sha256 %s, but %" PRIu64 " bytes with %s were sent",
                                  up, path, id, r.size, r.sha256 ? r.sha256 : "(none)", res->size,
                                  res->sha256);
        }
    }
out_fl:;
    bool opened = fl.dec != NULL;
    if (done != NULL)
        dsec_future_free(done);
    flight_close(&fl);
    if (rc < 0 && opened && err != NULL && err->code == DSEC_E_INVALID)
        dsec_err_wrap(err, "upload %s of %s in %s", up, path, id); /* the node says what next */
    else if (rc < 0 && opened)
        dsec_err_wrap(err,
                      "upload %s of %s in %s stopped (the sandbox confirmed %" PRIu64
                      " bytes; resume with the same upload id)",
                      up, path, id, acked);
    dsec_free(buf);
    return rc;
}

struct fd_src {
    int fd;
};

static ssize_t fd_read(void *ud, void *buf, size_t n)
{
    struct fd_src *s = ud;
    for (;;) {
        ssize_t r = dsec_read_eintr(s->fd, buf, n);
        return r;
    }
}

int dsec_file_upload_fd(dsec_client *c, const char *id, const char *path, const dsec_upload_opts *o,
                        int fd, dsec_transfer_result *res, dsec_err *err)
{
    struct fd_src s = {fd};
    return dsec_file_upload(c, id, path, o, fd_read, &s, res, err);
}

struct mem_src {
    const uint8_t *p;
    size_t len, off;
};

static ssize_t mem_read(void *ud, void *buf, size_t n)
{
    struct mem_src *s = ud;
    size_t k = s->len - s->off < n ? s->len - s->off : n;
    if (k > 0)
        memcpy(buf, s->p + s->off, k);
    s->off += k;
    return (ssize_t)k;
}

int dsec__file_upload_mem(dsec_client *c, const char *id, const char *path, const void *data,
                          size_t len, unsigned mode, dsec_err *err)
{
    struct mem_src s = {data, len, 0};
    dsec_upload_opts o = {.mode = mode ? mode : 0644}; /* dsec_write_opts: 0 is 0644 */
    return dsec_file_upload(c, id, path, &o, mem_read, &s, NULL, err);
}

/* ---- downloads --------------------------------------------------------------------------- */

int dsec_file_download(dsec_client *c, const char *id, const char *path,
                       const dsec_download_opts *o, dsec_file_page_fn fn, void *ud,
                       dsec_transfer_result *res, dsec_err *err)
{
    dsec_download_opts none = {0};
    if (o == NULL)
        o = &none;
    dsec_transfer_result local;
    if (res == NULL)
        res = &local;
    memset(res, 0, sizeof *res);
    size_t page = chunk_of(o->page);
    struct flight fl;
    dsec_future *done = NULL;
    int rc = flight_open(&fl, c, id, "read", "file_read", window_of(o->window), err);
    dsec_sha256 h;
    dsec_sha256_init(&h);
    uint64_t got = 0, next = 0, size = 0;
    bool first = true, eof = false;
    if (rc == 0) {
        dsec_msg_file_read m = {.id = id, .path = path, .max = page, .sha256 = true};
        rc = flight_send(&fl, DSEC_MSG_FILE_READ, &m, 0, err);
        next = page;
    }
    while (rc == 0 && !eof) {
        dsec_msg_file_data r;
        uint64_t at;
        if ((rc = flight_next(&fl, &done, &r, &at, err)) < 0)
            break;
        if (first)
            size = r.size;
        if (r.size != size) {
            rc = dsec_err_set(err, DSEC_E_STATE, 0,
                              "reading %s in %s: it changed size from %" PRIu64 " to %" PRIu64
                              " bytes while it was read (at byte %" PRIu64 "); read it again",
                              path, id, size, r.size, got);
            break;
        }
        uint64_t want = size - at < page ? size - at : page;
        if (r.eof && at + r.data.len < size) {
            rc = dsec_err_set(err, DSEC_E_STATE, 0,
                              "reading %s in %s: the node reported the end after %" PRIu64
                              " of its %" PRIu64 " bytes; read it again",
                              path, id, at + r.data.len, size);
            break;
        }
        if (r.data.len == 0 && !r.eof) {
            rc = dsec_err_set(err, DSEC_E_BACKEND, 0,
                              "reading %s in %s: the node answered an empty page before the "
                              "end (at byte %" PRIu64 " of %" PRIu64 ")",
                              path, id, at, size);
            break;
        }
        if (at != got || r.data.len != want || r.eof != (at + r.data.len >= size)) {
            rc = dsec_err_set(err, DSEC_E_BACKEND, 0,
                              "reading %s in %s: the node sent %zu bytes at %" PRIu64
                              " of a file of %" PRIu64 " bytes (expected %" PRIu64 ")",
                              path, id, r.data.len, at, size, want);
            break;
        }
        dsec_sha256_update(&h, r.data.ptr, r.data.len);
        if ((r.data.len > 0 || first) && fn(ud, r.data.ptr, r.data.len, size) < 0) {
            rc = dsec_err_set(err, DSEC_E_IO, errno,
                              "reading %s in %s: the page handler stopped at byte %" PRIu64, path,
                              id, got);
            break;
        }
        got += r.data.len;
        first = false;
        if (r.eof) {
            uint8_t d[DSEC_SHA256_LEN];
            dsec_sha256_final(&h, d);
            dsec_sha256_hex(d, res->sha256);
            res->size = got;
            if (r.sha256 == NULL)
                rc = dsec_err_set(err, DSEC_E_BACKEND, 0,
                                  "reading %s in %s: the node sent no sha256 with the end of the "
                                  "file (a node that predates hashed reads?)",
                                  path, id);
            else if (strcmp(r.sha256, res->sha256) != 0)
                rc = dsec_err_set(err, DSEC_E_BACKEND, 0,
                                  "reading %s in %s: the %" PRIu64
                                  " bytes received hash to %s but the sandbox's file to %s; "
                                  "read it again",
                                  path, id, got, res->sha256, r.sha256);
            eof = true;
            break;
        }
        /* the size is known now: keep the window full up to the end */
        while (rc == 0 && fl.n < fl.window && next < size) {
            dsec_msg_file_read m = {
                .id = id, .path = path, .offset = next, .max = page, .sha256 = true};
            rc = flight_send(&fl, DSEC_MSG_FILE_READ, &m, next, err);
            next += page;
        }
        if (rc == 0 && fl.n == 0) {
            rc =
                dsec_err_set(err, DSEC_E_BACKEND, 0,
                             "reading %s in %s: the node answered no end of the file after %" PRIu64
                             " of its %" PRIu64 " bytes",
                             path, id, got, size);
            break;
        }
    }
    if (done != NULL)
        dsec_future_free(done);
    flight_close(&fl);
    return rc;
}

static int fd_page(void *ud, const uint8_t *data, size_t len, uint64_t size)
{
    (void)size;
    int fd = *(int *)ud;
    while (len > 0) {
        ssize_t w = dsec_write_eintr(fd, data, len);
        if (w < 0)
            return -1;
        data += w;
        len -= (size_t)w;
    }
    return 0;
}

int dsec_file_download_fd(dsec_client *c, const char *id, const char *path,
                          const dsec_download_opts *o, int fd, dsec_transfer_result *res,
                          dsec_err *err)
{
    return dsec_file_download(c, id, path, o, fd_page, &fd, res, err);
}

/* ---- mkdir, stat, rename, remove ----------------------------------------------------------- */

static int file_op(dsec_client *c, const char *id, const dsec_msg_file_op *m, dsec_dirent *st,
                   dsec_err *err)
{
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg *keep = NULL;
    dsec_msg_file_list_reply r;
    int rc = dsec__client_sbx_call(c, id, "file", DSEC_MSG_FILE_OP, m, DSEC_MSG_FILE_LIST_REPLY,
                                   dec, &keep, &r, err);
    if (rc == 0 && st != NULL) {
        if (r.entries.n != 1) {
            rc = dsec_err_set(err, DSEC_E_BACKEND, 0,
                              "stat %s in %s: the node sent %" PRIu32 " entries", m->path, id,
                              r.entries.n);
        } else {
            const dsec_msg_file_entry *e = r.entries.items;
            memset(st, 0, sizeof *st);
            snprintf(st->kind, sizeof st->kind, "%s", e->kind ? e->kind : "");
            st->size = e->size;
            st->mode = e->mode;
            st->mtime = e->mtime;
            if ((st->name = dsec_strdup(e->name)) == NULL)
                rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        }
    }
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

int dsec_file_mkdir(dsec_client *c, const char *id, const char *path, unsigned mode, bool parents,
                    dsec_err *err)
{
    dsec_msg_file_op m = {.id = id, .op = "mkdir", .path = path, .mode = mode, .parents = parents};
    return file_op(c, id, &m, NULL, err);
}

int dsec_file_stat(dsec_client *c, const char *id, const char *path, dsec_dirent *out,
                   dsec_err *err)
{
    memset(out, 0, sizeof *out);
    dsec_msg_file_op m = {.id = id, .op = "stat", .path = path};
    return file_op(c, id, &m, out, err);
}

int dsec_file_rename(dsec_client *c, const char *id, const char *from, const char *to,
                     dsec_err *err)
{
    dsec_msg_file_op m = {.id = id, .op = "rename", .path = from, .to = to};
    return file_op(c, id, &m, NULL, err);
}

int dsec_file_remove(dsec_client *c, const char *id, const char *path, bool recursive,
                     dsec_err *err)
{
    dsec_msg_file_op m = {.id = id, .op = "remove", .path = path, .recursive = recursive};
    return file_op(c, id, &m, NULL, err);
}

/* ---- whole files and listings ---------------------------------------------- */

int dsec_file_write(dsec_client *c, const char *id, const char *path, const void *data, size_t len,
                    unsigned mode, dsec_err *err)
{
    dsec_write_opts o = {.mode = mode};
    return dsec_file_write_ex(c, id, path, data, len, &o, err);
}

/* Files move in pages that stay well under the bus's payload limit: the node
 * answers a read with at most this much, and a write bigger than this goes
 * as a first message and appends. */
#define FILE_PAGE (4u << 20)

static int write_one(dsec_client *c, const char *id, const dsec_msg_file_write *m,
                     dsec_decoder *dec, dsec_err *err)
{
    dsec_msg *keep = NULL;
    dsec_msg_file_data r;
    int rc = dsec__client_sbx_call(c, id, "write", DSEC_MSG_FILE_WRITE, m, DSEC_MSG_FILE_DATA, dec,
                                   &keep, &r, err);
    dsec_msg_free(keep);
    return rc;
}

int dsec_file_write_ex(dsec_client *c, const char *id, const char *path, const void *data,
                       size_t len, const dsec_write_opts *opts, dsec_err *err)
{
    dsec_write_opts none = {0};
    if (opts == NULL)
        opts = &none;
    /* A write recorded in the trajectory log is one step: one message, so a
     * re-issued step is either wholly skipped or wholly run. */
    if (opts->rollout_id != NULL && len > FILE_PAGE)
        return dsec_err_set(
            err, DSEC_E_TOO_LARGE, 0,
            "writing %s in %s: a write recorded in the trajectory log (step %" PRIu64
            ") holds at most %u bytes, and this one has %zu; write it without a "
            "step, or in several steps",
            path, id, opts->step, FILE_PAGE, len);
    /* a whole file of more than a page: an upload, published at once when it all arrived */
    if (len > FILE_PAGE && !opts->append && opts->rollout_id == NULL)
        return dsec__file_upload_mem(c, id, path, data, len, opts->mode, err);
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    const uint8_t *p = data;
    size_t off = 0;
    int rc = 0;
    do {
        size_t n = len - off < FILE_PAGE ? len - off : FILE_PAGE;
        dsec_msg_file_write m = {.id = id,
                                 .path = path,
                                 .data = {p + off, n},
                                 .mode = opts->mode,
                                 .append = opts->append || off > 0,
                                 .rollout_id = opts->rollout_id,
                                 .step = opts->step};
        rc = write_one(c, id, &m, dec, err);
        if (rc < 0 && off > 0)
            dsec_err_wrap(err, "only the first %zu of the %zu bytes written reached %s in %s", off,
                          len, path, id);
        off += n;
    } while (rc == 0 && off < len);
    dsec_decoder_free(dec);
    return rc;
}

int dsec_file_read_pages(dsec_client *c, const char *id, const char *path, dsec_file_page_fn fn,
                         void *ud, dsec_err *err)
{
    return dsec_file_download(c, id, path, NULL, fn, ud, NULL, err);
}

struct read_all {
    uint8_t *buf;
    size_t cap, len;
};

/* Gathers the pages; the first one says the file's size, so the buffer is
 * allocated once when that size is sane. */
static int read_all_page(void *ud, const uint8_t *data, size_t len, uint64_t size)
{
    struct read_all *ra = ud;
    if (ra->buf == NULL && size < SIZE_MAX / 2 && (ra->buf = dsec_malloc((size_t)size + 1)) != NULL)
        ra->cap = (size_t)size + 1;
    if (ra->len + len + 1 > ra->cap) {
        size_t ncap = ra->cap ? ra->cap : 1;
        while (ncap < ra->len + len + 1)
            ncap *= 2;
        uint8_t *nb = dsec_realloc(ra->buf, ncap);
        if (nb == NULL) {
            errno = ENOMEM;
            return -1;
        }
        ra->buf = nb;
        ra->cap = ncap;
    }
    if (len)
        memcpy(ra->buf + ra->len, data, len);
    ra->len += len;
    ra->buf[ra->len] = 0;
    return 0;
}

int dsec_file_read(dsec_client *c, const char *id, const char *path, uint8_t **data, size_t *len,
                   dsec_err *err)
{
    *data = NULL;
    *len = 0;
    struct read_all ra = {0};
    if (dsec_file_read_pages(c, id, path, read_all_page, &ra, err) < 0) {
        dsec_free(ra.buf);
        return -1;
    }
    *data = ra.buf;
    *len = ra.len;
    return 0;
}

int dsec_file_list(dsec_client *c, const char *id, const char *path, dsec_dirent **entries,
                   size_t *n, dsec_err *err)
{
    dsec_msg_file_list m = {.id = id, .path = path};
    *entries = NULL;
    *n = 0;
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_msg *keep = NULL;
    dsec_msg_file_list_reply r;
    int rc = dsec__client_sbx_call(c, id, "ls", DSEC_MSG_FILE_LIST, &m, DSEC_MSG_FILE_LIST_REPLY,
                                   dec, &keep, &r, err);
    if (rc == 0 && r.entries.n > 0) {
        dsec_dirent *e = dsec_calloc(r.entries.n, sizeof *e);
        const dsec_msg_file_entry *src = r.entries.items;
        for (uint32_t i = 0; e != NULL && i < r.entries.n; i++) {
            e[i].name = dsec_strdup(src[i].name);
            dsec__client_copy_str(e[i].kind, sizeof e[i].kind, src[i].kind);
            e[i].size = src[i].size;
            e[i].mode = src[i].mode;
            e[i].mtime = src[i].mtime;
            if (e[i].name == NULL) {
                dsec_dirents_free(e, i);
                e = NULL;
            }
        }
        if (e == NULL)
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        else {
            *entries = e;
            *n = r.entries.n;
        }
    }
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

void dsec_dirents_free(dsec_dirent *entries, size_t n)
{
    for (size_t i = 0; entries != NULL && i < n; i++)
        dsec_free(entries[i].name);
    dsec_free(entries);
}
