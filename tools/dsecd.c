/* dsecd.c - the dsec daemon: runs any set of a cell's actors from a config file. */
#define _GNU_SOURCE /* dup3 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "actors/cell.h"
#include "dsec/io.h"
#include "dsec/log.h"
#include "tools/cli.h"

#define USAGE                                                                                      \
    "usage: dsecd --config FILE [--roles scheduler,node,arbiter,quota] [--metrics ADDR:PORT]\n"    \
    "             [--log-file PATH] [--log-level error|warn|info|debug]\n"

/* --log-file: each library line with its UTC time and level, appended with one write (O_APPEND:
 * several writers and copytruncate rotation keep whole lines). */
static void log_to_file(dsec_log_level level, const char *msg, void *ud)
{
    int fd = *(int *)ud;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char line[4096 + 64];
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s\n",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, dsec_log_level_name(level), msg);
    if (n > 0)
        (void)dsec_write_all(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

/* Until SIGINT or SIGTERM. SIGHUP reopens --log-file, for rotation by rename (logrotate
 * without copytruncate): the new file takes the old one's descriptor (dup3), so each line
 * goes whole to one file or the other. The signals are blocked in every thread. */
static void run_until_stopped(const char *log_file, int log_fd)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0 || sig != SIGHUP)
            return;
        if (log_file == NULL) {
            dsec_log_info("dsecd: SIGHUP: no --log-file to reopen");
            continue;
        }
        int fd = open(log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
        if (fd < 0 || dup3(fd, log_fd, O_CLOEXEC) < 0) {
            dsec_log_error("dsecd: SIGHUP: reopening %s: %s; still writing to the file it had",
                           log_file, strerror(errno));
            if (fd >= 0)
                close(fd);
            continue;
        }
        close(fd);
        dsec_log_info("dsecd: SIGHUP: reopened %s", log_file);
    }
}

/* dsecd --config FILE --roles scheduler,node */
int main(int argc, char **argv)
{
    static const struct option opts[] = {{"config", required_argument, 0, 'c'},
                                         {"roles", required_argument, 0, 'r'},
                                         {"metrics", required_argument, 0, 'm'},
                                         {"log-file", required_argument, 0, 'l'},
                                         {"log-level", required_argument, 0, 'L'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *config = NULL, *roles_s = "scheduler,node", *metrics = NULL, *log_file = NULL;
    dsec_log_level level = DSEC_LOG_INFO;
    int ch;
    while ((ch = getopt_long(argc, argv, "c:r:m:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            config = optarg;
            break;
        case 'r':
            roles_s = optarg;
            break;
        case 'm':
            metrics = optarg;
            break;
        case 'l':
            log_file = optarg;
            break;
        case 'L':
            if (dsec_log_level_parse(optarg, &level) < 0) {
                fprintf(stderr, "dsecd: --log-level %s: expected error, warn, info or debug\n",
                        optarg);
                return 2;
            }
            break;
        default:
            fprintf(stderr, USAGE);
            return ch == 'h' ? 0 : 2;
        }
    }
    if (config == NULL) {
        fprintf(stderr, USAGE);
        return 2;
    }
    dsec_log_set_level(level);
    /* without --log-file the library's lines go to stderr as they are (journald stamps them) */
    static int log_fd = -1;
    if (log_file != NULL) {
        log_fd = open(log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
        if (log_fd < 0) {
            fprintf(stderr, "dsecd: --log-file %s: %s\n", log_file, strerror(errno));
            return 2;
        }
        dsec_log_set_hook(log_to_file, &log_fd);
    }
    dsec_err err;
    int roles;
    dsec_cell_conf conf;
    dsec_cell_conf_defaults(&conf);
    if (dsec_cell_roles_parse(roles_s, &roles, &err) < 0 ||
        dsec_cell_conf_load(&conf, config, &err) < 0 ||
        (metrics != NULL && dsec_cell_conf_set_metrics(&conf, metrics, &err) < 0)) {
        fprintf(stderr, "dsecd: %s\n", err.msg);
        dsec_cell_conf_release(&conf);
        return 2;
    }
    if ((roles & DSEC_ROLE_NODE) && conf.nnodes == 0) {
        fprintf(stderr, "dsecd: %s: the node role needs at least one entry under \"nodes\"\n",
                config);
        dsec_cell_conf_release(&conf);
        return 2;
    }
    dsec_cli_block_signals();
    sigset_t hup;
    sigemptyset(&hup);
    sigaddset(&hup, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &hup, NULL); /* run_until_stopped takes it */
    dsec_cell *cell;
    if (dsec_cell_start(&cell, &conf, roles, &err) < 0) {
        fprintf(stderr, "dsecd: %s\n", err.msg);
        dsec_cell_conf_release(&conf);
        return 1;
    }
    fprintf(stderr, "dsecd: cell %s on %s: %zu node(s), %zu scheduler(s)\n", conf.cell,
            dsec_bus_url_shown(dsec_cell_bus(cell)), dsec_cell_node_count(cell),
            dsec_cell_sched_count(cell));
    if (dsec_cell_metrics_port(cell) != 0)
        fprintf(stderr, "dsecd: metrics on %s (port %u): GET /metrics\n", conf.metrics_listen,
                dsec_cell_metrics_port(cell));
    run_until_stopped(log_file, log_fd);
    dsec_cell_stop(cell, false);
    dsec_cell_conf_release(&conf);
    return 0;
}
