/* Can a wgmma GEMM give the bits of the OFFICIAL linears' mma.sync e4m3 MMAs? (issue 18, prefill)
 *
 * Run 89's ncu of k_mma_gemm showed no FP8 tensor-core instruction: on sm_90 ptxas builds mma.sync m16n8k32 e4m3
 * from fp16 ones (HMMA, with F2FP conversions of the E4M3 bytes and FADDs: 2 HMMA, ~3 F2FP and ~4 FADD an MMA).
 * Its SASS (run 90, cuobjdump): F2FP.F16.E4M3.UNPACK_B converts the low and the high two bytes of each fragment
 * register to fp16 pairs; t = HMMA.16816.F32(low halves, from RZ); t = HMMA.16816.F32(high halves, t); D = t + C by
 * FADD. So the first k16 MMA takes columns {4q, 4q+1, 16+4q, 16+4q+1 : q = 0..3} of the k32 step (at its own k
 * positions 2q, 2q+1, 2q+8, 2q+9), the second the same plus 2. Every E4M3 value is an fp16 value. If the warpgroup's
 * fp16 MMA (HGMMA) adds a k16 step as HMMA does, an fp16 wgmma GEMM fed with the converted bytes, columns in that
 * order, gives today's bits at wgmma's fp16 rate.
 * Each block: one 64 x 128 A tile and one 64 x 128 B tile of random E4M3 bytes (three distributions, as
 * tools/gpu/wgmma_bits.cu), converted to fp16 on the host, each k32 step's columns reordered: its first 16 halves the
 * low set above in k order, then the high set (PERM=0 at build time: natural order, run 90's first try); D[64][64]
 * computed as
 *   mma8        mma.sync m16n8k32 e4m3, chains of `steps` k32 steps from 0 (the reference);
 *   hmma fadd   per k32 step t = HMMA(halves 16-31, HMMA(halves 0-15, 0)), D = D + t (FADD);
 *   hmma chain  D = HMMA(cols 16-31, HMMA(cols 0-15, D)) (no FADD: the tensor core adds C);
 *   hgmma fadd  the same as hmma fadd with wgmma m64n64k16 f16 (t from scale-d 0), D = D + t;
 *   hgmma chain wgmma k16 steps accumulated in D.
 * Build: nvcc -O2 -gencode=arch=compute_90a,code=sm_90a --cudart static -o f16emu_bits tools/gpu/f16emu_bits.cu (tc_probe.cuh beside it)
 * Usage: f16emu_bits [TILES] (default 4096). A measuring tool: prints a table, exits 0. */
#include <cuda_fp16.h>
#include <math.h>
#include <string.h>
#include "tc_probe.cuh"

enum { M = TILE_M, N = TILE_N, K = TILE_K };

/* fp16 tiles: A16 [64][128], B16 [64][128] halves. chain = 0: t from 0 and D = D + t; 1: D carried through. */
__global__ void k_hmma(const __half *A, const __half *B, float *D, int steps, int chain) {
    const __half *a = A + (size_t)blockIdx.x * M * K, *b = B + (size_t)blockIdx.x * N * K;
    float *dd = D + (size_t)blockIdx.x * M * N;
    const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l / 4, q = l % 4;
    for (int i = 0; i < N / 8; i++) {
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        for (int j = 0; j < steps; j++) {
            float t[4] = {0.f, 0.f, 0.f, 0.f};
            float (&acc)[4] = chain ? d : t;
            for (int h = 0; h < 2; h++) {   /* columns 32 j + 16 h .. + 15 */
                const __half *r0 = a + (16 * w + g) * K + 32 * j + 16 * h, *r1 = r0 + 8 * K, *c = b + (8 * i + g) * K + 32 * j + 16 * h;
                mma_f16(acc, w32(r0 + 2 * q), w32(r1 + 2 * q), w32(r0 + 8 + 2 * q), w32(r1 + 8 + 2 * q), w32(c + 2 * q), w32(c + 8 + 2 * q));
            }
            if (!chain)
                for (int e = 0; e < 4; e++) d[e] = __fadd_rn(d[e], t[e]);
        }
        store_frag(dd, w, i, d);
    }
}

__device__ __forceinline__ void wg_f16(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
          "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(accumulate));
}

/* Byte offset of half (r, k) of a 64 x 128-half tile: 8-row groups of 256 bytes a row (2,048 a group), 16-byte
 * core-matrix columns at 128: no swizzle, K-major (LBO 128, SBO 2048). */
__device__ __forceinline__ int cm16(int r, int k) { return (r / 8) * 2048 + (k / 8) * 128 + (r % 8) * 16 + (k % 8) * 2; }

__global__ void k_hgmma(const __half *A, const __half *B, float *D, int steps, int chain) {
    __shared__ __align__(1024) uint8_t sa[M * K * 2], sb[N * K * 2];
    const __half *a = A + (size_t)blockIdx.x * M * K, *b = B + (size_t)blockIdx.x * N * K;
    for (int i = threadIdx.x; i < M * K; i += blockDim.x) *(__half *)(sa + cm16(i / K, i % K)) = a[i];
    for (int i = threadIdx.x; i < N * K; i += blockDim.x) *(__half *)(sb + cm16(i / K, i % K)) = b[i];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    float d[32], t[32];
    for (int i = 0; i < 32; i++) d[i] = 0.f, t[i] = 0.f;
    for (int j = 0; j < steps; j++)
        for (int h = 0; h < 2; h++) {   /* k16 step 2 j + h: 32 bytes = two core-matrix columns at 256 (2j + h) */
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
            const uint64_t da = desc(sa + 256 * (2 * j + h), 128, 2048), db = desc(sb + 256 * (2 * j + h), 128, 2048);
            if (chain) wg_f16(d, da, db, j > 0 || h > 0);
            else wg_f16(t, da, db, h > 0);
            asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;" ::: "memory");
            if (!chain && h == 1)
                for (int e = 0; e < 32; e++) d[e] = __fadd_rn(d[e], t[e]);
        }
    for (int i = 0; i < 8; i++) store_frag(D + (size_t)blockIdx.x * M * N, threadIdx.x / 32, i, *(const float (*)[4])(d + 4 * i));
}

/* E4M3 byte -> fp16 bits, exactly (every E4M3 value, subnormals included, is an fp16 normal or zero). */
static uint16_t e4m3_f16(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const uint16_t s = (uint16_t)((b & 0x80) << 8);
    if (e == 0 && m == 0) return s;
    if (e == 0) {   /* m x 2^-9: normalise */
        int sh = 0;
        while (!(m << sh & 8)) sh++;
        const int mm = (m << sh) & 7, ee = -6 - sh;   /* value = (1 + mm/8) 2^ee */
        return (uint16_t)(s | (ee + 15) << 10 | mm << 7);
    }
    return (uint16_t)(s | (e - 7 + 15) << 10 | m << 7);
}

#ifndef PERM
#define PERM 1
#endif
/* The physical column (in its k32 step) of fp16 column kk (0..31) of the step: the low set, then the high set. */
static int phys_col(int kk) {
    if (!PERM) return kk;
    const int hi = kk >= 16, k = kk % 16;
    return (k >= 8 ? 16 : 0) + 4 * ((k % 8) / 2) + (k % 2) + 2 * hi;
}

int main(int argc, char **argv) {
    const int tiles = argc > 1 ? atoi(argv[1]) : 4096;
    const size_t na = (size_t)tiles * M * K, nd = (size_t)tiles * M * N;
    uint8_t *hA = (uint8_t *)malloc(na), *hB = (uint8_t *)malloc(na), *dA, *dB;
    uint16_t *hA16 = (uint16_t *)malloc(2 * na), *hB16 = (uint16_t *)malloc(2 * na);
    __half *dA16, *dB16;
    float *dD, *out[5];
    for (int v = 0; v < 5; v++) out[v] = (float *)malloc(nd * 4);
    CHECK(cudaMalloc(&dA, na));
    CHECK(cudaMalloc(&dB, na));
    CHECK(cudaMalloc(&dA16, 2 * na));
    CHECK(cudaMalloc(&dB16, 2 * na));
    CHECK(cudaMalloc(&dD, nd * 4));
    /* sanity of the conversion: every byte's fp16 equals its value */
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7F) == 0x7F) continue;
        const int e = (b >> 3) & 15, m = b & 7;
        const float v = (e == 0 ? m * ldexpf(1, -9) : (1 + m / 8.0f) * ldexpf(1, e - 7)) * (b & 0x80 ? -1 : 1);
        __half_raw r;
        r.x = e4m3_f16((uint8_t)b);
        if (__half2float(__half(r)) != v) { printf("conversion wrong at byte %02x\n", b); return 1; }
    }
    const char *names[5] = {"mma8 (ref)", "hmma fadd", "hmma chain", "hgmma fadd", "hgmma chain"};
    printf("tiles %d (64 x 64 outputs each); outputs whose bits differ from mma.sync e4m3\n", tiles);
    printf("%-5s %-6s %-12s %12s %14s\n", "dist", "steps", "variant", "!= mma8", "hgmma != hmma");
    for (int dist = 0; dist < 3; dist++) {
        for (size_t i = 0; i < na; i++) hA[i] = rand_byte(dist, (int)(i % K));
        for (size_t i = 0; i < na; i++) hB[i] = rand_byte(dist, (int)(i % K));
        for (size_t i = 0; i < na; i++) {
            const size_t step0 = i - i % 32;
            hA16[i] = e4m3_f16(hA[step0 + phys_col((int)(i % 32))]);
            hB16[i] = e4m3_f16(hB[step0 + phys_col((int)(i % 32))]);
        }
        CHECK(cudaMemcpy(dA, hA, na, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dB, hB, na, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dA16, hA16, 2 * na, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dB16, hB16, 2 * na, cudaMemcpyHostToDevice));
        for (int steps = 1; steps <= 4; steps += 3)
            for (int v = 0; v < 5; v++) {
                CHECK(cudaMemset(dD, 0xFF, nd * 4));
                if (v == 0) k_mma8<<<tiles, 128>>>(dA, dB, dD, steps);
                else if (v <= 2) k_hmma<<<tiles, 128>>>(dA16, dB16, dD, steps, v == 2);
                else k_hgmma<<<tiles, 128>>>(dA16, dB16, dD, steps, v == 4);
                CHECK(cudaGetLastError());
                CHECK(cudaDeviceSynchronize());
                CHECK(cudaMemcpy(out[v], dD, nd * 4, cudaMemcpyDeviceToHost));
                size_t diff = 0, dh = 0;
                if (v)
                    for (size_t i = 0; i < nd; i++) diff += memcmp(&out[v][i], &out[0][i], 4) != 0;
                if (v >= 3)   /* hgmma against hmma of the same form */
                    for (size_t i = 0; i < nd; i++) dh += memcmp(&out[v][i], &out[v - 2][i], 4) != 0;
                printf("%-5d %-6d %-12s %12zu %14zu\n", dist, steps, names[v], diff, dh);
            }
    }
    printf("(outputs per case: %zu)\n", nd);
    return 0;
}
