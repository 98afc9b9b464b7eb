/* proc.c - `dsec ps`, `dsec attach` and `dsec kill`: a sandbox's background processes (started with
 * dsec exec -d). */
#define _GNU_SOURCE /* sigabbrev_np */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tools/cli.h"

static bool parse_handle(const char *cmd, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (s[0] < '0' || s[0] > '9' || *end != '\0' || errno != 0 || v == 0) {
        fprintf(stderr,
                "dsec %s: \"%s\" is not a process handle (a number from dsec exec -d or "
                "dsec ps)\n",
                cmd, s);
        return false;
    }
    *out = v;
    return true;
}

/* The ID HANDLE of kill and attach, and a client: *c NULL (and the exit status returned)
 * when they are wrong or the bus cannot be reached. */
static int open_target(const char *cmd, const char *use, int npos, const char *const pos[2],
                       uint64_t *handle, dsec_client **c)
{
    *c = NULL;
    if (npos != 2) {
        fputs(use, stderr);
        return 2;
    }
    if (!parse_handle(cmd, pos[1], handle))
        return 2;
    *c = dsec_cli_connect(cmd);
    return 1;
}

int dsec_cli_ps(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: dsec ps ID\n  the sandbox's background processes: running, and "
                        "ended ones it still keeps\n");
        return 2;
    }
    dsec_client *c = dsec_cli_connect("ps");
    if (c == NULL)
        return 1;
    dsec_proc *v;
    size_t n;
    dsec_err err;
    int rc = dsec_proc_list(c, argv[1], &v, &n, &err);
    dsec_client_free(c);
    if (rc < 0)
        return dsec_cli_fail("ps", &err);
    printf("%-7s %-8s %-16s %12s %12s  %s\n", "HANDLE", "PID", "STATUS", "STDOUT", "STDERR",
           "COMMAND");
    for (size_t i = 0; i < n; i++) {
        char st[32];
        if (v[i].running)
            snprintf(st, sizeof st, "running");
        else if (v[i].timed_out)
            snprintf(st, sizeof st, "timed out");
        else if (v[i].signal != 0)
            snprintf(st, sizeof st, "killed (%s)",
                     sigabbrev_np(v[i].signal) ? sigabbrev_np(v[i].signal) : "?");
        else
            snprintf(st, sizeof st, "exited %d", v[i].exit_code);
        printf("%-7" PRIu64 " %-8d %-16s %12" PRIu64 " %12" PRIu64 "  %s\n", v[i].handle,
               (int)v[i].pid, st, v[i].out_total, v[i].err_total, v[i].cmdline);
    }
    dsec_free(v);
    return 0;
}

/* A signal by number (15), name (TERM) or full name (SIGTERM); 0 when unknown. */
static int parse_signal(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s != '\0' && *end == '\0')
        return v > 0 && v <= 64 ? (int)v : 0;
    if (strncasecmp(s, "SIG", 3) == 0)
        s += 3;
    for (int i = 1; i < 32; i++) {
        const char *name = sigabbrev_np(i);
        if (name != NULL && strcasecmp(name, s) == 0)
            return i;
    }
    return 0;
}

int dsec_cli_kill(int argc, char **argv)
{
    const char *use = "usage: dsec kill ID HANDLE [-s SIGNAL]\n  send SIGNAL (default KILL: the "
                      "process's whole tree) to a background process\n";
    int sig = SIGKILL;
    const char *pos[2];
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-s") == 0 && i + 1 < argc) {
            if ((sig = parse_signal(argv[++i])) == 0) {
                fprintf(stderr,
                        "dsec kill: \"%s\" is not a signal (a number 1..64 or a name "
                        "such as TERM)\n",
                        argv[i]);
                return 2;
            }
        } else if (npos < 2) {
            pos[npos++] = argv[i];
        } else {
            fputs(use, stderr);
            return 2;
        }
    }
    uint64_t handle;
    dsec_client *c;
    int st = open_target("kill", use, npos, pos, &handle, &c);
    if (c == NULL)
        return st;
    dsec_err err;
    int rc = dsec_proc_signal(c, pos[0], handle, sig, &err);
    dsec_client_free(c);
    return rc < 0 ? dsec_cli_fail("kill", &err) : 0;
}

/* dsec attach -i: stdin goes to the process, chunk by chunk, each call returning once the
 * process took it; end of input closes its stdin. It stops, without cancelling a call in
 * flight, once the attach is over (stop): stdin is polled, not read blind. */
struct feeder {
    dsec_client *c;
    const char *id;
    uint64_t handle;
    atomic_bool stop;
    int rc;
    dsec_err err;
};

static void *feed(void *ud)
{
    struct feeder *f = ud;
    static char buf[64 << 10];
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
        int n = poll(&p, 1, 100);
        if (n == 0 || (n < 0 && errno == EINTR))
            continue;
        ssize_t r = n < 0 ? -1 : read(STDIN_FILENO, buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        bool end = r <= 0;
        if (dsec_proc_write(f->c, f->id, f->handle, buf, end ? 0 : (size_t)r, end, &f->err) < 0) {
            /* the process ended meanwhile: the attach says how; nothing to add */
            f->rc = f->err.code == DSEC_E_INVALID || f->err.code == DSEC_E_STATE ? 0 : -1;
            return NULL;
        }
        if (end)
            return NULL;
    }
    return NULL;
}

/* Print a process's output from the start of what is kept until it exits: each read waits
 * up to wait_ms for new output (a sandbox that cannot wait answers at once, and the loop
 * then backs off). tick, when set, runs before each read (a terminal's resize). Returns its
 * exit status (128+N for signal N) or dsec_cli_fail's. */
static int follow(dsec_client *c, const char *cmd, const char *id, uint64_t handle,
                  uint32_t wait_ms, void (*tick)(dsec_client *, const char *, uint64_t))
{
    uint64_t out_off = 0, err_off = 0;
    long idle_ms = 0;
    for (;;) {
        if (tick != NULL)
            tick(c, id, handle);
        dsec_proc_out o;
        dsec_err err;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (dsec_proc_read_wait(c, id, handle, out_off, err_off, 0, wait_ms, &o, &err) < 0)
            return dsec_cli_fail(cmd, &err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (o.out_from > out_off || o.err_from > err_off)
            fprintf(stderr, "dsec %s: %" PRIu64 " bytes of output were no longer kept\n", cmd,
                    (o.out_from - out_off) + (o.err_from - err_off));
        fwrite(o.out, 1, o.out_len, stdout);
        fflush(stdout);
        fwrite(o.err, 1, o.err_len, stderr);
        out_off = o.out_from + o.out_len;
        err_off = o.err_from + o.err_len;
        bool got = o.out_len + o.err_len > 0;
        bool caught_up = out_off >= o.info.out_total && err_off >= o.info.err_total;
        dsec_proc p = o.info;
        dsec_proc_out_free(&o);
        if (!p.running && caught_up) {
            if (p.timed_out)
                fprintf(stderr, "dsec %s: process %" PRIu64 " timed out\n", cmd, handle);
            return p.signal ? 128 + p.signal : p.exit_code;
        }
        long took_ms = (t1.tv_sec - t0.tv_sec) * 1000L + (t1.tv_nsec - t0.tv_nsec) / 1000000L;
        if (got || took_ms >= (long)wait_ms / 2) {
            idle_ms = 0; /* the read waited (or brought output): ask again at once */
            continue;
        }
        /* nothing new and no wait: ask again soon, less often the longer it stays quiet */
        idle_ms = idle_ms == 0 ? 20 : (idle_ms * 2 > 200 ? 200 : idle_ms * 2);
        struct timespec ts = {0, idle_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int dsec_cli_attach(int argc, char **argv)
{
    const char *use =
        "usage: dsec attach [-i] ID HANDLE\n"
        "  print a background process's output: what the sandbox still keeps of it, then\n"
        "  as it comes, until it exits (exit status: its own, 128+N when signal N ended it).\n"
        "  -i: send this command's stdin to the process (end of input closes its stdin).\n"
        "  Ctrl-C detaches; the process goes on.\n";
    bool in = false;
    const char *pos[2];
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-i") == 0)
            in = true;
        else if (npos < 2)
            pos[npos++] = argv[i];
        else {
            fputs(use, stderr);
            return 2;
        }
    }
    uint64_t handle;
    dsec_client *c;
    int st = open_target("attach", use, npos, pos, &handle, &c);
    if (c == NULL)
        return st;
    struct feeder f = {.c = c, .id = pos[0], .handle = handle};
    pthread_t th;
    bool feeding = in && pthread_create(&th, NULL, feed, &f) == 0;
    int status = follow(c, "attach", pos[0], handle, 1000, NULL);
    if (feeding) {
        atomic_store(&f.stop, true);
        pthread_join(th, NULL);
        if (f.rc < 0)
            dsec_cli_fail("attach (stdin)", &f.err);
    }
    dsec_client_free(c);
    return status;
}

/* ---- dsec exec -it: a terminal ------------------------------------------------------ */

static volatile sig_atomic_t winch = 1; /* 1: send the window size before the first read */

static void on_winch(int sig)
{
    (void)sig;
    winch = 1;
}

static void send_size(dsec_client *c, const char *id, uint64_t handle)
{
    if (!winch)
        return;
    winch = 0;
    struct winsize ws;
    dsec_err err;
    if (ioctl(STDIN_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0 &&
        dsec_proc_resize(c, id, handle, ws.ws_row, ws.ws_col, &err) < 0)
        dsec_cli_fail("exec -it (resize)", &err);
}

int dsec_cli_tty(dsec_client *c, const char *id, const dsec_proc_opts *base)
{
    dsec_proc_opts o = *base;
    o.pty = true;
    bool tty = isatty(STDIN_FILENO);
    struct winsize ws;
    if (tty && ioctl(STDIN_FILENO, TIOCGWINSZ, &ws) == 0) {
        o.rows = ws.ws_row;
        o.cols = ws.ws_col;
    }
    dsec_proc p;
    dsec_err err;
    if (dsec_proc_start(c, id, &o, &p, &err) < 0)
        return dsec_cli_fail("exec -it", &err);
    /* raw: keys go as typed (Ctrl-C is a byte the sandbox's terminal turns into SIGINT) */
    struct termios saved, raw;
    bool restored = !tty || tcgetattr(STDIN_FILENO, &saved) != 0;
    if (!restored) {
        raw = saved;
        cfmakeraw(&raw);
        tcsetattr(STDIN_FILENO, TCSANOW, &raw);
        signal(SIGWINCH, on_winch);
    }
    winch = tty;
    struct feeder f = {.c = c, .id = id, .handle = p.handle};
    pthread_t th;
    bool feeding = pthread_create(&th, NULL, feed, &f) == 0;
    int status = follow(c, "exec -it", id, p.handle, 200, tty ? send_size : NULL);
    if (feeding) {
        atomic_store(&f.stop, true);
        pthread_join(th, NULL);
    }
    if (!restored)
        tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    return status;
}

/* ---- shell sessions ----------------------------------------------------------------- */

int dsec_cli_session(int argc, char **argv)
{
    const char *use = "usage: dsec session ID [--shell PATH]\n"
                      "  start a persistent shell session; prints its handle. Run commands in it\n"
                      "  with dsec exec --session HANDLE ID -- 'COMMAND LINE' (cd, export and\n"
                      "  variables carry over); end it with dsec kill ID HANDLE -s KILL.\n";
    const char *id = NULL, *shell = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--shell") == 0 && i + 1 < argc)
            shell = argv[++i];
        else if (id == NULL && argv[i][0] != '-')
            id = argv[i];
        else {
            fputs(use, stderr);
            return 2;
        }
    }
    if (id == NULL) {
        fputs(use, stderr);
        return 2;
    }
    dsec_client *c = dsec_cli_connect("session");
    if (c == NULL)
        return 1;
    dsec_proc p;
    dsec_err err;
    int rc = dsec_session_start(c, id, shell, &p, &err);
    dsec_client_free(c);
    if (rc < 0)
        return dsec_cli_fail("session", &err);
    printf("%" PRIu64 "\n", p.handle);
    return 0;
}

/* dsec exec --session: Ctrl-C interrupts the session's command, not this client. */
struct interrupter {
    dsec_client *c;
    const char *id;
    uint64_t session;
    atomic_bool stop;
    pthread_t th;
};

static volatile sig_atomic_t got_int;

static void on_int(int sig)
{
    (void)sig;
    got_int = 1;
}

static void *interrupt_on_ctrl_c(void *ud)
{
    struct interrupter *it = ud;
    while (!atomic_load(&it->stop)) {
        nanosleep(&(struct timespec){0, 20 * 1000000L}, NULL);
        if (!got_int)
            continue;
        got_int = 0;
        dsec_err err;
        if (dsec_session_interrupt(it->c, it->id, it->session, &err) < 0)
            dsec_cli_fail("exec --session (interrupt)", &err);
    }
    return NULL;
}

void *dsec_cli_session_guard(dsec_client *c, const char *id, uint64_t session)
{
    struct interrupter *it = dsec_calloc(1, sizeof *it);
    if (it == NULL)
        return NULL;
    *it = (struct interrupter){.c = c, .id = id, .session = session};
    signal(SIGINT, on_int);
    if (pthread_create(&it->th, NULL, interrupt_on_ctrl_c, it) != 0) {
        signal(SIGINT, SIG_DFL);
        dsec_free(it);
        return NULL;
    }
    return it;
}

void dsec_cli_session_guard_end(void *g)
{
    struct interrupter *it = g;
    if (it == NULL)
        return;
    signal(SIGINT, SIG_DFL);
    atomic_store(&it->stop, true); /* seen within 20 ms; joined before the client goes */
    pthread_join(it->th, NULL);
    dsec_free(it);
}

/* ---- dsec watch: a directory's changes ------------------------------------------------ */

static volatile sig_atomic_t watch_stop;

static void on_watch_stop(int sig)
{
    (void)sig;
    watch_stop = 1;
}

static void print_event(void *ud, const dsec_dir_event *ev)
{
    bool json = *(const bool *)ud;
    if (json) {
        printf("{\"event\":\"%s\",\"path\":", ev->event);
        dsec_cli_json_str(stdout, ev->path);
        printf(",\"dir\":%s}\n", ev->dir ? "true" : "false");
    } else {
        printf("%-10s %s%s\n", ev->event, ev->path, ev->dir && ev->path[0] ? "/" : "");
    }
    fflush(stdout);
}

int dsec_cli_watch(int argc, char **argv)
{
    const char *use = "usage: dsec watch ID PATH [-r] [--json] [--count N]\n"
                      "  print a directory's changes in the sandbox as they happen (create, "
                      "modify,\n  delete, moved_from, moved_to, attrib) until Ctrl-C; -r: below "
                      "it too.\n  --count N: stop after N events.\n";
    const char *id = NULL, *path = NULL;
    bool recursive = false, json = false;
    long count = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-r") == 0 || strcmp(argv[i], "--recursive") == 0)
            recursive = true;
        else if (strcmp(argv[i], "--json") == 0)
            json = true;
        else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc)
            count = strtol(argv[++i], NULL, 10);
        else if (id == NULL)
            id = argv[i];
        else if (path == NULL)
            path = argv[i];
        else {
            fputs(use, stderr);
            return 2;
        }
    }
    if (id == NULL || path == NULL || count == 0 || count < -1) {
        fputs(use, stderr);
        return 2;
    }
    dsec_client *c = dsec_cli_connect("watch");
    if (c == NULL)
        return 1;
    dsec_proc w;
    dsec_err err;
    if (dsec_dir_watch(c, id, path, recursive, &w, &err) < 0) {
        dsec_client_free(c);
        return dsec_cli_fail("watch", &err);
    }
    signal(SIGINT, on_watch_stop);
    signal(SIGTERM, on_watch_stop);
    uint64_t off = 0;
    long seen = 0;
    int status = 0;
    bool running = true;
    while (!watch_stop && running && (count < 0 || seen < count)) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int n = dsec_dir_events(c, id, w.handle, &off, 500, print_event, &json, &running, &err);
        if (n < 0) {
            status = dsec_cli_fail("watch", &err);
            break;
        }
        seen += n;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long waited_ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
        if (n == 0 && running && waited_ms < 100) /* a VM answers a waiting read at once */
            usleep(100000);
    }
    /* the watcher is this command's: it ends with it */
    if (running)
        dsec_proc_signal(c, id, w.handle, 9, &err);
    dsec_client_free(c);
    return status;
}
