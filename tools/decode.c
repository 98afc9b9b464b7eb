/* decode.c - `dsec decode`: print one msgpack payload from stdin as JSON. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/err.h"
#include "tools/cli.h"

enum { READ_STEP = 64 << 10 };

typedef struct opts {
    const char *type; /* --type: check against this schema first */
    bool pretty;
    bool schema_md; /* hidden: print the docs/protocol.md field tables */
} opts;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dsec decode [--type NAME] [--pretty]\n"
            "\n"
            "Read one msgpack payload from stdin and print it as JSON on stdout.\n"
            "Binary values print as {\"$bin\":\"<base64>\"}, extension values as\n"
            "{\"$ext\":TYPE,\"data\":\"<base64>\"}.\n"
            "\n"
            "  -t, --type NAME  first decode it strictly as message NAME (create, exec, ...);\n"
            "                   on failure print the field error and exit 1\n"
            "  -p, --pretty     indent the JSON\n"
            "\n"
            "Exit status: 0 printed, 1 the payload is malformed or breaks the schema,\n"
            "2 usage error, empty or oversize input.\n"
            "Watch the bus: nats sub --translate 'dsec decode' 'dsec.>'\n");
}

static void list_types(FILE *out)
{
    for (int t = DSEC_MSG_NONE + 1; t < DSEC_MSG_TYPE_MAX_; t++)
        fprintf(out, "%s%s", t > DSEC_MSG_NONE + 1 ? ", " : "", dsec_msg_type_name(t));
    fputc('\n', out);
}

/* 0 run, 1 help printed, -1 usage error (reported). */
static int parse(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 1;
        } else if (strcmp(a, "-p") == 0 || strcmp(a, "--pretty") == 0) {
            o->pretty = true;
        } else if (strcmp(a, "--schema-md") == 0) {
            o->schema_md = true;
        } else if (strncmp(a, "--type=", 7) == 0) {
            o->type = a + 7;
        } else if (strcmp(a, "-t") == 0 || strcmp(a, "--type") == 0) {
            if (++i == argc) {
                fprintf(stderr, "dsec decode: %s needs a message type\n", a);
                return -1;
            }
            o->type = argv[i];
        } else {
            fprintf(stderr, "dsec decode: unknown argument \"%s\"\n", a);
            usage(stderr);
            return -1;
        }
    }
    return 0;
}

/* Read all of f into b, refusing more than max bytes. */
static int read_all(FILE *f, size_t max, dsec_buf *b, dsec_err *err)
{
    for (;;) {
        if (dsec_buf_reserve(b, READ_STEP, err) < 0)
            return -1;
        size_t got = fread(b->data + b->len, 1, READ_STEP, f);
        b->len += got;
        if (b->len > max)
            return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                                "input exceeds the payload limit of %zu bytes", max);
        if (got < READ_STEP) {
            if (ferror(f))
                return dsec_err_set(err, DSEC_E_IO, errno, "reading stdin");
            return 0;
        }
    }
}

/* Strictly decode in as type: 0 ok, 1 it breaks the schema, 2 no memory. */
static int check_type(int type, const dsec_buf *in)
{
    const dsec_schema *s = dsec_schema_of(type);
    dsec_decoder *d = dsec_decoder_new(NULL);
    void *msg DSEC_AUTOFREE = dsec_calloc(1, s->size);
    if (d == NULL || msg == NULL) {
        dsec_decoder_free(d);
        fprintf(stderr, "dsec decode: out of memory\n");
        return 2;
    }
    dsec_err err;
    dsec_err_clear(&err);
    int rc = dsec_decode(d, type, in->data, in->len, msg, &err);
    dsec_decoder_free(d);
    if (rc == 0)
        return 0;
    fprintf(stderr, "dsec decode: not a valid %s: %s (%s)\n", s->name, err.msg,
            dsec_code_name(err.code));
    return 1;
}

static int print_buf(const dsec_buf *b, bool newline)
{
    if ((b->len != 0 && fwrite(b->data, 1, b->len, stdout) != b->len) ||
        (newline && putchar('\n') == EOF) || fflush(stdout) != 0) {
        fprintf(stderr, "dsec decode: writing stdout: %s\n", strerror(errno));
        return 2;
    }
    return 0;
}

static int schema_md(void)
{
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_err err;
    int rc;
    if (dsec_schema_markdown(&b, &err) < 0) {
        fprintf(stderr, "dsec decode: %s\n", err.msg);
        rc = 2;
    } else {
        rc = print_buf(&b, false);
    }
    dsec_buf_release(&b);
    return rc;
}

static int run(const opts *o, int type, dsec_buf *in, dsec_buf *json)
{
    dsec_err err;
    dsec_err_clear(&err);
    dsec_codec_limits lim;
    dsec_codec_limits_default(&lim);
    if (read_all(stdin, lim.max_payload, in, &err) < 0) {
        fprintf(stderr, "dsec decode: %s\n", err.msg);
        return 2;
    }
    if (in->len == 0) {
        fprintf(stderr, "dsec decode: empty input: expected one msgpack payload on stdin\n");
        return 2;
    }
    if (type != DSEC_MSG_NONE) {
        int rc = check_type(type, in);
        if (rc != 0)
            return rc;
    }
    unsigned flags = o->pretty ? DSEC_JSON_PRETTY : 0;
    if (dsec_msgpack_to_json_ex(json, in->data, in->len, flags, &err) < 0) {
        fprintf(stderr, "dsec decode: %s\n", err.msg);
        return err.code == DSEC_E_NOMEM ? 2 : 1;
    }
    return print_buf(json, true);
}

int dsec_cli_decode(int argc, char **argv)
{
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    if (o.schema_md)
        return schema_md();
    int type = DSEC_MSG_NONE;
    if (o.type != NULL) {
        type = dsec_msg_type_from_name(o.type);
        if (type == DSEC_MSG_NONE) {
            fprintf(stderr, "dsec decode: unknown message type \"%s\"; known: ", o.type);
            list_types(stderr);
            return 2;
        }
    }
    dsec_buf in, json;
    dsec_buf_init(&in);
    dsec_buf_init(&json);
    rc = run(&o, type, &in, &json);
    dsec_buf_release(&in);
    dsec_buf_release(&json);
    return rc;
}
