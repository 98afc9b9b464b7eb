/* container-pool.c - the warm pool: containers started ahead of need on an empty root, each
 * with its agent up and connected. A create or fork child takes one and switches its root to
 * the sandbox's overlay (dsec__ct_rt_switch_root) instead of paying a runtime start. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends/container/container-int.h"
#include "dsec/alloc.h"
#include "dsec/log.h"

/* The empty root a warm container starts on: mount points for what the runtime mounts, and
 * /.dsec/root, where the sandbox's overlay is attached before the pivot. */
static int blank_root(const char *dir, dsec_err *err)
{
    static const char *const dirs[] = {"rootfs",     "rootfs/proc",  "rootfs/dev",
                                       "rootfs/sys", "rootfs/.dsec", "rootfs/.dsec/root",
                                       "rootfs/etc"};
    char p[PATH_MAX + 32];
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        dsec__ct_fmt(p, sizeof p, "%s/%s", dir, dirs[i]);
        if (mkdir(p, 0755) < 0 && errno != EEXIST)
            return dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", p);
    }
    static const char *const files[] = {"rootfs/.dsec/agent", "rootfs/etc/resolv.conf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        dsec__ct_fmt(p, sizeof p, "%s/%s", dir, files[i]);
        int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", p);
        close(fd);
    }
    return 0;
}

/* Remove a warm container (started by rt): its runtime container and cgroups, then its
 * directory. */
static void warm_remove(struct ct_backend *be, const struct ct_rt *rt, const char *rid,
                        const char *dir)
{
    dsec_err err;
    if (dsec__ct_rt_delete(be, rt, rid, &err) < 0)
        dsec_log_warn("dsec container: removing warm container %s: %s", rid, err.msg);
    else if (dir != NULL && dsec__ct_rmtree(dir) < 0)
        dsec_log_warn("dsec container: removing %s: %s", dir, strerror(errno));
}

static void warm_net_detach(struct ct_warm *w)
{
    dsec_err err;
    if (w->net != NULL && dsec_net_detach(w->net, &err) < 0)
        dsec_log_warn("dsec container: the network of warm container %s: %s", w->rid, err.msg);
    w->net = NULL;
}

static void warm_free(struct ct_backend *be, struct ct_warm *w)
{
    dsec_agent_free(w->agent);
    warm_remove(be, be->rt, w->rid, w->dir);
    warm_net_detach(w);
    dsec_free(w);
}

/* Start one warm container: S/pool/<rid>, the runtime, the agent's hello. */
static struct ct_warm *warm_start(struct ct_backend *be, dsec_err *err)
{
    struct ct_warm *w = dsec_calloc(1, sizeof *w);
    dsec_sandbox *sb = dsec_calloc(1, sizeof *sb);
    if (w == NULL || sb == NULL) {
        dsec_free(w);
        dsec_free(sb);
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container: warm container record");
        return NULL;
    }
    pthread_mutex_lock(&be->lock);
    unsigned long long seq = ++be->warm_seq;
    pthread_mutex_unlock(&be->lock);
    dsec__ct_fmt(w->rid, sizeof w->rid, "%s%llu", be->warm_prefix, seq);
    dsec__ct_fmt(w->dir, sizeof w->dir, "%s/%s", be->pool_dir, w->rid);
    /* the config of a sandbox without layers, limits or network: numeric user 0
     * (the empty root has no /etc/passwd), workdir / */
    memcpy(sb->id, w->rid, sizeof sb->id);
    memcpy(sb->rid, w->rid, sizeof sb->rid);
    memcpy(sb->dir, w->dir, sizeof sb->dir);
    sb->rt = be->rt;
    char user[] = "0", workdir[] = "/";
    sb->env.base.user = user;
    sb->env.base.workdir = workdir;
    bool started = false;
    int rc = -1;
    if (mkdir(w->dir, 0700) < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", w->dir);
        goto out;
    }
    /* with containment: a namespace of its own that reaches nothing, and the node's resolver
     * in its /etc/resolv.conf, as a cold start would have (the sandbox that takes it renames
     * it and sets its policy) */
    if (be->net != NULL) {
        if (dsec_net_attach(be->net, w->rid, NULL, NULL, 0, &w->net, err) < 0)
            goto out;
        sb->net = w->net;
        if (dsec__ct_resolv_write(w->dir, w->net, err) < 0)
            goto out;
    }
    if (blank_root(w->dir, err) < 0 || dsec__ct_oci_write(be, sb, err) < 0)
        goto out;
    int lfd = dsec__ct_listen_at(w->dir, "agent.sock", err);
    if (lfd < 0)
        goto out;
    started = true;
    rc = dsec__ct_rt_start(be, sb, lfd, -1, err);
    close(lfd);
    if (rc < 0)
        goto out;
    char sp[PATH_MAX + 16];
    dsec__ct_fmt(sp, sizeof sp, "%s/agent.sock", w->dir);
    rc = dsec_agent_connect(&w->agent, sp, be->start_timeout_ms, err);
    if (rc == 0 && (w->init = dsec__ct_init_pid(be, w->rid)) < 0)
        rc = dsec_err_set(err, DSEC_E_BACKEND, 0, "container: warm container %s has no process",
                          w->rid);
    if (rc == 0) { /* for operators (and the benchmark): S/pool/<rid>/ready is a ready one */
        dsec__ct_fmt(sp, sizeof sp, "%s/ready", w->dir);
        rc = dsec__ct_write_file(sp, "", 0, err);
    }
out:
    dsec_free(sb);
    if (rc == 0)
        return w;
    dsec_agent_free(w->agent);
    if (started)
        warm_remove(be, be->rt, w->rid, w->dir);
    else
        dsec__ct_rmtree(w->dir);
    warm_net_detach(w);
    dsec_free(w);
    return NULL;
}

#define WARM_NICE 10

/* One of warm_refill threads: each starts one warm container at a time while the ready ones
 * and those being started fall short of warm_target, so a pool emptied by a burst or a fork
 * refills sooner where CPUs are free (docs/containers.md has what it costs where they are
 * not). */
static void *pool_main(void *arg)
{
    struct ct_backend *be = arg;
    unsigned failures = 0;
    /* Background work: the refill (and the runtime it starts, which inherits this) yields the
     * CPU to the creates and forks the node serves now. */
    setpriority(PRIO_PROCESS, (id_t)gettid(), WARM_NICE);
    pthread_mutex_lock(&be->warm_mu);
    while (!be->warm_stop) {
        if (be->nwarm + be->nstarting >= be->warm_target) {
            pthread_cond_wait(&be->warm_cond, &be->warm_mu);
            continue;
        }
        be->nstarting++;
        pthread_mutex_unlock(&be->warm_mu);
        dsec_err err;
        struct ct_warm *w = warm_start(be, &err);
        pthread_mutex_lock(&be->warm_mu);
        be->nstarting--;
        if (w != NULL) {
            failures = 0;
            w->next = be->warm;
            be->warm = w;
            be->nwarm++;
            continue;
        }
        /* said once per run of failures; tried again later, creates go cold meanwhile */
        if (failures++ == 0)
            dsec_log_info("dsec container: starting a warm container failed (retrying): %s",
                          err.msg);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += failures < 10 ? 1 : 10;
        if (!be->warm_stop)
            pthread_cond_timedwait(&be->warm_cond, &be->warm_mu, &ts);
    }
    pthread_mutex_unlock(&be->warm_mu);
    return NULL;
}

int dsec__ct_pool_start(struct ct_backend *be, dsec_err *err)
{
    pthread_mutex_init(&be->warm_mu, NULL);
    pthread_cond_init(&be->warm_cond, NULL);
    be->warm_init = true;
    /* runtime ids of this instance: w<8 hex>.<n>; a sandbox id has no '.' */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned tag = (unsigned)(ts.tv_nsec ^ ts.tv_sec * 2654435761u ^ (unsigned)getpid() << 16);
    dsec__ct_fmt(be->warm_prefix, sizeof be->warm_prefix, "w%08x.", tag);
    dsec__ct_fmt(be->pool_dir, sizeof be->pool_dir, "%s/pool", be->state_dir);
    if (mkdir(be->pool_dir, 0700) < 0 && errno != EEXIST)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", be->pool_dir);
    if (be->warm_target == 0)
        return 0;
    unsigned n = be->warm_refill < be->warm_target ? be->warm_refill : be->warm_target;
    for (unsigned i = 0; i < n; i++) {
        int e = pthread_create(&be->warm_th[i], NULL, pool_main, be);
        if (e != 0) {
            if (be->nwarm_th > 0)
                break; /* fewer refill threads, still a pool */
            return dsec_err_set(err, DSEC_E_NOMEM, e, "container: starting the warm pool thread");
        }
        be->nwarm_th++;
    }
    return 0;
}

void dsec__ct_pool_stop(struct ct_backend *be)
{
    if (!be->warm_init)
        return;
    pthread_mutex_lock(&be->warm_mu);
    be->warm_stop = true;
    pthread_cond_broadcast(&be->warm_cond);
    pthread_mutex_unlock(&be->warm_mu);
    for (unsigned i = 0; i < be->nwarm_th; i++)
        pthread_join(be->warm_th[i], NULL);
    be->nwarm_th = 0;
    while (be->warm != NULL) {
        struct ct_warm *w = be->warm;
        be->warm = w->next;
        warm_free(be, w);
    }
    be->nwarm = 0;
    pthread_cond_destroy(&be->warm_cond);
    pthread_mutex_destroy(&be->warm_mu);
    be->warm_init = false;
}

struct ct_warm *dsec__ct_pool_take(struct ct_backend *be)
{
    if (be->nwarm_th == 0)
        return NULL;
    pthread_mutex_lock(&be->warm_mu);
    struct ct_warm *w = be->warm;
    if (w != NULL) {
        be->warm = w->next;
        be->nwarm--;
        w->next = NULL;
    }
    pthread_cond_signal(&be->warm_cond); /* refill */
    pthread_mutex_unlock(&be->warm_mu);
    /* one that died while it waited (killed from outside) is no use */
    if (w != NULL && kill(w->init, 0) < 0) {
        warm_free(be, w);
        return NULL;
    }
    /* the sandbox runs at the node's priority, not the refill's: its init (the agent, the
     * container's only process yet) and so all it starts */
    if (w != NULL && setpriority(PRIO_PROCESS, (id_t)w->init, 0) < 0) {
        warm_free(be, w);
        return NULL;
    }
    return w;
}

void dsec__ct_pool_give_up(struct ct_backend *be, struct ct_warm *w)
{
    warm_free(be, w);
}

unsigned dsec__ct_pool_ready(struct ct_backend *be)
{
    if (!be->warm_init)
        return 0;
    pthread_mutex_lock(&be->warm_mu);
    unsigned n = be->nwarm;
    pthread_mutex_unlock(&be->warm_mu);
    return n;
}

bool dsec__ct_is_warm_rid(const char *name)
{
    return name[0] == 'w' && strchr(name, '.') != NULL && strchr(name, '/') == NULL;
}

/* Warm containers of earlier instances (in the runtime's state and S/pool), except those
 * that sandboxes re-adopted since (held(rid) says). Each is removed by the runtime that
 * started it (an earlier instance may have been configured with another): the one whose
 * state dir it has, else the configured one; one whose runtime is not installed is left.
 * Returns how many went. */
int dsec__ct_pool_sweep(struct ct_backend *be, bool (*held)(struct ct_backend *, const char *))
{
    int n = 0;
    const char *dirs[2] = {be->run_root, be->pool_dir};
    for (int k = 0; k < 2; k++) {
        DIR *d = opendir(dirs[k]);
        if (d == NULL)
            continue;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (!dsec__ct_is_warm_rid(e->d_name) ||
                strncmp(e->d_name, be->warm_prefix, strlen(be->warm_prefix)) == 0 ||
                held(be, e->d_name))
                continue;
            char dir[PATH_MAX + 300];
            dsec__ct_fmt(dir, sizeof dir, "%s/%s", be->pool_dir, e->d_name);
            const char *name = dsec__ct_rt_guess(be, e->d_name);
            dsec_err err;
            const struct ct_rt *rt = name != NULL ? dsec__ct_rt_get(be, name, &err) : be->rt;
            if (rt == NULL) {
                dsec_log_warn("dsec container: leaving warm container %s as it is: %s", e->d_name,
                              err.msg);
                continue;
            }
            warm_remove(be, rt, e->d_name, dir);
            n++;
        }
        closedir(d);
    }
    return n;
}
