/* report.c - a replay's report: JSON summary, text table, plot data and gnuplot PNGs. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "dsec/alloc.h"
#include "sim/replay_int.h"

static FILE *open_in(const char *dir, const char *name, dsec_err *err)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    if (!f)
        dsec_err_set(err, DSEC_E_IO, errno, "report: cannot write %s: %s", p, strerror(errno));
    return f;
}

static const char plots[] =
    "set terminal pngcairo size 900,420 noenhanced\n"
    "set grid\n"
    "set key outside right\n"
    "set xlabel 'replay time (s)'\n"
    "set output 'creates.png'\nset title 'creates per second'\nset ylabel 'creates/s'\n"
    "plot 'series.dat' using 1:($2/BS) with steps title 'sent', '' using 1:($3/BS) with steps "
    "title 'created'\n"
    "set output 'latency.png'\nset title 'create latency percentiles (from the scheduled send "
    "time)'\n"
    "set ylabel 'ms'\nset logscale y\n"
    "plot 'series.dat' using 1:11 with lines title 'p50', '' using 1:12 with lines title 'p99', "
    "'' using 1:13 with lines title 'max'\nunset logscale y\n"
    "set output 'live.png'\nset title 'live sandboxes'\nset ylabel 'sandboxes'\n"
    "plot 'series.dat' using 1:5 with lines title 'replayer view', '' using 1:6 with lines title "
    "'nodes report'\n"
    "set output 'reclaims.png'\nset title 'reclaim events'\nset ylabel 'events'\n"
    "plot 'series.dat' using ($1-BS/4):8 with impulses lw 3 title 'requested', '' using 1:9 with "
    "impulses lw 3 "
    "title 'honoured', '' using ($1+BS/4):10 with impulses lw 3 title 'forced', '' using "
    "($1+BS/2):14 with "
    "impulses lw 3 title 'failed'\n"
    "set output 'errors.png'\nset title 'errors by kind'\nset ylabel 'count'\nset xlabel ''\n"
    "set style fill solid\nset boxwidth 0.6\nset xtics rotate by -30\n"
    "plot 'errors.dat' using 0:2:xtic(1) with boxes title 'errors'\n"
    "set output 'nodes.png'\nset title 'load per node (live sandboxes)'\nset xlabel 'node'\n"
    "set ylabel 'sandboxes'\nset xtics auto norotate\n"
    "plot 'nodes.dat' using 0:2 with boxes title 'at the end', '' using 0:3 with points pt 7 ps "
    "0.4 title 'peak'\n";

static int cmp_lat(const void *a, const void *b)
{
    double x = ((const struct sim_lat *)a)->ms, y = ((const struct sim_lat *)b)->ms;
    return x < y ? -1 : x > y;
}

/* What a report shares between its parts: the replay's result, its peaks, and its latencies
 * by time bucket (bl from start[i] to start[i + 1] for bucket i, each sorted). */
struct report {
    sim_replay *r;
    sim_replay_result res;
    long nl;
    struct sim_lat *bl;
    size_t *start;
    double elapsed;
    uint64_t peak_live, peak_node_live;
};

/* The plot data in dir (series, errors, nodes) and the gnuplot script that draws them. */
static int write_data(const struct report *rp, const char *dir, dsec_err *err)
{
    sim_replay *r = rp->r;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return dsec_err_set(err, DSEC_E_IO, errno, "report: cannot create %s: %s", dir,
                            strerror(errno));
    FILE *f = open_in(dir, "series.dat", err);
    if (!f)
        return -1;
    fprintf(f,
            "# t_s sent created errors live node_live in_flight reclaim_requested reclaim_honoured "
            "reclaim_forced lat_p50_ms lat_p99_ms lat_max_ms reclaim_failed\n");
    for (size_t i = 0; i < r->nbuckets; i++) {
        const struct sim_bucket *b = &r->b[i];
        size_t n = rp->start[i + 1] - rp->start[i];
        const struct sim_lat *v = rp->bl + rp->start[i];
        fprintf(f,
                "%.2f %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
                " %" PRIu64 " %" PRIu64 " %" PRIu64 " %.3f %.3f %.3f %" PRIu64 "\n",
                (double)i * r->bucket_s, b->sent, b->created, b->errors, b->live, b->node_live,
                b->in_flight, b->reclaim_requested, b->reclaim_honoured, b->reclaim_forced,
                n ? sim_lat_pct(v, n, 0.5) : 0.001, n ? sim_lat_pct(v, n, 0.99) : 0.001,
                n ? v[n - 1].ms : 0.001, b->reclaim_failed);
    }
    fclose(f);
    if (!(f = open_in(dir, "errors.dat", err)))
        return -1;
    fprintf(f, "# kind count\n");
    for (size_t i = 0; i < r->nerr_kinds; i++)
        fprintf(f, "\"%s\" %" PRIu64 "\n", r->err_kind[i], r->err_n[i]);
    if (r->nerr_kinds == 0)
        fprintf(f, "\"none\" 0\n");
    fclose(f);
    if (!(f = open_in(dir, "nodes.dat", err)))
        return -1;
    fprintf(f, "# node live_at_end peak_live\n");
    for (size_t i = 0; i < r->nnodes; i++)
        fprintf(f, "%s %" PRIu64 " %" PRIu64 "\n", r->nodes[i].name, r->nodes[i].live,
                r->nodes[i].peak);
    if (r->nnodes == 0)
        fprintf(f, "none 0 0\n");
    fclose(f);
    if (!(f = open_in(dir, "plots.gp", err)))
        return -1;
    fprintf(f, "# gnuplot plots.gp (in this directory) redraws the PNGs\nBS = %g\n%s", r->bucket_s,
            plots);
    fclose(f);
    return 0;
}

/* report.json in dir: the figures, for programs. */
static int write_json(const struct report *rp, const char *dir, dsec_err *err)
{
    sim_replay *r = rp->r;
    FILE *f = NULL;
    char p[1200];
    snprintf(p, sizeof p, "%s/report.json", dir);
    if (!(f = fopen(p, "w"))) {
        return dsec_err_set(err, DSEC_E_IO, errno, "report: cannot write %s: %s", p,
                            strerror(errno));
    }
    fprintf(
        f,
        "{\"records\":%zu,\"speed\":%g,\"elapsed_s\":%.3f,\"send_s\":%.3f,\"ops_sent\":%" PRIu64
        ",\"ops_per_s\":%.1f,\"creates_sent\":%" PRIu64 ",\"creates_ok\":%" PRIu64
        ",\"sandbox_ops\":%" PRIu64 ",\"other_sends\":%" PRIu64 ",\"destroys_sent\":%" PRIu64
        ",\"destroyed\":%" PRIu64 ",\"errors\":%" PRIu64 ",\"unmapped\":%" PRIu64
        ",\"waited\":%" PRIu64 ",\"create_latency_ms\":{\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f,"
        "\"p999\":%.3f,\"max\":%.3f},"
        "\"live_peak\":%" PRIu64 ",\"node_live_peak\":%" PRIu64
        ",\"nodes\":%zu,\"reclaim_events\":%" PRIu64 ",\"reclaims\":{\"requested\":%" PRIu64
        ",\"honoured\":%" PRIu64 ",\"forced\":%" PRIu64 ",\"failed\":%" PRIu64
        "},\"jobs\":{\"started\":%" PRIu64 ",\"failed\":%" PRIu64 ",\"skipped\":%" PRIu64
        ",\"reclaims_received\":%" PRIu64 ",\"checkpoints\":%" PRIu64 ",\"units_released\":%" PRIu64
        ",\"units_forced\":%" PRIu64 "},\"rollouts_lost\":%" PRIu64 ",\"errors_by_kind\":{",
        r->t->n, r->o.speed, rp->elapsed, rp->res.elapsed_s, rp->res.ops_sent, rp->res.ops_per_s,
        rp->res.creates_sent, rp->res.creates_ok, rp->res.sbx_sent, rp->res.sends,
        rp->res.destroys_sent, (uint64_t)atomic_load(&r->destroyed), rp->res.errors,
        rp->res.unmapped, rp->res.waited, sim_lat_pct(r->lat, (size_t)rp->nl, 0.5),
        sim_lat_pct(r->lat, (size_t)rp->nl, 0.9), sim_lat_pct(r->lat, (size_t)rp->nl, 0.99),
        sim_lat_pct(r->lat, (size_t)rp->nl, 0.999), rp->nl ? r->lat[rp->nl - 1].ms : 0,
        rp->peak_live, rp->peak_node_live, r->nnodes, r->reclaims, rp->res.reclaim_requested,
        rp->res.reclaim_honoured, rp->res.reclaim_forced, rp->res.reclaim_failed,
        rp->res.jobs_started, rp->res.jobs_failed, rp->res.jobs_skipped, rp->res.job_reclaims,
        rp->res.job_checkpoints, rp->res.job_units_released, rp->res.job_units_forced,
        rp->res.lost);
    for (size_t i = 0; i < r->nerr_kinds; i++)
        fprintf(f, "%s\"%s\":%" PRIu64, i ? "," : "", r->err_kind[i], r->err_n[i]);
    fprintf(f, "}}\n");
    fclose(f);
    return 0;
}

/* The text table, for people (the caller frees it with free). */
static char *report_text(const struct report *rp)
{
    sim_replay *r = rp->r;
    char *txt = NULL;
    size_t txtn = 0;
    FILE *t = open_memstream(&txt, &txtn);
    char sp[32];
    snprintf(sp, sizeof sp, r->o.speed > 0 ? "x%g" : "max", r->o.speed);
    fprintf(t, "replay of %zu records at speed %s in %.2f s (sending took %.2f s)\n", r->t->n, sp,
            rp->elapsed, rp->res.elapsed_s);
    fprintf(t, "%-28s %12s\n", "figure", "value");
    fprintf(t, "%-28s %12" PRIu64 "\n", "operations sent", rp->res.ops_sent);
    fprintf(t, "%-28s %12.0f\n", "operations/s", rp->res.ops_per_s);
    fprintf(t, "%-28s %12" PRIu64 "\n", "creates sent", rp->res.creates_sent);
    fprintf(t, "%-28s %12" PRIu64 "\n", "creates answered ok", rp->res.creates_ok);
    fprintf(t, "%-28s %12" PRIu64 "\n", "sandbox operations", rp->res.sbx_sent);
    fprintf(t, "%-28s %12" PRIu64 "\n", "destroys sent", rp->res.destroys_sent);
    fprintf(t, "%-28s %12" PRIu64 "\n", "ops that waited for a create", rp->res.waited);
    fprintf(t, "%-28s %12" PRIu64 "\n", "errors", rp->res.errors);
    fprintf(t, "%-28s %12.3f\n", "create latency p50 (ms)",
            sim_lat_pct(r->lat, (size_t)rp->nl, 0.5));
    fprintf(t, "%-28s %12.3f\n", "create latency p99 (ms)",
            sim_lat_pct(r->lat, (size_t)rp->nl, 0.99));
    fprintf(t, "%-28s %12.3f\n", "create latency max (ms)", rp->nl ? r->lat[rp->nl - 1].ms : 0);
    fprintf(t, "%-28s %12" PRIu64 "\n", "live peak (replayer)", rp->peak_live);
    fprintf(t, "%-28s %12" PRIu64 "\n", "live peak (nodes report)", rp->peak_node_live);
    fprintf(t, "%-28s %12zu\n", "nodes reporting", r->nnodes);
    fprintf(t, "%-28s %12" PRIu64 "\n", "reclaim events", r->reclaims);
    fprintf(t, "%-28s %12" PRIu64 "\n", "  requested", rp->res.reclaim_requested);
    fprintf(t, "%-28s %12" PRIu64 "\n", "  honoured", rp->res.reclaim_honoured);
    fprintf(t, "%-28s %12" PRIu64 "\n", "  forced", rp->res.reclaim_forced);
    fprintf(t, "%-28s %12" PRIu64 "\n", "  failed", rp->res.reclaim_failed);
    fprintf(t, "%-28s %12" PRIu64 "\n", "jobs started", rp->res.jobs_started);
    if (rp->res.jobs_failed)
        fprintf(t, "%-28s %12" PRIu64 "\n", "jobs failed to start", rp->res.jobs_failed);
    if (rp->res.jobs_skipped)
        fprintf(t, "%-28s %12" PRIu64 "\n", "jobs not run (no job URL)", rp->res.jobs_skipped);
    fprintf(t, "%-28s %12" PRIu64 "\n", "reclaims the jobs received", rp->res.job_reclaims);
    fprintf(t, "%-28s %12" PRIu64 "\n", "checkpoints done", rp->res.job_checkpoints);
    fprintf(t, "%-28s %12" PRIu64 "\n", "units released by jobs", rp->res.job_units_released);
    fprintf(t, "%-28s %12" PRIu64 "\n", "units forced by the arbiter", rp->res.job_units_forced);
    fprintf(t, "%-28s %12" PRIu64 "\n", "rollouts lost (preempted)", rp->res.lost);
    for (size_t i = 0; i < r->nerr_kinds; i++) {
        fprintf(t, "  error %-20.20s %12" PRIu64 "\n", r->err_kind[i], r->err_n[i]);
        if (r->err_first[i][0])
            fprintf(t, "    first: %s\n", r->err_first[i]);
    }
    if (r->jobs.first_err[0])
        fprintf(t, "first job error: %s\n", r->jobs.first_err);
    fclose(t);
    return txt;
}

/* The PNGs, drawn by gnuplot when it is there; out hears how it went. */
static void draw_plots(const char *dir, FILE *out)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cd '%s' && gnuplot plots.gp 2>gnuplot.log", dir);
    int st = system("command -v gnuplot >/dev/null 2>&1");
    if (st != 0) {
        if (out)
            fprintf(out,
                    "gnuplot not found: plots skipped (apt-get install gnuplot-nox; then gnuplot "
                    "%s/plots.gp)\n",
                    dir);
    } else if ((st = system(cmd)) != 0) {
        if (out)
            fprintf(out, "gnuplot failed (exit %d): see %s/gnuplot.log\n", WEXITSTATUS(st), dir);
    } else if (out)
        fprintf(out,
                "report: %s/report.json, report.txt, creates.png latency.png live.png nodes.png "
                "reclaims.png errors.png\n",
                dir);
}

int sim_replay_report(sim_replay *r, const char *dir, FILE *out, dsec_err *err)
{
    sim_replay_result res;
    sim_replay_result_get(r, &res); /* sorts latencies by value */
    long nl = atomic_load(&r->nlat);
    /* per-bucket latency percentiles: a copy sorted by (bucket, ms) */
    struct sim_lat *bl = dsec_calloc((size_t)nl + 1, sizeof *bl);
    size_t *start = dsec_calloc(SIM_MAX_BUCKETS + 1, sizeof *start);
    for (long i = 0; i < nl; i++)
        start[r->lat[i].bucket + 1]++;
    for (size_t i = 1; i <= SIM_MAX_BUCKETS; i++)
        start[i] += start[i - 1];
    size_t *fill = dsec_calloc(SIM_MAX_BUCKETS, sizeof *fill);
    for (long i = 0; i < nl; i++) /* r->lat is sorted by ms, so each bucket comes out sorted */
        bl[start[r->lat[i].bucket] + fill[r->lat[i].bucket]++] = r->lat[i];
    (void)cmp_lat;
    double elapsed = r->t_end - r->t_start;
    uint64_t peak_live = 0, peak_node_live = 0;
    for (size_t i = 0; i < r->nbuckets; i++) {
        if (r->b[i].live > peak_live)
            peak_live = r->b[i].live;
        if (r->b[i].node_live > peak_node_live)
            peak_node_live = r->b[i].node_live;
    }
    struct report rp = {.r = r,
                        .res = res,
                        .nl = nl,
                        .bl = bl,
                        .start = start,
                        .elapsed = elapsed,
                        .peak_live = peak_live,
                        .peak_node_live = peak_node_live};
    int rc = 0;
    if (dir && (write_data(&rp, dir, err) < 0 || write_json(&rp, dir, err) < 0)) {
        rc = -1;
        goto out;
    }
    char *txt = report_text(&rp);
    if (out)
        fputs(txt, out);
    if (dir) {
        FILE *f = open_in(dir, "report.txt", err);
        if (f) {
            fputs(txt, f);
            fclose(f);
        } else
            rc = -1;
        draw_plots(dir, out);
    }
    free(txt);
out:
    dsec_free(bl);
    dsec_free(start);
    dsec_free(fill);
    return rc;
}
