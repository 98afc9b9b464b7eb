/* loop.h - the node's event loop: one thread that waits on sandbox channels and deadlines, so a
 * command that runs for minutes costs a watch, not a thread. */
#ifndef DSEC_BACKENDS_LOOP_H
#define DSEC_BACKENDS_LOOP_H

#include <stddef.h>
#include <stdint.h>

#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A loop is one thread around epoll. A watch is a file descriptor (or none: a timer), the
 * events wanted on it and a deadline; its callback runs on the loop thread when one of them
 * happens. Callbacks must not block: they read what is there, write what fits and return.
 *
 * Threading: dsec_loop_add may be called from any thread; everything else that takes a watch
 * only from the loop thread (inside a callback). A callback may add, change or delete any
 * watch, its own included.
 */
typedef struct dsec_loop dsec_loop;
typedef struct dsec_loop_watch dsec_loop_watch;

enum {
    DSEC_LOOP_IN = 1u << 0,     /* readable (or the peer hung up) */
    DSEC_LOOP_OUT = 1u << 1,    /* writable */
    DSEC_LOOP_ERR = 1u << 2,    /* error or hang-up reported on the fd */
    DSEC_LOOP_TIMER = 1u << 3,  /* the deadline passed (the deadline is then cleared) */
    DSEC_LOOP_CANCEL = 1u << 4, /* the loop is stopping: finish now, then the watch is deleted */
};

/* events: the DSEC_LOOP_* bits that happened. */
typedef void (*dsec_loop_fn)(dsec_loop_watch *w, unsigned events, void *ud);

/* Start a loop thread named name (at most 15 characters are kept). */
int dsec_loop_new(dsec_loop **out, const char *name, dsec_err *err);
/* Stop the loop: every watch still there gets one DSEC_LOOP_CANCEL call on the loop thread
 * and is deleted; then the thread ends, and later adds fail with DSEC_E_CLOSED. The loop's
 * memory stays until dsec_loop_free. Not from the loop thread. Idempotent. */
void dsec_loop_stop(dsec_loop *l);
/* dsec_loop_stop, then free. NULL is a no-op. */
void dsec_loop_free(dsec_loop *l);

/* Watch fd (-1: none, a pure timer) for events (DSEC_LOOP_IN | DSEC_LOOP_OUT, or 0) until
 * deadline_ns (CLOCK_MONOTONIC, dsec_loop_now_ns; 0: none). fn may run before this returns,
 * on the loop thread: set up everything it reads first. *out (may be NULL) receives the
 * watch. Fails with DSEC_E_CLOSED once the loop is stopping. The fd stays the caller's. */
int dsec_loop_add(dsec_loop *l, int fd, unsigned events, uint64_t deadline_ns, dsec_loop_fn fn,
                  void *ud, dsec_loop_watch **out, dsec_err *err);
/* Loop thread only: change what w waits for (events as in add; deadline 0: none). */
int dsec_loop_set(dsec_loop_watch *w, unsigned events, uint64_t deadline_ns);
/* Loop thread only: delete w; its callback is never called again. The fd is not closed. */
void dsec_loop_del(dsec_loop_watch *w);

/* Run fn(NULL-events watch, DSEC_LOOP_TIMER, ud) on the loop thread soon, once. */
int dsec_loop_post(dsec_loop *l, dsec_loop_fn fn, void *ud, dsec_err *err);

/* A wait that asks: tick(ud, ms since the start, err) every every_ms on the loop thread (the
 * first time at once) until it returns 1 (done: rc 0) or -1 (done: rc -1 and err); 0 asks
 * again. When the loop stops first, done gets rc -1 and DSEC_E_CLOSED. done runs once, on the
 * loop thread, possibly before this returns. -1 with err (the loop is stopping, no memory):
 * neither is ever called. */
typedef int (*dsec_loop_tick_fn)(void *ud, uint64_t elapsed_ms, dsec_err *err);
typedef void (*dsec_loop_done_fn)(void *ud, int rc, dsec_err *err);
int dsec_loop_tick_start(dsec_loop *l, uint32_t every_ms, dsec_loop_tick_fn tick,
                         dsec_loop_done_fn done, void *ud, dsec_err *err);

/* Whether the caller is l's thread. */
int dsec_loop_is_current(const dsec_loop *l);
/* Watches registered now (timers and fds), and the most there ever were. */
void dsec_loop_counts(dsec_loop *l, size_t *now, size_t *peak);
/* CLOCK_MONOTONIC in ns: the clock of deadlines. */
uint64_t dsec_loop_now_ns(void);

#ifdef __cplusplus
}
#endif
#endif
