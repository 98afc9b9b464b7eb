/* clock.h - the one clock of every module: monotonic and wall time in nanoseconds. */
#ifndef DSEC_CLOCK_H
#define DSEC_CLOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CLOCK_MONOTONIC in nanoseconds: deadlines, timeouts, durations. */
uint64_t dsec_now_ns(void);
/* CLOCK_REALTIME in nanoseconds: what other hosts or a restart must read (records, events). */
uint64_t dsec_wall_ns(void);

#ifdef __cplusplus
}
#endif
#endif
