/* The TILE_R x TILE_T micro-kernel (tile.h states its reduction order: dot_f32's, bit for bit). */
#include "backend/cpu/tile.h"
#include "backend/cpu/kernels.h"

/* The scalar tail of dot_f32: FMAs from 0 over i = n32..n-1 in increasing i. */
static inline float tail_dot(const float *w, const float *x, int n32, int n) {
    float tail = 0.0f;
    for (int i = n32; i < n; i++) tail = fmaf(w[i], x[i], tail);
    return tail;
}

void tile_dot_f32(const float *const w[TILE_R], const float *const x[TILE_T], int n, float out[TILE_R * TILE_T]) {
    const int n32 = n & ~31;
#if defined(DSV4_AVX512)
    /* lane group g = 0 holds lanes 0-15 (dot_f32's z0), g = 1 lanes 16-31 (its z1) */
    __m512 part[2][TILE_R][TILE_T];
    for (int g = 0; g < 2; g++) {
        __m512 acc[TILE_R][TILE_T];
#pragma GCC unroll 8
        for (int r = 0; r < TILE_R; r++)
#pragma GCC unroll 8
            for (int t = 0; t < TILE_T; t++) acc[r][t] = _mm512_setzero_ps();
        for (int k = 16 * g; k < n32; k += 32) {
#pragma GCC unroll 8
            for (int r = 0; r < TILE_R; r++) {
                const __m512 wv = _mm512_loadu_ps(w[r] + k);
#pragma GCC unroll 8
                for (int t = 0; t < TILE_T; t++) acc[r][t] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x[t] + k), acc[r][t]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < TILE_R; r++)
#pragma GCC unroll 8
            for (int t = 0; t < TILE_T; t++) part[g][r][t] = acc[r][t];
    }
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < TILE_T; t++)
            out[r * TILE_T + t] = vec_reduce32_zmm(part[0][r][t], part[1][r][t]) + tail_dot(w[r], x[t], n32, n);
#elif defined(DSV4_AVX2)
    /* lane group g holds lanes 8g..8g+7 (dot_f32's a0..a3) */
    __m256 part[4][TILE_R][TILE_T];
    for (int g = 0; g < 4; g++) {
        __m256 acc[TILE_R][TILE_T];
#pragma GCC unroll 8
        for (int r = 0; r < TILE_R; r++)
#pragma GCC unroll 8
            for (int t = 0; t < TILE_T; t++) acc[r][t] = _mm256_setzero_ps();
        for (int k = 8 * g; k < n32; k += 32) {
#pragma GCC unroll 8
            for (int r = 0; r < TILE_R; r++) {
                const __m256 wv = _mm256_loadu_ps(w[r] + k);
#pragma GCC unroll 8
                for (int t = 0; t < TILE_T; t++) acc[r][t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[t] + k), acc[r][t]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < TILE_R; r++)
#pragma GCC unroll 8
            for (int t = 0; t < TILE_T; t++) part[g][r][t] = acc[r][t];
    }
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < TILE_T; t++)
            out[r * TILE_T + t] = vec_reduce32(part[0][r][t], part[1][r][t], part[2][r][t], part[3][r][t]) +
                                  tail_dot(w[r], x[t], n32, n);
#else
    (void)n32;
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < TILE_T; t++) out[r * TILE_T + t] = dot_f32(w[r], x[t], n);
#endif
}
