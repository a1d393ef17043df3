/* A CPU stand-in for the few CUDA features the chunked attention kernels use, so that their very source
 * (k_attention.cu, extracted by tools/gpu/shim/shim_attention.sh) runs on a machine without a GPU: blocks one after
 * another, each block's threads as fibers (ucontext) on one OS thread, __syncthreads a switch back to the block's
 * scheduler until every thread reached it, __shfl_xor_sync an exchange through a block-wide array between two
 * barriers (callers reach it uniformly, as in the kernels). __shared__ arrays are static: shared by the block, and
 * poisoned with NaN bytes before each block so that a read of something never written shows. For checking
 * indexing before a GPU run; not for speed. */
#ifndef DSV4_CUDA_SHIM_H
#define DSV4_CUDA_SHIM_H
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <ucontext.h>
#include <vector>

using std::isnan;
using std::signbit;

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {
    uint32_t x, y, z, w;
};
struct alignas(8) uint2 {
    uint32_t x, y;
};
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return uint4{ a, b, c, d }; }
static inline uint2 make_uint2(uint32_t a, uint32_t b) { return uint2{ a, b }; }
typedef void *cudaStream_t;

extern dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }

void __syncthreads(void);
/* A meeting of the calling thread's warp only (the warp-wide operations below; callers reach it uniformly). */
void shim_warp_sync(void);
/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 on D = A B + D, from the warp's fragments as the PTX ISA
 * defines them (lane 4g + q: a0 = A[g][2q, 2q+1], a1 = A[g+8][..], a2 = A[g][2q+8, 2q+9], a3 = A[g+8][..];
 * b0 = B[2q, 2q+1][g], b1 = B[2q+8, 2q+9][g]; d0 = D[g][2q], d1 = D[g][2q+1], d2 = D[g+8][2q], d3 = D[g+8][2q+1];
 * the lower k in bits 0..15). */
void shim_mma_bf16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1);
float __shfl_xor_sync(unsigned mask, float v, int off);
/* Runs kernel body f over the grid, block by block; smem_poison: the static shared arrays to poison. */
void shim_launch(dim3 grid, dim3 block, const std::function<void()> &f);
void shim_poison(void *p, size_t n);
#endif
