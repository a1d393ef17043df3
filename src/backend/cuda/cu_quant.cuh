/* The official QAT simulations on the device (model/formats.c act_quant_fp8_inplace, act_quant_fp4_inplace,
 * hadamard_inplace), for kernels that quantize rows they hold. amax is a max (exact in any order); each value
 * is then quantized on its own, so the results are the CPU's bit for bit. */
#ifndef DSV4_CU_QUANT_CUH
#define DSV4_CU_QUANT_CUH
#include "backend/cuda/cu_common.cuh"

/* The scale of one block from its amax: FP8 floors amax at 1e-4 and divides by 448 as a product with the
 * reciprocal; FP4 floors at 6 * 2^-126 and divides by 6. */
__device__ __forceinline__ float quant_scale(float amax, int fp4) {
    if (fp4) return dev_pow2_ceil(fmaxf(amax, 6.0f * ldexpf(1.0f, -126)) / 6.0f);
    return dev_pow2_ceil(fmaxf(amax, 1e-4f) * (1.0f / 448.0f));
}

/* Quantize x[0..len) by the calling warp, into y (may alias x). */
__device__ __forceinline__ void warp_quant_block(const float *x, float *y, int len, int fp4) {
    const int lane = threadIdx.x & 31;
    float a = 0.0f;
    for (int i = lane; i < len; i += 32) a = fmaxf(a, fabsf(x[i]));
    const float s = quant_scale(warp_max(a), fp4);
    for (int i = lane; i < len; i += 32) y[i] = fp4 ? dev_fp4_sim(x[i], s) : dev_fp8_sim(x[i], s);
}

/* Quantize a row x[0..n) in place by the whole block, one warp per column block; ends with a barrier. */
__device__ __forceinline__ void block_quant_row(float *x, int n, int block, int fp4) {
    const int warps = blockDim.x >> 5;
    for (int b = threadIdx.x >> 5; b * block < n; b += warps) {
        const int len = n - b * block < block ? n - b * block : block;
        warp_quant_block(x + b * block, x + b * block, len, fp4);
    }
    __syncthreads();
}

/* Sylvester Hadamard by the block on x[0..n) (n a power of two): the CPU's butterflies in the CPU's stages, so
 * the same bits; then the n^-1/2 scale. Ends with a barrier. */
__device__ __forceinline__ void block_hadamard(float *x, int n) {
    for (int h = 1; h < n; h <<= 1) {
        for (int k = threadIdx.x; k < n / 2; k += blockDim.x) {
            const int i = (k / h) * 2 * h + k % h;
            const float a = x[i], b = x[i + h];
            x[i] = a + b;
            x[i + h] = a - b;
        }
        __syncthreads();
    }
    const float s = 1.0f / sqrtf((float)n);
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] *= s;
    __syncthreads();
}
#endif
