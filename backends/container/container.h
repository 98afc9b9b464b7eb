/* container.h - the container sandbox backend: crun (or runc/runsc) on an overlay of layers. */
#ifndef DSEC_BACKENDS_CONTAINER_H
#define DSEC_BACKENDS_CONTAINER_H

#include "backends/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Type "container". Each sandbox is an OCI container whose root filesystem is
 * an overlay of its environment's layers (from the node's layer cache) under
 * a private upper directory kept in a btrfs subvolume, so fork is a read-only
 * snapshot of that subvolume (O(1)) that becomes one more lower layer of each
 * child. The container's init is dsec-agent; exec and file operations go
 * through it over a unix socket that lives only on the host.
 *
 * Options (dsec_backend_config.opts; "container." prefix optional):
 *   runtime=crun|runc|runsc   the OCI runtime of new containers (default crun)
 *   runtime_path=PATH         its binary (default: looked up in /usr/local/sbin, /usr/local/bin,
 *                             /usr/sbin, /usr/bin, /sbin, /bin)
 *   crun_path, runc_path, runsc_path=PATH
 *                             that runtime's binary (default: looked up), for sandboxes it
 *                             started under an earlier configuration
 *   agent=PATH                the dsec-agent binary (default: the one built)
 *   pids_max=N                process limit per sandbox (default 1024)
 *   upper_gb=N                size of the sparse btrfs image when the state dir
 *                             is not on btrfs (default 64)
 *   layer_cache_gb=N          layer cache budget, 0 = unbounded (default 0)
 *   snapshot_exclude=P,P,...  patterns left out of snapshot layers (default
 *                             __pycache__, *.pyc, .cache and "tmp/" + "*")
 *
 * The node must pass its layer registry in cfg->layers.
 *
 * Disk: spec->disk_mb > 0 caps the bytes only the sandbox's upper subvolume
 * holds (a btrfs qgroup max_excl limit); writes past it fail with EDQUOT in
 * the sandbox. Extents shared with fork snapshots are not charged: a fork
 * child pays for what it writes (copy-ups are reflinks), and a parent's data
 * at a fork is the snapshot's from then on. Children inherit disk_mb. Quotas
 * are switched on in the store on first need, on the backend's own image
 * only; disk_mb on a store without them fails with a message saying why.
 *
 * Runtimes: each sandbox's meta names the runtime that started it, and adopt, destroy and the
 * sweep use that one, whatever the option runtime says now. When it is not installed, adopt
 * fails with DSEC_E_CONFIG and leaves the sandbox as it is (running, its files kept; the sweep
 * leaves it too), so a later instance that has the runtime adopts it.
 *
 * Leftovers: sandboxes an earlier instance left (a node manager crash) and
 * the node did not re-adopt are reclaimed, with the fork snapshots only they
 * used, on the first create, fork, restore, snapshot or destroy after init.
 */
extern const dsec_backend_ops dsec_container_ops;

#ifdef __cplusplus
}
#endif
#endif
