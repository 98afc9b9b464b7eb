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

enum { P_OFF, P_STARTING, P_UP, P_DOWN, P_FAILED };
static const char *const state_names[] = {"off", "starting", "up", "down", "failed"};

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

static void wake(struct fn_pools *p)
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
static void broadcast(struct fn_pools *p)
{
    pthread_cond_broadcast(&p->cv);
    for (struct fn_take_waiter *t = p->aw_head; t != NULL; t = t->next)
        efd_kick(t->efd);
}

static void set_error(struct fn_pool *pool, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void set_error(struct fn_pool *pool, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pool->error, sizeof pool->error, fmt, ap);
    va_end(ap);
}

static void describe_status(int st, char *buf, size_t len)
{
    if (WIFEXITED(st))
        snprintf(buf, len, "exited with status %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, len, "ended (status %#x)", st);
}

static void close_fd(int *fd)
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

static struct fn_worker *pop(struct fn_worker **head, struct fn_worker **tail)
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

static void slot_free(struct fn_pools *p, unsigned slot)
{
    p->slot_worker[slot] = NULL;
    p->free_slots[p->nfree++] = slot;
}

static void worker_close(struct fn_worker *w)
{
    close_fd(&w->task_fd);
    close_fd(&w->stdin_fd);
    close_fd(&w->stdout_fd);
    close_fd(&w->stderr_fd);
}

/* Let a worker go: its slot comes back once its supervisor is gone. */
static void worker_drain(struct fn_pools *p, struct fn_worker *w)
{
    struct fn_pool *pool = &p->pools[w->pool];
    worker_close(w);
    if (w->pidfd >= 0) {
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV(EV_WPID, w->slot)};
        if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, w->pidfd, &ev) == 0) {
            pool->ndraining++;
            return;
        }
        /* cannot watch it: wait for it here, briefly, rather than reuse a busy slot */
        struct pollfd pf = {.fd = w->pidfd, .events = POLLIN};
        poll(&pf, 1, 2000);
        close_fd(&w->pidfd);
    }
    slot_free(p, w->slot);
    dsec_free(w);
}

/* A worker that will not become warm. */
static void worker_failed(struct fn_pools *p, struct fn_worker *w, const char *why)
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
        set_error(pool, "%s", why);
    /* Workers lost with their zygote say nothing about the next ones. */
    if (pool->state == P_UP && ++pool->consec_fail >= SPAWN_FAIL_LIMIT) {
        pool->retry_spawn_at_ns = dsec_now_ns() + 1000000000ull;
        broadcast(p);
    }
    worker_drain(p, w);
}

static int send_spawn(int zctl, const struct fnp_spawn *sp, const int *fds, int nfds)
{
    struct iovec iov = {.iov_base = (void *)sp, .iov_len = sizeof *sp};
    union {
        char buf[CMSG_SPACE(sizeof(int) * FNP_SPAWN_FDS_MAX)];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = u.buf,
                        .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    ssize_t n;
    do
        n = sendmsg(zctl, &mh, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof *sp ? 0 : -1;
}

/* Send SPAWN for w (its runtime, pool and slot set) and keep the backend's
 * ends of its channels in w. No lock held. netns_fd >= 0: a worker for one
 * call of a sandbox with a network (FNP_SPAWN_NET). */
static int worker_spawn(struct fn_pools *p, int zctl, struct fn_worker *w, int netns_fd,
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
        close_fd(&sv[i]);
        close_fd(&in[i]);
        close_fd(&out[i]);
        close_fd(&er[i]);
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
        worker_spawn(p, zctl, w, -1, NULL, why, sizeof why);
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
        set_error(pool, "%s", why);
        if (++pool->consec_fail >= SPAWN_FAIL_LIMIT) {
            pool->retry_spawn_at_ns = dsec_now_ns() + 1000000000ull;
            broadcast(p);
        }
        if (w != NULL)
            worker_close(w);
        dsec_free(w);
        slot_free(p, slot);
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
        struct fn_worker *w = pop(&q->warm_head, &q->warm_tail);
        if (w != NULL) {
            q->nwarm--;
        } else if ((w = pop(&q->hot_head, &q->hot_tail)) != NULL) {
            q->nhot--;
        } else {
            continue;
        }
        worker_drain(p, w);
        return;
    }
}

static void refill(struct fn_pools *p, struct fn_pool *pool, uint64_t now, unsigned waiting)
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
        struct fn_worker *w = pop(&pool->warm_head, &pool->warm_tail);
        pool->nwarm--;
        struct fnp_prep pr = {.h = {.magic = FNP_MAGIC, .type = FNP_PREP, .len = sizeof pr},
                              .level = p->hot_level};
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV(EV_WTASK, w->slot)};
        w->promoting = true;
        pool->npromoting++;
        if (send(w->task_fd, &pr, sizeof pr, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof pr ||
            epoll_ctl(p->epfd, EPOLL_CTL_ADD, w->task_fd, &ev) < 0) {
            worker_failed(p, w, "a worker did not take its PREP");
            continue;
        }
    }
}

/* ---- zygotes (pool thread, lock held) ------------------------------------------------------ */

/* What /usr/bin/python3 runs to become the python3 zygote: load _dsec_fnz
 * from argv[1] and hand it the rest. If the module cannot load (built for
 * another python), say so on the control socket as a FATAL. */
/* clang-format off */
static const char python_boot[] =
    "import sys\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "try:\n"
    "    import _dsec_fnz\n"
    "except BaseException as e:\n"
    "    import socket, struct\n"
    "    m = ('cannot load %s/_dsec_fnz.so into %s: %s' % (sys.argv[1], sys.executable, e))\n"
    "    f = '=4Ii32s%ds' % " FNP_STR(FNP_MSG_MAX) "\n"
    "    socket.socket(fileno=3).send(struct.pack(f, 0x31666e64, 2, struct.calcsize(f), 0, 0,\n"
    "        b'python module', m.encode()[:" FNP_STR(FNP_MSG_MAX) " - 1]))\n"
    "    raise SystemExit(1)\n"
    "del sys.path[0]\n"
    "_dsec_fnz.main(sys.argv[2:])\n";
/* clang-format on */

static void zygote_start(struct fn_pools *p, struct fn_pool *pool)
{
    pool->state = P_STARTING;
    pool->starts++;
    pool->started_ns = dsec_now_ns();
    pthread_mutex_unlock(&p->mu);

    char why[DSEC_ERR_MSG_MAX] = "";
    int sv[2] = {-1, -1};
    pid_t pid = -1;
    int pidfd = -1;
    char slots[16], ppid[16];
    snprintf(slots, sizeof slots, "%u", p->max_workers);
    snprintf(ppid, sizeof ppid, "%d", (int)getpid());
    const char *argv[90];
    int ac = 0;
    const char *prog;
    if (pool->rt == FN_RT_PYTHON3) {
        prog = p->python;
        argv[ac++] = p->python;
        argv[ac++] = "-I";
        argv[ac++] = "-c";
        argv[ac++] = python_boot;
        argv[ac++] = p->pymod_dir;
    } else {
        prog = p->zygote_path;
        argv[ac++] = "dsec-fn-zygote";
    }
    argv[ac++] = "--root";
    argv[ac++] = p->root_dir;
    argv[ac++] = "--slots";
    argv[ac++] = slots;
    argv[ac++] = "--ppid";
    argv[ac++] = ppid;
    if (pool->rt == FN_RT_PYTHON3) {
        argv[ac++] = "--preload";
        argv[ac++] = p->preload;
    }
    char ro[1024];
    snprintf(ro, sizeof ro, "%s", pool->lower != NULL ? "" : p->ro_paths);
    if (pool->lower != NULL) {
        argv[ac++] = "--lower";
        argv[ac++] = pool->lower;
    }
    for (char *save = NULL, *t = strtok_r(ro, ",", &save); t != NULL && ac < 86;
         t = strtok_r(NULL, ",", &save)) {
        argv[ac++] = "--ro";
        argv[ac++] = t;
    }
    argv[ac] = NULL;
    /* LD_BIND_NOW: every PLT slot is resolved once in the zygote, not again
     * (a symbol lookup and a copy-on-write page) in each worker. */
    static char *const envp[] = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",
                                 "LD_BIND_NOW=1", NULL};

    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        snprintf(why, sizeof why, "socketpair: %s", strerror(errno));
        goto out;
    }
    if (sv[1] == FNP_ZYGOTE_CTL_FD) { /* dup2 onto itself would keep close-on-exec */
        int d = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
        close(sv[1]);
        sv[1] = d;
    }
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, sv[1], FNP_ZYGOTE_CTL_FD);
    int rc = posix_spawn(&pid, prog, &fa, &at, (char *const *)argv, envp);
    if (rc != 0) {
        snprintf(why, sizeof why, "starting %s: %s", prog, strerror(rc));
        pid = -1;
        goto out;
    }
    /* before it is told to start workers: they inherit it */
    if (setpriority(PRIO_PROCESS, (id_t)pid, DSEC_SANDBOX_NICE) < 0)
        fprintf(stderr, "dsec function: nice %d for zygote %d: %s\n", DSEC_SANDBOX_NICE,
                (int)pid, strerror(errno));
    pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd < 0) {
        snprintf(why, sizeof why, "pidfd_open: %s", strerror(errno));
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        pid = -1;
    }
out:
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close_fd(&sv[1]);
    pthread_mutex_lock(&p->mu);
    if (why[0] != '\0') {
        close_fd(&sv[0]);
        pool->state = P_FAILED;
        set_error(pool, "the zygote of %s: %s", pool->name, why);
        pool->restart_at_ns = dsec_now_ns() + RESTART_MAX_NS;
        broadcast(p);
        return;
    }
    pool->zpid = pid;
    pool->zctl = sv[0];
    pool->zpidfd = pidfd;
    struct epoll_event e1 = {.events = EPOLLIN, .data.u64 = EV(EV_ZCTL, pool->idx)};
    struct epoll_event e2 = {.events = EPOLLIN, .data.u64 = EV(EV_ZPID, pool->idx)};
    epoll_ctl(p->epfd, EPOLL_CTL_ADD, pool->zctl, &e1);
    epoll_ctl(p->epfd, EPOLL_CTL_ADD, pool->zpidfd, &e2);
}

static void zygote_gone(struct fn_pools *p, struct fn_pool *pool)
{
    if (pool->zpid <= 0)
        return;
    int st = 0;
    char how[128] = "is gone";
    /* Its socket may close a moment before it exits: wait (briefly) for it. */
    pid_t r = waitpid(pool->zpid, &st, WNOHANG);
    if (r == 0) {
        kill(pool->zpid, SIGKILL);
        r = waitpid(pool->zpid, &st, 0);
    }
    if (r == pool->zpid)
        describe_status(st, how, sizeof how);
    snprintf(pool->zygote_exit, sizeof pool->zygote_exit, "%s", how);
    epoll_ctl(p->epfd, EPOLL_CTL_DEL, pool->zctl, NULL);
    epoll_ctl(p->epfd, EPOLL_CTL_DEL, pool->zpidfd, NULL);
    close_fd(&pool->zctl);
    close_fd(&pool->zpidfd);
    pool->zpid = 0;
    uint64_t now = dsec_now_ns();
    bool young = now - pool->started_ns < YOUNG_NS;
    if (pool->state == P_FAILED) {
        pool->restart_at_ns = now + RESTART_MAX_NS; /* it said why it could not start */
    } else {
        if (pool->state == P_STARTING)
            set_error(pool, "the zygote of %s %s during start-up", pool->name, how);
        else
            set_error(pool, "the zygote of %s %s; rebuilding it", pool->name, how);
        pool->quick_deaths = young ? pool->quick_deaths + 1 : 0;
        unsigned k = pool->quick_deaths > 8 ? 8 : pool->quick_deaths;
        uint64_t delay = k ? 100000000ull << (k - 1) : 0;
        pool->restart_at_ns = now + (delay > RESTART_MAX_NS ? RESTART_MAX_NS : delay);
        pool->state = young && pool->quick_deaths >= 3 ? P_FAILED : P_DOWN;
    }
    broadcast(p);
}

static void on_zctl(struct fn_pools *p, struct fn_pool *pool)
{
    union {
        struct fnp_hdr h;
        struct fnp_hello hello;
        struct fnp_failure fail;
    } m;
    ssize_t n = recv(pool->zctl, &m, sizeof m, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0 || (size_t)n < sizeof m.h || m.h.magic != FNP_MAGIC || m.h.len != (uint32_t)n) {
        zygote_gone(p, pool);
        return;
    }
    switch (m.h.type) {
    case FNP_HELLO:
        if ((size_t)n != sizeof m.hello)
            break;
        pool->state = P_UP;
        snprintf(pool->version, sizeof pool->version, "%s", m.hello.version);
        snprintf(pool->preloaded, sizeof pool->preloaded, "%s", m.hello.preloaded);
        pool->retry_spawn_at_ns = 0;
        pool->consec_fail = 0;
        broadcast(p);
        break;
    case FNP_FATAL:
        if ((size_t)n != sizeof m.fail)
            break;
        m.fail.msg[sizeof m.fail.msg - 1] = '\0';
        pool->state = P_FAILED;
        set_error(pool, "the zygote of %s could not start: %s", pool->name, m.fail.msg);
        broadcast(p);
        break;
    case FNP_SPAWN_FAILED:
        if ((size_t)n != sizeof m.fail || m.h.seq >= p->max_workers ||
            p->slot_worker[m.h.seq] == NULL)
            break;
        m.fail.msg[sizeof m.fail.msg - 1] = '\0';
        if (p->slot_worker[m.h.seq]->own) { /* its caller sees the task socket close */
            snprintf(p->slot_worker[m.h.seq]->why, sizeof p->slot_worker[m.h.seq]->why, "%s",
                     m.fail.msg);
            break;
        }
        worker_failed(p, p->slot_worker[m.h.seq], m.fail.msg);
        break;
    }
}

/* The first descriptor a received message carried (-1: none); any others are closed. */
static int first_fd(struct msghdr *mh)
{
    int fd = -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c != NULL; c = CMSG_NXTHDR(mh, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < k; i++) {
                int x;
                memcpy(&x, CMSG_DATA(c) + sizeof(int) * (size_t)i, sizeof x);
                if (fd < 0)
                    fd = x;
                else
                    close(x);
            }
        }
    return fd;
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
    struct iovec iov = {.iov_base = &m, .iov_len = sizeof m};
    union {
        char c[CMSG_SPACE(sizeof(int) * 2)];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.c, .msg_controllen = sizeof u.c};
    ssize_t n = recvmsg(w->task_fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    int fd = n > 0 ? first_fd(&mh) : -1;
    char why[DSEC_ERR_MSG_MAX];
    if (n <= 0 || (size_t)n < sizeof m.h || m.h.magic != FNP_MAGIC || m.h.len != (uint32_t)n) {
        close_fd(&fd);
        snprintf(why, sizeof why, "a %s worker ended before it was ready", p->pools[w->pool].name);
        worker_failed(p, w, why);
        return;
    }
    switch (m.h.type) {
    case FNP_READY:
        if (w->promoting) {
            close_fd(&fd);
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
            close_fd(&fd);
            worker_failed(p, w, "a worker's READY message is malformed");
            return;
        }
        w->pidfd = fd;
        w->spawned = w->ready = true;
        break;
    case FNP_WORKER_FAILED:
        close_fd(&fd);
        m.fail.msg[sizeof m.fail.msg - 1] = '\0';
        m.fail.stage[sizeof m.fail.stage - 1] = '\0';
        snprintf(why, sizeof why, "%s worker set-up failed (%s): %s", pool->name, m.fail.stage,
                 m.fail.msg);
        worker_failed(p, w, why);
        return;
    default:
        close_fd(&fd);
        snprintf(why, sizeof why, "a %s worker ended before it was ready", p->pools[w->pool].name);
        worker_failed(p, w, why);
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
    close_fd(&w->pidfd);
    p->pools[w->pool].ndraining--;
    slot_free(p, slot);
    dsec_free(w);
    pthread_cond_broadcast(&p->cv);
    notify_slot(p); /* the other loop waiters hear of the worker refill makes here */
}

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
static void env_tend(struct fn_pools *p, struct fn_pool *pool, uint64_t now, uint64_t *next)
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
    while ((w = pop(&pool->warm_head, &pool->warm_tail)) != NULL) {
        pool->nwarm--;
        worker_drain(p, w);
    }
    while ((w = pop(&pool->hot_head, &pool->hot_tail)) != NULL) {
        pool->nhot--;
        worker_drain(p, w);
    }
    if (pool->nspawning + pool->npromoting + pool->nbusy + pool->ndraining > 0)
        return; /* each of them comes back through the epoll */
    if (pool->zpid > 0) {
        kill(pool->zpid, SIGKILL);
        zygote_gone(p, pool);
    }
    env_release_layers(p, pool);
    env_forget(pool);
    broadcast(p);
}

/* ---- the thread ----------------------------------------------------------------------------- */

static void take_drained(struct fn_pools *p)
{
    while (p->to_drain != NULL) {
        struct fn_worker *w = p->to_drain;
        p->to_drain = w->next;
        w->next = NULL;
        p->pools[w->pool].ndraining--; /* worker_drain counts it again if it must wait */
        worker_drain(p, w);
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
        while ((w = pop(&pool->warm_head, &pool->warm_tail)) != NULL) {
            pool->nwarm--;
            worker_drain(p, w); /* its W3 reads EOF and exits, its W2 follows */
        }
        while ((w = pop(&pool->hot_head, &pool->hot_tail)) != NULL) {
            pool->nhot--;
            worker_drain(p, w);
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
            worker_drain(p, w);
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
            zygote_gone(p, &p->pools[i]);
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
            env_tend(p, pool, now, &next);
            if (!pool->wanted || (pool->idx >= FN_RT_COUNT && pool->lower == NULL))
                continue;
            if ((pool->state == P_OFF || pool->state == P_DOWN ||
                 (pool->state == P_FAILED && pool->zpid <= 0)) &&
                now >= pool->restart_at_ns)
                zygote_start(p, pool);
            else if (pool->state != P_UP && pool->state != P_STARTING && pool->restart_at_ns < next)
                next = pool->restart_at_ns;
            refill(p, pool, dsec_now_ns(), waiting);
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
                    on_zctl(p, &p->pools[id]);
                break;
            case EV_ZPID:
                if (id < p->npools && p->pools[id].zpid > 0)
                    zygote_gone(p, &p->pools[id]);
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
        broadcast(p);
        pthread_mutex_unlock(&p->mu);
        wake(p);
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

static void deadline_ts(struct timespec *ts, uint64_t deadline_ns)
{
    ts->tv_sec = (time_t)(deadline_ns / 1000000000ull);
    ts->tv_nsec = (long)(deadline_ns % 1000000000ull);
}

int dsec__fn_pools_start(struct fn_pools *p, int pi, int wait_ms, dsec_err *err)
{
    struct fn_pool *pool = &p->pools[pi];
    uint64_t deadline = dsec_now_ns() + (uint64_t)wait_ms * 1000000ull;
    struct timespec ts;
    deadline_ts(&ts, deadline);
    pthread_mutex_lock(&p->mu);
    if (!pool->wanted && pi < FN_RT_COUNT) { /* an environment's is wanted once it has its layers */
        pool->wanted = true;
        wake(p);
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

int dsec__fn_pools_env_get(struct fn_pools *p, int rt, const char *const *digests, size_t n,
                           const char *what, int wait_ms, int *out, dsec_err *err)
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
    char *key = dsec_malloc(klen);
    if (key == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: an environment pool");
    key[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        strcat(key, digests[i]);
        if (i + 1 < n)
            strcat(key, ",");
    }
    uint64_t deadline = dsec_now_ns() + (uint64_t)wait_ms * 1000000ull;
    struct timespec ts;
    deadline_ts(&ts, deadline);
    struct fn_pool *pool = NULL;
    bool made = false;
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
            } else if (!q->retiring && q->rt == rt && strcmp(q->key, key) == 0) {
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
            pool->key = key;
            key = NULL;
            pool->target = p->env_warm[rt];
            pool->hot_target = p->env_hot[rt];
            snprintf(pool->name, sizeof pool->name, "%s in %s", rt_names[rt], what);
            made = true;
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
                wake(p);
            }
            if (pthread_cond_timedwait(&p->cv, &p->mu, &ts) == ETIMEDOUT)
                rc = dsec_err_set(err, DSEC_E_CAPACITY, 0,
                                  "function: environment %s: no environment pool became free "
                                  "within %d ms",
                                  what, wait_ms);
        }
    }
    pthread_mutex_unlock(&p->mu);
    dsec_free(key);
    if (rc < 0)
        return -1;
    if (made) {
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
            wake(p);
        } else {
            pool->state = P_FAILED; /* never started: it has no root */
            set_error(pool, "%s", e.msg);
        }
        broadcast(p);
        pthread_mutex_unlock(&p->mu);
    }
    int left =
        (int)((deadline > dsec_now_ns() ? deadline - dsec_now_ns() : 0) / 1000000ull);
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
        wake(p);
    }
    pthread_mutex_unlock(&p->mu);
}

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
    wake(p); /* refill spawns for it, or leaves it a slot */
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
            wake(p);
        }
        struct fn_worker *w = NULL;
        int rc = 0;
        if (p->stop) {
            rc = dsec_err_set(err, DSEC_E_CLOSED, 0, "function: the backend is shutting down");
        } else if ((w = pop(&pool->hot_head, &pool->hot_tail)) != NULL) {
            pool->nhot--;
        } else if ((w = pop(&pool->warm_head, &pool->warm_tail)) != NULL) {
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
        wake(p); /* refill behind us */
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
            if (!hot && (w = pop(&q->warm_head, &q->warm_tail)) != NULL)
                q->nwarm--;
            else if (hot && (w = pop(&q->hot_head, &q->hot_tail)) != NULL)
                q->nhot--;
            if (w != NULL) {
                worker_drain(p, w);
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
    struct iovec iov = {.iov_base = &m, .iov_len = sizeof m};
    union {
        char c[CMSG_SPACE(sizeof(int) * 2)];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.c, .msg_controllen = sizeof u.c};
    ssize_t n;
    do
        n = recvmsg(w->task_fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno == EAGAIN)
        return false; /* not yet: why stays "" */
    int fd = n > 0 ? first_fd(&mh) : -1;
    if (n > 0 && (size_t)n == sizeof m.ready && m.h.magic == FNP_MAGIC && m.h.type == FNP_READY &&
        m.h.len == (uint32_t)n && fd >= 0) {
        w->pidfd = fd;
        w->spawned = w->ready = true;
        return false;
    }
    close_fd(&fd);
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
    worker_close(w); /* a worker still on its way sees its task socket close and exits */
    pthread_mutex_lock(&p->mu);
    if (w->why[0] != '\0') { /* the zygote said why */
        snprintf(why, whylen, "%s", w->why);
        *lost = false;
    }
    pool->nbusy--;
    pool->spawn_failures++;
    slot_free(p, w->slot);
    broadcast(p);
    pthread_mutex_unlock(&p->mu);
    dsec_free(w);
    wake(p);
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
        wake(p);
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
    if (worker_spawn(p, zctl, w, netns_fd, resolver, why, sizeof why) < 0) {
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
    worker_close(w);
    pthread_mutex_lock(&p->mu);
    struct fn_pool *pool = &p->pools[w->pool];
    pool->nbusy--;
    pool->ndraining++;
    w->next = p->to_drain;
    p->to_drain = w;
    pthread_mutex_unlock(&p->mu);
    wake(p);
}

struct fn_cg_slot *dsec__fn_worker_cg(struct fn_pools *p, const struct fn_worker *w, int *mode)
{
    *mode = p->cg.mode;
    return p->cg.mode == FN_CG_NONE ? NULL : &p->cgslots[w->slot];
}

static void info_locked(const struct fn_pool *pool, dsec_function_pool_info *out)
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
    info_locked(&p->pools[pi], out);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

size_t dsec__fn_pools_env_info(struct fn_pools *p, dsec_function_pool_info *out, size_t max)
{
    size_t n = 0;
    pthread_mutex_lock(&p->mu);
    for (unsigned i = FN_RT_COUNT; i < p->npools; i++)
        if (p->pools[i].used && n < max)
            info_locked(&p->pools[i], &out[n++]);
    pthread_mutex_unlock(&p->mu);
    return n;
}

int dsec__fn_pools_set_warm(struct fn_pools *p, int rt, unsigned warm, unsigned hot, int wait_ms,
                            dsec_err *err)
{
    struct fn_pool *pool = &p->pools[rt];
    uint64_t deadline = dsec_now_ns() + (uint64_t)wait_ms * 1000000ull;
    struct timespec ts;
    deadline_ts(&ts, deadline);
    pthread_mutex_lock(&p->mu);
    if (warm > p->max_workers)
        warm = p->max_workers;
    if (hot > warm)
        hot = warm;
    pool->target = warm;
    pool->hot_target = hot;
    pool->wanted = true;
    wake(p);
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
