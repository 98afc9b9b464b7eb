/* fuzz_json.c - fuzz msgpack -> JSON: never crash, and every output is strictly valid JSON. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "codecs/msg.h"
#include "codecs/testkit.h"
#include "dsec/err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const uint8_t *data, size_t size, unsigned flags)
{
    static dsec_buf out;
    dsec_err err;
    dsec_err_clear(&err);
    if (dsec_msgpack_to_json_ex(&out, data, size, flags, &err) < 0) {
        if (err.code != DSEC_E_DECODE || err.msg[0] == '\0' || out.len != 0) {
            fprintf(stderr, "fuzz_json: bad failure: code %d: %s\n", err.code, err.msg);
            abort();
        }
        return;
    }
    size_t where = 0;
    if (!dsec_testkit_json_valid(out.data, out.len, &where)) {
        fprintf(stderr, "fuzz_json: invalid JSON at byte %zu: %.*s\n", where, (int)out.len,
                out.data);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check(data, size, 0);
    check(data, size, DSEC_JSON_PRETTY);
    return 0;
}
