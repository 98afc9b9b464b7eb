/* common.h - what the container benchmarks share: a clock, a shell, percentiles, and a run's
 * cleanup (its cell stopped with its sandboxes, its node's upper store unmounted, its directory
 * removed) however the run ends: done, failed, or interrupted. */
#ifndef DSEC_BENCH_COMMON_H
#define DSEC_BENCH_COMMON_H

#include <stddef.h>

#include "actors/cell.h"
#include "dsec/err.h"

/* Seconds on the monotonic clock. */
double dsec_bench_now_s(void);

/* Run a shell line (printf-style); its exit status, or -1 when it did not exit. */
int dsec_bench_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* CPU seconds the whole host has spent busy (every core, every process: /proc/stat), so
 * that a phase's cost in core-seconds is the difference across it; -1 when unreadable. */
double dsec_bench_host_cpu_s(void);

/* A diagnostic: where a phase's CPU goes. With DSEC_BENCH_PERF_CTL naming a FIFO that
 * `perf record --control fifo:FIFO -D -1 ...` reads, the phase named by DSEC_BENCH_PERF_PHASE
 * is recorded: dsec_bench_perf_phase(name) at each phase's start writes "enable" to the FIFO
 * when name is that phase, else "disable". Without the variables it does nothing. */
void dsec_bench_perf_phase(const char *name);

/* The p-th percentile (0..1) of v[0..n), n > 0; sorts v. */
double dsec_bench_pct(double *v, size_t n, double p);

/* Name the run (its messages start "bench NAME: ") and what its cleanup removes: root (the
 * run's directory), after unmounting the upper store of node (its name in root/state); extra,
 * if not NULL, is a shell line run last (cgroups of the run's own). Installs SIGINT and
 * SIGTERM handlers that clean up and exit 130. */
void dsec_bench_run(const char *name, const char *root, const char *node, const char *extra);

/* The cell to stop when the run ends (NULL: none yet). */
void dsec_bench_set_cell(dsec_cell *cell);

/* Stop the cell (its sandboxes destroyed) and remove what dsec_bench_run named. */
void dsec_bench_end(void);

/* Say what failed (err's message, or errno's), clean up as dsec_bench_end, exit 1. */
void dsec_bench_die(const char *what, const dsec_err *err) __attribute__((noreturn));

#endif
