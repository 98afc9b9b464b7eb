/* ticker.h - one thread that runs periodic work (reports, heartbeats, reaping) for many actors. */
#ifndef DSEC_ACTORS_TICKER_H
#define DSEC_ACTORS_TICKER_H

#include <stdint.h>

#include "dsec/clock.h"
#include "dsec/err.h"

typedef struct dsec_ticker dsec_ticker;

/* Called on the ticker thread; must not block for long (it delays others). */
typedef void (*dsec_tick_fn)(void *ud, uint64_t now_ns);

int dsec_ticker_new(dsec_ticker **out, dsec_err *err);
/* Stops the thread; every task must have been removed. NULL is a no-op. */
void dsec_ticker_free(dsec_ticker *t);

/* Run fn(ud) every every_ms (>= 1). Returns a task id (>= 0). */
int dsec_ticker_add(dsec_ticker *t, uint32_t every_ms, dsec_tick_fn fn, void *ud, dsec_err *err);
/* Remove a task; when this returns, fn is not running and will not run. */
void dsec_ticker_remove(dsec_ticker *t, int id);

/* dsec_now_ns and dsec_wall_ns are dsec/clock.h's (included above). */

#endif
