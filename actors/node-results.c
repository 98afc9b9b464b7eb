/* node-results.c - finished commands' answers by (sandbox, request id), bounded by age and bytes,
 * kept in memory and, with a directory, in one file each so that they outlive the process. */
#include "actors/node-results.h"

#include <dirent.h>
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
#define REQ_MAX 64u /* req_id bytes (docs/protocol.md): its file name is twice that in hex */

/* One answer; its strings and output live in the same allocation, after the struct. */
struct entry {
    struct entry *hnext;       /* hash chain */
    struct entry *older, *newer; /* age list */
    uint64_t hash, born_ms;    /* born: wall clock, when the command finished */
    size_t bytes;
    bool lost;            /* the command ran when a node manager went away: no answer */
    uint8_t hash_req[32]; /* the request that ran */
    char *sbx, *req_id;
    dsec_msg_exec_result res;
};

struct dsec_results {
    pthread_mutex_t mu;
    struct entry *buckets[NBUCKETS];
    struct entry *oldest, *newest;
    uint64_t budget, ttl_ms, bytes, entries, hits, evicted, lost, loaded;
    _Atomic uint64_t persist_errors;
    char *dir; /* NULL: memory only */
};

/* The file: this header, then the output (stdout, stderr). A marker is the header alone. */
enum { F_RUNNING = 1, F_DONE = 2, F_LOST = 3 };
enum { FL_OUT_TRUNC = 1, FL_ERR_TRUNC = 2, FL_TIMED_OUT = 4, FL_INTERRUPTED = 8, FL_SESSION_ENDED = 16 };
struct file_head {
    char magic[4]; /* "DSR1" */
    uint8_t state, flags;
    uint16_t pad;
    uint32_t pad2;
    uint64_t born_ms; /* wall clock: started (marker), finished (answer), found lost */
    uint8_t hash[32];
    int64_t exit_code, signal;
    uint64_t duration_us, cpu_us, peak_rss_kb, out_len, err_len;
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

/* ---- files ------------------------------------------------------------------------ */

/* A sandbox id names a directory: nothing that leaves dir. */
static bool sbx_ok(const char *sbx)
{
    return sbx[0] != '\0' && sbx[0] != '.' && strchr(sbx, '/') == NULL && strlen(sbx) < 200;
}

/* <dir>/<sbx>/<hex req_id><suffix>; false when it cannot name one. */
static bool file_path(const dsec_results *r, const char *sbx, const char *req_id,
                      const char *suffix, char *out, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t lr = strlen(req_id);
    if (r->dir == NULL || !sbx_ok(sbx) || lr == 0 || lr > REQ_MAX)
        return false;
    char name[2 * REQ_MAX + 1];
    for (size_t i = 0; i < lr; i++) {
        name[2 * i] = hex[(uint8_t)req_id[i] >> 4];
        name[2 * i + 1] = hex[(uint8_t)req_id[i] & 15];
    }
    name[2 * lr] = '\0';
    int n = snprintf(out, len, "%s/%s/%s%s", r->dir, sbx, name, suffix);
    return n > 0 && (size_t)n < len;
}

static bool unhex(const char *name, char *out, size_t cap)
{
    size_t l = strlen(name);
    if (l == 0 || l % 2 != 0 || l / 2 >= cap)
        return false;
    for (size_t i = 0; i < l; i += 2) {
        int v = 0;
        for (int k = 0; k < 2; k++) {
            char c = name[i + (size_t)k];
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (d < 0)
                return false;
            v = v * 16 + d;
        }
        if (v == 0)
            return false;
        out[i / 2] = (char)v;
    }
    out[l / 2] = '\0';
    return true;
}

/* Write head and the output to path (creating the sandbox's directory on first use). */
static int write_file(const dsec_results *r, const char *sbx, const char *path,
                      const struct file_head *h, const void *out, const void *err_data)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 && errno == ENOENT) {
        char d[4096];
        snprintf(d, sizeof d, "%s/%s", r->dir, sbx);
        if (mkdir(d, 0700) < 0 && errno != EEXIST)
            return -1;
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    }
    if (fd < 0)
        return -1;
    struct iovec v[3] = {{(void *)h, sizeof *h},
                         {(void *)out, (size_t)h->out_len},
                         {(void *)err_data, (size_t)h->err_len}};
    size_t want = sizeof *h + (size_t)h->out_len + (size_t)h->err_len;
    ssize_t w = writev(fd, v, 3);
    if (w >= 0 && (size_t)w < want) { /* a short write (a signal, a huge output): the rest */
        size_t done = (size_t)w;
        for (int i = 0; i < 3 && w >= 0; i++) {
            if (done >= v[i].iov_len) {
                done -= v[i].iov_len;
                continue;
            }
            const char *p = (const char *)v[i].iov_base + done;
            size_t left = v[i].iov_len - done;
            done = 0;
            while (left > 0 && (w = write(fd, p, left)) > 0) {
                p += w;
                left -= (size_t)w;
            }
        }
    }
    int saved = errno;
    if (close(fd) < 0 && w >= 0)
        w = -1;
    errno = saved;
    return w < 0 ? -1 : 0;
}

/* The whole file at path (caller frees *data), or NULL. */
static uint8_t *read_file(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    uint8_t *p = NULL;
    if (fstat(fd, &st) == 0 && st.st_size >= (off_t)sizeof(struct file_head) &&
        (p = dsec_malloc((size_t)st.st_size)) != NULL) {
        size_t got = 0;
        ssize_t n;
        while (got < (size_t)st.st_size && (n = read(fd, p + got, (size_t)st.st_size - got)) > 0)
            got += (size_t)n;
        if (got != (size_t)st.st_size) {
            dsec_free(p);
            p = NULL;
        }
        *len = got;
    }
    close(fd);
    return p;
}

static void rm_sbx_dir(const dsec_results *r, const char *sbx)
{
    char d[4096];
    if (r->dir == NULL || !sbx_ok(sbx))
        return;
    snprintf(d, sizeof d, "%s/%s", r->dir, sbx);
    DIR *dp = opendir(d);
    if (dp == NULL)
        return;
    int dfd = dirfd(dp);
    for (struct dirent *de; (de = readdir(dp)) != NULL;)
        if (de->d_name[0] != '.')
            unlinkat(dfd, de->d_name, 0);
    closedir(dp);
    rmdir(d);
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
    r->budget = budget_bytes;
    r->ttl_ms = ttl_ms;
    *out = r;
    return 0;
}

uint64_t dsec_results_ttl_ms(const dsec_results *r) { return r->ttl_ms; }

/* Out of the table and the age list; its file goes too unless keep_file. Under mu. */
static void unlink_entry(dsec_results *r, struct entry *e, bool keep_file)
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
    if (e->lost)
        r->lost--;
    char path[4096];
    if (!keep_file && file_path(r, e->sbx, e->req_id, "", path, sizeof path))
        unlink(path);
    dsec_free(e);
}

/* Drop what is too old, then the oldest until bytes fit. Under mu. */
static void trim(dsec_results *r, uint64_t now, size_t room)
{
    while (r->oldest != NULL &&
           ((now > r->oldest->born_ms && now - r->oldest->born_ms > r->ttl_ms) ||
            r->bytes + room > r->budget)) {
        unlink_entry(r, r->oldest, false);
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

/* A new entry (res NULL: a lost command), born at born_ms, not yet in the table. */
static struct entry *entry_new(const char *sbx, const char *req_id, const uint8_t hash[32],
                               const dsec_msg_exec_result *res, uint64_t born_ms)
{
    size_t bytes = entry_bytes(sbx, req_id, res);
    size_t ls = strlen(sbx) + 1, lr = strlen(req_id) + 1;
    struct entry *e = dsec_malloc(bytes);
    if (e == NULL)
        return NULL;
    char *p = (char *)(e + 1);
    *e = (struct entry){.hash = key_hash(sbx, req_id), .bytes = bytes, .born_ms = born_ms,
                        .lost = res == NULL};
    memcpy(e->hash_req, hash, sizeof e->hash_req);
    e->sbx = memcpy(p, sbx, ls), p += ls;
    e->req_id = memcpy(p, req_id, lr), p += lr;
    if (res == NULL)
        return e;
    size_t li = strlen(res->id) + 1;
    e->res = *res;
    e->res.id = memcpy(p, res->id, li), p += li;
    e->res.stdout_data.ptr = res->stdout_data.len ? memcpy(p, res->stdout_data.ptr, res->stdout_data.len) : NULL;
    p += res->stdout_data.len;
    e->res.stderr_data.ptr = res->stderr_data.len ? memcpy(p, res->stderr_data.ptr, res->stderr_data.len) : NULL;
    return e;
}

/* Into the table as the newest, making room first. Under mu. */
static void insert(dsec_results *r, struct entry *e, uint64_t now)
{
    struct entry *old = find(r, e->hash, e->sbx, e->req_id);
    if (old != NULL)
        unlink_entry(r, old, true); /* the same file, which now holds e */
    trim(r, now, e->bytes);
    e->hnext = r->buckets[e->hash & (NBUCKETS - 1)];
    r->buckets[e->hash & (NBUCKETS - 1)] = e;
    e->older = r->newest;
    e->newer = NULL;
    if (r->newest != NULL)
        r->newest->newer = e;
    else
        r->oldest = e;
    r->newest = e;
    r->bytes += e->bytes;
    r->entries++;
    if (e->lost)
        r->lost++;
}

void dsec_results_begin(dsec_results *r, const char *sbx, const char *req_id,
                        const uint8_t hash[32])
{
    char path[4096];
    if (!file_path(r, sbx, req_id, "", path, sizeof path))
        return;
    struct file_head h = {.magic = "DSR1", .state = F_RUNNING, .born_ms = wall_ms()};
    memcpy(h.hash, hash, sizeof h.hash);
    /* Not atomic, and need not be: a torn marker is one whose command had not started yet. */
    if (write_file(r, sbx, path, &h, NULL, NULL) < 0)
        atomic_fetch_add(&r->persist_errors, 1);
}

void dsec_results_abandon(dsec_results *r, const char *sbx, const char *req_id)
{
    char path[4096];
    if (file_path(r, sbx, req_id, "", path, sizeof path))
        unlink(path);
}

void dsec_results_put(dsec_results *r, const char *sbx, const char *req_id,
                      const uint8_t hash[32], const dsec_msg_exec_result *res)
{
    uint64_t now = wall_ms();
    struct entry *e = entry_bytes(sbx, req_id, res) <= r->budget
                          ? entry_new(sbx, req_id, hash, res, now)
                          : NULL;
    if (e == NULL) {
        dsec_results_abandon(r, sbx, req_id);
        return;
    }
    char path[4096], tmp[4096];
    if (file_path(r, sbx, req_id, "", path, sizeof path) &&
        file_path(r, sbx, req_id, ".tmp", tmp, sizeof tmp)) {
        /* the answer replaces the marker in one step: a restart finds one or the other */
        struct file_head h = {.magic = "DSR1", .state = F_DONE, .born_ms = now,
                              .exit_code = res->exit_code, .signal = res->signal,
                              .duration_us = res->duration_us, .cpu_us = res->cpu_us,
                              .peak_rss_kb = res->peak_rss_kb, .out_len = res->stdout_data.len,
                              .err_len = res->stderr_data.len};
        h.flags = (uint8_t)((res->stdout_truncated ? FL_OUT_TRUNC : 0) |
                            (res->stderr_truncated ? FL_ERR_TRUNC : 0) |
                            (res->timed_out ? FL_TIMED_OUT : 0) |
                            (res->interrupted ? FL_INTERRUPTED : 0) |
                            (res->session_ended ? FL_SESSION_ENDED : 0));
        memcpy(h.hash, hash, sizeof h.hash);
        if (write_file(r, sbx, tmp, &h, res->stdout_data.ptr, res->stderr_data.ptr) < 0 ||
            rename(tmp, path) < 0) {
            /* kept in memory only; the marker stays, so a restart says lost, never reruns */
            atomic_fetch_add(&r->persist_errors, 1);
            unlink(tmp);
        }
    }
    pthread_mutex_lock(&r->mu);
    insert(r, e, now);
    pthread_mutex_unlock(&r->mu);
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
    if (e != NULL && e->lost) {
        memcpy(hash, e->hash_req, sizeof e->hash_req);
        r->hits++;
        what = DSEC_RESULTS_LOST;
    }
    struct entry *c = e != NULL && !e->lost ? dsec_malloc(e->bytes) : NULL;
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

void dsec_results_release(void *hold) { dsec_free(hold); }

void dsec_results_drop(dsec_results *r, const char *sbx)
{
    pthread_mutex_lock(&r->mu);
    for (struct entry *e = r->oldest, *next; e != NULL; e = next) {
        next = e->newer;
        if (strcmp(e->sbx, sbx) == 0)
            unlink_entry(r, e, true);
    }
    pthread_mutex_unlock(&r->mu);
    rm_sbx_dir(r, sbx); /* answers and markers alike */
}

/* ---- reading back at start ------------------------------------------------------------ */

struct found {
    struct entry *e;
};

static int by_born(const void *a, const void *b)
{
    const struct entry *x = ((const struct found *)a)->e, *y = ((const struct found *)b)->e;
    return x->born_ms < y->born_ms ? -1 : x->born_ms > y->born_ms;
}

/* One file of sandbox sbx: its entry, or NULL (and the file is gone) when it is not kept. */
static struct entry *load_one(dsec_results *r, const char *sbx, const char *name, uint64_t now)
{
    char path[4096], req_id[REQ_MAX + 1];
    snprintf(path, sizeof path, "%s/%s/%s", r->dir, sbx, name);
    size_t len = 0;
    uint8_t *p = NULL;
    struct entry *e = NULL;
    if (!unhex(name, req_id, sizeof req_id) || (p = read_file(path, &len)) == NULL)
        goto out_rm;
    struct file_head h;
    memcpy(&h, p, sizeof h);
    if (memcmp(h.magic, "DSR1", 4) != 0)
        goto out_rm;
    if (h.state == F_RUNNING && len == sizeof h) {
        /* The command ran when its node manager went away: lost from now on. */
        h.state = F_LOST;
        h.born_ms = now;
        char tmp[4096] = "";
        if (!file_path(r, sbx, req_id, ".tmp", tmp, sizeof tmp) ||
            write_file(r, sbx, tmp, &h, NULL, NULL) < 0 || rename(tmp, path) < 0) {
            atomic_fetch_add(&r->persist_errors, 1); /* lost all the same, for this run */
            unlink(tmp);
        }
        e = entry_new(sbx, req_id, h.hash, NULL, now);
    } else if (h.state == F_LOST && len == sizeof h) {
        e = entry_new(sbx, req_id, h.hash, NULL, h.born_ms);
    } else if (h.state == F_DONE && h.out_len <= len && h.err_len <= len &&
               sizeof h + h.out_len + h.err_len == len) {
        dsec_msg_exec_result res = {
            .id = sbx, .exit_code = h.exit_code, .signal = h.signal,
            .stdout_data = {p + sizeof h, (size_t)h.out_len},
            .stderr_data = {p + sizeof h + h.out_len, (size_t)h.err_len},
            .stdout_truncated = h.flags & FL_OUT_TRUNC, .stderr_truncated = h.flags & FL_ERR_TRUNC,
            .timed_out = h.flags & FL_TIMED_OUT, .interrupted = h.flags & FL_INTERRUPTED,
            .session_ended = h.flags & FL_SESSION_ENDED, .duration_us = h.duration_us,
            .cpu_us = h.cpu_us, .peak_rss_kb = h.peak_rss_kb};
        e = entry_new(sbx, req_id, h.hash, &res, h.born_ms);
    }
    if (e != NULL && (now > e->born_ms && now - e->born_ms > r->ttl_ms)) {
        dsec_free(e);
        e = NULL;
    }
out_rm:
    dsec_free(p);
    if (e == NULL)
        unlink(path); /* expired, torn or unreadable */
    return e;
}

int dsec_results_load(dsec_results *r, dsec_results_keep_fn keep, void *ud, dsec_err *err)
{
    if (r->dir == NULL)
        return 0;
    DIR *top = opendir(r->dir);
    if (top == NULL)
        return dsec_err_set(err, DSEC_E_IO, errno, "reading %s (kept command answers)", r->dir);
    struct found *v = NULL;
    size_t nv = 0, cap = 0;
    uint64_t now = wall_ms();
    for (struct dirent *de; (de = readdir(top)) != NULL;) {
        if (de->d_name[0] == '.')
            continue;
        const char *sbx = de->d_name;
        if (!sbx_ok(sbx) || !keep(sbx, ud)) {
            rm_sbx_dir(r, sbx);
            continue;
        }
        char d[4096];
        snprintf(d, sizeof d, "%s/%s", r->dir, sbx);
        DIR *dp = opendir(d);
        if (dp == NULL)
            continue;
        for (struct dirent *fe; (fe = readdir(dp)) != NULL;) {
            if (fe->d_name[0] == '.')
                continue;
            size_t ln = strlen(fe->d_name);
            if (ln > 4 && strcmp(fe->d_name + ln - 4, ".tmp") == 0) {
                unlinkat(dirfd(dp), fe->d_name, 0); /* an answer being written: its marker stays */
                continue;
            }
            struct entry *e = load_one(r, sbx, fe->d_name, now);
            if (e == NULL)
                continue;
            if (nv == cap) {
                size_t nc = cap ? cap * 2 : 64;
                struct found *nvp = dsec_realloc(v, nc * sizeof *v);
                if (nvp == NULL) {
                    dsec_free(e); /* its file stays for the next start */
                    continue;
                }
                v = nvp;
                cap = nc;
            }
            v[nv++] = (struct found){e};
        }
        closedir(dp);
    }
    closedir(top);
    /* oldest first, so that the budget drops the oldest, as it would have */
    qsort(v, nv, sizeof *v, by_born);
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < nv; i++) {
        if (v[i].e->bytes > r->budget) {
            char path[4096];
            if (file_path(r, v[i].e->sbx, v[i].e->req_id, "", path, sizeof path))
                unlink(path);
            dsec_free(v[i].e);
            continue;
        }
        insert(r, v[i].e, now);
    }
    r->loaded = r->entries;
    int kept = (int)r->entries;
    pthread_mutex_unlock(&r->mu);
    dsec_free(v);
    return kept;
}

void dsec_results_stats_get(dsec_results *r, dsec_results_stats *out)
{
    pthread_mutex_lock(&r->mu);
    *out = (dsec_results_stats){.entries = r->entries, .bytes = r->bytes, .hits = r->hits,
                                .evicted = r->evicted, .lost = r->lost, .loaded = r->loaded,
                                .persist_errors = r->persist_errors};
    pthread_mutex_unlock(&r->mu);
}

void dsec_results_free(dsec_results *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    while (r->oldest != NULL)
        unlink_entry(r, r->oldest, true); /* the files are for the next start */
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_destroy(&r->mu);
    dsec_free(r->dir);
    dsec_free(r);
}
