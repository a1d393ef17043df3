/* The multi-token micro-kernel: a tile of TILE_R weight rows (already decoded to fp32) times TILE_T tokens.
 *
 * Reduction order (the same as dot_f32 in kernels.h, bit for bit): output (r, t) keeps 32 lanes; lane j
 * accumulates w[r][k+j] * x[t][k+j] for k = 0, 32, 64, ... < n32 (n32 = n rounded down to 32) with one FMA per
 * step, in increasing k; the 32 lanes are added by vec_reduce32's tree (vec_reduce32_zmm on AVX-512); then the
 * tail i = n32..n-1 is accumulated by scalar FMAs from 0 in increasing i and added last.
 *
 * Why it is faster than dot2_f32 while giving the same bits: each lane's FMA chain is independent of the
 * others, so the kernel may run the lane groups (16 lanes of a zmm, 8 of a ymm) one after the other. One pass
 * over a lane group then needs a single accumulator per output, which leaves registers for TILE_R x TILE_T
 * outputs at once: every weight vector loaded feeds TILE_T FMAs and every activation vector TILE_R of them
 * (0.4 loads per FMA on AVX-512, against 1.5 for dot2_f32). */
#ifndef DSV4_CPU_TILE_H
#define DSV4_CPU_TILE_H
#include "backend/cpu/isa.h"
#include "backend/cpu/vec.h"

#if defined(DSV4_AVX512)
#define TILE_R 4
#define TILE_T 6
#elif defined(DSV4_AVX2)
#define TILE_R 3
#define TILE_T 4
#else
#define TILE_R 1
#define TILE_T 2
#endif

/* out[r * TILE_T + t] = dot_f32(w[r], x[t], n), bit for bit. Pointers may repeat (a partial tile repeats its
 * last row/token; the caller ignores those outputs). */
void ISA_FN(tile_dot_f32)(const float *const w[TILE_R], const float *const x[TILE_T], int n, float out[TILE_R * TILE_T]);
#endif
