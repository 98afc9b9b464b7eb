/* record-plain.c - the trace and trajectory records as plain structs, to and from protobuf. */
#include <string.h>

#include "codecs/record-pb.h"
#include "dsec/alloc.h"

/* protobuf-c reads only through these casts: the messages it packs are borrowed, never
 * changed, so the writers' const plain structs can lend their pointers. */
#define UNCONST(p) ((void *)(uintptr_t)(p))

static ProtobufCBinaryData pb_bytes(dsec_record_bytes b)
{
    return (ProtobufCBinaryData){.len = b.len, .data = b.data};
}

static dsec_record_bytes plain_bytes(ProtobufCBinaryData b)
{
    return (dsec_record_bytes){.len = b.len, .data = b.data};
}

/* A plain string for a writer: protobuf-c packs NULL strings as absent only when they equal
 * its empty string, so NULL becomes "". */
static char *pb_str(const char *s)
{
    return UNCONST(s != NULL ? s : "");
}

int dsec_traj_record_write(dsec_record_writer *w, const dsec_traj_record *r, dsec_err *err)
{
    Dsec__V1__TrajectoryRecord m = DSEC__V1__TRAJECTORY_RECORD__INIT;
    m.rollout_id = pb_str(r->rollout_id);
    m.step = r->step;
    m.req_id = pb_str(r->req_id);
    m.sandbox_id = pb_str(r->sandbox_id);
    m.n_argv = r->n_argv;
    m.argv = r->argv;
    m.exit_code = r->exit_code;
    m.stdout_data = pb_bytes(r->stdout_data);
    m.stderr_data = pb_bytes(r->stderr_data);
    m.ts_ns = r->ts_ns;
    m.duration_us = r->duration_us;
    m.request_hash = pb_bytes(r->request_hash);
    m.hash_alg = pb_str(r->hash_alg);
    m.signal = r->signal;
    m.timed_out = r->timed_out;
    m.stdout_truncated = r->stdout_truncated;
    m.stderr_truncated = r->stderr_truncated;
    return dsec_record_write(w, &m.base, err);
}

static dsec_traj_record *traj_from(Dsec__V1__TrajectoryRecord *m, dsec_err *err)
{
    dsec_traj_record *r = dsec_calloc(1, sizeof *r);
    if (r == NULL) {
        dsec_record_msg_free(&m->base);
        dsec_err_set(err, DSEC_E_NOMEM, 0, "reading a trajectory record");
        return NULL;
    }
    *r = (dsec_traj_record){
        .rollout_id = m->rollout_id,
        .step = m->step,
        .req_id = m->req_id,
        .sandbox_id = m->sandbox_id,
        .n_argv = m->n_argv,
        .argv = m->argv,
        .exit_code = m->exit_code,
        .stdout_data = plain_bytes(m->stdout_data),
        .stderr_data = plain_bytes(m->stderr_data),
        .ts_ns = m->ts_ns,
        .duration_us = m->duration_us,
        .request_hash = plain_bytes(m->request_hash),
        .hash_alg = m->hash_alg,
        .signal = m->signal,
        .timed_out = m->timed_out,
        .stdout_truncated = m->stdout_truncated,
        .stderr_truncated = m->stderr_truncated,
        .owner_ = m,
    };
    return r;
}

int dsec_traj_record_read(dsec_record_reader *r, dsec_traj_record **out, dsec_err *err)
{
    *out = NULL;
    Dsec__V1__TrajectoryRecord *m;
    int rc = dsec_trajectory_read(r, &m, err);
    if (rc <= 0)
        return rc;
    *out = traj_from(m, err);
    return *out != NULL ? 1 : -1;
}

int dsec_traj_record_decode(const void *data, size_t len, dsec_traj_record **out, dsec_err *err)
{
    *out = NULL;
    dsec_record_reader *rd = dsec_record_reader_new_mem(data, len, 0);
    if (rd == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "reading a trajectory record");
    int rc = dsec_traj_record_read(rd, out, err);
    dsec_record_reader_free(rd);
    if (rc == 0)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "an empty trajectory record");
    return rc < 0 ? -1 : 0;
}

void dsec_traj_record_free(dsec_traj_record *r)
{
    if (r == NULL)
        return;
    dsec_record_msg_free(r->owner_);
    dsec_free(r);
}

int dsec_trace_header_write(dsec_record_writer *w, const dsec_trace_header *h, dsec_err *err)
{
    Dsec__V1__TraceHeader m = DSEC__V1__TRACE_HEADER__INIT;
    m.format_version = h->format_version;
    m.created_ns = h->created_ns;
    m.source = pb_str(h->source);
    /* one allocation for the entries and the array of pointers to them */
    size_t n = h->n_metadata;
    Dsec__V1__TraceHeader__MetadataEntry *ent = dsec_malloc(n * (sizeof *ent + sizeof(void *)) + 1);
    if (ent == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "writing a trace header");
    Dsec__V1__TraceHeader__MetadataEntry **entp = (void *)(ent + n);
    for (size_t i = 0; i < n; i++) {
        dsec__v1__trace_header__metadata_entry__init(&ent[i]);
        ent[i].key = pb_str(h->metadata[i].key);
        ent[i].value = pb_str(h->metadata[i].value);
        entp[i] = &ent[i];
    }
    m.n_metadata = n;
    m.metadata = entp;
    int rc = dsec_trace_write_header(w, &m, err);
    dsec_free(ent);
    return rc;
}

int dsec_trace_header_read(dsec_record_reader *r, dsec_trace_header **out, dsec_err *err)
{
    *out = NULL;
    Dsec__V1__TraceHeader *m;
    if (dsec_trace_read_header(r, &m, err) < 0)
        return -1;
    /* the struct and its metadata array in one allocation */
    dsec_trace_header *h = dsec_calloc(1, sizeof *h + m->n_metadata * sizeof(dsec_record_kv));
    if (h == NULL) {
        dsec_record_msg_free(&m->base);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "reading a trace header");
    }
    h->format_version = m->format_version;
    h->created_ns = m->created_ns;
    h->source = m->source;
    h->n_metadata = m->n_metadata;
    h->metadata = (dsec_record_kv *)(h + 1);
    for (size_t i = 0; i < m->n_metadata; i++)
        h->metadata[i] =
            (dsec_record_kv){.key = m->metadata[i]->key, .value = m->metadata[i]->value};
    h->owner_ = m;
    *out = h;
    return 0;
}

void dsec_trace_header_free(dsec_trace_header *h)
{
    if (h == NULL)
        return;
    dsec_record_msg_free(h->owner_);
    dsec_free(h);
}

int dsec_trace_record_write(dsec_record_writer *w, const dsec_trace_record *r, dsec_err *err)
{
    Dsec__V1__TraceRecord m = DSEC__V1__TRACE_RECORD__INIT;
    Dsec__V1__TraceCreate c = DSEC__V1__TRACE_CREATE__INIT;
    m.ts_ns = r->ts_ns;
    m.subject = pb_str(r->subject);
    m.msg_type = pb_str(r->msg_type);
    m.req_id = pb_str(r->req_id);
    m.payload = pb_bytes(r->payload);
    m.expects_reply = r->expects_reply;
    if (r->create != NULL) {
        const dsec_trace_create *p = r->create;
        c.type = pb_str(p->type);
        c.cpu_milli = p->cpu_milli;
        c.memory_mb = p->memory_mb;
        c.lifetime_s = p->lifetime_s;
        c.cpu_use_fraction = p->cpu_use_fraction;
        c.n_layers = p->n_layers;
        c.layers = p->layers;
        c.job_id = pb_str(p->job_id);
        c.class_ = pb_str(p->class_);
        m.create = &c;
    }
    return dsec_record_write(w, &m.base, err);
}

int dsec_trace_record_read(dsec_record_reader *r, dsec_trace_record **out, dsec_err *err)
{
    *out = NULL;
    Dsec__V1__TraceRecord *m;
    int rc = dsec_trace_read(r, &m, err);
    if (rc <= 0)
        return rc;
    dsec_trace_record *t = dsec_calloc(1, sizeof *t);
    if (t == NULL) {
        dsec_record_msg_free(&m->base);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "reading a trace record");
    }
    *t = (dsec_trace_record){.ts_ns = m->ts_ns,
                             .subject = m->subject,
                             .msg_type = m->msg_type,
                             .req_id = m->req_id,
                             .payload = plain_bytes(m->payload),
                             .expects_reply = m->expects_reply,
                             .owner_ = m};
    if (m->create != NULL) {
        const Dsec__V1__TraceCreate *c = m->create;
        t->create_ = (dsec_trace_create){
            .type = c->type,
            .cpu_milli = c->cpu_milli,
            .memory_mb = c->memory_mb,
            .lifetime_s = c->lifetime_s,
            .cpu_use_fraction = c->cpu_use_fraction,
            .n_layers = c->n_layers,
            .layers = c->layers,
            .job_id = c->job_id,
            .class_ = c->class_,
        };
        t->create = &t->create_;
    }
    *out = t;
    return 1;
}

void dsec_trace_record_free(dsec_trace_record *r)
{
    if (r == NULL)
        return;
    dsec_record_msg_free(r->owner_);
    dsec_free(r);
}
