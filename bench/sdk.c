/* sdk.c - the C side of make bench S=sdk: asynchronous creates against a running
 * cell with a fixed window in flight, then destroys (not timed). Prints one line
 * "creates_per_s=<x> cpu_us_per_create=<y> ok=<n> failed=<n>" (the CPU of the
 * whole process, every thread, over the timed creates). The Python side is bench/sdk.py; the
 * wrapper bench/sdk.sh starts the cell and runs both against it.
 *
 * usage: bench_sdk_c URL N WINDOW */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsec/alloc.h"
#include "dsec/client.h"

struct run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t inflight, done, ok;
    char (*ids)[DSEC_ID_MAX];
    dsec_err first_err;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_created(int status, const dsec_sandbox_info *info, const dsec_err *err, void *ud)
{
    struct run *r = ud;
    pthread_mutex_lock(&r->mu);
    if (status == 0)
        memcpy(r->ids[r->ok++], info->id, DSEC_ID_MAX);
    else if (r->first_err.code == 0 && err)
        r->first_err = *err;
    r->inflight--;
    r->done++;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s URL N WINDOW\n", argv[0]);
        return 2;
    }
    size_t n = strtoul(argv[2], NULL, 10), window = strtoul(argv[3], NULL, 10);
    /* on_created only counts and signals: it may run where each reply arrives,
     * as the Python SDK's completion-queue pushes do */
    dsec_client_opts o = {.url = argv[1], .name = "bench-sdk-c", .direct_callbacks = true};
    dsec_client *c;
    dsec_err err;
    if (dsec_client_connect(&c, &o, &err) < 0) {
        fprintf(stderr, "bench_sdk_c: %s\n", err.msg);
        return 1;
    }
    struct run r = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    r.ids = dsec_calloc(n, sizeof *r.ids);
    dsec_create_spec spec = {.type = "sim", .cpu_milli = 1, .memory_mb = 1, .ttl_s = 600};
    double t0 = now_s(), c0 = cpu_s();
    for (size_t i = 0; i < n; i++) {
        pthread_mutex_lock(&r.mu);
        while (r.inflight >= window)
            pthread_cond_wait(&r.cv, &r.mu);
        r.inflight++;
        pthread_mutex_unlock(&r.mu);
        if (dsec_create_async(c, &spec, on_created, &r, &err) < 0) {
            pthread_mutex_lock(&r.mu);
            r.inflight--;
            r.done++;
            if (r.first_err.code == 0)
                r.first_err = err;
            pthread_mutex_unlock(&r.mu);
        }
    }
    pthread_mutex_lock(&r.mu);
    while (r.done < n)
        pthread_cond_wait(&r.cv, &r.mu);
    pthread_mutex_unlock(&r.mu);
    double dt = now_s() - t0, cpu = cpu_s() - c0;
    for (size_t i = 0; i < r.ok; i++)
        dsec_destroy(c, r.ids[i], NULL);
    printf("creates_per_s=%.1f cpu_us_per_create=%.1f ok=%zu failed=%zu\n", (double)r.ok / dt,
           cpu / (double)n * 1e6, r.ok, n - r.ok);
    if (r.ok < n)
        fprintf(stderr, "bench_sdk_c: first failure: %s\n", r.first_err.msg);
    dsec_free(r.ids);
    dsec_client_free(c);
    return r.ok == n ? 0 : 1;
}
