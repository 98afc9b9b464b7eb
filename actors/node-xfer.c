/* node-xfer.c - uploads (hidden temporary file, sha256, atomic rename), hashed downloads, and
 * mkdir, stat, rename and remove of one sandbox's files. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "actors/node-int.h"
#include "actors/wire.h"
#include "dsec/alloc.h"
#include "dsec/log.h"
#include "dsec/sha256.h"

/*
 * The sandbox's operations run one at a time, so the state of one transfer is only ever used
 * by the thread running that sandbox's current operation. The list itself is shared by all
 * sandboxes of the process: an entry is taken out of it while it is used and put back after.
 * The state is a speed-up, never the truth: when it is gone (a node restart, a sweep), the
 * temporary file's size says how much an upload holds, and the file itself is hashed again.
 */

/* an upload or a read untouched this long is forgotten: a little less than the agent waits
 * before it removes a stale upload's file (600 s), so the node never trusts a state whose file
 * is gone */
#define XFER_STALE_NS (590ull * 1000000000ull)
#define XFER_FORGET_NS (86400ull * 1000000000ull) /* any transfer's state, at the latest */
#define XFER_PAGE (4u << 20)                      /* hashing the file again reads it in these */
#define UPLOAD_PREFIX ".dsec-upload-"             /* the agent's DSEC__AGENT_UPLOAD_PREFIX */

struct xstate {
    struct xstate *next;
    char sbx[DSEC_SBX_ID_LEN_MAX + 1];
    char *key; /* upload: the temporary file's path; read: the file's path */
    bool read;
    uint64_t at;   /* upload: bytes the temporary file holds; read: the next offset */
    uint64_t size; /* read: the file's size at offset 0 */
    bool hashed;   /* h covers [0, at) */
    dsec_sha256 h;
    uint64_t touched_ns;
};

static pthread_mutex_t xmu = PTHREAD_MUTEX_INITIALIZER;
static struct xstate *xlist;

static void xstate_free(struct xstate *x)
{
    if (x == NULL)
        return;
    dsec_free(x->key);
    dsec_free(x);
}

static struct xstate *xstate_new(const char *sbx, bool read, const char *key)
{
    struct xstate *x = dsec_calloc(1, sizeof *x);
    if (x == NULL || (x->key = dsec_strdup(key)) == NULL) {
        dsec_free(x);
        return NULL;
    }
    snprintf(x->sbx, sizeof x->sbx, "%s", sbx);
    x->read = read;
    x->hashed = true;
    dsec_sha256_init(&x->h);
    return x;
}

/* Take the state of sbx's transfer key out of the list (a read's only when it goes on at
 * offset at); NULL when there is none. */
static struct xstate *xstate_take(const char *sbx, bool read, const char *key, uint64_t at)
{
    pthread_mutex_lock(&xmu);
    struct xstate *x = NULL;
    for (struct xstate **pp = &xlist; *pp; pp = &(*pp)->next) {
        struct xstate *e = *pp;
        if (e->read == read && strcmp(e->sbx, sbx) == 0 && strcmp(e->key, key) == 0 &&
            (!read || e->at == at)) {
            *pp = e->next;
            x = e;
            break;
        }
    }
    pthread_mutex_unlock(&xmu);
    return x;
}

static void xstate_put(struct xstate *x)
{
    if (x == NULL)
        return;
    x->touched_ns = dsec_wall_ns();
    pthread_mutex_lock(&xmu);
    x->next = xlist;
    xlist = x;
    pthread_mutex_unlock(&xmu);
}

/* Forget the transfers nobody touched for XFER_STALE_NS. The temporary files of this
 * sandbox's stale uploads are removed here (its operation runs, so its handle may be used);
 * other sandboxes' are their agent's to sweep, or go with their sandbox. s NULL: forget
 * only, removing nothing (a read's turn). */
static void xstate_sweep(dsec_node *n, struct sbx *s)
{
    uint64_t now = dsec_wall_ns();
    struct xstate *stale = NULL;
    pthread_mutex_lock(&xmu);
    for (struct xstate **pp = &xlist; *pp;) {
        struct xstate *e = *pp;
        /* another sandbox's stale upload is kept (small) until its own next upload removes
         * its temporary file, unless its sandbox is surely gone */
        bool mine = s != NULL && strcmp(e->sbx, s->id) == 0;
        uint64_t limit = e->read || mine ? XFER_STALE_NS : XFER_FORGET_NS;
        if (now - e->touched_ns < limit) {
            pp = &e->next;
            continue;
        }
        *pp = e->next;
        e->next = stale;
        stale = e;
    }
    pthread_mutex_unlock(&xmu);
    while (stale != NULL) {
        struct xstate *e = stale;
        stale = e->next;
        if (!e->read && s != NULL && strcmp(e->sbx, s->id) == 0) {
            dsec_err err;
            dsec_file_op op = {.kind = DSEC_FOP_REMOVE, .path = e->key};
            if (dsec_backend_file_op(s->be, s->h, &op, NULL, &err) < 0 &&
                err.code != DSEC_E_NOT_FOUND)
                dsec_log_warn("dsec-node %s: removing the stale upload %s in %s: %s", n->name,
                              e->key, s->id, err.msg);
        }
        xstate_free(e);
    }
}

static bool hex_ok(const char *h)
{
    if (strlen(h) != 2 * DSEC_SHA256_LEN)
        return false;
    for (; *h; h++)
        if (!((*h >= '0' && *h <= '9') || (*h >= 'a' && *h <= 'f')))
            return false;
    return true;
}

static bool upload_id_ok(const char *u)
{
    size_t n = strlen(u);
    if (n == 0 || n > DSEC_NAME_LEN_MAX)
        return false;
    for (; *u; u++)
        if (!((*u >= 'a' && *u <= 'z') || (*u >= 'A' && *u <= 'Z') || (*u >= '0' && *u <= '9') ||
              *u == '_' || *u == '-'))
            return false;
    return true;
}

/* Hash the first len bytes of path into h, reading it in pages (the state was lost). */
static int hash_file(struct sbx *s, const char *path, uint64_t len, dsec_sha256 *h, dsec_err *err)
{
    dsec_sha256_init(h);
    uint64_t off = 0;
    while (off < len) {
        uint64_t want = len - off < XFER_PAGE ? len - off : XFER_PAGE;
        dsec_file_data d = {0};
        if (dsec_backend_file_read(s->be, s->h, path, off, want, &d, err) < 0)
            return dsec_err_wrap(err, "hashing %s again", path);
        if (d.len == 0) {
            dsec_free(d.data);
            return dsec_err_set(err, DSEC_E_STATE, 0,
                                "hashing %s again: it ended at %" PRIu64 " of %" PRIu64 " bytes",
                                path, off, len);
        }
        dsec_sha256_update(h, d.data, d.len);
        off += d.len;
        dsec_free(d.data);
    }
    return 0;
}

/* stat path: 1 and *st when it is there, 0 when it is not, -1 on error. */
static int stat_of(struct sbx *s, const char *path, dsec_file_entry *st, dsec_err *err)
{
    dsec_file_op op = {.kind = DSEC_FOP_STAT, .path = path};
    if (dsec_backend_file_op(s->be, s->h, &op, st, err) == 0) {
        dsec_free(st->name);
        st->name = NULL;
        return 1;
    }
    return err->code == DSEC_E_NOT_FOUND ? 0 : -1;
}

static void remove_quietly(struct sbx *s, const char *path)
{
    dsec_err err;
    dsec_file_op op = {.kind = DSEC_FOP_REMOVE, .path = path};
    (void)dsec_backend_file_op(s->be, s->h, &op, NULL, &err);
}

static void reply_data(dsec_node *n, dsec_msg *m, struct sbx *s, const char *path, uint64_t size,
                       bool eof, const char *sha256)
{
    dsec_err err;
    dsec_msg_file_data out = {
        .id = s->id, .path = path, .size = size, .eof = eof, .sha256 = sha256};
    if (dsec_wire_reply(n->actor, m, DSEC_MSG_FILE_DATA, &out, &err) < 0)
        dsec_wire_error(n->actor, m, &err);
}

struct write_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int rc;
    dsec_err err;
};

static void write_waited(void *ud, int rc, dsec_file_data *data, dsec_err *err)
{
    (void)data;
    struct write_wait *ww = ud;
    pthread_mutex_lock(&ww->mu);
    ww->rc = rc;
    if (rc < 0 && err != NULL)
        ww->err = *err;
    ww->done = true;
    pthread_cond_signal(&ww->cv);
    pthread_mutex_unlock(&ww->mu);
}

/* Write a chunk to the sandbox and, at the same time, hash it into h (NULL: no hash): where
 * the backend moves the bytes on its loop, this thread hashes meanwhile instead of after. */
static int write_hashing(struct sbx *s, const char *path, const uint8_t *p, size_t len,
                         uint32_t mode, bool append, dsec_sha256 *h, dsec_err *err)
{
    if (!dsec_backend_files_async(s->be) || dsec_backend_instant(s->be)) {
        if (dsec_backend_file_write(s->be, s->h, path, p, len, mode, append, err) < 0)
            return -1;
        if (h != NULL)
            dsec_sha256_update(h, p, len);
        return 0;
    }
    struct write_wait ww = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    if (dsec_backend_file_write_start(s->be, s->h, path, p, len, mode, append, write_waited, &ww,
                                      err) < 0)
        return -1;
    if (h != NULL)
        dsec_sha256_update(h, p, len);
    pthread_mutex_lock(&ww.mu);
    while (!ww.done)
        pthread_cond_wait(&ww.cv, &ww.mu);
    pthread_mutex_unlock(&ww.mu);
    pthread_cond_destroy(&ww.cv);
    pthread_mutex_destroy(&ww.mu);
    if (ww.rc < 0) {
        *err = ww.err;
        return -1;
    }
    return 0;
}

bool dsec__node_is_upload(const dsec_msg_file_write *w)
{
    return w->upload != NULL || w->commit || w->resume || w->sha256 != NULL || w->offset != 0 ||
           w->size != 0;
}

/* The fields of an upload's chunk that do not go together; false when answered so. */
static bool upload_ok(dsec_node *n, dsec_msg *m, const dsec_msg_file_write *w)
{
    if (w->upload == NULL) {
        dsec__node_reply_bad(n, m, "upload",
                             "file_write: offset, commit, sha256, size and resume belong to an "
                             "upload: name it with upload");
        return false;
    }
    if (!upload_id_ok(w->upload)) {
        dsec__node_reply_bad(n, m, "upload",
                             "upload \"%s\": use 1-64 characters from A-Z a-z 0-9 _ -", w->upload);
        return false;
    }
    if (w->append) {
        dsec__node_reply_bad(n, m, "append",
                             "upload %s: append does not mix with an upload (each chunk goes at "
                             "its offset)",
                             w->upload);
        return false;
    }
    if (w->rollout_id != NULL) {
        dsec__node_reply_bad(n, m, "rollout_id",
                             "upload %s: an upload is not logged in the trajectory log (a logged "
                             "write is one file_write of at most 4 MiB)",
                             w->upload);
        return false;
    }
    if (w->sha256 != NULL && !hex_ok(w->sha256)) {
        dsec__node_reply_bad(n, m, "sha256",
                             "upload %s: sha256 \"%s\" is not 64 lowercase hex digits", w->upload,
                             w->sha256);
        return false;
    }
    if (w->commit && w->sha256 == NULL) {
        dsec__node_reply_bad(n, m, "sha256",
                             "upload %s: commit needs sha256 (and size) of the whole file",
                             w->upload);
        return false;
    }
    if (w->resume && (w->commit || w->data.len > 0)) {
        dsec__node_reply_bad(n, m, "resume",
                             "upload %s: a resume probe carries no data and no commit", w->upload);
        return false;
    }
    return true;
}

/* What is known of the upload into tmp: its kept state, or else what the temporary file holds
 * (its hash is lost then); NULL when answered with an error. */
static struct xstate *upload_state(dsec_node *n, dsec_msg *m, struct sbx *s,
                                   const dsec_msg_file_write *w, const char *tmp)
{
    dsec_err err;
    struct xstate *x = xstate_take(s->id, false, tmp, 0);
    if (x == NULL && w->offset == 0 && !w->resume) { /* a start: it writes the file anew */
        if ((x = xstate_new(s->id, false, tmp)) == NULL)
            dsec__node_reply_err(n, m, DSEC_E_NOMEM, "out of memory");
        return x;
    }
    if (x == NULL) {
        /* no state: what the temporary file holds is the truth (its hash is lost) */
        dsec_file_entry st;
        int there = stat_of(s, tmp, &st, &err);
        if (there < 0) {
            dsec_err_wrap(&err, "upload %s of %s in %s", w->upload, w->path, s->id);
            dsec__node_reply_backend(n, m, &err, "path");
            return NULL;
        }
        if ((x = xstate_new(s->id, false, tmp)) == NULL) {
            dsec__node_reply_err(n, m, DSEC_E_NOMEM, "out of memory");
            return NULL;
        }
        if (there && st.kind == DSEC_FILE_REG && st.size > 0) {
            x->at = st.size;
            x->hashed = false;
        }
    }
    return x;
}

/* The chunk's bytes into tmp at its offset, hashed on while the hash is still known; -1 when
 * it failed: x freed, answered. */
static int upload_write(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_msg_file_write *w,
                        const char *tmp, struct xstate *x)
{
    dsec_err err;
    /* offset 0 starts (or starts again): the temporary file is created with the final
     * mode, or the mode of the file it replaces */
    uint32_t mode = (uint32_t)w->mode;
    if (w->offset == 0 && mode == 0) {
        dsec_file_entry st;
        mode = stat_of(s, w->path, &st, &err) == 1 && st.kind == DSEC_FILE_REG ? st.mode : 0644;
    }
    dsec_sha256 h = x->h;
    if (w->offset == 0)
        dsec_sha256_init(&h);
    bool hash_it = w->offset == 0 || x->hashed;
    int wrc = write_hashing(s, tmp, w->data.ptr, w->data.len, mode, w->offset > 0,
                            hash_it ? &h : NULL, &err);
    if (wrc < 0) {
        /* what it holds now is unknown: the next chunk or probe asks the file */
        xstate_free(x);
        dsec_err_wrap(&err, "upload %s of %s in %s: writing %s", w->upload, w->path, s->id, tmp);
        dsec__node_reply_backend(n, m, &err, "path");
        return -1;
    }
    x->hashed = hash_it;
    x->h = h;
    x->at = w->offset + w->data.len;
    return 0;
}

/* commit: what the temporary file holds must be the whole file, then it takes the
 * target's name in one rename. x is released here. */
static void upload_commit(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_msg_file_write *w,
                          const char *tmp, struct xstate *x)
{
    dsec_err err;
    dsec_file_entry st;
    int there = stat_of(s, tmp, &st, &err);
    if (there <= 0) {
        xstate_free(x);
        if (there == 0)
            dsec__node_reply_err(n, m, DSEC_E_NOT_FOUND,
                                 "upload %s of %s in %s: nothing to commit (no chunk arrived, or "
                                 "the upload went stale and was removed)",
                                 w->upload, w->path, s->id);
        else
            dsec__node_reply_backend(n, m, &err, "path");
        return;
    }
    if (st.size != x->at) { /* someone else wrote it: trust the file */
        x->at = st.size;
        x->hashed = false;
    }
    char why[256] = "";
    if (x->at != w->size)
        snprintf(why, sizeof why, "size: expected %" PRIu64 " bytes, the upload holds %" PRIu64,
                 w->size, x->at);
    char hex[2 * DSEC_SHA256_LEN + 1] = "";
    if (why[0] == '\0') {
        if (!x->hashed && hash_file(s, tmp, x->at, &x->h, &err) < 0) {
            xstate_put(x);
            dsec_err_wrap(&err, "upload %s of %s in %s", w->upload, w->path, s->id);
            dsec__node_reply_backend(n, m, &err, "path");
            return;
        }
        uint8_t d[DSEC_SHA256_LEN];
        dsec_sha256 h = x->h;
        dsec_sha256_final(&h, d);
        dsec_sha256_hex(d, hex);
        if (strcmp(hex, w->sha256) != 0)
            snprintf(why, sizeof why, "sha256: expected %s, the upload hashes to %s", w->sha256,
                     hex);
    }
    if (why[0] != '\0') {
        remove_quietly(s, tmp);
        xstate_free(x);
        dsec__node_reply_bad(n, m, why[0] == 's' && why[1] == 'i' ? "size" : "sha256",
                             "upload %s of %s in %s: %s; the upload was removed, send it again",
                             w->upload, w->path, s->id, why);
        return;
    }
    dsec_file_op op = {.kind = DSEC_FOP_RENAME, .path = tmp, .to = w->path, .sync = false};
    if (dsec_backend_file_op(s->be, s->h, &op, NULL, &err) < 0) {
        xstate_put(x); /* the commit may be sent again */
        dsec_err_wrap(&err, "upload %s: publishing %s in %s", w->upload, w->path, s->id);
        dsec__node_reply_backend(n, m, &err, "path");
        return;
    }
    reply_data(n, m, s, w->path, x->at, true, hex);
    xstate_free(x);
}

void dsec__node_do_upload(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_msg_file_write *w)
{
    if (!upload_ok(n, m, w))
        return;
    const char *slash = strrchr(w->path, '/');
    if (w->path[0] != '/' || slash == NULL || slash[1] == '\0') {
        dsec__node_reply_bad(n, m, "path", "upload %s: path \"%s\" is not an absolute file path",
                             w->upload, w->path);
        return;
    }
    size_t dl = (size_t)(slash - w->path);
    size_t tl = dl + 1 + sizeof UPLOAD_PREFIX + strlen(w->upload);
    char *tmp = dsec_malloc(tl);
    if (tmp == NULL) {
        dsec__node_reply_err(n, m, DSEC_E_NOMEM, "out of memory");
        return;
    }
    snprintf(tmp, tl, "%.*s/%s%s", (int)dl, w->path, UPLOAD_PREFIX, w->upload);
    xstate_sweep(n, s);

    struct xstate *x = upload_state(n, m, s, w, tmp);
    if (x == NULL)
        goto out;
    if (w->resume) {
        reply_data(n, m, s, w->path, x->at, false, NULL);
        xstate_put(x);
        goto out;
    }
    if (w->offset != 0 && w->offset != x->at) {
        dsec__node_reply_bad(n, m, "offset",
                             "upload %s: chunk at offset %" PRIu64 " but the upload holds %" PRIu64
                             " bytes; resume from %" PRIu64,
                             w->upload, w->offset, x->at, x->at);
        xstate_put(x);
        goto out;
    }
    if ((w->offset == 0 || w->data.len > 0) && upload_write(n, m, s, w, tmp, x) < 0)
        goto out;
    if (!w->commit) {
        reply_data(n, m, s, w->path, x->at, false, NULL);
        xstate_put(x);
        goto out;
    }
    upload_commit(n, m, s, w, tmp, x);
out:
    dsec_free(tmp);
}

/* ---- hashed downloads ------------------------------------------------------------------ */

struct dsec__read_hash {
    struct xstate *x;
};

dsec__read_hash *dsec__node_read_hash_begin(struct sbx *s, const char *path, uint64_t offset)
{
    if (offset == 0)
        xstate_sweep(NULL, NULL); /* readers that stopped half way */
    struct xstate *x = xstate_take(s->id, true, path, offset);
    if (x == NULL && offset == 0)
        x = xstate_new(s->id, true, path);
    if (x == NULL)
        return NULL;
    dsec__read_hash *r = dsec_malloc(sizeof *r);
    if (r == NULL) {
        xstate_put(x);
        return NULL;
    }
    r->x = x;
    return r;
}

void dsec__node_read_hash_page(dsec__read_hash *r, uint64_t offset, const dsec_file_data *d,
                               char hex[2 * DSEC_SHA256_LEN + 1])
{
    hex[0] = '\0';
    if (r == NULL)
        return;
    struct xstate *x = r->x;
    dsec_free(r);
    if (offset == 0)
        x->size = d->size;
    if (d->size != x->size) { /* it changed under the reader: the client says so */
        xstate_free(x);
        return;
    }
    dsec_sha256_update(&x->h, d->data, d->len);
    x->at = offset + d->len;
    if (!d->eof) {
        xstate_put(x);
        return;
    }
    if (x->at == x->size) {
        uint8_t dg[DSEC_SHA256_LEN];
        dsec_sha256_final(&x->h, dg);
        dsec_sha256_hex(dg, hex);
    }
    xstate_free(x);
}

void dsec__node_read_hash_abort(dsec__read_hash *r)
{
    if (r == NULL)
        return;
    xstate_free(r->x);
    dsec_free(r);
}

int dsec__node_read_hash_file(struct sbx *s, const char *path, uint64_t size,
                              char hex[2 * DSEC_SHA256_LEN + 1], dsec_err *err)
{
    dsec_sha256 h;
    if (hash_file(s, path, size, &h, err) < 0)
        return -1;
    uint8_t dg[DSEC_SHA256_LEN];
    dsec_sha256_final(&h, dg);
    dsec_sha256_hex(dg, hex);
    return 0;
}

/* ---- mkdir, stat, rename, remove ------------------------------------------------------- */

void dsec__node_do_file_op(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_err err;
    dsec_msg_file_op rq;
    if (!dsec__node_decode_for_running(n, m, s, DSEC_MSG_FILE_OP, &rq))
        return;
    static const struct {
        const char *name;
        dsec_file_op_kind kind;
    } kinds[] = {{"mkdir", DSEC_FOP_MKDIR},
                 {"stat", DSEC_FOP_STAT},
                 {"rename", DSEC_FOP_RENAME},
                 {"remove", DSEC_FOP_REMOVE}};
    dsec_file_op op = {.path = rq.path,
                       .to = rq.to,
                       .mode = (uint32_t)rq.mode,
                       .parents = rq.parents,
                       .recursive = rq.recursive,
                       .sync = true};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcmp(rq.op, kinds[i].name) == 0)
            op.kind = kinds[i].kind;
    if (op.kind == 0) {
        dsec__node_reply_bad(n, m, "op",
                             "file_op: op \"%s\" is unknown (known: mkdir, stat, rename, remove)",
                             rq.op);
        return;
    }
    if (rq.path[0] != '/') {
        dsec__node_reply_bad(n, m, "path", "file_op %s: path \"%s\" is not absolute", rq.op,
                             rq.path);
        return;
    }
    if ((op.kind == DSEC_FOP_RENAME) != (rq.to != NULL)) {
        dsec__node_reply_bad(n, m, "to",
                             op.kind == DSEC_FOP_RENAME ? "file_op rename: to (the new path) is "
                                                          "missing"
                                                        : "file_op %s: only rename takes to",
                             rq.op);
        return;
    }
    if (rq.to != NULL && rq.to[0] != '/') {
        dsec__node_reply_bad(n, m, "to", "file_op rename: to \"%s\" is not absolute", rq.to);
        return;
    }
    if (op.kind != DSEC_FOP_MKDIR && (rq.mode != 0 || rq.parents)) {
        dsec__node_reply_bad(n, m, rq.mode != 0 ? "mode" : "parents",
                             "file_op %s: only mkdir takes mode and parents", rq.op);
        return;
    }
    if (op.kind != DSEC_FOP_REMOVE && rq.recursive) {
        dsec__node_reply_bad(n, m, "recursive", "file_op %s: only remove takes recursive", rq.op);
        return;
    }
    dsec_file_entry st = {0};
    if (dsec_backend_file_op(s->be, s->h, &op, &st, &err) < 0) {
        dsec_err_wrap(&err, "%s %s in %s", rq.op, rq.path, s->id);
        dsec__node_reply_backend(n, m, &err, "path");
        return;
    }
    dsec_msg_file_entry e = {.name = st.name ? st.name : "",
                             .kind = dsec_file_kind_name(st.kind),
                             .size = st.size,
                             .mode = st.mode,
                             .mtime = st.mtime};
    dsec_msg_file_list_reply out = {.id = s->id,
                                    .path = rq.to ? rq.to : rq.path,
                                    .entries = {&e, op.kind == DSEC_FOP_STAT ? 1u : 0u}};
    if (dsec_wire_reply(n->actor, m, DSEC_MSG_FILE_LIST_REPLY, &out, &err) < 0)
        dsec_wire_error(n->actor, m, &err);
    dsec_free(st.name);
}
