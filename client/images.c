/* images.c - libdsec's layer registries: a directory or a cell's JetStream bucket (image.h). */
#include <stdio.h>
#include <string.h>

#include "bus/bus.h"
#include "bus/layers-js.h"
#include "client/internal.h"
#include "dsec/image.h"

#define NATS_SCHEME "nats://"
#define BUCKET_MAX 64

/* "nats://HOST:PORT[?bucket=NAME]" -> the server URL and the bucket (DSEC_LAYERS when none). */
static int parse_nats(const char *where, char *url, size_t urllen, char *bucket, dsec_err *err)
{
    const char *q = strchr(where, '?');
    size_t ul = q != NULL ? (size_t)(q - where) : strlen(where);
    if (ul >= urllen)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "layer registry %s: URL longer than %zu bytes", where, urllen - 1);
    if (ul == strlen(NATS_SCHEME))
        return dsec_err_set(
            err, DSEC_E_INVALID, 0,
            "layer registry %s: no server (expected nats://HOST:PORT[?bucket=NAME])", where);
    memcpy(url, where, ul);
    url[ul] = '\0';
    snprintf(bucket, BUCKET_MAX, "DSEC_LAYERS");
    if (q == NULL)
        return 0;
    q++;
    if (strncmp(q, "bucket=", 7) != 0 || q[7] == '\0' || strlen(q + 7) >= BUCKET_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "layer registry %s: expected nats://HOST:PORT?bucket=NAME", where);
    snprintf(bucket, BUCKET_MAX, "%s", q + 7);
    return 0;
}

static int open_jetstream(dsec_layer_registry **out, const char *where, dsec_err *err)
{
    char url[1024], bucket[BUCKET_MAX];
    if (parse_nats(where, url, sizeof url, bucket, err) < 0)
        return -1;
    dsec_bus *bus;
    dsec_bus_opts bo = {.url = url, .name = "dsec-layer"};
    if (dsec_bus_connect(&bus, &bo, err) < 0) {
        dsec_err_wrap(err, "layer registry %s", where);
        return -1;
    }
    dsec_js_layers_conf lc = {.bucket = bucket, .own_bus = true};
    if (dsec_layer_registry_jetstream(out, bus, &lc, err) < 0) {
        dsec_bus_free(bus);
        return -1;
    }
    return 0;
}

int dsec_layer_registry_open(dsec_layer_registry **out, const char *where, dsec_err *err)
{
    *out = NULL;
    if (where == NULL || where[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "layer registry: no location (a directory or "
                            "nats://HOST:PORT[?bucket=NAME])");
    if (strncmp(where, NATS_SCHEME, strlen(NATS_SCHEME)) == 0)
        return open_jetstream(out, where, err);
    /* another scheme is a mistake, not a directory named "tls:" */
    const char *sep = strstr(where, "://");
    if (sep != NULL && sep > where && strcspn(where, ":/") == (size_t)(sep - where))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "layer registry %s: not a directory or nats://HOST:PORT[?bucket=NAME]",
                            where);
    return dsec_layer_registry_local(out, where, err);
}

int dsec_client_layer_registry(dsec_client *c, const char *bucket, dsec_layer_registry **out,
                               dsec_err *err)
{
    *out = NULL;
    if (c == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "layer registry: no client");
    dsec_js_layers_conf lc = {.bucket = bucket};
    return dsec_layer_registry_jetstream(out, dsec__client_bus(c), &lc, err);
}
