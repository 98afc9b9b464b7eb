/* sim.h - the replay simulator: traces in memory, the DSec profile generator, trace statistics, the
 * open-loop replayer, the recorder and the report. */
#ifndef DSEC_SIM_H
#define DSEC_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bus/bus.h"
#include "dsec/err.h"

/* ---- a trace loaded in memory ------------------------------------------------ */

enum sim_kind {
    SIM_OP_CREATE = 1, /* a create: replayed as a request, its sandbox remembered */
    SIM_OP_SBX,        /* exec/op/file_* on a sandbox the trace created: id rewritten */
    SIM_OP_SEND,       /* other client-side traffic (jobs): sent as recorded */
    SIM_OP_SEEN,       /* output of the cell (replies, reclaim events), or what a replayed job sends
                          itself */
    SIM_OP_JOB, /* a training job's first registration: the replayer runs that job (libdsec's job
                   API) */
};

/* The node a generated trace names for a job unit it leaves to the replayer
 * to place (the generator does not know the cell's nodes). */
#define SIM_NODE_ANY "any"

/* One unit of capacity a job holds (SIM_OP_JOB). */
typedef struct sim_unit {
    char *node; /* recorded node, or SIM_NODE_ANY */
    uint64_t cpu_milli, memory_mb;
} sim_unit;

typedef struct sim_op {
    uint64_t t_ns; /* since the first record */
    int kind;      /* enum sim_kind */
    bool request;  /* send as a request (else publish) */
    char *subject;
    char *msg_type;
    char *req_id;
    uint8_t *payload;
    size_t len;
    /* creates; job_id and cls also for SIM_OP_JOB (the job's name and class) */
    char *sbx_type, *job_id, *cls;
    uint64_t cpu_milli, memory_mb, lifetime_s;
    double cpu_use;
    char **layers;
    size_t nlayers;
    /* SIM_OP_SBX: the create (index into ops) whose sandbox this targets, or -1 */
    long create_ix;
    bool destroys; /* an op "destroy": the replayer does not destroy this sandbox itself */
    /* "created" replies seen in the trace: the recorded sandbox id */
    char *created_id;
    /* SIM_OP_JOB: the job_register's cell, priority, checkpoint cost, grace and units */
    char *cell;
    int64_t priority;
    uint64_t checkpoint_ms, grace_ms;
    sim_unit *units;
    size_t nunits;
} sim_op;

typedef struct sim_trace {
    uint64_t created_ns;
    char *source;
    char **meta_k, **meta_v;
    size_t nmeta;
    uint64_t t0_ns; /* ts_ns of the first record */
    sim_op *ops;
    size_t n, cap;
} sim_trace;

/* Read a whole trace file. Errors name the file, the record number and the
 * byte offset where it broke. */
int sim_trace_load(sim_trace *t, const char *path, dsec_err *err);
/* The same from memory (name is used in messages). */
int sim_trace_load_mem(sim_trace *t, const void *buf, size_t len, const char *name, dsec_err *err);
void sim_trace_free(sim_trace *t);

/* ---- the DSec profile generator ----------------------------------------------- */

typedef struct sim_profile {
    uint64_t seed;
    double duration_s;           /* length of the trace */
    double rate;                 /* background rollout creates per second (Poisson) */
    double burst_every_s;        /* mean gap between bursts of one job */
    double burst_min, burst_max; /* burst sizes, log-uniform; one burst is burst_max */
    double burst_spread_s;       /* a burst's creates spread over this long */
    double life_median_s;        /* lognormal lifetimes */
    double life_sigma;
    double life_max_s;
    double low_use_share; /* share of sandboxes using <= low_use_max of their CPU */
    double low_use_max;
    double fanout_median, fanout_p90;      /* children per layer (lognormal) */
    int layer_depth;                       /* layers per environment (base first) */
    int bases;                             /* base layers */
    char mix[256];                         /* type=weight,... */
    int jobs;                              /* training jobs holding capacity from the start */
    uint64_t job_cpu_milli, job_memory_mb; /* of one unit */
    int job_units;                         /* units of capacity each job holds */
    double job_checkpoint_s; /* how long a job's checkpoint takes before it releases */
    double job_grace_s; /* the grace a job asks reclaims to give it; 0: the arbiter's default */
    char cell[64];      /* the cell the jobs register in */
    char tenant[64];
    uint64_t cpu_milli, memory_mb; /* what a rollout asks for (median; x0.25..x4) */
} sim_profile;

/* The "dsec" profile's defaults. */
void sim_profile_dsec(sim_profile *p);
/* Override one parameter by name ("rate", "life-median", ...); the names are
 * listed by sim_profile_help. */
int sim_profile_set(sim_profile *p, const char *key, const char *val, dsec_err *err);
void sim_profile_help(FILE *f);
/* Write a trace of profile p to f. *nrecords counts what was written. */
int sim_gen(const sim_profile *p, FILE *f, const char *cmdline, uint64_t *nrecords, dsec_err *err);

/* ---- statistics ------------------------------------------------------------------ */

typedef struct sim_stats {
    size_t records, creates, sbx_ops, sends, seen;
    double duration_s, create_rate_avg, create_rate_peak; /* peak: creates in the busiest second */
    double life_p50_s, life_p90_s, life_p99_s;
    double low_use_share; /* creates with cpu_use_fraction <= 0.05 */
    double fanout_p50, fanout_p90;
    size_t fanout_layers;   /* layers with children */
    size_t max_job_creates; /* creates of the largest job (a burst) */
    char max_job[96];
    size_t jobs;            /* training jobs registered (job_register records, one per job) */
    size_t job_holders;     /* their units, plus creates of class job|batch (older traces) */
    uint64_t job_cpu_milli; /* what they hold together */
    char types[8][32];
    size_t type_n[8], ntypes;
    char msg_types[16][32];
    size_t msg_type_n[16], nmsg_types;
} sim_stats;

int sim_stats_compute(const sim_trace *t, sim_stats *s, dsec_err *err);
void sim_stats_print(const sim_stats *s, FILE *f, bool json);

/* ---- replay -------------------------------------------------------------------------- */

/* Where a replay sends. The bus sink is the real thing; a no-op sink measures
 * the replayer alone. A request's answer comes back through sim_replay_answer. */
typedef struct sim_sink {
    int (*request)(void *ctx, const char *subject, const dsec_hdr *h, const void *data, size_t len,
                   int timeout_ms, void *req, dsec_err *err);
    int (*publish)(void *ctx, const char *subject, const dsec_hdr *h, const void *data, size_t len,
                   dsec_err *err);
    void *ctx;
    /* Where the trace's training jobs connect (libdsec, dsec_job_start) to hold
     * capacity and answer reclaims; NULL: the jobs are not run (counted as
     * skipped), e.g. for a no-op sink. */
    const char *job_url;
} sim_sink;

typedef struct sim_replay_opts {
    double speed;           /* trace time / replay time; 0: as fast as possible */
    int timeout_ms;         /* per request; default 30000 */
    long max_in_flight;     /* beyond this a send is counted as an error; default 1,000,000 */
    const char *tenant;     /* rewrite the tenant of create and sandbox subjects; NULL: keep */
    const char *force_type; /* replace every create's sandbox type (e.g. "sim"); NULL: keep */
    bool destroy_at_end;    /* destroy what is still alive when the trace ends (default true) */
    bool no_lifetimes;      /* do not destroy sandboxes after their recorded lifetime */
    bool progress;          /* draw a progress bar on stderr */
    double drain_s;         /* wait at most this long for answers at the end; default 10 */
    const char *cell;       /* the cell the trace's jobs register in; NULL: as recorded */
} sim_replay_opts;

typedef struct sim_replay sim_replay;

/* Prepare a replay of t (which must outlive it) into sink. */
int sim_replay_new(sim_replay **out, const sim_trace *t, const sim_sink *sink,
                   const sim_replay_opts *o, dsec_err *err);
/* A request's answer, from any thread: status < 0 with err for a transport
 * failure, else the reply's Dsec-Type (NULL: none), its error code header and
 * payload. */
void sim_replay_answer(void *req, int status, const char *type, const char *err_code,
                       const void *data, size_t len, const dsec_err *err);
/* Observed cell events (bus sink): a node's capacity report (live sandboxes,
 * free CPU and memory: the replayed jobs place their units by it), a
 * reclaim outcome from dsec.v1.ctl.evt.<cell>.reclaim. */
void sim_replay_node_report(sim_replay *r, const char *node, bool full, uint64_t live,
                            uint64_t cpu_free_milli, uint64_t mem_free_mb);
/* The nodes' answers to a sync (each node answers dsec.v1.ctl.sync with a full
 * capacity report). sim_replay_sync_begin is called before the sync is sent and
 * returns its number; sim_replay_sync_wait then waits until every node heard
 * before has answered it, and, while new nodes keep answering, until quiet_ms
 * pass without a new one (the cell's size is not known ahead), max_ms at most.
 * Returns the number of nodes that answered. */
uint64_t sim_replay_sync_begin(sim_replay *r);
size_t sim_replay_sync_wait(sim_replay *r, uint64_t sync, int quiet_ms, int max_ms);
void sim_replay_reclaim(sim_replay *r, const char *outcome);
/* Run to the end of the trace (plus lifetimes and the drain). */
int sim_replay_run(sim_replay *r, dsec_err *err);
/* Ask a running replay to stop early (signal-safe). */
void sim_replay_stop(sim_replay *r);
/* Reports: dir gets report.json, report.txt, the plot data and, with
 * gnuplot, PNGs. The text table also goes to f when not NULL. */
int sim_replay_report(sim_replay *r, const char *dir, FILE *f, dsec_err *err);
/* Figures for tests and benchmarks. */
typedef struct sim_replay_result {
    uint64_t ops_sent, creates_sent, creates_ok, sbx_sent, sends, destroys_sent, errors, unmapped;
    long in_flight;  /* requests still unanswered */
    uint64_t waited; /* sandbox operations that waited for their create's answer */
    double elapsed_s, ops_per_s, lat_p50_ms, lat_p99_ms;
    /* the cell's reclaim events by outcome (dsec.v1.ctl.evt.*.reclaim) */
    uint64_t reclaim_requested, reclaim_honoured, reclaim_forced, reclaim_failed;
    /* the replayed jobs: started, failed to start, not run (no job_url); the
     * reclaims they received, checkpoints they finished, units they released
     * themselves and units the arbiter took by force */
    uint64_t jobs_started, jobs_failed, jobs_skipped, job_reclaims, job_checkpoints,
        job_units_released, job_units_forced;
    /* sandboxes this replay created that were gone (not_found) before it
     * destroyed them: preempted or lost rollouts */
    uint64_t lost;
} sim_replay_result;
void sim_replay_result_get(sim_replay *r, sim_replay_result *out);
/* Requests still in flight (and a bus sink's observers) call into r: free the
 * sink and the bus first (dsec_bus_free answers pending requests with
 * DSEC_E_CLOSED), or make sure none are left, then free r. */
void sim_replay_free(sim_replay *r);

/* The bus sink and the cell observers (capacity reports, reclaim events). */
typedef struct sim_bus_sink sim_bus_sink;
int sim_bus_sink_new(sim_bus_sink **out, dsec_bus *bus, sim_sink *sink, dsec_err *err);
int sim_bus_sink_observe(sim_bus_sink *s, sim_replay *r, dsec_err *err);
/* Ask every node for a full capacity report (dsec.v1.ctl.sync); the number of
 * this sync for sim_replay_sync_wait in *sync. */
int sim_bus_sink_sync(sim_bus_sink *s, uint64_t *sync, dsec_err *err);
void sim_bus_sink_free(sim_bus_sink *s);

/* ---- record -------------------------------------------------------------------------- */

typedef struct sim_recorder sim_recorder;
/* The default subjects: creates, sandbox operations, job traffic, reclaim
 * events, and "created" replies (for mapping sandbox ids). */
extern const char *const sim_record_default_subjects[];
/* Tap subjects (NULL-terminated; NULL: the defaults) on bus into f. */
int sim_record_start(sim_recorder **out, dsec_bus *bus, FILE *f, const char *const *subjects,
                     const char *cmdline, dsec_err *err);
uint64_t sim_record_count(sim_recorder *r);
/* Stop tapping: drain the tap (what the server had sent is written), then
 * flush. *dropped: messages the tap lost (its
 * mailbox full, nats.c's queue full, or the drain out of time). */
int sim_record_stop(sim_recorder *r, uint64_t *dropped, dsec_err *err);

/* ---- the sim cell ----------------------------------------------------------------------- */
double sim_now(void); /* CLOCK_MONOTONIC seconds */
uint64_t sim_wall_ns(void);

#endif
