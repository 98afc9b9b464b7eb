/* raw_nats.c - raw nats.c publish -> async subscriber: the yardstick for the bus-level benchmarks.
 */
#include "bench/raw_nats.h"

#include <stdatomic.h>
#include <stdlib.h>
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
    if (natsConnection_ConnectTo(&pub, url) != NATS_OK ||
        natsConnection_ConnectTo(&sub, url) != NATS_OK ||
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

/* ---- request/reply baselines: round trips, and bytes moved in chunks with a window ---- */

static void echo_cb(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ud)
{
    (void)sub;
    (void)ud;
    const char *reply = natsMsg_GetReply(msg);
    if (reply != NULL)
        natsConnection_Publish(nc, reply, "k", 1); /* an acknowledgement, as a node's answer */
    natsMsg_Destroy(msg);
}

/* Latencies of n 64-byte requests answered by a responder on another connection (ms each,
 * into out[n]); 0 on success. */
int dsec_bench_raw_rtt_ms(const char *url, int n, double *out)
{
    natsConnection *req = NULL, *rsp = NULL;
    natsSubscription *s = NULL;
    int rc = -1;
    if (natsConnection_ConnectTo(&req, url) != NATS_OK ||
        natsConnection_ConnectTo(&rsp, url) != NATS_OK ||
        natsConnection_Subscribe(&s, rsp, "bench.raw.rtt", echo_cb, NULL) != NATS_OK ||
        natsConnection_Flush(rsp) != NATS_OK)
        goto out;
    char payload[64];
    memset(payload, 'x', sizeof payload);
    for (int i = 0; i < n; i++) {
        natsMsg *reply = NULL;
        double t0 = now_s();
        if (natsConnection_Request(&reply, req, "bench.raw.rtt", payload, sizeof payload, 5000) !=
            NATS_OK)
            goto out;
        out[i] = (now_s() - t0) * 1000;
        natsMsg_Destroy(reply);
    }
    rc = 0;
out:
    natsSubscription_Destroy(s);
    natsConnection_Destroy(req);
    natsConnection_Destroy(rsp);
    return rc;
}

static _Atomic long acks;

static void ack_cb(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *ud)
{
    atomic_fetch_add(&acks, 1);
    natsMsg_Destroy(msg);
}

double dsec_bench_raw_transfer_mb_s(const char *url, uint64_t total, size_t chunk, int window)
{
    natsConnection *snd = NULL, *rsp = NULL;
    natsSubscription *s = NULL, *a = NULL;
    double rate = 0;
    char *buf = malloc(chunk);
    if (buf == NULL || natsConnection_ConnectTo(&snd, url) != NATS_OK ||
        natsConnection_ConnectTo(&rsp, url) != NATS_OK ||
        natsConnection_Subscribe(&s, rsp, "bench.raw.xfer", echo_cb, NULL) != NATS_OK ||
        natsConnection_Subscribe(&a, snd, "bench.raw.ack", ack_cb, NULL) != NATS_OK ||
        natsConnection_Flush(rsp) != NATS_OK || natsConnection_Flush(snd) != NATS_OK)
        goto out;
    natsSubscription_SetPendingLimits(s, -1, -1);
    memset(buf, 'x', chunk);
    long n = (long)((total + chunk - 1) / chunk);
    atomic_store(&acks, 0);
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        while (i - atomic_load(&acks) >= window && now_s() - t0 < 120)
            usleep(50);
        if (natsConnection_PublishRequest(snd, "bench.raw.xfer", "bench.raw.ack", buf,
                                          (int)chunk) != NATS_OK)
            goto out;
    }
    while (atomic_load(&acks) < n && now_s() - t0 < 120)
        usleep(100);
    if (atomic_load(&acks) == n)
        rate = (double)total / (1 << 20) / (now_s() - t0);
out:
    natsSubscription_Destroy(s);
    natsSubscription_Destroy(a);
    natsConnection_Destroy(snd);
    natsConnection_Destroy(rsp);
    free(buf);
    return rate;
}
