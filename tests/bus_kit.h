/* bus_kit.h - what the bus test groups share: time, bounded waits, temp dirs and servers. */
#ifndef DSEC_TESTS_BUS_KIT_H
#define DSEC_TESTS_BUS_KIT_H

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "bus/bus.h"
#include "dsec/err.h"

/* Every bounded wait in these tests gives up after this long: a hang turns
 * into a failure instead of a stuck CTest run. */
#define WAIT_MS 10000

/* A counter another thread can wait on. */
typedef struct counter {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    long n;
} counter;

/* A gate handlers block on until the test opens it. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool open;
    int entered;
    bool timed_out;
} gate;

/* Records connection events for assertions. */
typedef struct evrec {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int count[8];
    char last[8][DSEC_ERR_MSG_MAX];
} evrec;

/* A nats-server in its own temp dir. */
typedef struct server {
    char dir[64];
    dsec_natsd *srv;
} server;

int64_t now_ms(void);
void deadline_ts(struct timespec *ts, int timeout_ms);
void cond_init_mono(pthread_cond_t *c);
void counter_init(counter *c);
void counter_destroy(counter *c);
void counter_add(counter *c, long d);
long counter_get(counter *c);
bool counter_wait(counter *c, long target, int timeout_ms);
void gate_init(gate *g);
void gate_destroy(gate *g);
void gate_pass(gate *g);
void gate_open(gate *g);
bool gate_wait_entered(gate *g, int n, int timeout_ms);
void evrec_init(evrec *e);
void evrec_destroy(evrec *e);
void on_event(dsec_bus *bus, dsec_bus_event ev, const char *detail, void *ud);
int evrec_count(evrec *e, dsec_bus_event ev);
bool evrec_wait(evrec *e, dsec_bus_event ev, int n, int timeout_ms);
void rm_rf(const char *dir);
void live_add(void **slots, void *p);
void live_del(void **slots, void *p);
void live_del_dir(const char *dir);
void live_cleanup(void);
void tmpdir_make(char *dir, size_t n);
void tmpdir_done(const char *dir);
void server_start_with(server *s, bool jetstream);
void server_start(server *s);
void server_stop(server *s);
dsec_bus *bus_open(server *s, const char *name, int threads, int mailbox_max, evrec *ev);
dsec_actor *actor_on(dsec_bus *bus, const char *name, const char *subject, dsec_handler h,
                     void *ud);
void flush(dsec_bus *bus);
void stats_wait_handled(dsec_actor *a, uint64_t n, dsec_actor_stats *out);
void put_u32(unsigned char *p, uint32_t v);
uint32_t get_u32(const void *p);
void put_u64(unsigned char *p, uint64_t v);
uint64_t get_u64(const void *p);
void publish_u32(dsec_bus *bus, const char *subject, uint32_t v);

/* Handlers block on g until the test opens it; a_done counts the ones that went through. */
typedef struct par_state {
    gate g;
    counter b_done;
    counter a_done;
} par_state;
void blocking_handler(dsec_actor *a, dsec_msg *m, void *ud);
/* Answers every request with its own payload, type "echo". */
void echo_handler(dsec_actor *a, dsec_msg *m, void *ud);
/* Never answers; counts the requests in the counter ud. */
void silent_handler(dsec_actor *a, dsec_msg *m, void *ud);

/* Each group's tests (test_bus_<file>.c); test_bus.c runs them by name. */
#define BUS_GROUP_DECL(g)                                                                          \
    extern const struct CMUnitTest bus_##g##_tests[];                                              \
    extern const size_t bus_##g##_ntests;
BUS_GROUP_DECL(natsd)
BUS_GROUP_DECL(order)
BUS_GROUP_DECL(actor)
BUS_GROUP_DECL(request)
BUS_GROUP_DECL(timeout)
BUS_GROUP_DECL(restart)
BUS_GROUP_DECL(drain)
BUS_GROUP_DECL(schema)
BUS_GROUP_DECL(overflow)
BUS_GROUP_DECL(conn)

#endif
