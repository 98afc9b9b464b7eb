/* net-alert.c - alerts: events counted per window and sandbox, flushed by their own thread. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/net/net-int.h"
#include "backends/net/net-node-int.h"
#include "backends/net/net.h"
#include "dsec/alloc.h"

/* ---- alerts ------------------------------------------------------------------------------- */

static uint64_t fnv(const char *s, uint64_t h)
{
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211u;
    return h;
}

/* Count one event (any thread). Copies what the flush needs, so the sandbox
 * may be gone by then. */
void dsec__net_alert_note(dsec_net *n, const dsec_net_sbx *s, const char *kind, const char *dest,
                          const char *detail)
{
    uint64_t h = fnv(kind, fnv(dest, fnv(detail, 1469598103934665603u ^ s->idx)));
    uint64_t now = dsec__net_wall_ns();
    pthread_mutex_lock(&n->alock);
    for (size_t probe = 0; probe < 8; probe++) {
        struct agg *a = &n->agg[(h + probe) % AGG_SLOTS];
        if (a->used && a->idx == s->idx && strcmp(a->kind, kind) == 0 &&
            strcmp(a->dest, dest) == 0 && strcmp(a->detail, detail) == 0 &&
            strcmp(a->sandbox, s->id) == 0) {
            a->count++;
            a->last_ns = now;
            goto out;
        }
        if (!a->used) {
            memset(a, 0, sizeof *a);
            a->used = true;
            a->idx = s->idx;
            snprintf(a->sandbox, sizeof a->sandbox, "%s", s->id);
            snprintf(a->tenant, sizeof a->tenant, "%s", s->tenant ? s->tenant : "");
            snprintf(a->kind, sizeof a->kind, "%s", kind);
            snprintf(a->dest, sizeof a->dest, "%s", dest);
            snprintf(a->detail, sizeof a->detail, "%s", detail);
            a->count = 1;
            a->first_ns = a->last_ns = now;
            goto out;
        }
    }
    n->agg_dropped++;
out:
    pthread_mutex_unlock(&n->alock);
}

/* Emit a window's alerts: at most alerts_per_window per sandbox, the rest
 * summed into one "suppressed" alert per sandbox. */
static void alert_flush(dsec_net *n)
{
    struct agg *batch = n->batch;
    size_t nb = 0;
    uint64_t lost;
    pthread_mutex_lock(&n->alock);
    for (size_t i = 0; i < AGG_SLOTS; i++) {
        if (n->agg[i].used) {
            batch[nb++] = n->agg[i];
            n->agg[i].used = false;
        }
    }
    lost = n->agg_dropped;
    n->agg_dropped = 0;
    pthread_mutex_unlock(&n->alock);

    uint32_t per = n->conf.alerts_per_window;
    for (size_t i = 0; i < nb; i++) {
        if (!batch[i].used)
            continue;
        uint32_t emitted = 0;
        uint64_t supp = 0, supp_first = 0, supp_last = 0;
        for (size_t j = i; j < nb; j++) {
            struct agg *a = &batch[j];
            if (!a->used || a->idx != batch[i].idx || strcmp(a->sandbox, batch[i].sandbox) != 0)
                continue;
            if (emitted < per) {
                dsec_net_alert al = {a->sandbox, a->tenant, a->kind,     a->dest,
                                     a->detail,  a->count,  a->first_ns, a->last_ns};
                if (n->conf.on_alert)
                    n->conf.on_alert(n->conf.alert_arg, &al);
                emitted++;
            } else {
                supp += a->count;
                if (!supp_first || a->first_ns < supp_first)
                    supp_first = a->first_ns;
                if (a->last_ns > supp_last)
                    supp_last = a->last_ns;
            }
            if (j != i)
                a->used = false;
        }
        if (supp) {
            dsec_net_alert al = {batch[i].sandbox, batch[i].tenant, "suppressed", "", "", supp,
                                 supp_first,       supp_last};
            if (n->conf.on_alert)
                n->conf.on_alert(n->conf.alert_arg, &al);
        }
        batch[i].used = false;
        pthread_mutex_lock(&n->alock);
        n->alerts += emitted + (supp ? 1 : 0);
        n->suppressed += supp;
        pthread_mutex_unlock(&n->alock);
    }
    if (lost) {
        pthread_mutex_lock(&n->alock);
        n->suppressed += lost;
        pthread_mutex_unlock(&n->alock);
    }
}

void *dsec__net_flusher_main(void *arg)
{
    dsec_net *n = arg;
    pthread_mutex_lock(&n->alock);
    while (!n->stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)n->conf.alert_window_ms * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&n->stop_cv, &n->alock, &ts);
        pthread_mutex_unlock(&n->alock);
        alert_flush(n);
        pthread_mutex_lock(&n->alock);
    }
    pthread_mutex_unlock(&n->alock);
    alert_flush(n); /* what the last window held */
    return NULL;
}
