/* test_bus_natsd.c - bus integration tests: the nats-server launcher. */
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

const struct CMUnitTest bus_natsd_tests[] = {
    cmocka_unit_test(natsd_start_stop),
    cmocka_unit_test(natsd_go_runtime_settings),
    cmocka_unit_test(natsd_missing_binary),
    cmocka_unit_test(natsd_bad_config_quotes_log),
    cmocka_unit_test(natsd_kill_restart_same_port),
    cmocka_unit_test(natsd_jetstream_store),
};
const size_t bus_natsd_ntests = sizeof bus_natsd_tests / sizeof bus_natsd_tests[0];
