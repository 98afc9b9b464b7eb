/* node-place.c - admission: a placement admitted and its sandbox created, or refused. */
#include "actors/node-int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "actors/wire.h"
#include "dsec/alloc.h"
#include "dsec/names.h"

/* The create field a backend's invalid error is about: the backends judge
 * the labels (runtime=, limits), the environment and its layers, the disk
 * and the network policy, and say which in their message. */
static const char *create_bad_field(const dsec_err *e)
{
    if (strstr(e->msg, "label") != NULL || strstr(e->msg, "runtime") != NULL)
        return "labels";
    if (strstr(e->msg, "disk_mb") != NULL)
        return "disk_mb";
    if (strstr(e->msg, "network policy") != NULL)
        return "net";
    if (strstr(e->msg, "requires") != NULL || strstr(e->msg, "isolation") != NULL)
        return "requires";
    return "env";
}

void dsec__node_send_created(dsec_node *n, const char *reply_to, const struct sbx *s, bool existing,
                             const char *req_id)
{
    dsec_msg_created c = {.id = s->id,
                          .node = n->name,
                          .type = dsec__node_type_name(n, s->type_idx),
                          .state = dsec__node_state_names[s->state],
                          .cell = n->cell,
                          .req_id = req_id,
                          .existing = existing};
    dsec_err err;
    if (dsec_wire_send(n->actor, n->bus, reply_to, NULL, DSEC_MSG_CREATED, &c, req_id, &err) < 0)
        dsec_actor_count_error(n->actor);
}

/* ---- place: admission and create ------------------------------------------------ */

/* Send a refused placement back to the scheduler that made it, which retries
 * elsewhere; without a scheduler, answer the client. short_of names what the
 * node lacked when it refused for room (NULL otherwise): a rollout refused
 * for room everywhere it was tried waits for room instead of failing. */
static void refuse(dsec_node *n, dsec_msg *m, dsec_msg_place *p, const char *why,
                   const char *short_of)
{
    atomic_fetch_add(&n->refused, 1);
    const char *back = dsec_msg_reply(m);
    dsec_err err = {.code = DSEC_E_REFUSED};
    snprintf(err.msg, sizeof err.msg, "node %s refused: %s", n->name, why);
    if (back == NULL) {
        dsec_wire_error_to(n->actor, n->bus, p->reply_to, &err, NULL, p->c.req_id);
        return;
    }
    const char **tried = dsec_calloc(p->tried.n + 1, sizeof *tried);
    if (tried == NULL) {
        dsec_wire_error_to(n->actor, n->bus, p->reply_to, &err, NULL, p->c.req_id);
        return;
    }
    for (uint32_t i = 0; i < p->tried.n; i++)
        tried[i] = p->tried.v[i];
    tried[p->tried.n] = n->name;
    p->tried = (dsec_strv){tried, p->tried.n + 1};
    p->reason = err.msg;
    p->short_of = short_of;
    /* what this node really has free, so the scheduler's view need not wait for the
     * next capacity report to stop counting room here */
    p->free_seq = p->free_cpu_milli = p->free_mem_mb = p->free_slots = p->free_disk_mb = 0;
    if (short_of != NULL) {
        pthread_mutex_lock(&n->mu);
        p->free_seq = n->seq;
        p->free_cpu_milli = n->cpu_free;
        p->free_mem_mb = n->mem_free;
        p->free_slots = n->slots_free;
        p->free_disk_mb = n->disk_free;
        pthread_mutex_unlock(&n->mu);
    }
    if (dsec_wire_send(n->actor, n->bus, back, NULL, DSEC_MSG_PLACE, p, p->c.req_id, &err) < 0)
        dsec_wire_error_to(n->actor, n->bus, p->reply_to, &err, NULL, p->c.req_id);
    dsec_free(tried);
}

void dsec__node_new_id(const dsec_node *n, char *out, size_t len)
{
    char hex[33];
    dsec_bus_new_id(hex);
    snprintf(out, len, "%s-%.16s", n->name, hex);
}

static bool printable_token(const char *s, size_t max)
{
    size_t len = strlen(s);
    if (len == 0 || len > max)
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return false;
    return true;
}

struct create_job {
    dsec_node *n;
    dsec_deferred *d;
    struct sbx *s;
    uint64_t t0;
};

static bool create_finish(dsec_node *n, struct sbx *s, const dsec_msg_place *p, uint64_t t0,
                          dsec_deferred *d);

/* Admitted, but not started: the resources go back and the requester hears why. */
static void create_fail(dsec_node *n, struct sbx *s, dsec_err *err, const char *reply_to,
                        const char *req_id)
{
    pthread_mutex_lock(&n->mu);
    dsec__node_unlink_sbx(n, s);
    dsec__node_release_resources(n, s->cpu_milli, s->memory_mb, 1, s->disk_mb);
    dsec__node_event_locked(n, s, ST_STARTING, ST_FAILED, err->msg);
    pthread_mutex_unlock(&n->mu);
    dsec_wire_error_to(n->actor, n->bus, reply_to, err, NULL, req_id);
    dsec__node_sbx_free(s);
}

static void create_job_run(void *ud)
{
    struct create_job j = *(struct create_job *)ud;
    dsec_free(ud);
    dsec_msg *m = dsec_deferred_msg(j.d);
    dsec_trace_scope sc;
    dsec_trace_own own; /* create_wait_end may free m before this scope ends */
    dsec_deferred_trace(j.d, &sc);
    dsec_trace_scope_own(&sc, &own);
    /* decoded again: the first decode belongs to the bus worker's thread */
    dsec_msg_place p;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_PLACE, dsec_msg_data(m), dsec_msg_len(m), &p,
                    &err) < 0)
        create_fail(j.n, j.s, &err, NULL, NULL); /* cannot happen: it decoded once */
    else if (create_finish(j.n, j.s, &p, j.t0, j.d))
        j.d = NULL; /* the loop's now: create_wait_end lets it go */
    dsec_trace_leave(&sc);
    if (j.d != NULL)
        dsec_deferred_done(j.d);
}

/* What an admitted placement asks of this node: its tenant, its type's index, and the resources,
 * lifetimes and idle time with this node's defaults filled in. */
struct place_want {
    const char *tenant;
    int tidx;
    uint64_t cpu, mem, disk, ttl, idle;
};

/* The checks a placement passes before it may take room here; false when it failed one and
 * was answered (an error to the requester, or refused back to the scheduler). */
static bool place_validate(dsec_node *n, dsec_actor *a, dsec_msg *m, dsec_msg_place *p,
                           struct place_want *w)
{
    dsec_err err;
    const char *tenant = p->c.tenant ? p->c.tenant : "default";
    w->tenant = tenant;
    bool tenant_ok = dsec_name_ok(tenant, DSEC_NAME_LEN_MAX) == 0;
    if (!tenant_ok || !printable_token(p->c.req_id, 64)) {
        dsec_err_set(&err, DSEC_E_INVALID, 0, "place: bad %s",
                     tenant_ok ? "req_id (control characters)" : "tenant (not a name)");
        dsec_wire_error_to(a, n->bus, p->reply_to, &err, tenant_ok ? "req_id" : "tenant",
                           p->c.req_id);
        return false;
    }
    if (p->c.project != NULL && p->c.project[0] &&
        dsec_project_ok(p->c.project, DSEC_NAME_LEN_MAX) < 0) {
        dsec_err_set(
            &err, DSEC_E_INVALID, 0,
            "project \"%.64s\": names of [A-Za-z0-9_-] joined by '/', at most 64 characters",
            p->c.project);
        dsec_wire_error_to(a, n->bus, p->reply_to, &err, "project", p->c.req_id);
        return false;
    }
    uint64_t wall = dsec_wall_ns();
    if (p->c.deadline_ns != 0 && wall > p->c.deadline_ns) {
        /* the client stopped waiting (and may have retried elsewhere): creating it now
         * would make a second sandbox for one request, or one nobody knows of */
        atomic_fetch_add(&n->late_places, 1);
        dsec_err_set(&err, DSEC_E_TIMEOUT, 0,
                     "create: the placement reached node %s %" PRIu64
                     " ms after the client's deadline; "
                     "not created (retry is safe with the same req_id)",
                     n->name, (uint64_t)((wall - p->c.deadline_ns) / 1000000u));
        dsec_wire_error_to(a, n->bus, p->reply_to, &err, NULL, p->c.req_id);
        return false;
    }
    const char *tname = p->c.type ? p->c.type : "";
    int tidx = w->tidx = dsec_registry_find(n->reg, tname);
    if (tidx < 0 || !(n->offered & (1u << tidx)) || n->backends[tidx] == NULL) {
        char why[160];
        snprintf(why, sizeof why, "it does not offer sandbox type \"%s\"", tname);
        refuse(n, m, p, why, NULL);
        return false;
    }
    w->cpu = p->c.cpu_milli ? p->c.cpu_milli : n->conf.default_cpu_milli;
    w->mem = p->c.memory_mb ? p->c.memory_mb : n->conf.default_memory_mb;
    w->disk = p->c.disk_mb                     ? p->c.disk_mb
              : strcmp(tname, "function") == 0 ? n->conf.default_function_disk_mb
                                               : n->conf.default_disk_mb;
    w->ttl = p->c.ttl_s ? p->c.ttl_s : n->conf.default_ttl_s;
    w->idle = p->c.idle_s ? p->c.idle_s : n->conf.default_idle_s;
    if (w->ttl > n->conf.max_ttl_s) {
        dsec_err_set(&err, DSEC_E_INVALID, 0,
                     "ttl_s %" PRIu64 " exceeds this cell's maximum %" PRIu64, w->ttl,
                     n->conf.max_ttl_s);
        dsec_wire_error_to(a, n->bus, p->reply_to, &err, "ttl_s", p->c.req_id);
        return false;
    }
    for (uint32_t i = 0; i < p->c.affinity.n; i++) {
        bool ok = false;
        for (size_t j = 0; j < n->nlabels && !ok; j++)
            ok = strcmp(n->labels[j].key, p->c.affinity.k[i]) == 0 &&
                 strcmp(n->labels[j].value, p->c.affinity.v[i]) == 0;
        if (!ok) {
            char why[160];
            snprintf(why, sizeof why, "label %s=%s does not match", p->c.affinity.k[i],
                     p->c.affinity.v[i]);
            refuse(n, m, p, why, NULL);
            return false;
        }
    }
    return true;
}

/* Room taken for the placement and s (zeroed, the caller's) filled in and listed, under the
 * node's lock; false when it was answered instead (a retry of a request it already has, an
 * attempt overtaken by a later one, no room), and s freed. */
static bool place_admit(dsec_node *n, dsec_actor *a, dsec_msg *m, dsec_msg_place *p,
                        const struct place_want *w, struct sbx *s)
{
    dsec_err err;
    uint32_t retry = p->c.retry > UINT32_MAX ? UINT32_MAX : (uint32_t)p->c.retry;
    pthread_mutex_lock(&n->mu);
    struct sbx *dup = dsec__node_find_req(n, w->tenant, p->c.req_id);
    if (dup != NULL) {
        /* Idempotent create: the same request id answers with the sandbox it
         * made, which now answers this attempt (a notice of an earlier one
         * placed elsewhere must not drop it). */
        dsec__node_answers_locked(n, dup, retry);
        pthread_mutex_unlock(&n->mu);
        dsec_free(s);
        dsec__node_send_created(n, p->reply_to, dup, true, p->c.req_id);
        return false;
    }
    struct tomb *tomb = dsec__node_find_tomb(n, w->tenant, p->c.req_id);
    if (tomb != NULL && tomb->retry > retry) {
        uint32_t later = tomb->retry;
        pthread_mutex_unlock(&n->mu);
        dsec_free(s);
        atomic_fetch_add(&n->stale_places, 1);
        dsec_err_set(
            &err, DSEC_E_TIMEOUT, 0,
            "create: attempt %" PRIu64 " reached node %s after attempt %" PRIu32
            " was placed on another node; not created (retry is safe with the same req_id)",
            p->c.retry, n->name, later);
        dsec_wire_error_to(a, n->bus, p->reply_to, &err, NULL, p->c.req_id);
        return false;
    }
    const char *short_of = NULL;
    char why[160];
    if (n->slots_free < 1)
        short_of = "slots";
    else if (n->cpu_free < w->cpu)
        short_of = "cpu";
    else if (n->mem_free < w->mem)
        short_of = "memory";
    else if (n->disk_free < w->disk)
        short_of = "disk";
    if (short_of != NULL) {
        snprintf(why, sizeof why,
                 "not enough %s (free: %" PRIu64 " milli-CPU, %" PRIu64 " MB, %" PRIu64
                 " slots, %" PRIu64 " MB of disk)",
                 short_of, n->cpu_free, n->mem_free, n->slots_free, n->disk_free);
        pthread_mutex_unlock(&n->mu);
        dsec_free(s);
        refuse(n, m, p, why, short_of);
        return false;
    }
    n->cpu_free -= w->cpu;
    n->mem_free -= w->mem;
    n->slots_free -= 1;
    n->disk_free -= w->disk;
    n->dirty = true;
    dsec__node_new_id(n, s->id, sizeof s->id);
    snprintf(s->tenant, sizeof s->tenant, "%s", w->tenant);
    snprintf(s->project, sizeof s->project, "%s", p->c.project ? p->c.project : "");
    snprintf(s->req_id, sizeof s->req_id, "%s", p->c.req_id);
    s->retry = retry;
    s->type_idx = (uint8_t)w->tidx;
    s->cpu_milli = (uint32_t)w->cpu;
    s->memory_mb = (uint32_t)w->mem;
    s->disk_mb = w->disk;
    s->created_ns = dsec_wall_ns();
    s->last_ns = s->created_ns;
    s->ttl_ns = w->ttl * 1000000000ull;
    s->idle_ns = w->idle * 1000000000ull;
    s->be = n->backends[w->tidx];
    s->state = ST_STARTING;
    s->pausable = p->c.pausable && (p->c.cls == NULL || strcmp(p->c.cls, "rollout") == 0);
    if (dsec__node_labels_set(s, p->c.labels.k, p->c.labels.v, p->c.labels.n) < 0) {
        dsec__node_release_resources(n, w->cpu, w->mem, 1, w->disk);
        pthread_mutex_unlock(&n->mu);
        dsec_free(s);
        refuse(n, m, p, "out of memory", NULL);
        return false;
    }
    dsec__node_insert(n, s); /* visible to a retry of the same request at once */
    dsec__node_event_locked(n, s, ST_REQUESTED, ST_STARTING, NULL);
    pthread_mutex_unlock(&n->mu);
    return true;
}

/* Start the admitted sandbox and answer its requester (create_finish). */
static void place_create(dsec_node *n, dsec_actor *a, dsec_msg *m, const dsec_msg_place *p,
                         struct sbx *s, uint64_t t0)
{
    dsec_err err;
    /* Starting it needs a thread (crun, mkfs, a VM's boot): it runs on the work queue, in
     * the tenant's fair turn, and this worker goes on placing. A backend whose operations
     * complete at once starts it here. */
    bool here = dsec_backend_instant(s->be);
    struct create_job *j = here ? NULL : dsec_malloc(sizeof *j);
    dsec_deferred *d = j != NULL ? dsec_actor_defer(a, m) : NULL;
    if (d != NULL) {
        *j = (struct create_job){.n = n, .d = d, .s = s, .t0 = t0};
        if (dsec_workq_submit(n->work, s->tenant, dsec__node_hash_str(s->id, NULL), create_job_run,
                              j, &err) == 0)
            return;
        dsec_free(j);
        create_fail(n, s, &err, p->reply_to, p->c.req_id);
        dsec_deferred_done(d);
        return;
    }
    dsec_free(j);
    create_finish(n, s, p, t0, NULL);
}

/* Keep p's stamp to hand back to its scheduler in the next capacity report: how far behind
 * this node takes that replica's placements, on the replica's own clock. A full table (more
 * replicas than NODE_ECHO_MAX) gives the slot whose stamp waited longest. */
static void echo_place(dsec_node *n, const dsec_msg_place *p)
{
    if (p->sent_us == 0 || p->scheduler == NULL ||
        strlen(p->scheduler) >= sizeof n->echo[0].scheduler)
        return;
    uint64_t now = dsec_now_ns();
    pthread_mutex_lock(&n->mu);
    struct place_echo *e = NULL, *oldest = &n->echo[0];
    for (int i = 0; i < NODE_ECHO_MAX && e == NULL; i++) {
        if (n->echo[i].scheduler[0] == '\0' || strcmp(n->echo[i].scheduler, p->scheduler) == 0)
            e = &n->echo[i];
        else if (n->echo[i].at_ns < oldest->at_ns)
            oldest = &n->echo[i];
    }
    if (e == NULL)
        e = oldest;
    if (strcmp(e->scheduler, p->scheduler) != 0) { /* a new replica, or a slot taken over */
        snprintf(e->scheduler, sizeof e->scheduler, "%s", p->scheduler);
        e->at_ns = e->taken = 0;
    }
    e->taken++;
    if (p->sent_us >= e->sent_us || e->at_ns == 0) { /* the newest, not one overtaken */
        e->sent_us = p->sent_us;
        e->at_ns = now;
    }
    n->dirty = true;
    pthread_mutex_unlock(&n->mu);
}

void dsec__node_on_place(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_node *n = ud;
    uint64_t t0 = dsec_now_ns();
    dsec_err err;
    dsec_msg_place p;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_PLACE))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_PLACE, dsec_msg_data(m), dsec_msg_len(m), &p,
                    &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    echo_place(n, &p);
    struct place_want w;
    if (!place_validate(n, a, m, &p, &w))
        return;
    struct sbx *s = dsec_calloc(1, sizeof *s);
    if (s == NULL) {
        refuse(n, m, &p, "out of memory", NULL);
        return;
    }
    if (place_admit(n, a, m, &p, &w, s))
        place_create(n, a, m, &p, s, t0);
}

/* A placement that waited in this node's mailbox longer than shed_after_ms
 * (the bus hands it here instead of on_place): its client hears
 * "overloaded" now, and nothing is created, so the same attempt may go
 * again (the scheduler's reservation goes with the node's next report,
 * which does not count it). Created now, it would be answered late and hold
 * up the placements behind it. */
void dsec__node_on_place_shed(dsec_actor *a, dsec_msg *m, uint64_t waited_ns, void *ud)
{
    dsec_node *n = ud;
    dsec_err err;
    dsec_msg_place p;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_PLACE))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_PLACE, dsec_msg_data(m), dsec_msg_len(m), &p,
                    &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    echo_place(n, &p);
    atomic_fetch_add(&n->shed_places, 1);
    uint64_t waited_ms = waited_ns / 1000000u;
    /* what this node's backlog took to reach it: about what a retry would meet now */
    err = (dsec_err){.code = DSEC_E_OVERLOADED,
                     .retry_after_ms = waited_ms < 10     ? 10
                                       : waited_ms > 2000 ? 2000
                                                          : (unsigned)waited_ms};
    snprintf(err.msg, sizeof err.msg,
             "node %s: the placement waited %" PRIu64
             " ms for its turn (scheduler.shed_after_ms %u); "
             "not created; retry after %u ms (same req_id)",
             n->name, waited_ms, n->conf.shed_after_ms, err.retry_after_ms);
    dsec_wire_error_to(a, n->bus, p.reply_to, &err, NULL, p.c.req_id);
}

/* s did not start (err): its resources go back and p's requester hears why. */
static void create_failed(dsec_node *n, struct sbx *s, const dsec_msg_place *p, dsec_err *err)
{
    dsec_err_wrap(err, "creating %s on %s", s->id, n->name);
    pthread_mutex_lock(&n->mu);
    dsec__node_unlink_sbx(n, s);
    dsec__node_release_resources(n, s->cpu_milli, s->memory_mb, 1, s->disk_mb);
    dsec__node_event_locked(n, s, ST_STARTING, ST_FAILED, err->msg);
    pthread_mutex_unlock(&n->mu);
    if (err->code == DSEC_E_INTERNAL || err->code == DSEC_OK)
        err->code = DSEC_E_BACKEND;
    dsec_wire_error_to(n->actor, n->bus, p->reply_to, err,
                       err->code == DSEC_E_INVALID ? create_bad_field(err) : NULL, p->c.req_id);
    dsec__node_sbx_free(s);
}

/* The backend started s: its journal record, then the answer. */
static void create_started(dsec_node *n, struct sbx *s, const dsec_msg_place *p, uint64_t t0)
{
    dsec_err err;
    s->state = ST_RUNNING;
    if (dsec__node_journal_put(n, s, &err) < 0) {
        /* Without a record we could not re-adopt it: refuse rather than risk an orphan. */
        dsec_err tmp;
        dsec__node_side_close(n, s);
        dsec_backend_destroy(s->be, s->h, &tmp);
        pthread_mutex_lock(&n->mu);
        dsec__node_unlink_sbx(n, s);
        dsec__node_release_resources(n, s->cpu_milli, s->memory_mb, 1, s->disk_mb);
        dsec__node_event_locked(n, s, ST_STARTING, ST_FAILED, err.msg);
        pthread_mutex_unlock(&n->mu);
        dsec_wire_error_to(n->actor, n->bus, p->reply_to, &err, NULL, p->c.req_id);
        dsec__node_sbx_free(s);
        return;
    }
    pthread_mutex_lock(&n->mu);
    dsec__node_event_locked(n, s, ST_STARTING, ST_RUNNING, NULL);
    pthread_mutex_unlock(&n->mu);
    atomic_fetch_add(&n->created, 1);
    dsec_metrics_hist_observe(&n->create_lat, dsec_now_ns() - t0);
    dsec__node_send_created(n, p->reply_to, s, false, p->c.req_id);
}

/* A sandbox coming up on the loop (create_start): its placement is kept (d) until the end. */
struct create_wait {
    struct create_job j;
    int rc;
    dsec_err err;
};

/* After the wait, on a work thread (the journal, a failed start's destroy): as create_finish
 * would have gone on. */
static void create_wait_end(void *ud)
{
    struct create_wait *c = ud;
    dsec_msg *m = dsec_deferred_msg(c->j.d);
    dsec_trace_scope sc;
    dsec_deferred_trace(c->j.d, &sc);
    dsec_msg_place p;
    dsec_err err, tmp;
    bool decoded = dsec_decode(dsec_wire_decoder(), DSEC_MSG_PLACE, dsec_msg_data(m),
                               dsec_msg_len(m), &p, &err) == 0; /* it decoded once */
    if (c->rc == 0 && decoded) {
        create_started(c->j.n, c->j.s, &p, c->j.t0);
    } else {
        dsec_backend_destroy(c->j.s->be, c->j.s->h, &tmp);
        c->j.s->h = NULL;
        if (decoded)
            create_failed(c->j.n, c->j.s, &p, &c->err);
        else
            create_fail(c->j.n, c->j.s, &err, NULL, NULL);
    }
    dsec_trace_leave(&sc);
    dsec_deferred_done(c->j.d);
    dsec_free(c);
}

/* The sandbox answered, or could not (on the loop's thread): the rest in the tenant's turn, or
 * here when the work queue has stopped (the node is stopping). */
static void create_ready(void *ud, int rc, dsec_err *err)
{
    struct create_wait *c = ud;
    c->rc = rc;
    if (rc < 0)
        c->err = *err;
    dsec_err e2;
    if (dsec_workq_submit(c->j.n->work, c->j.s->tenant, dsec__node_hash_str(c->j.s->id, NULL),
                          create_wait_end, c, &e2) < 0)
        create_wait_end(c);
}

/* Start the sandbox s that on_place admitted for p: the backend's create, then its journal
 * record, then the answer. On a work thread. With d (p's placement, deferred) and a backend
 * that starts sandboxes on the loop, it returns true once the wait for the sandbox is the
 * loop's: create_wait_end then finishes, and lets d go. */
static bool create_finish(dsec_node *n, struct sbx *s, const dsec_msg_place *pp, uint64_t t0,
                          dsec_deferred *d)
{
    dsec_err err;
    const dsec_msg_place p = *pp;
    dsec_sandbox_spec spec;
    dsec__node_spec_for(n, s, p.c.env, &spec);
    spec.cls = p.c.cls;
    spec.net = p.c.net.v;
    spec.nnet = p.c.net.n;
    dsec_backend_kv labels[64];
    spec.nlabels = p.c.labels.n < 64 ? p.c.labels.n : 64;
    for (size_t i = 0; i < spec.nlabels; i++)
        labels[i] = (dsec_backend_kv){p.c.labels.k[i], p.c.labels.v[i]};
    spec.labels = labels;
    struct create_wait *c =
        d != NULL && dsec_backend_creates_async(s->be) ? dsec_calloc(1, sizeof *c) : NULL;
    if (c != NULL) {
        c->j = (struct create_job){.n = n, .d = d, .s = s, .t0 = t0};
        /* from a 0 on, s is create_ready's: it may be running already */
        int rc = dsec_backend_create_start(s->be, &spec, n->loop, create_ready, c, &s->h,
                                           &s->bstate, &err);
        if (rc == 0)
            return true;
        dsec_free(c);
        if (rc == 1) { /* up at once */
            create_started(n, s, &p, t0);
            return false;
        }
    } else if (dsec_backend_create(s->be, &spec, &s->h, &s->bstate, &err) == 0) {
        create_started(n, s, &p, t0);
        return false;
    }
    create_failed(n, s, &p, &err);
    return false;
}
