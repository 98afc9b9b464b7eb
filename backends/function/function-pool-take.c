/* function-pool-take.c - the calls' side of the pools: taking a warm worker (or waiting for
 * one), making a worker for one networked call, and handing it back. */
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

/* A taken worker whose supervisor already died or spoke out of turn. */
static bool worker_dead(const struct fn_worker *w)
{
    struct pollfd pf[2] = {{.fd = w->task_fd, .events = POLLIN},
                           {.fd = w->pidfd, .events = POLLIN}};
    return poll(pf, 2, 0) != 0;
}

static void waiter_link(struct fn_pools *p, struct fn_take_waiter *t)
{
    t->prev = p->aw_tail;
    t->next = NULL;
    if (p->aw_tail != NULL)
        p->aw_tail->next = t;
    else
        p->aw_head = t;
    p->aw_tail = t;
    if (t->net)
        p->net_waiters++;
    else
        p->pools[t->pi].waiters++;
    t->waiting = true;
    dsec__fn_pool_wake(p); /* refill spawns for it, or leaves it a slot */
}

static void waiter_unlink(struct fn_pools *p, struct fn_take_waiter *t)
{
    if (t->prev != NULL)
        t->prev->next = t->next;
    else
        p->aw_head = t->next;
    if (t->next != NULL)
        t->next->prev = t->prev;
    else
        p->aw_tail = t->prev;
    t->next = t->prev = NULL;
    if (t->net)
        p->net_waiters--;
    else
        p->pools[t->pi].waiters--;
    t->waiting = false;
}

int dsec__fn_worker_try_take(struct fn_pools *p, int pi, struct fn_take_waiter *t, bool expired,
                             uint64_t wait_ms, struct fn_worker **out, dsec_err *err)
{
    struct fn_pool *pool = &p->pools[pi];
    for (;;) {
        pthread_mutex_lock(&p->mu);
        if (!pool->wanted && pi < FN_RT_COUNT) { /* an environment's is wanted while it lives */
            pool->wanted = true;
            dsec__fn_pool_wake(p);
        }
        struct fn_worker *w = NULL;
        int rc = 0;
        if (p->stop) {
            rc = dsec_err_set(err, DSEC_E_CLOSED, 0, "function: the backend is shutting down");
        } else if ((w = dsec__fn_pool_pop(&pool->hot_head, &pool->hot_tail)) != NULL) {
            pool->nhot--;
        } else if ((w = dsec__fn_pool_pop(&pool->warm_head, &pool->warm_tail)) != NULL) {
            pool->nwarm--;
        } else if (pool->nspawning == 0 && pool->npromoting == 0 &&
                   (pool->state == P_FAILED ||
                    (pool->state == P_UP && pool->consec_fail >= SPAWN_FAIL_LIMIT))) {
            rc = dsec_err_set(err, DSEC_E_BACKEND, 0, "function: no %s worker can start: %s",
                              pool->name, pool->error);
        } else if (expired) {
            rc = dsec_err_set(err, DSEC_E_CAPACITY, 0,
                              "function: no %s worker became free within %" PRIu64
                              " ms (%u busy, %u starting, %u slots free of max_workers %u)",
                              pool->name, wait_ms, pool->nbusy, pool->nspawning, p->nfree,
                              p->max_workers);
        } else {
            rc = 1;
            if (t->efd < 0)
                t->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); /* -1: the caller polls */
            t->notified = false;
            if (!t->waiting) { /* counted until taken or given up: refill spawns for it */
                t->pi = pi;
                t->net = false;
                waiter_link(p, t);
            }
        }
        if (rc != 1 && t->waiting)
            waiter_unlink(p, t);
        if (w != NULL) {
            pool->nbusy++;
            pool->calls++;
        }
        pthread_mutex_unlock(&p->mu);
        if (rc != 0)
            return rc;
        dsec__fn_pool_wake(p); /* refill behind us */
        if (!worker_dead(w)) {
            *out = w;
            return 0;
        }
        dsec__fn_worker_done(p, w); /* died while warm (killed from outside): next one */
    }
}

void dsec__fn_worker_unwait(struct fn_pools *p, struct fn_take_waiter *t)
{
    if (!t->waiting)
        return;
    pthread_mutex_lock(&p->mu);
    if (t->waiting)
        waiter_unlink(p, t);
    pthread_mutex_unlock(&p->mu);
}

/* Every slot is taken and a networked call waits for one: let one warm
 * worker of a pool nobody waits on go (warm before hot), so its slot comes
 * back once its supervisor is gone. Lock held. */
static bool steal_any(struct fn_pools *p)
{
    for (int hot = 0; hot < 2; hot++)
        for (unsigned i = 0; i < p->npools; i++) {
            struct fn_pool *q = &p->pools[i];
            struct fn_worker *w = NULL;
            if (q->waiters > 0)
                continue;
            if (!hot && (w = dsec__fn_pool_pop(&q->warm_head, &q->warm_tail)) != NULL)
                q->nwarm--;
            else if (hot && (w = dsec__fn_pool_pop(&q->hot_head, &q->hot_tail)) != NULL)
                q->nhot--;
            if (w != NULL) {
                dsec__fn_pool_worker_drain(p, w);
                return true;
            }
        }
    return false;
}

/* Read the READY of a worker made for one call (its task socket is readable), or the reason
 * it will not come. No lock held. Returns true when the worker's socket closed without a word
 * (its zygote died under it). */
static bool own_ready(struct fn_worker *w, const char *name, char *why, size_t whylen)
{
    union {
        struct fnp_hdr h;
        struct fnp_ready ready;
        struct fnp_failure fail;
    } m;
    int fd, nfds;
    ssize_t n = fnp_recv_fds(w->task_fd, &m, sizeof m, MSG_DONTWAIT, &fd, 1, &nfds);
    if (n < 0 && errno == EAGAIN)
        return false; /* not yet: why stays "" */
    if (n > 0 && (size_t)n == sizeof m.ready && m.h.magic == FNP_MAGIC && m.h.type == FNP_READY &&
        m.h.len == (uint32_t)n && fd >= 0) {
        w->pidfd = fd;
        w->spawned = w->ready = true;
        return false;
    }
    dsec__fn_pool_close_fd(&fd);
    if (n > 0 && (size_t)n == sizeof m.fail && m.h.magic == FNP_MAGIC &&
        m.h.type == FNP_WORKER_FAILED) {
        m.fail.msg[sizeof m.fail.msg - 1] = '\0';
        m.fail.stage[sizeof m.fail.stage - 1] = '\0';
        snprintf(why, whylen, "%s worker set-up failed (%s): %s", name, m.fail.stage, m.fail.msg);
        return false;
    }
    snprintf(why, whylen, "the %s worker ended before it was ready", name);
    return n == 0;
}

/* A worker made for one call will not serve it: its slot comes back. No lock held. */
static int own_failed(struct fn_pools *p, struct fn_worker *w, char *why, size_t whylen, bool *lost,
                      dsec_err *err)
{
    struct fn_pool *pool = &p->pools[w->pool];
    dsec__fn_pool_worker_close(
        w); /* a worker still on its way sees its task socket close and exits */
    pthread_mutex_lock(&p->mu);
    if (w->why[0] != '\0') { /* the zygote said why */
        snprintf(why, whylen, "%s", w->why);
        *lost = false;
    }
    pool->nbusy--;
    pool->spawn_failures++;
    dsec__fn_pool_slot_free(p, w->slot);
    dsec__fn_pool_broadcast(p);
    pthread_mutex_unlock(&p->mu);
    dsec_free(w);
    dsec__fn_pool_wake(p);
    return dsec_err_set(err, DSEC_E_BACKEND, 0,
                        "function: a %s worker in the sandbox's network: %s", pool->name, why);
}

int dsec__fn_worker_net_start(struct fn_pools *p, int pi, int netns_fd, const char *resolver,
                              struct fn_take_waiter *t, bool expired, uint64_t wait_ms,
                              struct fn_worker **out, int *zctl_used, bool *lost, dsec_err *err)
{
    struct fn_pool *pool = &p->pools[pi];
    *lost = false;
    pthread_mutex_lock(&p->mu);
    if (!pool->wanted && pi < FN_RT_COUNT) {
        pool->wanted = true;
        dsec__fn_pool_wake(p);
    }
    int rc = 0;
    if (p->stop) {
        rc = dsec_err_set(err, DSEC_E_CLOSED, 0, "function: the backend is shutting down");
    } else if (pool->state == P_FAILED) {
        rc = dsec_err_set(err, DSEC_E_BACKEND, 0, "function: no %s worker can start: %s",
                          pool->name, pool->error);
    } else if (pool->state != P_UP || p->nfree == 0) {
        if (expired) {
            rc = dsec_err_set(err, DSEC_E_CAPACITY, 0,
                              "function: no slot for a %s worker within %" PRIu64
                              " ms (max_workers %u, all in use)",
                              pool->name, wait_ms, p->max_workers);
        } else {
            rc = 1;
            if (t->efd < 0)
                t->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); /* -1: the caller polls */
            t->notified = false;
            if (!t->waiting) {
                t->pi = pi;
                t->net = true;
                waiter_link(p, t);
            }
            if (pool->state == P_UP && !t->stole)
                t->stole = steal_any(p);
        }
    }
    if (rc != 1 && t->waiting)
        waiter_unlink(p, t);
    struct fn_worker *w = rc == 0 ? dsec_calloc(1, sizeof *w) : NULL;
    if (rc == 0 && w == NULL)
        rc = dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: allocating a worker");
    if (rc != 0) {
        pthread_mutex_unlock(&p->mu);
        return rc;
    }
    w->own = true;
    w->rt = pool->rt;
    w->pool = pool->idx;
    w->slot = p->free_slots[--p->nfree];
    w->task_fd = w->stdin_fd = w->stdout_fd = w->stderr_fd = w->pidfd = -1;
    p->slot_worker[w->slot] = w;
    pool->nbusy++;
    pool->calls++;
    int zctl = *zctl_used = pool->zctl;
    pthread_mutex_unlock(&p->mu);

    char why[DSEC_ERR_MSG_MAX] = "";
    if (dsec__fn_pool_worker_spawn(p, zctl, w, netns_fd, resolver, why, sizeof why) < 0) {
        *lost = true; /* the zygote's socket refused it */
        return own_failed(p, w, why, sizeof why, lost, err);
    }
    *out = w;
    return 0;
}

int dsec__fn_worker_net_ready(struct fn_pools *p, struct fn_worker *w, bool timed_out, bool *lost,
                              dsec_err *err)
{
    const char *name = p->pools[w->pool].name;
    char why[DSEC_ERR_MSG_MAX] = "";
    *lost = false;
    if (timed_out)
        snprintf(why, sizeof why, "the %s worker was not ready in time", name);
    else
        *lost = own_ready(w, name, why, sizeof why);
    if (why[0] == '\0')
        return w->ready ? 0 : 1;
    return own_failed(p, w, why, sizeof why, lost, err);
}

bool dsec__fn_pool_zygote_changed(struct fn_pools *p, int pi, int zctl)
{
    pthread_mutex_lock(&p->mu);
    const struct fn_pool *pool = &p->pools[pi];
    bool changed = pool->zctl != zctl || pool->state != P_UP || p->stop;
    pthread_mutex_unlock(&p->mu);
    return changed;
}

void dsec__fn_worker_done(struct fn_pools *p, struct fn_worker *w)
{
    dsec__fn_pool_worker_close(w);
    pthread_mutex_lock(&p->mu);
    struct fn_pool *pool = &p->pools[w->pool];
    pool->nbusy--;
    pool->ndraining++;
    w->next = p->to_drain;
    p->to_drain = w;
    pthread_mutex_unlock(&p->mu);
    dsec__fn_pool_wake(p);
}

struct fn_cg_slot *dsec__fn_worker_cg(struct fn_pools *p, const struct fn_worker *w, int *mode)
{
    *mode = p->cg.mode;
    return p->cg.mode == FN_CG_NONE ? NULL : &p->cgslots[w->slot];
}
