/* container-adopt.c - what a restarted node manager finds of the containers: adopting a sandbox
 * from its meta, keeping one it cannot run, detaching, and sweeping the orphans. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/container/container-int.h"
#include "dsec/alloc.h"
#include "dsec/log.h"

/* ---- the meta record ----------------------------------------------------------------------- */

/* A meta record being read into sb. */
struct meta_read {
    const struct ct_backend *be;
    dsec_sandbox *sb;
};

/* The lines only a container's meta has. */
static int meta_own_line(dsec_sandbox *sb, const char *key, char *val, dsec_err *err)
{
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
    }
    return 0;
}

static int meta_line(void *arg, const char *key, char *val, dsec_err *err)
{
    struct meta_read *m = arg;
    dsec_sandbox *sb = m->sb;
    int t = dsec__ct_env_line(m->be, &sb->env, key, val, err);
    if (t != 0)
        return t < 0 ? -1 : 0;
    struct dsec_sbx_netrec nr = {&sb->tenant, &sb->net_state, &sb->net_entries, &sb->nnet};
    if ((t = dsec_sbx_net_line(&m->be->sbx, &nr, key, val, err)) != 0)
        return t < 0 ? -1 : 0;
    if (strcmp(key, "snapshot_name") == 0)
        return strcmp(val, "-") != 0 ? dsec_sbx_set_str(&m->be->sbx, &sb->snapshot_name, val, err)
                                     : 0;
    return meta_own_line(sb, key, val, err);
}

/* The record in dir/meta (dir: the backend state adopt was given), checked against spec. */
static int meta_load(const struct ct_backend *be, const dsec_sandbox_spec *spec, const char *dir,
                     dsec_sandbox **out, dsec_err *err)
{
    *out = NULL;
    char mp[PATH_MAX + 16];
    dsec__ct_fmt(mp, sizeof mp, "%s/meta", dir);
    char *text = dsec_sbx_read_file(mp, 1u << 20);
    if (text == NULL)
        return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "container: reading %s", mp);
    dsec_sandbox *sb = dsec_calloc(1, sizeof *sb);
    if (sb == NULL) {
        dsec_free(text);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container: sandbox record");
    }
    struct meta_read m = {be, sb};
    int rc = strncmp(text, "dsec-container 1\n", 17) == 0
                 ? dsec_sbx_rec_parse(text, meta_line, &m, err)
                 : dsec_err_set(err, DSEC_E_DECODE, 0, "container: %s is not a sandbox record", mp);
    dsec_free(text);
    if (rc == 0 && sb->id[0] == '\0')
        rc = dsec_err_set(err, DSEC_E_DECODE, 0, "container: %s names no sandbox", mp);
    if (rc == 0 && sb->rid[0] == '\0')
        memcpy(sb->rid, sb->id, sizeof sb->rid);
    if (rc == 0 && spec != NULL && spec->id != NULL && strcmp(spec->id, sb->id) != 0)
        rc = dsec_err_set(err, DSEC_E_INVALID, 0, "container: the record is of sandbox %s", sb->id);
    if (rc == 0) {
        dsec__ct_sb_paths(be, sb);
        if (strcmp(sb->dir, dir) != 0)
            rc = dsec_err_set(err, DSEC_E_INVALID, 0,
                              "container: %s is not a sandbox directory of this backend", dir);
    }
    if (rc < 0) {
        dsec__ct_sb_free(sb);
        return -1;
    }
    *out = sb;
    return 0;
}

/* ---- kept sandboxes ------------------------------------------------------------------------- */

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
    dsec_sbx_live_add(&be->sbx, &k->link, k->id, k->rid);
}

/* sb's runtime (rt_name) cannot run here: keep it as it is and say so in err; frees sb. */
static int keep_unrunnable(struct ct_backend *be, dsec_sandbox *sb, const char *rt_name,
                           const dsec_err *rerr, dsec_err *err)
{
    /* not a reason to remove it: it runs on, and a node manager that has the runtime
     * adopts it (the node keeps its record on DSEC_E_CONFIG) */
    const char *why = rerr->msg;
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
        dsec_log_warn("dsec container: kept sandbox %s: its network: %s", sb->id, nerr.msg);
        net = NULL;
    }
    kept_add(be, sb, net);
    /* the fork snapshots it reads stay too (held for the instance's life) */
    for (size_t i = 0; i < sb->env.nlowers; i++)
        if (sb->env.lowers[i].snap)
            dsec__ct_snap_ref(be, sb->env.lowers[i].name);
    dsec__ct_sb_free(sb);
    return -1;
}

/* ---- adopt and detach ------------------------------------------------------------------------ */

/* Its network: the namespace and veth outlived the node manager; the node's table was rebuilt,
 * so its rules go back in. On failure sb is freed (left running). */
static int adopt_net(struct ct_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    if (sb->net_state == NULL)
        return 0;
    int nrc = be->net == NULL
                  ? dsec_err_set(err, DSEC_E_CONFIG, 0,
                                 "container: the sandbox had network containment and the "
                                 "node now has none")
                  : dsec_net_adopt(be->net, sb->id, sb->tenant, sb->net_state,
                                   (const char *const *)sb->net_entries, sb->nnet, &sb->net, err);
    if (nrc == 0)
        return 0;
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
    dsec__ct_release_lowers(be, sb);
    dsec__ct_sb_free(sb);
    return dsec_err_wrap(err, "container: adopting its network");
}

int dsec__ct_adopt(void *self, const dsec_sandbox_spec *spec, const char *backend_state,
                   dsec_sandbox **out, dsec_err *err)
{
    struct ct_backend *be = self;
    *out = NULL;
    if (backend_state == NULL || backend_state[0] != '/')
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "container: adopt needs the sandbox directory as backend state");
    dsec_sandbox *sb;
    if (meta_load(be, spec, backend_state, &sb, err) < 0)
        return -1;
    /* the runtime that started it, whichever is configured now; a record from before meta
     * named it was started by the configured one (the node had no other then) */
    const char *rt_name = sb->rt_name[0] != '\0' ? sb->rt_name : be->rt->name;
    dsec_err rerr;
    if ((sb->rt = dsec__ct_rt_get(be, rt_name, &rerr)) == NULL)
        return keep_unrunnable(be, sb, rt_name, &rerr, err);
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
            dsec_sbx_abandon(&be->sbx, sb);
        } else {
            dsec__ct_sb_free(sb);
        }
        return -1;
    }
    if (dsec__ct_hold_lowers(be, sb, err) < 0) {
        /* leave it running: a later adopt may find the layer again */
        dsec__ct_release_lowers(be, sb);
        dsec__ct_sb_free(sb);
        return -1;
    }
    if (adopt_net(be, sb, err) < 0)
        return -1;
    char sp[PATH_MAX + 16];
    dsec__ct_sock_path(sb, sp, sizeof sp);
    if (dsec_agent_connect(&sb->agent, sp, 5000, err) < 0)
        sb->agent = NULL; /* exec reports it; destroy still works */
    dsec_err_clear(err);
    dsec_sbx_live_add(&be->sbx, &sb->live, sb->id, sb->rid);
    *out = sb;
    return 0;
}

void dsec__ct_detach(void *self, dsec_sandbox *sb)
{
    struct ct_backend *be = self;
    dsec_sbx_live_del(&be->sbx, &sb->live);
    /* Layer-cache users and snapshot references stay counted: the container
     * still reads them, and this instance must not evict or delete them. */
    dsec_agent_free(sb->agent);
    for (size_t i = 0; i < sb->env.nlowers; i++) {
        dsec_free(sb->env.lowers[i].path);
        sb->env.lowers[i].path = NULL;
    }
    dsec_net_release(sb->net);
    dsec__ct_sb_free(sb);
}

/* ---- the sweep ----------------------------------------------------------------------------- */

/* What the sweep needs of an orphan: the runtime id its meta names, if it has one (a warm
 * container it took), and the runtime that started it: its meta's, or before meta named one,
 * the runtime whose state dir it has, else the configured one. -1 (said on stderr) when that
 * runtime cannot be run here: the orphan is then left alone. */
static int meta_peek(struct ct_backend *be, dsec_sandbox *sb)
{
    char mp[PATH_MAX + 16];
    dsec__ct_fmt(mp, sizeof mp, "%s/meta", sb->dir);
    char *text = dsec_sbx_read_file(mp, 1u << 20);
    char rid[sizeof sb->rid];
    dsec_sbx_rec_value(text, "rid", rid, sizeof rid);
    if (dsec__ct_is_warm_rid(rid))
        memcpy(sb->rid, rid, sizeof rid);
    dsec_sbx_rec_value(text, "runtime", sb->rt_name, sizeof sb->rt_name);
    dsec_free(text);
    const char *name = sb->rt_name;
    if (name[0] == '\0')
        name = dsec__ct_rt_guess(be, sb->rid);
    if (name == NULL)
        name = be->rt->name;
    dsec_err err;
    if ((sb->rt = dsec__ct_rt_get(be, name, &err)) == NULL) {
        dsec_log_warn("dsec container: leaving orphan sandbox %s as it is: %s", sb->id, err.msg);
        return -1;
    }
    return 0;
}

/* An entry of a directory of sandboxes (bundles, upper subvolumes, runtime state dirs): an
 * orphan when no record of this instance holds it. Its container is killed and everything of
 * it removed, whether its meta is readable or not (a create cut short left none). */
static int sweep_one(void *arg, int dfd, const char *name)
{
    (void)dfd;
    struct ct_backend *be = arg;
    if (dsec_name_ok(name, DSEC_SBX_ID_LEN_MAX) < 0 || dsec_sbx_live_has(&be->sbx, name))
        return 0;
    dsec_sandbox *sb = dsec_calloc(1, sizeof *sb);
    if (sb == NULL)
        return -1;
    dsec__ct_fmt(sb->id, sizeof sb->id, "%s", name);
    memcpy(sb->rid, sb->id, sizeof sb->rid);
    dsec__ct_sb_paths(be, sb);
    if (meta_peek(be, sb) < 0) {
        dsec_free(sb);
        return 0;
    }
    /* everything may exist: each step of teardown copes with its absence */
    sb->made_dir = sb->made_subvol = sb->mounted = sb->started = true;
    dsec_err err;
    if (dsec__ct_sb_teardown(be, sb, &err) < 0) {
        dsec_log_warn("dsec container: reclaiming orphan sandbox %s: %s", name, err.msg);
        dsec_free(sb);
        return 0;
    }
    return 1;
}

/* Half-written snapshot blobs (pack-*.blob in the state dir). */
static int sweep_blob(void *arg, int dfd, const char *name)
{
    (void)arg;
    size_t len = strlen(name);
    if (strncmp(name, "pack-", 5) == 0 && len > 5 && strcmp(name + len - 5, ".blob") == 0)
        unlinkat(dfd, name, 0);
    return 0;
}

static bool held(struct ct_backend *be, const char *name)
{
    return dsec_sbx_live_has(&be->sbx, name);
}

/*
 * The sweep: what a node manager that crashed (or lost its journal) left and
 * never re-adopted. Any sandbox id with a bundle dir, an upper subvolume or a
 * runtime state dir that no record of this instance holds is an orphan
 * (sweep_one); an orphan that took a warm container names its runtime id in
 * its meta. Then the warm containers of earlier instances no held sandbox
 * took, every fork snapshot no held sandbox references (children re-adopted
 * have re-referenced theirs), and half-written snapshot blobs go.
 */
void dsec__ct_sweep(void *self)
{
    struct ct_backend *be = self;
    uint64_t t0 = dsec_now_ns();
    char p[PATH_MAX + 16];
    int n = dsec_sbx_dir_each(be->sbroot, sweep_one, be);
    dsec__ct_fmt(p, sizeof p, "%s/sb", be->store);
    n += dsec_sbx_dir_each(p, sweep_one, be);
    n += dsec_sbx_dir_each(be->run_root, sweep_one, be);
    dsec_sbx_dir_each(be->state_dir, sweep_blob, NULL);
    n += dsec__ct_pool_sweep(be, held);
    int snaps = dsec__ct_snap_sweep(be);
    if (n > 0 || snaps > 0)
        dsec_log_info("dsec container: reclaimed %d orphan sandboxes and %d fork snapshots left by "
                      "an earlier node manager (%.1f ms)",
                      n, snaps, (double)(dsec_now_ns() - t0) / 1e6);
}
