/* The asynchronous copies and warpgroup MMA bookkeeping of the tensor-core kernels that stage through shared memory
 * (k_mma_gemm.cu, k_expert_nat.cu): cp.async 16-byte copies in commit groups, wgmma's register fence, group commit
 * and wait, and the proxy fence that makes st.shared writes visible to the tensor cores. PTX ISA: "cp.async",
 * "Asynchronous Warpgroup Level Matrix" instructions, "membar/fence". */
#ifndef DSV4_CU_ASYNC_CUH
#define DSV4_CU_ASYNC_CUH
#include <stdint.h>

/* 16 bytes global -> shared, asynchronously (cp.async.cg: L2 only); bytes = 16 copies, 0 zero-fills dst (src
 * must still be a valid address). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int bytes) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Until at most n of this thread's committed groups are still in flight. */
template <int n> __device__ __forceinline__ void cp_async_wait(void) { asm volatile("cp.async.wait_group %0;" ::"n"(n) : "memory"); }

/* wgmma's register fence, group commit and wait, an empty asm that pins an accumulator register after the wait (the
 * compiler must not read it earlier: the asm that wrote it was the issue, not the completion), and the fence that
 * makes this thread's st.shared writes visible to the tensor cores' (async proxy) reads after the next barrier. */
__device__ __forceinline__ void wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0(void) { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void wg_pin(float &x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void wg_pin_r(uint32_t &x) { asm volatile("" : "+r"(x)::"memory"); }
__device__ __forceinline__ void fence_proxy_async(void) { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

/* A shared-memory matrix descriptor for wgmma without swizzle: start address, the byte offset between core matrices
 * along K (lbo) and along M / N (sbo), each a multiple of 16. */
__device__ __forceinline__ uint64_t wg_desc(const void *smem, int lbo, int sbo) {
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    return (uint64_t)((sa >> 4) & 0x3FFF) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 | (uint64_t)((sbo >> 4) & 0x3FFF) << 32;
}
#endif
