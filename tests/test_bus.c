/* test_bus.c - integration tests of the bus against real nats-servers
 * started by dsec_natsd in fresh temp dirs; argv[1] picks the test group. */
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

/* Every bounded wait in these tests gives up after this long: a hang turns
 * into a failure instead of a stuck CTest run. */
#define WAIT_MS 10000

/* ---- helpers: time, waiting, temp dirs --------------------------------- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void deadline_ts(struct timespec *ts, int timeout_ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    int64_t ns = ts->tv_nsec + (int64_t)(timeout_ms % 1000) * 1000000;
    ts->tv_sec += timeout_ms / 1000 + ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
}

static void cond_init_mono(pthread_cond_t *c)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

/* A counter another thread can wait on. */
typedef struct counter {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    long n;
} counter;

static void counter_init(counter *c)
{
    pthread_mutex_init(&c->mu, NULL);
    cond_init_mono(&c->cond);
    c->n = 0;
}

static void counter_destroy(counter *c)
{
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->mu);
}

static void counter_add(counter *c, long d)
{
    pthread_mutex_lock(&c->mu);
    c->n += d;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
}

static long counter_get(counter *c)
{
    pthread_mutex_lock(&c->mu);
    long n = c->n;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Wait until the counter reaches target; false on timeout. */
static bool counter_wait(counter *c, long target, int timeout_ms)
{
    struct timespec ts;
    deadline_ts(&ts, timeout_ms);
    pthread_mutex_lock(&c->mu);
    while (c->n < target)
        if (pthread_cond_timedwait(&c->cond, &c->mu, &ts) == ETIMEDOUT)
            break;
    bool ok = c->n >= target;
    pthread_mutex_unlock(&c->mu);
    return ok;
}

/* A gate handlers block on until the test opens it. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool open;
    int entered;
    bool timed_out;
} gate;

static void gate_init(gate *g)
{
    pthread_mutex_init(&g->mu, NULL);
    cond_init_mono(&g->cond);
    g->open = false;
    g->entered = 0;
    g->timed_out = false;
}

static void gate_destroy(gate *g)
{
    pthread_cond_destroy(&g->cond);
    pthread_mutex_destroy(&g->mu);
}

static void gate_pass(gate *g)
{
    struct timespec ts;
    deadline_ts(&ts, WAIT_MS);
    pthread_mutex_lock(&g->mu);
    g->entered++;
    pthread_cond_broadcast(&g->cond);
    while (!g->open)
        if (pthread_cond_timedwait(&g->cond, &g->mu, &ts) == ETIMEDOUT) {
            g->timed_out = true;
            break;
        }
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->mu);
}

static bool gate_wait_entered(gate *g, int n, int timeout_ms)
{
    struct timespec ts;
    deadline_ts(&ts, timeout_ms);
    pthread_mutex_lock(&g->mu);
    while (g->entered < n)
        if (pthread_cond_timedwait(&g->cond, &g->mu, &ts) == ETIMEDOUT)
            break;
    bool ok = g->entered >= n;
    pthread_mutex_unlock(&g->mu);
    return ok;
}

/* Records connection events for assertions. */
typedef struct evrec {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int count[8];
    char last[8][DSEC_ERR_MSG_MAX];
} evrec;

static void evrec_init(evrec *e)
{
    memset(e, 0, sizeof *e);
    pthread_mutex_init(&e->mu, NULL);
    cond_init_mono(&e->cond);
}

static void evrec_destroy(evrec *e)
{
    pthread_cond_destroy(&e->cond);
    pthread_mutex_destroy(&e->mu);
}

static void on_event(dsec_bus *bus, dsec_bus_event ev, const char *detail, void *ud)
{
    evrec *e = ud;
    pthread_mutex_lock(&e->mu);
    if (ev > 0 && ev < 8) {
        e->count[ev]++;
        snprintf(e->last[ev], sizeof e->last[ev], "%s", detail);
    }
    pthread_cond_broadcast(&e->cond);
    pthread_mutex_unlock(&e->mu);
}

static int evrec_count(evrec *e, dsec_bus_event ev)
{
    pthread_mutex_lock(&e->mu);
    int n = e->count[ev];
    pthread_mutex_unlock(&e->mu);
    return n;
}

static bool evrec_wait(evrec *e, dsec_bus_event ev, int n, int timeout_ms)
{
    struct timespec ts;
    deadline_ts(&ts, timeout_ms);
    pthread_mutex_lock(&e->mu);
    while (e->count[ev] < n)
        if (pthread_cond_timedwait(&e->cond, &e->mu, &ts) == ETIMEDOUT)
            break;
    bool ok = e->count[ev] >= n;
    pthread_mutex_unlock(&e->mu);
    return ok;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void rm_rf(const char *dir)
{
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A failed assertion jumps out of the test past its cleanup: temp dirs and
 * servers still registered here are removed when the program exits. */
#define MAX_LIVE 16
static char *live_dirs[MAX_LIVE];
static dsec_natsd *live_servers[MAX_LIVE];

static void live_add(void **slots, void *p)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (slots[i] == NULL) {
            slots[i] = p;
            return;
        }
}

static void live_del(void **slots, void *p)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (slots[i] == p)
            slots[i] = NULL;
}

static void live_del_dir(const char *dir)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (live_dirs[i] != NULL && strcmp(live_dirs[i], dir) == 0) {
            dsec_free(live_dirs[i]);
            live_dirs[i] = NULL;
        }
}

static void live_cleanup(void)
{
    for (int i = 0; i < MAX_LIVE; i++) {
        dsec_natsd_stop(live_servers[i]);
        live_servers[i] = NULL;
        if (live_dirs[i] != NULL)
            rm_rf(live_dirs[i]);
        dsec_free(live_dirs[i]);
        live_dirs[i] = NULL;
    }
}

/* mkdtemp into dir; the registry keeps its own copy of the path, since a
 * failed test's stack is gone by the time the exit handler runs. */
static void tmpdir_make(char *dir, size_t n)
{
    snprintf(dir, n, "/tmp/dsec-test-bus-XXXXXX");
    assert_non_null(mkdtemp(dir));
    live_add((void **)live_dirs, dsec_strdup(dir));
}

static void tmpdir_done(const char *dir)
{
    rm_rf(dir);
    live_del_dir(dir);
}

/* A nats-server in its own temp dir. */
typedef struct server {
    char dir[64];
    dsec_natsd *srv;
} server;

static void server_start_with(server *s, bool jetstream)
{
    tmpdir_make(s->dir, sizeof s->dir);
    dsec_natsd_opts o = {.state_dir = s->dir, .jetstream = jetstream};
    dsec_err err;
    dsec_err_clear(&err);
    int rc = dsec_natsd_start(&s->srv, &o, &err);
    if (rc != 0)
        fail_msg("starting nats-server%s: %s", jetstream ? " with jetstream" : "", err.msg);
    live_add((void **)live_servers, s->srv);
}

static void server_start(server *s)
{
    server_start_with(s, false);
}

static void server_stop(server *s)
{
    live_del((void **)live_servers, s->srv);
    dsec_natsd_stop(s->srv);
    s->srv = NULL;
    tmpdir_done(s->dir);
}

static dsec_bus *bus_open(server *s, const char *name, int threads, int mailbox_max, evrec *ev)
{
    dsec_bus_opts o = {
        .url = dsec_natsd_url(s->srv),
        .name = name,
        .threads = threads,
        .mailbox_max = mailbox_max,
        .on_event = ev != NULL ? on_event : NULL,
        .event_ud = ev,
    };
    dsec_bus *bus = NULL;
    dsec_err err;
    if (dsec_bus_connect(&bus, &o, &err) != 0)
        fail_msg("connecting to %s: %s", o.url, err.msg);
    return bus;
}

static dsec_actor *actor_on(dsec_bus *bus, const char *name, const char *subject, dsec_handler h,
                            void *ud)
{
    dsec_actor *a = NULL;
    dsec_err err;
    if (dsec_actor_new(&a, bus, name, &err) != 0)
        fail_msg("actor %s: %s", name, err.msg);
    if (dsec_actor_on(a, subject, NULL, h, ud, &err) != 0)
        fail_msg("actor %s on %s: %s", name, subject, err.msg);
    return a;
}

static void flush(dsec_bus *bus)
{
    dsec_err err;
    if (dsec_bus_flush(bus, 5000, &err) != 0)
        fail_msg("flush: %s", err.msg);
}

/* handler_ns is added after a batch of handlers returns: wait for it. */
static void stats_wait_handled(dsec_actor *a, uint64_t n, dsec_actor_stats *out)
{
    int64_t t0 = now_ms();
    do
        dsec_actor_stats_get(a, out);
    while ((out->msgs_in < n || out->handler_ns == 0) && now_ms() - t0 < WAIT_MS);
}

static void put_u32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, sizeof v);
}

static uint32_t get_u32(const void *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void put_u64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, sizeof v);
}

static uint64_t get_u64(const void *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void publish_u32(dsec_bus *bus, const char *subject, uint32_t v)
{
    unsigned char b[4];
    put_u32(b, v);
    dsec_err err;
    if (dsec_bus_publish(bus, subject, NULL, NULL, b, sizeof b, &err) != 0)
        fail_msg("publish to %s: %s", subject, err.msg);
}

/* ---- group natsd: the launcher ------------------------------------------- */

static void natsd_start_stop(void **state)
{
    server s;
    server_start(&s);
    int port = dsec_natsd_port(s.srv);
    int pid = dsec_natsd_pid(s.srv);
    assert_true(port > 0 && port < 65536);
    assert_true(pid > 0);
    char want[64];
    snprintf(want, sizeof want, "nats://127.0.0.1:%d", port);
    assert_string_equal(dsec_natsd_url(s.srv), want);
    assert_int_equal(kill(pid, 0), 0);

    /* The config says what the brief asks for. */
    char path[128];
    snprintf(path, sizeof path, "%s/nats.conf", s.dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char conf[2048];
    size_t n = fread(conf, 1, sizeof conf - 1, f);
    conf[n] = '\0';
    fclose(f);
    char mp[64];
    snprintf(mp, sizeof mp, "max_payload: %u\n", DSEC_NATSD_MAX_PAYLOAD);
    assert_non_null(strstr(conf, mp));
    assert_non_null(strstr(conf, "127.0.0.1"));
    assert_null(strstr(conf, "jetstream"));

    /* It talks NATS: a bus connects and round-trips a flush. */
    dsec_bus *bus = bus_open(&s, "natsd-test", 1, 0, NULL);
    assert_true(dsec_bus_connected(bus));
    char url[128];
    assert_int_equal(dsec_bus_connected_url(bus, url, sizeof url), 0);
    assert_string_equal(url, want);
    flush(bus);
    dsec_bus_free(bus);

    server_stop(&s);
    /* Stopped means reaped: the pid is gone, not a zombie. */
    assert_int_equal(kill(pid, 0), -1);
    assert_int_equal(errno, ESRCH);
}

/* How many entries of pid's environment equal s, or with prefix, start with s. */
static int environ_count(int pid, const char *s, bool prefix)
{
    char path[64], buf[65536];
    snprintf(path, sizeof path, "/proc/%d/environ", pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    int count = 0;
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
        count += prefix ? strncmp(buf + i, s, strlen(s)) == 0 : strcmp(buf + i, s) == 0;
    return count;
}

/* The server runs with dsec's Go runtime settings (GOGC, GODEBUG,
 * GOMEMLIMIT), also after a restart, unless the environment sets its own. */
static void natsd_go_runtime_settings(void **state)
{
    const char *names[] = {"GOGC", "GODEBUG", "GOMEMLIMIT"};
    char *saved[3];
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(names[i]);
        saved[i] = v != NULL ? strdup(v) : NULL;
        unsetenv(names[i]);
    }
    server s;
    server_start(&s);
    int pid = dsec_natsd_pid(s.srv);
    assert_int_equal(environ_count(pid, "GOGC=400", false), 1);
    assert_int_equal(environ_count(pid, "GODEBUG=madvdontneed=0", false), 1);
    assert_int_equal(environ_count(pid, "GOMEMLIMIT=", true), 1);
    dsec_err err;
    assert_int_equal(dsec_natsd_kill(s.srv, &err), 0);
    if (dsec_natsd_restart(s.srv, &err) != 0)
        fail_msg("restart: %s", err.msg);
    assert_int_equal(environ_count(dsec_natsd_pid(s.srv), "GOGC=400", false), 1);
    server_stop(&s);

    /* An operator's own setting wins and is not doubled. */
    setenv("GOGC", "150", 1);
    server_start(&s);
    assert_int_equal(environ_count(dsec_natsd_pid(s.srv), "GOGC=150", false), 1);
    assert_int_equal(environ_count(dsec_natsd_pid(s.srv), "GOGC=", true), 1);
    server_stop(&s);

    for (int i = 0; i < 3; i++) {
        if (saved[i] != NULL)
            setenv(names[i], saved[i], 1);
        else
            unsetenv(names[i]);
        free(saved[i]);
    }
}

static void natsd_missing_binary(void **state)
{
    char dir[64];
    tmpdir_make(dir, sizeof dir);
    setenv("DSEC_NATS_SERVER", "/nonexistent", 1);
    dsec_natsd *srv = NULL;
    dsec_natsd_opts o = {.state_dir = dir};
    dsec_err err;
    dsec_err_clear(&err);
    int64_t t0 = now_ms();
    int rc = dsec_natsd_start(&srv, &o, &err);
    unsetenv("DSEC_NATS_SERVER");
    assert_int_equal(rc, -1);
    assert_null(srv);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_non_null(strstr(err.msg, "/nonexistent"));
    assert_non_null(strstr(err.msg, "DSEC_NATS_SERVER"));
    assert_true(now_ms() - t0 < 1000);
    tmpdir_done(dir);
}

static void natsd_bad_config_quotes_log(void **state)
{
    char dir[64];
    tmpdir_make(dir, sizeof dir);
    dsec_natsd *srv = NULL;
    dsec_natsd_opts o = {.state_dir = dir, .extra_conf = "this_is { not valid"};
    dsec_err err;
    dsec_err_clear(&err);
    int64_t t0 = now_ms();
    assert_int_equal(dsec_natsd_start(&srv, &o, &err), -1);
    assert_null(srv);
    /* The server died at once: no waiting for the whole start timeout. */
    assert_true(now_ms() - t0 < 4000);
    assert_int_equal(err.code, DSEC_E_IO);
    assert_non_null(strstr(err.msg, "exited"));
    /* The tail of the log is quoted: it names the config problem. */
    assert_true(strstr(err.msg, "conf") != NULL || strstr(err.msg, "parse") != NULL ||
                strstr(err.msg, "error") != NULL);
    tmpdir_done(dir);
}

static void natsd_kill_restart_same_port(void **state)
{
    server s;
    server_start(&s);
    int port = dsec_natsd_port(s.srv);
    int pid = dsec_natsd_pid(s.srv);
    dsec_err err;
    assert_int_equal(dsec_natsd_kill(s.srv, &err), 0);
    assert_int_equal(dsec_natsd_pid(s.srv), 0);
    assert_int_equal(kill(pid, 0), -1);
    /* Killing twice is a state error, not a crash. */
    assert_int_equal(dsec_natsd_kill(s.srv, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);

    if (dsec_natsd_restart(s.srv, &err) != 0)
        fail_msg("restart: %s", err.msg);
    assert_int_equal(dsec_natsd_port(s.srv), port);
    assert_true(dsec_natsd_pid(s.srv) > 0);
    assert_int_not_equal(dsec_natsd_pid(s.srv), pid);
    /* Restarting a running server is refused. */
    assert_int_equal(dsec_natsd_restart(s.srv, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);

    dsec_bus *bus = bus_open(&s, "restart-test", 1, 0, NULL);
    flush(bus);
    dsec_bus_free(bus);
    server_stop(&s);
}

static void natsd_jetstream_store(void **state)
{
    server s;
    server_start_with(&s, true);
    char path[128];
    struct stat st;
    snprintf(path, sizeof path, "%s/js", s.dir);
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    server_stop(&s);
}

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
    atomic_int started; /* handlers entered */
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

typedef struct par_state {
    gate g;
    counter b_done;
    counter a_done;
} par_state;

static void blocking_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    par_state *st = ud;
    gate_pass(&st->g);
    counter_add(&st->a_done, 1);
}

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
    assert_int_equal(dsec_actor_on_shed(a, "test.shed.in", NULL, shed_slow_handler, shed_handler,
                                        &st, &err), 0);
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

/* ---- group request: request/reply ---------------------------------------- */

static void echo_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_err err;
    dsec_hdr h = {.type = "echo"};
    if (dsec_msg_respond(a, m, &h, dsec_msg_data(m), dsec_msg_len(m), &err) != 0)
        dsec_actor_count_error(a);
}

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

static void silent_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    counter_add(ud, 1);
}

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
        held[i] = (held_cb){.g = &g, .slot = {.st = &held_st, .index = (uint32_t)i}};
        unsigned char b[4];
        put_u32(b, (uint32_t)i);
        assert_int_equal(dsec_bus_request(cli_bus, "test.rr.echo", NULL, b, sizeof b, 20000,
                                          held_reply_cb, &held[i], &err),
                         0);
        assert_true(gate_wait_entered(&g, i + 1, WAIT_MS));
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

static void drain_handles_queued(void **state)
{
    server s;
    server_start(&s);
    dsec_bus *bus = bus_open(&s, "drain", 2, 0, NULL);
    drain_state st = {.bus = bus, .rc = 99};
    gate_init(&st.g);
    counter_init(&st.handled);
    counter_init(&st.cb_done);
    dsec_actor *a = actor_on(bus, "drainee", "test.drain", drain_handler, &st);
    counter silent;
    counter_init(&silent);
    actor_on(bus, "silent", "test.drain.silent", silent_handler, &silent);
    flush(bus);

    publish_u32(bus, "test.drain", 0);
    flush(bus);
    assert_true(gate_wait_entered(&st.g, 1, WAIT_MS));
    for (uint32_t i = 1; i < 50; i++)
        publish_u32(bus, "test.drain", i);
    flush(bus);
    /* 49 messages sit in the mailbox behind the blocked handler. */
    dsec_actor_stats as;
    int64_t t0 = now_ms();
    do
        dsec_actor_stats_get(a, &as);
    while (as.mailbox_depth < 49 && now_ms() - t0 < WAIT_MS);
    assert_int_equal(as.mailbox_depth, 49);

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

/* ---- main ---------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const char *group = argc > 1 ? argv[1] : "all";
    const struct CMUnitTest natsd[] = {
        cmocka_unit_test(natsd_start_stop),
        cmocka_unit_test(natsd_go_runtime_settings),
        cmocka_unit_test(natsd_missing_binary),
        cmocka_unit_test(natsd_bad_config_quotes_log),
        cmocka_unit_test(natsd_kill_restart_same_port),
        cmocka_unit_test(natsd_jetstream_store),
    };
    const struct CMUnitTest order[] = {
        cmocka_unit_test(order_serial_10k),
        cmocka_unit_test(order_per_key),
        cmocka_unit_test(deferred_keep_order_and_free_workers),
    };
    const struct CMUnitTest actor[] = {
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
    const struct CMUnitTest request[] = {
        cmocka_unit_test(request_many_in_flight),
        cmocka_unit_test(request_future_and_sync),
        cmocka_unit_test(request_error_reply_is_status_0),
        cmocka_unit_test(request_long_ids_answered),
    };
    const struct CMUnitTest timeout[] = {
        cmocka_unit_test(request_timeout),
        cmocka_unit_test(request_timeouts_in_order),
        cmocka_unit_test(request_no_responders),
        cmocka_unit_test(request_direct_skips_workers),
        cmocka_unit_test(held_callbacks_are_routed_around),
    };
    const struct CMUnitTest restart[] = {
        cmocka_unit_test(restart_mid_traffic),
    };
    const struct CMUnitTest drain[] = {
        cmocka_unit_test(drain_handles_queued),
        cmocka_unit_test(drain_timeout_is_bounded),
        cmocka_unit_test(actor_free_answers_queued),
    };
    const struct CMUnitTest overflow[] = {
        cmocka_unit_test(mailbox_overflow),
    };
    const struct CMUnitTest schema[] = {
        cmocka_unit_test(schema_newer_refused),
    };
    const struct CMUnitTest conn[] = {
        cmocka_unit_test(conn_events),
        cmocka_unit_test(conn_error_after_free_is_dropped),
        cmocka_unit_test(conn_publish_buffered_across_restart),
        cmocka_unit_test(conn_refused),
    };
    atexit(live_cleanup);
    bool all = strcmp(group, "all") == 0;
    int failed = 0, ran = 0;
#define GROUP(g)                                                                                   \
    if (all || strcmp(group, #g) == 0) {                                                           \
        failed += cmocka_run_group_tests_name("bus_" #g, g, NULL, NULL);                           \
        ran++;                                                                                     \
    }
    GROUP(natsd)
    GROUP(order)
    GROUP(actor)
    GROUP(request)
    GROUP(timeout)
    GROUP(restart)
    GROUP(drain)
    GROUP(overflow)
    GROUP(schema)
    GROUP(conn)
#undef GROUP
    if (ran == 0) {
        fprintf(stderr, "test_bus: unknown group %s\n", group);
        return 2;
    }
    return failed != 0;
}
