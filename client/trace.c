/* trace.c - libdsec's side of tracing: the caller's trace id, and gathering a trace's hops from
 * every process. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/internal.h"
#include "codecs/msg.h"
#include "codecs/subjects.h"
#include "dsec/alloc.h"

#define TRACE_SUBJECT DSEC_SUBJ_TRACE /* actors/tracer.h: every process answers */

int dsec_trace_set(const char *trace_id, dsec_err *err)
{
    if (dsec_trace_set_thread(trace_id) < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "trace id \"%.80s\": use 1-%d printable characters without spaces",
                            trace_id, DSEC_TRACE_ID_MAX);
    return 0;
}

const char *dsec_trace_get(void)
{
    return dsec_trace_current();
}

/* The answers as they arrive (on the gathering actor's thread). */
struct gather {
    pthread_mutex_t mu;
    dsec_trace_hop_info *hops;
    size_t n, cap, answered;
    bool nomem;
};

static void copy(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src != NULL ? src : "");
}

static void on_answer(dsec_actor *a, dsec_msg *m, void *ud)
{
    struct gather *g = ud;
    dsec_decoder *dec = NULL;
    dsec_err err;
    dsec_msg_trace_hops th;
    (void)a;
    const char *type = dsec_msg_type(m);
    if (type == NULL || strcmp(type, "trace_hops") != 0)
        return; /* an error from one process: the others still count */
    if ((dec = dsec_decoder_new(NULL)) == NULL)
        return;
    if (dsec_decode(dec, DSEC_MSG_TRACE_HOPS, dsec_msg_data(m), dsec_msg_len(m), &th, &err) == 0) {
        pthread_mutex_lock(&g->mu);
        g->answered++;
        const dsec_msg_trace_hop *items = th.hops.items;
        for (uint32_t i = 0; i < th.hops.n; i++) {
            if (g->n == g->cap) {
                size_t ncap = g->cap ? g->cap * 2 : 16;
                dsec_trace_hop_info *nh = dsec_realloc(g->hops, ncap * sizeof *nh);
                if (nh == NULL) {
                    g->nomem = true;
                    break;
                }
                g->hops = nh;
                g->cap = ncap;
            }
            dsec_trace_hop_info *h = &g->hops[g->n++];
            copy(h->process, sizeof h->process, th.process);
            copy(h->actor, sizeof h->actor, items[i].actor);
            copy(h->subject, sizeof h->subject, items[i].subject);
            copy(h->type, sizeof h->type, items[i].type);
            copy(h->sent, sizeof h->sent, items[i].sent);
            copy(h->kept, sizeof h->kept, items[i].kept);
            h->error = items[i].error;
            h->start_ns = items[i].start_ns;
            h->end_ns = items[i].end_ns;
        }
        pthread_mutex_unlock(&g->mu);
    }
    dsec_decoder_free(dec);
}

static int by_start(const void *a, const void *b)
{
    const dsec_trace_hop_info *x = a, *y = b;
    if (x->start_ns != y->start_ns)
        return x->start_ns < y->start_ns ? -1 : 1;
    return x->end_ns < y->end_ns ? -1 : x->end_ns > y->end_ns;
}

int dsec_trace_hops(dsec_client *c, const char *trace_id, int window_ms, dsec_trace_hop_info **hops,
                    size_t *n, size_t *answered, dsec_err *err)
{
    *hops = NULL;
    *n = 0;
    if (answered != NULL)
        *answered = 0;
    if (!dsec_trace_id_ok(trace_id))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "trace id \"%.80s\": 1-%d printable characters without spaces",
                            trace_id ? trace_id : "", DSEC_TRACE_ID_MAX);
    if (window_ms <= 0)
        window_ms = 500;
    dsec_bus *bus = dsec__client_bus(c);
    struct gather g = {0};
    pthread_mutex_init(&g.mu, NULL);
    char id[33], inbox[160];
    dsec_bus_new_id(id);
    snprintf(inbox, sizeof inbox, "%s.trace.%s", dsec_bus_inbox_prefix(bus), id);
    dsec_actor *act = NULL;
    dsec_buf b;
    dsec_buf_init(&b);
    int rc = -1;
    dsec_msg_trace_query q = {.trace_id = trace_id};
    /* The query has a trace of its own: it is not a hop of the one asked about. */
    dsec_hdr hdr = {.type = "trace_query", .schema = DSEC_SCHEMA_VERSION, .trace_id = id};
    if (dsec_actor_new(&act, bus, "trace-gather", err) < 0 ||
        dsec_actor_on(act, inbox, NULL, on_answer, &g, err) < 0 ||
        dsec_bus_flush(bus, 2000, err) < 0 || dsec_encode(&b, DSEC_MSG_TRACE_QUERY, &q, err) < 0 ||
        dsec_bus_publish(bus, TRACE_SUBJECT, inbox, &hdr, b.data, b.len, err) < 0 ||
        dsec_bus_flush(bus, 2000, err) < 0)
        goto out;
    struct timespec ts = {window_ms / 1000, (long)(window_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0)
        ;
    rc = 0;
out:
    if (act != NULL)
        dsec_actor_free(act); /* waits for a handler still running */
    dsec_buf_release(&b);
    pthread_mutex_destroy(&g.mu);
    if (rc == 0 && g.nomem) {
        dsec_free(g.hops);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "trace: out of memory gathering hops");
    }
    if (rc < 0) {
        dsec_free(g.hops);
        return -1;
    }
    if (g.n > 1)
        qsort(g.hops, g.n, sizeof *g.hops, by_start);
    *hops = g.hops;
    *n = g.n;
    if (answered != NULL)
        *answered = g.answered;
    return 0;
}

void dsec_trace_hops_free(dsec_trace_hop_info *hops)
{
    dsec_free(hops);
}
