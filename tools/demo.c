/* demo.c - `dsec demo` (make demo): an embedded one-node cell running the bundled sample rollout
 * workload. */
#include <inttypes.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "actors/cell.h"
#include "backends/vm/vm.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "tools/cli.h"

#define ROLLOUTS 16
#define FORKS 3
#define CONTAINERS 4

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

/* The sim workload's rows, in the order they are shown. */
enum { CREATE, EXEC, WRITE, READ, LIST, FORK, PAUSE, RESUME, DESTROY, FN_CREATE, FN_CALL, NOPS };

/* A burst of rollouts, all creates in flight at once (p: its row, start and slots set); -1
 * when none was created. */
static int rollout_burst(dsec_client *c, struct pending *p)
{
    dsec_err err;
    for (int i = 0; i < ROLLOUTS; i++) {
        char rollout[32];
        snprintf(rollout, sizeof rollout, "demo-rollout-%02d", i);
        dsec_create_spec spec = {
            .type = "sim", .cpu_milli = 250, .memory_mb = 256, .ttl_s = 600, .rollout_id = rollout};
        if (dsec_create_async(c, &spec, on_created, p, &err) < 0) {
            fprintf(stderr, "demo: create: %s\n", err.msg);
            pthread_mutex_lock(&p->mu);
            p->left--;
            p->failed++;
            pthread_mutex_unlock(&p->mu);
        }
    }
    pthread_mutex_lock(&p->mu);
    while (p->left > 0)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return p->failed == ROLLOUTS ? -1 : 0;
}

/* Rollout i (sandbox id) runs a command, writes its answer, reads and lists it. */
static void rollout_use(dsec_client *c, struct stat_row *rows, const char *id, int i)
{
    dsec_err err;
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

/* Eight function calls in one function sandbox, destroyed after. */
static void fn_calls(dsec_client *c, struct stat_row *rows)
{
    dsec_err err;
    static const char *const py[] = {"runtime=python3", NULL};
    dsec_sandbox_info fn;
    double t0 = now_ms();
    int rc = dsec_create(c, &(dsec_create_spec){.type = "function", .labels = py, .memory_mb = 256},
                         &fn, &err);
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
            if (r.exit_code != 0 || r.out_len != strlen(want) ||
                memcmp(r.out, want, r.out_len) != 0) {
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
}

static int workload(dsec_client *c, struct stat_row *rows, int *nrows)
{
    static const char *const names[NOPS] = {"create",    "exec",      "file write", "file read",
                                            "file list", "fork",      "pause",      "resume",
                                            "destroy",   "fn create", "fn call"};
    /* the sim rows come first; containers() appends its own */
    for (int i = 0; i < NOPS; i++)
        rows[i] = (struct stat_row){.op = names[i]};
    *nrows = NOPS;
    dsec_err err;

    /* 1. a burst of rollouts, all creates in flight at once */
    struct pending p = {.mu = PTHREAD_MUTEX_INITIALIZER,
                        .cv = PTHREAD_COND_INITIALIZER,
                        .left = ROLLOUTS,
                        .row = &rows[CREATE],
                        .t0 = now_ms()};
    if (rollout_burst(c, &p) < 0)
        return -1;

    /* 2. each rollout runs a command, writes its answer, reads and lists it */
    for (int i = 0; i < ROLLOUTS; i++)
        if (p.ids[i][0] != '\0')
            rollout_use(c, rows, p.ids[i], i);

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
    fn_calls(c, rows);

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

/* Function calls in an environment of layers: sh from busybox:1 (the layer
 * the containers use, fetched once by the node's cache), not the host's. */
static void env_calls(dsec_client *c, struct stat_row *rows, int *nrows)
{
    struct stat_row *r = rows + *nrows;
    r[0] = (struct stat_row){.op = "fn env create"};
    r[1] = (struct stat_row){.op = "fn env call"};
    r[2] = (struct stat_row){.op = "fn env destroy"};
    *nrows += 3;
    static const char *const sh[] = {"runtime=sh", NULL};
    dsec_sandbox_info fn;
    dsec_err err;
    double t0 = now_ms();
    int rc = dsec_create(
        c,
        &(dsec_create_spec){.type = "function", .env = "busybox:1", .labels = sh, .memory_mb = 64},
        &fn, &err);
    record(&r[0], t0, rc, &err);
    for (int i = 0; rc == 0 && i < 4; i++) {
        char code[64], want[64];
        snprintf(code, sizeof code, "echo $((%d * 7)) $(readlink /bin/sh)", i + 1);
        snprintf(want, sizeof want, "%d /bin/busybox\n", (i + 1) * 7);
        const char *argv[] = {"sh", "-c", code, NULL};
        dsec_exec_reply x;
        double t1 = now_ms();
        int crc = dsec_exec(c, fn.id, &(dsec_exec_opts){.argv = argv}, &x, &err);
        record(&r[1], t1, crc, &err);
        if (crc == 0) {
            if (x.exit_code != 0 || x.out_len != strlen(want) ||
                memcmp(x.out, want, x.out_len) != 0) {
                fprintf(stderr, "demo: the call in busybox:1 printed %.*s (exit %d), expected %s",
                        (int)x.out_len, (const char *)x.out, x.exit_code, want);
                r[1].failed++;
            }
            dsec_exec_reply_release(&x);
        }
    }
    if (rc == 0) {
        t0 = now_ms();
        rc = dsec_destroy(c, fn.id, &err);
        record(&r[2], t0, rc, &err);
    }
}

/* Real containers on busybox:1: a small SWE-style task per rollout, one
 * solved state branched and published as an environment a new sandbox starts from. */
static void containers(dsec_client *c, struct stat_row *rows, int *nrows)
{
    enum { CT_CREATE, CT_EXEC, CT_FORK, CT_SNAPSHOT, CT_FROM_SNAP, CT_DESTROY, NCT };
    static const char *const names[NCT] = {"ct create",   "ct exec",      "ct fork",
                                           "ct snapshot", "ct from snap", "ct destroy"};
    struct stat_row *r = rows + *nrows;
    for (int i = 0; i < NCT; i++)
        r[i] = (struct stat_row){.op = names[i]};
    *nrows += NCT;
    dsec_err err;
    char ids[CONTAINERS + 8][DSEC_ID_MAX];
    int n = 0;
    for (int i = 0; i < CONTAINERS; i++) {
        dsec_sandbox_info info;
        dsec_create_spec spec = {
            .type = "container", .env = "busybox:1", .cpu_milli = 500, .memory_mb = 128};
        double t0 = now_ms();
        int rc = dsec_create(c, &spec, &info, &err);
        record(&r[CT_CREATE], t0, rc, &err);
        if (rc == 0)
            snprintf(ids[n++], DSEC_ID_MAX, "%s", info.id);
    }
    for (int i = 0; i < n; i++) {
        char line[128];
        snprintf(line, sizeof line,
                 "mkdir -p /work && echo $((6 * %d)) > /work/answer && cat /work/answer", i + 1);
        const char *argv[] = {"/bin/sh", "-c", line, NULL};
        dsec_exec_reply er;
        double t0 = now_ms();
        int rc = dsec_exec(c, ids[i], &(dsec_exec_opts){.argv = argv}, &er, &err);
        record(&r[CT_EXEC], t0, rc, &err);
        if (rc == 0) {
            char want[16];
            snprintf(want, sizeof want, "%d\n", 6 * (i + 1));
            if (er.exit_code != 0 || er.out_len != strlen(want) ||
                memcmp(er.out, want, er.out_len) != 0) {
                fprintf(stderr, "demo: container %s printed %.*s, expected %s", ids[i],
                        (int)er.out_len, (const char *)er.out, want);
                r[CT_EXEC].failed++;
            }
            dsec_exec_reply_release(&er);
        }
    }
    if (n > 0) {
        /* branch the first: two children start from its files */
        char **kids = NULL;
        size_t nk = 0;
        double t0 = now_ms();
        int rc = dsec_fork(c, ids[0], 2, &kids, &nk, &err);
        record(&r[CT_FORK], t0, rc, &err);
        for (size_t k = 0; rc == 0 && k < nk; k++) {
            uint8_t *data;
            size_t len;
            if (dsec_file_read(c, kids[k], "/work/answer", &data, &len, &err) == 0 && len == 2 &&
                memcmp(data, "6\n", 2) == 0) {
                dsec_free(data);
            } else {
                fprintf(stderr, "demo: fork child %s does not see its parent's answer\n", kids[k]);
                r[CT_FORK].failed++;
            }
            snprintf(ids[n++], DSEC_ID_MAX, "%s", kids[k]);
        }
        dsec_strv_free(kids, nk);
        /* publish the second's state; a new sandbox starts from it */
        if (n > 1) {
            t0 = now_ms();
            rc = dsec_snapshot(c, ids[1], "demo/solved:1", &err);
            record(&r[CT_SNAPSHOT], t0, rc, &err);
            dsec_sandbox_info info;
            dsec_create_spec spec = {.type = "container", .env = "demo/solved:1", .memory_mb = 128};
            t0 = now_ms();
            if (rc == 0 && (rc = dsec_create(c, &spec, &info, &err)) == 0) {
                uint8_t *data;
                size_t len;
                rc = dsec_file_read(c, info.id, "/work/answer", &data, &len, &err);
                if (rc == 0 && (len != 3 || memcmp(data, "12\n", 3) != 0)) {
                    fprintf(stderr, "demo: the snapshot's sandbox lacks the solved state\n");
                    rc = -1;
                    err.code = 0;
                }
                if (rc == 0)
                    dsec_free(data);
                snprintf(ids[n++], DSEC_ID_MAX, "%s", info.id);
            }
            record(&r[CT_FROM_SNAP], t0, rc, &err);
        }
    }
    for (int i = 0; i < n; i++) {
        double t0 = now_ms();
        int rc = dsec_destroy(c, ids[i], &err);
        record(&r[CT_DESTROY], t0, rc, &err);
    }
}

/* One microVM picked by requirement (a kernel of its own) on busybox:1: a command in its own
 * kernel, a file, and a fork that clones the running machine. */
static void microvms(dsec_client *c, struct stat_row *rows, int *nrows)
{
    enum { VM_CREATE, VM_EXEC, VM_FORK, VM_DESTROY, NVM };
    static const char *const names[NVM] = {"vm create", "vm exec", "vm fork", "vm destroy"};
    struct stat_row *r = rows + *nrows;
    for (int i = 0; i < NVM; i++)
        r[i] = (struct stat_row){.op = names[i]};
    *nrows += NVM;
    dsec_err err;
    static const char *const own_kernel[] = {"own_kernel", NULL};
    dsec_create_spec spec = {.requires = own_kernel,
                             .env = "busybox:1",
                             .cpu_milli = 1000,
                             .memory_mb = 256,
                             .disk_mb = 256};
    dsec_sandbox_info info;
    double t0 = now_ms();
    int rc = dsec_create(c, &spec, &info, &err);
    record(&r[VM_CREATE], t0, rc, &err);
    if (rc < 0)
        return;
    char ids[2][DSEC_ID_MAX];
    int n = 0;
    snprintf(ids[n++], DSEC_ID_MAX, "%s", info.id);
    const char *argv[] = {"/bin/sh", "-c",
                          "mkdir -p /work && uname -r > /work/kernel && cat /work/kernel", NULL};
    dsec_exec_reply er;
    t0 = now_ms();
    rc = dsec_exec(c, ids[0], &(dsec_exec_opts){.argv = argv, .timeout_ms = 60000}, &er, &err);
    record(&r[VM_EXEC], t0, rc, &err);
    if (rc == 0) {
        printf("dsec demo: microVM %s (%s) runs kernel %.*s", ids[0], info.type, (int)er.out_len,
               (const char *)er.out);
        if (er.exit_code != 0 || strcmp(info.type, "microvm") != 0)
            r[VM_EXEC].failed++;
        dsec_exec_reply_release(&er);
    }
    char **kids = NULL;
    size_t nk = 0;
    t0 = now_ms();
    rc = dsec_fork(c, ids[0], 1, &kids, &nk, &err);
    record(&r[VM_FORK], t0, rc, &err);
    if (rc == 0 && nk == 1) {
        uint8_t *data;
        size_t len;
        if (dsec_file_read(c, kids[0], "/work/kernel", &data, &len, &err) == 0 && len > 0)
            dsec_free(data);
        else
            r[VM_FORK].failed++;
        snprintf(ids[n++], DSEC_ID_MAX, "%s", kids[0]);
    }
    dsec_strv_free(kids, nk);
    for (int i = 0; i < n; i++) {
        t0 = now_ms();
        rc = dsec_destroy(c, ids[i], &err);
        record(&r[VM_DESTROY], t0, rc, &err);
    }
}

/* busybox:1 into the cell's layer registry (scripts/build-envs.sh --only busybox). */
static int build_busybox(const char *state)
{
    char cmd[1024];
    snprintf(
        cmd, sizeof cmd,
        "'%s/scripts/build-envs.sh' --dsec /proc/%d/exe --registry '%s/layers' --state-dir '%s' "
        "--only busybox >/dev/null",
        DSEC_SRC, (int)getpid(), state, state);
    return system(cmd) == 0 ? 0 : -1;
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
    static const char *const ct_types[] = {"container", "microvm", NULL};
    dsec_cell *cell = NULL;
    dsec_client *c = NULL;
    int status = 1;
    bool with_containers = build_busybox(state) == 0;
    if (!with_containers)
        fprintf(
            stderr,
            "dsec demo: could not build the busybox:1 environment; running without containers\n");
    if (dsec_cell_conf_add_sim_nodes(&conf, "demo", 1, 8000, 16384, 256, types, "1", &err) < 0 ||
        dsec_cell_conf_add_sim_nodes(&conf, "demo-fn", 1, 4000, 4096, 64, fn_types, NULL, &err) <
            0 ||
        (with_containers && dsec_cell_conf_add_sim_nodes(&conf, "demo-ct", 1, 4000, 8192, 64,
                                                         ct_types, NULL, &err) < 0)) {
        fprintf(stderr, "dsec demo: %s\n", err.msg);
        goto out;
    }
    /* the second node runs real function-call sandboxes */
    snprintf(conf.nodes[1].name, sizeof conf.nodes[1].name, "demo-fn");
    snprintf(conf.nodes[1].backend, sizeof conf.nodes[1].backend, "native");
    /* the third runs real crun containers */
    if (with_containers) {
        snprintf(conf.nodes[2].name, sizeof conf.nodes[2].name, "demo-ct");
        snprintf(conf.nodes[2].backend, sizeof conf.nodes[2].backend, "native");
    }
    if (dsec_cell_start(&cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0) {
        fprintf(stderr, "dsec demo: %s\n", err.msg);
        goto out;
    }
    printf("dsec demo: embedded nats-server at %s (JetStream store in %s/nats)\n",
           dsec_cell_url(cell), state);
    printf("dsec demo: cell \"%s\": %zu nodes (%s: sim; %s: function%s), 1 scheduler\n", conf.cell,
           conf.nnodes, conf.nodes[0].name, conf.nodes[1].name,
           with_containers ? "; demo-ct: container, microvm" : "");
    printf(
        "dsec demo: sandbox types on this machine: container (crun on overlays of busybox:1 from\n"
        "           the layer registry, dsec-agent inside), microvm (QEMU booting its own kernel\n"
        "           on the same layers; %s), function (forked from warm python3 zygotes into\n"
        "           fresh namespaces) and sim (no real work; start-up, CPU and memory\n"
        "           modelled).\n\n",
        dsec_vm_kvm_works("qemu-system-x86_64", false) ? "KVM"
                                                       : "TCG emulation here: seconds to boot");
    dsec_client_opts co = {.url = dsec_cell_url(cell), .tenant = "demo"};
    if (dsec_client_connect(&c, &co, &err) < 0) {
        fprintf(stderr, "dsec demo: %s\n", err.msg);
        goto out;
    }
    struct stat_row rows[32]; /* workload(), env_calls(), containers() and microvms() fill 24 */
    int nrows = 0;
    double t0 = now_ms();
    if (workload(c, rows, &nrows) < 0) {
        fprintf(stderr, "dsec demo: the workload could not start\n");
        goto out;
    }
    if (with_containers) {
        env_calls(c, rows, &nrows);
        containers(c, rows, &nrows);
        microvms(c, rows, &nrows);
    }
    double total = now_ms() - t0;
    printf("%-14s %6s %6s %10s %10s\n", "operation", "ok", "failed", "p50 ms", "max ms");
    int failures = 0;
    for (int i = 0; i < nrows; i++) {
        failures += rows[i].failed;
        printf("%-14s %6d %6d %10.2f %10.2f\n", rows[i].op, rows[i].ok, rows[i].failed,
               pct(&rows[i], 0.5), pct(&rows[i], 1.0));
    }
    uint64_t created = 0, destroyed = 0, live = 0;
    for (size_t i = 0; i < dsec_cell_node_count(cell); i++) {
        dsec_node_stats ns;
        dsec_node_stats_get(dsec_cell_node_at(cell, i), &ns);
        created += ns.created;
        destroyed += ns.destroyed;
        live += ns.live;
    }
    printf("\n%d sim rollouts, %d forks, 8 function calls (+%d in busybox:1), %d containers, %d "
           "microVMs, "
           "workload %.0f ms; "
           "nodes: %" PRIu64 " created, %" PRIu64 " destroyed, %" PRIu64 " live at the end\n",
           ROLLOUTS, FORKS, with_containers ? 4 : 0, with_containers ? CONTAINERS : 0,
           with_containers ? 2 : 0, total, created, destroyed, live);
    status = failures == 0 && live == 0 ? 0 : 1;
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
