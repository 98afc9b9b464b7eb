/* loop.c - the node's event loop: epoll for sandbox channels, a heap of deadlines, one thread. */
#define _GNU_SOURCE
#include "backends/loop.h"

#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "dsec/alloc.h"
#include "dsec/io.h"
#include "dsec/log.h"

struct dsec_loop_watch {
    dsec_loop *loop;
    int fd;
    unsigned events;
    uint64_t deadline; /* 0: none */
    size_t heap_idx;   /* position in loop->heap while deadline != 0 */
    dsec_loop_fn fn;
    void *ud;
    bool dead;
    dsec_loop_watch *prev, *next; /* live list, or the dead list */
};

struct dsec_loop {
    pthread_t thread;
    pthread_t self; /* the loop thread, once running; under mu */
    int ep, wake;
    char name[16];
    /* mu guards the heap, the lists and the flags: dsec_loop_add comes from any thread. */
    pthread_mutex_t mu;
    dsec_loop_watch **heap;
    size_t nheap, capheap;
    dsec_loop_watch *live, *dead;
    size_t nlive, peak;
    bool stopping; /* set by dsec_loop_free */
    bool closed;   /* no more adds: the loop is cancelling what is left */
    bool sleeping; /* in epoll_wait until sleep_until */
    uint64_t sleep_until;
};

uint64_t dsec_loop_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the deadline heap (under mu) ---------------------------------------------------------- */

static void heap_swap(dsec_loop *l, size_t a, size_t b)
{
    dsec_loop_watch *t = l->heap[a];
    l->heap[a] = l->heap[b];
    l->heap[b] = t;
    l->heap[a]->heap_idx = a;
    l->heap[b]->heap_idx = b;
}

static void heap_up(dsec_loop *l, size_t i)
{
    while (i > 0 && l->heap[(i - 1) / 2]->deadline > l->heap[i]->deadline) {
        heap_swap(l, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_down(dsec_loop *l, size_t i)
{
    for (;;) {
        size_t m = i, a = 2 * i + 1, b = a + 1;
        if (a < l->nheap && l->heap[a]->deadline < l->heap[m]->deadline)
            m = a;
        if (b < l->nheap && l->heap[b]->deadline < l->heap[m]->deadline)
            m = b;
        if (m == i)
            return;
        heap_swap(l, i, m);
        i = m;
    }
}

static void heap_remove(dsec_loop *l, dsec_loop_watch *w)
{
    if (w->deadline == 0)
        return;
    size_t i = w->heap_idx;
    w->deadline = 0;
    l->nheap--;
    if (i == l->nheap)
        return;
    l->heap[i] = l->heap[l->nheap];
    l->heap[i]->heap_idx = i;
    heap_down(l, i);
    heap_up(l, i);
}

static int heap_insert(dsec_loop *l, dsec_loop_watch *w, uint64_t deadline)
{
    if (l->nheap == l->capheap) {
        size_t cap = l->capheap ? l->capheap * 2 : 64;
        dsec_loop_watch **h = dsec_realloc(l->heap, cap * sizeof *h);
        if (h == NULL)
            return -1;
        l->heap = h;
        l->capheap = cap;
    }
    w->deadline = deadline;
    w->heap_idx = l->nheap;
    l->heap[l->nheap++] = w;
    heap_up(l, w->heap_idx);
    return 0;
}

/* A deadline earlier than the loop's sleep must wake it. Under mu. */
static bool needs_wake(const dsec_loop *l, uint64_t deadline)
{
    return deadline != 0 && l->sleeping && (l->sleep_until == 0 || deadline < l->sleep_until) &&
           !pthread_equal(pthread_self(), l->self);
}

static void wake(dsec_loop *l)
{
    uint64_t one = 1;
    ssize_t n = dsec_write_eintr(l->wake, &one, sizeof one);
    (void)n; /* EAGAIN: the counter is already non-zero, the loop will wake anyway */
}

/* ---- watches ------------------------------------------------------------------------------- */

static uint32_t ep_events(unsigned events)
{
    return (events & DSEC_LOOP_IN ? EPOLLIN | EPOLLRDHUP : 0) |
           (events & DSEC_LOOP_OUT ? EPOLLOUT : 0);
}

int dsec_loop_add(dsec_loop *l, int fd, unsigned events, uint64_t deadline_ns, dsec_loop_fn fn,
                  void *ud, dsec_loop_watch **out, dsec_err *err)
{
    if (out != NULL)
        *out = NULL;
    if (l == NULL || fn == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "event loop: no loop or no callback");
    dsec_loop_watch *w = dsec_calloc(1, sizeof *w);
    if (w == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "event loop: a watch");
    *w = (dsec_loop_watch){.loop = l, .fd = fd, .events = events, .fn = fn, .ud = ud};
    if (out != NULL)
        *out = w; /* before the fd is armed: the callback may run at once */
    pthread_mutex_lock(&l->mu);
    if (l->closed) {
        pthread_mutex_unlock(&l->mu);
        dsec_free(w);
        if (out != NULL)
            *out = NULL;
        return dsec_err_set(err, DSEC_E_CLOSED, 0, "event loop %s: stopping", l->name);
    }
    if (deadline_ns != 0 && heap_insert(l, w, deadline_ns) < 0) {
        pthread_mutex_unlock(&l->mu);
        dsec_free(w);
        if (out != NULL)
            *out = NULL;
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "event loop: deadline heap");
    }
    w->next = l->live;
    if (l->live != NULL)
        l->live->prev = w;
    l->live = w;
    if (++l->nlive > l->peak)
        l->peak = l->nlive;
    bool kick = needs_wake(l, deadline_ns);
    if (fd >= 0) {
        /* armed under mu, so a stopping loop cannot miss it in its cancel pass */
        struct epoll_event ev = {.events = ep_events(events), .data.ptr = w};
        if (epoll_ctl(l->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
            int e = errno;
            heap_remove(l, w);
            if (w->next != NULL)
                w->next->prev = NULL;
            l->live = w->next;
            l->nlive--;
            pthread_mutex_unlock(&l->mu);
            dsec_free(w);
            if (out != NULL)
                *out = NULL;
            return dsec_err_set(err, DSEC_E_IO, e, "event loop %s: watching fd %d", l->name, fd);
        }
    }
    pthread_mutex_unlock(&l->mu);
    if (kick)
        wake(l);
    return 0;
}

int dsec_loop_set(dsec_loop_watch *w, unsigned events, uint64_t deadline_ns)
{
    dsec_loop *l = w->loop;
    if (w->dead)
        return -1;
    if (w->fd >= 0 && events != w->events) {
        struct epoll_event ev = {.events = ep_events(events), .data.ptr = w};
        if (epoll_ctl(l->ep, EPOLL_CTL_MOD, w->fd, &ev) < 0)
            return -1;
    }
    w->events = events;
    pthread_mutex_lock(&l->mu);
    if (deadline_ns != w->deadline) {
        heap_remove(l, w);
        if (deadline_ns != 0 && heap_insert(l, w, deadline_ns) < 0) {
            pthread_mutex_unlock(&l->mu);
            return -1;
        }
    }
    pthread_mutex_unlock(&l->mu);
    return 0;
}

void dsec_loop_del(dsec_loop_watch *w)
{
    if (w == NULL || w->dead)
        return;
    dsec_loop *l = w->loop;
    if (w->fd >= 0 && epoll_ctl(l->ep, EPOLL_CTL_DEL, w->fd, NULL) < 0 && errno != EPERM)
        /* The fd was closed (or reused) before its watch went. If another process or a dup
         * still holds what it named, epoll keeps reporting it with this watch, which is about
         * to be freed: a caller's bug, said loudly so that a test log shows it. */
        dsec_log_warn("dsec: event loop %s: fd %d was closed before its watch was removed: %s",
                      l->name, w->fd, strerror(errno));
    pthread_mutex_lock(&l->mu);
    heap_remove(l, w);
    if (w->prev != NULL)
        w->prev->next = w->next;
    else
        l->live = w->next;
    if (w->next != NULL)
        w->next->prev = w->prev;
    l->nlive--;
    w->dead = true;
    /* freed after the current batch of events, which may still name it */
    w->prev = NULL;
    w->next = l->dead;
    l->dead = w;
    pthread_mutex_unlock(&l->mu);
}

int dsec_loop_post(dsec_loop *l, dsec_loop_fn fn, void *ud, dsec_err *err)
{
    return dsec_loop_add(l, -1, 0, dsec_loop_now_ns(), fn, ud, NULL, err);
}

struct loop_tick {
    uint64_t t0, every_ns;
    dsec_loop_tick_fn tick;
    dsec_loop_done_fn done;
    void *ud;
};

static void tick_fire(dsec_loop_watch *w, unsigned events, void *ud)
{
    struct loop_tick *t = ud;
    dsec_err err;
    int rc;
    uint64_t now = dsec_loop_now_ns();
    if (events & DSEC_LOOP_CANCEL)
        rc = dsec_err_set(&err, DSEC_E_CLOSED, 0, "the node's loop stopped during the wait");
    else
        rc = t->tick(t->ud, (now - t->t0) / 1000000u, &err);
    if (rc == 0 && dsec_loop_set(w, 0, now + t->every_ns) == 0)
        return;
    struct loop_tick done = *t;
    dsec_free(t);
    if (rc == 0) /* could not re-arm: cannot happen on the loop thread */
        rc = dsec_err_set(&err, DSEC_E_INTERNAL, 0, "re-arming a wait's timer");
    done.done(done.ud, rc > 0 ? 0 : -1, &err);
}

int dsec_loop_tick_start(dsec_loop *l, uint32_t every_ms, dsec_loop_tick_fn tick,
                         dsec_loop_done_fn done, void *ud, dsec_err *err)
{
    struct loop_tick *t = dsec_malloc(sizeof *t);
    if (t == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "a wait on the loop");
    *t = (struct loop_tick){.t0 = dsec_loop_now_ns(),
                            .every_ns = (uint64_t)(every_ms ? every_ms : 1) * 1000000u,
                            .tick = tick,
                            .done = done,
                            .ud = ud};
    if (dsec_loop_add(l, -1, 0, t->t0, tick_fire, t, NULL, err) < 0) {
        dsec_free(t);
        return -1;
    }
    return 0;
}

/* A posted or timer-only watch whose callback did not re-arm it is done with. */
static void call(dsec_loop_watch *w, unsigned events)
{
    w->fn(w, events, w->ud);
    if (!w->dead && w->fd < 0 && w->deadline == 0)
        dsec_loop_del(w);
}

static void free_dead(dsec_loop *l)
{
    pthread_mutex_lock(&l->mu);
    dsec_loop_watch *d = l->dead;
    l->dead = NULL;
    pthread_mutex_unlock(&l->mu);
    while (d != NULL) {
        dsec_loop_watch *next = d->next;
        dsec_free(d);
        d = next;
    }
}

/* ---- the thread ---------------------------------------------------------------------------- */

static void *loop_main(void *arg)
{
    dsec_loop *l = arg;
    struct epoll_event evs[256];
    pthread_mutex_lock(&l->mu);
    l->self = pthread_self();
    pthread_mutex_unlock(&l->mu);
    for (;;) {
        pthread_mutex_lock(&l->mu);
        if (l->stopping) {
            pthread_mutex_unlock(&l->mu);
            break;
        }
        uint64_t next = l->nheap > 0 ? l->heap[0]->deadline : 0, now = dsec_loop_now_ns();
        int timeout = -1;
        if (next != 0)
            timeout = next <= now ? 0
                                  : (int)((next - now + 999999) / 1000000 > 60000
                                              ? 60000
                                              : (next - now + 999999) / 1000000);
        l->sleeping = timeout != 0;
        l->sleep_until = next;
        pthread_mutex_unlock(&l->mu);

        int n = epoll_wait(l->ep, evs, sizeof evs / sizeof evs[0], timeout);
        pthread_mutex_lock(&l->mu);
        l->sleeping = false;
        pthread_mutex_unlock(&l->mu);
        for (int i = 0; i < n; i++) {
            dsec_loop_watch *w = evs[i].data.ptr;
            if (w == NULL) { /* the wake eventfd */
                uint64_t v;
                (void)dsec_read_eintr(l->wake, &v, sizeof v);
                continue;
            }
            if (w->dead)
                continue;
            unsigned got = 0;
            if (evs[i].events & (EPOLLIN | EPOLLRDHUP))
                got |= DSEC_LOOP_IN;
            if (evs[i].events & EPOLLOUT)
                got |= DSEC_LOOP_OUT;
            if (evs[i].events & (EPOLLERR | EPOLLHUP))
                got |= DSEC_LOOP_ERR | (w->events & DSEC_LOOP_IN);
            if (got != 0)
                call(w, got);
        }
        /* deadlines due: each leaves the heap before its callback, which may set a new one */
        now = dsec_loop_now_ns();
        for (;;) {
            pthread_mutex_lock(&l->mu);
            dsec_loop_watch *w = l->nheap > 0 && l->heap[0]->deadline <= now ? l->heap[0] : NULL;
            if (w != NULL)
                heap_remove(l, w);
            pthread_mutex_unlock(&l->mu);
            if (w == NULL)
                break;
            call(w, DSEC_LOOP_TIMER);
        }
        free_dead(l);
    }
    /* Stopping: no more adds, and every watch left hears so once. */
    pthread_mutex_lock(&l->mu);
    l->closed = true;
    pthread_mutex_unlock(&l->mu);
    for (;;) {
        pthread_mutex_lock(&l->mu);
        dsec_loop_watch *w = l->live;
        pthread_mutex_unlock(&l->mu);
        if (w == NULL)
            break;
        w->fn(w, DSEC_LOOP_CANCEL, w->ud);
        dsec_loop_del(w);
    }
    free_dead(l);
    return NULL;
}

int dsec_loop_new(dsec_loop **out, const char *name, dsec_err *err)
{
    *out = NULL;
    dsec_loop *l = dsec_calloc(1, sizeof *l);
    if (l == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "event loop");
    snprintf(l->name, sizeof l->name, "%s", name ? name : "dsec-loop");
    l->ep = epoll_create1(EPOLL_CLOEXEC);
    l->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (l->ep < 0 || l->wake < 0 || epoll_ctl(l->ep, EPOLL_CTL_ADD, l->wake, &ev) < 0) {
        int e = errno;
        if (l->ep >= 0)
            close(l->ep);
        if (l->wake >= 0)
            close(l->wake);
        dsec_free(l);
        return dsec_err_set(err, DSEC_E_IO, e, "event loop: epoll and its wake-up eventfd");
    }
    pthread_mutex_init(&l->mu, NULL);
    int e = pthread_create(&l->thread, NULL, loop_main, l);
    if (e != 0) {
        pthread_mutex_destroy(&l->mu);
        close(l->ep);
        close(l->wake);
        dsec_free(l);
        return dsec_err_set(err, DSEC_E_IO, e, "event loop: starting its thread");
    }
    pthread_setname_np(l->thread, l->name);
    *out = l;
    return 0;
}

void dsec_loop_stop(dsec_loop *l)
{
    pthread_mutex_lock(&l->mu);
    bool was = l->stopping;
    l->stopping = true;
    pthread_mutex_unlock(&l->mu);
    if (was)
        return;
    wake(l);
    pthread_join(l->thread, NULL);
}

void dsec_loop_free(dsec_loop *l)
{
    if (l == NULL)
        return;
    dsec_loop_stop(l);
    pthread_mutex_destroy(&l->mu);
    close(l->ep);
    close(l->wake);
    dsec_free(l->heap);
    dsec_free(l);
}

int dsec_loop_is_current(const dsec_loop *l)
{
    if (l == NULL)
        return 0;
    pthread_mutex_lock((pthread_mutex_t *)&l->mu);
    int me = pthread_equal(pthread_self(), l->self);
    pthread_mutex_unlock((pthread_mutex_t *)&l->mu);
    return me;
}

void dsec_loop_counts(dsec_loop *l, size_t *now, size_t *peak)
{
    pthread_mutex_lock(&l->mu);
    if (now != NULL)
        *now = l->nlive;
    if (peak != NULL)
        *peak = l->peak;
    pthread_mutex_unlock(&l->mu);
}
