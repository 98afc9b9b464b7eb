/* function-pool.c - zygotes per runtime (and per runtime and environment) and their warm workers:
 * start on demand, refill in the background, rebuild a dead zygote, reclaim slots, take an idle
 * environment's pool down. */
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

/*
 * One thread per backend instance (the pool thread) owns the zygotes and
 * every worker that is not taken by a call: it spawns zygotes (so their
 * PR_SET_PDEATHSIG is tied to a thread that lives as long as the backend),
 * sends SPAWN, watches the task sockets of workers being made until they
 * are READY (which hands over the supervisor's pidfd), then queues them as
 * warm, and sends PREP to a few to make them hot. A call takes a worker
 * (hot first) under the lock and hands it back when it is over; the pool
 * thread then waits for its supervisor's pidfd to say the call's whole pid
 * namespace is gone before the slot (cgroup + uid) is reused.
 *
 * Slots: max_workers of them, shared by all pools. A worker holds one
 * from SPAWN until drained; its uid is uid_base + slot, its cgroup the
 * slot's. Refill: a pool keeps `warm` workers ready, plus one for each call
 * waiting, as slots allow; spawning stops for a while after three failures
 * in a row (the error is kept and given to callers).
 *
 * A zygote that dies is seen through its pidfd (or its socket closing),
 * reaped, and started again: at once after a healthy life, with a growing
 * delay (up to 5 s) when it keeps dying young. Its warm workers stay in the
 * pool: each is an independent process forked from a sound image.
 */

static const char *const state_names[] = {"off", "starting", "up", "down", "failed"};

static const char *const rt_names[FN_RT_COUNT] = {"python3", "sh", "native"};

const char *dsec__fn_runtime_name(int rt)
{
    return rt >= 0 && rt < FN_RT_COUNT ? rt_names[rt] : "?";
}

int dsec__fn_runtime_find(const char *name)
{
    for (int i = 0; name != NULL && i < FN_RT_COUNT; i++)
        if (strcmp(name, rt_names[i]) == 0)
            return i;
    return -1;
}

void dsec__fn_pool_wake(struct fn_pools *p)
{
    uint64_t one = 1;
    ssize_t n = write(p->evfd, &one, sizeof one);
    (void)n; /* a full counter already means "wake up" */
}

static void efd_kick(int fd)
{
    uint64_t one = 1;
    ssize_t n = write(fd, &one, sizeof one);
    (void)n; /* a full counter already means "look again" */
}

/* A worker of pool pi was made ready: the oldest call of that pool waiting on a loop that has
 * not been told yet looks again. Lock held. */
static void notify_one(struct fn_pools *p, int pi)
{
    for (struct fn_take_waiter *t = p->aw_head; t != NULL; t = t->next)
        if (!t->net && t->pi == pi && !t->notified) {
            t->notified = true;
            efd_kick(t->efd);
            return;
        }
}

/* A slot came back: the oldest networked call waiting on a loop that has not been told yet
 * looks again. Lock held. */
static void notify_slot(struct fn_pools *p)
{
    for (struct fn_take_waiter *t = p->aw_head; t != NULL; t = t->next)
        if (t->net && !t->notified) {
            t->notified = true;
            efd_kick(t->efd);
            return;
        }
}

/* Something else changed (a pool failed, stopped, a zygote came or went): every call
 * waiting on a loop looks again. Lock held. */
void dsec__fn_pool_broadcast(struct fn_pools *p)
{
    pthread_cond_broadcast(&p->cv);
    for (struct fn_take_waiter *t = p->aw_head; t != NULL; t = t->next)
        efd_kick(t->efd);
}

void dsec__fn_pool_set_error(struct fn_pool *pool, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pool->error, sizeof pool->error, fmt, ap);
    va_end(ap);
}

void dsec__fn_pool_describe_status(int st, char *buf, size_t len)
{
    if (WIFEXITED(st))
        snprintf(buf, len, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, len, "ended (status %#x)", st);
}

void dsec__fn_pool_close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* ---- slots and workers (pool thread, lock held) ------------------------------------------ */

static void push(struct fn_worker **head, struct fn_worker **tail, struct fn_worker *w)
{
    w->next = NULL;
    if (*tail)
        (*tail)->next = w;
    else
        *head = w;
    *tail = w;
}

struct fn_worker *dsec__fn_pool_pop(struct fn_worker **head, struct fn_worker **tail)
{
    struct fn_worker *w = *head;
    if (w != NULL) {
        *head = w->next;
        if (*head == NULL)
            *tail = NULL;
        w->next = NULL;
    }
    return w;
}

void dsec__fn_pool_slot_free(struct fn_pools *p, unsigned slot)
{
    p->slot_worker[slot] = NULL;
    p->free_slots[p->nfree++] = slot;
}

void dsec__fn_pool_worker_close(struct fn_worker *w)
{
    dsec__fn_pool_close_fd(&w->task_fd);
    dsec__fn_pool_close_fd(&w->stdin_fd);
    dsec__fn_pool_close_fd(&w->stdout_fd);
    dsec__fn_pool_close_fd(&w->stderr_fd);
}

/* Let a worker go: its slot comes back once its supervisor is gone. */
void dsec__fn_pool_worker_drain(struct fn_pools *p, struct fn_worker *w)
{
    struct fn_pool *pool = &p->pools[w->pool];
    dsec__fn_pool_worker_close(w);
    if (w->pidfd >= 0) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV(EV_WPID, w->slot)};
        if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, w->pidfd, &ev) == 0) {
            pool->ndraining++;
            return;
        }
        /* cannot watch it: wait for it here, briefly, rather than reuse a busy slot */
        struct pollfd pf = {.fd = w->pidfd, .events = POLLIN};
        poll(&pf, 1, 2000);
        dsec__fn_pool_close_fd(&w->pidfd);
    }
    dsec__fn_pool_slot_free(p, w->slot);
    dsec_free(w);
}

/* A worker that will not become warm. */
void dsec__fn_pool_worker_failed(struct fn_pools *p, struct fn_worker *w, const char *why)
{
    struct fn_pool *pool = &p->pools[w->pool];
    if (w->task_fd >= 0)
        epoll_ctl(p->epfd, EPOLL_CTL_DEL, w->task_fd, NULL);
    if (w->promoting) {
        pool->npromoting--;
        w->promoting = false;
    } else {
        pool->nspawning--;
    }
    pool->spawn_failures++;
    if (why != NULL)
        dsec__fn_pool_set_error(pool, "%s", why);
    /* Workers lost with their zygote say nothing about the next ones. */
    if (pool->state == P_UP && ++pool->consec_fail >= SPAWN_FAIL_LIMIT) {
        pool->retry_spawn_at_ns = dsec_now_ns() + 1000000000ull;
        dsec__fn_pool_broadcast(p);
    }
    dsec__fn_pool_worker_drain(p, w);
}

static int send_spawn(int zctl, const struct fnp_spawn *sp, const int *fds, int nfds)
{
    struct iovec iov = {.iov_base = (void *)sp, .iov_len = sizeof *sp};
    return fnp_send_fds(zctl, &iov, 1, fds, nfds) == (ssize_t)sizeof *sp ? 0 : -1;
}

/* Send SPAWN for w (its runtime, pool and slot set) and keep the backend's
 * ends of its channels in w. No lock held. netns_fd >= 0: a worker for one
 * call of a sandbox with a network (FNP_SPAWN_NET). */
int dsec__fn_pool_worker_spawn(struct fn_pools *p, int zctl, struct fn_worker *w, int netns_fd,
                               const char *resolver, char *why, size_t whylen)
{
    dsec_err err;
    int sv[2] = {-1, -1}, in[2] = {-1, -1}, out[2] = {-1, -1}, er[2] = {-1, -1};
    int cg[3], ncg = 0, rc = -1;
    if (dsec__fn_cg_slot_make(&p->cg, w->slot, &p->cgslots[w->slot], &err) < 0) {
        snprintf(why, whylen, "%s", err.msg);
        return -1;
    }
    dsec__fn_cg_slot_procs(&p->cgslots[w->slot], cg, &ncg);
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0 || pipe2(in, O_CLOEXEC) < 0 ||
        pipe2(out, O_CLOEXEC) < 0 || pipe2(er, O_CLOEXEC) < 0) {
        snprintf(why, whylen, "making a worker's channels: %s", strerror(errno));
        goto out;
    }
    struct fnp_spawn sp;
    memset(&sp, 0, sizeof sp);
    sp.h.magic = FNP_MAGIC;
    sp.h.type = FNP_SPAWN;
    sp.h.len = sizeof sp;
    sp.h.seq = w->slot;
    sp.uid = p->uid_base + w->slot;
    sp.tmp_mb = p->tmpfs_mb;
    int fds[FNP_SPAWN_FDS_MAX] = {sv[1], in[0], out[1], er[1]};
    int nfds = 4;
    for (int i = 0; i < ncg; i++) {
        fds[nfds++] = cg[i];
        sp.cg_mask |= 1u << i;
    }
    if (netns_fd >= 0) {
        if (resolver == NULL || strlen(resolver) >= sizeof sp.resolver) {
            snprintf(why, whylen, "the sandbox's resolver address is missing or too long");
            goto out;
        }
        fds[nfds++] = netns_fd;
        sp.cg_mask |= FNP_SPAWN_NET;
        memcpy(sp.resolver, resolver, strlen(resolver) + 1);
    }
    if (send_spawn(zctl, &sp, fds, nfds) < 0) {
        snprintf(why, whylen, "sending SPAWN to the zygote: %s", strerror(errno));
        goto out;
    }
    w->task_fd = sv[0];
    w->stdin_fd = in[1];
    w->stdout_fd = out[0];
    w->stderr_fd = er[0];
    sv[0] = in[1] = out[0] = er[0] = -1;
    fcntl(w->stdin_fd, F_SETFL, O_NONBLOCK);
    fcntl(w->stdout_fd, F_SETFL, O_NONBLOCK);
    fcntl(w->stderr_fd, F_SETFL, O_NONBLOCK);
    rc = 0;
out:
    for (int i = 0; i < 2; i++) {
        dsec__fn_pool_close_fd(&sv[i]);
        dsec__fn_pool_close_fd(&in[i]);
        dsec__fn_pool_close_fd(&out[i]);
        dsec__fn_pool_close_fd(&er[i]);
    }
    return rc;
}

/* Make one worker. Called with the lock held; drops it around the syscalls. */
static void spawn_one(struct fn_pools *p, struct fn_pool *pool)
{
    unsigned slot = p->free_slots[--p->nfree];
    pool->nspawning++;
    int zctl = pool->zctl;
    pthread_mutex_unlock(&p->mu);

    char why[DSEC_ERR_MSG_MAX] = "";
    struct fn_worker *w = dsec_calloc(1, sizeof *w);
    if (w == NULL) {
        snprintf(why, sizeof why, "out of memory");
    } else {
        w->rt = pool->rt;
        w->pool = pool->idx;
        w->slot = slot;
        w->task_fd = w->stdin_fd = w->stdout_fd = w->stderr_fd = w->pidfd = -1;
        dsec__fn_pool_worker_spawn(p, zctl, w, -1, NULL, why, sizeof why);
    }

    pthread_mutex_lock(&p->mu);
    if (why[0] == '\0') {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV(EV_WTASK, slot)};
        if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, w->task_fd, &ev) < 0)
            snprintf(why, sizeof why, "epoll: %s", strerror(errno));
    }
    if (why[0] != '\0') {
        pool->nspawning--;
        pool->spawn_failures++;
        dsec__fn_pool_set_error(pool, "%s", why);
        if (++pool->consec_fail >= SPAWN_FAIL_LIMIT) {
            pool->retry_spawn_at_ns = dsec_now_ns() + 1000000000ull;
            dsec__fn_pool_broadcast(p);
        }
        if (w != NULL)
            dsec__fn_pool_worker_close(w);
        dsec_free(w);
        dsec__fn_pool_slot_free(p, slot);
        return;
    }
    p->slot_worker[slot] = w;
}

/* A call is waiting here and every slot is taken: let one warm worker of a
 * pool nobody waits on go, so its slot comes back (once its supervisor is
 * gone) for this pool. At most one slot on its way back per waiter. */
static void steal_slot(struct fn_pools *p, struct fn_pool *pool)
{
    unsigned draining = 0;
    for (unsigned i = 0; i < p->npools; i++)
        draining += p->pools[i].ndraining;
    if (p->nfree > 0 || pool->waiters <= pool->nspawning + draining)
        return;
    for (unsigned i = 0; i < p->npools; i++) {
        struct fn_pool *q = &p->pools[i];
        if (q == pool || q->waiters > 0)
            continue;
        struct fn_worker *w = dsec__fn_pool_pop(&q->warm_head, &q->warm_tail);
        if (w != NULL) {
            q->nwarm--;
        } else if ((w = dsec__fn_pool_pop(&q->hot_head, &q->hot_tail)) != NULL) {
            q->nhot--;
        } else {
            continue;
        }
        dsec__fn_pool_worker_drain(p, w);
        return;
    }
}

void dsec__fn_pool_refill(struct fn_pools *p, struct fn_pool *pool, uint64_t now, unsigned waiting)
{
    if (pool->state != P_UP || now < pool->retry_spawn_at_ns)
        return;
    if (pool->waiters > 0)
        steal_slot(p, pool);
    /* Slots that calls of other pools (or networked calls) wait for are theirs. */
    unsigned others = waiting - pool->waiters + p->net_waiters;
    unsigned want = pool->target + pool->waiters;
    while (pool->state == P_UP &&
           pool->nwarm + pool->nhot + pool->npromoting + pool->nspawning < want &&
           p->nfree > (pool->waiters > 0 ? 0 : others) && pool->nspawning < SPAWN_INFLIGHT_MAX &&
           !p->stop && now >= pool->retry_spawn_at_ns)
        spawn_one(p, pool);
}

/* Keep hot_target workers warmed to hot_level: PREP the oldest warm ones. */
static void promote(struct fn_pools *p, struct fn_pool *pool)
{
    while (pool->nhot + pool->npromoting < pool->hot_target && pool->warm_head != NULL) {
        struct fn_worker *w = dsec__fn_pool_pop(&pool->warm_head, &pool->warm_tail);
        pool->nwarm--;
        struct fnp_prep pr = {.h = {.magic = FNP_MAGIC, .type = FNP_PREP, .len = sizeof pr},
                              .level = p->hot_level};
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV(EV_WTASK, w->slot)};
        w->promoting = true;
        pool->npromoting++;
        if (send(w->task_fd, &pr, sizeof pr, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof pr ||
            epoll_ctl(p->epfd, EPOLL_CTL_ADD, w->task_fd, &ev) < 0) {
            dsec__fn_pool_worker_failed(p, w, "a worker did not take its PREP");
            continue;
        }
    }
}

/* ---- workers being made (pool thread, lock held) ------------------------------------------- */

static void on_wtask(struct fn_pools *p, unsigned slot)
{
    struct fn_worker *w = slot < p->max_workers ? p->slot_worker[slot] : NULL;
    if (w == NULL)
        return;
    struct fn_pool *pool = &p->pools[w->pool];
    union {
        struct fnp_hdr h;
        struct fnp_ready ready;
        struct fnp_failure fail;
        struct fnp_result result;
    } m;
    int fd, nfds;
    ssize_t n = fnp_recv_fds(w->task_fd, &m, sizeof m, MSG_DONTWAIT, &fd, 1, &nfds);
    if (n < 0 && errno == EAGAIN)
        return;
    char why[DSEC_ERR_MSG_MAX];
    if (n <= 0 || (size_t)n < sizeof m.h || m.h.magic != FNP_MAGIC || m.h.len != (uint32_t)n) {
        dsec__fn_pool_close_fd(&fd);
        snprintf(why, sizeof why, "a %s worker ended before it was ready", p->pools[w->pool].name);
        dsec__fn_pool_worker_failed(p, w, why);
        return;
    }
    switch (m.h.type) {
    case FNP_READY:
        if (w->promoting) {
            dsec__fn_pool_close_fd(&fd);
            epoll_ctl(p->epfd, EPOLL_CTL_DEL, w->task_fd, NULL);
            w->promoting = false;
            w->level = m.ready.level;
            pool->npromoting--;
            push(&pool->hot_head, &pool->hot_tail, w);
            pool->nhot++;
            pthread_cond_broadcast(&p->cv);
            notify_one(p, pool->idx);
            return;
        }
        if (fd < 0 || w->ready || (size_t)n != sizeof m.ready) {
            dsec__fn_pool_close_fd(&fd);
            dsec__fn_pool_worker_failed(p, w, "a worker's READY message is malformed");
            return;
        }
        w->pidfd = fd;
        w->spawned = w->ready = true;
        break;
    case FNP_WORKER_FAILED:
        dsec__fn_pool_close_fd(&fd);
        m.fail.msg[sizeof m.fail.msg - 1] = '\0';
        m.fail.stage[sizeof m.fail.stage - 1] = '\0';
        snprintf(why, sizeof why, "%s worker set-up failed (%s): %s", pool->name, m.fail.stage,
                 m.fail.msg);
        dsec__fn_pool_worker_failed(p, w, why);
        return;
    default:
        dsec__fn_pool_close_fd(&fd);
        snprintf(why, sizeof why, "a %s worker ended before it was ready", p->pools[w->pool].name);
        dsec__fn_pool_worker_failed(p, w, why);
        return;
    }
    if (w->spawned && w->ready) {
        epoll_ctl(p->epfd, EPOLL_CTL_DEL, w->task_fd, NULL);
        pool->nspawning--;
        pool->spawned++;
        pool->consec_fail = 0;
        push(&pool->warm_head, &pool->warm_tail, w);
        pool->nwarm++;
        pthread_cond_broadcast(&p->cv);
        notify_one(p, pool->idx);
    }
}

static void on_wpid(struct fn_pools *p, unsigned slot)
{
    struct fn_worker *w = slot < p->max_workers ? p->slot_worker[slot] : NULL;
    if (w == NULL)
        return;
    epoll_ctl(p->epfd, EPOLL_CTL_DEL, w->pidfd, NULL);
    dsec__fn_pool_close_fd(&w->pidfd);
    p->pools[w->pool].ndraining--;
    dsec__fn_pool_slot_free(p, slot);
    dsec_free(w);
    pthread_cond_broadcast(&p->cv);
    notify_slot(p); /* the other loop waiters hear of the worker refill makes here */
}

/* ---- the thread ----------------------------------------------------------------------------- */

static void take_drained(struct fn_pools *p)
{
    while (p->to_drain != NULL) {
        struct fn_worker *w = p->to_drain;
        p->to_drain = w->next;
        w->next = NULL;
        p->pools[w->pool].ndraining--; /* worker_drain counts it again if it must wait */
        dsec__fn_pool_worker_drain(p, w);
    }
}

static void shutdown_all(struct fn_pools *p)
{
    take_drained(p);
    /* Workers first, zygotes last: a zygote reaps its workers' supervisors as
     * they go, so their slots' cgroups empty before we remove them. */
    for (unsigned i = 0; i < p->npools; i++) {
        struct fn_pool *pool = &p->pools[i];
        struct fn_worker *w;
        while ((w = dsec__fn_pool_pop(&pool->warm_head, &pool->warm_tail)) != NULL) {
            pool->nwarm--;
            dsec__fn_pool_worker_drain(p, w); /* its W3 reads EOF and exits, its W2 follows */
        }
        while ((w = dsec__fn_pool_pop(&pool->hot_head, &pool->hot_tail)) != NULL) {
            pool->nhot--;
            dsec__fn_pool_worker_drain(p, w);
        }
    }
    for (unsigned s = 0; s < p->max_workers; s++) {
        struct fn_worker *w = p->slot_worker[s];
        if (w != NULL && !w->own && (!(w->spawned && w->ready) || w->promoting) &&
            w->task_fd >= 0) {
            epoll_ctl(p->epfd, EPOLL_CTL_DEL, w->task_fd, NULL);
            if (w->promoting)
                p->pools[w->pool].npromoting--;
            else
                p->pools[w->pool].nspawning--;
            dsec__fn_pool_worker_drain(p, w);
        }
    }
    /* Wait (bounded) for every supervisor, so the slots' cgroups are empty. */
    uint64_t deadline = dsec_now_ns() + 3000000000ull;
    for (;;) {
        unsigned left = 0;
        for (unsigned i = 0; i < p->npools; i++)
            left += p->pools[i].ndraining;
        uint64_t now = dsec_now_ns();
        if (left == 0 || now >= deadline)
            break;
        struct epoll_event evs[32];
        pthread_mutex_unlock(&p->mu);
        int n = epoll_wait(p->epfd, evs, 32, (int)((deadline - now) / 1000000ull) + 1);
        pthread_mutex_lock(&p->mu);
        for (int i = 0; i < n; i++)
            if ((evs[i].data.u64 >> 32) == EV_WPID)
                on_wpid(p, (unsigned)(evs[i].data.u64 & 0xffffffffu));
    }
    for (unsigned i = 0; i < p->npools; i++)
        if (p->pools[i].zpid > 0) {
            kill(p->pools[i].zpid, SIGKILL);
            dsec__fn_pool_zygote_gone(p, &p->pools[i]);
        }
}

static void *pool_thread(void *arg)
{
    struct fn_pools *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        take_drained(p);
        uint64_t now = dsec_now_ns();
        uint64_t next = UINT64_MAX;
        unsigned waiting = 0;
        for (unsigned i = 0; i < p->npools; i++)
            waiting += p->pools[i].waiters;
        for (unsigned i = 0; i < p->npools; i++) {
            struct fn_pool *pool = &p->pools[i];
            dsec__fn_pool_env_tend(p, pool, now, &next);
            if (!pool->wanted || (pool->idx >= FN_RT_COUNT && pool->lower == NULL))
                continue;
            if ((pool->state == P_OFF || pool->state == P_DOWN ||
                 (pool->state == P_FAILED && pool->zpid <= 0)) &&
                now >= pool->restart_at_ns)
                dsec__fn_pool_zygote_start(p, pool);
            else if (pool->state != P_UP && pool->state != P_STARTING && pool->restart_at_ns < next)
                next = pool->restart_at_ns;
            dsec__fn_pool_refill(p, pool, dsec_now_ns(), waiting);
            if (pool->state == P_UP)
                promote(p, pool);
            if (pool->state == P_UP && pool->retry_spawn_at_ns > now &&
                pool->retry_spawn_at_ns < next)
                next = pool->retry_spawn_at_ns;
        }
        now = dsec_now_ns();
        int timeout = next == UINT64_MAX ? -1
                      : next <= now      ? 0
                                         : (int)((next - now) / 1000000ull) + 1;
        pthread_mutex_unlock(&p->mu);
        struct epoll_event evs[64];
        int n = epoll_wait(p->epfd, evs, 64, timeout);
        pthread_mutex_lock(&p->mu);
        for (int i = 0; i < n && !p->stop; i++) {
            uint32_t kind = (uint32_t)(evs[i].data.u64 >> 32), id = (uint32_t)evs[i].data.u64;
            switch (kind) {
            case EV_WAKE: {
                uint64_t v;
                ssize_t r = read(p->evfd, &v, sizeof v);
                (void)r;
                break;
            }
            case EV_ZCTL:
                if (id < p->npools && p->pools[id].zctl >= 0)
                    dsec__fn_pool_on_zctl(p, &p->pools[id]);
                break;
            case EV_ZPID:
                if (id < p->npools && p->pools[id].zpid > 0)
                    dsec__fn_pool_zygote_gone(p, &p->pools[id]);
                break;
            case EV_WTASK:
                on_wtask(p, id);
                break;
            case EV_WPID:
                on_wpid(p, id);
                break;
            }
        }
    }
    shutdown_all(p);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---- the interface -----------------------------------------------------------------------------
 */

int dsec__fn_pools_new(struct fn_pools **out, const struct fn_pool_conf *c, dsec_err *err)
{
    struct fn_pools *p = dsec_calloc(1, sizeof *p);
    if (p == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: allocating the pools");
    p->epfd = p->evfd = -1;
    p->max_workers = c->max_workers;
    p->tmpfs_mb = c->tmpfs_mb;
    p->hot_level = c->hot_level;
    p->uid_base = c->uid_base;
    p->zygote_path = dsec_strdup(c->zygote_path);
    p->python = dsec_strdup(c->python);
    p->pymod_dir = dsec_strdup(c->pymod_dir);
    p->root_dir = dsec_strdup(c->root_dir);
    p->preload = dsec_strdup(c->preload ? c->preload : "");
    p->ro_paths = dsec_strdup(c->ro_paths ? c->ro_paths : "");
    p->npools = FN_RT_COUNT + c->env_pools;
    p->pools = dsec_calloc(p->npools, sizeof *p->pools);
    p->cache = c->cache;
    p->env_idle_ns = c->env_idle_ms * 1000000ull;
    p->cgslots = dsec_calloc(c->max_workers, sizeof *p->cgslots);
    p->slot_worker = dsec_calloc(c->max_workers, sizeof *p->slot_worker);
    p->free_slots = dsec_calloc(c->max_workers, sizeof *p->free_slots);
    if (p->zygote_path == NULL || p->python == NULL || p->pymod_dir == NULL ||
        p->root_dir == NULL || p->preload == NULL || p->ro_paths == NULL || p->pools == NULL ||
        p->cgslots == NULL || p->slot_worker == NULL || p->free_slots == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: allocating the pools");
        goto out_free;
    }
    for (unsigned i = 0; i < c->max_workers; i++)
        p->free_slots[p->nfree++] = c->max_workers - 1 - i; /* slot 0 first */
    for (unsigned i = 0; i < p->npools; i++) {
        p->pools[i].idx = (int)i;
        p->pools[i].zctl = p->pools[i].zpidfd = -1;
    }
    for (int rt = 0; rt < FN_RT_COUNT; rt++) {
        struct fn_pool *pool = &p->pools[rt];
        pool->rt = rt;
        pool->used = true;
        pool->target = c->warm[rt];
        pool->hot_target = c->hot[rt] < c->warm[rt] ? c->hot[rt] : c->warm[rt];
        snprintf(pool->name, sizeof pool->name, "%s", rt_names[rt]);
        p->env_warm[rt] = c->env_warm[rt];
        p->env_hot[rt] = c->env_hot[rt] < c->env_warm[rt] ? c->env_hot[rt] : c->env_warm[rt];
    }
    char inst[160];
    static unsigned seq;
    snprintf(inst, sizeof inst, "%s-%d-%u", c->node ? c->node : "node", (int)getpid(),
             __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED));
    if (dsec__fn_cg_open(&p->cg, c->cgroup, inst, err) < 0)
        goto out_free;
    /* Every worker holds five fds here and every slot three: make room. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max &&
        rl.rlim_cur < 256 + 8ull * c->max_workers) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&p->mu, NULL);
    p->epfd = epoll_create1(EPOLL_CLOEXEC);
    p->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV(EV_WAKE, 0)};
    if (p->epfd < 0 || p->evfd < 0 || epoll_ctl(p->epfd, EPOLL_CTL_ADD, p->evfd, &ev) < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "function: epoll for the pool thread");
        goto out_cg;
    }
    int rc = pthread_create(&p->thread, NULL, pool_thread, p);
    if (rc != 0) {
        dsec_err_set(err, DSEC_E_IO, rc, "function: starting the pool thread");
        goto out_cg;
    }
    p->thread_started = true;
    *out = p;
    return 0;

out_cg:
    dsec__fn_cg_close(&p->cg);
out_free:
    dsec__fn_pools_free(p);
    return -1;
}

void dsec__fn_pools_free(struct fn_pools *p)
{
    if (p == NULL)
        return;
    if (p->thread_started) {
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        dsec__fn_pool_broadcast(p);
        pthread_mutex_unlock(&p->mu);
        dsec__fn_pool_wake(p);
        pthread_join(p->thread, NULL);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->cv);
    }
    for (unsigned i = FN_RT_COUNT; p->pools != NULL && i < p->npools; i++) {
        struct fn_pool *pool = &p->pools[i];
        for (size_t k = 0; k < pool->ndigests; k++) {
            dsec_layer_cache_release(p->cache, pool->digests[k]);
            dsec_free(pool->digests[k]);
        }
        dsec_free(pool->digests);
        dsec_free(pool->key);
        dsec_free(pool->lower);
    }
    dsec_free(p->pools);
    for (unsigned s = 0; p->cgslots != NULL && s < p->max_workers; s++)
        dsec__fn_cg_slot_free(&p->cg, s, &p->cgslots[s]);
    dsec__fn_cg_close(&p->cg);
    if (p->epfd >= 0)
        close(p->epfd);
    if (p->evfd >= 0)
        close(p->evfd);
    dsec_free(p->cgslots);
    dsec_free(p->slot_worker);
    dsec_free(p->free_slots);
    dsec_free(p->zygote_path);
    dsec_free(p->python);
    dsec_free(p->pymod_dir);
    dsec_free(p->root_dir);
    dsec_free(p->preload);
    dsec_free(p->ro_paths);
    dsec_free(p);
}

void dsec__fn_pool_deadline_ts(struct timespec *ts, uint64_t deadline_ns)
{
    ts->tv_sec = (time_t)(deadline_ns / 1000000000ull);
    ts->tv_nsec = (long)(deadline_ns % 1000000000ull);
}

int dsec__fn_pools_start(struct fn_pools *p, int pi, int wait_ms, dsec_err *err)
{
    struct fn_pool *pool = &p->pools[pi];
    uint64_t deadline = dsec_now_ns() + (uint64_t)wait_ms * 1000000ull;
    struct timespec ts;
    dsec__fn_pool_deadline_ts(&ts, deadline);
    pthread_mutex_lock(&p->mu);
    if (!pool->wanted && pi < FN_RT_COUNT) { /* an environment's is wanted once it has its layers */
        pool->wanted = true;
        dsec__fn_pool_wake(p);
    }
    int rc = 0;
    while (pool->state != P_UP) {
        if (p->stop) {
            rc = dsec_err_set(err, DSEC_E_CLOSED, 0, "function: the backend is shutting down");
            break;
        }
        if (pool->state == P_FAILED) {
            rc = dsec_err_set(err, DSEC_E_BACKEND, 0, "function: %s", pool->error);
            break;
        }
        if (pthread_cond_timedwait(&p->cv, &p->mu, &ts) == ETIMEDOUT && pool->state != P_UP) {
            rc = dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                              "function: the zygote of %s did not start within %d ms%s%s",
                              pool->name, wait_ms, pool->error[0] ? ": " : "", pool->error);
            break;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void dsec__fn_pool_info_locked(const struct fn_pool *pool, dsec_function_pool_info *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->state, sizeof out->state, "%s", state_names[pool->state]);
    out->zygote_pid = pool->zpid > 0 ? pool->zpid : 0;
    out->zygote_starts = pool->starts;
    out->warm = pool->nwarm + pool->nhot;
    out->hot = pool->nhot;
    out->promoting = pool->npromoting;
    out->spawning = pool->nspawning;
    out->busy = pool->nbusy;
    out->draining = pool->ndraining;
    out->calls = pool->calls;
    out->spawned = pool->spawned;
    out->spawn_failures = pool->spawn_failures;
    snprintf(out->version, sizeof out->version, "%s", pool->version);
    snprintf(out->preloaded, sizeof out->preloaded, "%s", pool->preloaded);
    snprintf(out->error, sizeof out->error, "%s", pool->error);
    snprintf(out->zygote_exit, sizeof out->zygote_exit, "%s", pool->zygote_exit);
    snprintf(out->name, sizeof out->name, "%s", pool->name);
    out->sandboxes = pool->refs;
}

int dsec__fn_pools_info(struct fn_pools *p, int pi, dsec_function_pool_info *out)
{
    pthread_mutex_lock(&p->mu);
    dsec__fn_pool_info_locked(&p->pools[pi], out);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int dsec__fn_pools_set_warm(struct fn_pools *p, int rt, unsigned warm, unsigned hot, int wait_ms,
                            dsec_err *err)
{
    struct fn_pool *pool = &p->pools[rt];
    uint64_t deadline = dsec_now_ns() + (uint64_t)wait_ms * 1000000ull;
    struct timespec ts;
    dsec__fn_pool_deadline_ts(&ts, deadline);
    pthread_mutex_lock(&p->mu);
    if (warm > p->max_workers)
        warm = p->max_workers;
    if (hot > warm)
        hot = warm;
    pool->target = warm;
    pool->hot_target = hot;
    pool->wanted = true;
    dsec__fn_pool_wake(p);
    int rc = 0;
    while (pool->nwarm + pool->nhot < warm || pool->nhot < hot) {
        if (p->stop || pthread_cond_timedwait(&p->cv, &p->mu, &ts) == ETIMEDOUT) {
            if (pool->nwarm + pool->nhot >= warm && pool->nhot >= hot)
                break;
            rc = dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                              "function: %u of %u %s workers warm (%u of %u hot) after %d ms%s%s",
                              pool->nwarm + pool->nhot, warm, pool->name, pool->nhot, hot, wait_ms,
                              pool->error[0] ? ": " : "", pool->error);
            break;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

/* The pid (in our namespace) a pidfd refers to, from its fdinfo. */
static pid_t pidfd_pid(int fd)
{
    char path[64], line[128];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
    FILE *f = fopen(path, "re");
    pid_t pid = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "Pid:", 4) == 0)
            pid = (pid_t)atoi(line + 4);
    if (f != NULL)
        fclose(f);
    return pid > 0 ? pid : 0;
}

size_t dsec__fn_pools_warm_pids(struct fn_pools *p, int rt, pid_t *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&p->mu);
    for (struct fn_worker *w = p->pools[rt].warm_head; w != NULL && n < max; w = w->next)
        if ((out[n] = w->pid ? w->pid : (w->pid = pidfd_pid(w->pidfd))) > 0)
            n++;
    for (struct fn_worker *w = p->pools[rt].hot_head; w != NULL && n < max; w = w->next)
        if ((out[n] = w->pid ? w->pid : (w->pid = pidfd_pid(w->pidfd))) > 0)
            n++;
    pthread_mutex_unlock(&p->mu);
    return n;
}
