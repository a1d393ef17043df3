/* The large-T path of the OFFICIAL FP8/FP4 linears (issue 18, prefill): a tiled GEMM with shared-memory staging by
 * cp.async, whose every output element has the bits of k_mma.cu's small-tile kernel (cu_mma_gemm.h). Two blocks of
 * the same order: gemm_block on the FP8 tensor cores' mma.sync m16n8k32 e4m3 (three stages in flight; this comment),
 * and hg_block (below, the default since run 101) on the warpgroup's fp16 wgmma in the order in which sm_90 computes
 * that mma.sync.
 *
 * ---- The order (k_mma.cu states it in full) and why it is the same here ----
 *   y = ((p0 + p1) + p2) + p3, partial p the fmaf-sum over its chunks c = p, p + 4, ... in increasing c of
 *   (chunk c's fresh MMA fragment) x (weight scale x activation scale); FP8: one fragment per 128-column chunk,
 *   a chain of 4 MMAs j = 0..3; FP4: one fragment (one MMA) per 32-column scale block, blocks in increasing order.
 *   k_mma.cu gives each partial its own warp and adds them at the end. Here one warp owns all of K for its
 *   sub-tile and walks the chunks partial by partial: c = 0, 4, 8, ..., then 1, 5, 9, ..., then 2, ..., then 3, ...
 *   Each partial still takes its chunks in increasing order with the same fmaf chain from 0.0f, so it ends with
 *   the same bits; when partial p is complete it is folded into y (y = p0, then y = y + p1, y + p2, y + p3: the
 *   same three additions in the same order, an empty partial (K < 4 chunks) folding its 0.0f as k_mma.cu's does).
 *   So only two fragment sets are live (the partial and the chunk's fresh fragment); y waits in shared memory,
 *   each thread its own slots, touched four times per element in all.
 *   Each MMA gets the same operands in the same k positions as in k_mma.cu: the staged tiles are byte copies of
 *   the rows' chunk bytes and every lane reads from them exactly the words its fragment takes in k_mma.cu (FP8:
 *   lane q the 32 bytes [32q, 32q + 32) of its rows and token, MMA j their words 2j, 2j + 1; FP4: for block j the
 *   weight word 16j + 4q and the activation bytes 32j + 8q .. + 7). The MMA computes an element from its own row
 *   and column only, so the tile a token lands in, and its neighbours, change nothing.
 *
 * ---- Tiles ----
 *   A block: 128 weight rows x 128 tokens, 8 warps as 2 (rows) x 4 (tokens), a warp 64 rows x 32 tokens (4 x 4
 *   MMA tiles of 16 x 8). A stage: the block's rows' bytes of one chunk (FP8 128 bytes a row, FP4 64) and its
 *   tokens' 128 activation bytes, rows padded (FP8 144 bytes a row, FP4 weight 80, FP4 activation 160) so that a
 *   warp's fragment loads hit distinct banks. Rows past the weight, tokens past T and FP4 columns past K are
 *   zero-filled (cp.async with source size 0): their products land only in outputs nobody stores. Scales come from
 *   global memory (small, cached) at each chunk. */
#include "backend/cuda/cu_async.cuh"
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_mma.h"
#include "backend/cuda/cu_mma_frag.cuh"
#include "backend/cuda/cu_mma_gemm.h"
#include "backend/cuda/cu_plan_groups.cuh"
#include "model/expert_place.h"
extern "C" {
#include "util/error.h"
}

#define GEMM_BM 128      /* weight rows a block */
#define GEMM_BN 128      /* tokens a block */
#define GEMM_MT 4        /* m16 tiles a warp (64 rows) */
#define GEMM_NT 4        /* n8 tiles a warp (32 tokens) */
#define GEMM_THREADS 256 /* 8 warps: 2 along the rows x 4 along the tokens */
#define GEMM_STAGES 3
/* -DHG_FP4_FOLD=0: the packed FP4 step without the PLAIN fold (hg_chunk), every element through the three-instruction
 * step: the A/B of run 115 (the same bits). */
#ifndef HG_FP4_FOLD
#define HG_FP4_FOLD 1
#endif
/* The warpgroup path's fp16 token tile (hg_smem): core matrices 128 bytes apart along K, 8-token groups a chunk's
 * 128 halves (2,048 bytes) apart; the raw activation bytes it is converted from, 144 bytes a token. */
#define HG_LBO 128
#define HG_SBO 2048
#define HG_BRAW_LD 144

/* -DDSV4_GEMM_BUG=1: the first MMA of a chunk (FP8) / of every block (FP4) takes the activation's two words
 * swapped; =2: the partials folded in the order 3, 2, 1, 0. Each must make test_gpu_gemm fail. Never in a real
 * build. */
#if defined(DSV4_GEMM_BUG) && DSV4_GEMM_BUG == 1
#define GEMM_B01(lo, hi) hi, lo
#else
#define GEMM_B01(lo, hi) lo, hi
#endif
#if defined(DSV4_GEMM_BUG) && DSV4_GEMM_BUG == 2
#define GEMM_PART(pp) (3 - (pp))
#else
#define GEMM_PART(pp) (pp)
#endif

/* ---- PTX ---- */

/* d = A B (acc 0) or d = A B + d (acc 1): the warpgroup's wgmma m64n128k16, fp16 operands, fp32 accumulators. A
 * (64 rows x 16) from registers: warp w of the warpgroup its rows 16 w .. + 15 in mma.m16n8k16's A layout (a0: row g,
 * k 2q, 2q+1; a1: row g + 8; a2 / a3: k + 8). B (16 x 128 tokens) at b in shared memory: no swizzle, K-major, core
 * matrices of 8 tokens x 16 bytes, HG_LBO bytes apart along K and HG_SBO apart along the tokens. d[4 i + e]: n8 tile
 * i, the element mma.sync's d[e] would be (row g or g + 8 of the warp's 16, token 8 i + 2q or + 1). */
__device__ __forceinline__ void hgmma_n128(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, const void *b, int acc) {
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(b);
    const uint64_t desc = (uint64_t)((sa >> 4) & 0x3FFF) | (uint64_t)(HG_LBO >> 4) << 16 | (uint64_t)(HG_SBO >> 4) << 32;
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(acc));
}

/* The same for 64 tokens (wgmma m64n64k16): d[4 i + e], n8 tiles i = 0..7. */
__device__ __forceinline__ void hgmma_n64(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, const void *b, int acc) {
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(b);
    const uint64_t desc = (uint64_t)((sa >> 4) & 0x3FFF) | (uint64_t)(HG_LBO >> 4) << 16 | (uint64_t)(HG_SBO >> 4) << 32;
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(acc));
}

/* ---- end of PTX ---- */

/* Shared-memory layout of a stage, per weight format. */
template <int FP4> struct gemm_smem {
    static constexpr int a_ld = FP4 ? 80 : 144;    /* bytes a weight row: the chunk's 64 / 128 + padding */
    static constexpr int b_ld = FP4 ? 160 : 144;   /* bytes a token: the chunk's 128 + padding */
    static constexpr int a_bytes = GEMM_BM * a_ld, b_bytes = GEMM_BN * b_ld;
    /* then the chunk's scales: 128 tokens' activation scales (fp32), 128 rows' weight scales (FP8: the fp32 value
     * of the row's block scale; FP4: the 4 scale bytes of the row's blocks, byte j block j) */
    static constexpr int sx_off = a_bytes + b_bytes, sw_off = sx_off + 4 * GEMM_BN, stage = sw_off + 4 * GEMM_BM;
    static constexpr int y_floats = GEMM_MT * GEMM_NT * 4 * GEMM_THREADS;   /* y between partials */
    static constexpr int rows_off = GEMM_STAGES * stage + 4 * y_floats;   /* the tile's input rows (gemm_rows) */
    static constexpr int total = rows_off + 4 * GEMM_BN;
};

/* Where the tile's token n (0..127) reads its input row: sm[n] (an expert's pairs: the tile's rows of in_rows, staged
 * in shared memory once a tile by gemm_rows_stage, so that no chunk's loads wait on a global load of their address)
 * or, without in_rows, base + n. */
struct gemm_rows {
    const int32_t *sm;
    int base;
};
__device__ __forceinline__ int64_t gemm_row(const gemm_rows &R, int n) { return R.sm ? R.sm[n] : (int64_t)R.base + n; }
/* The tile's rows (tokens [tok_base, +128) of T reading in_rows[in_base + token], or in_base + token without in_rows)
 * into sm (128 words): threads 0..127, before the barrier that opens the tile. */
__device__ __forceinline__ gemm_rows gemm_rows_stage(int32_t *sm, const int32_t *__restrict__ in_rows, int in_base, int tok_base, int T) {
    if (!in_rows) return gemm_rows{ NULL, in_base + tok_base };
    const int t = threadIdx.x;
    if (t < GEMM_BN) sm[t] = tok_base + t < T ? in_rows[in_base + tok_base + t] : 0;
    return gemm_rows{ sm, 0 };
}

/* Partial p's chunk count and the chunk at position i of the walk (partials in fold order, each in increasing c). */
__device__ __forceinline__ int gemm_part_chunks(int nchunk, int p) { return (nchunk + 3 - p) / 4; }
__device__ __forceinline__ int gemm_chunk_at(int i, int nchunk) {
    for (int pp = 0; pp < 3; pp++) {
        const int p = GEMM_PART(pp), n = gemm_part_chunks(nchunk, p);
        if (i < n) return p + 4 * i;
        i -= n;
    }
    return GEMM_PART(3) + 4 * i;
}

/* Stage the block's weight bytes of chunk c (rows [row_base, +128)) at As, a_ld bytes a row. */
template <int FP4, int THREADS = GEMM_THREADS>
__device__ __forceinline__ void gemm_load_w(uint8_t *As, int a_ld, const uint8_t *__restrict__ wd, int N, int K, int row_base, int c) {
    constexpr int a_units = FP4 ? 4 : 8;   /* 16-byte units of a row's chunk */
    const int a_valid = FP4 ? min(4, (K - 128 * c) / 32) : 8;
    const int64_t wstride = FP4 ? K / 2 : K;
#pragma unroll
    for (int k = 0; k < GEMM_BM * a_units / THREADS; k++) {
        const int u = threadIdx.x + THREADS * k, r = u / a_units, v = u % a_units;
        const bool ok = row_base + r < N && v < a_valid;
        const uint8_t *src = ok ? wd + (row_base + r) * wstride + (FP4 ? 64 : 128) * c + 16 * v : wd;
        cp_async16(As + r * a_ld + 16 * v, src, ok ? 16 : 0);
    }
}
/* Stage the block's tokens' activation bytes of chunk c (tokens [tok_base, +128)) at Bs, b_ld bytes a token. */
template <int THREADS = GEMM_THREADS>
__device__ __forceinline__ void gemm_load_x(uint8_t *Bs, int b_ld, const uint8_t *__restrict__ xq, int ldq, int T, int K,
                                            const gemm_rows &R, int tok_base, int c) {
    const int b_valid = min(8, (K - 128 * c) / 16);
#pragma unroll
    for (int k = 0; k < GEMM_BN * 8 / THREADS; k++) {
        const int u = threadIdx.x + THREADS * k, n = u / 8, v = u % 8;
        const bool ok = tok_base + n < T && v < b_valid;
        const uint8_t *src = ok ? xq + gemm_row(R, n) * ldq + 128 * c + 16 * v : xq;
        cp_async16(Bs + n * b_ld + 16 * v, src, ok ? 16 : 0);
    }
}
/* Both, in gemm_smem's stage layout. */
template <int FP4>
__device__ __forceinline__ void gemm_load(uint8_t *stage, const uint8_t *__restrict__ wd, int N, int K, const uint8_t *__restrict__ xq,
                                          int ldq, int T, const gemm_rows &R, int row_base, int tok_base, int c) {
    typedef gemm_smem<FP4> L;
    gemm_load_w<FP4>(stage, L::a_ld, wd, N, K, row_base, c);
    gemm_load_x(stage + L::a_bytes, L::b_ld, xq, ldq, T, K, R, tok_base, c);
}

/* The scale word thread threadIdx.x stages for chunk c (threads 0..127: token tok_base + t's activation scale;
 * 128..255: row row_base + t - 128's weight scale(s)), fetched a stage ahead and stored after the chunk's MMAs
 * (gemm_scale_store) so that its load latency hides behind them: so the fetch returns loaded words untouched (an
 * FP8 row's raw E8M0 byte, converted by the store; an FP4 row's four bytes by one 32-bit load where aligned) and
 * nothing waits for them before the store. 0 past T / the rows / K. */
template <int FP4>
__device__ __forceinline__ uint32_t gemm_scale_fetch(const dsv4_weight &w, const float *__restrict__ xs, int lds, int T, const gemm_rows &R,
                                                     int row_base, int tok_base, int c) {
    const int t = threadIdx.x;
    if (t < GEMM_BN) return tok_base + t < T ? __float_as_uint(xs[gemm_row(R, t) * lds + c]) : 0u;
    const int r = row_base + t - GEMM_BN;
    if (r >= w.rows) return 0u;
    if constexpr (!FP4) return w.scale[(int64_t)((w.row0 + r) / 128) * w.scale_cols + c];
    const int nb = min(4, (w.cols - 128 * c) / 32);
    const uint8_t *sp = w.scale + (int64_t)(w.row0 + r) * w.scale_cols + 4 * c;
    if (nb == 4 && !((uintptr_t)sp & 3)) return *(const uint32_t *)sp;   /* byte j (little-endian) = block j */
    uint32_t s = 0;   /* a chunk of fewer blocks, or a view whose scale rows are not 4-byte aligned */
#pragma unroll
    for (int j = 0; j < 4; j++)
        if (j < nb) s |= (uint32_t)sp[j] << (8 * j);
    return s;
}
/* At the stage's scale words: sx (128 tokens) then sw (128 rows), thread t's word t; an FP8 row's byte (rows
 * [row_base, N) only) as the fp32 value of its E8M0 scale. */
template <int FP4> __device__ __forceinline__ void gemm_scale_store(uint8_t *scales, uint32_t v, int row_base, int N) {
    const int t = threadIdx.x;
    if (!FP4 && t >= GEMM_BN) v = row_base + t - GEMM_BN < N ? __float_as_uint(dev_e8m0((uint8_t)v)) : 0u;
    ((uint32_t *)scales)[t] = v;
}

/* acc += chunk c of the warp's 64 x 32 sub-tile (the order of k_mma.cu mma_block for that chunk). */
template <int FP4>
__device__ __forceinline__ void gemm_chunk(float (&acc)[GEMM_MT][GEMM_NT][4], const uint8_t *stage, int K, int wr, int wt, int c) {
    typedef gemm_smem<FP4> L;
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const uint8_t *As = stage, *Bs = stage + L::a_bytes;
    if constexpr (!FP4) {
        float f[GEMM_MT][GEMM_NT][4];
#pragma unroll
        for (int mi = 0; mi < GEMM_MT; mi++)
#pragma unroll
            for (int ni = 0; ni < GEMM_NT; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) f[mi][ni][e] = 0.0f;
        /* MMAs j = 2 half, 2 half + 1 (words 4 half .. 4 half + 3); a loop, not unrolled, so that the compiler does
         * not hoist both halves' loads (255 registers without spills) */
#pragma unroll 1
        for (int half = 0; half < 2; half++) {
            uint4 b[GEMM_NT];   /* the weight rows' words are loaded per m tile: fewer registers live */
#pragma unroll
            for (int ni = 0; ni < GEMM_NT; ni++) b[ni] = *(const uint4 *)(Bs + (wt + 8 * ni + g) * L::b_ld + 32 * q + 16 * half);
#pragma unroll
            for (int mi = 0; mi < GEMM_MT; mi++) {
                const uint4 r0 = *(const uint4 *)(As + (wr + 16 * mi + g) * L::a_ld + 32 * q + 16 * half);
                const uint4 r1 = *(const uint4 *)(As + (wr + 16 * mi + g + 8) * L::a_ld + 32 * q + 16 * half);
#pragma unroll
                for (int ni = 0; ni < GEMM_NT; ni++) {
                    const uint4 &bb = b[ni];
                    if (half == 0) mma_e4m3(f[mi][ni], r0.x, r1.x, r0.y, r1.y, GEMM_B01(bb.x, bb.y));
                    else mma_e4m3(f[mi][ni], r0.x, r1.x, r0.y, r1.y, bb.x, bb.y);
                    mma_e4m3(f[mi][ni], r0.z, r1.z, r0.w, r1.w, bb.z, bb.w);
                }
            }
        }
        /* the scales (staged) after the MMAs: fewer registers live across them */
        const float *sxs = (const float *)(stage + L::sx_off), *sws = (const float *)(stage + L::sw_off);
        float sx[GEMM_NT][2], sw[GEMM_MT][2];
#pragma unroll
        for (int ni = 0; ni < GEMM_NT; ni++)
#pragma unroll
            for (int e = 0; e < 2; e++) sx[ni][e] = sxs[wt + 8 * ni + 2 * q + e];
#pragma unroll
        for (int mi = 0; mi < GEMM_MT; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) sw[mi][h] = sws[wr + 16 * mi + g + 8 * h];
#pragma unroll
        for (int mi = 0; mi < GEMM_MT; mi++)
#pragma unroll
            for (int ni = 0; ni < GEMM_NT; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[mi][ni][e] = fmaf(f[mi][ni][e], sw[mi][e >> 1] * sx[ni][e & 1], acc[mi][ni][e]);
    } else {
        const float *sxs = (const float *)(stage + L::sx_off);
        const uint32_t *sws = (const uint32_t *)(stage + L::sw_off);
        float sx[GEMM_NT][2];
        uint32_t swb[GEMM_MT][2];   /* byte j: the scale of block j of the row */
#pragma unroll
        for (int ni = 0; ni < GEMM_NT; ni++)
#pragma unroll
            for (int e = 0; e < 2; e++) sx[ni][e] = sxs[wt + 8 * ni + 2 * q + e];
#pragma unroll
        for (int mi = 0; mi < GEMM_MT; mi++)
#pragma unroll
            for (int h = 0; h < 2; h++) swb[mi][h] = sws[wr + 16 * mi + g + 8 * h];
        const int nb = min(4, (K - 128 * c) / 32);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (j >= nb) break;
            uint32_t a[GEMM_MT][2];
            uint2 b[GEMM_NT];
            /* FP4 == 2: packed (k_mma.cu, cu_fp4_frag_pack): the row's word 4q + j */
#pragma unroll
            for (int mi = 0; mi < GEMM_MT; mi++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    a[mi][h] = *(const uint32_t *)(As + (wr + 16 * mi + g + 8 * h) * L::a_ld + (FP4 == 2 ? 16 * q + 4 * j : 16 * j + 4 * q));
#pragma unroll
            for (int ni = 0; ni < GEMM_NT; ni++) b[ni] = *(const uint2 *)(Bs + (wt + 8 * ni + g) * L::b_ld + 32 * j + 8 * q);
#pragma unroll
            for (int mi = 0; mi < GEMM_MT; mi++) {
                const uint32_t a0 = FP4 == 2 ? frag_lo(a[mi][0]) : e2m1x4_e4m3(a[mi][0]), a1 = FP4 == 2 ? frag_lo(a[mi][1]) : e2m1x4_e4m3(a[mi][1]);
                const uint32_t a2 = FP4 == 2 ? frag_hi(a[mi][0]) : e2m1x4_e4m3(a[mi][0] >> 16);
                const uint32_t a3 = FP4 == 2 ? frag_hi(a[mi][1]) : e2m1x4_e4m3(a[mi][1] >> 16);
                const float s0 = dev_e8m0((uint8_t)(swb[mi][0] >> (8 * j))), s1 = dev_e8m0((uint8_t)(swb[mi][1] >> (8 * j)));
#pragma unroll
                for (int ni = 0; ni < GEMM_NT; ni++) {
                    float f[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
                    mma_e4m3(f, a0, a1, a2, a3, GEMM_B01(b[ni].x, b[ni].y));
                    if (FP4 == 2)   /* the packed values are 2^-6 of the codes': P exactly */
#pragma unroll
                        for (int e = 0; e < 4; e++) f[e] *= 64.0f;
                    acc[mi][ni][0] = fmaf(f[0], s0 * sx[ni][0], acc[mi][ni][0]);
                    acc[mi][ni][1] = fmaf(f[1], s0 * sx[ni][1], acc[mi][ni][1]);
                    acc[mi][ni][2] = fmaf(f[2], s1 * sx[ni][0], acc[mi][ni][2]);
                    acc[mi][ni][3] = fmaf(f[3], s1 * sx[ni][1], acc[mi][ni][3]);
                }
            }
        }
    }
}

/* One block: weight rows [row_base, +128) x tokens [tok_base, +128) of T; token n reads input row
 * in_rows[in_base + n] (in_base + n without in_rows) and writes output row out_base + n. */
template <int FP4>
__device__ __forceinline__ void gemm_block(const dsv4_weight &w, const uint8_t *__restrict__ xq, int ldq, const float *__restrict__ xs,
                                           int lds, int T, float *__restrict__ y, int ldy, int out_bf16, int row_base, int tok_base,
                                           const int32_t *__restrict__ in_rows, int in_base, int out_base) {
    typedef gemm_smem<FP4> L;
    extern __shared__ __align__(16) uint8_t gemm_sm[];
    float *ys = (float *)(gemm_sm + GEMM_STAGES * L::stage);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int wr = 64 * (warp >> 2), wt = 32 * (warp & 3);   /* the warp's rows and tokens inside the block */
    const int N = w.rows, K = w.cols, nchunk = (K + 127) / 128;
    const uint8_t *wd = (const uint8_t *)w.data;
    /* the tile's input rows (the last tile's last reads of them were before its last chunks' barriers) */
    const gemm_rows R = gemm_rows_stage((int32_t *)(gemm_sm + L::rows_off), in_rows, in_base, tok_base, T);

    __syncthreads();   /* a block that runs several tiles (experts): every warp is done with the last one's stages */
#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; s++) {
        if (s < nchunk) {
            const int c = gemm_chunk_at(s, nchunk);
            gemm_load<FP4>(gemm_sm + s * L::stage, wd, N, K, xq, ldq, T, R, row_base, tok_base, c);
            gemm_scale_store<FP4>(gemm_sm + s * L::stage + L::sx_off, gemm_scale_fetch<FP4>(w, xs, lds, T, R, row_base, tok_base, c), row_base, N);
        }
        cp_async_commit();
    }
    float acc[GEMM_MT][GEMM_NT][4];
#pragma unroll
    for (int mi = 0; mi < GEMM_MT; mi++)
#pragma unroll
        for (int ni = 0; ni < GEMM_NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;

    /* a warp whose tokens all lie past T (a short expert run) only helps to stage and waits at the barriers */
    const bool idle = tok_base + wt >= T || row_base + wr >= N;
    int i = 0;   /* position in the walk = the stage sequence */
    for (int pp = 0; pp < 4; pp++) {
        const int p = GEMM_PART(pp), n = gemm_part_chunks(nchunk, p);
        for (int k = 0; k < n; k++, i++) {
            cp_async_wait<GEMM_STAGES - 2>();
            __syncthreads();   /* stage i landed for every thread; every warp is done with stage i - 1's buffer */
            const int next = i + GEMM_STAGES - 1;
            uint8_t *next_stage = gemm_sm + (next % GEMM_STAGES) * L::stage;
            uint32_t next_scale = 0;
            if (next < nchunk) {
                const int c = gemm_chunk_at(next, nchunk);
                gemm_load<FP4>(next_stage, wd, N, K, xq, ldq, T, R, row_base, tok_base, c);
                next_scale = gemm_scale_fetch<FP4>(w, xs, lds, T, R, row_base, tok_base, c);
            }
            cp_async_commit();
            if (!idle) gemm_chunk<FP4>(acc, gemm_sm + (i % GEMM_STAGES) * L::stage, K, wr, wt, p + 4 * k);
            if (next < nchunk) gemm_scale_store<FP4>(next_stage + L::sx_off, next_scale, row_base, N);   /* read after the barrier of stage next */
        }
        if (idle) continue;
        /* fold partial p: y = p0, then y = y + p (each thread its own slots of ys) */
#pragma unroll
        for (int mi = 0; mi < GEMM_MT; mi++)
#pragma unroll
            for (int ni = 0; ni < GEMM_NT; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float *slot = ys + ((mi * GEMM_NT + ni) * 4 + e) * GEMM_THREADS + threadIdx.x;
                    const float v = pp == 0 ? acc[mi][ni][e] : *slot + acc[mi][ni][e];
                    acc[mi][ni][e] = 0.0f;
                    if (pp < 3) {
                        *slot = v;
                    } else {
                        const int r = row_base + wr + 16 * mi + g + 8 * (e >> 1), t = tok_base + wt + 8 * ni + 2 * q + (e & 1);
                        if (r < N && t < T) y[((int64_t)out_base + t) * ldy + r] = out_bf16 ? dev_round_bf16(v) : v;
                    }
                }
    }
}

/* ==== The warpgroup path (kind CU_GEMM_HGMMA): fp16 wgmma with mma.sync e4m3's bits ====
 *
 * sm_90 runs mma.sync m16n8k32 e4m3 as two fp16 MMAs (cu_mma_frag.cuh, mma_e4m3_written): t = HMMA(the fragment
 * registers' low byte pairs as fp16, from 0), t = HMMA(the high pairs, t), D = C + t by one fp32 addition. The
 * warpgroup's fp16 MMA adds a k16 step exactly as HMMA does (tools/gpu/f16emu_bits.cu, run 90), so a block whose
 * two warpgroups issue, for every MMA of the walk above, wgmma(the low pairs, scale-d 0) and wgmma(the high pairs)
 * with the same operands in the same k positions, then add t as the instruction does, gives every output the bits
 * gemm_block gives it: the same MMAs, additions, promotions and fold, only four times as many outputs per
 * instruction and no conversions or additions left to ptxas.
 *
 * ---- Operands ----
 *   A = 64 weight rows a warpgroup from registers: each warp converts exactly the fragment words gemm_chunk loads
 *   (FP8: rows g, g + 8, words 8q + 2j and 8q + 2j + 1 for MMA j; FP4: its code words, to E4M3 as there) by
 *   cvt.f16x2.e4m3x2 of their low and high byte pairs; mma.m16n8k16's A layout puts them at the k positions the
 *   expansion does (the low pairs of a0 at k 2q, 2q + 1, of a2 at 2q + 8, 2q + 9).
 *   B = the block's 128 tokens, converted to fp16 in shared memory once a chunk (hg_convert), in the k order that
 *   matches: fp16 step s = 2j + h (h = 0 low pairs, 1 high) holds at k 2m, 2m + 1 (m = 0..7) the byte pair h of the
 *   activation word that MMA j's fragment register b0 (m < 4) or b1 (m >= 4) of lane q = m % 4 holds. FP8: word
 *   8 (m % 4) + 2j + m / 4 of the token's chunk; FP4 (block j): word 8j + 2 (m % 4) + m / 4.
 *
 * ---- Block and pipeline ----
 *   128 rows x 128 tokens, 256 threads = two warpgroups of 64 rows x 128 tokens (accumulators t, the chunk's f and
 *   the partial acc: 64 floats each a thread). Shared memory (hg_smem): two fp16 token tiles (32 KB each), y between
 *   partials (64 KB), three stages of weight bytes + scales, two of raw activation bytes. Chunk i of the walk: a
 *   barrier (weights i and activations i + 1 have landed, everyone is done with chunk i - 1), cp.async of the
 *   activations and weights of chunk i + 2, then chunk i's MMAs on fp16 tile i % 2 while the same threads convert
 *   chunk i + 1's activations into the other tile, a quarter between each k32 step's issue and its wait. */
template <int FP4> struct hg_smem {
    static constexpr int a_ld = FP4 ? 80 : 144;   /* bytes a weight row: gemm_smem's */
    static constexpr int b16_bytes = GEMM_BN * 256;   /* a chunk of 128 tokens in fp16 */
    static constexpr int y_off = 2 * b16_bytes;
    static constexpr int a_off = y_off + 4 * 64 * GEMM_THREADS;   /* y: 64 floats a thread (256 threads; 32 of 512) */
    static constexpr int sx_off = GEMM_BM * a_ld;   /* inside a weight stage: its rows, then sx and sw */
    static constexpr int stage = sx_off + 4 * GEMM_BN + 4 * GEMM_BM;
    static constexpr int braw_off = a_off + GEMM_STAGES * stage, braw_bytes = GEMM_BN * HG_BRAW_LD;
    static constexpr int rows_off = braw_off + 2 * braw_bytes;   /* the tile's input rows (gemm_rows) */
    static constexpr int total = rows_off + 4 * GEMM_BN;
};

/* The two shapes of the warpgroup block (the same bits): NWG = 2 warpgroups of 64 rows x 128 tokens (m64n128k16;
 * a tile of at most 64 tokens m64n64k16), or NWG = 4 of 64 rows x 64 tokens (m64n64k16, warpgroup wg: rows
 * 64 (wg & 1), tokens 64 (wg >> 1)): twice the warps to hide latency in, 32 accumulators a set instead of 64. */
template <int NWG> struct hg_shape {
    static constexpr int threads = 128 * NWG;
};

/* The thread's first conversion item (u = threadIdx.x; part j adds THREADS / 8 tokens): its byte offset in the raw
 * activations and in the fp16 tile (hg_convert's map). Computed once a tile. */
struct hg_conv {
    int src, dst;
};
template <int FP4> __device__ __forceinline__ hg_conv hg_conv_at(void) {
    const int s = threadIdx.x >> 5, l = threadIdx.x & 31, n = 8 * (s >> 1) + (l & 7), wb = 4 * (s & 1) + (l >> 3), jj = wb >> 1, b = wb & 1;
    return hg_conv{ n * HG_BRAW_LD + 4 * (FP4 ? 8 * jj + b : 2 * jj + b), (n >> 3) * HG_SBO + (4 * jj + b) * HG_LBO + (n & 7) * 16 };
}
/* Part j (of 4: one between each k32 step's issue and its wait) of the conversion of a chunk's raw activation bytes
 * (tokens HG_BRAW_LD bytes apart) into the fp16 tile b16, its first NT tokens (64 or 128). Item u (8 NT a chunk):
 * slot s = u / 32, lane l = u % 32 -> token n = 8 (s / 2) + l % 8 and word pair wb = 2jj + b = 4 (s % 2) + l / 8;
 * it reads the token's words word(a), a = 0..3 (FP8 8a + 2jj + b, FP4 8jj + 2a + b: the k order above with
 * m = a + 4b) and writes their low pairs as token n's 16 bytes of core column 4jj + b (fp16 step 2jj, k 8b + 2a,
 * + 1), their high pairs as those of core column 4jj + 2 + b (step 2jj + 1). Eight lanes write one whole core
 * matrix (128 contiguous bytes: no bank conflict); the FP8 loads meet 32 distinct banks (4n + word mod 32). */
template <int FP4, int NT, int THREADS>
__device__ __forceinline__ void hg_convert(uint8_t *b16, const uint8_t *braw, int j, const hg_conv &cv) {
    if ((int)threadIdx.x + THREADS * j >= 8 * NT) return;   /* uniform in a warp */
    const uint8_t *src = braw + cv.src + j * (THREADS / 8) * HG_BRAW_LD;
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int a = 0; a < 4; a++) {
        const uint32_t v = *(const uint32_t *)(src + (FP4 ? 8 * a : 32 * a));   /* word(a) - word(0) */
        lo[a] = e4m3_lo_f16x2(v);
        hi[a] = e4m3_hi_f16x2(v);
    }
    uint8_t *dst = b16 + cv.dst + j * (THREADS / 64) * HG_SBO;
    *(uint4 *)dst = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    *(uint4 *)(dst + 2 * HG_LBO) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
}

/* DSV4_GEMM_BUG=1: a step's row-g words swapped (FP8: the first MMA of a chunk; FP4: every block), as GEMM_B01. */
__device__ __forceinline__ void hg_bug_swap(uint32_t &a, uint32_t &b) {
#if defined(DSV4_GEMM_BUG) && DSV4_GEMM_BUG == 1
    const uint32_t x = a;
    a = b, b = x;
#else
    (void)a, (void)b;
#endif
}

/* The warpgroup MMA over the block's first NB tokens (128 or 64). */
template <int NB>
__device__ __forceinline__ void hgmma(float (&d)[NB / 2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, const void *b, int acc) {
    if constexpr (NB == 128) hgmma_n128(d, a0, a1, a2, a3, b, acc);
    else hgmma_n64(d, a0, a1, a2, a3, b, acc);
}

/* Issue t = the two fp16 MMAs of one k32 step j: mma_e4m3's fragment a0..a3 (E4M3) against fp16 steps 2j, 2j + 1 of b16. */
template <int NB>
__device__ __forceinline__ void hg_step_issue(float (&t)[NB / 2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, const uint8_t *b16, int j) {
    uint32_t lo[4] = { e4m3_lo_f16x2(a0), e4m3_lo_f16x2(a1), e4m3_lo_f16x2(a2), e4m3_lo_f16x2(a3) };
    uint32_t hi[4] = { e4m3_hi_f16x2(a0), e4m3_hi_f16x2(a1), e4m3_hi_f16x2(a2), e4m3_hi_f16x2(a3) };
#pragma unroll
    for (int k = 0; k < 4; k++) wg_pin_r(lo[k]), wg_pin_r(hi[k]);   /* converted before the fence, not between the MMAs */
    wg_fence();
    hgmma<NB>(t, lo[0], lo[1], lo[2], lo[3], b16 + 2 * j * 2 * HG_LBO, 0);
    hgmma<NB>(t, hi[0], hi[1], hi[2], hi[3], b16 + (2 * j + 1) * 2 * HG_LBO, 1);
    wg_commit();
}
template <int NB> __device__ __forceinline__ void hg_step_wait(float (&t)[NB / 2]) {
    wg_wait0();
#pragma unroll
    for (int k = 0; k < NB / 2; k++) wg_pin(t[k]);
}

/* acc += chunk c of the thread's rows ra, ra + 8 x the warpgroup's NB tokens from tok0 (gemm_chunk's order), on fp16
 * tile b16, t the MMAs' accumulators; meanwhile, part by part, the next chunk's activations (braw_next, NULL after
 * the last) into b16_next (its first NT tokens, by THREADS threads). sx_plain: every activation scale of the tile
 * is in the PLAIN range (hg_block's first barrier). */
template <int FP4, int NB, int NT, int THREADS>
__device__ __forceinline__ void hg_chunk(float (&acc)[NB / 2], float (&t)[NB / 2], const uint8_t *As, const uint8_t *b16, uint8_t *b16_next,
                                         const uint8_t *braw_next, const hg_conv &cv, int K, int c, int ra, int tok0, bool sx_plain) {
    typedef hg_smem<FP4> L;
    constexpr int NA = NB / 2;   /* accumulators a thread */
    const int q = threadIdx.x & 3;
    const float *sxs = (const float *)(As + L::sx_off) + tok0;
    const uint32_t *sws = (const uint32_t *)(As + L::sx_off + 4 * GEMM_BN);
    b16 += (tok0 >> 3) * HG_SBO;   /* the warpgroup's tokens */
    if constexpr (!FP4) {
        float f[NA];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint2 r0 = *(const uint2 *)(As + ra * L::a_ld + 32 * q + 8 * j), r1 = *(const uint2 *)(As + (ra + 8) * L::a_ld + 32 * q + 8 * j);
            uint32_t a0 = r0.x, a2 = r0.y;   /* mma_e4m3(f, r0.x, r1.x, r0.y, r1.y, ...) in gemm_chunk */
            if (j == 0) hg_bug_swap(a0, a2);
            hg_step_issue<NB>(t, a0, r1.x, a2, r1.y, b16, j);
            if (braw_next) hg_convert<FP4, NT, THREADS>(b16_next, braw_next, j, cv);
            hg_step_wait<NB>(t);
#pragma unroll
            for (int k = 0; k < NA; k++) f[k] = __fadd_rn(j ? f[k] : 0.0f, t[k]);   /* D = C + t: f = +0 + t first */
        }
        const float sw[2] = { __uint_as_float(sws[ra]), __uint_as_float(sws[ra + 8]) };
#pragma unroll
        for (int i = 0; i < NB / 8; i++) {
            const float2 sx = *(const float2 *)(sxs + 8 * i + 2 * q);
#pragma unroll
            for (int e = 0; e < 4; e++) acc[4 * i + e] = fmaf(f[4 * i + e], sw[e >> 1] * (e & 1 ? sx.y : sx.x), acc[4 * i + e]);
        }
    } else {
        const int nb = min(4, (K - 128 * c) / 32);
        const uint32_t swb0 = sws[ra], swb1 = sws[ra + 8];
        /* packed codes in the PLAIN range (cu_mma_frag.cuh: the thread's scale bytes of the chunk; sx_plain: every
         * activation scale of the tile): the 64 folded into the weight scale, one instruction fewer an element */
        const bool plain = FP4 == 2 && HG_FP4_FOLD && sx_plain && !frag_scale_out(swb0) && !frag_scale_out(swb1);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            /* the MMAs of a block past K (zero bytes) are issued but not added: today's kernels have none */
            const int off = FP4 == 2 ? 16 * q + 4 * j : 16 * j + 4 * q;
            const uint32_t w0 = *(const uint32_t *)(As + ra * L::a_ld + off), w1 = *(const uint32_t *)(As + (ra + 8) * L::a_ld + off);
            uint32_t a0 = FP4 == 2 ? frag_lo(w0) : e2m1x4_e4m3(w0), a2 = FP4 == 2 ? frag_hi(w0) : e2m1x4_e4m3(w0 >> 16);
            const uint32_t a1 = FP4 == 2 ? frag_lo(w1) : e2m1x4_e4m3(w1), a3 = FP4 == 2 ? frag_hi(w1) : e2m1x4_e4m3(w1 >> 16);
            hg_bug_swap(a0, a2);
            hg_step_issue<NB>(t, a0, a1, a2, a3, b16, j);
            if (braw_next) hg_convert<FP4, NT, THREADS>(b16_next, braw_next, j, cv);
            hg_step_wait<NB>(t);
            if (j < nb && plain) {
                /* acc = fmaf(t, (64 s) sx, acc): 64 s sx = 64 (s sx) exactly (both normal in the PLAIN range), so the
                 * exact product t (64 s sx) is the fallback's (64 t)(s sx) and fmaf rounds the same sum; t = -0
                 * (where the fallback's f is +0) adds the same as +0 to an acc that is never -0 (it starts at +0, and
                 * a rounded sum is -0 only when both terms are) */
                const float s0 = __uint_as_float(((swb0 >> (8 * j)) & 0xffu) << 23) * 64.0f;
                const float s1 = __uint_as_float(((swb1 >> (8 * j)) & 0xffu) << 23) * 64.0f;
#pragma unroll
                for (int i = 0; i < NB / 8; i++) {
                    const float2 sx = *(const float2 *)(sxs + 8 * i + 2 * q);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        acc[4 * i + e] = fmaf(t[4 * i + e], (e >> 1 ? s1 : s0) * (e & 1 ? sx.y : sx.x), acc[4 * i + e]);
                }
            } else if (j < nb) {
                const float s0 = dev_e8m0((uint8_t)(swb0 >> (8 * j))), s1 = dev_e8m0((uint8_t)(swb1 >> (8 * j)));
#pragma unroll
                for (int i = 0; i < NB / 8; i++) {
                    const float2 sx = *(const float2 *)(sxs + 8 * i + 2 * q);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        /* D = C + t with C = +0, then (packed: the values are 2^-6 of the codes') x 64 exactly: for packed
                         * codes one fmaf(t, 64, +0), the same bits as (+0 + t) x 64 (the scaling is exact: t is 0 or
                         * between 2^-20 and 2^11; and both give +0 for t = -0), one instruction fewer an element */
                        const float f = FP4 == 2 ? fmaf(t[4 * i + e], 64.0f, 0.0f) : __fadd_rn(0.0f, t[4 * i + e]);
                        acc[4 * i + e] = fmaf(f, (e >> 1 ? s1 : s0) * (e & 1 ? sx.y : sx.x), acc[4 * i + e]);
                    }
                }
            }
        }
    }
}

/* One block of the warpgroup path: gemm_block's contract (the same tile, inputs, outputs and fold). NWG = 2: two
 * warpgroups of 64 rows, their MMAs over the block's first NB tokens (NB = 64: a tile of at most 64 tokens, the rest
 * zero; half the tensor work); NWG = 4 (NB = 64): four of 64 rows x 64 tokens. */
template <int FP4, int NWG, int NB>
__device__ __forceinline__ void hg_block(const dsv4_weight &w, const uint8_t *__restrict__ xq, int ldq, const float *__restrict__ xs,
                                         int lds, int T, float *__restrict__ y, int ldy, int out_bf16, int row_base, int tok_base,
                                         const int32_t *__restrict__ in_rows, int in_base, int out_base) {
    typedef hg_smem<FP4> L;
    constexpr int THREADS = hg_shape<NWG>::threads, NT = NWG == 4 ? GEMM_BN : NB, NA = NB / 2;
    extern __shared__ __align__(16) uint8_t gemm_sm[];
    float *ys = (float *)(gemm_sm + L::y_off);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int wg = warp >> 2, ra = 64 * (wg & 1) + 16 * (warp & 3) + g;   /* the thread's rows ra, ra + 8 of the block */
    const int tok0 = NWG == 4 ? 64 * (wg >> 1) : 0;   /* the warpgroup's first token */
    const int N = w.rows, K = w.cols, nchunk = (K + 127) / 128;
    const uint8_t *wd = (const uint8_t *)w.data;
    uint8_t *const b16 = gemm_sm, *const a_st = gemm_sm + L::a_off, *const braw = gemm_sm + L::braw_off;
    const bool scaler = threadIdx.x < GEMM_THREADS;   /* the threads that stage a chunk's scales (gemm_scale_fetch) */
    const gemm_rows R = gemm_rows_stage((int32_t *)(gemm_sm + L::rows_off), in_rows, in_base, tok_base, T);   /* as gemm_block */

    /* a block that runs several tiles (experts): every warp is done with the last one's buffers; and (packed FP4)
     * whether every activation scale of the tile's tokens lies in the PLAIN range of hg_chunk's fold */
    int sx_plain = 0;
    if constexpr (FP4 == 2 && HG_FP4_FOLD) {
        __syncthreads();   /* R's rows staged */
        const int nt = T - tok_base < GEMM_BN ? T - tok_base : GEMM_BN;   /* <= 0: no token, nothing to check */
        sx_plain = 1;
        for (int u = threadIdx.x; u < nt * nchunk; u += THREADS) sx_plain &= !frag_sx_out(xs[gemm_row(R, u / nchunk) * lds + u % nchunk]);
        sx_plain = __syncthreads_and(sx_plain);
    } else {
        __syncthreads();
    }
    /* activations 0, weights 0, activations 1, weights 1: four groups, so that a wait can leave the last weights out */
#pragma unroll
    for (int s = 0; s < 2; s++) {
        const int c = s < nchunk ? gemm_chunk_at(s, nchunk) : 0;
        if (s < nchunk) gemm_load_x<THREADS>(braw + s * L::braw_bytes, HG_BRAW_LD, xq, ldq, T, K, R, tok_base, c);
        cp_async_commit();
        if (s < nchunk) {
            gemm_load_w<FP4, THREADS>(a_st + s * L::stage, L::a_ld, wd, N, K, row_base, c);
            if (scaler)
                gemm_scale_store<FP4>(a_st + s * L::stage + L::sx_off, gemm_scale_fetch<FP4>(w, xs, lds, T, R, row_base, tok_base, c), row_base, N);
        }
        cp_async_commit();
    }
    cp_async_wait<3>();
    __syncthreads();   /* activations 0 landed for every thread */
    const hg_conv cv = hg_conv_at<FP4>();
#pragma unroll
    for (int j = 0; j < 4; j++) hg_convert<FP4, NT, THREADS>(b16, braw, j, cv);
    fence_proxy_async();

    float acc[NA], t[NA];
#pragma unroll
    for (int k = 0; k < NA; k++) acc[k] = 0.0f, t[k] = 0.0f;
    int i = 0;   /* position in the walk */
    for (int pp = 0; pp < 4; pp++) {
        const int p = GEMM_PART(pp), n = gemm_part_chunks(nchunk, p);
        for (int k = 0; k < n; k++, i++) {
            cp_async_wait<1>();   /* everything but weights i + 1: weights i and activations i + 1 */
            __syncthreads();      /* ... landed for every thread; fp16 tile i written; chunk i - 1's buffers free */
            const int next = i + 2, cn = next < nchunk ? gemm_chunk_at(next, nchunk) : 0;
            if (next < nchunk)
                gemm_load_x<THREADS>(braw + (next % 2) * L::braw_bytes, HG_BRAW_LD, xq, ldq, T, K, R, tok_base, cn);
            cp_async_commit();
            uint32_t next_scale = 0;
            if (next < nchunk) {
                gemm_load_w<FP4, THREADS>(a_st + (next % GEMM_STAGES) * L::stage, L::a_ld, wd, N, K, row_base, cn);
                if (scaler) next_scale = gemm_scale_fetch<FP4>(w, xs, lds, T, R, row_base, tok_base, cn);
            }
            cp_async_commit();
            const bool conv = i + 1 < nchunk;
            hg_chunk<FP4, NB, NT, THREADS>(acc, t, a_st + (i % GEMM_STAGES) * L::stage, b16 + (i % 2) * L::b16_bytes,
                                           b16 + ((i + 1) % 2) * L::b16_bytes, conv ? braw + ((i + 1) % 2) * L::braw_bytes : NULL, cv, K,
                                           p + 4 * k, ra, tok0, sx_plain);
            if (conv) fence_proxy_async();
            if (next < nchunk && scaler) gemm_scale_store<FP4>(a_st + (next % GEMM_STAGES) * L::stage + L::sx_off, next_scale, row_base, N);
        }
        /* fold partial p: y = p0, then y = y + p (each thread its own slots of ys). A warpgroup whose rows all lie
         * past the weight ran its MMAs on zero bytes (no branch around a wgmma: ptxas serializes them then) and
         * stores nothing. */
#pragma unroll
        for (int k = 0; k < NA; k++) {
            float *slot = ys + k * THREADS + threadIdx.x;
            const float v = pp == 0 ? acc[k] : *slot + acc[k];
            acc[k] = 0.0f;
            if (pp < 3) {
                *slot = v;
            } else {
                const int r = row_base + ra + 8 * ((k & 3) >> 1), tok = tok_base + tok0 + 8 * (k >> 2) + 2 * q + (k & 1);
                if (r < N && tok < T) y[((int64_t)out_base + tok) * ldy + r] = out_bf16 ? dev_round_bf16(v) : v;
            }
        }
    }
}

/* One block of path HG (0: gemm_block; 1: hg_block of two warpgroups, 2: of four); the same bits every way. */
template <int HG> struct gemm_threads {
    static constexpr int n = HG == 2 ? hg_shape<4>::threads : GEMM_THREADS;
};
template <int FP4, int HG>
__device__ __forceinline__ void gemm_any_block(const dsv4_weight &w, const uint8_t *__restrict__ xq, int ldq, const float *__restrict__ xs,
                                               int lds, int T, float *__restrict__ y, int ldy, int out_bf16, int row_base, int tok_base,
                                               const int32_t *__restrict__ in_rows, int in_base, int out_base) {
    if constexpr (HG == 2) {
        hg_block<FP4, 4, 64>(w, xq, ldq, xs, lds, T, y, ldy, out_bf16, row_base, tok_base, in_rows, in_base, out_base);
    } else if constexpr (HG == 1) {   /* a tile of at most 64 tokens (an expert's short run, a linear's last tokens) at n64 */
        if (T - tok_base <= 64) hg_block<FP4, 2, 64>(w, xq, ldq, xs, lds, T, y, ldy, out_bf16, row_base, tok_base, in_rows, in_base, out_base);
        else hg_block<FP4, 2, 128>(w, xq, ldq, xs, lds, T, y, ldy, out_bf16, row_base, tok_base, in_rows, in_base, out_base);
    }
    else gemm_block<FP4>(w, xq, ldq, xs, lds, T, y, ldy, out_bf16, row_base, tok_base, in_rows, in_base, out_base);
}
template <int FP4, int HG> struct gemm_total {
    static constexpr int bytes = HG ? hg_smem<FP4>::total : gemm_smem<FP4>::total;
};

template <int FP4, int HG>
__global__ void __launch_bounds__(gemm_threads<HG>::n, 1) k_mma_gemm(dsv4_weight w, const uint8_t *__restrict__ xq, int ldq,
                                                              const float *__restrict__ xs, int lds, int T, float *__restrict__ y,
                                                              int ldy, int out_bf16) {
    dev_grid_wait();
    gemm_any_block<FP4, HG>(w, xq, ldq, xs, lds, T, y, ldy, out_bf16, blockIdx.x * GEMM_BM, blockIdx.y * GEMM_BN, NULL, 0, 0);
}

/* The routed experts' tiles of a MoE plan (k_mma.cu k_mma_expert's contract), in groups of GEMM_BN / CU_MOE_TILE = 16
 * plan tiles (up to 128 pairs) as cu_plan_groups.cuh cuts them; a group's token n is pair p0 + n, reading input row
 * p0 + n (x_by_pair) or pair_token[p0 + n] and writing output row p0 + n. Cut at expert boundaries, an expert of 192
 * pairs is one tile of 128 and one of 64, where cutting at every 16th plan tile made it two or three runs wherever
 * it began — though run 145 found that worth only 1,576 → 1,547 ms of routed experts an 8K step. */
#define GEMM_EXPERT_TILES (GEMM_BN / CU_MOE_TILE)
/* One group of an expert's tiles, [s, s1): one block tile of its pairs (k_mma_gemm_expert). */
template <int FP4, int HG>
__device__ __forceinline__ void expert_group(const dsv4_weight *__restrict__ experts, int rows, const cu_moe_plan &plan, int s, int s1,
                                             int row_base, const uint8_t *__restrict__ xq, int ldq, const float *__restrict__ xs, int lds,
                                             int x_by_pair, float *__restrict__ y, int ldy, int out_bf16) {
    const int e = plan.tile_expert[s], p0 = plan.tile_first[s];
    const int n = plan.tile_first[s1 - 1] + plan.tile_count[s1 - 1] - p0;
    dsv4_weight w = experts[e];
    if (!w.data) {   /* an expert another GPU holds (cuda_ep.h) or the host computes: the exact gather's identity */
        for (int i = threadIdx.x; i < GEMM_BM * n; i += gemm_threads<HG>::n) {
            const int r = row_base + i % GEMM_BM;
            if (r < rows) y[((int64_t)p0 + i / GEMM_BM) * ldy + r] = EP_ABSENT_ROW;
        }
    } else {
        if ((uintptr_t)w.data % 16) __trap();   /* cu_mma_gemm.h's contract (each expert a cudaMalloc of its own) */
        w.rows = rows;
        gemm_any_block<FP4, HG>(w, xq, ldq, xs, lds, n, y, ldy, out_bf16, row_base, 0, x_by_pair ? NULL : plan.pair_token, p0, p0);
    }
}

template <int FP4, int HG>
__global__ void __launch_bounds__(gemm_threads<HG>::n, 1) k_mma_gemm_expert(const dsv4_weight *__restrict__ experts, int rows, cu_moe_plan plan,
                                                                     const uint8_t *__restrict__ xq, int ldq, const float *__restrict__ xs,
                                                                     int lds, int x_by_pair, float *__restrict__ y, int ldy, int out_bf16) {
    dev_grid_wait();
    const int row_base = blockIdx.x * GEMM_BM;
    plan_block_groups(plan, GEMM_EXPERT_TILES, [&](int s, int s1) {
        expert_group<FP4, HG>(experts, rows, plan, s, s1, row_base, xq, ldq, xs, lds, x_by_pair, y, ldy, out_bf16);
    });
}

static int gemm_min_t = CU_MMA_GEMM_MIN_T, gemm_min_blocks = CU_MMA_GEMM_MIN_BLOCKS, gemm_min_tiles = CU_MMA_GEMM_MIN_TILES,
           gemm_kind = CU_GEMM_DEFAULT;

extern "C" void cu_mma_gemm_set(int min_t, int min_blocks, int min_tiles) {
    gemm_min_t = min_t < 0 ? 0 : min_t;
    gemm_min_blocks = min_blocks < 0 ? 0 : min_blocks;
    gemm_min_tiles = min_tiles < 0 ? 0 : min_tiles;
}
extern "C" int cu_mma_gemm_min_t(void) { return gemm_min_t; }
extern "C" int cu_mma_gemm_min_tiles(void) { return gemm_min_tiles; }
extern "C" void cu_mma_gemm_set_kind(int kind) {
    gemm_kind = kind == CU_GEMM_MMA || kind == CU_GEMM_HGMMA || kind == CU_GEMM_HGMMA4 ? kind : CU_GEMM_DEFAULT;
}
extern "C" int cu_mma_gemm_kind(void) { return gemm_kind; }

template <int FP4, int HG> static int gemm_smem_opt_in(void) {
    static unsigned done;   /* the opt-in to more than 48 KiB: a function attribute of each device, once each */
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 32) {
        (void)cudaGetLastError();
        return 0;
    }
    if (!(done >> dev & 1u)) {
        if (cudaFuncSetAttribute(k_mma_gemm<FP4, HG>, cudaFuncAttributeMaxDynamicSharedMemorySize, gemm_total<FP4, HG>::bytes) != cudaSuccess ||
            cudaFuncSetAttribute(k_mma_gemm_expert<FP4, HG>, cudaFuncAttributeMaxDynamicSharedMemorySize, gemm_total<FP4, HG>::bytes) !=
                cudaSuccess) {
            (void)cudaGetLastError();
            return 0;   /* the small-tile kernels then: the same bits */
        }
        done |= 1u << dev;
    }
    return 1;
}

template <int FP4, int HG>
static int gemm_experts_launch(cu_stream st, dim3 grid, const dsv4_weight *experts, int rows, const cu_moe_plan *plan, const uint8_t *xq,
                               int ldq, const float *xs, int lds, int x_by_pair, float *y, int ldy, int out_bf16) {
    if (!gemm_smem_opt_in<FP4, HG>()) return 0;
    k_mma_gemm_expert<FP4, HG><<<grid, gemm_threads<HG>::n, gemm_total<FP4, HG>::bytes, (cudaStream_t)st>>>(experts, rows, *plan, xq, ldq, xs, lds,
                                                                                                    x_by_pair, y, ldy, out_bf16);
    return 1;
}

extern "C" int cu_mma_gemm_experts(cu_stream st, const dsv4_weight *experts, int rows, int cols, int fmt, const cu_moe_plan *plan,
                                   int max_tiles, const uint8_t *xq, int ldq, const float *xs, int lds, int x_by_pair, float *y, int ldy,
                                   int out_bf16) {
    (void)cols;
    if (!gemm_min_tiles || max_tiles < gemm_min_tiles || cu_blocks(max_tiles, GEMM_EXPERT_TILES) > 65535) return 0;
    const int fp4 = fmt == CU_FMT_FP4_FRAG ? 2 : fmt == WF_FP4;
    const dim3 grid(cu_blocks(rows, GEMM_BM), cu_blocks(max_tiles, GEMM_EXPERT_TILES));
#define GEMM_EXPERTS(F, H) gemm_experts_launch<F, H>(st, grid, experts, rows, plan, xq, ldq, xs, lds, x_by_pair, y, ldy, out_bf16)
    if (gemm_kind == CU_GEMM_HGMMA4) return fp4 == 2 ? GEMM_EXPERTS(2, 2) : fp4 ? GEMM_EXPERTS(1, 2) : GEMM_EXPERTS(0, 2);
    if (gemm_kind == CU_GEMM_HGMMA) return fp4 == 2 ? GEMM_EXPERTS(2, 1) : fp4 ? GEMM_EXPERTS(1, 1) : GEMM_EXPERTS(0, 1);
    return fp4 == 2 ? GEMM_EXPERTS(2, 0) : fp4 ? GEMM_EXPERTS(1, 0) : GEMM_EXPERTS(0, 0);
#undef GEMM_EXPERTS
}

extern "C" int cu_mma_gemm_takes_linear(const dsv4_weight *w, int T) {
    if (!gemm_min_t || T < gemm_min_t || T > 65535 * GEMM_BN || (uintptr_t)w->data % 16) return 0;
    return (int64_t)cu_blocks(w->rows, GEMM_BM) * cu_blocks(T, GEMM_BN) >= gemm_min_blocks;
}

template <int FP4, int HG>
static int gemm_linear_launch(cu_stream st, const dsv4_weight *w, const uint8_t *xq, int ldq, const float *xs, int lds, int T, float *y,
                              int ldy, int out_bf16) {
    if (!gemm_smem_opt_in<FP4, HG>()) return 0;
    const dim3 grid(cu_blocks(w->rows, GEMM_BM), cu_blocks(T, GEMM_BN));
    k_mma_gemm<FP4, HG><<<grid, gemm_threads<HG>::n, gemm_total<FP4, HG>::bytes, (cudaStream_t)st>>>(*w, xq, ldq, xs, lds, T, y, ldy, out_bf16);
    return 1;
}

extern "C" int cu_mma_gemm_linear(cu_stream st, const dsv4_weight *w, const uint8_t *xq, int ldq, const float *xs, int lds, int T,
                                  float *y, int ldy, int out_bf16) {
    if (!cu_mma_gemm_takes_linear(w, T)) return 0;
    const int fp4 = w->fmt == WF_FP4;
    if (gemm_kind == CU_GEMM_HGMMA4)
        return fp4 ? gemm_linear_launch<1, 2>(st, w, xq, ldq, xs, lds, T, y, ldy, out_bf16) : gemm_linear_launch<0, 2>(st, w, xq, ldq, xs, lds, T, y, ldy, out_bf16);
    if (gemm_kind == CU_GEMM_HGMMA)
        return fp4 ? gemm_linear_launch<1, 1>(st, w, xq, ldq, xs, lds, T, y, ldy, out_bf16) : gemm_linear_launch<0, 1>(st, w, xq, ldq, xs, lds, T, y, ldy, out_bf16);
    return fp4 ? gemm_linear_launch<1, 0>(st, w, xq, ldq, xs, lds, T, y, ldy, out_bf16) : gemm_linear_launch<0, 0>(st, w, xq, ldq, xs, lds, T, y, ldy, out_bf16);
}
