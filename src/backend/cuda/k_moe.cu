/* Mixture of experts on the device (core/moe.c): routing, the step's (token, expert) plan built on the GPU (no
 * host round trip), clamped SwiGLU, and the combination of each token's experts in increasing expert id. The
 * expert products themselves are cu_expert_linear (k_linear.cu). */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_kernels.h"
#include "backend/cuda/cu_quant.cuh"
#include "model/expert_split.h"

__device__ __forceinline__ float dev_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* One warp per token; the same selections as moe.c route / top_k_experts. Scores sqrt(softplus(logit)) element by
 * element; then K rounds of "the largest score + bias among experts not yet taken, the lowest id on ties": lane l
 * finds its own best among experts l, l+32, ... (increasing, strict >), and the warp keeps the largest value,
 * the lower id on ties — the same expert the sequential scan picks. The weights are normalised by the sum of the
 * selected scores added in selection order (one lane), as on the CPU. */
#define ROUTE_MAX_K 16
__global__ void k_route(float *logits, const float *bias, const int32_t *tid2eid, const int32_t *tok, int T, int E, int K,
                        float route_scale, int32_t *route_e, float *route_w) {
    dev_grid_wait();
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= T) return;
    float *s = logits + (int64_t)t * E;
    for (int e = lane; e < E; e += 32) s[e] = sqrtf(dev_softplus(s[e]));
    __syncwarp();
    int32_t chosen[ROUTE_MAX_K];
    for (int j = 0; j < K; j++) {
        if (tid2eid) {
            chosen[j] = tid2eid[(int64_t)tok[t] * K + j];
            continue;
        }
        int best = -1;
        float bv = 0.0f;
        for (int e = lane; e < E; e += 32) {
            bool taken = false;
            for (int q = 0; q < j; q++) taken |= chosen[q] == e;
            if (taken) continue;
            const float v = s[e] + (bias ? bias[e] : 0.0f);
            if (best < 0 || v > bv) { best = e; bv = v; }
        }
        for (int off = 16; off > 0; off >>= 1) {
            const int ob = __shfl_down_sync(0xffffffffu, best, off);
            const float ov = __shfl_down_sync(0xffffffffu, bv, off);
            if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) { best = ob; bv = ov; }
        }
        chosen[j] = __shfl_sync(0xffffffffu, best, 0);
    }
    if (lane) return;
    int32_t *sel = route_e + (int64_t)t * K;
    float *w = route_w + (int64_t)t * K, sum = 0.0f;
    for (int j = 0; j < K; j++) sel[j] = chosen[j];
    for (int j = 0; j < K; j++) sum += s[sel[j]];
    for (int j = 0; j < K; j++) w[j] = s[sel[j]] / sum * route_scale;
}

/* The same routing with everything in registers (DSV4_MOE_FAST, E <= 32 R for R = 8 or 16, K <= ROUTE_MAX_K).
 * Run 36's ncu: k_route and k_moe_plan together ~7 % of a one-token step; above, every round re-reads the scores
 * from memory and lane 0 ends with ~4 K dependent reads (each pick stored, read back, its score read). Here lane l
 * keeps the scores and biases of experts l + 32 r (loaded once, the scores still written back as above), a bit per
 * expert taken (the same set as the chosen list), and the winning score travels with its id through the same
 * butterfly; lane j keeps pick j and its score. The weights: every lane adds the K scores in pick order from
 * 0.0f (shuffles of lane j's score), lane j divides its own: the same sum and expressions. Hash routing: pick j
 * is tid2eid's, its score fetched from the owning lane. So every output bit is the loop's above. */
#ifndef DSV4_MOE_FAST
#define DSV4_MOE_FAST 1   /* 0: k_route and k_moe_plan as before (tools/gpu/shim/shim_mhc.sh compares) */
#endif
/* Token t's routing by its warp (lane = the lane): route_e / route_w rows t, and the same K entries into re / rw when
 * they are not NULL (k_route_plan's shared copy). */
template <int R>
__device__ __forceinline__ void route_fast_warp(float *logits, const float *bias, const int32_t *tid2eid, const int32_t *tok, int t,
                                                int lane, int E, int K, float route_scale, int32_t *route_e, float *route_w, int32_t *re,
                                                float *rw) {
    float *s = logits + (int64_t)t * E;
    float sc[R], bs[R];
    int my_e = 0;
    if (tid2eid && lane < K) my_e = tid2eid[(int64_t)tok[t] * K + lane];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int e = lane + 32 * r;
        sc[r] = e < E ? s[e] : 0.0f;
        bs[r] = e < E && bias ? bias[e] : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int e = lane + 32 * r;
        if (e < E) s[e] = sc[r] = sqrtf(dev_softplus(sc[r]));
    }
    float my_s = 0.0f;
    if (tid2eid) {
#pragma unroll
        for (int r = 0; r < R; r++) {   /* the owner of my_e is lane my_e & 31, its register my_e >> 5 */
            const float v = __shfl_sync(0xffffffffu, sc[r], my_e & 31);
            if (r == my_e >> 5) my_s = v;
        }
    } else {
        uint32_t taken = 0;   /* bit r: expert lane + 32 r already picked */
        for (int j = 0; j < K; j++) {
            int best = -1;
            float bv = 0.0f, bsc = 0.0f;
#pragma unroll
            for (int r = 0; r < R; r++) {
                const int e = lane + 32 * r;
                if (e >= E || (taken >> r & 1)) continue;
                const float v = sc[r] + bs[r];
                if (best < 0 || v > bv) { best = e; bv = v; bsc = sc[r]; }
            }
            for (int off = 16; off > 0; off >>= 1) {
                const int ob = __shfl_down_sync(0xffffffffu, best, off);
                const float ov = __shfl_down_sync(0xffffffffu, bv, off);
                const float os = __shfl_down_sync(0xffffffffu, bsc, off);
                if (ob >= 0 && (best < 0 || ov > bv || (ov == bv && ob < best))) { best = ob; bv = ov; bsc = os; }
            }
            best = __shfl_sync(0xffffffffu, best, 0);
            bsc = __shfl_sync(0xffffffffu, bsc, 0);
            if (best >= 0 && (best & 31) == lane) taken |= 1u << (best >> 5);
            if (lane == j) { my_e = best; my_s = bsc; }
        }
    }
    float sum = 0.0f;
    for (int j = 0; j < K; j++) sum += __shfl_sync(0xffffffffu, my_s, j);
    if (lane < K) {
        const float wt = my_s / sum * route_scale;
        route_e[(int64_t)t * K + lane] = my_e;
        route_w[(int64_t)t * K + lane] = wt;
        if (re) {
            re[t * K + lane] = my_e;
            rw[t * K + lane] = wt;
        }
    }
}

template <int R>
__global__ void k_route_fast(float *logits, const float *bias, const int32_t *tid2eid, const int32_t *tok, int T, int E, int K,
                             float route_scale, int32_t *route_e, float *route_w) {
    dev_grid_wait();
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= T) return;
    route_fast_warp<R>(logits, bias, tid2eid, tok, t, lane, E, K, route_scale, route_e, route_w, NULL, NULL);
}

extern "C" void cu_route(cu_stream st, float *logits, const float *bias, const int32_t *tid2eid, const int32_t *tok, int T,
                         int E, int K, float route_scale, int32_t *route_e, float *route_w) {
    if (T <= 0) return;
    if (DSV4_MOE_FAST && K <= ROUTE_MAX_K && E <= 32 * 16) {
        if (E <= 32 * 8)
            k_route_fast<8><<<cu_blocks(T, 4), 128, 0, (cudaStream_t)st>>>(logits, bias, tid2eid, tok, T, E, K, route_scale, route_e,
                                                                          route_w);
        else
            k_route_fast<16><<<cu_blocks(T, 4), 128, 0, (cudaStream_t)st>>>(logits, bias, tid2eid, tok, T, E, K, route_scale,
                                                                           route_e, route_w);
        return;
    }
    k_route<<<cu_blocks(T, 4), 128, 0, (cudaStream_t)st>>>(logits, bias, tid2eid, tok, T, E, K, route_scale, route_e, route_w);
}

/* Is j the first slot of token t's row naming its expert? (a row naming an expert twice counts it once) */
__device__ __forceinline__ bool first_slot(const int32_t *re, int j) {
    for (int q = 0; q < j; q++)
        if (re[q] == re[j]) return false;
    return true;
}

__global__ void k_count_routes(const int32_t *route_e, int T, int K, unsigned long long *counts) {
    dev_grid_wait();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const int32_t *re = route_e + (int64_t)t * K;
    for (int j = 0; j < K; j++)
        if (first_slot(re, j)) atomicAdd(&counts[re[j]], 1ull);
}

extern "C" void cu_count_routes(cu_stream st, const int32_t *route_e, int T, int K, unsigned long long *counts) {
    if (T > 0) k_count_routes<<<(T + 255) / 256, 256, 0, (cudaStream_t)st>>>(route_e, T, K, counts);
}

__global__ void k_scatter_pair_rows(const float *rows, const int32_t *pair, int n, int d, float *ey) {
    dev_grid_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n * d) return;
    const int64_t q = i / d, k = i % d;
    ey[(int64_t)pair[q] * d + k] = rows[i];
}

extern "C" void cu_scatter_pair_rows(cu_stream st, const float *rows, const int32_t *pair, int n, int d, float *ey) {
    if (n > 0) k_scatter_pair_rows<<<cu_blocks((int64_t)n * d, 256), 256, 0, (cudaStream_t)st>>>(rows, pair, n, d, ey);
}

/* ---- the host link of a split step enqueued ahead (cuda_host_experts.h) ----
 * Both ends of a hand-off are kernels, so that a whole step can be enqueued (graphed) before the host computes
 * anything. The link words live in page-locked mapped memory; each is monotonic within a step (the host zeroes them
 * before the step), and a layer L waits for or raises the value L + 1. The flags are read and written at system
 * scope (cu_common.cuh dev_ld_acquire_sys, dev_st_release_sys; runs 177-182 used the .cv / .wt cache hints, run 183
 * measured the same speed). */

/* The layer's rows xn [T][d] and routing [T][K] into the host's mapped buffers (written through to system memory,
 * st.global.wt), then link->published = value (a release store at system scope). Block t copies token t; each block's writes
 * are made visible to the host (__threadfence_system) before it counts itself in *blocks_done, and the last block to
 * count resets the counter for the next launch and publishes. */
__global__ void k_hx_publish(const float *xn, const int32_t *route_e, const float *route_w, int d, int K, float *xn_h, int32_t *re_h,
                             float *rw_h, unsigned *blocks_done, cu_hx_link *link, int value) {
    dev_grid_wait();
    const int64_t t = blockIdx.x;
    if ((d & 3) == 0)   /* 16-byte stores: one bus transaction each, not four (k_hx_await_rows' comment) */
        for (int e = threadIdx.x; e < d / 4; e += blockDim.x) __stwt((float4 *)(xn_h + t * d) + e, ((const float4 *)(xn + t * d))[e]);
    else
        for (int e = threadIdx.x; e < d; e += blockDim.x) __stwt(xn_h + t * d + e, xn[t * d + e]);
    for (int j = threadIdx.x; j < K; j += blockDim.x) {
        __stwt(re_h + t * K + j, route_e[t * K + j]);
        __stwt(rw_h + t * K + j, route_w[t * K + j]);
    }
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0 && atomicAdd(blocks_done, 1u) == gridDim.x - 1) {
        *blocks_done = 0u;
        __threadfence_system();
        dev_st_release_sys(&link->published, value);
    }
}

extern "C" void cu_hx_publish(cu_stream st, const float *xn, const int32_t *route_e, const float *route_w, int T, int d, int K,
                              float *xn_h, int32_t *re_h, float *rw_h, unsigned *blocks_done, cu_hx_link *link, int value) {
    if (T > 0) k_hx_publish<<<T, 256, 0, (cudaStream_t)st>>>(xn, route_e, route_w, d, K, xn_h, re_h, rw_h, blocks_done, link, value);
}

__device__ __forceinline__ unsigned long long dev_now_ns(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Wait until link->ready >= value (the host wrote the layer's link->n rows into rows_h / pair_h), then put each row
 * at its pair index in ey, reading the rows from the host's mapped memory. Only thread 0 of block 0 polls the host's
 * word (__nanosleep between reads: a read over the bus per ~microsecond); it hands the row count to the other blocks
 * through relay, words in the GPU's own memory (relay[0] = 1 once relay[1] holds n), on which their thread 0 waits
 * and then makes its own acquire load of link->ready, so that every block's reads of the rows follow the host's
 * release of them (PTX memory model: the acquire synchronizes with the host's store of ready, after its rows). The
 * last block to leave zeroes relay[0] and its counter relay[2] for the next launch. (Before 23fe990 every block's
 * thread 0 polled the host: 32 reads over the bus a microsecond through the host's whole turn, and the host's own
 * loops ran ~20 % slower, run 182.)
 * The rows: block b takes rows b, b + gridDim.x, ...; each row's pair index read once, its d floats in 16-byte loads
 * (when d % 4 == 0; else 4-byte). A single 4-byte read over the bus is a whole bus transaction: runs 180-183 read
 * each float and its pair index with one, and a hand-off cost ~0.4 ms a layer at one token, ~1.3 ms at six and ~8 ms
 * at 64 more than launched directly, in proportion to the rows (~0.4 GB/s). Wide loads are what tools/bench/pcie_bench
 * measured at ~51 GB/s.
 * Past CU_HX_TIMEOUT_S block 0 sets link->late to the value it waited for and hands on n = 0, so a host that never
 * answers cannot hang the GPU: the step then fails (cuda_hx_check reads link->late). The blocks are at most 32, all
 * resident at once, so the wait on block 0 cannot starve it. */
__device__ __forceinline__ int hx_host_rows_ready(cu_hx_link *link, int value) {
    const unsigned long long t0 = dev_now_ns();
    int got = dev_ld_acquire_sys(&link->ready) >= value;
    while (!got && dev_now_ns() - t0 < (unsigned long long)CU_HX_TIMEOUT_S * 1000000000ull) {
        __nanosleep(1000);
        got = dev_ld_acquire_sys(&link->ready) >= value;
    }
    const int n = got ? dev_ld_acquire_sys(&link->n) : 0;
    if (!got) dev_st_release_sys(&link->late, value);
    return n;
}

__global__ void k_hx_await_rows(cu_hx_link *link, int value, const float *rows_h, const int32_t *pair_h, int d, float *ey,
                                unsigned *relay) {
    dev_grid_wait();
    __shared__ int n;
    if (threadIdx.x == 0) {
        if (blockIdx.x == 0) {
            n = hx_host_rows_ready(link, value);
            ((volatile unsigned *)relay)[1] = (unsigned)n;
            __threadfence();
            ((volatile unsigned *)relay)[0] = 1u;
        } else {
            while (!((volatile unsigned *)relay)[0]) __nanosleep(200);
            __threadfence();
            n = (int)((volatile unsigned *)relay)[1];
            (void)dev_ld_acquire_sys(&link->ready);   /* this block's own acquire of what the host released */
        }
    }
    __syncthreads();
    for (int q = blockIdx.x; q < n; q += gridDim.x) {
        const int64_t p = pair_h[q];
        const float *src = rows_h + (int64_t)q * d;
        float *dst = ey + p * d;
        if ((d & 3) == 0) {
            const float4 *__restrict__ s4 = (const float4 *)src;
            float4 *__restrict__ d4 = (float4 *)dst;
#pragma unroll 4
            for (int k = threadIdx.x; k < d / 4; k += blockDim.x) d4[k] = s4[k];
        } else
            for (int k = threadIdx.x; k < d; k += blockDim.x) dst[k] = src[k];
    }
    if (threadIdx.x == 0 && atomicAdd(&relay[2], 1u) == gridDim.x - 1) {
        ((volatile unsigned *)relay)[0] = 0u;   /* every block has read relay[1]: it counted itself after */
        relay[2] = 0u;
    }
}

extern "C" void cu_hx_await_rows(cu_stream st, cu_hx_link *link, int value, const float *rows_h, const int32_t *pair_h, int max_rows,
                                 int d, float *ey, unsigned *relay) {
    const int blocks = max_rows < 32 ? (max_rows > 0 ? max_rows : 1) : 32;   /* a block a row, at most 32 */
    k_hx_await_rows<<<blocks, 256, 0, (cudaStream_t)st>>>(link, value, rows_h, pair_h, d, ey, relay);
}

#define PLAN_THREADS 256

/* One block. Thread e (strided over experts) walks the tokens in order, so pair positions, tiles and each
 * token's pair list depend only on the routing, never on scheduling. The definition the faster kernels below are
 * held to (tools/gpu/shim/shim_mhc.sh); run only where they do not apply (DSV4_MOE_FAST=0, or experts too many for
 * their shared memory): O(T K) work a thread, 15.6 ms a layer at 8K tokens (run 147). */
__global__ void k_moe_plan(const int32_t *route_e, const float *route_w, int T, int K, int E, cu_moe_plan p) {
    dev_grid_wait();
    extern __shared__ int plan_smem[];
    int *cnt = plan_smem, *off = plan_smem + E, *toff = plan_smem + 2 * E;
    for (int i = threadIdx.x; i < T * K; i += blockDim.x) p.token_pairs[i] = -1;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int c = 0;
        for (int t = 0; t < T; t++) {
            const int32_t *re = route_e + (int64_t)t * K;
            for (int j = 0; j < K; j++)
                if (re[j] == e && first_slot(re, j)) c++;
        }
        cnt[e] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0, ts = 0;
        for (int e = 0; e < E; e++) {
            off[e] = s;
            toff[e] = ts;
            s += cnt[e];
            ts += (cnt[e] + p.tile - 1) / p.tile;
        }
        *p.n_tiles = ts;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int r = 0;
        for (int t = 0; t < T; t++) {
            const int32_t *re = route_e + (int64_t)t * K;
            for (int j = 0; j < K; j++) {
                if (re[j] != e || !first_slot(re, j)) continue;
                const int pi = off[e] + r++;
                p.pair_token[pi] = t;
                p.pair_weight[pi] = route_w[(int64_t)t * K + j];
                /* the token's slot for e: how many of its distinct experts are smaller */
                int slot = 0;
                for (int q = 0; q < K; q++)
                    if (re[q] < e && first_slot(re, q)) slot++;
                p.token_pairs[(int64_t)t * K + slot] = pi;
            }
        }
        for (int q = 0; q * p.tile < cnt[e]; q++) {
            const int ti = toff[e] + q;
            p.tile_expert[ti] = e;
            p.tile_first[ti] = off[e] + q * p.tile;
            p.tile_count[ti] = min(p.tile, cnt[e] - q * p.tile);
        }
    }
}

/* The same plan for T <= 256 (DSV4_MOE_FAST), in parallel (the kernel above: one thread per expert walks all T K
 * route entries twice, thread 0 scans the E counts one after another, and each pair's slot is found by re-reading
 * the row from memory behind the stores; run 36: ~12 us at one token). Every output is an integer or a copied
 * weight, fixed by the routing alone, so any order of work gives the same bytes:
 *   - the routing copied to shared memory; entry (t, j) that is its row's first naming expert e sets bit t of
 *     mask[e] (W words of 64 tokens; atomicOr: the same bits in any order);
 *   - thread k owns experts k EP .. k EP + EP - 1 (EP = ceil(E / 256)): counts = popcounts, tiles per expert,
 *     and their exclusive prefix sums over the experts by a block scan (shuffles up, then the warps' totals):
 *     off[e], toff[e], n_tiles, and each expert's tiles, as the serial scan gives them;
 *   - entry (t, j), if first: pair off[e] + (tokens before t in mask[e]) (pairs sorted by token within an
 *     expert, as the walk above numbers them), its token and weight, and token_pairs[t][slot] with slot = its
 *     row's distinct experts below e; the row's slots from its count of distinct experts on are -1. */
#define PLAN_FAST_MAXT 256
/* The plan's shared memory (dynamic): mask [E][W], the routing re / rw [T K] each, off [E]. */
struct plan_smem {
    unsigned long long *mask;
    int32_t *re;
    float *rw;
    int *off;
};
template <int W> __device__ __forceinline__ plan_smem plan_smem_of(void *base, int T, int K, int E) {
    plan_smem m;
    m.mask = (unsigned long long *)base;
    m.re = (int32_t *)(m.mask + (size_t)E * W);
    m.rw = (float *)(m.re + T * K);
    m.off = (int *)(m.rw + T * K);
    return m;
}
static size_t plan_smem_bytes(int T, int K, int E, int W) {
    return sizeof(unsigned long long) * (size_t)E * W + (sizeof(int32_t) + sizeof(float)) * (size_t)T * K + sizeof(int) * (size_t)E;
}

/* The experts' offsets and tiles from their pair counts, by THREADS threads: thread k owns experts [k EP, k EP + EP)
 * (EP = ceil(E / THREADS)), count_of(e) its counts; the exclusive prefix sums of the counts and of the tiles (`tile`
 * pairs each) over the experts by a block scan (shuffles up, then the warps' totals in wsum): off[e], n_tiles and
 * each expert's tiles, as a serial scan gives them. Ends with every thread's off[] written (not yet visible). */
template <int THREADS, class Count>
__device__ __forceinline__ void plan_offsets(Count count_of, int E, int tile, int (*wsum)[THREADS / 32], int *off, const cu_moe_plan &p) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int EP = (E + THREADS - 1) / THREADS, e0 = min(E, tid * EP), e1 = min(E, e0 + EP);
    int c = 0, ct = 0;
    for (int e = e0; e < e1; e++) {
        const int ce = count_of(e);
        c += ce;
        ct += (ce + tile - 1) / tile;
    }
    int ic = c, it = ct;   /* inclusive over the warp's lanes */
    for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(0xffffffffu, ic, o), b = __shfl_up_sync(0xffffffffu, it, o);
        if (lane >= o) { ic += a; it += b; }
    }
    if (lane == 31) { wsum[0][warp] = ic; wsum[1][warp] = it; }
    __syncthreads();
    for (int w = 0; w < warp; w++) { ic += wsum[0][w]; it += wsum[1][w]; }
    if (tid == THREADS - 1) *p.n_tiles = it;
    int s = ic - c, ts = it - ct;   /* exclusive: the pairs and tiles of the experts before e0 */
    for (int e = e0; e < e1; e++) {
        const int ce = count_of(e);
        off[e] = s;
        for (int q = 0; q * tile < ce; q++) {
            p.tile_expert[ts + q] = e;
            p.tile_first[ts + q] = s + q * tile;
            p.tile_count[ts + q] = min(tile, ce - q * tile);
        }
        s += ce;
        ts += (ce + tile - 1) / tile;
    }
}

/* Routing entry j of token t's row rt (entry i = t K + j): -1 into token_pairs[i] when j is past the row's count of
 * distinct experts; if j is its expert e's first slot, its pair off_e + (bits of e's mask mk below bit u: the tokens
 * before t that name e), the pair's token and weight w, and token_pairs[t][slot], slot = the row's distinct experts
 * below e. */
__device__ __forceinline__ void plan_place(const int32_t *rt, int K, int t, int j, int u, const unsigned long long *mk, int off_e, float w,
                                           const cu_moe_plan &p) {
    const int e = rt[j];
    int nv = 0, slot = 0;
    for (int q = 0; q < K; q++)
        if (first_slot(rt, q)) {
            nv++;
            slot += rt[q] < e;
        }
    if (j >= nv) p.token_pairs[(int64_t)t * K + j] = -1;
    if (!first_slot(rt, j)) return;
    int rank = __popcll(mk[u >> 6] & ((1ull << (u & 63)) - 1));
    for (int w64 = 0; w64 < (u >> 6); w64++) rank += __popcll(mk[w64]);
    const int pi = off_e + rank;
    p.pair_token[pi] = t;
    p.pair_weight[pi] = w;
    p.token_pairs[(int64_t)t * K + slot] = pi;
}

/* The plan from the routing in sm.re / sm.rw, sm.mask zeroed (both visible to the whole block). */
template <int W>
__device__ __forceinline__ void plan_fast_block(const plan_smem &sm, int T, int K, int E, const cu_moe_plan &p) {
    __shared__ int wsum[2][PLAN_THREADS / 32];
    unsigned long long *mask = sm.mask;
    const int32_t *re = sm.re;
    const float *rw = sm.rw;
    int *off = sm.off;
    const int tid = threadIdx.x, n = T * K;
    for (int i = tid; i < n; i += PLAN_THREADS) {
        const int t = i / K, j = i % K;
        if (first_slot(re + t * K, j)) atomicOr(&mask[(int64_t)re[i] * W + (t >> 6)], 1ull << (t & 63));
    }
    __syncthreads();
    plan_offsets<PLAN_THREADS>(
        [&](int e) {
            int ce = 0;
#pragma unroll
            for (int w = 0; w < W; w++) ce += __popcll(mask[e * W + w]);
            return ce;
        },
        E, CU_MOE_TILE, wsum, off, p);
    __syncthreads();
    for (int i = tid; i < n; i += PLAN_THREADS) {
        const int t = i / K, j = i % K;
        plan_place(re + t * K, K, t, j, t, mask + (int64_t)re[i] * W, off[re[i]], rw[i], p);
    }
}

template <int W>
__global__ void __launch_bounds__(PLAN_THREADS) k_moe_plan_fast(const int32_t *route_e, const float *route_w, int T, int K, int E,
                                                                cu_moe_plan p) {
    dev_grid_wait();
    extern __shared__ unsigned long long plan_fast_smem[];
    const plan_smem sm = plan_smem_of<W>(plan_fast_smem, T, K, E);
    const int tid = threadIdx.x, n = T * K;
    for (int i = tid; i < E * W; i += PLAN_THREADS) sm.mask[i] = 0ull;
    for (int i = tid; i < n; i += PLAN_THREADS) {
        sm.re[i] = route_e[i];
        sm.rw[i] = route_w[i];
    }
    __syncthreads();
    plan_fast_block<W>(sm, T, K, E, p);
}

/* The routing and the plan of a step of T <= PLAN_THREADS / 32 tokens in one launch (cu_route_plan): warp t routes
 * token t as k_route_fast does (the same function: route_e / route_w rows, and a copy in shared memory), then the
 * block builds the plan from that copy as k_moe_plan_fast does from its own (the same function). So every output
 * is the two launches' bytes; what goes is one kernel boundary and the plan's reload of the routing. */
template <int R>
__global__ void __launch_bounds__(PLAN_THREADS) k_route_plan(float *logits, const float *bias, const int32_t *tid2eid, const int32_t *tok,
                                                             int T, int E, int K, float route_scale, int32_t *route_e, float *route_w,
                                                             cu_moe_plan p) {
    dev_grid_wait();
    extern __shared__ unsigned long long plan_fast_smem[];
    const plan_smem sm = plan_smem_of<1>(plan_fast_smem, T, K, E);
    const int tid = threadIdx.x, t = tid >> 5;
    for (int i = tid; i < E; i += PLAN_THREADS) sm.mask[i] = 0ull;
    if (t < T) route_fast_warp<R>(logits, bias, tid2eid, tok, t, tid & 31, E, K, route_scale, route_e, route_w, sm.re, sm.rw);
    __syncthreads();
    plan_fast_block<1>(sm, T, K, E, p);
}

/* The plan of a step of more than PLAN_FAST_MAXT tokens (a prefill chunk), one block as the kernels above, in passes
 * over the tokens instead of one thread an expert walking all of them twice (run 147: k_moe_plan took 15.6 ms a layer
 * of an 8K prefill on an H100, a fifth of the step). Every output is an integer or a copied weight fixed by the
 * routing, so this order of work gives the bytes of the others:
 *   - counts: each first entry (t, j) naming e adds 1 to cnt[e] (atomicAdd in shared memory: integers, any order);
 *   - the exclusive prefix sums of the counts and of the tiles (p.tile pairs each) over the experts, by the block
 *     scan of plan_offsets: off[e] (kept as base[e]), n_tiles and each expert's tiles;
 *   - the tokens in chunks of 64 PLAN_BIG_W: the chunk's first entries set bit (t - c0) of mask[e]; entry (t, j)
 *     takes pair base[e] + (bits of mask[e] below its own), its token, weight and token_pairs slot (plan_place,
 *     as the fast kernel); then base[e] += the chunk's bits of e. So pairs run by expert, then token. */
#define PLAN_BIG_THREADS 512
#define PLAN_BIG_W 8   /* 64-bit words of a chunk's mask an expert: chunks of 512 tokens */
static size_t plan_big_smem_bytes(int E) { return (sizeof(unsigned long long) * PLAN_BIG_W + 2 * sizeof(int)) * (size_t)E; }

__global__ void __launch_bounds__(PLAN_BIG_THREADS) k_moe_plan_big(const int32_t *route_e, const float *route_w, int T, int K, int E,
                                                                   cu_moe_plan p) {
    dev_grid_wait();
    extern __shared__ unsigned long long plan_fast_smem[];
    __shared__ int wsum[2][PLAN_BIG_THREADS / 32];
    unsigned long long *mask = plan_fast_smem;                  /* [E][PLAN_BIG_W] */
    int *cnt = (int *)(mask + (size_t)E * PLAN_BIG_W), *base = cnt + E;   /* [E] each */
    const int tid = threadIdx.x, n = T * K;
    for (int e = tid; e < E; e += PLAN_BIG_THREADS) cnt[e] = 0;
    __syncthreads();
    for (int i = tid; i < n; i += PLAN_BIG_THREADS)
        if (first_slot(route_e + (int64_t)(i / K) * K, i % K)) atomicAdd(&cnt[route_e[i]], 1);
    __syncthreads();
    plan_offsets<PLAN_BIG_THREADS>([&](int e) { return cnt[e]; }, E, p.tile, wsum, base, p);
    for (int c0 = 0; c0 < T; c0 += 64 * PLAN_BIG_W) {
        const int i1 = min(T, c0 + 64 * PLAN_BIG_W) * K;
        for (int i = tid; i < E * PLAN_BIG_W; i += PLAN_BIG_THREADS) mask[i] = 0ull;
        __syncthreads();   /* the masks zeroed (and, before the first chunk, base[] written) */
        for (int i = c0 * K + tid; i < i1; i += PLAN_BIG_THREADS) {
            const int u = i / K - c0;
            if (first_slot(route_e + (int64_t)(i / K) * K, i % K)) atomicOr(&mask[(int64_t)route_e[i] * PLAN_BIG_W + (u >> 6)], 1ull << (u & 63));
        }
        __syncthreads();
        for (int i = c0 * K + tid; i < i1; i += PLAN_BIG_THREADS) {
            const int t = i / K;
            plan_place(route_e + (int64_t)t * K, K, t, i % K, t - c0, mask + (int64_t)route_e[i] * PLAN_BIG_W, base[route_e[i]], route_w[i], p);
        }
        __syncthreads();   /* every rank read base[] and the masks */
        for (int e = tid; e < E; e += PLAN_BIG_THREADS) {
            int b = 0;
            for (int w = 0; w < PLAN_BIG_W; w++) b += __popcll(mask[e * PLAN_BIG_W + w]);
            base[e] += b;
        }
        __syncthreads();   /* base[] advanced before the masks are zeroed again */
    }
}

extern "C" void cu_moe_plan_build(cu_stream st, const int32_t *route_e, const float *route_w, int T, int K, int E, cu_moe_plan *p) {
    if (T <= 0) return;
    if (p->tile <= 0) p->tile = CU_MOE_TILE;
    if (DSV4_MOE_FAST && T <= PLAN_FAST_MAXT && p->tile == CU_MOE_TILE) {   /* the fast plan cuts CU_MOE_TILE tiles */
        const int W = T <= 64 ? 1 : 4;
        const size_t smem = plan_smem_bytes(T, K, E, W);
        if (smem <= 46 * 1024) {   /* with the static wsum, under the 48 KB a launch may take without opting in */
            if (W == 1)
                k_moe_plan_fast<1><<<1, PLAN_THREADS, smem, (cudaStream_t)st>>>(route_e, route_w, T, K, E, *p);
            else
                k_moe_plan_fast<4><<<1, PLAN_THREADS, smem, (cudaStream_t)st>>>(route_e, route_w, T, K, E, *p);
            return;
        }
    }
    if (DSV4_MOE_FAST && plan_big_smem_bytes(E) <= 46 * 1024) {   /* with the static wsum, under the 48 KB without opting in */
        k_moe_plan_big<<<1, PLAN_BIG_THREADS, plan_big_smem_bytes(E), (cudaStream_t)st>>>(route_e, route_w, T, K, E, *p);
        return;
    }
    k_moe_plan<<<1, PLAN_THREADS, sizeof(int) * 3 * (size_t)E, (cudaStream_t)st>>>(route_e, route_w, T, K, E, *p);
}

/* One thread a tile (cu_kernels.h cu_moe_split_tiles): the tile's pairs in order until one goes over the bus. */
__global__ void k_moe_split_tiles(cu_moe_plan p, const int32_t *route_e, int K, int E, const uint8_t *owner, int pct) {
    dev_grid_wait();
    const int ti = blockIdx.x * blockDim.x + threadIdx.x;
    if (ti >= *p.n_tiles) return;
    const int e = p.tile_expert[ti];
    if (owner[e] != EXPERT_ON_SPLIT) return;
    for (int q = p.tile_first[ti], q1 = q + p.tile_count[ti]; q < q1; q++)
        if (expert_split_on_bus(owner, route_e + (int64_t)p.pair_token[q] * K, K, e, pct)) return;
    p.tile_expert[ti] = E;
}

extern "C" void cu_moe_split_tiles(cu_stream st, cu_moe_plan *p, const int32_t *route_e, int K, int E, const uint8_t *owner, int pct,
                                   int max_tiles) {
    if (max_tiles > 0) k_moe_split_tiles<<<cu_blocks(max_tiles, 128), 128, 0, (cudaStream_t)st>>>(*p, route_e, K, E, owner, pct);
}

#ifndef DSV4_MOE_FUSED
#define DSV4_MOE_FUSED 1   /* 0: cu_route_plan always routes alone (the A/B of its one launch) */
#endif
extern "C" int cu_route_plan(cu_stream st, float *logits, const float *bias, const int32_t *tid2eid, const int32_t *tok, int T, int E,
                             int K, float route_scale, int32_t *route_e, float *route_w, cu_moe_plan *p) {
    if (T <= 0) return 0;
    if (p->tile <= 0) p->tile = CU_MOE_TILE;
    const size_t smem = plan_smem_bytes(T, K, E, 1);
    if (!(DSV4_MOE_FAST && DSV4_MOE_FUSED && T <= PLAN_THREADS / 32 && K <= ROUTE_MAX_K && E <= 32 * 16 && p->tile == CU_MOE_TILE &&
          smem <= 46 * 1024)) {
        cu_route(st, logits, bias, tid2eid, tok, T, E, K, route_scale, route_e, route_w);
        return 0;
    }
    if (E <= 32 * 8)
        k_route_plan<8><<<1, PLAN_THREADS, smem, (cudaStream_t)st>>>(logits, bias, tid2eid, tok, T, E, K, route_scale, route_e, route_w, *p);
    else
        k_route_plan<16><<<1, PLAN_THREADS, smem, (cudaStream_t)st>>>(logits, bias, tid2eid, tok, T, E, K, route_scale, route_e, route_w, *p);
    return 1;
}

__device__ __forceinline__ float dev_silu(float x) { return x / (1.0f + expf(-x)); }

/* moe.c expert(): bf16 of both projections (OFFICIAL), clamp, silu(g) v, times the routing weight wt (or not), bf16. */
__device__ __forceinline__ float dev_swiglu(int official, float g, float v, const float *wt, float limit) {
    float gi = dev_bf16_if(official, g), vi = dev_bf16_if(official, v);
    if (limit > 0.0f) {
        gi = fminf(gi, limit);
        vi = fminf(fmaxf(vi, -limit), limit);
    }
    float h = dev_silu(gi) * vi;
    if (wt) h *= *wt;
    return dev_bf16_if(official, h);
}

__global__ void k_swiglu(int official, float *g, const float *v, const float *w, int rows, int I, float limit) {
    dev_grid_wait();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)rows * I) return;
    g[idx] = dev_swiglu(official, g[idx], v[idx], w ? w + idx / I : NULL, limit);
}

/* One warp per (row, 128-column block), lane l on columns 4l .. 4l+3 (cu_kernels.h cu_swiglu_pack). */
__global__ void k_swiglu_pack(int official, float *g, const float *v, const float *w, int rows, int I, float limit, uint8_t *q,
                              int ldq, float *qs, int lds) {
    dev_grid_wait();
    const int nblk = (I + 127) / 128, lane = threadIdx.x & 31;
    const int64_t job = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (job >= (int64_t)rows * nblk) return;   /* whole warps */
    const int r = (int)(job / nblk), b = (int)(job % nblk), len = min(128, I - 128 * b);
    float *gr = g + (int64_t)r * I + 128 * b;
    const float *vr = v + (int64_t)r * I + 128 * b;
    float h[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int c = 4 * lane + i;
        h[i] = c < len ? dev_swiglu(official, gr[c], vr[c], w ? w + r : NULL, limit) : 0.0f;
        if (c < len) gr[c] = h[i];
    }
    warp_pack_block(h, len, q + (int64_t)r * ldq + 128 * b, qs + (int64_t)r * lds + b);
}

extern "C" void cu_swiglu_pack(cu_stream st, int official, float *g, const float *v, const float *w, int rows, int I, float limit,
                               uint8_t *q, int ldq, float *qs, int lds) {
    const int64_t jobs = (int64_t)rows * ((I + 127) / 128);
    if (jobs > 0) k_swiglu_pack<<<cu_blocks(jobs, 8), 256, 0, (cudaStream_t)st>>>(official, g, v, w, rows, I, limit, q, ldq, qs, lds);
}

extern "C" void cu_swiglu(cu_stream st, int official, float *g, const float *v, const float *w, int rows, int I, float limit) {
    const int64_t n = (int64_t)rows * I;
    if (n > 0) k_swiglu<<<cu_blocks(n, 256), 256, 0, (cudaStream_t)st>>>(official, g, v, w, rows, I, limit);
}


