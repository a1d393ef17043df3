/* Weights into L2 ahead of the kernel that reads them (DSV4_CUDA_L2PF, cuda_step.c).
 *
 * Why: a one-token decode step is ~1,250 launches, and between the weight kernels run chains of small kernels
 * (norms, routing, the attention over the window) that leave the memory idle for tens of microseconds a layer,
 * while the weight kernels themselves pay a fixed latency before their bytes stream (run 49: an FP8 linear costs
 * ~4 us plus its bytes at ~4.3 TB/s). A bulk prefetch (cp.async.bulk.prefetch.L2: the copy engine fetches a
 * range into L2 and nobody waits for it) issued before such a chain moves a later kernel's DRAM traffic into the
 * idle time; that kernel then reads L2.
 *
 * A prefetch changes no byte any kernel computes: it writes nothing, and a line it brings is the line a load would
 * have brought. So every output stays bit-identical with it on or off (cli.sh compares them anyway). */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_kernels.h"

#define PF_CHUNK (64u << 10)   /* bytes per bulk prefetch instruction */
#define PF_THREADS 128

/* Bulk prefetch of [p, p + n) by the calling threads, chunk c to thread c mod nthr; the range is widened to
 * 16-byte bounds (the instruction's alignment), inside the same allocation since cudaMalloc aligns to 256. */
__device__ __forceinline__ void prefetch_range(const void *p, uint64_t n, int thr, int nthr) {
    if (!p || !n) return;
    uint64_t g = (uint64_t)(uintptr_t)p;   /* the instruction takes a global-space address */
#if defined(__CUDA_ARCH__)
    asm("cvta.to.global.u64 %0, %1;" : "=l"(g) : "l"(g));
#endif
    const uint64_t a0 = g & ~(uint64_t)15, a1 = (g + n + 15) & ~(uint64_t)15;
    for (uint64_t a = a0 + (uint64_t)thr * PF_CHUNK; a < a1; a += (uint64_t)nthr * PF_CHUNK) {
        const uint32_t len = (uint32_t)(a1 - a < PF_CHUNK ? a1 - a : PF_CHUNK);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(len) : "memory");
#else
        (void)len;
#endif
    }
}

/* A weight's data bytes and the scale bytes of its rows (weight.h; a view's rows only). */
__device__ __forceinline__ void prefetch_weight(const dsv4_weight &w, uint64_t cap, int thr, int nthr) {
    uint64_t db = (uint64_t)w.rows * (uint64_t)w.cols;
    if (w.fmt == WF_F32) db *= 4;
    else if (w.fmt == WF_BF16) db *= 2;
    else if (w.fmt == WF_FP4) db /= 2;
    prefetch_range(w.data, db < cap ? db : cap, thr, nthr);
    if (w.fmt == WF_FP8) {
        const int r0 = w.row0 / 128, r1 = (w.row0 + w.rows + 127) / 128;
        prefetch_range(w.scale + (int64_t)r0 * w.scale_cols, (uint64_t)(r1 - r0) * w.scale_cols, thr, nthr);
    } else if (w.fmt == WF_FP4) {
        prefetch_range(w.scale + (int64_t)w.row0 * w.scale_cols, (uint64_t)w.rows * w.scale_cols, thr, nthr);
    }
}

__global__ void __launch_bounds__(PF_THREADS) k_l2_prefetch(cu_pf_list l) {
    dev_grid_wait();
    for (int i = 0; i < l.n; i++) prefetch_weight(l.w[i], l.cap[i], threadIdx.x, PF_THREADS);
}

/* Block i: tile i of the plan, if it is its expert's first tile (an expert's pairs are consecutive tiles), prefetches
 * the first cap bytes of that expert's matrices in wa then wb (and their scales). */
__global__ void __launch_bounds__(PF_THREADS) k_l2_prefetch_experts(const dsv4_weight *wa, const dsv4_weight *wb, cu_moe_plan p,
                                                                    uint64_t cap) {
    dev_grid_wait();
    const int i = blockIdx.x;
    if (i >= *p.n_tiles) return;
    const int e = p.tile_expert[i];
    if (i > 0 && p.tile_expert[i - 1] == e) return;
    prefetch_weight(wa[e], cap, threadIdx.x, PF_THREADS);
    if (wb) prefetch_weight(wb[e], cap, threadIdx.x, PF_THREADS);
}

extern "C" void cu_l2_prefetch(cu_stream st, const cu_pf_list *l) {
    if (l->n > 0) k_l2_prefetch<<<1, PF_THREADS, 0, (cudaStream_t)st>>>(*l);
}

extern "C" void cu_l2_prefetch_experts(cu_stream st, const dsv4_weight *wa, const dsv4_weight *wb, const cu_moe_plan *p, int max_tiles,
                                       uint64_t cap) {
    if (max_tiles > 0) k_l2_prefetch_experts<<<max_tiles, PF_THREADS, 0, (cudaStream_t)st>>>(wa, wb, *p, cap);
}
