/* job.c - libdsec's job API: hold capacity through node managers, answer the arbiter's reclaims. */
#include "dsec/job.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "client/internal.h"
#include "codecs/msg.h"
#include "codecs/subjects.h"
#include "dsec/alloc.h"
#include "dsec/log.h"
#include "dsec/names.h"

struct unit {
    char node[DSEC_NAME_LEN_MAX + 1];
    char name[24];
    uint64_t cpu, mem;
    bool held;
};

struct dsec_job {
    dsec_client *c;
    dsec_bus *bus;
    dsec_actor *actor;
    char name[DSEC_NAME_LEN_MAX + 1];
    char cell[DSEC_NAME_LEN_MAX + 1];
    char cls[8];
    int64_t priority;
    uint64_t checkpoint_ms, grace_ms;
    dsec_job_checkpoint_fn cb;
    void *ud;
    struct unit *units;
    size_t nunits;

    pthread_t thread; /* registrations and checkpoints */
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stop;
    bool have_reclaim;
    dsec_msg_reclaim want; /* strings below */
    char want_req[DSEC_NAME_LEN_MAX + 1];
    dsec_job_stats st;
};

static int hold_call(dsec_job *j, struct unit *u, bool release, dsec_err *err)
{
    dsec_msg_job_hold h = {.job = j->name,
                           .node = u->node,
                           .unit = u->name,
                           .cpu_milli = u->cpu,
                           .memory_mb = u->mem,
                           .release = release};
    char subj[160];
    snprintf(subj, sizeof subj, DSEC_SUBJ_HOLD, u->node);
    dsec_buf b;
    dsec_buf_init(&b);
    char req[160];
    snprintf(req, sizeof req, "%s.%s.%s", j->name, u->name, release ? "r" : "h");
    dsec_hdr hdr = {.type = "job_hold", .schema = DSEC_SCHEMA_VERSION, .req_id = req};
    dsec_msg *reply = NULL;
    int rc = dsec_encode(&b, DSEC_MSG_JOB_HOLD, &h, err);
    if (rc == 0)
        rc = dsec_bus_request_sync(j->bus, subj, &hdr, b.data, b.len, 5000, &reply, err);
    dsec_buf_release(&b);
    if (rc == 0 && dsec_msg_type(reply) && strcmp(dsec_msg_type(reply), "error") == 0) {
        dsec_decoder *d = dsec_decoder_new(NULL);
        dsec_msg_error e;
        if (d != NULL &&
            dsec_decode(d, DSEC_MSG_ERROR, dsec_msg_data(reply), dsec_msg_len(reply), &e, err) == 0)
            dsec_err_set(err, dsec_code_from_name(e.code), 0, "%s", e.message);
        else
            dsec_err_set(err, DSEC_E_INTERNAL, 0, "node %s answered an undecodable error", u->node);
        dsec_decoder_free(d);
        rc = -1;
    }
    dsec_msg_free(reply);
    if (rc < 0)
        return dsec_err_wrap(err, "job %s: %s unit %s on %s", j->name,
                             release ? "releasing" : "holding", u->name, u->node);
    pthread_mutex_lock(&j->mu);
    u->held = !release;
    pthread_mutex_unlock(&j->mu);
    return 0;
}

static void register_now(dsec_job *j)
{
    dsec_msg_job_hold items[256];
    uint32_t n = 0;
    pthread_mutex_lock(&j->mu);
    for (size_t i = 0; i < j->nunits && n < 256; i++)
        if (j->units[i].held)
            items[n++] = (dsec_msg_job_hold){.job = j->name,
                                             .node = j->units[i].node,
                                             .unit = j->units[i].name,
                                             .cpu_milli = j->units[i].cpu,
                                             .memory_mb = j->units[i].mem};
    pthread_mutex_unlock(&j->mu);
    dsec_msg_job_register r = {.job = j->name,
                               .cell = j->cell,
                               .cls = j->cls,
                               .priority = j->priority,
                               .checkpoint_ms = j->checkpoint_ms,
                               .grace_ms = j->grace_ms,
                               .holds = {items, n},
                               .ts_ns = (uint64_t)time(NULL) * 1000000000ull};
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_err err;
    char subj[160];
    snprintf(subj, sizeof subj, DSEC_SUBJ_JOB_REGISTER, j->cell);
    dsec_hdr hdr = {.type = "job_register", .schema = DSEC_SCHEMA_VERSION};
    if (dsec_encode(&b, DSEC_MSG_JOB_REGISTER, &r, &err) == 0)
        dsec_bus_publish(j->bus, subj, NULL, &hdr, b.data, b.len, &err);
    dsec_buf_release(&b);
}

/* Release units, last taken first, until the request is covered; report. */
static void release_for(dsec_job *j, const dsec_msg_reclaim *r)
{
    dsec_msg_job_hold items[256];
    uint32_t n = 0;
    uint64_t cpu = 0, mem = 0;
    for (size_t i = j->nunits;
         i-- > 0 && n < 256 && (cpu < r->cpu_milli || mem < r->memory_mb || n == 0);) {
        struct unit *u = &j->units[i];
        pthread_mutex_lock(&j->mu);
        bool held = u->held;
        pthread_mutex_unlock(&j->mu);
        dsec_err err;
        if (!held)
            continue;
        if (hold_call(j, u, true, &err) < 0) {
            dsec_log_warn("dsec job: %s", err.msg);
            continue;
        }
        items[n++] = (dsec_msg_job_hold){.job = j->name,
                                         .node = u->node,
                                         .unit = u->name,
                                         .cpu_milli = u->cpu,
                                         .memory_mb = u->mem,
                                         .release = true};
        cpu += u->cpu;
        mem += u->mem;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    dsec_msg_reclaim_outcome o = {.req_id = r->req_id,
                                  .job = j->name,
                                  .outcome = "released",
                                  .cpu_milli = cpu,
                                  .memory_mb = mem,
                                  .deadline_ns = r->deadline_ns,
                                  .done_ns =
                                      (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec,
                                  .holds = {items, n}};
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_err err;
    char subj[192];
    snprintf(subj, sizeof subj, DSEC_SUBJ_JOB, j->cell, j->name, "released");
    dsec_hdr hdr = {.type = "reclaim_outcome", .schema = DSEC_SCHEMA_VERSION, .req_id = r->req_id};
    if (dsec_encode(&b, DSEC_MSG_RECLAIM_OUTCOME, &o, &err) == 0 &&
        dsec_bus_publish(j->bus, subj, NULL, &hdr, b.data, b.len, &err) == 0)
        dsec_bus_flush(j->bus, 2000, &err);
    dsec_buf_release(&b);
    pthread_mutex_lock(&j->mu);
    j->st.released++;
    pthread_mutex_unlock(&j->mu);
}

static void *job_thread(void *arg)
{
    dsec_job *j = arg;
    pthread_mutex_lock(&j->mu);
    while (!j->stop) {
        if (j->have_reclaim) {
            dsec_msg_reclaim r = j->want;
            j->have_reclaim = false;
            pthread_mutex_unlock(&j->mu);
            dsec_job_reclaim jr = {.req_id = r.req_id,
                                   .cpu_milli = r.cpu_milli,
                                   .memory_mb = r.memory_mb,
                                   .deadline_ns = r.deadline_ns};
            if (j->cb == NULL || j->cb(j, &jr, j->ud) == 0)
                release_for(j, &r);
            register_now(j);
            pthread_mutex_lock(&j->mu);
            continue;
        }
        pthread_mutex_unlock(&j->mu);
        register_now(j);
        pthread_mutex_lock(&j->mu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        if (!j->stop && !j->have_reclaim)
            pthread_cond_timedwait(&j->cond, &j->mu, &ts);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* dsec.v1.ctl.job.<cell>.<job>.reclaim: acknowledge at once; the job's
 * thread checkpoints and releases. */
static void on_reclaim(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_job *j = ud;
    dsec_err err;
    dsec_msg_reclaim r;
    const char *type = dsec_msg_type(m);
    bool typed = type != NULL && strcmp(type, "reclaim") == 0;
    dsec_decoder *d = typed ? dsec_decoder_new(NULL) : NULL;
    if (!typed || d == NULL ||
        dsec_decode(d, DSEC_MSG_RECLAIM, dsec_msg_data(m), dsec_msg_len(m), &r, &err) < 0) {
        /* a malformed reclaim is answered, so its sender does not wait out its deadline;
         * the decoder is the one Dsec-Type names (docs/protocol.md, Transport) */
        if (!typed)
            dsec_err_set(
                &err, DSEC_E_UNSUPPORTED, 0,
                "%.200s takes Dsec-Type \"reclaim\", not \"%.64s\" (the payload was not read)",
                dsec_msg_subject(m), type ? type : "(none)");
        else if (d == NULL)
            dsec_err_set(&err, DSEC_E_NOMEM, 0, "out of memory");
        const char *field = !typed ? DSEC_HDR_TYPE : d ? dsec_decoder_bad_field(d) : NULL;
        dsec_msg_error e = {.code = dsec_code_name(err.code),
                            .message = err.msg,
                            .field = field && field[0] ? field : NULL};
        dsec_buf b;
        dsec_buf_init(&b);
        dsec_hdr hdr = {.type = "error", .schema = DSEC_SCHEMA_VERSION};
        dsec_err ignored;
        if (dsec_encode(&b, DSEC_MSG_ERROR, &e, &ignored) == 0)
            dsec_msg_respond(a, m, &hdr, b.data, b.len, &ignored);
        dsec_buf_release(&b);
        dsec_decoder_free(d);
        dsec_actor_count_error(a);
        return;
    }
    pthread_mutex_lock(&j->mu);
    bool busy = j->have_reclaim;
    if (!busy) {
        snprintf(j->want_req, sizeof j->want_req, "%s", r.req_id);
        j->want = r;
        j->want.req_id = j->want_req;
        j->want.job = j->name;
        j->want.arbiter = NULL;
        j->have_reclaim = true;
        pthread_cond_signal(&j->cond);
    }
    j->st.reclaims++;
    j->st.last_reclaim_ns = (uint64_t)time(NULL) * 1000000000ull;
    pthread_mutex_unlock(&j->mu);
    dsec_msg_reclaim_ack ack = {.req_id = r.req_id,
                                .job = j->name,
                                .accepted = !busy,
                                .checkpoint_ms = j->checkpoint_ms,
                                .reason = busy ? "a reclaim is already being handled" : NULL};
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_hdr hdr = {.type = "reclaim_ack", .schema = DSEC_SCHEMA_VERSION};
    if (dsec_encode(&b, DSEC_MSG_RECLAIM_ACK, &ack, &err) == 0)
        dsec_msg_respond(a, m, &hdr, b.data, b.len, &err);
    dsec_buf_release(&b);
    dsec_decoder_free(d);
}

/* dsec.v1.ctl.job.<cell>.<job>.forced: the arbiter took units back. */
static void on_forced(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_job *j = ud;
    dsec_err err;
    dsec_msg_reclaim_outcome o;
    const char *type = dsec_msg_type(m);
    dsec_decoder *d =
        type != NULL && strcmp(type, "reclaim_outcome") == 0 ? dsec_decoder_new(NULL) : NULL;
    if (d == NULL || /* another Dsec-Type (or no memory): dropped, counted */
        dsec_decode(d, DSEC_MSG_RECLAIM_OUTCOME, dsec_msg_data(m), dsec_msg_len(m), &o, &err) < 0) {
        dsec_decoder_free(d);
        dsec_actor_count_error(a);
        return;
    }
    const dsec_msg_job_hold *h = o.holds.items;
    pthread_mutex_lock(&j->mu);
    for (uint32_t k = 0; k < o.holds.n; k++)
        for (size_t i = 0; i < j->nunits; i++)
            if (j->units[i].held && strcmp(j->units[i].node, h[k].node) == 0 &&
                strcmp(j->units[i].name, h[k].unit ? h[k].unit : "") == 0) {
                j->units[i].held = false;
                j->st.forced++;
            }
    pthread_mutex_unlock(&j->mu);
    dsec_decoder_free(d);
}

int dsec_job_start(dsec_client *c, const dsec_job_spec *spec, dsec_job_checkpoint_fn cb, void *ud,
                   dsec_job **out, dsec_err *err)
{
    *out = NULL;
    if (dsec_name_ok(spec->name, DSEC_NAME_LEN_MAX) < 0 ||
        dsec_name_ok(spec->cell, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(
            err, DSEC_E_INVALID, 0,
            "job name \"%s\" and cell \"%s\" must be 1-64 characters of A-Z a-z 0-9 _ -",
            spec->name ? spec->name : "", spec->cell ? spec->cell : "");
    const char *cls = spec->cls ? spec->cls : "job";
    if (strcmp(cls, "job") != 0 && strcmp(cls, "batch") != 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "job %s: class \"%s\" cannot be preempted (use job or batch)",
                            spec->name, cls);
    dsec_job *j = dsec_calloc(1, sizeof *j);
    if (j == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    j->units = dsec_calloc(spec->nunits ? spec->nunits : 1, sizeof *j->units);
    if (j->units == NULL) {
        dsec_free(j);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cond, NULL);
    j->c = c;
    j->bus = dsec__client_bus(c);
    snprintf(j->name, sizeof j->name, "%s", spec->name);
    snprintf(j->cell, sizeof j->cell, "%s", spec->cell);
    snprintf(j->cls, sizeof j->cls, "%s", cls);
    j->priority = spec->priority;
    j->checkpoint_ms = spec->checkpoint_ms;
    j->grace_ms = spec->grace_ms;
    j->cb = cb;
    j->ud = ud;
    j->nunits = spec->nunits;
    for (size_t i = 0; i < spec->nunits; i++) {
        struct unit *u = &j->units[i];
        if (dsec_name_ok(spec->units[i].node, DSEC_NAME_LEN_MAX) < 0) {
            dsec_err_set(err, DSEC_E_INVALID, 0, "job %s: unit %zu: bad node name", j->name, i);
            goto out_fail;
        }
        snprintf(u->node, sizeof u->node, "%s", spec->units[i].node);
        snprintf(u->name, sizeof u->name, "u%zu", i);
        u->cpu = spec->units[i].cpu_milli;
        u->mem = spec->units[i].memory_mb;
        if (hold_call(j, u, false, err) < 0)
            goto out_fail;
    }
    char subj[192];
    if (dsec_actor_new(&j->actor, j->bus, j->name, err) < 0)
        goto out_fail;
    snprintf(subj, sizeof subj, DSEC_SUBJ_JOB, j->cell, j->name, "reclaim");
    if (dsec_actor_on(j->actor, subj, NULL, on_reclaim, j, err) < 0)
        goto out_fail;
    snprintf(subj, sizeof subj, DSEC_SUBJ_JOB, j->cell, j->name, "forced");
    if (dsec_actor_on(j->actor, subj, NULL, on_forced, j, err) < 0 ||
        dsec_bus_flush(j->bus, 5000, err) < 0)
        goto out_fail;
    if (pthread_create(&j->thread, NULL, job_thread, j) != 0) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "job %s: cannot start its thread", j->name);
        goto out_fail;
    }
    *out = j;
    return 0;
out_fail:
    dsec_actor_free(j->actor);
    for (size_t i = 0; i < j->nunits; i++) {
        dsec_err e2;
        if (j->units[i].held)
            hold_call(j, &j->units[i], true, &e2);
    }
    pthread_cond_destroy(&j->cond);
    pthread_mutex_destroy(&j->mu);
    dsec_free(j->units);
    dsec_free(j);
    return -1;
}

void dsec_job_free(dsec_job *j, bool release)
{
    if (j == NULL)
        return;
    pthread_mutex_lock(&j->mu);
    j->stop = true;
    pthread_cond_signal(&j->cond);
    pthread_mutex_unlock(&j->mu);
    pthread_join(j->thread, NULL);
    dsec_actor_free(j->actor);
    for (size_t i = 0; release && i < j->nunits; i++) {
        dsec_err err;
        if (j->units[i].held && hold_call(j, &j->units[i], true, &err) < 0)
            dsec_log_warn("dsec job: %s", err.msg);
    }
    pthread_cond_destroy(&j->cond);
    pthread_mutex_destroy(&j->mu);
    dsec_free(j->units);
    dsec_free(j);
}

void dsec_job_stats_get(dsec_job *j, dsec_job_stats *out)
{
    pthread_mutex_lock(&j->mu);
    *out = j->st;
    out->units_held = 0;
    out->cpu_held_milli = out->mem_held_mb = 0;
    for (size_t i = 0; i < j->nunits; i++)
        if (j->units[i].held) {
            out->units_held++;
            out->cpu_held_milli += j->units[i].cpu;
            out->mem_held_mb += j->units[i].mem;
        }
    pthread_mutex_unlock(&j->mu);
}

const char *dsec_job_name(const dsec_job *j)
{
    return j->name;
}
