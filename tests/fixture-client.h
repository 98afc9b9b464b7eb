/* fixture-client.h - what the tests that drive sandboxes through libdsec share: create, sh,
 * destroy. */
#ifndef DSEC_TESTS_FIXTURE_CLIENT_H
#define DSEC_TESTS_FIXTURE_CLIENT_H

#include <stdatomic.h>
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

/* A shell session's command on a thread of its own (pthread_create with dsec_test_sess_bg):
 * line in session h of sandbox id with timeout_ms; its answer in rc, r and err, then done. */
typedef struct dsec_test_bg_sess {
    dsec_client *cl;
    const char *id;
    uint64_t h;
    const char *line;
    uint64_t timeout_ms;
    int rc;
    dsec_exec_reply r;
    dsec_err err;
    atomic_bool done;
} dsec_test_bg_sess;
void *dsec_test_sess_bg(void *b);

/* A write of 1 MiB (far more than a pipe holds) to process handle's stdin in sandbox id, on a
 * thread of its own (pthread_create with dsec_test_write_big); its answer in rc and err. */
typedef struct dsec_test_stdin_writer {
    dsec_client *cl;
    const char *id;
    uint64_t handle;
    int rc;
    dsec_err err;
} dsec_test_stdin_writer;
void *dsec_test_write_big(void *w);

#endif
