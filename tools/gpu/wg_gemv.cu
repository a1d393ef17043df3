/* Native FP8 wgmma for decode-sized linears: how fast, how exact, how batch-invariant? (issue 18; the numerics
 * question of docs/PREFILL_GEMM.md)
 *
 * Today's OFFICIAL GPU linears compute each 32-column step on mma.sync e4m3, which sm_90 runs as two fp16 MMAs and
 * an add after converting every byte to fp16 (run 90). At decode, the weight kernels are bound by those
 * instructions (~190 a KB of FP4 weights a warp, run 114), not by DRAM (run 53). Native FP8 wgmma
 * (m64n8k32.e4m3, the weights as A from registers, the tokens as B from shared memory) takes one instruction per
 * 64 rows x 8 tokens x 32 columns, with no conversion. It is a different arithmetic (run 85: its products are
 * aligned to the largest with few bits kept), the one the official kernels run on Hopper. This program measures
 * what that would give a decode step before any decision is made:
 *   - speed: weight GB/s of one FP8 linear y = W x at T = 1 and 8 tokens, the shapes of test_gpu_mma --bench, the
 *     weights cycling through copies larger than L2, calls in a CUDA graph (compare with test_gpu_mma --bench,
 *     run in the same call);
 *   - batch invariance: each token alone (T = 1) against the same token in a batch of 8 (T = 8), by memcmp;
 *   - deviation: against the exact value (double, every product exact) of a sample of outputs, beside the same for
 *     today's arithmetic emulated on the host (each k32 step's exact sum rounded into the chunk's fp32 partial, as
 *     mma.sync does on these inputs, run 85), both divided by sum |w x s| (the output's scale of cancellation).
 *
 * The order of y[t][o] in this kernel (a function of K and NP alone): columns in chunks of 128; partial p
 * (p = 0 .. NP-1) takes chunks c = p, p + NP, ... in increasing c; per chunk P = wgmma k32 steps j = 0..3 chained
 * from 0 (scale-d 0 on the first), then p = fmaf(P, sw x sx, p); y = ((p0 + p1) + p2) + ... in fp32. One
 * warpgroup (one block) a partial for 64 rows; the NP blocks of a row tile form a cluster and the sum is read
 * through distributed shared memory, each block summing 64 / NP rows in the fixed order.
 * k map of a chunk (as k_mma.cu's FP8 map, so each lane's bytes are contiguous): step j, k = 4q + i -> column
 * 32q + 8j + i, k = 16 + 4q + i -> column 32q + 8j + 4 + i (lane q = lane % 4 holds columns [32q, 32q + 32) of rows
 * g and g + 8 of its warp's 16: two 16-byte loads a row). The tokens are staged into shared memory in that k order
 * (no swizzle, K-major core matrices of 8 tokens x 16 bytes: LBO 128, SBO 1024, run 85's descriptor).
 *
 * Build: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a --cudart static -o wg_gemv tools/gpu/wg_gemv.cu
 * Usage: wg_gemv [NP] (default 4). Measuring tool, not a test: prints a table, exits 0 unless CUDA fails. */
#include <cooperative_groups.h>
#include <math.h>
#include <string.h>
#include "tc_probe.cuh"

namespace cg = cooperative_groups;

__device__ __forceinline__ void wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit(void) { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0(void) { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void wg_pin(float &x) { asm volatile("" : "+f"(x)::"memory"); }
__device__ __forceinline__ void wg_pin_r(uint32_t &x) { asm volatile("" : "+r"(x)::"memory"); }

/* d = A B (acc 0) or A B + d: wgmma m64n8k32 e4m3, A (64 x 32) from registers in mma.m16n8k32's A layout per warp
 * (CUTLASS ALayout_64x32: row 16 w + g (+ 8 for a1 / a3), k 4q + byte (+ 16 for a2 / a3)), B at descriptor db. */
__device__ __forceinline__ void wg_rs_n8(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(acc));
}

__device__ __forceinline__ uint4 ld_stream16(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(__cvta_generic_to_global(p)));
    return v;
}

__device__ __forceinline__ float ue8m0(uint8_t b) { return __int_as_float((int)b << 23); }   /* 2^(b - 127); b in 1..254 */

/* FP4 codes (E2M1 nibbles) of a word, packed the way cu_fp4_frag_pack packs them (cu_mma_frag.cuh): byte k holds code
 * k in bits 7 (sign), 4-3 (exponent), 2 (mantissa) and code k + 4 in bits 5 (sign), 6-1 (exponent), 0 (mantissa),
 * so frag_lo / frag_hi give the E4M3 bytes of codes 0..3 / 4..7, each value times 2^-6. */
__device__ __forceinline__ uint32_t frag_lo(uint32_t w) { return w & 0x9C9C9C9Cu; }
__device__ __forceinline__ uint32_t frag_hi(uint32_t w) { return ((w << 2) & 0x8C8C8C8Cu) | ((w >> 2) & 0x10101010u); }

__device__ __forceinline__ uint32_t ld_nc32(const uint8_t *p) {
    uint32_t v;
    asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(__cvta_generic_to_global(p)));
    return v;
}

/* A thread's weight registers for one 128-column chunk: FP8 rows g, g + 8 (16 words); FP4 rows g, g + 8 (4 words each,
 * block b's word q) and their 4 scale bytes each (one word a row). */
template <int FP4> struct wg_chunk { uint32_t v[FP4 ? 10 : 16]; };

template <int FP4>
__device__ __forceinline__ void wg_load(wg_chunk<FP4> &r, const uint8_t *r0, const uint8_t *r1, const uint8_t *s0, const uint8_t *s1, int c,
                                        int q) {
    if constexpr (!FP4) {
        const uint4 a = ld_stream16(r0 + 128 * c), b = ld_stream16(r0 + 128 * c + 16);
        const uint4 e = ld_stream16(r1 + 128 * c), f = ld_stream16(r1 + 128 * c + 16);
        r.v[0] = a.x, r.v[1] = a.y, r.v[2] = a.z, r.v[3] = a.w, r.v[4] = b.x, r.v[5] = b.y, r.v[6] = b.z, r.v[7] = b.w;
        r.v[8] = e.x, r.v[9] = e.y, r.v[10] = e.z, r.v[11] = e.w, r.v[12] = f.x, r.v[13] = f.y, r.v[14] = f.z, r.v[15] = f.w;
    } else {
#pragma unroll
        for (int b = 0; b < 4; b++) r.v[b] = ld_nc32(r0 + 64 * c + 16 * b + 4 * q), r.v[4 + b] = ld_nc32(r1 + 64 * c + 16 * b + 4 * q);
        r.v[8] = ld_nc32(s0 + 4 * c), r.v[9] = ld_nc32(s1 + 4 * c);
    }
}

/* One block = one warpgroup = partial p of a 64-row tile; U chunks of weights in flight a thread.
 * FP4 (a UE8M0 scale per row and 32 columns): one wgmma a 32-column block from 0, then p = fmaf(P, sw_b x sx x 64, p),
 * blocks in order (the 64 undoes the packed codes' 2^-6 exactly in the scales' plain range). k map of block b: k = 4q + i
 * -> column 32b + 8q + i, k = 16 + 4q + i -> column 32b + 8q + 4 + i (lane q's 8 columns of the block: one FP4 word). */
template <int FP4, int NP, int U>
__global__ void __launch_bounds__(128) k_wg(const uint8_t *const *Wl, const uint8_t *const *Wsl, int O, int K, const uint8_t *xq, int ldq,
                                            const float *xs, int lds, int T, float *y, int ldy) {
    extern __shared__ __align__(1024) uint8_t sm[];
    /* matrix mi of the launch's list (all O x K), its row tile, the partial */
    const int per = O / 64 * NP, mi = blockIdx.x / per, tile = blockIdx.x % per / NP, nch = K / 128, p = blockIdx.x % NP;
    const uint8_t *W = Wl[mi], *Ws = Wsl[mi];
    y += (size_t)mi * O;
    const int nci = (nch - p + NP - 1) / NP;
    uint8_t *sb = sm;                               /* [nci][1024]: chunk ci's 8 tokens x 128 bytes in k order */
    float *sx = (float *)(sm + (size_t)nci * 1024); /* [nci][8] */
    float *part = sx + nci * 8;                     /* [64][8]: this block's partial */
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const size_t rb = FP4 ? K / 2 : K;   /* bytes a weight row */
    const int R0 = 64 * tile + 16 * w + g;
    const uint8_t *r0 = W + (size_t)R0 * rb + (FP4 ? 0 : 32 * q), *r1 = r0 + 8 * rb;
    const uint8_t *s0 = Ws + (size_t)R0 * (K / 32), *s1 = s0 + (size_t)8 * (K / 32);   /* FP4 only */
    wg_chunk<FP4> wr[U];
#pragma unroll
    for (int u = 0; u < U; u++)
        if (u < nci) wg_load<FP4>(wr[u], r0, r1, s0, s1, p + NP * u, q);
    for (int i = tid; i < nci * 256; i += 128) {   /* 256 words a chunk: 8 tokens x 32 */
        const int ci = i >> 8, n = (i >> 5) & 7, u = i & 31, c = p + NP * ci;
        const uint32_t v = n < T ? *(const uint32_t *)(xq + (size_t)n * ldq + 128 * c + 4 * u) : 0u;
        /* column 4u: FP8 = 32 qq + 8 j + 4 half, FP4 = 32 j + 8 qq + 4 half (j the k32 step / the scale block) */
        const int qq = FP4 ? (u & 7) >> 1 : u >> 3, j = FP4 ? u >> 3 : (u & 7) >> 1, half = u & 1;
        *(uint32_t *)(sb + ci * 1024 + 256 * j + 128 * half + 16 * n + 4 * qq) = v;
    }
    for (int i = tid; i < nci * 8; i += 128) {
        const int ci = i >> 3, n = i & 7;
        sx[i] = n < T ? xs[(size_t)n * lds + p + NP * ci] * (FP4 ? 64.0f : 1.0f) : 0.0f;
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const uint8_t *sw = Ws + (size_t)(64 * tile / 128) * nch;   /* FP8 only */
    float acc[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    for (int ci0 = 0; ci0 < nci; ci0 += U) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int ci = ci0 + u, c = p + NP * ci;
            const uint8_t *bt = sb + ci * 1024;
            const float x0 = sx[ci * 8 + 2 * q], x1 = sx[ci * 8 + 2 * q + 1];
            if constexpr (!FP4) {
                float P[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
                const uint32_t *a = wr[u].v, *b = wr[u].v + 8;   /* rows g, g + 8: 8 words each */
#pragma unroll
                for (int e = 0; e < 4; e++) wg_pin(P[e]);
                wg_fence();
#pragma unroll
                for (int j = 0; j < 4; j++) wg_rs_n8(P, a[2 * j], b[2 * j], a[2 * j + 1], b[2 * j + 1], desc(bt + 256 * j, 128, 1024), j);
                wg_commit();
                wg_wait0();
#pragma unroll
                for (int e = 0; e < 4; e++) wg_pin(P[e]);
                if (ci + U < nci) wg_load<FP4>(wr[u], r0, r1, s0, s1, c + NP * U, q);
                const float s = ue8m0(sw[c]), sa = s * x0, sb_ = s * x1;
                acc[0] = fmaf(P[0], sa, acc[0]), acc[1] = fmaf(P[1], sb_, acc[1]);
                acc[2] = fmaf(P[2], sa, acc[2]), acc[3] = fmaf(P[3], sb_, acc[3]);
            } else {
                float P[4][4];
                uint32_t lo0[4], hi0[4], lo1[4], hi1[4];
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    lo0[b] = frag_lo(wr[u].v[b]), hi0[b] = frag_hi(wr[u].v[b]);
                    lo1[b] = frag_lo(wr[u].v[4 + b]), hi1[b] = frag_hi(wr[u].v[4 + b]);
#pragma unroll
                    for (int e = 0; e < 4; e++) P[b][e] = 0.0f;
                }
                const uint32_t sg = wr[u].v[8], sg8 = wr[u].v[9];
#pragma unroll
                for (int b = 0; b < 4; b++) {   /* converted and zeroed before the fence, not between the wgmmas */
                    wg_pin_r(lo0[b]), wg_pin_r(hi0[b]), wg_pin_r(lo1[b]), wg_pin_r(hi1[b]);
#pragma unroll
                    for (int e = 0; e < 4; e++) wg_pin(P[b][e]);
                }
                wg_fence();
#pragma unroll
                for (int b = 0; b < 4; b++) wg_rs_n8(P[b], lo0[b], lo1[b], hi0[b], hi1[b], desc(bt + 256 * b, 128, 1024), 0);
                wg_commit();
                wg_wait0();
#pragma unroll
                for (int b = 0; b < 4; b++)
#pragma unroll
                    for (int e = 0; e < 4; e++) wg_pin(P[b][e]);
                if (ci + U < nci) wg_load<FP4>(wr[u], r0, r1, s0, s1, c + NP * U, q);
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    const float tg = ue8m0((uint8_t)(sg >> 8 * b)), tg8 = ue8m0((uint8_t)(sg8 >> 8 * b));
                    acc[0] = fmaf(P[b][0], tg * x0, acc[0]), acc[1] = fmaf(P[b][1], tg * x1, acc[1]);
                    acc[2] = fmaf(P[b][2], tg8 * x0, acc[2]), acc[3] = fmaf(P[b][3], tg8 * x1, acc[3]);
                }
            }
        }
    }
    const int row = 16 * w + g;
    part[row * 8 + 2 * q] = acc[0], part[row * 8 + 2 * q + 1] = acc[1];
    part[(row + 8) * 8 + 2 * q] = acc[2], part[(row + 8) * 8 + 2 * q + 1] = acc[3];
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    /* block p sums rows [64 p / NP, 64 (p + 1) / NP) over the partials in order */
    for (int i = tid; i < (64 / NP) * 8; i += 128) {
        const int rr = 64 / NP * p + i / 8, n = i % 8;
        if (n >= T) continue;
        float v = 0.0f;
        for (int r = 0; r < NP; r++) v = r ? v + cl.map_shared_rank(part, r)[rr * 8 + n] : cl.map_shared_rank(part, r)[rr * 8 + n];
        y[(size_t)n * ldy + 64 * tile + rr] = v;
    }
    cl.sync();   /* no block leaves while another reads its partial */
}

/* us a repetition of body(r), r = 0 .. reps-1, captured in one CUDA graph, launched once to warm, then timed by events. */
template <class F> static double graph_us(cudaStream_t st, int reps, F body) {
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    cudaEvent_t e0, e1;
    float ms;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int r = 0; r < reps; r++) body(r);
    CHECK(cudaStreamEndCapture(st, &gr));
    CHECK(cudaGraphInstantiate(&ge, gr, 0));
    CHECK(cudaGraphLaunch(ge, st));
    CHECK(cudaStreamSynchronize(st));
    CHECK(cudaEventRecord(e0, st));
    CHECK(cudaGraphLaunch(ge, st));
    CHECK(cudaEventRecord(e1, st));
    CHECK(cudaEventSynchronize(e1));
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(gr);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms * 1e3 / reps;
}

/* The attainable: the same bytes only read (16-byte loads, 4 in flight a thread, an xor a block written so nothing is
 * dropped), in the same graph of calls, so each size's launch and ramp costs are in it too. */
__device__ __forceinline__ void read_bytes(const uint4 *p, size_t n, uint32_t *out) {
    uint32_t x = 0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        const uint4 a = ld_stream16((const uint8_t *)(p + i)), b = ld_stream16((const uint8_t *)(p + i + stride));
        const uint4 c = ld_stream16((const uint8_t *)(p + i + 2 * stride)), d = ld_stream16((const uint8_t *)(p + i + 3 * stride));
        x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        const uint4 a = ld_stream16((const uint8_t *)(p + i));
        x ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    x = __reduce_xor_sync(0xffffffffu, x);
    if ((threadIdx.x & 31) == 0) atomicXor(out + blockIdx.x, x);
}
__global__ void __launch_bounds__(512) k_read(const uint4 *p, size_t n, uint32_t *out) { read_bytes(p, n, out); }

/* k_read chained by programmatic dependent launch, as the model's steps chain their kernels (DSV4_CUDA_PDL): each
 * waits for the one before (griddepcontrol.wait) and lets the next one's blocks launch at once. */
__global__ void __launch_bounds__(512) k_read_pdl(const uint4 *p, size_t n, uint32_t *out) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    read_bytes(p, n, out);
}

/* What a launch of a given size can read at best: 200 launches of k_read over rotating slices of a 1 GiB buffer in a
 * graph (4 blocks of 512 an SM), the same chained by PDL (2 an SM, so the next one's blocks fit beside), and one launch
 * over the whole buffer (the streaming ceiling). */
static void bench_read(const cudaDeviceProp &prop, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1) {
    const size_t total = (size_t)1 << 30;
    uint8_t *buf;
    uint32_t *out;
    CHECK(cudaMalloc(&buf, total));
    CHECK(cudaMalloc(&out, 4096 * sizeof(uint32_t)));
    CHECK(cudaMemset(buf, 0x5A, total));
    float ms;
    for (int rep = 0; rep < 2; rep++) {
        CHECK(cudaEventRecord(e0, st));
        k_read<<<prop.multiProcessorCount * 4, 512, 0, st>>>((const uint4 *)buf, total / 16, out);
        CHECK(cudaEventRecord(e1, st));
        CHECK(cudaEventSynchronize(e1));
    }
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    printf("read-only ceiling: one launch over 1 GiB %.1f us, %.0f GB/s\n", ms * 1e3, total / (ms * 1e3) / 1e3);
    printf("%8s %12s %12s %12s %12s\n", "MB", "plain us", "plain GB/s", "PDL us", "PDL GB/s");
    for (int mb = 2; mb <= 64; mb *= 2) {
        const size_t bytes = (size_t)mb << 20;
        const int slices = (int)(total / bytes), reps = 200;
        double us[2];
        for (int pdl = 0; pdl < 2; pdl++)
            us[pdl] = graph_us(st, reps, [&](int r) {
                const uint4 *p = (const uint4 *)(buf + (size_t)(r % slices) * bytes);
                if (!pdl) {
                    k_read<<<prop.multiProcessorCount * 4, 512, 0, st>>>(p, bytes / 16, out);
                    return;
                }
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3((unsigned)prop.multiProcessorCount * 2);
                cfg.blockDim = dim3(512);
                cfg.stream = st;
                cudaLaunchAttribute at[1];
                at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                at[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = at;
                cfg.numAttrs = 1;
                CHECK(cudaLaunchKernelEx(&cfg, k_read_pdl, p, bytes / 16, out));
            });
        printf("%8d %12.2f %12.0f %12.2f %12.0f\n", mb, us[0], bytes / us[0] / 1e3, us[1], bytes / us[1] / 1e3);
    }
    cudaFree(buf), cudaFree(out);
}

/* today's kernel shape for comparison of bits is test_gpu_mma's; here only the host model of its arithmetic */

template <int FP4, int NP, int U>
static cudaError_t launch(const uint8_t *const *W, const uint8_t *const *Ws, int nm, int O, int K, const uint8_t *xq, int ldq, const float *xs, int lds, int T,
                          float *y, int ldy, cudaStream_t st) {
    const int nch = K / 128, nci = (nch + NP - 1) / NP;
    const size_t smem = (size_t)nci * 1024 + (size_t)nci * 8 * 4 + 64 * 8 * 4;
    static int attr_done = 0;
    if (!attr_done) {
        cudaFuncSetAttribute(k_wg<FP4, NP, U>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
        attr_done = 1;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(nm * (O / 64) * NP));
    cfg.blockDim = dim3(128);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = NP, at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, k_wg<FP4, NP, U>, W, Ws, O, K, xq, ldq, xs, lds, T, y, ldy);
}

typedef cudaError_t (*launch_fn)(const uint8_t *const *, const uint8_t *const *, int, int, int, const uint8_t *, int, const float *, int, int, float *, int,
                                 cudaStream_t);

/* U chunks in flight must divide each partial's chunk count (K / 128 / NP): the shapes here have 2, 4, 8 or more. */
template <int FP4, int NP>
static launch_fn pick(int K, int U) {
    const int nci = K / 128 / NP;
    if (U >= 4 && nci % 4 == 0) return launch<FP4, NP, 4>;
    if (U >= 2 && nci % 2 == 0) return launch<FP4, NP, 2>;
    return launch<FP4, NP, 1>;
}
template <int FP4> static launch_fn pick_np(int NP, int K, int U) {
    return NP == 2 ? pick<FP4, 2>(K, U) : NP == 4 ? pick<FP4, 4>(K, U) : pick<FP4, 8>(K, U);
}

static double e4m3(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const double v = e == 0 ? m * ldexp(1.0, -9) : (1 + m / 8.0) * ldexp(1.0, e - 7);
    return b & 0x80 ? -v : v;
}

/* Random FP8 weight bytes as the synthetic checkpoints make them (exponents 5..8, any sign and mantissa: values in
 * [1/4, 3.75]), dist 1: any exponent 1..14 (a wide range: cancellation across magnitudes). */
static uint8_t weight_byte(int dist) {
    const uint32_t r = next32();
    const int e = dist ? 1 + (int)(r % 14) : 5 + (int)(r % 4);
    return (uint8_t)((r >> 8 & 0x80) | e << 3 | (r >> 12 & 7));
}
/* Activation bytes as act_quant leaves them: exponents 9..14 (|q| in [4, 240]), any sign and mantissa. */
static uint8_t act_byte(void) {
    const uint32_t r = next32();
    return (uint8_t)((r >> 8 & 0x80) | (9 + (int)(r % 6)) << 3 | (r >> 12 & 7));
}

static double e2m1(int c) {
    const int e = (c >> 1) & 3, m = c & 1;
    const double v = e == 0 ? 0.5 * m : ldexp(1.0 + 0.5 * m, e - 1);
    return c & 8 ? -v : v;
}
/* An E2M1 code's bits in byte k of a packed word: code k (lo) or code k + 4 (hi) (frag_lo / frag_hi above). */
static uint8_t pack_lo(int c) { return (uint8_t)((c >> 3 & 1) << 7 | (c >> 2 & 1) << 4 | (c >> 1 & 1) << 3 | (c & 1) << 2); }
static uint8_t pack_hi(int c) { return (uint8_t)((c >> 3 & 1) << 5 | (c >> 2 & 1) << 6 | (c >> 1 & 1) << 1 | (c & 1)); }

/* One weight of the table: host values (FP8 bytes or E2M1 codes a column), device copies. */
typedef struct {
    int fp4, O, K;
    uint8_t *hw, *hsw;   /* FP8: bytes [O][K], scales [O/128][K/128]; FP4: codes [O][K], scales [O][K/32] */
    size_t db, sb;       /* device bytes of data and scales */
} wt;

static double weight_value(const wt *m, int o, int col) {
    if (!m->fp4) return e4m3(m->hw[(size_t)o * m->K + col]) * ldexp(1.0, m->hsw[(o / 128) * (m->K / 128) + col / 128] - 127);
    return e2m1(m->hw[(size_t)o * m->K + col]) * ldexp(1.0, m->hsw[(size_t)o * (m->K / 32) + col / 32] - 127);
}

/* One MoE layer's routed experts as test_gpu_mma --bench-experts times them (6 experts of V4-Flash, w1 and w3 of
 * 2048 x 4096 in one launch, then w2 of 4096 x 2048; FP4), 40 layers in a CUDA graph over a pool of 64 experts, on
 * this kernel: us a layer and weight GB/s, at T tokens (every expert sees all of them: the timing's worst case). */
static void bench_layer(int NP, const uint8_t *dx, const float *dxs, float *dy, int T, cudaStream_t st) {
    enum { POOL = 64, LAYERS = 40, E = 6, KMAX_ = 8192, NMAX_ = 32768 };
    const size_t d13 = (size_t)2048 * 4096 / 2, s13 = (size_t)2048 * (4096 / 32);   /* w1 / w3 bytes, and w2's (the same) */
    uint8_t *pool, *spool;
    CHECK(cudaMalloc(&pool, 3 * POOL * d13));
    CHECK(cudaMalloc(&spool, 3 * POOL * s13));
    CHECK(cudaMemset(pool, 0x5A, 3 * POOL * d13));
    CHECK(cudaMemset(spool, 120, 3 * POOL * s13));
    const uint8_t **h = (const uint8_t **)malloc(sizeof *h * LAYERS * 3 * E * 2);
    for (int l = 0; l < LAYERS; l++)
        for (int i = 0; i < E; i++) {
            const int e = (E * l + i) % POOL;
            const uint8_t **a = h + (size_t)l * 3 * E;   /* data: 2E of w1 / w3, then E of w2 */
            a[2 * i] = pool + (3 * e) * d13, a[2 * i + 1] = pool + (3 * e + 1) * d13, a[2 * E + i] = pool + (3 * e + 2) * d13;
            const uint8_t **b = h + (size_t)LAYERS * 3 * E + (size_t)l * 3 * E;
            b[2 * i] = spool + (3 * e) * s13, b[2 * i + 1] = spool + (3 * e + 1) * s13, b[2 * E + i] = spool + (3 * e + 2) * s13;
        }
    const uint8_t **dl;
    CHECK(cudaMalloc(&dl, sizeof *dl * LAYERS * 3 * E * 2));
    CHECK(cudaMemcpy(dl, h, sizeof *dl * LAYERS * 3 * E * 2, cudaMemcpyHostToDevice));
    launch_fn f13 = pick_np<1>(NP, 4096, 4), f2 = pick_np<1>(NP, 2048, 4);
    const double us = graph_us(st, LAYERS, [&](int l) {
        const uint8_t *const *a = dl + (size_t)l * 3 * E, *const *b = dl + (size_t)LAYERS * 3 * E + (size_t)l * 3 * E;
        f13(a, b, 2 * E, 2048, 4096, dx, KMAX_, dxs, KMAX_ / 128, T, dy, NMAX_, st);
        f2(a + 2 * E, b + 2 * E, E, 4096, 2048, dx, KMAX_, dxs, KMAX_ / 128, T, dy, NMAX_, st);   /* 6 x 4096 outputs a token */
    });
    const double bytes = (double)E * 3 * (d13 + s13);
    printf("experts of a layer (6 x FP4 w1 + w3, then w2; 2 launches), T = %d, %d partials: %.1f us a layer, %.0f GB/s\n", T, NP, us,
           bytes / us / 1e3);
    cudaFree(dl), cudaFree(pool), cudaFree(spool), free(h);
}

int main(int argc, char **argv) {
    const int NP = argc > 1 ? atoi(argv[1]) : 4;
    if (NP != 2 && NP != 4 && NP != 8) {
        fprintf(stderr, "usage: wg_gemv [2|4|8]\n");
        return 2;
    }
    static const int shapes[][3] = { { 0, 4096, 4096 }, { 0, 32768, 1024 }, { 0, 2048, 4096 }, { 0, 1024, 4096 }, { 0, 512, 4096 },
                                     { 0, 4096, 8192 }, { 1, 2048, 4096 }, { 1, 4096, 2048 }, { 1, 4096, 4096 } };
    enum { TMAX = 8, KMAX = 8192, NMAX = 32768 };
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("native FP8 wgmma linear (m64n8k32, A from registers), %d partials a cluster, on %s\n", NP, prop.name);
    /* activations: act_byte and power-of-two scales 2^-6 .. 2^-4 */
    uint8_t *hx = (uint8_t *)malloc((size_t)TMAX * KMAX), *dx1;
    float *hs = (float *)malloc(sizeof(float) * TMAX * (KMAX / 128)), *ds1;
    for (size_t i = 0; i < (size_t)TMAX * KMAX; i++) hx[i] = act_byte();
    for (int i = 0; i < TMAX * (KMAX / 128); i++) hs[i] = ldexpf(1.0f, -6 + (int)(next32() % 3));
    uint8_t *dx;
    float *dxs, *dy, *dy1;
    CHECK(cudaMalloc(&dx, (size_t)TMAX * KMAX));
    CHECK(cudaMalloc(&dxs, sizeof(float) * TMAX * (KMAX / 128)));
    CHECK(cudaMalloc(&dx1, KMAX));
    CHECK(cudaMalloc(&ds1, sizeof(float) * (KMAX / 128)));
    CHECK(cudaMalloc(&dy, sizeof(float) * TMAX * NMAX));
    CHECK(cudaMalloc(&dy1, sizeof(float) * NMAX));
    CHECK(cudaMemcpy(dx, hx, (size_t)TMAX * KMAX, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dxs, hs, sizeof(float) * TMAX * (KMAX / 128), cudaMemcpyHostToDevice));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    uint32_t *dread;
    CHECK(cudaMalloc(&dread, 4096 * sizeof(uint32_t)));
    if (getenv("WG_READ_ONLY")) {   /* the read ceilings alone */
        bench_read(prop, st, e0, e1);
        return 0;
    }
    printf("%-5s %-12s %2s %9s %9s %9s %9s | %9s %11s %11s %11s %11s\n", "fmt", "O x K", "U", "T=1 us", "T=1 GB/s", "T=8 us", "T=8 GB/s",
           "T-invar.", "wg max dev", "wg mean", "mma max dev", "mma mean");
    for (int dist = 0; dist < 2; dist++)
        for (int k = 0; k < (int)(sizeof shapes / sizeof shapes[0]); k++) {
            wt m = { shapes[k][0], shapes[k][1], shapes[k][2], NULL, NULL, 0, 0 };
            const int O = m.O, K = m.K, nch = K / 128;
            if (dist && m.fp4) continue;   /* FP4 has no exponent range to widen */
            m.db = m.fp4 ? (size_t)O * K / 2 : (size_t)O * K;
            m.sb = m.fp4 ? (size_t)O * (K / 32) : (size_t)(O / 128) * nch;
            const size_t hsb = m.sb;
            const int copies = dist ? 1 : (int)((256u << 20) / (m.db + m.sb)) + 1;
            m.hw = (uint8_t *)malloc((size_t)O * K), m.hsw = (uint8_t *)malloc(hsb);
            uint8_t *dev = (uint8_t *)malloc(m.db);
            for (size_t i = 0; i < (size_t)O * K; i++) m.hw[i] = m.fp4 ? (uint8_t)(next32() & 15) : weight_byte(dist);
            for (size_t i = 0; i < hsb; i++) m.hsw[i] = (uint8_t)(m.fp4 ? 118 + next32() % 4 : 120 + next32() % 4);
            if (!m.fp4) memcpy(dev, m.hw, m.db);
            else
                for (int o = 0; o < O; o++)
                    for (int w0 = 0; w0 < K / 8; w0++)   /* word w0 of the row: columns 8 w0 .. + 7 */
                        for (int b = 0; b < 4; b++) {
                            const uint8_t *c = m.hw + (size_t)o * K + 8 * w0;
                            dev[(size_t)o * (K / 2) + 4 * w0 + b] = (uint8_t)(pack_lo(c[b]) | pack_hi(c[b + 4]));
                        }
            uint8_t **dw = (uint8_t **)calloc(copies, sizeof *dw), **dsw = (uint8_t **)calloc(copies, sizeof *dsw);
            for (int i = 0; i < copies; i++) {
                CHECK(cudaMalloc(&dw[i], m.db));
                CHECK(cudaMalloc(&dsw[i], m.sb));
                CHECK(cudaMemcpy(dw[i], dev, m.db, cudaMemcpyHostToDevice));
                CHECK(cudaMemcpy(dsw[i], m.hsw, m.sb, cudaMemcpyHostToDevice));
            }
            uint8_t **pw, **psw;   /* the copies' addresses on the device: the kernel takes a list */
            CHECK(cudaMalloc(&pw, copies * sizeof *pw));
            CHECK(cudaMalloc(&psw, copies * sizeof *psw));
            CHECK(cudaMemcpy(pw, dw, copies * sizeof *pw, cudaMemcpyHostToDevice));
            CHECK(cudaMemcpy(psw, dsw, copies * sizeof *psw, cudaMemcpyHostToDevice));
            if (!dist) {   /* the read-only ceiling of these bytes (data; the scales are < 1 %) */
                const int blocks = prop.multiProcessorCount * 4;
                const double us = graph_us(st, 200, [&](int r) {
                    k_read<<<blocks, 512, 0, st>>>((const uint4 *)dw[r % copies], m.db / 16, dread);
                });
                printf("%-5s %dx%-7d read only: %.2f us a call, %.0f GB/s\n", m.fp4 ? "FP4" : "FP8", O, K, us, m.db / us / 1e3);
            }
            for (int U = 4; U >= (dist ? 4 : 1); U /= 2) {
                launch_fn fn = m.fp4 ? pick_np<1>(NP, K, U) : pick_np<0>(NP, K, U);
                double us[2] = { 0, 0 };
                for (int ti = 0; ti < 2 && !dist; ti++) {
                    const int T = ti ? 8 : 1;
                    CHECK(fn(pw, psw, 1, O, K, dx, KMAX, dxs, KMAX / 128, T, dy, NMAX, st));
                    CHECK(cudaStreamSynchronize(st));
                    us[ti] = graph_us(st, 200, [&](int r) {
                        fn(pw + r % copies, psw + r % copies, 1, O, K, dx, KMAX, dxs, KMAX / 128, T, dy, NMAX, st);
                    });
                }
                /* batch invariance: T = 8, then each token alone from its own copy of the row */
                CHECK(fn(pw, psw, 1, O, K, dx, KMAX, dxs, KMAX / 128, 8, dy, NMAX, st));
                float *h8 = (float *)malloc(sizeof(float) * 8 * NMAX), *h1 = (float *)malloc(sizeof(float) * NMAX);
                CHECK(cudaMemcpyAsync(h8, dy, sizeof(float) * 8 * NMAX, cudaMemcpyDeviceToHost, st));
                size_t differ = 0;
                for (int n = 0; n < 8; n++) {
                    CHECK(cudaMemcpyAsync(dx1, dx + (size_t)n * KMAX, KMAX, cudaMemcpyDeviceToDevice, st));
                    CHECK(cudaMemcpyAsync(ds1, dxs + (size_t)n * (KMAX / 128), sizeof(float) * (KMAX / 128), cudaMemcpyDeviceToDevice, st));
                    CHECK(fn(pw, psw, 1, O, K, dx1, KMAX, ds1, KMAX / 128, 1, dy1, NMAX, st));
                    CHECK(cudaMemcpyAsync(h1, dy1, sizeof(float) * NMAX, cudaMemcpyDeviceToHost, st));
                    CHECK(cudaStreamSynchronize(st));
                    for (int o = 0; o < O; o++) differ += memcmp(&h1[o], &h8[(size_t)n * NMAX + o], 4) != 0;
                }
                /* deviation on a sample of outputs: rows o = 0, 37, 74, ... for every token. Today's arithmetic: FP8, each
                 * k32 step's exact sum rounded into the chunk's P (4 steps); FP4, each 32-column block's exact sum rounded
                 * (one step); then p = fmaf(P, s, p) and the partials summed in order (NP of them here as well). */
                double wg_max = 0, wg_sum = 0, mma_max = 0, mma_sum = 0;
                int samples = 0;
                for (int o = 0; o < O; o += 37)
                    for (int n = 0; n < 8; n++) {
                        double exact = 0, mag = 0;
                        float pp[8] = { 0 };
                        for (int c = 0; c < nch; c++) {
                            const double sx = hs[n * (KMAX / 128) + c];
                            float P = 0.0f;
                            for (int j = 0; j < 4; j++) {
                                double st32 = 0, sc = 0;
                                for (int i = 0; i < 32; i++) {
                                    const int col = 128 * c + 32 * j + i;
                                    const double pr = weight_value(&m, o, col) * e4m3(hx[(size_t)n * KMAX + col]) * sx;
                                    st32 += pr, mag += fabs(pr);
                                }
                                exact += st32;
                                if (!m.fp4) {   /* P in the weight's and activation's units: scale out */
                                    sc = ldexp(1.0, m.hsw[(o / 128) * nch + c] - 127) * sx;
                                    P = (float)((double)P + st32 / sc);
                                } else {
                                    sc = ldexp(1.0, m.hsw[(size_t)o * (K / 32) + 4 * c + j] - 127) * sx;
                                    pp[c % NP] = fmaf((float)(st32 / sc), (float)sc, pp[c % NP]);
                                }
                                if (!m.fp4 && j == 3) pp[c % NP] = fmaf(P, (float)sc, pp[c % NP]);
                            }
                        }
                        float ym = 0.0f;
                        for (int r = 0; r < NP; r++) ym = r ? ym + pp[r] : pp[r];
                        const double dg = fabs(h8[(size_t)n * NMAX + o] - exact) / (mag > 0 ? mag : 1);
                        const double dm = fabs(ym - exact) / (mag > 0 ? mag : 1);
                        wg_max = dg > wg_max ? dg : wg_max, wg_sum += dg, mma_max = dm > mma_max ? dm : mma_max, mma_sum += dm;
                        samples++;
                    }
                char sh[32];
                snprintf(sh, sizeof sh, "%dx%d%s", O, K, dist ? "w" : "");
                if (!dist)
                    printf("%-5s %-12s %2d %9.2f %9.0f %9.2f %9.0f | %9zu %11.3g %11.3g %11.3g %11.3g\n", m.fp4 ? "FP4" : "FP8", sh, U, us[0],
                           (m.db + m.sb) / us[0] / 1e3, us[1], (m.db + m.sb) / us[1] / 1e3, differ, wg_max, wg_sum / samples, mma_max,
                           mma_sum / samples);
                else
                    printf("%-5s %-12s %2d %9s %9s %9s %9s | %9zu %11.3g %11.3g %11.3g %11.3g\n", "FP8", sh, U, "-", "-", "-", "-", differ,
                           wg_max, wg_sum / samples, mma_max, mma_sum / samples);
                fflush(stdout);
                free(h8);
                free(h1);
            }
            for (int i = 0; i < copies; i++) cudaFree(dw[i]), cudaFree(dsw[i]);
            cudaFree(pw), cudaFree(psw);
            free(dw), free(dsw), free(m.hw), free(m.hsw), free(dev);
        }
    bench_layer(NP, dx, dxs, dy, 1, st);
    bench_layer(NP, dx, dxs, dy, 8, st);
    printf("(T-invar.: outputs of T = 1 runs that differ from the same token at T = 8, of 8 x O; dev: |y - exact| / sum |w x s|\n"
           " on a sample, 'wg' this kernel, 'mma' today's arithmetic modelled on the host; 'w': FP8 weight exponents 1..14, not timed)\n");
    return 0;
}
