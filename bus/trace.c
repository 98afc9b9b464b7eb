/* trace.c - the trace id a thread works for, and each bus's bounded, sampled record of hops. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bus/internal.h"
#include "dsec/alloc.h"

/* A bus's record. The thresholds are atomics so that the common case, a hop
 * that is neither kept nor an error, takes no lock. */
struct dsec__trace {
    pthread_mutex_t mu;            /* ring, cap, next, count */
    _Atomic uint64_t sample_below; /* keep ids whose hash is below; 0: none */
    _Atomic int64_t slow_ns;
    _Atomic uint32_t cap;
    dsec_trace_hop *ring;
    uint32_t next, count;
};

static _Thread_local dsec_trace_scope *tl_scope;
static _Thread_local char tl_default[DSEC_TRACE_ID_MAX + 1]; /* dsec_trace_set_thread */

bool dsec_trace_id_ok(const char *id)
{
    if (id == NULL || id[0] == '\0')
        return false;
    size_t i = 0;
    for (; id[i] != '\0'; i++)
        if (i >= DSEC_TRACE_ID_MAX || (unsigned char)id[i] <= ' ' || (unsigned char)id[i] >= 0x7f)
            return false;
    return true;
}

static int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void dsec_trace_enter(dsec_trace_scope *sc, dsec_actor *actor, const char *trace_id,
                      const char *what, const char *type)
{
    sc->up = tl_scope;
    sc->id = dsec_trace_id_ok(trace_id) ? trace_id : NULL;
    sc->what = what;
    sc->type = type;
    sc->error = false;
    sc->sent[0] = '\0';
    /* Only a scope that may become a hop needs the clock. */
    sc->actor =
        actor != NULL && sc->id != NULL &&
                atomic_load_explicit(&dsec_actor_bus(actor)->trace, memory_order_acquire) != NULL
            ? actor
            : NULL;
    sc->start_ns = sc->actor != NULL ? wall_ns() : 0;
    tl_scope = sc;
}

const char *dsec_trace_current(void)
{
    if (tl_scope != NULL)
        return tl_scope->id;
    return tl_default[0] != '\0' ? tl_default : NULL;
}

int dsec_trace_set_thread(const char *trace_id)
{
    if (trace_id == NULL) {
        tl_default[0] = '\0';
        return 0;
    }
    if (!dsec_trace_id_ok(trace_id))
        return -1;
    snprintf(tl_default, sizeof tl_default, "%s", trace_id);
    return 0;
}

/* FNV-1a, then a finaliser so that nearby ids spread over the whole range:
 * every process computes the same value for an id, so a sampled request is
 * kept everywhere it went. */
static uint64_t id_hash(const char *id)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = id; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static void copy(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src != NULL ? src : "");
}

static void record(struct dsec__trace *t, const dsec_trace_scope *sc, int64_t end_ns)
{
    const char *kept;
    if (sc->error)
        kept = "error";
    else if (end_ns - sc->start_ns >= atomic_load_explicit(&t->slow_ns, memory_order_relaxed))
        kept = "slow";
    else if (id_hash(sc->id) < atomic_load_explicit(&t->sample_below, memory_order_relaxed))
        kept = "sample";
    else
        return;
    pthread_mutex_lock(&t->mu);
    if (t->ring != NULL && t->cap > 0) {
        dsec_trace_hop *h = &t->ring[t->next];
        copy(h->trace_id, sizeof h->trace_id, sc->id);
        copy(h->actor, sizeof h->actor, dsec_actor_name(sc->actor));
        copy(h->subject, sizeof h->subject, sc->what);
        copy(h->type, sizeof h->type, sc->type);
        copy(h->sent, sizeof h->sent, sc->sent);
        copy(h->kept, sizeof h->kept, kept);
        h->error = sc->error;
        h->start_ns = sc->start_ns;
        h->end_ns = end_ns;
        t->next = (t->next + 1) % t->cap;
        if (t->count < t->cap)
            t->count++;
    }
    pthread_mutex_unlock(&t->mu);
}

void dsec_trace_leave(dsec_trace_scope *sc)
{
    tl_scope = sc->up;
    if (sc->actor == NULL)
        return;
    struct dsec__trace *t =
        atomic_load_explicit(&dsec_actor_bus(sc->actor)->trace, memory_order_acquire);
    if (t != NULL)
        record(t, sc, wall_ns());
}

void dsec_trace_scope_own(dsec_trace_scope *sc, dsec_trace_own *own)
{
    copy(own->id, sizeof own->id, sc->id);
    copy(own->what, sizeof own->what, sc->what);
    copy(own->type, sizeof own->type, sc->type);
    sc->id = sc->id != NULL ? own->id : NULL;
    sc->what = sc->what != NULL ? own->what : NULL;
    sc->type = sc->type != NULL ? own->type : NULL;
}

/* What the innermost scope sent: a message of its own trace (inherited or
 * set to the same id) tells its outcome. */
void dsec__trace_note_send(const dsec_hdr *hdr, const char *err_code)
{
    dsec_trace_scope *sc = tl_scope;
    if (sc == NULL || sc->id == NULL)
        return;
    if (hdr != NULL && hdr->trace_id != NULL && hdr->trace_id != sc->id &&
        strcmp(hdr->trace_id, sc->id) != 0)
        return;
    const char *type = hdr != NULL ? hdr->type : NULL;
    if (err_code != NULL || (type != NULL && strcmp(type, DSEC_TYPE_ERROR) == 0))
        sc->error = true;
    if (sc->sent[0] == '\0' && type != NULL)
        copy(sc->sent, sizeof sc->sent, type);
}

dsec_actor *dsec__trace_actor(void)
{
    return tl_scope != NULL ? tl_scope->actor : NULL;
}

void dsec__trace_note_error(dsec_actor *a)
{
    for (dsec_trace_scope *sc = tl_scope; sc != NULL; sc = sc->up)
        if (sc->actor == a) {
            sc->error = true;
            return;
        }
}

int dsec_bus_trace_conf(dsec_bus *bus, const dsec_trace_conf *conf, dsec_err *err)
{
    if (conf == NULL || !(conf->sample_rate >= 0.0 && conf->sample_rate <= 1.0))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "trace: sample_rate must be between 0 and 1");
    if (conf->ring > 1000000)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "trace: ring %u is over 1000000 hops",
                            conf->ring);
    struct dsec__trace *t = atomic_load_explicit(&bus->trace, memory_order_acquire);
    if (t == NULL) {
        t = dsec_calloc(1, sizeof *t);
        if (t == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "trace: out of memory");
        pthread_mutex_init(&t->mu, NULL);
        struct dsec__trace *none = NULL;
        if (!atomic_compare_exchange_strong(&bus->trace, &none, t)) {
            pthread_mutex_destroy(&t->mu);
            dsec_free(t);
            t = none;
        }
    }
    dsec_trace_hop *ring = NULL;
    if (conf->ring > 0 && (ring = dsec_calloc(conf->ring, sizeof *ring)) == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "trace: out of memory for %u hops", conf->ring);
    uint64_t below = conf->sample_rate >= 1.0 ? UINT64_MAX : (uint64_t)ldexp(conf->sample_rate, 64);
    pthread_mutex_lock(&t->mu);
    dsec_trace_hop *old = t->ring;
    t->ring = ring;
    t->next = t->count = 0;
    atomic_store(&t->cap, conf->ring);
    atomic_store(&t->sample_below, below);
    atomic_store(&t->slow_ns, (int64_t)conf->slow_ms * 1000000);
    pthread_mutex_unlock(&t->mu);
    dsec_free(old);
    return 0;
}

int dsec_bus_trace_hops(dsec_bus *bus, const char *trace_id, dsec_trace_hop **out, size_t *n,
                        dsec_err *err)
{
    *out = NULL;
    *n = 0;
    struct dsec__trace *t = atomic_load_explicit(&bus->trace, memory_order_acquire);
    if (t == NULL || trace_id == NULL)
        return 0;
    pthread_mutex_lock(&t->mu);
    size_t found = 0;
    uint32_t first = (t->next + t->cap - t->count) % (t->cap ? t->cap : 1);
    for (uint32_t k = 0; k < t->count; k++)
        if (strcmp(t->ring[(first + k) % t->cap].trace_id, trace_id) == 0)
            found++;
    if (found > 0) {
        *out = dsec_malloc(found * sizeof **out);
        if (*out == NULL) {
            pthread_mutex_unlock(&t->mu);
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "trace: out of memory");
        }
        for (uint32_t k = 0; k < t->count; k++) {
            const dsec_trace_hop *h = &t->ring[(first + k) % t->cap];
            if (strcmp(h->trace_id, trace_id) == 0)
                (*out)[(*n)++] = *h;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return 0;
}

void dsec__trace_free(dsec_bus *bus)
{
    struct dsec__trace *t = atomic_load(&bus->trace);
    if (t == NULL)
        return;
    pthread_mutex_destroy(&t->mu);
    dsec_free(t->ring);
    dsec_free(t);
    atomic_store(&bus->trace, NULL);
}
