/* One OFFICIAL linear in the pair order (backend/cpu/pairs.h) per weight format, alone: how many weight bytes a
 * second the CPU kernels turn into outputs for T tokens, on one thread and on the pool's threads, with the weights
 * streamed from memory (a set of matrices much larger than the caches, on huge pages, cycled through) — the
 * per-format speeds that a decode step's time is the sum of. Not built by make: it reaches into the internals.
 *
 *   make && cc -std=gnu11 -O2 -march=native -Iinclude -Isrc tools/bench/linear_bench.c build/libdsv4.a \
 *       -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -lm -pthread -o build/linear_bench
 *   build/linear_bench [THREADS [T [ROWS COLS]]]        (defaults: every CPU, 1 token, 2048 x 4096; DSV4_ISA picks the
 *                                                         kernel set, as for dsv4)
 *   LINEAR_BENCH_PLANES=1: instead, FP4 in the checkpoint's layout against the same matrices in nibble planes
 *   (model/fp4_planes.h), their passes alternated (a noisy machine moves both alike), after checking that both give
 *   the same bits.
 *   LINEAR_BENCH_SET_KB=N: a set of N KiB per format instead of 1 GiB (at least one matrix), run over as many times as
 *   make ~1 GiB a pass: a set within L2 measures the kernels' arithmetic alone, with no memory stream behind it.
 *
 * Random weights: FP8 bytes with exponents 5..8, any FP4 nibble, BF16 values of |x| in [2^-8, 2^0), scales 2^-6 —
 * the synthetic checkpoints' kinds of value. Prints, per format, the best of 5 passes over the set in GB/s of
 * weight + scale bytes, as cpu_linear_pairs runs it and with the rows in equal shares per thread (interleaved). */
#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/pairs.h"
#include "backend/cpu/pool.h"
#include "model/fp4_planes.h"
#include "util/bigmem.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint32_t next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* n_mats matrices of one format, packed one after the other in one bigmem buffer. */
typedef struct {
    dsv4_weight *w;
    int n;
    uint8_t *mem;
    size_t bytes;
} mat_set;

static int make_set(mat_set *s, dsv4_wfmt fmt, int rows, int cols, size_t target);

/* FP4 against FP4P (LINEAR_BENCH_PLANES=1): two sets of the same matrices, the second repacked; passes alternate. */
static int planes_ab(dsv4_pool *pool, const float *x, int T, int rows, int cols, size_t set_bytes, float *y) {
    mat_set s[2];
    const uint64_t seed = rng;
    for (int k = 0; k < 2; k++) {
        rng = seed;   /* the same random bytes in both */
        if (make_set(&s[k], WF_FP4, rows, cols, set_bytes)) return fprintf(stderr, "out of memory\n"), 1;
    }
    for (int m = 0; m < s[1].n; m++) fp4_planes_weight(&s[1].w[m], (void *)s[1].w[m].data);
    float *y1 = malloc(sizeof(float) * (size_t)T * rows);
    if (!y1) return fprintf(stderr, "out of memory\n"), 1;
    cpu_linear_pairs(pool, &s[0].w[0], x, T, cols, y, rows, NULL);
    cpu_linear_pairs(pool, &s[1].w[0], x, T, cols, y1, rows, NULL);
    printf("  FP4 and FP4P outputs %s\n", memcmp(y, y1, sizeof(float) * (size_t)T * rows) ? "DIFFER" : "equal");
    free(y1);
    const int rounds = s[0].bytes >= ((size_t)1 << 30) ? 1 : (int)(((size_t)1 << 30) / s[0].bytes);
    double best[2] = {1e30, 1e30};
    for (int pass = 0; pass < 16; pass++) {
        const int k = pass % 2;
        const double t0 = now_s();
        for (int m = 0; m < s[k].n * rounds; m++) cpu_linear_pairs(pool, &s[k].w[m % s[k].n], x, T, cols, y, rows, NULL);
        const double t = now_s() - t0;
        if (pass > 1 && t < best[k]) best[k] = t;
    }
    for (int k = 0; k < 2; k++) {
        const double moved = (double)s[k].bytes * rounds;
        printf("  %-5s %7.2f GB/s of weights (%6.1f us a matrix)\n", k ? "FP4P" : "FP4", moved / best[k] / 1e9, 1e6 * best[k] / (s[k].n * rounds));
        bigmem_free(s[k].mem, s[k].bytes);
        free(s[k].w);
    }
    return 0;
}

static int make_set(mat_set *s, dsv4_wfmt fmt, int rows, int cols, size_t target) {
    const size_t data = fmt == WF_BF16 ? (size_t)rows * cols * 2 : fmt == WF_FP8 ? (size_t)rows * cols : (size_t)rows * cols / 2;
    const int scale_cols = fmt == WF_FP8 ? (cols + 127) / 128 : fmt == WF_FP4 ? cols / 32 : 0;
    const size_t scale = fmt == WF_FP8 ? (size_t)((rows + 127) / 128) * scale_cols : fmt == WF_FP4 ? (size_t)rows * scale_cols : 0;
    const size_t one = (data + scale + 63) / 64 * 64;
    s->n = (int)(target / one) + 1;
    s->bytes = one * (size_t)s->n;
    s->mem = bigmem_alloc(s->bytes);
    s->w = calloc((size_t)s->n, sizeof *s->w);
    if (!s->mem || !s->w) return -1;
    for (size_t i = 0; i < s->bytes; i += 4) {
        const uint32_t r = next_u32();
        memcpy(s->mem + i, &r, 4);
    }
    for (int m = 0; m < s->n; m++) {
        uint8_t *d = s->mem + one * (size_t)m, *sc = d + data;
        if (fmt == WF_FP8)
            for (size_t i = 0; i < data; i++) d[i] = (uint8_t)((d[i] & 0x87) | ((5 + ((d[i] >> 3) & 3)) << 3));
        if (fmt == WF_BF16)
            for (size_t i = 0; i < data; i += 2) {
                const uint16_t v = (uint16_t)(((d[i + 1] & 0x80) << 8) | ((119 + d[i] % 8) << 7) | (d[i + 1] & 0x7f));
                memcpy(d + i, &v, 2);
            }
        memset(sc, 121, scale);
        s->w[m] = (dsv4_weight){ fmt, rows, cols, d, scale ? sc : NULL, scale_cols, 0 };
    }
    return 0;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 0, T = argc > 2 ? atoi(argv[2]) : 1;
    const int rows = argc > 4 ? atoi(argv[3]) : 2048, cols = argc > 4 ? atoi(argv[4]) : 4096;
    dsv4_pool *pool = dsv4_pool_new(threads);
    const cpu_kernels *kern;
    dsv4_error err;
    if (cpu_kernels_pick(NULL, &kern, &err)) {   /* $DSV4_ISA, else the best set */
        fprintf(stderr, "linear_bench: %s\n", err.msg);
        return 2;
    }
    if (pool) dsv4_pool_set_kernels(pool, kern);
    if (!pool || T < 1 || rows < 1 || cols < 32 || cols % 128) {
        fprintf(stderr, "usage: linear_bench [THREADS [T [ROWS COLS]]] (COLS a multiple of 128)\n");
        return 2;
    }
    float *x = malloc(sizeof(float) * (size_t)T * cols), *y = malloc(sizeof(float) * (size_t)T * rows);
    for (int i = 0; i < T * cols; i++) {   /* bf16-exact activations of magnitude ~1 */
        const uint32_t b = (next_u32() & 0x80000000u) | (uint32_t)(120 + next_u32() % 12) << 23 | (next_u32() & 0x7f) << 16;
        memcpy(&x[i], &b, 4);
    }
    const char *set_kb = getenv("LINEAR_BENCH_SET_KB");
    const size_t set_bytes = set_kb ? (size_t)atol(set_kb) << 10 : (size_t)1 << 30;
    printf("%s kernels, %d threads, %d token%s, %d x %d matrices, %.3g MiB per format cycled\n", dsv4_pool_kernels(pool)->name,
           dsv4_pool_threads(pool), T, T > 1 ? "s" : "", rows, cols, set_bytes / 1048576.0);
    if (getenv("LINEAR_BENCH_PLANES") && atoi(getenv("LINEAR_BENCH_PLANES"))) return planes_ab(pool, x, T, rows, cols, set_bytes, y);
    const dsv4_wfmt fmts[] = {WF_BF16, WF_FP8, WF_FP4};
    const char *names[] = {"BF16", "FP8", "FP4"};
    for (int f = 0; f < 3; f++) {
        mat_set s;
        if (make_set(&s, fmts[f], rows, cols, set_bytes)) return fprintf(stderr, "out of memory\n"), 1;
        const int rounds = s.bytes >= ((size_t)1 << 30) ? 1 : (int)(((size_t)1 << 30) / s.bytes);
        /* cpu_linear_pairs (at up to 4 tokens: blocks of rows taken in turn) and, interleaved, the same rows in equal
         * shares per thread (dsv4_pool_run: the split before blocks) */
        double best[2] = {1e30, 1e30};
        for (int pass = 0; pass < 12; pass++) {
            const int eq = pass % 2;
            const double t0 = now_s();
            for (int m = 0; m < s.n * rounds; m++) {
                if (!eq) {
                    cpu_linear_pairs(pool, &s.w[m % s.n], x, T, cols, y, rows, NULL);
                    continue;
                }
                cpu_pairs_tokens b;
                if (cpu_pairs_tokens_make(&b, x, T, cols, cols)) return fprintf(stderr, "out of memory\n"), 1;
                cpu_pairs_job j = { &s.w[m % s.n], &b, y, NULL, rows };
                dsv4_pool_run(pool, rows, dsv4_pool_kernels(pool)->pairs_rows, &j);
                cpu_pairs_tokens_free(&b);
            }
            const double t = now_s() - t0;
            if (pass > 1 && t < best[eq]) best[eq] = t;   /* passes 0 and 1 warm */
        }
        const double moved = (double)s.bytes * rounds;
        printf("  %-5s %7.2f GB/s of weights (%6.1f us a matrix); in equal shares %7.2f GB/s\n", names[f], moved / best[0] / 1e9,
               1e6 * best[0] / (s.n * rounds), moved / best[1] / 1e9);
        bigmem_free(s.mem, s.bytes);
        free(s.w);
    }
    free(x);
    free(y);
    dsv4_pool_free(pool);
    return 0;
}
