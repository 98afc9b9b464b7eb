/* test_net_bus.c - network containment end to end: a cell whose node runs real containers with
 * their own namespaces, nftables policy and node-local resolver, against an "outside" namespace
 * holding a logging DNS server and web services (tests/net_outside.py). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/cell.h"
#include "actors/wire.h"
#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tests/fixture-client.h"
#include "tests/fixture.h"
#include "tests/outside.h"

#define OUT_NS "dsecnt-out"
#define OUT_IF "dsnto0" /* the host's side of the link to the outside */
#define TAG 200         /* the node's net tag: table dsec_c8, veths dsvc8... */

static dsec_natsd *natsd;
static char root[64];
static dsec_cell_conf conf;
static dsec_cell *cell;
static dsec_client *cl;
static char dns_log[128];
static int host_listener = -1;
static pthread_t host_thread;

/* alerts seen on the bus */
static pthread_mutex_t alert_mu = PTHREAD_MUTEX_INITIALIZER;
static char alerts[64][160];
static int nalerts;
static dsec_bus *abus;
static dsec_actor *aactor;

/* The outside world: its own namespace linked to the host, reachable from
 * sandboxes only through the node's policy (and masquerade); IPv6 and a
 * metadata address besides. */
static const char *const outside_args[] = {"--addr",  "169.254.169.254",
                                           "--addr",  "fd00:77::2",
                                           "--zone",  "allowed.test=198.18.77.2",
                                           "--zone",  "allowed.test=fd00:77::2",
                                           "--zone",  "mirror.test=198.18.77.2",
                                           "--zone",  "secret.exfil.test=198.18.77.3",
                                           "--zone",  "other.test=198.18.77.3",
                                           "--cname", "www.allowed.test=allowed.test",
                                           "--cname", "out.allowed.test=other.test",
                                           NULL};
static dsec_test_outside outside = {
    .ns = OUT_NS,
    .ifname = OUT_IF,
    .net = 77,
    .setup = " && ip -6 addr add fd00:77::1/64 dev " OUT_IF " nodad"
             " && ip -n " OUT_NS " addr add 169.254.169.254/32 dev eth0"
             " && ip -n " OUT_NS " -6 addr add fd00:77::2/64 dev eth0 nodad"
             " && ip -n " OUT_NS " -6 route add default via fd00:77::1"
             " && ip route add 169.254.169.254/32 dev " OUT_IF,
    .teardown = "; ip route del 169.254.169.254/32 2>/dev/null",
    .args = outside_args,
    .log = dns_log,
};

static void *host_accept(void *arg)
{
    (void)arg;
    for (;;) {
        int c = accept(host_listener, NULL, NULL);
        if (c < 0)
            return NULL;
        (void)!write(c, "host-service\n", 13);
        close(c);
    }
}

static void on_alert(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a;
    (void)ud;
    dsec_msg_net_alert al;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_NET_ALERT, dsec_msg_data(m), dsec_msg_len(m), &al,
                    &err) < 0)
        return;
    pthread_mutex_lock(&alert_mu);
    if (nalerts < 64)
        snprintf(alerts[nalerts++], sizeof alerts[0], "%s %s %s %s", al.sandbox, al.kind,
                 al.dest ? al.dest : "", al.detail ? al.detail : "");
    pthread_mutex_unlock(&alert_mu);
}

static int group_setup(void **state)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_net_bus: needs root (namespaces, nftables, containers); skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    if (dsec_test_server_start("dsec-netbus", false, &natsd, root, sizeof root) < 0)
        return -1;
    snprintf(dns_log, sizeof dns_log, "%s/dns.log", root);
    if (dsec_test_outside_up(&outside) < 0) {
        fprintf(stderr, "test_net_bus: could not build the outside namespace\n");
        return -1;
    }
    /* a service on the host's own address on the outside link */
    host_listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in ha = {.sin_family = AF_INET, .sin_port = htons(8090)};
    inet_pton(AF_INET, "198.18.77.1", &ha.sin_addr);
    int one = 1;
    setsockopt(host_listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(host_listener, (struct sockaddr *)&ha, sizeof ha) < 0 || listen(host_listener, 16) < 0)
        return -1;
    pthread_create(&host_thread, NULL, host_accept, NULL);

    char cmd[1024];
    snprintf(
        cmd, sizeof cmd,
        "%s/scripts/build-envs.sh --dsec %s --registry %s/layers --state-dir %s --only busybox "
        ">/dev/null",
        DSEC_SRC, DSEC_CLI, root, root);
    if (system(cmd) != 0) {
        fprintf(stderr, "building busybox:1 failed: %s\n", cmd);
        return -1;
    }
    dsec_err err;
    dsec_cell_conf_defaults(&conf);
    snprintf(conf.cell, sizeof conf.cell, "netbus");
    snprintf(conf.url, sizeof conf.url, "%s", dsec_natsd_url(natsd));
    snprintf(conf.state_dir, sizeof conf.state_dir, "%s/cell", root);
    snprintf(conf.layers_path, sizeof conf.layers_path, "%s/layers", root);
    conf.capacity_ms = 20;
    conf.full_ms = 500;
    conf.heartbeat_ms = 100;
    conf.net.enabled = true;
    conf.net.ipv6 = true; /* IPv6 held to the same rules */
    conf.net.tag_base = TAG;
    conf.net.alert_window_ms = 200;
    conf.net.upstream = dsec_calloc(1, sizeof(char *));
    conf.net.upstream[0] = dsec_strdup("198.18.77.2:53");
    conf.net.nupstream = 1;
    conf.net.mirrors = dsec_calloc(1, sizeof *conf.net.mirrors);
    char **targets = dsec_calloc(1, sizeof(char *));
    targets[0] = dsec_strdup("mirror.test:8081/tcp");
    conf.net.mirrors[0] = (dsec_net_mirror){
        .name = dsec_strdup("pypi"), .targets = (const char *const *)targets, .ntargets = 1};
    conf.net.nmirrors = 1;
    static const char *const types[] = {"container", NULL};
    if (dsec_cell_conf_add_sim_nodes(&conf, "netbus", 1, 8000, 16384, 64, types, NULL, &err) < 0) {
        fprintf(stderr, "conf: %s\n", err.msg);
        return -1;
    }
    snprintf(conf.nodes[0].backend, sizeof conf.nodes[0].backend, "native");
    if (dsec_cell_start(&cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0) {
        fprintf(stderr, "cell: %s\n", err.msg);
        return -1;
    }
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = "netbus", .timeout_ms = 30000};
    dsec_bus_opts bo = {.url = dsec_natsd_url(natsd), .name = "netbus-alerts", .threads = 1};
    if (dsec_client_connect(&cl, &o, &err) < 0 || dsec_bus_connect(&abus, &bo, &err) < 0 ||
        dsec_actor_new(&aactor, abus, "alerts", &err) < 0 ||
        dsec_actor_on(aactor, "dsec.v1.ctl.evt.netbus.alert.>", NULL, on_alert, NULL, &err) < 0 ||
        dsec_bus_flush(abus, 2000, &err) < 0) {
        fprintf(stderr, "client: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    dsec_actor_free(aactor);
    dsec_bus_free(abus);
    dsec_client_free(cl);
    dsec_cell_stop(cell, true);
    dsec_cell_conf_release(&conf);
    if (host_listener >= 0) {
        shutdown(host_listener, SHUT_RDWR);
        close(host_listener);
        pthread_join(host_thread, NULL);
    }
    dsec_test_outside_down(&outside);
    if (natsd == NULL)
        return 0;
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "for m in $(awk -v w='%s/' 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | "
             "sort -r); do umount -l $m; done",
             root);
    if (system(cmd) != 0)
        fprintf(stderr, "teardown: unmounting under %s failed\n", root);
    return dsec_test_server_stop(natsd, root);
}

static void make(const char *const *net, dsec_sandbox_info *info)
{
    dsec_create_spec cs = {
        .type = "container", .env = "busybox:1", .cpu_milli = 500, .memory_mb = 64, .net = net};
    dsec_test_create(cl, &cs, "a container", info);
}

/* sh -c line in id; stdout+stderr (trailing newlines cut) into out; the exit code. */
static int sh(const char *id, const char *line, char *out, size_t n)
{
    return dsec_test_exec_sh(cl, id, line, 30000, true, out, n);
}

/* sh -c line as a background process of sandbox id: a foreground command's leftovers end
 * with it. */
static void bg(const char *id, const char *line)
{
    const char *argv[] = {"/bin/sh", "-c", line, NULL};
    dsec_proc p;
    dsec_err err;
    if (dsec_proc_start(cl, id, &(dsec_proc_opts){.argv = argv}, &p, &err) < 0)
        fail_msg("background %s in %s: %s", line, id, err.msg);
}

static void destroy(const char *id)
{
    dsec_test_destroy(cl, id);
}

/* A TCP connect plus one read from inside a sandbox; 0 when it got data. */
static int tcp(const char *id, const char *host, int port, char *out, size_t n)
{
    char line[256];
    snprintf(line, sizeof line, "nc -w 3 %s %d </dev/null", host, port);
    char buf[1024];
    int rc = sh(id, line, buf, sizeof buf);
    if (out)
        snprintf(out, n, "%s", buf);
    return rc == 0 && strstr(buf, "hello") != NULL ? 0 : -1;
}

static bool dns_log_has(const char *needle)
{
    FILE *f = fopen(dns_log, "r");
    char line[512];
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return found;
}

/* The gateway (the resolver) of a sandbox, from its resolv.conf. */
static void resolver_of(const char *id, char *out, size_t n)
{
    assert_int_equal(sh(id, "sed -n 's/^nameserver //p' /etc/resolv.conf", out, n), 0);
    assert_true(strlen(out) > 6);
}

static void test_default_reaches_nothing(void **state)
{
    if (natsd == NULL)
        skip();
    /* the services are really there: the host reaches them */
    assert_int_equal(
        dsec_test_sh(
            "ip netns exec " OUT_NS " true && "
            "python3 -c \"import socket;s=socket.create_connection(('198.18.77.2',8080),2)\""),
        0);
    dsec_sandbox_info a;
    make(NULL, &a);
    char out[1024], gw[64];
    resolver_of(a.id, gw, sizeof gw);
    assert_int_equal(tcp(a.id, "198.18.77.2", 8080, out, sizeof out), -1);     /* outside */
    assert_int_equal(tcp(a.id, "169.254.169.254", 8080, out, sizeof out), -1); /* metadata */
    assert_int_equal(tcp(a.id, "198.18.77.1", 8090, out, sizeof out), -1);     /* the host */
    char line[256];
    const char *url = dsec_natsd_url(natsd);
    const char *port = strrchr(url, ':') + 1;
    snprintf(line, sizeof line, "nc -w 2 %s %s </dev/null", gw,
             port); /* the bus, via the gateway */
    assert_int_not_equal(sh(a.id, line, out, sizeof out), 0);
    snprintf(line, sizeof line, "nc -w 2 127.0.0.1 %s </dev/null", port); /* its own loopback */
    assert_int_not_equal(sh(a.id, line, out, sizeof out), 0);
    assert_int_not_equal(sh(a.id, "nc -w 2 fd00:77::2 8080 </dev/null", out, sizeof out), 0);
    /* names: refused by the resolver, never asked upstream */
    assert_int_not_equal(sh(a.id, "nslookup allowed.test", out, sizeof out), 0);
    assert_false(dns_log_has("allowed.test"));
    /* DNS straight to the outside server is blocked too */
    assert_int_not_equal(sh(a.id, "nslookup allowed.test 198.18.77.2", out, sizeof out), 0);
    assert_false(dns_log_has("allowed.test"));
    destroy(a.id);
}

static void test_allow_all_still_contained(void **state)
{
    if (natsd == NULL)
        skip();
    /* everything allowed by policy: the outside works, the fixed denials hold */
    static const char *const all[] = {"0.0.0.0/0", "[::/0]", NULL};
    dsec_sandbox_info a, b;
    make(all, &a);
    make(all, &b);
    char out[1024], bip[64];
    assert_int_equal(tcp(a.id, "198.18.77.2", 8080, out, sizeof out), 0);
    assert_int_equal(tcp(a.id, "198.18.77.3", 8081, out, sizeof out), 0);
    assert_int_equal(tcp(a.id, "fd00:77::2", 8080, out, sizeof out),
                     0); /* IPv6 follows the policy */
    assert_int_equal(tcp(a.id, "169.254.169.254", 8080, out, sizeof out), -1);
    assert_int_equal(tcp(a.id, "198.18.77.1", 8090, out, sizeof out), -1);
    /* sandbox to sandbox: b listens; it reaches itself, a cannot reach it */
    assert_int_equal(
        sh(b.id, "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1", bip, sizeof bip), 0);
    assert_true(strlen(bip) >= 7);
    bg(b.id, "while true; do echo hello-b | nc -l -p 9000; done >/dev/null 2>&1");
    usleep(300 * 1000);
    assert_int_equal(tcp(b.id, bip, 9000, out, sizeof out), 0);
    assert_int_equal(tcp(a.id, bip, 9000, out, sizeof out), -1);
    destroy(a.id);
    destroy(b.id);
}

static void test_names_and_mirrors(void **state)
{
    if (natsd == NULL)
        skip();
    static const char *const pol[] = {"allowed.test:8080/tcp", "*.allowed.test:8080/tcp", NULL};
    dsec_sandbox_info a;
    make(pol, &a);
    char out[2048];
    /* the address is reachable only once the resolver has answered for it
     * (busybox's wget cannot resolve in this environment: its static libc
     * has no NSS; nslookup does the resolving, nc the connecting) */
    assert_int_equal(tcp(a.id, "198.18.77.2", 8080, out, sizeof out), -1);
    assert_int_equal(sh(a.id, "nslookup allowed.test", out, sizeof out), 0);
    assert_non_null(strstr(out, "198.18.77.2"));
    if (tcp(a.id, "198.18.77.2", 8080, out, sizeof out) != 0)
        fail_msg("connect after the name resolved: %s", out);
    assert_int_equal(tcp(a.id, "198.18.77.2", 8081, out, sizeof out), -1); /* another port */
    assert_int_equal(tcp(a.id, "198.18.77.3", 8080, out, sizeof out), -1); /* never resolved */
    /* a CNAME inside the allowed names is followed; one leaving them is refused */
    assert_int_equal(sh(a.id, "nslookup www.allowed.test", out, sizeof out), 0);
    assert_non_null(strstr(out, "198.18.77.2"));
    assert_int_not_equal(sh(a.id, "nslookup out.allowed.test", out, sizeof out), 0);
    assert_null(strstr(out, "198.18.77.3"));
    assert_int_equal(tcp(a.id, "198.18.77.3", 8080, out, sizeof out), -1);
    /* a denied name never leaves the node; other query types are refused */
    assert_int_not_equal(sh(a.id, "nslookup q1.secret.exfil.test", out, sizeof out), 0);
    assert_int_not_equal(sh(a.id, "nslookup -type=txt allowed.test", out, sizeof out), 0);
    assert_true(dns_log_has("allowed.test 1"));
    assert_false(dns_log_has("exfil"));
    assert_false(dns_log_has("allowed.test 16"));
    /* the node's counters (and so its metrics) saw them: asked again, the name comes from
     * the resolver's cache */
    dsec_node_stats st0, st1;
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &st0);
    assert_true(st0.dns_queries >= 5);
    assert_true(st0.dns_refused >= 2);
    assert_true(st0.dns_cache_misses >= 1);
    assert_int_equal(sh(a.id, "nslookup allowed.test", out, sizeof out), 0);
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &st1);
    assert_true(st1.dns_queries > st0.dns_queries);
    assert_true(st1.dns_cache_hits > st0.dns_cache_hits);
    destroy(a.id);

    /* a named mirror from the cell configuration */
    static const char *const mir[] = {"pypi", NULL};
    dsec_sandbox_info b;
    make(mir, &b);
    assert_int_equal(tcp(b.id, "198.18.77.2", 8081, out, sizeof out), -1);
    assert_int_equal(sh(b.id, "nslookup mirror.test", out, sizeof out), 0);
    assert_int_equal(tcp(b.id, "198.18.77.2", 8081, out, sizeof out), 0);
    assert_non_null(strstr(out, "hello-outside-8081"));
    assert_int_equal(tcp(b.id, "198.18.77.2", 8080, out, sizeof out),
                     -1); /* not the mirror's port */
    assert_int_not_equal(sh(b.id, "nslookup allowed.test", out, sizeof out), 0);
    destroy(b.id);

    /* bad policies are refused with the entry named */
    static const char *const bad[] = {"no-such-mirror", NULL};
    dsec_create_spec cs = {.type = "container", .env = "busybox:1", .net = bad};
    dsec_sandbox_info c;
    dsec_err err;
    assert_int_equal(dsec_create(cl, &cs, &c, &err), -1);
    assert_non_null(strstr(err.msg, "no-such-mirror"));
}

static void test_policy_changes_at_run_time(void **state)
{
    if (natsd == NULL)
        skip();
    dsec_sandbox_info a;
    make(NULL, &a);
    char out[1024];
    dsec_err err;
    assert_int_equal(tcp(a.id, "198.18.77.2", 8080, out, sizeof out), -1);
    static const char *const open_[] = {"198.18.77.2/tcp"};
    assert_int_equal(dsec_set_network(cl, a.id, open_, 1, &err), 0);
    assert_int_equal(tcp(a.id, "198.18.77.2", 8080, out, sizeof out), 0);
    /* a long-lived flow, then the entry goes: the flow stops and new ones fail */
    bg(a.id, "exec nc 198.18.77.2 8082 > /tmp/ticks 2>&1");
    assert_int_equal(sh(a.id, "sleep 1; wc -l < /tmp/ticks", out, sizeof out), 0);
    assert_true(atoi(out) >= 3);
    assert_int_equal(dsec_set_network(cl, a.id, NULL, 0, &err), 0);
    usleep(500 * 1000);
    assert_int_equal(sh(a.id, "wc -l < /tmp/ticks", out, sizeof out), 0);
    int before = atoi(out);
    sleep(1);
    assert_int_equal(sh(a.id, "wc -l < /tmp/ticks", out, sizeof out), 0);
    assert_true(atoi(out) <= before + 1);
    assert_int_equal(tcp(a.id, "198.18.77.2", 8080, out, sizeof out), -1);
    /* a bad policy is refused and the current one stays */
    static const char *const bad[] = {"10.0.0.0/33"};
    assert_int_equal(dsec_set_network(cl, a.id, bad, 1, &err), -1);
    assert_non_null(strstr(err.msg, "10.0.0.0/33"));
    destroy(a.id);
}

/* A sandbox's address and its host-side veth (the one the host routes that address through). */
static void veth_of(const char *id, char *ip, size_t iplen, char *dev, size_t devlen)
{
    assert_int_equal(sh(id, "ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1", ip, iplen),
                     0);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ip -o route show %s | awk '{print $3}'", ip);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    dev[0] = '\0';
    assert_non_null(fgets(dev, (int)devlen, p));
    pclose(p);
    dev[strcspn(dev, "\n")] = '\0';
    assert_int_equal(strncmp(dev, "dsvc8", 5), 0);
}

/* The namespace a sandbox's namespace file holds (its nsfs inode), or 0 when there is none. */
static unsigned long netns_ino(const char *dev)
{
    char p[512];
    snprintf(p, sizeof p, "%s/cell/node-netbus-0000/net/netns/%s", root, dev);
    struct stat st;
    return stat(p, &st) == 0 ? (unsigned long)st.st_ino : 0;
}

static bool alert_seen(const char *id, const char *kind, const char *dest, const char *detail)
{
    char want[200];
    snprintf(want, sizeof want, "%s %s %s %s", id, kind, dest, detail);
    for (int i = 0; i < 50; i++) {
        pthread_mutex_lock(&alert_mu);
        bool found = false;
        for (int k = 0; k < nalerts && !found; k++)
            found = strcmp(alerts[k], want) == 0;
        pthread_mutex_unlock(&alert_mu);
        if (found)
            return true;
        usleep(100 * 1000);
    }
    pthread_mutex_lock(&alert_mu);
    fprintf(stderr, "alert \"%s\" not seen; seen:\n", want);
    for (int k = 0; k < nalerts; k++)
        fprintf(stderr, "  %s\n", alerts[k]);
    pthread_mutex_unlock(&alert_mu);
    return false;
}

static void test_alerts(void **state)
{
    if (natsd == NULL)
        skip();
    dsec_sandbox_info a;
    make(NULL, &a);
    char out[1024];
    /* operators watch with dsec top and dsec net alerts while it happens */
    assert_int_equal(dsec_test_sh("DSEC_URL=%s %s top --once --interval 3000 > %s/top.txt 2>&1 &",
                                  dsec_natsd_url(natsd), DSEC_CLI, root),
                     0);
    /* the watcher sees every sandbox's alerts, late ones of earlier tests too,
     * in the order their nodes publish them: it runs until killed below */
    assert_int_equal(
        dsec_test_sh("DSEC_URL=%s %s net alerts --count 1000 --timeout 30 > %s/alerts.txt 2>&1 & "
                     "echo $! > %s/alerts.pid",
                     dsec_natsd_url(natsd), DSEC_CLI, root, root),
        0);
    usleep(700 * 1000);
    assert_int_not_equal(sh(a.id, "nslookup q2.secret.exfil.test", out, sizeof out), 0);
    assert_int_equal(tcp(a.id, "198.18.77.3", 8080, out, sizeof out), -1);
    assert_true(alert_seen(a.id, "dns_denied", "q2.secret.exfil.test", "A"));
    assert_true(alert_seen(a.id, "blocked", "198.18.77.3", "tcp/8080"));
    /* the watchers may subscribe late on a loaded machine: keep the alerts coming until top
     * has drawn its screen and the alert watcher has printed what it waited for */
    char want[256];
    snprintf(want, sizeof want,
             "\"sandbox\":\"%s\".*\"kind\":\"dns_denied\".*\"dest\":\"q2.secret.exfil.test\"",
             a.id);
    for (int i = 0; i < 60; i++) {
        if (dsec_test_sh("grep -q 'network alerts:' %s/top.txt && grep -q '%s' %s/alerts.txt", root,
                         want, root) == 0)
            break;
        sh(a.id, "nslookup q2.secret.exfil.test >/dev/null 2>&1", out, sizeof out);
        usleep(250 * 1000);
    }
    dsec_test_sh("kill $(cat %s/alerts.pid) 2>/dev/null", root);
    if (dsec_test_sh("grep -q '%s' %s/alerts.txt", want, root) != 0) {
        dsec_test_sh(
            "echo '--- alerts.txt:'; cat %s/alerts.txt; echo '--- top.txt:'; tail -5 %s/top.txt",
            root, root);
        fail_msg("dsec net alerts did not print the dns_denied alert of %s", a.id);
    }
    assert_int_equal(dsec_test_sh("grep -q 'network alerts: [1-9].*dns_denied' %s/top.txt", root),
                     0);
    destroy(a.id);
}

static void test_dns_flood_does_not_starve_others(void **state)
{
    if (natsd == NULL)
        skip();
    static const char *const pol[] = {"allowed.test:8080/tcp", NULL};
    dsec_sandbox_info a, b;
    make(pol, &a);
    make(pol, &b);
    char out[2048], gw[64], line[256];
    resolver_of(a.id, gw, sizeof gw);
    FILE *f = fopen(DSEC_NET_FLOOD, "rb");
    assert_non_null(f);
    static uint8_t bin[4 << 20];
    size_t len = fread(bin, 1, sizeof bin, f);
    fclose(f);
    dsec_err err;
    assert_int_equal(dsec_file_write(cl, a.id, "/tmp/net_flood", bin, len, 0755, &err), 0);
    snprintf(line, sizeof line, "exec /tmp/net_flood %s 6 allowed.test > /tmp/flood.out 2>&1", gw);
    bg(a.id, line);
    usleep(500 * 1000);
    /* meanwhile b's queries are answered, every one */
    assert_int_equal(sh(b.id,
                        "ok=0; for i in 1 2 3 4 5 6 7 8 9 10; do nslookup allowed.test >/dev/null "
                        "2>&1 && ok=$((ok+1)); done; echo $ok",
                        out, sizeof out),
                     0);
    assert_int_equal(atoi(out), 10);
    sleep(6);
    assert_int_equal(sh(a.id, "cat /tmp/flood.out", out, sizeof out), 0);
    fprintf(stderr, "flood: a sent %s queries in 6 s\n", out);
    assert_true(atol(out) > 1000); /* it really flooded */
    destroy(a.id);
    destroy(b.id);
}

/* A node manager restart keeps the sandbox, its namespace and its policy: re-adopted, it is
 * still contained, still reaches what it may, and a leftover namespace no sandbox holds goes. */
static void test_node_restart_keeps_policy(void **state)
{
    if (natsd == NULL)
        skip();
    static const char *const pol[] = {"198.18.77.2:8080/tcp", NULL};
    dsec_sandbox_info a;
    make(pol, &a);
    char out[1024];
    assert_int_equal(tcp(a.id, "198.18.77.2", 8080, out, sizeof out), 0);
    /* its namespace file is named after its host-side veth */
    char ip[64], dev[32];
    veth_of(a.id, ip, sizeof ip, dev, sizeof dev);
    dsec_cell_stop(cell, false);
    cell = NULL;
    /* while no node manager runs, the sandbox stays contained by the table left in place:
     * from inside its namespace, the allowed port answers and another does not */
    char ns[512];
    snprintf(ns, sizeof ns, "%s/cell/node-netbus-0000/net/netns/%s", root, dev);
    assert_int_equal(
        dsec_test_sh("nsenter --net=%s busybox nc -w 2 198.18.77.2 8080 </dev/null | grep -q hello",
                     ns),
        0);
    assert_int_not_equal(dsec_test_sh("nsenter --net=%s busybox nc -w 2 198.18.77.2 8081 "
                                      "</dev/null 2>/dev/null | grep -q hello",
                                      ns),
                         0);
    /* a crash's leftover: a namespace file and veth of a slot nobody holds */
    assert_int_equal(dsec_test_sh("ip link add dsvc8003ff0 type veth peer name dsvtmpx0 && "
                                  "touch %s/cell/node-netbus-0000/net/netns/dsvc8003ff0",
                                  root),
                     0);
    dsec_err err;
    if (dsec_cell_start(&cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        fail_msg("restart: %s", err.msg);
    assert_int_equal(dsec_wait_state(cl, a.id, "running", 10000, &err), 0);
    assert_int_equal(tcp(a.id, "198.18.77.2", 8080, out, sizeof out), 0);
    assert_int_equal(tcp(a.id, "198.18.77.2", 8081, out, sizeof out), -1);
    assert_int_equal(tcp(a.id, "198.18.77.1", 8090, out, sizeof out), -1);
    static const char *const none[] = {NULL};
    assert_int_equal(dsec_set_network(cl, a.id, none, 0, &err), 0);
    assert_int_equal(tcp(a.id, "198.18.77.2", 8080, out, sizeof out), -1);
    assert_int_not_equal(dsec_test_sh("ip link show dsvc8003ff0 >/dev/null 2>&1"), 0);
    assert_int_not_equal(
        dsec_test_sh("test -e %s/cell/node-netbus-0000/net/netns/dsvc8003ff0", root), 0);
    destroy(a.id);
}

static void restart(void)
{
    dsec_cell_stop(cell, false);
    cell = NULL;
    dsec_err err;
    if (dsec_cell_start(&cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0)
        fail_msg("restart: %s", err.msg);
}

static void node_opt(const char *k, const char *v)
{
    dsec_cell_node *n = &conf.nodes[0];
    n->opts[n->nopts].key = dsec_strdup(k);
    n->opts[n->nopts].value = dsec_strdup(v);
    n->nopts++;
}

static void node_opts_drop(size_t k)
{
    dsec_cell_node *n = &conf.nodes[0];
    while (k-- > 0 && n->nopts > 0) {
        n->nopts--;
        dsec_free((char *)n->opts[n->nopts].key);
        dsec_free((char *)n->opts[n->nopts].value);
    }
}

/* A sandbox with a network that a restarted node manager cannot run as configured - the
 * runtime that started it is missing, then the node has no network containment - is kept,
 * network and all, through the sweeps (a create after each start) and adopted with its
 * policy once the configuration is back. */
static void test_node_restart_keeps_what_it_cannot_run(void **state)
{
    if (natsd == NULL)
        skip();
    if (system("PATH=/usr/sbin:/usr/bin:/sbin:/bin command -v runc >/dev/null") != 0) {
        fprintf(stderr, "test_net_bus: runc is not installed; not tested\n");
        skip();
    }
    static const char *const pol[] = {"198.18.77.2:8080/tcp", NULL};
    dsec_sandbox_info a, b;
    make(pol, &a);
    char out[1024], ip[64], dev[32];
    assert_int_equal(tcp(a.id, "198.18.77.2", 8080, out, sizeof out), 0);
    veth_of(a.id, ip, sizeof ip, dev, sizeof dev);
    long ix = dsec_test_ifindex(dev);
    unsigned long ino = netns_ino(dev);
    assert_true(ix > 0 && ino != 0);
    dsec_err err;

    /* started by crun, which this node manager cannot find: runc is its runtime now. Its veth
     * and namespace are the same ones after each restart: the warm pool's creates from the
     * node's start took other slots */
    node_opt("runtime", "runc");
    node_opt("crun_path", "/nonexistent/crun");
    restart();
    assert_int_equal(dsec_wait_state(cl, a.id, "running", 1500, &err), -1);
    make(NULL, &b); /* the container sweep runs before it; the network sweep ran at start */
    destroy(b.id);
    assert_int_equal(dsec_test_ifindex(dev), ix);
    assert_int_equal(netns_ino(dev), ino);
    node_opts_drop(2);

    /* no network containment configured */
    conf.net.enabled = false;
    restart();
    assert_int_equal(dsec_wait_state(cl, a.id, "running", 1500, &err), -1);
    make(NULL, &b);
    destroy(b.id);
    assert_int_equal(dsec_test_ifindex(dev), ix);

    /* all back: adopted, still held to its policy */
    conf.net.enabled = true;
    restart();
    if (dsec_wait_state(cl, a.id, "running", 10000, &err) < 0)
        fail_msg("not re-adopted: %s", err.msg);
    assert_int_equal(tcp(a.id, "198.18.77.2", 8080, out, sizeof out), 0);
    assert_int_equal(tcp(a.id, "198.18.77.2", 8081, out, sizeof out), -1);
    assert_int_equal(dsec_test_ifindex(dev), ix);
    destroy(a.id);
    assert_int_not_equal(dsec_test_ifindex(dev), ix); /* gone (or the slot another's since) */
    assert_int_not_equal(netns_ino(dev), ino);
}

static void test_destroy_leaves_nothing(void **state)
{
    if (natsd == NULL)
        skip();
    dsec_sandbox_info a;
    make(NULL, &a);
    char ip[64], dev[32];
    veth_of(a.id, ip, sizeof ip, dev, sizeof dev);
    long ix = dsec_test_ifindex(dev);
    unsigned long ino = netns_ino(dev);
    assert_true(ix > 0 && ino != 0);
    destroy(a.id);
    /* its route goes with its veth; one seen after is that of a veth made since in its slot */
    bool route = dsec_test_sh("ip -o route show %s | grep -q .", ip) == 0;
    long now = dsec_test_ifindex(dev);
    assert_int_not_equal(now, ix);
    assert_true(!route || now > 0);
    assert_int_not_equal(netns_ino(dev), ino);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_reaches_nothing),
        cmocka_unit_test(test_allow_all_still_contained),
        cmocka_unit_test(test_names_and_mirrors),
        cmocka_unit_test(test_policy_changes_at_run_time),
        cmocka_unit_test(test_alerts),
        cmocka_unit_test(test_dns_flood_does_not_starve_others),
        cmocka_unit_test(test_node_restart_keeps_policy),
        cmocka_unit_test(test_node_restart_keeps_what_it_cannot_run),
        cmocka_unit_test(test_destroy_leaves_nothing),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
