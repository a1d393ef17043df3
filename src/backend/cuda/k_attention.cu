/* Attention on the device (core/attention.c, core/compressor.c): KV row formats, the compressor state
 * machine's emissions, sink attention, and the ring writes that end a layer (the indexer: k_indexer.cu).
 *
 * State access mirrors the CPU step exactly: a key or a compressor slot at position s of item i comes from the
 * step's own buffers when s >= p0(i) (the item's first position in this step), else from the sequence's ring;
 * rings are written only after every reader of the layer ran. So a query sees the same rows whether its
 * sequence was fed one token per step or all at once. */
#include "backend/cuda/cu_common.cuh"
#include "backend/cuda/cu_kernels.h"
#include "backend/cuda/cu_quant.cuh"
#include "backend/cuda/cu_kvrow.cuh"
#include "backend/cuda/cu_rope.cuh"
#include "dsv4.h"

/* -DATT_BLOCK_TIMES=1 (a measuring build, never a real one): each warp of the decode attention kernels records its
 * start (after dev_grid_wait), a few marks on the way and its end, in %globaltimer ns, with its block and SM, into
 * att_times (read by cu_att_block_times; test_gpu_attention --times). Whether a kernel's time is its blocks' work or
 * the gaps around them, and which step of the work (run 77: ncu counted k_att_scores_dec's SMs busy ~6 of its 27 us).
 * No shared memory: the decode kernels opt into all of it. */
#ifndef ATT_BLOCK_TIMES
#define ATT_BLOCK_TIMES 0
#endif
#if ATT_BLOCK_TIMES
#define ATT_TIMES_MAX (1 << 18)
static int att_times_twice;   /* cu_att_block_times_twice: k_att_scores_dec launched twice, back to back */
__device__ cu_att_time att_times[ATT_TIMES_MAX];
__device__ unsigned att_times_n;
__device__ __forceinline__ unsigned long long att_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* every lane of the warp calls it; returns the warp's record (ATT_TIMES_MAX: none) */
__device__ unsigned att_time_begin(unsigned kernel) {
    unsigned rec = 0;
    if ((threadIdx.x & 31) == 0) {
        const unsigned long long t = att_now();
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        rec = atomicAdd(&att_times_n, 1u);
        if (rec < ATT_TIMES_MAX) {
            cu_att_time r = {};
            r.start = t;
            r.clk_start = clock64();
            r.kernel = kernel;
            r.sm = sm;
            r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
            r.warp = threadIdx.x >> 5;
            att_times[rec] = r;
        }
    }
    rec = __shfl_sync(0xffffffffu, rec, 0);
    return rec < ATT_TIMES_MAX ? rec : ATT_TIMES_MAX;
}
__device__ __forceinline__ void att_time_mark(unsigned rec, int i) {
    if ((threadIdx.x & 31) == 0 && rec < ATT_TIMES_MAX) att_times[rec].mark[i] = att_now();
}
__device__ __forceinline__ void att_time_end(unsigned rec) {
    if ((threadIdx.x & 31) == 0 && rec < ATT_TIMES_MAX) {
        att_times[rec].clk_end = clock64();
        att_times[rec].end = att_now();
    }
}
extern "C" int cu_att_block_times(cu_att_time *out, int max) {
    unsigned n = 0;
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpyFromSymbol(&n, att_times_n, sizeof n) != cudaSuccess) return -1;
    if (n > ATT_TIMES_MAX) n = ATT_TIMES_MAX;
    if ((int)n > max) n = (unsigned)max;
    if (n && cudaMemcpyFromSymbol(out, att_times, sizeof(cu_att_time) * n) != cudaSuccess) return -1;
    const unsigned zero = 0;
    return cudaMemcpyToSymbol(att_times_n, &zero, sizeof zero) == cudaSuccess ? (int)n : -1;
}
#define ATT_TIME_BEGIN(k) const unsigned att_rec = att_time_begin(k)
#define ATT_TIME_MARK(i) att_time_mark(att_rec, i)
#define ATT_TIME_END() att_time_end(att_rec)
#else
#define ATT_TIMES_MAX 0u
#define ATT_TIME_BEGIN(k) const unsigned att_rec = ATT_TIMES_MAX; (void)att_rec
#define ATT_TIME_MARK(i) (void)0
#define ATT_TIME_END() (void)0
extern "C" int cu_att_block_times(cu_att_time *out, int max) { (void)out; (void)max; return -1; }
#endif

__device__ __forceinline__ void put_bf16_bytes(uint8_t *dst, float x) {
    const uint16_t h = dev_f32_to_bf16(x);
    dst[0] = (uint8_t)h;
    dst[1] = (uint8_t)(h >> 8);
}

/* kv_encode (state/kvrows.c) by a block of whole warps, every thread calling: the bytes kvrows.c writes. An FP8 / FP4
 * row's scale blocks (64 / 32 columns) go one to a warp (warps w, w + W, ...): lane i holds columns i (and i + 32),
 * the block's amax is a max over the warp (exact in any order; fmaxf passes over a NaN as kvrows.c's loop does),
 * every value is converted on its own (run 46: the same bytes as the loop of one thread a scale block before it,
 * whose 64 dependent loads a thread took 23 us a layer at decode against 7 for f32 rows). */
__device__ void block_kv_encode(const cu_kvlay &l, const float *x, uint8_t *dst) {
    const int n = l.width;
    if (l.fmt == KV_F32) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) ((float *)dst)[i] = x[i];
    } else if (l.fmt == KV_BF16) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) ((uint16_t *)dst)[i] = dev_f32_to_bf16(x[i]);
    } else if (l.kind == ROW_INDEX) {
        uint8_t *scales = dst + (n + 1) / 2;
        const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
        for (int b = threadIdx.x >> 5; b * 32 < n; b += nw) {   /* warp-uniform */
            const int b0 = b * 32, len = n - b0 < 32 ? n - b0 : 32;
            const float v = lane < len ? x[b0 + lane] : 0.0f;
            float amax = fmaxf(6.0f * ldexpf(1.0f, -126), fabsf(v));
            for (int off = 16; off; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
            const uint8_t sb = dev_e8m0_of(dev_pow2_ceil(amax / 6.0f));
            const float s = dev_e8m0(sb);
            const uint32_t code = dev_f32_to_e2m1(fminf(fmaxf(v / s, -6.0f), 6.0f));
            const uint32_t next = __shfl_down_sync(0xffffffffu, code, 1);   /* column b0 + lane + 1's code */
            if (lane < len && !(lane & 1)) dst[(b0 + lane) / 2] = (uint8_t)(code | (lane + 1 < len ? next << 4 : 0u));
            if (lane == 0) scales[b] = sb;
        }
    } else {
        const int N = l.nope;
        uint8_t *scales = dst + N, *rope = scales + (N + 63) / 64;
        const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
        for (int b = threadIdx.x >> 5; b * 64 < N; b += nw) {   /* warp-uniform */
            const int b0 = b * 64, len = N - b0 < 64 ? N - b0 : 64;
            const float v0 = lane < len ? x[b0 + lane] : 0.0f, v1 = lane + 32 < len ? x[b0 + lane + 32] : 0.0f;
            float amax = fmaxf(fmaxf(1e-4f, fabsf(v0)), fabsf(v1));
            for (int off = 16; off; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
            const uint8_t sb = dev_e8m0_of(dev_pow2_ceil(amax * (1.0f / 448.0f)));
            const float s = dev_e8m0(sb);
            if (lane < len) dst[b0 + lane] = dev_f32_to_e4m3(fminf(fmaxf(v0 / s, -448.0f), 448.0f));
            if (lane + 32 < len) dst[b0 + lane + 32] = dev_f32_to_e4m3(fminf(fmaxf(v1 / s, -448.0f), 448.0f));
            if (lane == 0) scales[b] = sb;
        }
        for (int i = threadIdx.x; i < l.rope; i += blockDim.x) put_bf16_bytes(rope + 2 * i, x[N + i]);
    }
}

__global__ void k_kv_encode(cu_kvlay lay, const float *x, int ldx, uint8_t *dst) {
    dev_grid_wait();
    block_kv_encode(lay, x + (int64_t)blockIdx.x * ldx, dst + (int64_t)blockIdx.x * lay.bytes);
}

extern "C" void cu_kv_encode(cu_stream st, cu_kvlay lay, const float *x, int ldx, uint8_t *dst, int rows) {
    if (rows > 0) k_kv_encode<<<rows, 64, 0, (cudaStream_t)st>>>(lay, x, ldx, dst);
}

/* ---- attention preparation ---------------------------------------------------------------------------------------- */

/* norm.c unit_rmsnorm on x[0..n) (global memory, this block only). */
__device__ void block_unit_rmsnorm(int official, float *x, int n, float eps, float *red) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += official ? dev_round_bf16(x[i] * x[i]) : x[i] * x[i];
    s = block_sum(s, red);
    if (!official) {
        const float r = 1.0f / sqrtf(s / (float)n + eps);
        for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] *= r;
    } else {
        const float ms = dev_round_bf16(s / (float)n);
        const float r = dev_round_bf16(1.0f / sqrtf(dev_round_bf16(ms + eps)));
        for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = dev_round_bf16(x[i] * r);
    }
    __syncthreads();
}

/* One launch of CU_PREP_THREADS-thread blocks (t, y) for what each token needs before the attention (cu_kernels.h
 * cu_attn_prepare): y < H head y of q; y = H the kv row, then its encodings; y = H + 1 the compressors' ape and the
 * indexer's head weights; y >= H + 2 indexer query y - H - 2. Each block's work is what its own launch did before
 * (k_qkv_prepare, k_kv_encode(_ring), k_prepare_tokens: the same per-element code and block size, so the same
 * bits); they read disjoint inputs and write disjoint outputs, so one launch holds them all. */
#define CU_PREP_THREADS 128
__global__ void __launch_bounds__(CU_PREP_THREADS) k_attn_prepare(cu_prep a) {
    dev_grid_wait();
    __shared__ float red[32];
    const int t = blockIdx.x, y = blockIdx.y;
    const int64_t p = a.pos[t];
    if (y < a.H) {   /* prepare_qkv: the head's unit RMSNorm, then RoPE */
        float *qh = a.q + ((int64_t)t * a.H + y) * a.D;
        block_unit_rmsnorm(a.official, qh, a.D, a.eps, red);
        block_rope(a.official, a.freq, a.R, qh + a.D - a.R, p, 0);
    } else if (y == a.H) {   /* the kv row: RMSNorm(kv_norm), RoPE, OFFICIAL FP8 of the non-rope dims per 64 */
        float *x = a.kv + (int64_t)t * a.D;
        const float r = 1.0f / sqrtf(sum_squares(x, a.D, red) / (float)a.D + a.eps);
        for (int i = threadIdx.x; i < a.D; i += blockDim.x) x[i] = dev_bf16_if(a.official, a.kv_norm[i] * (x[i] * r));
        __syncthreads();
        block_rope(a.official, a.freq, a.R, x + a.D - a.R, p, 0);
        __syncthreads();
        if (a.official) block_quant_row(x, a.D - a.R, 64, 0);   /* ends with a barrier */
        if (a.kvs) block_kv_encode(a.lay, x, a.kvs + (int64_t)t * a.lay.bytes);
        if (a.kvs && a.ring) block_kv_encode(a.lay, x, a.sl[a.item_of[t]].ring + (p % a.ring_len) * a.lay.bytes);
    } else if (y == a.H + 1) {   /* prepare_tokens: the compressors' ape at p % ratio, the indexer's head weights */
        const float *ape = a.ape + (p % a.ratio) * a.cw;
        float *z = a.cz + (int64_t)t * a.cw;
        for (int j = threadIdx.x; j < a.cw; j += blockDim.x) z[j] += ape[j];
        if (a.ratio != 4) return;
        const int iw = 2 * a.cI;
        const float *ia = a.iape + (p % 4) * iw;
        float *iz = a.icz + (int64_t)t * iw;
        for (int j = threadIdx.x; j < iw; j += blockDim.x) iz[j] += ia[j];
        const float scale = 1.0f / sqrtf((float)a.cI) / sqrtf((float)a.nI);
        float *w = a.wi + (int64_t)t * a.nI;
        for (int k = threadIdx.x; k < a.nI; k += blockDim.x) w[k] = dev_bf16_if(a.official, w[k] * scale);
    } else {   /* indexer query h: RoPE, then OFFICIAL Hadamard, bf16 and the FP4 simulation per 32 */
        float *qh = a.qi + ((int64_t)t * a.nI + (y - a.H - 2)) * a.cI;
        block_rope(a.official, a.freq, a.R, qh + a.cI - a.R, p, 0);
        __syncthreads();
        if (!a.official) return;
        block_hadamard(qh, a.cI);
        for (int i = threadIdx.x; i < a.cI; i += blockDim.x) qh[i] = dev_round_bf16(qh[i]);
        __syncthreads();
        block_quant_row(qh, a.cI, 32, 1);
    }
}

extern "C" void cu_attn_prepare(cu_stream st, const cu_prep *a) {
    if (a->T <= 0 || (DIAG_SKIP & 32)) return;
    const int ny = a->H + 1 + (a->ratio ? 1 + (a->ratio == 4 ? a->nI : 0) : 0);
    k_attn_prepare<<<dim3(a->T, ny), CU_PREP_THREADS, 0, (cudaStream_t)st>>>(*a);
}

/* ---- the compressor state machine ------------------------------------------------------------------------------- */

/* The ring write of token t for one compressor (k_comp_ring_write's block, or k_compress's at one token per item). */
__device__ void comp_ring_write_row(const cu_comp_job &job, int t, int64_t p, const cu_item &it, const cu_seq_layer &L) {
    const int hist = job.is_indexer ? L.ihist : L.chist, cols = job.cols;
    if (p < it.p0 + it.n - hist) return;   /* a later position of the step owns this slot */
    float *kv = (job.is_indexer ? L.ikv : L.ckv) + (p % hist) * cols, *sc = (job.is_indexer ? L.iscore : L.cscore) + (p % hist) * cols;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) {
        kv[j] = job.K[(int64_t)t * cols + j];
        sc[j] = job.Z[(int64_t)t * cols + j];
    }
}

/* Block (t, j): compressor jobs[j] for token t (the main and the indexer's compressor in one launch). With
 * ring_now (a step of one token per item) the block then writes the token's ring slot itself: slot p % hist holds
 * position p - hist, which no chunk ending at p reads (a chunk reads from p + 1 - 2 ratio on, and hist >= 2 ratio
 * with overlap, >= ratio without: compressor.c), and no other token of the step shares the item's ring. */
__global__ void k_compress(int official, cu_comp_jobs jobs, const int64_t *pos, const int32_t *item_of, const cu_item *items,
                           const cu_seq_layer *sl, const float *freq, int R, float eps, int ring_now) {
    dev_grid_wait();
    extern __shared__ float row[];
    __shared__ float red[32];
    const int t = blockIdx.x;
    const cu_comp_job job = jobs.job[blockIdx.y];
    const cu_kvlay lay = job.lay;
    const int is_indexer = job.is_indexer, ratio = job.ratio;
    const float *K = job.K, *Z = job.Z, *norm = job.norm;
    const int64_t p = pos[t];
    if ((p + 1) % ratio) {
        if (ring_now) comp_ring_write_row(job, t, p, items[item_of[t]], sl[item_of[t]]);
        return;
    }
    const cu_item it = items[item_of[t]];
    const cu_seq_layer L = sl[item_of[t]];
    const int width = lay.width, overlap = ratio == 4, cols = (overlap ? 2 : 1) * width, off = overlap ? width : 0;
    const float *rkv = is_indexer ? L.ikv : L.ckv, *rsc = is_indexer ? L.iscore : L.cscore;
    const int hist = is_indexer ? L.ihist : L.chist;
    const int64_t c0 = p + 1 - ratio, a0 = overlap && c0 >= ratio ? c0 - ratio : c0;
#define SLOT_KV(s) ((s) >= it.p0 ? K + (int64_t)(it.first + ((s) - it.p0)) * cols : rkv + ((s) % hist) * cols)
#define SLOT_SC(s) ((s) >= it.p0 ? Z + (int64_t)(it.first + ((s) - it.p0)) * cols : rsc + ((s) % hist) * cols)
    /* compressor.c pool_column: slots in order (A half of the previous chunk, then the chunk's own) */
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        float mx = -INFINITY;
        for (int64_t s = a0; s < c0; s++) mx = fmaxf(mx, SLOT_SC(s)[j]);
        for (int64_t s = c0; s < c0 + ratio; s++) mx = fmaxf(mx, SLOT_SC(s)[off + j]);
        float den = 0.0f, num = 0.0f;
        for (int64_t s = a0; s < c0; s++) {
            const float e = expf(SLOT_SC(s)[j] - mx);
            den += e;
            num += e * SLOT_KV(s)[j];
        }
        for (int64_t s = c0; s < c0 + ratio; s++) {
            const float e = expf(SLOT_SC(s)[off + j] - mx);
            den += e;
            num += e * SLOT_KV(s)[off + j];
        }
        row[j] = dev_bf16_if(official, num / den);
    }
#undef SLOT_KV
#undef SLOT_SC
    __syncthreads();
    /* compressor_finish_row: RMSNorm, RoPE at the chunk start, the QAT simulation */
    float ss = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) ss = fmaf(row[i], row[i], ss);
    const float r = 1.0f / sqrtf(block_sum(ss, red) / (float)width + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) row[i] = dev_bf16_if(official, norm[i] * (row[i] * r));
    __syncthreads();
    block_rope(official, freq, R, row + width - R, c0, 0);
    if (official) {
        if (is_indexer) {
            block_hadamard(row, width);
            for (int i = threadIdx.x; i < width; i += blockDim.x) row[i] = dev_round_bf16(row[i]);
            __syncthreads();
            block_quant_row(row, width, 32, 1);
        } else {
            block_quant_row(row, width - R, 64, 0);
        }
    }
    uint8_t *rows = is_indexer ? L.irows : L.crows;
    block_kv_encode(lay, row, rows + (p / ratio) * (int64_t)lay.bytes);   /* reads row: after the barriers above */
    if (ring_now) comp_ring_write_row(job, t, p, it, L);   /* every read of the ring was before those barriers */
}

extern "C" void cu_compress(cu_stream st, int official, const cu_comp_jobs *jobs, const int64_t *pos, const int32_t *item_of,
                            const cu_item *items, const cu_seq_layer *sl, const float *freq, int R, float eps, int T, int ring_now) {
    if (T <= 0 || jobs->n <= 0 || (DIAG_SKIP & 16)) return;
    int width = 0;
    for (int j = 0; j < jobs->n; j++) width = jobs->job[j].lay.width > width ? jobs->job[j].lay.width : width;
    k_compress<<<dim3(T, jobs->n), 128, sizeof(float) * width, (cudaStream_t)st>>>(official, *jobs, pos, item_of, items, sl, freq, R,
                                                                                 eps, ring_now);
}

__global__ void k_comp_ring_write(cu_comp_jobs jobs, const int64_t *pos, const int32_t *item_of, const cu_item *items,
                                  const cu_seq_layer *sl) {
    dev_grid_wait();
    const int t = blockIdx.x;
    comp_ring_write_row(jobs.job[blockIdx.y], t, pos[t], items[item_of[t]], sl[item_of[t]]);
}

extern "C" void cu_comp_ring_write(cu_stream st, const cu_comp_jobs *jobs, const int64_t *pos, const int32_t *item_of, const cu_item *items,
                                   const cu_seq_layer *sl, int T) {
    if (T > 0 && jobs->n > 0 && !(DIAG_SKIP & 16)) k_comp_ring_write<<<dim3(T, jobs->n), 128, 0, (cudaStream_t)st>>>(*jobs, pos, item_of, items, sl);
}


/* ---- sink attention ------------------------------------------------------------------------------------------------------ */

#define ATT_THREADS 128

/* ATT_CHUNKED 1: cu_attention splits each query's keys into fixed chunks over the whole GPU (below, "sink attention
 * in chunks"); 0: the one-block-per-(query, head) kernel that came before it. Both give the CPU's results within
 * float rounding, each with its own fixed order. */
#ifndef ATT_CHUNKED
#define ATT_CHUNKED 1
#endif

/* The sink attention of query q (head h, position p) over nk keys whose addresses are keys[0..nk) (shared
 * memory, filled by the caller, followed by a barrier); sc: shared scratch of nk floats. Writes out [D],
 * de-rotated at p. Called by a whole block. */
__device__ void attend_keys(int official, const cu_kvlay &lay, const float *qh, const uint8_t *const *keys, int nk, float *sc,
                            float sink, const float *freq, int D, int R, int64_t p, float *out) {
    __shared__ float red[32];
    __shared__ float den_s;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const float scale = 1.0f / sqrtf((float)D);
    for (int i = warp; i < nk; i += nw) {
        const uint8_t *kp = keys[i];
        float acc = 0.0f;
        for (int j = lane * 4; j < D; j += 128)
            for (int e = 0; e < 4 && j + e < D; e++) acc = fmaf(qh[j + e], kv_elem(lay, kp, j + e), acc);
        acc = warp_sum(acc);
        if (lane == 0) sc[i] = acc * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < nk; i += blockDim.x) mx = fmaxf(mx, sc[i]);
    mx = block_max(mx, red);
    for (int i = threadIdx.x; i < nk; i += blockDim.x) sc[i] = expf(sc[i] - mx);
    __syncthreads();
    if (threadIdx.x == 0) {
        /* the sink joins the denominator only; the keys in key order */
        float den = expf(sink - mx);
        for (int i = 0; i < nk; i++) den += sc[i];
        den_s = den;
    }
    __syncthreads();
    const float inv = 1.0f / den_s;
    /* P.V: column j sums over the keys in four interleaved accumulators (key i into i mod 4, each in key order),
     * combined as (a0 + a1) + (a2 + a3): independent loads in flight, an order fixed by the key count alone */
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        float a[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
        int i = 0;
        for (; i + 4 <= nk; i += 4)
#pragma unroll
            for (int u = 0; u < 4; u++) a[u] = fmaf(dev_bf16_if(official, sc[i + u]), kv_elem(lay, keys[i + u], j), a[u]);
#pragma unroll
        for (int u = 0; u < 3; u++)
            if (i + u < nk) a[u] = fmaf(dev_bf16_if(official, sc[i + u]), kv_elem(lay, keys[i + u], j), a[u]);
        out[j] = dev_bf16_if(official, ((a[0] + a[1]) + (a[2] + a[3])) * inv);
    }
    __syncthreads();
    block_rope(official, freq, R, out + D - R, p, 1);
}

#if !ATT_CHUNKED
/* The kernel before issue 18 (kept for one A/B): one block of ATT_THREADS per (query, head), every key in shared
 * memory. */
__global__ void k_attention(int official, cu_kvlay lay, const float *q, const uint8_t *kvs, const int64_t *pos,
                            const int32_t *item_of, const cu_item *items, const cu_seq_layer *sl, int ring_len, int W,
                            int ratio, const int32_t *sel, const int32_t *n_sel, int topk, const float *sink,
                            const float *freq, int H, int D, int R, int max_keys, float *o) {
    dev_grid_wait();
    extern __shared__ __align__(16) unsigned char att_smem[];
    const uint8_t **keys = (const uint8_t **)att_smem;          /* [max_keys] */
    float *sc = (float *)(att_smem + sizeof(void *) * max_keys); /* [max_keys] */
    const int t = blockIdx.x, h = blockIdx.y;
    const int64_t p = pos[t];
    const cu_item it = items[item_of[t]];
    const cu_seq_layer L = sl[item_of[t]];
    const int64_t w0 = p - W + 1 < 0 ? 0 : p - W + 1;
    const int nwin = (int)(p - w0 + 1);
    const int nc = ratio == 128 ? (int)((p + 1) / 128) : ratio == 4 ? n_sel[t] : 0;
    const int nk = nwin + nc;
    /* the key set: window positions (chronological), then compressed rows (row order) */
    for (int i = threadIdx.x; i < nk; i += blockDim.x) {
        if (i < nwin) {
            const int64_t s = w0 + i;
            keys[i] = s >= it.p0 ? kvs + (int64_t)(it.first + (s - it.p0)) * lay.bytes : L.ring + (s % ring_len) * lay.bytes;
        } else {
            const int k = i - nwin;
            const int64_t row = ratio == 128 ? k : sel[(int64_t)t * topk + k];
            keys[i] = L.crows + row * lay.bytes;
        }
    }
    __syncthreads();
    attend_keys(official, lay, q + ((int64_t)t * H + h) * D, keys, nk, sc, sink[h], freq, D, R, p,
                o + ((int64_t)t * H + h) * D);
}

#endif

/* DSpark's block attention (core/dspark.c block_attention): element j of the block (position p0 + j) sees the
 * context keys of positions max(0, p0-W) .. p0-1 from the stage's ring (fp32 rows, slot = position mod W), then
 * all gamma keys of the block (fp32 rows of kv), whatever its own position. */
__global__ void k_dspark_attention(int official, const float *q, const float *kv, const float *ring, int64_t p0, int gamma,
                                   int W, const float *sink, const float *freq, int H, int D, int R, float *o) {
    dev_grid_wait();
    extern __shared__ __align__(16) unsigned char att_smem[];
    const int max_keys = W + gamma;
    const uint8_t **keys = (const uint8_t **)att_smem;
    float *sc = (float *)(att_smem + sizeof(void *) * max_keys);
    const int j = blockIdx.x, h = blockIdx.y;
    const int64_t P = p0 - 1, w0 = P - W + 1 < 0 ? 0 : P - W + 1;
    const int nwin = (int)(P - w0 + 1), nk = nwin + gamma;
    for (int i = threadIdx.x; i < nk; i += blockDim.x)
        keys[i] = i < nwin ? (const uint8_t *)(ring + ((w0 + i) % W) * D) : (const uint8_t *)(kv + (int64_t)(i - nwin) * D);
    __syncthreads();
    const cu_kvlay f32 = { DSV4_KV_F32, 0, D, 0, D, 4 * D };
    attend_keys(official, f32, q + ((int64_t)j * H + h) * D, keys, nk, sc, sink[h], freq, D, R, p0 + j, o + ((int64_t)j * H + h) * D);
}

extern "C" void cu_dspark_attention(cu_stream st, int official, const float *q, const float *kv, const float *ring, int64_t p0,
                                    int gamma, int W, const float *sink, const float *freq, int H, int D, int R, float *o) {
    const size_t smem = (sizeof(void *) + sizeof(float)) * (size_t)(W + gamma);
    if (smem > 48 * 1024) cudaFuncSetAttribute(k_dspark_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    k_dspark_attention<<<dim3(gamma, H), ATT_THREADS, smem, (cudaStream_t)st>>>(official, q, kv, ring, p0, gamma, W, sink, freq, H,
                                                                               D, R, o);
}

/* Rows [n][D] of kv into ring slots (p0 + t) mod W (the last W of them: later positions own their slots). */
__global__ void k_dspark_ring_write(const float *kv, int n, int D, float *ring, int64_t p0, int W) {
    dev_grid_wait();
    const int t = blockIdx.x;
    if (t < n - W) return;
    float *dst = ring + ((p0 + t) % W) * D;
    for (int i = threadIdx.x; i < D; i += blockDim.x) dst[i] = kv[(int64_t)t * D + i];
}

extern "C" void cu_dspark_ring_write(cu_stream st, const float *kv, int n, int D, float *ring, int64_t p0, int W) {
    if (n > 0) k_dspark_ring_write<<<n, 128, 0, (cudaStream_t)st>>>(kv, n, D, ring, p0, W);
}

#if ATT_CHUNKED
/* ---- sink attention in chunks (issue 18) ----------------------------------------------------------------------------
 *
 * V4 has one KV head: every query head of a token reads the same stored rows. So the work of one query (token) is
 * cut by keys, not by heads: its key list (window positions in order, then the compressed rows in order: index
 * i = 0 .. nk-1) is split into chunks of ATT_KC consecutive indices, chunk c = keys [ATT_KC c, ATT_KC (c + 1)), and
 * each block takes one chunk of one query for a group of heads at once (ATT_SHG heads in k_att_scores, ATT_PHG in
 * k_att_pv, ATT_HG in the tensor-core kernels), so a row is read once per query and head group, decoded to fp32 in
 * shared memory. Three launches per group of queries:
 *   k_att_scores   block (chunk, head group, query): score s[h][i] = dot(q_h, k_i) * (1/sqrt(D)), the dot by one
 *                  thread with fmaf from 0.0f over columns j = 0, 1, ..., D-1 in order; the chunk's max per head.
 *   k_att_pv       block (chunk, head group x column slice, query): M_h = max of every chunk's max (a max: exact in
 *                  any order); e = expf(s - M_h); the chunk's denominator part den_c = e_0 + e_1 + ... (from 0.0f,
 *                  the chunk's keys in order, one thread); its output part out_c[h][j] = fmaf over the chunk's keys
 *                  in order from 0.0f of bf16_if(e) * v[j] (one thread per (h, j)).
 *   k_att_combine  block (head, query): den = expf(sink - M_h) + den_0 + den_1 + ... (chunks in order), out[j] =
 *                  bf16_if((out_0[j] + out_1[j] + ...) * (1 / den)) (chunks in order, from 0.0f), de-rotated at p.
 * Every number above depends only on the query's key set (its position and selection): the chunk boundaries are
 * fixed key indices, the maximum is exact, and each sum has one order, kept by one thread, without atomics. How
 * many queries share a launch (the scratch, cu_attention_scratch_floats) only decides who computes what, and so do
 * the head groups: a head's scores and outputs are its own chains whichever heads share its block, so the group
 * sizes (fixed at compile time, never by the launch) only set how many blocks a query's chunk gives — at decode,
 * one query of a few chunks, that is how many SMs work (all 64 heads in one block: 2 blocks for a 128-key window).
 * The semantics are core/attention.c sink_attention_kv's: one max over all keys before any exponent (so the bf16
 * rounding of OFFICIAL mode sees the CPU's probabilities, not rescaled ones), the sink in the denominator only. */
#define ATT_KC 64      /* keys a chunk */
#define ATT_HG 64      /* heads a block of the tensor-core kernels; the most of any */
#define ATT_DS 64      /* columns a block of k_att_pv (a shared-memory slice of the chunk's rows) */
/* Heads a block of k_att_scores and of k_att_pv (multiples of 16 up to ATT_HG; 4 threads a head, 4 x 4 tiles) and
 * the columns of k_att_scores's shared slices. Scores: a small launch (a few queries: decode, verify, streams) takes
 * 16 heads a block, so a decode query's chunk spreads over 4 blocks (64 heads), each of 2 warps doing the same
 * per-thread work as a 256-thread block; a large one (ATT_SCORES_MANY blocks of 16 heads or more: prefill) takes
 * ATT_SHG_BIG = 64, so a chunk's rows are loaded and decoded once for all heads instead of four times (run 107: an
 * 8K prefill's attention 927 -> 833 ms, 2,215 -> 2,278 tok/s). Who computes what only: a head's scores are its own
 * chains in any block. 32-column slices keep the shared memory small (11.5 KB at 16 heads) so that either holds 24
 * warps an SM (the registers bound both; 64-column slices were slower, run 107). P.V keeps 64 heads: it already has
 * D / 64 column slices a chunk. -DATT_SHG=64 makes the small launches take 64 as well (an A/B; the same bits,
 * tools/gpu/shim/shim_attention_ab.sh). */
#ifndef ATT_SHG
#define ATT_SHG 16
#endif
#define ATT_SHG_BIG 64
#ifndef ATT_SCORES_MANY
#define ATT_SCORES_MANY 4096
#endif
#ifndef ATT_SDS
#define ATT_SDS 32
#endif
#ifndef ATT_PHG
#define ATT_PHG 64
#endif
#ifndef ATT_SPH
#define ATT_SPH 16      /* rows a thread of k_att_scores has in flight at once (512 / ATT_SPH round trips at D 512) */
#endif
#ifndef ATT_PV_NS
#define ATT_PV_NS 4          /* column slices a block of k_att_pv in a large launch */
#endif
#ifndef ATT_PV_MANY
#define ATT_PV_MANY 4096     /* blocks of a launch at one slice each from which it is large (1: every launch; the shim) */
#endif
#define ATT_COMBINE_T 128
#define ATT_UNROLL 8    /* chunks whose loads k_att_combine issues at once */
#define ATT_GROUP_MAX 4096                       /* queries a launch (grid z) */
#define ATT_BUDGET_FLOATS ((int64_t)64 << 20)   /* 256 MiB: the scratch a step takes before it splits its queries */
#define ATT_QUERY_MAX_FLOATS ((int64_t)1 << 29) /* 2 GiB: one query's scratch, the key limit */

/* One query's scratch, for launches whose longest key list has nch chunks (floats):
 *   S [nch][H][ATT_KC] scores | cmax [nch][H] | pden [nch][H] | part [nch][H][D] | M [H] */
static __host__ __device__ __forceinline__ int64_t att_query_floats(int64_t nch, int H, int D) {
    return nch * H * (ATT_KC + 2 + (int64_t)D) + H;
}

struct att_scratch {
    float *S, *cmax, *pden, *part, *M;
};

__device__ __forceinline__ att_scratch att_scratch_of(float *base, int slot, int nch, int H, int D) {
    att_scratch x;
    x.S = base + (int64_t)slot * att_query_floats(nch, H, D);
    x.cmax = x.S + (int64_t)nch * H * ATT_KC;
    x.pden = x.cmax + (int64_t)nch * H;
    x.part = x.pden + (int64_t)nch * H;
    x.M = x.part + (int64_t)nch * H * D;
    return x;
}

/* The key list of query t at position p: nwin window positions from w0, then the compressed rows. */
struct att_keys {
    int64_t w0;
    int nwin, nk;
};

__device__ __forceinline__ att_keys att_keys_of(int64_t p, int t, int W, int ratio, const int32_t *n_sel) {
    att_keys k;
    k.w0 = p - W + 1 < 0 ? 0 : p - W + 1;
    k.nwin = (int)(p - k.w0 + 1);
    k.nk = k.nwin + (ratio == 128 ? (int)((p + 1) / 128) : ratio == 4 ? n_sel[t] : 0);
    return k;
}

/* The stored row of key i (window: the step's own rows for positions >= p0, else the ring; then the rows). */
__device__ __forceinline__ const uint8_t *att_key_row(const cu_kvlay &lay, const att_keys &k, int i, const cu_item &it,
                                                      const cu_seq_layer &L, const uint8_t *kvs, int ring_len, int ratio,
                                                      const int32_t *sel_t) {
    if (i < k.nwin) {
        const int64_t s = k.w0 + i;
        return s >= it.p0 ? kvs + (int64_t)(it.first + (s - it.p0)) * lay.bytes : L.ring + (s % ring_len) * lay.bytes;
    }
    const int64_t row = ratio == 128 ? (int64_t)(i - k.nwin) : (int64_t)sel_t[i - k.nwin];
    return L.crows + row * lay.bytes;
}

/* The arguments every chunk kernel needs to find a query's keys. */
struct att_args {
    cu_kvlay lay;
    const uint8_t *kvs;
    const int64_t *pos;
    const int32_t *item_of;
    const cu_item *items;
    const cu_seq_layer *sl;
    const int32_t *sel, *n_sel;
    int ring_len, W, ratio, topk;
};

/* Rows r < nkc, columns [j0, j0 + DS) of the chunk's stored rows kp[] into dst[r][0 .. DS) as fp32 (zeros past nkc and
 * past D), by NT threads: thread x takes column x mod DS of rows x / DS + (NT / DS) u, in phases of up to MAXPH rows
 * whose loads are all issued before the first is decoded (one round trip to memory a phase, not one an element; the
 * phase bounds the registers that hold the loads). */
template <int F, int NT, int DS, int LD, int MAXPH>
__device__ __forceinline__ void att_load_rows(const cu_kvlay &lay, const uint8_t *const *kp, int nkc, int j0, int D, float (*dst)[LD]) {
    constexpr int PER = ATT_KC * DS / NT, PH = PER < MAXPH ? PER : MAXPH;
    static_assert(NT % DS == 0 && PER % PH == 0 && DS <= LD, "att_load_rows: a thread's column is fixed");
    const int jj = threadIdx.x % DS, j = j0 + jj, r0 = threadIdx.x / DS;
    const bool jv = j < D;
    const kv_col<F> col(lay, jv ? j : 0);
#pragma unroll
    for (int u0 = 0; u0 < PER; u0 += PH) {
        uint32_t b[PH];
#pragma unroll
        for (int u = 0; u < PH; u++) {
            const int r = r0 + (NT / DS) * (u0 + u);
            b[u] = jv && r < nkc ? col.bits(kp[r]) : 0u;
        }
#pragma unroll
        for (int u = 0; u < PH; u++) {
            const int r = r0 + (NT / DS) * (u0 + u);
            dst[r][jj] = jv && r < nkc ? col.value(b[u]) : 0.0f;
        }
    }
}

/* Asks L2 for the whole of each of the chunk's nkc stored rows (every 128-byte line a row touches; only addresses inside the row), so that the slices
 * that follow, each a few bytes of every row, wait for L2 rather than for memory (at decode the rows are cold: the
 * step has streamed the weights through L2 since the layer wrote them). A hint: it changes no value. */
__device__ __forceinline__ void att_prefetch_rows(const cu_kvlay &lay, const uint8_t *const *kp, int nkc, int nt) {
#if defined(__CUDA_ARCH__)
    const int lines = (lay.bytes + 127) / 128 + 1;   /* a row at any address */
    for (int x = threadIdx.x; x < nkc * lines; x += nt) {
        const int off = 128 * (x % lines);   /* the last: the row's last byte (its line, where the row ends past a line) */
        const uint8_t *a = kp[x / lines] + (off < lay.bytes ? off : lay.bytes - 1);
        asm volatile("prefetch.L2 [%0];" ::"l"(a));
    }
#else
    (void)lay; (void)kp; (void)nkc; (void)nt;
#endif
}

/* A value another block of the same launch wrote before a grid barrier (k_att_dec), read through L2: never a line
 * this SM's L1 may hold from before. For values of earlier launches the same as a plain load. */
__device__ __forceinline__ float att_ld(const float *p) {
#if defined(__CUDA_ARCH__)
    return __ldcg(p);
#else
    return *p;
#endif
}

/* M_h of heads hb .. hb + hn - 1 (a group of HG) over the maxima of the query's qch chunks into Ms [HG] (shared; heads
 * past hn: -inf), by the block's NT threads: thread (h, part) takes chunks part, part + NT / HG, ... (their loads at
 * once, not a chain of qch; through L2, as the one-launch kernels need), then one thread a head: a max, exact in any
 * order. red: [NT / HG][HG] shared floats. write: the block also stores them in X.M (k_att_combine's). Ms is the
 * caller's after its next barrier. */
template <int NT, int HG>
__device__ __forceinline__ void att_query_max(const att_scratch &X, int qch, int H, int hb, int hn, float (*red)[HG], float *Ms, bool write) {
    static_assert(NT % HG == 0, "att_query_max: whole parts");
    {
        const int h = threadIdx.x % HG, part = threadIdx.x / HG;
        float mx = -INFINITY;
        if (h < hn)
#pragma unroll 8
            for (int cc = part; cc < qch; cc += NT / HG) mx = fmaxf(mx, att_ld(X.cmax + (int64_t)cc * H + hb + h));
        red[part][h] = mx;
    }
    __syncthreads();
    if (threadIdx.x < HG) {
        float mx = red[0][threadIdx.x];
        for (int part = 1; part < NT / HG; part++) mx = fmaxf(mx, red[part][threadIdx.x]);
        Ms[threadIdx.x] = mx;
        if (write && threadIdx.x < hn) X.M[hb + threadIdx.x] = mx;
    }
}

/* Thread tile of k_att_scores: keys r0 + 16 a (a = 0..3) x heads h0 + b (b = 0..3) of the block's HB heads (4 HB
 * threads); a half-warp shares h0 (its q loads are broadcasts) and reads 16 distinct key rows (rows padded by 4
 * floats: the float4 loads of 8 consecutive rows cover the 32 banks). Each slice of ATT_SDS columns is loaded in
 * two phases: every load of the thread (q and the rows' stored bits) is issued, then the values are decoded into
 * shared memory, so a slice costs one round trip to memory, not one per element. */
template <int HB, int F>
__global__ void __launch_bounds__(4 * HB, 768 / (4 * HB)) k_att_scores(att_args A, const float *q, int t0, int nch, int H, int D, float *scratch) {
    dev_grid_wait();
    constexpr int NT = 4 * HB, DS = ATT_SDS;
    constexpr int QPT = HB * DS / NT;   /* a thread's q elements of a slice */
    static_assert(HB % 16 == 0 && HB <= ATT_HG && DS % 4 == 0, "k_att_scores: tile");
    __shared__ __align__(16) float qs[HB][DS + 4];
    __shared__ __align__(16) float ks[ATT_KC][DS + 4];
    __shared__ const uint8_t *kp[ATT_KC];
    const int slot = blockIdx.z, t = t0 + slot, c = blockIdx.x, hb = blockIdx.y * HB;
    const int hn = H - hb < HB ? H - hb : HB;
    const int64_t p = A.pos[t];
    const att_keys K = att_keys_of(p, t, A.W, A.ratio, A.n_sel);
    const int k0 = c * ATT_KC;
    if (k0 >= K.nk) return;   /* the whole block: this query has fewer chunks */
    const int nkc = K.nk - k0 < ATT_KC ? K.nk - k0 : ATT_KC;
    const int item = A.item_of[t];
    const cu_item it = A.items[item];
    const cu_seq_layer L = A.sl[item];
    for (int i = threadIdx.x; i < nkc; i += NT)
        kp[i] = att_key_row(A.lay, K, k0 + i, it, L, A.kvs, A.ring_len, A.ratio, A.sel + (int64_t)t * A.topk);
    const int r0 = threadIdx.x % 16, h0 = 4 * (threadIdx.x / 16);
    float acc[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) acc[a][b] = 0.0f;
    const float *qt = q + ((int64_t)t * H + hb) * D;
    __syncthreads();   /* kp is written */
    att_prefetch_rows(A.lay, kp, nkc, NT);
    for (int j0 = 0; j0 < D; j0 += DS) {
        __syncthreads();   /* the previous slice is consumed */
        float qv[QPT];   /* q's loads in flight with the rows' */
#pragma unroll
        for (int u = 0; u < QPT; u++) {
            const int e = threadIdx.x + NT * u, h = e / DS, j = j0 + e % DS;
            qv[u] = h < hn && j < D ? qt[(int64_t)h * D + j] : 0.0f;
        }
        att_load_rows<F, NT, DS, DS + 4, ATT_SPH>(A.lay, kp, nkc, j0, D, ks);
#pragma unroll
        for (int u = 0; u < QPT; u++) {
            const int e = threadIdx.x + NT * u;
            qs[e / DS][e % DS] = qv[u];
        }
        __syncthreads();
        /* columns past D are zeros on both sides: fmaf(0, 0, acc) = acc, the order over the real columns stands */
        for (int jj = 0; jj < DS; jj += 4) {
            float4 q4[4], r4[4];
#pragma unroll
            for (int b = 0; b < 4; b++) q4[b] = *(const float4 *)&qs[h0 + b][jj];
#pragma unroll
            for (int a = 0; a < 4; a++) r4[a] = *(const float4 *)&ks[r0 + 16 * a][jj];
            fma_tile4x4(acc, q4, r4);
        }
    }
    const float scale = 1.0f / sqrtf((float)D);
    const att_scratch X = att_scratch_of(scratch, slot, nch, H, D);
#pragma unroll
    for (int b = 0; b < 4; b++) {
        const int h = h0 + b;
        float mx = -INFINITY;
#pragma unroll
        for (int a = 0; a < 4; a++) {
            const int r = r0 + 16 * a;
            const float s = acc[a][b] * scale;
            if (r < nkc) {
                mx = fmaxf(mx, s);
                if (h < hn) X.S[((int64_t)c * H + hb + h) * ATT_KC + r] = s;
            }
        }
        /* the 16 lanes of a half-warp hold the chunk's keys of head h: a max, exact in any order */
        for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        if (r0 == 0 && h < hn) X.cmax[(int64_t)c * H + hb + h] = mx;
    }
}

/* Thread tile of k_att_pv: heads h0 + b (b = 0..3) of the block's HB x columns 4 c4 .. 4 c4 + 3 of a column slice
 * (4 HB threads). A block takes the column slices s0 .. s0 + ns - 1 of its chunk (ns: cu_attention's choice, by the
 * launch's size; the slices past D are skipped) one after another: e, the denominator part and the rounded
 * probabilities are computed once for all of them (at a prefill chunk, ns = 1 computed each of them D / 64 times,
 * run 106). Who computes what only: every output element is the same chain. The scores and the slice of rows are
 * loaded in two phases, as k_att_scores's. */
template <int HB, int F>
__global__ void __launch_bounds__(4 * HB, 1280 / (4 * HB)) k_att_pv(int official, att_args A, int t0, int nch, int H, int D, int ns,
                                                                    float *scratch) {
    dev_grid_wait();
    ATT_TIME_BEGIN(2);
    constexpr int NT = 4 * HB;
    constexpr int SPT = HB * ATT_KC / NT;   /* a thread's scores */
    static_assert(HB % 16 == 0 && HB <= ATT_HG && ATT_DS == 64 && SPT % 8 == 0, "k_att_pv: tile (16 x 4 columns a slice)");
    __shared__ __align__(16) float pt[HB][ATT_KC + 4];   /* [head][key]: e, then bf16_if(e) */
    __shared__ __align__(16) float vs[ATT_KC][ATT_DS];  /* the slice of the chunk's rows */
    __shared__ const uint8_t *kp[ATT_KC];
    __shared__ float red[NT / HB][HB];
    __shared__ float Ms[HB];
    const int n_hg = (H + HB - 1) / HB;
    const int slot = blockIdx.z, t = t0 + slot, c = blockIdx.x;
    const int hb = (int)(blockIdx.y % n_hg) * HB, s0 = (int)(blockIdx.y / n_hg) * ns;
    const int n_sl = (D + ATT_DS - 1) / ATT_DS, s1 = s0 + ns < n_sl ? s0 + ns : n_sl;
    const int hn = H - hb < HB ? H - hb : HB;
    const att_keys K = att_keys_of(A.pos[t], t, A.W, A.ratio, A.n_sel);
    const int k0 = c * ATT_KC;
    if (k0 >= K.nk || s0 >= s1) return;
    const int nkc = K.nk - k0 < ATT_KC ? K.nk - k0 : ATT_KC;
    int qch = (K.nk + ATT_KC - 1) / ATT_KC;
    if (qch > nch) qch = nch;   /* a key list longer than the launch's (a caller's bug): k_att_combine writes NaN */
    const int item = A.item_of[t];
    const cu_item it = A.items[item];
    const cu_seq_layer L = A.sl[item];
    for (int i = threadIdx.x; i < nkc; i += NT)
        kp[i] = att_key_row(A.lay, K, k0 + i, it, L, A.kvs, A.ring_len, A.ratio, A.sel + (int64_t)t * A.topk);
    ATT_TIME_MARK(0);
    const att_scratch X = att_scratch_of(scratch, slot, nch, H, D);
    att_query_max<NT, HB>(X, qch, H, hb, hn, red, Ms, c == 0 && s0 == 0);   /* M_h over every chunk of the query */
    __syncthreads();
    ATT_TIME_MARK(1);
    /* e of the chunk's scores: loads in flight a phase at a time (8 scores a thread) */
#pragma unroll
    for (int u0 = 0; u0 < SPT; u0 += 8) {
        float sv[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int e = threadIdx.x + NT * (u0 + u), h = e / ATT_KC, i = e % ATT_KC;
            sv[u] = h < hn && i < nkc ? X.S[((int64_t)c * H + hb + h) * ATT_KC + i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int e = threadIdx.x + NT * (u0 + u), h = e / ATT_KC, i = e % ATT_KC;
            pt[h][i] = h < hn && i < nkc ? expf(sv[u] - Ms[h]) : 0.0f;
        }
    }
    ATT_TIME_MARK(2);
    __syncthreads();
    if (s0 == 0 && threadIdx.x < hn) {   /* the chunk's denominator part: its keys in order, by one thread */
        float den = 0.0f;
        for (int i = 0; i < nkc; i++) den += pt[threadIdx.x][i];
        X.pden[(int64_t)c * H + hb + threadIdx.x] = den;
    }
    __syncthreads();
    if (official)   /* the probabilities P.V sees (the denominator above took them unrounded, as the CPU does) */
        for (int e = threadIdx.x; e < HB * ATT_KC; e += NT) pt[e / ATT_KC][e % ATT_KC] = dev_round_bf16(pt[e / ATT_KC][e % ATT_KC]);
    const int c4 = threadIdx.x % 16, h0 = 4 * (threadIdx.x / 16);
    for (int sl = s0; sl < s1; sl++) {
        const int j0 = sl * ATT_DS;
        att_load_rows<F, NT, ATT_DS, ATT_DS, 4>(A.lay, kp, nkc, j0, D, vs);
        __syncthreads();   /* vs (and, the first time, pt) written */
        ATT_TIME_MARK(3);
        float acc[4][4];
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int u = 0; u < 4; u++) acc[b][u] = 0.0f;
        for (int i = 0; i < nkc; i++) {
            const float4 v = *(const float4 *)&vs[i][4 * c4];
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const float pb = pt[h0 + b][i];
                acc[b][0] = fmaf(pb, v.x, acc[b][0]);
                acc[b][1] = fmaf(pb, v.y, acc[b][1]);
                acc[b][2] = fmaf(pb, v.z, acc[b][2]);
                acc[b][3] = fmaf(pb, v.w, acc[b][3]);
            }
        }
#pragma unroll
        for (int b = 0; b < 4; b++) {
            if (h0 + b >= hn) continue;
            float *dst = X.part + ((int64_t)c * H + hb + h0 + b) * D;
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int j = j0 + 4 * c4 + u;
                if (j < D) dst[j] = acc[b][u];
            }
        }
        __syncthreads();   /* vs is read; the next slice overwrites it */
    }
    ATT_TIME_END();
}

/* ---- decode-sized launches: one phase of loads a block (issue 18) ---------------------------------------------------
 *
 * At a decode step a launch holds a few queries of at most a few hundred keys each, and k_att_scores's blocks spent
 * their time waiting: 16 slices of 32 columns, each a round trip to memory (load, barrier, compute). k_att_scores_dec
 * computes exactly the numbers k_att_scores computes — every score the same thread-private chain: fmaf from 0.0f
 * over the columns j = 0, 1, .., D-1 in order (then, where k_att_scores pads its last slice with zero columns, one
 * fmaf(0, 0, acc): D % ATT_SDS != 0), times 1/sqrt(D); each chunk's max per head (a max: exact in any order) — with
 * another division of the work:
 *   block (chunk, group of ATT_DHG heads, query), ATT_DEC_T threads: the chunk's 64 stored rows are copied whole into
 *   shared memory (cp.async: every copy of the block in flight at once, no registers held) with the group's q rows,
 *   one round trip; then decoded to fp32 (the same decoding as kv_elem / kv_col, bit for bit); then each of the
 *   first ATT_DEC_CT threads computes 2 keys x 2 heads over all D columns from shared memory (lanes: 8 keys x 4 heads, so a q load is a
 *   broadcast to 8 lanes and a row load feeds 4); the chunk's max per head by shuffles and a small shared array.
 * It writes S and cmax as k_att_scores does (the same scratch, the same bits: test_gpu_attention compares the two
 * with memcmp, cu_attention's CU_ATT_NO_DEC), so k_att_pv and k_att_combine follow unchanged. Shared memory:
 * 64 fp32 rows + ATT_DHG fp32 q rows + 64 raw rows (184 KB at D 512 with fp8 rows, 216 KB with bf16; f32 rows go
 * straight into the fp32 rows, 149 KB): one block an SM. So a launch
 * takes it only when its blocks (chunks x head groups x queries) fit in one wave, at most one per SM
 * (cu_attention_decode_launches); a larger one keeps k_att_scores, whose small blocks share SMs. On a lent H200
 * (helper attdec, ncu of test_gpu_attention --bench, one query of 640 fp8 keys, 64 x 512): 94 -> 54 us; two
 * queries of 640 keys (160 blocks, two waves) took longer than with k_att_scores, hence the rule. */
/* -DATT_DEC_BUG=1: a deliberate bug (one score takes column 0 twice), to see test_gpu_attention's memcmp of the two
 * kernels fail (tools/gpu/shim/shim_attention.sh with SHIM_CFLAGS=-DATT_DEC_BUG=1). Never in a real build. */
#ifndef ATT_DHG
#define ATT_DHG 8        /* heads a block of k_att_scores_dec (ATT_DEC_CT threads of 2 keys x 2 heads each) */
#endif
#define ATT_DEC_CT (ATT_KC * ATT_DHG / 4)   /* its threads that compute scores */
#ifndef ATT_DEC_STAGE
/* its threads / ATT_DEC_CT: all of them copy and decode, the first ATT_DEC_CT compute. 4 (16 warps, four a
 * sub-partition) since run 86: the copy and decode phases are latency-bound chains (CSA block, 640 fp8 keys: copies
 * 1.7 -> 1.5 us, decode 6.1 -> 3.8 us against 2); 1 and 2 were the earlier choices (NVFLAGS+=-DATT_DEC_STAGE=2). */
#define ATT_DEC_STAGE 4
#endif
#define ATT_DEC_T (ATT_DEC_STAGE * ATT_DEC_CT)   /* its threads */
static_assert(ATT_DHG == 8, "k_att_scores_dec: its lanes are 8 keys x 4 heads, its warps 16 keys x all 8 heads");

/* 4 or 16 bytes global -> shared without passing through registers (cp.async, sm_80+): all of a block's copies in
 * flight at once; att_cp_wait waits for the thread's own. The CPU shim copies at once. */
__device__ __forceinline__ void att_cp4(void *dst, const void *src) {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
#else
    memcpy(dst, src, 4);
#endif
}
__device__ __forceinline__ void att_cp16(void *dst, const void *src) {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src) : "memory");
#else
    memcpy(dst, src, 16);
#endif
}
__device__ __forceinline__ void att_cp_wait(void) {
#if defined(__CUDA_ARCH__)
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

/* The layout of k_att_scores_dec's dynamic shared memory (bytes): kf [ATT_KC][ld] fp32 rows | qf [ATT_DHG][ld] fp32 q
 * rows | raw [ATT_KC][rb] stored rows, row r at offset (its address mod 16) so that its 16-byte lines stay lines |
 * kp [ATT_KC] row addresses | red [ATT_DEC_CT / 32][ATT_DHG] (all of the kernel's shared memory is dynamic: the
 * attribute cu_attention sets is the device's whole opt-in size, which leaves no room for static arrays). ld: D rounded up to 4, plus 4 (8 consecutive rows' float4 loads hit distinct banks). */
struct att_dec_smem {
    int ld, rb;
    int64_t kf, qf, raw, kp, red, bytes;
};
static __host__ __device__ __forceinline__ att_dec_smem att_dec_smem_of(int D, int row_bytes, int fmt) {
    att_dec_smem m;
    m.ld = (D + 3) / 4 * 4 + 4;
    m.rb = (row_bytes + 15) / 16 * 16 + 16;
    m.kf = 0;
    m.qf = m.kf + (int64_t)4 * ATT_KC * m.ld;
    m.raw = m.qf + (int64_t)4 * ATT_DHG * m.ld;
    m.kp = m.raw + (fmt == KV_F32 ? 0 : (int64_t)ATT_KC * m.rb);   /* f32 rows are copied straight into kf: no raw rows */
    m.red = m.kp + (int64_t)sizeof(void *) * ATT_KC;
    m.bytes = m.red + (int64_t)sizeof(float) * (ATT_DEC_CT / 32) * ATT_DHG;
    return m;
}

/* A stored row [a, a + n) goes into shared memory at dst + (address - (a & ~15)), so that its 16-byte lines stay
 * lines: the whole lines by one 16-byte copy each (att_copy_whole), the at most two lines cut by the row's ends byte
 * by byte, only the row's bytes read (att_copy_cut). Two loops, not one with a branch: in one loop every warp met a
 * row's cut line and stepped through its byte path (run 84: 199 instructions an iteration, a quarter of the
 * kernel's). A cut line's loads are all issued before its first store (run 81: one round trip to L2 per byte
 * otherwise, the stores through a pointer that might alias them). */
__device__ __forceinline__ void att_copy_whole(const uint8_t *a, int n, int x, uint8_t *dst) {
    const uintptr_t base = (uintptr_t)a & ~(uintptr_t)15, l0 = base + 16 * (uintptr_t)x;
    if (l0 >= (uintptr_t)a && l0 + 16 <= (uintptr_t)a + (uintptr_t)n) att_cp16(dst + (l0 - base), (const void *)l0);
}
/* Line x if the row's ends cut it (x is the first or the last line the row touches). */
__device__ __forceinline__ void att_copy_cut(const uint8_t *a, int n, int x, uint8_t *dst) {
    const uintptr_t base = (uintptr_t)a & ~(uintptr_t)15, lo = (uintptr_t)a, hi = (uintptr_t)a + (uintptr_t)n;
    const uintptr_t l0 = base + 16 * (uintptr_t)x;
    if (l0 >= hi || (l0 >= lo && l0 + 16 <= hi)) return;   /* past the row, or whole */
    uint8_t b[16];
#pragma unroll
    for (int k = 0; k < 16; k++) b[k] = l0 + k >= lo && l0 + k < hi ? *(const uint8_t *)(l0 + k) : 0;
#pragma unroll
    for (int k = 0; k < 16; k++)
        if (l0 + k >= lo && l0 + k < hi) dst[l0 + k - base] = b[k];
}

/* Issues the copies of the stored rows kp[0 .. nkc) into raw + r rb (row r at its address mod 16: att_copy_whole
 * for its whole lines, att_copy_cut for the at most two its ends cut), by nt threads; the caller waits (att_cp_wait)
 * and synchronizes. */
__device__ __forceinline__ void att_copy_rows(const cu_kvlay &lay, const uint8_t *const *kp, int nkc, uint8_t *raw, int rb, int nt) {
    const int lines = lay.bytes / 16 + 2;   /* 16-byte lines a row touches, at most */
    for (int e = threadIdx.x; e < nkc * lines; e += nt) {
        const int r = e / lines;
        att_copy_whole(kp[r], lay.bytes, e % lines, raw + (int64_t)r * rb);
    }
    for (int e = threadIdx.x; e < 2 * nkc; e += nt) {   /* the row's first and last line */
        const uint8_t *a = kp[e / 2];
        const int x = e % 2 ? (int)(((uintptr_t)a + lay.bytes - 1) / 16 - (uintptr_t)a / 16) : 0;
        if (e % 2 == 0 || x > 0) att_copy_cut(a, lay.bytes, x, raw + (int64_t)(e / 2) * rb);
    }
}

/* Columns j .. j + 3 (j % 4 == 0, j + 3 < nope) of an FP8 row in shared memory (a slot of att_dec_smem's raw rows:
 * 16 bytes of slack past the row, which the second aligned word may touch) as fp32: four E4M3 bytes under one scale
 * (j .. j + 3 share a 64-column scale block), the products e4m3 x scale of kv_col's value, from dev_e4m3_times on
 * the GPU (the same products, cu_common.cuh). */
__device__ __forceinline__ float4 att_decode4_fp8(const cu_kvlay &lay, const uint8_t *row, int j) {
    float v[4];
    const float s = dev_e8m0(row[lay.nope + j / 64]);
    /* the four bytes as one funnel shift of the two aligned words holding them; the word pointer by pointer
     * arithmetic from row, so that the compiler still knows it is shared memory (run 84: through an integer `& ~3`
     * it became two generic loads) */
    const int mis = (int)((uintptr_t)(row + j) & 3);
    const uint32_t *w = (const uint32_t *)(row + j - mis);
    const uint32_t q4 = (uint32_t)((((uint64_t)w[1] << 32) | w[0]) >> (8 * mis));
#if defined(__CUDA_ARCH__)
    dev_e4m3_times<4>(q4, s, v);
#else
#pragma unroll
    for (int k = 0; k < 4; k++) v[k] = dev_e4m3((uint8_t)(q4 >> (8 * k))) * s;
#endif
    return make_float4(v[0], v[1], v[2], v[3]);
}

/* Columns j .. j + 3 (j % 4 == 0; those past D give 0) of a stored row in shared memory as fp32: kv_col's value of
 * kv_col's bits, element by element (an FP8 row's E4M3 quads may take att_decode4_fp8: the same values). */
template <int F>
__device__ __forceinline__ float4 att_decode4(const cu_kvlay &lay, const uint8_t *row, int j, int D) {
    if (F == DSV4_KV_FP8 && j + 3 < lay.nope) return att_decode4_fp8(lay, row, j);
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const bool in = j + k < D;
        const kv_col<F> col(lay, in ? j + k : 0);
        v[k] = in ? col.value(col.bits(row)) : 0.0f;
    }
    return make_float4(v[0], v[1], v[2], v[3]);
}

/* k_att_scores_dec's shared memory seen as arrays (att_dec_smem's layout). */
struct att_dec_view {
    float *kf, *qf;
    uint8_t *raw;
    const uint8_t **kp;
    float (*red)[ATT_DHG];   /* [ATT_DEC_CT / 32][ATT_DHG]: the computing warps' maxima */
    int ld, rb;
};

__device__ __forceinline__ att_dec_view att_dec_view_of(unsigned char *base, const att_dec_smem &m) {
    att_dec_view v;
    v.kf = (float *)(base + m.kf);
    v.qf = (float *)(base + m.qf);
    v.raw = base + m.raw;
    v.kp = (const uint8_t **)(base + m.kp);
    v.red = (float (*)[ATT_DHG])(base + m.red);
    v.ld = m.ld;
    v.rb = m.rb;
    return v;
}

/* Quads q0 .. q1 - 1 of every row of the chunk (rows past nkc: zeros) from the raw rows into v.kf as fp32, by
 * att_decode4; FP8Q: all of them are FP8 quads (its first branch, taken without the test). A thread's items are
 * e = threadIdx.x + ATT_DEC_T i over rows x quads, stepped without a division. */
template <int F, bool FP8Q>
__device__ __forceinline__ void att_dec_quads(const cu_kvlay &lay, const att_dec_view &v, int nkc, int D, int q0, int q1) {
    constexpr int NT = ATT_DEC_T;
    const int nqr = q1 - q0, dr = NT / nqr, dq = NT % nqr;
    int r = threadIdx.x / nqr, qd = threadIdx.x % nqr;
#pragma unroll 4
    for (; r < ATT_KC;) {
        const int j = 4 * (q0 + qd);
        float4 out = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < nkc) {
            const uint8_t *row = v.raw + (int64_t)r * v.rb + ((uintptr_t)v.kp[r] & 15);
            out = FP8Q ? att_decode4_fp8(lay, row, j) : att_decode4<F>(lay, row, j, D);
        }
        *(float4 *)&v.kf[(int64_t)r * v.ld + j] = out;
        qd += dq;
        r += dr;
        if (qd >= nqr) qd -= nqr, r++;
    }
}

/* The block's chunk (keys k0 .. k0 + nkc - 1 of query t) and its head group's q rows (heads hb .. hb + hn - 1) into
 * shared memory as fp32: v.kf [ATT_KC][ld] (rows past nkc and columns past D zeros), v.qf [ATT_DHG][ld] (the same),
 * v.kp the rows' addresses. One round trip: every copy of the block in flight at once. Ends with a barrier. */
template <int F>
__device__ __forceinline__ void att_dec_rows(const att_args &A, const float *q, int t, int H, int D, int hb, int hn, const att_keys &K,
                                             int k0, int nkc, const att_dec_view &v, unsigned att_rec = ATT_TIMES_MAX) {
    constexpr int NT = ATT_DEC_T, HB = ATT_DHG;
    const int ld = v.ld, rb = v.rb;
    const int item = A.item_of[t];
    const cu_item it = A.items[item];
    const cu_seq_layer L = A.sl[item];
    for (int i = threadIdx.x; i < nkc; i += NT)
        v.kp[i] = att_key_row(A.lay, K, k0 + i, it, L, A.kvs, A.ring_len, A.ratio, A.sel + (int64_t)t * A.topk);
    /* q rows of the group (zeros past hn and past D), in flight while the row addresses are found */
    const float *qt = q + ((int64_t)t * H + hb) * D;
    const int nq = (D + 3) / 4;   /* float4s a row */
    const bool q16 = D % 4 == 0 && (uintptr_t)qt % 16 == 0;
    for (int e = threadIdx.x; e < HB * nq; e += NT) {
        const int h = e / nq, j = 4 * (e % nq);
        float *dst = v.qf + (int64_t)h * ld + j;
        if (h < hn && q16) att_cp16(dst, qt + (int64_t)h * D + j);
        else
            for (int k = 0; k < 4; k++)
                if (h < hn && j + k < D) att_cp4(dst + k, qt + (int64_t)h * D + j + k);
                else dst[k] = 0.0f;
    }
    __syncthreads();   /* kp is written */
    ATT_TIME_MARK(0);
    if constexpr (F == KV_F32) {
        /* f32 rows: element j is the float at byte 4 j (kv_col), so its fp32 value is its bits: float4 x of row r
         * copied straight into kf (one 16-byte copy from a 16-byte aligned row, else four of 4 bytes); rows past nkc
         * and columns past D: zeros, as the decode below writes them. Shared memory: no raw rows (149 KB at D 512,
         * where raw f32 rows beside their decoded copies would not fit in the 227 KB an SM has). */
        for (int e = threadIdx.x; e < ATT_KC * nq; e += NT) {
            const int r = e / nq, j = 4 * (e % nq);
            float *dst = v.kf + (int64_t)r * ld + j;
            const float *src = r < nkc ? (const float *)v.kp[r] + j : NULL;
            if (src && j + 3 < D && (uintptr_t)src % 16 == 0) att_cp16(dst, src);
            else
                for (int k = 0; k < 4; k++)
                    if (src && j + k < D) att_cp4(dst + k, src + k);
                    else dst[k] = 0.0f;
        }
        att_cp_wait();
        __syncthreads();   /* every thread's copies have landed */
    } else {
        att_copy_rows(A.lay, v.kp, nkc, v.raw, rb, NT);
        att_cp_wait();
        __syncthreads();   /* every thread's copies have landed */
        ATT_TIME_MARK(1);
        /* decode: float4 x of row r (rows past nkc: zeros); ld - 4 columns, those past D zeros. An FP8 row's quads
         * of E4M3 bytes (columns below nope & ~3) in one loop, every other quad (RoPE, a quad across nope, past D; all
         * of a BF16 row's) in a second: one loop over both put a row's last quads in the same warps as FP8 quads,
         * and those warps stepped through both paths every iteration while the others waited at the barrier (run
         * 84). */
        const int n8 = F == DSV4_KV_FP8 ? (A.lay.nope < D ? A.lay.nope : D) / 4 : 0;   /* the first loop's quads a row */
        if (n8 > 0) att_dec_quads<F, true>(A.lay, v, nkc, D, 0, n8);
        if (n8 < nq) att_dec_quads<F, false>(A.lay, v, nkc, D, n8, nq);
        __syncthreads();
        ATT_TIME_MARK(2);
    }
}

/* The chunk's scores from v.kf and v.qf (att_dec_rows): S and the chunk's max per head into the scratch (chunk c of
 * the query), as k_att_scores writes them; ss (shared, [ATT_DHG][ss_ld], or NULL): the same scores, for the fused
 * kernel's P.V. Ends with a barrier. */
__device__ __forceinline__ void att_dec_scores(const att_dec_view &v, int c, int nkc, int H, int D, int hb, int hn, const att_scratch &X,
                                               float *ss, int ss_ld) {
    constexpr int CT = ATT_DEC_CT;
    const int nq = (D + 3) / 4, ld = v.ld;
    if (threadIdx.x < CT) {   /* whole warps; the others only copied and decoded */
        /* thread: keys kr + 8 a (a = 0, 1), heads hx + 4 b (b = 0, 1); the chains over the columns in order. This
         * loop is bound by shared-memory wavefronts (run 84: an LDS.128 of the k rows takes 4, of the q rows 2; ~3.2
         * of its ~4.4 us); the lanes the other way round (keys in bits 2-4, heads in 0-1) took as long (run 86). */
        const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, kx = lane & 7, hx = lane >> 3, kr = 16 * w + kx;
        float acc[2][2] = { { 0.0f, 0.0f }, { 0.0f, 0.0f } };
        const float *k0p = v.kf + (int64_t)kr * ld, *k1p = k0p + 8 * ld, *q0p = v.qf + (int64_t)hx * ld, *q1p = q0p + 4 * ld;
#pragma unroll 4
        for (int j = 0; j < 4 * nq; j += 4) {   /* columns past D: zeros on both sides, as k_att_scores's */
            const float4 k0v = *(const float4 *)(k0p + j), k1v = *(const float4 *)(k1p + j);
            const float4 q0v = *(const float4 *)(q0p + j), q1v = *(const float4 *)(q1p + j);
            acc[0][0] = fmaf(q0v.x, k0v.x, acc[0][0]); acc[0][1] = fmaf(q1v.x, k0v.x, acc[0][1]);
            acc[1][0] = fmaf(q0v.x, k1v.x, acc[1][0]); acc[1][1] = fmaf(q1v.x, k1v.x, acc[1][1]);
            acc[0][0] = fmaf(q0v.y, k0v.y, acc[0][0]); acc[0][1] = fmaf(q1v.y, k0v.y, acc[0][1]);
            acc[1][0] = fmaf(q0v.y, k1v.y, acc[1][0]); acc[1][1] = fmaf(q1v.y, k1v.y, acc[1][1]);
            acc[0][0] = fmaf(q0v.z, k0v.z, acc[0][0]); acc[0][1] = fmaf(q1v.z, k0v.z, acc[0][1]);
            acc[1][0] = fmaf(q0v.z, k1v.z, acc[1][0]); acc[1][1] = fmaf(q1v.z, k1v.z, acc[1][1]);
            acc[0][0] = fmaf(q0v.w, k0v.w, acc[0][0]); acc[0][1] = fmaf(q1v.w, k0v.w, acc[0][1]);
            acc[1][0] = fmaf(q0v.w, k1v.w, acc[1][0]); acc[1][1] = fmaf(q1v.w, k1v.w, acc[1][1]);
        }
#if defined(ATT_DEC_BUG) && ATT_DEC_BUG == 1
        if (kr == 5) acc[0][0] = fmaf(q0p[0], k0p[0], acc[0][0]);   /* deliberate: column 0 twice for key 5 of a chunk */
#endif
        const bool pad = D % ATT_SDS != 0;   /* k_att_scores's last slice ends with zero columns: one more fmaf(0, 0, acc) */
        const float scale = 1.0f / sqrtf((float)D);
#pragma unroll
        for (int b = 0; b < 2; b++) {
            const int h = hx + 4 * b;
            float mx = -INFINITY;
#pragma unroll
            for (int a = 0; a < 2; a++) {
                const int r = kr + 8 * a;
                const float s = (pad ? fmaf(0.0f, 0.0f, acc[a][b]) : acc[a][b]) * scale;
                if (r < nkc) {
                    mx = fmaxf(mx, s);
                    if (h < hn) X.S[((int64_t)c * H + hb + h) * ATT_KC + r] = s;
                    if (ss) ss[h * ss_ld + r] = s;
                }
            }
            /* the 8 lanes kx of a head, then the CT / 32 warps: a max, exact in any order */
            for (int off = 1; off < 8; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            if (kx == 0) v.red[w][h] = mx;
        }
    }
    __syncthreads();
    if (threadIdx.x < hn) {
        float mx = v.red[0][threadIdx.x];
        for (int ww = 1; ww < CT / 32; ww++) mx = fmaxf(mx, v.red[ww][threadIdx.x]);
        X.cmax[(int64_t)c * H + hb + threadIdx.x] = mx;
    }
    __syncthreads();
}

template <int F>
__global__ void __launch_bounds__(ATT_DEC_T, 1) k_att_scores_dec(att_args A, const float *q, int t0, int nch, int H, int D,
                                                                 float *scratch) {
    dev_grid_wait();
    ATT_TIME_BEGIN(1);
    extern __shared__ __align__(16) unsigned char att_dec_smem_base[];
    const att_dec_view v = att_dec_view_of(att_dec_smem_base, att_dec_smem_of(D, A.lay.bytes, F));
    const int slot = blockIdx.z, t = t0 + slot, c = blockIdx.x, hb = blockIdx.y * ATT_DHG;
    const int hn = H - hb < ATT_DHG ? H - hb : ATT_DHG;
    const att_keys K = att_keys_of(A.pos[t], t, A.W, A.ratio, A.n_sel);
    const int k0 = c * ATT_KC;
    if (k0 >= K.nk) return;   /* the whole block: this query has fewer chunks */
    const int nkc = K.nk - k0 < ATT_KC ? K.nk - k0 : ATT_KC;
    att_dec_rows<F>(A, q, t, H, D, hb, hn, K, k0, nkc, v, att_rec);
    att_dec_scores(v, c, nkc, H, D, hb, hn, att_scratch_of(scratch, slot, nch, H, D), NULL, 0);
    ATT_TIME_END();
}

/* ---- OFFICIAL mode on bf16 tensor cores (cu_attention's mma argument; DSV4_CUDA_ATT_MMA, cuda_model.c) --------------
 *
 * Why the products are exact: in OFFICIAL mode every number that enters these dots is a bf16 value — q (the unit
 * RMSNorm and the RoPE round each element to bf16, k_layer.cu k_qkv_prepare), every stored key/value element (rows
 * are written from bf16 values whose non-RoPE part went through the fp8 QAT step, block_quant_row: an e4m3 value
 * times a power of two, and decode to the same values in every KV format: f32, bf16, fp8 = e4m3 x 2^k + bf16 RoPE
 * part), and the probabilities P.V takes (bf16(e)). A bf16 x bf16 product has at most 16 significant bits: exact
 * in fp32. So mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 computes the same products as the fp32 path;
 * only the summation differs (the MMA's own, fixed by the hardware, then chained through its fp32 C operand). The
 * conversion to bf16 here is round-to-nearest: exact for those values (a caller passing other values gets them
 * rounded to bf16 — not a path EXACT mode ever takes).
 *
 * ---- Reduction order (a function of D, the 64-key chunks and the head only; never of T, the query's neighbours,
 *      the grouping of queries into launches, or which block/warp/lane computes) ----
 *   score s[h][i] (key i of chunk c, head h): C = 0.0f; for k-steps s = 0, 1, .., ceil(D/16)-1 in order:
 *       C = MMA(q_h[16s .. 16s+15], k_i[16s .. 16s+15], C); s[h][i] = C * (1/sqrtf(D)).  (A k-step past D is never
 *       issued; the columns of the last one past D, if D % 16 != 0, are zeros on both sides.)
 *   M_h, e = expf(s - M_h): as the fp32 path (one exact max over every chunk's max before any exponent).
 *   The P.V parts are ATT_PG chunks wide: part u = keys [64 ATT_PG u, 64 ATT_PG (u + 1)) of the key list.
 *   den_u = e_a + e_{a+1} + ... over the part's keys in key order, from 0.0f, one thread (unrounded e, as the CPU).
 *   out_u[h][j]: C = 0.0f; for the part's chunks in order, for their k-steps of 16 keys in order (a step wholly past
 *       the query's last key is never issued; inside the last one the missing keys are zeros on both sides):
 *       C = MMA(bf16(e[h][16 keys]), v[16 keys][j], C); out_u[h][j] = C.
 *   den = expf(sink - M_h) + den_0 + den_1 + ... (parts in order); out[j] = bf16(((0 + out_0[j]) + out_1[j] + ...)
 *       * (1/den)) (parts in order, k_att_combine); de-rotated at p.
 * The MMA computes each element of its 16 x 8 tile from that element's own row of A, column of B and C only, so a
 * head's or a key's bits do not depend on which other heads or keys share the tile (padded rows/columns are zeros).
 *
 * ---- Fragment layouts relied on (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type", .bf16;
 *      the same as CUTLASS cute's SM80_16x8x16_F32BF16BF16F32_TN ALayout/BLayout/CLayout) ----
 *   lane = 4 g + qd (g = groupID 0..7, qd = threadID_in_group 0..3); a 32-bit register holds two bf16, the lower
 *   index in the low 16 bits.
 *   A (16 x 16, row-major, 4 registers): a0 = A[g][2qd, 2qd+1], a1 = A[g+8][2qd, 2qd+1], a2 = A[g][2qd+8, 2qd+9],
 *                                        a3 = A[g+8][2qd+8, 2qd+9].
 *   B (16 x 8, "col": k runs within a register, 2 registers): b0 = B[2qd, 2qd+1][g], b1 = B[2qd+8, 2qd+9][g].
 *   C/D (16 x 8 fp32, 4 registers): d0 = D[g][2qd], d1 = D[g][2qd+1], d2 = D[g+8][2qd], d3 = D[g+8][2qd+1].
 *   Scores: A = 16 heads x 16 columns of q (shared qs[head][col]), B = 16 columns x 8 keys (shared ks[key][col]: a
 *   key's columns are consecutive, one 32-bit load per register). P.V: A = 16 heads x 16 keys of bf16(e) (shared
 *   ps[head][key]), B = 16 keys x 8 columns (shared vt[col][key], the chunk's rows stored transposed so that a
 *   register's two keys are consecutive). */
#ifndef ATT_MMA_SPH
#define ATT_MMA_SPH 4   /* scores a thread of k_att_pv_mma has in flight at once */
#endif
#ifndef ATT_MMA_PH
#define ATT_MMA_PH 4    /* pairs of a row's elements a thread of the tensor-core kernels has in flight at once */
#endif
#ifndef ATT_SC
#define ATT_SC 2        /* chunks a block of k_att_scores_mma (q's slice in shared memory serves both) */
#endif
#define ATT_SC_T (128 * ATT_SC) /* its threads: 4 warps a chunk, warp w = heads 16 (w mod 4) .. + 15 x chunk w / 4 */
#define ATT_MS 64       /* columns a shared slice of k_att_scores_mma */
#define ATT_PV_T 256    /* threads of k_att_pv_mma: 8 warps, warp w = heads 16 (w mod 4) .. + 15 x 64 columns */
#define ATT_PS 128      /* columns a block of k_att_pv_mma (two warps' 64 each): each block recomputes e of its chunks */
#ifndef ATT_PG
#define ATT_PG 4        /* chunks a P.V part on tensor cores (256 keys): 4x fewer parts to write and add than chunks */
#endif

/* -DATT_MMA_BUG=1 / =2: a deliberate fragment bug (1: P.V's B registers swapped; 2: the scores' A registers 1 and 2
 * swapped), to see test_gpu_attention fail. Never in a real build. */
#if defined(ATT_MMA_BUG) && ATT_MMA_BUG == 1
#define ATT_B01(lo, hi) hi, lo
#else
#define ATT_B01(lo, hi) lo, hi
#endif
#if defined(ATT_MMA_BUG) && ATT_MMA_BUG == 2
#define ATT_A12(a1, a2) a2, a1
#else
#define ATT_A12(a1, a2) a1, a2
#endif

/* D = A B + C on one m16n8k16 bf16 tile (fragments as above); the one place the instruction is written, so that
 * the CPU shim (tools/gpu/shim) can put its emulation from the same layout here. */
__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
#ifdef ATT_MMA_EMULATED
    shim_mma_bf16(d, a0, a1, a2, a3, b0, b1);
#else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ uint32_t ld_b32(const uint16_t *p) { return *(const uint32_t *)p; }
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
    return (uint32_t)dev_f32_to_bf16(lo) | (uint32_t)dev_f32_to_bf16(hi) << 16;
}

/* As att_load_rows, as bf16 pairs for the tensor cores: rows r < nrows (of NR), columns [j0, j0 + 64) into dst[r][0 ..
 * 64) (zeros past nrows and past D), thread x taking columns 2 (x mod 32), + 1 of rows x / 32 + (NT / 32) u. */
template <int F, int NT, int NR, int LD, int MAXPH>
__device__ __forceinline__ void att_load_pairs(const cu_kvlay &lay, const uint8_t *const *kp, int nrows, int j0, int D,
                                               uint16_t (*dst)[LD]) {
    constexpr int PER = NR * 32 / NT, PH = PER < MAXPH ? PER : MAXPH;
    static_assert(NT % 32 == 0 && PER % PH == 0 && 64 <= LD, "att_load_pairs: a thread's columns are fixed");
    const int jj = 2 * (threadIdx.x % 32), j = j0 + jj, r0 = threadIdx.x / 32;
    const bool v0 = j < D, v1 = j + 1 < D;
    const kv_col<F> c0(lay, v0 ? j : 0), c1(lay, v1 ? j + 1 : 0);
#pragma unroll
    for (int u0 = 0; u0 < PER; u0 += PH) {
        uint32_t b[PH][2];
#pragma unroll
        for (int u = 0; u < PH; u++) {
            const int r = r0 + (NT / 32) * (u0 + u);
            b[u][0] = v0 && r < nrows ? c0.bits(kp[r]) : 0u;
            b[u][1] = v1 && r < nrows ? c1.bits(kp[r]) : 0u;
        }
#pragma unroll
        for (int u = 0; u < PH; u++) {
            const int r = r0 + (NT / 32) * (u0 + u);
            const bool rv = r < nrows;
            *(uint32_t *)&dst[r][jj] = bf16x2(rv && v0 ? c0.value(b[u][0]) : 0.0f, rv && v1 ? c1.value(b[u][1]) : 0.0f);
        }
    }
}

/* Block (chunks ATT_SC b .. ATT_SC b + ATT_SC - 1, head group, query): the chunks' scores for the group's heads, S
 * and each chunk's max per head, as k_att_scores writes them. Warp w: heads 16 (w mod 4) .. + 15 x the 64 keys of
 * chunk ATT_SC b + w / 4 (8 tiles of 8 keys). Which chunks share a block changes no number (each score is its own
 * chain over the columns). */
template <int F>
__global__ void __launch_bounds__(ATT_SC_T, 768 / ATT_SC_T) k_att_scores_mma(att_args A, const float *q, int t0, int nch, int H,
                                                                              int D, float *scratch) {
    dev_grid_wait();
    __shared__ __align__(16) uint16_t qs[ATT_HG][ATT_MS + 8];            /* rows of 36 words: a fragment load's 32 */
    __shared__ __align__(16) uint16_t ks[ATT_SC * ATT_KC][ATT_MS + 8];   /* lanes (4 g + qd) hit 32 distinct banks */
    __shared__ const uint8_t *kp[ATT_SC * ATT_KC];
    const int slot = blockIdx.z, t = t0 + slot, hb = blockIdx.y * ATT_HG;
    const int hn = H - hb < ATT_HG ? H - hb : ATT_HG;
    const att_keys K = att_keys_of(A.pos[t], t, A.W, A.ratio, A.n_sel);
    const int kb = (int)blockIdx.x * ATT_SC * ATT_KC;   /* the block's first key */
    if (kb >= K.nk) return;   /* the whole block: this query has fewer chunks */
    const int nkb = K.nk - kb < ATT_SC * ATT_KC ? K.nk - kb : ATT_SC * ATT_KC;
    const int item = A.item_of[t];
    const cu_item it = A.items[item];
    const cu_seq_layer L = A.sl[item];
    for (int i = threadIdx.x; i < nkb; i += ATT_SC_T)
        kp[i] = att_key_row(A.lay, K, kb + i, it, L, A.kvs, A.ring_len, A.ratio, A.sel + (int64_t)t * A.topk);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, qd = lane & 3;
    const int hr = 16 * (w & 3) + g, kw = ATT_KC * (w >> 2);   /* the warp's first head, its chunk's first row in ks */
    float acc[ATT_KC / 8][4];
#pragma unroll
    for (int n = 0; n < ATT_KC / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
    const float *qt = q + ((int64_t)t * H + hb) * D;
    __syncthreads();   /* kp is written */
    att_prefetch_rows(A.lay, kp, nkb, ATT_SC_T);
    for (int j0 = 0; j0 < D; j0 += ATT_MS) {
        __syncthreads();   /* the previous slice is consumed */
        constexpr int QP = ATT_HG * ATT_MS / 2 / ATT_SC_T;   /* a thread's pairs of q: loads in flight, then stored */
        float qv[QP][2];
#pragma unroll
        for (int u = 0; u < QP; u++) {
            const int e = threadIdx.x + ATT_SC_T * u, h = e / (ATT_MS / 2), j = j0 + 2 * (e % (ATT_MS / 2));
            const float *qh = qt + (int64_t)h * D;
            const bool hv = h < hn;
            qv[u][0] = hv && j < D ? qh[j] : 0.0f;
            qv[u][1] = hv && j + 1 < D ? qh[j + 1] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < QP; u++) {
            const int e = threadIdx.x + ATT_SC_T * u;
            *(uint32_t *)&qs[e / (ATT_MS / 2)][2 * (e % (ATT_MS / 2))] = bf16x2(qv[u][0], qv[u][1]);
        }
        att_load_pairs<F, ATT_SC_T, ATT_SC * ATT_KC, ATT_MS + 8, ATT_MMA_PH>(A.lay, kp, nkb, j0, D, ks);
        __syncthreads();
        for (int kk = 0; kk < ATT_MS && j0 + kk < D; kk += 16) {
            const uint32_t a0 = ld_b32(&qs[hr][kk + 2 * qd]), a1 = ld_b32(&qs[hr + 8][kk + 2 * qd]);
            const uint32_t a2 = ld_b32(&qs[hr][kk + 8 + 2 * qd]), a3 = ld_b32(&qs[hr + 8][kk + 8 + 2 * qd]);
#pragma unroll
            for (int n = 0; n < ATT_KC / 8; n++)
                mma_bf16(acc[n], a0, ATT_A12(a1, a2), a3, ld_b32(&ks[kw + 8 * n + g][kk + 2 * qd]),
                         ld_b32(&ks[kw + 8 * n + g][kk + 8 + 2 * qd]));
        }
    }
    const float scale = 1.0f / sqrtf((float)D);
    const att_scratch X = att_scratch_of(scratch, slot, nch, H, D);
    const int c = (int)blockIdx.x * ATT_SC + (w >> 2);   /* the warp's chunk */
    /* its keys (<= 0: none); none past the launch's chunks (a caller's too small max_keys: k_att_combine writes NaN) */
    const int nkc = c < nch ? nkb - kw : 0;
    float mx[2] = { -INFINITY, -INFINITY };   /* rows hr, hr + 8 */
#pragma unroll
    for (int n = 0; n < ATT_KC / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = 8 * n + 2 * qd + (e & 1), h = hr + 8 * (e >> 1);
            const float s = acc[n][e] * scale;
            if (r < nkc) {
                mx[e >> 1] = fmaxf(mx[e >> 1], s);
                if (h < hn) X.S[((int64_t)c * H + hb + h) * ATT_KC + r] = s;
            }
        }
    /* the 4 lanes of a group hold the rest of their two rows' keys: a max, exact in any order (every thread of the
     * block takes part in the shuffles, also a warp whose chunk is past the query's last key) */
#pragma unroll
    for (int u = 0; u < 2; u++) {
        for (int off = 1; off < 4; off <<= 1) mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], off));
        if (qd == 0 && nkc > 0 && hr + 8 * u < hn) X.cmax[(int64_t)c * H + hb + hr + 8 * u] = mx[u];
    }
}

/* Columns j0 .. j0 + NC - 1 of the rows kp[0 .. n) into vt [column][key] as bf16 pairs, transposed (zeros past n and
 * past D), for P.V's B fragments: thread x (of NTH) column x mod NC of keys 2 (x / NC) + KS v and the key after each
 * (KS = 2 NTH / NC, v < PV), PB pairs' stored bits loaded before the first is decoded; OU: the batches unrolled (the
 * loop over them stayed rolled in k_att_dec_mma, unrolled in k_att_pv_mma, as each was measured). */
template <int F, int NC, int NTH, int PV, int PB, int OU, int KL>
__device__ __forceinline__ void att_load_vt(const cu_kvlay &lay, const uint8_t *const *kp, int n, int j0, int D, int x, uint16_t (*vt)[KL]) {
    constexpr int KS = 2 * NTH / NC;
    static_assert(NTH % NC == 0 && PV % PB == 0, "att_load_vt: a thread's column is fixed, whole batches");
    const int jj = x % NC, j = j0 + jj, i0 = 2 * (x / NC);
    const bool jv = j < D;
    const kv_col<F> col(lay, jv ? j : 0);
#pragma unroll OU
    for (int v0 = 0; v0 < PV; v0 += PB) {
        uint32_t b[PB][2];
#pragma unroll
        for (int v = 0; v < PB; v++) {
            const int i = i0 + KS * (v0 + v);
            b[v][0] = jv && i < n ? col.bits(kp[i]) : 0u;
            b[v][1] = jv && i + 1 < n ? col.bits(kp[i + 1]) : 0u;
        }
#pragma unroll
        for (int v = 0; v < PB; v++) {
            const int i = i0 + KS * (v0 + v);
            *(uint32_t *)&vt[jj][i] = bf16x2(jv && i < n ? col.value(b[v][0]) : 0.0f, jv && i + 1 < n ? col.value(b[v][1]) : 0.0f);
        }
    }
}

/* One k-step of P.V on tensor cores: keys ks .. ks + 15 into acc[n] (heads hr, hr + 8 x columns cw + 8 n + 2 qd, + 1;
 * the fragments of the layout note above) from ps [head][key] = bf16(e) and vt [column][key] = the rows, transposed. */
template <int N, int KL>
__device__ __forceinline__ void att_pv_step(float (&acc)[N][4], const uint16_t (*ps)[KL], const uint16_t (*vt)[KL], int hr, int cw, int ks,
                                            int g, int qd) {
    const uint32_t a0 = ld_b32(&ps[hr][ks + 2 * qd]), a1 = ld_b32(&ps[hr + 8][ks + 2 * qd]);
    const uint32_t a2 = ld_b32(&ps[hr][ks + 8 + 2 * qd]), a3 = ld_b32(&ps[hr + 8][ks + 8 + 2 * qd]);
#pragma unroll
    for (int n = 0; n < N; n++)
        mma_bf16(acc[n], a0, a1, a2, a3, ATT_B01(ld_b32(&vt[cw + 8 * n + g][ks + 2 * qd]), ld_b32(&vt[cw + 8 * n + g][ks + 8 + 2 * qd])));
}

/* The P.V part's accumulators of att_pv_step into part u of the scratch: head hb + h (h < hn), column j (< D). */
template <int N>
__device__ __forceinline__ void att_pv_store(const float (&acc)[N][4], const att_scratch &X, int u, int H, int hb, int hn, int hr, int jw,
                                             int D, int qd) {
#pragma unroll
    for (int n = 0; n < N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int h = hr + 8 * (e >> 1), j = jw + 8 * n + 2 * qd + (e & 1);
            if (h < hn && j < D) X.part[((int64_t)u * H + hb + h) * D + j] = acc[n][e];
        }
}

/* Block (head group x column slice of ATT_PS, part u, query): M_h, then the part's chunks in order: e, the
 * denominator part (slice 0's blocks), bf16(e) and the chunk's rows (transposed) in shared memory, the MMAs. Warp w:
 * heads 16 (w mod 4) .. + 15 x columns 64 (w / 4) .. + 63 of the slice (8 tiles of 8 columns), its accumulators
 * kept over the part. 47.8 KB of static shared memory (under the 48 KB a launch gets without an attribute). */
template <int F>
__global__ void __launch_bounds__(ATT_PV_T, 3) k_att_pv_mma(att_args A, int t0, int nch, int H, int D, float *scratch) {
    dev_grid_wait();
    __shared__ __align__(16) float pt[ATT_HG][ATT_KC + 4];      /* [head][key]: e */
    __shared__ __align__(16) uint16_t ps[ATT_HG][ATT_KC + 8];   /* [head][key]: bf16(e) */
    __shared__ __align__(16) uint16_t vt[ATT_PS][ATT_KC + 8];   /* [column][key]: the chunk's rows, transposed */
    __shared__ const uint8_t *kp[ATT_PG * ATT_KC];               /* the part's rows, found before the first chunk */
    __shared__ float red[ATT_PV_T / ATT_HG][ATT_HG];
    __shared__ float Ms[ATT_HG];
    const int n_hg = (H + ATT_HG - 1) / ATT_HG;
    const int slot = blockIdx.z, t = t0 + slot, u = blockIdx.x;
    const int hb = (int)(blockIdx.y % n_hg) * ATT_HG, j0 = (int)(blockIdx.y / n_hg) * ATT_PS;
    const int hn = H - hb < ATT_HG ? H - hb : ATT_HG;
    const att_keys K = att_keys_of(A.pos[t], t, A.W, A.ratio, A.n_sel);
    const int c_first = u * ATT_PG;
    if (c_first * ATT_KC >= K.nk) return;   /* the whole block: this query has fewer parts */
    int qch = (K.nk + ATT_KC - 1) / ATT_KC;
    if (qch > nch) qch = nch;   /* a key list longer than the launch's (a caller's bug): k_att_combine writes NaN */
    const int c_end = c_first + ATT_PG < qch ? c_first + ATT_PG : qch;
    const int item = A.item_of[t];
    const cu_item it = A.items[item];
    const cu_seq_layer L = A.sl[item];
    const att_scratch X = att_scratch_of(scratch, slot, nch, H, D);
    for (int i = threadIdx.x; i < ATT_PG * ATT_KC; i += ATT_PV_T)
        if (c_first * ATT_KC + i < K.nk)
            kp[i] = att_key_row(A.lay, K, c_first * ATT_KC + i, it, L, A.kvs, A.ring_len, A.ratio, A.sel + (int64_t)t * A.topk);
    att_query_max<ATT_PV_T, ATT_HG>(X, qch, H, hb, hn, red, Ms, u == 0 && j0 == 0);   /* M_h over every chunk of the query */
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, qd = lane & 3;
    const int hr = 16 * (w & 3) + g, cw = 64 * (w >> 2);   /* the warp's first head and first column of the slice */
    float acc[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
    float den = 0.0f;   /* slice 0, thread h < hn: head h's denominator part */
    for (int c = c_first; c < c_end; c++) {
        const int k0 = c * ATT_KC, nkc = K.nk - k0 < ATT_KC ? K.nk - k0 : ATT_KC;
        const uint8_t *const *kc = kp + (c - c_first) * ATT_KC;   /* the chunk's rows */
        __syncthreads();   /* Ms and kp are written (first chunk); the previous chunk is consumed */
        /* the chunk's scores, ATT_MMA_SPH a thread at a time in flight, then e; the rows, ATT_MMA_PH pairs of keys */
        static_assert(ATT_HG * ATT_KC % (ATT_MMA_SPH * ATT_PV_T) == 0 && ATT_PV_T % ATT_PS == 0, "k_att_pv_mma: loads");
#pragma unroll
        for (int u0 = 0; u0 < ATT_HG * ATT_KC / ATT_PV_T; u0 += ATT_MMA_SPH) {
            float sv[ATT_MMA_SPH];
#pragma unroll
            for (int u = 0; u < ATT_MMA_SPH; u++) {
                const int e = threadIdx.x + ATT_PV_T * (u0 + u), h = e / ATT_KC, i = e % ATT_KC;
                sv[u] = h < hn && i < nkc ? X.S[((int64_t)c * H + hb + h) * ATT_KC + i] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < ATT_MMA_SPH; u++) {
                const int e = threadIdx.x + ATT_PV_T * (u0 + u), h = e / ATT_KC, i = e % ATT_KC;
                const float x = h < hn && i < nkc ? expf(sv[u] - Ms[h]) : 0.0f;
                pt[h][i] = x;
                ps[h][i] = dev_f32_to_bf16(x);   /* the probabilities P.V sees; the denominator takes them unrounded */
            }
        }
        /* thread x: column x mod ATT_PS of the keys 2 (x / ATT_PS) + 2 (ATT_PV_T / ATT_PS) u and the one after each */
        att_load_vt<F, ATT_PS, ATT_PV_T, ATT_PS * ATT_KC / 2 / ATT_PV_T, ATT_MMA_PH, ATT_PS * ATT_KC / 2 / ATT_PV_T / ATT_MMA_PH>(A.lay, kc, nkc, j0, D, (int)threadIdx.x, vt);
        __syncthreads();
        if (j0 == 0 && threadIdx.x < hn)   /* the part's keys in order, by one thread */
            for (int i = 0; i < nkc; i++) den += pt[threadIdx.x][i];
        for (int ks = 0; ks < nkc; ks += 16) att_pv_step(acc, ps, vt, hr, cw, ks, g, qd);
    }
    att_pv_store(acc, X, u, H, hb, hn, hr, j0 + cw, D, qd);
    if (j0 == 0 && threadIdx.x < hn) X.pden[(int64_t)u * H + hb + threadIdx.x] = den;
}

/* The threads that combine one head (att_combine_head): the whole block, or one warp (WARP) of it. */
template <bool WARP> struct att_team {
    __device__ __forceinline__ static int id() { return WARP ? (int)(threadIdx.x & 31) : (int)threadIdx.x; }
    __device__ __forceinline__ static int size() { return WARP ? 32 : (int)blockDim.x; }
    __device__ __forceinline__ static void sync() {
        if (WARP) __syncwarp();
        else __syncthreads();
    }
};

/* Head h of the query whose key list is K (scratch X, launches of nch chunks): den = expf(sink - M_h) + den_0 + den_1
 * + ... (parts of kpp keys, in order), out[j] = bf16_if((out_0[j] + out_1[j] + ...) * (1 / den)) (parts in order, from
 * 0.0f), de-rotated at p, into ot [D] through out_s [D] (shared, the team's own). By a team of threads (the block, or
 * one warp: WARP), however many: each column's sum is one thread's chain, and each RoPE pair one thread's rope_pair. */
template <bool WARP = false>
__device__ __forceinline__ void att_combine_head(int official, const att_scratch &X, const att_keys &K, int nch, int kpp, int h, int H,
                                                 int D, int R, const float *sink, const float *freq, int64_t p, float *out_s, float *ot) {
    typedef att_team<WARP> team;
    const int NTH = team::size(), tid = team::id();
    const int qch = (K.nk + kpp - 1) / kpp;   /* parts of kpp keys: ATT_KC (CUDA cores), ATT_KC ATT_PG (tensor cores) */
    if ((K.nk + ATT_KC - 1) / ATT_KC > nch) {   /* cannot happen when the caller's max_keys holds: say so in the output rather than read past */
        for (int j = tid; j < D; j += NTH) ot[j] = __int_as_float(0x7fc00000);
        return;
    }
    const float M = att_ld(X.M + h);
    /* ATT_UNROLL chunks' loads in flight, then added in chunk order (a chain of ~130 dependent loads at 1M otherwise) */
    float den = expf(sink[h] - M);
    for (int c0 = 0; c0 < qch; c0 += ATT_UNROLL) {
        float v[ATT_UNROLL];
#pragma unroll
        for (int k = 0; k < ATT_UNROLL; k++) v[k] = c0 + k < qch ? att_ld(X.pden + (int64_t)(c0 + k) * H + h) : 0.0f;
#pragma unroll
        for (int k = 0; k < ATT_UNROLL; k++)
            if (c0 + k < qch) den += v[k];
    }
    const float inv = 1.0f / den;
    /* four columns a thread, each summed over the chunks in order from 0.0f */
    for (int jb = 0; jb < D; jb += 4 * NTH) {
        float a[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
        for (int c0 = 0; c0 < qch; c0 += ATT_UNROLL) {
            float v[ATT_UNROLL][4];
#pragma unroll
            for (int k = 0; k < ATT_UNROLL; k++) {
                const float *pc = X.part + ((int64_t)(c0 + k) * H + h) * D;
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int j = jb + tid + u * NTH;
                    v[k][u] = c0 + k < qch && j < D ? att_ld(pc + j) : 0.0f;
                }
            }
#pragma unroll
            for (int k = 0; k < ATT_UNROLL; k++)
                if (c0 + k < qch)
#pragma unroll
                    for (int u = 0; u < 4; u++) a[u] += v[k][u];
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int j = jb + tid + u * NTH;
            if (j < D) out_s[j] = dev_bf16_if(official, a[u] * inv);
        }
    }
    team::sync();
    for (int i = tid; i < R / 2; i += NTH) rope_pair(official, freq, out_s + D - R, i, p, 1);   /* block_rope's pairs */
    team::sync();
    for (int j = tid; j < D; j += NTH) ot[j] = out_s[j];
    team::sync();   /* out_s is free again (the fused kernels' next head) */
}

__global__ void __launch_bounds__(ATT_COMBINE_T) k_att_combine(int official, const int64_t *pos, const int32_t *n_sel, int W, int ratio,
                                                               const float *sink, const float *freq, int t0, int nch, int kpp, int H,
                                                               int D, int R, float *scratch, float *o) {
    dev_grid_wait();
    ATT_TIME_BEGIN(3);
    extern __shared__ float out_s[];   /* [D] */
    const int slot = blockIdx.y, t = t0 + slot, h = blockIdx.x;
    const int64_t p = pos[t];
    att_combine_head(official, att_scratch_of(scratch, slot, nch, H, D), att_keys_of(p, t, W, ratio, n_sel), nch, kpp, h, H, D, R, sink,
                     freq, p, out_s, o + ((int64_t)t * H + h) * D);
    ATT_TIME_END();
}

/* ---- a decode step's attention in one launch (issue 18) ------------------------------------------------------------
 *
 * k_att_dec computes what k_att_scores_dec, k_att_pv and k_att_combine compute — the same numbers, each in the order
 * stated above for them (test_gpu_attention compares its outputs with those of CU_ATT_NO_DEC's kernels by memcmp) —
 * in one launch whose blocks meet at two grid barriers:
 *   1. block (chunk c, group of ATT_DHG heads, query), k_att_scores_dec's: the chunk's rows and the group's q rows
 *      decoded into shared memory; the scores (S, and a copy in shared memory) and the chunk's max per head.
 *   -- every chunk's max is written --
 *   2. the same block, the chunk's rows still in shared memory (k_att_pv loads them again): M_h = the max of the
 *      query's chunk maxima (block 0 writes it to the scratch for step 3); e = expf(s - M_h); den_c = e_0 + e_1 + ...
 *      over the chunk's keys in order from 0.0f (one thread, e unrounded); out_c[h][j] = fmaf over the chunk's keys in
 *      order from 0.0f of bf16_if(e) * v[j] (one thread a head and 4 columns).
 *   -- every chunk's parts are written --
 *   3. block c of a head group combines heads c, c + nc, c + 2 nc, ... of the group (nc: the launch's chunk count)
 *      as k_att_combine: den = expf(sink - M_h) + den_0 + den_1 + ..., out = bf16_if((out_0 + out_1 + ...) / den)
 *      summed in chunk order, de-rotated.
 * Why: at decode the three kernels took ~14 + 11 + 4 us a layer (ncu, run 52), each mostly a chain of fixed latencies
 * (launch, first loads, tail) and P.V's second load of the rows, for a few hundred keys.
 * The barriers (att_grid_sync) need every block resident at once: the launcher takes this kernel only where its
 * blocks are at most the SM count and one fits an SM (its shared memory allows one an SM, so with no block of
 * another kernel able to stay forever, all are resident: blocks of the kernel before (or of another stream) end).
 * bar: two words, zero before the first launch; each barrier leaves its count at zero again.
 * phase: -1 all three steps and the barriers between (the GPU); 0, 1 or 2 one step (the CPU shim, tools/gpu/shim,
 * runs a launch's blocks one after another, so it launches the three steps in turn: step 2 then decodes its rows
 * again and takes its scores from S — the same values). */
struct att_fused_smem {
    att_dec_smem m;   /* k_att_scores_dec's arrays, then: */
    int64_t ss;       /* [ATT_DHG][ATT_KC + 4] the chunk's scores, then e, then bf16_if(e) */
    int64_t ms;       /* [ATT_DHG] M_h */
    int64_t mr;       /* [ATT_DEC_T / ATT_DHG][ATT_DHG] the threads' maxima of M_h's chunks */
    int64_t os;       /* [D] step 3's output row */
    int64_t bytes;
};
static __host__ __device__ __forceinline__ att_fused_smem att_fused_smem_of(int D, int row_bytes, int fmt) {
    att_fused_smem f;
    f.m = att_dec_smem_of(D, row_bytes, fmt);
    f.ss = (f.m.bytes + 15) / 16 * 16;
    f.ms = f.ss + (int64_t)sizeof(float) * ATT_DHG * (ATT_KC + 4);
    f.mr = f.ms + (int64_t)sizeof(float) * ATT_DHG;
    f.os = f.mr + (int64_t)sizeof(float) * ATT_DEC_T;
    f.bytes = f.os + (int64_t)sizeof(float) * D;
    return f;
}

/* -DATT_FUSED_BUG=1: a deliberate bug (P.V leaves out each chunk's last key), to see test_gpu_attention's memcmp of
 * k_att_dec against the three kernels fail (tools/gpu/shim/shim_attention.sh with SHIM_CFLAGS=-DATT_FUSED_BUG=1).
 * Never in a real build. */
/* Every block of the grid waits here until all have arrived (all must be resident: k_att_dec's rule). bar[0] counts
 * arrivals, bar[1] is the generation: the last block to arrive sets the count back to 0, then advances the generation,
 * which the others wait to see change. Memory: the block's writes are ordered before thread 0's fence and arrival by
 * __syncthreads; readers after the barrier read them through L2 (att_ld). A barrier that never completes (a broken
 * residency assumption) traps after ~10 s instead of hanging the process. */
__device__ __forceinline__ void att_grid_sync(unsigned *bar, unsigned nblocks) {
#if defined(__CUDA_ARCH__)
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned *gen = bar + 1;
        const unsigned g = *gen;   /* cannot advance before this block arrives */
        __threadfence();
        if (atomicAdd(bar, 1u) == nblocks - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            unsigned long long spins = 0;
            while (*gen == g) {
                __nanosleep(64);
                if (++spins == (1ull << 27)) __trap();
            }
        }
        __threadfence();
    }
    __syncthreads();
#else
    (void)bar; (void)nblocks;
    __trap();   /* the shim runs the steps as separate launches (phase >= 0) */
#endif
}

template <int F>
__global__ void __launch_bounds__(ATT_DEC_T, 1) k_att_dec(int official, att_args A, const float *q, int t0, int nch, int H, int D,
                                                          const float *sink, const float *freq, int R, float *scratch, float *o,
                                                          unsigned *bar, int phase) {
    dev_grid_wait();
    ATT_TIME_BEGIN(4);
    extern __shared__ __align__(16) unsigned char att_dec_smem_base[];
    constexpr int NT = ATT_DEC_T, HB = ATT_DHG, SL = ATT_KC + 4;
    static_assert(NT % 2 == 0 && HB == 8, "k_att_dec: P.V threads are 2 x 4 heads x (NT / 2) column quads");
    const att_fused_smem fm = att_fused_smem_of(D, A.lay.bytes, F);
    const att_dec_view v = att_dec_view_of(att_dec_smem_base, fm.m);
    float *ss = (float *)(att_dec_smem_base + fm.ss), *Ms = (float *)(att_dec_smem_base + fm.ms);
    float (*mr)[HB] = (float (*)[HB])(att_dec_smem_base + fm.mr);
    float *out_s = (float *)(att_dec_smem_base + fm.os);
    const int slot = blockIdx.z, t = t0 + slot, c = blockIdx.x, hb = blockIdx.y * HB;
    const int hn = H - hb < HB ? H - hb : HB;
    const int64_t p = A.pos[t];
    const att_keys K = att_keys_of(p, t, A.W, A.ratio, A.n_sel);
    const int k0 = c * ATT_KC;
    /* 0: the query has fewer chunks than the launch; the block still meets the barriers and combines */
    const int nkc = K.nk <= k0 ? 0 : K.nk - k0 < ATT_KC ? K.nk - k0 : ATT_KC;
    int qch = (K.nk + ATT_KC - 1) / ATT_KC;
    if (qch > nch) qch = nch;   /* a key list longer than the launch's (a caller's bug): step 3 writes NaN */
    const att_scratch X = att_scratch_of(scratch, slot, nch, H, D);
    const unsigned nblocks = gridDim.x * gridDim.y * gridDim.z;
    /* 1. scores */
    if (nkc && phase <= 0) {
        att_dec_rows<F>(A, q, t, H, D, hb, hn, K, k0, nkc, v);
        att_dec_scores(v, c, nkc, H, D, hb, hn, X, ss, SL);
    }
    ATT_TIME_MARK(0);
    if (phase < 0) att_grid_sync(bar, nblocks);
    ATT_TIME_MARK(1);
    /* 2. the chunk's denominator and P.V parts */
    if (nkc && (phase < 0 || phase == 1)) {
        if (phase == 1) {   /* a launch of its own (the shim): the rows again, the scores from S */
            att_dec_rows<F>(A, q, t, H, D, hb, hn, K, k0, nkc, v);
            for (int e = threadIdx.x; e < HB * ATT_KC; e += NT) {
                const int h = e / ATT_KC, i = e % ATT_KC;
                if (h < hn && i < nkc) ss[h * SL + i] = X.S[((int64_t)c * H + hb + h) * ATT_KC + i];
            }
        }
        att_query_max<NT, HB>(X, qch, H, hb, hn, mr, Ms, c == 0);   /* M_h over every chunk of the query */
        __syncthreads();
        for (int e = threadIdx.x; e < HB * ATT_KC; e += NT) {
            const int h = e / ATT_KC, i = e % ATT_KC;
            ss[h * SL + i] = h < hn && i < nkc ? expf(ss[h * SL + i] - Ms[h]) : 0.0f;
        }
        __syncthreads();
        if (threadIdx.x < hn) {   /* the chunk's denominator part: its keys in order, by one thread */
            float den = 0.0f;
            for (int i = 0; i < nkc; i++) den += ss[threadIdx.x * SL + i];
            X.pden[(int64_t)c * H + hb + threadIdx.x] = den;
        }
        __syncthreads();
        if (official)   /* the probabilities P.V sees (the denominator above took them unrounded, as the CPU does) */
            for (int e = threadIdx.x; e < HB * ATT_KC; e += NT) ss[(e / ATT_KC) * SL + e % ATT_KC] = dev_round_bf16(ss[(e / ATT_KC) * SL + e % ATT_KC]);
        __syncthreads();
        /* thread: heads 4 hh .. 4 hh + 3 x columns 4 jq .. 4 jq + 3; a warp shares hh (its e loads are broadcasts) and
         * reads 32 consecutive float4 of a row */
        const int nq = (D + 3) / 4, hh = threadIdx.x / (NT / 2);
        for (int jq = threadIdx.x % (NT / 2); jq < nq; jq += NT / 2) {
            float acc[4][4];
#pragma unroll
            for (int b = 0; b < 4; b++)
#pragma unroll
                for (int u = 0; u < 4; u++) acc[b][u] = 0.0f;
#if defined(ATT_FUSED_BUG) && ATT_FUSED_BUG == 1
            for (int i = 0; i < nkc - (nkc > 1); i++) {   /* deliberate: the chunk's last key left out of P.V */
#else
            for (int i = 0; i < nkc; i++) {
#endif
                const float4 vv = *(const float4 *)&v.kf[(int64_t)i * v.ld + 4 * jq];
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    const float pb = ss[(4 * hh + b) * SL + i];
                    acc[b][0] = fmaf(pb, vv.x, acc[b][0]);
                    acc[b][1] = fmaf(pb, vv.y, acc[b][1]);
                    acc[b][2] = fmaf(pb, vv.z, acc[b][2]);
                    acc[b][3] = fmaf(pb, vv.w, acc[b][3]);
                }
            }
#pragma unroll
            for (int b = 0; b < 4; b++) {
                if (4 * hh + b >= hn) continue;
                float *dst = X.part + ((int64_t)c * H + hb + 4 * hh + b) * D;
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (4 * jq + u < D) dst[4 * jq + u] = acc[b][u];
            }
        }
    }
    ATT_TIME_MARK(2);
    if (phase < 0) att_grid_sync(bar, nblocks);
    ATT_TIME_MARK(3);
    /* 3. the group's heads, spread over its blocks */
    if (phase < 0 || phase == 2)
        for (int hl = c; hl < hn; hl += (int)gridDim.x)
            att_combine_head(official, X, K, nch, ATT_KC, hb + hl, H, D, R, sink, freq, p, out_s, o + ((int64_t)t * H + hb + hl) * D);
    ATT_TIME_END();
}

/* ---- a decode step's attention in one launch, on tensor cores (issue 18) ------------------------------------------
 *
 * k_att_dec_mma computes what k_att_scores_mma, k_att_pv_mma and k_att_combine compute — the same numbers, each in
 * the order stated for them above (test_gpu_attention compares its outputs with those of CU_ATT_NO_DEC_MMA's three
 * launches by memcmp) — in one launch whose blocks meet at two grid barriers (att_grid_sync, k_att_dec's residency
 * rule). So OFFICIAL mode can take the tensor cores at every step: a prompt's large steps and its decode steps sum
 * alike, as batch invariance requires.
 *   1. block (chunk c, group of ATT_DM_QH heads): the chunk's stored rows whole into shared memory (cp.async, every
 *      copy in flight at once) and the group's q rows, then both as bf16 pairs [row][column] (the rows decoded to
 *      kv_col's values, q rounded as k_att_scores_mma rounds it; all 16 warps); warp w < 8: keys 8 w .. 8 w + 7 x the
 *      group's 16 heads, one m16n8k16 tile chained over the k-steps of 16 columns in order; S and the chunk's max per
 *      head. Meanwhile warps 8 .. 15 load the block's step-2 rows (they do not depend on step 1): the slice's columns
 *      of its part's rows as bf16, transposed, where the raw rows were.
 *   -- every chunk's scores and maxima are written --
 *   2. block (part u of ATT_PG chunks, slice of ATT_DM_PS columns, group of ATT_HG heads): M_h and the part's scores
 *      (cp.async) in one round trip; e and bf16(e); warp w: heads 16 (w mod 4) .. + 15 x columns 16 (w / 4) .. + 15 of the slice, the
 *      part's chunks in order, their k-steps of 16 keys in order (k_att_pv_mma's chains); the part's denominator
 *      (slice 0: one thread a head, the part's keys in order, e unrounded).
 *   -- every part is written --
 *   3. heads 16 b + w, 16 (b + nb) + w, ... of the query (nb: the launch's blocks a query) combined by warp w as
 *      k_att_combine combines them (parts of ATT_KC ATT_PG keys; a column's sum is one thread's chain either way).
 * Why: at a decode step the three tensor-core launches are small (a 640-key query: 5, 12 and 64 blocks), each mostly
 * fixed latency: run 150 measured decode after a 128K prompt at 61.3 tok/s on the CUDA cores' k_att_dec and 58.3 with
 * them, so the switch could not be on for every step.
 * phase: as k_att_dec's (-1: all three steps and the barriers; 0, 1, 2: one step, the CPU shim). A step run as a launch
 * of its own computes the same: step 2 then loads its rows itself, with all its threads (the same values).
 * -DATT_DM_BUG=1: a deliberate bug (each part's denominator summed in reverse key order: an order, not a value, wrong),
 * to see test_gpu_attention's memcmp against the three kernels fail (tools/gpu/shim/shim_attention.sh with
 * SHIM_CFLAGS=-DATT_DM_BUG=1). Never in a real build. */
#define ATT_DM_T 512                      /* threads: 16 warps (run 152: with 8, the copy, decode and e phases were
                                            latency-bound chains, step 1 21 us a CSA block) */
#define ATT_DM_W (ATT_DM_T / 32)          /* its warps */
#define ATT_DM_U 4                        /* quads / elements a thread decodes before it stores them */
#define ATT_DM_QH 16                      /* heads a block of step 1 (its warps' one 16-row tile) */
#define ATT_DM_PS 64                      /* columns a block of step 2 */
#define ATT_DM_SL (ATT_KC + 4)            /* floats a head's row of a chunk's scores (16-byte rows) */
#define ATT_DM_KL (ATT_PG * ATT_KC + 8)   /* bf16 a row of a part's bf16(e) [head][key] and rows [column][key] */
static_assert(ATT_DM_T == 512 && ATT_HG == 64 && ATT_DM_PS == 64 && ATT_KC == 64,
              "k_att_dec_mma: step 1's MMAs are 8 warps of 8 keys, step 2's 4 head tiles x 4 column quarters, 8 pairs of keys a thread");

/* Its dynamic shared memory (bytes). Step 1 from offset 0; its raw rows are done with once decoded, and there the
 * block's step-2 rows go (kp2, vt: loaded by warps 8 .. 15 while warps 0 .. 7 compute step 1's tiles, before the
 * first barrier, as they do not depend on step 1), then step 2's other arrays; step 3's output rows from 0.
 * ldb: bf16 a q / key row (the columns rounded up to 16 — a k-step's columns past D are zeros — plus 8: the 8 rows of
 * a fragment load fall on distinct banks); rb: bytes a raw stored row (as att_dec_smem's). */
struct att_dm_smem {
    int ldb, rb;
    int64_t kp, red, qs, kb, raw;       /* 1: row addresses [ATT_KC], maxima [8][ATT_DM_QH], q [16][ldb], rows [ATT_KC][ldb], raw */
    int64_t kp2, vt, red2, ms, st, ps;  /* 2: row addresses [ATT_PG ATT_KC], rows [PS][KL], [ATT_DM_T / ATT_HG][ATT_HG], M [ATT_HG],
                                           S [ATT_PG][ATT_HG][SL], bf16(e) [ATT_HG][KL] */
    int64_t bytes;                      /* the largest extent (3: an output row [D] a warp) */
};
static __host__ __device__ __forceinline__ att_dm_smem att_dm_smem_of(int D, int row_bytes) {
    att_dm_smem m;
    m.ldb = (D + 15) / 16 * 16 + 8;
    m.rb = (row_bytes + 15) / 16 * 16 + 16;
    m.kp = 0;
    m.red = m.kp + (int64_t)sizeof(void *) * ATT_KC;
    m.qs = m.red + (int64_t)sizeof(float) * 8 * ATT_DM_QH;
    m.kb = m.qs + (int64_t)2 * ATT_DM_QH * m.ldb;
    m.raw = m.kb + (int64_t)2 * ATT_KC * m.ldb;
    const int64_t one = m.raw + (int64_t)ATT_KC * m.rb;
    m.kp2 = m.raw;
    m.vt = m.kp2 + (int64_t)sizeof(void *) * ATT_PG * ATT_KC;
    m.red2 = m.vt + (int64_t)2 * ATT_DM_PS * ATT_DM_KL;
    m.ms = m.red2 + (int64_t)sizeof(float) * ATT_DM_T;
    m.st = m.ms + (int64_t)sizeof(float) * ATT_HG;
    m.ps = m.st + (int64_t)sizeof(float) * ATT_PG * ATT_HG * ATT_DM_SL;
    const int64_t two = m.ps + (int64_t)2 * ATT_HG * ATT_DM_KL;
    const int64_t three = (int64_t)sizeof(float) * ATT_DM_W * D;
    m.bytes = one > two ? (one > three ? one : three) : (two > three ? two : three);
    return m;
}

/* Blocks a query of a launch of nch chunks: the most any step has work for. */
static __host__ __device__ __forceinline__ int att_dm_blocks(int nch, int H, int D) {
    const int n1 = nch * ((H + ATT_DM_QH - 1) / ATT_DM_QH);
    const int n2 = (nch + ATT_PG - 1) / ATT_PG * ((D + ATT_DM_PS - 1) / ATT_DM_PS) * ((H + ATT_HG - 1) / ATT_HG);
    return n1 > n2 ? n1 : n2;
}

/* What every step of a block needs of its query t: its keys, chunks (qch), scratch, item and sequence layer. */
struct att_dm_query {
    int t, qch;
    att_keys K;
    att_scratch X;
    cu_item it;
    cu_seq_layer L;
};

/* Step 1's staging: chunk c (keys k0 .. k0 + nkc - 1) of query Q and the q rows of heads hb .. hb + hn - 1 (hn <=
 * ATT_DM_QH) into shared memory as bf16 pairs, by all 16 warps; ends with a barrier (after which the raw rows are
 * free: att_dm_vaddr, att_dm_vload). */
template <int F>
__device__ __forceinline__ void att_dm_stage(const att_args &A, const float *q, const att_dm_query &Q, int c, int hb, int hn, int H,
                                             int D, unsigned char *sm, const att_dm_smem &m) {
    constexpr int NT = ATT_DM_T, QH = ATT_DM_QH, QP = 9;   /* QP: q pairs a thread in flight (16 x 264 pairs at D 512: one pass) */
    const uint8_t **kp = (const uint8_t **)(sm + m.kp);
    uint16_t *qs = (uint16_t *)(sm + m.qs), *kb = (uint16_t *)(sm + m.kb);
    uint8_t *raw = sm + m.raw;
    const int ldb = m.ldb, dc = ldb - 8, k0 = c * ATT_KC, nkc = Q.K.nk - k0 < ATT_KC ? Q.K.nk - k0 : ATT_KC;
    const float *qt = q + ((int64_t)Q.t * H + hb) * D;
    const int np = QH * dc / 2;   /* q pairs (zeros past hn and past D) */
    for (int e0 = 0; e0 < np; e0 += QP * NT) {
        float v[QP][2];
#pragma unroll
        for (int u = 0; u < QP; u++) {
            const int e = e0 + threadIdx.x + NT * u, h = e / (dc / 2), j = 2 * (e % (dc / 2));
            const bool in = e < np && h < hn;
            v[u][0] = in && j < D ? qt[(int64_t)h * D + j] : 0.0f;
            v[u][1] = in && j + 1 < D ? qt[(int64_t)h * D + j + 1] : 0.0f;
        }
        if (e0 == 0)   /* the row addresses while the first pass's q loads are in flight */
            for (int i = threadIdx.x; i < nkc; i += NT)
                kp[i] = att_key_row(A.lay, Q.K, k0 + i, Q.it, Q.L, A.kvs, A.ring_len, A.ratio, A.sel + (int64_t)Q.t * A.topk);
#pragma unroll
        for (int u = 0; u < QP; u++) {
            const int e = e0 + threadIdx.x + NT * u;
            if (e < np) *(uint32_t *)&qs[(e / (dc / 2)) * ldb + 2 * (e % (dc / 2))] = bf16x2(v[u][0], v[u][1]);
        }
    }
    __syncthreads();   /* kp is written */
    att_copy_rows(A.lay, kp, nkc, raw, m.rb, NT);
    att_cp_wait();
    __syncthreads();   /* every thread's copies have landed */
    {   /* the rows as bf16 pairs: quad j of row r (rows past nkc and columns past D: zeros), ATT_DM_U quads decoded
         * before any is stored (their shared-memory loads in flight together) */
        const int nq = dc / 4;
        for (int e0 = 0; e0 < ATT_KC * nq; e0 += ATT_DM_U * NT) {
            float4 x[ATT_DM_U];
#pragma unroll
            for (int u = 0; u < ATT_DM_U; u++) {
                const int e = e0 + threadIdx.x + NT * u, r = e / nq, j = 4 * (e % nq);
                x[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (r < nkc) x[u] = att_decode4<F>(A.lay, raw + (int64_t)r * m.rb + ((uintptr_t)kp[r] & 15), j, D);
            }
#pragma unroll
            for (int u = 0; u < ATT_DM_U; u++) {
                const int e = e0 + threadIdx.x + NT * u;
                if (e < ATT_KC * nq) *(uint2 *)&kb[(e / nq) * ldb + 4 * (e % nq)] = make_uint2(bf16x2(x[u].x, x[u].y), bf16x2(x[u].z, x[u].w));
            }
        }
    }
    __syncthreads();   /* the raw rows are free from here */
}

/* Step 1's tiles, by warp w < 8 of a block that staged chunk c (att_dm_stage): keys 8 w .. 8 w + 7 x the 16 heads,
 * one m16n8k16 tile chained over the k-steps of 16 columns in order; S, and the warp's maxima per head into red[w]. */
__device__ __forceinline__ void att_dm_tiles(const att_dm_query &Q, int c, int hb, int hn, int H, int D, unsigned char *sm,
                                             const att_dm_smem &m) {
    constexpr int QH = ATT_DM_QH;
    float (*red)[QH] = (float (*)[QH])(sm + m.red);
    const uint16_t *qs = (const uint16_t *)(sm + m.qs), *kb = (const uint16_t *)(sm + m.kb);
    const int ldb = m.ldb, nkc = Q.K.nk - c * ATT_KC < ATT_KC ? Q.K.nk - c * ATT_KC : ATT_KC;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, qd = lane & 3;
    float acc[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    if (8 * w < nkc) {   /* the warp's keys 8 w .. 8 w + 7 (rows past nkc are zeros) */
        const uint16_t *qa = qs + g * ldb + 2 * qd, *qb = qa + 8 * ldb, *kr = kb + (8 * w + g) * ldb + 2 * qd;
#pragma unroll 4
        for (int kk = 0; kk < D; kk += 16)
            mma_bf16(acc, ld_b32(qa + kk), ATT_A12(ld_b32(qb + kk), ld_b32(qa + kk + 8)), ld_b32(qb + kk + 8), ld_b32(kr + kk), ld_b32(kr + kk + 8));
    }
    const float scale = 1.0f / sqrtf((float)D);
    float mx[2] = { -INFINITY, -INFINITY };   /* heads g, g + 8 */
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int r = 8 * w + 2 * qd + (e & 1), h = g + 8 * (e >> 1);
        const float s = acc[e] * scale;
        if (r < nkc) {
            mx[e >> 1] = fmaxf(mx[e >> 1], s);
            if (h < hn) Q.X.S[((int64_t)c * H + hb + h) * ATT_KC + r] = s;
        }
    }
    /* the 4 lanes of a group (then att_dm_cmax over the 8 warps): a max, exact in any order */
#pragma unroll
    for (int u = 0; u < 2; u++) {
        for (int off = 1; off < 4; off <<= 1) mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], off));
        if (qd == 0) red[w][g + 8 * u] = mx[u];
    }
}

/* Step 1's chunk maxima, after a barrier behind att_dm_tiles: thread h < hn takes head hb + h's over the 8 warps. */
__device__ __forceinline__ void att_dm_cmax(const att_dm_query &Q, int c, int hb, int hn, int H, unsigned char *sm, const att_dm_smem &m) {
    const float (*red)[ATT_DM_QH] = (const float (*)[ATT_DM_QH])(sm + m.red);
    if (threadIdx.x < hn) {
        float x = red[0][threadIdx.x];
        for (int ww = 1; ww < 8; ww++) x = fmaxf(x, red[ww][threadIdx.x]);
        Q.X.cmax[(int64_t)c * H + hb + threadIdx.x] = x;
    }
}

/* Step 2's rows, in two halves with a barrier between: att_dm_vaddr the addresses of part u's keys (kp2), then
 * att_dm_vload the part's rows' columns j0 .. j0 + ATT_DM_PS - 1 as bf16, transposed (vt [column][key], zeros past
 * the part's keys and past D; att_load_vt), ATT_DM_VB pairs' loads a thread in flight at once. By the block's last
 * NTH threads (x = their index): all of them, or warps 8 .. 15 beside step 1's tiles. */
#define ATT_DM_VB 8
__device__ __forceinline__ int att_dm_part_keys(const att_dm_query &Q, int u) {
    const int c_first = u * ATT_PG, ncp = Q.qch - c_first < ATT_PG ? Q.qch - c_first : ATT_PG;
    return Q.K.nk - c_first * ATT_KC < ncp * ATT_KC ? Q.K.nk - c_first * ATT_KC : ncp * ATT_KC;
}
template <int NTH>
__device__ __forceinline__ void att_dm_vaddr(const att_args &A, const att_dm_query &Q, int u, int x, unsigned char *sm, const att_dm_smem &m) {
    const uint8_t **kp = (const uint8_t **)(sm + m.kp2);
    const int nkp = att_dm_part_keys(Q, u);
    for (int i = x; i < nkp; i += NTH)
        kp[i] = att_key_row(A.lay, Q.K, u * ATT_PG * ATT_KC + i, Q.it, Q.L, A.kvs, A.ring_len, A.ratio, A.sel + (int64_t)Q.t * A.topk);
}
template <int F, int NTH>
__device__ __forceinline__ void att_dm_vload(const att_args &A, const att_dm_query &Q, int u, int j0, int D, int x, unsigned char *sm,
                                             const att_dm_smem &m) {
    constexpr int PV = ATT_PG * ATT_KC / (2 * NTH / ATT_DM_PS);
    att_load_vt<F, ATT_DM_PS, NTH, PV, ATT_DM_VB, 1>(A.lay, (const uint8_t *const *)(sm + m.kp2), att_dm_part_keys(Q, u), j0, D, x,
                                                 (uint16_t (*)[ATT_DM_KL])(sm + m.vt));
}

/* Step 2 after its rows (att_dm_vaddr, att_dm_vload): part u (chunks ATT_PG u .. min(ATT_PG (u + 1), qch) - 1) of query Q, columns j0 .. j0 +
 * ATT_DM_PS - 1, heads hb .. hb + hn - 1 (hn <= ATT_HG). */
__device__ __forceinline__ void att_dm_pv(const att_dm_query &Q, int u, int j0, int hb, int hn, int H, int D, unsigned char *sm,
                                          const att_dm_smem &m) {
    constexpr int NT = ATT_DM_T, SL = ATT_DM_SL, KL = ATT_DM_KL, HG = ATT_HG;
    float (*red)[HG] = (float (*)[HG])(sm + m.red2);
    float *Ms = (float *)(sm + m.ms);
    float (*st)[HG][SL] = (float (*)[HG][SL])(sm + m.st);
    uint16_t (*ps)[KL] = (uint16_t (*)[KL])(sm + m.ps), (*vt)[KL] = (uint16_t (*)[KL])(sm + m.vt);
    const att_keys &K = Q.K;
    const att_scratch &X = Q.X;
    const int c_first = u * ATT_PG, ncp = Q.qch - c_first < ATT_PG ? Q.qch - c_first : ATT_PG;   /* the part's chunks */
    /* the part's scores, [chunk][head][key] (keys past a chunk's last: whatever the scratch holds, never used) */
    const float *S0 = X.S + ((int64_t)c_first * H + hb) * ATT_KC;
    if ((uintptr_t)X.S % 16 == 0) {
        for (int e = threadIdx.x; e < ncp * HG * (ATT_KC / 4); e += NT) {
            const int cl = e / (HG * (ATT_KC / 4)), h = e / (ATT_KC / 4) % HG, i = 4 * (e % (ATT_KC / 4));
            if (h < hn) att_cp16(&st[cl][h][i], S0 + ((int64_t)cl * H + h) * ATT_KC + i);
        }
    } else   /* a scratch not 16-byte aligned (a query of H * (ATT_KC + 2 + D) + H floats of odd size: tests) */
        for (int e = threadIdx.x; e < ncp * HG * ATT_KC; e += NT) {
            const int cl = e / (HG * ATT_KC), h = e / ATT_KC % HG, i = e % ATT_KC;
            if (h < hn) st[cl][h][i] = att_ld(S0 + ((int64_t)cl * H + h) * ATT_KC + i);
        }
    att_query_max<NT, HG>(X, Q.qch, H, hb, hn, red, Ms, u == 0 && j0 == 0);   /* M_h over every chunk of the query */
    att_cp_wait();
    __syncthreads();   /* Ms and every thread's copies of the scores */
    /* e (in place of the scores) and bf16(e), ATT_DM_U elements a thread computed before any is stored */
    for (int e0 = 0; e0 < ncp * HG * ATT_KC; e0 += ATT_DM_U * NT) {
        float x[ATT_DM_U];
#pragma unroll
        for (int v = 0; v < ATT_DM_U; v++) {
            const int e = e0 + threadIdx.x + NT * v, cl = e / (HG * ATT_KC), h = e / ATT_KC % HG, i = e % ATT_KC;
            const int nkc = K.nk - (c_first + cl) * ATT_KC < ATT_KC ? K.nk - (c_first + cl) * ATT_KC : ATT_KC;
            x[v] = e < ncp * HG * ATT_KC && h < hn && i < nkc ? expf(st[cl][h][i] - Ms[h]) : 0.0f;
        }
#pragma unroll
        for (int v = 0; v < ATT_DM_U; v++) {
            const int e = e0 + threadIdx.x + NT * v, cl = e / (HG * ATT_KC), h = e / ATT_KC % HG, i = e % ATT_KC;
            if (e < ncp * HG * ATT_KC) {
                st[cl][h][i] = x[v];
                ps[h][cl * ATT_KC + i] = dev_f32_to_bf16(x[v]);   /* the probabilities P.V sees; the denominator takes them unrounded */
            }
        }
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, qd = lane & 3;
    const int hr = 16 * (w & 3) + g, cw = 16 * (w >> 2);   /* the warp's first head and first column of the slice */
    if (16 * (w & 3) < hn && j0 + cw < D) {
        float acc[2][4];
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
        for (int cl = 0; cl < ncp; cl++) {
            const int nkc = K.nk - (c_first + cl) * ATT_KC < ATT_KC ? K.nk - (c_first + cl) * ATT_KC : ATT_KC;
            for (int ks = cl * ATT_KC; ks < cl * ATT_KC + nkc; ks += 16) att_pv_step(acc, ps, vt, hr, cw, ks, g, qd);
        }
        att_pv_store(acc, X, u, H, hb, hn, hr, j0 + cw, D, qd);
    }
    if (j0 == 0 && threadIdx.x < hn) {   /* the part's denominator: its keys in order, by one thread */
        float den = 0.0f;
        for (int cl = 0; cl < ncp; cl++) {
            const int nkc = K.nk - (c_first + cl) * ATT_KC < ATT_KC ? K.nk - (c_first + cl) * ATT_KC : ATT_KC;
#if defined(ATT_DM_BUG) && ATT_DM_BUG == 1
            for (int i = nkc - 1; i >= 0; i--) den += st[cl][threadIdx.x][i];   /* deliberate: the keys in reverse order */
#else
#pragma unroll 8
            for (int i = 0; i < nkc; i++) den += st[cl][threadIdx.x][i];
#endif
        }
        X.pden[(int64_t)u * H + hb + threadIdx.x] = den;
    }
}

template <int F>
__global__ void __launch_bounds__(ATT_DM_T, 1) k_att_dec_mma(int official, att_args A, const float *q, int t0, int nch, int H, int D,
                                                             const float *sink, const float *freq, int R, float *scratch, float *o,
                                                             unsigned *bar, int phase) {
    dev_grid_wait();
    ATT_TIME_BEGIN(6);
    extern __shared__ __align__(16) unsigned char att_dec_smem_base[];
    const att_dm_smem m = att_dm_smem_of(D, A.lay.bytes);
    const int slot = blockIdx.z, b = blockIdx.x;
    att_dm_query Q;
    Q.t = t0 + slot;
    const int64_t p = A.pos[Q.t];
    Q.K = att_keys_of(p, Q.t, A.W, A.ratio, A.n_sel);
    Q.qch = (Q.K.nk + ATT_KC - 1) / ATT_KC;
    if (Q.qch > nch) Q.qch = nch;   /* a key list longer than the launch's (a caller's bug): step 3 writes NaN */
    Q.X = att_scratch_of(scratch, slot, nch, H, D);
    const int item = A.item_of[Q.t];
    Q.it = A.items[item];
    Q.L = A.sl[item];
    const unsigned nblocks = gridDim.x * gridDim.y * gridDim.z;
    const int n_qh = (H + ATT_DM_QH - 1) / ATT_DM_QH, n_hg = (H + ATT_HG - 1) / ATT_HG, n_ds = (D + ATT_DM_PS - 1) / ATT_DM_PS;
    /* step 2's block: part b / (n_ds n_hg), column slice b / n_hg mod n_ds, head group b mod n_hg */
    const int u = b / (n_ds * n_hg), j0 = b / n_hg % n_ds * ATT_DM_PS, hb2 = b % n_hg * ATT_HG;
    const bool pv = u * ATT_PG < Q.qch;
    /* 1. scores: block b = chunk b / n_qh, head group b mod n_qh. Beside the tiles of warps 0 .. 7, warps 8 .. 15 load
     * the block's step-2 rows (pre). Every warp meets the same block-wide barriers (no named ones: a barrier 0 of
     * one warp could otherwise pair with another barrier 0 of another). */
    const bool s1 = phase <= 0 && b < nch * n_qh && b / n_qh < Q.qch, pre = phase < 0 && pv;
    const int c1 = b / n_qh, hb1 = b % n_qh * ATT_DM_QH, hn1 = H - hb1 < ATT_DM_QH ? H - hb1 : ATT_DM_QH, w = threadIdx.x >> 5;
    if (s1) att_dm_stage<F>(A, q, Q, c1, hb1, hn1, H, D, att_dec_smem_base, m);
    if (s1 && w < 8) att_dm_tiles(Q, c1, hb1, hn1, H, D, att_dec_smem_base, m);
    if (pre && w >= 8) att_dm_vaddr<ATT_DM_T / 2>(A, Q, u, (int)threadIdx.x - ATT_DM_T / 2, att_dec_smem_base, m);
    if (s1 || pre) __syncthreads();
    if (s1) att_dm_cmax(Q, c1, hb1, hn1, H, att_dec_smem_base, m);
    if (pre && w >= 8) att_dm_vload<F, ATT_DM_T / 2>(A, Q, u, j0, D, (int)threadIdx.x - ATT_DM_T / 2, att_dec_smem_base, m);
    ATT_TIME_MARK(0);
    if (phase < 0) att_grid_sync(bar, nblocks);
    ATT_TIME_MARK(1);
    /* 2. P.V (a launch of its own, the shim: its rows first, by every thread) */
    if ((phase < 0 || phase == 1) && pv) {
        if (phase == 1) {
            att_dm_vaddr<ATT_DM_T>(A, Q, u, (int)threadIdx.x, att_dec_smem_base, m);
            __syncthreads();
            att_dm_vload<F, ATT_DM_T>(A, Q, u, j0, D, (int)threadIdx.x, att_dec_smem_base, m);
        }
        att_dm_pv(Q, u, j0, hb2, H - hb2 < ATT_HG ? H - hb2 : ATT_HG, H, D, att_dec_smem_base, m);
    }
    ATT_TIME_MARK(2);
    if (phase < 0) att_grid_sync(bar, nblocks);
    ATT_TIME_MARK(3);
    /* 3. the query's heads, one a warp: head w + 16 b, then + 16 nb, ... (every warp its own output row in shared memory) */
    if (phase < 0 || phase == 2) {
        constexpr int NW = ATT_DM_W;
        for (int h = w + NW * b; h < H; h += NW * (int)gridDim.x)
            att_combine_head<true>(official, Q.X, Q.K, nch, ATT_KC * ATT_PG, h, H, D, R, sink, freq, p, (float *)att_dec_smem_base + w * D,
                                   o + ((int64_t)Q.t * H + h) * D);
    }
    ATT_TIME_END();
}

static int64_t att_chunks(int64_t max_keys) { return (max_keys + ATT_KC - 1) / ATT_KC; }

/* The measuring build's second question: does a launch of k_att_scores_dec right after another (what the first
 * left in the SMs' caches) take less time? */
extern "C" int cu_att_block_times_twice(int twice) {
#if ATT_BLOCK_TIMES
    att_times_twice = twice;
    return 0;
#else
    (void)twice;
    return -1;
#endif
}

extern "C" int cu_attention_key_limit(int H, int D) {
    /* one query's scratch (its chunks' scores, maxima, denominators and outputs) stays under ATT_QUERY_MAX_FLOATS */
    const int64_t per_chunk = att_query_floats(1, H, D) - H;
    const int64_t keys = (ATT_QUERY_MAX_FLOATS - H) / per_chunk * ATT_KC;
    return keys < INT32_MAX ? (int)keys : INT32_MAX;
}

extern "C" int64_t cu_attention_scratch_floats(int T, int H, int D, int64_t max_keys) {
    const int64_t per = att_query_floats(att_chunks(max_keys > 0 ? max_keys : 1), H, D);
    int64_t g = ATT_BUDGET_FLOATS / per;
    if (g > T) g = T;
    if (g > ATT_GROUP_MAX) g = ATT_GROUP_MAX;
    if (g < 1) g = 1;
    return g * per;
}

/* Queries a launch of cu_attention: as many as the scratch holds, at most T and ATT_GROUP_MAX (< 1: none fits). */
static int64_t att_group(int64_t scratch_floats, int64_t per_query, int T) {
    int64_t g = scratch_floats / per_query;
    if (g > T) g = T;
    if (g > ATT_GROUP_MAX) g = ATT_GROUP_MAX;
    return g;
}

/* Opts kernel k (k_att_scores_dec) into the device's whole shared memory a block, once it is known to need at most
 * that (bytes); returns the device's SM count (a launch of at most that many blocks is one wave), or 0 where the
 * kernel cannot run (then k_att_scores computes the same numbers). The attribute is the kernel's and a captured
 * graph runs its launches later (cu_graph.h): it is always the device's largest, never this launch's. */
template <typename K> static int att_dec_optin(K k, int64_t bytes) {
    int dev = 0, optin = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || bytes > optin ||
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, optin) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return sms;
}

/* The decode kernels' SM counts for rows of format fmt (0: the kernel cannot run here; att_dec_optin): dec for
 * k_att_scores_dec, fused for k_att_dec; mma for k_att_dec_mma (tc: the tensor-core path, whose only decode kernel
 * it is; the others 0). */
struct att_dec_sms {
    int dec, fused, mma;
};
static att_dec_sms att_dec_sms_of(int fmt, int D, int row_bytes, int tc) {
    att_dec_sms s = { 0, 0, 0 };
    const int64_t dm_bytes = att_dm_smem_of(D, row_bytes).bytes;
    if (tc)
        s.mma = fmt == KV_F32 ? att_dec_optin(k_att_dec_mma<KV_F32>, dm_bytes)
              : fmt == KV_BF16 ? att_dec_optin(k_att_dec_mma<KV_BF16>, dm_bytes) : att_dec_optin(k_att_dec_mma<DSV4_KV_FP8>, dm_bytes);
    else if (fmt == KV_F32) {
        s.dec = att_dec_optin(k_att_scores_dec<KV_F32>, att_dec_smem_of(D, row_bytes, KV_F32).bytes);
        s.fused = att_dec_optin(k_att_dec<KV_F32>, att_fused_smem_of(D, row_bytes, KV_F32).bytes);
    } else if (fmt == KV_BF16) {
        s.dec = att_dec_optin(k_att_scores_dec<KV_BF16>, att_dec_smem_of(D, row_bytes, KV_BF16).bytes);
        s.fused = att_dec_optin(k_att_dec<KV_BF16>, att_fused_smem_of(D, row_bytes, KV_BF16).bytes);
    } else {
        s.dec = att_dec_optin(k_att_scores_dec<DSV4_KV_FP8>, att_dec_smem_of(D, row_bytes, DSV4_KV_FP8).bytes);
        s.fused = att_dec_optin(k_att_dec<DSV4_KV_FP8>, att_fused_smem_of(D, row_bytes, DSV4_KV_FP8).bytes);
    }
    return s;
}

/* Which kernels a launch of n queries of nch chunks takes (the same bits whichever). CUDA cores: 2 k_att_dec (one
 * launch: barrier words given, not CU_ATT_NO_FUSED), 1 k_att_scores_dec then k_att_pv and k_att_combine, 0
 * k_att_scores then those two. Tensor cores (tc): 3 k_att_dec_mma (barrier words given, not CU_ATT_NO_DEC_MMA), 0
 * k_att_scores_mma, k_att_pv_mma and k_att_combine. Every decode kernel needs all the launch's blocks (one an SM)
 * in one wave. */
static int att_dec_kind(int tc, int flags, int has_bar, att_dec_sms sms, int64_t n, int64_t nch, int H, int D) {
    if (flags & CU_ATT_NO_DEC) return 0;
    if (tc)
        return has_bar && !(flags & CU_ATT_NO_DEC_MMA) && sms.mma && nch <= INT32_MAX / ATT_KC &&
               n * att_dm_blocks((int)nch, H, D) <= sms.mma ? 3 : 0;
    const int64_t blocks = n * nch * ((H + ATT_DHG - 1) / ATT_DHG);
    if (has_bar && !(flags & CU_ATT_NO_FUSED) && sms.fused && blocks <= sms.fused) return 2;
    return sms.dec && blocks <= sms.dec ? 1 : 0;
}

/* Launches of cu_attention (groups of queries) that take kind `want` of att_dec_kind. */
static int att_dec_count(int official, int mma, cu_kvlay lay, int T, int H, int D, int max_keys, int64_t scratch_floats, int has_bar, int want) {
    if (T <= 0) return 0;
    const int tc = official && (mma & CU_ATT_MMA);
    const int64_t nch = att_chunks(max_keys > 0 ? max_keys : 1);
    const int64_t g = att_group(scratch_floats, att_query_floats(nch, H, D), T);
    if (g < 1) return 0;
    const att_dec_sms sms = att_dec_sms_of(lay.fmt, D, lay.bytes, tc);
    int launches = 0;
    for (int t0 = 0; t0 < T; t0 += (int)g)
        launches += att_dec_kind(tc, mma, has_bar, sms, T - t0 < g ? T - t0 : g, nch, H, D) >= want;
    return launches;
}

extern "C" int cu_attention_decode_launches(int official, int mma, cu_kvlay lay, int T, int H, int D, int max_keys, int64_t scratch_floats) {
    return att_dec_count(official, mma | CU_ATT_NO_FUSED, lay, T, H, D, max_keys, scratch_floats, 0, 1);
}

extern "C" int cu_attention_fused_launches(int official, int mma, cu_kvlay lay, int T, int H, int D, int max_keys, int64_t scratch_floats) {
    return att_dec_count(official, mma, lay, T, H, D, max_keys, scratch_floats, 1, 2);
}

/* The CPU shim (tools/gpu/shim) runs a launch's blocks one after another: k_att_dec's steps as three launches. */
#ifdef ATT_SPLIT_PHASES
#define ATT_PHASE_FIRST 0
#define ATT_PHASE_LAST 2
#else
#define ATT_PHASE_FIRST -1
#define ATT_PHASE_LAST -1
#endif

extern "C" int cu_attention(cu_stream st, int official, int mma, cu_kvlay lay, const float *q, const uint8_t *kvs, const int64_t *pos,
                            const int32_t *item_of, const cu_item *items, const cu_seq_layer *sl, int ring_len, int W, int ratio,
                            const int32_t *sel, const int32_t *n_sel, int topk, const float *sink, const float *freq, int T,
                            int H, int D, int R, int max_keys, float *scratch, int64_t scratch_floats, unsigned *bar, float *o) {
    if (T <= 0 || (DIAG_SKIP & 4)) return 0;
    const int tc = official && (mma & CU_ATT_MMA);   /* EXACT mode keeps the fp32 path */
    const int64_t nch = att_chunks(max_keys > 0 ? max_keys : 1);
    const int64_t g = att_group(scratch_floats, att_query_floats(nch, H, D), T);
    if (g < 1 || nch > INT32_MAX / ATT_KC) return -1;
    if (!(lay.fmt == KV_F32 || lay.fmt == KV_BF16 || (lay.fmt == DSV4_KV_FP8 && lay.kind != ROW_INDEX))) return -1;   /* no other row holds keys */
    const att_args A = { lay, kvs, pos, item_of, items, sl, sel, n_sel, ring_len, W, ratio, topk };
    const unsigned n_hg = (unsigned)((H + ATT_HG - 1) / ATT_HG), n_sl = (unsigned)((D + ATT_DS - 1) / ATT_DS);
    const unsigned n_sg = (unsigned)((H + ATT_SHG - 1) / ATT_SHG), n_pg = (unsigned)((H + ATT_PHG - 1) / ATT_PHG);
    const unsigned n_bg = (unsigned)((H + ATT_SHG_BIG - 1) / ATT_SHG_BIG);
    const unsigned n_dg = (unsigned)((H + ATT_DHG - 1) / ATT_DHG);
    /* the row format as a template argument: branch-free loads (att_load_rows); a main row of the three formats */
    void (*scores)(att_args, const float *, int, int, int, int, float *) = lay.fmt == KV_F32 ? k_att_scores<ATT_SHG, KV_F32>
        : lay.fmt == KV_BF16 ? k_att_scores<ATT_SHG, KV_BF16> : k_att_scores<ATT_SHG, DSV4_KV_FP8>;
    void (*scores_big)(att_args, const float *, int, int, int, int, float *) = lay.fmt == KV_F32 ? k_att_scores<ATT_SHG_BIG, KV_F32>
        : lay.fmt == KV_BF16 ? k_att_scores<ATT_SHG_BIG, KV_BF16> : k_att_scores<ATT_SHG_BIG, DSV4_KV_FP8>;
    void (*pv)(int, att_args, int, int, int, int, int, float *) = lay.fmt == KV_F32 ? k_att_pv<ATT_PHG, KV_F32>
        : lay.fmt == KV_BF16 ? k_att_pv<ATT_PHG, KV_BF16> : k_att_pv<ATT_PHG, DSV4_KV_FP8>;
    void (*scores_mma)(att_args, const float *, int, int, int, int, float *) = lay.fmt == KV_F32 ? k_att_scores_mma<KV_F32>
        : lay.fmt == KV_BF16 ? k_att_scores_mma<KV_BF16> : k_att_scores_mma<DSV4_KV_FP8>;
    void (*pv_mma)(att_args, int, int, int, int, float *) = lay.fmt == KV_F32 ? k_att_pv_mma<KV_F32>
        : lay.fmt == KV_BF16 ? k_att_pv_mma<KV_BF16> : k_att_pv_mma<DSV4_KV_FP8>;
    void (*scores_dec)(att_args, const float *, int, int, int, int, float *) = lay.fmt == KV_F32 ? k_att_scores_dec<KV_F32>
        : lay.fmt == KV_BF16 ? k_att_scores_dec<KV_BF16> : k_att_scores_dec<DSV4_KV_FP8>;
    void (*fused)(int, att_args, const float *, int, int, int, int, const float *, const float *, int, float *, float *, unsigned *, int) =
        lay.fmt == KV_F32 ? k_att_dec<KV_F32> : lay.fmt == KV_BF16 ? k_att_dec<KV_BF16> : k_att_dec<DSV4_KV_FP8>;
    void (*fused_mma)(int, att_args, const float *, int, int, int, int, const float *, const float *, int, float *, float *, unsigned *, int) =
        lay.fmt == KV_F32 ? k_att_dec_mma<KV_F32> : lay.fmt == KV_BF16 ? k_att_dec_mma<KV_BF16> : k_att_dec_mma<DSV4_KV_FP8>;
    /* the decode kernels for a launch whose blocks fit in one wave (the same bits either way) */
    const att_dec_sms sms = mma & CU_ATT_NO_DEC ? att_dec_sms{ 0, 0, 0 } : att_dec_sms_of(lay.fmt, D, lay.bytes, tc);
    const int64_t dec_bytes = att_dec_smem_of(D, lay.bytes, lay.fmt).bytes, fused_bytes = att_fused_smem_of(D, lay.bytes, lay.fmt).bytes;
    const int64_t dm_bytes = att_dm_smem_of(D, lay.bytes).bytes;
    cudaStream_t s = (cudaStream_t)st;
    const unsigned n_parts = (unsigned)((nch + ATT_PG - 1) / ATT_PG), n_ps = (unsigned)((D + ATT_PS - 1) / ATT_PS);
    const int kpp = tc ? ATT_KC * ATT_PG : ATT_KC;
    for (int t0 = 0; t0 < T; t0 += (int)g) {
        const unsigned n = (unsigned)(T - t0 < g ? T - t0 : g);
        const int kind = att_dec_kind(tc, mma, bar != NULL, sms, n, nch, H, D);
        if (kind == 3) {
            const unsigned nb = (unsigned)att_dm_blocks((int)nch, H, D);
            for (int ph = ATT_PHASE_FIRST; ph <= ATT_PHASE_LAST; ph++)
                fused_mma<<<dim3(nb, 1, n), ATT_DM_T, (size_t)dm_bytes, s>>>(official, A, q, t0, (int)nch, H, D, sink, freq, R, scratch, o, bar, ph);
            continue;
        }
        if (kind == 2) {
            for (int ph = ATT_PHASE_FIRST; ph <= ATT_PHASE_LAST; ph++)
                fused<<<dim3((unsigned)nch, n_dg, n), ATT_DEC_T, (size_t)fused_bytes, s>>>(official, A, q, t0, (int)nch, H, D, sink, freq, R,
                                                                                          scratch, o, bar, ph);
            continue;
        }
        if (tc) {
            scores_mma<<<dim3((unsigned)((nch + ATT_SC - 1) / ATT_SC), n_hg, n), ATT_SC_T, 0, s>>>(A, q, t0, (int)nch, H, D, scratch);
            pv_mma<<<dim3(n_parts, n_hg * n_ps, n), ATT_PV_T, 0, s>>>(A, t0, (int)nch, H, D, scratch);
        } else {
#if ATT_BLOCK_TIMES
            const int dec_runs = 1 + att_times_twice;   /* a second launch finds what the first left */
#else
            const int dec_runs = 1;
#endif
            if (kind == 1)
                for (int run = 0; run < dec_runs; run++)
                    scores_dec<<<dim3((unsigned)nch, n_dg, n), ATT_DEC_T, (size_t)dec_bytes, s>>>(A, q, t0, (int)nch, H, D, scratch);
            else if ((int64_t)nch * n_sg * n >= ATT_SCORES_MANY)
                scores_big<<<dim3((unsigned)nch, n_bg, n), 4 * ATT_SHG_BIG, 0, s>>>(A, q, t0, (int)nch, H, D, scratch);
            else
                scores<<<dim3((unsigned)nch, n_sg, n), 4 * ATT_SHG, 0, s>>>(A, q, t0, (int)nch, H, D, scratch);
            /* a large launch gives each P.V block ATT_PV_NS column slices: fewer blocks, e and the denominator
             * computed once for them; a decode-sized one keeps a block a slice (more SMs at work) */
            const unsigned ns = (int64_t)nch * n_pg * n_sl * n >= ATT_PV_MANY ? ATT_PV_NS : 1, n_sb = (n_sl + ns - 1) / ns;
            pv<<<dim3((unsigned)nch, n_pg * n_sb, n), 4 * ATT_PHG, 0, s>>>(official, A, t0, (int)nch, H, D, (int)ns, scratch);
        }
        k_att_combine<<<dim3((unsigned)H, n), ATT_COMBINE_T, sizeof(float) * (size_t)D, s>>>(official, pos, n_sel, W, ratio, sink,
                                                                                         freq, t0, (int)nch, kpp, H, D, R, scratch, o);
    }
    return 0;
}
#endif

#if !ATT_CHUNKED
extern "C" int cu_attention_key_limit(int H, int D) {
    (void)H;
    (void)D;
    int dev = 0, limit = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return (limit - 1024) / (int)(sizeof(void *) + sizeof(float));
}

extern "C" int cu_attention(cu_stream st, int official, int mma, cu_kvlay lay, const float *q, const uint8_t *kvs, const int64_t *pos,
                            const int32_t *item_of, const cu_item *items, const cu_seq_layer *sl, int ring_len, int W, int ratio,
                            const int32_t *sel, const int32_t *n_sel, int topk, const float *sink, const float *freq, int T,
                            int H, int D, int R, int max_keys, float *scratch, int64_t scratch_floats, unsigned *bar, float *o) {
    (void)mma;   /* the kernel before issue 18 has no tensor-core path */
    (void)scratch;
    (void)scratch_floats;
    (void)bar;
    if (T <= 0) return 0;
    const size_t smem = (sizeof(void *) + sizeof(float)) * (size_t)max_keys;
    if (smem > 48 * 1024) {
        const int limit = cu_attention_key_limit(H, D);
        if (max_keys > limit) return -1;
        /* always the largest size any launch may ask for, never this launch's: the attribute is the kernel's, and a
         * captured graph (cu_graph.h) runs its launches after later calls have set it again (the layers' max_keys
         * differ), so it must never shrink. It is a cap, the launch still takes smem. */
        cudaFuncSetAttribute(k_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)((sizeof(void *) + sizeof(float)) * (size_t)limit));
    }
    k_attention<<<dim3(T, H), ATT_THREADS, smem, (cudaStream_t)st>>>(official, lay, q, kvs, pos, item_of, items, sl, ring_len, W,
                                                                    ratio, sel, n_sel, topk, sink, freq, H, D, R, max_keys, o);
    return 0;
}

extern "C" int64_t cu_attention_scratch_floats(int T, int H, int D, int64_t max_keys) {
    (void)T; (void)H; (void)D; (void)max_keys;
    return 1;
}

extern "C" int cu_attention_decode_launches(int official, int mma, cu_kvlay lay, int T, int H, int D, int max_keys, int64_t scratch_floats) {
    (void)official; (void)mma; (void)lay; (void)T; (void)H; (void)D; (void)max_keys; (void)scratch_floats;
    return 0;
}

extern "C" int cu_attention_fused_launches(int official, int mma, cu_kvlay lay, int T, int H, int D, int max_keys, int64_t scratch_floats) {
    (void)official; (void)mma; (void)lay; (void)T; (void)H; (void)D; (void)max_keys; (void)scratch_floats;
    return 0;
}
#endif

__global__ void k_ring_write(cu_kvlay lay, const uint8_t *kvs, const int64_t *pos, const int32_t *item_of, const cu_item *items,
                             const cu_seq_layer *sl, int ring_len) {
    dev_grid_wait();
    const int t = blockIdx.x;
    const cu_item it = items[item_of[t]];
    const int64_t p = pos[t];
    if (p < it.p0 + it.n - ring_len) return;   /* a later position of the step owns this slot */
    uint8_t *dst = sl[item_of[t]].ring + (p % ring_len) * lay.bytes;
    const uint8_t *src = kvs + (int64_t)t * lay.bytes;
    for (int i = threadIdx.x; i < lay.bytes; i += blockDim.x) dst[i] = src[i];
}

extern "C" void cu_ring_write(cu_stream st, cu_kvlay lay, const uint8_t *kvs, const int64_t *pos, const int32_t *item_of,
                              const cu_item *items, const cu_seq_layer *sl, int ring_len, int T) {
    if (T > 0) k_ring_write<<<T, 128, 0, (cudaStream_t)st>>>(lay, kvs, pos, item_of, items, sl, ring_len);
}
