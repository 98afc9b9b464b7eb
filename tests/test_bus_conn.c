/* test_bus_conn.c - bus integration tests: a server killed mid-traffic, drains, schemas, full
 * mailboxes, connection events. */
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

/* ---- group restart: kill -9 the server mid-traffic ------------------------ */

typedef struct restart_state {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int inflight;
    int ok, conn, timeout, noresp, closed, other;
    atomic_int *calls;
} restart_state;

typedef struct restart_slot {
    restart_state *st;
    uint32_t index;
} restart_slot;

static void restart_cb(int status, dsec_msg *reply, const dsec_err *err, void *ud)
{
    restart_slot *slot = ud;
    restart_state *st = slot->st;
    atomic_fetch_add(&st->calls[slot->index], 1);
    pthread_mutex_lock(&st->mu);
    if (status == 0)
        st->ok++;
    else if (err->code == DSEC_E_CONN)
        st->conn++;
    else if (err->code == DSEC_E_TIMEOUT)
        st->timeout++;
    else if (err->code == DSEC_E_NO_RESPONDERS)
        st->noresp++;
    else if (err->code == DSEC_E_CLOSED)
        st->closed++;
    else
        st->other++;
    st->inflight--;
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->mu);
}

static void restart_mid_traffic(void **state)
{
    server s;
    server_start(&s);
    evrec ev_cli, ev_srv;
    evrec_init(&ev_cli);
    evrec_init(&ev_srv);
    dsec_bus *srv_bus = bus_open(&s, "responder", 2, 0, &ev_srv);
    dsec_bus *cli_bus = bus_open(&s, "requester", 2, 0, &ev_cli);
    actor_on(srv_bus, "echo", "test.restart.echo", echo_handler, NULL);
    flush(srv_bus);

    enum { N = 3000, WINDOW = 100, KILL_AT = 1000, RESTART_AT = 1100 };
    restart_state st = {.inflight = 0};
    pthread_mutex_init(&st.mu, NULL);
    cond_init_mono(&st.cond);
    st.calls = dsec_calloc(N, sizeof *st.calls);
    restart_slot *slots = dsec_calloc(N, sizeof *slots);
    dsec_err err;
    int refused = 0;
    for (uint32_t i = 0; i < N; i++) {
        if (i == KILL_AT) {
            assert_int_equal(dsec_natsd_kill(s.srv, &err), 0);
            assert_true(evrec_wait(&ev_cli, DSEC_BUS_DISCONNECTED, 1, WAIT_MS));
            assert_false(dsec_bus_connected(cli_bus));
        }
        if (i == RESTART_AT) {
            if (dsec_natsd_restart(s.srv, &err) != 0)
                fail_msg("restart: %s", err.msg);
        }
        struct timespec ts;
        deadline_ts(&ts, WAIT_MS);
        pthread_mutex_lock(&st.mu);
        while (st.inflight >= WINDOW)
            if (pthread_cond_timedwait(&st.cond, &st.mu, &ts) == ETIMEDOUT)
                break;
        bool stuck = st.inflight >= WINDOW;
        st.inflight++;
        pthread_mutex_unlock(&st.mu);
        if (stuck)
            fail_msg("requests stopped completing at %u (in flight %d)", i, st.inflight);
        slots[i] = (restart_slot){.st = &st, .index = i};
        unsigned char b[4];
        put_u32(b, i);
        if (dsec_bus_request(cli_bus, "test.restart.echo", NULL, b, sizeof b, 1000, restart_cb,
                             &slots[i], &err) != 0) {
            /* Refused at once (e.g. reconnect buffer full): no callback. */
            refused++;
            pthread_mutex_lock(&st.mu);
            st.inflight--;
            pthread_mutex_unlock(&st.mu);
            atomic_fetch_add(&st.calls[i], 1);
        }
    }
    /* Every request ends, one way or the other. */
    struct timespec ts;
    deadline_ts(&ts, WAIT_MS);
    pthread_mutex_lock(&st.mu);
    while (st.inflight > 0)
        if (pthread_cond_timedwait(&st.cond, &st.mu, &ts) == ETIMEDOUT)
            break;
    int inflight = st.inflight;
    pthread_mutex_unlock(&st.mu);
    assert_int_equal(inflight, 0);
    for (uint32_t i = 0; i < N; i++)
        if (atomic_load(&st.calls[i]) != 1)
            fail_msg("request %u answered %d times", i, atomic_load(&st.calls[i]));
    print_message("restart: ok %d conn %d timeout %d noresp %d closed %d other %d refused %d\n",
                  st.ok, st.conn, st.timeout, st.noresp, st.closed, st.other, refused);
    assert_true(st.ok >= KILL_AT - WINDOW);
    assert_int_equal(st.other + st.closed, 0);
    assert_true(st.conn + st.timeout + st.noresp > 0); /* the kill hurt someone */

    /* Both buses came back; new requests succeed (the responder's
     * subscription may need a moment to be re-sent). */
    assert_true(evrec_wait(&ev_cli, DSEC_BUS_RECONNECTED, 1, WAIT_MS));
    assert_true(evrec_wait(&ev_srv, DSEC_BUS_RECONNECTED, 1, WAIT_MS));
    int64_t t0 = now_ms();
    int rc;
    dsec_msg *reply = NULL;
    while ((rc = dsec_bus_request_sync(cli_bus, "test.restart.echo", NULL, "abcd", 4, 1000, &reply,
                                       &err)) != 0 &&
           now_ms() - t0 < WAIT_MS)
        ;
    if (rc != 0)
        fail_msg("no request succeeded after the restart: %s", err.msg);
    dsec_msg_free(reply);
    dsec_bus_stats bs;
    dsec_bus_stats_get(cli_bus, &bs);
    assert_true(bs.disconnects >= 1);
    assert_true(bs.reconnects >= 1);

    dsec_bus_free(cli_bus);
    dsec_bus_free(srv_bus);
    for (uint32_t i = 0; i < N; i++)
        assert_int_equal(atomic_load(&st.calls[i]), 1);
    server_stop(&s);
    dsec_free(slots);
    dsec_free(st.calls);
    pthread_cond_destroy(&st.cond);
    pthread_mutex_destroy(&st.mu);
    evrec_destroy(&ev_cli);
    evrec_destroy(&ev_srv);
}
/* ---- group drain ---------------------------------------------------------- */

typedef struct drain_state {
    gate g;
    counter handled;
    dsec_bus *bus;
    int rc;
    dsec_err err;
    long handled_at_return;
    long cb_at_return;
    counter cb_done;
    int cb_code;
} drain_state;

static void drain_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    drain_state *st = ud;
    if (get_u32(dsec_msg_data(m)) == 0)
        gate_pass(&st->g);
    counter_add(&st->handled, 1);
}

static void *drain_thread(void *arg)
{
    drain_state *st = arg;
    st->rc = dsec_bus_drain(st->bus, 10000, &st->err);
    st->handled_at_return = counter_get(&st->handled);
    st->cb_at_return = counter_get(&st->cb_done);
    return NULL;
}

static void drain_cb(int status, dsec_msg *reply, const dsec_err *err, void *ud)
{
    drain_state *st = ud;
    st->cb_code = status == 0 ? 0 : err->code;
    counter_add(&st->cb_done, 1);
}

/* A drainee on subj whose handler blocks on the first message, with 49 more
 * behind it in its mailbox, beside a second actor on side_subj counting into
 * side. */
static dsec_actor *queue_behind_blocked(dsec_bus *bus, const char *subj, const char *side_subj,
                                        drain_state *st, counter *side)
{
    gate_init(&st->g);
    counter_init(&st->handled);
    counter_init(&st->cb_done);
    dsec_actor *a = actor_on(bus, "drainee", subj, drain_handler, st);
    counter_init(side);
    actor_on(bus, "side", side_subj, silent_handler, side);
    flush(bus);
    publish_u32(bus, subj, 0);
    flush(bus);
    assert_true(gate_wait_entered(&st->g, 1, WAIT_MS));
    for (uint32_t i = 1; i < 50; i++)
        publish_u32(bus, subj, i);
    flush(bus);
    /* 49 messages sit in the mailbox behind the blocked handler. */
    dsec_actor_stats as;
    int64_t t0 = now_ms();
    do
        dsec_actor_stats_get(a, &as);
    while (as.mailbox_depth < 49 && now_ms() - t0 < WAIT_MS);
    assert_int_equal(as.mailbox_depth, 49);
    return a;
}

static void drain_handles_queued(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "drain", 2, 0, NULL);
    drain_state st = {.bus = bus, .rc = 99};
    counter silent;
    queue_behind_blocked(bus, "test.drain", "test.drain.silent", &st, &silent);

    dsec_err err;
    assert_int_equal(
        dsec_bus_request(bus, "test.drain.silent", NULL, "q", 1, 30000, drain_cb, &st, &err), 0);
    assert_true(counter_wait(&silent, 1, WAIT_MS)); /* it reached the silent actor */

    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, drain_thread, &st), 0);
    /* Release the handler only once the drain has begun: the bus refuses
     * new actors from its first step on. */
    int64_t t1 = now_ms();
    bool draining = false;
    while (!draining && now_ms() - t1 < WAIT_MS) {
        dsec_actor *probe = NULL;
        if (dsec_actor_new(&probe, bus, "probe", &err) == 0)
            dsec_actor_free(probe);
        else
            draining = err.code == DSEC_E_CLOSED;
    }
    assert_true(draining);
    assert_int_equal(counter_get(&st.handled), 0);
    gate_open(&st.g);
    pthread_join(th, NULL);
    if (st.rc != 0)
        fail_msg("drain: %s", st.err.msg);
    assert_int_equal(st.handled_at_return, 50);
    /* The pending request failed with CLOSED before drain returned. */
    assert_int_equal(st.cb_at_return, 1);
    assert_int_equal(st.cb_code, DSEC_E_CLOSED);

    /* Closed for business afterwards; a second drain is a no-op. */
    assert_int_equal(dsec_bus_publish(bus, "test.drain", NULL, NULL, "x", 1, &err), -1);
    assert_int_equal(err.code, DSEC_E_CLOSED);
    assert_int_equal(dsec_bus_request(bus, "test.drain", NULL, "x", 1, 100, drain_cb, &st, &err),
                     -1);
    assert_int_equal(err.code, DSEC_E_CLOSED);
    dsec_actor *late = NULL;
    assert_int_equal(dsec_actor_new(&late, bus, "late", &err), -1);
    assert_int_equal(err.code, DSEC_E_CLOSED);
    assert_int_equal(dsec_bus_drain(bus, 1000, &err), 0);

    dsec_bus_free(bus);
    server_stop(&s);
    assert_int_equal(counter_get(&st.cb_done), 1);
    gate_destroy(&st.g);
    counter_destroy(&st.handled);
    counter_destroy(&st.cb_done);
    counter_destroy(&silent);
}

static void drain_timeout_is_bounded(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "drain-timeout", 2, 0, NULL);
    drain_state st = {.bus = bus};
    gate_init(&st.g);
    counter_init(&st.handled);
    counter_init(&st.cb_done);
    actor_on(bus, "stuck", "test.drain.stuck", drain_handler, &st);
    flush(bus);
    publish_u32(bus, "test.drain.stuck", 0);
    flush(bus);
    assert_true(gate_wait_entered(&st.g, 1, WAIT_MS));
    for (uint32_t i = 1; i <= 5; i++)
        publish_u32(bus, "test.drain.stuck", i);
    flush(bus);

    dsec_err err;
    int64_t t0 = now_ms();
    assert_int_equal(dsec_bus_drain(bus, 300, &err), -1);
    int64_t took = now_ms() - t0;
    assert_int_equal(err.code, DSEC_E_TIMEOUT);
    assert_non_null(strstr(err.msg, "300 ms"));
    assert_true(took < 3000);
    /* The stuck handler is still running; free waits for it. */
    gate_open(&st.g);
    dsec_bus_free(bus);
    /* The queued ones were dropped, not handled. */
    assert_int_equal(counter_get(&st.handled), 1);
    server_stop(&s);
    gate_destroy(&st.g);
    counter_destroy(&st.handled);
    counter_destroy(&st.cb_done);
}

typedef struct free_args {
    dsec_actor *a;
} free_args;

static void *actor_free_thread(void *arg)
{
    free_args *fa = arg;
    dsec_actor_free(fa->a);
    return NULL;
}

typedef struct actor_drain_args {
    dsec_actor *a;
    drain_state *st;
} actor_drain_args;

static void *actor_drain_thread(void *arg)
{
    actor_drain_args *d = arg;
    d->st->rc = dsec_actor_drain(d->a, 10000, &d->st->err);
    d->st->handled_at_return = counter_get(&d->st->handled);
    return NULL;
}

/* dsec_actor_drain: what sits in the mailbox behind a busy handler is still
 * handled before it returns, and the bus stays open for the others. */
static void actor_drain_handles_queued(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "adrain", 2, 0, NULL);
    drain_state st = {.bus = bus, .rc = 99};
    counter other;
    dsec_actor *a = queue_behind_blocked(bus, "test.adrain", "test.adrain.other", &st, &other);

    actor_drain_args d = {.a = a, .st = &st};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, actor_drain_thread, &d), 0);
    usleep(100000); /* the drain is under way, waiting on the handler */
    assert_int_equal(st.rc, 99);
    gate_open(&st.g);
    pthread_join(th, NULL);
    if (st.rc != 0)
        fail_msg("actor drain: %s", st.err.msg);
    assert_int_equal(st.handled_at_return, 50);
    /* drained: it takes nothing more, while the bus and its other actor go on */
    publish_u32(bus, "test.adrain", 99);
    publish_u32(bus, "test.adrain.other", 1);
    flush(bus);
    assert_true(counter_wait(&other, 1, WAIT_MS));
    assert_int_equal(counter_get(&st.handled), 50);
    dsec_actor_free(a);
    dsec_bus_free(bus);
    server_stop(&s);
    gate_destroy(&st.g);
    counter_destroy(&st.handled);
    counter_destroy(&st.cb_done);
    counter_destroy(&other);
}

static void actor_free_answers_queued(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *srv_bus = bus_open(&s, "owner", 2, 0, NULL);
    dsec_bus *cli_bus = bus_open(&s, "asker", 2, 0, NULL);
    drain_state st = {.bus = srv_bus};
    gate_init(&st.g);
    counter_init(&st.handled);
    counter_init(&st.cb_done);
    dsec_actor *a = actor_on(srv_bus, "doomed", "test.free", drain_handler, &st);
    flush(srv_bus);
    publish_u32(cli_bus, "test.free", 0);
    flush(cli_bus);
    assert_true(gate_wait_entered(&st.g, 1, WAIT_MS));
    dsec_future *f[3];
    dsec_err err;
    unsigned char b[4];
    put_u32(b, 7);
    for (int i = 0; i < 3; i++)
        assert_int_equal(
            dsec_bus_request_future(cli_bus, "test.free", NULL, b, sizeof b, 10000, &f[i], &err),
            0);
    flush(cli_bus);
    dsec_actor_stats as;
    int64_t t0 = now_ms();
    do
        dsec_actor_stats_get(a, &as);
    while (as.mailbox_depth < 3 && now_ms() - t0 < WAIT_MS);
    assert_int_equal(as.mailbox_depth, 3);

    free_args fa = {.a = a};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, actor_free_thread, &fa), 0);
    /* Release the handler once dsec_actor_free has unsubscribed: then the
     * server answers requests to the subject with "no responders". (A probe
     * that still reached the mailbox times out here and gets its "closed"
     * reply after the probe has given up.) */
    bool gone = false;
    t0 = now_ms();
    while (!gone && now_ms() - t0 < WAIT_MS) {
        dsec_msg *probe = NULL;
        if (dsec_bus_request_sync(cli_bus, "test.free", NULL, b, sizeof b, 100, &probe, &err) == 0)
            dsec_msg_free(probe);
        else
            gone = err.code == DSEC_E_NO_RESPONDERS;
    }
    assert_true(gone);
    assert_int_equal(counter_get(&st.handled), 0);
    gate_open(&st.g);
    pthread_join(th, NULL);
    assert_int_equal(counter_get(&st.handled), 1);
    for (int i = 0; i < 3; i++) {
        dsec_msg *reply = NULL;
        t0 = now_ms();
        assert_int_equal(dsec_future_wait(f[i], &reply, &err), 0);
        assert_true(now_ms() - t0 < 5000);
        assert_string_equal(dsec_msg_type(reply), DSEC_TYPE_ERROR);
        assert_string_equal(dsec_msg_header(reply, DSEC_HDR_ERROR_CODE), "closed");
        assert_int_equal(dsec_msg_len(reply), 0);
        dsec_future_free(f[i]);
    }
    dsec_bus_free(cli_bus);
    dsec_bus_free(srv_bus);
    server_stop(&s);
    gate_destroy(&st.g);
    counter_destroy(&st.handled);
    counter_destroy(&st.cb_done);
}
/* ---- group schema: a newer Dsec-Schema is refused, not misread ----------- */

static void schema_count_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    counter_add(ud, 1);
    echo_handler(a, m, NULL);
}

/* A request carrying Dsec-Schema schema; the reply's Dsec-Error-Code, or ""
 * when the handler answered (it echoes the payload). */
static const char *schema_request(dsec_bus *bus, unsigned schema, char *code, size_t n)
{
    dsec_err err;
    dsec_msg *reply = NULL;
    dsec_hdr h = {.type = "ping", .schema = schema};
    if (dsec_bus_request_sync(bus, "test.schema", &h, "x", 1, 5000, &reply, &err) != 0)
        fail_msg("request with schema %u: %s", schema, err.msg);
    const char *c = dsec_msg_header(reply, DSEC_HDR_ERROR_CODE);
    snprintf(code, n, "%s", c != NULL ? c : "");
    if (c == NULL)
        assert_memory_equal(dsec_msg_data(reply), "x", 1);
    else
        assert_int_equal(dsec_msg_len(reply), 0);
    dsec_msg_free(reply);
    return code;
}

static void schema_newer_refused(void **state)
{
    server s;
    server_start(&s);
    evrec ev;
    evrec_init(&ev);
    dsec_bus_opts o = {.url = dsec_natsd_url(s.srv),
                       .name = "schema",
                       .threads = 2,
                       .on_event = on_event,
                       .event_ud = &ev,
                       .schema_max = 3};
    dsec_bus *bus = NULL;
    dsec_err err;
    if (dsec_bus_connect(&bus, &o, &err) != 0)
        fail_msg("connect: %s", err.msg);
    counter handled;
    counter_init(&handled);
    dsec_actor *a = actor_on(bus, "versioned", "test.schema", schema_count_handler, &handled);
    flush(bus);

    char code[32];
    /* versions up to schema_max are read; 0 is what a sender with none set puts */
    assert_string_equal(schema_request(bus, 3, code, sizeof code), "");
    assert_string_equal(schema_request(bus, 1, code, sizeof code), "");
    assert_string_equal(schema_request(bus, 0, code, sizeof code), "");
    /* newer ones get a fast unsupported answer and never reach the handler */
    assert_string_equal(schema_request(bus, 4, code, sizeof code), "unsupported");
    assert_string_equal(schema_request(bus, 4294967295u, code, sizeof code), "unsupported");
    /* an event (no reply subject) that is too new is dropped, one that is not is handled */
    dsec_hdr newer = {.type = "ping", .schema = 7}, cur = {.type = "ping", .schema = 3};
    assert_int_equal(dsec_bus_publish(bus, "test.schema", NULL, &newer, "e", 1, &err), 0);
    assert_int_equal(dsec_bus_publish(bus, "test.schema", NULL, &cur, "e", 1, &err), 0);
    flush(bus);
    assert_true(counter_wait(&handled, 4, WAIT_MS));
    assert_false(counter_wait(&handled, 5, 300));

    dsec_actor_stats as;
    dsec_actor_stats_get(a, &as);
    assert_int_equal(as.errors, 3);
    /* reported once, naming the actor, the subject and the version */
    assert_true(evrec_wait(&ev, DSEC_BUS_ERROR, 1, WAIT_MS));
    assert_int_equal(evrec_count(&ev, DSEC_BUS_ERROR), 1);
    pthread_mutex_lock(&ev.mu);
    assert_non_null(strstr(ev.last[DSEC_BUS_ERROR], "versioned"));
    assert_non_null(strstr(ev.last[DSEC_BUS_ERROR], "test.schema"));
    assert_non_null(strstr(ev.last[DSEC_BUS_ERROR], "\"4\""));
    pthread_mutex_unlock(&ev.mu);

    /* without schema_max nothing is checked */
    dsec_bus *plain = bus_open(&s, "plain", 1, 0, NULL);
    dsec_actor *b = actor_on(plain, "unversioned", "test.schema.plain", echo_handler, NULL);
    flush(plain);
    dsec_msg *reply = NULL;
    dsec_hdr h = {.type = "ping", .schema = 999999};
    assert_int_equal(
        dsec_bus_request_sync(bus, "test.schema.plain", &h, "y", 1, 5000, &reply, &err), 0);
    assert_null(dsec_msg_header(reply, DSEC_HDR_ERROR_CODE));
    dsec_msg_free(reply);
    (void)b;
    dsec_bus_free(plain);
    dsec_bus_free(bus);
    server_stop(&s);
    counter_destroy(&handled);
}
/* ---- group overflow: full mailboxes -------------------------------------- */

static void mailbox_overflow(void **state)
{
    server s;
    server_start(&s);
    evrec ev;
    evrec_init(&ev);
    dsec_bus *bus = bus_open(&s, "overflow", 1, 10, &ev);
    drain_state st = {.bus = bus};
    gate_init(&st.g);
    counter_init(&st.handled);
    counter_init(&st.cb_done);
    dsec_actor *a = actor_on(bus, "small", "test.overflow", drain_handler, &st);
    flush(bus);

    publish_u32(bus, "test.overflow", 0);
    flush(bus);
    assert_true(gate_wait_entered(&st.g, 1, WAIT_MS));
    for (uint32_t i = 1; i <= 10; i++) /* fills the mailbox exactly */
        publish_u32(bus, "test.overflow", i);
    for (uint32_t i = 11; i <= 15; i++) /* dropped */
        publish_u32(bus, "test.overflow", i);
    flush(bus);

    /* A request hitting the full mailbox fails fast with an overflow reply. */
    dsec_err err;
    dsec_msg *reply = NULL;
    unsigned char b[4];
    put_u32(b, 99);
    int64_t t0 = now_ms();
    assert_int_equal(
        dsec_bus_request_sync(bus, "test.overflow", NULL, b, sizeof b, 5000, &reply, &err), 0);
    assert_true(now_ms() - t0 < 2000);
    assert_string_equal(dsec_msg_type(reply), DSEC_TYPE_ERROR);
    assert_string_equal(dsec_msg_header(reply, DSEC_HDR_ERROR_CODE), "overflow");
    assert_int_equal(dsec_msg_len(reply), 0);
    dsec_msg_free(reply);

    dsec_actor_stats as;
    dsec_actor_stats_get(a, &as);
    assert_int_equal(as.dropped, 6);
    assert_int_equal(as.mailbox_depth, 10);
    assert_int_equal(as.mailbox_peak, 10);
    /* One overflow episode, one event, naming the actor. */
    assert_true(evrec_wait(&ev, DSEC_BUS_MAILBOX_FULL, 1, WAIT_MS));
    assert_int_equal(evrec_count(&ev, DSEC_BUS_MAILBOX_FULL), 1);
    pthread_mutex_lock(&ev.mu);
    assert_non_null(strstr(ev.last[DSEC_BUS_MAILBOX_FULL], "small"));
    pthread_mutex_unlock(&ev.mu);
    dsec_bus_stats bs;
    dsec_bus_stats_get(bus, &bs);
    assert_int_equal(bs.mailbox_drops, 6);

    gate_open(&st.g);
    assert_true(counter_wait(&st.handled, 11, WAIT_MS));
    /* The mailbox takes messages again: a new episode would be reported. */
    publish_u32(bus, "test.overflow", 100);
    flush(bus);
    assert_true(counter_wait(&st.handled, 12, WAIT_MS));
    dsec_actor_stats_get(a, &as);
    assert_int_equal(as.dropped, 6);

    dsec_bus_free(bus);
    server_stop(&s);
    gate_destroy(&st.g);
    counter_destroy(&st.handled);
    counter_destroy(&st.cb_done);
    evrec_destroy(&ev);
}
/* ---- group conn: connection events and reconnect buffering --------------- */

static void conn_events(void **state)
{
    server s;
    server_start(&s);
    evrec ev;
    evrec_init(&ev);
    dsec_bus *bus = bus_open(&s, "events", 1, 0, &ev);
    assert_true(dsec_bus_connected(bus));
    dsec_err err;
    assert_int_equal(dsec_natsd_kill(s.srv, &err), 0);
    assert_true(evrec_wait(&ev, DSEC_BUS_DISCONNECTED, 1, WAIT_MS));
    assert_false(dsec_bus_connected(bus));
    char url[128];
    assert_int_equal(dsec_bus_connected_url(bus, url, sizeof url), -1);
    if (dsec_natsd_restart(s.srv, &err) != 0)
        fail_msg("restart: %s", err.msg);
    assert_true(evrec_wait(&ev, DSEC_BUS_RECONNECTED, 1, WAIT_MS));
    assert_true(dsec_bus_connected(bus));
    assert_int_equal(dsec_bus_connected_url(bus, url, sizeof url), 0);
    assert_string_equal(url, dsec_natsd_url(s.srv));
    pthread_mutex_lock(&ev.mu);
    assert_non_null(strstr(ev.last[DSEC_BUS_RECONNECTED], "events"));
    pthread_mutex_unlock(&ev.mu);
    assert_int_equal(evrec_count(&ev, DSEC_BUS_CLOSED), 0);
    dsec_bus_free(bus);
    /* Closed is reported before free returns. */
    assert_int_equal(evrec_count(&ev, DSEC_BUS_CLOSED), 1);
    server_stop(&s);
    evrec_destroy(&ev);
}

/* A bus event handler that holds nats.c's callback thread at the gate on
 * each error event. */
static void gate_on_error(dsec_bus *bus, dsec_bus_event ev, const char *detail, void *ud)
{
    if (ev == DSEC_BUS_ERROR)
        gate_pass(ud);
}

/* nats.c's, exported by libnats but not declared in nats.h: it queues an
 * error for the connection's error handler, as its own paths do. */
void natsAsyncCb_PostErrHandler(natsConnection *nc, natsSubscription *sub, natsStatus err,
                                char *errTxt);

/* nats.c can queue an error after the closed callback (a drain's flush that
 * fails because the connection closed under it posts "Drain error" then).
 * Such a handler runs after dsec_bus_free has returned; it must find no bus
 * rather than run on freed memory. */
static void conn_error_after_free_is_dropped(void **state)
{
    server s;
    server_start(&s);
    gate g;
    gate_init(&g);
    dsec_bus_opts bo = {
        .url = dsec_natsd_url(s.srv), .name = "blocker", .on_event = gate_on_error, .event_ud = &g};
    dsec_bus *blocker = NULL;
    dsec_err err;
    if (dsec_bus_connect(&blocker, &bo, &err) != 0)
        fail_msg("connect: %s", err.msg);
    evrec ev;
    evrec_init(&ev);
    dsec_bus *late = bus_open(&s, "late", 1, 0, &ev);
    assert_int_equal(dsec_bus_drain(late, 2000, &err), 0);
    assert_int_equal(evrec_count(&ev, DSEC_BUS_CLOSED), 1);

    /* nats.c's one callback thread waits in the blocker's handler while an
     * error for "late" queues behind it and "late" is freed. */
    natsAsyncCb_PostErrHandler(blocker->nc, NULL, NATS_ERR, NULL);
    assert_true(gate_wait_entered(&g, 1, WAIT_MS));
    natsAsyncCb_PostErrHandler(late->nc, NULL, NATS_ERR, NULL);
    dsec_bus_free(late);
    gate_open(&g);
    /* Queued after late's error: once it has run, so has late's. */
    natsAsyncCb_PostErrHandler(blocker->nc, NULL, NATS_ERR, NULL);
    assert_true(gate_wait_entered(&g, 2, WAIT_MS));
    assert_int_equal(evrec_count(&ev, DSEC_BUS_ERROR), 0);

    dsec_bus_free(blocker);
    server_stop(&s);
    evrec_destroy(&ev);
    assert_false(g.timed_out);
    gate_destroy(&g);
}

static void conn_publish_buffered_across_restart(void **state)
{
    server s;
    server_start(&s);
    evrec ev;
    evrec_init(&ev);
    dsec_bus *bus = bus_open(&s, "buffered", 2, 0, &ev);
    counter got;
    counter_init(&got);
    actor_on(bus, "sink", "test.buffered", silent_handler, &got);
    flush(bus);
    dsec_err err;
    assert_int_equal(dsec_natsd_kill(s.srv, &err), 0);
    assert_true(evrec_wait(&ev, DSEC_BUS_DISCONNECTED, 1, WAIT_MS));
    /* The server is gone, yet publishing works: nats.c buffers it. */
    for (uint32_t i = 0; i < 100; i++)
        publish_u32(bus, "test.buffered", i);
    assert_int_equal(counter_get(&got), 0);
    if (dsec_natsd_restart(s.srv, &err) != 0)
        fail_msg("restart: %s", err.msg);
    /* On reconnect nats.c re-subscribes before flushing the buffer. */
    assert_true(counter_wait(&got, 100, WAIT_MS));
    dsec_bus_free(bus);
    server_stop(&s);
    counter_destroy(&got);
    evrec_destroy(&ev);
}

static void conn_refused(void **state)
{
    /* A port nobody listens on: start and stop a server to find one. */
    server s;
    server_start(&s);
    char url[64];
    snprintf(url, sizeof url, "%s", dsec_natsd_url(s.srv));
    server_stop(&s);
    dsec_bus_opts o = {.url = url, .connect_timeout_ms = 500};
    dsec_bus *bus = NULL;
    dsec_err err;
    int64_t t0 = now_ms();
    assert_int_equal(dsec_bus_connect(&bus, &o, &err), -1);
    assert_null(bus);
    assert_int_equal(err.code, DSEC_E_CONN);
    assert_non_null(strstr(err.msg, url));
    assert_true(now_ms() - t0 < 3000);
}

const struct CMUnitTest bus_restart_tests[] = {
    cmocka_unit_test(restart_mid_traffic),
};
const size_t bus_restart_ntests = sizeof bus_restart_tests / sizeof bus_restart_tests[0];

const struct CMUnitTest bus_drain_tests[] = {
    cmocka_unit_test(drain_handles_queued),
    cmocka_unit_test(drain_timeout_is_bounded),
    cmocka_unit_test(actor_drain_handles_queued),
    cmocka_unit_test(actor_free_answers_queued),
};
const size_t bus_drain_ntests = sizeof bus_drain_tests / sizeof bus_drain_tests[0];

const struct CMUnitTest bus_schema_tests[] = {
    cmocka_unit_test(schema_newer_refused),
};
const size_t bus_schema_ntests = sizeof bus_schema_tests / sizeof bus_schema_tests[0];

const struct CMUnitTest bus_overflow_tests[] = {
    cmocka_unit_test(mailbox_overflow),
};
const size_t bus_overflow_ntests = sizeof bus_overflow_tests / sizeof bus_overflow_tests[0];

const struct CMUnitTest bus_conn_tests[] = {
    cmocka_unit_test(conn_events),
    cmocka_unit_test(conn_error_after_free_is_dropped),
    cmocka_unit_test(conn_publish_buffered_across_restart),
    cmocka_unit_test(conn_refused),
};
const size_t bus_conn_ntests = sizeof bus_conn_tests / sizeof bus_conn_tests[0];
