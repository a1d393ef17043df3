#include "backend/cpu/membw.h"
#include "util/bigmem.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const uint64_t *buf;
    size_t words;
    volatile uint64_t sink[256];   /* keeps the reads from being optimised away */
} bw_job;

static void read_share(void *ctx, int begin, int end, int thread) {
    bw_job *j = ctx;
    /* 64 shares: split the buffer finely so both threads stream at once */
    const size_t per = j->words / 64;
    uint64_t acc[8] = {0};
    for (int s = begin; s < end; s++) {
        const uint64_t *p = j->buf + (size_t)s * per;
        for (size_t i = 0; i + 8 <= per; i += 8)
            for (int k = 0; k < 8; k++) acc[k] ^= p[i + k];
    }
    j->sink[thread & 255] += acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ acc[4] ^ acc[5] ^ acc[6] ^ acc[7];
}

double cpu_read_bandwidth_gbs(dsv4_pool *pool, size_t bytes, int repeats) {
    /* on the memory kind the weights are copied to (util/bigmem.h): 4 KiB pages would measure the TLB too */
    uint64_t *buf = bigmem_alloc(bytes);
    if (!buf) return -1.0;
    memset(buf, 1, bytes);           /* fault every page in before timing */
    bw_job j = { buf, bytes / 8, {0} };
    double best = 0.0;
    for (int r = 0; r < repeats; r++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        dsv4_pool_run(pool, 64, read_share, &j);
        clock_gettime(CLOCK_MONOTONIC, &b);
        double s = (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
        double gbs = (double)(j.words / 64 * 64 * 8) / s / 1e9;
        if (gbs > best) best = gbs;
    }
    bigmem_free(buf, bytes);
    return best;
}
