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

/* One 128-column block of an OFFICIAL activation row packed for the tensor cores (cu_mma.h, k_mma_pack_act) by the
 * calling warp: lane l holds columns 4l .. 4l+3 in v (0 past len); the scale from the block's amax by act_quant's
 * rule, each value as E4M3 over it; lane 0 writes the scale. Every kernel that packs calls this, so a row packed
 * by a fused producer has the bytes k_mma_pack_act would give it. */
__device__ __forceinline__ void warp_pack_block(const float (&v)[4], int len, uint8_t *q, float *scale) {
    const int lane = threadIdx.x & 31;
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) amax = fmaxf(amax, fabsf(v[i]));
    const float s = quant_scale(warp_max(amax), 0);
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (4 * lane + i < len) q[4 * lane + i] = dev_f32_to_e4m3(v[i] / s);
    if (lane == 0) *scale = s;
}

/* Row x[0..K) packed by the whole block (warp w on blocks w, w + warps, ...), after a barrier that makes the
 * block's own writes of x visible: for kernels that produce a row in one block and pack it in the same launch. */
__device__ __forceinline__ void block_pack_row(const float *x, int K, uint8_t *q, float *qs) {
    __syncthreads();
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int b = threadIdx.x >> 5; 128 * b < K; b += warps) {
        const int len = min(128, K - 128 * b);
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = 4 * lane + i < len ? x[128 * b + 4 * lane + i] : 0.0f;
        warp_pack_block(v, len, q + 128 * b, qs + b);
    }
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
