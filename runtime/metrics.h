/* metrics.h - Prometheus metrics: lock-free latency histograms, the HTTP endpoint. */
#ifndef DSEC_ACTORS_METRICS_H
#define DSEC_ACTORS_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dsec/err.h"

/* ---- histograms --------------------------------------------------------------------------
 * A latency histogram the hot path feeds with two relaxed atomic adds and
 * no lock: per-bucket counts (not cumulative; the exposition sums them) and
 * the sum in nanoseconds. Embed one in the actor that measures and zero it
 * (calloc or memset) before use. */
#define DSEC_METRICS_HIST_BOUNDS 16

/* Upper bounds of the buckets in seconds, ascending; +Inf follows. */
extern const double dsec_metrics_hist_le[DSEC_METRICS_HIST_BOUNDS];

typedef struct dsec_metrics_hist {
    _Atomic uint64_t bucket[DSEC_METRICS_HIST_BOUNDS + 1]; /* the last is +Inf */
    _Atomic uint64_t sum_ns;
} dsec_metrics_hist;

/* A consistent copy: count is the sum of the buckets read. */
typedef struct dsec_metrics_hist_snap {
    uint64_t bucket[DSEC_METRICS_HIST_BOUNDS + 1];
    uint64_t count;
    uint64_t sum_ns;
} dsec_metrics_hist_snap;

void dsec_metrics_hist_observe(dsec_metrics_hist *h, uint64_t ns);
void dsec_metrics_hist_read(const dsec_metrics_hist *h, dsec_metrics_hist_snap *out);

/* ---- the text exposition format (0.0.4) ------------------------------------------------- */

/* A growing text buffer. An allocation failure is remembered (failed) and
 * later appends do nothing, so a renderer checks once at the end. */
typedef struct dsec_metrics_text {
    char *data; /* owned; dsec_metrics_text_release frees it */
    size_t len, cap;
    int failed;
} dsec_metrics_text;

void dsec_metrics_text_release(dsec_metrics_text *t);
/* "# HELP name help\n# TYPE name type\n"; type is counter, gauge or histogram. */
void dsec_metrics_family(dsec_metrics_text *t, const char *name, const char *type,
                         const char *help);
/* One sample "name{k="v",...} value\n". labels holds nlabels key/value pairs
 * (keys are trusted identifiers; values are escaped: \\, \" and \n). */
void dsec_metrics_sample(dsec_metrics_text *t, const char *name, const char *const *labels,
                         size_t nlabels, double value);
/* The _bucket, _sum and _count samples of a histogram family name. */
void dsec_metrics_hist_samples(dsec_metrics_text *t, const char *name, const char *const *labels,
                               size_t nlabels, const dsec_metrics_hist_snap *h);

/* ---- the server --------------------------------------------------------------------------
 * libmicrohttpd on one thread of its own polls a listening socket and its
 * clients, all non-blocking: request headers beyond about 8 KiB are answered
 * 431, a client silent (sending nothing, or taking none of its answer) for
 * half of timeout_ms, rounded up to whole seconds, is closed, and at most 64
 * clients are served at once (more wait to be accepted). It calls render
 * for every GET /metrics (on its own thread); render reads the actors'
 * counters and must take no lock for long. Every answer closes its
 * connection. Other paths answer 404, other methods 405, malformed requests
 * 400 (or what libmicrohttpd answers: 505 for another HTTP version, a close
 * for a request line it cannot split). */
typedef int (*dsec_metrics_render_fn)(dsec_metrics_text *t, void *ud);

typedef struct dsec_metrics_opts {
    const char *listen;  /* "HOST:PORT", "[V6]:PORT" or ":PORT" (every address); port 0
                            picks a free one (dsec_metrics_port tells which) */
    uint32_t timeout_ms; /* per client: twice the silence allowed (see above); 0: 5000 */
    dsec_metrics_render_fn render;
    void *ud; /* handed to render; must outlive the server */
} dsec_metrics_opts;

typedef struct dsec_metrics dsec_metrics;

/* Bind and start serving. Errors name the address. *out is freed by
 * dsec_metrics_stop. */
int dsec_metrics_start(dsec_metrics **out, const dsec_metrics_opts *opts, dsec_err *err);
/* The port bound (useful after port 0). */
uint16_t dsec_metrics_port(const dsec_metrics *m);
/* Stop the thread, close every client and free. NULL is a no-op. */
void dsec_metrics_stop(dsec_metrics *m);

/* Check a listen address without binding: 0, or -1 naming what is wrong. */
int dsec_metrics_listen_check(const char *listen, dsec_err *err);

#endif
