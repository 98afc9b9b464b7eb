/* replay_int.h - the replayer's state, shared by replay.c, report.c and sink.c. */
#ifndef DSEC_SIM_REPLAY_INT_H
#define DSEC_SIM_REPLAY_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "dsec/job.h"
#include "dsec/names.h"
#include "dsec/pace.h"
#include "sim/sim.h"

#define SIM_MAX_BUCKETS 4096
#define SIM_MAX_ERR_KINDS 32
#define SIM_MAX_NODES 4096

enum { SIM_REQ_CREATE = 1, SIM_REQ_OP, SIM_REQ_DESTROY };
enum { SIM_SBX_NONE = 0, SIM_SBX_LIVE, SIM_SBX_GONE, SIM_SBX_FAILED };

struct sim_req {
    struct sim_replay *r;
    int what;
    long ix;
    double due;        /* when it was due: latency counts from here (open loop) */
    double deadline;   /* a create's: its first send plus the timeout, kept by overloaded resends */
    dsec_pace_item pi; /* a create held back by the replay's pace, as libdsec holds them */
};

struct sim_sbx {
    _Atomic int state;
    _Atomic bool lost; /* answered not_found before the replay destroyed it */
    char id[DSEC_SBX_ID_LEN_MAX + 1];
    char node[72];
    struct sim_req destroy_req;
    uint32_t ndeferred; /* its operations waiting for the create's answer (main thread) */
};

struct sim_timer {
    double due;
    long ix;
};

struct sim_lat {
    double ms;
    uint32_t bucket;
};

struct sim_bucket {
    uint64_t sent, created, errors, live, node_live, in_flight;
    uint64_t reclaim_requested, reclaim_honoured, reclaim_forced, reclaim_failed;
};

struct sim_node_load {
    char name[72];
    uint64_t live, peak;
    uint64_t cpu_free, mem_free; /* last report, less units the replay placed since */
    uint64_t synced;             /* the last sync a full report of this node followed */
};

/* A training job of the trace, run by the replayer through libdsec's job API. */
struct sim_job {
    struct sim_replay *r;
    long ix;             /* its SIM_OP_JOB */
    dsec_job *job;       /* NULL until started (or when it failed) */
    double checkpoint_s; /* modelled checkpoint, replay time */
};

/* The replayed jobs (jobs.c): started off the send loop by their own thread,
 * because taking units is a synchronous request per unit. */
struct sim_jobs {
    pthread_t thread;
    bool running;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    long *queue; /* SIM_OP_JOB indexes due, not yet started */
    size_t nq, cap_q;
    _Atomic bool stop;
    dsec_client *client;
    bool client_failed;
    bool nodes_settled; /* the nodes' answers to the sync have all come, as far as one can tell */
    struct sim_job **jobs; /* each allocated alone: libdsec holds its address */
    size_t njobs, cap_jobs;
    char first_err[256]; /* the first job that failed to start, and why */
};

struct sim_replay {
    const sim_trace *t;
    sim_sink sink;
    sim_replay_opts o;
    char run_id[33];
    dsec_pace *pace; /* creates held back while the cell sheds them, as libdsec does */
    pthread_mutex_t mu;
    struct sim_sbx *sbx;  /* per trace index (creates) */
    struct sim_req *reqs; /* per trace index */
    bool *explicit_destroy;
    long *deferred; /* sandbox operations waiting for their sandbox, in trace order */
    size_t ndeferred;
    struct sim_lat *lat;
    _Atomic long nlat;
    bool lat_sorted;
    struct sim_timer *heap;
    size_t nheap, cap_heap;
    /* creates answered "overloaded", by when they go again (as libdsec resends them) */
    struct sim_timer *rheap;
    size_t nrheap, cap_rheap;
    _Atomic uint64_t resent;
    struct sim_bucket *b;
    size_t nbuckets;
    double bucket_s, t_start, t_sent, t_end, t_trace_end;
    _Atomic long in_flight;
    _Atomic uint64_t ops_sent, creates_sent, creates_ok, sbx_sent, sends, destroys_sent, destroyed,
        errors, unmapped, seen, waited;
    _Atomic int stop;
    char err_kind[SIM_MAX_ERR_KINDS][80];
    uint64_t err_n[SIM_MAX_ERR_KINDS];
    char err_first[SIM_MAX_ERR_KINDS]
                  [200]; /* the first message of each kind, "" when it had none */
    size_t nerr_kinds;
    struct sim_node_load nodes[SIM_MAX_NODES];
    size_t nnodes;
    uint64_t sync; /* syncs begun */
    uint64_t reclaims, reclaim_requested, reclaim_honoured, reclaim_forced, reclaim_failed;
    struct sim_jobs jobs;
    _Atomic uint64_t jobs_started, jobs_failed, jobs_skipped, job_reclaims, job_checkpoints,
        job_units_released, job_units_forced, lost;
    _Atomic int checkpointing; /* job checkpoints under way */
};

void sim_replay_error(struct sim_replay *r, const char *kind, double t);
void sim_replay_error_msg(struct sim_replay *r, const char *kind, const char *msg, double t);
size_t sim_bucket_of(const struct sim_replay *r, double t);
/* jobs.c: queue a due SIM_OP_JOB (returns at once); stop every job (their
 * units are given back) and gather their figures; free what is left. */
void sim_jobs_due(struct sim_replay *r, long ix);
void sim_jobs_stop(struct sim_replay *r);
double sim_lat_pct(const struct sim_lat *v, size_t n, double p);

#endif
