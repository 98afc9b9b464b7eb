/* admit.h - a scheduler replica's admission by delay: how late its placements reach their nodes
 * (stamps the nodes hand back) sets the rate of creates it lets in. */
#ifndef DSEC_ACTORS_ADMIT_H
#define DSEC_ACTORS_ADMIT_H

#include <stdbool.h>
#include <stdint.h>

/*
 * Why. Past what the cell can do, the backlog does not sit in the replica: it sits in
 * nats-server's buffers and the sockets on the way to the nodes, where no mailbox sees it. A
 * node's capacity reports clear the replica's reservations on arrival, so the work a replica
 * holds looks small while each placement spends seconds on its way. So every placement
 * carries the replica's own clock (place.sent_us), each node hands the newest one back in its
 * next capacity report (capacity.echo, with how long ago it took it), and the replica reads
 * the delay on one clock: now - sent_us - age_us.
 *
 * Only delay past the least one seen in the last 10-20 s counts: a slow or distant host's
 * own trip is not a queue.
 *
 * How. Echoes are judged per window of at least WINDOW_US and WINDOW_SAMPLES echoes (one that
 * has fewer after twice WINDOW_US starts afresh, so a quiet spell is not averaged in). A
 * window where more than a tenth of the echoes came late (delay > target) sets a rate limit:
 * what the nodes took (the window's rate or the smoothed one, the higher), less a share that
 * drains their backlog in about half a second (5% to 50%, the later the more); it only ever
 * lowers a limit. A window with fewer than a twentieth late raises the limit by 5%; a limit
 * that sheds nothing for a whole second goes. Creates are let in by a token bucket at the
 * limit (50 ms of burst). With target 0 the delays are measured and nothing is acted on.
 *
 * A shed create is told when to come back. Shed clients come back and meet the same limit, so
 * the wait grows by a quarter in every window that shed more creates than it let in, and
 * shrinks by a fifth in one that shed fewer than a quarter as many: the retries settle near
 * what the limit lets in, rather than multiplying the messages per create.
 *
 * A node that takes nothing hands nothing back: this only sees nodes that are slow, not
 * silent (heartbeats and the drain rule handle those).
 *
 * Thread-safe: create handlers and the capacity-event actor call it at once.
 */

typedef struct dsec_admit dsec_admit;

typedef struct dsec_admit_stats {
    uint64_t limit_per_s;  /* the rate limit now; 0: none */
    uint64_t delay_us;     /* the last window's worst delay */
    uint64_t delay_at_us;  /* when that window ended (dsec_admit_stamp's clock); 0: none yet */
    uint64_t late, echoes; /* echoes later than the target, and all, since start */
    uint64_t cuts;         /* times the limit was set or lowered */
    uint64_t taken_per_s;  /* placements its nodes take per second, as their echoes count */
    unsigned retry_after_ms;
} dsec_admit_stats;

/* target_ms 0: delays are measured (stats) but no limit is ever set: dsec_admit_take always
 * lets in. NULL when out of memory. */
dsec_admit *dsec_admit_new(uint32_t target_ms);
void dsec_admit_free(dsec_admit *a);

/* The stamp for a placement about to be sent (µs on this replica's monotonic clock). */
uint64_t dsec_admit_stamp(void);

/* A node's echo: the placement stamped sent_us was taken age_us before the report, read now,
 * and taken placements were taken since that node's previous echo. */
void dsec_admit_echo(dsec_admit *a, uint64_t sent_us, uint64_t age_us, uint64_t taken,
                     uint64_t now_us);

/* Whether to let one create in now; false: shed it. */
bool dsec_admit_take(dsec_admit *a, uint64_t now_us);

/* What a create shed by the limit should wait before its retry, ms. */
unsigned dsec_admit_retry_after_ms(dsec_admit *a);

void dsec_admit_stats_get(dsec_admit *a, dsec_admit_stats *out);

#endif
