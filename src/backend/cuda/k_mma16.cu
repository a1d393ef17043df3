/* OFFICIAL-mode linear layers whose input is a bf16 tensor, on BF16 tensor cores:
 * mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (sm_80+). Weights BF16, or FP8 E4M3 with 128x128 UE8M0 block
 * scales (wo_a as the checkpoint stores it: the official converter's BF16 wo_a is exactly e4m3 x 2^k, 4 significant
 * bits), converted to bf16 in registers (exact); the input bf16 rows packed once per step (cu_mma16_pack). Every
 * product of two bf16 values (or e4m3 x bf16) is exact in fp32 and the MMA accumulates in fp32, so against the
 * fp32 CUDA-core kernel (k_linear.cu) only the order of the additions changes (cu_mma.h says which linears).
 *
 * ---- Reduction order of y[t][o] (the same for every t, every T, every tile; a function of K alone) ----
 *   Columns are cut into chunks of 128 (c = 0 .. ceil(K/128) - 1; a BF16 weight's last chunk may hold 1-3 units of
 *   32 columns). Four partial sums p0..p3, each starting at 0.0f: partial p takes the chunks c = p, p + 4, p + 8,
 *   ... in increasing c. For each chunk: P = 0 (a fresh fp32 fragment), then the chunk's MMAs in this sequence,
 *   each adding 16 products to P (which 16: the k maps below):
 *     BF16: MMA (v, h) for unit v = 0 .. units - 1, then h = 0, 1;   then p = fmaf(P, 1.0f, p) (= p + P)
 *     FP8:  MMA j for j = 0 .. 7;                                    then p = fmaf(P, sw, p), sw the weight's
 *           128x128 block scale of (row, chunk)
 *   Then y = ((p0 + p1) + p2) + p3, in fp32.
 * Warp p of a block computes partial p for the block's tile of rows x tokens; the tile shape (chosen from T and the
 * grouping) decides only which thread holds an element. The MMA computes every element of its 16x8 output from
 * that element's own row and column of the operands (a padded token is a zero column and changes nothing else), so
 * a token's bits do not depend on its neighbours or its column in the fragment: test_gpu_mma16 checks that by
 * memcmp (each token alone = in batches of 2 .. 200). Four partials for the same reason as k_mma.cu: one token
 * still spreads a weight row over four warps.
 *
 * ---- Fragment layouts relied on (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type", .bf16;
 *      CUTLASS cute/atom/mma_traits_sm80.hpp SM80_16x8x16_F32BF16BF16F32_TN: ALayout ((4,8),(2,2,2)):((32,1),
 *      (16,8,128)), BLayout ((4,8),(2,2)):((16,1),(8,64)), CLayout SM80_16x8_Row — read, not copied) ----
 *   lane = 4 g + q (g = groupID 0..7, q = threadID_in_group 0..3); a 32-bit register holds two bf16, the lower
 *   k index in bits 0..15.
 *   A (16 x 16, row-major, 4 registers): a0 = A[g][2q, 2q+1], a1 = A[g+8][2q, 2q+1],
 *                                        a2 = A[g][2q+8, 2q+9], a3 = A[g+8][2q+8, 2q+9].
 *   B (16 x 8, "col", 2 registers):      b0 = B[2q, 2q+1][g], b1 = B[2q+8, 2q+9][g].
 *   C/D (16 x 8 fp32, 4 registers): d0 = D[g][2q], d1 = D[g][2q+1], d2 = D[g+8][2q], d3 = D[g+8][2q+1].
 * A = 16 weight rows, B = 8 tokens (a decode step pads tokens to 8; the weight streams through A). The k index of
 * an MMA maps to columns by a fixed bijection shared by A and B, chosen for contiguous per-lane loads:
 *   BF16 (lane q holds columns [8q, 8q + 8) of each 32-column unit v: one 16-byte load per row and unit):
 *        MMA (v, h): k = 2q + i -> column 128c + 32v + 8q + 4h + i, k = 8 + 2q + i -> 128c + 32v + 8q + 4h + 2 + i
 *        (i = 0, 1). So a0/a2 = words 2h / 2h+1 of row g's 16 bytes, a1/a3 the same of row g+8, b0/b1 the token's.
 *   FP8 (lane q holds columns [32q, 32q + 32) of the chunk, as k_mma.cu: two 16-byte loads per row):
 *        MMA j: k = 2q + i -> column 128c + 32q + 4j + i, k = 8 + 2q + i -> 128c + 32q + 4j + 2 + i. So byte-word j
 *        of the row's 32 bytes gives a0 (bytes 0, 1) and a2 (bytes 2, 3) as bf16 pairs, and words 2j, 2j+1 of the
 *        token's 64 bytes of bf16 give b0, b1. */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_mma.h"
#include <limits.h>
#include <string.h>
extern "C" {
#include "util/error.h"
}

#define MMA16_PARTS 4   /* warps of a block = partial sums of an element (the order above) */

/* -DMMA16_ON=0 (an A/B binary only: tools/gpu/stage_variant.sh dsv4-old "-DMMA16_ON=0"): cu_mma16_linear takes no
 * weight, so the model runs these linears on CUDA cores while the FP8 tensor-core path stays on. */
#ifndef MMA16_ON
#define MMA16_ON 1
#endif

/* -DDSV4_MMA16_BUG: a deliberate fragment bug (the first MMA of each chunk takes the token's two words swapped), to
 * see test_gpu_mma16 fail. Never in a real build. */
#ifdef DSV4_MMA16_BUG
#define MMA16_B01(lo, hi) hi, lo
#else
#define MMA16_B01(lo, hi) lo, hi
#endif

/* ---- PTX (tools/gpu/shim/shim_mma16.sh replaces this section by C++ emulations of the same definitions) ---- */
#ifndef MMA16_SHIM
/* D = A B + D on one m16n8k16 bf16 tile (fragments as above). */
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* bf16(lo) in bits 0..15, bf16(hi) in bits 16..31, rounded to nearest even (cvt puts its first source on top). */
__device__ __forceinline__ uint32_t bf16x2_of(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* E4M3 bytes 0 and 1 of v as a bf16 pair (byte 0 low), exactly: e4m3 -> f16 in hardware (every E4M3 value is a
 * normal f16 or 0), f16 -> f32 exact, f32 -> bf16 exact (4 significant bits, exponent in range). */
__device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t v) {
    const uint32_t h = dev_e4m3x2_f16(v);
    return bf16x2_of(dev_f16_bits(h), dev_f16_bits(h >> 16));
}
#endif

/* ---- the kernels ---- */

__device__ __forceinline__ uint32_t u4_word(const uint4 &v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }

/* One block: rows [row_base, +16 MT) x tokens [tok_base, +8 NT) of T, the tokens' rows at xb + n * ldb; warp p =
 * partial p. U chunks' loads are issued before the first of them is used. out_bf16: each output rounded to the
 * nearest bf16 as it is stored (the OFFICIAL rounding of wo_a's and weights_proj's outputs, dev_round_bf16: the
 * value the separate rounding kernel would leave). */
template <int WF8, int MT, int NT, int U>
__device__ __forceinline__ void mma16_block(const dsv4_weight &w, const uint16_t *__restrict__ xb, int ldb, int T, float *__restrict__ y,
                                            int ldy, int row_base, int tok_base, int out_bf16) {
    const int lane = threadIdx.x & 31, part = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int N = w.rows, K = w.cols, nchunk = (K + 127) / 128;
    __shared__ float red[MMA16_PARTS - 1][MT * NT * 4][32];   /* partials 1..3 for warp 0 (the end) */

    float acc[MT][NT][4];
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int ni = 0; ni < NT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mi][ni][e] = 0.0f;

    for (int c0 = part; c0 < nchunk; c0 += MMA16_PARTS * U) {
        if constexpr (WF8) {
            const uint8_t *wd = (const uint8_t *)w.data;
            uint4 a[U][MT][2][2], b[U][NT][4];
            float sw[U][MT][2];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u * MMA16_PARTS;
                const bool cv = c < nchunk;
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int r = row_base + 16 * mi + g + 8 * h;
                        if (cv && r < N) {
                            const uint4 *p = (const uint4 *)(wd + (int64_t)r * K + 128 * c + 32 * q);
                            a[u][mi][h][0] = p[0];
                            a[u][mi][h][1] = p[1];
                            sw[u][mi][h] = dev_e8m0(w.scale[(int64_t)((w.row0 + r) / 128) * w.scale_cols + c]);
                        } else {
                            a[u][mi][h][0] = a[u][mi][h][1] = make_uint4(0, 0, 0, 0);
                            sw[u][mi][h] = 0.0f;
                        }
                    }
#pragma unroll
                for (int ni = 0; ni < NT; ni++) {
                    const int n = tok_base + 8 * ni + g;
                    const uint4 *p = (const uint4 *)(xb + (int64_t)n * ldb + 128 * c + 32 * q);
#pragma unroll
                    for (int k = 0; k < 4; k++) b[u][ni][k] = cv && n < T ? p[k] : make_uint4(0, 0, 0, 0);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (c0 + u * MMA16_PARTS >= nchunk) break;
#pragma unroll
                for (int mi = 0; mi < MT; mi++) {
                    float f[NT][4];
#pragma unroll
                    for (int ni = 0; ni < NT; ni++)
#pragma unroll
                        for (int e = 0; e < 4; e++) f[ni][e] = 0.0f;
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const uint32_t w0 = u4_word(a[u][mi][0][j >> 2], j & 3), w1 = u4_word(a[u][mi][1][j >> 2], j & 3);
                        const uint32_t a0 = e4m3x2_bf16x2(w0), a1 = e4m3x2_bf16x2(w1);
                        const uint32_t a2 = e4m3x2_bf16x2(w0 >> 16), a3 = e4m3x2_bf16x2(w1 >> 16);
#pragma unroll
                        for (int ni = 0; ni < NT; ni++) {
                            const uint32_t b0 = u4_word(b[u][ni][j >> 1], (2 * j) & 3), b1 = u4_word(b[u][ni][j >> 1], (2 * j + 1) & 3);
                            if (j == 0) mma_bf16(f[ni], a0, a1, a2, a3, MMA16_B01(b0, b1));
                            else mma_bf16(f[ni], a0, a1, a2, a3, b0, b1);
                        }
                    }
#pragma unroll
                    for (int ni = 0; ni < NT; ni++)
#pragma unroll
                        for (int e = 0; e < 4; e++) acc[mi][ni][e] = fmaf(f[ni][e], sw[u][mi][e >> 1], acc[mi][ni][e]);
                }
            }
        } else {
            const uint16_t *wd = (const uint16_t *)w.data;
            uint4 a[U][MT][2][4], b[U][NT][4];
            int nu[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u * MMA16_PARTS;
                nu[u] = c < nchunk ? min(4, (K - 128 * c) / 32) : 0;
#pragma unroll
                for (int mi = 0; mi < MT; mi++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int r = row_base + 16 * mi + g + 8 * h;
                        const uint16_t *p = wd + (int64_t)r * K + 128 * c + 8 * q;
#pragma unroll
                        for (int v = 0; v < 4; v++) a[u][mi][h][v] = v < nu[u] && r < N ? *(const uint4 *)(p + 32 * v) : make_uint4(0, 0, 0, 0);
                    }
#pragma unroll
                for (int ni = 0; ni < NT; ni++) {
                    const int n = tok_base + 8 * ni + g;
                    const uint16_t *p = xb + (int64_t)n * ldb + 128 * c + 8 * q;
#pragma unroll
                    for (int v = 0; v < 4; v++) b[u][ni][v] = v < nu[u] && n < T ? *(const uint4 *)(p + 32 * v) : make_uint4(0, 0, 0, 0);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (!nu[u]) break;
#pragma unroll
                for (int mi = 0; mi < MT; mi++) {
                    float f[NT][4];
#pragma unroll
                    for (int ni = 0; ni < NT; ni++)
#pragma unroll
                        for (int e = 0; e < 4; e++) f[ni][e] = 0.0f;
#pragma unroll
                    for (int v = 0; v < 4; v++) {
                        if (v >= nu[u]) break;
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            const uint32_t a0 = u4_word(a[u][mi][0][v], 2 * h), a1 = u4_word(a[u][mi][1][v], 2 * h);
                            const uint32_t a2 = u4_word(a[u][mi][0][v], 2 * h + 1), a3 = u4_word(a[u][mi][1][v], 2 * h + 1);
#pragma unroll
                            for (int ni = 0; ni < NT; ni++) {
                                const uint32_t b0 = u4_word(b[u][ni][v], 2 * h), b1 = u4_word(b[u][ni][v], 2 * h + 1);
                                if (v == 0 && h == 0) mma_bf16(f[ni], a0, a1, a2, a3, MMA16_B01(b0, b1));
                                else mma_bf16(f[ni], a0, a1, a2, a3, b0, b1);
                            }
                        }
                    }
#pragma unroll
                    for (int ni = 0; ni < NT; ni++)
#pragma unroll
                        for (int e = 0; e < 4; e++) acc[mi][ni][e] = fmaf(f[ni][e], 1.0f, acc[mi][ni][e]);
                }
            }
        }
    }

    /* y = ((p0 + p1) + p2) + p3: warps 1..3 hand their partials to warp 0 through shared memory. */
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
                for (int p = 0; p < MMA16_PARTS - 1; p++) v += red[p][(mi * NT + ni) * 4 + e][lane];
                const int r = row_base + 16 * mi + g + 8 * (e >> 1), n = tok_base + 8 * ni + 2 * q + (e & 1);
                if (r < N && n < T) y[(int64_t)n * ldy + r] = out_bf16 ? dev_round_bf16(v) : v;
            }
}

/* Up to MMA16_JOBS weights over the same input rows in one launch (the compressors and weights_proj all read xn):
 * job j owns the blocks [first[j], first[j + 1]) of grid.x and computes its weight exactly as a launch of its own
 * would (the same block function; a job's blocks never mix with another's). */
#define MMA16_JOBS 6
struct mma16_jobs {
    dsv4_weight w[MMA16_JOBS];
    float *y[MMA16_JOBS];
    int ldy[MMA16_JOBS], out_bf16[MMA16_JOBS], first[MMA16_JOBS + 1], n;
};

/* Rows [16 MT b, +16 MT) of the block's job (b its block within the job) read the input columns from
 * (row / group_rows) * group_x on (the grouped wo_a: a block never straddles two groups, the launcher sees to it;
 * group_rows = the rows otherwise). */
template <int WF8, int MT, int NT, int U>
__global__ void __launch_bounds__(32 * MMA16_PARTS) k_mma16_linear(mma16_jobs jobs, int group_rows, const uint16_t *__restrict__ xb,
                                                                    int ldb, int group_x, int T) {
    dev_grid_wait();
    int j = 0;
#pragma unroll
    for (int k = 1; k < MMA16_JOBS; k++)
        if (k < jobs.n && (int)blockIdx.x >= jobs.first[k]) j = k;
    dsv4_weight w = jobs.w[0];
    float *y = jobs.y[0];
    int ldy = jobs.ldy[0], first = jobs.first[0], out_bf16 = jobs.out_bf16[0];
#pragma unroll
    for (int k = 1; k < MMA16_JOBS; k++)   /* constant indices: the parameters stay in registers */
        if (k == j) {
            w = jobs.w[k];
            y = jobs.y[k];
            ldy = jobs.ldy[k];
            first = jobs.first[k];
            out_bf16 = jobs.out_bf16[k];
        }
    const int row_base = ((int)blockIdx.x - first) * 16 * MT;
    mma16_block<WF8, MT, NT, U>(w, xb + (int64_t)(row_base / group_rows) * group_x, ldb, T, y, ldy, row_base, blockIdx.y * 8 * NT, out_bf16);
}

/* xb[t][i] = bf16(x[t][i]), round to nearest even (exact for bf16-valued rows). */
__global__ void k_mma16_pack(const float *__restrict__ x, int ldx, int T, int K, uint16_t *__restrict__ xb, int ldb) {
    dev_grid_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)T * K) return;
    const int64_t t = i / K, k = i % K;
    xb[t * ldb + k] = dev_f32_to_bf16(x[t * ldx + k]);
}

/* ---- launchers ---- */

extern "C" int cu_mma16_pack(cu_stream st, const float *x, int ldx, int T, int K, uint16_t *xb, int ldb, dsv4_error *err) {
    if (T < 0 || K < 1) return dsv4_fail(err, DSV4_E_ARG, "cu_mma16_pack: %d rows of %d columns", T, K);
    if (T == 0) return 0;
    if (!x || !xb || ldx < K || ldb < K || ldb % 8 || (uintptr_t)xb % 16)
        return dsv4_fail(err, DSV4_E_ARG, "cu_mma16_pack: bad buffers (ldx %d, ldb %d (a multiple of 8, 16-byte aligned), K %d)", ldx,
                         ldb, K);
    k_mma16_pack<<<cu_blocks((int64_t)T * K, 256), 256, 0, (cudaStream_t)st>>>(x, ldx, T, K, xb, ldb);
    return 0;
}

template <int WF8, int MT, int NT, int U>
static void mma16_launch(cu_stream st, mma16_jobs *jobs, int group_rows, const uint16_t *xb, int ldb, int group_x, int T) {
    jobs->first[0] = 0;
    for (int j = 0; j < jobs->n; j++) jobs->first[j + 1] = jobs->first[j] + cu_blocks(jobs->w[j].rows, 16 * MT);
    dim3 grid(jobs->first[jobs->n], cu_blocks(T, 8 * NT));
    k_mma16_linear<WF8, MT, NT, U><<<grid, 32 * MMA16_PARTS, 0, (cudaStream_t)st>>>(*jobs, group_rows, xb, ldb, group_x, T);
}

#define MMA16_FEW_BLOCKS 132   /* an H200's SMs */

/* The tile from T (never the order): up to 8 tokens one n8 column and 16 rows a block, two chunks' loads in flight
 * (decode streams the weight: 128 bytes of FP8 or 256 of BF16 a lane; ptxas: 96 / 118 registers, so 5 / 4 blocks an
 * SM and wo_a's 512 blocks in one wave on 132 SMs — with four chunks FP8 took 162 registers, 3 blocks an SM, 1.3
 * waves); up to 32 tokens 16 rows x 32 tokens; more, 32 rows x 32 tokens where a block of 32 rows stays inside one
 * group. */
template <int WF8>
static void mma16_dispatch(cu_stream st, mma16_jobs *jobs, int groups, const uint16_t *xb, int ldb, int group_x, int T) {
    const int group_rows = groups > 1 ? jobs->w[0].rows / groups : INT_MAX;
    int blocks = 0;   /* of the one-column tile: a property of the weights' shapes, never of T */
    for (int j = 0; j < jobs->n; j++) blocks += cu_blocks(jobs->w[j].rows, 16);
    /* fewer blocks than SMs (the router: 256 rows, 16 blocks; run 38's ncu: 7.8 us at 269 GB/s): each warp waits
     * on its own loads, so four chunks of them in flight instead of two (the same order: U decides only when a
     * chunk is loaded) */
    if (T <= 8 && blocks < MMA16_FEW_BLOCKS) mma16_launch<WF8, 1, 1, 4>(st, jobs, group_rows, xb, ldb, group_x, T);
    else if (T <= 8) mma16_launch<WF8, 1, 1, 2>(st, jobs, group_rows, xb, ldb, group_x, T);
    else if (T <= 32 || (groups > 1 && group_rows % 32)) mma16_launch<WF8, 1, 4, 1>(st, jobs, group_rows, xb, ldb, group_x, T);
    else mma16_launch<WF8, 2, 4, 1>(st, jobs, group_rows, xb, ldb, group_x, T);
}

/* The checks of cu_mma16_linear for one weight (0, or an error code with one line in err). */
static int mma16_check(const char *fn, const dsv4_weight *w, int groups, const uint16_t *xb, int ldb, int group_x, int T, const float *y,
                       int ldy, dsv4_error *err) {
    if (!MMA16_ON) return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: built with MMA16_ON=0", fn);
    if (w->fmt != WF_BF16 && w->fmt != WF_FP8)
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "%s: weight format %d has no bf16 tensor-core path (BF16 and FP8 only)", fn, (int)w->fmt);
    const int fp8 = w->fmt == WF_FP8, K = w->cols, N = w->rows;
    if (T < 0 || T > 65535 * 32 || N < 0 || K < 1 || groups < 1)   /* grid.y = T / 32 at most 65535 */
        return dsv4_fail(err, DSV4_E_ARG, "%s: %d tokens, weight %d x %d in %d groups", fn, T, N, K, groups);
    if (K % (fp8 ? 128 : 32))
        return dsv4_fail(err, DSV4_E_ARG, "%s: %s weight with %d columns (a multiple of %d is needed)", fn, fp8 ? "FP8" : "BF16", K,
                         fp8 ? 128 : 32);
    if (N % groups || (groups > 1 && (N / groups) % 16))
        return dsv4_fail(err, DSV4_E_ARG, "%s: %d rows in %d groups (a multiple of 16 rows a group is needed)", fn, N, groups);
    if (!w->data || (uintptr_t)w->data % 16) return dsv4_fail(err, DSV4_E_ARG, "%s: weight data missing or not 16-byte aligned", fn);
    if (fp8 && (!w->scale || w->scale_cols < K / 128))
        return dsv4_fail(err, DSV4_E_ARG, "%s: %d scale columns for %d columns", fn, w->scale_cols, K);
    if (T == 0 || N == 0) return 0;
    const int64_t need = (int64_t)(groups - 1) * group_x + K;
    if (!xb || !y || ldb % 8 || (uintptr_t)xb % 16 || group_x < 0 || group_x % 8 || ldb < need || ldy < N)
        return dsv4_fail(err, DSV4_E_ARG,
                         "%s: bad buffers (ldb %d: >= %lld, a multiple of 8, 16-byte aligned; group_x %d a multiple of 8; ldy %d >= %d)", fn,
                         ldb, (long long)need, group_x, ldy, N);
    return 0;
}

extern "C" int cu_mma16_linear(cu_stream st, const dsv4_weight *w, int groups, const uint16_t *xb, int ldb, int group_x, int T, float *y,
                               int ldy, int out_bf16, dsv4_error *err) {
    const int rc = mma16_check("cu_mma16_linear", w, groups, xb, ldb, group_x, T, y, ldy, err);
    if (rc || T == 0 || w->rows == 0) return rc;
    if (DIAG_SKIP & 1) return 0;
    mma16_jobs jobs;
    memset(&jobs, 0, sizeof jobs);
    jobs.w[0] = *w;
    jobs.y[0] = y;
    jobs.ldy[0] = ldy;
    jobs.out_bf16[0] = out_bf16;
    jobs.n = 1;
    if (w->fmt == WF_FP8) mma16_dispatch<1>(st, &jobs, groups, xb, ldb, group_x, T);
    else mma16_dispatch<0>(st, &jobs, groups, xb, ldb, group_x, T);
    return 0;
}

extern "C" int cu_mma16_linear_multi(cu_stream st, const cu_mma16_out *outs, int n, const uint16_t *xb, int ldb, int T, dsv4_error *err) {
    if (n < 1 || n > MMA16_JOBS) return dsv4_fail(err, DSV4_E_ARG, "cu_mma16_linear_multi: %d weights (1 to %d)", n, MMA16_JOBS);
    mma16_jobs jobs;
    memset(&jobs, 0, sizeof jobs);
    for (int j = 0; j < n; j++) {
        const int rc = mma16_check("cu_mma16_linear_multi", outs[j].w, 1, xb, ldb, 0, T, outs[j].y, outs[j].ldy, err);
        if (rc) return rc;
        if (outs[j].w->fmt != outs[0].w->fmt)
            return dsv4_fail(err, DSV4_E_ARG, "cu_mma16_linear_multi: weights of different formats in one launch");
        if (outs[j].w->rows == 0) continue;
        jobs.w[jobs.n] = *outs[j].w;
        jobs.y[jobs.n] = outs[j].y;
        jobs.ldy[jobs.n] = outs[j].ldy;
        jobs.out_bf16[jobs.n] = outs[j].out_bf16;
        jobs.n++;
    }
    if (T == 0 || jobs.n == 0 || (DIAG_SKIP & 1)) return 0;
    if (jobs.w[0].fmt == WF_FP8) mma16_dispatch<1>(st, &jobs, 1, xb, ldb, 0, T);
    else mma16_dispatch<0>(st, &jobs, 1, xb, ldb, 0, T);
    return 0;
}
