/* function-pool-zygote.c - a pool's zygote, seen from the pool thread: started, watched,
 * reaped and started again. */
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
#include "dsec/log.h"

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

/* A zygote's command line: argv and the strings it points at (besides p's and the pool's). */
struct zargs {
    const char *argv[90];
    char slots[16], ppid[16], ro[1024];
};

/* The command line of pool's zygote into a; returns the program to run. */
static const char *zygote_args(const struct fn_pools *p, const struct fn_pool *pool,
                               struct zargs *a)
{
    snprintf(a->slots, sizeof a->slots, "%u", p->max_workers);
    snprintf(a->ppid, sizeof a->ppid, "%d", (int)getpid());
    int ac = 0;
    const char *prog;
    if (pool->rt == FN_RT_PYTHON3) {
        prog = p->python;
        a->argv[ac++] = p->python;
        a->argv[ac++] = "-I";
        a->argv[ac++] = "-c";
        a->argv[ac++] = python_boot;
        a->argv[ac++] = p->pymod_dir;
    } else {
        prog = p->zygote_path;
        a->argv[ac++] = "dsec-fn-zygote";
    }
    a->argv[ac++] = "--root";
    a->argv[ac++] = p->root_dir;
    a->argv[ac++] = "--slots";
    a->argv[ac++] = a->slots;
    a->argv[ac++] = "--ppid";
    a->argv[ac++] = a->ppid;
    if (pool->rt == FN_RT_PYTHON3) {
        a->argv[ac++] = "--preload";
        a->argv[ac++] = p->preload;
    }
    snprintf(a->ro, sizeof a->ro, "%s", pool->lower != NULL ? "" : p->ro_paths);
    if (pool->lower != NULL) {
        a->argv[ac++] = "--lower";
        a->argv[ac++] = pool->lower;
    }
    for (char *save = NULL, *t = strtok_r(a->ro, ",", &save); t != NULL && ac < 86;
         t = strtok_r(NULL, ",", &save)) {
        a->argv[ac++] = "--ro";
        a->argv[ac++] = t;
    }
    a->argv[ac] = NULL;
    return prog;
}

void dsec__fn_pool_zygote_start(struct fn_pools *p, struct fn_pool *pool)
{
    pool->state = P_STARTING;
    pool->starts++;
    pool->started_ns = dsec_now_ns();
    pthread_mutex_unlock(&p->mu);

    char why[DSEC_ERR_MSG_MAX] = "";
    int sv[2] = {-1, -1};
    pid_t pid = -1;
    int pidfd = -1;
    struct zargs za;
    const char *prog = zygote_args(p, pool, &za);
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
    int rc = posix_spawn(&pid, prog, &fa, &at, (char *const *)za.argv, envp);
    if (rc != 0) {
        snprintf(why, sizeof why, "starting %s: %s", prog, strerror(rc));
        pid = -1;
        goto out;
    }
    /* before it is told to start workers: they inherit it */
    if (setpriority(PRIO_PROCESS, (id_t)pid, DSEC_SANDBOX_NICE) < 0)
        dsec_log_warn("dsec function: nice %d for zygote %d: %s", DSEC_SANDBOX_NICE, (int)pid,
                      strerror(errno));
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
    dsec__fn_pool_close_fd(&sv[1]);
    pthread_mutex_lock(&p->mu);
    if (why[0] != '\0') {
        dsec__fn_pool_close_fd(&sv[0]);
        pool->state = P_FAILED;
        dsec__fn_pool_set_error(pool, "the zygote of %s: %s", pool->name, why);
        pool->restart_at_ns = dsec_now_ns() + RESTART_MAX_NS;
        dsec__fn_pool_broadcast(p);
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

void dsec__fn_pool_zygote_gone(struct fn_pools *p, struct fn_pool *pool)
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
        dsec__fn_pool_describe_status(st, how, sizeof how);
    snprintf(pool->zygote_exit, sizeof pool->zygote_exit, "%s", how);
    epoll_ctl(p->epfd, EPOLL_CTL_DEL, pool->zctl, NULL);
    epoll_ctl(p->epfd, EPOLL_CTL_DEL, pool->zpidfd, NULL);
    dsec__fn_pool_close_fd(&pool->zctl);
    dsec__fn_pool_close_fd(&pool->zpidfd);
    pool->zpid = 0;
    uint64_t now = dsec_now_ns();
    bool young = now - pool->started_ns < YOUNG_NS;
    if (pool->state == P_FAILED) {
        pool->restart_at_ns = now + RESTART_MAX_NS; /* it said why it could not start */
    } else {
        if (pool->state == P_STARTING)
            dsec__fn_pool_set_error(pool, "the zygote of %s %s during start-up", pool->name, how);
        else
            dsec__fn_pool_set_error(pool, "the zygote of %s %s; rebuilding it", pool->name, how);
        pool->quick_deaths = young ? pool->quick_deaths + 1 : 0;
        unsigned k = pool->quick_deaths > 8 ? 8 : pool->quick_deaths;
        uint64_t delay = k ? 100000000ull << (k - 1) : 0;
        pool->restart_at_ns = now + (delay > RESTART_MAX_NS ? RESTART_MAX_NS : delay);
        pool->state = young && pool->quick_deaths >= 3 ? P_FAILED : P_DOWN;
    }
    dsec__fn_pool_broadcast(p);
}

void dsec__fn_pool_on_zctl(struct fn_pools *p, struct fn_pool *pool)
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
        dsec__fn_pool_zygote_gone(p, pool);
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
        dsec__fn_pool_broadcast(p);
        break;
    case FNP_FATAL:
        if ((size_t)n != sizeof m.fail)
            break;
        m.fail.msg[sizeof m.fail.msg - 1] = '\0';
        pool->state = P_FAILED;
        dsec__fn_pool_set_error(pool, "the zygote of %s could not start: %s", pool->name,
                                m.fail.msg);
        dsec__fn_pool_broadcast(p);
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
        dsec__fn_pool_worker_failed(p, p->slot_worker[m.h.seq], m.fail.msg);
        break;
    }
}
