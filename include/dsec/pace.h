/* pace.h - a client's pacing of its creates while its cell answers them "overloaded".
 *
 * A scheduler that sheds a create (its window of placements on their way is full) answers
 * "overloaded" with a retry_after_ms. A client that kept sending every create it was asked for
 * would have most of them shed, and every shed costs the cell two messages and a decode that
 * its placements needed. So while its creates are being shed, a client sends them no faster
 * than a little more than the rate its cell has been accepting them (DSEC_PACE_K_TENTHS / 10
 * times it), first come first served; the rest wait in a queue on the client, which costs the
 * cell nothing. A create whose wait there would pass its deadline even at twice the rate now is
 * answered "overloaded" by the client at once, and one whose deadline comes too near while it
 * waits when it reaches the front. When none has been shed for DSEC_PACE_HOLD_MS, the queue goes at
 * twice the accepted rate until it is empty (a TCP window's growth until a loss); then nothing is
 * paced.
 *
 * The rate is measured from the answers themselves, so a cell that takes more is sent more:
 * with K above 1 the client always offers a little more than was taken, and the scheduler's
 * window decides. libdsec's creates (client/create.c), the simulator's replay and the
 * control-plane benchmark pace the same way. Thread-safe. */
#ifndef DSEC_PACE_H
#define DSEC_PACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sends while pacing: at most this many times the rate creates were accepted (tenths). */
#define DSEC_PACE_K_TENTHS 12
/* Pacing lasts while a create was shed in the last DSEC_PACE_HOLD_MS. */
#define DSEC_PACE_HOLD_MS 500
/* The accepted rate is measured over the last DSEC_PACE_SPAN_MS of answers, and pacing
 * waits for DSEC_PACE_EVIDENCE_MS of them: the first answers of a burst say little. */
#define DSEC_PACE_SPAN_MS 1000
#define DSEC_PACE_EVIDENCE_MS 200

typedef struct dsec_pace dsec_pace;

/* A pace with nothing measured; NULL when out of memory. Freed with dsec_pace_free. */
dsec_pace *dsec_pace_new(void);
void dsec_pace_free(dsec_pace *p);

/* A create's answer at now_us (any one clock, the same for every call): shed ("overloaded")
 * or accepted (created). Other answers say nothing of the cell's room and are not told. */
void dsec_pace_answer(dsec_pace *p, uint64_t now_us, bool shed);

/* The time a create's answer needs to come back: one that would go with less than this left
 * before its deadline is answered "overloaded" by the client instead. */
#define DSEC_PACE_MIN_LEFT_MS 20

/* A create the pace may hold back: the caller embeds it in its own request. */
typedef struct dsec_pace_item {
    struct dsec_pace_item *next; /* the pace's */
    uint64_t deadline_us;        /* the create's deadline, on the clock now_us is read from */
} dsec_pace_item;

/* A create about to be sent at now_us (it->deadline_us set). 0: it goes now; 1: it waits in the
 * pace's queue, first come first served (front: ahead of the rest, for a create shed earlier
 * that comes back from its retry_after_ms), until dsec_pace_due hands it back; -1: its wait
 * there would pass its deadline even at twice the rate now, so it is answered "overloaded"
 * now. The item stays the caller's; the queue only links it. */
int dsec_pace_admit(dsec_pace *p, dsec_pace_item *it, uint64_t now_us, bool front);

/* The next held create whose turn has come at now_us, or whose deadline is now too near to send
 * it (*give_up: answer it "overloaded"); NULL when neither. *next_us: when to ask again
 * (UINT64_MAX: nothing is held). */
dsec_pace_item *dsec_pace_due(dsec_pace *p, uint64_t now_us, bool *give_up, uint64_t *next_us);

/* How many creates are held back now. */
size_t dsec_pace_queued(dsec_pace *p);

/* Every held create, unlinked from the pace (a list through next), for a client that closes. */
dsec_pace_item *dsec_pace_take_all(dsec_pace *p);

/* What the pace measures now, for logs and benchmarks. */
typedef struct dsec_pace_stats {
    bool shed_lately;        /* a create was shed in the last DSEC_PACE_HOLD_MS */
    uint64_t accepted_per_s; /* accepted over the measured span */
    uint64_t send_per_s;     /* the rate queued creates go at now (0: no pace) */
    uint64_t held;           /* creates held back in the queue, ever */
    uint64_t given_up;       /* creates answered "overloaded" by the pace, ever */
    size_t queued;           /* creates held back now */
} dsec_pace_stats;
void dsec_pace_stats_get(dsec_pace *p, uint64_t now_us, dsec_pace_stats *out);

#ifdef __cplusplus
}
#endif
#endif
