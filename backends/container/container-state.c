/* container-state.c - a container's state: pause and resume, fork (a frozen snapshot of its
 * upper the children start on), snapshot into registry layers, and restore from one. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backends/container/container-int.h"
#include "backends/loop.h"
#include "dsec/alloc.h"
#include "dsec/log.h"

static int oom(dsec_err *err, const char *what)
{
    return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container: %s", what);
}

int dsec__ct_pause(void *self, dsec_sandbox *sb, dsec_err *err)
{
    return dsec__ct_freeze(self, sb->rid, true, err);
}

int dsec__ct_resume(void *self, dsec_sandbox *sb, dsec_err *err)
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
    dsec__ct_unique_name(sb->id, tag, name, len);
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

/* One fork: the children start from the parent's environment on the snapshot snap. With
 * later, a cold child's wait for its agent is left to fork_start (cold[i] set). */
struct fork_job {
    struct ct_backend *be;
    const dsec_sandbox *parent;
    const char *snap;
    const char *const *ids;
    dsec_sandbox **children;
    bool later;
    bool *cold;
};

static int fork_child(void *arg, size_t i, dsec_err *err)
{
    struct fork_job *j = arg;
    struct ct_backend *be = j->be;
    dsec_sandbox *c = dsec__ct_sb_new(j->ids[i], err);
    int rc = c == NULL ? -1 : dsec__ct_env_copy(be, &c->env, &j->parent->env, err);
    if (rc == 0) {
        c->cpu_milli = j->parent->cpu_milli;
        c->memory_mb = j->parent->memory_mb;
        c->disk_mb = j->parent->disk_mb;
        rc = dsec__ct_add_lower(&c->env, true, j->snap, 0, err);
    }
    if (rc == 0) {
        rc = dsec_sbx_set_str(&be->sbx, &c->tenant, j->parent->tenant, err);
        if (rc == 0)
            rc = dsec__ct_net_add(c, (const char *const *)j->parent->net_entries, j->parent->nnet,
                                  err);
    }
    if (rc == 0)
        rc = dsec__ct_sb_start(be, c, j->later, err);
    if (rc < 0) {
        if (c != NULL) {
            if (err->code == DSEC_E_EXISTS)
                c->made_dir = c->started = false;
            dsec_sbx_abandon(&be->sbx, c);
        }
        return -1;
    }
    if (j->cold != NULL)
        j->cold[i] = rc == 1;
    j->children[i] = c;
    return 0;
}

/* Freeze sb for a snapshot and start n children on it (fork_job's later and cold). -1: no
 * child is left. */
static int fork_make(struct ct_backend *be, dsec_sandbox *sb, const char *const *ids, size_t n,
                     dsec_sandbox **children, char **states, bool *cold, dsec_err *err)
{
    if (dsec_sbx_fork_ids(&be->sbx, ids, n, children, states, err) < 0)
        return -1;
    dsec_sbx_sweep_once(&be->sbx);
    uint64_t t0 = dsec_now_ns();
    char snap[sizeof((struct ct_snap *)0)->name];
    if (freeze_snapshot(be, sb, "f", snap, sizeof snap, err) < 0)
        return dsec_err_wrap(err, "container: fork");
    uint64_t t1 = dsec_now_ns();
    /* hold the snapshot while children start, so a failed child does not
     * take it away from the others */
    dsec__ct_snap_ref(be, snap);
    struct fork_job j = {.be = be,
                         .parent = sb,
                         .snap = snap,
                         .ids = ids,
                         .children = children,
                         .later = cold != NULL,
                         .cold = cold};
    /* start-up is mostly waiting on the runtime: a few at a time */
    int rc = dsec_sbx_fork_run(n, n < 8 ? n : 8, fork_child, &j, err);
    for (size_t i = 0; rc == 0 && i < n; i++)
        if ((states[i] = dsec_strdup(children[i]->dir)) == NULL)
            rc = oom(err, "backend state");
    if (rc < 0)
        dsec_sbx_fork_undo(&be->sbx, children, states, n);
    dsec__ct_snap_unref(be, snap);
    if (be->trace)
        dsec_log_info("dsec container: fork of %zu: freeze+snapshot+thaw %.2f ms, children %.2f ms",
                      n, (double)(t1 - t0) / 1e6, (double)(dsec_now_ns() - t1) / 1e6);
    return rc;
}

int dsec__ct_fork(void *self, dsec_sandbox *sb, const char *const *ids, size_t n,
                  dsec_sandbox **children, char **states, dsec_err *err)
{
    return fork_make(self, sb, ids, n, children, states, NULL, err);
}

/* fork whose cold children (no warm container was ready for them) wait for their agents on
 * loop; the freeze, the snapshot and each child's start stay on this thread. */
int dsec__ct_fork_start(void *self, dsec_sandbox *sb, const char *const *ids, size_t n,
                        struct dsec_loop *loop, dsec_ready_fn done, void *ud,
                        dsec_sandbox **children, char **states, dsec_err *err)
{
    struct ct_backend *be = self;
    struct dsec_sbx_fork_wait *f = dsec_sbx_fork_wait_new(done, ud);
    bool *cold = dsec_calloc(n, sizeof *cold);
    if (f == NULL || cold == NULL) {
        dsec_sbx_fork_wait_free(f);
        dsec_free(cold);
        return oom(err, "a fork in flight");
    }
    if (fork_make(be, sb, ids, n, children, states, cold, err) < 0) {
        dsec_sbx_fork_wait_free(f);
        dsec_free(cold);
        return -1;
    }
    size_t ncold = 0;
    for (size_t i = 0; i < n; i++)
        ncold += cold[i];
    if (ncold == 0) { /* every child took a warm container: up already */
        dsec_sbx_fork_wait_free(f);
        dsec_free(cold);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        dsec_err e;
        if (!cold[i])
            continue;
        dsec_sbx_fork_wait_hold(f);
        if (dsec__ct_ready_start(be, children[i], loop, dsec_sbx_fork_wait_end, f, &e) < 0)
            dsec_sbx_fork_wait_end(f, -1, &e);
    }
    dsec_free(cold);
    /* the children are the caller's: done may run from here on, on the loop's thread */
    dsec_sbx_fork_wait_started(f, loop);
    return 0;
}

/* ---- snapshot and restore ------------------------------------------------------------------ */

/* Pack dir (an upper directory) as a layer in the registry. */
static int pack_dir(struct ct_backend *be, const char *dir, dsec_digest digest, dsec_err *err)
{
    char name[128], blob[PATH_MAX + 160];
    dsec__ct_unique_name("pack", "b", name, sizeof name);
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

int dsec__ct_snapshot(void *self, dsec_sandbox *sb, const char *path, const char *name,
                      dsec_err *err)
{
    struct ct_backend *be = self;
    const char *publish = name != NULL ? name : sb->snapshot_name;
    if (be->reg == NULL)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "container: snapshot needs a layer registry");
    dsec_sbx_sweep_once(&be->sbx);
    /* the new environment: registry layers as they are, each fork snapshot
     * below the sandbox packed as a layer of its own, then its upper */
    struct ct_env ne;
    if (dsec__ct_env_copy(be, &ne, &sb->env, err) < 0)
        return -1;
    char tmp[sizeof((struct ct_snap *)0)->name];
    if (freeze_snapshot(be, sb, "p", tmp, sizeof tmp, err) < 0) {
        dsec__ct_env_clear(&ne);
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
        rc = dsec__ct_add_lower(&ne, false, top, DSEC_LAYER_DIR, err);
    if (rc == 0)
        rc = fill_formats(be, &ne, err);
    if (rc == 0 && publish != NULL) {
        dsec_env d = {.name = (char *)publish,
                      .nlayers = ne.nlowers,
                      .vars = ne.base.vars,
                      .nvars = ne.base.nvars,
                      .workdir = ne.base.workdir,
                      .user = ne.base.user,
                      .cmd = ne.base.cmd,
                      .ncmd = ne.base.ncmd,
                      .nentry = ne.base.nentry <= ne.base.ncmd ? ne.base.nentry : 0};
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
        if (rc == 0 && dsec_sbx_set_str(&be->sbx, &ne.base.name, publish, err) < 0)
            rc = -1;
    }
    if (rc == 0) {
        /* a restore needs no registry lookup by name: the file says it all */
        FILE *f = fopen(path, "we");
        if (f == NULL) {
            rc = dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", path);
        } else {
            fprintf(f, "dsec-container-snapshot 1\nlayer %s\n", top);
            dsec__ct_env_put(f, &ne);
            if (fclose(f) != 0)
                rc = dsec_err_set(err, DSEC_E_IO, errno, "container: writing %s", path);
        }
    }
    dsec__ct_env_clear(&ne);
    return rc;
}

/* A snapshot file being read. */
struct snapfile {
    const struct ct_backend *be;
    struct ct_env *env;
};

static int snapfile_line(void *arg, const char *key, char *val, dsec_err *err)
{
    struct snapfile *sf = arg;
    int t = dsec__ct_env_line(sf->be, sf->env, key, val, err);
    return t < 0 ? -1 : 0;
}

int dsec__ct_restore(void *self, const dsec_sandbox_spec *spec, const char *path,
                     dsec_sandbox **out, char **backend_state, dsec_err *err)
{
    struct ct_backend *be = self;
    *out = NULL;
    *backend_state = NULL;
    if (be->reg == NULL)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "container: restore needs a layer registry");
    dsec_sbx_sweep_once(&be->sbx);
    char *text = dsec_sbx_read_file(path, 1u << 20);
    if (text == NULL)
        return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "container: reading snapshot %s", path);
    if (strncmp(text, "dsec-container-snapshot 1\n", 26) != 0) {
        dsec_free(text);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "container: %s is not a container snapshot",
                            path);
    }
    struct ct_env env = {0};
    struct snapfile sf = {be, &env};
    int rc = dsec_sbx_rec_parse(text, snapfile_line, &sf, err);
    dsec_free(text);
    for (size_t i = 0; rc == 0 && i < env.nlowers; i++)
        if (env.lowers[i].snap)
            rc = dsec_err_set(err, DSEC_E_DECODE, 0, "container: %s names a fork snapshot", path);
    if (rc == 0 && env.nlowers == 0)
        rc = dsec_err_set(err, DSEC_E_DECODE, 0, "container: %s names no layers", path);
    if (rc == 0 && (env.base.workdir == NULL || env.base.user == NULL))
        rc = dsec_err_set(err, DSEC_E_DECODE, 0, "container: %s lacks workdir or user", path);
    if (rc < 0) {
        dsec__ct_env_clear(&env);
        return -1;
    }
    return dsec__ct_create_env(be, spec, &env, NULL, NULL, NULL, out, backend_state, err);
}
