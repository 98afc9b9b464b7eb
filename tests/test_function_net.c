/* test_function_net.c - function sandboxes with a network policy: their calls run in the
 * sandbox's namespace of the node's containment, against an "outside" namespace holding a
 * logging DNS server and web services (tests/net_outside.py). */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdbool.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/backend.h"
#include "backends/function/function.h"
#include "backends/layers/layer-cache.h"
#include "backends/net/net.h"
#include "backends/registry.h"
#include "dsec/alloc.h"
#include "dsec/err.h"
#include "dsec/layers.h"
#include "tests/outside.h"

/*
 * One containment (tag TAG, IPv4 only, no networks made ahead, so every
 * veth and namespace seen is one of our sandboxes') and one function
 * backend given it, as a node does; a second backend without containment.
 * The outside: 198.18.78.2 answers DNS (allowed.test -> .2, other.test ->
 * .3) and serves TCP 8080 on .2 and .3.
 */

#define OUT_NS "dsecfn-out"
#define OUT_IF "dsfno0"
#define TAG 203 /* veths dsvcb...; no other test uses it */
#define TAG_HEX "cb"
#define SLOT0 "dsv" TAG_HEX "000000" /* the first slot's veth */
#define UID_BASE 1760000000u
#define UID_BASE_PLAIN 1760100000u
#define UID_BASE_TIGHT 1760200000u
#define UID_BASE_ENV 1760300000u

static char root[64];
static char net_dir[96];
static dsec_net *net;
static void *fn;       /* with containment */
static void *fn_plain; /* without */
static int sb_seq;

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static char outside_log[160];
static dsec_test_outside outside = {
    .ns = OUT_NS,
    .ifname = OUT_IF,
    .net = 78,
    .args = (const char *const[]){"--zone", "allowed.test=198.18.78.2", "--zone",
                                  "other.test=198.18.78.3", NULL},
    .log = outside_log,
};

static int net_open(void)
{
    static const char *const ups[] = {"198.18.78.2:53"};
    dsec_net_conf c = {.state_dir = net_dir,
                       .tag = TAG,
                       .pool6 = "",
                       .upstream = ups,
                       .nupstream = 1,
                       .warm = UINT32_MAX};
    dsec_err err;
    if (dsec_net_new(&net, &c, &err) < 0) {
        fprintf(stderr, "test_function_net: containment: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int fn_open(void **out, dsec_net *n, uint32_t uid_base, const char *dir)
{
    char uid[16];
    snprintf(uid, sizeof uid, "%u", uid_base);
    dsec_backend_kv opts[] = {
        {"max_workers", "12"}, {"pool_python3", "2"}, {"hot_python3", "1"}, {"pool_sh", "1"},
        {"pool_native", "0"},  {"tmpfs_mb", "16"},    {"uid_base", uid},
    };
    dsec_backend_config cfg = {.state_dir = dir,
                               .node = "fnnet",
                               .opts = opts,
                               .nopts = sizeof opts / sizeof opts[0],
                               .net = n};
    dsec_err err;
    if (dsec_function_ops.init(out, &cfg, &err) < 0) {
        fprintf(stderr, "test_function_net: function backend: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static char fn_dir[96], plain_dir[96];

static int group_setup(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "test_function_net: needs root (namespaces, nftables); skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    snprintf(root, sizeof root, "/tmp/dsec-fnnet-XXXXXX");
    if (mkdtemp(root) == NULL)
        return -1;
    snprintf(net_dir, sizeof net_dir, "%s/net", root);
    snprintf(fn_dir, sizeof fn_dir, "%s/function", root);
    snprintf(plain_dir, sizeof plain_dir, "%s/plain", root);
    if (snprintf(outside_log, sizeof outside_log, "%s/dns.log", root) < 0 ||
        dsec_test_outside_up(&outside) < 0) {
        fprintf(stderr, "test_function_net: could not build the outside namespace\n");
        return -1;
    }
    if (mkdir(net_dir, 0700) < 0 || net_open() < 0 || fn_open(&fn, net, UID_BASE, fn_dir) < 0 ||
        fn_open(&fn_plain, NULL, UID_BASE_PLAIN, plain_dir) < 0)
        return -1;
    return 0;
}

/* Veths of our tag on the host, and namespace files of our containment. */
static int leftovers(void)
{
    int n = dsec_test_links("dsv" TAG_HEX);
    char d[128];
    snprintf(d, sizeof d, "%s/netns", net_dir);
    DIR *dir = opendir(d);
    for (struct dirent *e; dir != NULL && (e = readdir(dir)) != NULL;)
        if (e->d_name[0] != '.')
            n++;
    if (dir != NULL)
        closedir(dir);
    return n;
}

static int group_teardown(void **state)
{
    (void)state;
    int rc = 0;
    if (fn != NULL)
        dsec_function_ops.fini(fn);
    if (fn_plain != NULL)
        dsec_function_ops.fini(fn_plain);
    fn = fn_plain = NULL;
    if (net != NULL) {
        if (leftovers() != 0) {
            fprintf(stderr, "test_function_net: veths or namespaces outlived their sandboxes\n");
            rc = -1;
        }
        dsec_net_free(net, false);
        net = NULL;
    }
    dsec_test_outside_down(&outside);
    if (root[0] != '\0')
        dsec_test_sh("rm -rf '%s'", root);
    return rc;
}

static int need_root(void **state)
{
    (void)state;
    if (fn == NULL)
        skip();
    return 0;
}

/* ---- helpers ----------------------------------------------------------------------- */

struct sbx {
    void *be;
    dsec_sandbox *h;
    char *bstate;
    char id[32];
};

/* A sandbox of runtime rt on backend be with these policy entries (NULL-ended, or NULL: none). */
static int mk_try(void *be, const char *rt, const char *const *net_entries, struct sbx **out,
                  dsec_err *err)
{
    struct sbx *s = calloc(1, sizeof *s);
    assert_non_null(s);
    s->be = be;
    snprintf(s->id, sizeof s->id, "fnnet-%04d", __atomic_fetch_add(&sb_seq, 1, __ATOMIC_RELAXED));
    size_t nn = 0;
    while (net_entries != NULL && net_entries[nn] != NULL)
        nn++;
    dsec_backend_kv labels[] = {{"runtime", rt}};
    dsec_sandbox_spec spec = {.id = s->id,
                              .type = "function",
                              .memory_mb = 256,
                              .labels = labels,
                              .nlabels = 1,
                              .tenant = "fnnet",
                              .net = net_entries,
                              .nnet = nn};
    if (dsec_function_ops.create(be, &spec, &s->h, &s->bstate, err) < 0) {
        free(s);
        return -1;
    }
    *out = s;
    return 0;
}

static struct sbx *mk(const char *rt, const char *const *net_entries)
{
    struct sbx *s = NULL;
    dsec_err err;
    if (mk_try(fn, rt, net_entries, &s, &err) < 0)
        fail_msg("create (%s): %s", rt, err.msg);
    return s;
}

static void rm(struct sbx *s)
{
    dsec_err err;
    if (dsec_function_ops.destroy(s->be, s->h, &err) < 0)
        fail_msg("destroy %s: %s", s->id, err.msg);
    dsec_free(s->bstate);
    free(s);
}

/* Run argv in s; stdout (and stderr after a "|" when not empty) into out; the exit code. */
static int call(struct sbx *s, const char *const *argv, char *out, size_t n)
{
    size_t argc = 0;
    while (argv[argc] != NULL)
        argc++;
    dsec_exec_req req = {.argv = argv, .argc = argc, .timeout_ms = 20000};
    dsec_exec_result r;
    memset(&r, 0, sizeof r);
    dsec_err err;
    if (dsec_function_ops.exec(s->be, s->h, &req, &r, &err) < 0)
        fail_msg("exec %s in %s: %s", argv[0], s->id, err.msg);
    snprintf(out, n, "%.*s%s%.*s", (int)r.stdout_len, r.stdout_data ? (char *)r.stdout_data : "",
             r.stderr_len ? "|" : "", (int)r.stderr_len,
             r.stderr_data ? (char *)r.stderr_data : "");
    int code = r.signal ? 128 + r.signal : r.exit_code;
    dsec_exec_result_release(&r);
    return code;
}

static int py(struct sbx *s, const char *code, char *out, size_t n)
{
    const char *argv[] = {"python3", "-c", code, NULL};
    return call(s, argv, out, n);
}

static int sh(struct sbx *s, const char *line, char *out, size_t n)
{
    const char *argv[] = {"sh", "-c", line, NULL};
    return call(s, argv, out, n);
}

/* What a call sees of the network, as JSON: its resolv.conf, the allowed
 * name and a connect to it (with the source address), a refused name, a
 * connect to an address the policy does not allow (and how long it took),
 * its interfaces, and whether it may join another network namespace. */
static const char probe[] =
    "import ctypes, json, os, socket, time\n"
    "r = {'resolv': open('/etc/resolv.conf').read().strip()}\n"
    "try:\n"
    "    r['allowed'] = socket.getaddrinfo('allowed.test', 8080, socket.AF_INET)[0][4][0]\n"
    "except OSError as e:\n"
    "    r['allowed'] = type(e).__name__\n"
    "try:\n"
    "    c = socket.create_connection(('198.18.78.2', 8080), timeout=5)\n"
    "    r['src'] = c.getsockname()[0]\n"
    "    r['hello'] = c.recv(200).decode().split()[-1]\n"
    "    c.close()\n"
    "except OSError as e:\n"
    "    r['hello'] = type(e).__name__\n"
    "try:\n"
    "    socket.getaddrinfo('other.test', 8080, socket.AF_INET)\n"
    "    r['other'] = 'resolved'\n"
    "except socket.gaierror:\n"
    "    r['other'] = 'gaierror'\n"
    "t = time.monotonic()\n"
    "try:\n"
    "    socket.create_connection(('198.18.78.3', 8080), timeout=5).close()\n"
    "    r['blocked'] = 'connected'\n"
    "except OSError as e:\n"
    "    r['blocked'] = type(e).__name__\n"
    "r['blocked_ms'] = int((time.monotonic() - t) * 1000)\n"
    "r['ifs'] = ','.join(n for _, n in socket.if_nameindex())\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "fd = os.open('/proc/self/ns/net', os.O_RDONLY)\n"
    "r['setns'] = '%d/%d' % (libc.setns(fd, 0), ctypes.get_errno())\n"
    "print(json.dumps(r, sort_keys=True))\n";

/* The string value of "key" in the probe's JSON, into v. */
static const char *field(const char *json, const char *key, char *v, size_t n)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *p = strstr(json, k);
    v[0] = '\0';
    if (p == NULL)
        return v;
    p += strlen(k);
    bool quoted = *p == '"';
    p += quoted;
    size_t i = 0;
    while (*p != '\0' && *p != '"' && (quoted || (*p != ',' && *p != '}')) && i + 1 < n)
        v[i++] = *p++;
    v[i] = '\0';
    return v;
}

static void expect_field(const char *json, const char *key, const char *want)
{
    char v[256];
    if (strcmp(field(json, key, v, sizeof v), want) != 0)
        fail_msg("%s: \"%s\", expected \"%s\" in %s", key, v, want, json);
}

static const char *const allow_one[] = {"allowed.test", NULL};

/* ---- the tests ----------------------------------------------------------------------------- */

/* The policy's name resolves and its service answers; another name gets no
 * address, another address is refused at once; the call has lo and eth0,
 * the sandbox's resolver in /etc/resolv.conf, and may not setns. Both
 * runtimes, python3 in the warm interpreter and as an executed program. */
static void policy_holds(void **state)
{
    (void)state;
    static const char *const rts[] = {"python3", "sh"};
    for (size_t i = 0; i < 2; i++) {
        struct sbx *s = mk(rts[i], allow_one);
        char out[4096], v[128];
        int code = py(s, probe, out, sizeof out);
        if (code != 0)
            fail_msg("%s probe: exit %d: %s", rts[i], code, out);
        expect_field(out, "allowed", "198.18.78.2");
        expect_field(out, "hello", "hello-outside-8080");
        expect_field(out, "other", "gaierror");
        expect_field(out, "blocked", "ConnectionRefusedError");
        if (atoi(field(out, "blocked_ms", v, sizeof v)) > 1000)
            fail_msg("a blocked connect took %s ms: %s", v, out);
        expect_field(out, "ifs", "lo,eth0");
        expect_field(out, "setns", "-1/1"); /* EPERM: the call's filter */
        /* the sandbox's own resolver, the gateway of its pool */
        if (strncmp(field(out, "resolv", v, sizeof v), "nameserver 100.", 15) != 0)
            fail_msg("resolv.conf of the call: %s", v);
        if (strncmp(field(out, "src", v, sizeof v), "100.", 4) != 0)
            fail_msg("source address %s", v);
        if (i == 1) { /* the host's programs resolve through it too */
            assert_int_equal(sh(s, "getent hosts allowed.test", out, sizeof out), 0);
            assert_non_null(strstr(out, "198.18.78.2"));
            assert_int_equal(sh(s, "getent hosts other.test", out, sizeof out), 2);
            /* the resolv.conf is read-only, and the bind left nothing in /tmp */
            assert_int_equal(sh(s, "echo x > /etc/resolv.conf", out, sizeof out), 2);
            assert_int_equal(sh(s, "ls -A /tmp", out, sizeof out), 0);
            assert_string_equal(out, "");
        }
        rm(s);
    }
}

/* Every call of a sandbox is in its namespace: the same source address;
 * another sandbox has another. Nothing of a call outlives it, even though
 * the namespace does: a listener left behind by one call is gone for the
 * next. */
static void calls_share_the_sandbox_network(void **state)
{
    (void)state;
    struct sbx *a = mk("python3", allow_one), *b = mk("python3", allow_one);
    char out[4096], src[3][64];
    static const char src_code[] =
        "import socket\n"
        "c = socket.create_connection(('allowed.test', 8080), timeout=5)\n"
        "print(c.getsockname()[0])\n";
    for (int i = 0; i < 3; i++) {
        if (py(i < 2 ? a : b, src_code, out, sizeof out) != 0)
            fail_msg("call %d: %s", i, out);
        out[strcspn(out, "\n")] = '\0';
        snprintf(src[i], sizeof src[i], "%.63s", out);
    }
    assert_string_equal(src[0], src[1]);
    assert_string_not_equal(src[0], src[2]);

    struct sbx *s = mk("sh", allow_one);
    assert_int_equal(sh(s,
                        "python3 -c \"import socket, time; l = socket.socket(); "
                        "l.bind(('127.0.0.1', 9999)); l.listen(); time.sleep(30)\" & "
                        "sleep 0.3; echo started",
                        out, sizeof out),
                     0);
    assert_int_equal(py(s,
                        "import socket\n"
                        "try:\n"
                        "    socket.create_connection(('127.0.0.1', 9999), timeout=2)\n"
                        "    print('listening')\n"
                        "except OSError as e:\n"
                        "    print(type(e).__name__)\n",
                        out, sizeof out),
                     0);
    assert_string_equal(out, "ConnectionRefusedError\n");
    rm(a);
    rm(b);
    rm(s);
}

/* Without a policy: no network at all (lo only), the host's resolv.conf
 * untouched, nothing reachable; the node's containment is not used. */
static void no_policy_no_network(void **state)
{
    (void)state;
    int before = leftovers();
    struct sbx *s = mk("python3", NULL);
    assert_int_equal(leftovers(), before);
    char out[4096], v[256];
    assert_int_equal(py(s, probe, out, sizeof out), 0);
    expect_field(out, "ifs", "lo");
    expect_field(out, "hello", "OSError"); /* ENETUNREACH */
    expect_field(out, "blocked", "OSError");
    expect_field(out, "allowed", "gaierror");
    if (strstr(field(out, "resolv", v, sizeof v), "nameserver 100.") != NULL)
        fail_msg("a call without a network got the resolver: %s", v);
    dsec_err err;
    static const char *const one[] = {"other.test"};
    assert_int_equal(dsec_function_ops.net_set(fn, s->h, one, 1, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    rm(s);
}

/* Changing the policy of a live sandbox: the next call follows it. */
static void policy_changes(void **state)
{
    (void)state;
    struct sbx *s = mk("python3", allow_one);
    char out[4096];
    static const char resolve[] =
        "import socket\n"
        "for n in ('allowed.test', 'other.test'):\n"
        "    try:\n"
        "        print(n, socket.getaddrinfo(n, 80, socket.AF_INET)[0][4][0])\n"
        "    except socket.gaierror:\n"
        "        print(n, 'refused')\n";
    assert_int_equal(py(s, resolve, out, sizeof out), 0);
    assert_string_equal(out, "allowed.test 198.18.78.2\nother.test refused\n");
    static const char *const other[] = {"other.test"};
    dsec_err err;
    if (dsec_function_ops.net_set(fn, s->h, other, 1, &err) < 0)
        fail_msg("net_set: %s", err.msg);
    assert_int_equal(py(s, resolve, out, sizeof out), 0);
    assert_string_equal(out, "allowed.test refused\nother.test 198.18.78.3\n");
    rm(s);
}

/* A node manager's restart: the function backend closed, the containment freed (keeping its
 * networks for adoption when keep), both opened again. */
static void reopen(bool keep)
{
    dsec_function_ops.fini(fn);
    fn = NULL;
    dsec_net_free(net, keep);
    net = NULL;
    if (net_open() < 0 || fn_open(&fn, net, UID_BASE, fn_dir) < 0)
        fail_msg("reopening (see above)");
}

/* A node manager restart: the sandbox is detached, the containment closed
 * keeping its networks, both opened again; adopt finds the sandbox's
 * network and its last policy, and its calls work as before. */
static void adopt_keeps_the_network(void **state)
{
    (void)state;
    struct sbx *s = mk("python3", allow_one);
    static const char *const other[] = {"other.test"};
    dsec_err err;
    if (dsec_function_ops.net_set(fn, s->h, other, 1, &err) < 0)
        fail_msg("net_set: %s", err.msg);
    char out[4096], src0[64];
    static const char code[] = "import socket\n"
                               "c = socket.create_connection(('other.test', 8080), timeout=5)\n"
                               "print(c.getsockname()[0], c.recv(200).decode().split()[-1])\n";
    assert_int_equal(py(s, code, out, sizeof out), 0);
    snprintf(src0, sizeof src0, "%.63s", out);

    dsec_function_ops.detach(fn, s->h);
    reopen(true);
    dsec_sandbox_spec spec = {.id = s->id, .type = "function"};
    if (dsec_function_ops.adopt(fn, &spec, s->bstate, &s->h, &err) < 0)
        fail_msg("adopt: %s", err.msg);
    s->be = fn;
    int swept = dsec_net_sweep(net, &err);
    if (swept != 0) /* its network is held, and no other was left */
        fail_msg("sweep: %d %s", swept, swept < 0 ? err.msg : "");
    assert_int_equal(py(s, code, out, sizeof out), 0);
    assert_string_equal(out, src0);
    rm(s);
    assert_int_equal(leftovers(), 0);
}

/* A create that comes before the restarted node re-adopts (a warm pool attaches from its start):
 * it is given another slot, not the one of the sandbox still to be adopted, whose network stays
 * as it was and is adopted with it. */
static void attach_before_adopt_leaves_its_slot(void **state)
{
    (void)state;
    /* a containment with nothing held: slots are handed out from the first again */
    reopen(false);
    struct sbx *s = mk("python3", allow_one);
    char out[4096], src0[64];
    static const char code[] = "import socket\n"
                               "c = socket.create_connection(('allowed.test', 8080), timeout=5)\n"
                               "print(c.getsockname()[0], c.recv(200).decode().split()[-1])\n";
    assert_int_equal(py(s, code, out, sizeof out), 0);
    snprintf(src0, sizeof src0, "%.63s", out);
    long ifindex0 = dsec_test_ifindex(SLOT0);
    assert_true(ifindex0 > 0); /* the first slot is s's */

    dsec_function_ops.detach(fn, s->h);
    reopen(true);
    struct sbx *t = mk("sh", allow_one); /* before the adoption */
    dsec_sandbox_spec spec = {.id = s->id, .type = "function"};
    dsec_err err;
    if (dsec_function_ops.adopt(fn, &spec, s->bstate, &s->h, &err) < 0)
        fail_msg("adopt after another create: %s", err.msg);
    s->be = fn;
    assert_int_equal(dsec_test_ifindex(SLOT0), ifindex0); /* the same veth: nothing remade it */
    int swept = dsec_net_sweep(net, &err);
    if (swept != 0)
        fail_msg("sweep: %d %s", swept, swept < 0 ? err.msg : "");
    assert_int_equal(py(s, code, out, sizeof out), 0);
    assert_string_equal(out, src0);
    assert_int_equal(sh(t, "true", out, sizeof out), 0);
    rm(t);
    rm(s);
    assert_int_equal(leftovers(), 0);
}

/* A node without containment refuses a policy, saying why. */
static void no_containment_refuses(void **state)
{
    (void)state;
    struct sbx *s = NULL;
    dsec_err err;
    assert_int_equal(mk_try(fn_plain, "python3", allow_one, &s, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "no network containment"));
    /* and one whose policy is malformed is refused by the containment */
    static const char *const bad[] = {"10.0.0.0/33", NULL};
    assert_int_equal(mk_try(fn, "python3", bad, &s, &err), -1);
    assert_non_null(strstr(err.msg, "10.0.0.0/33"));
    assert_int_equal(leftovers(), 0);
}

/* Destroy leaves no veth and no namespace behind (the teardown checks the
 * whole group again). */
static void destroy_cleans_up(void **state)
{
    (void)state;
    struct sbx *s[3];
    for (int i = 0; i < 3; i++)
        s[i] = mk(i == 2 ? "sh" : "python3", allow_one);
    assert_int_equal(leftovers(), 2 * 3); /* a veth and a namespace file each */
    char out[256];
    for (int i = 0; i < 3; i++)
        assert_int_equal(sh(s[i], "true", out, sizeof out), 0);
    for (int i = 0; i < 3; i++)
        rm(s[i]);
    assert_int_equal(leftovers(), 0);
}

struct par {
    struct sbx *s;
    int code;
    char out[256];
};

static void *par_call(void *arg)
{
    struct par *c = arg;
    static const char *const argv[] = {
        "python3", "-c",
        "import socket; print(socket.getaddrinfo('allowed.test', 80, socket.AF_INET)[0][4][0])",
        NULL};
    dsec_exec_req req = {.argv = argv, .argc = 3, .timeout_ms = 30000};
    dsec_exec_result r;
    memset(&r, 0, sizeof r);
    dsec_err err;
    if (dsec_function_ops.exec(c->s->be, c->s->h, &req, &r, &err) < 0) {
        c->code = -1;
        snprintf(c->out, sizeof c->out, "%.200s", err.msg);
        return NULL;
    }
    c->code = r.exit_code;
    snprintf(c->out, sizeof c->out, "%.*s", (int)r.stdout_len,
             r.stdout_data ? (char *)r.stdout_data : "");
    dsec_exec_result_release(&r);
    return NULL;
}

/* Every slot held by a warm worker (max_workers = the pools' targets), and
 * more networked calls at once than slots: each call lets a warm worker go
 * for its own, waits its turn, and all are answered. */
static void calls_find_slots_when_all_are_warm(void **state)
{
    (void)state;
    char dir[128], uid[16];
    snprintf(dir, sizeof dir, "%s/tight", root);
    snprintf(uid, sizeof uid, "%u", UID_BASE_TIGHT);
    dsec_backend_kv opts[] = {
        {"max_workers", "3"}, {"pool_python3", "2"}, {"hot_python3", "0"},
        {"pool_sh", "1"},     {"pool_native", "0"},  {"uid_base", uid},
    };
    dsec_backend_config cfg = {
        .state_dir = dir, .node = "fntight", .opts = opts, .nopts = 6, .net = net};
    void *tight = NULL;
    dsec_err err;
    if (dsec_function_ops.init(&tight, &cfg, &err) < 0)
        fail_msg("init: %s", err.msg);
    enum { K = 5 };
    struct sbx *s[K];
    for (int i = 0; i < K; i++)
        if (mk_try(tight, i % 2 ? "sh" : "python3", allow_one, &s[i], &err) < 0)
            fail_msg("create: %s", err.msg);
    /* both pools warm: every slot taken */
    assert_int_equal(dsec_function_pool_warm(tight, "python3", 2, 0, 10000, &err), 0);
    assert_int_equal(dsec_function_pool_warm(tight, "sh", 1, 0, 10000, &err), 0);
    struct par c[K];
    pthread_t th[K];
    for (int i = 0; i < K; i++) {
        c[i] = (struct par){.s = s[i]};
        pthread_create(&th[i], NULL, par_call, &c[i]);
    }
    for (int i = 0; i < K; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < K; i++)
        if (c[i].code != 0 || strcmp(c[i].out, "198.18.78.2\n") != 0)
            fail_msg("call %d: %d %s", i, c[i].code, c[i].out);
    for (int i = 0; i < K; i++)
        rm(s[i]);
    /* and the pools fill up again */
    assert_int_equal(dsec_function_pool_warm(tight, "python3", 2, 0, 10000, &err), 0);
    dsec_function_ops.fini(tight);
}

/* An environment without /etc/resolv.conf (a busybox layer): the zygote's
 * top layer gives it an empty one, which a networked call's resolver is
 * bound over; a call without a network sees it empty. */
static void environment_without_resolv_conf(void **state)
{
    (void)state;
    if (access("/bin/busybox", X_OK) != 0)
        skip();
    char tree[128], blob[128], regdir[128], dir[128], cache[128], uid[16];
    snprintf(tree, sizeof tree, "%s/box", root);
    snprintf(blob, sizeof blob, "%s/box.blob", root);
    snprintf(regdir, sizeof regdir, "%s/registry", root);
    snprintf(dir, sizeof dir, "%s/envfn", root);
    snprintf(cache, sizeof cache, "%s/cache", root);
    snprintf(uid, sizeof uid, "%u", UID_BASE_ENV);
    assert_int_equal(
        dsec_test_sh("set -e; t=%s; mkdir -p $t/bin $t/etc; cp /bin/busybox $t/bin/; "
                     "for a in sh cat nslookup wget; do ln -s busybox $t/bin/$a; done; "
                     "printf 'root:x:0:0:root:/root:/bin/sh\\n' > $t/etc/passwd",
                     tree),
        0);
    dsec_layer_registry *reg = NULL;
    dsec_digest d;
    dsec_err err;
    if (dsec_layer_registry_local(&reg, regdir, &err) < 0 ||
        dsec_layer_build(tree, DSEC_LAYER_DIR, NULL, 0, blob, d, &err) < 0 ||
        dsec_layer_registry_put(reg, d, DSEC_LAYER_DIR, blob, &err) < 0)
        fail_msg("registry: %s", err.msg);
    char *layers[] = {d}, *vars[] = {"PATH=/bin"};
    dsec_env e = {.name = "box:1",
                  .layers = layers,
                  .nlayers = 1,
                  .vars = vars,
                  .nvars = 1,
                  .workdir = "/",
                  .user = "root"};
    if (dsec_layer_registry_env_put(reg, &e, &err) < 0)
        fail_msg("environment: %s", err.msg);
    dsec_backend_kv opts[] = {
        {"max_workers", "6"}, {"pool_python3", "0"}, {"hot_python3", "0"}, {"pool_sh", "0"},
        {"pool_native", "0"}, {"uid_base", uid},     {"env_pools", "1"},   {"env_warm", "1"},
    };
    dsec_backend_config cfg = {.state_dir = dir,
                               .node = "fnenvnet",
                               .opts = opts,
                               .nopts = sizeof opts / sizeof opts[0],
                               .layers = reg,
                               .layer_cache_dir = cache,
                               .net = net};
    void *be = NULL;
    if (dsec_function_ops.init(&be, &cfg, &err) < 0)
        fail_msg("init: %s", err.msg);
    struct sbx *s[2];
    for (int i = 0; i < 2; i++) {
        s[i] = calloc(1, sizeof *s[i]);
        s[i]->be = be;
        snprintf(s[i]->id, sizeof s[i]->id, "fnnet-env%d", i);
        dsec_backend_kv labels[] = {{"runtime", "sh"}};
        dsec_sandbox_spec spec = {.id = s[i]->id,
                                  .type = "function",
                                  .env = "box:1",
                                  .memory_mb = 64,
                                  .labels = labels,
                                  .nlabels = 1,
                                  .net = i == 0 ? allow_one : NULL,
                                  .nnet = i == 0 ? 1 : 0};
        if (dsec_function_ops.create(be, &spec, &s[i]->h, &s[i]->bstate, &err) < 0)
            fail_msg("create: %s", err.msg);
    }
    char out[1024];
    assert_int_equal(sh(s[0], "cat /etc/resolv.conf", out, sizeof out), 0);
    if (strncmp(out, "nameserver 100.", 15) != 0)
        fail_msg("resolv.conf: %s", out);
    /* the outside service closes without reading the request: wget may
     * then see a reset after the body */
    sh(s[0], "wget -q -O - http://allowed.test:8080/ 2>/dev/null", out, sizeof out);
    if (strstr(out, "hello-outside-8080") == NULL)
        fail_msg("wget: %s", out);
    assert_int_equal(sh(s[1], "cat /etc/resolv.conf", out, sizeof out), 0);
    assert_string_equal(out, "");
    for (int i = 0; i < 2; i++)
        rm(s[i]);
    dsec_function_ops.fini(be);
    dsec_layer_registry_free(reg);
}

/* A killed zygote: the next networked call waits for the rebuilt one. */
static void zygote_killed(void **state)
{
    (void)state;
    struct sbx *s = mk("python3", allow_one);
    dsec_function_pool_info info;
    dsec_err err;
    assert_int_equal(dsec_function_pool_info_get(fn, "python3", &info, &err), 0);
    assert_true(info.zygote_pid > 0);
    assert_int_equal(kill(info.zygote_pid, SIGKILL), 0);
    char out[256];
    assert_int_equal(py(s,
                        "import socket; print(socket.getaddrinfo('allowed.test', 80, "
                        "socket.AF_INET)[0][4][0])",
                        out, sizeof out),
                     0);
    assert_string_equal(out, "198.18.78.2\n");
    assert_int_equal(dsec_function_pool_info_get(fn, "python3", &info, &err), 0);
    assert_true(info.zygote_starts >= 2);
    rm(s);
}

/* The scheduler's pick: a create with a policy (it requires "network") and
 * nothing heavier asked for is a function call now. */
static void placement_picks_function(void **state)
{
    (void)state;
    dsec_registry *reg = NULL;
    dsec_err err;
    assert_int_equal(dsec_registry_new_builtin(&reg, &err), 0);
    static const char *const req[] = {"network"};
    int idx = dsec_registry_pick(reg, NULL, req, 1, dsec_registry_all(reg), &err);
    assert_int_equal(idx, dsec_registry_find(reg, "function"));
    assert_int_equal(dsec_registry_pick(reg, "function", req, 1, dsec_registry_all(reg), &err),
                     idx);
    dsec_registry_free(reg);
}

/* Sorts v. */
static int median_us(uint64_t *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            uint64_t t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return (int)v[n / 2];
}

/* Not a check: the cost of a networked create and call beside a plain one
 * (docs/function-calls.md quotes these). */
static void cost(void **state)
{
    (void)state;
    enum { N = 15 };
    for (int netted = 0; netted < 2; netted++) {
        uint64_t create[N], call_us[N];
        char out[256];
        struct sbx *keep = NULL;
        for (int i = 0; i < N; i++) {
            uint64_t t0 = now_us();
            struct sbx *s = mk("python3", netted ? allow_one : NULL);
            create[i] = now_us() - t0;
            if (i + 1 < N)
                rm(s);
            else
                keep = s;
        }
        for (int i = 0; i < N; i++) {
            uint64_t t0 = now_us();
            assert_int_equal(py(keep, "pass", out, sizeof out), 0);
            call_us[i] = now_us() - t0;
            usleep(20000); /* let the pool refill, as calls spaced out would */
        }
        int cp = median_us(create, N), kp = median_us(call_us, N);
        fprintf(stderr,
                "test_function_net: %s: create p50 %d us (min %d), call (python3 -c pass) p50 %d "
                "us (min %d)\n",
                netted ? "with a policy" : "no policy", cp, (int)create[0], kp, (int)call_us[0]);
        rm(keep);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(placement_picks_function, NULL),
        cmocka_unit_test_setup(policy_holds, need_root),
        cmocka_unit_test_setup(calls_share_the_sandbox_network, need_root),
        cmocka_unit_test_setup(no_policy_no_network, need_root),
        cmocka_unit_test_setup(policy_changes, need_root),
        cmocka_unit_test_setup(no_containment_refuses, need_root),
        cmocka_unit_test_setup(destroy_cleans_up, need_root),
        cmocka_unit_test_setup(calls_find_slots_when_all_are_warm, need_root),
        cmocka_unit_test_setup(environment_without_resolv_conf, need_root),
        cmocka_unit_test_setup(zygote_killed, need_root),
        cmocka_unit_test_setup(adopt_keeps_the_network, need_root),
        cmocka_unit_test_setup(attach_before_adopt_leaves_its_slot, need_root),
        cmocka_unit_test_setup(cost, need_root),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
