/* The lightning indexer's kernels (k_indexer.cu) on synthetic device buffers, without a model (issue 18):
 *   - the selection (cu_index_topk) on adversarial scores against the rule written here on the host (the K best
 *     rows by score descending, ties to the lower row, in row order; every row when n <= K): all scores equal,
 *     a few distinct values (many ties at the threshold), negative scores, +0 and -0 mixed (equal), infinities,
 *     n = K + 1, n = K, scores that agree in their top 16 or 24 bits (all four radix passes), fp32 and bf16 scores,
 *     and several queries of different lengths in one launch with a row stride larger than n;
 *   - OFFICIAL scores on int8 tensor cores (cu_index_select with cu_index_ws.mma, heads as the MMA's N, and with .tiles,
 *     queries as N; each case runs both kernels): every score of every query equal,
 *     memcmp, to the order k_indexer.cu states, computed here in C from the codes (fp8 rows: their E2M1 codes and
 *     UE8M0 scales; bf16 / f32 rows and the query: the unit 2^(floor(log2 amax) - 5) of each block of 32), for the
 *     three KV formats, 64 x 128 (the model's shape) and odd shapes (4 heads, 12 heads: a partial head tile; 64 and
 *     256 columns); a query alone = in a batch of two sequences (memcmp); the selection of those scores = the rule;
 *     the fp32 scores (the same call without cu_index_mma) within bf16 rounding of them (and mostly equal); a
 *     prefill chunk of 42 queries (more than a scoring block takes, two of another sequence among them) = the
 *     stated order; a query or a row block off the FP4 grid raises its bit of the off-grid word; and the timings of a
 *     decode query at 1M tokens and of a 512-query prefill launch at 128K (both kernels, their scores equal).
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
#include "state/kvrows.h"

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
static int cu_fill_dev(void *d, int byte, size_t n) { memset(d, byte, n); return 0; }
static unsigned *flag_new(void) { unsigned *f = calloc(1, sizeof *f); assert_non_null(f); return f; }
static void flag_free(unsigned *f) { free(f); }
/* the kernel k_index_topk replaced (tools/gpu/shim/shim_indexer.sh extracts it from git) */
void shim_old_index_topk(const int64_t *pos, int t0, int T, int K, int64_t max_rows, const float *scratch, int32_t *sel,
                         int32_t *n_sel);
#define BIG_N 40000
#define SCORE_ROWS 700
#define TIMING_ROWS 6000   /* the shim: a check of the code path, not a time */
#define TIMING_REPS 1
#define CHUNK_ROWS 700
#define CHUNK_QUERIES 70
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
static int cu_fill_dev(void *d, int byte, size_t n) { return cu_fill_bytes(d, byte, n); }
/* the off-grid word: pinned host memory the device writes (as the step's) */
static unsigned *flag_new(void) { unsigned *f = cu_malloc_mapped(sizeof *f); assert_non_null(f); *f = 0; return f; }
static void flag_free(unsigned *f) { cu_free_host(f); }
#define BIG_N 1100000
#define SCORE_ROWS 20000
#define TIMING_ROWS 262144   /* a 1M-token context */
#define TIMING_REPS 20
#define CHUNK_ROWS 32768      /* a prefill chunk at 128K tokens */
#define CHUNK_QUERIES CU_INDEX_CHUNK
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
    int64_t n_rows = 0;
    for (int i = 0; i < T; i++)
        if (qs[i].n > n_rows) n_rows = qs[i].n;
    /* both ways: one block a query, then (at most CU_INDEX_SPLIT_T queries) spread over blocks of rows */
    int32_t *split_sel = malloc(sizeof(int32_t) * (size_t)T * K), *split_n = malloc(sizeof(int32_t) * (size_t)T);
    const int64_t words = cu_index_split_words(max_rows);
    unsigned *d_split = dev_put(NULL, sizeof(unsigned) * (size_t)words);
    assert_true(split_sel && split_n && T <= CU_INDEX_SPLIT_T);
    cu_index_topk(NULL, d_pos, 0, T, K, n_rows, max_rows, d_sc, NULL, 0, d_sel, d_n_sel);
    dev_sync();
    dev_get(sel, d_sel, sizeof(int32_t) * (size_t)T * K);
    dev_get(n_sel, d_n_sel, sizeof(int32_t) * (size_t)T);
    assert_int_equal(cu_fill_dev(d_sel, 0xff, sizeof(int32_t) * (size_t)T * K), 0);
    cu_index_topk(NULL, d_pos, 0, T, K, n_rows, max_rows, d_sc, d_split, words, d_sel, d_n_sel);
    dev_sync();
    dev_get(split_sel, d_sel, sizeof(int32_t) * (size_t)T * K);
    dev_get(split_n, d_n_sel, sizeof(int32_t) * (size_t)T);
#ifdef IDX_TEST_SHIM
    int32_t *old = calloc((size_t)T * K, sizeof(int32_t)), *old_n = calloc((size_t)T, sizeof(int32_t));
    assert_true(old && old_n);
    shim_old_index_topk(pos, 0, T, K, max_rows, sc, old, old_n);
#endif
    for (int i = 0; i < T; i++) {
        const int nw = host_select(sc + i * max_rows, qs[i].n, K, want);
        if (n_sel[i] != nw) fail_msg("top-%d of %lld %s scores: n_sel %d, want %d", K, (long long)qs[i].n, kind_name[qs[i].kind], n_sel[i], nw);
        if (split_n[i] != nw || memcmp(split_sel + (int64_t)i * K, want, sizeof(int32_t) * (size_t)nw))
            fail_msg("top-%d of %lld %s scores: the selection spread over blocks differs from the rule", K, (long long)qs[i].n,
                     kind_name[qs[i].kind]);
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
        printf("  top-%-4d of %8lld rows, %-20s: one block = over blocks = the rule%s\n", K, (long long)qs[i].n, kind_name[qs[i].kind],
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
    dev_free(d_sc); dev_free(d_pos); dev_free(d_sel); dev_free(d_n_sel); dev_free(d_split);
    free(sc); free(pos); free(sel); free(want); free(n_sel); free(split_sel); free(split_n);
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

/* ---- OFFICIAL scores on int8 tensor cores ------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int fmt, nI, cI;
} score_case;

/* The stated order's codes of one block of 32 values: u = 2^(floor(log2 amax) - 5) (1 for zeros), codes x / u. */
static float host_block_codes(const float *x, int8_t *c) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    if (amax == 0) {
        memset(c, 0, 32);
        return 1.0f;
    }
    int ex;
    (void)frexpf(amax, &ex);                 /* amax = m 2^ex, m in [1/2, 1): floor(log2 amax) = ex - 1 */
    const float u = ldexpf(1.0f, ex - 6);
    for (int i = 0; i < 32; i++) {
        const float v = x[i] / u;
        if (v != rintf(v) || fabsf(v) > 127) fail_msg("test data off the FP4 grid: %g in a block of amax %g", x[i], amax);
        c[i] = (int8_t)v;
    }
    return u;
}

/* A stored indexer row's codes and units: fp8 from its bytes (2 e2m1(code), 0.5 e8m0(scale)), else from its values. */
static void host_row_codes(const kv_layout *kl, const uint8_t *row, int8_t *c, float *u) {
    const int cI = kl->width;
    if (kl->fmt == DSV4_KV_FP8) {
        for (int j = 0; j < cI; j++) {
            const uint8_t b = row[j / 2];
            c[j] = (int8_t)(2.0f * e2m1_to_f32((uint8_t)(j & 1 ? b >> 4 : b & 15)));
        }
        for (int b = 0; b < cI / 32; b++) u[b] = 0.5f * e8m0_to_f32(row[(cI + 1) / 2 + b]);
        return;
    }
    float x[512];
    kv_decode(kl, row, x);
    for (int b = 0; b < cI / 32; b++) u[b] = host_block_codes(x + 32 * b, c + 32 * b);
}

/* The score of k_indexer.cu's stated order. */
static float host_score(const int8_t *qc, const float *qu, const float *w, const int8_t *kc, const float *ku, int nI, int cI) {
    float acc = 0.0f;
    for (int h = 0; h < nI; h++) {
        float dot = 0.0f;
        for (int b = 0; b < cI / 32; b++) {
            int32_t S = 0;
            for (int j = 32 * b; j < 32 * b + 32; j++) S += (int32_t)qc[h * cI + j] * (int32_t)kc[j];
            dot = fmaf((float)S, qu[h * (cI / 32) + b] * ku[b], dot);
        }
        const float sh = round_bf16(dot);
        if (sh > 0.0f) acc += round_bf16(sh * w[h]);
    }
    return round_bf16(acc);
}

/* A query's FP4-grid values and bf16 head weights (both signs), the same numbers whenever asked for. */
static void query_of(const score_case *c, int seq, int64_t p, float *qi, float *w) {
    dsv4_rng r;
    dsv4_rng_seed(&r, (uint64_t)p * 7919 + (uint64_t)seq * 104729 + 5);
    for (int h = 0; h < c->nI; h++) {
        const float scale = 0.25f + 0.25f * (float)(h % 5);
        for (int j = 0; j < c->cI; j++) qi[h * c->cI + j] = scale * (urand(&r) + 0.15f);
        if (h % 3 == 1 && c->cI >= 128)
            for (int j = 64; j < 96; j++) qi[h * c->cI + j] = ldexpf(qi[h * c->cI + j], -12);
        act_quant_fp4_inplace(qi + h * c->cI, c->cI, 32);
        w[h] = round_bf16(0.3f * urand(&r) + 0.05f);
    }
}

typedef struct {
    int64_t n_rows;
    uint8_t *rows, *d_rows;   /* host, device */
} seqrows;

static void seq_rows(const score_case *c, const kv_layout *kl, int seq, int64_t n, int off_grid, seqrows *s) {
    dsv4_rng r;
    dsv4_rng_seed(&r, 31337 + (uint64_t)seq);
    s->n_rows = n;
    s->rows = malloc((size_t)(n * (int64_t)kl->bytes));
    assert_non_null(s->rows);
    float x[512], mu[512];
    for (int j = 0; j < c->cI; j++) mu[j] = 0.4f * urand(&r);
    for (int64_t k = 0; k < n; k++) {
        /* some rows with subnormal values (units below 2^-126, amax itself subnormal) and all-zero rows too */
        const float amp = k % 97 == 5 ? 1e-37f : k % 101 == 9 ? 3e-39f : k % 89 == 7 ? 0.0f : 1.0f;
        for (int j = 0; j < c->cI; j++) x[j] = amp * (mu[j] + urand(&r));
        if (k % 7 == 3 && c->cI >= 64)   /* blocks of very different scales: the fp32 path's sums round */
            for (int j = 32; j < 64; j++) x[j] = ldexpf(x[j], -20);
        if (!off_grid || k != n / 2) act_quant_fp4_inplace(x, c->cI, 32);
        kv_encode(kl, x, s->rows + k * (int64_t)kl->bytes);
    }
    s->d_rows = dev_put(s->rows, (size_t)(n * (int64_t)kl->bytes));
}

typedef struct {
    int seq;
    int64_t p;
} qspec;

/* Scores [T][max_rows] of the queries (sequence, position) with (mma: 1 heads as the MMA's N, 2 queries in tiles) or
 * without (0) the tensor cores; sel / n_sel of top-K. Returns the off-grid word. */
static unsigned score_step(const score_case *c, const kv_layout *kl, const seqrows *seqs, int n_seqs, const qspec *qs, int T, int K,
                           int mma, int off_grid_q, int64_t max_rows, float *scores, int32_t *sel, int32_t *n_sel) {
    const int nI = c->nI, cI = c->cI;
    float *qi = malloc(sizeof(float) * (size_t)T * nI * cI), *wi = malloc(sizeof(float) * (size_t)T * nI);
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)T);
    int32_t *item_of = malloc(sizeof(int32_t) * (size_t)T);
    cu_seq_layer *sl = calloc((size_t)n_seqs, sizeof(cu_seq_layer));
    assert_true(qi && wi && pos && item_of && sl);
    int64_t n_rows = 0;
    for (int t = 0; t < T; t++) {
        query_of(c, qs[t].seq, qs[t].p, qi + (int64_t)t * nI * cI, wi + (int64_t)t * nI);
        if (off_grid_q && t == T - 1) qi[(int64_t)t * nI * cI + 3] = 0.1f;   /* 0.1f is a multiple of 2^-27 only */
        pos[t] = qs[t].p;
        item_of[t] = qs[t].seq;
        const int64_t n = (qs[t].p + 1) / 4;
        assert_true(n <= seqs[qs[t].seq].n_rows && n <= max_rows);
        if (n > n_rows) n_rows = n;
    }
    for (int i = 0; i < n_seqs; i++) sl[i].irows = seqs[i].d_rows;
    float *d_qi = dev_put(qi, sizeof(float) * (size_t)T * nI * cI), *d_wi = dev_put(wi, sizeof(float) * (size_t)T * nI);
    int64_t *d_pos = dev_put(pos, sizeof(int64_t) * (size_t)T);
    int32_t *d_item_of = dev_put(item_of, sizeof(int32_t) * (size_t)T);
    cu_seq_layer *d_sl = dev_put(sl, sizeof(cu_seq_layer) * (size_t)n_seqs);
    const size_t sc_bytes = sizeof(float) * (size_t)(T * max_rows);
    float *d_sc = dev_put(NULL, sc_bytes);
    int32_t *d_sel = dev_put(NULL, sizeof(int32_t) * (size_t)T * K), *d_n_sel = dev_put(NULL, sizeof(int32_t) * (size_t)T);
    int8_t *d_qc = dev_put(NULL, (size_t)T * nI * cI);
    float *d_qu = dev_put(NULL, sizeof(float) * (size_t)T * nI * (cI / 32));
    unsigned *flag = flag_new();
    const cu_index_ws iw = { mma != 0, d_qc, d_qu, flag, NULL, 0, mma == 2 };
    const cu_kvlay lay = { kl->fmt, kl->kind, kl->width, kl->rope, kl->nope, (int)kl->bytes };
    if (cu_index_select(NULL, 1, iw, lay, d_qi, d_wi, d_pos, d_item_of, d_sl, T, nI, cI, K, n_rows, max_rows, d_sc, d_sel, d_n_sel))
        fail_msg("%s: cu_index_select refused", c->name);
    dev_sync();
    const unsigned off = *flag;
    dev_get(scores, d_sc, sc_bytes);
    if (sel) dev_get(sel, d_sel, sizeof(int32_t) * (size_t)T * K);
    if (n_sel) dev_get(n_sel, d_n_sel, sizeof(int32_t) * (size_t)T);
    flag_free(flag);
    dev_free(d_qi); dev_free(d_wi); dev_free(d_pos); dev_free(d_item_of); dev_free(d_sl); dev_free(d_sc); dev_free(d_sel);
    dev_free(d_n_sel); dev_free(d_qc); dev_free(d_qu);
    free(qi); free(wi); free(pos); free(item_of); free(sl);
    return off;
}

/* The stated order's scores of query q over the rows it sees into ref, with its codes and units in qc / qu (qi, w:
 * scratch for the query); returns how many rows it sees. */
static int64_t stated_scores(const score_case *c, const kv_layout *kl, const seqrows *seqs, qspec q, int8_t *qc, float *qu,
                             float *qi, float *w, float *ref) {
    const int nI = c->nI, cI = c->cI, NB = cI / 32;
    const int64_t n = (q.p + 1) / 4;
    int8_t kc[512];
    float ku[8];
    query_of(c, q.seq, q.p, qi, w);
    for (int h = 0; h < nI; h++)
        for (int b = 0; b < NB; b++) qu[h * NB + b] = host_block_codes(qi + h * cI + 32 * b, qc + h * cI + 32 * b);
    for (int64_t k = 0; k < n; k++) {
        host_row_codes(kl, seqs[q.seq].rows + k * (int64_t)kl->bytes, kc, ku);
        ref[k] = host_score(qc, qu, w, kc, ku, nI, cI);
    }
    return n;
}

/* The GPU's n scores g of query t = ref by memcmp, and its selection (sel, n_sel) = the rule on them. */
static void expect_stated(const char *name, int t, const float *g, const float *ref, int64_t n, const int32_t *sel, int32_t n_sel,
                          int K) {
    int32_t want[512];
    assert_true(K <= 512);
    for (int64_t k = 0; k < n; k++)
        if (memcmp(&g[k], &ref[k], sizeof(float)))
            fail_msg("%s: query %d, row %lld: score %.9g, the stated order gives %.9g", name, t, (long long)k, g[k], ref[k]);
    const int nw = host_select(ref, n, K, want);
    if (n_sel != nw || memcmp(sel, want, sizeof(int32_t) * (size_t)nw))
        fail_msg("%s: query %d: the selection differs from the rule on the stated scores", name, t);
}

static void run_scores(const score_case *c) {
    const int nI = c->nI, cI = c->cI, NB = cI / 32, K = 64;
    kv_layout kl;
    kv_layout_init(&kl, c->fmt, KV_ROW_INDEX, cI, 0);
    seqrows seqs[2];
    seq_rows(c, &kl, 0, SCORE_ROWS, 0, &seqs[0]);
    seq_rows(c, &kl, 1, SCORE_ROWS / 7, 0, &seqs[1]);
    /* a batch: three queries of the long sequence (the last sees every row), two of the short one */
    const int64_t PL = 4 * SCORE_ROWS - 1, PS = 4 * (SCORE_ROWS / 7) - 2;
    const qspec batch[5] = { { 1, PS - 9 }, { 0, PL - 4000 > 300 ? PL - 4000 : 301 }, { 1, PS }, { 0, PL - 5 }, { 0, PL } };
    const int T = 5;
    const int64_t max_rows = SCORE_ROWS + 5;
    float *sc = malloc(sizeof(float) * (size_t)(T * max_rows)), *alone = malloc(sizeof(float) * (size_t)max_rows);
    float *f32 = malloc(sizeof(float) * (size_t)(T * max_rows));
    int32_t *sel = malloc(sizeof(int32_t) * (size_t)T * K), *n_sel = malloc(sizeof(int32_t) * (size_t)T);
    int8_t *qc = malloc((size_t)nI * cI), kc[512];
    float *qi = malloc(sizeof(float) * (size_t)nI * cI), *w = malloc(sizeof(float) * (size_t)nI), *qu = malloc(sizeof(float) * (size_t)nI * NB);
    float *ref = malloc(sizeof(float) * (size_t)max_rows), ku[8];
    assert_true(sc && alone && f32 && sel && n_sel && qc && qi && w && qu && ref);
    const unsigned off = score_step(c, &kl, seqs, 2, batch, T, K, 1, 0, max_rows, sc, sel, n_sel);
    if (off) fail_msg("%s: FP4-grid data raised the off-grid word (%u)", c->name, off);
    /* the query tiles (their tiles hold both sequences: one pass each) */
    float *sct = malloc(sizeof(float) * (size_t)(T * max_rows));
    int32_t *selt = malloc(sizeof(int32_t) * (size_t)T * K), *n_selt = malloc(sizeof(int32_t) * (size_t)T);
    assert_true(sct && selt && n_selt);
    if (score_step(c, &kl, seqs, 2, batch, T, K, 2, 0, max_rows, sct, selt, n_selt))
        fail_msg("%s: FP4-grid data raised the off-grid word (query tiles)", c->name);
    const unsigned off32 = score_step(c, &kl, seqs, 2, batch, T, K, 0, 0, max_rows, f32, NULL, NULL);
    if (off32) fail_msg("%s: the fp32 path wrote the off-grid word", c->name);
    int64_t n_scores = 0, n_equal = 0, n_pos = 0, n_neg = 0;
    double worst = 0;
    for (int t = 0; t < T; t++) {
        const seqrows *s = &seqs[batch[t].seq];
        const int64_t n = stated_scores(c, &kl, seqs, batch[t], qc, qu, qi, w, ref);
        const float *g = sc + t * max_rows;
        expect_stated(c->name, t, g, ref, n, sel + (int64_t)t * K, n_sel[t], K);
        expect_stated(c->name, t, sct + t * max_rows, ref, n, selt + (int64_t)t * K, n_selt[t], K);
        /* the fp32 path: within bf16 rounding (a term bf16(s w) may move by its last bit, a head near zero may
         * switch the relu; 2^-6 of the sum of the terms' magnitudes covers both) */
        for (int64_t k = 0; k < n; k++) {
            const float a = f32[t * max_rows + k], b = g[k];
            double mag = fabs((double)b);
            host_row_codes(&kl, s->rows + k * (int64_t)kl.bytes, kc, ku);
            for (int h = 0; h < nI; h++) {
                double d = 0;
                for (int j = 0; j < cI; j++) d += fabs((double)qc[h * cI + j] * qu[h * NB + j / 32] * kc[j] * ku[j / 32]);
                mag += d * fabs((double)w[h]);
            }
            const double e = fabs((double)a - (double)b);
            if (!(e <= mag / 64)) fail_msg("%s: query %d row %lld: fp32 score %.9g, tensor-core score %.9g", c->name, t, (long long)k, a, b);
            if (mag > 0 && e / mag > worst) worst = e / mag;
            n_equal += !memcmp(&a, &b, sizeof a);
            n_pos += b > 0;
            n_neg += b < 0;
            n_scores++;
        }
    }
    /* batch invariance: the long sequence's last query alone (the other sequence's rows absent) */
    const qspec one = { 0, PL };
    score_step(c, &kl, seqs, 1, &one, 1, K, 1, 0, max_rows, alone, NULL, NULL);
    if (memcmp(alone, sc + 4 * max_rows, sizeof(float) * (size_t)((PL + 1) / 4)))
        fail_msg("%s: a query's scores differ alone and in a batch", c->name);
    score_step(c, &kl, seqs, 1, &one, 1, K, 2, 0, max_rows, alone, NULL, NULL);
    if (memcmp(alone, sc + 4 * max_rows, sizeof(float) * (size_t)((PL + 1) / 4)))
        fail_msg("%s: a query's scores differ alone in a query tile and in a batch", c->name);
    printf("  %-24s %6lld scores (%lld > 0, %lld < 0) = the stated order (memcmp; heads or query tiles as N), alone = in a batch, top-%d = the rule; "
           "fp32 path: %.2f%% equal, worst %.2g of the terms' magnitude\n", c->name, (long long)n_scores, (long long)n_pos,
           (long long)n_neg, K, 100.0 * (double)n_equal / (double)n_scores, worst);
    if (n_pos < n_scores / 4 || n_neg < n_scores / 20) fail_msg("%s: the test's scores are too one-sided to test much", c->name);
    free(sc); free(alone); free(f32); free(sel); free(n_sel); free(qc); free(qi); free(w); free(qu); free(ref);
    free(sct); free(selt); free(n_selt);
    for (int i = 0; i < 2; i++) { free(seqs[i].rows); dev_free(seqs[i].d_rows); }
}

/* A prefill chunk: 40 consecutive queries of one sequence (every third position, so their visible rows grow across
 * a 128-row block) with two queries of a second sequence among them: more queries than a scoring block takes, and
 * blocks whose queries change sequence and back. Every score = the stated order (memcmp), the selection = the rule. */
static void run_chunk(const score_case *c) {
    const int nI = c->nI, cI = c->cI, NB = cI / 32, K = 64, T = 42;
    kv_layout kl;
    kv_layout_init(&kl, c->fmt, KV_ROW_INDEX, cI, 0);
    seqrows seqs[2];
    seq_rows(c, &kl, 0, SCORE_ROWS, 0, &seqs[0]);
    seq_rows(c, &kl, 1, SCORE_ROWS / 7, 0, &seqs[1]);
    const int64_t PS = 4 * (SCORE_ROWS / 7) - 2;
    qspec batch[42];
    for (int t = 0, i = 0; t < T; t++) {
        if (t == 17 || t == 18) batch[t] = (qspec){ 1, PS - 18 + t };
        else batch[t] = (qspec){ 0, 479 + 3 * i++ };
    }
    const int64_t max_rows = SCORE_ROWS + 5;
    float *sc = malloc(sizeof(float) * (size_t)(T * max_rows)), *ref = malloc(sizeof(float) * (size_t)max_rows);
    int32_t *sel = malloc(sizeof(int32_t) * (size_t)T * K), *n_sel = malloc(sizeof(int32_t) * (size_t)T);
    int8_t *qc = malloc((size_t)nI * cI);
    float *qi = malloc(sizeof(float) * (size_t)nI * cI), *w = malloc(sizeof(float) * (size_t)nI), *qu = malloc(sizeof(float) * (size_t)nI * NB);
    assert_true(sc && ref && sel && n_sel && qc && qi && w && qu);
    int64_t n_scores = 0;
    for (int mma = 1; mma <= 2; mma++) {   /* heads as the MMA's N, then query tiles (the two tiles with sequence 1 in two passes) */
        if (score_step(c, &kl, seqs, 2, batch, T, K, mma, 0, max_rows, sc, sel, n_sel))
            fail_msg("%s: FP4-grid data raised the off-grid word", c->name);
        for (int t = 0; t < T; t++) {
            const int64_t n = stated_scores(c, &kl, seqs, batch[t], qc, qu, qi, w, ref);
            expect_stated(c->name, t, sc + t * max_rows, ref, n, sel + (int64_t)t * K, n_sel[t], K);
            n_scores += n;
        }
    }
    printf("  %-24s a chunk of %d queries (two of another sequence among them): %lld scores = the stated order (memcmp), "
           "heads and query tiles as the MMA's N\n", c->name, T, (long long)n_scores / 2);
    free(sc); free(ref); free(sel); free(n_sel); free(qc); free(qi); free(w); free(qu);
    for (int i = 0; i < 2; i++) { free(seqs[i].rows); dev_free(seqs[i].d_rows); }
}

static void scores_prefill_chunk(void **state) {
    (void)state;
    const score_case cs[] = {
        { "64 x 128, fp8 KV", DSV4_KV_FP8, 64, 128 },
        { "64 x 128, f32 KV", DSV4_KV_F32, 64, 128 },
        { "12 x 64, bf16 KV", DSV4_KV_BF16, 12, 64 },
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_chunk(&cs[i]);
}

static void scores_model_shape(void **state) {
    (void)state;
    const score_case cs[] = {
        { "64 x 128, fp8 KV", DSV4_KV_FP8, 64, 128 },
        { "64 x 128, bf16 KV", DSV4_KV_BF16, 64, 128 },
        { "64 x 128, f32 KV", DSV4_KV_F32, 64, 128 },
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_scores(&cs[i]);
}

static void scores_odd_shapes(void **state) {
    (void)state;
    const score_case cs[] = {
        { "4 x 128 (tiny), fp8 KV", DSV4_KV_FP8, 4, 128 },
        { "12 x 64, fp8 KV", DSV4_KV_FP8, 12, 64 },
        { "12 x 64, bf16 KV", DSV4_KV_BF16, 12, 64 },
        { "8 x 256, f32 KV", DSV4_KV_F32, 8, 256 },
        { "8 x 32, fp8 KV", DSV4_KV_FP8, 8, 32 },
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_scores(&cs[i]);
}

/* Data off the FP4 grid is flagged: a query value, then one f32 row. */
static void scores_off_grid(void **state) {
    (void)state;
    const score_case c = { "64 x 128, f32 KV", DSV4_KV_F32, 64, 128 };
    kv_layout kl;
    kv_layout_init(&kl, c.fmt, KV_ROW_INDEX, c.cI, 0);
    seqrows good, bad;
    seq_rows(&c, &kl, 0, 1000, 0, &good);
    seq_rows(&c, &kl, 0, 1000, 1, &bad);
    const qspec q = { 0, 3999 };
    float *sc = malloc(sizeof(float) * 1000);
    assert_non_null(sc);
    const unsigned a = score_step(&c, &kl, &good, 1, &q, 1, 64, 1, 0, 1000, sc, NULL, NULL);
    const unsigned b = score_step(&c, &kl, &good, 1, &q, 1, 64, 1, 1, 1000, sc, NULL, NULL);
    const unsigned d = score_step(&c, &kl, &bad, 1, &q, 1, 64, 1, 0, 1000, sc, NULL, NULL);
    const unsigned dt = score_step(&c, &kl, &bad, 1, &q, 1, 64, 2, 0, 1000, sc, NULL, NULL);
    printf("  off-grid word: FP4-grid data %u, a query value off the grid %u, a row off the grid %u (query tiles: %u)\n", a, b, d, dt);
    if (a != 0 || b != 1 || d != 2 || dt != 2) fail_msg("off-grid word %u / %u / %u / %u, want 0 / 1 / 2 / 2", a, b, d, dt);
    free(sc);
    free(good.rows); dev_free(good.d_rows); free(bad.rows); dev_free(bad.d_rows);
}

#include <time.h>
static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* One decode query after a 1M-token context (TIMING_ROWS = 262,144 fp8 indexer rows, the model's 64 x 128, top-512): the time of
 * cu_index_select with the tensor-core and the fp32 scores, and of the selection alone (printed: issue 18's
 * measurement log); the scores of sampled rows = the stated order, the selection = the rule on the GPU's scores. */
static void timing_one_query_1m(void **state) {
    (void)state;
    const score_case c = { "64 x 128, fp8 KV", DSV4_KV_FP8, 64, 128 };
    const int nI = 64, cI = 128, NB = 4, K = 512, REPS = TIMING_REPS;
    const int64_t n = TIMING_ROWS, p = 4 * n - 1;
    kv_layout kl;
    kv_layout_init(&kl, c.fmt, KV_ROW_INDEX, cI, 0);
    seqrows sr;
    seq_rows(&c, &kl, 0, n, 0, &sr);
    float *qi = malloc(sizeof(float) * nI * cI), *w = malloc(sizeof(float) * nI), *sc = malloc(sizeof(float) * (size_t)n);
    int32_t *sel = malloc(sizeof(int32_t) * K), *want = malloc(sizeof(int32_t) * K);
    assert_true(qi && w && sc && sel && want);
    query_of(&c, 0, p, qi, w);
    const int32_t zero = 0;
    cu_seq_layer sl;
    memset(&sl, 0, sizeof sl);
    sl.irows = sr.d_rows;
    float *d_qi = dev_put(qi, sizeof(float) * nI * cI), *d_w = dev_put(w, sizeof(float) * nI), *d_sc = dev_put(NULL, sizeof(float) * (size_t)n);
    int64_t *d_pos = dev_put(&p, sizeof p);
    int32_t *d_item = dev_put(&zero, sizeof zero), *d_sel = dev_put(NULL, sizeof(int32_t) * K), *d_n_sel = dev_put(NULL, sizeof(int32_t));
    cu_seq_layer *d_sl = dev_put(&sl, sizeof sl);
    int8_t *d_qc = dev_put(NULL, (size_t)nI * cI);
    float *d_qu = dev_put(NULL, sizeof(float) * nI * NB);
    unsigned *flag = flag_new();
    const cu_kvlay lay = { kl.fmt, kl.kind, kl.width, kl.rope, kl.nope, (int)kl.bytes };
    const int64_t words = cu_index_split_words(n);
    unsigned *d_split = dev_put(NULL, sizeof(unsigned) * (size_t)words);
    double us[4];
    for (int mode = 0; mode < 4; mode++) {   /* tensor cores, fp32 (both with the split selection), the selection alone:
                                                split, one block */
        const cu_index_ws iw = { mode == 0, d_qc, d_qu, flag, d_split, words };
        double t0 = 0;
        for (int r = 0; r < REPS + 3; r++) {
            if (r == 3) {
                dev_sync();
                t0 = now_us();
            }
            if (mode < 2) {
                if (cu_index_select(NULL, 1, iw, lay, d_qi, d_w, d_pos, d_item, d_sl, 1, nI, cI, K, n, n, d_sc, d_sel, d_n_sel))
                    fail_msg("cu_index_select refused");
            } else
                cu_index_topk(NULL, d_pos, 0, 1, K, n, n, d_sc, mode == 2 ? d_split : NULL, words, d_sel, d_n_sel);
        }
        dev_sync();
        us[mode] = (now_us() - t0) / REPS;
        if (mode == 0 || mode >= 2) {   /* the selections (each way) against the rule on the scores they read */
            dev_get(sc, d_sc, sizeof(float) * (size_t)n);
            dev_get(sel, d_sel, sizeof(int32_t) * K);
            int8_t qc[64 * 128], kc[128];
            float qu[64 * 4], ku[4];
            for (int h = 0; h < nI; h++)
                for (int b = 0; b < NB; b++) qu[h * NB + b] = host_block_codes(qi + h * cI + 32 * b, qc + h * cI + 32 * b);
            for (int64_t k = 0; mode == 0 && k < n; k += 257) {   /* and the tensor-core scores of sampled rows */
                host_row_codes(&kl, sr.rows + k * (int64_t)kl.bytes, kc, ku);
                const float ref = host_score(qc, qu, w, kc, ku, nI, cI);
                if (memcmp(&ref, &sc[k], sizeof ref)) fail_msg("1M: row %lld: score %.9g, the stated order gives %.9g", (long long)k, sc[k], ref);
            }
            host_select(sc, n, K, want);
            if (memcmp(sel, want, sizeof(int32_t) * K)) fail_msg("1M: the selection (%s) differs from the rule on the GPU's scores",
                                                                 mode == 3 ? "one block" : "over blocks");
            if (*flag) fail_msg("1M: FP4-grid data raised the off-grid word");
        }
    }
    printf("  one query over %lld fp8 indexer rows (64 x 128, top-%d): %.1f us with tensor-core scores, %.1f us with fp32 "
           "scores, of which the selection %.1f us (%.1f us in one block) (mean of %d)\n", (long long)n, K, us[0], us[1], us[2],
           us[3], REPS);
    flag_free(flag);
    dev_free(d_qi); dev_free(d_w); dev_free(d_sc); dev_free(d_pos); dev_free(d_item); dev_free(d_sel); dev_free(d_n_sel);
    dev_free(d_sl); dev_free(d_qc); dev_free(d_qu); dev_free(d_split);
    free(qi); free(w); free(sc); free(sel); free(want); free(sr.rows); dev_free(sr.d_rows);
}

/* A prefill launch at a 128K-token prompt: CHUNK_QUERIES consecutive queries of one sequence whose last sees CHUNK_ROWS
 * fp8 indexer rows (the model's 64 x 128, top-512): cu_index_select's time with heads and with query tiles as the
 * MMA's N (printed: issue 18's measurement log), both with the same selection; every score of both kernels equal
 * (memcmp), sampled rows of a few queries = the stated order, the selections = the rule. */
static void timing_prefill_chunk(void **state) {
    (void)state;
    const score_case c = { "64 x 128, fp8 KV", DSV4_KV_FP8, 64, 128 };
    const int nI = 64, cI = 128, NB = 4, K = 512, T = CHUNK_QUERIES, REPS = TIMING_REPS / 2 > 0 ? TIMING_REPS / 2 : 1;
    const int64_t n = CHUNK_ROWS, P = 4 * n - 1;
    kv_layout kl;
    kv_layout_init(&kl, c.fmt, KV_ROW_INDEX, cI, 0);
    seqrows sr;
    seq_rows(&c, &kl, 0, n, 0, &sr);
    float *qi = malloc(sizeof(float) * (size_t)T * nI * cI), *w = malloc(sizeof(float) * (size_t)T * nI);
    int64_t *pos = malloc(sizeof(int64_t) * (size_t)T);
    int32_t *item = calloc((size_t)T, sizeof(int32_t));
    float *sc[2] = { malloc(sizeof(float) * (size_t)T * n), malloc(sizeof(float) * (size_t)T * n) };
    int32_t *sel[2] = { malloc(sizeof(int32_t) * (size_t)T * K), malloc(sizeof(int32_t) * (size_t)T * K) };
    int32_t *want = malloc(sizeof(int32_t) * K);
    assert_true(qi && w && pos && item && sc[0] && sc[1] && sel[0] && sel[1] && want);
    for (int t = 0; t < T; t++) {
        pos[t] = P - (T - 1) + t;
        query_of(&c, 0, pos[t], qi + (int64_t)t * nI * cI, w + (int64_t)t * nI);
    }
    cu_seq_layer sl;
    memset(&sl, 0, sizeof sl);
    sl.irows = sr.d_rows;
    float *d_qi = dev_put(qi, sizeof(float) * (size_t)T * nI * cI), *d_w = dev_put(w, sizeof(float) * (size_t)T * nI);
    float *d_sc = dev_put(NULL, sizeof(float) * (size_t)T * n);
    int64_t *d_pos = dev_put(pos, sizeof(int64_t) * (size_t)T);
    int32_t *d_item = dev_put(item, sizeof(int32_t) * (size_t)T), *d_sel = dev_put(NULL, sizeof(int32_t) * (size_t)T * K);
    int32_t *d_n_sel = dev_put(NULL, sizeof(int32_t) * (size_t)T);
    cu_seq_layer *d_sl = dev_put(&sl, sizeof sl);
    int8_t *d_qc = dev_put(NULL, (size_t)T * nI * cI);
    float *d_qu = dev_put(NULL, sizeof(float) * (size_t)T * nI * NB);
    unsigned *flag = flag_new();
    const cu_kvlay lay = { kl.fmt, kl.kind, kl.width, kl.rope, kl.nope, (int)kl.bytes };
    double us[3];
    for (int mode = 0; mode < 3; mode++) {   /* heads as N, query tiles, the selection alone */
        const cu_index_ws iw = { 1, d_qc, d_qu, flag, NULL, 0, mode == 1 };
        double t0 = 0;
        for (int r = 0; r < REPS + 2; r++) {
            if (r == 2) {
                dev_sync();
                t0 = now_us();
            }
            if (mode < 2) {
                if (cu_index_select(NULL, 1, iw, lay, d_qi, d_w, d_pos, d_item, d_sl, T, nI, cI, K, n, n, d_sc, d_sel, d_n_sel))
                    fail_msg("cu_index_select refused");
            } else
                cu_index_topk(NULL, d_pos, 0, T, K, n, n, d_sc, NULL, 0, d_sel, d_n_sel);
        }
        dev_sync();
        us[mode] = (now_us() - t0) / REPS;
        if (mode < 2) {
            dev_get(sc[mode], d_sc, sizeof(float) * (size_t)T * n);
            dev_get(sel[mode], d_sel, sizeof(int32_t) * (size_t)T * K);
        }
        if (*flag) fail_msg("chunk: FP4-grid data raised the off-grid word");
    }
    int64_t pairs = 0;
    for (int t = 0; t < T; t++) {
        const int64_t nt = (pos[t] + 1) / 4;
        pairs += nt;
        if (memcmp(sc[0] + (int64_t)t * n, sc[1] + (int64_t)t * n, sizeof(float) * (size_t)nt))
            fail_msg("chunk: query %d: the query tiles' scores differ from the heads'", t);
        if (memcmp(sel[0] + (int64_t)t * K, sel[1] + (int64_t)t * K, sizeof(int32_t) * K))
            fail_msg("chunk: query %d: the selections differ", t);
    }
    int8_t qc[64 * 128], kc[128];
    float qu[64 * 4], ku[4];
    for (int t = 0; t < T; t += T / 4 > 0 ? T / 4 : 1) {   /* sampled rows of a few queries: the stated order; the rule */
        const float *qt = qi + (int64_t)t * nI * cI, *wt = w + (int64_t)t * nI;
        const int64_t nt = (pos[t] + 1) / 4;
        for (int h = 0; h < nI; h++)
            for (int b = 0; b < NB; b++) qu[h * NB + b] = host_block_codes(qt + h * cI + 32 * b, qc + h * cI + 32 * b);
        for (int64_t k = t % 13; k < nt; k += 97) {
            host_row_codes(&kl, sr.rows + k * (int64_t)kl.bytes, kc, ku);
            const float ref = host_score(qc, qu, wt, kc, ku, nI, cI), got = sc[1][(int64_t)t * n + k];
            if (memcmp(&ref, &got, sizeof ref)) fail_msg("chunk: query %d row %lld: score %.9g, the stated order gives %.9g", t,
                                                         (long long)k, got, ref);
        }
        host_select(sc[1] + (int64_t)t * n, nt, K, want);
        if (memcmp(sel[1] + (int64_t)t * K, want, sizeof(int32_t) * K)) fail_msg("chunk: query %d: the selection differs from the rule", t);
    }
    printf("  a prefill launch of %d queries over up to %lld fp8 indexer rows (64 x 128, top-%d; %.3g query-row pairs): "
           "%.1f us with heads as the MMA's N, %.1f us with query tiles, of which the selection %.1f us; the scores equal "
           "(memcmp) (mean of %d)\n", T, (long long)n, K, (double)pairs, us[0], us[1], us[2], REPS);
    flag_free(flag);
    dev_free(d_qi); dev_free(d_w); dev_free(d_sc); dev_free(d_pos); dev_free(d_item); dev_free(d_sel); dev_free(d_n_sel);
    dev_free(d_sl); dev_free(d_qc); dev_free(d_qu);
    free(qi); free(w); free(pos); free(item); free(sc[0]); free(sc[1]); free(sel[0]); free(sel[1]); free(want); free(sr.rows);
    dev_free(sr.d_rows);
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
        cmocka_unit_test(scores_model_shape),
        cmocka_unit_test(scores_odd_shapes),
        cmocka_unit_test(scores_prefill_chunk),
        cmocka_unit_test(scores_off_grid),
        cmocka_unit_test(timing_one_query_1m),
        cmocka_unit_test(timing_prefill_chunk),
    };
    if (getenv("IDX_TEST_ONLY")) cmocka_set_test_filter(getenv("IDX_TEST_ONLY"));   /* e.g. "timing_*" (ncu, benchmarks) */
    return cmocka_run_group_tests_name("gpu lightning indexer", tests, NULL, NULL);
}
