/* test_agent_watch.c - dsec-agent --watch: a directory's changes as JSON lines, as a sandbox's
 * watcher prints them. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
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

struct watcher {
    pid_t pid;
    int out, err;
    char buf[65536];
    size_t len;
};

static void start(struct watcher *w, const char *dir, bool recursive)
{
    int o[2], e[2];
    assert_int_equal(pipe(o), 0);
    assert_int_equal(pipe(e), 0);
    w->len = 0;
    w->pid = fork();
    assert_true(w->pid >= 0);
    if (w->pid == 0) {
        dup2(o[1], 1);
        dup2(e[1], 2);
        execl(DSEC_AGENT_PATH, DSEC_AGENT_PATH, "--watch", dir,
              recursive ? "--recursive" : (char *)NULL, (char *)NULL);
        _exit(127);
    }
    close(o[1]);
    close(e[1]);
    w->out = o[0];
    w->err = e[0];
}

/* Wait (up to 5 s) until the output holds want; fail showing what came. */
static void expect(struct watcher *w, const char *want)
{
    for (int i = 0; i < 100; i++) {
        w->buf[w->len] = '\0';
        if (strstr(w->buf, want) != NULL)
            return;
        struct pollfd p = {.fd = w->out, .events = POLLIN};
        if (poll(&p, 1, 50) == 1) {
            ssize_t r = read(w->out, w->buf + w->len, sizeof w->buf - 1 - w->len);
            if (r > 0)
                w->len += (size_t)r;
        }
    }
    fail_msg("the watcher never printed %s; it printed:\n%s", want, w->buf);
}

static int stop(struct watcher *w)
{
    kill(w->pid, SIGKILL);
    int st;
    waitpid(w->pid, &st, 0);
    close(w->out);
    close(w->err);
    return st;
}

static void put(const char *path, const char *data)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(data, f);
    fclose(f);
}

static void test_events(void **state)
{
    char dir[] = "/tmp/dsec-watch-XXXXXX", p[256], q[256];
    assert_non_null(mkdtemp(dir));
    struct watcher w;
    start(&w, dir, true);
    char line[512];
    snprintf(line, sizeof line, "{\"event\":\"ready\",\"path\":\"%s\",\"dir\":true}\n", dir);
    expect(&w, line);
    snprintf(p, sizeof p, "%s/sub", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    snprintf(line, sizeof line, "{\"event\":\"create\",\"path\":\"%s/sub\",\"dir\":true}", dir);
    expect(&w, line);
    /* below a directory made after the watch began (recursive) */
    snprintf(p, sizeof p, "%s/sub/a.txt", dir);
    put(p, "x");
    snprintf(line, sizeof line, "{\"event\":\"modify\",\"path\":\"%s/sub/a.txt\",\"dir\":false}",
             dir);
    expect(&w, line);
    snprintf(q, sizeof q, "%s/b.txt", dir);
    assert_int_equal(rename(p, q), 0);
    snprintf(line, sizeof line, "{\"event\":\"moved_from\",\"path\":\"%s/sub/a.txt\"", dir);
    expect(&w, line);
    snprintf(line, sizeof line, "{\"event\":\"moved_to\",\"path\":\"%s/b.txt\"", dir);
    expect(&w, line);
    assert_int_equal(unlink(q), 0);
    snprintf(line, sizeof line, "{\"event\":\"delete\",\"path\":\"%s/b.txt\",\"dir\":false}", dir);
    expect(&w, line);
    /* a name with a quote and a newline comes escaped: one line per event */
    snprintf(p, sizeof p, "%s/q\"\n", dir);
    put(p, "y");
    snprintf(line, sizeof line, "{\"event\":\"modify\",\"path\":\"%s/q\\\"\\u000a\",\"dir\":false}",
             dir);
    expect(&w, line);
    assert_int_equal(unlink(p), 0);
    snprintf(p, sizeof p, "%s/sub", dir);
    assert_int_equal(rmdir(p), 0);
    assert_int_equal(rmdir(dir), 0);
    snprintf(line, sizeof line, "{\"event\":\"gone\",\"path\":\"%s\",\"dir\":true}", dir);
    expect(&w, line);
    /* the watched directory gone, the watcher ends by itself, status 0 */
    int st;
    assert_int_equal(waitpid(w.pid, &st, 0), w.pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(w.out);
    close(w.err);
}

static void test_not_recursive(void **state)
{
    char dir[] = "/tmp/dsec-watch-XXXXXX", p[256];
    assert_non_null(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/sub", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    struct watcher w;
    start(&w, dir, false);
    expect(&w, "\"ready\"");
    snprintf(p, sizeof p, "%s/sub/deep.txt", dir);
    put(p, "z");
    snprintf(p, sizeof p, "%s/top.txt", dir);
    put(p, "z");
    expect(&w, "top.txt");
    assert_null(strstr(w.buf, "deep.txt"));
    stop(&w);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_bad_paths(void **state)
{
    struct watcher w;
    char msg[512];
    start(&w, "relative/dir", false);
    int st;
    waitpid(w.pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    ssize_t r = read(w.err, msg, sizeof msg - 1);
    msg[r > 0 ? r : 0] = '\0';
    assert_non_null(strstr(msg, "absolute directory path"));
    close(w.out);
    close(w.err);
    start(&w, "/nonexistent-dsec-watch", false);
    waitpid(w.pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    r = read(w.err, msg, sizeof msg - 1);
    msg[r > 0 ? r : 0] = '\0';
    assert_non_null(strstr(msg, "No such file or directory"));
    close(w.out);
    close(w.err);
    start(&w, "/etc/hostname", false);
    waitpid(w.pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    r = read(w.err, msg, sizeof msg - 1);
    msg[r > 0 ? r : 0] = '\0';
    assert_non_null(strstr(msg, "not a directory"));
    close(w.out);
    close(w.err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_not_recursive),
        cmocka_unit_test(test_bad_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
