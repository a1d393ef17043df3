/* The TILE_R x TILE_T micro-kernel (tile.h states its reduction order: dot_f32's, bit for bit). */
#include "backend/cpu/isa.h"
#include "backend/cpu/tile.h"
#include "backend/cpu/kernels.h"

#if defined(DSV4_AVX512) || defined(DSV4_AVX2)
/* The scalar tail of dot_f32: FMAs from 0 over i = n32..n-1 in increasing i. */
static inline float tail_dot(const float *w, const float *x, int n32, int n) {
    float tail = 0.0f;
    for (int i = n32; i < n; i++) tail = fmaf(w[i], x[i], tail);
    return tail;
}
#endif

/* One lane group of dot_f32's 32 lanes per vector: AVX-512 runs lanes 0-15 (its z0) then 16-31 (z1), AVX2
 * lanes 8g..8g+7 (its a0..a3) for g = 0..3. The loop below is written once for both. */
#if defined(DSV4_AVX512)
typedef __m512 lane_vec;
enum { GROUP_LANES = 16 };
#define lane_zero _mm512_setzero_ps
#define lane_load _mm512_loadu_ps
#define lane_fma _mm512_fmadd_ps
#elif defined(DSV4_AVX2)
typedef __m256 lane_vec;
enum { GROUP_LANES = 8 };
#define lane_zero _mm256_setzero_ps
#define lane_load _mm256_loadu_ps
#define lane_fma _mm256_fmadd_ps
static inline float reduce_groups(const lane_vec p[4]) { return vec_reduce32(p[0], p[1], p[2], p[3]); }
#endif

void ISA_FN(tile_dot_f32)(const float *const w[TILE_R], const float *const x[TILE_T], int n, float out[TILE_R * TILE_T]) {
    const int n32 = n & ~31;
#if defined(DSV4_AVX512) || defined(DSV4_AVX2)
    /* Columns go in blocks of KBLOCK: one block of the tile's rows and tokens (4 x 2 KiB + 6 x 2 KiB on
     * AVX-512) stays in L1 while both lane groups pass over it; a pass over the whole row would not fit for
     * rows of 2048 columns and more, and the second lane group would read everything again from L2 (measured
     * 1.3-1.5x slower in isolation). A lane group's accumulators wait in part[] between blocks, which leaves
     * every lane's FMA chain in increasing k: the same order as without blocks. */
    enum { GROUPS = 32 / GROUP_LANES, KBLOCK = 512 };
    lane_vec part[TILE_R][TILE_T][GROUPS];
#pragma GCC unroll 8
    for (int r = 0; r < TILE_R; r++)
#pragma GCC unroll 8
        for (int t = 0; t < TILE_T; t++)
            for (int g = 0; g < GROUPS; g++) part[r][t][g] = lane_zero();
    for (int k0 = 0; k0 < n32; k0 += KBLOCK) {
        const int k1 = n32 - k0 < KBLOCK ? n32 : k0 + KBLOCK;
        for (int g = 0; g < GROUPS; g++) {
            lane_vec acc[TILE_R][TILE_T];
#pragma GCC unroll 8
            for (int r = 0; r < TILE_R; r++)
#pragma GCC unroll 8
                for (int t = 0; t < TILE_T; t++) acc[r][t] = part[r][t][g];
            for (int k = k0 + GROUP_LANES * g; k < k1; k += 32) {
#pragma GCC unroll 8
                for (int r = 0; r < TILE_R; r++) {
                    const lane_vec wv = lane_load(w[r] + k);
#pragma GCC unroll 8
                    for (int t = 0; t < TILE_T; t++) acc[r][t] = lane_fma(wv, lane_load(x[t] + k), acc[r][t]);
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < TILE_R; r++)
#pragma GCC unroll 8
                for (int t = 0; t < TILE_T; t++) part[r][t][g] = acc[r][t];
        }
    }
#if defined(DSV4_AVX512)
    /* the trees of all the tile's outputs together (vec.h): lanes j + j+16 here, the rest side by side */
    __m512 half[TILE_R * TILE_T];
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < TILE_T; t++) half[r * TILE_T + t] = _mm512_add_ps(part[r][t][0], part[r][t][1]);
    vec_reduce16_zmm_n(half, TILE_R * TILE_T, out);
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < TILE_T; t++) out[r * TILE_T + t] += tail_dot(w[r], x[t], n32, n);
#else
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < TILE_T; t++) out[r * TILE_T + t] = reduce_groups(part[r][t]) + tail_dot(w[r], x[t], n32, n);
#endif
#else
    (void)n32;
    for (int r = 0; r < TILE_R; r++)
        for (int t = 0; t < TILE_T; t++) out[r * TILE_T + t] = dot_f32(w[r], x[t], n);
#endif
}
