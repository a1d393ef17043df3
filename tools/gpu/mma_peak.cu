/* The FP8 tensor-core ceilings a prefill GEMM can aim at (issue 18): how many TFLOPS do mma.sync m16n8k32 e4m3 and
 * wgmma m64n128k32 e4m3 reach on this GPU with no memory traffic at all, and what does a promotion (the OFFICIAL
 * order's "fresh fragment times the scales, added to y" after every 4 k32 steps for an FP8 chunk, after every step
 * for an FP4 block) cost when the accumulators must leave the tensor cores that often?
 *   mma      : every warp 8 independent m16n8k32 accumulators, operands in registers; 32 warps an SM.
 *   wgmma P  : two warpgroups an SM, each chained m64n128k32 from shared memory (A 64 x 32, B 128 x 32 bytes, never
 *              reloaded); P = 0: one chain, no promotion; P = 4 / 1: every P steps wait for the group, then
 *              y = fmaf(d, s, y) over the 64 accumulators, the next step from 0 (scale-d 0).
 *   mma P    : the same promotion pattern on mma.sync (P = 4: the FP8 chunk of today's kernels; 1: the FP4 block).
 *              On sm_90 mma.sync e4m3 is built from fp16 HMMAs and conversions (run 90); with constant operands
 *              the compiler converted them once (run 87's 1,109 TFLOPS), so the operands change every iteration.
 *   hgmma    : the fp16 form of the e4m3 MMA that keeps mma.sync's bits (tools/gpu/f16emu_bits.cu), see k_hgmma_emu.
 * Build: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a --cudart static -o mma_peak tools/gpu/mma_peak.cu (tc_probe.cuh beside it)
 * A measuring tool: prints a table, exits 0. */
#include "tc_probe.cuh"

/* 8 independent tiles a warp; P = 0: plain chains; P > 0: every P steps y += d * s and d restarts from 0. */
__global__ void k_mma_peak(int iters, int P, float *out) {
    const uint32_t a = 0x20202020u + threadIdx.x, b = 0x18181818u + blockIdx.x;
    float d[8][4] = {}, y[8][4] = {};
    for (int i = 0; i < iters; i++) {
        const uint32_t ai = a ^ (uint32_t)(i & 0x07070707), bi = b ^ (uint32_t)(i & 0x03030303);   /* fresh operands */
#pragma unroll
        for (int t = 0; t < 8; t++) mma_e4m3(d[t], ai, ai ^ 1u, ai ^ 2u, ai ^ 3u, bi, bi ^ 1u);
        if (P && (i + 1) % P == 0) {
#pragma unroll
            for (int t = 0; t < 8; t++)
#pragma unroll
                for (int k = 0; k < 4; k++) y[t][k] = fmaf(d[t][k], 0.5f, y[t][k]), d[t][k] = 0.0f;
        }
    }
    float s = 0;
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int k = 0; k < 4; k++) s += d[t][k] + y[t][k];
    if (s == 1.2345f) out[0] = s;   /* practically never: keeps the work */
}

__device__ __forceinline__ void wg_m64n128(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,"
                 "%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
                   "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
                   "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
                   "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
                   "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
                   "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
                   "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
                   "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(accumulate));
}

/* Two warpgroups; each its own A tile (64 rows x 32 bytes), both the same B (128 x 32 bytes). No-swizzle K-major
 * core matrices (tools/gpu/wgmma_bits.cu): LBO 128, SBO 256. */
__global__ void __launch_bounds__(256, 1) k_wgmma_peak(int iters, int P, float *out) {
    __shared__ __align__(1024) uint8_t sa[2][64 * 32], sb[128 * 32];
    for (int i = threadIdx.x; i < 2 * 64 * 32; i += blockDim.x) (&sa[0][0])[i] = (uint8_t)(0x20 + (i & 7));
    for (int i = threadIdx.x; i < 128 * 32; i += blockDim.x) sb[i] = (uint8_t)(0x18 + (i & 3));
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const int wg = threadIdx.x / 128;
    const uint64_t da = desc(sa[wg], 128, 256), db = desc(sb, 128, 256);
    float d[64], y[64];
    for (int k = 0; k < 64; k++) d[k] = 0.0f, y[k] = 0.0f;
    const int group = P ? P : 8;
    for (int i = 0; i < iters; i += group) {
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        for (int u = 0; u < group; u++) wg_m64n128(d, da, db, P ? u > 0 : 1);
        asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;" ::: "memory");
        if (P)
#pragma unroll
            for (int k = 0; k < 64; k++) y[k] = fmaf(d[k], 0.5f, y[k]);
    }
    float s = 0;
    for (int k = 0; k < 64; k++) s += d[k] + y[k];
    if (s == 1.2345f) out[0] = s;
}

__device__ __forceinline__ void wg_f16_n64(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
                   "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
                   "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
                   "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(accumulate));
}

/* The fp16 form of the e4m3 MMA (tools/gpu/f16emu_bits.cu: the same bits): a k32 step is two m64n64k16 HGMMAs from
 * zero into t, then D = D + t by FADD. Three warpgroups an SM, each its own A (64 x 16 halves), one B. mode 0: the
 * HGMMAs alone, one chain (the fp16 ceiling at n64); 1: the FP8 chunk (FADD every step, a promotion y = fmaf(D, s, y)
 * every 4); 2: the FP4 block (y = fmaf(t, s, y) every step). Each warpgroup waits for its step before adding it (two
 * t sets with wait_group 1 were serialized by ptxas: C7514); the three warpgroups of an SM overlap each other. */
template <int MODE>
__global__ void __launch_bounds__(384, 1) k_hgmma_emu(int iters, float *out) {
    __shared__ __align__(1024) uint8_t sa[3][64 * 32], sb[64 * 32];
    for (int i = threadIdx.x; i < 3 * 64 * 32; i += blockDim.x) (&sa[0][0])[i] = (uint8_t)(0x20 + (i & 7));
    for (int i = threadIdx.x; i < 64 * 32; i += blockDim.x) sb[i] = (uint8_t)(0x18 + (i & 3));
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const int wg = threadIdx.x / 128;
    const uint64_t da = desc(sa[wg], 128, 256), db = desc(sb, 128, 256);
    float t0[32], t1[32], d[32], y[32];
    for (int k = 0; k < 32; k++) t0[k] = t1[k] = d[k] = y[k] = 0.0f;
    if (MODE == 0) {
        for (int i = 0; i < iters; i += 4) {
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int u = 0; u < 4; u++) wg_f16_n64(d, da, db, 1), wg_f16_n64(d, da, db, 1);
            asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;" ::: "memory");
        }
    } else {
        for (int j = 0; j < iters; j++) {
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
            wg_f16_n64(t0, da, db, 0), wg_f16_n64(t0, da, db, 1);
            asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;" ::: "memory");
            if (MODE == 1) {
#pragma unroll
                for (int k = 0; k < 32; k++) d[k] = __fadd_rn(d[k], t0[k]);
                if (j % 4 == 3)
#pragma unroll
                    for (int k = 0; k < 32; k++) y[k] = fmaf(d[k], 0.5f, y[k]), d[k] = 0.0f;
            } else {
#pragma unroll
                for (int k = 0; k < 32; k++) y[k] = fmaf(__fadd_rn(0.0f, t0[k]) * 64.0f, 0.5f, y[k]);
            }
        }
    }
    float s = 0;
    for (int k = 0; k < 32; k++) s += d[k] + y[k] + t0[k] + t1[k];
    if (s == 1.2345f) out[0] = s;
}

static double time_ms(void (*launch)(int, int, float *, int), int iters, int P, float *out, int sms) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    launch(iters / 16, P, out, sms);   /* warm-up */
    CHECK(cudaEventRecord(a));
    launch(iters, P, out, sms);
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaGetLastError());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}
static void launch_mma(int iters, int P, float *out, int sms) { k_mma_peak<<<sms * 8, 128>>>(iters, P, out); }
static void launch_wgmma(int iters, int P, float *out, int sms) { k_wgmma_peak<<<sms, 256>>>(iters, P, out); }
static void launch_emu(int iters, int mode, float *out, int sms) {
    if (mode == 0) k_hgmma_emu<0><<<sms, 384>>>(iters, out);
    else if (mode == 1) k_hgmma_emu<1><<<sms, 384>>>(iters, out);
    else k_hgmma_emu<2><<<sms, 384>>>(iters, out);
}

int main(void) {
    int dev = 0, sms = 0, clk = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CHECK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev));
    float *out;
    CHECK(cudaMalloc(&out, 4));
    printf("SMs %d, max SM clock %.2f GHz\n%-22s %10s %10s\n", sms, clk / 1e6, "kernel", "ms", "TFLOPS");
    const int P_list[3] = {0, 4, 1};
    for (int pi = 0; pi < 3; pi++) {
        const int P = P_list[pi], iters = 1 << 15;
        const double ms = time_ms(launch_mma, iters, P, out, sms);
        const double flops = (double)sms * 8 * 4 * iters * 8 * (2.0 * 16 * 8 * 32);
        printf("mma.sync m16n8k32 P=%d  %10.3f %10.1f\n", P, ms, flops / ms / 1e9);
    }
    for (int pi = 0; pi < 3; pi++) {
        const int P = P_list[pi], iters = 1 << 14;
        const double ms = time_ms(launch_wgmma, iters, P, out, sms);
        const double flops = (double)sms * 2 * iters * (2.0 * 64 * 128 * 32);
        printf("wgmma m64n128k32 P=%d   %10.3f %10.1f\n", P, ms, flops / ms / 1e9);
    }
    const char *emu_names[3] = {"hgmma f16 n64 chain", "hgmma f16 FP8 order", "hgmma f16 FP4 order"};
    for (int mode = 0; mode < 3; mode++) {
        const int iters = 1 << 14;   /* k32 steps (mode 0: k16 pairs) */
        const double ms = time_ms(launch_emu, iters, mode, out, sms);
        const double flops = (double)sms * 3 * iters * (2.0 * 2 * 64 * 64 * 16);
        printf("%-22s %10.3f %10.1f\n", emu_names[mode], ms, flops / ms / 1e9);
    }
    return 0;
}
