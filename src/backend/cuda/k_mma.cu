/* OFFICIAL-mode linear layers on FP8 tensor cores: mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 (sm_89+),
 * weights FP8 E4M3 (128x128 UE8M0 scales) or FP4 E2M1 converted to E4M3 in registers, activations E4M3 with an
 * fp32 power-of-two scale per 128 columns (cu_mma.h). The model's OFFICIAL steps use them (cuda_step.c, cuda_ep.c).
 *
 * ---- Reduction order of y[t][o] (the same for every t, every T, every tile; a function of K alone) ----
 *   Columns are cut into chunks of 128 (c = 0 .. ceil(K/128) - 1; an FP4 weight's last chunk may hold 1-3 of its
 *   32-column scale blocks). Four partial sums p0..p3, each starting at 0.0f: partial p takes the chunks
 *   c = p, p + 4, p + 8, ... in increasing c. For each chunk:
 *     FP8: P = 0 (a fresh fp32 fragment); P = MMA_j(P) for j = 0, 1, 2, 3, each MMA adding 32 products of the
 *          chunk (which 32: the k map below); then p = fmaf(P, sw * sx, p), sw the weight's 128x128 block scale,
 *          sx the activation scale of the chunk.
 *     FP4: for each 32-column scale block b of the chunk in increasing b: P = MMA(0) over the block's 32 columns,
 *          p = fmaf(P, sw_b * sx, p), sw_b the row's scale of block b.
 *   Then y = ((p0 + p1) + p2) + p3, in fp32.
 * Warp p of a block computes partial p for the block's whole tile of rows x tokens; the tile shape (chosen from T)
 * decides only which thread holds an element, never its order. The MMA computes every element of its 16x8 output
 * from that element's own row and column of the operands (a padded token is a zero column and changes nothing
 * else), so a token's bits do not depend on its neighbours or on its column in the fragment: test_gpu_mma checks
 * this by memcmp (each token alone = in batches of 2 .. 200, rows in any tile). The split in four partials is
 * fixed so that one token still spreads a weight row's bytes over four warps (decode is memory-bound: a
 * 4096-row weight is 256 tiles of 16 rows, too few warps without it).
 *
 * ---- Fragment layouts relied on (PTX ISA, "Matrix Fragments for mma.m16n8k32" for .e4m3; the same as CUTLASS's
 *      cute/atom/mma_traits_sm89.hpp, SM89_16x8x32_F32E4M3E4M3F32_TN: ALayout, BLayout, SM80_16x8_Row) ----
 *   lane = 4 g + q (g = groupID 0..7, q = threadID_in_group 0..3); byte i of a 32-bit register = element i.
 *   A (16 x 32, row-major, 4 registers): a0 = A[g][4q .. 4q+3], a1 = A[g+8][4q .. 4q+3],
 *                                        a2 = A[g][16+4q .. 16+4q+3], a3 = A[g+8][16+4q .. 16+4q+3].
 *   B (32 x 8, "col": k runs within a register, 2 registers): b0 = B[4q .. 4q+3][g], b1 = B[16+4q .. 16+4q+3][g].
 *   C/D (16 x 8 fp32, 4 registers): d0 = D[g][2q], d1 = D[g][2q+1], d2 = D[g+8][2q], d3 = D[g+8][2q+1].
 * Here A = 16 weight rows (M = output features), B = 8 tokens (N): a decode step pads tokens to 8, not 16, and the
 * weight bytes stream through A. The k index of an MMA is any one-to-one map onto the chunk's columns as long as A
 * and B use the same one; we pick maps that make each lane's bytes contiguous in memory:
 *   FP8 (lane q of a group holds columns [32q, 32q + 32) of the chunk for its rows and its token: two 16-byte
 *        loads per row): MMA j, k = 4q + i -> column 32q + 8j + i, k = 16 + 4q + i -> column 32q + 8j + 4 + i.
 *        So a0/a2 = words 2j / 2j+1 of row g's 32 bytes, a1/a3 the same of row g+8, b0/b1 the token's.
 *   FP4 (an MMA must stay inside one 32-column scale block b): k = 4q + i -> column 32b + 8q + i,
 *        k = 16 + 4q + i -> column 32b + 8q + 4 + i: lane q's 8 columns of block b are one 32-bit word of FP4
 *        (nibbles 0..3 -> a0/a1, nibbles 4..7 -> a2/a3) and 8 bytes of activation (b0, b1).
 * Every output element is a dot product over all of its columns whatever the map; the map is fixed, so the order
 * of the products inside one MMA is fixed too. */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_hc_post.cuh"
#include "backend/cuda/cu_kernels.h"   /* CU_MIX */
#include "backend/cuda/cu_mma.h"
#include "backend/cuda/cu_mma_frag.cuh"   /* mma_e4m3, prmt, e2m1x4_e4m3 */
#include "backend/cuda/cu_mma_gemm.h"
#include "backend/cuda/cu_mma_stream.h"
#include "backend/cuda/cu_quant.cuh"
#include "model/expert_place.h"
extern "C" {
#include "util/error.h"
}

#define MMA_PARTS 4   /* warps of a block = partial sums of an element (the order above) */

/* -DDSV4_MMA_BUG: a deliberate fragment bug (the first MMA of a chunk / block takes the activation's two words
 * swapped), to see test_gpu_mma fail. Never in a real build. */
#ifdef DSV4_MMA_BUG
#define MMA_B01(lo, hi) hi, lo
#else
#define MMA_B01(lo, hi) lo, hi
#endif

/* ---- PTX (tools/gpu/shim/shim_mma.sh replaces this section by C++ of the same definitions) ---- */

/* 16 bytes of a weight that is read once (a decode step streams it): not kept in L1, and L2 asked to fetch the
 * 256-byte span around it (the block's four warps read four consecutive 64-byte chunks of each FP4 row at once).
 * Read-only for the whole kernel (.nc). p 16-byte aligned. */
__device__ __forceinline__ uint4 ld_stream16(const uint8_t *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(__cvta_generic_to_global(p)));
    return v;
}

/* 4 bytes read-only for the whole kernel, through the non-coherent path. p 4-byte aligned. */
__device__ __forceinline__ uint32_t ld_nc32(const uint8_t *p) {
    uint32_t v;
    asm("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(__cvta_generic_to_global(p)));
    return v;
}

/* 8 bytes read-only for the whole kernel, through the non-coherent path. p 8-byte aligned. */
__device__ __forceinline__ uint2 ld_nc64(const uint8_t *p) {
    uint2 v;
    asm("ld.global.nc.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(__cvta_generic_to_global(p)));
    return v;
}

/* ---- end of PTX ---- */

__device__ __forceinline__ uint4 ld16(const uint8_t *p) { return *(const uint4 *)p; }

/* ---- FP4 weight loads (MMA_FP4_VEC) ----
 * The fragment wants lane (g, q) to hold word q (its 8 columns) of each 32-column block j of rows g and g + 8:
 * four 4-byte words 16 bytes apart, so the word-wise path (mode 0) loads 4 bytes a lane, 8 rows (8 cache lines) an
 * instruction, plus one scale byte per (row, block) (run 36: ~0.9 TB/s at decode). The vector paths have lane q
 * load the whole of block q (16 bytes) of rows g and g + 8, then the four lanes of a quad swap words (a 4 x 4
 * transpose by two rounds of shuffles): afterwards every register holds exactly the word the word-wise path loads,
 * so the MMAs, their operands and their order are the same and so are the bits (test_gpu_mma compares them by
 * memcmp). 4x fewer weight load instructions, each moving 64 contiguous bytes a row. The scales:
 *   mode 1: lane q loads the scale byte of block q of its two rows, the quad swaps them (quad_scales);
 *   mode 2: lane q < U loads the 4 scale bytes (one word when the scale rows are word-aligned and the chunk whole)
 *           of chunk u = q of its two rows, every lane then takes its chunks' words by shuffles: 4x fewer again.
 * Weights whose data is not 16-byte aligned (an FP4 tensor in a file need only be 4-byte aligned) take the vector
 * path's shuffles with four word loads in place of the 16-byte one. MMA_FP4_VEC=0 / 1 / 2 sets the build's mode,
 * cu_mma_fp4_vec(mode) switches it at run time (tests, benchmarks).
 * The default is mode 0: run 39's micro-benchmark on the H200 (test_gpu_mma --bench-experts: one MoE layer's six
 * FP4 experts at one token, w1 + w3 in one launch) timed mode 0 at 80.2 us a layer (1001 GB/s), mode 1 at 88.5 and
 * mode 2 at 90.8: fewer load instructions did not make the loads faster. Equal at 8 tokens. */
#ifndef MMA_FP4_VEC
#define MMA_FP4_VEC 0
#endif
/* Blocks of k_mma_expert (vector path) an SM must hold at once (registers capped to fit): a decode step's expert
 * launch is 6 x 128 or 6 x 256 blocks, a few waves over 132 SMs, so fewer waves and more loads in flight. */
#ifndef MMA_EXPERT_BLOCKS
#define MMA_EXPERT_BLOCKS 4
#endif
/* The same for the word-wise path (0: no bound) and the chunks whose loads an expert warp issues at once
 * (MMA_EXPERT_U). Neither changes an order: a partial still takes its chunks in increasing c. Run 42's ncu at U 4:
 * 168 registers a thread, 3 blocks an SM, 2.8 warps a scheduler, issue-bound; run 43's decode A/B (the same bits):
 * U 2 (96 registers, 5 blocks an SM) 88.9 / 87.5 tok/s, U 4 84.5 / 84.4, U 8 77.5, U 4 bounded to 4 blocks (spills)
 * 84.3. */
#ifndef MMA_EXPERT_WORD_BLOCKS
#define MMA_EXPERT_WORD_BLOCKS 0
#endif
#ifndef MMA_EXPERT_U
#define MMA_EXPERT_U 2
#endif

/* v = words 0..3 of block q (lane q of the quad) -> words q of blocks 0..3: element [j][w] of the quad's 4 x 4
 * (lane j's word w) ends in lane w's word j. Round 1 swaps, between lanes q and q ^ 1, the words whose bit 0
 * differs from q's; round 2 the same with bit 1. Every lane of the warp must call it (shuffles). */
__device__ __forceinline__ void quad_transpose(uint4 &v, int q) {
    const bool o1 = q & 1, o2 = q & 2;
    uint32_t s0 = o1 ? v.x : v.y, s1 = o1 ? v.z : v.w;
    s0 = __shfl_xor_sync(0xffffffffu, s0, 1);
    s1 = __shfl_xor_sync(0xffffffffu, s1, 1);
    if (o1) { v.x = s0; v.z = s1; } else { v.y = s0; v.w = s1; }
    s0 = o2 ? v.x : v.z;
    s1 = o2 ? v.y : v.w;
    s0 = __shfl_xor_sync(0xffffffffu, s0, 2);
    s1 = __shfl_xor_sync(0xffffffffu, s1, 2);
    if (o2) { v.x = s0; v.y = s1; } else { v.z = s0; v.w = s1; }
}

/* s = lane q's scale bytes of block q (byte 0: row g, byte 1: row g + 8) -> all four blocks' of the quad: byte
 * 2 (j & 1) + h of word j >> 1 is (block j, row g + 8 h). Every lane of the warp must call it. */
__device__ __forceinline__ uint2 quad_scales(uint32_t s, int q) {
    const uint32_t o = __shfl_xor_sync(0xffffffffu, s, 1);
    const uint32_t pair = q & 1 ? o | s << 16 : s | o << 16;   /* blocks q & ~1 (low half), q | 1 (high half) */
    const uint32_t other = __shfl_xor_sync(0xffffffffu, pair, 2);
    return q & 2 ? make_uint2(other, pair) : make_uint2(pair, other);
}

/* Token n of a block's T: input row in_rows[in_base + n] (or in_base + n without a list) of xq / xs, output row
 * out_base + n of y. The plain linear maps n to n; an expert's tile maps its pairs to their tokens. */
__device__ __forceinline__ int64_t mma_in_row(const int32_t *in_rows, int in_base, int n) {
    return in_rows ? in_rows[in_base + n] : (int64_t)in_base + n;
}

/* What the epilogue does with an output element instead of storing it (X not NULL: cu_mma_linear_post): mHC's post
 * step of element r of token n (cu_hc_post.cuh hc_post_elem4, as k_hc_post does it for hc = 4), the element's value
 * — rounded as the store would round it — as the sub-layer's output. X [T][4][d] the streams, mix [T][CU_MIX]. */
struct mma_post {
    const float *mix;
    float *X;
    int d, official;
};

/* y = ((p0 + p1) + p2) + p3 of a block's tile (rows [row_base, +16 MT) x tokens [tok_base, +8 NT); warp p holds
 * partial p in acc): warps 1..3 hand their partials to warp 0 through red (the caller's shared array), which adds
 * them in that order and stores rows < N, tokens < T (BF16-rounded when asked), or hands each to post. Every
 * thread of the block calls it. */
template <int MT, int NT>
__device__ __forceinline__ void mma_sum_store(const float (&acc)[MT][NT][4], float (*red)[MT * NT * 4][32], int N, int T, float *__restrict__ y,
                                              int ldy, int out_bf16, int row_base, int tok_base, int out_base,
                                              const mma_post &post = mma_post{}) {
    const int lane = threadIdx.x & 31, part = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    if (part > 0) {
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int ni = 0; ni < NT; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) red[part - 1][(mi * NT + ni) * 4 + e][lane] = acc[mi][ni][e];
    }
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = acc[mi][ni][e];
#pragma unroll
                for (int p = 0; p < MMA_PARTS - 1; p++) v += red[p][(mi * NT + ni) * 4 + e][lane];
                const int r = row_base + 16 * mi + g + 8 * (e >> 1), n = tok_base + 8 * ni + 2 * q + (e & 1);
                if (r >= N || n >= T) continue;
                const float o = out_bf16 ? dev_round_bf16(v) : v;
                const int64_t t = (int64_t)out_base + n;
                if (post.X) hc_post_elem4(post.official, o, post.mix + t * CU_MIX, post.X + t * 4 * post.d, post.d, r);
                else y[t * ldy + r] = o;
            }
}

/* One block: rows [row_base, +16 MT) x tokens [tok_base, +8 NT) of T; warp p = partial p. U chunks' loads are
 * issued before the first of them is used (several loads in flight a lane). */
template <int FP4, int MT, int NT, int U, int VEC>
__device__ __forceinline__ void mma_block(const dsv4_weight &w, const uint8_t *__restrict__ xq, int ldq, const float *__restrict__ xs,
                                          int lds, int T, float *__restrict__ y, int ldy, int out_bf16, int row_base, int tok_base,
                                          const int32_t *__restrict__ in_rows, int in_base, int out_base,
                                          const mma_post &post = mma_post{}) {
    const int lane = threadIdx.x & 31, part = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int N = w.rows, K = w.cols, nchunk = (K + 127) / 128;
    const uint8_t *wd = (const uint8_t *)w.data;
    const int64_t wstride = FP4 ? K / 2 : K;
    const bool w16 = ((uintptr_t)wd & 15) == 0;   /* FP4 rows start 16-byte aligned (K / 2 is a multiple of 16) */
    const bool s4 = ((uintptr_t)w.scale & 3) == 0 && (w.scale_cols & 3) == 0;   /* FP4 scale rows word-aligned */

    __shared__ float red[MMA_PARTS - 1][MT * NT * 4][32];
    float acc[MT][NT][4];
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;

    for (int c0 = part; c0 < nchunk; c0 += MMA_PARTS * U) {
        if constexpr (!FP4) {
            uint4 a[U][MT][2][2], b[U][NT][2];
            float sw[U][MT][2], sx[U][NT][2];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u * MMA_PARTS;
                const bool cv = c < nchunk;
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int r = row_base + 16 * mi + g + 8 * h;
                        if (cv && r < N) {
                            const uint8_t *p = wd + r * wstride + 128 * c + 32 * q;
                            a[u][mi][h][0] = ld16(p);
                            a[u][mi][h][1] = ld16(p + 16);
                            sw[u][mi][h] = dev_e8m0(w.scale[(int64_t)((w.row0 + r) / 128) * w.scale_cols + c]);
                        } else {
                            a[u][mi][h][0] = a[u][mi][h][1] = make_uint4(0, 0, 0, 0);
                            sw[u][mi][h] = 0.0f;
                        }
                    }
#pragma unroll
                for (int ni = 0; ni < NT; ni++) {
                    const int n = tok_base + 8 * ni + g;
                    if (cv && n < T) {
                        const uint8_t *p = xq + mma_in_row(in_rows, in_base, n) * ldq + 128 * c + 32 * q;
                        b[u][ni][0] = ld16(p);
                        b[u][ni][1] = ld16(p + 16);
                    } else {
                        b[u][ni][0] = b[u][ni][1] = make_uint4(0, 0, 0, 0);
                    }
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int nc = tok_base + 8 * ni + 2 * q + e;
                        sx[u][ni][e] = cv && nc < T ? xs[mma_in_row(in_rows, in_base, nc) * lds + c] : 0.0f;
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (c0 + u * MMA_PARTS >= nchunk) break;
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int ni = 0; ni < NT; ni++) {
                        float f[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
                        const uint4 &r0l = a[u][mi][0][0], &r0h = a[u][mi][0][1], &r1l = a[u][mi][1][0], &r1h = a[u][mi][1][1];
                        const uint4 &bl = b[u][ni][0], &bh = b[u][ni][1];
                        mma_e4m3(f, r0l.x, r1l.x, r0l.y, r1l.y, MMA_B01(bl.x, bl.y));   /* j = 0: words 0, 1 */
                        mma_e4m3(f, r0l.z, r1l.z, r0l.w, r1l.w, bl.z, bl.w);   /* j = 1: words 2, 3 */
                        mma_e4m3(f, r0h.x, r1h.x, r0h.y, r1h.y, bh.x, bh.y);   /* j = 2: words 4, 5 */
                        mma_e4m3(f, r0h.z, r1h.z, r0h.w, r1h.w, bh.z, bh.w);   /* j = 3: words 6, 7 */
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            acc[mi][ni][e] = fmaf(f[e], sw[u][mi][e >> 1] * sx[u][ni][e & 1], acc[mi][ni][e]);
                    }
            }
        } else {
            uint32_t a[U][MT][2][4];
            uint8_t swb[U][MT][2][4];   /* the word-wise path's scale bytes; the vector path's stay packed in sc */
            uint2 sc[U][MT];
            uint2 b[U][NT][4];
            float sx[U][NT][2];
            int nb[U];
            if constexpr (VEC == 2) {   /* lane q: the scale words of chunk u = q of rows g, g + 8; then each lane takes its own */
                static_assert(U <= 4, "one chunk's scale words a lane of the quad");
                const int cq = c0 + q * MMA_PARTS, nbq = q < U && cq < nchunk ? min(4, (K - 128 * cq) / 32) : 0;
                uint32_t mine[MT][2];
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int r = row_base + 16 * mi + g + 8 * h;
                        mine[mi][h] = 0;
                        if (nbq && r < N) {
                            const uint8_t *sp = w.scale + (int64_t)(w.row0 + r) * w.scale_cols + 4 * cq;
                            if (nbq == 4 && s4) mine[mi][h] = ld_nc32(sp);
                            else
                                for (int j = 0; j < nbq; j++) mine[mi][h] |= (uint32_t)sp[j] << (8 * j);
                        }
                    }
#pragma unroll
                for (int u = 0; u < U; u++)
#pragma unroll
                    for (int mi = 0; mi < MT; mi++)
                        sc[u][mi] = make_uint2(__shfl_sync(0xffffffffu, mine[mi][0], (lane & ~3) | u),
                                               __shfl_sync(0xffffffffu, mine[mi][1], (lane & ~3) | u));
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u * MMA_PARTS;
                nb[u] = c < nchunk ? min(4, (K - 128 * c) / 32) : 0;
#pragma unroll
                for (int mi = 0; mi < MT; mi++) {
                    if constexpr (VEC) {   /* lane q: block q of rows g, g + 8, then the quad's transpose (above) */
                        uint32_t sq = 0;
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const int r = row_base + 16 * mi + g + 8 * h;
                            uint4 v = make_uint4(0, 0, 0, 0);
                            if (q < nb[u] && r < N) {
                                const uint8_t *p = wd + r * wstride + 64 * c + 16 * q;
                                if (w16) v = ld_stream16(p);
                                else v = make_uint4(*(const uint32_t *)p, *(const uint32_t *)(p + 4), *(const uint32_t *)(p + 8),
                                                    *(const uint32_t *)(p + 12));
                                if constexpr (VEC == 1) sq |= (uint32_t)w.scale[(int64_t)(w.row0 + r) * w.scale_cols + 4 * c + q] << (8 * h);
                            }
                            quad_transpose(v, q);
                            a[u][mi][h][0] = v.x;
                            a[u][mi][h][1] = v.y;
                            a[u][mi][h][2] = v.z;
                            a[u][mi][h][3] = v.w;
                        }
                        if constexpr (VEC == 1) sc[u][mi] = quad_scales(sq, q);
                    } else {
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const int r = row_base + 16 * mi + g + 8 * h;
#pragma unroll
                            for (int j = 0; j < 4; j++) {
                                if (j < nb[u] && r < N) {
                                    a[u][mi][h][j] = *(const uint32_t *)(wd + r * wstride + 64 * c + 16 * j + 4 * q);
                                    swb[u][mi][h][j] = w.scale[(int64_t)(w.row0 + r) * w.scale_cols + 4 * c + j];
                                } else {
                                    a[u][mi][h][j] = 0;
                                    swb[u][mi][h][j] = 0;
                                }
                            }
                        }
                    }
                }
#pragma unroll
                for (int ni = 0; ni < NT; ni++) {
                    const int n = tok_base + 8 * ni + g;
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        b[u][ni][j] = j < nb[u] && n < T ? *(const uint2 *)(xq + mma_in_row(in_rows, in_base, n) * ldq + 128 * c +
                                                                            32 * j + 8 * q)
                                                         : make_uint2(0, 0);
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int nc = tok_base + 8 * ni + 2 * q + e;
                        sx[u][ni][e] = nb[u] && nc < T ? xs[mma_in_row(in_rows, in_base, nc) * lds + c] : 0.0f;
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        if (j >= nb[u]) break;
                        const uint32_t a0 = e2m1x4_e4m3(a[u][mi][0][j]), a1 = e2m1x4_e4m3(a[u][mi][1][j]);
                        const uint32_t a2 = e2m1x4_e4m3(a[u][mi][0][j] >> 16), a3 = e2m1x4_e4m3(a[u][mi][1][j] >> 16);
                        float s0, s1;
                        if constexpr (VEC == 1) {   /* byte 2 (j & 1) + h of word j >> 1 */
                            const uint32_t sj = (j < 2 ? sc[u][mi].x : sc[u][mi].y) >> (16 * (j & 1));
                            s0 = dev_e8m0((uint8_t)sj);
                            s1 = dev_e8m0((uint8_t)(sj >> 8));
                        } else if constexpr (VEC == 2) {   /* byte j of row g's word, of row g + 8's */
                            s0 = dev_e8m0((uint8_t)(sc[u][mi].x >> (8 * j)));
                            s1 = dev_e8m0((uint8_t)(sc[u][mi].y >> (8 * j)));
                        } else {
                            s0 = dev_e8m0(swb[u][mi][0][j]);
                            s1 = dev_e8m0(swb[u][mi][1][j]);
                        }
#pragma unroll
                        for (int ni = 0; ni < NT; ni++) {
                            float f[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
                            mma_e4m3(f, a0, a1, a2, a3, MMA_B01(b[u][ni][j].x, b[u][ni][j].y));
                            acc[mi][ni][0] = fmaf(f[0], s0 * sx[u][ni][0], acc[mi][ni][0]);
                            acc[mi][ni][1] = fmaf(f[1], s0 * sx[u][ni][1], acc[mi][ni][1]);
                            acc[mi][ni][2] = fmaf(f[2], s1 * sx[u][ni][0], acc[mi][ni][2]);
                            acc[mi][ni][3] = fmaf(f[3], s1 * sx[u][ni][1], acc[mi][ni][3]);
                        }
                    }
            }
        }
    }

    mma_sum_store<MT, NT>(acc, red, N, T, y, ldy, out_bf16, row_base, tok_base, out_base, post);
}

/* blockIdx.z = 1: the second weight of a pair over the same input (cu_mma_linear_pair: w_b into y_b); the grid
 * covers the taller of the two, a block past its weight's rows has nothing to do. */
template <int FP4, int MT, int NT, int U, int VEC>
__global__ void __launch_bounds__(32 * MMA_PARTS) k_mma_linear(dsv4_weight w_a, dsv4_weight w_b, const uint8_t *__restrict__ xq, int ldq,
                                                                const float *__restrict__ xs, int lds, int T, float *y_a, int ldy_a,
                                                                float *y_b, int ldy_b, int out_bf16, mma_post post) {
    dev_grid_wait();
    const dsv4_weight w = blockIdx.z ? w_b : w_a;
    float *y = blockIdx.z ? y_b : y_a;
    const int ldy = blockIdx.z ? ldy_b : ldy_a;
    if ((int)blockIdx.x * 16 * MT >= w.rows) return;
    mma_block<FP4, MT, NT, U, VEC>(w, xq, ldq, xs, lds, T, y, ldy, out_bf16, blockIdx.x * 16 * MT, blockIdx.y * 8 * NT, NULL, 0, 0, post);
}

/* An expert another GPU holds (cuda_ep.h) or the host computes: its rows [row_base, +16) of pairs p0 .. p0 + n - 1
 * are EP_ABSENT_ROW, the exact gather's identity. */
__device__ __forceinline__ void expert_absent(float *y, int ldy, int p0, int n, int row_base, int rows) {
    for (int i = threadIdx.x; i < 16 * n; i += blockDim.x) {
        const int r = row_base + i % 16;
        if (r < rows) y[((int64_t)p0 + i / 16) * ldy + r] = EP_ABSENT_ROW;
    }
}

/* The tile of an expert kernel's block: blockIdx.y of the plan, blockIdx.z the projection (experts_b into y_b). */
struct expert_tile {
    dsv4_weight w;
    float *y;
    int p0, n, row_base;   /* the tile's first pair, its pair count, the block's first row */
};

/* Opens the block's tile into t: false when the block has nothing (more) to do — a tile past n_tiles, an absent
 * expert (its rows written EP_ABSENT_ROW here), a tile without pairs (the lean kernel's clamps need one). */
__device__ __forceinline__ bool expert_tile_open(const dsv4_weight *experts_a, const dsv4_weight *experts_b, const cu_moe_plan &plan, int rows,
                                                 float *y_a, float *y_b, int ldy, expert_tile &t) {
    const int tile = blockIdx.y;
    t.y = blockIdx.z ? y_b : y_a;
    if (tile >= *plan.n_tiles) return false;
    t.w = (blockIdx.z ? experts_b : experts_a)[plan.tile_expert[tile]];
    t.p0 = plan.tile_first[tile];
    t.n = plan.tile_count[tile];
    t.row_base = blockIdx.x * 16;
    if (!t.w.data) {
        expert_absent(t.y, ldy, t.p0, t.n, t.row_base, rows);
        return false;
    }
    return t.n > 0;
}

/* The routed experts' tiles of a MoE plan (k_linear.cu k_expert_linear's contract): tile blockIdx.y is expert
 * tile_expert[tile] over its tile_count (<= CU_MOE_TILE = 8: one n8 column) pairs from tile_first; pair p reads
 * input row p (x_by_pair) or pair_token[p] and writes output row p. The same order per element as the plain
 * linear (mma_block), so a pair's row does not depend on the tile it shares. blockIdx.z = 1 computes the second
 * projection of a pair over the same input (w3 beside w1: cu_mma_expert_linear_pair) from experts_b into y_b. */
template <int FP4, int VEC>
__global__ void __launch_bounds__(32 * MMA_PARTS, VEC ? MMA_EXPERT_BLOCKS : MMA_EXPERT_WORD_BLOCKS) k_mma_expert(const dsv4_weight *__restrict__ experts_a,
                                                                const dsv4_weight *__restrict__ experts_b, int rows, cu_moe_plan plan,
                                                                const uint8_t *__restrict__ xq, int ldq, const float *__restrict__ xs,
                                                                int lds, int x_by_pair, float *y_a, float *y_b, int ldy,
                                                                int out_bf16) {
    dev_grid_wait();
    const dsv4_weight *experts = blockIdx.z ? experts_b : experts_a;
    float *y = blockIdx.z ? y_b : y_a;
    const int tile = blockIdx.y;
    if (tile >= *plan.n_tiles) return;
    dsv4_weight w = experts[plan.tile_expert[tile]];
    const int p0 = plan.tile_first[tile], n = plan.tile_count[tile], row_base = blockIdx.x * 16;
    if (!w.data) {
        expert_absent(y, ldy, p0, n, row_base, rows);
        return;
    }
    w.rows = rows;
    mma_block<FP4, 1, 1, (VEC == 2 && MMA_EXPERT_U > 4 ? 4 : MMA_EXPERT_U), VEC>(w, xq, ldq, xs, lds, n, y, ldy, out_bf16, row_base, 0, x_by_pair ? NULL : plan.pair_token, p0, p0);
}

/* ---- FP4 experts, lean (MMA_EXPERT_LEAN) ----
 * k_mma_expert's FP4 work for whole 128-column chunks (K a multiple of 128: every V4 expert) with mma_block's
 * word-wise instructions cut to what the arithmetic needs. Runs 42 and 44's ncu found the expert kernels issue-bound
 * at ~1 TB/s, and nvcc's PTX for mma_block<FP4, 1, 1, 2, 0> holds ~137 instructions a 32-column block a lane (of which
 * 22 convert E2M1 to E4M3, 1 is the MMA and 8 apply the scales): predicated loads with zero fills, 64-bit address
 * arithmetic a load, a scale byte load a (row, block). Here:
 *   - no row or token guards: a slab's rows past the weight re-read row N - 1, tokens past the tile's count re-read
 *     its last token. An MMA output element depends only on its own row of A and column of B (k_mma.cu's top
 *     comment), and those rows and columns are never stored;
 *   - pointers to rows g, g + 8, to the lane's token bytes and to the scale rows made once; a chunk is an offset;
 *   - the 4 scale bytes of a (row, chunk) one word (4 byte loads where the scale rows are not word-aligned),
 *     decoded by a shift when no byte of the warp's scale words of the chunk is 0 or 255 (E8M0's two codes that
 *     dev_e8m0 treats apart; it decodes such a chunk). The choice is the warp's, not the lane's: both paths hold
 *     an mma.sync.aligned, which all 32 lanes must execute together.
 * Every stored element gets the operands, scales, fmaf chains and partial order of mma_block's (warp p: chunks
 * p, p + 4, ... in increasing order; each block's MMA from 0, then fmaf(P, sw * sx, p)): the same bits, which
 * test_gpu_mma checks by memcmp against the plain linear. MMA_EXPERT_LEAN_U chunks' loads in flight a warp. A variant
 * with the tile in shared memory through the bulk copy engine was measured slower (runs 48-50, docs/GPU_RUNS.md). */
#ifndef MMA_EXPERT_LEAN
#define MMA_EXPERT_LEAN 1   /* the model's default comes from DSV4_CUDA_EXPERT_LEAN (cuda_model.c) */
#endif
#ifndef MMA_EXPERT_LEAN_U
#define MMA_EXPERT_LEAN_U 1   /* run 45, decode at prompt 256: U 1 95.84 / 95.34 tok/s, 2 94.12 / 94.53, 4 95.20 / 94.62 */
#endif
#ifndef MMA_EXPERT_LEAN_BLOCKS
#define MMA_EXPERT_LEAN_BLOCKS 1   /* blocks an SM its registers must allow (__launch_bounds__; 1: no bound) */
#endif

/* Whether any byte of a or b is 0 or 255. */
__device__ __forceinline__ bool e8m0_special2(uint32_t a, uint32_t b) {
    const uint32_t za = (a - 0x01010101u) & ~a, zb = (b - 0x01010101u) & ~b;   /* a zero byte sets its bit 7 */
    const uint32_t fa = (~a - 0x01010101u) & a, fb = (~b - 0x01010101u) & b;   /* a 0xff byte: ~a's zero byte */
    return ((za | zb | fa | fb) & 0x80808080u) != 0;
}

/* Scale byte j of word s: 2^(byte - 127) by a shift (PLAIN: the byte is neither 0 nor 255), else dev_e8m0. */
template <bool PLAIN> __device__ __forceinline__ float e8m0_byte(uint32_t s, int j) {
    const uint32_t b = (s >> (8 * j)) & 0xffu;
    return PLAIN ? __uint_as_float(b << 23) : dev_e8m0((uint8_t)b);
}

/* One chunk of a lean warp: blocks j = 0..3, each an MMA from 0 and four fmaf (mma_block's FP4 step, VEC 0). */
template <bool PLAIN>
__device__ __forceinline__ void lean_chunk(float (&acc)[4], const uint32_t (&a0w)[4], const uint32_t (&a1w)[4], uint32_t sw0, uint32_t sw1,
                                           const uint2 (&b)[4], float sx0, float sx1) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const uint32_t a0 = e2m1x4_e4m3(a0w[j]), a1 = e2m1x4_e4m3(a1w[j]);
        const uint32_t a2 = e2m1x4_e4m3(a0w[j] >> 16), a3 = e2m1x4_e4m3(a1w[j] >> 16);
        const float s0 = e8m0_byte<PLAIN>(sw0, j), s1 = e8m0_byte<PLAIN>(sw1, j);
        float f[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
        mma_e4m3(f, a0, a1, a2, a3, MMA_B01(b[j].x, b[j].y));
        acc[0] = fmaf(f[0], s0 * sx0, acc[0]);
        acc[1] = fmaf(f[1], s0 * sx1, acc[1]);
        acc[2] = fmaf(f[2], s1 * sx0, acc[2]);
        acc[3] = fmaf(f[3], s1 * sx1, acc[3]);
    }
}

/* The 4 scale bytes of one (row, chunk) as a word: one load when aligned (s4), else four. */
__device__ __forceinline__ uint32_t lean_scale_word(const uint8_t *p, bool s4) {
    if (s4) return ld_nc32(p);
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A lean lane's pointers into its tile (k_mma_expert_lean, k_mma_expert_frag): the weight rows g and g + 8 (past the
 * weight: its last row, whose outputs nobody stores) from byte wofs of their chunk 0, their scale rows, the token's
 * activation bytes (8 q of block 0: lane g's token, clamped to the tile's last), the activation scale rows of the
 * fragment's tokens 2 q and 2 q + 1 (clamped), and whether the scale rows are word-aligned. */
struct lean_lane {
    const uint8_t *wa, *wb, *sa, *sb, *xb;
    const float *xs0, *xs1;
    bool s4;
};
__device__ __forceinline__ lean_lane lean_lane_of(const expert_tile &t, int rows, const cu_moe_plan &plan, int x_by_pair,
                                                  const uint8_t *__restrict__ xq, int ldq, const float *__restrict__ xs, int lds, int wofs) {
    const dsv4_weight &w = t.w;
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3, K = w.cols;
    const int r0 = min(t.row_base + g, rows - 1), r1 = min(t.row_base + g + 8, rows - 1);
    const int32_t *in_rows = x_by_pair ? NULL : plan.pair_token;
    lean_lane l;
    l.wa = (const uint8_t *)w.data + (int64_t)r0 * (K / 2) + wofs;
    l.wb = (const uint8_t *)w.data + (int64_t)r1 * (K / 2) + wofs;
    l.sa = w.scale + (int64_t)(w.row0 + r0) * w.scale_cols;
    l.sb = w.scale + (int64_t)(w.row0 + r1) * w.scale_cols;
    l.s4 = ((uintptr_t)w.scale & 3) == 0 && (w.scale_cols & 3) == 0;
    l.xb = xq + mma_in_row(in_rows, t.p0, min(g, t.n - 1)) * ldq + 8 * q;
    l.xs0 = xs + mma_in_row(in_rows, t.p0, min(2 * q, t.n - 1)) * lds;
    l.xs1 = xs + mma_in_row(in_rows, t.p0, min(2 * q + 1, t.n - 1)) * lds;
    return l;
}

/* k_mma_expert<1, 0>'s contract (grid, plan, pairs, absent experts) for K % 128 == 0. */
template <int U>
__global__ void __launch_bounds__(32 * MMA_PARTS, MMA_EXPERT_LEAN_BLOCKS) k_mma_expert_lean(const dsv4_weight *__restrict__ experts_a,
                                                                     const dsv4_weight *__restrict__ experts_b, int rows, cu_moe_plan plan,
                                                                     const uint8_t *__restrict__ xq, int ldq, const float *__restrict__ xs,
                                                                     int lds, int x_by_pair, float *y_a, float *y_b, int ldy, int out_bf16) {
    dev_grid_wait();
    __shared__ float red[MMA_PARTS - 1][4][32];
    expert_tile t;
    if (!expert_tile_open(experts_a, experts_b, plan, rows, y_a, y_b, ldy, t)) return;
    const int part = threadIdx.x >> 5, q = threadIdx.x & 3, nchunk = t.w.cols / 128;
    /* block j of chunk c: weight + 64 c + 16 j, scales + 4 c, activation + 128 c + 32 j */
    const lean_lane l = lean_lane_of(t, rows, plan, x_by_pair, xq, ldq, xs, lds, 4 * q);
    const uint8_t *wa = l.wa, *wb = l.wb, *sa = l.sa, *sb = l.sb, *xb = l.xb;
    const float *xs0 = l.xs0, *xs1 = l.xs1;
    const bool s4 = l.s4;
    float acc[1][1][4] = { { { 0.0f, 0.0f, 0.0f, 0.0f } } };
    for (int c0 = part; c0 < nchunk; c0 += MMA_PARTS * U) {
        uint32_t a0w[U][4], a1w[U][4], sw0[U], sw1[U];
        uint2 b[U][4];
        float sx0[U], sx1[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = c0 + u * MMA_PARTS;
            if (c >= nchunk) break;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                a0w[u][j] = ld_nc32(wa + 64 * c + 16 * j);
                a1w[u][j] = ld_nc32(wb + 64 * c + 16 * j);
                b[u][j] = ld_nc64(xb + 128 * c + 32 * j);
            }
            sw0[u] = lean_scale_word(sa + 4 * c, s4);
            sw1[u] = lean_scale_word(sb + 4 * c, s4);
            sx0[u] = xs0[c];
            sx1[u] = xs1[c];
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c0 + u * MMA_PARTS >= nchunk) break;
            /* warp-uniform: each branch holds its own mma.sync.aligned, which every lane of the warp must execute
             * together (run 46: a lane-wise choice hung the suite where some rows' scales had a 0 or 255 byte) */
            if (!__any_sync(0xffffffffu, e8m0_special2(sw0[u], sw1[u])))
                lean_chunk<true>(acc[0][0], a0w[u], a1w[u], sw0[u], sw1[u], b[u], sx0[u], sx1[u]);
            else
                lean_chunk<false>(acc[0][0], a0w[u], a1w[u], sw0[u], sw1[u], b[u], sx0[u], sx1[u]);
        }
    }
    mma_sum_store<1, 1>(acc, red, rows, t.n, t.y, ldy, out_bf16, t.row_base, 0, t.p0);
}

/* ---- FP4 experts on fragment-packed weights (cu_mma_expert_lean(2); issue 18, an experiment) ----
 * The lean kernel spends most of its instructions turning E2M1 codes into E4M3 bytes (e2m1x4_e4m3: five a four
 * codes, plus a shift a word) and issues eight 4-byte loads a row and chunk. cu_fp4_frag_pack rewrites an FP4
 * weight in place so that both get cheap, with every MMA still seeing the operands of lean_chunk up to one exact
 * factor:
 *   - words: in each 64-byte (row, 128-column chunk) unit, word 4j + q (block j, lane q's 8 columns) moves to
 *     4q + j, so lane q loads its four blocks' words of a row with one 16-byte load;
 *   - bits: of a word's 8 codes (code i = column 8q + i of its block, E2M1 s e1 e0 m), code i (0..3) sits in byte
 *     i at bit 7 (s) and bits 4..2 (e1 e0 m), and code 4 + i in the same byte's other bits: s at bit 5, e1 at bit
 *     6, e0 at bit 1, m at bit 0 (frag_bits).
 * Then byte i of  w & 0x9C9C9C9C  is the E4M3 byte of code i's value times 2^-6 (s, exponent e1 e0, mantissa m 0 0:
 * 2^(e - 7) (1 + m / 2) for e > 0 and 2^-6 m / 2 as a subnormal, E2M1's 2^(e - 1) (1 + m / 2) and m / 2 times
 * 2^-6), and byte i of  ((w << 2) & 0x8C8C8C8C) | ((w >> 2) & 0x10101010)  the same of code 4 + i: two and five
 * instructions a word for a0 / a2 where lean_chunk spends eleven.
 * So the MMA of a block gives P' = P / 64 of lean_chunk's P (every product scaled by 2^-6: the tensor core's sum of
 * 32 exact products is scale-invariant; test_gpu_mma holds this kernel to the plain linear by memcmp, which is
 * what checks that on the hardware). The scale step gets the 64 back exactly:
 *   - PLAIN (the warp's scale bytes of the chunk all in [64, 190] and both activation scales in [2^-60, 2^50] in
 *     magnitude): fmaf(P', sw * (sx * 64), p). sw * sx is then a normal float, so sw * sx and sw * (sx * 64) are
 *     exact and the second is 64 times the first: P' (sw (64 sx)) = P (sw sx) exactly, and fmaf rounds the same sum;
 *   - else (E8M0 0 / 255, or extreme scales): fmaf(P' * 64, dev_e8m0(b) * sx, p), P' * 64 = P exactly.
 * The order is lean_chunk's (warp p: chunks p, p + 4, ... increasing; each block's MMA from 0, then one fmaf a
 * block). Packed experts come as format CU_FMT_FP4_FRAG (cu_mma.h): the model packs its routed experts at load
 * (DSV4_CUDA_EXPERT_PACK, on by default), and cu_mma_expert_lean(2) makes the test programs' WF_FP4 calls of whole chunks
 * mean the same. Their readers: this kernel (small tiles) and k_mma_gemm.cu's expert GEMM (FP4 = 2); never the
 * streaming kernel or the CUDA-core paths. */

/* One chunk on packed weights: blocks j = 0..3 (words j of A0 / A1), as lean_chunk. PLAIN: sx0 / sx1 are the
 * activation scales times 64; else the scales themselves. */
template <bool PLAIN>
__device__ __forceinline__ void frag_chunk(float (&acc)[4], const uint4 &A0, const uint4 &A1, uint32_t sw0, uint32_t sw1,
                                           const uint2 (&b)[4], float sx0, float sx1) {
    const uint32_t w0[4] = { A0.x, A0.y, A0.z, A0.w }, w1[4] = { A1.x, A1.y, A1.z, A1.w };
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float f[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
        mma_e4m3(f, frag_lo(w0[j]), frag_lo(w1[j]), frag_hi(w0[j]), frag_hi(w1[j]), MMA_B01(b[j].x, b[j].y));
        if (!PLAIN)
#pragma unroll
            for (int e = 0; e < 4; e++) f[e] *= 64.0f;
        const float s0 = e8m0_byte<PLAIN>(sw0, j), s1 = e8m0_byte<PLAIN>(sw1, j);
        acc[0] = fmaf(f[0], s0 * sx0, acc[0]);
        acc[1] = fmaf(f[1], s0 * sx1, acc[1]);
        acc[2] = fmaf(f[2], s1 * sx0, acc[2]);
        acc[3] = fmaf(f[3], s1 * sx1, acc[3]);
    }
}

/* k_mma_expert_lean's contract on packed weights (K % 128 == 0, rows 16-byte aligned). PF: the loads of a warp's
 * chunk c + 4 PF are issued before chunk c's MMAs (a ring of PF + 1 register sets: run 67's ncu found the kernel
 * waiting on its loads, 47 % of issue slots without an eligible warp, one chunk of ~1 KB a warp in flight); MINB:
 * the blocks an SM must hold (__launch_bounds__; 1 = no bound). Neither changes an order: every warp still takes its
 * chunks in increasing c, each block's MMA from 0 then one fmaf. */
template <int PF, int MINB>
__global__ void __launch_bounds__(32 * MMA_PARTS, MINB) k_mma_expert_frag(const dsv4_weight *__restrict__ experts_a,
                                                                     const dsv4_weight *__restrict__ experts_b, int rows, cu_moe_plan plan,
                                                                     const uint8_t *__restrict__ xq, int ldq, const float *__restrict__ xs,
                                                                     int lds, int x_by_pair, float *y_a, float *y_b, int ldy, int out_bf16) {
    dev_grid_wait();
    constexpr int R = PF + 1;   /* register sets of the ring */
    __shared__ float red[MMA_PARTS - 1][4][32];
    expert_tile t;
    if (!expert_tile_open(experts_a, experts_b, plan, rows, y_a, y_b, ldy, t)) return;
    const int part = threadIdx.x >> 5, nchunk = t.w.cols / 128;
    /* chunk c: weight + 64 c (packed words 4q .. 4q + 3), scales + 4 c, activation + 128 c + 32 j for block j */
    const lean_lane l = lean_lane_of(t, rows, plan, x_by_pair, xq, ldq, xs, lds, 16 * (threadIdx.x & 3));
    float acc[1][1][4] = { { { 0.0f, 0.0f, 0.0f, 0.0f } } };
    uint4 A0[R], A1[R];
    uint32_t sw0[R], sw1[R];
    uint2 b[R][4];
    float sx0[R], sx1[R];
    auto load = [&](int c, int k) {
        A0[k] = ld_stream16(l.wa + 64 * c);
        A1[k] = ld_stream16(l.wb + 64 * c);
#pragma unroll
        for (int j = 0; j < 4; j++) b[k][j] = ld_nc64(l.xb + 128 * c + 32 * j);
        sw0[k] = lean_scale_word(l.sa + 4 * c, l.s4);
        sw1[k] = lean_scale_word(l.sb + 4 * c, l.s4);
        sx0[k] = l.xs0[c];
        sx1[k] = l.xs1[c];
    };
#pragma unroll
    for (int k = 0; k < PF; k++)
        if (part + k * MMA_PARTS < nchunk) load(part + k * MMA_PARTS, k);
    for (int c0 = part; c0 < nchunk; c0 += MMA_PARTS * R) {
#pragma unroll
        for (int u = 0; u < R; u++) {
            const int c = c0 + u * MMA_PARTS;
            if (c >= nchunk) break;
            if (c + PF * MMA_PARTS < nchunk) load(c + PF * MMA_PARTS, (u + PF) % R);
            /* warp-uniform (each branch holds its own mma.sync.aligned) */
            const bool out = frag_scale_out(sw0[u]) || frag_scale_out(sw1[u]) || frag_sx_out(sx0[u]) || frag_sx_out(sx1[u]);
            if (!__any_sync(0xffffffffu, out))
                frag_chunk<true>(acc[0][0], A0[u], A1[u], sw0[u], sw1[u], b[u], sx0[u] * 64.0f, sx1[u] * 64.0f);
            else
                frag_chunk<false>(acc[0][0], A0[u], A1[u], sw0[u], sw1[u], b[u], sx0[u], sx1[u]);
        }
    }
    mma_sum_store<1, 1>(acc, red, rows, t.n, t.y, ldy, out_bf16, t.row_base, 0, t.p0);
}


/* The packed kernel's variants (PF, MINB) for the micro-benchmark's A/B (cu_mma_expert_frag_variant); the model
 * runs variant MMA_EXPERT_FRAG_VARIANT. */
#ifndef MMA_EXPERT_FRAG_VARIANT
#define MMA_EXPERT_FRAG_VARIANT 3   /* run 68, one layer's experts at 1 / 8 tokens (us): lean 47.9 / 52.7; variants 0..5:
                                       44.6 / 47.2, 41.6 / 44.4, 45.9 / 49.2, 40.1 / 43.5, 40.2 / 42.3 (spills), 41.4 / 44.6 */
#endif
static int frag_variant = MMA_EXPERT_FRAG_VARIANT;

/* cu_fp4_frag_pack: one thread a 64-byte unit (a row's 128-column chunk), in place. */
__global__ void k_mma_frag_pack(uint32_t *__restrict__ d, int64_t units) {
    dev_grid_wait();
    fp4_units_pack(d, units, [](const uint32_t (&v)[16], int j, int q) { return frag_bits(v[4 * j + q]); });
}

/* One warp per (row, 128-column block): the block's scale from its amax by act_quant's rule, then each value over
 * it as E4M3 (exact for act-quantized rows: cu_mma.h). Lane l handles columns 4l .. 4l + 3 of the block. */
__global__ void k_mma_pack_act(const float *__restrict__ x, int ldx, int T, int K, uint8_t *__restrict__ xq, int ldq,
                               float *__restrict__ xs, int lds) {
    dev_grid_wait();
    const int nblk = (K + 127) / 128;
    const int64_t job = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (job >= (int64_t)T * nblk) return;
    const int t = (int)(job / nblk), blk = (int)(job % nblk), lane = threadIdx.x & 31;
    const float *xr = x + (int64_t)t * ldx + 128 * blk;
    const int len = min(128, K - 128 * blk);
    float v[4];
#pragma unroll
    for (int i = 0; i < 4; i++) v[i] = 4 * lane + i < len ? xr[4 * lane + i] : 0.0f;
    warp_pack_block(v, len, xq + (int64_t)t * ldq + 128 * blk, xs + (int64_t)t * lds + blk);
}

/* dev_f32_to_e4m3 (the build's) against the code search for the bit patterns [lo, lo + n) of this launch's slice:
 * mismatches counted, the smallest mismatching pattern kept (atomicMin: integers, any order). */
__global__ void k_e4m3_check(uint64_t lo, uint64_t n, unsigned long long *bad, unsigned int *first) {
    dev_grid_wait();
    for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t u = (uint32_t)(lo + i);
        const float x = __uint_as_float(u);
        if (dev_f32_to_e4m3(x) != dev_f32_to_e4m3_search(x)) {
            atomicAdd(bad, 1ull);
            atomicMin(first, u);
        }
    }
}

extern "C" int cu_mma_e4m3_check(unsigned long long *mismatches, unsigned int *first, dsv4_error *err) {
    unsigned long long *d_bad = NULL;
    unsigned int *d_first = NULL;
    const unsigned int none = 0xffffffffu;
    const unsigned long long zero = 0;
    int rc = 0;
    if (cudaMalloc(&d_bad, sizeof *d_bad) != cudaSuccess || cudaMalloc(&d_first, sizeof *d_first) != cudaSuccess ||
        cudaMemcpy(d_bad, &zero, sizeof zero, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(d_first, &none, sizeof none, cudaMemcpyHostToDevice) != cudaSuccess) {
        rc = dsv4_fail(err, DSV4_E_STATE, "cu_mma_e4m3_check: no device memory");
    } else {
        for (uint64_t lo = 0; lo < (1ull << 32); lo += 1ull << 30) k_e4m3_check<<<4096, 256>>>(lo, 1ull << 30, d_bad, d_first);
        if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(mismatches, d_bad, sizeof *d_bad, cudaMemcpyDeviceToHost) != cudaSuccess ||
            cudaMemcpy(first, d_first, sizeof *d_first, cudaMemcpyDeviceToHost) != cudaSuccess)
            rc = dsv4_fail(err, DSV4_E_STATE, "cu_mma_e4m3_check: %s", cudaGetErrorString(cudaGetLastError()));
    }
    cudaFree(d_bad);
    cudaFree(d_first);
    return rc;
}

/* mma_e4m3_written (cu_mma_frag.cuh) against the instruction it spells out, on random fragments and random C bits
 * (NaN and infinity codes included): D = A B + C bit for bit; and mma_e4m3_written_from0 against the instruction
 * from +0.0f, equal up to the sign of a zero. Each thread `iters` tiles; mismatching elements counted. */
__device__ __forceinline__ uint32_t emu_hash(uint32_t x) {
    x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
    return x;
}
__global__ void k_mma_emu_check(int iters, unsigned long long *bad) {
    dev_grid_wait();
    uint32_t h = emu_hash((uint32_t)(blockIdx.x * blockDim.x + threadIdx.x) + 0x51ed270bu);
    unsigned long long n = 0;
    for (int it = 0; it < iters; it++) {
        uint32_t r[6];
        float d1[4], d2[4], z1[4], z2[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll
        for (int k = 0; k < 6; k++) r[k] = h = emu_hash(h);
#pragma unroll
        for (int e = 0; e < 4; e++) d1[e] = d2[e] = __uint_as_float(h = emu_hash(h));
        mma_e4m3_written(d1, r[0], r[1], r[2], r[3], r[4], r[5]);
        mma_e4m3(d2, r[0], r[1], r[2], r[3], r[4], r[5]);
        mma_e4m3_written_from0(z1, r[0], r[1], r[2], r[3], r[4], r[5]);
        mma_e4m3(z2, r[0], r[1], r[2], r[3], r[4], r[5]);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            n += __float_as_uint(d1[e]) != __float_as_uint(d2[e]);
            n += __float_as_uint(z1[e]) != __float_as_uint(z2[e]) && !(z1[e] == 0.0f && z2[e] == 0.0f);
        }
    }
    if (n) atomicAdd(bad, n);
}

extern "C" int cu_mma_emu_check(unsigned long long *mismatches, unsigned long long *checked, dsv4_error *err) {
    enum { BLOCKS = 528, THREADS = 256, ITERS = 64 };
    unsigned long long *d_bad = NULL;
    const unsigned long long zero = 0;
    int rc = 0;
    if (cudaMalloc(&d_bad, sizeof *d_bad) != cudaSuccess || cudaMemcpy(d_bad, &zero, sizeof zero, cudaMemcpyHostToDevice) != cudaSuccess) {
        rc = dsv4_fail(err, DSV4_E_STATE, "cu_mma_emu_check: no device memory");
    } else {
        k_mma_emu_check<<<BLOCKS, THREADS>>>(ITERS, d_bad);
        if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(mismatches, d_bad, sizeof *d_bad, cudaMemcpyDeviceToHost) != cudaSuccess)
            rc = dsv4_fail(err, DSV4_E_STATE, "cu_mma_emu_check: %s", cudaGetErrorString(cudaGetLastError()));
        *checked = 8ull * BLOCKS * THREADS * ITERS;
    }
    cudaFree(d_bad);
    return rc;
}

extern "C" int cu_mma_pack_act(cu_stream st, const float *x, int ldx, int T, int K, uint8_t *xq, int ldq, float *xs, int lds,
                               dsv4_error *err) {
    if (T < 0 || K < 1) return dsv4_fail(err, DSV4_E_ARG, "cu_mma_pack_act: %d rows of %d columns", T, K);
    if (T == 0) return 0;
    if (!x || !xq || !xs || ldx < K || ldq < K || ldq % 16 || (uintptr_t)xq % 16 || lds < (K + 127) / 128)
        return dsv4_fail(err, DSV4_E_ARG, "cu_mma_pack_act: bad buffers (ldx %d, ldq %d (a multiple of 16, 16-byte aligned), lds %d, K %d)",
                         ldx, ldq, lds, K);
    const int64_t jobs = (int64_t)T * ((K + 127) / 128);
    k_mma_pack_act<<<cu_blocks(jobs, 8), 256, 0, (cudaStream_t)st>>>(x, ldx, T, K, xq, ldq, xs, lds);
    return 0;
}

extern "C" int cu_fp4_frag_pack(cu_stream st, void *data, int64_t rows, int cols, dsv4_error *err) {
    if (rows < 0 || cols < 128 || cols % 128 || (rows && (!data || (uintptr_t)data % 16)))
        return dsv4_fail(err, DSV4_E_ARG, "cu_fp4_frag_pack: %lld x %d FP4 (columns a multiple of 128, data 16-byte aligned)",
                         (long long)rows, cols);
    const int64_t units = rows * (cols / 128);
    if (units) k_mma_frag_pack<<<cu_blocks(units, 256) < 4096 ? cu_blocks(units, 256) : 4096, 256, 0, (cudaStream_t)st>>>((uint32_t *)data, units);
    return 0;
}

/* MMA_LINEAR_PAIR=0: cu_mma_linear_pair as two launches (the A/B of its one launch). */
#ifndef MMA_LINEAR_PAIR
#define MMA_LINEAR_PAIR 1
#endif

/* FP4 weight loads: the mode of MMA_FP4_VEC above until cu_mma_fp4_vec changes it. */
static int fp4_vec = MMA_FP4_VEC;

/* The kernel switches below: the setting replaced by v (tests and benchmarks put it back). */
static int switch_to(int *setting, int v) {
    const int before = *setting;
    *setting = v;
    return before;
}

extern "C" int cu_mma_fp4_vec(int mode) { return switch_to(&fp4_vec, mode == 1 || mode == 2 ? mode : 0); }

/* FP4 experts of whole chunks by k_mma_expert_lean (MMA_EXPERT_LEAN) until cu_mma_expert_lean changes it. */
static int expert_lean = MMA_EXPERT_LEAN;
extern "C" int cu_mma_expert_lean(int on) { return switch_to(&expert_lean, on == 2 ? 2 : on != 0); }

/* One weight's output (of a pair: cu_mma_linear_pair). */
typedef struct {
    const dsv4_weight *w;
    float *y;
    int ldy;
} mma_out;

/* One launch: weight a, and b when nz = 2. */
template <int FP4, int MT, int NT, int U>
static void mma_launch(cu_stream st, int nz, mma_out a, mma_out b, const uint8_t *xq, int ldq, const float *xs, int lds, int T,
                       int out_bf16, mma_post post) {
    const int rows = nz == 2 && b.w->rows > a.w->rows ? b.w->rows : a.w->rows;
    dim3 grid(cu_blocks(rows, 16 * MT), cu_blocks(T, 8 * NT), nz);
    if constexpr (FP4) {
        if (fp4_vec == 2) {
            k_mma_linear<FP4, MT, NT, U, 2><<<grid, 32 * MMA_PARTS, 0, (cudaStream_t)st>>>(*a.w, *b.w, xq, ldq, xs, lds, T, a.y, a.ldy, b.y, b.ldy,
                                                                                          out_bf16, post);
            return;
        }
        if (fp4_vec == 1) {
            k_mma_linear<FP4, MT, NT, U, 1><<<grid, 32 * MMA_PARTS, 0, (cudaStream_t)st>>>(*a.w, *b.w, xq, ldq, xs, lds, T, a.y, a.ldy, b.y, b.ldy,
                                                                                          out_bf16, post);
            return;
        }
    }
    k_mma_linear<FP4, MT, NT, U, 0><<<grid, 32 * MMA_PARTS, 0, (cudaStream_t)st>>>(*a.w, *b.w, xq, ldq, xs, lds, T, a.y, a.ldy, b.y, b.ldy,
                                                                                  out_bf16, post);
}

/* The tile from T (never the order): up to 8 tokens one n8 column and 16 rows a block, four chunks' loads in flight
 * (decode streams the weight; an FP8 variant through the bulk copy engine was measured slower: runs 48-50,
 * docs/GPU_RUNS.md); up to 32 tokens 16 rows x 32 tokens (the weight read once); more, 64 (FP4) or 32 (FP8) rows x 32
 * tokens. */
template <int FP4>
static void mma_dispatch(cu_stream st, int nz, mma_out a, mma_out b, const uint8_t *xq, int ldq, const float *xs, int lds, int T, int o,
                         mma_post post = mma_post{}) {
    if (T <= 8) mma_launch<FP4, 1, 1, 4>(st, nz, a, b, xq, ldq, xs, lds, T, o, post);
    else if (T <= 32) mma_launch<FP4, 1, 4, 2>(st, nz, a, b, xq, ldq, xs, lds, T, o, post);
    else if constexpr (FP4) mma_launch<FP4, 4, 4, 1>(st, nz, a, b, xq, ldq, xs, lds, T, o, post);
    else mma_launch<FP4, 2, 4, 1>(st, nz, a, b, xq, ldq, xs, lds, T, o, post);   /* FP8 at 64 x 32 spills (255 registers) */
}

/* The weight half of cu_mma_linear's contract: 0 when w is taken, else a one-line reason (code in *code). */
static const char *weight_refusal(const dsv4_weight *w, int *code) {
    static const char *const fmt_msg = "weight format has no tensor-core path (FP8 and FP4 only)";
    *code = DSV4_E_ARG;
    if (w->fmt != WF_FP8 && w->fmt != WF_FP4) { *code = DSV4_E_UNSUPPORTED; return fmt_msg; }
    const int fp4 = w->fmt == WF_FP4, K = w->cols;
    if (w->rows < 0 || K < 1) return "weight shape";
    if (K % (fp4 ? 32 : 128)) return fp4 ? "FP4 weight columns not a multiple of 32" : "FP8 weight columns not a multiple of 128";
    if (!w->data || !w->scale || (uintptr_t)w->data % (fp4 ? 4 : 16)) return "weight data missing or misaligned (FP8: 16 bytes, FP4: 4)";
    if (!w->scale_cols || w->scale_cols < (fp4 ? K / 32 : K / 128)) return "too few scale columns";
    return NULL;
}

extern "C" int cu_mma_takes(const dsv4_weight *w) {
    int code;
    return w && !weight_refusal(w, &code);
}

extern "C" int cu_mma_takes_experts(int fmt, int cols) {
    return ((fmt == WF_FP8 || fmt == CU_FMT_FP4_FRAG || fmt == CU_FMT_FP4_NAT) && cols >= 128 && cols % 128 == 0) || (fmt == WF_FP4 && cols >= 32 && cols % 32 == 0);
}

/* The checks of cu_mma_linear's contract for weight w and output y / ldy: 0, or the error. */
static int linear_args(const char *fn, const dsv4_weight *w, const uint8_t *xq, int ldq, const float *xs, int lds, int T, const float *y,
                       int ldy, dsv4_error *err) {
    int code;
    const char *why = weight_refusal(w, &code);
    if (why) return dsv4_fail(err, code, "%s: %s (format %d, %d x %d, %d scale columns)", fn, why, (int)w->fmt, w->rows, w->cols,
                              w->scale_cols);
    const int K = w->cols, N = w->rows;
    if (T < 0 || T > 65535 * 32)   /* grid.y = T / 32 at most 65535 */
        return dsv4_fail(err, DSV4_E_ARG, "%s: %d tokens, weight %d x %d", fn, T, N, K);
    if (T == 0 || N == 0) return 0;
    if (!xq || !xs || !y || ldq < K || ldq % 16 || (uintptr_t)xq % 16 || lds < (K + 127) / 128 || ldy < N)
        return dsv4_fail(err, DSV4_E_ARG, "%s: bad buffers (ldq %d: >= %d, a multiple of 16, 16-byte aligned; lds %d; ldy %d >= %d)", fn, ldq,
                         K, lds, ldy, N);
    return 0;
}

extern "C" int cu_mma_linear(cu_stream st, const dsv4_weight *w, const uint8_t *xq, int ldq, const float *xs, int lds, int T,
                             float *y, int ldy, int out_bf16, int stream, dsv4_error *err) {
    const int rc = linear_args("cu_mma_linear", w, xq, ldq, xs, lds, T, y, ldy, err);
    if (rc || T == 0 || w->rows == 0) return rc;
    if (DIAG_SKIP & 1) return 0;
    if (cu_mma_gemm_linear(st, w, xq, ldq, xs, lds, T, y, ldy, out_bf16)) return 0;   /* large T (k_mma_gemm.cu): the same bits */
    if (stream && cu_mma_stream_linear(st, w, y, ldy, NULL, NULL, 0, xq, ldq, xs, lds, T, out_bf16))
        return 0;   /* T <= 8 streamed (k_mma_stream.cu): the same bits */
    const mma_out a = { w, y, ldy };
    if (w->fmt == WF_FP4) mma_dispatch<1>(st, 1, a, a, xq, ldq, xs, lds, T, out_bf16);
    else mma_dispatch<0>(st, 1, a, a, xq, ldq, xs, lds, T, out_bf16);
    return 0;
}

#ifndef MMA_POST
#define MMA_POST 1   /* 0: cu_mma_linear_post always declines (the A/B of the fused epilogue) */
#endif
extern "C" int cu_mma_linear_post(cu_stream st, const dsv4_weight *w, const uint8_t *xq, int ldq, const float *xs, int lds, int T,
                                  const float *mix, float *X, int hc, int d, int official, int stream, dsv4_error *err) {
    if (!MMA_POST || (DIAG_SKIP & 9) || T > 8 || T < 1 || hc != 4 || stream || w->rows != d || !mix || !X) return 0;
    if (linear_args("cu_mma_linear_post", w, xq, ldq, xs, lds, T, X, d, err)) return -1;
    const mma_out a = { w, NULL, d };
    const mma_post post = { mix, X, d, official };
    if (w->fmt == WF_FP4) mma_dispatch<1>(st, 1, a, a, xq, ldq, xs, lds, T, official, post);
    else mma_dispatch<0>(st, 1, a, a, xq, ldq, xs, lds, T, official, post);
    return 1;
}

extern "C" int cu_mma_linear_pair(cu_stream st, const dsv4_weight *w_a, float *y_a, int ldy_a, const dsv4_weight *w_b, float *y_b,
                                  int ldy_b, const uint8_t *xq, int ldq, const float *xs, int lds, int T, int out_bf16, int stream,
                                  dsv4_error *err) {
    int rc = linear_args("cu_mma_linear_pair", w_a, xq, ldq, xs, lds, T, y_a, ldy_a, err);
    if (!rc) rc = linear_args("cu_mma_linear_pair", w_b, xq, ldq, xs, lds, T, y_b, ldy_b, err);
    if (rc) return rc;
    if (w_a->fmt != w_b->fmt || w_a->cols != w_b->cols)
        return dsv4_fail(err, DSV4_E_ARG, "cu_mma_linear_pair: weights of formats %d / %d with %d / %d columns (one format and width)",
                         (int)w_a->fmt, (int)w_b->fmt, w_a->cols, w_b->cols);
    if (T == 0 || (w_a->rows == 0 && w_b->rows == 0)) return 0;
    if (DIAG_SKIP & 1) return 0;
    if (w_a->rows == 0 || w_b->rows == 0 || !MMA_LINEAR_PAIR || cu_mma_gemm_takes_linear(w_a, T) || cu_mma_gemm_takes_linear(w_b, T)) {
        /* two calls (one when a weight has no rows; large T goes to the GEMM, each weight on its own) */
        if (w_a->rows) cu_mma_linear(st, w_a, xq, ldq, xs, lds, T, y_a, ldy_a, out_bf16, stream, NULL);
        if (w_b->rows) cu_mma_linear(st, w_b, xq, ldq, xs, lds, T, y_b, ldy_b, out_bf16, stream, NULL);
        return 0;
    }
    if (stream && cu_mma_stream_linear(st, w_a, y_a, ldy_a, w_b, y_b, ldy_b, xq, ldq, xs, lds, T, out_bf16))
        return 0;   /* T <= 8 streamed, both weights in one launch (k_mma_stream.cu): the same bits */
    const mma_out a = { w_a, y_a, ldy_a }, b = { w_b, y_b, ldy_b };
    if (w_a->fmt == WF_FP4) mma_dispatch<1>(st, 2, a, b, xq, ldq, xs, lds, T, out_bf16);
    else mma_dispatch<0>(st, 2, a, b, xq, ldq, xs, lds, T, out_bf16);
    return 0;
}

/* MMA_EXPERT_PAIR=0: cu_mma_expert_linear_pair as two launches (the A/B of its one launch). */
#ifndef MMA_EXPERT_PAIR
#define MMA_EXPERT_PAIR 1
#endif

/* The checks of cu_mma_expert_linear's contract: 0, or the error (nothing launched). */
static int expert_args(const char *fn, int rows, int cols, int fmt, int ldq, const uint8_t *xq, int lds, int ldy, dsv4_error *err) {
    if (fmt != WF_FP8 && fmt != WF_FP4 && fmt != CU_FMT_FP4_FRAG && fmt != CU_FMT_FP4_NAT)
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: weight format %d has no tensor-core path", fn, fmt);
    const int fp4 = fmt == WF_FP4;
    if (rows < 0 || cols < 1 || cols % (fp4 ? 32 : 128) || ldq < cols || ldq % 16 || (uintptr_t)xq % 16 ||
        lds < (cols + 127) / 128 || ldy < rows)
        return dsv4_fail(err, DSV4_E_ARG, "%s: experts %d x %d (%s), ldq %d, lds %d, ldy %d", fn, rows, cols, fp4 ? "FP4" : "FP8", ldq,
                         lds, ldy);
    return 0;
}

/* The packed kernel's variant (0: no prefetch, 1: one chunk ahead, 2: two, 3 / 4: one ahead within 5 / 6 blocks an
 * SM, 5: two ahead within 4; run 71 timed a sixth, each lane's loads by cp.async into a ring of 4 chunks in shared
 * memory, 1.9x slower: removed, in git history at 5417eff): the micro-benchmark's A/B; process-wide, returns the one replaced. The same bits in every variant. */
extern "C" int cu_mma_expert_frag_variant(int v) { return switch_to(&frag_variant, v >= 0 && v <= 5 ? v : MMA_EXPERT_FRAG_VARIANT); }

/* The format the expert kernels read: WF_FP4 of whole chunks under cu_mma_expert_lean(2) is packed (tests). */
static int expert_fmt(int fmt, int cols) { return fmt == WF_FP4 && expert_lean == 2 && cols % 128 == 0 ? CU_FMT_FP4_FRAG : fmt; }

/* One launch: the projection(s) z < nz (experts_a into y_a, experts_b into y_b); fp4: 0 FP8, 1 FP4, 2 packed FP4. */
static void expert_launch(cu_stream st, int nz, const dsv4_weight *experts_a, const dsv4_weight *experts_b, int rows, int cols, int fp4,
                          const cu_moe_plan *plan, int max_tiles, const uint8_t *xq, int ldq, const float *xs, int lds, int x_by_pair,
                          float *y_a, float *y_b, int ldy, int out_bf16) {
    dim3 grid(cu_blocks(rows, 16), max_tiles, nz);
    /* the packed kernel's variants (cu_mma_expert_frag_variant), in its order 0..5 */
    static void (*const frag_kernels[6])(const dsv4_weight *, const dsv4_weight *, int, cu_moe_plan, const uint8_t *, int, const float *,
                                         int, int, float *, float *, int, int) = {
        k_mma_expert_frag<0, 1>, k_mma_expert_frag<1, 1>, k_mma_expert_frag<2, 1>, k_mma_expert_frag<1, 5>, k_mma_expert_frag<1, 6>,
        k_mma_expert_frag<2, 4> };
    if (fp4 == 2) {
        void (*const k_mma_frag)(const dsv4_weight *, const dsv4_weight *, int, cu_moe_plan, const uint8_t *, int, const float *, int, int,
                                 float *, float *, int, int) = frag_kernels[frag_variant];
        k_mma_frag<<<grid, 32 * MMA_PARTS, 0, (cudaStream_t)st>>>(experts_a, experts_b, rows, *plan, xq, ldq, xs, lds, x_by_pair, y_a, y_b, ldy,
                                                                  out_bf16);
    }
    else if (fp4 && expert_lean && cols % 128 == 0)
        k_mma_expert_lean<MMA_EXPERT_LEAN_U><<<grid, 32 * MMA_PARTS, 0, (cudaStream_t)st>>>(experts_a, experts_b, rows, *plan, xq, ldq, xs, lds,
                                                                                          x_by_pair, y_a, y_b, ldy, out_bf16);
    else if (fp4 && fp4_vec == 2)
        k_mma_expert<1, 2><<<grid, 32 * MMA_PARTS, 0, (cudaStream_t)st>>>(experts_a, experts_b, rows, *plan, xq, ldq, xs, lds, x_by_pair, y_a,
                                                                         y_b, ldy, out_bf16);
    else if (fp4 && fp4_vec == 1)
        k_mma_expert<1, 1><<<grid, 32 * MMA_PARTS, 0, (cudaStream_t)st>>>(experts_a, experts_b, rows, *plan, xq, ldq, xs, lds, x_by_pair, y_a,
                                                                         y_b, ldy, out_bf16);
    else if (fp4)
        k_mma_expert<1, 0><<<grid, 32 * MMA_PARTS, 0, (cudaStream_t)st>>>(experts_a, experts_b, rows, *plan, xq, ldq, xs, lds, x_by_pair, y_a,
                                                                         y_b, ldy, out_bf16);
    else
        k_mma_expert<0, 0><<<grid, 32 * MMA_PARTS, 0, (cudaStream_t)st>>>(experts_a, experts_b, rows, *plan, xq, ldq, xs, lds, x_by_pair, y_a,
                                                                         y_b, ldy, out_bf16);
}

extern "C" int cu_mma_expert_linear(cu_stream st, const dsv4_weight *experts, int rows, int cols, int fmt, const cu_moe_plan *plan,
                                    int max_tiles, const uint8_t *xq, int ldq, const float *xs, int lds, int x_by_pair, float *y,
                                    int ldy, int out_bf16, int stream, dsv4_error *err) {
    const int rc = expert_args("cu_mma_expert_linear", rows, cols, fmt, ldq, xq, lds, ldy, err);
    if (rc) return rc;
    if (DIAG_SKIP & 2) return 0;
    if (max_tiles <= 0 || rows == 0) return 0;
    if (fmt == CU_FMT_FP4_NAT)   /* native FP8 experts (k_expert_nat.cu) */
        return cu_nat_experts(st, 1, experts, experts, rows, cols, plan, max_tiles, xq, ldq, xs, lds, x_by_pair, y, y, ldy, out_bf16, err);
    fmt = expert_fmt(fmt, cols);
    if (fmt == CU_FMT_FP4_FRAG) stream = 0;   /* packed weights: the GEMM or k_mma_expert_frag */
    if (cu_mma_gemm_experts(st, experts, rows, cols, fmt, plan, max_tiles, xq, ldq, xs, lds, x_by_pair, y, ldy, out_bf16))
        return 0;   /* a large step (k_mma_gemm.cu): the same bits */
    if (stream && cu_mma_stream_experts(st, experts, y, NULL, NULL, rows, cols, fmt, plan, max_tiles, xq, ldq, xs, lds, x_by_pair, ldy,
                                        out_bf16))
        return 0;   /* streamed (k_mma_stream.cu): the same bits */
    expert_launch(st, 1, experts, experts, rows, cols, fmt == CU_FMT_FP4_FRAG ? 2 : fmt == WF_FP4, plan, max_tiles, xq, ldq, xs, lds, x_by_pair,
                  y, y, ldy, out_bf16);
    return 0;
}

extern "C" int cu_mma_expert_linear_pair(cu_stream st, const dsv4_weight *experts_a, const dsv4_weight *experts_b, int rows, int cols,
                                         int fmt, const cu_moe_plan *plan, int max_tiles, const uint8_t *xq, int ldq, const float *xs,
                                         int lds, int x_by_pair, float *y_a, float *y_b, int ldy, int out_bf16, int stream,
                                         dsv4_error *err) {
    const int rc = expert_args("cu_mma_expert_linear_pair", rows, cols, fmt, ldq, xq, lds, ldy, err);
    if (rc) return rc;
    if (DIAG_SKIP & 2) return 0;
    if (max_tiles <= 0 || rows == 0) return 0;
    if (fmt == CU_FMT_FP4_NAT)   /* native FP8 experts (k_expert_nat.cu): both projections in one launch */
        return cu_nat_experts(st, 2, experts_a, experts_b, rows, cols, plan, max_tiles, xq, ldq, xs, lds, x_by_pair, y_a, y_b, ldy, out_bf16,
                              err);
    fmt = expert_fmt(fmt, cols);
    const int fp4 = fmt == CU_FMT_FP4_FRAG ? 2 : fmt == WF_FP4;
    if (fmt == CU_FMT_FP4_FRAG) stream = 0;   /* packed weights: the GEMM or k_mma_expert_frag */
    if (cu_mma_gemm_experts(st, experts_a, rows, cols, fmt, plan, max_tiles, xq, ldq, xs, lds, x_by_pair, y_a, ldy, out_bf16)) {
        cu_mma_gemm_experts(st, experts_b, rows, cols, fmt, plan, max_tiles, xq, ldq, xs, lds, x_by_pair, y_b, ldy, out_bf16);
        return 0;   /* a large step (k_mma_gemm.cu): the same bits, each projection a GEMM */
    }
    if (stream && MMA_EXPERT_PAIR &&
        cu_mma_stream_experts(st, experts_a, y_a, experts_b, y_b, rows, cols, fmt, plan, max_tiles, xq, ldq, xs, lds, x_by_pair, ldy,
                              out_bf16))
        return 0;   /* both projections streamed in one launch (k_mma_stream.cu): the same bits */
    if (stream && !MMA_EXPERT_PAIR &&
        cu_mma_stream_experts(st, experts_a, y_a, NULL, NULL, rows, cols, fmt, plan, max_tiles, xq, ldq, xs, lds, x_by_pair, ldy, out_bf16) &&
        cu_mma_stream_experts(st, experts_b, y_b, NULL, NULL, rows, cols, fmt, plan, max_tiles, xq, ldq, xs, lds, x_by_pair, ldy, out_bf16))
        return 0;
    if (MMA_EXPERT_PAIR) {
        expert_launch(st, 2, experts_a, experts_b, rows, cols, fp4, plan, max_tiles, xq, ldq, xs, lds, x_by_pair, y_a, y_b, ldy, out_bf16);
    } else {
        expert_launch(st, 1, experts_a, experts_a, rows, cols, fp4, plan, max_tiles, xq, ldq, xs, lds, x_by_pair, y_a, y_a, ldy, out_bf16);
        expert_launch(st, 1, experts_b, experts_b, rows, cols, fp4, plan, max_tiles, xq, ldq, xs, lds, x_by_pair, y_b, y_b, ldy, out_bf16);
    }
    return 0;
}
