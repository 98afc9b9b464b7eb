/* ticker.c - a single timer thread with a small task table; 10 ms resolution is plenty here. */
#include "runtime/ticker.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#include "dsec/alloc.h"

struct task {
    bool used;
    uint32_t every_ms;
    uint64_t next_ns;
    dsec_tick_fn fn;
    void *ud;
};

struct dsec_ticker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    bool stop;
    int running; /* index of the task whose fn runs now, or -1 */
    struct task *tasks;
    int cap;
};

static void *ticker_main(void *arg)
{
    dsec_ticker *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        uint64_t now = dsec_now_ns();
        uint64_t next = now + 100000000ull;
        for (int i = 0; i < t->cap && !t->stop; i++) {
            struct task *k = &t->tasks[i];
            if (!k->used)
                continue;
            if (k->next_ns <= now) {
                k->next_ns = now + (uint64_t)k->every_ms * 1000000ull;
                dsec_tick_fn fn = k->fn;
                void *ud = k->ud;
                t->running = i;
                pthread_mutex_unlock(&t->mu);
                fn(ud, now);
                pthread_mutex_lock(&t->mu);
                t->running = -1;
                pthread_cond_broadcast(&t->cv);
                now = dsec_now_ns();
            }
            if (t->tasks[i].used && t->tasks[i].next_ns < next)
                next = t->tasks[i].next_ns;
        }
        if (t->stop)
            break;
        now = dsec_now_ns();
        if (next > now) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            uint64_t wake =
                (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + (next - now);
            ts.tv_sec = (time_t)(wake / 1000000000ull);
            ts.tv_nsec = (long)(wake % 1000000000ull);
            pthread_cond_timedwait(&t->cv, &t->mu, &ts);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int dsec_ticker_new(dsec_ticker **out, dsec_err *err)
{
    *out = NULL;
    dsec_ticker *t = dsec_calloc(1, sizeof *t);
    if (t == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&t->mu, NULL);
    t->running = -1;
    int rc = pthread_create(&t->thread, NULL, ticker_main, t);
    if (rc != 0) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        dsec_free(t);
        return dsec_err_set(err, DSEC_E_IO, rc, "starting the ticker thread");
    }
    *out = t;
    return 0;
}

void dsec_ticker_free(dsec_ticker *t)
{
    if (t == NULL)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    dsec_free(t->tasks);
    dsec_free(t);
}

int dsec_ticker_add(dsec_ticker *t, uint32_t every_ms, dsec_tick_fn fn, void *ud, dsec_err *err)
{
    if (every_ms == 0 || fn == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "ticker: a task needs a function and a period");
    pthread_mutex_lock(&t->mu);
    int id = -1;
    for (int i = 0; i < t->cap && id < 0; i++)
        if (!t->tasks[i].used)
            id = i;
    if (id < 0) {
        int ncap = t->cap ? t->cap * 2 : 16;
        struct task *nt = dsec_realloc(t->tasks, (size_t)ncap * sizeof *nt);
        if (nt == NULL) {
            pthread_mutex_unlock(&t->mu);
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        }
        memset(nt + t->cap, 0, (size_t)(ncap - t->cap) * sizeof *nt);
        id = t->cap;
        t->tasks = nt;
        t->cap = ncap;
    }
    t->tasks[id] = (struct task){.used = true,
                                 .every_ms = every_ms,
                                 .fn = fn,
                                 .ud = ud,
                                 .next_ns = dsec_now_ns() + (uint64_t)every_ms * 1000000ull};
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return id;
}

void dsec_ticker_remove(dsec_ticker *t, int id)
{
    if (t == NULL || id < 0)
        return;
    pthread_mutex_lock(&t->mu);
    if (id < t->cap) {
        /* the ticker thread itself may remove (from inside fn): don't wait on ourselves */
        while (t->running == id && !pthread_equal(pthread_self(), t->thread))
            pthread_cond_wait(&t->cv, &t->mu);
        t->tasks[id].used = false;
    }
    pthread_mutex_unlock(&t->mu);
}
