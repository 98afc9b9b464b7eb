/* trace.c - loading a replay trace into memory, classifying its records, and summarising it
 * (dsec-sim stats). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "actors/wire.h"
#include "codecs/subjects.h"
#include "codecs/msg.h"
#include "codecs/record.h"
#include "dsec/alloc.h"
#include "sim/sim.h"

/* ---- a small string -> long map ------------------------------------------------ */
struct smap {
    char **k;
    long *v;
    size_t cap, n;
};

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static void smap_put(struct smap *m, const char *k, long v)
{
    if ((m->n + 1) * 2 > m->cap) {
        struct smap o = *m;
        m->cap = o.cap ? o.cap * 2 : 64;
        m->k = dsec_calloc(m->cap, sizeof *m->k);
        m->v = dsec_calloc(m->cap, sizeof *m->v);
        m->n = 0;
        for (size_t i = 0; i < o.cap; i++)
            if (o.k[i])
                smap_put(m, o.k[i], o.v[i]);
        dsec_free(o.k);
        dsec_free(o.v);
    }
    size_t i = hash_str(k) & (m->cap - 1);
    while (m->k[i] && strcmp(m->k[i], k) != 0)
        i = (i + 1) & (m->cap - 1);
    if (!m->k[i]) {
        m->k[i] = (char *)k;
        m->n++;
    }
    m->v[i] = v;
}

static long smap_get(const struct smap *m, const char *k)
{
    if (!m->cap || !k)
        return -1;
    size_t i = hash_str(k) & (m->cap - 1);
    while (m->k[i]) {
        if (strcmp(m->k[i], k) == 0)
            return m->v[i];
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

static void smap_free(struct smap *m)
{
    dsec_free(m->k);
    dsec_free(m->v);
    memset(m, 0, sizeof *m);
}

/* ---- loading ------------------------------------------------------------------- */

static char *dup_or_null(const char *s)
{
    return s && *s ? dsec_strdup(s) : NULL;
}

/* The sandbox id in dsec.v1.<tenant>.sbx.<node>.<id>.<verb>, or NULL. */
static const char *sbx_id_of(const char *subject, char *buf, size_t n)
{
    const char *tok[8];
    int nt = dsec_wire_tokens(subject, buf, n, tok, 8);
    if (nt != 7 || strcmp(tok[0], "dsec") != 0 || strcmp(tok[3], "sbx") != 0 ||
        strcmp(tok[2], "ctl") == 0)
        return NULL;
    return tok[5];
}

static int classify(sim_op *o)
{
    const char *s = o->subject ? o->subject : "";
    const char *t = o->msg_type ? o->msg_type : "";
    char buf[512];
    if (strncmp(s, "_INBOX.", 7) == 0 || strcmp(t, "created") == 0)
        return SIM_OP_SEEN;
    if (strcmp(t, "create") == 0)
        return SIM_OP_CREATE;
    if (sbx_id_of(s, buf, sizeof buf))
        return SIM_OP_SBX;
    if (strncmp(s, DSEC_SUBJ_EVT_PREFIX, strlen(DSEC_SUBJ_EVT_PREFIX)) == 0)
        return SIM_OP_SEEN;
    size_t n = strlen(s);
    if (strcmp(t, "job_register") == 0)
        return SIM_OP_JOB; /* the first per job; later ones are the job's own, see link_ops */
    /* a replayed job takes and gives back its own holdings and reports its
     * own releases; the arbiter's reclaims, forced releases and events are
     * the cell's output: none of these is re-sent as recorded */
    if (strncmp(s, DSEC_SUBJ_CTL "hold.", strlen(DSEC_SUBJ_CTL "hold.")) == 0 ||
        strcmp(t, "job_hold") == 0)
        return SIM_OP_SEEN;
    if (strncmp(s, DSEC_SUBJ_CTL "job.", strlen(DSEC_SUBJ_CTL "job.")) == 0 &&
        ((n > 8 && strcmp(s + n - 8, ".reclaim") == 0) ||
         (n > 7 && strcmp(s + n - 7, ".forced") == 0) ||
         (n > 9 && strcmp(s + n - 9, ".released") == 0)))
        return SIM_OP_SEEN;
    return SIM_OP_SEND;
}

static int add_record(sim_trace *t, const dsec_trace_record *rec, dsec_decoder *dec, dsec_err *err)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 1024;
        t->ops = dsec_realloc(t->ops, t->cap * sizeof *t->ops);
    }
    if (t->n == 0)
        t->t0_ns = rec->ts_ns;
    sim_op *o = &t->ops[t->n];
    memset(o, 0, sizeof *o);
    o->t_ns = rec->ts_ns >= t->t0_ns ? rec->ts_ns - t->t0_ns : 0;
    if (t->n > 0 && o->t_ns < t->ops[t->n - 1].t_ns)
        o->t_ns = t->ops[t->n - 1].t_ns; /* clocks never run backwards in a replay */
    o->subject = dsec_strdup(rec->subject ? rec->subject : "");
    o->msg_type = dsec_strdup(rec->msg_type ? rec->msg_type : "");
    o->req_id = dup_or_null(rec->req_id);
    o->request = rec->expects_reply;
    o->create_ix = -1;
    if (rec->payload.len) {
        o->payload = dsec_malloc(rec->payload.len);
        memcpy(o->payload, rec->payload.data, rec->payload.len);
        o->len = rec->payload.len;
    }
    o->kind = classify(o);
    if (o->kind == SIM_OP_CREATE) {
        o->request = true;
        const dsec_trace_create *c = rec->create;
        if (c) {
            o->sbx_type = dup_or_null(c->type);
            o->job_id = dup_or_null(c->job_id);
            o->cls = dup_or_null(c->class_);
            o->cpu_milli = c->cpu_milli;
            o->memory_mb = c->memory_mb;
            o->lifetime_s = c->lifetime_s;
            o->cpu_use = c->cpu_use_fraction;
            if (c->n_layers) {
                o->layers = dsec_calloc(c->n_layers, sizeof *o->layers);
                for (size_t i = 0; i < c->n_layers; i++)
                    o->layers[i] = dsec_strdup(c->layers[i]);
                o->nlayers = c->n_layers;
            }
        }
        dsec_msg_create m;
        dsec_err derr;
        if (o->len == 0)
            return dsec_err_set(err, DSEC_E_DECODE, 0, "create without a payload");
        if (dsec_decode(dec, DSEC_MSG_CREATE, o->payload, o->len, &m, &derr) < 0)
            return dsec_err_set(err, DSEC_E_DECODE, 0, "create payload: %s", derr.msg);
        if (!o->req_id)
            o->req_id = dsec_strdup(m.req_id);
        if (!o->sbx_type && m.type)
            o->sbx_type = dsec_strdup(m.type);
        if (!o->cls && m.cls)
            o->cls = dsec_strdup(m.cls);
        if (!c) {
            o->cpu_milli = m.cpu_milli;
            o->memory_mb = m.memory_mb;
        }
    } else if (strcmp(o->msg_type, "created") == 0 && o->len) {
        dsec_msg_created m;
        dsec_err derr;
        if (dsec_decode(dec, DSEC_MSG_CREATED, o->payload, o->len, &m, &derr) == 0) {
            o->created_id = dsec_strdup(m.id);
            if (!o->req_id && m.req_id && *m.req_id)
                o->req_id = dsec_strdup(m.req_id);
        }
    } else if (o->kind == SIM_OP_JOB) {
        dsec_msg_job_register m;
        dsec_err derr;
        if (o->len == 0)
            return dsec_err_set(err, DSEC_E_DECODE, 0, "job_register without a payload");
        if (dsec_decode(dec, DSEC_MSG_JOB_REGISTER, o->payload, o->len, &m, &derr) < 0)
            return dsec_err_set(err, DSEC_E_DECODE, 0, "job_register payload: %s", derr.msg);
        o->job_id = dsec_strdup(m.job);
        o->cell = dsec_strdup(m.cell);
        o->cls = dsec_strdup(m.cls && *m.cls ? m.cls : "job");
        o->priority = m.priority;
        o->checkpoint_ms = m.checkpoint_ms;
        o->grace_ms = m.grace_ms;
        const dsec_msg_job_hold *h = m.holds.items;
        o->units = dsec_calloc(m.holds.n + 1, sizeof *o->units);
        for (uint32_t i = 0; i < m.holds.n; i++) {
            o->units[i].node = dsec_strdup(h[i].node);
            o->units[i].cpu_milli = h[i].cpu_milli;
            o->units[i].memory_mb = h[i].memory_mb;
        }
        o->nunits = m.holds.n;
    } else if (o->kind == SIM_OP_SBX && strcmp(o->msg_type, "op") == 0 && o->len) {
        dsec_msg_op m;
        dsec_err derr;
        if (dsec_decode(dec, DSEC_MSG_OP, o->payload, o->len, &m, &derr) == 0 &&
            strcmp(m.op, "destroy") == 0)
            o->destroys = true;
    }
    t->n++;
    return 0;
}

/* Tie sandbox operations to the creates whose sandboxes they address. Two
 * passes: a recorder taps replies and sandbox subjects on separate
 * subscriptions, so an operation can be recorded just before the "created"
 * reply that names its sandbox (ids are unique, so order does not matter). */
static void link_ops(sim_trace *t)
{
    struct smap by_req = {0}, by_id = {0}, jobs = {0};
    /* a job registers every second: the first registration starts it in a
     * replay, the later ones are what the running job sends itself */
    for (size_t i = 0; i < t->n; i++)
        if (t->ops[i].kind == SIM_OP_JOB) {
            if (smap_get(&jobs, t->ops[i].job_id) >= 0)
                t->ops[i].kind = SIM_OP_SEEN;
            else
                smap_put(&jobs, t->ops[i].job_id, (long)i);
        }
    smap_free(&jobs);
    /* a create sent again under its req_id (after an "overloaded" answer, or a retry) is the
     * client's resend of one create: the first send is the create, the others are observed */
    for (size_t i = 0; i < t->n; i++)
        if (t->ops[i].kind == SIM_OP_CREATE && t->ops[i].req_id) {
            if (smap_get(&by_req, t->ops[i].req_id) >= 0)
                t->ops[i].kind = SIM_OP_SEEN;
            else
                smap_put(&by_req, t->ops[i].req_id, (long)i);
        }
    for (size_t i = 0; i < t->n; i++) {
        const sim_op *o = &t->ops[i];
        long c;
        if (o->created_id && (c = smap_get(&by_req, o->req_id)) >= 0)
            smap_put(&by_id, o->created_id, c);
    }
    for (size_t i = 0; i < t->n; i++) {
        sim_op *o = &t->ops[i];
        char buf[512];
        if (o->kind == SIM_OP_SBX)
            o->create_ix = smap_get(&by_id, sbx_id_of(o->subject, buf, sizeof buf));
    }
    smap_free(&by_req);
    smap_free(&by_id);
}

static int load(sim_trace *t, dsec_record_reader *rd, const char *name, dsec_err *err)
{
    memset(t, 0, sizeof *t);
    dsec_decoder *dec = dsec_decoder_new(NULL);
    dsec_trace_header *h = NULL;
    dsec_err e;
    if (dsec_trace_header_read(rd, &h, &e) < 0) {
        dsec_decoder_free(dec);
        return dsec_err_set(err, e.code ? e.code : DSEC_E_DECODE, 0, "trace %s: %s", name, e.msg);
    }
    t->created_ns = h->created_ns;
    t->source = dsec_strdup(h->source ? h->source : "");
    t->nmeta = h->n_metadata;
    t->meta_k = dsec_calloc(t->nmeta + 1, sizeof *t->meta_k);
    t->meta_v = dsec_calloc(t->nmeta + 1, sizeof *t->meta_v);
    for (size_t i = 0; i < t->nmeta; i++) {
        t->meta_k[i] = dsec_strdup(h->metadata[i].key);
        t->meta_v[i] = dsec_strdup(h->metadata[i].value);
    }
    dsec_trace_header_free(h);
    for (;;) {
        uint64_t at = dsec_record_reader_offset(rd);
        dsec_trace_record *rec = NULL;
        int rc = dsec_trace_record_read(rd, &rec, &e);
        if (rc == 0)
            break;
        if (rc < 0 || add_record(t, rec, dec, &e) < 0) {
            dsec_trace_record_free(rec);
            dsec_decoder_free(dec);
            int code = e.code ? e.code : DSEC_E_DECODE;
            size_t nrec = t->n + 1;
            sim_trace_free(t);
            return dsec_err_set(err, code, 0,
                                "trace %s: record %zu (after the header) at byte %" PRIu64 ": %s",
                                name, nrec, at, e.msg);
        }
        dsec_trace_record_free(rec);
    }
    dsec_decoder_free(dec);
    link_ops(t);
    return 0;
}

int sim_trace_load(sim_trace *t, const char *path, dsec_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return dsec_err_set(err, DSEC_E_IO, errno, "trace %s: %s", path, strerror(errno));
    dsec_record_reader *rd = dsec_record_reader_new_file(f, 0);
    int rc = load(t, rd, path, err);
    dsec_record_reader_free(rd);
    fclose(f);
    return rc;
}

int sim_trace_load_mem(sim_trace *t, const void *buf, size_t len, const char *name, dsec_err *err)
{
    dsec_record_reader *rd = dsec_record_reader_new_mem(buf, len, 0);
    int rc = load(t, rd, name, err);
    dsec_record_reader_free(rd);
    return rc;
}

void sim_trace_free(sim_trace *t)
{
    for (size_t i = 0; i < t->n; i++) {
        sim_op *o = &t->ops[i];
        dsec_free(o->subject);
        dsec_free(o->msg_type);
        dsec_free(o->req_id);
        dsec_free(o->payload);
        dsec_free(o->sbx_type);
        dsec_free(o->job_id);
        dsec_free(o->cls);
        dsec_free(o->created_id);
        dsec_free(o->cell);
        for (size_t j = 0; j < o->nunits; j++)
            dsec_free(o->units[j].node);
        dsec_free(o->units);
        for (size_t j = 0; j < o->nlayers; j++)
            dsec_free(o->layers[j]);
        dsec_free(o->layers);
    }
    for (size_t i = 0; i < t->nmeta; i++) {
        dsec_free(t->meta_k[i]);
        dsec_free(t->meta_v[i]);
    }
    dsec_free(t->meta_k);
    dsec_free(t->meta_v);
    dsec_free(t->source);
    dsec_free(t->ops);
    memset(t, 0, sizeof *t);
}

/* ---- statistics ------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v. */
static double pct(const double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    size_t i = (size_t)ceil(p * (double)n);
    return v[i ? i - 1 : 0];
}

static void count_name(char names[][32], size_t *counts, size_t *n, size_t max, const char *name)
{
    for (size_t i = 0; i < *n; i++)
        if (strcmp(names[i], name) == 0) {
            counts[i]++;
            return;
        }
    if (*n < max) {
        snprintf(names[*n], 32, "%s", name);
        counts[(*n)++] = 1;
    }
}

int sim_stats_compute(const sim_trace *t, sim_stats *s, dsec_err *err)
{
    (void)err;
    memset(s, 0, sizeof *s);
    s->records = t->n;
    double *life = dsec_calloc(t->n + 1, sizeof *life);
    size_t nlife = 0, nuse = 0, low = 0;
    size_t nsec = t->n ? (size_t)(t->ops[t->n - 1].t_ns / 1000000000ull) + 1 : 1;
    uint32_t *per_sec = dsec_calloc(nsec, sizeof *per_sec);
    struct smap jobs = {0}, edges = {0}, parents = {0};
    size_t *job_n = dsec_calloc(t->n + 1, sizeof *job_n);
    size_t njobs = 0;
    char **edge_keys = NULL;
    size_t nedges = 0, cap_edges = 0;
    for (size_t i = 0; i < t->n; i++) {
        const sim_op *o = &t->ops[i];
        count_name(s->msg_types, s->msg_type_n, &s->nmsg_types, 16,
                   o->msg_type[0] ? o->msg_type : "(none)");
        switch (o->kind) {
        case SIM_OP_SBX:
            s->sbx_ops++;
            break;
        case SIM_OP_SEND:
            s->sends++;
            break;
        case SIM_OP_SEEN:
            s->seen++;
            break;
        case SIM_OP_JOB:
            s->sends++;
            s->jobs++;
            s->job_holders += o->nunits;
            for (size_t u = 0; u < o->nunits; u++)
                s->job_cpu_milli += o->units[u].cpu_milli;
            break;
        default:
            break;
        }
        if (o->kind == SIM_OP_SBX && o->destroys && o->create_ix >= 0 &&
            t->ops[o->create_ix].lifetime_s == 0)
            life[nlife++] = (double)(o->t_ns - t->ops[o->create_ix].t_ns) /
                            1e9; /* recorded: create to destroy */
        if (o->kind != SIM_OP_CREATE)
            continue;
        s->creates++;
        per_sec[o->t_ns / 1000000000ull]++;
        count_name(s->types, s->type_n, &s->ntypes, 8, o->sbx_type ? o->sbx_type : "(any)");
        if (o->lifetime_s)
            life[nlife++] = (double)o->lifetime_s;
        if (o->cpu_use > 0) {
            nuse++;
            low += o->cpu_use <= 0.05;
        }
        if (o->cls && (strcmp(o->cls, "job") == 0 || strcmp(o->cls, "batch") == 0)) {
            s->job_holders++;
            s->job_cpu_milli += o->cpu_milli;
        } else if (o->job_id) {
            long j = smap_get(&jobs, o->job_id);
            if (j < 0) {
                j = (long)njobs++;
                smap_put(&jobs, o->job_id, j);
            }
            if (++job_n[j] > s->max_job_creates) {
                s->max_job_creates = job_n[j];
                snprintf(s->max_job, sizeof s->max_job, "%s", o->job_id);
            }
        }
        /* layer edges parent -> child; fan-out = distinct children per parent */
        for (size_t l = 0; l + 1 < o->nlayers; l++) {
            size_t kl = strlen(o->layers[l]) + strlen(o->layers[l + 1]) + 2;
            char *key = dsec_malloc(kl);
            snprintf(key, kl, "%s>%s", o->layers[l], o->layers[l + 1]);
            if (smap_get(&edges, key) >= 0) {
                dsec_free(key);
                continue;
            }
            if (nedges == cap_edges) {
                cap_edges = cap_edges ? cap_edges * 2 : 256;
                edge_keys = dsec_realloc(edge_keys, cap_edges * sizeof *edge_keys);
            }
            edge_keys[nedges++] = key;
            smap_put(&edges, key, 1);
            long c = smap_get(&parents, o->layers[l]);
            smap_put(&parents, o->layers[l], c < 0 ? 1 : c + 1);
        }
    }
    s->duration_s = t->n ? (double)t->ops[t->n - 1].t_ns / 1e9 : 0;
    s->create_rate_avg =
        s->duration_s > 0 ? (double)s->creates / s->duration_s : (double)s->creates;
    for (size_t i = 0; i < nsec; i++)
        if (per_sec[i] > s->create_rate_peak)
            s->create_rate_peak = per_sec[i];
    qsort(life, nlife, sizeof *life, cmp_double);
    s->life_p50_s = pct(life, nlife, 0.50);
    s->life_p90_s = pct(life, nlife, 0.90);
    s->life_p99_s = pct(life, nlife, 0.99);
    s->low_use_share = nuse ? (double)low / (double)nuse : 0;
    double *fan = dsec_calloc(parents.n + 1, sizeof *fan);
    size_t nf = 0;
    for (size_t i = 0; i < parents.cap; i++)
        if (parents.k[i])
            fan[nf++] = (double)parents.v[i];
    qsort(fan, nf, sizeof *fan, cmp_double);
    s->fanout_layers = nf;
    s->fanout_p50 = pct(fan, nf, 0.50);
    s->fanout_p90 = pct(fan, nf, 0.90);
    for (size_t i = 0; i < nedges; i++)
        dsec_free(edge_keys[i]);
    dsec_free(edge_keys);
    dsec_free(fan);
    dsec_free(life);
    dsec_free(per_sec);
    dsec_free(job_n);
    smap_free(&jobs);
    smap_free(&edges);
    smap_free(&parents);
    return 0;
}

void sim_stats_print(const sim_stats *s, FILE *f, bool json)
{
    if (json) {
        fprintf(
            f,
            "{\"records\":%zu,\"creates\":%zu,\"sandbox_ops\":%zu,\"sends\":%zu,\"observed\":%zu,"
            "\"duration_s\":%.3f,\"create_rate_avg\":%.2f,\"create_rate_peak\":%.0f,"
            "\"lifetime_p50_s\":%.0f,\"lifetime_p90_s\":%.0f,\"lifetime_p99_s\":%.0f,"
            "\"low_cpu_use_share\":%.4f,\"layer_fanout_p50\":%.1f,\"layer_fanout_p90\":%.1f,"
            "\"layers_with_children\":%zu,\"max_job_creates\":%zu,\"max_job\":\"%s\","
            "\"jobs\":%zu,\"job_holders\":%zu,\"job_cpu_milli\":%" PRIu64 ",\"types\":{",
            s->records, s->creates, s->sbx_ops, s->sends, s->seen, s->duration_s,
            s->create_rate_avg, s->create_rate_peak, s->life_p50_s, s->life_p90_s, s->life_p99_s,
            s->low_use_share, s->fanout_p50, s->fanout_p90, s->fanout_layers, s->max_job_creates,
            s->max_job, s->jobs, s->job_holders, s->job_cpu_milli);
        for (size_t i = 0; i < s->ntypes; i++)
            fprintf(f, "%s\"%s\":%zu", i ? "," : "", s->types[i], s->type_n[i]);
        fprintf(f, "},\"msg_types\":{");
        for (size_t i = 0; i < s->nmsg_types; i++)
            fprintf(f, "%s\"%s\":%zu", i ? "," : "", s->msg_types[i], s->msg_type_n[i]);
        fprintf(f, "}}\n");
        return;
    }
    fprintf(
        f,
        "records              %zu (creates %zu, sandbox ops %zu, other sends %zu, observed %zu)\n",
        s->records, s->creates, s->sbx_ops, s->sends, s->seen);
    fprintf(f, "duration             %.1f s\n", s->duration_s);
    fprintf(f, "creates/s            %.1f average, %.0f in the busiest second\n",
            s->create_rate_avg, s->create_rate_peak);
    fprintf(f, "lifetime             p50 %.1f min, p90 %.1f min, p99 %.2f h\n", s->life_p50_s / 60,
            s->life_p90_s / 60, s->life_p99_s / 3600);
    fprintf(f, "CPU use <= 5%%        %.1f%% of sandboxes\n", s->low_use_share * 100);
    fprintf(f, "layer fan-out        p50 %.0f, p90 %.0f (over %zu layers with children)\n",
            s->fanout_p50, s->fanout_p90, s->fanout_layers);
    fprintf(f, "largest job burst    %zu creates (%s)\n", s->max_job_creates,
            s->max_job[0] ? s->max_job : "-");
    fprintf(f, "training jobs        %zu, holding %zu units (%.1f cores)\n", s->jobs,
            s->job_holders, (double)s->job_cpu_milli / 1000);
    fprintf(f, "types               ");
    for (size_t i = 0; i < s->ntypes; i++)
        fprintf(f, " %s %.1f%%", s->types[i],
                s->creates ? 100.0 * (double)s->type_n[i] / (double)s->creates : 0);
    fprintf(f, "\nmessage types       ");
    for (size_t i = 0; i < s->nmsg_types; i++)
        fprintf(f, " %s %zu", s->msg_types[i], s->msg_type_n[i]);
    fprintf(f, "\n");
}
