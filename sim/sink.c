/* sink.c - the replayer's bus sink (requests through dsec_bus) and the cell observers it reports
 * from. */
#include <string.h>

#include "actors/wire.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "codecs/subjects.h"
#include "sim/replay_int.h"

struct sim_bus_sink {
    dsec_bus *bus;
    char url[1024]; /* the server the bus is on: the replayed jobs connect there */
    dsec_actor *obs;
    sim_replay *r;
};

static void on_reply(int status, dsec_msg *reply, const dsec_err *err, void *ud)
{
    if (status < 0) {
        sim_replay_answer(ud, status, NULL, NULL, NULL, 0, err);
        return;
    }
    sim_replay_answer(ud, 0, dsec_msg_type(reply), dsec_msg_header(reply, DSEC_HDR_ERROR_CODE),
                      dsec_msg_data(reply), dsec_msg_len(reply), NULL);
}

static int bus_request(void *ctx, const char *subject, const dsec_hdr *h, const void *data,
                       size_t len, int timeout_ms, void *req, dsec_err *err)
{
    struct sim_bus_sink *s = ctx;
    return dsec_bus_request(s->bus, subject, h, data, len, timeout_ms, on_reply, req, err);
}

static int bus_publish(void *ctx, const char *subject, const dsec_hdr *h, const void *data,
                       size_t len, dsec_err *err)
{
    struct sim_bus_sink *s = ctx;
    return dsec_bus_publish(s->bus, subject, NULL, h, data, len, err);
}

int sim_bus_sink_new(sim_bus_sink **out, dsec_bus *bus, sim_sink *sink, dsec_err *err)
{
    struct sim_bus_sink *s = dsec_calloc(1, sizeof *s);
    if (!s)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "replay: out of memory");
    s->bus = bus;
    sink->request = bus_request;
    sink->publish = bus_publish;
    sink->ctx = s;
    sink->job_url = dsec_bus_connected_url(bus, s->url, sizeof s->url) == 0 ? s->url : NULL;
    *out = s;
    return 0;
}

static void on_capacity(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a;
    struct sim_bus_sink *s = ud;
    dsec_msg_capacity c;
    dsec_err err;
    if (s->r && dsec_decode(dsec_wire_decoder(), DSEC_MSG_CAPACITY, dsec_msg_data(m),
                            dsec_msg_len(m), &c, &err) == 0)
        sim_replay_node_report(s->r, c.node, c.full, c.live, c.cpu_free_milli, c.mem_free_mb);
}

static void on_reclaim(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a;
    struct sim_bus_sink *s = ud;
    dsec_msg_reclaim_outcome o;
    dsec_err err;
    if (s->r && dsec_decode(dsec_wire_decoder(), DSEC_MSG_RECLAIM_OUTCOME, dsec_msg_data(m),
                            dsec_msg_len(m), &o, &err) == 0)
        sim_replay_reclaim(s->r, o.outcome);
}

int sim_bus_sink_observe(sim_bus_sink *s, sim_replay *r, dsec_err *err)
{
    s->r = r;
    if (dsec_actor_new(&s->obs, s->bus, "sim-observer", err) < 0 ||
        dsec_actor_on(s->obs, DSEC_SUBJ_EVT_CAPACITY_ANY, NULL, on_capacity, s, err) < 0 ||
        dsec_actor_on(s->obs, DSEC_SUBJ_CTL "evt.*.reclaim", NULL, on_reclaim, s, err) < 0)
        return dsec_err_wrap(err, "replay: observing the cell");
    return 0;
}

int sim_bus_sink_sync(sim_bus_sink *s, uint64_t *sync, dsec_err *err)
{
    *sync = sim_replay_sync_begin(s->r);
    /* every node answers a sync with a full capacity report */
    return dsec_bus_publish(s->bus, DSEC_SUBJ_SYNC, NULL,
                            &(dsec_hdr){.type = "sync", .schema = DSEC_SCHEMA_VERSION}, "", 0, err);
}

void sim_bus_sink_free(sim_bus_sink *s)
{
    if (!s)
        return;
    if (s->obs)
        dsec_actor_free(s->obs);
    dsec_free(s);
}
