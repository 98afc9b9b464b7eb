/* container-int.h - what the files of the container backend share: the instance, the sandbox
 * record, and the helpers of each concern (OCI config, runtime, rootfs and upper store). */
#ifndef DSEC_BACKENDS_CONTAINER_INT_H
#define DSEC_BACKENDS_CONTAINER_INT_H

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "backends/agent/agent-client.h"
#include "backends/backend.h"
#include "backends/container/container.h"
#include "backends/layers/layer-cache.h"
#include "backends/net/net.h"
#include "backends/sbxstore.h"
#include "dsec/clock.h"
#include "dsec/layers.h"
#include "dsec/names.h"

/*
 * Layout under the instance's state dir (S):
 *   S/upper.img          sparse btrfs image (only when S is not on btrfs)
 *   S/upper/             the upper store: a btrfs filesystem
 *       sb/<id>          one subvolume per sandbox: upper/ and work/ of its overlay
 *       snap/<name>      read-only snapshots taken by fork (refcounted by the children
 *                        this instance holds; the sweep deletes those no child holds)
 *   S/layers/            the node's layer cache (layer-cache.h)
 *   S/run/               the runtime's state root (--root: crun's or runc's <rid>/ dirs)
 *   S/sb/<id>/           the bundle: config.json, rootfs/ (the overlay), agent.sock,
 *                        agent.log, runtime.log, meta (what adopt needs)
 *   S/pool/<rid>/        a warm container's bundle (rootfs/ an empty root, ready once its
 *                        agent answered); renamed to S/sb/<id> when a sandbox takes it
 */

enum { CT_CG_V1 = 1, CT_CG_V2 };

/* The OCI runtimes a sandbox may have been started by (its meta's runtime line). */
enum { CT_RT_CRUN, CT_RT_RUNC, CT_RT_RUNSC, CT_RT_N };

/* One runtime the instance talks to: the configured one, opened at init, and any other one
 * an adopted sandbox (or an earlier instance's warm container) was started by, opened on its
 * first need (dsec__ct_rt_get). Read-only once open. */
struct ct_rt {
    char name[16];       /* crun | runc | runsc */
    char path[PATH_MAX]; /* its binary */
    int fd;              /* a sealed in-memory copy of the binary, executed instead, or -1 */
    bool hybrid;         /* called in a private mount namespace without the cgroup2 mount */
};

/* A fork snapshot, shared read-only by the children that use it as a lower layer. */
struct ct_snap {
    char name[DSEC_SBX_ID_LEN_MAX + 32];
    unsigned refs;
    struct ct_snap *next;
};

/* A sandbox adopt could not take because of the node's configuration (the runtime that
 * started it is not installed, or the node has no network containment now and it had): it
 * stays as it is (running, its files kept), and the sweep leaves it alone. */
struct ct_kept {
    struct dsec_sbx_link link; /* in the store's live set, for the sweep */
    char id[DSEC_SBX_ID_LEN_MAX + 1];
    char rid[DSEC_SBX_ID_LEN_MAX + 1];
    dsec_net_sbx *net; /* its network, held so the node's network sweep leaves it too */
    struct ct_kept *next;
};

/* A warm container: started ahead on an empty root, its agent connected (container-pool.c). */
struct ct_warm {
    char rid[DSEC_SBX_ID_LEN_MAX + 1]; /* its runtime id: <warm_prefix><n> */
    char dir[PATH_MAX];                /* S/pool/<rid>: its bundle */
    pid_t init;                        /* its agent, on the host */
    dsec_agent *agent;
    dsec_net_sbx *net; /* with network containment: its namespace, reaching nothing yet */
    struct ct_warm *next;
};

/* One open instance. Everything but the snapshot table is set at init and
 * read-only afterwards, so sandboxes on different threads share it freely. */
struct ct_backend {
    char state_dir[PATH_MAX];
    char node[DSEC_NAME_LEN_MAX + 1];
    const struct ct_rt *rt; /* the configured runtime (option runtime): every new container's */
    /* each runtime: its binary as configured (option runtime_path for the configured one,
     * crun_path, runc_path, runsc_path for any), "" to look it up */
    char rt_paths[CT_RT_N][PATH_MAX];
    pthread_mutex_t rt_mu; /* guards opening rts */
    struct ct_rt rts[CT_RT_N];
    _Atomic bool rt_open[CT_RT_N]; /* rts[i] is open (set once, after it is filled) */
    bool rt_memfd;                 /* option runtime_memfd: make each fd (crun and runc) */
    char run_root[PATH_MAX];
    char store[PATH_MAX];  /* the upper store (btrfs when btrfs is true) */
    char sbroot[PATH_MAX]; /* S/sb */
    char agent[PATH_MAX];  /* the dsec-agent binary */
    bool btrfs;            /* subvolumes and O(1) snapshots; else plain dirs and copies */
    bool store_mounted;    /* S/upper is a loop mount this backend made or found */
    bool hybrid;           /* v1 controllers plus a cgroup2 mount (crun must not see it) */
    int cg_mode;           /* CT_CG_V1 | CT_CG_V2 */
    bool memsw;            /* the memory controller accounts swap (v1) */
    char cg_parent[DSEC_NAME_LEN_MAX + 16]; /* cgroupsPath is /<cg_parent>/<id> */
    bool cg_weighed; /* this instance set up cg_parent, so its fini removes it */
    /* v1: the mount of each controller; v2: all equal the cgroup2 mount */
    char cg_freezer[PATH_MAX], cg_memory[PATH_MAX], cg_cpuacct[PATH_MAX], cg_pids[PATH_MAX],
        cg_cpu[PATH_MAX];
    uint64_t pids_max;
    uint64_t start_timeout_ms; /* how long the agent may take to answer */
    bool favordynmods;         /* option cgroup_favordynmods (backends/cgroup-tune.h) */
    bool trace;                /* DSEC_CONTAINER_TRACE=1: step times on stderr */
    char **excludes;           /* snapshot exclude patterns */
    size_t nexcludes;
    dsec_layer_registry *reg; /* borrowed */
    dsec_net *net;            /* borrowed: the node's network containment, or NULL */
    dsec_layer_cache *cache;
    pthread_mutex_t lock; /* guards snaps, kept and quota */
    struct ct_snap *snaps;
    /* every sandbox record this instance holds (created or adopted) and every one it keeps,
     * the sweep, before the first create, fork, restore, snapshot or destroy */
    struct dsec_sbx_store sbx;
    struct ct_kept *kept; /* sandboxes left as they were: their runtime is not installed */
    bool quota;           /* btrfs quotas are on in the store (enabled on first need) */
    /* the warm pool (container-pool.c): warm_target ready containers; guarded by warm_mu */
    unsigned warm_target; /* option warm_pool */
    char warm_prefix[16]; /* runtime ids of this instance's warm containers */
    char pool_dir[PATH_MAX];
    pthread_mutex_t warm_mu;
    pthread_cond_t warm_cond;
    struct ct_warm *warm;
    unsigned nwarm;
    unsigned nstarting;          /* warm containers being started by the refill threads */
    unsigned warm_refill;        /* option warm_refill: refill threads, each one start at a time */
    unsigned long long warm_seq; /* under lock */
    bool warm_init, warm_stop;
    unsigned nwarm_th; /* refill threads running */
    pthread_t warm_th[16];
};

/* One lower layer of a sandbox: a registry layer (held in the layer cache)
 * or a fork snapshot (held by refcount). */
struct ct_lower {
    bool snap;
    char name[DSEC_SBX_ID_LEN_MAX + 32]; /* digest, or snapshot name */
    int format;                          /* dsec_layer_format, 0 when unknown */
    char *path;                          /* the directory overlay reads; NULL until held */
};

/* What a sandbox runs with: its layers (lowest first) and process defaults. */
struct ct_env {
    struct dsec_sbx_env base; /* name, variables, workdir, user, default command */
    struct ct_lower *lowers;
    size_t nlowers;
};

struct dsec_sandbox {
    char id[DSEC_SBX_ID_LEN_MAX + 1];
    char rid[DSEC_SBX_ID_LEN_MAX + 1]; /* the runtime's and the cgroups' name: id, or the warm
                                          container's it was started as */
    const struct ct_rt *rt; /* the runtime that started its container (meta's runtime line) */
    char dir[PATH_MAX];     /* S/sb/<id> */
    char subvol[PATH_MAX];  /* S/upper/sb/<id> */
    struct ct_env env;
    uint64_t cpu_milli, memory_mb;
    uint64_t disk_mb;    /* limit of the upper subvolume's exclusive bytes, 0 = none */
    char *snapshot_name; /* label snapshot_name, or NULL */
    char *tenant;        /* or NULL */
    char **net_entries;  /* the network policy as given (kept for forks and adopt) */
    size_t nnet;
    char *net_state;   /* dsec_net_sbx_state, read back from meta on adopt */
    dsec_net_sbx *net; /* its namespace and policy when the node has containment */
    dsec_agent *agent;
    /* the side lane's kept connection (process calls beside a running command, on a work
     * thread or on the loop), made by the first such call, or NULL */
    struct ct_keep *keep;
    /* what teardown must undo (a failed create undoes only what it did) */
    bool made_dir, made_subvol, mounted, started;
    size_t held;      /* lowers[0..held) are acquired */
    char rt_name[16]; /* meta's runtime line, while the record is read ("" before it had one) */
    /* the last stats sample, for the current CPU rate */
    uint64_t last_cpu_us, last_ns;
    struct dsec_sbx_link live; /* in be->sbx's live set while listed */
};

/* ---- helpers (container.c) ----------------------------------------------------------- */

/* snprintf, as a function of ours: paths are bounded once (the state dir's
 * length at init), not at every call the compiler cannot follow. */
int dsec__ct_fmt(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Write a whole file (created 0644, replaced). */
int dsec__ct_write_file(const char *path, const char *data, size_t len, dsec_err *err);

/* A name unique on this node across restarts: prefix, tag, time and a counter. */
void dsec__ct_unique_name(const char *prefix, const char *tag, char *out, size_t len);

/* ---- records and the life of a sandbox (container.c) ----------------------------------- */

/* Append a lower layer (a registry digest, or with snap a fork snapshot's name) to e. */
int dsec__ct_add_lower(struct ct_env *e, bool snap, const char *name, int format, dsec_err *err);
void dsec__ct_env_clear(struct ct_env *e);
/* Copy src into dst (paths are not copied: dst holds nothing yet). */
int dsec__ct_env_copy(const struct ct_backend *be, struct ct_env *dst, const struct ct_env *src,
                      dsec_err *err);
/* Write e's lines (env, workdir, user, var, cmd, entry, lower) to f. */
void dsec__ct_env_put(FILE *f, const struct ct_env *e);
/* Read one line into e when it is one of those: 1 when taken, 0 when not, -1 with err. */
int dsec__ct_env_line(const struct ct_backend *be, struct ct_env *e, const char *key, char *val,
                      dsec_err *err);
/* Append to sb's network policy as given (kept for forks and adopt). */
int dsec__ct_net_add(dsec_sandbox *sb, const char *const *v, size_t n, dsec_err *err);
/* Replace S/sb/<id>/meta, what adopt needs. */
int dsec__ct_meta_write(const struct ct_backend *be, const dsec_sandbox *sb, dsec_err *err);
/* A new record (id checked; rid = id), and its paths; sb_free frees a record and all it holds
 * in memory (its environment, names, policy, side lane), nothing on disk. */
dsec_sandbox *dsec__ct_sb_new(const char *id, dsec_err *err);
void dsec__ct_sb_paths(const struct ct_backend *be, dsec_sandbox *sb);
void dsec__ct_sb_free(dsec_sandbox *sb);
/* Hold sb's lower layers (lowers[held..]), or release those held. */
int dsec__ct_hold_lowers(struct ct_backend *be, dsec_sandbox *sb, dsec_err *err);
void dsec__ct_release_lowers(struct ct_backend *be, dsec_sandbox *sb);
/* Bring sb (id, env, limits set) up; on failure the caller abandons it. With later: 1 when a
 * cold start's wait for its agent is left to the caller (dsec__ct_ready_start), 0 when sb is up
 * already (a warm container). */
int dsec__ct_sb_start(struct ct_backend *be, dsec_sandbox *sb, bool later, dsec_err *err);
/* The wait for a cold-started sb's agent as watches on loop: done runs once, on loop's thread,
 * when it answers (sb->agent set) or cannot (it died at start: what it said); -1 with err: done
 * is never called. */
int dsec__ct_ready_start(struct ct_backend *be, dsec_sandbox *sb, struct dsec_loop *loop,
                         dsec_ready_fn done, void *ud, dsec_err *err);
/* Undo whatever of sb's start-up was done; frees sb on success. */
int dsec__ct_sb_teardown(struct ct_backend *be, dsec_sandbox *sb, dsec_err *err);
/* Create from env (moved into the sandbox). With loop: 1 when its cold start's wait for its
 * agent is loop's (done runs once, on loop's thread; *out and *backend_state are set and the
 * caller's), 0 when it is up already (done never runs). */
int dsec__ct_create_env(struct ct_backend *be, const dsec_sandbox_spec *spec, struct ct_env *env,
                        struct dsec_loop *loop, dsec_ready_fn done, void *ud, dsec_sandbox **out,
                        char **backend_state, dsec_err *err);
/* S/sb/<id>/agent.sock. */
void dsec__ct_sock_path(const dsec_sandbox *sb, char *out, size_t len);

/* ---- adopt and the sweep (container-adopt.c) ------------------------------------------ */

int dsec__ct_adopt(void *self, const dsec_sandbox_spec *spec, const char *backend_state,
                   dsec_sandbox **out, dsec_err *err);
void dsec__ct_detach(void *self, dsec_sandbox *sb);
/* Reclaim what earlier instances left (the store runs it once: dsec_sbx_sweep_once). */
void dsec__ct_sweep(void *self);

/* ---- the agent's calls (container-agent.c): the ops of the same names ----------------- */

size_t dsec__ct_default_cmd(void *self, dsec_sandbox *sb, const char *const **argv);
int dsec__ct_exec(void *self, dsec_sandbox *sb, const dsec_exec_req *req, dsec_exec_result *res,
                  dsec_err *err);
int dsec__ct_exec_start(void *self, dsec_sandbox *sb, const dsec_exec_req *req,
                        struct dsec_loop *loop, dsec_exec_done_fn done, void *ud, dsec_err *err);
int dsec__ct_file_write_start(void *self, dsec_sandbox *sb, const char *path, const void *data,
                              size_t len, uint32_t mode, bool append, struct dsec_loop *loop,
                              dsec_file_done_fn done, void *ud, dsec_err *err);
int dsec__ct_file_read_start(void *self, dsec_sandbox *sb, const char *path, uint64_t offset,
                             uint64_t max, struct dsec_loop *loop, dsec_file_done_fn done, void *ud,
                             dsec_err *err);
int dsec__ct_file_write(void *self, dsec_sandbox *sb, const char *path, const void *data,
                        size_t len, uint32_t mode, bool append, dsec_err *err);
int dsec__ct_file_read(void *self, dsec_sandbox *sb, const char *path, uint64_t offset,
                       uint64_t max, dsec_file_data *out, dsec_err *err);
int dsec__ct_file_list(void *self, dsec_sandbox *sb, const char *path, dsec_file_entry **entries,
                       size_t *n, dsec_err *err);
int dsec__ct_file_op(void *self, dsec_sandbox *sb, const dsec_file_op *op, dsec_file_entry *st,
                     dsec_err *err);
int dsec__ct_proc_start(void *self, dsec_sandbox *sb, const dsec_proc_start_req *req,
                        dsec_proc_info *out, dsec_err *err);
int dsec__ct_proc_list(void *self, dsec_sandbox *sb, dsec_proc_info **out, size_t *n,
                       dsec_err *err);
int dsec__ct_proc_signal(void *self, dsec_sandbox *sb, uint64_t handle, int sig, dsec_err *err);
int dsec__ct_proc_stdin(void *self, dsec_sandbox *sb, uint64_t handle, const void *data, size_t len,
                        bool close, dsec_err *err);
int dsec__ct_proc_output(void *self, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                         uint64_t err_off, uint64_t max, dsec_proc_output *out, dsec_err *err);
int dsec__ct_proc_resize(void *self, dsec_sandbox *sb, uint64_t handle, uint16_t rows,
                         uint16_t cols, dsec_err *err);
/* Let go of sb's kept loop connection (its record is being freed). */
void dsec__ct_keep_close(dsec_sandbox *sb);
int dsec__ct_proc_stdin_start(void *self, dsec_sandbox *sb, uint64_t handle, const void *data,
                              size_t len, bool close, struct dsec_loop *loop,
                              dsec_proc_done_fn done, void *ud, dsec_err *err);
int dsec__ct_proc_follow_start(void *self, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                               uint64_t err_off, uint64_t max, uint32_t wait_ms,
                               struct dsec_loop *loop, dsec_proc_output_done_fn done, void *ud,
                               dsec_err *err);

/* ---- state (container-state.c): the ops of the same names ------------------------------ */

int dsec__ct_pause(void *self, dsec_sandbox *sb, dsec_err *err);
int dsec__ct_resume(void *self, dsec_sandbox *sb, dsec_err *err);
int dsec__ct_fork(void *self, dsec_sandbox *sb, const char *const *ids, size_t n,
                  dsec_sandbox **children, char **states, dsec_err *err);
int dsec__ct_fork_start(void *self, dsec_sandbox *sb, const char *const *ids, size_t n,
                        struct dsec_loop *loop, dsec_ready_fn done, void *ud,
                        dsec_sandbox **children, char **states, dsec_err *err);
int dsec__ct_snapshot(void *self, dsec_sandbox *sb, const char *path, const char *name,
                      dsec_err *err);
int dsec__ct_restore(void *self, const dsec_sandbox_spec *spec, const char *path,
                     dsec_sandbox **out, char **backend_state, dsec_err *err);

/* dir/resolv.conf naming the node-local resolver of net (bound at /etc/resolv.conf). */
int dsec__ct_resolv_write(const char *dir, const dsec_net_sbx *net, dsec_err *err);
/* A listening unix socket at dir/name (cloexec). */
int dsec__ct_listen_at(const char *dir, const char *name, dsec_err *err);

/* ---- OCI config (container-oci.c) ---------------------------------------------------- */

/* Write <sb->dir>/config.json for sb: the agent as process, its rootfs, limits,
 * namespaces, capabilities, seccomp, masked paths. */
int dsec__ct_oci_write(const struct ct_backend *be, const dsec_sandbox *sb, dsec_err *err);

/* ---- runtime (container-runtime.c) --------------------------------------------------- */

/* Open the configured runtime (name crun, runc or runsc: be->rt) and find the cgroup layout. */
int dsec__ct_rt_init(struct ct_backend *be, const char *name, dsec_err *err);
/* Which runtime a name is (CT_RT_*), or -1. */
int dsec__ct_rt_index(const char *name);
/* The runtime called name, opened on its first use (its binary found and sealed as the
 * configured one's was). NULL with err (DSEC_E_CONFIG naming the runtime and what to install)
 * when its binary is not there. Thread-safe; the handle lives as long as the instance. */
const struct ct_rt *dsec__ct_rt_get(struct ct_backend *be, const char *name, dsec_err *err);
/* The runtime whose state dir S/run/<rid> is (crun's has a status file, runc's a state.json),
 * or NULL when neither. For warm containers of an earlier instance, which have no meta. */
const char *dsec__ct_rt_guess(const struct ct_backend *be, const char *rid);
/* Close every runtime handle. */
void dsec__ct_rt_release(struct ct_backend *be);
/* Run a helper program (argv[0] is a path) and wait. out (may be NULL) receives up to
 * outlen-1 bytes of its stdout+stderr. Returns its exit status (0..255, 128+sig), or -1
 * with err set when it could not be started. */
int dsec__ct_run(const char *const *argv, char *out, size_t outlen, dsec_err *err);
/* Start sb's container detached with sb->rt, handing it listen_fd as fd 3. root_fd >= 0: a detached
 * mount (dsec__ct_overlay_make) that the runtime's process attaches at S/sb/<id>/rootfs in
 * its own private mount namespace just before the runtime starts, so the host's mount
 * table never holds it. */
int dsec__ct_rt_start(const struct ct_backend *be, const dsec_sandbox *sb, int listen_fd,
                      int root_fd, dsec_err *err);
/* Runtime rt's status of container id ("running", "paused", "stopped", ...), or -1 with
 * DSEC_E_NOT_FOUND when it has none. */
int dsec__ct_rt_status(const struct ct_backend *be, const struct ct_rt *rt, const char *id,
                       char *status, size_t len, dsec_err *err);
/* Kill and delete container id with rt, the runtime that started it (absent is a success),
 * then remove its cgroups. */
int dsec__ct_rt_delete(const struct ct_backend *be, const struct ct_rt *rt, const char *id,
                       dsec_err *err);
/* Freeze (true) or thaw the container's cgroup and wait until it is so. */
int dsec__ct_freeze(const struct ct_backend *be, const char *id, bool frozen, dsec_err *err);
/* Whether the container's cgroup is frozen; whether any process lives in it. */
bool dsec__ct_frozen(const struct ct_backend *be, const char *id);
bool dsec__ct_alive(const struct ct_backend *be, const char *id);
/* CPU time (us) and memory (bytes) of the container's cgroup. */
int dsec__ct_cg_usage(const struct ct_backend *be, const char *id, uint64_t *cpu_us, uint64_t *mem,
                      dsec_err *err);
/* The directory of the container's cgroup for one v1 controller dir (a be->cg_* field). */
/* Thaw the container's cgroup and SIGKILL everything in it (the whole tree at once where the
 * kernel has cgroup.kill); how many processes it still listed (0: none is left). */
size_t dsec__ct_cg_kill(const struct ct_backend *be, const char *id);
void dsec__ct_cg_path(const struct ct_backend *be, const char *ctrl_mount, const char *id,
                      char *out, size_t len);
/* The host pid of the container's init (the first pid in its cgroup), or -1. */
pid_t dsec__ct_init_pid(const struct ct_backend *be, const char *id);
/* What the host knows of a container whose agent (its init) does not answer: from its cgroups
 * and /proc, never from the agent. */
struct ct_agent_probe {
    bool cgroup;             /* its pids cgroup exists */
    unsigned nprocs;         /* processes in it */
    pid_t init;              /* its init (pid 1 of its pid namespace) on the host, 0: none */
    char state;              /* init's state in /proc (R, S, D, T, t, Z), 0 when unknown */
    bool frozen;             /* its cgroup is frozen (paused) */
    uint64_t oom_kills;      /* OOM kills in its memory cgroup */
    uint64_t mem_limit;      /* bytes, 0: none */
    uint64_t pids, pids_max; /* pids.current and pids.max (0: none) */
    uint64_t cpu_throttled;  /* CFS periods it was throttled in (cpu.stat nr_throttled) */
};
void dsec__ct_agent_probe(const struct ct_backend *be, const char *id, struct ct_agent_probe *p);
/* Write memory (and no swap) and CPU limits to the running container's cgroups (0: none). */
int dsec__ct_cg_limits(const struct ct_backend *be, const char *id, uint64_t memory_mb,
                       uint64_t cpu_milli, dsec_err *err);
/* Make root_fd (a detached mount) the root of the running container whose init is init: from
 * a helper in its namespaces, set its hostname, attach root_fd, move /proc, /dev, /sys, the
 * agent's bind (and with resolv, the /etc/resolv.conf bind) into it, pivot_root and detach the
 * old root. Every process of the container (the agent) then has root_fd's tree as its root. */
int dsec__ct_rt_switch_root(const struct ct_backend *be, const char *id, pid_t init, int root_fd,
                            const char *hostname, bool resolv, dsec_err *err);
/* On cgroup v1, keep an empty cgroup frozen beside the sandboxes (see its definition). */
void dsec__ct_cg_pin_freezer(const struct ct_backend *be);
/* Remove the instance's cgroup parent directories (when empty), the frozen one first. */
void dsec__ct_cg_cleanup(const struct ct_backend *be);
/* The node's containers share one parent cgroup whose CPU weight is a quarter of the
 * default (v1 cpu.shares 256 of 1024, v2 cpu.weight 25 of 100): when the sandboxes keep
 * every CPU busy, the node manager (at the default weight, in a cgroup of its own) still
 * gets its turn at once, so its heartbeats and admissions stay on time. */
#define DSEC_CT_SANDBOX_CPU_SHARES 256u
#define DSEC_CT_SANDBOX_CPU_WEIGHT 25u
int dsec__ct_cg_weigh(const struct ct_backend *be, dsec_err *err);

/* ---- rootfs and upper store (container-rootfs.c) ------------------------------------ */

/* Put the upper store in place (btrfs: the state dir's own, or a loop image). */
int dsec__ct_store_open(struct ct_backend *be, uint64_t image_gb, dsec_err *err);
/* Unmount the store's loop image when it holds no sandbox and no snapshot. */
void dsec__ct_store_close(struct ct_backend *be);
/* A sandbox's writable subvolume (with upper/ and work/ inside); delete removes it. */
int dsec__ct_subvol_create(const struct ct_backend *be, const char *path, dsec_err *err);
int dsec__ct_subvol_delete(const struct ct_backend *be, const char *path, dsec_err *err);
/* Cap the exclusive bytes of subvolume path (a btrfs qgroup limit, so writes past it fail
 * with EDQUOT). Switches quotas on in the store the first time (on its own image only). */
int dsec__ct_subvol_limit(struct ct_backend *be, const char *path, uint64_t bytes, dsec_err *err);
/* A read-only snapshot of src at dst (btrfs: O(1); otherwise a copy). */
int dsec__ct_subvol_snapshot(const struct ct_backend *be, const char *src, const char *dst,
                             dsec_err *err);
/* An overlay (lowers top first, upper and work dirs) as a detached mount: *mfd, attached
 * nowhere yet. Returns 1 (err untouched) on a kernel without the new mount API (before
 * 5.2), so the caller mounts it with dsec__ct_overlay_mount instead. */
int dsec__ct_overlay_make(const char *const *lowers, size_t n, const char *upper, const char *work,
                          const char *target, int *mfd, dsec_err *err);
/* Mount an overlay at target: lowers top first, upper and work dirs. */
int dsec__ct_overlay_mount(const char *const *lowers, size_t n, const char *upper, const char *work,
                           const char *target, dsec_err *err);
int dsec__ct_overlay_umount(const char *target, dsec_err *err);
/* Bytes and regular files (plus links and specials) below dir. */
void dsec__ct_du(const char *dir, uint64_t *bytes, uint64_t *files);
/* rm -rf (no crossing of mount points). */
int dsec__ct_rmtree(const char *path);

/* The snapshot table: take or drop a reference (drop deletes at zero). */
void dsec__ct_snap_ref(struct ct_backend *be, const char *name);
void dsec__ct_snap_unref(struct ct_backend *be, const char *name);
/* Delete every snapshot in the store that no sandbox of this instance holds; returns how
 * many went. */
int dsec__ct_snap_sweep(struct ct_backend *be);
/* S/upper/snap/<name> (its upper/ is the lower layer). */
void dsec__ct_snap_path(const struct ct_backend *be, const char *name, char *out, size_t len);

/* ---- the warm pool (container-pool.c) --------------------------------------------------- */

/* Set up the pool (S/pool, this instance's runtime-id prefix) and start its thread when
 * warm_target > 0. */
int dsec__ct_pool_start(struct ct_backend *be, dsec_err *err);
/* Stop the thread and remove every ready warm container. */
void dsec__ct_pool_stop(struct ct_backend *be);
/* A ready warm container, or NULL (none ready, or no pool); the pool starts another. */
struct ct_warm *dsec__ct_pool_take(struct ct_backend *be);
/* Remove a taken warm container that will not be used. */
void dsec__ct_pool_give_up(struct ct_backend *be, struct ct_warm *w);
/* How many are ready now. */
unsigned dsec__ct_pool_ready(struct ct_backend *be);
/* Whether a runtime id names a warm container (w<hex>.<n>; sandbox ids have no '.'). */
bool dsec__ct_is_warm_rid(const char *name);
/* Remove warm containers other instances left (not of this instance's prefix, not held by a
 * sandbox: held(be, rid)). Returns how many went. */
int dsec__ct_pool_sweep(struct ct_backend *be, bool (*held)(struct ct_backend *, const char *));

#endif
