/* CPU kernels. Each output element is computed by one fixed code path with a fixed summation order, whatever
 * the number of tokens in the call or the number of threads: this is what makes one-shot, chunked and
 * token-by-token processing bit-identical in EXACT mode. */
#ifndef DSV4_CPU_KERNELS_H
#define DSV4_CPU_KERNELS_H
#include "backend/cpu/pool.h"
#include "backend/cpu/vec.h"
#include "model/weight.h"
#include <math.h>

/* Dot product with 32 fixed lanes (four independent vector accumulators, enough to hide FMA latency), reduced
 * by vec_reduce32's fixed tree, then the tail. The order never depends on the caller. */
static inline float dot_f32(const float *a, const float *b, int n) {
    int i = 0;
    float tail = 0.0f;
#ifdef DSV4_AVX2
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
    float acc[32] = {0};
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 32; j++) acc[j] += a[i + j] * b[i + j];
    for (; i < n; i++) tail += a[i] * b[i];
    for (int s = 16; s > 0; s >>= 1)
        for (int j = 0; j < s; j++) acc[j] += acc[j + s];
    return acc[0] + tail;
#endif
}

/* Decode one weight row into fp32 (exact). */
void weight_decode_row(const dsv4_weight *w, int row, float *out);
/* dot(row `row` of w, x): bit-identical to weight_decode_row followed by dot_f32, without the round trip
 * through memory (the decode-time path: one token reads each weight once). */
float weight_dot_row(const dsv4_weight *w, int row, const float *x, float *scratch);

/* y[t*ldy + o] = sum_i W[o][i] * x[t*ldx + i] for t < T, o < w->rows. Weights are decoded row by row inside
 * the loop (read once for all T tokens). */
void cpu_linear(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *y, int ldy);
/* The same with one output row per token: y_rows[t][o]. (The LM head of a step whose logits go to several
 * callers' buffers: the head is read once for all of them.) */
void cpu_linear_scatter(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *const *y_rows);
#endif
