/* gen.c - synthetic traces shaped like DSec's production (dsec-sim gen --profile dsec). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/subjects.h"
#include "codecs/msg.h"
#include "codecs/record.h"
#include "dsec/alloc.h"
#include "dsec/names.h"
#include "sim/sim.h"

void sim_profile_dsec(sim_profile *p)
{
    memset(p, 0, sizeof *p);
    p->seed = 1;
    p->duration_s = 600;
    p->rate = 100;
    p->burst_every_s = 60;
    p->burst_min = 100;
    p->burst_max = 32000;
    p->burst_spread_s = 4;
    p->life_median_s = 1020; /* 17 min */
    p->life_sigma = 1.1;     /* p99 = median * e^(2.326 sigma) = 3.7 h */
    p->life_max_s = 86400;
    p->low_use_share = 0.90;
    p->low_use_max = 0.05;
    p->fanout_median = 3;
    p->fanout_p90 = 28;
    p->layer_depth = 3;
    p->bases = 64;
    snprintf(p->mix, sizeof p->mix, "function=35,container=40,microvm=15,vm=10");
    p->jobs = 4;
    p->job_cpu_milli = 64000;
    p->job_memory_mb = 262144;
    p->job_units = 8;
    p->job_checkpoint_s = 2;
    p->job_grace_s = 0;
    snprintf(p->cell, sizeof p->cell, "sim");
    snprintf(p->tenant, sizeof p->tenant, "sim");
    p->cpu_milli = 100;
    p->memory_mb = 256;
}

static const struct param {
    const char *name, *help;
    int kind; /* 0 double, 1 int, 2 u64, 3 string */
    size_t off, size;
} params[] = {
#define D(n, f, h)                                                                                 \
    {                                                                                              \
        n, h, 0, offsetof(sim_profile, f), 0                                                       \
    }
#define I(n, f, h)                                                                                 \
    {                                                                                              \
        n, h, 1, offsetof(sim_profile, f), 0                                                       \
    }
#define U(n, f, h)                                                                                 \
    {                                                                                              \
        n, h, 2, offsetof(sim_profile, f), 0                                                       \
    }
#define S(n, f, h)                                                                                 \
    {                                                                                              \
        n, h, 3, offsetof(sim_profile, f), sizeof(((sim_profile *)0)->f)                           \
    }
    U("seed", seed, "random seed (same seed, same trace)"),
    D("duration", duration_s, "trace length, seconds"),
    D("rate", rate, "background rollout creates per second (Poisson)"),
    D("burst-every", burst_every_s, "mean seconds between job bursts (0: none)"),
    D("burst-min", burst_min, "smallest burst, sandboxes"),
    D("burst-max", burst_max,
      "largest burst, sandboxes; one burst of exactly this size runs mid-trace"),
    D("burst-spread", burst_spread_s, "seconds over which a burst's creates arrive"),
    D("life-median", life_median_s, "median sandbox lifetime, seconds (lognormal)"),
    D("life-sigma", life_sigma, "lognormal sigma of lifetimes"),
    D("life-max", life_max_s, "longest lifetime, seconds"),
    D("low-use-share", low_use_share, "share of sandboxes using <= low-use-max of their CPU"),
    D("low-use-max", low_use_max, "the low-use threshold (fraction of asked CPU)"),
    D("fanout-median", fanout_median, "median children per layer (lognormal)"),
    D("fanout-p90", fanout_p90, "p90 children per layer"),
    I("layer-depth", layer_depth, "layers per environment, base first"),
    I("bases", bases, "base layers"),
    S("mix", mix, "sandbox type weights, type=weight,..."),
    I("jobs", jobs, "training jobs holding capacity for the whole trace (job_register)"),
    U("job-cpu", job_cpu_milli, "CPU of one job unit, milli-cores"),
    U("job-memory", job_memory_mb, "memory of one job unit, MB"),
    I("job-units", job_units, "units of capacity per training job"),
    D("job-checkpoint", job_checkpoint_s,
      "seconds a job's checkpoint takes before it releases units"),
    D("job-grace", job_grace_s, "seconds a reclaim must give a job (0: the arbiter's default)"),
    S("cell", cell, "the cell the jobs register in"),
    S("tenant", tenant, "tenant of the create subjects"),
    U("cpu", cpu_milli, "median CPU a rollout asks for, milli-cores (x0.25..x4)"),
    U("memory", memory_mb, "median memory a rollout asks for, MB (x0.25..x4)"),
};

int sim_profile_set(sim_profile *p, const char *key, const char *val, dsec_err *err)
{
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
        const struct param *d = &params[i];
        if (strcmp(d->name, key) != 0)
            continue;
        char *end;
        errno = 0;
        char *at = (char *)p + d->off;
        if (d->kind == 3) {
            if (strlen(val) >= d->size)
                return dsec_err_set(err, DSEC_E_INVALID, 0, "--%s: longer than %zu bytes", key,
                                    d->size - 1);
            memcpy(at, val, strlen(val) + 1);
            return 0;
        }
        double v = strtod(val, &end);
        if (errno || end == val || *end || !isfinite(v) || v < 0)
            return dsec_err_set(err, DSEC_E_INVALID, 0, "--%s: '%s' is not a non-negative number",
                                key, val);
        if (d->kind == 0)
            *(double *)(void *)at = v;
        else if (d->kind == 1)
            *(int *)(void *)at = (int)v;
        else
            *(uint64_t *)(void *)at = (uint64_t)v;
        return 0;
    }
    return dsec_err_set(err, DSEC_E_INVALID, 0,
                        "unknown profile parameter --%s (dsec-sim gen --help lists them)", key);
}

void sim_profile_help(FILE *f)
{
    sim_profile d;
    sim_profile_dsec(&d);
    for (size_t i = 0; i < sizeof params / sizeof params[0]; i++) {
        const struct param *p = &params[i];
        const char *at = (const char *)&d + p->off;
        char def[300];
        if (p->kind == 0)
            snprintf(def, sizeof def, "%g", *(const double *)(const void *)at);
        else if (p->kind == 1)
            snprintf(def, sizeof def, "%d", *(const int *)(const void *)at);
        else if (p->kind == 2)
            snprintf(def, sizeof def, "%" PRIu64, *(const uint64_t *)(const void *)at);
        else
            snprintf(def, sizeof def, "%s", at);
        fprintf(f, "  --%-14s %s (default %s)\n", p->name, p->help, def);
    }
}

/* ---- randomness ------------------------------------------------------------------ */
static uint64_t rnd(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double unif(uint64_t *s) /* (0, 1) */
{
    return ((double)(rnd(s) >> 11) + 0.5) / 9007199254740992.0;
}
static double normal(uint64_t *s)
{
    return sqrt(-2 * log(unif(s))) * cos(2 * M_PI * unif(s));
}

/* ---- the layer tree ----------------------------------------------------------------- */
struct tree {
    int depth;
    uint32_t *path; /* nenv * depth layer numbers */
    size_t nenv, cap, nlayers;
};

static void grow(struct tree *t, const sim_profile *p, uint64_t *rng, uint32_t *path, int d,
                 double sigma)
{
    path[d] = (uint32_t)t->nlayers++;
    if (d == t->depth - 1) {
        if (t->nenv == t->cap) {
            t->cap = t->cap ? t->cap * 2 : 256;
            t->path = dsec_realloc(t->path, t->cap * (size_t)t->depth * sizeof *t->path);
        }
        memcpy(t->path + t->nenv++ * (size_t)t->depth, path, (size_t)t->depth * sizeof *path);
        return;
    }
    double k = round(p->fanout_median * exp(sigma * normal(rng)));
    if (k < 1)
        k = 1;
    if (k > 1000)
        k = 1000;
    for (int i = 0; i < (int)k; i++)
        grow(t, p, rng, path, d + 1, sigma);
}

/* ---- events ----------------------------------------------------------------------------- */
struct ev {
    double t;
    int kind; /* 0 rollout, 1 job unit */
    uint32_t job;
};

static int cmp_ev(const void *a, const void *b)
{
    const struct ev *x = a, *y = b;
    return x->t < y->t ? -1 : x->t > y->t;
}

struct gen {
    struct ev *ev;
    size_t n, cap;
};

static void push(struct gen *g, double t, int kind, uint32_t job)
{
    if (g->n == g->cap) {
        g->cap = g->cap ? g->cap * 2 : 4096;
        g->ev = dsec_realloc(g->ev, g->cap * sizeof *g->ev);
    }
    g->ev[g->n++] = (struct ev){t, kind, job};
}

static void add_burst(struct gen *g, const sim_profile *p, uint64_t *rng, double t, size_t size,
                      uint32_t job)
{
    for (size_t i = 0; i < size; i++) {
        double at = t + unif(rng) * p->burst_spread_s;
        push(g, at < p->duration_s ? at : p->duration_s, 0, job);
    }
}

/* A training job, as a job's first second on the bus looks in a recording:
 * one job_hold request per unit, then its job_register. The generator does
 * not know the cell's nodes, so units name SIM_NODE_ANY and the replayer
 * places them. */
static int write_job(const sim_profile *p, dsec_record_writer *wr, dsec_buf *b, uint64_t ts,
                     uint32_t job, uint64_t *n, dsec_err *err)
{
    char name[32], units[256][24], req[96];
    snprintf(name, sizeof name, "train-%u", job);
    size_t nu = (size_t)p->job_units;
    dsec_msg_job_hold *holds = dsec_calloc(nu, sizeof *holds);
    if (!holds)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "gen: out of memory");
    int rc = 0;
    for (size_t u = 0; rc == 0 && u < nu; u++) {
        snprintf(units[u], sizeof units[u], "u%zu", u);
        holds[u] = (dsec_msg_job_hold){.job = name,
                                       .node = SIM_NODE_ANY,
                                       .unit = units[u],
                                       .cpu_milli = p->job_cpu_milli,
                                       .memory_mb = p->job_memory_mb};
        snprintf(req, sizeof req, "%s.%s.h", name, units[u]);
        dsec_trace_record r = {0};
        r.ts_ns = ts;
        r.subject = DSEC_SUBJ_CTL "hold." SIM_NODE_ANY;
        r.msg_type = "job_hold";
        r.req_id = req;
        r.expects_reply = true;
        if ((rc = dsec_encode(b, DSEC_MSG_JOB_HOLD, &holds[u], err)) == 0) {
            r.payload.data = (uint8_t *)b->data;
            r.payload.len = b->len;
            if ((rc = dsec_trace_record_write(wr, &r, err)) == 0)
                (*n)++;
        }
    }
    dsec_msg_job_register m = {.job = name,
                               .cell = p->cell,
                               .cls = "job",
                               .checkpoint_ms = (uint64_t)(p->job_checkpoint_s * 1000),
                               .grace_ms = (uint64_t)(p->job_grace_s * 1000),
                               .holds = {holds, (uint32_t)nu},
                               .ts_ns = ts};
    char subject[160];
    snprintf(subject, sizeof subject, DSEC_SUBJ_JOB_REGISTER, p->cell);
    if (rc == 0 && (rc = dsec_encode(b, DSEC_MSG_JOB_REGISTER, &m, err)) == 0) {
        dsec_trace_record r = {0};
        r.ts_ns = ts;
        r.subject = subject;
        r.msg_type = "job_register";
        r.req_id = "";
        r.payload.data = (uint8_t *)b->data;
        r.payload.len = b->len;
        if ((rc = dsec_trace_record_write(wr, &r, err)) == 0)
            (*n)++;
    }
    dsec_free(holds);
    return rc;
}

/* The type mix: "type=weight,..." (at most 8 types). */
struct mix {
    char types[8][32];
    double w[8], wsum;
    int ntypes;
};

static int parse_mix(const sim_profile *p, struct mix *mx, dsec_err *err)
{
    mx->wsum = 0;
    mx->ntypes = 0;
    char mix[256];
    snprintf(mix, sizeof mix, "%s", p->mix);
    for (char *save = NULL, *tok = strtok_r(mix, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        char *end;
        if (!eq || mx->ntypes == 8 || eq - tok >= 32)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "--mix: '%s' is not type=weight (at most 8 types)", tok);
        *eq = '\0';
        double v = strtod(eq + 1, &end);
        if (*end || v < 0 || !isfinite(v))
            return dsec_err_set(err, DSEC_E_INVALID, 0, "--mix: weight of %s is not a number", tok);
        snprintf(mx->types[mx->ntypes], 32, "%s", tok);
        mx->w[mx->ntypes++] = v;
        mx->wsum += v;
    }
    if (mx->ntypes == 0 || mx->wsum <= 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "--mix: no type with a positive weight");
    return 0;
}

static int check_profile(const sim_profile *p, dsec_err *err)
{
    if (p->duration_s <= 0 || p->layer_depth < 1 || p->layer_depth > 16 || p->bases < 1 ||
        p->fanout_median < 1 || p->fanout_p90 < p->fanout_median || p->burst_max < p->burst_min ||
        p->low_use_share > 1 || p->low_use_max <= 0 || p->low_use_max >= 1)
        return dsec_err_set(
            err, DSEC_E_INVALID, 0,
            "profile: need duration > 0, 1 <= layer-depth <= 16, bases >= 1, 1 <= fanout-median"
            " <= fanout-p90, burst-min <= burst-max, low-use-share <= 1, 0 < low-use-max < 1");
    if (p->jobs > 0 &&
        (p->job_units < 1 || p->job_units > 256 || dsec_name_ok(p->cell, DSEC_NAME_LEN_MAX) < 0 ||
         p->job_cpu_milli > 1000000 || p->job_memory_mb > 16777216))
        return dsec_err_set(
            err, DSEC_E_INVALID, 0,
            "profile: jobs need 1 <= job-units <= 256, job-cpu <= 1000000, job-memory <= 16777216"
            " and a cell name of 1-64 characters of A-Z a-z 0-9 _ - (got '%s')",
            p->cell);
    return 0;
}

/* When each create and job arrives: a Poisson stream, bursts (the largest at half time), and
 * the jobs in the first second; in time order. */
static void schedule(const sim_profile *p, uint64_t *rng, struct gen *g)
{
    for (double t = 0; p->rate > 0;) {
        t += -log(unif(rng)) / p->rate;
        if (t >= p->duration_s)
            break;
        push(g, t, 0, 0); /* job assigned in order below */
    }
    uint32_t burst_job = 0;
    if (p->burst_max >= 1) {
        add_burst(g, p, rng, p->duration_s / 2, (size_t)p->burst_max, 1000000 + burst_job++);
        for (double t = 0; p->burst_every_s > 0;) {
            t += -log(unif(rng)) * p->burst_every_s;
            if (t >= p->duration_s)
                break;
            double lo = log(p->burst_min > 1 ? p->burst_min : 1), hi = log(p->burst_max);
            add_burst(g, p, rng, t, (size_t)exp(lo + (hi - lo) * unif(rng)), 1000000 + burst_job++);
        }
    }
    for (int j = 0; j < p->jobs; j++)
        push(g, unif(rng) * (p->duration_s < 1 ? p->duration_s : 1), 1, (uint32_t)j);
    qsort(g->ev, g->n, sizeof *g->ev, cmp_ev);
}

static int write_header(dsec_record_writer *wr, const sim_profile *p, const char *cmdline,
                        uint64_t created, dsec_err *err)
{
    char seed_s[32], dur_s[32], rate_s[32];
    snprintf(seed_s, sizeof seed_s, "%" PRIu64, p->seed);
    snprintf(dur_s, sizeof dur_s, "%g", p->duration_s);
    snprintf(rate_s, sizeof rate_s, "%g", p->rate);
    dsec_record_kv me[] = {
        {"profile", "dsec"},
        {"seed", seed_s},
        {"duration_s", dur_s},
        {"rate", rate_s},
        {"command", (char *)(cmdline ? cmdline : "")},
    };
    dsec_trace_header h = {.format_version = DSEC_TRACE_FORMAT_VERSION,
                           .created_ns = created,
                           .source = "synth:dsec-sim gen --profile dsec",
                           .n_metadata = 5,
                           .metadata = me};
    return dsec_trace_header_write(wr, &h, err);
}

/* A rollout's type, size, lifetime and CPU use. */
static void sample_shape(const sim_profile *p, const struct mix *mx, uint64_t *rng,
                         dsec_trace_create *c)
{
    double u = unif(rng) * mx->wsum;
    int ti = 0;
    while (ti < mx->ntypes - 1 && u >= mx->w[ti])
        u -= mx->w[ti++];
    c->type = (char *)mx->types[ti];
    c->cpu_milli = (uint64_t)(p->cpu_milli * exp2(4 * unif(rng) - 2));
    c->memory_mb = (uint64_t)(p->memory_mb * exp2(4 * unif(rng) - 2));
    if (c->cpu_milli < 1)
        c->cpu_milli = 1;
    if (c->memory_mb < 1)
        c->memory_mb = 1;
    double life = p->life_median_s * exp(p->life_sigma * normal(rng));
    if (life < 1)
        life = 1;
    if (life > p->life_max_s)
        life = p->life_max_s;
    c->lifetime_s = (uint64_t)life;
    c->cpu_use_fraction = unif(rng) < p->low_use_share
                              ? p->low_use_max * unif(rng)
                              : p->low_use_max + (1 - p->low_use_max) * unif(rng);
    c->class_ = "rollout";
}

/* A rollout's environment (its index returned) and that environment's layers, named in
 * names[] and listed in c. */
static size_t pick_env(const sim_profile *p, const struct tree *tr, uint64_t *rng, uint64_t *nroll,
                       char names[16][40], char **layers, dsec_trace_create *c)
{
    /* every environment once, then a skewed choice */
    size_t ei =
        *nroll < tr->nenv ? (size_t)(*nroll)++ : (size_t)((double)tr->nenv * unif(rng) * unif(rng));
    const uint32_t *pp = tr->path + ei * (size_t)tr->depth;
    for (int d = 0; d < tr->depth; d++) {
        uint64_t x = pp[d] * 0x9e3779b97f4a7c15ull ^ p->seed;
        snprintf(names[d], sizeof names[d], "sha256:%016" PRIx64, rnd(&x));
        layers[d] = names[d];
    }
    c->n_layers = (size_t)tr->depth;
    c->layers = layers;
    return ei;
}

int sim_gen(const sim_profile *p, FILE *f, const char *cmdline, uint64_t *nrecords, dsec_err *err)
{
    struct mix mx;
    if (parse_mix(p, &mx, err) < 0 || check_profile(p, err) < 0)
        return -1;
    uint64_t rng = p->seed * 0x2545f4914f6cdd1dull + 1;

    struct tree tr = {.depth = p->layer_depth};
    double fsigma = log(p->fanout_p90 / p->fanout_median) / 1.2815515655446004;
    uint32_t path[16];
    for (int b = 0; b < p->bases; b++)
        grow(&tr, p, &rng, path, 0, fsigma);

    struct gen g = {0};
    schedule(p, &rng, &g);

    dsec_record_writer *wr = dsec_record_writer_new_file(f, 0);
    uint64_t created = sim_wall_ns();
    int rc = write_header(wr, p, cmdline, created, err);
    dsec_buf b;
    dsec_buf_init(&b);
    char subject[128], req_id[64], job_id[64], env[32];
    char layer_names[16][40];
    char *layers[16];
    snprintf(subject, sizeof subject, DSEC_SUBJ_CREATE, p->tenant);
    uint64_t n = 0, nroll = 0, rollout_in_job = 0, rollout_job = 0;
    for (size_t i = 0; rc == 0 && i < g.n; i++) {
        const struct ev *e = &g.ev[i];
        dsec_trace_create c = {0};
        dsec_msg_create m = {0};
        snprintf(req_id, sizeof req_id, "g%" PRIx64 "-%zu", p->seed, i);
        m.req_id = req_id;
        m.tenant = (char *)p->tenant;
        if (e->kind == 1) {
            rc = write_job(p, wr, &b, created + (uint64_t)(e->t * 1e9), e->job, &n, err);
            continue;
        }
        if (e->job)
            snprintf(job_id, sizeof job_id, "burst-%u", e->job - 1000000);
        else {
            if (rollout_in_job++ == 64) {
                rollout_in_job = 1;
                rollout_job++;
            }
            snprintf(job_id, sizeof job_id, "rl-%" PRIu64, rollout_job);
        }
        sample_shape(p, &mx, &rng, &c);
        size_t ei = pick_env(p, &tr, &rng, &nroll, layer_names, layers, &c);
        snprintf(env, sizeof env, "env-%zu", ei);
        c.job_id = job_id;
        m.type = c.type;
        m.cpu_milli = c.cpu_milli;
        m.memory_mb = c.memory_mb;
        m.ttl_s = c.lifetime_s + 300;
        m.cls = c.class_;
        m.env = env;
        m.rollout_id = job_id;
        if (dsec_encode(&b, DSEC_MSG_CREATE, &m, err) < 0) {
            rc = -1;
            break;
        }
        dsec_trace_record r = {0};
        r.ts_ns = created + (uint64_t)(e->t * 1e9);
        r.subject = subject;
        r.msg_type = "create";
        r.req_id = req_id;
        r.payload.data = (uint8_t *)b.data;
        r.payload.len = b.len;
        r.create = &c;
        r.expects_reply = true;
        rc = dsec_trace_record_write(wr, &r, err);
        n++;
    }
    if (rc == 0)
        rc = dsec_record_writer_flush(wr, err);
    dsec_buf_release(&b);
    dsec_record_writer_free(wr);
    dsec_free(g.ev);
    dsec_free(tr.path);
    if (nrecords)
        *nrecords = n;
    return rc;
}
