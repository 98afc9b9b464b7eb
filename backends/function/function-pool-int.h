/* function-pool-int.h - internals of the pools shared by the function-pool*.c files. */
#ifndef DSEC_BACKENDS_FUNCTION_POOL_INT_H
#define DSEC_BACKENDS_FUNCTION_POOL_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "backends/function/function-int.h"
#include "backends/function/function-proto.h"

enum { P_OFF, P_STARTING, P_UP, P_DOWN, P_FAILED };

enum { EV_WAKE = 1, EV_ZCTL, EV_ZPID, EV_WTASK, EV_WPID };
#define EV(kind, id) (((uint64_t)(kind) << 32) | (uint32_t)(id))

#define SPAWN_INFLIGHT_MAX 16
#define SPAWN_FAIL_LIMIT 3
#define RESTART_MAX_NS (5000ull * 1000000ull)
#define YOUNG_NS (2000ull * 1000000ull)

struct fn_pool {
    int idx, rt;
    int state;
    /* Environment pools (idx >= FN_RT_COUNT): used while the index is taken;
     * acquiring while the creator fetches the layers; retiring while the pool
     * thread takes it down (no sandbox left, idle for env_idle, or its index
     * wanted by another environment). */
    bool used, acquiring, retiring, evict;
    unsigned refs;
    uint64_t idle_since_ns;
    char *key;      /* the layer digests, lowest first, comma-joined */
    char *lower;    /* their cached paths, top first, colon-joined (overlay order) */
    char **digests; /* held in the layer cache, ndigests of them */
    size_t ndigests;
    char name[160]; /* "python3", or "python3 in python:3" */
    bool wanted;
    pid_t zpid;
    int zctl, zpidfd;
    unsigned starts, quick_deaths;
    uint64_t started_ns, restart_at_ns, retry_spawn_at_ns;
    unsigned target, hot_target;
    struct fn_worker *warm_head, *warm_tail; /* ready as forked (level 0) */
    struct fn_worker *hot_head, *hot_tail;   /* ready and warmed to hot_level */
    unsigned nwarm, nhot, npromoting, nspawning, nbusy, ndraining, waiters;
    unsigned consec_fail;
    unsigned long long calls, spawned, spawn_failures;
    char version[FNP_VERSION_MAX], preloaded[512], error[DSEC_ERR_MSG_MAX], zygote_exit[128];
};

struct fn_pools {
    char *zygote_path, *python, *pymod_dir, *root_dir, *preload, *ro_paths;
    unsigned max_workers, tmpfs_mb, hot_level;
    unsigned npools; /* FN_RT_COUNT host pools, then env_pools environment ones */
    unsigned env_warm[FN_RT_COUNT], env_hot[FN_RT_COUNT];
    uint64_t env_idle_ns;
    dsec_layer_cache *cache; /* borrowed; NULL: no environments */
    uint32_t uid_base;
    struct fn_cg cg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct fn_pool *pools;
    struct fn_cg_slot *cgslots;
    struct fn_worker **slot_worker;
    unsigned *free_slots, nfree;
    unsigned net_waiters; /* calls waiting for a slot to make a networked worker in */
    struct fn_worker *to_drain;
    struct fn_take_waiter *aw_head,
        *aw_tail; /* calls waiting on a loop for a worker, oldest first */
    int epfd, evfd;
    pthread_t thread;
    bool thread_started, stop;
};

/* ---- function-pool.c: the pool thread, slots and workers (lock held unless said) ---------------
 */

/* Wake the pool thread. */
void dsec__fn_pool_wake(struct fn_pools *p);
/* Something else changed (a pool failed, stopped, a zygote came or went): every call
 * waiting on a loop looks again. Lock held. */
void dsec__fn_pool_broadcast(struct fn_pools *p);
/* The pool's error (what callers are told), printf-style. */
void dsec__fn_pool_set_error(struct fn_pool *pool, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A wait status as words ("exited with status 1"). */
void dsec__fn_pool_describe_status(int st, char *buf, size_t len);
/* Close *fd if open; *fd becomes -1. */
void dsec__fn_pool_close_fd(int *fd);
/* The first worker of a list, taken out of it (NULL: empty). */
struct fn_worker *dsec__fn_pool_pop(struct fn_worker **head, struct fn_worker **tail);
/* Slot back on the free list. */
void dsec__fn_pool_slot_free(struct fn_pools *p, unsigned slot);
/* Close the backend's ends of w's channels. */
void dsec__fn_pool_worker_close(struct fn_worker *w);
/* Let a worker go: its slot comes back once its supervisor is gone. */
void dsec__fn_pool_worker_drain(struct fn_pools *p, struct fn_worker *w);
/* A worker that will not become warm. */
void dsec__fn_pool_worker_failed(struct fn_pools *p, struct fn_worker *w, const char *why);
/* Send SPAWN for w (its runtime, pool and slot set) and keep the backend's
 * ends of its channels in w. No lock held. netns_fd >= 0: a worker for one
 * call of a sandbox with a network (FNP_SPAWN_NET). */
int dsec__fn_pool_worker_spawn(struct fn_pools *p, int zctl, struct fn_worker *w, int netns_fd,
                               const char *resolver, char *why, size_t whylen);
/* Spawn towards the pool's target (plus the calls waiting), as slots and failures allow. */
void dsec__fn_pool_refill(struct fn_pools *p, struct fn_pool *pool, uint64_t now, unsigned waiting);
/* A monotonic deadline (ns) as a timespec for pthread_cond_timedwait. */
void dsec__fn_pool_deadline_ts(struct timespec *ts, uint64_t deadline_ns);
/* The pool's state into out (lock held). */
void dsec__fn_pool_info_locked(const struct fn_pool *pool, dsec_function_pool_info *out);

/* ---- function-pool-zygote.c: zygotes (pool thread, lock held) ----------------------------------
 */

/* Start the pool's zygote (the lock is dropped around the spawn). */
void dsec__fn_pool_zygote_start(struct fn_pools *p, struct fn_pool *pool);
/* The zygote died or its socket closed: reap it, schedule its restart. */
void dsec__fn_pool_zygote_gone(struct fn_pools *p, struct fn_pool *pool);
/* The zygote's control socket is readable. */
void dsec__fn_pool_on_zctl(struct fn_pools *p, struct fn_pool *pool);

/* ---- function-pool-env.c: environment pools ----------------------------------------------------
 */

/* Take an environment pool down once no sandbox uses it and it has been idle
 * for env_idle (at once when it failed or its index is wanted): its workers
 * first, then its zygote once their supervisors are gone, then its layers. */
void dsec__fn_pool_env_tend(struct fn_pools *p, struct fn_pool *pool, uint64_t now, uint64_t *next);
#endif
