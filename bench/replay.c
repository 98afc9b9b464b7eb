/* replay.c - make bench S=replay: operations per second the replayer issues into a no-op sink,
 * against raw nats.c publish. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/raw_nats.h"

#include "actors/wire.h"
#include "bus/bus.h"
#include "codecs/msg.h"
#include "sim/replay_int.h"

/* The no-op sink: drops every message and answers each create at once with one fixed "created". */
static dsec_buf created;
static int noop_request(void *ctx, const char *subject, const dsec_hdr *h, const void *data,
                        size_t len, int timeout_ms, void *req, dsec_err *err)
{
    (void)ctx, (void)subject, (void)h, (void)data, (void)len, (void)timeout_ms, (void)err;
    sim_replay_answer(req, 0, "created", NULL, created.data, created.len, NULL);
    return 0;
}
static int noop_publish(void *ctx, const char *subject, const dsec_hdr *h, const void *data,
                        size_t len, dsec_err *err)
{
    (void)ctx, (void)subject, (void)h, (void)data, (void)len, (void)err;
    return 0;
}

int main(void)
{
    dsec_err err;
    /* a DSec-profile trace: 10 minutes, bursts up to 32,000 */
    sim_profile p;
    sim_profile_dsec(&p);
    p.duration_s = 600;
    p.rate = 500;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    uint64_t n;
    if (sim_gen(&p, f, "bench", &n, &err) < 0) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    fclose(f);
    sim_trace t;
    if (sim_trace_load_mem(&t, buf, len, "bench", &err) < 0) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    dsec_buf_init(&created);
    dsec_msg_created c = {.id = "n-0000-00000000000000ab", .node = "n-0000", .type = "sim"};
    if (dsec_encode(&created, DSEC_MSG_CREATED, &c, &err) < 0)
        return 1;
    printf("replay bench: DSec-profile trace, %zu creates over %.0f s of trace time (%zu bytes)\n",
           t.n, p.duration_s, len);

    /* the replayer alone, as fast as it goes: creates re-keyed and encoded, answered, destroyed */
    double best = 0;
    sim_replay_result res = {0};
    for (int run = 0; run < 3; run++) {
        sim_sink sink = {.request = noop_request, .publish = noop_publish};
        sim_replay *r;
        sim_replay_opts o = {.speed = 0, .destroy_at_end = true, .drain_s = 1};
        sim_replay_new(&r, &t, &sink, &o, &err);
        sim_replay_run(r, &err);
        sim_replay_result_get(r, &res);
        double rate = (double)(res.ops_sent) / (r->t_end - r->t_start);
        if (rate > best)
            best = rate;
        printf("run %d: %lu operations (%lu creates, %lu destroys) in %.3f s: %.0f ops/s\n",
               run + 1, (unsigned long)res.ops_sent, (unsigned long)res.creates_sent,
               (unsigned long)res.destroys_sent, r->t_end - r->t_start, rate);
        sim_replay_free(r);
    }

    /* the baseline, same run: raw nats.c publish into a subscriber that drops everything */
    char dir[] = "/tmp/dsec-bench-replay-XXXXXX";
    double raw = 0;
    dsec_natsd *nd;
    if (mkdtemp(dir) && dsec_natsd_start(&nd, &(dsec_natsd_opts){.state_dir = dir}, &err) == 0) {
        raw = dsec_bench_raw_publish_rate(dsec_natsd_url(nd), 1000000);
        dsec_natsd_stop(nd);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "bench: could not remove %s\n", dir);
    printf("baseline: raw nats.c publish -> dropping subscriber, 200 B: %.0f msg/s\n", raw);
    printf("target: >= 260000 ops/s (10x the control-plane bench's ~26,000 creates/s): %s\n",
           best >= 260000 ? "met" : "NOT met");
    printf("{\"scenario\":\"replay\",\"ops_per_s\":%.0f,\"target_ops_per_s\":260000,\"raw_nats_"
           "msgs_per_s\":%.0f,"
           "\"trace_creates\":%zu}\n",
           best, raw, t.n);
    sim_trace_free(&t);
    free(buf);
    dsec_buf_release(&created);
    return 0;
}
