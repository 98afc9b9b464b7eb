/* net.c - `dsec net`: change a running sandbox's network policy, and watch the cell's network
 * alerts. */
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "actors/wire.h"
#include "bus/bus.h"
#include "codecs/subjects.h"
#include "codecs/msg.h"
#include "dsec/client.h"
#include "tools/cli.h"

static int net_usage(void)
{
    fprintf(stderr,
            "usage: dsec net set ID [ENTRY...]     replace the sandbox's network policy\n"
            "       dsec net alerts [--count N] [--timeout S] [--cell CELL]\n"
            "                                       print network alerts as JSON lines\n"
            "entries: a mirror name (pypi), a domain (example.com, *.example.com), an address\n"
            "range (198.51.100.0/24, [2001:db8::/32]), each with optional :PORT[-PORT] and\n"
            "/tcp, /udp, /icmp or /any; no entries: the sandbox reaches nothing\n");
    return 2;
}

static int net_set(int argc, char **argv)
{
    if (argc < 2)
        return net_usage();
    dsec_client *c = NULL;
    dsec_err err;
    if (dsec_client_connect(&c, NULL, &err) < 0) {
        fprintf(stderr, "dsec net set: cannot reach the bus: %s\n", err.msg);
        return 2;
    }
    int rc = dsec_set_network(c, argv[1], (const char *const *)argv + 2, (size_t)argc - 2, &err);
    dsec_client_free(c);
    if (rc < 0) {
        fprintf(stderr, "dsec net set: %s (%s%s)\n", err.msg, dsec_code_name(err.code),
                dsec_code_retry_safe(err.code) ? ", safe to retry" : "");
        return err.code == DSEC_E_INVALID ? 2 : 1;
    }
    return 0;
}

struct watch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t seen, want;
};

static void on_alert(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a;
    struct watch *w = ud;
    dsec_msg_net_alert al;
    dsec_buf json;
    dsec_err err;
    dsec_buf_init(&json);
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_NET_ALERT, dsec_msg_data(m), dsec_msg_len(m), &al,
                    &err) < 0 ||
        dsec_msgpack_to_json(&json, dsec_msg_data(m), dsec_msg_len(m), &err) < 0) {
        fprintf(stderr, "dsec net alerts: bad alert on %s: %s\n", dsec_msg_subject(m), err.msg);
        dsec_buf_release(&json);
        return;
    }
    pthread_mutex_lock(&w->mu);
    fwrite(json.data, 1, json.len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    w->seen++;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    dsec_buf_release(&json);
}

static int net_alerts(int argc, char **argv)
{
    static const struct option opts[] = {{"count", required_argument, 0, 'n'},
                                         {"timeout", required_argument, 0, 't'},
                                         {"cell", required_argument, 0, 'c'},
                                         {0, 0, 0, 0}};
    uint64_t want = 0;
    double timeout_s = 0;
    const char *cell = "*";
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "n:t:c:", opts, NULL)) != -1) {
        if (ch == 'n')
            want = strtoull(optarg, NULL, 10);
        else if (ch == 't')
            timeout_s = atof(optarg);
        else if (ch == 'c')
            cell = optarg;
        else
            return net_usage();
    }
    struct watch w = {.want = want};
    pthread_mutex_init(&w.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cv, &ca);
    pthread_condattr_destroy(&ca);
    dsec_bus *bus = NULL;
    dsec_actor *a = NULL;
    dsec_err err;
    char subj[128];
    snprintf(subj, sizeof subj, DSEC_SUBJ_EVT_OF, cell, "alert", ">");
    dsec_bus_opts bo = {.name = "dsec-net-alerts", .threads = 1, .schema_max = DSEC_SCHEMA_VERSION};
    int rc = 1;
    if (dsec_bus_connect(&bus, &bo, &err) < 0 || dsec_actor_new(&a, bus, "net-alerts", &err) < 0 ||
        dsec_actor_on(a, subj, NULL, on_alert, &w, &err) < 0 ||
        dsec_bus_flush(bus, 2000, &err) < 0) {
        fprintf(stderr, "dsec net alerts: %s\n", err.msg);
        goto out;
    }
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += (time_t)timeout_s;
    dl.tv_nsec += (long)((timeout_s - (double)(time_t)timeout_s) * 1e9);
    if (dl.tv_nsec >= 1000000000) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&w.mu);
    rc = 0;
    while (want == 0 || w.seen < want) {
        if (timeout_s > 0) {
            if (pthread_cond_timedwait(&w.cv, &w.mu, &dl) != 0) {
                rc = want ? 1 : 0; /* fewer alerts than asked for */
                break;
            }
        } else {
            pthread_cond_wait(&w.cv, &w.mu);
        }
    }
    pthread_mutex_unlock(&w.mu);
out:
    dsec_actor_free(a);
    dsec_bus_free(bus);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return rc;
}

int dsec_cli_net(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0)
        return net_usage();
    if (strcmp(argv[1], "set") == 0)
        return net_set(argc - 1, argv + 1);
    if (strcmp(argv[1], "alerts") == 0)
        return net_alerts(argc - 1, argv + 1);
    fprintf(stderr, "dsec net: unknown subcommand \"%s\" (set, alerts)\n", argv[1]);
    return 2;
}
