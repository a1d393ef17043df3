/* Random weights in their stored formats, made in GPU memory for the synthetic benchmark checkpoints
 * (model/synthetic.h); the values are model/synth_values.h's, as the host's fill makes them. */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_kernels.h"
#include "model/synth_values.h"

__global__ void k_fill_synth(uint8_t *p, size_t n, int kind, uint64_t seed) {
    dev_grid_wait();
    for (size_t w = (size_t)blockIdx.x * blockDim.x + threadIdx.x; w * 8 < n; w += (size_t)gridDim.x * blockDim.x) {
        uint8_t b[8];
        synth_word(kind, seed, w, b);
        for (int k = 0; k < 8 && w * 8 + k < n; k++) p[w * 8 + k] = b[k];
    }
}

extern "C" void cu_fill_synth(void *p, size_t n, int kind, uint64_t seed) {
    if (!n) return;
    size_t words = (n + 7) / 8;
    const int blocks = (int)(words / 256 + 1 < 4096 ? words / 256 + 1 : 4096);
    k_fill_synth<<<blocks, 256>>>((uint8_t *)p, n, kind, seed);
}
