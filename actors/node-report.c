/* node-report.c - what the node tells its cell: reports, heartbeats, the reaper, notices. */
#include "actors/node-int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "actors/wire.h"
#include "codecs/subjects.h"
#include "dsec/alloc.h"
#include "dsec/log.h"

/* ---- reports ---------------------------------------------------------------- */

/* What each (tenant, project) holds here, for the quota actors: collected
 * under the node lock together with taking the queued events, so the events
 * that leave before a full report are exactly those the report includes. */
struct usage_set {
    dsec_msg_usage *v; /* open-addressed by (tenant, project) while collecting, then packed */
    char (*names)[2][DSEC_NAME_LEN_MAX + 1]; /* what v's strings point to once packed: the
                                                sandboxes may be gone when the report is sent */
    size_t cap, n;
};

static void usage_collect_locked(dsec_node *n, struct usage_set *u)
{
    size_t cap = 16;
    while (cap < n->live * 2 + 1)
        cap *= 2;
    u->v = dsec_calloc(cap, sizeof *u->v);
    u->names = dsec_malloc(cap * sizeof *u->names);
    if (u->v == NULL || u->names == NULL) {
        dsec_free(u->v);
        dsec_free(u->names);
        *u = (struct usage_set){0}; /* the report goes without usage; the next one has it */
        return;
    }
    u->cap = cap;
    u->n = 0;
    for (size_t b = 0; b < n->nbuckets; b++)
        for (struct sbx *s = n->by_id[b]; s; s = s->next_id) {
            size_t i = dsec__node_hash_str(s->tenant, s->project) & (cap - 1);
            while (u->v[i].tenant && (strcmp(u->v[i].tenant, s->tenant) != 0 ||
                                      strcmp(u->v[i].project, s->project) != 0))
                i = (i + 1) & (cap - 1);
            if (u->v[i].tenant == NULL) {
                u->v[i].tenant = s->tenant;
                u->v[i].project = s->project;
                u->n++;
            }
            u->v[i].sandboxes++;
            u->v[i].cpu_milli += s->cpu_milli;
            u->v[i].memory_mb += s->memory_mb;
        }
    /* pack: the report lists them in a row; "" projects travel as absent */
    size_t k = 0;
    for (size_t i = 0; i < u->cap; i++)
        if (u->v[i].tenant) {
            u->v[k] = u->v[i];
            snprintf(u->names[k][0], sizeof u->names[k][0], "%s", u->v[i].tenant);
            snprintf(u->names[k][1], sizeof u->names[k][1], "%s", u->v[i].project);
            u->v[k].tenant = u->names[k][0];
            u->v[k].project = u->names[k][1][0] ? u->names[k][1] : NULL;
            k++;
        }
    u->n = k;
}

static void publish_capacity(dsec_node *n, bool full, uint64_t now, const struct usage_set *u)
{
    pthread_mutex_lock(&n->mu);
    dsec_msg_capacity c = {.node = n->name,
                           .cell = n->cell,
                           .seq = ++n->seq,
                           .full = full,
                           .cpu_free_milli = n->cpu_free,
                           .mem_free_mb = n->mem_free,
                           .slots_free = n->slots_free,
                           .live = n->live,
                           .disk_free_mb = n->disk_free,
                           .ts_ns = dsec_wall_ns()};
    n->dirty = false;
    c.conn = n->conn_base + dsec_bus_reconnects(n->bus);
    /* each stamp is handed back once: a scheduler counts every echo as a fresh sample */
    dsec_msg_place_echo echo[NODE_ECHO_MAX];
    char echo_name[NODE_ECHO_MAX][sizeof n->echo[0].scheduler];
    uint32_t necho = 0;
    uint64_t mono = dsec_now_ns();
    for (int i = 0; i < NODE_ECHO_MAX; i++)
        if (n->echo[i].at_ns != 0) {
            uint32_t k = necho++;
            memcpy(echo_name[k], n->echo[i].scheduler, sizeof echo_name[k]);
            echo[k] = (dsec_msg_place_echo){.scheduler = echo_name[k],
                                            .sent_us = n->echo[i].sent_us,
                                            .age_us = (mono - n->echo[i].at_ns) / 1000,
                                            .taken = n->echo[i].taken};
            n->echo[i].at_ns = n->echo[i].taken = 0;
        }
    c.echo = (dsec_list){echo, necho};
    uint64_t by_type[DSEC_REGISTRY_MAX];
    memcpy(by_type, n->live_by_type, sizeof by_type);
    pthread_mutex_unlock(&n->mu);
    /* per offered type, so `dsec top` can show sandboxes by type */
    const char *tk[DSEC_REGISTRY_MAX], *tv[DSEC_REGISTRY_MAX];
    char counts[DSEC_REGISTRY_MAX][24];
    uint32_t ntk = 0;
    for (int i = 0; i < DSEC_REGISTRY_MAX; i++)
        if (n->offered & (1u << i)) {
            snprintf(counts[ntk], sizeof counts[ntk], "%" PRIu64, by_type[i]);
            tk[ntk] = dsec__node_type_name(n, i);
            tv[ntk] = counts[ntk];
            ntk++;
        }
    c.live_types = (dsec_kv){tk, tv, ntk};
    const char *lk[64], *lv[64];
    if (full) {
        c.cpu_milli = n->conf.cpu_milli;
        c.memory_mb = n->conf.memory_mb;
        c.slots = n->conf.slots;
        /* disk_open made sure the disk is more than the reserve */
        c.disk_mb = n->conf.disk_mb - n->conf.disk_reserve_mb;
        uint32_t nt = 0;
        while (n->type_names[nt])
            nt++;
        c.types = (dsec_strv){(const char **)n->type_names, nt};
        size_t nl = n->nlabels < 64 ? n->nlabels : 64;
        for (size_t i = 0; i < nl; i++) {
            lk[i] = n->labels[i].key;
            lv[i] = n->labels[i].value;
        }
        c.labels = (dsec_kv){lk, lv, (uint32_t)nl};
        c.usage = (dsec_list){u->v, (uint32_t)u->n};
        n->last_full_ns = now;
    }
    char subj[256];
    snprintf(subj, sizeof subj, "%s.capacity", n->subj_evt_node);
    dsec_err err;
    if (dsec_wire_send(n->actor, n->bus, subj, NULL, DSEC_MSG_CAPACITY, &c, NULL, &err) < 0)
        dsec_actor_count_error(n->actor);
}

/* Send the events taken from the queue (and free them). */
static void send_events(dsec_node *n, struct event *ev, size_t ne)
{
    if (ne == 0) {
        dsec_free(ev);
        return;
    }
    /* One message per batch, not per transition: events must not multiply
     * the bus messages per create. */
    dsec_msg_sandbox_event *items = dsec_calloc(ne, sizeof *items);
    if (items != NULL) {
        for (size_t i = 0; i < ne; i++)
            items[i] =
                (dsec_msg_sandbox_event){.id = ev[i].id,
                                         .state = dsec__node_state_names[ev[i].state],
                                         .prev = dsec__node_state_names[ev[i].prev],
                                         .node = n->name,
                                         .type = dsec__node_type_name(n, ev[i].type_idx),
                                         .tenant = ev[i].tenant,
                                         .ts_ns = ev[i].ts_ns,
                                         .reason = ev[i].reason[0] ? ev[i].reason : NULL,
                                         .project = ev[i].project[0] ? ev[i].project : NULL,
                                         .req_id = ev[i].req_id[0] ? ev[i].req_id : NULL,
                                         .cpu_milli = ev[i].cpu_milli,
                                         .memory_mb = ev[i].memory_mb,
                                         .trace_id = ev[i].trace_id[0] ? ev[i].trace_id : NULL};
        for (size_t off = 0; off < ne; off += 4096) {
            size_t cnt = ne - off < 4096 ? ne - off : 4096;
            dsec_msg_sandbox_events batch = {
                .node = n->name, .cell = n->cell, .events = {items + off, (uint32_t)cnt}};
            dsec_err err;
            if (dsec_wire_send(n->actor, n->bus, n->subj_evt_sbx, NULL, DSEC_MSG_SANDBOX_EVENTS,
                               &batch, NULL, &err) < 0)
                dsec_actor_count_error(n->actor);
        }
        dsec__node_send_tenant_events(n, items, ne);
    }
    dsec_free(items);
    dsec_free(ev);
}

/* Queued events, then a capacity report (full when due or forced). One
 * report at a time (report_mu), so reports leave in the order they were
 * taken and each full report's usage covers the events sent before it. */
static void report(dsec_node *n, bool force_full, uint64_t now)
{
    pthread_mutex_lock(&n->report_mu);
    bool full = force_full || now - n->last_full_ns >= (uint64_t)n->conf.full_ms * 1000000ull;
    struct usage_set u = {0};
    pthread_mutex_lock(&n->mu);
    struct event *ev = n->events;
    size_t ne = n->nevents;
    n->events = NULL;
    n->nevents = n->cap_events = 0;
    if (full)
        usage_collect_locked(n, &u);
    if (full && u.v == NULL)
        full = false; /* out of memory: a full report without usage would zero this node's
                         share at the quota actor; the next tick tries again */
    bool dirty = n->dirty;
    pthread_mutex_unlock(&n->mu);
    /* events first: a quota actor applies them, then the full report's usage replaces its
     * count for this node, and that usage already includes every one of them */
    send_events(n, ev, ne);
    if (dirty || full)
        publish_capacity(n, full, now, &u);
    pthread_mutex_unlock(&n->report_mu);
    dsec_free(u.v);
    dsec_free(u.names);
}

void dsec__node_tick_capacity(void *ud, uint64_t now)
{
    report(ud, false, now);
}

void dsec__node_tick_sync(void *ud, uint64_t now)
{
    dsec_node *n = ud;
    dsec_err err;
    if (dsec_journal_sync(n->journal, &err) < 0)
        dsec_actor_count_error(n->actor);
}

void dsec__node_tick_heartbeat(void *ud, uint64_t now)
{
    dsec_node *n = ud;
    dsec_msg_heartbeat hb = {
        .node = n->name, .cell = n->cell, .seq = ++n->hb_seq, .ts_ns = dsec_wall_ns()};
    char subj[256];
    snprintf(subj, sizeof subj, "%s.heartbeat", n->subj_evt_node);
    dsec_err err;
    if (dsec_wire_send(n->actor, n->bus, subj, NULL, DSEC_MSG_HEARTBEAT, &hb, NULL, &err) < 0)
        dsec_actor_count_error(n->actor);
}

/* Reap sandboxes past their lifetime or idle too long. The destroy goes
 * through the sandbox's own mailbox, so it runs in order with its other
 * operations. */
void dsec__node_tick_reap(void *ud, uint64_t mono_now)
{
    dsec_node *n = ud;
    uint64_t now = dsec_wall_ns();
    enum { BATCH = 512 };
    char ids[BATCH][DSEC_SBX_ID_LEN_MAX + 1];
    char tenants[BATCH][DSEC_NAME_LEN_MAX + 1];
    size_t k = 0;
    uint64_t lost_before = atomic_load(&n->lost_before_ns);
    pthread_mutex_lock(&n->mu);
    for (size_t b = 0; b < n->nbuckets && k < BATCH; b++)
        for (struct sbx *s = n->by_id[b]; s && k < BATCH; s = s->next_id) {
            if (s->reap != REAP_NONE || (s->state != ST_RUNNING && s->state != ST_PAUSED))
                continue;
            uint8_t why = REAP_NONE;
            if (s->created_ns < lost_before)
                why = REAP_LOST;
            else if (s->superseded)
                why = REAP_SUPERSEDED;
            else if (s->ttl_ns && dsec__node_age_ns(now, s->created_ns) >= s->ttl_ns)
                why = REAP_TTL;
            else if (s->idle_ns && dsec__node_age_ns(now, s->last_ns) >= s->idle_ns &&
                     atomic_load(&s->running) == 0)
                why = REAP_IDLE; /* a command that runs longer than the idle time is not idle */
            if (why == REAP_NONE)
                continue;
            s->reap = why;
            memcpy(ids[k], s->id, sizeof ids[k]);
            memcpy(tenants[k], s->tenant, sizeof tenants[k]);
            k++;
        }
    bool compact = dsec_journal_wants_compaction(n->journal, n->live + n->nkept + n->ngone);
    /* Memory pressure: freeze idle pausable rollouts (their next operation
     * resumes them), a few per pass, until free memory is back over the mark. */
    size_t kfreeze = k;
    uint64_t want_mb = n->conf.memory_mb * n->conf.pressure_free_pct / 100;
    uint64_t idle_ns = (uint64_t)n->conf.pause_idle_ms * 1000000ull, gain = 0;
    for (size_t b = 0; n->conf.pause_idle_ms != UINT64_MAX && b < n->nbuckets && k < BATCH &&
                       n->mem_free + gain < want_mb;
         b++)
        for (struct sbx *s = n->by_id[b]; s && k < BATCH && n->mem_free + gain < want_mb;
             s = s->next_id) {
            if (!s->pausable || s->state != ST_RUNNING || s->freezing || s->reap != REAP_NONE ||
                dsec__node_age_ns(now, s->last_ns) < idle_ns)
                continue;
            s->freezing = true;
            gain += dsec__node_mem_held(s);
            memcpy(ids[k], s->id, sizeof ids[k]);
            memcpy(tenants[k], s->tenant, sizeof tenants[k]);
            k++;
        }
    pthread_mutex_unlock(&n->mu);
    for (size_t i = 0; i < k; i++) {
        char subj[256];
        if (snprintf(subj, sizeof subj, DSEC_SUBJ_SBX, tenants[i], n->name, ids[i], "op") >=
            (int)sizeof subj)
            continue; /* names are checked where they enter: cannot happen */
        dsec_msg_op op = {
            .id = ids[i], .op = i < kfreeze ? "destroy" : "freeze", .tenant = tenants[i]};
        dsec_err err;
        if (dsec_wire_send(n->actor, n->bus, subj, NULL, DSEC_MSG_OP, &op, NULL, &err) < 0)
            dsec_actor_count_error(n->actor);
    }
    if (compact) {
        dsec_err err;
        pthread_mutex_lock(&n->mu);
        int rc = dsec_journal_compact(n->journal, dsec__node_emit_live, n, &err);
        pthread_mutex_unlock(&n->mu);
        if (rc < 0)
            dsec_actor_count_error(n->actor);
    }
    (void)mono_now;
}

/* A retried create: answer if this node already holds the request id. Keyed
 * like placements (by request id), so a placement of the same request queued
 * before this lookup is handled first. Nodes without it stay silent. */
void dsec__node_on_lookup(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_node *n = ud;
    dsec_err err;
    dsec_msg_op op;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_OP))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_OP, dsec_msg_data(m), dsec_msg_len(m), &op,
                    &err) < 0) {
        dsec_wire_error(a, m, &err); /* malformed: an error, not the silence of "not here" */
        return;
    }
    if (op.req_id == NULL || op.tenant == NULL) {
        dsec__node_reply_bad(n, m, op.req_id == NULL ? "req_id" : "tenant",
                             "lookup: req_id and tenant are required");
        return;
    }
    pthread_mutex_lock(&n->mu);
    struct sbx *s = dsec__node_find_req(n, op.tenant, op.req_id);
    if (s != NULL && dsec_msg_reply(m) != NULL && op.retry > s->lookup_retry) {
        /* other holders may answer too: the scheduler's notice names the one kept. Journaled
         * before the answer: a node manager restarted before that notice came must still
         * leave alone what it answered when a notice of an earlier attempt arrives first
         * (the client may hold it). */
        s->lookup_retry = op.retry > UINT32_MAX ? UINT32_MAX : (uint32_t)op.retry;
        if ((s->state == ST_RUNNING || s->state == ST_PAUSED) &&
            dsec__node_journal_put(n, s, &err) < 0)
            dsec_actor_count_error(n->actor);
    }
    pthread_mutex_unlock(&n->mu);
    if (s != NULL && dsec_msg_reply(m) != NULL)
        dsec__node_send_created(n, dsec_msg_reply(m), s, true, op.req_id);
}

/* dsec.v1.ctl.superseded.<cell>[.<node>]: attempt r of a retried create
 * was placed on, or found by its lookup on, node W. Here:
 * - W is this node: the sandbox it holds for the request is the one kept
 *   for attempt r (a late notice of an earlier attempt leaves it alone);
 * - otherwise a sandbox made here for an earlier attempt has no owner (its
 *   answer was lost, or another holder's answer was passed on): it answers
 *   its request id no more and the reaper destroys it, in order with its
 *   other operations. It is kept if attempt r or a later one was placed
 *   here (W refused r and it came here), or a later attempt's lookup found
 *   it (that attempt's notice decides).
 * A placement of an attempt before r that arrives later is not created.
 * Repeats are harmless. */
void dsec__node_on_superseded(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_node *n = ud;
    dsec_err err;
    dsec_msg_superseded_list l;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_SUPERSEDED_LIST))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_SUPERSEDED_LIST, dsec_msg_data(m),
                    dsec_msg_len(m), &l, &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    const dsec_msg_superseded *it = l.items.items;
    uint64_t now = dsec_wall_ns(), dropping = 0;
    pthread_mutex_lock(&n->mu);
    for (size_t i = 0; i < l.items.n; i++) {
        uint32_t retry = it[i].retry > UINT32_MAX ? UINT32_MAX : (uint32_t)it[i].retry;
        struct sbx *s = dsec__node_find_req(n, it[i].tenant, it[i].req_id);
        if (strcmp(it[i].node, n->name) == 0) {
            if (s != NULL)
                dsec__node_answers_locked(n, s, retry);
            continue;
        }
        dsec__node_add_tomb(n, it[i].tenant, it[i].req_id, retry, now);
        if (s != NULL && s->retry < retry && s->lookup_retry <= retry) {
            s->superseded = true;
            dropping++;
        }
    }
    pthread_mutex_unlock(&n->mu);
    if (dropping > 0)
        dsec_log_warn("dsec-node %s: %" PRIu64
                      " sandbox(es) made for create attempts that were retried and "
                      "kept on other nodes (their answers were lost): destroying them",
                      n->name, dropping);
    if (dsec_msg_reply(m) == NULL)
        return;
    char c[24];
    snprintf(c, sizeof c, "%" PRIu64, dropping);
    const char *k[] = {"dropping"}, *v[] = {c};
    dsec_msg_op_reply r = {
        .id = n->name, .state = "superseded", .node = n->name, .info = {k, v, 1}};
    if (dsec_wire_reply(a, m, DSEC_MSG_OP_REPLY, &r, &err) < 0)
        dsec_actor_count_error(a);
}

/* dsec.v1.ctl.reconcile.<node>: a scheduler declared this node lost while it
 * was silent and told the owners of its sandboxes. Everything made before
 * then is theirs no longer: the reaper destroys it (in order with each
 * sandbox's other operations), so nothing is left orphaned. Repeats are
 * harmless; the answer says how many it will reclaim. */
void dsec__node_on_reconcile(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_node *n = ud;
    dsec_err err;
    dsec_msg_node_lost nl;
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_NODE_LOST))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_NODE_LOST, dsec_msg_data(m), dsec_msg_len(m), &nl,
                    &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    if (strcmp(nl.node, n->name) != 0) {
        dsec__node_reply_bad(n, m, "node", "reconcile: for node %s, sent to node %s", nl.node,
                             n->name);
        return;
    }
    uint64_t prev = atomic_load(&n->lost_before_ns);
    while (nl.lost_ns > prev &&
           !atomic_compare_exchange_weak(&n->lost_before_ns, &prev, nl.lost_ns))
        ;
    uint64_t count = 0;
    pthread_mutex_lock(&n->mu);
    for (size_t b = 0; b < n->nbuckets; b++)
        for (struct sbx *s = n->by_id[b]; s; s = s->next_id)
            count += s->created_ns < nl.lost_ns;
    pthread_mutex_unlock(&n->mu);
    if (count > 0)
        dsec_log_warn("dsec-node %s: declared lost by %s after %" PRIu64
                      " ms of silence: reclaiming %" PRIu64 " sandbox(es) its owners count as gone",
                      n->name, nl.by ? nl.by : "a scheduler", nl.silent_ms, count);
    char c[24];
    snprintf(c, sizeof c, "%" PRIu64, count);
    const char *k[] = {"reclaiming"}, *v[] = {c};
    dsec_msg_op_reply r = {
        .id = n->name, .state = "reconciled", .node = n->name, .info = {k, v, 1}};
    if (dsec_wire_reply(a, m, DSEC_MSG_OP_REPLY, &r, &err) < 0)
        dsec_actor_count_error(a);
}

/* A scheduler that just started asks for full reports rather than waiting
 * for the next periodic one. */
void dsec__node_on_sync(dsec_actor *a, dsec_msg *m, void *ud)
{
    const char *type = dsec_msg_type(m);
    if (type == NULL || strcmp(type, "sync") != 0) { /* not a sync: dropped, counted */
        dsec_actor_count_error(a);
        return;
    }
    report(ud, true, dsec_now_ns());
}

void dsec__node_announce(dsec_node *n)
{
    uint32_t nt = 0;
    while (n->type_names[nt])
        nt++;
    const char *lk[64], *lv[64];
    size_t nl = n->nlabels < 64 ? n->nlabels : 64;
    for (size_t i = 0; i < nl; i++) {
        lk[i] = n->labels[i].key;
        lv[i] = n->labels[i].value;
    }
    dsec_msg_node_announce an = {.node = n->name,
                                 .cell = n->cell,
                                 .types = {(const char **)n->type_names, nt},
                                 .labels = {lk, lv, (uint32_t)nl},
                                 .cpu_milli = n->conf.cpu_milli,
                                 .memory_mb = n->conf.memory_mb,
                                 .slots = n->conf.slots,
                                 .started_ns = dsec_wall_ns()};
    char subj[256];
    snprintf(subj, sizeof subj, "%s.announce", n->subj_evt_node);
    dsec_err err;
    if (dsec_wire_send(n->actor, n->bus, subj, NULL, DSEC_MSG_NODE_ANNOUNCE, &an, NULL, &err) < 0)
        dsec_actor_count_error(n->actor);
    report(n, true, dsec_now_ns());
}
