/* The lightning indexer's kernels (k_indexer.cu) on synthetic device buffers, without a model (issue 18):
 *   - the selection (cu_index_topk) on adversarial scores against the rule written here on the host (the K best
 *     rows by score descending, ties to the lower row, in row order; every row when n <= K): all scores equal,
 *     a few distinct values (many ties at the threshold), negative scores, +0 and -0 mixed (equal), infinities,
 *     n = K + 1, n = K, scores that agree in their top 16 or 24 bits (all four radix passes), fp32 and bf16 scores,
 *     and several queries of different lengths in one launch with a row stride larger than n;
 *
 * Without a GPU: tools/gpu/shim/shim_indexer.sh builds this file with -DIDX_TEST_SHIM against k_indexer.cu's own
 * source run on the CPU (tools/gpu/shim/cuda_shim.h), with smaller sizes, and compares the selections with the
 * kernel this one replaced as well (its source from git, the 64-bit key radix select). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cu_kernels.h"
#include "backend/cuda/cu_runtime.h"
#include "model/formats.h"
#include "model/tiny.h"

#ifdef IDX_TEST_SHIM
static void *dev_put(const void *h, size_t n) {
    void *d = calloc(1, n ? n : 1);
    assert_non_null(d);
    if (n && h) memcpy(d, h, n);
    return d;
}
static void dev_get(void *h, const void *d, size_t n) { memcpy(h, d, n); }
static void dev_free(void *d) { free(d); }
static void dev_sync(void) {}
/* the kernel k_index_topk replaced (tools/gpu/shim/shim_indexer.sh extracts it from git) */
void shim_old_index_topk(const int64_t *pos, int t0, int T, int K, int64_t max_rows, const float *scratch, int32_t *sel,
                         int32_t *n_sel);
#define BIG_N 40000
#else
static void *dev_put(const void *h, size_t n) {
    void *d = cu_malloc(n ? n : 1);
    assert_non_null(d);
    if (n && h) assert_int_equal(cu_upload(d, h, n), 0);
    return d;
}
static void dev_get(void *h, const void *d, size_t n) { assert_int_equal(cu_download(h, d, n), 0); }
static void dev_free(void *d) { cu_free(d); }
static void dev_sync(void) {
    dsv4_error err;
    if (cu_finish(NULL, "indexer", &err)) fail_msg("%s", err.msg);
}
#define BIG_N 1100000
#endif

static float urand(dsv4_rng *r) { return (float)(2.0 * dsv4_rng_uniform(r) - 1.0); }
static float f32_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- the selection ------------------------------------------------------------------------------------------------ */

static const float *cmp_scores;
/* a before b: higher score, or the same score (-0 == +0) and the lower row */
static int rank_cmp(const void *pa, const void *pb) {
    const int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    const float sa = cmp_scores[a], sb = cmp_scores[b];
    if (sa != sb) return sa > sb ? -1 : 1;
    return (a > b) - (a < b);
}
static int row_cmp(const void *pa, const void *pb) {
    const int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

/* The rule: sel[0 .. return) for scores s[0 .. n). */
static int host_select(const float *s, int64_t n, int K, int32_t *sel) {
    if (n <= K) {
        for (int64_t k = 0; k < n; k++) sel[k] = (int32_t)k;
        return (int)n;
    }
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)n);
    assert_non_null(idx);
    for (int64_t k = 0; k < n; k++) idx[k] = (int32_t)k;
    cmp_scores = s;
    qsort(idx, (size_t)n, sizeof(int32_t), rank_cmp);
    memcpy(sel, idx, sizeof(int32_t) * (size_t)K);
    qsort(sel, (size_t)K, sizeof(int32_t), row_cmp);
    free(idx);
    return K;
}

typedef enum { S_EQUAL, S_FEW, S_NEG_ZERO, S_BF16, S_F32, S_HIGH16, S_HIGH24, S_INF } score_kind;
static const char *kind_name[] = { "all equal", "8 distinct values", "negative, +0 and -0", "bf16", "fp32",
                                   "same top 16 bits", "same top 24 bits", "with infinities" };

static float make_score(score_kind kind, dsv4_rng *r, int64_t k) {
    switch (kind) {
    case S_EQUAL: return 0.375f;
    case S_FEW: return round_bf16(0.01f * (float)(int)(8 * dsv4_rng_uniform(r)));
    case S_NEG_ZERO: {
        const double u = dsv4_rng_uniform(r);
        return u < 0.3 ? 0.0f : u < 0.6 ? -0.0f : round_bf16(-(float)u);
    }
    case S_BF16: return round_bf16(urand(r) * 3.0f);
    case S_F32: return urand(r) * 3.0f;
    case S_HIGH16: return f32_of_bits(0x3f800000u | (uint32_t)(dsv4_rng_uniform(r) * 65536.0));
    case S_HIGH24: return f32_of_bits(0x3f800000u | (uint32_t)(dsv4_rng_uniform(r) * 256.0));
    case S_INF: {
        const double u = dsv4_rng_uniform(r);
        return u < 0.001 ? INFINITY : u < 0.002 ? -INFINITY : round_bf16(urand(r));
    }
    }
    (void)k;
    return 0;
}

typedef struct {
    score_kind kind;
    int64_t n;
} query_spec;

/* One launch over the queries (scores of query i at stride max_rows); every selection checked against the rule. */
static void run_topk(const query_spec *qs, int T, int K, uint64_t seed) {
    int64_t max_rows = 1;
    for (int i = 0; i < T; i++)
        if (qs[i].n + 3 > max_rows) max_rows = qs[i].n + 3;   /* a stride beyond n: rows past n are never read */
    float *sc = malloc(sizeof(float) * (size_t)(T * max_rows));
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)T);
    int32_t *sel = malloc(sizeof(int32_t) * (size_t)T * K), *want = malloc(sizeof(int32_t) * (size_t)K);
    int32_t *n_sel = malloc(sizeof(int32_t) * (size_t)T);
    assert_true(sc && pos && sel && want && n_sel);
    dsv4_rng r;
    dsv4_rng_seed(&r, seed);
    for (int i = 0; i < T; i++) {
        pos[i] = qs[i].n ? 4 * qs[i].n - 1 + (int64_t)(i % 4) : 0;   /* (pos + 1) / 4 = n */
        for (int64_t k = 0; k < max_rows; k++) sc[i * max_rows + k] = k < qs[i].n ? make_score(qs[i].kind, &r, k) : NAN;
    }
    float *d_sc = dev_put(sc, sizeof(float) * (size_t)(T * max_rows));
    int64_t *d_pos = dev_put(pos, sizeof(int64_t) * (size_t)T);
    int32_t *d_sel = dev_put(NULL, sizeof(int32_t) * (size_t)T * K), *d_n_sel = dev_put(NULL, sizeof(int32_t) * (size_t)T);
    cu_index_topk(NULL, d_pos, 0, T, K, max_rows, d_sc, d_sel, d_n_sel);
    dev_sync();
    dev_get(sel, d_sel, sizeof(int32_t) * (size_t)T * K);
    dev_get(n_sel, d_n_sel, sizeof(int32_t) * (size_t)T);
#ifdef IDX_TEST_SHIM
    int32_t *old = calloc((size_t)T * K, sizeof(int32_t)), *old_n = calloc((size_t)T, sizeof(int32_t));
    assert_true(old && old_n);
    shim_old_index_topk(pos, 0, T, K, max_rows, sc, old, old_n);
#endif
    for (int i = 0; i < T; i++) {
        const int nw = host_select(sc + i * max_rows, qs[i].n, K, want);
        if (n_sel[i] != nw) fail_msg("top-%d of %lld %s scores: n_sel %d, want %d", K, (long long)qs[i].n, kind_name[qs[i].kind], n_sel[i], nw);
        if (memcmp(sel + (int64_t)i * K, want, sizeof(int32_t) * (size_t)nw)) {
            int j = 0;
            while (sel[(int64_t)i * K + j] == want[j]) j++;
            fail_msg("top-%d of %lld %s scores: selection %d is row %d, want %d", K, (long long)qs[i].n, kind_name[qs[i].kind], j,
                     sel[(int64_t)i * K + j], want[j]);
        }
#ifdef IDX_TEST_SHIM
        if (old_n[i] != nw || memcmp(old + (int64_t)i * K, want, sizeof(int32_t) * (size_t)nw))
            fail_msg("top-%d of %lld %s scores: the old kernel differs from the rule", K, (long long)qs[i].n, kind_name[qs[i].kind]);
#endif
        printf("  top-%-4d of %8lld rows, %-20s: = the rule%s\n", K, (long long)qs[i].n, kind_name[qs[i].kind],
#ifdef IDX_TEST_SHIM
               " = the old kernel"
#else
               ""
#endif
        );
    }
#ifdef IDX_TEST_SHIM
    free(old); free(old_n);
#endif
    dev_free(d_sc); dev_free(d_pos); dev_free(d_sel); dev_free(d_n_sel);
    free(sc); free(pos); free(sel); free(want); free(n_sel);
}

static void topk_adversarial(void **state) {
    (void)state;
    const query_spec qs[] = {
        { S_EQUAL, 5000 }, { S_FEW, 20000 }, { S_NEG_ZERO, 3000 }, { S_BF16, 513 }, { S_BF16, 512 }, { S_F32, 513 },
        { S_HIGH16, 9000 }, { S_HIGH24, 9000 }, { S_INF, 4000 }, { S_F32, 17000 }, { S_BF16, 100 }, { S_FEW, 0 },
    };
    run_topk(qs, (int)(sizeof qs / sizeof qs[0]), 512, 11);
}

static void topk_small_k(void **state) {
    (void)state;
    const query_spec qs[] = { { S_FEW, 2 }, { S_FEW, 3 }, { S_NEG_ZERO, 70 }, { S_EQUAL, 40 }, { S_F32, 1000 } };
    run_topk(qs, 5, 1, 12);
    run_topk(qs, 5, 3, 13);
}

static void topk_long(void **state) {
    (void)state;
    const query_spec a[] = { { S_BF16, BIG_N } }, b[] = { { S_F32, BIG_N } }, c[] = { { S_FEW, BIG_N }, { S_EQUAL, BIG_N / 3 } };
    run_topk(a, 1, 512, 21);
    run_topk(b, 1, 512, 22);
    run_topk(c, 2, 512, 23);
}

int main(void) {
#ifndef IDX_TEST_SHIM
    dsv4_error why;
    if (!dsv4_cuda_available(&why)) {
        printf("gpu indexer: skipped, needs a GPU: %s\n", why.msg);
        return 0;
    }
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(topk_adversarial),
        cmocka_unit_test(topk_small_k),
        cmocka_unit_test(topk_long),
    };
    return cmocka_run_group_tests_name("gpu lightning indexer", tests, NULL, NULL);
}
