/* How fast a core reads memory in the order the CPU's fused linear rows read weights (backend/cpu/isa/pairs.c): R
 * consecutive rows of ROW_BYTES in lockstep, 64 bytes of each in turn, then the next R rows; against one plain
 * sequential stream. Only loads (one vector add per line), so the figure is the access pattern's rate, not any
 * kernel's arithmetic. Issue 17's finding: four 8 KB rows in lockstep read at ~70-80 % of a sequential stream with the
 * kernels' prefetch of the next group, half without it. Not built by make.
 *
 *   cc -std=gnu11 -O2 -march=native -Iinclude -Isrc tools/bench/row_pattern_bench.c build/libdsv4.a -lm -pthread \
 *       -o build/row_pattern_bench
 *   build/row_pattern_bench [THREADS [ROW_BYTES]]        (defaults: 2 threads, 8192-byte rows)
 *
 * Prints GB/s (best of 4 passes over 2 GiB on huge pages, util/bigmem.h) for: sequential; R = 1, 2, 4, 8 rows in
 * lockstep with no prefetch, with the next group's lines prefetched as the loop passes them (prefetcht0, as the
 * kernels do) and the same with prefetchnta. */
#include "util/bigmem.h"
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { SEQUENTIAL, NO_PREFETCH, PREFETCH_T0, PREFETCH_NTA };
static const char *const kind_names[] = { "sequential", "no prefetch", "prefetcht0 next group", "prefetchnta next group" };

typedef struct {
    const uint8_t *p;
    size_t n;
    int kind, rows, row_bytes;
    float sink;
} pass;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline __m256 line(const uint8_t *p) { return _mm256_load_ps((const float *)p); }

static void *read_pass(void *arg) {
    pass *j = arg;
    __m256 acc = _mm256_setzero_ps();
    if (j->kind == SEQUENTIAL) {
        for (size_t i = 0; i < j->n; i += 64) acc = _mm256_add_ps(acc, line(j->p + i));
    } else {
        const size_t group = (size_t)j->rows * (size_t)j->row_bytes;
        for (size_t g = 0; g + group <= j->n; g += group)
            for (int c = 0; c < j->row_bytes; c += 64)
                for (int r = 0; r < j->rows; r++) {
                    const uint8_t *at = j->p + g + (size_t)r * (size_t)j->row_bytes + (size_t)c;
                    acc = _mm256_add_ps(acc, line(at));
                    if (j->kind == PREFETCH_T0 && g + 2 * group <= j->n) __builtin_prefetch(at + group, 0, 3);
                    if (j->kind == PREFETCH_NTA && g + 2 * group <= j->n) __builtin_prefetch(at + group, 0, 0);
                }
    }
    float f[8];
    _mm256_storeu_ps(f, acc);
    j->sink = f[0];
    return NULL;
}

/* Best GB/s of 4 passes with `threads` threads, each over its own contiguous share. */
static double measure(const uint8_t *buf, size_t n, int threads, int kind, int rows, int row_bytes) {
    enum { MAX_THREADS = 64 };
    double best = 0;
    for (int rep = 0; rep < 4; rep++) {
        pthread_t tid[MAX_THREADS];
        pass jobs[MAX_THREADS];
        const double t0 = now_s();
        for (int i = 0; i < threads; i++) {
            jobs[i] = (pass){ buf + n / (size_t)threads * (size_t)i, n / (size_t)threads, kind, rows, row_bytes, 0 };
            pthread_create(&tid[i], NULL, read_pass, &jobs[i]);
        }
        for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
        const double gbs = (double)n / (now_s() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    return best;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2, row_bytes = argc > 2 ? atoi(argv[2]) : 8192;
    if (threads < 1 || threads > 64 || row_bytes < 64 || row_bytes % 64) {
        fprintf(stderr, "usage: row_pattern_bench [THREADS (1-64) [ROW_BYTES (a multiple of 64)]]\n");
        return 2;
    }
    const size_t n = (size_t)2 << 30;
    uint8_t *buf = bigmem_alloc(n);
    if (!buf) {
        fprintf(stderr, "row_pattern_bench: cannot map 2 GiB\n");
        return 1;
    }
    memset(buf, 1, n);   /* every page faulted in before timing */
    printf("%d threads, rows of %d bytes, 2 GiB on huge pages, best of 4\n", threads, row_bytes);
    printf("  %-24s %6.1f GB/s\n", kind_names[SEQUENTIAL], measure(buf, n, threads, SEQUENTIAL, 1, row_bytes));
    const int rows[] = { 1, 2, 4, 8 };
    for (int k = NO_PREFETCH; k <= PREFETCH_NTA; k++) {
        printf("  %-24s", kind_names[k]);
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
            printf("  R=%d %5.1f", rows[r], measure(buf, n, threads, k, rows[r], row_bytes));
        printf("  GB/s\n");
    }
    bigmem_free(buf, n);
    return 0;
}
