/* arbiter.c - the preemption arbiter: a KV lease, demand vs. capacity, victim choice, reclaim
 * deadlines. */
#include "actors/arbiter.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/subjects.h"
#include "runtime/lease.h"
#include "runtime/ticker.h"
#include "actors/wire.h"
#include "bus/js.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/log.h"
#include "dsec/names.h"

#define NAME_MAX_ (DSEC_NAME_LEN_MAX + 1)

struct holding {
    char node[NAME_MAX_], unit[NAME_MAX_];
    uint64_t cpu, mem;
};

/* A preemptible job as its last registration describes it. */
struct job {
    char name[NAME_MAX_];
    bool batch;
    int64_t priority;
    uint64_t checkpoint_ms, grace_ms, seen_ms;
    uint32_t reclaimed; /* reclaims asked of it so far: fairness between equals */
    bool pending;       /* a reclaim is outstanding */
    struct holding *holds;
    size_t nholds;
};

/* An outstanding reclaim; its KV record "rc.<job>" makes it visible to a successor. */
struct pending {
    char req_id[NAME_MAX_], job[NAME_MAX_];
    uint64_t cpu, mem, requested_ns, deadline_ns;
    bool acked;
    struct holding *holds; /* what a forced release takes, in order */
    size_t nholds;
};

struct demand {
    char sched[NAME_MAX_];
    uint64_t waiting, cpu, mem, seen_ms;
};

struct settle {
    uint64_t at_ms, cpu, mem;
};

struct seen_release {
    char req_id[NAME_MAX_];
    uint64_t cpu, mem;
};

#define SEEN_RING 256
#define EVICT_RING 4096

struct dsec_arbiter {
    dsec_bus *bus;
    dsec_ticker *ticker; /* its own: forcing a release blocks on node answers */
    dsec_js *js;
    dsec_kv_bucket *lease_kv, *rc_kv;
    dsec_actor *actor;
    dsec_arbiter_conf conf;
    char cell[NAME_MAX_];
    char name[NAME_MAX_];
    int tick;

    _Atomic bool active;
    dsec_lease lease; /* renewed by the ticker thread only */

    pthread_mutex_t mu;     /* everything below */
    unsigned acks;          /* reclaim requests whose reply callback has not run yet */
    pthread_cond_t acks_cv; /* signalled as they run: stop waits for the last */
    struct job *jobs;
    size_t njobs, cap_jobs;
    struct pending *pend;
    size_t npend, cap_pend;
    struct demand dem[64];
    size_t ndem;
    struct settle *settled;
    size_t nsettled, cap_settled;
    struct seen_release seen[SEEN_RING];
    size_t seen_next;
    uint64_t evict_ms[EVICT_RING]; /* when recent reclaims were asked */
    size_t nevict;
    dsec_arbiter_stats st;
};

static uint64_t now_ms(void)
{
    return dsec_now_ns() / 1000000ull;
}
static uint64_t wall_ms(void)
{
    return dsec_wall_ns() / 1000000ull;
}

static void holdings_free(struct holding *h)
{
    dsec_free(h);
}

static struct holding *holdings_copy(const dsec_msg_job_hold *items, size_t n)
{
    struct holding *h = dsec_calloc(n ? n : 1, sizeof *h);
    for (size_t i = 0; h && i < n; i++) {
        snprintf(h[i].node, sizeof h[i].node, "%s", items[i].node);
        snprintf(h[i].unit, sizeof h[i].unit, "%s", items[i].unit ? items[i].unit : "0");
        h[i].cpu = items[i].cpu_milli;
        h[i].mem = items[i].memory_mb;
    }
    return h;
}

static void to_items(const struct holding *h, size_t n, const char *job, dsec_msg_job_hold *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (dsec_msg_job_hold){.job = job,
                                     .node = h[i].node,
                                     .unit = h[i].unit,
                                     .cpu_milli = h[i].cpu,
                                     .memory_mb = h[i].mem};
}

/* ---- tables (lock held) ----------------------------------------------------------- */

static struct job *job_find(dsec_arbiter *a, const char *name)
{
    for (size_t i = 0; i < a->njobs; i++)
        if (strcmp(a->jobs[i].name, name) == 0)
            return &a->jobs[i];
    return NULL;
}

static struct job *job_add(dsec_arbiter *a, const char *name)
{
    if (a->njobs == a->cap_jobs) {
        size_t nc = a->cap_jobs ? a->cap_jobs * 2 : 64;
        struct job *nj = dsec_realloc(a->jobs, nc * sizeof *nj);
        if (nj == NULL)
            return NULL;
        a->jobs = nj;
        a->cap_jobs = nc;
    }
    struct job *j = &a->jobs[a->njobs++];
    memset(j, 0, sizeof *j);
    snprintf(j->name, sizeof j->name, "%s", name);
    return j;
}

static struct pending *pend_add(dsec_arbiter *a)
{
    if (a->npend == a->cap_pend) {
        size_t nc = a->cap_pend ? a->cap_pend * 2 : 32;
        struct pending *np = dsec_realloc(a->pend, nc * sizeof *np);
        if (np == NULL)
            return NULL;
        a->pend = np;
        a->cap_pend = nc;
    }
    struct pending *p = &a->pend[a->npend++];
    memset(p, 0, sizeof *p);
    return p;
}

/* Take the pending reclaim req_id out of the table (whoever takes it owns
 * its ending: this is what keeps a release and a force from both counting). */
static bool pend_take(dsec_arbiter *a, const char *req_id, struct pending *out)
{
    for (size_t i = 0; i < a->npend; i++)
        if (strcmp(a->pend[i].req_id, req_id) == 0) {
            *out = a->pend[i];
            a->pend[i] = a->pend[--a->npend];
            return true;
        }
    return false;
}

static void settle_add(dsec_arbiter *a, uint64_t cpu, uint64_t mem)
{
    if (a->nsettled == a->cap_settled) {
        size_t nc = a->cap_settled ? a->cap_settled * 2 : 64;
        struct settle *ns = dsec_realloc(a->settled, nc * sizeof *ns);
        if (ns == NULL)
            return;
        a->settled = ns;
        a->cap_settled = nc;
    }
    a->settled[a->nsettled++] = (struct settle){now_ms(), cpu, mem};
}

static size_t evictions_last_minute(dsec_arbiter *a, uint64_t now_wall_ms)
{
    size_t k = 0;
    for (size_t i = 0; i < a->nevict; i++)
        if (now_wall_ms - a->evict_ms[i] < 60000)
            a->evict_ms[k++] = a->evict_ms[i];
    a->nevict = k;
    return k;
}

static void evict_note(dsec_arbiter *a, uint64_t at_wall_ms)
{
    if (a->nevict < EVICT_RING)
        a->evict_ms[a->nevict++] = at_wall_ms;
}

/* ---- records and outcomes --------------------------------------------------------- */

static void publish_outcome(dsec_arbiter *a, const dsec_msg_reclaim_outcome *o)
{
    char subj[192];
    dsec_err err;
    snprintf(subj, sizeof subj, DSEC_SUBJ_EVT, a->cell, "reclaim");
    if (dsec_wire_send(a->actor, a->bus, subj, NULL, DSEC_MSG_RECLAIM_OUTCOME, o, o->req_id, &err) <
        0)
        dsec_actor_count_error(a->actor);
}

static int record_encode(dsec_buf *b, const dsec_msg_reclaim_outcome *o, dsec_err *err)
{
    dsec_buf_init(b);
    return dsec_encode(b, DSEC_MSG_RECLAIM_OUTCOME, o, err);
}

/* The end of a reclaim: history record, free the job's key, publish. */
static void finish(dsec_arbiter *a, struct pending *p, const char *outcome, const char *reason,
                   uint64_t cpu, uint64_t mem, const struct holding *released, size_t nreleased)
{
    dsec_msg_job_hold items[64];
    size_t n = nreleased < 64 ? nreleased : 64;
    to_items(released, n, p->job, items);
    dsec_msg_reclaim_outcome o = {.req_id = p->req_id,
                                  .job = p->job,
                                  .outcome = outcome,
                                  .cpu_milli = cpu,
                                  .memory_mb = mem,
                                  .requested_ns = p->requested_ns,
                                  .deadline_ns = p->deadline_ns,
                                  .done_ns = dsec_wall_ns(),
                                  .arbiter = a->name,
                                  .reason = reason,
                                  .holds = {items, (uint32_t)n}};
    dsec_buf b;
    dsec_err err;
    char key[96];
    if (record_encode(&b, &o, &err) == 0) {
        snprintf(key, sizeof key, "done.%s", p->req_id);
        if (dsec_kv_put(a->rc_kv, key, b.data, b.len, NULL, &err) < 0)
            dsec_log_warn("dsec-arbiter %s: %s", a->name, err.msg);
    }
    dsec_buf_release(&b);
    snprintf(key, sizeof key, "rc.%s", p->job);
    if (dsec_kv_delete(a->rc_kv, key, &err) < 0)
        dsec_log_warn("dsec-arbiter %s: %s", a->name, err.msg);
    publish_outcome(a, &o);
    if (strcmp(outcome, "forced") == 0) {
        char subj[192];
        snprintf(subj, sizeof subj, DSEC_SUBJ_JOB, a->cell, p->job, "forced");
        if (dsec_wire_send(a->actor, a->bus, subj, NULL, DSEC_MSG_RECLAIM_OUTCOME, &o, p->req_id,
                           &err) < 0)
            dsec_actor_count_error(a->actor);
    }
    pthread_mutex_lock(&a->mu);
    struct job *j = job_find(a, p->job);
    if (j != NULL) {
        j->pending = false;
        /* drop what was released; the job's next registration says the rest */
        size_t k = 0;
        for (size_t i = 0; i < j->nholds; i++) {
            bool gone = false;
            for (size_t r = 0; r < nreleased && !gone; r++)
                gone = strcmp(j->holds[i].node, released[r].node) == 0 &&
                       strcmp(j->holds[i].unit, released[r].unit) == 0;
            if (!gone)
                j->holds[k++] = j->holds[i];
        }
        j->nholds = k;
    }
    settle_add(a, cpu, mem);
    if (strcmp(outcome, "forced") == 0)
        a->st.forced++;
    else
        a->st.honoured++;
    pthread_mutex_unlock(&a->mu);
    dsec_log_info(
        "dsec-arbiter %s: reclaim %s of job %s %s (%" PRIu64 " milli-CPU, %" PRIu64 " MB)%s%s",
        a->name, p->req_id, p->job, outcome, cpu, mem, reason ? ": " : "", reason ? reason : "");
    holdings_free(p->holds);
}

/* Past the deadline: release on the nodes what the job was asked for. */
static void force(dsec_arbiter *a, struct pending *p)
{
    uint64_t cpu = 0, mem = 0;
    size_t k = 0;
    for (; k < p->nholds && (cpu < p->cpu || mem < p->mem || k == 0); k++) {
        dsec_msg_job_hold h = {.job = p->job,
                               .node = p->holds[k].node,
                               .unit = p->holds[k].unit,
                               .release = true,
                               .forced = true};
        char subj[160];
        snprintf(subj, sizeof subj, DSEC_SUBJ_HOLD, h.node);
        dsec_buf b;
        dsec_buf_init(&b);
        dsec_err err;
        dsec_msg *reply = NULL;
        dsec_hdr hdr = {.type = "job_hold", .schema = DSEC_SCHEMA_VERSION, .req_id = p->req_id};
        if (dsec_encode(&b, DSEC_MSG_JOB_HOLD, &h, &err) < 0 ||
            dsec_bus_request_sync(a->bus, subj, &hdr, b.data, b.len, 2000, &reply, &err) < 0)
            dsec_log_warn("dsec-arbiter %s: forcing %s/%s of job %s on %s: %s", a->name, p->job,
                          h.unit, p->job, h.node, err.msg);
        dsec_msg_free(reply);
        dsec_buf_release(&b);
        cpu += p->holds[k].cpu;
        mem += p->holds[k].mem;
    }
    char why[160];
    snprintf(why, sizeof why, "no release by the deadline (%s)",
             p->acked ? "acknowledged" : "never acknowledged");
    finish(a, p, "forced", why, cpu, mem, p->holds, k);
}

/* ---- handlers ------------------------------------------------------------------------ */

/* dsec.v1.ctl.job.<cell>.register */
static void on_register(dsec_actor *act, dsec_msg *m, void *ud)
{
    dsec_arbiter *a = ud;
    dsec_err err;
    dsec_msg_job_register r;
    if (!dsec_wire_type_ok(act, m, DSEC_MSG_JOB_REGISTER)) /* an event: dropped, counted */
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_JOB_REGISTER, dsec_msg_data(m), dsec_msg_len(m),
                    &r, &err) < 0 ||
        dsec_name_ok(r.job, DSEC_NAME_LEN_MAX) < 0) {
        dsec_actor_count_error(act);
        return;
    }
    /* Only preemptible work is ever a candidate: a rollout is never a victim. */
    bool batch = r.cls != NULL && strcmp(r.cls, "batch") == 0;
    if (r.cls != NULL && !batch && strcmp(r.cls, "job") != 0) {
        dsec_actor_count_error(act);
        return;
    }
    struct holding *h = holdings_copy(r.holds.items, r.holds.n);
    if (h == NULL)
        return;
    pthread_mutex_lock(&a->mu);
    struct job *j = job_find(a, r.job);
    if (j == NULL)
        j = job_add(a, r.job);
    if (j == NULL) {
        pthread_mutex_unlock(&a->mu);
        holdings_free(h);
        return;
    }
    j->batch = batch;
    j->priority = r.priority;
    j->checkpoint_ms = r.checkpoint_ms;
    j->grace_ms = r.grace_ms;
    j->seen_ms = now_ms();
    holdings_free(j->holds);
    j->holds = h;
    j->nholds = r.holds.n;
    pthread_mutex_unlock(&a->mu);
}

/* dsec.v1.ctl.evt.<cell>.demand */
static void on_demand(dsec_actor *act, dsec_msg *m, void *ud)
{
    dsec_arbiter *a = ud;
    dsec_err err;
    dsec_msg_demand d;
    if (!dsec_wire_type_ok(act, m, DSEC_MSG_DEMAND)) /* an event: dropped, counted */
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_DEMAND, dsec_msg_data(m), dsec_msg_len(m), &d,
                    &err) < 0) {
        dsec_actor_count_error(act);
        return;
    }
    pthread_mutex_lock(&a->mu);
    struct demand *slot = NULL;
    for (size_t i = 0; i < a->ndem && !slot; i++)
        if (strcmp(a->dem[i].sched, d.scheduler) == 0)
            slot = &a->dem[i];
    if (slot == NULL && a->ndem < 64) {
        slot = &a->dem[a->ndem++];
        snprintf(slot->sched, sizeof slot->sched, "%s", d.scheduler);
    }
    if (slot != NULL)
        *slot = (struct demand){
            .waiting = d.waiting, .cpu = d.cpu_milli, .mem = d.memory_mb, .seen_ms = now_ms()};
    if (slot != NULL)
        snprintf(slot->sched, sizeof slot->sched, "%s", d.scheduler);
    pthread_mutex_unlock(&a->mu);
}

/* dsec.v1.ctl.job.<cell>.<job>.released: a job gave capacity back. */
static void on_released(dsec_actor *act, dsec_msg *m, void *ud)
{
    dsec_arbiter *a = ud;
    dsec_err err;
    dsec_msg_reclaim_outcome o;
    if (!dsec_wire_type_ok(act, m, DSEC_MSG_RECLAIM_OUTCOME)) /* an event: dropped, counted */
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_RECLAIM_OUTCOME, dsec_msg_data(m),
                    dsec_msg_len(m), &o, &err) < 0) {
        dsec_actor_count_error(act);
        return;
    }
    struct pending p;
    pthread_mutex_lock(&a->mu);
    bool mine = atomic_load(&a->active) && pend_take(a, o.req_id, &p);
    if (!mine) { /* a standby remembers, in case it takes the reclaim over */
        struct seen_release *s = &a->seen[a->seen_next++ % SEEN_RING];
        snprintf(s->req_id, sizeof s->req_id, "%s", o.req_id);
        s->cpu = o.cpu_milli;
        s->mem = o.memory_mb;
    }
    pthread_mutex_unlock(&a->mu);
    if (!mine)
        return;
    struct holding *rel = holdings_copy(o.holds.items, o.holds.n);
    finish(a, &p, "honoured", NULL, o.cpu_milli, o.memory_mb, rel ? rel : p.holds,
           rel ? o.holds.n : 0);
    holdings_free(rel);
}

struct ack_ctx {
    dsec_arbiter *a;
    char req_id[NAME_MAX_];
};

static void on_ack(int status, dsec_msg *reply, const dsec_err *berr, void *ud)
{
    struct ack_ctx *c = ud;
    dsec_arbiter *a = c->a;
    dsec_msg_reclaim_ack ack = {0};
    dsec_err err;
    bool ok = status == 0 && dsec_msg_type(reply) &&
              strcmp(dsec_msg_type(reply), "reclaim_ack") == 0 &&
              dsec_decode(dsec_wire_decoder(), DSEC_MSG_RECLAIM_ACK, dsec_msg_data(reply),
                          dsec_msg_len(reply), &ack, &err) == 0 &&
              ack.accepted;
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->npend; i++)
        if (strcmp(a->pend[i].req_id, c->req_id) == 0) {
            if (ok) {
                a->pend[i].acked = true;
                a->st.acked++;
            } else if (status < 0 && berr && berr->code == DSEC_E_NO_RESPONDERS) {
                a->pend[i].deadline_ns = 0; /* nobody answers for the job: force it now */
            }
        }
    a->acks--;
    pthread_cond_broadcast(&a->acks_cv);
    pthread_mutex_unlock(&a->mu);
    dsec_free(c);
}

/* ---- the lease --------------------------------------------------------------------- */

/* Reclaims a previous arbiter left outstanding: keep enforcing them, never re-ask. */
static void take_over(dsec_arbiter *a)
{
    char **keys = NULL;
    size_t nk = 0;
    dsec_err err;
    if (dsec_kv_keys(a->rc_kv, &keys, &nk, &err) < 0) {
        dsec_log_warn("dsec-arbiter %s: %s", a->name, err.msg);
        return;
    }
    dsec_decoder *d = dsec_decoder_new(NULL);
    uint64_t wall = wall_ms();
    for (size_t i = 0; d && i < nk; i++) {
        char *val = NULL;
        size_t len = 0;
        dsec_msg_reclaim_outcome o;
        if (dsec_kv_get(a->rc_kv, keys[i], &val, &len, NULL, &err) < 0 ||
            dsec_decode(d, DSEC_MSG_RECLAIM_OUTCOME, val, len, &o, &err) < 0) {
            dsec_free(val);
            continue;
        }
        pthread_mutex_lock(&a->mu);
        if (o.requested_ns / 1000000ull + 60000 > wall)
            evict_note(a, o.requested_ns / 1000000ull);
        bool open = strncmp(keys[i], "rc.", 3) == 0 && strcmp(o.outcome, "requested") == 0;
        struct pending probe;
        if (open && !pend_take(a, o.req_id, &probe)) {
            struct pending *p = pend_add(a);
            if (p != NULL) {
                snprintf(p->req_id, sizeof p->req_id, "%s", o.req_id);
                snprintf(p->job, sizeof p->job, "%s", o.job);
                p->cpu = o.cpu_milli;
                p->mem = o.memory_mb;
                p->requested_ns = o.requested_ns;
                p->deadline_ns = o.deadline_ns;
                p->holds = holdings_copy(o.holds.items, o.holds.n);
                p->nholds = p->holds ? o.holds.n : 0;
                struct job *j = job_find(a, o.job);
                if (j != NULL)
                    j->pending = true;
                a->st.adopted++;
            }
        } else if (open) {
            a->pend[a->npend++] = probe; /* already ours: put it back */
        }
        pthread_mutex_unlock(&a->mu);
        dsec_free(val);
    }
    dsec_decoder_free(d);
    dsec_kv_keys_free(keys, nk);
    /* releases this arbiter saw while standby end those reclaims now */
    for (size_t s = 0; s < SEEN_RING; s++) {
        struct pending p;
        pthread_mutex_lock(&a->mu);
        bool got = a->seen[s].req_id[0] && pend_take(a, a->seen[s].req_id, &p);
        struct seen_release sr = a->seen[s];
        a->seen[s].req_id[0] = '\0';
        pthread_mutex_unlock(&a->mu);
        if (got)
            finish(a, &p, "honoured", NULL, sr.cpu, sr.mem, p.holds, 0);
    }
}

static void lease_step(dsec_arbiter *a)
{
    dsec_err err;
    switch (dsec_lease_step(&a->lease, &err)) {
    case DSEC_LEASE_LOST:
        dsec_log_warn("dsec-arbiter %s: lost the lease of cell %s: %s", a->name, a->cell, err.msg);
        atomic_store(&a->active, false);
        return;
    case DSEC_LEASE_ACQUIRED:
        break;
    default:
        return;
    }
    dsec_log_info("dsec-arbiter %s: active for cell %s (lease revision %" PRIu64 ")", a->name,
                  a->cell, a->lease.rev);
    pthread_mutex_lock(&a->mu);
    a->st.takeovers++;
    pthread_mutex_unlock(&a->mu);
    take_over(a);
    atomic_store(&a->active, true);
}

/* ---- deciding -------------------------------------------------------------------------- */

struct victim {
    struct job *j;
    uint64_t cost; /* checkpoint time; batch work restarts instead */
};

static int victim_cmp(const void *x, const void *y)
{
    const struct victim *a = x, *b = y;
    if (a->j->priority != b->j->priority)
        return a->j->priority < b->j->priority ? -1 : 1;
    if (a->cost != b->cost)
        return a->cost < b->cost ? -1 : 1;
    if (a->j->reclaimed != b->j->reclaimed)
        return a->j->reclaimed < b->j->reclaimed ? -1 : 1;
    return strcmp(a->j->name, b->j->name);
}

struct ask {
    dsec_msg_reclaim r;
    char req_id[33], job[NAME_MAX_];
    struct holding *holds;
    size_t nholds;
};

/* What waiting rollouts need beyond what is already on its way back. */
static void plan(dsec_arbiter *a, struct ask **out, size_t *nout)
{
    *out = NULL;
    *nout = 0;
    uint64_t t = now_ms(), wall = wall_ms();
    uint64_t need_cpu = 0, need_mem = 0, off_cpu = 0, off_mem = 0;
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->ndem; i++)
        if (t - a->dem[i].seen_ms < 2000 && a->dem[i].waiting > 0) {
            need_cpu += a->dem[i].cpu;
            need_mem += a->dem[i].mem;
        }
    for (size_t i = 0; i < a->npend; i++) {
        off_cpu += a->pend[i].cpu;
        off_mem += a->pend[i].mem;
    }
    size_t k = 0;
    for (size_t i = 0; i < a->nsettled; i++)
        if (t - a->settled[i].at_ms < a->conf.settle_ms) {
            off_cpu += a->settled[i].cpu;
            off_mem += a->settled[i].mem;
            a->settled[k++] = a->settled[i];
        }
    a->nsettled = k;
    need_cpu = need_cpu > off_cpu ? need_cpu - off_cpu : 0;
    need_mem = need_mem > off_mem ? need_mem - off_mem : 0;
    if (need_cpu == 0 && need_mem == 0) {
        pthread_mutex_unlock(&a->mu);
        return;
    }
    struct victim *v = dsec_calloc(a->njobs ? a->njobs : 1, sizeof *v);
    struct ask *asks = dsec_calloc(a->njobs ? a->njobs : 1, sizeof *asks);
    size_t nv = 0, na = 0;
    for (size_t i = 0; v && i < a->njobs; i++) {
        struct job *j = &a->jobs[i];
        if (j->pending || j->nholds == 0 || t - j->seen_ms > a->conf.job_stale_ms)
            continue;
        v[nv++] = (struct victim){j, j->batch ? 0 : j->checkpoint_ms};
    }
    if (v != NULL && asks != NULL)
        qsort(v, nv, sizeof *v, victim_cmp);
    size_t recent = evictions_last_minute(a, wall);
    for (size_t i = 0; asks && i < nv && (need_cpu > 0 || need_mem > 0); i++) {
        struct job *j = v[i].j;
        uint64_t jc = 0, jm = 0;
        for (size_t h = 0; h < j->nholds; h++) {
            jc += j->holds[h].cpu;
            jm += j->holds[h].mem;
        }
        uint64_t ac = jc < need_cpu ? jc : need_cpu, am = jm < need_mem ? jm : need_mem;
        if (ac == 0 && am == 0)
            continue;
        if (recent >= a->conf.max_per_min) {
            a->st.capped += nv - i;
            break;
        }
        recent++;
        evict_note(a, wall);
        struct ask *q = &asks[na++];
        uint64_t grace =
            j->batch ? a->conf.batch_grace_ms : (j->grace_ms ? j->grace_ms : a->conf.grace_ms);
        if (grace > a->st.max_grace_ms)
            a->st.max_grace_ms = grace;
        dsec_bus_new_id(q->req_id);
        snprintf(q->job, sizeof q->job, "%s", j->name);
        q->r = (dsec_msg_reclaim){.req_id = q->req_id,
                                  .job = q->job,
                                  .cpu_milli = ac,
                                  .memory_mb = am,
                                  .deadline_ns = dsec_wall_ns() + grace * 1000000ull,
                                  .arbiter = a->name,
                                  .epoch = a->lease.rev};
        q->holds = dsec_calloc(j->nholds ? j->nholds : 1, sizeof *q->holds);
        if (q->holds != NULL) {
            memcpy(q->holds, j->holds, j->nholds * sizeof *q->holds);
            q->nholds = j->nholds;
        }
        j->pending = true;
        j->reclaimed++;
        need_cpu -= ac;
        need_mem -= am;
    }
    pthread_mutex_unlock(&a->mu);
    dsec_free(v);
    *out = asks;
    *nout = na;
}

/* Record the reclaim (create-if-absent on the job's key: one reclaim per job
 * at a time, whichever arbiter asks), then ask the job. */
static void send_ask(dsec_arbiter *a, struct ask *q)
{
    dsec_msg_job_hold items[64];
    size_t n = q->nholds < 64 ? q->nholds : 64;
    to_items(q->holds, n, q->job, items);
    uint64_t now = dsec_wall_ns();
    dsec_msg_reclaim_outcome o = {.req_id = q->req_id,
                                  .job = q->job,
                                  .outcome = "requested",
                                  .cpu_milli = q->r.cpu_milli,
                                  .memory_mb = q->r.memory_mb,
                                  .requested_ns = now,
                                  .deadline_ns = q->r.deadline_ns,
                                  .arbiter = a->name,
                                  .holds = {items, (uint32_t)n}};
    dsec_buf b;
    dsec_err err;
    char key[96];
    snprintf(key, sizeof key, "rc.%s", q->job);
    int rc = record_encode(&b, &o, &err);
    if (rc == 0)
        rc = dsec_kv_create(a->rc_kv, key, b.data, b.len, NULL, &err);
    dsec_buf_release(&b);
    if (rc < 0) {
        /* already being reclaimed (a predecessor's record), or the store
         * failed: ask nothing now, so the job is never asked twice */
        dsec_log_warn("dsec-arbiter %s: not asking job %s: %s", a->name, q->job, err.msg);
        holdings_free(q->holds);
        pthread_mutex_lock(&a->mu);
        struct job *j = job_find(a, q->job);
        if (j != NULL)
            j->pending = false; /* a candidate again once that record ends */
        pthread_mutex_unlock(&a->mu);
        return;
    }
    pthread_mutex_lock(&a->mu);
    struct pending *p = pend_add(a);
    if (p != NULL) {
        snprintf(p->req_id, sizeof p->req_id, "%s", q->req_id);
        snprintf(p->job, sizeof p->job, "%s", q->job);
        p->cpu = q->r.cpu_milli;
        p->mem = q->r.memory_mb;
        p->requested_ns = now;
        p->deadline_ns = q->r.deadline_ns;
        p->holds = q->holds;
        p->nholds = q->nholds;
        q->holds = NULL;
    }
    a->st.requests++;
    pthread_mutex_unlock(&a->mu);
    holdings_free(q->holds);
    publish_outcome(a, &o);
    struct ack_ctx *c = dsec_calloc(1, sizeof *c);
    if (c == NULL)
        return;
    c->a = a;
    snprintf(c->req_id, sizeof c->req_id, "%s", q->req_id);
    char subj[192];
    snprintf(subj, sizeof subj, DSEC_SUBJ_JOB, a->cell, q->job, "reclaim");
    dsec_buf_init(&b);
    dsec_hdr hdr = {.type = "reclaim", .schema = DSEC_SCHEMA_VERSION, .req_id = q->req_id};
    pthread_mutex_lock(&a->mu);
    a->acks++; /* before the request: its callback may run at once */
    pthread_mutex_unlock(&a->mu);
    if (dsec_encode(&b, DSEC_MSG_RECLAIM, &q->r, &err) < 0 ||
        dsec_bus_request(a->bus, subj, &hdr, b.data, b.len, 2000, on_ack, c, &err) < 0) {
        dsec_log_warn("dsec-arbiter %s: asking job %s: %s", a->name, q->job, err.msg);
        dsec_free(c);
        pthread_mutex_lock(&a->mu);
        a->acks--;
        pthread_mutex_unlock(&a->mu);
    }
    dsec_buf_release(&b);
}

static void on_tick(void *ud, uint64_t mono)
{
    dsec_arbiter *a = ud;
    lease_step(a);
    if (!atomic_load(&a->active))
        return;
    /* deadlines */
    for (;;) {
        struct pending p;
        bool got = false;
        uint64_t now = dsec_wall_ns();
        pthread_mutex_lock(&a->mu);
        for (size_t i = 0; i < a->npend && !got; i++)
            if (a->pend[i].deadline_ns <= now)
                got = pend_take(a, a->pend[i].req_id, &p);
        pthread_mutex_unlock(&a->mu);
        if (!got)
            break;
        force(a, &p);
    }
    struct ask *asks;
    size_t na;
    plan(a, &asks, &na);
    for (size_t i = 0; i < na; i++)
        send_ask(a, &asks[i]);
    dsec_free(asks);
    (void)mono;
}

/* ---- lifecycle ------------------------------------------------------------------------ */

int dsec_arbiter_start(dsec_arbiter **out, dsec_bus *bus, const dsec_arbiter_conf *conf,
                       dsec_err *err)
{
    *out = NULL;
    if (dsec_name_ok(conf->cell, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "arbiter: cell \"%s\" is not a valid name",
                            conf->cell ? conf->cell : "");
    dsec_arbiter *a = dsec_calloc(1, sizeof *a);
    if (a == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->acks_cv, NULL);
    a->tick = -1;
    a->bus = bus;
    a->conf = *conf;
    dsec_arbiter_conf *c = &a->conf;
    c->lease_ms = c->lease_ms ? c->lease_ms : 3000;
    c->tick_ms = c->tick_ms ? c->tick_ms : 100;
    c->grace_ms = c->grace_ms ? c->grace_ms : 30000;
    c->batch_grace_ms = c->batch_grace_ms ? c->batch_grace_ms : 2000;
    c->max_per_min = c->max_per_min ? c->max_per_min : 120;
    c->settle_ms = c->settle_ms ? c->settle_ms : 1500;
    c->job_stale_ms = c->job_stale_ms ? c->job_stale_ms : 5000;
    snprintf(a->cell, sizeof a->cell, "%s", conf->cell);
    if (conf->name != NULL && dsec_name_ok(conf->name, DSEC_NAME_LEN_MAX) == 0) {
        snprintf(a->name, sizeof a->name, "%s", conf->name);
    } else {
        char id[33];
        dsec_bus_new_id(id);
        snprintf(a->name, sizeof a->name, "arb-%.12s", id);
    }
    c->cell = a->cell;
    c->name = a->name;
    char bucket[128], subj[192];
    if (dsec_js_new(&a->js, bus, 5000, err) < 0)
        goto out_fail;
    snprintf(bucket, sizeof bucket, "dsec-arbiter-%s", a->cell);
    dsec_kv_conf kc = {.bucket = bucket, .ttl_ms = 10ll * c->lease_ms, .replicas = conf->replicas};
    if (dsec_kv_open(&a->lease_kv, a->js, &kc, err) < 0)
        goto out_fail_js;
    dsec_lease_init(&a->lease, a->lease_kv, "lease", a->name, c->lease_ms);
    snprintf(bucket, sizeof bucket, "dsec-reclaim-%s", a->cell);
    kc = (dsec_kv_conf){.bucket = bucket, .ttl_ms = 3600000, .replicas = conf->replicas};
    if (dsec_kv_open(&a->rc_kv, a->js, &kc, err) < 0)
        goto out_fail_js;
    if (dsec_actor_new(&a->actor, bus, a->name, err) < 0)
        goto out_fail;
    snprintf(subj, sizeof subj, DSEC_SUBJ_JOB_REGISTER, a->cell);
    if (dsec_actor_on(a->actor, subj, NULL, on_register, a, err) < 0)
        goto out_fail;
    snprintf(subj, sizeof subj, DSEC_SUBJ_EVT, a->cell, "demand");
    if (dsec_actor_on(a->actor, subj, NULL, on_demand, a, err) < 0)
        goto out_fail;
    snprintf(subj, sizeof subj, DSEC_SUBJ_JOB, a->cell, "*", "released");
    if (dsec_actor_on(a->actor, subj, NULL, on_released, a, err) < 0)
        goto out_fail;
    if (dsec_ticker_new(&a->ticker, err) < 0 ||
        (a->tick = dsec_ticker_add(a->ticker, c->tick_ms, on_tick, a, err)) < 0)
        goto out_fail;
    *out = a;
    return 0;
out_fail_js:
    dsec_err_wrap(err, "arbiter %s needs JetStream", a->name);
out_fail:
    dsec_arbiter_stop(a, false);
    return -1;
}

void dsec_arbiter_stop(dsec_arbiter *a, bool release_lease)
{
    if (a == NULL)
        return;
    dsec_ticker_free(a->ticker); /* no tick runs after this */
    dsec_actor_free(a->actor);
    /* nothing asks jobs any more; the replies still on their way (each
     * request times out within 2 s) must not find the arbiter freed */
    pthread_mutex_lock(&a->mu);
    while (a->acks > 0)
        pthread_cond_wait(&a->acks_cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
    if (release_lease && a->lease_kv != NULL)
        dsec_lease_release(&a->lease);
    dsec_kv_close(a->lease_kv);
    dsec_kv_close(a->rc_kv);
    dsec_js_free(a->js);
    for (size_t i = 0; i < a->njobs; i++)
        holdings_free(a->jobs[i].holds);
    for (size_t i = 0; i < a->npend; i++)
        holdings_free(a->pend[i].holds);
    dsec_free(a->jobs);
    dsec_free(a->pend);
    dsec_free(a->settled);
    pthread_cond_destroy(&a->acks_cv);
    pthread_mutex_destroy(&a->mu);
    dsec_free(a);
}

void dsec_arbiter_stats_get(dsec_arbiter *a, dsec_arbiter_stats *out)
{
    pthread_mutex_lock(&a->mu);
    *out = a->st;
    out->pending = a->npend;
    pthread_mutex_unlock(&a->mu);
    out->active = atomic_load(&a->active);
}

const char *dsec_arbiter_name(const dsec_arbiter *a)
{
    return a->name;
}
const dsec_actor *dsec_arbiter_actor(const dsec_arbiter *a)
{
    return a->actor;
}
