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
float __shfl_xor_sync(unsigned mask, float v, int off);
/* Runs kernel body f over the grid, block by block; smem_poison: the static shared arrays to poison. */
void shim_launch(dim3 grid, dim3 block, const std::function<void()> &f);
void shim_poison(void *p, size_t n);
/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for the calling thread's warp, from the PTX ISA's fragment
 * layout (k_attention.cu states it): each lane's registers meet through block-wide arrays between barriers, so
 * every thread of the block must call it the same number of times (the kernels do). Each output element is its
 * C plus its 16 exact products summed in double, rounded once: a function of its own row, column and C only, like
 * the hardware's (whose last bits differ). */
void shim_mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1);
#endif
