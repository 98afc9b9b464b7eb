/* jobs.c - the trace's training jobs, run by the replayer as real jobs: libdsec's job API holds
 * their units and answers the arbiter's reclaims after a modelled checkpoint. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dsec/alloc.h"
#include "sim/replay_int.h"

/* The checkpoint the trace says the job needs, in replay time: the arbiter
 * waits for it like for a real one. A stopping replay cuts it short and
 * releases at once (the job ends anyway). 0 lets libdsec release. */
static int on_checkpoint(dsec_job *job, const dsec_job_reclaim *rc, void *ud)
{
    (void)job, (void)rc;
    struct sim_job *j = ud;
    sim_replay *r = j->r;
    atomic_fetch_add(&r->job_reclaims, 1);
    atomic_fetch_add(&r->checkpointing, 1);
    double until = sim_now() + j->checkpoint_s;
    while (sim_now() < until && !atomic_load(&r->jobs.stop) && !atomic_load(&r->stop))
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    atomic_fetch_add(&r->job_checkpoints, 1);
    atomic_fetch_sub(&r->checkpointing, 1);
    return 0;
}

/* A node for one unit: the recorded node when the cell reports it, else the
 * reported node with the most free CPU among those with room (the node has
 * the final word: a hold it cannot take fails the job's start). The view is
 * charged at once so the next unit goes elsewhere. NULL: no node known. */
static bool place(sim_replay *r, const sim_unit *u, char *out, size_t n)
{
    pthread_mutex_lock(&r->mu);
    size_t best = SIZE_MAX;
    bool any = strcmp(u->node, SIM_NODE_ANY) == 0;
    for (size_t i = 0; !any && i < r->nnodes; i++)
        if (strcmp(r->nodes[i].name, u->node) == 0)
            best = i;
    if (best == SIZE_MAX) {
        bool best_fits = false;
        for (size_t i = 0; i < r->nnodes; i++) {
            const struct sim_node_load *nd = &r->nodes[i];
            bool fits = nd->cpu_free >= u->cpu_milli && nd->mem_free >= u->memory_mb;
            if (best == SIZE_MAX || (fits && !best_fits) ||
                (fits == best_fits && nd->cpu_free > r->nodes[best].cpu_free)) {
                best = i;
                best_fits = fits;
            }
        }
    }
    if (best == SIZE_MAX) {
        pthread_mutex_unlock(&r->mu);
        if (any)
            return false;
        snprintf(out, n, "%s", u->node); /* no reports to go by: trust the recording */
        return true;
    }
    struct sim_node_load *nd = &r->nodes[best];
    nd->cpu_free = nd->cpu_free > u->cpu_milli ? nd->cpu_free - u->cpu_milli : 0;
    nd->mem_free = nd->mem_free > u->memory_mb ? nd->mem_free - u->memory_mb : 0;
    snprintf(out, n, "%s", nd->name);
    pthread_mutex_unlock(&r->mu);
    return true;
}

static void job_failed(sim_replay *r, const char *kind, const char *why)
{
    atomic_fetch_add(&r->jobs_failed, 1);
    sim_replay_error(r, kind, sim_now());
    pthread_mutex_lock(&r->jobs.mu);
    if (!r->jobs.first_err[0])
        snprintf(r->jobs.first_err, sizeof r->jobs.first_err, "%.*s",
                 (int)sizeof r->jobs.first_err - 1, why); /* the start of it is enough */
    pthread_mutex_unlock(&r->jobs.mu);
}

/* The job's name in this replay: the recorded name with a run suffix, so
 * that replaying twice (or a recording of a replay) never meets a job, or
 * an arbiter's record of one, left from another run. */
static void job_name(const sim_replay *r, const char *recorded, char *out, size_t n)
{
    size_t len = strlen(recorded);
    if (len > 11 && strncmp(recorded + len - 11, "-rp", 3) == 0)
        len -= 11; /* a name this replayer gave: "-rp" and a run id of 8 */
    if (len > DSEC_NAME_LEN_MAX - 11)
        len = DSEC_NAME_LEN_MAX - 11;
    snprintf(out, n, "%.*s-rp%.8s", (int)len, recorded, r->run_id);
}

static void start_one(sim_replay *r, long ix)
{
    const sim_op *o = &r->t->ops[ix];
    struct sim_jobs *J = &r->jobs;
    char why[DSEC_ERR_MSG_MAX + 256];
    /* The starting loads arrive with the nodes' answers to the sync. Before the first job,
     * wait (3 s at most) for the first, then until 100 ms pass without a new node: units
     * placed on the few nodes heard so far could crowd them. */
    for (int i = 0, still = 0; i < 300 && !J->nodes_settled && !atomic_load(&J->stop); i++) {
        pthread_mutex_lock(&r->mu);
        size_t nn = r->nnodes;
        pthread_mutex_unlock(&r->mu);
        nanosleep(&(struct timespec){0, 10000000}, NULL);
        pthread_mutex_lock(&r->mu);
        still = nn > 0 && r->nnodes == nn ? still + 1 : 0;
        pthread_mutex_unlock(&r->mu);
        J->nodes_settled = still >= 10;
    }
    if (!J->nodes_settled) { /* 3 s: as settled as it gets, if any node has answered */
        pthread_mutex_lock(&r->mu);
        J->nodes_settled = r->nnodes > 0;
        pthread_mutex_unlock(&r->mu);
    }
    dsec_err err;
    if (!J->client && !J->client_failed) {
        dsec_client_opts co = {.url = r->sink.job_url, .name = "dsec-sim jobs", .threads = 2};
        if (dsec_client_connect(&J->client, &co, &err) < 0) {
            J->client_failed = true;
            snprintf(why, sizeof why, "jobs cannot connect to %s: %s", r->sink.job_url, err.msg);
            job_failed(r, "job: cannot connect", why);
            return;
        }
    }
    if (!J->client) {
        job_failed(r, "job: cannot connect", "jobs cannot connect");
        return;
    }
    char name[DSEC_NAME_LEN_MAX + 1];
    job_name(r, o->job_id, name, sizeof name);
    dsec_job_unit *units = dsec_calloc(o->nunits + 1, sizeof *units);
    char(*nodes)[DSEC_NAME_LEN_MAX + 1] = dsec_calloc(o->nunits + 1, sizeof *nodes);
    struct sim_job *j = dsec_calloc(1, sizeof *j);
    if (!units || !nodes || !j) {
        job_failed(r, "job: out of memory", "out of memory");
        goto out;
    }
    for (size_t u = 0; u < o->nunits; u++) {
        if (!place(r, &o->units[u], nodes[u], sizeof nodes[u])) {
            snprintf(why, sizeof why,
                     "job %s: no node reported its capacity, so unit %zu has nowhere to go", name,
                     u);
            job_failed(r, "job: no nodes", why);
            goto out;
        }
        units[u] = (dsec_job_unit){.node = nodes[u],
                                   .cpu_milli = o->units[u].cpu_milli,
                                   .memory_mb = o->units[u].memory_mb};
    }
    j->r = r;
    j->ix = ix;
    j->checkpoint_s = r->o.speed > 0 ? (double)o->checkpoint_ms / 1000 / r->o.speed : 0;
    dsec_job_spec spec = {.name = name,
                          .cell = r->o.cell ? r->o.cell : o->cell,
                          .cls = o->cls,
                          .priority = o->priority,
                          .checkpoint_ms = (uint64_t)(j->checkpoint_s * 1000),
                          .grace_ms = o->grace_ms,
                          .units = units,
                          .nunits = o->nunits};
    if (dsec_job_start(J->client, &spec, on_checkpoint, j, &j->job, &err) < 0) {
        char kind[80];
        snprintf(kind, sizeof kind, "job start: %s", dsec_code_name(err.code));
        job_failed(r, kind, err.msg);
        goto out;
    }
    pthread_mutex_lock(&J->mu);
    if (J->njobs == J->cap_jobs) {
        J->cap_jobs = J->cap_jobs ? J->cap_jobs * 2 : 16;
        J->jobs = dsec_realloc(J->jobs, J->cap_jobs * sizeof *J->jobs);
    }
    J->jobs[J->njobs++] = j;
    pthread_mutex_unlock(&J->mu);
    j = NULL;
    atomic_fetch_add(&r->jobs_started, 1);
out:
    dsec_free(j);
    dsec_free(units);
    dsec_free(nodes);
}

static void *jobs_thread(void *arg)
{
    sim_replay *r = arg;
    struct sim_jobs *J = &r->jobs;
    pthread_mutex_lock(&J->mu);
    for (;;) {
        while (!atomic_load(&J->stop) && J->nq == 0)
            pthread_cond_wait(&J->cond, &J->mu);
        if (atomic_load(&J->stop))
            break;
        long ix = J->queue[0];
        memmove(J->queue, J->queue + 1, --J->nq * sizeof *J->queue);
        pthread_mutex_unlock(&J->mu);
        start_one(r, ix);
        pthread_mutex_lock(&J->mu);
    }
    pthread_mutex_unlock(&J->mu);
    return NULL;
}

void sim_jobs_due(sim_replay *r, long ix)
{
    struct sim_jobs *J = &r->jobs;
    if (!r->sink.job_url) {
        atomic_fetch_add(&r->jobs_skipped, 1);
        return;
    }
    pthread_mutex_lock(&J->mu);
    if (!J->running) {
        if (pthread_create(&J->thread, NULL, jobs_thread, r) != 0) {
            pthread_mutex_unlock(&J->mu);
            job_failed(r, "job: no thread", "cannot start the jobs' thread");
            return;
        }
        J->running = true;
    }
    if (J->nq == J->cap_q) {
        J->cap_q = J->cap_q ? J->cap_q * 2 : 16;
        J->queue = dsec_realloc(J->queue, J->cap_q * sizeof *J->queue);
    }
    J->queue[J->nq++] = ix;
    pthread_cond_signal(&J->cond);
    pthread_mutex_unlock(&J->mu);
}

void sim_jobs_stop(sim_replay *r)
{
    struct sim_jobs *J = &r->jobs;
    pthread_mutex_lock(&J->mu);
    atomic_store(&J->stop, true);
    pthread_cond_broadcast(&J->cond);
    bool running = J->running;
    J->running = false;
    size_t left = J->nq;
    J->nq = 0;
    pthread_mutex_unlock(&J->mu);
    if (running)
        pthread_join(J->thread, NULL);
    for (size_t i = 0; i < left; i++)
        job_failed(r, "job: replay ended first", "the replay ended before a job could start");
    for (size_t i = 0; i < J->njobs; i++) {
        struct sim_job *j = J->jobs[i];
        dsec_job_stats st;
        dsec_job_stats_get(j->job, &st);
        size_t had = r->t->ops[j->ix].nunits;
        atomic_fetch_add(&r->job_units_forced, st.forced);
        if (had > st.units_held + st.forced)
            atomic_fetch_add(&r->job_units_released, had - st.units_held - st.forced);
        dsec_job_free(j->job, true); /* the units still held go back */
        dsec_free(j);
    }
    J->njobs = 0;
    dsec_free(J->jobs);
    J->jobs = NULL;
    J->cap_jobs = 0;
    dsec_client_free(J->client);
    J->client = NULL;
}
