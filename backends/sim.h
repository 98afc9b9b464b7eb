/* sim.h - the sim backend: a sandbox type that does no real work, for simulation and benchmarks. */
#ifndef DSEC_BACKENDS_SIM_H
#define DSEC_BACKENDS_SIM_H

#include "backends/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The sim backend's operations; open it with dsec_backend_new(&be,
 * &dsec_sim_ops, &cfg, &err). Registered as type "sim" in the built-in
 * registry.
 *
 * Impersonation. A sim instance hosts sandboxes of ANY type name the spec
 * gives (function, container, microvm, vm, or a made-up one; at most 32
 * names per instance): the node manager decides which types a node offers,
 * and the sim models each one. With enforce_caps (the default), fork, pause
 * and snapshot/restore fail with DSEC_E_UNSUPPORTED when the built-in
 * capability record of the impersonated type lacks them (function: all
 * three), exactly as the real backend would refuse.
 *
 * Options (dsec_backend_config.opts; an unknown key fails with DSEC_E_CONFIG):
 *   time_scale=F          multiplies every modelled latency before sleeping;
 *                         default 1, 0 = never sleep (benchmarks).
 *   max_disk_mb=N         file bytes per sandbox (default 64; a spec's
 *                         disk_mb, when smaller, wins).
 *   max_files=N           files per sandbox (default 65536).
 *   enforce_caps=true|false
 *   Per type, as KEY.TYPE (one type) or KEY (every type; KEY.TYPE wins):
 *   startup_ms            create/fork/restore latency (default: the type's
 *                         caps startup_ms: function 2, container 40,
 *                         microvm 150, vm 3000, sim and others 0).
 *   exec_ms               per command, counted as CPU time (function 1,
 *                         container 2, microvm 3, vm 5, sim 0, others 1).
 *   mem_overhead_mb       resident cost of the sandbox machinery (function 1,
 *                         container 4, microvm 64, vm 256, sim/others 0).
 *   cpu_frac              share of the requested CPU in use (default 0.05).
 *   mem_frac              share of the requested memory resident (0.10).
 *
 * exec. Deterministic, so control-plane tests can assert on it; the command
 * is the basename of argv[0]:
 *   echo ARGS...   stdout = ARGS joined by spaces + "\n", exit 0
 *   cat            stdout = stdin
 *   cat PATH...    stdout = those in-memory files; a missing one writes
 *                  "cat: PATH: No such file or directory\n" to stderr, exit 1
 *   true           exit 0;   false: exit 1;   exit N: exit N & 255
 *   sleep N        takes N seconds (scaled by time_scale when sleeping); a
 *                  timeout_ms shorter than that ends it with timed_out,
 *                  signal 9 and exit_code -1
 *   anything else  exit 0, no output
 * Every command also takes exec_ms. duration_us is the MODELLED duration
 * (unscaled), so results do not depend on time_scale. Output is capped at
 * output_max with the truncated flags set.
 *
 * State. pause/resume flip a flag; while paused, exec and file operations
 * fail with DSEC_E_STATE (the agent inside is frozen). Pausing twice or
 * resuming a running sandbox succeeds (retries are harmless).
 *
 * Files live in memory per sandbox (absolute, normal paths; directories are
 * implied by the files below them). fork shares file contents copy-on-write:
 * children see the parent's files at fork time and nothing written later by
 * the parent or by a sibling.
 *
 * stats: cpu_used_us = sum of exec_ms of the commands run; cpu_milli =
 * cpu_frac * requested (0 while paused); memory_bytes = mem_overhead_mb +
 * mem_frac * requested memory; disk_bytes and nfiles = the in-memory files.
 *
 * backend_state is "sim1;type=T;cpu=N;mem=N;disk=N". adopt() rebuilds the
 * sandbox from it; its FILES ARE LOST (they lived only in the old process).
 * snapshot() writes the files to a file (written aside, then renamed);
 * restore() starts a new sandbox of the same type from it.
 *
 * Memory: 48 bytes per empty sandbox (plus allocator rounding), no thread or
 * timer per sandbox; the id is not stored (the node manager holds it).
 * Latency is modelled by sleeping in the calling thread, as a real runtime
 * would block it.
 */
extern const dsec_backend_ops dsec_sim_ops;

#ifdef __cplusplus
}
#endif
#endif
