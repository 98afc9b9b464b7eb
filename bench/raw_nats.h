/* raw_nats.h - the raw nats.c baseline benchmarks print beside their own figures. */
#ifndef DSEC_BENCH_RAW_NATS_H
#define DSEC_BENCH_RAW_NATS_H

/* Publish n 200-byte messages from one connection to an async subscriber on
 * another and return the rate they were received at (msg/s), or 0 when the
 * server cannot be reached. Gives up waiting after 30 s. */
double dsec_bench_raw_publish_rate(const char *url, long n);

#endif
