/* registry.h - the typed registry of sandbox backends: capabilities, cost, lightest-type pick. */
#ifndef DSEC_BACKENDS_REGISTRY_H
#define DSEC_BACKENDS_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* At most this many types in one registry, so a set of types fits a mask. */
#define DSEC_REGISTRY_MAX 32

/* A set of registry types: bit i is the type at index i. Indices are local
 * to one registry (one process); types travel on the wire by name. */
typedef uint32_t dsec_type_mask;

/* The built-in capability records of function, container, microvm, vm and
 * sim, or NULL for any other name. Static storage. */
const dsec_backend_caps *dsec_backend_caps_builtin(const char *type);

/* ---- requirements --------------------------------------------------------- */

/* A request's parsed `requires` list. Zeroed means "anything goes". */
typedef struct dsec_requires {
    bool own_kernel;
    bool nested_containers;
    bool gui;
    bool persistence;
    bool fork;         /* "fork": supports_fork */
    bool snapshot;     /* "snapshot": supports_snapshot */
    bool pause;        /* "pause": supports_pause */
    bool network;      /* "network" (implied by a create with network policy entries) */
    int min_isolation; /* "isolation:N": isolation >= N */
} dsec_requires;

/* Parse capability strings: own_kernel, nested_containers, gui, persistence,
 * fork, snapshot, pause, network, isolation:N (N in 0..4). An unknown name fails with
 * DSEC_E_UNSUPPORTED naming it and the known ones; a malformed isolation
 * level with DSEC_E_INVALID. req may be NULL when n == 0. */
int dsec_requires_parse(const char *const *req, size_t n, dsec_requires *out, dsec_err *err);

/* Whether caps satisfy r. When not, and lacking is not NULL, writes the
 * first missing capability there as it is spelled in a requires list
 * ("own_kernel", "isolation:3"). */
bool dsec_caps_satisfy(const dsec_backend_caps *caps, const dsec_requires *r, char *lacking,
                       size_t lacking_len);

/* Render r as a requires list ("own_kernel, isolation:3"; "nothing" when empty). */
void dsec_requires_format(const dsec_requires *r, char *buf, size_t len);

/* ---- the registry ------------------------------------------------------------
 * Built once at start-up (new, add...), then read-only: reads from any number
 * of threads need no lock. Adding is not thread-safe. */
typedef struct dsec_registry dsec_registry;

/* An empty registry; *out is the caller's, freed with dsec_registry_free. */
int dsec_registry_new(dsec_registry **out, dsec_err *err);
/* A registry holding the built-ins, in this order (indices 0..4): function
 * (caps and dsec_function_ops), container (dsec_container_ops), microvm
 * (dsec_microvm_ops), vm (dsec_vm_ops) and sim (caps and dsec_sim_ops). */
int dsec_registry_new_builtin(dsec_registry **out, dsec_err *err);
void dsec_registry_free(dsec_registry *reg);

/* Register a type. caps is copied (type name included); ops is borrowed
 * (static storage) and may be NULL for a type that is known only by its
 * capabilities (a scheduler never runs sandboxes). Returns the new index
 * (>= 0), or fails with DSEC_E_EXISTS / DSEC_E_CAPACITY (full) /
 * DSEC_E_INVALID (no name, or isolation out of 0..4). */
int dsec_registry_add(dsec_registry *reg, const dsec_backend_caps *caps,
                      const dsec_backend_ops *ops, dsec_err *err);

size_t dsec_registry_count(const dsec_registry *reg);
/* The index of a type name, or -1. */
int dsec_registry_find(const dsec_registry *reg, const char *type);
/* Owned by the registry; NULL for a bad index. */
const dsec_backend_caps *dsec_registry_caps(const dsec_registry *reg, int idx);
/* NULL for a bad index or a caps-only type. */
const dsec_backend_ops *dsec_registry_ops(const dsec_registry *reg, int idx);
/* Every registered type. */
dsec_type_mask dsec_registry_all(const dsec_registry *reg);

/* The mask of the named types. Unknown names fail with DSEC_E_UNSUPPORTED
 * unless ignore_unknown, when they are skipped (a node may offer a type this
 * process does not know). */
int dsec_registry_mask(const dsec_registry *reg, const char *const *types, size_t n,
                       bool ignore_unknown, dsec_type_mask *out, dsec_err *err);
/* Write the names in mask as "container, microvm" ("none" when empty);
 * truncates to len. */
void dsec_registry_mask_format(const dsec_registry *reg, dsec_type_mask mask, char *buf,
                               size_t len);

/*
 * Pick the sandbox type for a request.
 *  type      the request's explicit type; NULL or "" to choose by requires.
 *  req/nreq  the request's requires list (parsed with dsec_requires_parse).
 *  offered   the types the cell (or node) offers.
 * Returns the chosen index (>= 0):
 *  - with a type: that type, if it is known, satisfies every requirement and
 *    is offered;
 *  - without: the offered type of lowest cost that satisfies them all (ties:
 *    lowest index).
 * Errors (DSEC_E_UNSUPPORTED in every case, each message says what to change):
 *  unknown type ("unknown sandbox type "x" (known: function, ...)"), unknown
 *  capability, a named type lacking a capability ("sandbox type "container"
 *  lacks own_kernel (types with it: microvm, vm)"), a named type not offered,
 *  or nothing offered satisfying the requirements (listing them, and the
 *  known types that would but are not offered). Malformed isolation: DSEC_E_INVALID.
 */
int dsec_registry_pick(const dsec_registry *reg, const char *type, const char *const *req,
                       size_t nreq, dsec_type_mask offered, dsec_err *err);

/* The same with requirements already parsed. */
int dsec_registry_pick_parsed(const dsec_registry *reg, const char *type, const dsec_requires *r,
                              dsec_type_mask offered, dsec_err *err);

#ifdef __cplusplus
}
#endif
#endif
