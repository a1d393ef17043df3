/* hx_link_bench: the round trip of one flag between the host and a waiting kernel through page-locked mapped memory,
 * the mechanism of issue 15's steps enqueued ahead (cuda_host_experts.h) alone. Runs 180-183 measured ~370 us a
 * hand-off there beyond both sides' work; this tells how much of it the mechanism itself costs on a machine.
 *
 * One kernel, `blocks` blocks: block 0's thread 0 raises gpu_word to i (a release store at system scope), then waits
 * for host_word >= i (acquire loads at system scope, __nanosleep(poll_ns) between them); the other blocks' thread 0
 * poll host_word the same way (as k_hx_await_rows did before 23fe990: every block polling the bus) when
 * all_poll is set, else they wait for block 0 through device memory. A host thread waits (pause-spinning) for
 * gpu_word >= i and answers host_word = i. Meanwhile `load` other host threads stream a 1 GiB buffer (the host's
 * expert loops read memory at ~70 GB/s during a hand-off). Rounds a run; the host's clock around each round gives
 * the round trip's mean, median and 99th percentile.
 *
 * Build: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc -o hx_link_bench tools/bench/hx_link_bench.cu -lpthread
 * Run: hx_link_bench [rounds] (default 2000): the table over poll interval x pollers x host load. */
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <pthread.h>
#include <time.h>
#include <vector>
#include <cuda_runtime.h>
#include <immintrin.h>
#include "backend/cuda/cu_common.cuh"   /* dev_ld_acquire_sys, dev_st_release_sys: the engine's own link operations */

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); exit(1); } } while (0)

struct link_words {
    int gpu_word;   /* the GPU raises it to round i */
    int gpu_pad[31];
    int host_word;  /* the host answers round i */
    int host_pad[31];
};

__device__ __forceinline__ void wait_host(const link_words *lk, int i, int poll_ns) {
    while (dev_ld_acquire_sys(&lk->host_word) < i)
        if (poll_ns) __nanosleep(poll_ns);
}

__global__ void k_pingpong(link_words *lk, int rounds, int poll_ns, int all_poll, volatile int *relay) {
    if (threadIdx.x) return;
    for (int i = 1; i <= rounds; i++) {
        if (blockIdx.x == 0) {
            dev_st_release_sys(&lk->gpu_word, i);
            wait_host(lk, i, poll_ns);
            *relay = i;
        } else if (all_poll) {
            wait_host(lk, i, poll_ns);
        } else {
            while (*relay < i) __nanosleep(200);
        }
    }
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

struct loader {
    pthread_t th;
    const uint8_t *buf;
    size_t n;
    std::atomic<int> *stop;
    uint64_t sink;
};

static void *stream_memory(void *arg) {
    loader *l = (loader *)arg;
    uint64_t acc = 0;
    while (!l->stop->load(std::memory_order_relaxed))
        for (size_t i = 0; i < l->n; i += 64) acc += *(const volatile uint64_t *)(l->buf + i);
    l->sink = acc;
    return NULL;
}

static void run(link_words *lk, int *relay, int rounds, int blocks, int poll_ns, int all_poll, int load, uint8_t *big, size_t big_n) {
    std::atomic<int> stop(0);
    std::vector<loader> ls(load);
    for (int t = 0; t < load; t++) {
        ls[t].buf = big + (size_t)t * (big_n / load);
        ls[t].n = big_n / load;
        ls[t].stop = &stop;
        pthread_create(&ls[t].th, NULL, stream_memory, &ls[t]);
    }
    memset(lk, 0, sizeof *lk);
    CHECK(cudaMemset(relay, 0, sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    k_pingpong<<<blocks, 32>>>(lk, rounds, poll_ns, all_poll, relay);
    CHECK(cudaGetLastError());
    std::vector<double> rt(rounds);
    volatile int *gw = &lk->gpu_word;
    volatile int *hw = &lk->host_word;
    double prev = 0;
    for (int i = 1; i <= rounds; i++) {
        const double t_wait = now_us();
        while (*gw < i) {
            _mm_pause();
            if (now_us() - t_wait > 10e6) {
                fprintf(stderr, "no raise of round %d from the kernel in 10 s\n", i);
                exit(1);
            }
        }
        const double t = now_us();
        if (i > 1) rt[i - 2] = t - prev;   /* answer i - 1 .. the GPU's next raise: one round trip */
        prev = t;
        *hw = i;
    }
    CHECK(cudaDeviceSynchronize());
    stop.store(1);
    for (int t = 0; t < load; t++) pthread_join(ls[t].th, NULL);
    rt.resize(rounds - 1);
    std::sort(rt.begin(), rt.end());
    double sum = 0;
    for (double x : rt) sum += x;
    printf("%8d %7d %9s %6d %10.2f %10.2f %10.2f\n", poll_ns, blocks, all_poll ? "all" : "block 0", load, sum / rt.size(),
           rt[rt.size() / 2], rt[(size_t)(rt.size() * 0.99)]);
}

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 2000;
    link_words *lk;
    int *relay;
    CHECK(cudaHostAlloc((void **)&lk, sizeof *lk, cudaHostAllocMapped | cudaHostAllocPortable));
    CHECK(cudaMalloc((void **)&relay, sizeof(int)));
    const size_t big_n = (size_t)1 << 30;
    uint8_t *big = (uint8_t *)malloc(big_n);
    if (!big) return 1;
    memset(big, 1, big_n);
    printf("round trip host -> kernel -> host through mapped memory, %d rounds (us)\n", rounds);
    printf("%8s %7s %9s %6s %10s %10s %10s\n", "poll ns", "blocks", "pollers", "load", "mean", "median", "p99");
    const int polls[] = { 0, 1000 };
    for (int load : { 0, 15 })
        for (int p : polls) {
            run(lk, relay, rounds, 1, p, 0, load, big, big_n);
            run(lk, relay, rounds, 32, p, 0, load, big, big_n);
            run(lk, relay, rounds, 32, p, 1, load, big, big_n);
        }
    return 0;
}
