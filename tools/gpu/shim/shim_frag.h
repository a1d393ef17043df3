/* For the CPU shims of the FP8/FP4 tensor-core linears (shim_mma.sh: k_mma.cu, shim_gemm.sh: k_mma_gemm.cu,
 * shim_stream.sh: k_mma_stream.cu): C++ of the inline assembly they share, cu_mma_frag.cuh's PTX section and
 * k_mma.cu's read-only loads, each by the instruction's definition (PTX ISA), not by the kernels' use of it. The
 * shims strip the kernels' own PTX sections and take these instead; what follows cu_mma_frag.cuh's section
 * (e2m1x4_e4m3) is plain CUDA C++ and is compiled as is. */
#ifndef DSV4_SHIM_FRAG_H
#define DSV4_SHIM_FRAG_H
#include "shim_mma.h"

/* mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 (shim_mma.h: the fragment layout, exact products summed in
 * double, rounded once). Every lane of the warp calls it. */
static inline void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    shim_mma_e4m3(d, a0, a1, a2, a3, b0, b1);
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
