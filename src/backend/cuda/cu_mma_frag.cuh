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
