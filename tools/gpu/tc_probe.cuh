/* What the tensor-core measuring programs share (tools/gpu/wgmma_bits.cu, f16emu_bits.cu, mma_peak.cu): a CUDA error
 * check, the MMA instructions under study, wgmma's shared-memory descriptor, the random E4M3 tiles and the reference
 * chain of mma.sync e4m3 over them. Standalone programs (no project headers): built by nvcc alone for the device. */
#ifndef DSV4_TC_PROBE_CUH
#define DSV4_TC_PROBE_CUH
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                                 \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

/* D = A B + C, m16n8k32, E4M3 operands (the fragment layout of src/backend/cuda/k_mma.cu). */
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* D = A B + C, m16n8k16, fp16 operands. */
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t w32(const void *p) { return *(const uint32_t *)p; }

/* wgmma's shared-memory matrix descriptor, no swizzle: start address, LBO (between core matrices along K) and SBO
 * (between 8-row groups), each in 16-byte units. */
__device__ __forceinline__ uint64_t desc(const void *smem, uint32_t lbo, uint32_t sbo) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((a >> 4) & 0x3FFF) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 | (uint64_t)((sbo >> 4) & 0x3FFF) << 32;
}

/* The tiles of the bit comparisons: each block one 64 x 128-byte A tile and one 64 x 128-byte B tile; D 64 x 64. */
enum { TILE_M = 64, TILE_N = 64, TILE_K = 128 };

/* Element (row, col) of a thread's m16n8 fragment e (0..3) of n8 tile i, warp w: the D layout of mma.sync and of
 * wgmma's accumulators alike. */
__device__ __forceinline__ void store_frag(float *dd, int w, int i, const float (&d)[4]) {
    const int l = threadIdx.x % 32, row = 16 * w + l / 4, col = 8 * i + 2 * (l % 4);
    dd[row * TILE_N + col] = d[0], dd[row * TILE_N + col + 1] = d[1];
    dd[(row + 8) * TILE_N + col] = d[2], dd[(row + 8) * TILE_N + col + 1] = d[3];
}

/* The reference: 4 warps, warp w rows 16 w .. + 15; per n8 tile a chain of `steps` k32 MMAs from 0. */
__global__ void k_mma8(const uint8_t *A, const uint8_t *B, float *D, int steps) {
    const uint8_t *a = A + (size_t)blockIdx.x * TILE_M * TILE_K, *b = B + (size_t)blockIdx.x * TILE_N * TILE_K;
    const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, q = l % 4;
    for (int i = 0; i < TILE_N / 8; i++) {
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        for (int j = 0; j < steps; j++) {
            const uint8_t *r0 = a + (16 * w + g) * TILE_K + 32 * j, *r1 = r0 + 8 * TILE_K, *c = b + (8 * i + g) * TILE_K + 32 * j;
            mma_e4m3(d, w32(r0 + 4 * q), w32(r1 + 4 * q), w32(r0 + 16 + 4 * q), w32(r1 + 16 + 4 * q), w32(c + 4 * q), w32(c + 16 + 4 * q));
        }
        store_frag(D + (size_t)blockIdx.x * TILE_M * TILE_N, w, i, d);
    }
}

/* Random E4M3 bytes (NaN codes 0x7F / 0xFF redrawn). dist 0: uniform; 1: exponents 6..8 only (similar magnitudes,
 * random signs: cancellation); 2: one large value per row (column 37) among small ones. */
static uint64_t probe_rng = 0x9E3779B97F4A7C15ull;
static uint32_t next32(void) {
    probe_rng ^= probe_rng << 13, probe_rng ^= probe_rng >> 7, probe_rng ^= probe_rng << 17;
    return (uint32_t)(probe_rng >> 16);
}
static uint8_t rand_byte(int dist, int k) {
    for (;;) {
        uint8_t b = (uint8_t)next32();
        if (dist == 1) b = (uint8_t)((b & 0x87) | ((6 + next32() % 3) << 3));
        if (dist == 2) b = k == 37 ? (uint8_t)((b & 0x87) | (14 << 3)) : (uint8_t)((b & 0x87) | ((1 + next32() % 5) << 3));
        if ((b & 0x7F) != 0x7F) return b;
    }
}
#endif
