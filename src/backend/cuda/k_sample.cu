/* Drawing tokens on the GPU (core/sample.h is the definition; core/sample.c the CPU's implementation). One block
 * of SM_LANES threads per sampled row; thread t is lane t of the definition's lane tree sum and handles the ids
 * t, t + SM_LANES, ... in increasing order in every pass. The arithmetic is sample_math.h's (correctly rounded
 * intrinsics only), so a row gives the CPU's token for the same logits bits.
 *
 * Reduction orders:
 *   argmax (greedy, the max logit, the race): a max over the strict total order (value desc, id asc), by xor
 *     butterflies in each warp and then over the 32 warps' results: any order gives the same element.
 *   counts (top-k): integers, exact in any order.
 *   sums (top-p): the lane tree sum — lane t adds its kept w (as double) in increasing id, then the tree
 *     lane[j] += lane[j + s] for s = 512, ..., 1 in shared memory. The CPU computes the same tree.
 * A row's token depends on its logits and its parameters only: never on the other rows of the launch. */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_kernels.h"
#include "core/sample_math.h"
#include <cuda_runtime.h>
#include <stdint.h>

#define FULL 0xffffffffu
#define WARPS (SM_LANES / 32)

/* The best (value, id) of the block, in every thread. */
__device__ __forceinline__ void block_best(double &v, int32_t &id, double *shv, int32_t *shid) {
    for (int off = 16; off > 0; off >>= 1) {
        const double ov = __shfl_xor_sync(FULL, v, off);
        const int32_t oi = __shfl_xor_sync(FULL, id, off);
        if (sm_before(ov, oi, v, id)) {
            v = ov;
            id = oi;
        }
    }
    if ((threadIdx.x & 31) == 0) {
        shv[threadIdx.x >> 5] = v;
        shid[threadIdx.x >> 5] = id;
    }
    __syncthreads();
    for (int k = 0; k < WARPS; k++)
        if (sm_before(shv[k], shid[k], v, id)) {
            v = shv[k];
            id = shid[k];
        }
    __syncthreads();
}

__device__ __forceinline__ int block_count(int c, int *shi) {
    c = __reduce_add_sync(FULL, c);
    if ((threadIdx.x & 31) == 0) shi[threadIdx.x >> 5] = c;
    __syncthreads();
    int r = 0;
    for (int k = 0; k < WARPS; k++) r += shi[k];
    __syncthreads();
    return r;
}

/* The lane tree sum (sample.h): acc is this thread's lane. */
__device__ __forceinline__ double block_treesum(double acc, double *shd) {
    const int t = threadIdx.x;
    shd[t] = acc;
    __syncthreads();
    for (int s = SM_LANES / 2; s > 0; s >>= 1) {
        if (t < s) shd[t] = __dadd_rn(shd[t], shd[t + s]);
        __syncthreads();
    }
    const double r = shd[0];
    __syncthreads();
    return r;
}

/* sample.c in_cut: a kept token (w != 0) at or above the cut (cb, cj). */
__device__ __forceinline__ int in_cut(uint32_t b, int32_t id, uint32_t cb, int32_t cj) {
    return b != 0 && (b > cb || (b == cb && id <= cj));
}

/* The count or the lane tree sum of the kept tokens of row w in the cut (sample.c measure). */
__device__ double measure(const float *w, int V, uint32_t cb, int32_t cj, int sum, double *shd, int *shi) {
    if (!sum) {
        int c = 0;
        for (int32_t i = threadIdx.x; i < V; i += SM_LANES) c += in_cut(sm_f2u(w[i]), i, cb, cj);
        return (double)block_count(c, shi);
    }
    double acc = 0.0;
    for (int32_t i = threadIdx.x; i < V; i += SM_LANES) {
        const float wi = w[i];
        if (in_cut(sm_f2u(wi), i, cb, cj)) acc = __dadd_rn(acc, (double)wi);
    }
    return block_treesum(acc, shd);
}

/* sample.c keep_prefix: the shortest rank-order prefix whose measure reaches goal stays, the rest becomes 0.
 * Every thread rewrites only its own ids, which only it reads later. */
__device__ void keep_prefix(float *w, int V, double goal, int sum, double *shd, int *shi) {
    uint32_t lo = 1, hi = SM_ONE_BITS;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo + 1) / 2;
        if (measure(w, V, mid, INT32_MAX, sum, shd, shi) >= goal) lo = mid;
        else hi = mid - 1;
    }
    const uint32_t cb = lo;
    int32_t jlo = 0, jhi = V - 1;
    while (jlo < jhi) {
        const int32_t mid = jlo + (jhi - jlo) / 2;
        if (measure(w, V, cb, mid, sum, shd, shi) >= goal) jhi = mid;
        else jlo = mid + 1;
    }
    for (int32_t i = threadIdx.x; i < V; i += SM_LANES)
        if (!in_cut(sm_f2u(w[i]), i, cb, jlo)) w[i] = 0.0f;
}

__global__ void __launch_bounds__(SM_LANES) k_sample(const float *logits, int V, const cu_sample_req *req, float *wbuf, int32_t *tok,
                                                     float *probs) {
    dev_grid_wait();
    __shared__ double shd[SM_LANES];
    __shared__ double shv[WARPS];
    __shared__ int32_t shid[WARPS];
    __shared__ int shi[WARPS];
    const cu_sample_req r = req[blockIdx.x];
    const float *l = logits + (int64_t)r.row * V;
    float *w = wbuf + (int64_t)blockIdx.x * V;
    float *pr = probs ? probs + (int64_t)blockIdx.x * V : NULL;
    /* 1-2: the greedy token and the max */
    double bv = -INFINITY;
    int32_t bi = INT32_MAX;
    for (int32_t i = threadIdx.x; i < V; i += SM_LANES) {
        const float v = sm_logit(l[i], i, r.n_allowed);
        if (sm_before(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    block_best(bv, bi, shv, shid);
    const float m = (float)bv;
    if (!(r.temperature > 0.0f) || !isfinite(m)) {
        if (threadIdx.x == 0) tok[blockIdx.x] = bi;
        if (pr)
            for (int32_t i = threadIdx.x; i < V; i += SM_LANES) pr[i] = i == bi ? 1.0f : 0.0f;
        return;
    }
    /* 3-4: w and min-p */
    const float inv_t = __fdiv_rn(1.0f, fmaxf(r.temperature, 1e-5f));
    int c = 0;
    for (int32_t i = threadIdx.x; i < V; i += SM_LANES) {
        float wi = sm_expf(__fmul_rn(__fsub_rn(sm_logit(l[i], i, r.n_allowed), m), inv_t));
        if (!(wi > 0.0f && wi >= r.min_p)) wi = 0.0f;
        w[i] = wi;
        c += wi > 0.0f;
    }
    const int n = block_count(c, shi);
    /* 5-6: top-k, top-p */
    if (r.top_k > 0 && r.top_k < n) keep_prefix(w, V, (double)r.top_k, 0, shd, shi);
    if (r.top_p < 1.0f) keep_prefix(w, V, __dmul_rn((double)r.top_p, measure(w, V, 0, INT32_MAX, 1, shd, shi)), 1, shd, shi);
    /* the distribution (sample.c sample_distribution): w / treesum(kept) */
    if (pr) {
        const double S = measure(w, V, 0, INT32_MAX, 1, shd, shi);
        for (int32_t i = threadIdx.x; i < V; i += SM_LANES) {
            const float wi = w[i];
            pr[i] = wi > 0.0f ? (float)__ddiv_rn((double)wi, S) : 0.0f;
        }
    }
    /* 7: the race */
    const uint64_t key = sm_draw_key(r.seed, r.draw);
    bv = -1.0;
    bi = INT32_MAX;
    for (int32_t i = threadIdx.x; i < V; i += SM_LANES) {
        const float wi = w[i];
        if (wi > 0.0f) {
            const double rv = sm_race(wi, key, i);
            if (sm_before(rv, i, bv, bi)) {
                bv = rv;
                bi = i;
            }
        }
    }
    block_best(bv, bi, shv, shid);
    if (threadIdx.x == 0) tok[blockIdx.x] = bi;
}

extern "C" void cu_sample(cu_stream st, const float *logits, int V, const cu_sample_req *req, int n, float *w, int32_t *tok,
                          float *probs) {
    if (n > 0) k_sample<<<n, SM_LANES, 0, (cudaStream_t)st>>>(logits, V, req, w, tok, probs);
}
