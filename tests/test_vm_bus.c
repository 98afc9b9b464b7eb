/* test_vm_bus.c - microVMs and VMs end to end: a cell on a real nats-server whose node runs QEMU
 * (TCG here) on busybox:1; libdsec creates by requirement, execs, moves files, forks, pauses,
 * snapshots, a restarted node manager re-adopts a running microVM, and one microVM serves a
 * terminal, a shell session, the process list, streamed uploads and downloads, file ops and a
 * directory watcher. */
#include <dirent.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/cell.h"
#include "bus/bus.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/sha256.h"
#include "tests/fixture-client.h"
#include "tests/fixture.h"

static dsec_natsd *natsd;
static char root[64];
static dsec_cell_conf conf;
static dsec_cell *cell;
static dsec_client *cl;
static char shared_id[DSEC_ID_MAX]; /* the microVM the terminal, session and file cases share */

static int start_cell(void)
{
    dsec_err err;
    if (dsec_cell_start(&cell, &conf, DSEC_ROLE_SCHEDULER | DSEC_ROLE_NODE, &err) < 0) {
        fprintf(stderr, "cell: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static bool have_qemu(void)
{
    return system("command -v qemu-system-x86_64 >/dev/null 2>&1") == 0;
}

static int group_setup(void **state)
{
    if (geteuid() != 0) {
        fprintf(stderr, "test_vm_bus: needs root (VM disks, layer mounts); skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    if (!have_qemu()) {
        fprintf(stderr, "test_vm_bus: qemu-system-x86_64 is not installed (scripts/install-deps.sh "
                        "installs it); skipping\n");
        exit(77); /* SKIP_RETURN_CODE: ctest shows a skip, not a pass */
    }
    if (dsec_test_server_start("dsec-vmbus", false, &natsd, root, sizeof root) < 0)
        return -1;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s/scripts/build-envs.sh --dsec %s --registry %s/layers --state-dir %s --only "
             "busybox >/dev/null",
             DSEC_SRC, DSEC_CLI, root, root);
    if (system(cmd) != 0) {
        fprintf(stderr, "building busybox:1 failed: %s\n", cmd);
        return -1;
    }
    dsec_err err;
    dsec_cell_conf_defaults(&conf);
    snprintf(conf.cell, sizeof conf.cell, "vmbus");
    snprintf(conf.url, sizeof conf.url, "%s", dsec_natsd_url(natsd));
    snprintf(conf.state_dir, sizeof conf.state_dir, "%s/cell", root);
    snprintf(conf.layers_path, sizeof conf.layers_path, "%s/layers", root);
    conf.capacity_ms = 20;
    conf.full_ms = 500;
    conf.heartbeat_ms = 100;
    conf.work_threads = 2; /* fewer than test_boots_beside_work boots at once */
    static const char *const types[] = {"microvm", "vm", NULL};
    if (dsec_cell_conf_add_sim_nodes(&conf, "vmbus", 1, 8000, 16384, 64, types, NULL, &err) < 0) {
        fprintf(stderr, "conf: %s\n", err.msg);
        return -1;
    }
    snprintf(conf.nodes[0].backend, sizeof conf.nodes[0].backend, "native");
    if (start_cell() < 0)
        return -1;
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = "vmbus", .timeout_ms = 180000};
    if (dsec_client_connect(&cl, &o, &err) < 0) {
        fprintf(stderr, "client: %s\n", err.msg);
        return -1;
    }
    return 0;
}

/* QEMU processes whose command line names this test's directory. */
static int qemu_count(void)
{
    char cmd[256];
    /* [q]: the shell running pgrep names the pattern too, but does not match it */
    snprintf(cmd, sizeof cmd, "pgrep -c -f '[q]emu-system.*%s/' 2>/dev/null", root);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (p == NULL || fscanf(p, "%d", &n) != 1)
        n = -1;
    if (p)
        pclose(p);
    return n;
}

/* Entries left in the node's VM sandbox directories (microvm/sb and vm/sb). */
static int sandbox_dirs(void)
{
    int n = 0;
    const char *types[] = {"microvm", "vm"};
    for (int t = 0; t < 2; t++) {
        char p[256];
        snprintf(p, sizeof p, "%s/cell/node-vmbus-0000/%s/sb", root, types[t]);
        DIR *d = opendir(p);
        if (d == NULL)
            continue;
        struct dirent *de;
        while ((de = readdir(d)) != NULL)
            if (de->d_name[0] != '.')
                n++;
        closedir(d);
    }
    return n;
}

/* Entries in the node's snapshots directory (snapshots being made). */
static int snapshot_files(void)
{
    char p[256];
    snprintf(p, sizeof p, "%s/cell/node-vmbus-0000/snapshots", root);
    DIR *d = opendir(p);
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

static int group_teardown(void **state)
{
    dsec_err err;
    if (shared_id[0] != '\0' && dsec_destroy(cl, shared_id, &err) < 0)
        fprintf(stderr, "teardown: destroy %s: %s\n", shared_id, err.msg);
    dsec_client_free(cl);
    dsec_cell_stop(cell, true);
    dsec_cell_conf_release(&conf);
    if (natsd == NULL)
        return 0;
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "pkill -9 -f '[q]emu-system.*%s/' 2>/dev/null; " /* [q]: not the shell itself */
             "for m in $(awk -v w='%s/' 'index($5, w) == 1 { print $5 }' /proc/self/mountinfo | "
             "sort -r); do "
             "umount -l $m; done",
             root, root);
    if (system(cmd) != 0)
        fprintf(stderr, "teardown: cleaning under %s failed\n", root);
    return dsec_test_server_stop(natsd, root);
}

static void make(const char *type, const char *const *req, const char *env, dsec_sandbox_info *info)
{
    dsec_create_spec cs = {.type = type,
                           .requires = req,
                           .env = env,
                           .cpu_milli = 1000,
                           .memory_mb = 256,
                           .disk_mb = 256};
    dsec_test_create(cl, &cs, env, info);
}

/* Run sh -c line in id; stdout (without the trailing newline) into out. */
static int sh(const char *id, const char *line, char *out, size_t n)
{
    return dsec_test_exec_sh(cl, id, line, 60000, false, out, n);
}

static void destroy(const char *id)
{
    dsec_test_destroy(cl, id);
}

/* The scheduler picks the lightest type that satisfies: own_kernel is a microVM, isolation:4 a
 * full VM; each runs its own kernel (not the host's) and the environment's files. */
static void test_placement_by_requirement(void **state)
{
    if (natsd == NULL)
        skip();
    const char *own[] = {"own_kernel", NULL};
    dsec_sandbox_info a;
    make(NULL, own, "busybox:1", &a);
    assert_string_equal(a.type, "microvm");
    char out[4096], host[256] = "";
    FILE *u = popen("uname -r", "r");
    assert_non_null(u);
    assert_non_null(fgets(host, sizeof host, u));
    pclose(u);
    host[strcspn(host, "\n")] = '\0';
    assert_int_equal(sh(a.id, "uname -r", out, sizeof out), 0);
    assert_string_not_equal(out, host); /* the guest's own kernel */
    assert_int_equal(sh(a.id, "test -x /bin/busybox && echo env", out, sizeof out), 0);
    assert_string_equal(out, "env");

    const char *full[] = {"isolation:4", NULL};
    dsec_sandbox_info b;
    make(NULL, full, "busybox:1", &b);
    assert_string_equal(b.type, "vm");
    assert_int_equal(sh(b.id, "echo from a whole machine", out, sizeof out), 0);
    assert_string_equal(out, "from a whole machine");
    destroy(b.id);
    destroy(a.id);
}

struct boot_req {
    pthread_t t;
    int rc;
    dsec_err err;
    dsec_sandbox_info info;
    atomic_int *answered;
};

static void *boot_main(void *arg)
{
    struct boot_req *b = arg;
    dsec_client *c = NULL;
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = "vmbus", .timeout_ms = 180000};
    b->rc = dsec_client_connect(&c, &o, &b->err);
    if (b->rc == 0) {
        dsec_create_spec cs = {.type = "microvm",
                               .env = "busybox:1",
                               .cpu_milli = 1000,
                               .memory_mb = 256,
                               .disk_mb = 256};
        b->rc = dsec_create(c, &cs, &b->info, &b->err);
    }
    dsec_client_free(c);
    atomic_fetch_add(b->answered, 1);
    return NULL;
}

/* A VM's boot waits on the node's loop, not on one of its work threads: with 2 work threads
 * (bus.work_threads), 3 creates boot side by side. Three QEMUs run before any create is
 * answered; when each boot held a thread, the third QEMU started only once a boot ended. */
static void test_boots_beside_work(void **state)
{
    if (natsd == NULL)
        skip();
    int before = qemu_count();
    atomic_int answered = 0;
    struct boot_req b[3];
    for (int i = 0; i < 3; i++) {
        b[i] = (struct boot_req){.answered = &answered};
        assert_int_equal(pthread_create(&b[i].t, NULL, boot_main, &b[i]), 0);
    }
    /* samples (every 50 ms) that saw three QEMUs while no create had been answered: with
     * boots on threads, the third started only when a boot's answer was on its way, and at
     * most one sample caught it */
    int three = 0;
    while (atomic_load(&answered) == 0) {
        three += qemu_count() - before >= 3;
        usleep(50000);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(b[i].t, NULL);
        if (b[i].rc != 0)
            fail_msg("create %d: %s", i, b[i].err.msg);
    }
    if (three < 5)
        fail_msg("three VMs booted side by side in %d samples, not 5 or more", three);
    char out[128];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sh(b[i].info.id, "hostname", out, sizeof out), 0);
        assert_string_equal(out, b[i].info.id);
        destroy(b[i].info.id);
    }
    assert_int_equal(qemu_count(), before);
}

/* n microVMs created at once (their boots side by side on the node's loop). */
static void boot_all(struct boot_req *b, int n)
{
    atomic_int booted = 0; /* joined below: the threads are done with it */
    for (int i = 0; i < n; i++) {
        b[i] = (struct boot_req){.answered = &booted};
        assert_int_equal(pthread_create(&b[i].t, NULL, boot_main, &b[i]), 0);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(b[i].t, NULL);
        if (b[i].rc != 0)
            fail_msg("create %d: %s", i, b[i].err.msg);
    }
}

/* A fork (of 2) or a destroy of id, from a client of its own, and when its answer came. */
struct op_req {
    pthread_t t;
    dsec_client *c;
    const char *id;
    bool fork;
    int rc;
    dsec_err err;
    char **kids;
    size_t nk;
    _Atomic uint64_t answered_ns;
};

static void *op_main(void *arg)
{
    struct op_req *r = arg;
    r->rc = r->fork ? dsec_fork(r->c, r->id, 2, &r->kids, &r->nk, &r->err)
                    : dsec_destroy(r->c, r->id, &r->err);
    atomic_store(&r->answered_ns, dsec_now_ns());
    return NULL;
}

/* Send the two operations r (id and fork set) at once, each from a client of its own. */
static void ops_start(struct op_req *r)
{
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = "vmbus", .timeout_ms = 180000};
    for (int i = 0; i < 2; i++)
        if (dsec_client_connect(&r[i].c, &o, &r[i].err) < 0)
            fail_msg("client: %s", r[i].err.msg);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&r[i].t, NULL, op_main, &r[i]), 0);
}

/* With the two operations r in flight, the status of other (an operation that needs a work
 * thread) must be answered at least slack_ms before each of them. Every operation is waited
 * for first; then 0, or -1 with what went wrong in why_not (the caller cleans up, then fails:
 * sandboxes left behind would fill the node for the tests after it). */
static int status_first(const char *other, struct op_req *r, uint64_t slack_ms, const char *why,
                        char *why_not, size_t len)
{
    dsec_sandbox_info st;
    dsec_err err;
    int rc = dsec_status(cl, other, &st, &err);
    uint64_t status_ns = dsec_now_ns();
    if (rc < 0)
        snprintf(why_not, len, "status while two %ss are in flight: %s",
                 r[0].fork ? "fork" : "destroy", err.msg);
    for (int i = 0; i < 2; i++) {
        pthread_join(r[i].t, NULL);
        dsec_client_free(r[i].c);
        if (r[i].rc != 0 && rc == 0) {
            rc = -1;
            snprintf(why_not, len, "%s of %s: %s", r[i].fork ? "fork" : "destroy", r[i].id,
                     r[i].err.msg);
        }
    }
    for (int i = 0; i < 2 && rc == 0; i++) {
        double ahead = ((double)atomic_load(&r[i].answered_ns) - (double)status_ns) / 1e6;
        fprintf(stderr, "test_vm_bus: status answered %.1f ms before %s %d\n", ahead,
                r[i].fork ? "fork" : "destroy", i);
        if (ahead < (double)slack_ms) {
            rc = -1;
            snprintf(why_not, len,
                     "the status of another sandbox was answered %.1f ms before %s %d, not "
                     "%" PRIu64 " ms or more: %s",
                     ahead, r[i].fork ? "fork" : "destroy", i, slack_ms, why);
        }
    }
    return rc;
}

/* A fork's children settle (their agents, their identities) on the node's loop, not on its
 * work threads: with 2 work threads, two forks of 2 children each are in flight, and another
 * sandbox's operation that needs a work thread (its status) is answered before either fork.
 * When a fork held its thread to the end, the status waited for a fork's answer. */
static void test_forks_beside_work(void **state)
{
    if (natsd == NULL)
        skip();
    struct boot_req b[3]; /* two parents, and the other sandbox */
    boot_all(b, 3);
    int before = qemu_count();
    struct op_req f[2];
    for (int i = 0; i < 2; i++)
        f[i] = (struct op_req){.id = b[i].info.id, .fork = true};
    ops_start(f);
    usleep(50000); /* both forks are on the work threads */
    /* 100 ms of slack: a fork's answer and the status right behind it on the same work
     * thread reach this process in either order, within a millisecond or so; the children's
     * identities, each a command in a guest, take 0.3 s or more under TCG */
    char why_not[1400];
    int rc = status_first(b[2].info.id, f, 100,
                          "the forks held the node's 2 work threads until their children settled",
                          why_not, sizeof why_not);
    char out[128];
    for (int i = 0; i < 2; i++) {
        for (size_t k = 0; k < f[i].nk; k++) {
            bool ok = sh(f[i].kids[k], "hostname", out, sizeof out) == 0 &&
                      strcmp(out, f[i].kids[k]) == 0;
            if (!ok && rc == 0) {
                rc = -1;
                snprintf(why_not, sizeof why_not, "child %s answered hostname \"%s\"", f[i].kids[k],
                         out);
            }
            destroy(f[i].kids[k]);
            dsec_free(f[i].kids[k]);
        }
        dsec_free(f[i].kids);
    }
    for (int i = 0; i < 3; i++)
        destroy(b[i].info.id);
    if (rc < 0)
        fail_msg("%s", why_not);
    assert_int_equal(f[0].nk, 2);
    assert_int_equal(f[1].nk, 2);
    assert_int_equal(qemu_count(), before - 3);
}

/* A destroy's wait for QEMU to end is the node's loop's: with 2 work threads, two destroys of
 * VMs whose QEMU hangs (stopped with SIGSTOP: each is killed after its 3 s grace) are in
 * flight, and another sandbox's status is answered a second or more before either. When a
 * destroy held its thread to the end, the status waited for one. */
static void test_destroys_beside_work(void **state)
{
    if (natsd == NULL)
        skip();
    struct boot_req b[3]; /* two to destroy, and the other sandbox */
    boot_all(b, 3);
    int before = qemu_count();
    for (int i = 0; i < 2; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "pkill -STOP -f '[q]emu-system.*/%s/'", b[i].info.id);
        assert_int_equal(system(cmd), 0);
    }
    struct op_req d[2];
    for (int i = 0; i < 2; i++)
        d[i] = (struct op_req){.id = b[i].info.id};
    ops_start(d);
    usleep(300000); /* both destroys are on the work threads, or were */
    char why_not[1400];
    int rc = status_first(b[2].info.id, d, 1000,
                          "the destroys held the node's 2 work threads while QEMU hung", why_not,
                          sizeof why_not);
    destroy(b[2].info.id);
    if (rc < 0)
        fail_msg("%s", why_not);
    assert_int_equal(qemu_count(), before - 3);
}

static void test_exec_files_fork_pause_snapshot(void **state)
{
    if (natsd == NULL)
        skip();
    dsec_sandbox_info a;
    make("microvm", NULL, "busybox:1", &a);
    assert_string_equal(a.type, "microvm");
    char out[4096];
    dsec_err err;
    const char *text = "branch point\n";
    assert_int_equal(dsec_file_write(cl, a.id, "/work/state.txt", text, strlen(text), 0644, &err),
                     0);
    uint8_t *data = NULL;
    size_t len = 0;
    assert_int_equal(dsec_file_read(cl, a.id, "/work/state.txt", &data, &len, &err), 0);
    assert_int_equal(len, strlen(text));
    assert_memory_equal(data, text, len);
    dsec_free(data);
    assert_int_equal(dsec_file_read(cl, a.id, "/work/missing", &data, &len, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);

    /* a process started before the fork runs on in every child: memory state is cloned */
    const char *bg[] = {"sleep", "1000", NULL};
    dsec_proc p;
    if (dsec_proc_start(cl, a.id, &(dsec_proc_opts){.argv = bg}, &p, &err) < 0)
        fail_msg("proc start: %s", err.msg);
    char **kids = NULL;
    size_t nk = 0;
    assert_int_equal(dsec_fork(cl, a.id, 2, &kids, &nk, &err), 0);
    assert_int_equal(nk, 2);
    assert_int_equal(sh(a.id, "echo later > /work/state.txt", out, sizeof out), 0);
    for (size_t i = 0; i < nk; i++) {
        assert_int_equal(sh(kids[i], "cat /work/state.txt; pidof sleep >/dev/null && echo alive",
                            out, sizeof out),
                         0);
        assert_string_equal(out, "branch point\nalive");
    }
    assert_int_equal(sh(kids[0], "echo mine > /work/kid0.txt", out, sizeof out), 0);
    assert_int_not_equal(sh(kids[1], "cat /work/kid0.txt", out, sizeof out), 0);
    /* each child has its own identity */
    char h0[128], h1[128];
    assert_int_equal(sh(kids[0], "hostname; cat /etc/machine-id", h0, sizeof h0), 0);
    assert_int_equal(sh(kids[1], "hostname; cat /etc/machine-id", h1, sizeof h1), 0);
    assert_string_not_equal(h0, h1);

    /* pause and resume keep the sandbox's state */
    assert_int_equal(dsec_pause(cl, a.id, &err), 0);
    dsec_sandbox_info st;
    assert_int_equal(dsec_status(cl, a.id, &st, &err), 0);
    assert_string_equal(st.state, "paused");
    assert_int_equal(dsec_resume(cl, a.id, &err), 0);
    assert_int_equal(
        sh(a.id, "cat /work/state.txt; pidof sleep >/dev/null && echo alive", out, sizeof out), 0);
    assert_string_equal(out, "later\nalive");

    /* a named snapshot is an environment: a new microVM created from it sees the files */
    assert_int_equal(dsec_snapshot(cl, a.id, "vmbus/snap:1", &err), 0);
    /* the copies of RAM and disk made on the way do not stay on the node */
    assert_int_equal(snapshot_files(), 0);
    dsec_sandbox_info b;
    make("microvm", NULL, "vmbus/snap:1", &b);
    assert_int_equal(sh(b.id, "cat /work/state.txt", out, sizeof out), 0);
    assert_string_equal(out, "later");

    destroy(b.id);
    for (size_t i = 0; i < nk; i++) {
        destroy(kids[i]);
        dsec_free(kids[i]);
    }
    dsec_free(kids);
    destroy(a.id);
    assert_int_equal(dsec_status(cl, a.id, &st, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(qemu_count(), 0);
    assert_int_equal(sandbox_dirs(), 0);
}

static void test_node_restart_readopts(void **state)
{
    if (natsd == NULL)
        skip();
    dsec_sandbox_info a;
    make("microvm", NULL, "busybox:1", &a);
    char out[256];
    assert_int_equal(sh(a.id, "mkdir -p /work && echo 42 > /work/n", out, sizeof out), 0);
    const char *bg[] = {"sleep", "1000", NULL}; /* a foreground exec's leftovers end with it */
    dsec_proc p;
    dsec_err perr;
    if (dsec_proc_start(cl, a.id, &(dsec_proc_opts){.argv = bg}, &p, &perr) < 0)
        fail_msg("proc start: %s", perr.msg);
    /* the node manager goes away; its VMs keep running */
    dsec_cell_stop(cell, false);
    cell = NULL;
    assert_int_equal(qemu_count(), 1);
    /* and a snapshot it was making when it died is left half-written */
    char half[300];
    snprintf(half, sizeof half, "%s/cell/node-vmbus-0000/snapshots/%s-1.snap", root, a.id);
    assert_int_equal(mkdir(half, 0700), 0);
    strncat(half, "/state", sizeof half - strlen(half) - 1);
    FILE *hf = fopen(half, "w");
    assert_non_null(hf);
    fclose(hf);
    assert_int_equal(snapshot_files(), 1);
    assert_int_equal(start_cell(), 0);
    assert_int_equal(snapshot_files(), 0); /* the restarted node clears it */
    dsec_err err;
    assert_int_equal(dsec_wait_state(cl, a.id, "running", 30000, &err), 0);
    assert_int_equal(sh(a.id, "cat /work/n; pidof sleep >/dev/null && echo alive", out, sizeof out),
                     0);
    assert_string_equal(out, "42\nalive");
    destroy(a.id);
    assert_int_equal(qemu_count(), 0);
}

/* The node manager stops while a VM boots: the boot is abandoned and its VM destroyed (it was
 * never journaled: kept, it would be an orphan no one owns), before the stop returns. The
 * create's client hears a retry-safe error; retried (same request id) once the node is back,
 * it gets one sandbox, never two. */
static void test_stop_mid_boot(void **state)
{
    if (natsd == NULL)
        skip();
    int before = qemu_count(), dirs = sandbox_dirs();
    static atomic_int answered;
    atomic_store(&answered, 0);
    static struct boot_req b; /* static: a failed assertion leaves the thread writing into it */
    b = (struct boot_req){.answered = &answered};
    assert_int_equal(pthread_create(&b.t, NULL, boot_main, &b), 0);
    for (int i = 0; i < 600 && qemu_count() == before; i++)
        usleep(50000);
    assert_int_equal(qemu_count(), before + 1);
    dsec_cell_stop(cell, false);
    cell = NULL;
    assert_int_equal(qemu_count(), before);
    assert_int_equal(sandbox_dirs(), dirs);
    assert_int_equal(start_cell(), 0);
    pthread_join(b.t, NULL);
    if (b.rc == 0) {
        char out[128];
        assert_int_equal(sh(b.info.id, "hostname", out, sizeof out), 0);
        assert_string_equal(out, b.info.id);
        assert_int_equal(qemu_count(), before + 1);
        destroy(b.info.id);
    } else { /* the node's answer is retry-safe; a retry while the cell was down finds none */
        printf("the create of a boot the node stopped: %s\n", b.err.msg);
    }
    assert_int_equal(qemu_count(), before);
}

static void test_bad_requests(void **state)
{
    if (natsd == NULL)
        skip();
    dsec_create_spec cs = {.type = "microvm", .env = "nope:1", .cpu_milli = 100, .memory_mb = 256};
    dsec_sandbox_info info;
    dsec_err err;
    assert_int_equal(dsec_create(cl, &cs, &info, &err), -1);
    if (strstr(err.msg, "nope:1") == NULL)
        fail_msg("create from an unknown environment: %s", err.msg);
    assert_int_equal(qemu_count(), 0);
    assert_int_equal(sandbox_dirs(), 0);
}

/* ---- terminals, sessions, processes, transfers and the watcher on one microVM -------------
 * Polls are bounded by a deadline generous enough for TCG under ASan. */

#define POLL_MS 120000 /* how long a poll goes on before the case fails */

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The microVM these cases share (booted once: boot takes seconds under TCG). */
static const char *shared_vm(void)
{
    if (shared_id[0] == '\0') {
        dsec_sandbox_info a;
        make("microvm", NULL, "busybox:1", &a);
        assert_string_equal(a.type, "microvm");
        snprintf(shared_id, sizeof shared_id, "%s", a.id);
    }
    return shared_id;
}

/* Type keys on a terminal. */
static void type(const char *id, uint64_t h, const char *keys)
{
    dsec_err err;
    if (dsec_proc_write(cl, id, h, keys, strlen(keys), false, &err) < 0)
        fail_msg("typing %s: %s", keys, err.msg);
}

/* Read a pty process's output from *off until acc holds want (or fail). */
static void pty_expect(const char *id, uint64_t h, uint64_t *off, const char *want, char *acc,
                       size_t n)
{
    dsec_err err;
    size_t len = strlen(acc);
    for (int64_t end = mono_ms() + POLL_MS; mono_ms() < end;) {
        dsec_proc_out o;
        if (dsec_proc_read_wait(cl, id, h, *off, 0, 0, 500, &o, &err) < 0)
            fail_msg("pty read: %s", err.msg);
        size_t k = o.out_len < n - 1 - len ? o.out_len : n - 1 - len;
        memcpy(acc + len, o.out, k);
        len += k;
        acc[len] = '\0';
        *off = o.out_from + o.out_len;
        bool running = o.info.running, got = o.out_len > 0;
        dsec_proc_out_free(&o);
        if (strstr(acc, want) != NULL)
            return;
        if (!running)
            break;
        if (!got)
            usleep(50 * 1000);
    }
    fail_msg("the terminal never showed \"%s\"; it showed:\n%s", want, acc);
}

/* The process's info once it has ended. */
static dsec_proc ended(const char *id, uint64_t handle)
{
    dsec_proc_out o;
    dsec_err err;
    for (int64_t end = mono_ms() + POLL_MS; mono_ms() < end;) {
        if (dsec_proc_read(cl, id, handle, 0, 0, 1, &o, &err) < 0)
            fail_msg("proc read %" PRIu64 ": %s", handle, err.msg);
        dsec_proc p = o.info;
        dsec_proc_out_free(&o);
        if (!p.running)
            return p;
        usleep(50 * 1000);
    }
    fail_msg("process %" PRIu64 " in %s still running after %d s", handle, id, POLL_MS / 1000);
    return (dsec_proc){0};
}

/* Wait until `pidof sleep` in id says running (or not). */
static void sleep_running(const char *id, bool want)
{
    char out[256];
    for (int64_t end = mono_ms() + POLL_MS; mono_ms() < end;) {
        if ((sh(id, "pidof sleep", out, sizeof out) == 0) == want)
            return;
        usleep(50 * 1000);
    }
    fail_msg("sleep in %s: still %s after %d s", id, want ? "not running" : "running",
             POLL_MS / 1000);
}

/* A terminal: the window asked and a resize, Ctrl-C ends the foreground job and the shell
 * goes on, the shell's exit code is the process's. */
static void test_vm_terminal(void **state)
{
    if (natsd == NULL)
        skip();
    const char *id = shared_vm();
    dsec_err err;
    dsec_proc t;
    const char *argv[] = {"sh", NULL};
    if (dsec_proc_start(cl, id,
                        &(dsec_proc_opts){.argv = argv, .pty = true, .rows = 30, .cols = 100}, &t,
                        &err) < 0)
        fail_msg("terminal start: %s", err.msg);
    assert_true(t.pty && t.stdin_open && t.running);
    uint64_t off = 0;
    char acc[8192] = "";
    type(id, t.handle, "stty size; echo $TERM\n");
    pty_expect(id, t.handle, &off, "30 100", acc, sizeof acc);
    pty_expect(id, t.handle, &off, "xterm-256color", acc, sizeof acc);
    assert_int_equal(dsec_proc_resize(cl, id, t.handle, 40, 120, &err), 0);
    acc[0] = '\0';
    type(id, t.handle, "stty size\n");
    pty_expect(id, t.handle, &off, "40 120", acc, sizeof acc);
    /* Ctrl-C once sleep runs: it ends, the rest of that line does not run, the shell goes on */
    acc[0] = '\0';
    sleep_running(id, false);
    type(id, t.handle, "sleep 100; echo slept\n");
    sleep_running(id, true);
    type(id, t.handle, "\x03");
    sleep_running(id, false);
    type(id, t.handle, "echo back-$((6*7))\n");
    pty_expect(id, t.handle, &off, "back-42", acc, sizeof acc);
    assert_null(strstr(acc, "\nslept")); /* (the typed line's echo holds "echo slept") */
    type(id, t.handle, "exit 7\n");
    dsec_proc p = ended(id, t.handle);
    assert_int_equal(p.exit_code, 7);
    assert_int_equal(p.signal, 0);
}

/* A session command line; its result (the caller releases it). */
static int sess(const char *id, uint64_t h, const char *line, uint64_t timeout_ms,
                dsec_exec_reply *r, dsec_err *err)
{
    const char *argv[] = {line, NULL};
    dsec_exec_opts eo = {.argv = argv, .session = h, .timeout_ms = timeout_ms};
    return dsec_exec(cl, id, &eo, r, err);
}

/* A session command that must succeed; its stdout, trailing newlines cut. */
static void sess_ok(const char *id, uint64_t h, const char *line, char *out, size_t n)
{
    dsec_exec_reply r;
    dsec_err err;
    if (sess(id, h, line, 60000, &r, &err) < 0)
        fail_msg("session command '%s': %s", line, err.msg);
    if (r.exit_code != 0)
        fail_msg("session command '%s' exited %d: %.*s", line, r.exit_code, (int)r.err_len,
                 (char *)r.err_out);
    size_t k = r.out_len < n - 1 ? r.out_len : n - 1;
    memcpy(out, r.out, k);
    while (k > 0 && out[k - 1] == '\n')
        k--;
    out[k] = '\0';
    dsec_exec_reply_release(&r);
}

/* A shell session: directory, variables and functions carry over, each command has its own
 * exit code and streams, a timeout ends that command only; the process list shows the
 * session and a background process, which a signal ends. */
static void test_vm_session_ps(void **state)
{
    if (natsd == NULL)
        skip();
    const char *id = shared_vm();
    dsec_err err;
    dsec_proc s;
    if (dsec_session_start(cl, id, NULL, &s, &err) < 0)
        fail_msg("session start: %s", err.msg);
    assert_true(s.session && s.running && !s.pty);
    char got[512];
    sess_ok(id, s.handle, "cd /tmp; export X=5; f() { echo \"f$1\"; }", got, sizeof got);
    sess_ok(id, s.handle, "pwd; echo $X; sh -c 'echo $X'; f z", got, sizeof got);
    assert_string_equal(got, "/tmp\n5\n5\nfz");
    dsec_exec_reply r;
    if (sess(id, s.handle, "echo oops >&2; printf partial; (exit 3)", 60000, &r, &err) < 0)
        fail_msg("session command: %s", err.msg);
    assert_int_equal(r.exit_code, 3);
    assert_int_equal(r.out_len, 7);
    assert_memory_equal(r.out, "partial", 7);
    assert_int_equal(r.err_len, 5);
    assert_memory_equal(r.err_out, "oops\n", 5);
    assert_false(r.interrupted || r.session_ended || r.timed_out);
    dsec_exec_reply_release(&r);
    /* a timeout ends that command only */
    if (sess(id, s.handle, "sleep 100; echo not-killed", 2000, &r, &err) < 0)
        fail_msg("session command with a timeout: %s", err.msg);
    assert_true(r.timed_out);
    assert_false(r.session_ended);
    assert_int_equal(r.out_len, 0); /* not-killed never came */
    dsec_exec_reply_release(&r);
    sleep_running(id, false);
    sess_ok(id, s.handle, "echo $X $(pwd); f y", got, sizeof got);
    assert_string_equal(got, "5 /tmp\nfy");
    /* an interrupt of an idle session does nothing (test_vm_side_lane interrupts a running
     * command) */
    assert_int_equal(dsec_session_interrupt(cl, id, s.handle, &err), 0);
    sess_ok(id, s.handle, "echo $X", got, sizeof got);
    assert_string_equal(got, "5");

    /* the process list: the session and a background process, running */
    const char *bg[] = {"sleep", "1000", NULL};
    dsec_proc p;
    if (dsec_proc_start(cl, id, &(dsec_proc_opts){.argv = bg}, &p, &err) < 0)
        fail_msg("proc start: %s", err.msg);
    assert_true(p.running && p.pid > 0 && !p.pty && !p.session);
    dsec_proc *v;
    size_t nv;
    assert_int_equal(dsec_proc_list(cl, id, &v, &nv, &err), 0);
    bool seen_p = false, seen_s = false;
    for (size_t i = 0; i < nv; i++) {
        if (v[i].handle == p.handle) {
            seen_p = true;
            assert_true(v[i].running);
            assert_int_equal(v[i].pid, p.pid);
            assert_string_equal(v[i].cmdline, "sleep 1000");
        } else if (v[i].handle == s.handle) {
            seen_s = true;
            assert_true(v[i].running && v[i].session);
        }
    }
    dsec_free(v);
    assert_true(seen_p && seen_s);
    /* a window for a process without a terminal is refused */
    assert_int_equal(dsec_proc_resize(cl, id, p.handle, 10, 10, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    assert_int_equal(dsec_proc_signal(cl, id, p.handle, 9, &err), 0);
    dsec_proc q = ended(id, p.handle);
    assert_int_equal(q.signal, 9);

    /* exit ends the session with its code; later commands are refused */
    if (sess(id, s.handle, "exit 4", 60000, &r, &err) < 0)
        fail_msg("session exit: %s", err.msg);
    assert_int_equal(r.exit_code, 4);
    assert_true(r.session_ended);
    dsec_exec_reply_release(&r);
    assert_int_equal(sess(id, s.handle, "true", 60000, &r, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
}

/* The process calls of a microVM go on the guest's second channel, past a running command and
 * beside one another: a session's command is interrupted while it runs (it waited for the
 * command's end), the processes are listed meanwhile, and a stdin write that the process does
 * not read waits in the sandbox while other writes, reads and a signal answer; the signal ends
 * the write. Each call below has 5 s to answer (a client that gives up). */
static void test_vm_side_lane(void **state)
{
    if (natsd == NULL)
        skip();
    const char *id = shared_vm();
    dsec_err err;
    dsec_client *quick = NULL;
    dsec_client_opts o = {.url = dsec_natsd_url(natsd), .tenant = "vmbus", .timeout_ms = 5000};
    assert_int_equal(dsec_client_connect(&quick, &o, &err), 0);
    dsec_proc s;
    if (dsec_session_start(cl, id, NULL, &s, &err) < 0)
        fail_msg("session start: %s", err.msg);
    char got[256];
    sess_ok(id, s.handle, "X=6", got, sizeof got);
    static dsec_test_bg_sess b; /* static: a failed assertion leaves the thread writing into it */
    b = (dsec_test_bg_sess){.cl = cl,
                            .id = id,
                            .h = s.handle,
                            .line = "sleep 100; echo not-interrupted",
                            .timeout_ms = 120000};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, dsec_test_sess_bg, &b), 0);
    bool listed = false;
    for (int i = 0; i < 40 && !atomic_load(&b.done); i++) {
        usleep(500 * 1000);
        if (!listed) { /* once the command runs: the list passes it */
            dsec_proc *v;
            size_t nv;
            if (dsec_proc_list(quick, id, &v, &nv, &err) < 0)
                fail_msg("listing while a session command runs: %s", err.msg);
            for (size_t k = 0; k < nv; k++)
                listed = listed || (v[k].handle == s.handle && v[k].busy);
            dsec_free(v);
            continue;
        }
        if (dsec_session_interrupt(quick, id, s.handle, &err) < 0)
            fail_msg("interrupting a running session command: %s", err.msg);
    }
    pthread_join(th, NULL);
    assert_true(listed);
    if (b.rc != 0)
        fail_msg("the interrupted command: %s", b.err.msg);
    assert_true(b.r.interrupted);
    assert_null(strstr(b.r.out_len ? (char *)b.r.out : "", "not-interrupted"));
    dsec_exec_reply_release(&b.r);
    sess_ok(id, s.handle, "echo $X", got, sizeof got);
    assert_string_equal(got, "6");
    assert_int_equal(dsec_proc_signal(cl, id, s.handle, 9, &err), 0);

    dsec_proc idle, cat;
    const char *idle_argv[] = {"sleep", "300", NULL}, *cat_argv[] = {"cat", NULL};
    assert_int_equal(dsec_proc_start(cl, id,
                                     &(dsec_proc_opts){.argv = idle_argv, .keep_stdin = true},
                                     &idle, &err),
                     0);
    assert_int_equal(dsec_proc_start(cl, id,
                                     &(dsec_proc_opts){.argv = cat_argv, .keep_stdin = true}, &cat,
                                     &err),
                     0);
    static dsec_test_stdin_writer w;
    w = (dsec_test_stdin_writer){.cl = cl, .id = id, .handle = idle.handle};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, dsec_test_write_big, &w), 0);
    bool refused = false;
    for (int i = 0; i < 500 && !refused; i++) { /* until the write waits in the sandbox */
        usleep(20000);
        refused = dsec_proc_write(quick, id, idle.handle, "y", 1, false, &err) < 0;
    }
    assert_true(refused);
    if (strstr(err.msg, "has not taken the bytes of an earlier write") == NULL)
        fail_msg("a second write while the first waits: %s", err.msg);
    if (dsec_proc_write(quick, id, cat.handle, "hi\n", 3, false, &err) < 0)
        fail_msg("writing to another process while a write waits: %s", err.msg);
    dsec_proc_out out = {0};
    for (int i = 0; i < 250 && out.out_len < 3; i++) {
        dsec_proc_out_free(&out);
        if (dsec_proc_read_wait(quick, id, cat.handle, 0, 0, 0, 200, &out, &err) < 0)
            fail_msg("reading cat's output while a write waits: %s", err.msg);
    }
    assert_int_equal(out.out_len, 3);
    assert_memory_equal(out.out, "hi\n", 3);
    dsec_proc_out_free(&out);
    assert_int_equal(dsec_proc_signal(quick, id, idle.handle, SIGKILL, &err), 0);
    pthread_join(t, NULL);
    assert_int_equal(w.rc, -1);
    assert_true(strstr(w.err.msg, "ended before it took all of its stdin") != NULL ||
                strstr(w.err.msg, "closed its stdin with") != NULL);
    assert_int_equal(dsec_proc_signal(quick, id, cat.handle, SIGKILL, &err), 0);
    dsec_client_free(quick);
}

/* The source of an upload: byte o is pat[o % PAT] (PAT not a power of two, so a chunk put at
 * the wrong offset differs). */
#define PAT ((1u << 20) + 7)
static uint8_t pat[2 * PAT];

struct gen {
    uint64_t len, off;
    dsec_sha256 h;
};

static ssize_t gen_read(void *ud, void *buf, size_t n)
{
    struct gen *g = ud;
    if (n > g->len - g->off)
        n = (size_t)(g->len - g->off);
    uint8_t *p = buf;
    for (size_t done = 0; done < n;) {
        size_t at = (size_t)((g->off + done) % PAT), k = n - done < PAT ? n - done : PAT;
        memcpy(p + done, pat + at, k);
        done += k;
    }
    dsec_sha256_update(&g->h, p, n);
    g->off += n;
    return (ssize_t)n;
}

/* A download's pages, compared byte for byte with the source. */
struct sink {
    uint64_t len;
    bool differs;
};

static int sink_page(void *ud, const uint8_t *data, size_t len, uint64_t size)
{
    struct sink *k = ud;
    for (size_t done = 0; done < len && !k->differs;) {
        size_t at = (size_t)((k->len + done) % PAT), n = len - done < PAT ? len - done : PAT;
        k->differs = memcmp(data + done, pat + at, n) != 0;
        done += n;
    }
    k->len += len;
    return 0;
}

struct evs {
    char seen[8192];
};

static void on_ev(void *ud, const dsec_dir_event *ev)
{
    struct evs *e = ud;
    size_t n = strlen(e->seen);
    snprintf(e->seen + n, sizeof e->seen - n, "%s %s%s\n", ev->event, ev->path, ev->dir ? "/" : "");
}

/* Streamed upload and download (several chunks, sha256 checked by both ends), mkdir, stat,
 * rename, remove, and a directory watcher's events. */
static void test_vm_files_watch(void **state)
{
    if (natsd == NULL)
        skip();
    const char *id = shared_vm();
    dsec_err err;
    for (size_t i = 0; i < 2 * PAT; i++)
        pat[i] = (uint8_t)((i % PAT) * 131 + ((i % PAT) >> 11));
    assert_int_equal(dsec_file_mkdir(cl, id, "/work/up", 0, true, &err), 0);
    /* 3 MiB and a bit in 256 KiB chunks, two in flight */
    uint64_t len = (3u << 20) + 12345;
    struct gen g = {.len = len};
    dsec_sha256_init(&g.h);
    dsec_transfer_result res;
    if (dsec_file_upload(cl, id, "/work/up/big",
                         &(dsec_upload_opts){.chunk = 256u << 10, .window = 2}, gen_read, &g, &res,
                         &err) < 0)
        fail_msg("upload of %" PRIu64 " bytes: %s", len, err.msg);
    uint8_t d[DSEC_SHA256_LEN];
    dsec_sha256_final(&g.h, d);
    char want[65];
    for (int i = 0; i < DSEC_SHA256_LEN; i++)
        snprintf(want + 2 * i, 3, "%02x", d[i]);
    assert_int_equal(res.size, len);
    assert_string_equal(res.sha256, want);
    char out[4096];
    assert_int_equal(
        sh(id, "sha256sum /work/up/big | cut -c1-64; ls -a /work/up | wc -l", out, sizeof out), 0);
    char expect[100];
    snprintf(expect, sizeof expect, "%s\n3", want); /* ., .. and big: no temporary file left */
    assert_string_equal(out, expect);
    struct sink k = {0};
    dsec_transfer_result dres;
    if (dsec_file_download(cl, id, "/work/up/big",
                           &(dsec_download_opts){.page = 128u << 10, .window = 3}, sink_page, &k,
                           &dres, &err) < 0)
        fail_msg("download of %" PRIu64 " bytes: %s", len, err.msg);
    assert_int_equal(k.len, len);
    assert_false(k.differs);
    assert_int_equal(dres.size, len);
    assert_string_equal(dres.sha256, want);

    /* mkdir, stat, rename, remove */
    dsec_dirent st;
    assert_int_equal(dsec_file_stat(cl, id, "/work/up/big", &st, &err), 0);
    assert_string_equal(st.kind, "file");
    assert_int_equal(st.size, len);
    assert_int_equal(st.mode & 07777, 0644);
    dsec_free(st.name);
    assert_int_equal(dsec_file_mkdir(cl, id, "/work/up/d/e", 0750, true, &err), 0);
    assert_int_equal(dsec_file_stat(cl, id, "/work/up/d/e", &st, &err), 0);
    assert_string_equal(st.kind, "dir");
    assert_int_equal(st.mode & 07777, 0750);
    dsec_free(st.name);
    assert_int_equal(dsec_file_mkdir(cl, id, "/work/up/d/e", 0750, false, &err), -1);
    assert_int_equal(dsec_file_rename(cl, id, "/work/up/big", "/work/up/d/e/moved", &err), 0);
    assert_int_equal(dsec_file_stat(cl, id, "/work/up/big", &st, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
    assert_int_equal(dsec_file_stat(cl, id, "/work/up/d/e/moved", &st, &err), 0);
    assert_int_equal(st.size, len);
    dsec_free(st.name);
    assert_int_equal(dsec_file_remove(cl, id, "/work/up/d", false, &err), -1);
    assert_int_equal(dsec_file_remove(cl, id, "/work/up/d", true, &err), 0);
    assert_int_equal(dsec_file_stat(cl, id, "/work/up/d", &st, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);

    /* the watcher: a file created and removed in the watched directory */
    assert_int_equal(dsec_file_mkdir(cl, id, "/work/w", 0, true, &err), 0);
    dsec_proc w;
    if (dsec_dir_watch(cl, id, "/work/w", false, &w, &err) < 0)
        fail_msg("watch: %s", err.msg);
    assert_true(w.running);
    assert_int_equal(sh(id, "echo x > /work/w/f && rm /work/w/f", out, sizeof out), 0);
    struct evs e = {""};
    uint64_t off = 0;
    for (int64_t end = mono_ms() + POLL_MS;
         mono_ms() < end && strstr(e.seen, "delete /work/w/f\n") == NULL;) {
        int n = dsec_dir_events(cl, id, w.handle, &off, 1000, on_ev, &e, NULL, &err);
        if (n < 0)
            fail_msg("watch events: %s", err.msg);
        if (n == 0)
            usleep(50 * 1000);
    }
    const char *cr = strstr(e.seen, "create /work/w/f\n");
    const char *del = strstr(e.seen, "delete /work/w/f\n");
    if (cr == NULL || del == NULL || del < cr)
        fail_msg("watch events:\n%s", e.seen);
    assert_int_equal(dsec_proc_signal(cl, id, w.handle, 9, &err), 0);
    assert_false(ended(id, w.handle).running);

    destroy(id);
    shared_id[0] = '\0';
    assert_int_equal(qemu_count(), 0);
    assert_int_equal(sandbox_dirs(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_placement_by_requirement),
        cmocka_unit_test(test_boots_beside_work),
        cmocka_unit_test(test_forks_beside_work),
        cmocka_unit_test(test_destroys_beside_work),
        cmocka_unit_test(test_exec_files_fork_pause_snapshot),
        cmocka_unit_test(test_node_restart_readopts),
        cmocka_unit_test(test_stop_mid_boot),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_vm_terminal),
        cmocka_unit_test(test_vm_session_ps),
        cmocka_unit_test(test_vm_side_lane),
        cmocka_unit_test(test_vm_files_watch),
    };
    if (getenv("DSEC_TEST_FILTER") && *getenv("DSEC_TEST_FILTER")) /* one test, or a pattern */
        cmocka_set_test_filter(getenv("DSEC_TEST_FILTER"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
