/* test_function_net_bus.c - a function-shaped create with a network policy, end to end: the
 * scheduler places it on a function sandbox, the node gives it a network of its containment,
 * its calls reach what the policy allows (an "outside" namespace, tests/net_outside.py). */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/cell.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tests/fixture.h"
#include "tests/outside.h"

#define OUT_NS "dsecfnb-out"
#define OUT_IF "dsfnbo0"
#define TAG 204 /* veths dsvcc...; no other test uses it */
#define TAG_HEX "cc"

static dsec_natsd *natsd;
static char root[64];
static dsec_cell_conf conf;
static dsec_cell *cell;
static dsec_client *cl;

static char outside_log[160];
static dsec_test_outside outside = {
    .ns = OUT_NS,
    .ifname = OUT_IF,
    .net = 79,
    .args = (const char *const[]){"--zone", "allowed.test=198.18.79.2", "--zone",
                                  "other.test=198.18.79.3", NULL},
    .log = outside_log,
};

static void opt(dsec_cell_node *n, const char *k, const char *v)
{
    n->opts[n->nopts].key = dsec_strdup(k);
    n->opts[n->nopts].value = dsec_strdup(v);
    n->nopts++;
}

static int group_setup(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "test_function_net_bus: needs root (namespaces, nftables); skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    if (dsec_test_server_start("dsec-fnnetbus", false, &natsd, root, sizeof root) < 0)
        return -1;
    if (snprintf(outside_log, sizeof outside_log, "%s/dns.log", root) < 0 ||
        dsec_test_outside_up(&outside) < 0) {
        fprintf(stderr, "test_function_net_bus: could not build the outside namespace\n");
        return -1;
    }
    dsec_err err;
    dsec_cell_conf_defaults(&conf);
    snprintf(conf.cell, sizeof conf.cell, "fnnetbus");
    snprintf(conf.url, sizeof conf.url, "%s", dsec_natsd_url(natsd));
    snprintf(conf.state_dir, sizeof conf.state_dir, "%s/cell", root);
    conf.capacity_ms = 20;
    conf.full_ms = 500;
    conf.heartbeat_ms = 100;
    conf.net.enabled = true;
    conf.net.tag_base = TAG;
    conf.net.warm = UINT32_MAX; /* every veth seen is a sandbox's */
    conf.net.upstream = dsec_calloc(1, sizeof(char *));
    conf.net.upstream[0] = dsec_strdup("198.18.79.2:53");
    conf.net.nupstream = 1;
    static const char *const types[] = {"function", NULL};
    if (dsec_cell_conf_add_sim_nodes(&conf, "fnnetbus", 1, 8000, 16384, 64, types, NULL, &err) <
        0) {
        fprintf(stderr, "conf: %s\n", err.msg);
        return -1;
    }
    dsec_cell_node *n = &conf.nodes[0];
    snprintf(n->backend, sizeof n->backend, "native");
    opt(n, "function.pool_python3", "2");
    opt(n, "function.pool_sh", "1");
    opt(n, "function.pool_native", "0");
    opt(n, "function.max_workers", "12");
    opt(n, "function.uid_base", "1770000000");
    if (dsec_cell_start(&cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0) {
        fprintf(stderr, "cell: %s\n", err.msg);
        return -1;
    }
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = "fnnetbus", .timeout_ms = 20000};
    if (dsec_client_connect(&cl, &o, &err) < 0) {
        fprintf(stderr, "client: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int veths(void)
{
    return dsec_test_links("dsv" TAG_HEX);
}

static int group_teardown(void **state)
{
    (void)state;
    dsec_client_free(cl);
    dsec_cell_stop(cell, true);
    dsec_cell_conf_release(&conf);
    dsec_test_outside_down(&outside);
    if (natsd != NULL)
        return dsec_test_server_stop(natsd, root);
    return 0;
}

static int need_root(void **state)
{
    (void)state;
    if (cell == NULL)
        skip();
    return 0;
}

static const char resolve[] = "import socket\n"
                              "for n in ('allowed.test', 'other.test'):\n"
                              "    try:\n"
                              "        a = socket.getaddrinfo(n, 8080, socket.AF_INET)[0][4][0]\n"
                              "        c = socket.create_connection((a, 8080), timeout=5)\n"
                              "        print(n, c.recv(200).decode().split()[-1])\n"
                              "    except socket.gaierror:\n"
                              "        print(n, 'refused')\n";

static void run_resolve(const char *id, char *out, size_t n)
{
    static const char *const argv[] = {"python3", "-c", resolve, NULL};
    dsec_exec_opts o = {.argv = argv, .timeout_ms = 20000};
    dsec_exec_reply r;
    dsec_err err;
    if (dsec_exec(cl, id, &o, &r, &err) < 0)
        fail_msg("exec: %s (%s)", err.msg, dsec_code_name(err.code));
    if (r.exit_code != 0)
        fail_msg("exit %d: %.*s", r.exit_code, (int)r.err_len, (char *)r.err_out);
    snprintf(out, n, "%.*s", (int)r.out_len, (char *)r.out);
    dsec_exec_reply_release(&r);
}

/* No type named, a policy: the lightest type with the network capability
 * is a function sandbox; its calls reach what the policy allows, the net
 * op changes it, destroy takes its network away. */
static void a_policy_makes_a_networked_function_sandbox(void **state)
{
    (void)state;
    dsec_err err;
    dsec_sandbox_info info;
    static const char *const labels[] = {"runtime=python3", NULL};
    static const char *const net[] = {"allowed.test", NULL};
    dsec_create_spec spec = {.labels = labels, .memory_mb = 256, .net = net, .cell = "fnnetbus"};
    if (dsec_create(cl, &spec, &info, &err) < 0)
        fail_msg("create: %s (%s)", err.msg, dsec_code_name(err.code));
    assert_string_equal(info.type, "function");
    assert_int_equal(veths(), 1);
    char out[512];
    run_resolve(info.id, out, sizeof out);
    assert_string_equal(out, "allowed.test hello-outside-8080\nother.test refused\n");

    static const char *const other[] = {"other.test"};
    if (dsec_set_network(cl, info.id, other, 1, &err) < 0)
        fail_msg("set_network: %s", err.msg);
    run_resolve(info.id, out, sizeof out);
    assert_string_equal(out, "allowed.test refused\nother.test hello-outside-8080\n");

    assert_int_equal(dsec_destroy(cl, info.id, &err), 0);
    assert_int_equal(veths(), 0);

    /* without a policy the same create has no network at all */
    dsec_create_spec plain = {.labels = labels, .memory_mb = 256, .cell = "fnnetbus"};
    if (dsec_create(cl, &plain, &info, &err) < 0)
        fail_msg("create: %s", err.msg);
    assert_string_equal(info.type, "function");
    assert_int_equal(veths(), 0);
    static const char *const ifs[] = {
        "python3", "-c", "import socket; print([n for _, n in socket.if_nameindex()])", NULL};
    dsec_exec_opts o = {.argv = ifs, .timeout_ms = 20000};
    dsec_exec_reply r;
    if (dsec_exec(cl, info.id, &o, &r, &err) < 0)
        fail_msg("exec: %s", err.msg);
    assert_string_equal((char *)r.out, "['lo']\n");
    dsec_exec_reply_release(&r);
    assert_int_equal(dsec_set_network(cl, info.id, other, 1, &err), -1);
    assert_non_null(strstr(err.msg, "without a network policy"));
    assert_int_equal(dsec_destroy(cl, info.id, &err), 0);
}

/* `dsec call --cell fnnetbus ARGS` against the test's server; its stdout in out, its wait status
 * returned. */
static int run_cli(const char *args, char *out, size_t n)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "DSEC_URL='%s' DSEC_TENANT=fnnetbus '%s' call --cell fnnetbus %s",
             dsec_natsd_url(natsd), DSEC_BIN, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t got = fread(out, 1, n - 1, p);
    out[got] = 0;
    return pclose(p);
}

/* A one-shot call with a policy (libdsec's dsec_call, then the CLI's
 * `dsec call --net`) reaches what the policy allows; its sandbox and veth
 * are gone once it returns; without --net the call has only lo. */
static void a_one_shot_call_takes_a_policy(void **state)
{
    (void)state;
    static const char *const argv[] = {"python3", "-c", resolve, NULL};
    static const char *const net[] = {"allowed.test", NULL};
    dsec_call_spec spec = {.argv = argv, .timeout_ms = 20000, .cell = "fnnetbus", .net = net};
    dsec_exec_reply r;
    dsec_err err;
    if (dsec_call(cl, &spec, &r, &err) < 0)
        fail_msg("call: %s (%s)", err.msg, dsec_code_name(err.code));
    assert_int_equal(r.exit_code, 0);
    assert_string_equal((char *)r.out, "allowed.test hello-outside-8080\nother.test refused\n");
    dsec_exec_reply_release(&r);
    assert_int_equal(veths(), 0);

    /* the CLI: the same call, and one without --net */
    setenv("RESOLVE", resolve, 1);
    char out[512];
    assert_int_equal(run_cli("--net other.test -- python3 -c \"$RESOLVE\"", out, sizeof out), 0);
    assert_string_equal(out, "allowed.test refused\nother.test hello-outside-8080\n");
    assert_int_equal(veths(), 0);
    assert_int_equal(run_cli("-- python3 -c 'import socket; "
                             "print([n for _, n in socket.if_nameindex()])'",
                             out, sizeof out),
                     0);
    assert_string_equal(out, "['lo']\n");

    /* a bad entry is refused with the entry named, and nothing is left */
    int st = run_cli("--net 'bad entry!' -- python3 -c pass 2>&1", out, sizeof out);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
    if (strstr(out, "bad entry!") == NULL)
        fail_msg("the error does not name the entry: %s", out);
    assert_int_equal(veths(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(a_policy_makes_a_networked_function_sandbox, need_root),
        cmocka_unit_test_setup(a_one_shot_call_takes_a_policy, need_root),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
