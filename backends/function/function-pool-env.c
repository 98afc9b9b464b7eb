/* function-pool-env.c - environment pools: a zygote and pool per (runtime, layers), made on
 * first use, shared by the sandboxes using it, taken down when idle. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/function/function-int.h"
#include "backends/function/function-pool-int.h"
#include "backends/function/function-proto.h"
#include "dsec/alloc.h"

/* ---- environment pools (pool thread, lock held) ---------------------------------------------- */

static void env_forget(struct fn_pool *pool)
{
    dsec_free(pool->key);
    dsec_free(pool->lower);
    pool->key = pool->lower = NULL;
    pool->used = pool->acquiring = pool->retiring = pool->evict = pool->wanted = false;
    pool->refs = 0;
    pool->state = P_OFF;
    pool->starts = pool->quick_deaths = pool->consec_fail = 0;
    pool->restart_at_ns = pool->retry_spawn_at_ns = 0;
    pool->calls = pool->spawned = pool->spawn_failures = 0;
    pool->version[0] = pool->preloaded[0] = pool->error[0] = pool->zygote_exit[0] = '\0';
    pool->name[0] = '\0';
}

/* Drop the layers an environment pool holds. Drops the lock around the
 * cache, which may unmount. */
static void env_release_layers(struct fn_pools *p, struct fn_pool *pool)
{
    char **d = pool->digests;
    size_t n = pool->ndigests;
    pool->digests = NULL;
    pool->ndigests = 0;
    if (d == NULL)
        return;
    pthread_mutex_unlock(&p->mu);
    for (size_t i = 0; i < n; i++) {
        dsec_layer_cache_release(p->cache, d[i]);
        dsec_free(d[i]);
    }
    dsec_free(d);
    pthread_mutex_lock(&p->mu);
}

/* Take an environment pool down once no sandbox uses it and it has been idle
 * for env_idle (at once when it failed or its index is wanted): its workers
 * first, then its zygote once their supervisors are gone, then its layers. */
void dsec__fn_pool_env_tend(struct fn_pools *p, struct fn_pool *pool, uint64_t now, uint64_t *next)
{
    if (pool->idx < FN_RT_COUNT || !pool->used || pool->acquiring || pool->refs > 0)
        return;
    if (!pool->retiring) {
        uint64_t at = pool->idle_since_ns + p->env_idle_ns;
        if (!pool->evict && pool->state != P_FAILED && now < at) {
            if (at < *next)
                *next = at;
            return;
        }
        pool->retiring = true;
        pool->wanted = false;
        pool->target = pool->hot_target = 0;
    }
    struct fn_worker *w;
    while ((w = dsec__fn_pool_pop(&pool->warm_head, &pool->warm_tail)) != NULL) {
        pool->nwarm--;
        dsec__fn_pool_worker_drain(p, w);
    }
    while ((w = dsec__fn_pool_pop(&pool->hot_head, &pool->hot_tail)) != NULL) {
        pool->nhot--;
        dsec__fn_pool_worker_drain(p, w);
    }
    if (pool->nspawning + pool->npromoting + pool->nbusy + pool->ndraining > 0)
        return; /* each of them comes back through the epoll */
    if (pool->zpid > 0) {
        kill(pool->zpid, SIGKILL);
        dsec__fn_pool_zygote_gone(p, pool);
    }
    env_release_layers(p, pool);
    env_forget(pool);
    dsec__fn_pool_broadcast(p);
}

/* Fetch (or find in the cache) the layers of an environment pool being made
 * and give it its overlay order. No lock held. */
static int env_acquire(struct fn_pools *p, const char *const *digests, size_t n, char ***held,
                       char **lower, dsec_err *err)
{
    char **paths = dsec_calloc(n, sizeof *paths);
    char **d = dsec_calloc(n, sizeof *d);
    size_t got = 0, len = 0;
    if (paths == NULL || d == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: holding an environment's layers");
        goto fail;
    }
    for (; got < n; got++) {
        if ((d[got] = dsec_strdup(digests[got])) == NULL) {
            dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: holding an environment's layers");
            goto fail;
        }
        if (dsec_layer_cache_acquire(p->cache, digests[got], &paths[got], err) < 0) {
            dsec_err_wrap(err, "function: layer %s", digests[got]);
            dsec_free(d[got]);
            goto fail;
        }
        if (strpbrk(paths[got], ":,\\") != NULL) {
            dsec_err_set(err, DSEC_E_CONFIG, 0,
                         "function: layer path %s has a ':', ',' or '\\', which an overlay "
                         "cannot take (move the node's state directory)",
                         paths[got]);
            got++;
            goto fail;
        }
        len += strlen(paths[got]) + 1;
    }
    char *l = dsec_malloc(len);
    if (l == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: holding an environment's layers");
        goto fail;
    }
    l[0] = '\0';
    for (size_t i = n; i-- > 0;) { /* overlay wants the top first */
        strcat(l, paths[i]);
        if (i > 0)
            strcat(l, ":");
        dsec_free(paths[i]);
    }
    dsec_free(paths);
    *held = d;
    *lower = l;
    return 0;
fail:
    for (size_t i = 0; i < got; i++) {
        dsec_layer_cache_release(p->cache, digests[i]);
        dsec_free(d[i]);
        dsec_free(paths[i]);
    }
    dsec_free(d);
    dsec_free(paths);
    return -1;
}

/* The key of an environment (its layer digests, lowest first, comma-joined) into *key
 * (dsec_malloc'd), once the node takes environments and the digests are sound. */
static int env_key(const struct fn_pools *p, const char *const *digests, size_t n, const char *what,
                   char **key, dsec_err *err)
{
    if (p->cache == NULL)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "function: environment %s: this node has no layer registry", what);
    if (p->npools == FN_RT_COUNT)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "function: environment %s: this node runs function calls on the "
                            "host's base only (node option env_pools=0)",
                            what);
    if (n == 0 || n > FN_ENV_LAYERS_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "function: environment %s has %zu layers (1..%d)", what, n,
                            FN_ENV_LAYERS_MAX);
    size_t klen = 0;
    for (size_t i = 0; i < n; i++) {
        if (digests[i] == NULL || digests[i][0] == '\0' || strchr(digests[i], ',') != NULL)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "function: environment %s: layer %zu is not a digest", what, i);
        klen += strlen(digests[i]) + 1;
    }
    char *k = dsec_malloc(klen);
    if (k == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: an environment pool");
    k[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        strcat(k, digests[i]);
        if (i + 1 < n)
            strcat(k, ",");
    }
    *key = k;
    return 0;
}

/* The pool of (rt, *key) into *out, with a reference: one alive, else a free index made
 * into it (*made; it takes *key, set NULL), else one an idle environment gives up, waited
 * for until ts. No lock held. */
static int env_find(struct fn_pools *p, int rt, char **key, const char *what, int wait_ms,
                    const struct timespec *ts, struct fn_pool **out, bool *made, dsec_err *err)
{
    struct fn_pool *pool = NULL;
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    while (pool == NULL && rc == 0) {
        struct fn_pool *free_pool = NULL, *idle = NULL;
        bool retiring = false;
        for (unsigned i = FN_RT_COUNT; i < p->npools && pool == NULL; i++) {
            struct fn_pool *q = &p->pools[i];
            retiring |= q->retiring;
            if (!q->used) {
                if (free_pool == NULL)
                    free_pool = q;
            } else if (!q->retiring && q->rt == rt && strcmp(q->key, *key) == 0) {
                pool = q;
            } else if (!q->retiring && !q->acquiring && q->refs == 0 &&
                       (idle == NULL || q->idle_since_ns < idle->idle_since_ns)) {
                idle = q;
            }
        }
        if (pool != NULL) {
            pool->refs++;
            pool->evict = false; /* wanted again before it went */
        } else if (p->stop) {
            rc = dsec_err_set(err, DSEC_E_CLOSED, 0, "function: the backend is shutting down");
        } else if (free_pool != NULL) {
            pool = free_pool;
            pool->used = pool->acquiring = true;
            pool->refs = 1;
            pool->rt = rt;
            pool->key = *key;
            *key = NULL;
            pool->target = p->env_warm[rt];
            pool->hot_target = p->env_hot[rt];
            snprintf(pool->name, sizeof pool->name, "%s in %s", dsec__fn_runtime_name(rt), what);
            *made = true;
        } else if (idle == NULL && !retiring) {
            rc = dsec_err_set(err, DSEC_E_CAPACITY, 0,
                              "function: environment %s: all %u environment pools are in use by "
                              "sandboxes (node option env_pools)",
                              what, p->npools - FN_RT_COUNT);
        } else {
            /* an idle environment gives its index up (or one is being taken
             * down already): wait for it */
            if (idle != NULL) {
                idle->evict = true;
                dsec__fn_pool_wake(p);
            }
            if (pthread_cond_timedwait(&p->cv, &p->mu, ts) == ETIMEDOUT)
                rc = dsec_err_set(err, DSEC_E_CAPACITY, 0,
                                  "function: environment %s: no environment pool became free "
                                  "within %d ms",
                                  what, wait_ms);
        }
    }
    pthread_mutex_unlock(&p->mu);
    *out = pool;
    return rc;
}

/* A pool just made gets its layers (fetched with no lock held), or fails with their error. */
static void env_fill(struct fn_pools *p, struct fn_pool *pool, const char *const *digests, size_t n)
{
    char **held = NULL, *lower = NULL;
    dsec_err e;
    int arc = env_acquire(p, digests, n, &held, &lower, &e);
    pthread_mutex_lock(&p->mu);
    pool->acquiring = false;
    if (arc == 0) {
        pool->digests = held;
        pool->ndigests = n;
        pool->lower = lower;
        pool->wanted = true;
        dsec__fn_pool_wake(p);
    } else {
        pool->state = P_FAILED; /* never started: it has no root */
        dsec__fn_pool_set_error(pool, "%s", e.msg);
    }
    dsec__fn_pool_broadcast(p);
    pthread_mutex_unlock(&p->mu);
}

int dsec__fn_pools_env_get(struct fn_pools *p, int rt, const char *const *digests, size_t n,
                           const char *what, int wait_ms, int *out, dsec_err *err)
{
    char *key = NULL;
    if (env_key(p, digests, n, what, &key, err) < 0)
        return -1;
    uint64_t deadline = dsec_now_ns() + (uint64_t)wait_ms * 1000000ull;
    struct timespec ts;
    dsec__fn_pool_deadline_ts(&ts, deadline);
    struct fn_pool *pool = NULL;
    bool made = false;
    int rc = env_find(p, rt, &key, what, wait_ms, &ts, &pool, &made, err);
    dsec_free(key);
    if (rc < 0)
        return -1;
    if (made)
        env_fill(p, pool, digests, n);
    int left = (int)((deadline > dsec_now_ns() ? deadline - dsec_now_ns() : 0) / 1000000ull);
    if (dsec__fn_pools_start(p, pool->idx, left > 0 ? left : 1, err) < 0) {
        dsec__fn_pools_env_put(p, pool->idx);
        return -1; /* *out untouched: the caller holds nothing */
    }
    *out = pool->idx;
    return 0;
}

void dsec__fn_pools_env_put(struct fn_pools *p, int pi)
{
    if (pi < FN_RT_COUNT || (unsigned)pi >= p->npools)
        return;
    pthread_mutex_lock(&p->mu);
    struct fn_pool *pool = &p->pools[pi];
    if (pool->refs > 0 && --pool->refs == 0) {
        pool->idle_since_ns = dsec_now_ns();
        dsec__fn_pool_wake(p);
    }
    pthread_mutex_unlock(&p->mu);
}

size_t dsec__fn_pools_env_info(struct fn_pools *p, dsec_function_pool_info *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&p->mu);
    for (unsigned i = FN_RT_COUNT; i < p->npools; i++)
        if (p->pools[i].used && n < max)
            dsec__fn_pool_info_locked(&p->pools[i], &out[n++]);
    pthread_mutex_unlock(&p->mu);
    return n;
}
