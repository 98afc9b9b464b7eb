/* node-results.c - finished commands' answers by (sandbox, request id), bounded by age and bytes. */
#include "actors/node-results.h"

#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "dsec/alloc.h"

#define NBUCKETS 4096u

/* One answer; its strings and output live in the same allocation, after the struct. */
struct entry {
    struct entry *hnext;       /* hash chain */
    struct entry *older, *newer; /* age list */
    uint64_t hash, born_ms;
    size_t bytes;
    uint8_t hash_req[32]; /* the request that ran */
    char *sbx, *req_id;
    dsec_msg_exec_result res;
};

struct dsec_results {
    pthread_mutex_t mu;
    struct entry *buckets[NBUCKETS];
    struct entry *oldest, *newest;
    uint64_t budget, ttl_ms, bytes, entries, hits, evicted;
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t key_hash(const char *sbx, const char *req_id)
{
    uint64_t h = 1469598103934665603ull;
    for (const char *p = sbx; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
    for (const char *p = req_id; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ull;
    return h;
}

int dsec_results_new(dsec_results **out, uint64_t budget_bytes, uint64_t ttl_ms, dsec_err *err)
{
    dsec_results *r = dsec_calloc(1, sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "the node's kept command answers");
    pthread_mutex_init(&r->mu, NULL);
    r->budget = budget_bytes;
    r->ttl_ms = ttl_ms;
    *out = r;
    return 0;
}

/* Out of the table and the age list. Under mu. */
static void unlink_entry(dsec_results *r, struct entry *e)
{
    struct entry **pp = &r->buckets[e->hash & (NBUCKETS - 1)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    if (e->older != NULL)
        e->older->newer = e->newer;
    else
        r->oldest = e->newer;
    if (e->newer != NULL)
        e->newer->older = e->older;
    else
        r->newest = e->older;
    r->bytes -= e->bytes;
    r->entries--;
    dsec_free(e);
}

/* Drop what is too old, then the oldest until bytes fit. Under mu. */
static void trim(dsec_results *r, uint64_t now, size_t room)
{
    while (r->oldest != NULL &&
           (now - r->oldest->born_ms > r->ttl_ms || r->bytes + room > r->budget)) {
        unlink_entry(r, r->oldest);
        r->evicted++;
    }
}

static struct entry *find(dsec_results *r, uint64_t h, const char *sbx, const char *req_id)
{
    for (struct entry *e = r->buckets[h & (NBUCKETS - 1)]; e != NULL; e = e->hnext)
        if (e->hash == h && strcmp(e->sbx, sbx) == 0 && strcmp(e->req_id, req_id) == 0)
            return e;
    return NULL;
}

void dsec_results_put(dsec_results *r, const char *sbx, const char *req_id,
                      const uint8_t hash[32], const dsec_msg_exec_result *res)
{
    size_t ls = strlen(sbx) + 1, lr = strlen(req_id) + 1, li = strlen(res->id) + 1;
    size_t bytes = sizeof(struct entry) + ls + lr + li + res->stdout_data.len + res->stderr_data.len;
    if (bytes > r->budget)
        return;
    struct entry *e = dsec_malloc(bytes);
    if (e == NULL)
        return;
    char *p = (char *)(e + 1);
    *e = (struct entry){.hash = key_hash(sbx, req_id), .bytes = bytes, .res = *res};
    memcpy(e->hash_req, hash, sizeof e->hash_req);
    e->sbx = memcpy(p, sbx, ls), p += ls;
    e->req_id = memcpy(p, req_id, lr), p += lr;
    e->res.id = memcpy(p, res->id, li), p += li;
    e->res.stdout_data.ptr = res->stdout_data.len ? memcpy(p, res->stdout_data.ptr, res->stdout_data.len) : NULL;
    p += res->stdout_data.len;
    e->res.stderr_data.ptr = res->stderr_data.len ? memcpy(p, res->stderr_data.ptr, res->stderr_data.len) : NULL;
    pthread_mutex_lock(&r->mu);
    uint64_t now = now_ms();
    struct entry *old = find(r, e->hash, sbx, req_id);
    if (old != NULL)
        unlink_entry(r, old);
    trim(r, now, bytes);
    e->born_ms = now;
    e->hnext = r->buckets[e->hash & (NBUCKETS - 1)];
    r->buckets[e->hash & (NBUCKETS - 1)] = e;
    e->older = r->newest;
    if (r->newest != NULL)
        r->newest->newer = e;
    else
        r->oldest = e;
    r->newest = e;
    r->bytes += bytes;
    r->entries++;
    pthread_mutex_unlock(&r->mu);
}

bool dsec_results_get(dsec_results *r, const char *sbx, const char *req_id,
                      dsec_msg_exec_result *out, uint8_t hash[32], void **hold)
{
    /* a copy: answering may take a while, and the entry may be evicted meanwhile */
    pthread_mutex_lock(&r->mu);
    trim(r, now_ms(), 0);
    struct entry *e = find(r, key_hash(sbx, req_id), sbx, req_id);
    struct entry *c = e != NULL ? dsec_malloc(e->bytes) : NULL;
    if (c != NULL) {
        memcpy(c, e, e->bytes);
        ptrdiff_t d = (char *)c - (char *)e;
        c->sbx += d;
        c->req_id += d;
        c->res.id += d;
        if (c->res.stdout_data.ptr != NULL)
            c->res.stdout_data.ptr = (const uint8_t *)c->res.stdout_data.ptr + d;
        if (c->res.stderr_data.ptr != NULL)
            c->res.stderr_data.ptr = (const uint8_t *)c->res.stderr_data.ptr + d;
        r->hits++;
        *out = c->res;
        memcpy(hash, c->hash_req, sizeof c->hash_req);
        *hold = c;
    }
    pthread_mutex_unlock(&r->mu);
    return c != NULL;
}

void dsec_results_release(void *hold) { dsec_free(hold); }

void dsec_results_drop(dsec_results *r, const char *sbx)
{
    pthread_mutex_lock(&r->mu);
    for (struct entry *e = r->oldest, *next; e != NULL; e = next) {
        next = e->newer;
        if (strcmp(e->sbx, sbx) == 0)
            unlink_entry(r, e);
    }
    pthread_mutex_unlock(&r->mu);
}

void dsec_results_stats_get(dsec_results *r, dsec_results_stats *out)
{
    pthread_mutex_lock(&r->mu);
    *out = (dsec_results_stats){
        .entries = r->entries, .bytes = r->bytes, .hits = r->hits, .evicted = r->evicted};
    pthread_mutex_unlock(&r->mu);
}

void dsec_results_free(dsec_results *r)
{
    if (r == NULL)
        return;
    while (r->oldest != NULL)
        unlink_entry(r, r->oldest);
    pthread_mutex_destroy(&r->mu);
    dsec_free(r);
}
