/* demo.c - `dsec demo` (make demo): an embedded one-node cell running the bundled sample rollout workload. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "actors/cell.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tools/cli.h"

#define ROLLOUTS 16
#define FORKS 3

struct stat_row {
    const char *op;
    int ok, failed;
    double ms[256];
    int n;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void record(struct stat_row *r, double t0, int rc, const dsec_err *err)
{
    if (rc < 0) {
        r->failed++;
        fprintf(stderr, "demo: %s failed: %s\n", r->op, err->msg);
        return;
    }
    r->ok++;
    if (r->n < 256)
        r->ms[r->n++] = now_ms() - t0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(struct stat_row *r, double p)
{
    if (r->n == 0)
        return 0;
    qsort(r->ms, (size_t)r->n, sizeof r->ms[0], cmp_double);
    int i = (int)(p * (r->n - 1) + 0.5);
    return r->ms[i];
}

/* Asynchronous creates: many in flight from one thread. */
struct pending {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int left;
    char ids[ROLLOUTS][DSEC_ID_MAX];
    int failed;
    double t0;
    struct stat_row *row;
};

static void on_created(int status, const dsec_sandbox_info *info, const dsec_err *err, void *ud)
{
    struct pending *p = ud;
    pthread_mutex_lock(&p->mu);
    int slot = ROLLOUTS - p->left;
    if (status == 0)
        snprintf(p->ids[slot], sizeof p->ids[slot], "%s", info->id);
    else
        p->failed++;
    record(p->row, p->t0, status, err);
    p->left--;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static int workload(dsec_client *c, struct stat_row *rows, int *nrows)
{
    enum { CREATE, EXEC, WRITE, READ, LIST, FORK, PAUSE, RESUME, DESTROY, FN_CREATE, FN_CALL, NOPS };
    static const char *const names[NOPS] = {"create", "exec", "file write", "file read", "file list",
                                            "fork", "pause", "resume", "destroy", "fn create",
                                            "fn call"};
    for (int i = 0; i < NOPS; i++)
        rows[i] = (struct stat_row){.op = names[i]};
    *nrows = NOPS;
    dsec_err err;

    /* 1. a burst of rollouts, all creates in flight at once */
    struct pending p = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
                        .left = ROLLOUTS, .row = &rows[CREATE], .t0 = now_ms()};
    for (int i = 0; i < ROLLOUTS; i++) {
        char rollout[32];
        snprintf(rollout, sizeof rollout, "demo-rollout-%02d", i);
        dsec_create_spec spec = {.type = "sim", .cpu_milli = 250, .memory_mb = 256, .ttl_s = 600,
                                 .rollout_id = rollout};
        if (dsec_create_async(c, &spec, on_created, &p, &err) < 0) {
            fprintf(stderr, "demo: create: %s\n", err.msg);
            pthread_mutex_lock(&p.mu);
            p.left--;
            p.failed++;
            pthread_mutex_unlock(&p.mu);
        }
    }
    pthread_mutex_lock(&p.mu);
    while (p.left > 0)
        pthread_cond_wait(&p.cv, &p.mu);
    pthread_mutex_unlock(&p.mu);
    if (p.failed == ROLLOUTS)
        return -1;

    /* 2. each rollout runs a command, writes its answer, reads and lists it */
    for (int i = 0; i < ROLLOUTS; i++) {
        const char *id = p.ids[i];
        if (id[0] == '\0')
            continue;
        char step[32];
        snprintf(step, sizeof step, "step-%d", i);
        const char *argv[] = {"echo", "rollout", step, NULL};
        dsec_exec_opts eo = {.argv = argv};
        dsec_exec_reply r;
        double t0 = now_ms();
        int rc = dsec_exec(c, id, &eo, &r, &err);
        record(&rows[EXEC], t0, rc, &err);
        if (rc == 0) {
            char want[64];
            snprintf(want, sizeof want, "rollout %s\n", step);
            if (r.out_len != strlen(want) || memcmp(r.out, want, r.out_len) != 0) {
                fprintf(stderr, "demo: exec in %s printed %.*s, expected %s", id, (int)r.out_len,
                        (const char *)r.out, want);
                rows[EXEC].failed++;
            }
            dsec_exec_reply_release(&r);
        }
        char body[64];
        int blen = snprintf(body, sizeof body, "answer of rollout %d\n", i);
        t0 = now_ms();
        rc = dsec_file_write(c, id, "/workspace/answer.txt", body, (size_t)blen, 0644, &err);
        record(&rows[WRITE], t0, rc, &err);
        uint8_t *data;
        size_t len;
        t0 = now_ms();
        rc = dsec_file_read(c, id, "/workspace/answer.txt", &data, &len, &err);
        record(&rows[READ], t0, rc, &err);
        if (rc == 0) {
            if (len != (size_t)blen || memcmp(data, body, len) != 0) {
                fprintf(stderr, "demo: %s read back something else\n", id);
                rows[READ].failed++;
            }
            dsec_free(data);
        }
        dsec_dirent *ents;
        size_t ne;
        t0 = now_ms();
        rc = dsec_file_list(c, id, "/workspace", &ents, &ne, &err);
        record(&rows[LIST], t0, rc, &err);
        if (rc == 0)
            dsec_dirents_free(ents, ne);
    }

    /* 3. branch one rollout: children see the parent's files at the branch point */
    char **kids = NULL;
    size_t nkids = 0;
    double t0 = now_ms();
    int rc = dsec_fork(c, p.ids[0], FORKS, &kids, &nkids, &err);
    record(&rows[FORK], t0, rc, &err);
    for (size_t i = 0; rc == 0 && i < nkids; i++) {
        uint8_t *data;
        size_t len;
        if (dsec_file_read(c, kids[i], "/workspace/answer.txt", &data, &len, &err) == 0) {
            dsec_free(data);
        } else {
            fprintf(stderr, "demo: fork child %s lacks the parent's file: %s\n", kids[i], err.msg);
            rows[FORK].failed++;
        }
    }

    /* 4. an idle rollout is paused, then resumed */
    t0 = now_ms();
    rc = dsec_pause(c, p.ids[1], &err);
    record(&rows[PAUSE], t0, rc, &err);
    t0 = now_ms();
    rc = dsec_resume(c, p.ids[1], &err);
    record(&rows[RESUME], t0, rc, &err);

    /* 5. a judged program: function calls in a real sandboxed worker */
    static const char *const py[] = {"runtime=python3", NULL};
    dsec_sandbox_info fn;
    t0 = now_ms();
    rc = dsec_create(c, &(dsec_create_spec){.type = "function", .labels = py, .memory_mb = 256}, &fn,
                     &err);
    record(&rows[FN_CREATE], t0, rc, &err);
    for (int i = 0; rc == 0 && i < 8; i++) {
        char code[64];
        snprintf(code, sizeof code, "print(%d * 7)", i + 1);
        const char *argv[] = {"python3", "-c", code, NULL};
        dsec_exec_reply r;
        double t1 = now_ms();
        int crc = dsec_exec(c, fn.id, &(dsec_exec_opts){.argv = argv}, &r, &err);
        record(&rows[FN_CALL], t1, crc, &err);
        if (crc == 0) {
            char want[16];
            snprintf(want, sizeof want, "%d\n", (i + 1) * 7);
            if (r.exit_code != 0 || r.out_len != strlen(want) || memcmp(r.out, want, r.out_len) != 0) {
                fprintf(stderr, "demo: function call printed %.*s (exit %d), expected %s",
                        (int)r.out_len, (const char *)r.out, r.exit_code, want);
                rows[FN_CALL].failed++;
            }
            dsec_exec_reply_release(&r);
        }
    }
    if (rc == 0) {
        t0 = now_ms();
        rc = dsec_destroy(c, fn.id, &err);
        record(&rows[DESTROY], t0, rc, &err);
    }

    /* 6. everything else is destroyed */
    for (size_t i = 0; i < nkids; i++) {
        t0 = now_ms();
        rc = dsec_destroy(c, kids[i], &err);
        record(&rows[DESTROY], t0, rc, &err);
    }
    dsec_strv_free(kids, nkids);
    for (int i = 0; i < ROLLOUTS; i++) {
        if (p.ids[i][0] == '\0')
            continue;
        t0 = now_ms();
        rc = dsec_destroy(c, p.ids[i], &err);
        record(&rows[DESTROY], t0, rc, &err);
    }
    return 0;
}

int dsec_cli_demo(int argc, char **argv)
{
    char state[] = "/tmp/dsec-demo-XXXXXX";
    if (mkdtemp(state) == NULL) {
        perror("dsec demo: mkdtemp");
        return 1;
    }
    dsec_cell_conf conf;
    dsec_cell_conf_defaults(&conf);
    conf.embedded_nats = true;
    conf.nats_port = 0; /* a free port: never collide with a running cell */
    snprintf(conf.state_dir, sizeof conf.state_dir, "%s", state);
    dsec_err err;
    static const char *const types[] = {"sim", NULL};
    static const char *const fn_types[] = {"function", NULL};
    dsec_cell *cell = NULL;
    dsec_client *c = NULL;
    int status = 1;
    if (dsec_cell_conf_add_sim_nodes(&conf, "demo", 1, 8000, 16384, 256, types, "1", &err) < 0 ||
        dsec_cell_conf_add_sim_nodes(&conf, "demo-fn", 1, 4000, 4096, 64, fn_types, NULL, &err) < 0) {
        fprintf(stderr, "dsec demo: %s\n", err.msg);
        goto out;
    }
    /* the second node runs real function-call sandboxes */
    snprintf(conf.nodes[1].name, sizeof conf.nodes[1].name, "demo-fn");
    snprintf(conf.nodes[1].backend, sizeof conf.nodes[1].backend, "native");
    if (dsec_cell_start(&cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0) {
        fprintf(stderr, "dsec demo: %s\n", err.msg);
        goto out;
    }
    printf("dsec demo: embedded nats-server at %s (JetStream store in %s/nats)\n",
           dsec_cell_url(cell), state);
    printf("dsec demo: cell \"%s\": 2 nodes (%s: sim; %s: function), 1 scheduler\n", conf.cell,
           conf.nodes[0].name, conf.nodes[1].name);
    printf("dsec demo: sandbox types available on this machine: function (forked from warm\n"
           "           python3 zygotes into fresh namespaces) and sim (no real work; start-up, CPU\n"
           "           and memory modelled). Containers and VMs arrive with their issues.\n\n");
    dsec_client_opts co = {.url = dsec_cell_url(cell), .tenant = "demo"};
    if (dsec_client_connect(&c, &co, &err) < 0) {
        fprintf(stderr, "dsec demo: %s\n", err.msg);
        goto out;
    }
    struct stat_row rows[16];
    int nrows = 0;
    double t0 = now_ms();
    if (workload(c, rows, &nrows) < 0) {
        fprintf(stderr, "dsec demo: the workload could not start\n");
        goto out;
    }
    double total = now_ms() - t0;
    printf("%-12s %6s %6s %10s %10s\n", "operation", "ok", "failed", "p50 ms", "max ms");
    int failures = 0;
    for (int i = 0; i < nrows; i++) {
        failures += rows[i].failed;
        printf("%-12s %6d %6d %10.2f %10.2f\n", rows[i].op, rows[i].ok, rows[i].failed,
               pct(&rows[i], 0.5), pct(&rows[i], 1.0));
    }
    dsec_node_stats ns, fs;
    dsec_node_stats_get(dsec_cell_node_at(cell, 0), &ns);
    dsec_node_stats_get(dsec_cell_node_at(cell, 1), &fs);
    printf("\n%d rollouts, %d forks, 8 function calls, workload %.0f ms; nodes: %" PRIu64
           " created, %" PRIu64 " destroyed, %" PRIu64 " live at the end\n",
           ROLLOUTS, FORKS, total, ns.created + fs.created, ns.destroyed + fs.destroyed,
           ns.live + fs.live);
    status = failures == 0 && ns.live + fs.live == 0 ? 0 : 1;
    printf("dsec demo: %s\n", status == 0 ? "all operations succeeded" : "FAILED (see above)");
out:
    dsec_client_free(c);
    dsec_cell_stop(cell, true);
    dsec_cell_conf_release(&conf);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", state);
    if (system(cmd) != 0)
        fprintf(stderr, "dsec demo: could not remove %s\n", state);
    printf("dsec demo: stopped the cell and the nats-server; nothing left running\n");
    return status;
}
