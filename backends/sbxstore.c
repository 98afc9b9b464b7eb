/* sbxstore.c - the sandbox-record store's live set, sweep, abandon and fork runner (sbxstore.h). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backends/sbxstore.h"
#include "backends/loop.h"
#include "dsec/alloc.h"
#include "dsec/log.h"
#include "dsec/names.h"

void dsec_sbx_store_init(struct dsec_sbx_store *s, const char *type, unsigned flags,
                         const struct dsec_sbx_ops *ops, void *be)
{
    memset(s, 0, sizeof *s);
    s->type = type;
    s->flags = flags;
    s->ops = ops;
    s->be = be;
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->sweep_lock, NULL);
    atomic_init(&s->swept, false);
}

void dsec_sbx_store_fini(struct dsec_sbx_store *s)
{
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->sweep_lock);
}

void dsec_sbx_live_add(struct dsec_sbx_store *s, struct dsec_sbx_link *l, const char *id,
                       const char *rid)
{
    pthread_mutex_lock(&s->lock);
    if (!l->listed) {
        l->id = id;
        l->rid = rid;
        l->next = s->live;
        s->live = l;
        l->listed = true;
    }
    pthread_mutex_unlock(&s->lock);
}

void dsec_sbx_live_del(struct dsec_sbx_store *s, struct dsec_sbx_link *l)
{
    pthread_mutex_lock(&s->lock);
    if (l->listed) {
        struct dsec_sbx_link **pp = &s->live;
        while (*pp != NULL && *pp != l)
            pp = &(*pp)->next;
        if (*pp == l)
            *pp = l->next;
        l->listed = false;
    }
    pthread_mutex_unlock(&s->lock);
}

bool dsec_sbx_live_has(struct dsec_sbx_store *s, const char *name)
{
    pthread_mutex_lock(&s->lock);
    struct dsec_sbx_link *l = s->live;
    while (l != NULL && strcmp(l->id, name) != 0 && strcmp(l->rid, name) != 0)
        l = l->next;
    pthread_mutex_unlock(&s->lock);
    return l != NULL;
}

void dsec_sbx_abandon(struct dsec_sbx_store *s, dsec_sandbox *sb)
{
    dsec_err e2;
    if (s->ops->teardown(s->be, sb, &e2) < 0) {
        dsec_log_warn("dsec %s: cleaning up a failed sandbox %s: %s", s->type, s->ops->id(sb),
                      e2.msg);
        if (s->ops->discard != NULL)
            s->ops->discard(s->be, sb);
    }
}

void dsec_sbx_sweep_once(struct dsec_sbx_store *s)
{
    if (atomic_load(&s->swept))
        return;
    pthread_mutex_lock(&s->sweep_lock);
    if (!atomic_load(&s->swept)) {
        s->ops->sweep(s->be);
        atomic_store(&s->swept, true);
    }
    pthread_mutex_unlock(&s->sweep_lock);
}

int dsec_sbx_dir_each(const char *dir, int (*fn)(void *arg, int dfd, const char *name), void *arg)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        int rc = fn(arg, dirfd(d), e->d_name);
        if (rc < 0)
            break;
        n += rc;
    }
    closedir(d);
    return n;
}

/* ---- file reads -------------------------------------------------------------------------------
 */

int dsec_sbx_file_page(dsec_file_data *out, dsec_file_data *part, uint64_t max)
{
    size_t got = part->len;
    if (out->data == NULL) {
        *out = *part;
    } else if (part->len > 0) {
        uint8_t *grown = dsec_realloc(out->data, out->len + part->len);
        if (grown == NULL) {
            dsec_free(part->data);
            dsec_free(out->data);
            memset(out, 0, sizeof *out);
            return -1;
        }
        memcpy(grown + out->len, part->data, part->len);
        out->data = grown;
        out->len += part->len;
        out->size = part->size;
        out->eof = part->eof;
        dsec_free(part->data);
    } else {
        out->eof = part->eof;
        out->size = part->size;
    }
    memset(part, 0, sizeof *part);
    return out->eof || got == 0 || (max != 0 && out->len >= max) ? 0 : 1;
}

/* ---- fork ------------------------------------------------------------------------------------ */

int dsec_sbx_fork_ids(const struct dsec_sbx_store *s, const char *const *ids, size_t n,
                      dsec_sandbox **children, char **states, dsec_err *err)
{
    for (size_t i = 0; i < n; i++) {
        children[i] = NULL;
        states[i] = NULL;
        if (ids[i] == NULL || dsec_name_ok(ids[i], DSEC_SBX_ID_LEN_MAX) < 0)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "%s: fork child id %zu is not 1..%d of [A-Za-z0-9_-]", s->type, i,
                                DSEC_SBX_ID_LEN_MAX);
        for (size_t k = 0; k < i; k++)
            if (strcmp(ids[k], ids[i]) == 0)
                return dsec_err_set(err, DSEC_E_INVALID, 0,
                                    "%s: fork child ids %zu and %zu are equal", s->type, k, i);
    }
    return 0;
}

struct fork_run {
    size_t n;
    int (*child)(void *arg, size_t i, dsec_err *err);
    void *arg;
    atomic_size_t next;
    atomic_bool failed;
    pthread_mutex_t mu; /* guards err */
    dsec_err err;       /* the first failure */
};

static void *fork_worker(void *arg)
{
    struct fork_run *f = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&f->next, 1);
        if (i >= f->n || atomic_load(&f->failed))
            break;
        dsec_err e;
        dsec_err_clear(&e);
        if (f->child(f->arg, i, &e) < 0) {
            dsec_err_wrap(&e, "fork child %zu", i);
            pthread_mutex_lock(&f->mu);
            if (!atomic_exchange(&f->failed, true))
                f->err = e;
            pthread_mutex_unlock(&f->mu);
            break;
        }
    }
    return NULL;
}

int dsec_sbx_fork_run(size_t n, size_t workers, int (*child)(void *arg, size_t i, dsec_err *err),
                      void *arg, dsec_err *err)
{
    struct fork_run f = {.n = n, .child = child, .arg = arg};
    atomic_init(&f.next, 0);
    atomic_init(&f.failed, false);
    pthread_mutex_init(&f.mu, NULL);
    pthread_t th[8];
    size_t nth = 0;
    while (nth + 1 < workers && nth < sizeof th / sizeof th[0] &&
           pthread_create(&th[nth], NULL, fork_worker, &f) == 0)
        nth++; /* fewer threads if one cannot start: this one works too */
    fork_worker(&f);
    for (size_t i = 0; i < nth; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&f.mu);
    if (!atomic_load(&f.failed))
        return 0;
    *err = f.err;
    return -1;
}

void dsec_sbx_fork_undo(struct dsec_sbx_store *s, dsec_sandbox **children, char **states, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (children[i] != NULL)
            dsec_sbx_abandon(s, children[i]);
        dsec_free(states[i]);
        children[i] = NULL;
        states[i] = NULL;
    }
}

struct dsec_sbx_fork_wait {
    pthread_mutex_t mu;
    size_t left;
    int rc;
    dsec_err err;
    dsec_ready_fn done;
    void *ud;
};

struct dsec_sbx_fork_wait *dsec_sbx_fork_wait_new(dsec_ready_fn done, void *ud)
{
    struct dsec_sbx_fork_wait *w = dsec_calloc(1, sizeof *w);
    if (w == NULL)
        return NULL;
    pthread_mutex_init(&w->mu, NULL);
    w->left = 1;
    w->done = done;
    w->ud = ud;
    return w;
}

void dsec_sbx_fork_wait_hold(struct dsec_sbx_fork_wait *w)
{
    pthread_mutex_lock(&w->mu);
    w->left++;
    pthread_mutex_unlock(&w->mu);
}

void dsec_sbx_fork_wait_free(struct dsec_sbx_fork_wait *w)
{
    if (w == NULL)
        return;
    pthread_mutex_destroy(&w->mu);
    dsec_free(w);
}

void dsec_sbx_fork_wait_end(void *wait, int rc, dsec_err *err)
{
    struct dsec_sbx_fork_wait *w = wait;
    pthread_mutex_lock(&w->mu);
    if (rc < 0 && w->rc == 0) {
        w->rc = -1;
        w->err = *err;
    }
    bool last = --w->left == 0;
    pthread_mutex_unlock(&w->mu);
    if (!last)
        return;
    w->done(w->ud, w->rc, &w->err);
    pthread_mutex_destroy(&w->mu);
    dsec_free(w);
}

static void fork_wait_started(dsec_loop_watch *watch, unsigned events, void *ud)
{
    (void)watch;
    (void)events;
    dsec_err none = {0};
    dsec_sbx_fork_wait_end(ud, 0, &none);
}

void dsec_sbx_fork_wait_started(struct dsec_sbx_fork_wait *w, struct dsec_loop *loop)
{
    dsec_err e;
    if (dsec_loop_post(loop, fork_wait_started, w, &e) < 0)
        fork_wait_started(NULL, 0, w);
}
