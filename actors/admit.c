/* admit.c - a scheduler replica's admission by delay: node echoes of placement stamps set the
 * rate of creates it lets in (admit.h says why and how). */
#include "actors/admit.h"

#include <pthread.h>

#include "dsec/alloc.h"
#include "dsec/clock.h"

#define WINDOW_US 200000ull      /* a window is judged after 200 ms and 8 echoes; one that has */
#define WINDOW_SAMPLES 8         /* fewer after twice that starts afresh */
#define LIMIT_MIN 20.0           /* creates/s: never shut the door */
#define LIMIT_IDLE_US 1000000ull /* a limit that shed nothing this long goes */
#define BASE_PERIOD_US 10000000ull
#define RETRY_MIN_MS 20.0
#define RETRY_MAX_MS 5000.0

struct dsec_admit {
    pthread_mutex_t mu;
    uint64_t target_us;
    /* the window being filled */
    uint64_t win_start_us;
    uint64_t win_echoes, win_late, win_worst_us, win_sum_us, win_taken;
    uint64_t win_admitted, win_shed;
    double taken_per_s; /* placements the nodes take, per s (smoothed over windows) */
    /* The least delay seen, over the last 10-20 s (two 10 s periods): what a placement takes
     * with nothing queued (a busy or distant host's own). Only delay past it is queueing. */
    uint64_t base_cur_us, base_prev_us, base_since_us;
    double limit; /* creates/s; 0: none */
    double tokens;
    uint64_t refill_us, last_shed_us;
    double retry_ms;
    /* stats */
    uint64_t last_worst_us, late, echoes, cuts;
    uint64_t last_close_us; /* when the last window was judged (last_worst_us) */
};

dsec_admit *dsec_admit_new(uint32_t target_ms)
{
    dsec_admit *a = dsec_calloc(1, sizeof *a);
    if (a == NULL)
        return NULL;
    pthread_mutex_init(&a->mu, NULL);
    a->target_us = (uint64_t)target_ms * 1000;
    a->base_cur_us = a->base_prev_us = UINT64_MAX;
    double r = 4.0 * target_ms;
    a->retry_ms = r < RETRY_MIN_MS ? RETRY_MIN_MS : r > RETRY_MAX_MS ? RETRY_MAX_MS : r;
    return a;
}

void dsec_admit_free(dsec_admit *a)
{
    if (a == NULL)
        return;
    pthread_mutex_destroy(&a->mu);
    dsec_free(a);
}

uint64_t dsec_admit_stamp(void)
{
    return dsec_now_ns() / 1000 + 1; /* never 0: 0 is "not stamped" */
}

static double burst(const dsec_admit *a)
{
    double b = a->limit * 0.05;
    return b < 4 ? 4 : b;
}

static void window_reset(dsec_admit *a, uint64_t now_us)
{
    a->win_start_us = now_us;
    a->win_echoes = a->win_late = a->win_worst_us = a->win_sum_us = a->win_taken = 0;
    a->win_admitted = a->win_shed = 0;
}

/* A window late enough to act on: the limit becomes what the nodes take, less a share that
 * drains their backlog in about half a second (the later, the larger the share), unless it
 * is lower already (the backlog is draining). */
static void cut(dsec_admit *a, double taken_now, uint64_t mean_us, uint64_t now_us)
{
    double over = mean_us > a->target_us ? (double)(mean_us - a->target_us) : 0;
    double f = 1.0 - over / 5e5;
    f = f < 0.5 ? 0.5 : f > 0.95 ? 0.95 : f;
    double mu = taken_now > a->taken_per_s ? taken_now : a->taken_per_s;
    double lim = mu * f < LIMIT_MIN ? LIMIT_MIN : mu * f;
    if (a->limit != 0 && lim >= a->limit)
        return;
    a->limit = lim;
    if (a->tokens > burst(a))
        a->tokens = burst(a);
    if (a->refill_us == 0)
        a->refill_us = now_us;
    a->last_shed_us = now_us; /* a new limit has not had its chance to shed */
    a->cuts++;
}

/* Judge a full window (WINDOW_US, WINDOW_SAMPLES echoes), then begin the next. Under a->mu. */
static void close_window(dsec_admit *a, uint64_t now_us)
{
    double taken = (double)a->win_taken * 1e6 / (double)(now_us - a->win_start_us);
    a->taken_per_s = a->taken_per_s > 0 ? 0.5 * a->taken_per_s + 0.5 * taken : taken;
    if (a->win_late * 10 > a->win_echoes) {
        cut(a, taken, a->win_sum_us / a->win_echoes, now_us);
    } else if (a->limit > 0 && a->win_late * 20 < a->win_echoes) {
        a->limit = now_us - a->last_shed_us >= LIMIT_IDLE_US ? 0 : a->limit * 1.05;
    }
    a->last_worst_us = a->win_worst_us;
    a->last_close_us = now_us;
    if (a->limit > 0 && a->win_shed > 0) {
        if (a->win_shed > a->win_admitted)
            a->retry_ms *= 1.25;
        else if (a->win_shed * 4 < a->win_admitted)
            a->retry_ms *= 0.8;
        a->retry_ms = a->retry_ms < RETRY_MIN_MS   ? RETRY_MIN_MS
                      : a->retry_ms > RETRY_MAX_MS ? RETRY_MAX_MS
                                                   : a->retry_ms;
    }
    window_reset(a, now_us);
}

static void maybe_close(dsec_admit *a, uint64_t now_us)
{
    if (a->win_start_us == 0) {
        a->win_start_us = now_us;
        return;
    }
    uint64_t age = now_us - a->win_start_us;
    if (age >= WINDOW_US && a->win_echoes >= WINDOW_SAMPLES) {
        close_window(a, now_us);
    } else if (age >= 2 * WINDOW_US) {
        /* Too few echoes to judge: the cell is quiet, or was until just now. Its rate would
         * be measured over the quiet part too, so the window starts afresh. */
        if (a->limit > 0 && now_us - a->last_shed_us >= LIMIT_IDLE_US)
            a->limit = 0;
        window_reset(a, now_us);
    }
}

void dsec_admit_echo(dsec_admit *a, uint64_t sent_us, uint64_t age_us, uint64_t taken,
                     uint64_t now_us)
{
    if (a == NULL || sent_us == 0 || sent_us > now_us)
        return; /* not ours, or not a stamp this clock made */
    uint64_t delay = now_us - sent_us > age_us ? now_us - sent_us - age_us : 0;
    pthread_mutex_lock(&a->mu);
    maybe_close(a, now_us);
    if (now_us - a->base_since_us >= BASE_PERIOD_US) {
        a->base_prev_us = a->base_cur_us;
        a->base_cur_us = UINT64_MAX;
        a->base_since_us = now_us;
    }
    if (delay < a->base_cur_us)
        a->base_cur_us = delay;
    uint64_t base = a->base_cur_us < a->base_prev_us ? a->base_cur_us : a->base_prev_us;
    delay -= base;                                         /* queueing only */
    bool late = a->target_us != 0 && delay > a->target_us; /* 0: measured, never acted on */
    a->win_echoes++;
    a->echoes++;
    a->win_late += late;
    a->late += late;
    a->win_sum_us += delay;
    a->win_taken += taken;
    if (delay > a->win_worst_us)
        a->win_worst_us = delay;
    pthread_mutex_unlock(&a->mu);
}

bool dsec_admit_take(dsec_admit *a, uint64_t now_us)
{
    if (a == NULL || a->target_us == 0)
        return true;
    pthread_mutex_lock(&a->mu);
    maybe_close(a, now_us);
    bool ok = true;
    if (a->limit > 0) {
        if (now_us > a->refill_us) {
            a->tokens += (double)(now_us - a->refill_us) * a->limit / 1e6;
            a->refill_us = now_us;
        }
        if (a->tokens > burst(a))
            a->tokens = burst(a);
        ok = a->tokens >= 1;
        if (ok)
            a->tokens -= 1;
    }
    if (ok) {
        a->win_admitted++;
    } else {
        a->win_shed++;
        a->last_shed_us = now_us;
    }
    pthread_mutex_unlock(&a->mu);
    return ok;
}

unsigned dsec_admit_retry_after_ms(dsec_admit *a)
{
    pthread_mutex_lock(&a->mu);
    unsigned ms = (unsigned)a->retry_ms;
    pthread_mutex_unlock(&a->mu);
    return ms;
}

void dsec_admit_stats_get(dsec_admit *a, dsec_admit_stats *out)
{
    pthread_mutex_lock(&a->mu);
    *out = (dsec_admit_stats){.limit_per_s = (uint64_t)a->limit,
                              .delay_us = a->last_worst_us,
                              .delay_at_us = a->last_close_us,
                              .late = a->late,
                              .echoes = a->echoes,
                              .cuts = a->cuts,
                              .taken_per_s = (uint64_t)a->taken_per_s,
                              .retry_after_ms = (unsigned)a->retry_ms};
    pthread_mutex_unlock(&a->mu);
}
