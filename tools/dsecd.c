/* dsecd.c - the dsec daemon: runs any set of a cell's actors from a config file. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "actors/cell.h"
#include "tools/cli.h"

/* dsecd --config FILE --roles scheduler,node */
int main(int argc, char **argv)
{
    static const struct option opts[] = {{"config", required_argument, 0, 'c'},
                                         {"roles", required_argument, 0, 'r'},
                                         {"metrics", required_argument, 0, 'm'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *config = NULL, *roles_s = "scheduler,node", *metrics = NULL;
    int ch;
    while ((ch = getopt_long(argc, argv, "c:r:m:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'c': config = optarg; break;
        case 'r': roles_s = optarg; break;
        case 'm': metrics = optarg; break;
        default:
            fprintf(stderr, "usage: dsecd --config FILE [--roles scheduler,node,arbiter,quota] "
                            "[--metrics ADDR:PORT]\n");
            return ch == 'h' ? 0 : 2;
        }
    }
    if (config == NULL) {
        fprintf(stderr, "usage: dsecd --config FILE [--roles scheduler,node,arbiter,quota] "
                        "[--metrics ADDR:PORT]\n");
        return 2;
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
        fprintf(stderr, "dsecd: %s: the node role needs at least one entry under \"nodes\"\n", config);
        dsec_cell_conf_release(&conf);
        return 2;
    }
    dsec_cli_block_signals();
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
    dsec_cli_wait_for_signal();
    dsec_cell_stop(cell, false);
    dsec_cell_conf_release(&conf);
    return 0;
}
