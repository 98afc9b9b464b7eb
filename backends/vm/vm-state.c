/* vm-state.c - a VM's state: saving it (snapshot, fork, pause) with QEMU's migration into a
 * file beside its RAM and disk, and starting clones from such a save (restore, fork, resume). */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/loop.h"
#include "backends/vm/vm-int.h"
#include "backends/vm/vm-publish.h"
#include "dsec/alloc.h"

static int oom(const struct vm_backend *be, dsec_err *err, const char *what)
{
    return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: %s", be->type, what);
}

/* The file sb's guest RAM is mapped from. */
static void mem_path(const dsec_sandbox *sb, char *out, size_t len)
{
    dsec__vm_fmt(out, len, "%s/%s", sb->dir, sb->mem_private ? "base.mem" : "mem");
}

/* Save sb into dir (existing): state, mem, disk.img, meta. A running guest
 * is stopped for it and goes on after (unless keep_stopped). */
static int save_to(struct vm_backend *be, dsec_sandbox *sb, const char *dir, bool keep_stopped,
                   dsec_err *err)
{
    char st[PATH_MAX + 16], p[PATH_MAX + 16], src[PATH_MAX + 16];
    dsec__vm_fmt(st, sizeof st, "%s/state", dir);
    struct vm_qmp q = {.fd = -1};
    bool stopped = false;
    int rc = 0;
    if (sb->paused) {
        dsec__vm_fmt(src, sizeof src, "%s/paused/state", sb->dir);
        rc = dsec__vm_copy_sparse(src, st, err);
    } else {
        rc = dsec__vm_qmp_open(&q, sb->dir, QMP_TIMEOUT_MS, err);
        if (rc == 0 && (rc = dsec__vm_qmp_cmd(&q, "stop", NULL, NULL, QMP_TIMEOUT_MS, err)) == 0)
            stopped = true;
        if (rc == 0)
            rc = dsec__vm_migrate_out(&q, st, err);
    }
    /* RAM and disk while nothing runs; a clone's RAM file never changes (link it) */
    mem_path(sb, src, sizeof src);
    dsec__vm_fmt(p, sizeof p, "%s/mem", dir);
    if (rc == 0 && !(sb->mem_private && link(src, p) == 0))
        rc = dsec__vm_copy_sparse(src, p, err);
    dsec__vm_fmt(src, sizeof src, "%s/disk.img", sb->dir);
    dsec__vm_fmt(p, sizeof p, "%s/disk.img", dir);
    if (rc == 0)
        rc = dsec__vm_copy_sparse(src, p, err);
    if (stopped && !keep_stopped) {
        dsec_err e2;
        if (dsec__vm_qmp_cmd(&q, "cont", NULL, NULL, QMP_TIMEOUT_MS, rc < 0 ? &e2 : err) < 0 &&
            rc == 0)
            rc = dsec_err_wrap(err, "resuming the VM after its snapshot");
    }
    dsec__vm_qmp_close(&q);
    if (rc == 0) {
        dsec__vm_fmt(p, sizeof p, "%s/meta", dir);
        FILE *f = fopen(p, "we");
        if (f == NULL) {
            rc = dsec_err_set(err, DSEC_E_IO, errno, "creating %s", p);
        } else {
            fprintf(f, "dsec-vm-snapshot 1\n");
            dsec__vm_put_machine(f, be, sb);
            if (fclose(f) != 0)
                rc = dsec_err_set(err, DSEC_E_IO, errno, "writing %s", p);
        }
    }
    /* the snapshot's RAM file is mapped by clones: nobody may write it */
    dsec__vm_fmt(p, sizeof p, "%s/mem", dir);
    if (rc == 0)
        chmod(p, 0400);
    return rc < 0 ? dsec_err_wrap(err, "%s: saving the VM", be->type) : 0;
}

/* What gives a clone its own identity (hostname, machine id, clock, random seed, addresses):
 * identity.sh with them, the request in req (borrowing the rest). */
struct identity {
    char host[64], mid[33], epoch[24];
    const char *argv[16];
    /* 512 random bytes as one line of hex: identity.sh reads it with a shell builtin (a
     * program to copy raw bytes would cost a process under emulation) */
    char seed[2 * 512 + 1];
    dsec_exec_req req;
};

static int identity_req(struct vm_backend *be, const dsec_sandbox *sb, struct identity *id,
                        dsec_err *err)
{
    dsec__vm_hostname(sb->id, id->host, sizeof id->host);
    dsec__vm_random_hex(id->mid, 16);
    dsec__vm_fmt(id->epoch, sizeof id->epoch, "%lld", (long long)time(NULL));
    const char **argv = id->argv;
    size_t argc = 0;
    argv[argc++] = "/.dsec/busybox";
    argv[argc++] = "sh";
    argv[argc++] = "/.dsec/identity.sh";
    argv[argc++] = id->host;
    argv[argc++] = id->mid;
    argv[argc++] = id->epoch;
    if (sb->nic) {
        argv[argc++] = sb->guest.mac;
        argv[argc++] = sb->guest.addr4;
        argv[argc++] = sb->guest.gw4;
        argv[argc++] = sb->guest.gw_mac;
        argv[argc++] = sb->guest.dns4;
        if (sb->guest.addr6[0] != '\0') {
            argv[argc++] = sb->guest.addr6;
            argv[argc++] = sb->guest.gw6;
        }
    }
    uint8_t raw[512];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        return dsec_err_set(err, DSEC_E_IO, errno, "%s: random seed for a clone", be->type);
    for (size_t i = 0; i < sizeof raw; i++)
        sprintf(id->seed + 2 * i, "%02x", raw[i]);
    id->seed[sizeof id->seed - 1] = '\n';
    id->req = (dsec_exec_req){.argv = argv,
                              .argc = argc,
                              .stdin_data = (const uint8_t *)id->seed,
                              .stdin_len = sizeof id->seed,
                              .cwd = "/",
                              .user = "root",
                              .timeout_ms = 60000};
    return 0;
}

/* How identity.sh ended (rc, res): 0, or -1 with err. */
static int identity_check(const struct vm_backend *be, int rc, const dsec_exec_result *res,
                          dsec_err *err)
{
    if (rc < 0)
        return dsec_err_wrap(err, "%s: giving the clone its identity", be->type);
    if (res->exit_code != 0)
        return dsec_err_set(err, DSEC_E_BACKEND, 0,
                            "%s: giving the clone its identity: identity.sh exited %d: %.*s",
                            be->type, res->exit_code,
                            (int)(res->stderr_len > 300 ? 300 : res->stderr_len),
                            res->stderr_data ? (const char *)res->stderr_data : "");
    return 0;
}

static int set_identity(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    struct identity id;
    if (identity_req(be, sb, &id, err) < 0)
        return -1;
    dsec_exec_result res = {0};
    int rc = identity_check(be, dsec__vm_exec(be, sb, &id.req, &res, err), &res, err);
    dsec_exec_result_release(&res);
    return rc;
}

/* A new sandbox id from the snapshot in dir, up to its guest running again (its agent not
 * connected yet); tenant and net give its network. -1: nothing is left. */
static int clone_launch(struct vm_backend *be, const char *dir, const char *id, const char *tenant,
                        const char *const *net, size_t nnet, dsec_sandbox **out, dsec_err *err)
{
    *out = NULL;
    dsec_sandbox *sb = dsec__vm_sb_new(be, id, err);
    if (sb == NULL)
        return -1;
    char p[PATH_MAX + 16], type[16] = "";
    dsec__vm_fmt(p, sizeof p, "%s/meta", dir);
    int rc = dsec__vm_read_rec(be, p, "dsec-vm-snapshot 1", sb, type, sizeof type, err);
    if (rc == 0 && strcmp(type, be->type) != 0)
        rc = dsec_err_set(err, DSEC_E_INVALID, 0,
                          "%s: the snapshot in %s is of a \"%s\" sandbox, not \"%s\"", be->type,
                          dir, type, be->type);
    bool nic = sb->nic;
    if (rc == 0 && nic && be->net == NULL)
        rc = dsec_err_set(err, DSEC_E_CONFIG, 0,
                          "%s: the snapshot's VM has a network device but this node has no "
                          "network containment to connect it to",
                          be->type);
    if (rc == 0 && (sb->mem_mb < MEM_MB_MIN || sb->smp == 0 || sb->env.base.workdir == NULL))
        rc = dsec_err_set(err, DSEC_E_DECODE, 0, "%s: the snapshot meta in %s is incomplete",
                          be->type, dir);
    if (rc == 0 && dsec__vm_copy_net(sb, tenant, net, nnet) < 0)
        rc = oom(be, err, "network policy");
    if (rc < 0 || dsec__vm_sb_mkdir(be, sb, err) < 0) {
        dsec__vm_sb_free(sb); /* not listed yet */
        return -1;
    }
    sb->mem_private = true;
    rc = dsec__vm_hold_layers(be, sb, err);
    char src[PATH_MAX + 16], dst[PATH_MAX + 16];
    dsec__vm_fmt(src, sizeof src, "%s/mem", dir);
    dsec__vm_fmt(dst, sizeof dst, "%s/base.mem", sb->dir);
    /* a link keeps the RAM file alive (and its pages shared) for as long as
     * this clone needs it, whatever happens to the snapshot */
    if (rc == 0 && link(src, dst) < 0)
        rc = dsec__vm_copy_sparse(src, dst, err);
    dsec__vm_fmt(src, sizeof src, "%s/disk.img", dir);
    dsec__vm_fmt(dst, sizeof dst, "%s/disk.img", sb->dir);
    if (rc == 0)
        rc = dsec__vm_copy_sparse(src, dst, err);
    if (rc == 0)
        rc = dsec__vm_net_attach(be, sb, err);
    /* the machine keeps the snapshot's devices: a NIC only when it had one */
    sb->nic = nic;
    dsec__vm_fmt(src, sizeof src, "%s/state", dir);
    if (rc == 0)
        rc = dsec__vm_boot_launch(be, sb, src, err);
    if (rc < 0) {
        dsec_sbx_abandon(&be->sbx, sb);
        return -1;
    }
    *out = sb;
    return 0;
}

/* clone_launch, then the wait for its agent and its identity, on this thread. */
static int clone_from(struct vm_backend *be, const char *dir, const char *id, const char *tenant,
                      const char *const *net, size_t nnet, dsec_sandbox **out, dsec_err *err)
{
    dsec_sandbox *sb;
    if (clone_launch(be, dir, id, tenant, net, nnet, &sb, err) < 0)
        return -1;
    uint64_t t = dsec_now_ns();
    int rc = dsec__vm_agent_dial(be, sb, be->boot_timeout_ms, err);
    dsec__vm_trace_step(sb, "agent answered", &t);
    if (rc == 0)
        rc = set_identity(be, sb, err);
    dsec__vm_trace_step(sb, "identity", &t);
    if (rc < 0) {
        dsec_sbx_abandon(&be->sbx, sb);
        return -1;
    }
    *out = sb;
    return 0;
}

static int check_dir_path(const struct vm_backend *be, const char *path, dsec_err *err)
{
    if (path == NULL || path[0] != '/')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: the snapshot path must be absolute",
                            be->type);
    if (strlen(path) > PATH_MAX - 64)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: the snapshot path is too long", be->type);
    return 0;
}

int dsec__vm_snapshot(void *self, dsec_sandbox *sb, const char *path, const char *name,
                      dsec_err *err)
{
    struct vm_backend *be = self;
    if (check_dir_path(be, path, err) < 0)
        return -1;
    dsec_sbx_sweep_once(&be->sbx);
    if (mkdir(path, 0700) < 0)
        return dsec_err_set(err, errno == EEXIST ? DSEC_E_EXISTS : DSEC_E_IO, errno,
                            "%s: creating the snapshot directory %s", be->type, path);
    /* what a published environment holds must be on the disk, not in the guest's cache */
    if (name != NULL && !sb->paused) {
        const char *argv[] = {"/.dsec/busybox", "sync"};
        dsec_exec_req req = {.argv = argv, .argc = 2, .timeout_ms = 60000};
        dsec_exec_result res = {0};
        if (dsec__vm_exec(be, sb, &req, &res, err) < 0) {
            dsec__vm_rmtree(path);
            return dsec_err_wrap(err, "%s: syncing the guest's files", be->type);
        }
        dsec_exec_result_release(&res);
    }
    int rc = save_to(be, sb, path, false, err);
    if (rc == 0 && name != NULL) {
        dsec_env base = {.name = sb->env.base.name,
                         .nlayers = sb->env.nlayers,
                         .vars = sb->env.base.vars,
                         .nvars = sb->env.base.nvars,
                         .workdir = sb->env.base.workdir,
                         .user = sb->env.base.user,
                         .cmd = sb->env.base.cmd,
                         .ncmd = sb->env.base.ncmd,
                         .nentry =
                             sb->env.base.nentry <= sb->env.base.ncmd ? sb->env.base.nentry : 0};
        base.layers = dsec_calloc(sb->env.nlayers + 1, sizeof *base.layers);
        if (base.layers == NULL)
            rc = oom(be, err, "environment");
        for (size_t i = 0; rc == 0 && i < sb->env.nlayers; i++)
            base.layers[i] = sb->env.layers[i].digest;
        char scratch[PATH_MAX + 16], disk[PATH_MAX + 16];
        dsec__vm_fmt(scratch, sizeof scratch, "%s/publish", path);
        dsec__vm_fmt(disk, sizeof disk, "%s/disk.img", path);
        if (rc == 0)
            rc = dsec__vm_publish(be->reg, disk, scratch, &base, name, err);
        dsec__vm_rmtree(scratch);
        dsec_free(base.layers);
    }
    if (rc < 0)
        dsec__vm_rmtree(path);
    return rc;
}

int dsec__vm_restore(void *self, const dsec_sandbox_spec *spec, const char *path,
                     dsec_sandbox **out, char **backend_state, dsec_err *err)
{
    struct vm_backend *be = self;
    *out = NULL;
    *backend_state = NULL;
    if (check_dir_path(be, path, err) < 0)
        return -1;
    dsec_sbx_sweep_once(&be->sbx);
    dsec_sandbox *sb = NULL;
    if (clone_from(be, path, spec->id, spec->tenant, spec->net, spec->nnet, &sb, err) < 0)
        return -1;
    if ((*backend_state = dsec_strdup(sb->dir)) == NULL) {
        dsec_sbx_abandon(&be->sbx, sb);
        return oom(be, err, "backend state");
    }
    *out = sb;
    return 0;
}

/* The children of one fork, restored by up to ncpu threads side by side: much of a restore
 * is waiting (QEMU's start, the state's load, the agent's hello). With settle false each child
 * is left once its guest runs again (fork_start waits for the rest on the loop). */
struct fork_job {
    struct vm_backend *be;
    dsec_sandbox *parent;
    const char *dir;
    const char *const *ids;
    dsec_sandbox **children;
    bool settle;
};

static int fork_child(void *arg, size_t i, dsec_err *err)
{
    struct fork_job *f = arg;
    return (f->settle ? clone_from : clone_launch)(f->be, f->dir, f->ids[i], f->parent->tenant,
                                                   (const char *const *)f->parent->net_entries,
                                                   f->parent->nnet, &f->children[i], err);
}

/* Save sb and make n children of it (settled or launched: fork_job). -1: nothing is left. */
static int fork_make(struct vm_backend *be, dsec_sandbox *sb, const char *const *ids, size_t n,
                     dsec_sandbox **children, char **states, bool settle, dsec_err *err)
{
    if (dsec_sbx_fork_ids(&be->sbx, ids, n, children, states, err) < 0)
        return -1;
    dsec_sbx_sweep_once(&be->sbx);
    char dir[PATH_MAX + 160];
    dsec__vm_fmt(dir, sizeof dir, "%s/%s-%" PRIu64, be->forks, sb->id,
                 atomic_fetch_add(&be->seq, 1));
    if (mkdir(dir, 0700) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "%s: creating %s", be->type, dir);
    int rc = save_to(be, sb, dir, false, err);
    if (rc == 0) {
        struct fork_job f = {be, sb, dir, ids, children, settle};
        rc = dsec_sbx_fork_run(n, n < be->ncpu ? n : be->ncpu, fork_child, &f, err);
    }
    for (size_t i = 0; rc == 0 && i < n; i++)
        if ((states[i] = dsec_strdup(children[i]->dir)) == NULL)
            rc = oom(be, err, "backend state");
    if (rc < 0)
        dsec_sbx_fork_undo(&be->sbx, children, states, n);
    /* each child links the RAM file it maps: the snapshot itself can go */
    dsec__vm_rmtree(dir);
    return rc;
}

int dsec__vm_fork(void *self, dsec_sandbox *sb, const char *const *ids, size_t n,
                  dsec_sandbox **children, char **states, dsec_err *err)
{
    return fork_make(self, sb, ids, n, children, states, true, err);
}

/* One child of a fork_start settling on the loop: its agent, then its identity. */
struct child_wait {
    struct dsec_sbx_fork_wait *f;
    struct vm_backend *be;
    struct dsec_loop *loop;
    dsec_sandbox *sb;
    uint64_t t;
};

static void child_end(struct child_wait *c, int rc, dsec_err *err)
{
    struct dsec_sbx_fork_wait *f = c->f;
    if (rc < 0)
        dsec_err_wrap(err, "%s: fork child %s", c->be->type, c->sb->id);
    dsec_free(c);
    dsec_sbx_fork_wait_end(f, rc, err);
}

static void child_identity(void *ud, int rc, dsec_exec_result *res, dsec_err *err)
{
    struct child_wait *c = ud;
    rc = identity_check(c->be, rc, res, err);
    if (res != NULL)
        dsec_exec_result_release(res);
    dsec__vm_trace_step(c->sb, "identity", &c->t);
    child_end(c, rc, err);
}

/* The child's agent answered, or could not: its identity next. */
static void child_ready(void *ud, int rc, dsec_err *err)
{
    struct child_wait *c = ud;
    struct identity id;
    if (rc == 0 && (rc = identity_req(c->be, c->sb, &id, err)) == 0)
        rc = dsec__vm_exec_start(c->be, c->sb, &id.req, c->loop, child_identity, c, err);
    if (rc < 0)
        child_end(c, -1, err);
}

/* fork whose children's waits (each guest's agent, then its identity, about 0.3-0.4 s under
 * TCG) are watches on loop: the thread goes back once every child's guest runs again. */
int dsec__vm_fork_start(void *self, dsec_sandbox *sb, const char *const *ids, size_t n,
                        struct dsec_loop *loop, dsec_ready_fn done, void *ud,
                        dsec_sandbox **children, char **states, dsec_err *err)
{
    struct vm_backend *be = self;
    struct dsec_sbx_fork_wait *f = dsec_sbx_fork_wait_new(done, ud);
    if (f == NULL)
        return oom(be, err, "a fork in flight");
    if (fork_make(be, sb, ids, n, children, states, false, err) < 0) {
        dsec_sbx_fork_wait_free(f);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        struct child_wait *c = dsec_malloc(sizeof *c);
        dsec_err e;
        dsec_sbx_fork_wait_hold(f);
        if (c == NULL) {
            oom(be, &e, "a fork child in flight");
            dsec_sbx_fork_wait_end(f, -1, &e);
            continue;
        }
        *c = (struct child_wait){
            .f = f, .be = be, .loop = loop, .sb = children[i], .t = dsec_now_ns()};
        if (dsec__vm_ready_start(be, children[i], loop, child_ready, c, &e) < 0)
            child_end(c, -1, &e);
    }
    /* the children are the caller's: done may run from here on, on the loop's thread */
    dsec_sbx_fork_wait_started(f, loop);
    return 0;
}

int dsec__vm_pause(void *self, dsec_sandbox *sb, dsec_err *err)
{
    struct vm_backend *be = self;
    if (sb->paused)
        return 0;
    char dir[PATH_MAX + 16], st[PATH_MAX + 32];
    dsec__vm_fmt(dir, sizeof dir, "%s/paused", sb->dir);
    dsec__vm_fmt(st, sizeof st, "%s/state", dir);
    dsec__vm_rmtree(dir);
    if (mkdir(dir, 0700) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "%s: creating %s", be->type, dir);
    struct vm_qmp q;
    int rc = dsec__vm_qmp_open(&q, sb->dir, QMP_TIMEOUT_MS, err);
    if (rc < 0) {
        dsec__vm_rmtree(dir);
        return dsec_err_wrap(err, "%s: pause", be->type);
    }
    rc = dsec__vm_qmp_cmd(&q, "stop", NULL, NULL, QMP_TIMEOUT_MS, err);
    if (rc == 0)
        rc = dsec__vm_migrate_out(&q, st, err);
    if (rc < 0) {
        dsec_err e2;
        dsec__vm_qmp_cmd(&q, "cont", NULL, NULL, QMP_TIMEOUT_MS, &e2);
        dsec__vm_qmp_close(&q);
        dsec__vm_rmtree(dir);
        return dsec_err_wrap(err, "%s: pause", be->type);
    }
    dsec__vm_qmp_close(&q);
    /* the state is saved (its RAM in the file, or in the state for a clone): QEMU and
     * the memory it held can go */
    dsec__vm_side_drop(sb);
    dsec_agent_free(sb->agent);
    sb->agent = NULL;
    if (dsec__vm_qemu_stop(sb, STOP_GRACE_MS, err) < 0)
        return dsec_err_wrap(err, "%s: pause", be->type);
    sb->paused = true;
    return dsec__vm_write_meta(be, sb, err);
}

int dsec__vm_resume(void *self, dsec_sandbox *sb, dsec_err *err)
{
    struct vm_backend *be = self;
    if (!sb->paused)
        return 0;
    char dir[PATH_MAX + 16], st[PATH_MAX + 32];
    dsec__vm_fmt(dir, sizeof dir, "%s/paused", sb->dir);
    dsec__vm_fmt(st, sizeof st, "%s/state", dir);
    sb->paused = false;
    if (dsec__vm_boot(be, sb, st, err) < 0) {
        dsec_err e2;
        dsec_agent_free(sb->agent);
        sb->agent = NULL;
        dsec__vm_qemu_stop(sb, 0, &e2);
        sb->paused = true;
        dsec__vm_write_meta(be, sb, &e2);
        return dsec_err_wrap(err, "%s: resume", be->type);
    }
    dsec__vm_rmtree(dir);
    return dsec__vm_write_meta(be, sb, err);
}
