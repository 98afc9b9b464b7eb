/* function.h - the function backend: each exec is one call run in a pre-warmed, sandboxed worker
 * forked from a per-runtime zygote. */
#ifndef DSEC_BACKENDS_FUNCTION_H
#define DSEC_BACKENDS_FUNCTION_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "backends/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The "function" sandbox type (docs/function-calls.md is the long form).
 * Needs root (namespaces, mounts, cgroups) and the zygote programs built
 * with it: dsec-fn-zygote (sh, native) and _dsec_fnz.so, which
 * /usr/bin/python3 loads to become the python3 zygote.
 *
 * A sandbox is light: a runtime, limits, and the files every call starts
 * with. The processes are shared per runtime: a zygote per runtime and a
 * pool of warm workers forked from it, each already in fresh mount, pid,
 * ipc, uts, network and cgroup namespaces, on its own read-only root, as its
 * own unprivileged uid, under seccomp, waiting for one call.
 *
 * create   spec labels (all optional):
 *            runtime=python3|sh|native   which zygote and pool (python3)
 *            cpu_ms=N       CPU time of a call, all its processes (none)
 *            timeout_ms=N   wall time of a call when the exec names none
 *            nproc=N        processes at once in a call (64)
 *            fsize_mb=N     largest file a call may write (none but the tmpfs)
 *            nofile=N       open files per process (1024)
 *          memory_mb is the memory of one call (its cgroup: the call is
 *          OOM-killed alone beyond it); disk_mb caps the sandbox's files.
 *          Other labels are ignored. A network policy (spec net) gives the
 *          sandbox a network of the node's containment (dsec_backend_config
 *          .net; refused without one): every call then runs in that
 *          namespace, with the sandbox's resolver in /etc/resolv.conf, in a
 *          worker made for it. Without a policy a call has no network (lo
 *          only). Starts the runtime's pool if it is not running yet, and
 *          fails if its zygote cannot start.
 * exec     one call. argv[0] python/python3/python3.N in a python3 sandbox
 *          runs in the warm interpreter: -c CODE, SCRIPT, -m MODULE, - (code
 *          on stdin), flags -u -B -E -s -I -q, and --call FUNC (run the code,
 *          call FUNC with the remaining arguments decoded as JSON; stdout
 *          gets the JSON of its return value, its prints go to stderr).
 *          Anything else is executed (PATH lookup) inside the sandbox.
 *          env adds to PATH, HOME=/work, TMPDIR=/tmp, LANG=C.UTF-8; reserved
 *          keys lower this call's limits and are not passed on:
 *          DSEC_LIMIT_CPU_MS, DSEC_LIMIT_MEMORY_MB, DSEC_LIMIT_NPROC,
 *          DSEC_LIMIT_FSIZE_MB, DSEC_LIMIT_OUTPUT_BYTES. cwd defaults to
 *          /work; user must be unset. timeout_ms 0 means the sandbox's
 *          timeout_ms label, else none - but every call ends by the
 *          backend's max_timeout_ms. Results: exit code or signal (SIGKILL
 *          and timed_out on timeout, SIGXCPU past cpu_ms, SIGKILL when the
 *          memory cgroup killed it), capped stdout/stderr, duration_us,
 *          cpu_us (cgroup CPU of all the call's processes) and peak_rss_kb
 *          (largest RSS of the call's main process).
 * files    file_write/read/list work on the sandbox's files under /work
 *          (kept on the node's disk); each call gets its own copy of them
 *          in a private tmpfs. Nothing a call writes survives it.
 * net_set  replaces the policy of a sandbox created with one (its next
 *          calls follow it); a sandbox created without one has no network.
 * fork, pause, snapshot, restore: unsupported. adopt re-attaches from the
 *          backend_state after a node manager restart (the files are on disk,
 *          a networked sandbox's policy in <state_dir>/net/<id>).
 *
 * Options (dsec_backend_config.opts, as "function.KEY" or KEY; unknown
 * unprefixed keys belong to other backends and are ignored, unknown
 * "function." keys are an error):
 *   max_workers=N         workers alive at once on this node, all runtimes (64)
 *   pool_python3=N, pool_sh=N, pool_native=N   warm workers kept (8, 2, 2)
 *   hot_python3=N (2), hot_sh=N, hot_native=N (0)   of which warmed further
 *                         ahead, taken first by calls
 *   hot_level=1|2         how far (2): 1 the interpreter's after-fork work
 *                         (~0.15 MB more per hot worker), 2 also a first
 *                         compile, exec and JSON round trip (~0.9 MB); a
 *                         trivial call takes ~0.95, ~0.8, ~0.5 ms (none, 1, 2)
 *   prestart=LIST         runtimes whose pool starts with the backend
 *   tmpfs_mb=N            size of each call's /tmp and of its /work (64)
 *   memory_mb=N           call memory when the spec has none (512)
 *   files_mb=N            a sandbox's files when the spec has no disk_mb (64; a node
 *                         always passes one: the cell's defaults.function_disk_mb)
 *   max_timeout_ms=N      ceiling of every call (600000)
 *   acquire_ms=N          wait for a warm worker before failing (30000)
 *   uid_base=N            calls run as uid/gid uid_base + slot; the range
 *                         uid_base .. uid_base + max_workers - 1 must be free
 *                         on this host (init fails naming the backend that
 *                         holds it). Unset: the first free range of
 *                         1500000000..1599999999, so cells can share a host
 *   preload=LIST          python3 modules imported in the zygote
 *   ro=LIST               extra host paths visible read-only in calls
 *   cgroup=auto|v1|v2|none
 *   rlimit_as=true|false  also cap address space at the memory limit (false)
 *   python=PATH           the interpreter that becomes the zygote (/usr/bin/python3)
 *   python_module=PATH, zygote=PATH   the zygote programs (default: the
 *                         build's, then next to the running program)
 */
extern const dsec_backend_ops dsec_function_ops;

/* State of one runtime's pool, for tests, benchmarks and dsec top. */
typedef struct dsec_function_pool_info {
    char state[16];   /* off | starting | up | down | failed */
    pid_t zygote_pid; /* 0 when none */
    unsigned zygote_starts;
    unsigned warm; /* ready for a call, hot ones included */
    unsigned hot;  /* of which warmed ahead (python3: after-fork work done) */
    unsigned promoting, spawning, busy, draining;
    unsigned long long calls, spawned, spawn_failures;
    char version[64];             /* "python 3.11.2", "exec" */
    char preloaded[512];          /* python3: modules the zygote imported */
    char error[DSEC_ERR_MSG_MAX]; /* the last failure, "" when none */
    char
        zygote_exit[128]; /* how the last zygote ended ("was killed by signal 9 (Killed)"), or "" */
    char name[160];       /* "python3", or "python3 in python:3" for an environment's pool */
    unsigned sandboxes;   /* an environment's pool: sandboxes using it */
} dsec_function_pool_info;

/* These take the instance pointer that dsec_function_ops.init returned. */
int dsec_function_pool_info_get(void *self, const char *runtime, dsec_function_pool_info *out,
                                dsec_err *err);
/* The uids this backend's calls run as: first .. first + count - 1 (the
 * option uid_base's range, or the free one picked without it). */
void dsec_function_uid_range(void *self, uint32_t *first, unsigned *count);
/* Set the runtime's warm and hot targets (starting its pool) and wait up to
 * wait_ms until that many workers are warm, and that many of them hot. */
int dsec_function_pool_warm(void *self, const char *runtime, unsigned warm, unsigned hot,
                            int wait_ms, dsec_err *err);
/* The host pids of the supervisors (W2) of warm workers; returns how many
 * were written (at most max). Each call process (W3) is a child of one. */
size_t dsec_function_pool_pids(void *self, const char *runtime, pid_t *out, size_t max);
/* The environment pools alive now (one per runtime and environment in use,
 * or idle for less than env_idle_ms), into out[0..max); returns how many. */
size_t dsec_function_env_pools(void *self, dsec_function_pool_info *out, size_t max);

#ifdef __cplusplus
}
#endif
#endif
