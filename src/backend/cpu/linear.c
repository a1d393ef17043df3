#include "backend/cpu/kernels.h"
#include <stdlib.h>

typedef struct {
    const dsv4_weight *w;
    const float *x;
    float *y;               /* y[t*ldy + o], or, when y_rows is set, y_rows[t][o] */
    float *const *y_rows;
    int T, ldx, ldy;
} linear_job;

static inline float *out_at(const linear_job *j, int t, int o) {
    return j->y_rows ? j->y_rows[t] + o : j->y + (int64_t)t * j->ldy + o;
}

/* Rows per thread are contiguous. With one token each row is dotted as it is decoded; with more, each row is
 * decoded once into a small buffer and dotted with every token. Both give the same bits (kernels.h). */
static void linear_rows(void *ctx, int begin, int end, int thread) {
    linear_job *j = ctx;
    const int cols = j->w->cols;
    float stackbuf[32768]; /* 128 KiB: every row of the released models fits */
    float *row = cols <= 32768 ? stackbuf : malloc(sizeof(float) * (size_t)cols);
    if (!row) return; /* cannot happen for real configs; leaves y untouched rather than crash */
    for (int o = begin; o < end; o++) {
        if (j->T == 1) {   /* decode: fused, each weight read once straight into the FMAs */
            *out_at(j, 0, o) = weight_dot_row(j->w, o, j->x, row);
            continue;
        }
        const float *wr;   /* prefill/batches: decode the row once, reuse it for every token */
        if (j->w->fmt == WF_F32) wr = (const float *)j->w->data + (int64_t)o * cols;
        else { weight_decode_row(j->w, o, row); wr = row; }
        int t = 0;
        for (; t + 2 <= j->T; t += 2)
            dot2_f32(wr, j->x + (int64_t)t * j->ldx, j->x + (int64_t)(t + 1) * j->ldx, cols, out_at(j, t, o), out_at(j, t + 1, o));
        for (; t < j->T; t++) *out_at(j, t, o) = dot_f32(wr, j->x + (int64_t)t * j->ldx, cols);
    }
    if (row != stackbuf) free(row);
}

void cpu_linear(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *y, int ldy) {
    linear_job j = { w, x, y, NULL, T, ldx, ldy };
    if (T <= 0) return;
    dsv4_pool_run(pool, w->rows, linear_rows, &j);
}

void cpu_linear_scatter(dsv4_pool *pool, const dsv4_weight *w, const float *x, int T, int ldx, float *const *y_rows) {
    linear_job j = { w, x, NULL, y_rows, T, ldx, 0 };
    if (T <= 0) return;
    dsv4_pool_run(pool, w->rows, linear_rows, &j);
}
