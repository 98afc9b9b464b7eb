/* test_agent.c - dsec-agent for real: commands, users, timeouts, streaming, kill, files, bad
 * frames, zombie reaping and shutdown, through the node-side client. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/agent/agent-client.h"
#include "backends/agent/agent-proto.h"
#include "backends/loop.h"
#include "backends/backend.h"
#include "dsec/alloc.h"
#include "dsec/err.h"
#include "tests/test_util.h"

/*
 * One agent serves the group, as one serves a sandbox; tests that end an
 * agent start their own. The agent's base environment is given with --env,
 * so what commands see does not depend on the environment ctest runs in.
 */

static char tmpdir[64];
static char sock_path[128];
static pid_t agent_pid;
static dsec_agent *conn;

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Every agent a test starts; the group teardown ends those a failed test left running
 * (they would hold ctest's output pipe open). */
static pid_t spawned[8];
static int nspawned;

/* fork for an agent: it dies with this process whatever happens. */
static pid_t fork_agent(void)
{
    pid_t pid = fork();
    if (pid == 0)
        prctl(PR_SET_PDEATHSIG, SIGKILL);
    else if (pid > 0 && nspawned < 8)
        spawned[nspawned++] = pid;
    return pid;
}

static pid_t start_agent(const char *sock, const char *const *extra)
{
    const char *argv[32] = {DSEC_AGENT_PATH, "--listen", sock};
    size_t n = 3;
    for (; extra && *extra && n < 31; extra++)
        argv[n++] = *extra;
    argv[n] = NULL;
    pid_t pid = fork_agent();
    if (pid == 0) {
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Wait up to ms for pid to exit; its wait status, or -1 if it is still running. */
static int wait_exit(pid_t pid, int ms)
{
    for (int i = 0; i < ms; i += 5) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            return st;
        msleep(5);
    }
    return -1;
}

static const char *const base_env[] = {
    "--env", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "--env", "BASE=base", "--env", "OVER=base",
    NULL};

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    return remove(p);
}

static int group_setup(void **state)
{
    strcpy(tmpdir, "/tmp/dsec-agent-XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        return -1;
    snprintf(sock_path, sizeof sock_path, "%s/agent.sock", tmpdir);
    agent_pid = start_agent(sock_path, base_env);
    dsec_err err = {0};
    if (agent_pid < 0 || dsec_agent_connect(&conn, sock_path, 5000, &err) < 0) {
        fprintf(stderr, "starting the agent: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    dsec_agent_free(conn);
    if (agent_pid > 0) {
        kill(agent_pid, SIGTERM);
        if (wait_exit(agent_pid, 5000) == -1) {
            kill(agent_pid, SIGKILL);
            waitpid(agent_pid, NULL, 0);
        }
    }
    for (int i = 0; i < nspawned; i++)
        if (kill(spawned[i], SIGKILL) == 0)
            waitpid(spawned[i], NULL, 0);
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

struct opts {
    const char *cwd, *user;
    const char *in;
    size_t in_len;
    uint64_t timeout_ms;
    size_t output_max;
    const dsec_backend_kv *env;
    size_t nenv;
    dsec_agent_output_fn fn;
    void *arg;
};

static int run(dsec_agent *a, const char *const *argv, const struct opts *o, dsec_exec_result *res,
               dsec_err *err)
{
    static const struct opts none = {0};
    if (o == NULL)
        o = &none;
    size_t argc = 0;
    while (argv[argc])
        argc++;
    dsec_exec_req req = {
        .argv = argv,
        .argc = argc,
        .env = o->env,
        .nenv = o->nenv,
        .cwd = o->cwd,
        .user = o->user,
        .stdin_data = (const uint8_t *)o->in,
        .stdin_len = o->in_len,
        .timeout_ms = o->timeout_ms,
        .output_max = o->output_max,
    };
    return dsec_agent_exec(a, &req, o->fn, o->arg, res, err);
}

/* Run a shell line and require the call itself to succeed. */
static void sh(const char *line, const struct opts *o, dsec_exec_result *res)
{
    const char *argv[] = {"/bin/sh", "-c", line, NULL};
    dsec_err err = {0};
    if (run(conn, argv, o, res, &err) < 0)
        fail_msg("exec %s: %s", line, err.msg);
}

static void assert_out(const dsec_exec_result *r, const char *out)
{
    assert_int_equal(r->stdout_len, strlen(out));
    if (r->stdout_len)
        assert_memory_equal(r->stdout_data, out, r->stdout_len);
}

static bool out_has(const uint8_t *data, size_t len, const char *needle)
{
    return data && memmem(data, len, needle, strlen(needle)) != NULL;
}

/* /proc/<pid>/stat: state, ppid and process group. */
static bool proc_stat(pid_t pid, char *state, pid_t *ppid, pid_t *pgrp)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = 0;
    char *rp = strrchr(buf, ')');
    int pp = 0, pg = 0;
    if (rp == NULL || sscanf(rp + 2, "%c %d %d", state, &pp, &pg) != 3)
        return false;
    *ppid = pp;
    *pgrp = pg;
    return true;
}

/* Processes matching: ppid == parent (if parent > 0) or pgrp == group (if group > 0).
 * zombies counts those in state Z. */
static int count_procs(pid_t parent, pid_t group, int *zombies)
{
    DIR *d = opendir("/proc");
    int n = 0;
    *zombies = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        pid_t pid = (pid_t)atoi(de->d_name);
        char st;
        pid_t pp, pg;
        if (pid <= 0 || !proc_stat(pid, &st, &pp, &pg))
            continue;
        if ((parent > 0 && pp == parent) || (group > 0 && pg == group)) {
            n++;
            if (st == 'Z')
                (*zombies)++;
        }
    }
    if (d)
        closedir(d);
    return n;
}

/* ---- commands ---------------------------------------------------------------------------------
 */

static void test_exec_basic(void **state)
{
    dsec_exec_result r;
    sh("echo out; echo err >&2; exit 3", NULL, &r);
    assert_out(&r, "out\n");
    assert_int_equal(r.stderr_len, 4);
    assert_memory_equal(r.stderr_data, "err\n", 4);
    assert_int_equal(r.exit_code, 3);
    assert_int_equal(r.signal, 0);
    assert_false(r.timed_out);
    assert_false(r.stdout_truncated);
    assert_true(r.duration_us > 0);
    assert_true(r.peak_rss_kb > 0);
    dsec_exec_result_release(&r);

    /* CPU time counts the command and what it waited for. */
    sh("i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done", NULL, &r);
    assert_int_equal(r.exit_code, 0);
    assert_true(r.cpu_us > 1000);
    assert_true(r.cpu_us <= r.duration_us + 10000);
    dsec_exec_result_release(&r);

    /* argv[0] without a slash is looked up in PATH. */
    dsec_err err = {0};
    const char *t[] = {"true", NULL};
    assert_int_equal(run(conn, t, NULL, &r, &err), 0);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.stdout_len + r.stderr_len, 0);
    assert_null(r.stdout_data);
    dsec_exec_result_release(&r);

    /* What cannot start exits 127 and says why on stderr. */
    const char *missing[] = {"/nonexistent/prog", "x", NULL};
    assert_int_equal(run(conn, missing, NULL, &r, &err), 0);
    assert_int_equal(r.exit_code, 127);
    assert_true(out_has(r.stderr_data, r.stderr_len, "/nonexistent/prog"));
    assert_true(out_has(r.stderr_data, r.stderr_len, "No such file or directory"));
    dsec_exec_result_release(&r);
    const char *nopath[] = {"no-such-command-dsec", NULL};
    assert_int_equal(run(conn, nopath, NULL, &r, &err), 0);
    assert_int_equal(r.exit_code, 127);
    assert_true(out_has(r.stderr_data, r.stderr_len, "no-such-command-dsec"));
    dsec_exec_result_release(&r);
    const char *notexec[] = {"/etc/passwd", NULL};
    assert_int_equal(run(conn, notexec, NULL, &r, &err), 0);
    assert_int_equal(r.exit_code, 127);
    assert_true(out_has(r.stderr_data, r.stderr_len, "Permission denied"));
    dsec_exec_result_release(&r);
    struct opts o = {.cwd = "/nonexistent-dir-dsec"};
    assert_int_equal(run(conn, t, &o, &r, &err), 0);
    assert_int_equal(r.exit_code, 127);
    assert_true(out_has(r.stderr_data, r.stderr_len, "/nonexistent-dir-dsec"));
    dsec_exec_result_release(&r);
}

static void test_exec_bad_requests(void **state)
{
    dsec_exec_result r;
    dsec_err err = {0};
    const char *empty[] = {NULL};
    assert_int_equal(run(conn, empty, NULL, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    const char *t[] = {"/bin/true", NULL};
    dsec_backend_kv bad = {"A=B", "c"};
    struct opts o = {.env = &bad, .nenv = 1};
    assert_int_equal(run(conn, t, &o, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "'='"));
    o = (struct opts){.in = "x", .in_len = DSEC_AGENT_FILE_MAX + 1u};
    assert_int_equal(run(conn, t, &o, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_TOO_LARGE);
    assert_int_equal(run(NULL, t, NULL, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    /* The connection is still good. */
    assert_int_equal(run(conn, t, NULL, &r, &err), 0);
    assert_int_equal(r.exit_code, 0);
    dsec_exec_result_release(&r);
}

static void test_exec_signal(void **state)
{
    dsec_exec_result r;
    sh("kill -TERM $$; sleep 5", NULL, &r);
    assert_int_equal(r.exit_code, -1);
    assert_int_equal(r.signal, SIGTERM);
    assert_false(r.timed_out);
    dsec_exec_result_release(&r);
}

static void test_exec_stdin(void **state)
{
    dsec_exec_result r;
    const char *cat[] = {"/bin/cat", NULL};
    dsec_err err = {0};
    struct opts o = {.in = "hello\n", .in_len = 6};
    assert_int_equal(run(conn, cat, &o, &r, &err), 0);
    assert_out(&r, "hello\n");
    dsec_exec_result_release(&r);

    /* More than a pipe holds, both ways at once: the agent feeds and drains together. */
    size_t n = 1u << 20;
    char *big = dsec_malloc(n);
    assert_non_null(big);
    for (size_t i = 0; i < n; i++)
        big[i] = (char)('a' + i % 26);
    o = (struct opts){.in = big, .in_len = n};
    assert_int_equal(run(conn, cat, &o, &r, &err), 0);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.stdout_len, n);
    assert_false(r.stdout_truncated);
    assert_memory_equal(r.stdout_data, big, n);
    dsec_exec_result_release(&r);
    dsec_free(big);

    /* No stdin: the command reads end of file at once. */
    assert_int_equal(run(conn, cat, NULL, &r, &err), 0);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.stdout_len, 0);
    dsec_exec_result_release(&r);
}

static void test_exec_env_cwd(void **state)
{
    dsec_exec_result r;
    dsec_backend_kv env[] = {{"OVER", "req"}, {"NEW", "new value"}};
    struct opts o = {.env = env, .nenv = 2, .cwd = tmpdir};
    sh("echo \"$BASE $OVER $NEW\"; pwd", &o, &r);
    char want[160];
    snprintf(want, sizeof want, "base req new value\n%s\n", tmpdir);
    assert_out(&r, want);
    dsec_exec_result_release(&r);
}

/* A warm pool's agent starts without defaults and is given the sandbox's once (SETUP): the
 * variables become the whole base environment, commands run in the workdir as the user; an
 * unknown user is refused and changes nothing; a second setup is refused. */
static void test_setup(void **state)
{
    char sock[300];
    snprintf(sock, sizeof sock, "%s/setup.sock", tmpdir);
    pid_t pid = start_agent(sock, NULL);
    assert_true(pid > 0);
    dsec_agent *a = NULL;
    dsec_err err = {0};
    assert_int_equal(dsec_agent_connect(&a, sock, 5000, &err), 0);
    const char *vars[] = {"WARM=yes", "PATH=/usr/bin:/bin"};
    assert_int_equal(dsec_agent_setup(a, vars, 2, tmpdir, "no-such-user-here", &err), -1);
    assert_non_null(strstr(err.msg, "--user no-such-user-here: no such user in /etc/passwd"));
    assert_false(dsec_agent_broken(a));
    const char *bad[] = {"NOEQUALS"};
    assert_int_equal(dsec_agent_setup(a, bad, 1, "/", "0", &err), -1);
    assert_non_null(strstr(err.msg, "setup: variable 0 is not K=V"));
    assert_int_equal(dsec_agent_setup(a, vars, 2, "/proc", "65534", &err), 0);
    dsec_exec_result r;
    const char *argv[] = {"/bin/sh", "-c", "echo \"$WARM $BASE\"; pwd; id -u", NULL};
    assert_int_equal(run(a, argv, NULL, &r, &err), 0);
    assert_out(&r, "yes \n/proc\n65534\n");
    dsec_exec_result_release(&r);
    assert_int_equal(dsec_agent_setup(a, vars, 2, "/", "0", &err), -1);
    assert_non_null(strstr(err.msg, "setup: the defaults are already set"));
    dsec_agent_free(a);
    kill(pid, SIGTERM);
    assert_int_not_equal(wait_exit(pid, 5000), -1);
}

static void test_exec_user(void **state)
{
    dsec_exec_result r;
    struct opts o = {.user = "nobody"};
    /* Root's supplementary groups must not follow the command. */
    sh("id -u; id -g; id -G; echo $HOME $USER", &o, &r);
    assert_out(&r, "65534\n65534\n65534\n/nonexistent nobody\n");
    dsec_exec_result_release(&r);

    o.user = "65534:65534";
    sh("id -u; id -g", &o, &r);
    assert_out(&r, "65534\n65534\n");
    dsec_exec_result_release(&r);

    o.user = "12345"; /* no passwd entry: the gid is the same number */
    sh("id -u; id -g", &o, &r);
    assert_out(&r, "12345\n12345\n");
    dsec_exec_result_release(&r);

    o.user = "nobody:root";
    sh("id -u; id -g", &o, &r);
    assert_out(&r, "65534\n0\n");
    dsec_exec_result_release(&r);

    const char *t[] = {"/bin/true", NULL};
    dsec_err err = {0};
    o.user = "no-such-user-dsec";
    assert_int_equal(run(conn, t, &o, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "no-such-user-dsec"));
    o.user = "nobody:no-such-group-dsec";
    assert_int_equal(run(conn, t, &o, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_non_null(strstr(err.msg, "group"));
}

static void test_exec_timeout(void **state)
{
    dsec_exec_result r;
    struct opts o = {.timeout_ms = 300};
    uint64_t t0 = now_us();
    /* The background sleeper shares the group and must die with it. */
    sh("sleep 30 & echo $$ $!; wait", &o, &r);
    uint64_t took = now_us() - t0;
    assert_true(r.timed_out);
    assert_int_equal(r.signal, SIGKILL);
    assert_int_equal(r.exit_code, -1);
    assert_true(took >= 290000 && took < 5000000);
    assert_true(r.duration_us >= 290000);
    int pgid = 0, bg = 0;
    assert_non_null(r.stdout_data);
    char line[64] = {0};
    memcpy(line, r.stdout_data, r.stdout_len < 63 ? r.stdout_len : 63);
    assert_int_equal(sscanf(line, "%d %d", &pgid, &bg), 2);
    dsec_exec_result_release(&r);
    int left = -1, z;
    for (int i = 0; i < 200 && left != 0; i++) {
        left = count_procs(0, pgid, &z);
        if (left)
            msleep(10);
    }
    assert_int_equal(left, 0);
    assert_int_equal(kill(bg, 0), -1);
}

static void test_exec_output_cap(void **state)
{
    dsec_exec_result r;
    struct opts o = {.output_max = 1024};
    sh("yes | head -c 10000000; echo done >&2", &o, &r);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.stdout_len, 1024);
    assert_true(r.stdout_truncated);
    for (size_t i = 0; i < r.stdout_len; i++)
        assert_int_equal(r.stdout_data[i], i % 2 ? '\n' : 'y');
    assert_int_equal(r.stderr_len, 5);
    assert_false(r.stderr_truncated);
    dsec_exec_result_release(&r);

    /* Exactly at the cap is not truncated. */
    o.output_max = 4;
    sh("printf abcd", &o, &r);
    assert_out(&r, "abcd");
    assert_false(r.stdout_truncated);
    dsec_exec_result_release(&r);
}

struct chunks {
    char data[256];
    size_t len;
    int n;
    uint64_t first_us;
};

static void collect(void *arg, int stream, const uint8_t *data, size_t len)
{
    struct chunks *c = arg;
    if (c->n++ == 0)
        c->first_us = now_us();
    if (stream == 1 && c->len + len < sizeof c->data) {
        memcpy(c->data + c->len, data, len);
        c->len += len;
    }
}

static void test_exec_streaming(void **state)
{
    dsec_exec_result r;
    struct chunks c = {0};
    struct opts o = {.fn = collect, .arg = &c};
    sh("echo a; sleep 0.3; echo b", &o, &r);
    uint64_t end = now_us();
    assert_int_equal(r.exit_code, 0);
    assert_true(c.n >= 2);
    /* The first chunk came while the command still slept. */
    assert_true(end - c.first_us >= 200000);
    assert_int_equal(c.len, 4);
    assert_memory_equal(c.data, "a\nb\n", 4);
    assert_out(&r, "a\nb\n");
    dsec_exec_result_release(&r);
}

struct job {
    const char *line;
    dsec_agent *a;
    struct opts o;
    dsec_exec_result r;
    dsec_err err;
    int rc;
    int done; /* set (atomically) when the exec returned */
};

static void *job_run(void *arg)
{
    struct job *j = arg;
    const char *argv[] = {"/bin/sh", "-c", j->line, NULL};
    j->rc = run(j->a, argv, &j->o, &j->r, &j->err);
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_concurrent(void **state)
{
    struct job j[2] = {{.line = "sleep 0.5; echo one"}, {.line = "sleep 0.5; echo two"}};
    dsec_err err = {0};
    for (int i = 0; i < 2; i++)
        assert_int_equal(dsec_agent_connect(&j[i].a, sock_path, 2000, &err), 0);
    pthread_t th[2];
    uint64_t t0 = now_us();
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, job_run, &j[i]), 0);
    /* The group's own connection stays usable meanwhile. */
    dsec_exec_result r;
    sh("echo three", NULL, &r);
    assert_out(&r, "three\n");
    dsec_exec_result_release(&r);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    uint64_t took = now_us() - t0;
    assert_int_equal(j[0].rc, 0);
    assert_int_equal(j[1].rc, 0);
    assert_out(&j[0].r, "one\n");
    assert_out(&j[1].r, "two\n");
    assert_true(took < 900000); /* both ran at once: one after the other takes a second */
    for (int i = 0; i < 2; i++) {
        dsec_exec_result_release(&j[i].r);
        dsec_agent_free(j[i].a);
    }
}

static void flag_output(void *arg, int stream, const uint8_t *data, size_t len)
{
    __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
}

/* ---- exec cleanup: a command's whole process tree ends with it -------------------------------
 */

/* Each command here runs with TREE_MARK=<token> in its environment, which every process it
 * starts inherits: /proc/<pid>/environ tells the test's processes from everything else. */
static char mark[64];
static dsec_backend_kv mark_env[1];

static void new_mark(void)
{
    static int n;
    snprintf(mark, sizeof mark, "dsec-tree-%d-%d", (int)getpid(), ++n);
    mark_env[0] = (dsec_backend_kv){.key = "TREE_MARK", .value = mark};
}

static bool has_mark(pid_t pid)
{
    char path[64], want[96];
    static char buf[1 << 16];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) /* a zombie has no environment left */
        return false;
    int wl = snprintf(want, sizeof want, "TREE_MARK=%s", mark);
    for (ssize_t i = 0; i + wl < n + 1; i += (ssize_t)strlen(buf + i) + 1)
        if (memcmp(buf + i, want, (size_t)wl + 1) == 0)
            return true;
    return false;
}

/* Live processes with the current mark (only "sleep"s when sleeps_only); with kill_them, each
 * gets SIGKILL (they are this test's own: the mark is new). */
static int count_marked(bool sleeps_only, bool kill_them)
{
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        pid_t pid = (pid_t)atoi(de->d_name);
        if (pid <= 0 || pid == getpid() || !has_mark(pid))
            continue;
        if (sleeps_only) {
            char path[64], comm[32] = {0};
            snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            ssize_t l = fd < 0 ? -1 : read(fd, comm, sizeof comm - 1);
            if (fd >= 0)
                close(fd);
            if (l <= 0 || strncmp(comm, "sleep\n", 6) != 0)
                continue;
        }
        n++;
        if (kill_them)
            kill(pid, SIGKILL);
    }
    if (d)
        closedir(d);
    return n;
}

/* What is left of the marked processes, then none of them: a failing test leaves nothing. */
static int marked_left(void)
{
    int left = count_marked(false, false);
    for (int i = 0; i < 100 && count_marked(false, true) > 0; i++)
        msleep(20);
    return left;
}

static void test_kill(void **state)
{
    /* The KILL ends the main process, and its shepherd then kills what it started. */
    int ready = 0;
    new_mark();
    struct job j = {.line = "setsid sleep 300 & (setsid sleep 300 &); echo ready; sleep 30",
                    .o = {.fn = flag_output, .arg = &ready, .env = mark_env, .nenv = 1}};
    dsec_err err = {0};
    assert_int_equal(dsec_agent_connect(&j.a, sock_path, 2000, &err), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, job_run, &j), 0);
    for (int i = 0; i < 500 && !__atomic_load_n(&ready, __ATOMIC_ACQUIRE); i++)
        msleep(10);
    assert_true(ready);
    uint64_t t0 = now_us();
    assert_int_equal(dsec_agent_kill(sock_path, SIGTERM, &err), 0);
    pthread_join(th, NULL);
    assert_true(now_us() - t0 < 5000000);
    assert_int_equal(j.rc, 0);
    assert_int_equal(j.r.signal, SIGTERM);
    assert_false(j.r.timed_out);
    dsec_exec_result_release(&j.r);
    dsec_agent_free(j.a);
    assert_int_equal(marked_left(), 0);

    /* Nothing running: still fine. A bad signal is refused. */
    assert_int_equal(dsec_agent_kill(sock_path, SIGTERM, &err), 0);
    assert_int_equal(dsec_agent_kill(sock_path, 0, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
}

/* 200 sleeping descendants, 50 of each kind: children, setsid'd children, double-forked
 * (orphaned at once) and both; the main shell then waits. At its timeout none is left, and
 * the next exec runs at once. */
static void tree_timeout(dsec_agent *a)
{
    new_mark();
    struct job j = {
        .a = a,
        .line = "i=0; while [ $i -lt 50 ]; do sleep 300 & i=$((i+1)); done;"
                "i=0; while [ $i -lt 50 ]; do setsid sleep 300 & i=$((i+1)); done;"
                "i=0; while [ $i -lt 50 ]; do (sleep 300 &); i=$((i+1)); done;"
                "i=0; while [ $i -lt 50 ]; do (setsid sleep 300 &) & i=$((i+1)); done;"
                "echo started; wait; sleep 300",
        .o = {.timeout_ms = 8000, .env = mark_env, .nenv = 1}, /* room for a loaded machine */
    };
    pthread_t th;
    uint64_t t0 = now_us();
    assert_int_equal(pthread_create(&th, NULL, job_run, &j), 0);
    int most = 0; /* marked processes seen at once: the shell, subshells, the sleeps */
    while (!__atomic_load_n(&j.done, __ATOMIC_ACQUIRE)) {
        int n = count_marked(false, false);
        most = n > most ? n : most;
        msleep(50);
    }
    pthread_join(th, NULL);
    uint64_t took = now_us() - t0;
    int left = marked_left();
    assert_int_equal(j.rc, 0);
    assert_true(j.r.timed_out);
    assert_int_equal(j.r.signal, SIGKILL);
    bool started = out_has(j.r.stdout_data, j.r.stdout_len, "started");
    dsec_exec_result_release(&j.r);
    /* At most 201 at once (the last few may still be forking at the timeout on a loaded
     * machine, and the scans are 50 ms apart): enough that escaping ones would be left. */
    fprintf(stderr, "tree_timeout: %d marked processes seen at once%s\n", most,
            started ? "" : "; the 200 were not all forked before the timeout");
    assert_true(most >= 50);
    assert_int_equal(left, 0);
    assert_true(took < 15000000);

    /* The next exec right after: no stragglers in its way. */
    dsec_exec_result r;
    dsec_err err = {0};
    const char *t[] = {"/bin/sh", "-c", "echo next", NULL};
    t0 = now_us();
    assert_int_equal(run(a, t, NULL, &r, &err), 0);
    took = now_us() - t0;
    assert_out(&r, "next\n");
    dsec_exec_result_release(&r);
    assert_true(took < 3000000);
}

/* The main process exits while a setsid'd grandchild (holding the output pipe) and a
 * setsid'd, double-forked one run on: the exec returns at once, with the main process's
 * status, and neither is left (background processes are PSTART's). */
static void tree_main_exits(dsec_agent *a)
{
    new_mark();
    struct opts o = {.env = mark_env, .nenv = 1};
    dsec_exec_result r;
    dsec_err err = {0};
    const char *argv[] = {"/bin/sh", "-c",
                          "setsid sleep 300 & (setsid sleep 300 &); sleep 0.2; echo done; exit 3",
                          NULL};
    uint64_t t0 = now_us();
    assert_int_equal(run(a, argv, &o, &r, &err), 0);
    uint64_t took = now_us() - t0;
    int alive = count_marked(false, false);
    assert_int_equal(r.exit_code, 3);
    assert_false(r.timed_out);
    assert_out(&r, "done\n");
    assert_true(r.duration_us >= 200000 && r.duration_us < 5000000);
    dsec_exec_result_release(&r);
    assert_true(took < 5000000); /* not the sleeps' 300 s (room for a loaded machine) */
    int left = marked_left();
    fprintf(stderr, "tree_main_exits: %d processes of the exec left after it\n", alive);
    assert_int_equal(alive, 0);
    assert_int_equal(left, 0);

    /* The next command runs at once, and a doomed one too. */
    const char *doomed[] = {"/bin/sleep", "300", NULL};
    struct opts od = {.timeout_ms = 200};
    t0 = now_us();
    assert_int_equal(run(a, doomed, &od, &r, &err), 0);
    assert_true(r.timed_out);
    dsec_exec_result_release(&r);
    assert_true(now_us() - t0 < 3000000);
}

/* Workers that keep forking setsid'd, double-forked shells while the timeout's kill runs:
 * the kill must catch up with them. Bounded (150 forks a worker) in case it does not. */
static void tree_fork_race(dsec_agent *a)
{
    new_mark();
    struct opts o = {.timeout_ms = 700, .env = mark_env, .nenv = 1};
    dsec_exec_result r;
    dsec_err err = {0};
    const char *argv[] = {"/bin/sh", "-c",
                          "w() { i=0; while [ $i -lt 150 ]; do (setsid sh -c 'sleep 300' &);"
                          " i=$((i+1)); done; }; w & w & w & wait; sleep 300",
                          NULL};
    uint64_t t0 = now_us();
    assert_int_equal(run(a, argv, &o, &r, &err), 0);
    uint64_t took = now_us() - t0;
    int left = marked_left();
    assert_true(r.timed_out);
    dsec_exec_result_release(&r);
    assert_int_equal(left, 0);
    assert_true(took < 5000000);
}

static void test_tree_timeout(void **state)
{
    tree_timeout(conn);
}

static void test_tree_main_exits(void **state)
{
    tree_main_exits(conn);
}

static void test_tree_fork_race(void **state)
{
    tree_fork_race(conn);
}

/* Two execs at once: the end of one (and the kill of its tree at its timeout) leaves the
 * other's processes, background ones included, alone. */
static void test_tree_overlap(void **state)
{
    char flag[160], line[400];
    snprintf(flag, sizeof flag, "%s/overlap-done", tmpdir);
    unlink(flag);
    snprintf(line, sizeof line,
             "setsid sleep 300 & echo started >&2; while [ ! -e %s ]; do sleep 0.05; done;"
             " kill -0 $! && echo bg-alive; kill $!",
             flag);
    int ready = 0;
    struct job j = {.line = line, .o = {.timeout_ms = 60000, .fn = flag_output, .arg = &ready}};
    dsec_err err = {0};
    assert_int_equal(dsec_agent_connect(&j.a, sock_path, 2000, &err), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, job_run, &j), 0);
    for (int i = 0; i < 1000 && !__atomic_load_n(&ready, __ATOMIC_ACQUIRE); i++)
        msleep(10);
    assert_true(ready); /* its background process runs */
    /* Times out, and has its tree killed, while j runs. */
    new_mark();
    struct opts o = {.timeout_ms = 300, .env = mark_env, .nenv = 1};
    dsec_exec_result r;
    sh("setsid sleep 300 & (setsid sleep 300 &); sleep 300", &o, &r);
    assert_true(r.timed_out);
    dsec_exec_result_release(&r);
    assert_int_equal(marked_left(), 0);
    tree_main_exits(conn); /* and one whose main process exits while its tree runs */
    int fd = open(flag, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    close(fd);
    pthread_join(th, NULL);
    assert_int_equal(j.rc, 0);
    assert_int_equal(j.r.exit_code, 0);
    assert_out(&j.r, "bg-alive\n");
    dsec_exec_result_release(&j.r);
    dsec_agent_free(j.a);
}

/* Signal every live child of the agent (its idle shepherds, when nothing runs). */
static int signal_shepherds(int sig)
{
    DIR *d = opendir("/proc");
    struct dirent *de;
    int n = 0;
    while (d && (de = readdir(d)) != NULL) {
        pid_t pid = (pid_t)atoi(de->d_name), pp, pg;
        char st;
        if (pid > 0 && proc_stat(pid, &st, &pp, &pg) && pp == agent_pid && st != 'Z' &&
            kill(pid, sig) == 0)
            n++;
    }
    if (d)
        closedir(d);
    return n;
}

/* Shepherds that die or stop (the sandbox's root can signal them): idle ones killed from
 * outside are replaced, stopped ones continued; a command that kills or stops its own
 * shepherd (its parent) still gets its answer. */
static void test_tree_shepherd_lost(void **state)
{
    dsec_exec_result r;
    sh("true", NULL, &r); /* at least one idle shepherd now */
    dsec_exec_result_release(&r);
    assert_true(signal_shepherds(SIGSTOP) >= 1);
    uint64_t t0 = now_us();
    sh("echo continued", NULL, &r);
    assert_true(now_us() - t0 < 5000000);
    assert_out(&r, "continued\n");
    dsec_exec_result_release(&r);

    new_mark();
    struct opts o = {.timeout_ms = 300, .env = mark_env, .nenv = 1};
    t0 = now_us();
    sh("setsid sleep 300 & kill -STOP $PPID; sleep 300", &o, &r);
    assert_true(now_us() - t0 < 5000000);
    assert_true(r.timed_out);
    dsec_exec_result_release(&r);
    assert_int_equal(marked_left(), 0);

    assert_true(signal_shepherds(SIGKILL) >= 1);
    sh("echo still", NULL, &r); /* at once: the dead one may not be reaped yet */
    assert_out(&r, "still\n");
    dsec_exec_result_release(&r);

    t0 = now_us();
    sh("kill -9 $PPID; echo orphaned", NULL, &r);
    assert_true(now_us() - t0 < 5000000);
    assert_int_equal(r.exit_code, 0);
    assert_out(&r, "orphaned\n");
    dsec_exec_result_release(&r);
    sh("echo after", NULL, &r);
    assert_out(&r, "after\n");
    dsec_exec_result_release(&r);
}

/* The same in a container's situation: the agent is PID 1 of its own pid namespace, with its
 * own /proc. Needs CLONE_NEWPID (skipped without). */
static pid_t start_agent_pidns(const char *sock)
{
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) < 0)
        return -1;
    pid_t pid = fork_agent();
    if (pid == 0) {
        close(ready[0]);
        char ok = 0;
        if (unshare(CLONE_NEWPID | CLONE_NEWNS) < 0 ||
            mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
            ssize_t w = write(ready[1], &ok, 1);
            (void)w;
            _exit(77);
        }
        pid_t init = fork();
        if (init == 0) { /* PID 1 of the new namespace */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
                _exit(77);
            ok = 1;
            ssize_t w = write(ready[1], &ok, 1);
            (void)w;
            const char *argv[] = {DSEC_AGENT_PATH, "--listen",  sock,
                                  base_env[0],     base_env[1], NULL};
            execv(argv[0], (char *const *)argv);
            _exit(127);
        }
        close(ready[1]);
        int st = 0;
        while (init > 0 && waitpid(init, &st, 0) < 0 && errno == EINTR)
            ;
        _exit(init < 0 ? 1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    }
    close(ready[1]);
    char ok = 0;
    ssize_t n = pid > 0 ? read(ready[0], &ok, 1) : -1;
    close(ready[0]);
    if (pid > 0 && (n != 1 || !ok)) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return 0;
    }
    return pid;
}

static void test_tree_pidns(void **state)
{
    char sock[128];
    snprintf(sock, sizeof sock, "%s/pidns.sock", tmpdir);
    pid_t pid = start_agent_pidns(sock);
    assert_true(pid >= 0);
    if (pid == 0) {
        fprintf(stderr, "test_tree_pidns: no new pid namespace here; skipping\n");
        skip();
    }
    dsec_agent *a = NULL;
    dsec_err err = {0};
    assert_int_equal(dsec_agent_connect(&a, sock, 5000, &err), 0);
    dsec_exec_result r;
    const char *me[] = {"/bin/cat", "/proc/1/comm", NULL}; /* the agent is its init */
    assert_int_equal(run(a, me, NULL, &r, &err), 0);
    assert_out(&r, "dsec-agent\n");
    dsec_exec_result_release(&r);
    tree_main_exits(a);
    tree_timeout(a);
    tree_fork_race(a);
    dsec_agent_free(a);
    kill(pid, SIGKILL); /* its PID 1 follows (PDEATHSIG), and the namespace with it */
    waitpid(pid, NULL, 0);
}

/* ---- files ------------------------------------------------------------------------------------
 */

static void expect_fail(int rc, const dsec_err *err, int code, const char *in_msg)
{
    assert_int_equal(rc, -1);
    if (err->code != code || (in_msg && strstr(err->msg, in_msg) == NULL))
        fail_msg("expected %s with \"%s\", got %s: %s", dsec_code_name(code), in_msg ? in_msg : "",
                 dsec_code_name(err->code), err->msg);
}

static void read_all(const char *path, const char *want)
{
    dsec_file_data d;
    dsec_err err = {0};
    assert_int_equal(dsec_agent_file_read(conn, path, 0, 0, &d, &err), 0);
    assert_int_equal(d.len, strlen(want));
    assert_memory_equal(d.data, want, d.len);
    assert_int_equal(d.size, strlen(want));
    assert_true(d.eof);
    dsec_free(d.data);
}

static void test_files(void **state)
{
    char base[128], f[160], f2[160], p[200];
    snprintf(base, sizeof base, "%s/files", tmpdir);
    snprintf(f, sizeof f, "%s/a/b/c.txt", base);
    snprintf(f2, sizeof f2, "%s/a/b/d.txt", base);
    dsec_err err = {0};

    assert_int_equal(dsec_agent_file_write(conn, f, "hello", 5, 0600, false, &err), 0);
    dsec_file_entry e;
    assert_int_equal(dsec_agent_file_stat(conn, f, &e, &err), 0);
    assert_string_equal(e.name, "c.txt");
    assert_int_equal(e.kind, DSEC_FILE_REG);
    assert_int_equal(e.size, 5);
    assert_int_equal(e.mode, 0600);
    assert_true(e.mtime > 1600000000);
    dsec_free(e.name);
    read_all(f, "hello");

    dsec_file_data d;
    assert_int_equal(dsec_agent_file_read(conn, f, 1, 2, &d, &err), 0);
    assert_int_equal(d.len, 2);
    assert_memory_equal(d.data, "el", 2);
    assert_int_equal(d.size, 5);
    assert_false(d.eof);
    dsec_free(d.data);
    assert_int_equal(dsec_agent_file_read(conn, f, 5, 0, &d, &err), 0);
    assert_int_equal(d.len, 0);
    assert_null(d.data);
    assert_true(d.eof);

    assert_int_equal(dsec_agent_file_write(conn, f, " world", 6, 0, true, &err), 0);
    read_all(f, "hello world");
    assert_int_equal(dsec_agent_file_write(conn, f, "x", 1, 0, false, &err), 0);
    read_all(f, "x");
    assert_int_equal(dsec_agent_file_stat(conn, f, &e, &err), 0);
    assert_int_equal(e.mode, 0600); /* mode 0 keeps an existing file's mode */
    dsec_free(e.name);
    assert_int_equal(dsec_agent_file_write(conn, f2, "", 0, 0755, false, &err), 0);

    dsec_file_entry *v;
    size_t n;
    snprintf(p, sizeof p, "%s/a/b", base);
    assert_int_equal(dsec_agent_file_list(conn, p, &v, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_string_equal(v[0].name, "c.txt");
    assert_string_equal(v[1].name, "d.txt");
    assert_int_equal(v[1].mode, 0755);
    assert_int_equal(v[1].size, 0);
    dsec_file_entries_free(v, n);
    assert_int_equal(dsec_agent_file_list(conn, f, &v, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].name, "c.txt");
    assert_int_equal(v[0].kind, DSEC_FILE_REG);
    dsec_file_entries_free(v, n);
    snprintf(p, sizeof p, "%s/a", base);
    assert_int_equal(dsec_agent_file_list(conn, p, &v, &n, &err), 0);
    assert_int_equal(n, 1);
    assert_string_equal(v[0].name, "b");
    assert_int_equal(v[0].kind, DSEC_FILE_DIR);
    dsec_file_entries_free(v, n);

    /* A symlink is described, not followed. */
    snprintf(p, sizeof p, "%s/link", base);
    assert_int_equal(symlink(f, p), 0);
    assert_int_equal(dsec_agent_file_stat(conn, p, &e, &err), 0);
    assert_int_equal(e.kind, DSEC_FILE_LINK);
    dsec_free(e.name);

    /* Errors name the path and carry the right code. */
    snprintf(p, sizeof p, "%s/missing", base);
    expect_fail(dsec_agent_file_stat(conn, p, &e, &err), &err, DSEC_E_NOT_FOUND, p);
    expect_fail(dsec_agent_file_read(conn, p, 0, 0, &d, &err), &err, DSEC_E_NOT_FOUND, p);
    expect_fail(dsec_agent_file_list(conn, p, &v, &n, &err), &err, DSEC_E_NOT_FOUND, p);
    expect_fail(dsec_agent_file_remove(conn, p, false, &err), &err, DSEC_E_NOT_FOUND, p);
    expect_fail(dsec_agent_file_read(conn, base, 0, 0, &d, &err), &err, DSEC_E_INVALID, base);
    snprintf(p, sizeof p, "%s/under", f);
    expect_fail(dsec_agent_file_write(conn, p, "x", 1, 0, false, &err), &err, DSEC_E_INVALID, p);
    expect_fail(dsec_agent_file_write(conn, "relative/x", "x", 1, 0, false, &err), &err,
                DSEC_E_INVALID, "relative/x");
    expect_fail(dsec_agent_file_write(conn, f, "x", DSEC_AGENT_FILE_MAX + 1u, 0, false, &err), &err,
                DSEC_E_TOO_LARGE, f);
    expect_fail(dsec_agent_file_read(conn, "/dev/null", 0, 0, &d, &err), &err, DSEC_E_INVALID,
                "/dev/null");
    expect_fail(dsec_agent_file_remove(conn, "/", true, &err), &err, DSEC_E_INVALID, "/");
    snprintf(p, sizeof p, "%s/a", base);
    expect_fail(dsec_agent_file_remove(conn, p, false, &err), &err, DSEC_E_INVALID, "not empty");
    assert_false(dsec_agent_broken(conn)); /* answered errors keep the connection */

    /* A full-size piece both ways. */
    size_t big_n = DSEC_AGENT_FILE_MAX;
    uint8_t *big = dsec_malloc(big_n);
    assert_non_null(big);
    for (size_t i = 0; i < big_n; i++)
        big[i] = (uint8_t)(i * 7 + i / 4096);
    snprintf(p, sizeof p, "%s/big", base);
    assert_int_equal(dsec_agent_file_write(conn, p, big, big_n, 0, false, &err), 0);
    assert_int_equal(dsec_agent_file_write(conn, p, "tail", 4, 0, true, &err), 0);
    assert_int_equal(dsec_agent_file_read(conn, p, 0, 0, &d, &err), 0);
    assert_int_equal(d.len, big_n);
    assert_int_equal(d.size, big_n + 4);
    assert_false(d.eof); /* capped at one piece: the rest needs another call */
    assert_memory_equal(d.data, big, big_n);
    dsec_free(d.data);
    assert_int_equal(dsec_agent_file_read(conn, p, big_n, 0, &d, &err), 0);
    assert_int_equal(d.len, 4);
    assert_true(d.eof);
    dsec_free(d.data);
    dsec_free(big);

    /* /proc files say size 0 but have content. */
    assert_int_equal(dsec_agent_file_read(conn, "/proc/self/status", 0, 0, &d, &err), 0);
    assert_true(d.len > 100 && d.eof);
    assert_true(out_has(d.data, d.len, "Name:"));
    dsec_free(d.data);

    snprintf(p, sizeof p, "%s/a", base);
    assert_int_equal(dsec_agent_file_remove(conn, p, true, &err), 0);
    expect_fail(dsec_agent_file_stat(conn, f, &e, &err), &err, DSEC_E_NOT_FOUND, f);
    snprintf(p, sizeof p, "%s/big", base);
    assert_int_equal(dsec_agent_file_remove(conn, p, false, &err), 0);
    snprintf(p, sizeof p, "%s/link", base);
    assert_int_equal(dsec_agent_file_remove(conn, p, false, &err), 0);
    assert_int_equal(dsec_agent_file_remove(conn, base, false, &err), 0);
    assert_int_equal(access(base, F_OK), -1);
}

/* ---- robustness ---------------------------------------------------------------------------------
 */

static int raw_connect(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, sock_path);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

/* Read one frame (or EOF: returns -1) within ms. */
static int raw_frame(int fd, uint8_t *type, uint32_t *id, uint8_t *payload, size_t cap,
                     size_t *plen, int ms)
{
    uint8_t hdr[DSEC__AGENT_HDR];
    size_t got = 0;
    while (got < sizeof hdr) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, ms) <= 0)
            return -2;
        ssize_t n = read(fd, hdr + got, sizeof hdr - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    uint32_t len = dsec__agent_get_u32le(hdr);
    *type = hdr[4];
    *id = dsec__agent_get_u32le(hdr + 5);
    *plen = len - 5;
    if (*plen > cap)
        return -3;
    got = 0;
    while (got < *plen) {
        ssize_t n = read(fd, payload + got, *plen - got);
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    return 0;
}

/* FMKDIR and FRENAME: directories with and without parents, a rename that replaces its
 * target at once; an upload's temporary file untouched for the stale time is swept, other
 * files and a renamed upload stay. */
static void test_mkdir_rename_sweep(void **state)
{
    char base[128], d[160], f[200], g[200], tmp[200], keep[200], moved[200], sock[200];
    snprintf(base, sizeof base, "%s/mr", tmpdir);
    snprintf(d, sizeof d, "%s/x/y/z", base);
    dsec_err err = {0};
    expect_fail(dsec_agent_file_mkdir(conn, d, 0, false, &err), &err, DSEC_E_NOT_FOUND, "mkdir");
    assert_int_equal(dsec_agent_file_mkdir(conn, d, 0700, true, &err), 0);
    assert_int_equal(dsec_agent_file_mkdir(conn, d, 0700, true, &err), 0); /* there: fine */
    expect_fail(dsec_agent_file_mkdir(conn, d, 0700, false, &err), &err, DSEC_E_EXISTS, "mkdir");
    dsec_file_entry e;
    assert_int_equal(dsec_agent_file_stat(conn, d, &e, &err), 0);
    assert_int_equal(e.kind, DSEC_FILE_DIR);
    assert_int_equal(e.mode, 0700); /* not what the umask left */
    dsec_free(e.name);

    snprintf(f, sizeof f, "%s/new", d);
    snprintf(g, sizeof g, "%s/target", d);
    assert_int_equal(dsec_agent_file_write(conn, f, "new", 3, 0, false, &err), 0);
    assert_int_equal(dsec_agent_file_write(conn, g, "old", 3, 0, false, &err), 0);
    assert_int_equal(dsec_agent_file_rename(conn, f, g, true, &err), 0);
    read_all(g, "new");
    assert_int_equal(access(f, F_OK), -1);
    expect_fail(dsec_agent_file_rename(conn, f, g, false, &err), &err, DSEC_E_NOT_FOUND, "rename");
    expect_fail(dsec_agent_file_rename(conn, "rel", g, false, &err), &err, DSEC_E_INVALID,
                "absolute");

    /* the sweep: an agent of its own with a stale time of 1 s */
    snprintf(sock, sizeof sock, "%s/sweep.sock", tmpdir);
    static const char *const extra[] = {"--upload-stale-s", "1", NULL};
    pid_t pid = start_agent(sock, extra);
    dsec_agent *a = NULL;
    assert_true(pid > 0);
    if (dsec_agent_connect(&a, sock, 5000, &err) < 0)
        fail_msg("connecting to the sweeping agent: %s", err.msg);
    snprintf(tmp, sizeof tmp, "%s/.dsec-upload-u1", d);
    snprintf(keep, sizeof keep, "%s/plain", d);
    snprintf(moved, sizeof moved, "%s/.dsec-upload-u2", d);
    assert_int_equal(dsec_agent_file_write(a, tmp, "part", 4, 0, false, &err), 0);
    assert_int_equal(dsec_agent_file_write(a, keep, "plain", 5, 0, false, &err), 0);
    assert_int_equal(dsec_agent_file_write(a, moved, "done", 4, 0, false, &err), 0);
    assert_int_equal(dsec_agent_file_rename(a, moved, f, true, &err), 0);
    msleep(400);
    assert_int_equal(dsec_agent_file_write(a, tmp, "more", 4, 0, true, &err), 0); /* touched */
    msleep(700);
    assert_int_equal(access(tmp, F_OK), 0); /* 0.7 s since its last chunk */
    for (int i = 0; i < 100 && access(tmp, F_OK) == 0; i++)
        msleep(20);
    assert_int_equal(access(tmp, F_OK), -1); /* swept */
    read_all(keep, "plain");
    read_all(f, "done");
    dsec_agent_free(a);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static void raw_send(int fd, const void *p, size_t n)
{
    assert_int_equal(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Expect an ERROR frame for id with kind. */
static void expect_error(int fd, uint32_t want_id, uint32_t kind)
{
    uint8_t type, buf[4096];
    uint32_t id;
    size_t n;
    assert_int_equal(raw_frame(fd, &type, &id, buf, sizeof buf, &n, 2000), 0);
    assert_int_equal(type, DSEC__AGENT_T_ERROR);
    assert_int_equal(id, want_id);
    assert_int_equal(dsec__agent_get_u32le(buf), kind);
}

static void expect_eof(int fd)
{
    uint8_t type, buf[4096];
    uint32_t id;
    size_t n;
    assert_int_equal(raw_frame(fd, &type, &id, buf, sizeof buf, &n, 2000), -1);
}

static int raw_hello(void)
{
    int fd = raw_connect();
    uint8_t type, buf[64];
    uint32_t id;
    size_t n;
    assert_int_equal(raw_frame(fd, &type, &id, buf, sizeof buf, &n, 2000), 0);
    assert_int_equal(type, DSEC__AGENT_T_HELLO);
    assert_int_equal(dsec__agent_get_u32le(buf), DSEC__AGENT_VERSION);
    return fd;
}

/* A transfer started on a loop, waited for here. */
struct xfer_wait {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    int rc;
    dsec_file_data data;
    dsec_err err;
};

static void xfer_waited(void *ud, int rc, dsec_file_data *data, dsec_err *err)
{
    struct xfer_wait *w = ud;
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    if (data != NULL)
        w->data = *data;
    if (rc < 0)
        w->err = *err;
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

static int xfer_wait(struct xfer_wait *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        pthread_cond_wait(&w->cond, &w->mu);
    pthread_mutex_unlock(&w->mu);
    return w->rc;
}

#define XFER_WAIT_INIT                                                                             \
    {                                                                                              \
        .mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER                          \
    }

/* Transfers without a thread, as a node runs them: larger than one agent call (8 MiB), so in
 * pieces; a refused one (no such file, a file as a directory) says why and leaves the
 * connection usable; a sync call meanwhile is refused, not interleaved. */
static void test_files_on_loop(void **state)
{
    (void)state;
    dsec_err err = {0};
    dsec_loop *loop = NULL;
    assert_int_equal(dsec_loop_new(&loop, "agent-test", &err), 0);
    dsec_agent *a = NULL;
    assert_int_equal(dsec_agent_connect(&a, sock_path, 2000, &err), 0);
    char f[160], missing[160], under[200];
    snprintf(f, sizeof f, "%s/loop/big.bin", tmpdir);
    snprintf(missing, sizeof missing, "%s/loop/missing", tmpdir);
    snprintf(under, sizeof under, "%s/loop/big.bin/x", tmpdir);
    size_t len = 20u << 20; /* three pieces: 8 + 8 + 4 MiB */
    uint8_t *buf = malloc(len);
    assert_non_null(buf);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)(i * 2654435761u >> 13);

    struct xfer_wait w = XFER_WAIT_INIT;
    assert_int_equal(
        dsec_agent_file_write_start(a, loop, f, buf, len, 0640, false, xfer_waited, &w, &err), 0);
    dsec_file_data d;
    assert_int_equal(dsec_agent_file_read(a, f, 0, 1, &d, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE); /* the connection is the transfer's */
    if (xfer_wait(&w) != 0)
        fail_msg("write on the loop: %s", w.err.msg);
    struct stat st;
    assert_int_equal(stat(f, &st), 0);
    assert_int_equal((size_t)st.st_size, len);
    assert_int_equal(st.st_mode & 0777, 0640);

    /* the whole file back, in pieces */
    struct xfer_wait r = XFER_WAIT_INIT;
    assert_int_equal(dsec_agent_file_read_start(a, loop, f, 0, 0, xfer_waited, &r, &err), 0);
    if (xfer_wait(&r) != 0)
        fail_msg("read on the loop: %s", r.err.msg);
    assert_int_equal(r.data.len, len);
    assert_int_equal(r.data.size, len);
    assert_true(r.data.eof);
    assert_memory_equal(r.data.data, buf, len);
    dsec_free(r.data.data);

    /* a window across the first piece's end, not to the end of the file */
    struct xfer_wait r2 = XFER_WAIT_INIT;
    uint64_t off = (8u << 20) - 5, max = (8u << 20) + 10;
    assert_int_equal(dsec_agent_file_read_start(a, loop, f, off, max, xfer_waited, &r2, &err), 0);
    if (xfer_wait(&r2) != 0)
        fail_msg("windowed read on the loop: %s", r2.err.msg);
    assert_int_equal(r2.data.len, max);
    assert_false(r2.data.eof);
    assert_memory_equal(r2.data.data, buf + off, max);
    dsec_free(r2.data.data);

    /* refusals: said, and the connection stays in step */
    struct xfer_wait e1 = XFER_WAIT_INIT;
    assert_int_equal(dsec_agent_file_read_start(a, loop, missing, 0, 0, xfer_waited, &e1, &err), 0);
    assert_int_equal(xfer_wait(&e1), -1);
    assert_int_equal(e1.err.code, DSEC_E_NOT_FOUND);
    struct xfer_wait e2 = XFER_WAIT_INIT;
    assert_int_equal(
        dsec_agent_file_write_start(a, loop, under, "x", 1, 0644, false, xfer_waited, &e2, &err),
        0);
    assert_int_equal(xfer_wait(&e2), -1);
    assert_int_equal(e2.err.code, DSEC_E_INVALID);
    assert_false(dsec_agent_broken(a));
    assert_int_equal(dsec_agent_file_read(a, f, 0, 4, &d, &err), 0);
    assert_memory_equal(d.data, buf, 4);
    dsec_free(d.data);
    /* a relative path is refused before anything is sent */
    struct xfer_wait e3 = XFER_WAIT_INIT;
    assert_int_equal(dsec_agent_file_read_start(a, loop, "rel", 0, 0, xfer_waited, &e3, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);

    /* an empty write makes an empty file */
    struct xfer_wait w0 = XFER_WAIT_INIT;
    assert_int_equal(
        dsec_agent_file_write_start(a, loop, f, NULL, 0, 0, false, xfer_waited, &w0, &err), 0);
    assert_int_equal(xfer_wait(&w0), 0);
    assert_int_equal(stat(f, &st), 0);
    assert_int_equal(st.st_size, 0);

    dsec_agent_free(a);
    dsec_loop_free(loop);
    free(buf);
}

static void test_malformed(void **state)
{
    uint8_t f[256], *p;
    int fd = raw_hello();

    /* Unknown type: an error, and the connection goes on. */
    p = dsec__agent_put_hdr(f, 99, 7, 0);
    raw_send(fd, f, (size_t)(p - f));
    expect_error(fd, 7, DSEC__AGENT_ERR_UNSUPPORTED);

    /* Payloads that are short, overlong or lie about lengths. */
    p = dsec__agent_put_hdr(f, DSEC__AGENT_T_EXEC, 8, 3);
    p = dsec__agent_put_u8(p, 1);
    p = dsec__agent_put_u8(p, 2);
    p = dsec__agent_put_u8(p, 3);
    raw_send(fd, f, (size_t)(p - f));
    expect_error(fd, 8, DSEC__AGENT_ERR_BAD_FRAME);

    uint8_t *pl = f + DSEC__AGENT_HDR;
    p = dsec__agent_put_u64(pl, 0);
    p = dsec__agent_put_u64(p, 100);
    p = dsec__agent_put_u32(p, 0);
    p = dsec__agent_put_u32(p, 0);
    p = dsec__agent_put_u32(p, 0xffffffffu); /* argc */
    dsec__agent_put_hdr(f, DSEC__AGENT_T_EXEC, 9, (size_t)(p - pl));
    raw_send(fd, f, (size_t)(p - f));
    expect_error(fd, 9, DSEC__AGENT_ERR_BAD_FRAME);

    p = dsec__agent_put_u64(pl, 0);
    p = dsec__agent_put_u64(p, 100);
    p = dsec__agent_put_u32(p, 0);
    p = dsec__agent_put_u32(p, 0);
    p = dsec__agent_put_u32(p, 1);
    p = dsec__agent_put_u32(p, 1000); /* argv[0] longer than the frame */
    p = dsec__agent_put_u8(p, 'x');
    dsec__agent_put_hdr(f, DSEC__AGENT_T_EXEC, 10, (size_t)(p - pl));
    raw_send(fd, f, (size_t)(p - f));
    expect_error(fd, 10, DSEC__AGENT_ERR_BAD_FRAME);

    p = dsec__agent_put_u64(pl, 0);
    p = dsec__agent_put_u64(p, 100);
    p = dsec__agent_put_u32(p, 0);
    p = dsec__agent_put_u32(p, 0);
    p = dsec__agent_put_u32(p, 1);
    p = dsec__agent_put_bytes(p, "/bin/t\0rue", 10); /* a NUL inside a string */
    p = dsec__agent_put_u32(p, 0);
    p = dsec__agent_put_u32(p, 0);
    dsec__agent_put_hdr(f, DSEC__AGENT_T_EXEC, 11, (size_t)(p - pl));
    raw_send(fd, f, (size_t)(p - f));
    expect_error(fd, 11, DSEC__AGENT_ERR_BAD_FRAME);

    p = dsec__agent_put_bytes(pl, "/", 1);
    p = dsec__agent_put_u8(p, 0); /* a byte too many */
    dsec__agent_put_hdr(f, DSEC__AGENT_T_FSTAT, 12, (size_t)(p - pl));
    raw_send(fd, f, (size_t)(p - f));
    expect_error(fd, 12, DSEC__AGENT_ERR_BAD_FRAME);

    /* Still in step: a good request on the same connection. */
    p = dsec__agent_put_bytes(pl, "/", 1);
    dsec__agent_put_hdr(f, DSEC__AGENT_T_FSTAT, 13, (size_t)(p - pl));
    raw_send(fd, f, (size_t)(p - f));
    uint8_t type, buf[4096];
    uint32_t id;
    size_t n;
    assert_int_equal(raw_frame(fd, &type, &id, buf, sizeof buf, &n, 2000), 0);
    assert_int_equal(type, DSEC__AGENT_T_ENTRIES);
    assert_int_equal(id, 13);

    /* Broken framing: an error, then the connection ends. */
    p = dsec__agent_put_u32(f, 2);
    raw_send(fd, f, 8);
    expect_error(fd, 0, DSEC__AGENT_ERR_BAD_FRAME);
    expect_eof(fd);
    close(fd);

    fd = raw_hello();
    p = dsec__agent_put_u32(f, 0xfffffff0u);
    raw_send(fd, f, 16);
    expect_error(fd, 0, DSEC__AGENT_ERR_BAD_FRAME);
    expect_eof(fd);
    close(fd);

    /* Noise, and a peer that leaves in the middle of a frame. */
    srand(42);
    for (int round = 0; round < 20; round++) {
        fd = raw_hello();
        uint8_t noise[512];
        for (size_t i = 0; i < sizeof noise; i++)
            noise[i] = (uint8_t)rand();
        if (round % 2)
            dsec__agent_put_u32(noise, (uint32_t)(rand() % 500) + 5);
        send(fd, noise, (size_t)(rand() % (int)sizeof noise) + 1, MSG_NOSIGNAL);
        close(fd);
    }
    fd = raw_hello();
    p = dsec__agent_put_hdr(f, DSEC__AGENT_T_FSTAT, 1, 100);
    raw_send(fd, f, (size_t)(p - f) + 3);
    close(fd);

    /* The agent lives and serves old and new connections. */
    assert_int_equal(waitpid(agent_pid, NULL, WNOHANG), 0);
    dsec_exec_result r;
    sh("echo alive", NULL, &r);
    assert_out(&r, "alive\n");
    dsec_exec_result_release(&r);
    dsec_agent *a;
    dsec_err err = {0};
    assert_int_equal(dsec_agent_connect(&a, sock_path, 2000, &err), 0);
    const char *t[] = {"/bin/true", NULL};
    assert_int_equal(run(a, t, NULL, &r, &err), 0);
    assert_int_equal(r.exit_code, 0);
    dsec_exec_result_release(&r);
    dsec_agent_free(a);
}

static long vm_rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

/* A peer that sends requests but does not read: the agent stops reading it instead of
 * buffering every answer, and carries on once the answers are taken. */
static void test_slow_reader(void **state)
{
    enum { NREQ = 24 };
    char path[128];
    snprintf(path, sizeof path, "%s/piece", tmpdir);
    size_t n = DSEC_AGENT_FILE_MAX;
    uint8_t *data = dsec_calloc(1, n);
    assert_non_null(data);
    dsec_err err = {0};
    assert_int_equal(dsec_agent_file_write(conn, path, data, n, 0, false, &err), 0);
    dsec_free(data);
    long before = vm_rss_kb(agent_pid);

    int fd = raw_hello();
    uint8_t f[256], *pl = f + DSEC__AGENT_HDR;
    for (uint32_t i = 1; i <= NREQ; i++) { /* 24 answers of 8 MiB: 192 MiB if all buffered */
        uint8_t *p = dsec__agent_put_u64(pl, 0);
        p = dsec__agent_put_u64(p, 0);
        p = dsec__agent_put_bytes(p, path, strlen(path));
        dsec__agent_put_hdr(f, DSEC__AGENT_T_FREAD, i, (size_t)(p - pl));
        raw_send(fd, f, (size_t)(p - f));
    }
    msleep(500);
    long during = vm_rss_kb(agent_pid);
    printf("agent RSS: %ld kB before, %ld kB with %d unread 8 MiB answers requested\n", before,
           during, NREQ);
    assert_true(during > 0 && during < 80 * 1024);

    /* Others are still served meanwhile. */
    dsec_exec_result r;
    sh("echo served", NULL, &r);
    assert_out(&r, "served\n");
    dsec_exec_result_release(&r);

    uint8_t *buf = dsec_malloc(DSEC__AGENT_FRAME_MAX);
    assert_non_null(buf);
    for (uint32_t i = 1; i <= NREQ; i++) {
        uint8_t type;
        uint32_t id;
        size_t len;
        assert_int_equal(raw_frame(fd, &type, &id, buf, DSEC__AGENT_FRAME_MAX, &len, 5000), 0);
        assert_int_equal(type, DSEC__AGENT_T_DATA);
        assert_int_equal(id, i);
        assert_int_equal(len, 8 + 1 + 4 + n);
    }
    dsec_free(buf);
    close(fd);
    assert_int_equal(unlink(path), 0);
}

/* Children of the agent that are not its shepherds (forks of the agent, named as it is). */
static int agent_children(pid_t agent, int *zombies)
{
    DIR *d = opendir("/proc");
    int n = 0;
    *zombies = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        pid_t pid = (pid_t)atoi(de->d_name);
        char st, path[64], comm[32] = {0};
        pid_t pp, pg;
        if (pid <= 0 || !proc_stat(pid, &st, &pp, &pg) || pp != agent)
            continue;
        if (st == 'Z') {
            (*zombies)++;
            n++;
            continue;
        }
        snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t l = fd < 0 ? -1 : read(fd, comm, sizeof comm - 1);
        if (fd >= 0)
            close(fd);
        if (l > 0 && strcmp(comm, "dsec-agent\n") != 0)
            n++;
    }
    if (d)
        closedir(d);
    return n;
}

/* The pid a command printed first. */
static pid_t printed_pid(const dsec_exec_result *r)
{
    char line[32] = {0};
    if (r->stdout_data)
        memcpy(line, r->stdout_data, r->stdout_len < 31 ? r->stdout_len : 31);
    return (pid_t)atoi(line);
}

/* Until the agent has no child but idle shepherds, live or zombie (3 s at most); zombies
 * among them go to *z. */
static int agent_children_settle(int *z)
{
    int left = -1;
    for (int i = 0; i < 300 && left != 0; i++) {
        left = agent_children(agent_pid, z);
        if (left)
            msleep(10);
    }
    return left;
}

static void test_zombies(void **state)
{
    /* The sleeper is orphaned at once (its subshell exits), and the exec ends with it still
     * running: the command's shepherd (which has it) kills and reaps it before the answer, so
     * nothing of the command is left, neither as a process nor as a zombie, and the agent's
     * only children are idle shepherds again. */
    dsec_exec_result r;
    sh("(sleep 30 & echo $!); exit 0", NULL, &r);
    assert_int_equal(r.exit_code, 0);
    pid_t orphan = printed_pid(&r);
    dsec_exec_result_release(&r);
    assert_true(orphan > 1);
    assert_int_equal(kill(orphan, 0), -1);
    int z;
    assert_int_equal(agent_children_settle(&z), 0);
    assert_int_equal(z, 0);

    /* At a timeout the orphan is killed and reaped by the command's shepherd before the
     * answer: nothing of the command is left, neither as a process nor as a zombie. */
    struct opts o = {.timeout_ms = 500};
    sh("(sleep 30 & echo $!); sleep 30", &o, &r);
    assert_true(r.timed_out);
    orphan = printed_pid(&r);
    dsec_exec_result_release(&r);
    assert_true(orphan > 1);
    assert_int_equal(kill(orphan, 0), -1);
    assert_int_equal(agent_children_settle(&z), 0);
    assert_int_equal(z, 0);
}

struct pid_catch {
    char buf[64];
    size_t len;
    int ready;
};

static void catch_pid(void *arg, int stream, const uint8_t *data, size_t len)
{
    struct pid_catch *c = arg;
    if (stream == 1 && c->len + len < sizeof c->buf) {
        memcpy(c->buf + c->len, data, len);
        c->len += len;
        if (memchr(c->buf, '\n', c->len))
            __atomic_store_n(&c->ready, 1, __ATOMIC_RELEASE);
    }
}

static void test_sigterm(void **state)
{
    /* Its own agent, on a path too long for sun_path (both sides go through the directory). */
    char dir[400], sock[460];
    snprintf(dir, sizeof dir, "%s/%s", tmpdir,
             "a-directory-name-long-enough-that-the-socket-path-cannot-fit-in-sun-path-"
             "which-holds-only-one-hundred-and-eight-bytes");
    assert_int_equal(mkdir(dir, 0700), 0);
    snprintf(sock, sizeof sock, "%s/agent.sock", dir);
    assert_true(strlen(sock) > sizeof(((struct sockaddr_un *)0)->sun_path));
    pid_t pid = start_agent(sock, base_env);
    assert_true(pid > 0);
    struct job j = {0};
    struct pid_catch pc = {0};
    dsec_err err = {0};
    assert_int_equal(dsec_agent_connect(&j.a, sock, 5000, &err), 0);
    new_mark(); /* a setsid'd sleeper too: the whole tree goes */
    j.line = "setsid sleep 300 & sleep 30 & echo $$; wait";
    j.o.env = mark_env;
    j.o.nenv = 1;
    j.o.fn = catch_pid;
    j.o.arg = &pc;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, job_run, &j), 0);
    for (int i = 0; i < 500 && !__atomic_load_n(&pc.ready, __ATOMIC_ACQUIRE); i++)
        msleep(10);
    assert_true(pc.ready);
    int pgid = atoi(pc.buf);
    assert_true(pgid > 1);

    assert_int_equal(kill(pid, SIGTERM), 0);
    int st = wait_exit(pid, 5000);
    assert_int_not_equal(st, -1);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    pthread_join(th, NULL);
    /* The command is reported killed before the agent goes; then the connection is gone. */
    assert_int_equal(j.rc, 0);
    assert_int_equal(j.r.signal, SIGKILL);
    dsec_exec_result_release(&j.r);
    dsec_exec_result r;
    const char *t[] = {"/bin/true", NULL};
    assert_int_equal(run(j.a, t, NULL, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_CLOSED);
    assert_true(dsec_agent_broken(j.a));
    dsec_agent_free(j.a);
    /* Its commands died with it (zombies at most, left to whoever adopts them). */
    int z = 0, left = -1;
    for (int i = 0; i < 200 && left != z; i++) {
        left = count_procs(0, pgid, &z);
        if (left != z)
            msleep(10);
    }
    assert_int_equal(left, z);
    assert_int_equal(marked_left(), 0);
    assert_int_equal(access(sock, F_OK), -1); /* it removed its socket */
}

/* The production start: a listening socket handed over as a descriptor, defaults from
 * an env file, a workdir and a default user; no descriptor of the agent reaches a command. */
static void test_listen_fd(void **state)
{
    char sock[128], envf[128], wd[128];
    snprintf(sock, sizeof sock, "%s/fd.sock", tmpdir);
    snprintf(envf, sizeof envf, "%s/env", tmpdir);
    snprintf(wd, sizeof wd, "%s/wd", tmpdir);
    assert_int_equal(mkdir(wd, 0755), 0);
    assert_int_equal(chmod(tmpdir, 0711), 0); /* nobody must reach wd */
    FILE *f = fopen(envf, "w");
    assert_non_null(f);
    fputs("# base environment\nPATH=/usr/bin:/bin\n\nFROMFILE=yes it is\n", f);
    fclose(f);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, sock);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(lfd, 16), 0);
    pid_t pid = fork_agent();
    if (pid == 0) {
        /* Fd 5 without CLOEXEC, as crun --preserve-fds passes it (dup2 onto itself would
         * keep the flag). */
        if (lfd == 5)
            fcntl(5, F_SETFD, 0);
        else
            dup2(lfd, 5);
        execl(DSEC_AGENT_PATH, DSEC_AGENT_PATH, "--listen-fd", "5", "--env-file", envf, "--workdir",
              wd, "--user", "nobody", (char *)NULL);
        _exit(127);
    }
    close(lfd);
    assert_true(pid > 0);
    dsec_agent *a;
    dsec_err err = {0};
    assert_int_equal(dsec_agent_connect(&a, sock, 5000, &err), 0);
    const char *argv[] = {"/bin/sh", "-c", "echo \"$FROMFILE\"; pwd; id -u; ls /proc/self/fd",
                          NULL};
    dsec_exec_result r;
    assert_int_equal(run(a, argv, NULL, &r, &err), 0);
    char want[256];
    /* 0-2 and the directory ls itself reads: nothing else. */
    snprintf(want, sizeof want, "yes it is\n%s\n65534\n0\n1\n2\n3\n", wd);
    if (r.stdout_len != strlen(want) || memcmp(r.stdout_data, want, r.stdout_len) != 0)
        fail_msg("got \"%.*s\" (stderr \"%.*s\")", (int)r.stdout_len, (char *)r.stdout_data,
                 (int)r.stderr_len, (char *)r.stderr_data);
    dsec_exec_result_release(&r);
    /* The request's user and cwd win over the defaults. */
    struct opts o = {.user = "root", .cwd = "/"};
    const char *argv2[] = {"/bin/sh", "-c", "id -u; pwd", NULL};
    assert_int_equal(run(a, argv2, &o, &r, &err), 0);
    assert_out(&r, "0\n/\n");
    dsec_exec_result_release(&r);
    dsec_agent_free(a);
    kill(pid, SIGTERM);
    int st = wait_exit(pid, 5000);
    assert_true(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    unlink(sock);
}

static void test_connect_timeout(void **state)
{
    char p[128];
    snprintf(p, sizeof p, "%s/nobody-listens.sock", tmpdir);
    dsec_agent *a = NULL;
    dsec_err err = {0};
    uint64_t t0 = now_us();
    assert_int_equal(dsec_agent_connect(&a, p, 150, &err), -1);
    uint64_t took = now_us() - t0;
    assert_int_equal(err.code, DSEC_E_TIMEOUT);
    assert_non_null(strstr(err.msg, p));
    assert_null(a);
    assert_true(took >= 140000 && took < 2000000);
}

struct connect_try {
    const char *path;
    int rc;
    dsec_err err;
    atomic_bool done;
};

static void *connect_try_main(void *arg)
{
    struct connect_try *c = arg;
    dsec_agent *a = NULL;
    c->rc = dsec_agent_connect(&a, c->path, 300, &c->err);
    dsec_agent_free(a);
    atomic_store(&c->done, true);
    return NULL;
}

/* An agent that does not accept (its sandbox frozen) with a full backlog: the connect gives
 * up at its deadline. A blocking connect waited for ever there, and held a node's bus worker
 * (seen in the rollout benchmark, behind a sandbox a failed fork left frozen). */
static void test_connect_backlog_full(void **state)
{
    char p[128];
    snprintf(p, sizeof p, "%s/never-accepts.sock", tmpdir);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    strcpy(sa.sun_path, p);
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(lfd, 1), 0);
    int filler[64], nfill = 0;
    for (; nfill < 64; nfill++) { /* fill the backlog */
        filler[nfill] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (connect(filler[nfill], (struct sockaddr *)&sa, sizeof sa) < 0) {
            assert_int_equal(errno, EAGAIN);
            close(filler[nfill]);
            break;
        }
    }
    assert_true(nfill < 64);
    static struct connect_try c;
    c = (struct connect_try){.path = p, .rc = 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, connect_try_main, &c), 0);
    for (int i = 0; i < 1000 && !atomic_load(&c.done); i++) /* 10 s for a 300 ms deadline */
        msleep(10);
    bool returned = atomic_load(&c.done);
    if (!returned) { /* unblock it: the listener goes, the blocked connect fails */
        close(lfd);
        lfd = -1;
        unlink(p);
    }
    pthread_join(th, NULL);
    if (!returned)
        fail_msg("dsec_agent_connect to a listener that never accepts did not return");
    assert_int_equal(c.rc, -1);
    assert_int_equal(c.err.code, DSEC_E_TIMEOUT);
    for (int i = 0; i < nfill; i++)
        close(filler[i]);
    if (lfd >= 0)
        close(lfd);
    unlink(p);
}

/* ---- SYNC: a fresh start on a channel that may hold an earlier client's bytes ------------------
 */

/* A scripted peer on a unix socket: greets, answers each SYNC the way the mode says, and then
 * the first other request with OK (its id). */
enum { PEER_STALE = 1, PEER_OLD_AGENT, PEER_WRONG_NONCE };
struct peer {
    int lfd, mode;
    uint32_t nonce; /* the SYNC's id as seen */
};

static void put_frame(int fd, uint8_t type, uint32_t id, const void *payload, size_t n)
{
    uint8_t f[256];
    uint8_t *p = dsec__agent_put_hdr(f, type, id, n);
    memcpy(p, payload, n);
    assert_int_equal(write(fd, f, DSEC__AGENT_HDR + n), (ssize_t)(DSEC__AGENT_HDR + n));
}

static void *peer_main(void *arg)
{
    struct peer *pe = arg;
    int fd = accept4(pe->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return NULL;
    uint8_t hello[8];
    dsec__agent_put_u32(dsec__agent_put_u32(hello, DSEC__AGENT_VERSION), DSEC__AGENT_FRAME_MAX);
    put_frame(fd, DSEC__AGENT_T_HELLO, 0, hello, sizeof hello); /* the greeting on arrival */
    /* answer every SYNC the way the mode says; the first other request gets OK with its id */
    for (int syncs = 0;; syncs++) {
        uint8_t req[DSEC__AGENT_HDR + 512];
        ssize_t n = read(fd, req, DSEC__AGENT_HDR);
        if (n != (ssize_t)DSEC__AGENT_HDR)
            break;
        uint32_t flen = dsec__agent_get_u32le(req);
        uint32_t id = dsec__agent_get_u32le(req + 5);
        if (flen > 5 && flen - 5 < sizeof req - DSEC__AGENT_HDR &&
            read(fd, req + DSEC__AGENT_HDR, flen - 5) != (ssize_t)(flen - 5))
            break;
        if (req[4] != DSEC__AGENT_T_SYNC) {
            uint8_t v[8] = {0};
            put_frame(fd, DSEC__AGENT_T_OK, id, v, sizeof v);
            break;
        }
        pe->nonce = id;
        if (pe->mode == PEER_STALE) {
            if (syncs == 0) {
                /* an earlier client's answer cut in half, then a whole one */
                uint8_t junk[40];
                uint8_t *p = dsec__agent_put_hdr(junk, DSEC__AGENT_T_OUTPUT, 5, 200);
                memset(p, 0xab, sizeof junk - DSEC__AGENT_HDR);
                assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
                uint8_t v[8] = {0};
                put_frame(fd, DSEC__AGENT_T_OK, 6, v, sizeof v);
            }
            put_frame(fd, DSEC__AGENT_T_HELLO, id, hello, sizeof hello);
        } else if (pe->mode == PEER_OLD_AGENT) {
            /* an agent from before SYNC: "unknown request type 23" */
            uint8_t e[64];
            const char *msg = "unknown request type 23";
            uint8_t *p = dsec__agent_put_u32(e, DSEC__AGENT_ERR_UNSUPPORTED);
            p = dsec__agent_put_u32(p, 0);
            p = dsec__agent_put_bytes(p, msg, strlen(msg));
            put_frame(fd, DSEC__AGENT_T_ERROR, id, e, (size_t)(p - e));
        } else {
            put_frame(fd, DSEC__AGENT_T_HELLO, id ^ 1, hello, sizeof hello);
        }
    }
    usleep(200000);
    close(fd);
    return NULL;
}

static int peer_listen(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    unlink(path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 4), 0);
    return fd;
}

/* Each scripted peer that answers (stale bytes before the HELLO, an agent from before SYNC),
 * reached with connect(path, arg): the stream is in step afterwards. */
static void peers_answering(dsec_agent *(*connect)(const char *path, void *arg), void *arg)
{
    int modes[] = {PEER_STALE, PEER_OLD_AGENT};
    for (size_t m = 0; m < 2; m++) {
        char p[128];
        snprintf(p, sizeof p, "%s/peer.sock", tmpdir);
        struct peer pe = {.lfd = peer_listen(p), .mode = modes[m]};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, peer_main, &pe), 0);
        dsec_agent *a = connect(p, arg);
        assert_int_not_equal(pe.nonce, 0);
        /* the stream is in step: the next answer is the one to our request */
        dsec_err err = {0};
        assert_int_equal(dsec_agent_file_write(a, "/x", "y", 1, 0644, false, &err), 0);
        dsec_agent_free(a);
        pthread_join(t, NULL);
        close(pe.lfd);
        unlink(p);
    }
}

static dsec_agent *connect_now(const char *path, void *arg)
{
    (void)arg;
    dsec_agent *a = NULL;
    dsec_err err = {0};
    assert_int_equal(dsec_agent_connect(&a, path, 5000, &err), 0);
    return a;
}

static void test_sync_skips_stale_bytes(void **state)
{
    peers_answering(connect_now, NULL);
}

/* A HELLO with somebody else's nonce is not ours: the client keeps waiting and gives up. */
static void test_sync_wrong_nonce(void **state)
{
    char p[128];
    snprintf(p, sizeof p, "%s/peer.sock", tmpdir);
    struct peer pe = {.lfd = peer_listen(p), .mode = PEER_WRONG_NONCE};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, peer_main, &pe), 0);
    dsec_agent *a = NULL;
    dsec_err err = {0};
    assert_int_equal(dsec_agent_connect(&a, p, 1000, &err), -1);
    assert_int_equal(err.code, DSEC_E_TIMEOUT);
    assert_null(a);
    close(pe.lfd); /* the peer's accept for a retry fails: it ends */
    pthread_join(t, NULL);
    unlink(p);
}

/* ---- connecting on the loop (dsec_agent_connect_start: a VM's boot holds no thread) --------- */

struct dial_wait {
    atomic_bool ended;
    int rc;
    dsec_err err;
    dsec_agent *a;
    atomic_int alive_asked;
    bool alive_says_no; /* alive answers false (the peer went away) */
};

static void dial_ended(void *ud, int rc, dsec_agent *a, dsec_err *err)
{
    struct dial_wait *w = ud;
    w->rc = rc;
    w->a = a;
    if (rc < 0)
        w->err = *err;
    atomic_store(&w->ended, true);
}

static bool dial_alive(void *ud, dsec_err *err)
{
    struct dial_wait *w = ud;
    atomic_fetch_add(&w->alive_asked, 1);
    if (!w->alive_says_no)
        return true;
    dsec_err_set(err, DSEC_E_BACKEND, 0, "the peer went away");
    return false;
}

static dsec_loop *loop_for_test(void)
{
    dsec_err err = {0};
    dsec_loop *loop = NULL;
    assert_int_equal(dsec_loop_new(&loop, "agent-test", &err), 0);
    return loop;
}

static void timer_fired(dsec_loop_watch *w, unsigned events, void *ud)
{
    (void)w;
    (void)events;
    atomic_store((atomic_bool *)ud, true);
}

/* Wait up to ms for the dial's end; it must come. */
static void dial_wait_end(struct dial_wait *w, int ms)
{
    for (int i = 0; i < ms / 10 && !atomic_load(&w->ended); i++)
        usleep(10000);
    assert_true(atomic_load(&w->ended));
}

static dsec_agent *connect_on_loop(const char *path, void *loop)
{
    dsec_err err = {0};
    struct dial_wait w = {0};
    assert_int_equal(dsec_agent_connect_start(loop, path, 5000, 0, NULL, dial_ended, &w, &err), 0);
    dial_wait_end(&w, 5000);
    assert_int_equal(w.rc, 0);
    return w.a;
}

/* An agent that starts serving after the dial began (a VM still booting): the dial keeps
 * connecting until it answers, and the connection it hands over takes calls. Meanwhile the
 * loop's thread is free: a timer on it fires on time. */
static void test_dial_on_loop(void **state)
{
    dsec_err err = {0};
    dsec_loop *loop = loop_for_test();
    char sock[300];
    snprintf(sock, sizeof sock, "%s/dial-late.sock", tmpdir);
    unlink(sock);
    struct dial_wait w = {0};
    assert_int_equal(
        dsec_agent_connect_start(loop, sock, 10000, 0, dial_alive, dial_ended, &w, &err), 0);
    atomic_bool fired = false;
    assert_int_equal(dsec_loop_add(loop, -1, 0, dsec_loop_now_ns() + 100000000u, timer_fired,
                                   &fired, NULL, &err),
                     0);
    usleep(300000);
    assert_false(atomic_load(&w.ended)); /* nobody serves the path yet */
    assert_true(atomic_load(&fired));
    pid_t pid = start_agent(sock, NULL);
    assert_true(pid > 0);
    dial_wait_end(&w, 10000);
    assert_int_equal(w.rc, 0);
    assert_non_null(w.a);
    char f[360];
    snprintf(f, sizeof f, "%s/dialed", tmpdir);
    assert_int_equal(dsec_agent_file_write(w.a, f, "y", 1, 0644, false, &err), 0);
    dsec_agent_free(w.a);
    kill(pid, SIGTERM);
    assert_int_not_equal(wait_exit(pid, 5000), -1);

    peers_answering(connect_on_loop, loop);
    dsec_loop_free(loop);
}

/* How a dial that gets no answer ends: at its timeout (naming the path), when alive says the
 * peer is gone (within about a second, not at the timeout), after a HELLO with somebody else's
 * nonce (at its timeout), and when the node stops (at once). */
static void test_dial_fails(void **state)
{
    dsec_err err = {0};
    dsec_loop *loop = loop_for_test();
    char p[128];
    snprintf(p, sizeof p, "%s/nobody-listens.sock", tmpdir);
    struct dial_wait w = {0};
    assert_int_equal(dsec_agent_connect_start(loop, p, 200, 0, dial_alive, dial_ended, &w, &err),
                     0);
    dial_wait_end(&w, 5000);
    assert_int_equal(w.rc, -1);
    assert_int_equal(w.err.code, DSEC_E_TIMEOUT);
    assert_non_null(strstr(w.err.msg, p));
    assert_null(w.a);

    struct dial_wait gone = {.alive_says_no = true};
    uint64_t t0 = now_us();
    assert_int_equal(
        dsec_agent_connect_start(loop, p, 60000, 0, dial_alive, dial_ended, &gone, &err), 0);
    dial_wait_end(&gone, 10000);
    assert_true(now_us() - t0 < 30000000); /* long before its timeout */
    assert_int_equal(gone.rc, -1);
    assert_int_equal(gone.err.code, DSEC_E_BACKEND);
    assert_string_equal(gone.err.msg, "the peer went away");
    assert_int_equal(atomic_load(&gone.alive_asked), 1);

    snprintf(p, sizeof p, "%s/peer.sock", tmpdir);
    struct peer pe = {.lfd = peer_listen(p), .mode = PEER_WRONG_NONCE};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, peer_main, &pe), 0);
    struct dial_wait wrong = {0};
    assert_int_equal(dsec_agent_connect_start(loop, p, 1000, 200, NULL, dial_ended, &wrong, &err),
                     0);
    dial_wait_end(&wrong, 5000);
    assert_int_equal(wrong.rc, -1);
    assert_int_equal(wrong.err.code, DSEC_E_TIMEOUT);
    close(pe.lfd); /* the peer's accept for a retry fails: it ends */
    pthread_join(t, NULL);
    unlink(p);

    snprintf(p, sizeof p, "%s/nobody-listens.sock", tmpdir);
    struct dial_wait stopped = {0};
    assert_int_equal(dsec_agent_connect_start(loop, p, 60000, 0, NULL, dial_ended, &stopped, &err),
                     0);
    dsec_loop_stop(loop);
    assert_true(atomic_load(&stopped.ended));
    assert_int_equal(stopped.rc, -1);
    assert_int_equal(stopped.err.code, DSEC_E_CLOSED);
    assert_int_equal(dsec_agent_connect_start(loop, p, 1000, 0, NULL, dial_ended, &w, &err), -1);
    assert_int_equal(err.code, DSEC_E_CLOSED);
    dsec_loop_free(loop);
}

/* ---- speed (printed, not asserted) -------------------------------------------------------------
 */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void measure(const char *label, const char *const *argv)
{
    enum { N = 300 };
    static uint64_t t[N];
    dsec_exec_result r;
    dsec_err err = {0};
    for (int i = 0; i < 20; i++) { /* warm caches */
        assert_int_equal(run(conn, argv, NULL, &r, &err), 0);
        dsec_exec_result_release(&r);
    }
    uint64_t sum = 0;
    for (int i = 0; i < N; i++) {
        uint64_t t0 = now_us();
        assert_int_equal(run(conn, argv, NULL, &r, &err), 0);
        t[i] = now_us() - t0;
        sum += t[i];
        dsec_exec_result_release(&r);
    }
    qsort(t, N, sizeof t[0], cmp_u64);
    printf("exec round trip, %-32s mean %4llu us  median %4llu us  p90 %4llu us  min %4llu us\n",
           label, (unsigned long long)(sum / N), (unsigned long long)t[N / 2],
           (unsigned long long)t[N * 9 / 10], (unsigned long long)t[0]);
}

/* The floor: posix_spawn (a vfork-style clone), exec and wait straight from this process. */
static void measure_direct(const char *label, const char *const *argv)
{
    enum { N = 300 };
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    uint64_t t0 = now_us();
    for (int i = 0; i < N; i++) {
        pid_t pid;
        assert_int_equal(posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ), 0);
        waitpid(pid, NULL, 0);
    }
    printf("direct spawn+exec+wait, %-31s mean %4llu us\n", label,
           (unsigned long long)((now_us() - t0) / N));
    posix_spawn_file_actions_destroy(&fa);
}

/* ---- background processes ------------------------------------------------------------------
 */

/* Wait up to 5 s for n marked sleeps; how many there are. */
static int wait_sleeps(int n)
{
    int have = 0;
    for (int i = 0; i < 500 && (have = count_marked(true, false)) < n; i++)
        msleep(10);
    return have;
}

/* Start a shell line as a background process on a; its info in *info. */
static void pstart(dsec_agent *a, const char *line, uint64_t ring_max, bool keep_stdin,
                   uint64_t timeout_ms, dsec_proc_info *info)
{
    const char *argv[] = {"/bin/sh", "-c", line, NULL};
    dsec_proc_start_req req = {
        .exec = {.argv = argv, .argc = 3, .env = mark_env, .nenv = 1, .timeout_ms = timeout_ms},
        .ring_max = ring_max,
        .keep_stdin = keep_stdin,
    };
    dsec_err err = {0};
    if (dsec_agent_proc_start(a, &req, info, &err) < 0)
        fail_msg("start %s: %s", line, err.msg);
    assert_true(info->handle > 0);
    assert_true(info->pid > 0);
    assert_true(info->running);
}

/* The listed info of handle; false when it is not listed. */
static bool plisted(dsec_agent *a, uint64_t handle, dsec_proc_info *info)
{
    dsec_proc_info *v = NULL;
    size_t n = 0;
    dsec_err err = {0};
    if (dsec_agent_proc_list(a, &v, &n, &err) < 0)
        fail_msg("list processes: %s", err.msg);
    bool found = false;
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            assert_true(v[i].handle > v[i - 1].handle); /* by handle */
        if (v[i].handle == handle) {
            *info = v[i];
            found = true;
        }
    }
    dsec_free(v);
    return found;
}

/* Wait up to ms for handle to end; its last info. */
static dsec_proc_info pwait(dsec_agent *a, uint64_t handle, int ms)
{
    dsec_proc_info info = {0};
    for (int i = 0; i < ms; i += 10) {
        assert_true(plisted(a, handle, &info));
        if (!info.running)
            return info;
        msleep(10);
    }
    fail_msg("process %llu still runs after %d ms", (unsigned long long)handle, ms);
    return info;
}

static void poutput(dsec_agent *a, uint64_t handle, uint64_t out_off, uint64_t err_off,
                    uint64_t max, dsec_proc_output *o)
{
    dsec_err err = {0};
    if (dsec_agent_proc_output(a, handle, out_off, err_off, max, o, &err) < 0)
        fail_msg("output of %llu: %s", (unsigned long long)handle, err.msg);
    assert_int_equal(o->info.handle, handle);
}

/* A background process outlives its connection and the SYNC of the next; its output is kept;
 * a signal ends it, and it stays listed with how it ended. */
static void test_proc_detached(void **state)
{
    new_mark();
    dsec_agent *a = NULL;
    dsec_err err = {0};
    assert_int_equal(dsec_agent_connect(&a, sock_path, 2000, &err), 0);
    dsec_proc_info info;
    pstart(a, "echo out; echo err >&2; sleep 30", 0, false, 0, &info);
    uint64_t h = info.handle;
    assert_string_equal(info.cmdline, "/bin/sh -c echo out; echo err >&2; sleep 30");
    assert_false(info.stdin_open);
    assert_int_equal(info.ended_ns, 0);
    dsec_agent_free(a); /* the connection goes; the process stays */
    assert_int_equal(dsec_agent_connect(&a, sock_path, 2000, &err), 0); /* SYNC */
    assert_true(plisted(a, h, &info));
    assert_true(info.running);
    assert_int_equal(wait_sleeps(1), 1); /* its sleep runs */

    dsec_proc_output o = {0};
    for (int i = 0; i < 500; i++) {
        poutput(a, h, 0, 0, 0, &o);
        if (o.info.out_total == 4 && o.info.err_total == 4)
            break;
        dsec_proc_output_release(&o);
        msleep(10);
    }
    assert_int_equal(o.out_from, 0);
    assert_int_equal(o.err_from, 0);
    assert_int_equal(o.out_len, 4);
    assert_memory_equal(o.out, "out\n", 4);
    assert_int_equal(o.err_len, 4);
    assert_memory_equal(o.err, "err\n", 4);
    assert_true(o.info.running);
    dsec_proc_output_release(&o);
    poutput(a, h, 2, 4, 0, &o); /* from an offset: the rest */
    assert_int_equal(o.out_from, 2);
    assert_int_equal(o.out_len, 2);
    assert_memory_equal(o.out, "t\n", 2);
    assert_int_equal(o.err_from, 4);
    assert_int_equal(o.err_len, 0);
    dsec_proc_output_release(&o);

    assert_int_equal(dsec_agent_proc_signal(a, h, SIGTERM, &err), 0);
    info = pwait(a, h, 5000);
    assert_false(info.running);
    assert_int_equal(info.signal, SIGTERM);
    assert_int_equal(info.exit_code, -1);
    assert_false(info.timed_out);
    assert_true(info.ended_ns >= info.started_ns && info.started_ns > 0);
    assert_int_equal(marked_left(), 0); /* its tree went with it */
    expect_fail(dsec_agent_proc_signal(a, h, SIGTERM, &err), &err, DSEC_E_STATE,
                "already exited by signal 15");
    assert_false(dsec_agent_broken(a));
    poutput(a, h, 0, 0, 0, &o); /* its output stays */
    assert_int_equal(o.out_len, 4);
    dsec_proc_output_release(&o);

    uint64_t none = h + 1000000;
    expect_fail(dsec_agent_proc_signal(a, none, SIGTERM, &err), &err, DSEC_E_NOT_FOUND,
                "no process with handle");
    expect_fail(dsec_agent_proc_output(a, none, 0, 0, 0, &o, &err), &err, DSEC_E_NOT_FOUND,
                "in this sandbox");
    expect_fail(dsec_agent_proc_stdin(a, none, "x", 1, false, &err), &err, DSEC_E_NOT_FOUND, NULL);
    assert_false(dsec_agent_broken(a));
    dsec_agent_free(a);
}

/* The ring keeps the last ring_max bytes of 1 MiB; out_total counts all of it. */
static void test_proc_ring(void **state)
{
    new_mark();
    dsec_proc_info info;
    /* 131072 lines of 8 bytes: line k at offset 8k reads %07d k */
    pstart(conn, "seq -f %07g 0 131071", 64 << 10, false, 0, &info);
    info = pwait(conn, info.handle, 10000);
    assert_int_equal(info.exit_code, 0);
    assert_int_equal(info.out_total, 1 << 20);
    assert_int_equal(info.err_total, 0);
    dsec_proc_output o;
    poutput(conn, info.handle, 0, 0, 0, &o);
    assert_int_equal(o.out_from, (1 << 20) - (64 << 10));
    assert_int_equal(o.out_len, 64 << 10);
    assert_int_equal(o.err_len, 0);
    char want[16];
    for (size_t k = 0; k < 8192; k++) {
        snprintf(want, sizeof want, "%07zu\n", 131072 - 8192 + k);
        if (memcmp(o.out + 8 * k, want, 8) != 0)
            fail_msg("line %zu of the ring: %.8s, want %s", k, (const char *)o.out + 8 * k, want);
    }
    dsec_proc_output_release(&o);
    uint64_t at = (1 << 20) - 16; /* max: 10 bytes from two lines before the end */
    poutput(conn, info.handle, at, 0, 10, &o);
    assert_int_equal(o.out_from, at);
    assert_int_equal(o.out_len, 10);
    assert_memory_equal(o.out, "0131070\n01", 10);
    dsec_proc_output_release(&o);
    poutput(conn, info.handle, 2 << 20, 0, 0, &o); /* past the end: nothing, from the end */
    assert_int_equal(o.out_from, 1 << 20);
    assert_int_equal(o.out_len, 0);
    dsec_proc_output_release(&o);

    /* ring_max over the limit */
    const char *argv[] = {"/bin/true", NULL};
    dsec_proc_start_req req = {.exec = {.argv = argv, .argc = 1},
                               .ring_max = DSEC_PROC_RING_MAX + 1ull};
    dsec_err err = {0};
    expect_fail(dsec_agent_proc_start(conn, &req, &info, &err), &err, DSEC_E_TOO_LARGE, "ring_max");
}

/* stdin: written on request, closed on request; a big write is answered once the process
 * took it all. */
static void test_proc_stdin(void **state)
{
    new_mark();
    dsec_err err = {0};
    dsec_proc_info info;
    pstart(conn, "cat", 0, true, 0, &info);
    assert_true(info.stdin_open);
    assert_int_equal(dsec_agent_proc_stdin(conn, info.handle, "hello", 5, true, &err), 0);
    info = pwait(conn, info.handle, 5000);
    assert_int_equal(info.exit_code, 0);
    assert_false(info.stdin_open);
    dsec_proc_output o;
    poutput(conn, info.handle, 0, 0, 0, &o);
    assert_int_equal(o.out_len, 5);
    assert_memory_equal(o.out, "hello", 5);
    dsec_proc_output_release(&o);
    expect_fail(dsec_agent_proc_stdin(conn, info.handle, "x", 1, false, &err), &err, DSEC_E_INVALID,
                "ended");

    /* Without keep_stdin, stdin is closed from the start. */
    pstart(conn, "sleep 30", 0, false, 0, &info);
    assert_false(info.stdin_open);
    expect_fail(dsec_agent_proc_stdin(conn, info.handle, "x", 1, false, &err), &err, DSEC_E_INVALID,
                "stdin of process");
    assert_int_equal(dsec_agent_proc_signal(conn, info.handle, SIGKILL, &err), 0);
    pwait(conn, info.handle, 5000);

    /* 4 MiB to a process that starts reading after 1 s: the answer waits for it. */
    pstart(conn, "sleep 1; wc -c", 0, true, 0, &info);
    size_t big = 4u << 20;
    uint8_t *data = malloc(big);
    assert_non_null(data);
    for (size_t i = 0; i < big; i++)
        data[i] = (uint8_t)(i * 7 + i / 4096);
    uint64_t t0 = now_us();
    assert_int_equal(dsec_agent_proc_stdin(conn, info.handle, data, big, false, &err), 0);
    uint64_t took = now_us() - t0;
    assert_true(plisted(conn, info.handle, &info));
    assert_true(info.running);
    assert_true(info.stdin_open);
    assert_int_equal(dsec_agent_proc_stdin(conn, info.handle, data, 3, true, &err), 0);
    info = pwait(conn, info.handle, 20000);
    free(data);
    fprintf(stderr, "proc_stdin: 4 MiB taken after %llu ms\n", (unsigned long long)took / 1000);
    assert_true(took >= 800000); /* not before the reader started */
    assert_int_equal(info.exit_code, 0);
    poutput(conn, info.handle, 0, 0, 0, &o);
    char want[64];
    int wl = snprintf(want, sizeof want, "%zu\n", big + 3); /* every byte of both writes */
    assert_int_equal(o.out_len, (size_t)wl);
    assert_memory_equal(o.out, want, (size_t)wl);
    dsec_proc_output_release(&o);
}

struct stdin_job {
    uint64_t handle;
    const uint8_t *data;
    size_t len;
    int rc;
    dsec_err err;
};

static void *stdin_run(void *arg)
{
    struct stdin_job *j = arg;
    dsec_agent *a = NULL;
    j->rc = dsec_agent_connect(&a, sock_path, 2000, &j->err);
    if (j->rc == 0)
        j->rc = dsec_agent_proc_stdin(a, j->handle, j->data, j->len, false, &j->err);
    dsec_agent_free(a);
    return NULL;
}

/* One PSTDIN waits at a time: a second one meanwhile is refused. A PSTDIN whose connection
 * went before the process took the bytes still delivers them all. */
static void test_proc_stdin_pending(void **state)
{
    dsec_err err = {0};
    dsec_proc_info info;
    pstart(conn, "sleep 1; wc -c", 0, true, 0, &info);
    size_t big = 4u << 20;
    uint8_t *data = calloc(1, big);
    assert_non_null(data);
    struct stdin_job j = {.handle = info.handle, .data = data, .len = big};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, stdin_run, &j), 0);
    /* An empty write is taken at once while none waits, and refused once the thread's does:
     * probe until it is (the thread connects and sends when it gets to run). */
    int probe;
    for (int i = 0; (probe = dsec_agent_proc_stdin(conn, info.handle, "x", 0, false, &err)) == 0;
         i++) {
        if (i == 500) {
            pthread_join(th, NULL);
            fail_msg("the thread's 4 MiB write was never seen waiting (its rc %d: %s)", j.rc,
                     j.err.msg);
        }
        msleep(10);
    }
    expect_fail(probe, &err, DSEC_E_STATE, "has not taken the bytes of an earlier write");
    expect_fail(dsec_agent_proc_stdin(conn, info.handle, "x", 1, false, &err), &err, DSEC_E_STATE,
                "has not taken the bytes of an earlier write");
    pthread_join(th, NULL);
    if (j.rc < 0)
        fail_msg("the first write: %s", j.err.msg);
    assert_int_equal(dsec_agent_proc_stdin(conn, info.handle, "x", 1, true, &err), 0);
    info = pwait(conn, info.handle, 10000);
    dsec_proc_output o;
    poutput(conn, info.handle, 0, 0, 0, &o);
    assert_int_equal(o.out_len, 8);
    assert_memory_equal(o.out, "4194305\n", 8);
    dsec_proc_output_release(&o);

    /* the writer hangs up at once: a raw PSTDIN frame, then close */
    pstart(conn, "sleep 1; wc -c", 0, true, 0, &info);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    assert_true(strlen(sock_path) < sizeof sa.sun_path);
    memcpy(sa.sun_path, sock_path, strlen(sock_path) + 1);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    size_t plen = 8 + 1 + 4 + big;
    uint8_t *f = malloc(DSEC__AGENT_HDR + plen + DSEC__AGENT_HDR), *p = f;
    assert_non_null(f);
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_PSTDIN, 1, plen);
    p = dsec__agent_put_u64(p, info.handle);
    p = dsec__agent_put_u8(p, 0);
    p = dsec__agent_put_bytes(p, data, big);
    p = dsec__agent_put_hdr(p, DSEC__AGENT_T_PLIST, 2, 0); /* answered once PSTDIN was read */
    for (size_t off = 0; off < (size_t)(p - f);) {
        ssize_t n = send(fd, f + off, (size_t)(p - f) - off, MSG_NOSIGNAL);
        assert_true(n > 0);
        off += (size_t)n;
    }
    uint8_t type = 0;
    while (type != DSEC__AGENT_T_PROCS) { /* HELLO, then PROCS */
        uint8_t hdr[DSEC__AGENT_HDR];
        assert_int_equal(recv(fd, hdr, sizeof hdr, MSG_WAITALL), sizeof hdr);
        type = hdr[4];
        size_t rest = dsec__agent_get_u32le(hdr) - 5;
        assert_true(rest <= big);
        assert_int_equal(recv(fd, f, rest, MSG_WAITALL), rest);
    }
    close(fd); /* before the process took the 4 MiB */
    free(f);
    free(data);
    /* behind the pending bytes of the writer that left: answered once all are taken */
    assert_int_equal(dsec_agent_proc_stdin(conn, info.handle, "", 0, true, &err), 0);
    info = pwait(conn, info.handle, 10000);
    assert_int_equal(info.exit_code, 0);
    poutput(conn, info.handle, 0, 0, 0, &o);
    assert_int_equal(o.out_len, 8);
    assert_memory_equal(o.out, "4194304\n", 8);
    dsec_proc_output_release(&o);
}

/* SIGKILL ends the whole tree, setsid'd descendants included. */
static void test_proc_tree(void **state)
{
    new_mark();
    dsec_err err = {0};
    dsec_proc_info info;
    pstart(conn, "setsid sh -c \"sleep 100\" & sleep 100 & wait", 0, false, 0, &info);
    assert_int_equal(wait_sleeps(2), 2);
    assert_int_equal(dsec_agent_proc_signal(conn, info.handle, SIGKILL, &err), 0);
    info = pwait(conn, info.handle, 5000);
    assert_int_equal(info.signal, SIGKILL);
    assert_false(info.timed_out);
    assert_int_equal(count_marked(false, false), 0); /* gone by the time it is listed ended */
    assert_int_equal(marked_left(), 0);

    /* Another signal goes to its process group; its main process ending ends the rest. */
    pstart(conn, "setsid sh -c \"sleep 100\" & sleep 100; echo not here", 0, false, 0, &info);
    assert_int_equal(wait_sleeps(2), 2);
    assert_int_equal(dsec_agent_proc_signal(conn, info.handle, SIGINT, &err), 0);
    info = pwait(conn, info.handle, 5000);
    assert_int_equal(info.signal, SIGINT);
    assert_int_equal(count_marked(false, false), 0);
    assert_int_equal(marked_left(), 0);
}

/* A foreground exec's leftovers end with it. */
static void test_exec_leaves_nothing(void **state)
{
    new_mark();
    struct opts o = {.env = mark_env, .nenv = 1};
    dsec_exec_result r;
    uint64_t t0 = now_us();
    sh("sleep 100.123 & echo started", &o, &r);
    uint64_t took = now_us() - t0;
    assert_int_equal(r.exit_code, 0);
    assert_out(&r, "started\n");
    dsec_exec_result_release(&r);
    int left = marked_left();
    assert_int_equal(left, 0);
    assert_true(took < 5000000);
}

/* timeout_ms ends a background process's tree and says so. */
static void test_proc_timeout(void **state)
{
    new_mark();
    dsec_proc_info info;
    uint64_t t0 = now_us();
    pstart(conn, "sleep 30 & sleep 30", 0, false, 300, &info);
    info = pwait(conn, info.handle, 10000);
    assert_true(info.timed_out);
    assert_int_equal(info.signal, SIGKILL);
    assert_true(now_us() - t0 >= 300000);
    assert_int_equal(marked_left(), 0);
}

/* At the limit the oldest ended process is forgotten (handles are never reused); with all
 * of them running, a start is refused. The limit is lowered for the test (--proc-max). */
static void test_proc_limit(void **state)
{
    new_mark();
    char sock[128];
    snprintf(sock, sizeof sock, "%s/limit.sock", tmpdir);
    const char *extra[] = {base_env[0], base_env[1], "--proc-max", "4", NULL};
    pid_t pid = start_agent(sock, extra);
    dsec_agent *a = NULL;
    dsec_err err = {0};
    assert_int_equal(dsec_agent_connect(&a, sock, 5000, &err), 0);
    dsec_proc_info info;
    for (uint64_t i = 1; i <= 4; i++) {
        pstart(a, "sleep 30", 0, false, 0, &info);
        assert_int_equal(info.handle, i);
    }
    const char *argv[] = {"/bin/sh", "-c", "sleep 30", NULL};
    dsec_proc_start_req req = {.exec = {.argv = argv, .argc = 3, .env = mark_env, .nenv = 1}};
    expect_fail(dsec_agent_proc_start(a, &req, &info, &err), &err, DSEC_E_TOO_LARGE,
                "4 background processes are running");
    assert_false(dsec_agent_broken(a));
    assert_int_equal(dsec_agent_proc_signal(a, 2, SIGKILL, &err), 0);
    pwait(a, 2, 5000);
    pstart(a, "sleep 30", 0, false, 0, &info);
    assert_int_equal(info.handle, 5); /* not 2 again */
    dsec_proc_info *v;
    size_t n;
    assert_int_equal(dsec_agent_proc_list(a, &v, &n, &err), 0);
    assert_int_equal(n, 4);
    uint64_t want[] = {1, 3, 4, 5};
    for (size_t i = 0; i < n; i++)
        assert_int_equal(v[i].handle, want[i]);
    dsec_free(v);
    dsec_proc_output o;
    expect_fail(dsec_agent_proc_output(a, 2, 0, 0, 0, &o, &err), &err, DSEC_E_NOT_FOUND, NULL);
    assert_int_equal(wait_sleeps(4), 4);
    dsec_agent_free(a);
    /* The agent's SIGTERM ends them all. */
    kill(pid, SIGTERM);
    assert_true(wait_exit(pid, 5000) != -1);
    assert_int_equal(marked_left(), 0);
}

/* Each background process holds descriptors of the agent: many of them fit even when the agent
 * was started under a low soft limit (it raises its own), and commands still get that limit. */
static void test_proc_many(void **state)
{
    new_mark();
    char sock[128];
    snprintf(sock, sizeof sock, "%s/many.sock", tmpdir);
    pid_t pid = fork_agent();
    if (pid == 0) {
        struct rlimit rl;
        getrlimit(RLIMIT_NOFILE, &rl);
        rl.rlim_cur = 128;
        if (rl.rlim_max < 1024)
            _exit(77);
        setrlimit(RLIMIT_NOFILE, &rl);
        const char *argv[] = {DSEC_AGENT_PATH, "--listen", sock, base_env[0], base_env[1], NULL};
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    dsec_agent *a = NULL;
    dsec_err err = {0};
    if (dsec_agent_connect(&a, sock, 5000, &err) < 0) {
        int st = wait_exit(pid, 1000);
        if (st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 77) {
            fprintf(stderr, "test_proc_many: hard descriptor limit under 1024; skipping\n");
            skip();
        }
        fail_msg("connect: %s", err.msg);
    }
    dsec_proc_info info;
    for (int i = 0; i < 64; i++) /* 3 descriptors each in the agent: 192 */
        pstart(a, "sleep 30", 0, false, 0, &info);
    assert_int_equal(wait_sleeps(64), 64);
    const char *lim[] = {"/bin/sh", "-c", "ulimit -n", NULL};
    dsec_exec_result r;
    assert_int_equal(run(a, lim, NULL, &r, &err), 0);
    assert_out(&r, "128\n");
    dsec_exec_result_release(&r);
    dsec_agent_free(a);
    kill(pid, SIGTERM);
    assert_true(wait_exit(pid, 5000) != -1);
    assert_int_equal(marked_left(), 0);
}

static void test_speed(void **state)
{
    const char *t[] = {"/bin/true", NULL};
    measure("/bin/true (dynamic)", t);
    const char *bb[] = {"/bin/busybox", "true", NULL};
    if (access(bb[0], X_OK) == 0)
        measure("/bin/busybox true (static)", bb);
    const char *ag[] = {DSEC_AGENT_PATH, "--version", NULL}; /* static; prints usage, exits 2 */
    measure("dsec-agent usage (static)", ag);
    measure_direct("/bin/true (dynamic)", t);
    measure_direct("dsec-agent usage (static)", ag);
}

/* ---- shell sessions and terminals -------------------------------------------------------------
 */

/* Start a shell session (shell NULL: the default) on a; its handle. */
static uint64_t sess_new(dsec_agent *a, const char *shell)
{
    /* "/bin/busybox sh": a program and one argument */
    char prog[64] = "";
    const char *sp = shell ? strchr(shell, ' ') : NULL;
    if (sp)
        snprintf(prog, sizeof prog, "%.*s", (int)(sp - shell), shell);
    const char *argv[] = {sp ? prog : shell, sp ? sp + 1 : NULL, NULL};
    size_t argc = shell == NULL ? 0 : sp ? 2 : 1;
    dsec_proc_start_req req = {
        .exec = {.argv = shell ? argv : NULL, .argc = argc, .env = mark_env, .nenv = 1},
        .session = true,
    };
    dsec_proc_info info;
    dsec_err err = {0};
    if (dsec_agent_proc_start(a, &req, &info, &err) < 0)
        fail_msg("start a session (%s): %s", shell ? shell : "default", err.msg);
    assert_true(info.session);
    assert_false(info.pty);
    assert_false(info.busy);
    assert_false(info.stdin_open); /* its stdin is the agent's */
    return info.handle;
}

/* Run line in session h; the call's rc (res filled on 0). */
static int sx(dsec_agent *a, uint64_t h, const char *line, uint64_t timeout_ms, size_t out_max,
              dsec_exec_result *res, dsec_err *err)
{
    const char *argv[] = {line, NULL};
    dsec_exec_req req = {
        .argv = argv, .argc = 1, .session = h, .timeout_ms = timeout_ms, .output_max = out_max};
    return dsec_agent_exec(a, &req, NULL, NULL, res, err);
}

/* line in session h must exit with code and print exactly out and err (NULL: anything). */
static void sx_expect(dsec_agent *a, uint64_t h, const char *line, int code, const char *out,
                      const char *errs)
{
    dsec_exec_result r;
    dsec_err err = {0};
    if (sx(a, h, line, 10000, 0, &r, &err) < 0)
        fail_msg("session %llu: %s: %s", (unsigned long long)h, line, err.msg);
    if (r.exit_code != code ||
        (out && (r.stdout_len != strlen(out) ||
                 (r.stdout_len && memcmp(r.stdout_data, out, r.stdout_len) != 0))) ||
        (errs && (r.stderr_len != strlen(errs) ||
                  (r.stderr_len && memcmp(r.stderr_data, errs, r.stderr_len) != 0))))
        fail_msg("session: %s: code %d, stdout \"%.*s\", stderr \"%.*s\"; want %d, \"%s\", \"%s\"",
                 line, r.exit_code, (int)r.stdout_len,
                 r.stdout_data ? (const char *)r.stdout_data : "", (int)r.stderr_len,
                 r.stderr_data ? (const char *)r.stderr_data : "", code, out ? out : "*",
                 errs ? errs : "*");
    assert_false(r.timed_out || r.interrupted || r.session_ended || r.stdout_truncated);
    dsec_exec_result_release(&r);
}

static void sess_state_in(const char *shell)
{
    uint64_t h = sess_new(conn, shell);
    sx_expect(conn, h, "cd /tmp", 0, "", "");
    sx_expect(conn, h, "pwd", 0, "/tmp\n", "");
    sx_expect(conn, h, "X=5", 0, "", "");
    sx_expect(conn, h, "echo $X", 0, "5\n", "");
    sx_expect(conn, h, "f(){ echo hi; }", 0, "", "");
    sx_expect(conn, h, "f", 0, "hi\n", "");
    sx_expect(conn, h, "export Y=2", 0, "", "");
    sx_expect(conn, h, "sh -c 'echo $Y'", 0, "2\n", "");
    sx_expect(conn, h, "false", 1, "", "");
    sx_expect(conn, h, "(exit 7)", 7, "", "");
    sx_expect(conn, h, "echo out; echo err >&2; echo out2", 0, "out\nout2\n", "err\n");
    sx_expect(conn, h, "printf abc; printf def >&2", 0, "abc", "def");
    sx_expect(conn, h, "echo \"it's\" 'a \"b\"'", 0, "it's a \"b\"\n", "");
    sx_expect(conn, h, "cat", 0, "", ""); /* stdin /dev/null: it ends at once */
    sx_expect(conn, h, "read x; echo \"[$x] $?\"", 0, "[] 1\n", "");
    sx_expect(conn, h, "printf '\\036dsec:0\\n'", 0, "\036dsec:0\n", ""); /* not our marker */
    sx_expect(conn, h, "echo a\necho b", 0, "a\nb\n", "");
    /* a command longer than a pipe holds goes in as the shell reads it */
    static char big[100100];
    memcpy(big, ": '", 3);
    memset(big + 3, 'x', 100000);
    strcpy(big + 100003, "'; echo big");
    sx_expect(conn, h, big, 0, "big\n", "");
    /* a syntax error: an error, and the session goes on */
    dsec_exec_result r;
    dsec_err err = {0};
    assert_int_equal(sx(conn, h, "if then", 10000, 0, &r, &err), 0);
    assert_int_not_equal(r.exit_code, 0);
    assert_true(r.stderr_len > 0);
    assert_int_equal(r.stdout_len, 0);
    assert_false(r.session_ended);
    dsec_exec_result_release(&r);
    /* everything the shell knows, its own variables included, is not a marker */
    assert_int_equal(sx(conn, h, "set; echo end", 10000, 0, &r, &err), 0);
    assert_int_equal(r.exit_code, 0);
    assert_true(r.stdout_len > 4 && memcmp(r.stdout_data + r.stdout_len - 4, "end\n", 4) == 0);
    dsec_exec_result_release(&r);
    sx_expect(conn, h, "echo $X $Y; pwd", 0, "5 2\n/tmp\n", "");
    dsec_proc_info info;
    assert_true(plisted(conn, h, &info));
    assert_true(info.session && info.running && !info.busy);
    assert_int_equal(dsec_agent_proc_signal(conn, h, SIGINT, &err), 0); /* idle: nothing */
    sx_expect(conn, h, "echo $X", 0, "5\n", "");
    assert_int_equal(dsec_agent_proc_signal(conn, h, SIGKILL, &err), 0);
    info = pwait(conn, h, 5000);
    assert_int_equal(info.signal, SIGKILL);
}

/* A session keeps the shell's state from command to command; each command has its own code
 * and streams, in bash and in the plain sh (dash here). */
static void test_session_state(void **state)
{
    new_mark();
    sess_state_in(NULL);
    sess_state_in("/bin/sh");
    if (access("/bin/busybox", X_OK) == 0) /* the sh of small images */
        sess_state_in("/bin/busybox sh");
    assert_int_equal(marked_left(), 0);
}

/* A session command on a thread of its own. */
struct sjob {
    uint64_t h;
    const char *line;
    uint64_t timeout_ms;
    dsec_agent *a;
    int rc;
    dsec_exec_result r;
    dsec_err err;
    uint64_t took_us;
};

static void *sjob_run(void *arg)
{
    struct sjob *j = arg;
    uint64_t t0 = now_us();
    j->rc = sx(j->a, j->h, j->line, j->timeout_ms, 0, &j->r, &j->err);
    j->took_us = now_us() - t0;
    return NULL;
}

/* Wait until session h runs a command. */
static void sess_wait_busy(uint64_t h)
{
    dsec_proc_info info;
    for (int i = 0; i < 500; i++) {
        assert_true(plisted(conn, h, &info));
        if (info.busy)
            return;
        msleep(10);
    }
    fail_msg("session %llu never got busy", (unsigned long long)h);
}

/* Run line on session h on a thread; after settle_ms, act(h), then the result. */
static void sjob_interrupt(uint64_t h, const char *line, int settle_ms, int sig, bool kill_all,
                           struct sjob *j)
{
    dsec_err err = {0};
    *j = (struct sjob){.h = h, .line = line};
    assert_int_equal(dsec_agent_connect(&j->a, sock_path, 2000, &err), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, sjob_run, j), 0);
    sess_wait_busy(h);
    msleep(settle_ms);
    if (kill_all)
        assert_int_equal(dsec_agent_kill(sock_path, sig, &err), 0);
    else
        assert_int_equal(dsec_agent_proc_signal(conn, h, sig, &err), 0);
    pthread_join(th, NULL);
    dsec_agent_free(j->a);
    if (j->rc < 0)
        fail_msg("%s: %s", line, j->err.msg);
}

static void sess_interrupt_in(const char *shell)
{
    uint64_t h = sess_new(conn, shell);
    sx_expect(conn, h, "X=4; cd /tmp", 0, "", "");
    const char *lines[] = {"sleep 100", "for i in 1 2 3; do sleep 100; echo next$i; done",
                           "while :; do :; done", "echo before; sleep 100; echo after"};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        struct sjob j;
        sjob_interrupt(h, lines[i], 200, SIGINT, false, &j);
        if (!j.r.interrupted || j.r.exit_code != 130 || j.r.session_ended ||
            j.took_us > 2000000 + 200000)
            fail_msg("%s: %s: interrupted %d, code %d, ended %d, took %llu us",
                     shell ? shell : "bash", lines[i], j.r.interrupted, j.r.exit_code,
                     j.r.session_ended, (unsigned long long)j.took_us);
        assert_false(j.r.timed_out);
        assert_null(j.r.stdout_data && memmem(j.r.stdout_data, j.r.stdout_len, "next", 4)
                        ? "the loop went on"
                        : NULL);
        assert_null(j.r.stdout_data && memmem(j.r.stdout_data, j.r.stdout_len, "after", 5)
                        ? "the line went on"
                        : NULL);
        dsec_exec_result_release(&j.r);
        sx_expect(conn, h, "echo $X; pwd", 0, "4\n/tmp\n", "");
    }
    /* a command that ignores SIGINT: what it started is killed after 2 s */
    struct sjob j;
    sjob_interrupt(h, "sh -c 'trap \"\" INT; sleep 100'", 200, SIGINT, false, &j);
    assert_true(j.r.interrupted);
    assert_false(j.r.session_ended);
    assert_true(j.took_us < 4000000);
    dsec_exec_result_release(&j.r);
    sx_expect(conn, h, "echo $X", 0, "4\n", "");
    /* KILL, for every command, reaches a session's */
    sjob_interrupt(h, "sleep 100", 200, SIGKILL, true, &j);
    assert_false(j.r.session_ended);
    assert_true(j.took_us < 2000000);
    dsec_exec_result_release(&j.r);
    sx_expect(conn, h, "echo $X", 0, "4\n", "");
    /* a shell that does not come back (it ignores SIGINT itself): the session ends */
    sjob_interrupt(h, "trap '' INT; while :; do :; done", 100, SIGINT, false, &j);
    assert_true(j.r.session_ended);
    assert_true(j.took_us < 6000000);
    dsec_exec_result_release(&j.r);
    dsec_proc_info info = pwait(conn, h, 5000);
    assert_int_equal(info.signal, SIGKILL);
}

/* What bash says late, as it reads the next line ("line 9: 123 Killed  sleep 1000" about a job
 * that a signal ended), is no command's stderr: neither a background job's nor a command's
 * that an interrupt cut short before bash could say it. */
static void test_session_late_notice(void **state)
{
    new_mark();
    uint64_t h = sess_new(conn, NULL);
    sx_expect(conn, h, "X=4", 0, "", "");
    for (int round = 0; round < 3; round++) {
        sx_expect(conn, h, "sleep 1000 &", 0, "", "");
        assert_int_equal(wait_sleeps(1), 1);
        assert_int_equal(count_marked(true, true), 1); /* SIGKILL to the sleep */
        for (int i = 0; i < 500 && count_marked(true, false) > 0; i++)
            msleep(10);
        sx_expect(conn, h, "echo $X", 0, "4\n", "");
    }
    dsec_err err = {0};
    assert_int_equal(dsec_agent_proc_signal(conn, h, SIGKILL, &err), 0);
    pwait(conn, h, 5000);
    assert_int_equal(marked_left(), 0);
}

/* An interrupt that comes as soon as the session started: it waits for the shell's trap. */
static void test_session_early_interrupt(void **state)
{
    new_mark();
    dsec_err err = {0};
    for (int i = 0; i < 3; i++) {
        uint64_t h = sess_new(conn, i == 1 ? "/bin/sh" : NULL);
        struct sjob j;
        sjob_interrupt(h, "sleep 100", 0, SIGINT, false, &j);
        if (!j.r.interrupted || j.r.session_ended)
            fail_msg("round %d: interrupted %d, ended %d", i, j.r.interrupted, j.r.session_ended);
        dsec_exec_result_release(&j.r);
        sx_expect(conn, h, "echo ok", 0, "ok\n", "");
        assert_int_equal(dsec_agent_proc_signal(conn, h, SIGKILL, &err), 0);
        pwait(conn, h, 5000);
    }
    /* closer still: the command and the interrupt right behind the start's answer */
    for (int i = 0; i < 5; i++) {
        int fd = raw_hello();
        uint8_t pl[256], *p = pl;
        p = dsec__agent_put_u64(p, 0);                    /* timeout */
        p = dsec__agent_put_bytes(p, "", 0);              /* cwd */
        p = dsec__agent_put_bytes(p, "", 0);              /* user */
        p = dsec__agent_put_u32(p, 0);                    /* argc: the default shell */
        p = dsec__agent_put_u32(p, 0);                    /* nenv */
        p = dsec__agent_put_bytes(p, "", 0);              /* stdin */
        p = dsec__agent_put_u64(p, 0);                    /* ring_max */
        p = dsec__agent_put_u8(p, 0);                     /* keep_stdin */
        p = dsec__agent_put_u8(p, DSEC__AGENT_S_SESSION); /* flags */
        p = dsec__agent_put_u32(p, 0);
        p = dsec__agent_put_u32(p, 0);
        put_frame(fd, DSEC__AGENT_T_PSTART, 1, pl, (size_t)(p - pl));
        static uint8_t buf[1 << 16];
        uint8_t type;
        uint32_t id;
        size_t n;
        assert_int_equal(raw_frame(fd, &type, &id, buf, sizeof buf, &n, 2000), 0);
        assert_int_equal(type, DSEC__AGENT_T_PROC);
        uint64_t h = dsec__agent_get_u32le(buf) | (uint64_t)dsec__agent_get_u32le(buf + 4) << 32;
        p = pl;
        p = dsec__agent_put_u64(p, 0);    /* timeout */
        p = dsec__agent_put_u64(p, 4096); /* output_max */
        p = dsec__agent_put_bytes(p, "", 0);
        p = dsec__agent_put_bytes(p, "", 0);
        p = dsec__agent_put_u32(p, 1);
        p = dsec__agent_put_bytes(p, "sleep 100", 9);
        p = dsec__agent_put_u32(p, 0);
        p = dsec__agent_put_bytes(p, "", 0);
        p = dsec__agent_put_u64(p, h);
        put_frame(fd, DSEC__AGENT_T_EXEC, 2, pl, (size_t)(p - pl));
        p = pl;
        p = dsec__agent_put_u64(p, h);
        p = dsec__agent_put_u32(p, SIGINT);
        put_frame(fd, DSEC__AGENT_T_PSIGNAL, 3, pl, (size_t)(p - pl));
        bool exited = false;
        while (!exited) {
            assert_int_equal(raw_frame(fd, &type, &id, buf, sizeof buf, &n, 5000), 0);
            if (type == DSEC__AGENT_T_EXIT) {
                assert_int_equal(id, 2);
                uint8_t flags = buf[8];
                if (!(flags & DSEC__AGENT_X_INTERRUPTED) || (flags & DSEC__AGENT_X_SESSION_ENDED))
                    fail_msg("round %d: EXIT flags %#x", i, flags);
                exited = true;
            } else if (type != DSEC__AGENT_T_OK && type != DSEC__AGENT_T_OUTPUT) {
                fail_msg("round %d: frame type %u", i, type);
            }
        }
        close(fd);
        sx_expect(conn, h, "echo ok", 0, "ok\n", "");
        assert_int_equal(dsec_agent_proc_signal(conn, h, SIGKILL, &err), 0);
        pwait(conn, h, 5000);
    }
    assert_int_equal(marked_left(), 0);
}

/* SIGINT interrupts the running command only; a shell that stays stuck ends the session. */
static void test_session_interrupt(void **state)
{
    new_mark();
    sess_interrupt_in(NULL);
    sess_interrupt_in("/bin/sh");
    if (access("/bin/busybox", X_OK) == 0)
        sess_interrupt_in("/bin/busybox sh");
    assert_int_equal(marked_left(), 0);
}

/* A timeout ends the command, not the session; exit ends the session; SIGKILL too. */
static void test_session_end(void **state)
{
    new_mark();
    dsec_err err = {0};
    dsec_exec_result r;
    uint64_t h = sess_new(conn, NULL);
    sx_expect(conn, h, "X=9", 0, "", "");
    uint64_t t0 = now_us();
    assert_int_equal(sx(conn, h, "sleep 100", 300, 0, &r, &err), 0);
    assert_true(r.timed_out);
    assert_false(r.session_ended || r.interrupted);
    assert_true(now_us() - t0 < 2000000);
    dsec_exec_result_release(&r);
    sx_expect(conn, h, "echo $X", 0, "9\n", "");
    /* a background job neither holds the command back nor ends with it */
    t0 = now_us();
    sx_expect(conn, h, "sleep 1000 & echo started", 0, "started\n", "");
    sx_expect(conn, h, "(sleep 0.3; echo bgout) &", 0, "", "");
    assert_true(now_us() - t0 < 2000000);
    assert_true(wait_sleeps(1) >= 1); /* sleep 1000 runs on */
    bool seen = false;
    for (int i = 0; i < 300 && !seen; i++) {
        dsec_proc_output o;
        poutput(conn, h, 0, 0, 0, &o);
        seen = o.out && memmem(o.out, o.out_len, "bgout\n", 6) != NULL;
        assert_null(o.out && memchr(o.out, 036, o.out_len) ? "a marker in the ring" : NULL);
        dsec_proc_output_release(&o);
        msleep(10);
    }
    assert_true(seen);
    /* output over output_max: truncated, no marker in it */
    assert_int_equal(sx(conn, h, "seq 1 1000", 10000, 10, &r, &err), 0);
    assert_true(r.stdout_truncated);
    assert_int_equal(r.stdout_len, 10);
    assert_memory_equal(r.stdout_data, "1\n2\n3\n4\n5\n", 10);
    dsec_exec_result_release(&r);
    sx_expect(conn, h, "echo after", 0, "after\n", "");
    /* exit ends it with its code */
    assert_int_equal(sx(conn, h, "exit 3", 10000, 0, &r, &err), 0);
    assert_true(r.session_ended);
    assert_int_equal(r.exit_code, 3);
    dsec_exec_result_release(&r);
    expect_fail(sx(conn, h, "echo no", 10000, 0, &r, &err), &err, DSEC_E_STATE, "has ended");
    dsec_proc_info info = pwait(conn, h, 5000);
    assert_false(info.running);
    assert_int_equal(info.exit_code, 3);
    assert_int_equal(marked_left(), 0); /* its background job went with it */

    /* SIGKILL while a command runs: the command's EXIT says the session ended */
    h = sess_new(conn, NULL);
    struct sjob j;
    sjob_interrupt(h, "sleep 100", 100, SIGKILL, false, &j);
    assert_true(j.r.session_ended);
    assert_int_equal(j.r.signal, SIGKILL);
    dsec_exec_result_release(&j.r);
    assert_int_equal(marked_left(), 0);
}

/* Session requests that are refused, and why. */
static void test_session_bad(void **state)
{
    new_mark();
    dsec_err err = {0};
    dsec_exec_result r;
    uint64_t h = sess_new(conn, NULL);
    const char *two[] = {"echo", "hi", NULL};
    dsec_exec_req req = {.argv = two, .argc = 2, .session = h};
    expect_fail(dsec_agent_exec(conn, &req, NULL, NULL, &r, &err), &err, DSEC_E_INVALID,
                "one shell command line");
    req.argc = 1;
    req.cwd = "/tmp";
    expect_fail(dsec_agent_exec(conn, &req, NULL, NULL, &r, &err), &err, DSEC_E_INVALID, "cwd");
    req.cwd = NULL;
    req.stdin_data = (const uint8_t *)"x";
    req.stdin_len = 1;
    expect_fail(dsec_agent_exec(conn, &req, NULL, NULL, &r, &err), &err, DSEC_E_INVALID, "stdin");
    expect_fail(sx(conn, h + 1000000, "true", 0, 0, &r, &err), &err, DSEC_E_NOT_FOUND, NULL);
    dsec_proc_info info;
    pstart(conn, "sleep 30", 0, false, 0, &info);
    expect_fail(sx(conn, info.handle, "true", 0, 0, &r, &err), &err, DSEC_E_INVALID,
                "not a shell session");
    expect_fail(dsec_agent_proc_stdin(conn, h, "x", 1, false, &err), &err, DSEC_E_INVALID,
                "shell session");
    expect_fail(dsec_agent_proc_resize(conn, h, 10, 10, &err), &err, DSEC_E_INVALID,
                "has no terminal");
    /* one command at a time */
    struct sjob j = {.h = h, .line = "sleep 100"};
    assert_int_equal(dsec_agent_connect(&j.a, sock_path, 2000, &err), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, sjob_run, &j), 0);
    sess_wait_busy(h);
    expect_fail(sx(conn, h, "true", 0, 0, &r, &err), &err, DSEC_E_STATE, "running a command");
    assert_int_equal(dsec_agent_proc_signal(conn, h, SIGINT, &err), 0);
    pthread_join(th, NULL);
    assert_int_equal(j.rc, 0);
    assert_true(j.r.interrupted);
    dsec_exec_result_release(&j.r);
    dsec_agent_free(j.a);
    assert_false(dsec_agent_broken(conn));
    assert_int_equal(dsec_agent_proc_signal(conn, h, SIGKILL, &err), 0);
    assert_int_equal(dsec_agent_proc_signal(conn, info.handle, SIGKILL, &err), 0);
    pwait(conn, h, 5000);
    pwait(conn, info.handle, 5000);
}

/* Everything a terminal showed from off on, waiting up to ms for want to appear in it. */
static bool pty_wait_for(uint64_t h, uint64_t off, const char *want, int ms, char *buf, size_t size)
{
    for (int i = 0; i < ms; i += 10) {
        dsec_proc_output o;
        poutput(conn, h, off, 0, 0, &o);
        size_t n = o.out_len < size - 1 ? o.out_len : size - 1;
        memcpy(buf, o.out ? (const char *)o.out : "", n);
        buf[n] = 0;
        assert_int_equal(o.err_len, 0); /* all on the terminal: one stream */
        dsec_proc_output_release(&o);
        if (strstr(buf, want))
            return true;
        msleep(10);
    }
    return false;
}

static uint64_t pty_total(uint64_t h)
{
    dsec_proc_info info;
    assert_true(plisted(conn, h, &info));
    return info.out_total;
}

static void pty_type(uint64_t h, const char *s)
{
    dsec_err err = {0};
    if (dsec_agent_proc_stdin(conn, h, s, strlen(s), false, &err) < 0)
        fail_msg("typing %s: %s", s, err.msg);
}

/* A process on a terminal: the window, echo, TERM, ^C to the foreground job, ^D. */
static void test_pty(void **state)
{
    new_mark();
    dsec_err err = {0};
    static char buf[1 << 16];
    const char *argv[] = {"/bin/sh", "-i", NULL};
    dsec_backend_kv env[] = {mark_env[0], {.key = "PS1", .value = "$ "}};
    dsec_proc_start_req req = {.exec = {.argv = argv, .argc = 2, .env = env, .nenv = 2},
                               .pty = true,
                               .rows = 30,
                               .cols = 90};
    dsec_proc_info info;
    if (dsec_agent_proc_start(conn, &req, &info, &err) < 0)
        fail_msg("start on a terminal: %s", err.msg);
    uint64_t h = info.handle;
    assert_true(info.pty && info.stdin_open && !info.session);
    uint64_t off = 0;
    pty_type(h, "stty size; echo \"t=$TERM\"\n");
    if (!pty_wait_for(h, off, "t=xterm-256color", 5000, buf, sizeof buf))
        fail_msg("no TERM on the terminal: %s", buf);
    assert_non_null(strstr(buf, "30 90"));
    assert_non_null(strstr(buf, "stty size;")); /* typed bytes come back: echo */
    off = pty_total(h);
    assert_int_equal(dsec_agent_proc_resize(conn, h, 40, 100, &err), 0);
    pty_type(h, "stty size\n");
    if (!pty_wait_for(h, off, "40 100", 5000, buf, sizeof buf))
        fail_msg("no new size: %s", buf);
    expect_fail(dsec_agent_proc_resize(conn, h, 0, 100, &err), &err, DSEC_E_INVALID, "window");
    expect_fail(dsec_agent_proc_resize(conn, h + 1000000, 10, 10, &err), &err, DSEC_E_NOT_FOUND,
                NULL);
    /* ^C: the foreground job ends, the shell stays */
    pty_type(h, "sleep 100\n");
    assert_int_equal(wait_sleeps(1), 1);
    msleep(100); /* the echo of the line is in */
    off = pty_total(h);
    uint64_t t0 = now_us();
    pty_type(h, "\003");
    if (!pty_wait_for(h, off, "$ ", 3000, buf, sizeof buf)) /* the prompt again */
        fail_msg("^C did not end sleep: %s", buf);
    assert_true(now_us() - t0 < 3000000);
    for (int i = 0; i < 100 && count_marked(true, false) > 0; i++)
        msleep(10); /* the prompt may come before the sleep is reaped */
    assert_int_equal(count_marked(true, false), 0); /* the sleep is gone */
    off = pty_total(h);
    pty_type(h, "echo alive\n");
    if (!pty_wait_for(h, off, "alive\r\n", 5000, buf, sizeof buf))
        fail_msg("the shell did not survive ^C: %s", buf);
    /* ^D (close): the shell ends */
    assert_int_equal(dsec_agent_proc_stdin(conn, h, NULL, 0, true, &err), 0);
    info = pwait(conn, h, 5000);
    assert_int_equal(info.exit_code, 0);
    expect_fail(dsec_agent_proc_resize(conn, h, 10, 10, &err), &err, DSEC_E_STATE, "ended");
    /* a process without a terminal */
    pstart(conn, "true", 0, false, 0, &info);
    expect_fail(dsec_agent_proc_resize(conn, info.handle, 10, 10, &err), &err, DSEC_E_INVALID,
                "has no terminal");
    pwait(conn, info.handle, 5000);
    /* pty and session together */
    req.session = true;
    expect_fail(dsec_agent_proc_start(conn, &req, &info, &err), &err, DSEC_E_INVALID, "exclusive");
    assert_int_equal(marked_left(), 0);
}

/* An output request waited for on a loop. */
struct pout_wait {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    int rc;
    dsec_proc_output out;
    dsec_err err;
};

static void pout_waited(void *ud, int rc, dsec_proc_output *out, dsec_err *err)
{
    struct pout_wait *w = ud;
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    if (out)
        w->out = *out;
    if (rc < 0)
        w->err = *err;
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

static int pout_wait(struct pout_wait *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        pthread_cond_wait(&w->cond, &w->mu);
    pthread_mutex_unlock(&w->mu);
    return w->rc;
}

/* A stdin write waited for on a loop. */
struct stdin_wait {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    int rc;
    dsec_err err;
};

static void stdin_waited(void *ud, int rc, dsec_err *err)
{
    struct stdin_wait *w = ud;
    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    if (rc < 0)
        w->err = *err;
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

/* A stdin write that the process does not take within its wait: answered DSEC_E_TIMEOUT at
 * the wait's end, the bytes still go in as the process reads, and the process's stdin then
 * closes as asked. */
static void test_proc_stdin_wait_max(void **state)
{
    new_mark();
    dsec_err err = {0};
    dsec_loop *loop = NULL;
    assert_int_equal(dsec_loop_new(&loop, "agent-test", &err), 0);
    char path[] = "/tmp/dsec-agent-stdin-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    char line[128];
    snprintf(line, sizeof line, "sleep 1.5; cat > %s", path);
    dsec_proc_info info;
    pstart(conn, line, 0, true, 0, &info);
    size_t len = 1 << 20;
    uint8_t *data = malloc(len);
    assert_non_null(data);
    for (size_t i = 0; i < len; i++)
        data[i] = (uint8_t)(i * 7);
    dsec_agent *a = NULL;
    assert_int_equal(dsec_agent_connect(&a, sock_path, 2000, &err), 0);
    /* a wait over the limit is refused before anything is sent */
    struct stdin_wait w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    expect_fail(dsec_agent_proc_stdin_start(a, loop, info.handle, data, len, false,
                                            DSEC_PROC_WAIT_MAX_MS + 1, stdin_waited, &w, &err),
                &err, DSEC_E_INVALID, "at most");
    uint64_t t0 = now_us();
    assert_int_equal(dsec_agent_proc_stdin_start(a, loop, info.handle, data, len, false, 300,
                                                 stdin_waited, &w, &err),
                     0);
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cond, &w.mu);
    pthread_mutex_unlock(&w.mu);
    uint64_t took = now_us() - t0;
    assert_int_equal(w.rc, -1);
    assert_int_equal(w.err.code, DSEC_E_TIMEOUT);
    if (strstr(w.err.msg, "did not take the bytes within 300 ms") == NULL)
        fail_msg("the write's end: %s", w.err.msg);
    assert_true(took >= 250000 && took < 1300000); /* before the process began to read */
    assert_true(dsec_agent_broken(a));             /* its answer is abandoned */
    dsec_agent_free(a);
    /* the bytes go in as the process reads; then its stdin closes as asked */
    struct stat st = {0};
    for (int i = 0; i < 500 && (stat(path, &st) != 0 || (size_t)st.st_size < len); i++)
        msleep(20);
    assert_int_equal((size_t)st.st_size, len);
    int rc = -1;
    for (int i = 0; i < 250 && rc < 0; i++) /* refused until the agent saw the last byte go */
        if ((rc = dsec_agent_proc_stdin(conn, info.handle, NULL, 0, true, &err)) < 0)
            msleep(20);
    assert_int_equal(rc, 0);
    info = pwait(conn, info.handle, 5000);
    assert_int_equal(info.exit_code, 0);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t *back = malloc(len);
    assert_non_null(back);
    assert_int_equal(fread(back, 1, len, f), len);
    fclose(f);
    assert_memory_equal(back, data, len);
    free(back);
    free(data);
    unlink(path);
    dsec_loop_free(loop);
    assert_int_equal(marked_left(), 0);
}

static int stdin_wait_end(struct stdin_wait *w)
{
    pthread_mutex_lock(&w->mu);
    while (!w->done)
        pthread_cond_wait(&w->cond, &w->mu);
    pthread_mutex_unlock(&w->mu);
    return w->rc;
}

/* A multiplexed connection freed by its own exchange's end, on the loop's thread (a VM's side
 * connection when its last holder lets go as its last call ends). */
struct free_on_end {
    dsec_agent *a;
    struct pout_wait w;
};

static void pout_then_free(void *ud, int rc, dsec_proc_output *out, dsec_err *err)
{
    struct free_on_end *f = ud;
    dsec_agent_free(f->a);
    pout_waited(&f->w, rc, out, err);
}

/* One multiplexed connection (a VM's second channel) carries several exchanges at once: an
 * output read that waits and a stdin write the process does not take stay in flight while
 * calls from this thread (start, list, stdin, signal) are answered beside them; a call that
 * gives up waiting leaves the connection usable; freeing it ends what waits (closed), and so
 * does the agent going away. */
static void test_mux(void **state)
{
    new_mark();
    dsec_err err = {0};
    dsec_loop *loop = loop_for_test();
    dsec_agent *a = NULL;
    assert_int_equal(dsec_agent_connect(&a, sock_path, 2000, &err), 0);
    assert_int_equal(dsec_agent_mux_on(a, loop, &err), 0);
    dsec_proc_info idle, cat, deaf;
    pstart(a, "exec sleep 300", 0, true, 0, &idle);
    pstart(a, "exec cat", 0, true, 0, &cat);
    pstart(a, "exec sleep 301", 0, true, 0, &deaf);
    struct pout_wait out = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    assert_int_equal(
        dsec_agent_proc_output_start(a, loop, cat.handle, 0, 0, 0, 20000, pout_waited, &out, &err),
        0);
    size_t len = 1 << 20;
    uint8_t *big = calloc(1, len);
    assert_non_null(big);
    struct stdin_wait in = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    assert_int_equal(dsec_agent_proc_stdin_start(a, loop, idle.handle, big, len, false, 0,
                                                 stdin_waited, &in, &err),
                     0);
    /* beside the two: a list, a write to cat (which wakes the read), a signal */
    dsec_proc_info got;
    assert_true(plisted(a, idle.handle, &got));
    assert_true(got.running);
    assert_int_equal(dsec_agent_proc_stdin(a, cat.handle, "hi\n", 3, false, &err), 0);
    assert_int_equal(pout_wait(&out), 0);
    assert_int_equal(out.out.out_len, 3);
    assert_memory_equal(out.out.out, "hi\n", 3);
    dsec_proc_output_release(&out.out);
    assert_false(in.done); /* still not taken */
    assert_int_equal(dsec_agent_proc_signal(a, idle.handle, SIGKILL, &err), 0);
    assert_int_equal(stdin_wait_end(&in), -1);
    assert_false(dsec_agent_broken(a));
    /* a write that gives up waiting (300 ms) ends alone: the connection takes calls on */
    struct stdin_wait gave_up = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    assert_int_equal(dsec_agent_proc_stdin_start(a, loop, deaf.handle, big, len, false, 300,
                                                 stdin_waited, &gave_up, &err),
                     0);
    assert_int_equal(stdin_wait_end(&gave_up), -1);
    assert_int_equal(gave_up.err.code, DSEC_E_TIMEOUT);
    assert_false(dsec_agent_broken(a));
    assert_true(plisted(a, deaf.handle, &got));
    assert_int_equal(dsec_agent_proc_signal(a, deaf.handle, SIGKILL, &err), 0);
    /* freed while a read waits: the read ends, closed */
    out = (struct pout_wait){.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    assert_int_equal(
        dsec_agent_proc_output_start(a, loop, cat.handle, 3, 0, 0, 20000, pout_waited, &out, &err),
        0);
    uint64_t t0 = now_us();
    dsec_agent_free(a);
    assert_int_equal(pout_wait(&out), -1);
    assert_int_equal(out.err.code, DSEC_E_CLOSED);
    assert_true(now_us() - t0 < 2000000);
    assert_int_equal(dsec_agent_proc_signal(conn, cat.handle, SIGKILL, &err), 0);
    free(big);

    /* the agent goes away while a read waits: the read ends, the connection is broken */
    char sock[300];
    snprintf(sock, sizeof sock, "%s/mux.sock", tmpdir);
    pid_t pid = start_agent(sock, NULL);
    assert_true(pid > 0);
    dsec_agent *b = NULL;
    assert_int_equal(dsec_agent_connect(&b, sock, 5000, &err), 0);
    assert_int_equal(dsec_agent_mux_on(b, loop, &err), 0);
    dsec_proc_info lone;
    pstart(b, "exec sleep 302", 0, false, 0, &lone);
    out = (struct pout_wait){.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    assert_int_equal(
        dsec_agent_proc_output_start(b, loop, lone.handle, 0, 0, 0, 20000, pout_waited, &out, &err),
        0);
    kill(pid, SIGKILL);
    assert_int_not_equal(wait_exit(pid, 5000), -1);
    assert_int_equal(pout_wait(&out), -1);
    assert_int_equal(out.err.code, DSEC_E_CLOSED);
    assert_true(dsec_agent_broken(b));
    dsec_proc_info *v = NULL;
    size_t nv = 0;
    assert_int_equal(dsec_agent_proc_list(b, &v, &nv, &err), -1);
    assert_int_equal(err.code, DSEC_E_CLOSED);
    dsec_agent_free(b);
    kill(lone.pid, SIGKILL); /* its agent was killed: nobody reaps it but init */

    /* freed by the end of its own last exchange: the free waits for the loop's callback to
     * end (AddressSanitizer sees what would be read after it) */
    static struct free_on_end fe;
    fe = (struct free_on_end){
        .w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER}};
    assert_int_equal(dsec_agent_connect(&fe.a, sock_path, 2000, &err), 0);
    assert_int_equal(dsec_agent_mux_on(fe.a, loop, &err), 0);
    dsec_proc_info soon;
    pstart(conn, "sleep 0.2; echo soon", 0, false, 0, &soon);
    assert_int_equal(dsec_agent_proc_output_start(fe.a, loop, soon.handle, 0, 0, 0, 10000,
                                                  pout_then_free, &fe, &err),
                     0);
    assert_int_equal(pout_wait(&fe.w), 0);
    assert_int_equal(fe.w.out.out_len, 5);
    dsec_proc_output_release(&fe.w.out);

    /* the loop stops while a read waits (a node manager stopping): the read ends, closed, and
     * the connection is freed after the loop is gone */
    dsec_agent *c = NULL;
    assert_int_equal(dsec_agent_connect(&c, sock_path, 2000, &err), 0);
    assert_int_equal(dsec_agent_mux_on(c, loop, &err), 0);
    dsec_proc_info last;
    pstart(c, "exec sleep 303", 0, false, 0, &last);
    out = (struct pout_wait){.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    assert_int_equal(
        dsec_agent_proc_output_start(c, loop, last.handle, 0, 0, 0, 20000, pout_waited, &out, &err),
        0);
    dsec_loop_stop(loop);
    assert_int_equal(pout_wait(&out), -1);
    assert_int_equal(out.err.code, DSEC_E_CLOSED);
    assert_int_equal(dsec_agent_proc_signal(c, last.handle, SIGKILL, &err), -1);
    dsec_agent_free(c);
    assert_int_equal(dsec_agent_proc_signal(conn, last.handle, SIGKILL, &err), 0);
    dsec_loop_free(loop);
}

/* POUTPUT with a wait: held until output comes (other requests go on meanwhile), until the
 * process ends, or for wait_ms when nothing comes. */
static void test_proc_output_wait(void **state)
{
    new_mark();
    dsec_err err = {0};
    dsec_loop *loop = NULL;
    assert_int_equal(dsec_loop_new(&loop, "agent-test", &err), 0);
    dsec_agent *a = NULL;
    assert_int_equal(dsec_agent_connect(&a, sock_path, 2000, &err), 0);
    dsec_proc_info info;
    pstart(conn, "sleep 0.5; echo hi; sleep 1; echo bye >&2; sleep 0.5", 0, false, 0, &info);
    uint64_t h = info.handle;
    uint64_t t0 = now_us();
    struct pout_wait w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    assert_int_equal(
        dsec_agent_proc_output_start(a, loop, h, 0, 0, 0, 10000, pout_waited, &w, &err), 0);
    dsec_exec_result r; /* the agent goes on meanwhile */
    sh("echo other", NULL, &r);
    assert_out(&r, "other\n");
    dsec_exec_result_release(&r);
    if (pout_wait(&w) < 0)
        fail_msg("waiting output: %s", w.err.msg);
    uint64_t took = now_us() - t0;
    assert_true(took >= 400000 && took < 3000000);
    assert_int_equal(w.out.out_len, 3);
    assert_memory_equal(w.out.out, "hi\n", 3);
    dsec_proc_output_release(&w.out);
    /* from past "hi\n": nothing for 200 ms */
    w = (struct pout_wait){.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    t0 = now_us();
    assert_int_equal(dsec_agent_proc_output_start(a, loop, h, 3, 0, 0, 200, pout_waited, &w, &err),
                     0);
    assert_int_equal(pout_wait(&w), 0);
    took = now_us() - t0;
    assert_true(took >= 180000 && took < 1000000);
    assert_int_equal(w.out.out_len + w.out.err_len, 0);
    assert_true(w.out.info.running);
    dsec_proc_output_release(&w.out);
    /* stderr wakes it too */
    w = (struct pout_wait){.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    assert_int_equal(
        dsec_agent_proc_output_start(a, loop, h, 3, 0, 0, 10000, pout_waited, &w, &err), 0);
    assert_int_equal(pout_wait(&w), 0);
    assert_int_equal(w.out.err_len, 4);
    assert_memory_equal(w.out.err, "bye\n", 4);
    dsec_proc_output_release(&w.out);
    /* the end wakes it */
    w = (struct pout_wait){.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    t0 = now_us();
    assert_int_equal(
        dsec_agent_proc_output_start(a, loop, h, 3, 4, 0, 10000, pout_waited, &w, &err), 0);
    assert_int_equal(pout_wait(&w), 0);
    assert_true(now_us() - t0 < 3000000);
    assert_false(w.out.info.running);
    dsec_proc_output_release(&w.out);
    /* refused: an unknown process, a wait over the limit */
    w = (struct pout_wait){.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    assert_int_equal(
        dsec_agent_proc_output_start(a, loop, h + 1000000, 0, 0, 0, 100, pout_waited, &w, &err), 0);
    assert_int_equal(pout_wait(&w), -1);
    assert_int_equal(w.err.code, DSEC_E_NOT_FOUND);
    assert_false(dsec_agent_broken(a));
    assert_int_equal(
        dsec_agent_proc_output_start(a, loop, h, 0, 0, 0, 60001, pout_waited, &w, &err), -1);
    /* a connection that goes while its request waits: the agent drops it */
    pstart(conn, "sleep 30", 0, false, 0, &info);
    w = (struct pout_wait){.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    dsec_agent *b = NULL;
    assert_int_equal(dsec_agent_connect(&b, sock_path, 2000, &err), 0);
    assert_int_equal(
        dsec_agent_proc_output_start(b, loop, info.handle, 0, 0, 0, 60000, pout_waited, &w, &err),
        0);
    msleep(100);
    dsec_loop_free(loop); /* cancels the request (done runs with an error) */
    assert_int_equal(pout_wait(&w), -1);
    dsec_agent_free(b);
    dsec_agent_free(a);
    sh("echo still", NULL, &r); /* the agent is fine */
    assert_out(&r, "still\n");
    dsec_exec_result_release(&r);
    assert_int_equal(dsec_agent_proc_signal(conn, info.handle, SIGKILL, &err), 0);
    pwait(conn, info.handle, 5000);
}

/* On one connection: a held POUTPUT does not hold the requests behind it, and a connection
 * that closes with one held leaves the agent serving. */
static void test_proc_output_wait_raw(void **state)
{
    new_mark();
    dsec_proc_info info;
    pstart(conn, "sleep 30", 0, false, 0, &info);
    int fd = raw_hello();
    uint8_t pl[64], *p = pl;
    p = dsec__agent_put_u64(p, info.handle);
    p = dsec__agent_put_u64(p, 0);
    p = dsec__agent_put_u64(p, 0);
    p = dsec__agent_put_u64(p, 0);
    p = dsec__agent_put_u32(p, 300);
    uint64_t t0 = now_us();
    put_frame(fd, DSEC__AGENT_T_POUTPUT, 7, pl, (size_t)(p - pl));
    put_frame(fd, DSEC__AGENT_T_PLIST, 8, pl, 0);
    static uint8_t buf[1 << 16];
    uint8_t type;
    uint32_t id;
    size_t n;
    assert_int_equal(raw_frame(fd, &type, &id, buf, sizeof buf, &n, 2000), 0);
    assert_int_equal(type, DSEC__AGENT_T_PROCS); /* the list first: the output waits */
    assert_int_equal(id, 8);
    assert_true(now_us() - t0 < 250000);
    assert_int_equal(raw_frame(fd, &type, &id, buf, sizeof buf, &n, 2000), 0);
    assert_int_equal(type, DSEC__AGENT_T_POUT);
    assert_int_equal(id, 7);
    assert_true(now_us() - t0 >= 280000);
    /* held, then the connection goes */
    p = pl + 32;
    p = dsec__agent_put_u32(p, 60000);
    put_frame(fd, DSEC__AGENT_T_POUTPUT, 9, pl, (size_t)(p - pl));
    msleep(50);
    close(fd);
    msleep(50);
    dsec_exec_result r;
    sh("echo fine", NULL, &r);
    assert_out(&r, "fine\n");
    dsec_exec_result_release(&r);
    dsec_err err = {0};
    assert_int_equal(dsec_agent_proc_signal(conn, info.handle, SIGKILL, &err), 0);
    pwait(conn, info.handle, 5000);
}

int main(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_agent: needs root (user switching); skipping\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exec_basic),
        cmocka_unit_test(test_exec_bad_requests),
        cmocka_unit_test(test_exec_signal),
        cmocka_unit_test(test_exec_stdin),
        cmocka_unit_test(test_exec_env_cwd),
        cmocka_unit_test(test_exec_user),
        cmocka_unit_test(test_setup),
        cmocka_unit_test(test_exec_timeout),
        cmocka_unit_test(test_exec_output_cap),
        cmocka_unit_test(test_exec_streaming),
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_kill),
        cmocka_unit_test(test_tree_main_exits),
        cmocka_unit_test(test_tree_timeout),
        cmocka_unit_test(test_tree_fork_race),
        cmocka_unit_test(test_tree_overlap),
        cmocka_unit_test(test_tree_shepherd_lost),
        cmocka_unit_test(test_tree_pidns),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_mkdir_rename_sweep),
        cmocka_unit_test(test_files_on_loop),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_slow_reader),
        cmocka_unit_test(test_zombies),
        cmocka_unit_test(test_sigterm),
        cmocka_unit_test(test_listen_fd),
        cmocka_unit_test(test_connect_timeout),
        cmocka_unit_test(test_connect_backlog_full),
        cmocka_unit_test(test_sync_skips_stale_bytes),
        cmocka_unit_test(test_sync_wrong_nonce),
        cmocka_unit_test(test_dial_on_loop),
        cmocka_unit_test(test_dial_fails),
        cmocka_unit_test(test_proc_detached),
        cmocka_unit_test(test_proc_ring),
        cmocka_unit_test(test_proc_stdin),
        cmocka_unit_test(test_proc_stdin_pending),
        cmocka_unit_test(test_proc_tree),
        cmocka_unit_test(test_exec_leaves_nothing),
        cmocka_unit_test(test_proc_timeout),
        cmocka_unit_test(test_proc_limit),
        cmocka_unit_test(test_proc_many),
        cmocka_unit_test(test_session_state),
        cmocka_unit_test(test_session_interrupt),
        cmocka_unit_test(test_session_late_notice),
        cmocka_unit_test(test_session_early_interrupt),
        cmocka_unit_test(test_session_end),
        cmocka_unit_test(test_session_bad),
        cmocka_unit_test(test_pty),
        cmocka_unit_test(test_proc_output_wait),
        cmocka_unit_test(test_mux),
        cmocka_unit_test(test_proc_stdin_wait_max),
        cmocka_unit_test(test_proc_output_wait_raw),
        cmocka_unit_test(test_speed),
    };
    if (getenv("DSEC_TEST_FILTER") && *getenv("DSEC_TEST_FILTER")) /* one test, or a pattern */
        cmocka_set_test_filter(getenv("DSEC_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
