/* test_function.c - the function backend for real: runtimes, isolation between calls, limits,
 * timeouts, a killed zygote, concurrency, malformed tasks, files. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/backend.h"
#include "backends/function/function.h"
#include "dsec/alloc.h"
#include "dsec/err.h"
#include "tests/test_util.h"

/*
 * One backend instance serves the whole group (as one serves a node): its
 * pools are shared by every test, which is also what the isolation tests
 * need to be meaningful - the calls they compare run on the same zygote,
 * often in the same cgroup slot and uid after one another.
 */

#define UID_BASE 1700000000u
#define MAX_WORKERS 40

static void *fn;
static char state_dir[64];
static int sb_seq;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int group_setup(void **state)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_function: needs root (namespaces, mounts, cgroups); skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    snprintf(state_dir, sizeof state_dir, "/tmp/dsec-fntest-XXXXXX");
    if (mkdtemp(state_dir) == NULL)
        return -1;
    char uid[16], maxw[16];
    snprintf(uid, sizeof uid, "%u", UID_BASE);
    snprintf(maxw, sizeof maxw, "%u", MAX_WORKERS);
    dsec_backend_kv opts[] = {
        {"max_workers", maxw},
        {"pool_python3", "6"},
        {"hot_python3", "2"},
        {"pool_sh", "3"},
        {"function.pool_native", "2"},
        {"tmpfs_mb", "32"},
        {"uid_base", uid},
        {"max_timeout_ms", "20000"},
        {"time_scale", "0"}, /* another backend's option: ignored */
    };
    dsec_backend_config cfg = {.state_dir = state_dir,
                               .node = "fntest",
                               .opts = opts,
                               .nopts = sizeof opts / sizeof opts[0]};
    dsec_err err;
    if (dsec_function_ops.init(&fn, &cfg, &err) < 0) {
        fprintf(stderr, "function backend: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int host_procs(const char *needle);

static int group_teardown(void **state)
{
    int rc = 0;
    if (fn != NULL) {
        dsec_function_ops.fini(fn);
        /* shutting down leaves no process and no cgroup behind */
        int left = host_procs("");
        if (left != 0) {
            fprintf(stderr, "test_function: %d call processes outlived the backend\n", left);
            rc = -1;
        }
        if (system("find /sys/fs/cgroup -maxdepth 6 -name 'dsec-fn-fntest-*' 2>/dev/null | grep -q "
                   ".") == 0) {
            fprintf(stderr, "test_function: cgroups of the backend outlived it\n");
            rc = -1;
        }
    }
    fn = NULL;
    if (state_dir[0] != '\0') {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", state_dir);
        if (system(cmd) != 0)
            rc = -1;
    }
    return rc;
}

static int need_root(void **state)
{
    if (fn == NULL)
        skip();
    return 0;
}

/* ---- helpers ----------------------------------------------------------------------- */

struct sbx {
    dsec_sandbox *h;
    char *bstate;
    char id[32];
};

/* A sandbox with labels "k=v" (NULL-terminated). */
static struct sbx *mk_labels(uint64_t memory_mb, uint64_t disk_mb, const char *const *labels)
{
    struct sbx *s = calloc(1, sizeof *s);
    assert_non_null(s);
    snprintf(s->id, sizeof s->id, "fntest-%04d", __atomic_fetch_add(&sb_seq, 1, __ATOMIC_RELAXED));
    dsec_backend_kv kv[8];
    size_t n = 0;
    char buf[8][64];
    for (; labels && labels[n] && n < 8; n++) {
        snprintf(buf[n], sizeof buf[n], "%s", labels[n]);
        char *eq = strchr(buf[n], '=');
        assert_non_null(eq);
        *eq = '\0';
        kv[n] = (dsec_backend_kv){buf[n], eq + 1};
    }
    dsec_sandbox_spec spec = {.id = s->id,
                              .type = "function",
                              .memory_mb = memory_mb,
                              .disk_mb = disk_mb,
                              .labels = kv,
                              .nlabels = n};
    dsec_err err;
    if (dsec_function_ops.create(fn, &spec, &s->h, &s->bstate, &err) < 0)
        fail_msg("create %s: %s", s->id, err.msg);
    return s;
}

static struct sbx *mk(const char *runtime)
{
    char l[32];
    snprintf(l, sizeof l, "runtime=%s", runtime);
    const char *labels[] = {l, NULL};
    return mk_labels(256, 0, labels);
}

static void rm(struct sbx *s)
{
    dsec_err err;
    assert_int_equal(dsec_function_ops.destroy(fn, s->h, &err), 0);
    dsec_free(s->bstate);
    free(s);
}

struct call {
    const char *argv[16];
    const char *stdin_data;
    size_t stdin_len;
    const char *env[8]; /* "K=V" */
    const char *cwd;
    const char *user;
    uint64_t timeout_ms;
    size_t output_max;
};

static int run(struct sbx *s, const struct call *c, dsec_exec_result *r, dsec_err *err)
{
    size_t argc = 0;
    while (c->argv[argc])
        argc++;
    dsec_backend_kv env[8];
    char ebuf[8][256];
    size_t ne = 0;
    for (; ne < 8 && c->env[ne]; ne++) {
        snprintf(ebuf[ne], sizeof ebuf[ne], "%s", c->env[ne]);
        char *eq = strchr(ebuf[ne], '=');
        if (eq)
            *eq = '\0';
        env[ne] = (dsec_backend_kv){ebuf[ne], eq ? eq + 1 : ""};
    }
    dsec_exec_req req = {.argv = c->argv,
                         .argc = argc,
                         .env = env,
                         .nenv = ne,
                         .cwd = c->cwd,
                         .user = c->user,
                         .stdin_data = (const uint8_t *)c->stdin_data,
                         .stdin_len = c->stdin_len,
                         .timeout_ms = c->timeout_ms ? c->timeout_ms : 10000,
                         .output_max = c->output_max};
    memset(r, 0, sizeof *r);
    dsec_err_clear(err);
    return dsec_function_ops.exec(fn, s->h, &req, r, err);
}

/* Run and expect success; the result is the caller's. */
static void ok(struct sbx *s, const struct call *c, dsec_exec_result *r)
{
    dsec_err err;
    if (run(s, c, r, &err) < 0)
        fail_msg("exec %s: %s (%s)", c->argv[0], err.msg, dsec_code_name(err.code));
}

static char *out_str(const dsec_exec_result *r)
{
    static _Thread_local char buf[1 << 16]; /* the concurrent-calls test runs 24 threads */
    size_t n = r->stdout_len < sizeof buf - 1 ? r->stdout_len : sizeof buf - 1;
    memcpy(buf, r->stdout_data ? (const char *)r->stdout_data : "", n);
    buf[n] = '\0';
    return buf;
}

static char *err_str(const dsec_exec_result *r)
{
    static _Thread_local char buf[1 << 16]; /* the concurrent-calls test runs 24 threads */
    size_t n = r->stderr_len < sizeof buf - 1 ? r->stderr_len : sizeof buf - 1;
    memcpy(buf, r->stderr_data ? (const char *)r->stderr_data : "", n);
    buf[n] = '\0';
    return buf;
}

/* Run python3 -c code in s; expect exit 0 and return stdout. */
static char *py(struct sbx *s, const char *code)
{
    struct call c = {.argv = {"python3", "-c", code}};
    dsec_exec_result r;
    ok(s, &c, &r);
    if (r.exit_code != 0)
        fail_msg("python3 -c %s: exit %d signal %d\nstderr: %s", code, r.exit_code, r.signal,
                 err_str(&r));
    char *o = out_str(&r);
    dsec_exec_result_release(&r);
    return o;
}

static void put(struct sbx *s, const char *path, const char *data, uint32_t mode)
{
    dsec_err err;
    if (dsec_function_ops.file_write(fn, s->h, path, data, strlen(data), mode, false, &err) < 0)
        fail_msg("file_write %s: %s", path, err.msg);
}

/* Host processes whose uid is one of the backend's call uids and whose
 * command line contains needle. */
static int host_procs(const char *needle)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char p[300], buf[4096];
        struct stat st;
        snprintf(p, sizeof p, "/proc/%s", e->d_name);
        if (stat(p, &st) < 0 || st.st_uid < UID_BASE || st.st_uid >= UID_BASE + MAX_WORKERS)
            continue;
        snprintf(p, sizeof p, "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(p, "r");
        if (f == NULL)
            continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        for (size_t i = 0; i < len; i++)
            if (buf[i] == '\0')
                buf[i] = ' ';
        buf[len] = '\0';
        if (strstr(buf, needle) != NULL)
            n++;
    }
    closedir(d);
    return n;
}

/* ======================================================================= runtimes */

static void python_runs_code_with_args_and_exit_codes(void **state)
{
    struct sbx *s = mk("python3");
    dsec_exec_result r;
    struct call c = {.argv = {"python3", "-c",
                              "import sys, os\n"
                              "print(sys.argv, __name__, os.getcwd())\n"
                              "print(sorted(k for k in globals() if not k.startswith('__')))\n"
                              "sys.exit(3)",
                              "a", "b c"}};
    ok(s, &c, &r);
    assert_int_equal(r.exit_code, 3);
    assert_int_equal(r.signal, 0);
    assert_false(r.timed_out);
    assert_string_equal(out_str(&r), "['-c', 'a', 'b c'] __main__ /work\n['os', 'sys']\n");
    assert_true(r.duration_us > 0);
    assert_true(r.peak_rss_kb > 1000); /* an interpreter's worth */
    dsec_exec_result_release(&r);

    /* an uncaught exception: python's traceback (no launcher frames), exit 1 */
    struct call boom = {.argv = {"python3", "-c", "x = 1\nraise ValueError('boom')"}};
    ok(s, &boom, &r);
    assert_int_equal(r.exit_code, 1);
    assert_string_equal(err_str(&r), "Traceback (most recent call last):\n"
                                     "  File \"<string>\", line 2, in <module>\n"
                                     "ValueError: boom\n");
    dsec_exec_result_release(&r);

    /* SystemExit with a message: printed, exit 1 */
    struct call msg = {.argv = {"python3", "-c", "raise SystemExit('bye')"}};
    ok(s, &msg, &r);
    assert_int_equal(r.exit_code, 1);
    assert_string_equal(err_str(&r), "bye\n");
    dsec_exec_result_release(&r);

    /* a syntax error is the call's error, not the backend's */
    struct call syn = {.argv = {"python3", "-c", "def ("}};
    ok(s, &syn, &r);
    assert_int_equal(r.exit_code, 1);
    assert_non_null(strstr(err_str(&r), "SyntaxError"));
    dsec_exec_result_release(&r);

    /* a signal: the call's process kills itself */
    struct call sig = {
        .argv = {"python3", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"}};
    ok(s, &sig, &r);
    assert_int_equal(r.exit_code, -1);
    assert_int_equal(r.signal, SIGTERM);
    dsec_exec_result_release(&r);

    /* atexit handlers and non-daemon threads run before the end */
    assert_string_equal(
        py(s, "import atexit, threading, time\n"
              "atexit.register(lambda: print('atexit'))\n"
              "t = threading.Thread(target=lambda: (time.sleep(0.05), print('thread')))\n"
              "t.start()\nprint('main')"),
        "main\nthread\natexit\n");
    /* preloaded modules are there, others import normally */
    assert_string_equal(py(s, "import sys; print('json' in sys.modules, sys.executable)\n"
                              "import xml.dom.minidom; print('ok')"),
                        "True /usr/bin/python3\nok\n");
    rm(s);
}

static void python_stdin_scripts_modules_and_call(void **state)
{
    struct sbx *s = mk("python3");
    dsec_exec_result r;
    struct call up = {
        .argv = {"python3", "-c", "import sys; print(sys.stdin.read().upper(), end='')"},
        .stdin_data = "hello\nworld\n",
        .stdin_len = 12};
    ok(s, &up, &r);
    assert_string_equal(out_str(&r), "HELLO\nWORLD\n");
    dsec_exec_result_release(&r);

    /* the code itself on stdin, both spellings */
    struct call stdin_code = {.argv = {"python3"}, .stdin_data = "print(6 * 7)\n", .stdin_len = 13};
    ok(s, &stdin_code, &r);
    assert_string_equal(out_str(&r), "42\n");
    dsec_exec_result_release(&r);
    struct call dash = {.argv = {"python3", "-", "x"},
                        .stdin_data = "import sys; print(sys.argv)",
                        .stdin_len = 27};
    ok(s, &dash, &r);
    assert_string_equal(out_str(&r), "['-', 'x']\n");
    dsec_exec_result_release(&r);

    /* a megabyte through stdin and back: the pipes do not deadlock */
    size_t big = 1u << 20;
    char *data = malloc(big);
    for (size_t i = 0; i < big; i++)
        data[i] = (char)('a' + i % 26);
    struct call echo = {.argv = {"python3", "-c", "import sys; sys.stdout.write(sys.stdin.read())"},
                        .stdin_data = data,
                        .stdin_len = big,
                        .output_max = 2u << 20};
    ok(s, &echo, &r);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.stdout_len, big);
    assert_memory_equal(r.stdout_data, data, big);
    dsec_exec_result_release(&r);
    free(data);

    /* scripts and packages from the sandbox's files */
    put(s, "/work/pkg/__init__.py", "", 0);
    put(s, "/work/pkg/mod.py",
        "def hello(n):\n    return 'hello ' + n\n"
        "if __name__ == '__main__':\n    import sys; print(hello(sys.argv[1]))\n",
        0);
    put(s, "/work/main.py", "import sys, pkg.mod\nprint(__file__, pkg.mod.hello(sys.argv[1]))\n",
        0644);
    struct call script = {.argv = {"python3", "main.py", "you"}};
    ok(s, &script, &r);
    assert_string_equal(out_str(&r), "main.py hello you\n");
    dsec_exec_result_release(&r);
    struct call absolute = {.argv = {"python3", "-B", "/work/main.py", "me"}, .cwd = "/tmp"};
    ok(s, &absolute, &r);
    assert_string_equal(out_str(&r), "/work/main.py hello me\n");
    dsec_exec_result_release(&r);
    struct call module = {.argv = {"python3", "-m", "pkg.mod", "there"}};
    ok(s, &module, &r);
    assert_string_equal(out_str(&r), "hello there\n");
    dsec_exec_result_release(&r);
    struct call missing = {.argv = {"python3", "/work/nope.py"}};
    ok(s, &missing, &r);
    assert_int_equal(r.exit_code, 2);
    assert_non_null(strstr(err_str(&r), "can't open file '/work/nope.py'"));
    dsec_exec_result_release(&r);

    /* --call: the return value as JSON on stdout, prints on stderr */
    struct call fcall = {
        .argv = {"python3", "--call", "add", "-c",
                 "def add(a, b):\n    print('adding')\n    return {'sum': a + b, 'xs': [a, b]}",
                 "2", "3.5"}};
    ok(s, &fcall, &r);
    assert_int_equal(r.exit_code, 0);
    assert_string_equal(out_str(&r), "{\"sum\": 5.5, \"xs\": [2, 3.5]}\n");
    assert_string_equal(err_str(&r), "adding\n");
    dsec_exec_result_release(&r);
    put(s, "/work/handler.py", "def handle(event):\n    return event['name'].title()\n", 0);
    struct call fscript = {
        .argv = {"python3", "--call", "handle", "handler.py", "{\"name\": \"ada lovelace\"}"}};
    ok(s, &fscript, &r);
    assert_string_equal(out_str(&r), "\"Ada Lovelace\"\n");
    dsec_exec_result_release(&r);
    struct call badjson = {.argv = {"python3", "--call", "handle", "handler.py", "{oops"}};
    ok(s, &badjson, &r);
    assert_int_equal(r.exit_code, 1);
    assert_non_null(strstr(err_str(&r), "argument 1 is not JSON"));
    dsec_exec_result_release(&r);
    rm(s);
}

static void sh_runs_scripts_pipes_and_stdin(void **state)
{
    struct sbx *s = mk("sh");
    dsec_exec_result r;
    struct call c = {.argv = {"sh", "-c",
                              "echo \"$0 $1\"; echo oops >&2; read x; echo \"got $x\"; "
                              "seq 1 5 | tr -d '\\n'; echo; exit 4",
                              "zero", "one"},
                     .stdin_data = "line\n",
                     .stdin_len = 5};
    ok(s, &c, &r);
    assert_int_equal(r.exit_code, 4);
    assert_string_equal(out_str(&r), "zero one\ngot line\n12345\n");
    assert_string_equal(err_str(&r), "oops\n");
    dsec_exec_result_release(&r);
    /* a shell script from the sandbox's files, executable bit kept */
    put(s, "/work/run.sh", "#!/bin/sh\necho \"script $*\"\n", 0755);
    struct call script = {.argv = {"./run.sh", "x", "y"}};
    ok(s, &script, &r);
    assert_string_equal(out_str(&r), "script x y\n");
    dsec_exec_result_release(&r);
    /* not found: like a shell, 127 */
    struct call nope = {.argv = {"no-such-program"}};
    ok(s, &nope, &r);
    assert_int_equal(r.exit_code, 127);
    assert_string_equal(err_str(&r), "dsec: no-such-program: No such file or directory\n");
    dsec_exec_result_release(&r);
    rm(s);
}

static void native_runs_an_uploaded_binary(void **state)
{
    char dir[] = "/tmp/dsec-fnnative-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char src[128], bin[128], cmd[512];
    snprintf(src, sizeof src, "%s/prog.c", dir);
    snprintf(bin, sizeof bin, "%s/prog", dir);
    FILE *f = fopen(src, "w");
    assert_non_null(f);
    fputs("#include <stdio.h>\n#include <unistd.h>\n"
          "int main(int argc, char **argv) {\n"
          "  printf(\"native %s uid=%d\\n\", argc > 1 ? argv[1] : \"-\", (int)getuid());\n"
          "  return 7;\n}\n",
          f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "cc -O1 -o %s %s 2>/dev/null", bin, src);
    if (system(cmd) != 0) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0) /* best effort: a temp dir left behind */
            fprintf(stderr, "could not remove %s\n", dir);
        skip();
    }
    f = fopen(bin, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc((size_t)len);
    assert_int_equal(fread(data, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);

    struct sbx *s = mk("native");
    dsec_err err;
    assert_int_equal(dsec_function_ops.file_write(fn, s->h, "/work/bin/prog", data, (size_t)len,
                                                  0755, false, &err),
                     0);
    free(data);
    dsec_exec_result r;
    struct call c = {.argv = {"/work/bin/prog", "hi"}};
    ok(s, &c, &r);
    assert_int_equal(r.exit_code, 7);
    char want[64];
    snprintf(want, sizeof want, "native hi uid=");
    assert_memory_equal(out_str(&r), want, strlen(want));
    assert_int_not_equal(atoi(out_str(&r) + strlen(want)), 0); /* not root */
    dsec_exec_result_release(&r);
    /* a host program by PATH */
    struct call ls = {.argv = {"ls", "/work/bin"}};
    ok(s, &ls, &r);
    assert_string_equal(out_str(&r), "prog\n");
    dsec_exec_result_release(&r);
    rm(s);
}

static void big_code_and_big_files(void **state)
{
    const char *lab[] = {"runtime=python3", NULL};
    struct sbx *s = mk_labels(256, 16, lab);
    /* code larger than a message: it travels in a sealed memfd */
    size_t n = 300000;
    char *code = malloc(n + 64);
    int k = snprintf(code, n + 64, "x = '");
    memset(code + k, 'a', n);
    snprintf(code + k + n, 64, "'\nprint(len(x))");
    struct call big = {.argv = {"python3", "-c", code, "arg"}};
    dsec_exec_result r;
    ok(s, &big, &r);
    assert_int_equal(r.exit_code, 0);
    assert_string_equal(out_str(&r), "300000\n");
    dsec_exec_result_release(&r);
    free(code);
    /* a few megabytes of dependency files, binary included */
    size_t blen = 3u << 20;
    unsigned char *blob = malloc(blen);
    for (size_t i = 0; i < blen; i++)
        blob[i] = (unsigned char)(i * 131 + 7);
    dsec_err err;
    assert_int_equal(
        dsec_function_ops.file_write(fn, s->h, "/work/data/blob.bin", blob, blen, 0, false, &err),
        0);
    for (int i = 0; i < 50; i++) {
        char p[64], d[32];
        snprintf(p, sizeof p, "/work/many/f%02d.txt", i);
        snprintf(d, sizeof d, "%d\n", i);
        put(s, p, d, 0);
    }
    assert_string_equal(
        py(s, "import hashlib, os\n"
              "b = open('/work/data/blob.bin', 'rb').read()\n"
              "print(len(b), b[:3].hex(), b[-1])\n"
              "print(sum(int(open('/work/many/' + f).read()) for f in os.listdir('/work/many')))"),
        "3145728 078a0d 132\n1225\n");
    free(blob);
    /* os._exit skips the launcher's ending: the supervisor's report still answers */
    struct call quick = {
        .argv = {"python3", "-c", "import os; print('x', flush=True); os._exit(9)"}};
    ok(s, &quick, &r);
    assert_int_equal(r.exit_code, 9);
    assert_string_equal(out_str(&r), "x\n");
    dsec_exec_result_release(&r);
    rm(s);
}

/* ======================================================================= isolation */

static void nothing_leaks_between_calls(void **state)
{
    struct sbx *s = mk("python3");
    put(s, "/work/dep.txt", "pristine\n", 0);
    /* call 1 changes everything it can reach */
    dsec_exec_result r;
    struct call dirty = {.argv = {"python3", "-c",
                                  "import os\n"
                                  "open('/work/dep.txt', 'w').write('changed\\n')\n"
                                  "open('/work/new.txt', 'w').write('new\\n')\n"
                                  "open('/tmp/t.txt', 'w').write('tmp\\n')\n"
                                  "os.mkdir('/tmp/d')\n"
                                  "os.environ['LEAK'] = '1'\n"
                                  "import json; json.LEAKED = True\n"
                                  "print(os.environ['SECRET'])"},
                         .env = {"SECRET=s3cret"}};
    ok(s, &dirty, &r);
    assert_int_equal(r.exit_code, 0);
    assert_string_equal(out_str(&r), "s3cret\n");
    dsec_exec_result_release(&r);
    /* call 2 sees none of it */
    assert_string_equal(
        py(s, "import os, json\n"
              "print(open('/work/dep.txt').read(), end='')\n"
              "print(sorted(os.listdir('/work')), sorted(os.listdir('/tmp')))\n"
              "print(os.environ.get('SECRET'), os.environ.get('LEAK'), hasattr(json, 'LEAKED'))"),
        "pristine\n['dep.txt'] []\nNone None False\n");
    /* and the sandbox's own copy is untouched */
    dsec_file_data d = {0};
    dsec_err err;
    assert_int_equal(dsec_function_ops.file_read(fn, s->h, "/work/dep.txt", 0, 0, &d, &err), 0);
    assert_int_equal(d.len, 9);
    assert_memory_equal(d.data, "pristine\n", 9);
    dsec_free(d.data);
    /* the environment is exactly the defaults plus what the call passes */
    assert_string_equal(py(s, "import os; print(sorted(os.environ))"),
                        "['HOME', 'LANG', 'PATH', 'TMPDIR']\n");
    rm(s);
}

static void processes_do_not_outlive_their_call(void **state)
{
    struct sbx *s = mk("sh");
    dsec_exec_result r;
    /* a background process and a detached grandchild, both left running */
    struct call bg = {.argv = {"sh", "-c", "sleep 313 & (setsid sleep 314 &) ; echo started"}};
    ok(s, &bg, &r);
    assert_string_equal(out_str(&r), "started\n");
    dsec_exec_result_release(&r);
    int left = -1;
    for (int i = 0; i < 100 && left != 0; i++) {
        left = host_procs("sleep 31");
        if (left)
            msleep(20);
    }
    assert_int_equal(left, 0);
    /* the next call sees only its own processes: pid 1 (hidden) and itself */
    struct call ps = {.argv = {"sh", "-c", "cd /proc && echo [0-9]*"}};
    ok(s, &ps, &r);
    assert_string_equal(out_str(&r), "2\n");
    dsec_exec_result_release(&r);
    rm(s);
}

static void calls_are_confined(void **state)
{
    /* a listener on the host's loopback the call must not reach */
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(l, 1), 0);
    socklen_t al = sizeof a;
    getsockname(l, (struct sockaddr *)&a, &al);
    char code[2048];
    snprintf(code, sizeof code,
             "import os, socket, ctypes\n"
             "print(os.getuid() != 0, os.getgid() != 0, socket.gethostname())\n"
             "s = socket.socket()\n"
             "try:\n"
             "    s.connect(('127.0.0.1', %d)); print('connected')\n"
             "except OSError as e:\n"
             "    print('refused', e.errno)\n"
             "print([os.path.exists(p) for p in ('/sys/kernel', '/root', '/home', '/work/main', "
             "'/var')])\n"
             "libc = ctypes.CDLL(None, use_errno=True)\n"
             "print(libc.unshare(0x20000), ctypes.get_errno() == 1)\n"
             "print(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno() == 1)\n"
             "try:\n"
             "    open('/usr/bin/x', 'w')\n"
             "except OSError as e:\n"
             "    print('ro', e.errno)\n"
             "print(open('/proc/self/cgroup').read().strip().split(':')[-1])\n"
             "print(sorted(os.listdir('/dev')))",
             ntohs(a.sin_port));
    struct sbx *s = mk("python3");
    assert_string_equal(py(s, code),
                        "True True sandbox\n"
                        "refused 111\n"
                        "[False, False, False, False, False]\n"
                        "-1 True\n"
                        "-1 True\n"
                        "ro 30\n"
                        "/\n"
                        "['fd', 'full', 'null', 'random', 'shm', 'stderr', 'stdin', 'stdout', "
                        "'urandom', 'zero']\n");
    close(l);
    rm(s);
}

/* A call holds no channel to the backend. The python3 call process used to
 * keep its worker's task socket as fd 3, and a frame written there replaced
 * the call's real answer: a WORKER_FAILED turned its exit code into a
 * "backend" error carrying the call's own text. Each forgery below goes to
 * every fd the call can name (and its supervisor's, through /proc); the
 * answer must still be the call's real exit code and output. */
static const char forge_code[] =
    "import os, struct, sys, time\n"
    "M = 0x31666e64\n"
    "frames = {\n"
    "  'failed': struct.pack('=4Ii32s512s', M, 6, 564, 0, 0, b'seccomp', b'FORGED by the call'),\n"
    "  'result': struct.pack('=4IiI3Q', M, 8, 48, 0, 0, 0, 1, 1, 1),\n"
    "  'done': struct.pack('=4IiIQ', M, 9, 32, 0, 0, 0, 1),\n"
    "}\n"
    "frame = frames[sys.argv[1]]\n"
    "def open_fds():\n"
    "    fds = []\n"
    "    for n in os.listdir('/proc/self/fd'):\n"
    "        try:\n"
    "            os.readlink('/proc/self/fd/' + n)\n"
    "        except OSError:\n"
    "            continue  # the listing's own, closed by now\n"
    "        fds.append(int(n))\n"
    "    return sorted(fds)\n"
    "fds = open_fds()\n"
    "hit = set()\n"
    "for fd in [0] + list(range(3, 1024)):\n"
    "    try:\n"
    "        os.write(fd, frame); hit.add(fd)\n"
    "    except OSError:\n"
    "        pass\n"
    "for p in ('/proc/1/fd/3', '/proc/1/fd/4', '/proc/self/fd/3'):\n"
    "    try:\n"
    "        with open(p, 'wb', buffering=0) as f:\n"
    "            f.write(frame); hit.add(p)\n"
    "    except OSError:\n"
    "        pass\n"
    "print('fds', fds, 'written', sorted(hit, key=str))\n"
    "sys.stdout.flush()\n"
    "# end the output early: a forged DONE or RESULT is then all the backend waits for\n"
    "os.close(1); os.close(2)\n"
    "time.sleep(0.3)\n"
    "os._exit(7)\n";

static void a_call_cannot_forge_its_result(void **state)
{
    struct sbx *s = mk("python3");
    static const char *const kinds[] = {"failed", "result", "done"};
    char wrong[2048] = "";
    size_t used = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        struct call c = {.argv = {"python3", "-c", forge_code, kinds[i]}};
        dsec_exec_result r;
        dsec_err err;
        char got[600];
        if (run(s, &c, &r, &err) < 0) {
            snprintf(got, sizeof got, "error %s: %.500s", dsec_code_name(err.code), err.msg);
        } else {
            snprintf(got, sizeof got, "exit %d signal %d stdout \"%.200s\"", r.exit_code, r.signal,
                     out_str(&r));
            int right = r.exit_code == 7 && r.signal == 0 &&
                        strcmp(out_str(&r), "fds [0, 1, 2] written []\n") == 0;
            dsec_exec_result_release(&r);
            if (right)
                continue;
        }
        int w = snprintf(wrong + used, sizeof wrong - used, "\n  forged %s: %.600s", kinds[i], got);
        if (w > 0 && (size_t)w < sizeof wrong - used)
            used += (size_t)w;
    }
    if (used > 0)
        fail_msg("a call's forged frames changed its answer (want exit 7, fds [0, 1, 2], nothing "
                 "written):%s",
                 wrong);

    /* executed programs (sh, native: one zygote program) hold only their stdio either */
    struct sbx *sh = mk("sh");
    struct call c = {.argv = {"sh", "-c",
                              "for f in /proc/$$/fd/*; do [ -e \"$f\" ] && echo -n \"${f##*/} \"; "
                              "done; printf 'x' >&3 2>/dev/null; echo $?"}};
    dsec_exec_result r;
    ok(sh, &c, &r);
    assert_int_equal(r.exit_code, 0);
    assert_string_equal(out_str(&r), "0 1 2 2\n");
    dsec_exec_result_release(&r);
    rm(sh);
    rm(s);
}

/* ======================================================================= limits */

struct bg_call {
    struct sbx *s;
    const char *code;
    dsec_exec_result r;
    int rc;
};

static void *bg_run(void *arg)
{
    struct bg_call *b = arg;
    struct call c = {.argv = {"python3", "-c", b->code}};
    dsec_err err;
    b->rc = run(b->s, &c, &b->r, &err);
    return NULL;
}

static void limits_cpu_memory_output_files(void **state)
{
    /* CPU: cpu_ms of all the call's processes */
    const char *cpu_label[] = {"cpu_ms=300", NULL};
    struct sbx *s = mk_labels(256, 0, cpu_label);
    dsec_exec_result r;
    uint64_t t0 = now_ms();
    struct call spin = {.argv = {"python3", "-c", "while True: pass"}};
    ok(s, &spin, &r);
    assert_int_equal(r.exit_code, -1);
    assert_int_equal(r.signal, SIGXCPU);
    assert_false(r.timed_out);
    assert_true(r.cpu_us >= 300000);
    assert_true(now_ms() - t0 < 3000);
    dsec_exec_result_release(&r);
    /* a call may lower it further, never raise it */
    struct call lower = {.argv = {"python3", "-c", "while True: pass"},
                         .env = {"DSEC_LIMIT_CPU_MS=100"}};
    ok(s, &lower, &r);
    assert_int_equal(r.signal, SIGXCPU);
    assert_true(r.cpu_us < 280000);
    dsec_exec_result_release(&r);
    dsec_err err;
    struct call raise = {.argv = {"true"}, .env = {"DSEC_LIMIT_CPU_MS=900"}};
    assert_int_equal(run(s, &raise, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "only lower"));
    rm(s);

    /* memory: the call is OOM-killed alone; a neighbour and the next call are fine */
    struct sbx *small = mk_labels(64, 0, NULL);
    struct sbx *other = mk("python3");
    struct bg_call nb = {.s = other, .code = "import time; time.sleep(0.5); print('fine')"};
    pthread_t th;
    pthread_create(&th, NULL, bg_run, &nb);
    struct call hog = {.argv = {"python3", "-c",
                                "b = []\n"
                                "for i in range(100):\n"
                                "    b.append(bytearray(8 << 20))\n"
                                "print('survived')"}};
    ok(small, &hog, &r);
    assert_int_equal(r.exit_code, -1);
    assert_int_equal(r.signal, SIGKILL);
    assert_false(r.timed_out);
    assert_string_equal(out_str(&r), "");
    dsec_exec_result_release(&r);
    pthread_join(th, NULL);
    assert_int_equal(nb.rc, 0);
    assert_string_equal(out_str(&nb.r), "fine\n");
    dsec_exec_result_release(&nb.r);
    assert_string_equal(py(small, "print('next')"), "next\n");
    /* within the limit, peak memory is reported */
    struct call fit = {
        .argv = {"python3", "-c", "b = bytearray(30 << 20); b[::4096] = b'x' * len(b[::4096])"}};
    ok(small, &fit, &r);
    assert_int_equal(r.exit_code, 0);
    assert_true(r.peak_rss_kb > 30 * 1024);
    dsec_exec_result_release(&r);
    rm(small);
    rm(other);

    /* output: capped per stream, flagged, the call still ends normally */
    s = mk("sh");
    struct call loud = {
        .argv = {"sh", "-c", "yes 0123456789 | head -c 300000; yes e | head -c 5000 >&2"},
        .output_max = 1000};
    ok(s, &loud, &r);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.stdout_len, 1000);
    assert_true(r.stdout_truncated);
    assert_int_equal(r.stderr_len, 1000);
    assert_true(r.stderr_truncated);
    assert_memory_equal(r.stdout_data, "0123456789\n0123456789\n", 22);
    dsec_exec_result_release(&r);
    struct call env_cap = {.argv = {"sh", "-c", "yes | head -c 100"},
                           .env = {"DSEC_LIMIT_OUTPUT_BYTES=10"}};
    ok(s, &env_cap, &r);
    assert_int_equal(r.stdout_len, 10);
    assert_true(r.stdout_truncated);
    dsec_exec_result_release(&r);
    rm(s);

    /* processes and file size */
    const char *lim[] = {"nproc=8", "fsize_mb=1", NULL};
    s = mk_labels(256, 0, lim);
    assert_string_equal(py(s, "import os, time\n"
                              "n = 0\n"
                              "try:\n"
                              "    while n < 64:\n"
                              "        if os.fork() == 0:\n"
                              "            time.sleep(5); os._exit(0)\n"
                              "        n += 1\n"
                              "except OSError as e:\n"
                              "    print(n <= 8, e.errno)\n"),
                        "True 11\n");
    assert_string_equal(py(s, "try:\n"
                              "    open('/tmp/big', 'wb').write(b'x' * (2 << 20))\n"
                              "except OSError as e:\n"
                              "    print('too big', e.errno)\n"),
                        "too big 27\n");
    rm(s);
}

static void timeouts_kill_the_whole_call(void **state)
{
    struct sbx *s = mk("python3");
    dsec_exec_result r;
    uint64_t t0 = now_ms();
    struct call nap = {
        .argv = {"python3", "-c", "import time; print('start', flush=True); time.sleep(30)"},
        .timeout_ms = 300};
    ok(s, &nap, &r);
    uint64_t took = now_ms() - t0;
    assert_true(r.timed_out);
    assert_int_equal(r.signal, SIGKILL);
    assert_int_equal(r.exit_code, -1);
    assert_string_equal(out_str(&r), "start\n"); /* output up to the kill is kept */
    assert_true(took >= 300 && took < 2000);
    dsec_exec_result_release(&r);
    /* a sandbox's timeout_ms label applies when the exec names none */
    const char *lab[] = {"runtime=sh", "timeout_ms=200", NULL};
    struct sbx *sh = mk_labels(256, 0, lab);
    struct call tree = {.argv = {"sh", "-c", "sleep 333 & sleep 334 & sleep 335"}, .timeout_ms = 0};
    dsec_err err;
    memset(&r, 0, sizeof r);
    size_t argc = 3;
    dsec_exec_req req = {.argv = tree.argv, .argc = argc};
    assert_int_equal(dsec_function_ops.exec(fn, sh->h, &req, &r, &err), 0);
    assert_true(r.timed_out);
    dsec_exec_result_release(&r);
    int left = -1;
    for (int i = 0; i < 100 && left != 0; i++) {
        left = host_procs("sleep 33");
        if (left)
            msleep(20);
    }
    assert_int_equal(left, 0);
    /* and the pool keeps serving */
    assert_string_equal(py(s, "print('after')"), "after\n");
    rm(sh);
    rm(s);
}

/* ======================================================================= the pool */

static void a_killed_zygote_is_replaced(void **state)
{
    dsec_function_pool_info info;
    dsec_err err;
    struct sbx *s = mk("python3");
    assert_string_equal(py(s, "print(1)"), "1\n");
    assert_int_equal(dsec_function_pool_info_get(fn, "python3", &info, &err), 0);
    pid_t old = info.zygote_pid;
    unsigned starts = info.zygote_starts;
    assert_true(old > 0);
    assert_string_equal(info.state, "up");
    assert_int_equal(kill(old, SIGKILL), 0);
    /* calls keep working throughout: warm workers outlive their zygote */
    for (int i = 0; i < 3; i++)
        assert_string_equal(py(s, "print('during')"), "during\n");
    uint64_t deadline = now_ms() + 10000;
    do {
        msleep(20);
        assert_int_equal(dsec_function_pool_info_get(fn, "python3", &info, &err), 0);
    } while ((info.zygote_pid == old || info.zygote_pid == 0 || strcmp(info.state, "up") != 0) &&
             now_ms() < deadline);
    assert_string_equal(info.state, "up");
    assert_int_not_equal(info.zygote_pid, old);
    assert_int_equal(info.zygote_starts, starts + 1);
    assert_non_null(strstr(info.zygote_exit, "killed by signal 9"));
    /* more calls than there were warm workers: the new zygote serves them */
    for (int i = 0; i < 12; i++)
        assert_string_equal(py(s, "print('after')"), "after\n");
    rm(s);
}

struct conc {
    int idx;
    int failures;
    char why[DSEC_ERR_MSG_MAX];
};

static void *conc_worker(void *arg)
{
    struct conc *c = arg;
    struct sbx *s = mk(c->idx % 3 == 2 ? "sh" : "python3");
    for (int i = 0; i < 6; i++) {
        char code[128], want[64];
        int v = c->idx * 100 + i;
        struct call call;
        memset(&call, 0, sizeof call);
        if (c->idx % 3 == 2) {
            snprintf(code, sizeof code, "echo $((%d * %d))", v, v);
            call.argv[0] = "sh";
            call.argv[1] = "-c";
            call.argv[2] = code;
        } else {
            snprintf(code, sizeof code, "print(%d * %d)", v, v);
            call.argv[0] = "python3";
            call.argv[1] = "-c";
            call.argv[2] = code;
        }
        snprintf(want, sizeof want, "%d\n", v * v);
        dsec_exec_result r;
        dsec_err err;
        if (run(s, &call, &r, &err) < 0) {
            c->failures++;
            snprintf(c->why, sizeof c->why, "%s", err.msg);
            continue;
        }
        if (r.exit_code != 0 || strcmp(out_str(&r), want) != 0) {
            c->failures++;
            snprintf(c->why, sizeof c->why, "exit %d out %.40s err %.80s", r.exit_code, out_str(&r),
                     err_str(&r));
        }
        dsec_exec_result_release(&r);
    }
    dsec_err err;
    if (dsec_function_ops.destroy(fn, s->h, &err) < 0)
        c->failures++;
    dsec_free(s->bstate);
    free(s);
    return NULL;
}

static void many_concurrent_calls(void **state)
{
    enum { N = 24 };
    pthread_t th[N];
    struct conc c[N];
    for (int i = 0; i < N; i++) {
        c[i] = (struct conc){.idx = i};
        pthread_create(&th[i], NULL, conc_worker, &c[i]);
    }
    int failures = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        if (c[i].failures)
            fprintf(stderr, "thread %d: %d failures, last: %s\n", i, c[i].failures, c[i].why);
        failures += c[i].failures;
    }
    assert_int_equal(failures, 0);
    dsec_function_pool_info info;
    dsec_err err;
    assert_int_equal(dsec_function_pool_info_get(fn, "python3", &info, &err), 0);
    assert_int_equal(info.busy, 0);
}

/* ======================================================================= bad input */

static void expect_invalid(struct sbx *s, const struct call *c, int code, const char *needle)
{
    dsec_exec_result r;
    dsec_err err;
    int rc = run(s, c, &r, &err);
    if (rc == 0) {
        dsec_exec_result_release(&r);
        fail_msg("expected %s containing \"%s\", the call ran", dsec_code_name(code), needle);
    }
    if (err.code != code || strstr(err.msg, needle) == NULL)
        fail_msg("expected %s containing \"%s\", got %s: %s", dsec_code_name(code), needle,
                 dsec_code_name(err.code), err.msg);
}

static void malformed_tasks_get_clear_errors(void **state)
{
    struct sbx *s = mk("python3");
    struct call empty = {.argv = {NULL}};
    expect_invalid(s, &empty, DSEC_E_INVALID, "argv is empty");
    struct call blank = {.argv = {""}};
    expect_invalid(s, &blank, DSEC_E_INVALID, "argv is empty");
    struct call noc = {.argv = {"python3", "-c"}};
    expect_invalid(s, &noc, DSEC_E_INVALID, "-c needs an argument");
    struct call nom = {.argv = {"python3", "-m"}};
    expect_invalid(s, &nom, DSEC_E_INVALID, "-m needs a module name");
    struct call badopt = {.argv = {"python3", "-X", "dev", "-c", "pass"}};
    expect_invalid(s, &badopt, DSEC_E_INVALID, "option -X is not supported");
    struct call longopt = {.argv = {"python3", "--version"}};
    expect_invalid(s, &longopt, DSEC_E_INVALID, "option --version is not supported");
    struct call callm = {.argv = {"python3", "--call", "f", "-m", "x"}};
    expect_invalid(s, &callm, DSEC_E_INVALID, "--call works with");
    struct call callname = {.argv = {"python3", "--call", "1x", "-c", "pass"}};
    expect_invalid(s, &callname, DSEC_E_INVALID, "needs a function name");
    struct call rel = {.argv = {"python3", "-c", "pass"}, .cwd = "work"};
    expect_invalid(s, &rel, DSEC_E_INVALID, "not an absolute path");
    struct call nodir = {.argv = {"python3", "-c", "pass"}, .cwd = "/nonexistent"};
    expect_invalid(s, &nodir, DSEC_E_INVALID, "cannot change directory to /nonexistent");
    struct call user = {.argv = {"python3", "-c", "pass"}, .user = "root"};
    expect_invalid(s, &user, DSEC_E_INVALID, "cannot be chosen");
    struct call badenv = {.argv = {"true"}, .env = {"A=B=C", "=x"}};
    expect_invalid(s, &badenv, DSEC_E_INVALID, "environment variable 1");
    struct call badlim = {.argv = {"true"}, .env = {"DSEC_LIMIT_MEMORY_MB=lots"}};
    expect_invalid(s, &badlim, DSEC_E_INVALID, "DSEC_LIMIT_MEMORY_MB=\"lots\"");
    struct call biglim = {.argv = {"true"}, .env = {"DSEC_LIMIT_MEMORY_MB=100000"}};
    expect_invalid(s, &biglim, DSEC_E_INVALID, "only lower");
    struct call unklim = {.argv = {"true"}, .env = {"DSEC_LIMIT_GPUS=1"}};
    expect_invalid(s, &unklim, DSEC_E_INVALID, "unknown limit DSEC_LIMIT_GPUS");
    /* after all that, the sandbox works */
    assert_string_equal(py(s, "print('still fine')"), "still fine\n");

    /* creates */
    dsec_err err;
    dsec_sandbox *h;
    char *st;
    dsec_backend_kv ruby = {"runtime", "ruby"};
    dsec_sandbox_spec bad = {
        .id = "fntest-bad1", .type = "function", .labels = &ruby, .nlabels = 1};
    assert_int_equal(dsec_function_ops.create(fn, &bad, &h, &st, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "expected python3, sh or native"));
    dsec_backend_kv cpu = {"cpu_ms", "-5"};
    dsec_sandbox_spec bad2 = {
        .id = "fntest-bad2", .type = "function", .labels = &cpu, .nlabels = 1};
    assert_int_equal(dsec_function_ops.create(fn, &bad2, &h, &st, &err), -1);
    assert_non_null(strstr(err.msg, "cpu_ms"));
    /* this backend has no network containment (test_function_net has one) */
    const char *net[] = {"pypi.org"};
    dsec_sandbox_spec withnet = {.id = "fntest-bad3", .type = "function", .net = net, .nnet = 1};
    assert_int_equal(dsec_function_ops.create(fn, &withnet, &h, &st, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "no network containment"));
    dsec_sandbox_spec withenv = {.id = "fntest-bad4", .type = "function", .env = "ubuntu:22.04"};
    assert_int_equal(dsec_function_ops.create(fn, &withenv, &h, &st, &err), -1);
    assert_int_equal(err.code, DSEC_E_UNSUPPORTED);
    dsec_sandbox_spec badid = {.id = "../escape", .type = "function"};
    assert_int_equal(dsec_function_ops.create(fn, &badid, &h, &st, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);

    /* files */
    assert_int_equal(dsec_function_ops.file_write(fn, s->h, "/etc/passwd", "x", 1, 0, false, &err),
                     -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "under /work"));
    assert_int_equal(dsec_function_ops.file_write(fn, s->h, "/work/../x", "x", 1, 0, false, &err),
                     -1);
    assert_non_null(strstr(err.msg, "not normal"));
    assert_int_equal(dsec_function_ops.file_write(fn, s->h, "/work", "x", 1, 0, false, &err), -1);
    dsec_file_data d;
    assert_int_equal(dsec_function_ops.file_read(fn, s->h, "/work/none", 0, 0, &d, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    rm(s);
}

/* ======================================================================= files */

static void files_quota_adopt_and_destroy(void **state)
{
    struct sbx *s = mk_labels(128, 1, NULL); /* disk_mb = 1 */
    dsec_err err;
    put(s, "/work/a/b/c.txt", "one\n", 0600);
    assert_int_equal(
        dsec_function_ops.file_write(fn, s->h, "/work/a/b/c.txt", "two\n", 4, 0, true, &err), 0);
    dsec_file_data d = {0};
    assert_int_equal(dsec_function_ops.file_read(fn, s->h, "/work/a/b/c.txt", 2, 3, &d, &err), 0);
    assert_int_equal(d.len, 3);
    assert_memory_equal(d.data, "e\nt", 3);
    assert_int_equal(d.size, 8);
    assert_false(d.eof);
    dsec_free(d.data);
    dsec_file_entry *e;
    size_t n;
    assert_int_equal(dsec_function_ops.file_list(fn, s->h, "/", &e, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(e[0].name, "work");
    dsec_file_entries_free(e, n);
    assert_int_equal(dsec_function_ops.file_list(fn, s->h, "/work/a/b", &e, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(e[0].name, "c.txt");
    assert_int_equal(e[0].kind, DSEC_FILE_REG);
    assert_int_equal(e[0].size, 8);
    assert_int_equal(e[0].mode, 0600);
    dsec_file_entries_free(e, n);
    /* the call sees the files with their mode */
    assert_string_equal(py(s, "import os; print(open('/work/a/b/c.txt').read(), "
                              "oct(os.stat('/work/a/b/c.txt').st_mode & 0o777))"),
                        "one\ntwo\n 0o600\n");
    /* quota: disk_mb */
    char *big = calloc(1, 2u << 20);
    assert_int_equal(
        dsec_function_ops.file_write(fn, s->h, "/work/big", big, 2u << 20, 0, false, &err), -1);
    assert_int_equal(err.code, DSEC_E_TOO_LARGE);
    assert_non_null(strstr(err.msg, "quota"));
    free(big);
    dsec_sandbox_stats st;
    assert_int_equal(dsec_function_ops.stats(fn, s->h, &st, &err), 0);
    assert_int_equal(st.disk_bytes, 8);
    assert_int_equal(st.nfiles, 1);
    assert_true(st.cpu_used_us > 0);

    /* a node manager restart: detach, adopt from the state, files still there */
    char *bstate = s->bstate;
    dsec_function_ops.detach(fn, s->h);
    dsec_sandbox_spec spec = {.id = s->id, .type = "function"};
    assert_int_equal(dsec_function_ops.adopt(fn, &spec, bstate, &s->h, &err), 0);
    assert_string_equal(py(s, "print(open('/work/a/b/c.txt').read(), end='')"), "one\ntwo\n");
    assert_int_equal(
        dsec_function_ops.adopt(fn, &spec, "fn1;garbage", &(dsec_sandbox *){NULL}, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    char dir[256];
    snprintf(dir, sizeof dir, "%s/sandboxes/%s", state_dir, s->id);
    struct stat sst;
    assert_int_equal(stat(dir, &sst), 0);
    rm(s);
    assert_int_equal(stat(dir, &sst), -1); /* destroy removed them */
}

static void a_runtime_that_cannot_start_fails_clearly(void **state)
{
    /* an interpreter that exits at once, and a module that is not one */
    char dir[] = "/tmp/dsec-fnbad-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char mod[128];
    snprintf(mod, sizeof mod, "%s/_dsec_fnz.so", dir);
    FILE *f = fopen(mod, "w");
    fputs("not an ELF file\n", f);
    fclose(f);
    const struct {
        const char *key, *value, *want;
    } cases[] = {
        {"python", "/bin/false", "exited with status 1 during start-up"},
        {"python_module", mod, "cannot load"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        void *bad;
        dsec_err err;
        dsec_backend_kv opts[] = {{cases[i].key, cases[i].value},
                                  {"pool_python3", "1"},
                                  {"hot_python3", "0"},
                                  {"max_workers", "8"}};
        dsec_backend_config cfg = {.node = "fnbad", .opts = opts, .nopts = 4};
        assert_int_equal(dsec_function_ops.init(&bad, &cfg, &err), 0);
        dsec_sandbox *h;
        char *st;
        dsec_sandbox_spec spec = {.id = "fnbad-1", .type = "function"};
        uint64_t t0 = now_ms();
        assert_int_equal(dsec_function_ops.create(bad, &spec, &h, &st, &err), -1);
        assert_true(now_ms() - t0 < 10000);
        if (strstr(err.msg, cases[i].want) == NULL)
            fail_msg("%s=%s: expected \"%s\" in: %s", cases[i].key, cases[i].value, cases[i].want,
                     err.msg);
        dsec_function_ops.fini(bad);
    }
    /* a second backend whose uids overlap the live one's is refused, naming both
     * ranges; one next to it starts */
    {
        void *other = NULL;
        dsec_err e2;
        char base[16];
        snprintf(base, sizeof base, "%u", UID_BASE + MAX_WORKERS - 1);
        dsec_backend_kv o2[] = {{"uid_base", base},   {"max_workers", "4"}, {"pool_python3", "0"},
                                {"hot_python3", "0"}, {"pool_sh", "0"},     {"pool_native", "0"}};
        dsec_backend_config c2 = {.node = "fnuid", .opts = o2, .nopts = 6};
        assert_int_equal(dsec_function_ops.init(&other, &c2, &e2), -1);
        assert_int_equal(e2.code, DSEC_E_CONFIG);
        char want[160];
        snprintf(want, sizeof want, "uids %u..%u (uid_base + max_workers) overlap uids %u..%u",
                 UID_BASE + MAX_WORKERS - 1, UID_BASE + MAX_WORKERS + 2, UID_BASE,
                 UID_BASE + MAX_WORKERS - 1);
        if (strstr(e2.msg, want) == NULL)
            fail_msg("expected \"%s\" in: %s", want, e2.msg);
        snprintf(base, sizeof base, "%u", UID_BASE + MAX_WORKERS);
        assert_int_equal(dsec_function_ops.init(&other, &c2, &e2), 0);
        dsec_function_ops.fini(other);
    }
    /* and an unknown option of ours is refused */
    void *bad;
    dsec_err err;
    dsec_backend_kv opt = {"function.pool_size", "4"};
    dsec_backend_config cfg = {.node = "fnbad", .opts = &opt, .nopts = 1};
    assert_int_equal(dsec_function_ops.init(&bad, &cfg, &err), -1);
    assert_int_equal(err.code, DSEC_E_CONFIG);
    assert_non_null(strstr(err.msg, "unknown function option function.pool_size"));
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* Two cells on one host: their function nodes, neither given a uid_base,
 * each get a range of uids of their own (the second used to fail to start:
 * the first held the default range). A backend given a taken range is
 * refused with what to set. */
static void two_backends_on_one_host_get_their_own_uids(void **state)
{
    void *b[2] = {NULL, NULL};
    uint32_t first[2];
    unsigned count[2];
    char dir[2][64];
    dsec_err err;
    for (int i = 0; i < 2; i++) {
        snprintf(dir[i], sizeof dir[i], "/tmp/dsec-fnuid-XXXXXX");
        assert_non_null(mkdtemp(dir[i]));
        dsec_backend_kv o[] = {{"max_workers", "4"},
                               {"pool_python3", "0"},
                               {"hot_python3", "0"},
                               {"pool_sh", "1"},
                               {"pool_native", "0"}};
        dsec_backend_config cfg = {.state_dir = dir[i],
                                   .node = i ? "fnuid-b" : "fnuid-a",
                                   .opts = o,
                                   .nopts = sizeof o / sizeof o[0]};
        if (dsec_function_ops.init(&b[i], &cfg, &err) < 0)
            fail_msg("backend %d without uid_base: %s", i + 1, err.msg);
        dsec_function_uid_range(b[i], &first[i], &count[i]);
        assert_int_equal(count[i], 4);
        assert_true(first[i] >= 1500000000u && first[i] + count[i] <= 1600000000u);
    }
    if (first[0] < first[1] + count[1] && first[1] < first[0] + count[0])
        fail_msg("both backends took uids from %u and %u (4 each)", first[0], first[1]);
    /* and their calls run as those uids */
    for (int i = 0; i < 2; i++) {
        dsec_backend_kv rt = {"runtime", "sh"};
        char id[32];
        snprintf(id, sizeof id, "fnuid-%d", i);
        dsec_sandbox_spec spec = {.id = id, .type = "function", .labels = &rt, .nlabels = 1};
        dsec_sandbox *h;
        char *st;
        if (dsec_function_ops.create(b[i], &spec, &h, &st, &err) < 0)
            fail_msg("create on backend %d: %s", i + 1, err.msg);
        const char *argv[] = {"sh", "-c", "id -u"};
        dsec_exec_req req = {.argv = argv, .argc = 3, .timeout_ms = 10000};
        dsec_exec_result r;
        if (dsec_function_ops.exec(b[i], h, &req, &r, &err) < 0)
            fail_msg("exec on backend %d: %s", i + 1, err.msg);
        unsigned long uid = strtoul(out_str(&r), NULL, 10);
        if (uid < first[i] || uid >= first[i] + count[i])
            fail_msg("backend %d's call ran as uid %lu, not one of %u..%u", i + 1, uid, first[i],
                     first[i] + count[i] - 1);
        dsec_exec_result_release(&r);
        assert_int_equal(dsec_function_ops.destroy(b[i], h, &err), 0);
        dsec_free(st);
    }
    /* a third one told to use the first one's range is refused, and told what to set */
    char base[16];
    snprintf(base, sizeof base, "%u", first[0]);
    dsec_backend_kv o3[] = {
        {"function.uid_base", base}, {"max_workers", "4"}, {"pool_python3", "0"},
        {"hot_python3", "0"},        {"pool_sh", "0"},     {"pool_native", "0"}};
    dsec_backend_config c3 = {.node = "fnuid-c", .opts = o3, .nopts = 6};
    void *third = NULL;
    assert_int_equal(dsec_function_ops.init(&third, &c3, &err), -1);
    assert_int_equal(err.code, DSEC_E_CONFIG);
    if (strstr(err.msg, "option function.uid_base") == NULL ||
        strstr(err.msg, "is free now") == NULL)
        fail_msg("the refusal names neither function.uid_base nor a free range: %s", err.msg);
    for (int i = 0; i < 2; i++) {
        dsec_function_ops.fini(b[i]);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir[i]);
        assert_int_equal(system(cmd), 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(python_runs_code_with_args_and_exit_codes, need_root),
        cmocka_unit_test_setup(python_stdin_scripts_modules_and_call, need_root),
        cmocka_unit_test_setup(sh_runs_scripts_pipes_and_stdin, need_root),
        cmocka_unit_test_setup(native_runs_an_uploaded_binary, need_root),
        cmocka_unit_test_setup(big_code_and_big_files, need_root),
        cmocka_unit_test_setup(nothing_leaks_between_calls, need_root),
        cmocka_unit_test_setup(processes_do_not_outlive_their_call, need_root),
        cmocka_unit_test_setup(calls_are_confined, need_root),
        cmocka_unit_test_setup(a_call_cannot_forge_its_result, need_root),
        cmocka_unit_test_setup(limits_cpu_memory_output_files, need_root),
        cmocka_unit_test_setup(timeouts_kill_the_whole_call, need_root),
        cmocka_unit_test_setup(a_killed_zygote_is_replaced, need_root),
        cmocka_unit_test_setup(many_concurrent_calls, need_root),
        cmocka_unit_test_setup(malformed_tasks_get_clear_errors, need_root),
        cmocka_unit_test_setup(files_quota_adopt_and_destroy, need_root),
        cmocka_unit_test_setup(a_runtime_that_cannot_start_fails_clearly, need_root),
        cmocka_unit_test_setup(two_backends_on_one_host_get_their_own_uids, need_root),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
