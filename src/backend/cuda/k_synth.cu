/* Random weights in their stored formats, made in GPU memory for the synthetic benchmark checkpoints
 * (model/synthetic.h). Values are a pure function of (seed, byte offset), so a run is repeatable. Magnitudes are
 * tame on purpose (no NaN / Inf codes, FP8 values in [2^-2, 2^1) times the UE8M0 scale cu_fill_bytes puts next to
 * them), so activations stay finite through every layer and the timing is that of ordinary numbers. */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_kernels.h"

__device__ __forceinline__ uint64_t synth_mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ uint8_t synth_byte(int kind, uint32_t r) {
    if (kind == CU_SYNTH_FP8) return (uint8_t)((r & 0x80) | ((5 + ((r >> 3) & 3)) << 3) | (r & 7));   /* exponent 5..8 */
    return (uint8_t)r;                                                                                 /* FP4: any nibbles */
}

__global__ void k_fill_synth(uint8_t *p, size_t n, int kind, uint64_t seed) {
    dev_grid_wait();
    for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w * 8 < n; w += (size_t)gridDim.x * blockDim.x) {
        const uint64_t h = synth_mix(seed ^ synth_mix(w));
        uint8_t b[8];
        if (kind == CU_SYNTH_BF16) {
            /* four bf16: random sign and mantissa, exponent 2^-8 .. 2^-5 */
            for (int k = 0; k < 4; k++) {
                const uint32_t r = (uint32_t)(h >> (16 * k));
                const uint16_t v = (uint16_t)((r & 0x8000) | ((127 - 8 + ((r >> 7) & 3)) << 7) | (r & 0x7f));
                b[2 * k] = (uint8_t)v;
                b[2 * k + 1] = (uint8_t)(v >> 8);
            }
        } else {
            for (int k = 0; k < 8; k++) b[k] = synth_byte(kind, (uint32_t)(h >> (8 * k)));
        }
        for (int k = 0; k < 8 && w * 8 + k < n; k++) p[w * 8 + k] = b[k];
    }
}

extern "C" void cu_fill_synth(void *p, size_t n, int kind, uint64_t seed) {
    if (!n) return;
    size_t words = (n + 7) / 8;
    const int blocks = (int)(words / 256 + 1 < 4096 ? words / 256 + 1 : 4096);
    k_fill_synth<<<blocks, 256>>>((uint8_t *)p, n, kind, seed);
}
