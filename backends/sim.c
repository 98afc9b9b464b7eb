/* sim.c - the sim backend: latency, CPU and memory modelled per type; files kept in memory. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/backend.h"
#include "backends/loop.h"
#include "backends/registry.h"
#include "backends/sim.h"
#include "dsec/alloc.h"

/*
 * Why it is shaped like this: the control-plane benchmark keeps ~380,000
 * live sim sandboxes in one process, so a sandbox is one small malloc'd
 * record (48 bytes on x86-64) with no thread, timer or name of its own; the
 * node manager keeps the id. Model parameters live once per type in the
 * instance, and a sandbox points at them by a one-byte index.
 *
 * File contents are immutable, reference-counted blobs: fork copies the file
 * table but shares the contents, and a later write to either side replaces
 * (or, when unshared, extends) only its own blob. That is copy-on-write at
 * file granularity, like an upper layer frozen into a shared lower one.
 */

#define MODELS_MAX 32
#define TYPE_NAME_MAX 32
#define PATH_MAX_LEN 4096
#define MIB (1024ull * 1024ull)
#define STATE_MAGIC "sim1"

struct model {
    char type[TYPE_NAME_MAX];
    uint32_t startup_ms;      /* create, fork and restore */
    uint32_t exec_ms;         /* per command, counted as CPU time */
    uint32_t mem_overhead_mb; /* the sandbox machinery itself (guest kernel, shim) */
    double cpu_frac;          /* share of the requested CPU in use while running */
    double mem_frac;          /* share of the requested memory resident */
    bool can_fork, can_snapshot, can_pause;
};

/* Which model fields an option set for every type ("startup_ms=5"). */
enum {
    SET_STARTUP = 1 << 0,
    SET_EXEC = 1 << 1,
    SET_MEMOVH = 1 << 2,
    SET_CPUFRAC = 1 << 3,
    SET_MEMFRAC = 1 << 4,
};

struct sim {
    double time_scale;       /* 0: never sleep */
    uint64_t max_disk_bytes; /* file bytes per sandbox */
    uint32_t max_files;      /* files per sandbox */
    bool enforce_caps;       /* refuse fork/pause/snapshot the impersonated type lacks */
    struct model global;     /* values of the type-less options */
    unsigned global_set;     /* SET_* */
    pthread_mutex_t lock;    /* serialises adding models; readers go lock-free */
    _Atomic uint32_t nmodels;
    struct model models[MODELS_MAX]; /* immutable once published by nmodels */
};

struct blob {
    _Atomic uint32_t ref;
    size_t len;
    size_t cap; /* bytes of data allocated: appends double it, not grow it by the append */
    uint8_t data[];
};

struct file {
    char *path;
    struct blob *blob; /* NULL: empty */
    uint32_t mode;
    int64_t mtime;
};

/* One sim sandbox. Kept small on purpose: see the top of the file. */
struct sb {
    uint8_t model; /* index into sim.models */
    uint8_t paused;
    uint32_t cpu_milli;
    uint32_t memory_mb;
    uint32_t disk_mb;
    uint32_t nfiles, capfiles;
    uint64_t cpu_used_us;
    uint64_t disk_bytes; /* sum of file sizes */
    struct file *files;  /* sorted by path (strcmp) */
};

static struct sb *SB(dsec_sandbox *s)
{
    return (struct sb *)(void *)s;
}

static dsec_sandbox *HANDLE(struct sb *s)
{
    return (dsec_sandbox *)(void *)s;
}

/* ---- models ------------------------------------------------------------------- */

/* Defaults per built-in type: what one sandbox of that type costs a node. */
static void model_defaults(struct model *m, const char *type)
{
    memset(m, 0, sizeof *m);
    snprintf(m->type, sizeof m->type, "%s", type);
    m->cpu_frac = 0.05; /* DSec: ~90% of sandboxes use <= 5% of what they ask */
    m->mem_frac = 0.10;
    m->exec_ms = 1;
    m->can_fork = m->can_snapshot = m->can_pause = true;
    const dsec_backend_caps *caps = dsec_backend_caps_builtin(type);
    if (caps != NULL) {
        m->startup_ms = caps->startup_ms;
        m->can_fork = caps->supports_fork;
        m->can_snapshot = caps->supports_snapshot;
        m->can_pause = caps->supports_pause;
    }
    static const struct {
        const char *type;
        uint32_t exec_ms, overhead_mb;
    } per_type[] = {
        {"function", 1, 1}, {"container", 2, 4}, {"microvm", 3, 64}, {"vm", 5, 256}, {"sim", 0, 0},
    };
    for (size_t i = 0; i < sizeof per_type / sizeof per_type[0]; i++)
        if (strcmp(per_type[i].type, type) == 0) {
            m->exec_ms = per_type[i].exec_ms;
            m->mem_overhead_mb = per_type[i].overhead_mb;
        }
}

static void model_apply_global(const struct sim *s, struct model *m)
{
    if (s->global_set & SET_STARTUP)
        m->startup_ms = s->global.startup_ms;
    if (s->global_set & SET_EXEC)
        m->exec_ms = s->global.exec_ms;
    if (s->global_set & SET_MEMOVH)
        m->mem_overhead_mb = s->global.mem_overhead_mb;
    if (s->global_set & SET_CPUFRAC)
        m->cpu_frac = s->global.cpu_frac;
    if (s->global_set & SET_MEMFRAC)
        m->mem_frac = s->global.mem_frac;
}

static int model_find(struct sim *s, const char *type)
{
    uint32_t n = atomic_load_explicit(&s->nmodels, memory_order_acquire);
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(s->models[i].type, type) == 0)
            return (int)i;
    return -1;
}

/* Find or add the model of type. Adding happens under the lock and is
 * published by a release store, so lock-free readers see whole entries. */
static int model_get(struct sim *s, const char *type, dsec_err *err)
{
    int idx = model_find(s, type);
    if (idx >= 0)
        return idx;
    if (strlen(type) >= TYPE_NAME_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "sim: sandbox type name \"%.40s...\" is longer than %d bytes", type,
                            TYPE_NAME_MAX - 1);
    pthread_mutex_lock(&s->lock);
    idx = model_find(s, type);
    if (idx < 0) {
        uint32_t n = atomic_load_explicit(&s->nmodels, memory_order_relaxed);
        if (n >= MODELS_MAX) {
            pthread_mutex_unlock(&s->lock);
            return dsec_err_set(err, DSEC_E_CAPACITY, 0,
                                "sim: cannot impersonate \"%s\": at most %d types per node", type,
                                MODELS_MAX);
        }
        model_defaults(&s->models[n], type);
        model_apply_global(s, &s->models[n]);
        atomic_store_explicit(&s->nmodels, n + 1, memory_order_release);
        idx = (int)n;
    }
    pthread_mutex_unlock(&s->lock);
    return idx;
}

/* ---- options -------------------------------------------------------------------- */

static int parse_u32(const char *key, const char *v, uint32_t max, uint32_t *out, dsec_err *err)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (v[0] < '0' || v[0] > '9' || *end != '\0' || errno != 0 || x > max)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "sim option %s=\"%s\": expected an integer 0..%" PRIu32, key, v, max);
    *out = (uint32_t)x;
    return 0;
}

static int parse_double(const char *key, const char *v, double max, double *out, dsec_err *err)
{
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end != '\0' || errno != 0 || !(x >= 0.0) || x > max)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "sim option %s=\"%s\": expected a number 0..%g",
                            key, v, max);
    *out = x;
    return 0;
}

static const char known_opts[] =
    "time_scale, max_disk_mb, max_files, enforce_caps, and per type (key or key.TYPE): "
    "startup_ms, exec_ms, mem_overhead_mb, cpu_frac, mem_frac";

/* Apply one per-type option (base = "startup_ms", ...) to m. Returns the
 * SET_* bit, 0 when base is not a model option, -1 on a bad value. */
static int model_option(struct model *m, const char *key, const char *base, const char *v,
                        dsec_err *err)
{
    if (strcmp(base, "startup_ms") == 0)
        return parse_u32(key, v, 3600000, &m->startup_ms, err) < 0 ? -1 : SET_STARTUP;
    if (strcmp(base, "exec_ms") == 0)
        return parse_u32(key, v, 3600000, &m->exec_ms, err) < 0 ? -1 : SET_EXEC;
    if (strcmp(base, "mem_overhead_mb") == 0)
        return parse_u32(key, v, 1u << 24, &m->mem_overhead_mb, err) < 0 ? -1 : SET_MEMOVH;
    if (strcmp(base, "cpu_frac") == 0)
        return parse_double(key, v, 1.0, &m->cpu_frac, err) < 0 ? -1 : SET_CPUFRAC;
    if (strcmp(base, "mem_frac") == 0)
        return parse_double(key, v, 1.0, &m->mem_frac, err) < 0 ? -1 : SET_MEMFRAC;
    return 0;
}

/* Options in two passes: instance-wide and type-less ones first, so that
 * "startup_ms.container=30" wins over "startup_ms=5" whatever their order. */
static int sim_options(struct sim *s, const dsec_backend_config *cfg, dsec_err *err)
{
    for (size_t i = 0; i < cfg->nopts; i++) {
        const char *k = cfg->opts[i].key, *v = cfg->opts[i].value;
        if (k == NULL || v == NULL)
            return dsec_err_set(err, DSEC_E_CONFIG, 0, "sim option %zu has no key or value", i);
        if (strchr(k, '.') != NULL)
            continue;
        if (strcmp(k, "time_scale") == 0) {
            if (parse_double(k, v, 1e6, &s->time_scale, err) < 0)
                return -1;
        } else if (strcmp(k, "max_disk_mb") == 0) {
            uint32_t mb = 0;
            if (parse_u32(k, v, 1u << 24, &mb, err) < 0)
                return -1;
            s->max_disk_bytes = mb * MIB;
        } else if (strcmp(k, "max_files") == 0) {
            if (parse_u32(k, v, 1u << 24, &s->max_files, err) < 0)
                return -1;
        } else if (strcmp(k, "enforce_caps") == 0) {
            if (strcmp(v, "1") == 0 || strcmp(v, "true") == 0)
                s->enforce_caps = true;
            else if (strcmp(v, "0") == 0 || strcmp(v, "false") == 0)
                s->enforce_caps = false;
            else
                return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                    "sim option enforce_caps=\"%s\": expected true or false", v);
        } else {
            int bit = model_option(&s->global, k, k, v, err);
            if (bit < 0)
                return -1;
            if (bit == 0)
                return dsec_err_set(err, DSEC_E_CONFIG, 0, "unknown sim option \"%s\" (known: %s)",
                                    k, known_opts);
            s->global_set |= (unsigned)bit;
        }
    }
    /* Apply the type-less values to the built-ins already present. */
    for (uint32_t i = 0; i < s->nmodels; i++)
        model_apply_global(s, &s->models[i]);
    for (size_t i = 0; i < cfg->nopts; i++) {
        const char *k = cfg->opts[i].key, *v = cfg->opts[i].value;
        const char *dot = strchr(k, '.');
        if (dot == NULL)
            continue;
        char base[32];
        size_t blen = (size_t)(dot - k);
        if (blen >= sizeof base || dot[1] == '\0')
            return dsec_err_set(err, DSEC_E_CONFIG, 0, "unknown sim option \"%s\" (known: %s)", k,
                                known_opts);
        memcpy(base, k, blen);
        base[blen] = '\0';
        int idx = model_get(s, dot + 1, err);
        if (idx < 0)
            return dsec_err_wrap(err, "sim option \"%s\"", k);
        int bit = model_option(&s->models[idx], k, base, v, err);
        if (bit < 0)
            return -1;
        if (bit == 0)
            return dsec_err_set(err, DSEC_E_CONFIG, 0, "unknown sim option \"%s\" (known: %s)", k,
                                known_opts);
    }
    return 0;
}

/* ---- instance ------------------------------------------------------------------- */

static void sim_fini(void *self)
{
    struct sim *s = self;
    if (s == NULL)
        return;
    pthread_mutex_destroy(&s->lock);
    dsec_free(s);
}

static int sim_init(void **self, const dsec_backend_config *cfg, dsec_err *err)
{
    struct sim *s = dsec_calloc(1, sizeof *s);
    if (s == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "allocating the sim backend");
    s->time_scale = 1.0;
    s->max_disk_bytes = 64 * MIB;
    s->max_files = 65536;
    s->enforce_caps = true;
    pthread_mutex_init(&s->lock, NULL);
    static const char *const builtins[] = {"function", "container", "microvm", "vm", "sim"};
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++) {
        model_defaults(&s->models[i], builtins[i]);
        s->nmodels = (uint32_t)i + 1;
    }
    if (sim_options(s, cfg, err) < 0)
        goto out_free;
    *self = s;
    return 0;

out_free:
    sim_fini(s);
    return -1;
}

/* Sleep for a modelled duration, scaled. time_scale 0 never enters the kernel. */
static void model_sleep(const struct sim *s, uint64_t us)
{
    if (s->time_scale <= 0.0 || us == 0)
        return;
    double ns = (double)us * 1000.0 * s->time_scale;
    struct timespec ts = {.tv_sec = (time_t)(ns / 1e9),
                          .tv_nsec = (long)((uint64_t)ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int64_t now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;
}

/* ---- blobs and file tables -------------------------------------------------------- */

static void blob_put(struct blob *b)
{
    if (b != NULL && atomic_fetch_sub_explicit(&b->ref, 1, memory_order_acq_rel) == 1)
        dsec_free(b);
}

static struct blob *blob_alloc(size_t len)
{
    struct blob *b = dsec_malloc(sizeof *b + len);
    if (b == NULL)
        return NULL;
    atomic_init(&b->ref, 1);
    b->len = b->cap = len;
    return b;
}

/* A new blob holding a then c. */
static struct blob *blob_new(const void *a, size_t alen, const void *c, size_t clen)
{
    struct blob *b = blob_alloc(alen + clen);
    if (b == NULL)
        return NULL;
    if (alen > 0)
        memcpy(b->data, a, alen);
    if (clen > 0)
        memcpy(b->data + alen, c, clen);
    return b;
}

static size_t blob_len(const struct blob *b)
{
    return b ? b->len : 0;
}

static void files_free(struct file *files, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        dsec_free(files[i].path);
        blob_put(files[i].blob);
    }
    dsec_free(files);
}

/* Index of the first file whose path is >= key. */
static uint32_t lower_bound(const struct sb *b, const char *key)
{
    uint32_t lo = 0, hi = b->nfiles;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (strcmp(b->files[mid].path, key) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct file *file_find(const struct sb *b, const char *path)
{
    uint32_t i = lower_bound(b, path);
    return i < b->nfiles && strcmp(b->files[i].path, path) == 0 ? &b->files[i] : NULL;
}

/* Whether dir (no trailing slash; "" for the root) has any file below it. */
static bool is_dir(const struct sb *b, const char *dir)
{
    char key[PATH_MAX_LEN + 2];
    size_t n = strlen(dir);
    memcpy(key, dir, n);
    key[n] = '/';
    key[n + 1] = '\0';
    uint32_t i = lower_bound(b, key);
    return i < b->nfiles && strncmp(b->files[i].path, key, n + 1) == 0;
}

/* Paths are absolute and already normal: no empty, "." or ".." component and
 * no trailing slash. We refuse rather than normalise so that one file has one
 * name. allow_root admits "/" itself (listing). */
static int check_path(const char *path, bool allow_root, dsec_err *err)
{
    size_t n = strnlen(path, PATH_MAX_LEN + 1);
    if (n > PATH_MAX_LEN)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "path longer than %d bytes", PATH_MAX_LEN);
    if (path[0] != '/')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "path \"%s\" is not absolute", path);
    if (n == 1) {
        if (allow_root)
            return 0;
        return dsec_err_set(err, DSEC_E_INVALID, 0, "\"/\" is a directory");
    }
    const char *c = path + 1;
    for (;;) {
        const char *slash = strchr(c, '/');
        size_t len = slash ? (size_t)(slash - c) : strlen(c);
        if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "path \"%s\" is not normal (empty, \".\" or \"..\" component, or "
                                "trailing slash)",
                                path);
        if (slash == NULL)
            return 0;
        c = slash + 1;
    }
}

/* ---- sandboxes -------------------------------------------------------------------- */

static void sb_free(struct sb *b)
{
    if (b == NULL)
        return;
    files_free(b->files, b->nfiles);
    dsec_free(b);
}

static uint32_t clamp_u32(uint64_t v)
{
    return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

static struct sb *sb_new(int model, const dsec_sandbox_spec *spec)
{
    struct sb *b = dsec_calloc(1, sizeof *b);
    if (b == NULL)
        return NULL;
    b->model = (uint8_t)model;
    b->cpu_milli = clamp_u32(spec->cpu_milli);
    b->memory_mb = clamp_u32(spec->memory_mb);
    b->disk_mb = clamp_u32(spec->disk_mb);
    return b;
}

static int state_string(const struct sim *s, const struct sb *b, char **out, dsec_err *err)
{
    char buf[128];
    int n = snprintf(buf, sizeof buf,
                     STATE_MAGIC ";type=%s;cpu=%" PRIu32 ";mem=%" PRIu32 ";disk=%" PRIu32,
                     s->models[b->model].type, b->cpu_milli, b->memory_mb, b->disk_mb);
    if (n < 0 || (size_t)n >= sizeof buf)
        return dsec_err_set(err, DSEC_E_INTERNAL, 0, "sim: backend_state does not fit");
    *out = dsec_strdup(buf);
    if (*out == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "sim: allocating backend_state");
    return 0;
}

static uint64_t disk_cap(const struct sim *s, const struct sb *b)
{
    uint64_t cap = s->max_disk_bytes;
    if (b->disk_mb != 0 && (uint64_t)b->disk_mb * MIB < cap)
        cap = (uint64_t)b->disk_mb * MIB;
    return cap;
}

static int refuse_cap(const struct sim *s, const struct sb *b, bool can, const char *op,
                      dsec_err *err)
{
    if (can || !s->enforce_caps)
        return 0;
    return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0, "sandbox type \"%s\" does not support %s",
                        s->models[b->model].type, op);
}

static int refuse_paused(const struct sb *b, const char *op, dsec_err *err)
{
    if (!b->paused)
        return 0;
    return dsec_err_set(err, DSEC_E_STATE, 0, "cannot %s: the sandbox is paused (resume it first)",
                        op);
}

static int sim_create(void *self, const dsec_sandbox_spec *spec, dsec_sandbox **out,
                      char **backend_state, dsec_err *err)
{
    struct sim *s = self;
    if (spec->type == NULL || spec->type[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "sim: the spec names no sandbox type");
    int model = model_get(s, spec->type, err);
    if (model < 0)
        return -1;
    struct sb *b = sb_new(model, spec);
    if (b == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "sim: allocating a sandbox");
    if (state_string(s, b, backend_state, err) < 0)
        goto out_free;
    model_sleep(s, (uint64_t)s->models[model].startup_ms * 1000);
    *out = HANDLE(b);
    return 0;

out_free:
    sb_free(b);
    return -1;
}

static int sim_destroy(void *self, dsec_sandbox *h, dsec_err *err)
{
    sb_free(SB(h));
    return 0;
}

/* For sim, detaching and destroying free the same memory: nothing outlives
 * the process but the backend_state the node manager persisted. */
static void sim_detach(void *self, dsec_sandbox *h)
{
    sb_free(SB(h));
}

/* ---- exec ------------------------------------------------------------------------- */

struct out {
    uint8_t *p;
    size_t len, cap, max;
    bool truncated;
};

static int out_add(struct out *o, const void *data, size_t n)
{
    if (o->len + n > o->max) {
        o->truncated = true;
        n = o->max - o->len;
    }
    if (n == 0)
        return 0;
    if (o->len + n > o->cap) {
        size_t cap = o->cap ? o->cap : 64;
        while (cap < o->len + n)
            cap *= 2;
        uint8_t *p = dsec_realloc(o->p, cap);
        if (p == NULL)
            return -1;
        o->p = p;
        o->cap = cap;
    }
    memcpy(o->p + o->len, data, n);
    o->len += n;
    return 0;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* What a command does, computed at once; *total_us is how long it runs (modelled). */
static int exec_model(struct sim *s, dsec_sandbox *h, const dsec_exec_req *req,
                      dsec_exec_result *res, uint64_t *total, dsec_err *err)
{
    struct sb *b = SB(h);
    const struct model *m = &s->models[b->model];
    if (refuse_paused(b, "exec", err) < 0)
        return -1;

    size_t max = req->output_max ? req->output_max : DSEC_EXEC_OUTPUT_DEFAULT;
    struct out o = {.max = max}, e = {.max = max};
    const char *cmd = base_name(req->argv[0]);
    uint64_t cpu_us = (uint64_t)m->exec_ms * 1000, wait_us = 0;
    int rc = 0, code = 0;

    if (strcmp(cmd, "echo") == 0) {
        for (size_t i = 1; i < req->argc && rc == 0; i++) {
            if (i > 1)
                rc = out_add(&o, " ", 1);
            if (rc == 0)
                rc = out_add(&o, req->argv[i], strlen(req->argv[i]));
        }
        if (rc == 0)
            rc = out_add(&o, "\n", 1);
    } else if (strcmp(cmd, "false") == 0) {
        code = 1;
    } else if (strcmp(cmd, "exit") == 0) {
        code = req->argc > 1 ? atoi(req->argv[1]) & 0xff : 0;
    } else if (strcmp(cmd, "cat") == 0) {
        if (req->argc == 1)
            rc = out_add(&o, req->stdin_data, req->stdin_len);
        for (size_t i = 1; i < req->argc && rc == 0; i++) {
            const struct file *f = file_find(b, req->argv[i]);
            if (f != NULL) {
                rc = out_add(&o, f->blob ? f->blob->data : NULL, blob_len(f->blob));
                continue;
            }
            char msg[PATH_MAX_LEN + 64];
            int n = snprintf(msg, sizeof msg, "cat: %s: No such file or directory\n", req->argv[i]);
            rc = out_add(&e, msg, n > 0 ? (size_t)n : 0);
            code = 1;
        }
    } else if (strcmp(cmd, "sleep") == 0) {
        double secs = req->argc > 1 ? strtod(req->argv[1], NULL) : 0.0;
        if (secs > 0.0 && secs < 1e9)
            wait_us = (uint64_t)(secs * 1e6);
    }
    if (rc < 0) {
        dsec_free(o.p);
        dsec_free(e.p);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "sim: exec output");
    }

    uint64_t total_us = cpu_us + wait_us;
    if (req->timeout_ms > 0 && total_us > req->timeout_ms * 1000) {
        /* Killed at the deadline: what it printed so far is kept, like a
         * real runtime would return the pipe's contents. */
        total_us = req->timeout_ms * 1000;
        if (cpu_us > total_us)
            cpu_us = total_us;
        res->timed_out = true;
        res->signal = 9;
        code = -1;
    }
    *total = total_us;
    b->cpu_used_us += cpu_us;

    res->exit_code = code;
    res->stdout_data = o.p;
    res->stdout_len = o.len;
    res->stdout_truncated = o.truncated;
    res->stderr_data = e.p;
    res->stderr_len = e.len;
    res->stderr_truncated = e.truncated;
    res->duration_us = total_us;
    return 0;
}

static int sim_exec(void *self, dsec_sandbox *h, const dsec_exec_req *req, dsec_exec_result *res,
                    dsec_err *err)
{
    struct sim *s = self;
    uint64_t total_us = 0;
    if (exec_model(s, h, req, res, &total_us, err) < 0)
        return -1;
    model_sleep(s, total_us);
    return 0;
}

/* A command in flight: its result, handed over when its modelled time is up. */
struct sim_run {
    dsec_exec_result res;
    dsec_exec_done_fn done;
    void *ud;
};

static void exec_due(dsec_loop_watch *w, unsigned events, void *ud)
{
    (void)w;
    struct sim_run *r = ud;
    if (events & DSEC_LOOP_CANCEL) {
        dsec_err err;
        dsec_err_set(&err, DSEC_E_CLOSED, 0,
                     "sim: the node manager stopped while the command ran; it did not finish");
        dsec_exec_result_release(&r->res);
        r->done(r->ud, -1, NULL, &err);
    } else {
        r->done(r->ud, 0, &r->res, NULL);
    }
    dsec_free(r);
}

/* At time_scale 0 nothing is slept: every operation returns at once. */
static bool sim_instant(void *self)
{
    const struct sim *s = self;
    return s->time_scale <= 0.0;
}

static int sim_exec_start(void *self, dsec_sandbox *h, const dsec_exec_req *req,
                          struct dsec_loop *loop, dsec_exec_done_fn done, void *ud, dsec_err *err)
{
    struct sim *s = self;
    struct sim_run *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "sim: a command in flight");
    uint64_t total_us = 0;
    if (exec_model(s, h, req, &r->res, &total_us, err) < 0) {
        dsec_free(r);
        return -1;
    }
    r->done = done;
    r->ud = ud;
    /* the modelled time passes on the loop's clock, as model_sleep would have slept it */
    double ns = s->time_scale > 0.0 ? (double)total_us * 1000.0 * s->time_scale : 0.0;
    if (dsec_loop_add(loop, -1, 0, dsec_loop_now_ns() + (uint64_t)ns, exec_due, r, NULL, err) < 0) {
        dsec_exec_result_release(&r->res);
        dsec_free(r);
        return -1;
    }
    return 0;
}

/* ---- files ------------------------------------------------------------------------ */

static int files_reserve(struct sb *b, uint32_t want, dsec_err *err)
{
    if (want <= b->capfiles)
        return 0;
    uint32_t cap = b->capfiles ? b->capfiles * 2 : 4;
    while (cap < want)
        cap *= 2;
    struct file *f = dsec_realloc(b->files, (size_t)cap * sizeof *f);
    if (f == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "sim: growing the file table");
    b->files = f;
    b->capfiles = cap;
    return 0;
}

/* A regular file may not sit where a directory is implied, nor below a file. */
static int check_conflicts(const struct sb *b, const char *path, dsec_err *err)
{
    char prefix[PATH_MAX_LEN + 1];
    for (const char *c = strchr(path + 1, '/'); c != NULL; c = strchr(c + 1, '/')) {
        size_t n = (size_t)(c - path);
        memcpy(prefix, path, n);
        prefix[n] = '\0';
        if (file_find(b, prefix) != NULL)
            return dsec_err_set(err, DSEC_E_INVALID, ENOTDIR, "writing %s: %s is a file", path,
                                prefix);
    }
    if (is_dir(b, path))
        return dsec_err_set(err, DSEC_E_INVALID, EISDIR, "writing %s", path);
    return 0;
}

static int sim_file_write(void *self, dsec_sandbox *h, const char *path, const void *data,
                          size_t len, uint32_t mode, bool append, dsec_err *err)
{
    struct sim *s = self;
    struct sb *b = SB(h);
    if (refuse_paused(b, "write files", err) < 0 || check_path(path, false, err) < 0)
        return -1;
    struct file *f = file_find(b, path);
    if (f == NULL && check_conflicts(b, path, err) < 0)
        return -1;
    size_t old = f ? blob_len(f->blob) : 0;
    size_t newlen = append ? old + len : len;
    uint64_t total = b->disk_bytes - old + newlen;
    if (total > disk_cap(s, b))
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "writing %s: the sandbox would hold %" PRIu64
                            " bytes of files, over its limit of %" PRIu64,
                            path, total, disk_cap(s, b));
    if (f == NULL && b->nfiles >= s->max_files)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "writing %s: the sandbox already holds %" PRIu32 " files (the limit)",
                            path, b->nfiles);

    struct blob *nb = NULL;
    if (append && f != NULL && f->blob != NULL && atomic_load(&f->blob->ref) == 1) {
        /* Unshared: extend in place (nobody else can take a reference now,
         * since only this sandbox's actor can fork it). */
        if (len > 0) {
            nb = f->blob;
            if (newlen > nb->cap) {
                /* a file written in many appends is copied O(log n) times, not n */
                size_t ncap = newlen > nb->cap * 2 ? newlen : nb->cap * 2;
                if ((nb = dsec_realloc(f->blob, sizeof *nb + ncap)) == NULL)
                    goto out_nomem;
                nb->cap = ncap;
            }
            memcpy(nb->data + old, data, len);
            nb->len = newlen;
            f->blob = nb;
        }
    } else if (newlen > 0) {
        nb = append && f ? blob_new(f->blob ? f->blob->data : NULL, old, data, len)
                         : blob_new(data, len, NULL, 0);
        if (nb == NULL)
            goto out_nomem;
        if (f != NULL) {
            blob_put(f->blob);
            f->blob = nb;
        }
    } else if (f != NULL && !append) {
        blob_put(f->blob);
        f->blob = NULL;
    }

    if (f == NULL) {
        char *p = dsec_strdup(path);
        if (p == NULL || files_reserve(b, b->nfiles + 1, err) < 0) {
            dsec_free(p);
            blob_put(nb);
            goto out_nomem;
        }
        uint32_t i = lower_bound(b, path);
        memmove(&b->files[i + 1], &b->files[i], (size_t)(b->nfiles - i) * sizeof *b->files);
        b->files[i] = (struct file){.path = p, .blob = nb, .mode = mode ? mode & 07777 : 0644};
        b->nfiles++;
        f = &b->files[i];
    } else if (mode != 0) {
        f->mode = mode & 07777;
    }
    f->mtime = now_s();
    b->disk_bytes = total;
    return 0;

out_nomem:
    return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "writing %s", path);
}

static int sim_file_read(void *self, dsec_sandbox *h, const char *path, uint64_t offset,
                         uint64_t max, dsec_file_data *out, dsec_err *err)
{
    struct sb *b = SB(h);
    if (refuse_paused(b, "read files", err) < 0 || check_path(path, false, err) < 0)
        return -1;
    const struct file *f = file_find(b, path);
    if (f == NULL) {
        if (is_dir(b, path))
            return dsec_err_set(err, DSEC_E_INVALID, EISDIR, "reading %s", path);
        return dsec_err_set(err, DSEC_E_NOT_FOUND, ENOENT, "reading %s", path);
    }
    uint64_t size = blob_len(f->blob);
    uint64_t n = offset >= size ? 0 : size - offset;
    if (max != 0 && n > max)
        n = max;
    out->size = size;
    out->eof = offset + n >= size;
    if (n == 0)
        return 0;
    out->data = dsec_malloc((size_t)n);
    if (out->data == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "reading %s", path);
    memcpy(out->data, f->blob->data + offset, (size_t)n);
    out->len = (size_t)n;
    return 0;
}

static int entry_add(dsec_file_entry **v, size_t *n, size_t *cap, const char *name, size_t nlen,
                     dsec_file_kind kind, const struct file *f)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 8;
        dsec_file_entry *p = dsec_realloc(*v, c * sizeof *p);
        if (p == NULL)
            return -1;
        *v = p;
        *cap = c;
    }
    char *nm = dsec_strndup(name, nlen);
    if (nm == NULL)
        return -1;
    (*v)[(*n)++] = (dsec_file_entry){
        .name = nm,
        .kind = kind,
        .size = kind == DSEC_FILE_REG ? blob_len(f->blob) : 0,
        .mode = kind == DSEC_FILE_REG ? f->mode : 0755,
        .mtime = f->mtime,
    };
    return 0;
}

/* Drop file i from the table (its blob's reference goes with it). */
static void file_drop(struct sb *b, uint32_t i)
{
    b->disk_bytes -= blob_len(b->files[i].blob);
    dsec_free(b->files[i].path);
    blob_put(b->files[i].blob);
    memmove(&b->files[i], &b->files[i + 1], (size_t)(b->nfiles - i - 1) * sizeof *b->files);
    b->nfiles--;
}

/* The sim keeps files only: a directory is there while a file is below it, so mkdir checks
 * the path and keeps nothing, and rename moves regular files only. */
static int sim_file_op(void *self, dsec_sandbox *h, const dsec_file_op *op, dsec_file_entry *st,
                       dsec_err *err)
{
    struct sb *b = SB(h);
    if (refuse_paused(b, "change files", err) < 0 ||
        check_path(op->path, op->kind == DSEC_FOP_STAT || op->kind == DSEC_FOP_MKDIR, err) < 0)
        return -1;
    struct file *f = op->path[1] ? file_find(b, op->path) : NULL;
    bool dir = op->path[1] == '\0' || (f == NULL && is_dir(b, op->path));
    switch (op->kind) {
    case DSEC_FOP_MKDIR:
        if (f != NULL || (dir && !op->parents))
            return dsec_err_set(err, DSEC_E_EXISTS, EEXIST, "mkdir %s: it exists", op->path);
        return 0;
    case DSEC_FOP_STAT:
        if (f == NULL && !dir)
            return dsec_err_set(err, DSEC_E_NOT_FOUND, ENOENT, "stat %s", op->path);
        st->name = dsec_strdup(op->path[1] ? base_name(op->path) : "/");
        st->kind = f != NULL ? DSEC_FILE_REG : DSEC_FILE_DIR;
        st->size = f != NULL ? blob_len(f->blob) : 0;
        st->mode = f != NULL ? f->mode : 0755;
        st->mtime = f != NULL ? f->mtime : 0;
        return 0;
    case DSEC_FOP_RENAME: {
        if (check_path(op->to, false, err) < 0)
            return -1;
        if (f == NULL)
            return dsec_err_set(
                err, dir ? DSEC_E_UNSUPPORTED : DSEC_E_NOT_FOUND, dir ? EISDIR : ENOENT,
                dir ? "rename %s: the sim renames regular files only" : "rename %s", op->path);
        if (strcmp(op->path, op->to) == 0)
            return 0;
        struct file *t = file_find(b, op->to);
        if (t == NULL && check_conflicts(b, op->to, err) < 0)
            return -1;
        struct file moved = *f;
        if (t != NULL) {
            b->disk_bytes -= blob_len(t->blob);
            blob_put(t->blob);
            t->blob = moved.blob;
            t->mode = moved.mode;
            t->mtime = moved.mtime;
            f->blob = NULL; /* now t's */
            file_drop(b, (uint32_t)(f - b->files));
            return 0;
        }
        char *p = dsec_strdup(op->to);
        if (p == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "rename %s", op->path);
        /* the table keeps its size: take f out, then put it in at its new place */
        dsec_free(moved.path);
        uint32_t i = (uint32_t)(f - b->files);
        memmove(&b->files[i], &b->files[i + 1], (size_t)(b->nfiles - i - 1) * sizeof *b->files);
        b->nfiles--;
        i = lower_bound(b, p);
        memmove(&b->files[i + 1], &b->files[i], (size_t)(b->nfiles - i) * sizeof *b->files);
        moved.path = p;
        b->files[i] = moved;
        b->nfiles++;
        return 0;
    }
    case DSEC_FOP_REMOVE:
        if (f != NULL) {
            file_drop(b, (uint32_t)(f - b->files));
            return 0;
        }
        if (!dir)
            return dsec_err_set(err, DSEC_E_NOT_FOUND, ENOENT, "remove %s", op->path);
        if (!op->recursive)
            return dsec_err_set(err, DSEC_E_IO, ENOTEMPTY,
                                "remove %s: directory not empty (remove it recursively)", op->path);
        char key[PATH_MAX_LEN + 2];
        size_t n = strlen(op->path);
        memcpy(key, op->path, n);
        key[n] = '/';
        key[n + 1] = '\0';
        for (uint32_t i = lower_bound(b, key);
             i < b->nfiles && strncmp(b->files[i].path, key, n + 1) == 0;)
            file_drop(b, i);
        return 0;
    }
    return dsec_err_set(err, DSEC_E_INVALID, 0, "file op %d is unknown", (int)op->kind);
}

static int sim_file_list(void *self, dsec_sandbox *h, const char *path, dsec_file_entry **entries,
                         size_t *n, dsec_err *err)
{
    struct sb *b = SB(h);
    dsec_file_entry *v = NULL;
    size_t nv = 0, cap = 0;
    if (refuse_paused(b, "list files", err) < 0 || check_path(path, true, err) < 0)
        return -1;
    bool root = path[1] == '\0';
    const struct file *f = root ? NULL : file_find(b, path);
    if (f != NULL) { /* like ls: a file lists as itself */
        const char *name = base_name(path);
        if (entry_add(&v, &nv, &cap, name, strlen(name), DSEC_FILE_REG, f) < 0)
            goto out_nomem;
        goto out_ok;
    }
    size_t plen = root ? 0 : strlen(path);
    if (!root && !is_dir(b, path))
        return dsec_err_set(err, DSEC_E_NOT_FOUND, ENOENT, "listing %s", path);

    char key[PATH_MAX_LEN + 2];
    memcpy(key, path, plen);
    key[plen] = '/';
    key[plen + 1] = '\0';
    /* Everything below the directory is contiguous in sorted order, and so
     * is everything below each subdirectory: one pass, folding runs. */
    for (uint32_t i = lower_bound(b, key); i < b->nfiles; i++) {
        const struct file *g = &b->files[i];
        if (strncmp(g->path, key, plen + 1) != 0)
            break;
        const char *rest = g->path + plen + 1;
        const char *slash = strchr(rest, '/');
        size_t nlen = slash ? (size_t)(slash - rest) : strlen(rest);
        if (slash != NULL && nv > 0 && v[nv - 1].kind == DSEC_FILE_DIR &&
            strlen(v[nv - 1].name) == nlen && memcmp(v[nv - 1].name, rest, nlen) == 0) {
            if (g->mtime > v[nv - 1].mtime)
                v[nv - 1].mtime = g->mtime;
            continue;
        }
        if (entry_add(&v, &nv, &cap, rest, nlen, slash ? DSEC_FILE_DIR : DSEC_FILE_REG, g) < 0)
            goto out_nomem;
    }
out_ok:
    *entries = v;
    *n = nv;
    return 0;

out_nomem:
    dsec_file_entries_free(v, nv);
    return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "listing %s", path);
}

/* ---- fork, pause, stats ------------------------------------------------------------- */

/* A child sharing every blob of its parent: O(files), no content copied. */
static struct sb *sb_clone(const struct sb *p)
{
    struct sb *c = dsec_calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->model = p->model;
    c->cpu_milli = p->cpu_milli;
    c->memory_mb = p->memory_mb;
    c->disk_mb = p->disk_mb;
    if (p->nfiles == 0)
        return c;
    c->files = dsec_malloc((size_t)p->nfiles * sizeof *c->files);
    if (c->files == NULL)
        goto out_free;
    c->capfiles = p->nfiles;
    for (uint32_t i = 0; i < p->nfiles; i++) {
        char *path = dsec_strdup(p->files[i].path);
        if (path == NULL)
            goto out_free;
        c->files[i] = p->files[i];
        c->files[i].path = path;
        if (c->files[i].blob != NULL)
            atomic_fetch_add_explicit(&c->files[i].blob->ref, 1, memory_order_relaxed);
        c->nfiles++;
        c->disk_bytes += blob_len(c->files[i].blob);
    }
    return c;

out_free:
    sb_free(c);
    return NULL;
}

static int sim_fork(void *self, dsec_sandbox *h, const char *const *ids, size_t n,
                    dsec_sandbox **children, char **states, dsec_err *err)
{
    struct sim *s = self;
    struct sb *p = SB(h);
    if (refuse_cap(s, p, s->models[p->model].can_fork, "fork", err) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        struct sb *c = sb_clone(p);
        if (c == NULL) {
            dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "sim: forking child %zu of %zu", i + 1, n);
            goto out_undo;
        }
        children[i] = HANDLE(c);
        if (state_string(s, c, &states[i], err) < 0)
            goto out_undo;
    }
    /* The children are cloned from one frozen point together: one start-up. */
    model_sleep(s, (uint64_t)s->models[p->model].startup_ms * 1000);
    return 0;

out_undo:
    for (size_t i = 0; i < n; i++) {
        sb_free(SB(children[i]));
        dsec_free(states[i]);
        children[i] = NULL;
        states[i] = NULL;
    }
    return -1;
}

/* Pausing a paused sandbox (or resuming a running one) succeeds: the sandbox
 * actor may retry an operation whose answer was lost. */
static int sim_pause(void *self, dsec_sandbox *h, dsec_err *err)
{
    struct sim *s = self;
    struct sb *b = SB(h);
    if (refuse_cap(s, b, s->models[b->model].can_pause, "pause", err) < 0)
        return -1;
    b->paused = 1;
    return 0;
}

static int sim_resume(void *self, dsec_sandbox *h, dsec_err *err)
{
    struct sim *s = self;
    struct sb *b = SB(h);
    if (refuse_cap(s, b, s->models[b->model].can_pause, "resume", err) < 0)
        return -1;
    b->paused = 0;
    return 0;
}

static int sim_stats(void *self, dsec_sandbox *h, dsec_sandbox_stats *out, dsec_err *err)
{
    const struct sim *s = self;
    const struct sb *b = SB(h);
    const struct model *m = &s->models[b->model];
    out->cpu_used_us = b->cpu_used_us;
    out->cpu_milli = b->paused ? 0 : (uint64_t)(m->cpu_frac * b->cpu_milli + 0.5);
    /* A paused sandbox keeps its memory: freezing is not swapping. */
    out->memory_bytes =
        (uint64_t)m->mem_overhead_mb * MIB + (uint64_t)(m->mem_frac * (double)b->memory_mb * MIB);
    out->disk_bytes = b->disk_bytes;
    out->nfiles = b->nfiles;
    return 0;
}

/* ---- adopt, snapshot, restore -------------------------------------------------------- */

static int sim_adopt(void *self, const dsec_sandbox_spec *spec, const char *state,
                     dsec_sandbox **out, dsec_err *err)
{
    struct sim *s = self;
    char type[TYPE_NAME_MAX + 1];
    uint32_t cpu, mem, disk;
    int used = 0;
    if (sscanf(state,
               STATE_MAGIC ";type=%32[^;];cpu=%" SCNu32 ";mem=%" SCNu32 ";disk=%" SCNu32 "%n", type,
               &cpu, &mem, &disk, &used) != 4 ||
        state[used] != '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "sim: backend_state \"%.64s\" is not one this backend wrote", state);
    if (spec != NULL && spec->type != NULL && strcmp(spec->type, type) != 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "sim: backend_state is for type \"%s\" but the record says \"%s\"",
                            type, spec->type);
    int model = model_get(s, type, err);
    if (model < 0)
        return -1;
    dsec_sandbox_spec sp = {.cpu_milli = cpu, .memory_mb = mem, .disk_mb = disk};
    struct sb *b = sb_new(model, &sp);
    if (b == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "sim: adopting a sandbox");
    /* Files lived only in the old process's memory: an adopted sim sandbox
     * starts with none. */
    *out = HANDLE(b);
    return 0;
}

/* Snapshot file (private to sim): a header line, then per file a line
 * "MODE MTIME PATHLEN DATALEN" followed by the path and data bytes. */
#define SNAP_MAGIC "dsec-sim-snapshot 1"

static int sim_snapshot(void *self, dsec_sandbox *h, const char *path, const char *name,
                        dsec_err *err)
{
    struct sim *s = self;
    struct sb *b = SB(h);
    int rc = -1;
    if (refuse_cap(s, b, s->models[b->model].can_snapshot, "snapshot", err) < 0)
        return -1;
    size_t plen = strlen(path);
    char *tmp = dsec_malloc(plen + 5);
    if (tmp == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "sim: snapshot to %s", path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    /* Written aside and renamed, so a crash never leaves half a snapshot
     * under the name a restore would read. */
    FILE *fp = fopen(tmp, "wb");
    if (fp == NULL) {
        dsec_err_set(err, DSEC_E_IO, errno, "sim: creating snapshot %s", tmp);
        goto out_free;
    }
    bool ok = fprintf(fp, SNAP_MAGIC "\ntype=%s nfiles=%" PRIu32 "\n", s->models[b->model].type,
                      b->nfiles) > 0;
    for (uint32_t i = 0; ok && i < b->nfiles; i++) {
        const struct file *f = &b->files[i];
        size_t dlen = blob_len(f->blob);
        ok = fprintf(fp, "%" PRIu32 " %" PRId64 " %zu %zu\n", f->mode, f->mtime, strlen(f->path),
                     dlen) > 0 &&
             fwrite(f->path, 1, strlen(f->path), fp) == strlen(f->path) &&
             (dlen == 0 || fwrite(f->blob->data, 1, dlen, fp) == dlen);
    }
    int saved = errno;
    if (fclose(fp) != 0 && ok) {
        ok = false;
        saved = errno;
    }
    if (!ok) {
        dsec_err_set(err, DSEC_E_IO, saved, "sim: writing snapshot %s", tmp);
        goto out_unlink;
    }
    if (rename(tmp, path) < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "sim: renaming snapshot to %s", path);
        goto out_unlink;
    }
    rc = 0;
    goto out_free;

out_unlink:
    remove(tmp);
out_free:
    dsec_free(tmp);
    return rc;
}

static int corrupt(const char *path, const char *what, dsec_err *err)
{
    return dsec_err_set(err, DSEC_E_INVALID, 0, "sim: snapshot %s is corrupt (%s)", path, what);
}

/* Read the files of a snapshot into b, which must be empty. */
static int snap_read_files(struct sim *s, struct sb *b, FILE *fp, uint32_t nfiles, const char *path,
                           dsec_err *err)
{
    uint64_t cap = disk_cap(s, b);
    if (nfiles > s->max_files)
        return corrupt(path, "more files than the limit", err);
    if (files_reserve(b, nfiles, err) < 0)
        return -1;
    for (uint32_t i = 0; i < nfiles; i++) {
        uint32_t mode;
        int64_t mtime;
        size_t pl, dl;
        if (fscanf(fp, "%" SCNu32 " %" SCNd64 " %zu %zu", &mode, &mtime, &pl, &dl) != 4 ||
            fgetc(fp) != '\n')
            return corrupt(path, "bad file header", err);
        if (pl == 0 || pl > PATH_MAX_LEN || dl > cap - b->disk_bytes)
            return corrupt(path, "file too large", err);
        char *fpath = dsec_malloc(pl + 1);
        struct blob *bl = dl ? blob_alloc(dl) : NULL;
        if (fpath == NULL || (dl && bl == NULL)) {
            dsec_free(fpath);
            blob_put(bl);
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "sim: restoring %s", path);
        }
        bool ok = fread(fpath, 1, pl, fp) == pl && (dl == 0 || fread(bl->data, 1, dl, fp) == dl);
        fpath[pl] = '\0';
        dsec_err tmp;
        if (!ok || strlen(fpath) != pl || check_path(fpath, false, &tmp) < 0 ||
            (b->nfiles > 0 && strcmp(b->files[b->nfiles - 1].path, fpath) >= 0)) {
            dsec_free(fpath);
            blob_put(bl);
            return corrupt(path, "bad or unordered file entry", err);
        }
        b->files[b->nfiles++] =
            (struct file){.path = fpath, .blob = bl, .mode = mode & 07777, .mtime = mtime};
        b->disk_bytes += dl;
    }
    return 0;
}

static int sim_restore(void *self, const dsec_sandbox_spec *spec, const char *path,
                       dsec_sandbox **out, char **backend_state, dsec_err *err)
{
    struct sim *s = self;
    struct sb *b = NULL;
    char type[TYPE_NAME_MAX + 1];
    uint32_t nfiles;
    int rc = -1;
    if (spec->type == NULL || spec->type[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "sim: the spec names no sandbox type");
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "sim: opening snapshot %s", path);
    if (fscanf(fp, SNAP_MAGIC "\ntype=%32s nfiles=%" SCNu32, type, &nfiles) != 2 ||
        fgetc(fp) != '\n') {
        corrupt(path, "bad header", err);
        goto out_close;
    }
    if (strcmp(type, spec->type) != 0) {
        dsec_err_set(err, DSEC_E_INVALID, 0,
                     "sim: snapshot %s is of a %s sandbox; it cannot restore as %s", path, type,
                     spec->type);
        goto out_close;
    }
    int model = model_get(s, type, err);
    if (model < 0)
        goto out_close;
    if (refuse_cap(s, &(struct sb){.model = (uint8_t)model}, s->models[model].can_snapshot,
                   "restore", err) < 0)
        goto out_close;
    b = sb_new(model, spec);
    if (b == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "sim: restoring %s", path);
        goto out_close;
    }
    if (snap_read_files(s, b, fp, nfiles, path, err) < 0 ||
        state_string(s, b, backend_state, err) < 0)
        goto out_free;
    model_sleep(s, (uint64_t)s->models[model].startup_ms * 1000);
    *out = HANDLE(b);
    b = NULL;
    rc = 0;

out_free:
    sb_free(b);
out_close:
    fclose(fp);
    return rc;
}

const dsec_backend_ops dsec_sim_ops = {
    .type = "sim",
    .init = sim_init,
    .fini = sim_fini,
    .create = sim_create,
    .exec = sim_exec,
    .exec_start = sim_exec_start,
    .file_write = sim_file_write,
    .file_read = sim_file_read,
    .file_list = sim_file_list,
    .file_op = sim_file_op,
    .fork = sim_fork,
    .pause = sim_pause,
    .resume = sim_resume,
    .snapshot = sim_snapshot,
    .restore = sim_restore,
    .destroy = sim_destroy,
    .stats = sim_stats,
    .adopt = sim_adopt,
    .detach = sim_detach,
    .instant = sim_instant,
};
