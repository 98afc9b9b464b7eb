/* function-int.h - what the files of the function backend share (the backend side; the zygote
 * helper has function-zygote.h). */
#ifndef DSEC_BACKENDS_FUNCTION_INT_H
#define DSEC_BACKENDS_FUNCTION_INT_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "backends/backend.h"
#include "backends/function/function.h"
#include "backends/layers/layer-cache.h"
#include "dsec/clock.h"

enum { FN_RT_PYTHON3, FN_RT_SH, FN_RT_NATIVE, FN_RT_COUNT };

/* "python3", "sh", "native". */
const char *dsec__fn_runtime_name(int rt);
/* The runtime index of a name, or -1. */
int dsec__fn_runtime_find(const char *name);

/* ---- cgroups (function-cgroup.c) ------------------------------------------------ */

enum { FN_CG_NONE, FN_CG_V1, FN_CG_V2 };

/* The instance's cgroup directories. v1 has one per controller (memory is
 * required, pids and cpuacct are used when mounted); v2 one for all. */
struct fn_cg {
    int mode;
    char mem[PATH_MAX], pids[PATH_MAX], cpu[PATH_MAX]; /* "" when absent */
};

/* One slot's cgroup: a worker runs in it; slots are reused, never shared. */
struct fn_cg_slot {
    bool made;
    int limit_fd; /* memory.limit_in_bytes (v1) or memory.max (v2) */
    int pids_fd;  /* pids.max, or -1 */
    int cpu_fd;   /* cpuacct.usage (v1) or cpu.stat (v2), or -1 */
    int procs[3]; /* cgroup.procs of each hierarchy, for new workers to join */
    int nprocs;
    uint64_t limit, pids; /* values last written; 0 = never */
};

/* Find the cgroup hierarchy (want: "auto", "v1", "v2" or "none") and make
 * the instance directory inst below this process's own cgroup. With "auto"
 * and nothing usable, cg->mode is FN_CG_NONE and 0 is returned. */
int dsec__fn_cg_open(struct fn_cg *cg, const char *want, const char *inst, dsec_err *err);
/* Remove the instance directory (the slots must be freed first). */
void dsec__fn_cg_close(struct fn_cg *cg);
int dsec__fn_cg_slot_make(struct fn_cg *cg, unsigned slot, struct fn_cg_slot *s, dsec_err *err);
void dsec__fn_cg_slot_free(struct fn_cg *cg, unsigned slot, struct fn_cg_slot *s);
/* The slot's cgroup.procs files for a new worker to join (W1 writes "0"
 * into each): up to 3 fds owned by the slot, *n their count. */
void dsec__fn_cg_slot_procs(const struct fn_cg_slot *s, int fds[3], int *n);
/* Memory limit (bytes) and process limit of the slot; written only when
 * they change. 0 leaves a limit unset. */
int dsec__fn_cg_slot_limits(struct fn_cg_slot *s, int mode, uint64_t mem, uint64_t pids,
                            dsec_err *err);
/* CPU time used in the slot so far (ns); -1 when unknown. */
int dsec__fn_cg_slot_cpu(const struct fn_cg_slot *s, int mode, uint64_t *ns);

/* ---- a sandbox's files (function-files.c) -------------------------------------------- */

/* The files under /work that every call of one sandbox starts with, kept in
 * a host directory (so they survive a node manager restart). */
struct fn_files {
    int dirfd;
    uint64_t bytes, nfiles;        /* what it holds */
    uint64_t max_bytes, max_files; /* quota */
    int bundle_fd;                 /* sealed memfd of the files, or -1 */
    uint64_t bundle_len;
    bool dirty; /* changed since the bundle was built */
};

/* Open (create: make, failing if it exists) the directory dir. */
int dsec__fn_files_open(struct fn_files *f, const char *dir, bool create, uint64_t max_bytes,
                        uint64_t max_files, dsec_err *err);
void dsec__fn_files_close(struct fn_files *f);
/* Delete dir and everything below it. */
int dsec__fn_files_remove(const char *dir, dsec_err *err);
/* mkdir, stat, rename, remove under /work (backend.h, dsec_file_op). */
int dsec__fn_files_op(struct fn_files *f, const dsec_file_op *op, dsec_file_entry *out,
                      dsec_err *err);
int dsec__fn_files_write(struct fn_files *f, const char *path, const void *data, size_t len,
                         uint32_t mode, bool append, dsec_err *err);
int dsec__fn_files_read(struct fn_files *f, const char *path, uint64_t offset, uint64_t max,
                        dsec_file_data *out, dsec_err *err);
int dsec__fn_files_list(struct fn_files *f, const char *path, dsec_file_entry **entries, size_t *n,
                        dsec_err *err);
/* The bundle of the files for a call (function-proto.h): *fd is owned by f
 * (-1 when there are no files), valid until the next write. */
int dsec__fn_files_bundle(struct fn_files *f, int *fd, uint64_t *len, dsec_err *err);

/* ---- the pools (function-pool.c) ------------------------------------------------------- */

struct fn_pool_conf {
    const char *zygote_path;    /* dsec-fn-zygote: the sh and native zygote */
    const char *python;         /* the interpreter that becomes the python3 zygote */
    const char *pymod_dir;      /* the directory holding _dsec_fnz.so */
    const char *root_dir;       /* empty directory the zygotes mount their sandbox root on */
    const char *node;           /* for names */
    unsigned max_workers;       /* slots: workers alive at once, all runtimes */
    unsigned warm[FN_RT_COUNT]; /* warm workers kept, hot ones included */
    unsigned hot[FN_RT_COUNT];  /* of which this many warmed to hot_level ahead */
    unsigned tmpfs_mb;
    unsigned hot_level; /* 1 or 2 (fnp_prep) */
    uint32_t uid_base;
    const char *preload;  /* python3 modules, comma-separated */
    const char *ro_paths; /* extra read-only paths, comma-separated */
    const char *cgroup;   /* auto | v1 | v2 | none */
    /* Environments: a zygote and pool per (runtime, layers), at most
     * env_pools at once, each keeping env_warm[rt] workers (env_hot[rt]
     * hot); one no sandbox uses goes after env_idle_ms. */
    unsigned env_pools;
    unsigned env_warm[FN_RT_COUNT], env_hot[FN_RT_COUNT];
    uint64_t env_idle_ms;
    dsec_layer_cache *cache; /* the node's, borrowed; NULL: no environments */
};

struct fn_pools;

/* One worker, from SPAWN to drained. The call owns it between take and done. */
struct fn_worker {
    struct fn_worker *next;
    int rt, pool; /* its runtime, and the index of its pool */
    unsigned slot;
    int task_fd, stdin_fd, stdout_fd, stderr_fd; /* the backend's ends */
    int pidfd;                                   /* W2, from the first READY */
    pid_t pid;                                   /* W2 (host), looked up when asked for */
    bool spawned, ready;
    bool promoting; /* a PREP is out, its READY not back yet */
    unsigned level; /* how warm its runtime is (fnp_prep) */
    bool own;       /* made for one call (a networked sandbox's), never pooled */
    char why[512];  /* own: why the zygote could not spawn it (SPAWN_FAILED) */
};

int dsec__fn_pools_new(struct fn_pools **out, const struct fn_pool_conf *conf, dsec_err *err);
void dsec__fn_pools_free(struct fn_pools *p);
/* Pools are numbered: the host pools of runtime rt are number rt; an
 * environment's come after FN_RT_COUNT. */
/* Start the pool if it is not running and wait up to wait_ms for its zygote
 * to say HELLO (or fail). */
int dsec__fn_pools_start(struct fn_pools *p, int pi, int wait_ms, dsec_err *err);
/* The pool of runtime rt in the environment made of these layers (lowest
 * first), made and started if needed (its layers held in the node's cache
 * while it lives); counts one sandbox using it. what names the environment
 * in messages. */
#define FN_ENV_LAYERS_MAX 64
int dsec__fn_pools_env_get(struct fn_pools *p, int rt, const char *const *digests, size_t n,
                           const char *what, int wait_ms, int *pi, dsec_err *err);
/* A sandbox stops using environment pool pi. */
void dsec__fn_pools_env_put(struct fn_pools *p, int pi);
/* The environment pools alive, into out[0..max). */
size_t dsec__fn_pools_env_info(struct fn_pools *p, dsec_function_pool_info *out, size_t max);
/* A call waiting for a warm worker without a thread (on an event loop). The caller zeroes it
 * with efd -1 and owns efd once set (closing it after dsec__fn_worker_unwait, or once a take
 * returned other than 1). */
struct fn_take_waiter {
    struct fn_take_waiter *next, *prev; /* in the pools' list while waiting */
    int pi;
    int efd;       /* an eventfd the pool writes when a worker may be there; -1: none (poll) */
    bool net;      /* waits for a slot to make a networked worker in, not a warm worker */
    bool stole;    /* net: had a warm worker of another pool let go for its slot */
    bool waiting;  /* counted among the pool's waiters */
    bool notified; /* told since it last looked */
};

/* Take a warm worker of pool pi without waiting: 0 and *out when one is there; otherwise 1,
 * t counted among the pool's waiters (so the pool spawns for it; t->efd made and written when
 * a worker of the pool is ready, or anything else changes) until it takes one, gives up
 * (expired: the wait of wait_ms is over, -1 with DSEC_E_CAPACITY) or is unwaited; -1 with err
 * when no worker can start. Short: takes the pool lock, never waits for it to change. */
int dsec__fn_worker_try_take(struct fn_pools *p, int pi, struct fn_take_waiter *t, bool expired,
                             uint64_t wait_ms, struct fn_worker **out, dsec_err *err);
/* Stop waiting (when t is): the pool writes t->efd no more. */
void dsec__fn_worker_unwait(struct fn_pools *p, struct fn_take_waiter *t);
/* A worker made for one call of a sandbox with a network: W1 joins the namespace netns_fd
 * (borrowed) instead of making an empty one, and the call's /etc/resolv.conf names resolver.
 * Without waiting: 0, a slot taken and SPAWN sent (*out on its way: wait for its task_fd to
 * be readable, then dsec__fn_worker_net_ready; *zctl_used the zygote socket it went to); 1,
 * no slot free or the pool not up yet: t waits as in dsec__fn_worker_try_take (its eventfd
 * written when a slot comes back); -1 with err, and *lost when the zygote refused it (it may
 * be dying: try again once dsec__fn_pool_zygote_changed). */
int dsec__fn_worker_net_start(struct fn_pools *p, int pi, int netns_fd, const char *resolver,
                              struct fn_take_waiter *t, bool expired, uint64_t wait_ms,
                              struct fn_worker **out, int *zctl_used, bool *lost, dsec_err *err);
/* A worker from dsec__fn_worker_net_start whose task_fd is readable (or, timed_out, did not
 * become so in time): 0 ready (hand it back with dsec__fn_worker_done); 1 nothing there yet;
 * -1 with err: the worker is gone, *lost when it vanished without a word (its zygote died
 * under it: try again). */
int dsec__fn_worker_net_ready(struct fn_pools *p, struct fn_worker *w, bool timed_out, bool *lost,
                              dsec_err *err);
/* Whether pool pi's zygote is no longer the one behind zctl (or the pool is not up). */
bool dsec__fn_pool_zygote_changed(struct fn_pools *p, int pi, int zctl);
/* The call is over (or never started): close the worker's channels and let
 * the pool reclaim its slot once its supervisor has exited. */
void dsec__fn_worker_done(struct fn_pools *p, struct fn_worker *w);
/* The cgroup slot of a taken worker (NULL without cgroups) and the mode. */
struct fn_cg_slot *dsec__fn_worker_cg(struct fn_pools *p, const struct fn_worker *w, int *mode);
int dsec__fn_pools_info(struct fn_pools *p, int rt, dsec_function_pool_info *out);
int dsec__fn_pools_set_warm(struct fn_pools *p, int rt, unsigned warm, unsigned hot, int wait_ms,
                            dsec_err *err);
size_t dsec__fn_pools_warm_pids(struct fn_pools *p, int rt, pid_t *out, size_t max);

/* ---- one call (function-call.c) ----------------------------------------------------------- */

/* Per-sandbox limits, from labels at create. 0 = unset. */
struct fn_limits {
    uint64_t memory_mb;
    uint64_t cpu_ms;
    uint64_t timeout_ms;
    uint64_t fsize_mb;
    uint32_t nproc;
    uint32_t nofile;
};

struct fn_call_conf {
    uint64_t max_timeout_ms; /* ceiling of every call's wall time */
    uint64_t acquire_ms;     /* wait for a warm worker */
    bool use_rlimit_as;      /* also cap address space at the memory limit */
};

/* Where a call runs: its runtime, its pool, and the environment's variables
 * ("K=V", under the call's own). */
struct fn_target {
    int rt, pool;
    char *const *vars;
    size_t nvars;
    int netns_fd;         /* the sandbox's network namespace, or -1: a fresh empty one */
    const char *resolver; /* with netns_fd: the nameserver of its calls */
};

struct dsec_loop;
/* Start one call (backend.h, exec_start): the task is made here, on the caller's thread, and
 * everything after (taking a warm worker, sending, watching its output, deadline and CPU
 * limit) runs on loop. 0: done will be called once, on loop's thread, after *cpu_used_us and
 * *calls (the sandbox's, not touched by anyone else until then) were added to; -1 with err:
 * done is never called. */
int dsec__fn_call_start(struct fn_pools *pools, const struct fn_call_conf *cc,
                        const struct fn_target *tg, const struct fn_limits *lim,
                        struct fn_files *files, const dsec_exec_req *req, struct dsec_loop *loop,
                        uint64_t *cpu_used_us, uint64_t *calls, dsec_exec_done_fn done, void *ud,
                        dsec_err *err);

#endif
