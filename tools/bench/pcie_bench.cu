/* pcie_bench: how fast the bus moves expert-sized blocks from page-locked host memory to the GPU (issue 15's bus
 * share), two ways: the copy engine (cudaMemcpyAsync H2D) and a kernel reading the mapped host memory itself
 * (16-byte loads, as the expert kernels read a bus expert). Blocks of MB megabytes (default 13.4: one Flash expert)
 * from a 4 GiB page-locked buffer, N at a time, cycled; GB/s of each. Build: nvcc -O3 -arch=sm_90a pcie_bench.cu. */
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

/* each thread sums 16-byte words with a grid stride; the sum goes to out so the loads are not dropped */
__global__ void k_read(const uint4 *p, size_t n, unsigned *out) {
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) *out = acc;
}

int main(int argc, char **argv) {
    const double mb = argc > 1 ? atof(argv[1]) : 13.4;
    const size_t block = ((size_t)(mb * 1048576.0) + 255) & ~(size_t)255, total = (size_t)4 << 30;
    const int nblk = (int)(total / block);
    char *h, *d;
    unsigned *out;
    CHECK(cudaHostAlloc((void **)&h, total, cudaHostAllocMapped | cudaHostAllocPortable));
    for (size_t i = 0; i < total; i += 4096) h[i] = (char)i;
    CHECK(cudaMalloc((void **)&d, block * 8));
    CHECK(cudaMalloc((void **)&out, 4));
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    printf("block %.2f MB, %d blocks in a 4 GiB page-locked buffer\n", block / 1e6, nblk);
    printf("%-6s %14s %14s %14s\n", "blocks", "copy GB/s", "kernel GB/s", "kernel x4 GB/s");
    const int counts[] = {1, 2, 3, 6, 16, 64};
    for (int ci = 0; ci < 6; ci++) {
        const int n = counts[ci], reps = n >= 16 ? 3 : 20;
        float ms[3] = {0, 0, 0};
        for (int way = 0; way < 3; way++) {
            int next = 0;
            for (int r = -1; r < reps; r++) {   /* r = -1: warm-up, not timed */
                if (r == 0) CHECK(cudaEventRecord(a, st));
                for (int k = 0; k < n; k++, next = (next + 1) % nblk) {
                    const char *src = h + (size_t)next * block;
                    if (way == 0) CHECK(cudaMemcpyAsync(d + (size_t)(k % 8) * block, src, block, cudaMemcpyHostToDevice, st));
                    else k_read<<<sms * (way == 1 ? 4 : 16), 256, 0, st>>>((const uint4 *)src, block / 16, out);
                }
            }
            CHECK(cudaEventRecord(b, st));
            CHECK(cudaEventSynchronize(b));
            CHECK(cudaEventElapsedTime(&ms[way], a, b));
        }
        const double bytes = (double)block * n * reps;
        printf("%-6d %14.1f %14.1f %14.1f\n", n, bytes / ms[0] / 1e6, bytes / ms[1] / 1e6, bytes / ms[2] / 1e6);
    }
    /* one large copy: the link's ceiling */
    CHECK(cudaEventRecord(a, st));
    CHECK(cudaMemcpyAsync(d, h, block * 8, cudaMemcpyHostToDevice, st));
    CHECK(cudaEventRecord(b, st));
    CHECK(cudaEventSynchronize(b));
    float one = 0;
    CHECK(cudaEventElapsedTime(&one, a, b));
    printf("one copy of %.1f MB: %.1f GB/s\n", block * 8 / 1e6, block * 8 / one / 1e6);
    return 0;
}
