/* container.c - the container sandbox backend: its ops table, and the life of a sandbox (create,
 * exec and files through the agent, fork, pause, snapshot and restore, stats, adopt, destroy). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "backends/cgroup-tune.h"
#include "backends/container/container-int.h"
#include "backends/loop.h"
#include "dsec/alloc.h"
#include "dsec/io.h"
#include "dsec/log.h"

#ifndef DSEC_AGENT_PATH
#define DSEC_AGENT_PATH ""
#endif

/*
 * A sandbox's life: resolve its environment to layers; hold each layer in
 * the layer cache (fork snapshots by refcount); make its upper subvolume;
 * make the overlay (a detached mount); write meta (what adopt needs) and
 * config.json; bind the agent's socket on the host; `crun run --detach`
 * with the listening socket as fd 3, from a child that attaches the overlay
 * at S/sb/<id>/rootfs in its private mount namespace; connect to the
 * agent. Teardown undoes these steps in reverse, and only those that were
 * done, so a failed create and destroy share it.
 */

/* disk_mb << 20 must fit 64 bits */
#define DISK_MB_MAX (UINT64_C(1) << 40)

static const char *const default_excludes[] = {"__pycache__", "*.pyc", ".cache", "tmp/*"};

static _Atomic uint64_t name_seq;

int dsec__ct_fmt(char *out, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, len, fmt, ap);
    va_end(ap);
    return n;
}

int dsec__ct_write_file(const char *path, const char *data, size_t len, dsec_err *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", path);
    if (dsec_write_all(fd, data, len) < 0) {
        int e = errno;
        close(fd);
        return dsec_err_set(err, DSEC_E_IO, e, "container: writing %s", path);
    }
    if (close(fd) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: writing %s", path);
    return 0;
}

/* A name unique on this node across restarts: prefix, time and a counter. */
void dsec__ct_unique_name(const char *prefix, const char *tag, char *out, size_t len)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seq = atomic_fetch_add(&name_seq, 1);
    dsec__ct_fmt(out, len, "%s-%s%" PRIx64 "%04" PRIx64, prefix, tag,
                 (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u, seq & 0xffff);
}

/* ---- environments ------------------------------------------------------------------- */

void dsec__ct_env_clear(struct ct_env *e)
{
    dsec_sbx_env_clear(&e->base);
    for (size_t i = 0; i < e->nlowers; i++)
        dsec_free(e->lowers[i].path);
    dsec_free(e->lowers);
    memset(e, 0, sizeof *e);
}

static int oom(dsec_err *err, const char *what)
{
    return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container: %s", what);
}

int dsec__ct_add_lower(struct ct_env *e, bool snap, const char *name, int format, dsec_err *err)
{
    if (strlen(name) >= sizeof e->lowers[0].name)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "container: layer name \"%.80s\" too long",
                            name);
    if (!snap && !dsec_digest_valid(name))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "container: \"%.80s\" is not a layer digest",
                            name);
    struct ct_lower *l = dsec_realloc(e->lowers, (e->nlowers + 1) * sizeof *l);
    if (l == NULL)
        return oom(err, "layer list");
    e->lowers = l;
    memset(&l[e->nlowers], 0, sizeof *l);
    l[e->nlowers].snap = snap;
    l[e->nlowers].format = format;
    dsec__ct_fmt(l[e->nlowers].name, sizeof l->name, "%s", name);
    e->nlowers++;
    return 0;
}

/* Copy src into dst (paths are not copied: dst holds nothing yet). */
int dsec__ct_env_copy(const struct ct_backend *be, struct ct_env *dst, const struct ct_env *src,
                      dsec_err *err)
{
    memset(dst, 0, sizeof *dst);
    int rc = dsec_sbx_env_copy(&be->sbx, &dst->base, &src->base, err);
    for (size_t i = 0; rc == 0 && i < src->nlowers; i++)
        rc = dsec__ct_add_lower(dst, src->lowers[i].snap, src->lowers[i].name,
                                src->lowers[i].format, err);
    if (rc < 0)
        dsec__ct_env_clear(dst);
    return rc;
}

static int doc_layer(void *arg, const char *digest, int format, dsec_err *err)
{
    return dsec__ct_add_lower(arg, false, digest, format, err);
}

static int env_from_spec(struct ct_backend *be, const dsec_sandbox_spec *spec, struct ct_env *out,
                         dsec_err *err)
{
    memset(out, 0, sizeof *out);
    if (spec->env != NULL && spec->env[0] != '\0') {
        dsec_env *d = NULL;
        if (dsec_sbx_env_get(&be->sbx, be->reg, spec->env, &d, err) < 0)
            return -1;
        int rc = dsec_sbx_env_from_doc(&be->sbx, &out->base, d, doc_layer, out, err);
        dsec_env_free(d);
        if (rc < 0)
            dsec__ct_env_clear(out);
        return rc;
    }
    if (spec->nlayers == 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "container: the spec names no environment and no layers");
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < spec->nlayers; i++)
        rc = spec->layers[i] == NULL
                 ? dsec_err_set(err, DSEC_E_INVALID, 0, "container: layer %zu is NULL", i)
                 : dsec__ct_add_lower(out, false, spec->layers[i], 0, err);
    if (rc == 0)
        rc = dsec_sbx_set_str(&be->sbx, &out->base.workdir, "/", err);
    if (rc == 0)
        rc = dsec_sbx_set_str(&be->sbx, &out->base.user, "root", err);
    if (rc < 0)
        dsec__ct_env_clear(out);
    return rc;
}

/* ---- text records: meta (for adopt) and snapshot files -------------------------------- */

/* Write e's lines (env, workdir, user, var, cmd, entry, lower) to f. */
void dsec__ct_env_put(FILE *f, const struct ct_env *e)
{
    dsec_sbx_env_put(f, &e->base);
    for (size_t i = 0; i < e->nlowers; i++)
        fprintf(f, "lower %s %s %d\n", e->lowers[i].snap ? "snap" : "layer", e->lowers[i].name,
                e->lowers[i].format);
}

/* Read one "key value" line into e when it is an env line; 1 when taken. */
int dsec__ct_env_line(const struct ct_backend *be, struct ct_env *e, const char *key, char *val,
                      dsec_err *err)
{
    if (strcmp(key, "lower") == 0) {
        char kind[16], name[160];
        int fmt = 0;
        if (sscanf(val, "%15s %159s %d", kind, name, &fmt) < 2)
            return dsec_err_set(err, DSEC_E_DECODE, 0, "container: bad lower line \"%.80s\"", val);
        return dsec__ct_add_lower(e, strcmp(kind, "snap") == 0, name, fmt, err) < 0 ? -1 : 1;
    }
    return dsec_sbx_env_line(&be->sbx, &e->base, key, val, err);
}

/* Append to sb's network policy as given (kept for forks and adopt). */
int dsec__ct_net_add(dsec_sandbox *sb, const char *const *v, size_t n, dsec_err *err)
{
    return dsec_sbx_strv_add(&sb->net_entries, &sb->nnet, v, n) < 0 ? oom(err, "network policy")
                                                                    : 0;
}

/* What every path that frees a record frees: its environment, names and network policy. */
void dsec__ct_sb_free(dsec_sandbox *sb)
{
    dsec__ct_env_clear(&sb->env);
    dsec_free(sb->snapshot_name);
    dsec__ct_keep_close(sb);
    dsec_sbx_strv_clear(&sb->net_entries, &sb->nnet);
    dsec_free(sb->net_state);
    dsec_free(sb->tenant);
    dsec_free(sb);
}

static void meta_put(FILE *f, const void *arg)
{
    const dsec_sandbox *sb = arg;
    dsec_sbx_rec_put(f, "id", sb->id);
    if (strcmp(sb->rid, sb->id) != 0)
        dsec_sbx_rec_put(f, "rid", sb->rid);
    /* which runtime to ask about its container after a restart, whatever the node's option
     * runtime says then */
    if (sb->rt != NULL)
        dsec_sbx_rec_put(f, "runtime", sb->rt->name);
    fprintf(f, "cpu_milli %" PRIu64 "\nmemory_mb %" PRIu64 "\ndisk_mb %" PRIu64 "\n", sb->cpu_milli,
            sb->memory_mb, sb->disk_mb);
    dsec_sbx_rec_put(f, "snapshot_name", sb->snapshot_name);
    dsec_sbx_net_put(f, sb->tenant, sb->net, sb->net_entries, sb->nnet);
    dsec__ct_env_put(f, &sb->env);
}

int dsec__ct_meta_write(const struct ct_backend *be, const dsec_sandbox *sb, dsec_err *err)
{
    return dsec_sbx_rec_write(&be->sbx, sb->dir, "dsec-container 1", meta_put, sb, err);
}

/* ---- options and the instance ---------------------------------------------------------- */

static void free_excludes(struct ct_backend *be)
{
    dsec_sbx_strv_clear(&be->excludes, &be->nexcludes);
}

/* The exclude list, plus ".dsec" (the agent's mount point) always. */
static int set_excludes(struct ct_backend *be, const char *list, dsec_err *err)
{
    free_excludes(be);
    size_t cap = 2;
    for (const char *c = list; *c; c++)
        cap += *c == ',';
    if ((be->excludes = dsec_calloc(cap, sizeof *be->excludes)) == NULL)
        return oom(err, "exclude patterns");
    char *copy = dsec_strdup(list);
    if (copy == NULL)
        return oom(err, "exclude patterns");
    int rc = 0;
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t && rc == 0;
         t = strtok_r(NULL, ",", &save))
        if ((be->excludes[be->nexcludes++] = dsec_strdup(t)) == NULL)
            rc = oom(err, "exclude patterns");
    if (rc == 0 && (be->excludes[be->nexcludes++] = dsec_strdup(".dsec")) == NULL)
        rc = oom(err, "exclude patterns");
    dsec_free(copy);
    return rc;
}

static const char known_opts[] = "runtime, runtime_path, crun_path, runc_path, runsc_path, agent, "
                                 "pids_max, upper_gb, layer_cache_gb, snapshot_exclude, "
                                 "start_timeout_ms, cgroup_favordynmods, runtime_memfd, warm_pool, "
                                 "warm_refill";

/* What the options set besides the instance's fields. */
struct ct_opts {
    struct ct_backend *be;
    char rt[32];
    char rt_path[PATH_MAX]; /* option runtime_path ("" when not given) */
    uint64_t upper_gb, cache_gb;
    char excl[1024];
};

/* A count option in lo..hi into an unsigned field. */
static int opt_uint(const struct ct_backend *be, const char *k, const char *v, uint64_t lo,
                    uint64_t hi, unsigned *out, dsec_err *err)
{
    uint64_t n = *out;
    int rc = dsec_sbx_opt_u64(&be->sbx, k, v, lo, hi, &n, err);
    *out = (unsigned)n;
    return rc;
}

static int opt_path(const char *key, const char *v, struct ct_backend *be, struct ct_opts *o)
{
    static const char *const names[CT_RT_N] = {"crun_path", "runc_path", "runsc_path"};
    for (int i = 0; i < CT_RT_N; i++)
        if (strcmp(key, names[i]) == 0)
            return dsec__ct_fmt(be->rt_paths[i], sizeof be->rt_paths[0], "%s", v), 1;
    if (strcmp(key, "runtime") == 0)
        dsec__ct_fmt(o->rt, sizeof o->rt, "%s", v);
    else if (strcmp(key, "runtime_path") == 0)
        dsec__ct_fmt(o->rt_path, sizeof o->rt_path, "%s", v);
    else if (strcmp(key, "agent") == 0)
        dsec__ct_fmt(be->agent, sizeof be->agent, "%s", v);
    else if (strcmp(key, "snapshot_exclude") == 0)
        dsec__ct_fmt(o->excl, sizeof o->excl, "%s", v);
    else
        return 0;
    return 1;
}

static int opt_one(void *arg, const char *key, const char *k, const char *v, dsec_err *err)
{
    struct ct_opts *o = arg;
    struct ct_backend *be = o->be;
    const struct dsec_sbx_store *s = &be->sbx;
    int rc = opt_path(key, v, be, o);
    if (rc != 0)
        return rc;
    if (strcmp(key, "pids_max") == 0)
        rc = dsec_sbx_opt_u64(s, k, v, 16, 1u << 22, &be->pids_max, err);
    else if (strcmp(key, "upper_gb") == 0)
        rc = dsec_sbx_opt_u64(s, k, v, 1, 1u << 20, &o->upper_gb, err);
    else if (strcmp(key, "layer_cache_gb") == 0)
        rc = dsec_sbx_opt_u64(s, k, v, 0, 1u << 20, &o->cache_gb, err);
    else if (strcmp(key, "start_timeout_ms") == 0)
        rc = dsec_sbx_opt_u64(s, k, v, 100, 600000, &be->start_timeout_ms, err);
    else if (strcmp(key, "cgroup_favordynmods") == 0)
        rc = dsec_backend_opt_bool(k, v, &be->favordynmods, err);
    else if (strcmp(key, "runtime_memfd") == 0)
        rc = dsec_backend_opt_bool(k, v, &be->rt_memfd, err);
    else if (strcmp(key, "warm_pool") == 0)
        rc = opt_uint(be, k, v, 0, 4096, &be->warm_target, err);
    else if (strcmp(key, "warm_refill") == 0)
        rc = opt_uint(be, k, v, 1, sizeof be->warm_th / sizeof be->warm_th[0], &be->warm_refill,
                      err);
    else
        return 0;
    return rc < 0 ? -1 : 1;
}

static int parse_opts(struct ct_backend *be, const dsec_backend_config *cfg, struct ct_opts *o,
                      dsec_err *err)
{
    o->be = be;
    dsec__ct_fmt(o->rt, sizeof o->rt, "crun");
    o->rt_path[0] = '\0';
    be->pids_max = 1024;
    be->start_timeout_ms = 15000;
    be->favordynmods = true;
    be->rt_memfd = true;
    be->warm_target = 8;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    /* half the CPUs: the refill runs beside the creates it is for */
    be->warm_refill = ncpu < 4 ? 1 : ncpu > 8 ? 4 : (unsigned)(ncpu / 2);
    o->upper_gb = 64;
    o->cache_gb = 0;
    o->excl[0] = '\0';
    for (size_t i = 0; i < sizeof default_excludes / sizeof default_excludes[0]; i++)
        dsec__ct_fmt(o->excl + strlen(o->excl), sizeof o->excl - strlen(o->excl), "%s%s",
                     i ? "," : "", default_excludes[i]);
    if (dsec_sbx_opts(&be->sbx, cfg, opt_one, o, known_opts, err) < 0)
        return -1;
    return set_excludes(be, o->excl, err);
}

static void ct_fini(void *self);
static const struct dsec_sbx_ops ct_store_ops;

static int ct_init(void **self, const dsec_backend_config *cfg, dsec_err *err)
{
    *self = NULL;
    if (cfg->state_dir == NULL || cfg->state_dir[0] != '/')
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "container: the backend needs an absolute state directory");
    if (strlen(cfg->state_dir) > PATH_MAX - 512)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "container: the state directory's path is longer than %d bytes",
                            PATH_MAX - 512);
    if (geteuid() != 0)
        return dsec_err_set(err, DSEC_E_PERMISSION, 0,
                            "container: the backend must run as root (mounts, cgroups, runtime)");
    struct ct_backend *be = dsec_calloc(1, sizeof *be);
    if (be == NULL)
        return oom(err, "backend instance");
    for (int i = 0; i < CT_RT_N; i++)
        be->rts[i].fd = -1;
    pthread_mutex_init(&be->rt_mu, NULL);
    const char *tr = getenv("DSEC_CONTAINER_TRACE");
    be->trace = tr != NULL && tr[0] == '1';
    pthread_mutex_init(&be->lock, NULL);
    dsec_sbx_store_init(&be->sbx, "container", 0, &ct_store_ops, be);
    dsec__ct_fmt(be->state_dir, sizeof be->state_dir, "%s", cfg->state_dir);
    dsec__ct_fmt(be->node, sizeof be->node, "%s",
                 cfg->node != NULL && dsec_name_ok(cfg->node, DSEC_NAME_LEN_MAX) == 0 ? cfg->node
                                                                                      : "node");
    dsec__ct_fmt(be->cg_parent, sizeof be->cg_parent, "dsec-ct-%s", be->node);
    be->reg = cfg->layers;
    be->net = cfg->net;
    struct ct_opts o;
    if (parse_opts(be, cfg, &o, err) < 0)
        goto fail;
    /* runtime_path is the configured runtime's binary, before its own <name>_path */
    if (o.rt_path[0] != '\0' && dsec__ct_rt_index(o.rt) >= 0)
        memcpy(be->rt_paths[dsec__ct_rt_index(o.rt)], o.rt_path, sizeof o.rt_path);
    if (be->agent[0] == '\0')
        dsec__ct_fmt(be->agent, sizeof be->agent, "%s", DSEC_AGENT_PATH);
    if (be->agent[0] == '\0' || access(be->agent, X_OK) != 0) {
        dsec_err_set(err, DSEC_E_CONFIG, errno,
                     "container: the dsec-agent binary \"%s\" is missing (build target "
                     "dsec-agent, or set the option agent)",
                     be->agent);
        goto fail;
    }
    dsec_cgroup_tune_apply(be->favordynmods, "container");
    if (dsec__ct_rt_init(be, o.rt, err) < 0)
        goto fail;
    dsec_err werr;
    if (dsec__ct_cg_weigh(be, &werr) < 0) /* the sandboxes then weigh as much as the node */
        dsec_log_warn("dsec container: %s; sandboxes keep the default CPU weight", werr.msg);
    dsec__ct_cg_pin_freezer(be);
    /* An instance refused before this point (a bad option) leaves the parent cgroup alone:
     * another instance for the same node may be using it, and a parent removed under it
     * would come back at the default weight. */
    be->cg_weighed = true;
    if (mkdir(be->state_dir, 0700) < 0 && errno != EEXIST) {
        dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", be->state_dir);
        goto fail;
    }
    dsec__ct_fmt(be->run_root, sizeof be->run_root, "%s/run", be->state_dir);
    dsec__ct_fmt(be->sbroot, sizeof be->sbroot, "%s/sb", be->state_dir);
    if ((mkdir(be->run_root, 0700) < 0 && errno != EEXIST) ||
        (mkdir(be->sbroot, 0700) < 0 && errno != EEXIST)) {
        dsec_err_set(err, DSEC_E_IO, errno, "container: creating directories in %s", be->state_dir);
        goto fail;
    }
    if (dsec__ct_store_open(be, o.upper_gb, err) < 0)
        goto fail;
    if (be->reg != NULL) {
        if (dsec_backend_layer_cache(cfg, be->state_dir, o.cache_gb << 30, &be->cache, err) < 0) {
            dsec_err_wrap(err, "container");
            goto fail;
        }
    }
    if (dsec__ct_pool_start(be, err) < 0)
        goto fail;
    *self = be;
    return 0;
fail:
    ct_fini(be);
    return -1;
}

static void ct_fini(void *self)
{
    struct ct_backend *be = self;
    if (be == NULL)
        return;
    dsec__ct_pool_stop(be);
    dsec_layer_cache_free(be->cache);
    while (be->snaps != NULL) {
        struct ct_snap *s = be->snaps;
        be->snaps = s->next;
        dsec_free(s);
    }
    if (be->store[0] != '\0')
        dsec__ct_store_close(be);
    if (be->cg_mode != 0 && be->cg_weighed)
        dsec__ct_cg_cleanup(be);
    free_excludes(be);
    dsec__ct_rt_release(be);
    while (be->kept != NULL) {
        struct ct_kept *k = be->kept;
        be->kept = k->next;
        dsec_net_release(k->net); /* left in place for a later adopt */
        dsec_free(k);
    }
    pthread_mutex_destroy(&be->rt_mu);
    pthread_mutex_destroy(&be->lock);
    dsec_sbx_store_fini(&be->sbx);
    dsec_free(be);
}

/* ---- a sandbox's life ------------------------------------------------------------------ */

dsec_sandbox *dsec__ct_sb_new(const char *id, dsec_err *err)
{
    if (dsec_name_ok(id, DSEC_SBX_ID_LEN_MAX) < 0) {
        dsec_err_set(err, DSEC_E_INVALID, 0,
                     "container: sandbox id must be 1..%d characters of [A-Za-z0-9_-]",
                     DSEC_SBX_ID_LEN_MAX);
        return NULL;
    }
    dsec_sandbox *sb = dsec_calloc(1, sizeof *sb);
    if (sb == NULL) {
        oom(err, "sandbox record");
        return NULL;
    }
    dsec__ct_fmt(sb->id, sizeof sb->id, "%s", id);
    memcpy(sb->rid, sb->id, sizeof sb->rid);
    return sb;
}

void dsec__ct_sb_paths(const struct ct_backend *be, dsec_sandbox *sb)
{
    dsec__ct_fmt(sb->dir, sizeof sb->dir, "%s/%s", be->sbroot, sb->id);
    dsec__ct_fmt(sb->subvol, sizeof sb->subvol, "%s/sb/%s", be->store, sb->id);
}

void dsec__ct_release_lowers(struct ct_backend *be, dsec_sandbox *sb)
{
    while (sb->held > 0) {
        struct ct_lower *l = &sb->env.lowers[--sb->held];
        if (l->snap)
            dsec__ct_snap_unref(be, l->name);
        else
            dsec_layer_cache_release(be->cache, l->name);
        dsec_free(l->path);
        l->path = NULL;
    }
}

int dsec__ct_hold_lowers(struct ct_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    for (; sb->held < sb->env.nlowers; sb->held++) {
        struct ct_lower *l = &sb->env.lowers[sb->held];
        if (l->snap) {
            char p[PATH_MAX + 128];
            dsec__ct_snap_path(be, l->name, p, sizeof p);
            size_t n = strlen(p);
            dsec__ct_fmt(p + n, sizeof p - n, "/upper");
            /* referenced before it is looked for, so the sweep cannot take
             * it in between */
            dsec__ct_snap_ref(be, l->name);
            if (access(p, F_OK) != 0 || (l->path = dsec_strdup(p)) == NULL) {
                int e = errno;
                dsec__ct_snap_unref(be, l->name);
                return e == ENOMEM ? oom(err, "layer path")
                                   : dsec_err_set(err, DSEC_E_NOT_FOUND, e,
                                                  "container: fork snapshot %s is gone", l->name);
            }
        } else {
            if (be->cache == NULL)
                return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                    "container: the node has no layer registry to get %s from",
                                    l->name);
            if (dsec_layer_cache_acquire(be->cache, l->name, &l->path, err) < 0)
                return dsec_err_wrap(err, "container: layer %s", l->name);
        }
    }
    return 0;
}

/* The records this instance holds: what the sweep must leave alone. */
static void live_add(struct ct_backend *be, dsec_sandbox *sb)
{
    dsec_sbx_live_add(&be->sbx, &sb->live, sb->id, sb->rid);
}

/* Undo whatever of sb's start-up was done; frees sb on success. */
int dsec__ct_sb_teardown(struct ct_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    dsec_agent_free(sb->agent);
    sb->agent = NULL;
    if (sb->started) {
        if (dsec__ct_rt_delete(be, sb->rt != NULL ? sb->rt : be->rt, sb->rid, err) < 0)
            return -1;
        sb->started = false;
    }
    if (sb->net != NULL) {
        if (dsec_net_detach(sb->net, err) < 0)
            return -1;
        sb->net = NULL;
    }
    char p[PATH_MAX + 16];
    if (sb->mounted) {
        dsec__ct_fmt(p, sizeof p, "%s/rootfs", sb->dir);
        if (dsec__ct_overlay_umount(p, err) < 0)
            return -1;
        sb->mounted = false;
    }
    if (sb->made_subvol) {
        if (dsec__ct_subvol_delete(be, sb->subvol, err) < 0)
            return -1;
        sb->made_subvol = false;
    }
    dsec__ct_release_lowers(be, sb);
    if (sb->made_dir) {
        if (dsec__ct_rmtree(sb->dir) < 0)
            return dsec_err_set(err, DSEC_E_IO, errno, "container: removing %s", sb->dir);
        sb->made_dir = false;
    }
    dsec_sbx_live_del(&be->sbx, &sb->live);
    dsec__ct_sb_free(sb);
    return 0;
}

static int store_teardown(void *be, dsec_sandbox *sb, dsec_err *err)
{
    return dsec__ct_sb_teardown(be, sb, err);
}

static const char *store_id(const dsec_sandbox *sb)
{
    return sb->id;
}

/* A record whose teardown failed stays as it is: what it holds is not known to be gone. */
static const struct dsec_sbx_ops ct_store_ops = {
    .teardown = store_teardown, .discard = NULL, .id = store_id, .sweep = dsec__ct_sweep};

/* A listening unix socket at path (through /proc/self/fd: host paths can be
 * longer than sun_path). */
int dsec__ct_listen_at(const char *dir, const char *name, dsec_err *err)
{
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: opening %s", dir);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    dsec__ct_fmt(a.sun_path, sizeof a.sun_path, "/proc/self/fd/%d/%s", dfd, name);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 16) < 0) {
        int e = errno;
        if (s >= 0)
            close(s);
        close(dfd);
        return dsec_err_set(err, DSEC_E_IO, e, "container: agent socket in %s", dir);
    }
    close(dfd);
    return s;
}

void dsec__ct_sock_path(const dsec_sandbox *sb, char *out, size_t len)
{
    dsec__ct_fmt(out, len, "%s/agent.sock", sb->dir);
}

int dsec__ct_resolv_write(const char *dir, const dsec_net_sbx *net, dsec_err *err)
{
    char rc_path[PATH_MAX + 16], conf[96];
    dsec__ct_fmt(rc_path, sizeof rc_path, "%s/resolv.conf", dir);
    int len = dsec__ct_fmt(conf, sizeof conf, "nameserver %s\noptions edns0\n",
                           dsec_net_sbx_resolver(net));
    return dsec__ct_write_file(rc_path, conf, (size_t)len, err);
}

/* sb_start's second half: network, meta, config.json, the agent's socket,
 * the runtime (root_fd: the detached rootfs mount, or -1). */
static int sb_launch(struct ct_backend *be, dsec_sandbox *sb, int root_fd, dsec_err *err)
{
    if (be->net != NULL) {
        if (dsec_net_attach(be->net, sb->id, sb->tenant, (const char *const *)sb->net_entries,
                            sb->nnet, &sb->net, err) < 0 ||
            dsec__ct_resolv_write(sb->dir, sb->net, err) < 0)
            return -1;
    } else if (sb->nnet > 0) {
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "container: this node has no network containment configured (the "
                            "cell's net: section), so it cannot apply a network policy");
    }
    if (dsec__ct_meta_write(be, sb, err) < 0 || dsec__ct_oci_write(be, sb, err) < 0)
        return -1;
    int lfd = dsec__ct_listen_at(sb->dir, "agent.sock", err);
    if (lfd < 0)
        return -1;
    sb->started = true; /* from here a half-made container may exist: delete it on failure */
    int rc = dsec__ct_rt_start(be, sb, lfd, root_fd, err);
    close(lfd);
    return rc;
}

/* sb_start's second half from a warm container w (consumed): its directory becomes sb's, its
 * root sb's overlay (root_fd), its cgroups get sb's limits and its agent sb's defaults. */
static int sb_warm(struct ct_backend *be, dsec_sandbox *sb, struct ct_warm *w, int root_fd,
                   dsec_err *err)
{
    char rootfs[PATH_MAX + 16];
    dsec__ct_fmt(rootfs, sizeof rootfs, "%s/rootfs", sb->dir);
    /* sb->dir holds only rootfs/, unused here: the overlay goes into the container */
    if (rmdir(rootfs) < 0 || rename(w->dir, sb->dir) < 0) {
        int e = errno;
        dsec__ct_pool_give_up(be, w);
        return dsec_err_set(err, DSEC_E_IO, e, "container: taking a warm container as %s", sb->dir);
    }
    memcpy(sb->rid, w->rid, sizeof sb->rid);
    sb->started = true; /* teardown deletes the warm container from here on */
    dsec__ct_fmt(rootfs, sizeof rootfs, "%s/ready", sb->dir);
    unlink(rootfs);
    sb->agent = w->agent;
    sb->net = w->net; /* and detaches its network */
    pid_t init = w->init;
    dsec_free(w);
    /* with containment: its namespace is now this sandbox's, with this sandbox's policy */
    if (sb->net != NULL &&
        (dsec_net_rename(sb->net, sb->id, sb->tenant, err) < 0 ||
         (sb->nnet > 0 &&
          dsec_net_set(sb->net, (const char *const *)sb->net_entries, sb->nnet, err) < 0)))
        return -1;
    /* the record first: a crash from here on leaves a sandbox naming its runtime id; and
     * config.json as a cold start would have written it (the warm container's own was of
     * the empty root), for whoever inspects the bundle */
    uint64_t t0 = dsec_now_ns();
    if (dsec__ct_meta_write(be, sb, err) < 0 || dsec__ct_oci_write(be, sb, err) < 0)
        return -1;
    uint64_t t1 = dsec_now_ns();
    if (dsec__ct_rt_switch_root(be, sb->rid, init, root_fd, sb->id, sb->net != NULL, err) < 0)
        return -1;
    uint64_t t2 = dsec_now_ns();
    if (dsec__ct_cg_limits(be, sb->rid, sb->memory_mb, sb->cpu_milli, err) < 0)
        return -1;
    uint64_t t3 = dsec_now_ns();
    if (dsec_agent_setup(sb->agent, (const char *const *)sb->env.base.vars, sb->env.base.nvars,
                         sb->env.base.workdir != NULL ? sb->env.base.workdir : "/",
                         sb->env.base.user != NULL ? sb->env.base.user : "root", err) < 0)
        return dsec_err_wrap(err, "container: the agent refused the sandbox's defaults");
    if (be->trace)
        fprintf(
            stderr,
            "dsec container: warm %s as %s: meta+config %.2f ms, root switch %.2f ms, limits %.2f "
            "ms, agent %.2f ms\n",
            sb->id, sb->rid, (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6,
            (double)(t3 - t2) / 1e6, (double)(dsec_now_ns() - t3) / 1e6);
    return 0;
}

/* The wait for a cold container's agent as watches on the node's loop (create_start). */
struct ct_ready {
    struct ct_backend *be;
    dsec_sandbox *sb;
    dsec_ready_fn done;
    void *ud;
};

/* What an agent that exited at start said last (a bad user or workdir), as err. */
static int agent_died(dsec_sandbox *sb, dsec_err *err)
{
    char lp[PATH_MAX + 16];
    dsec__ct_fmt(lp, sizeof lp, "%s/agent.log", sb->dir);
    char *log = dsec_sbx_read_file(lp, 4096);
    char *msg = log;
    while (msg != NULL && strchr(msg, '\n') != NULL && strchr(msg, '\n')[1] != '\0')
        msg = strchr(msg, '\n') + 1;
    if (msg != NULL)
        msg[strcspn(msg, "\n")] = '\0';
    dsec_err_set(err, DSEC_E_BACKEND, 0, "container: the agent exited at start: %.200s",
                 msg != NULL && msg[0] ? msg : "no message");
    dsec_free(log);
    return -1;
}

static bool ready_alive(void *ud, dsec_err *err)
{
    struct ct_ready *r = ud;
    if (dsec__ct_alive(r->be, r->sb->rid))
        return true;
    agent_died(r->sb, err);
    return false;
}

static void ready_dialed(void *ud, int rc, dsec_agent *a, dsec_err *err)
{
    struct ct_ready r = *(struct ct_ready *)ud;
    dsec_free(ud);
    if (rc == 0)
        r.sb->agent = a;
    else if (err->code == DSEC_E_TIMEOUT)
        dsec_err_wrap(err, "container: the agent did not answer");
    r.done(r.ud, rc, err);
}

int dsec__ct_ready_start(struct ct_backend *be, dsec_sandbox *sb, struct dsec_loop *loop,
                         dsec_ready_fn done, void *ud, dsec_err *err)
{
    char sp[PATH_MAX + 16];
    dsec__ct_sock_path(sb, sp, sizeof sp);
    struct ct_ready *r = dsec_malloc(sizeof *r);
    if (r == NULL)
        return oom(err, "a start in flight");
    *r = (struct ct_ready){.be = be, .sb = sb, .done = done, .ud = ud};
    /* connections of 200 ms, as dsec__ct_sb_start's; whether the agent died is asked every
     * second */
    if (dsec_agent_connect_start(loop, sp, be->start_timeout_ms, 200, ready_alive, ready_dialed, r,
                                 err) < 0) {
        dsec_free(r);
        return -1;
    }
    return 0;
}

/* Bring sb (id, env, limits set) up; on failure the caller abandons it. With later, a cold
 * start's wait for its agent is left to the caller (dsec__ct_ready_start): 1 then; 0: sb is up.
 * DSEC_CONTAINER_TRACE=1: how long its steps took, on stderr. */
int dsec__ct_sb_start(struct ct_backend *be, dsec_sandbox *sb, bool later, dsec_err *err)
{
    uint64_t t0 = dsec_now_ns();
    dsec__ct_sb_paths(be, sb);
    sb->rt = be->rt; /* a warm container was started by it too */
    if (mkdir(sb->dir, 0700) < 0)
        return errno == EEXIST
                   ? dsec_err_set(err, DSEC_E_EXISTS, 0, "container: a sandbox with this id exists")
                   : dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", sb->dir);
    sb->made_dir = true;
    live_add(be, sb);
    char rootfs[PATH_MAX + 16];
    dsec__ct_fmt(rootfs, sizeof rootfs, "%s/rootfs", sb->dir);
    if (mkdir(rootfs, 0755) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", rootfs);
    if (dsec__ct_hold_lowers(be, sb, err) < 0)
        return -1;
    if (dsec__ct_subvol_create(be, sb->subvol, err) < 0)
        return -1;
    sb->made_subvol = true;
    if (sb->disk_mb > 0 && dsec__ct_subvol_limit(be, sb->subvol, sb->disk_mb << 20, err) < 0)
        return -1;
    const char **lowers = dsec_calloc(sb->env.nlowers + 1, sizeof *lowers);
    if (lowers == NULL)
        return oom(err, "layer list");
    for (size_t i = 0; i < sb->env.nlowers; i++) /* overlay wants the top first */
        lowers[i] = sb->env.lowers[sb->env.nlowers - 1 - i].path;
    char upper[PATH_MAX + 16], work[PATH_MAX + 16];
    dsec__ct_fmt(upper, sizeof upper, "%s/upper", sb->subvol);
    dsec__ct_fmt(work, sizeof work, "%s/work", sb->subvol);
    /* The overlay is made here but attached only in the runtime's private
     * mount namespace (dsec__ct_rt_start), from which the container's own
     * is copied: the host's mount table does not grow with the sandboxes,
     * and every namespace copy (one or two per runtime call) stays small. */
    int root_fd = -1;
    int rc = dsec__ct_overlay_make(lowers, sb->env.nlowers, upper, work, rootfs, &root_fd, err);
    if (rc == 1) { /* no new mount API: on the host, as before */
        rc = dsec__ct_overlay_mount(lowers, sb->env.nlowers, upper, work, rootfs, err);
        sb->mounted = rc == 0;
    }
    dsec_free(lowers);
    if (rc < 0)
        return -1;
    uint64_t t1 = dsec_now_ns();
    /* a warm container when one is ready (and the kernel has detached mounts); a
     * policy without containment is refused by the cold path */
    struct ct_warm *w =
        root_fd >= 0 && (be->net != NULL || sb->nnet == 0) ? dsec__ct_pool_take(be) : NULL;
    if (w != NULL) {
        rc = sb_warm(be, sb, w, root_fd, err);
        close(root_fd);
        if (rc == 0 && be->trace)
            dsec_log_info("dsec container: start %s: root %.2f ms, warm container %.2f ms", sb->id,
                          (double)(t1 - t0) / 1e6, (double)(dsec_now_ns() - t1) / 1e6);
        return rc;
    }
    rc = sb_launch(be, sb, root_fd, err);
    if (root_fd >= 0)
        close(root_fd);
    if (rc < 0)
        return -1;
    uint64_t t2 = dsec_now_ns();
    char sp[PATH_MAX + 16];
    dsec__ct_sock_path(sb, sp, sizeof sp);
    if (later)
        return 1;
    /* in short rounds, so an agent that died at start (a bad user or
     * workdir) is reported at once, with what it said */
    uint64_t deadline = dsec_now_ns() + be->start_timeout_ms * 1000000u;
    for (;;) {
        if (dsec_agent_connect(&sb->agent, sp, 200, err) == 0) {
            if (be->trace)
                dsec_log_info(
                    "dsec container: start %s: root %.2f ms, runtime %.2f ms, agent %.2f ms",
                    sb->id, (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6,
                    (double)(dsec_now_ns() - t2) / 1e6);
            return 0;
        }
        if (!dsec__ct_alive(be, sb->rid))
            return agent_died(sb, err);
        if (dsec_now_ns() > deadline)
            return dsec_err_wrap(err, "container: the agent did not answer");
    }
}

static const char *label(const dsec_sandbox_spec *spec, const char *key)
{
    for (size_t i = 0; i < spec->nlabels; i++)
        if (spec->labels[i].key != NULL && strcmp(spec->labels[i].key, key) == 0)
            return spec->labels[i].value;
    return NULL;
}

/* Create from env (moved into the sandbox). */
int dsec__ct_create_env(struct ct_backend *be, const dsec_sandbox_spec *spec, struct ct_env *env,
                        struct dsec_loop *loop, dsec_ready_fn done, void *ud, dsec_sandbox **out,
                        char **backend_state, dsec_err *err)
{
    dsec_sandbox *sb = dsec__ct_sb_new(spec->id, err);
    if (sb == NULL) {
        dsec__ct_env_clear(env);
        return -1;
    }
    sb->env = *env;
    memset(env, 0, sizeof *env);
    sb->cpu_milli = spec->cpu_milli;
    sb->memory_mb = spec->memory_mb;
    sb->disk_mb = spec->disk_mb;
    if (sb->disk_mb > DISK_MB_MAX) {
        dsec_err_set(err, DSEC_E_INVALID, 0,
                     "container: disk_mb %" PRIu64 " is more than %" PRIu64 " (1 EiB)", sb->disk_mb,
                     (uint64_t)DISK_MB_MAX);
        dsec_sbx_abandon(&be->sbx, sb);
        return -1;
    }
    const char *sn = label(spec, "snapshot_name");
    if (sn != NULL && !dsec_layer_name_valid(sn)) {
        dsec_err_set(err, DSEC_E_INVALID, 0,
                     "container: label snapshot_name=\"%.80s\" is not name:version", sn);
        dsec_sbx_abandon(&be->sbx, sb);
        return -1;
    }
    if (dsec_sbx_set_str(&be->sbx, &sb->snapshot_name, sn, err) < 0 ||
        dsec_sbx_set_str(&be->sbx, &sb->tenant, spec->tenant, err) < 0 ||
        dsec__ct_net_add(sb, spec->net, spec->nnet, err) < 0) {
        dsec_sbx_abandon(&be->sbx, sb);
        return -1;
    }
    dsec__ct_sb_paths(be, sb); /* sb->dir, the record */
    if ((*backend_state = dsec_strdup(sb->dir)) == NULL) {
        dsec_sbx_abandon(&be->sbx, sb);
        return oom(err, "backend state");
    }
    /* the caller's before a wait on loop starts: done may run before sb_start returns */
    *out = sb;
    int rc = dsec__ct_sb_start(be, sb, loop != NULL, err);
    if (rc == 1 && dsec__ct_ready_start(be, sb, loop, done, ud, err) < 0)
        rc = -1;
    if (rc < 0) {
        *out = NULL;
        dsec_free(*backend_state);
        *backend_state = NULL;
        if (err->code == DSEC_E_EXISTS) { /* not ours to remove */
            sb->made_dir = false;
            sb->started = false;
        }
        dsec_sbx_abandon(&be->sbx, sb);
        return -1;
    }
    return rc;
}

/* ct_create; with loop, ct_create_start's (dsec__ct_sb_start's 1 and 0). */
static int create(void *self, const dsec_sandbox_spec *spec, struct dsec_loop *loop,
                  dsec_ready_fn done, void *ud, dsec_sandbox **out, char **backend_state,
                  dsec_err *err)
{
    struct ct_backend *be = self;
    *out = NULL;
    *backend_state = NULL;
    if (be->reg == NULL)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "container: the node passed no layer registry to the backend");
    if (dsec_name_ok(spec->id, DSEC_SBX_ID_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "container: sandbox id must be 1..%d characters of [A-Za-z0-9_-]",
                            DSEC_SBX_ID_LEN_MAX);
    uint64_t t0 = dsec_now_ns();
    dsec_sbx_sweep_once(&be->sbx);
    struct ct_env env;
    if (env_from_spec(be, spec, &env, err) < 0)
        return -1;
    uint64_t t1 = dsec_now_ns();
    int rc = dsec__ct_create_env(be, spec, &env, loop, done, ud, out, backend_state, err);
    if (be->trace)
        dsec_log_info("dsec container: create %s: environment %.2f ms, in all %.2f ms", spec->id,
                      (double)(t1 - t0) / 1e6, (double)(dsec_now_ns() - t0) / 1e6);
    return rc;
}

static int ct_create(void *self, const dsec_sandbox_spec *spec, dsec_sandbox **out,
                     char **backend_state, dsec_err *err)
{
    return create(self, spec, NULL, NULL, NULL, out, backend_state, err);
}

/* A warm container is up at once (1); a cold one's agent is waited for on loop (0). */
static int ct_create_start(void *self, const dsec_sandbox_spec *spec, struct dsec_loop *loop,
                           dsec_ready_fn done, void *ud, dsec_sandbox **out, char **backend_state,
                           dsec_err *err)
{
    int rc = create(self, spec, loop, done, ud, out, backend_state, err);
    return rc < 0 ? -1 : rc == 0 ? 1 : 0;
}

/* ---- destroy, stats, adopt, detach -------------------------------------------------------- */

static int ct_destroy(void *self, dsec_sandbox *sb, dsec_err *err)
{
    struct ct_backend *be = self;
    dsec_sbx_sweep_once(&be->sbx);
    return dsec__ct_sb_teardown(be, sb, err);
}

/* A destroy's wait for the killed processes to leave (stop_start): on a host whose CPUs are
 * saturated, running their exit takes them seconds. Looked at every 2 ms and killed again, so what
 * forks meanwhile goes too. */
struct ct_stop {
    struct ct_backend *be;
    dsec_sandbox *sb;
    dsec_ready_fn done;
    void *ud;
};

static int stop_tick(void *ud, uint64_t ms, dsec_err *err)
{
    struct ct_stop *st = ud;
    size_t left = dsec__ct_cg_kill(st->be, st->sb->rid);
    if (left == 0)
        return 1;
    if (ms > 20000) /* as the destroy's own wait: it reports what is left */
        return dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                            "container: %zu processes did not exit within 20 s of SIGKILL", left);
    return 0;
}

static void stop_done(void *ud, int rc, dsec_err *err)
{
    struct ct_stop st = *(struct ct_stop *)ud;
    dsec_free(ud);
    st.done(st.ud, rc, err);
}

static int ct_stop_start(void *self, dsec_sandbox *sb, struct dsec_loop *loop, dsec_ready_fn done,
                         void *ud, dsec_err *err)
{
    struct ct_backend *be = self;
    dsec_agent_free(sb->agent);
    sb->agent = NULL;
    if (!sb->started || dsec__ct_cg_kill(be, sb->rid) == 0)
        return 1;
    struct ct_stop *st = dsec_malloc(sizeof *st);
    if (st == NULL)
        return oom(err, "a stop in flight");
    *st = (struct ct_stop){.be = be, .sb = sb, .done = done, .ud = ud};
    if (dsec_loop_tick_start(loop, 2, stop_tick, stop_done, st, err) < 0) {
        dsec_free(st);
        return -1;
    }
    return 0;
}

static int ct_stats(void *self, dsec_sandbox *sb, dsec_sandbox_stats *out, dsec_err *err)
{
    struct ct_backend *be = self;
    memset(out, 0, sizeof *out);
    if (dsec__ct_cg_usage(be, sb->rid, &out->cpu_used_us, &out->memory_bytes, err) < 0)
        return -1;
    uint64_t now = dsec_now_ns();
    if (sb->last_ns != 0 && now > sb->last_ns && out->cpu_used_us >= sb->last_cpu_us)
        out->cpu_milli = (out->cpu_used_us - sb->last_cpu_us) * 1000000u / (now - sb->last_ns);
    sb->last_ns = now;
    sb->last_cpu_us = out->cpu_used_us;
    char up[PATH_MAX + 16];
    dsec__ct_fmt(up, sizeof up, "%s/upper", sb->subvol);
    dsec__ct_du(up, &out->disk_bytes, &out->nfiles);
    return 0;
}

static int ct_net_set(void *self, dsec_sandbox *sb, const char *const *entries, size_t n,
                      dsec_err *err)
{
    const struct ct_backend *be = self;
    if (sb->net == NULL)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "container: this sandbox has no managed network (its node has no "
                            "network containment configured)");
    if (dsec_net_set(sb->net, entries, n, err) < 0)
        return -1;
    /* remembered for forks and for adoption after a restart */
    dsec_sbx_strv_clear(&sb->net_entries, &sb->nnet);
    if (dsec__ct_net_add(sb, entries, n, err) < 0 || dsec__ct_meta_write(be, sb, err) < 0)
        return dsec_err_wrap(err, "container: the policy is applied but not recorded");
    return 0;
}

const dsec_backend_ops dsec_container_ops = {
    .type = "container",
    .init = ct_init,
    .fini = ct_fini,
    .create = ct_create,
    .create_start = ct_create_start,
    .exec = dsec__ct_exec,
    .exec_start = dsec__ct_exec_start,
    .default_cmd = dsec__ct_default_cmd,
    .file_write = dsec__ct_file_write,
    .file_read = dsec__ct_file_read,
    .file_write_start = dsec__ct_file_write_start,
    .file_read_start = dsec__ct_file_read_start,
    .file_list = dsec__ct_file_list,
    .file_op = dsec__ct_file_op,
    .fork = dsec__ct_fork,
    .fork_start = dsec__ct_fork_start,
    .pause = dsec__ct_pause,
    .resume = dsec__ct_resume,
    .snapshot = dsec__ct_snapshot,
    .restore = dsec__ct_restore,
    .destroy = ct_destroy,
    .stop_start = ct_stop_start,
    .stats = ct_stats,
    .adopt = dsec__ct_adopt,
    .detach = dsec__ct_detach,
    .net_set = ct_net_set,
    .proc_start = dsec__ct_proc_start,
    .proc_list = dsec__ct_proc_list,
    .proc_signal = dsec__ct_proc_signal,
    .proc_stdin = dsec__ct_proc_stdin,
    .proc_output = dsec__ct_proc_output,
    .proc_resize = dsec__ct_proc_resize,
    .proc_follow_start = dsec__ct_proc_follow_start,
    .proc_stdin_start = dsec__ct_proc_stdin_start,
};
