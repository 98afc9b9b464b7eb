/* node-ops.c - one sandbox's operations (files, destroy, fork, pause, snapshot, ...), off the bus.
 */
#define _GNU_SOURCE /* nftw */
#include "actors/node-int.h"

#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "actors/wire.h"
#include "codecs/subjects.h"
#include "dsec/alloc.h"
#include "dsec/layers.h"
#include "dsec/log.h"

/* ---- operations on one sandbox ------------------------------------------------ */

/* dsec.v1.<tenant>.sbx.<node>.<id>.<op> */
struct target {
    char buf[256];
    const char *tok[8];
    const char *tenant, *id, *op;
};

static int parse_target(dsec_msg *m, struct target *t)
{
    int k = dsec_wire_tokens(dsec_msg_subject(m), t->buf, sizeof t->buf, t->tok, 8);
    if (k != 7)
        return -1;
    t->tenant = t->tok[2];
    t->id = t->tok[5];
    t->op = t->tok[6];
    return 0;
}

/* Why the reaper destroys a sandbox (enum reap_reason), as its event and its note say. */
static const char *reap_text(uint8_t why)
{
    return why == REAP_TTL    ? "max lifetime reached"
           : why == REAP_IDLE ? "idle timeout"
           : why == REAP_LOST ? "its node was declared lost and its owner told so"
           : why == REAP_SUPERSEDED
               ? "a retry of its create was kept on another node (its answer was lost)"
               : "destroyed by request";
}

/* Look up the sandbox and check that the caller's tenant owns it. One the node destroyed on
 * its own account is not found either, but the answer says why (its owner may never have
 * heard the event). */
static struct sbx *target_sbx(dsec_node *n, dsec_msg *m, const struct target *t)
{
    char why[128] = "";
    uint64_t ago_s = 0;
    pthread_mutex_lock(&n->mu);
    struct sbx *s = dsec__node_find_id(n, t->id);
    if (s == NULL) {
        const struct gone *g = dsec__node_find_gone(n, t->id);
        if (g != NULL && (g->tenant[0] == '\0' || strcmp(g->tenant, t->tenant) == 0)) {
            snprintf(why, sizeof why, "%s", g->reason);
            uint64_t now = dsec_wall_ns();
            ago_s = now > g->at_ns ? (now - g->at_ns) / 1000000000ull : 0;
        }
    } else if (s->state == ST_STOPPING && strcmp(s->tenant, t->tenant) == 0) {
        snprintf(why, sizeof why, "%s", reap_text(s->reap)); /* being destroyed */
    }
    pthread_mutex_unlock(&n->mu);
    if (s == NULL || s->state == ST_GONE || s->state == ST_STOPPING) {
        if (why[0] != '\0')
            dsec__node_reply_err(n, m, DSEC_E_NOT_FOUND,
                                 "sandbox %s on node %s is gone: %s (%" PRIu64 " s ago)", t->id,
                                 n->name, why, ago_s);
        else
            dsec__node_reply_err(n, m, DSEC_E_NOT_FOUND, "no sandbox %s on node %s", t->id,
                                 n->name);
        return NULL;
    }
    if (strcmp(s->tenant, t->tenant) != 0) {
        dsec__node_reply_err(n, m, DSEC_E_PERMISSION, "sandbox %s does not belong to tenant %s",
                             t->id, t->tenant);
        return NULL;
    }
    return s;
}

/* Resume a sandbox the node froze: the next operation on it does this, so
 * the caller never sees the freeze. It takes its memory back (what is
 * free of it, if memory is still short). */
static int thaw(dsec_node *n, struct sbx *s, dsec_err *err)
{
    if (dsec_backend_resume(s->be, s->h, err) < 0)
        return dsec_err_wrap(err, "resuming frozen %s", s->id);
    pthread_mutex_lock(&n->mu);
    uint64_t take = n->mem_free < s->memory_mb ? n->mem_free : s->memory_mb;
    n->mem_free -= take;
    s->mem_owed = (uint32_t)(s->memory_mb - take);
    s->frozen = false;
    n->dirty = true;
    int prev = s->state;
    s->state = ST_RUNNING;
    dsec__node_event_locked(n, s, prev, ST_RUNNING, "resumed by an operation");
    pthread_mutex_unlock(&n->mu);
    return 0;
}

bool dsec__node_check_running(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    if (s->state == ST_RUNNING)
        return true;
    if (s->state == ST_PAUSED && s->frozen) {
        dsec_err err;
        if (thaw(n, s, &err) == 0)
            return true;
        dsec_wire_error(n->actor, m, &err);
        return false;
    }
    dsec__node_reply_err(n, m, DSEC_E_STATE, "sandbox %s is %s; %s", s->id,
                         dsec__node_state_names[s->state],
                         s->state == ST_PAUSED ? "resume it first" : "it cannot run commands");
    return false;
}

/* Decode an operation on a running sandbox; answers the error itself and
 * returns false when the operation cannot go on. */
bool dsec__node_decode_for_running(dsec_node *n, dsec_msg *m, struct sbx *s, int type, void *out)
{
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), type, dsec_msg_data(m), dsec_msg_len(m), out, &err) < 0) {
        dsec_wire_error(n->actor, m, &err);
        return false;
    }
    /* exec and the file messages start with the sandbox id; it must be the
     * subject's, which the tenant's permissions were checked against */
    const char *id = *(const char *const *)out;
    if (strcmp(id, s->id) != 0) {
        dsec__node_reply_bad(n, m, "id", "%s: id %s does not match the subject's %s",
                             dsec_msg_type_name(type), id, s->id);
        return false;
    }
    if (!dsec__node_check_running(n, m, s))
        return false;
    dsec__node_touch(s);
    return true;
}

/* A transfer that runs without a thread: what its answer needs, copied, since the
 * request's decoded form belongs to the thread that decoded it (the written bytes stay in
 * the deferred request). */
struct xfer_end {
    dsec_node *n;
    struct sbx *s;
    dsec_deferred *d;
    char *path;
    bool read;
    size_t len; /* a write's */
    bool append;
    char *rollout_id; /* a logged write */
    uint64_t step;
    uint8_t hash[DSEC_SHA256_LEN];
    bool sha256;         /* a read that reports the file's digest at its end */
    uint64_t offset;     /* a read's */
    dsec__read_hash *rh; /* its running hash */
};

static void xfer_end_free(struct xfer_end *x)
{
    dsec_free(x->path);
    dsec_free(x->rollout_id);
    dsec_free(x);
}

/* The write ended (rc) or failed: its trajectory record, then its answer. */
static void write_finish(dsec_node *n, dsec_msg *m, struct sbx *s, const char *path, size_t len,
                         bool append, const char *rollout_id, uint64_t step, const uint8_t *hash,
                         int rc, dsec_err *err)
{
    if (rc < 0) {
        dsec_err_wrap(err, "writing %s in %s", path, s->id);
        dsec__node_reply_backend(n, m, err, "path");
        return;
    }
    dsec_err lerr;
    if (rollout_id != NULL) {
        const char *argv[] = {DSEC_TRAJ_WRITE_ARGV0, path, append ? "append" : "replace"};
        dsec_traj_record rec = {0};
        rec.rollout_id = (char *)rollout_id;
        rec.step = step;
        rec.req_id = (char *)"";
        rec.sandbox_id = s->id;
        rec.argv = (char **)argv;
        rec.n_argv = 3;
        rec.request_hash = (dsec_record_bytes){DSEC_SHA256_LEN, (uint8_t *)hash};
        if (dsec__node_traj_log(n, &rec, &lerr) < 0) {
            dsec_wire_error(n->actor, m, &lerr);
            return;
        }
    }
    dsec_msg_file_data out = {.id = s->id, .path = path, .size = len, .eof = true};
    if (dsec_wire_reply(n->actor, m, DSEC_MSG_FILE_DATA, &out, &lerr) < 0)
        dsec_wire_error(n->actor, m, &lerr);
}

static void read_finish(dsec_node *n, dsec_msg *m, struct sbx *s, const char *path, int rc,
                        const dsec_file_data *d, bool sha256, uint64_t offset, dsec__read_hash *rh,
                        dsec_err *err)
{
    if (rc < 0) {
        dsec__node_read_hash_abort(rh);
        dsec_err_wrap(err, "reading %s in %s", path, s->id);
        dsec__node_reply_backend(n, m, err, "path");
        return;
    }
    dsec_err lerr;
    char hex[2 * DSEC_SHA256_LEN + 1] = "";
    if (rh != NULL) {
        dsec__node_read_hash_page(rh, offset, d, hex);
    } else if (sha256 && d->eof && offset + d->len == d->size &&
               dsec__node_read_hash_file(s, path, d->size, hex, &lerr) < 0) {
        /* the running hash was lost (a restart): the file is read again, here */
        dsec_err_wrap(&lerr, "reading %s in %s", path, s->id);
        dsec__node_reply_backend(n, m, &lerr, "path");
        return;
    }
    dsec_msg_file_data out = {.id = s->id,
                              .path = path,
                              .data = {d->data, d->len},
                              .size = d->size,
                              .eof = d->eof,
                              .sha256 = hex[0] ? hex : NULL};
    if (dsec_wire_reply(n->actor, m, DSEC_MSG_FILE_DATA, &out, &lerr) < 0)
        dsec_wire_error(n->actor, m, &lerr);
}

/* A transfer's done, on the node's loop thread: answer in the request's trace scope, then
 * let the sandbox's next operation run. */
static void xfer_done(void *ud, int rc, dsec_file_data *data, dsec_err *err)
{
    struct xfer_end *x = ud;
    dsec_msg *m = dsec_deferred_msg(x->d);
    dsec_trace_scope sc;
    dsec_deferred_trace(x->d, &sc);
    if (x->read) {
        dsec_file_data none = {0};
        read_finish(x->n, m, x->s, x->path, rc, data != NULL ? data : &none, x->sha256, x->offset,
                    x->rh, err);
        if (data != NULL)
            dsec_free(data->data);
    } else {
        write_finish(x->n, m, x->s, x->path, x->len, x->append, x->rollout_id, x->step, x->hash, rc,
                     err);
    }
    dsec_trace_leave(&sc);
    dsec_deferred *d = x->d;
    xfer_end_free(x);
    dsec_deferred_done(d);
}

/* The transfer's state when it can run without a thread (the backend has the _start ops
 * and m could be deferred); NULL: run it here. */
static struct xfer_end *xfer_begin(dsec_node *n, dsec_msg *m, struct sbx *s, const char *path)
{
    if (!dsec_backend_files_async(s->be) || dsec_backend_instant(s->be))
        return NULL;
    struct xfer_end *x = dsec_calloc(1, sizeof *x);
    if (x == NULL || (x->path = dsec_strdup(path)) == NULL ||
        (x->d = dsec_actor_defer(n->actor, m)) == NULL) {
        if (x != NULL)
            dsec_free(x->path);
        dsec_free(x);
        return NULL;
    }
    x->n = n;
    x->s = s;
    return x;
}

static void do_write(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_err err;
    dsec_msg_file_write w;
    if (!dsec__node_decode_for_running(n, m, s, DSEC_MSG_FILE_WRITE, &w))
        return;
    if (dsec__node_is_upload(&w)) {
        dsec__node_do_upload(n, m, s, &w);
        return;
    }
    uint8_t hash[DSEC_SHA256_LEN];
    if (w.rollout_id != NULL) {
        dsec_traj_record *rec;
        dsec_traj_hash_write(&w, hash);
        if (dsec__node_traj_check(n, m, w.rollout_id, w.step, hash, &rec)) {
            if (rec != NULL) {
                dsec_msg_file_data out = {
                    .id = s->id, .path = w.path, .size = w.data.len, .eof = true};
                if (dsec_wire_reply(n->actor, m, DSEC_MSG_FILE_DATA, &out, &err) < 0)
                    dsec_wire_error(n->actor, m, &err);
                dsec_traj_record_free(rec);
            }
            return;
        }
    }
    uint32_t mode = (uint32_t)(w.mode ? w.mode : 0644);
    struct xfer_end *x = xfer_begin(n, m, s, w.path);
    if (x != NULL) {
        x->len = w.data.len;
        x->append = w.append;
        x->step = w.step;
        memcpy(x->hash, hash, sizeof hash);
        if (w.rollout_id != NULL && (x->rollout_id = dsec_strdup(w.rollout_id)) == NULL) {
            dsec_err_set(&err, DSEC_E_NOMEM, ENOMEM, "out of memory");
            xfer_done(x, -1, NULL, &err);
            return;
        }
        /* the written bytes stay in the deferred request until done */
        if (dsec_backend_file_write_start(s->be, s->h, w.path, w.data.ptr, w.data.len, mode,
                                          w.append, xfer_done, x, &err) < 0)
            xfer_done(x, -1, NULL, &err); /* answered; the key is released after this handler */
        return;
    }
    int rc =
        dsec_backend_file_write(s->be, s->h, w.path, w.data.ptr, w.data.len, mode, w.append, &err);
    write_finish(n, m, s, w.path, w.data.len, w.append, w.rollout_id, w.step, hash, rc, &err);
}

static void do_read(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_err err;
    dsec_msg_file_read rq;
    if (!dsec__node_decode_for_running(n, m, s, DSEC_MSG_FILE_READ, &rq))
        return;
    /* keep the answer under the payload limit; callers page with offset */
    uint64_t max = rq.max == 0 || rq.max > (4u << 20) ? (4u << 20) : rq.max;
    /* a hashed read that cannot go on with a running hash reads here: at its end the file is
     * hashed again with reads that wait */
    dsec__read_hash *rh = rq.sha256 ? dsec__node_read_hash_begin(s, rq.path, rq.offset) : NULL;
    struct xfer_end *x = !rq.sha256 || rh != NULL ? xfer_begin(n, m, s, rq.path) : NULL;
    if (x != NULL) {
        x->read = true;
        x->sha256 = rq.sha256;
        x->offset = rq.offset;
        x->rh = rh;
        if (dsec_backend_file_read_start(s->be, s->h, rq.path, rq.offset, max, xfer_done, x, &err) <
            0)
            xfer_done(x, -1, NULL, &err);
        return;
    }
    dsec_file_data d = {0};
    int rc = dsec_backend_file_read(s->be, s->h, rq.path, rq.offset, max, &d, &err);
    read_finish(n, m, s, rq.path, rc, &d, rq.sha256, rq.offset, rh, &err);
    dsec_free(d.data);
}

static void do_list(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_err err;
    dsec_msg_file_list rq;
    if (!dsec__node_decode_for_running(n, m, s, DSEC_MSG_FILE_LIST, &rq))
        return;
    dsec_file_entry *e = NULL;
    size_t ne = 0;
    if (dsec_backend_file_list(s->be, s->h, rq.path, &e, &ne, &err) < 0) {
        dsec_err_wrap(&err, "listing %s in %s", rq.path, s->id);
        dsec__node_reply_backend(n, m, &err, "path");
        return;
    }
    dsec_msg_file_entry *items = dsec_calloc(ne ? ne : 1, sizeof *items);
    if (items == NULL) {
        dsec_file_entries_free(e, ne);
        dsec__node_reply_err(n, m, DSEC_E_NOMEM, "out of memory listing %s", rq.path);
        return;
    }
    for (size_t i = 0; i < ne; i++)
        items[i] = (dsec_msg_file_entry){.name = e[i].name,
                                         .kind = dsec_file_kind_name(e[i].kind),
                                         .size = e[i].size,
                                         .mode = e[i].mode,
                                         .mtime = e[i].mtime};
    dsec_msg_file_list_reply out = {.id = s->id, .path = rq.path, .entries = {items, (uint32_t)ne}};
    if (dsec_wire_reply(n->actor, m, DSEC_MSG_FILE_LIST_REPLY, &out, &err) < 0)
        dsec_wire_error(n->actor, m, &err);
    dsec_free(items);
    dsec_file_entries_free(e, ne);
}

void dsec__node_reply_op(dsec_node *n, dsec_msg *m, struct sbx *s, const char *state, dsec_strv ids,
                         dsec_kv info)
{
    dsec_msg_op_reply out = {.id = s->id,
                             .state = state,
                             .node = n->name,
                             .type = dsec__node_type_name(n, s->type_idx),
                             .ids = ids,
                             .info = info};
    dsec_err err;
    if (dsec_wire_reply(n->actor, m, DSEC_MSG_OP_REPLY, &out, &err) < 0)
        dsec_wire_error(n->actor, m, &err);
}

/* The rest of a destroy, once nothing runs in s (begun: its state is stopping, its side
 * calls closed). */
static void destroy_end(dsec_node *n, dsec_msg *m, struct sbx *s, const char *reason)
{
    dsec_err err;
    if (dsec_backend_destroy(s->be, s->h, &err) < 0) {
        /* the handle stays valid: keep the sandbox so a retry can finish the job */
        pthread_mutex_lock(&n->mu);
        s->side_closed = false;
        pthread_mutex_unlock(&n->mu);
        dsec__node_set_state(n, s, ST_RUNNING, err.msg);
        dsec_err_wrap(&err, "destroying %s", s->id);
        if (m != NULL)
            dsec_wire_error(n->actor, m, &err);
        return;
    }
    /* Destroyed on the node's own account, the record becomes the note that says why */
    if ((s->reap != REAP_NONE ? dsec__node_gone(n, s, reason, &err)
                              : dsec_journal_del(n->journal, s->id, &err)) < 0)
        dsec_actor_count_error(n->actor); /* re-adopt will find no sandbox and drop the record */
    pthread_mutex_lock(&n->mu);
    dsec__node_unlink_sbx(n, s);
    dsec__node_release_resources(n, s->cpu_milli, dsec__node_mem_held(s), 1, s->disk_mb);
    dsec__node_event_locked(n, s, ST_STOPPING, ST_GONE, reason);
    pthread_mutex_unlock(&n->mu);
    atomic_fetch_add(&n->destroyed, 1);
    dsec_results_drop(n->results, s->id);
    s->state = ST_GONE;
    if (m != NULL)
        dsec__node_reply_op(n, m, s, "gone", (dsec_strv){0}, (dsec_kv){0});
    dsec__node_sbx_free(s);
}

/* A destroy whose wait for the sandbox's processes (or QEMU) to end is the loop's: its message
 * is kept meanwhile, and so is the sandbox's key. */
struct destroy_wait {
    dsec_node *n;
    dsec_deferred *d;
    struct sbx *s;
    const char *reason; /* static text */
};

static void destroy_wait_end(void *ud)
{
    struct destroy_wait w = *(struct destroy_wait *)ud;
    dsec_free(ud);
    dsec_trace_scope sc;
    dsec_deferred_trace(w.d, &sc);
    destroy_end(w.n, dsec_deferred_msg(w.d), w.s, w.reason);
    dsec_trace_leave(&sc);
    dsec_deferred_done(w.d);
}

/* Nothing runs in the sandbox any more, or the wait gave up (destroy then tries itself): the
 * rest in the tenant's turn, or here when the work queue has stopped (the node is stopping). */
static void destroy_stopped(void *ud, int rc, dsec_err *err)
{
    struct destroy_wait *w = ud;
    if (rc < 0)
        dsec_log_warn("dsec-node %s: destroying %s: %s", w->n->name, w->s->id, err->msg);
    dsec_err e2;
    if (dsec_workq_submit(w->n->work, w->s->tenant,
                          dsec__node_key_of(dsec_deferred_msg(w->d), w->n), destroy_wait_end, w,
                          &e2) < 0)
        destroy_wait_end(w);
}

static void destroy_sbx(dsec_node *n, dsec_msg *m, struct sbx *s, const char *reason)
{
    dsec__node_set_state(n, s, ST_STOPPING, reason);
    dsec__node_side_close(n, s);
    struct destroy_wait *w =
        m != NULL && dsec_backend_stops_async(s->be) ? dsec_malloc(sizeof *w) : NULL;
    dsec_deferred *d = w != NULL ? dsec__node_job_keep() : NULL;
    if (d != NULL) {
        *w = (struct destroy_wait){.n = n, .d = d, .s = s, .reason = reason};
        dsec_err err;
        if (dsec_backend_stop_start(s->be, s->h, n->loop, destroy_stopped, w, &err) == 0)
            return; /* w is destroy_stopped's: it may have ended already */
    }
    dsec_free(w);
    destroy_end(n, m, s, reason); /* nothing to wait for, or the destroy waits itself */
    if (d != NULL)
        dsec_deferred_done(d);
}

int dsec__node_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) < 0 && errno != ENOENT ? -1 : 0;
}

/* Package the sandbox's state as environment name (a layer pushed to the
 * cell's registry), so a new sandbox anywhere in the cell starts from it.
 * What the backend saved on the way (a microVM's copies of its RAM and disk)
 * goes once the environment is stored: nothing on the wire restores from it,
 * and a node that kept every one would fill its disk. */
static void do_snapshot(dsec_node *n, dsec_msg *m, struct sbx *s, const char *name)
{
    dsec_err err;
    if (name == NULL || !dsec_layer_name_valid(name)) {
        dsec__node_reply_bad(n, m, "name",
                             "snapshot: \"name\" must be an environment name:version, got \"%s\"",
                             name ? name : "");
        return;
    }
    if (!dsec__node_check_running(n, m, s))
        return;
    dsec__node_touch(s);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s-%" PRIu64 ".snap", n->snap_dir, s->id, dsec_wall_ns());
    if (dsec_backend_snapshot(s->be, s->h, path, name, &err) < 0) {
        dsec_err_wrap(&err, "snapshot of %s as %s", s->id, name);
        dsec__node_reply_backend(n, m, &err, "name");
        return;
    }
    if (nftw(path, dsec__node_rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0 &&
        errno != ENOENT)
        dsec_actor_count_error(n->actor); /* left behind: the node's error counter shows it */
    const char *k[] = {"env"};
    const char *v[] = {name};
    dsec__node_reply_op(n, m, s, dsec__node_state_names[s->state], (dsec_strv){0},
                        (dsec_kv){k, v, 1});
}

static void do_status(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    char cpu[24], mem[24], disk[24], created[24], last[24], used_cpu[24], used_mem[24];
    snprintf(cpu, sizeof cpu, "%" PRIu32, s->cpu_milli);
    snprintf(mem, sizeof mem, "%" PRIu32, s->memory_mb);
    snprintf(disk, sizeof disk, "%" PRIu64, s->disk_mb);
    snprintf(created, sizeof created, "%" PRIu64, s->created_ns);
    snprintf(last, sizeof last, "%" PRIu64, (uint64_t)s->last_ns);
    char expires[24];
    pthread_mutex_lock(&n->mu); /* do_ttl and the reaper's ttl_ns */
    snprintf(expires, sizeof expires, "%" PRIu64, s->ttl_ns ? s->created_ns + s->ttl_ns : 0);
    pthread_mutex_unlock(&n->mu);
    const char *k[9] = {"cpu_milli",      "memory_mb", "disk_mb",   "created_ns",
                        "last_active_ns", "tenant",    "expires_ns"};
    const char *v[9] = {cpu, mem, disk, created, last, s->tenant, expires};
    uint32_t nkv = 7;
    dsec_sandbox_stats st;
    dsec_err err;
    if (dsec_backend_stats(s->be, s->h, &st, &err) == 0) {
        snprintf(used_cpu, sizeof used_cpu, "%" PRIu64, st.cpu_milli);
        snprintf(used_mem, sizeof used_mem, "%" PRIu64, st.memory_bytes);
        k[nkv] = "cpu_used_milli";
        v[nkv++] = used_cpu;
        k[nkv] = "memory_bytes";
        v[nkv++] = used_mem;
    }
    dsec__node_reply_op(n, m, s, dsec__node_state_names[s->state], (dsec_strv){0},
                        (dsec_kv){k, v, nkv});
}

static void do_pause_resume(dsec_node *n, dsec_msg *m, struct sbx *s, bool pause)
{
    dsec_err err;
    int want = pause ? ST_PAUSED : ST_RUNNING;
    if (!pause && s->state == ST_PAUSED && s->frozen) {
        if (thaw(n, s, &err) < 0) {
            dsec_wire_error(n->actor, m, &err);
            return;
        }
        dsec__node_touch(s);
        dsec__node_reply_op(n, m, s, dsec__node_state_names[s->state], (dsec_strv){0},
                            (dsec_kv){0});
        return;
    }
    if (s->state == want) {
        dsec__node_reply_op(n, m, s, dsec__node_state_names[s->state], (dsec_strv){0},
                            (dsec_kv){0});
        return;
    }
    if (s->state != (pause ? ST_RUNNING : ST_PAUSED)) {
        dsec__node_reply_err(n, m, DSEC_E_STATE, "cannot %s sandbox %s: it is %s",
                             pause ? "pause" : "resume", s->id, dsec__node_state_names[s->state]);
        return;
    }
    int rc = pause ? dsec_backend_pause(s->be, s->h, &err) : dsec_backend_resume(s->be, s->h, &err);
    if (rc < 0) {
        dsec_err_wrap(&err, "%s %s", pause ? "pausing" : "resuming", s->id);
        dsec_wire_error(n->actor, m, &err);
        return;
    }
    dsec__node_touch(s);
    dsec__node_set_state(n, s, want, NULL);
    if (dsec__node_journal_put(n, s, &err) < 0)
        dsec_actor_count_error(n->actor);
    dsec__node_reply_op(n, m, s, dsec__node_state_names[s->state], (dsec_strv){0}, (dsec_kv){0});
}

/* Freeze an idle pausable rollout under memory pressure: pause it and give
 * its memory back to the node's pool until an operation thaws it. */
static void do_freeze(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_err err;
    s->freezing = false;
    uint64_t idle_ns = (uint64_t)n->conf.pause_idle_ms * 1000000ull;
    if (!s->pausable || s->state != ST_RUNNING ||
        dsec__node_age_ns(dsec_wall_ns(), s->last_ns) < idle_ns) {
        dsec__node_reply_err(n, m, DSEC_E_STATE,
                             "sandbox %s is not an idle pausable rollout; not frozen", s->id);
        return;
    }
    if (dsec_backend_pause(s->be, s->h, &err) < 0) {
        dsec_err_wrap(&err, "freezing %s", s->id);
        dsec_wire_error(n->actor, m, &err);
        return;
    }
    pthread_mutex_lock(&n->mu);
    dsec__node_release_resources(n, 0, dsec__node_mem_held(s), 0, 0);
    s->mem_owed = 0;
    s->frozen = true;
    int prev = s->state;
    s->state = ST_PAUSED;
    dsec__node_event_locked(n, s, prev, ST_PAUSED, "frozen while idle under memory pressure");
    pthread_mutex_unlock(&n->mu);
    dsec__node_reply_op(n, m, s, dsec__node_state_names[s->state], (dsec_strv){0}, (dsec_kv){0});
}

/* Replace a running sandbox's network policy (a task moving to its next stage). */
static void do_net(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_strv *net)
{
    if (s->state != ST_RUNNING && s->state != ST_PAUSED) {
        dsec__node_reply_err(n, m, DSEC_E_STATE,
                             "sandbox %s is %s; its network policy cannot change", s->id,
                             dsec__node_state_names[s->state]);
        return;
    }
    dsec_err err;
    if (dsec_backend_net_set(s->be, s->h, net->v, net->n, &err) < 0) {
        dsec_err_wrap(&err, "sandbox %s", s->id);
        dsec__node_reply_backend(n, m, &err, "net");
        return;
    }
    dsec__node_touch(s);
    dsec__node_reply_op(n, m, s, dsec__node_state_names[s->state], (dsec_strv){0}, (dsec_kv){0});
}

/* Move a running sandbox's end: it now ends ttl_s seconds from now, as long as its whole
 * lifetime stays within the cell's max_ttl_s. The reaper reads ttl_ns under the node lock. */
static void do_ttl(dsec_node *n, dsec_msg *m, struct sbx *s, uint64_t ttl_s)
{
    if (s->state != ST_RUNNING && s->state != ST_PAUSED) {
        dsec__node_reply_err(n, m, DSEC_E_STATE, "sandbox %s is %s; its TTL cannot change", s->id,
                             dsec__node_state_names[s->state]);
        return;
    }
    if (ttl_s == 0) {
        dsec__node_reply_bad(n, m, "ttl_s",
                             "ttl: ttl_s must be at least 1 (seconds from now); destroy ends a "
                             "sandbox at once");
        return;
    }
    uint64_t now = dsec_wall_ns(), age_ns = dsec__node_age_ns(now, s->created_ns);
    uint64_t max_ns = n->conf.max_ttl_s * 1000000000ull;
    if (ttl_s > n->conf.max_ttl_s || age_ns + ttl_s * 1000000000ull > max_ns) {
        uint64_t left_s = age_ns >= max_ns ? 0 : (max_ns - age_ns) / 1000000000ull;
        dsec__node_reply_bad(
            n, m, "ttl_s",
            "ttl: ttl_s %" PRIu64 " would make sandbox %s live past this cell's "
            "max_ttl_s %" PRIu64 " (it is %" PRIu64 " s old: at most %" PRIu64 " s more)",
            ttl_s, s->id, (uint64_t)n->conf.max_ttl_s, age_ns / 1000000000u, left_s);
        return;
    }
    pthread_mutex_lock(&n->mu);
    uint8_t reap = s->reap;
    uint64_t was = s->ttl_ns;
    if (reap == REAP_NONE)
        s->ttl_ns = age_ns + ttl_s * 1000000000ull;
    pthread_mutex_unlock(&n->mu);
    if (reap != REAP_NONE) {
        dsec__node_reply_err(n, m, DSEC_E_STATE,
                             "sandbox %s is being destroyed (%s); its TTL cannot change", s->id,
                             reap_text(reap));
        return;
    }
    dsec_err err;
    if (dsec__node_journal_put(n, s, &err) < 0) {
        pthread_mutex_lock(&n->mu);
        s->ttl_ns = was;
        pthread_mutex_unlock(&n->mu);
        dsec_err_wrap(&err, "ttl of %s: the journal", s->id);
        dsec_wire_error(n->actor, m, &err);
        return;
    }
    dsec__node_touch(s);
    char expires[24];
    snprintf(expires, sizeof expires, "%" PRIu64, s->created_ns + s->ttl_ns);
    const char *k[] = {"expires_ns"}, *v[] = {expires};
    dsec__node_reply_op(n, m, s, dsec__node_state_names[s->state], (dsec_strv){0},
                        (dsec_kv){k, v, 1});
}

static void do_op(dsec_node *n, dsec_msg *m, struct sbx *s)
{
    dsec_err err;
    dsec_msg_op op;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_OP, dsec_msg_data(m), dsec_msg_len(m), &op,
                    &err) < 0) {
        dsec_wire_error(n->actor, m, &err);
        return;
    }
    if (strcmp(op.id, s->id) != 0) {
        dsec__node_reply_bad(n, m, "id", "op: id %s does not match the subject's %s", op.id, s->id);
        return;
    }
    if (strcmp(op.op, "status") == 0) {
        do_status(n, m, s);
    } else if (strcmp(op.op, "destroy") == 0) {
        uint8_t why = s->reap;
        destroy_sbx(n, m, s, reap_text(why));
        if (why == REAP_TTL)
            atomic_fetch_add(&n->reaped_ttl, 1);
        else if (why == REAP_IDLE)
            atomic_fetch_add(&n->reaped_idle, 1);
        else if (why == REAP_LOST)
            atomic_fetch_add(&n->reaped_lost, 1);
        else if (why == REAP_SUPERSEDED)
            atomic_fetch_add(&n->reaped_superseded, 1);
    } else if (strcmp(op.op, "pause") == 0 || strcmp(op.op, "resume") == 0) {
        do_pause_resume(n, m, s, op.op[0] == 'p');
    } else if (strcmp(op.op, "fork") == 0) {
        dsec__node_do_fork(n, m, s, op.n);
    } else if (strcmp(op.op, "freeze") == 0) {
        do_freeze(n, m, s);
    } else if (strcmp(op.op, "snapshot") == 0) {
        do_snapshot(n, m, s, op.name);
    } else if (strcmp(op.op, "net") == 0) {
        do_net(n, m, s, &op.net);
    } else if (strcmp(op.op, "ttl") == 0) {
        do_ttl(n, m, s, op.ttl_s);
    } else {
        dsec__node_reply_err(
            n, m, DSEC_E_UNSUPPORTED,
            "op \"%s\" is unknown (known: pause, resume, destroy, status, fork, freeze, "
            "snapshot, net, ttl)",
            op.op);
    }
}

/* The operation m names on its sandbox, run to its answer on this thread. */
static void sbx_dispatch(dsec_actor *a, dsec_msg *m, dsec_node *n)
{
    struct target t;
    if (parse_target(m, &t) < 0) {
        dsec__node_reply_bad(n, m, "subject", "subject %s: expected dsec.v1.TENANT.sbx.NODE.ID.OP",
                             dsec_msg_subject(m));
        return;
    }
    static const struct {
        const char *op;
        int type;
    } ops[] = {
        {"exec", DSEC_MSG_EXEC},    {"write", DSEC_MSG_FILE_WRITE},  {"read", DSEC_MSG_FILE_READ},
        {"ls", DSEC_MSG_FILE_LIST}, {"upload", DSEC_MSG_FILE_WRITE}, {"file", DSEC_MSG_FILE_OP},
        {"op", DSEC_MSG_OP},        {"proc", DSEC_MSG_PROC}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strcmp(t.op, ops[i].op) == 0 && !dsec_wire_type_ok(a, m, ops[i].type))
            return;
    if (strcmp(t.op, "sig") == 0) {
        if (dsec_wire_type_ok(a, m, DSEC_MSG_PROC))
            dsec__node_side_proc(n, m, t.tenant, t.id);
        return;
    }
    struct sbx *s = target_sbx(n, m, &t);
    if (s == NULL)
        return;
    if (strcmp(t.op, "exec") == 0)
        dsec__node_do_exec(n, m, s);
    else if (strcmp(t.op, "write") == 0 || strcmp(t.op, "upload") == 0)
        do_write(n, m, s);
    else if (strcmp(t.op, "file") == 0)
        dsec__node_do_file_op(n, m, s);
    else if (strcmp(t.op, "read") == 0)
        do_read(n, m, s);
    else if (strcmp(t.op, "ls") == 0)
        do_list(n, m, s);
    else if (strcmp(t.op, "op") == 0)
        do_op(n, m, s);
    else if (strcmp(t.op, "proc") == 0)
        dsec__node_do_proc(n, m, s);
    else
        dsec__node_reply_err(n, m, DSEC_E_UNSUPPORTED,
                             "operation \"%s\" is unknown (known: exec, write, upload, read, ls, "
                             "file, op, proc, sig)",
                             t.op);
}

/* ---- operations off the bus's workers ------------------------------------------------- */

/* A sandbox operation waiting for, or running on, a work thread. Its key (the sandbox) is
 * held meanwhile, so the sandbox's operations still run one at a time and in order. */
struct sbx_job {
    dsec_node *n;
    dsec_deferred *d;
    void (*run)(dsec_node *n, dsec_msg *m);
};

static void sbx_dispatch_job(dsec_node *n, dsec_msg *m)
{
    sbx_dispatch(n->actor, m, n);
}

static _Thread_local struct sbx_job *job_now; /* the job this work thread runs */

dsec_deferred *dsec__node_job_keep(void)
{
    struct sbx_job *j = job_now;
    if (j == NULL)
        return NULL;
    dsec_deferred *d = j->d;
    j->d = NULL;
    return d;
}

static void job_run(void *ud)
{
    struct sbx_job *j = ud;
    dsec_deferred *d = j->d;
    dsec_msg *m = dsec_deferred_msg(d);
    /* the work is still its request's: what it sends carries the trace id. Copied: work that
     * keeps the message (dsec__node_job_keep) may end it, and free it, before this scope ends. */
    dsec_trace_scope sc;
    dsec_trace_own own;
    dsec_deferred_trace(d, &sc);
    dsec_trace_scope_own(&sc, &own);
    job_now = j;
    j->run(j->n, m);
    job_now = NULL;
    dsec_trace_leave(&sc);
    if (j->d != NULL) /* not kept by the work (dsec__node_job_keep) */
        dsec_deferred_done(j->d);
    dsec_free(j);
}

/* Run fn for m on a work thread, in tenant's fair turn. When m cannot be deferred (out of
 * memory) it runs here, as before; when the queue is stopping, m is answered "closed". */
static void to_work(dsec_actor *a, dsec_msg *m, dsec_node *n, const char *tenant, uint64_t key,
                    void (*fn)(dsec_node *, dsec_msg *))
{
    struct sbx_job *j = dsec_malloc(sizeof *j);
    dsec_deferred *d = j != NULL ? dsec_actor_defer(a, m) : NULL;
    if (d == NULL) {
        dsec_free(j);
        fn(n, m);
        return;
    }
    *j = (struct sbx_job){.n = n, .d = d, .run = fn};
    dsec_err err;
    if (dsec_workq_submit(n->work, tenant, key, job_run, j, &err) < 0) {
        dsec_err_wrap(&err, "node %s", n->name);
        dsec_wire_error(n->actor, dsec_deferred_msg(d), &err);
        dsec_deferred_done(d);
        dsec_free(j);
    }
}

void dsec__node_on_sbx(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_node *n = ud;
    struct target t;
    if (parse_target(m, &t) < 0) {
        dsec__node_reply_bad(n, m, "subject", "subject %s: expected dsec.v1.TENANT.sbx.NODE.ID.OP",
                             dsec_msg_subject(m));
        return;
    }
    /* Run here: what completes at once (a sim sandbox at time_scale 0), and a command or a
     * file transfer on a backend that starts it without a thread (its answer comes from the
     * node's loop).
     * Everything else takes its fair turn on the work queue. */
    if (strcmp(t.op, "sig") == 0) {
        /* on a key of its own (the side lane): a signal is short and never queued, the
         * other process calls take their fair turn in the side lane's order */
        if (dsec__node_side_is_signal(m))
            sbx_dispatch(a, m, n);
        else
            to_work(a, m, n, t.tenant, dsec__node_key_of(m, n), sbx_dispatch_job);
        return;
    }
    pthread_mutex_lock(&n->mu);
    struct sbx *s = dsec__node_find_id(n, t.id);
    bool here = s != NULL && (dsec_backend_instant(s->be) ||
                              (strcmp(t.op, "exec") == 0 && dsec_backend_exec_async(s->be)) ||
                              ((strcmp(t.op, "write") == 0 || strcmp(t.op, "read") == 0) &&
                               dsec_backend_files_async(s->be)));
    pthread_mutex_unlock(&n->mu);
    if (here) {
        sbx_dispatch(a, m, n);
        return;
    }
    to_work(a, m, n, t.tenant, dsec__node_key_of(m, n), sbx_dispatch_job);
}

/* Operations on one sandbox run in order; different sandboxes in parallel.
 * Placements are keyed by request id so a retry of one create is serial. */
uint64_t dsec__node_key_of(const dsec_msg *cm, void *ud)
{
    dsec_msg *m = (dsec_msg *)cm;
    const char *subj = dsec_msg_subject(m);
    const char *p = subj;
    int dots = 0;
    while (*p && dots < 5)
        if (*p++ == '.')
            dots++;
    if (dots == 5 && strncmp(subj, DSEC_SUBJ_CTL, strlen(DSEC_SUBJ_CTL)) != 0) {
        const char *end = strchr(p, '.');
        /* the sig subject (signals and the other process calls but start) has a key of
         * its own, so it passes the sandbox's running command */
        uint64_t h =
            end != NULL && strcmp(end, ".sig") == 0 ? 0x5349474e414cull : 1469598103934665603ull;
        for (; *p && p != end; p++)
            h = (h ^ (uint8_t)*p) * 1099511628211ull;
        return h;
    }
    const char *rid = dsec_msg_header(m, DSEC_HDR_REQ_ID);
    return rid ? dsec__node_hash_str(rid, NULL) : 0;
}
