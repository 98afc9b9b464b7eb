/* test_placement.c - the scheduler's capacity view, overlay and power-of-k-choices placement. */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "actors/placement.h"
#include "backends/registry.h"
#include "dsec/alloc.h"
#include "dsec/err.h"

#define N_(a) (sizeof(a) / sizeof((a)[0]))

static dsec_registry *reg;
static int T_CONTAINER, T_MICROVM, T_VM;

static const char *const CONTAINER[] = {"container"};

static int setup(void **state)
{
    dsec_err e;
    if (dsec_registry_new_builtin(&reg, &e) < 0)
        return -1;
    T_CONTAINER = dsec_registry_find(reg, "container");
    T_MICROVM = dsec_registry_find(reg, "microvm");
    T_VM = dsec_registry_find(reg, "vm");
    return 0;
}

static int teardown(void **state)
{
    dsec_registry_free(reg);
    return 0;
}

static dsec_placement *view(uint64_t dead_after_ms)
{
    dsec_placement_config cfg = {
        .cell = "c1", .dead_after_ms = dead_after_ms, .locality_weight = -1};
    dsec_placement *v = NULL;
    dsec_err e;
    assert_int_equal(dsec_placement_new(&v, reg, &cfg, &e), 0);
    return v;
}

/* A full report of an empty node of cell c1 offering containers. */
static dsec_node_report full(const char *name, uint64_t cpu, uint64_t mem, uint64_t slots)
{
    return (dsec_node_report){.node = name,
                              .cell = "c1",
                              .seq = 1,
                              .full = true,
                              .cpu_free_milli = cpu,
                              .mem_free_mb = mem,
                              .slots_free = slots,
                              .cpu_milli = cpu,
                              .memory_mb = mem,
                              .slots = slots,
                              .types = CONTAINER,
                              .ntypes = 1};
}

static void report(dsec_placement *v, const dsec_node_report *r, uint64_t now, int want)
{
    dsec_err e;
    dsec_err_clear(&e);
    int rc = dsec_placement_update(v, r, now, &e);
    if (rc != want)
        fail_msg("report from %s: got %d, want %d (%s)", r->node, rc, want, e.msg);
}

static void add(dsec_placement *v, const char *name, uint64_t cpu, uint64_t mem, uint64_t slots)
{
    dsec_node_report r = full(name, cpu, mem, slots);
    report(v, &r, 0, DSEC_REPORT_APPLIED);
}

static dsec_place_req creq(uint64_t cpu, uint64_t mem)
{
    return (dsec_place_req){.type = T_CONTAINER, .cpu_milli = cpu, .memory_mb = mem};
}

/* Place and return the node name (static buffer), or NULL with *e filled. */
static const char *place(dsec_placement *v, const dsec_place_req *req, unsigned k, uint64_t *rng,
                         uint64_t now, dsec_place_result *res, dsec_err *e)
{
    static dsec_place_result local;
    if (res == NULL)
        res = &local;
    if (dsec_placement_place(v, req, k, rng, now, res, e) < 0)
        return NULL;
    return res->node;
}

static dsec_node_info info(dsec_placement *v, const char *node, uint64_t now)
{
    dsec_node_info ni;
    dsec_err e;
    if (dsec_placement_node(v, node, now, &ni, &e) < 0)
        fail_msg("%s", e.msg);
    return ni;
}

static int node_num(const char *name)
{
    return atoi(name + 1); /* "n12" -> 12 */
}

/* ---------------------------------------------------------------------- capacity */

static void never_overcommits(void **state)
{
    dsec_placement *v = view(0);
    char name[16];
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof name, "n%d", i);
        add(v, name, 4000, 8192, 100);
    }
    uint64_t rng = 1;
    int count[10] = {0}, total = 0;
    dsec_place_req req = creq(500, 1000);
    dsec_err e;
    const char *n;
    while ((n = place(v, &req, 2, &rng, 10, NULL, &e)) != NULL) {
        count[node_num(n)]++;
        total++;
        assert_true(total <= 80);
    }
    /* Every node filled exactly to its CPU, none beyond, with no report in
     * between: the overlay alone kept the count. */
    for (int i = 0; i < 10; i++) {
        assert_int_equal(count[i], 8);
        snprintf(name, sizeof name, "n%d", i);
        dsec_node_info ni = info(v, name, 10);
        assert_int_equal(ni.cpu_avail, 0);
        assert_int_equal(ni.reservations, 8);
        assert_int_equal(ni.mem_avail, 8192 - 8000);
    }
    assert_int_equal(e.code, DSEC_E_CAPACITY);
    assert_string_equal(e.msg, "no node in cell c1 has 500 milli-CPU free (best: 0)");
    dsec_placement_free(v);

    /* Random sizes: the sum placed on each node never exceeds what it has. */
    v = view(0);
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof name, "n%d", i);
        add(v, name, 8000, 16384, 12);
    }
    uint64_t cpu[10] = {0}, mem[10] = {0}, slots[10] = {0};
    int placed = 0, refused = 0;
    for (int i = 0; i < 1000; i++) {
        dsec_place_req r =
            creq(100 + dsec_placement_rand(&rng) % 1500, 100 + dsec_placement_rand(&rng) % 3000);
        if ((n = place(v, &r, 3, &rng, 10, NULL, &e)) == NULL) {
            assert_int_equal(e.code, DSEC_E_CAPACITY);
            refused++;
            continue;
        }
        int k = node_num(n);
        cpu[k] += r.cpu_milli;
        mem[k] += r.memory_mb;
        slots[k]++;
        assert_true(cpu[k] <= 8000 && mem[k] <= 16384 && slots[k] <= 12);
        placed++;
    }
    assert_true(placed > 40 && refused > 0);
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof name, "n%d", i);
        dsec_node_info ni = info(v, name, 10);
        assert_int_equal(ni.cpu_avail, 8000 - cpu[i]);
        assert_int_equal(ni.mem_avail, 16384 - mem[i]);
        assert_int_equal(ni.slots_avail, 12 - slots[i]);
    }
    dsec_placement_free(v);
}

static void filters_type(void **state)
{
    dsec_placement *v = view(0);
    static const char *const mv[] = {"microvm"}, *const both[] = {"container", "microvm", "warp"};
    dsec_node_report r = full("n1", 4000, 8192, 100);
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    r = full("n2", 4000, 8192, 100);
    r.types = mv;
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    r = full("n3", 4000, 8192, 100);
    r.types = both; /* "warp" is unknown here and skipped */
    r.ntypes = 3;
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    assert_int_equal(info(v, "n3", 0).types, (1u << T_CONTAINER) | (1u << T_MICROVM));

    uint64_t rng = 7;
    int seen[4] = {0};
    dsec_err e;
    dsec_place_result res;
    dsec_place_req req = creq(100, 100);
    req.type = T_MICROVM;
    for (int i = 0; i < 40; i++) {
        const char *n = place(v, &req, 2, &rng, 1, &res, &e);
        assert_non_null(n);
        seen[node_num(n)]++;
        dsec_placement_release(v, n, res.reservation);
    }
    assert_int_equal(seen[1], 0);
    assert_true(seen[2] > 0 && seen[3] > 0);

    req.type = T_VM;
    assert_null(place(v, &req, 2, &rng, 1, NULL, &e));
    assert_int_equal(e.code, DSEC_E_UNSUPPORTED);
    assert_string_equal(
        e.msg, "no node in cell c1 offers sandbox type \"vm\" (offered: container, microvm)");
    dsec_placement_free(v);
}

static void honours_affinity(void **state)
{
    dsec_placement *v = view(0);
    static const char *const k1[] = {"zone"}, *const v1[] = {"a"};
    static const char *const k2[] = {"zone", "gpu"}, *const v2[] = {"b", "a100"};
    dsec_node_report r = full("n1", 4000, 8192, 100);
    r.label_keys = k1, r.label_vals = v1, r.nlabels = 1;
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    r = full("n2", 4000, 8192, 100);
    r.label_keys = k2, r.label_vals = v2, r.nlabels = 2;
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    add(v, "n3", 4000, 8192, 100);

    uint64_t rng = 3;
    dsec_err e;
    dsec_place_result res;
    dsec_place_req req = creq(100, 100);
    const char *ak[] = {"zone"}, *av[] = {"b"};
    req.aff_keys = ak, req.aff_vals = av, req.naff = 1;
    for (int i = 0; i < 20; i++) {
        const char *n = place(v, &req, 2, &rng, 1, &res, &e);
        assert_non_null(n);
        assert_string_equal(n, "n2");
        dsec_placement_release(v, n, res.reservation);
    }
    av[0] = "a";
    assert_string_equal(place(v, &req, 2, &rng, 1, NULL, &e), "n1");

    const char *gk[] = {"gpu"}, *gv[] = {"h100"};
    req.aff_keys = gk, req.aff_vals = gv;
    assert_null(place(v, &req, 2, &rng, 1, NULL, &e));
    assert_int_equal(e.code, DSEC_E_CAPACITY);
    assert_string_equal(e.msg,
                        "no healthy node in cell c1 offering \"container\" has label gpu=h100");

    /* Each label exists somewhere, never together. */
    const char *bk[] = {"zone", "gpu"}, *bv[] = {"a", "a100"};
    req.aff_keys = bk, req.aff_vals = bv, req.naff = 2;
    assert_null(place(v, &req, 2, &rng, 1, NULL, &e));
    assert_non_null(strstr(e.msg, "has all the labels zone=a, gpu=a100"));
    dsec_placement_free(v);
}

/* ------------------------------------------------------------------------ overlay */

static void overlay_spreads_between_reports(void **state)
{
    dsec_placement *v = view(0);
    add(v, "n0", 64000, 262144, 1000);
    add(v, "n1", 64000, 262144, 1000);
    add(v, "n2", 64000, 262144, 1000);
    uint64_t rng = 11;
    int count[3] = {0};
    dsec_place_req req = creq(1000, 2048);
    dsec_err e;
    for (int i = 0; i < 30; i++)
        count[node_num(place(v, &req, 3, &rng, 5, NULL, &e))]++;
    /* Without the overlay every one would land on the same best node. */
    for (int i = 0; i < 3; i++)
        assert_int_equal(count[i], 10);
    dsec_placement_free(v);
}

static void overlay_clears_on_newer_report(void **state)
{
    dsec_placement *v = view(0);
    add(v, "n1", 4000, 8192, 100);
    uint64_t rng = 5;
    dsec_err e;
    dsec_place_req req = creq(1000, 1024);
    for (int i = 0; i < 3; i++)
        assert_non_null(place(v, &req, 2, &rng, 10, NULL, &e));
    dsec_node_info ni = info(v, "n1", 10);
    assert_int_equal(ni.reservations, 3);
    assert_int_equal(ni.cpu_avail, 1000);
    assert_int_equal(ni.live, 0);

    /* The node admitted the three and says so: the overlay goes, or they
     * would count twice (and the 4th placement would fail). */
    dsec_node_report d = {.node = "n1",
                          .seq = 2,
                          .cpu_free_milli = 1000,
                          .mem_free_mb = 8192 - 3072,
                          .slots_free = 97,
                          .live = 3};
    report(v, &d, 20, DSEC_REPORT_APPLIED);
    ni = info(v, "n1", 20);
    assert_int_equal(ni.reservations, 0);
    assert_int_equal(ni.cpu_avail, 1000);
    assert_int_equal(ni.live, 3);
    assert_int_equal(ni.cpu_total, 4000); /* a delta keeps the totals */
    assert_non_null(place(v, &req, 2, &rng, 30, NULL, &e));
    assert_null(place(v, &req, 2, &rng, 30, NULL, &e));
    assert_int_equal(e.code, DSEC_E_CAPACITY);

    /* An older report does not clear it, nor change the figures. */
    d.seq = 1;
    d.cpu_free_milli = 4000;
    report(v, &d, 40, DSEC_REPORT_STALE);
    ni = info(v, "n1", 40);
    assert_int_equal(ni.reservations, 1);
    assert_int_equal(ni.cpu_free, 1000);
    assert_int_equal(ni.seq, 2);
    dsec_placement_free(v);
}

/* A report that echoes the newest stamp its node took counts only the placements stamped up
 * to it: those sent after are still on their way, and their reservations stay (they are what
 * the scheduler's window counts). */
static void overlay_keeps_placements_on_their_way(void **state)
{
    (void)state;
    dsec_placement *v = view(0);
    add(v, "n1", 8000, 8192, 100);
    uint64_t rng = 5;
    dsec_err e;
    dsec_place_req req = creq(1000, 1024);
    for (uint64_t stamp = 101; stamp <= 105; stamp++) {
        req.stamp = stamp;
        assert_non_null(place(v, &req, 2, &rng, 10, NULL, &e));
    }
    assert_int_equal(info(v, "n1", 10).reservations, 5);

    /* it took 101..103: those three are in its figures, 104 and 105 are not yet */
    dsec_node_report d = {.node = "n1",
                          .seq = 2,
                          .cpu_free_milli = 5000,
                          .mem_free_mb = 8192 - 3072,
                          .slots_free = 97,
                          .live = 3,
                          .echo = true,
                          .taken_upto = 103};
    report(v, &d, 20, DSEC_REPORT_APPLIED);
    dsec_node_info ni = info(v, "n1", 20);
    assert_int_equal(ni.reservations, 2);
    assert_int_equal(ni.cpu_avail, 3000); /* 5000 free less the two on their way */

    /* a report that took none of them keeps both */
    d.seq = 3;
    d.taken_upto = 0;
    report(v, &d, 30, DSEC_REPORT_APPLIED);
    assert_int_equal(info(v, "n1", 30).reservations, 2);

    /* an unstamped reservation goes with any report */
    req.stamp = 0;
    assert_non_null(place(v, &req, 2, &rng, 35, NULL, &e));
    assert_int_equal(info(v, "n1", 35).reservations, 3);
    d.seq = 4;
    report(v, &d, 40, DSEC_REPORT_APPLIED);
    assert_int_equal(info(v, "n1", 40).reservations, 2);

    /* the node took the rest */
    d.seq = 5;
    d.taken_upto = 105;
    d.cpu_free_milli = 3000;
    report(v, &d, 50, DSEC_REPORT_APPLIED);
    ni = info(v, "n1", 50);
    assert_int_equal(ni.reservations, 0);
    assert_int_equal(ni.cpu_avail, 3000);

    /* a report without an echo counts them all, as before */
    req.stamp = 200;
    assert_non_null(place(v, &req, 2, &rng, 60, NULL, &e));
    d = (dsec_node_report){
        .node = "n1", .seq = 6, .cpu_free_milli = 2000, .mem_free_mb = 2048, .slots_free = 95};
    report(v, &d, 70, DSEC_REPORT_APPLIED);
    assert_int_equal(info(v, "n1", 70).reservations, 0);

    /* a restarted node (a new epoch) took nothing that was on its way to the old one */
    req.stamp = 300;
    assert_non_null(place(v, &req, 2, &rng, 80, NULL, &e));
    d = (dsec_node_report){.node = "n1",
                           .epoch = 7,
                           .seq = 1,
                           .cpu_free_milli = 8000,
                           .slots_free = 100,
                           .echo = true};
    report(v, &d, 90, DSEC_REPORT_APPLIED);
    assert_int_equal(info(v, "n1", 90).reservations, 0);
    dsec_placement_free(v);
}

static void overlay_expires_and_releases(void **state)
{
    dsec_placement *v = view(0); /* ttl 2000 ms by default */
    add(v, "n1", 4000, 8192, 100);
    uint64_t rng = 5;
    dsec_err e;
    dsec_place_result a, b;
    dsec_place_req req = creq(1000, 1024);
    assert_non_null(place(v, &req, 2, &rng, 1000, &a, &e));
    assert_non_null(place(v, &req, 2, &rng, 1500, &b, &e));
    assert_int_equal(info(v, "n1", 2999).reservations, 2);
    assert_int_equal(info(v, "n1", 3000).reservations, 1); /* the first one's 2 s are up */
    assert_int_equal(info(v, "n1", 3000).cpu_avail, 3000);
    /* A refusal gives the rest back at once. */
    assert_int_equal(dsec_placement_release(v, "n1", b.reservation), 0);
    assert_int_equal(dsec_placement_release(v, "n1", b.reservation), DSEC_REPORT_UNKNOWN);
    assert_int_equal(dsec_placement_release(v, "n1", a.reservation), DSEC_REPORT_UNKNOWN);
    assert_int_equal(dsec_placement_release(v, "nx", 1), DSEC_REPORT_UNKNOWN);
    dsec_node_info ni = info(v, "n1", 3000);
    assert_int_equal(ni.reservations, 0);
    assert_int_equal(ni.cpu_avail, 4000);
    assert_int_equal(ni.mem_avail, 8192);
    assert_int_equal(ni.slots_avail, 100);
    dsec_placement_free(v);
}

/* A node refuses: the refused placement's reservation goes; a refusal for room
 * puts the node's own figures into the view (unless a newer report is in),
 * keeping the other reservations, until the next report. */
static void refusal_corrects_the_view(void **state)
{
    dsec_placement *v = view(0);
    add(v, "n1", 4000, 8192, 100); /* seq 1 */
    add(v, "n2", 4000, 8192, 100);
    uint64_t rng = 9;
    dsec_err e;
    dsec_place_req req = creq(1000, 1024);
    dsec_place_req only1 = req;
    const char *ex2[] = {"n2"};
    only1.exclude = ex2;
    only1.nexclude = 1;
    dsec_place_result a, b;
    assert_string_equal(place(v, &only1, 2, &rng, 10, &a, &e), "n1");
    assert_string_equal(place(v, &only1, 2, &rng, 10, &b, &e), "n1");
    assert_int_equal(info(v, "n1", 10).cpu_avail, 2000);

    /* refused, not for room: only its reservation goes */
    assert_int_equal(dsec_placement_refused(v, "n1", a.reservation, NULL), 0);
    dsec_node_info ni = info(v, "n1", 10);
    assert_int_equal(ni.reservations, 1);
    assert_int_equal(ni.cpu_avail, 3000);
    assert_int_equal(ni.cpu_free, 4000);

    /* refused for room after report 1: the node had 500 milli-CPU; b stays reserved */
    dsec_placement_release(v, "n1", b.reservation);
    assert_string_equal(place(v, &only1, 2, &rng, 10, &b, &e), "n1");
    assert_string_equal(place(v, &only1, 2, &rng, 10, &a, &e), "n1");
    dsec_node_room room = {.seq = 1, .cpu_free_milli = 1500, .mem_free_mb = 4096, .slots_free = 7};
    assert_int_equal(dsec_placement_refused(v, "n1", a.reservation, &room), 0);
    ni = info(v, "n1", 10);
    assert_int_equal(ni.reservations, 1);
    assert_int_equal(ni.cpu_free, 1500);
    assert_int_equal(ni.cpu_avail, 500);
    assert_int_equal(ni.mem_free, 4096);
    assert_int_equal(ni.slots_free, 7);
    assert_int_equal(ni.seq, 1);
    /* so the next create goes to n2, though the scores favoured n1 before */
    for (int i = 0; i < 8; i++) {
        dsec_place_result r;
        assert_string_equal(place(v, &req, 2, &rng, 10, &r, &e), "n2");
        dsec_placement_release(v, "n2", r.reservation);
    }

    /* figures older than the view's report change nothing */
    dsec_node_report d = {
        .node = "n1", .seq = 3, .cpu_free_milli = 3000, .mem_free_mb = 8192, .slots_free = 90};
    report(v, &d, 20, DSEC_REPORT_APPLIED);
    room.seq = 2;
    room.cpu_free_milli = 0;
    assert_int_equal(dsec_placement_refused(v, "n1", 0, &room), 0);
    assert_int_equal(info(v, "n1", 20).cpu_free, 3000);
    /* figures from a refusal after report 3 apply; the next report replaces them */
    room.seq = 3;
    assert_int_equal(dsec_placement_refused(v, "n1", 0, &room), 0);
    assert_int_equal(info(v, "n1", 20).cpu_free, 0);
    d.seq = 4;
    report(v, &d, 30, DSEC_REPORT_APPLIED);
    assert_int_equal(info(v, "n1", 30).cpu_free, 3000);

    assert_int_equal(dsec_placement_refused(v, "nx", 1, &room), DSEC_REPORT_UNKNOWN);
    dsec_placement_free(v);
}

static void stale_and_restarted_reports(void **state)
{
    dsec_placement *v = view(0);
    dsec_node_report r = full("n1", 4000, 8192, 100);
    r.seq = 5;
    r.epoch = 100;
    report(v, &r, 0, DSEC_REPORT_APPLIED);

    dsec_node_report d = {.node = "n1", .epoch = 100, .seq = 4, .cpu_free_milli = 10};
    report(v, &d, 1, DSEC_REPORT_STALE);
    d.seq = 5; /* a duplicate is stale too */
    report(v, &d, 1, DSEC_REPORT_STALE);
    assert_int_equal(info(v, "n1", 1).cpu_free, 4000);
    d.seq = 6;
    report(v, &d, 1, DSEC_REPORT_APPLIED);
    assert_int_equal(info(v, "n1", 1).cpu_free, 10);

    /* A full report replaces labels, types and totals. */
    static const char *const mv[] = {"microvm"};
    r = full("n1", 2000, 1000, 10);
    r.epoch = 100, r.seq = 7, r.types = mv;
    report(v, &r, 2, DSEC_REPORT_APPLIED);
    dsec_node_info ni = info(v, "n1", 2);
    assert_int_equal(ni.types, 1u << T_MICROVM);
    assert_int_equal(ni.cpu_total, 2000);
    assert_int_equal(ni.slots_total, 10);

    /* The node manager restarted: new epoch, seq from 1 again. */
    d = (dsec_node_report){.node = "n1", .epoch = 200, .seq = 1, .cpu_free_milli = 1500};
    report(v, &d, 3, DSEC_REPORT_APPLIED);
    assert_int_equal(info(v, "n1", 3).cpu_free, 1500);
    d.epoch = 100; /* a late report of the old incarnation */
    d.seq = 99;
    report(v, &d, 3, DSEC_REPORT_STALE);

    /* A delta from a node never seen in full adds nothing. */
    d = (dsec_node_report){.node = "ghost", .seq = 9, .cpu_free_milli = 1};
    report(v, &d, 3, DSEC_REPORT_UNKNOWN);
    assert_int_equal(dsec_placement_count(v), 1);

    dsec_err e;
    char longname[100];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    r = full(longname, 1, 1, 1);
    assert_int_equal(dsec_placement_update(v, &r, 0, &e), -1);
    assert_int_equal(e.code, DSEC_E_INVALID);
    dsec_placement_free(v);
}

/* ---------------------------------------------------------------- node lifecycle */

static void silent_node_expires(void **state)
{
    dsec_placement *v = view(10000);
    add(v, "n1", 4000, 8192, 100);
    add(v, "n2", 4000, 8192, 100);
    assert_int_equal(dsec_placement_heartbeat(v, "n2", 8000), 0);
    assert_int_equal(dsec_placement_heartbeat(v, "zz", 8000), DSEC_REPORT_UNKNOWN);

    /* Silent for 11 s: suspect, so n2 (heard 3 s ago) takes every create, even before
     * expire() runs. */
    uint64_t rng = 9;
    dsec_err e;
    dsec_place_result res;
    dsec_place_req req = creq(100, 100);
    for (int i = 0; i < 30; i++) {
        assert_string_equal(place(v, &req, 2, &rng, 11000, &res, &e), "n2");
        dsec_placement_release(v, "n2", res.reservation);
    }
    assert_false(info(v, "n1", 11000).alive);

    char **names = NULL;
    size_t n = 0;
    assert_int_equal(dsec_placement_expire(v, 11000, &names, &n, &e), 0);
    assert_int_equal(n, 1);
    assert_string_equal(names[0], "n1");
    dsec_placement_names_free(names, n);
    assert_int_equal(dsec_placement_count(v), 1);
    assert_int_equal(dsec_placement_node(v, "n1", 11000, &(dsec_node_info){0}, &e), -1);
    assert_int_equal(e.code, DSEC_E_NOT_FOUND);
    assert_int_equal(dsec_placement_heartbeat(v, "n1", 11000), DSEC_REPORT_UNKNOWN);
    assert_int_equal(dsec_placement_expire(v, 11000, &names, &n, &e), 0);
    assert_int_equal(n, 0);
    assert_null(names);

    /* The last one goes silent too: the only node with room, it takes creates until
     * expire() drains it. */
    assert_string_equal(place(v, &req, 2, &rng, 30000, &res, &e), "n2");
    dsec_placement_release(v, "n2", res.reservation);
    assert_int_equal(dsec_placement_expire(v, 30000, &names, &n, &e), 0);
    assert_int_equal(n, 1);
    dsec_placement_names_free(names, n);
    assert_null(place(v, &req, 2, &rng, 30000, NULL, &e));
    assert_int_equal(e.code, DSEC_E_CAPACITY);
    assert_string_equal(e.msg, "no node in cell c1 has reported capacity yet");
    /* It comes back with its next full report. */
    dsec_node_report r = full("n1", 4000, 8192, 100);
    report(v, &r, 30000, DSEC_REPORT_APPLIED);
    assert_string_equal(place(v, &req, 2, &rng, 30000, NULL, &e), "n1");
    dsec_placement_free(v);
}

static void remove_and_health(void **state)
{
    dsec_placement *v = view(0);
    char name[16];
    for (int i = 0; i < 200; i++) { /* enough to exercise the table's growth and deletion */
        snprintf(name, sizeof name, "n%d", i);
        add(v, name, 4000, 8192, 100);
    }
    dsec_err e;
    for (int i = 0; i < 200; i += 2) {
        snprintf(name, sizeof name, "n%d", i);
        assert_int_equal(dsec_placement_remove(v, name, &e), 0);
    }
    assert_int_equal(dsec_placement_remove(v, "n0", &e), -1);
    assert_int_equal(e.code, DSEC_E_NOT_FOUND);
    assert_int_equal(dsec_placement_count(v), 100);
    for (int i = 0; i < 200; i++) {
        snprintf(name, sizeof name, "n%d", i);
        dsec_node_info ni;
        assert_int_equal(dsec_placement_node(v, name, 0, &ni, &e), i % 2 ? 0 : -1);
    }
    /* All but n7 drained. */
    for (int i = 1; i < 200; i += 2) {
        snprintf(name, sizeof name, "n%d", i);
        assert_int_equal(dsec_placement_set_healthy(v, name, i == 7, &e), 0);
    }
    assert_int_equal(dsec_placement_set_healthy(v, "n0", true, &e), -1);
    uint64_t rng = 2;
    dsec_place_req req = creq(100, 100);
    for (int i = 0; i < 10; i++)
        assert_string_equal(place(v, &req, 2, &rng, 1, NULL, &e), "n7");
    /* Health survives reports. */
    dsec_node_report d = {
        .node = "n9", .seq = 2, .cpu_free_milli = 4000, .mem_free_mb = 8192, .slots_free = 100};
    report(v, &d, 1, DSEC_REPORT_APPLIED);
    assert_false(info(v, "n9", 1).healthy);
    dsec_placement_free(v);
}

static void exclude_list_honoured(void **state)
{
    dsec_placement *v = view(0);
    add(v, "n1", 4000, 8192, 100);
    add(v, "n2", 4000, 8192, 100);
    add(v, "n3", 4000, 8192, 100);
    uint64_t rng = 4;
    dsec_err e;
    dsec_place_result res;
    dsec_place_req req = creq(100, 100);
    const char *tried[] = {"n1", "nobody", "n2"};
    req.exclude = tried, req.nexclude = 3;
    for (int i = 0; i < 20; i++) {
        assert_string_equal(place(v, &req, 2, &rng, 1, &res, &e), "n3");
        dsec_placement_release(v, "n3", res.reservation);
    }
    const char *all[] = {"n3", "n1", "n2"};
    req.exclude = all;
    assert_null(place(v, &req, 2, &rng, 1, NULL, &e));
    assert_int_equal(e.code, DSEC_E_CAPACITY);
    assert_string_equal(e.msg, "every node in cell c1 that could take this sandbox has refused "
                               "it already (3 tried)");
    /* The exclusion was for that request only. */
    req.nexclude = 0;
    assert_non_null(place(v, &req, 2, &rng, 1, NULL, &e));
    dsec_placement_free(v);
}

static void finds_the_one_in_10000(void **state)
{
    dsec_placement *v = view(0);
    char name[16];
    uint64_t rng = 77;
    int lucky = (int)(dsec_placement_rand(&rng) % 10000);
    for (int i = 0; i < 10000; i++) {
        snprintf(name, sizeof name, "n%d", i);
        dsec_node_report r = full(name, 64000, 262144, 3200);
        if (i != lucky)
            r.cpu_free_milli = 100; /* full for our request */
        report(v, &r, 0, DSEC_REPORT_APPLIED);
    }
    dsec_err e;
    dsec_place_result res;
    dsec_place_req req = creq(2000, 4096);
    snprintf(name, sizeof name, "n%d", lucky);
    for (int i = 0; i < 5; i++) {
        assert_non_null(place(v, &req, 2, &rng, 1, &res, &e));
        assert_string_equal(res.node, name);
        assert_true(res.scanned);
        assert_int_equal(res.candidates, 1);
    }
    /* Once it too is full, the error says what was short and the best seen. */
    dsec_place_req huge = creq(60000, 4096);
    assert_null(place(v, &huge, 2, &rng, 1, NULL, &e));
    assert_string_equal(e.msg, "no node in cell c1 has 60000 milli-CPU free (best: 54000)");
    dsec_placement_free(v);
}

/* Two feasible nodes among 1000: probing rarely meets both, but placement
 * must still compare k of them, so the roomier one always wins. */
static void sparse_set_still_compares_k(void **state)
{
    dsec_placement *v = view(0);
    char name[16];
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "n%d", i);
        dsec_node_report r = full(name, 64000, 262144, 3200);
        if (i == 300)
            r.cpu_free_milli = 8000; /* feasible, busy */
        else if (i != 700)
            r.cpu_free_milli = 0; /* full */
        report(v, &r, 0, DSEC_REPORT_APPLIED);
    }
    uint64_t rng = 5;
    dsec_err e;
    dsec_place_result res;
    dsec_place_req req = creq(1000, 1024);
    for (int i = 0; i < 30; i++) {
        assert_non_null(place(v, &req, 2, &rng, 1, &res, &e));
        assert_string_equal(res.node, "n700");
        assert_int_equal(res.candidates, 2);
        dsec_placement_release(v, "n700", res.reservation);
    }
    dsec_placement_free(v);
}

static void locality_breaks_near_ties(void **state)
{
    dsec_placement *v = view(0);
    static const char *const layers[] = {"sha256:aaa", "sha256:bbb", "sha256:ccc"};
    add(v, "n1", 4000, 8192, 100);
    dsec_node_report r = full("n2", 4000, 8192, 100);
    r.cpu_free_milli = 3800; /* a little busier than n1 */
    r.layers = layers, r.nlayers = 3;
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    assert_int_equal(info(v, "n2", 0).nlayers, 3);

    uint64_t rng = 8;
    dsec_err e;
    dsec_place_result res;
    dsec_place_req req = creq(100, 100);
    for (int i = 0; i < 10; i++) { /* no layers: the freer node */
        assert_string_equal(place(v, &req, 2, &rng, 1, &res, &e), "n1");
        dsec_placement_release(v, "n1", res.reservation);
    }
    const char *env[] = {"sha256:bbb", "sha256:zzz"};
    req.layers = env, req.nlayers = 2;
    for (int i = 0; i < 10; i++) { /* it caches one of the two: worth more than 5% CPU */
        assert_string_equal(place(v, &req, 2, &rng, 1, &res, &e), "n2");
        dsec_placement_release(v, "n2", res.reservation);
    }
    /* Locality does not beat a big capacity gap. */
    r = full("n2", 4000, 8192, 100);
    r.seq = 2, r.cpu_free_milli = 400, r.mem_free_mb = 800, r.slots_free = 10;
    r.layers = layers, r.nlayers = 3;
    report(v, &r, 1, DSEC_REPORT_APPLIED);
    req.layers = layers, req.nlayers = 3;
    for (int i = 0; i < 10; i++) {
        assert_string_equal(place(v, &req, 2, &rng, 1, &res, &e), "n1");
        dsec_placement_release(v, "n1", res.reservation);
    }
    dsec_placement_free(v);
}

static void capacity_messages(void **state)
{
    dsec_placement *v = view(0);
    uint64_t rng = 1;
    dsec_err e;
    dsec_place_req req = creq(100, 100);
    assert_null(place(v, &req, 2, &rng, 1, NULL, &e));
    assert_int_equal(e.code, DSEC_E_CAPACITY);
    assert_string_equal(e.msg, "no node in cell c1 has reported capacity yet");

    dsec_node_report r = full("n1", 4000, 8192, 1);
    r.cpu_free_milli = 500;
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    req = creq(2000, 100);
    assert_null(place(v, &req, 2, &rng, 1, NULL, &e));
    assert_int_equal(e.code, DSEC_E_CAPACITY);
    assert_string_equal(e.msg, "no node in cell c1 has 2000 milli-CPU free (best: 500)");
    req = creq(100, 9000);
    assert_null(place(v, &req, 2, &rng, 1, NULL, &e));
    assert_string_equal(e.msg, "no node in cell c1 has 9000 MB of memory free (best: 8192)");
    req = creq(100, 100);
    assert_non_null(place(v, &req, 2, &rng, 1, NULL, &e));
    assert_null(place(v, &req, 2, &rng, 1, NULL, &e)); /* its one slot is reserved */
    assert_string_equal(e.msg, "no node in cell c1 has a free sandbox slot (all 1 are full)");

    r = full("n2", 3000, 1000, 10);
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    r = full("n3", 500, 8000, 10);
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    req = creq(2000, 4000);
    assert_null(place(v, &req, 2, &rng, 1, NULL, &e));
    assert_string_equal(e.msg, "no node in cell c1 has 2000 milli-CPU and 4000 MB of memory free "
                               "together (most CPU free: 3000, most memory free: 8092 MB)");

    req.cell = "c9";
    assert_null(place(v, &req, 2, &rng, 1, NULL, &e));
    assert_string_equal(e.msg, "no node in cell c9 has reported capacity yet");

    /* Bad arguments. */
    req = creq(1, 1);
    assert_int_equal(
        dsec_placement_place(v, &req, DSEC_PLACE_K_MAX + 1, &rng, 1, &(dsec_place_result){0}, &e),
        -1);
    assert_int_equal(e.code, DSEC_E_INVALID);
    req.type = 31;
    assert_int_equal(dsec_placement_place(v, &req, 2, &rng, 1, &(dsec_place_result){0}, &e), -1);
    assert_int_equal(e.code, DSEC_E_INVALID);
    dsec_placement_free(v);
}

/* ---------------------------------------------------------------------- disk */

/* Disk is filtered like memory: a node without the disk a create asks for is
 * skipped, one with room is picked, and reservations count against it until
 * the node's next report. */
static void disk_skips_a_node_short_of_it(void **state)
{
    dsec_placement *v = view(0);
    uint64_t rng = 7;
    dsec_err e;
    /* n1 has more of everything else, so it would win on score; it has 100 MB of disk */
    dsec_node_report r = full("n1", 64000, 65536, 100);
    r.disk_mb = 100, r.disk_free_mb = 100;
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    r = full("n2", 4000, 8192, 10);
    r.disk_mb = 1000, r.disk_free_mb = 900;
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    assert_int_equal(info(v, "n1", 1).disk_total, 100);
    assert_int_equal(info(v, "n1", 1).disk_free, 100);

    dsec_place_req req = creq(100, 100);
    req.disk_mb = 500;
    dsec_place_result res;
    for (int i = 0; i < 8; i++) {
        assert_string_equal(place(v, &req, 2, &rng, 1, &res, &e), "n2");
        dsec_placement_release(v, "n2", res.reservation);
    }
    /* a small one fits n1, the better scored */
    req.disk_mb = 50;
    assert_string_equal(place(v, &req, 2, &rng, 1, &res, &e), "n1");
    assert_int_equal(info(v, "n1", 1).disk_avail, 50);
    /* reservations hold disk: 50 left on n1, then 400 on n2 after one of 500 */
    req.disk_mb = 500;
    assert_string_equal(place(v, &req, 2, &rng, 1, &res, &e), "n2");
    assert_int_equal(info(v, "n2", 1).disk_avail, 400);
    assert_null(place(v, &req, 2, &rng, 1, NULL, &e));
    assert_int_equal(e.code, DSEC_E_CAPACITY);
    assert_string_equal(e.msg, "no node in cell c1 has 500 MB of disk free (best: 400)");
    /* the release gives it back */
    assert_int_equal(dsec_placement_release(v, "n2", res.reservation), 0);
    assert_int_equal(info(v, "n2", 1).disk_avail, 900);

    /* a refusal for room corrects the view's disk too */
    assert_string_equal(place(v, &req, 2, &rng, 1, &res, &e), "n2");
    dsec_node_room room = {.seq = 1,
                           .cpu_free_milli = 4000,
                           .mem_free_mb = 8192,
                           .slots_free = 10,
                           .disk_free_mb = 300};
    assert_int_equal(dsec_placement_refused(v, "n2", res.reservation, &room), 0);
    assert_int_equal(info(v, "n2", 1).disk_free, 300);
    assert_null(place(v, &req, 2, &rng, 1, NULL, &e));
    assert_string_equal(e.msg, "no node in cell c1 has 500 MB of disk free (best: 300)");
    /* a delta report brings the disk back, and clears the overlay */
    dsec_node_report d = {.node = "n2",
                          .seq = 2,
                          .cpu_free_milli = 4000,
                          .mem_free_mb = 8192,
                          .slots_free = 10,
                          .disk_free_mb = 900};
    report(v, &d, 2, DSEC_REPORT_APPLIED);
    assert_int_equal(info(v, "n2", 2).disk_avail, 900);
    assert_int_equal(info(v, "n2", 2).disk_total, 1000); /* totals stay until a full report */
    assert_string_equal(place(v, &req, 2, &rng, 2, &res, &e), "n2");
    dsec_placement_free(v);
}

/* A node whose reports carry no disk total does not count disk (an older node
 * manager): placement does not filter it on disk. */
static void disk_not_counted_is_not_filtered(void **state)
{
    dsec_placement *v = view(0);
    uint64_t rng = 3;
    dsec_err e;
    add(v, "n1", 4000, 8192, 10);
    dsec_node_report r = full("n2", 4000, 8192, 10);
    r.disk_mb = 1000, r.disk_free_mb = 10;
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    dsec_place_req req = creq(100, 100);
    req.disk_mb = 1u << 20;
    for (int i = 0; i < 8; i++) {
        dsec_place_result res;
        assert_string_equal(place(v, &req, 2, &rng, 1, &res, &e), "n1");
        dsec_placement_release(v, "n1", res.reservation);
    }
    /* n1 short of cpu: the message names cpu, not disk (n1 would take any disk) */
    req.cpu_milli = 5000;
    assert_null(place(v, &req, 2, &rng, 1, NULL, &e));
    assert_string_equal(e.msg, "no node in cell c1 has 5000 milli-CPU free (best: 4000)");
    dsec_placement_free(v);
}

/* Disk counts in the score like memory: of two nodes alike but for disk, the
 * one with more disk free wins. */
static void disk_counts_in_the_score(void **state)
{
    dsec_placement *v = view(0);
    uint64_t rng = 11;
    dsec_err e;
    dsec_node_report r = full("n1", 4000, 8192, 10);
    r.disk_mb = 1000, r.disk_free_mb = 200;
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    r = full("n2", 4000, 8192, 10);
    r.disk_mb = 1000, r.disk_free_mb = 800;
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    dsec_place_req req = creq(100, 100);
    req.disk_mb = 10;
    for (int i = 0; i < 8; i++) {
        dsec_place_result res;
        assert_string_equal(place(v, &req, 2, &rng, 1, &res, &e), "n2");
        dsec_placement_release(v, "n2", res.reservation);
    }
    /* short of several together: the message names disk too */
    r = full("n3", 4000, 8192, 10);
    r.cpu_free_milli = 100, r.disk_mb = 1000, r.disk_free_mb = 1000;
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    req = creq(200, 100);
    req.disk_mb = 900;
    assert_null(place(v, &req, 2, &rng, 1, NULL, &e));
    assert_string_equal(e.msg, "no node in cell c1 has 200 milli-CPU, 100 MB of memory and 900 MB "
                               "of disk free together (most CPU free: 4000, most memory free: "
                               "8192 MB, most disk free: 1000 MB)");
    dsec_placement_free(v);
}

static void cell_summary(void **state)
{
    dsec_placement *v = view(0);
    static const char *const mv[] = {"microvm"};
    add(v, "n1", 4000, 8192, 100);
    dsec_node_report r = full("n2", 2000, 4096, 50);
    r.types = mv, r.live = 7;
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    add(v, "n3", 1000, 1000, 10);
    r = full("x1", 9000, 9000, 9);
    r.cell = "c2";
    report(v, &r, 0, DSEC_REPORT_APPLIED);
    dsec_err e;
    assert_int_equal(dsec_placement_set_healthy(v, "n3", false, &e), 0);

    uint64_t rng = 1;
    dsec_place_req req = creq(500, 1000);
    req.cell = "c1";
    assert_non_null(place(v, &req, 2, &rng, 1, NULL, &e));
    dsec_cell_summary s;
    dsec_placement_summary(v, "c1", 1, &s);
    assert_int_equal(s.nodes, 2);
    assert_int_equal(s.cpu_free_milli, 6000 - 500);
    assert_int_equal(s.mem_free_mb, 12288 - 1000);
    assert_int_equal(s.slots_free, 150 - 1);
    assert_int_equal(s.live, 7 + 1);
    assert_int_equal(s.types, (1u << T_CONTAINER) | (1u << T_MICROVM));
    dsec_placement_summary(v, NULL, 1, &s);
    assert_int_equal(s.nodes, 3);
    /* Silent nodes drop out of the summary. */
    dsec_placement_summary(v, "c1", 60000, &s);
    assert_int_equal(s.nodes, 0);
    assert_int_equal(s.types, 0);
    dsec_placement_free(v);
}

/* ------------------------------------------------------------------ concurrency */

struct racer {
    dsec_placement *v;
    uint64_t rng;
    _Atomic int *count;
    int placed;
    int bad;
};

static void *racer_run(void *arg)
{
    struct racer *r = arg;
    dsec_place_req req = creq(100, 100);
    dsec_place_result res;
    dsec_err e;
    for (;;) {
        if (dsec_placement_place(r->v, &req, 2, &r->rng, 1, &res, &e) < 0) {
            if (e.code != DSEC_E_CAPACITY)
                r->bad++;
            return NULL;
        }
        atomic_fetch_add(&r->count[node_num(res.node)], 1);
        r->placed++;
    }
}

static void concurrent_place_never_overcommits(void **state)
{
    enum { NODES = 50, SLOTS = 20, THREADS = 4 };
    dsec_placement *v = view(0);
    char name[16];
    for (int i = 0; i < NODES; i++) {
        snprintf(name, sizeof name, "n%d", i);
        add(v, name, 1000000, 1000000, SLOTS);
    }
    _Atomic int count[NODES];
    for (int i = 0; i < NODES; i++)
        atomic_init(&count[i], 0);
    struct racer r[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        r[i] = (struct racer){.v = v, .rng = (uint64_t)i * 1000 + 1, .count = count};
        assert_int_equal(pthread_create(&th[i], NULL, racer_run, &r[i]), 0);
    }
    int total = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(r[i].bad, 0);
        total += r[i].placed;
    }
    for (int i = 0; i < NODES; i++)
        assert_int_equal(atomic_load(&count[i]), SLOTS);
    assert_int_equal(total, NODES * SLOTS);
    dsec_placement_free(v);
}

/* --------------------------------------------------------------- micro-measure */

static uint64_t ns_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Not a timed assertion: prints what place() costs at two cell sizes, with
 * reports refreshing the view between batches as nodes would. */
static void measure(int nodes, double feasible_share, int batches)
{
    dsec_placement *v = view(0);
    char name[16];
    static const char *const layers[] = {"l1", "l2", "l3", "l4"};
    int feasible_every = (int)(1.0 / feasible_share);
    for (int i = 0; i < nodes; i++) {
        snprintf(name, sizeof name, "n%d", i);
        dsec_node_report r = full(name, 192000, 786432, 3200);
        r.layers = layers, r.nlayers = (size_t)(i % 4);
        if (i % feasible_every != 0)
            r.cpu_free_milli = 0;
        report(v, &r, 0, DSEC_REPORT_APPLIED);
    }
    const char *env[] = {"l1", "l2", "l3"};
    dsec_place_req req = creq(100, 256);
    req.layers = env, req.nlayers = 3;
    uint64_t rng = 42, seq = 1, spent = 0, scans = 0;
    int total = 0;
    dsec_err e;
    dsec_place_result res;
    for (int batch = 0; batch < batches; batch++) {
        uint64_t t0 = ns_now();
        for (int i = 0; i < 1000; i++) {
            if (dsec_placement_place(v, &req, 2, &rng, 1, &res, &e) < 0)
                fail_msg("%s", e.msg);
            scans += res.scanned;
        }
        spent += ns_now() - t0;
        total += 1000;
        seq++;
        for (int i = 0; i < nodes; i++) { /* deltas clear the overlay */
            snprintf(name, sizeof name, "n%d", i);
            dsec_node_report d = {.node = name,
                                  .seq = seq,
                                  .cpu_free_milli = i % feasible_every ? 0 : 192000,
                                  .mem_free_mb = 786432,
                                  .slots_free = 3200};
            report(v, &d, 1, DSEC_REPORT_APPLIED);
        }
    }
    print_message("place(): %6d nodes, %5.1f%% feasible, k=2: %7.2f us per placement (%" PRIu64
                  " of %d fell back to a scan)\n",
                  nodes, feasible_share * 100.0, (double)spent / total / 1000.0, scans, total);
    dsec_placement_free(v);
}

static void place_cost(void **state)
{
    measure(160, 1.0, 40);
    measure(10000, 1.0, 40);
    measure(10000, 0.01, 5); /* a nearly full cell: mostly scans */
}

/* ------------------------------------------------------------------- late nodes */

/* The view as a scheduler with the default heartbeat (1000 ms) and dead_after_ms
 * builds it: suspect after 2000 ms, drained after max(dead_after_ms, 2000 + 1000) ms
 * without a report or an answer, then at most one drain a second, probation
 * 3000 ms. */
static dsec_placement *late_view(uint64_t dead_after_ms)
{
    dsec_placement_config cfg = {.cell = "c1",
                                 .dead_after_ms = dead_after_ms,
                                 .heartbeat_ms = 1000,
                                 .drain_gap_ms = 1000,
                                 .probation_ms = 3000,
                                 .locality_weight = -1};
    dsec_placement *v = NULL;
    dsec_err e;
    assert_int_equal(dsec_placement_new(&v, reg, &cfg, &e), 0);
    return v;
}

/* Run expire() and return how many it drained (names checked against want, if given). */
static size_t drain(dsec_placement *v, uint64_t now, const char *want)
{
    char **names = NULL;
    size_t n = 0;
    dsec_err e;
    assert_int_equal(dsec_placement_expire(v, now, &names, &n, &e), 0);
    if (want != NULL && n > 0)
        assert_string_equal(names[0], want);
    dsec_placement_names_free(names, n);
    return n;
}

static void late_config_refused(void **state)
{
    dsec_placement_config cfg = {
        .dead_after_ms = 3000, .suspect_after_ms = 3000, .locality_weight = -1};
    dsec_placement *v = NULL;
    dsec_err e;
    assert_int_equal(dsec_placement_new(&v, reg, &cfg, &e), -1);
    assert_int_equal(e.code, DSEC_E_INVALID);
    assert_string_equal(e.msg, "placement: suspect_after_ms (3000) must be below dead_after_ms "
                               "(3000)");
    assert_null(v);
}

/* (a) Heartbeats every 1500 ms (1.5 x the interval): the node is never suspect,
 * never drained, and takes its share of creates, even where dead_after_ms (1200)
 * is shorter than its gaps: it must be suspect a heartbeat interval first. */
static void late_heartbeats_stay_in_placement(void **state)
{
    dsec_placement *v = late_view(1200);
    assert_int_equal(dsec_placement_drain_after_ms(v), 3000);
    add(v, "n1", 4000, 8192, 100);
    add(v, "n2", 4000, 8192, 100);
    uint64_t rng = 5;
    dsec_err e;
    dsec_place_result res;
    dsec_place_req req = creq(100, 100);
    int to_n1 = 0, total = 0;
    for (uint64_t t = 100; t <= 30000; t += 100) {
        if (t % 1500 == 0)
            assert_int_equal(dsec_placement_heartbeat(v, "n1", t), 0);
        if (t % 1000 == 0)
            assert_int_equal(dsec_placement_heartbeat(v, "n2", t), 0);
        assert_int_equal(drain(v, t, NULL), 0); /* the scheduler's tick may fall anywhere */
        const char *got = place(v, &req, 2, &rng, t, &res, &e);
        assert_non_null(got);
        to_n1 += strcmp(got, "n1") == 0;
        total++;
        dsec_placement_release(v, got, res.reservation);
        dsec_node_info ni = info(v, "n1", t);
        assert_false(ni.suspect);
        assert_true(ni.preferred);
    }
    /* equal nodes, k = 2: about half; far from none */
    assert_true(to_n1 > total / 4);
    dsec_placement_health h;
    dsec_placement_health_get(v, 30000, &h);
    assert_int_equal(h.suspect, 0);
    assert_int_equal(h.drained, 0);
    assert_int_equal(h.deferred, 0);
    dsec_placement_free(v);
}

/* (b) Silent and not answering: suspect first (only a fallback), drained past
 * dead_after_ms as before; a full report re-admits it on probation. */
static void silent_node_suspect_then_drained(void **state)
{
    dsec_placement *v = late_view(3000);
    add(v, "n1", 4000, 8192, 100);
    add(v, "n2", 4000, 8192, 2);
    uint64_t rng = 3;
    dsec_err e;
    dsec_place_result res;
    dsec_place_req req = creq(100, 100);
    for (uint64_t t = 1000; t <= 2500; t += 500)
        assert_int_equal(dsec_placement_heartbeat(v, "n2", t), 0);

    /* 2500 ms silent: suspect, still in the view; n2 takes creates while it has room... */
    assert_true(info(v, "n1", 2500).suspect);
    assert_false(info(v, "n1", 2500).preferred);
    assert_true(info(v, "n1", 2500).alive);
    assert_int_equal(drain(v, 2500, NULL), 0);
    assert_string_equal(place(v, &req, 2, &rng, 2500, NULL, &e), "n2");
    assert_string_equal(place(v, &req, 2, &rng, 2500, NULL, &e), "n2");
    /* ...and n1, the only node left with room, takes the next. */
    assert_string_equal(place(v, &req, 2, &rng, 2500, &res, &e), "n1");
    dsec_placement_health h;
    dsec_placement_health_get(v, 2500, &h);
    assert_int_equal(h.suspect, 1);

    /* Past dead_after_ms with no report and no answer: drained. */
    assert_int_equal(dsec_placement_heartbeat(v, "n2", 3000), 0);
    assert_int_equal(drain(v, 3500, "n1"), 1);
    assert_int_equal(dsec_placement_count(v), 1);
    dsec_placement_health_get(v, 3500, &h);
    assert_int_equal(h.drained, 1);
    assert_int_equal(h.suspect, 0);

    /* Its next full report brings it back, on probation: n2 is preferred while it
     * has room (a report freed it), for probation_ms. */
    dsec_node_report r = full("n1", 4000, 8192, 100);
    r.seq = 2;
    report(v, &r, 4000, DSEC_REPORT_APPLIED);
    r = full("n2", 4000, 8192, 100);
    r.seq = 2;
    report(v, &r, 4000, DSEC_REPORT_APPLIED);
    dsec_placement_health_get(v, 4000, &h);
    assert_int_equal(h.readmitted, 1);
    assert_int_equal(h.probation, 1);
    assert_false(info(v, "n1", 4000).preferred);
    for (uint64_t t = 4000; t < 7000; t += 100) {
        if (t % 1000 == 0) {
            assert_int_equal(dsec_placement_heartbeat(v, "n1", t), 0);
            assert_int_equal(dsec_placement_heartbeat(v, "n2", t), 0);
        }
        assert_string_equal(place(v, &req, 2, &rng, t, &res, &e), "n2");
        dsec_placement_release(v, "n2", res.reservation);
    }
    /* On time throughout: preferred again once probation is over. */
    assert_int_equal(dsec_placement_heartbeat(v, "n1", 7000), 0);
    assert_true(info(v, "n1", 7000).preferred);
    int to_n1 = 0;
    for (int i = 0; i < 40; i++) {
        const char *got = place(v, &req, 2, &rng, 7000, &res, &e);
        to_n1 += strcmp(got, "n1") == 0;
        dsec_placement_release(v, got, res.reservation);
    }
    assert_true(to_n1 > 0);
    dsec_placement_free(v);
}

/* (c) Four nodes go quiet together: one is drained at once, the others one per
 * drain_gap_ms; the one that keeps answering placements is never drained until it
 * stops answering too. */
static void late_nodes_drained_one_at_a_time(void **state)
{
    dsec_placement *v = late_view(3000);
    add(v, "n1", 4000, 8192, 100);
    add(v, "n2", 4000, 8192, 100);
    add(v, "n3", 4000, 8192, 100);
    add(v, "n4", 4000, 8192, 100);
    add(v, "n5", 4000, 8192, 100);
    dsec_placement_health h;
    size_t drained = 0;
    uint64_t first = 0;
    for (uint64_t t = 500; t <= 12000; t += 500) {
        assert_int_equal(dsec_placement_heartbeat(v, "n5", t), 0);
        assert_int_equal(dsec_placement_answered(v, "n1", t), 0); /* refusals keep coming */
        size_t n = drain(v, t, NULL);
        assert_true(n <= 1);
        if (n == 1 && first == 0)
            first = t;
        drained += n;
        assert_int_equal(info(v, "n1", t).alive, true);
        assert_true(info(v, "n1", t).suspect || t <= 2000);
    }
    /* all three went at 3000 ms, one at a time, a drain_gap_ms apart */
    assert_int_equal(drained, 3);
    assert_int_equal(first, 3500);
    dsec_placement_health_get(v, 12000, &h);
    assert_int_equal(h.drained, 3);
    assert_true(h.deferred >= 3);   /* two at the first pass, one at least after */
    assert_int_equal(h.suspect, 1); /* n1: late, but answering */
    assert_int_equal(dsec_placement_count(v), 2);
    assert_int_equal(dsec_placement_answered(v, "n2", 12000), DSEC_REPORT_UNKNOWN);

    /* n1 stops answering as well: drained once dead_after_ms has passed since its
     * last answer. */
    for (uint64_t t = 12500; t <= 15000; t += 500) {
        assert_int_equal(dsec_placement_heartbeat(v, "n5", t), 0);
        assert_int_equal(drain(v, t, NULL), 0);
    }
    assert_int_equal(drain(v, 15500, "n1"), 1);
    assert_int_equal(dsec_placement_count(v), 1);
    dsec_placement_free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(never_overcommits),
        cmocka_unit_test(filters_type),
        cmocka_unit_test(honours_affinity),
        cmocka_unit_test(overlay_spreads_between_reports),
        cmocka_unit_test(overlay_clears_on_newer_report),
        cmocka_unit_test(overlay_keeps_placements_on_their_way),
        cmocka_unit_test(overlay_expires_and_releases),
        cmocka_unit_test(refusal_corrects_the_view),
        cmocka_unit_test(stale_and_restarted_reports),
        cmocka_unit_test(silent_node_expires),
        cmocka_unit_test(remove_and_health),
        cmocka_unit_test(exclude_list_honoured),
        cmocka_unit_test(finds_the_one_in_10000),
        cmocka_unit_test(sparse_set_still_compares_k),
        cmocka_unit_test(locality_breaks_near_ties),
        cmocka_unit_test(capacity_messages),
        cmocka_unit_test(disk_skips_a_node_short_of_it),
        cmocka_unit_test(disk_not_counted_is_not_filtered),
        cmocka_unit_test(disk_counts_in_the_score),
        cmocka_unit_test(cell_summary),
        cmocka_unit_test(late_config_refused),
        cmocka_unit_test(late_heartbeats_stay_in_placement),
        cmocka_unit_test(silent_node_suspect_then_drained),
        cmocka_unit_test(late_nodes_drained_one_at_a_time),
        cmocka_unit_test(concurrent_place_never_overcommits),
        cmocka_unit_test(place_cost),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
