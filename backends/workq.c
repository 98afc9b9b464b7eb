/* workq.c - fair-queued worker threads: round robin over tenants, then over their sandboxes. */
#define _GNU_SOURCE
#include "backends/workq.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "dsec/alloc.h"

struct job {
    dsec_work_fn fn;
    void *ud;
    struct job *next;
};

struct tenant;

/* One key (sandbox) with jobs queued: a FIFO, in its tenant's rotation. */
struct keyq {
    uint64_t key;
    struct tenant *t;
    struct job *head, *tail;
    struct keyq *hnext; /* hash chain */
    struct keyq *rnext; /* the tenant's rotation */
};

/* One tenant with work queued: a rotation of keys, in the queue's rotation of tenants. */
struct tenant {
    char *name;
    struct keyq *rhead, *rtail;
    struct tenant *hnext;
    struct tenant *rnext;
};

#define NBUCKETS 4096u

struct dsec_workq {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_t *threads;
    int nthreads;
    bool stopping;
    struct tenant *rhead, *rtail; /* tenants with work, in turn */
    struct keyq *keys[NBUCKETS];
    struct tenant *tenants[NBUCKETS];
    uint64_t queued, running, peak, done;
};

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static uint32_t key_bucket(const struct tenant *t, uint64_t key)
{
    uint64_t h = (key ^ (uint64_t)(uintptr_t)t) * 0x9e3779b97f4a7c15ull;
    return (uint32_t)(h >> 40) & (NBUCKETS - 1);
}

/* ---- under mu -------------------------------------------------------------------------------- */

static struct tenant *tenant_get(dsec_workq *q, const char *name)
{
    uint32_t b = (uint32_t)hash_name(name) & (NBUCKETS - 1);
    for (struct tenant *t = q->tenants[b]; t != NULL; t = t->hnext)
        if (strcmp(t->name, name) == 0)
            return t;
    struct tenant *t = dsec_calloc(1, sizeof *t);
    if (t == NULL || (t->name = dsec_strdup(name)) == NULL) {
        dsec_free(t);
        return NULL;
    }
    t->hnext = q->tenants[b];
    q->tenants[b] = t;
    return t;
}

static void tenant_drop(dsec_workq *q, struct tenant *t)
{
    uint32_t b = (uint32_t)hash_name(t->name) & (NBUCKETS - 1);
    struct tenant **pp = &q->tenants[b];
    while (*pp != t)
        pp = &(*pp)->hnext;
    *pp = t->hnext;
    dsec_free(t->name);
    dsec_free(t);
}

static struct keyq *keyq_get(dsec_workq *q, struct tenant *t, uint64_t key, bool *fresh)
{
    uint32_t b = key_bucket(t, key);
    for (struct keyq *k = q->keys[b]; k != NULL; k = k->hnext)
        if (k->key == key && k->t == t) {
            *fresh = false;
            return k;
        }
    struct keyq *k = dsec_calloc(1, sizeof *k);
    if (k == NULL)
        return NULL;
    k->key = key;
    k->t = t;
    k->hnext = q->keys[b];
    q->keys[b] = k;
    *fresh = true;
    return k;
}

static void keyq_drop(dsec_workq *q, struct keyq *k)
{
    struct keyq **pp = &q->keys[key_bucket(k->t, k->key)];
    while (*pp != k)
        pp = &(*pp)->hnext;
    *pp = k->hnext;
    dsec_free(k);
}

/* The next job in fair order, or NULL. */
static struct job *take(dsec_workq *q)
{
    struct tenant *t = q->rhead;
    if (t == NULL)
        return NULL;
    q->rhead = t->rnext;
    if (q->rhead == NULL)
        q->rtail = NULL;
    t->rnext = NULL;
    struct keyq *k = t->rhead;
    t->rhead = k->rnext;
    if (t->rhead == NULL)
        t->rtail = NULL;
    k->rnext = NULL;
    struct job *j = k->head;
    k->head = j->next;
    if (k->head == NULL) {
        k->tail = NULL;
        keyq_drop(q, k);
    } else { /* the key goes to the back of its tenant's turn */
        if (t->rtail != NULL)
            t->rtail->rnext = k;
        else
            t->rhead = k;
        t->rtail = k;
    }
    if (t->rhead == NULL) {
        tenant_drop(q, t);
    } else { /* and the tenant to the back of the queue's */
        if (q->rtail != NULL)
            q->rtail->rnext = t;
        else
            q->rhead = t;
        q->rtail = t;
    }
    q->queued--;
    return j;
}

/* ---- threads ------------------------------------------------------------------------------- */

static void *worker(void *arg)
{
    dsec_workq *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        struct job *j = take(q);
        if (j == NULL) {
            if (q->stopping)
                break;
            pthread_cond_wait(&q->cond, &q->mu);
            continue;
        }
        q->running++;
        pthread_mutex_unlock(&q->mu);
        j->fn(j->ud);
        dsec_free(j);
        pthread_mutex_lock(&q->mu);
        q->running--;
        q->done++;
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

int dsec_workq_submit(dsec_workq *q, const char *tenant, uint64_t key, dsec_work_fn fn, void *ud,
                      dsec_err *err)
{
    struct job *j = dsec_malloc(sizeof *j);
    if (j == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "work queue: a job");
    *j = (struct job){.fn = fn, .ud = ud};
    pthread_mutex_lock(&q->mu);
    if (q->stopping) {
        pthread_mutex_unlock(&q->mu);
        dsec_free(j);
        return dsec_err_set(err, DSEC_E_CLOSED, 0, "work queue: stopping");
    }
    struct tenant *t = tenant_get(q, tenant ? tenant : "");
    bool fresh = false;
    struct keyq *k = t ? keyq_get(q, t, key, &fresh) : NULL;
    if (k == NULL) {
        if (t != NULL && t->rhead == NULL) /* not in the rotation: made just now */
            tenant_drop(q, t);
        pthread_mutex_unlock(&q->mu);
        dsec_free(j);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "work queue: a queue for tenant %s",
                            tenant ? tenant : "");
    }
    if (k->tail != NULL)
        k->tail->next = j;
    else
        k->head = j;
    k->tail = j;
    if (fresh) {
        bool idle = t->rhead == NULL;
        if (t->rtail != NULL)
            t->rtail->rnext = k;
        else
            t->rhead = k;
        t->rtail = k;
        if (idle) {
            if (q->rtail != NULL)
                q->rtail->rnext = t;
            else
                q->rhead = t;
            q->rtail = t;
        }
    }
    if (++q->queued > q->peak)
        q->peak = q->queued;
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->mu);
    return 0;
}

int dsec_workq_new(dsec_workq **out, const char *name, int threads, dsec_err *err)
{
    *out = NULL;
    if (threads < 1 || threads > 256)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "work queue: %d threads (1..256)", threads);
    dsec_workq *q = dsec_calloc(1, sizeof *q);
    if (q == NULL || (q->threads = dsec_calloc((size_t)threads, sizeof *q->threads)) == NULL) {
        dsec_free(q);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "work queue");
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cond, NULL);
    for (int i = 0; i < threads; i++) {
        int e = pthread_create(&q->threads[i], NULL, worker, q);
        if (e != 0) {
            dsec_workq_free(q);
            return dsec_err_set(err, DSEC_E_IO, e, "work queue: starting thread %d of %d", i + 1,
                                threads);
        }
        char tn[24];
        snprintf(tn, sizeof tn, "%.10s-%d", name ? name : "work", i & 0xfff);
        tn[15] = 0; /* pthread names keep 15 characters */
        pthread_setname_np(q->threads[i], tn);
        q->nthreads++;
    }
    *out = q;
    return 0;
}

void dsec_workq_stop(dsec_workq *q)
{
    pthread_mutex_lock(&q->mu);
    bool was = q->stopping;
    q->stopping = true;
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->mu);
    if (was)
        return;
    for (int i = 0; i < q->nthreads; i++)
        pthread_join(q->threads[i], NULL);
    /* with no thread started, queued jobs still run: nothing submitted is lost */
    struct job *j;
    while ((j = take(q)) != NULL) {
        j->fn(j->ud);
        dsec_free(j);
    }
}

void dsec_workq_free(dsec_workq *q)
{
    if (q == NULL)
        return;
    dsec_workq_stop(q);
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->mu);
    dsec_free(q->threads);
    dsec_free(q);
}

void dsec_workq_stats_get(dsec_workq *q, dsec_workq_stats *out)
{
    pthread_mutex_lock(&q->mu);
    *out = (dsec_workq_stats){.queued = q->queued,
                              .running = q->running,
                              .peak_queued = q->peak,
                              .done = q->done,
                              .threads = q->nthreads};
    pthread_mutex_unlock(&q->mu);
}
