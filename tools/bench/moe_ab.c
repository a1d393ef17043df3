/* The CPU MoE layer alone, expert by expert (m->moe_per_expert) against grouped (core/moe_experts.h), A and B
 * interleaved in one process (on a shared or noisy machine the whole-model bench cannot resolve a few percent),
 * with the pool dispatches each way counted. Not built by make: it reaches into the library's internals.
 *
 *   make && cc -std=gnu11 -O2 -march=native -Iinclude -Isrc tools/bench/moe_ab.c build/libdsv4.a \
 *       -Wl,--wrap=dsv4_pool_run -lmicrohttpd -ljansson -lpcre2-8 -lxxhash -lm -pthread -o build/moe_ab
 *   build/moe_ab DIR exact|official THREADS T [REPS [amx]]      (DIR: e.g. /tmp/dsv4-synthetic-flash-2g)
 *
 * Each rep runs moe_forward once per layer on fresh random inputs (so other experts, cold in cache, as in
 * decoding), timing only the moe_forward calls; it prints the min and median over reps and the weight bytes the
 * pass reads (the routed experts run + shared experts + routers) per second at the min. */
#include "backend/cpu/pool.h"
#include "core/moe.h"
#include "core/workspace.h"
#include "dsv4.h"
#include "model/footprint.h"
#include "model/model.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long n_dispatch;
void __real_dsv4_pool_run(dsv4_pool *p, int n, dsv4_range_fn fn, void *ctx);
void __wrap_dsv4_pool_run(dsv4_pool *p, int n, dsv4_range_fn fn, void *ctx) {
    n_dispatch++;
    __real_dsv4_pool_run(p, n, fn, ctx);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static uint64_t wbytes(const dsv4_weight *w) { return weight_bytes(w) + weight_scale_bytes(w); }

/* One pass: every layer's MoE on random inputs; the seconds spent in moe_forward. */
static double one_pass(dsv4_model *m, int T) {
    dsv4_workspace *ws = m->ws;
    const int d = m->cfg.dim;
    double seconds = 0.0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        ws->batch.T = T;
        for (int i = 0; i < T * d; i++) ws->xn[i] = (float)(rand() % 2001 - 1000) / 700.0f;
        for (int t = 0; t < T; t++) ws->batch.tok[t] = rand() % m->cfg.vocab_size;
        const double t0 = now();
        moe_forward(m, &m->layers[l], ws);
        seconds += now() - t0;
    }
    return seconds;
}

/* Bytes of the weights every pass reads whatever the routing: shared experts and routers. */
static uint64_t fixed_bytes(const dsv4_model *m) {
    uint64_t b = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const dsv4_layer *ly = &m->layers[l];
        b += wbytes(&ly->sw1) + wbytes(&ly->sw2) + wbytes(&ly->sw3) + wbytes(&ly->gate);
    }
    return b;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: moe_ab DIR exact|official THREADS T [REPS [amx]]\n");
        return 2;
    }
    const int official = !strcmp(argv[2], "official"), T = atoi(argv[4]);
    int reps = argc > 5 ? atoi(argv[5]) : 15;
    if (reps < 1) reps = 1;
    if (reps > 64) reps = 64;
    dsv4_load_opts o = { .mode = official ? DSV4_MODE_OFFICIAL : DSV4_MODE_EXACT, .n_threads = atoi(argv[3]),
                         .quiet = 1, .cpu_amx = argc > 6 && !strcmp(argv[6], "amx") };
    dsv4_model *m;
    dsv4_error err = { 0 };
    if (dsv4_model_load(argv[1], &o, &m, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (T < 1 || workspace_ensure(m, T, 0)) {
        fprintf(stderr, "T must be >= 1 and fit in memory\n");
        return 1;
    }
    srand(1);
    double secs[2][64];
    uint64_t bytes[2] = { 0, 0 };   /* of the last pass each way */
    long dispatches[2] = { 0, 0 };
    for (int r = -1; r < reps; r++)   /* rep -1 warms up */
        for (int v = 0; v < 2; v++) {
            m->moe_per_expert = v == 0;
            const uint64_t rb0 = m->routed_bytes;
            const long d0 = n_dispatch;
            const double s = one_pass(m, T);
            if (r >= 0) secs[v][r] = s;
            bytes[v] = fixed_bytes(m) + (m->routed_bytes - rb0);
            dispatches[v] = n_dispatch - d0;
        }
    const char *name[2] = { "per-expert", "grouped" };
    for (int v = 0; v < 2; v++) {
        qsort(secs[v], (size_t)reps, sizeof(double), by_value);
        printf("%s%s T=%d threads=%s %-10s  min %.2f ms  median %.2f ms per %d-layer MoE pass  (%.1f GB/s at min)  "
               "%.1f dispatches/layer\n", official ? "official" : "exact", m->dots == CPU_DOTS_AMX ? "+amx" : "", T, argv[3], name[v],
               secs[v][0] * 1e3, secs[v][reps / 2] * 1e3, m->cfg.n_layers, bytes[v] / secs[v][0] / 1e9,
               (double)dispatches[v] / m->cfg.n_layers);
    }
    dsv4_model_free(m);
    return 0;
}
