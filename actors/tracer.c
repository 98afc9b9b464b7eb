/* tracer.c - answers dsec.v1.ctl.trace with this process's kept hops of one request. */
#include "actors/tracer.h"

#include <stdio.h>
#include <string.h>

#include "actors/wire.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"

#define HOPS_MAX 1024 /* per answer */

struct dsec_tracer {
    dsec_actor *actor;
    char process[128];
};

static void on_query(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_tracer *t = ud;
    dsec_msg_trace_query q;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_TRACE_QUERY, dsec_msg_data(m), dsec_msg_len(m),
                    &q, &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    dsec_trace_hop *hops = NULL;
    size_t n = 0;
    if (dsec_bus_trace_hops(dsec_actor_bus(a), q.trace_id, &hops, &n, &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    if (n > HOPS_MAX) { /* the newest: an answer must fit in one message */
        memmove(hops, hops + (n - HOPS_MAX), HOPS_MAX * sizeof *hops);
        n = HOPS_MAX;
    }
    dsec_msg_trace_hop *items = n > 0 ? dsec_calloc(n, sizeof *items) : NULL;
    if (n > 0 && items == NULL) {
        dsec_free(hops);
        dsec_err_set(&err, DSEC_E_NOMEM, 0, "trace: out of memory for %zu hops", n);
        dsec_wire_error(a, m, &err);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const dsec_trace_hop *h = &hops[i];
        items[i] = (dsec_msg_trace_hop){.trace_id = h->trace_id,
                                        .actor = h->actor,
                                        .subject = h->subject[0] ? h->subject : NULL,
                                        .type = h->type[0] ? h->type : NULL,
                                        .sent = h->sent[0] ? h->sent : NULL,
                                        .error = h->error,
                                        .kept = h->kept,
                                        .start_ns = (uint64_t)h->start_ns,
                                        .end_ns = (uint64_t)h->end_ns};
    }
    dsec_msg_trace_hops out = {.process = t->process, .hops = {items, (uint32_t)n}};
    if (dsec_wire_reply(a, m, DSEC_MSG_TRACE_HOPS, &out, &err) < 0)
        dsec_actor_count_error(a);
    dsec_free(items);
    dsec_free(hops);
}

int dsec_tracer_start(dsec_tracer **out, dsec_bus *bus, const char *process,
                      const dsec_trace_conf *conf, dsec_err *err)
{
    *out = NULL;
    if (dsec_bus_trace_conf(bus, conf, err) < 0)
        return -1;
    dsec_tracer *t = dsec_calloc(1, sizeof *t);
    if (t == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "tracer: out of memory");
    snprintf(t->process, sizeof t->process, "%s", process);
    char name[160];
    snprintf(name, sizeof name, "tracer-%s", process);
    if (dsec_actor_new(&t->actor, bus, name, err) < 0 ||
        dsec_actor_on(t->actor, DSEC_TRACE_SUBJECT, NULL, on_query, t, err) < 0) {
        if (t->actor != NULL)
            dsec_actor_free(t->actor);
        dsec_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void dsec_tracer_stop(dsec_tracer *t)
{
    if (t == NULL)
        return;
    dsec_actor_free(t->actor);
    dsec_free(t);
}
