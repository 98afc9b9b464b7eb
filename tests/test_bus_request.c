/* test_bus_request.c - bus integration tests: request/reply, deadlines and no responders. */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "bus/bus.h"
/* White box: the header tests compare the bus's reading of raw header
 * blocks with nats.c's own parser on the same received message. */
#include "bus/internal.h"
#include "bus/js.h"
#include "dsec/alloc.h"
#include "dsec/err.h"

#include "tests/bus_kit.h"

/* ---- group request: request/reply ---------------------------------------- */

typedef struct rr_slot {
    struct rr_many *st;
    uint32_t index;
    atomic_int calls;
    int status;
    int code;
    bool payload_ok;
} rr_slot;

typedef struct rr_many {
    counter done;
    rr_slot *slots;
} rr_many;

static void rr_cb(int status, dsec_msg *reply, const dsec_err *err, void *ud)
{
    rr_slot *s = ud;
    s->status = status;
    s->code = err != NULL ? err->code : -1;
    s->payload_ok = status == 0 && reply != NULL && dsec_msg_len(reply) == 4 &&
                    get_u32(dsec_msg_data(reply)) == s->index;
    atomic_fetch_add(&s->calls, 1);
    counter_add(&s->st->done, 1);
}

static void request_many_in_flight(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *srv_bus = bus_open(&s, "responder", 2, 0, NULL);
    dsec_bus *cli_bus = bus_open(&s, "requester", 2, 0, NULL);
    dsec_actor *echo = actor_on(srv_bus, "echo", "test.rr.echo", echo_handler, NULL);
    flush(srv_bus);

    const uint32_t n = 5000;
    rr_many st;
    counter_init(&st.done);
    st.slots = dsec_calloc(n, sizeof *st.slots);
    dsec_err err;
    for (uint32_t i = 0; i < n; i++) {
        st.slots[i].st = &st;
        st.slots[i].index = i;
        unsigned char b[4];
        put_u32(b, i);
        if (dsec_bus_request(cli_bus, "test.rr.echo", NULL, b, sizeof b, 10000, rr_cb, &st.slots[i],
                             &err) != 0)
            fail_msg("request %u: %s", i, err.msg);
    }
    assert_true(counter_wait(&st.done, n, WAIT_MS));
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(atomic_load(&st.slots[i].calls), 1);
        assert_int_equal(st.slots[i].status, 0);
        assert_true(st.slots[i].payload_ok);
    }
    /* The responder counts a reply after publishing it: the requester may
     * see the last reply first. */
    dsec_actor_stats as;
    int64_t t0 = now_ms();
    do
        dsec_actor_stats_get(echo, &as);
    while (as.msgs_out < n && now_ms() - t0 < WAIT_MS);
    assert_int_equal(as.msgs_out, n);
    assert_int_equal(as.msgs_in, n);
    dsec_bus_stats bs;
    dsec_bus_stats_get(cli_bus, &bs);
    assert_int_equal(bs.requests_pending, 0);

    dsec_bus_free(cli_bus);
    dsec_bus_free(srv_bus);
    server_stop(&s);
    /* Freeing did not call anything twice. */
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(atomic_load(&st.slots[i].calls), 1);
    dsec_free(st.slots);
    counter_destroy(&st.done);
}

static void request_future_and_sync(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "fut", 2, 0, NULL);
    actor_on(bus, "echo", "test.rr.fut", echo_handler, NULL);
    flush(bus);
    dsec_err err;

    dsec_future *f = NULL;
    dsec_hdr h = {.type = "q", .req_id = "rid-7", .trace_id = "trace-7"};
    assert_int_equal(dsec_bus_request_future(bus, "test.rr.fut", &h, "abcd", 4, 5000, &f, &err), 0);
    dsec_msg *reply = NULL;
    assert_int_equal(dsec_future_wait(f, &reply, &err), 0);
    assert_non_null(reply);
    assert_int_equal(dsec_msg_len(reply), 4);
    assert_memory_equal(dsec_msg_data(reply), "abcd", 4);
    assert_string_equal(dsec_msg_type(reply), "echo");
    /* The reply carries the request's ids. */
    assert_string_equal(dsec_msg_header(reply, DSEC_HDR_TRACE_ID), "trace-7");
    assert_string_equal(dsec_msg_header(reply, DSEC_HDR_REQ_ID), "rid-7");
    assert_null(dsec_msg_reply(reply));
    dsec_future_free(f);

    dsec_msg *owned = NULL;
    assert_int_equal(dsec_bus_request_sync(bus, "test.rr.fut", NULL, "xyz", 3, 5000, &owned, &err),
                     0);
    assert_non_null(owned);
    assert_memory_equal(dsec_msg_data(owned), "xyz", 3);
    assert_memory_equal(dsec_msg_subject(owned), "_INBOX.", 7); /* the bus's inbox */
    dsec_msg_free(owned);

    /* A future freed before its answer: the answer is dropped, no leak. */
    for (int i = 0; i < 50; i++) {
        assert_int_equal(dsec_bus_request_future(bus, "test.rr.fut", NULL, "z", 1, 5000, &f, &err),
                         0);
        dsec_future_free(f);
    }
    flush(bus);

    /* Bad arguments are refused up front. */
    assert_int_equal(dsec_bus_request(bus, "test.rr.fut", NULL, "z", 1, 0, rr_cb, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_int_equal(dsec_bus_request(bus, "test.rr.fut", NULL, "z", 1, 100, NULL, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_int_equal(dsec_bus_request(bus, "", NULL, "z", 1, 100, rr_cb, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);

    dsec_bus_free(bus);
    server_stop(&s);
}

static void error_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_err err;
    dsec_hdr h = {.type = DSEC_TYPE_ERROR};
    dsec_msg_respond(a, m, &h, "bad", 3, &err);
}

static void request_error_reply_is_status_0(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "errreply", 2, 0, NULL);
    actor_on(bus, "err", "test.rr.err", error_handler, NULL);
    flush(bus);
    dsec_err err;
    dsec_msg *reply = NULL;
    assert_int_equal(dsec_bus_request_sync(bus, "test.rr.err", NULL, "q", 1, 5000, &reply, &err),
                     0);
    assert_string_equal(dsec_msg_type(reply), DSEC_TYPE_ERROR);
    assert_memory_equal(dsec_msg_data(reply), "bad", 3);
    dsec_msg_free(reply);
    dsec_bus_free(bus);
    server_stop(&s);
}

/* The reply copies the request's ids, however long the requester made them:
 * it must still be sent (it once failed past a 512-byte header block). */
static void request_long_ids_answered(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "longids", 2, 0, NULL);
    actor_on(bus, "echo", "test.rr.longids", echo_handler, NULL);
    flush(bus);
    static char rid[3001], tid[3001];
    memset(rid, 'r', sizeof rid - 1);
    memset(tid, 't', sizeof tid - 1);
    dsec_hdr h = {.type = "ping", .schema = 1, .req_id = rid, .trace_id = tid};
    dsec_err err;
    dsec_msg *reply = NULL;
    if (dsec_bus_request_sync(bus, "test.rr.longids", &h, "q", 1, 5000, &reply, &err) != 0)
        fail_msg("request with 3000-byte ids: %s", err.msg);
    assert_string_equal(dsec_msg_header(reply, DSEC_HDR_REQ_ID), rid);
    assert_string_equal(dsec_msg_header(reply, DSEC_HDR_TRACE_ID), tid);
    assert_memory_equal(dsec_msg_data(reply), "q", 1);
    dsec_msg_free(reply);
    /* a value with CR/LF would forge headers: refused, not sent */
    dsec_hdr bad = {.type = "ping", .req_id = "x\r\nDsec-Type: create"};
    assert_int_equal(dsec_bus_publish(bus, "test.rr.longids", NULL, &bad, "q", 1, &err), -1);
    dsec_bus_free(bus);
    server_stop(&s);
}
/* ---- group timeout: deadlines and no responders -------------------------- */

static void request_timeout(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "timeout", 2, 0, NULL);
    counter got;
    counter_init(&got);
    actor_on(bus, "silent", "test.rr.silent", silent_handler, &got);
    flush(bus);

    dsec_err err;
    dsec_msg *reply = NULL;
    int64_t t0 = now_ms();
    assert_int_equal(dsec_bus_request_sync(bus, "test.rr.silent", NULL, "q", 1, 200, &reply, &err),
                     -1);
    int64_t took = now_ms() - t0;
    assert_null(reply);
    assert_int_equal(err.code, DSEC_E_TIMEOUT);
    assert_non_null(strstr(err.msg, "test.rr.silent"));
    assert_non_null(strstr(err.msg, "200 ms"));
    assert_true(took >= 190);
    assert_true(took < 2000);
    assert_true(counter_wait(&got, 1, WAIT_MS)); /* it did arrive, just no answer */

    /* Many deadlines at once, each answered exactly once. */
    const uint32_t n = 200;
    rr_many st;
    counter_init(&st.done);
    st.slots = dsec_calloc(n, sizeof *st.slots);
    for (uint32_t i = 0; i < n; i++) {
        st.slots[i].st = &st;
        st.slots[i].index = i;
        assert_int_equal(dsec_bus_request(bus, "test.rr.silent", NULL, "q", 1,
                                          50 + (int)(i % 10) * 30, rr_cb, &st.slots[i], &err),
                         0);
    }
    assert_true(counter_wait(&st.done, n, WAIT_MS));
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(atomic_load(&st.slots[i].calls), 1);
        assert_int_equal(st.slots[i].status, -1);
        assert_int_equal(st.slots[i].code, DSEC_E_TIMEOUT);
    }
    dsec_bus_free(bus);
    server_stop(&s);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(atomic_load(&st.slots[i].calls), 1);
    dsec_free(st.slots);
    counter_destroy(&st.done);
    counter_destroy(&got);
}

/* Deadlines of many distinct timeouts (more than the bus keeps in FIFO
 * classes) and repeats of each: every request times out, no sooner than its
 * timeout, and the callbacks (one worker, so one queue) come in deadline
 * order. */
#define TO_DISTINCT 12
#define TO_REPEAT 3

typedef struct to_order {
    pthread_mutex_t mu;
    counter done;
    int64_t t0;
    int seq[TO_DISTINCT * TO_REPEAT];
    int n;
    struct to_slot {
        struct to_order *o;
        int idx, timeout_ms, code, calls;
        int64_t took_ms;
    } slots[TO_DISTINCT * TO_REPEAT];
} to_order;

static void to_cb(int status, dsec_msg *reply, const dsec_err *err, void *ud)
{
    struct to_slot *sl = ud;
    to_order *o = sl->o;
    pthread_mutex_lock(&o->mu);
    sl->code = status == 0 ? 0 : err->code;
    sl->took_ms = now_ms() - o->t0;
    sl->calls++;
    o->seq[o->n++] = sl->idx;
    pthread_mutex_unlock(&o->mu);
    counter_add(&o->done, 1);
}

static void request_timeouts_in_order(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "toorder", 1, 0, NULL);
    counter got;
    counter_init(&got);
    actor_on(bus, "silent", "test.rr.silent", silent_handler, &got);
    flush(bus);

    to_order *o = dsec_calloc(1, sizeof *o);
    pthread_mutex_init(&o->mu, NULL);
    counter_init(&o->done);
    /* Interleaved, not sorted: 40 ms steps, issued within a few ms. */
    static const int order[TO_DISTINCT] = {7, 2, 11, 0, 5, 9, 3, 10, 1, 6, 8, 4};
    dsec_err err;
    o->t0 = now_ms();
    int n = 0;
    for (int r = 0; r < TO_REPEAT; r++) {
        for (int j = 0; j < TO_DISTINCT; j++) {
            struct to_slot *sl = &o->slots[n];
            *sl = (struct to_slot){.o = o, .idx = n, .timeout_ms = 60 + order[j] * 40};
            assert_int_equal(dsec_bus_request(bus, "test.rr.silent", NULL, "q", 1, sl->timeout_ms,
                                              to_cb, sl, &err),
                             0);
            n++;
        }
    }
    assert_true(counter_wait(&o->done, n, WAIT_MS));
    pthread_mutex_lock(&o->mu);
    for (int i = 0; i < n; i++) {
        assert_int_equal(o->slots[i].calls, 1);
        assert_int_equal(o->slots[i].code, DSEC_E_TIMEOUT);
        assert_true(o->slots[i].took_ms >= o->slots[i].timeout_ms);
    }
    /* Deadline order: by timeout, then by issue order. */
    for (int i = 1; i < n; i++) {
        const struct to_slot *a = &o->slots[o->seq[i - 1]], *b = &o->slots[o->seq[i]];
        if (a->timeout_ms > b->timeout_ms || (a->timeout_ms == b->timeout_ms && a->idx > b->idx))
            fail_msg("request %d (%d ms) timed out after request %d (%d ms)", a->idx, a->timeout_ms,
                     b->idx, b->timeout_ms);
    }
    pthread_mutex_unlock(&o->mu);
    dsec_bus_free(bus);
    server_stop(&s);
    pthread_mutex_destroy(&o->mu);
    counter_destroy(&o->done);
    dsec_free(o);
    counter_destroy(&got);
}

static void request_no_responders(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "noresp", 2, 0, NULL);
    dsec_err err;
    dsec_msg *reply = NULL;
    int64_t t0 = now_ms();
    assert_int_equal(dsec_bus_request_sync(bus, "test.rr.nobody", NULL, "q", 1, 5000, &reply, &err),
                     -1);
    int64_t took = now_ms() - t0;
    assert_int_equal(err.code, DSEC_E_NO_RESPONDERS);
    assert_non_null(strstr(err.msg, "test.rr.nobody"));
    assert_true(took < 1000); /* well before the 5 s deadline */
    dsec_bus_free(bus);
    server_stop(&s);
}

/* An ordinary callback may block. While one is held, requests sent later
 * are answered without waiting for it, on the requester's other inbox; with
 * every callback inbox held, on the bus's workers. A callback may wait for
 * another answer (dsec_bus_request_sync). Each callback runs exactly once. */
typedef struct held_cb {
    gate *g;
    rr_slot slot;
} held_cb;

static void held_reply_cb(int status, dsec_msg *reply, const dsec_err *err, void *ud)
{
    held_cb *h = ud;
    gate_pass(h->g);
    rr_cb(status, reply, err, &h->slot);
}

typedef struct sync_in_cb {
    dsec_bus *bus;
    counter done;
    atomic_int calls;
    int status;    /* of the request this callback answers */
    int inner;     /* of the request it made itself */
    bool inner_ok; /* its reply carried the payload sent */
} sync_in_cb;

static void sync_in_cb_cb(int status, dsec_msg *reply, const dsec_err *err, void *ud)
{
    sync_in_cb *c = ud;
    c->status = status;
    dsec_msg *r = NULL;
    dsec_err e;
    c->inner = dsec_bus_request_sync(c->bus, "test.rr.echo", NULL, "abcd", 4, 10000, &r, &e);
    c->inner_ok = c->inner == 0 && dsec_msg_len(r) == 4 && memcmp(dsec_msg_data(r), "abcd", 4) == 0;
    dsec_msg_free(r);
    atomic_fetch_add(&c->calls, 1);
    counter_add(&c->done, 1);
}

/* n ordinary requests to the echo actor; fails the test if one is refused. */
static void send_echoes(dsec_bus *bus, rr_many *st, uint32_t n)
{
    counter_init(&st->done);
    st->slots = dsec_calloc(n, sizeof *st->slots);
    dsec_err err;
    for (uint32_t i = 0; i < n; i++) {
        st->slots[i].st = st;
        st->slots[i].index = i;
        unsigned char b[4];
        put_u32(b, i);
        if (dsec_bus_request(bus, "test.rr.echo", NULL, b, sizeof b, 10000, rr_cb, &st->slots[i],
                             &err) != 0)
            fail_msg("request %u: %s", i, err.msg);
    }
}

static void check_echoes(rr_many *st, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(atomic_load(&st->slots[i].calls), 1);
        assert_int_equal(st->slots[i].status, 0);
        assert_true(st->slots[i].payload_ok);
    }
    counter_destroy(&st->done);
    dsec_free(st->slots);
}

/* Request i of held_st, answered by an echo: its callback blocks on g until the test opens it;
 * back once the callback is entered (the i+1th on g). */
static void send_held(dsec_bus *bus, gate *g, rr_many *held_st, held_cb *h, int i)
{
    *h = (held_cb){.g = g, .slot = {.st = held_st, .index = (uint32_t)i}};
    unsigned char b[4];
    put_u32(b, (uint32_t)i);
    dsec_err err;
    if (dsec_bus_request(bus, "test.rr.echo", NULL, b, sizeof b, 20000, held_reply_cb, h, &err) !=
        0)
        fail_msg("held request %d: %s", i, err.msg);
    assert_true(gate_wait_entered(g, i + 1, WAIT_MS));
}

static void held_callbacks_are_routed_around(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *srv_bus = bus_open(&s, "responder", 2, 0, NULL);
    dsec_bus *cli_bus = bus_open(&s, "requester", 2, 0, NULL);
    actor_on(srv_bus, "echo", "test.rr.echo", echo_handler, NULL);
    flush(srv_bus);
    dsec_err err;
    gate g;
    gate_init(&g);
    rr_many held_st;
    counter_init(&held_st.done);
    held_cb held[2];
    for (int i = 0; i < 2; i++) {
        send_held(cli_bus, &g, &held_st, &held[i], i);
        if (i == 1)
            break;
        /* one callback held past the stall threshold (1 ms): 500 requests
         * sent now are all answered while it still blocks */
        usleep(20000);
        rr_many later;
        send_echoes(cli_bus, &later, 500);
        assert_true(counter_wait(&later.done, 500, WAIT_MS));
        check_echoes(&later, 500);
        /* a callback that waits for another answer gets it */
        sync_in_cb c = {.bus = cli_bus};
        counter_init(&c.done);
        assert_int_equal(
            dsec_bus_request(cli_bus, "test.rr.echo", NULL, "q", 1, 20000, sync_in_cb_cb, &c, &err),
            0);
        assert_true(counter_wait(&c.done, 1, WAIT_MS));
        assert_int_equal(c.status, 0);
        assert_int_equal(c.inner, 0);
        assert_true(c.inner_ok);
        assert_int_equal(atomic_load(&c.calls), 1);
        counter_destroy(&c.done);
    }
    /* both callback inboxes held: the bus's workers answer what comes next */
    usleep(20000);
    rr_many last;
    send_echoes(cli_bus, &last, 200);
    assert_true(counter_wait(&last.done, 200, WAIT_MS));
    check_echoes(&last, 200);
    assert_int_equal(atomic_load(&held[0].slot.calls), 0);
    assert_int_equal(atomic_load(&held[1].slot.calls), 0);

    gate_open(&g);
    assert_true(counter_wait(&held_st.done, 2, WAIT_MS));
    for (int i = 0; i < 2; i++) {
        assert_int_equal(held[i].slot.status, 0);
        assert_true(held[i].slot.payload_ok);
    }
    dsec_bus_free(cli_bus);
    dsec_bus_free(srv_bus);
    server_stop(&s);
    for (int i = 0; i < 2; i++)
        assert_int_equal(atomic_load(&held[i].slot.calls), 1);
    assert_false(g.timed_out);
    gate_destroy(&g);
    counter_destroy(&held_st.done);
}

/* Reply callbacks do not need a bus worker. The requester's only worker is
 * held by a handler, so a callback that needed a worker could not run:
 * direct answers still arrive (replies, a chain of requests sent from
 * callbacks, a timeout, no responders), each exactly once, and so does an
 * ordinary request's reply, which runs on its inbox's delivery thread. An
 * ordinary request that times out is answered on a worker, so its callback
 * waits for the worker. */
typedef struct direct_chain {
    dsec_bus *bus;
    counter done;
    atomic_uint next; /* the index the next request carries */
    uint32_t total;
    atomic_int bad; /* wrong payload, error, or an index answered twice */
    atomic_uchar *seen;
} direct_chain;

static void direct_chain_cb(int status, dsec_msg *reply, const dsec_err *err, void *ud);

static void direct_chain_send(direct_chain *c)
{
    uint32_t i = atomic_fetch_add(&c->next, 1);
    if (i >= c->total)
        return;
    unsigned char b[4];
    put_u32(b, i);
    dsec_err err;
    if (dsec_bus_request_direct(c->bus, "test.rr.echo", NULL, b, sizeof b, 10000, direct_chain_cb,
                                c, &err) != 0) {
        atomic_fetch_add(&c->bad, 1);
        counter_add(&c->done, 1);
    }
}

static void direct_chain_cb(int status, dsec_msg *reply, const dsec_err *err, void *ud)
{
    direct_chain *c = ud;
    if (status != 0 || dsec_msg_len(reply) != 4)
        atomic_fetch_add(&c->bad, 1);
    else {
        uint32_t i = get_u32(dsec_msg_data(reply));
        if (i >= c->total || atomic_exchange(&c->seen[i], 1) != 0)
            atomic_fetch_add(&c->bad, 1);
    }
    counter_add(&c->done, 1);
    direct_chain_send(c); /* a direct callback may send requests */
}

static void request_direct_skips_workers(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *srv_bus = bus_open(&s, "responder", 2, 0, NULL);
    dsec_bus *cli_bus = bus_open(&s, "requester", 1, 0, NULL);
    actor_on(srv_bus, "echo", "test.rr.echo", echo_handler, NULL);
    counter got;
    counter_init(&got);
    actor_on(srv_bus, "silent", "test.rr.silent", silent_handler, &got);
    par_state ps;
    gate_init(&ps.g);
    counter_init(&ps.a_done);
    actor_on(cli_bus, "hold", "test.direct.hold", blocking_handler, &ps);
    flush(srv_bus);
    flush(cli_bus);
    dsec_err err;
    /* the requester's one worker is now taken */
    assert_int_equal(dsec_bus_publish(cli_bus, "test.direct.hold", NULL, NULL, "h", 1, &err), 0);
    assert_true(gate_wait_entered(&ps.g, 1, WAIT_MS));

    /* an ordinary request's reply does not wait for the worker; its timeout does */
    rr_many queued;
    counter_init(&queued.done);
    queued.slots = dsec_calloc(2, sizeof *queued.slots);
    queued.slots[0].st = queued.slots[1].st = &queued;
    unsigned char b0[4];
    put_u32(b0, 0);
    assert_int_equal(dsec_bus_request(cli_bus, "test.rr.echo", NULL, b0, sizeof b0, 10000, rr_cb,
                                      &queued.slots[0], &err),
                     0);
    assert_int_equal(dsec_bus_request(cli_bus, "test.rr.silent", NULL, "q", 1, 100, rr_cb,
                                      &queued.slots[1], &err),
                     0);
    assert_true(counter_wait(&queued.done, 1, WAIT_MS));
    assert_int_equal(queued.slots[0].status, 0);
    assert_true(queued.slots[0].payload_ok);

    /* direct ones do not: 64 chains of requests sent from their callbacks */
    const uint32_t total = 2000;
    direct_chain c = {.bus = cli_bus, .total = total};
    counter_init(&c.done);
    c.seen = dsec_calloc(total, sizeof *c.seen);
    for (int k = 0; k < 64; k++)
        direct_chain_send(&c);
    assert_true(counter_wait(&c.done, total, WAIT_MS));
    assert_int_equal(atomic_load(&c.bad), 0);
    for (uint32_t i = 0; i < total; i++)
        assert_int_equal(atomic_load(&c.seen[i]), 1);

    /* failures reach direct callbacks too, once each */
    rr_many fails;
    counter_init(&fails.done);
    fails.slots = dsec_calloc(2, sizeof *fails.slots);
    for (uint32_t i = 0; i < 2; i++) {
        fails.slots[i].st = &fails;
        fails.slots[i].index = i;
    }
    assert_int_equal(dsec_bus_request_direct(cli_bus, "test.rr.silent", NULL, "q", 1, 100, rr_cb,
                                             &fails.slots[0], &err),
                     0);
    assert_int_equal(dsec_bus_request_direct(cli_bus, "test.rr.nobody", NULL, "q", 1, 5000, rr_cb,
                                             &fails.slots[1], &err),
                     0);
    assert_true(counter_wait(&fails.done, 2, WAIT_MS));
    assert_int_equal(fails.slots[0].code, DSEC_E_TIMEOUT);
    assert_int_equal(fails.slots[1].code, DSEC_E_NO_RESPONDERS);

    /* the ordinary timeout (100 ms, long past) is still waiting for the
     * worker, then gets its answer */
    assert_int_equal(atomic_load(&queued.slots[1].calls), 0);
    gate_open(&ps.g);
    assert_true(counter_wait(&queued.done, 2, WAIT_MS));
    assert_int_equal(queued.slots[1].code, DSEC_E_TIMEOUT);

    dsec_bus_free(cli_bus);
    dsec_bus_free(srv_bus);
    server_stop(&s);
    for (uint32_t i = 0; i < 2; i++)
        assert_int_equal(atomic_load(&fails.slots[i].calls), 1);
    assert_int_equal(atomic_load(&queued.slots[0].calls), 1);
    assert_int_equal(atomic_load(&queued.slots[1].calls), 1);
    gate_destroy(&ps.g);
    counter_destroy(&got);
    counter_destroy(&ps.a_done);
    counter_destroy(&c.done);
    counter_destroy(&fails.done);
    counter_destroy(&queued.done);
    dsec_free(c.seen);
    dsec_free(fails.slots);
    dsec_free(queued.slots);
}

static dsec_bus *bus_open_shared(server *s, const char *name, int threads)
{
    dsec_bus_opts o = {
        .url = dsec_natsd_url(s->srv), .name = name, .threads = threads, .shared_delivery = true};
    dsec_bus *bus = NULL;
    dsec_err err;
    if (dsec_bus_connect(&bus, &o, &err) != 0)
        fail_msg("connecting to %s: %s", o.url, err.msg);
    return bus;
}

/* Buses on nats.c's shared delivery pool (at most 4 threads in a process): reply callbacks run
 * on the bus's workers, not on the pool. Five callbacks blocked at once, each in a reply queue
 * of its own - more than the pool has threads - leave every subscription of the process
 * delivered: 200 requests answered meanwhile (the responder's actor and the requester's inbox are
 * on that pool). Were the callbacks run on the pool, as a bus with a thread per subscription
 * runs them, they would hold all of its threads. */
static void shared_delivery_callbacks_never_hold_the_pool(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *srv_bus = bus_open_shared(&s, "responder", 2);
    dsec_bus *cli_bus = bus_open_shared(&s, "requester", 8);
    actor_on(srv_bus, "echo", "test.rr.echo", echo_handler, NULL);
    flush(srv_bus);
    dsec_err err;
    gate g;
    gate_init(&g);
    rr_many held_st;
    counter_init(&held_st.done);
    enum { HELD = 5 };
    held_cb held[HELD];
    for (int i = 0; i < HELD; i++) {
        /* 63 answered requests between two held ones: the next id starts a reply queue's run */
        for (int k = 0; i > 0 && k < 63; k++) {
            dsec_msg *r = NULL;
            assert_int_equal(
                dsec_bus_request_sync(cli_bus, "test.rr.echo", NULL, "f", 1, 10000, &r, &err), 0);
            dsec_msg_free(r);
        }
        send_held(cli_bus, &g, &held_st, &held[i], i);
    }
    for (int k = 0; k < 200; k++) {
        dsec_msg *r = NULL;
        char q[16];
        int n = snprintf(q, sizeof q, "q%d", k);
        if (dsec_bus_request_sync(cli_bus, "test.rr.echo", NULL, q, (size_t)n, 5000, &r, &err) != 0)
            fail_msg("request %d while %d callbacks are held: %s", k, HELD, err.msg);
        assert_int_equal(dsec_msg_len(r), (size_t)n);
        assert_memory_equal(dsec_msg_data(r), q, (size_t)n);
        dsec_msg_free(r);
    }
    for (int i = 0; i < HELD; i++)
        assert_int_equal(atomic_load(&held[i].slot.calls), 0); /* still held */
    gate_open(&g);
    assert_true(counter_wait(&held_st.done, HELD, WAIT_MS));
    for (int i = 0; i < HELD; i++) {
        assert_int_equal(held[i].slot.status, 0);
        assert_true(held[i].slot.payload_ok);
    }
    dsec_bus_free(cli_bus);
    dsec_bus_free(srv_bus);
    server_stop(&s);
    assert_false(g.timed_out);
    gate_destroy(&g);
    counter_destroy(&held_st.done);
}

const struct CMUnitTest bus_request_tests[] = {
    cmocka_unit_test(request_many_in_flight),
    cmocka_unit_test(request_future_and_sync),
    cmocka_unit_test(request_error_reply_is_status_0),
    cmocka_unit_test(request_long_ids_answered),
};
const size_t bus_request_ntests = sizeof bus_request_tests / sizeof bus_request_tests[0];

const struct CMUnitTest bus_timeout_tests[] = {
    cmocka_unit_test(request_timeout),
    cmocka_unit_test(request_timeouts_in_order),
    cmocka_unit_test(request_no_responders),
    cmocka_unit_test(request_direct_skips_workers),
    cmocka_unit_test(held_callbacks_are_routed_around),
    cmocka_unit_test(shared_delivery_callbacks_never_hold_the_pool),
};
const size_t bus_timeout_ntests = sizeof bus_timeout_tests / sizeof bus_timeout_tests[0];
