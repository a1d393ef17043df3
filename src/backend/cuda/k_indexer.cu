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

/* ---- selection ------------------------------------------------------------------------------------------------------

 * One block per query: the K best rows by (score descending, row ascending), written in row order. In two steps:
 *   1. a radix select on the 32-bit score key alone (score_key: larger = better), a byte at a time from the top,
 *      over the candidates (rows whose key matches the bytes chosen so far): a histogram of the next byte, the
 *      bin holding the rem-th best candidate, rem = what is still to take from that bin. It stops early when the
 *      chosen bin is taken whole (its count = rem), or when every candidate of the pass had the same bits below
 *      the byte (an OR and an AND of those bits agree): then the bin's candidates all have one key. OFFICIAL scores
 *      are bf16 values (the low 16 key bits are zero), so two passes decide them.
 *   2. compaction in row order: every row whose key's decided bits exceed the prefix, and the first rem rows (in
 *      row order) whose decided bits equal it: the ties at the threshold go to the lower rows, as in select_rows.
 * The same set as the K largest (key, -row) pairs: the selection of core/attention.c select_rows, bit for bit.
 * Every sweep reads tiles of IDX_SEL_PER x 1024 scores, element j of thread x at row base + 1024 j + x (each
 * load coalesced, IDX_SEL_PER of them in flight a thread). Histogram adds are aggregated per warp over lanes
 * with the same bin (__match_any_sync: equal scores would otherwise queue on one counter); only integer counts
 * are added, so the result does not depend on the order of the atomics. */
#define IDX_SEL_PER 16
#define IDX_SEL_TILE ((int64_t)IDX_SEL_THREADS * IDX_SEL_PER)
#define FULL_MASK 0xffffffffu

/* The selection's order on scores as an unsigned key, larger = better; -0 counts as +0 (equal scores tie). */
__device__ __forceinline__ uint32_t score_key(float s) {
    const uint32_t u = __float_as_uint(s == 0.0f ? 0.0f : s);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The keys of the tile at base (element j: row base + IDX_SEL_THREADS j + threadIdx.x); bit j of the result: the row
 * exists. */
__device__ __forceinline__ unsigned load_keys(const float *sc, int64_t n, int64_t base, uint32_t (&key)[IDX_SEL_PER]) {
    unsigned valid = 0;
#pragma unroll
    for (int j = 0; j < IDX_SEL_PER; j++) {
        const int64_t k = base + (int64_t)IDX_SEL_THREADS * j + threadIdx.x;
        key[j] = k < n ? score_key(sc[k]) : 0u;
        valid |= (unsigned)(k < n) << j;
    }
    return valid;
}

__global__ void __launch_bounds__(IDX_SEL_THREADS) k_index_topk(const int64_t *pos, int t0, int K, int64_t max_rows,
                                                                 const float *scratch, int32_t *sel, int32_t *n_sel) {
    __shared__ unsigned hist[256];
    __shared__ unsigned cnt[IDX_SEL_PER * 32];
    __shared__ unsigned chunk_x[IDX_SEL_PER];
    __shared__ unsigned or_s, and_s, bin_s, rem_s, done_s, tile_s;
    const int t = t0 + blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t n = (pos[t] + 1) / 4;
    int32_t *out = sel + (int64_t)t * K;
    if (n <= K) {
        for (int64_t k = threadIdx.x; k < n; k += blockDim.x) out[k] = (int32_t)k;
        if (threadIdx.x == 0) n_sel[t] = (int32_t)n;
        return;
    }
    const float *sc = scratch + (int64_t)blockIdx.x * max_rows;
    uint32_t prefix = 0, mask = 0;
    unsigned rem = (unsigned)K;
    for (int shift = 24;; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
        if (threadIdx.x == 0) { or_s = 0; and_s = ~0u; }
        __syncthreads();
        const uint32_t low = shift ? (1u << shift) - 1u : 0u;   /* the key bits below this pass's byte */
        uint32_t o = 0, a = ~0u;
        for (int64_t base = 0; base < n; base += IDX_SEL_TILE) {   /* a uniform trip count: whole warps below */
            uint32_t key[IDX_SEL_PER];
            const unsigned valid = load_keys(sc, n, base, key);
#pragma unroll
            for (int j = 0; j < IDX_SEL_PER; j++) {
                const bool cand = (valid >> j & 1u) && (key[j] & mask) == prefix;
                const unsigned bin = cand ? (key[j] >> shift) & 255u : 256u;
                if (cand) { o |= key[j] & low; a &= key[j] & low; }
                const unsigned peers = __match_any_sync(FULL_MASK, bin);
                if (cand && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
            }
        }
        o = __reduce_or_sync(FULL_MASK, o);
        a = __reduce_and_sync(FULL_MASK, a);
        if (lane == 0) { atomicOr(&or_s, o); atomicAnd(&and_s, a); }
        __syncthreads();
        if (warp == 0) {   /* the bin of the rem-th best candidate: lane l holds bins 255 - 8l down to 248 - 8l */
            unsigned c8[8], sum = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) { c8[i] = hist[255 - 8 * lane - i]; sum += c8[i]; }
            unsigned incl = sum;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const unsigned v = __shfl_up_sync(FULL_MASK, incl, d);
                if (lane >= d) incl += v;
            }
            const unsigned hit = __ballot_sync(FULL_MASK, incl >= rem);
            if (lane == __ffs(hit) - 1) {
                unsigned r = rem - (incl - sum);
                for (int i = 0; i < 8; i++) {
                    if (c8[i] >= r) {
                        bin_s = 255u - 8u * (unsigned)lane - (unsigned)i;
                        rem_s = r;
                        done_s = shift == 0 || c8[i] == r || or_s == and_s;
                        break;
                    }
                    r -= c8[i];
                }
            }
        }
        __syncthreads();   /* bin_s, rem_s, done_s are written again only after the next pass's first barrier */
        prefix |= bin_s << shift;
        mask |= 255u << shift;
        rem = rem_s;
        if (done_s) break;
    }
    /* compaction: per tile, each (element j, warp) ballots "above" (decided bits > prefix) and "tie" (= prefix);
     * their counts, packed above << 16 | tie (a tile holds at most 2^14 rows), are scanned in row order (j major,
     * warp minor, lane) */
    int64_t above_base = 0, tie_base = 0;
    const unsigned lt = (1u << lane) - 1u;
    for (int64_t base = 0; base < n; base += IDX_SEL_TILE) {
        uint32_t key[IDX_SEL_PER];
        const unsigned valid = load_keys(sc, n, base, key);
        unsigned above[IDX_SEL_PER], tie[IDX_SEL_PER];
#pragma unroll
        for (int j = 0; j < IDX_SEL_PER; j++) {
            const uint32_t d = key[j] & mask;
            above[j] = __ballot_sync(FULL_MASK, (valid >> j & 1u) && d > prefix);
            tie[j] = __ballot_sync(FULL_MASK, (valid >> j & 1u) && d == prefix);
            if (lane == 0) cnt[32 * j + warp] = (unsigned)__popc(above[j]) << 16 | (unsigned)__popc(tie[j]);
        }
        __syncthreads();
        if (warp < IDX_SEL_PER) {   /* warp j: the exclusive scan of chunk j's 32 warps */
            const unsigned v = cnt[32 * warp + lane];
            unsigned incl = v;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const unsigned u = __shfl_up_sync(FULL_MASK, incl, d);
                if (lane >= d) incl += u;
            }
            cnt[32 * warp + lane] = incl - v;
            if (lane == 31) chunk_x[warp] = incl;
        }
        __syncthreads();
        if (warp == 0) {   /* the chunks' totals, scanned */
            const unsigned v = lane < IDX_SEL_PER ? chunk_x[lane] : 0u;
            unsigned incl = v;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const unsigned u = __shfl_up_sync(FULL_MASK, incl, d);
                if (lane >= d) incl += u;
            }
            if (lane < IDX_SEL_PER) chunk_x[lane] = incl - v;
            if (lane == 31) tile_s = incl;
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < IDX_SEL_PER; j++) {
            const bool is_above = above[j] >> lane & 1u, is_tie = tie[j] >> lane & 1u;
            if (!is_above && !is_tie) continue;
            const unsigned e = chunk_x[j] + cnt[32 * j + warp] + ((unsigned)__popc(above[j] & lt) << 16 | (unsigned)__popc(tie[j] & lt));
            const int64_t a_before = above_base + (e >> 16), t_before = tie_base + (e & 0xffffu);
            const int64_t k = base + (int64_t)IDX_SEL_THREADS * j + threadIdx.x;
            if (is_above) out[a_before + (t_before < (int64_t)rem ? t_before : (int64_t)rem)] = (int32_t)k;
            else if (t_before < (int64_t)rem) out[a_before + t_before] = (int32_t)k;
        }
        above_base += tile_s >> 16;
        tie_base += tile_s & 0xffffu;
        __syncthreads();   /* cnt, chunk_x, tile_s are rewritten by the next tile */
    }
    if (threadIdx.x == 0) n_sel[t] = K;
}

extern "C" void cu_index_topk(cu_stream st, const int64_t *pos, int t0, int T, int K, int64_t max_rows, const float *scratch,
                              int32_t *sel, int32_t *n_sel) {
    if (T > 0) k_index_topk<<<T, IDX_SEL_THREADS, 0, (cudaStream_t)st>>>(pos, t0, K, max_rows, scratch, sel, n_sel);
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
        cu_index_topk(st, pos, t0, n, K, max_rows, scratch, sel, n_sel);
    }
    return 0;
}
