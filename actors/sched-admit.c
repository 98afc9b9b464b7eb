/* sched-admit.c - a scheduler replica's admission: the bound on the work it holds, the window
 * of placements on their way, and the "overloaded" answers (docs/control-plane.md, "Admission"). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "actors/sched-int.h"
#include "actors/wire.h"
#include "dsec/err.h"

/* ---- admission -------------------------------------------------------------------- */

/* The work this replica holds now: creates it is admitting or looking up
 * (each holds an ask), placements sent that no node report has confirmed
 * yet (the view's reservations in this cell, from sum), and parked rollouts. */
uint64_t dsec__sched_held_in(dsec_sched *s, const dsec_cell_summary *sum)
{
    pthread_mutex_lock(&s->amu);
    uint64_t h = s->asking;
    pthread_mutex_unlock(&s->amu);
    pthread_mutex_lock(&s->wmu);
    h += s->nwaiting + s->nticking;
    pthread_mutex_unlock(&s->wmu);
    return h + sum->reserved;
}

/* The same, with a fresh look at the view (a pass over the cell's nodes). */
uint64_t dsec__sched_held_now(dsec_sched *s)
{
    dsec_cell_summary sum;
    dsec_placement_summary(s->view, s->cell, dsec__sched_now_ms(), &sum);
    return dsec__sched_held_in(s, &sum);
}

#define RETRY_AFTER_MIN_MS 10
#define RETRY_AFTER_MAX_MS 2000

/* How long a shed create should wait before its retry: the time this
 * replica needs to place what it holds at the rate it has been placing.
 * At least 10 ms: sooner, the retry only meets the same backlog and costs a
 * round trip. At most 2 s: the rate is a guess from the past, and a client
 * that waits longer than needed loses more than a second shed costs it;
 * nothing placed lately (rate 0, e.g. every node full) gets the most, so
 * retries come back slowly until room appears. */
unsigned dsec__sched_retry_after_ms(dsec_sched *s, uint64_t held)
{
    uint64_t rate = atomic_load(&s->drain_milli_per_s); /* per 1000 s */
    if (rate == 0)
        return RETRY_AFTER_MAX_MS;
    uint64_t ms = held * 1000000ull / rate;
    return ms < RETRY_AFTER_MIN_MS   ? RETRY_AFTER_MIN_MS
           : ms > RETRY_AFTER_MAX_MS ? RETRY_AFTER_MAX_MS
                                     : (unsigned)ms;
}

/* Answer a create "overloaded" (retry-safe: nothing was placed) with the
 * replica's retry_after_ms for the work it holds (held). admitted: the quota
 * actor admitted it, so that admission goes back (never for one shed at
 * arrival: its req_id may name an earlier attempt's admission). */
static void shed_v(dsec_sched *s, const char *reply_to, const dsec_msg_create *c, unsigned retry_ms,
                   bool admitted, const char *fmt, va_list ap)
    __attribute__((format(printf, 6, 0)));

static void shed_v(dsec_sched *s, const char *reply_to, const dsec_msg_create *c, unsigned retry_ms,
                   bool admitted, const char *fmt, va_list ap)
{
    dsec_err e = {.code = DSEC_E_OVERLOADED, .retry_after_ms = retry_ms};
    int n = vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    if (n >= 0 && (size_t)n < sizeof e.msg)
        snprintf(e.msg + n, sizeof e.msg - (size_t)n, "; retry after %u ms (same req_id)",
                 e.retry_after_ms);
    atomic_fetch_add(&s->n_failed, 1);
    atomic_fetch_add(&s->n_shed, 1);
    dsec_wire_error_to(s->creates, s->bus, reply_to, &e, NULL, c->req_id);
    if (admitted)
        dsec__sched_quota_release(s, c);
}

void dsec__sched_shed(dsec_sched *s, const char *reply_to, const dsec_msg_create *c, uint64_t held,
                      bool admitted, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    shed_v(s, reply_to, c, dsec__sched_retry_after_ms(s, held), admitted, fmt, ap);
    va_end(ap);
}

/* The same for a create not admitted yet, told to wait retry_ms. */

void dsec__sched_shed_args(dsec_sched *s, const char *reply_to, const dsec_msg_create *c,
                           unsigned retry_ms, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    shed_v(s, reply_to, c, retry_ms, false, fmt, ap);
    va_end(ap);
}

/* A create that the limit of admission by delay does not let in now (admit.h). */
void dsec__sched_shed_late(dsec_sched *s, const char *reply_to, const dsec_msg_create *c)
{
    dsec_admit_stats as;
    dsec_admit_stats_get(s->admit, &as);
    atomic_fetch_add(&s->n_shed_late, 1);
    dsec__sched_shed_args(
        s, reply_to, c, as.retry_after_ms,
        "scheduler %s of cell %s: its placements reach their nodes up to %" PRIu64
        " ms late (scheduler.admit_delay_ms %u), so it lets in %" PRIu64 " creates/s",
        s->name, s->cell, as.delay_us / 1000, s->conf.admit_delay_ms, as.limit_per_s);
}

/* ---- the window ------------------------------------------------------------------------ */

#define WINDOW_MIN 512 /* placements on their way a replica may always have */

/* How many placements this replica may have on their way (sent, not yet counted by their
 * node's report): what its nodes take in window_ms, at least WINDOW_MIN; 0: no window. Like a
 * TCP window it clocks itself: a replica whose nodes take more is let send more, and the
 * queue towards them holds about window_ms of work at most, wherever it stands (in
 * nats-server, in a node's socket or mailbox). And how late its placements reach their nodes
 * now: the worst delay of the last window of their nodes' echoes, while it is fresh (judged in
 * the last second). One look at the admission's stats (a mutex) per create, and none for a
 * create without a deadline on a replica without a window. */
void dsec__sched_echoes_of(dsec_sched *s, bool deadline, dsec__sched_echoes *out)
{
    memset(out, 0, sizeof *out);
    if (s->conf.window_ms == 0 && !deadline)
        return;
    dsec_admit_stats as;
    dsec_admit_stats_get(s->admit, &as);
    if (s->conf.window_ms != 0) {
        uint64_t w = as.taken_per_s * s->conf.window_ms / 1000;
        out->window = w > WINDOW_MIN ? w : WINDOW_MIN;
        out->taken_per_s = as.taken_per_s;
    }
    uint64_t now = dsec_admit_stamp();
    if (deadline && as.delay_at_us != 0 && now - as.delay_at_us <= 1000000)
        out->late_ms = as.delay_us / 1000;
}

/* The longest a create shed past the window is told to wait: its client gives up at once when
 * that leaves no time before its deadline, rather than trying again and again. */
#define WINDOW_RETRY_MAX_MS 30000

/* A create past the window: it would wait behind what is on its way. It is given a turn, as
 * in a queue that is not kept: each shed create's turn comes one placement's time (at the rate
 * its nodes take them) after the previous one's, so the clients come back spread out at about
 * the rate they can be let in, once each, instead of all at once and again and again (a
 * retry_after of the window's own length made 3.7 attempts per offered create in the
 * benchmark's overload, and its sheds took the CPU its placements needed). */
void dsec__sched_shed_window(dsec_sched *s, const char *reply_to, const dsec_msg_create *c,
                             uint64_t on_way, uint64_t window, uint64_t taken_per_s)
{
    uint64_t now = dsec_admit_stamp();
    /* the rate the turns come at: what the nodes took lately, or what the smallest window
     * lets through, whichever is more. Too fast, a client comes back to a full window and is
     * given a later turn (one more attempt); too slow, clients wait while the window has room
     * (a burst on a quiet cell, before the rate it takes is known) */
    uint64_t floor_per_s = (uint64_t)WINDOW_MIN * 1000 / s->conf.window_ms;
    uint64_t rate = taken_per_s > floor_per_s ? taken_per_s : floor_per_s;
    uint64_t gap_us = 1000000 / (rate > 0 ? rate : 1);
    pthread_mutex_lock(&s->vmu);
    uint64_t next = atomic_load_explicit(&s->window_next_us, memory_order_relaxed);
    if (next < now + (uint64_t)s->conf.window_ms * 1000)
        next = now + (uint64_t)s->conf.window_ms * 1000; /* what is on its way goes first */
    next += gap_us;
    atomic_store_explicit(&s->window_next_us, next, memory_order_relaxed);
    pthread_mutex_unlock(&s->vmu);
    uint64_t ms = (next - now) / 1000;
    atomic_fetch_add(&s->n_shed_window, 1);
    dsec__sched_shed_args(s, reply_to, c,
                          ms < RETRY_AFTER_MIN_MS    ? RETRY_AFTER_MIN_MS
                          : ms > WINDOW_RETRY_MAX_MS ? WINDOW_RETRY_MAX_MS
                                                     : (unsigned)ms,
                          "scheduler %s of cell %s has %" PRIu64
                          " placements on their way to its nodes, "
                          "what they take in %u ms (scheduler.window_ms; window %" PRIu64 ")",
                          s->name, s->cell, on_way, s->conf.window_ms, window);
}

/* A create let in with room in the window to spare: no queue of shed creates stands, so the
 * next one shed waits only for what is on its way. */
void dsec__sched_window_room(dsec_sched *s, uint64_t on_way, uint64_t window)
{
    if (window == 0 || on_way * 2 > window ||
        atomic_load_explicit(&s->window_next_us, memory_order_relaxed) == 0)
        return;
    pthread_mutex_lock(&s->vmu);
    atomic_store_explicit(&s->window_next_us, 0, memory_order_relaxed);
    pthread_mutex_unlock(&s->vmu);
}
