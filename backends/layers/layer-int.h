/* layer-int.h - helpers shared by the layer registry, builder and cache (module-internal). */
#ifndef DSEC_BACKENDS_LAYER_INT_H
#define DSEC_BACKENDS_LAYER_INT_H

#include <stddef.h>
#include <sys/types.h>

#include "dsec/err.h"

/* Run argv (argv[0] looked up in PATH) with stdin/stdout on the given fds
 * (-1: /dev/null) and wait for it. A non-zero exit fails with DSEC_E_IO and
 * a message quoting the end of its stderr. */
int dsec__layer_run(const char *const *argv, int in_fd, int out_fd, dsec_err *err);

/* mkdir -p (mode for the dirs it creates). */
int dsec__layer_mkdir_p(const char *path, mode_t mode, dsec_err *err);

/* rm -rf that never crosses into another mount; 0, or -1 with err. */
int dsec__layer_rm_rf(const char *path, dsec_err *err);

/* Write data to path atomically: a temp file in the same directory, fsync,
 * rename, fsync of the directory. Readers see the old or the new bytes. */
int dsec__layer_write_atomic(const char *path, const void *data, size_t len, dsec_err *err);

/* Read a whole small file (at most max bytes); *data is dsec_malloc'd,
 * NUL-terminated, caller frees. ENOENT fails with DSEC_E_NOT_FOUND. */

/* A dsec_malloc'd printf; NULL when out of memory. */
char *dsec__layer_path(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Bytes a file tree takes on disk (allocated blocks), not crossing mounts. */
unsigned long long dsec__layer_tree_bytes(const char *path);

/* Unpack a tar blob (or any tarball tar reads) into the existing dir, keeping
 * numeric owners, modes, device nodes and xattrs (layer-build.c). */
int dsec__layer_untar(const char *tarball, const char *dir, dsec_err *err);

/* Remove PREFIX<pid>.* directories in base whose process is gone (a scratch left by a
 * kill -9: "dsec-import-", "dsec-pull-"); the caller's own are kept. */
void dsec__layer_sweep_scratch(const char *base, const char *prefix);

#endif
