/* test_bus_actor.c - bus integration tests: per-actor and per-key order, parallelism, headers,
 * stats, shedding by wait. */
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

/* ---- group order: per-actor and per-key order ---------------------------- */

typedef struct order_state {
    counter done;
    uint32_t next;         /* serial actor: the sequence expected next */
    uint32_t next_key[16]; /* keyed actor: per key */
    atomic_int running_key[16];
    atomic_int running;
    atomic_int max_running;
    atomic_int violations;
    atomic_int overlaps; /* two handlers of one key at once */
    uint32_t last_key;
    atomic_int switches; /* consecutive messages of different keys */
} order_state;

static void serial_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    order_state *st = ud;
    int r = atomic_fetch_add(&st->running, 1) + 1;
    if (r > 1)
        atomic_fetch_add(&st->overlaps, 1);
    uint32_t seq = get_u32(dsec_msg_data(m));
    if (dsec_msg_len(m) != 4 || seq != st->next)
        atomic_fetch_add(&st->violations, 1);
    st->next = seq + 1;
    atomic_fetch_sub(&st->running, 1);
    counter_add(&st->done, 1);
}

static void order_serial_10k(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "order", 2, 0, NULL);
    order_state *st = dsec_calloc(1, sizeof *st);
    counter_init(&st->done);
    dsec_actor *a = actor_on(bus, "serial", "test.order.serial", serial_handler, st);
    flush(bus);

    const uint32_t n = 10000;
    for (uint32_t i = 0; i < n; i++)
        publish_u32(bus, "test.order.serial", i);
    flush(bus);
    assert_true(counter_wait(&st->done, n, WAIT_MS));
    assert_int_equal(atomic_load(&st->violations), 0);
    assert_int_equal(atomic_load(&st->overlaps), 0);
    assert_int_equal(st->next, n);

    dsec_actor_stats as;
    stats_wait_handled(a, n, &as);
    assert_int_equal(as.msgs_in, n);
    assert_int_equal(as.dropped, 0);
    assert_true(as.mailbox_peak >= 1);
    assert_true(as.handler_ns > 0);

    dsec_bus_free(bus);
    server_stop(&s);
    counter_destroy(&st->done);
    dsec_free(st);
}

/* Key: the first 8 bytes of the payload. */
static uint64_t key_from_payload(const dsec_msg *m, void *ud)
{
    return dsec_msg_len(m) >= 12 ? get_u64(dsec_msg_data(m)) : 0;
}

static void keyed_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    order_state *st = ud;
    uint64_t key = get_u64(dsec_msg_data(m));
    uint32_t seq = get_u32((const char *)dsec_msg_data(m) + 8);
    if (key >= 16) {
        atomic_fetch_add(&st->violations, 1);
        return;
    }
    if (atomic_fetch_add(&st->running_key[key], 1) != 0)
        atomic_fetch_add(&st->overlaps, 1);
    if (seq != st->next_key[key])
        atomic_fetch_add(&st->violations, 1);
    st->next_key[key] = seq + 1;
    atomic_fetch_sub(&st->running_key[key], 1);
    counter_add(&st->done, 1);
}

static void order_per_key(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "order-key", 2, 0, NULL);
    order_state *st = dsec_calloc(1, sizeof *st);
    counter_init(&st->done);
    dsec_actor *a = NULL;
    dsec_err err;
    assert_int_equal(dsec_actor_new(&a, bus, "keyed", &err), 0);
    dsec_actor_set_key(a, key_from_payload, NULL);
    assert_int_equal(dsec_actor_on(a, "test.order.keyed", NULL, keyed_handler, st, &err), 0);
    flush(bus);

    const uint32_t per_key = 1000, keys = 16;
    unsigned char b[12];
    for (uint32_t i = 0; i < per_key; i++) {
        for (uint64_t k = 0; k < keys; k++) {
            put_u64(b, k);
            put_u32(b + 8, i);
            assert_int_equal(
                dsec_bus_publish(bus, "test.order.keyed", NULL, NULL, b, sizeof b, &err), 0);
        }
    }
    flush(bus);
    assert_true(counter_wait(&st->done, (long)(per_key * keys), WAIT_MS));
    assert_int_equal(atomic_load(&st->violations), 0);
    assert_int_equal(atomic_load(&st->overlaps), 0);
    for (uint32_t k = 0; k < keys; k++)
        assert_int_equal(st->next_key[k], per_key);

    dsec_bus_free(bus);
    server_stop(&s);
    counter_destroy(&st->done);
    dsec_free(st);
}

/* Deferred messages: the handler keeps the message and returns, another thread finishes
 * it. Per-key order must hold across the wait, and the wait must hold no worker. */
typedef struct defer_state {
    order_state o;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    dsec_deferred *q[4096];
    size_t head, tail;
    bool stop;
    atomic_int started;                /* handlers entered */
    atomic_int inflight, max_inflight; /* deferred and not yet done */
    bool hold_first;                   /* the completer waits until every key has deferred */
    int keys;
} defer_state;

static void defer_finish(defer_state *st, dsec_deferred *d)
{
    dsec_msg *m = dsec_deferred_msg(d);
    uint64_t key = get_u64(dsec_msg_data(m));
    atomic_fetch_sub(&st->o.running_key[key], 1);
    atomic_fetch_sub(&st->inflight, 1);
    dsec_deferred_done(d);
    counter_add(&st->o.done, 1);
}

static void *defer_completer(void *p)
{
    defer_state *st = p;
    pthread_mutex_lock(&st->mu);
    for (;;) {
        while (st->head == st->tail && !st->stop)
            pthread_cond_wait(&st->cond, &st->mu);
        if (st->head == st->tail && st->stop)
            break;
        if (st->hold_first && atomic_load(&st->max_inflight) < st->keys) {
            /* every key's first message must be deferred at once, on a bus of 1 worker */
            struct timespec ts;
            deadline_ts(&ts, 20);
            pthread_cond_timedwait(&st->cond, &st->mu, &ts);
            continue;
        }
        dsec_deferred *d = st->q[st->head++ % 4096];
        pthread_mutex_unlock(&st->mu);
        defer_finish(st, d);
        pthread_mutex_lock(&st->mu);
    }
    pthread_mutex_unlock(&st->mu);
    return NULL;
}

static void defer_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    defer_state *st = ud;
    uint64_t key = get_u64(dsec_msg_data(m));
    uint32_t seq = get_u32((const char *)dsec_msg_data(m) + 8);
    atomic_fetch_add(&st->started, 1);
    if (atomic_fetch_add(&st->o.running_key[key], 1) != 0)
        atomic_fetch_add(&st->o.overlaps, 1);
    if (seq != st->o.next_key[key])
        atomic_fetch_add(&st->o.violations, 1);
    st->o.next_key[key] = seq + 1;
    if (seq % 3 == 2) { /* finished in the handler, as before */
        atomic_fetch_sub(&st->o.running_key[key], 1);
        counter_add(&st->o.done, 1);
        return;
    }
    dsec_deferred *d = dsec_actor_defer(a, m);
    assert_non_null(d);
    assert_null(dsec_actor_defer(a, m)); /* once per call */
    int now = atomic_fetch_add(&st->inflight, 1) + 1;
    for (int peak = atomic_load(&st->max_inflight);
         now > peak && !atomic_compare_exchange_weak(&st->max_inflight, &peak, now);)
        ;
    if (seq % 3 == 1) { /* done before the handler returns: the lane must go on */
        defer_finish(st, d);
        return;
    }
    pthread_mutex_lock(&st->mu);
    st->q[st->tail++ % 4096] = d;
    pthread_cond_signal(&st->cond);
    pthread_mutex_unlock(&st->mu);
}

static void deferred_keep_order_and_free_workers(void **state)
{
    server s;
    server_start(&s);
    /* one worker: with a deferred message holding it, nothing else would run */
    dsec_bus *bus = bus_open(&s, "order-defer", 1, 0, NULL);
    defer_state *st = dsec_calloc(1, sizeof *st);
    counter_init(&st->o.done);
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cond, NULL);
    st->keys = 16;
    st->hold_first = true;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, defer_completer, st), 0);
    dsec_actor *a = NULL;
    dsec_err err;
    assert_int_equal(dsec_actor_new(&a, bus, "deferring", &err), 0);
    dsec_actor_set_key(a, key_from_payload, NULL);
    assert_int_equal(dsec_actor_on(a, "test.order.defer", NULL, defer_handler, st, &err), 0);
    flush(bus);
    assert_null(dsec_actor_defer(a, NULL)); /* outside a handler */

    const uint32_t per_key = 300, keys = 16;
    unsigned char b[12];
    for (uint32_t i = 0; i < per_key; i++) {
        for (uint64_t k = 0; k < keys; k++) {
            put_u64(b, k);
            put_u32(b + 8, i);
            assert_int_equal(
                dsec_bus_publish(bus, "test.order.defer", NULL, NULL, b, sizeof b, &err), 0);
        }
        if (i == 0) { /* the first of each key is deferred and held: all 16 at once */
            flush(bus);
            for (int w = 0; w < WAIT_MS && atomic_load(&st->max_inflight) < (int)keys; w += 5)
                usleep(5000);
            assert_int_equal(atomic_load(&st->max_inflight), keys);
            pthread_mutex_lock(&st->mu);
            st->hold_first = false;
            pthread_cond_signal(&st->cond);
            pthread_mutex_unlock(&st->mu);
        }
    }
    flush(bus);
    assert_true(counter_wait(&st->o.done, (long)(per_key * keys), WAIT_MS));
    assert_int_equal(atomic_load(&st->o.violations), 0);
    assert_int_equal(atomic_load(&st->o.overlaps), 0);
    for (uint32_t k = 0; k < keys; k++)
        assert_int_equal(st->o.next_key[k], per_key);
    assert_int_equal(atomic_load(&st->inflight), 0);

    dsec_bus_free(bus);
    pthread_mutex_lock(&st->mu);
    st->stop = true;
    pthread_cond_signal(&st->cond);
    pthread_mutex_unlock(&st->mu);
    pthread_join(th, NULL);
    server_stop(&s);
    counter_destroy(&st->o.done);
    pthread_cond_destroy(&st->cond);
    pthread_mutex_destroy(&st->mu);
    dsec_free(st);
}
/* ---- group actor: parallelism, headers, stats ---------------------------- */

/* par_state and blocking_handler are in bus_kit.c: the request group's direct-request test
 * blocks a worker with them too. */

static void counting_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    par_state *st = ud;
    counter_add(&st->b_done, 1);
}

static void parallel_actors(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "par", 2, 0, NULL);
    par_state st;
    gate_init(&st.g);
    counter_init(&st.a_done);
    counter_init(&st.b_done);
    actor_on(bus, "A", "test.par.a", blocking_handler, &st);
    actor_on(bus, "B", "test.par.b", counting_handler, &st);
    flush(bus);

    publish_u32(bus, "test.par.a", 1);
    publish_u32(bus, "test.par.a", 2); /* queued behind the blocked one */
    flush(bus);
    assert_true(gate_wait_entered(&st.g, 1, WAIT_MS));
    for (uint32_t i = 0; i < 100; i++)
        publish_u32(bus, "test.par.b", i);
    flush(bus);
    /* B finishes while A's handler is still stuck. */
    assert_true(counter_wait(&st.b_done, 100, WAIT_MS));
    assert_int_equal(counter_get(&st.a_done), 0);
    gate_open(&st.g);
    assert_true(counter_wait(&st.a_done, 2, WAIT_MS));
    assert_false(st.g.timed_out);

    dsec_bus_free(bus);
    server_stop(&s);
    gate_destroy(&st.g);
    counter_destroy(&st.a_done);
    counter_destroy(&st.b_done);
}

/* Two keys meet at a rendezvous: only possible if they run concurrently. */
typedef struct rendezvous {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int arrived;
    int met;
    counter done;
} rendezvous;

static void rendezvous_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    rendezvous *rv = ud;
    struct timespec ts;
    deadline_ts(&ts, 5000);
    pthread_mutex_lock(&rv->mu);
    rv->arrived++;
    pthread_cond_broadcast(&rv->cond);
    while (rv->arrived < 2)
        if (pthread_cond_timedwait(&rv->cond, &rv->mu, &ts) == ETIMEDOUT)
            break;
    if (rv->arrived >= 2)
        rv->met++;
    pthread_mutex_unlock(&rv->mu);
    counter_add(&rv->done, 1);
}

static void parallel_keys(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "par-keys", 2, 0, NULL);
    rendezvous rv = {.arrived = 0, .met = 0};
    pthread_mutex_init(&rv.mu, NULL);
    cond_init_mono(&rv.cond);
    counter_init(&rv.done);
    dsec_actor *a = NULL;
    dsec_err err;
    assert_int_equal(dsec_actor_new(&a, bus, "keyed", &err), 0);
    dsec_actor_set_key(a, key_from_payload, NULL);
    assert_int_equal(dsec_actor_on(a, "test.par.keyed", NULL, rendezvous_handler, &rv, &err), 0);
    flush(bus);
    unsigned char b[12] = {0};
    for (uint64_t k = 1; k <= 2; k++) {
        put_u64(b, k);
        assert_int_equal(dsec_bus_publish(bus, "test.par.keyed", NULL, NULL, b, sizeof b, &err), 0);
    }
    flush(bus);
    assert_true(counter_wait(&rv.done, 2, WAIT_MS));
    assert_int_equal(rv.met, 2);

    dsec_bus_free(bus);
    server_stop(&s);
    counter_destroy(&rv.done);
    pthread_cond_destroy(&rv.cond);
    pthread_mutex_destroy(&rv.mu);
}

typedef struct hdr_seen {
    counter done;
    char type[32], schema[16], ctype[64], req[64], trace[64];
    char trace2[64];
    int n;
} hdr_seen;

static void copy_hdr(char *dst, size_t n, dsec_msg *m, const char *key)
{
    const char *v = dsec_msg_header(m, key);
    snprintf(dst, n, "%s", v != NULL ? v : "(none)");
}

static void header_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    hdr_seen *h = ud;
    if (h->n == 0) {
        const char *t = dsec_msg_type(m);
        snprintf(h->type, sizeof h->type, "%s", t != NULL ? t : "(none)");
        copy_hdr(h->schema, sizeof h->schema, m, DSEC_HDR_SCHEMA);
        copy_hdr(h->ctype, sizeof h->ctype, m, DSEC_HDR_CONTENT_TYPE);
        copy_hdr(h->req, sizeof h->req, m, DSEC_HDR_REQ_ID);
        copy_hdr(h->trace, sizeof h->trace, m, DSEC_HDR_TRACE_ID);
    } else {
        copy_hdr(h->trace2, sizeof h->trace2, m, DSEC_HDR_TRACE_ID);
    }
    h->n++;
    counter_add(&h->done, 1);
}

static bool is_hex32(const char *s)
{
    if (strlen(s) != 32)
        return false;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return false;
    return true;
}

static void headers_present(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "hdr", 1, 0, NULL);
    hdr_seen h = {.n = 0};
    counter_init(&h.done);
    actor_on(bus, "hdr", "test.hdr", header_handler, &h);
    flush(bus);
    dsec_err err;
    dsec_hdr hd = {.type = "ping", .schema = 3, .req_id = "req-1"};
    assert_int_equal(dsec_bus_publish(bus, "test.hdr", NULL, &hd, "x", 1, &err), 0);
    dsec_hdr hd2 = {.type = "ping", .trace_id = "trace-given"};
    assert_int_equal(dsec_bus_publish(bus, "test.hdr", NULL, &hd2, "y", 1, &err), 0);
    flush(bus);
    assert_true(counter_wait(&h.done, 2, WAIT_MS));
    assert_string_equal(h.type, "ping");
    assert_string_equal(h.schema, "3");
    assert_string_equal(h.ctype, "application/msgpack");
    assert_string_equal(h.req, "req-1");
    assert_true(is_hex32(h.trace));
    assert_string_equal(h.trace2, "trace-given");
    dsec_bus_free(bus);
    server_stop(&s);
    counter_destroy(&h.done);
}

/* Headers read from the raw block must equal what nats.c's parser reads
 * from the same message, for every key, in every block shape. */
static const char *const hdr_keys[] = {
    DSEC_HDR_TYPE,
    DSEC_HDR_SCHEMA,
    DSEC_HDR_CONTENT_TYPE,
    DSEC_HDR_REQ_ID,
    DSEC_HDR_TRACE_ID,
    DSEC_HDR_ERROR_CODE,
    "dsec-type",
    "DSEC-TRACE-ID",
    "dsec-trace-id",
    "X-Dup",
    "X-Long",
    "Absent",
    "Status",
    "A",
};
#define NKEYS (sizeof hdr_keys / sizeof hdr_keys[0])
#define HMSGS 6

typedef struct hdr_cmp {
    counter done;
    pthread_mutex_t mu;
    int n;
    int raw_rc[HMSGS][NKEYS]; /* dsec__msg_header_raw before anything parsed */
    char ours[HMSGS][NKEYS][400];
    char theirs[HMSGS][NKEYS][400];
    bool same_ptr[HMSGS]; /* reading a key twice gives the same string */
} hdr_cmp;

static void hdr_cmp_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    hdr_cmp *c = ud;
    pthread_mutex_lock(&c->mu);
    int i = c->n++;
    pthread_mutex_unlock(&c->mu);
    if (i >= HMSGS) {
        counter_add(&c->done, 1);
        return;
    }
    for (size_t k = 0; k < NKEYS; k++) {
        const char *v;
        size_t vl;
        c->raw_rc[i][k] = dsec__msg_header_raw(m->nm, hdr_keys[k], &v, &vl);
    }
    for (size_t k = 0; k < NKEYS; k++) {
        const char *v = dsec_msg_header(m, hdr_keys[k]);
        snprintf(c->ours[i][k], sizeof c->ours[i][k], "%s", v != NULL ? v : "(null)");
    }
    c->same_ptr[i] = dsec_msg_header(m, DSEC_HDR_TYPE) == dsec_msg_header(m, DSEC_HDR_TYPE);
    /* Only now let nats.c parse the block (in place). */
    for (size_t k = 0; k < NKEYS; k++) {
        const char *v = NULL;
        if (natsMsgHeader_Get(m->nm, hdr_keys[k], &v) != NATS_OK)
            v = NULL;
        snprintf(c->theirs[i][k], sizeof c->theirs[i][k], "%s", v != NULL ? v : "(null)");
    }
    counter_add(&c->done, 1);
}

/* Send raw protocol to the server: the blocks nats.c would never build. */
static void raw_send(server *s, const char *proto, size_t len)
{
    const char *url = dsec_natsd_url(s->srv);
    const char *colon = strrchr(url, ':');
    assert_non_null(colon);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    static const char hello[] = "CONNECT {\"verbose\":false,\"pedantic\":false,\"headers\":true,"
                                "\"protocol\":1}\r\n";
    assert_int_equal(write(fd, hello, sizeof hello - 1), (ssize_t)(sizeof hello - 1));
    assert_int_equal(write(fd, proto, len), (ssize_t)len);
    assert_int_equal(write(fd, "PING\r\n", 6), 6);
    /* Wait for the PONG: the server has routed what came before it. */
    char buf[4096];
    size_t got = 0;
    int64_t end = now_ms() + WAIT_MS;
    while (now_ms() < end && got < sizeof buf - 1) {
        ssize_t r = read(fd, buf + got, sizeof buf - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
        buf[got] = '\0';
        if (strstr(buf, "PONG") != NULL || strstr(buf, "-ERR") != NULL)
            break;
    }
    close(fd);
    if (strstr(buf, "PONG") == NULL || strstr(buf, "-ERR") != NULL)
        fail_msg("raw protocol refused: %s", buf);
}

static void raw_hpub(server *s, const char *subject, const char *reply, const char *block)
{
    char proto[1024];
    size_t hl = strlen(block);
    int n = snprintf(proto, sizeof proto, "HPUB %s%s%s %zu %zu\r\n%sbody\r\n", subject,
                     reply != NULL ? " " : "", reply != NULL ? reply : "", hl, hl + 4, block);
    assert_true(n > 0 && (size_t)n < sizeof proto);
    raw_send(s, proto, (size_t)n);
}

static void headers_match_nats(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "hdrcmp", 1, 0, NULL);
    hdr_cmp *c = dsec_calloc(1, sizeof *c);
    counter_init(&c->done);
    pthread_mutex_init(&c->mu, NULL);
    actor_on(bus, "hdrcmp", "test.hdrcmp", hdr_cmp_handler, c);
    flush(bus);

    dsec_err err;
    /* 0: the bus's own block, with a reply subject */
    dsec_hdr h0 = {.type = "ping", .schema = 7, .req_id = "req-0"};
    assert_int_equal(dsec_bus_publish(bus, "test.hdrcmp", "test.hdrcmp.reply", &h0, "x", 1, &err),
                     0);
    flush(bus);
    assert_true(counter_wait(&c->done, 1, WAIT_MS));
    /* 1: an id too long for the message's cache, no reply subject */
    char longid[301];
    memset(longid, 'r', sizeof longid - 1);
    longid[sizeof longid - 1] = '\0';
    dsec_hdr h1 = {.type = "ping", .req_id = longid, .trace_id = "t-1"};
    assert_int_equal(dsec_bus_publish(bus, "test.hdrcmp", NULL, &h1, "x", 1, &err), 0);
    flush(bus);
    assert_true(counter_wait(&c->done, 2, WAIT_MS));
    /* 2: spacing, repeated keys, keys differing only in case */
    raw_hpub(&s, "test.hdrcmp", NULL,
             "NATS/1.0\r\nDsec-Type:   spaced out \t\r\nX-Dup: first\r\nX-Dup: second\r\n"
             "dsec-trace-id: lower\r\nDsec-Trace-Id: upper\r\nA:b\r\n\r\n");
    assert_true(counter_wait(&c->done, 3, WAIT_MS));
    /* 3: a folded continuation line: nats.c's own reading applies */
    raw_hpub(&s, "test.hdrcmp", "test.hdrcmp.reply",
             "NATS/1.0\r\nDsec-Type: fold\r\nA: one\r\n two\r\n\r\n");
    assert_true(counter_wait(&c->done, 4, WAIT_MS));
    /* 4: an empty header block; 5: no headers at all */
    raw_hpub(&s, "test.hdrcmp", NULL, "NATS/1.0\r\n\r\n");
    assert_true(counter_wait(&c->done, 5, WAIT_MS));
    static const char pub[] = "PUB test.hdrcmp 4\r\nbody\r\n";
    raw_send(&s, pub, sizeof pub - 1);
    assert_true(counter_wait(&c->done, 6, WAIT_MS));

    for (int i = 0; i < HMSGS; i++)
        for (size_t k = 0; k < NKEYS; k++)
            if (strcmp(c->ours[i][k], c->theirs[i][k]) != 0)
                fail_msg("message %d, header %s: bus read \"%s\", nats.c \"%s\"", i, hdr_keys[k],
                         c->ours[i][k], c->theirs[i][k]);
    /* The values themselves, so agreeing on nothing cannot pass. */
    assert_string_equal(c->ours[0][0], "ping");
    assert_string_equal(c->ours[0][1], "7");
    assert_string_equal(c->ours[0][2], DSEC_CONTENT_TYPE);
    assert_string_equal(c->ours[0][3], "req-0");
    assert_true(is_hex32(c->ours[0][4]));
    assert_string_equal(c->ours[0][5], "(null)"); /* no Dsec-Error-Code */
    assert_string_equal(c->ours[0][6], "(null)"); /* keys match exactly, as in nats.c */
    assert_string_equal(c->ours[1][3], longid);
    assert_string_equal(c->ours[1][4], "t-1");
    assert_string_equal(c->ours[2][0], "spaced out");
    assert_string_equal(c->ours[2][9], "first");
    assert_string_equal(c->ours[2][8], "lower");
    assert_string_equal(c->ours[2][4], "upper");
    assert_string_equal(c->ours[2][13], "b");
    assert_string_equal(c->ours[3][0], "fold");
    assert_string_equal(c->ours[3][13], "one two");
    for (size_t k = 0; k < NKEYS; k++) {
        assert_string_equal(c->ours[4][k], "(null)");
        assert_string_equal(c->ours[5][k], "(null)");
    }
    /* The fast path did the reading where it can: the bus's blocks and the
     * odd but plain one; the folded block and no block go to nats.c. */
    for (size_t k = 0; k < NKEYS; k++) {
        assert_int_not_equal(c->raw_rc[0][k], -1);
        assert_int_not_equal(c->raw_rc[1][k], -1);
        assert_int_not_equal(c->raw_rc[2][k], -1);
        assert_int_equal(c->raw_rc[3][k], -1);
        assert_int_not_equal(c->raw_rc[4][k], -1);
        assert_int_equal(c->raw_rc[5][k], -1);
    }
    assert_int_equal(c->raw_rc[0][0], 1);
    assert_int_equal(c->raw_rc[0][11], 0);
    for (int i = 0; i < HMSGS; i++)
        assert_true(c->same_ptr[i]);

    dsec_bus_free(bus);
    server_stop(&s);
    pthread_mutex_destroy(&c->mu);
    counter_destroy(&c->done);
    dsec_free(c);
}

/* A plain nats.c connection to s with a JetStream stream name on subject
 * (no allow_direct: as another tool would make it). */
static void raw_js_stream(server *s, const char *name, const char *subject, bool memory,
                          natsConnection **nc, jsCtx **js)
{
    assert_int_equal(natsConnection_ConnectTo(nc, dsec_natsd_url(s->srv)), NATS_OK);
    assert_int_equal(natsConnection_JetStream(js, *nc, NULL), NATS_OK);
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    const char *subjects[] = {subject};
    sc.Name = name;
    sc.Subjects = subjects;
    sc.SubjectsLen = 1;
    sc.Storage = memory ? js_MemoryStorage : js_FileStorage;
    jsErrCode jerr = 0;
    assert_int_equal(js_AddStream(NULL, *js, &sc, NULL, &jerr), NATS_OK);
}

/* dsec__msg_destroy frees a nats.c message itself only where natsMsg_Destroy
 * would free it. JetStream's auto-ack callback marks the message "no destroy"
 * and acks it after the user's callback returns, so the callback's destroy
 * must leave it alone. In the sanitizer build an early free is a
 * use-after-free; in both builds the acks must reach the server. */
#define JS_ACKED 200

typedef struct js_destroyed {
    counter done;
    atomic_int bad;
} js_destroyed;

static void js_destroy_cb(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    js_destroyed *d = closure;
    if (natsMsg_GetDataLength(msg) != 4 || memcmp(natsMsg_GetData(msg), "body", 4) != 0)
        atomic_fetch_add(&d->bad, 1);
    dsec__msg_destroy(&msg);
    if (msg != NULL)
        atomic_fetch_add(&d->bad, 1);
    counter_add(&d->done, 1);
}

static void msg_destroy_leaves_js_autoack_msgs(void **state)
{
    /* nats.c 3.x is the version the bus reads the layout of: the check passes */
    if (strncmp(nats_GetVersion(), "3.", 2) == 0)
        assert_true(dsec__msg_free_inline());
    server s;
    server_start_with(&s, true);
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    raw_js_stream(&s, "FREE", "free.>", true, &nc, &js);
    jsErrCode jerr = 0;
    for (int i = 0; i < JS_ACKED; i++)
        assert_int_equal(js_Publish(NULL, js, "free.x", "body", 4, NULL, &jerr), NATS_OK);

    js_destroyed d = {0};
    counter_init(&d.done);
    natsSubscription *sub = NULL;
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Config.AckPolicy = js_AckExplicit; /* the library acks after the callback */
    assert_int_equal(js_Subscribe(&sub, js, "free.x", js_destroy_cb, &d, NULL, &so, &jerr),
                     NATS_OK);
    assert_true(counter_wait(&d.done, JS_ACKED, WAIT_MS));
    assert_int_equal(atomic_load(&d.bad), 0);
    /* every ack reached the server: nothing pending, every message delivered once */
    bool acked = false;
    for (int i = 0; i < 200 && !acked; i++) {
        jsConsumerInfo *ci = NULL;
        assert_int_equal(natsSubscription_GetConsumerInfo(&ci, sub, NULL, &jerr), NATS_OK);
        acked = ci->NumAckPending == 0 && ci->Delivered.Consumer == JS_ACKED &&
                ci->AckFloor.Consumer == JS_ACKED;
        jsConsumerInfo_Destroy(ci);
        if (!acked)
            usleep(20 * 1000);
    }
    assert_true(acked);
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    server_stop(&s);
}

/* dsec_js_read: a stream dsec made is read with direct gets; one made
 * without allow_direct (by another tool) through an ordered consumer. Both
 * give every message on the subject, oldest first, and nothing else. */
typedef struct js_seen {
    int n;
    uint64_t last_seq;
    char data[8][8];
    bool bad;
} js_seen;

static int js_seen_each(const char *subject, const void *data, size_t len, uint64_t seq, void *ud)
{
    js_seen *s = ud;
    if (s->n >= 8 || len >= sizeof s->data[0] || seq <= s->last_seq ||
        strncmp(subject, "rd.a.", 5) != 0) {
        s->bad = true;
        return 1;
    }
    memcpy(s->data[s->n], data, len);
    s->data[s->n][len] = '\0';
    s->last_seq = seq;
    s->n++;
    return 0;
}

static void js_read_direct_and_consumer(void **state)
{
    server s;
    server_start_with(&s, true);
    dsec_bus *bus = bus_open(&s, "jsread", 1, 0, NULL);
    dsec_js *js = NULL;
    dsec_err err;
    assert_int_equal(dsec_js_new(&js, bus, 5000, &err), 0);
    /* a stream without allow_direct, as another tool would make it */
    natsConnection *nc = NULL;
    jsCtx *raw = NULL;
    raw_js_stream(&s, "RD", "rd.>", false, &nc, &raw);
    const char *subjects[] = {"rd.>"};
    jsErrCode jerr = 0;
    const char *const subj[] = {"rd.a.1", "rd.b.1", "rd.a.2", "rd.a.3", "rd.b.2"};
    const char *const body[] = {"one", "x", "two", "three", "y"};
    for (int i = 0; i < 5; i++)
        assert_int_equal(dsec_js_publish(js, subj[i], body[i], strlen(body[i]), NULL, &err), 0);
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) { /* dsec's own ensure turns direct gets on */
            dsec_stream_conf conf = {.name = "RD", .subjects = subjects, .nsubjects = 1};
            assert_int_equal(dsec_js_stream_ensure(js, &conf, &err), 0);
            jsStreamInfo *si = NULL;
            assert_int_equal(js_GetStreamInfo(&si, raw, "RD", NULL, &jerr), NATS_OK);
            assert_true(si->Config->AllowDirect);
            jsStreamInfo_Destroy(si);
        }
        js_seen seen = {0};
        size_t count = 0;
        int rrc = dsec_js_read(js, "RD", "rd.a.*", js_seen_each, &seen, &count, &err);
        if (rrc != 0)
            fail_msg("pass %d: %s", pass, err.msg);
        assert_false(seen.bad);
        assert_int_equal(seen.n, 3);
        assert_int_equal(count, 3);
        assert_string_equal(seen.data[0], "one");
        assert_string_equal(seen.data[1], "two");
        assert_string_equal(seen.data[2], "three");
        js_seen none = {0};
        assert_int_equal(dsec_js_read(js, "RD", "rd.c.*", js_seen_each, &none, &count, &err), 0);
        assert_int_equal(none.n, 0);
        assert_int_equal(count, 0);
    }
    jsCtx_Destroy(raw);
    natsConnection_Destroy(nc);
    dsec_js_free(js);
    dsec_bus_free(bus);
    server_stop(&s);
}

static void new_id_is_random_hex(void **state)
{
    char a[33], b[33];
    dsec_bus_new_id(a);
    dsec_bus_new_id(b);
    assert_true(is_hex32(a));
    assert_true(is_hex32(b));
    assert_string_not_equal(a, b);
}

typedef struct stats_state {
    counter done;
} stats_state;

static void stats_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    stats_state *st = ud;
    dsec_err err;
    if (get_u32(dsec_msg_data(m)) % 2 == 1)
        dsec_actor_count_error(a);
    dsec_actor_publish(a, "test.stats.out", NULL, NULL, "o", 1, &err);
    counter_add(&st->done, 1);
}

static void actor_stats_count(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "stats", 2, 0, NULL);
    stats_state st;
    counter_init(&st.done);
    dsec_actor *a = actor_on(bus, "stats", "test.stats.in", stats_handler, &st);
    assert_string_equal(dsec_actor_name(a), "stats");
    assert_ptr_equal(dsec_actor_bus(a), bus);
    flush(bus);
    for (uint32_t i = 0; i < 10; i++)
        publish_u32(bus, "test.stats.in", i);
    flush(bus);
    assert_true(counter_wait(&st.done, 10, WAIT_MS));
    dsec_actor_stats as;
    dsec_actor_stats_get(a, &as);
    assert_int_equal(as.msgs_in, 10);
    assert_int_equal(as.msgs_out, 10);
    assert_int_equal(as.errors, 5);
    assert_int_equal(as.dropped, 0);
    assert_int_equal(as.mailbox_depth, 0);
    dsec_bus_free(bus);
    server_stop(&s);
    counter_destroy(&st.done);
}

/* ---- shedding by wait ------------------------------------------------------ */

typedef struct shed_state {
    counter done;
    _Atomic uint32_t handled_mask, shed_mask; /* bit v: message v went there */
    _Atomic uint64_t shed_waited_ms;
} shed_state;

static void shed_slow_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    shed_state *st = ud;
    uint32_t v = get_u32(dsec_msg_data(m));
    if (v == 0) /* holds the only worker: what queues behind it waits */
        usleep(200 * 1000);
    atomic_fetch_or(&st->handled_mask, 1u << v);
    counter_add(&st->done, 1);
    (void)a;
}

static void shed_handler(dsec_actor *a, dsec_msg *m, uint64_t waited_ns, void *ud)
{
    shed_state *st = ud;
    uint32_t v = get_u32(dsec_msg_data(m));
    atomic_fetch_or(&st->shed_mask, 1u << v);
    atomic_store(&st->shed_waited_ms, waited_ns / 1000000u);
    counter_add(&st->done, 1);
    (void)a;
}

/* A message that waited past the bound in a standing queue (the mailbox not
 * empty for the interval, 100 ms here) goes to the shed handler, counted;
 * one on a plain subscription goes to its handler however long it waited,
 * and so do all of them with the bound off. */
static void shed_by_wait(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "shed", 1, 0, NULL);
    shed_state st = {0};
    counter_init(&st.done);
    dsec_actor *a = NULL;
    dsec_err err;
    assert_int_equal(dsec_actor_new(&a, bus, "shedder", &err), 0);
    dsec_actor_set_shed(a, 20);
    assert_int_equal(
        dsec_actor_on_shed(a, "test.shed.in", NULL, shed_slow_handler, shed_handler, &st, &err), 0);
    assert_int_equal(dsec_actor_on(a, "test.shed.plain", NULL, shed_slow_handler, &st, &err), 0);
    flush(bus);
    usleep(150 * 1000); /* the mailbox's last empty moment is past the interval */
    /* 0 holds the only worker 200 ms; 1 (sheddable) and 2 (plain) wait behind it */
    publish_u32(bus, "test.shed.in", 0);
    publish_u32(bus, "test.shed.in", 1);
    publish_u32(bus, "test.shed.plain", 2);
    flush(bus);
    assert_true(counter_wait(&st.done, 3, WAIT_MS));
    assert_int_equal(atomic_load(&st.shed_mask), 1u << 1);
    assert_int_equal(atomic_load(&st.handled_mask), (1u << 0) | (1u << 2));
    assert_true(atomic_load(&st.shed_waited_ms) >= 150); /* it waited behind 0 */
    dsec_actor_stats as;
    dsec_actor_stats_get(a, &as);
    assert_int_equal(as.shed, 1);
    assert_int_equal(as.msgs_in, 3);
    /* the bound off: the same wait is handled */
    dsec_actor_set_shed(a, 0);
    usleep(150 * 1000);
    publish_u32(bus, "test.shed.in", 0);
    publish_u32(bus, "test.shed.in", 3);
    flush(bus);
    assert_true(counter_wait(&st.done, 5, WAIT_MS));
    assert_true(atomic_load(&st.handled_mask) & (1u << 3));
    dsec_actor_stats_get(a, &as);
    assert_int_equal(as.shed, 1);
    dsec_bus_free(bus);
    server_stop(&s);
    counter_destroy(&st.done);
}

const struct CMUnitTest bus_order_tests[] = {
    cmocka_unit_test(order_serial_10k),
    cmocka_unit_test(order_per_key),
    cmocka_unit_test(deferred_keep_order_and_free_workers),
};
const size_t bus_order_ntests = sizeof bus_order_tests / sizeof bus_order_tests[0];

const struct CMUnitTest bus_actor_tests[] = {
    cmocka_unit_test(parallel_actors),
    cmocka_unit_test(parallel_keys),
    cmocka_unit_test(headers_present),
    cmocka_unit_test(headers_match_nats),
    cmocka_unit_test(msg_destroy_leaves_js_autoack_msgs),
    cmocka_unit_test(js_read_direct_and_consumer),
    cmocka_unit_test(new_id_is_random_hex),
    cmocka_unit_test(actor_stats_count),
    cmocka_unit_test(shed_by_wait),
};
const size_t bus_actor_ntests = sizeof bus_actor_tests / sizeof bus_actor_tests[0];
