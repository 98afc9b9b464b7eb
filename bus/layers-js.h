/* layers-js.h - a layer registry in JetStream: blobs as chunked stream messages, tags and
 * environments in a KV bucket. */
#ifndef DSEC_BUS_LAYERS_JS_H
#define DSEC_BUS_LAYERS_JS_H

#include <stdbool.h>
#include <stddef.h>

#include "bus/bus.h"
#include "dsec/err.h"
#include "dsec/layers.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsec_js_layers_conf {
    const char *bucket; /* [A-Za-z0-9_-]+; NULL: "DSEC_LAYERS" */
    int replicas;       /* stream and bucket replicas; 0: 1 (3 in a cluster) */
    size_t chunk_bytes; /* blob chunk size; 0: 512 KiB (below the server's max_payload) */
    bool own_bus;       /* the registry takes bus (on success only) and frees it when freed */
} dsec_js_layers_conf;

/*
 * Open (creating when absent) the registry named conf->bucket on bus:
 *  - KV bucket <bucket>: "blob.<hex>" -> "dsec-blob 1 <format> <size> <chunks>",
 *    "tag.<name>/<version>" -> digest, "env.<name>/<version>" -> document;
 *  - stream <bucket>_BLOBS on "dsec.layers.<bucket>.<hex>.<n>", one message
 *    per chunk (the last per subject kept).
 * A blob's metadata is written after its last chunk is stored, so a reader
 * never sees half a blob. bus is borrowed and must outlive the registry, unless
 * conf->own_bus: then a successful call takes it (dsec_layer_registry_free frees it after
 * the registry) and a failed one leaves it to the caller.
 * *out is freed with dsec_layer_registry_free.
 */
int dsec_layer_registry_jetstream(dsec_layer_registry **out, dsec_bus *bus,
                                  const dsec_js_layers_conf *conf, dsec_err *err);

#ifdef __cplusplus
}
#endif
#endif
