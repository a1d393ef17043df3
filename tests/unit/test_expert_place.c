/* Expert parallelism's two promises that need no GPU (issue 16): the placement gives every expert of a layer to
 * exactly one rank in contiguous, even ranges; and the gather of the experts' output rows by a sum over ranks
 * (every rank but the owner holding EP_ABSENT_ROW) returns the owner's row bit for bit, whatever order the ranks
 * are added in — the property cuda_ep.c relies on to be identical to one GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>
#include "model/expert_place.h"

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static void placement_partitions_evenly(void **st) {
    (void)st;
    const int Es[] = { 1, 2, 7, 8, 64, 256, 257, 384 };
    for (size_t i = 0; i < sizeof Es / sizeof Es[0]; i++)
        for (int n = 1; n <= 16 && n <= Es[i]; n++) {
            const int E = Es[i];
            assert_int_equal(expert_first(E, n, 0), 0);
            assert_int_equal(expert_first(E, n, n), E);
            for (int r = 0; r < n; r++) {
                const int len = expert_first(E, n, r + 1) - expert_first(E, n, r);
                assert_true(len == E / n || len == E / n + 1);   /* even: sizes differ by at most one */
                if (r) assert_true(len <= expert_first(E, n, 1));  /* the longer ranges come first */
            }
            for (int e = 0; e < E; e++) {
                const int r = expert_owner(E, n, e);
                assert_true(r >= 0 && r < n);
                assert_true(expert_first(E, n, r) <= e && e < expert_first(E, n, r + 1));
            }
        }
    /* hand-worked: 10 experts over 4 ranks -> 3, 3, 2, 2 */
    assert_int_equal(expert_first(10, 4, 1), 3);
    assert_int_equal(expert_first(10, 4, 2), 6);
    assert_int_equal(expert_first(10, 4, 3), 8);
    assert_int_equal(expert_owner(10, 4, 5), 1);
    assert_int_equal(expert_owner(10, 4, 9), 3);
}

/* The values a row can hold, the awkward ones included. */
static float sample(int i) {
    static const uint32_t special[] = { 0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x7f800000u, 0xff800000u,
                                        0x7fc00000u, 0x7f7fffffu, 0xff7fffffu, 0x3f800000u, 0xbf800000u, 0x007fffffu };
    const int ns = (int)(sizeof special / sizeof special[0]);
    if (i < ns) return from_bits(special[i]);
    uint32_t x = (uint32_t)i * 2654435761u;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    return from_bits(x);
}

/* Sum the n ranks' values in the order given by perm (left to right), and as a pairwise tree. */
static float sum_in_order(const float *v, const int *perm, int n) {
    float s = v[perm[0]];
    for (int i = 1; i < n; i++) s += v[perm[i]];
    return s;
}
static float sum_tree(const float *v, int lo, int hi) {
    if (hi - lo == 1) return v[lo];
    const int mid = (lo + hi) / 2;
    return sum_tree(v, lo, mid) + sum_tree(v, mid, hi);
}

static void absent_rows_gather_exactly(void **st) {
    (void)st;
    for (int n = 2; n <= 8; n++)
        for (int i = 0; i < 2000; i++) {
            const float x = sample(i);
            for (int owner = 0; owner < n; owner++) {
                float v[8];
                for (int r = 0; r < n; r++) v[r] = r == owner ? x : EP_ABSENT_ROW;
                int fwd[8], rev[8], rot[8];
                for (int r = 0; r < n; r++) { fwd[r] = r; rev[r] = n - 1 - r; rot[r] = (r + i) % n; }
                const float got[4] = { sum_in_order(v, fwd, n), sum_in_order(v, rev, n), sum_in_order(v, rot, n), sum_tree(v, 0, n) };
                for (int k = 0; k < 4; k++) {
                    if (isnan(x)) assert_true(isnan(got[k]));
                    else assert_int_equal(bits(got[k]), bits(x));
                }
            }
        }
}

/* The identity is -0.0f and nothing else: +0.0f would turn a -0 row into +0 (so this test fails if the constant
 * changes). */
static void plus_zero_would_not_do(void **st) {
    (void)st;
    assert_int_equal(bits(EP_ABSENT_ROW), 0x80000000u);
    const float minus_zero = from_bits(0x80000000u), plus_zero = 0.0f;
    assert_int_equal(bits(minus_zero + plus_zero), 0x00000000u);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(placement_partitions_evenly),
        cmocka_unit_test(absent_rows_gather_exactly),
        cmocka_unit_test(plus_zero_would_not_do),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
