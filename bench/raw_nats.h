/* raw_nats.h - the raw nats.c baseline benchmarks print beside their own figures. */
#ifndef DSEC_BENCH_RAW_NATS_H
#define DSEC_BENCH_RAW_NATS_H

/* Publish n 200-byte messages from one connection to an async subscriber on
 * another and return the rate they were received at (msg/s), or 0 when the
 * server cannot be reached. Gives up waiting after 30 s. */
double dsec_bench_raw_publish_rate(const char *url, long n);

#include <stddef.h>
#include <stdint.h>

/* Latencies of n small requests to a responder on another connection, in ms (out[n]): the
 * bus's own round trip. 0, or -1 when the server cannot be reached. */
int dsec_bench_raw_rtt_ms(const char *url, int n, double *out);

/* Move total bytes in chunk-sized messages to a responder that acknowledges each, at most
 * window unacknowledged: MB/s (MiB), or 0 on failure. The yardstick of file transfers. */
double dsec_bench_raw_transfer_mb_s(const char *url, uint64_t total, size_t chunk, int window);

#endif
