/* pace.c - a client's pacing of its creates while its cell sheds them (see pace.h). */
#include "dsec/pace.h"

#include <pthread.h>
#include <string.h>

#include "dsec/alloc.h"

#define BUCKET_US 100000ull
#define NBUCKETS (DSEC_PACE_SPAN_MS * 1000ull / BUCKET_US)
#define MIN_PER_S 50      /* never slower than this: a cell that accepted nothing is still asked */
#define BURST_US 10000ull /* the bucket holds at most this long of sends */

struct dsec_pace {
    pthread_mutex_t mu;
    uint64_t epoch[NBUCKETS]; /* which BUCKET_US-long slice each bucket counts (+1; 0: none) */
    uint32_t accepted[NBUCKETS];
    uint64_t last_shed_us;       /* 0: none yet */
    uint64_t shed_since_us;      /* when the sheds of this spell began */
    double tokens;               /* the bucket creates go from while paced */
    uint64_t tokens_us;          /* when it was last filled */
    dsec_pace_item *head, *tail; /* the creates held back, first come first */
    size_t n;
    uint64_t held, given_up;
};

dsec_pace *dsec_pace_new(void)
{
    dsec_pace *p = dsec_calloc(1, sizeof *p);
    if (p != NULL)
        pthread_mutex_init(&p->mu, NULL);
    return p;
}

void dsec_pace_free(dsec_pace *p)
{
    if (p == NULL)
        return;
    pthread_mutex_destroy(&p->mu);
    dsec_free(p);
}

/* Written as sums, not differences: a time read before the last shed was told (another thread,
 * or a wall clock stepped back) is still "lately". */
static bool shed_lately(const dsec_pace *p, uint64_t now_us)
{
    return p->last_shed_us != 0 && now_us < p->last_shed_us + DSEC_PACE_HOLD_MS * 1000ull;
}

void dsec_pace_answer(dsec_pace *p, uint64_t now_us, bool shed)
{
    uint64_t e = now_us / BUCKET_US + 1;
    size_t i = (size_t)(e % NBUCKETS);
    pthread_mutex_lock(&p->mu);
    if (p->epoch[i] != e) {
        p->epoch[i] = e;
        p->accepted[i] = 0;
    }
    if (shed) {
        if (!shed_lately(p, now_us))
            p->shed_since_us = now_us; /* sheds begin again */
        if (now_us > p->last_shed_us)
            p->last_shed_us = now_us;
    } else
        p->accepted[i]++;
    pthread_mutex_unlock(&p->mu);
}

/* The accepted rate over the span the buckets cover since the first answer in it, or 0 when
 * that span is shorter than DSEC_PACE_EVIDENCE_MS (mu held). The current bucket counts as
 * far as now has come into it. */
static uint64_t accepted_per_s(const dsec_pace *p, uint64_t now_us)
{
    uint64_t cur = now_us / BUCKET_US + 1, first = 0, n = 0;
    for (size_t i = 0; i < NBUCKETS; i++) {
        if (p->epoch[i] == 0 || p->epoch[i] + NBUCKETS <= cur || p->epoch[i] > cur)
            continue;
        n += p->accepted[i];
        if (first == 0 || p->epoch[i] < first)
            first = p->epoch[i];
    }
    if (first == 0)
        return 0;
    uint64_t span_us = now_us - (first - 1) * BUCKET_US;
    if (span_us < DSEC_PACE_EVIDENCE_MS * 1000ull)
        return 0;
    return n * 1000000ull / span_us;
}

/* The rate creates may go at (mu held); 0: they all may (none shed lately and none queued, or
 * too little measured yet). While creates are shed, a little more than the accepted rate; once
 * none are but some still wait, twice it, as a TCP window grows until a loss. */
static uint64_t send_per_s(const dsec_pace *p, uint64_t now_us, bool queued)
{
    bool shed = shed_lately(p, now_us);
    if (!shed && !queued)
        return 0;
    uint64_t a = accepted_per_s(p, now_us);
    /* nothing measured yet in the first moments of the sheds: the scheduler's own turns spread
     * the first burst; after them a cell that accepts nothing is still paced (MIN_PER_S) */
    if (a == 0 && shed && now_us < p->shed_since_us + DSEC_PACE_EVIDENCE_MS * 1000ull)
        return 0;
    a = shed ? a * DSEC_PACE_K_TENTHS / 10 : a * 2;
    return a > MIN_PER_S ? a : MIN_PER_S;
}

/* Whether one create may go now at the pace (mu held); when not, *next_us is when one may. */
static bool go(dsec_pace *p, uint64_t now_us, bool queued, uint64_t *next_us)
{
    uint64_t rate = send_per_s(p, now_us, queued);
    if (rate == 0) {
        p->tokens = 1;
        p->tokens_us = now_us;
        return true;
    }
    if (now_us > p->tokens_us) {
        double cap = (double)rate * BURST_US / 1e6;
        p->tokens += (double)(now_us - p->tokens_us) * (double)rate / 1e6;
        if (p->tokens > (cap > 1 ? cap : 1))
            p->tokens = cap > 1 ? cap : 1;
        p->tokens_us = now_us;
    }
    if (p->tokens >= 1) {
        p->tokens -= 1;
        return true;
    }
    *next_us = now_us + (uint64_t)((1 - p->tokens) * 1e6 / (double)rate) + 1;
    return false;
}

int dsec_pace_admit(dsec_pace *p, dsec_pace_item *it, uint64_t now_us, bool front)
{
    uint64_t next;
    pthread_mutex_lock(&p->mu);
    if (p->n == 0 && go(p, now_us, false, &next)) {
        pthread_mutex_unlock(&p->mu);
        return 0;
    }
    /* the last in the queue waits for the rest to go first; one at the front goes next. Judged
     * at twice the rate now, the most it grows by while creates wait: a rate still rising
     * (shed creates cost the cell less once they are paced) must not refuse creates that
     * would have made it; one that waits too long is given up by dsec_pace_due instead */
    uint64_t rate = send_per_s(p, now_us, true);
    uint64_t wait = rate ? (uint64_t)(front ? 1 : p->n + 1) * 1000000ull / (2 * rate) : 0;
    if (now_us + wait + DSEC_PACE_MIN_LEFT_MS * 1000ull >= it->deadline_us) {
        p->given_up++;
        pthread_mutex_unlock(&p->mu);
        return -1;
    }
    it->next = NULL;
    if (front) {
        it->next = p->head;
        p->head = it;
        if (p->tail == NULL)
            p->tail = it;
    } else {
        if (p->tail != NULL)
            p->tail->next = it;
        else
            p->head = it;
        p->tail = it;
    }
    p->n++;
    p->held++;
    pthread_mutex_unlock(&p->mu);
    return 1;
}

dsec_pace_item *dsec_pace_due(dsec_pace *p, uint64_t now_us, bool *give_up, uint64_t *next_us)
{
    *give_up = false;
    *next_us = UINT64_MAX;
    pthread_mutex_lock(&p->mu);
    dsec_pace_item *it = p->head;
    if (it == NULL) {
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    if (now_us + DSEC_PACE_MIN_LEFT_MS * 1000ull >= it->deadline_us) {
        *give_up = true;
        p->given_up++;
    } else if (!go(p, now_us, true, next_us)) {
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    p->head = it->next;
    if (p->head == NULL)
        p->tail = NULL;
    p->n--;
    *next_us = p->head != NULL ? now_us : UINT64_MAX;
    pthread_mutex_unlock(&p->mu);
    it->next = NULL;
    return it;
}

size_t dsec_pace_queued(dsec_pace *p)
{
    pthread_mutex_lock(&p->mu);
    size_t n = p->n;
    pthread_mutex_unlock(&p->mu);
    return n;
}

dsec_pace_item *dsec_pace_take_all(dsec_pace *p)
{
    pthread_mutex_lock(&p->mu);
    dsec_pace_item *all = p->head;
    p->head = p->tail = NULL;
    p->n = 0;
    pthread_mutex_unlock(&p->mu);
    return all;
}

void dsec_pace_stats_get(dsec_pace *p, uint64_t now_us, dsec_pace_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&p->mu);
    out->shed_lately = shed_lately(p, now_us);
    out->accepted_per_s = accepted_per_s(p, now_us);
    out->send_per_s = send_per_s(p, now_us, p->n > 0);
    out->held = p->held;
    out->given_up = p->given_up;
    out->queued = p->n;
    pthread_mutex_unlock(&p->mu);
}
