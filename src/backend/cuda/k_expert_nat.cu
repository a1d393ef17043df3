/* The routed experts on native FP8 tensor cores (issue 18: prefill; DSV4_CUDA_NATIVE_EXPERTS=1, cu_mma.h).
 *
 * The default OFFICIAL experts compute every 32-column block on mma.sync e4m3's bits, which sm_90 gets from two fp16
 * MMAs and an addition (docs/PREFILL_GEMM.md): the prefill's expert GEMM runs at ~120-130 TFLOPS (runs 146, 159).
 * Native FP8 wgmma (m64nNk32 .e4m3) does a block in one instruction with its own sum, which keeps ~14 bits of a
 * block's largest product, not mma.sync's — so it is a model-level choice: every routed expert of a model takes it
 * at every step (decode and prefill alike), or none does. Off by default: runs 159-160 measured +11 % at an 8K
 * prefill and -8 % at decode, and the calm model's first positions 1.27e-2 from the official code's GPU run
 * (the default: 2e-7; test_gpu_vs_cpu's limit 1e-2).
 *
 * ---- The order of y[n][o] (pair n, weight row o; K columns, chunks c = 0 .. K/128 - 1 of four 32-column blocks) ----
 *   P_cj = wgmma from zero over block j of chunk c: A = the row's 32 codes as E4M3 bytes of their values times 2^-6
 *          (frag_lo / frag_hi of the packed words), B = the pair's 32 activation bytes; the tensor core's own sum;
 *   t_c  = P_c0 * W_c0, then t_c = fmaf(P_cj, W_cj, t_c) for j = 1, 2, 3, W_cj = dev_e8m0(the row's scale byte of
 *          block 4c + j) * 64 (fp32; the 64 undoes the codes' 2^-6);
 *   y    = fmaf(t_c, sx_c, y) for c = 0, 1, 2, ... in increasing order from y = +0 (sx_c the pair's activation scale
 *          of chunk c), then rounded to BF16 when out_bf16.
 * One chain a element, no partials: a function of K alone. A wgmma element depends on its own row of A and column
 * of B only (run 141: a token alone and among 8 give the same bits), so neither the instruction's N, nor the tile a
 * pair lands in, nor its neighbours change a bit. test_gpu_mma holds the two kernels below to each other by memcmp on
 * the same plans, and to an exact host sum within the native sum's rounding.
 *
 * ---- Layout (cu_fp4_nat_pack, format CU_FMT_FP4_NAT) ----
 * Each 64-byte unit (a row's 128-column chunk) is rewritten in place: word 4q + j holds, for lane q = 0..3 of block
 * j, the codes of columns 32j + 4q + i (code i, i = 0..3) and 32j + 16 + 4q + i (code 4 + i) in frag_bits' bit order
 * (cu_mma_frag.cuh). wgmma's register A for a warp (mma.m16n8k32's layout: a0 row g at k 4q .. 4q + 3, a2 at
 * k 16 + 4q ..; a1 / a3 row g + 8) is then frag_lo / frag_hi of the lane's words, and k runs over the block's columns
 * in their own order, so B is the activation bytes as they are: a token's block j is the core matrix of its bytes
 * 32j .. 32j + 15 (k 0..15) and that of 32j + 16 .. 32j + 31 (k 16..31), each copied by one cp.async.
 *
 * ---- Kernels ----
 *   k_nat_small: a decode step's tiles (<= 8 pairs): a block = one warpgroup = 64 rows x a plan tile; the tile's
 *     activation bytes of all chunks staged in shared memory once, the weights streamed into registers NAT_U chunks
 *     ahead, four m64n8k32 a chunk.
 *   k_nat_gemm: a large step: a block = two warpgroups = 128 rows x up to 128 pairs of one expert (the plan's groups,
 *     cu_plan_groups.cuh), weights, activations and scales staged by cp.async NAT_STAGES chunks deep, m64n128k32
 *     (m64n64k32 for a group of at most 64 pairs). */
#include "backend/cuda/cu_async.cuh"
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_mma.h"
#include "backend/cuda/cu_mma_frag.cuh"
#include "backend/cuda/cu_plan_groups.cuh"
#include "model/expert_place.h"
extern "C" {
#include "util/error.h"
}

#define NAT_U 4             /* k_nat_small: chunks of weights in flight a thread */
#define NAT_BM 128          /* k_nat_gemm: weight rows a block */
#define NAT_BN 128          /* k_nat_gemm: pairs a block tile at most */
#define NAT_THREADS 256     /* k_nat_gemm: two warpgroups of 64 rows */
#define NAT_STAGES 3
#define NAT_GROUP_TILES (NAT_BN / CU_MOE_TILE)   /* plan tiles a group */

/* ---- PTX: wgmma m64nNk32 .e4m3 x .e4m3 -> f32, A (64 x 32) from registers in mma.m16n8k32's layout per warp, B at
 * descriptor db; acc = 0: d = A B, else d = A B + d. d[4 i + e]: n8 tile i, the element mma.sync's d[e] would be
 * (row g or g + 8 of the warp's 16, column 8 i + 2q or + 1). ---- */
__device__ __forceinline__ void wgmma_e4m3_n8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(acc));
}

__device__ __forceinline__ void wgmma_e4m3_n64(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(acc));
}

__device__ __forceinline__ void wgmma_e4m3_n128(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(acc));
}

/* ---- end of PTX ---- */

/* cu_fp4_nat_pack: one thread a 64-byte unit, in place. Raw word m of a unit holds columns 8m .. 8m + 7 (code k in
 * bits 4k); lane q's codes of block j are columns 32j + 4q + i (raw word 4j + q / 2, nibbles 4 (q % 2) + i) and
 * 32j + 16 + 4q + i (raw word 4j + 2 + q / 2). */
__global__ void k_nat_pack(uint32_t *__restrict__ d, int64_t units) {
    dev_grid_wait();
    fp4_units_pack(d, units, [](const uint32_t (&v)[16], int j, int q) {
        const int sh = 16 * (q & 1);
        return frag_bits(((v[4 * j + (q >> 1)] >> sh) & 0xFFFFu) | ((v[4 * j + 2 + (q >> 1)] >> sh) & 0xFFFFu) << 16);
    });
}

/* W_cj of the order: block j's scale byte of the row's chunk word s, times 64. */
__device__ __forceinline__ float nat_wscale(uint32_t s, int j) { return dev_e8m0((uint8_t)(s >> (8 * j))) * 64.0f; }

/* The 4 scale bytes of one (row, chunk) as a word: one load when aligned (s4), else four. */
__device__ __forceinline__ uint32_t nat_scale_word(const uint8_t *p, bool s4) {
    if (s4) return *(const uint32_t *)p;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Rows [row_base, +nr) of pairs [p0, p0 + n) of an expert nobody here holds (another GPU's or the host's): the exact
 * gather's identity, as the other expert kernels write it. */
__device__ __forceinline__ void nat_absent(float *y, int ldy, int p0, int n, int row_base, int nr, int rows, int nthreads) {
    for (int i = threadIdx.x; i < nr * n; i += nthreads) {
        const int r = row_base + i % nr;
        if (r < rows) y[((int64_t)p0 + i / nr) * ldy + r] = EP_ABSENT_ROW;
    }
}

__device__ __forceinline__ int64_t nat_in_row(const int32_t *in_rows, int base, int n) { return in_rows ? in_rows[base + n] : (int64_t)base + n; }

/* ==== k_nat_small ==== */

/* A thread's weights of one chunk: rows a (= g) and b (= g + 8) of its warp, words 4q .. 4q + 3 (blocks 0..3), and
 * their scale words. */
struct nat_wchunk {
    uint4 a, b;
    uint32_t sa, sb;
};

/* Shared memory of k_nat_small for K columns: the group's activation bytes (chunk c block j at 256 (4c + j): 8
 * pairs x 16 bytes of k 0..15, then of k 16..31), then its activation scales [chunk][8]. */
static inline size_t nat_small_smem(int K) { return (size_t)(K / 128) * (1024 + 8 * sizeof(float)); }

template <int U>
__global__ void __launch_bounds__(128) k_nat_small(const dsv4_weight *__restrict__ experts_a, const dsv4_weight *__restrict__ experts_b, int rows,
                                                   cu_moe_plan plan, const uint8_t *__restrict__ xq, int ldq, const float *__restrict__ xs,
                                                   int lds, int x_by_pair, float *y_a, float *y_b, int ldy, int out_bf16) {
    dev_grid_wait();
    extern __shared__ __align__(128) uint8_t nat_sm[];
    const int tile = blockIdx.y;
    if (tile >= *plan.n_tiles) return;
    float *const y = blockIdx.z ? y_b : y_a;
    const dsv4_weight w = (blockIdx.z ? experts_b : experts_a)[plan.tile_expert[tile]];
    const int p0 = plan.tile_first[tile], cnt = plan.tile_count[tile], row_base = 64 * blockIdx.x;
    if (!w.data) {
        nat_absent(y, ldy, p0, cnt, row_base, 64, rows, 128);
        return;
    }
    const int K = w.cols, nch = K / 128, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int32_t *in_rows = x_by_pair ? NULL : plan.pair_token;
    uint8_t *const sb = nat_sm;
    float *const sx = (float *)(nat_sm + (size_t)nch * 1024);
    /* the thread's rows (past the weight: its last row, whose outputs nobody stores) */
    const int ra = row_base + 16 * warp + g, rb = ra + 8;
    const uint8_t *wa = (const uint8_t *)w.data + (int64_t)min(ra, rows - 1) * (K / 2) + 16 * q;
    const uint8_t *wb = (const uint8_t *)w.data + (int64_t)min(rb, rows - 1) * (K / 2) + 16 * q;
    const uint8_t *ssa = w.scale + (int64_t)(w.row0 + min(ra, rows - 1)) * w.scale_cols;
    const uint8_t *ssb = w.scale + (int64_t)(w.row0 + min(rb, rows - 1)) * w.scale_cols;
    const bool s4 = ((uintptr_t)w.scale & 3) == 0 && (w.scale_cols & 3) == 0;
    auto load = [&](nat_wchunk &r, int c) {
        r.a = *(const uint4 *)(wa + 64 * c);
        r.b = *(const uint4 *)(wb + 64 * c);
        r.sa = nat_scale_word(ssa + 4 * c, s4);
        r.sb = nat_scale_word(ssb + 4 * c, s4);
    };
    for (int g0 = 0; g0 < cnt; g0 += 8) {   /* a plan tile of more than 8 pairs: 8 at a time */
        const int n = min(8, cnt - g0);
        if (g0) __syncthreads();   /* every warp is done with the last group's activations */
        for (int u = tid; u < nch * 64; u += 128) {   /* chunk c, pair t, 16-byte unit v (block v / 2, half v % 2) */
            const int c = u >> 6, t = (u >> 3) & 7, v = u & 7;
            const bool ok = t < n;
            const uint8_t *src = ok ? xq + nat_in_row(in_rows, p0 + g0, t) * ldq + 128 * c + 16 * v : xq;
            cp_async16(sb + 256 * (4 * c + (v >> 1)) + 128 * (v & 1) + 16 * t, src, ok ? 16 : 0);
        }
        cp_async_commit();
        for (int u = tid; u < nch * 8; u += 128) {
            const int c = u >> 3, t = u & 7;
            sx[u] = t < n ? xs[nat_in_row(in_rows, p0 + g0, t) * lds + c] : 0.0f;
        }
        nat_wchunk wr[U];
#pragma unroll
        for (int k = 0; k < U; k++)
            if (k < nch) load(wr[k], k);
        cp_async_wait<0>();
        fence_proxy_async();
        __syncthreads();
        float acc[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
        for (int c0 = 0; c0 < nch; c0 += U) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = c0 + u;
                if (c >= nch) break;   /* uniform in the block */
                const uint32_t A0[4] = { wr[u].a.x, wr[u].a.y, wr[u].a.z, wr[u].a.w }, A1[4] = { wr[u].b.x, wr[u].b.y, wr[u].b.z, wr[u].b.w };
                uint32_t lo0[4], hi0[4], lo1[4], hi1[4];
                float P[4][4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    lo0[j] = frag_lo(A0[j]), hi0[j] = frag_hi(A0[j]), lo1[j] = frag_lo(A1[j]), hi1[j] = frag_hi(A1[j]);
                    wg_pin_r(lo0[j]), wg_pin_r(hi0[j]), wg_pin_r(lo1[j]), wg_pin_r(hi1[j]);
#pragma unroll
                    for (int e = 0; e < 4; e++) P[j][e] = 0.0f, wg_pin(P[j][e]);
                }
                const uint32_t sa = wr[u].sa, sbw = wr[u].sb;
                wg_fence();
#pragma unroll
                for (int j = 0; j < 4; j++) wgmma_e4m3_n8(P[j], lo0[j], lo1[j], hi0[j], hi1[j], wg_desc(sb + 256 * (4 * c + j), 128, 256), 0);
                wg_commit();
                wg_wait0();
#pragma unroll
                for (int j = 0; j < 4; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) wg_pin(P[j][e]);
                if (c + U < nch) load(wr[u], c + U);
                float t[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const float W0 = nat_wscale(sa, j), W1 = nat_wscale(sbw, j);
#pragma unroll
                    for (int e = 0; e < 4; e++) t[e] = j ? fmaf(P[j][e], e >> 1 ? W1 : W0, t[e]) : P[j][e] * (e >> 1 ? W1 : W0);
                }
                const float x0 = sx[8 * c + 2 * q], x1 = sx[8 * c + 2 * q + 1];
#pragma unroll
                for (int e = 0; e < 4; e++) acc[e] = fmaf(t[e], e & 1 ? x1 : x0, acc[e]);
            }
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e >> 1 ? rb : ra, t = 2 * q + (e & 1);
            if (r < rows && t < n) y[((int64_t)p0 + g0 + t) * ldy + r] = out_bf16 ? dev_round_bf16(acc[e]) : acc[e];
        }
    }
}

/* ==== k_nat_gemm ==== */

/* A stage: the block's 128 weight rows' packed chunk (64 bytes a row), the tile's activation bytes (block j at
 * 4096 j, pair group G = t / 8 at 256 G, half h at 128 h, pair t % 8 at 16 (t % 8): core matrices of 8 pairs x 16
 * bytes, 128 bytes apart along K and 256 along the pairs), the rows' scale words, the pairs' activation scales. */
struct nat_smem {
    static constexpr int a_bytes = NAT_BM * 64, b_bytes = NAT_BN * 128;
    static constexpr int sw_off = a_bytes + b_bytes, sx_off = sw_off + 4 * NAT_BM, stage = sx_off + 4 * NAT_BN;
    static constexpr int rows_off = NAT_STAGES * stage;   /* the tile's input rows */
    static constexpr int total = rows_off + 4 * NAT_BN;
};

/* Stage chunk c's weight rows and activation bytes (cp.async; zero past the weight's rows and the tile's n pairs). */
__device__ __forceinline__ void nat_load(uint8_t *st, const uint8_t *__restrict__ wd, int rows, int K, int row_base,
                                         const uint8_t *__restrict__ xq, int ldq, const int32_t *rows_in, int n, int c) {
#pragma unroll
    for (int k = 0; k < NAT_BM * 4 / NAT_THREADS; k++) {
        const int u = threadIdx.x + NAT_THREADS * k, r = u >> 2, v = u & 3;
        const bool ok = row_base + r < rows;
        cp_async16(st + 64 * r + 16 * v, ok ? wd + (int64_t)(row_base + r) * (K / 2) + 64 * c + 16 * v : wd, ok ? 16 : 0);
    }
    uint8_t *B = st + nat_smem::a_bytes;
#pragma unroll
    for (int k = 0; k < NAT_BN * 8 / NAT_THREADS; k++) {
        const int u = threadIdx.x + NAT_THREADS * k, t = u >> 3, v = u & 7;
        const bool ok = t < n;
        cp_async16(B + 4096 * (v >> 1) + 256 * (t >> 3) + 128 * (v & 1) + 16 * (t & 7),
                   ok ? xq + (int64_t)rows_in[t] * ldq + 128 * c + 16 * v : xq, ok ? 16 : 0);
    }
}
/* Thread t's scale word of chunk c (t < 128: pair t's activation scale; else row t - 128's scale word), fetched a
 * stage ahead and stored after the chunk's MMAs so that its latency hides behind them. 0 past n / the rows. */
__device__ __forceinline__ uint32_t nat_scale_fetch(const dsv4_weight &w, int rows, const float *__restrict__ xs, int lds, const int32_t *rows_in,
                                                    int n, int row_base, int c) {
    const int t = threadIdx.x;
    if (t < NAT_BN) return t < n ? __float_as_uint(xs[(int64_t)rows_in[t] * lds + c]) : 0u;
    const int r = row_base + t - NAT_BN;
    if (r >= rows) return 0u;
    const uint8_t *p = w.scale + (int64_t)(w.row0 + r) * w.scale_cols + 4 * c;
    return nat_scale_word(p, ((uintptr_t)p & 3) == 0);
}
__device__ __forceinline__ void nat_scale_store(uint8_t *st, uint32_t v) {
    const int t = threadIdx.x;
    if (t < NAT_BN) ((uint32_t *)(st + nat_smem::sx_off))[t] = v;
    else ((uint32_t *)(st + nat_smem::sw_off))[t - NAT_BN] = v;
}

/* The warpgroup's wgmma over the tile's first NB pairs. */
template <int NB> __device__ __forceinline__ void nat_wgmma(float (&d)[NB / 2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db) {
    if constexpr (NB == 128) wgmma_e4m3_n128(d, a0, a1, a2, a3, db, 0);
    else wgmma_e4m3_n64(d, a0, a1, a2, a3, db, 0);
}

/* One block tile: rows [row_base, +128) x pairs [0, n) (n <= NB) of weight w; pair t reads input row rows_in[t] and
 * writes output row out_base + t. */
template <int NB>
__device__ __forceinline__ void nat_block(const dsv4_weight &w, int rows, const uint8_t *__restrict__ xq, int ldq, const float *__restrict__ xs,
                                          int lds, const int32_t *__restrict__ in_rows, int in_base, int n, float *__restrict__ y, int ldy,
                                          int out_base, int out_bf16, int row_base) {
    constexpr int NA = NB / 2;
    extern __shared__ __align__(128) uint8_t nat_sm[];
    const int K = w.cols, nch = K / 128, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int ra = 64 * (warp >> 2) + 16 * (warp & 3) + g;   /* the thread's rows ra, ra + 8 of the block */
    const uint8_t *wd = (const uint8_t *)w.data;
    int32_t *rows_in = (int32_t *)(nat_sm + nat_smem::rows_off);
    __syncthreads();   /* a block that runs several tiles: every warp is done with the last one's buffers */
    if (threadIdx.x < NAT_BN) rows_in[threadIdx.x] = threadIdx.x < n ? (int32_t)nat_in_row(in_rows, in_base, threadIdx.x) : 0;
    __syncthreads();
#pragma unroll
    for (int s = 0; s < NAT_STAGES - 1; s++) {
        if (s < nch) {
            uint8_t *st = nat_sm + s * nat_smem::stage;
            nat_load(st, wd, rows, K, row_base, xq, ldq, rows_in, n, s);
            nat_scale_store(st, nat_scale_fetch(w, rows, xs, lds, rows_in, n, row_base, s));
        }
        cp_async_commit();
    }
    float acc[NA], P[NA], t[NA];
#pragma unroll
    for (int k = 0; k < NA; k++) acc[k] = 0.0f, P[k] = 0.0f, t[k] = 0.0f;
    for (int i = 0; i < nch; i++) {
        cp_async_wait<NAT_STAGES - 2>();
        fence_proxy_async();
        __syncthreads();   /* stage i landed for every thread; every warp is done with stage i - 1 */
        const int next = i + NAT_STAGES - 1;
        uint8_t *nst = nat_sm + (next % NAT_STAGES) * nat_smem::stage;
        uint32_t nscale = 0;
        if (next < nch) {
            nat_load(nst, wd, rows, K, row_base, xq, ldq, rows_in, n, next);
            nscale = nat_scale_fetch(w, rows, xs, lds, rows_in, n, row_base, next);
        }
        cp_async_commit();
        const uint8_t *st = nat_sm + (i % NAT_STAGES) * nat_smem::stage;
        const uint4 Aa = *(const uint4 *)(st + 64 * ra + 16 * q), Ab = *(const uint4 *)(st + 64 * (ra + 8) + 16 * q);
        const uint32_t A0[4] = { Aa.x, Aa.y, Aa.z, Aa.w }, A1[4] = { Ab.x, Ab.y, Ab.z, Ab.w };
        const uint32_t swa = ((const uint32_t *)(st + nat_smem::sw_off))[ra], swb = ((const uint32_t *)(st + nat_smem::sw_off))[ra + 8];
        const uint8_t *B = st + nat_smem::a_bytes;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t a0 = frag_lo(A0[j]), a1 = frag_lo(A1[j]), a2 = frag_hi(A0[j]), a3 = frag_hi(A1[j]);
            wg_pin_r(a0), wg_pin_r(a1), wg_pin_r(a2), wg_pin_r(a3);
            wg_fence();
            nat_wgmma<NB>(P, a0, a1, a2, a3, wg_desc(B + 4096 * j, 128, 256));
            wg_commit();
            wg_wait0();
#pragma unroll
            for (int k = 0; k < NA; k++) wg_pin(P[k]);
            const float W0 = nat_wscale(swa, j), W1 = nat_wscale(swb, j);
#pragma unroll
            for (int k = 0; k < NA; k++) t[k] = j ? fmaf(P[k], (k & 2) ? W1 : W0, t[k]) : P[k] * ((k & 2) ? W1 : W0);
        }
        const float *sxs = (const float *)(st + nat_smem::sx_off);
#pragma unroll
        for (int i8 = 0; i8 < NB / 8; i8++) {
            const float2 sx = *(const float2 *)(sxs + 8 * i8 + 2 * q);
#pragma unroll
            for (int e = 0; e < 4; e++) acc[4 * i8 + e] = fmaf(t[4 * i8 + e], e & 1 ? sx.y : sx.x, acc[4 * i8 + e]);
        }
        if (next < nch) nat_scale_store(nst, nscale);   /* read after the barrier of stage next */
    }
#pragma unroll
    for (int k = 0; k < NA; k++) {
        const int r = row_base + ra + 8 * ((k & 3) >> 1), tok = 8 * (k >> 2) + 2 * q + (k & 1);
        if (r < rows && tok < n) y[((int64_t)out_base + tok) * ldy + r] = out_bf16 ? dev_round_bf16(acc[k]) : acc[k];
    }
}

/* The plan's groups of blockIdx.y (cu_plan_groups.cuh), rows [128 blockIdx.x, +128), projection blockIdx.z. */
__global__ void __launch_bounds__(NAT_THREADS, 1) k_nat_gemm(const dsv4_weight *__restrict__ experts_a, const dsv4_weight *__restrict__ experts_b,
                                                             int rows, cu_moe_plan plan, const uint8_t *__restrict__ xq, int ldq,
                                                             const float *__restrict__ xs, int lds, int x_by_pair, float *y_a, float *y_b,
                                                             int ldy, int out_bf16) {
    dev_grid_wait();
    const dsv4_weight *experts = blockIdx.z ? experts_b : experts_a;
    float *const y = blockIdx.z ? y_b : y_a;
    const int row_base = NAT_BM * blockIdx.x;
    const int32_t *in_rows = x_by_pair ? NULL : plan.pair_token;
    plan_block_groups(plan, NAT_GROUP_TILES, [&](int s, int s1) {
        const int p0 = plan.tile_first[s], n = plan.tile_first[s1 - 1] + plan.tile_count[s1 - 1] - p0;
        const dsv4_weight w = experts[plan.tile_expert[s]];
        if (!w.data) {
            nat_absent(y, ldy, p0, n, row_base, NAT_BM, rows, NAT_THREADS);
            return;
        }
        if ((uintptr_t)w.data % 16) __trap();   /* the model gives each expert an allocation of its own */
        for (int tb = 0; tb < n; tb += NAT_BN) {   /* plan tiles of more than 8 pairs: 128 pairs at a time */
            const int nb = min(NAT_BN, n - tb);
            if (nb <= 64) nat_block<64>(w, rows, xq, ldq, xs, lds, in_rows, p0 + tb, nb, y, ldy, p0 + tb, out_bf16, row_base);
            else nat_block<128>(w, rows, xq, ldq, xs, lds, in_rows, p0 + tb, nb, y, ldy, p0 + tb, out_bf16, row_base);
        }
    });
}

/* ==== host ==== */

extern "C" int cu_fp4_nat_pack(cu_stream st, void *data, int64_t rows, int cols, dsv4_error *err) {
    if (rows < 0 || cols < 128 || cols % 128 || (uintptr_t)data % 16)
        return dsv4_fail(err, DSV4_E_ARG, "cu_fp4_nat_pack: %lld x %d FP4 (columns a multiple of 128, data 16-byte aligned)", (long long)rows,
                         cols);
    const int64_t units = rows * (cols / 128);
    if (units) k_nat_pack<<<cu_blocks(units, 256) < 4096 ? cu_blocks(units, 256) : 4096, 256, 0, (cudaStream_t)st>>>((uint32_t *)data, units);
    return 0;
}

static int nat_min_tiles = CU_NAT_GEMM_MIN_TILES;
extern "C" int cu_nat_gemm_min_tiles(int min_tiles) {
    const int old = nat_min_tiles;
    nat_min_tiles = min_tiles < 0 ? 0 : min_tiles;
    return old;
}

/* Shared memory beyond 48 KiB: a function attribute of each device, set once each (to the most either kernel asks). */
static int nat_smem_opt_in(void) {
    static unsigned done;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 32) {
        (void)cudaGetLastError();
        return 0;
    }
    if (!(done >> dev & 1u)) {
        if (cudaFuncSetAttribute(k_nat_small<NAT_U>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024) != cudaSuccess ||
            cudaFuncSetAttribute(k_nat_gemm, cudaFuncAttributeMaxDynamicSharedMemorySize, nat_smem::total) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        done |= 1u << dev;
    }
    return 1;
}

extern "C" int cu_nat_experts(cu_stream st, int nz, const dsv4_weight *experts_a, const dsv4_weight *experts_b, int rows, int cols,
                              const cu_moe_plan *plan, int max_tiles, const uint8_t *xq, int ldq, const float *xs, int lds, int x_by_pair,
                              float *y_a, float *y_b, int ldy, int out_bf16, dsv4_error *err) {
    if (max_tiles <= 0 || rows == 0) return 0;
    const size_t small = nat_small_smem(cols);
    if (cols % 128 || small > 200 * 1024 || !nat_smem_opt_in())
        return dsv4_fail(err, DSV4_E_UNSUPPORTED, "native FP8 experts: %d columns (a multiple of 128, at most %d), or no shared memory opt-in",
                         cols, 200 * 1024 / 1032 * 128);
    /* the small kernel's grid has a block row a plan tile (at most 65535) */
    if ((nat_min_tiles && max_tiles >= nat_min_tiles) || max_tiles > 65535) {
        const dim3 grid(cu_blocks(rows, NAT_BM), cu_blocks(max_tiles, NAT_GROUP_TILES), nz);
        k_nat_gemm<<<grid, NAT_THREADS, nat_smem::total, (cudaStream_t)st>>>(experts_a, experts_b, rows, *plan, xq, ldq, xs, lds, x_by_pair, y_a,
                                                                           y_b, ldy, out_bf16);
    } else {
        const dim3 grid(cu_blocks(rows, 64), max_tiles, nz);
        k_nat_small<NAT_U><<<grid, 128, small, (cudaStream_t)st>>>(experts_a, experts_b, rows, *plan, xq, ldq, xs, lds, x_by_pair, y_a, y_b, ldy,
                                                                  out_bf16);
    }
    return 0;
}
