/* fuzz_jsonparse.c - fuzz the strict JSON parser (image manifests): never crash, refuse with an
 * offset, and agree with the testkit's strict checker about what is JSON. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsec/json.h"
#include "codecs/testkit.h"
#include "dsec/err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Every node reachable and well-formed. */
static size_t walk(const dsec_json *j)
{
    size_t n = 1;
    if (j->type == DSEC_JSON_STRING && (j->str == NULL || strlen(j->str) != j->len))
        abort();
    if (j->type == DSEC_JSON_ARRAY || j->type == DSEC_JSON_OBJECT)
        for (size_t i = 0; i < j->len; i++) {
            if (j->type == DSEC_JSON_OBJECT && j->keys[i] == NULL)
                abort();
            n += walk(j->items[i]);
        }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dsec_json *j = NULL;
    dsec_err err;
    dsec_err_clear(&err);
    size_t where = 0;
    bool valid = dsec_testkit_json_valid((const char *)data, size, &where);
    if (dsec_json_parse((const char *)data, size, &j, &err) < 0) {
        if (j != NULL || (err.code != DSEC_E_DECODE && err.code != DSEC_E_NOMEM) ||
            strncmp(err.msg, "JSON at byte ", 13) != 0) {
            fprintf(stderr, "fuzz_jsonparse: bad failure: code %d: %s\n", err.code, err.msg);
            abort();
        }
        return 0;
    }
    if (!valid) { /* accepted what the strict checker refuses */
        fprintf(stderr, "fuzz_jsonparse: accepted invalid JSON (checker: byte %zu)\n", where);
        abort();
    }
    walk(j);
    dsec_json_free(j);
    return 0;
}
