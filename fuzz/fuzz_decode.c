/* fuzz_decode.c - fuzz the strict decoder; decode -> encode -> decode must be lossless. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/msg.h"
#include "dsec/err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef union anymsg {
    dsec_msg_create create;
    dsec_msg_place place;
    dsec_msg_capacity capacity;
    unsigned char bytes[512];
} anymsg;

static _Noreturn void die(int type, const char *what, const dsec_err *err)
{
    fprintf(stderr, "fuzz_decode: %s: %s: %s\n", dsec_msg_type_name(type), what,
            err != NULL ? err->msg : "");
    abort();
}

static bool zeroed(const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != 0)
            return false;
    return true;
}

/* Whatever the decoder accepted, the encoder must accept, and the result
 * must decode to the same message and re-encode to the same bytes. */
static void round_trip(int type, const void *first)
{
    static dsec_decoder *again;
    static dsec_buf enc1, enc2;
    anymsg second;
    dsec_err err;
    if (again == NULL && (again = dsec_decoder_new(NULL)) == NULL)
        die(type, "decoder_new", NULL);
    if (dsec_encode(&enc1, type, first, &err) < 0)
        die(type, "re-encoding a decoded message failed", &err);
    if (dsec_decode(again, type, enc1.data, enc1.len, &second, &err) < 0)
        die(type, "decoding our own encoding failed", &err);
    if (!dsec_msg_equal(type, first, &second))
        die(type, "the message changed in a round trip", NULL);
    if (dsec_encode(&enc2, type, &second, &err) < 0 || enc2.len != enc1.len ||
        memcmp(enc1.data, enc2.data, enc1.len) != 0)
        die(type, "encoding is not canonical", &err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static dsec_decoder *d;
    if (size == 0)
        return 0;
    if (d == NULL && (d = dsec_decoder_new(NULL)) == NULL)
        die(0, "decoder_new", NULL);
    /* The first byte picks the message type, the rest is the payload. */
    int type = 1 + data[0] % (DSEC_MSG_TYPE_MAX_ - 1);
    const dsec_schema *s = dsec_schema_of(type);
    if (s == NULL || s->size > sizeof(anymsg))
        die(type, "no schema or struct too big for the harness", NULL);
    anymsg out;
    dsec_err err;
    dsec_err_clear(&err);
    if (dsec_decode(d, type, data + 1, size - 1, &out, &err) == 0) {
        if (dsec_decoder_bad_field(d)[0] != '\0')
            die(type, "success left a bad field", NULL);
        round_trip(type, &out);
        return 0;
    }
    /* Failures keep the error contract: a decode code, a message, no half-filled struct. */
    if (err.code != DSEC_E_DECODE && err.code != DSEC_E_TOO_LARGE)
        die(type, "unexpected error code", &err);
    if (err.msg[0] == '\0')
        die(type, "error without a message", NULL);
    if (!zeroed(&out, s->size))
        die(type, "failed decode left data in the struct", &err);
    return 0;
}
