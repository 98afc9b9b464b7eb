/* vm-int.h - what the files of the QEMU backend share: the instance, the sandbox record, the
 * QEMU launcher and QMP client (vm-qemu.c), and the disk helpers (vm-disk.c). */
#ifndef DSEC_BACKENDS_VM_INT_H
#define DSEC_BACKENDS_VM_INT_H

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
#include "backends/layers/layer-cache.h"
#include "backends/net/net.h"
#include "backends/sbxstore.h"
#include "backends/vm/vm.h"
#include "dsec/clock.h"
#include "dsec/layers.h"
#include "dsec/names.h"

/*
 * Layout under the instance's state dir (S):
 *   S/layers/               the node's layer cache (layer-cache.h)
 *   S/images/<digest>.erofs one EROFS image per layer, made once from the cache's directory
 *   S/forks/<name>/         a fork's snapshot while its children start (removed after: each
 *                           child holds a hard link to the RAM file it maps)
 *   S/jail/                 empty here: each QEMU mounts its own root on it in a mount
 *                           namespace of its own, then pivots into it (vm-qemu.c)
 *   S/sb/<id>/              one sandbox: meta (what adopt needs), disk.img (its writable ext4),
 *                           mem (its RAM, share=on) or base.mem (a snapshot's RAM it maps
 *                           copy-on-write), console.log, qemu.log, qmp.sock, agent.sock,
 *                           ctl.sock, paused/state while paused
 * A snapshot directory (snapshot(path), S/forks/<name>) holds meta, state (QEMU's device state,
 * plus the RAM when the source mapped its RAM privately), mem and disk.img.
 */

#define MEM_MB_MIN 128
#define MEM_MB_MAX (UINT64_C(1) << 20)
#define QMP_TIMEOUT_MS 10000
#define STOP_GRACE_MS 3000

/* One layer of a sandbox's environment. */
struct vm_layer {
    dsec_digest digest;
    char *dir;         /* the layer cache's directory, while held (dsec_malloc'd) */
    dsec_digest image; /* the sha256 of its EROFS image here, once held */
    dsec_digest want;  /* a snapshot's: the image its guest was reading ("" when unknown) */
};

/* What a sandbox runs with. */
struct vm_env {
    struct dsec_sbx_env base; /* name, variables, workdir, user, default command */
    struct vm_layer *layers;
    size_t nlayers;
};

/* One open instance. Everything but the lists under lock is set at init. */
struct vm_backend {
    bool q35; /* "vm": -M q35 and virtio-pci; else microvm and virtio-mmio */
    const char *type;
    char state_dir[PATH_MAX];
    char sbroot[PATH_MAX]; /* S/sb */
    char images[PATH_MAX]; /* S/images */
    char forks[PATH_MAX];  /* S/forks */
    char jail[PATH_MAX];   /* S/jail */
    char qemu[PATH_MAX];   /* the QEMU binary, absolute */
    char kernel[PATH_MAX]; /* the kit's vmlinuz */
    char initrd[PATH_MAX]; /* the kit's initrd.img */
    uint64_t mem_mb;       /* when the spec asks 0 */
    uint64_t tb_mb;        /* TCG translation cache */
    uint64_t boot_timeout_ms;
    uint32_t uid_base; /* QEMU runs as uid and gid uid_base + its pid */
    bool kvm;          /* dsec_vm_kvm_works */
    uint64_t tsc_khz;  /* the host's TSC rate: under TCG the guest's TSC is the host's, and a
                        * guest that must calibrate it against the PIT hangs on a busy host */
    unsigned ncpu;
    dsec_layer_registry *reg; /* borrowed */
    dsec_net *net;            /* borrowed, or NULL */
    struct dsec_loop *loop;   /* the node's (borrowed), or NULL: no side connection */
    dsec_layer_cache *cache;
    pthread_mutex_t lock; /* guards building */
    pthread_cond_t built;
    char **building; /* digests whose image is being made */
    size_t nbuilding;
    /* the sandbox records this instance holds, and the sweep of what earlier ones left */
    struct dsec_sbx_store sbx;
    _Atomic uint64_t seq;
};

struct dsec_sandbox {
    char id[DSEC_SBX_ID_LEN_MAX + 1];
    char dir[PATH_MAX]; /* S/sb/<id> */
    struct vm_env env;
    uint64_t mem_mb, disk_mb, cpu_milli;
    unsigned smp;
    bool mem_private; /* RAM is dir/base.mem mapped share=off (a clone); else dir/mem share=on */
    pid_t pid;        /* QEMU, 0 when none runs (paused, or not started) */
    bool paused;      /* QEMU quit; its state is in dir/paused/state */
    bool nic;         /* the guest has a virtio-net device */
    char *tenant;
    char **net_entries;
    size_t nnet;
    char *net_state; /* read back from meta on adopt */
    dsec_net_sbx *net;
    dsec_net_guest guest; /* the guest side of net, when nic */
    dsec_agent *agent;
    struct vm_side *side; /* the process calls' connection on ctl.sock (vm-agent.c) */
    bool side_dialing;    /* a call dials it now; the others wait (vm-agent.c) */
    /* what teardown must undo */
    bool made_dir;
    size_t held; /* env.layers[0..held) are acquired */
    uint64_t last_cpu_us, last_ns;
    struct dsec_sbx_link live; /* in be->sbx's live set while listed */
};

/* ---- helpers (vm.c) ------------------------------------------------------------------- */

int dsec__vm_fmt(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* The last lines of a log file (at most len-1 bytes, newlines turned into " | "). */
void dsec__vm_log_tail(const char *path, char *out, size_t len);

/* ---- records and the life of a sandbox (vm.c) --------------------------------------------- */

void dsec__vm_env_clear(struct vm_env *e);
/* The machine fields both records (meta, a snapshot's meta) share: type, sizes, nic, env. */
void dsec__vm_put_machine(FILE *f, const struct vm_backend *be, const dsec_sandbox *sb);
/* Read a record file with the given first line into sb; type receives its type line. */
int dsec__vm_read_rec(const struct vm_backend *be, const char *path, const char *magic,
                      dsec_sandbox *sb, char *type, size_t typelen, dsec_err *err);
/* Replace sb->dir/meta, what adopt needs. */
int dsec__vm_write_meta(const struct vm_backend *be, const dsec_sandbox *sb, dsec_err *err);
/* A new record (id checked, dir set); sb_free frees it and what it holds in memory. */
dsec_sandbox *dsec__vm_sb_new(const struct vm_backend *be, const char *id, dsec_err *err);
void dsec__vm_sb_free(dsec_sandbox *sb);
/* Make sb's dir and list it (before anything else of it exists). */
int dsec__vm_sb_mkdir(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err);
/* Set sb's tenant and append to its network policy; -1 when out of memory. */
int dsec__vm_copy_net(dsec_sandbox *sb, const char *tenant, const char *const *net, size_t n);
/* Hold each layer in the cache and make sure its image exists. */
int dsec__vm_hold_layers(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err);
/* Attach sb's network when the node has containment. */
int dsec__vm_net_attach(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err);
/* Start QEMU for sb (a cold boot, or loading state when not NULL) and connect to its agent. */
int dsec__vm_boot(struct vm_backend *be, dsec_sandbox *sb, const char *state, dsec_err *err);
/* All of dsec__vm_boot but the wait for the agent. */
int dsec__vm_boot_launch(struct vm_backend *be, dsec_sandbox *sb, const char *state, dsec_err *err);
/* The wait for sb's agent (launched) as watches on loop: done runs once, on loop's thread, when
 * sb->agent is connected (rc 0) or cannot be (a guest that stopped is reported at once, with its
 * console); -1 (out of memory, or the loop stops): done is never called. */
int dsec__vm_ready_start(struct vm_backend *be, dsec_sandbox *sb, struct dsec_loop *loop,
                         dsec_ready_fn done, void *ud, dsec_err *err);
/* Connect to sb's agent within timeout_ms (a guest that died is reported with its console). */
int dsec__vm_agent_dial(struct vm_backend *be, dsec_sandbox *sb, uint64_t timeout_ms,
                        dsec_err *err);
/* The guest's hostname: the sandbox id as a DNS label (63 chars, no '_'). */
void dsec__vm_hostname(const char *id, char *out, size_t len);
/* nbytes random bytes (at most 64) as hex into out (2 * nbytes + 1). */
void dsec__vm_random_hex(char *out, size_t nbytes);
/* DSEC_VM_TRACE=1: how long the step since *t took, on stderr; *t becomes now. */
void dsec__vm_trace_step(const dsec_sandbox *sb, const char *step, uint64_t *t);

/* ---- the agent's calls (vm-agent.c): the ops of the same names ---------------------------- */

size_t dsec__vm_default_cmd(void *self, dsec_sandbox *sb, const char *const **argv);
int dsec__vm_exec(void *self, dsec_sandbox *sb, const dsec_exec_req *req, dsec_exec_result *res,
                  dsec_err *err);
int dsec__vm_exec_start(void *self, dsec_sandbox *sb, const dsec_exec_req *req,
                        struct dsec_loop *loop, dsec_exec_done_fn done, void *ud, dsec_err *err);
int dsec__vm_file_write_start(void *self, dsec_sandbox *sb, const char *path, const void *data,
                              size_t len, uint32_t mode, bool append, struct dsec_loop *loop,
                              dsec_file_done_fn done, void *ud, dsec_err *err);
int dsec__vm_file_read_start(void *self, dsec_sandbox *sb, const char *path, uint64_t offset,
                             uint64_t max, struct dsec_loop *loop, dsec_file_done_fn done, void *ud,
                             dsec_err *err);
int dsec__vm_file_write(void *self, dsec_sandbox *sb, const char *path, const void *data,
                        size_t len, uint32_t mode, bool append, dsec_err *err);
int dsec__vm_file_read(void *self, dsec_sandbox *sb, const char *path, uint64_t offset,
                       uint64_t max, dsec_file_data *out, dsec_err *err);
int dsec__vm_file_list(void *self, dsec_sandbox *sb, const char *path, dsec_file_entry **entries,
                       size_t *n, dsec_err *err);
int dsec__vm_file_op(void *self, dsec_sandbox *sb, const dsec_file_op *op, dsec_file_entry *st,
                     dsec_err *err);
int dsec__vm_proc_start(void *self, dsec_sandbox *sb, const dsec_proc_start_req *req,
                        dsec_proc_info *out, dsec_err *err);
int dsec__vm_proc_list(void *self, dsec_sandbox *sb, dsec_proc_info **out, size_t *n,
                       dsec_err *err);
int dsec__vm_proc_signal(void *self, dsec_sandbox *sb, uint64_t handle, int sig, dsec_err *err);
int dsec__vm_proc_stdin(void *self, dsec_sandbox *sb, uint64_t handle, const void *data, size_t len,
                        bool close, dsec_err *err);
int dsec__vm_proc_output(void *self, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                         uint64_t err_off, uint64_t max, dsec_proc_output *out, dsec_err *err);
int dsec__vm_proc_stdin_start(void *self, dsec_sandbox *sb, uint64_t handle, const void *data,
                              size_t len, bool close, struct dsec_loop *loop,
                              dsec_proc_done_fn done, void *ud, dsec_err *err);
int dsec__vm_proc_follow_start(void *self, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                               uint64_t err_off, uint64_t max, uint32_t wait_ms,
                               struct dsec_loop *loop, dsec_proc_output_done_fn done, void *ud,
                               dsec_err *err);
/* Let go of sb's side connection (its calls in flight keep it until they end). */
void dsec__vm_side_drop(dsec_sandbox *sb);
int dsec__vm_proc_resize(void *self, dsec_sandbox *sb, uint64_t handle, uint16_t rows,
                         uint16_t cols, dsec_err *err);

/* ---- state (vm-state.c): the ops of the same names ----------------------------------------- */

int dsec__vm_fork(void *self, dsec_sandbox *sb, const char *const *ids, size_t n,
                  dsec_sandbox **children, char **states, dsec_err *err);
int dsec__vm_fork_start(void *self, dsec_sandbox *sb, const char *const *ids, size_t n,
                        struct dsec_loop *loop, dsec_ready_fn done, void *ud,
                        dsec_sandbox **children, char **states, dsec_err *err);
int dsec__vm_pause(void *self, dsec_sandbox *sb, dsec_err *err);
int dsec__vm_resume(void *self, dsec_sandbox *sb, dsec_err *err);
int dsec__vm_snapshot(void *self, dsec_sandbox *sb, const char *path, const char *name,
                      dsec_err *err);
int dsec__vm_restore(void *self, const dsec_sandbox_spec *spec, const char *path,
                     dsec_sandbox **out, char **backend_state, dsec_err *err);

/* ---- QEMU (vm-qemu.c) ------------------------------------------------------------------ */

/* How to start QEMU for a sandbox. */
struct vm_launch {
    bool incoming; /* -incoming defer -S: the caller feeds a state with vm_migrate_in */
    int tap_fd;    /* -1: no NIC; else handed to QEMU as fd 3 */
};

/* Start sb's QEMU detached (its own session, survives this process) with sb's devices;
 * sb->pid is set. Returns once the process runs; it may still fail at its start
 * (dsec__vm_qemu_wait_ready reports that with qemu.log). */
int dsec__vm_qemu_start(const struct vm_backend *be, dsec_sandbox *sb, const struct vm_launch *l,
                        dsec_err *err);
/* Wait until the QMP socket answers (or QEMU exits: error with qemu.log's tail). */
int dsec__vm_qemu_wait_ready(const dsec_sandbox *sb, uint64_t timeout_ms, dsec_err *err);
/* Whether pid is a running (not zombie) process whose command line names dir. */
bool dsec__vm_qemu_is_ours(pid_t pid, const char *dir);
/* Whether any running process's command line names the file path as a QEMU -drive does
 * (commas doubled): a QEMU, detached or not, that reads it. */
bool dsec__vm_qemu_uses(const char *path);
/* Stop QEMU: QMP quit, SIGKILL after grace_ms, wait until the process is gone. */
int dsec__vm_qemu_stop(dsec_sandbox *sb, uint64_t grace_ms, dsec_err *err);

/* A QMP connection (one command at a time; events are skipped). */
struct vm_qmp {
    int fd;
    char dir[PATH_MAX]; /* the sandbox's: its qemu.log explains a failed migration */
    unsigned id;
    size_t len;
    char buf[16384];
};
/* Connect to dir/qmp.sock and negotiate capabilities. */
int dsec__vm_qmp_open(struct vm_qmp *q, const char *dir, uint64_t timeout_ms, dsec_err *err);
void dsec__vm_qmp_close(struct vm_qmp *q);
/* Run one command (args: a JSON object or NULL). reply (may be NULL) receives the "return"
 * line, dsec_malloc'd (caller frees). A QMP error becomes DSEC_E_BACKEND with its desc. */
int dsec__vm_qmp_cmd(struct vm_qmp *q, const char *cmd, const char *args, char **reply,
                     uint64_t timeout_ms, dsec_err *err);
/* The string value of "key" in a JSON text (first occurrence), or -1. */
int dsec__vm_json_str(const char *json, const char *key, char *out, size_t len);
/* Outgoing migration of a stopped VM into the file state (x-ignore-shared set). */
int dsec__vm_migrate_out(struct vm_qmp *q, const char *state, dsec_err *err);
/* Incoming migration from the file state into a QEMU started with incoming, then cont. */
int dsec__vm_migrate_in(struct vm_qmp *q, const char *state, dsec_err *err);

/* ---- disks (vm-disk.c) ----------------------------------------------------------------- */

/* S/images/<digest>.erofs for a layer whose directory is dir, made once (concurrent callers
 * wait for one build) with dsec_layer_build, so the same layer gives the same image bytes on
 * every node (a restored guest keeps reading the blocks its page cache expects). out receives
 * the path, image the image's own sha256 (kept beside it in <digest>.erofs.sha256). */
int dsec__vm_image(struct vm_backend *be, const char *digest, const char *dir, char *out,
                   size_t len, dsec_digest image, dsec_err *err);
/* Remove the images in S/images whose layer the cache no longer holds and that no running
 * QEMU reads (a detached one too): images go with their layers. A sandbox holds its layers in
 * the cache while it lives, so none of the backend's loses its image; a snapshot's is made
 * again, byte for byte, when it is restored. */
void dsec__vm_images_gc(struct vm_backend *be);
/* Make sb's writable disk dir/disk.img: ext4 of size_mb, sparse, holding dsec/conf,
 * dsec/env, upper/ and work/ (the contract with the guest's init). */
int dsec__vm_disk_make(const dsec_sandbox *sb, const char *conf, const char *envfile,
                       dsec_err *err);
/* Copy a file keeping holes (a reflink when the filesystem can). */
int dsec__vm_copy_sparse(const char *src, const char *dst, dsec_err *err);
/* Bytes allocated to a file (its blocks), 0 when missing. */
uint64_t dsec__vm_allocated(const char *path);
/* rm -rf; 0, or -1 with errno. */
int dsec__vm_rmtree(const char *path);

#endif
