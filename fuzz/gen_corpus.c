/* gen_corpus.c - write the fuzz seed corpora: every message type, and malformed cases. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "codecs/msg.h"
#include "codecs/record-pb.h"
#include "codecs/testkit.h"

static const char *root;
static int failures;

typedef union anymsg {
    dsec_msg_create create;
    dsec_msg_place place;
    dsec_msg_capacity capacity;
    unsigned char bytes[512];
} anymsg;

/* Write dir/name: the prefix byte (when >= 0), then data. */
static void put(const char *dir, const char *name, int prefix, const void *data, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, dir);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "gen_corpus: mkdir %s: %s\n", path, strerror(errno));
        failures++;
        return;
    }
    snprintf(path, sizeof path, "%s/%s/%s", root, dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        fprintf(stderr, "gen_corpus: %s: %s\n", path, strerror(errno));
        failures++;
        return;
    }
    unsigned char p = (unsigned char)prefix;
    if ((prefix >= 0 && fwrite(&p, 1, 1, f) != 1) || (len != 0 && fwrite(data, 1, len, f) != len))
        failures++;
    if (fclose(f) != 0)
        failures++;
}

/* ---- bytes by hand, for the malformed seeds ---------------------------------------- */

typedef struct bytes {
    unsigned char b[32768];
    size_t n;
} bytes;

static void add(bytes *o, const void *p, size_t n)
{
    if (n > sizeof o->b - o->n) {
        failures++;
        return;
    }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void add_byte(bytes *o, unsigned char c)
{
    add(o, &c, 1);
}

static void add_str(bytes *o, const char *s)
{
    size_t n = strlen(s);
    add_byte(o, (unsigned char)(0xa0 | n)); /* fixstr: every string here is < 32 bytes */
    add(o, s, n);
}

/* Literal bytes (embedded NULs included). */
#define ADD(o, lit) add((o), (lit), sizeof(lit) - 1)

/* A create map header with n entries, the first being req_id "r". */
static void create_head(bytes *o, unsigned n)
{
    o->n = 0;
    add_byte(o, (unsigned char)(0x80 | n));
    add_str(o, "req_id");
    add_str(o, "r");
}

static void put_create(const char *name, const bytes *o)
{
    put("decode", name, DSEC_MSG_CREATE - 1, o->b, o->n);
}

/* ---- decode corpus -------------------------------------------------------------------- */

/* Keep only the required fields of a sample. */
static void required_only(int type, void *msg)
{
    const dsec_schema *s = dsec_schema_of(type);
    static const unsigned char zero[64];
    for (size_t i = 0; i < s->nfields; i++) {
        const dsec_field *f = &s->fields[i];
        if (f->required)
            continue;
        size_t size = f->kind == DSEC_F_STR    ? sizeof(char *)
                      : f->kind == DSEC_F_BIN  ? sizeof(dsec_bytes)
                      : f->kind == DSEC_F_BOOL ? sizeof(bool)
                      : f->kind == DSEC_F_STRV ? sizeof(dsec_strv)
                      : f->kind == DSEC_F_KV   ? sizeof(dsec_kv)
                      : f->kind == DSEC_F_LIST ? sizeof(dsec_list)
                                               : sizeof(uint64_t);
        memcpy((char *)msg + f->offset, zero, size);
    }
}

static void valid_messages(dsec_buf *enc)
{
    dsec_err err;
    char name[96];
    for (int t = DSEC_MSG_NONE + 1; t < DSEC_MSG_TYPE_MAX_; t++) {
        anymsg m;
        dsec_testkit_sample(t, &m);
        if (dsec_encode(enc, t, &m, &err) < 0) {
            fprintf(stderr, "gen_corpus: %s: %s\n", dsec_msg_type_name(t), err.msg);
            failures++;
            continue;
        }
        snprintf(name, sizeof name, "%s-full", dsec_msg_type_name(t));
        put("decode", name, t - 1, enc->data, enc->len);
        snprintf(name, sizeof name, "msg-%s", dsec_msg_type_name(t));
        put("json", name, -1, enc->data, enc->len);
        snprintf(name, sizeof name, "%s-cut", dsec_msg_type_name(t));
        put("decode", name, t - 1, enc->data, enc->len / 2);
        required_only(t, &m);
        if (dsec_encode(enc, t, &m, &err) == 0) {
            snprintf(name, sizeof name, "%s-min", dsec_msg_type_name(t));
            put("decode", name, t - 1, enc->data, enc->len);
        }
    }
}

static void malformed_creates(void)
{
    bytes o;
    create_head(&o, 2);
    add_str(&o, "req_id");
    add_str(&o, "s");
    put_create("create-dup-key", &o);
    create_head(&o, 2);
    add_str(&o, "memory_mb");
    add_str(&o, "lots");
    put_create("create-wrong-type", &o);
    create_head(&o, 2);
    add_str(&o, "cpu_milli");
    ADD(&o, "\xce\x00\x1e\x84\x80"); /* 2000000 */
    put_create("create-out-of-range", &o);
    create_head(&o, 2);
    add_str(&o, "tenant");
    ADD(&o, "\xa3"
            "a\0b");
    put_create("create-nul", &o);
    create_head(&o, 2);
    add_str(&o, "tenant");
    ADD(&o, "\xa2\xc0\xaf");
    put_create("create-bad-utf8", &o);
    create_head(&o, 1);
    ADD(&o, "\x01\x02\x03");
    put_create("create-trailing", &o);
    o.n = 0;
    ADD(&o, "\x92\xa1r\xa1s");
    put_create("create-not-map", &o);
    o.n = 0;
    add_byte(&o, 0xc0);
    put_create("create-nil", &o);
    create_head(&o, 2);
    add_str(&o, "future");
    for (int i = 0; i < 9; i++)
        add_byte(&o, 0x91);
    add_byte(&o, 0x01);
    put_create("create-too-deep", &o);
    create_head(&o, 2);
    add_str(&o, "net");
    ADD(&o, "\xdd\xff\xff\xff\xff\xa1x");
    put_create("create-huge-array-header", &o);
    create_head(&o, 2);
    add_str(&o, "x");
    add_byte(&o, 0xc1);
    put_create("create-reserved-byte", &o);
    create_head(&o, 4);
    add_str(&o, "future_map");
    ADD(&o, "\x81\x01\x92\xc0\xd4\x01\x02");
    add_str(&o, "cpu_milli");
    ADD(&o, "\xd0\x05"); /* int8 5 in a U64 field */
    add_str(&o, "priority");
    ADD(&o, "\xd3\xff\xff\xff\xff\xff\xff\xff\xfe");
    put_create("create-unknown-fields-ok", &o);
    create_head(&o, 2);
    ADD(&o, "\x07\xa1v");
    put_create("create-int-key", &o);
    create_head(&o, 2);
    add_str(&o, "labels");
    ADD(&o, "\x82\xa1"
            "a\xa1"
            "1\xa1"
            "a\xa1"
            "2");
    put_create("create-labels-dup", &o);
}

static void malformed_others(void)
{
    bytes o = {.n = 0};
    /* exec with 5000 argv items: over the 4096 limit */
    ADD(&o, "\x82\xa2id\xa1x\xa4"
            "argv\xdc\x13\x88");
    for (int i = 0; i < 5000; i++)
        ADD(&o, "\xa1"
                "a");
    put("decode", "exec-argv-too-many", DSEC_MSG_EXEC - 1, o.b, o.n);
    o.n = 0;
    ADD(&o, "\x82\xa2id\xa1x\xa4"
            "argv\x90");
    put("decode", "exec-argv-empty", DSEC_MSG_EXEC - 1, o.b, o.n);
    o.n = 0;
    ADD(&o, "\x82\xa2id\xa1x\xa7"
            "entries\x92\x81\xa4name\xa1"
            "a\xa1"
            "b");
    put("decode", "file_list_reply-item-not-map", DSEC_MSG_FILE_LIST_REPLY - 1, o.b, o.n);
    o.n = 0;
    ADD(&o, "\x82\xa2id\xa1x\xa7"
            "entries\x91\x81\xa4kind\xa4"
            "file");
    put("decode", "file_list_reply-entry-no-name", DSEC_MSG_FILE_LIST_REPLY - 1, o.b, o.n);
    o.n = 0;
    ADD(&o, "\x82\xa2id\xa1x\xa9"
            "exit_code\xd0\xfe");
    put("decode", "exec_result-exit-code-range", DSEC_MSG_EXEC_RESULT - 1, o.b, o.n);
    o.n = 0;
    ADD(&o, "\x84\xa2id\xa1x\xa4node\xa1n\xa4type\xa1t\xa8"
            "existing\x01");
    put("decode", "created-bool-as-int", DSEC_MSG_CREATED - 1, o.b, o.n);
}

/* ---- json corpus ---------------------------------------------------------------------- */

static void put_json(const char *name, const void *p, size_t n)
{
    put("json", name, -1, p, n);
}

#define PUT_JSON(name, lit) put_json((name), (lit), sizeof(lit) - 1)

static void json_seeds(void)
{
    PUT_JSON("scalars", "\x9d\xc0\xc2\xc3\x7f\xcc\xff\xcd\xff\xff\xce\xff\xff\xff\xff"
                        "\xcf\xff\xff\xff\xff\xff\xff\xff\xff\xe0\xd0\x80\xd1\x80\x00"
                        "\xd2\x80\x00\x00\x00\xd3\x80\x00\x00\x00\x00\x00\x00\x00\x00");
    PUT_JSON("floats", "\x95\xca\x3d\xcc\xcc\xcd\xcb\x3f\xb9\x99\x99\x99\x99\x99\x9a"
                       "\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00\xcb\xff\xf0\x00\x00\x00\x00\x00\x00"
                       "\xcb\x80\x00\x00\x00\x00\x00\x00\x00");
    PUT_JSON("string-escapes", "\xa9\"\\\x01\n\t\x1f/\x7f\xc3");
    PUT_JSON("string-utf8", "\xa8h\xc3\xa9llo\xe2\x82");
    PUT_JSON("string-4byte", "\xa4\xf0\x9f\x98\x80");
    PUT_JSON("bin", "\xc4\x05\x00\x01\x02\xfe\xff");
    PUT_JSON("ext-fixed",
             "\x95\xd4\x01\x02\xd5\x02\x01\x02\xd6\xff\x00\x00\x00\x01"
             "\xd7\x03\x00\x00\x00\x00\x00\x00\x00\x01"
             "\xd8\x04\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f");
    PUT_JSON("ext-sized",
             "\x93\xc7\x01\x05\x41\xc8\x00\x02\x06\x41\x42\xc9\x00\x00\x00\x01\x07\x43");
    PUT_JSON("map-odd-keys", "\x86\x01\xa1"
                             "a\xc0\xa1"
                             "b\x91\x01\xa1"
                             "c\x81\xa1k\xa1v\xa1"
                             "d"
                             "\xc4\x01\x00\xa1"
                             "e\xa2\xff\xfe\xa1"
                             "f");
    PUT_JSON("empty-containers", "\x93\x90\x80\xa0");
    bytes o = {.n = 0};
    for (int i = 0; i < 31; i++)
        add_byte(&o, 0x91);
    add_byte(&o, 0x90);
    put_json("deep-32", o.b, o.n);
    o.n = 0;
    for (int i = 0; i < 33; i++)
        add_byte(&o, 0x91);
    add_byte(&o, 0xc0);
    put_json("deep-33", o.b, o.n);
    PUT_JSON("truncated-str", "\xa5"
                              "abc");
    PUT_JSON("trailing", "\xc0\xc0");
    PUT_JSON("reserved-byte", "\x91\xc1");
    PUT_JSON("array16-lies", "\xdc\xff\xff\x01");
    PUT_JSON("map32-lies", "\xdf\x00\x01\x00\x00\x01\x02");
}

/* ---- record corpus -------------------------------------------------------------------- */

static void put_record(const char *name, int mode, const void *p, size_t n)
{
    put("record", name, mode, p, n);
}

#define PUT_RECORD(name, mode, lit) put_record((name), (mode), (lit), sizeof(lit) - 1)

static int write_trace(dsec_buf *out, const dsec_buf *payload)
{
    dsec_err err;
    dsec_record_writer *w = dsec_record_writer_new_buf(out, 0);
    Dsec__V1__TraceHeader h = DSEC__V1__TRACE_HEADER__INIT;
    Dsec__V1__TraceHeader__MetadataEntry e = DSEC__V1__TRACE_HEADER__METADATA_ENTRY__INIT;
    Dsec__V1__TraceHeader__MetadataEntry *ents[] = {&e};
    e.key = "cell";
    e.value = "c1";
    h.format_version = DSEC_TRACE_FORMAT_VERSION;
    h.created_ns = 1700000000000000000ull;
    h.source = "gen_corpus";
    h.n_metadata = 1;
    h.metadata = ents;
    Dsec__V1__TraceCreate c = DSEC__V1__TRACE_CREATE__INIT;
    char *layers[] = {"sha256:aa", "sha256:bb"};
    c.type = "container";
    c.cpu_milli = 500;
    c.memory_mb = 1024;
    c.lifetime_s = 1020;
    c.cpu_use_fraction = 0.05;
    c.n_layers = 2;
    c.layers = layers;
    c.job_id = "job-1";
    c.class_ = "rollout";
    Dsec__V1__TraceRecord r = DSEC__V1__TRACE_RECORD__INIT;
    r.ts_ns = 1;
    r.subject = "dsec.v1.acme.create";
    r.msg_type = "create";
    r.req_id = "req-0123456789abcdef";
    r.payload = (ProtobufCBinaryData){.len = payload->len, .data = (uint8_t *)payload->data};
    r.create = &c;
    Dsec__V1__TraceRecord r2 = DSEC__V1__TRACE_RECORD__INIT;
    r2.ts_ns = 2;
    r2.subject = "dsec.v1.ctl.ping";
    r2.msg_type = "ping";
    int rc = w == NULL || dsec_trace_write_header(w, &h, &err) < 0 ||
                     dsec_record_write(w, &r.base, &err) < 0 ||
                     dsec_record_write(w, &r2.base, &err) < 0
                 ? -1
                 : 0;
    dsec_record_writer_free(w);
    return rc;
}

static int write_trajectory(dsec_buf *out)
{
    dsec_err err;
    dsec_record_writer *w = dsec_record_writer_new_buf(out, 0);
    char *argv[] = {"sh", "-c", "git commit -m x"};
    Dsec__V1__TrajectoryRecord t = DSEC__V1__TRAJECTORY_RECORD__INIT;
    t.rollout_id = "ro-1";
    t.step = 3;
    t.req_id = "req-3";
    t.sandbox_id = "n1-00000000000000a1";
    t.n_argv = 3;
    t.argv = argv;
    t.exit_code = -1;
    t.signal = 9;
    t.stdout_data = (ProtobufCBinaryData){.len = 3, .data = (uint8_t *)"a\0b"};
    t.stderr_data = (ProtobufCBinaryData){.len = 1, .data = (uint8_t *)"\xff"};
    t.ts_ns = 5;
    t.duration_us = 6;
    t.request_hash = (ProtobufCBinaryData){.len = 4, .data = (uint8_t *)"\x01\x02\x03\x04"};
    t.hash_alg = "sha256";
    t.timed_out = true;
    Dsec__V1__TrajectoryRecord empty = DSEC__V1__TRAJECTORY_RECORD__INIT;
    int rc = w == NULL || dsec_record_write(w, &t.base, &err) < 0 ||
                     dsec_record_write(w, &empty.base, &err) < 0 ||
                     dsec_record_write(w, &t.base, &err) < 0
                 ? -1
                 : 0;
    dsec_record_writer_free(w);
    return rc;
}

static void record_seeds(dsec_buf *enc)
{
    anymsg m;
    dsec_err err;
    dsec_testkit_sample(DSEC_MSG_CREATE, &m);
    dsec_buf trace, traj;
    dsec_buf_init(&trace);
    dsec_buf_init(&traj);
    if (dsec_encode(enc, DSEC_MSG_CREATE, &m, &err) < 0 || write_trace(&trace, enc) < 0 ||
        write_trajectory(&traj) < 0) {
        failures++;
        goto out_release;
    }
    put_record("trace", 0, trace.data, trace.len);
    put_record("trace-cut-header", 0, trace.data, 20);
    put_record("trace-cut-record", 0, trace.data, trace.len - 5);
    put_record("trace-magic-only", 0, DSEC_TRACE_MAGIC, DSEC_TRACE_MAGIC_LEN);
    PUT_RECORD("trace-bad-magic", 0, "DSECTRC9\x00");
    PUT_RECORD("trace-newer-version", 0, "DSECTRC1\x02\x08\x02");
    put_record("trajectory", 1, traj.data, traj.len);
    put_record("trajectory-cut", 1, traj.data, traj.len / 2);
    PUT_RECORD("trajectory-garbage-body", 1, "\x03\xff\xff\xff");
    PUT_RECORD("raw-frames", 2, "\x00\x01\x41\x02\x42\x43\xac\x02");
    PUT_RECORD("raw-oversize", 2, "\xff\xff\xff\x7f\x00");
    PUT_RECORD("raw-varint-overflow", 2, "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01");
    PUT_RECORD("raw-varint-cut", 2, "\x80\x80");
out_release:
    dsec_buf_release(&trace);
    dsec_buf_release(&traj);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR   (e.g. fuzz/corpus)\n", argv[0]);
        return 2;
    }
    root = argv[1];
    if (mkdir(root, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "gen_corpus: mkdir %s: %s\n", root, strerror(errno));
        return 1;
    }
    dsec_buf enc;
    dsec_buf_init(&enc);
    valid_messages(&enc);
    malformed_creates();
    malformed_others();
    json_seeds();
    record_seeds(&enc);
    dsec_buf_release(&enc);
    if (failures != 0)
        fprintf(stderr, "gen_corpus: %d failures\n", failures);
    return failures != 0;
}
