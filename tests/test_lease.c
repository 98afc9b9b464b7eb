/* test_lease.c - the KV lease behind the arbiter and quota pairs: one holder at a time, renewal,
 * takeover after expiry, handover on release, a lapsed holder learning it lost. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "runtime/lease.h"
#include "bus/bus.h"
#include "bus/js.h"
#include "tests/fixture.h"
#include "tests/test_util.h"

static dsec_natsd *natsd;
static char root[64];
static dsec_bus *bus;
static dsec_js *js;

static int group_setup(void **state)
{
    (void)state;
    if (dsec_test_server_start("dsec-lease", true, &natsd, root, sizeof root) < 0)
        return -1;
    dsec_bus_opts o = {.url = dsec_natsd_url(natsd), .name = "lease-test"};
    dsec_err err;
    if (dsec_bus_connect(&bus, &o, &err) < 0 || dsec_js_new(&js, bus, 5000, &err) < 0) {
        fprintf(stderr, "bus: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    dsec_js_free(js);
    dsec_bus_free(bus);
    return dsec_test_server_stop(natsd, root);
}

static dsec_kv_bucket *bucket(const char *name)
{
    dsec_kv_bucket *kv = NULL;
    dsec_kv_conf kc = {.bucket = name};
    dsec_err err;
    if (dsec_kv_open(&kv, js, &kc, &err) < 0)
        fail_msg("bucket %s: %s", name, err.msg);
    return kv;
}

/* Step l until it reaches want or ms pass; the state it ended in. */
static dsec_lease_state step_until(dsec_lease *l, dsec_lease_state want, int ms)
{
    dsec_lease_state s = DSEC_LEASE_STANDBY;
    for (int t = 0; t <= ms; t += 50) {
        dsec_err err;
        if ((s = dsec_lease_step(l, &err)) == want)
            return s;
        msleep(50);
    }
    return s;
}

static void one_holder_then_takeover_after_expiry(void **state)
{
    (void)state;
    dsec_kv_bucket *kv = bucket("lease-expiry");
    dsec_lease a, b;
    dsec_lease_init(&a, kv, "lease", "holder-a", 600);
    dsec_lease_init(&b, kv, "lease", "holder-b", 600);
    dsec_err err;
    assert_int_equal(dsec_lease_step(&a, &err), DSEC_LEASE_ACQUIRED);
    assert_int_equal(dsec_lease_step(&b, &err), DSEC_LEASE_STANDBY);
    /* a renews (every lease_ms/3) for well past one lease: b never gets it */
    for (int i = 0; i < 20; i++) {
        assert_int_equal(dsec_lease_step(&a, &err), DSEC_LEASE_HELD);
        assert_int_equal(dsec_lease_step(&b, &err), DSEC_LEASE_STANDBY);
        msleep(60);
    }
    /* a stops renewing (a crash, a partition): b takes it once the record expired */
    assert_int_equal(step_until(&b, DSEC_LEASE_ACQUIRED, 2000), DSEC_LEASE_ACQUIRED);
    assert_true(b.held);
    /* a comes back and learns it lost: its renewal's compare-and-set fails */
    assert_int_equal(dsec_lease_step(&a, &err), DSEC_LEASE_LOST);
    assert_false(a.held);
    assert_int_equal(dsec_lease_step(&a, &err), DSEC_LEASE_STANDBY);
    assert_int_equal(dsec_lease_step(&b, &err), DSEC_LEASE_HELD);
    dsec_kv_close(kv);
}

static void release_hands_over_at_once(void **state)
{
    (void)state;
    dsec_kv_bucket *kv = bucket("lease-release");
    dsec_lease a, b;
    dsec_lease_init(&a, kv, "lease", "holder-a", 60000);
    dsec_lease_init(&b, kv, "lease", "holder-b", 60000);
    dsec_err err;
    assert_int_equal(dsec_lease_step(&a, &err), DSEC_LEASE_ACQUIRED);
    assert_int_equal(dsec_lease_step(&b, &err), DSEC_LEASE_STANDBY);
    /* a one-minute lease, released by a clean stop: b needs no minute */
    dsec_lease_release(&a);
    assert_int_equal(dsec_lease_step(&b, &err), DSEC_LEASE_ACQUIRED);
    /* a restarted holder of the same name takes its own record back */
    dsec_lease_release(&b);
    dsec_lease a2;
    dsec_lease_init(&a2, kv, "lease", "holder-a", 60000);
    assert_int_equal(dsec_lease_step(&a2, &err), DSEC_LEASE_ACQUIRED);
    dsec_kv_close(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_holder_then_takeover_after_expiry),
        cmocka_unit_test(release_hands_over_at_once),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
