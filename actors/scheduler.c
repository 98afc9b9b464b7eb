/* scheduler.c - scheduler replica: decode a create, pick the type, place it, let the node answer
 * the client. */
#include "actors/scheduler.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/admit.h"
#include "actors/lost.h"
#include "actors/placement.h"
#include "actors/wire.h"
#include "codecs/msg.h"
#include "codecs/subjects.h"
#include "dsec/alloc.h"
#include "dsec/log.h"
#include "dsec/names.h"

#include "actors/sched-int.h"

static __thread uint64_t rng_state;

static uint64_t *rng(void)
{
    if (rng_state == 0)
        rng_state = dsec_now_ns() ^ ((uint64_t)(uintptr_t)&rng_state << 17) ^ 0x9e3779b97f4a7c15ull;
    return &rng_state;
}

static void fail_to(dsec_sched *s, const char *reply_to, const char *req_id, int code,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Before a request whose callback uses s: false once the scheduler stops. */
static bool ask_begin(dsec_sched *s)
{
    pthread_mutex_lock(&s->amu);
    bool ok = !s->stopping;
    if (ok)
        s->asking++;
    pthread_mutex_unlock(&s->amu);
    return ok;
}

/* Its callback is done with s (or the request was never sent). */
static void ask_end(dsec_sched *s)
{
    pthread_mutex_lock(&s->amu);
    if (--s->asking == 0 && s->stopping)
        pthread_cond_broadcast(&s->acv);
    pthread_mutex_unlock(&s->amu);
}

static void fail_to(dsec_sched *s, const char *reply_to, const char *req_id, int code,
                    const char *fmt, ...)
{
    dsec_err e = {.code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&s->n_failed, 1);
    dsec_wire_error_to(s->creates, s->bus, reply_to, &e, NULL, req_id);
}

/* An invalid create field, answered with its name (docs/protocol.md, Errors). */
static void fail_bad(dsec_sched *s, const char *reply_to, const char *req_id, const char *field,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void fail_bad(dsec_sched *s, const char *reply_to, const char *req_id, const char *field,
                     const char *fmt, ...)
{
    dsec_err e = {.code = DSEC_E_INVALID};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&s->n_failed, 1);
    dsec_wire_error_to(s->creates, s->bus, reply_to, &e, field, req_id);
}

/* A create admitted by the quota actor that will not become a sandbox here
 * (refused, failed, forwarded to another cell): give its admission back now
 * rather than when the quota actor's wait for it runs out. */
void dsec__sched_quota_release(dsec_sched *s, const dsec_msg_create *c)
{
    if (!s->conf.quota || c->req_id == NULL)
        return;
    dsec_msg_admit ad = {.tenant = c->tenant ? c->tenant : "default",
                         .project = c->project,
                         .req_id = c->req_id,
                         .release = true};
    dsec_err err;
    /* no actor: this also runs from dsec_sched_stop, after the actors are gone;
     * a release that is lost only waits for the quota actor's pending_ms */
    dsec_wire_send(NULL, s->bus, s->quota_subj, NULL, DSEC_MSG_ADMIT, &ad, c->req_id, &err);
}

/* A create that waited in the replica's mailbox longer than
 * scheduler.shed_after_ms (the bus hands it here instead of on_create):
 * answered "overloaded" at once, undecoded, with the req_id of its header.
 * Placed now it would reach its node late and hold up the creates behind
 * it; answered, its client retries when the replica has drained what it
 * holds and what waits in its mailbox. */
static void on_create_shed(dsec_actor *a, dsec_msg *m, uint64_t waited_ns, void *ud)
{
    dsec_sched *s = ud;
    atomic_fetch_add(&s->n_creates, 1);
    const char *reply_to = dsec_msg_reply(m);
    if (reply_to == NULL) {
        dsec_actor_count_error(a);
        return;
    }
    dsec_actor_stats st;
    dsec_actor_stats_get(a, &st);
    uint64_t held = atomic_load(&s->held_seen) + st.mailbox_depth;
    dsec_msg_create c = {.req_id = dsec_msg_header(m, DSEC_HDR_REQ_ID)};
    dsec__sched_shed(s, reply_to, &c, held, false,
                     "scheduler %s of cell %s: the create waited %" PRIu64 " ms for its turn "
                     "(scheduler.shed_after_ms %u)",
                     s->name, s->cell, waited_ns / 1000000u, s->conf.shed_after_ms);
}

/* Whether a create whose deadline (wall clock, ns; 0: none) is this close
 * can still be answered by a placement from the next wait tick. */
static bool deadline_near(const dsec_sched *s, uint64_t deadline_ns)
{
    if (deadline_ns == 0)
        return false;
    uint64_t wall = dsec_wall_ns();
    return deadline_ns <= wall || (deadline_ns - wall) / 1000000ull <= 2ull * s->conf.demand_ms;
}

/* tick_wait: fold the placements sent since the last tick into the rate. */
static void drain_update(dsec_sched *s, uint64_t t)
{
    uint64_t placed = atomic_load(&s->n_placed);
    if (s->drain_last_ms != 0 && t > s->drain_last_ms) {
        uint64_t inst = (placed - s->drain_last_placed) * 1000000ull / (t - s->drain_last_ms);
        uint64_t old = atomic_load(&s->drain_milli_per_s);
        /* weight 1/4: a burst moves it within a second of ticks, one quiet tick does not zero it */
        atomic_store(&s->drain_milli_per_s, old - old / 4 + inst / 4);
    }
    s->drain_last_placed = placed;
    s->drain_last_ms = t;
}

/* ---- cross-cell ----------------------------------------------------------------- */

/* The other cell with the most free slots that offers the type and fits. */
static bool pick_other_cell(dsec_sched *s, const char *type, uint64_t cpu, uint64_t mem, char *out,
                            size_t n)
{
    char needle[80];
    snprintf(needle, sizeof needle, ",%s,", type);
    uint64_t best = 0, t = dsec__sched_now_ms();
    bool found = false;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->ncells; i++) {
        struct cell_seen *c = &s->cells[i];
        if (strcmp(c->name, s->cell) == 0 || t - c->seen_ms > 3ull * s->conf.summary_ms + 1000)
            continue;
        if (c->slots_free == 0 || c->cpu_free < cpu || c->mem_free < mem ||
            !strstr(c->types, needle))
            continue;
        if (!found || c->slots_free > best) {
            best = c->slots_free;
            snprintf(out, n, "%s", c->name);
            found = true;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return found;
}

static bool forward(dsec_sched *s, dsec_msg_create *c, const char *tenant, const char *type,
                    uint64_t cpu, uint64_t mem, const char *reply_to)
{
    if (c->cell != NULL || c->hops >= s->conf.max_hops)
        return false; /* pinned to a cell, or forwarded enough */
    char other[DSEC_NAME_LEN_MAX + 1];
    if (!pick_other_cell(s, type, cpu, mem, other, sizeof other))
        return false;
    c->hops++;
    char subj[256];
    snprintf(subj, sizeof subj, DSEC_SUBJ_CREATE_CELL, tenant, other);
    dsec_err err;
    /* counted before the send: the other cell may answer the client before this thread goes
     * on, and whoever reads the stats on that answer must find the forward counted */
    atomic_fetch_add(&s->n_forwarded, 1);
    if (dsec_wire_send(s->creates, s->bus, subj, reply_to, DSEC_MSG_CREATE, c, c->req_id, &err) <
        0) {
        atomic_fetch_sub(&s->n_forwarded, 1);
        return false;
    }
    dsec__sched_quota_release(s, c); /* the other cell's quota actor admits it there */
    return true;
}

/* ---- placing -------------------------------------------------------------------- */

/* A create's attempt number as superseded notices carry it (1..1000000). */
static uint64_t notice_retry(uint64_t retry)
{
    return retry == 0 ? 1 : retry > 1000000 ? 1000000 : retry;
}

/* Place p on a node of this cell and send it there; -1 with err filled (the
 * client not answered) when there is no room or the send failed. */
static int try_place(dsec_sched *s, dsec_msg_place *p, int tidx, uint64_t cpu, uint64_t mem,
                     uint64_t disk, dsec_err *err)
{
    dsec_msg_create *c = &p->c;
    dsec_place_req req = {.cell = s->cell,
                          .type = tidx,
                          .cpu_milli = cpu,
                          .memory_mb = mem,
                          .disk_mb = disk,
                          .aff_keys = c->affinity.k,
                          .aff_vals = c->affinity.v,
                          .naff = c->affinity.n,
                          .exclude = p->tried.v,
                          .nexclude = p->tried.n};
    /* its node hands the stamp back: how late placements arrive, and which are still on
     * their way (the view keeps their reservations until a report counts them) */
    req.stamp = dsec_admit_stamp();
    dsec_place_result res;
    if (dsec_placement_place(s->view, &req, s->conf.k, rng(), dsec__sched_now_ms(), &res, err) < 0)
        return -1;
    c->type =
        dsec_registry_caps(s->reg, tidx)->type; /* the node creates exactly the type chosen here */
    p->scheduler = s->name;
    p->reason = NULL;
    p->short_of = NULL;
    p->reservation = res.reservation;
    p->free_seq = p->free_cpu_milli = p->free_mem_mb = p->free_slots = p->free_disk_mb = 0;
    p->sent_us = req.stamp;
    char subj[128];
    snprintf(subj, sizeof subj, DSEC_SUBJ_PLACE, res.node);
    if (dsec_wire_send(s->creates, s->bus, subj, s->back, DSEC_MSG_PLACE, p, c->req_id, err) < 0) {
        dsec_placement_release(s->view, res.node, res.reservation);
        return -1;
    }
    atomic_fetch_add(&s->n_placed, 1);
    if (c->retry > 0) /* a node may hold an earlier attempt whose answer was lost: it drops it */
        dsec_lost_superseded(s->lost, c->tenant ? c->tenant : "default", c->req_id, res.node,
                             notice_retry(c->retry), dsec__sched_now_ms());
    return 0;
}

/* Park a rollout create that found no room; tick_wait places it when
 * capacity frees (the arbiter reclaims it from preemptible jobs). Its wait
 * began when it was first parked (parked_ms travels with the placement), so
 * refusals after a wait do not restart it. 1: parked; 0: not a create that
 * parks (the caller answers it); -1: answered "overloaded" (park_max parked
 * already, or its deadline comes before a wait tick could place it). */
static int park(dsec_sched *s, const dsec_msg_place *p, int tidx, uint64_t cpu, uint64_t mem,
                uint64_t disk)
{
    if (s->conf.wait_ms == UINT32_MAX || p->c.cls == NULL || strcmp(p->c.cls, "rollout") != 0)
        return 0;
    pthread_mutex_lock(&s->wmu);
    uint64_t parked = s->nwaiting + s->nticking;
    pthread_mutex_unlock(&s->wmu);
    if (parked >= s->conf.park_max) {
        dsec__sched_shed(s, p->reply_to, &p->c, dsec__sched_held_now(s), true,
                         "no room in cell %s now, and scheduler %s has %" PRIu64
                         " rollout creates waiting "
                         "for room already (scheduler.park_max)",
                         s->cell, s->name, parked);
        return -1;
    }
    if (deadline_near(s, p->c.deadline_ns)) {
        dsec__sched_shed(
            s, p->reply_to, &p->c, dsec__sched_held_now(s), true,
            "no room in cell %s now, and none can be waited for before the create's deadline",
            s->cell);
        return -1;
    }
    /* It starts afresh when room appears: the nodes that refused it were
     * full then, and may be exactly where capacity frees. */
    dsec_msg_place fresh = *p;
    fresh.tried = (dsec_strv){0};
    fresh.reason = NULL;
    fresh.short_of = NULL;
    fresh.attempt = 1;
    uint64_t wall = dsec_wall_ns() / 1000000ull, t = dsec__sched_now_ms();
    fresh.parked_ms = p->parked_ms != 0 && p->parked_ms <= wall ? p->parked_ms : wall;
    uint64_t waited = wall - fresh.parked_ms;
    if (waited >= s->conf.wait_ms)
        return 0; /* it has had its wait */
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_err err;
    if (dsec_encode(&b, DSEC_MSG_PLACE, &fresh, &err) < 0) {
        dsec_buf_release(&b);
        return 0;
    }
    struct waiter *w = dsec_malloc(sizeof *w + b.len);
    if (w == NULL) {
        dsec_buf_release(&b);
        return 0;
    }
    *w = (struct waiter){.since_ms = waited < t ? t - waited : 0,
                         .cpu = cpu,
                         .mem = mem,
                         .disk = disk,
                         .tidx = tidx,
                         .len = b.len};
    memcpy(w->place, b.data, b.len);
    dsec_buf_release(&b);
    const char *tid = dsec_trace_current();
    snprintf(w->trace, sizeof w->trace, "%s", tid != NULL ? tid : "");
    pthread_mutex_lock(&s->wmu);
    if (s->wtail)
        s->wtail->next = w;
    else
        s->whead = w;
    s->wtail = w;
    s->nwaiting++;
    s->wait_cpu += cpu;
    s->wait_mem += mem;
    pthread_mutex_unlock(&s->wmu);
    if (p->parked_ms == 0) /* a create is counted once, however often it waits */
        atomic_fetch_add(&s->n_waited, 1);
    return 1;
}

/* The lightest offered type for a create: its requires, plus "network" when
 * it carries a network policy (every built-in type but sim's can be given one
 * on a node with network containment). */
static int pick_type(dsec_sched *s, const dsec_msg_create *c, dsec_type_mask offered, dsec_err *err)
{
    dsec_requires r;
    if (dsec_requires_parse(c->requires.v, c->requires.n, &r, err) < 0)
        return -1;
    if (c->net.n > 0)
        r.network = true;
    return dsec_registry_pick_parsed(s->reg, c->type, &r, offered, err);
}

/* What a create asks for, the cell's defaults where it names none. */
static uint64_t want_cpu(const dsec_sched *s, const dsec_msg_create *c)
{
    return c->cpu_milli ? c->cpu_milli : s->conf.default_cpu_milli;
}

static uint64_t want_mem(const dsec_sched *s, const dsec_msg_create *c)
{
    return c->memory_mb ? c->memory_mb : s->conf.default_memory_mb;
}

/* The node applies the same defaults from the same cell config (node-place.c, dsec__node_on_place).
 */
static uint64_t want_disk(const dsec_sched *s, const dsec_msg_create *c, int tidx)
{
    if (c->disk_mb)
        return c->disk_mb;
    return strcmp(dsec_registry_caps(s->reg, tidx)->type, "function") == 0
               ? s->conf.default_function_disk_mb
               : s->conf.default_disk_mb;
}

/* Place p (whose create fields are filled) on a node of this cell and send
 * it there. A rollout that finds no room waits; other failures answer the
 * client and return -1. */
static int place_and_send(dsec_sched *s, dsec_msg_place *p, const char *tenant, int tidx,
                          uint64_t t0)
{
    dsec_msg_create *c = &p->c;
    uint64_t cpu = want_cpu(s, c), mem = want_mem(s, c), disk = want_disk(s, c, tidx);
    dsec_err err;
    const char *tname = dsec_registry_caps(s->reg, tidx)->type;
    if (try_place(s, p, tidx, cpu, mem, disk, &err) == 0) {
        if (t0 != 0) /* retries and waiters were measured, if at all, when first placed */
            dsec_metrics_hist_observe(&s->place_lat, dsec_now_ns() - t0);
        return 0;
    }
    if (err.code == DSEC_E_CAPACITY && p->attempt <= 1 &&
        forward(s, c, tenant, tname, cpu, mem, p->reply_to))
        return 0;
    if (err.code == DSEC_E_CAPACITY) {
        int parked = park(s, p, tidx, cpu, mem, disk);
        if (parked != 0)
            return parked > 0 ? 0 : -1;
    }
    if (p->reason != NULL)
        dsec_err_wrap(&err, "after %s", p->reason);
    atomic_fetch_add(&s->n_failed, 1);
    dsec_wire_error_to(s->creates, s->bus, p->reply_to, &err, NULL, c->req_id);
    dsec__sched_quota_release(s, c);
    return -1;
}

/* ---- admission by the quota actor ------------------------------------------------ */

/* The create travels with the request (as received), so the replica keeps
 * no state for it; the answer's callback places it or passes the refusal on. */
struct admission {
    dsec_sched *s;
    int tidx;
    uint64_t t0; /* the create's arrival (dsec_now_ns) */
    char tenant[DSEC_NAME_LEN_MAX + 1];
    char *reply_to;
    size_t len;
    uint8_t payload[];
};

#define ADMIT_TIMEOUT_MS 2000

static void on_admit_answer(int status, dsec_msg *reply, const dsec_err *berr, void *ud)
{
    struct admission *ad = ud;
    dsec_sched *s = ad->s;
    dsec_err err;
    dsec_msg_place p = {.reply_to = ad->reply_to, .attempt = 1};
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CREATE, ad->payload, ad->len, &p.c, &err) < 0) {
        dsec_wire_error_to(s->creates, s->bus, ad->reply_to, &err, NULL, NULL);
        goto out;
    }
    p.c.tenant = ad->tenant;
    if (status < 0) {
        fail_to(s, ad->reply_to, p.c.req_id, berr->code,
                "admission: the quota actor of cell %s did not answer: %s", s->cell, berr->msg);
    } else if (dsec_wire_bus_error(reply, &err, "admission: the quota actor of cell %s", s->cell)) {
        /* its bus answered, not the actor (it was handing its lease over, or
         * full): an empty body would reach the client without its code */
        fail_to(s, ad->reply_to, p.c.req_id, err.code, "%s", err.msg);
    } else if (dsec_msg_type(reply) == NULL || strcmp(dsec_msg_type(reply), DSEC_TYPE_ERROR) == 0) {
        /* the quota actor's refusal says which level is full: pass it on as it is */
        atomic_fetch_add(&s->n_failed, 1);
        atomic_fetch_add(&s->n_over_quota, 1);
        dsec_hdr hdr = {
            .type = DSEC_TYPE_ERROR, .schema = DSEC_SCHEMA_VERSION, .req_id = p.c.req_id};
        if (dsec_actor_publish(s->creates, ad->reply_to, NULL, &hdr, dsec_msg_data(reply),
                               dsec_msg_len(reply), &err) < 0)
            dsec_actor_count_error(s->creates);
    } else {
        place_and_send(s, &p, ad->tenant, ad->tidx, ad->t0);
    }
out:
    dsec_free(ad->reply_to);
    dsec_free(ad);
    ask_end(s);
}

/* Ask the quota actor, then place (quota on), or place at once (off). The
 * create's bytes are copied: the answer comes after its message is gone. */
static void admit_and_place(dsec_sched *s, dsec_msg_place *p, const char *tenant, int tidx,
                            const void *payload, size_t len, uint64_t t0)
{
    if (!s->conf.quota) {
        place_and_send(s, p, tenant, tidx, t0);
        return;
    }
    dsec_err err;
    if (!ask_begin(s)) {
        fail_to(s, p->reply_to, p->c.req_id, DSEC_E_CLOSED, "scheduler %s is stopping", s->name);
        return;
    }
    struct admission *ad = dsec_malloc(sizeof *ad + len);
    char *reply_to = dsec_strdup(p->reply_to);
    if (ad == NULL || reply_to == NULL) {
        dsec_free(ad);
        dsec_free(reply_to);
        fail_to(s, p->reply_to, p->c.req_id, DSEC_E_NOMEM, "admission: out of memory");
        ask_end(s);
        return;
    }
    *ad = (struct admission){.s = s, .tidx = tidx, .t0 = t0, .reply_to = reply_to, .len = len};
    snprintf(ad->tenant, sizeof ad->tenant, "%s", tenant);
    memcpy(ad->payload, payload, len);
    const dsec_msg_create *c = &p->c;
    dsec_msg_admit am = {.tenant = tenant,
                         .project = c->project,
                         .req_id = c->req_id,
                         .n = 1,
                         .cpu_milli = want_cpu(s, c),
                         .memory_mb = want_mem(s, c)};
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_hdr hdr = {.type = "admit", .schema = DSEC_SCHEMA_VERSION, .req_id = c->req_id};
    int rc = dsec_encode(&b, DSEC_MSG_ADMIT, &am, &err);
    if (rc == 0)
        rc = dsec_bus_request(s->bus, s->quota_subj, &hdr, b.data, b.len, ADMIT_TIMEOUT_MS,
                              on_admit_answer, ad, &err);
    dsec_buf_release(&b);
    if (rc < 0) {
        fail_to(s, p->reply_to, c->req_id, err.code,
                "admission: asking the quota actor of cell %s: %s", s->cell, err.msg);
        dsec_free(ad->reply_to);
        dsec_free(ad);
        ask_end(s);
    }
}

/* A retried create asks the cell's nodes first whether the request id
 * already made a sandbox; only silence (the lookup times out) lets it be
 * placed. The state travels with the lookup, so the replica keeps none. */
#define LOOKUP_TIMEOUT_MS 100

struct lookup {
    dsec_sched *s;
    uint64_t t0; /* the create's arrival (dsec_now_ns) */
    uint64_t retry;
    char tenant[DSEC_NAME_LEN_MAX + 1];
    char *reply_to;
    size_t len;
    uint8_t payload[]; /* the create as received */
};

static void on_lookup_answer(int status, dsec_msg *reply, const dsec_err *berr, void *ud)
{
    struct lookup *l = ud;
    dsec_sched *s = l->s;
    dsec_err err;
    if (status == 0 &&
        dsec_wire_bus_error(reply, &err, "a node of cell %s asked whether it holds the create",
                            s->cell)) {
        /* an overloaded node may hold it: placing now could make it twice,
         * so the client retries (same req_id) instead */
        fail_to(s, l->reply_to, NULL, err.code, "%s", err.msg);
        goto out;
    }
    if (status == 0) {
        /* A node holds it: pass its "created" (existing) on to the client. If
         * another node made it too (both answers were lost), that one drops
         * its copy: this attempt's answer names the node that keeps it. */
        dsec_msg_created cr;
        if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CREATED, dsec_msg_data(reply),
                        dsec_msg_len(reply), &cr, &err) == 0 &&
            cr.node != NULL && cr.req_id != NULL)
            dsec_lost_superseded(s->lost, l->tenant, cr.req_id, cr.node, notice_retry(l->retry),
                                 dsec__sched_now_ms());
        dsec_hdr hdr = {.type = dsec_msg_type(reply),
                        .schema = DSEC_SCHEMA_VERSION,
                        .req_id = dsec_msg_header(reply, DSEC_HDR_REQ_ID)};
        if (dsec_actor_publish(s->creates, l->reply_to, NULL, &hdr, dsec_msg_data(reply),
                               dsec_msg_len(reply), &err) < 0)
            dsec_actor_count_error(s->creates);
        goto out;
    }
    dsec_msg_place p = {.reply_to = l->reply_to, .attempt = 1};
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CREATE, l->payload, l->len, &p.c, &err) < 0) {
        dsec_wire_error_to(s->creates, s->bus, l->reply_to, &err, NULL, NULL);
        goto out;
    }
    p.c.tenant = l->tenant;
    int tidx = pick_type(s, &p.c, dsec_registry_all(s->reg), &err);
    if (tidx < 0)
        dsec_wire_error_to(s->creates, s->bus, l->reply_to, &err, NULL, p.c.req_id);
    else
        admit_and_place(s, &p, l->tenant, tidx, l->payload, l->len, l->t0);
    (void)berr;
out:
    dsec_free(l->reply_to);
    dsec_free(l);
    ask_end(s);
}

static bool start_lookup(dsec_sched *s, dsec_msg *m, const char *tenant, const char *req_id,
                         uint64_t retry, uint64_t t0)
{
    if (!ask_begin(s)) { /* answered here: placing a retry unlooked-up could make it twice */
        fail_to(s, dsec_msg_reply(m), req_id, DSEC_E_CLOSED, "scheduler %s is stopping", s->name);
        return true;
    }
    struct lookup *l = dsec_malloc(sizeof *l + dsec_msg_len(m));
    if (l == NULL) {
        ask_end(s);
        return false;
    }
    l->s = s;
    l->t0 = t0;
    l->retry = retry;
    snprintf(l->tenant, sizeof l->tenant, "%s", tenant);
    l->reply_to = dsec_strdup(dsec_msg_reply(m));
    l->len = dsec_msg_len(m);
    memcpy(l->payload, dsec_msg_data(m), l->len);
    dsec_msg_op op = {
        .id = "-", .op = "lookup", .req_id = req_id, .tenant = tenant, .retry = retry};
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_err err;
    char subj[128];
    snprintf(subj, sizeof subj, DSEC_SUBJ_LOOKUP, s->cell);
    dsec_hdr hdr = {.type = "op", .schema = DSEC_SCHEMA_VERSION, .req_id = req_id};
    int rc = l->reply_to ? dsec_encode(&b, DSEC_MSG_OP, &op, &err) : -1;
    if (rc == 0)
        rc = dsec_bus_request(s->bus, subj, &hdr, b.data, b.len, LOOKUP_TIMEOUT_MS,
                              on_lookup_answer, l, &err);
    dsec_buf_release(&b);
    if (rc < 0) {
        dsec_free(l->reply_to);
        dsec_free(l);
        ask_end(s);
        return false;
    }
    return true;
}

/* dsec.v1.<tenant>.create[.<cell>] */
static void on_create(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_sched *s = ud;
    uint64_t t0 = dsec_now_ns();
    atomic_fetch_add(&s->n_creates, 1);
    const char *reply_to = dsec_msg_reply(m);
    if (reply_to == NULL) {
        dsec_actor_count_error(a); /* nobody to answer: a create must be a request */
        return;
    }
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_CREATE)) {
        atomic_fetch_add(&s->n_failed, 1);
        return;
    }
    /* Admission by delay first: a create shed here costs no decode and no look at the view,
     * which matters most exactly when the replica sheds many. */
    if (!dsec_admit_take(s->admit, t0 / 1000)) {
        dsec_msg_create shed_c = {.req_id = dsec_msg_header(m, DSEC_HDR_REQ_ID)};
        dsec__sched_shed_late(s, reply_to, &shed_c);
        return;
    }
    char buf[256];
    const char *tok[8];
    int nt = dsec_wire_tokens(dsec_msg_subject(m), buf, sizeof buf, tok, 8);
    const char *tenant = nt >= 4 ? tok[2] : "";
    dsec_err err;
    if (dsec_name_ok(tenant, DSEC_NAME_LEN_MAX) < 0) {
        /* the subject names the tenant: one that is no name cannot own a sandbox */
        char rid[65];
        fail_bad(s, reply_to,
                 dsec_msgpack_peek_str(dsec_msg_data(m), dsec_msg_len(m), "req_id", rid, sizeof rid)
                     ? rid
                     : dsec_msg_header(m, DSEC_HDR_REQ_ID),
                 "tenant",
                 "create: the subject's tenant token must be 1-64 characters of A-Z a-z 0-9 _ -");
        return;
    }
    dsec_msg_place p = {.reply_to = reply_to, .attempt = 1};
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CREATE, dsec_msg_data(m), dsec_msg_len(m), &p.c,
                    &err) < 0) {
        atomic_fetch_add(&s->n_failed, 1);
        dsec_wire_error(a, m, &err);
        return;
    }
    if (p.c.tenant != NULL && strcmp(p.c.tenant, tenant) != 0) {
        fail_to(s, reply_to, p.c.req_id, DSEC_E_PERMISSION,
                "create: tenant \"%s\" in the message does not match the subject's \"%s\"",
                p.c.tenant, tenant);
        return;
    }
    p.c.tenant = tenant;
    /* Admission: past its bound the replica answers at once, before any
     * lookup, quota round trip or placement, so nothing was done for it. */
    dsec_cell_summary sum;
    dsec_placement_summary(s->view, s->cell, dsec__sched_now_ms(), &sum);
    uint64_t held = dsec__sched_held_in(s, &sum);
    atomic_store(&s->held_seen, held);
    if (held >= s->conf.admit_max) {
        dsec__sched_shed(s, reply_to, &p.c, held, false,
                         "scheduler %s of cell %s holds %" PRIu64
                         " creates (scheduler.admit_max %u)",
                         s->name, s->cell, held, s->conf.admit_max);
        return;
    }
    dsec__sched_echoes ech;
    dsec__sched_echoes_of(s, p.c.deadline_ns != 0, &ech);
    if (ech.window > 0 && sum.reserved >= ech.window) {
        dsec__sched_shed_window(s, reply_to, &p.c, sum.reserved, ech.window, ech.taken_per_s);
        return;
    }
    dsec__sched_window_room(s, sum.reserved, ech.window);
    /* a create whose deadline comes before its placement would reach its node, as late as
     * this replica's placements reach theirs now, is answered now rather than placed late */
    uint64_t late_ms = ech.late_ms;
    if (late_ms > 0 && p.c.deadline_ns <= dsec_wall_ns() + late_ms * 1000000ull) {
        dsec__sched_shed_args(s, reply_to, &p.c, (unsigned)(late_ms < 60000 ? late_ms : 60000),
                              "scheduler %s of cell %s: its placements reach their nodes up to "
                              "%" PRIu64 " ms late, past the create's deadline",
                              s->name, s->cell, late_ms);
        return;
    }
    atomic_fetch_add(&s->n_admitted, 1);
    if (p.c.retry > 0 && p.c.hops == 0 && start_lookup(s, m, tenant, p.c.req_id, p.c.retry, t0))
        return;
    if (p.c.cell != NULL && strcmp(p.c.cell, s->cell) != 0) {
        fail_bad(s, reply_to, p.c.req_id, "cell",
                 "create: pinned to cell \"%s\" but sent to cell \"%s\"", p.c.cell, s->cell);
        return;
    }
    /* Choose among every type this process knows: a type offered only in
     * another cell is still a valid request here, and may be forwarded. */
    int tidx = pick_type(s, &p.c, sum.types ? sum.types : dsec_registry_all(s->reg), &err);
    if (tidx < 0 && err.code == DSEC_E_UNSUPPORTED && sum.types != 0)
        tidx = pick_type(s, &p.c, dsec_registry_all(s->reg), &err);
    if (tidx < 0) {
        atomic_fetch_add(&s->n_failed, 1);
        dsec_wire_error_to(a, s->bus, reply_to, &err, p.c.type ? "type" : "requires", p.c.req_id);
        return;
    }
    admit_and_place(s, &p, tenant, tidx, dsec_msg_data(m), dsec_msg_len(m), t0);
}

/* A node refused (dsec.v1.ctl.sched.<cell>.<name>.back): try another. */
static void on_back(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_sched *s = ud;
    dsec_err err;
    dsec_msg_place p;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_PLACE))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_PLACE, dsec_msg_data(m), dsec_msg_len(m), &p,
                    &err) < 0) {
        dsec_actor_count_error(a);
        return;
    }
    /* The node that refused is the last one tried: its reservation goes, and a refusal
     * for room tells what it really had free, so the next placements look elsewhere
     * (its report counted room that placements in flight had taken). */
    if (p.tried.n > 0) {
        /* a refusal is an answer: the node works, whatever its heartbeats say */
        dsec_placement_answered(s->view, p.tried.v[p.tried.n - 1], dsec__sched_now_ms());
        dsec_node_room room = {.seq = p.free_seq,
                               .cpu_free_milli = p.free_cpu_milli,
                               .mem_free_mb = p.free_mem_mb,
                               .slots_free = p.free_slots,
                               .disk_free_mb = p.free_disk_mb};
        dsec_placement_refused(s->view, p.tried.v[p.tried.n - 1], p.reservation,
                               p.short_of != NULL ? &room : NULL);
    }
    int tidx = dsec_registry_find(s->reg, p.c.type ? p.c.type : "");
    if (tidx < 0) {
        fail_to(s, p.reply_to, p.c.req_id, DSEC_E_INTERNAL, "refused placement of unknown type");
        dsec__sched_quota_release(s, &p.c);
        return;
    }
    if (p.attempt >= s->conf.max_attempts) {
        /* Refused for room by the last node: this view was too hopeful (a node's
         * report can count room that placements in flight already took). A
         * rollout waits for room, as one that found none here does. */
        if (p.short_of != NULL &&
            park(s, &p, tidx, want_cpu(s, &p.c), want_mem(s, &p.c), want_disk(s, &p.c, tidx)) != 0)
            return;
        fail_to(s, p.reply_to, p.c.req_id, DSEC_E_REFUSED,
                "placement refused %" PRIu64 " times; last: %s", p.attempt,
                p.reason ? p.reason : "no reason given");
        dsec__sched_quota_release(s, &p.c);
        return;
    }
    p.attempt++;
    atomic_fetch_add(&s->n_retried, 1);
    place_and_send(s, &p, p.c.tenant ? p.c.tenant : "default", tidx, 0);
}

static uint64_t create_key(const dsec_msg *cm, void *ud)
{
    const char *rid = dsec_msg_header((dsec_msg *)cm, DSEC_HDR_REQ_ID);
    uint64_t h = 1469598103934665603ull;
    for (const char *p = rid ? rid : ""; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return h;
}

/* ---- capacity events --------------------------------------------------------------- */

static void apply_capacity(dsec_sched *s, dsec_msg *m)
{
    dsec_err err;
    dsec_msg_capacity c;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CAPACITY, dsec_msg_data(m), dsec_msg_len(m), &c,
                    &err) < 0) {
        dsec_actor_count_error(s->events);
        return;
    }
    dsec_node_report r = {.node = c.node,
                          .cell = c.cell ? c.cell : s->cell,
                          .seq = c.seq,
                          .full = c.full,
                          .cpu_free_milli = c.cpu_free_milli,
                          .mem_free_mb = c.mem_free_mb,
                          .slots_free = c.slots_free,
                          .live = c.live,
                          .cpu_milli = c.cpu_milli,
                          .memory_mb = c.memory_mb,
                          .slots = c.slots,
                          .disk_free_mb = c.disk_free_mb,
                          .disk_mb = c.disk_mb,
                          .types = c.types.v,
                          .ntypes = c.types.n,
                          .label_keys = c.labels.k,
                          .label_vals = c.labels.v,
                          .nlabels = c.labels.n,
                          .layers = c.layers.v,
                          .nlayers = c.layers.n};
    /* the report's wait in this replica's own mailbox is not the node's delay: it is read
     * as of the report's arrival */
    const dsec_msg_place_echo *echo = c.echo.items;
    uint64_t arrived_us = dsec_admit_stamp() - dsec_actor_msg_waited_ns() / 1000;
    /* the report counts this replica's placements up to the stamp it echoes, none when it
     * echoes none of this replica's (every node manager echoes) */
    r.echo = true;
    for (uint32_t i = 0; i < c.echo.n; i++)
        if (strcmp(echo[i].scheduler, s->name) == 0) {
            dsec_admit_echo(s->admit, echo[i].sent_us, echo[i].age_us, echo[i].taken, arrived_us);
            r.taken_upto = echo[i].sent_us;
        }
    dsec_lost_seen(s->lost, c.node, c.full, c.usage.items, c.usage.n, c.conn, dsec__sched_now_ms());
    if (dsec_placement_update(s->view, &r, dsec__sched_now_ms(), &err) < 0)
        dsec_actor_count_error(s->events);
}

static void apply_summary(dsec_sched *s, dsec_msg *m)
{
    dsec_err err;
    dsec_msg_cell_summary c;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CELL_SUMMARY, dsec_msg_data(m), dsec_msg_len(m),
                    &c, &err) < 0) {
        dsec_actor_count_error(s->events);
        return;
    }
    pthread_mutex_lock(&s->mu);
    struct cell_seen *slot = NULL;
    for (size_t i = 0; i < s->ncells && slot == NULL; i++)
        if (strcmp(s->cells[i].name, c.cell) == 0)
            slot = &s->cells[i];
    if (slot == NULL && s->ncells < MAX_CELLS) {
        slot = &s->cells[s->ncells++];
        snprintf(slot->name, sizeof slot->name, "%s", c.cell);
    }
    if (slot != NULL) {
        slot->slots_free = c.slots_free;
        slot->cpu_free = c.cpu_free_milli;
        slot->mem_free = c.mem_free_mb;
        slot->nodes = c.nodes;
        slot->seen_ms = dsec__sched_now_ms();
        size_t used = (size_t)snprintf(slot->types, sizeof slot->types, ",");
        for (uint32_t i = 0; i < c.types.n && used < sizeof slot->types; i++)
            used += (size_t)snprintf(slot->types + used, sizeof slot->types - used, "%s,",
                                     c.types.v[i]);
    }
    pthread_mutex_unlock(&s->mu);
}

/* dsec.v1.ctl.evt.<cell>.node.<node>.<kind> and dsec.v1.ctl.evt.<cell>.summary */
static void on_event(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_sched *s = ud;
    char buf[256];
    const char *tok[8];
    int nt = dsec_wire_tokens(dsec_msg_subject(m), buf, sizeof buf, tok, 8);
    /* an event of another Dsec-Type is dropped (counted by dsec_wire_type_ok) */
    if (nt == 6 && strcmp(tok[5], "summary") == 0) {
        if (dsec_wire_type_ok(a, m, DSEC_MSG_CELL_SUMMARY))
            apply_summary(s, m);
    } else if (nt == 8 && strcmp(tok[7], "capacity") == 0) {
        if (dsec_wire_type_ok(a, m, DSEC_MSG_CAPACITY))
            apply_capacity(s, m);
    } else if (nt == 8 && strcmp(tok[7], "heartbeat") == 0) {
        if (!dsec_wire_type_ok(a, m, DSEC_MSG_HEARTBEAT))
            return;
        dsec_placement_heartbeat(s->view, tok[6], dsec__sched_now_ms());
        dsec_lost_seen(s->lost, tok[6], false, NULL, 0, 0, dsec__sched_now_ms());
    }
    /* announce: the full capacity report that follows it carries everything */
}

/* dsec.v1.ctl.ping: a health check answered by any replica. */
static void on_ping(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_sched *s = ud;
    dsec_err err;
    dsec_msg_ping p;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_PING))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_PING, dsec_msg_data(m), dsec_msg_len(m), &p,
                    &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    dsec_msg_pong pong = {.seq = p.seq, .sent_ns = p.sent_ns, .actor = s->name};
    if (dsec_wire_reply(a, m, DSEC_MSG_PONG, &pong, &err) < 0)
        dsec_actor_count_error(a);
}

/* dsec.v1.<tenant>.nodes: the nodes a fleet listing must hear from in this cell (one replica
 * per cell answers: its queue group), and the other cells it knows, so the client can tell
 * which cells stayed silent (docs/protocol.md, "Listing sandboxes"). The answer is the same
 * for every tenant: node names are not a tenant's secret. */
static void on_node_set(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_sched *s = ud;
    dsec_err err;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_NODE_SET))
        return;
    char **names = NULL;
    size_t nn = 0;
    if (dsec_placement_names(s->view, s->cell, &names, &nn, &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    const char *cells[MAX_CELLS];
    uint32_t nc = 0;
    uint64_t t = dsec__sched_now_ms();
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < s->ncells; i++)
        if (strcmp(s->cells[i].name, s->cell) != 0 &&
            t - s->cells[i].seen_ms <= 3ull * s->conf.summary_ms + 1000)
            cells[nc++] = s->cells[i].name; /* names are never rewritten once set */
    pthread_mutex_unlock(&s->mu);
    dsec_msg_node_set out = {.cell = s->cell,
                             .scheduler = s->name,
                             .nodes = {(const char **)names, (uint32_t)nn},
                             .cells = {cells, nc}};
    if (dsec_wire_reply(a, m, DSEC_MSG_NODE_SET, &out, &err) < 0)
        dsec_actor_count_error(a);
    dsec_placement_names_free(names, nn);
}

static uint64_t event_key(const dsec_msg *cm, void *ud)
{
    const char *subj = dsec_msg_subject(cm);
    uint64_t h = 1469598103934665603ull;
    for (; *subj; subj++)
        h = (h ^ (uint8_t)*subj) * 1099511628211ull;
    return h % 8; /* a few lanes: per-node order is kept, nodes interleave */
}

static struct waiter *list_tail(struct waiter *w)
{
    while (w->next != NULL)
        w = w->next;
    return w;
}

static void tick_summary(void *ud, uint64_t mono)
{
    dsec_sched *s = ud;
    dsec_cell_summary sum;
    dsec_placement_summary(s->view, s->cell, dsec__sched_now_ms(), &sum);
    const char *types[DSEC_REGISTRY_MAX];
    uint32_t nt = 0;
    for (int i = 0; i < DSEC_REGISTRY_MAX; i++)
        if (sum.types & (1u << i))
            types[nt++] = dsec_registry_caps(s->reg, i)->type;
    dsec_msg_cell_summary c = {.cell = s->cell,
                               .nodes = sum.nodes,
                               .cpu_free_milli = sum.cpu_free_milli,
                               .mem_free_mb = sum.mem_free_mb,
                               .slots_free = sum.slots_free,
                               .live = sum.live,
                               .types = {types, nt},
                               .ts_ns = dsec_wall_ns(),
                               .scheduler = s->name,
                               .held = dsec__sched_held_in(s, &sum),
                               .admitted = atomic_load(&s->n_admitted),
                               .shed = atomic_load(&s->n_shed)};
    pthread_mutex_lock(&s->wmu);
    c.parked = s->nwaiting;
    pthread_mutex_unlock(&s->wmu);
    char subj[128];
    snprintf(subj, sizeof subj, DSEC_SUBJ_EVT, s->cell, "summary");
    dsec_err err;
    if (dsec_wire_send(s->events, s->bus, subj, NULL, DSEC_MSG_CELL_SUMMARY, &c, NULL, &err) < 0)
        dsec_actor_count_error(s->events);
    (void)mono;
}

static void tick_expire(void *ud, uint64_t mono)
{
    dsec_sched *s = ud;
    char **names = NULL;
    size_t n = 0;
    dsec_err err;
    if (dsec_placement_expire(s->view, dsec__sched_now_ms(), &names, &n, &err) < 0)
        return;
    for (size_t i = 0; i < n; i++)
        dsec_log_warn("dsec-scheduler %s: node %s neither reported nor answered for %" PRIu64
                      " ms; out of placement",
                      s->name, names[i], dsec_placement_drain_after_ms(s->view));
    atomic_fetch_add(&s->n_expired, n);
    dsec_placement_names_free(names, n);
    dsec_lost_tick(s->lost, dsec__sched_now_ms());
    (void)mono;
}

/* ---- waiting rollouts ------------------------------------------------------------- */

static void publish_demand(dsec_sched *s, uint64_t n, uint64_t cpu, uint64_t mem, uint64_t oldest)
{
    dsec_msg_demand d = {.scheduler = s->name,
                         .cell = s->cell,
                         .waiting = n,
                         .cpu_milli = cpu,
                         .memory_mb = mem,
                         .oldest_ms = oldest,
                         .ts_ns = dsec_wall_ns()};
    char subj[128];
    snprintf(subj, sizeof subj, DSEC_SUBJ_EVT, s->cell, "demand");
    dsec_err err;
    if (dsec_wire_send(s->events, s->bus, subj, NULL, DSEC_MSG_DEMAND, &d, NULL, &err) < 0)
        dsec_actor_count_error(s->events);
}

/* Place waiting rollouts in arrival order as room appears; answer those
 * that waited too long; report what still waits. Once one fails for room,
 * requests at least as large are not tried again in this pass. */
static void tick_wait(void *ud, uint64_t mono)
{
    dsec_sched *s = ud;
    pthread_mutex_lock(&s->wmu);
    struct waiter *list = s->whead;
    s->whead = s->wtail = NULL;
    s->nticking = s->nwaiting; /* still parked for admission while this pass looks at them */
    s->nwaiting = s->wait_cpu = s->wait_mem = 0;
    pthread_mutex_unlock(&s->wmu);
    uint64_t t = dsec__sched_now_ms(), fail_cpu = UINT64_MAX, fail_mem = UINT64_MAX,
             fail_disk = UINT64_MAX;
    drain_update(s, t);
    struct waiter *keep = NULL, **kt = &keep;
    uint64_t n = 0, cpu = 0, mem = 0, oldest = 0, held = UINT64_MAX;
    while (list != NULL) {
        struct waiter *w = list;
        list = w->next;
        w->next = NULL;
        dsec_msg_place p;
        dsec_err err;
        int rc = -1;
        bool retry = !(w->cpu >= fail_cpu && w->mem >= fail_mem && w->disk >= fail_disk);
        if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_PLACE, w->place, w->len, &p, &err) < 0) {
            dsec_actor_count_error(s->creates);
            dsec_free(w);
            continue;
        }
        /* what is sent for it now (the place, a failure) follows its create's trace */
        dsec_trace_scope sc;
        dsec_trace_enter(&sc, NULL, w->trace[0] ? w->trace : NULL, NULL, NULL);
        if (retry) {
            rc = try_place(s, &p, w->tidx, w->cpu, w->mem, w->disk, &err);
            if (rc < 0 && err.code != DSEC_E_CAPACITY) {
                atomic_fetch_add(&s->n_failed, 1);
                dsec_wire_error_to(s->creates, s->bus, p.reply_to, &err, NULL, p.c.req_id);
                dsec__sched_quota_release(s, &p.c);
                rc = 0; /* answered */
            } else if (rc < 0) {
                fail_cpu = w->cpu < fail_cpu ? w->cpu : fail_cpu;
                fail_mem = w->mem < fail_mem ? w->mem : fail_mem;
                fail_disk = w->disk < fail_disk ? w->disk : fail_disk;
            }
        }
        if (rc == 0) {
            dsec_trace_leave(&sc);
            dsec_free(w);
            continue;
        }
        if (t - w->since_ms >= s->conf.wait_ms) {
            fail_to(s, p.reply_to, p.c.req_id, DSEC_E_CAPACITY,
                    "no room in cell %s for %" PRIu64 " milli-CPU, %" PRIu64
                    " MB of memory and %" PRIu64 " MB of disk after waiting %" PRIu64
                    " ms for preemptible work to give capacity back",
                    s->cell, w->cpu, w->mem, w->disk, t - w->since_ms);
            dsec__sched_quota_release(s, &p.c);
            dsec_trace_leave(&sc);
            dsec_free(w);
            continue;
        }
        if (deadline_near(s, p.c.deadline_ns)) {
            /* the client stops waiting before the next tick could place it:
             * an answer now, rather than its silent timeout */
            if (held == UINT64_MAX) /* one pass over the view per tick, not per shed */
                held = dsec__sched_held_now(s);
            dsec__sched_shed(s, p.reply_to, &p.c, held, true,
                             "no room in cell %s after waiting %" PRIu64
                             " ms, and the create's deadline is near",
                             s->cell, t - w->since_ms);
            dsec_trace_leave(&sc);
            dsec_free(w);
            continue;
        }
        dsec_trace_leave(&sc);
        n++;
        cpu += w->cpu;
        mem += w->mem;
        if (t - w->since_ms > oldest)
            oldest = t - w->since_ms;
        *kt = w;
        kt = &w->next;
    }
    /* put the survivors back in front of what arrived meanwhile */
    pthread_mutex_lock(&s->wmu);
    if (keep != NULL) {
        *kt = s->whead;
        if (s->whead == NULL)
            s->wtail = list_tail(keep);
        s->whead = keep;
    }
    s->nticking = 0;
    s->nwaiting += n;
    s->wait_cpu += cpu;
    s->wait_mem += mem;
    n = s->nwaiting;
    cpu = s->wait_cpu;
    mem = s->wait_mem;
    bool report = n > 0 || s->demand_sent;
    s->demand_sent = n > 0;
    pthread_mutex_unlock(&s->wmu);
    if (report)
        publish_demand(s, n, cpu, mem, oldest);
    (void)mono;
}

/* ---- lifecycle ------------------------------------------------------------------------ */

int dsec_sched_start(dsec_sched **out, dsec_bus *bus, dsec_ticker *ticker, const dsec_registry *reg,
                     const dsec_sched_conf *conf, dsec_err *err)
{
    *out = NULL;
    if (dsec_name_ok(conf->cell, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "scheduler: cell \"%s\" is not a valid name",
                            conf->cell ? conf->cell : "");
    dsec_sched *s = dsec_calloc(1, sizeof *s);
    if (s == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->wmu, NULL);
    pthread_mutex_init(&s->amu, NULL);
    pthread_mutex_init(&s->vmu, NULL);
    pthread_cond_init(&s->acv, NULL);
    s->ticks[0] = s->ticks[1] = s->ticks[2] = -1;
    s->bus = bus;
    s->ticker = ticker;
    s->reg = reg;
    s->conf = *conf;
    s->conf.k = conf->k ? conf->k : 3;
    s->conf.max_attempts = conf->max_attempts ? conf->max_attempts : 3;
    s->conf.max_hops = conf->max_hops ? conf->max_hops : 2;
    s->conf.dead_after_ms = conf->dead_after_ms ? conf->dead_after_ms : 3000;
    s->conf.heartbeat_ms = conf->heartbeat_ms ? conf->heartbeat_ms : 1000;
    s->conf.suspect_after_ms = conf->suspect_after_ms; /* 0: the view's default */
    s->conf.drain_gap_ms = conf->drain_gap_ms ? conf->drain_gap_ms : 1000;
    s->conf.probation_ms = conf->probation_ms ? conf->probation_ms : 3 * s->conf.heartbeat_ms;
    s->conf.lost_after_ms = conf->lost_after_ms ? conf->lost_after_ms : 30000;
    s->conf.summary_ms = conf->summary_ms ? conf->summary_ms : 1000;
    s->conf.default_cpu_milli = conf->default_cpu_milli ? conf->default_cpu_milli : 1000;
    s->conf.default_memory_mb = conf->default_memory_mb ? conf->default_memory_mb : 512;
    s->conf.default_disk_mb = conf->default_disk_mb ? conf->default_disk_mb : 1024;
    s->conf.default_function_disk_mb =
        conf->default_function_disk_mb ? conf->default_function_disk_mb : 64;
    s->conf.wait_ms = conf->wait_ms ? conf->wait_ms : 30000;
    s->conf.demand_ms = conf->demand_ms ? conf->demand_ms : 250;
    s->conf.admit_max = conf->admit_max ? conf->admit_max : 65536;
    s->conf.park_max = conf->park_max ? conf->park_max : 65536;
    if (s->conf.park_max > s->conf.admit_max) /* parked rollouts are part of what it holds */
        s->conf.park_max = s->conf.admit_max;
    snprintf(s->cell, sizeof s->cell, "%s", conf->cell);
    if (conf->name != NULL && dsec_name_ok(conf->name, DSEC_NAME_LEN_MAX) == 0) {
        snprintf(s->name, sizeof s->name, "%s", conf->name);
    } else {
        char id[33];
        dsec_bus_new_id(id);
        snprintf(s->name, sizeof s->name, "sched-%.12s", id);
    }
    s->conf.cell = s->cell;
    s->conf.name = s->name;
    snprintf(s->back, sizeof s->back, DSEC_SUBJ_SCHED_BACK, s->cell, s->name);
    snprintf(s->quota_subj, sizeof s->quota_subj, DSEC_SUBJ_QUOTA_ADMIT, s->cell);
    dsec_placement_config pc = {.cell = s->cell,
                                .dead_after_ms = s->conf.dead_after_ms,
                                .heartbeat_ms = s->conf.heartbeat_ms,
                                .suspect_after_ms = s->conf.suspect_after_ms,
                                .drain_gap_ms = s->conf.drain_gap_ms,
                                .probation_ms = s->conf.probation_ms,
                                .locality_weight = -1};
    char subj[256], queue[128];
    if ((s->admit = dsec_admit_new(s->conf.admit_delay_ms)) == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        goto out_fail;
    }
    if (dsec_placement_new(&s->view, reg, &pc, err) < 0 ||
        dsec_lost_new(&s->lost, bus, s->cell, s->name, s->conf.lost_after_ms, s->conf.dead_after_ms,
                      err) < 0)
        goto out_fail;
    if (dsec_actor_new(&s->creates, bus, s->name, err) < 0)
        goto out_fail;
    dsec_actor_set_key(s->creates, create_key, s);
    snprintf(queue, sizeof queue, "dsec-sched");
    /* Creates only are shed for their wait: a refusal coming back (on_back) was
     * admitted already, and its client waits for its placement. */
    dsec_actor_set_shed(s->creates, s->conf.shed_after_ms);
    snprintf(subj, sizeof subj, DSEC_SUBJ_CREATE, "*");
    if (dsec_actor_on_shed(s->creates, subj, queue, on_create, on_create_shed, s, err) < 0)
        goto out_fail;
    snprintf(subj, sizeof subj, DSEC_SUBJ_CREATE_CELL, "*", s->cell);
    snprintf(queue, sizeof queue, "dsec-sched.%s", s->cell);
    if (dsec_actor_on_shed(s->creates, subj, queue, on_create, on_create_shed, s, err) < 0 ||
        dsec_actor_on(s->creates, s->back, NULL, on_back, s, err) < 0)
        goto out_fail;
    char evname[DSEC_NAME_LEN_MAX + 8];
    snprintf(evname, sizeof evname, "%s.events", s->name);
    if (dsec_actor_new(&s->events, bus, evname, err) < 0)
        goto out_fail;
    dsec_actor_set_key(s->events, event_key, s);
    char summaries[64];
    snprintf(subj, sizeof subj, DSEC_SUBJ_EVT_OF, s->cell, "node", ">");
    snprintf(summaries, sizeof summaries, DSEC_SUBJ_EVT, "*", "summary");
    if (dsec_actor_on(s->events, subj, NULL, on_event, s, err) < 0 ||
        dsec_actor_on(s->events, summaries, NULL, on_event, s, err) < 0 ||
        dsec_actor_on(s->events, DSEC_SUBJ_PING, "dsec-ping", on_ping, s, err) < 0)
        goto out_fail;
    snprintf(queue, sizeof queue, "dsec-nodes.%s", s->cell);
    snprintf(subj, sizeof subj, DSEC_SUBJ_NODES, "*");
    if (dsec_actor_on(s->events, subj, queue, on_node_set, s, err) < 0)
        goto out_fail;
    if ((s->ticks[0] = dsec_ticker_add(ticker, s->conf.summary_ms, tick_summary, s, err)) < 0 ||
        (s->ticks[1] = dsec_ticker_add(ticker, 500, tick_expire, s, err)) < 0 ||
        (s->ticks[2] = dsec_ticker_add(ticker, s->conf.demand_ms, tick_wait, s, err)) < 0)
        goto out_fail;
    /* Ask for full reports now rather than waiting for the next period. */
    snprintf(subj, sizeof subj, DSEC_SUBJ_SYNC_CELL, s->cell);
    if (dsec_bus_flush(bus, 2000, err) < 0 ||
        dsec_bus_publish(bus, subj, NULL,
                         &(dsec_hdr){.type = "sync", .schema = DSEC_SCHEMA_VERSION}, "", 0,
                         err) < 0)
        goto out_fail;
    *out = s;
    return 0;
out_fail:
    dsec_sched_stop(s);
    return -1;
}

void dsec_sched_stop(dsec_sched *s)
{
    if (s == NULL)
        return;
    dsec_ticker_remove(s->ticker, s->ticks[0]);
    dsec_ticker_remove(s->ticker, s->ticks[1]);
    dsec_ticker_remove(s->ticker, s->ticks[2]);
    /* The callbacks of admissions and lookups use s and its actors: no new
     * ones, and the ones in flight answered (each has a deadline) first. */
    pthread_mutex_lock(&s->amu);
    s->stopping = true;
    while (s->asking > 0)
        pthread_cond_wait(&s->acv, &s->amu);
    pthread_mutex_unlock(&s->amu);
    dsec_actor_free(s->creates);
    dsec_actor_free(s->events);
    while (s->whead != NULL) { /* nobody will place them: say so */
        struct waiter *w = s->whead;
        s->whead = w->next;
        dsec_msg_place p;
        dsec_err err;
        if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_PLACE, w->place, w->len, &p, &err) == 0) {
            dsec_trace_scope sc;
            dsec_trace_enter(&sc, NULL, w->trace[0] ? w->trace : NULL, NULL, NULL);
            dsec_err_set(&err, DSEC_E_CLOSED, 0,
                         "scheduler %s stopped while the create waited for room", s->name);
            dsec_wire_error_to(NULL, s->bus, p.reply_to, &err, NULL, p.c.req_id);
            dsec__sched_quota_release(s, &p.c);
            dsec_trace_leave(&sc);
        }
        dsec_free(w);
    }
    pthread_mutex_destroy(&s->wmu);
    pthread_cond_destroy(&s->acv);
    pthread_mutex_destroy(&s->amu);
    pthread_mutex_destroy(&s->vmu);
    dsec_placement_free(s->view);
    dsec_lost_free(s->lost); /* after the actors and the ticks: nothing calls it any more */
    dsec_admit_free(s->admit);
    pthread_mutex_destroy(&s->mu);
    dsec_free(s);
}

void dsec_sched_stats_get(dsec_sched *s, dsec_sched_stats *o)
{
    *o = (dsec_sched_stats){.creates = s->n_creates,
                            .placed = s->n_placed,
                            .retried = s->n_retried,
                            .forwarded = s->n_forwarded,
                            .failed = s->n_failed,
                            .nodes = dsec_placement_count(s->view),
                            .expired = s->n_expired,
                            .waited = s->n_waited,
                            .over_quota = s->n_over_quota,
                            .admitted = s->n_admitted,
                            .shed = s->n_shed};
    pthread_mutex_lock(&s->wmu);
    o->waiting = s->nwaiting;
    pthread_mutex_unlock(&s->wmu);
    o->held = dsec__sched_held_now(s);
    o->shed_late = atomic_load(&s->n_shed_late);
    o->shed_window = atomic_load(&s->n_shed_window);
    dsec_admit_stats as;
    dsec_admit_stats_get(s->admit, &as);
    o->admit_limit = as.limit_per_s;
    o->place_delay_us = as.delay_us;
    o->late_placements = as.late;
    o->admit_cuts = as.cuts;
    o->taken_per_s = as.taken_per_s;
    o->place_echoes = as.echoes;
    dsec_lost_stats ls;
    dsec_lost_stats_get(s->lost, &ls);
    o->superseded = ls.superseded;
    o->superseded_resent = ls.resent;
    dsec_placement_health h;
    dsec_placement_health_get(s->view, dsec__sched_now_ms(), &h);
    o->suspect = h.suspect;
    o->drains_deferred = h.deferred;
    o->readmitted = h.readmitted;
}

void dsec_sched_place_latency(dsec_sched *s, dsec_metrics_hist_snap *out)
{
    dsec_metrics_hist_read(&s->place_lat, out);
}

const char *dsec_sched_name(const dsec_sched *s)
{
    return s->name;
}

size_t dsec_sched_actors(const dsec_sched *s, const dsec_actor **out, size_t max)
{
    size_t k = 0;
    if (k < max && s->creates)
        out[k++] = s->creates;
    if (k < max && s->events)
        out[k++] = s->events;
    return k;
}
