/* test_auth.c - bus permissions for real: `dsec auth` writes a nats-server configuration, the
 * server runs it, and tenants stay inside their own subjects. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
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
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/cell.h"
#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tests/test_util.h"

static const char *dsec_bin;
static char dir[64];
static int port;
static pid_t server = -1;
static char url_control[256], url_alice[256], url_bob[256];

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static int run(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run(char *out, size_t n, const char *fmt, ...)
{
    char body[2048], cmd[2100];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "( %s ) 2>&1", body); /* every command's errors into out */
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return -1;
    size_t got = fread(out, 1, n - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* DSEC_URL from DIR/creds/<user>.env */
static int read_url(const char *user, char *out, size_t n)
{
    char path[256], line[512];
    snprintf(path, sizeof path, "%s/creds/%s.env", dir, user);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    int rc = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "DSEC_URL=", 9) == 0) {
            line[strcspn(line, "\n")] = '\0';
            size_t len = strlen(line + 9);
            if (len < n) {
                memcpy(out, line + 9, len + 1);
                rc = 0;
            }
        }
    fclose(f);
    return rc;
}

static int start_server_at(const char *conf_dir, int at_port, pid_t *pid);

static int start_server(void)
{
    return start_server_at(dir, port, &server);
}

static int start_server_at(const char *conf_dir, int at_port, pid_t *pid)
{
    char conf[256];
    snprintf(conf, sizeof conf, "%s/nats-server.conf", conf_dir);
    pid_t child = *pid = fork();
    if (child == 0) {
        int null = open("/dev/null", 01);
        dup2(null, 1);
        dup2(null, 2);
        execlp("nats-server", "nats-server", "-c", conf, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 100; i++) { /* ready when it accepts connections */
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)at_port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok)
            return 0;
        msleep(50);
    }
    return -1;
}

static int group_setup(void **state)
{
    (void)state;
    if (dsec_bin == NULL) {
        fprintf(stderr, "usage: test_auth PATH-TO-dsec\n");
        return -1;
    }
    snprintf(dir, sizeof dir, "/tmp/dsec-auth-XXXXXX");
    if (mkdtemp(dir) == NULL || (port = free_port()) < 0)
        return -1;
    char out[4096];
    int rc =
        run(out, sizeof out, "'%s' auth --out %s --tenant alice --tenant bob --listen 127.0.0.1:%d",
            dsec_bin, dir, port);
    if (rc != 0) {
        fprintf(stderr, "dsec auth failed: %s\n", out);
        return -1;
    }
    if (read_url("control", url_control, sizeof url_control) < 0 ||
        read_url("tenant-alice", url_alice, sizeof url_alice) < 0 ||
        read_url("tenant-bob", url_bob, sizeof url_bob) < 0)
        return -1;
    return start_server();
}

static int group_teardown(void **state)
{
    (void)state;
    if (server > 0) {
        kill(server, SIGTERM);
        waitpid(server, NULL, 0);
    }
    char out[256];
    run(out, sizeof out, "rm -rf '%s'", dir);
    return 0;
}

static void test_config_and_credentials(void **state)
{
    (void)state;
    char out[8192];
    /* the server file holds hashes, never a password */
    assert_int_equal(run(out, sizeof out, "cat %s/nats-server.conf", dir), 0);
    char alice_pw[64];
    snprintf(alice_pw, sizeof alice_pw, "%.*s", (int)strcspn(strchr(url_alice + 7, ':') + 1, "@"),
             strchr(url_alice + 7, ':') + 1);
    assert_null(strstr(out, alice_pw));
    assert_non_null(strstr(out, "\"dsec.v1.alice.>\""));
    assert_non_null(strstr(out, "\"_INBOX.alice.>\""));
    assert_non_null(strstr(out, "system_account: SYS"));
    /* credentials files are the owner's only */
    assert_int_equal(run(out, sizeof out, "stat -c %%a %s/creds/tenant-alice.env", dir), 0);
    assert_string_equal(out, "600\n");
    /* a re-run with one more tenant keeps every existing password */
    assert_int_equal(run(out, sizeof out,
                         "'%s' auth --out %s --tenant alice --tenant bob --tenant carol "
                         "--listen 127.0.0.1:%d",
                         dsec_bin, dir, port),
                     0);
    char again[256];
    assert_int_equal(read_url("tenant-alice", again, sizeof again), 0);
    assert_string_equal(again, url_alice);
    /* bad input is named */
    assert_int_equal(run(out, sizeof out, "'%s' auth --out %s --tenant 'a.b'", dsec_bin, dir), 2);
    assert_non_null(strstr(out, "tenant \"a.b\""));
    assert_int_equal(
        run(out, sizeof out, "'%s' auth --out %s --tenant x --listen nowhere", dsec_bin, dir), 2);
    assert_non_null(strstr(out, "expected HOST:PORT"));
    assert_int_equal(
        run(out, sizeof out, "'%s' auth --out %s --tenant x --tls-cert /c", dsec_bin, dir), 2);
    assert_non_null(strstr(out, "go together"));
}

static void test_no_credentials_no_bus(void **state)
{
    (void)state;
    char url[128];
    snprintf(url, sizeof url, "nats://127.0.0.1:%d", port);
    dsec_bus_opts o = {.url = url, .connect_timeout_ms = 2000, .max_reconnect = 1};
    dsec_bus *bus = NULL;
    dsec_err err;
    assert_int_equal(dsec_bus_connect(&bus, &o, &err), -1);
    printf("auth: without credentials: %s\n", err.msg);
    /* a wrong password is refused, and the error does not print it */
    snprintf(url, sizeof url, "nats://tenant-bob:not-the-password@127.0.0.1:%d", port);
    o.url = url;
    assert_int_equal(dsec_bus_connect(&bus, &o, &err), -1);
    assert_null(strstr(err.msg, "not-the-password"));
    assert_non_null(strstr(err.msg, "tenant-bob:***@"));
}

struct spy {
    atomic_int got;
};

static void on_spy(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a;
    (void)m;
    struct spy *s = ud;
    atomic_fetch_add(&s->got, 1);
}

/* alice's own lifecycle events, under her permissions (dsec.v1.alice.evt.sbx) */
static struct {
    pthread_mutex_t mu;
    char last[DSEC_ID_MAX];
    int running;
} alice_events = {PTHREAD_MUTEX_INITIALIZER, "", 0};

static void on_alice_event(const dsec_sbx_event *ev, void *ud)
{
    (void)ud;
    pthread_mutex_lock(&alice_events.mu);
    if (strcmp(ev->state, "running") == 0) {
        alice_events.running++;
        snprintf(alice_events.last, sizeof alice_events.last, "%s", ev->id);
    }
    pthread_mutex_unlock(&alice_events.mu);
}

static void test_tenants_stay_in_their_subjects(void **state)
{
    (void)state;
    /* the control plane runs with the control identity */
    dsec_cell_conf c;
    dsec_cell_conf_defaults(&c);
    snprintf(c.cell, sizeof c.cell, "auth%ld", (long)getpid());
    snprintf(c.url, sizeof c.url, "%s", url_control);
    snprintf(c.state_dir, sizeof c.state_dir, "%s/state", dir);
    c.capacity_ms = 20;
    c.full_ms = 300;
    static const char *const types[] = {"sim", NULL};
    dsec_err err;
    assert_int_equal(dsec_cell_conf_add_sim_nodes(&c, "an", 1, 8000, 8192, 100, types, "0", &err),
                     0);
    dsec_cell *cell = NULL;
    if (dsec_cell_start(&cell, &c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        fail_msg("cell: %s", err.msg);

    dsec_client *alice = NULL, *bob = NULL, *liar = NULL;
    dsec_client_opts ao = {.url = url_alice, .tenant = "alice", .timeout_ms = 3000, .retries = -1};
    dsec_client_opts bo = {.url = url_bob, .tenant = "bob", .timeout_ms = 3000, .retries = -1};
    assert_int_equal(dsec_client_connect(&alice, &ao, &err), 0);
    assert_int_equal(dsec_client_connect(&bob, &bo, &err), 0);

    /* alice works normally under her permissions: create, exec (streamed too), status */
    dsec_event_watch *watch = NULL;
    assert_int_equal(dsec_watch_events(alice, on_alice_event, NULL, &watch, &err), 0);
    dsec_create_spec spec = {.type = "sim"};
    dsec_sandbox_info info, st;
    if (dsec_create(alice, &spec, &info, &err) < 0)
        fail_msg("alice create: %s", err.msg);
    const char *argv[] = {"echo", "secret-answer-42", NULL};
    dsec_exec_opts eo = {.argv = argv};
    dsec_exec_reply r;
    if (dsec_exec(alice, info.id, &eo, &r, &err) < 0)
        fail_msg("alice exec: %s", err.msg);
    dsec_exec_reply_release(&r);

    /* fleet handling under permissions: alice lists her sandbox (node_set and list on her
     * own subjects, answers in her inbox) and follows its events; bob's listing holds none
     * of hers */
    dsec_list_page lp;
    if (dsec_list_sandboxes(alice, NULL, &lp, &err) < 0)
        fail_msg("alice list: %s", err.msg);
    assert_int_equal(lp.n, 1);
    assert_string_equal(lp.entries[0].id, info.id);
    assert_int_equal(lp.nmissing, 0);
    dsec_list_page_release(&lp);
    if (dsec_list_sandboxes(bob, NULL, &lp, &err) < 0)
        fail_msg("bob list: %s", err.msg);
    assert_int_equal(lp.n, 0);
    assert_int_equal(lp.nmissing, 0);
    dsec_list_page_release(&lp);
    bool seen = false;
    for (int i = 0; i < 100 && !seen; i++) {
        pthread_mutex_lock(&alice_events.mu);
        seen = alice_events.running == 1 && strcmp(alice_events.last, info.id) == 0;
        pthread_mutex_unlock(&alice_events.mu);
        if (!seen)
            msleep(20);
    }
    assert_true(seen);
    dsec_event_watch_free(watch);

    /* bob, a real tenant with real credentials, reaches alice's sandbox only through his own
     * subjects, where the node checks the owner */
    assert_int_equal(dsec_status(bob, info.id, &st, &err), -1);
    assert_int_equal(err.code, DSEC_E_PERMISSION);

    /* bob's raw connection: alice's subjects are refused by the server itself */
    dsec_bus *raw = NULL;
    dsec_bus_opts ro = {.url = url_bob, .inbox_prefix = "_INBOX.bob"};
    assert_int_equal(dsec_bus_connect(&raw, &ro, &err), 0);
    char subj[256], node[72];
    assert_int_equal(dsec_id_node(info.id, node, sizeof node, &err), 0);
    snprintf(subj, sizeof subj, "dsec.v1.alice.sbx.%s.%s.op", node, info.id);
    dsec_msg_op op = {.id = info.id, .op = "destroy"};
    dsec_buf b;
    dsec_buf_init(&b);
    assert_int_equal(dsec_encode(&b, DSEC_MSG_OP, &op, &err), 0);
    dsec_msg *reply = NULL;
    assert_int_equal(dsec_bus_request_sync(raw, subj, &(dsec_hdr){.type = "op"}, b.data, b.len,
                                           1500, &reply, &err),
                     -1);
    printf("auth: bob destroying alice's sandbox on her subject: %s\n", err.msg);
    /* the server's refusal ends the request: not a timeout that a retry could cure */
    assert_int_equal(err.code, DSEC_E_PERMISSION);
    assert_non_null(strstr(err.msg, subj));
    /* nor can he create as her, or speak for the control plane */
    assert_int_equal(dsec_bus_request_sync(raw, "dsec.v1.ctl.place.an-0",
                                           &(dsec_hdr){.type = "place"}, b.data, b.len, 1000,
                                           &reply, &err),
                     -1);
    assert_int_equal(err.code, DSEC_E_PERMISSION);
    dsec_buf_release(&b);

    /* and he cannot listen to other inboxes or alice's subjects: the server refuses the
     * subscriptions (reported as async errors) and nothing reaches him */
    struct spy spy = {0};
    dsec_actor *a = NULL;
    assert_int_equal(dsec_actor_new(&a, raw, "spy", &err), 0);
    assert_int_equal(dsec_actor_on(a, "_INBOX.>", NULL, on_spy, &spy, &err), 0);
    assert_int_equal(dsec_actor_on(a, "_INBOX.alice.>", NULL, on_spy, &spy, &err), 0);
    assert_int_equal(dsec_actor_on(a, "dsec.v1.alice.>", NULL, on_spy, &spy, &err), 0);
    assert_int_equal(dsec_actor_on(a, "dsec.v1.ctl.>", NULL, on_spy, &spy, &err), 0);
    dsec_bus_flush(raw, 2000, &err);
    for (int i = 0; i < 5; i++) {
        if (dsec_exec(alice, info.id, &eo, &r, &err) < 0)
            fail_msg("alice exec: %s", err.msg);
        dsec_exec_reply_release(&r);
    }
    msleep(300);
    assert_int_equal(atomic_load(&spy.got), 0);
    dsec_bus_stats bst;
    dsec_bus_stats_get(raw, &bst);
    printf("auth: bob's refused subscriptions: %" PRIu64 " permission errors reported\n",
           bst.async_errors);
    assert_true(bst.async_errors >= 1);
    dsec_actor_free(a);
    dsec_bus_free(raw);

    /* alice's credentials with a forged tenant name: her creates go to bob's subject, which
     * the server does not let her publish on */
    dsec_client_opts lo = {.url = url_alice, .tenant = "bob", .timeout_ms = 1500, .retries = -1};
    assert_int_equal(dsec_client_connect(&liar, &lo, &err), 0);
    assert_int_equal(dsec_create(liar, &spec, &st, &err), -1);
    printf("auth: alice's identity creating as bob: %s\n", err.msg);
    assert_int_equal(err.code, DSEC_E_PERMISSION);

    /* alice's sandbox is untouched by all of it */
    assert_int_equal(dsec_status(alice, info.id, &st, &err), 0);
    assert_string_equal(st.state, "running");
    assert_int_equal(dsec_destroy(alice, info.id, &err), 0);
    dsec_client_free(liar);
    dsec_client_free(alice);
    dsec_client_free(bob);
    dsec_cell_stop(cell, true);
    dsec_cell_conf_release(&c);
}

/* TLS: a CA and a server certificate for 127.0.0.1 made with openssl, a server that
 * requires TLS, and clients that verify it. */
static void test_tls(void **state)
{
    (void)state;
    char out[4096];
    if (run(out, sizeof out, "command -v openssl") != 0)
        skip();
    char tls[128], adir[160];
    snprintf(tls, sizeof tls, "%s/tls", dir);
    snprintf(adir, sizeof adir, "%s/tls-auth", dir);
    assert_int_equal(
        run(out, sizeof out,
            "mkdir -p %s && cd %s && "
            "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
            "-subj /CN=dsec-test-ca && "
            "openssl req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj /CN=127.0.0.1 "
            "&& "
            "printf 'subjectAltName=IP:127.0.0.1\\n' > ext && "
            "openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem "
            "-days 2 -extfile ext",
            tls, tls),
        0);
    int tport = free_port();
    assert_true(tport > 0);
    assert_int_equal(
        run(out, sizeof out,
            "'%s' auth --out %s --tenant alice --listen 127.0.0.1:%d --tls-cert %s/srv.pem "
            "--tls-key %s/srv.key --tls-ca %s/ca.pem",
            dsec_bin, adir, tport, tls, tls, tls),
        0);
    char path[256], url[256] = "", line[512];
    snprintf(path, sizeof path, "%s/creds/control.env", adir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    bool has_ca = false;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "DSEC_URL=", 9) == 0 && strlen(line + 9) < sizeof url)
            memcpy(url, line + 9, strlen(line + 9) + 1);
        has_ca |= strncmp(line, "DSEC_TLS_CA=", 12) == 0;
    }
    fclose(f);
    assert_true(has_ca);
    assert_int_equal(strncmp(url, "tls://", 6), 0);
    pid_t tserver = -1;
    assert_int_equal(start_server_at(adir, tport, &tserver), 0);

    char ca[192];
    snprintf(ca, sizeof ca, "%s/ca.pem", tls);
    unsetenv("DSEC_TLS_CA");
    dsec_err err;
    dsec_bus *bus = NULL;
    /* verified against the CA: it connects and the server answers */
    dsec_bus_opts o = {.url = url, .tls_ca = ca, .connect_timeout_ms = 3000, .max_reconnect = 1};
    int rc = dsec_bus_connect(&bus, &o, &err);
    if (rc < 0)
        fprintf(stderr, "tls connect: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(dsec_bus_flush(bus, 2000, &err), 0);
    dsec_bus_free(bus);
    /* a client that does not trust the CA is refused the connection */
    o.tls_ca = "/etc/ssl/certs/ca-certificates.crt";
    assert_int_equal(dsec_bus_connect(&bus, &o, &err), -1);
    printf("auth: TLS with an untrusted server certificate: %s\n", err.msg);
    /* plain text to a server that requires TLS: refused */
    char plain[256];
    snprintf(plain, sizeof plain, "nats%s", strstr(url, "://"));
    o = (dsec_bus_opts){.url = plain, .connect_timeout_ms = 3000, .max_reconnect = 1};
    assert_int_equal(dsec_bus_connect(&bus, &o, &err), -1);
    assert_null(strstr(err.msg, strchr(strstr(url, "://") + 3, ':') + 1)); /* no password */
    kill(tserver, SIGTERM);
    waitpid(tserver, NULL, 0);
}

int main(int argc, char **argv)
{
    dsec_bin = argc > 1 ? argv[1] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_and_credentials),
        cmocka_unit_test(test_no_credentials_no_bus),
        cmocka_unit_test(test_tenants_stay_in_their_subjects),
        cmocka_unit_test(test_tls),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
