/* fixture.h - what integration tests share: a nats-server in a fresh temp dir. */
#ifndef DSEC_TESTS_FIXTURE_H
#define DSEC_TESTS_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>

#include "bus/bus.h"

/* Make a temp dir /tmp/<prefix>-XXXXXX (its path into root, n >= 64) and
 * start a nats-server with its state there. 0 on success; the failure is
 * printed. */
int dsec_test_server_start(const char *prefix, bool jetstream, dsec_natsd **out, char *root,
                           size_t n);
/* Stop the server and remove root. 0 on success. */
int dsec_test_server_stop(dsec_natsd *s, const char *root);

#endif
