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
#include "dsec/alloc.h"

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
    size_t off = 0;
    while (off < len) {
        ssize_t n = write(fd, data + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = errno;
            close(fd);
            return dsec_err_set(err, DSEC_E_IO, e, "container: writing %s", path);
        }
        off += (size_t)n;
    }
    if (close(fd) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: writing %s", path);
    return 0;
}

char *dsec__ct_read_file(const char *path, size_t max)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *buf = dsec_malloc(max + 1);
    size_t got = 0;
    ssize_t n = 0;
    while (buf != NULL && got < max && (n = read(fd, buf + got, max - got)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            break;
        got += (size_t)n;
    }
    int e = errno;
    close(fd);
    if (buf == NULL || n < 0) {
        dsec_free(buf);
        errno = n < 0 ? e : ENOMEM;
        return NULL;
    }
    buf[got] = '\0';
    return buf;
}

/* A name unique on this node across restarts: prefix, time and a counter. */
static void unique_name(const char *prefix, const char *tag, char *out, size_t len)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t seq = atomic_fetch_add(&name_seq, 1);
    dsec__ct_fmt(out, len, "%s-%s%" PRIx64 "%04" PRIx64, prefix, tag,
                 (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u, seq & 0xffff);
}

/* ---- environments ------------------------------------------------------------------- */

static void env_clear(struct ct_env *e)
{
    dsec_free(e->name);
    for (size_t i = 0; i < e->nlowers; i++)
        dsec_free(e->lowers[i].path);
    dsec_free(e->lowers);
    for (size_t i = 0; i < e->nvars; i++)
        dsec_free(e->vars[i]);
    dsec_free(e->vars);
    dsec_free(e->workdir);
    dsec_free(e->user);
    for (size_t i = 0; i < e->ncmd; i++)
        dsec_free(e->cmd[i]);
    dsec_free(e->cmd);
    memset(e, 0, sizeof *e);
}

static int oom(dsec_err *err, const char *what)
{
    return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container: %s", what);
}

static int add_lower(struct ct_env *e, bool snap, const char *name, int format, dsec_err *err)
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

static int add_var(struct ct_env *e, const char *kv, dsec_err *err)
{
    if (strchr(kv, '=') == NULL || kv[0] == '=')
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "container: environment variable \"%.80s\" is not KEY=VALUE", kv);
    char **v = dsec_realloc(e->vars, (e->nvars + 1) * sizeof *v);
    if (v == NULL)
        return oom(err, "environment variables");
    e->vars = v;
    if ((v[e->nvars] = dsec_strdup(kv)) == NULL)
        return oom(err, "environment variables");
    e->nvars++;
    return 0;
}

static int set_str(char **dst, const char *s, dsec_err *err)
{
    dsec_free(*dst);
    *dst = s ? dsec_strdup(s) : NULL;
    return s != NULL && *dst == NULL ? oom(err, "copying a string") : 0;
}

static int add_cmd(struct ct_env *e, const char *arg, dsec_err *err)
{
    char **v = dsec_realloc(e->cmd, (e->ncmd + 1) * sizeof *v);
    if (v == NULL)
        return oom(err, "default command");
    e->cmd = v;
    if ((v[e->ncmd] = dsec_strdup(arg)) == NULL)
        return oom(err, "default command");
    e->ncmd++;
    return 0;
}

/* Copy src into dst (paths are not copied: dst holds nothing yet). */
static int env_copy(struct ct_env *dst, const struct ct_env *src, dsec_err *err)
{
    memset(dst, 0, sizeof *dst);
    int rc = set_str(&dst->name, src->name, err);
    for (size_t i = 0; rc == 0 && i < src->nlowers; i++)
        rc = add_lower(dst, src->lowers[i].snap, src->lowers[i].name, src->lowers[i].format, err);
    for (size_t i = 0; rc == 0 && i < src->nvars; i++)
        rc = add_var(dst, src->vars[i], err);
    if (rc == 0)
        rc = set_str(&dst->workdir, src->workdir, err);
    if (rc == 0)
        rc = set_str(&dst->user, src->user, err);
    for (size_t i = 0; rc == 0 && i < src->ncmd; i++)
        rc = add_cmd(dst, src->cmd[i], err);
    dst->nentry = src->nentry;
    if (rc < 0)
        env_clear(dst);
    return rc;
}

static int env_from_doc(struct ct_env *out, const dsec_env *d, dsec_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = set_str(&out->name, d->name, err);
    for (size_t i = 0; rc == 0 && i < d->nlayers; i++)
        rc = add_lower(out, false, d->layers[i], d->formats ? (int)d->formats[i] : 0, err);
    for (size_t i = 0; rc == 0 && i < d->nvars; i++)
        rc = add_var(out, d->vars[i], err);
    if (rc == 0)
        rc = set_str(&out->workdir, d->workdir ? d->workdir : "/", err);
    if (rc == 0)
        rc = set_str(&out->user, d->user ? d->user : "root", err);
    for (size_t i = 0; rc == 0 && i < d->ncmd; i++)
        rc = add_cmd(out, d->cmd[i], err);
    out->nentry = d->nentry <= d->ncmd ? d->nentry : 0;
    if (rc < 0)
        env_clear(out);
    return rc;
}

static int env_from_spec(struct ct_backend *be, const dsec_sandbox_spec *spec, struct ct_env *out,
                         dsec_err *err)
{
    memset(out, 0, sizeof *out);
    if (spec->env != NULL && spec->env[0] != '\0') {
        dsec_env *d = NULL;
        if (dsec_layer_registry_env_get(be->reg, spec->env, &d, err) < 0)
            return dsec_err_wrap(err, "container: environment %s", spec->env);
        int rc = env_from_doc(out, d, err);
        dsec_env_free(d);
        return rc;
    }
    if (spec->nlayers == 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "container: the spec names no environment and no layers");
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < spec->nlayers; i++)
        rc = spec->layers[i] == NULL
                 ? dsec_err_set(err, DSEC_E_INVALID, 0, "container: layer %zu is NULL", i)
                 : add_lower(out, false, spec->layers[i], 0, err);
    if (rc == 0)
        rc = set_str(&out->workdir, "/", err);
    if (rc == 0)
        rc = set_str(&out->user, "root", err);
    if (rc < 0)
        env_clear(out);
    return rc;
}

/* ---- text records: meta (for adopt) and snapshot files -------------------------------- */

/* Values go one per line; a newline or backslash inside one is escaped. */
static void put_esc(FILE *f, const char *key, const char *v)
{
    fprintf(f, "%s ", key);
    for (const char *c = v ? v : "-"; *c; c++) {
        if (*c == '\n')
            fputs("\\n", f);
        else if (*c == '\\')
            fputs("\\\\", f);
        else
            fputc(*c, f);
    }
    fputc('\n', f);
}

static void unesc(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (*r == '\\' && r[1] == 'n') {
            *w++ = '\n';
            r++;
        } else if (*r == '\\' && r[1] == '\\') {
            *w++ = '\\';
            r++;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

/* Write e's lines (env, workdir, user, var, cmd, lower) to f. */
static void put_env(FILE *f, const struct ct_env *e)
{
    put_esc(f, "env", e->name);
    put_esc(f, "workdir", e->workdir);
    put_esc(f, "user", e->user);
    for (size_t i = 0; i < e->nvars; i++)
        put_esc(f, "var", e->vars[i]);
    for (size_t i = 0; i < e->ncmd; i++) /* an empty argument is a line "cmd " */
        put_esc(f, "cmd", e->cmd[i]);
    if (e->nentry > 0)
        fprintf(f, "entry %zu\n", e->nentry);
    for (size_t i = 0; i < e->nlowers; i++)
        fprintf(f, "lower %s %s %d\n", e->lowers[i].snap ? "snap" : "layer", e->lowers[i].name,
                e->lowers[i].format);
}

/* Read one "key value" line into e when it is an env line; 1 when taken. */
static int take_env_line(struct ct_env *e, const char *key, char *val, dsec_err *err)
{
    if (strcmp(key, "env") == 0)
        return set_str(&e->name, strcmp(val, "-") == 0 ? NULL : val, err) < 0 ? -1 : 1;
    if (strcmp(key, "workdir") == 0)
        return set_str(&e->workdir, val, err) < 0 ? -1 : 1;
    if (strcmp(key, "user") == 0)
        return set_str(&e->user, val, err) < 0 ? -1 : 1;
    if (strcmp(key, "var") == 0)
        return add_var(e, val, err) < 0 ? -1 : 1;
    if (strcmp(key, "cmd") == 0)
        return add_cmd(e, val, err) < 0 ? -1 : 1;
    if (strcmp(key, "entry") == 0) {
        e->nentry = strtoull(val, NULL, 10);
        return 1;
    }
    if (strcmp(key, "lower") == 0) {
        char kind[16], name[160];
        int fmt = 0;
        if (sscanf(val, "%15s %159s %d", kind, name, &fmt) < 2)
            return dsec_err_set(err, DSEC_E_DECODE, 0, "container: bad lower line \"%.80s\"", val);
        return add_lower(e, strcmp(kind, "snap") == 0, name, fmt, err) < 0 ? -1 : 1;
    }
    return 0;
}

/* Split a record into lines; calls fn(key, value) for each. */
static int parse_lines(char *text, int (*fn)(void *, const char *, char *, dsec_err *), void *arg,
                       dsec_err *err)
{
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *sp = strchr(line, ' ');
        if (sp == NULL)
            continue;
        *sp = '\0';
        unesc(sp + 1);
        if (fn(arg, line, sp + 1, err) < 0)
            return -1;
    }
    return 0;
}

/* ---- the sandbox's network policy (backends/net/net.h) ------------------------------------ */

static void net_entries_clear(dsec_sandbox *sb)
{
    for (size_t i = 0; i < sb->nnet; i++)
        dsec_free(sb->net_entries[i]);
    dsec_free(sb->net_entries);
    sb->net_entries = NULL;
    sb->nnet = 0;
}

static int net_entries_add(dsec_sandbox *sb, const char *const *v, size_t n, dsec_err *err)
{
    if (n == 0)
        return 0;
    char **nv = dsec_realloc(sb->net_entries, (sb->nnet + n) * sizeof *nv);
    if (nv == NULL)
        return oom(err, "network policy");
    sb->net_entries = nv;
    for (size_t i = 0; i < n; i++) {
        if ((nv[sb->nnet] = dsec_strdup(v[i] != NULL ? v[i] : "")) == NULL)
            return oom(err, "network policy");
        sb->nnet++;
    }
    return 0;
}

/* What every path that frees a record frees besides env and snapshot name. */
static void sb_free_fields(dsec_sandbox *sb)
{
    dsec_agent_free(sb->side);
    sb->side = NULL;
    net_entries_clear(sb);
    dsec_free(sb->net_state);
    sb->net_state = NULL;
    dsec_free(sb->tenant);
    sb->tenant = NULL;
}

static int write_meta(const dsec_sandbox *sb, dsec_err *err)
{
    char path[PATH_MAX + 16], tmp[PATH_MAX + 16];
    dsec__ct_fmt(path, sizeof path, "%s/meta", sb->dir);
    dsec__ct_fmt(tmp, sizeof tmp, "%s/meta.tmp", sb->dir);
    FILE *f = fopen(tmp, "we");
    if (f == NULL)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", tmp);
    fprintf(f, "dsec-container 1\n");
    put_esc(f, "id", sb->id);
    if (strcmp(sb->rid, sb->id) != 0)
        put_esc(f, "rid", sb->rid);
    /* which runtime to ask about its container after a restart, whatever the node's option
     * runtime says then */
    if (sb->rt != NULL)
        put_esc(f, "runtime", sb->rt->name);
    fprintf(f, "cpu_milli %" PRIu64 "\nmemory_mb %" PRIu64 "\ndisk_mb %" PRIu64 "\n", sb->cpu_milli,
            sb->memory_mb, sb->disk_mb);
    put_esc(f, "snapshot_name", sb->snapshot_name);
    put_esc(f, "tenant", sb->tenant);
    if (sb->net != NULL)
        put_esc(f, "net_state", dsec_net_sbx_state(sb->net));
    for (size_t i = 0; i < sb->nnet; i++)
        put_esc(f, "net", sb->net_entries[i]);
    put_env(f, &sb->env);
    if (fclose(f) != 0 || rename(tmp, path) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: writing %s", path);
    return 0;
}

static int meta_line(void *arg, const char *key, char *val, dsec_err *err)
{
    dsec_sandbox *sb = arg;
    int t = take_env_line(&sb->env, key, val, err);
    if (t != 0)
        return t < 0 ? -1 : 0;
    if (strcmp(key, "id") == 0) {
        if (dsec_name_ok(val, DSEC_SBX_ID_LEN_MAX) < 0)
            return dsec_err_set(err, DSEC_E_DECODE, 0, "container: meta names a bad id");
        dsec__ct_fmt(sb->id, sizeof sb->id, "%s", val);
    } else if (strcmp(key, "rid") == 0) {
        if (!dsec__ct_is_warm_rid(val) || strlen(val) >= sizeof sb->rid)
            return dsec_err_set(err, DSEC_E_DECODE, 0, "container: meta names a bad runtime id");
        dsec__ct_fmt(sb->rid, sizeof sb->rid, "%s", val);
    } else if (strcmp(key, "runtime") == 0) {
        if (dsec__ct_rt_index(val) < 0)
            return dsec_err_set(err, DSEC_E_DECODE, 0,
                                "container: meta names an unknown runtime \"%.40s\"", val);
        dsec__ct_fmt(sb->rt_name, sizeof sb->rt_name, "%s", val);
    } else if (strcmp(key, "cpu_milli") == 0) {
        sb->cpu_milli = strtoull(val, NULL, 10);
    } else if (strcmp(key, "memory_mb") == 0) {
        sb->memory_mb = strtoull(val, NULL, 10);
    } else if (strcmp(key, "disk_mb") == 0) {
        sb->disk_mb = strtoull(val, NULL, 10);
    } else if (strcmp(key, "snapshot_name") == 0 && strcmp(val, "-") != 0) {
        return set_str(&sb->snapshot_name, val, err);
    } else if (strcmp(key, "tenant") == 0 && strcmp(val, "-") != 0) {
        return set_str(&sb->tenant, val, err);
    } else if (strcmp(key, "net_state") == 0) {
        return set_str(&sb->net_state, val, err);
    } else if (strcmp(key, "net") == 0) {
        const char *one[1] = {val};
        return net_entries_add(sb, one, 1, err);
    }
    return 0;
}

/* ---- options and the instance ---------------------------------------------------------- */

static int opt_u64(const char *k, const char *v, uint64_t lo, uint64_t hi, uint64_t *out,
                   dsec_err *err)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || v[0] == '-' || x < lo || x > hi)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "container option %s=\"%s\": expected an integer in %" PRIu64
                            "..%" PRIu64,
                            k, v, lo, hi);
    *out = x;
    return 0;
}

static void free_excludes(struct ct_backend *be)
{
    for (size_t i = 0; i < be->nexcludes; i++)
        dsec_free(be->excludes[i]);
    dsec_free(be->excludes);
    be->excludes = NULL;
    be->nexcludes = 0;
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

/* rt_path receives option runtime_path ("" when not given). */
static int parse_opts(struct ct_backend *be, const dsec_backend_config *cfg, char *rt, size_t rtlen,
                      char *rt_path, size_t pathlen, uint64_t *upper_gb, uint64_t *cache_gb,
                      dsec_err *err)
{
    rt_path[0] = '\0';
    dsec__ct_fmt(rt, rtlen, "crun");
    be->pids_max = 1024;
    be->start_timeout_ms = 15000;
    be->favordynmods = true;
    be->rt_memfd = true;
    be->warm_target = 8;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    /* half the CPUs: the refill runs beside the creates it is for */
    be->warm_refill = ncpu < 4 ? 1 : ncpu > 8 ? 4 : (unsigned)(ncpu / 2);
    *upper_gb = 64;
    *cache_gb = 0;
    char excl[1024] = "";
    for (size_t i = 0; i < sizeof default_excludes / sizeof default_excludes[0]; i++)
        dsec__ct_fmt(excl + strlen(excl), sizeof excl - strlen(excl), "%s%s", i ? "," : "",
                     default_excludes[i]);
    for (size_t i = 0; i < cfg->nopts; i++) {
        const char *k = cfg->opts[i].key, *v = cfg->opts[i].value;
        if (k == NULL || v == NULL)
            return dsec_err_set(err, DSEC_E_CONFIG, 0, "container option %zu has no key or value",
                                i);
        bool mine = strncmp(k, "container.", 10) == 0;
        const char *key = mine ? k + 10 : k;
        int rc = 0;
        if (strcmp(key, "runtime") == 0)
            dsec__ct_fmt(rt, rtlen, "%s", v);
        else if (strcmp(key, "runtime_path") == 0)
            dsec__ct_fmt(rt_path, pathlen, "%s", v);
        else if (strcmp(key, "crun_path") == 0)
            dsec__ct_fmt(be->rt_paths[CT_RT_CRUN], sizeof be->rt_paths[0], "%s", v);
        else if (strcmp(key, "runc_path") == 0)
            dsec__ct_fmt(be->rt_paths[CT_RT_RUNC], sizeof be->rt_paths[0], "%s", v);
        else if (strcmp(key, "runsc_path") == 0)
            dsec__ct_fmt(be->rt_paths[CT_RT_RUNSC], sizeof be->rt_paths[0], "%s", v);
        else if (strcmp(key, "agent") == 0)
            dsec__ct_fmt(be->agent, sizeof be->agent, "%s", v);
        else if (strcmp(key, "pids_max") == 0)
            rc = opt_u64(k, v, 16, 1u << 22, &be->pids_max, err);
        else if (strcmp(key, "upper_gb") == 0)
            rc = opt_u64(k, v, 1, 1u << 20, upper_gb, err);
        else if (strcmp(key, "layer_cache_gb") == 0)
            rc = opt_u64(k, v, 0, 1u << 20, cache_gb, err);
        else if (strcmp(key, "snapshot_exclude") == 0)
            dsec__ct_fmt(excl, sizeof excl, "%s", v);
        else if (strcmp(key, "start_timeout_ms") == 0) {
            rc = opt_u64(k, v, 100, 600000, &be->start_timeout_ms, err);
        } else if (strcmp(key, "cgroup_favordynmods") == 0)
            rc = dsec_backend_opt_bool(k, v, &be->favordynmods, err);
        else if (strcmp(key, "runtime_memfd") == 0)
            rc = dsec_backend_opt_bool(k, v, &be->rt_memfd, err);
        else if (strcmp(key, "warm_pool") == 0) {
            uint64_t n = be->warm_target;
            rc = opt_u64(k, v, 0, 4096, &n, err);
            be->warm_target = (unsigned)n;
        } else if (strcmp(key, "warm_refill") == 0) {
            uint64_t n = be->warm_refill;
            rc = opt_u64(k, v, 1, sizeof be->warm_th / sizeof be->warm_th[0], &n, err);
            be->warm_refill = (unsigned)n;
        } else if (mine)
            rc = dsec_err_set(err, DSEC_E_CONFIG, 0, "unknown container option %s (known: %s)", k,
                              known_opts);
        if (rc < 0)
            return -1;
    }
    return set_excludes(be, excl, err);
}

static void ct_fini(void *self);

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
    pthread_mutex_init(&be->sweep_lock, NULL);
    dsec__ct_fmt(be->state_dir, sizeof be->state_dir, "%s", cfg->state_dir);
    dsec__ct_fmt(be->node, sizeof be->node, "%s",
                 cfg->node != NULL && dsec_name_ok(cfg->node, DSEC_NAME_LEN_MAX) == 0 ? cfg->node
                                                                                      : "node");
    dsec__ct_fmt(be->cg_parent, sizeof be->cg_parent, "dsec-ct-%s", be->node);
    be->reg = cfg->layers;
    be->net = cfg->net;
    char rt[32], rt_path[PATH_MAX];
    uint64_t upper_gb, cache_gb;
    if (parse_opts(be, cfg, rt, sizeof rt, rt_path, sizeof rt_path, &upper_gb, &cache_gb, err) < 0)
        goto fail;
    /* runtime_path is the configured runtime's binary, before its own <name>_path */
    if (rt_path[0] != '\0' && dsec__ct_rt_index(rt) >= 0)
        memcpy(be->rt_paths[dsec__ct_rt_index(rt)], rt_path, sizeof rt_path);
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
    if (dsec__ct_rt_init(be, rt, err) < 0)
        goto fail;
    dsec_err werr;
    if (dsec__ct_cg_weigh(be, &werr) < 0) /* the sandboxes then weigh as much as the node */
        fprintf(stderr, "dsec container: %s; sandboxes keep the default CPU weight\n", werr.msg);
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
    if (dsec__ct_store_open(be, upper_gb, err) < 0)
        goto fail;
    if (be->reg != NULL) {
        if (dsec_backend_layer_cache(cfg, be->state_dir, cache_gb << 30, &be->cache, err) < 0) {
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
    dsec__ct_rt_fini(be);
    while (be->kept != NULL) {
        struct ct_kept *k = be->kept;
        be->kept = k->next;
        dsec_net_release(k->net); /* left in place for a later adopt */
        dsec_free(k);
    }
    pthread_mutex_destroy(&be->rt_mu);
    pthread_mutex_destroy(&be->lock);
    pthread_mutex_destroy(&be->sweep_lock);
    dsec_free(be);
}

/* ---- a sandbox's life ------------------------------------------------------------------ */

static dsec_sandbox *sb_new(const char *id, dsec_err *err)
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

static void sb_paths(const struct ct_backend *be, dsec_sandbox *sb)
{
    dsec__ct_fmt(sb->dir, sizeof sb->dir, "%s/%s", be->sbroot, sb->id);
    dsec__ct_fmt(sb->subvol, sizeof sb->subvol, "%s/sb/%s", be->store, sb->id);
}

static void release_lowers(struct ct_backend *be, dsec_sandbox *sb)
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

static int hold_lowers(struct ct_backend *be, dsec_sandbox *sb, dsec_err *err)
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
    pthread_mutex_lock(&be->lock);
    if (!sb->listed) {
        sb->live_next = be->live;
        be->live = sb;
        sb->listed = true;
    }
    pthread_mutex_unlock(&be->lock);
}

static void live_del(struct ct_backend *be, dsec_sandbox *sb)
{
    pthread_mutex_lock(&be->lock);
    if (sb->listed) {
        dsec_sandbox **pp = &be->live;
        while (*pp != NULL && *pp != sb)
            pp = &(*pp)->live_next;
        if (*pp == sb)
            *pp = sb->live_next;
        sb->listed = false;
    }
    pthread_mutex_unlock(&be->lock);
}

/* Whether a sandbox this instance holds has this id, or runs as this runtime id (a warm
 * container it took; runtime ids of warm containers are never sandbox ids). */
static bool live_has(struct ct_backend *be, const char *name)
{
    pthread_mutex_lock(&be->lock);
    dsec_sandbox *s = be->live;
    while (s != NULL && strcmp(s->id, name) != 0 && strcmp(s->rid, name) != 0)
        s = s->live_next;
    struct ct_kept *k = be->kept;
    while (s == NULL && k != NULL && strcmp(k->id, name) != 0 && strcmp(k->rid, name) != 0)
        k = k->next;
    pthread_mutex_unlock(&be->lock);
    return s != NULL || k != NULL;
}

/* Remember a sandbox adopt left as it was, so the sweep does too; net (may be NULL) is its
 * network, held until the backend closes. */
static void kept_add(struct ct_backend *be, const dsec_sandbox *sb, dsec_net_sbx *net)
{
    struct ct_kept *k = dsec_calloc(1, sizeof *k);
    if (k == NULL) {
        dsec_net_release(net);
        return;
    }
    memcpy(k->id, sb->id, sizeof k->id);
    memcpy(k->rid, sb->rid, sizeof k->rid);
    k->net = net;
    pthread_mutex_lock(&be->lock);
    k->next = be->kept;
    be->kept = k;
    pthread_mutex_unlock(&be->lock);
}

/* Undo whatever of sb's start-up was done; frees sb on success. */
static int sb_teardown(struct ct_backend *be, dsec_sandbox *sb, dsec_err *err)
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
    release_lowers(be, sb);
    if (sb->made_dir) {
        if (dsec__ct_rmtree(sb->dir) < 0)
            return dsec_err_set(err, DSEC_E_IO, errno, "container: removing %s", sb->dir);
        sb->made_dir = false;
    }
    live_del(be, sb);
    env_clear(&sb->env);
    dsec_free(sb->snapshot_name);
    sb_free_fields(sb);
    dsec_free(sb);
    return 0;
}

/* Clean up after a failure without losing its error. */
static void sb_abandon(struct ct_backend *be, dsec_sandbox *sb)
{
    dsec_err e2;
    if (sb_teardown(be, sb, &e2) < 0)
        fprintf(stderr, "dsec container: cleaning up a failed sandbox %s: %s\n", sb->id, e2.msg);
}

/* A "key value" line of a record, NUL-terminated in out ("" when absent or too long). */
static void record_value(const char *text, const char *key, char *out, size_t len)
{
    char k[32];
    dsec__ct_fmt(k, sizeof k, "\n%s ", key);
    const char *r = text != NULL ? strstr(text, k) : NULL;
    size_t n = r != NULL ? strcspn(r + strlen(k), "\n") : 0;
    if (r == NULL || n >= len)
        n = 0;
    else
        memcpy(out, r + strlen(k), n);
    out[n] = '\0';
}

/* What the sweep needs of an orphan: the runtime id its meta names, if it has one (a warm
 * container it took), and the runtime that started it: its meta's, or before meta named one,
 * the runtime whose state dir it has, else the configured one. -1 (said on stderr) when that
 * runtime cannot be run here: the orphan is then left alone. */
static int meta_peek(struct ct_backend *be, dsec_sandbox *sb)
{
    char mp[PATH_MAX + 16];
    dsec__ct_fmt(mp, sizeof mp, "%s/meta", sb->dir);
    char *text = dsec__ct_read_file(mp, 1u << 20);
    char rid[sizeof sb->rid];
    record_value(text, "rid", rid, sizeof rid);
    if (dsec__ct_is_warm_rid(rid))
        memcpy(sb->rid, rid, sizeof rid);
    record_value(text, "runtime", sb->rt_name, sizeof sb->rt_name);
    dsec_free(text);
    const char *name = sb->rt_name;
    if (name[0] == '\0')
        name = dsec__ct_rt_guess(be, sb->rid);
    if (name == NULL)
        name = be->rt->name;
    dsec_err err;
    if ((sb->rt = dsec__ct_rt_get(be, name, &err)) == NULL) {
        fprintf(stderr, "dsec container: leaving orphan sandbox %s as it is: %s\n", sb->id,
                err.msg);
        return -1;
    }
    return 0;
}

/*
 * The sweep: what a node manager that crashed (or lost its journal) left and
 * never re-adopted. Any sandbox id with a bundle dir, an upper subvolume or a
 * runtime state dir that no record of this instance holds is an orphan: its
 * container is killed and everything of it removed, whether its meta is
 * readable or not (a create cut short left none); an orphan that took a warm
 * container names its runtime id in its meta. Then the warm containers of
 * earlier instances no held sandbox took, every fork snapshot no held
 * sandbox references (children re-adopted have re-referenced theirs), and
 * half-written snapshot blobs go.
 */
static int sweep_dir(struct ct_backend *be, const char *dir, bool blobs)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (blobs) {
            size_t len = strlen(e->d_name);
            if (strncmp(e->d_name, "pack-", 5) == 0 && len > 5 &&
                strcmp(e->d_name + len - 5, ".blob") == 0)
                unlinkat(dirfd(d), e->d_name, 0);
            continue;
        }
        if (dsec_name_ok(e->d_name, DSEC_SBX_ID_LEN_MAX) < 0 || live_has(be, e->d_name))
            continue;
        dsec_sandbox *sb = dsec_calloc(1, sizeof *sb);
        if (sb == NULL)
            break;
        dsec__ct_fmt(sb->id, sizeof sb->id, "%s", e->d_name);
        memcpy(sb->rid, sb->id, sizeof sb->rid);
        sb_paths(be, sb);
        if (meta_peek(be, sb) < 0) {
            dsec_free(sb);
            continue;
        }
        /* everything may exist: each step of teardown copes with its absence */
        sb->made_dir = sb->made_subvol = sb->mounted = sb->started = true;
        dsec_err err;
        if (sb_teardown(be, sb, &err) < 0) {
            fprintf(stderr, "dsec container: reclaiming orphan sandbox %s: %s\n", e->d_name,
                    err.msg);
            dsec_free(sb);
        } else {
            n++;
        }
    }
    closedir(d);
    return n;
}

static void sweep_once(struct ct_backend *be)
{
    if (atomic_load(&be->swept))
        return;
    pthread_mutex_lock(&be->sweep_lock);
    if (!atomic_load(&be->swept)) {
        uint64_t t0 = dsec_now_ns();
        char p[PATH_MAX + 16];
        int n = sweep_dir(be, be->sbroot, false);
        dsec__ct_fmt(p, sizeof p, "%s/sb", be->store);
        n += sweep_dir(be, p, false);
        n += sweep_dir(be, be->run_root, false);
        sweep_dir(be, be->state_dir, true);
        n += dsec__ct_pool_sweep(be, live_has);
        int snaps = dsec__ct_snap_sweep(be);
        if (n > 0 || snaps > 0)
            fprintf(stderr,
                    "dsec container: reclaimed %d orphan sandboxes and %d fork snapshots left by "
                    "an earlier node manager (%.1f ms)\n",
                    n, snaps, (double)(dsec_now_ns() - t0) / 1e6);
        atomic_store(&be->swept, true);
    }
    pthread_mutex_unlock(&be->sweep_lock);
}

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

static void sock_path(const dsec_sandbox *sb, char *out, size_t len)
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
    if (write_meta(sb, err) < 0 || dsec__ct_oci_write(be, sb, err) < 0)
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
    if (write_meta(sb, err) < 0 || dsec__ct_oci_write(be, sb, err) < 0)
        return -1;
    uint64_t t1 = dsec_now_ns();
    if (dsec__ct_rt_switch_root(be, sb->rid, init, root_fd, sb->id, sb->net != NULL, err) < 0)
        return -1;
    uint64_t t2 = dsec_now_ns();
    if (dsec__ct_cg_limits(be, sb->rid, sb->memory_mb, sb->cpu_milli, err) < 0)
        return -1;
    uint64_t t3 = dsec_now_ns();
    if (dsec_agent_setup(sb->agent, (const char *const *)sb->env.vars, sb->env.nvars,
                         sb->env.workdir != NULL ? sb->env.workdir : "/",
                         sb->env.user != NULL ? sb->env.user : "root", err) < 0)
        return dsec_err_wrap(err, "container: the agent refused the sandbox's defaults");
    if (be->trace)
        fprintf(stderr,
                "dsec container: warm %s as %s: meta+config %.2f ms, root switch %.2f ms, limits %.2f "
                "ms, agent %.2f ms\n",
                sb->id, sb->rid, (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6,
                (double)(t3 - t2) / 1e6, (double)(dsec_now_ns() - t3) / 1e6);
    return 0;
}

/* Bring sb (id, env, limits set) up; on failure the caller abandons it.
 * DSEC_CONTAINER_TRACE=1: how long its steps took, on stderr. */
static int sb_start(struct ct_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    uint64_t t0 = dsec_now_ns();
    sb_paths(be, sb);
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
    if (hold_lowers(be, sb, err) < 0)
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
            fprintf(stderr, "dsec container: start %s: root %.2f ms, warm container %.2f ms\n",
                    sb->id, (double)(t1 - t0) / 1e6, (double)(dsec_now_ns() - t1) / 1e6);
        return rc;
    }
    rc = sb_launch(be, sb, root_fd, err);
    if (root_fd >= 0)
        close(root_fd);
    if (rc < 0)
        return -1;
    uint64_t t2 = dsec_now_ns();
    char sp[PATH_MAX + 16];
    sock_path(sb, sp, sizeof sp);
    /* in short rounds, so an agent that died at start (a bad user or
     * workdir) is reported at once, with what it said */
    uint64_t deadline = dsec_now_ns() + be->start_timeout_ms * 1000000u;
    for (;;) {
        if (dsec_agent_connect(&sb->agent, sp, 200, err) == 0) {
            if (be->trace)
                fprintf(stderr,
                        "dsec container: start %s: root %.2f ms, runtime %.2f ms, agent %.2f ms\n",
                        sb->id, (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6,
                        (double)(dsec_now_ns() - t2) / 1e6);
            return 0;
        }
        if (!dsec__ct_alive(be, sb->rid)) {
            char lp[PATH_MAX + 16];
            dsec__ct_fmt(lp, sizeof lp, "%s/agent.log", sb->dir);
            char *log = dsec__ct_read_file(lp, 4096);
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
static int create_env(struct ct_backend *be, const dsec_sandbox_spec *spec, struct ct_env *env,
                      dsec_sandbox **out, char **backend_state, dsec_err *err)
{
    dsec_sandbox *sb = sb_new(spec->id, err);
    if (sb == NULL) {
        env_clear(env);
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
        sb_abandon(be, sb);
        return -1;
    }
    const char *sn = label(spec, "snapshot_name");
    if (sn != NULL && !dsec_layer_name_valid(sn)) {
        dsec_err_set(err, DSEC_E_INVALID, 0,
                     "container: label snapshot_name=\"%.80s\" is not name:version", sn);
        sb_abandon(be, sb);
        return -1;
    }
    if (set_str(&sb->snapshot_name, sn, err) < 0 || set_str(&sb->tenant, spec->tenant, err) < 0 ||
        net_entries_add(sb, spec->net, spec->nnet, err) < 0 || sb_start(be, sb, err) < 0) {
        if (err->code == DSEC_E_EXISTS) { /* not ours to remove */
            sb->made_dir = false;
            sb->started = false;
        }
        sb_abandon(be, sb);
        return -1;
    }
    if ((*backend_state = dsec_strdup(sb->dir)) == NULL) {
        sb_abandon(be, sb);
        return oom(err, "backend state");
    }
    *out = sb;
    return 0;
}

static int ct_create(void *self, const dsec_sandbox_spec *spec, dsec_sandbox **out,
                     char **backend_state, dsec_err *err)
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
    sweep_once(be);
    struct ct_env env;
    if (env_from_spec(be, spec, &env, err) < 0)
        return -1;
    uint64_t t1 = dsec_now_ns();
    int rc = create_env(be, spec, &env, out, backend_state, err);
    if (be->trace)
        fprintf(stderr, "dsec container: create %s: environment %.2f ms, in all %.2f ms\n",
                spec->id, (double)(t1 - t0) / 1e6, (double)(dsec_now_ns() - t0) / 1e6);
    return rc;
}

/* ---- the agent ----------------------------------------------------------------------- */

/* An agent that does not answer is either dead or alive and busy; the two need different
 * answers (destroy the sandbox, or wait and lighten its load), so an error says which, from
 * what the host sees of its container - its cgroups and /proc, never the agent itself. The
 * agent is the container's init: when it dies, the kernel kills the rest of the container.
 * Fills err (keeping what was seen of the failure in its message) and returns -1. */
static int agent_unanswered(const struct ct_backend *be, const dsec_sandbox *sb, dsec_err *err)
{
    struct ct_agent_probe p;
    dsec__ct_agent_probe(be, sb->rid, &p);
    char seen[DSEC_ERR_MSG_MAX];
    dsec__ct_fmt(seen, sizeof seen, "%s", err->msg[0] ? err->msg : "no answer");
    int errnum = err->errnum;
    if (p.init == 0 || p.state == 'Z' || p.state == 'X') {
        char where[160], cause[200];
        if (!p.cgroup)
            dsec__ct_fmt(where, sizeof where, "its container's cgroup is gone");
        else if (p.init != 0)
            dsec__ct_fmt(where, sizeof where, "its init (pid %d on the host) has exited",
                         (int)p.init);
        else if (p.nprocs > 0)
            dsec__ct_fmt(where, sizeof where, "its init is gone, %u processes remain", p.nprocs);
        else
            dsec__ct_fmt(where, sizeof where, "its container has no processes left");
        if (p.oom_kills > 0 && p.mem_limit > 0)
            dsec__ct_fmt(cause, sizeof cause,
                         "its memory cgroup recorded %" PRIu64 " OOM kill(s) at its limit of "
                         "%" PRIu64 " MiB: out of memory is the likely cause",
                         p.oom_kills, p.mem_limit >> 20);
        else if (p.oom_kills > 0)
            dsec__ct_fmt(cause, sizeof cause,
                         "its memory cgroup recorded %" PRIu64
                         " OOM kill(s): out of memory is the likely cause",
                         p.oom_kills);
        else
            dsec__ct_fmt(cause, sizeof cause,
                         "no OOM kill is recorded in its memory cgroup: it was killed or crashed");
        return dsec_err_set(err, DSEC_E_BACKEND, 0, /* a broken pipe says nothing more */
                            "container: the sandbox's agent is dead: %s; %s. Nothing more can run "
                            "in this sandbox: destroy it",
                            where, cause);
    }
    /* Alive: say what keeps it from answering, as far as the host can tell. */
    char why[320] = "";
    size_t used = 0;
#define WHY(...)                                                                                   \
    do {                                                                                           \
        if (used < sizeof why)                                                                     \
            used += (size_t)snprintf(why + used, sizeof why - used, __VA_ARGS__);                  \
    } while (0)
    if (p.frozen)
        WHY("; its cgroup is frozen (the sandbox is paused)");
    if (p.state == 'T' || p.state == 't')
        WHY("; it is stopped (state %c: SIGSTOP or a debugger)", p.state);
    if (p.pids_max > 0 && p.pids >= p.pids_max)
        WHY("; its container is at its process limit (pids %" PRIu64 " of %" PRIu64
            "), as in a fork bomb",
            p.pids, p.pids_max);
    if (p.cpu_throttled > 0)
        WHY("; its CPU quota has throttled it %" PRIu64 " times", p.cpu_throttled);
    if (p.oom_kills > 0)
        WHY("; its memory cgroup recorded %" PRIu64 " OOM kill(s) of other processes", p.oom_kills);
    if (!p.frozen && p.state != 'T' && p.state != 't' && p.nprocs > 1)
        WHY("; it may be starved of CPU by the %u other processes of its container", p.nprocs - 1);
    else if (!p.frozen && p.state != 'T' && p.state != 't')
        WHY("; it may be starved of CPU or memory on the host");
#undef WHY
    return dsec_err_set(err, err->code, errnum,
                        "container: the sandbox's agent is alive (pid %d on the host, state %c) "
                        "but %s: %s%s",
                        (int)p.init, p.state ? p.state : '?',
                        err->code == DSEC_E_TIMEOUT ? "did not answer in time"
                                                    : "its connection failed",
                        seen, why);
}

/* The connection, re-made when an earlier call lost it. */
static int agent(const struct ct_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    if (sb->agent != NULL)
        return 0;
    /* dead: say so now, not after the connect's wait. Dead is no init (pid 1 of the
     * container), not no process: a killed init's last processes linger a moment. */
    struct ct_agent_probe p;
    dsec__ct_agent_probe(be, sb->rid, &p);
    if (p.init == 0 || p.state == 'Z' || p.state == 'X') {
        dsec_err_set(err, DSEC_E_CONN, 0, "no init in its container");
        return agent_unanswered(be, sb, err);
    }
    char sp[PATH_MAX + 16];
    sock_path(sb, sp, sizeof sp);
    if (dsec_agent_connect(&sb->agent, sp, 2000, err) < 0)
        return agent_unanswered(be, sb, err);
    return 0;
}

/* After a failed agent call: a lost connection is dropped so the next call reconnects, and
 * the error says whether the agent is dead or alive and not answering. */
static int agent_failed(const struct ct_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    if (err->code == DSEC_E_CONN || err->code == DSEC_E_IO || err->code == DSEC_E_CLOSED ||
        err->code == DSEC_E_TIMEOUT || err->code == DSEC_E_DECODE) {
        dsec_agent_free(sb->agent);
        sb->agent = NULL;
        return agent_unanswered(be, sb, err);
    }
    return -1;
}

static size_t ct_default_cmd(void *self, dsec_sandbox *sb, const char *const **argv)
{
    (void)self;
    *argv = (const char *const *)sb->env.cmd;
    return sb->env.ncmd;
}

static int ct_exec(void *self, dsec_sandbox *sb, const dsec_exec_req *req, dsec_exec_result *res,
                   dsec_err *err)
{
    const struct ct_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    if (dsec_agent_exec(sb->agent, req, req->on_output, req->on_output_arg, res, err) < 0)
        return agent_failed(be, sb, err);
    return 0;
}

/* A command in flight: on failure, the lost connection is dropped and the error says
 * whether the agent is dead or alive, as for a waited exec. */
struct ct_run {
    const struct ct_backend *be;
    dsec_sandbox *sb;
    dsec_exec_done_fn done;
    void *ud;
};

static void ct_exec_done(void *ud, int rc, dsec_exec_result *res, dsec_err *err)
{
    struct ct_run r = *(struct ct_run *)ud;
    dsec_free(ud);
    if (rc < 0)
        agent_failed(r.be, r.sb, err);
    r.done(r.ud, rc, res, err);
}

static int ct_exec_start(void *self, dsec_sandbox *sb, const dsec_exec_req *req,
                         struct dsec_loop *loop, dsec_exec_done_fn done, void *ud, dsec_err *err)
{
    const struct ct_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    struct ct_run *r = dsec_malloc(sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container: a command in flight");
    *r = (struct ct_run){.be = be, .sb = sb, .done = done, .ud = ud};
    if (dsec_agent_exec_start(sb->agent, loop, req, req->on_output, req->on_output_arg,
                              ct_exec_done, r, err) < 0) {
        dsec_free(r);
        return agent_failed(be, sb, err);
    }
    return 0;
}

/* A file transfer in flight: on failure, as a command's (ct_exec_done). */
struct ct_xfer {
    const struct ct_backend *be;
    dsec_sandbox *sb;
    dsec_file_done_fn done;
    void *ud;
};

static void ct_xfer_done(void *ud, int rc, dsec_file_data *data, dsec_err *err)
{
    struct ct_xfer x = *(struct ct_xfer *)ud;
    dsec_free(ud);
    if (rc < 0 && dsec_agent_broken(x.sb->agent))
        agent_failed(x.be, x.sb, err);
    x.done(x.ud, rc, data, err);
}

/* The transfer's state, and the agent's connection for it; NULL with err set. */
static struct ct_xfer *ct_xfer_new(const struct ct_backend *be, dsec_sandbox *sb,
                                   dsec_file_done_fn done, void *ud, dsec_err *err)
{
    if (agent(be, sb, err) < 0)
        return NULL;
    struct ct_xfer *x = dsec_malloc(sizeof *x);
    if (x == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container: a file transfer in flight");
        return NULL;
    }
    *x = (struct ct_xfer){.be = be, .sb = sb, .done = done, .ud = ud};
    return x;
}

static int ct_file_write_start(void *self, dsec_sandbox *sb, const char *path, const void *data,
                               size_t len, uint32_t mode, bool append, struct dsec_loop *loop,
                               dsec_file_done_fn done, void *ud, dsec_err *err)
{
    struct ct_xfer *x = ct_xfer_new(self, sb, done, ud, err);
    if (x == NULL)
        return -1;
    if (dsec_agent_file_write_start(sb->agent, loop, path, data, len, mode, append, ct_xfer_done,
                                    x, err) < 0) {
        dsec_free(x);
        return dsec_agent_broken(sb->agent) ? agent_failed(self, sb, err) : -1;
    }
    return 0;
}

static int ct_file_read_start(void *self, dsec_sandbox *sb, const char *path, uint64_t offset,
                              uint64_t max, struct dsec_loop *loop, dsec_file_done_fn done,
                              void *ud, dsec_err *err)
{
    struct ct_xfer *x = ct_xfer_new(self, sb, done, ud, err);
    if (x == NULL)
        return -1;
    if (dsec_agent_file_read_start(sb->agent, loop, path, offset, max, ct_xfer_done, x, err) <
        0) {
        dsec_free(x);
        return dsec_agent_broken(sb->agent) ? agent_failed(self, sb, err) : -1;
    }
    return 0;
}

static int ct_file_write(void *self, dsec_sandbox *sb, const char *path, const void *data,
                         size_t len, uint32_t mode, bool append, dsec_err *err)
{
    const struct ct_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    /* the agent takes at most DSEC_AGENT_FILE_MAX per call: larger writes go in pieces */
    const uint8_t *p = data;
    size_t off = 0;
    do {
        size_t n = len - off > DSEC_AGENT_FILE_MAX ? DSEC_AGENT_FILE_MAX : len - off;
        if (dsec_agent_file_write(sb->agent, path, p + off, n, mode, append || off > 0, err) < 0)
            return agent_failed(be, sb, err);
        off += n;
    } while (off < len);
    return 0;
}

static int ct_file_read(void *self, dsec_sandbox *sb, const char *path, uint64_t offset,
                        uint64_t max, dsec_file_data *out, dsec_err *err)
{
    const struct ct_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    /* the agent answers at most DSEC_AGENT_FILE_MAX a call: page until max or the end */
    memset(out, 0, sizeof *out);
    for (;;) {
        uint64_t want = max == 0 ? 0 : max - out->len;
        dsec_file_data part;
        if (dsec_agent_file_read(sb->agent, path, offset + out->len, want, &part, err) < 0) {
            dsec_free(out->data);
            memset(out, 0, sizeof *out);
            return agent_failed(be, sb, err);
        }
        if (out->data == NULL) {
            *out = part;
        } else if (part.len > 0) {
            uint8_t *grown = dsec_realloc(out->data, out->len + part.len);
            if (grown == NULL) {
                dsec_free(part.data);
                dsec_free(out->data);
                memset(out, 0, sizeof *out);
                return dsec_err_set(err, DSEC_E_NOMEM, 0, "container: reading %s: out of memory",
                                    path);
            }
            memcpy(grown + out->len, part.data, part.len);
            out->data = grown;
            out->len += part.len;
            out->size = part.size;
            out->eof = part.eof;
            dsec_free(part.data);
        } else {
            out->eof = part.eof;
            out->size = part.size;
        }
        if (out->eof || part.len == 0 || (max != 0 && out->len >= max))
            return 0;
    }
}

static int ct_file_list(void *self, dsec_sandbox *sb, const char *path, dsec_file_entry **entries,
                        size_t *n, dsec_err *err)
{
    const struct ct_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    if (dsec_agent_file_list(sb->agent, path, entries, n, err) < 0)
        return agent_failed(be, sb, err);
    return 0;
}

static int ct_file_op(void *self, dsec_sandbox *sb, const dsec_file_op *op, dsec_file_entry *st,
                      dsec_err *err)
{
    const struct ct_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    if (dsec_agent_file_op(sb->agent, op, st, err) < 0)
        return agent_failed(be, sb, err);
    return 0;
}

/* ---- background processes --------------------------------------------------------------- */

/* Each call once: a failure drops a lost connection (agent_failed) and is reported, never sent
 * again (a start or a stdin write may have reached the agent). */
#define CT_AGENT(be, sb, err, call)                                                                \
    do {                                                                                           \
        if (agent(be, sb, err) < 0)                                                                \
            return -1;                                                                             \
        if ((call) < 0)                                                                            \
            return agent_failed(be, sb, err);                                                      \
        return 0;                                                                                  \
    } while (0)

static int ct_proc_start(void *self, dsec_sandbox *sb, const dsec_proc_start_req *req,
                         dsec_proc_info *out, dsec_err *err)
{
    CT_AGENT((const struct ct_backend *)self, sb, err,
             dsec_agent_proc_start(sb->agent, req, out, err));
}

/* The process calls but start go on a connection other than the sandbox's own (backend.h):
 * the node makes them beside a command or a transfer that holds that one (its side lane),
 * to interrupt a shell session's command or to read, feed and list processes meanwhile. */
static int side_connect(const struct ct_backend *be, dsec_sandbox *sb, const char *what,
                        dsec_agent **a, dsec_err *err)
{
    *a = NULL;
    struct ct_agent_probe pr;
    dsec__ct_agent_probe(be, sb->rid, &pr);
    if (pr.init == 0 || pr.state == 'Z' || pr.state == 'X')
        return dsec_err_set(err, DSEC_E_CONN, 0,
                            "container %s: no agent for %s (no init in its container)", sb->rid,
                            what);
    char sp[PATH_MAX + 16];
    sock_path(sb, sp, sizeof sp);
    if (dsec_agent_connect(a, sp, 1000, err) < 0)
        return dsec_err_wrap(err, "container %s: %s", sb->rid, what);
    return 0;
}

/* The side lane's connection, kept from call to call (a keystroke need not pay a connect);
 * while another call holds it (a signal beside a stdin write), a short one (*own). */
static int side_take(const struct ct_backend *be, dsec_sandbox *sb, const char *what,
                     dsec_agent **a, bool *own, dsec_err *err)
{
    bool free_ = false;
    *own = !atomic_compare_exchange_strong(&sb->side_busy, &free_, true);
    if (*own)
        return side_connect(be, sb, what, a, err);
    if (sb->side == NULL && side_connect(be, sb, what, &sb->side, err) < 0) {
        atomic_store(&sb->side_busy, false);
        return -1;
    }
    *a = sb->side;
    return 0;
}

static int side_give(dsec_sandbox *sb, dsec_agent *a, bool own, int rc)
{
    if (own) {
        dsec_agent_free(a);
        return rc;
    }
    if (rc < 0 && dsec_agent_broken(a)) { /* the next call connects again */
        dsec_agent_free(sb->side);
        sb->side = NULL;
    }
    atomic_store(&sb->side_busy, false);
    return rc;
}

#define CT_SIDE(be, sb, what, err, call)                                                           \
    do {                                                                                           \
        dsec_agent *a;                                                                             \
        bool own;                                                                                  \
        if (side_take((be), (sb), (what), &a, &own, (err)) < 0)                                    \
            return -1;                                                                             \
        return side_give((sb), a, own, (call));                                                    \
    } while (0)

static int ct_proc_list(void *self, dsec_sandbox *sb, dsec_proc_info **out, size_t *n,
                        dsec_err *err)
{
    CT_SIDE((const struct ct_backend *)self, sb, "listing processes", err,
            dsec_agent_proc_list(a, out, n, err));
}

static int ct_proc_signal(void *self, dsec_sandbox *sb, uint64_t handle, int sig, dsec_err *err)
{
    CT_SIDE((const struct ct_backend *)self, sb, "signalling a process", err,
            dsec_agent_proc_signal(a, handle, sig, err));
}

static int ct_proc_stdin(void *self, dsec_sandbox *sb, uint64_t handle, const void *data,
                         size_t len, bool close, dsec_err *err)
{
    CT_SIDE((const struct ct_backend *)self, sb, "writing a process's stdin", err,
            dsec_agent_proc_stdin(a, handle, data, len, close, err));
}

static int ct_proc_output(void *self, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                          uint64_t err_off, uint64_t max, dsec_proc_output *out, dsec_err *err)
{
    CT_SIDE((const struct ct_backend *)self, sb, "reading a process's output", err,
            dsec_agent_proc_output(a, handle, out_off, err_off, max, out, err));
}

static int ct_proc_resize(void *self, dsec_sandbox *sb, uint64_t handle, uint16_t rows,
                          uint16_t cols, dsec_err *err)
{
    CT_SIDE((const struct ct_backend *)self, sb, "resizing a terminal", err,
            dsec_agent_proc_resize(a, handle, rows, cols, err));
}

/* A waiting output request, on a connection of its own (the sandbox's may be an exec's
 * meanwhile). It holds nothing of the sandbox: destroyed meanwhile, its agent goes and the
 * connection with it, which ends the request with an error. */
struct ct_follow {
    dsec_agent *a;
    dsec_proc_output_done_fn done;
    void *ud;
};

static void ct_follow_done(void *ud, int rc, dsec_proc_output *out, dsec_err *err)
{
    struct ct_follow f = *(struct ct_follow *)ud;
    dsec_free(ud);
    f.done(f.ud, rc, out, err);
    dsec_agent_free(f.a);
}

static int ct_proc_follow_start(void *self, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                                uint64_t err_off, uint64_t max, uint32_t wait_ms,
                                struct dsec_loop *loop, dsec_proc_output_done_fn done, void *ud,
                                dsec_err *err)
{
    /* on the loop's thread: a dead agent is told at once, not after a connect's retries */
    struct ct_follow *f = dsec_calloc(1, sizeof *f);
    if (f == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container: a followed process");
    if (side_connect(self, sb, "following a process", &f->a, err) < 0) {
        dsec_free(f);
        return -1;
    }
    f->done = done;
    f->ud = ud;
    if (dsec_agent_proc_output_start(f->a, loop, handle, out_off, err_off, max, wait_ms,
                                     ct_follow_done, f, err) < 0) {
        dsec_agent_free(f->a);
        dsec_free(f);
        return -1;
    }
    return 0;
}

/* ---- pause, fork ------------------------------------------------------------------------ */

static int ct_pause(void *self, dsec_sandbox *sb, dsec_err *err)
{
    return dsec__ct_freeze(self, sb->rid, true, err);
}

static int ct_resume(void *self, dsec_sandbox *sb, dsec_err *err)
{
    return dsec__ct_freeze(self, sb->rid, false, err);
}

/* Thaw sb after a freeze of our own, trying a few times: a frozen sandbox left behind
 * answers nothing. -1 with err (the last failure in the message) if it stays frozen. */
static int thaw_or_say(struct ct_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    dsec_err e;
    dsec_err_set(&e, DSEC_E_STATE, 0, "thawed, but its freezer still says frozen");
    for (int i = 0; i < 5; i++)
        if (dsec__ct_freeze(be, sb->rid, false, &e) == 0 && !dsec__ct_frozen(be, sb->rid))
            return 0;
    return dsec_err_set(err, e.code, e.errnum,
                        "container: the sandbox stays frozen after a fork's snapshot (%s): "
                        "resume it, or destroy it",
                        e.msg);
}

/* A read-only snapshot of sb's upper subvolume, taken with sb frozen so no
 * write is half-done in it. *name receives the snapshot's name. */
static int freeze_snapshot(struct ct_backend *be, dsec_sandbox *sb, const char *tag, char *name,
                           size_t len, dsec_err *err)
{
    unique_name(sb->id, tag, name, len);
    char dst[PATH_MAX + 128];
    dsec__ct_snap_path(be, name, dst, sizeof dst);
    dsec_err e2;
    /* an already paused sandbox stays paused */
    bool paused = dsec__ct_frozen(be, sb->rid);
    if (!paused && dsec__ct_freeze(be, sb->rid, true, err) < 0) {
        /* a freeze that did not finish in time may finish later: never leave the sandbox
         * frozen behind a failed fork (its agent would stop answering for good) */
        thaw_or_say(be, sb, err);
        return -1;
    }
    int rc = dsec__ct_subvol_snapshot(be, sb->subvol, dst, err);
    if (!paused && thaw_or_say(be, sb, rc < 0 ? &e2 : err) < 0 && rc == 0) {
        dsec_err e3;
        dsec__ct_subvol_delete(be, dst, &e3);
        return -1;
    }
    return rc;
}

struct fork_job {
    struct ct_backend *be;
    const dsec_sandbox *parent;
    const char *snap;
    const char *const *ids;
    size_t n;
    dsec_sandbox **children;
    _Atomic size_t next;
    pthread_mutex_t lock;
    dsec_err err; /* the first failure */
    bool failed;
};

static void *fork_worker(void *arg)
{
    struct fork_job *j = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n)
            break;
        pthread_mutex_lock(&j->lock);
        bool stop = j->failed;
        pthread_mutex_unlock(&j->lock);
        if (stop)
            break;
        dsec_err err;
        dsec_err_clear(&err);
        dsec_sandbox *c = sb_new(j->ids[i], &err);
        int rc = c == NULL ? -1 : env_copy(&c->env, &j->parent->env, &err);
        if (rc == 0) {
            c->cpu_milli = j->parent->cpu_milli;
            c->memory_mb = j->parent->memory_mb;
            c->disk_mb = j->parent->disk_mb;
            rc = add_lower(&c->env, true, j->snap, 0, &err);
        }
        if (rc == 0) {
            rc = set_str(&c->tenant, j->parent->tenant, &err);
            if (rc == 0)
                rc = net_entries_add(c, (const char *const *)j->parent->net_entries,
                                     j->parent->nnet, &err);
        }
        if (rc == 0)
            rc = sb_start(j->be, c, &err);
        if (rc < 0) {
            if (c != NULL) {
                if (err.code == DSEC_E_EXISTS)
                    c->made_dir = c->started = false;
                sb_abandon(j->be, c);
            }
            pthread_mutex_lock(&j->lock);
            if (!j->failed) {
                j->err = err;
                dsec_err_wrap(&j->err, "fork child %zu", i);
                j->failed = true;
            }
            pthread_mutex_unlock(&j->lock);
            break;
        }
        j->children[i] = c;
    }
    return NULL;
}

static int ct_fork(void *self, dsec_sandbox *sb, const char *const *ids, size_t n,
                   dsec_sandbox **children, char **states, dsec_err *err)
{
    struct ct_backend *be = self;
    for (size_t i = 0; i < n; i++) {
        children[i] = NULL;
        states[i] = NULL;
        if (ids[i] == NULL || dsec_name_ok(ids[i], DSEC_SBX_ID_LEN_MAX) < 0)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "container: fork child id %zu is not 1..%d of [A-Za-z0-9_-]", i,
                                DSEC_SBX_ID_LEN_MAX);
        for (size_t k = 0; k < i; k++)
            if (strcmp(ids[k], ids[i]) == 0)
                return dsec_err_set(err, DSEC_E_INVALID, 0,
                                    "container: fork child ids %zu and %zu are equal", k, i);
    }
    sweep_once(be);
    uint64_t t0 = dsec_now_ns();
    char snap[sizeof((struct ct_snap *)0)->name];
    if (freeze_snapshot(be, sb, "f", snap, sizeof snap, err) < 0)
        return dsec_err_wrap(err, "container: fork");
    uint64_t t1 = dsec_now_ns();
    /* hold the snapshot while children start, so a failed child does not
     * take it away from the others */
    dsec__ct_snap_ref(be, snap);
    struct fork_job j = {
        .be = be, .parent = sb, .snap = snap, .ids = ids, .n = n, .children = children};
    pthread_mutex_init(&j.lock, NULL);
    /* start-up is mostly waiting on the runtime: a few at a time */
    size_t nth = n < 8 ? n : 8;
    pthread_t th[8];
    size_t started = 0;
    for (; started < nth; started++)
        if (pthread_create(&th[started], NULL, fork_worker, &j) != 0)
            break;
    if (started == 0)
        fork_worker(&j);
    for (size_t i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&j.lock);
    int rc = 0;
    if (j.failed) {
        *err = j.err;
        rc = -1;
    }
    for (size_t i = 0; rc == 0 && i < n; i++)
        if ((states[i] = dsec_strdup(children[i]->dir)) == NULL)
            rc = oom(err, "backend state");
    if (rc < 0)
        for (size_t i = 0; i < n; i++) {
            if (children[i] != NULL)
                sb_abandon(be, children[i]);
            dsec_free(states[i]);
            children[i] = NULL;
            states[i] = NULL;
        }
    dsec__ct_snap_unref(be, snap);
    if (be->trace)
        fprintf(stderr,
                "dsec container: fork of %zu: freeze+snapshot+thaw %.2f ms, children %.2f ms\n", n,
                (double)(t1 - t0) / 1e6, (double)(dsec_now_ns() - t1) / 1e6);
    return rc;
}

/* ---- snapshot and restore ------------------------------------------------------------------ */

/* Pack dir (an upper directory) as a layer in the registry. */
static int pack_dir(struct ct_backend *be, const char *dir, dsec_digest digest, dsec_err *err)
{
    char name[128], blob[PATH_MAX + 160];
    unique_name("pack", "b", name, sizeof name);
    dsec__ct_fmt(blob, sizeof blob, "%s/%s.blob", be->state_dir, name);
    if (dsec_layer_build(dir, DSEC_LAYER_DIR, (const char *const *)be->excludes, be->nexcludes,
                         blob, digest, err) < 0) {
        unlink(blob);
        return dsec_err_wrap(err, "container: packing %s", dir);
    }
    int rc = dsec_layer_registry_put(be->reg, digest, DSEC_LAYER_DIR, blob, err);
    unlink(blob);
    return rc < 0 ? dsec_err_wrap(err, "container: storing the snapshot layer") : 0;
}

/* The format of each registry layer whose format is not known yet. */
static int fill_formats(struct ct_backend *be, struct ct_env *e, dsec_err *err)
{
    bool need = false;
    for (size_t i = 0; i < e->nlowers; i++)
        need = need || e->lowers[i].format == 0;
    if (!need)
        return 0;
    dsec_layer_info *v = NULL;
    size_t n = 0;
    if (dsec_layer_registry_list(be->reg, &v, &n, err) < 0)
        return dsec_err_wrap(err, "container: listing layers");
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < e->nlowers; i++) {
        for (size_t k = 0; e->lowers[i].format == 0 && k < n; k++)
            if (strcmp(v[k].digest, e->lowers[i].name) == 0)
                e->lowers[i].format = (int)v[k].format;
        if (e->lowers[i].format == 0)
            rc = dsec_err_set(err, DSEC_E_NOT_FOUND, 0,
                              "container: layer %s is not in the registry", e->lowers[i].name);
    }
    dsec_layer_infos_free(v, n);
    return rc;
}

static int ct_snapshot(void *self, dsec_sandbox *sb, const char *path, const char *name,
                       dsec_err *err)
{
    struct ct_backend *be = self;
    const char *publish = name != NULL ? name : sb->snapshot_name;
    if (be->reg == NULL)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "container: snapshot needs a layer registry");
    sweep_once(be);
    /* the new environment: registry layers as they are, each fork snapshot
     * below the sandbox packed as a layer of its own, then its upper */
    struct ct_env ne;
    if (env_copy(&ne, &sb->env, err) < 0)
        return -1;
    char tmp[sizeof((struct ct_snap *)0)->name];
    if (freeze_snapshot(be, sb, "p", tmp, sizeof tmp, err) < 0) {
        env_clear(&ne);
        return dsec_err_wrap(err, "container: snapshot");
    }
    char p[PATH_MAX + 160];
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < ne.nlowers; i++) {
        if (!ne.lowers[i].snap)
            continue;
        dsec__ct_snap_path(be, ne.lowers[i].name, p, sizeof p);
        dsec__ct_fmt(p + strlen(p), sizeof p - strlen(p), "/upper");
        dsec_digest d;
        rc = pack_dir(be, p, d, err);
        if (rc == 0) {
            ne.lowers[i].snap = false;
            ne.lowers[i].format = DSEC_LAYER_DIR;
            dsec__ct_fmt(ne.lowers[i].name, sizeof ne.lowers[i].name, "%s", d);
        }
    }
    dsec_digest top = "";
    dsec__ct_snap_path(be, tmp, p, sizeof p);
    char up[PATH_MAX + 170];
    dsec__ct_fmt(up, sizeof up, "%s/upper", p);
    if (rc == 0)
        rc = pack_dir(be, up, top, err);
    dsec_err e2;
    dsec__ct_subvol_delete(be, p, &e2);
    if (rc == 0)
        rc = add_lower(&ne, false, top, DSEC_LAYER_DIR, err);
    if (rc == 0)
        rc = fill_formats(be, &ne, err);
    if (rc == 0 && publish != NULL) {
        dsec_env d = {.name = (char *)publish,
                      .nlayers = ne.nlowers,
                      .vars = ne.vars,
                      .nvars = ne.nvars,
                      .workdir = ne.workdir,
                      .user = ne.user,
                      .cmd = ne.cmd,
                      .ncmd = ne.ncmd,
                      .nentry = ne.nentry <= ne.ncmd ? ne.nentry : 0};
        d.layers = dsec_calloc(ne.nlowers, sizeof *d.layers);
        d.formats = dsec_calloc(ne.nlowers, sizeof *d.formats);
        if (d.layers == NULL || d.formats == NULL)
            rc = oom(err, "environment document");
        for (size_t i = 0; rc == 0 && i < ne.nlowers; i++) {
            d.layers[i] = ne.lowers[i].name;
            d.formats[i] = (dsec_layer_format)ne.lowers[i].format;
        }
        if (rc == 0 && dsec_layer_registry_tag_set(be->reg, publish, top, err) < 0)
            rc = dsec_err_wrap(err, "container: tagging the snapshot layer");
        if (rc == 0 && dsec_layer_registry_env_put(be->reg, &d, err) < 0)
            rc = dsec_err_wrap(err, "container: storing environment %s", publish);
        dsec_free(d.layers);
        dsec_free(d.formats);
        if (rc == 0 && set_str(&ne.name, publish, err) < 0)
            rc = -1;
    }
    if (rc == 0) {
        /* a restore needs no registry lookup by name: the file says it all */
        FILE *f = fopen(path, "we");
        if (f == NULL) {
            rc = dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", path);
        } else {
            fprintf(f, "dsec-container-snapshot 1\nlayer %s\n", top);
            put_env(f, &ne);
            if (fclose(f) != 0)
                rc = dsec_err_set(err, DSEC_E_IO, errno, "container: writing %s", path);
        }
    }
    env_clear(&ne);
    return rc;
}

static int snapfile_line(void *arg, const char *key, char *val, dsec_err *err)
{
    int t = take_env_line(arg, key, val, err);
    return t < 0 ? -1 : 0;
}

static int ct_restore(void *self, const dsec_sandbox_spec *spec, const char *path,
                      dsec_sandbox **out, char **backend_state, dsec_err *err)
{
    struct ct_backend *be = self;
    *out = NULL;
    *backend_state = NULL;
    if (be->reg == NULL)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "container: restore needs a layer registry");
    sweep_once(be);
    char *text = dsec__ct_read_file(path, 1u << 20);
    if (text == NULL)
        return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "container: reading snapshot %s", path);
    if (strncmp(text, "dsec-container-snapshot 1\n", 26) != 0) {
        dsec_free(text);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "container: %s is not a container snapshot",
                            path);
    }
    struct ct_env env = {0};
    int rc = parse_lines(text, snapfile_line, &env, err);
    dsec_free(text);
    for (size_t i = 0; rc == 0 && i < env.nlowers; i++)
        if (env.lowers[i].snap)
            rc = dsec_err_set(err, DSEC_E_DECODE, 0, "container: %s names a fork snapshot", path);
    if (rc == 0 && env.nlowers == 0)
        rc = dsec_err_set(err, DSEC_E_DECODE, 0, "container: %s names no layers", path);
    if (rc == 0 && (env.workdir == NULL || env.user == NULL))
        rc = dsec_err_set(err, DSEC_E_DECODE, 0, "container: %s lacks workdir or user", path);
    if (rc < 0) {
        env_clear(&env);
        return -1;
    }
    return create_env(be, spec, &env, out, backend_state, err);
}

/* ---- destroy, stats, adopt, detach -------------------------------------------------------- */

static int ct_destroy(void *self, dsec_sandbox *sb, dsec_err *err)
{
    sweep_once(self);
    return sb_teardown(self, sb, err);
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

static int ct_adopt(void *self, const dsec_sandbox_spec *spec, const char *backend_state,
                    dsec_sandbox **out, dsec_err *err)
{
    struct ct_backend *be = self;
    *out = NULL;
    if (backend_state == NULL || backend_state[0] != '/')
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "container: adopt needs the sandbox directory as backend state");
    char mp[PATH_MAX + 16];
    dsec__ct_fmt(mp, sizeof mp, "%s/meta", backend_state);
    char *text = dsec__ct_read_file(mp, 1u << 20);
    if (text == NULL)
        return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "container: reading %s", mp);
    dsec_sandbox *sb = dsec_calloc(1, sizeof *sb);
    if (sb == NULL) {
        dsec_free(text);
        return oom(err, "sandbox record");
    }
    int rc = strncmp(text, "dsec-container 1\n", 17) == 0
                 ? parse_lines(text, meta_line, sb, err)
                 : dsec_err_set(err, DSEC_E_DECODE, 0, "container: %s is not a sandbox record", mp);
    dsec_free(text);
    if (rc == 0 && sb->id[0] == '\0')
        rc = dsec_err_set(err, DSEC_E_DECODE, 0, "container: %s names no sandbox", mp);
    if (rc == 0 && sb->rid[0] == '\0')
        memcpy(sb->rid, sb->id, sizeof sb->rid);
    if (rc == 0 && spec != NULL && spec->id != NULL && strcmp(spec->id, sb->id) != 0)
        rc = dsec_err_set(err, DSEC_E_INVALID, 0, "container: the record is of sandbox %s", sb->id);
    if (rc == 0) {
        sb_paths(be, sb);
        if (strcmp(sb->dir, backend_state) != 0)
            rc = dsec_err_set(err, DSEC_E_INVALID, 0,
                              "container: %s is not a sandbox directory of this backend",
                              backend_state);
    }
    if (rc < 0) {
        env_clear(&sb->env);
        dsec_free(sb->snapshot_name);
        sb_free_fields(sb);
        dsec_free(sb);
        return -1;
    }
    /* the runtime that started it, whichever is configured now; a record from before meta
     * named it was started by the configured one (the node had no other then) */
    const char *rt_name = sb->rt_name[0] != '\0' ? sb->rt_name : be->rt->name;
    dsec_err rerr;
    if ((sb->rt = dsec__ct_rt_get(be, rt_name, &rerr)) == NULL) {
        /* not a reason to remove it: it runs on, and a node manager that has the runtime
         * adopts it (the node keeps its record on DSEC_E_CONFIG) */
        const char *why = rerr.msg;
        if (strncmp(why, "container: ", 11) == 0)
            why += 11;
        dsec_err_set(err, DSEC_E_CONFIG, 0, /* rerr.msg says the errno already */
                     "container: sandbox %s was started by %s, which this node cannot run: %s; it "
                     "is not adopted but left as it is (its container running, its files kept) "
                     "until a node manager that has %s adopts it",
                     sb->id, rt_name, why, rt_name);
        /* its network too: held, the node's network sweep leaves it in place */
        dsec_net_sbx *net = NULL;
        dsec_err nerr;
        if (sb->net_state != NULL && be->net != NULL &&
            dsec_net_adopt(be->net, sb->id, sb->tenant, sb->net_state,
                           (const char *const *)sb->net_entries, sb->nnet, &net, &nerr) < 0) {
            fprintf(stderr, "dsec container: kept sandbox %s: its network: %s\n", sb->id, nerr.msg);
            net = NULL;
        }
        kept_add(be, sb, net);
        /* the fork snapshots it reads stay too (held for the instance's life) */
        for (size_t i = 0; i < sb->env.nlowers; i++)
            if (sb->env.lowers[i].snap)
                dsec__ct_snap_ref(be, sb->env.lowers[i].name);
        env_clear(&sb->env);
        dsec_free(sb->snapshot_name);
        sb_free_fields(sb);
        dsec_free(sb);
        return -1;
    }
    /* everything exists until shown otherwise: teardown then removes it */
    sb->made_dir = sb->made_subvol = sb->mounted = sb->started = true;
    char state[32] = "gone";
    dsec_err_clear(err);
    int st = dsec__ct_rt_status(be, sb->rt, sb->rid, state, sizeof state, err);
    if (st < 0 || (strcmp(state, "running") != 0 && strcmp(state, "paused") != 0)) {
        if (st == 0 || err->code == DSEC_E_NOT_FOUND) {
            dsec_err_set(err, DSEC_E_NOT_FOUND, 0,
                         "container: the sandbox's container is no longer running (%s); what "
                         "was left of it is removed",
                         state);
            sb_abandon(be, sb);
        } else {
            env_clear(&sb->env);
            dsec_free(sb->snapshot_name);
            sb_free_fields(sb);
            dsec_free(sb);
        }
        return -1;
    }
    if (hold_lowers(be, sb, err) < 0) {
        /* leave it running: a later adopt may find the layer again */
        release_lowers(be, sb);
        env_clear(&sb->env);
        dsec_free(sb->snapshot_name);
        sb_free_fields(sb);
        dsec_free(sb);
        return -1;
    }
    /* its network: the namespace and veth outlived the node manager; the
     * node's table was rebuilt, so its rules go back in */
    if (sb->net_state != NULL) {
        int nrc = be->net == NULL
                      ? dsec_err_set(err, DSEC_E_CONFIG, 0,
                                     "container: the sandbox had network containment and the "
                                     "node now has none")
                      : dsec_net_adopt(be->net, sb->id, sb->tenant, sb->net_state,
                                       (const char *const *)sb->net_entries, sb->nnet, &sb->net,
                                       err);
        if (nrc < 0) {
            /* leave it running, contained by nothing it can use: its veth
             * is in no allow set; a later adopt may succeed */
            if (be->net == NULL) {
                /* the node's configuration lost its containment: kept (the node keeps its
                 * record on DSEC_E_CONFIG), the sweep leaves it, and its layers stay held
                 * while this instance lives */
                kept_add(be, sb, NULL);
                for (size_t i = 0; i < sb->held; i++) {
                    dsec_free(sb->env.lowers[i].path);
                    sb->env.lowers[i].path = NULL;
                }
                sb->held = 0;
            }
            release_lowers(be, sb);
            env_clear(&sb->env);
            dsec_free(sb->snapshot_name);
            sb_free_fields(sb);
            dsec_free(sb);
            return dsec_err_wrap(err, "container: adopting its network");
        }
    }
    char sp[PATH_MAX + 16];
    sock_path(sb, sp, sizeof sp);
    if (dsec_agent_connect(&sb->agent, sp, 5000, err) < 0)
        sb->agent = NULL; /* exec reports it; destroy still works */
    dsec_err_clear(err);
    live_add(be, sb);
    *out = sb;
    return 0;
}

static void ct_detach(void *self, dsec_sandbox *sb)
{
    live_del(self, sb);
    /* Layer-cache users and snapshot references stay counted: the container
     * still reads them, and this instance must not evict or delete them. */
    dsec_agent_free(sb->agent);
    for (size_t i = 0; i < sb->env.nlowers; i++) {
        dsec_free(sb->env.lowers[i].path);
        sb->env.lowers[i].path = NULL;
    }
    dsec_net_release(sb->net);
    env_clear(&sb->env);
    dsec_free(sb->snapshot_name);
    sb_free_fields(sb);
    dsec_free(sb);
}

static int ct_net_set(void *self, dsec_sandbox *sb, const char *const *entries, size_t n,
                      dsec_err *err)
{
    (void)self;
    if (sb->net == NULL)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "container: this sandbox has no managed network (its node has no "
                            "network containment configured)");
    if (dsec_net_set(sb->net, entries, n, err) < 0)
        return -1;
    /* remembered for forks and for adoption after a restart */
    net_entries_clear(sb);
    if (net_entries_add(sb, entries, n, err) < 0 || write_meta(sb, err) < 0)
        return dsec_err_wrap(err, "container: the policy is applied but not recorded");
    return 0;
}

const dsec_backend_ops dsec_container_ops = {
    .type = "container",
    .init = ct_init,
    .fini = ct_fini,
    .create = ct_create,
    .exec = ct_exec,
    .exec_start = ct_exec_start,
    .default_cmd = ct_default_cmd,
    .file_write = ct_file_write,
    .file_read = ct_file_read,
    .file_write_start = ct_file_write_start,
    .file_read_start = ct_file_read_start,
    .file_list = ct_file_list,
    .file_op = ct_file_op,
    .fork = ct_fork,
    .pause = ct_pause,
    .resume = ct_resume,
    .snapshot = ct_snapshot,
    .restore = ct_restore,
    .destroy = ct_destroy,
    .stats = ct_stats,
    .adopt = ct_adopt,
    .detach = ct_detach,
    .net_set = ct_net_set,
    .proc_start = ct_proc_start,
    .proc_list = ct_proc_list,
    .proc_signal = ct_proc_signal,
    .proc_stdin = ct_proc_stdin,
    .proc_output = ct_proc_output,
    .proc_resize = ct_proc_resize,
    .proc_follow_start = ct_proc_follow_start,
};
