/* test_bus.c - integration tests of the bus against real nats-servers
 * started by dsec_natsd in fresh temp dirs; argv[1] picks the test group. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/bus_kit.h"

/* The groups live in test_bus_natsd.c, test_bus_actor.c, test_bus_request.c and
 * test_bus_conn.c; argv[1] picks one (CTest runs one entry per group), "all" runs them all. */
int main(int argc, char **argv)
{
    const char *group = argc > 1 ? argv[1] : "all";
    atexit(live_cleanup);
    bool all = strcmp(group, "all") == 0;
    int failed = 0, ran = 0;
#define GROUP(g)                                                                                   \
    if (all || strcmp(group, #g) == 0) {                                                           \
        failed +=                                                                                  \
            _cmocka_run_group_tests("bus_" #g, bus_##g##_tests, bus_##g##_ntests, NULL, NULL);     \
        ran++;                                                                                     \
    }
    GROUP(natsd)
    GROUP(order)
    GROUP(actor)
    GROUP(request)
    GROUP(timeout)
    GROUP(restart)
    GROUP(drain)
    GROUP(schema)
    GROUP(overflow)
    GROUP(conn)
#undef GROUP
    if (ran == 0) {
        fprintf(stderr, "test_bus: unknown group %s\n", group);
        return 2;
    }
    return failed != 0;
}
