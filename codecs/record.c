/* record.c - varint-length-delimited protobuf records in files and buffers. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "codecs/record-pb.h"
#include "dsec/alloc.h"

enum {
    VARINT_MAX = 10,     /* bytes in the longest 64-bit varint */
    READ_STEP = 1 << 20, /* grow a file record's buffer by this as bytes arrive */
};

/* protobuf-c allocates through the dsec wrapper like everything else. */
static void *pb_alloc(void *data, size_t n)
{
    return dsec_malloc(n);
}

static void pb_free(void *data, void *p)
{
    dsec_free(p);
}

static ProtobufCAllocator pb_allocator = {.alloc = pb_alloc, .free = pb_free};

static size_t max_or_default(size_t max_record)
{
    return max_record != 0 ? max_record : DSEC_RECORD_MAX_DEFAULT;
}

/* ---- writer ------------------------------------------------------------------- */

struct dsec_record_writer {
    FILE *f;       /* file mode */
    dsec_buf *out; /* buffer mode */
    size_t max_record;
    dsec_buf scratch; /* the packed message */
};

static dsec_record_writer *writer_new(FILE *f, dsec_buf *out, size_t max_record)
{
    dsec_record_writer *w = dsec_calloc(1, sizeof *w);
    if (w == NULL)
        return NULL;
    w->f = f;
    w->out = out;
    w->max_record = max_or_default(max_record);
    dsec_buf_init(&w->scratch);
    return w;
}

dsec_record_writer *dsec_record_writer_new_file(FILE *f, size_t max_record)
{
    return f != NULL ? writer_new(f, NULL, max_record) : NULL;
}

dsec_record_writer *dsec_record_writer_new_buf(dsec_buf *b, size_t max_record)
{
    return b != NULL ? writer_new(NULL, b, max_record) : NULL;
}

void dsec_record_writer_free(dsec_record_writer *w)
{
    if (w == NULL)
        return;
    dsec_buf_release(&w->scratch);
    dsec_free(w);
}

static int put_bytes(dsec_record_writer *w, const void *p, size_t n, dsec_err *err)
{
    if (w->out != NULL)
        return dsec_buf_append(w->out, p, n, err);
    if (n != 0 && fwrite(p, 1, n, w->f) != n)
        return dsec_err_set(err, DSEC_E_IO, errno, "record: writing %zu bytes", n);
    return 0;
}

int dsec_record_write_raw(dsec_record_writer *w, const void *data, size_t len, dsec_err *err)
{
    if (w == NULL || (data == NULL && len != 0))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "record: no writer or data");
    if (len > w->max_record)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "record: %zu bytes exceeds limit %zu", len,
                            w->max_record);
    uint8_t prefix[VARINT_MAX];
    size_t n = 0;
    uint64_t v = len;
    do {
        prefix[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v != 0);
    if (put_bytes(w, prefix, n, err) < 0)
        return -1;
    return put_bytes(w, data, len, err);
}

int dsec_record_write(dsec_record_writer *w, const ProtobufCMessage *m, dsec_err *err)
{
    if (w == NULL || m == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "record: no writer or message");
    if (!protobuf_c_message_check(m))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "record: %s has a NULL or missing field",
                            m->descriptor->name);
    size_t n = protobuf_c_message_get_packed_size(m);
    if (n > w->max_record)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "record: %s of %zu bytes exceeds limit %zu",
                            m->descriptor->name, n, w->max_record);
    w->scratch.len = 0;
    if (dsec_buf_reserve(&w->scratch, n, err) < 0)
        return -1;
    w->scratch.len = protobuf_c_message_pack(m, (uint8_t *)w->scratch.data);
    return dsec_record_write_raw(w, w->scratch.data, w->scratch.len, err);
}

int dsec_record_writer_flush(dsec_record_writer *w, dsec_err *err)
{
    if (w != NULL && w->f != NULL && fflush(w->f) != 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "record: flushing");
    return 0;
}

int dsec_trace_write_header(dsec_record_writer *w, const Dsec__V1__TraceHeader *h, dsec_err *err)
{
    if (w == NULL || h == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "trace: no writer or header");
    if (put_bytes(w, DSEC_TRACE_MAGIC, DSEC_TRACE_MAGIC_LEN, err) < 0)
        return -1;
    return dsec_record_write(w, &h->base, err);
}

/* ---- reader ------------------------------------------------------------------- */

struct dsec_record_reader {
    FILE *f;            /* file mode */
    const uint8_t *mem; /* memory mode */
    size_t mem_len;
    uint64_t pos;   /* bytes consumed */
    uint64_t count; /* records read */
    size_t max_record;
    dsec_buf buf; /* file mode: the current record */
};

static dsec_record_reader *reader_new(FILE *f, const void *mem, size_t len, size_t max_record)
{
    dsec_record_reader *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    r->f = f;
    r->mem = mem;
    r->mem_len = len;
    r->max_record = max_or_default(max_record);
    dsec_buf_init(&r->buf);
    return r;
}

dsec_record_reader *dsec_record_reader_new_file(FILE *f, size_t max_record)
{
    return f != NULL ? reader_new(f, NULL, 0, max_record) : NULL;
}

dsec_record_reader *dsec_record_reader_new_mem(const void *buf, size_t len, size_t max_record)
{
    return buf != NULL || len == 0 ? reader_new(NULL, buf, len, max_record) : NULL;
}

void dsec_record_reader_free(dsec_record_reader *r)
{
    if (r == NULL)
        return;
    dsec_buf_release(&r->buf);
    dsec_free(r);
}

uint64_t dsec_record_reader_count(const dsec_record_reader *r)
{
    return r->count;
}

uint64_t dsec_record_reader_offset(const dsec_record_reader *r)
{
    return r->pos;
}

/* The next byte, or -1 at the end of input (-2 with err set on a read error). */
static int next_byte(dsec_record_reader *r, dsec_err *err)
{
    if (r->f == NULL) {
        if (r->pos >= r->mem_len)
            return -1;
        return r->mem[r->pos++];
    }
    int c = getc(r->f);
    if (c == EOF) {
        if (ferror(r->f)) {
            dsec_err_set(err, DSEC_E_IO, errno, "record %llu: reading",
                         (unsigned long long)r->count);
            return -2;
        }
        return -1;
    }
    r->pos++;
    return c;
}

/* Read a varint length prefix. 1: *len set; 0: clean end; -1: error. */
static int read_prefix(dsec_record_reader *r, uint64_t *len, dsec_err *err)
{
    uint64_t start = r->pos, v = 0;
    for (unsigned i = 0; i < VARINT_MAX; i++) {
        int c = next_byte(r, err);
        if (c == -2)
            return -1;
        if (c == -1 && i == 0)
            return 0;
        if (c == -1)
            return dsec_err_set(err, DSEC_E_DECODE, 0,
                                "record %llu at byte %llu: truncated length prefix",
                                (unsigned long long)r->count, (unsigned long long)start);
        if (i == VARINT_MAX - 1 && c > 1)
            break; /* bits beyond 64 */
        v |= (uint64_t)(c & 0x7f) << (7 * i);
        if ((c & 0x80) == 0) {
            *len = v;
            return 1;
        }
    }
    return dsec_err_set(err, DSEC_E_DECODE, 0, "record %llu at byte %llu: malformed length prefix",
                        (unsigned long long)r->count, (unsigned long long)start);
}

static int truncated(const dsec_record_reader *r, uint64_t at, uint64_t got, uint64_t want,
                     dsec_err *err)
{
    return dsec_err_set(err, DSEC_E_DECODE, 0,
                        "record %llu at byte %llu: truncated: %llu of %llu bytes",
                        (unsigned long long)r->count, (unsigned long long)at,
                        (unsigned long long)got, (unsigned long long)want);
}

/* File mode: read len bytes into r->buf, growing it only as bytes arrive so
 * a lying length on a short file costs no more memory than the file. */
static int read_body_file(dsec_record_reader *r, size_t len, uint64_t at, dsec_err *err)
{
    r->buf.len = 0;
    while (r->buf.len < len) {
        size_t want = len - r->buf.len < READ_STEP ? len - r->buf.len : READ_STEP;
        if (dsec_buf_reserve(&r->buf, want, err) < 0)
            return -1;
        size_t got = fread(r->buf.data + r->buf.len, 1, want, r->f);
        r->buf.len += got;
        r->pos += got;
        if (got < want) {
            if (ferror(r->f))
                return dsec_err_set(err, DSEC_E_IO, errno, "record %llu: reading",
                                    (unsigned long long)r->count);
            return truncated(r, at, r->buf.len, len, err);
        }
    }
    return 0;
}

int dsec_record_read_raw(dsec_record_reader *r, const uint8_t **data, size_t *len, dsec_err *err)
{
    if (r == NULL || data == NULL || len == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "record: no reader or output");
    uint64_t at = r->pos, n = 0;
    int rc = read_prefix(r, &n, err);
    if (rc <= 0)
        return rc;
    if (n > r->max_record)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "record %llu at byte %llu: %llu bytes exceeds limit %zu",
                            (unsigned long long)r->count, (unsigned long long)at,
                            (unsigned long long)n, r->max_record);
    if (r->f != NULL) {
        if (read_body_file(r, (size_t)n, at, err) < 0)
            return -1;
        *data = (const uint8_t *)r->buf.data;
    } else {
        if (n > r->mem_len - r->pos) {
            uint64_t got = r->mem_len - r->pos;
            r->pos = r->mem_len; /* consumed, as a file reader would have */
            return truncated(r, at, got, n, err);
        }
        *data = r->mem + r->pos;
        r->pos += n;
    }
    *len = (size_t)n;
    r->count++;
    return 1;
}

/* protobuf-c refuses field number 0 written in one byte (00) but keeps it
 * as an unknown field when written long (80 80 00), and would then write a
 * record that no reader accepts. Refuse it on the way in, at any depth. */
static bool field_numbers_valid(const ProtobufCMessage *m)
{
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return false;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *base = (const char *)m;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t k = 0; k < n; k++)
                if (!field_numbers_valid(v[k]))
                    return false;
        } else {
            const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(base + f->offset);
            if (sub != NULL && !field_numbers_valid(sub))
                return false;
        }
    }
    return true;
}

int dsec_record_read(dsec_record_reader *r, const ProtobufCMessageDescriptor *desc,
                     ProtobufCMessage **out, dsec_err *err)
{
    *out = NULL;
    const uint8_t *data;
    size_t len;
    int rc = dsec_record_read_raw(r, &data, &len, err);
    if (rc <= 0)
        return rc;
    ProtobufCMessage *m = protobuf_c_message_unpack(desc, &pb_allocator, len, data);
    if (m == NULL)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "record %llu: not a valid %s",
                            (unsigned long long)(r->count - 1), desc->name);
    if (!field_numbers_valid(m)) {
        dsec_record_msg_free(m);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "record %llu: not a valid %s (field number 0)",
                            (unsigned long long)(r->count - 1), desc->name);
    }
    *out = m;
    return 1;
}

void dsec_record_msg_free(ProtobufCMessage *m)
{
    if (m != NULL)
        protobuf_c_message_free_unpacked(m, &pb_allocator);
}

static int read_magic(dsec_record_reader *r, dsec_err *err)
{
    char magic[DSEC_TRACE_MAGIC_LEN];
    size_t got = 0;
    while (got < sizeof magic) {
        int c = next_byte(r, err);
        if (c == -2)
            return -1;
        if (c == -1)
            return dsec_err_set(err, DSEC_E_DECODE, 0, "trace: %s %s magic",
                                got == 0 ? "empty input, no" : "truncated", DSEC_TRACE_MAGIC);
        magic[got++] = (char)c;
    }
    if (memcmp(magic, DSEC_TRACE_MAGIC, sizeof magic) != 0)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "trace: bad magic: not a dsec trace file");
    return 0;
}

int dsec_trace_read_header(dsec_record_reader *r, Dsec__V1__TraceHeader **out, dsec_err *err)
{
    *out = NULL;
    if (read_magic(r, err) < 0)
        return -1;
    ProtobufCMessage *m;
    int rc = dsec_record_read(r, &dsec__v1__trace_header__descriptor, &m, err);
    if (rc < 0)
        return dsec_err_wrap(err, "trace header");
    if (rc == 0)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "trace: no header after the magic");
    Dsec__V1__TraceHeader *h = (Dsec__V1__TraceHeader *)m;
    if (h->format_version > DSEC_TRACE_FORMAT_VERSION) {
        unsigned v = h->format_version;
        dsec_record_msg_free(m);
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "trace: format_version %u is newer than this reader (%u)", v,
                            DSEC_TRACE_FORMAT_VERSION);
    }
    *out = h;
    return 0;
}

int dsec_trace_read(dsec_record_reader *r, Dsec__V1__TraceRecord **out, dsec_err *err)
{
    ProtobufCMessage *m;
    int rc = dsec_record_read(r, &dsec__v1__trace_record__descriptor, &m, err);
    *out = (Dsec__V1__TraceRecord *)m;
    return rc;
}

int dsec_trajectory_read(dsec_record_reader *r, Dsec__V1__TrajectoryRecord **out, dsec_err *err)
{
    ProtobufCMessage *m;
    int rc = dsec_record_read(r, &dsec__v1__trajectory_record__descriptor, &m, err);
    *out = (Dsec__V1__TrajectoryRecord *)m;
    return rc;
}
