/* For the CPU shim (tools/gpu/shim/cuda_shim.h): the tensor-core MMAs the kernels use, emulated from the PTX ISA's
 * fragment layouts, written independently of the kernels that use them (the bf16 m16n8k16 one: cuda_shim.cpp). Every lane of the warp must call them (as
 * on the GPU: .sync.aligned).
 *
 * mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 with every accumulator element c, emulated from the PTX ISA's fragment layout ("Matrix Fragments for mma.m16n8k32", .s8), written
 * independently of the kernels that use it: lane = 4 g + q, byte i of a register = element i;
 *   A (16 x 32): a0 = A[g][4q + i], a1 = A[g+8][4q + i], a2 = A[g][16 + 4q + i], a3 = A[g+8][16 + 4q + i];
 *   B (32 x 8):  b0 = B[4q + i][g], b1 = B[16 + 4q + i][g];
 *   D (16 x 8):  d0 = D[g][2q], d1 = D[g][2q+1], d2 = D[g+8][2q], d3 = D[g+8][2q+1].
 * Every lane of the warp must call it (as on the GPU: .sync.aligned). */
#ifndef DSV4_SHIM_MMA_H
#define DSV4_SHIM_MMA_H
#include "cuda_shim.h"

static inline void mma_s8_from(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1, int c) {
    uint64_t fa[32], fb[32], fc[32];
    memcpy(fa, shim_warp_exchange(a0 | (uint64_t)a1 << 32), sizeof fa);
    memcpy(fb, shim_warp_exchange(a2 | (uint64_t)a3 << 32), sizeof fb);
    memcpy(fc, shim_warp_exchange(b0 | (uint64_t)b1 << 32), sizeof fc);
    int8_t A[16][32], B[32][8];
    for (int L = 0; L < 32; L++) {
        const int g = L >> 2, q = L & 3;
        for (int i = 0; i < 4; i++) {
            A[g][4 * q + i] = (int8_t)(fa[L] >> (8 * i));
            A[g + 8][4 * q + i] = (int8_t)(fa[L] >> (32 + 8 * i));
            A[g][16 + 4 * q + i] = (int8_t)(fb[L] >> (8 * i));
            A[g + 8][16 + 4 * q + i] = (int8_t)(fb[L] >> (32 + 8 * i));
            B[4 * q + i][g] = (int8_t)(fc[L] >> (8 * i));
            B[16 + 4 * q + i][g] = (int8_t)(fc[L] >> (32 + 8 * i));
        }
    }
    const int g = (int)shim_lane() >> 2, q = (int)shim_lane() & 3;
    for (int e = 0; e < 4; e++) {
        const int row = g + 8 * (e >> 1), col = 2 * q + (e & 1);
        int s = 0;
        for (int k = 0; k < 32; k++) s += (int)A[row][k] * (int)B[k][col];
        d[e] = c + s;
    }
}

/* mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32, D = A B + C, from the same fragment layout as mma_s8_from above
 * (.e4m3 uses the .s8 one: "Matrix Fragments for mma.m16n8k32"); C and D share the layout of d, so each lane's own
 * C is its elements'. E4M3 decoded here from the format's definition (sign, 4 exponent bits of bias 7, 3 mantissa
 * bits, exponent 0 subnormal m 2^-9, S.1111.111 NaN). Each element is C plus its 32 exact products summed in double
 * and rounded once: a function of its own row, column and C, as the hardware's (whose last bits may differ: it
 * truncates to fewer bits). */
static inline double shim_e4m3(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    double v;
    if (e == 15 && m == 7) v = NAN;
    else if (e == 0) v = ldexp(m, -9);
    else v = ldexp(8 + m, e - 10);
    return (b & 0x80) ? -v : v;
}

static inline void shim_mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    uint64_t fa[32], fb[32], fc[32];
    memcpy(fa, shim_warp_exchange(a0 | (uint64_t)a1 << 32), sizeof fa);
    memcpy(fb, shim_warp_exchange(a2 | (uint64_t)a3 << 32), sizeof fb);
    memcpy(fc, shim_warp_exchange(b0 | (uint64_t)b1 << 32), sizeof fc);
    uint8_t A[16][32], B[32][8];
    for (int L = 0; L < 32; L++) {
        const int g = L >> 2, q = L & 3;
        for (int i = 0; i < 4; i++) {
            A[g][4 * q + i] = (uint8_t)(fa[L] >> (8 * i));
            A[g + 8][4 * q + i] = (uint8_t)(fa[L] >> (32 + 8 * i));
            A[g][16 + 4 * q + i] = (uint8_t)(fb[L] >> (8 * i));
            A[g + 8][16 + 4 * q + i] = (uint8_t)(fb[L] >> (32 + 8 * i));
            B[4 * q + i][g] = (uint8_t)(fc[L] >> (8 * i));
            B[16 + 4 * q + i][g] = (uint8_t)(fc[L] >> (32 + 8 * i));
        }
    }
    const int g = (int)shim_lane() >> 2, q = (int)shim_lane() & 3;
    for (int e = 0; e < 4; e++) {
        const int row = g + 8 * (e >> 1), col = 2 * q + (e & 1);
        double s = d[e];
        for (int k = 0; k < 32; k++) s += shim_e4m3(A[row][k]) * shim_e4m3(B[k][col]);
        d[e] = (float)s;
    }
}

#endif
