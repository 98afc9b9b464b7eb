/* node-results.c - finished commands' answers by (sandbox, request id), bounded by age and bytes,
 * kept in memory and, with a directory, in an append-only log so that they outlive the process. */
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np */
#include "actors/node-results.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "dsec/alloc.h"

#define NBUCKETS 4096u
#define REQ_MAX 64u  /* req_id bytes (docs/protocol.md) */
#define SBX_MAX 255u /* sandbox id bytes a record can name */
#define OUT_MAX (1u << 30)
#define LOG_LIMIT(r) (3 * (r)->budget) /* the log is rewritten past this */

enum { E_RUNNING, E_DONE, E_LOST };

/* One answer; its strings and output live in the same allocation, after the struct. */
struct entry {
    struct entry *hnext;         /* hash chain */
    struct entry *older, *newer; /* age list (done, lost) or the running list */
    uint64_t hash, born_ms;      /* born: wall clock, when the command finished (or started) */
    size_t bytes;
    uint8_t state;         /* E_* */
    _Atomic uint32_t refs; /* the table's, and a log rewrite's while it writes it (mu) */
    uint8_t hash_req[32];  /* the request that ran */
    char *sbx, *req_id;
    dsec_msg_exec_result res;
};

struct dsec_results {
    pthread_mutex_t mu; /* the table */
    struct entry *buckets[NBUCKETS];
    struct entry *oldest, *newest; /* answers and lost commands, oldest first */
    struct entry *running;         /* named commands running now (a list by newer) */
    uint64_t budget, ttl_ms, bytes, entries, hits, evicted, lost, loaded;
    _Atomic uint64_t persist_errors;
    /* The log: appends share it (O_APPEND keeps each record whole), a rewrite takes it alone.
     * Taken before mu, never while holding it. */
    pthread_rwlock_t log_lk;
    int fd; /* -1: memory only, or the log could not be opened */
    _Atomic uint64_t log_bytes;
    char *dir;
    bool compacting;        /* a rewrite of the log runs (mu) */
    bool compactor_started; /* compactor is a thread to join */
    pthread_t compactor;
};

/* A log record: this header, then the sandbox id, the req_id, stdout, stderr. */
enum { R_BEGIN = 1, R_DONE, R_LOST, R_ABANDON, R_DROP };
enum {
    FL_OUT_TRUNC = 1,
    FL_ERR_TRUNC = 2,
    FL_TIMED_OUT = 4,
    FL_INTERRUPTED = 8,
    FL_SESSION_ENDED = 16
};
#define REC_MAGIC 0x32525344u /* "DSR2" */
struct rec {
    uint32_t magic;
    uint8_t kind, flags, sbx_len, req_len;
    uint32_t out_len, err_len;
    uint64_t born_ms; /* wall clock: started (begin), finished (done), found lost (lost) */
    uint8_t hash[32];
    int64_t exit_code, signal;
    uint64_t duration_us, cpu_us, peak_rss_kb;
};

static uint64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
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

/* ---- the log ------------------------------------------------------------------------ */

static bool names_ok(const char *sbx, const char *req_id)
{
    size_t ls = strlen(sbx), lr = req_id ? strlen(req_id) : 1;
    return ls >= 1 && ls <= SBX_MAX && lr >= 1 && lr <= REQ_MAX;
}

/* One record onto fd, whole: writev, then the rest should a signal cut it short. */
static int write_rec(int fd, const struct rec *h, const char *sbx, const char *req_id,
                     const void *out, const void *err_data)
{
    struct iovec v[5] = {{(void *)h, sizeof *h},
                         {(void *)sbx, h->sbx_len},
                         {(void *)req_id, h->req_len},
                         {(void *)out, h->out_len},
                         {(void *)err_data, h->err_len}};
    int iv = 0;
    while (iv < 5) {
        ssize_t w = writev(fd, v + iv, 5 - iv);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        size_t done = (size_t)w;
        while (iv < 5 && done >= v[iv].iov_len)
            done -= v[iv++].iov_len;
        if (iv < 5) {
            v[iv].iov_base = (char *)v[iv].iov_base + done;
            v[iv].iov_len -= done;
        }
    }
    return 0;
}

static void rec_fill(struct rec *h, int kind, const char *sbx, const char *req_id,
                     const uint8_t hash[32], uint64_t born_ms, const dsec_msg_exec_result *res)
{
    *h = (struct rec){.magic = REC_MAGIC,
                      .kind = (uint8_t)kind,
                      .sbx_len = (uint8_t)strlen(sbx),
                      .req_len = (uint8_t)(req_id ? strlen(req_id) : 0),
                      .born_ms = born_ms};
    if (hash != NULL)
        memcpy(h->hash, hash, sizeof h->hash);
    if (res == NULL)
        return;
    h->exit_code = res->exit_code;
    h->signal = res->signal;
    h->duration_us = res->duration_us;
    h->cpu_us = res->cpu_us;
    h->peak_rss_kb = res->peak_rss_kb;
    h->out_len = (uint32_t)res->stdout_data.len;
    h->err_len = (uint32_t)res->stderr_data.len;
    h->flags =
        (uint8_t)((res->stdout_truncated ? FL_OUT_TRUNC : 0) |
                  (res->stderr_truncated ? FL_ERR_TRUNC : 0) | (res->timed_out ? FL_TIMED_OUT : 0) |
                  (res->interrupted ? FL_INTERRUPTED : 0) |
                  (res->session_ended ? FL_SESSION_ENDED : 0));
}

/* Append one record to the log (no-op in memory only). The caller holds log_lk shared, and
 * keeps it until the table holds what the record says: a rewrite of the log sees both or
 * neither (a record before its snapshot's mark is in the table it copies). */
static void log_append(dsec_results *r, int kind, const char *sbx, const char *req_id,
                       const uint8_t hash[32], uint64_t born_ms, const dsec_msg_exec_result *res)
{
    if (r->dir == NULL)
        return;
    struct rec h;
    rec_fill(&h, kind, sbx, req_id, hash, born_ms, res);
    if (r->fd < 0 || write_rec(r->fd, &h, sbx, req_id, res ? res->stdout_data.ptr : NULL,
                               res ? res->stderr_data.ptr : NULL) < 0)
        atomic_fetch_add(&r->persist_errors, 1);
    else
        atomic_fetch_add(&r->log_bytes, sizeof h + h.sbx_len + h.req_len + h.out_len + h.err_len);
}

/* ---- the table ---------------------------------------------------------------------- */

int dsec_results_new(dsec_results **out, uint64_t budget_bytes, uint64_t ttl_ms, const char *dir,
                     dsec_err *err)
{
    dsec_results *r = dsec_calloc(1, sizeof *r);
    if (r == NULL || (dir != NULL && (r->dir = dsec_strdup(dir)) == NULL)) {
        dsec_free(r);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "the node's kept command answers");
    }
    if (dir != NULL && mkdir(dir, 0700) < 0 && errno != EEXIST) {
        int e = errno;
        dsec_free(r->dir);
        dsec_free(r);
        return dsec_err_set(err, DSEC_E_IO, e, "creating %s (kept command answers)", dir);
    }
    pthread_mutex_init(&r->mu, NULL);
    /* a rewrite's moments with the log alone come even while appends never stop */
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&r->log_lk, &ra);
    pthread_rwlockattr_destroy(&ra);
    r->fd = -1;
    r->budget = budget_bytes;
    r->ttl_ms = ttl_ms;
    *out = r;
    return 0;
}

uint64_t dsec_results_ttl_ms(const dsec_results *r)
{
    return r->ttl_ms;
}

static void entry_unref(struct entry *e)
{
    if (atomic_fetch_sub(&e->refs, 1) == 1)
        dsec_free(e);
}

static void list_del(struct entry **head, struct entry **tail, struct entry *e)
{
    if (e->older != NULL)
        e->older->newer = e->newer;
    else
        *head = e->newer;
    if (e->newer != NULL)
        e->newer->older = e->older;
    else if (tail != NULL)
        *tail = e->older;
}

/* Out of the table and its list, and freed. Under mu. */
static void unlink_entry(dsec_results *r, struct entry *e)
{
    struct entry **pp = &r->buckets[e->hash & (NBUCKETS - 1)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    if (e->state == E_RUNNING) {
        list_del(&r->running, NULL, e);
    } else {
        list_del(&r->oldest, &r->newest, e);
        r->bytes -= e->bytes;
        r->entries--;
        if (e->state == E_LOST)
            r->lost--;
    }
    entry_unref(e);
}

/* Drop what is too old, then the oldest until bytes fit. Under mu. */
static void trim(dsec_results *r, uint64_t now, size_t room)
{
    while (r->oldest != NULL &&
           ((now > r->oldest->born_ms && now - r->oldest->born_ms > r->ttl_ms) ||
            r->bytes + room > r->budget)) {
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

static size_t entry_bytes(const char *sbx, const char *req_id, const dsec_msg_exec_result *res)
{
    return sizeof(struct entry) + strlen(sbx) + 1 + strlen(req_id) + 1 +
           (res != NULL ? strlen(res->id) + 1 + res->stdout_data.len + res->stderr_data.len : 0);
}

/* A new entry (res NULL: running or lost), not yet in the table. */
static struct entry *entry_new(int state, const char *sbx, const char *req_id,
                               const uint8_t hash[32], const dsec_msg_exec_result *res,
                               uint64_t born_ms)
{
    size_t bytes = entry_bytes(sbx, req_id, res);
    size_t ls = strlen(sbx) + 1, lr = strlen(req_id) + 1;
    struct entry *e = dsec_malloc(bytes);
    if (e == NULL)
        return NULL;
    char *p = (char *)(e + 1);
    *e = (struct entry){.hash = key_hash(sbx, req_id),
                        .bytes = bytes,
                        .born_ms = born_ms,
                        .state = (uint8_t)state,
                        .refs = 1};
    memcpy(e->hash_req, hash, sizeof e->hash_req);
    e->sbx = memcpy(p, sbx, ls), p += ls;
    e->req_id = memcpy(p, req_id, lr), p += lr;
    if (res == NULL)
        return e;
    size_t li = strlen(res->id) + 1;
    e->res = *res;
    e->res.id = memcpy(p, res->id, li), p += li;
    e->res.stdout_data.ptr =
        res->stdout_data.len ? memcpy(p, res->stdout_data.ptr, res->stdout_data.len) : NULL;
    p += res->stdout_data.len;
    e->res.stderr_data.ptr =
        res->stderr_data.len ? memcpy(p, res->stderr_data.ptr, res->stderr_data.len) : NULL;
    return e;
}

/* Into the table, replacing what it held for the key: an answer or a lost command as the
 * newest (making room first), a running command on the running list. Under mu. */
static void insert(dsec_results *r, struct entry *e, uint64_t now)
{
    struct entry *old = find(r, e->hash, e->sbx, e->req_id);
    if (old != NULL)
        unlink_entry(r, old);
    e->hnext = r->buckets[e->hash & (NBUCKETS - 1)];
    r->buckets[e->hash & (NBUCKETS - 1)] = e;
    e->older = NULL;
    if (e->state == E_RUNNING) {
        e->newer = r->running;
        if (r->running != NULL)
            r->running->older = e;
        r->running = e;
        return;
    }
    trim(r, now, e->bytes);
    e->older = r->newest;
    e->newer = NULL;
    if (r->newest != NULL)
        r->newest->newer = e;
    else
        r->oldest = e;
    r->newest = e;
    r->bytes += e->bytes;
    r->entries++;
    if (e->state == E_LOST)
        r->lost++;
}

static void forget(dsec_results *r, const char *sbx, const char *req_id)
{
    struct entry *e = find(r, key_hash(sbx, req_id), sbx, req_id);
    if (e != NULL)
        unlink_entry(r, e);
}

static void forget_sbx(dsec_results *r, const char *sbx)
{
    for (struct entry *e = r->oldest, *next; e != NULL; e = next) {
        next = e->newer;
        if (strcmp(e->sbx, sbx) == 0)
            unlink_entry(r, e);
    }
    for (struct entry *e = r->running, *next; e != NULL; e = next) {
        next = e->newer;
        if (strcmp(e->sbx, sbx) == 0)
            unlink_entry(r, e);
    }
}

/* Rewrite the log with what the table holds, without holding up the appends and lookups of
 * other commands while the bulk is written: the live entries are pinned (a reference each)
 * and the log's length noted, both in one short moment; the pinned entries go to a new file
 * without any lock; then, with appends held off again, what was appended since the mark is
 * copied after them and the new file replaces the log. False when it could not be done (the
 * log stays as it was). */
static bool compact(dsec_results *r)
{
    char path[4096], tmp[4096];
    snprintf(path, sizeof path, "%s/answers.log", r->dir);
    snprintf(tmp, sizeof tmp, "%s/answers.log.tmp", r->dir);
    /* 1. the snapshot */
    pthread_rwlock_wrlock(&r->log_lk);
    pthread_mutex_lock(&r->mu);
    size_t n = 0, cap = r->entries + 1;
    for (const struct entry *e = r->running; e != NULL; e = e->newer)
        cap++;
    struct entry **v = dsec_malloc(cap * sizeof *v);
    for (int pass = 0; pass < 2 && v != NULL; pass++)
        for (struct entry *e = pass ? r->running : r->oldest; e != NULL; e = e->newer) {
            atomic_fetch_add(&e->refs, 1);
            v[n++] = e;
        }
    pthread_mutex_unlock(&r->mu);
    struct stat st;
    off_t mark = r->fd >= 0 && fstat(r->fd, &st) == 0 ? st.st_size : -1;
    pthread_rwlock_unlock(&r->log_lk);
    /* 2. the bulk, with nothing held */
    int fd = v != NULL ? open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
    bool ok = fd >= 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < n && ok; i++) {
        const struct entry *e = v[i];
        struct rec h;
        rec_fill(&h,
                 e->state == E_RUNNING ? R_BEGIN
                 : e->state == E_LOST  ? R_LOST
                                       : R_DONE,
                 e->sbx, e->req_id, e->hash_req, e->born_ms, e->state == E_DONE ? &e->res : NULL);
        ok = write_rec(fd, &h, e->sbx, e->req_id, e->res.stdout_data.ptr, e->res.stderr_data.ptr) ==
             0;
        bytes += sizeof h + h.sbx_len + h.req_len + h.out_len + h.err_len;
    }
    pthread_mutex_lock(&r->mu); /* references change under mu only: lookups copy entries */
    for (size_t i = 0; i < n; i++)
        entry_unref(v[i]);
    pthread_mutex_unlock(&r->mu);
    dsec_free(v);
    /* 3. what was appended since the mark: most of it while appends go on (a reader sees an
     * append's bytes once the file's size covers them), the rest with them held off; then
     * the switch */
    int in = ok && mark >= 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    off_t at = mark;
    ok = ok && (mark < 0 || in >= 0);
    for (int held = 0; held < 2; held++) {
        if (held)
            pthread_rwlock_wrlock(&r->log_lk);
        char buf[65536];
        ssize_t k = 0;
        while (ok && in >= 0 && (k = pread(in, buf, sizeof buf, at)) > 0) {
            ok = write(fd, buf, (size_t)k) == k;
            at += k;
            bytes += (uint64_t)k;
        }
        ok = ok && k >= 0;
    }
    if (in >= 0)
        close(in);
    if (fd >= 0 && close(fd) < 0)
        ok = false;
    if (ok && rename(tmp, path) == 0) {
        if (r->fd >= 0)
            close(r->fd);
        r->fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
        r->log_bytes = bytes;
    } else {
        unlink(tmp);
        ok = false;
        if (r->fd < 0) /* start: appends go on after what is there */
            r->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    }
    pthread_rwlock_unlock(&r->log_lk);
    return ok;
}

static void *compactor(void *arg)
{
    dsec_results *r = arg;
    if (!compact(r))
        atomic_fetch_add(&r->persist_errors, 1);
    pthread_mutex_lock(&r->mu);
    r->compacting = false;
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Past LOG_LIMIT of appends, the log is rewritten on a thread of its own (one at a time). */
static void maybe_compact(dsec_results *r)
{
    if (r->dir == NULL || r->log_bytes <= LOG_LIMIT(r))
        return;
    pthread_mutex_lock(&r->mu);
    if (!r->compacting) {
        if (r->compactor_started) /* the last one, done: it cleared compacting as it ended */
            pthread_join(r->compactor, NULL);
        /* it takes mu only once this returns (it takes the log, then mu) */
        r->compacting = r->compactor_started =
            pthread_create(&r->compactor, NULL, compactor, r) == 0;
        if (!r->compacting)
            atomic_fetch_add(&r->persist_errors, 1);
    }
    pthread_mutex_unlock(&r->mu);
}

void dsec_results_begin(dsec_results *r, const char *sbx, const char *req_id,
                        const uint8_t hash[32])
{
    if (r->dir == NULL || !names_ok(sbx, req_id))
        return;
    uint64_t now = wall_ms();
    struct entry *e = entry_new(E_RUNNING, sbx, req_id, hash, NULL, now);
    pthread_rwlock_rdlock(&r->log_lk);
    /* logged all the same without memory for e: a rewrite of the log before its answer
     * forgets it */
    log_append(r, R_BEGIN, sbx, req_id, hash, now, NULL);
    pthread_mutex_lock(&r->mu);
    if (e != NULL)
        insert(r, e, now);
    pthread_mutex_unlock(&r->mu);
    pthread_rwlock_unlock(&r->log_lk);
}

void dsec_results_abandon(dsec_results *r, const char *sbx, const char *req_id)
{
    if (r->dir == NULL || !names_ok(sbx, req_id))
        return;
    pthread_rwlock_rdlock(&r->log_lk);
    log_append(r, R_ABANDON, sbx, req_id, NULL, wall_ms(), NULL);
    pthread_mutex_lock(&r->mu);
    forget(r, sbx, req_id);
    pthread_mutex_unlock(&r->mu);
    pthread_rwlock_unlock(&r->log_lk);
}

void dsec_results_put(dsec_results *r, const char *sbx, const char *req_id, const uint8_t hash[32],
                      const dsec_msg_exec_result *res)
{
    uint64_t now = wall_ms();
    bool fits = entry_bytes(sbx, req_id, res) <= r->budget && res->stdout_data.len < OUT_MAX &&
                res->stderr_data.len < OUT_MAX && names_ok(sbx, req_id);
    struct entry *e = fits ? entry_new(E_DONE, sbx, req_id, hash, res, now) : NULL;
    if (e == NULL) {
        dsec_results_abandon(r, sbx, req_id);
        return;
    }
    /* logged before it can be collected: a restart finds the answer, or its start alone */
    pthread_rwlock_rdlock(&r->log_lk);
    log_append(r, R_DONE, sbx, req_id, hash, now, res);
    pthread_mutex_lock(&r->mu);
    insert(r, e, now);
    pthread_mutex_unlock(&r->mu);
    pthread_rwlock_unlock(&r->log_lk);
    maybe_compact(r);
}

int dsec_results_get(dsec_results *r, const char *sbx, const char *req_id,
                     dsec_msg_exec_result *out, uint8_t hash[32], void **hold)
{
    /* a copy: answering may take a while, and the entry may be evicted meanwhile */
    int what = DSEC_RESULTS_NONE;
    *hold = NULL;
    pthread_mutex_lock(&r->mu);
    trim(r, wall_ms(), 0);
    struct entry *e = find(r, key_hash(sbx, req_id), sbx, req_id);
    if (e != NULL && e->state == E_LOST) {
        memcpy(hash, e->hash_req, sizeof e->hash_req);
        r->hits++;
        what = DSEC_RESULTS_LOST;
    }
    struct entry *c = e != NULL && e->state == E_DONE ? dsec_malloc(e->bytes) : NULL;
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
        what = DSEC_RESULTS_ANSWER;
    }
    pthread_mutex_unlock(&r->mu);
    return what;
}

void dsec_results_release(void *hold)
{
    dsec_free(hold);
}

void dsec_results_drop(dsec_results *r, const char *sbx)
{
    pthread_rwlock_rdlock(&r->log_lk);
    if (r->dir != NULL && names_ok(sbx, NULL))
        log_append(r, R_DROP, sbx, NULL, NULL, wall_ms(), NULL);
    pthread_mutex_lock(&r->mu);
    forget_sbx(r, sbx);
    pthread_mutex_unlock(&r->mu);
    pthread_rwlock_unlock(&r->log_lk);
}

/* ---- reading back at start ------------------------------------------------------------ */

/* Replay the log into the table, in the order it was written: answers evicted by the budget
 * then are evicted again (with this start's budget), abandoned and dropped ones go. Stops at
 * the first record that is torn or unreadable (a crash mid-append leaves one at the end). */
static void replay(dsec_results *r, FILE *f, uint64_t now)
{
    struct rec h;
    char sbx[SBX_MAX + 1], req[REQ_MAX + 1];
    uint8_t *buf = NULL;
    size_t cap = 0;
    while (fread(&h, sizeof h, 1, f) == 1) {
        if (h.magic != REC_MAGIC || h.kind < R_BEGIN || h.kind > R_DROP || h.sbx_len == 0 ||
            h.req_len > REQ_MAX || (h.kind != R_DROP && h.req_len == 0) || h.out_len >= OUT_MAX ||
            h.err_len >= OUT_MAX)
            break;
        size_t body = (size_t)h.out_len + h.err_len;
        if (fread(sbx, 1, h.sbx_len, f) != h.sbx_len || fread(req, 1, h.req_len, f) != h.req_len)
            break;
        sbx[h.sbx_len] = '\0';
        req[h.req_len] = '\0';
        if (strlen(sbx) != h.sbx_len || strlen(req) != h.req_len)
            break;
        if (body > cap) {
            uint8_t *nb = dsec_realloc(buf, body);
            if (nb == NULL)
                break;
            buf = nb;
            cap = body;
        }
        if (body > 0 && fread(buf, 1, body, f) != body)
            break;
        struct entry *e = NULL;
        pthread_mutex_lock(&r->mu);
        switch (h.kind) {
        case R_BEGIN:
            e = entry_new(E_RUNNING, sbx, req, h.hash, NULL, h.born_ms);
            break;
        case R_LOST:
            e = entry_new(E_LOST, sbx, req, h.hash, NULL, h.born_ms);
            break;
        case R_DONE: {
            dsec_msg_exec_result res = {.id = sbx,
                                        .exit_code = h.exit_code,
                                        .signal = h.signal,
                                        .stdout_data = {buf, h.out_len},
                                        .stderr_data = {buf + h.out_len, h.err_len},
                                        .stdout_truncated = h.flags & FL_OUT_TRUNC,
                                        .stderr_truncated = h.flags & FL_ERR_TRUNC,
                                        .timed_out = h.flags & FL_TIMED_OUT,
                                        .interrupted = h.flags & FL_INTERRUPTED,
                                        .session_ended = h.flags & FL_SESSION_ENDED,
                                        .duration_us = h.duration_us,
                                        .cpu_us = h.cpu_us,
                                        .peak_rss_kb = h.peak_rss_kb};
            if (entry_bytes(sbx, req, &res) <= r->budget)
                e = entry_new(E_DONE, sbx, req, h.hash, &res, h.born_ms);
            else
                forget(r, sbx, req);
            break;
        }
        case R_ABANDON:
            forget(r, sbx, req);
            break;
        case R_DROP:
            forget_sbx(r, sbx);
            break;
        }
        if (e != NULL)
            insert(r, e, now);
        pthread_mutex_unlock(&r->mu);
    }
    dsec_free(buf);
}

int dsec_results_load(dsec_results *r, dsec_results_keep_fn keep, void *ud, dsec_err *err)
{
    if (r->dir == NULL)
        return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/answers.log", r->dir);
    uint64_t now = wall_ms();
    FILE *f = fopen(path, "rbe");
    if (f == NULL && errno != ENOENT)
        return dsec_err_set(err, DSEC_E_IO, errno, "reading %s (kept command answers)", path);
    if (f != NULL) {
        replay(r, f, now);
        fclose(f);
    }
    pthread_mutex_lock(&r->mu);
    /* A command that started and has no answer ran when its node manager went away: lost,
     * from now (its TTL starts when it was found so). */
    while (r->running != NULL) {
        struct entry *e = r->running;
        struct entry *l = entry_new(E_LOST, e->sbx, e->req_id, e->hash_req, NULL, now);
        unlink_entry(r, e);
        if (l != NULL)
            insert(r, l, now);
    }
    trim(r, now, 0);
    for (struct entry *e = r->oldest, *next; e != NULL; e = next) {
        next = e->newer;
        if (!keep(e->sbx, ud))
            unlink_entry(r, e); /* its sandbox is gone */
    }
    r->loaded = r->entries;
    r->evicted = 0;
    int kept = (int)r->entries;
    pthread_mutex_unlock(&r->mu);
    /* what is kept, and nothing else, from here on */
    if (!compact(r)) {
        atomic_fetch_add(&r->persist_errors, 1);
        if (r->fd < 0)
            return dsec_err_set(err, DSEC_E_IO, errno, "opening %s (kept command answers)", path);
    }
    return kept;
}

void dsec_results_stats_get(dsec_results *r, dsec_results_stats *out)
{
    pthread_mutex_lock(&r->mu);
    *out = (dsec_results_stats){.entries = r->entries,
                                .bytes = r->bytes,
                                .hits = r->hits,
                                .evicted = r->evicted,
                                .lost = r->lost,
                                .loaded = r->loaded,
                                .persist_errors = r->persist_errors};
    pthread_mutex_unlock(&r->mu);
}

void dsec_results_free(dsec_results *r)
{
    if (r == NULL)
        return;
    if (r->compactor_started)
        pthread_join(r->compactor, NULL);
    pthread_mutex_lock(&r->mu);
    while (r->oldest != NULL)
        unlink_entry(r, r->oldest);
    while (r->running != NULL)
        unlink_entry(r, r->running);
    pthread_mutex_unlock(&r->mu);
    if (r->fd >= 0)
        close(r->fd); /* the log is for the next start */
    pthread_rwlock_destroy(&r->log_lk);
    pthread_mutex_destroy(&r->mu);
    dsec_free(r->dir);
    dsec_free(r);
}
