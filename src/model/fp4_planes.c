#include "model/fp4_planes.h"
#include "model/model.h"
#include "util/error.h"
#include <stdlib.h>
#include <string.h>

enum { GROUP = 128 };   /* columns of a plane group: 64 bytes */

static int code_at(const uint8_t *ckpt, int c) { return (ckpt[c / 2] >> (4 * (c & 1))) & 15; }

void fp4_planes_pack_row(uint8_t *row, int cols) {
    for (int g = 0; g < cols; g += GROUP) {
        uint8_t *p = row + g / 2;
        uint16_t word[32] = { 0 };
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 32; k++) word[k] |= (uint16_t)(code_at(p, 32 * j + k) << (4 * j));
        for (int k = 0; k < 32; k++) p[2 * k] = (uint8_t)word[k], p[2 * k + 1] = (uint8_t)(word[k] >> 8);
    }
}

void fp4_planes_unpack(const uint8_t *row, int c0, int n, uint8_t *dst) {
    memset(dst, 0, (size_t)n / 2);
    for (int g = 0; g < n; g += GROUP) {
        const uint8_t *p = row + (c0 + g) / 2;
        for (int k = 0; k < 32; k++) {
            const unsigned word = p[2 * k] | (unsigned)p[2 * k + 1] << 8;
            for (int j = 0; j < 4; j++) {
                const int c = g + 32 * j + k;
                dst[c / 2] |= (uint8_t)(((word >> (4 * j)) & 15) << (4 * (c & 1)));
            }
        }
    }
}

int fp4_planes_fits(const dsv4_weight *w) { return w->fmt == WF_FP4 && w->cols > 0 && w->cols % GROUP == 0 && w->rows >= 0; }

int fp4_planes_weight(dsv4_weight *w, void *data) {
    if (!fp4_planes_fits(w) || data != w->data) return -1;
    for (int64_t r = 0; r < w->rows; r++) fp4_planes_pack_row((uint8_t *)data + r * (w->cols / 2), w->cols);
    w->fmt = WF_FP4P;
    return 0;
}

dsv4_weight fp4_planes_row_view(const dsv4_weight *w, int row, uint8_t *buf) {
    dsv4_weight v = weight_rows(w, row, 1);
    fp4_planes_unpack((const uint8_t *)v.data, 0, w->cols, buf);
    v.fmt = WF_FP4;
    v.data = buf;
    return v;
}

/* Measured with tools/bench/linear_bench (LINEAR_BENCH_PLANES=1: the same matrices in both layouts, passes
 * alternated), one Zen 5 core, 2048 x 4096 FP4 from L2, GB/s of weights, checkpoint's layout -> planes: 1 token
 * 25.6-27.0 -> 31.1-32.5, 3 tokens 17.5-17.6 -> 19.8-20.0, 6 tokens 11.5 -> 9.4, 12 tokens 5.7-5.8 -> 4.8-5.0 (from
 * 5 tokens a pass, the four rows' words held beside the accumulators outgrow the registers). Two cores from memory:
 * the same speed (29-31 GB/s, the memory the bound there); a CPU model's experts in planes, flash-2g on those two
 * cores (2026-12-07, three alternated rounds): decode +2 %, 16 streams +3 %, 64 streams -5 %, prefill 128 -7 %, all
 * inside the box's spread. Where the host's cores are the bound (the lent GPU machine's 16-thread Xeon host,
 * tools/gpu/run_planes.sh, 2026-12-07, H100 at --gpu-mem 72): the kernel alone at 15 threads 60-66 -> 70-73 GB/s,
 * at one thread 8.4-8.7 -> 9.0-10.3; Flash's split decode 26.5 / 28.1 -> 30.2 / 30.6 tok/s in two alternated
 * rounds (the host's expert time 27.9 / 25.8 -> 23.0 / 22.3 ms a token); a CPU model there mixed (decode +17 % then
 * -6 %, prefill +13 % then -9 %, 16 streams +8 % then +1 %). Hence on by default for a split model's host arena,
 * which computes a token or a few at a time, and opt-in for a CPU model. (On a second such machine, runs 193-195,
 * the kernel again +13-16 %, but its host was disturbed and the one usable end-to-end pair went -11 %:
 * docs/HOST_EXPERTS.md.) */
int fp4_planes_wanted(int pairs, const char *isa, int by_default, dsv4_error *err) {
    const char *env = getenv("DSV4_CPU_FP4_PLANES");
    if (env && strcmp(env, "0") && strcmp(env, "1")) {
        dsv4_fail(err, DSV4_E_ARG, "DSV4_CPU_FP4_PLANES must be 0 or 1, not '%s'", env);
        return -1;
    }
    if (env ? !strcmp(env, "0") : !by_default) return 0;
    return pairs && isa && (!strcmp(isa, "avx512bf16") || !strcmp(isa, "avx512"));
}

long fp4_planes_routed(const struct dsv4_model *m) {
    long n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int e = 0; e < m->cfg.n_routed; e++)
            n += (m->layers[l].w1[e].fmt == WF_FP4P) + (m->layers[l].w2[e].fmt == WF_FP4P) + (m->layers[l].w3[e].fmt == WF_FP4P);
    return n;
}
