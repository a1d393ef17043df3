/* Per-token operations of a block: embedding, RMSNorm, rounding and fake quantization, mHC (pre, post, head),
 * RoPE and the attention's per-token preparation. Reduction orders are stated at each kernel; sums that the
 * CPU computes sequentially are computed sequentially here too wherever they are short (the mHC stream sums,
 * Sinkhorn), and as a fixed block_sum where they are long (norms). */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_hc_post.cuh"
#include "backend/cuda/cu_kernels.h"
#include "backend/cuda/cu_quant.cuh"
#include "backend/cuda/cu_rope.cuh"
#include "core/sinkhorn.h"

#define ROW_THREADS 256

/* The one-token layouts (issue 18): k_rmsnorm_fast, k_hc_pre_fast, hc_post_elem4 and k_hc_post_moe's pair loads.
 * 0: the kernels and loops as before them (tools/gpu/shim/shim_mhc.sh runs both and compares every byte; run 42,
 * docs/GPU_RUNS.md, compared the logits of both builds on the GPU: equal). Run 40, built with nvcc's default FMA
 * contraction, had found them different; the likely spot is hc_post's `pw * fe + cw * old`, which nvcc makes
 * fma(pw, fe, cw * old) where the loop is unrolled and fma(cw, old, pw * fe) where it is not. The build now says
 * -fmad=false (Makefile): only written fmaf fuse, as in the shim. */
#ifndef DSV4_MHC_FAST
#define DSV4_MHC_FAST 1
#endif

/* A row of n = 256 M columns held by ROW_THREADS threads in registers, thread k holding columns k + 256 c
 * (c = 0..M-1), packed for the tensor cores (the bytes of warp_pack_block / block_pack_row): column block
 * 2 c + (k >= 128) is held by warps 0..3 (k < 128) or 4..7, one column a lane. Its amax is a max of fabsf values
 * and 0.0f (never NaN: exact in any order): each lane's value maxed with 0.0f, warp_max, then the block's 4 warps
 * (rows_amax; then a barrier of the 256 threads; then rows_pack). Each byte is dev_f32_to_e4m3(v / s). */
template <int M>
__device__ __forceinline__ void rows_amax(const float (&v)[M], float (*amx)[M]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int c = 0; c < M; c++) {
        const float a = warp_max(fmaxf(0.0f, fabsf(v[c])));
        if (lane == 0) amx[warp][c] = a;
    }
}
template <int M>
__device__ __forceinline__ void rows_pack(const float (&v)[M], float (*amx)[M], uint8_t *q, float *qs) {
    const int k = threadIdx.x, w0 = (k >> 5) & 4, half = k >> 7;
#pragma unroll
    for (int c = 0; c < M; c++) {
        const float amax = fmaxf(fmaxf(amx[w0][c], amx[w0 + 1][c]), fmaxf(amx[w0 + 2][c], amx[w0 + 3][c]));
        const float sc = quant_scale(amax, 0);
        q[k + ROW_THREADS * c] = dev_f32_to_e4m3(v[c] / sc);
        if ((k & 127) == 0) qs[2 * c + half] = sc;
    }
}

/* ---- embedding ------------------------------------------------------------------------------------------------ */

__global__ void k_embed(dsv4_weight w, const int32_t *tok, int T, int hc, int d, float *X) {
    dev_grid_wait();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * d) return;
    const int t = (int)(idx / d), e = (int)(idx % d);
    const float v = dev_weight_at(w, tok[t], e);
    for (int i = 0; i < hc; i++) X[((int64_t)t * hc + i) * d + e] = v;
}

extern "C" void cu_embed(cu_stream st, const dsv4_weight *embed, const int32_t *tok, int T, int hc, int d, float *X) {
    k_embed<<<cu_blocks((int64_t)T * d, 256), 256, 0, (cudaStream_t)st>>>(*embed, tok, T, hc, d, X);
}

/* ---- norms ---------------------------------------------------------------------------------------------------- */

/* q non-NULL: the output row also packed for the tensor cores (cu_mma.h) by the same block. */
__global__ void k_rmsnorm(int official, const float *x, int ldx, const float *w, int n, float eps, float *y, int ldy, uint8_t *q,
                          int ldq, float *qs, int lds) {
    dev_grid_wait();
    __shared__ float red[32];
    const float *xr = x + (int64_t)blockIdx.x * ldx;
    float *yr = y + (int64_t)blockIdx.x * ldy;
    const float r = 1.0f / sqrtf(sum_squares(xr, n, red) / (float)n + eps);
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = dev_bf16_if(official, w[i] * (xr[i] * r));
    if (q) block_pack_row(yr, n, q + (int64_t)blockIdx.x * ldq, qs + (int64_t)blockIdx.x * lds);
}

/* The same for n = 256 M (M = 1, 2, 4, 6, 8, 16, 28: q_lora is 4 in Flash, 6 in Pro; hidden 16 and 28): thread k
 * loads its M elements of x (those sum_squares gives it, in its order) and of w at once and keeps them; y written
 * once, never read back (the packing from registers: rows_pack).
 * The kernel above waits a memory latency per loop iteration (the next loads may alias the store before) and
 * reads the row back to pack it (run 32: rmsnorm 8.8 us at one token). Every value is the kernel above's: the same
 * fmaf chain, block_sum (256 threads), expressions and bytes. y may be x (each thread reads its elements first). */
template <int M>
__global__ void __launch_bounds__(ROW_THREADS)
k_rmsnorm_fast(int official, const float *x, int ldx, const float *w, int n, float eps, float *y, int ldy, uint8_t *q, int ldq,
               float *qs, int lds) {
    dev_grid_wait();
    __shared__ float red[32], amx[8][M];
    const int k = threadIdx.x;
    const float *xr = x + (int64_t)blockIdx.x * ldx;
    float *yr = y + (int64_t)blockIdx.x * ldy;
    float xv[M], wv[M];
#pragma unroll
    for (int c = 0; c < M; c++) {
        xv[c] = xr[k + ROW_THREADS * c];
        wv[c] = w[k + ROW_THREADS * c];
    }
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < M; c++) s = fmaf(xv[c], xv[c], s);
    const float r = 1.0f / sqrtf(block_sum(s, red) / (float)n + eps);
#pragma unroll
    for (int c = 0; c < M; c++) {
        xv[c] = dev_bf16_if(official, wv[c] * (xv[c] * r));
        yr[k + ROW_THREADS * c] = xv[c];
    }
    if (!q) return;
    rows_amax<M>(xv, amx);
    __syncthreads();
    rows_pack<M>(xv, amx, q + (int64_t)blockIdx.x * ldq, qs + (int64_t)blockIdx.x * lds);
}

static void rmsnorm_launch(cu_stream st, int official, const float *x, int ldx, const float *w, int n, float eps, float *y, int ldy,
                           int rows, uint8_t *q, int ldq, float *qs, int lds) {
    if (rows <= 0) return;
    if (DSV4_MHC_FAST && n % ROW_THREADS == 0) {
#define RMS_CASE(V) \
    case V: k_rmsnorm_fast<V><<<rows, ROW_THREADS, 0, (cudaStream_t)st>>>(official, x, ldx, w, n, eps, y, ldy, q, ldq, qs, lds); return;
        switch (n / ROW_THREADS) {
            RMS_CASE(1) RMS_CASE(2) RMS_CASE(4) RMS_CASE(6) RMS_CASE(8) RMS_CASE(16) RMS_CASE(28)
        default: break;
        }
#undef RMS_CASE
    }
    k_rmsnorm<<<rows, ROW_THREADS, 0, (cudaStream_t)st>>>(official, x, ldx, w, n, eps, y, ldy, q, ldq, qs, lds);
}

extern "C" void cu_rmsnorm(cu_stream st, int official, const float *x, int ldx, const float *w, int n, float eps, float *y,
                           int ldy, int rows) {
    rmsnorm_launch(st, official, x, ldx, w, n, eps, y, ldy, rows, NULL, 0, NULL, 0);
}

extern "C" void cu_rmsnorm_pack(cu_stream st, int official, const float *x, int ldx, const float *w, int n, float eps, float *y,
                                int ldy, int rows, uint8_t *q, int ldq, float *qs, int lds) {
    rmsnorm_launch(st, official, x, ldx, w, n, eps, y, ldy, rows, q, ldq, qs, lds);
}

__global__ void k_round_bf16(float *x, int64_t n) {
    dev_grid_wait();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = dev_round_bf16(x[i]);
}

extern "C" void cu_round_bf16(cu_stream st, float *x, int64_t n) {
    if (n > 0) k_round_bf16<<<cu_blocks(n, 256), 256, 0, (cudaStream_t)st>>>(x, n);
}

/* ---- fake quantization (one warp per block of columns) ------------------------------------------------------------ */

__global__ void k_act_quant(const float *x, int ldx, float *y, int ldy, int rows, int n, int block, int fp4) {
    dev_grid_wait();
    const int warps = blockDim.x >> 5;
    const int nb = (n + block - 1) / block;
    const int64_t job = (int64_t)blockIdx.x * warps + (threadIdx.x >> 5);
    if (job >= (int64_t)rows * nb) return;
    const int r = (int)(job / nb), b = (int)(job % nb);
    const int len = n - b * block < block ? n - b * block : block;
    warp_quant_block(x + (int64_t)r * ldx + b * block, y + (int64_t)r * ldy + b * block, len, fp4);
}

extern "C" void cu_act_quant(cu_stream st, const float *x, int ldx, float *y, int ldy, int rows, int n, int block, int fp4) {
    const int64_t jobs = (int64_t)rows * ((n + block - 1) / block);
    if (jobs > 0) k_act_quant<<<cu_blocks(jobs, 8), 256, 0, (cudaStream_t)st>>>(x, ldx, y, ldy, rows, n, block, fp4);
}

/* ---- mHC ------------------------------------------------------------------------------------------------------------- */

__device__ __forceinline__ float dev_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* sinkhorn_inplace for n = 4 spread over a warp: lane q (mod 16) holds element (j, k) = (q / 4, q % 4) and returns
 * its final value. Every lane of the warp must call it (full-warp shuffles); lanes 16..31 repeat lanes 0..15. */
__device__ __forceinline__ float sinkhorn4_lane(float c, int q, int iters, float eps) {
    const int j = q >> 2, k = q & 3, base = threadIdx.x & 16;
    float row[4];
#pragma unroll
    for (int i = 0; i < 4; i++) row[i] = __shfl_sync(0xffffffffu, c, base + 4 * j + i);
    float mx = row[0];
#pragma unroll
    for (int i = 1; i < 4; i++) mx = fmaxf(mx, row[i]);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) s += expf(row[i] - mx);
    c = expf(c - mx) / s + eps;
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
            s = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) s += __shfl_sync(0xffffffffu, c, base + 4 * j + i);
            c /= s + eps;
        }
        s = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) s += __shfl_sync(0xffffffffu, c, base + 4 * i + k);
        c /= s + eps;
    }
    return c;
}

__global__ void k_hc_pre_finish(int official, const float *mixraw, const float *X, int hc, int d, const float *base,
                                const float *scale, float hc_eps, float norm_eps, int iters, float *u, float *mix,
                                const float *norm, float *xn, uint8_t *xq, int ldq, float *xqs, int lds, uint16_t *xb, int ldb) {
    dev_grid_wait();
    __shared__ float red[32];
    __shared__ float pre[8], C[64];
    const int t = blockIdx.x, n = hc * d, nmix = (2 + hc) * hc;
    const float *x = X + (int64_t)t * n;
    const float r = 1.0f / sqrtf(sum_squares(x, n, red) / (float)n + norm_eps);
    float *mx = mix + (int64_t)t * CU_MIX;
    const float *m = mixraw + (int64_t)t * nmix;
    if (hc == 4) {
        /* warp 0, lane q (mod 16) holding C[q / 4][q % 4]: each lane makes the same operations in the same order
         * as sinkhorn_inplace makes for its element (every row or column sum read from the 4 lanes that hold it and
         * added in index order), so the result is the single thread's bit for bit; the 20 rounds then cost ~20 x 2
         * dependent sums instead of 20 x 32 divisions in one thread (run 18's ncu: 53 us a launch, 13 % of a decode
         * step) */
        if (threadIdx.x < 32) {
            const int q = threadIdx.x & 15;
            const bool writer = threadIdx.x < 16;   /* lanes 16..31 only feed the shuffles */
            if (writer && q < 4) pre[q] = dev_sigmoid(m[q] * r * scale[0] + base[q]) + hc_eps;
            else if (writer && q < 8) mx[q - 4] = 2.0f * dev_sigmoid(m[q] * r * scale[1] + base[q]);
            const float c = sinkhorn4_lane(m[8 + q] * r * scale[2] + base[8 + q], q, iters, hc_eps);
            if (writer) mx[8 + q] = c;
        }
    } else if (threadIdx.x == 0) {
        for (int i = 0; i < hc; i++) pre[i] = dev_sigmoid(m[i] * r * scale[0] + base[i]) + hc_eps;
        for (int i = 0; i < hc; i++) mx[i] = 2.0f * dev_sigmoid(m[hc + i] * r * scale[1] + base[hc + i]);
        for (int j = 0; j < hc * hc; j++) C[j] = m[2 * hc + j] * r * scale[2] + base[2 * hc + j];
        sinkhorn_inplace(C, hc, iters, hc_eps);
        for (int j = 0; j < hc * hc; j++) mx[8 + j] = C[j];
    }
    __syncthreads();
    float *ut = u + (int64_t)t * d;
    float ss = 0.0f;   /* sum_squares(ut, d) of k_rmsnorm: this thread's elements e = k, k + B, ... in that order */
#pragma unroll 4
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        float s = 0.0f;
        for (int i = 0; i < hc; i++) s += pre[i] * x[(int64_t)i * d + e];
        ut[e] = dev_bf16_if(official, s);
        ss = fmaf(ut[e], ut[e], ss);
    }
    if (!norm) return;
    /* k_rmsnorm(u) fused: the same partials, block_sum and expression; each thread reads back only what it wrote */
    const float rr = 1.0f / sqrtf(block_sum(ss, red) / (float)d + norm_eps);
    float *xr = xn + (int64_t)t * d;
#pragma unroll 4
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        xr[e] = dev_bf16_if(official, norm[e] * (ut[e] * rr));
        if (xb) xb[(int64_t)t * ldb + e] = dev_f32_to_bf16(xr[e]);   /* k_mma16_pack's rounding of a bf16 value: exact */
    }
    if (xq) block_pack_row(xr, d, xq + (int64_t)t * ldq, xqs + (int64_t)t * lds);
}

/* The same operations for hc = 4 and d = 256 M (M = 1, 2, 4, 8, 16, 28: Flash is 16, Pro 28), laid out for one
 * token's latency (run 36's ncu: the kernel above took 19.7 us a launch at one token, one block on one SM, its
 * phases waiting on memory one after another: the stream loads 8 at a time, the norm weights and the stream
 * re-reads one loop iteration at a time behind stores that might alias them, the packing reading back what the
 * block had just written, and the 8 row warps idle at a barrier while warp 0 ran the 20 Sinkhorn rounds).
 * Here:
 *   - 256 row threads (warps 0..7) hold everything they touch in registers: thread k loads its 4 M stream
 *     elements X[k + 256 j] (j = i M + m is stream i, column e = k + 256 m: for d a multiple of 256 these are
 *     exactly the elements sum_squares gives thread k and the columns the stream sum gives it) and its M norm
 *     weights, all issued at the start; nothing written is read back.
 *   - a 9th warp (the mix warp) computes post and the Sinkhorn-normalised comb once 1/rms is known, while the
 *     row warps make u, xn and the packed row; it leaves the block early. The row warps meet at named barrier 1
 *     (256 threads), so the mix warp never holds them.
 * Bits: every value is the kernel above's. The sum of squares is thread k's fmaf chain over j in order, then
 * warp_sum and the 8 warp sums (lane < 8, else 0) by warp_sum: block_sum at blockDim 256, done by hand because
 * this block has 288 threads. 1/rms, pre, post, the Sinkhorn lanes (sinkhorn4_lane itself), u, the second norm
 * and xn are the same expressions on the same values. The pack: each 128-column block's amax is a max (of
 * fabsf values and 0.0f, never NaN: exact in any order), here each lane's |xn| maxed with 0.0f, warp_max, then
 * the 4 warps that hold the block; each byte is dev_f32_to_e4m3(xn / s) as in warp_pack_block. */
#define HCF_THREADS (ROW_THREADS + 32)

template <int M>
__global__ void __launch_bounds__(HCF_THREADS)
k_hc_pre_fast(int official, const float *mixraw, const float *X, int d, const float *base, const float *scale, float hc_eps,
              float norm_eps, int iters, float *u, float *mix, const float *norm, float *xn, uint8_t *xq, int ldq,
              float *xqs, int lds, uint16_t *xb, int ldb) {
    dev_grid_wait();
    __shared__ float red[8], red2[8], amx[8][M];
    const int t = blockIdx.x, n = 4 * d, k = threadIdx.x, lane = k & 31, warp = k >> 5;
    const float *x = X + (int64_t)t * n;
    const float *m = mixraw + (int64_t)t * 24;   /* (2 + hc) hc */
    /* Both kinds of warp meet one __syncthreads call site (red: the 8 row warps' sums): a barrier that warps reach
     * from different call sites is undefined in CUDA (compute-sanitizer synccheck, run 157). */
    const bool mix_warp = k >= ROW_THREADS;
    float xv[4 * M], nv[M], pm[4], pb[4];
    float cm = 0.0f, cb = 0.0f, cs = 0.0f, qm = 0.0f, qb = 0.0f, qs = 0.0f;
    if (mix_warp) {   /* the mix warp: its inputs loaded while the row warps sum */
        const int q = lane & 15;
        cm = m[8 + q], cb = base[8 + q], cs = scale[2];
        if (lane >= 4 && lane < 8) qm = m[lane], qb = base[lane];
        qs = scale[1];
    } else {
#pragma unroll
        for (int j = 0; j < 4 * M; j++) xv[j] = x[k + ROW_THREADS * j];
        if (norm) {
#pragma unroll
            for (int c = 0; c < M; c++) nv[c] = norm[k + ROW_THREADS * c];
        }
#pragma unroll
        for (int i = 0; i < 4; i++) { pm[i] = m[i]; pb[i] = base[i]; }
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 4 * M; j++) s = fmaf(xv[j], xv[j], s);
        s = warp_sum(s);
        if (lane == 0) red[warp] = s;
    }
    __syncthreads();
    const float r = 1.0f / sqrtf(warp_sum(lane < 8 ? red[lane] : 0.0f) / (float)n + norm_eps);
    if (mix_warp) {
        const int q = lane & 15;
        float *mx = mix + (int64_t)t * CU_MIX;
        if (lane >= 4 && lane < 8) mx[lane - 4] = 2.0f * dev_sigmoid(qm * r * qs + qb);
        const float c = sinkhorn4_lane(cm * r * cs + cb, q, iters, hc_eps);
        if (lane < 16) mx[8 + q] = c;
        return;   /* the row warps go on alone: they meet at named barrier 1 (ROW_THREADS threads) from here */
    }
    const float ps = scale[0];
    float pre[4];
#pragma unroll
    for (int i = 0; i < 4; i++) pre[i] = dev_sigmoid(pm[i] * r * ps + pb[i]) + hc_eps;
    float uv[M], ss = 0.0f;
    float *ut = u + (int64_t)t * d;
#pragma unroll
    for (int c = 0; c < M; c++) {
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) a += pre[i] * xv[i * M + c];
        uv[c] = dev_bf16_if(official, a);
        ut[k + ROW_THREADS * c] = uv[c];
        ss = fmaf(uv[c], uv[c], ss);
    }
    if (!norm) return;
    ss = warp_sum(ss);
    if (lane == 0) red2[warp] = ss;
    dev_bar_sync(1, ROW_THREADS);
    const float rr = 1.0f / sqrtf(warp_sum(lane < 8 ? red2[lane] : 0.0f) / (float)d + norm_eps);
    float *xr = xn + (int64_t)t * d;
#pragma unroll
    for (int c = 0; c < M; c++) {
        uv[c] = dev_bf16_if(official, nv[c] * (uv[c] * rr));   /* now xn */
        xr[k + ROW_THREADS * c] = uv[c];
        if (xb) xb[(int64_t)t * ldb + k + ROW_THREADS * c] = dev_f32_to_bf16(uv[c]);
    }
    if (!xq) return;
    rows_amax<M>(uv, amx);
    dev_bar_sync(1, ROW_THREADS);
    rows_pack<M>(uv, amx, xq + (int64_t)t * ldq, xqs + (int64_t)t * lds);
}

template <int M>
static void hc_pre_fast(cu_stream st, int official, const float *mixraw, const float *X, int T, int d, const float *base,
                        const float *scale, float hc_eps, float norm_eps, int iters, float *u, float *mix, const float *norm,
                        float *xn, uint8_t *xq, int ldq, float *xqs, int lds, uint16_t *xb, int ldb) {
    k_hc_pre_fast<M><<<T, HCF_THREADS, 0, (cudaStream_t)st>>>(official, mixraw, X, d, base, scale, hc_eps, norm_eps, iters, u,
                                                               mix, norm, xn, xq, ldq, xqs, lds, xb, ldb);
}

extern "C" void cu_hc_pre_finish(cu_stream st, int official, const float *mixraw, const float *X, int T, int hc, int d,
                                 const float *base, const float *scale, float hc_eps, float norm_eps, int iters, float *u,
                                 float *mix, const float *norm, float *xn, uint8_t *xq, int ldq, float *xqs, int lds,
                                 uint16_t *xb, int ldb) {
    if (T <= 0 || (DIAG_SKIP & 8)) return;
    if (!norm) xn = NULL, xq = NULL, xb = NULL;
    if (DSV4_MHC_FAST && hc == 4 && d % ROW_THREADS == 0) {
        const int M = d / ROW_THREADS;
#define HCF_CASE(V) \
    case V: hc_pre_fast<V>(st, official, mixraw, X, T, d, base, scale, hc_eps, norm_eps, iters, u, mix, norm, xn, xq, ldq, xqs, lds, xb, ldb); return;
        switch (M) {
            HCF_CASE(1) HCF_CASE(2) HCF_CASE(4) HCF_CASE(8) HCF_CASE(16) HCF_CASE(28)
        default: break;
        }
#undef HCF_CASE
    }
    k_hc_pre_finish<<<T, ROW_THREADS, 0, (cudaStream_t)st>>>(official, mixraw, X, hc, d, base, scale, hc_eps, norm_eps, iters, u,
                                                             mix, norm, xn, xq, ldq, xqs, lds, xb, ldb);
}

__global__ void k_hc_post(int official, const float *f, const float *mix, float *X, int T, int hc, int d) {
    dev_grid_wait();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * d) return;
    const int t = (int)(idx / d), e = (int)(idx % d);
    if (DSV4_MHC_FAST && hc == 4)
        hc_post_elem4(official, f[(int64_t)t * d + e], mix + (int64_t)t * CU_MIX, X + (int64_t)t * hc * d, d, e);
    else
        hc_post_elem(official, f[(int64_t)t * d + e], mix + (int64_t)t * CU_MIX, X + (int64_t)t * hc * d, hc, d, e);
}

extern "C" void cu_hc_post(cu_stream st, int official, const float *f, const float *mix, float *X, int T, int hc, int d) {
    if (T > 0 && !(DIAG_SKIP & 8)) k_hc_post<<<cu_blocks((int64_t)T * d, 256), 256, 0, (cudaStream_t)st>>>(official, f, mix, X, T, hc, d);
}

/* The MoE sub-layer's output made where hc_post reads it: f = bf16(the token's expert rows summed in its slot order
 * k = 0, 1, ... from 0.0f, then + shared). With DSV4_MHC_FAST and K <= 8: the K pair indices loaded at once, then
 * every row of a pair before the first -1 (the loop's rows), then the same adds in the same order; the loop below
 * waits a pair index and then its row, one after the other, K times. */
#define POST_MOE_MAXK 8
__global__ void k_hc_post_moe(int official, const float *ey, const float *shared, const int32_t *token_pairs, int K,
                              const float *mix, float *X, int T, int hc, int d) {
    dev_grid_wait();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * d) return;
    const int t = (int)(idx / d), e = (int)(idx % d);
    const int32_t *tp = token_pairs + (int64_t)t * K;
    float acc = 0.0f;
    if (DSV4_MHC_FAST && K <= POST_MOE_MAXK) {
        int32_t pi[POST_MOE_MAXK];
        float row[POST_MOE_MAXK];
#pragma unroll
        for (int k = 0; k < POST_MOE_MAXK; k++) pi[k] = k < K ? tp[k] : -1;
        bool live = true;   /* no -1 yet */
#pragma unroll
        for (int k = 0; k < POST_MOE_MAXK; k++) {
            live = live && pi[k] >= 0;
            pi[k] = live ? pi[k] : -1;
            row[k] = live ? ey[(int64_t)pi[k] * d + e] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < POST_MOE_MAXK; k++)
            if (pi[k] >= 0) acc += row[k];
    } else {
        for (int k = 0; k < K; k++) {
            const int pi = tp[k];
            if (pi < 0) break;
            acc += ey[(int64_t)pi * d + e];
        }
    }
    const float fe = dev_bf16_if(official, acc + shared[idx]);
    if (DSV4_MHC_FAST && hc == 4)
        hc_post_elem4(official, fe, mix + (int64_t)t * CU_MIX, X + (int64_t)t * hc * d, d, e);
    else
        hc_post_elem(official, fe, mix + (int64_t)t * CU_MIX, X + (int64_t)t * hc * d, hc, d, e);
}

extern "C" void cu_hc_post_moe(cu_stream st, int official, const float *ey, const float *shared, const int32_t *token_pairs, int K,
                               const float *mix, float *X, int T, int hc, int d) {
    if (T > 0 && !(DIAG_SKIP & 8))
        k_hc_post_moe<<<cu_blocks((int64_t)T * d, 256), 256, 0, (cudaStream_t)st>>>(official, ey, shared, token_pairs, K, mix, X, T,
                                                                                   hc, d);
}

/* hc_head_one: 1/rms and the hc mix dots (each a block_sum of thread-strided fmaf partials), then the weighted
 * stream sum in stream order. */
__global__ void k_hc_head(int official, const float *X, const int32_t *rows, const float *fn, const float *base,
                          const float *scale, int hc, int d, float hc_eps, float norm_eps, float *y) {
    dev_grid_wait();
    __shared__ float red[32];
    __shared__ float wt[8];
    const int n = hc * d;
    const float *x = X + (int64_t)rows[blockIdx.x] * n;
    const float r = 1.0f / sqrtf(sum_squares(x, n, red) / (float)n + norm_eps);
    for (int i = 0; i < hc; i++) {
        const float *f = fn + (int64_t)i * n;
        float s = 0.0f;
        int k = threadIdx.x;
        const int B = blockDim.x;
        for (; k + 7 * B < n; k += 8 * B) {   /* loads first, then the adds in order (as sum_squares) */
            float a[8], b[8];
#pragma unroll
            for (int u = 0; u < 8; u++) { a[u] = f[k + u * B]; b[u] = x[k + u * B]; }
#pragma unroll
            for (int u = 0; u < 8; u++) s = fmaf(a[u], b[u], s);
        }
        for (; k < n; k += B) s = fmaf(f[k], x[k], s);
        s = block_sum(s, red);
        if (threadIdx.x == 0) wt[i] = dev_sigmoid(s * r * scale[0] + base[i]) + hc_eps;
    }
    __syncthreads();
    float *yr = y + (int64_t)blockIdx.x * d;
#pragma unroll 4
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        float s = 0.0f;
        for (int i = 0; i < hc; i++) s += wt[i] * x[(int64_t)i * d + e];
        yr[e] = dev_bf16_if(official, s);
    }
}

extern "C" void cu_hc_head(cu_stream st, int official, const float *X, const int32_t *rows, int R, const float *fn,
                           const float *base, const float *scale, int hc, int d, float hc_eps, float norm_eps, float *y) {
    if (R > 0) k_hc_head<<<R, ROW_THREADS, 0, (cudaStream_t)st>>>(official, X, rows, fn, base, scale, hc, d, hc_eps, norm_eps, y);
}

__global__ void k_mtp_mix(int official, const float *ep, const float *hp, float *X, int T, int hc, int d) {
    dev_grid_wait();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * hc * d) return;
    const int64_t t = idx / ((int64_t)hc * d);
    const int k = (int)(idx % d);
    X[idx] = dev_bf16_if(official, ep[t * d + k] + hp[idx]);
}

extern "C" void cu_mtp_mix(cu_stream st, int official, const float *ep, const float *hp, float *X, int T, int hc, int d) {
    const int64_t n = (int64_t)T * hc * d;
    if (n > 0) k_mtp_mix<<<cu_blocks(n, 256), 256, 0, (cudaStream_t)st>>>(official, ep, hp, X, T, hc, d);
}

__global__ void k_features(int official, const float *X, int T, int hc, int d, int nt, int k, float *feat) {
    dev_grid_wait();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * d) return;
    const int t = (int)(idx / d), e = (int)(idx % d);
    const float *x = X + (int64_t)t * hc * d;
    float s = 0.0f;
    for (int j = 0; j < hc; j++) s += x[(int64_t)j * d + e];
    feat[((int64_t)t * nt + k) * d + e] = dev_bf16_if(official, s / (float)hc);
}

extern "C" void cu_features(cu_stream st, int official, const float *X, int T, int hc, int d, int nt, int k, float *feat) {
    if (T > 0) k_features<<<cu_blocks((int64_t)T * d, 256), 256, 0, (cudaStream_t)st>>>(official, X, T, hc, d, nt, k, feat);
}

