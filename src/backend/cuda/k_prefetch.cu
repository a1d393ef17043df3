/* Weights into L2 ahead of the kernel that reads them (DSV4_CUDA_L2PF, cuda_step.c).
 *
 * Why: a one-token decode step is ~1,250 launches, and between the weight kernels run chains of small kernels
 * (norms, routing, the attention over the window) that leave the memory idle for tens of microseconds a layer,
 * while the weight kernels themselves stream at ~50 % of the bandwidth (run 52's ncu: FP8 linears 1.9 TB/s, FP4
 * experts 1.5 TB/s). A bulk prefetch (cp.async.bulk.prefetch.L2: the copy engine fetches a range into L2 and
 * nobody waits for it) issued before such a chain moves a later kernel's DRAM traffic into the idle time.
 *
 * Run 52 measured what this must avoid: one SM's copy engine prefetches at ~140 GB/s, and a kernel that issued
 * prefetches ends only when they have landed. With the prefetch kernel in the step's chain, the next kernel waited
 * for it (decode 105 -> 36 tok/s). So the prefetches are spread over many blocks (PF_BLOCK_BYTES each) and run on a
 * side stream forked from the step's stream (cu_pf_side): in a captured graph a branch beside the chain, joined
 * back at the end of the segment, so nothing in the chain waits for it.
 *
 * A prefetch changes no byte any kernel computes: it writes nothing, and a line it brings is the line a load would
 * have brought. So every output stays bit-identical with it on or off (cli.sh compares them anyway). */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_kernels.h"

#define PF_CHUNK (16u << 10)       /* bytes per bulk prefetch instruction */
#define PF_THREADS 32
#define PF_BLOCK_BYTES (512u << 10) /* bytes a block of the plain list takes: one SM's engine at ~140 GB/s, ~4 us */
#define PF_EXPERT_PARTS 16          /* blocks an expert's matrices are spread over */

/* Bulk prefetch of [p, p + n) by threads thr = 0 .. nthr-1 of the caller (chunk c to thread c mod nthr); the range is
 * widened to 16-byte bounds (the instruction's alignment), inside the same allocation since cudaMalloc aligns to 256. */
__device__ __forceinline__ void prefetch_range(const void *p, uint64_t n, uint64_t thr, uint64_t nthr) {
    if (!p || !n) return;
    uint64_t g = (uint64_t)(uintptr_t)p;   /* the instruction takes a global-space address */
#if defined(__CUDA_ARCH__)
    asm("cvta.to.global.u64 %0, %1;" : "=l"(g) : "l"(g));
#endif
    const uint64_t a0 = g & ~(uint64_t)15, a1 = (g + n + 15) & ~(uint64_t)15;
    for (uint64_t a = a0 + thr * PF_CHUNK; a < a1; a += nthr * PF_CHUNK) {
        const uint32_t len = (uint32_t)(a1 - a < PF_CHUNK ? a1 - a : PF_CHUNK);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(len) : "memory");
#else
        (void)len;
#endif
    }
}

/* A weight's data bytes (the first cap) and the scale bytes of its rows (weight.h; a view's rows only). */
__device__ __forceinline__ void prefetch_weight(const dsv4_weight &w, uint64_t cap, uint64_t thr, uint64_t nthr) {
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

/* Every thread of the grid takes its share of every weight of the list. */
__global__ void __launch_bounds__(PF_THREADS) k_l2_prefetch(cu_pf_list l) {
    dev_grid_wait();
    const uint64_t thr = (uint64_t)blockIdx.x * PF_THREADS + threadIdx.x, nthr = (uint64_t)gridDim.x * PF_THREADS;
    for (int i = 0; i < l.n; i++) prefetch_weight(l.w[i], l.cap[i], thr, nthr);
}

/* Blocks (i, part): tile i of the plan, if it is its expert's first tile (an expert's pairs are consecutive tiles),
 * prefetches share `part` of the first cap bytes of that expert's matrices in wa then wb (and their scales). */
__global__ void __launch_bounds__(PF_THREADS) k_l2_prefetch_experts(const dsv4_weight *wa, const dsv4_weight *wb, cu_moe_plan p,
                                                                    uint64_t cap) {
    dev_grid_wait();
    const int i = blockIdx.x;
    if (i >= *p.n_tiles) return;
    const int e = p.tile_expert[i];
    if (i > 0 && p.tile_expert[i - 1] == e) return;
    const uint64_t thr = (uint64_t)blockIdx.y * PF_THREADS + threadIdx.x, nthr = (uint64_t)gridDim.y * PF_THREADS;
    prefetch_weight(wa[e], cap, thr, nthr);
    if (wb) prefetch_weight(wb[e], cap, thr, nthr);
}

/* The side stream: fork it from st (its work follows what st has enqueued so far), and remember to join. */
static cudaStream_t fork_side(cu_stream st, cu_pf_side *side) {
    if (!side) return (cudaStream_t)st;
    cudaEventRecord((cudaEvent_t)side->fork, (cudaStream_t)st);
    cudaStreamWaitEvent((cudaStream_t)side->st, (cudaEvent_t)side->fork, 0);
    return (cudaStream_t)side->st;
}
static void mark_side(cu_pf_side *side) {
    if (!side) return;
    cudaEventRecord((cudaEvent_t)side->join, (cudaStream_t)side->st);
    side->pending = 1;
}

static uint64_t list_bytes(const cu_pf_list *l) {
    uint64_t n = 0;
    for (int i = 0; i < l->n; i++) {
        const dsv4_weight &w = l->w[i];
        uint64_t db = (uint64_t)w.rows * (uint64_t)w.cols;
        db = w.fmt == WF_F32 ? 4 * db : w.fmt == WF_BF16 ? 2 * db : w.fmt == WF_FP4 ? db / 2 : db;
        n += db < l->cap[i] ? db : l->cap[i];
    }
    return n;
}

extern "C" void cu_l2_prefetch(cu_stream st, const cu_pf_list *l, cu_pf_side *side) {
    if (l->n <= 0) return;
    const uint64_t blocks = (list_bytes(l) + PF_BLOCK_BYTES - 1) / PF_BLOCK_BYTES;
    k_l2_prefetch<<<(unsigned)(blocks < 1 ? 1 : blocks > 1024 ? 1024 : blocks), PF_THREADS, 0, fork_side(st, side)>>>(*l);
    mark_side(side);
}

extern "C" void cu_l2_prefetch_experts(cu_stream st, const dsv4_weight *wa, const dsv4_weight *wb, const cu_moe_plan *p, int max_tiles,
                                       uint64_t cap, cu_pf_side *side) {
    if (max_tiles <= 0) return;
    k_l2_prefetch_experts<<<dim3((unsigned)max_tiles, PF_EXPERT_PARTS), PF_THREADS, 0, fork_side(st, side)>>>(wa, wb, *p, cap);
    mark_side(side);
}

extern "C" void cu_pf_join(cu_stream st, cu_pf_side *side) {
    if (!side || !side->pending) return;
    cudaStreamWaitEvent((cudaStream_t)st, (cudaEvent_t)side->join, 0);
    side->pending = 0;
}

extern "C" int cu_pf_side_init(cu_pf_side *side) {
    cudaStream_t s = NULL;
    cudaEvent_t f = NULL, j = NULL;
    side->st = side->fork = side->join = NULL;
    side->pending = 0;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&f, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&j, cudaEventDisableTiming) != cudaSuccess) {
        if (s) cudaStreamDestroy(s);
        if (f) cudaEventDestroy(f);
        cudaGetLastError();
        return -1;
    }
    side->st = s;
    side->fork = f;
    side->join = j;
    return 0;
}

extern "C" void cu_pf_side_free(cu_pf_side *side) {
    if (side->st) cudaStreamDestroy((cudaStream_t)side->st);
    if (side->fork) cudaEventDestroy((cudaEvent_t)side->fork);
    if (side->join) cudaEventDestroy((cudaEvent_t)side->join);
    side->st = side->fork = side->join = NULL;
}
