/* The FP8 tensor-core fragment helpers of the OFFICIAL linears (k_mma.cu states the fragment layouts and k maps;
 * k_mma_gemm.cu uses these). Everything between the PTX markers is inline assembly that the CPU shim
 * (tools/gpu/shim/shim_gemm.sh) replaces by C++ of the same definitions. */
#ifndef DSV4_CU_MMA_FRAG_CUH
#define DSV4_CU_MMA_FRAG_CUH
#include <stdint.h>

/* ---- PTX ---- */

/* ---- the E4M3 MMA, written out ----
 * The OFFICIAL linears' products are m16n8k32 E4M3 MMAs with an fp32 accumulator (fragments as k_mma.cu states).
 * sm_90 has no such instruction for mma.sync: ptxas builds `mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32`
 * from fp16 ones (run 90, its SASS): each fragment register's bytes 0-1 and 2-3 become fp16 pairs (exact: every
 * E4M3 value is an fp16 value), t = HMMA.16816.F32(the low pairs, from 0), t = HMMA.16816.F32(the high pairs, t),
 * D = C + t by one fp32 addition per element. So the first k16 MMA takes the k32 step's columns {4q, 4q+1, 16+4q,
 * 16+4q+1 : q = 0..3}, the second those plus 2. That is written out here, so that the bits are this definition's,
 * whatever a later ptxas does, and so that a product from zero can skip the addition (mma_e4m3_from0). test_gpu_mma
 * checks mma_e4m3 against the instruction on random fragments (cu_mma_emu_check): 0 differences on the H200; and
 * HGMMA (wgmma m64nNk16 f16) adds a k16 step as HMMA does (tools/gpu/f16emu_bits.cu), so a warpgroup kernel can give
 * these bits too. */

/* t = A B + t on one m16n8k16 tile, fp16 operands (a0: row g cols 2q, 2q+1; a1: row g+8; a2 / a3: cols + 8; b0: col
 * g rows 2q, 2q+1; b1: rows + 8), fp32 accumulator. */
__device__ __forceinline__ void hmma_f16(float (&t)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(t[0]), "+f"(t[1]), "+f"(t[2]), "+f"(t[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* Bytes 0-1 (lo) or 2-3 (hi) of v, two E4M3 values, as an fp16 pair (the lower byte in the lower half). volatile:
 * each MMA converts its own operands, as ptxas's own expansion does; shared across a tile's MMAs the converted pairs
 * (twice the registers of the bytes) made k_mma_gemm spill. */
__device__ __forceinline__ uint32_t e4m3_lo_f16x2(uint32_t v) {
    uint32_t d;
    asm volatile("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(d) : "r"(v));
    return d;
}
__device__ __forceinline__ uint32_t e4m3_hi_f16x2(uint32_t v) {
    uint32_t d;
    asm volatile("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, h;\n}" : "=r"(d) : "r"(v));
    return d;
}
/* t = A B of one m16n8k32 E4M3 step: the two fp16 MMAs above, from zero. */
__device__ __forceinline__ void mma_e4m3_step(float (&t)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                              uint32_t b1) {
    t[0] = t[1] = t[2] = t[3] = 0.0f;
    hmma_f16(t, e4m3_lo_f16x2(a0), e4m3_lo_f16x2(a1), e4m3_lo_f16x2(a2), e4m3_lo_f16x2(a3), e4m3_lo_f16x2(b0), e4m3_lo_f16x2(b1));
    hmma_f16(t, e4m3_hi_f16x2(a0), e4m3_hi_f16x2(a1), e4m3_hi_f16x2(a2), e4m3_hi_f16x2(a3), e4m3_hi_f16x2(b0), e4m3_hi_f16x2(b1));
}
/* D = A B + C on one m16n8k32 tile: the bits of mma.sync ... .e4m3.e4m3.f32 on sm_90. */
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    float t[4];
    mma_e4m3_step(t, a0, a1, a2, a3, b0, b1);
#pragma unroll
    for (int e = 0; e < 4; e++) d[e] = __fadd_rn(d[e], t[e]);
}
/* D = A B: mma_e4m3 on a zero D without its addition of 0.0f, which can change only the sign of an exact zero
 * (+0 + -0 = +0). Every caller folds D into an accumulator by fmaf (or adds it to such a D), where that sign cannot
 * show: an accumulator starts at +0.0f, and a sum rounded to nearest is -0 only when both addends are. */
__device__ __forceinline__ void mma_e4m3_from0(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                               uint32_t b1) {
    mma_e4m3_step(d, a0, a1, a2, a3, b0, b1);
}
/* The instruction itself (cu_mma_emu_check's reference). */
__device__ __forceinline__ void mma_e4m3_hw(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                            uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* prmt.b32 in its generic form: byte k of the result is byte (c >> 4k) & 7 of {b, a} (a = bytes 0..3), or that
 * byte's sign bit replicated when bit 3 of the selector nibble is set. */
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* ---- end of PTX ---- */

/* The four E2M1 codes in bits 0..15 of v (code k in bits 4k..4k+3) as four E4M3 bytes (byte k), exactly: every
 * E2M1 value is an E4M3 value. Magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 are the E4M3 bytes 0x00, 0x30, 0x38, 0x3C,
 * 0x40, 0x44, 0x48, 0x4C, looked up by prmt from the magnitude bits; the sign: prmt on bytes 0x80 with the code as
 * selector gives 0x80 for a positive code and 0xFF (sign replicated) for a negative one, whose bit 6 moved to bit
 * 7 is the sign bit. */
__device__ __forceinline__ uint32_t e2m1x4_e4m3(uint32_t v) {
    const uint32_t mag = prmt(0x3C383000u, 0x4C484440u, v & 0x7777u);
    const uint32_t neg = prmt(0x80808080u, 0x80808080u, v);   /* prmt reads bits 0..15 of its selector only */
    return mag | ((neg << 1) & 0x80808080u);
}

/* A word of packed FP4 (cu_fp4_frag_pack; k_mma.cu states the layout) as the E4M3 fragment registers of its codes
 * 0..3 (frag_lo) and 4..7 (frag_hi), each value times 2^-6. */
__device__ __forceinline__ uint32_t frag_lo(uint32_t w) { return w & 0x9C9C9C9Cu; }
__device__ __forceinline__ uint32_t frag_hi(uint32_t w) { return ((w << 2) & 0x8C8C8C8Cu) | ((w >> 2) & 0x10101010u); }
#endif
