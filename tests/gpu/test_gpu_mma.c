/* The tensor-core linear (backend/cuda/k_mma.cu, cu_mma.h) against a reference computed here, in double, from the
 * formats' definitions (E4M3, E2M1, UE8M0 decoded by this file, not by the kernels' helpers):
 *   - the activation packer is exact: e4m3(xq) * xs == x for act-quantized rows, including a block whose amax
 *     rounded down (the packer's scale is then half of act_quant's);
 *   - small-integer weights and activations (every partial sum exact at any precision the MMA may keep) give the
 *     exact result, ==, for FP8 and FP4 weights and each tile shape: a wrong fragment layout, k map, scale index or
 *     chunk order shows here as a wrong value;
 *   - realistic weights and activations: |y - ref| <= 2^-10 * sum_i |w_i x_i| per element (why: test comment);
 *   - batch invariance: every token of batches of T = 1, 2, 7, 8, 9, 64, 200 (at two offsets) has the bits of
 *     the same token computed alone (memcmp); rows computed through a view starting at row 40 have the bits of
 *     the full weight's rows; two runs give the same bits;
 *   - unsupported shapes and buffers are refused with an error code and one line, and launch nothing.
 * `test_gpu_mma --bench` times the kernel instead: weight GB/s at T = 1 and 8, TFLOPS at T = 512, 4096, 8192, for
 * FP8 and FP4 weights of 4096 x 4096, 32768 x 1024, 2048 x 4096, 1024 x 4096 (wq_a), 512 x 4096 (wkv), with
 * k_linear's time alongside for T <= 512 and, at T <= 8, k_mma.cu's small tiles beside the streaming kernel.
 * Every test runs twice: with the `stream` argument 1 (the default) and 0.
 * Building with NVFLAGS including -DDSV4_MMA_BUG (k_mma.cu swaps two activation words of one MMA;
 * tools/gpu/stage_mma_bug.sh) must make the exact and accuracy tests fail. tools/gpu/run_mma.sh runs all of it on
 * the GPU machine. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cuda/cu_mma.h"
#include "backend/cuda/cu_runtime.h"
#include "model/expert_place.h"   /* EP_ABSENT_ROW */
#include "model/formats.h"   /* only to make inputs: f32_to_e4m3 / f32_to_e2m1 / act_quant_fp8_ref */
#include "model/tiny.h"      /* dsv4_rng */
#include "model/weight.h"

#ifdef MMA_TEST_SHIM
/* The device is the host (tools/gpu/shim/shim_mma.sh runs the kernels as fibers). */
void *cu_malloc(size_t n) { return aligned_alloc(256, (n + 255) / 256 * 256); }
void cu_free(void *p) { free(p); }
int cu_upload(void *d, const void *s, size_t n) { memcpy(d, s, n); return 0; }
int cu_download(void *d, const void *s, size_t n) { memcpy(d, s, n); return 0; }
int cu_fill_bytes(void *d, int b, size_t n) { memset(d, b, n); return 0; }
int cu_finish(cu_stream st, const char *what, dsv4_error *err) { (void)st; (void)what; (void)err; return 0; }
#else
#include <cuda_runtime.h>
#endif

static dsv4_rng rng;
/* The `stream` argument of every cu_mma_* call here: main runs the tests with 1 (the model's default: up to 8 tokens
 * through k_mma_stream.cu) and again with 0 (k_mma.cu's small tiles); test_gpu_stream compares the two by memcmp. */
static int stream_on = 1;

/* ---- the formats, from their definitions ------------------------------------------------------------------ */

/* E4M3 (fn): sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal m * 2^-9; S.1111.111 NaN. */
static double ref_e4m3(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    double v;
    if (e == 15 && m == 7) v = NAN;
    else if (e == 0) v = ldexp(m, -9);
    else v = ldexp(8 + m, e - 10);   /* (1 + m/8) 2^(e-7) */
    return (b & 0x80) ? -v : v;
}
/* E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit; exponent 0 is subnormal m * 0.5. */
static double ref_e2m1(uint8_t c) {
    const int e = (c >> 1) & 3, m = c & 1;
    const double v = e == 0 ? 0.5 * m : ldexp(2 + m, e - 2);   /* (1 + m/2) 2^(e-1) */
    return (c & 8) ? -v : v;
}
static double ref_ue8m0(uint8_t b) { return ldexp(1.0, (int)b - 127); }

/* Element (r, i) of a weight view (host pointers): FP8 scale per 128x128 block of global rows, FP4 per 32 columns. */
static double ref_w(const dsv4_weight *w, int r, int i) {
    const uint8_t *d = w->data;
    if (w->fmt == WF_FP8)
        return ref_e4m3(d[(int64_t)r * w->cols + i]) * ref_ue8m0(w->scale[(int64_t)((w->row0 + r) / 128) * w->scale_cols + i / 128]);
    const uint8_t b = d[(int64_t)r * (w->cols / 2) + i / 2];
    return ref_e2m1((i & 1) ? b >> 4 : b & 15) * ref_ue8m0(w->scale[(int64_t)(w->row0 + r) * w->scale_cols + i / 32]);
}

/* ---- inputs ----------------------------------------------------------------------------------------------- */

typedef struct {
    dsv4_weight h, d;   /* host and device copies of one weight */
} tweight;

static int ilog2_ceil(double v) { return (int)ceil(log2(v)); }

/* Realistic: per scale block a standard deviation 0.02 * 2^[-2, 2], normal values, the block's power-of-two scale
 * from its amax (FP8: / 448, FP4: / 6), values rounded to the format. Integer: values in {0, +-1, +-2}, scale
 * 2^0 or 2^-1. */
static tweight make_weight(int fmt, int N, int K, int integer) {
    tweight t;
    dsv4_weight *w = &t.h;
    memset(w, 0, sizeof *w);
    w->fmt = fmt;
    w->rows = N;
    w->cols = K;
    const int fp4 = fmt == WF_FP4;
    const size_t dbytes = fp4 ? (size_t)N * K / 2 : (size_t)N * K;
    w->scale_cols = fp4 ? K / 32 : K / 128;
    const size_t sbytes = fp4 ? (size_t)N * w->scale_cols : (size_t)((N + 127) / 128) * w->scale_cols;
    uint8_t *data = calloc(dbytes, 1), *scale = calloc(sbytes, 1);
    float *v = malloc(sizeof(float) * 128 * 128);
    const int br = fp4 ? 1 : 128, bc = fp4 ? 32 : 128;
    for (int r0 = 0; r0 < N; r0 += br)
        for (int c0 = 0; c0 < K; c0 += bc) {
            const int nr = N - r0 < br ? N - r0 : br;
            const double sd = 0.02 * ldexp(1.0, (int)dsv4_rng_below(&rng, 5) - 2);
            double amax = 1e-30;
            for (int k = 0; k < nr * bc; k++) {
                v[k] = (float)(dsv4_rng_normal(&rng) * sd);
                if (fabs(v[k]) > amax) amax = fabs(v[k]);
            }
            const int e = integer ? -(int)dsv4_rng_below(&rng, 2) : ilog2_ceil(amax / (fp4 ? 6.0 : 448.0));
            const uint8_t sb = (uint8_t)(127 + e);
            if (fp4) scale[(int64_t)r0 * w->scale_cols + c0 / 32] = sb;
            else scale[(int64_t)(r0 / 128) * w->scale_cols + c0 / 128] = sb;
            for (int rr = 0; rr < nr; rr++)
                for (int cc = 0; cc < bc; cc++) {
                    const int r = r0 + rr, i = c0 + cc;
                    uint8_t code;
                    if (integer) {
                        const int k = (int)dsv4_rng_below(&rng, 5) - 2;   /* -2 .. 2 */
                        if (fp4) code = (uint8_t)((k < 0 ? 8 : 0) | (k == 0 ? 0 : abs(k) == 1 ? 2 : 4));
                        else code = (uint8_t)((k < 0 ? 0x80 : 0) | (k == 0 ? 0 : abs(k) == 1 ? 0x38 : 0x40));
                    } else {
                        const float q = (float)(v[rr * bc + cc] / ldexp(1.0, e));
                        code = fp4 ? f32_to_e2m1(q) : f32_to_e4m3(q);
                    }
                    if (fp4) data[(int64_t)r * (K / 2) + i / 2] |= (uint8_t)((i & 1) ? code << 4 : code);
                    else data[(int64_t)r * K + i] = code;
                }
        }
    free(v);
    w->data = data;
    w->scale = scale;
    t.d = *w;
    void *dd = cu_malloc(dbytes), *ds = cu_malloc(sbytes);
    assert_non_null(dd);
    assert_non_null(ds);
    assert_int_equal(cu_upload(dd, data, dbytes), 0);
    assert_int_equal(cu_upload(ds, scale, sbytes), 0);
    t.d.data = dd;
    t.d.scale = ds;
    return t;
}

static void free_weight(tweight *t) {
    free((void *)t->h.data);
    free((void *)t->h.scale);
    cu_free((void *)t->d.data);
    cu_free((void *)t->d.scale);
}

/* T act-quantized rows of K: realistic (normal values times 2^[-8, 8] per 128-column block, 1 in 16 exactly 0), or
 * integer ({0, +-1, +-2} times 2^0 or 2^1 per block, which act_quant leaves as they are). */
static float *make_act(int T, int K, int integer) {
    float *x = malloc(sizeof(float) * T * K);
    for (int t = 0; t < T; t++) {
        for (int c0 = 0; c0 < K; c0 += 128) {
            const int e = integer ? (int)dsv4_rng_below(&rng, 2) : (int)dsv4_rng_below(&rng, 17) - 8;
            for (int i = c0; i < K && i < c0 + 128; i++) {
                if (integer) x[(int64_t)t * K + i] = (float)ldexp((int)dsv4_rng_below(&rng, 5) - 2, e);
                else x[(int64_t)t * K + i] = dsv4_rng_below(&rng, 16) == 0 ? 0.0f : (float)ldexp(dsv4_rng_normal(&rng), e);
            }
        }
        act_quant_fp8_ref(x + (int64_t)t * K, K, 128);
    }
    return x;
}

/* The packed activations of T rows on the device. */
typedef struct {
    uint8_t *q;
    float *s;
    int ldq, lds;
} tact;

static void sync_ok(const char *what) {
    dsv4_error err;
    if (cu_finish(NULL, what, &err)) fail_msg("%s", err.msg);
}

static tact pack(const float *x, int T, int K) {
    tact a;
    a.ldq = (K + 15) / 16 * 16;
    a.lds = (K + 127) / 128;
    float *dx = cu_malloc(sizeof(float) * T * K);
    a.q = cu_malloc((size_t)T * a.ldq);
    a.s = cu_malloc(sizeof(float) * T * a.lds);
    assert_true(dx && a.q && a.s);
    assert_int_equal(cu_upload(dx, x, sizeof(float) * T * K), 0);
    dsv4_error err;
    if (cu_mma_pack_act(NULL, dx, K, T, K, a.q, a.ldq, a.s, a.lds, &err)) fail_msg("%s", err.msg);
    sync_ok("pack");
    cu_free(dx);
    return a;
}

static void free_act(tact *a) {
    cu_free(a->q);
    cu_free(a->s);
}

/* y[T][N] for tokens [t0, t0 + T) of a (host copy); out_bf16 as cu_mma_linear's. */
static void run_o(const dsv4_weight *dw, const tact *a, int t0, int T, float *y, int out_bf16) {
    const int N = dw->rows;
    float *dy = cu_malloc(sizeof(float) * T * N);
    assert_non_null(dy);
    dsv4_error err;
    if (cu_mma_linear(NULL, dw, a->q + (int64_t)t0 * a->ldq, a->ldq, a->s + (int64_t)t0 * a->lds, a->lds, T, dy, N, out_bf16, stream_on, &err))
        fail_msg("%s", err.msg);
    sync_ok("mma linear");
    assert_int_equal(cu_download(y, dy, sizeof(float) * T * N), 0);
    cu_free(dy);
}

static void run(const dsv4_weight *dw, const tact *a, int t0, int T, float *y) { run_o(dw, a, t0, T, y, 0); }

/* The weight decoded once (every value times its scale is exact in float: 4 significant bits, exponents in range). */
static float *ref_decode(const dsv4_weight *w) {
    float *d = malloc(sizeof(float) * w->rows * w->cols);
    for (int r = 0; r < w->rows; r++)
        for (int i = 0; i < w->cols; i++) d[(int64_t)r * w->cols + i] = (float)ref_w(w, r, i);
    return d;
}

/* The sum (double: each product is exact, the sum's rounding 2^-53) and the sum of |products| of a decoded row
 * against token x. */
static void ref_dot(const float *wrow, int K, const float *x, double *sum, double *abs_sum) {
    double s = 0, a = 0;
    for (int i = 0; i < K; i++) {
        const double p = (double)wrow[i] * x[i];
        s += p;
        a += fabs(p);
    }
    *sum = s;
    *abs_sum = a;
}

/* ---- tests ------------------------------------------------------------------------------------------------- */

static void pack_is_exact(void **state) {
    (void)state;
    enum { T = 37, K = 1120 };
    float *x = make_act(T, K, 0);
    /* row 0, block 0: amax 0.4395 -> act_quant's s = 2^-9, q = 225 rounds to 224; the packer's scale is 2^-10 */
    for (int i = 0; i < 128; i++) x[i] = (float)(i == 5 ? 0.4395 : 0.001 * i);
    act_quant_fp8_ref(x, K, 128);
    tact a = pack(x, T, K);
    uint8_t *q = malloc((size_t)T * a.ldq);
    float *s = malloc(sizeof(float) * T * a.lds);
    assert_int_equal(cu_download(q, a.q, (size_t)T * a.ldq), 0);
    assert_int_equal(cu_download(s, a.s, sizeof(float) * T * a.lds), 0);
    for (int t = 0; t < T; t++)
        for (int b = 0; b < a.lds; b++) {
            int e;
            if (frexp(s[t * a.lds + b], &e) != 0.5) fail_msg("pack: scale %g of row %d block %d is not a power of two", s[t * a.lds + b], t, b);
        }
    for (int t = 0; t < T; t++)
        for (int i = 0; i < K; i++) {
            const double v = ref_e4m3(q[(int64_t)t * a.ldq + i]) * s[t * a.lds + i / 128];
            if (v != (double)x[(int64_t)t * K + i])
                fail_msg("pack: row %d column %d: %.9g * %g != %.9g", t, i, ref_e4m3(q[(int64_t)t * a.ldq + i]), s[t * a.lds + i / 128],
                         x[(int64_t)t * K + i]);
        }
    if (s[0] != ldexpf(1.0f, -10)) fail_msg("pack: the rounded-down block's scale is %g, expected 2^-10", s[0]);
    printf("  pack: e4m3(q) * s == x for %d x %d act-quantized values (a rounded-down block takes s/2)\n", T, K);
    free(q); free(s); free(x);
    free_act(&a);
}

#ifndef MMA_TEST_SHIM
/* The packing's f32 -> E4M3 (hardware cvt.rn.satfinite by default) = the code search, for every float. */
static void e4m3_conversion_every_float(void **state) {
    (void)state;
    unsigned long long bad = 0;
    unsigned int first = 0;
    dsv4_error err;
    if (cu_mma_e4m3_check(&bad, &first, &err)) fail_msg("%s", err.msg);
    if (bad) fail_msg("f32 -> e4m3: %llu of 2^32 floats differ from the code search (the first 0x%08x)", bad, first);
    printf("  f32 -> e4m3: all 2^32 floats = the code search\n");
}

/* The E4M3 MMA spelled out (cu_mma_frag.cuh's mma_e4m3_written: two fp16 MMAs and an addition, as ptxas builds the
 * sm_90 instruction, run 90) gives the instruction's bits: random fragments, random accumulators. The definition a
 * kernel without mma.sync (wgmma on fp16 operands) must follow to keep the linears' bits. */
static void mma_written_out_equals_instruction(void **state) {
    (void)state;
    unsigned long long bad = 0, checked = 0;
    dsv4_error err;
    if (cu_mma_emu_check(&bad, &checked, &err)) fail_msg("%s", err.msg);
    if (bad)
        fail_msg("mma_e4m3_written: %llu of %llu elements differ from mma.sync e4m3 (from0: beyond a zero's sign)", bad, checked);
    printf("  mma_e4m3_written (two fp16 MMAs + FADD) = mma.sync e4m3: %llu elements, 0 differ\n", checked);
}
#endif

/* bf16 by round to nearest even on the bits (written here, not taken from the library under test). */
static float host_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* The step packs raw rows (cu_mma.h: packing quantizes by act_quant's rule) and keeps the fp32 act_quant copy for
 * CUDA-core linears only: the linear of packed raw rows must equal, bit for bit, the linear of the packed act_quant
 * copy (the scale of a rounded-down block halves, every sum doubles and is halved back exactly). And out_bf16
 * gives each output rounded to bf16, nothing else. */
static void raw_packing_and_bf16_output(void **state) {
    (void)state;
    enum { T = 41, N = 300 };
    for (int fp4 = 0; fp4 < 2; fp4++) {
        const int K = fp4 ? 1120 : 1024, fmt = fp4 ? WF_FP4 : WF_FP8;
        tweight w = make_weight(fmt, N, K, 0);
        float *raw = malloc(sizeof(float) * T * K), *quant = malloc(sizeof(float) * T * K);
        for (int i = 0; i < T * K; i++) raw[i] = (float)ldexp(dsv4_rng_normal(&rng), (int)dsv4_rng_below(&rng, 9) - 4);
        /* in every 5th row a first block whose amax (0.4395 = 225 s, s = 2^-9) rounds down to 224 s */
        for (int t = 0; t < T; t += 5) {
            raw[(int64_t)t * K + 3] = 0.4395f;
            for (int i = 4; i < 128; i++) raw[(int64_t)t * K + i] = 0.001f * (float)(i % 50) - 0.02f;
        }
        memcpy(quant, raw, sizeof(float) * T * K);
        for (int t = 0; t < T; t++) act_quant_fp8_ref(quant + (int64_t)t * K, K, 128);
        tact ar = pack(raw, T, K), aq = pack(quant, T, K);
        float *yr = malloc(sizeof(float) * T * N), *yq = malloc(sizeof(float) * T * N), *yb = malloc(sizeof(float) * T * N);
        run(&w.d, &ar, 0, T, yr);
        run(&w.d, &aq, 0, T, yq);
        if (memcmp(yr, yq, sizeof(float) * T * N)) fail_msg("%s: the linear of packed raw rows differs from that of their act_quant copy", fp4 ? "FP4" : "FP8");
        run_o(&w.d, &ar, 0, T, yb, 1);
        int rounded = 0;
        for (int i = 0; i < T * N; i++) {
            const float want = host_bf16(yr[i]);
            if (memcmp(&yb[i], &want, 4)) fail_msg("%s: out_bf16 element %d is %.9g, bf16 of %.9g is %.9g", fp4 ? "FP4" : "FP8", i, yb[i], yr[i], want);
            rounded += yb[i] != yr[i];
        }
        if (!rounded) fail_msg("%s: out_bf16 rounded nothing (the test data should need rounding)", fp4 ? "FP4" : "FP8");
        printf("  %s %dx%d, %d tokens: packed raw rows = packed act_quant rows (memcmp); out_bf16 = bf16 of the output (%d of %d changed)\n",
               fp4 ? "FP4" : "FP8", N, K, T, rounded, T * N);
        free(raw); free(quant); free(yr); free(yq); free(yb);
        free_act(&ar);
        free_act(&aq);
        free_weight(&w);
    }
}

/* One format and token count: y == the exact reference (integers) or within the bound (realistic). */
static void check_against_ref(int fmt, int N, int K, int T, int integer) {
    tweight w = make_weight(fmt, N, K, integer);
    float *x = make_act(T, K, integer), *y = malloc(sizeof(float) * T * N);
    tact a = pack(x, T, K);
    run(&w.d, &a, 0, T, y);
    float *wref = ref_decode(&w.h);
    double worst = 0, err_max = 0, ymax = 0;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < N; r++) {
            double ref, abs_sum;
            ref_dot(wref + (int64_t)r * K, K, x + (int64_t)t * K, &ref, &abs_sum);
            const double got = y[(int64_t)t * N + r], err = fabs(got - ref);
            if (integer) {
                if (!(got == ref)) fail_msg("%s %dx%d, %d tokens, integer inputs: y[%d][%d] = %.9g, exact %.9g (diff %.3g)",
                                            fmt == WF_FP4 ? "FP4" : "FP8", N, K, T, t, r, got, ref, got - ref);
                continue;
            }
            /* The bound: products of E4M3 values are exact; an FP8 MMA on H100 adds its 32 products and C with an
             * e8m13 accumulator, truncating (Khattak & Mikaitis, "Accurate models of NVIDIA tensor cores", 2025;
             * DeepSeek-V3's report measured ~14 bits), so each MMA loses at most ~2^-13 of the magnitude of what it
             * adds; a chunk chains at most 4 MMAs from a fresh fragment: <= 2^-11 of the chunk's sum |w x|. The fp32
             * fmaf steps add (K/32 + 3) 2^-24 at most. 2^-10 of sum |w x| covers both; a wrong layout, k map or
             * scale gives errors of the order of |y| itself, ~ sum |w x| / sqrt(K) >= 2^-6 sum |w x| here. */
            const double bound = ldexp(abs_sum, -10) + 1e-30;
            if (!(err <= bound))
                fail_msg("%s %dx%d, %d tokens: y[%d][%d] = %.9g, reference %.9g, error %.3g > bound %.3g", fmt == WF_FP4 ? "FP4" : "FP8", N,
                         K, T, t, r, got, ref, err, bound);
            if (abs_sum > 0 && err / abs_sum > worst) worst = err / abs_sum;
            if (err > err_max) err_max = err;
            if (fabs(ref) > ymax) ymax = fabs(ref);
        }
    if (integer) printf("  %s %dx%d, %d tokens, integer inputs: exact (==)\n", fmt == WF_FP4 ? "FP4" : "FP8", N, K, T);
    else
        printf("  %s %dx%d, %d tokens: max |err| / sum|wx| = %.3g (bound 2^-10), max |err| / max |y| = %.3g\n",
               fmt == WF_FP4 ? "FP4" : "FP8", N, K, T, worst, ymax > 0 ? err_max / ymax : 0);
    free(x); free(y); free(wref);
    free_act(&a);
    free_weight(&w);
}

static void exact_on_integers(void **state) {
    (void)state;
    static const int Ts[] = { 5, 21, 40 };   /* the three tile shapes: <= 8, <= 32, more */
    for (int k = 0; k < 3; k++) {
        check_against_ref(WF_FP8, 200, 1024, Ts[k], 1);
        check_against_ref(WF_FP4, 200, 1056, Ts[k], 1);   /* 8 chunks of 128 and one of 32 columns */
    }
}

static void close_on_realistic(void **state) {
    (void)state;
    check_against_ref(WF_FP8, 333, 2048, 70, 0);
    check_against_ref(WF_FP4, 333, 1120, 70, 0);
#ifdef MMA_TEST_SHIM
    check_against_ref(WF_FP8, 256, 4096, 3, 0);
    check_against_ref(WF_FP4, 256, 4096, 3, 0);
#else
    check_against_ref(WF_FP8, 4096, 4096, 3, 0);
    check_against_ref(WF_FP4, 1024, 4096, 3, 0);
#endif
}

static void batch_invariant_and_deterministic(void **state) {
    (void)state;
    enum { N = 333, P = 200 };
    static const int Ts[] = { 1, 2, 7, 8, 9, 64, 200 };
    for (int fp4 = 0; fp4 < 2; fp4++) {
        const int K = fp4 ? 1120 : 1024, fmt = fp4 ? WF_FP4 : WF_FP8;
        tweight w = make_weight(fmt, N, K, 0);
        float *x = make_act(P, K, 0), *alone = malloc(sizeof(float) * P * N), *y = malloc(sizeof(float) * P * N),
              *y2 = malloc(sizeof(float) * P * N);
        tact a = pack(x, P, K);
        for (int t = 0; t < P; t++) run(&w.d, &a, t, 1, alone + (int64_t)t * N);
        for (int k = 0; k < (int)(sizeof Ts / sizeof Ts[0]); k++) {
            const int T = Ts[k];
            for (int t0 = 0; t0 <= P - T; t0 += (P - T > 0 ? P - T : 1)) {
                run(&w.d, &a, t0, T, y);
                for (int t = 0; t < T; t++)
                    if (memcmp(y + (int64_t)t * N, alone + (int64_t)(t0 + t) * N, sizeof(float) * N))
                        fail_msg("%s: token %d in a batch of %d (from %d) differs from the token alone", fp4 ? "FP4" : "FP8", t0 + t, T, t0);
            }
        }
        run(&w.d, &a, 0, P, y);
        run(&w.d, &a, 0, P, y2);
        if (memcmp(y, y2, sizeof(float) * P * N)) fail_msg("%s: two runs of %d tokens differ", fp4 ? "FP4" : "FP8", P);
        /* rows through a view from row 40 (other tiles, FP8 scale rows from row0) = the full weight's rows */
        const dsv4_weight view = weight_rows(&w.d, 40, 200);
        float *yv = malloc(sizeof(float) * P * 200);
        static const int Tv[] = { 1, 9, 200 };
        for (int k = 0; k < 3; k++) {
            run(&view, &a, 0, Tv[k], yv);
            for (int t = 0; t < Tv[k]; t++)
                if (memcmp(yv + (int64_t)t * 200, alone + (int64_t)t * N + 40, sizeof(float) * 200))
                    fail_msg("%s: rows 40..239 through a view differ from the full weight's (token %d of %d)", fp4 ? "FP4" : "FP8", t, Tv[k]);
        }
        printf("  %s %dx%d: every token of batches of 1, 2, 7, 8, 9, 64, 200 = alone (memcmp); view rows = full rows; two runs equal\n",
               fp4 ? "FP4" : "FP8", N, K);
        free(yv); free(x); free(alone); free(y); free(y2);
        free_act(&a);
        free_weight(&w);
    }
}

static void refuses_bad_shapes(void **state) {
    (void)state;
    tweight w8 = make_weight(WF_FP8, 16, 256, 0), w4 = make_weight(WF_FP4, 16, 64, 0);
    float *x = make_act(2, 256, 0);
    tact a = pack(x, 2, 256);
    float *dy = cu_malloc(sizeof(float) * 2 * 16);
    assert_non_null(dy);
    assert_int_equal(cu_fill_bytes(dy, 0x55, sizeof(float) * 2 * 16), 0);
    dsv4_error err;
    dsv4_weight bad = w8.d;
    bad.fmt = WF_BF16;
    assert_int_equal(cu_mma_linear(NULL, &bad, a.q, a.ldq, a.s, a.lds, 2, dy, 16, 0, stream_on, &err), DSV4_E_UNSUPPORTED);
    assert_false(cu_mma_takes(&bad));
    assert_true(err.msg[0] != 0);
    bad = w8.d;
    bad.cols = 96;   /* FP8: not a multiple of 128 */
    assert_int_equal(cu_mma_linear(NULL, &bad, a.q, a.ldq, a.s, a.lds, 2, dy, 16, 0, stream_on, &err), DSV4_E_ARG);
    assert_false(cu_mma_takes(&bad));
    bad = w4.d;
    bad.cols = 48;   /* FP4: not a multiple of 32 */
    assert_int_equal(cu_mma_linear(NULL, &bad, a.q, a.ldq, a.s, a.lds, 2, dy, 16, 0, stream_on, &err), DSV4_E_ARG);
    assert_false(cu_mma_takes(&bad));
    bad = w8.d;
    bad.data = (const uint8_t *)w8.d.data + 8;   /* misaligned FP8 rows */
    assert_int_equal(cu_mma_linear(NULL, &bad, a.q, a.ldq, a.s, a.lds, 2, dy, 16, 0, stream_on, &err), DSV4_E_ARG);
    assert_false(cu_mma_takes(&bad));
    assert_int_equal(cu_mma_linear(NULL, &w8.d, a.q + 1, a.ldq, a.s, a.lds, 2, dy, 16, 0, stream_on, &err), DSV4_E_ARG);   /* misaligned x */
    assert_int_equal(cu_mma_linear(NULL, &w8.d, a.q, 250, a.s, a.lds, 2, dy, 16, 0, stream_on, &err), DSV4_E_ARG);         /* ldq < K */
    assert_int_equal(cu_mma_linear(NULL, &w8.d, a.q, a.ldq, a.s, 1, 2, dy, 16, 0, stream_on, &err), DSV4_E_ARG);           /* lds too small */
    assert_int_equal(cu_mma_linear(NULL, &w8.d, a.q, a.ldq, a.s, a.lds, 2, dy, 15, 0, stream_on, &err), DSV4_E_ARG);       /* ldy < N */
    assert_int_equal(cu_mma_linear(NULL, &w8.d, a.q, a.ldq, a.s, a.lds, -1, dy, 16, 0, stream_on, &err), DSV4_E_ARG);
    assert_int_equal(cu_mma_pack_act(NULL, (const float *)dy, 256, 2, 256, a.q, 264, a.s, a.lds, &err), DSV4_E_ARG);   /* ldq % 16 */
    assert_int_equal(cu_mma_linear(NULL, &w8.d, a.q, a.ldq, a.s, a.lds, 0, dy, 16, 0, stream_on, &err), 0);   /* no tokens: nothing to do */
    sync_ok("refusals");
    uint32_t back[32];
    assert_int_equal(cu_download(back, dy, sizeof back), 0);
    for (int i = 0; i < 32; i++)
        if (back[i] != 0x55555555u) fail_msg("a refused call wrote its output");
    printf("  refused: BF16 weight, FP8 cols %% 128, FP4 cols %% 32, misaligned weight / x, short strides, T < 0 (nothing written)\n");
    cu_free(dy);
    free(x);
    free_act(&a);
    free_weight(&w8);
    free_weight(&w4);
}

/* ---- the FP4 vector loads and the expert tiles --------------------------------------------------------------- */

/* A copy of FP4 weight w with its data `offset` bytes and its scales offset / 4 bytes past a 256-byte boundary (an
 * FP4 weight in a file need only be 4-byte aligned): the vector paths must fall back to word loads there, and mode
 * 2 to byte loads for the scales, with the same bits. */
static dsv4_weight offset_copy(const tweight *w, int offset, void **base, void **sbase) {
    const size_t db = (size_t)w->h.rows * w->h.cols / 2, sb = (size_t)w->h.rows * w->h.scale_cols;
    uint8_t *d = cu_malloc(db + 256), *sc = cu_malloc(sb + 256);
    assert_true(d && sc);
    assert_int_equal(cu_upload(d + offset, w->h.data, db), 0);
    assert_int_equal(cu_upload(sc + offset / 4, w->h.scale, sb), 0);
    *base = d;
    *sbase = sc;
    dsv4_weight v = w->d;
    v.data = d + offset;
    v.scale = sc + offset / 4;
    return v;
}

/* cu_mma_fp4_vec(1) and (2) (lanes load 16 bytes, quads transpose; scale bytes or words) and cu_mma_fp4_vec(0) (a
 * 4-byte word a lane and MMA) must give the same bits for every tile shape, a last chunk of 1, 2 or 3 scale blocks,
 * a partial row tile, scale rows of a multiple of 4 bytes or not, weights and scales aligned or not: the shuffles
 * hand every MMA the very words and scales the word-wise loads give it. */
static void fp4_vector_loads_equal_word_loads(void **state) {
    (void)state;
    static const int shapes[][2] = { { 333, 1120 }, { 40, 1056 }, { 48, 2112 }, { 64, 4096 } };   /* last chunk: 3, 1, 2, 4 blocks */
    static const int Ts[] = { 1, 2, 5, 8, 9, 21, 33, 40 };
    enum { TMAX = 40 };
    const int build_mode = cu_mma_fp4_vec(0), stream_was = stream_on;
    stream_on = 0;   /* the modes are k_mma.cu's: its kernel at every T */
    for (int k = 0; k < 4; k++) {
        const int N = shapes[k][0], K = shapes[k][1];
        tweight w = make_weight(WF_FP4, N, K, 0);
        float *x = make_act(TMAX, K, 0), *yv = malloc(sizeof(float) * TMAX * N), *yw = malloc(sizeof(float) * TMAX * N);
        tact a = pack(x, TMAX, K);
        for (int off = 0; off < 16; off += 4) {
            void *base = NULL, *sbase = NULL;
            const dsv4_weight dw = off ? offset_copy(&w, off, &base, &sbase) : w.d;
            for (int i = 0; i < (int)(sizeof Ts / sizeof Ts[0]); i++) {
                const int T = Ts[i];
                cu_mma_fp4_vec(0);
                run(&dw, &a, 0, T, yw);
                for (int mode = 1; mode <= 2; mode++) {
                    cu_mma_fp4_vec(mode);
                    run(&dw, &a, 0, T, yv);
                    if (memcmp(yv, yw, sizeof(float) * T * N))
                        fail_msg("FP4 %dx%d, %d tokens, data at +%d, scales at +%d: the vector loads' (mode %d) output differs from the "
                                 "word loads'", N, K, T, off, off / 4, mode);
                }
            }
            if (base) cu_free(base);
            if (sbase) cu_free(sbase);
        }
        printf("  FP4 %dx%d: vector loads (modes 1, 2) = word loads (memcmp) at T = 1, 2, 5, 8, 9, 21, 33, 40, data / scales aligned "
               "and at +4 / +1, +8 / +2, +12 / +3\n", N, K);
        free(x); free(yv); free(yw);
        free_act(&a);
        free_weight(&w);
    }
    cu_mma_fp4_vec(build_mode);
    stream_on = stream_was;
}

/* cu_mma_linear_pair: both outputs have the bits of cu_mma_linear on each weight (the taller or the shorter weight
 * first, every tile shape); weights of different widths are refused, writing nothing. */
static void linear_pair_equals_two(void **state) {
    (void)state;
    static const int Ts[] = { 1, 5, 9, 33, 40 };
    enum { TMAX = 40 };
    for (int fp4 = 0; fp4 < 2; fp4++) {
        const int K = fp4 ? 1120 : 1024, fmt = fp4 ? WF_FP4 : WF_FP8, Na = fp4 ? 40 : 333, Nb = fp4 ? 333 : 200;
        tweight wa = make_weight(fmt, Na, K, 0), wb = make_weight(fmt, Nb, K, 0);
        float *x = make_act(TMAX, K, 0);
        tact a = pack(x, TMAX, K);
        float *ra = malloc(sizeof(float) * TMAX * Na), *rb = malloc(sizeof(float) * TMAX * Nb), *ya = malloc(sizeof(float) * TMAX * Na),
              *yb = malloc(sizeof(float) * TMAX * Nb);
        float *dya = cu_malloc(sizeof(float) * TMAX * Na), *dyb = cu_malloc(sizeof(float) * TMAX * Nb);
        assert_true(dya && dyb);
        for (int i = 0; i < (int)(sizeof Ts / sizeof Ts[0]); i++) {
            const int T = Ts[i];
            run(&wa.d, &a, 0, T, ra);
            run(&wb.d, &a, 0, T, rb);
            dsv4_error err;
            if (cu_mma_linear_pair(NULL, &wa.d, dya, Na, &wb.d, dyb, Nb, a.q, a.ldq, a.s, a.lds, T, 0, stream_on, &err)) fail_msg("%s", err.msg);
            sync_ok("linear pair");
            assert_int_equal(cu_download(ya, dya, sizeof(float) * T * Na), 0);
            assert_int_equal(cu_download(yb, dyb, sizeof(float) * T * Nb), 0);
            if (memcmp(ya, ra, sizeof(float) * T * Na) || memcmp(yb, rb, sizeof(float) * T * Nb))
                fail_msg("%s %d tokens: the pair's outputs (%d and %d rows) differ from the two linears'", fp4 ? "FP4" : "FP8", T, Na, Nb);
        }
        /* a different width: refused, nothing written */
        tweight wc = make_weight(fmt, 16, fp4 ? 1056 : 1152, 0);
        assert_int_equal(cu_fill_bytes(dya, 0x55, sizeof(float) * Na), 0);
        dsv4_error err;
        assert_int_equal(cu_mma_linear_pair(NULL, &wa.d, dya, Na, &wc.d, dyb, 16, a.q, a.ldq, a.s, a.lds, 1, 0, stream_on, &err), DSV4_E_ARG);
        assert_true(err.msg[0] != 0);
        sync_ok("refused pair");
        uint32_t back[16];
        assert_int_equal(cu_download(back, dya, sizeof back), 0);
        for (int i = 0; i < 16; i++)
            if (back[i] != 0x55555555u) fail_msg("a refused pair wrote its output");
        printf("  %s %dx%d + %dx%d: the pair's outputs = the two linears' (memcmp) at T = 1, 5, 9, 33, 40; another width refused\n",
               fp4 ? "FP4" : "FP8", Na, K, Nb, K);
        free(ra); free(rb); free(ya); free(yb); free(x);
        cu_free(dya); cu_free(dyb);
        free_act(&a);
        free_weight(&wa); free_weight(&wb); free_weight(&wc);
    }
}

/* mHC's post step of one token written from its definition (cu_kernels.h cu_hc_post): stream k = bf16(post[k] f +
 * sum_j comb[j][k] old_j), j in order, each product rounded to float on its own (volatile: no contraction here). */
static void host_hc_post(int official, const float *f, const float *mx, float *x, int d) {
    for (int e = 0; e < d; e++) {
        float old[4];
        for (int j = 0; j < 4; j++) old[j] = x[(int64_t)j * d + e];
        for (int k = 0; k < 4; k++) {
            volatile float p = mx[k] * f[e];
            float s = p;
            for (int j = 0; j < 4; j++) {
                volatile float q = mx[8 + j * 4 + k] * old[j];
                s = s + q;
            }
            x[(int64_t)k * d + e] = official ? host_bf16(s) : s;
        }
    }
}

/* cu_mma_linear_post (wo_b with mHC's post in its epilogue): at T = 1..8 the streams X it leaves are, bit for bit,
 * cu_mma_linear's output (rounded to bf16 when official) put through the post step above; it declines — returning
 * 0 and touching nothing — past 8 tokens, with the streaming path, for hc != 4 and a weight of other than d rows. */
static void linear_post_equals_linear_then_post(void **state) {
    (void)state;
    enum { TMAX = 9, MIX = 72 };
    for (int fp4 = 0; fp4 < 2; fp4++)
        for (int official = 0; official < 2; official++) {
            const int K = fp4 ? 1120 : 1024, d = fp4 ? 176 : 384, fmt = fp4 ? WF_FP4 : WF_FP8;
            tweight w = make_weight(fmt, d, K, 0);
            float *x = make_act(TMAX, K, 0);
            tact a = pack(x, TMAX, K);
            float *X0 = malloc(sizeof(float) * TMAX * 4 * d), *want = malloc(sizeof(float) * TMAX * 4 * d),
                  *got = malloc(sizeof(float) * TMAX * 4 * d), *mix = malloc(sizeof(float) * TMAX * MIX),
                  *y = malloc(sizeof(float) * TMAX * d);
            for (int i = 0; i < TMAX * 4 * d; i++) X0[i] = host_bf16((float)dsv4_rng_normal(&rng));
            for (int i = 0; i < TMAX * MIX; i++) mix[i] = (float)dsv4_rng_uniform(&rng) * 2.0f - 0.5f;
            float *dX = cu_malloc(sizeof(float) * TMAX * 4 * d), *dmix = cu_malloc(sizeof(float) * TMAX * MIX);
            assert_true(dX && dmix);
            assert_int_equal(cu_upload(dmix, mix, sizeof(float) * TMAX * MIX), 0);
            static const int Ts[] = { 1, 3, 8 };
            for (int i = 0; i < 3; i++) {
                const int T = Ts[i];
                run_o(&w.d, &a, 0, T, y, official);
                memcpy(want, X0, sizeof(float) * T * 4 * d);
                for (int t = 0; t < T; t++) host_hc_post(official, y + (int64_t)t * d, mix + (int64_t)t * MIX, want + (int64_t)t * 4 * d, d);
                assert_int_equal(cu_upload(dX, X0, sizeof(float) * T * 4 * d), 0);
                dsv4_error err;
                const int rc = cu_mma_linear_post(NULL, &w.d, a.q, a.ldq, a.s, a.lds, T, dmix, dX, 4, d, official, 0, &err);
                if (rc != 1) fail_msg("cu_mma_linear_post declined or failed (%d) at T = %d: %s", rc, T, rc < 0 ? err.msg : "");
                sync_ok("linear post");
                assert_int_equal(cu_download(got, dX, sizeof(float) * T * 4 * d), 0);
                if (memcmp(got, want, sizeof(float) * T * 4 * d))
                    fail_msg("%s %s T = %d: the fused post step's streams differ from the linear then the post step", fp4 ? "FP4" : "FP8",
                             official ? "official" : "exact", T);
            }
            /* declined: nothing launched, the streams untouched */
            assert_int_equal(cu_upload(dX, X0, sizeof(float) * TMAX * 4 * d), 0);
            dsv4_error err;
            assert_int_equal(cu_mma_linear_post(NULL, &w.d, a.q, a.ldq, a.s, a.lds, 9, dmix, dX, 4, d, official, 0, &err), 0);
            assert_int_equal(cu_mma_linear_post(NULL, &w.d, a.q, a.ldq, a.s, a.lds, 1, dmix, dX, 4, d, official, 1, &err), 0);
            assert_int_equal(cu_mma_linear_post(NULL, &w.d, a.q, a.ldq, a.s, a.lds, 1, dmix, dX, 3, d, official, 0, &err), 0);
            assert_int_equal(cu_mma_linear_post(NULL, &w.d, a.q, a.ldq, a.s, a.lds, 1, dmix, dX, 4, d + 16, official, 0, &err), 0);
            sync_ok("declined post");
            assert_int_equal(cu_download(got, dX, sizeof(float) * TMAX * 4 * d), 0);
            if (memcmp(got, X0, sizeof(float) * TMAX * 4 * d)) fail_msg("a declined cu_mma_linear_post wrote the streams");
            printf("  %s %dx%d %s: fused post step = linear then post (memcmp) at T = 1, 3, 8; T = 9, streaming, hc 3, "
                   "another width declined\n", fp4 ? "FP4" : "FP8", d, K, official ? "official" : "exact");
            free(X0); free(want); free(got); free(mix); free(y); free(x);
            cu_free(dX); cu_free(dmix);
            free_act(&a);
            free_weight(&w);
        }
}

/* The routed experts' kernel (cu_mma_expert_linear) on a plan built here: every pair's row has the bits of the plain
 * linear of its expert on its token (one order per element, whatever the tile), reading the tokens through
 * pair_token or pair-ordered rows; an expert without data writes EP_ABSENT_ROW; tiles past n_tiles do nothing. */
/* A plan's device arrays for up to `pairs` pairs and `tiles` tiles (contents uploaded by the caller), and their release. */
static cu_moe_plan plan_alloc(int pairs, int tiles) {
    cu_moe_plan plan;
    memset(&plan, 0, sizeof plan);
    plan.pair_token = cu_malloc(sizeof(int32_t) * pairs);
    plan.tile_expert = cu_malloc(sizeof(int32_t) * tiles);
    plan.tile_first = cu_malloc(sizeof(int32_t) * tiles);
    plan.tile_count = cu_malloc(sizeof(int32_t) * tiles);
    plan.n_tiles = cu_malloc(sizeof(int32_t));
    assert_true(plan.pair_token && plan.tile_expert && plan.tile_first && plan.tile_count && plan.n_tiles);
    return plan;
}
static void plan_release(cu_moe_plan *plan) {
    cu_free(plan->pair_token); cu_free(plan->tile_expert); cu_free(plan->tile_first); cu_free(plan->tile_count); cu_free(plan->n_tiles);
}

static void experts_equal_plain_linear(void **state) {
    (void)state;
    enum { E = 5, NT_TOK = 13, PER = 2, ABSENT = 3 };
    const int build_mode = cu_mma_fp4_vec(0), build_lean = cu_mma_expert_lean(0);
    /* FP4 modes 0..2: the load modes at K = 1120 (a partial last chunk: never the lean kernel); mode 3: the lean kernel
     * (K = 1152, whole chunks, an odd count of them), with scale bytes 0 and 255 (E8M0's special codes) and 30 and
     * 220 (outside the packed kernel's plain range) in expert 2; mode 4: the lean kernel on packed weights
     * (cu_fp4_frag_pack after the reference ran) */
    for (int fp4 = 0; fp4 < 2; fp4++)
        for (int vec = 0; vec < 5; vec++) {
            if (!fp4 && vec) continue;
            const int lean = vec >= 3;
            cu_mma_fp4_vec(lean ? 0 : vec);
            cu_mma_expert_lean(vec == 4 ? 2 : lean);
            const int N = 200, K = fp4 ? (lean ? 1152 : 1120) : 1024, fmt = fp4 ? WF_FP4 : WF_FP8;
            tweight w[E];
            dsv4_weight dws[E];
            for (int e = 0; e < E; e++) {
                w[e] = make_weight(fmt, N, K, 0);
                if (lean && e == 2) {   /* E8M0 0 (2^-127) and 255 (NaN) in a few (row, block)s, uploaded again */
                    uint8_t *sc = (uint8_t *)w[e].h.scale;
                    sc[5 * w[e].h.scale_cols + 9] = 0;
                    sc[77 * w[e].h.scale_cols + 30] = 255;
                    sc[150 * w[e].h.scale_cols + 3] = 0;
                    sc[33 * w[e].h.scale_cols + 17] = 30;
                    sc[121 * w[e].h.scale_cols + 35] = 220;
                    assert_int_equal(cu_upload((void *)w[e].d.scale, sc, (size_t)N * w[e].h.scale_cols), 0);
                }
                dws[e] = w[e].d;
            }
            dws[ABSENT].data = NULL;   /* another GPU's */
            /* each token picks PER distinct experts; pairs sorted by expert, then token; tiles of up to 8 */
            int pick[NT_TOK][E] = { { 0 } }, pair_token[NT_TOK * E], pair_expert[NT_TOK * E], P = 0;
            for (int t = 0; t < NT_TOK; t++)
                for (int n = 0; n < PER;) {
                    const int e = (int)dsv4_rng_below(&rng, E);
                    if (!pick[t][e]) { pick[t][e] = 1; n++; }
                }
            for (int t = 0; t < 9; t++) pick[t][1] = 1;   /* expert 1 takes 9 or more tokens: two tiles */
            int tile_expert[64], tile_first[64], tile_count[64], n_tiles = 0;
            for (int e = 0; e < E; e++)
                for (int t = 0; t < NT_TOK; t++) {
                    if (!pick[t][e]) continue;
                    if (!n_tiles || tile_expert[n_tiles - 1] != e || tile_count[n_tiles - 1] == 8) {
                        tile_expert[n_tiles] = e;
                        tile_first[n_tiles] = P;
                        tile_count[n_tiles++] = 0;
                    }
                    tile_count[n_tiles - 1]++;
                    pair_token[P] = t;
                    pair_expert[P++] = e;
                }
            float *x = make_act(NT_TOK, K, 0), *xp = malloc(sizeof(float) * P * K);
            for (int p = 0; p < P; p++) memcpy(xp + (int64_t)p * K, x + (int64_t)pair_token[p] * K, sizeof(float) * K);
            tact a = pack(x, NT_TOK, K), ap = pack(xp, P, K);
            /* the reference: each expert's plain linear over all tokens */
            float *ref = malloc(sizeof(float) * E * NT_TOK * N);
            for (int e = 0; e < E; e++)
                if (e != ABSENT) run(&w[e].d, &a, 0, NT_TOK, ref + (int64_t)e * NT_TOK * N);
            if (vec == 4) {   /* from here on the experts' data is packed: only k_mma_expert_frag reads it */
                dsv4_error err;
                for (int e = 0; e < E; e++)
                    if (cu_fp4_frag_pack(NULL, (void *)w[e].d.data, N, K, &err)) fail_msg("%s", err.msg);
                sync_ok("frag pack");
            }
            cu_moe_plan plan = plan_alloc(P, 64);
            /* the second projection of the pair call: expert e is weight (e + 2) mod E (so expert 1 is the absent one) */
            dsv4_weight dws2[E];
            for (int e = 0; e < E; e++) dws2[e] = dws[(e + 2) % E];
            dsv4_weight *dexp = cu_malloc(sizeof dws), *dexp2 = cu_malloc(sizeof dws2);
            float *dy = cu_malloc(sizeof(float) * P * N), *dy2 = cu_malloc(sizeof(float) * P * N), *y = malloc(sizeof(float) * P * N);
            assert_true(dexp && dexp2 && dy && dy2);
            assert_int_equal(cu_upload(plan.pair_token, pair_token, sizeof(int32_t) * P), 0);
            assert_int_equal(cu_upload(plan.tile_expert, tile_expert, sizeof(int32_t) * n_tiles), 0);
            assert_int_equal(cu_upload(plan.tile_first, tile_first, sizeof(int32_t) * n_tiles), 0);
            assert_int_equal(cu_upload(plan.tile_count, tile_count, sizeof(int32_t) * n_tiles), 0);
            assert_int_equal(cu_upload(plan.n_tiles, &n_tiles, sizeof(int32_t)), 0);
            assert_int_equal(cu_upload(dexp, dws, sizeof dws), 0);
            assert_int_equal(cu_upload(dexp2, dws2, sizeof dws2), 0);
            /* (by_pair, out): cu_mma_expert_linear (out 0), cu_mma_expert_linear_pair's first (1) and second (2) outputs;
             * packed: each of the packed kernel's variants (prefetch depth, block bound) */
            const int build_fv = cu_mma_expert_frag_variant(0);
            for (int fv = 0; fv < (vec == 4 ? 6 : 1); fv++)
            for (int by_pair = 0; by_pair < 2; by_pair++)
            for (int out = 0; out < 3; out++) {
                const tact *in = by_pair ? &ap : &a;
                dsv4_error err;
                cu_mma_expert_frag_variant(vec == 4 ? fv : build_fv);
                assert_int_equal(cu_fill_bytes(dy, 0x55, sizeof(float) * P * N), 0);
                assert_int_equal(cu_fill_bytes(dy2, 0x55, sizeof(float) * P * N), 0);
                if (out == 0 && cu_mma_expert_linear(NULL, dexp, N, K, fmt, &plan, n_tiles + 2, in->q, in->ldq, in->s, in->lds, by_pair, dy, N,
                                                     0, stream_on, &err))
                    fail_msg("%s", err.msg);
                if (out > 0 && cu_mma_expert_linear_pair(NULL, dexp, dexp2, N, K, fmt, &plan, n_tiles + 2, in->q, in->ldq, in->s, in->lds,
                                                         by_pair, dy, dy2, N, 0, stream_on, &err))
                    fail_msg("%s", err.msg);
                sync_ok("expert linear");
                assert_int_equal(cu_download(y, out == 2 ? dy2 : dy, sizeof(float) * P * N), 0);
                for (int p = 0; p < P; p++) {
                    const int e = out == 2 ? (pair_expert[p] + 2) % E : pair_expert[p];   /* the weight pair p met */
                    if (e == ABSENT) {
                        for (int r = 0; r < N; r++) {
                            const float absent = EP_ABSENT_ROW;
                            if (memcmp(&y[(int64_t)p * N + r], &absent, sizeof absent))
                                fail_msg("%s: pair %d of the absent expert: row %d = %g, not EP_ABSENT_ROW", fp4 ? "FP4" : "FP8", p, r,
                                         y[(int64_t)p * N + r]);
                        }
                    } else if (memcmp(y + (int64_t)p * N, ref + ((int64_t)e * NT_TOK + pair_token[p]) * N, sizeof(float) * N))
                        fail_msg("%s mode %d (variant %d): pair %d (weight %d, token %d%s%s) differs from the plain linear of its weight on "
                                 "its token", fp4 ? "FP4" : "FP8", vec, fv, p, e, pair_token[p], by_pair ? ", rows by pair" : "",
                                 out ? (out == 1 ? ", pair call's first output" : ", pair call's second output") : "");
                }
            }
            cu_mma_expert_frag_variant(build_fv);
            printf("  %s%s experts %dx%d: %d pairs in %d tiles = the plain linear per (expert, token) (memcmp), by token and by pair, "
                   "alone and as both outputs of the pair call; absent expert -> EP_ABSENT_ROW\n", fp4 ? "FP4" : "FP8",
                   fp4 ? (vec == 4 ? " (lean kernel on packed weights, its 6 variants, E8M0 0, 30, 220 and 255 in one expert)" : lean ? " (lean kernel, E8M0 0, 30, 220 and 255 in one expert)" : vec == 2 ? " (vector loads, scale words)" : vec ? " (vector loads)" : " (word loads)") : "",
                   N, K, P, n_tiles);
            plan_release(&plan);
            cu_free(dexp); cu_free(dexp2); cu_free(dy); cu_free(dy2);
            free(y); free(ref); free(x); free(xp);
            free_act(&a);
            free_act(&ap);
            for (int e = 0; e < E; e++) free_weight(&w[e]);
        }
    cu_mma_fp4_vec(build_mode);
    cu_mma_expert_lean(build_lean);
}


/* The routed experts on native FP8 tensor cores (k_expert_nat.cu): another arithmetic than the kernels above, so not
 * compared with them but with the exact sum, and its two kernels with each other:
 *   - the small-tile kernel and the GEMM give the same bytes on the same plan (memcmp), for the single and the pair
 *     call, rows read by token and by pair, groups of 1 to 128 pairs (n64 and n128 tiles), a weight of 200 rows;
 *     out_bf16 stores BF16(y);
 *   - batch invariance: each token's rows computed alone (a plan of its own pairs) equal its rows in the batch;
 *   - every output within 2^-14 of sum |w x| of the exact sum (double), scale bytes 0, 30 and 220 included (a wrong
 *     k map, block order or scale shows as an error of the order of the output itself); an absent expert's rows
 *     are EP_ABSENT_ROW. */
static void experts_native(void **state) {
    (void)state;
    enum { E = 5, NT_TOK = 150, PER = 3, ABSENT = 3, N = 200 };
    const int build_min = cu_nat_gemm_min_tiles(0);
    for (int shape = 0; shape < 2; shape++) {
        const int K = shape ? 2048 : 1152;   /* 9 chunks (odd), 16 */
        tweight w[E];
        dsv4_weight dws[E];
        for (int e = 0; e < E; e++) {
            w[e] = make_weight(WF_FP4, N, K, 0);
            if (e == 2) {   /* E8M0 0 (2^-127), and 30 / 220 (far from the other blocks of their chunk) */
                uint8_t *sc = (uint8_t *)w[e].h.scale;
                sc[5 * w[e].h.scale_cols + 9] = 0;
                sc[33 * w[e].h.scale_cols + 17] = 30;
                sc[121 * w[e].h.scale_cols + 35] = 220;
                assert_int_equal(cu_upload((void *)w[e].d.scale, sc, (size_t)N * w[e].h.scale_cols), 0);
            }
            dws[e] = w[e].d;
        }
        dws[ABSENT].data = NULL;
        /* each token picks PER distinct experts (expert 1 most tokens: runs of more than 64 and 128 pairs) */
        static int pick[NT_TOK][E];
        memset(pick, 0, sizeof pick);
        for (int t = 0; t < NT_TOK; t++) {
            pick[t][1] = t % 5 != 4;
            for (int n = pick[t][1]; n < PER;) {
                const int e = (int)dsv4_rng_below(&rng, E);
                if (!pick[t][e]) { pick[t][e] = 1; n++; }
            }
        }
        /* the batch's pairs (by expert, then token), kept for the single tokens' comparison */
        static int batch_token[NT_TOK * PER], batch_expert[NT_TOK * PER];
        int batch_P = 0;
        float *x = make_act(NT_TOK, K, 0), *xp = malloc(sizeof(float) * NT_TOK * PER * K);
        tact a = pack(x, NT_TOK, K);
        float *dec[E];
        for (int e = 0; e < E; e++) dec[e] = ref_decode(&w[e].h);
        dsv4_error err;
        for (int e = 0; e < E; e++)
            if (cu_fp4_nat_pack(NULL, (void *)w[e].d.data, N, K, &err)) fail_msg("%s", err.msg);
        sync_ok("nat pack");
        dsv4_weight dws2[E];   /* the pair call's second projection: expert e is weight (e + 2) mod E */
        for (int e = 0; e < E; e++) dws2[e] = dws[(e + 2) % E];
        dsv4_weight *dexp = cu_malloc(sizeof dws), *dexp2 = cu_malloc(sizeof dws2);
        assert_true(dexp && dexp2);
        assert_int_equal(cu_upload(dexp, dws, sizeof dws), 0);
        assert_int_equal(cu_upload(dexp2, dws2, sizeof dws2), 0);
        const int maxp = NT_TOK * PER;
        cu_moe_plan plan = plan_alloc(maxp, maxp);
        float *dy = cu_malloc(sizeof(float) * maxp * N), *dy2 = cu_malloc(sizeof(float) * maxp * N);
        assert_true(dy && dy2);
        /* outputs [kernel][by_pair][out] of the whole batch, rows by pair */
        float *yb[2][2][3];
        double worst = 0, worst_abs = 0;
        int checked = 0;
        for (int t0 = -1; t0 < NT_TOK; t0++) {   /* -1: the whole batch; t0 >= 0: token t0 alone */
            const int lo = t0 < 0 ? 0 : t0, hi = t0 < 0 ? NT_TOK : t0 + 1;
            int P = 0, nt = 0, pair_token[NT_TOK * PER], pair_expert[NT_TOK * PER], te[NT_TOK * PER], tf[NT_TOK * PER], tc[NT_TOK * PER];
            for (int e = 0; e < E; e++)
                for (int t = lo; t < hi; t++) {
                    if (!pick[t][e]) continue;
                    if (!nt || te[nt - 1] != e || tc[nt - 1] == 8) te[nt] = e, tf[nt] = P, tc[nt++] = 0;
                    tc[nt - 1]++;
                    pair_token[P] = t, pair_expert[P++] = e;
                }
            for (int p = 0; p < P; p++) memcpy(xp + (int64_t)p * K, x + (int64_t)pair_token[p] * K, sizeof(float) * K);
            tact ap = pack(xp, P, K);
            assert_int_equal(cu_upload(plan.pair_token, pair_token, sizeof(int32_t) * P), 0);
            assert_int_equal(cu_upload(plan.tile_expert, te, sizeof(int32_t) * nt), 0);
            assert_int_equal(cu_upload(plan.tile_first, tf, sizeof(int32_t) * nt), 0);
            assert_int_equal(cu_upload(plan.tile_count, tc, sizeof(int32_t) * nt), 0);
            assert_int_equal(cu_upload(plan.n_tiles, &nt, sizeof(int32_t)), 0);
            for (int kern = 0; kern < 2; kern++)
                for (int by_pair = 0; by_pair < 2; by_pair++)
                    for (int out = 0; out < 3; out++) {
                        if (t0 >= 0 && (by_pair || out)) continue;   /* alone: one call of each kernel */
                        cu_nat_gemm_min_tiles(kern ? 1 : 0);
                        const tact *in = by_pair ? &ap : &a;
                        assert_int_equal(cu_fill_bytes(dy, 0x55, sizeof(float) * P * N), 0);
                        assert_int_equal(cu_fill_bytes(dy2, 0x55, sizeof(float) * P * N), 0);
                        int rc = out == 0 ? cu_mma_expert_linear(NULL, dexp, N, K, CU_FMT_FP4_NAT, &plan, nt + 2, in->q, in->ldq, in->s, in->lds,
                                                                 by_pair, dy, N, 0, stream_on, &err)
                                          : cu_mma_expert_linear_pair(NULL, dexp, dexp2, N, K, CU_FMT_FP4_NAT, &plan, nt + 2, in->q, in->ldq,
                                                                      in->s, in->lds, by_pair, dy, dy2, N, 0, stream_on, &err);
                        if (rc) fail_msg("%s", err.msg);
                        sync_ok("native experts");
                        float *y = malloc(sizeof(float) * P * N);
                        assert_int_equal(cu_download(y, out == 2 ? dy2 : dy, sizeof(float) * P * N), 0);
                        if (t0 >= 0) {   /* token t0's rows = its rows in the batch (pairs in the same expert order) */
                            int bp = 0;
                            for (int p = 0; p < P; p++) {
                                while (batch_token[bp] != t0 || batch_expert[bp] != pair_expert[p]) bp++;
                                if (memcmp(y + (int64_t)p * N, yb[kern][0][0] + (int64_t)bp * N, sizeof(float) * N))
                                    fail_msg("K %d, %s: token %d alone (expert %d) differs from the same token in the batch", K,
                                             kern ? "GEMM" : "small tiles", t0, pair_expert[p]);
                            }
                            free(y);
                            continue;
                        }
                        yb[kern][by_pair][out] = y;
                        if (!by_pair && !out) {   /* out_bf16: each output rounded to BF16 as it is stored */
                            float *yr = malloc(sizeof(float) * P * N);
                            if (cu_mma_expert_linear(NULL, dexp, N, K, CU_FMT_FP4_NAT, &plan, nt + 2, a.q, a.ldq, a.s, a.lds, 0, dy, N, 1,
                                                     stream_on, &err))
                                fail_msg("%s", err.msg);
                            sync_ok("native experts, bf16 out");
                            assert_int_equal(cu_download(yr, dy, sizeof(float) * P * N), 0);
                            for (int i = 0; i < P * N; i++) {
                                const float want = host_bf16(y[i]);
                                if (memcmp(&yr[i], &want, sizeof want))
                                    fail_msg("K %d, %s: output %d with out_bf16 %g, not bf16(%g)", K, kern ? "GEMM" : "small tiles", i, yr[i], y[i]);
                            }
                            free(yr);
                        }
                        if (kern || by_pair || out) {
                            /* the same weight for every pair: out 1 = out 0; out 2 its own; all = the small tiles by token */
                            const float *base = yb[0][0][out == 2 ? 2 : 0];
                            if (memcmp(y, base, sizeof(float) * P * N))
                                fail_msg("K %d: %s, rows by %s, output %d differs from the small tiles by token", K, kern ? "GEMM" : "small tiles",
                                         by_pair ? "pair" : "token", out);
                        }
                        if (kern || by_pair) continue;
                        for (int p = 0; p < P; p++) {
                            const int e = out == 2 ? (pair_expert[p] + 2) % E : pair_expert[p];
                            for (int r = 0; r < N; r++) {
                                const float v = y[(int64_t)p * N + r];
                                if (e == ABSENT) {
                                    const float absent = EP_ABSENT_ROW;
                                    if (memcmp(&v, &absent, sizeof v)) fail_msg("pair %d of the absent expert: row %d = %g", p, r, v);
                                    continue;
                                }
                                double s, as;
                                ref_dot(dec[e] + (int64_t)r * K, K, x + (int64_t)pair_token[p] * K, &s, &as);
                                const double d = fabs((double)v - s);
                                if (!(d <= 0x1p-14 * as + 1e-30))
                                    fail_msg("K %d: pair %d (expert %d, token %d) row %d: %.9g, exact %.9g (|error| %.3g, sum |w x| %.3g)", K, p, e,
                                             pair_token[p], r, v, s, d, as);
                                if (as > 0 && d / as > worst) worst = d / as;
                                if (d > worst_abs) worst_abs = d;
                                checked++;
                            }
                        }
                    }
            if (t0 < 0) {
                batch_P = P;
                memcpy(batch_token, pair_token, sizeof(int) * P);
                memcpy(batch_expert, pair_expert, sizeof(int) * P);
            }
            free_act(&ap);
        }
        printf("  native FP4 experts %dx%d, %d pairs: small tiles = GEMM (memcmp) by token and by pair, single and pair calls; "
               "each of %d tokens alone = in the batch; %d outputs within 2^-14 of sum |w x| (worst %.3g of it, abs %.3g)\n",
               N, K, batch_P, NT_TOK, checked, worst, worst_abs);
        for (int k = 0; k < 2; k++)
            for (int b = 0; b < 2; b++)
                for (int o = 0; o < 3; o++) free(yb[k][b][o]);
        for (int e = 0; e < E; e++) free(dec[e]);
        plan_release(&plan);
        cu_free(dexp); cu_free(dexp2); cu_free(dy); cu_free(dy2);
        free(x); free(xp);
        free_act(&a);
        for (int e = 0; e < E; e++) free_weight(&w[e]);
    }
    cu_nat_gemm_min_tiles(build_min);
}

#ifndef MMA_TEST_SHIM
/* ---- benchmark ------------------------------------------------------------------------------------------------ */

/* Seconds per call: `reps` calls captured in a CUDA graph (no host launch gaps), timed by events, the weights cycling
 * through `copies` device copies (together > 256 MB, beyond the 60 MB L2). */
static int call(cu_stream st, const dsv4_weight *w, const uint8_t *q, int ldq, const float *s, int lds, const float *xf, int T, float *y,
                int ldy, dsv4_error *err) {
    if (xf) return cu_linear(st, w, xf, T, w->cols, y, ldy);   /* the CUDA-core kernel (k_linear.cu), for comparison */
    return cu_mma_linear(st, w, q, ldq, s, lds, T, y, ldy, 0, stream_on, err);
}

/* xf non-NULL: time cu_linear on fp32 rows xf instead. */
static double time_calls(dsv4_weight *ws, int copies, const uint8_t *q, int ldq, const float *s, int lds, const float *xf, int T, float *y,
                         int ldy, int reps) {
    dsv4_error err;
    snprintf(err.msg, sizeof err.msg, "cu_linear failed");
    cudaStream_t st;
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) return -1;
    for (int i = 0; i < copies; i++)
        if (call(st, &ws[i], q, ldq, s, lds, xf, T, y, ldy, &err)) {
            fprintf(stderr, "bench: %s\n", err.msg);
            return -1;
        }
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = -1;
    int ok = cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess;
    int graph = ok && cudaStreamSynchronize(st) == cudaSuccess && cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    if (graph) {
        for (int r = 0; r < reps; r++) call(st, &ws[r % copies], q, ldq, s, lds, xf, T, y, ldy, &err);
        graph = cudaStreamEndCapture(st, &g) == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
    }
    graph = graph && cudaGraphLaunch(ge, st) == cudaSuccess && cudaStreamSynchronize(st) == cudaSuccess;   /* warm */
    if (graph) {
        ok = ok && cudaEventRecord(e0, st) == cudaSuccess && cudaGraphLaunch(ge, st) == cudaSuccess;
    } else {   /* no graph: plain launches (host launch gaps included) */
        fprintf(stderr, "bench: CUDA graph capture failed (%s): timing plain launches\n", cudaGetErrorString(cudaGetLastError()));
        ok = ok && cudaEventRecord(e0, st) == cudaSuccess;
        for (int r = 0; ok && r < reps; r++) ok = call(st, &ws[r % copies], q, ldq, s, lds, xf, T, y, ldy, &err) == 0;
    }
    ok = ok && cudaEventRecord(e1, st) == cudaSuccess && cudaEventSynchronize(e1) == cudaSuccess &&
         cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess;
    if (!ok) fprintf(stderr, "bench: timing failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaStreamDestroy(st);
    return ok ? ms * 1e-3 / reps : -1;
}

static int bench(void) {
    static const int shapes[][2] = { { 4096, 4096 }, { 32768, 1024 }, { 2048, 4096 }, { 1024, 4096 }, { 512, 4096 } };
    static const int Ts[] = { 1, 8, 512, 4096, 8192 };
    enum { TMAX = 8192, KMAX = 4096, NMAX = 32768 };
    char name[256];
    cu_device_name(name, sizeof name);
    printf("tensor-core linear (k_mma.cu) on %s; time per call in a CUDA graph of calls over rotating weight copies (> 256 MB)\n", name);
    uint8_t *q = cu_malloc((size_t)TMAX * KMAX);
    float *s = cu_malloc(sizeof(float) * TMAX * (KMAX / 128)), *y = cu_malloc(sizeof(float) * (size_t)TMAX * NMAX);
    float *xf = cu_malloc(sizeof(float) * 512 * KMAX);   /* fp32 rows for the CUDA-core comparison */
    if (!q || !s || !y || !xf) {
        fprintf(stderr, "bench: out of GPU memory\n");
        return 1;
    }
    cu_fill_synth(q, (size_t)TMAX * KMAX, CU_SYNTH_FP8, 7);
    cu_fill_bytes(xf, 0x3c, sizeof(float) * 512 * KMAX);   /* 0.0115 each */
    float *ones = malloc(sizeof(float) * TMAX * (KMAX / 128));
    for (int i = 0; i < TMAX * (KMAX / 128); i++) ones[i] = 1.0f / 64;
    cu_upload(s, ones, sizeof(float) * TMAX * (KMAX / 128));
    free(ones);
    printf("%-5s %-12s %6s %10s %11s %9s %16s %22s %20s\n", "fmt", "N x K", "T", "us/call", "weight GB/s", "TFLOPS", "k_linear us/call",
           "small tiles us (GB/s)", "L2-hot us (GB/s)");
    for (int fp4 = 0; fp4 < 2; fp4++)
        for (int k = 0; k < (int)(sizeof shapes / sizeof shapes[0]); k++) {
            const int N = shapes[k][0], K = shapes[k][1];
            dsv4_weight w = { fp4 ? WF_FP4 : WF_FP8, N, K, NULL, NULL, fp4 ? K / 32 : K / 128, 0 };
            const size_t db = fp4 ? (size_t)N * K / 2 : (size_t)N * K, sb = weight_scale_bytes(&w);
            const int copies = (int)((256u << 20) / (db + sb)) + 1;
            dsv4_weight *ws = calloc(copies, sizeof *ws);
            int ok = 1;
            for (int i = 0; i < copies; i++) {
                ws[i] = w;
                void *d = cu_malloc(db), *sc = cu_malloc(sb);
                if (!d || !sc) ok = 0;
                if (!ok) break;
                cu_fill_synth(d, db, fp4 ? CU_SYNTH_FP4 : CU_SYNTH_FP8, 100 + i);
                cu_fill_bytes(sc, 120, sb);
                ws[i].data = d;
                ws[i].scale = sc;
            }
            if (!ok) printf("%-5s %5dx%-6d: out of GPU memory for %d copies\n", fp4 ? "FP4" : "FP8", N, K, copies);
            for (int j = 0; ok && j < (int)(sizeof Ts / sizeof Ts[0]); j++) {
                const int T = Ts[j];
                const int reps = T <= 8 ? 200 : T <= 512 ? 50 : 10;
                const double sec = time_calls(ws, copies, q, KMAX, s, KMAX / 128, NULL, T, y, N, reps);
                if (sec < 0) return 1;
                double tiles = 0;   /* T <= 8: k_mma.cu's small tiles (DSV4_CUDA_STREAM=0) beside the streaming kernel */
                if (T <= 8 && stream_on) {
                    stream_on = 0;
                    tiles = time_calls(ws, copies, q, KMAX, s, KMAX / 128, NULL, T, y, N, reps);
                    stream_on = 1;
                }
                const double old = T <= 512 ? time_calls(ws, copies, q, KMAX, s, KMAX / 128, xf, T, y, N, T <= 8 ? 50 : 3) : 0;
                /* the same weight every call (in L2 where it fits the ~50 MB): what a kernel gains from weights already
                 * in L2 (run 53: nothing; slower if anything) */
                const double hot = T <= 8 ? time_calls(ws, 1, q, KMAX, s, KMAX / 128, NULL, T, y, N, reps) : 0;
                char oldtxt[32] = "";
                if (old > 0) snprintf(oldtxt, sizeof oldtxt, "%.1f", old * 1e6);
                char tilestxt[48] = "";
                if (tiles > 0) snprintf(tilestxt, sizeof tilestxt, "%.1f (%.0f GB/s)", tiles * 1e6, (double)(db + sb) / tiles / 1e9);
                char hottxt[48] = "";
                if (hot > 0) snprintf(hottxt, sizeof hottxt, "%.1f (%.0f GB/s)", hot * 1e6, (double)(db + sb) / hot / 1e9);
                printf("%-5s %5dx%-6d %6d %10.1f %11.0f %9.1f %16s %22s %20s\n", fp4 ? "FP4" : "FP8", N, K, T, sec * 1e6,
                       (double)(db + sb) / sec / 1e9, 2.0 * N * K * T / sec / 1e12, oldtxt, tilestxt, hottxt);
            }
            for (int i = 0; i < copies; i++) {
                cu_free((void *)ws[i].data);
                cu_free((void *)ws[i].scale);
            }
            free(ws);
        }
    printf("(weight GB/s matters at T = 1, 8: H200 read bandwidth ~4.3 TB/s; TFLOPS at T >= 512: dense FP8 ~1,470)\n");
    cu_free(q); cu_free(s); cu_free(y); cu_free(xf);
    return 0;
}


/* `--bench-experts`: the routed experts of one V4-Flash MoE layer as a step runs them (cuda_ep.c cu_moe_routed): w1
 * and w3 (2048 x 4096, one launch or two) then w2 (4096 x 2048), FP4 with a scale per 32 columns, for 6 experts; at 1 token (6 tiles
 * of 1 pair) and 8 tokens on the same 6 experts (6 tiles of 8: the most a tile holds); and, for the packed kernel,
 * 64 experts of 6 tokens each (a step of many streams: 256 streams give each of 256 experts ~6). Each layer of the
 * graph takes 6 other experts of a pool of 64 per matrix (816 MB, far beyond the 60 MB L2), or the whole pool.
 * Vector loads on and off. */
static int bench_experts(void) {
    enum { NE = 64, ACT = 6, I = 2048, D = 4096, LAYERS = 40, TT = 8, NA = 64 };
    const int build_mode = cu_mma_fp4_vec(0), build_lean = cu_mma_expert_lean(0);
    char name[256];
    cu_device_name(name, sizeof name);
    printf("routed experts of one MoE layer (k_mma_expert, FP4) on %s: 3 launches (w1, w3: %dx%d, w2: %dx%d) x %d experts, "
           "a CUDA graph of %d layers over a pool of %d experts\n", name, I, D, D, I, ACT, LAYERS, NE);
    dsv4_weight host[3][NE];
    dsv4_weight *dev[3];
    size_t bytes_per_expert = 0;
    for (int m = 0; m < 3; m++) {
        const int rows = m == 2 ? D : I, cols = m == 2 ? I : D;
        for (int e = 0; e < NE; e++) {
            dsv4_weight w = { WF_FP4, rows, cols, NULL, NULL, cols / 32, 0 };
            const size_t db = (size_t)rows * cols / 2, sb = weight_scale_bytes(&w);
            void *d = cu_malloc(db), *sc = cu_malloc(sb);
            if (!d || !sc) { fprintf(stderr, "bench: out of GPU memory\n"); return 1; }
            cu_fill_synth(d, db, CU_SYNTH_FP4, 1000 + 64 * m + e);
            cu_fill_bytes(sc, 120, sb);
            w.data = d;
            w.scale = sc;
            host[m][e] = w;
            if (e == 0) bytes_per_expert += db + sb;
        }
        dev[m] = cu_malloc(sizeof host[m]);
        cu_upload(dev[m], host[m], sizeof host[m]);
    }
    /* activations: TT tokens of D (w1, w3) and NA * TT pairs of I (w2), all 1/64-scaled E4M3 bytes */
    uint8_t *xq = cu_malloc((size_t)TT * D), *hq = cu_malloc((size_t)NA * TT * I);
    float *xs = cu_malloc(sizeof(float) * TT * (D / 128)), *hs = cu_malloc(sizeof(float) * NA * TT * (I / 128));
    float *y1 = cu_malloc(sizeof(float) * NA * TT * I), *y3 = cu_malloc(sizeof(float) * NA * TT * I), *y2 = cu_malloc(sizeof(float) * NA * TT * D);
    if (!xq || !hq || !xs || !hs || !y1 || !y3 || !y2) { fprintf(stderr, "bench: out of GPU memory\n"); return 1; }
    cu_fill_synth(xq, (size_t)TT * D, CU_SYNTH_FP8, 7);
    cu_fill_synth(hq, (size_t)NA * TT * I, CU_SYNTH_FP8, 8);
    static float ones[NA * TT * (I / 128)];
    for (int i = 0; i < NA * TT * (I / 128); i++) ones[i] = 1.0f / 64;
    cu_upload(xs, ones, sizeof(float) * TT * (D / 128));
    cu_upload(hs, ones, sizeof(float) * NA * TT * (I / 128));
    printf("%-7s %-9s %6s %6s %11s %12s\n", "loads", "w1+w3", "tokens", "tiles", "us / layer", "weight GB/s");
    /* pass 1: the packed kernel, after the pool is packed for it; pass 2: the native kernels (k_expert_nat.cu), after the
     * pool is packed again for them (random codes either way: the timing does not depend on the layout's meaning) */
    for (int pass = 0; pass < 3; pass++)
    for (int ti = 0; ti < (pass ? 3 : 2); ti++) {
        const int T = ti == 0 ? 1 : ti == 1 ? TT : 6, A = ti == 2 ? NA : ACT, P = A * T;
        if (pass >= 1 && ti == 0) {
            dsv4_error err;
            for (int m = 0; m < 3; m++)
                for (int e = 0; e < NE; e++)
                    if ((pass == 2 ? cu_fp4_nat_pack : cu_fp4_frag_pack)(NULL, (void *)host[m][e].data, host[m][e].rows, host[m][e].cols, &err)) {
                        fprintf(stderr, "bench: %s\n", err.msg);
                        return 1;
                    }
        }
        /* LAYERS plans: layer l takes experts (A l + i) mod NE; pairs sorted by expert, then token */
        cu_moe_plan plans[LAYERS];
        for (int l = 0; l < LAYERS; l++) {
            int32_t pt[NA * TT], te[NA], tf[NA], tc[NA], nt = A;
            for (int i = 0; i < A; i++) {
                te[i] = (A * l + i) % NE;
                tf[i] = i * T;
                tc[i] = T;
                for (int t = 0; t < T; t++) pt[i * T + t] = t;
            }
            cu_moe_plan *p = &plans[l];
            memset(p, 0, sizeof *p);
            p->pair_token = cu_malloc(sizeof pt);
            p->tile_expert = cu_malloc(sizeof te);
            p->tile_first = cu_malloc(sizeof tf);
            p->tile_count = cu_malloc(sizeof tc);
            p->n_tiles = cu_malloc(sizeof nt);
            cu_upload(p->pair_token, pt, sizeof pt);
            cu_upload(p->tile_expert, te, sizeof te);
            cu_upload(p->tile_first, tf, sizeof tf);
            cu_upload(p->tile_count, tc, sizeof tc);
            cu_upload(p->n_tiles, &nt, sizeof nt);
        }
        const int max_tiles = P / 8 + A + 1;   /* as cuda_step.c moe_max_tiles sizes a step of T tokens */
        /* streaming, k_mma.cu's: vec 2, 1, 0 x pair 1, 0, lean x pair 1, 0; packed: its variants 0..5 in one launch, the
         * default in two */
        for (int variant = pass == 2 ? 16 : pass ? 9 : 0; variant < (pass == 2 ? 17 : pass ? 16 : 9); variant++) {
            const int native = variant == 16, fmt = native ? CU_FMT_FP4_NAT : WF_FP4;
            const int stream = variant == 0, lean = variant >= 7 ? (variant >= 9 ? 2 : 1) : 0, fv = variant >= 9 && variant < 15 ? variant - 9 : -1;
            const int vec = stream ? 2 : lean ? 0 : 2 - (variant - 1) / 2, pair = stream || native ? 1 : lean == 2 ? variant < 15 : (variant - 1) % 2 == 0;
            const int build_fv = cu_mma_expert_frag_variant(fv);
            cu_mma_fp4_vec(vec);
            cu_mma_expert_lean(lean);
            cudaStream_t st;
            cudaGraph_t g = NULL;
            cudaGraphExec_t ge = NULL;
            cudaEvent_t e0, e1;
            dsv4_error err;
            int ok = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess && cudaEventCreate(&e0) == cudaSuccess &&
                     cudaEventCreate(&e1) == cudaSuccess && cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
            for (int l = 0; ok && l < LAYERS; l++) {
                if (pair)
                    ok = !cu_mma_expert_linear_pair(st, dev[0], dev[1], I, D, fmt, &plans[l], max_tiles, xq, D, xs, D / 128, 0, y1, y3, I, 1,
                                                    stream, &err);
                else
                    ok = !cu_mma_expert_linear(st, dev[0], I, D, fmt, &plans[l], max_tiles, xq, D, xs, D / 128, 0, y1, I, 1, stream, &err) &&
                         !cu_mma_expert_linear(st, dev[1], I, D, fmt, &plans[l], max_tiles, xq, D, xs, D / 128, 0, y3, I, 1, stream, &err);
                ok = ok && !cu_mma_expert_linear(st, dev[2], D, I, fmt, &plans[l], max_tiles, hq, I, hs, I / 128, 1, y2, D, 1, stream, &err);
            }
            ok = ok && cudaStreamEndCapture(st, &g) == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess &&
                 cudaGraphLaunch(ge, st) == cudaSuccess && cudaStreamSynchronize(st) == cudaSuccess;   /* warm */
            float best = 1e30f;
            for (int rep = 0; ok && rep < 5; rep++) {
                float ms = 0;
                ok = cudaEventRecord(e0, st) == cudaSuccess && cudaGraphLaunch(ge, st) == cudaSuccess && cudaEventRecord(e1, st) == cudaSuccess &&
                     cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess;
                if (ms < best) best = ms;
            }
            if (!ok) { fprintf(stderr, "bench: %s\n", cudaGetErrorString(cudaGetLastError())); return 1; }
            const double sec = best * 1e-3 / LAYERS;
            cu_mma_expert_frag_variant(build_fv);
            char pname[16];
            snprintf(pname, sizeof pname, fv >= 0 ? "packed%d" : "packed", fv);
            printf("%-7s %-9s %6d %6d %11.1f %12.0f\n", native ? "native" : stream ? "STREAM" : lean == 2 ? pname : lean ? "lean" : vec == 2 ? "vec+sw" : vec ? "vector" : "word", pair ? "1 launch" : "2 launches", T,
                   A, sec * 1e6, (double)A * bytes_per_expert / sec / 1e9);
            cudaGraphExecDestroy(ge);
            cudaGraphDestroy(g);
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
            cudaStreamDestroy(st);
        }
        for (int l = 0; l < LAYERS; l++) {
            cu_free(plans[l].pair_token); cu_free(plans[l].tile_expert); cu_free(plans[l].tile_first);
            cu_free(plans[l].tile_count); cu_free(plans[l].n_tiles);
        }
    }
    cu_mma_fp4_vec(build_mode);
    cu_mma_expert_lean(build_lean);
    printf("(STREAM: k_mma_stream.cu, DSV4_CUDA_STREAM=1; the others k_mma.cu's small tiles:\n vec+sw: mode 2, 16-byte weight loads and scale words; vector: mode 1, scale bytes; word: mode 0, the loads before;\n"
           " lean: k_mma_expert_lean (MMA_EXPERT_LEAN, the default for whole chunks); packed<v>: k_mma_expert_frag on cu_fp4_frag_pack'ed weights, variant v\n"
           " (0: no prefetch, 1: one chunk ahead, 2: two, 3 / 4: one ahead in 5 / 6 blocks an SM, 5: two ahead in 4), packed: the default;\n"
           " native: k_expert_nat.cu's small tiles on cu_fp4_nat_pack'ed weights (native FP8 wgmma: another arithmetic);\n"
           " w1+w3: cu_mma_expert_linear_pair's one launch or two; the graph's launch gaps are in the time)\n");
    printf("(bytes: %.1f MB of weights and scales per expert; H200 read bandwidth ~4.25 TB/s)\n", bytes_per_expert / 1e6);
    for (int m = 0; m < 3; m++) {
        for (int e = 0; e < NE; e++) { cu_free((void *)host[m][e].data); cu_free((void *)host[m][e].scale); }
        cu_free(dev[m]);
    }
    cu_free(xq); cu_free(hq); cu_free(xs); cu_free(hs); cu_free(y1); cu_free(y3); cu_free(y2);
    return 0;
}
#endif

int main(int argc, char **argv) {
#ifndef MMA_TEST_SHIM
    dsv4_error why;
    if (!dsv4_cuda_available(&why)) {
        printf("gpu mma: skipped, needs a GPU: %s\n", why.msg);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench();
    if (argc > 1 && !strcmp(argv[1], "--bench-experts")) return bench_experts();
#endif
    if (argc > 1) {
        fprintf(stderr, "usage: test_gpu_mma [--bench | --bench-experts]\n");
        return 2;
    }
    dsv4_rng_seed(&rng, 2026);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pack_is_exact),
#ifndef MMA_TEST_SHIM
        cmocka_unit_test(e4m3_conversion_every_float),
        cmocka_unit_test(mma_written_out_equals_instruction),
#endif
        cmocka_unit_test(raw_packing_and_bf16_output),
        cmocka_unit_test(exact_on_integers),
        cmocka_unit_test(close_on_realistic),
        cmocka_unit_test(batch_invariant_and_deterministic),
        cmocka_unit_test(fp4_vector_loads_equal_word_loads),
        cmocka_unit_test(linear_pair_equals_two),
        cmocka_unit_test(linear_post_equals_linear_then_post),
        cmocka_unit_test(experts_equal_plain_linear),
#ifndef MMA_TEST_SHIM   /* k_expert_nat.cu has no CPU shim: native wgmma's sums are the hardware's */
        cmocka_unit_test(experts_native),
#endif
        cmocka_unit_test(refuses_bad_shapes),
    };
    if (getenv("MMA_TEST_ONLY")) cmocka_set_test_filter(getenv("MMA_TEST_ONLY"));   /* e.g. "experts_*" */
    stream_on = 1;
    int rc = cmocka_run_group_tests_name("gpu tensor-core linear (DSV4_CUDA_STREAM=1)", tests, NULL, NULL);
    stream_on = 0;
    rc |= cmocka_run_group_tests_name("gpu tensor-core linear (DSV4_CUDA_STREAM=0)", tests, NULL, NULL);
    return rc;
}
