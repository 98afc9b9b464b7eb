/* natsd.c - launches a private nats-server child on loopback for dsecd's
 * embedded mode, tests and benchmarks, and stops, kills or restarts it. */
#define _GNU_SOURCE /* pipe2, close_range */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bus/bus.h"
#include "dsec/alloc.h"
#include "dsec/io.h"

#define DEFAULT_START_TIMEOUT_MS 5000
#define STOP_GRACE_MS 5000
#define AUTO_PORT_ATTEMPTS 3

extern char **environ;

/* The Go runtime settings the server runs with, each unless this process's
 * environment already sets it (docs/operations.md, NATS, step 4).
 * With Go's defaults, nats-server 2.9 spends up to a third of its CPU per
 * message with headers (every dsec message) in its collector and in faulting
 * back pages it handed to the kernel; bench/bus.c prints the server's CPU
 * per message. GOMEMLIMIT, a quarter of the host's memory, bounds what the
 * larger GOGC lets the heap grow to. */
#define GO_GOGC "400"
#define GO_GODEBUG "madvdontneed=0"
#define GO_MEMLIMIT_SHARE 4

struct dsec_natsd {
    char *binary;
    char *state_dir;
    char *conf_path;
    char *log_path;
    char url[64];
    int port;
    int start_timeout_ms;
    pid_t pid;   /* 0 when no child runs */
    int pidfd;   /* -1 when no child runs; readable once the child exits */
    char **envp; /* the child's environment: ours plus the Go settings */
};

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = dsec_malloc(n);
    if (p != NULL)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static bool is_executable(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* $DSEC_NATS_SERVER wins when set, so a test can point at a missing binary
 * and get the error instead of silently falling back to PATH. */
static int find_binary(char **out, const char *explicit_path, dsec_err *err)
{
    const char *env = getenv("DSEC_NATS_SERVER");
    const char *want = explicit_path != NULL ? explicit_path : (env != NULL && *env ? env : NULL);
    if (want != NULL) {
        if (!is_executable(want))
            return dsec_err_set(err, DSEC_E_NOT_FOUND, ENOENT,
                                "nats-server binary %s%s is not an executable file (install "
                                "nats-server or fix the path)",
                                explicit_path != NULL ? "" : "$DSEC_NATS_SERVER=", want);
        *out = dsec_strdup(want);
        return *out != NULL ? 0 : dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "nats-server path");
    }

    const char *path = getenv("PATH");
    if (path != NULL) {
        char *copy DSEC_AUTOFREE = dsec_strdup(path);
        if (copy == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "nats-server path");
        char *save = NULL;
        for (char *dir = strtok_r(copy, ":", &save); dir != NULL;
             dir = strtok_r(NULL, ":", &save)) {
            char *cand = path_join(*dir ? dir : ".", "nats-server");
            if (cand == NULL)
                return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "nats-server path");
            if (is_executable(cand)) {
                *out = cand;
                return 0;
            }
            dsec_free(cand);
        }
    }
    static const char *const fallback[] = {"/usr/sbin/nats-server", "/usr/bin/nats-server"};
    for (size_t i = 0; i < sizeof fallback / sizeof fallback[0]; i++) {
        if (is_executable(fallback[i])) {
            *out = dsec_strdup(fallback[i]);
            return *out != NULL ? 0 : dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "nats-server path");
        }
    }
    return dsec_err_set(err, DSEC_E_NOT_FOUND, ENOENT,
                        "nats-server not found on PATH, /usr/sbin or /usr/bin (install the "
                        "nats-server package or set $DSEC_NATS_SERVER)");
}

/* Bind 127.0.0.1:0 and read back the port the kernel chose. Another process
 * may take it before the server binds; start() retries with a new port. */
static int pick_free_port(int *port, dsec_err *err)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "picking a free port: socket");
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int rc = -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "picking a free port: bind 127.0.0.1:0");
        goto out_close;
    }
    if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "picking a free port: getsockname");
        goto out_close;
    }
    *port = ntohs(sa.sin_port);
    rc = 0;
out_close:
    close(fd);
    return rc;
}

/* Write s as a double-quoted nats config string. */
static void put_quoted(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

static int write_conf(const dsec_natsd *s, bool jetstream, const char *extra, dsec_err *err)
{
    FILE *f = fopen(s->conf_path, "we");
    if (f == NULL)
        return dsec_err_set(err, DSEC_E_IO, errno, "writing %s", s->conf_path);
    fprintf(f, "# written by dsec (bus/natsd.c); regenerated on every start\n");
    fprintf(f, "listen: \"127.0.0.1:%d\"\n", s->port);
    /* dsec's payload limit plus the header budget (bus.h): a payload just
     * over 8 MiB reaches dsec, which answers too_large, instead of the
     * server closing the sender's connection. */
    fprintf(f, "max_payload: %u\n", DSEC_NATSD_MAX_PAYLOAD);
    fprintf(f, "log_file: ");
    put_quoted(f, s->log_path);
    fprintf(f, "\nlogtime: true\n");
    if (jetstream) {
        char *js DSEC_AUTOFREE = path_join(s->state_dir, "js");
        if (js == NULL) {
            fclose(f);
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "writing %s", s->conf_path);
        }
        fprintf(f, "jetstream {\n  store_dir: ");
        put_quoted(f, js);
        fprintf(f, "\n}\n");
    }
    if (extra != NULL)
        fprintf(f, "%s\n", extra);
    if (ferror(f) | (fclose(f) != 0))
        return dsec_err_set(err, DSEC_E_IO, errno, "writing %s", s->conf_path);
    return 0;
}

/* The last lines of the server log, squeezed onto one line for an error
 * message: that is where nats-server says why it would not start. */
static void log_tail(const char *path, char *buf, size_t n)
{
    buf[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(buf, n, "(no log at %s)", path);
        return;
    }
    char raw[1024];
    off_t end = lseek(fd, 0, SEEK_END);
    off_t start = end > (off_t)sizeof raw - 1 ? end - (off_t)sizeof raw + 1 : 0;
    ssize_t got = pread(fd, raw, sizeof raw - 1, start);
    close(fd);
    if (got <= 0) {
        snprintf(buf, n, "(empty log %s)", path);
        return;
    }
    raw[got] = '\0';
    while (got > 0 && (raw[got - 1] == '\n' || raw[got - 1] == '\r'))
        raw[--got] = '\0';
    /* Keep the last two lines. */
    char *cut = raw;
    int lines = 0;
    for (char *p = raw + got; p > raw; p--) {
        if (p[-1] == '\n' && ++lines == 2) {
            cut = p;
            break;
        }
    }
    size_t o = 0;
    for (char *p = cut; *p && o + 1 < n; p++)
        buf[o++] = (*p == '\n' || *p == '\r') ? '|' : *p;
    buf[o] = '\0';
    /* Keep the end, which names the failure, if it does not fit. */
    size_t len = strlen(cut);
    if (len >= n && n > 4)
        snprintf(buf, n, "...%s", cut + len - (n - 4));
}

static int pidfd_open_(pid_t pid)
{
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* Reap the child if it has exited; returns true if it had. */
static bool child_reaped(dsec_natsd *s, int *status)
{
    if (s->pid <= 0)
        return true;
    pid_t r = waitpid(s->pid, status, WNOHANG);
    if (r == s->pid || (r < 0 && errno == ECHILD)) {
        s->pid = 0;
        close(s->pidfd);
        s->pidfd = -1;
        return true;
    }
    return false;
}

static void child_kill_wait(dsec_natsd *s)
{
    if (s->pid <= 0)
        return;
    kill(s->pid, SIGKILL);
    dsec_waitpid_eintr(s->pid, NULL, 0);
    s->pid = 0;
    close(s->pidfd);
    s->pidfd = -1;
}

/* The child's environment: a copy of ours, plus GO_GOGC, GO_GODEBUG and a
 * GOMEMLIMIT for whichever of the three ours does not set. */
static int build_env(dsec_natsd *s, dsec_err *err)
{
    size_t n = 0;
    for (char **e = environ; e != NULL && *e != NULL; e++)
        n++;
    s->envp = dsec_calloc(n + 4, sizeof *s->envp);
    if (s->envp == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "nats-server environment");
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if ((s->envp[k++] = dsec_strdup(environ[i])) == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "nats-server environment");
    char limit[64] = "";
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0)
        snprintf(limit, sizeof limit, "GOMEMLIMIT=%lluMiB",
                 (unsigned long long)pages * (unsigned long long)page / GO_MEMLIMIT_SHARE >> 20);
    const char *add[][2] = {
        {"GOGC", "GOGC=" GO_GOGC}, {"GODEBUG", "GODEBUG=" GO_GODEBUG}, {"GOMEMLIMIT", limit}};
    for (size_t i = 0; i < sizeof add / sizeof add[0]; i++) {
        if (getenv(add[i][0]) != NULL || add[i][1][0] == '\0')
            continue;
        if ((s->envp[k++] = dsec_strdup(add[i][1])) == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "nats-server environment");
    }
    return 0;
}

/* fork+exec the server. Everything the child needs is prepared before the
 * fork: between fork and exec only async-signal-safe calls are allowed. */
static int spawn(dsec_natsd *s, dsec_err *err)
{
    int rc = -1;
    int logfd = -1, nullfd = -1;
    int pipefd[2] = {-1, -1};
    char *const argv[] = {s->binary, "-c", s->conf_path, NULL};

    logfd = open(s->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logfd < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "opening %s", s->log_path);
        goto out;
    }
    nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nullfd < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "opening /dev/null");
        goto out;
    }
    /* The child writes its exec errno here; EOF means exec succeeded. */
    if (pipe2(pipefd, O_CLOEXEC) < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "starting nats-server: pipe");
        goto out;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "starting nats-server: fork");
        goto out;
    }
    if (pid == 0) {
        /* Own process group: a ^C aimed at our group does not hit it, and
         * the parent's death kills it (PDEATHSIG fires when the forking
         * thread exits, so start servers from a long-lived thread). */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        struct sigaction dfl = {.sa_handler = SIG_DFL};
        sigaction(SIGPIPE, &dfl, NULL);
        dup2(nullfd, STDIN_FILENO);
        dup2(logfd, STDOUT_FILENO);
        dup2(logfd, STDERR_FILENO);
        /* nats.c sockets are not close-on-exec; a server holding a client's
         * socket would keep that connection half alive. */
        close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
        execve(s->binary, argv, s->envp);
        int e = errno;
        ssize_t w = write(pipefd[1], &e, sizeof e);
        (void)w;
        _exit(127);
    }
    close(pipefd[1]);
    pipefd[1] = -1;
    int child_errno = 0;
    ssize_t got;
    got = dsec_read_eintr(pipefd[0], &child_errno, sizeof child_errno);
    if (got == (ssize_t)sizeof child_errno) {
        dsec_waitpid_eintr(pid, NULL, 0);
        dsec_err_set(err, DSEC_E_IO, child_errno, "executing %s", s->binary);
        goto out;
    }
    s->pid = pid;
    s->pidfd = pidfd_open_(pid);
    if (s->pidfd < 0) {
        dsec_err_set(err, DSEC_E_IO, errno, "starting nats-server: pidfd_open");
        kill(pid, SIGKILL);
        dsec_waitpid_eintr(pid, NULL, 0);
        s->pid = 0;
        goto out;
    }
    rc = 0;
out:
    if (logfd >= 0)
        close(logfd);
    if (nullfd >= 0)
        close(nullfd);
    if (pipefd[0] >= 0)
        close(pipefd[0]);
    if (pipefd[1] >= 0)
        close(pipefd[1]);
    return rc;
}

static bool port_accepts(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait until the port accepts a TCP connection or the child exits, bounded by
 * the start timeout. *exited tells the caller the child died on its own. */
static int wait_ready(dsec_natsd *s, bool *exited, dsec_err *err)
{
    *exited = false;
    int64_t deadline = mono_ms() + s->start_timeout_ms;
    char tail[160];
    for (;;) {
        if (port_accepts(s->port)) {
            /* Someone else may own the port: make sure ours is still alive. */
            int status;
            if (!child_reaped(s, &status))
                return 0;
            *exited = true;
            log_tail(s->log_path, tail, sizeof tail);
            return dsec_err_set(err, DSEC_E_IO, 0,
                                "nats-server on port %d exited at start (%s): %s", s->port,
                                WIFEXITED(status) ? "exit" : "signal", tail);
        }
        int64_t left = deadline - mono_ms();
        if (left <= 0)
            break;
        /* The pidfd turns readable when the child exits: no need to spin
         * until the deadline when it died at once. */
        struct pollfd pfd = {.fd = s->pidfd, .events = POLLIN};
        int r = poll(&pfd, 1, (int)(left < 10 ? left : 10));
        if (r > 0) {
            int status = 0;
            if (child_reaped(s, &status)) {
                *exited = true;
                log_tail(s->log_path, tail, sizeof tail);
                return dsec_err_set(err, DSEC_E_IO, 0,
                                    "nats-server exited with %s %d before accepting "
                                    "connections on 127.0.0.1:%d: %s",
                                    WIFEXITED(status) ? "status" : "signal",
                                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                                    s->port, tail);
            }
        }
    }
    child_kill_wait(s);
    log_tail(s->log_path, tail, sizeof tail);
    return dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                        "nats-server did not accept connections on 127.0.0.1:%d within %d ms: %s",
                        s->port, s->start_timeout_ms, tail);
}

static void natsd_free(dsec_natsd *s)
{
    if (s == NULL)
        return;
    for (char **e = s->envp; e != NULL && *e != NULL; e++)
        dsec_free(*e);
    dsec_free(s->envp);
    dsec_free(s->binary);
    dsec_free(s->state_dir);
    dsec_free(s->conf_path);
    dsec_free(s->log_path);
    dsec_free(s);
}

int dsec_natsd_start(dsec_natsd **out, const dsec_natsd_opts *opts, dsec_err *err)
{
    *out = NULL;
    if (opts == NULL || opts->state_dir == NULL || opts->state_dir[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "nats-server launcher: state_dir is required");
    if (opts->port < 0 || opts->port > 65535)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "nats-server launcher: bad port %d",
                            opts->port);

    dsec_natsd *s = dsec_calloc(1, sizeof *s);
    if (s == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "nats-server launcher");
    s->pidfd = -1;
    s->start_timeout_ms =
        opts->start_timeout_ms > 0 ? opts->start_timeout_ms : DEFAULT_START_TIMEOUT_MS;
    if (find_binary(&s->binary, opts->binary, err) < 0 || build_env(s, err) < 0)
        goto out_free;
    if (mkdir(opts->state_dir, 0700) < 0 && errno != EEXIST) {
        dsec_err_set(err, DSEC_E_IO, errno, "creating nats-server state dir %s", opts->state_dir);
        goto out_free;
    }
    s->state_dir = dsec_strdup(opts->state_dir);
    s->conf_path = path_join(opts->state_dir, "nats.conf");
    s->log_path = path_join(opts->state_dir, "nats.log");
    if (s->state_dir == NULL || s->conf_path == NULL || s->log_path == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "nats-server launcher");
        goto out_free;
    }

    int attempts = opts->port == 0 ? AUTO_PORT_ATTEMPTS : 1;
    for (int i = 0; i < attempts; i++) {
        s->port = opts->port;
        if (s->port == 0 && pick_free_port(&s->port, err) < 0)
            goto out_free;
        if (write_conf(s, opts->jetstream, opts->extra_conf, err) < 0)
            goto out_free;
        if (spawn(s, err) < 0)
            goto out_free;
        bool exited;
        if (wait_ready(s, &exited, err) == 0) {
            snprintf(s->url, sizeof s->url, "nats://127.0.0.1:%d", s->port);
            *out = s;
            return 0;
        }
        /* Only a picked port can lose a race: try another one. */
        if (!exited)
            goto out_free;
    }
out_free:
    child_kill_wait(s);
    natsd_free(s);
    return -1;
}

const char *dsec_natsd_url(const dsec_natsd *s)
{
    return s->url;
}

int dsec_natsd_port(const dsec_natsd *s)
{
    return s->port;
}

int dsec_natsd_pid(const dsec_natsd *s)
{
    return (int)s->pid;
}

int dsec_natsd_kill(dsec_natsd *s, dsec_err *err)
{
    if (s->pid <= 0)
        return dsec_err_set(err, DSEC_E_STATE, 0, "nats-server on port %d is not running", s->port);
    child_kill_wait(s);
    return 0;
}

int dsec_natsd_restart(dsec_natsd *s, dsec_err *err)
{
    if (s->pid > 0)
        return dsec_err_set(err, DSEC_E_STATE, 0,
                            "nats-server on port %d is still running (pid %d): kill it first",
                            s->port, (int)s->pid);
    if (spawn(s, err) < 0)
        return dsec_err_wrap(err, "restarting nats-server on port %d", s->port);
    bool exited;
    if (wait_ready(s, &exited, err) < 0)
        return dsec_err_wrap(err, "restarting nats-server");
    return 0;
}

void dsec_natsd_stop(dsec_natsd *s)
{
    if (s == NULL)
        return;
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        struct pollfd pfd = {.fd = s->pidfd, .events = POLLIN};
        int64_t deadline = mono_ms() + STOP_GRACE_MS;
        int64_t left;
        while ((left = deadline - mono_ms()) > 0 && poll(&pfd, 1, (int)left) == 0)
            ;
        /* Past the grace period (or the wait failed): SIGKILL, then reap. */
        child_kill_wait(s);
    }
    natsd_free(s);
}
