/* The streaming path of the OFFICIAL FP8/FP4 tensor-core linears for up to 8 tokens (issue 18: decode), whose every
 * output element has the bits of k_mma.cu's small-tile kernel (cu_mma_stream.h).
 *
 * ---- Why (byte and latency arithmetic) ----
 *   A decode step streams each weight once; the H200 reads ~4.2 TB/s, ~32 GB/s an SM (132 SMs). By Little's law an
 *   SM needs bandwidth x latency in flight: ~32 GB/s x ~1 us (a loaded HBM read) = 32 KB, continuously. k_mma.cu's
 *   decode blocks (16 rows, 4 warps, four chunks' loads a lane in registers) hold 8 KB (FP4) in flight, and only
 *   between a prologue of dependent loads (the plan, the expert's dsv4_weight, the token rows) and their compute:
 *   a launch is a few waves of short blocks each ramping up and down, 0.84-1.0 TB/s measured (ncu, run 40).
 *   Here a persistent grid (as many blocks as fit, at most 4 an SM) walks a list of work items, each item one
 *   16-row slab of one weight (of one expert tile, of one of a pair's two weights) over all its columns, block b
 *   taking items b, b + G, b + 2G, ... (G blocks). A block's items are one flat sequence of rounds; a round is 512
 *   columns of the slab: 4 chunks of 128, one for each warp (4 KB of FP4 weight bytes, 8 KB of FP8), plus the
 *   round's scale bytes, activation bytes (T tokens x 512) and activation scales. Rounds go global -> shared by
 *   cp.async (16-byte cp.async.cg for weights and activations, L1 bypassed; 4-byte cp.async.ca for scales) into a
 *   ring of ST_STAGES = 6 stages, ST_STAGES - 1 rounds ahead of the one being computed, across item boundaries: an
 *   item's first rounds are in flight while the previous item's last ones are computed, so there is no ramp-down
 *   between items and the metadata chase of the next item (at most two dependent loads, L1/L2 hits) overlaps five
 *   rounds in flight. In flight per block: 5 rounds = 20 KB (FP4) / 40 KB (FP8) of weights. Shared memory a stage:
 *   FP4 experts 9,088 B (room for 8 tokens), FP8 at T = 1 9,120 B, at T = 8 12,816 B; 6 stages + 1.5 KB -> 4, 4
 *   and 2 blocks an SM (80 registers a thread do not limit it) -> 80, 160 and 80 KB of weights in flight an SM,
 *   2.5-5x the 32 KB. One __syncthreads a round (the stage's copies visible; the stage refilled next was consumed
 *   one round before), one more at an item's end (the partials' hand-over).
 *   Instructions, not bytes, may then bound FP4: a round (4 KB) costs its 4 warps ~200 instructions each for the
 *   16 E2M1 -> E4M3 conversions, scale decodes, 4 MMAs and 16 fmaf of a chunk (k_mma.cu's work, unchanged) plus
 *   ~100 a warp for the copies and the loop: ~1,200 warp instructions per 4 KB, against an SM's ~7,900 per us
 *   (4 schedulers at 1.98 GHz): ~26 GB/s an SM, ~3.4 TB/s at most. FP8 (8 KB a round, ~400 instructions) is far
 *   from it.
 *   Not done (yet): splitting a slab's four partials over blocks for weights of few slabs (wq_a: 64 slabs for 132
 *   SMs); the persistent grid gives such a weight one block per slab with 40 KB in flight each.
 *
 * ---- The order, and why it is the same as k_mma.cu's ----
 *   k_mma.cu (top comment) fixes y = ((p0 + p1) + p2) + p3, partial p the fmaf chain from 0.0f over its chunks
 *   c = p, p + 4, p + 8, ... in increasing c, of (chunk c's fresh fragment: FP8 4 chained MMAs j = 0..3; FP4 one
 *   MMA per 32-column scale block, blocks in increasing order) x (weight scale x activation scale). Here warp p of
 *   the block computes partial p too: round r gives it chunk c = 4r + p, rounds in increasing r, so its chunks come
 *   in the same order and feed the same fmaf chain from 0.0f; at the item's last round warps 1..3 hand their
 *   partials to warp 0 through shared memory, which adds them as ((p0 + p1) + p2) + p3 and stores (BF16-rounded
 *   when asked, as k_mma.cu's epilogue). Each MMA gets the very operands of k_mma.cu's: the stage holds byte
 *   copies of the rows' and tokens' bytes, and lane (g, q) reads from it exactly the words its fragment takes
 *   there (FP8: the 32 bytes [32q, 32q + 32) of rows g, g + 8 and of token g, MMA j their words 2j, 2j + 1; FP4: for
 *   block j the weight word 16j + 4q of rows g, g + 8 and the activation bytes 32j + 8q .. + 7 of token g);
 *   rows past the weight and tokens past T are zeros with scale 0 as there (their outputs are never stored; an
 *   MMA element depends on its own row and column only). The scales are the same bytes decoded by the same
 *   dev_e8m0 and multiplied in the same order (sw * sx).
 *
 * ---- Stage layout (bytes; rows padded so that a warp's fragment reads hit distinct banks) ----
 *   W:  16 rows x ST_WLD (FP4 272 = 256 + 16, FP8 528 = 512 + 16): the round's 512 columns of each slab row.
 *   X:  XT tokens x ST_XLD (FP4 544 = 512 + 32, FP8 528): the round's 512 activation bytes of each token (XT = T
 *       for a plain linear, 8 for experts).
 *   XS: 8 tokens x 4 floats: the activation scales of the round's 4 chunks.
 *   WS: FP4 16 rows x 4 words (word p = the 4 scale bytes of chunk 4r + p), FP8 2 words (the scale rows of the
 *       slab's first and last row, bytes 4r .. 4r + 3: the round's 4 chunks; a slab may straddle a 128-row block
 *       when the view's row0 is not a multiple of 16).
 *   Only bytes inside the weight / activations are copied (rows < N, chunks < ceil(K/128), FP4 blocks < K/32,
 *   tokens < T); what is never copied is never read. Scales by 4-byte cp.async when the scale rows are word-aligned
 *   (scale pointer and scale_cols multiples of 4: every weight of the model), else byte loads stored to shared
 *   memory (correct, slower: the block waits for them). FP4 data not 16-byte aligned (allowed: 4) takes four
 *   4-byte cp.async a piece. */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_mma.h"
#include "backend/cuda/cu_mma_frag.cuh"
#include "backend/cuda/cu_mma_stream.h"
#include "model/expert_place.h"
extern "C" {
#include "util/error.h"
}

#define ST_WARPS 4    /* = k_mma.cu's MMA_PARTS: warp p computes partial p */
#define ST_THREADS (32 * ST_WARPS)
#define ST_STAGES 6   /* rounds in the ring: ST_STAGES - 1 in flight while one is computed */
#define ST_MAXT 8     /* tokens: one n8 column */
#define ST_BLOCKS_PER_SM 4

/* -DDSV4_STREAM_BUG=1: the first MMA of every chunk (FP8) / block (FP4) takes the activation's two words swapped
 * (test_gpu_stream must fail); =2: the partials added as ((p0 + p2) + p1) + p3 -- the same value in exact
 * arithmetic, other bits sometimes (it must fail too); =3: the pipeline waits for one cp.async group too few (a
 * race on the GPU; the CPU shim lands a copy only at its wait, so it reads the poison there). Never in a real build. */
#if defined(DSV4_STREAM_BUG) && DSV4_STREAM_BUG == 1
#define ST_B01(lo, hi) hi, lo
#else
#define ST_B01(lo, hi) lo, hi
#endif

/* ---- PTX (tools/gpu/shim/shim_stream.sh replaces this section by C++ of the same definitions) ---- */

/* 16 bytes global -> shared, asynchronously, L2 only (.cg). dst, src 16-byte aligned. */
__device__ __forceinline__ void st_cp16(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(__cvta_generic_to_global(src)) : "memory");
}
/* 4 bytes global -> shared, asynchronously (.ca: the only form for 4 bytes). dst, src 4-byte aligned. */
__device__ __forceinline__ void st_cp4(void *dst, const void *src) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(d), "l"(__cvta_generic_to_global(src)) : "memory");
}
__device__ __forceinline__ void st_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Every one of this thread's groups but the newest n complete. */
template <int n> __device__ __forceinline__ void st_wait(void) { asm volatile("cp.async.wait_group %0;" ::"n"(n) : "memory"); }

/* ---- end of PTX ---- */

template <int FP4> struct st_lay {
    static constexpr int wld = FP4 ? 272 : 528;   /* bytes a weight row of a stage */
    static constexpr int xld = FP4 ? 544 : 528;   /* bytes a token of a stage */
    static constexpr int wbytes = 16 * wld;
    static constexpr int xsbytes = ST_MAXT * 4 * 4;
    static constexpr int wsbytes = FP4 ? 16 * 4 * 4 : 16;
    static int stage(int xt) { return wbytes + xt * xld + xsbytes + wsbytes; }
};

/* The launch's arguments: a plain linear (pair: nz = 2) when experts_a is NULL, else the experts of a plan. */
struct st_args {
    dsv4_weight wa, wb;                        /* plain: the weights */
    float *ya, *yb;
    int ldya, ldyb;
    int slabs_a, slabs_b;                      /* plain: 16-row slabs of each weight */
    const dsv4_weight *ea, *eb;                /* experts (NULL: plain) */
    cu_moe_plan plan;
    int rows, x_by_pair, max_tiles, slabs;     /* experts: rows of each, slabs = ceil(rows / 16); ldya their ldy */
    int nz;
    const uint8_t *xq;
    const float *xs;
    int ldq, lds, T, K, out_bf16, xt, stage;   /* T: plain; xt: tokens a stage holds; stage: bytes a stage */
};

/* One work item: a 16-row slab of one weight over its tokens. */
struct st_item {
    const uint8_t *wd, *sc;
    int sc_cols, row0, N, rb;   /* weight rows N (rows past N: zeros), slab rows [rb, rb + 16) */
    int T, in_base, out_base;   /* tokens n < T read input row in_rows[in_base + n] (or in_base + n), write out_base + n */
    const int32_t *in_rows;
    float *y;
    int ldy, absent;            /* absent: an expert without data (EP_ABSENT_ROW rows) */
};

__device__ __forceinline__ int64_t st_in_row(const st_item &it, int n) {
    return it.in_rows ? it.in_rows[it.in_base + n] : (int64_t)it.in_base + n;
}

/* The live items: plain, every slab of both weights; experts, nz x n_tiles x slabs (tiles past n_tiles none). */
__device__ __forceinline__ int st_live(const st_args &a) {
    if (!a.ea) return a.slabs_a + a.slabs_b;
    int nt = *a.plan.n_tiles;
    if (nt > a.max_tiles) nt = a.max_tiles;
    return a.nz * nt * a.slabs;
}

/* Item k's description (every thread computes the same; the loads are broadcasts). */
__device__ __forceinline__ st_item st_describe(const st_args &a, int k, int live) {
    st_item it;
    if (!a.ea) {
        const int z = k >= a.slabs_a;
        const dsv4_weight &w = z ? a.wb : a.wa;
        it.wd = (const uint8_t *)w.data;
        it.sc = w.scale;
        it.sc_cols = w.scale_cols;
        it.row0 = w.row0;
        it.N = w.rows;
        it.rb = 16 * (z ? k - a.slabs_a : k);
        it.T = a.T;
        it.in_base = 0;
        it.out_base = 0;
        it.in_rows = NULL;
        it.y = z ? a.yb : a.ya;
        it.ldy = z ? a.ldyb : a.ldya;
        it.absent = 0;
        return it;
    }
    const int per_z = live / a.nz, z = k / per_z, rest = k - z * per_z, tile = rest / a.slabs;
    const int e = a.plan.tile_expert[tile], p0 = a.plan.tile_first[tile], n = a.plan.tile_count[tile];
    const dsv4_weight w = (z ? a.eb : a.ea)[e];
    it.wd = (const uint8_t *)w.data;
    it.sc = w.scale;
    it.sc_cols = w.scale_cols;
    it.row0 = w.row0;
    it.N = a.rows;
    it.rb = 16 * (rest - tile * a.slabs);
    it.T = n;
    it.in_base = p0;
    it.out_base = p0;
    it.in_rows = a.x_by_pair ? NULL : a.plan.pair_token;
    it.y = z ? a.yb : a.ya;
    it.ldy = a.ldya;
    it.absent = w.data == NULL;
    return it;
}

/* An absent expert's item: its rows of its tokens are EP_ABSENT_ROW (k_mma.cu's k_mma_expert writes the same). */
__device__ __forceinline__ void st_absent(const st_item &it) {
    for (int i = threadIdx.x; i < 16 * it.T; i += blockDim.x) {
        const int r = it.rb + i % 16;
        if (r < it.N) it.y[((int64_t)it.out_base + i / 16) * it.ldy + r] = EP_ABSENT_ROW;
    }
}

/* The issuing side's view of its current item: the description and this thread's sources, as of round 0 (round r
 * adds its byte offset), NULL where the row or token does not exist. Thread tid copies:
 *   FP4 weight pieces (16 bytes = one 32-column block of a row): rows tid / 16 and tid / 16 + 8, piece tid % 16 of
 *       the row's 256 round bytes (chunk 4r + piece / 4, block piece % 4), at row byte 256 r + 16 piece;
 *   FP8 weight pieces: rows tid / 32 + 4i (i < 4), piece tid % 32 of the row's 512 round bytes, at 512 r + 16 piece;
 *   weight scales (tid < 64, FP4): row tid / 4, chunk 4r + tid % 4's word at byte 16 r + 4 (tid % 4) of the row's;
 *       (tid < 2, FP8): the scale row of the slab's first / last row, bytes 4r .. 4r + 3;
 *   activation pieces: tokens tid / 32 and tid / 32 + 4, piece tid % 32 of the token's 512 round bytes;
 *   activation scales (tid < 32): token tid / 4, chunk 4r + tid % 4.
 * A piece at round byte offset o of a row of B bytes exists iff o < B (FP4: a piece is a whole scale block, B = K/2
 * a multiple of 16; FP8 and activations: pieces of 16 in chunks of 128, K a multiple of 128 (FP8) or of 32 (FP4,
 * whose activation pieces come in pairs per 32-column block, both present iff the block is)). */
struct st_src {
    st_item it;
    const uint8_t *w[4], *s, *x[2];
    const float *xsp;
};

template <int FP4>
__device__ __forceinline__ st_src st_source(const st_args &a, int k, int live) {
    st_src s;
    s.it = st_describe(a, k, live);
    const st_item &it = s.it;
    const int tid = threadIdx.x;
    for (int i = 0; i < 4; i++) s.w[i] = NULL;
    s.s = NULL;
    s.x[0] = s.x[1] = NULL;
    s.xsp = NULL;
    if (it.absent) return s;
    if constexpr (FP4) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int R = it.rb + (tid >> 4) + 8 * i;
            if (R < it.N) s.w[i] = it.wd + (int64_t)R * (a.K / 2) + 16 * (tid & 15);
        }
        const int R = it.rb + (tid >> 2);
        if (tid < 64 && R < it.N) s.s = it.sc + (int64_t)(it.row0 + R) * it.sc_cols + 4 * (tid & 3);
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int R = it.rb + (tid >> 5) + 4 * i;
            if (R < it.N) s.w[i] = it.wd + (int64_t)R * a.K + 16 * (tid & 31);
        }
        const int R = tid ? min(it.rb + 15, it.N - 1) : it.rb;
        if (tid < 2) s.s = it.sc + (int64_t)((it.row0 + R) / 128) * it.sc_cols;
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int n = (tid >> 5) + 4 * i;
        if (n < it.T) s.x[i] = a.xq + st_in_row(it, n) * a.ldq + 16 * (tid & 31);
    }
    if (tid < 32 && (tid >> 2) < it.T) s.xsp = a.xs + st_in_row(it, tid >> 2) * a.lds + (tid & 3);
    return s;
}

/* Round r of the item into stage buffer `buf` (this thread's share of the copies; the caller commits the group). */
template <int FP4>
__device__ __forceinline__ void st_issue(const st_args &a, const st_src &s, int r, uint8_t *buf) {
    typedef st_lay<FP4> L;
    const st_item &it = s.it;
    const int tid = threadIdx.x, K = a.K, nchunk = (K + 127) / 128;
    uint8_t *W = buf, *X = buf + L::wbytes, *XS = X + a.xt * L::xld, *WS = XS + L::xsbytes;
    const bool s4 = ((uintptr_t)it.sc & 3) == 0 && (it.sc_cols & 3) == 0;
    if constexpr (FP4) {
        const int o = 256 * r + 16 * (tid & 15);
        const bool w16 = ((uintptr_t)it.wd & 15) == 0;
        if (o < K / 2)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                if (!s.w[i]) continue;
                uint8_t *dst = W + ((tid >> 4) + 8 * i) * L::wld + 16 * (tid & 15);
                if (w16) st_cp16(dst, s.w[i] + 256 * r);
                else
                    for (int v = 0; v < 4; v++) st_cp4(dst + 4 * v, s.w[i] + 256 * r + 4 * v);
            }
        const int c = 4 * r + (tid & 3);
        if (s.s && c < nchunk) {   /* the word of (row tid / 4, chunk c): its blocks' scale bytes */
            if (s4) st_cp4(WS + 4 * tid, s.s + 16 * r);
            else {
                const int nb = min(4, (K - 128 * c) / 32);
                uint32_t v = 0;
                for (int j = 0; j < nb; j++) v |= (uint32_t)s.s[16 * r + j] << (8 * j);
                *(uint32_t *)(WS + 4 * tid) = v;
            }
        }
    } else {
        const int o = 512 * r + 16 * (tid & 31);
        if (o < K)
#pragma unroll
            for (int i = 0; i < 4; i++)
                if (s.w[i]) st_cp16(W + ((tid >> 5) + 4 * i) * L::wld + 16 * (tid & 31), s.w[i] + 512 * r);
        if (s.s) {   /* tid < 2: chunks 4r .. 4r + 3 of the scale row */
            if (s4) st_cp4(WS + 4 * tid, s.s + 4 * r);
            else {
                uint32_t v = 0;
                for (int j = 0; j < 4 && 4 * r + j < nchunk; j++) v |= (uint32_t)s.s[4 * r + j] << (8 * j);
                *(uint32_t *)(WS + 4 * tid) = v;
            }
        }
    }
    if (512 * r + 16 * (tid & 31) < K)
#pragma unroll
        for (int i = 0; i < 2; i++)
            if (s.x[i]) st_cp16(X + ((tid >> 5) + 4 * i) * L::xld + 16 * (tid & 31), s.x[i] + 512 * r);
    if (s.xsp && 4 * r + (tid & 3) < nchunk) st_cp4(XS + 4 * tid, s.xsp + 4 * r);
}

/* Warp p's chunk c = 4r + p of the item from stage buffer `buf` into its partial acc (k_mma.cu's operations). */
template <int FP4>
__device__ __forceinline__ void st_compute(const st_args &a, const st_item &it, int r, const uint8_t *buf, float (&acc)[4]) {
    typedef st_lay<FP4> L;
    const int lane = threadIdx.x & 31, p = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int K = a.K, nchunk = (K + 127) / 128, c = 4 * r + p;
    if (c >= nchunk) return;
    const uint8_t *W = buf, *X = buf + L::wbytes;
    const float *XS = (const float *)(X + a.xt * L::xld);
    const uint8_t *WS = (const uint8_t *)XS + L::xsbytes;
    const bool v0 = it.rb + g < it.N, v1 = it.rb + g + 8 < it.N, tg = g < it.T;
    float sx[2];
#pragma unroll
    for (int e = 0; e < 2; e++) sx[e] = 2 * q + e < it.T ? XS[(2 * q + e) * 4 + p] : 0.0f;
    if constexpr (FP4) {
        const int nb = min(4, (K - 128 * c) / 32);
        const uint32_t sw0 = v0 ? *(const uint32_t *)(WS + 4 * (4 * g + p)) : 0u;
        const uint32_t sw1 = v1 ? *(const uint32_t *)(WS + 4 * (4 * (g + 8) + p)) : 0u;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (j >= nb) break;
            const uint32_t w0 = v0 ? *(const uint32_t *)(W + g * L::wld + 64 * p + 16 * j + 4 * q) : 0u;
            const uint32_t w1 = v1 ? *(const uint32_t *)(W + (g + 8) * L::wld + 64 * p + 16 * j + 4 * q) : 0u;
            const uint2 b = tg ? *(const uint2 *)(X + g * L::xld + 128 * p + 32 * j + 8 * q) : make_uint2(0, 0);
            const uint32_t a0 = e2m1x4_e4m3(w0), a1 = e2m1x4_e4m3(w1);
            const uint32_t a2 = e2m1x4_e4m3(w0 >> 16), a3 = e2m1x4_e4m3(w1 >> 16);
            const float s0 = dev_e8m0((uint8_t)(sw0 >> (8 * j))), s1 = dev_e8m0((uint8_t)(sw1 >> (8 * j)));
            float f[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
            mma_e4m3(f, a0, a1, a2, a3, ST_B01(b.x, b.y));
            acc[0] = fmaf(f[0], s0 * sx[0], acc[0]);
            acc[1] = fmaf(f[1], s0 * sx[1], acc[1]);
            acc[2] = fmaf(f[2], s1 * sx[0], acc[2]);
            acc[3] = fmaf(f[3], s1 * sx[1], acc[3]);
        }
    } else {
        const uint4 z = make_uint4(0, 0, 0, 0);
        const uint8_t *r0 = W + g * L::wld + 128 * p + 32 * q, *r1 = W + (g + 8) * L::wld + 128 * p + 32 * q;
        const uint8_t *xb = X + g * L::xld + 128 * p + 32 * q;
        const uint4 r0l = v0 ? *(const uint4 *)r0 : z, r0h = v0 ? *(const uint4 *)(r0 + 16) : z;
        const uint4 r1l = v1 ? *(const uint4 *)r1 : z, r1h = v1 ? *(const uint4 *)(r1 + 16) : z;
        const uint4 bl = tg ? *(const uint4 *)xb : z, bh = tg ? *(const uint4 *)(xb + 16) : z;
        /* the scale row of rows g, g + 8: word 0 holds the slab's first row's, word 1 its last row's */
        const int s_first = (it.row0 + it.rb) / 128;
        float sw[2];
        sw[0] = v0 ? dev_e8m0(WS[4 * ((it.row0 + it.rb + g) / 128 - s_first) + p]) : 0.0f;
        sw[1] = v1 ? dev_e8m0(WS[4 * ((it.row0 + it.rb + g + 8) / 128 - s_first) + p]) : 0.0f;
        float f[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
        mma_e4m3(f, r0l.x, r1l.x, r0l.y, r1l.y, ST_B01(bl.x, bl.y));   /* j = 0: words 0, 1 */
        mma_e4m3(f, r0l.z, r1l.z, r0l.w, r1l.w, bl.z, bl.w);           /* j = 1: words 2, 3 */
        mma_e4m3(f, r0h.x, r1h.x, r0h.y, r1h.y, bh.x, bh.y);           /* j = 2: words 4, 5 */
        mma_e4m3(f, r0h.z, r1h.z, r0h.w, r1h.w, bh.z, bh.w);           /* j = 3: words 6, 7 */
#pragma unroll
        for (int e = 0; e < 4; e++) acc[e] = fmaf(f[e], sw[e >> 1] * sx[e & 1], acc[e]);
    }
}

/* The issuing cursor's step: round ir of item ik's slab into the stage at buf, then the next round (after an item's
 * last round: the block's next present item, writing each absent expert's rows on the way). */
template <int FP4>
__device__ __forceinline__ void st_issue_next(const st_args &a, st_src &src, int &ik, int &ir, int R, int G, int live, uint8_t *buf) {
    st_issue<FP4>(a, src, ir, buf);
    if (++ir < R) return;
    ir = 0;
    for (ik += G; ik < live; ik += G) {
        src = st_source<FP4>(a, ik, live);
        if (!src.it.absent) break;
        st_absent(src.it);
    }
}

/* The persistent kernel (the file's top comment). Two cursors walk the block's items k = blockIdx.x + G j: the
 * issuing one ST_STAGES - 1 rounds ahead (skipping absent experts, whose rows it writes), the computing one. */
template <int FP4>
__global__ void __launch_bounds__(ST_THREADS) k_mma_stream(st_args a) {
    dev_grid_wait();
    __shared__ float red[ST_WARPS - 1][4][32];
    extern __shared__ __align__(16) uint8_t st_smem[];
    const int live = st_live(a), G = gridDim.x, R = ((a.K + 127) / 128 + 3) / 4;
    const int lane = threadIdx.x & 31, part = threadIdx.x >> 5;
    /* the issuing cursor: item ik (index into the launch's list), round ir */
    int ik = blockIdx.x, ir = 0;
    st_src src;
    for (;; ik += G) {
        if (ik >= live) break;
        src = st_source<FP4>(a, ik, live);
        if (!src.it.absent) break;
        st_absent(src.it);
    }
    /* the computing cursor: item ck, round cr */
    int ck = blockIdx.x, cr = 0;
    st_item cur;
    for (;; ck += G) {
        if (ck >= live) break;
        cur = st_describe(a, ck, live);
        if (!cur.absent) break;
    }
    for (int s = 0; s < ST_STAGES - 1; s++) {
        if (ik < live) st_issue_next<FP4>(a, src, ik, ir, R, G, live, st_smem + (size_t)s * a.stage);
        st_commit();
    }
    float acc[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    for (int stage = 0; ck < live; stage = stage + 1 == ST_STAGES ? 0 : stage + 1) {
#if defined(DSV4_STREAM_BUG) && DSV4_STREAM_BUG == 3
        st_wait<ST_STAGES - 1>();   /* the bug: one group too few waited for (the round's copies may not have landed) */
#else
        st_wait<ST_STAGES - 2>();   /* this thread's copies of the round to compute have landed */
#endif
        __syncthreads();            /* everyone's; and the stage refilled below was consumed one round ago */
        if (ik < live) {
            const int fill = stage == 0 ? ST_STAGES - 1 : stage - 1;
            st_issue_next<FP4>(a, src, ik, ir, R, G, live, st_smem + (size_t)fill * a.stage);
        }
        st_commit();
        st_compute<FP4>(a, cur, cr, st_smem + (size_t)stage * a.stage, acc);
        if (++cr == R) {   /* the item's last round: y = ((p0 + p1) + p2) + p3 */
            if (part > 0)
#pragma unroll
                for (int e = 0; e < 4; e++) red[part - 1][e][lane] = acc[e];
            __syncthreads();
            if (part == 0) {
                const int g = lane >> 2, q = lane & 3;
#pragma unroll
                for (int e = 0; e < 4; e++) {
#if defined(DSV4_STREAM_BUG) && DSV4_STREAM_BUG == 2
                    float v = acc[e] + red[1][e][lane];   /* the wrong order: ((p0 + p2) + p1) + p3 */
                    v += red[0][e][lane];
#else
                    float v = acc[e] + red[0][e][lane];
                    v += red[1][e][lane];
#endif
                    v += red[2][e][lane];
                    const int row = cur.rb + g + 8 * (e >> 1), n = 2 * q + (e & 1);
                    if (row < cur.N && n < cur.T) cur.y[((int64_t)cur.out_base + n) * cur.ldy + row] = a.out_bf16 ? dev_round_bf16(v) : v;
                }
            }
#pragma unroll
            for (int e = 0; e < 4; e++) acc[e] = 0.0f;
            cr = 0;
            for (ck += G; ck < live; ck += G) {
                cur = st_describe(a, ck, live);
                if (!cur.absent) break;
            }
        }
    }
    st_wait<0>();
}

/* ---- launch ---- */

/* Blocks for a launch of `items` items: as many as fit on the device (at most ST_BLOCKS_PER_SM an SM, the shared
 * memory decides), never more than the items. 0 when the opt-in to more than 48 KB of shared memory fails. The
 * opt-in is a property of the kernel on the current device: set on every launch (a host call, cheap; once per
 * graph capture) so that every GPU of a --gpus run has it. */
template <int FP4> static int st_grid(int items, size_t smem) {
    if (cudaFuncSetAttribute(k_mma_stream<FP4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    int dev = 0, sms = 0, per = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k_mma_stream<FP4>, ST_THREADS, smem) != cudaSuccess || per < 1) {
        (void)cudaGetLastError();
        return 0;
    }
    if (per > ST_BLOCKS_PER_SM) per = ST_BLOCKS_PER_SM;
    const int64_t g = (int64_t)per * sms;
    return (int)(items < g ? items : g);
}

static int st_launch(cu_stream st, int fp4, st_args &a, int items) {
    if (items <= 0) return 1;
    a.stage = fp4 ? st_lay<1>::stage(a.xt) : st_lay<0>::stage(a.xt);
    const size_t smem = (size_t)ST_STAGES * a.stage;
    const int grid = fp4 ? st_grid<1>(items, smem) : st_grid<0>(items, smem);
    if (!grid) return 0;
    if (fp4) k_mma_stream<1><<<grid, ST_THREADS, smem, (cudaStream_t)st>>>(a);
    else k_mma_stream<0><<<grid, ST_THREADS, smem, (cudaStream_t)st>>>(a);
    return 1;
}

extern "C" int cu_mma_stream_linear(cu_stream st, const dsv4_weight *w_a, float *y_a, int ldy_a, const dsv4_weight *w_b, float *y_b,
                                    int ldy_b, const uint8_t *xq, int ldq, const float *xs, int lds, int T, int out_bf16) {
    if (T < 1 || T > ST_MAXT) return 0;
    st_args a;
    memset(&a, 0, sizeof a);
    a.wa = *w_a;
    a.ya = y_a;
    a.ldya = ldy_a;
    a.slabs_a = (w_a->rows + 15) / 16;
    if (w_b) {
        a.wb = *w_b;
        a.yb = y_b;
        a.ldyb = ldy_b;
        a.slabs_b = (w_b->rows + 15) / 16;
    }
    a.nz = w_b ? 2 : 1;
    a.xq = xq;
    a.xs = xs;
    a.ldq = ldq;
    a.lds = lds;
    a.T = T;
    a.K = w_a->cols;
    a.out_bf16 = out_bf16;
    a.xt = T;
    return st_launch(st, w_a->fmt == WF_FP4, a, a.slabs_a + a.slabs_b);
}

extern "C" int cu_mma_stream_experts(cu_stream st, const dsv4_weight *experts_a, float *y_a, const dsv4_weight *experts_b, float *y_b,
                                     int rows, int cols, int fmt, const cu_moe_plan *plan, int max_tiles, const uint8_t *xq, int ldq,
                                     const float *xs, int lds, int x_by_pair, int ldy, int out_bf16) {
    if (plan->tile > CU_MOE_TILE) return 0;   /* tiles of more than one n8 column: not this kernel's */
    st_args a;
    memset(&a, 0, sizeof a);
    a.ea = experts_a;
    a.eb = experts_b ? experts_b : experts_a;
    a.ya = y_a;
    a.yb = experts_b ? y_b : y_a;
    a.ldya = ldy;
    a.plan = *plan;
    a.rows = rows;
    a.x_by_pair = x_by_pair;
    a.max_tiles = max_tiles;
    a.slabs = (rows + 15) / 16;
    a.nz = experts_b ? 2 : 1;
    a.xq = xq;
    a.xs = xs;
    a.ldq = ldq;
    a.lds = lds;
    a.K = cols;
    a.out_bf16 = out_bf16;
    a.xt = ST_MAXT;
    const int64_t items = (int64_t)a.nz * max_tiles * a.slabs;
    if (items > INT32_MAX) return 0;
    return st_launch(st, fmt == WF_FP4, a, (int)items);
}
