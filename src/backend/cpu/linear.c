/* cpu_linear: the pool's kernel set (isa.h) computes the rows, split across its threads; and the linears with
 * bf16-exact inputs in the order a model chose (pairs.h, amx.h). */
#include "backend/cpu/kernels.h"
#include "backend/cpu/amx.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/pairs.h"
#include <stdlib.h>

void cpu_linear(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *y, int ldy) {
    cpu_linear_job j = { w, x, y, NULL, T, ldx, ldy };
    if (T <= 0) return;
    dsv4_pool_run(pool, w->rows, dsv4_pool_kernels(pool)->linear_rows, &j);
}

void cpu_linear_scatter(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *const *y_rows) {
    cpu_linear_job j = { w, x, NULL, y_rows, T, ldx, 0 };
    if (T <= 0) return;
    dsv4_pool_run(pool, w->rows, dsv4_pool_kernels(pool)->linear_rows, &j);
}

int cpu_pairs_usable(const dsv4_weight *w) { return w->fmt == WF_BF16 || w->fmt == WF_FP8 || w->fmt == WF_FP4 || w->fmt == WF_FP4P; }

int cpu_pairs_tokens_make(cpu_pairs_tokens *b, const float *x, int T, int ldx, int cols) {
    b->T = T, b->cols = cols, b->n32 = (cols + 31) & ~31;
    b->log2_n32 = 0;
    while ((1 << b->log2_n32) < b->n32) b->log2_n32++;
    b->xb = malloc(sizeof(uint16_t) * (size_t)T * b->n32);
    b->range = malloc(sizeof(pairs_exp) * (size_t)T);
    if (!b->xb || !b->range) {
        cpu_pairs_tokens_free(b);
        return -1;
    }
    /* exact values whatever the set (pairs_fill rounds each element as f32_to_bf16 does) */
    cpu_kernels_best()->pairs_fill(x, ldx, b);
    return 0;
}

void cpu_pairs_tokens_free(cpu_pairs_tokens *b) {
    free(b->xb);
    free(b->range);
    b->xb = NULL;
    b->range = NULL;
}

/* A decode step's linears (a few tokens) stream their weights: about four blocks of rows per thread, taken in
 * turn, let a thread slowed by its core (a hyperthread sibling at work, another process) take fewer, instead of
 * everyone waiting for it (on the 16-thread lent machine the caller waited ~25 % of a step with equal shares).
 * Blocks are multiples of 4 rows (the fused kernels' group; isa/pairs.c) and no smaller than 16. A row's value
 * does not depend on the cut. Many tokens keep equal shares (pairs_row_share): there a call's fixed costs per
 * range are larger. */
enum { PAIRS_BLOCK_T = 4 };
static int pairs_row_block(dsv4_pool *pool, int rows) {
    const int threads = dsv4_pool_threads(pool), b = (rows + 4 * threads - 1) / (4 * threads);
    return b < 16 ? 16 : (b + 3) / 4 * 4;
}
/* Many tokens: one block a thread, an equal share rounded up to whole groups of 4 rows (a share cut inside a
 * group would send that group's rows down the slower tile path). */
static int pairs_row_share(dsv4_pool *pool, int rows) {
    const int threads = dsv4_pool_threads(pool), b = (rows + threads - 1) / threads;
    return (b + 3) / 4 * 4;
}

void cpu_linear_pairs(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *y, int ldy,
                      float *const *y_rows) {
    if (T <= 0) return;
    cpu_pairs_tokens b;
    if (cpu_pairs_tokens_make(&b, x, T, ldx, w->cols)) {   /* out of memory: as cpu_linear_amx does */
        if (y_rows) cpu_linear_scatter(pool, w, x, T, ldx, y_rows);
        else cpu_linear(pool, w, x, T, ldx, y, ldy);
        return;
    }
    cpu_pairs_job j = { w, &b, y, y_rows, ldy };
    const int block = T <= PAIRS_BLOCK_T ? pairs_row_block(pool, w->rows) : pairs_row_share(pool, w->rows);
    dsv4_pool_run_blocks(pool, w->rows, block, dsv4_pool_kernels(pool)->pairs_rows, &j);
    cpu_pairs_tokens_free(&b);
}

static void linear_bf16in(dsv4_pool *pool, cpu_dots dots, const dsv4_weight *w, const float *x, int T, int ldx,
                          float *y, int ldy, float *const *y_rows) {
    if (T <= 0) return;
    if (dots == CPU_DOTS_AMX && cpu_amx_usable(w)) cpu_linear_amx(pool, w, x, T, ldx, y, ldy, y_rows);
    else if (dots == CPU_DOTS_PAIRS && cpu_pairs_usable(w)) cpu_linear_pairs(pool, w, x, T, ldx, y, ldy, y_rows);
    else if (y_rows) cpu_linear_scatter(pool, w, x, T, ldx, y_rows);
    else cpu_linear(pool, w, x, T, ldx, y, ldy);
}

void cpu_linear_bf16in(dsv4_pool *pool, cpu_dots dots, const dsv4_weight *w, const float *x, int T, int ldx, float *y,
                       int ldy) {
    linear_bf16in(pool, dots, w, x, T, ldx, y, ldy, NULL);
}

void cpu_linear_bf16in_scatter(dsv4_pool *pool, cpu_dots dots, const dsv4_weight *w, const float *x, int T, int ldx,
                               float *const *y_rows) {
    linear_bf16in(pool, dots, w, x, T, ldx, NULL, 0, y_rows);
}
