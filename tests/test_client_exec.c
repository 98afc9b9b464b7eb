/* test_client_exec.c - dsec_exec_stream against a stand-in node on a real
 * nats-server: output chunks that never arrive (as across a NATS gateway
 * whose far side did not know the client's interest yet) are made up from
 * the result when it holds the whole output, exactly once and in order;
 * when it cannot (a chunk lost before one that came, truncated output) the
 * exec fails and says why. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/wire.h"
#include "bus/bus.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tests/fixture.h"

#define TENANT "t1"
#define SBX "fake-0123456789abcdef"

static dsec_natsd *natsd;
static char root[64];
static dsec_bus *node_bus;
static dsec_actor *node_actor;

/* The output the stand-in's command makes, as three chunks. */
static const char *const CHUNKS[3] = {"hello ", "world\n", "oops"};
static const int STREAMS[3] = {1, 1, 2};

static void send_chunk(const dsec_msg_exec *x, uint64_t seq)
{
    dsec_msg_exec_chunk c = {.id = SBX,
                             .seq = seq,
                             .stream = (uint64_t)STREAMS[seq],
                             .data = {(const uint8_t *)CHUNKS[seq], strlen(CHUNKS[seq])}};
    dsec_err err;
    if (dsec_wire_send(node_actor, node_bus, x->stream_to, NULL, DSEC_MSG_EXEC_CHUNK, &c, NULL,
                       &err) < 0)
        fprintf(stderr, "test_client_exec: chunk %llu: %s\n", (unsigned long long)seq, err.msg);
}

/* argv[0] names what the stand-in node does with the three chunks:
 * all | lose-last | lose-all | gap (loses the first) | late (result first,
 * then chunk 0 after 300 ms, the rest never) | truncated (loses the last,
 * output marked truncated). */
static void fake_exec(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_msg_exec x;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_EXEC, dsec_msg_data(m), dsec_msg_len(m), &x,
                    &err) < 0 ||
        x.stream_to == NULL) {
        dsec_wire_error(a, m, &err);
        return;
    }
    const char *how = x.argv.v[0];
    bool send[3] = {true, true, true};
    if (strcmp(how, "lose-last") == 0 || strcmp(how, "truncated") == 0)
        send[2] = false;
    else if (strcmp(how, "lose-all") == 0 || strcmp(how, "late") == 0)
        send[0] = send[1] = send[2] = false;
    else if (strcmp(how, "gap") == 0)
        send[0] = false;
    for (uint64_t i = 0; i < 3; i++)
        if (send[i])
            send_chunk(&x, i);
    dsec_msg_exec_result r = {.id = SBX,
                              .stdout_data = {(const uint8_t *)"hello world\n", 12},
                              .stderr_data = {(const uint8_t *)"oops", 4},
                              .stdout_truncated = strcmp(how, "truncated") == 0,
                              .chunks = 3};
    if (dsec_wire_reply(a, m, DSEC_MSG_EXEC_RESULT, &r, &err) < 0)
        dsec_wire_error(a, m, &err);
    if (strcmp(how, "late") == 0) {
        dsec_bus_flush(node_bus, 5000, &err);
        usleep(300 * 1000);
        send_chunk(&x, 0);
    }
}

static int group_setup(void **state)
{
    if (dsec_test_server_start("dsec-client-exec", false, &natsd, root, sizeof root) < 0)
        return -1;
    dsec_err err;
    dsec_bus_opts o = {.url = dsec_natsd_url(natsd), .name = "stand-in node"};
    if (dsec_bus_connect(&node_bus, &o, &err) < 0 ||
        dsec_actor_new(&node_actor, node_bus, "fake-node", &err) < 0 ||
        dsec_actor_on(node_actor, "dsec.v1." TENANT ".sbx.fake." SBX ".exec", NULL, fake_exec, NULL,
                      &err) < 0 ||
        dsec_bus_flush(node_bus, 5000, &err) < 0) {
        fprintf(stderr, "test_client_exec: stand-in node: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    dsec_bus_free(node_bus);
    return dsec_test_server_stop(natsd, root);
}

/* What the output callback saw: each stream's bytes, and how many calls. */
typedef struct seen {
    char out[64], err[64];
    size_t out_len, err_len;
    int calls;
} seen;

static void on_output(void *ud, int stream, const uint8_t *data, size_t len)
{
    seen *s = ud;
    char *buf = stream == 1 ? s->out : s->err;
    size_t *n = stream == 1 ? &s->out_len : &s->err_len;
    if (*n + len < sizeof s->out) {
        memcpy(buf + *n, data, len);
        *n += len;
    }
    s->calls++;
}

/* Run the stand-in's command how; returns dsec_exec_stream's rc. */
static int run(const char *how, seen *s, dsec_err *err)
{
    dsec_client *c = NULL;
    dsec_client_opts o = {
        .url = dsec_natsd_url(natsd), .tenant = TENANT, .timeout_ms = 3000, .retries = -1};
    if (dsec_client_connect(&c, &o, err) < 0)
        fail_msg("client: %s", err->msg);
    const char *argv[] = {how, NULL};
    dsec_exec_opts eo = {.argv = argv};
    dsec_exec_reply r;
    memset(s, 0, sizeof *s);
    int rc = dsec_exec_stream(c, SBX, &eo, on_output, s, &r, err);
    if (rc == 0) {
        assert_int_equal(r.out_len, 12);
        dsec_exec_reply_release(&r);
    }
    dsec_client_free(c);
    return rc;
}

static void assert_whole(const seen *s)
{
    assert_int_equal(s->out_len, 12);
    assert_memory_equal(s->out, "hello world\n", 12);
    assert_int_equal(s->err_len, 4);
    assert_memory_equal(s->err, "oops", 4);
}

static void every_chunk_arrives(void **state)
{
    seen s;
    dsec_err err;
    assert_int_equal(run("all", &s, &err), 0);
    assert_whole(&s);
    assert_int_equal(s.calls, 3);
}

static void lost_chunks_come_from_the_result(void **state)
{
    seen s;
    dsec_err err;
    /* the last one lost: stdout from the two chunks, stderr from the result */
    assert_int_equal(run("lose-last", &s, &err), 0);
    assert_whole(&s);
    assert_int_equal(s.calls, 3);
    /* none arrived: the whole output from the result, once */
    assert_int_equal(run("lose-all", &s, &err), 0);
    assert_whole(&s);
    assert_int_equal(s.calls, 2);
    /* the result came first and one chunk after it: the rest of stdout from
     * the result, not the part that chunk carried a second time */
    assert_int_equal(run("late", &s, &err), 0);
    assert_whole(&s);
    assert_int_equal(s.calls, 3);
}

static void what_the_result_cannot_mend_fails(void **state)
{
    seen s;
    dsec_err err;
    /* a chunk came after a lost one: the callback already has a hole */
    assert_int_equal(run("gap", &s, &err), -1);
    assert_int_equal(err.code, DSEC_E_TIMEOUT);
    assert_non_null(strstr(err.msg, "2 of 3 output chunks arrived"));
    assert_non_null(strstr(err.msg, "after a lost one"));
    /* the result's output is cut short: it cannot stand in for the chunk */
    assert_int_equal(run("truncated", &s, &err), -1);
    assert_int_equal(err.code, DSEC_E_TIMEOUT);
    assert_non_null(strstr(err.msg, "truncated"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_chunk_arrives),
        cmocka_unit_test(lost_chunks_come_from_the_result),
        cmocka_unit_test(what_the_result_cannot_mend_fails),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
