/* Per-token operations of a block: embedding, RMSNorm, rounding and fake quantization, mHC (pre, post, head),
 * RoPE and the attention's per-token preparation. Reduction orders are stated at each kernel; sums that the
 * CPU computes sequentially are computed sequentially here too wherever they are short (the mHC stream sums,
 * Sinkhorn), and as a fixed block_sum where they are long (norms). */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_kernels.h"
#include "backend/cuda/cu_quant.cuh"
#include "backend/cuda/cu_rope.cuh"
#include "core/sinkhorn.h"

#define ROW_THREADS 256

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

extern "C" void cu_rmsnorm(cu_stream st, int official, const float *x, int ldx, const float *w, int n, float eps, float *y,
                           int ldy, int rows) {
    if (rows > 0) k_rmsnorm<<<rows, ROW_THREADS, 0, (cudaStream_t)st>>>(official, x, ldx, w, n, eps, y, ldy, NULL, 0, NULL, 0);
}

extern "C" void cu_rmsnorm_pack(cu_stream st, int official, const float *x, int ldx, const float *w, int n, float eps, float *y,
                                int ldy, int rows, uint8_t *q, int ldq, float *qs, int lds) {
    if (rows > 0) k_rmsnorm<<<rows, ROW_THREADS, 0, (cudaStream_t)st>>>(official, x, ldx, w, n, eps, y, ldy, q, ldq, qs, lds);
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
                                const float *norm, float *xn, uint8_t *xq, int ldq, float *xqs, int lds) {
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
    for (int e = threadIdx.x; e < d; e += blockDim.x) xr[e] = dev_bf16_if(official, norm[e] * (ut[e] * rr));
    if (xq) block_pack_row(xr, d, xq + (int64_t)t * ldq, xqs + (int64_t)t * lds);
}

extern "C" void cu_hc_pre_finish(cu_stream st, int official, const float *mixraw, const float *X, int T, int hc, int d,
                                 const float *base, const float *scale, float hc_eps, float norm_eps, int iters, float *u,
                                 float *mix, const float *norm, float *xn, uint8_t *xq, int ldq, float *xqs, int lds) {
    if (T > 0)
        k_hc_pre_finish<<<T, ROW_THREADS, 0, (cudaStream_t)st>>>(official, mixraw, X, hc, d, base, scale, hc_eps, norm_eps,
                                                                 iters, u, mix, norm, norm ? xn : NULL, norm ? xq : NULL, ldq, xqs, lds);
}

/* hc_post of one element e of token t, f its sub-layer output: stream k = bf16(post[k] f + sum_j comb[j][k] old_j),
 * j in order. */
__device__ __forceinline__ void hc_post_elem(int official, float fe, const float *mx, float *x, int hc, int d, int e) {
    float old[8];
    for (int j = 0; j < hc; j++) old[j] = x[(int64_t)j * d + e];
    for (int k = 0; k < hc; k++) {
        float s = mx[k] * fe;
        for (int j = 0; j < hc; j++) s += mx[8 + j * hc + k] * old[j];
        x[(int64_t)k * d + e] = dev_bf16_if(official, s);
    }
}

__global__ void k_hc_post(int official, const float *f, const float *mix, float *X, int T, int hc, int d) {
    dev_grid_wait();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * d) return;
    const int t = (int)(idx / d), e = (int)(idx % d);
    hc_post_elem(official, f[(int64_t)t * d + e], mix + (int64_t)t * CU_MIX, X + (int64_t)t * hc * d, hc, d, e);
}

extern "C" void cu_hc_post(cu_stream st, int official, const float *f, const float *mix, float *X, int T, int hc, int d) {
    if (T > 0) k_hc_post<<<cu_blocks((int64_t)T * d, 256), 256, 0, (cudaStream_t)st>>>(official, f, mix, X, T, hc, d);
}

/* The MoE sub-layer's output made where hc_post reads it: f = bf16(the token's expert rows summed in its slot order
 * k = 0, 1, ... from 0.0f, then + shared). */
__global__ void k_hc_post_moe(int official, const float *ey, const float *shared, const int32_t *token_pairs, int K,
                              const float *mix, float *X, int T, int hc, int d) {
    dev_grid_wait();
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (int64_t)T * d) return;
    const int t = (int)(idx / d), e = (int)(idx % d);
    float acc = 0.0f;
    for (int k = 0; k < K; k++) {
        const int pi = token_pairs[(int64_t)t * K + k];
        if (pi < 0) break;
        acc += ey[(int64_t)pi * d + e];
    }
    hc_post_elem(official, dev_bf16_if(official, acc + shared[idx]), mix + (int64_t)t * CU_MIX, X + (int64_t)t * hc * d, hc, d, e);
}

extern "C" void cu_hc_post_moe(cu_stream st, int official, const float *ey, const float *shared, const int32_t *token_pairs, int K,
                               const float *mix, float *X, int T, int hc, int d) {
    if (T > 0)
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

