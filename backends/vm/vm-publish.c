/* vm-publish.c - a VM's files as an environment in the cell's layer registry (named snapshots). */
#define _GNU_SOURCE
#include "backends/vm/vm-publish.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/layers/layer-cache.h"
#include "backends/vm/vm-int.h"
#include "dsec/alloc.h"

int dsec__vm_publish(dsec_layer_registry *reg, const char *disk, const char *scratch,
                     const dsec_env *base, const char *name, dsec_err *err)
{
    if (reg == NULL)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "vm: publishing %s needs a layer registry",
                            name);
    if (mkdir(scratch, 0700) < 0 && errno != EEXIST)
        return dsec_err_set(err, DSEC_E_IO, errno, "vm: creating %s", scratch);
    char copy[PATH_MAX], mnt[PATH_MAX], upper[PATH_MAX + 8], blob[PATH_MAX];
    if ((size_t)snprintf(copy, sizeof copy, "%s/disk.img", scratch) >= sizeof copy ||
        (size_t)snprintf(mnt, sizeof mnt, "%s/mnt", scratch) >= sizeof mnt ||
        (size_t)snprintf(blob, sizeof blob, "%s/layer.blob", scratch) >= sizeof blob)
        return dsec_err_set(err, DSEC_E_INVALID, ENAMETOOLONG, "vm: path under %s is too long",
                            scratch);
    snprintf(upper, sizeof upper, "%s/upper", mnt);
    unlink(copy);
    unlink(blob);
    /* A copy, mounted read-write: the guest's journal may hold committed
     * metadata not yet written home, and only a read-write mount replays it. */
    int rc = dsec__vm_copy_sparse(disk, copy, err);
    bool mounted = false;
    if (rc == 0 && mkdir(mnt, 0700) < 0 && errno != EEXIST)
        rc = dsec_err_set(err, DSEC_E_IO, errno, "vm: creating %s", mnt);
    if (rc == 0 && dsec_layer_loop_mount(copy, mnt, "ext4", false, err) < 0)
        rc = dsec_err_wrap(err, "vm: mounting the disk copy");
    mounted = rc == 0;
    dsec_digest top;
    if (rc == 0 && dsec_layer_build(upper, DSEC_LAYER_DIR, NULL, 0, blob, top, err) < 0)
        rc = dsec_err_wrap(err, "vm: packing the VM's files");
    if (mounted && umount2(mnt, 0) < 0 && umount2(mnt, MNT_DETACH) < 0 && rc == 0)
        rc = dsec_err_set(err, DSEC_E_IO, errno, "vm: unmounting %s", mnt);
    rmdir(mnt);
    unlink(copy);
    if (rc == 0 && dsec_layer_registry_put(reg, top, DSEC_LAYER_DIR, blob, err) < 0)
        rc = dsec_err_wrap(err, "vm: storing the snapshot layer");
    unlink(blob);
    if (rc < 0)
        return -1;

    size_t nb = base != NULL ? base->nlayers : 0;
    dsec_env d = {.name = (char *)name,
                  .nlayers = nb + 1,
                  .vars = base != NULL ? base->vars : NULL,
                  .nvars = base != NULL ? base->nvars : 0,
                  .workdir = base != NULL ? base->workdir : NULL,
                  .user = base != NULL ? base->user : NULL,
                  .cmd = base != NULL ? base->cmd : NULL,
                  .ncmd = base != NULL ? base->ncmd : 0,
                  .nentry = base != NULL ? base->nentry : 0};
    d.layers = dsec_calloc(nb + 1, sizeof *d.layers);
    if (d.layers == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "vm: environment document");
    for (size_t i = 0; i < nb; i++)
        d.layers[i] = base->layers[i];
    d.layers[nb] = top;
    /* formats come from the registry (NULL asks it to fill them in) */
    if (dsec_layer_registry_tag_set(reg, name, top, err) < 0)
        rc = dsec_err_wrap(err, "vm: tagging the snapshot layer");
    else if (dsec_layer_registry_env_put(reg, &d, err) < 0)
        rc = dsec_err_wrap(err, "vm: storing environment %s", name);
    dsec_free(d.layers);
    return rc;
}
