/* vm.h - the QEMU sandbox backends: "microvm" (-M microvm, virtio-mmio) and "vm" (-M q35,
 * virtio-pci). */
#ifndef DSEC_BACKENDS_VM_H
#define DSEC_BACKENDS_VM_H

#include "backends/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Each sandbox is one QEMU process booting the node's VM kit (a kernel and
 * an initrd, scripts/build-vmkit.sh) on a writable ext4 disk plus one
 * read-only EROFS image per layer of its environment; dsec-agent is the
 * guest's PID 1 and serves exec and files over a virtio-serial port.
 * Guest RAM lives in a file, so snapshots are a few KiB of device state
 * plus copies of that file and of the disk, and clones map the snapshot's
 * RAM file copy-on-write (they share its page-cache pages).
 *
 * Options (cfg->opts; "microvm.KEY" / "vm.KEY" are this backend's own, and
 * an unknown one of those is an error; bare keys are read when known):
 *   qemu                the QEMU binary (default qemu-system-x86_64 on PATH)
 *   vm_kit              dir holding vmlinuz and initrd.img (default: the build's vmkit)
 *   vm_mem_mb           guest memory when the spec asks 0 (default 256)
 *   vm_tb_mb            TCG translation cache per VM, MiB (default 64; unused with KVM)
 *   vm_boot_timeout_ms  how long a boot may take until the agent answers (default 120000)
 *   vm_uid_base         QEMU drops to uid and gid vm_uid_base + its pid once its devices are
 *                       open (default 1600000000; the range up to + 2^22 is the VMs')
 *   layer_cache_gb      the layer cache's budget (default 0: no limit)
 *
 * The ops tables are static; instances come from dsec_backend_new().
 */
extern const dsec_backend_ops dsec_microvm_ops, dsec_vm_ops;

/* Whether QEMU (the binary qemu, absolute or on PATH) can run guests under
 * KVM here with -cpu max on machine type q35 or microvm: /dev/kvm opens and
 * a paused QEMU on it starts its vCPU and quits cleanly (nested
 * virtualisation can offer /dev/kvm that QEMU aborts on). Probed once per
 * process and machine type (~0.1 s); the backends, the demo and the
 * benchmark all ask this. A failed probe says why on stderr once. */
bool dsec_vm_kvm_works(const char *qemu, bool q35);

#ifdef __cplusplus
}
#endif
#endif
