/* RoPE on the device (core/rope.c): interleaved pairs on the last R dims, theta = (float)pos * freq[i] in fp32
 * as the official table computes it. Called by a whole block (uniformly); ends with a barrier. */
#ifndef DSV4_CU_ROPE_CUH
#define DSV4_CU_ROPE_CUH
#include "backend/cuda/cu_common.cuh"

__device__ __forceinline__ void rope_pair(int official, const float *freq, float *x, int i, int64_t pos, int inverse) {
    const float theta = (float)pos * freq[i];
    const float c = cosf(theta), s = inverse ? -sinf(theta) : sinf(theta);
    const float re = x[2 * i], im = x[2 * i + 1];
    x[2 * i] = dev_bf16_if(official, re * c - im * s);
    x[2 * i + 1] = dev_bf16_if(official, re * s + im * c);
}

__device__ __forceinline__ void block_rope(int official, const float *freq, int R, float *x, int64_t pos, int inverse) {
    for (int i = threadIdx.x; i < R / 2; i += blockDim.x) rope_pair(official, freq, x, i, pos, inverse);
    __syncthreads();
}
#endif
