/* Does the warpgroup MMA (wgmma, sm_90a) give the bits of mma.sync on the same FP8 operands? (issue 18, prefill)
 *
 * The OFFICIAL linears' order (k_mma.cu) is built from m16n8k32 e4m3 MMAs: an FP8 chunk of 128 columns is a chain
 * of 4 MMAs from 0.0f, an FP4 block one MMA from 0.0f. A faster prefill GEMM on wgmma keeps every output's bits
 * only if wgmma's k32 step computes, for each element, what mma.sync's does: the same 32 products added to the
 * same fp32 accumulator with the same internal rounding. The PTX ISA does not promise that; this program measures
 * it. Each block takes one 64-row x 128-byte A tile and one 64-token x 128-byte B tile of random E4M3 bytes and
 * computes D[64][64] four ways:
 *   mma  : mma.sync m16n8k32, per n8 tile a chain of 4 (k bytes 0-31, 32-63, 64-95, 96-127) from 0.0f;
 *   wg64 : wgmma m64n64k32, the same chain (scale-d 0 on the first step, 1 after);
 *   wg8  : wgmma m64n8k32, eight instructions a step (does the instruction's N matter?);
 *   and the 1-step versions (k bytes 0-31 only) of mma and wg64: the FP4 block's single MMA.
 * The host compares the bits and, for a subset, each against the exactly rounded step-wise sum (products exact in
 * double; each step's exact sum added to the fp32 accumulator and rounded to nearest): how the hardware rounds.
 * Distributions: 0 = uniform random bytes (NaN codes 0x7F / 0xFF replaced), 1 = exponents 6..8 only (similar
 * magnitudes, signs random: cancellation), 2 = one large product per row among small ones.
 * Shared-memory layout for wgmma: no swizzle, K-major, core matrices of 8 rows x 16 bytes (128 contiguous bytes);
 * the core matrix of row group g and 16-byte column c at g * 1024 + c * 128 (LBO = 128 between K neighbours,
 * SBO = 1024 between row groups). Variant `swap` builds the descriptors with LBO and SBO exchanged, in case the
 * no-swizzle mode reads them the other way; the run reports which one equals the reference.
 * Build: nvcc -O2 -gencode=arch=compute_90a,code=sm_90a --cudart static -o wgmma_bits tools/gpu/wgmma_bits.cu (tc_probe.cuh beside it)
 * Usage: wgmma_bits [TILES] (default 4096). Measuring tool, not a test: prints a table, exits 0. */
#include <math.h>
#include <string.h>
#include "tc_probe.cuh"

enum { M = TILE_M, N = TILE_N, K = TILE_K };

__device__ __forceinline__ void wg_m64n64(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "%32, %33, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]),
          "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(accumulate));
}
__device__ __forceinline__ void wg_m64n8(float (&d)[4], uint64_t da, uint64_t db, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, %4, %5, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "l"(da), "l"(db), "r"(accumulate));
}
__device__ __forceinline__ void wg_fence(void) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit_wait(void) {
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;" ::: "memory");
}

/* Core-matrix offset of byte (r, k) of a 64 x 128 tile: row group r / 8 at 1024 each, 16-byte column k / 16 at 128. */
__device__ __forceinline__ int cm_off(int r, int k) { return (r / 8) * 1024 + (k / 16) * 128 + (r % 8) * 16 + k % 16; }

/* One warpgroup. narrow = 0: m64n64 a step; 1: eight m64n8 a step. swap: LBO / SBO exchanged in the descriptors. */
__global__ void k_wgmma(const uint8_t *A, const uint8_t *B, float *D, int steps, int narrow, int swap) {
    __shared__ __align__(1024) uint8_t sa[M * K], sb[N * K];
    const uint8_t *a = A + (size_t)blockIdx.x * M * K, *b = B + (size_t)blockIdx.x * N * K;
    for (int i = threadIdx.x; i < M * K; i += blockDim.x) sa[cm_off(i / K, i % K)] = a[i];
    for (int i = threadIdx.x; i < N * K; i += blockDim.x) sb[cm_off(i / K, i % K)] = b[i];
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const uint32_t lbo = swap ? 1024 : 128, sbo = swap ? 128 : 1024;
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = 0.f;
    wg_fence();
    if (!narrow) {
        for (int j = 0; j < steps; j++) wg_m64n64(d, desc(sa + 256 * j, lbo, sbo), desc(sb + 256 * j, lbo, sbo), j > 0);
    } else {
        for (int j = 0; j < steps; j++) {
#pragma unroll
            for (int n = 0; n < 8; n++) {
                float (&dn)[4] = *(float (*)[4])(d + 4 * n);
                wg_m64n8(dn, desc(sa + 256 * j, lbo, sbo), desc(sb + 1024 * n + 256 * j, lbo, sbo), j > 0);
            }
        }
    }
    wg_commit_wait();
    for (int i = 0; i < 8; i++) store_frag(D + (size_t)blockIdx.x * M * N, threadIdx.x / 32, i, *(const float (*)[4])(d + 4 * i));
}

static double e4m3(uint8_t b) {
    const int e = (b >> 3) & 15, m = b & 7;
    const double v = e == 0 ? m * ldexp(1.0, -9) : (1 + m / 8.0) * ldexp(1.0, e - 7);
    return b & 0x80 ? -v : v;
}

/* The step-wise exactly rounded reference: c = fl(c + exact sum of step j's 32 products), j = 0 .. steps-1. */
static float ref_elem(const uint8_t *a, const uint8_t *b, int steps) {
    float c = 0.f;
    for (int j = 0; j < steps; j++) {
        double s = 0;
        for (int k = 32 * j; k < 32 * j + 32; k++) s += e4m3(a[k]) * e4m3(b[k]);
        c = (float)((double)c + s);   /* exact: c has 24 bits, s at most ~45: the double sum is exact here */
    }
    return c;
}

int main(int argc, char **argv) {
    const int tiles = argc > 1 ? atoi(argv[1]) : 4096, ref_tiles = tiles < 256 ? tiles : 256;
    const size_t na = (size_t)tiles * M * K, nb = (size_t)tiles * N * K, nd = (size_t)tiles * M * N;
    uint8_t *hA = (uint8_t *)malloc(na), *hB = (uint8_t *)malloc(nb), *dA, *dB;
    float *out[7], *dD;
    for (int v = 0; v < 7; v++) out[v] = (float *)malloc(nd * 4);
    CHECK(cudaMalloc(&dA, na));
    CHECK(cudaMalloc(&dB, nb));
    CHECK(cudaMalloc(&dD, nd * 4));
    const char *names[7] = {"mma x4", "wg64 x4", "wg8 x4", "wg64 x4 swap", "mma x1", "wg64 x1", "wg8 x1"};
    printf("tiles %d (64 x 64 outputs each), reference on %d\n", tiles, ref_tiles);
    printf("%-5s %-13s %14s %14s %14s\n", "dist", "variant", "!= mma (bits)", "!= ref (bits)", "max |d-ref|/|ref|");
    for (int dist = 0; dist < 3; dist++) {
        for (size_t i = 0; i < na; i++) hA[i] = rand_byte(dist, (int)(i % K));
        for (size_t i = 0; i < nb; i++) hB[i] = rand_byte(dist, (int)(i % K));
        CHECK(cudaMemcpy(dA, hA, na, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dB, hB, nb, cudaMemcpyHostToDevice));
        for (int v = 0; v < 7; v++) {
            CHECK(cudaMemset(dD, 0xFF, nd * 4));
            const int steps = v < 4 ? 4 : 1;
            if (v == 0 || v == 4) k_mma8<<<tiles, 128>>>(dA, dB, dD, steps);
            else k_wgmma<<<tiles, 128>>>(dA, dB, dD, steps, v == 2 || v == 6, v == 3);
            CHECK(cudaGetLastError());
            CHECK(cudaDeviceSynchronize());
            CHECK(cudaMemcpy(out[v], dD, nd * 4, cudaMemcpyDeviceToHost));
        }
        for (int v = 0; v < 7; v++) {
            const int steps = v < 4 ? 4 : 1;
            const float *base = out[v < 4 ? 0 : 4];
            size_t diff = 0, rdiff = 0;
            double worst = 0;
            for (size_t i = 0; i < nd; i++) diff += memcmp(&out[v][i], &base[i], 4) != 0;
            for (int t = 0; t < ref_tiles; t++)
                for (int r = 0; r < M; r++)
                    for (int n = 0; n < N; n++) {
                        const float ref = ref_elem(hA + ((size_t)t * M + r) * K, hB + ((size_t)t * N + n) * K, steps);
                        const float got = out[v][((size_t)t * M + r) * N + n];
                        if (memcmp(&ref, &got, 4)) {
                            rdiff++;
                            const double rel = fabs((double)got - ref) / (fabs((double)ref) + 1e-30);
                            if (rel > worst) worst = rel;
                        }
                    }
            printf("%-5d %-13s %14zu %14zu %14.3g\n", dist, names[v], diff, rdiff, worst);
        }
    }
    printf("(outputs per variant and distribution: %zu; reference outputs: %d)\n", nd, ref_tiles * M * N);
    return 0;
}
