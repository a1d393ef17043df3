/* Per-kernel checks of the CUDA backend against the CPU kernels on the same inputs (issue 11, "what must hold" 2):
 * the rounding and quantization kernels and the KV row encoder must give the CPU's bits exactly (they are
 * elementwise rules); the reductions (RMSNorm, the linear layers in every weight format) must agree to float
 * rounding, and the linear kernel must be batch-invariant: a row's result never depends on how many rows were
 * computed with it. Relative errors are printed per kernel. Also the token split's tiles (issue 15), against the
 * rule worked out here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/kernels.h"
#include "backend/cuda/cu_kernels.h"
#include "backend/cuda/cu_runtime.h"
#include "core/norm.h"
#include "model/expert_split.h"
#include "model/formats.h"
#include "model/tiny.h"
#include "state/kvrows.h"

static dsv4_rng rng;

static float frand(float scale) { return ((float)dsv4_rng_below(&rng, 1u << 24) / (float)(1u << 23) - 1.0f) * scale; }

/* Values spanning many binades, with exact zeros, ties and the odd huge one. */
static void fill(float *x, int n) {
    for (int i = 0; i < n; i++) {
        const int k = (int)dsv4_rng_below(&rng, 16);
        x[i] = k == 0 ? 0.0f : k == 1 ? 448.0f * (float)(1 + (int)dsv4_rng_below(&rng, 3)) : frand(ldexpf(1.0f, (int)dsv4_rng_below(&rng, 20) - 10));
    }
}

static void *dev_copy(const void *h, size_t n) {
    void *d = cu_malloc(n);
    assert_non_null(d);
    assert_int_equal(cu_upload(d, h, n), 0);
    return d;
}

static void sync_ok(void) {
    dsv4_error err;
    if (cu_finish(NULL, "kernel", &err)) fail_msg("%s", err.msg);
}

static double rel(const float *a, const float *b, size_t n) {
    double dm = 0, bm = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        if (!(d <= dm)) dm = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > bm) bm = fabs(b[i]);
    }
    return bm ? dm / bm : dm;
}

static void quantization_is_bit_exact(void **state) {
    (void)state;
    enum { ROWS = 37, N = 1000 };
    float *x = malloc(sizeof(float) * ROWS * N), *cpu = malloc(sizeof(float) * ROWS * N), *gpu = malloc(sizeof(float) * ROWS * N);
    for (int fp4 = 0; fp4 < 2; fp4++) {
        const int block = fp4 ? 32 : 128;
        fill(x, ROWS * N);
        memcpy(cpu, x, sizeof(float) * ROWS * N);
        for (int r = 0; r < ROWS; r++)
            (fp4 ? act_quant_fp4_inplace : act_quant_fp8_inplace)(cpu + (int64_t)r * N, N, block);
        float *d = dev_copy(x, sizeof(float) * ROWS * N);
        cu_act_quant(NULL, d, N, d, N, ROWS, N, block, fp4);
        sync_ok();
        cu_download(gpu, d, sizeof(float) * ROWS * N);
        cu_free(d);
        if (memcmp(cpu, gpu, sizeof(float) * ROWS * N)) fail_msg("act_quant %s differs from the CPU", fp4 ? "fp4" : "fp8");
        printf("  act_quant %s per %d: bit-identical to the CPU (%d values)\n", fp4 ? "fp4" : "fp8", block, ROWS * N);
    }
    /* bf16 rounding, with ties and specials */
    const int n = 4096;
    for (int i = 0; i < n; i++) {
        uint32_t u = (uint32_t)dsv4_rng_below(&rng, 0xffffffffu);
        if (i % 7 == 0) u = (u & 0xffff0000u) | 0x8000u;   /* an exact tie */
        memcpy(&x[i], &u, 4);
    }
    x[0] = INFINITY; x[1] = -INFINITY; x[2] = NAN; x[3] = -0.0f;
    for (int i = 0; i < n; i++) cpu[i] = round_bf16(x[i]);
    float *d = dev_copy(x, sizeof(float) * n);
    cu_round_bf16(NULL, d, n);
    sync_ok();
    cu_download(gpu, d, sizeof(float) * n);
    cu_free(d);
    if (memcmp(cpu, gpu, sizeof(float) * n)) fail_msg("bf16 rounding differs from the CPU");
    printf("  round_bf16: bit-identical (%d patterns incl. ties, inf, NaN)\n", n);
    free(x); free(cpu); free(gpu);
}

static void kv_encode_is_bit_exact(void **state) {
    (void)state;
    enum { ROWS = 19 };
    const struct { int fmt, kind, width, rope; } cases[] = {
        {DSV4_KV_F32, KV_ROW_MAIN, 512, 64}, {DSV4_KV_BF16, KV_ROW_MAIN, 512, 64}, {DSV4_KV_FP8, KV_ROW_MAIN, 512, 64},
        {DSV4_KV_FP8, KV_ROW_MAIN, 96, 32},  {DSV4_KV_FP8, KV_ROW_INDEX, 128, 0},  {DSV4_KV_FP8, KV_ROW_INDEX, 64, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kv_layout l;
        kv_layout_init(&l, cases[c].fmt, cases[c].kind, cases[c].width, cases[c].rope);
        float *x = malloc(sizeof(float) * ROWS * l.width);
        uint8_t *cpu = calloc(ROWS, l.bytes), *gpu = calloc(ROWS, l.bytes);
        fill(x, ROWS * l.width);
        for (int r = 0; r < ROWS; r++) kv_encode(&l, x + (int64_t)r * l.width, cpu + r * l.bytes);
        float *dx = dev_copy(x, sizeof(float) * ROWS * l.width);
        uint8_t *dd = cu_malloc(ROWS * l.bytes);
        cu_kvlay k = { l.fmt, l.kind, l.width, l.rope, l.nope, (int)l.bytes };
        cu_kv_encode(NULL, k, dx, l.width, dd, ROWS);
        sync_ok();
        cu_download(gpu, dd, ROWS * l.bytes);
        if (memcmp(cpu, gpu, ROWS * l.bytes))
            fail_msg("kv_encode %s %s width %d differs from the CPU", kv_format_name(l.fmt), l.kind ? "index" : "main", l.width);
        printf("  kv_encode %-4s %-5s width %3d: bit-identical\n", kv_format_name(l.fmt), l.kind ? "index" : "main", l.width);
        cu_free(dx); cu_free(dd); free(x); free(cpu); free(gpu);
    }
}

static void rmsnorm_close(void **state) {
    (void)state;
    enum { ROWS = 9, N = 4096 };
    float *x = malloc(sizeof(float) * ROWS * N), *w = malloc(sizeof(float) * N), *cpu = malloc(sizeof(float) * ROWS * N),
          *gpu = malloc(sizeof(float) * ROWS * N);
    for (int i = 0; i < ROWS * N; i++) x[i] = frand(3.0f);
    for (int i = 0; i < N; i++) w[i] = 1.0f + frand(0.5f);
    for (int official = 0; official < 2; official++) {
        for (int r = 0; r < ROWS; r++) rmsnorm(official ? DSV4_MODE_OFFICIAL : DSV4_MODE_EXACT, x + (int64_t)r * N, w, N, 1e-6f, cpu + (int64_t)r * N);
        float *dx = dev_copy(x, sizeof(float) * ROWS * N), *dw = dev_copy(w, sizeof(float) * N);
        cu_rmsnorm(NULL, official, dx, N, dw, N, 1e-6f, dx, N, ROWS);
        sync_ok();
        cu_download(gpu, dx, sizeof(float) * ROWS * N);
        const double e = rel(gpu, cpu, (size_t)ROWS * N);
        printf("  rmsnorm %-8s: relative error %.3g\n", official ? "OFFICIAL" : "EXACT", e);
        /* OFFICIAL rounds to bf16 after: one bf16 ulp at most where the fp32 sums straddle a rounding boundary */
        if (!(e <= (official ? 8e-3 : 1e-6))) fail_msg("rmsnorm relative error %.3g", e);
        cu_free(dx); cu_free(dw);
    }
    free(x); free(w); free(cpu); free(gpu);
}

/* A random weight of format fmt, rows x cols, on the host (owned arrays returned for freeing). */
static dsv4_weight make_weight(int fmt, int rows, int cols, void **data, uint8_t **scale) {
    dsv4_weight w = { .fmt = fmt, .rows = rows, .cols = cols };
    size_t n = (size_t)rows * cols;
    switch (fmt) {
    case WF_F32: { float *d = malloc(n * 4); for (size_t i = 0; i < n; i++) d[i] = frand(0.1f); *data = d; break; }
    case WF_BF16: { uint16_t *d = malloc(n * 2); for (size_t i = 0; i < n; i++) d[i] = f32_to_bf16(frand(0.1f)); *data = d; break; }
    case WF_FP8: {
        uint8_t *d = malloc(n);
        for (size_t i = 0; i < n; i++) { d[i] = (uint8_t)dsv4_rng_below(&rng, 256); if ((d[i] & 0x7f) == 0x7f) d[i] = 0; }
        w.scale_cols = (cols + 127) / 128;
        *scale = malloc((size_t)((rows + 127) / 128) * w.scale_cols);
        for (int i = 0; i < (rows + 127) / 128 * w.scale_cols; i++) (*scale)[i] = (uint8_t)(120 + dsv4_rng_below(&rng, 8));
        *data = d;
        break;
    }
    default: {
        uint8_t *d = malloc(n / 2);
        for (size_t i = 0; i < n / 2; i++) d[i] = (uint8_t)dsv4_rng_below(&rng, 256);
        w.scale_cols = cols / 32;
        *scale = malloc((size_t)rows * w.scale_cols);
        for (int i = 0; i < rows * w.scale_cols; i++) (*scale)[i] = (uint8_t)(120 + dsv4_rng_below(&rng, 8));
        *data = d;
    }
    }
    w.data = *data;
    w.scale = fmt == WF_FP8 || fmt == WF_FP4 ? *scale : NULL;
    return w;
}

static void linear_close_and_batch_invariant(void **state) {
    (void)state;
    enum { ROWS = 300, COLS = 1024, T = 37 };
    dsv4_pool *pool = dsv4_pool_new(2);
    static const char *names[] = {"f32", "bf16", "fp8", "fp4"};
    float *x = malloc(sizeof(float) * T * COLS), *cpu = malloc(sizeof(float) * T * ROWS), *gpu = malloc(sizeof(float) * T * ROWS),
          *one = malloc(sizeof(float) * ROWS);
    for (int i = 0; i < T * COLS; i++) x[i] = frand(2.0f);
    for (int fmt = WF_F32; fmt <= WF_FP4; fmt++) {
        void *data = NULL;
        uint8_t *scale = NULL;
        dsv4_weight w = make_weight(fmt, ROWS, COLS, &data, &scale);
        cpu_linear(pool, &w, x, T, COLS, cpu, ROWS);
        dsv4_weight dw = w;
        dw.data = dev_copy(w.data, weight_bytes(&w));
        dw.scale = scale ? dev_copy(scale, fmt == WF_FP8 ? (size_t)((ROWS + 127) / 128) * w.scale_cols : (size_t)ROWS * w.scale_cols) : NULL;
        float *dx = dev_copy(x, sizeof(float) * T * COLS), *dy = cu_malloc(sizeof(float) * T * ROWS);
        cu_linear(NULL, &dw, dx, T, COLS, dy, ROWS);
        sync_ok();
        cu_download(gpu, dy, sizeof(float) * T * ROWS);
        const double e = rel(gpu, cpu, (size_t)T * ROWS);
        /* each token alone: the same bits as inside the batch of 37 */
        for (int t = 0; t < T; t++) {
            cu_linear(NULL, &dw, dx + (int64_t)t * COLS, 1, COLS, dy, ROWS);
            sync_ok();
            cu_download(one, dy, sizeof(float) * ROWS);
            if (memcmp(one, gpu + (int64_t)t * ROWS, sizeof(float) * ROWS)) fail_msg("linear %s: token %d alone differs from the batch", names[fmt], t);
        }
        printf("  linear %-4s %dx%d, %d tokens: relative error vs CPU %.3g; each token alone = in the batch (memcmp)\n", names[fmt],
               ROWS, COLS, T, e);
        if (!(e <= 1e-5)) fail_msg("linear %s relative error %.3g", names[fmt], e);
        cu_free((void *)dw.data); cu_free((void *)dw.scale); cu_free(dx); cu_free(dy);
        free(data); free(scale);
    }
    free(x); free(cpu); free(gpu); free(one);
    dsv4_pool_free(pool);
}

/* Few and long fp32 rows (the mHC mixes: 24 x hc dim): from SPT_MIN_T = 256 tokens cu_linear takes the tile kernel,
 * below the split kernel (k_linear.cu); every token of a batch must have the bytes of the same token alone, for the
 * Flash mix shape and shapes with a partial row block, a partial column segment and a partial token tile, and be
 * close to the CPU. */
static void linear_split_tile_equals_split(void **state) {
    (void)state;
    static const int shapes[][3] = { { 24, 16384, 300 }, { 20, 2064, 261 }, { 64, 4096, 256 } };
    dsv4_pool *pool = dsv4_pool_new(2);
    for (int si = 0; si < 3; si++) {
        const int rows = shapes[si][0], cols = shapes[si][1], T = shapes[si][2];
        float *x = malloc(sizeof(float) * T * cols), *cpu = malloc(sizeof(float) * T * rows), *gpu = malloc(sizeof(float) * T * rows),
              *one = malloc(sizeof(float) * rows);
        for (int i = 0; i < T * cols; i++) x[i] = frand(2.0f);
        void *data = NULL;
        uint8_t *scale = NULL;
        dsv4_weight w = make_weight(WF_F32, rows, cols, &data, &scale), dw = w;
        cpu_linear(pool, &w, x, T, cols, cpu, rows);
        dw.data = dev_copy(w.data, weight_bytes(&w));
        float *dx = dev_copy(x, sizeof(float) * T * cols), *dy = cu_malloc(sizeof(float) * T * rows);
        cu_linear(NULL, &dw, dx, T, cols, dy, rows);
        sync_ok();
        cu_download(gpu, dy, sizeof(float) * T * rows);
        for (int t = 0; t < T; t++) {
            cu_linear(NULL, &dw, dx + (int64_t)t * cols, 1, cols, dy, rows);
            sync_ok();
            cu_download(one, dy, sizeof(float) * rows);
            if (memcmp(one, gpu + (int64_t)t * rows, sizeof(float) * rows))
                fail_msg("split rows %dx%d: token %d alone differs from the batch of %d", rows, cols, t, T);
        }
        const double e = rel(gpu, cpu, (size_t)T * rows);
        printf("  split rows f32 %dx%d, %d tokens (tile kernel) = each token alone (split kernel) by memcmp; vs CPU %.3g\n", rows, cols,
               T, e);
        if (!(e <= 1e-5)) fail_msg("split rows %dx%d: relative error %.3g", rows, cols, e);
        cu_free((void *)dw.data); cu_free(dx); cu_free(dy);
        free(data); free(scale); free(x); free(cpu); free(gpu); free(one);
    }
    dsv4_pool_free(pool);
}

/* cu_linear_grouped (the grouped output projection in one launch) gives, for every row, the bits of cu_linear over
 * that row's group alone: one token (the decode kernel) and a tile of 9, every weight format. */
static void linear_grouped_equals_groups(void **state) {
    (void)state;
    enum { G = 4, ROWS = 256, COLS = 512, T = 9 };
    float *x = malloc(sizeof(float) * T * G * COLS), *a = malloc(sizeof(float) * T * G * ROWS), *b = malloc(sizeof(float) * T * G * ROWS);
    for (int i = 0; i < T * G * COLS; i++) x[i] = frand(2.0f);
    for (int fmt = WF_F32; fmt <= WF_FP4; fmt++) {
        void *data = NULL;
        uint8_t *scale = NULL;
        dsv4_weight w = make_weight(fmt, G * ROWS, COLS, &data, &scale), dw = w;
        dw.data = dev_copy(w.data, weight_bytes(&w));
        dw.scale = scale ? dev_copy(scale, weight_scale_bytes(&w)) : NULL;
        float *dx = dev_copy(x, sizeof(float) * T * G * COLS), *dy = cu_malloc(sizeof(float) * T * G * ROWS);
        for (int n = 1; n <= T; n += T - 1) {
            cu_linear_grouped(NULL, &dw, G, dx, n, G * COLS, COLS, dy, G * ROWS);
            sync_ok();
            cu_download(a, dy, sizeof(float) * n * G * ROWS);
            for (int g = 0; g < G; g++) {
                dsv4_weight wg = weight_rows(&dw, g * ROWS, ROWS);
                cu_linear(NULL, &wg, dx + g * COLS, n, G * COLS, dy + g * ROWS, G * ROWS);
            }
            sync_ok();
            cu_download(b, dy, sizeof(float) * n * G * ROWS);
            if (memcmp(a, b, sizeof(float) * n * G * ROWS)) fail_msg("grouped linear, format %d, %d tokens: differs from the groups alone", fmt, n);
        }
        cu_free((void *)dw.data); cu_free((void *)dw.scale); cu_free(dx); cu_free(dy);
        free(data); free(scale);
    }
    printf("  grouped linear (4 groups, 1 and 9 tokens, 4 formats) = each group alone (memcmp)\n");
    free(x); free(a); free(b);
}

/* The token split's tiles (cu_moe_split_tiles, model/expert_split.h): on a plan built on the GPU, every tile of a split
 * expert none of whose pairs goes over the bus is pointed at the absent entry E, and every other tile is left as it
 * was. Which pairs go over the bus is worked out here from the rule's statement (of a token's h distinct split
 * experts, the floor((pct h + 50) / 100) highest ids), by sorting, not by the header's function. */
static int bus_by_statement(const uint8_t *owner, const int32_t *row, int K, int e, int pct) {
    int ids[16], h = 0;
    for (int j = 0; j < K; j++) {
        int seen = owner[row[j]] != EXPERT_ON_SPLIT;
        for (int q = 0; q < h; q++) seen |= ids[q] == row[j];
        if (!seen) ids[h++] = row[j];
    }
    for (int a = 0; a < h; a++)   /* descending */
        for (int b = a + 1; b < h; b++)
            if (ids[b] > ids[a]) { const int x = ids[a]; ids[a] = ids[b]; ids[b] = x; }
    const int n_bus = (pct * h + 50) / 100;
    for (int q = 0; q < n_bus; q++)
        if (ids[q] == e) return 1;
    return 0;
}

static void split_tiles_follow_the_rule(void **state) {
    (void)state;
    enum { E = 16, K = 4, TMAX = 40 };
    uint8_t owner[E];
    for (int e = 0; e < E; e++) owner[e] = e % 3 == 0 ? 0 /* EXPERT_ON_GPU */ : EXPERT_ON_SPLIT;
    uint8_t *owner_d = dev_copy(owner, sizeof owner);
    const int Ts[] = { 1, 5, TMAX }, pcts[] = { 50, 25 };
    int absent_seen = 0, kept_seen = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int pi = 0; pi < 2; pi++) {
            const int T = Ts[ti], pct = pcts[pi], P = T * K, max_tiles = cu_moe_tiles_max(P, E, CU_MOE_TILE);
            int32_t re[TMAX * K];
            float rw[TMAX * K];
            for (int t = 0; t < T; t++)
                for (int j = 0; j < K; j++) {
                    int e, fresh;
                    do {
                        e = (int)dsv4_rng_below(&rng, E);
                        fresh = 1;
                        for (int q = 0; q < j; q++) fresh &= re[t * K + q] != e;
                    } while (!fresh);
                    re[t * K + j] = e;
                    rw[t * K + j] = 0.25f;
                }
            re[(T - 1) * K + K - 1] = re[(T - 1) * K];   /* a row naming an expert twice */
            cu_moe_plan p = { cu_malloc(sizeof(int32_t) * P), cu_malloc(sizeof(float) * P), cu_malloc(sizeof(int32_t) * max_tiles),
                              cu_malloc(sizeof(int32_t) * max_tiles), cu_malloc(sizeof(int32_t) * max_tiles), cu_malloc(sizeof(int32_t)),
                              cu_malloc(sizeof(int32_t) * P), 0 };
            int32_t *re_d = dev_copy(re, sizeof(int32_t) * P);
            float *rw_d = dev_copy(rw, sizeof(float) * P);
            cu_moe_plan_build(NULL, re_d, rw_d, T, K, E, &p);
            sync_ok();
            int32_t n_tiles, before[TMAX * K + E], after[TMAX * K + E], first[TMAX * K + E], count[TMAX * K + E], ptok[TMAX * K];
            assert_true(max_tiles <= TMAX * K + E);
            assert_int_equal(cu_download(&n_tiles, p.n_tiles, sizeof n_tiles), 0);
            assert_int_equal(cu_download(before, p.tile_expert, sizeof(int32_t) * max_tiles), 0);
            assert_int_equal(cu_download(first, p.tile_first, sizeof(int32_t) * max_tiles), 0);
            assert_int_equal(cu_download(count, p.tile_count, sizeof(int32_t) * max_tiles), 0);
            assert_int_equal(cu_download(ptok, p.pair_token, sizeof(int32_t) * P), 0);
            cu_moe_split_tiles(NULL, &p, re_d, K, E, owner_d, pct, max_tiles);
            sync_ok();
            assert_int_equal(cu_download(after, p.tile_expert, sizeof(int32_t) * max_tiles), 0);
            for (int k = 0; k < n_tiles; k++) {
                const int e = before[k];
                int gpu_pairs = owner[e] != EXPERT_ON_SPLIT;
                for (int q = first[k]; q < first[k] + count[k] && !gpu_pairs; q++)
                    gpu_pairs = bus_by_statement(owner, re + ptok[q] * K, K, e, pct);
                if (after[k] != (gpu_pairs ? e : E))
                    fail_msg("T %d, %d %%: tile %d of expert %d became %d (want %d)", T, pct, k, e, after[k], gpu_pairs ? e : E);
                absent_seen += !gpu_pairs;
                kept_seen += gpu_pairs && owner[e] == EXPERT_ON_SPLIT;
            }
            cu_free(re_d);
            cu_free(rw_d);
            cu_free(p.pair_token);
            cu_free(p.pair_weight);
            cu_free(p.tile_expert);
            cu_free(p.tile_first);
            cu_free(p.tile_count);
            cu_free(p.n_tiles);
            cu_free(p.token_pairs);
        }
    if (!absent_seen || !kept_seen) fail_msg("the routings gave %d absent and %d kept split tiles: both kinds are needed", absent_seen, kept_seen);
    printf("  split tiles: %d made absent, %d kept (with a pair over the bus)\n", absent_seen, kept_seen);
    cu_free(owner_d);
}

int main(void) {
    dsv4_error why;
    if (!dsv4_cuda_available(&why)) {
        printf("gpu kernels: skipped, needs a GPU: %s\n", why.msg);
        return 0;
    }
    dsv4_rng_seed(&rng, 2026);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(quantization_is_bit_exact),
        cmocka_unit_test(kv_encode_is_bit_exact),
        cmocka_unit_test(rmsnorm_close),
        cmocka_unit_test(linear_close_and_batch_invariant),
        cmocka_unit_test(linear_grouped_equals_groups),
        cmocka_unit_test(linear_split_tile_equals_split),
        cmocka_unit_test(split_tiles_follow_the_rule),
    };
    return cmocka_run_group_tests_name("gpu kernels vs cpu kernels", tests, NULL, NULL);
}
