/* The BF16-input tensor-core linear (backend/cuda/k_mma16.cu, cu_mma.h: cu_mma16_pack, cu_mma16_linear) against a
 * reference computed here, in double, from the formats' definitions (bf16, E4M3, UE8M0 decoded by this file):
 *   - the packer writes the bf16 of each value, rounded to nearest even (exact for bf16-valued rows);
 *   - small-integer weights and activations (every partial sum exact at any precision the MMA may keep) give the
 *     exact result, ==, for BF16 weights (full and partial 128-column chunks) and FP8 weights, in each tile shape,
 *     plain and grouped: a wrong fragment layout, k map, scale index, group offset or chunk order shows as a
 *     wrong value;
 *   - realistic weights and activations: |y - ref| <= 2^-13 * sum_i |w_i x_i| per element (why: the test's comment),
 *     and the fp32 CUDA-core kernel (cu_linear, k_linear.cu) within the same bound of the reference;
 *   - batch invariance: every token of batches of T = 1, 2, 7, 8, 9, 31, 33, 64, 200 (at two offsets) has the bits
 *     of the same token computed alone (memcmp), for BF16, FP8 and grouped weights; a group's rows in the grouped
 *     call have the bits of that group's rows as a weight of its own; rows through a view (row0 = 40) have the
 *     bits of the full weight's rows; two runs give the same bits;
 *   - several weights in one launch (cu_mma16_linear_multi) give each weight's own bits (memcmp);
 *   - unsupported shapes and buffers are refused with an error code and one line, and write nothing.
 * `test_gpu_mma16 --bench` times the kernel at the V4-Flash shapes (wo_a grouped FP8, LM head, compressors, gate,
 * weights_proj) at T = 1, 8, 512, 4096 with cu_linear's time alongside for T <= 512.
 * Building with NVFLAGS including -DDSV4_MMA16_BUG (k_mma16.cu swaps the token's two words in the first MMA of each
 * chunk) must make the exact and accuracy tests fail. Built with -DMMA16_TEST_SHIM (tools/gpu/shim/shim_mma16.sh)
 * it runs on the CPU against the kernel's source through the fiber shim: host memory stands in for the device. */
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
#include "backend/cuda/cu_runtime.h"
#include "model/formats.h"   /* to make inputs (f32_to_e4m3) and the host bf16 rounding that out_bf16 must equal */
#include "model/tiny.h"      /* dsv4_rng */
#include "model/weight.h"

#ifdef MMA16_TEST_SHIM
/* The device is the host (tools/gpu/shim/cuda_shim.h runs the kernels as fibers). */
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

/* ---- the formats, from their definitions ------------------------------------------------------------------ */

static double ref_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* The bf16 nearest to x, ties to the even one (x finite). */
static uint16_t ref_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint32_t lo = u & 0xffff, hi = u >> 16;
    if (lo > 0x8000 || (lo == 0x8000 && (hi & 1))) return (uint16_t)(hi + 1);
    return (uint16_t)hi;
}
static float bf16_value(float x) { return (float)ref_bf16(ref_to_bf16(x)); }
/* E4M3 (fn): sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal m * 2^-9. */
static double ref_e4m3(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return (b & 0x80) ? -v : v;
}
static double ref_ue8m0(uint8_t b) { return ldexp(1.0, (int)b - 127); }

/* Element (r, i) of a weight view (host pointers). */
static double ref_w(const dsv4_weight *w, int r, int i) {
    if (w->fmt == WF_BF16) return ref_bf16(((const uint16_t *)w->data)[(int64_t)r * w->cols + i]);
    return ref_e4m3(((const uint8_t *)w->data)[(int64_t)r * w->cols + i]) *
           ref_ue8m0(w->scale[(int64_t)((w->row0 + r) / 128) * w->scale_cols + i / 128]);
}

/* ---- inputs ----------------------------------------------------------------------------------------------- */

typedef struct {
    dsv4_weight h, d;   /* host and device copies of one weight */
} tweight;

/* Realistic: per 128 x 128 block a standard deviation 0.02 * 2^[-2, 2], normal values; BF16 rounded to bf16, FP8
 * scaled by the block's power-of-two scale from its amax / 448 and rounded to E4M3 (including subnormal codes).
 * Integer: values in {0, +-1, +-2} (FP8: times a scale 2^0 or 2^-1; BF16: times 2^0 or 2^-1 per block). */
static tweight make_weight(int fmt, int N, int K, int integer) {
    tweight t;
    dsv4_weight *w = &t.h;
    memset(w, 0, sizeof *w);
    w->fmt = fmt;
    w->rows = N;
    w->cols = K;
    const int fp8 = fmt == WF_FP8;
    const size_t dbytes = (size_t)N * K * (fp8 ? 1 : 2);
    w->scale_cols = fp8 ? (K + 127) / 128 : 0;
    const size_t sbytes = fp8 ? (size_t)((N + 127) / 128) * w->scale_cols : 0;
    uint8_t *data = calloc(dbytes, 1), *scale = fp8 ? calloc(sbytes, 1) : NULL;
    float *v = malloc(sizeof(float) * 128 * 128);
    for (int r0 = 0; r0 < N; r0 += 128)
        for (int c0 = 0; c0 < K; c0 += 128) {
            const int nr = N - r0 < 128 ? N - r0 : 128, nc = K - c0 < 128 ? K - c0 : 128;
            const double sd = 0.02 * ldexp(1.0, (int)dsv4_rng_below(&rng, 5) - 2);
            double amax = 1e-30;
            for (int k = 0; k < nr * nc; k++) {
                v[k] = (float)(dsv4_rng_normal(&rng) * sd);
                if (fabs(v[k]) > amax) amax = fabs(v[k]);
            }
            const int e = integer ? -(int)dsv4_rng_below(&rng, 2) : (int)ceil(log2(amax / 448.0));
            if (fp8) scale[(int64_t)(r0 / 128) * w->scale_cols + c0 / 128] = (uint8_t)(127 + e);
            for (int rr = 0; rr < nr; rr++)
                for (int cc = 0; cc < nc; cc++) {
                    const int64_t at = (int64_t)(r0 + rr) * K + c0 + cc;
                    const int k = (int)dsv4_rng_below(&rng, 5) - 2;   /* -2 .. 2 */
                    if (fp8) {
                        data[at] = integer ? (uint8_t)((k < 0 ? 0x80 : 0) | (k == 0 ? 0 : abs(k) == 1 ? 0x38 : 0x40))
                                           : f32_to_e4m3((float)(v[rr * nc + cc] / ldexp(1.0, e)));
                    } else {
                        const float val = integer ? (float)ldexp(k, e) : v[rr * nc + cc];
                        ((uint16_t *)data)[at] = ref_to_bf16(val);
                    }
                }
        }
    free(v);
    w->data = data;
    w->scale = scale;
    t.d = *w;
    void *dd = cu_malloc(dbytes), *ds = fp8 ? cu_malloc(sbytes) : NULL;
    assert_non_null(dd);
    assert_int_equal(cu_upload(dd, data, dbytes), 0);
    if (fp8) {
        assert_non_null(ds);
        assert_int_equal(cu_upload(ds, scale, sbytes), 0);
    }
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

/* T rows of K bf16-valued floats: realistic (normal values times 2^[-8, 8] per 128 columns, 1 in 16 exactly 0, rounded
 * to bf16), or integer ({0, +-1, +-2} times 2^0 or 2^1 per 128 columns). */
static float *make_act(int T, int K, int integer) {
    float *x = malloc(sizeof(float) * T * K);
    for (int t = 0; t < T; t++)
        for (int c0 = 0; c0 < K; c0 += 128) {
            const int e = integer ? (int)dsv4_rng_below(&rng, 2) : (int)dsv4_rng_below(&rng, 17) - 8;
            for (int i = c0; i < K && i < c0 + 128; i++) {
                float v;
                if (integer) v = (float)ldexp((int)dsv4_rng_below(&rng, 5) - 2, e);
                else v = dsv4_rng_below(&rng, 16) == 0 ? 0.0f : (float)ldexp(dsv4_rng_normal(&rng), e);
                x[(int64_t)t * K + i] = bf16_value(v);
            }
        }
    return x;
}

static void sync_ok(const char *what) {
    dsv4_error err;
    if (cu_finish(NULL, what, &err)) fail_msg("%s", err.msg);
}

/* The device's packed bf16 rows of x [T][K]. */
typedef struct {
    uint16_t *b;
    int ldb;
} tact;

static tact pack(const float *x, int T, int K) {
    tact a;
    a.ldb = cu_mma16_ld(K);
    float *dx = cu_malloc(sizeof(float) * T * K);
    a.b = cu_malloc(sizeof(uint16_t) * (size_t)T * a.ldb);
    assert_true(dx && a.b);
    assert_int_equal(cu_upload(dx, x, sizeof(float) * T * K), 0);
    dsv4_error err;
    if (cu_mma16_pack(NULL, dx, K, T, K, a.b, a.ldb, &err)) fail_msg("%s", err.msg);
    sync_ok("pack");
    cu_free(dx);
    return a;
}

/* y[T][rows] for tokens [t0, t0 + T) of a (host copy), the weight in `groups` groups reading group_x apart. */
static void run_g(const dsv4_weight *dw, int groups, int group_x, const tact *a, int t0, int T, float *y) {
    const int N = dw->rows;
    float *dy = cu_malloc(sizeof(float) * T * N);
    assert_non_null(dy);
    dsv4_error err;
    if (cu_mma16_linear(NULL, dw, groups, a->b + (int64_t)t0 * a->ldb, a->ldb, group_x, T, dy, N, 0, &err)) fail_msg("%s", err.msg);
    sync_ok("mma16 linear");
    assert_int_equal(cu_download(y, dy, sizeof(float) * T * N), 0);
    cu_free(dy);
}
static void run(const dsv4_weight *dw, const tact *a, int t0, int T, float *y) { run_g(dw, 1, 0, a, t0, T, y); }

/* The weight decoded once (every value exact in float). */
static float *ref_decode(const dsv4_weight *w) {
    float *d = malloc(sizeof(float) * w->rows * w->cols);
    for (int r = 0; r < w->rows; r++)
        for (int i = 0; i < w->cols; i++) d[(int64_t)r * w->cols + i] = (float)ref_w(w, r, i);
    return d;
}

/* The sum (double: each product exact, the sum's rounding 2^-53 relative) and the sum of |products|. */
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

static const char *fmt_name(int fmt) { return fmt == WF_FP8 ? "FP8" : "BF16"; }

/* ---- tests ------------------------------------------------------------------------------------------------- */

static void pack_rounds_to_bf16(void **state) {
    (void)state;
    enum { T = 9, K = 1000 };
    float *x = make_act(T, K, 0);
    for (int i = 0; i < 64; i++) x[i] = (float)(dsv4_rng_normal(&rng) * 3.0);   /* not bf16 values: rounded */
    const uint32_t ties[] = { 0x3f808000u, 0x3f818000u, 0xbf808000u, 0x7f7fffffu };   /* even down, odd up, negative, max */
    for (int i = 0; i < 4; i++) memcpy(&x[64 + i], &ties[i], 4);
    tact a = pack(x, T, K);
    uint16_t *b = malloc(sizeof(uint16_t) * T * a.ldb);
    assert_int_equal(cu_download(b, a.b, sizeof(uint16_t) * T * a.ldb), 0);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < K; i++)
            if (b[(int64_t)t * a.ldb + i] != ref_to_bf16(x[(int64_t)t * K + i]))
                fail_msg("pack: row %d column %d: %04x, expected %04x (x = %.9g)", t, i, b[(int64_t)t * a.ldb + i],
                         ref_to_bf16(x[(int64_t)t * K + i]), x[(int64_t)t * K + i]);
    printf("  pack: bf16 rounded to nearest even for %d x %d values (ties, the largest float, bf16-valued rows exact)\n", T, K);
    free(b);
    free(x);
    cu_free(a.b);
}

/* One weight and token count: y == the exact reference (integers) or within the bound (realistic); grouped when
 * groups > 1 (group g's rows read columns [g*K, (g+1)*K) of rows G*K wide). */
static void check_against_ref(int fmt, int N, int K, int groups, int T, int integer) {
    tweight w = make_weight(fmt, N, K, integer);
    const int width = groups * K, gr = N / groups;
    float *x = make_act(T, width, integer), *y = malloc(sizeof(float) * T * N);
    tact a = pack(x, T, width);
    run_g(&w.d, groups, K, &a, 0, T, y);
    float *yl = NULL;
#ifndef MMA16_TEST_SHIM
    if (!integer) {   /* the fp32 CUDA-core kernel on the same rows, for comparison */
        float *dx = cu_malloc(sizeof(float) * T * width), *dy = cu_malloc(sizeof(float) * T * N);
        assert_true(dx && dy);
        assert_int_equal(cu_upload(dx, x, sizeof(float) * T * width), 0);
        if (groups > 1) cu_linear_grouped(NULL, &w.d, groups, dx, T, width, K, dy, N);
        else cu_linear(NULL, &w.d, dx, T, width, dy, N);
        sync_ok("cu_linear");
        yl = malloc(sizeof(float) * T * N);
        assert_int_equal(cu_download(yl, dy, sizeof(float) * T * N), 0);
        cu_free(dx);
        cu_free(dy);
    }
#endif
    float *wref = ref_decode(&w.h);
    double worst = 0, worst_lin = 0;
    for (int t = 0; t < T; t++)
        for (int r = 0; r < N; r++) {
            double ref, abs_sum;
            ref_dot(wref + (int64_t)r * K, K, x + (int64_t)t * width + (r / gr) * K, &ref, &abs_sum);
            const double got = y[(int64_t)t * N + r], err = fabs(got - ref);
            if (integer) {
                if (!(got == ref))
                    fail_msg("%s %dx%d (%d groups), %d tokens, integer inputs: y[%d][%d] = %.9g, exact %.9g (diff %.3g)", fmt_name(fmt),
                             N, K, groups, T, t, r, got, ref, got - ref);
                continue;
            }
            /* The bound: every product (bf16 x bf16, or e4m3 x bf16) is exact in fp32. A bf16 MMA adds its 16 products
             * and C in fp32, at worst aligning all 17 terms to the largest one and truncating each to fp32's 24 bits
             * (Fasi, Higham, Mikaitis, Pranesh 2021 on A100; Khattak & Mikaitis 2025): <= 17 * 2^-22 of the largest
             * term, which is <= the chunk's sum |w x|; a chunk chains at most 8 MMAs from a fresh fragment:
             * <= 2^-14.8 of it in the worst case (typically far less: the terms are not all at the top exponent).
             * The fp32 fmaf steps add at most (K/128 + 3) 2^-24 of sum |w x|. 2^-13 covers both; one swapped pair
             * of activations (a layout bug) moves y by ~ 2 |w x| ~ 2^-10 sum |w x| at these K, a wrong scale or
             * group by ~ |y|. */
            const double bound = ldexp(abs_sum, -13) + 1e-30;
            if (!(err <= bound))
                fail_msg("%s %dx%d (%d groups), %d tokens: y[%d][%d] = %.9g, reference %.9g, error %.3g > bound %.3g", fmt_name(fmt), N,
                         K, groups, T, t, r, got, ref, err, bound);
            if (abs_sum > 0 && err / abs_sum > worst) worst = err / abs_sum;
            if (yl) {
                const double el = fabs(yl[(int64_t)t * N + r] - ref);
                if (!(el <= bound))
                    fail_msg("cu_linear %s %dx%d: y[%d][%d] = %.9g, reference %.9g: error %.3g > %.3g", fmt_name(fmt), N, K, t, r,
                             yl[(int64_t)t * N + r], ref, el, bound);
                if (abs_sum > 0 && el / abs_sum > worst_lin) worst_lin = el / abs_sum;
            }
        }
    if (integer) printf("  %s %dx%d (%d groups), %d tokens, integer inputs: exact (==)\n", fmt_name(fmt), N, K, groups, T);
    else if (yl)
        printf("  %s %dx%d (%d groups), %d tokens: max |err| / sum|wx| = %.3g (bound 2^-13 = %.3g; cu_linear's %.3g)\n", fmt_name(fmt), N, K,
               groups, T, worst, ldexp(1, -13), worst_lin);
    else
        printf("  %s %dx%d (%d groups), %d tokens: max |err| / sum|wx| = %.3g (bound 2^-13 = %.3g)\n", fmt_name(fmt), N, K, groups, T, worst,
               ldexp(1, -13));
    free(x); free(y); free(yl); free(wref);
    cu_free(a.b);
    free_weight(&w);
}

static void exact_on_integers(void **state) {
    (void)state;
    static const int Ts[] = { 5, 21, 40 };   /* the three tile shapes: <= 8, <= 32, more */
    for (int k = 0; k < 3; k++) {
        check_against_ref(WF_BF16, 200, 1056, 1, Ts[k], 1);   /* 8 chunks and one unit of 32 */
        check_against_ref(WF_BF16, 200, 1120, 1, Ts[k], 1);   /* ... and three units */
        check_against_ref(WF_FP8, 200, 1024, 1, Ts[k], 1);
        check_against_ref(WF_FP8, 4 * 64, 512, 4, Ts[k], 1);    /* grouped, 64 rows a group: 32-row tiles */
        check_against_ref(WF_BF16, 3 * 48, 544, 3, Ts[k], 1);   /* grouped, 48 rows a group: 16-row tiles */
    }
}

static void close_on_realistic(void **state) {
    (void)state;
    check_against_ref(WF_BF16, 333, 2080, 1, 70, 0);
    check_against_ref(WF_FP8, 333, 2048, 1, 70, 0);
    check_against_ref(WF_FP8, 8 * 64, 1024, 8, 37, 0);
#ifdef MMA16_TEST_SHIM
    check_against_ref(WF_BF16, 512, 4096, 1, 3, 0);
    check_against_ref(WF_FP8, 8 * 32, 4096, 8, 1, 0);
#else
    check_against_ref(WF_BF16, 4096, 4096, 1, 3, 0);
    check_against_ref(WF_FP8, 8 * 1024, 4096, 8, 1, 0);   /* wo_a's shape */
#endif
}

/* Every token of each batch = the token alone; two runs equal; views = full rows; grouped rows = the group alone. */
static void batch_invariant_and_deterministic(void **state) {
    (void)state;
    enum { P = 200 };
    static const int Ts[] = { 1, 2, 7, 8, 9, 31, 33, 64, 200 };
    static const struct { int fmt, N, K, groups; } cases[] = {
        { WF_BF16, 333, 1120, 1 }, { WF_FP8, 333, 1024, 1 }, { WF_FP8, 4 * 96, 512, 4 }, { WF_BF16, 3 * 48, 544, 3 } };
    for (int ci = 0; ci < 4; ci++) {
        const int fmt = cases[ci].fmt, N = cases[ci].N, K = cases[ci].K, G = cases[ci].groups, width = G * K;
        tweight w = make_weight(fmt, N, K, 0);
        float *x = make_act(P, width, 0), *alone = malloc(sizeof(float) * P * N), *y = malloc(sizeof(float) * P * N),
              *y2 = malloc(sizeof(float) * P * N);
        tact a = pack(x, P, width);
        for (int t = 0; t < P; t++) run_g(&w.d, G, K, &a, t, 1, alone + (int64_t)t * N);
        for (int k = 0; k < (int)(sizeof Ts / sizeof Ts[0]); k++) {
            const int T = Ts[k];
            for (int t0 = 0; t0 <= P - T; t0 += (P - T > 0 ? P - T : 1)) {
                run_g(&w.d, G, K, &a, t0, T, y);
                for (int t = 0; t < T; t++)
                    if (memcmp(y + (int64_t)t * N, alone + (int64_t)(t0 + t) * N, sizeof(float) * N))
                        fail_msg("%s %dx%d (%d groups): token %d in a batch of %d (from %d) differs from the token alone", fmt_name(fmt), N, K,
                                 G, t0 + t, T, t0);
            }
        }
        run_g(&w.d, G, K, &a, 0, P, y);
        run_g(&w.d, G, K, &a, 0, P, y2);
        if (memcmp(y, y2, sizeof(float) * P * N)) fail_msg("%s: two runs of %d tokens differ", fmt_name(fmt), P);
        static const int Tv[] = { 1, 9, 200 };
        if (G == 1) {   /* rows through a view from row 40 (other tiles; FP8 scale rows through row0) = the full weight's */
            const int nv = 200;
            const dsv4_weight view = weight_rows(&w.d, 40, nv);
            float *yv = malloc(sizeof(float) * P * nv);
            for (int k = 0; k < 3; k++) {
                run(&view, &a, 0, Tv[k], yv);
                for (int t = 0; t < Tv[k]; t++)
                    if (memcmp(yv + (int64_t)t * nv, alone + (int64_t)t * N + 40, sizeof(float) * nv))
                        fail_msg("%s: rows 40..239 through a view differ from the full weight's (token %d of %d)", fmt_name(fmt), t, Tv[k]);
            }
            free(yv);
        } else {   /* group g's rows as a weight of its own, on its columns of the input = the grouped call's rows */
            const int gr = N / G;
            float *yg = malloc(sizeof(float) * P * gr);
            for (int g = 0; g < G; g++) {
                const dsv4_weight wg = weight_rows(&w.d, g * gr, gr);
                for (int k = 0; k < 3; k++) {
                    tact ag = { a.b + (int64_t)g * K, a.ldb };
                    run(&wg, &ag, 0, Tv[k], yg);
                    for (int t = 0; t < Tv[k]; t++)
                        if (memcmp(yg + (int64_t)t * gr, alone + (int64_t)t * N + g * gr, sizeof(float) * gr))
                            fail_msg("%s: group %d alone differs from its rows in the grouped call (token %d of %d)", fmt_name(fmt), g, t, Tv[k]);
                }
            }
            free(yg);
        }
        printf("  %s %dx%d (%d groups): every token of batches of 1 .. 200 = alone (memcmp); %s; two runs equal\n", fmt_name(fmt), N, K, G,
               G == 1 ? "view rows = full rows" : "each group alone = its grouped rows");
        free(x); free(alone); free(y); free(y2);
        cu_free(a.b);
        free_weight(&w);
    }
}

/* Several weights over the same rows in one launch (cu_mma16_linear_multi) = each weight alone, bit for bit; the
 * odd ones with out_bf16, whose outputs must be the host's bf16 rounding (formats.h round_bf16) of those. */
static void multi_equals_alone(void **state) {
    (void)state;
    enum { K = 1056, P = 40 };
    static const int rows[] = { 100, 64, 16, 33, 200 };
    tweight w[5];
    for (int j = 0; j < 5; j++) w[j] = make_weight(WF_BF16, rows[j], K, 0);
    float *x = make_act(P, K, 0);
    tact a = pack(x, P, K);
    static const int Ts[] = { 1, 9, 40 };
    for (int k = 0; k < 3; k++) {
        const int T = Ts[k];
        cu_mma16_out outs[5];
        float *dy[5], *got = malloc(sizeof(float) * T * 200), *want = malloc(sizeof(float) * T * 200);
        for (int j = 0; j < 5; j++) {
            dy[j] = cu_malloc(sizeof(float) * T * (rows[j] + 3));
            assert_non_null(dy[j]);
            outs[j] = (cu_mma16_out){ &w[j].d, dy[j], rows[j] + 3, j & 1 };   /* ldy > rows */
        }
        dsv4_error err;
        if (cu_mma16_linear_multi(NULL, outs, 5, a.b, a.ldb, T, &err)) fail_msg("%s", err.msg);
        sync_ok("multi");
        for (int j = 0; j < 5; j++) {
            run(&w[j].d, &a, 0, T, want);
            int rounded = 0;
            for (int i = 0; (j & 1) && i < T * rows[j]; i++) {
                rounded += round_bf16(want[i]) != want[i];
                want[i] = round_bf16(want[i]);
            }
            if ((j & 1) && !rounded) fail_msg("multi: weight %d's outputs were all bf16 values already: out_bf16 is not tested", j);
            float *back = malloc(sizeof(float) * T * (rows[j] + 3));
            assert_int_equal(cu_download(back, dy[j], sizeof(float) * T * (rows[j] + 3)), 0);
            for (int t = 0; t < T; t++) memcpy(got + (int64_t)t * rows[j], back + (int64_t)t * (rows[j] + 3), sizeof(float) * rows[j]);
            if (memcmp(got, want, sizeof(float) * T * rows[j]))
                fail_msg("multi: weight %d (%d rows) in one launch of 5 differs from its own launch at %d tokens", j, rows[j], T);
            free(back);
            cu_free(dy[j]);
        }
        free(got);
        free(want);
    }
    dsv4_error err;
    cu_mma16_out mixed[2] = { { &w[0].d, NULL, 100 }, { &w[1].d, NULL, 64 } };
    assert_int_equal(cu_mma16_linear_multi(NULL, mixed, 0, a.b, a.ldb, 1, &err), DSV4_E_ARG);
    assert_int_equal(cu_mma16_linear_multi(NULL, mixed, 7, a.b, a.ldb, 1, &err), DSV4_E_ARG);
    assert_int_equal(cu_mma16_linear_multi(NULL, mixed, 2, a.b, a.ldb, 1, &err), DSV4_E_ARG);   /* no outputs */
    tweight f8 = make_weight(WF_FP8, 16, 1024, 0);
    float *d2 = cu_malloc(sizeof(float) * 200);
    cu_mma16_out two[2] = { { &w[0].d, d2, 100 }, { &f8.d, d2 + 100, 16 } };
    assert_int_equal(cu_mma16_linear_multi(NULL, two, 2, a.b, a.ldb, 1, &err), DSV4_E_ARG);     /* BF16 and FP8 together */
    cu_free(d2);
    free_weight(&f8);
    printf("  5 BF16 weights (16 .. 200 rows) in one launch = each alone (memcmp) at 1, 9, 40 tokens; bad lists refused\n");
    free(x);
    cu_free(a.b);
    for (int j = 0; j < 5; j++) free_weight(&w[j]);
}

static void refuses_bad_shapes(void **state) {
    (void)state;
    tweight w8 = make_weight(WF_FP8, 32, 256, 0), w16 = make_weight(WF_BF16, 32, 256, 0);
    float *x = make_act(2, 512, 0);
    tact a = pack(x, 2, 512);
    float *dy = cu_malloc(sizeof(float) * 2 * 32);
    assert_non_null(dy);
    assert_int_equal(cu_fill_bytes(dy, 0x55, sizeof(float) * 2 * 32), 0);
    dsv4_error err;
    err.msg[0] = 0;
    dsv4_weight bad = w16.d;
    bad.fmt = WF_FP4;
    assert_int_equal(cu_mma16_linear(NULL, &bad, 1, a.b, a.ldb, 0, 2, dy, 32, 0, &err), DSV4_E_UNSUPPORTED);
    assert_true(err.msg[0] != 0);
    bad.fmt = WF_F32;
    assert_int_equal(cu_mma16_linear(NULL, &bad, 1, a.b, a.ldb, 0, 2, dy, 32, 0, &err), DSV4_E_UNSUPPORTED);
    bad = w8.d;
    bad.cols = 224;   /* FP8: not a multiple of 128 */
    assert_int_equal(cu_mma16_linear(NULL, &bad, 1, a.b, a.ldb, 0, 2, dy, 32, 0, &err), DSV4_E_ARG);
    bad = w16.d;
    bad.cols = 240;   /* BF16: not a multiple of 32 */
    assert_int_equal(cu_mma16_linear(NULL, &bad, 1, a.b, a.ldb, 0, 2, dy, 32, 0, &err), DSV4_E_ARG);
    bad = w16.d;
    bad.data = (const uint16_t *)w16.d.data + 4;   /* misaligned rows */
    assert_int_equal(cu_mma16_linear(NULL, &bad, 1, a.b, a.ldb, 0, 2, dy, 32, 0, &err), DSV4_E_ARG);
    assert_int_equal(cu_mma16_linear(NULL, &w16.d, 3, a.b, a.ldb, 128, 2, dy, 32, 0, &err), DSV4_E_ARG);   /* 32 rows in 3 groups */
    assert_int_equal(cu_mma16_linear(NULL, &w16.d, 4, a.b, a.ldb, 64, 2, dy, 32, 0, &err), DSV4_E_ARG);    /* 8 rows a group */
    assert_int_equal(cu_mma16_linear(NULL, &w16.d, 2, a.b, a.ldb, 257, 2, dy, 32, 0, &err), DSV4_E_ARG);   /* group_x % 8 */
    assert_int_equal(cu_mma16_linear(NULL, &w16.d, 2, a.b, a.ldb, 264, 2, dy, 32, 0, &err), DSV4_E_ARG);   /* past the row */
    assert_int_equal(cu_mma16_linear(NULL, &w16.d, 1, a.b + 4, a.ldb, 0, 2, dy, 32, 0, &err), DSV4_E_ARG); /* misaligned x */
    assert_int_equal(cu_mma16_linear(NULL, &w16.d, 1, a.b, 252, 0, 2, dy, 32, 0, &err), DSV4_E_ARG);       /* ldb < K */
    assert_int_equal(cu_mma16_linear(NULL, &w16.d, 1, a.b, a.ldb, 0, 2, dy, 31, 0, &err), DSV4_E_ARG);     /* ldy < N */
    assert_int_equal(cu_mma16_linear(NULL, &w16.d, 1, a.b, a.ldb, 0, -1, dy, 32, 0, &err), DSV4_E_ARG);
    assert_int_equal(cu_mma16_linear(NULL, &w16.d, 0, a.b, a.ldb, 0, 2, dy, 32, 0, &err), DSV4_E_ARG);     /* no groups */
    assert_int_equal(cu_mma16_pack(NULL, (const float *)dy, 512, 2, 512, a.b, 516, &err), DSV4_E_ARG);  /* ldb % 8 */
    sync_ok("refusals");
    uint32_t back[64];
    assert_int_equal(cu_download(back, dy, sizeof back), 0);
    for (int i = 0; i < 64; i++)
        if (back[i] != 0x55555555u) fail_msg("a refused call wrote its output");
    assert_int_equal(cu_mma16_linear(NULL, &w16.d, 1, a.b, a.ldb, 0, 0, dy, 32, 0, &err), 0);   /* no tokens: nothing to do */
    assert_int_equal(cu_mma16_linear(NULL, &w16.d, 2, a.b, a.ldb, 256, 2, dy, 32, 0, &err), 0); /* the widest grouping that fits */
    sync_ok("grouped call");
    printf("  refused: FP4 / F32 weights, FP8 cols %% 128, BF16 cols %% 32, misaligned weight / x, bad groups, short strides, "
           "T < 0 (nothing written)\n");
    cu_free(dy);
    free(x);
    cu_free(a.b);
    free_weight(&w8);
    free_weight(&w16);
}

/* ---- benchmark ------------------------------------------------------------------------------------------------ */

#ifndef MMA16_TEST_SHIM
/* One call: the tensor-core kernel on packed rows, or (xf non-NULL) the CUDA-core kernel on fp32 rows. */
static int call(cu_stream st, const dsv4_weight *w, int groups, const uint16_t *xb, int ldb, const float *xf, int T, float *y, int ldy,
                dsv4_error *err) {
    if (xf) {
        if (groups > 1) return cu_linear_grouped(st, w, groups, xf, T, ldb, w->cols, y, ldy);
        return cu_linear(st, w, xf, T, ldb, y, ldy);
    }
    return cu_mma16_linear(st, w, groups, xb, ldb, w->cols, T, y, ldy, 0, err);
}

/* Seconds per call: `reps` calls captured in a CUDA graph, timed by events, the weights cycling through `copies`
 * device copies (together > 256 MB, beyond the 60 MB L2). */
static double time_calls(dsv4_weight *ws, int copies, int groups, const uint16_t *xb, int ldb, const float *xf, int T, float *y, int ldy,
                         int reps) {
    dsv4_error err;
    snprintf(err.msg, sizeof err.msg, "cu_linear failed");
    cudaStream_t st;
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) return -1;
    for (int i = 0; i < copies; i++)
        if (call(st, &ws[i], groups, xb, ldb, xf, T, y, ldy, &err)) {
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
        for (int r = 0; r < reps; r++) call(st, &ws[r % copies], groups, xb, ldb, xf, T, y, ldy, &err);
        graph = cudaStreamEndCapture(st, &g) == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
    }
    graph = graph && cudaGraphLaunch(ge, st) == cudaSuccess && cudaStreamSynchronize(st) == cudaSuccess;   /* warm */
    if (graph) {
        ok = ok && cudaEventRecord(e0, st) == cudaSuccess && cudaGraphLaunch(ge, st) == cudaSuccess;
    } else {
        fprintf(stderr, "bench: CUDA graph capture failed (%s): timing plain launches\n", cudaGetErrorString(cudaGetLastError()));
        ok = ok && cudaEventRecord(e0, st) == cudaSuccess;
        for (int r = 0; ok && r < reps; r++) ok = call(st, &ws[r % copies], groups, xb, ldb, xf, T, y, ldy, &err) == 0;
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
    /* the V4-Flash BF16-input linears: name, format, rows, columns, groups */
    static const struct { const char *name; int fmt, N, K, G; } shapes[] = {
        { "wo_a", WF_FP8, 8192, 4096, 8 },     { "head", WF_BF16, 129280, 4096, 1 }, { "comp wkv", WF_BF16, 1024, 4096, 1 },
        { "hca wkv", WF_BF16, 512, 4096, 1 },  { "gate", WF_BF16, 256, 4096, 1 },    { "icomp", WF_BF16, 256, 4096, 1 },
        { "w_proj", WF_BF16, 64, 4096, 1 } };
    static const int Ts[] = { 1, 8, 512, 4096 };
    enum { TMAX = 4096, WMAX = 32768, NMAX = 129280 };
    char name[256];
    cu_device_name(name, sizeof name);
    printf("BF16-input tensor-core linear (k_mma16.cu) on %s; time per call in a CUDA graph over rotating weight copies (> 256 MB)\n",
           name);
    uint16_t *xb = cu_malloc(sizeof(uint16_t) * (size_t)TMAX * WMAX);
    float *y = cu_malloc(sizeof(float) * (size_t)TMAX * 8192), *yh = cu_malloc(sizeof(float) * (size_t)512 * NMAX);
    float *xf = cu_malloc(sizeof(float) * (size_t)512 * WMAX);
    if (!xb || !y || !yh || !xf) {
        fprintf(stderr, "bench: out of GPU memory\n");
        return 1;
    }
    cu_fill_bytes(xb, 0x3c, sizeof(uint16_t) * (size_t)TMAX * WMAX);   /* bf16 0x3c3c = 0.0115 */
    cu_fill_bytes(xf, 0x3c, sizeof(float) * (size_t)512 * WMAX);
    printf("%-9s %-5s %-13s %5s %10s %11s %9s %16s\n", "linear", "fmt", "N x K", "T", "us/call", "weight GB/s", "TFLOPS", "k_linear us/call");
    for (int k = 0; k < (int)(sizeof shapes / sizeof shapes[0]); k++) {
        const int N = shapes[k].N, K = shapes[k].K, G = shapes[k].G, fp8 = shapes[k].fmt == WF_FP8;
        dsv4_weight w = { shapes[k].fmt, N, K, NULL, NULL, fp8 ? K / 128 : 0, 0 };
        const size_t db = weight_bytes(&w), sb = weight_scale_bytes(&w);
        const int copies = (int)((256u << 20) / (db + sb)) + 1;
        dsv4_weight *ws = calloc(copies, sizeof *ws);
        int ok = 1;
        for (int i = 0; i < copies; i++) {
            ws[i] = w;
            void *d = cu_malloc(db), *sc = sb ? cu_malloc(sb) : NULL;
            if (!d || (sb && !sc)) ok = 0;
            if (!ok) break;
            cu_fill_synth(d, db, fp8 ? CU_SYNTH_FP8 : CU_SYNTH_BF16, 300 + i);
            if (sb) cu_fill_bytes(sc, 120, sb);
            ws[i].data = d;
            ws[i].scale = sc;
        }
        if (!ok) printf("%-9s: out of GPU memory for %d copies\n", shapes[k].name, copies);
        for (int j = 0; ok && j < (int)(sizeof Ts / sizeof Ts[0]); j++) {
            const int T = Ts[j];
            float *yy = N > 8192 ? yh : y;
            if (N > 8192 && T > 512) continue;
            const int reps = T <= 8 ? 100 : T <= 512 ? 20 : 5;
            const double sec = time_calls(ws, copies, G, xb, G * K, NULL, T, yy, N, reps);
            if (sec < 0) return 1;
            const double old = T <= 512 ? time_calls(ws, copies, G, NULL, G * K, xf, T, yy, N, T <= 8 ? 50 : 3) : 0;
            char oldtxt[32] = "";
            if (old > 0) snprintf(oldtxt, sizeof oldtxt, "%.1f", old * 1e6);
            printf("%-9s %-5s %6dx%-6d %5d %10.1f %11.0f %9.1f %16s\n", shapes[k].name, fp8 ? "FP8" : "BF16", N, K, T, sec * 1e6,
                   (double)(db + sb) / sec / 1e9, 2.0 * N * K * T / sec / 1e12, oldtxt);
        }
        for (int i = 0; i < copies; i++) {
            cu_free((void *)ws[i].data);
            cu_free((void *)ws[i].scale);
        }
        free(ws);
    }
    printf("(weight GB/s matters at T = 1, 8: H200 read bandwidth ~4.3 TB/s; TFLOPS at T >= 512: dense BF16 ~990)\n");
    cu_free(xb); cu_free(y); cu_free(yh); cu_free(xf);
    return 0;
}
#endif

int main(int argc, char **argv) {
#ifndef MMA16_TEST_SHIM
    dsv4_error why;
    if (!dsv4_cuda_available(&why)) {
        printf("gpu mma16: skipped, needs a GPU: %s\n", why.msg);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench();
#endif
    if (argc > 1) {
        fprintf(stderr, "usage: test_gpu_mma16 [--bench]\n");
        return 2;
    }
    dsv4_rng_seed(&rng, 2027);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(pack_rounds_to_bf16),
        cmocka_unit_test(exact_on_integers),
        cmocka_unit_test(close_on_realistic),
        cmocka_unit_test(batch_invariant_and_deterministic),
        cmocka_unit_test(multi_equals_alone),
        cmocka_unit_test(refuses_bad_shapes),
    };
    return cmocka_run_group_tests_name("gpu bf16 tensor-core linear", tests, NULL, NULL);
}
