/* image-pull-int.h - the registry pull's internals: fetch to an OCI layout. */
#ifndef DSEC_BACKENDS_IMAGE_PULL_INT_H
#define DSEC_BACKENDS_IMAGE_PULL_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "dsec/err.h"
#include "dsec/image.h"

/*
 * Fetch ref from its registry (HTTP API v2) into dir (which must exist and
 * be empty) as an OCI image layout: oci-layout, index.json naming the one
 * image manifest (an index is resolved to o->import.platform first), and
 * blobs/sha256/HEX for that manifest, its config and its layers, each
 * checked against its digest. *norm_ref (may be NULL) gets the normalized
 * reference (HOST[:PORT]/PATH:TAG or HOST[:PORT]/PATH@sha256:HEX),
 * dsec_malloc'd, caller frees. On failure dir may hold partial files: the
 * caller removes it.
 */
int dsec__image_fetch_layout(const char *ref, const dsec_image_pull_opts *o, const char *dir,
                             char **norm_ref, dsec_err *err);
/* The same, leaving out the layers held_in (when not NULL) already holds as dsec layers of
 * o->import.format, found by the config's diff_ids and their records (dsec_image_pull passes
 * its registry: a task image over a base already pulled fetches only its own layers). The
 * layout then lacks those blobs, and only an import into held_in can use it. */
int dsec__image_fetch_layout_for(const char *ref, const dsec_image_pull_opts *o, const char *dir,
                                 dsec_layer_registry *held_in, char **norm_ref, dsec_err *err);

#endif
