/* up.c - `dsec up` (an embedded one-node cell in the foreground) and the dsecd daemon's main. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/cell.h"
#include "tools/cli.h"

int dsec_cli_wait_for_signal(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    int sig = 0;
    sigwait(&set, &sig);
    return sig;
}

/* Block the stop signals in every thread so sigwait gets them; call before
 * any thread starts. */
void dsec_cli_block_signals(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static void embedded_defaults(dsec_cell_conf *conf)
{
    dsec_cell_conf_defaults(conf);
    conf->embedded_nats = true;
}

/* One node named local-0 offering sim, unless the config gave nodes. */
static int ensure_node(dsec_cell_conf *conf, dsec_err *err)
{
    if (conf->nnodes > 0)
        return 0;
    static const char *const types[] = {"sim", NULL};
    if (dsec_cell_conf_add_sim_nodes(conf, "local", 1, 8000, 16384, 1024, types, NULL, err) < 0)
        return -1;
    snprintf(conf->nodes[0].name, sizeof conf->nodes[0].name, "local-0");
    return 0;
}

int dsec_cli_up(int argc, char **argv)
{
    static const struct option opts[] = {{"config", required_argument, 0, 'c'},
                                         {"port", required_argument, 0, 'p'},
                                         {"state-dir", required_argument, 0, 's'},
                                         {"metrics", required_argument, 0, 'm'},
                                         {0, 0, 0, 0}};
    dsec_cell_conf conf;
    embedded_defaults(&conf);
    const char *config = NULL, *port = NULL, *state = NULL, *metrics = NULL;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "c:p:s:m:", opts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            config = optarg;
            break;
        case 'p':
            port = optarg;
            break;
        case 's':
            state = optarg;
            break;
        case 'm':
            metrics = optarg;
            break;
        default:
            fprintf(stderr, "usage: dsec up [--config FILE] [--port N] [--state-dir DIR] "
                            "[--metrics ADDR:PORT]\n");
            return 2;
        }
    }
    dsec_err err;
    if ((config != NULL && dsec_cell_conf_load(&conf, config, &err) < 0) ||
        (metrics != NULL && dsec_cell_conf_set_metrics(&conf, metrics, &err) < 0)) {
        fprintf(stderr, "dsec up: %s\n", err.msg);
        dsec_cell_conf_release(&conf);
        return 2;
    }
    conf.embedded_nats = true;
    if (port != NULL)
        conf.nats_port = atoi(port);
    char dir[sizeof conf.state_dir];
    snprintf(dir, sizeof dir, "%s", state != NULL ? state : conf.state_dir);
    if (dsec_cell_conf_set_state_dir(&conf, dir, &err) < 0 || ensure_node(&conf, &err) < 0) {
        fprintf(stderr, "dsec up: %s\n", err.msg);
        dsec_cell_conf_release(&conf);
        return 1;
    }
    dsec_cli_block_signals();
    dsec_cell *cell;
    int roles = DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE | (conf.jetstream ? DSEC_ROLE_ARBITER : 0);
    if (dsec_cell_start(&cell, &conf, roles, &err) < 0) {
        fprintf(stderr, "dsec up: %s\n", err.msg);
        dsec_cell_conf_release(&conf);
        return 1;
    }
    printf("dsec up: cell %s on %s: %zu node(s), %zu scheduler(s); state in %s\n"
           "dsec up: export DSEC_URL=%s; Ctrl-C stops\n",
           conf.cell, dsec_cell_url(cell), dsec_cell_node_count(cell), dsec_cell_sched_count(cell),
           conf.state_dir, dsec_cell_url(cell));
    if (dsec_cell_metrics_port(cell) != 0)
        printf("dsec up: metrics on %s (port %u): GET /metrics\n", conf.metrics_listen,
               dsec_cell_metrics_port(cell));
    fflush(stdout);
    int sig = dsec_cli_wait_for_signal();
    printf("dsec up: signal %d, stopping (sandboxes are kept and re-adopted next time)\n", sig);
    dsec_cell_stop(cell, false);
    dsec_cell_conf_release(&conf);
    return 0;
}
