/* function-cgroup.c - cgroups of function-call workers: one reusable cgroup per worker slot (v1
 * controllers or v2), so a call is limited and OOM-killed alone. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends/cgroup-tune.h"
#include "backends/function/function-int.h"

/*
 * Where: below this process's own cgroup (from /proc/self/cgroup), so
 * whatever limits the node manager lives under also bound its calls:
 *   v1: <memory mount><own>/dsec-fn-<inst>/w<slot>   (and the same under
 *       pids and cpuacct when those controllers are mounted)
 *   v2: <cgroup2 mount><own>/dsec-fn-<inst>/w<slot>, with memory and pids
 *       enabled down the path. v2 forbids processes in a cgroup that hands
 *       controllers to children, so the node moves itself into
 *       <own>/dsec-node first; where even that is refused, the error says
 *       what to do.
 * Hybrid hosts (v1 controllers, a cgroup2 mount without memory) use v1.
 * Slots are made on first use and kept: a new worker joins an empty one.
 */

struct mnt {
    char path[PATH_MAX];
    char root[PATH_MAX];
};

static int find_mount(const char *ctrl, struct mnt *out)
{
    return dsec_cgroup_mount(ctrl, out->path, sizeof out->path, out->root, sizeof out->root);
}

/* This process's cgroup path for controller ctrl (v1) or the unified one
 * (ctrl NULL), from /proc/self/cgroup. */
static int own_path(const char *ctrl, char *out, size_t len)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (f == NULL)
        return -1;
    char line[4096];
    int rc = -1;
    while (rc < 0 && fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (c2 == NULL)
            continue;
        *c2 = '\0';
        const char *ctrls = c1 + 1, *path = c2 + 1;
        bool hit = false;
        if (ctrl == NULL) {
            hit = strcmp(line, "0") == 0 && ctrls[0] == '\0';
        } else {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", ctrls);
            for (char *save = NULL, *t = strtok_r(buf, ",", &save); t;
                 t = strtok_r(NULL, ",", &save))
                if (strcmp(t, ctrl) == 0)
                    hit = true;
        }
        if (hit) {
            snprintf(out, len, "%s", path);
            rc = 0;
        }
    }
    fclose(f);
    return rc;
}

/* The directory of this process's cgroup in mount m; -1 when it does not
 * fit in out. */
static int own_dir(const struct mnt *m, const char *own, char *out, size_t len)
{
    const char *rel = own;
    size_t rl = strlen(m->root);
    /* A mount of a sub-tree (a cgroup namespace): paths are relative to it. */
    if (strcmp(m->root, "/") != 0 && strncmp(own, m->root, rl) == 0)
        rel = own + rl;
    if (strcmp(rel, "/") == 0)
        rel = "";
    int n = snprintf(out, len, "%s%s", m->path, rel);
    return n >= 0 && (size_t)n < len ? 0 : -1;
}

static int write_file(const char *dir, const char *name, const char *val)
{
    char p[PATH_MAX];
    int len = snprintf(p, sizeof p, "%s/%s", dir, name);
    if (len < 0 || (size_t)len >= sizeof p) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = open(p, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, val, strlen(val));
    int e = errno;
    close(fd);
    errno = e;
    return n == (ssize_t)strlen(val) ? 0 : -1;
}

/* rmdir, waiting a little for a cgroup whose last process is still being
 * reaped (a zombie keeps its cgroup busy). */
static void rmdir_wait(const char *dir)
{
    for (int i = 0; i < 100 && rmdir(dir) < 0 && errno == EBUSY; i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static bool pid_alive(long pid)
{
    return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

/* Remove instance directories left by dead processes (their slots are empty
 * once every worker has died; rmdir fails harmlessly otherwise). */
static void sweep(const char *parent)
{
    DIR *d = opendir(parent);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "dsec-fn-", 8) != 0)
            continue;
        /* dsec-fn-<node>-<pid>-<seq>: the pid is the second field from the end */
        char name[256];
        snprintf(name, sizeof name, "%s", e->d_name);
        char *last = strrchr(name, '-');
        if (last == NULL)
            continue;
        *last = '\0';
        char *pidp = strrchr(name, '-');
        if (pidp == NULL || pid_alive(strtol(pidp + 1, NULL, 10)))
            continue;
        char inst[PATH_MAX + 300];
        snprintf(inst, sizeof inst, "%s/%s", parent, e->d_name);
        DIR *s = opendir(inst);
        if (s != NULL) {
            struct dirent *w;
            while ((w = readdir(s)) != NULL)
                if (w->d_name[0] == 'w') {
                    char slot[PATH_MAX + 600];
                    if (snprintf(slot, sizeof slot, "%s/%s", inst, w->d_name) < (int)sizeof slot)
                        rmdir(slot);
                }
            closedir(s);
        }
        rmdir(inst);
    }
    closedir(d);
}

static int make_inst(const struct mnt *m, const char *ctrl, const char *inst, char *out, size_t len,
                     dsec_err *err)
{
    char own[PATH_MAX], dir[PATH_MAX];
    if (own_path(ctrl, own, sizeof own) < 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "function: this process has no %s cgroup in /proc/self/cgroup",
                            ctrl ? ctrl : "unified");
    if (own_dir(m, own, dir, sizeof dir) < 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "function: the path of cgroup %.200s is too long", own);
    sweep(dir);
    if (snprintf(out, len, "%s/dsec-fn-%s", dir, inst) >= (int)len)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "function: cgroup path below %s is too long",
                            dir);
    if (mkdir(out, 0755) < 0 && errno != EEXIST)
        return dsec_err_set(err, DSEC_E_IO, errno, "function: creating cgroup %s", out);
    return 0;
}

int dsec__fn_cg_open(struct fn_cg *cg, const char *want, const char *inst, dsec_err *err)
{
    memset(cg, 0, sizeof *cg);
    if (want == NULL || strcmp(want, "auto") == 0)
        want = "auto";
    else if (strcmp(want, "none") == 0)
        return 0;
    else if (strcmp(want, "v1") != 0 && strcmp(want, "v2") != 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "function option cgroup=\"%s\": expected auto, v1, v2 or none", want);

    struct mnt m;
    bool auto_ = strcmp(want, "auto") == 0;
    if (auto_ || strcmp(want, "v2") == 0) {
        char ctl[PATH_MAX + 32], buf[512] = "";
        if (find_mount(NULL, &m) == 0) {
            snprintf(ctl, sizeof ctl, "%s/cgroup.controllers", m.path);
            FILE *f = fopen(ctl, "re");
            if (f != NULL) {
                if (fgets(buf, sizeof buf, f) == NULL)
                    buf[0] = '\0';
                fclose(f);
            }
        }
        bool mem = false;
        for (char *save = NULL, *t = strtok_r(buf, " \n", &save); t;
             t = strtok_r(NULL, " \n", &save))
            if (strcmp(t, "memory") == 0)
                mem = true;
        if (mem) {
            char own[PATH_MAX], dir[PATH_MAX];
            if (own_path(NULL, own, sizeof own) < 0)
                return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                    "function: no unified cgroup in /proc/self/cgroup");
            if (own_dir(&m, own, dir, sizeof dir) < 0)
                return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                    "function: the path of cgroup %.200s is too long", own);
            /* Controllers must be enabled in our group for its children,
             * which v2 allows only once no process lives in it: move this
             * process into a leaf of its own first (what a delegated
             * service does). */
            if (write_file(dir, "cgroup.subtree_control", "+memory +pids") < 0 && errno == EBUSY) {
                char leaf[PATH_MAX + 16], pid[32];
                snprintf(leaf, sizeof leaf, "%s/dsec-node", dir);
                snprintf(pid, sizeof pid, "%d", (int)getpid());
                if ((mkdir(leaf, 0755) == 0 || errno == EEXIST) &&
                    write_file(leaf, "cgroup.procs", pid) == 0)
                    errno = 0;
            }
            if (write_file(dir, "cgroup.subtree_control", "+memory +pids") < 0)
                return dsec_err_set(err, DSEC_E_CONFIG, errno,
                                    "function: cannot enable the memory and pids controllers "
                                    "below %s (cgroup v2 allows that only in a cgroup without "
                                    "processes of its own: run the node in a delegated cgroup, "
                                    "or set the function option cgroup=none)",
                                    dir);
            if (make_inst(&m, NULL, inst, cg->mem, sizeof cg->mem, err) < 0)
                return -1;
            if (write_file(cg->mem, "cgroup.subtree_control", "+memory +pids") < 0) {
                dsec_err_set(err, DSEC_E_IO, errno, "function: enabling controllers in %s",
                             cg->mem);
                rmdir(cg->mem);
                return -1;
            }
            snprintf(cg->pids, sizeof cg->pids, "%s", cg->mem);
            snprintf(cg->cpu, sizeof cg->cpu, "%s", cg->mem);
            cg->mode = FN_CG_V2;
            return 0;
        }
        if (!auto_)
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "function option cgroup=v2: no cgroup2 mount offers the memory "
                                "controller here");
    }
    if (find_mount("memory", &m) < 0) {
        if (auto_)
            return 0;
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "function option cgroup=v1: the memory controller is not mounted");
    }
    if (make_inst(&m, "memory", inst, cg->mem, sizeof cg->mem, err) < 0)
        return -1;
    if (find_mount("pids", &m) == 0 &&
        make_inst(&m, "pids", inst, cg->pids, sizeof cg->pids, err) < 0)
        cg->pids[0] = '\0';
    if (find_mount("cpuacct", &m) == 0 &&
        make_inst(&m, "cpuacct", inst, cg->cpu, sizeof cg->cpu, err) < 0)
        cg->cpu[0] = '\0';
    cg->mode = FN_CG_V1;
    return 0;
}

void dsec__fn_cg_close(struct fn_cg *cg)
{
    if (cg->mode == FN_CG_NONE)
        return;
    const char *dirs[] = {cg->mem, cg->pids, cg->cpu};
    for (int i = 0; i < 3; i++) {
        bool dup = false;
        for (int j = 0; j < i; j++)
            dup = dup || strcmp(dirs[i], dirs[j]) == 0;
        if (dirs[i][0] != '\0' && !dup)
            rmdir_wait(dirs[i]);
    }
    cg->mode = FN_CG_NONE;
}

static void slot_dir(const char *inst, unsigned slot, char *out, size_t len)
{
    snprintf(out, len, "%s/w%u", inst, slot);
}

static int open_in(const char *inst, unsigned slot, const char *file, int flags)
{
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/w%u/%s", inst, slot, file);
    return open(p, flags | O_CLOEXEC);
}

int dsec__fn_cg_slot_make(struct fn_cg *cg, unsigned slot, struct fn_cg_slot *s, dsec_err *err)
{
    if (s->made)
        return 0;
    memset(s, 0, sizeof *s);
    s->limit_fd = s->pids_fd = s->cpu_fd = -1;
    s->procs[0] = s->procs[1] = s->procs[2] = -1;
    if (cg->mode == FN_CG_NONE) {
        s->made = true;
        return 0;
    }
    const char *dirs[] = {cg->mem, cg->pids, cg->cpu};
    char p[PATH_MAX + 64];
    for (int i = 0; i < 3; i++) {
        if (dirs[i][0] == '\0' || (i > 0 && cg->mode == FN_CG_V2))
            continue;
        slot_dir(dirs[i], slot, p, sizeof p);
        if (mkdir(p, 0755) < 0 && errno != EEXIST)
            return dsec_err_set(err, DSEC_E_IO, errno, "function: creating cgroup %s", p);
    }
    bool v2 = cg->mode == FN_CG_V2;
    s->limit_fd = open_in(cg->mem, slot, v2 ? "memory.max" : "memory.limit_in_bytes", O_RDWR);
    if (s->limit_fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "function: opening the memory limit of slot %u",
                            slot);
    if (cg->pids[0] != '\0')
        s->pids_fd = open_in(cg->pids, slot, "pids.max", O_RDWR);
    if (cg->cpu[0] != '\0')
        s->cpu_fd = open_in(cg->cpu, slot, v2 ? "cpu.stat" : "cpuacct.usage", O_RDONLY);
    for (int i = 0; i < 3; i++) {
        if (dirs[i][0] == '\0' || (i > 0 && cg->mode == FN_CG_V2))
            continue;
        int fd = open_in(dirs[i], slot, "cgroup.procs", O_WRONLY);
        if (fd < 0) {
            int e = errno;
            for (int j = 0; j < s->nprocs; j++)
                close(s->procs[j]);
            close(s->limit_fd);
            if (s->pids_fd >= 0)
                close(s->pids_fd);
            if (s->cpu_fd >= 0)
                close(s->cpu_fd);
            s->limit_fd = s->pids_fd = s->cpu_fd = -1;
            s->nprocs = 0;
            return dsec_err_set(err, DSEC_E_IO, e, "function: opening cgroup.procs of slot %u",
                                slot);
        }
        s->procs[s->nprocs++] = fd;
    }
    s->made = true;
    return 0;
}

void dsec__fn_cg_slot_free(struct fn_cg *cg, unsigned slot, struct fn_cg_slot *s)
{
    if (!s->made)
        return;
    int fds[] = {s->limit_fd, s->pids_fd, s->cpu_fd, s->procs[0], s->procs[1], s->procs[2]};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
        if (fds[i] >= 0 && (i < 3 || (int)i - 3 < s->nprocs))
            close(fds[i]);
    if (cg->mode != FN_CG_NONE) {
        const char *dirs[] = {cg->mem, cg->pids, cg->cpu};
        char p[PATH_MAX + 64];
        for (int i = 0; i < 3; i++) {
            if (dirs[i][0] == '\0' || (i > 0 && cg->mode == FN_CG_V2))
                continue;
            slot_dir(dirs[i], slot, p, sizeof p);
            rmdir_wait(p);
        }
    }
    memset(s, 0, sizeof *s);
}

void dsec__fn_cg_slot_procs(const struct fn_cg_slot *s, int fds[3], int *n)
{
    *n = s->made ? s->nprocs : 0;
    for (int i = 0; i < *n; i++)
        fds[i] = s->procs[i];
}

static int put_u64(int fd, uint64_t v, bool max_word)
{
    char buf[32];
    int n = max_word && v == 0 ? snprintf(buf, sizeof buf, "max")
                               : snprintf(buf, sizeof buf, "%" PRIu64, v);
    return pwrite(fd, buf, (size_t)n, 0) == n ? 0 : -1;
}

int dsec__fn_cg_slot_limits(struct fn_cg_slot *s, int mode, uint64_t mem, uint64_t pids,
                            dsec_err *err)
{
    if (mode == FN_CG_NONE || !s->made)
        return 0;
    if (mem != 0 && mem != s->limit) {
        if (put_u64(s->limit_fd, mem, false) < 0)
            return dsec_err_set(err, DSEC_E_IO, errno,
                                "function: setting the call's memory limit to %" PRIu64 " bytes",
                                mem);
        s->limit = mem;
    }
    if (pids != 0 && pids != s->pids && s->pids_fd >= 0) {
        if (put_u64(s->pids_fd, pids, false) < 0)
            return dsec_err_set(err, DSEC_E_IO, errno,
                                "function: setting the call's process limit to %" PRIu64, pids);
        s->pids = pids;
    }
    return 0;
}

int dsec__fn_cg_slot_cpu(const struct fn_cg_slot *s, int mode, uint64_t *ns)
{
    if (mode == FN_CG_NONE || !s->made || s->cpu_fd < 0)
        return -1;
    char buf[512];
    ssize_t n = pread(s->cpu_fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    if (mode == FN_CG_V1) {
        *ns = strtoull(buf, NULL, 10);
        return 0;
    }
    const char *u = strstr(buf, "usage_usec ");
    if (u == NULL)
        return -1;
    *ns = strtoull(u + 11, NULL, 10) * 1000ull;
    return 0;
}
