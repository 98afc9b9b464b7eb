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
#include <sys/types.h>

#include "backends/agent/agent-client.h"
#include "backends/backend.h"
#include "backends/layers/layer-cache.h"
#include "backends/net/net.h"
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

/* One layer of a sandbox's environment. */
struct vm_layer {
    dsec_digest digest;
    char *dir;         /* the layer cache's directory, while held (dsec_malloc'd) */
    dsec_digest image; /* the sha256 of its EROFS image here, once held */
    dsec_digest want;  /* a snapshot's: the image its guest was reading ("" when unknown) */
};

/* What a sandbox runs with. */
struct vm_env {
    char *name; /* env name:version, or NULL */
    struct vm_layer *layers;
    size_t nlayers;
    char **vars; /* "KEY=VALUE" */
    size_t nvars;
    char *workdir;
    char *user;
    char **cmd; /* the default command (an image's Entrypoint then Cmd); ncmd 0: none */
    size_t ncmd;
    size_t nentry; /* how many of cmd's first arguments are the Entrypoint */
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
    bool kvm;         /* dsec_vm_kvm_works */
    uint64_t tsc_khz; /* the host's TSC rate: under TCG the guest's TSC is the host's, and a
                       * guest that must calibrate it against the PIT hangs on a busy host */
    unsigned ncpu;
    dsec_layer_registry *reg; /* borrowed */
    dsec_net *net;            /* borrowed, or NULL */
    dsec_layer_cache *cache;
    pthread_mutex_t lock; /* guards live, building */
    pthread_cond_t built;
    char **building; /* digests whose image is being made */
    size_t nbuilding;
    dsec_sandbox *live;
    pthread_mutex_t sweep_lock;
    _Atomic bool swept;
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
    /* what teardown must undo */
    bool made_dir;
    size_t held; /* env.layers[0..held) are acquired */
    uint64_t last_cpu_us, last_ns;
    dsec_sandbox *live_next;
    bool listed;
};

/* ---- helpers (vm.c) ------------------------------------------------------------------- */

int dsec__vm_fmt(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A small file as a NUL-terminated dsec_malloc'd string (caller frees); NULL with errno. */
char *dsec__vm_read_file(const char *path, size_t max);
/* The last lines of a log file (at most len-1 bytes, newlines turned into " | "). */
void dsec__vm_log_tail(const char *path, char *out, size_t len);

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

/* Run a helper program (argv[0] absolute or on PATH) and wait; out (may be NULL) receives
 * up to outlen-1 bytes of its output. Returns its exit status (128+sig when killed), or -1
 * with err set when it could not start. */
int dsec__vm_run(const char *const *argv, char *out, size_t outlen, dsec_err *err);
/* The same with `in` (at most 4 KiB, or NULL for /dev/null) as its stdin. */
int dsec__vm_run_in(const char *const *argv, const char *in, char *out, size_t outlen,
                    dsec_err *err);
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
