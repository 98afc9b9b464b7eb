/* function-zygote.h - what the parts of the zygote (dsec-fn-zygote and the python module _dsec_fnz)
 * share; not used by the backend library. */
#ifndef DSEC_BACKENDS_FUNCTION_ZYGOTE_H
#define DSEC_BACKENDS_FUNCTION_ZYGOTE_H

#include <linux/filter.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/function/function-proto.h"

/* A task as W3 sees it once decoded: pointers into the received string area. */
struct fnz_task {
    const struct fnp_task *hdr;
    const char *target;    /* code, script path or module; "" for exec */
    const char *call_func; /* --call FUNC, or "" */
    const char *cwd;
    char **argv; /* argc + NULL */
    char **env;  /* envc + NULL, "K=V" */
};

/* ---- seccomp (function-seccomp.c) ---- */

/* Build the two filters once (libseccomp) as BPF programs: base, which the
 * zygote installs on itself so every worker inherits it, and tail, which each
 * call process (W3) adds. On failure writes a message to msg and returns -1. */
int fnz_seccomp_build(struct sock_fprog *base, struct sock_fprog *tail, char *msg, size_t msglen);

/* ---- runtimes ---- */

/* A warm runtime the zygote keeps initialised. NULL means "exec": no
 * interpreter, W3 executes the task's program. */
struct fnz_runtime {
    /* Once, in the zygote after the pivot: import the modules named in
     * preload (comma-separated; missing ones are skipped and left out of
     * loaded) and make the heap ready to be shared. 0, or -1 with msg. */
    int (*warm)(const char *preload, char *version, size_t vlen, char *loaded, size_t llen,
                char *msg, size_t msglen);
    /* In W3, ahead of its call, from level `from` to level `to`: level 1
     * does the runtime's after-fork work, level 2 also runs its per-call
     * paths once, so their first-touch page faults are not on the call's
     * path. Each level costs the worker more private memory. */
    void (*prepare)(int from, int to);
    /* In W3: run the task, return the exit code. prepared is the level
     * prepare ran at. */
    int (*run)(const struct fnz_task *t, int prepared);
};

/* The zygote: argv as documented in usage(); rt NULL for the exec runtime.
 * Returns only on a usage error. */
int fnz_main(int argc, char **argv, const struct fnz_runtime *rt);

#endif
