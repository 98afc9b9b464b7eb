/* raw_nats.c - raw nats.c publish -> async subscriber: the yardstick for the bus-level benchmarks. */
#include "bench/raw_nats.h"

#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nats/nats.h>

static _Atomic long raw_got;

static void raw_cb(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ud)
{
    atomic_fetch_add(&raw_got, 1);
    natsMsg_Destroy(msg);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double dsec_bench_raw_publish_rate(const char *url, long n)
{
    natsConnection *pub = NULL, *sub = NULL;
    natsSubscription *s = NULL;
    double rate = 0;
    if (natsConnection_ConnectTo(&pub, url) != NATS_OK || natsConnection_ConnectTo(&sub, url) != NATS_OK ||
        natsConnection_Subscribe(&s, sub, "bench.raw", raw_cb, NULL) != NATS_OK)
        goto out;
    natsSubscription_SetPendingLimits(s, -1, -1);
    natsConnection_Flush(sub);
    char payload[200];
    memset(payload, 'x', sizeof payload);
    atomic_store(&raw_got, 0);
    double t0 = now_s();
    for (long i = 0; i < n; i++)
        natsConnection_Publish(pub, "bench.raw", payload, sizeof payload);
    natsConnection_Flush(pub);
    while (atomic_load(&raw_got) < n && now_s() - t0 < 30)
        usleep(1000);
    rate = (double)atomic_load(&raw_got) / (now_s() - t0);
out:
    natsSubscription_Destroy(s);
    natsConnection_Destroy(pub);
    natsConnection_Destroy(sub);
    return rate;
}
