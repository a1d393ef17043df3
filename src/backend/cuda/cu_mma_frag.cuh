/* The FP8 tensor-core fragment helpers of the OFFICIAL linears (k_mma.cu states the fragment layouts and k maps;
 * k_mma_gemm.cu uses these). Everything between the PTX markers is inline assembly that the CPU shim
 * (tools/gpu/shim/shim_gemm.sh) replaces by C++ of the same definitions. */
#ifndef DSV4_CU_MMA_FRAG_CUH
#define DSV4_CU_MMA_FRAG_CUH
#include <stdint.h>

/* ---- PTX ---- */

/* D = A B + C on one m16n8k32 tile, .e4m3 operands, fp32 accumulator (fragments as k_mma.cu states). */
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* ---- what that instruction is on sm_90, written out ----
 * sm_90 has no FP8 mma.sync: ptxas builds the instruction above from fp16 ones (run 90, its SASS): each fragment
 * register's bytes 0-1 and 2-3 become fp16 pairs (exact: every E4M3 value is an fp16 value), t = HMMA.16816.F32(the
 * low pairs, from 0), t = HMMA.16816.F32(the high pairs, t), D = C + t by one fp32 addition per element. So the
 * first k16 MMA takes the k32 step's columns {4q, 4q+1, 16+4q, 16+4q+1 : q = 0..3}, the second those plus 2.
 * mma_e4m3_written spells that out; test_gpu_mma checks it against the instruction on random fragments
 * (cu_mma_emu_check: 0 of 69 M elements differ on the H200). It is the numerics' definition for kernels that
 * cannot use mma.sync: the warpgroup MMA on fp16 operands (HGMMA) adds a k16 step exactly as HMMA does
 * (tools/gpu/f16emu_bits.cu, run 90), so a wgmma GEMM fed with the converted bytes in this column order, each k32
 * step from zero and then added, gives these bits. The kernels keep the instruction: run 92 put the written-out form
 * in them (and skipped a chain's first addition of 0.0f, which can change only a zero's sign): the same bits, the
 * FP4 GEMM +7-10 %, but decode -3.5 % and the FP8 GEMM -20 %, so it went back. */

/* t = A B + t on one m16n8k16 tile, fp16 operands (a0: row g cols 2q, 2q+1; a1: row g+8; a2 / a3: cols + 8; b0: col
 * g rows 2q, 2q+1; b1: rows + 8), fp32 accumulator. */
__device__ __forceinline__ void hmma_f16(float (&t)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(t[0]), "+f"(t[1]), "+f"(t[2]), "+f"(t[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* Bytes 0-1 (lo) or 2-3 (hi) of v, two E4M3 values, as an fp16 pair (the lower byte in the lower half). */
__device__ __forceinline__ uint32_t e4m3_lo_f16x2(uint32_t v) {
    uint32_t d;
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(d) : "r"(v));
    return d;
}
__device__ __forceinline__ uint32_t e4m3_hi_f16x2(uint32_t v) {
    uint32_t d;
    asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, h;\n}" : "=r"(d) : "r"(v));
    return d;
}
/* D = A B of one m16n8k32 E4M3 step (C not read): the two fp16 MMAs, from zero. */
__device__ __forceinline__ void mma_e4m3_written_from0(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                       uint32_t b0, uint32_t b1) {
    d[0] = d[1] = d[2] = d[3] = 0.0f;
    hmma_f16(d, e4m3_lo_f16x2(a0), e4m3_lo_f16x2(a1), e4m3_lo_f16x2(a2), e4m3_lo_f16x2(a3), e4m3_lo_f16x2(b0), e4m3_lo_f16x2(b1));
    hmma_f16(d, e4m3_hi_f16x2(a0), e4m3_hi_f16x2(a1), e4m3_hi_f16x2(a2), e4m3_hi_f16x2(a3), e4m3_hi_f16x2(b0), e4m3_hi_f16x2(b1));
}
/* D = A B + C: the step above, then C + t by one fp32 addition per element — mma_e4m3's bits. */
__device__ __forceinline__ void mma_e4m3_written(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                                 uint32_t b1) {
    float t[4];
    mma_e4m3_written_from0(t, a0, a1, a2, a3, b0, b1);
#pragma unroll
    for (int e = 0; e < 4; e++) d[e] = __fadd_rn(d[e], t[e]);
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

/* A word of 8 E2M1 codes (code i in bits 4i..4i+3) in the packed bit order (k_mma.cu's packed FP4 comment): code i
 * (0..3) in byte i at bit 7 (s) and bits 4..2 (e1 e0 m), code 4 + i at bit 5 (s), 6 (e1), 1 (e0), 0 (m). */
__device__ __forceinline__ uint32_t frag_bits(uint32_t w) {
    uint32_t r = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t c = (w >> (4 * i)) & 15u, d = (w >> (4 * i + 16)) & 15u;
        const uint32_t byte = (c & 8u) << 4 | (c & 7u) << 2 | (d & 8u) << 2 | (d & 4u) << 4 | (d & 3u);
        r |= byte << (8 * i);
    }
    return r;
}

/* The FP4 packers' walk (cu_fp4_frag_pack, cu_fp4_nat_pack): each 64-byte unit of d (a row's 128-column chunk, 16
 * words v as read) rewritten in place, word 4q + j (lane q's word of block j) = word(v, j, q); a grid-stride loop,
 * one thread a unit. */
template <class W> __device__ __forceinline__ void fp4_units_pack(uint32_t *__restrict__ d, int64_t units, W word) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < units; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t *u = d + 16 * i, v[16];
#pragma unroll
        for (int k = 0; k < 16; k++) v[k] = u[k];
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) u[4 * q + j] = word(v, j, q);
    }
}

/* A word of packed FP4 (cu_fp4_frag_pack; k_mma.cu states the layout) as the E4M3 fragment registers of its codes
 * 0..3 (frag_lo) and 4..7 (frag_hi), each value times 2^-6. */
__device__ __forceinline__ uint32_t frag_lo(uint32_t w) { return w & 0x9C9C9C9Cu; }
__device__ __forceinline__ uint32_t frag_hi(uint32_t w) { return ((w << 2) & 0x8C8C8C8Cu) | ((w >> 2) & 0x10101010u); }

/* The PLAIN range of the packed kernels' scale step (k_mma.cu's packed FP4 comment, k_mma_gemm.cu's hg_chunk): a
 * weight scale byte in [64, 190] (2^-63 .. 2^63) and an activation scale of magnitude in [2^-60, 2^50] keep s * sx
 * and s * sx * 64 normal floats, so folding the codes' 64 into the scale product is exact.
 * Whether a byte of s is below 64 or above 190 (SWAR: a byte < 64 borrows into its bit 7 with bit 7 clear; a byte
 * >= 191 has bit 7 set and its low 7 bits + 65 carry into bit 7, never past it). */
__device__ __forceinline__ bool frag_scale_out(uint32_t s) {
    const uint32_t lo = (s - 0x40404040u) & ~s, hi = ((s & 0x7f7f7f7fu) + 0x41414141u) & s;
    return ((lo | hi) & 0x80808080u) != 0;
}
__device__ __forceinline__ bool frag_sx_out(float sx) {
    const float a = fabsf(sx);
    return !(a >= 0x1p-60f && a <= 0x1p50f);   /* NaN: out */
}
#endif
