/* The lightning indexer on the device (core/attention.c select_rows, spec §9): every query's scores over the
 * indexer rows it may see, then its top-k rows in row order. Scores: fp32 on CUDA cores (EXACT mode, and OFFICIAL
 * with DSV4_CUDA_IDX_MMA=0), or in OFFICIAL mode exact int8 tensor-core block sums of the FP4 operands (the
 * section "OFFICIAL scores on int8 tensor cores" states their order; two kernels compute it, one with a query's heads
 * as the MMA's N for decode steps, one with 8 queries of a head for prefill chunks). tools/gpu/shim/shim_indexer.sh
 * runs this file on the CPU (tests/gpu/test_gpu_indexer.c). */
#include "backend/cuda/cu_kvrow.cuh"

/* ---- fp32 scores ------------------------------------------------------------------------------------------------------ */

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
    dev_grid_wait();
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
 * with the same bin (IDX_SEL_MATCH: equal scores would otherwise queue on one counter); only integer counts are
 * added, so the result does not depend on the order of the atomics. */
#define IDX_SEL_PER 16
/* How a warp aggregates its histogram adds: 1 __match_any_sync (one add per distinct bin), 0 the lowest candidate
 * lane's bin in one add and every other lane alone (plain shuffles, ballots and shared atomics; a build variant to
 * measure against, -DIDX_SEL_MATCH=0). Both give the same counts. */
#ifndef IDX_SEL_MATCH
#define IDX_SEL_MATCH 1
#endif
#define IDX_SEL_TILE ((int64_t)IDX_SEL_THREADS * IDX_SEL_PER)
#define FULL_MASK 0xffffffffu

/* The selection's order on scores as an unsigned key, larger = better; -0 counts as +0 (equal scores tie). */
__device__ __forceinline__ uint32_t score_key(float s) {
    const uint32_t u = __float_as_uint(s == 0.0f ? 0.0f : s);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The keys of the tile at base (element j: row base + THREADS j + threadIdx.x); bit j of the result: the row exists. */
template <int THREADS>
__device__ __forceinline__ unsigned load_keys(const float *sc, int64_t n, int64_t base, uint32_t (&key)[IDX_SEL_PER]) {
    unsigned valid = 0;
#pragma unroll
    for (int j = 0; j < IDX_SEL_PER; j++) {
        const int64_t k = base + (int64_t)THREADS * j + threadIdx.x;
        key[j] = k < n ? score_key(sc[k]) : 0u;
        valid |= (unsigned)(k < n) << j;
    }
    return valid;
}

/* hist[bin] += 1 for every lane with cand, aggregated over the warp (IDX_SEL_MATCH); whole warps call it. */
__device__ __forceinline__ void hist_add(unsigned *hist, bool cand, unsigned bin) {
    const int lane = threadIdx.x & 31;
    unsigned rest = __ballot_sync(FULL_MASK, cand);
    if (!rest) return;   /* after the first pass most warps hold none */
#if IDX_SEL_MATCH
    const unsigned peers = __match_any_sync(FULL_MASK, bin);
    if (cand && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
#else
    /* the lowest candidate lane adds for every lane of its bin; the others add one each */
    const int ld = __ffs(rest) - 1;
    const unsigned lb = __shfl_sync(FULL_MASK, bin, ld);
    const unsigned same = __ballot_sync(FULL_MASK, bin == lb);
    if (lane == ld) atomicAdd(&hist[lb], (unsigned)__popc(same));
    rest &= ~same;
    if (rest >> lane & 1u) atomicAdd(&hist[bin], 1u);
#endif
}

__global__ void __launch_bounds__(IDX_SEL_THREADS) k_index_topk(const int64_t *pos, int t0, int K, int64_t max_rows,
                                                                 const float *scratch, int32_t *sel, int32_t *n_sel) {
    dev_grid_wait();
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
            const unsigned valid = load_keys<IDX_SEL_THREADS>(sc, n, base, key);
#pragma unroll
            for (int j = 0; j < IDX_SEL_PER; j++) {
                const bool cand = (valid >> j & 1u) && (key[j] & mask) == prefix;
                const unsigned bin = cand ? (key[j] >> shift) & 255u : 256u;
                if (cand) { o |= key[j] & low; a &= key[j] & low; }
                hist_add(hist, cand, bin);
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
        const unsigned valid = load_keys<IDX_SEL_THREADS>(sc, n, base, key);
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

/* ---- selection split over blocks (a step of few queries: decode) -----------------------------------------------------

 * One block per query leaves all but one SM idle at decode. With at most CU_INDEX_SPLIT_T queries, the same
 * selection runs as a sequence of launches over slices of IDX_SPL_ROWS rows (one block each, grid slices x queries),
 * passing integer counts through a per-query record in global memory (split_ws):
 *   init: the four byte histograms and the OR / AND words cleared;
 *   pass p = 0..3: every block derives the state after passes 0..p-1 from the record (the same bins, rem and exit
 *     tests as k_index_topk, computed by warp 0 of each block from the same counts: the same result everywhere);
 *     if the selection is not yet decided, it adds its slice's candidates to the histogram of byte p and its OR /
 *     AND of the bits below it (global integer atomics: any order gives the same record);
 *   count: the decided (prefix, rem); each slice's numbers of "above" and "tie" rows;
 *   write: each slice's offsets (the counts of the slices before it), then its rows in row order as k_index_topk's
 *     compaction. The same selection as k_index_topk, bit for bit (test_gpu_indexer runs both against the rule). */
#define IDX_SPL_THREADS 256
#define IDX_SPL_ROWS (IDX_SPL_THREADS * IDX_SEL_PER)   /* rows a slice: one tile */
#define SPL_HIST 0                                     /* record: [4][256] histograms */
#define SPL_OR 1024                                    /* [4] OR, [4] AND of the bits below pass p's byte */
#define SPL_AND 1028
#define SPL_CNT 1032                                   /* [slices][2] above / tie counts */

static int64_t spl_slices(int64_t n_rows) { return (n_rows + IDX_SPL_ROWS - 1) / IDX_SPL_ROWS; }
static int64_t spl_record(int64_t n_rows) { return SPL_CNT + 2 * spl_slices(n_rows); }

extern "C" int64_t cu_index_split_words(int64_t max_rows) { return (int64_t)CU_INDEX_SPLIT_T * spl_record(max_rows); }

/* The bin of the rem-th best candidate of a histogram, by one whole warp (lane l holds bins 255 - 8l .. 248 - 8l):
 * every lane gets the bin, the rem left in it and its count. */
__device__ __forceinline__ void pick_bin(const unsigned *h, unsigned rem, unsigned &bin, unsigned &r_out, unsigned &c_out) {
    const int lane = threadIdx.x & 31;
    unsigned c8[8], sum = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) { c8[i] = h[255 - 8 * lane - i]; sum += c8[i]; }
    unsigned incl = sum;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const unsigned v = __shfl_up_sync(FULL_MASK, incl, d);
        if (lane >= d) incl += v;
    }
    const int hit = __ffs(__ballot_sync(FULL_MASK, incl >= rem)) - 1;
    unsigned b = 0, r = rem - (incl - sum), c = 0;
    for (int i = 0; i < 8; i++) {
        if (c8[i] >= r) { b = 255u - 8u * (unsigned)lane - (unsigned)i; c = c8[i]; break; }
        r -= c8[i];
    }
    bin = __shfl_sync(FULL_MASK, b, hit);
    r_out = __shfl_sync(FULL_MASK, r, hit);
    c_out = __shfl_sync(FULL_MASK, c, hit);
}

typedef struct {
    uint32_t prefix, mask;
    unsigned rem, done;
} spl_state;

/* The state after passes 0 .. upto-1 (or the pass that decided it), by warp 0; into st (shared). */
__device__ __forceinline__ void spl_derive(const unsigned *rec, int K, int upto, spl_state *st) {
    uint32_t prefix = 0, mask = 0;
    unsigned rem = (unsigned)K, done = 0;
    for (int p = 0; p < upto && !done; p++) {
        const int shift = 24 - 8 * p;
        unsigned bin, r, c;
        pick_bin(rec + SPL_HIST + 256 * p, rem, bin, r, c);
        prefix |= bin << shift;
        mask |= 255u << shift;
        rem = r;
        done = shift == 0 || c == r || rec[SPL_OR + p] == rec[SPL_AND + p];
    }
    if ((threadIdx.x & 31) == 0) *st = spl_state{ prefix, mask, rem, done };
}

__global__ void k_spl_init(int64_t record, unsigned *ws) {
    dev_grid_wait();
    unsigned *rec = ws + (int64_t)blockIdx.x * record;
    for (int i = threadIdx.x; i < SPL_CNT; i += blockDim.x) rec[i] = i >= SPL_AND ? ~0u : 0u;
}

__global__ void __launch_bounds__(IDX_SPL_THREADS) k_spl_hist(const int64_t *pos, int t0, int K, int64_t max_rows, const float *scratch,
                                                              int64_t record, unsigned *ws, int p) {
    dev_grid_wait();
    __shared__ unsigned hist[256];
    __shared__ spl_state st;
    __shared__ unsigned or_s, and_s;
    const int t = t0 + blockIdx.y;
    const int64_t n = (pos[t] + 1) / 4, base = (int64_t)blockIdx.x * IDX_SPL_ROWS;
    if (n <= K || base >= n) return;
    unsigned *rec = ws + (int64_t)blockIdx.y * record;
    if (threadIdx.x < 32) spl_derive(rec, K, p, &st);
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    if (threadIdx.x == 0) { or_s = 0; and_s = ~0u; }
    __syncthreads();
    if (st.done) return;
    const int shift = 24 - 8 * p;
    const uint32_t low = shift ? (1u << shift) - 1u : 0u, prefix = st.prefix, mask = st.mask;
    uint32_t key[IDX_SEL_PER];
    const unsigned valid = load_keys<IDX_SPL_THREADS>(scratch + (int64_t)blockIdx.y * max_rows, n, base, key);
    uint32_t o = 0, a = ~0u;
#pragma unroll
    for (int j = 0; j < IDX_SEL_PER; j++) {
        const bool cand = (valid >> j & 1u) && (key[j] & mask) == prefix;
        if (cand) { o |= key[j] & low; a &= key[j] & low; }
        hist_add(hist, cand, cand ? (key[j] >> shift) & 255u : 256u);
    }
    o = __reduce_or_sync(FULL_MASK, o);
    a = __reduce_and_sync(FULL_MASK, a);
    if ((threadIdx.x & 31) == 0) { atomicOr(&or_s, o); atomicAnd(&and_s, a); }
    __syncthreads();
    for (int i = threadIdx.x; i < 256; i += blockDim.x)
        if (hist[i]) atomicAdd(&rec[SPL_HIST + 256 * p + i], hist[i]);
    if (threadIdx.x == 0) {
        atomicOr(&rec[SPL_OR + p], or_s);
        atomicAnd(&rec[SPL_AND + p], and_s);
    }
}

/* Per slice, its above / tie counts (count = 1), or its rows written (count = 0). */
__global__ void __launch_bounds__(IDX_SPL_THREADS) k_spl_compact(const int64_t *pos, int t0, int K, int64_t max_rows, const float *scratch,
                                                                 int64_t record, unsigned *ws, int count, int32_t *sel, int32_t *n_sel) {
    dev_grid_wait();
    __shared__ spl_state st;
    __shared__ unsigned cnt[IDX_SEL_PER * (IDX_SPL_THREADS / 32)];
    __shared__ unsigned slice_above, slice_tie;
    const int t = t0 + blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, NW = IDX_SPL_THREADS / 32;
    const int64_t n = (pos[t] + 1) / 4, base = (int64_t)blockIdx.x * IDX_SPL_ROWS;
    int32_t *out = sel + (int64_t)t * K;
    if (n <= K) {
        if (count || blockIdx.x) return;
        for (int64_t k = threadIdx.x; k < n; k += blockDim.x) out[k] = (int32_t)k;
        if (threadIdx.x == 0) n_sel[t] = (int32_t)n;
        return;
    }
    if (base >= n) return;
    unsigned *rec = ws + (int64_t)blockIdx.y * record;
    if (threadIdx.x < 32) spl_derive(rec, K, 4, &st);
    if (threadIdx.x == 0) { slice_above = 0; slice_tie = 0; }
    __syncthreads();
    const uint32_t prefix = st.prefix, mask = st.mask;
    const unsigned rem = st.rem;
    uint32_t key[IDX_SEL_PER];
    const unsigned valid = load_keys<IDX_SPL_THREADS>(scratch + (int64_t)blockIdx.y * max_rows, n, base, key);
    unsigned above[IDX_SEL_PER], tie[IDX_SEL_PER];
#pragma unroll
    for (int j = 0; j < IDX_SEL_PER; j++) {
        const uint32_t d = key[j] & mask;
        above[j] = __ballot_sync(FULL_MASK, (valid >> j & 1u) && d > prefix);
        tie[j] = __ballot_sync(FULL_MASK, (valid >> j & 1u) && d == prefix);
        if (lane == 0) cnt[NW * j + warp] = (unsigned)__popc(above[j]) << 16 | (unsigned)__popc(tie[j]);
    }
    if (count) {
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned s = 0;
            for (int i = 0; i < IDX_SEL_PER * NW; i++) s += cnt[i];
            rec[SPL_CNT + 2 * blockIdx.x] = s >> 16;
            rec[SPL_CNT + 2 * blockIdx.x + 1] = s & 0xffffu;
        }
        return;
    }
    /* the slices before this one, summed by the block */
    unsigned pa = 0, pt = 0;
    for (int64_t i = threadIdx.x; i < blockIdx.x; i += blockDim.x) {
        pa += rec[SPL_CNT + 2 * i];
        pt += rec[SPL_CNT + 2 * i + 1];
    }
    atomicAdd(&slice_above, pa);
    atomicAdd(&slice_tie, pt);
    __syncthreads();
    static_assert(IDX_SEL_PER * (IDX_SPL_THREADS / 32) == 4 * 32, "the scan below takes 4 entries a lane");
    if (warp == 0) {   /* exclusive scan of the IDX_SEL_PER x NW entries in row order, 4 a lane */
        unsigned v[4], sum = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) { v[i] = cnt[4 * lane + i]; sum += v[i]; }
        unsigned incl = sum;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const unsigned u = __shfl_up_sync(FULL_MASK, incl, d);
            if (lane >= d) incl += u;
        }
        unsigned x = incl - sum;
#pragma unroll
        for (int i = 0; i < 4; i++) { cnt[4 * lane + i] = x; x += v[i]; }
    }
    __syncthreads();
    const unsigned lt = (1u << lane) - 1u;
#pragma unroll
    for (int j = 0; j < IDX_SEL_PER; j++) {
        const bool is_above = above[j] >> lane & 1u, is_tie = tie[j] >> lane & 1u;
        if (!is_above && !is_tie) continue;
        const unsigned e = cnt[NW * j + warp] + ((unsigned)__popc(above[j] & lt) << 16 | (unsigned)__popc(tie[j] & lt));
        const int64_t a_before = (int64_t)slice_above + (e >> 16), t_before = (int64_t)slice_tie + (e & 0xffffu);
        const int64_t k = base + (int64_t)IDX_SPL_THREADS * j + threadIdx.x;
        if (is_above) out[a_before + (t_before < (int64_t)rem ? t_before : (int64_t)rem)] = (int32_t)k;
        else if (t_before < (int64_t)rem) out[a_before + t_before] = (int32_t)k;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) n_sel[t] = K;
}

extern "C" void cu_index_topk(cu_stream st, const int64_t *pos, int t0, int T, int K, int64_t n_rows, int64_t max_rows,
                              const float *scratch, unsigned *split_ws, int64_t split_words, int32_t *sel, int32_t *n_sel) {
    if (T <= 0) return;
    const cudaStream_t s = (cudaStream_t)st;
    const int64_t record = spl_record(max_rows), slices = spl_slices(n_rows > 0 ? n_rows : 1);
    if (!split_ws || T > CU_INDEX_SPLIT_T || split_words < (int64_t)T * record || n_rows <= K) {
        k_index_topk<<<T, IDX_SEL_THREADS, 0, s>>>(pos, t0, K, max_rows, scratch, sel, n_sel);
        return;
    }
    const dim3 grid((unsigned)slices, (unsigned)T);
    k_spl_init<<<T, 256, 0, s>>>(record, split_ws);
    for (int p = 0; p < 4; p++)
        k_spl_hist<<<grid, IDX_SPL_THREADS, 0, s>>>(pos, t0, K, max_rows, scratch, record, split_ws, p);
    k_spl_compact<<<grid, IDX_SPL_THREADS, 0, s>>>(pos, t0, K, max_rows, scratch, record, split_ws, 1, sel, n_sel);
    k_spl_compact<<<grid, IDX_SPL_THREADS, 0, s>>>(pos, t0, K, max_rows, scratch, record, split_ws, 0, sel, n_sel);
}

/* ---- OFFICIAL scores on int8 tensor cores ------------------------------------------------------------------------------

 * In OFFICIAL mode both operands of every indexer dot are FP4-simulated values (spec §3.4): in each block of 32
 * columns, x = v * 2^e with v on the E2M1 grid {0, +-0.5, +-1, +-1.5, +-2, +-3, +-4, +-6}. So each block's part of a
 * dot is an integer sum times a power of two, and int8 tensor cores compute it exactly:
 *   a block of values gets the unit u = 2^(floor(log2 amax) - 5) (u = 1 for an all-zero block) and the codes x / u.
 *     Why they are integers < 64: x = v s, amax = vmax s with vmax in {.5, 1, 1.5, 2, 3, 4, 6}; floor(log2 vmax) =
 *     f in {-1, 0, 1, 2}, so x / u = v 2^(5 - f): v is a multiple of 1/2 and 5 - f >= 3, an integer; |v| <= vmax
 *     < 2^(f+1), so |x / u| < 2^6. The query (ws->qi, written by k_prepare_tokens' FP4 simulation in OFFICIAL mode)
 *     and bf16 / f32 indexer rows (written by the indexer compressor's FP4 simulation, cu_compress / compressor.c)
 *     are such values by construction, exactly (s >= 2^-126, so v s >= 2^-127 is a bf16 value). A block that is
 *     not (a code not an integer or beyond +-127: NaN, infinity, data from elsewhere) is still scored, and stores 1
 *     (query) or 2 (row) into *offgrid, a word in mapped host memory the step checks after it waited (step_end): an
 *     error, never a silent result.
 *   an fp8-KV indexer row stores the codes themselves: E2M1 code c and UE8M0 scale byte E per 32 columns, value
 *     e2m1(c) 2^(E-127); its codes are 2 e2m1(c) (0, +-1, +-2, +-3, +-4, +-6, +-8, +-12) and u = 0.5 * 2^(E-127).
 * ---- Order of a score (the same for every row, query, batch and chunking; a function of the two rows alone) ----
 *   S_b = sum over the block's 32 columns of qcode * kcode: an exact int32 (|S_b| < 32 * 127 * 127 < 2^24), from
 *         one mma.sync.m16n8k32.s32.s8.s8.s32 with a zero accumulator (integer sums: the order inside is moot);
 *   dot = 0.0f; for b = 0 .. cI/32 - 1 in order: dot = fmaf((float)S_b, uq_b * uk_b, dot) (each product exact
 *         but for underflow: S_b is exact in fp32 and the u are powers of two);
 *   then as the fp32 path: s_h = bf16(dot); acc = 0.0f; for h = 0 .. nI-1 in order: if s_h > 0, acc += bf16(s_h
 *   * w[h]); score = bf16(acc). (A skipped head is stored as +0 and added: acc is never -0, so acc + 0 = acc.)
 * tests/gpu/test_gpu_indexer.c computes this order in C on the host and requires the GPU's scores bit for bit.
 * ---- Fragment layouts relied on (PTX ISA, "Matrix Fragments for mma.m16n8k32" with .s8 operands, the same as
 *      k_mma.cu's .e4m3) ----
 *   lane = 4 g + q; byte i of a 32-bit register = element i.
 *   A (16 x 32, row): a0 = A[g][4q .. 4q+3], a1 = A[g+8][4q .. 4q+3], a2 = A[g][16+4q ..], a3 = A[g+8][16+4q ..].
 *   B (32 x 8, col): b0 = B[4q .. 4q+3][g], b1 = B[16+4q .. 16+4q+3][g].
 *   C/D (16 x 8 s32): d0 = D[g][2q], d1 = D[g][2q+1], d2 = D[g+8][2q], d3 = D[g+8][2q+1].
 *   A = 16 indexer rows (M), B = 8 query heads (N), K = one 32-column block b. The k map (the same for A and B):
 *   k = 4q + i -> column 32b + 8q + i, k = 16 + 4q + i -> column 32b + 8q + 4 + i, so lane q holds columns
 *   32b + 8q .. 32b + 8q + 7 of its rows (one 32-bit word of E2M1 nibbles in an fp8 row) and of its head (8 code
 *   bytes). A warp owns 16 rows and runs the heads in tiles of 8; the per-row head sum runs in one lane over the
 *   terms gathered in shared memory. */
#define IDXM_WARPS 8
#define IDXM_ROWS (16 * IDXM_WARPS)   /* rows a block */
/* Queries a block scores over its rows, one after another: a warp decodes its 16 rows' A fragments once for all of
 * them (while they belong to one sequence), not once a query. At a prefill chunk the rows' decode was most of the
 * kernel's work (run 104: the indexer 24 % of a 128K prefill). Who scores what only; every score keeps its order. */
#ifndef IDXM_QUERIES
#define IDXM_QUERIES 16
#endif

/* D = C + A B on one m16n8k32 int8 tile (fragments as above), every element of the accumulator C = c (the sum is
 * exact integer arithmetic). tools/gpu/shim/shim_mma.h has a C++ emulation of it written from the same layout, for
 * the CPU shim. */
#ifndef CUDA_SHIM
__device__ __forceinline__ void mma_s8_from(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                                            int c) {
    d[0] = d[1] = d[2] = d[3] = c;
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif

/* The block sums S of one tile as floats, (float)S exactly, without I2F (a quarter-rate conversion, four a tile):
 * the MMA starts from the bits of 1.5 * 2^23 instead of 0, and 1.5 * 2^23 is subtracted as a float. In [2^23, 2^24)
 * the float step is 1, so for |S| < 2^22 (here |S| <= 32 * 127 * 127 < 2^19) the accumulator's bits are those of the
 * float 1.5 * 2^23 + S and the subtraction is exact: S, and +0 for S = 0, as (float)S. */
#define IDX_MAGIC_BITS 0x4B400000
#define IDX_MAGIC_F 12582912.0f
__device__ __forceinline__ void mma_s8_f32(float (&s)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    int d[4];
    mma_s8_from(d, a0, a1, a2, a3, b0, b1, IDX_MAGIC_BITS);
#pragma unroll
    for (int e = 0; e < 4; e++) s[e] = __int_as_float(d[e]) - IDX_MAGIC_F;
}

/* The unit of a block of FP4-grid values from its amax: 2^(floor(log2 amax) - 5), from the bits (amax may be
 * subnormal); 1 for amax = 0; 0 when it underflows (then every code is infinite: off the grid). */
__device__ __forceinline__ float grid_unit(float amax) {
    const uint32_t b = __float_as_uint(amax), E = (b >> 23) & 255u;
    if (b == 0) return 1.0f;
    const int e = (E ? (int)E - 127 : (31 - __clz((int)(b & 0x7fffffu))) - 149) - 5;
    if (e >= -126) return __uint_as_float((uint32_t)(e + 127) << 23);
    return e >= -149 ? __uint_as_float(1u << (e + 149)) : 0.0f;
}

/* x / u as an int8 code (its byte); ok cleared when it is not an integer in [-127, 127]. */
__device__ __forceinline__ uint32_t grid_code(float x, float u, bool &ok) {
    const float c = __fdiv_rn(x, u);
    if (!(c == rintf(c) && fabsf(c) <= 127.0f)) { ok = false; return 0u; }
    return (uint32_t)(int)c & 255u;
}

/* Four E2M1 codes (code i in bits 4i .. 4i+3 of v) as four int8 of twice their value (byte i). */
__device__ __forceinline__ uint32_t e2m1x4_s8(uint32_t v) {
    uint32_t r = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t c = (v >> (4 * i)) & 15u;
        const uint32_t mag = (uint32_t)(0x0C08060403020100ull >> (8 * (c & 7u))) & 255u;
        r |= ((c & 8u) ? (0u - mag) & 255u : mag) << (8 * i);
    }
    return r;
}

/* The query codes, once a step: warp (t, h) over its head's blocks of 32, lane l column 32b + l: qc [T][nI][cI]
 * int8, qu [T][nI][cI/32] units. A head's cI codes are stored in fragment order: column 32b + 8q + i (the bytes lane
 * q of a quad gives an MMA for block b, i = 0..7) at byte 8 (NB q + b) + i, so a lane's bytes of every block are
 * one run of 8 NB bytes. */
__device__ __forceinline__ int64_t qcode_at(int64_t head, int cI, int col) {
    const int NB = cI / 32, b = col >> 5, q = (col >> 3) & 3, i = col & 7;
    return head * cI + 8 * (NB * q + b) + i;
}

__global__ void k_index_qcodes(const float *qi, int64_t n_heads, int cI, int8_t *qc, float *qu, unsigned *offgrid) {
    dev_grid_wait();
    const int lane = threadIdx.x & 31;
    const int64_t th = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (th >= n_heads) return;   /* whole warps */
    bool ok = true;
    for (int b = 0; b < cI / 32; b++) {
        const int64_t i = th * cI + 32 * b + lane;
        const float x = qi[i];
        float a = fabsf(x);
        for (int off = 16; off > 0; off >>= 1) a = fmaxf(a, __shfl_xor_sync(FULL_MASK, a, off));
        const float u = grid_unit(a);
        qc[qcode_at(th, cI, 32 * b + lane)] = (int8_t)(uint8_t)grid_code(x, u, ok);
        if (lane == 0) qu[th * (cI / 32) + b] = u;
    }
    if (!ok) *(volatile unsigned *)offgrid = 1u;   /* a plain store: atomics on host memory are not portable */
}

/* Eight consecutive values of a bf16 / f32 row from column j (a multiple of 8: 16- or 32-byte aligned). */
__device__ __forceinline__ void row_values8(const cu_kvlay &l, const uint8_t *row, int j, float (&x)[8]) {
    if (l.fmt == KV_F32) {
        const float4 v0 = *(const float4 *)(row + 4 * j), v1 = *(const float4 *)(row + 4 * j + 16);
        x[0] = v0.x; x[1] = v0.y; x[2] = v0.z; x[3] = v0.w; x[4] = v1.x; x[5] = v1.y; x[6] = v1.z; x[7] = v1.w;
    } else {
        const uint4 v = *(const uint4 *)(row + 2 * j);
        const uint32_t w[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
        for (int i = 0; i < 4; i++) {
            x[2 * i] = dev_bf16_to_f32((uint16_t)(w[i] & 0xffffu));
            x[2 * i + 1] = dev_bf16_to_f32((uint16_t)(w[i] >> 16));
        }
    }
}

/* The A fragments of a warp's 16 rows k0 .. k0 + 15 (rows >= n are zeros) and their units; ok cleared when a row
 * block is off the FP4 grid. */
template <int NB>
__device__ __forceinline__ void index_row_frags(const cu_kvlay &il, const uint8_t *rows, int64_t k0, int64_t n, uint32_t (&A)[NB][4],
                                                float (&uk)[NB][2], bool &ok) {
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t k = k0 + g + 8 * r;
        const bool valid = k < n;
        const uint8_t *row = rows + (valid ? k : 0) * il.bytes;
#pragma unroll
        for (int b = 0; b < NB; b++) {
            uint32_t lo = 0, hi = 0;
            if (il.fmt != KV_F32 && il.fmt != KV_BF16) {   /* fp8 KV: E2M1 codes, a UE8M0 scale per 32 */
                uint32_t w = 0;
                const uint8_t *p = row + 16 * b + 4 * q;
                if (valid) w = (il.bytes & 3) ? (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24
                                              : *(const uint32_t *)p;
                lo = e2m1x4_s8(w & 0xffffu);
                hi = e2m1x4_s8(w >> 16);
                uk[b][r] = valid ? 0.5f * dev_e8m0(row[(il.width + 1) / 2 + b]) : 0.0f;
            } else {   /* values: the lanes of a quad hold one block of the row */
                float x[8];
                if (valid) row_values8(il, row, 32 * b + 8 * q, x);
                else
#pragma unroll
                    for (int i = 0; i < 8; i++) x[i] = 0.0f;
                float a = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) a = fmaxf(a, fabsf(x[i]));
                a = fmaxf(a, __shfl_xor_sync(FULL_MASK, a, 1));
                a = fmaxf(a, __shfl_xor_sync(FULL_MASK, a, 2));
                const float u = grid_unit(a);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    lo |= grid_code(x[i], u, ok) << (8 * i);
                    hi |= grid_code(x[4 + i], u, ok) << (8 * i);
                }
                uk[b][r] = u;
            }
            A[b][r] = lo;       /* a0 (row g) / a1 (row g+8): columns 8q .. 8q+3 of the block */
            A[b][2 + r] = hi;   /* a2 / a3: columns 8q+4 .. 8q+7 */
        }
    }
}

/* Block (x, y): rows [IDXM_ROWS x, IDXM_ROWS (x + 1)), warp w rows 16 w .. 16 w + 15 of them, for the launch's
 * queries IDXM_QUERIES y .. IDXM_QUERIES (y + 1) - 1 (of nq, query i = token t0 + i, its scores in scratch row i) in
 * turn; NB = cI / 32 blocks. A warp decodes its rows when the query's sequence differs from the one its fragments
 * hold: up to the most rows any of the block's queries of that sequence sees, so no row past what the step has
 * written is read, and every row decoded is one some query sees (the off-grid word as with a decode a query).
 * Dynamic shared memory: a warp's [16][nI + 1] head terms. */
template <int NB>
__global__ void __launch_bounds__(IDXM_WARPS * 32) k_index_score_mma(cu_kvlay il, const int8_t *qc, const float *qu, const float *wi,
                                                                      const int64_t *pos, const int32_t *item_of,
                                                                      const cu_seq_layer *sl, int t0, int nq, int nI, int K,
                                                                      int64_t max_rows, float *scratch, unsigned *offgrid) {
    dev_grid_wait();
    extern __shared__ __align__(16) float idxm_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int cI = 32 * NB;
    const int64_t k0 = (int64_t)blockIdx.x * IDXM_ROWS + 16 * warp;
    const int i0 = IDXM_QUERIES * (int)blockIdx.y, i1 = i0 + IDXM_QUERIES < nq ? i0 + IDXM_QUERIES : nq;
    float *ts = idxm_smem + (size_t)warp * 16 * (nI + 1);
    uint32_t A[NB][4];
    float uk[NB][2];
    bool ok = true;
    int held = -1;   /* the sequence whose rows A holds */
    for (int i = i0; i < i1; i++) {   /* warp-uniform: no block barrier below */
        const int t = t0 + i, item = item_of[t];
        const int64_t n = (pos[t] + 1) / 4;
        if (n <= K || k0 >= n) continue;   /* n <= K: every row is selected, no score needed */
        if (item != held) {
            int64_t n_load = n;
            for (int j = i + 1; j < i1; j++)
                if (item_of[t0 + j] == item && (pos[t0 + j] + 1) / 4 > n_load) n_load = (pos[t0 + j] + 1) / 4;
            index_row_frags<NB>(il, sl[item].irows, k0, n_load, A, uk, ok);
            held = item;
        }
        const float *w = wi + (int64_t)t * nI;
        for (int h0 = 0; h0 < nI; h0 += 8) {
            const int hb = h0 + g, ha = h0 + 2 * q;   /* B column of the lane; its D columns ha, ha + 1 */
            const int8_t *qb = qc + ((int64_t)t * nI + hb) * cI + 8 * NB * q;   /* fragment order */
            float dot[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll
            for (int b = 0; b < NB; b++) {
                uint32_t b0 = 0, b1 = 0;
                if (hb < nI) {
                    const uint2 v = *(const uint2 *)(qb + 8 * b);
                    b0 = v.x;
                    b1 = v.y;
                }
                float S[4];
                mma_s8_f32(S, A[b][0], A[b][1], A[b][2], A[b][3], b0, b1);
                const float ua = ha < nI ? qu[((int64_t)t * nI + ha) * NB + b] : 0.0f;
                const float ub = ha + 1 < nI ? qu[((int64_t)t * nI + ha + 1) * NB + b] : 0.0f;
                dot[0] = fmaf(S[0], ua * uk[b][0], dot[0]);   /* row g,     head ha */
                dot[1] = fmaf(S[1], ub * uk[b][0], dot[1]);   /* row g,     head ha + 1 */
                dot[2] = fmaf(S[2], ua * uk[b][1], dot[2]);   /* row g + 8, head ha */
                dot[3] = fmaf(S[3], ub * uk[b][1], dot[3]);   /* row g + 8, head ha + 1 */
            }
            /* s_h = bf16(dot) (a NaN is only compared, never kept), then bf16(s_h w[h]); two roundings an instruction */
            float sh[4] = { dot[0], dot[1], dot[2], dot[3] }, p[4];
            dev_round_bf16x2_any_nan(sh[0], sh[1]);
            dev_round_bf16x2_any_nan(sh[2], sh[3]);
            const float wa = ha < nI ? w[ha] : 0.0f, wb = ha + 1 < nI ? w[ha + 1] : 0.0f;
            p[0] = sh[0] * wa, p[1] = sh[1] * wb, p[2] = sh[2] * wa, p[3] = sh[3] * wb;
            dev_round_bf16x2(p[0], p[1]);
            dev_round_bf16x2(p[2], p[3]);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int h = ha + (e & 1), r = g + 8 * (e >> 1);
                if (h < nI) ts[r * (nI + 1) + h] = sh[e] > 0.0f ? p[e] : 0.0f;
            }
        }
        __syncwarp();
        if (lane < 16 && k0 + lane < n) {
            float acc = 0.0f;
            for (int h = 0; h < nI; h++) acc += ts[lane * (nI + 1) + h];
            scratch[(int64_t)i * max_rows + k0 + lane] = dev_round_bf16(acc);
        }
        __syncwarp();   /* ts is written again by the next query */
    }
    if (!ok) *(volatile unsigned *)offgrid = 2u;
}

/* ---- The same scores with the queries as the MMA's N (prefill chunks) -------------------------------------------------

 * k_index_score_mma puts 8 heads of one query in an MMA's N: a score's terms then lie in 4 lanes and 8 head tiles,
 * and are summed by one lane of 16 from shared memory. Here N is 8 queries of one head: lane (g, q) holds D[g][2q],
 * D[g][2q + 1], D[g + 8][2q], D[g + 8][2q + 1], rows g and g + 8 for queries 2q and 2q + 1, and runs the heads in
 * turn, so both chains of a score (its dot over the blocks, then its sum over the heads) are in that lane's registers
 * in the stated order: the same bits, with no shared memory and no lane idle. The 8 queries of an MMA must read the
 * same rows: a query tile runs once for each sequence among its queries (once in a prefill chunk), the others' columns
 * computed and dropped. For steps with runs of queries of one sequence (cu_index_ws.tiles); a decode step's tile would
 * hold 8 sequences, 8 passes for 8 scores, and keeps k_index_score_mma.
 * Block (x, y): rows [IDXT_ROWS x, IDXT_ROWS (x + 1)), warp w rows 16 w .. 16 w + 15, queries IDXT_QUERIES y ..
 * IDXT_QUERIES (y + 1) - 1 of the launch in tiles of 8. A warp decodes its rows' A fragments when the sequence changes,
 * up to the most rows the block's queries of that sequence see (as k_index_score_mma: no row the step has not written
 * is read). No barriers: each warp works alone. */
#define IDXT_WARPS 4
#define IDXT_ROWS (16 * IDXT_WARPS)
#ifndef IDXT_QUERIES
#define IDXT_QUERIES 16   /* run 165, a launch of 512 queries over 32K rows: 16 / 32 / 64 a block 2.66 / 2.75 / 2.87 ms */
#endif
#ifndef IDXT_MIN_BLOCKS
#define IDXT_MIN_BLOCKS 1   /* blocks an SM that ptxas must leave room for (__launch_bounds__' second argument) */
#endif

/* A lane's B fragments of one head for all NB blocks: its 8 NB bytes in fragment order (qcode_at). */
template <int NB>
__device__ __forceinline__ void load_qfrags(const int8_t *p, uint32_t (&B)[NB][2]) {
    if constexpr (NB == 1) {
        const uint2 v = *(const uint2 *)p;
        B[0][0] = v.x; B[0][1] = v.y;
    } else {
#pragma unroll
        for (int k = 0; k < NB / 2; k++) {
            const uint4 v = *(const uint4 *)(p + 16 * k);
            B[2 * k][0] = v.x; B[2 * k][1] = v.y; B[2 * k + 1][0] = v.z; B[2 * k + 1][1] = v.w;
        }
    }
}

/* NB consecutive floats (the units of a query head's blocks). */
template <int NB>
__device__ __forceinline__ void load_units(const float *p, float (&u)[NB]) {
    if constexpr (NB % 4 == 0) {
#pragma unroll
        for (int k = 0; k < NB / 4; k++) {
            const float4 v = *(const float4 *)(p + 4 * k);
            u[4 * k] = v.x; u[4 * k + 1] = v.y; u[4 * k + 2] = v.z; u[4 * k + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < NB; k++) u[k] = p[k];
    }
}

template <int NB>
__global__ void __launch_bounds__(IDXT_WARPS * 32, IDXT_MIN_BLOCKS) k_index_score_tiles(cu_kvlay il, const int8_t *qc, const float *qu, const float *wi,
                                                                        const int64_t *pos, const int32_t *item_of,
                                                                        const cu_seq_layer *sl, int t0, int nq, int nI, int K,
                                                                        int64_t max_rows, float *scratch, unsigned *offgrid) {
    dev_grid_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int cI = 32 * NB;
    const int64_t k0 = (int64_t)blockIdx.x * IDXT_ROWS + 16 * warp;
    const int i0 = IDXT_QUERIES * (int)blockIdx.y, i1 = i0 + IDXT_QUERIES < nq ? i0 + IDXT_QUERIES : nq;
    uint32_t A[NB][4];
    float uk[NB][2];
    bool ok = true;
    int held = -1;   /* the sequence whose rows A holds */
    for (int j0 = i0; j0 < i1; j0 += 8) {
        /* lane j < 8 describes query j0 + j: its sequence, the rows it sees, whether it needs scores here */
        const int jl = j0 + (lane & 7) < i1 ? j0 + (lane & 7) : i1 - 1;
        const int item_l = item_of[t0 + jl];
        const int64_t n_l = (pos[t0 + jl] + 1) / 4;
        unsigned todo = __ballot_sync(FULL_MASK, lane < 8 && j0 + lane < i1 && n_l > K && k0 < n_l);   /* warp-uniform */
        while (todo) {
            const int item = __shfl_sync(FULL_MASK, item_l, __ffs(todo) - 1);
            const unsigned pass = todo & __ballot_sync(FULL_MASK, lane < 8 && item_l == item);
            todo &= ~pass;
            if (item != held) {   /* the most rows the block's queries of this sequence see */
                int64_t n_load = 0;
                for (int j = i0 + lane; j < i1; j += 32)
                    if (item_of[t0 + j] == item && (pos[t0 + j] + 1) / 4 > n_load) n_load = (pos[t0 + j] + 1) / 4;
                for (int off = 16; off > 0; off >>= 1) {
                    const int64_t o = __shfl_xor_sync(FULL_MASK, n_load, off);
                    n_load = o > n_load ? o : n_load;
                }
                index_row_frags<NB>(il, sl[item].irows, k0, n_load, A, uk, ok);
                held = item;
            }
            /* lane (g, q): B column g = query j0 + g (clamped: a column past the launch is computed and dropped), D
             * columns 2q, 2q + 1 = queries j0 + 2q, j0 + 2q + 1 */
            const int jb = j0 + g < i1 ? j0 + g : i1 - 1;
            const int ja = j0 + 2 * q < i1 ? j0 + 2 * q : i1 - 1, jc = j0 + 2 * q + 1 < i1 ? j0 + 2 * q + 1 : i1 - 1;
            const int8_t *qb = qc + (int64_t)(t0 + jb) * nI * cI + 8 * NB * q;
            const float *ua_p = qu + (int64_t)(t0 + ja) * nI * NB, *uc_p = qu + (int64_t)(t0 + jc) * nI * NB;
            const float *wa_p = wi + (int64_t)(t0 + ja) * nI, *wc_p = wi + (int64_t)(t0 + jc) * nI;
            float acc[4] = { 0.0f, 0.0f, 0.0f, 0.0f };   /* e: row g + 8 (e >> 1), query 2q + (e & 1) */
            for (int h = 0; h < nI; h++) {
                uint32_t B[NB][2];
                float ua[NB], uc[NB];
                load_qfrags<NB>(qb + (int64_t)h * cI, B);
                load_units<NB>(ua_p + (int64_t)h * NB, ua);
                load_units<NB>(uc_p + (int64_t)h * NB, uc);
                const float wa = wa_p[h], wc = wc_p[h];
                float dot[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll
                for (int b = 0; b < NB; b++) {
                    float S[4];
                    mma_s8_f32(S, A[b][0], A[b][1], A[b][2], A[b][3], B[b][0], B[b][1]);
                    dot[0] = fmaf(S[0], ua[b] * uk[b][0], dot[0]);   /* row g,     query 2q */
                    dot[1] = fmaf(S[1], uc[b] * uk[b][0], dot[1]);   /* row g,     query 2q + 1 */
                    dot[2] = fmaf(S[2], ua[b] * uk[b][1], dot[2]);   /* row g + 8, query 2q */
                    dot[3] = fmaf(S[3], uc[b] * uk[b][1], dot[3]);   /* row g + 8, query 2q + 1 */
                }
                /* s_h = bf16(dot) (a NaN is only compared, never kept), then bf16(s_h w); two roundings an instruction */
                float sh[4] = { dot[0], dot[1], dot[2], dot[3] };
                dev_round_bf16x2_any_nan(sh[0], sh[1]);
                dev_round_bf16x2_any_nan(sh[2], sh[3]);
                float p[4] = { sh[0] * wa, sh[1] * wc, sh[2] * wa, sh[3] * wc };
                dev_round_bf16x2(p[0], p[1]);
                dev_round_bf16x2(p[2], p[3]);
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (sh[e] > 0.0f) acc[e] += p[e];
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = j0 + 2 * q + (e & 1);
                const int64_t k = k0 + g + 8 * (e >> 1);
                if (j < i1 && (pass >> (2 * q + (e & 1)) & 1u) && k < (pos[t0 + j] + 1) / 4)
                    scratch[(int64_t)j * max_rows + k] = dev_round_bf16(acc[e]);
            }
        }
    }
    if (!ok) *(volatile unsigned *)offgrid = 2u;
}

template <int NB>
static void launch_score_tiles(cu_stream st, cu_kvlay il, const int8_t *qc, const float *qu, const float *wi, const int64_t *pos,
                              const int32_t *item_of, const cu_seq_layer *sl, int t0, int n, int nI, int K, int64_t n_rows,
                              int64_t max_rows, float *scratch, unsigned *offgrid) {
    const int64_t row_blocks = (n_rows + IDXT_ROWS - 1) / IDXT_ROWS;
    k_index_score_tiles<NB><<<dim3((unsigned)row_blocks, (unsigned)((n + IDXT_QUERIES - 1) / IDXT_QUERIES)), IDXT_WARPS * 32, 0,
                              (cudaStream_t)st>>>(il, qc, qu, wi, pos, item_of, sl, t0, n, nI, K, max_rows, scratch, offgrid);
}

template <int NB>
static int launch_score_mma(cu_stream st, cu_kvlay il, const int8_t *qc, const float *qu, const float *wi, const int64_t *pos,
                            const int32_t *item_of, const cu_seq_layer *sl, int t0, int n, int nI, int K, int64_t n_rows,
                            int64_t max_rows, float *scratch, unsigned *offgrid) {
    const size_t smem = sizeof(float) * IDXM_WARPS * 16 * (size_t)(nI + 1);
    if (smem > 48 * 1024 &&
        cudaFuncSetAttribute(k_index_score_mma<NB>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return -1;
    const int64_t row_blocks = (n_rows + IDXM_ROWS - 1) / IDXM_ROWS;
    k_index_score_mma<NB><<<dim3((unsigned)row_blocks, (unsigned)((n + IDXM_QUERIES - 1) / IDXM_QUERIES)), IDXM_WARPS * 32, smem,
                            (cudaStream_t)st>>>(il, qc, qu, wi, pos, item_of, sl, t0, n, nI, K, max_rows, scratch, offgrid);
    return 0;
}

extern "C" int cu_index_select(cu_stream st, int official, cu_index_ws iw, cu_kvlay ilay, const float *qi, const float *wi,
                               const int64_t *pos, const int32_t *item_of, const cu_seq_layer *sl, int T, int nI, int cI, int K,
                               int64_t n_rows, int64_t max_rows, float *scratch, int32_t *sel, int32_t *n_sel) {
    const int NB = cI / 32;
    const bool mma = official && iw.mma && iw.qc && iw.qu && iw.offgrid && cI % 32 == 0 && (NB == 1 || NB == 2 || NB == 4 || NB == 8);
    const size_t smem = index_score_smem(nI, cI);
    if (!mma && smem > 48 * 1024 &&
        cudaFuncSetAttribute(k_index_score, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return -1;
    const int64_t row_blocks = (n_rows + IDX_ROWS - 1) / IDX_ROWS;
    if (mma && n_rows > K && T > 0) {
        const int64_t heads = (int64_t)T * nI;
        k_index_qcodes<<<(unsigned)((heads + 7) / 8), 256, 0, (cudaStream_t)st>>>(qi, heads, cI, iw.qc, iw.qu, iw.offgrid);
    }
    /* CU_INDEX_CHUNK queries per launch share the score scratch: its size does not grow with the prompt */
    for (int t0 = 0; t0 < T; t0 += CU_INDEX_CHUNK) {
        const int n = T - t0 < CU_INDEX_CHUNK ? T - t0 : CU_INDEX_CHUNK;
        if (row_blocks > 0 && n_rows > K) {
            if (mma && iw.tiles) {
                switch (NB) {
                case 1: launch_score_tiles<1>(st, ilay, iw.qc, iw.qu, wi, pos, item_of, sl, t0, n, nI, K, n_rows, max_rows, scratch, iw.offgrid); break;
                case 2: launch_score_tiles<2>(st, ilay, iw.qc, iw.qu, wi, pos, item_of, sl, t0, n, nI, K, n_rows, max_rows, scratch, iw.offgrid); break;
                case 4: launch_score_tiles<4>(st, ilay, iw.qc, iw.qu, wi, pos, item_of, sl, t0, n, nI, K, n_rows, max_rows, scratch, iw.offgrid); break;
                default: launch_score_tiles<8>(st, ilay, iw.qc, iw.qu, wi, pos, item_of, sl, t0, n, nI, K, n_rows, max_rows, scratch, iw.offgrid); break;
                }
            } else if (mma) {
                int rc;
                switch (NB) {
                case 1: rc = launch_score_mma<1>(st, ilay, iw.qc, iw.qu, wi, pos, item_of, sl, t0, n, nI, K, n_rows, max_rows, scratch, iw.offgrid); break;
                case 2: rc = launch_score_mma<2>(st, ilay, iw.qc, iw.qu, wi, pos, item_of, sl, t0, n, nI, K, n_rows, max_rows, scratch, iw.offgrid); break;
                case 4: rc = launch_score_mma<4>(st, ilay, iw.qc, iw.qu, wi, pos, item_of, sl, t0, n, nI, K, n_rows, max_rows, scratch, iw.offgrid); break;
                default: rc = launch_score_mma<8>(st, ilay, iw.qc, iw.qu, wi, pos, item_of, sl, t0, n, nI, K, n_rows, max_rows, scratch, iw.offgrid); break;
                }
                if (rc) return rc;
            } else
                k_index_score<<<dim3((unsigned)row_blocks, n), IDX_SCORE_THREADS, smem, (cudaStream_t)st>>>(
                    official, ilay, qi, wi, pos, item_of, sl, t0, nI, cI, K, max_rows, scratch);
        }
        cu_index_topk(st, pos, t0, n, K, n_rows, max_rows, scratch, iw.split, iw.split_words, sel, n_sel);
    }
    return 0;
}
