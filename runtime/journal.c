/* journal.c - length-and-checksum framed records in one append-only file. */
#include "runtime/journal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsec/alloc.h"
#include "dsec/io.h"

/* Record: magic 'J', op ('P' put / 'D' delete), id length (1 byte), payload
 * length (u32 LE), crc32 of everything after the crc (u32 LE), id, payload. */
#define REC_HDR 11
#define MAX_ID 128
#define MAX_PAYLOAD (64u * 1024)
#define COMPACT_MIN 4096

struct dsec_journal {
    pthread_mutex_t mu;
    int fd;
    char *path;
    uint64_t records; /* records in the file */
    uint64_t live;    /* live ids found by the last replay or compaction */
    bool dirty;
};

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc32_buf(uint32_t crc, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    crc = ~crc;
    while (n--)
        crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Frame one record into buf (REC_HDR + idlen + len bytes). */
static size_t frame(uint8_t *buf, char op, const char *id, size_t idlen, const void *data,
                    size_t len)
{
    buf[0] = 'J';
    buf[1] = (uint8_t)op;
    buf[2] = (uint8_t)idlen;
    put_u32(buf + 3, (uint32_t)len);
    memcpy(buf + REC_HDR, id, idlen);
    if (len)
        memcpy(buf + REC_HDR + idlen, data, len);
    uint32_t crc = crc32_buf(0, buf, 7);
    crc = crc32_buf(crc, buf + REC_HDR, idlen + len);
    put_u32(buf + 7, crc);
    return REC_HDR + idlen + len;
}

static int append(dsec_journal *j, char op, const char *id, const void *data, size_t len,
                  dsec_err *err)
{
    size_t idlen = strlen(id);
    if (idlen == 0 || idlen > MAX_ID)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "journal: id \"%s\" must be 1..%d bytes", id,
                            MAX_ID);
    if (len > MAX_PAYLOAD)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "journal: record for %s is %zu bytes (max %u)", id, len, MAX_PAYLOAD);
    uint8_t stackbuf[1024];
    size_t need = REC_HDR + idlen + len;
    uint8_t *buf = need <= sizeof stackbuf ? stackbuf : dsec_malloc(need);
    if (buf == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    size_t n = frame(buf, op, id, idlen, data, len);
    pthread_mutex_lock(&j->mu);
    int rc = dsec_write_all(j->fd, buf, n);
    if (rc == 0) {
        j->records++;
        j->dirty = true;
    }
    pthread_mutex_unlock(&j->mu);
    if (buf != stackbuf)
        dsec_free(buf);
    if (rc < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "journal %s: appending", j->path);
    return 0;
}

/* ---- replay: last record per id wins ---------------------------------------- */

struct slot {
    char *id;
    uint8_t *data; /* NULL when deleted */
    size_t len;
};

struct table {
    struct slot *s;
    size_t cap, used;
};

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s)
        h = (h ^ (uint8_t)*s++) * 1099511628211ull;
    return h;
}

static struct slot *table_find(struct table *t, const char *id, bool insert)
{
    if (insert && (t->used + 1) * 2 > t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 1024;
        struct slot *ns = dsec_calloc(ncap, sizeof *ns);
        if (ns == NULL)
            return NULL;
        for (size_t i = 0; i < t->cap; i++) {
            if (t->s[i].id == NULL)
                continue;
            size_t k = hash_str(t->s[i].id) & (ncap - 1);
            while (ns[k].id != NULL)
                k = (k + 1) & (ncap - 1);
            ns[k] = t->s[i];
        }
        dsec_free(t->s);
        t->s = ns;
        t->cap = ncap;
    }
    if (t->cap == 0)
        return NULL;
    size_t k = hash_str(id) & (t->cap - 1);
    while (t->s[k].id != NULL) {
        if (strcmp(t->s[k].id, id) == 0)
            return &t->s[k];
        k = (k + 1) & (t->cap - 1);
    }
    if (!insert)
        return NULL;
    if ((t->s[k].id = dsec_strdup(id)) == NULL)
        return NULL;
    t->used++;
    return &t->s[k];
}

static void table_free(struct table *t)
{
    for (size_t i = 0; i < t->cap; i++) {
        dsec_free(t->s[i].id);
        dsec_free(t->s[i].data);
    }
    dsec_free(t->s);
}

static int read_file(const char *path, int fd, uint8_t **out, size_t *len, dsec_err *err)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "journal %s: stat", path);
    uint8_t *buf = dsec_malloc((size_t)st.st_size + 1);
    if (buf == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "journal %s: out of memory", path);
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = dsec_pread_eintr(fd, buf + got, (size_t)st.st_size - got, (off_t)got);
        if (r <= 0) {
            dsec_free(buf);
            return dsec_err_set(err, DSEC_E_IO, r < 0 ? errno : 0, "journal %s: reading", path);
        }
        got += (size_t)r;
    }
    *out = buf;
    *len = got;
    return 0;
}

/* Parse the file into t. Sets *valid to the length of the intact prefix. */
static int parse(const char *path, const uint8_t *buf, size_t len, struct table *t, size_t *valid,
                 uint64_t *records, dsec_err *err)
{
    size_t off = 0;
    while (off < len) {
        if (len - off < REC_HDR)
            break; /* torn header at the tail */
        const uint8_t *p = buf + off;
        size_t idlen = p[2];
        uint32_t plen = get_u32(p + 3);
        bool sane = p[0] == 'J' && (p[1] == 'P' || p[1] == 'D') && idlen > 0 && idlen <= MAX_ID &&
                    plen <= MAX_PAYLOAD;
        if (sane && len - off < REC_HDR + idlen + plen)
            break; /* torn body at the tail */
        if (sane) {
            uint32_t crc = crc32_buf(0, p, 7);
            crc = crc32_buf(crc, p + REC_HDR, idlen + plen);
            sane = crc == get_u32(p + 7);
        }
        if (!sane) {
            if (off + REC_HDR + idlen + plen >= len)
                break; /* a damaged last record: a torn write */
            return dsec_err_set(err, DSEC_E_IO, 0, "journal %s: corrupt record at offset %zu", path,
                                off);
        }
        char id[MAX_ID + 1];
        memcpy(id, p + REC_HDR, idlen);
        id[idlen] = '\0';
        struct slot *s = table_find(t, id, true);
        if (s == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "journal %s: out of memory", path);
        dsec_free(s->data);
        s->data = NULL;
        s->len = 0;
        if (p[1] == 'P') {
            if ((s->data = dsec_malloc(plen ? plen : 1)) == NULL)
                return dsec_err_set(err, DSEC_E_NOMEM, 0, "journal %s: out of memory", path);
            memcpy(s->data, p + REC_HDR + idlen, plen);
            s->len = plen;
        }
        (*records)++;
        off += REC_HDR + idlen + plen;
    }
    *valid = off;
    return 0;
}

int dsec_journal_open(dsec_journal **out, const char *path, dsec_journal_replay_cb cb, void *ud,
                      dsec_err *err)
{
    pthread_once(&crc_once, crc_init);
    *out = NULL;
    dsec_journal *j = dsec_calloc(1, sizeof *j);
    if (j == NULL || (j->path = dsec_strdup(path)) == NULL) {
        dsec_free(j);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    pthread_mutex_init(&j->mu, NULL);
    j->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (j->fd < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "journal %s: opening", path);
        goto out_free;
    }
    uint8_t *buf = NULL;
    size_t len = 0, valid = 0;
    struct table t = {0};
    int rc = read_file(path, j->fd, &buf, &len, err);
    if (rc == 0)
        rc = parse(path, buf, len, &t, &valid, &j->records, err);
    dsec_free(buf);
    if (rc == 0 && valid < len && ftruncate(j->fd, (off_t)valid) < 0)
        rc = dsec_err_set(err, DSEC_E_IO, errno, "journal %s: cutting a torn tail", path);
    if (rc == 0 && lseek(j->fd, 0, SEEK_END) < 0)
        rc = dsec_err_set(err, DSEC_E_IO, errno, "journal %s: seeking", path);
    for (size_t i = 0; rc == 0 && i < t.cap; i++) {
        if (t.s[i].id == NULL || t.s[i].data == NULL)
            continue;
        j->live++;
        if (cb != NULL)
            rc = cb(t.s[i].id, t.s[i].data, t.s[i].len, ud, err);
    }
    table_free(&t);
    if (rc < 0)
        goto out_free;
    *out = j;
    return 0;
out_free:
    dsec_journal_close(j);
    return -1;
}

void dsec_journal_close(dsec_journal *j)
{
    if (j == NULL)
        return;
    if (j->fd >= 0) {
        if (j->dirty)
            fdatasync(j->fd);
        close(j->fd);
    }
    pthread_mutex_destroy(&j->mu);
    dsec_free(j->path);
    dsec_free(j);
}

int dsec_journal_put(dsec_journal *j, const char *id, const void *data, size_t len, dsec_err *err)
{
    return append(j, 'P', id, data, len, err);
}

int dsec_journal_del(dsec_journal *j, const char *id, dsec_err *err)
{
    return append(j, 'D', id, NULL, 0, err);
}

int dsec_journal_sync(dsec_journal *j, dsec_err *err)
{
    pthread_mutex_lock(&j->mu);
    bool dirty = j->dirty;
    j->dirty = false;
    pthread_mutex_unlock(&j->mu);
    if (dirty && fdatasync(j->fd) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "journal %s: fdatasync", j->path);
    return 0;
}

int dsec_journal_wants_compaction(dsec_journal *j, uint64_t live)
{
    pthread_mutex_lock(&j->mu); /* appends count records on other threads */
    uint64_t records = j->records;
    pthread_mutex_unlock(&j->mu);
    return records > COMPACT_MIN && records > 4 * (live + 1);
}

uint64_t dsec_journal_replayed(const dsec_journal *j)
{
    return j->live;
}

/* During compaction, emit writes into the temporary file. */
struct compact_ctx {
    int fd;
    uint64_t n;
};
static __thread struct compact_ctx *compacting;

static int emit_tmp(dsec_journal *j, const char *id, const void *data, size_t len, dsec_err *err)
{
    size_t idlen = strlen(id);
    if (idlen == 0 || idlen > MAX_ID || len > MAX_PAYLOAD)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "journal %s: bad record for %s", j->path, id);
    uint8_t *buf = dsec_malloc(REC_HDR + idlen + len);
    if (buf == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    size_t n = frame(buf, 'P', id, idlen, data, len);
    int rc = dsec_write_all(compacting->fd, buf, n);
    dsec_free(buf);
    if (rc < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "journal %s: writing compacted copy", j->path);
    compacting->n++;
    return 0;
}

int dsec_journal_compact(dsec_journal *j, dsec_journal_each_fn each, void *ud, dsec_err *err)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.compact", j->path);
    /* Hold the lock throughout: puts wait, so nothing lands in the old file
     * after the copy was taken. */
    pthread_mutex_lock(&j->mu);
    struct compact_ctx ctx = {.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)};
    int rc = 0;
    if (ctx.fd < 0) {
        rc = dsec_err_set(err, DSEC_E_IO, errno, "journal %s: creating %s", j->path, tmp);
        goto out_unlock;
    }
    compacting = &ctx;
    rc = each(j, emit_tmp, ud, err);
    compacting = NULL;
    if (rc == 0 && fdatasync(ctx.fd) < 0)
        rc = dsec_err_set(err, DSEC_E_IO, errno, "journal %s: syncing %s", j->path, tmp);
    if (rc == 0 && rename(tmp, j->path) < 0)
        rc = dsec_err_set(err, DSEC_E_IO, errno, "journal %s: renaming %s", j->path, tmp);
    if (rc < 0) {
        close(ctx.fd);
        unlink(tmp);
        goto out_unlock;
    }
    close(j->fd);
    j->fd = open(j->path, O_RDWR | O_APPEND | O_CLOEXEC);
    if (j->fd < 0)
        rc = dsec_err_set(err, DSEC_E_IO, errno, "journal %s: reopening", j->path);
    else
        lseek(j->fd, 0, SEEK_END);
    close(ctx.fd);
    j->records = ctx.n;
    j->live = ctx.n;
    j->dirty = false;
out_unlock:
    pthread_mutex_unlock(&j->mu);
    return rc;
}
