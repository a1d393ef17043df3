/* CPU kernels. Each output element is computed by one fixed code path with a fixed summation order, whatever
 * the number of tokens in the call or the number of threads: this is what makes one-shot, chunked and
 * token-by-token processing bit-identical in EXACT mode. */
#ifndef DSV4_CPU_KERNELS_H
#define DSV4_CPU_KERNELS_H
#include "backend/cpu/pool.h"
#include "model/weight.h"

/* Dot product with 16 fixed lanes reduced as a fixed tree, then the tail. */
static inline float dot_f32(const float *a, const float *b, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[i + j] * b[i + j];
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    for (int s = 8; s > 0; s >>= 1)
        for (int j = 0; j < s; j++) acc[j] += acc[j + s];
    return acc[0] + tail;
}

/* y[t*ldy + o] = sum_i W[o][i] * x[t*ldx + i] for t < T, o < w->rows. Weights are decoded row by row inside
 * the loop (read once for all T tokens). */
void cpu_linear(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *y, int ldy);
#endif
