/* main.c - the dsec-sim command: gen, stats, replay, cell, record. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "actors/cell.h"
#include "codecs/record.h"
#include "dsec/alloc.h"
#include "sim/sim.h"

static volatile sig_atomic_t stop_flag;
static sim_replay *running;
static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
    if (running)
        sim_replay_stop(running);
}

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: dsec-sim COMMAND ...\n"
        "  gen --profile dsec [-o FILE] [--PARAM VALUE ...]   write a synthetic trace (--help "
        "lists PARAMs)\n"
        "  stats [--json] FILE                                 summarise a trace\n"
        "  replay --trace FILE [--speed X] [--url URL] [--report DIR] [--json]\n"
        "         [--tenant T] [--type T] [--timeout-ms N] [--max-in-flight N] [--drain S] "
        "[--keep]\n"
        "         [--no-lifetimes] [--no-progress] [--cell C]   (--speed 0: as fast as possible)\n"
        "                                                      replay open loop against a running "
        "cell\n"
        "  cell [--nodes N] [--replicas N] [--port P] [--state DIR] [--url-file F] [--time-scale "
        "S]\n"
        "       [--node-cpu MILLI] [--node-memory MB] [--node-slots N]\n"
        "                                                      a whole simulated cell on this "
        "machine\n"
        "  record -o FILE [--url URL] [--subjects S,S,...] [--duration S] [--count N]\n"
        "                                                      tap live traffic into a trace\n");
}

static char *cmdline_of(int argc, char **argv)
{
    static char buf[1024];
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < argc && n < sizeof buf - 2; i++)
        n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%s", i ? " " : "", argv[i]);
    return buf;
}

static int fail(const char *cmd, const dsec_err *e)
{
    fprintf(stderr, "dsec-sim %s: %s\n", cmd, e->msg);
    return 1;
}

static int cmd_gen(int argc, char **argv)
{
    sim_profile p;
    sim_profile_dsec(&p);
    const char *out = NULL;
    dsec_err err;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            printf("dsec-sim gen --profile dsec [-o FILE] [--PARAM VALUE ...]; parameters:\n");
            sim_profile_help(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "dsec-sim gen: %s needs a value\n", argv[i]);
            return 2;
        }
        if (strcmp(argv[i], "--profile") == 0) {
            if (strcmp(argv[++i], "dsec") != 0) {
                fprintf(stderr, "dsec-sim gen: unknown profile '%s' (known: dsec)\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "-o") == 0)
            out = argv[++i];
        else if (strncmp(argv[i], "--", 2) == 0) {
            if (sim_profile_set(&p, argv[i] + 2, argv[i + 1], &err) < 0)
                return fail("gen", &err);
            i++;
        } else {
            fprintf(stderr, "dsec-sim gen: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    FILE *f = out ? fopen(out, "wb") : stdout;
    if (!f) {
        fprintf(stderr, "dsec-sim gen: cannot write %s: %s\n", out, strerror(errno));
        return 1;
    }
    uint64_t n;
    int rc = sim_gen(&p, f, cmdline_of(argc, argv), &n, &err);
    if (out && fclose(f) != 0 && rc == 0)
        rc = dsec_err_set(&err, DSEC_E_IO, errno, "closing %s: %s", out, strerror(errno));
    if (rc < 0)
        return fail("gen", &err);
    if (out)
        fprintf(stderr, "dsec-sim gen: %" PRIu64 " records to %s\n", n, out);
    return 0;
}

static int cmd_stats(int argc, char **argv)
{
    bool json = false;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = true;
        else
            path = argv[i];
    }
    if (!path) {
        fprintf(stderr, "usage: dsec-sim stats [--json] FILE\n");
        return 2;
    }
    sim_trace t;
    sim_stats s;
    dsec_err err;
    if (sim_trace_load(&t, path, &err) < 0)
        return fail("stats", &err);
    sim_stats_compute(&t, &s, &err);
    if (!json)
        printf("trace %s: %s\n", path, t.source);
    sim_stats_print(&s, stdout, json);
    sim_trace_free(&t);
    return 0;
}

/* The replay's figures as one JSON line on stdout (--json). */
static void print_json(sim_replay *r)
{
    sim_replay_result res;
    sim_replay_result_get(r, &res);
    printf("{\"ops_sent\":%" PRIu64 ",\"ops_per_s\":%.1f,\"creates_sent\":%" PRIu64
           ",\"creates_ok\":%" PRIu64 ",\"sandbox_ops\":%" PRIu64 ",\"destroys_sent\":%" PRIu64
           ",\"errors\":%" PRIu64 ",\"unmapped\":%" PRIu64 ",\"waited\":%" PRIu64
           ",\"p50_ms\":%.3f,\"p99_ms\":%.3f"
           ",\"jobs_started\":%" PRIu64 ",\"jobs_failed\":%" PRIu64
           ",\"reclaim_requested\":%" PRIu64 ",\"reclaim_honoured\":%" PRIu64
           ",\"reclaim_forced\":%" PRIu64 ",\"reclaim_failed\":%" PRIu64
           ",\"job_units_released\":%" PRIu64 ",\"rollouts_lost\":%" PRIu64 "}\n",
           res.ops_sent, res.ops_per_s, res.creates_sent, res.creates_ok, res.sbx_sent,
           res.destroys_sent, res.errors, res.unmapped, res.waited, res.lat_p50_ms, res.lat_p99_ms,
           res.jobs_started, res.jobs_failed, res.reclaim_requested, res.reclaim_honoured,
           res.reclaim_forced, res.reclaim_failed, res.job_units_released, res.lost);
}

static int cmd_replay(int argc, char **argv)
{
    sim_replay_opts o = {.speed = 1, .destroy_at_end = true, .progress = isatty(2)};
    const char *trace = NULL, *url = getenv("DSEC_URL"), *dir = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0)
            json = true;
        else if (strcmp(a, "--keep") == 0)
            o.destroy_at_end = false;
        else if (strcmp(a, "--no-lifetimes") == 0)
            o.no_lifetimes = true;
        else if (strcmp(a, "--no-progress") == 0)
            o.progress = false;
        else if (i + 1 >= argc) {
            fprintf(stderr, "dsec-sim replay: %s needs a value (or is unknown)\n", a);
            return 2;
        } else if (strcmp(a, "--trace") == 0)
            trace = argv[++i];
        else if (strcmp(a, "--speed") == 0) {
            char *end;
            o.speed = strtod(argv[++i], &end);
            if (*end || o.speed < 0) {
                fprintf(
                    stderr,
                    "dsec-sim replay: --speed '%s' is not a number >= 0 (0: as fast as possible)\n",
                    argv[i]);
                return 2;
            }
        } else if (strcmp(a, "--url") == 0)
            url = argv[++i];
        else if (strcmp(a, "--report") == 0)
            dir = argv[++i];
        else if (strcmp(a, "--tenant") == 0)
            o.tenant = argv[++i];
        else if (strcmp(a, "--type") == 0)
            o.force_type = argv[++i];
        else if (strcmp(a, "--timeout-ms") == 0)
            o.timeout_ms = atoi(argv[++i]);
        else if (strcmp(a, "--max-in-flight") == 0)
            o.max_in_flight = atol(argv[++i]);
        else if (strcmp(a, "--drain") == 0)
            o.drain_s = atof(argv[++i]);
        else if (strcmp(a, "--cell") == 0)
            o.cell = argv[++i];
        else {
            fprintf(stderr, "dsec-sim replay: unknown option %s\n", a);
            return 2;
        }
    }
    if (!trace) {
        fprintf(stderr, "dsec-sim replay: --trace FILE is required\n");
        return 2;
    }
    dsec_err err;
    sim_trace t;
    if (sim_trace_load(&t, trace, &err) < 0)
        return fail("replay", &err);
    dsec_bus *bus;
    dsec_bus_opts bo = {.url = url,
                        .name = "dsec-sim replay",
                        .threads = 2,
                        .mailbox_max = 1 << 20,
                        .low_latency = true};
    if (dsec_bus_connect(&bus, &bo, &err) < 0) {
        sim_trace_free(&t);
        return fail("replay", &err);
    }
    sim_sink sink;
    sim_bus_sink *bs = NULL;
    sim_replay *r = NULL;
    int rc = 1;
    if (sim_bus_sink_new(&bs, bus, &sink, &err) < 0)
        goto out;
    if (url)
        sink.job_url = url; /* as given: it may carry credentials the connected URL does not show */
    if (sim_replay_new(&r, &t, &sink, &o, &err) < 0 || sim_bus_sink_observe(bs, r, &err) < 0)
        goto out;
    running = r;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    /* the starting loads: every node answers a sync with a full report */
    uint64_t sync;
    if (sim_bus_sink_sync(bs, &sync, &err) < 0)
        goto out;
    sim_replay_sync_wait(r, sync, 100, 2000);
    if (sim_replay_run(r, &err) < 0)
        goto out;
    /* and the loads at the end, from every node heard */
    if (sim_bus_sink_sync(bs, &sync, &err) < 0)
        goto out;
    sim_replay_sync_wait(r, sync, 0, 3000);
    running = NULL;
    if (sim_replay_report(r, dir, json ? stderr : stdout, &err) < 0)
        goto out;
    if (json)
        print_json(r);
    rc = 0;
out:
    if (rc)
        fail("replay", &err);
    running = NULL;
    if (bs)
        sim_bus_sink_free(bs);
    dsec_bus_free(bus);
    sim_replay_free(r);
    sim_trace_free(&t);
    return rc;
}

static int cmd_cell(int argc, char **argv)
{
    long nodes = 160, replicas = 2;
    uint64_t node_cpu = 192000, node_mem = 1572864, node_slots = 3000;
    int port = 0;
    const char *state = NULL, *url_file = NULL, *scale = "0";
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) {
            fprintf(stderr, "dsec-sim cell: %s needs a value\n", argv[i]);
            return 2;
        }
        const char *a = argv[i], *v = argv[++i];
        if (strcmp(a, "--nodes") == 0)
            nodes = atol(v);
        else if (strcmp(a, "--replicas") == 0)
            replicas = atol(v);
        else if (strcmp(a, "--port") == 0)
            port = atoi(v);
        else if (strcmp(a, "--state") == 0)
            state = v;
        else if (strcmp(a, "--url-file") == 0)
            url_file = v;
        else if (strcmp(a, "--time-scale") == 0)
            scale = v;
        else if (strcmp(a, "--node-cpu") == 0 || strcmp(a, "--node-memory") == 0 ||
                 strcmp(a, "--node-slots") == 0) {
            char *end;
            errno = 0;
            unsigned long long x = strtoull(v, &end, 10);
            if (errno || end == v || *end || x == 0) {
                fprintf(stderr, "dsec-sim cell: %s '%s' is not a positive whole number\n", a, v);
                return 2;
            }
            *(a[7] == 'c' ? &node_cpu : a[7] == 'm' ? &node_mem : &node_slots) = x;
        } else {
            fprintf(stderr, "dsec-sim cell: unknown option %s\n", a);
            return 2;
        }
    }
    if (nodes < 1 || nodes > DSEC_CELL_MAX_NODES || replicas < 1 || replicas > 16) {
        fprintf(stderr, "dsec-sim cell: need 1 <= --nodes <= %d and 1 <= --replicas <= 16\n",
                DSEC_CELL_MAX_NODES);
        return 2;
    }
    char tmp[] = "/tmp/dsec-sim-cell-XXXXXX";
    bool own_state = !state;
    if (!state && !(state = mkdtemp(tmp))) {
        fprintf(stderr, "dsec-sim cell: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    dsec_cell_conf c;
    dsec_cell_conf_defaults(&c);
    snprintf(c.cell, sizeof c.cell, "sim");
    snprintf(c.state_dir, sizeof c.state_dir, "%s", state);
    c.embedded_nats = true;
    c.jetstream = true;
    c.nats_port = port;
    c.sched_replicas = (unsigned)replicas;
    c.threads = 2;
    c.capacity_ms = 100;
    c.default_ttl_s = 7200;
    dsec_err err;
    static const char *const types[] = {"sim", "function", "container", "microvm", "vm", NULL};
    if (dsec_cell_conf_add_sim_nodes(&c, "n", (size_t)nodes, node_cpu, node_mem, node_slots, types,
                                     scale, &err) < 0)
        return fail("cell", &err);
    dsec_cell *cell;
    if (dsec_cell_start(&cell, &c, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE | DSEC_ROLE_ARBITER, &err) <
        0) {
        dsec_cell_conf_release(&c);
        return fail("cell", &err);
    }
    dsec_cell_conf_release(&c);
    const char *url = dsec_cell_url(cell);
    printf("dsec-sim cell: %s, %ld sim nodes, %ld scheduler replicas, arbiter; state in %s\n", url,
           nodes, replicas, state);
    fflush(stdout);
    if (url_file) {
        char tmpf[1100];
        snprintf(tmpf, sizeof tmpf, "%s.tmp", url_file);
        FILE *f = fopen(tmpf, "w");
        if (!f || fprintf(f, "%s\n", url) < 0 || fclose(f) != 0 || rename(tmpf, url_file) < 0) {
            fprintf(stderr, "dsec-sim cell: cannot write %s: %s\n", url_file, strerror(errno));
            dsec_cell_stop(cell, true);
            return 1;
        }
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    while (!stop_flag)
        pause();
    dsec_cell_stop(cell, true);
    if (own_state) { /* a temporary cell leaves nothing behind */
        char cmd[1100];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", state);
        if (system(cmd) != 0)
            fprintf(stderr, "dsec-sim cell: could not remove %s\n", state);
    }
    return 0;
}

static int cmd_record(int argc, char **argv)
{
    const char *out = NULL, *url = getenv("DSEC_URL");
    char *subjects = NULL;
    double duration = 0;
    long count = 0;
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc) {
            fprintf(stderr, "dsec-sim record: %s needs a value\n", argv[i]);
            return 2;
        }
        const char *a = argv[i], *v = argv[++i];
        if (strcmp(a, "-o") == 0)
            out = v;
        else if (strcmp(a, "--url") == 0)
            url = v;
        else if (strcmp(a, "--subjects") == 0)
            subjects = dsec_strdup(v);
        else if (strcmp(a, "--duration") == 0)
            duration = atof(v);
        else if (strcmp(a, "--count") == 0)
            count = atol(v);
        else {
            fprintf(stderr, "dsec-sim record: unknown option %s\n", a);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "dsec-sim record: -o FILE is required\n");
        return 2;
    }
    const char *subj[64];
    size_t ns = 0;
    if (subjects)
        for (char *save = NULL, *s = strtok_r(subjects, ",", &save); s && ns < 63;
             s = strtok_r(NULL, ",", &save))
            subj[ns++] = s;
    subj[ns] = NULL;
    dsec_err err;
    FILE *f = fopen(out, "wb");
    if (!f) {
        fprintf(stderr, "dsec-sim record: cannot write %s: %s\n", out, strerror(errno));
        dsec_free(subjects);
        return 1;
    }
    dsec_bus *bus;
    dsec_bus_opts bo = {
        .url = url, .name = "dsec-sim record", .threads = 1, .mailbox_max = 1 << 20};
    sim_recorder *rec;
    if (dsec_bus_connect(&bus, &bo, &err) < 0) {
        fclose(f);
        dsec_free(subjects);
        return fail("record", &err);
    }
    if (sim_record_start(&rec, bus, f, ns ? subj : NULL, cmdline_of(argc, argv), &err) < 0) {
        dsec_bus_free(bus);
        fclose(f);
        dsec_free(subjects);
        return fail("record", &err);
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    fprintf(stderr, "dsec-sim record: tapping %s into %s (Ctrl-C stops)\n", url ? url : "the bus",
            out);
    double t0 = sim_now();
    while (!stop_flag && (duration <= 0 || sim_now() - t0 < duration) &&
           (count <= 0 || (long)sim_record_count(rec) < count))
        usleep(20000);
    uint64_t n = sim_record_count(rec), dropped = 0;
    int rc = sim_record_stop(rec, &dropped, &err);
    dsec_bus_free(bus);
    if (fclose(f) != 0 && rc == 0)
        rc = dsec_err_set(&err, DSEC_E_IO, errno, "closing %s: %s", out, strerror(errno));
    dsec_free(subjects);
    if (rc < 0)
        return fail("record", &err);
    fprintf(stderr,
            "dsec-sim record: %" PRIu64 " records, %" PRIu64 " messages dropped by the tap\n", n,
            dropped);
    return dropped ? 3 : 0;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *c = argv[1];
    if (strcmp(c, "gen") == 0)
        return cmd_gen(argc - 1, argv + 1);
    if (strcmp(c, "stats") == 0)
        return cmd_stats(argc - 1, argv + 1);
    if (strcmp(c, "replay") == 0)
        return cmd_replay(argc - 1, argv + 1);
    if (strcmp(c, "cell") == 0)
        return cmd_cell(argc - 1, argv + 1);
    if (strcmp(c, "record") == 0)
        return cmd_record(argc - 1, argv + 1);
    fprintf(stderr, "dsec-sim: unknown command '%s'\n", c);
    usage(stderr);
    return 2;
}
