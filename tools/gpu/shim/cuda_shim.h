/* A CPU stand-in for the few CUDA features the attention and indexer kernels use, so that their very source
 * (extracted by tools/gpu/shim/shim_*.sh) runs on a machine without a GPU: blocks one after another, each block's
 * threads as fibers (ucontext) on one OS thread. __syncthreads waits until every thread of the block arrived; a
 * warp intrinsic (shuffles, ballot, match, reduce) waits until the 32 lanes of the caller's warp arrived, so warps
 * may diverge from each other between barriers as on a GPU (the lanes of one warp must call the same intrinsics in
 * the same order: the kernels' warp-uniform calls). A thread that ends while others wait at a barrier, or a round
 * in which nobody can move, aborts with a message. __shared__ arrays are static: shared by the block, and poisoned
 * with NaN bytes before each block so that a read of something never written shows. Atomics are plain read-modify-
 * writes (fibers switch only inside barriers and warp intrinsics). For checking indexing before a GPU run; not for
 * speed. */
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
struct alignas(8) float2 {
    float x, y;
};
struct alignas(8) uint2 {
    uint32_t x, y;
};
struct alignas(16) uint4 {
    uint32_t x, y, z, w;
};
static inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return uint4{ a, b, c, d }; }
static inline uint2 make_uint2(uint32_t a, uint32_t b) { return uint2{ a, b }; }
static inline float4 make_float4(float a, float b, float c, float d) { return float4{ a, b, c, d }; }
typedef void *cudaStream_t;
/* the host calls of launchers that opt a kernel into more shared memory: the shim's blocks have any amount */
enum cudaError_t { cudaSuccess = 0 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
static inline cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
static inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int) {   /* an H200's */
    *v = a == cudaDevAttrMultiProcessorCount ? 132 : 227 * 1024;
    return cudaSuccess;
}
template <typename F> static inline cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) { return cudaSuccess; }
static inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
#define DEV_HW_E4M3 0   /* no cvt instruction here: cu_common.cuh's code search */

extern dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
/* cu_common.cuh's measuring build switch (the shim takes the kernels' sources from below its definition) */
#ifndef DIAG_SKIP
#define DIAG_SKIP 0
#endif
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fadd_rn(float a, float b) { return a + b; }

void __syncthreads(void);
int __syncthreads_and(int p);
/* bar.sync id, n: a barrier of the block's first n threads (ids 1..15; those n threads are the ones that call it) */
void shim_bar_sync(unsigned id, unsigned n);
static inline void dev_bar_sync(int id, int n) { shim_bar_sync((unsigned)id, (unsigned)n); }
static inline void dev_grid_wait(void) {}   /* launches run one after another: nothing to wait for */
static inline void __trap(void) { fprintf(stderr, "shim: __trap\n"); abort(); }
/* The 32 values of the caller's warp at this warp intrinsic (lane i's value at index i), once every lane gave its own. */
const uint64_t *shim_warp_exchange(uint64_t v);

template <typename T> static inline uint64_t shim_bits(T v) { uint64_t u = 0; memcpy(&u, &v, sizeof v); return u; }
template <typename T> static inline T shim_from(uint64_t u) { T v; memcpy(&v, &u, sizeof v); return v; }
static inline unsigned shim_lane(void) { return threadIdx.x & 31u; }

template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int off) {
    return shim_from<T>(shim_warp_exchange(shim_bits(v))[shim_lane() ^ (unsigned)off]);
}
template <typename T> static inline T __shfl_sync(unsigned, T v, int src) {
    return shim_from<T>(shim_warp_exchange(shim_bits(v))[(unsigned)src & 31u]);
}
template <typename T> static inline T __shfl_down_sync(unsigned, T v, unsigned d) {
    const uint64_t *x = shim_warp_exchange(shim_bits(v));
    return shim_lane() + d < 32 ? shim_from<T>(x[shim_lane() + d]) : v;
}
template <typename T> static inline T __shfl_up_sync(unsigned, T v, unsigned d) {
    const uint64_t *x = shim_warp_exchange(shim_bits(v));
    return shim_lane() >= d ? shim_from<T>(x[shim_lane() - d]) : v;
}
static inline unsigned __ballot_sync(unsigned, int p) {
    const uint64_t *x = shim_warp_exchange(p != 0);
    unsigned m = 0;
    for (unsigned i = 0; i < 32; i++) m |= (unsigned)(x[i] != 0) << i;
    return m;
}
static inline int __any_sync(unsigned, int p) { return __ballot_sync(0xffffffffu, p) != 0; }
static inline int __all_sync(unsigned, int p) { return __ballot_sync(0xffffffffu, p) == 0xffffffffu; }
static inline unsigned __match_any_sync(unsigned, unsigned v) {
    const uint64_t *x = shim_warp_exchange(v);
    unsigned m = 0;
    for (unsigned i = 0; i < 32; i++) m |= (unsigned)(x[i] == v) << i;
    return m;
}
static inline unsigned __reduce_or_sync(unsigned, unsigned v) {
    const uint64_t *x = shim_warp_exchange(v);
    unsigned r = 0;
    for (unsigned i = 0; i < 32; i++) r |= (unsigned)x[i];
    return r;
}
static inline unsigned __reduce_and_sync(unsigned, unsigned v) {
    const uint64_t *x = shim_warp_exchange(v);
    unsigned r = ~0u;
    for (unsigned i = 0; i < 32; i++) r &= (unsigned)x[i];
    return r;
}
static inline void __syncwarp(unsigned = 0xffffffffu) { (void)shim_warp_exchange(0); }
template <typename T> static inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <typename T> static inline T atomicOr(T *p, T v) { T o = *p; *p = o | v; return o; }
template <typename T> static inline T atomicAnd(T *p, T v) { T o = *p; *p = o & v; return o; }

/* Runs kernel body f over the grid, block by block (blockDim.x a multiple of 32). */
void shim_launch(dim3 grid, dim3 block, const std::function<void()> &f);
void shim_poison(void *p, size_t n);
/* A number for the block now running, new for every block of every launch: a kernel that reaches its shared-memory
 * declaration more than once (a device function called per tile) poisons it once per block with it. */
unsigned long shim_block_serial(void);
/* The dynamic shared memory's poison for the block now running, made by thread 0 the first time it passes (thread 0
 * runs first in a block's first round, before any thread can have written it; a second pass, a later tile of the
 * same block, finds it in use by the other warps). */
static inline void shim_poison_block(void *p, size_t n) {
    static unsigned long done = ~0ul;
    if (threadIdx.x == 0 && done != shim_block_serial()) {
        shim_poison(p, n);
        done = shim_block_serial();
    }
}
/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for the calling thread's warp, from the PTX ISA's fragment
 * layout (k_attention.cu states it): each lane's registers meet through block-wide arrays between barriers, so
 * every thread of the block must call it the same number of times (the kernels do). Each output element is its
 * C plus its 16 exact products summed in double, rounded once: a function of its own row, column and C only, like
 * the hardware's (whose last bits differ). */
void shim_mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1);
#endif
