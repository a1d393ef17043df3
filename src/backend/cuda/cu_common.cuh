/* Device-side helpers shared by the CUDA kernels: the number formats (the same rules, bit for bit, as
 * src/model/formats.c and src/state/kvrows.c), weight-row decoding, and the fixed-order reductions.
 *
 * Reduction orders (the GPU form of the engine's exactness, DESIGN §8):
 *   warp_sum   lane l holds a partial; partials are combined by xor-butterfly 16, 8, 4, 2, 1. Every lane ends
 *              with the same value, which depends only on the 32 partials, never on who else is in the step.
 *   block_sum  each warp's warp_sum, then warp 0 sums the per-warp results in warp order with the same
 *              butterfly (absent warps count 0). Fixed by blockDim, which every launcher fixes at compile time.
 * No reduction here uses atomics, and no launcher picks its block or split from the batch size. */
#ifndef DSV4_CU_COMMON_CUH
#define DSV4_CU_COMMON_CUH
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include "model/e2m1_f16.h"
#include "model/weight.h"

/* DIAG_SKIP (a measuring build only, never a real one: its outputs are wrong): launchers that return without
 * launching, to time a decode step without a group of kernels and so learn that group's share of the step's
 * critical path (tools/gpu/stage_attrib.sh; docs/GPU_RUNS.md runs 73-75): 1 the dense tensor-core linears (k_mma.cu, k_mma16.cu: projections,
 * shared expert, head), 2 the routed experts, 4 attention (cu_attention), 8 mHC (hc_pre's finish, hc_post,
 * hc_post_moe), 16 the compressors, 32 attn_prepare. Only kernels whose outputs are floats the rest reads as
 * values (never as indices or counts) are in a group. */
#ifndef DIAG_SKIP
#define DIAG_SKIP 0
#endif

/* ---- launch order ------------------------------------------------------------------------------------ */

/* The first statement of every kernel (tests/cli/pdl_wait.sh checks it). Inside a step's graph, cu_graph.cu
 * makes each kernel -> kernel edge a programmatic one: the next kernel's blocks are launched as soon as every
 * block of the one before has begun, so its launch is hidden behind that kernel's run, and they wait here until
 * the kernel before has completed and its writes are visible (griddepcontrol.wait: PTX ISA, "Parallel
 * synchronization and communication instructions"). Outside such an edge (a direct launch, the first node of a
 * graph) it returns at once. So the order of kernels and every byte they read are those of plain launches. */
__device__ __forceinline__ void dev_grid_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* A flag shared with the host through page-locked mapped memory, read and written at system scope (PTX memory
 * consistency model): strong operations no cache may hold back. The acquire load orders this thread's later reads
 * after the host's writes that preceded its store of the flag; the release store makes this thread's earlier writes
 * visible to the host before the flag. */
__device__ __forceinline__ int dev_ld_acquire_sys(const int *p) {
    int v;
    asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void dev_st_release_sys(int *p, int v) {
    asm volatile("st.release.sys.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* A barrier among the first n threads of the block (n a multiple of 32; named barrier id, 1..15: 0 is
 * __syncthreads'), for kernels in which one warp works apart from the others (k_layer.cu's mHC mix warp). */
__device__ __forceinline__ void dev_bar_sync(int id, int n) {
#if defined(__CUDA_ARCH__)
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
#endif
}

/* ---- number formats ----------------------------------------------------------------------------------- */

/* Round to the nearest bf16 (ties to even), NaN stays NaN: formats.c f32_to_bf16. */
__device__ __forceinline__ float dev_round_bf16(float x) {
    uint32_t u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float(((u >> 16) | 0x40u) << 16);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}
/* Two bf16 roundings in one instruction. cvt.rn.bf16x2.f32 rounds to nearest even and keeps subnormals, so for every
 * non-NaN value it gives dev_round_bf16's bits; a NaN comes back as the canonical 0x7fff0000 whatever its bits. So it
 * serves where a NaN's bits cannot reach a result (a value that is only compared, as the indexer's s_h); elsewhere
 * dev_round_bf16x2, which puts dev_round_bf16's NaN back. (Off the GPU, e.g. in the CPU shims: dev_round_bf16 twice.) */
__device__ __forceinline__ void dev_round_bf16x2_any_nan(float &a, float &b) {
#if defined(__CUDA_ARCH__) && !defined(DSV4_SW_BF16X2)   /* DSV4_SW_BF16X2: a measuring build's software form */
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));   /* the first source goes to the top half */
    a = __uint_as_float(r << 16);
    b = __uint_as_float(r & 0xffff0000u);
#else
    a = dev_round_bf16(a);
    b = dev_round_bf16(b);
#endif
}
/* dev_round_bf16 of a and of b, bit for bit for every input, NaN included (its quiet NaN keeps the payload's top bits). */
__device__ __forceinline__ void dev_round_bf16x2(float &a, float &b) {
    const uint32_t ua = __float_as_uint(a), ub = __float_as_uint(b);
    dev_round_bf16x2_any_nan(a, b);
    if ((ua & 0x7fffffffu) > 0x7f800000u) a = __uint_as_float((ua & 0xffff0000u) | 0x00400000u);
    if ((ub & 0x7fffffffu) > 0x7f800000u) b = __uint_as_float((ub & 0xffff0000u) | 0x00400000u);
}
__device__ __forceinline__ float dev_bf16_if(int official, float x) { return official ? dev_round_bf16(x) : x; }
__device__ __forceinline__ uint16_t dev_f32_to_bf16(float x) { return (uint16_t)(__float_as_uint(dev_round_bf16(x)) >> 16); }
__device__ __forceinline__ float dev_bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* E4M3 ("fn"), exact, by building the fp32 bits (no tables: a table in local memory costs a store per entry
 * per call): normal e in 1..15 -> exponent e - 7 + 127, mantissa m in the top 3 bits; subnormal m * 2^-9. */
__device__ __forceinline__ float dev_e4m3(uint8_t b) {
    const uint32_t e = (b >> 3) & 15, m = b & 7, sign = (uint32_t)(b & 0x80) << 24;
    if (e == 15 && m == 7) return __uint_as_float(0x7fc00000u);
    if (e == 0) return __uint_as_float(sign | __float_as_uint((float)m * 0.001953125f));
    return __uint_as_float(sign | (e + 120) << 23 | m << 20);
}

/* UE8M0: 2^(b-127); 0 is the denormal 2^-127, 255 NaN. */
__device__ __forceinline__ float dev_e8m0(uint8_t b) {
    if (b == 255) return __uint_as_float(0x7fc00000u);
    if (b == 0) return __uint_as_float(0x00400000u);
    return __uint_as_float((uint32_t)b << 23);
}

/* E2M1 codes 0..7 = 0, .5, 1, 1.5, 2, 3, 4, 6 (8..15 negative), from the bits: exponent field e = 1..3 ->
 * 2^(e-1) x (1 + m/2); e = 0 -> m/2. */
__device__ __forceinline__ float dev_e2m1(uint8_t code) {
    const uint32_t e = (code >> 1) & 3, m = code & 1;
    const uint32_t mag = e ? (e + 126) << 23 | m << 22 : (m ? 0x3f000000u : 0u);
    return __uint_as_float(mag | (uint32_t)(code & 8) << 28);
}

/* The same search as formats.c f32_to_e4m3: nearest magnitude code, ties to the even code, saturating. */
__device__ __forceinline__ uint8_t dev_f32_to_e4m3_search(float x) {
    if (isnan(x)) return 0x7f;
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const float a = fabsf(x);
    if (a >= 448.0f) return sign | 0x7e;
    int lo = 0, hi = 126;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (dev_e4m3((uint8_t)mid) <= a) lo = mid; else hi = mid;
    }
    const float vl = dev_e4m3((uint8_t)lo), vh = dev_e4m3((uint8_t)hi);
    int code;
    if (a - vl < vh - a) code = lo;
    else if (a - vl > vh - a) code = hi;
    else code = (lo & 1) ? hi : lo;
    return sign | (uint8_t)code;
}

/* f32 -> E4M3: with DEV_HW_E4M3 (the default) the hardware's cvt.rn.satfinite (round to nearest even, saturating
 * at 448), NaN mapped to 0x7f as the search maps it; else the search above (a binary search over the codes: ~100
 * dependent instructions, divergent across a warp: run 35's ncu saw the single-block kernels that pack a row pay
 * for it). test_gpu_mma compares the two for every one of the 2^32 floats (cu_mma_e4m3_check). */
#ifndef DEV_HW_E4M3
#define DEV_HW_E4M3 1
#endif
__device__ __forceinline__ uint8_t dev_f32_to_e4m3(float x) {
#if DEV_HW_E4M3
    if (isnan(x)) return 0x7f;
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
#else
    return dev_f32_to_e4m3_search(x);
#endif
}

/* formats.c f32_to_e2m1. */
__device__ __forceinline__ uint8_t dev_f32_to_e2m1(float x) {
    const uint8_t sign = signbit(x) ? 8 : 0;
    const float a = fabsf(x);
    if (isnan(x)) return 7;
    if (a >= 6.0f) return sign | 7;
    int lo = 0;
    while (lo < 7 && dev_e2m1((uint8_t)(lo + 1)) <= a) lo++;
    if (lo == 7) return sign | 7;
    const float vl = dev_e2m1((uint8_t)lo), vh = dev_e2m1((uint8_t)(lo + 1));
    int code;
    if (a - vl < vh - a) code = lo;
    else if (a - vl > vh - a) code = lo + 1;
    else code = (lo & 1) ? lo + 1 : lo;
    return sign | (uint8_t)code;
}

/* 2^ceil(log2(v)) from the bit pattern (formats.c pow2_ceil). */
__device__ __forceinline__ float dev_pow2_ceil(float v) {
    const uint32_t u = __float_as_uint(v);
    int e = (int)((u >> 23) & 0xff) - 127;
    if (u & 0x7fffffu) e += 1;
    return ldexpf(1.0f, e);
}

/* The UE8M0 byte of a power-of-two scale, kept finite (kvrows.c e8m0_of). */
__device__ __forceinline__ uint8_t dev_e8m0_of(float s) {
    const uint32_t e = (__float_as_uint(s) >> 23) & 0xff;
    return (uint8_t)(e == 0 ? 1 : e == 255 ? 254 : e);
}

/* One value of the official FP8 simulation given the block scale s (formats.c act_quant_fp8_inplace). */
__device__ __forceinline__ float dev_fp8_sim(float x, float s) {
    const float q = fminf(fmaxf(x / s, -448.0f), 448.0f);
    return dev_round_bf16(dev_e4m3(dev_f32_to_e4m3(q)) * s);
}
__device__ __forceinline__ float dev_fp4_sim(float x, float s) {
    const float q = fminf(fmaxf(x / s, -6.0f), 6.0f);
    return dev_round_bf16(dev_e2m1(dev_f32_to_e2m1(q)) * s);
}

/* ---- reductions ----------------------------------------------------------------------------------------- */

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* Sum of one float per thread over the block (see the header comment); every thread gets the result.
 * `red` is shared scratch of 32 floats. Must be reached by every thread of the block. */
__device__ __forceinline__ float block_sum(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = lane < nw ? red[lane] : 0.0f;
    s = warp_sum(s);
    return s;
}

/* Sum of squares of x[0..n): thread k takes k, k+blockDim, ... in order, then block_sum. The loads of 8 of a
 * thread's elements are issued before the first is added (the same order, so the same bits): one block per token
 * at T = 1 otherwise waits a memory latency per element (run 25's ncu: 33 us per hc_pre launch, 16384 elements). */
__device__ __forceinline__ float sum_squares(const float *x, int n, float *red) {
    float s = 0.0f;
    int i = threadIdx.x;
    const int B = blockDim.x;
    for (; i + 7 * B < n; i += 8 * B) {
        float v[8];
#pragma unroll
        for (int u = 0; u < 8; u++) v[u] = x[i + u * B];
#pragma unroll
        for (int u = 0; u < 8; u++) s = fmaf(v[u], v[u], s);
    }
    for (; i < n; i += B) s = fmaf(x[i], x[i], s);
    return block_sum(s, red);
}
__device__ __forceinline__ float block_max(float v, float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float s = lane < nw ? red[lane] : -INFINITY;
    return warp_max(s);
}

/* ---- weights --------------------------------------------------------------------------------------------- */

/* Decoding FP8 and FP4 weights times their scale. Run 21's ncu: the one-token GEMVs issued ~30 instructions per
 * weight byte (dev_e4m3 / dev_e2m1 per element: field extraction, NaN and subnormal tests, selects), which caps
 * them near 1 TB/s before any memory limit. With DEV_HW_DECODE the same values come from fewer instructions:
 *   E4M3: the hardware conversion cvt.rn.f16x2.e4m3x2 (sm_89+), two elements an instruction, exact (every E4M3
 *         value is an f16), then f16 -> f32 (exact): the values of dev_e4m3. A NaN byte gives some NaN where
 *         dev_e4m3 gives 0x7fc00000; either one times s is the GPU's canonical NaN, so the products agree bit for bit.
 *   E2M1: model/e2m1_f16.h's bit moves, two elements per byte, as f16 values e2m1 * 2^-14 (exact, tested on the CPU
 *         for all 256 bytes), then times s * 2^14 (one product: exact whenever s * 2^14 is finite; else the two).
 * Every product equals dev_e4m3(b) * s or dev_e2m1(c) * s exactly, so kernels give the same bits either way.
 * On since run 24 (docs/GPU_RUNS.md): the GPU suite passed with it (87/87) and Flash decode went +9 %. Build with
 * NVFLAGS+=-DDEV_HW_DECODE=0 for the per-element decoders (the same products). */
#ifndef DEV_HW_DECODE
#define DEV_HW_DECODE 1
#endif
__device__ __forceinline__ float dev_f16_bits(uint32_t h) { return __half2float(__ushort_as_half((unsigned short)(h & 0xffffu))); }

/* Two E4M3 bytes (bits 0..15 of v; bits 0..7 first) as f16 bits, low element in bits 0..15. */
__device__ __forceinline__ uint32_t dev_e4m3x2_f16(uint32_t v) {
    uint32_t h;
    asm("{\n\t.reg .b16 t;\n\tcvt.u16.u32 t, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, t;\n\t}" : "=r"(h) : "r"(v));
    return h;
}

/* Bytes 0..n-1 of v (E4M3, byte k = element k) times s into out[0..n-1]; n is 1, 2 or 4. */
template <int N>
__device__ __forceinline__ void dev_e4m3_times(uint32_t v, float s, float *out) {
#if DEV_HW_DECODE
#pragma unroll
    for (int k = 0; k < N; k += 2) {
        const uint32_t h = dev_e4m3x2_f16(v >> (8 * k));
        out[k] = dev_f16_bits(h) * s;
        if (k + 1 < N) out[k + 1] = dev_f16_bits(h >> 16) * s;
    }
#else
#pragma unroll
    for (int k = 0; k < N; k++) out[k] = dev_e4m3((uint8_t)(v >> (8 * k))) * s;
#endif
}

/* Nibbles 0..n-1 of v (E2M1, nibble k = element k) times s into out[0..n-1]; n is 1, 4 or 8. */
template <int N>
__device__ __forceinline__ void dev_e2m1_times(uint32_t v, float s, float *out) {
#if DEV_HW_DECODE
    const float s14 = s * 16384.0f;
    if (s14 <= 3.40282347e38f) {   /* finite: one exact product */
#pragma unroll
        for (int k = 0; k < N; k += 2) {
            const uint32_t h = e2m1x2_f16_bits(v >> (4 * k));
            out[k] = dev_f16_bits(h) * s14;
            if (k + 1 < N) out[k + 1] = dev_f16_bits(h >> 16) * s14;
        }
    } else {                       /* s >= 2^114 or NaN: the two products, each exact or the same overflow/NaN */
#pragma unroll
        for (int k = 0; k < N; k += 2) {
            const uint32_t h = e2m1x2_f16_bits(v >> (4 * k));
            out[k] = dev_f16_bits(h) * 16384.0f * s;
            if (k + 1 < N) out[k + 1] = dev_f16_bits(h >> 16) * 16384.0f * s;
        }
    }
#else
#pragma unroll
    for (int k = 0; k < N; k++) out[k] = dev_e2m1((uint8_t)((v >> (4 * k)) & 15)) * s;
#endif
}

/* Element (row, i) of a weight (device pointers), exact in fp32. */
__device__ __forceinline__ float dev_weight_at(const dsv4_weight &w, int row, int i) {
    switch (w.fmt) {
    case WF_F32: return ((const float *)w.data)[(int64_t)row * w.cols + i];
    case WF_BF16: return dev_bf16_to_f32(((const uint16_t *)w.data)[(int64_t)row * w.cols + i]);
    case WF_FP8: {
        const uint8_t b = ((const uint8_t *)w.data)[(int64_t)row * w.cols + i];
        float v;
        dev_e4m3_times<1>(b, dev_e8m0(w.scale[(int64_t)((w.row0 + row) / 128) * w.scale_cols + i / 128]), &v);
        return v;
    }
    default: {
        const uint8_t b = ((const uint8_t *)w.data)[(int64_t)row * (w.cols / 2) + i / 2];
        float v;
        dev_e2m1_times<1>((i & 1) ? b >> 4 : b & 15, dev_e8m0(w.scale[(int64_t)(w.row0 + row) * w.scale_cols + i / 32]), &v);
        return v;
    }
    }
}

/* Elements i .. i+3 of a row (i a multiple of 4, i + 4 <= cols, cols a multiple of 4 — the launcher checks),
 * with one aligned load per format. The values are the exact ones dev_weight_at gives. */
__device__ __forceinline__ void dev_weight4(const dsv4_weight &w, int row, int i, float out[4]) {
    switch (w.fmt) {
    case WF_F32: {
        const float4 v = *(const float4 *)((const float *)w.data + (int64_t)row * w.cols + i);
        out[0] = v.x; out[1] = v.y; out[2] = v.z; out[3] = v.w;
        return;
    }
    case WF_BF16: {
        const uint2 v = *(const uint2 *)((const uint16_t *)w.data + (int64_t)row * w.cols + i);
        out[0] = __uint_as_float(v.x << 16); out[1] = __uint_as_float(v.x & 0xffff0000u);
        out[2] = __uint_as_float(v.y << 16); out[3] = __uint_as_float(v.y & 0xffff0000u);
        return;
    }
    case WF_FP8: {
        const uint32_t v = *(const uint32_t *)((const uint8_t *)w.data + (int64_t)row * w.cols + i);
        dev_e4m3_times<4>(v, dev_e8m0(w.scale[(int64_t)((w.row0 + row) / 128) * w.scale_cols + i / 128]), out);
        return;
    }
    default: {
        const uint16_t v = *(const uint16_t *)((const uint8_t *)w.data + (int64_t)row * (w.cols / 2) + i / 2);
        dev_e2m1_times<4>(v, dev_e8m0(w.scale[(int64_t)(w.row0 + row) * w.scale_cols + i / 32]), out);
        return;
    }
    }
}

/* Elements i .. i+15 of a row (i a multiple of 16, i + 16 <= cols, cols a multiple of 16 and the row 16-byte
 * aligned — the launcher checks), with one 16-byte load per 16 bytes of weight: FP8 one, FP4 half of one, BF16
 * two, F32 four. The values are the exact ones dev_weight_at gives (a 16-column run never crosses a scale block:
 * 128 columns for FP8, 32 for FP4). */
__device__ __forceinline__ void dev_weight16(const dsv4_weight &w, int row, int i, float out[16]) {
    switch (w.fmt) {
    case WF_F32: {
        const float4 *p = (const float4 *)((const float *)w.data + (int64_t)row * w.cols + i);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float4 v = p[q];
            out[4 * q] = v.x; out[4 * q + 1] = v.y; out[4 * q + 2] = v.z; out[4 * q + 3] = v.w;
        }
        return;
    }
    case WF_BF16: {
        const uint4 *p = (const uint4 *)((const uint16_t *)w.data + (int64_t)row * w.cols + i);
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const uint4 v = p[q];
            const uint32_t u[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
            for (int k = 0; k < 4; k++) {
                out[8 * q + 2 * k] = __uint_as_float(u[k] << 16);
                out[8 * q + 2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
            }
        }
        return;
    }
    case WF_FP8: {
        const uint4 v = *(const uint4 *)((const uint8_t *)w.data + (int64_t)row * w.cols + i);
        const float s = dev_e8m0(w.scale[(int64_t)((w.row0 + row) / 128) * w.scale_cols + i / 128]);
#if DEV_HW_DECODE
        dev_e4m3_times<4>(v.x, s, out);
        dev_e4m3_times<4>(v.y, s, out + 4);
        dev_e4m3_times<4>(v.z, s, out + 8);
        dev_e4m3_times<4>(v.w, s, out + 12);
#else   /* as measured in run 23 (the form matters to the register allocation at 64 registers) */
        const uint32_t u[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
        for (int k = 0; k < 16; k++) out[k] = dev_e4m3((uint8_t)(u[k / 4] >> (8 * (k % 4)))) * s;
#endif
        return;
    }
    default: {
        const uint2 v = *(const uint2 *)((const uint8_t *)w.data + (int64_t)row * (w.cols / 2) + i / 2);
        const float s = dev_e8m0(w.scale[(int64_t)(w.row0 + row) * w.scale_cols + i / 32]);
#if DEV_HW_DECODE
        dev_e2m1_times<8>(v.x, s, out);
        dev_e2m1_times<8>(v.y, s, out + 8);
#else
        const uint32_t u[2] = { v.x, v.y };
#pragma unroll
        for (int k = 0; k < 16; k++) out[k] = dev_e2m1((uint8_t)((u[k / 8] >> (4 * (k % 8))) & 15)) * s;
#endif
        return;
    }
    }
}

/* dev_weight16 split in two for FP8 and FP4 rows, so that a warp can issue several steps' loads before it uses
 * any (the one-token kernels, k_linear.cu): dev_weight16_load reads the raw bytes (FP8: 16, FP4: 8 in v.x, v.y)
 * and the scale; dev_weight16_decode gives exactly dev_weight16's 16 values from them. */
struct w16raw {
    uint4 v;
    float s;
};
__device__ __forceinline__ w16raw dev_weight16_load(const dsv4_weight &w, int row, int i) {
    w16raw r;
    if (w.fmt == WF_FP8) {
        r.v = *(const uint4 *)((const uint8_t *)w.data + (int64_t)row * w.cols + i);
        r.s = dev_e8m0(w.scale[(int64_t)((w.row0 + row) / 128) * w.scale_cols + i / 128]);
    } else {
        const uint2 v = *(const uint2 *)((const uint8_t *)w.data + (int64_t)row * (w.cols / 2) + i / 2);
        r.v = make_uint4(v.x, v.y, 0u, 0u);
        r.s = dev_e8m0(w.scale[(int64_t)(w.row0 + row) * w.scale_cols + i / 32]);
    }
    return r;
}
__device__ __forceinline__ void dev_weight16_decode(int fmt, const w16raw &r, float out[16]) {
#if DEV_HW_DECODE
    if (fmt == WF_FP8) {
        dev_e4m3_times<4>(r.v.x, r.s, out);
        dev_e4m3_times<4>(r.v.y, r.s, out + 4);
        dev_e4m3_times<4>(r.v.z, r.s, out + 8);
        dev_e4m3_times<4>(r.v.w, r.s, out + 12);
    } else {
        dev_e2m1_times<8>(r.v.x, r.s, out);
        dev_e2m1_times<8>(r.v.y, r.s, out + 8);
    }
#else
    const uint32_t u[4] = { r.v.x, r.v.y, r.v.z, r.v.w };
    if (fmt == WF_FP8) {
#pragma unroll
        for (int k = 0; k < 16; k++) out[k] = dev_e4m3((uint8_t)(u[k / 4] >> (8 * (k % 4)))) * r.s;
    } else {
#pragma unroll
        for (int k = 0; k < 16; k++) out[k] = dev_e2m1((uint8_t)((u[k / 8] >> (4 * (k % 8))) & 15)) * r.s;
    }
#endif
}

/* Launch geometry helpers. */
static inline int cu_blocks(int64_t n, int per) { return (int)((n + per - 1) / per); }
#endif
