/* sched-int.h - the scheduler replica's state, shared by its files: scheduler.c (creates,
 * placement, events, ticks) and sched-admit.c (admission: the bound, the window, sheds). */
#ifndef DSEC_ACTORS_SCHED_INT_H
#define DSEC_ACTORS_SCHED_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "actors/admit.h"
#include "actors/lost.h"
#include "actors/placement.h"
#include "actors/scheduler.h"
#include "codecs/msg.h"
#include "dsec/clock.h"
#include "dsec/names.h"

#define MAX_CELLS 64

struct cell_seen {
    char name[DSEC_NAME_LEN_MAX + 1];
    uint64_t slots_free, cpu_free, mem_free, nodes;
    char types[256]; /* ",a,b," for a quick membership test */
    uint64_t seen_ms;
};

/* A rollout create waiting for room: the place message as it will be sent. */
struct waiter {
    struct waiter *next;
    uint64_t since_ms, cpu, mem, disk;
    int tidx;
    size_t len;
    char trace[DSEC_TRACE_ID_MAX + 1]; /* the create's trace id: placed later, it keeps it */
    uint8_t place[];                   /* encoded dsec_msg_place */
};

struct dsec_sched {
    dsec_bus *bus;
    dsec_ticker *ticker;
    const dsec_registry *reg;
    dsec_placement *view;
    dsec_actor *creates; /* create requests and refusals coming back */
    dsec_actor *events;  /* capacity events: their own mailbox, never behind creates */
    dsec_sched_conf conf;
    char cell[DSEC_NAME_LEN_MAX + 1];
    char name[DSEC_NAME_LEN_MAX + 1];
    char back[256];       /* where nodes send refused placements */
    char quota_subj[128]; /* dsec.v1.ctl.quota.<cell>.admit */
    dsec_lost *lost;      /* nodes silent for lost_after_ms: told to owners, reconciled on return */
    int ticks[3];
    pthread_mutex_t mu;  /* cells */
    pthread_mutex_t wmu; /* the wait queue */
    /* Requests in flight whose callbacks use this scheduler (admissions,
     * lookups): dsec_sched_stop waits for their callbacks before freeing it. */
    pthread_mutex_t amu;
    pthread_cond_t acv;
    unsigned asking;
    bool stopping; /* no new such request */
    struct waiter *whead, *wtail;
    uint64_t nwaiting, wait_cpu, wait_mem;
    uint64_t nticking; /* waiters tick_wait has taken out of the queue for its pass */
    bool demand_sent;  /* the last demand report said something is waiting */
    struct cell_seen cells[MAX_CELLS];
    size_t ncells;
    _Atomic uint64_t n_creates, n_placed, n_retried, n_forwarded, n_failed, n_expired, n_waited,
        n_over_quota, n_admitted, n_shed;
    /* The drain rate: placements sent per second, smoothed over demand ticks
     * (tick_wait), in thousandths; with what it holds it sets retry_after_ms. */
    _Atomic uint64_t drain_milli_per_s;
    _Atomic uint64_t held_seen;                /* what it held at the last create's admission */
    uint64_t drain_last_placed, drain_last_ms; /* tick_wait's alone */
    dsec_metrics_hist place_lat; /* create received -> place sent (first placements) */
    dsec_admit *admit;           /* admission by delay (admit.h) */
    _Atomic uint64_t n_shed_late, n_shed_window;
    /* the window's turns: when the last create shed past the window was told to come back
     * (µs on dsec_admit_stamp's clock), under vmu */
    pthread_mutex_t vmu;
    _Atomic uint64_t window_next_us;
};

static inline uint64_t dsec__sched_now_ms(void)
{
    return dsec_now_ns() / 1000000ull;
}

/* A create admitted by the quota actor that will not become a sandbox here: its admission
 * goes back. */
void dsec__sched_quota_release(dsec_sched *s, const dsec_msg_create *c);

/* ---- admission (sched-admit.c) ---------------------------------------------------------- */

/* The work this replica holds now (sum: the view's summary of its cell), and the same with a
 * fresh look at the view. */
uint64_t dsec__sched_held_in(dsec_sched *s, const dsec_cell_summary *sum);
uint64_t dsec__sched_held_now(dsec_sched *s);
/* How long a shed create should wait: the time to place what it holds (10..2000 ms). */
unsigned dsec__sched_retry_after_ms(dsec_sched *s, uint64_t held);
/* Answer a create "overloaded" (retry-safe: nothing was placed): with the retry_after_ms for
 * the work it holds; told to wait retry_ms; shed by the limit of admission by delay.
 * admitted: the quota actor admitted it, so that admission goes back. */
void dsec__sched_shed(dsec_sched *s, const char *reply_to, const dsec_msg_create *c, uint64_t held,
                      bool admitted, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
void dsec__sched_shed_args(dsec_sched *s, const char *reply_to, const dsec_msg_create *c,
                           unsigned retry_ms, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void dsec__sched_shed_late(dsec_sched *s, const char *reply_to, const dsec_msg_create *c);
/* What admission reads of the replica's node echoes for one create, in one look at them (none
 * when there is no window and the create has no deadline). */
typedef struct dsec__sched_echoes {
    uint64_t window; /* placements that may be on their way (scheduler.window_ms); 0: no window */
    uint64_t taken_per_s; /* the rate the replica's nodes take them (with a window) */
    uint64_t late_ms;     /* how late its placements reach their nodes now (with a deadline); 0: not
                             late, or not known lately */
} dsec__sched_echoes;
void dsec__sched_echoes_of(dsec_sched *s, bool deadline, dsec__sched_echoes *out);
/* A create past the window, given its turn to come back. */
void dsec__sched_shed_window(dsec_sched *s, const char *reply_to, const dsec_msg_create *c,
                             uint64_t on_way, uint64_t window, uint64_t taken_per_s);
/* A create let in: with room to spare in the window, no queue of shed creates stands. */
void dsec__sched_window_room(dsec_sched *s, uint64_t on_way, uint64_t window);

#endif
