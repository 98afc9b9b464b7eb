/* function.c - the function backend's operations: options, sandboxes (a runtime, limits, files),
 * and the calls they run. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/cgroup-tune.h"
#include "backends/function/function-int.h"
#include "backends/function/function.h"
#include "backends/loop.h"
#include "backends/net/net.h"
#include "dsec/alloc.h"

/*
 * Sandboxes are cheap records: everything heavy (zygotes, warm workers) is
 * shared per runtime in the pools (function-pool.c). A sandbox's state is its
 * runtime, its limits and its files, which live on the node's disk under
 * <state_dir>/sandboxes/<id>, so adopt() after a node manager restart finds
 * them again. Operations on one sandbox arrive in order (backend.h), so a
 * sandbox needs no lock; the pools are shared and locked.
 */

#ifndef DSEC_FN_ZYGOTE_PATH
#define DSEC_FN_ZYGOTE_PATH ""
#endif
#ifndef DSEC_FN_PYMOD_PATH
#define DSEC_FN_PYMOD_PATH ""
#endif

#define STATE_MAGIC "fn1"
#define ID_MAX 128
/* Where a backend without the option uid_base looks for a free range of
 * uids: from the historical default up to the VM backend's vm_uid_base. */
#define UID_AUTO_FIRST 1500000000u
#define UID_AUTO_END 1600000000u

/* Not threading: its after-fork hook would run in every call (~95 page
 * faults, ~15% of the calls a node can run per second); a call that imports
 * it pays ~1 ms instead. */
static const char default_preload[] =
    "math,re,json,collections,itertools,functools,heapq,bisect,random,string,time,datetime,"
    "decimal,fractions,statistics,typing,dataclasses,copy,operator,struct,array,traceback,enum";

struct fn {
    struct fn_pools *pools;
    struct fn_call_conf cc;
    char state_dir[PATH_MAX];
    bool temp_state; /* made by us (no state_dir given): removed at fini */
    char sb_dir[PATH_MAX + 16];
    char root_dir[PATH_MAX + 16];
    uint64_t memory_mb;
    uint64_t files_mb;
    int uid_lock;      /* holds the OFD lock on this backend's uid range (claim_uids), or -1 */
    uint32_t uid_base; /* its first uid: the option, or the free range claim_uids picked */
    unsigned uid_count;
    dsec_layer_registry *reg;    /* the cell's, borrowed; NULL: no environments */
    dsec_layer_cache *cache;     /* the node's (shared), when reg is set */
    dsec_net *net;               /* the node's containment, borrowed; NULL: no policies */
    char net_dir[PATH_MAX + 16]; /* <state_dir>/net: the policy of each networked sandbox */
    /* Where a synchronous exec (ops.exec) runs its call: the node's loop, or one of our own
     * opened at the first such exec (own_loop); exec_start uses the loop it is given. */
    pthread_mutex_t loop_mu;
    dsec_loop *loop;
    bool own_loop;
};

struct fn_sb {
    int rt;
    int pool;      /* rt (the host's base), or an environment's pool */
    char *env;     /* the environment's name, or NULL (given as layers, or none) */
    char **layers; /* its layer digests, lowest first */
    size_t nlayers;
    char **vars; /* its variables, "K=V" */
    size_t nvars;
    char **cmd; /* its environment's default command (an image's Entrypoint then Cmd) */
    size_t ncmd;
    struct fn_limits lim;
    uint64_t disk_mb;
    struct fn_files files;
    uint64_t cpu_used_us, calls;
    dsec_net_sbx *net; /* with a network policy: its namespace, veth and rules */
    int netns_fd;      /* that namespace, which each call's W1 joins; -1 without */
    char id[ID_MAX + 1];
};

/* ---- options ---------------------------------------------------------------------------- */

struct opts {
    char zygote[PATH_MAX], python[PATH_MAX], pymod[PATH_MAX];
    unsigned max_workers, warm[FN_RT_COUNT], hot[FN_RT_COUNT], tmpfs_mb, hot_level;
    uint64_t memory_mb, max_timeout_ms, acquire_ms, files_mb;
    uint64_t env_pools, env_warm, env_hot, env_idle_ms, cache_gb;
    uint32_t uid_base;
    bool uid_base_set; /* given: that range or none; unset: the first free one */
    char preload[1024], ro[1024], cgroup[16], prestart[64];
    bool rlimit_as;
    bool favordynmods; /* remount cgroup2 with favordynmods (cgroup-tune.h) */
};

static int opt_u64(const char *key, const char *v, uint64_t min, uint64_t max, uint64_t *out,
                   dsec_err *err)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (v[0] < '0' || v[0] > '9' || *end != '\0' || errno != 0 || x < min || x > max)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "function option %s=\"%s\": expected a whole number %" PRIu64
                            "..%" PRIu64,
                            key, v, min, max);
    *out = x;
    return 0;
}

static int opt_str(const char *key, const char *v, char *out, size_t len, dsec_err *err)
{
    if (strlen(v) >= len)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "function option %s is longer than %zu bytes",
                            key, len - 1);
    memcpy(out, v, strlen(v) + 1);
    return 0;
}

static const char known_opts[] = "zygote, python, python_module, max_workers, pool_python3, "
                                 "pool_sh, pool_native, prestart, tmpfs_mb, memory_mb, "
                                 "hot_python3, hot_sh, hot_native, hot_level, max_timeout_ms, "
                                 "acquire_ms, uid_base, preload, ro, "
                                 "cgroup, rlimit_as, files_mb, cgroup_favordynmods, env_pools, "
                                 "env_warm, env_hot, env_idle_ms, layer_cache_gb";

static int parse_opts(const dsec_backend_config *cfg, struct opts *o, dsec_err *err)
{
    memset(o, 0, sizeof *o);
    o->max_workers = 64;
    o->warm[FN_RT_PYTHON3] = 8;
    o->warm[FN_RT_SH] = 2;
    o->warm[FN_RT_NATIVE] = 2;
    o->tmpfs_mb = 64;
    o->hot_level = 2;
    o->hot[FN_RT_PYTHON3] = 2;
    o->memory_mb = 512;
    o->max_timeout_ms = 600000;
    o->acquire_ms = 30000;
    o->files_mb = 64;
    o->env_pools = 8;
    o->env_warm = 2;
    o->env_hot = 1;
    o->env_idle_ms = 60000;
    o->uid_base = UID_AUTO_FIRST;
    o->favordynmods = true;
    snprintf(o->preload, sizeof o->preload, "%s", default_preload);
    snprintf(o->python, sizeof o->python, "/usr/bin/python3");
    snprintf(o->cgroup, sizeof o->cgroup, "auto");
    for (size_t i = 0; i < cfg->nopts; i++) {
        const char *k = cfg->opts[i].key, *v = cfg->opts[i].value;
        if (k == NULL || v == NULL)
            return dsec_err_set(err, DSEC_E_CONFIG, 0, "function option %zu has no key or value",
                                i);
        bool mine = strncmp(k, "function.", 9) == 0;
        const char *key = mine ? k + 9 : k;
        uint64_t x = 0;
        int rc = 0;
        if (strcmp(key, "zygote") == 0)
            rc = opt_str(k, v, o->zygote, sizeof o->zygote, err);
        else if (strcmp(key, "python") == 0)
            rc = opt_str(k, v, o->python, sizeof o->python, err);
        else if (strcmp(key, "python_module") == 0)
            rc = opt_str(k, v, o->pymod, sizeof o->pymod, err);
        else if (strcmp(key, "max_workers") == 0) {
            rc = opt_u64(k, v, 1, 4096, &x, err);
            o->max_workers = (unsigned)x;
        } else if (strncmp(key, "pool_", 5) == 0 && dsec__fn_runtime_find(key + 5) >= 0) {
            rc = opt_u64(k, v, 0, 4096, &x, err);
            o->warm[dsec__fn_runtime_find(key + 5)] = (unsigned)x;
        } else if (strcmp(key, "prestart") == 0)
            rc = opt_str(k, v, o->prestart, sizeof o->prestart, err);
        else if (strcmp(key, "tmpfs_mb") == 0) {
            rc = opt_u64(k, v, 1, 1u << 20, &x, err);
            o->tmpfs_mb = (unsigned)x;
        } else if (strncmp(key, "hot_", 4) == 0 && dsec__fn_runtime_find(key + 4) >= 0) {
            rc = opt_u64(k, v, 0, 4096, &x, err);
            o->hot[dsec__fn_runtime_find(key + 4)] = (unsigned)x;
        } else if (strcmp(key, "hot_level") == 0) {
            rc = opt_u64(k, v, 1, 2, &x, err);
            o->hot_level = (unsigned)x;
        } else if (strcmp(key, "memory_mb") == 0)
            rc = opt_u64(k, v, 8, 1u << 20, &o->memory_mb, err);
        else if (strcmp(key, "max_timeout_ms") == 0)
            rc = opt_u64(k, v, 1, 7ull * 24 * 3600 * 1000, &o->max_timeout_ms, err);
        else if (strcmp(key, "acquire_ms") == 0)
            rc = opt_u64(k, v, 1, 3600000, &o->acquire_ms, err);
        else if (strcmp(key, "files_mb") == 0)
            rc = opt_u64(k, v, 1, 1u << 20, &o->files_mb, err);
        else if (strcmp(key, "env_pools") == 0)
            rc = opt_u64(k, v, 0, 256, &o->env_pools, err);
        else if (strcmp(key, "env_warm") == 0)
            rc = opt_u64(k, v, 0, 4096, &o->env_warm, err);
        else if (strcmp(key, "env_hot") == 0)
            rc = opt_u64(k, v, 0, 4096, &o->env_hot, err);
        else if (strcmp(key, "env_idle_ms") == 0)
            rc = opt_u64(k, v, 0, 7ull * 24 * 3600 * 1000, &o->env_idle_ms, err);
        else if (strcmp(key, "layer_cache_gb") == 0)
            rc = opt_u64(k, v, 0, 1u << 20, &o->cache_gb, err);
        else if (strcmp(key, "uid_base") == 0) {
            rc = opt_u64(k, v, 1000, 0xffffffffull - 70000, &x, err);
            o->uid_base = (uint32_t)x;
            o->uid_base_set = true;
        } else if (strcmp(key, "preload") == 0)
            rc = opt_str(k, v, o->preload, sizeof o->preload, err);
        else if (strcmp(key, "ro") == 0)
            rc = opt_str(k, v, o->ro, sizeof o->ro, err);
        else if (strcmp(key, "cgroup") == 0)
            rc = opt_str(k, v, o->cgroup, sizeof o->cgroup, err);
        else if (strcmp(key, "rlimit_as") == 0)
            rc = dsec_backend_opt_bool(k, v, &o->rlimit_as, err);
        else if (strcmp(key, "cgroup_favordynmods") == 0)
            rc = dsec_backend_opt_bool(k, v, &o->favordynmods, err);
        else if (mine)
            rc = dsec_err_set(err, DSEC_E_CONFIG, 0, "unknown function option %s (known: %s)", k,
                              known_opts);
        /* else: another backend's option */
        if (rc < 0)
            return -1;
    }
    unsigned sum = 0;
    for (int rt = 0; rt < FN_RT_COUNT; rt++)
        sum += o->warm[rt];
    if (sum > o->max_workers)
        return dsec_err_set(
            err, DSEC_E_CONFIG, 0,
            "function options: the pools keep %u warm workers but max_workers is %u", sum,
            o->max_workers);
    if ((uint64_t)o->uid_base + o->max_workers > 0xfffffffeull)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "function option uid_base: uid_base + max_workers overflows");
    char ro[1024];
    snprintf(ro, sizeof ro, "%s", o->ro);
    for (char *save = NULL, *t = strtok_r(ro, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (t[0] != '/' || strstr(t, "/..") != NULL)
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "function option ro: \"%s\" is not an absolute normal path", t);
    return 0;
}

/* A helper file: the option, the one this build made, or next to the
 * program (and where an install puts it). */
static int find_helper(const char *opt_name, const char *opt, const char *built, const char *name,
                       bool exec, char *out, size_t len, dsec_err *err)
{
    if (opt[0] != '\0') {
        if (access(opt, exec ? X_OK : R_OK) != 0)
            return dsec_err_set(err, DSEC_E_CONFIG, errno, "function option %s=%s: %s", opt_name,
                                opt, strerror(errno));
        return snprintf(out, len, "%s", opt) < (int)len
                   ? 0
                   : dsec_err_set(err, DSEC_E_CONFIG, 0, "function option %s: path too long",
                                  opt_name);
    }
    if (built[0] != '\0' && access(built, exec ? X_OK : R_OK) == 0 &&
        snprintf(out, len, "%s", built) < (int)len)
        return 0;
    char self[PATH_MAX], cand[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash != NULL)
            *slash = '\0';
        static const char *const rel[] = {"/", "/../libexec/dsec/", "/../backends/"};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            snprintf(cand, sizeof cand, "%s%s%s", self, rel[i], name);
            if (access(cand, exec ? X_OK : R_OK) == 0 && snprintf(out, len, "%s", cand) < (int)len)
                return 0;
        }
    }
    return dsec_err_set(err, DSEC_E_CONFIG, 0,
                        "function: %s was not found (built at \"%s\", or next to this program); "
                        "set the function option %s=PATH",
                        name, built, opt_name);
}

/* ---- init / fini -------------------------------------------------------------------------- */

/* Calls run as uid_base + slot, so two backends on one host given overlapping
 * ranges (two node managers, two cells, two test runs) would run calls under
 * the same uids: one call could signal or ptrace-attach another's, and
 * RLIMIT_NPROC would count both. So a backend claims its range for as long as
 * it lives: an open-file-description lock on bytes [uid_base, uid_base +
 * max_workers) of one file per host. The kernel drops it when the backend's
 * process dies, however it dies.
 *
 * Without the option uid_base, a backend takes the first free range from
 * UID_AUTO_FIRST on, so any number of cells can share a host with no setting
 * (a call's uid is its own for the call only: nothing on disk keeps it, so
 * the range may differ from one start to the next). The automatic ranges end
 * where the VM backend's QEMU uids start (vm_uid_base, docs/vm.md). A given
 * uid_base is that range or nothing: a clash is an error that says what to
 * set. */
#define UID_LOCK_FILE "/run/dsec/function-uids.lock"

/* The lock in the way of [base, base + n), or false when there is none now. */
static bool uid_lock_in_way(int fd, uint32_t base, unsigned n, uint64_t *first, uint64_t *end)
{
    struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = base, .l_len = n};
    if (fcntl(fd, F_OFD_GETLK, &q) < 0 || q.l_type == F_UNLCK)
        return false;
    *first = (uint64_t)q.l_start;
    *end = q.l_len == 0 ? UINT64_MAX : (uint64_t)q.l_start + (uint64_t)q.l_len;
    return true;
}

/* The first automatic range of n uids no backend holds now, or 0. */
static uint32_t uid_free_range(int fd, unsigned n)
{
    uint64_t b = UID_AUTO_FIRST, first, end;
    while (b + n <= UID_AUTO_END) {
        if (!uid_lock_in_way(fd, (uint32_t)b, n, &first, &end))
            return (uint32_t)b;
        b = end > b ? end : b + 1;
    }
    return 0;
}

static int claim_uids(struct fn *f, uint32_t base, unsigned n, bool pick, dsec_err *err)
{
    if ((mkdir("/run", 0755) < 0 && errno != EEXIST) ||
        (mkdir("/run/dsec", 0755) < 0 && errno != EEXIST))
        return dsec_err_set(err, DSEC_E_IO, errno, "function: creating /run/dsec");
    int fd = open(UID_LOCK_FILE, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "function: opening %s", UID_LOCK_FILE);
    uint64_t b = base, first = 0, end = 0;
    /* Each round either takes a range or moves past a lock another backend
     * holds; a lock that went between the two calls costs a round. */
    for (unsigned round = 0; round < 100000 && b + n <= (pick ? UID_AUTO_END : 0xffffffffull);
         round++) {
        struct flock l = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (off_t)b, .l_len = n};
        if (fcntl(fd, F_OFD_SETLK, &l) == 0) {
            f->uid_lock = fd;
            f->uid_base = (uint32_t)b;
            f->uid_count = n;
            return 0;
        }
        int e = errno;
        if (e != EAGAIN && e != EACCES) {
            close(fd);
            return dsec_err_set(err, DSEC_E_IO, e,
                                "function: locking uids %" PRIu64 "..%" PRIu64 " in %s", b,
                                b + n - 1, UID_LOCK_FILE);
        }
        if (!uid_lock_in_way(fd, (uint32_t)b, n, &first, &end))
            continue;
        if (!pick)
            break;
        b = end > b ? end : b + 1;
    }
    if (pick) {
        close(fd);
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "function: no range of %u free uids (max_workers) is left in "
                            "%u..%u: other function backends on this host hold them all; set "
                            "function.uid_base to a free range outside it",
                            n, UID_AUTO_FIRST, UID_AUTO_END - 1);
    }
    uint32_t free_base = uid_free_range(fd, n);
    close(fd);
    if (end == 0) /* every round saw a lock that was gone when asked about */
        return dsec_err_set(err, DSEC_E_IO, EAGAIN,
                            "function: uids %" PRIu32 "..%" PRIu32 " could not be locked in %s: "
                            "other backends kept taking and dropping them; try again",
                            base, base + n - 1, UID_LOCK_FILE);
    char hint[96] = "";
    if (free_base != 0)
        snprintf(hint, sizeof hint, " (%" PRIu32 " is free now)", free_base);
    return dsec_err_set(err, DSEC_E_CONFIG, 0,
                        "function: uids %" PRIu32 "..%" PRIu32 " (uid_base + max_workers) overlap "
                        "uids %" PRIu64 "..%" PRIu64 " of another function backend alive on this "
                        "host (another cell's or node manager's, or a test run's); give this node "
                        "its own range with the option function.uid_base%s, or leave it unset to "
                        "have a free range picked",
                        base, base + n - 1, first, end - 1, hint);
}

static void fn_fini(void *self)
{
    struct fn *f = self;
    if (f == NULL)
        return;
    if (f->own_loop)
        dsec_loop_free(f->loop); /* before the pools: a call still there hands its worker back */
    pthread_mutex_destroy(&f->loop_mu);
    dsec__fn_pools_free(f->pools); /* lets its environments' layers go */
    dsec_layer_cache_free(f->cache);
    if (f->uid_lock >= 0)
        close(f->uid_lock);
    rmdir(f->root_dir);
    if (f->temp_state) {
        dsec_err e;
        dsec__fn_files_remove(f->sb_dir, &e);
        dsec__fn_files_remove(f->net_dir, &e);
        rmdir(f->state_dir);
    }
    dsec_free(f);
}

/* The zygote program and the python3 zygote's module (into pymod: its directory, which python
 * imports it from), and the python they run. */
static int helpers_find(const struct opts *o, char *zygote, size_t zlen, char *pymod, size_t plen,
                        dsec_err *err)
{
    if (find_helper("zygote", o->zygote, DSEC_FN_ZYGOTE_PATH, "dsec-fn-zygote", true, zygote, zlen,
                    err) < 0 ||
        find_helper("python_module", o->pymod, DSEC_FN_PYMOD_PATH, "_dsec_fnz.so", false, pymod,
                    plen, err) < 0)
        return -1;
    if (access(o->python, X_OK) != 0)
        return dsec_err_set(err, DSEC_E_CONFIG, errno, "function option python=%s: %s", o->python,
                            strerror(errno));
    char *slash = strrchr(pymod, '/');
    if (slash == NULL || strcmp(slash, "/_dsec_fnz.so") != 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "function option python_module=%s: the file must be named "
                            "_dsec_fnz.so",
                            pymod);
    *slash = '\0'; /* python imports it from its directory */
    return 0;
}

/* The state directory (the configured one, or a fresh one in /tmp) and its subdirectories. */
static int state_dirs(struct fn *f, const dsec_backend_config *cfg, dsec_err *err)
{
    if (cfg->state_dir != NULL && cfg->state_dir[0] != '\0') {
        if (mkdir(cfg->state_dir, 0700) < 0 && errno != EEXIST)
            return dsec_err_set(err, DSEC_E_IO, errno, "function: creating %s", cfg->state_dir);
        if (realpath(cfg->state_dir, f->state_dir) == NULL)
            return dsec_err_set(err, DSEC_E_IO, errno, "function: resolving %s", cfg->state_dir);
    } else {
        snprintf(f->state_dir, sizeof f->state_dir, "/tmp/dsec-fn-XXXXXX");
        if (mkdtemp(f->state_dir) == NULL)
            return dsec_err_set(err, DSEC_E_IO, errno,
                                "function: creating a state directory in /tmp");
        f->temp_state = true;
    }
    snprintf(f->sb_dir, sizeof f->sb_dir, "%s/sandboxes", f->state_dir);
    snprintf(f->root_dir, sizeof f->root_dir, "%s/root", f->state_dir);
    snprintf(f->net_dir, sizeof f->net_dir, "%s/net", f->state_dir);
    if ((mkdir(f->sb_dir, 0700) < 0 && errno != EEXIST) ||
        (mkdir(f->root_dir, 0755) < 0 && errno != EEXIST) ||
        (mkdir(f->net_dir, 0700) < 0 && errno != EEXIST))
        return dsec_err_set(err, DSEC_E_IO, errno, "function: creating directories in %s",
                            f->state_dir);
    return 0;
}

/* The pools, configured from the options. */
static int pools_make(struct fn *f, const dsec_backend_config *cfg, const struct opts *o,
                      char *zygote, char *pymod, dsec_err *err)
{
    struct fn_pool_conf pc = {
        .zygote_path = zygote,
        .python = o->python,
        .pymod_dir = pymod,
        .root_dir = f->root_dir,
        .node = cfg->node,
        .max_workers = o->max_workers,
        .tmpfs_mb = o->tmpfs_mb,
        .hot_level = o->hot_level,
        .uid_base = f->uid_base,
        .preload = o->preload,
        .ro_paths = o->ro,
        .cgroup = o->cgroup,
        .env_pools = (unsigned)o->env_pools,
        .env_idle_ms = o->env_idle_ms,
        .cache = f->cache,
    };
    memcpy(pc.warm, o->warm, sizeof pc.warm);
    memcpy(pc.hot, o->hot, sizeof pc.hot);
    for (int rt = 0; rt < FN_RT_COUNT; rt++)
        pc.env_warm[rt] = (unsigned)o->env_warm;
    pc.env_hot[FN_RT_PYTHON3] = (unsigned)o->env_hot; /* only python3 has a runtime to warm */
    return dsec__fn_pools_new(&f->pools, &pc, err);
}

/* Start the pools the prestart option names. */
static int prestart(struct fn *f, const struct opts *o, dsec_err *err)
{
    char pre[64];
    snprintf(pre, sizeof pre, "%s", o->prestart);
    for (char *save = NULL, *t = strtok_r(pre, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int rt = dsec__fn_runtime_find(t);
        if (rt < 0)
            return dsec_err_set(
                err, DSEC_E_CONFIG, 0,
                "function option prestart: unknown runtime \"%s\" (known: python3, sh, native)", t);
        if (dsec__fn_pools_start(f->pools, rt, 30000, err) < 0)
            return -1;
    }
    return 0;
}

static int fn_init(void **self, const dsec_backend_config *cfg, dsec_err *err)
{
    struct opts o;
    if (parse_opts(cfg, &o, err) < 0)
        return -1;
    if (geteuid() != 0)
        return dsec_err_set(
            err, DSEC_E_CONFIG, EPERM,
            "function sandboxes need root (namespaces, mounts and cgroups per call)");
    dsec_cgroup_tune_apply(o.favordynmods, "function");
    struct fn *f = dsec_calloc(1, sizeof *f);
    if (f == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: allocating the backend");
    f->uid_lock = -1;
    pthread_mutex_init(&f->loop_mu, NULL);
    f->loop = cfg->loop;
    if (claim_uids(f, o.uid_base, o.max_workers, !o.uid_base_set, err) < 0)
        goto out_free;
    char zygote[PATH_MAX], pymod[PATH_MAX];
    if (helpers_find(&o, zygote, sizeof zygote, pymod, sizeof pymod, err) < 0 ||
        state_dirs(f, cfg, err) < 0)
        goto out_free;
    f->memory_mb = o.memory_mb;
    f->files_mb = o.files_mb;
    f->cc.max_timeout_ms = o.max_timeout_ms;
    f->cc.acquire_ms = o.acquire_ms;
    f->cc.use_rlimit_as = o.rlimit_as;
    f->reg = cfg->layers;
    f->net = cfg->net;
    if (f->reg != NULL &&
        dsec_backend_layer_cache(cfg, f->state_dir, o.cache_gb << 30, &f->cache, err) < 0) {
        dsec_err_wrap(err, "function");
        goto out_free;
    }
    if (pools_make(f, cfg, &o, zygote, pymod, err) < 0)
        goto out_free;
    if (prestart(f, &o, err) < 0)
        goto out_fini;
    *self = f;
    return 0;

out_fini:
    fn_fini(f);
    return -1;
out_free:
    dsec_layer_cache_free(f->cache);
    if (f->temp_state)
        rmdir(f->state_dir);
    if (f->uid_lock >= 0)
        close(f->uid_lock);
    pthread_mutex_destroy(&f->loop_mu);
    dsec_free(f);
    return -1;
}

/* ---- sandboxes ----------------------------------------------------------------------------- */

static int label_u64(const char *key, const char *v, uint64_t min, uint64_t max, uint64_t *out,
                     dsec_err *err)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (v[0] < '0' || v[0] > '9' || *end != '\0' || errno != 0 || x < min || x > max)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "function sandbox label %s=\"%s\": expected a whole number %" PRIu64
                            "..%" PRIu64,
                            key, v, min, max);
    *out = x;
    return 0;
}

static int parse_spec(const struct fn *f, const dsec_sandbox_spec *spec, struct fn_sb *sb,
                      dsec_err *err)
{
    if (spec->nnet > 0 && f->net == NULL)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "function: this node has no network containment configured (the "
                            "cell's net: section), so it cannot apply a network policy");
    size_t idlen = spec->id ? strlen(spec->id) : 0;
    if (idlen == 0 || idlen > ID_MAX || spec->id[0] == '.')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "function: bad sandbox id");
    for (size_t i = 0; i < idlen; i++) {
        char c = spec->id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return dsec_err_set(
                err, DSEC_E_INVALID, 0,
                "function: sandbox id \"%s\" has a character outside A-Z a-z 0-9 . _ -", spec->id);
    }
    memcpy(sb->id, spec->id, idlen + 1);
    sb->rt = FN_RT_PYTHON3;
    sb->lim.memory_mb = spec->memory_mb ? spec->memory_mb : f->memory_mb;
    sb->lim.nproc = 64;
    sb->lim.nofile = 1024;
    sb->disk_mb = spec->disk_mb ? spec->disk_mb : f->files_mb;
    for (size_t i = 0; i < spec->nlabels; i++) {
        const char *k = spec->labels[i].key, *v = spec->labels[i].value;
        if (k == NULL || v == NULL)
            continue;
        uint64_t x = 0;
        if (strcmp(k, "runtime") == 0) {
            sb->rt = dsec__fn_runtime_find(v);
            if (sb->rt < 0)
                return dsec_err_set(
                    err, DSEC_E_INVALID, 0,
                    "function sandbox label runtime=\"%s\": expected python3, sh or native", v);
        } else if (strcmp(k, "cpu_ms") == 0) {
            if (label_u64(k, v, 1, 24ull * 3600 * 1000, &sb->lim.cpu_ms, err) < 0)
                return -1;
        } else if (strcmp(k, "timeout_ms") == 0) {
            if (label_u64(k, v, 1, 7ull * 24 * 3600 * 1000, &sb->lim.timeout_ms, err) < 0)
                return -1;
        } else if (strcmp(k, "nproc") == 0) {
            if (label_u64(k, v, 1, 65536, &x, err) < 0)
                return -1;
            sb->lim.nproc = (uint32_t)x;
        } else if (strcmp(k, "fsize_mb") == 0) {
            if (label_u64(k, v, 1, 1u << 20, &sb->lim.fsize_mb, err) < 0)
                return -1;
        } else if (strcmp(k, "nofile") == 0) {
            if (label_u64(k, v, 16, 1u << 20, &x, err) < 0)
                return -1;
            sb->lim.nofile = (uint32_t)x;
        }
    }
    return 0;
}

/* "fn1;rt=...;id=ID", then for a sandbox in an environment
 * ";layers=D1,D2" (lowest first) and ";env=NAME" when it was named. */
static int state_string(const struct fn_sb *sb, char **out, dsec_err *err)
{
    size_t len = 512 + (sb->env ? strlen(sb->env) : 0) + sb->nlayers * (DSEC_DIGEST_STRLEN + 1);
    char *buf = dsec_malloc(len);
    if (buf == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: allocating backend_state");
    int n = snprintf(
        buf, len,
        STATE_MAGIC ";rt=%s;mem=%" PRIu64 ";cpu=%" PRIu64 ";timeout=%" PRIu64 ";fsize=%" PRIu64
                    ";nproc=%" PRIu32 ";nofile=%" PRIu32 ";disk=%" PRIu64 ";id=%s",
        dsec__fn_runtime_name(sb->rt), sb->lim.memory_mb, sb->lim.cpu_ms, sb->lim.timeout_ms,
        sb->lim.fsize_mb, sb->lim.nproc, sb->lim.nofile, sb->disk_mb, sb->id);
    for (size_t i = 0; i < sb->nlayers && n > 0 && (size_t)n < len; i++)
        n += snprintf(buf + n, len - (size_t)n, "%s%s", i == 0 ? ";layers=" : ",", sb->layers[i]);
    if (sb->env != NULL && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, ";env=%s", sb->env);
    if (n < 0 || (size_t)n >= len) {
        dsec_free(buf);
        return dsec_err_set(err, DSEC_E_INTERNAL, 0, "function: backend_state does not fit");
    }
    *out = buf;
    return 0;
}

static void strv_free(char **v, size_t n)
{
    for (size_t i = 0; v != NULL && i < n; i++)
        dsec_free(v[i]);
    dsec_free(v);
}

static int strv_copy(char *const *src, size_t n, char ***out, dsec_err *err)
{
    *out = NULL;
    if (n == 0)
        return 0;
    char **v = dsec_calloc(n, sizeof *v);
    for (size_t i = 0; v != NULL && i < n; i++)
        if ((v[i] = dsec_strdup(src[i])) == NULL) {
            strv_free(v, i);
            v = NULL;
        }
    if (v == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: copying an environment");
    *out = v;
    return 0;
}

static void sb_free(struct fn_sb *sb)
{
    dsec_free(sb->env);
    strv_free(sb->layers, sb->nlayers);
    strv_free(sb->vars, sb->nvars);
    strv_free(sb->cmd, sb->ncmd);
    dsec_free(sb);
}

/* The sandbox's environment: by name from the cell's registry (its layers
 * and variables), or as the layers the request names. Neither: the host's
 * base. layers, when given, is what the node resolved the name to. */
static int sb_env(struct fn *f, struct fn_sb *sb, const char *name, const char *const *layers,
                  size_t nlayers, dsec_err *err)
{
    bool named = name != NULL && name[0] != '\0';
    if (!named && nlayers == 0)
        return 0;
    if (f->reg == NULL)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "function: environment %s: this node has no layer registry, so its "
                            "function sandboxes run on the host's /usr and /etc only",
                            named ? name : "(layers)");
    if (named) {
        dsec_env *d = NULL;
        if (dsec_layer_registry_env_get(f->reg, name, &d, err) < 0)
            return dsec_err_wrap(err, "function: environment %s", name);
        int rc = strv_copy(d->vars, d->nvars, &sb->vars, err);
        sb->nvars = rc == 0 ? d->nvars : 0;
        if (rc == 0 && (rc = strv_copy(d->cmd, d->ncmd, &sb->cmd, err)) == 0)
            sb->ncmd = d->ncmd;
        if (rc == 0 && nlayers == 0) {
            rc = strv_copy(d->layers, d->nlayers, &sb->layers, err);
            sb->nlayers = rc == 0 ? d->nlayers : 0;
        }
        dsec_env_free(d);
        if (rc < 0)
            return -1;
        if ((sb->env = dsec_strdup(name)) == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: copying an environment");
        for (size_t i = 0; i < sb->nvars; i++)
            if (strchr(sb->vars[i], '=') == NULL || sb->vars[i][0] == '=')
                return dsec_err_set(err, DSEC_E_INVALID, 0,
                                    "function: environment %s: variable \"%s\" is not KEY=VALUE",
                                    name, sb->vars[i]);
    }
    if (nlayers > 0) {
        if (strv_copy((char *const *)layers, nlayers, &sb->layers, err) < 0)
            return -1;
        sb->nlayers = nlayers;
    }
    for (size_t i = 0; i < sb->nlayers; i++) {
        size_t n = strlen(sb->layers[i]);
        if (n != DSEC_DIGEST_STRLEN || strncmp(sb->layers[i], "sha256:", 7) != 0 ||
            strspn(sb->layers[i] + 7, "0123456789abcdef") != n - 7)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "function: environment %s: layer \"%s\" is not a sha256 digest",
                                named ? name : "(layers)", sb->layers[i]);
    }
    char what[160];
    if (named)
        snprintf(what, sizeof what, "%s", name);
    else
        snprintf(what, sizeof what, "%zu layers", sb->nlayers);
    return dsec__fn_pools_env_get(f->pools, sb->rt, (const char *const *)sb->layers, sb->nlayers,
                                  what, 30000, &sb->pool, err);
}

static void sb_dir(const struct fn *f, const char *id, char *out, size_t len)
{
    if (snprintf(out, len, "%s/%s", f->sb_dir, id) >= (int)len)
        out[0] = '\0'; /* cannot happen: the buffers hold sb_dir + ID_MAX */
}

/* The environment part of a backend_state (after the id): its layers and,
 * when named, the name, whose variables come from the registry again. */
static int state_env(struct fn *f, struct fn_sb *sb, const char *rest, dsec_err *err)
{
    if (rest[0] == '\0')
        return 0;
    if (strncmp(rest, ";layers=", 8) != 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "function: backend_state ends in \"%.80s\", not one this backend wrote",
                            rest);
    rest += 8;
    const char *env = strstr(rest, ";env=");
    size_t llen = env ? (size_t)(env - rest) : strlen(rest);
    char *list = dsec_malloc(llen + 1);
    const char *digests[FN_ENV_LAYERS_MAX];
    size_t n = 0;
    if (list == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: adopting a sandbox");
    memcpy(list, rest, llen);
    list[llen] = '\0';
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        if (n == FN_ENV_LAYERS_MAX) {
            dsec_free(list);
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "function: backend_state names more than %d layers",
                                FN_ENV_LAYERS_MAX);
        }
        digests[n++] = t;
    }
    int rc = sb_env(f, sb, env ? env + 5 : NULL, digests, n, err);
    dsec_free(list);
    return rc;
}

/* ---- a sandbox's network (backends/net/net.h) -------------------------------------------- */

/* A sandbox created with a network policy holds a network of the node's
 * containment, as a container does: its own namespace, veth, rules and
 * resolver view. Its calls join that namespace (function-pool.c makes a
 * worker for each such call). What adopt needs after a restart, and the
 * policy as last set, live in <state_dir>/net/<id>: the handle's state on
 * the first line, the tenant on the second, then one entry per line. */

static void net_record_path(const struct fn *f, const char *id, char *out, size_t len)
{
    if (snprintf(out, len, "%s/%s", f->net_dir, id) >= (int)len)
        out[0] = '\0'; /* cannot happen: the buffers hold net_dir + ID_MAX */
}

static int net_record_write(const struct fn *f, const struct fn_sb *sb, const char *tenant,
                            const char *const *entries, size_t n, dsec_err *err)
{
    char path[PATH_MAX + ID_MAX + 24], tmp[PATH_MAX + ID_MAX + 32];
    net_record_path(f, sb->id, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (tenant != NULL && strchr(tenant, '\n') != NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "function: the tenant has a newline");
    for (size_t i = 0; i < n; i++)
        if (entries[i] == NULL || strchr(entries[i], '\n') != NULL)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "function: network policy entry %zu has a newline", i);
    FILE *fp = fopen(tmp, "we");
    if (fp == NULL)
        return dsec_err_set(err, DSEC_E_IO, errno, "function: writing %s", tmp);
    fprintf(fp, "%s\n%s\n", dsec_net_sbx_state(sb->net), tenant != NULL ? tenant : "");
    for (size_t i = 0; i < n; i++)
        fprintf(fp, "%s\n", entries[i]);
    bool ok = fflush(fp) == 0 && fsync(fileno(fp)) == 0;
    int e = errno;
    if (fclose(fp) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (!ok || rename(tmp, path) < 0) {
        e = ok ? errno : e;
        unlink(tmp);
        return dsec_err_set(err, DSEC_E_IO, e, "function: writing %s", path);
    }
    return 0;
}

/* Open the namespace the calls join. */
static int net_open(struct fn_sb *sb, dsec_err *err)
{
    sb->netns_fd = open(dsec_net_sbx_netns(sb->net), O_RDONLY | O_CLOEXEC);
    if (sb->netns_fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "function: opening the network namespace %s",
                            dsec_net_sbx_netns(sb->net));
    return 0;
}

static int net_attach(struct fn *f, struct fn_sb *sb, const dsec_sandbox_spec *spec, dsec_err *err)
{
    if (spec->nnet == 0)
        return 0;
    if (dsec_net_attach(f->net, sb->id, spec->tenant, spec->net, spec->nnet, &sb->net, err) < 0)
        return dsec_err_wrap(err, "function: its network");
    if (net_open(sb, err) < 0 ||
        net_record_write(f, sb, spec->tenant, spec->net, spec->nnet, err) < 0) {
        dsec_err e;
        if (sb->netns_fd >= 0)
            close(sb->netns_fd);
        sb->netns_fd = -1;
        dsec_net_detach(sb->net, &e);
        sb->net = NULL;
        return -1;
    }
    return 0;
}

/* Remove the network and its record. On failure the sandbox keeps it. */
static int net_detach(struct fn *f, struct fn_sb *sb, dsec_err *err)
{
    if (sb->net == NULL)
        return 0;
    if (sb->netns_fd >= 0)
        close(sb->netns_fd); /* so the namespace goes with its file */
    sb->netns_fd = -1;
    if (dsec_net_detach(sb->net, err) < 0) {
        dsec_err e;
        net_open(sb, &e);
        return dsec_err_wrap(err, "function: removing its network");
    }
    sb->net = NULL;
    char path[PATH_MAX + ID_MAX + 24];
    net_record_path(f, sb->id, path, sizeof path);
    unlink(path);
    return 0;
}

/* After a restart: the namespace and veth outlived the node manager and
 * the node's table was rebuilt, so the rules go back in. No record: the
 * sandbox had no network. */
static int net_adopt(struct fn *f, struct fn_sb *sb, dsec_err *err)
{
    char path[PATH_MAX + ID_MAX + 24];
    net_record_path(f, sb->id, path, sizeof path);
    FILE *fp = fopen(path, "re");
    if (fp == NULL)
        return errno == ENOENT ? 0
                               : dsec_err_set(err, DSEC_E_IO, errno, "function: reading %s", path);
    char *line = NULL, *state = NULL, *tenant = NULL;
    char **entries = NULL;
    size_t cap = 0, n = 0, k = 0;
    ssize_t len;
    int rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, fp)) >= 0) {
        if (len > 0 && line[len - 1] == '\n')
            line[len - 1] = '\0';
        char *copy = dsec_strdup(line);
        char **grown = k >= 2 ? dsec_realloc(entries, (n + 1) * sizeof *entries) : entries;
        if (copy == NULL || (k >= 2 && grown == NULL)) {
            dsec_free(copy);
            rc = dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: adopting its network");
            break;
        }
        if (k == 0)
            state = copy;
        else if (k == 1)
            tenant = copy;
        else
            (entries = grown)[n++] = copy;
        k++;
    }
    free(line);
    fclose(fp);
    if (rc == 0 && k < 2)
        rc = dsec_err_set(err, DSEC_E_INVALID, 0, "function: %s is not a network record", path);
    if (rc == 0 && f->net == NULL)
        rc = dsec_err_set(err, DSEC_E_CONFIG, 0,
                          "function: the sandbox had network containment and the node now has "
                          "none");
    if (rc == 0 && dsec_net_adopt(f->net, sb->id, tenant[0] ? tenant : NULL, state,
                                  (const char *const *)entries, n, &sb->net, err) < 0)
        rc = dsec_err_wrap(err, "function: adopting its network");
    if (rc == 0 && net_open(sb, err) < 0) {
        dsec_net_release(sb->net);
        sb->net = NULL;
        rc = -1;
    }
    strv_free(entries, n);
    dsec_free(state);
    dsec_free(tenant);
    return rc;
}

static int fn_net_set(void *self, dsec_sandbox *h, const char *const *entries, size_t n,
                      dsec_err *err)
{
    struct fn *f = self;
    struct fn_sb *sb = (struct fn_sb *)(void *)h;
    if (sb->net == NULL)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "function: this sandbox was created without a network policy, so its "
                            "calls have no network to change (create it with one)");
    if (dsec_net_set(sb->net, entries, n, err) < 0)
        return -1;
    /* remembered for adoption after a restart */
    char path[PATH_MAX + ID_MAX + 24], tenant[256] = "";
    net_record_path(f, sb->id, path, sizeof path);
    FILE *fp = fopen(path, "re");
    if (fp != NULL) {
        char skip[256];
        if (fgets(skip, sizeof skip, fp) == NULL || fgets(tenant, sizeof tenant, fp) == NULL)
            tenant[0] = '\0';
        tenant[strcspn(tenant, "\n")] = '\0';
        fclose(fp);
    }
    if (net_record_write(f, sb, tenant[0] ? tenant : NULL, entries, n, err) < 0)
        return dsec_err_wrap(err, "function: the policy is applied but not recorded");
    return 0;
}

static int fn_create(void *self, const dsec_sandbox_spec *spec, dsec_sandbox **out,
                     char **backend_state, dsec_err *err)
{
    struct fn *f = self;
    struct fn_sb *sb = dsec_calloc(1, sizeof *sb);
    char dir[PATH_MAX + ID_MAX + 2];
    if (sb == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: allocating a sandbox");
    sb->files.dirfd = sb->files.bundle_fd = -1;
    sb->netns_fd = -1;
    if (parse_spec(f, spec, sb, err) < 0)
        goto out_free;
    /* The pool first: a runtime that cannot start fails the create, clearly. */
    sb->pool = sb->rt;
    if (sb_env(f, sb, spec->env, spec->layers, spec->nlayers, err) < 0 ||
        dsec__fn_pools_start(f->pools, sb->pool, 30000, err) < 0)
        goto out_free;
    sb_dir(f, sb->id, dir, sizeof dir);
    if (dsec__fn_files_open(&sb->files, dir, true, sb->disk_mb << 20, 65536, err) < 0)
        goto out_free;
    if (net_attach(f, sb, spec, err) < 0 || state_string(sb, backend_state, err) < 0) {
        dsec_err e;
        net_detach(f, sb, &e);
        dsec__fn_files_close(&sb->files);
        dsec__fn_files_remove(dir, &e);
        goto out_free;
    }
    *out = (dsec_sandbox *)(void *)sb;
    return 0;

out_free:
    dsec__fn_pools_env_put(f->pools, sb->pool);
    sb_free(sb);
    return -1;
}

static int fn_destroy(void *self, dsec_sandbox *h, dsec_err *err)
{
    struct fn *f = self;
    struct fn_sb *sb = (struct fn_sb *)(void *)h;
    char dir[PATH_MAX + ID_MAX + 2];
    sb_dir(f, sb->id, dir, sizeof dir);
    if (net_detach(f, sb, err) < 0)
        return -1; /* the handle stays usable, network and all */
    dsec__fn_files_close(&sb->files);
    if (dsec__fn_files_remove(dir, err) < 0) {
        /* keep the handle usable, as the contract asks */
        dsec_err e;
        dsec__fn_files_open(&sb->files, dir, false, sb->disk_mb << 20, 65536, &e);
        return -1;
    }
    dsec__fn_pools_env_put(f->pools, sb->pool);
    sb_free(sb);
    return 0;
}

static void fn_detach(void *self, dsec_sandbox *h)
{
    struct fn *f = self;
    struct fn_sb *sb = (struct fn_sb *)(void *)h;
    if (sb->netns_fd >= 0)
        close(sb->netns_fd);
    dsec_net_release(sb->net); /* the namespace stays for a later adopt */
    dsec__fn_files_close(&sb->files);
    dsec__fn_pools_env_put(f->pools, sb->pool);
    sb_free(sb);
}

static int fn_adopt(void *self, const dsec_sandbox_spec *spec, const char *state,
                    dsec_sandbox **out, dsec_err *err)
{
    struct fn *f = self;
    struct fn_sb *sb = dsec_calloc(1, sizeof *sb);
    if (sb == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "function: adopting a sandbox");
    sb->netns_fd = -1;
    char rt[16];
    int used = 0;
    if (sscanf(state,
               STATE_MAGIC ";rt=%15[^;];mem=%" SCNu64 ";cpu=%" SCNu64 ";timeout=%" SCNu64
                           ";fsize=%" SCNu64 ";nproc=%" SCNu32 ";nofile=%" SCNu32 ";disk=%" SCNu64
                           ";id=%128[A-Za-z0-9._-]%n",
               rt, &sb->lim.memory_mb, &sb->lim.cpu_ms, &sb->lim.timeout_ms, &sb->lim.fsize_mb,
               &sb->lim.nproc, &sb->lim.nofile, &sb->disk_mb, sb->id, &used) != 9 ||
        (state[used] != '\0' && state[used] != ';') || (sb->rt = dsec__fn_runtime_find(rt)) < 0 ||
        sb->id[0] == '.') {
        dsec_free(sb);
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "function: backend_state \"%.80s\" is not one this backend wrote",
                            state);
    }
    if (spec != NULL && spec->id != NULL && strcmp(spec->id, sb->id) != 0) {
        dsec_err_set(err, DSEC_E_INVALID, 0, "function: backend_state is for sandbox %s, not %s",
                     sb->id, spec->id);
        dsec_free(sb);
        return -1;
    }
    sb->pool = sb->rt;
    if (state_env(f, sb, state + used, err) < 0) {
        dsec_err_wrap(err, "function: re-adopting %s", sb->id);
        dsec__fn_pools_env_put(f->pools, sb->pool);
        sb_free(sb);
        return -1;
    }
    char dir[PATH_MAX + ID_MAX + 2];
    sb_dir(f, sb->id, dir, sizeof dir);
    if (dsec__fn_files_open(&sb->files, dir, false, sb->disk_mb << 20, 65536, err) < 0) {
        dsec_err_wrap(err, "function: re-adopting %s", sb->id);
        dsec__fn_pools_env_put(f->pools, sb->pool);
        sb_free(sb);
        return -1;
    }
    if (net_adopt(f, sb, err) < 0) {
        /* its namespace stays in place, reaching nothing; a later adopt may succeed */
        dsec_err_wrap(err, "function: re-adopting %s", sb->id);
        dsec__fn_files_close(&sb->files);
        dsec__fn_pools_env_put(f->pools, sb->pool);
        sb_free(sb);
        return -1;
    }
    *out = (dsec_sandbox *)(void *)sb;
    return 0;
}

static int fn_exec_start(void *self, dsec_sandbox *h, const dsec_exec_req *req, dsec_loop *loop,
                         dsec_exec_done_fn done, void *ud, dsec_err *err)
{
    struct fn *f = self;
    struct fn_sb *sb = (struct fn_sb *)(void *)h;
    struct fn_target tg = {.rt = sb->rt,
                           .pool = sb->pool,
                           .vars = sb->vars,
                           .nvars = sb->nvars,
                           .netns_fd = sb->netns_fd,
                           .resolver = sb->net != NULL ? dsec_net_sbx_resolver(sb->net) : NULL};
    return dsec__fn_call_start(f->pools, &f->cc, &tg, &sb->lim, &sb->files, req, loop,
                               &sb->cpu_used_us, &sb->calls, done, ud, err);
}

/* The synchronous exec: exec_start on the instance's loop, and a wait for its done. */
struct exec_wait {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    int rc;
    dsec_exec_result *res;
    dsec_err *err;
};

static void exec_waited(void *ud, int rc, dsec_exec_result *res, dsec_err *err)
{
    struct exec_wait *w = ud;
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    if (rc == 0)
        *w->res = *res; /* the buffers pass to the waiting caller */
    else
        *w->err = *err;
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

static size_t fn_default_cmd(void *self, dsec_sandbox *h, const char *const **argv)
{
    (void)self;
    struct fn_sb *sb = (struct fn_sb *)(void *)h;
    *argv = (const char *const *)sb->cmd;
    return sb->ncmd;
}

static int fn_exec(void *self, dsec_sandbox *h, const dsec_exec_req *req, dsec_exec_result *res,
                   dsec_err *err)
{
    struct fn *f = self;
    pthread_mutex_lock(&f->loop_mu);
    if (f->loop == NULL) {
        if (dsec_loop_new(&f->loop, "function", err) < 0) {
            pthread_mutex_unlock(&f->loop_mu);
            return dsec_err_wrap(err, "exec");
        }
        f->own_loop = true;
    }
    dsec_loop *loop = f->loop;
    pthread_mutex_unlock(&f->loop_mu);
    if (dsec_loop_is_current(loop)) /* it would wait for itself */
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "exec: a synchronous function call from the event loop's thread "
                            "(use exec_start there)");
    struct exec_wait w = {.res = res, .err = err};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cond, NULL);
    int rc = fn_exec_start(self, h, req, loop, exec_waited, &w, err);
    if (rc == 0) {
        pthread_mutex_lock(&w.mu);
        while (!w.done)
            pthread_cond_wait(&w.cond, &w.mu);
        pthread_mutex_unlock(&w.mu);
        rc = w.rc;
    }
    pthread_cond_destroy(&w.cond);
    pthread_mutex_destroy(&w.mu);
    return rc;
}

static int fn_file_write(void *self, dsec_sandbox *h, const char *path, const void *data,
                         size_t len, uint32_t mode, bool append, dsec_err *err)
{
    struct fn_sb *sb = (struct fn_sb *)(void *)h;
    return dsec__fn_files_write(&sb->files, path, data, len, mode, append, err);
}

static int fn_file_read(void *self, dsec_sandbox *h, const char *path, uint64_t offset,
                        uint64_t max, dsec_file_data *out, dsec_err *err)
{
    struct fn_sb *sb = (struct fn_sb *)(void *)h;
    return dsec__fn_files_read(&sb->files, path, offset, max, out, err);
}

static int fn_file_list(void *self, dsec_sandbox *h, const char *path, dsec_file_entry **entries,
                        size_t *n, dsec_err *err)
{
    struct fn_sb *sb = (struct fn_sb *)(void *)h;
    return dsec__fn_files_list(&sb->files, path, entries, n, err);
}

static int fn_file_op(void *self, dsec_sandbox *h, const dsec_file_op *op, dsec_file_entry *st,
                      dsec_err *err)
{
    struct fn_sb *sb = (struct fn_sb *)(void *)h;
    return dsec__fn_files_op(&sb->files, op, st, err);
}

static int fn_stats(void *self, dsec_sandbox *h, dsec_sandbox_stats *out, dsec_err *err)
{
    struct fn_sb *sb = (struct fn_sb *)(void *)h;
    memset(out, 0, sizeof *out);
    /* Between calls a function sandbox runs nothing and holds no memory. */
    out->cpu_used_us = sb->cpu_used_us;
    out->disk_bytes = sb->files.bytes;
    out->nfiles = sb->files.nfiles;
    return 0;
}

const dsec_backend_ops dsec_function_ops = {
    .type = "function",
    .init = fn_init,
    .fini = fn_fini,
    .create = fn_create,
    .exec = fn_exec,
    .exec_start = fn_exec_start,
    .default_cmd = fn_default_cmd,
    .file_write = fn_file_write,
    .file_read = fn_file_read,
    .file_list = fn_file_list,
    .file_op = fn_file_op,
    .destroy = fn_destroy,
    .stats = fn_stats,
    .adopt = fn_adopt,
    .detach = fn_detach,
    .net_set = fn_net_set,
};

/* ---- introspection ------------------------------------------------------------------------- */

static int runtime_of(const char *name, dsec_err *err)
{
    int rt = dsec__fn_runtime_find(name);
    if (rt < 0)
        dsec_err_set(err, DSEC_E_INVALID, 0,
                     "unknown function runtime \"%s\" (known: python3, sh, native)",
                     name ? name : "(null)");
    return rt;
}

int dsec_function_pool_info_get(void *self, const char *runtime, dsec_function_pool_info *out,
                                dsec_err *err)
{
    struct fn *f = self;
    int rt = runtime_of(runtime, err);
    return rt < 0 ? -1 : dsec__fn_pools_info(f->pools, rt, out);
}

void dsec_function_uid_range(void *self, uint32_t *first, unsigned *count)
{
    const struct fn *f = self;
    *first = f->uid_base;
    *count = f->uid_count;
}

int dsec_function_pool_warm(void *self, const char *runtime, unsigned warm, unsigned hot,
                            int wait_ms, dsec_err *err)
{
    struct fn *f = self;
    int rt = runtime_of(runtime, err);
    if (rt < 0 || dsec__fn_pools_start(f->pools, rt, wait_ms, err) < 0)
        return -1;
    return dsec__fn_pools_set_warm(f->pools, rt, warm, hot, wait_ms, err);
}

size_t dsec_function_env_pools(void *self, dsec_function_pool_info *out, size_t max)
{
    struct fn *f = self;
    return dsec__fn_pools_env_info(f->pools, out, max);
}

size_t dsec_function_pool_pids(void *self, const char *runtime, pid_t *out, size_t max)
{
    struct fn *f = self;
    int rt = dsec__fn_runtime_find(runtime);
    return rt < 0 ? 0 : dsec__fn_pools_warm_pids(f->pools, rt, out, max);
}
