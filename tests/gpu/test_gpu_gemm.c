/* The large-T path of the tensor-core linear (backend/cuda/k_mma_gemm.cu, cu_mma_gemm.h), both its GEMMs (the
 * mma.sync block and the warpgroup ones, CU_GEMM_MMA / CU_GEMM_HGMMA / CU_GEMM_HGMMA4), against the small-tile
 * kernels of k_mma.cu, whose order they must keep: every output of cu_mma_gemm_linear is memcmp-equal to
 * cu_mma_linear's with the GEMM switched off (test_gpu_mma checks those against a reference in double), and nothing
 * else of the output buffer is written. Inputs are random bytes of the formats (every E4M3 code but NaN, every E2M1
 * code) with random power-of-two scales, so the values span a wide range and any change of the order of an fmaf or
 * an addition shows in the bits. Cases: T around and above the tile (127, 128, 129, 300), FP8 and FP4 weights, row
 * counts that are not multiples of the 128-row tile, K of 1, 2, 5, 8 chunks (fewer than four partials, partials of
 * unequal length), FP4 K ending in a partial chunk of 1 or 3 scale blocks, a weight view (row0 = 40: the FP8 scale
 * rows), out_bf16 on and off; and the routed experts' GEMM (cu_mma_gemm_experts) against cu_mma_expert_linear on a
 * plan whose experts have 150, 3, 20 (absent: another GPU's), 0, 140 and 9 pairs, inputs by token and by pair,
 * packed FP4 experts also with scales at and past the edges of the packed kernels' PLAIN range and E8M0 0 / 255.
 * Building k_mma_gemm.cu with -DDSV4_GEMM_BUG=1 (a fragment word swap, in both GEMMs) or =2 (the partials folded
 * in reverse order) must make it fail. Built with -DGEMM_TEST_SHIM (tools/gpu/shim/shim_gemm.sh) it runs on the CPU against the
 * kernels' source through the fiber shim; on the GPU it is one of the GPU suite's programs.
 * `test_gpu_gemm --bench` (GPU) times the three at the V4-Flash shapes for T = 256, 512, 2048 and 8192; `--bench-experts` the
 * routed experts' GEMM of an 8K prefill step beside one linear of the same FLOPs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cu_mma.h"
#include "backend/cuda/cu_mma_gemm.h"
#include "backend/cuda/cu_runtime.h"
#include "model/tiny.h"   /* dsv4_rng */
#include "model/weight.h"

#ifdef GEMM_TEST_SHIM
/* The device is the host (tools/gpu/shim/cuda_shim.h runs the kernels as fibers). */
void *cu_malloc(size_t n) { return aligned_alloc(256, (n + 255) / 256 * 256); }
void cu_free(void *p) { free(p); }
int cu_upload(void *d, const void *s, size_t n) { memcpy(d, s, n); return 0; }
int cu_download(void *d, const void *s, size_t n) { memcpy(d, s, n); return 0; }
int cu_finish(cu_stream st, const char *what, dsv4_error *err) { (void)st; (void)what; (void)err; return 0; }
#else
#include <cuda_runtime.h>
#endif

static dsv4_rng rng;

static uint8_t random_e4m3(void) {
    for (;;) {
        const uint8_t b = (uint8_t)dsv4_rng_below(&rng, 256);
        if ((b & 0x7f) != 0x7f) return b;   /* not NaN */
    }
}

static void *upload(const void *h, size_t n) {
    void *d = cu_malloc(n);
    assert_non_null(d);
    assert_int_equal(cu_upload(d, h, n), 0);
    return d;
}

/* A plan of P pairs and n_tiles tiles on the device (pair weights and token lists left out: the GEMM reads neither);
 * plan_free releases it. */
static cu_moe_plan plan_upload(const int32_t *pair_token, int P, const int32_t *te, const int32_t *tf, const int32_t *tc, int n_tiles) {
    cu_moe_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.pair_token = upload(pair_token, sizeof(int32_t) * P);
    plan.tile_expert = upload(te, sizeof(int32_t) * n_tiles);
    plan.tile_first = upload(tf, sizeof(int32_t) * n_tiles);
    plan.tile_count = upload(tc, sizeof(int32_t) * n_tiles);
    plan.n_tiles = upload(&n_tiles, sizeof n_tiles);
    return plan;
}
static void plan_free(cu_moe_plan *plan) {
    cu_free(plan->pair_token);
    cu_free(plan->tile_expert);
    cu_free(plan->tile_first);
    cu_free(plan->tile_count);
    cu_free(plan->n_tiles);
}

/* A device weight of N x K (fmt), random codes and scales 2^[-6, 6]; data and scale: what to free. */
typedef struct {
    dsv4_weight w;
    void *data, *scale;
} dweight;

static dweight make_weight(int fmt, int N, int K) {
    const int fp4 = fmt == WF_FP4;
    const size_t db = fp4 ? (size_t)N * K / 2 : (size_t)N * K;
    const int scols = fp4 ? K / 32 : K / 128;
    const size_t sb = fp4 ? (size_t)N * scols : (size_t)((N + 127) / 128) * scols;
    uint8_t *d = malloc(db), *s = malloc(sb);
    for (size_t i = 0; i < db; i++) d[i] = fp4 ? (uint8_t)dsv4_rng_below(&rng, 256) : random_e4m3();
    for (size_t i = 0; i < sb; i++) s[i] = (uint8_t)(121 + dsv4_rng_below(&rng, 13));
    dweight t;
    memset(&t, 0, sizeof t);
    t.data = upload(d, db);
    t.scale = upload(s, sb);
    free(d);
    free(s);
    t.w.fmt = fmt;
    t.w.rows = N;
    t.w.cols = K;
    t.w.data = t.data;
    t.w.scale = t.scale;
    t.w.scale_cols = scols;
    return t;
}

/* Rows [r0, N) of w as a view (row0 = r0, as the model's split weights are). */
static dsv4_weight view(const dsv4_weight *w, int r0) {
    dsv4_weight v = *w;
    const size_t row_bytes = w->fmt == WF_FP4 ? (size_t)w->cols / 2 : (size_t)w->cols;
    v.data = (const uint8_t *)w->data + (size_t)r0 * row_bytes;
    v.rows = w->rows - r0;
    v.row0 = w->row0 + r0;
    /* the scales stay: the kernels index them by row0 + row (FP8 by 128-row block, FP4 by row) */
    return v;
}

/* y through both paths, memcmp over the whole buffer (ldy = rows + 3: the columns past the rows stay as filled). */
static void same_bits(const dsv4_weight *w, int T, int out_bf16) {
    const int K = w->cols, N = w->rows, ldq = cu_mma_ld(K) + 16, lds = cu_mma_lds(K) + 1, ldy = N + 3;
    const size_t qb = (size_t)T * ldq, sn = (size_t)T * lds, yn = (size_t)T * ldy;
    uint8_t *q = malloc(qb);
    float *s = malloc(sizeof(float) * sn), *y0 = malloc(sizeof(float) * yn), *y1 = malloc(sizeof(float) * yn);
    for (size_t i = 0; i < qb; i++) q[i] = random_e4m3();
    for (size_t i = 0; i < sn; i++) s[i] = ldexpf(1.0f, -(int)dsv4_rng_below(&rng, 11));
    memset(y0, 0xab, sizeof(float) * yn);
    uint8_t *dq = upload(q, qb);
    float *ds = upload(s, sizeof(float) * sn), *dy0 = upload(y0, sizeof(float) * yn), *dy1 = upload(y0, sizeof(float) * yn);
    dsv4_error err;
    cu_mma_gemm_set(0, 0, 0);
    assert_int_equal(cu_mma_linear(NULL, w, dq, ldq, ds, lds, T, dy0, ldy, out_bf16, 0, &err), 0);
    assert_int_equal(cu_finish(NULL, "small tiles", &err), 0);
    assert_int_equal(cu_download(y0, dy0, sizeof(float) * yn), 0);
    size_t written = 0;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < N; r++) {
            const size_t i = (size_t)t * ldy + r;
            uint32_t u;
            memcpy(&u, &y0[i], 4);
            written += u != 0xabababab && isfinite(y0[i]) && y0[i] != 0.0f;
        }
    assert_true(written > (size_t)T * N * 9 / 10);   /* the outputs are real numbers, not an untouched buffer */
    for (int kind = CU_GEMM_MMA; kind <= CU_GEMM_HGMMA4; kind++) {   /* each GEMM against the small tiles */
        memset(y1, 0xab, sizeof(float) * yn);
        assert_int_equal(cu_upload(dy1, y1, sizeof(float) * yn), 0);
        cu_mma_gemm_set(1, 1, 1);
        cu_mma_gemm_set_kind(kind);
        assert_int_equal(cu_mma_gemm_linear(NULL, w, dq, ldq, ds, lds, T, dy1, ldy, out_bf16), 1);   /* it took the launch */
        cu_mma_gemm_set(CU_MMA_GEMM_MIN_T, CU_MMA_GEMM_MIN_BLOCKS, CU_MMA_GEMM_MIN_TILES);
        cu_mma_gemm_set_kind(CU_GEMM_DEFAULT);
        assert_int_equal(cu_finish(NULL, "gemm", &err), 0);
        assert_int_equal(cu_download(y1, dy1, sizeof(float) * yn), 0);
        size_t differ = 0, first = 0;
        for (size_t i = 0; i < yn; i++)
            if (memcmp(&y0[i], &y1[i], 4) && !differ++) first = i;
        if (differ)
            print_error("%s %s %d x %d (row0 %d), T %d, out_bf16 %d: %zu of %zu floats differ, first at token %zu column %zu (%a vs %a)\n",
                        kind == CU_GEMM_HGMMA4 ? "wgmma x4" : kind == CU_GEMM_HGMMA ? "wgmma" : "mma.sync", w->fmt == WF_FP4 ? "FP4" : "FP8", N, K, w->row0, T, out_bf16, differ, yn,
                        first / ldy, first % ldy, y0[first], y1[first]);
        assert_int_equal(differ, 0);
    }
    cu_free(dq);
    cu_free(ds);
    cu_free(dy0);
    cu_free(dy1);
    free(q);
    free(s);
    free(y0);
    free(y1);
}

static void free_weight(dweight *t) {
    cu_free(t->data);
    cu_free(t->scale);
}

static void fp8_around_the_tile(void **state) {
    (void)state;
    dweight a = make_weight(WF_FP8, 300, 640);   /* 5 chunks: partial 0 takes two */
    static const int Ts[] = { 127, 128, 129, 300 };
    for (int i = 0; i < 4; i++) same_bits(&a.w, Ts[i], Ts[i] & 1);
    const dsv4_weight v = view(&a.w, 40);
    same_bits(&v, 200, 0);
    free_weight(&a);
    dweight b = make_weight(WF_FP8, 136, 256);   /* 2 chunks: partials 2 and 3 empty */
    same_bits(&b.w, 129, 0);
    free_weight(&b);
    dweight c = make_weight(WF_FP8, 128, 1024);   /* 8 chunks, whole tiles */
    same_bits(&c.w, 256, 1);
    free_weight(&c);
}

static void fp4_around_the_tile(void **state) {
    (void)state;
    dweight a = make_weight(WF_FP4, 300, 608);   /* 4 full chunks and one of 3 scale blocks */
    static const int Ts[] = { 127, 128, 129, 300 };
    for (int i = 0; i < 4; i++) same_bits(&a.w, Ts[i], Ts[i] & 1);
    const dsv4_weight v = view(&a.w, 40);
    same_bits(&v, 130, 0);
    free_weight(&a);
    dweight b = make_weight(WF_FP4, 72, 96);   /* one chunk of 3 blocks */
    same_bits(&b.w, 130, 1);
    same_bits(&b.w, 90, 0);   /* one tile of 65-96 tokens */
    free_weight(&b);
    dweight c = make_weight(WF_FP4, 40, 1056);   /* 9 chunks, the last of 1 block */
    same_bits(&c.w, 129, 0);
    free_weight(&c);
}

/* The routed experts' path: a plan of 6 experts (150 pairs, 3, 20 on an absent expert, none, 140, 9), pairs sorted
 * by expert then token and cut into tiles of up to CU_MOE_TILE, max_tiles above the plan's count (blocks past it
 * must do nothing). cu_mma_gemm_experts against cu_mma_expert_linear with the GEMM off, memcmp over y, with the
 * inputs by token (pair_token) and by pair. */
/* extreme: a few weight scale bytes of experts 0 and 4 and activation scales set at and past the edges of the
 * packed kernels' PLAIN range (cu_mma_frag.cuh), and to E8M0 0 and 255, so that both sides of each kernel's
 * choice meet in one launch. */
static void experts_same_bits_x(int fmt, int rows, int cols, int x_by_pair, int packed, int extreme) {
    enum { E = 6, T = 300 };
    static const int counts[E] = { 150, 3, 20, 0, 140, 9 };
    dweight ew[E];
    dsv4_weight hw[E];
    for (int e = 0; e < E; e++) {
        ew[e] = make_weight(fmt, rows, cols);
        hw[e] = ew[e].w;
        if (extreme && (e == 0 || e == 4)) {
            static const uint8_t bytes[] = { 0, 255, 30, 220, 63, 191, 64, 190 };
            const int scols = ew[e].w.scale_cols;
            uint8_t *sc = malloc((size_t)rows * scols);
            assert_int_equal(cu_download(sc, ew[e].scale, (size_t)rows * scols), 0);
            for (int k = 0; k < 8; k++) sc[(size_t)(7 + 17 * k + e) % rows * scols + (3 * k + e) % scols] = bytes[k];
            assert_int_equal(cu_upload(ew[e].scale, sc, (size_t)rows * scols), 0);
            free(sc);
        }
    }
    hw[2].data = NULL;   /* another GPU's */
    int P = 0, n_tiles = 0;
    for (int e = 0; e < E; e++) {
        P += counts[e];
        n_tiles += (counts[e] + CU_MOE_TILE - 1) / CU_MOE_TILE;
    }
    int32_t *pair_token = malloc(sizeof(int32_t) * P), *te = malloc(sizeof(int32_t) * n_tiles), *tf = malloc(sizeof(int32_t) * n_tiles),
            *tc = malloc(sizeof(int32_t) * n_tiles);
    int p = 0, t = 0;
    for (int e = 0; e < E; e++) {
        int tok = (int)dsv4_rng_below(&rng, 2);
        for (int k = 0; k < counts[e]; k++, p++) {
            if (k % CU_MOE_TILE == 0) {
                te[t] = e;
                tf[t] = p;
                tc[t] = counts[e] - k < CU_MOE_TILE ? counts[e] - k : CU_MOE_TILE;
                t++;
            }
            pair_token[p] = tok;
            tok += 1 + (int)dsv4_rng_below(&rng, 2);   /* increasing: at most 300 tokens for 150 pairs */
        }
    }
    const int max_tiles = n_tiles + 40;
    const int ldq = cu_mma_ld(cols), lds = cu_mma_lds(cols), ldy = rows + 1, X = x_by_pair ? P : T;
    uint8_t *q = malloc((size_t)X * ldq);
    float *xs = malloc(sizeof(float) * X * lds), *y0 = malloc(sizeof(float) * P * ldy), *y1 = malloc(sizeof(float) * P * ldy);
    for (size_t i = 0; i < (size_t)X * ldq; i++) q[i] = random_e4m3();
    for (int i = 0; i < X * lds; i++) xs[i] = ldexpf(1.0f, -(int)dsv4_rng_below(&rng, 11));
    if (extreme) {
        static const float sxs[] = { 0x1p-61f, 0x1p51f, 0x1p-60f, 0x1p50f };
        for (int k = 0; k < 4; k++) xs[(size_t)(5 + 37 * k) % X * lds + k % (cols / 128)] = sxs[k];
    }
    memset(y0, 0xab, sizeof(float) * P * ldy);
    cu_moe_plan plan = plan_upload(pair_token, P, te, tf, tc, n_tiles);
    dsv4_weight *dw = upload(hw, sizeof hw);
    uint8_t *dq = upload(q, (size_t)X * ldq);
    float *ds = upload(xs, sizeof(float) * X * lds), *dy0 = upload(y0, sizeof(float) * P * ldy), *dy1 = upload(y0, sizeof(float) * P * ldy);
    dsv4_error err;
    cu_mma_gemm_set(0, 0, 0);
    /* fp32 outputs with the inputs by token (an order slip shows in the last bit), BF16 ones by pair (the epilogue) */
    const int out_bf16 = x_by_pair;
    assert_int_equal(cu_mma_expert_linear(NULL, dw, rows, cols, fmt, &plan, max_tiles, dq, ldq, ds, lds, x_by_pair, dy0, ldy, out_bf16, 0, &err), 0);
    float *dy2 = upload(y0, sizeof(float) * P * ldy);
    if (packed) {   /* the same experts packed (cu_fp4_frag_pack): the GEMM (dy1) and the small tiles (dy2) on them */
        for (int e = 0; e < E; e++) assert_int_equal(cu_fp4_frag_pack(NULL, (void *)ew[e].w.data, rows, cols, &err), 0);
        fmt = CU_FMT_FP4_FRAG;
        assert_int_equal(cu_mma_expert_linear(NULL, dw, rows, cols, fmt, &plan, max_tiles, dq, ldq, ds, lds, x_by_pair, dy2, ldy, out_bf16, 0, &err), 0);
    }
    assert_int_equal(cu_finish(NULL, "small tiles", &err), 0);
    assert_int_equal(cu_download(y0, dy0, sizeof(float) * P * ldy), 0);
    if (packed) {   /* the packed small tiles = the unpacked ones (y0) */
        float *y2 = malloc(sizeof(float) * P * ldy);
        assert_int_equal(cu_download(y2, dy2, sizeof(float) * P * ldy), 0);
        if (memcmp(y0, y2, sizeof(float) * P * ldy))
            print_error("packed experts %d x %d, x_by_pair %d: the small tiles differ from the unpacked ones\n", rows, cols, x_by_pair);
        assert_memory_equal(y0, y2, sizeof(float) * P * ldy);
        free(y2);
    }
    size_t written = 0;
    for (size_t i = 0; i < (size_t)P * ldy; i++) {
        uint32_t u;
        memcpy(&u, &y0[i], 4);
        written += u != 0xabababab;
    }
    assert_int_equal(written, (size_t)P * rows);   /* every pair's row, the absent expert's included */
    for (int kind = CU_GEMM_MMA; kind <= CU_GEMM_HGMMA4; kind++) {   /* each GEMM against the small tiles */
        memset(y1, 0xab, sizeof(float) * P * ldy);
        assert_int_equal(cu_upload(dy1, y1, sizeof(float) * P * ldy), 0);
        cu_mma_gemm_set(1, 1, 1);
        cu_mma_gemm_set_kind(kind);
        assert_int_equal(cu_mma_gemm_experts(NULL, dw, rows, cols, fmt, &plan, max_tiles, dq, ldq, ds, lds, x_by_pair, dy1, ldy, out_bf16), 1);
        cu_mma_gemm_set(CU_MMA_GEMM_MIN_T, CU_MMA_GEMM_MIN_BLOCKS, CU_MMA_GEMM_MIN_TILES);
        cu_mma_gemm_set_kind(CU_GEMM_DEFAULT);
        assert_int_equal(cu_finish(NULL, "gemm experts", &err), 0);
        assert_int_equal(cu_download(y1, dy1, sizeof(float) * P * ldy), 0);
        size_t differ = 0, first = 0;
        for (size_t i = 0; i < (size_t)P * ldy; i++)
            if (memcmp(&y0[i], &y1[i], 4) && !differ++) first = i;
        if (differ)
            print_error("%s experts %s %d x %d, x_by_pair %d: %zu floats differ, first at pair %zu row %zu (%a vs %a)\n",
                        kind == CU_GEMM_HGMMA4 ? "wgmma x4" : kind == CU_GEMM_HGMMA ? "wgmma" : "mma.sync", fmt == WF_FP4 ? "FP4" : fmt == CU_FMT_FP4_FRAG ? "packed FP4" : "FP8",
                        rows, cols, x_by_pair, differ, first / ldy, first % ldy, y0[first], y1[first]);
        assert_int_equal(differ, 0);
    }
    for (int e = 0; e < E; e++) free_weight(&ew[e]);
    plan_free(&plan);
    cu_free(dw);
    cu_free(dq);
    cu_free(ds);
    cu_free(dy0);
    cu_free(dy1);
    cu_free(dy2);
    free(pair_token);
    free(te);
    free(tf);
    free(tc);
    free(q);
    free(xs);
    free(y0);
    free(y1);
}

static void experts_same_bits(int fmt, int rows, int cols, int x_by_pair, int packed) {
    experts_same_bits_x(fmt, rows, cols, x_by_pair, packed, 0);
}

static void experts_fp4(void **state) {
    (void)state;
    experts_same_bits(WF_FP4, 136, 608, 0, 0);
    experts_same_bits(WF_FP4, 136, 608, 1, 0);
    experts_same_bits(WF_FP4, 136, 640, 0, 1);   /* packed: the GEMM and the small tiles = unpacked small tiles */
    experts_same_bits(WF_FP4, 136, 640, 1, 1);
    experts_same_bits_x(WF_FP4, 136, 640, 0, 1, 1);   /* packed, scales past the PLAIN range: both paths of each kernel */
    experts_same_bits_x(WF_FP4, 136, 640, 1, 1, 1);
}

static void experts_fp8(void **state) {
    (void)state;
    experts_same_bits(WF_FP8, 136, 640, 0, 0);
}

static void switch_and_refusals(void **state) {
    (void)state;
    dweight a = make_weight(WF_FP8, 16, 128);
    uint8_t *q = cu_malloc(128 * 512);
    float *s = cu_malloc(sizeof(float) * 512), *y = cu_malloc(sizeof(float) * 16 * 512);
    cu_mma_gemm_set(0, 0, 0);
    assert_int_equal(cu_mma_gemm_min_t(), 0);
    assert_int_equal(cu_mma_gemm_linear(NULL, &a.w, q, 128, s, 1, 512, y, 16, 0), 0);   /* off */
    cu_mma_gemm_set(300, 1, 1);
    assert_int_equal(cu_mma_gemm_linear(NULL, &a.w, q, 128, s, 1, 299, y, 16, 0), 0);   /* below the minimum */
    dsv4_weight odd = a.w;
    odd.data = (const uint8_t *)a.w.data + 4;   /* 4-byte aligned (FP4 would allow it): the small tiles take it */
    odd.fmt = WF_FP4;
    odd.scale_cols = 4;
    assert_int_equal(cu_mma_gemm_linear(NULL, &odd, q, 128, s, 1, 300, y, 16, 0), 0);
    cu_mma_gemm_set(1, CU_MMA_GEMM_MIN_BLOCKS, 1);   /* too few 128 x 128 blocks to fill the GPU: the small tiles */
    dsv4_weight tall = a.w;
    tall.rows = 4096;   /* the decision reads the shape only */
    assert_int_equal(cu_mma_gemm_takes_linear(&a.w, 512), 0);    /* 1 x 4 blocks */
    assert_int_equal(cu_mma_gemm_takes_linear(&tall, 384), 0);   /* 32 x 3 */
    assert_int_equal(cu_mma_gemm_takes_linear(&tall, 512), 1);   /* 32 x 4 = 128 */
    cu_mma_gemm_set_kind(CU_GEMM_HGMMA);
    assert_int_equal(cu_mma_gemm_kind(), CU_GEMM_HGMMA);
    cu_mma_gemm_set_kind(CU_GEMM_MMA);
    assert_int_equal(cu_mma_gemm_kind(), CU_GEMM_MMA);
    cu_mma_gemm_set_kind(7);   /* not a kind: the default */
    assert_int_equal(cu_mma_gemm_kind(), CU_GEMM_DEFAULT);
    cu_mma_gemm_set(-5, -3, -1);
    assert_int_equal(cu_mma_gemm_min_tiles(), 0);
    assert_int_equal(cu_mma_gemm_min_t(), 0);
    cu_mma_gemm_set(CU_MMA_GEMM_MIN_T, CU_MMA_GEMM_MIN_BLOCKS, CU_MMA_GEMM_MIN_TILES);
    cu_free(q);
    cu_free(s);
    cu_free(y);
    free_weight(&a);
}

#ifndef GEMM_TEST_SHIM
/* ---- benchmark (GPU) ---------------------------------------------------------------------------------------- */

/* Seconds a call of f(arg), `reps` calls timed by events after one to warm; -1 when a call fails. */
static double seconds_each(int (*f)(void *), void *arg, int reps) {
    cudaEvent_t e0, e1;
    float ms = -1;
    if (!f(arg)) return -1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0, 0);
    for (int r = 0; r < reps; r++) f(arg);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return cudaGetLastError() == cudaSuccess ? ms * 1e-3 / reps : -1;
}

typedef struct {   /* one cu_mma_linear call (the GEMM or the small tiles, as the switch stands) */
    const dsv4_weight *w;
    const uint8_t *q;
    const float *s;
    int ldq, lds, T;
    float *y;
} linear_call;
static int linear_call_run(void *a) {
    const linear_call *c = a;
    dsv4_error err;
    return !cu_mma_linear(NULL, c->w, c->q, c->ldq, c->s, c->lds, c->T, c->y, c->w->rows, 0, 0, &err);
}

static double seconds_per_call(const dsv4_weight *w, const uint8_t *q, int ldq, const float *s, int lds, int T, float *y, int reps) {
    linear_call c = { w, q, s, ldq, lds, T, y };
    return seconds_each(linear_call_run, &c, reps);
}

static int bench(void) {
    /* wq_a, wkv, wq_b, wo_b, an expert's w1 / w3 and w2 (FP8 for the shared expert, FP4 for the routed ones) */
    static const struct { int fp4, N, K; const char *what; } shapes[] = {
        { 0, 1024, 4096, "wq_a" }, { 0, 512, 4096, "wkv" }, { 0, 32768, 1024, "wq_b" }, { 0, 4096, 8192, "wo_b" },
        { 0, 2048, 4096, "shared w1" }, { 0, 4096, 2048, "shared w2" }, { 1, 2048, 4096, "FP4 w1" }, { 1, 4096, 2048, "FP4 w2" },
    };
    static const int Ts[] = { 256, 512, 2048, 8192 };   /* the small end: where CU_MMA_GEMM_MIN_T should lie */
    enum { TMAX = 8192, KMAX = 8192 };
    uint8_t *q = cu_malloc((size_t)TMAX * KMAX);
    float *s = cu_malloc(sizeof(float) * TMAX * (KMAX / 128)), *y = cu_malloc(sizeof(float) * (size_t)TMAX * 32768);
    if (!q || !s || !y) {
        fprintf(stderr, "bench: out of GPU memory\n");
        return 1;
    }
    cu_fill_synth(q, (size_t)TMAX * KMAX, CU_SYNTH_FP8, 7);
    float *h = malloc(sizeof(float) * TMAX * (KMAX / 128));
    for (int i = 0; i < TMAX * (KMAX / 128); i++) h[i] = 1.0f / 64;
    cu_upload(s, h, sizeof(float) * TMAX * (KMAX / 128));
    free(h);
    printf("%-10s %-4s %12s %6s %14s %14s %14s %14s\n", "weight", "fmt", "N x K", "T", "k_mma TFLOPS", "gemm TFLOPS", "wgmma TFLOPS",
           "wgmma4 TFLOPS");
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int fp4 = shapes[k].fp4, N = shapes[k].N, K = shapes[k].K;
        dsv4_weight w = { fp4 ? WF_FP4 : WF_FP8, N, K, NULL, NULL, fp4 ? K / 32 : K / 128, 0 };
        const size_t db = fp4 ? (size_t)N * K / 2 : (size_t)N * K, sb = weight_scale_bytes(&w);
        void *d = cu_malloc(db), *sc = cu_malloc(sb);
        if (!d || !sc) return 1;
        cu_fill_synth(d, db, fp4 ? CU_SYNTH_FP4 : CU_SYNTH_FP8, 100 + k);
        cu_fill_bytes(sc, 120, sb);
        w.data = d;
        w.scale = sc;
        for (int j = 0; j < (int)(sizeof Ts / sizeof Ts[0]); j++) {
            const int T = Ts[j];
            cu_mma_gemm_set(0, 0, 0);
            const double old = seconds_per_call(&w, q, KMAX, s, KMAX / 128, T, y, T <= 512 ? 20 : 3);
            cu_mma_gemm_set(1, 1, 1);
            cu_mma_gemm_set_kind(CU_GEMM_MMA);
            const double neu = seconds_per_call(&w, q, KMAX, s, KMAX / 128, T, y, 10);
            cu_mma_gemm_set_kind(CU_GEMM_HGMMA);
            const double wg = seconds_per_call(&w, q, KMAX, s, KMAX / 128, T, y, 10);
            cu_mma_gemm_set_kind(CU_GEMM_HGMMA4);
            const double wg4 = seconds_per_call(&w, q, KMAX, s, KMAX / 128, T, y, 10);
            cu_mma_gemm_set_kind(CU_GEMM_DEFAULT);
            cu_mma_gemm_set(CU_MMA_GEMM_MIN_T, CU_MMA_GEMM_MIN_BLOCKS, CU_MMA_GEMM_MIN_TILES);
            if (old <= 0 || neu <= 0 || wg <= 0 || wg4 <= 0) return 1;
            const double fl = 2.0 * N * K * T;
            printf("%-10s %-4s %5dx%-6d %6d %14.1f %14.1f %14.1f %14.1f\n", shapes[k].what, fp4 ? "FP4" : "FP8", N, K, T, fl / old / 1e12,
                   fl / neu / 1e12, fl / wg / 1e12, fl / wg4 / 1e12);
        }
        cu_free(d);
        cu_free(sc);
    }
    cu_free(q);
    cu_free(s);
    cu_free(y);
    return 0;
}

typedef struct {   /* one cu_mma_gemm_experts call (native: cu_nat_experts), or (experts NULL) one cu_mma_gemm_linear call on w */
    const dsv4_weight *experts, *w;
    int rows, cols, x_by_pair, T, max_tiles, native;
    const cu_moe_plan *plan;
    const uint8_t *xq;
    const float *xs;
    float *y;
} gemm_call;
static int gemm_call_run(void *a) {
    const gemm_call *c = a;
    if (!c->experts) return cu_mma_gemm_linear(NULL, c->w, c->xq, cu_mma_ld(c->cols), c->xs, cu_mma_lds(c->cols), c->T, c->y, c->rows, 0);
    if (c->native) {
        dsv4_error err;
        return !cu_nat_experts(NULL, 1, c->experts, c->experts, c->rows, c->cols, c->plan, c->max_tiles, c->xq, cu_mma_ld(c->cols), c->xs,
                               cu_mma_lds(c->cols), c->x_by_pair, c->y, c->y, c->rows, 0, &err);
    }
    return cu_mma_gemm_experts(NULL, c->experts, c->rows, c->cols, CU_FMT_FP4_FRAG, c->plan, c->max_tiles, c->xq, cu_mma_ld(c->cols), c->xs,
                               cu_mma_lds(c->cols), c->x_by_pair, c->y, c->rows, 0);
}

/* `--bench-experts` (GPU): the routed experts' GEMM as an 8K prefill step runs it — 8,192 tokens routed uniformly to 6
 * of 256 packed FP4 experts (~192 pairs each), w1 (2048 x 4096, inputs by token) and w2 (4096 x 2048, inputs by pair),
 * in TFLOPS — beside one FP4 linear of the same shape at T = 8,192 (cu_mma_gemm_linear, unpacked codes), the same
 * FLOPs on one weight: what the expert GEMM loses to its plan and its many weights; and the same experts on native FP8
 * tensor cores (k_expert_nat.cu's GEMM, packed by cu_fp4_nat_pack: another arithmetic). ncu: tools/gpu/run_s7.sh
 * part ncudeep with NCU_DEEP_PROG=test_gpu_gemm and --bench-experts. */
static int bench_experts(double skew) {
    enum { E = 256, K = 6, T = 8192, P = T * K };
    dsv4_rng_seed(&rng, 18);   /* main seeds it only for the tests: unseeded, every draw is 0 and the routing never ends */
    /* skew S > 0: expert e drawn with weight (1 + e)^-S (S = 0.5: the busiest tenth takes ~28 % of the routes, near the
     * synthetic model's 26 %, GPU_RUNS run 128) */
    double cdf[E], sum = 0;
    for (int e = 0; e < E; e++) cdf[e] = sum += pow(1.0 + e, -skew);
    int32_t *choice = malloc(sizeof(int32_t) * P), *count = calloc(E + 1, sizeof(int32_t)), *pair_token = malloc(sizeof(int32_t) * P);
    int32_t *te = malloc(sizeof(int32_t) * (P / CU_MOE_TILE + E)), *tf = malloc(sizeof(int32_t) * (P / CU_MOE_TILE + E)),
            *tc = malloc(sizeof(int32_t) * (P / CU_MOE_TILE + E));
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e, dup;
            do {
                const double u = sum * (double)dsv4_rng_below(&rng, 1u << 30) / (double)(1u << 30);
                for (e = 0; e < E - 1 && cdf[e] <= u; e++) {}
                dup = 0;
                for (int j = 0; j < k; j++) dup |= choice[t * K + j] == e;
            } while (dup);
            choice[t * K + k] = e;
            count[e]++;
        }
    int n_tiles = 0, p = 0, most = 0;
    for (int e = 0; e < E; e++) {   /* pairs by expert, then token; tiles of CU_MOE_TILE */
        const int p0 = p;
        for (int t = 0; t < T; t++)
            for (int k = 0; k < K; k++)
                if (choice[t * K + k] == e) pair_token[p++] = t;
        for (int q = p0; q < p; q += CU_MOE_TILE) te[n_tiles] = e, tf[n_tiles] = q, tc[n_tiles++] = p - q < CU_MOE_TILE ? p - q : CU_MOE_TILE;
        most = count[e] > most ? count[e] : most;
    }
    cu_moe_plan plan = plan_upload(pair_token, P, te, tf, tc, n_tiles);
    printf("routed experts' GEMM: %d tokens x %d of %d experts, skew %.2f (%d pairs, %d tiles, the busiest expert %d pairs), packed FP4\n",
           T, K, E, skew, P, n_tiles, most);
    printf("%-4s %-12s %10s %14s %22s %24s\n", "w", "N x K", "ms", "experts TFLOPS", "one linear, T 8192", "native experts TFLOPS");
    static const struct { int rows, cols, x_by_pair; const char *what; } shapes[] = { { 2048, 4096, 0, "w1" }, { 4096, 2048, 1, "w2" } };
    int rc = 0;
    for (int k = 0; k < 2 && !rc; k++) {
        const int rows = shapes[k].rows, cols = shapes[k].cols, X = shapes[k].x_by_pair ? P : T;
        const size_t db = (size_t)rows * cols / 2, sb = (size_t)rows * (cols / 32);
        dsv4_weight hw[E], hn[E];   /* packed for the mma.sync kernels, and for the native ones */
        dsv4_error err;
        for (int e = 0; e < E && !rc; e++) {
            hw[e] = (dsv4_weight){ WF_FP4, rows, cols, cu_malloc(db), cu_malloc(sb), cols / 32, 0 };
            hn[e] = (dsv4_weight){ WF_FP4, rows, cols, cu_malloc(db), hw[e].scale, cols / 32, 0 };
            if (!hw[e].data || !hw[e].scale || !hn[e].data) rc = 1;
            else {
                cu_fill_synth((void *)hw[e].data, db, CU_SYNTH_FP4, 1000 + e);
                cu_fill_synth((void *)hn[e].data, db, CU_SYNTH_FP4, 1000 + e);
                cu_fill_bytes((void *)hw[e].scale, 120, sb);
                if (cu_fp4_frag_pack(NULL, (void *)hw[e].data, rows, cols, &err) || cu_fp4_nat_pack(NULL, (void *)hn[e].data, rows, cols, &err))
                    rc = 1;
            }
        }
        dweight lin = make_weight(WF_FP4, rows, cols);
        uint8_t *xq = cu_malloc((size_t)X * cu_mma_ld(cols));
        float *xs = cu_malloc(sizeof(float) * X * cu_mma_lds(cols)), *y = cu_malloc(sizeof(float) * (size_t)P * rows);
        dsv4_weight *dw = rc ? NULL : upload(hw, sizeof hw), *dn = rc ? NULL : upload(hn, sizeof hn);
        if (rc || !xq || !xs || !y || !dn) {
            fprintf(stderr, "bench: out of GPU memory\n");
            return 1;
        }
        cu_fill_synth(xq, (size_t)X * cu_mma_ld(cols), CU_SYNTH_FP8, 7);
        float *h = malloc(sizeof(float) * X * cu_mma_lds(cols));
        for (int i = 0; i < X * cu_mma_lds(cols); i++) h[i] = 1.0f / 64;
        cu_upload(xs, h, sizeof(float) * X * cu_mma_lds(cols));
        free(h);
        gemm_call ex = { dw, NULL, rows, cols, shapes[k].x_by_pair, P, n_tiles, 0, &plan, xq, xs, y };
        gemm_call li = { NULL, &lin.w, rows, cols, 0, T, 0, 0, NULL, xq, xs, y };
        gemm_call nx = { dn, NULL, rows, cols, shapes[k].x_by_pair, P, n_tiles, 1, &plan, xq, xs, y };
        const int build_min = cu_nat_gemm_min_tiles(1);   /* the native GEMM, whatever the default threshold */
        const double se = seconds_each(gemm_call_run, &ex, 5), sl = seconds_each(gemm_call_run, &li, 5), sn = seconds_each(gemm_call_run, &nx, 5);
        cu_nat_gemm_min_tiles(build_min);
        if (se <= 0 || sl <= 0 || sn <= 0) {
            fprintf(stderr, "bench: a call failed (%s)\n", cudaGetErrorString(cudaGetLastError()));
            rc = 1;
        } else {
            printf("%-4s %5dx%-6d %10.3f %14.1f %15.1f (%.3f ms) %13.1f (%.3f ms)\n", shapes[k].what, rows, cols, se * 1e3,
                   2.0 * P * rows * cols / se / 1e12, 2.0 * T * rows * cols / sl / 1e12, sl * 1e3, 2.0 * P * rows * cols / sn / 1e12, sn * 1e3);
        }
        for (int e = 0; e < E; e++) cu_free((void *)hw[e].data), cu_free((void *)hw[e].scale), cu_free((void *)hn[e].data);
        free_weight(&lin);
        cu_free(dw), cu_free(dn), cu_free(xq), cu_free(xs), cu_free(y);
    }
    plan_free(&plan);
    free(choice), free(count), free(pair_token), free(te), free(tf), free(tc);
    return rc;
}
#endif

int main(int argc, char **argv) {
#ifndef GEMM_TEST_SHIM
    dsv4_error why;
    if (!dsv4_cuda_available(&why)) {
        printf("gpu gemm: skipped, needs a GPU: %s\n", why.msg);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench();
    if (argc > 1 && !strcmp(argv[1], "--bench-experts")) return bench_experts(argc > 2 ? atof(argv[2]) : 0.0);
#endif
    if (argc > 1) {
        fprintf(stderr, "usage: test_gpu_gemm [--bench | --bench-experts [SKEW]]\n");
        return 2;
    }
    dsv4_rng_seed(&rng, 18);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fp8_around_the_tile),
        cmocka_unit_test(fp4_around_the_tile),
        cmocka_unit_test(experts_fp4),
        cmocka_unit_test(experts_fp8),
        cmocka_unit_test(switch_and_refusals),
    };
    return cmocka_run_group_tests_name("gpu large-T tensor-core linear", tests, NULL, NULL);
}
