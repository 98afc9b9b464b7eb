/* record.c - dsec-sim record: a passive tap writing bus traffic to a trace file. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "codecs/subjects.h"
#include "codecs/msg.h"
#include "codecs/record.h"
#include "actors/wire.h"
#include "dsec/alloc.h"
#include "dsec/log.h"
#include "sim/sim.h"

const char *const sim_record_default_subjects[] = {
    DSEC_SUBJ_ROOT "*.create",
    DSEC_SUBJ_ROOT "*.create.*",
    DSEC_SUBJ_ROOT "*.sbx.>",
    DSEC_SUBJ_JOB_ANY,
    DSEC_SUBJ_HOLD_ANY,
    DSEC_SUBJ_CTL "evt.*.reclaim",
    "_INBOX.>",
    NULL,
};

struct sim_recorder {
    dsec_bus *bus;
    dsec_actor *tap;
    dsec_record_writer *w;
    pthread_mutex_t mu;
    _Atomic uint64_t n, failed;
    dsec_err first_err;
};

static void on_msg(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a;
    struct sim_recorder *r = ud;
    const char *subject = dsec_msg_subject(m), *type = dsec_msg_type(m);
    /* of the replies, only "created" (it maps recorded sandbox ids to creates) */
    if (strncmp(subject, "_INBOX.", 7) == 0 && (!type || strcmp(type, "created") != 0))
        return;
    dsec_trace_record rec = {0};
    dsec_trace_create c = {0};
    rec.ts_ns = sim_wall_ns();
    rec.subject = (char *)subject;
    rec.msg_type = (char *)(type ? type : "");
    const char *rid = dsec_msg_header(m, DSEC_HDR_REQ_ID);
    rec.req_id = (char *)(rid ? rid : "");
    rec.payload.data = (uint8_t *)dsec_msg_data(m);
    rec.payload.len = dsec_msg_len(m);
    rec.expects_reply = dsec_msg_reply(m) != NULL;
    dsec_msg_create cm;
    dsec_err err;
    if (type && strcmp(type, "create") == 0 &&
        dsec_decode(dsec_wire_decoder(), DSEC_MSG_CREATE, rec.payload.data, rec.payload.len, &cm,
                    &err) == 0) {
        c.type = (char *)(cm.type ? cm.type : "");
        c.cpu_milli = cm.cpu_milli;
        c.memory_mb = cm.memory_mb;
        c.job_id = (char *)(cm.rollout_id ? cm.rollout_id : "");
        c.class_ = (char *)(cm.cls ? cm.cls : "");
        rec.create = &c;
    }
    pthread_mutex_lock(&r->mu);
    if (dsec_trace_record_write(r->w, &rec, &err) < 0) {
        if (atomic_fetch_add(&r->failed, 1) == 0)
            r->first_err = err;
    } else
        atomic_fetch_add(&r->n, 1);
    pthread_mutex_unlock(&r->mu);
}

int sim_record_start(sim_recorder **out, dsec_bus *bus, FILE *f, const char *const *subjects,
                     const char *cmdline, dsec_err *err)
{
    struct sim_recorder *r = dsec_calloc(1, sizeof *r);
    if (!r)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "record: out of memory");
    r->bus = bus;
    pthread_mutex_init(&r->mu, NULL);
    r->w = dsec_record_writer_new_file(f, 0);
    dsec_record_kv me = {"command", (char *)(cmdline ? cmdline : "")};
    dsec_trace_header h = {.format_version = DSEC_TRACE_FORMAT_VERSION,
                           .created_ns = sim_wall_ns(),
                           .source = "dsec-sim record",
                           .n_metadata = 1,
                           .metadata = &me};
    if (!r->w || dsec_trace_header_write(r->w, &h, err) < 0 ||
        dsec_actor_new(&r->tap, bus, "sim-recorder", err) < 0)
        goto fail;
    for (const char *const *s = subjects ? subjects : sim_record_default_subjects; *s; s++)
        if (dsec_actor_on(r->tap, *s, NULL, on_msg, r, err) < 0) {
            dsec_err_wrap(err, "record: subscribing to %s", *s);
            goto fail;
        }
    if (dsec_bus_flush(bus, 2000, err) < 0)
        goto fail;
    *out = r;
    return 0;
fail:
    if (r->tap)
        dsec_actor_free(r->tap);
    dsec_record_writer_free(r->w);
    pthread_mutex_destroy(&r->mu);
    dsec_free(r);
    return -1;
}

uint64_t sim_record_count(sim_recorder *r)
{
    return atomic_load(&r->n);
}

int sim_record_stop(sim_recorder *r, uint64_t *dropped, dsec_err *err)
{
    /* Drain the tap: its subscriptions stop, and what the server already
     * sent reaches the mailbox and is written before the handler stops.
     * Waiting for an empty mailbox instead missed messages still in nats.c's
     * queue of another subscription (a "created" reply behind the destroys
     * that follow it), and the recording lost their sandboxes. */
    dsec_err derr = {0};
    int drained = dsec_actor_drain(r->tap, 10000, &derr);
    dsec_actor_stats st;
    dsec_bus_stats bs;
    dsec_actor_stats_get(r->tap, &st);
    dsec_bus_stats_get(r->bus, &bs);
    dsec_actor_free(r->tap);
    /* lost by the mailbox, by nats.c's queue (slow consumer), or by a drain
     * that ran out of time */
    if (drained < 0) /* what it waited for, and that the count below is a floor */
        dsec_log(DSEC_LOG_WARN,
                 "record: the tap did not drain (%s); %" PRIu64
                 " messages still queued count as dropped, at least",
                 derr.msg, st.mailbox_depth + 1);
    if (dropped)
        *dropped = st.dropped + bs.slow_consumers + (drained < 0 ? st.mailbox_depth + 1 : 0);
    int rc = 0;
    if (atomic_load(&r->failed)) {
        *err = r->first_err;
        rc = dsec_err_wrap(err, "record: %lu records could not be written",
                           (unsigned long)atomic_load(&r->failed));
    }
    if (dsec_record_writer_flush(r->w, rc == 0 ? err : &(dsec_err){0}) < 0)
        rc = -1;
    dsec_record_writer_free(r->w);
    pthread_mutex_destroy(&r->mu);
    dsec_free(r);
    return rc;
}
