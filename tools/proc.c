/* proc.c - `dsec ps`, `dsec attach` and `dsec kill`: a sandbox's background processes (started with dsec exec -d). */
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
        fprintf(stderr, "dsec %s: \"%s\" is not a process handle (a number from dsec exec -d or "
                        "dsec ps)\n", cmd, s);
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
            snprintf(st, sizeof st, "killed (%s)", sigabbrev_np(v[i].signal) ? sigabbrev_np(v[i].signal) : "?");
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
                fprintf(stderr, "dsec kill: \"%s\" is not a signal (a number 1..64 or a name "
                                "such as TERM)\n", argv[i]);
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
    uint64_t out_off = 0, err_off = 0;
    long idle_ms = 0;
    int status = 0;
    for (;;) {
        dsec_proc_out o;
        dsec_err err;
        if (dsec_proc_read(c, pos[0], handle, out_off, err_off, 0, &o, &err) < 0) {
            status = dsec_cli_fail("attach", &err);
            break;
        }
        if (o.out_from > out_off || o.err_from > err_off)
            fprintf(stderr, "dsec attach: %" PRIu64 " bytes of output were no longer kept\n",
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
                fprintf(stderr, "dsec attach: process %" PRIu64 " timed out\n", handle);
            status = p.signal ? 128 + p.signal : p.exit_code;
            break;
        }
        if (got) {
            idle_ms = 0;
            continue;
        }
        /* nothing new: ask again soon, less often the longer it stays quiet */
        idle_ms = idle_ms == 0 ? 20 : (idle_ms * 2 > 200 ? 200 : idle_ms * 2);
        struct timespec ts = {0, idle_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (feeding) {
        atomic_store(&f.stop, true);
        pthread_join(th, NULL);
        if (f.rc < 0)
            dsec_cli_fail("attach (stdin)", &f.err);
    }
    dsec_client_free(c);
    return status;
}
