/* bus_kit.c - the bus tests' shared helpers: time, bounded waits, temp dirs and servers. */
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

/* ---- helpers: time, waiting, temp dirs --------------------------------- */

int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void deadline_ts(struct timespec *ts, int timeout_ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    int64_t ns = ts->tv_nsec + (int64_t)(timeout_ms % 1000) * 1000000;
    ts->tv_sec += timeout_ms / 1000 + ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
}

void cond_init_mono(pthread_cond_t *c)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

void counter_init(counter *c)
{
    pthread_mutex_init(&c->mu, NULL);
    cond_init_mono(&c->cond);
    c->n = 0;
}

void counter_destroy(counter *c)
{
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->mu);
}

void counter_add(counter *c, long d)
{
    pthread_mutex_lock(&c->mu);
    c->n += d;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
}

long counter_get(counter *c)
{
    pthread_mutex_lock(&c->mu);
    long n = c->n;
    pthread_mutex_unlock(&c->mu);
    return n;
}

/* Wait until the counter reaches target; false on timeout. */
bool counter_wait(counter *c, long target, int timeout_ms)
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

void gate_init(gate *g)
{
    pthread_mutex_init(&g->mu, NULL);
    cond_init_mono(&g->cond);
    g->open = false;
    g->entered = 0;
    g->timed_out = false;
}

void gate_destroy(gate *g)
{
    pthread_cond_destroy(&g->cond);
    pthread_mutex_destroy(&g->mu);
}

void gate_pass(gate *g)
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

void gate_open(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->mu);
}

bool gate_wait_entered(gate *g, int n, int timeout_ms)
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

void evrec_init(evrec *e)
{
    memset(e, 0, sizeof *e);
    pthread_mutex_init(&e->mu, NULL);
    cond_init_mono(&e->cond);
}

void evrec_destroy(evrec *e)
{
    pthread_cond_destroy(&e->cond);
    pthread_mutex_destroy(&e->mu);
}

void on_event(dsec_bus *bus, dsec_bus_event ev, const char *detail, void *ud)
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

int evrec_count(evrec *e, dsec_bus_event ev)
{
    pthread_mutex_lock(&e->mu);
    int n = e->count[ev];
    pthread_mutex_unlock(&e->mu);
    return n;
}

bool evrec_wait(evrec *e, dsec_bus_event ev, int n, int timeout_ms)
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

void rm_rf(const char *dir)
{
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* A failed assertion jumps out of the test past its cleanup: temp dirs and
 * servers still registered here are removed when the program exits. */
#define MAX_LIVE 16
static char *live_dirs[MAX_LIVE];
static dsec_natsd *live_servers[MAX_LIVE];

void live_add(void **slots, void *p)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (slots[i] == NULL) {
            slots[i] = p;
            return;
        }
}

void live_del(void **slots, void *p)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (slots[i] == p)
            slots[i] = NULL;
}

void live_del_dir(const char *dir)
{
    for (int i = 0; i < MAX_LIVE; i++)
        if (live_dirs[i] != NULL && strcmp(live_dirs[i], dir) == 0) {
            dsec_free(live_dirs[i]);
            live_dirs[i] = NULL;
        }
}

void live_cleanup(void)
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
void tmpdir_make(char *dir, size_t n)
{
    snprintf(dir, n, "/tmp/dsec-test-bus-XXXXXX");
    assert_non_null(mkdtemp(dir));
    live_add((void **)live_dirs, dsec_strdup(dir));
}

void tmpdir_done(const char *dir)
{
    rm_rf(dir);
    live_del_dir(dir);
}

void server_start_with(server *s, bool jetstream)
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

void server_start(server *s)
{
    server_start_with(s, false);
}

void server_stop(server *s)
{
    live_del((void **)live_servers, s->srv);
    dsec_natsd_stop(s->srv);
    s->srv = NULL;
    tmpdir_done(s->dir);
}

dsec_bus *bus_open(server *s, const char *name, int threads, int mailbox_max, evrec *ev)
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

dsec_actor *actor_on(dsec_bus *bus, const char *name, const char *subject, dsec_handler h, void *ud)
{
    dsec_actor *a = NULL;
    dsec_err err;
    if (dsec_actor_new(&a, bus, name, &err) != 0)
        fail_msg("actor %s: %s", name, err.msg);
    if (dsec_actor_on(a, subject, NULL, h, ud, &err) != 0)
        fail_msg("actor %s on %s: %s", name, subject, err.msg);
    return a;
}

void flush(dsec_bus *bus)
{
    dsec_err err;
    if (dsec_bus_flush(bus, 5000, &err) != 0)
        fail_msg("flush: %s", err.msg);
}

/* handler_ns is added after a batch of handlers returns: wait for it. */
void stats_wait_handled(dsec_actor *a, uint64_t n, dsec_actor_stats *out)
{
    int64_t t0 = now_ms();
    do
        dsec_actor_stats_get(a, out);
    while ((out->msgs_in < n || out->handler_ns == 0) && now_ms() - t0 < WAIT_MS);
}

void put_u32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, sizeof v);
}

uint32_t get_u32(const void *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

void put_u64(unsigned char *p, uint64_t v)
{
    memcpy(p, &v, sizeof v);
}

uint64_t get_u64(const void *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

void publish_u32(dsec_bus *bus, const char *subject, uint32_t v)
{
    unsigned char b[4];
    put_u32(b, v);
    dsec_err err;
    if (dsec_bus_publish(bus, subject, NULL, NULL, b, sizeof b, &err) != 0)
        fail_msg("publish to %s: %s", subject, err.msg);
}

void blocking_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a;
    (void)m;
    par_state *st = ud;
    gate_pass(&st->g);
    counter_add(&st->a_done, 1);
}

void echo_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)ud;
    dsec_err err;
    dsec_hdr h = {.type = "echo"};
    if (dsec_msg_respond(a, m, &h, dsec_msg_data(m), dsec_msg_len(m), &err) != 0)
        dsec_actor_count_error(a);
}

void silent_handler(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a;
    (void)m;
    counter_add(ud, 1);
}
