/* The lightning indexer on the device (core/attention.c select_rows, spec §9): every query's scores over the
 * indexer rows it may see, then its top-k rows in row order. */
#include "backend/cuda/cu_kvrow.cuh"

/* ---- the lightning indexer -------------------------------------------------------------------------------------------- */

/* Scoring is spread over the whole GPU: block (x, y) scores rows [IDX_ROWS x, IDX_ROWS (x + 1)) of query t0 + y,
 * with the query's heads and the rows decoded to fp32 in shared memory. Run 24: with one block per query scoring
 * every row (64 chained warp reductions a row), a 4K context cost 3.4x a short one and 128K 40x.
 *
 * Order of a score (the same for every row, every query, every batch and chunking): head h's dot runs over
 * columns j = 0, 1, ..., cI-1 in that order, fmaf from 0.0f, by one thread; s = bf16(dot) (OFFICIAL); then the heads
 * h = 0..nI-1 in order: acc += bf16(s * w[h]) where s > 0; the score is bf16(acc) (core/attention.c index_score,
 * with dot_f32's order replaced by the sequential one). A thread owns a tile of 4 rows x 4 heads, rows r + 16 i
 * (i = 0..3) so a warp's row loads hit distinct banks (rows padded by IDX_PAD floats). */
#define IDX_ROWS 64          /* rows a scoring block */
#define IDX_SCORE_THREADS 256
#define IDX_PAD 4
#define IDX_SEL_THREADS 1024

static size_t index_score_smem(int nI, int cI) {
    return sizeof(float) * ((size_t)(nI + IDX_ROWS) * (cI + IDX_PAD) + (size_t)IDX_ROWS * (nI + 1));
}

__global__ void __launch_bounds__(IDX_SCORE_THREADS) k_index_score(int official, cu_kvlay il, const float *qi, const float *wi,
                                                                   const int64_t *pos, const int32_t *item_of, const cu_seq_layer *sl,
                                                                   int t0, int nI, int cI, int K, int64_t max_rows, float *scratch) {
    extern __shared__ __align__(16) float idx_smem[];
    const int t = t0 + blockIdx.y, ld = cI + IDX_PAD;
    const int64_t n = (pos[t] + 1) / 4, k0 = (int64_t)blockIdx.x * IDX_ROWS;
    if (n <= K || k0 >= n) return;   /* n <= K: every row is selected, no score needed */
    float *qs = idx_smem;                              /* [nI][ld] */
    float *rs = qs + (size_t)nI * ld;                  /* [IDX_ROWS][ld] */
    float *ds = rs + (size_t)IDX_ROWS * ld;            /* [IDX_ROWS][nI + 1]: bf16(dot) per row and head */
    const float *qt = qi + (int64_t)t * nI * cI;
    for (int i = threadIdx.x; i < nI * cI / 4; i += blockDim.x) {
        const int h = i / (cI / 4), j = 4 * (i % (cI / 4));
        *(float4 *)(qs + h * ld + j) = *(const float4 *)(qt + (int64_t)h * cI + j);
    }
    const uint8_t *rows = sl[item_of[t]].irows;
    for (int i = threadIdx.x; i < IDX_ROWS * cI; i += blockDim.x) {
        const int r = i / cI, j = i % cI;
        rs[r * ld + j] = k0 + r < n ? kv_elem(il, rows + (k0 + r) * il.bytes, j) : 0.0f;
    }
    __syncthreads();
    const int n_hg = (nI + 3) / 4;
    for (int mt = threadIdx.x; mt < (IDX_ROWS / 4) * n_hg; mt += blockDim.x) {
        const int r0 = mt % (IDX_ROWS / 4), h0 = 4 * (mt / (IDX_ROWS / 4));
        float acc[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++) acc[a][b] = 0.0f;
        const float *qh[4];
#pragma unroll
        for (int b = 0; b < 4; b++) qh[b] = qs + (h0 + b < nI ? h0 + b : 0) * ld;
        for (int j = 0; j < cI; j += 4) {
            float4 q4[4], r4[4];
#pragma unroll
            for (int b = 0; b < 4; b++) q4[b] = *(const float4 *)(qh[b] + j);
#pragma unroll
            for (int a = 0; a < 4; a++) r4[a] = *(const float4 *)(rs + (r0 + 16 * a) * ld + j);
            fma_tile4x4(acc, q4, r4);
        }
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int b = 0; b < 4; b++)
                if (h0 + b < nI) ds[(r0 + 16 * a) * (nI + 1) + h0 + b] = dev_bf16_if(official, acc[a][b]);
    }
    __syncthreads();
    const float *wt = wi + (int64_t)t * nI;
    for (int r = threadIdx.x; r < IDX_ROWS; r += blockDim.x) {
        if (k0 + r >= n) break;
        float acc = 0.0f;
        for (int h = 0; h < nI; h++) {
            const float sh = ds[r * (nI + 1) + h];
            if (sh > 0.0f) acc += dev_bf16_if(official, sh * wt[h]);
        }
        scratch[(int64_t)blockIdx.y * max_rows + k0 + r] = dev_bf16_if(official, acc);
    }
}

/* A total order on (score, row): higher score first, then lower row; as an unsigned key, larger is better. */
__device__ __forceinline__ unsigned long long rank_key(float s, int64_t k) {
    uint32_t u = __float_as_uint(s == 0.0f ? 0.0f : s);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (uint32_t)(0xffffffffu - (uint32_t)k);
}

/* Selection, one block per query: an exact radix select of the K-th largest key, a byte at a time from the top,
 * then the rows whose keys reach it compacted in row order. The histogram adds are aggregated per warp over
 * lanes with the same bin (equal scores, as in a context of zero rows, would otherwise queue on one counter). */
__global__ void __launch_bounds__(IDX_SEL_THREADS) k_index_topk(const int64_t *pos, int t0, int K, int64_t max_rows,
                                                                 const float *scratch, int32_t *sel, int32_t *n_sel) {
    __shared__ unsigned int hist[256];
    __shared__ unsigned long long prefix_s;
    __shared__ unsigned int remaining_s, warp_off[IDX_SEL_THREADS / 32 + 1];
    const int t = t0 + blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int64_t n = (pos[t] + 1) / 4;
    int32_t *out = sel + (int64_t)t * K;
    if (n <= K) {
        for (int64_t k = threadIdx.x; k < n; k += blockDim.x) out[k] = (int32_t)k;
        if (threadIdx.x == 0) n_sel[t] = (int32_t)n;
        return;
    }
    const float *sc = scratch + (int64_t)blockIdx.x * max_rows;
    if (threadIdx.x == 0) { prefix_s = 0; remaining_s = (unsigned)K; }
    unsigned long long mask = 0;
    for (int b = 7; b >= 0; b--) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        const unsigned long long prefix = prefix_s;
        for (int64_t base = 0; base < n; base += blockDim.x) {   /* whole warps: __match_any_sync below */
            const int64_t k = base + threadIdx.x;
            unsigned bin = 256u;
            if (k < n) {
                const unsigned long long key = rank_key(sc[k], k);
                if (((key ^ prefix) & mask) == 0) bin = (unsigned)(key >> (8 * b)) & 255u;
            }
            const unsigned peers = __match_any_sync(0xffffffffu, bin);
            if (bin < 256u && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned rem = remaining_s;
            for (int bk = 255; bk >= 0; bk--) {
                if (hist[bk] >= rem) { prefix_s = prefix | ((unsigned long long)bk << (8 * b)); break; }
                rem -= hist[bk];
            }
            remaining_s = rem;
        }
        mask |= 255ull << (8 * b);
        __syncthreads();
    }
    const unsigned long long thr = prefix_s;   /* keys are distinct: exactly K keys are >= thr */
    /* compaction in row order: per chunk of blockDim rows, a ballot per warp and the warps in order */
    int base_out = 0;
    for (int64_t base = 0; base < n; base += blockDim.x) {
        const int64_t k = base + threadIdx.x;
        const bool f = k < n && rank_key(sc[k], k) >= thr;
        const unsigned m = __ballot_sync(0xffffffffu, f);
        if (lane == 0) warp_off[warp] = __popc(m);
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned s = 0;
            for (int w = 0; w < nw; w++) { const unsigned c = warp_off[w]; warp_off[w] = s; s += c; }
            warp_off[nw] = s;
        }
        __syncthreads();
        if (f) out[base_out + warp_off[warp] + __popc(m & ((1u << lane) - 1u))] = (int32_t)k;
        base_out += (int)warp_off[nw];
        __syncthreads();
    }
    if (threadIdx.x == 0) n_sel[t] = K;
}

extern "C" int cu_index_select(cu_stream st, int official, cu_kvlay ilay, const float *qi, const float *wi, const int64_t *pos,
                               const int32_t *item_of, const cu_seq_layer *sl, int T, int nI, int cI, int K, int64_t n_rows,
                               int64_t max_rows, float *scratch, int32_t *sel, int32_t *n_sel) {
    const size_t smem = index_score_smem(nI, cI);
    if (smem > 48 * 1024 && cudaFuncSetAttribute(k_index_score, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return -1;
    const int64_t row_blocks = (n_rows + IDX_ROWS - 1) / IDX_ROWS;
    /* CU_INDEX_CHUNK queries per launch share the score scratch: its size does not grow with the prompt */
    for (int t0 = 0; t0 < T; t0 += CU_INDEX_CHUNK) {
        const int n = T - t0 < CU_INDEX_CHUNK ? T - t0 : CU_INDEX_CHUNK;
        if (row_blocks > 0 && n_rows > K)
            k_index_score<<<dim3((unsigned)row_blocks, n), IDX_SCORE_THREADS, smem, (cudaStream_t)st>>>(
                official, ilay, qi, wi, pos, item_of, sl, t0, nI, cI, K, max_rows, scratch);
        k_index_topk<<<n, IDX_SEL_THREADS, 0, (cudaStream_t)st>>>(pos, t0, K, max_rows, scratch, sel, n_sel);
    }
    return 0;
}
