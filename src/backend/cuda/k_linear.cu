/* Linear layers on weights in their checkpoint formats (F32, BF16, FP8 + 128x128 UE8M0 scales, FP4 + per-32
 * scales), decoded in the main loop; no dequantized copy exists.
 *
 * Reduction order of y[t][o] (the same for every t, every T, every tile): lane l of the warp that owns row o
 * accumulates, with fmaf starting from 0.0f, columns 16l + 512j + e for j = 0, 1, ... and e = 0..15 in that
 * order; the 32 partials are then combined by warp_sum (rows of split_rows shapes: see k_linear_split). Sixteen
 * consecutive columns per lane make one 16-byte load of FP8 weight (FP4: 8 bytes, BF16: 32) per lane and step,
 * so a warp keeps 512 bytes of a row in flight (run 13: at 4 columns per lane the projections ran at ~200 GB/s).
 * A warp computes its row for up to TILE tokens at once so the weight row is read once per tile; the tile only
 * decides which warp does the work, never the order.
 * (CUDA cores in fp32 for both numeric modes for now: issue 18 moves OFFICIAL mode to FP8 tensor cores.) */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_kernels.h"
#include "model/expert_place.h"

#define LIN_WARPS 4    /* output rows per block */
#define LIN_TILE 8     /* tokens per warp */
#define LIN_LANE 16    /* consecutive columns per lane and step */
#define LIN_STEP 512   /* columns per warp and step: 32 lanes x LIN_LANE */

/* One step of dot_tile: the lane's LIN_LANE weights wv at column i against the tokens' rows, in column order. */
template <bool VEC>
__device__ __forceinline__ void dot_step(const float *wv, const float *const *xr, int n, float *acc, int i, int K) {
#pragma unroll
    for (int k = 0; k < LIN_TILE; k++) {
        if (k >= n) break;
        if (VEC) {
            const float4 *xp = (const float4 *)(xr[k] + i);
#pragma unroll
            for (int q = 0; q < LIN_LANE / 4; q++) {
                const float4 xv = xp[q];
                acc[k] = fmaf(wv[4 * q], xv.x, acc[k]);
                acc[k] = fmaf(wv[4 * q + 1], xv.y, acc[k]);
                acc[k] = fmaf(wv[4 * q + 2], xv.z, acc[k]);
                acc[k] = fmaf(wv[4 * q + 3], xv.w, acc[k]);
            }
        } else {
            for (int e = 0; e < LIN_LANE && i + e < K; e++) acc[k] = fmaf(wv[e], xr[k][i + e], acc[k]);
        }
    }
}

/* Columns [c0, K) of row o of w against up to LIN_TILE input rows xr[0..n): res[k] (valid in every lane). c0 is
 * a multiple of 16; K is the column count or, for a split row, the end of the warp's segment. The scalar path
 * (VEC false: unaligned rows, a column count not a multiple of 16) visits the same columns in the same order. U > 1
 * (vector rows only): the weights of U steps are loaded before the first of them is used, so U loads are in flight
 * per lane instead of one (a split row's warp has a few steps only, each a memory latency); the sums are the same. */
template <bool VEC, int U = 1>
__device__ __forceinline__ void dot_tile(const dsv4_weight &w, int o, const float *const *xr, int n, float *res, int c0, int K) {
    const int lane = threadIdx.x & 31;
    float acc[LIN_TILE];
#pragma unroll
    for (int k = 0; k < LIN_TILE; k++) acc[k] = 0.0f;
    int i = c0 + lane * LIN_LANE;
    if (VEC && U > 1)
        for (; i + (U - 1) * LIN_STEP < K; i += U * LIN_STEP) {
            float wv[U][LIN_LANE];
#pragma unroll
            for (int u = 0; u < U; u++) dev_weight16(w, o, i + u * LIN_STEP, wv[u]);
#pragma unroll
            for (int u = 0; u < U; u++) dot_step<VEC>(wv[u], xr, n, acc, i + u * LIN_STEP, K);
        }
    for (; i < K; i += LIN_STEP) {
        float wv[LIN_LANE];
        if (VEC) {
            dev_weight16(w, o, i, wv);
        } else {
#pragma unroll
            for (int e = 0; e < LIN_LANE; e++) wv[e] = i + e < K ? dev_weight_at(w, o, i + e) : 0.0f;
        }
        dot_step<VEC>(wv, xr, n, acc, i, K);
    }
#pragma unroll
    for (int k = 0; k < LIN_TILE; k++) res[k] = warp_sum(acc[k]);
}

/* One token, FP8 and FP4 rows (the decode step's weights): dot_tile's order exactly (lane l: columns 16l + 512j + e
 * in increasing j then e, fmaf from 0.0f, then warp_sum), with the raw loads of LIN_AHEAD steps issued before the
 * first of them is used, so that a warp keeps up to LIN_AHEAD x 512 bytes of FP8 in flight instead of 512. Run
 * 18's ncu: at one token k_linear read 430 GB/s at 19 % achieved occupancy (80 registers for the 8-token tile);
 * this path needs no tile registers. Same bits as a tile of one token (test_gpu_kernels: alone = in a batch).
 * Tried and removed (runs 25-26): resident warps looping over rows with 8 loads in flight and x staged in shared
 * memory were 3-5 % slower at decode, and their tile form lost a third of prefill speed. In OFFICIAL mode the
 * FP8/FP4 linears of act-quantized rows run on tensor cores instead (k_mma.cu), 2x this kernel at one token. */
#define LIN_AHEAD 4
#ifndef LIN_ONE_TOKEN
#define LIN_ONE_TOKEN 1
#endif
__device__ __forceinline__ float dot_row1(const dsv4_weight &w, int o, const float *__restrict__ x, int K) {
    const int lane = threadIdx.x & 31;
    float acc = 0.0f;
    for (int i0 = lane * LIN_LANE; i0 < K; i0 += LIN_AHEAD * LIN_STEP) {
        w16raw raw[LIN_AHEAD];
#pragma unroll
        for (int u = 0; u < LIN_AHEAD; u++)
            if (i0 + u * LIN_STEP < K) raw[u] = dev_weight16_load(w, o, i0 + u * LIN_STEP);
#pragma unroll
        for (int u = 0; u < LIN_AHEAD; u++) {
            const int i = i0 + u * LIN_STEP;
            if (i >= K) break;
            float wv[LIN_LANE];
            dev_weight16_decode(w.fmt, raw[u], wv);
            const float4 *xp = (const float4 *)(x + i);
#pragma unroll
            for (int q = 0; q < LIN_LANE / 4; q++) {
                const float4 xv = xp[q];
                acc = fmaf(wv[4 * q], xv.x, acc);
                acc = fmaf(wv[4 * q + 1], xv.y, acc);
                acc = fmaf(wv[4 * q + 2], xv.z, acc);
                acc = fmaf(wv[4 * q + 3], xv.w, acc);
            }
        }
    }
    return warp_sum(acc);
}

__global__ void __launch_bounds__(32 * LIN_WARPS, 8) k_linear_1tok(dsv4_weight w, const float *__restrict__ x, int group_rows,
                                                                     int group_x, float *__restrict__ y) {
    dev_grid_wait();
    const int o = blockIdx.x * LIN_WARPS + (threadIdx.x >> 5);
    if (o >= w.rows) return;
    const float r = dot_row1(w, o, x + (int64_t)(o / group_rows) * group_x, w.cols);
    if ((threadIdx.x & 31) == 0) y[o] = r;
}

template <bool VEC>
__global__ void k_linear(dsv4_weight w, const float *__restrict__ x, int T, int ldx, int group_rows, int group_x,
                         float *__restrict__ y, int ldy) {
    dev_grid_wait();
    const int o = blockIdx.x * LIN_WARPS + (threadIdx.x >> 5), t0 = blockIdx.y * LIN_TILE;
    if (o >= w.rows) return;
    x += (int64_t)(o / group_rows) * group_x;
    const int n = T - t0 < LIN_TILE ? T - t0 : LIN_TILE;
    const float *xr[LIN_TILE];
#pragma unroll
    for (int k = 0; k < LIN_TILE; k++) xr[k] = x + (int64_t)(t0 + (k < n ? k : 0)) * ldx;
    float res[LIN_TILE];
    dot_tile<VEC>(w, o, xr, n, res, 0, w.cols);
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int k = 0; k < LIN_TILE; k++)
            if (k < n) y[(int64_t)(t0 + k) * ldy + o] = res[k];
}

/* Few and long rows (the mHC mixes: 24 rows of hc * dim columns; the indexer's head weights): one block of
 * LIN_SPLIT warps per row, warp s taking the columns [s*seg, (s+1)*seg) (seg = cols / LIN_SPLIT rounded up to 128)
 * with the lane pattern above, then the LIN_SPLIT partials added in order s = 0, 1, ... The split is chosen by the
 * weight's shape alone (split_rows), so every token still gets the same order whatever T. */
#ifndef LIN_SPLIT
#define LIN_SPLIT 8
#endif
#define LIN_SPLIT_AHEAD 4   /* steps of weight loads in flight (the mixes: 2048 columns a warp = 4 steps; run 38's
                               ncu: 6.0 us a launch at 265 GB/s with one in flight) */
static bool split_rows(int rows, int cols) { return rows < 128 && cols >= 2048; }

/* Warp s's columns [c0, c1) of a split row: segments of cols / LIN_SPLIT rounded up to 128, the last ones clipped
 * (both split kernels take them from here, so their chains cover the same columns). */
__device__ __forceinline__ void split_segment(int cols, int s, int &c0, int &c1) {
    const int seg = ((cols + LIN_SPLIT - 1) / LIN_SPLIT + 127) / 128 * 128;
    c0 = s * seg < cols ? s * seg : cols;
    c1 = c0 + seg < cols ? c0 + seg : cols;
}

template <bool VEC>
__global__ void k_linear_split(dsv4_weight w, const float *__restrict__ x, int T, int ldx, float *__restrict__ y, int ldy) {
    dev_grid_wait();
    __shared__ float part[LIN_SPLIT][LIN_TILE];
    const int o = blockIdx.x, s = threadIdx.x >> 5, t0 = blockIdx.y * LIN_TILE;
    const int n = T - t0 < LIN_TILE ? T - t0 : LIN_TILE;
    int c0, c1;
    split_segment(w.cols, s, c0, c1);
    const float *xr[LIN_TILE];
#pragma unroll
    for (int k = 0; k < LIN_TILE; k++) xr[k] = x + (int64_t)(t0 + (k < n ? k : 0)) * ldx;
    float res[LIN_TILE];
    dot_tile<VEC, LIN_SPLIT_AHEAD>(w, o, xr, n, res, c0, c1);
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int k = 0; k < LIN_TILE; k++) part[s][k] = res[k];
    __syncthreads();
    if (threadIdx.x < n) {
        float sum = 0.0f;
        for (int q = 0; q < LIN_SPLIT; q++) sum += part[q][threadIdx.x];
        y[(int64_t)(t0 + threadIdx.x) * ldy + o] = sum;
    }
}

/* The split rows for many tokens (the mHC mixes of a prefill step: 24 rows x 16,384 fp32 columns, T in the thousands).
 * k_linear_split reads a tile's 8 token rows (512 KB) once for each of the 24 output rows, so a mix of 8K tokens
 * moves ~13 GB through L2, most of the mHC stage of a prefill step. Here a block takes SPT_ROWS rows x SPT_TOKENS
 * tokens with the same warps, segments and lanes: lane l of warp s keeps SPT_ROWS x SPT_TOKENS chains, each exactly
 * the chain k_linear_split gives that (row, token) — columns c0(s) + 16 l + 512 j + e in increasing j then e, fmaf
 * from 0.0f (a quad of 4 columns at a time, the quads in order, so each chain still sees its columns in order), then
 * warp_sum, then the LIN_SPLIT partials added from 0.0f in order s = 0, 1, ... So every output has k_linear_split's
 * bits whatever T (test_gpu_kernels: the two kernels by memcmp). Fp32 weights of the vector path only. */
#define SPT_ROWS 8
#define SPT_TOKENS 8
#ifndef SPT_MIN_T   /* fewer tokens take k_linear_split, whose blocks (one a row) fill more of the GPU: on an H100
                      (run 170) 64 streams ran 1.3 % slower on the tile kernel (24 blocks for a mix), 256 streams 3 %
                      faster; which kernel never changes a bit */
#define SPT_MIN_T 256
#endif
#ifndef LIN_SPLIT_TILE
#define LIN_SPLIT_TILE 1   /* 0: a measuring build with k_linear_split only */
#endif
__global__ void __launch_bounds__(32 * LIN_SPLIT) k_linear_split_tile(dsv4_weight w, const float *__restrict__ x, int T, int ldx,
                                                                      float *__restrict__ y, int ldy) {
    dev_grid_wait();
    __shared__ float part[LIN_SPLIT][SPT_ROWS][SPT_TOKENS];
    const int o0 = blockIdx.x * SPT_ROWS, t0 = blockIdx.y * SPT_TOKENS, s = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = T - t0 < SPT_TOKENS ? T - t0 : SPT_TOKENS, nr = w.rows - o0 < SPT_ROWS ? w.rows - o0 : SPT_ROWS;
    int c0, c1;
    split_segment(w.cols, s, c0, c1);
    const float *xr[SPT_TOKENS], *wr[SPT_ROWS];
#pragma unroll
    for (int k = 0; k < SPT_TOKENS; k++) xr[k] = x + (int64_t)(t0 + (k < n ? k : 0)) * ldx;   /* past n: computed, dropped */
#pragma unroll
    for (int r = 0; r < SPT_ROWS; r++) wr[r] = (const float *)w.data + (int64_t)(o0 + (r < nr ? r : 0)) * w.cols;
    float acc[SPT_ROWS][SPT_TOKENS];
#pragma unroll
    for (int r = 0; r < SPT_ROWS; r++)
#pragma unroll
        for (int k = 0; k < SPT_TOKENS; k++) acc[r][k] = 0.0f;
    for (int i = c0 + lane * LIN_LANE; i < c1; i += LIN_STEP) {
#pragma unroll 1
        for (int q = 0; q < LIN_LANE / 4; q++) {
            float4 xv[SPT_TOKENS];
#pragma unroll
            for (int k = 0; k < SPT_TOKENS; k++) xv[k] = *(const float4 *)(xr[k] + i + 4 * q);
#pragma unroll
            for (int r = 0; r < SPT_ROWS; r++) {
                const float4 wv = *(const float4 *)(wr[r] + i + 4 * q);
#pragma unroll
                for (int k = 0; k < SPT_TOKENS; k++) {
                    acc[r][k] = fmaf(wv.x, xv[k].x, acc[r][k]);
                    acc[r][k] = fmaf(wv.y, xv[k].y, acc[r][k]);
                    acc[r][k] = fmaf(wv.z, xv[k].z, acc[r][k]);
                    acc[r][k] = fmaf(wv.w, xv[k].w, acc[r][k]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < SPT_ROWS; r++)
#pragma unroll
        for (int k = 0; k < SPT_TOKENS; k++) {
            const float v = warp_sum(acc[r][k]);
            if (lane == 0) part[s][r][k] = v;
        }
    __syncthreads();
    for (int e = threadIdx.x; e < SPT_ROWS * SPT_TOKENS; e += blockDim.x) {
        const int r = e / SPT_TOKENS, k = e % SPT_TOKENS;
        if (r < nr && k < n) {
            float sum = 0.0f;
            for (int q = 0; q < LIN_SPLIT; q++) sum += part[q][r][k];
            y[(int64_t)(t0 + k) * ldy + o0 + r] = sum;
        }
    }
}

template <bool VEC>
__global__ void k_expert_linear(const dsv4_weight *__restrict__ experts, int rows, cu_moe_plan plan, const float *__restrict__ x,
                                int ldx, int x_by_pair, float *__restrict__ y, int ldy) {
    dev_grid_wait();
    const int tile = blockIdx.y;
    if (tile >= *plan.n_tiles) return;
    const int o = blockIdx.x * LIN_WARPS + (threadIdx.x >> 5);
    if (o >= rows) return;
    const dsv4_weight w = experts[plan.tile_expert[tile]];
    const int p0 = plan.tile_first[tile], n = plan.tile_count[tile];
    if (!w.data) {
        /* an expert another GPU holds (cuda_ep.h): its rows are the identity of the exact gather */
        if ((threadIdx.x & 31) == 0)
            for (int k = 0; k < n; k++) y[(int64_t)(p0 + k) * ldy + o] = EP_ABSENT_ROW;
        return;
    }
    const float *xr[LIN_TILE];
#pragma unroll
    for (int k = 0; k < LIN_TILE; k++) {
        const int p = p0 + (k < n ? k : 0);
        xr[k] = x + (int64_t)(x_by_pair ? p : plan.pair_token[p]) * ldx;
    }
    float res[LIN_TILE];
    dot_tile<VEC>(w, o, xr, n, res, 0, w.cols);
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int k = 0; k < LIN_TILE; k++)
            if (k < n) y[(int64_t)(p0 + k) * ldy + o] = res[k];
}

/* Steps of one token (then every tile holds one pair): dot_row1, as k_linear_1tok. */
__global__ void __launch_bounds__(32 * LIN_WARPS, 8) k_expert_linear_1tok(const dsv4_weight *__restrict__ experts, int rows, cu_moe_plan plan, const float *__restrict__ x,
                                     int ldx, int x_by_pair, float *__restrict__ y, int ldy) {
    dev_grid_wait();
    const int tile = blockIdx.y;
    if (tile >= *plan.n_tiles) return;
    const int o = blockIdx.x * LIN_WARPS + (threadIdx.x >> 5);
    if (o >= rows) return;
    const dsv4_weight w = experts[plan.tile_expert[tile]];
    const int p = plan.tile_first[tile];
    /* an expert another GPU holds (cuda_ep.h) or the host computes: its rows are the exact gather's identity */
    const float r = w.data ? dot_row1(w, o, x + (int64_t)(x_by_pair ? p : plan.pair_token[p]) * ldx, w.cols) : EP_ABSENT_ROW;
    if ((threadIdx.x & 31) == 0) y[(int64_t)p * ldy + o] = r;
}

/* The vector path needs 16-byte aligned x rows and weight rows of a multiple of 16 columns (weights are whole
 * cudaMalloc allocations or row slices of them, so their rows are then 16-byte aligned); it computes the same sums
 * as the scalar one. */
static bool vec_ok(int fmt, int cols, const float *x, int ldx) {
    (void)fmt;
    return cols % LIN_LANE == 0 && ldx % 4 == 0 && ((uintptr_t)x % 16) == 0;
}

/* y = x w^T; with groups > 1, rows [g * rows / groups, (g + 1) * rows / groups) of w read the input columns
 * starting at g * group_x (the grouped output projection): one launch for all groups. Each row's sum is the same
 * as a launch of its group alone would give (the group only moves the row's input pointer). */
static int linear_launch(cu_stream st, const dsv4_weight *w, const float *x, int T, int ldx, int groups, int group_x, float *y, int ldy) {
    const bool vec = vec_ok(w->fmt, w->cols, x, ldx) && vec_ok(w->fmt, w->cols, x + group_x, ldx) && ((uintptr_t)w->data % 16) == 0;
    const int group_rows = w->rows / groups;
    if (T == 1 && vec && LIN_ONE_TOKEN && (w->fmt == WF_FP8 || w->fmt == WF_FP4)) {
        k_linear_1tok<<<cu_blocks(w->rows, LIN_WARPS), 32 * LIN_WARPS, 0, (cudaStream_t)st>>>(*w, x, group_rows, group_x, y);
        return 0;
    }
    dim3 grid(cu_blocks(w->rows, LIN_WARPS), cu_blocks(T, LIN_TILE));
    if (vec) k_linear<true><<<grid, 32 * LIN_WARPS, 0, (cudaStream_t)st>>>(*w, x, T, ldx, group_rows, group_x, y, ldy);
    else k_linear<false><<<grid, 32 * LIN_WARPS, 0, (cudaStream_t)st>>>(*w, x, T, ldx, group_rows, group_x, y, ldy);
    return 0;
}

extern "C" int cu_linear(cu_stream st, const dsv4_weight *w, const float *x, int T, int ldx, float *y, int ldy) {
    if (T <= 0 || w->rows <= 0) return 0;
    if (split_rows(w->rows, w->cols)) {
        const bool vec = vec_ok(w->fmt, w->cols, x, ldx) && ((uintptr_t)w->data % 16) == 0;
        if (vec && w->fmt == WF_F32 && T >= SPT_MIN_T && LIN_SPLIT_TILE) {
            k_linear_split_tile<<<dim3(cu_blocks(w->rows, SPT_ROWS), cu_blocks(T, SPT_TOKENS)), 32 * LIN_SPLIT, 0, (cudaStream_t)st>>>(
                *w, x, T, ldx, y, ldy);
            return 0;
        }
        dim3 g(w->rows, cu_blocks(T, LIN_TILE));
        if (vec) k_linear_split<true><<<g, 32 * LIN_SPLIT, 0, (cudaStream_t)st>>>(*w, x, T, ldx, y, ldy);
        else k_linear_split<false><<<g, 32 * LIN_SPLIT, 0, (cudaStream_t)st>>>(*w, x, T, ldx, y, ldy);
        return 0;
    }
    return linear_launch(st, w, x, T, ldx, 1, 0, y, ldy);
}

extern "C" int cu_linear_grouped(cu_stream st, const dsv4_weight *w, int groups, const float *x, int T, int ldx, int group_x,
                                 float *y, int ldy) {
    if (T <= 0 || w->rows <= 0) return 0;
    const int rows = w->rows / groups;
    if (groups == 1 || split_rows(rows, w->cols)) {   /* a group alone would take the split kernel: launch each */
        for (int g = 0; g < groups; g++) {
            dsv4_weight wg = weight_rows(w, g * rows, rows);
            cu_linear(st, &wg, x + (int64_t)g * group_x, T, ldx, y + (int64_t)g * rows, ldy);
        }
        return 0;
    }
    return linear_launch(st, w, x, T, ldx, groups, group_x, y, ldy);
}

extern "C" int cu_expert_linear(cu_stream st, const dsv4_weight *experts, int rows, int cols, int fmt, const cu_moe_plan *plan,
                                int max_tiles, const float *x, int ldx, int x_by_pair, float *y, int ldy, int one_token) {
    if (max_tiles <= 0) return 0;
    if (one_token && LIN_ONE_TOKEN && vec_ok(fmt, cols, x, ldx) && (fmt == WF_FP8 || fmt == WF_FP4)) {
        dim3 g1(cu_blocks(rows, LIN_WARPS), max_tiles);
        k_expert_linear_1tok<<<g1, 32 * LIN_WARPS, 0, (cudaStream_t)st>>>(experts, rows, *plan, x, ldx, x_by_pair, y, ldy);
        return 0;
    }
    dim3 grid(cu_blocks(rows, LIN_WARPS), max_tiles);
    /* expert matrices are separate allocations (256-byte aligned) */
    if (vec_ok(fmt, cols, x, ldx))
        k_expert_linear<true><<<grid, 32 * LIN_WARPS, 0, (cudaStream_t)st>>>(experts, rows, *plan, x, ldx, x_by_pair, y, ldy);
    else
        k_expert_linear<false><<<grid, 32 * LIN_WARPS, 0, (cudaStream_t)st>>>(experts, rows, *plan, x, ldx, x_by_pair, y, ldy);
    return 0;
}
