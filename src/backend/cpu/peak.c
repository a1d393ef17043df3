#include "backend/cpu/peak.h"
#include "backend/cpu/isa.h"
#include <stdlib.h>
#include <time.h>

typedef struct {
    const cpu_kernels *k;
    int bf16;
    long steps;
    double *flops;   /* [threads] */
    float *sink;     /* [threads]: keeps the arithmetic from being optimised away */
} peak_job;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void peak_share(void *ctx, int begin, int end, int thread) {
    peak_job *j = ctx;
    for (int i = begin; i < end; i++) j->flops[thread] += j->k->peak_flops(j->bf16, j->steps, &j->sink[thread]);
}

double cpu_peak_gflops(dsv4_pool *pool, int bf16, int repeats) {
    const int n = dsv4_pool_width(pool);
    peak_job j = { .k = dsv4_pool_kernels(pool), .bf16 = bf16, .steps = 1 << 14, .flops = calloc((size_t)n, sizeof(double)),
                   .sink = calloc((size_t)n, sizeof(float)) };
    double best = -1;
    if (!j.flops || !j.sink) goto done;
    /* size a run to ~50 ms of one thread: long enough for the clocks to settle, short beside a benchmark */
    double t = now_s();
    j.k->peak_flops(bf16, j.steps, &j.sink[0]);
    t = now_s() - t;
    j.steps = t > 0 ? (long)(j.steps * 0.05 / t) + 1 : 1 << 20;
    for (int r = 0; r < repeats; r++) {
        for (int i = 0; i < n; i++) j.flops[i] = 0;
        t = now_s();
        dsv4_pool_run(pool, n, peak_share, &j);   /* one item a thread */
        t = now_s() - t;
        double sum = 0;
        for (int i = 0; i < n; i++) sum += j.flops[i];
        if (t > 0 && sum / t / 1e9 > best) best = sum / t / 1e9;
    }
done:
    free(j.flops);
    free(j.sink);
    return best;
}
