/* node-fork.c - a sandbox's fork: its admission, its children's resources and records, and,
 * where the backend has fork_start, the wait for the children on the node's loop. */
#include "actors/node-int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "actors/wire.h"
#include "codecs/subjects.h"
#include "dsec/alloc.h"

/* A fork makes sandboxes no scheduler admitted: ask the quota actor for the
 * children here. They carry the admission's id as their req_id, so the
 * quota actor counts each one off the admission as its event arrives. 0, or
 * -1 with the client answered. */
static int fork_admit(dsec_node *n, dsec_msg *m, const struct sbx *s, uint64_t count,
                      char *admit_id, size_t idn)
{
    char rnd[33];
    dsec_bus_new_id(rnd);
    snprintf(admit_id, idn, "fork-%.40s", rnd);
    if (!n->conf.quota)
        return 0;
    dsec_msg_admit ad = {.tenant = s->tenant,
                         .project = s->project[0] ? s->project : NULL,
                         .req_id = admit_id,
                         .n = count,
                         .cpu_milli = s->cpu_milli,
                         .memory_mb = s->memory_mb};
    char subj[160];
    snprintf(subj, sizeof subj, DSEC_SUBJ_QUOTA_ADMIT, n->cell);
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_err err;
    dsec_msg *reply = NULL;
    dsec_hdr hdr = {.type = "admit", .schema = DSEC_SCHEMA_VERSION, .req_id = admit_id};
    int rc = dsec_encode(&b, DSEC_MSG_ADMIT, &ad, &err);
    if (rc == 0)
        rc = dsec_bus_request_sync(n->bus, subj, &hdr, b.data, b.len, 2000, &reply, &err);
    dsec_buf_release(&b);
    if (rc < 0) {
        dsec__node_reply_err(n, m, err.code, "fork: the quota actor of cell %s did not answer: %s",
                             n->cell, err.msg);
        return -1;
    }
    const char *type = dsec_msg_type(reply);
    if (dsec_wire_bus_error(reply, &err, "fork: the quota actor of cell %s", n->cell)) {
        dsec__node_reply_err(n, m, err.code, "%s", err.msg);
        rc = -1;
    } else if (type == NULL || strcmp(type, DSEC_TYPE_ERROR) == 0) {
        /* its refusal names the full level: pass on its code and words, with
         * the client's req_id (the body's is the admission's own) */
        dsec_msg_error qe;
        dsec_err e = {.code = DSEC_E_INTERNAL};
        if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_ERROR, dsec_msg_data(reply),
                        dsec_msg_len(reply), &qe, &err) < 0) {
            snprintf(e.msg, sizeof e.msg,
                     "fork: the quota actor of cell %s answered an "
                     "undecodable error: %.600s",
                     n->cell, err.msg);
            qe.field = NULL;
        } else {
            e.code = dsec_code_from_name(qe.code);
            snprintf(e.msg, sizeof e.msg, "%s", qe.message);
        }
        dsec_wire_error_to(n->actor, n->bus, dsec_msg_reply(m), &e, qe.field,
                           dsec_msg_header(m, DSEC_HDR_REQ_ID));
        rc = -1;
    }
    dsec_msg_free(reply);
    return rc;
}

/* The fork failed after its admission: give it back now. */
static void fork_unadmit(dsec_node *n, const struct sbx *s, const char *admit_id)
{
    if (!n->conf.quota)
        return;
    dsec_msg_admit ad = {.tenant = s->tenant, .req_id = admit_id, .release = true};
    char subj[160];
    snprintf(subj, sizeof subj, DSEC_SUBJ_QUOTA_ADMIT, n->cell);
    dsec_err err;
    if (dsec_wire_send(n->actor, n->bus, subj, NULL, DSEC_MSG_ADMIT, &ad, admit_id, &err) < 0)
        dsec_actor_count_error(n->actor);
}

/* One fork, from its admission to its answer. With d (its deferred message) the children
 * settle on the loop, and fork_end runs later on a work thread; without, it runs at once. */
struct fork_run {
    dsec_node *n;
    dsec_deferred *d;
    struct sbx *s; /* the parent: its key is held until fork_end (d, or the call) */
    uint64_t count;
    bool admitted, reserved;
    char admit_id[48];
    struct sbx **kids;
    dsec_sandbox **handles;
    char **states;
    const char **ids;
    int rc;
    dsec_err err;
};

static void fork_free(struct fork_run *f)
{
    dsec_node *n = f->n;
    struct sbx *s = f->s;
    uint64_t count = f->count;
    if (f->admitted)
        fork_unadmit(n, s, f->admit_id);
    if (f->reserved) {
        pthread_mutex_lock(&n->mu);
        dsec__node_release_resources(n, count * s->cpu_milli, count * s->memory_mb, count,
                                     count * s->disk_mb);
        pthread_mutex_unlock(&n->mu);
    }
    for (uint64_t i = 0; f->kids && i < count; i++)
        dsec__node_sbx_free(f->kids[i]);
    for (uint64_t i = 0; f->states && i < count; i++)
        dsec_free(f->states[i]);
    dsec_free(f->kids);
    dsec_free(f->handles);
    dsec_free(f->states);
    dsec_free(f->ids);
    dsec_free(f);
}

/* The children are made (f->rc 0: their records, then the answer) or not (children that
 * exist are destroyed, and the requester hears why). */
static void fork_end(struct fork_run *f, dsec_msg *m)
{
    dsec_node *n = f->n;
    struct sbx *s = f->s;
    uint64_t count = f->count;
    if (f->rc < 0) {
        dsec_err tmp;
        for (uint64_t i = 0; i < count; i++)
            if (f->handles[i] != NULL && dsec_backend_destroy(s->be, f->handles[i], &tmp) < 0)
                dsec_actor_count_error(n->actor); /* the backend's sweep finishes it */
        dsec_err_wrap(&f->err, "forking %s", s->id);
        dsec_wire_error(n->actor, m, &f->err);
        fork_free(f);
        return;
    }
    uint64_t now = dsec_wall_ns();
    pthread_mutex_lock(&n->mu);
    for (uint64_t i = 0; i < count; i++) {
        f->kids[i]->h = f->handles[i];
        f->kids[i]->bstate = f->states[i];
        f->states[i] = NULL;
        f->kids[i]->created_ns = now;
        f->kids[i]->last_ns = now;
        f->kids[i]->state = ST_RUNNING;
        dsec__node_insert(n, f->kids[i]);
        dsec__node_event_locked(n, f->kids[i], ST_REQUESTED, ST_RUNNING, "fork");
    }
    pthread_mutex_unlock(&n->mu);
    f->reserved = false;
    f->admitted = false; /* the children's events count it off */
    dsec_err err;
    for (uint64_t i = 0; i < count; i++) {
        if (dsec__node_journal_put(n, f->kids[i], &err) < 0)
            dsec_actor_count_error(n->actor);
        f->kids[i] = NULL; /* owned by the table now */
    }
    atomic_fetch_add(&n->created, count);
    dsec__node_reply_op(n, m, s, dsec__node_state_names[s->state],
                        (dsec_strv){f->ids, (uint32_t)count}, (dsec_kv){0});
    fork_free(f);
}

/* After the children settled, on a work thread in the parent's turn (or here, on the loop's
 * thread, when the work queue has stopped: the node is stopping). */
static void fork_wait_end(void *ud)
{
    struct fork_run *f = ud;
    dsec_deferred *d = f->d;
    dsec_trace_scope sc;
    dsec_deferred_trace(d, &sc);
    fork_end(f, dsec_deferred_msg(d));
    dsec_trace_leave(&sc);
    dsec_deferred_done(d);
}

static void fork_ready(void *ud, int rc, dsec_err *err)
{
    struct fork_run *f = ud;
    f->rc = rc;
    if (rc < 0)
        f->err = *err;
    dsec_err e2;
    if (dsec_workq_submit(f->n->work, f->s->tenant,
                          dsec__node_key_of(dsec_deferred_msg(f->d), f->n), fork_wait_end, f,
                          &e2) < 0)
        fork_wait_end(f);
}

/* The children's records, not yet in the table: ids, resources, labels. 0, or -1 answered. */
static int fork_kids(struct fork_run *f, dsec_msg *m)
{
    dsec_node *n = f->n;
    const struct sbx *s = f->s;
    uint64_t count = f->count;
    f->kids = dsec_calloc(count, sizeof *f->kids);
    f->handles = dsec_calloc(count, sizeof *f->handles);
    f->states = dsec_calloc(count, sizeof *f->states);
    f->ids = dsec_calloc(count, sizeof *f->ids);
    if (f->kids == NULL || f->handles == NULL || f->states == NULL || f->ids == NULL) {
        dsec__node_reply_err(n, m, DSEC_E_NOMEM, "fork: out of memory");
        return -1;
    }
    for (uint64_t i = 0; i < count; i++) {
        if ((f->kids[i] = dsec_calloc(1, sizeof **f->kids)) == NULL) {
            dsec__node_reply_err(n, m, DSEC_E_NOMEM, "fork: out of memory");
            return -1;
        }
        struct sbx *k = f->kids[i];
        *k = (struct sbx){.be = s->be,
                          .type_idx = s->type_idx,
                          .cpu_milli = s->cpu_milli,
                          .memory_mb = s->memory_mb,
                          .disk_mb = s->disk_mb,
                          .ttl_ns = s->ttl_ns,
                          .idle_ns = s->idle_ns,
                          .state = ST_STARTING};
        dsec__node_new_id(n, k->id, sizeof k->id);
        memcpy(k->tenant, s->tenant, sizeof s->tenant);
        memcpy(k->project, s->project, sizeof s->project);
        if (dsec__node_labels_copy(k, s) < 0) {
            dsec__node_reply_err(n, m, DSEC_E_NOMEM, "fork: out of memory");
            return -1;
        }
        snprintf(k->req_id, sizeof k->req_id, "%s", f->admit_id);
        f->ids[i] = k->id;
    }
    return 0;
}

/* The node's room for the children, taken. 0, or -1 answered. */
static int fork_reserve(struct fork_run *f, dsec_msg *m)
{
    dsec_node *n = f->n;
    const struct sbx *s = f->s;
    uint64_t count = f->count;
    pthread_mutex_lock(&n->mu);
    if (n->slots_free < count || n->cpu_free < count * s->cpu_milli ||
        n->mem_free < count * s->memory_mb || n->disk_free < count * s->disk_mb) {
        uint64_t cf = n->cpu_free, mf = n->mem_free, sf = n->slots_free, df = n->disk_free;
        pthread_mutex_unlock(&n->mu);
        dsec__node_reply_err(n, m, DSEC_E_CAPACITY,
                             "fork of %s into %" PRIu64 " children needs %" PRIu64
                             " milli-CPU, %" PRIu64 " MB, %" PRIu64 " slots and %" PRIu64
                             " MB of disk; node %s has %" PRIu64 ", %" PRIu64 ", %" PRIu64
                             ", %" PRIu64,
                             s->id, count, count * s->cpu_milli, count * s->memory_mb, count,
                             count * s->disk_mb, n->name, cf, mf, sf, df);
        return -1;
    }
    n->cpu_free -= count * s->cpu_milli;
    n->mem_free -= count * s->memory_mb;
    n->slots_free -= count;
    n->disk_free -= count * s->disk_mb;
    n->dirty = true;
    f->reserved = true;
    pthread_mutex_unlock(&n->mu);
    return 0;
}

void dsec__node_do_fork(dsec_node *n, dsec_msg *m, struct sbx *s, uint64_t count)
{
    if (count < 1 || count > 1024) {
        dsec__node_reply_bad(n, m, "n", "fork: n must be 1..1024, got %" PRIu64, count);
        return;
    }
    if (!dsec__node_check_running(n, m, s))
        return;
    dsec__node_touch(s);
    struct fork_run *f = dsec_calloc(1, sizeof *f);
    if (f == NULL) {
        dsec__node_reply_err(n, m, DSEC_E_NOMEM, "fork: out of memory");
        return;
    }
    *f = (struct fork_run){.n = n, .s = s, .count = count};
    if (fork_admit(n, m, s, count, f->admit_id, sizeof f->admit_id) < 0) {
        dsec_free(f);
        return;
    }
    f->admitted = true; /* given back unless the children are made */
    if (fork_kids(f, m) < 0 || fork_reserve(f, m) < 0) {
        fork_free(f);
        return;
    }
    /* On a work thread with a backend that forks on the loop: the thread goes back once the
     * children's guests run, and fork_ready goes on when they have settled. */
    if (dsec_backend_forks_async(s->be) && (f->d = dsec__node_job_keep()) != NULL) {
        int rc = dsec_backend_fork_start(s->be, s->h, f->ids, count, n->loop, fork_ready, f,
                                         f->handles, f->states, &f->err);
        if (rc == 0)
            return;               /* f is fork_ready's: it may have ended already */
        f->rc = rc == 1 ? 0 : -1; /* every child up at once, or none exists */
        dsec_deferred *d = f->d;
        fork_end(f, m);
        dsec_deferred_done(d);
        return;
    }
    f->rc = dsec_backend_fork(s->be, s->h, f->ids, count, f->handles, f->states, &f->err);
    fork_end(f, m);
}
