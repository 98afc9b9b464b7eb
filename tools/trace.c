/* trace.c - `dsec trace TRACE_ID`: where one recent request went and how long each actor took. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsec/client.h"
#include "tools/cli.h"

static int usage(FILE *out)
{
    fprintf(out, "usage: dsec trace [--window MS] TRACE_ID\n\n"
                 "Ask every dsec process for the hops of the request that carried TRACE_ID\n"
                 "(its Dsec-Trace-Id; set one with DSEC_TRACE_ID=ID dsec create ...) and print\n"
                 "them in time order: when each actor started on it (ms after the first hop),\n"
                 "how long it took, what it handled and what it sent. Processes keep a bounded,\n"
                 "sampled record (trace.sample_rate, trace.slow_ms, trace.ring): errors and slow\n"
                 "hops always, others only when the id was sampled.\n\n"
                 "  --window MS   how long to gather answers (default 500)\n");
    return out == stdout ? 0 : 2;
}

static double ms(uint64_t ns)
{
    return (double)ns / 1e6;
}

int dsec_cli_trace(int argc, char **argv)
{
    static const struct option opts[] = {{"window", required_argument, NULL, 'w'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int window = 500, ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "w:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'w':
            window = atoi(optarg);
            if (window <= 0 || window > 60000) {
                fprintf(stderr, "dsec trace: --window takes 1..60000 ms\n");
                return 2;
            }
            break;
        case 'h':
            return usage(stdout);
        default:
            return usage(stderr);
        }
    }
    if (optind != argc - 1)
        return usage(stderr);
    const char *id = argv[optind];
    dsec_client *c = NULL;
    dsec_err err;
    if (dsec_client_connect(&c, NULL, &err) < 0) {
        fprintf(stderr, "dsec trace: cannot reach the bus at %s: %s\n",
                getenv("DSEC_URL") ? getenv("DSEC_URL") : "nats://127.0.0.1:4222", err.msg);
        return 2;
    }
    dsec_trace_hop_info *h = NULL;
    size_t n = 0, answered = 0;
    int rc = dsec_trace_hops(c, id, window, &h, &n, &answered, &err);
    dsec_client_free(c);
    if (rc < 0) {
        fprintf(stderr, "dsec trace: %s (%s)\n", err.msg, dsec_code_name(err.code));
        return err.code == DSEC_E_INVALID ? 2 : 1;
    }
    if (n == 0) {
        fprintf(stderr,
                "dsec trace: no hops of %s kept by the %zu process(es) that answered: not sampled "
                "(and neither an error nor slow), or already overwritten\n",
                id, answered);
        dsec_trace_hops_free(h);
        return 1;
    }
    uint64_t t0 = h[0].start_ns, last = 0;
    for (size_t i = 0; i < n; i++)
        if (h[i].end_ns > last)
            last = h[i].end_ns;
    printf("trace %s: %zu hop(s), %.3f ms from first to last, %zu process(es) answered\n", id, n,
           ms(last - t0), answered);
    printf("%10s %10s  %-22s %-12s %-12s %-7s %s\n", "START_MS", "TOOK_MS", "ACTOR", "HANDLED",
           "SENT", "KEPT", "SUBJECT");
    for (size_t i = 0; i < n; i++)
        printf("%10.3f %10.3f  %-22s %-12s %-12s %-7s %s%s\n", ms(h[i].start_ns - t0),
               ms(h[i].end_ns - h[i].start_ns), h[i].actor, h[i].type[0] ? h[i].type : "-",
               h[i].sent[0] ? h[i].sent : "-", h[i].kept, h[i].subject,
               h[i].error ? "  ERROR" : "");
    dsec_trace_hops_free(h);
    return 0;
}
