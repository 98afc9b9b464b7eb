/* cgroup-tune.h - host cgroup settings the sandbox backends depend on for speed. */
#ifndef DSEC_BACKENDS_CGROUP_TUNE_H
#define DSEC_BACKENDS_CGROUP_TUNE_H

#include <stdbool.h>
#include <stddef.h>

#include "dsec/err.h"

/*
 * Moving a process into a cgroup (what crun does for every container, and a
 * function worker for every call) takes the kernel's global threadgroup
 * rwsem for writing. Unless the cgroup2 hierarchy is mounted with
 * favordynmods (Linux 6.0+), that write lock waits for an RCU grace period:
 * measured here, 13 ms for the first cgroup.procs write of a crun run, and
 * crun run -d went from ~31 ms to ~13 ms with it. The price (the kernel's
 * words): forks and exits take a slightly slower read path. The rwsem is
 * shared by every hierarchy, so on hybrid hosts remounting the cgroup2 mount
 * speeds up the v1 controllers too.
 *
 * Remounts the first cgroup2 mount of this mount namespace with its
 * current options plus favordynmods, once per process; later calls return
 * the first call's outcome. Returns 1 if it remounted, 0 if favordynmods was
 * already on, -1 with err set if it is unavailable (no cgroup2 mount, a
 * kernel without the option, no privilege). `where` gets the mount point
 * ("" when none was found).
 */
int dsec_cgroup_favor_dynmods(char *where, size_t len, dsec_err *err);

/* The backends' start-up step: if on, dsec_cgroup_favor_dynmods, and one
 * line on stderr per process saying what happened (never fails the start:
 * the backends work without it, slower). */
void dsec_cgroup_tune_apply(bool on, const char *who);

/* From /proc/self/mountinfo: the mount point of the v1 hierarchy carrying
 * controller ctrl, or (ctrl NULL) of the cgroup2 mount, into path, and the
 * root of that mount (the sub-tree it shows, "/" unless in a cgroup
 * namespace) into root when root is not NULL. Returns 0 when found, -1 when
 * there is none or it does not fit. */
int dsec_cgroup_mount(const char *ctrl, char *path, size_t plen, char *root, size_t rlen);

#endif
