/* fixture-client.h - what the tests that drive sandboxes through libdsec share: create, sh,
 * destroy. */
#ifndef DSEC_TESTS_FIXTURE_CLIENT_H
#define DSEC_TESTS_FIXTURE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsec/client.h"

/* Create a sandbox; a failure fails the test, naming what (may be NULL) and the error. */
void dsec_test_create(dsec_client *cl, const dsec_create_spec *cs, const char *what,
                      dsec_sandbox_info *info);
/* Run `/bin/sh -c line` in sandbox id (line NULL: the environment's default command) with
 * timeout_ms. Its stdout, followed by its stderr when with_err, goes into out (n bytes with the
 * NUL; out may be NULL) without trailing newlines. Returns the exit code; an exec that fails
 * fails the test. */
int dsec_test_exec_sh(dsec_client *cl, const char *id, const char *line, uint64_t timeout_ms,
                      bool with_err, char *out, size_t n);
/* Destroy a sandbox; a failure fails the test. */
void dsec_test_destroy(dsec_client *cl, const char *id);

#endif
