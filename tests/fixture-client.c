/* fixture-client.c - sandbox helpers for the tests that drive dsec through libdsec. */
#include "tests/fixture-client.h"

#include "dsec/alloc.h"

#include <setjmp.h>
#include <stdarg.h>
#include <string.h>

#include <cmocka.h>

void dsec_test_create(dsec_client *cl, const dsec_create_spec *cs, const char *what,
                      dsec_sandbox_info *info)
{
    dsec_err err;
    if (dsec_create(cl, cs, info, &err) < 0)
        fail_msg("create %s: %s", what != NULL ? what : "(no env)", err.msg);
}

int dsec_test_exec_sh(dsec_client *cl, const char *id, const char *line, uint64_t timeout_ms,
                      bool with_err, char *out, size_t n)
{
    const char *argv[] = {"/bin/sh", "-c", line, NULL};
    dsec_exec_opts eo = {.argv = line != NULL ? argv : NULL, .timeout_ms = timeout_ms};
    dsec_exec_reply r;
    dsec_err err;
    if (dsec_exec(cl, id, &eo, &r, &err) < 0)
        fail_msg("exec in %s: %s", id, err.msg);
    if (out != NULL && n > 0) {
        size_t k = r.out_len < n - 1 ? r.out_len : n - 1;
        memcpy(out, r.out != NULL ? (const char *)r.out : "", k);
        if (with_err) {
            size_t e = r.err_len < n - 1 - k ? r.err_len : n - 1 - k;
            memcpy(out + k, r.err_out != NULL ? (const char *)r.err_out : "", e);
            k += e;
        }
        while (k > 0 && out[k - 1] == '\n')
            k--;
        out[k] = '\0';
    }
    int code = r.exit_code;
    dsec_exec_reply_release(&r);
    return code;
}

void dsec_test_destroy(dsec_client *cl, const char *id)
{
    dsec_err err;
    if (dsec_destroy(cl, id, &err) < 0)
        fail_msg("destroy %s: %s", id, err.msg);
}

void *dsec_test_sess_bg(void *p)
{
    dsec_test_bg_sess *b = p;
    const char *argv[] = {b->line, NULL};
    dsec_exec_opts eo = {.argv = argv, .session = b->h, .timeout_ms = b->timeout_ms};
    b->rc = dsec_exec(b->cl, b->id, &eo, &b->r, &b->err);
    atomic_store(&b->done, true);
    return NULL;
}

void *dsec_test_write_big(void *p)
{
    dsec_test_stdin_writer *w = p;
    size_t len = 1u << 20;
    char *big = dsec_malloc(len);
    if (big == NULL) {
        w->rc = dsec_err_set(&w->err, DSEC_E_NOMEM, 0, "1 MiB to write");
        return NULL;
    }
    memset(big, 'x', len);
    w->rc = dsec_proc_write(w->cl, w->id, w->handle, big, len, false, &w->err);
    dsec_free(big);
    return NULL;
}
