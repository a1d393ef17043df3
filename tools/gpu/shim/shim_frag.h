/* For the CPU shims of the FP8/FP4 tensor-core linears (shim_mma.sh: k_mma.cu, shim_gemm.sh: k_mma_gemm.cu,
 * shim_stream.sh: k_mma_stream.cu): C++ of the inline assembly they share, cu_mma_frag.cuh's PTX section and
 * k_mma.cu's read-only loads, each by the instruction's definition (PTX ISA), not by the kernels' use of it. The
 * shims strip the kernels' own PTX sections and take these instead; what follows cu_mma_frag.cuh's section
 * (e2m1x4_e4m3) is plain CUDA C++ and is compiled as is. */
#ifndef DSV4_SHIM_FRAG_H
#define DSV4_SHIM_FRAG_H
#include "shim_mma.h"

/* cvt.rn.f16x2.e4m3x2 of bytes 0-1 (lo) or 2-3 (hi) of v: each E4M3 value as fp16 bits, the lower byte in the lower
 * half (exact: every E4M3 value, subnormals included, is an fp16 normal or zero; NaN to an fp16 NaN). */
static inline uint16_t shim_f16_of_e4m3(uint8_t b) {
    const uint16_t s = (uint16_t)((b & 0x80) << 8);
    const double v = fabs(shim_e4m3(b));
    if (v != v) return (uint16_t)(s | 0x7E00);
    if (v == 0) return s;
    int e;
    const double m = frexp(v, &e);   /* v = m 2^e, m in [0.5, 1) */
    return (uint16_t)(s | (e - 1 + 15) << 10 | (uint16_t)ldexp(m * 2 - 1, 10));
}
static inline uint32_t e4m3_lo_f16x2(uint32_t v) { return shim_f16_of_e4m3((uint8_t)v) | (uint32_t)shim_f16_of_e4m3((uint8_t)(v >> 8)) << 16; }
static inline uint32_t e4m3_hi_f16x2(uint32_t v) { return e4m3_lo_f16x2(v >> 16); }
/* An fp16's value (normals, subnormals, zeros; NaN / infinity as such). */
static inline double shim_f16(uint16_t h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return h & 0x8000 ? -v : v;
}
/* mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, D = A B + C (PTX ISA "Matrix Fragments for mma.m16n8k16" with
 * .f16: a0 = A[g][2q + i], a1 = A[g+8][2q + i], a2 = A[g][8 + 2q + i], a3 = A[g+8][8 + 2q + i]; b0 = B[2q + i][g],
 * b1 = B[8 + 2q + i][g]; half i of each register). Each element is C plus its 16 exact products summed in double
 * (k in order), rounded once: a function of its own row, column and C, as the hardware's. */
/* The warp's 16 x 16 fp16 A tile from its lanes' registers a0..a3 in that layout (mma.m16n8k16; a warp's share of
 * wgmma's register A alike). Every lane of the warp calls it. */
static inline void shim_a_f16(double (&A)[16][16], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3) {
    uint64_t fa[32], fb[32];
    memcpy(fa, shim_warp_exchange(a0 | (uint64_t)a1 << 32), sizeof fa);
    memcpy(fb, shim_warp_exchange(a2 | (uint64_t)a3 << 32), sizeof fb);
    for (int L = 0; L < 32; L++) {
        const int g = L >> 2, q = L & 3;
        for (int i = 0; i < 2; i++) {
            A[g][2 * q + i] = shim_f16((uint16_t)(fa[L] >> (16 * i)));
            A[g + 8][2 * q + i] = shim_f16((uint16_t)(fa[L] >> (32 + 16 * i)));
            A[g][8 + 2 * q + i] = shim_f16((uint16_t)(fb[L] >> (16 * i)));
            A[g + 8][8 + 2 * q + i] = shim_f16((uint16_t)(fb[L] >> (32 + 16 * i)));
        }
    }
}
static inline void hmma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    double A[16][16], B[16][8];
    shim_a_f16(A, a0, a1, a2, a3);
    uint64_t fc[32];
    memcpy(fc, shim_warp_exchange(b0 | (uint64_t)b1 << 32), sizeof fc);
    for (int L = 0; L < 32; L++) {
        const int g = L >> 2, q = L & 3;
        for (int i = 0; i < 2; i++) {
            B[2 * q + i][g] = shim_f16((uint16_t)(fc[L] >> (16 * i)));
            B[8 + 2 * q + i][g] = shim_f16((uint16_t)(fc[L] >> (32 + 16 * i)));
        }
    }
    const int g = (int)shim_lane() >> 2, q = (int)shim_lane() & 3;
    for (int e = 0; e < 4; e++) {
        const int row = g + 8 * (e >> 1), col = 2 * q + (e & 1);
        double s = d[e];
        for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
        d[e] = (float)s;
    }
}

/* mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32. By default shim_mma.h's: the fragment layout, exact products
 * summed in double, rounded once. With SHIM_E4M3_WRITTEN (shim_gemm.sh) as sm_90 computes it (cu_mma_frag.cuh,
 * mma_e4m3_written): t = HMMA(the registers' low byte pairs as fp16, from 0), t = HMMA(the high pairs, t), D = C + t,
 * so that a kernel on fp16 MMAs (k_mma_gemm.cu's warpgroup path, its wgmma emulated by the same sums) must take the
 * same products into the same k16 steps to match it. Every lane of the warp calls it. */
static inline void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
#ifdef SHIM_E4M3_WRITTEN
    float t[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    hmma_f16(t, e4m3_lo_f16x2(a0), e4m3_lo_f16x2(a1), e4m3_lo_f16x2(a2), e4m3_lo_f16x2(a3), e4m3_lo_f16x2(b0), e4m3_lo_f16x2(b1));
    hmma_f16(t, e4m3_hi_f16x2(a0), e4m3_hi_f16x2(a1), e4m3_hi_f16x2(a2), e4m3_hi_f16x2(a3), e4m3_hi_f16x2(b0), e4m3_hi_f16x2(b1));
    for (int e = 0; e < 4; e++) d[e] = d[e] + t[e];
#else
    shim_mma_e4m3(d, a0, a1, a2, a3, b0, b1);
#endif
}

/* mma.sync.aligned: all 32 lanes execute the same instruction. The emulation meets the lanes wherever they call it
 * from, so each call also names its site (the calling function, template arguments included, and the line) and
 * every lane must name the same one: a branch taken by some lanes only, each side with its own MMA, aborts here
 * (on the GPU it hangs: run 46's lean expert kernel). */
static inline void shim_mma_site(const char *fn, int line) {
    const uint64_t site = (uint64_t)(uintptr_t)fn * 1000003u + (uint64_t)line;
    const uint64_t *x = shim_warp_exchange(site);
    for (int i = 0; i < 32; i++)
        if (x[i] != x[0]) {
            fprintf(stderr, "shim: mma.sync.aligned reached from different places by lanes 0 and %d of a warp (%s, line %d)\n", i, fn, line);
            abort();
        }
}
#define mma_e4m3(d, ...) (shim_mma_site(__PRETTY_FUNCTION__, __LINE__), mma_e4m3(d, __VA_ARGS__))

/* prmt.b32, generic form: byte k of the result is byte (c >> 4k) & 7 of the 8 bytes {b, a} (a = bytes 0..3), or
 * that byte's sign bit replicated when bit 3 of the selector nibble is set. */
static inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t c) {
    const uint64_t ab = a | (uint64_t)b << 32;
    uint32_t d = 0;
    for (int k = 0; k < 4; k++) {
        const unsigned sel = (c >> (4 * k)) & 15;
        uint32_t byte = (uint32_t)(ab >> (8 * (sel & 7))) & 0xff;
        if (sel & 8) byte = byte & 0x80 ? 0xff : 0;
        d |= byte << (8 * k);
    }
    return d;
}

/* ld.global.nc(.L1::no_allocate.L2::256B).v4.u32 / .v2.u32 / .u32: plain reads, their alignment checked as the hardware
 * requires it. */
static inline uint4 ld_stream16(const uint8_t *p) {
    if ((uintptr_t)p & 15) { fprintf(stderr, "shim: ld_stream16 at %p: not 16-byte aligned\n", (const void *)p); abort(); }
    return *(const uint4 *)p;
}
static inline uint2 ld_nc64(const uint8_t *p) {
    if ((uintptr_t)p & 7) { fprintf(stderr, "shim: ld_nc64 at %p: not 8-byte aligned\n", (const void *)p); abort(); }
    return *(const uint2 *)p;
}
static inline uint32_t ld_nc32(const uint8_t *p) {
    if ((uintptr_t)p & 3) { fprintf(stderr, "shim: ld_nc32 at %p: not 4-byte aligned\n", (const void *)p); abort(); }
    return *(const uint32_t *)p;
}
#endif
