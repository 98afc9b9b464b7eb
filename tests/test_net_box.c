/* test_net_box.c - the allowlist algebra without root: CIDR parsing, ranges, and box insertion
 * against a pointwise model (disjoint, the longest-lived entry holds each point, the kernel
 * operations replay to the same set). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backends/net/net-box.h"
#include "dsec/alloc.h"

static void cidrs_and_ranges(void **state)
{
    (void)state;
    int fam;
    uint8_t a[16], lo[16], hi[16];
    unsigned plen;
    assert_int_equal(dsec__parse_cidr("10.1.2.3/24", &fam, a, &plen), 0);
    assert_int_equal(fam, AF_INET);
    assert_int_equal(plen, 24);
    dsec__prefix_range(a, plen, 4, lo, hi);
    assert_memory_equal(lo, ((uint8_t[]){10, 1, 2, 0}), 4);
    assert_memory_equal(hi, ((uint8_t[]){10, 1, 2, 255}), 4);
    assert_int_equal(dsec__parse_cidr("10.1.2.3", &fam, a, &plen), 0);
    assert_int_equal(plen, 32);
    assert_int_equal(dsec__parse_cidr("fd00::1/64", &fam, a, &plen), 0);
    assert_int_equal(fam, AF_INET6);
    assert_int_equal(plen, 64);
    dsec__prefix_range(a, 127, 16, lo, hi);
    assert_int_equal(lo[15], 0);
    assert_int_equal(hi[15], 1);
    const char *bad[] = {"10.1.2.3/33", "fd00::/129",  "10.1.2/8", "x/1", "10.0.0.0/-1",
                         "10.0.0.0/",   "10.0.0.0/8x", NULL,       ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(dsec__parse_cidr(bad[i], &fam, a, &plen), -1);
    uint8_t x[4] = {0, 0, 0, 255};
    assert_true(dsec__addr_step(x, 4, 1));
    assert_memory_equal(x, ((uint8_t[]){0, 0, 1, 0}), 4);
    assert_true(dsec__addr_step(x, 4, -1));
    assert_memory_equal(x, ((uint8_t[]){0, 0, 0, 255}), 4);
    uint8_t top[4] = {255, 255, 255, 255}, zero[4] = {0};
    assert_false(dsec__addr_step(top, 4, 1));   /* wrapped */
    assert_false(dsec__addr_step(zero, 4, -1)); /* wrapped */
}

/* The model: IPv4-mapped addresses ::ffff:10.0.0.0..15, ports 0..15, protocols 6 and 17. */
#define NA 16
#define NP 16
static const uint8_t PROTOS[] = {6, 17};

static struct dsec__box mkbox(uint8_t proto, unsigned alo, unsigned ahi, unsigned plo, unsigned phi,
                              uint64_t exp_ms)
{
    struct dsec__box b = {.family = AF_INET6,
                          .proto = proto,
                          .plo = (uint16_t)plo,
                          .phi = (uint16_t)phi,
                          .exp_ms = exp_ms};
    uint8_t mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 0};
    memcpy(b.lo, mapped, 16);
    memcpy(b.hi, mapped, 16);
    b.lo[15] = (uint8_t)alo;
    b.hi[15] = (uint8_t)ahi;
    return b;
}

static bool covers(const struct dsec__box *b, uint8_t proto, unsigned a, unsigned p)
{
    uint8_t pt[16];
    memcpy(pt, b->lo, 16);
    pt[15] = (uint8_t)a;
    return b->proto == proto && dsec__addr_cmp(b->lo, pt, 16) <= 0 &&
           dsec__addr_cmp(pt, b->hi, 16) <= 0 && b->plo <= p && p <= b->phi;
}

/* life for comparison: 0 (permanent) outlives everything */
static uint64_t life(uint64_t exp_ms)
{
    return exp_ms == 0 ? UINT64_MAX : exp_ms;
}

static bool same_box(const struct dsec__box *a, const struct dsec__box *b)
{
    return a->proto == b->proto && a->plo == b->plo && a->phi == b->phi && a->exp_ms == b->exp_ms &&
           memcmp(a->lo, b->lo, 16) == 0 && memcmp(a->hi, b->hi, 16) == 0;
}

static void insert_matches_the_model(void **state)
{
    (void)state;
    srand(7);
    for (int round = 0; round < 200; round++) {
        struct dsec__boxv s = {0};
        struct dsec__boxv kernel = {0};     /* what the recorded operations would leave */
        uint64_t want[2][NA][NP] = {{{0}}}; /* longest life inserted at each point; 0: none */
        int inserts = 1 + rand() % 12;
        for (int k = 0; k < inserts; k++) {
            unsigned a1 = (unsigned)rand() % NA, a2 = (unsigned)rand() % NA;
            unsigned p1 = (unsigned)rand() % NP, p2 = (unsigned)rand() % NP;
            static const uint64_t lives[] = {0, 100, 200, 300};
            uint8_t proto = PROTOS[rand() % 2];
            struct dsec__box nb = mkbox(proto, a1 < a2 ? a1 : a2, a1 < a2 ? a2 : a1,
                                        p1 < p2 ? p1 : p2, p1 < p2 ? p2 : p1, lives[rand() % 4]);
            struct dsec__opv ops = {0};
            dsec__box_insert(&s, &nb, &ops, 0);
            assert_false(s.oom);
            assert_false(ops.oom);
            for (unsigned a = 0; a < NA; a++)
                for (unsigned p = 0; p < NP; p++)
                    if (covers(&nb, proto, a, p) && life(nb.exp_ms) > want[proto == 17][a][p])
                        want[proto == 17][a][p] = life(nb.exp_ms);
            /* replay: a delete names a box the kernel holds, an add overlaps nothing held */
            for (size_t i = 0; i < ops.n; i++) {
                const struct dsec__box *b = &ops.v[i].b;
                if (ops.v[i].del) {
                    size_t j = 0;
                    while (j < kernel.n && !same_box(&kernel.v[j], b))
                        j++;
                    assert_true(j < kernel.n);
                    kernel.v[j] = kernel.v[--kernel.n];
                } else {
                    for (size_t j = 0; j < kernel.n; j++)
                        assert_false(dsec__box_overlap(&kernel.v[j], b));
                    dsec__boxv_push(&kernel, b);
                }
            }
            dsec_free(ops.v);
            /* the set: disjoint, and each point held by the longest-lived entry covering it */
            for (size_t i = 0; i < s.n; i++)
                for (size_t j = i + 1; j < s.n; j++)
                    assert_false(dsec__box_overlap(&s.v[i], &s.v[j]));
            for (int pi = 0; pi < 2; pi++)
                for (unsigned a = 0; a < NA; a++)
                    for (unsigned p = 0; p < NP; p++) {
                        uint64_t got = 0;
                        for (size_t i = 0; i < s.n; i++)
                            if (covers(&s.v[i], PROTOS[pi], a, p))
                                got = life(s.v[i].exp_ms);
                        if (got != want[pi][a][p])
                            fail_msg("round %d insert %d: proto %u 10.0.0.%u port %u held for "
                                     "%llu, the entries give %llu",
                                     round, k, PROTOS[pi], a, p, (unsigned long long)got,
                                     (unsigned long long)want[pi][a][p]);
                    }
            /* and the kernel's set after the operations is the same set */
            assert_int_equal(kernel.n, s.n);
            for (size_t i = 0; i < s.n; i++) {
                bool found = false;
                for (size_t j = 0; j < kernel.n && !found; j++)
                    found = same_box(&s.v[i], &kernel.v[j]);
                assert_true(found);
            }
        }
        dsec_free(s.v);
        dsec_free(kernel.v);
    }
}

/* An entry that has expired by now is not cut into pieces and re-added when a new one
 * overlaps it: it goes. */
static void expired_entries_are_not_re_added(void **state)
{
    (void)state;
    struct dsec__boxv s = {0};
    struct dsec__opv ops = {0};
    struct dsec__box old = mkbox(6, 0, 15, 0, 15, 100);
    dsec__box_insert(&s, &old, &ops, 0);
    ops.n = 0;
    struct dsec__box nb = mkbox(6, 4, 7, 0, 15, 0);
    dsec__box_insert(&s, &nb, &ops, 100);
    assert_int_equal(s.n, 1);
    assert_true(same_box(&s.v[0], &nb));
    assert_int_equal(ops.n, 2); /* the old one deleted, the new one added */
    assert_true(ops.v[0].del);
    assert_false(ops.v[1].del);
    dsec_free(s.v);
    dsec_free(ops.v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cidrs_and_ranges),
        cmocka_unit_test(insert_matches_the_model),
        cmocka_unit_test(expired_entries_are_not_re_added),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
