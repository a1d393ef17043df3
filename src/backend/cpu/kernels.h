/* CPU kernels. Each output element is computed by one fixed code path with a fixed summation order, whatever
 * the number of tokens in the call or the number of threads: this is what makes one-shot, chunked and
 * token-by-token processing bit-identical in EXACT mode. */
#ifndef DSV4_CPU_KERNELS_H
#define DSV4_CPU_KERNELS_H
#include "backend/cpu/pool.h"
#include "backend/cpu/vec.h"
#include "model/weight.h"
#include <math.h>
#include <stddef.h>

/* Dot product with 32 fixed lanes (four independent vector accumulators, enough to hide FMA latency), reduced
 * by vec_reduce32's fixed tree, then the tail. The order never depends on the caller. */
static inline float dot_f32(const float *a, const float *b, int n) {
    int i = 0;
    float tail = 0.0f;
#if defined(DSV4_AVX512)
    /* the same 32 lanes as the AVX2 form: zmm0 = lanes 0-15, zmm1 = lanes 16-31 */
    __m512 z0 = _mm512_setzero_ps(), z1 = z0;
    for (; i + 32 <= n; i += 32) {
        z0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), z0);
        z1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), z1);
    }
    for (; i < n; i++) tail = fmaf(a[i], b[i], tail);
    return vec_reduce32_zmm(z0, z1) + tail;
#elif defined(DSV4_AVX2)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), a3);
    }
    for (; i < n; i++) tail = fmaf(a[i], b[i], tail);
    return vec_reduce32(a0, a1, a2, a3) + tail;
#else
    /* the same 32 lanes, FMAs and tree without vectors (the tree halves as vec_reduce32 does: lanes j and j + 16,
     * then j and j + 8, ...) */
    float acc[32] = {0};
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 32; j++) acc[j] = fmaf(a[i + j], b[i + j], acc[j]);
    for (; i < n; i++) tail = fmaf(a[i], b[i], tail);
    for (int s = 16; s > 0; s >>= 1)
        for (int j = 0; j < s; j++) acc[j] += acc[j + s];
    return acc[0] + tail;
#endif
}

/* Two dots against one row at once (the row is loaded once): r0 = dot_f32(a, b0, n), r1 = dot_f32(a, b1, n),
 * bit for bit. */
static inline void dot2_f32(const float *a, const float *b0, const float *b1, int n, float *r0, float *r1) {
#if defined(DSV4_AVX512)
    __m512 p0 = _mm512_setzero_ps(), p1 = p0, q0 = p0, q1 = p0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 w0 = _mm512_loadu_ps(a + i), w1 = _mm512_loadu_ps(a + i + 16);
        p0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(b0 + i), p0);
        p1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(b0 + i + 16), p1);
        q0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(b1 + i), q0);
        q1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(b1 + i + 16), q1);
    }
    float t0 = 0.0f, t1 = 0.0f;
    for (; i < n; i++) {
        t0 = fmaf(a[i], b0[i], t0);
        t1 = fmaf(a[i], b1[i], t1);
    }
    *r0 = vec_reduce32_zmm(p0, p1) + t0;
    *r1 = vec_reduce32_zmm(q0, q1) + t1;
#else
    *r0 = dot_f32(a, b0, n);
    *r1 = dot_f32(a, b1, n);
#endif
}

/* Four dots against one row at once (the row is loaded once for the four): r[k] = dot_f32(a, b[k], n), bit for
 * bit (each its own two lane accumulators, the same tree and tail; with the operands of each product swapped, which
 * changes no product). */
static inline void dot4_f32(const float *a, const float *const b[4], int n, float r[4]) {
#if defined(DSV4_AVX512)
    __m512 p[4][2];
    for (int k = 0; k < 4; k++) p[k][0] = p[k][1] = _mm512_setzero_ps();
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 w0 = _mm512_loadu_ps(a + i), w1 = _mm512_loadu_ps(a + i + 16);
        for (int k = 0; k < 4; k++) {
            p[k][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(b[k] + i), p[k][0]);
            p[k][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(b[k] + i + 16), p[k][1]);
        }
    }
    float t[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    for (; i < n; i++)
        for (int k = 0; k < 4; k++) t[k] = fmaf(a[i], b[k][i], t[k]);
    for (int k = 0; k < 4; k++) r[k] = vec_reduce32_zmm(p[k][0], p[k][1]) + t[k];
#else
    for (int k = 0; k < 4; k++) r[k] = dot_f32(a, b[k], n);
#endif
}

/* Ask for n bytes at p to be brought into the caches ahead of their use (one request per 64-byte line). The
 * one-token linears stream every weight byte once; prefetching moves no result. */
static inline void prefetch_bytes(const void *p, size_t n) {
    for (size_t i = 0; i < n; i += 64) __builtin_prefetch((const char *)p + i, 0, 3);
}

/* Decode one weight row into fp32 (exact). (These two run the best kernel set of this CPU, isa.h: the bits are
 * the same in every set.) */
void weight_decode_row(const dsv4_weight *w, int row, float *out);
/* dot(row `row` of w, x): bit-identical to weight_decode_row followed by dot_f32, without the round trip
 * through memory (the decode-time path: one token reads each weight once). */
float weight_dot_row(const dsv4_weight *w, int row, const float *x, float *scratch);

/* y[t*ldy + o] = sum_i W[o][i] * x[t*ldx + i] for t < T, o < w->rows, with the pool's kernel set (isa.h).
 * Weights are decoded row by row inside the loop (read once for all T tokens). */
void cpu_linear(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *y, int ldy);
/* The same with one output row per token: y_rows[t][o]. (The LM head of a step whose logits go to several
 * callers' buffers: the head is read once for all of them.) */
void cpu_linear_scatter(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *const *y_rows);
/* Which accumulation order a model's linears with bf16-exact inputs take (OFFICIAL mode on the CPU; fixed at
 * load): EXACT's fp32 order (cpu_linear), the pair order of pairs.h (OFFICIAL's default), or the AMX tiles'
 * order of amx.h (opt-in). */
typedef enum { CPU_DOTS_F32 = 0, CPU_DOTS_PAIRS = 1, CPU_DOTS_AMX = 2 } cpu_dots;
/* cpu_linear for inputs whose every value is exactly a bf16 (OFFICIAL linear inputs after FP8 quantization or
 * bf16 rounding), in the order `dots` names; a weight format the order does not take (F32; BF16/FP8/FP4 on a CPU
 * without AMX-BF16 for CPU_DOTS_AMX) gets cpu_linear's. The same order for every T. */
void cpu_linear_bf16in(dsv4_pool *pool, cpu_dots dots, const dsv4_weight *w, const float *x, int T, int ldx, float *y,
                       int ldy);
/* The same with one output row per token (cpu_linear_scatter's y_rows). */
void cpu_linear_bf16in_scatter(dsv4_pool *pool, cpu_dots dots, const dsv4_weight *w, const float *x, int T, int ldx,
                               float *const *y_rows);
#endif
