/* config.h - YAML configuration files read into a tree whose every error names file, line and key.
 */
#ifndef DSEC_ACTORS_CONFIG_H
#define DSEC_ACTORS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsec/err.h"

typedef enum dsec_cfg_kind { DSEC_CFG_SCALAR = 1, DSEC_CFG_MAP, DSEC_CFG_SEQ } dsec_cfg_kind;

typedef struct dsec_cfg_node dsec_cfg_node;
struct dsec_cfg_node {
    dsec_cfg_kind kind;
    int line;             /* 1-based line in the file */
    const char *key;      /* key in the parent map, or NULL */
    const char *value;    /* scalars only */
    dsec_cfg_node **kids; /* map values (each with key) or sequence items */
    size_t n;
};

typedef struct dsec_cfg dsec_cfg;

/* Parse a YAML file. *out owns the tree; free with dsec_cfg_free. Errors
 * read "FILE:LINE: ..." */
int dsec_cfg_load(dsec_cfg **out, const char *path, dsec_err *err);
/* Parse YAML text; name is used in error messages in place of a file. */
int dsec_cfg_parse(dsec_cfg **out, const char *name, const char *text, size_t len, dsec_err *err);
void dsec_cfg_free(dsec_cfg *c);

/* The document's top node (a map; an empty file gives an empty map). */
const dsec_cfg_node *dsec_cfg_root(const dsec_cfg *c);
const char *dsec_cfg_name(const dsec_cfg *c);

/* The value under key in map, or NULL when absent (or map is NULL). */
const dsec_cfg_node *dsec_cfg_get(const dsec_cfg_node *map, const char *key);

/* Fail naming the first key of map that is not in allowed (NULL-terminated):
 * a typo in a config must not be silently ignored. */
int dsec_cfg_check_keys(const dsec_cfg *c, const dsec_cfg_node *map, const char *const *allowed,
                        dsec_err *err);

/* Typed getters: absent key gives the default; a present key of the wrong
 * kind or out of range fails with "FILE:LINE: key "K": ...". Strings are
 * owned by the tree. */
int dsec_cfg_str(const dsec_cfg *c, const dsec_cfg_node *map, const char *key, const char *def,
                 const char **out, dsec_err *err);
int dsec_cfg_u64(const dsec_cfg *c, const dsec_cfg_node *map, const char *key, uint64_t def,
                 uint64_t min, uint64_t max, uint64_t *out, dsec_err *err);
int dsec_cfg_double(const dsec_cfg *c, const dsec_cfg_node *map, const char *key, double def,
                    double min, double max, double *out, dsec_err *err);
int dsec_cfg_bool(const dsec_cfg *c, const dsec_cfg_node *map, const char *key, bool def, bool *out,
                  dsec_err *err);

/* Require node to be of kind (for maps and sequences under a key). NULL
 * node passes (absent is allowed; the caller decides about defaults). */
int dsec_cfg_expect(const dsec_cfg *c, const dsec_cfg_node *node, dsec_cfg_kind kind,
                    dsec_err *err);

#endif
