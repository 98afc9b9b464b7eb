/* vm-publish.h - a VM's files as an environment in the cell's layer registry (named snapshots). */
#ifndef DSEC_BACKENDS_VM_PUBLISH_H
#define DSEC_BACKENDS_VM_PUBLISH_H

#include <stddef.h>

#include "dsec/err.h"
#include "dsec/layers.h"

/*
 * A VM's root is an overlay, inside the guest, of its environment's layers
 * and the upper directory on its writable ext4 disk (docs/vm.md). Publishing
 * packs that upper directory as a DIR layer (whiteouts and opaque markers
 * kept) and stores environment `name` = the base layers + that layer, with
 * the base environment's variables, workdir and user, so any sandbox type in
 * the cell can start from it. The guest must have synced and be stopped (or
 * gone) so the disk does not change underneath.
 *
 * disk: the ext4 image; scratch: a directory of the caller's (created if
 * missing, emptied of what this call made); base: the environment the VM
 * started from (its name may be NULL; its layers may be none).
 */
int dsec__vm_publish(dsec_layer_registry *reg, const char *disk, const char *scratch,
                     const dsec_env *base, const char *name, dsec_err *err);

#endif
